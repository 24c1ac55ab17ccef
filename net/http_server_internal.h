/*
 * HTTP server internals shared by net/http_server.c (the server, its loop
 * threads, connections and shutdown), net/http_request.c (dispatch, whole
 * and deferred answers, per-request state) and net/http_stream.c (pulled
 * and pushed streams). Not installed; see net/http_server.h for the public
 * API and net/http_server.c for the design.
 */
#ifndef KVI_NET_HTTP_SERVER_INTERNAL_H
#define KVI_NET_HTTP_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <h2o.h>
#include <openssl/ssl.h>

#include "engine/common.h"
#include "net/http_server.h"

/* ---- types ---- */

struct route {
    char *path;
    size_t path_len;
    unsigned methods;
    kvi_http_handler_fn fn;
    void *ud;
    size_t body_limit;
    unsigned flags;
    char allow[64]; /* methods of every route with this path, for 405 */
};

/* One route's counters on one thread: written by that loop only. */
struct ctr {
    _Atomic uint64_t requests;
    _Atomic uint64_t status[6];
    _Atomic uint64_t aborted;
    _Atomic uint64_t bytes_in;
    _Atomic uint64_t bytes_out;
    _Atomic uint64_t lat_sum;
    _Atomic uint64_t lat[KVI_HTTP_LATENCY_BUCKETS + 1];
} KVI_CACHE_ALIGNED;

struct worker;

/* A message to a loop (see the table in net/http_server.c). */
struct msg {
    h2o_multithread_message_t super;
    void (*fn)(struct worker *w, struct msg *m);
};

enum { W_RUNNING, W_DRAINING, W_DONE };

struct worker {
    struct kvi_http_server *srv;
    unsigned idx;
    int listen_fd;
    pthread_t tid;
    bool thread_started;
    bool ready;              /* context set up (guarded by srv->ready_mu) */
    /* Gate for messages from other threads: a sender holds mu while it checks
     * `alive` and sends; the loop clears `alive` under mu before it drains
     * its receiver and tears down, so no message can arrive after that. */
    pthread_mutex_t mu;
    bool alive;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_socket_t *listener;
    h2o_multithread_receiver_t receiver;
    struct msg stop_msg;
    h2o_timeout_t sweep_timeout;
    h2o_timeout_entry_t sweep_entry;
    h2o_timeout_t pause_timeout;
    h2o_timeout_entry_t pause_entry;
    h2o_timeout_t reap_timeout;     /* idle reaper period (see on_reap) */
    h2o_timeout_entry_t reap_entry;
    h2o_linklist_t conns;    /* struct conn */
    size_t nconns;
    h2o_linklist_t deferred; /* struct kvi_http_deferred whose request is alive */
    h2o_linklist_t streams;  /* struct kvi_http_stream whose request is alive and unfinished */
    int state;               /* W_* (loop thread) */
    uint64_t deadline;       /* loop clock, ms */
    bool forced;
    void *thread_ctx;
    struct ctr *ctr;         /* nroutes + 1 (the last: unmatched) */
    _Atomic uint64_t in_flight;
    _Atomic unsigned listening;
    _Atomic uint64_t rejected; /* refused by the framing and target rules (loop thread writes) */
    /* Abuse limits (net/http_guard.c); written by this loop only, read by stats. */
    _Atomic uint64_t out_buffered;   /* unread answer bytes charged on this loop */
    _Atomic uint64_t out_conn_closed;
    _Atomic uint64_t out_refused;
    _Atomic uint64_t write_timeouts;
    _Atomic uint64_t h2_resets;
    _Atomic uint64_t h2_floods;
    _Atomic uint64_t accept_failures;
    size_t out_limit;                /* this loop's share of opt.output_limit (0: none) */
    uint64_t log_after;              /* loop clock (ms): no further warning line before it */
    unsigned log_skipped;            /* warnings left out since the last one */
};

/* One accepted connection (loop thread only). */
struct conn {
    h2o_linklist_t link;
    h2o_linklist_t reqs; /* struct kvi_http_res in flight on it */
    struct worker *w;
    int fd;
    unsigned inflight;
    uint64_t idle_since; /* loop clock (ms) when inflight last became 0, or the accept */
    bool shut;
    bool reject_logged;  /* a refused request was logged: once per connection is enough */
    bool addr_held;      /* counted in the per-address table under addr */
    uint8_t addr[16];    /* peer address, IPv4 as ::ffff:a.b.c.d */
    size_t out;          /* unread answer bytes charged to this connection (net/http_guard.c) */
    /* HTTP/2 early-reset budget: a token bucket (net/http_guard.c) */
    ssize_t (*h2_next)(void *h2conn, const uint8_t *src, size_t len, const char **err_desc); /* h2o's reader */
    double reset_tokens;
    uint64_t reset_at;   /* loop clock (ms) of the last refill */
};

struct handler_ext {
    h2o_handler_t super;
    struct kvi_http_server *srv;
};

struct kvi_http_server {
    struct kvi_http_options opt;
    h2o_globalconf_t cfg;
    h2o_hostconf_t *hostconf;
    SSL_CTX *ssl;
    struct route *routes;
    int nroutes;
    int routes_cap;
    struct worker *workers;
    unsigned nthreads;
    uint16_t port;
    _Atomic bool started;
    pthread_mutex_t stop_mu;
    pthread_mutex_t ready_mu;
    pthread_cond_t ready_cv;
    bool stopped;
    int stop_result;
    _Atomic bool forced;
    _Atomic uint64_t conns_open;
    _Atomic uint64_t conns_accepted;
    _Atomic uint64_t conns_rejected;
    _Atomic int64_t outstanding; /* deferred handles not completed + streams not ended */
    _Atomic uint64_t conns_rejected_addr;
    struct kvi_http_addrs *addrs; /* per-address connection counts; NULL without the limit */
};

enum { R_NONE, R_DONE, R_DEFERRED, R_PULL, R_PUSH };

/* Per-request state: a shared chunk on the request's pool (see net/http_request.c). */
struct kvi_http_res {
    h2o_req_t *req;
    struct worker *w;
    struct conn *conn;        /* NULL once the connection record is gone */
    h2o_linklist_t conn_link; /* in conn->reqs */
    int ctr_idx;              /* route id, or nroutes for unmatched */
    int state;                /* R_* */
    int status;
    bool head;
    bool accounted; /* counted as answered or aborted */
    uint64_t t0;
    size_t out;          /* bytes charged to the output budgets while the answer is unread */
    uint64_t wait_since; /* loop clock (ms) since when h2o holds data of ours the client has not taken; 0: none */
    uint64_t sent_seen;  /* req->bytes_sent when wait_since was last set (HTTP/2 progress) */
    struct kvi_http_deferred *def;
    struct kvi_http_stream *stream;
    struct {
        struct kvi_http_producer p;
        void *buf;
        uint64_t bytes;
        bool released;
    } pull;
    h2o_generator_t gen;
};

struct kvi_http_deferred {
    struct msg msg;
    struct worker *w;
    struct kvi_http_res *res; /* loop thread only; NULL once the request died or was answered */
    h2o_linklist_t link;      /* in w->deferred while res != NULL */
    int status;
    char *chunk;              /* h2o shared chunk: body, then the content type and a NUL */
    size_t len;
    bool has_ctype;
};

struct chunk {
    struct chunk *next;
    size_t len;
    size_t cap;
    char data[];
};

struct kvi_http_stream {
    struct msg wake;
    struct worker *w;
    h2o_generator_t gen;
    /* loop thread only */
    struct kvi_http_res *res; /* NULL once the request died */
    h2o_linklist_t link;      /* in w->streams while res != NULL and unfinished */
    struct chunk *sending;    /* handed to h2o, freed at the next proceed or at dispose */
    uint64_t bytes;
    bool finished;            /* final send done */
    bool head;                /* HEAD request: writes are discarded */
    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct chunk *head_chunk;
    struct chunk **tail;
    size_t queued;
    bool ended;
    int error;
    bool gone;
    bool stalled;      /* the client took nothing for stall_ms: the loop cuts the connection */
    bool loop_idle;    /* the generator waits for data */
    bool wake_pending; /* wake message queued */
    uint64_t taken;    /* bytes the loop has taken from the queue (progress) */
    unsigned stall_ms; /* the server's idle_timeout_ms */
    int refs;
};

/* ---- shared between the three files ---------------------------------------- */

/* http_server.c */

/** Post @p m to loop @p w from any thread (run here, only freeing, once the loop is gone). */
void kvi_http__post(struct worker *w, struct msg *m);

/** The connection record of @p req, or NULL (not one of ours, or already closed). */
struct conn *kvi_http__conn_of(h2o_req_t *req);

/** The connection record of @p sock, or NULL (not one of ours). */
struct conn *kvi_http__conn_of_sock(h2o_socket_t *sock);

/* http_request.c */

/** The h2o handler at "/": route, check and call the route's callback. */
int kvi_http__on_req(h2o_handler_t *self, h2o_req_t *req);

/** The fallback path's filter: h2o's own error answers become JSON. */
void kvi_http__errjson_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot);

/** Die if @p r was answered already. */
void kvi_http__answer_check(struct kvi_http_res *r);

/** Set the status, reason and content type (NULL: none) of @p req's answer. */
void kvi_http__set_head(h2o_req_t *req, int status, const char *ctype);

/** Count @p r as answered with @p status and @p bytes_out body bytes. */
void kvi_http__res_count_answer(struct kvi_http_res *r, int status, uint64_t bytes_out);

/** Count @p r as aborted. */
void kvi_http__res_count_abort(struct kvi_http_res *r);

/** Answer @p r with a JSON error {"error": text}. */
void kvi_http__send_error(struct kvi_http_res *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* http_guard.c: the abuse limits (see "Limits" in net/http_server.h) */

/** Set up @p s's guards from its options (create): the per-address table. */
void kvi_http__guard_init(struct kvi_http_server *s);

/** Free what kvi_http__guard_init made (server destroy, loops joined). */
void kvi_http__guard_fini(struct kvi_http_server *s);

/**
 * Count a new connection from @p sa against max_conns_per_addr (loop
 * thread, accept). @return true when it may stay (c->addr, c->addr_held
 * set), false when its address is at the limit (counted and logged; the
 * caller closes it).
 */
bool kvi_http__addr_acquire(struct worker *w, struct conn *c, const struct sockaddr *sa, socklen_t len);

/** Uncount @p c's address (loop thread, connection closed). */
void kvi_http__addr_release(struct worker *w, struct conn *c);

/** Count a failed accept(2) with @p err and log it (loop thread; rate-limited). */
void kvi_http__accept_failed(struct worker *w, int err);

/**
 * Charge a whole answer of @p len body bytes to @p r's connection and loop
 * before it is handed to h2o (loop thread). @return 0 when it fits; 1 when
 * the loop's share of output_limit is spent (the caller answers 503 instead,
 * charged the same way); 2 when the connection is past conn_output_limit
 * (it has been shut down; the caller answers anyway, h2o drops it).
 */
int kvi_http__out_charge(struct kvi_http_res *r, size_t len, bool force);

/** Return @p r's charge (loop thread, request disposed). */
void kvi_http__out_release(struct kvi_http_res *r);

/** Note that h2o now holds data of @p r the client has yet to take (loop thread). */
void kvi_http__out_waiting(struct kvi_http_res *r);

/**
 * Whether @p c holds an answer the client has not taken (no progress) for
 * @p limit_ms at loop time @p now; counted and logged when true (loop thread,
 * reaper).
 */
bool kvi_http__conn_stalled(struct worker *w, struct conn *c, uint64_t now, uint64_t limit_ms);

/**
 * Watch @p req's HTTP/2 connection for streams reset early (loop thread,
 * dispatch; once per connection, a no-op for HTTP/1.x or with no limit).
 */
void kvi_http__h2_guard(struct kvi_http_server *s, struct conn *c, h2o_req_t *req);

/* http_stream.c */

/** Free a list of pushed-stream chunks. */
void kvi_http__free_chunks(struct chunk *c);

/** Free @p st when @p last (its last reference was just dropped). */
void kvi_http__stream_release(struct kvi_http_stream *st, bool last);

/** Mark pushed stream @p st finished and count its request answered (@p ok) or aborted. */
void kvi_http__push_finish(struct kvi_http_stream *st, bool ok);

#endif
