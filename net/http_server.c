/*
 * kvidx HTTP server on h2o 2.2.5 (libh2o-evloop).
 *
 * DESIGN
 *
 * Threads. One event loop per thread (`struct worker`), each with its own
 * listening socket bound with SO_REUSEPORT to one address; the sockets are
 * bound in kvi_http_server_create (the first picks the port when port 0 was
 * asked for, the others reuse it) and every h2o context is set up in
 * kvi_http_server_start before its thread runs, so a stop message can reach
 * a loop from the first moment on. A loop thread registers as an RCU reader
 * (memb) and runs handlers inline. h2o objects are touched only by their loop
 * thread, and after the thread is joined by kvi_http_server_free.
 *
 * Dispatch. One h2o handler at "/" takes every request; our own exact-path
 * route table (immutable after start) picks the route, checks method, admin
 * token and the route's body limit, and calls the route's callback. h2o's own
 * error answers (malformed or oversize HTTP/1.1 bodies, a path h2o cannot
 * map) come through the host's fallback path, whose filter rewrites them to
 * JSON.
 *
 * Per-request state (`struct kvi_http_res`) is a shared chunk hung on the
 * request's pool: its dispose callback runs on the loop thread when h2o frees
 * the request, whatever the reason (answer sent, client reset, connection
 * closed), and cuts every link to it (c-stack.md §2.1 pitfall 8). Deferred
 * answers and pushed streams live in malloc'd objects that point to the
 * `kvi_http_res` only while it is alive.
 *
 * Cross-thread traffic goes through one h2o_multithread receiver per loop
 * (mutex + pipe wake-up, only on the empty -> non-empty transition):
 *
 *   | message          | sender                     | loop action                          |
 *   |------------------|----------------------------|--------------------------------------|
 *   | deferred answer  | kvi_http_complete*         | send it, or drop it if the request   |
 *   |                  |                            | died; free the op                    |
 *   | stream wake-up   | kvi_http_stream_write/_end | send queued chunks if the generator  |
 *   |                  | (only when the loop waits) | waits for data                       |
 *   | stop             | kvi_http_server_stop       | start draining                       |
 *
 * A pushed stream's queue is guarded by its mutex; the writer blocks on its
 * condition variable above KVI_HTTP_STREAM_HIGH_WATER queued bytes, the loop
 * signals it as it takes chunks. A writer that sees no progress for
 * idle_timeout_ms (the client reads nothing: h2o 2.2 has no write timeout)
 * marks the stream stalled and gone and wakes the loop, which shuts the
 * connection down; the writer's thread (e.g. a writer thread dumping its
 * partition) is never held longer than that. The stream is freed when its three
 * references are gone: the loop's (request disposed), the writer's
 * (kvi_http_stream_end) and a pending wake-up message.
 *
 * Shutdown. The stop message makes a loop close its listener, call
 * h2o_context_request_shutdown (no more keep-alive, HTTP/2 GOAWAY) and sweep
 * its connections every SWEEP_MS: a connection with no dispatched request in
 * flight is shut down (shutdown(2) on its fd; h2o sees end-of-file and frees
 * it its own way). At the grace deadline pending deferred requests are
 * answered 503, idle pushed streams are aborted and every connection is shut
 * down. The loop ends when it has no connection left; kvi_http_server_stop
 * joins the threads. Messages that arrive after a loop ended are drained by
 * kvi_http_server_free (their requests are gone by then).
 *
 * A streamed body's END_STREAM always goes out on its own empty final send:
 * Debian 12's libcurl 7.88.1 now and then never finishes an HTTP/2 transfer
 * whose END_STREAM rides on the last DATA frame of a pushed stream (measured
 * with a libcurl client: 11 stalls in 60 8-MiB transfers; none with the
 * empty final send).
 *
 * Counters are per thread and per route, written only by the loop thread
 * (relaxed single-writer stores) and summed by readers.
 */
#include "net/http_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <h2o.h>
#include <openssl/ssl.h>

#include "engine/common.h"
#include "engine/rcu.h"

#define MAX_THREADS 64
#define SWEEP_MS 20          /* drain sweep period */
#define ACCEPT_PAUSE_MS 100  /* accept back-off after EMFILE and friends */
#define ACCEPT_BURST 64      /* accepts per readiness event */
#define PUSH_IOV_MAX 64      /* chunks handed to h2o per send */
#define PUSH_CHUNK_MIN 16384 /* pushed writes are coalesced into chunks this big */
#define ERROR_TEXT_MAX 1000

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

/* A message to a loop (see the table above). */
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
};

enum { R_NONE, R_DONE, R_DEFERRED, R_PULL, R_PUSH };

/* Per-request state: a shared chunk on the request's pool (see DESIGN). */
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

static _Thread_local struct worker *tl_worker;

/*
 * h2o 2.2.5 caches freed buffers in per-thread recycle lists (__thread
 * variables in lib/common/memory.c, lib/common/socket.c and
 * lib/http2/connection.c, two of them static) and offers no call to empty
 * them. When a loop thread exits, what its caches held becomes unreachable,
 * and LeakSanitizer would report it at exit. Those allocations, and only
 * those, all come from h2o_mem_alloc_recycle.
 */
#if defined(__SANITIZE_ADDRESS__)
#define KVI_HTTP_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVI_HTTP_LSAN 1
#endif
#endif
#ifdef KVI_HTTP_LSAN
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:h2o_mem_alloc_recycle\n";
}
#endif
static h2o_generator_t static_gen = {NULL, NULL};

/* ---- small helpers ---- */

static const char *status_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 400 ? "OK" : "Error";
    }
}

static unsigned method_bit(h2o_iovec_t m)
{
    switch (m.len) {
    case 3:
        if (memcmp(m.base, "GET", 3) == 0)
            return KVI_HTTP_GET;
        if (memcmp(m.base, "PUT", 3) == 0)
            return KVI_HTTP_PUT;
        break;
    case 4:
        if (memcmp(m.base, "POST", 4) == 0)
            return KVI_HTTP_POST;
        if (memcmp(m.base, "HEAD", 4) == 0)
            return KVI_HTTP_HEAD;
        break;
    case 5:
        if (memcmp(m.base, "PATCH", 5) == 0)
            return KVI_HTTP_PATCH;
        break;
    case 6:
        if (memcmp(m.base, "DELETE", 6) == 0)
            return KVI_HTTP_DELETE;
        break;
    case 7:
        if (memcmp(m.base, "OPTIONS", 7) == 0)
            return KVI_HTTP_OPTIONS;
        break;
    }
    return KVI_HTTP_OTHER;
}

static const char *const method_names[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"};

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one. */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    size_t len;
    unsigned cp;
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        len = 2;
        cp = s[0] & 0x1f;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        len = 3;
        cp = s[0] & 0x0f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        len = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

/*
 * Write `{"error":"<text escaped>"}` into @p out (capacity at least
 * 6 * n + 16) and return its length. Invalid UTF-8 bytes become U+FFFD.
 */
static size_t json_error_body(char *out, const char *text, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)text;
    char *o = out;
    memcpy(o, "{\"error\":\"", 10);
    o += 10;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(o, "\\u00", 4);
            o[4] = hex[c >> 4];
            o[5] = hex[c & 15];
            o += 6;
            i++;
        } else {
            size_t l = utf8_seq_len(s + i, n - i);
            if (l == 0) {
                memcpy(o, "\xef\xbf\xbd", 3);
                o += 3;
                i++;
            } else {
                memcpy(o, s + i, l);
                o += l;
                i += l;
            }
        }
    }
    memcpy(o, "\"}", 2);
    o += 2;
    return (size_t)(o - out);
}

static unsigned latency_bucket(uint64_t ns)
{
    unsigned b = 0;
    while (b < KVI_HTTP_LATENCY_BUCKETS && ns > kvi_http_latency_bound_ns(b))
        b++;
    return b;
}

static void free_chunks(struct chunk *c)
{
    while (c != NULL) {
        struct chunk *n = c->next;
        free(c);
        c = n;
    }
}

static void stream_release(struct kvi_http_stream *st, bool last)
{
    if (last) {
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
        free(st);
    }
}

static struct worker *worker_of_ctx(h2o_context_t *ctx)
{
    return H2O_STRUCT_FROM_MEMBER(struct worker, ctx, ctx);
}

/* ---- counters ---- */

static void count_answer(struct worker *w, int ctr_idx, int status, uint64_t bytes_out, uint64_t t0)
{
    struct ctr *c = &w->ctr[ctr_idx];
    unsigned cls = (unsigned)status / 100;
    if (cls > 5)
        cls = 5;
    kvi_relaxed_add(&c->status[cls], 1);
    kvi_relaxed_add(&c->bytes_out, bytes_out);
    if (t0 != 0) {
        uint64_t ns = kvi_now_ns() - t0;
        kvi_relaxed_add(&c->lat_sum, ns);
        kvi_relaxed_add(&c->lat[latency_bucket(ns)], 1);
    }
}

static void counters_add(struct kvi_http_counters *o, const struct ctr *c)
{
    o->requests += atomic_load_explicit(&c->requests, memory_order_relaxed);
    for (int i = 0; i < 6; i++)
        o->status[i] += atomic_load_explicit(&c->status[i], memory_order_relaxed);
    o->aborted += atomic_load_explicit(&c->aborted, memory_order_relaxed);
    o->bytes_in += atomic_load_explicit(&c->bytes_in, memory_order_relaxed);
    o->bytes_out += atomic_load_explicit(&c->bytes_out, memory_order_relaxed);
    o->latency_ns_sum += atomic_load_explicit(&c->lat_sum, memory_order_relaxed);
    for (int i = 0; i <= KVI_HTTP_LATENCY_BUCKETS; i++)
        o->latency_buckets[i] += atomic_load_explicit(&c->lat[i], memory_order_relaxed);
}

/* ---- answering ---- */

static void set_head(h2o_req_t *req, int status, const char *ctype)
{
    req->res.status = status;
    req->res.reason = status_reason(status);
    if (ctype != NULL) {
        h2o_iovec_t v = h2o_strdup(&req->pool, ctype, strlen(ctype));
        h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, v.base, v.len, 1);
    }
}

/* Send a whole answer whose body lives at least as long as the request. */
static void res_count_answer(struct kvi_http_res *r, int status, uint64_t bytes_out)
{
    r->accounted = true;
    count_answer(r->w, r->ctr_idx, status, bytes_out, r->t0);
}

static void res_count_abort(struct kvi_http_res *r)
{
    r->accounted = true;
    kvi_relaxed_add(&r->w->ctr[r->ctr_idx].aborted, 1);
}

static void send_final(struct kvi_http_res *r, int status, const char *ctype, const void *body, size_t len)
{
    h2o_req_t *req = r->req;
    set_head(req, status, ctype);
    req->res.content_length = len;
    r->state = R_DONE;
    r->status = status;
    /* Count first: a client may read the counters as soon as it has the answer. */
    res_count_answer(r, status, r->head ? 0 : len);
    h2o_start_response(req, &static_gen);
    if (r->head || len == 0) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        h2o_iovec_t v = h2o_iovec_init(body, len);
        h2o_send(req, &v, 1, H2O_SEND_STATE_FINAL);
    }
}

static void send_json_error(struct kvi_http_res *r, int status, const char *text, size_t n)
{
    char *body = h2o_mem_alloc_pool(&r->req->pool, 6 * n + 16);
    size_t len = json_error_body(body, text, n);
    send_final(r, status, "application/json", body, len);
}

static void vsend_error(struct kvi_http_res *r, int status, const char *fmt, va_list ap)
{
    char text[ERROR_TEXT_MAX + 1];
    int n = vsnprintf(text, sizeof text, fmt, ap);
    if (n < 0)
        n = 0;
    if (n > ERROR_TEXT_MAX)
        n = ERROR_TEXT_MAX;
    send_json_error(r, status, text, (size_t)n);
}

static void send_error(struct kvi_http_res *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void send_error(struct kvi_http_res *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsend_error(r, status, fmt, ap);
    va_end(ap);
}

static void answer_check(struct kvi_http_res *r)
{
    if (r->state != R_NONE)
        kvi_die("http: a request was answered twice");
}

int kvi_http_add_header(struct kvi_http_res *r, const char *name, const char *value)
{
    size_t nlen = strlen(name);
    if (nlen == 0)
        return -EINVAL;
    h2o_req_t *req = r->req;
    char *lower = h2o_mem_alloc_pool(&req->pool, nlen);
    for (size_t i = 0; i < nlen; i++)
        lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i]);
    h2o_iovec_t orig = h2o_strdup(&req->pool, name, nlen);
    h2o_iovec_t v = h2o_strdup(&req->pool, value, strlen(value));
    h2o_add_header_by_str(&req->pool, &req->res.headers, lower, nlen, 1, orig.base, v.base, v.len);
    return 0;
}

void *kvi_http_alloc(struct kvi_http_res *r, size_t n)
{
    return h2o_mem_alloc_pool(&r->req->pool, n ? n : 1);
}

void kvi_http_respond(struct kvi_http_res *r, int status, const char *ctype, const void *body, size_t len)
{
    answer_check(r);
    void *copy = NULL;
    if (len != 0 && !r->head) {
        copy = h2o_mem_alloc_pool(&r->req->pool, len);
        memcpy(copy, body, len);
    }
    send_final(r, status, ctype, copy, len);
}

void kvi_http_respond_nocopy(struct kvi_http_res *r, int status, const char *ctype, const void *body, size_t len)
{
    answer_check(r);
    send_final(r, status, ctype, body, len);
}

static void free_owned(void *slot)
{
    free(*(void **)slot);
}

void kvi_http_respond_owned(struct kvi_http_res *r, int status, const char *ctype, void *body, size_t len)
{
    answer_check(r);
    void **slot = h2o_mem_alloc_shared(&r->req->pool, sizeof *slot, free_owned);
    *slot = body;
    send_final(r, status, ctype, body, len);
}

void kvi_http_error(struct kvi_http_res *r, int status, const char *fmt, ...)
{
    answer_check(r);
    va_list ap;
    va_start(ap, fmt);
    vsend_error(r, status, fmt, ap);
    va_end(ap);
}

/* ---- request helpers ---- */

struct kvi_http_str kvi_http_req_header(const struct kvi_http_req *view, const char *name)
{
    h2o_req_t *req = view->_h2o;
    char lower[128];
    size_t n = strlen(name);
    struct kvi_http_str none = {NULL, 0};
    if (n == 0 || n > sizeof lower)
        return none;
    for (size_t i = 0; i < n; i++)
        lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i]);
    const h2o_token_t *tok = h2o_lookup_token(lower, n);
    ssize_t at = tok != NULL ? h2o_find_header(&req->headers, tok, -1)
                             : h2o_find_header_by_str(&req->headers, lower, n, -1);
    if (at < 0)
        return none;
    h2o_iovec_t v = req->headers.entries[at].value;
    return (struct kvi_http_str){v.base, v.len};
}

static struct kvi_http_str header_of(h2o_req_t *req, const h2o_token_t *tok)
{
    ssize_t at = h2o_find_header(&req->headers, tok, -1);
    if (at < 0)
        return (struct kvi_http_str){NULL, 0};
    return (struct kvi_http_str){req->headers.entries[at].value.base, req->headers.entries[at].value.len};
}

static bool bearer_matches(struct kvi_http_str auth, const char *token)
{
    if (token == NULL || token[0] == '\0')
        return true;
    if (auth.p == NULL || auth.len < 7 || strncasecmp(auth.p, "bearer ", 7) != 0)
        return false;
    const char *p = auth.p + 7;
    size_t n = auth.len - 7;
    while (n > 0 && *p == ' ') {
        p++;
        n--;
    }
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    size_t tn = strlen(token);
    unsigned diff = (unsigned)(n ^ tn);
    for (size_t i = 0; i < tn; i++)
        diff |= (unsigned char)token[i] ^ (unsigned char)(i < n ? p[i] : 0);
    return diff == 0;
}

bool kvi_http_req_bearer_ok(const struct kvi_http_req *req, const char *token)
{
    return bearer_matches(req->authorization, token);
}

/* ---- per-request state ---- */

static void res_dispose(void *p)
{
    struct kvi_http_res *r = p;
    struct worker *w = r->w;
    r->req = NULL;
    if (r->conn != NULL) {
        if (--r->conn->inflight == 0)
            r->conn->idle_since = h2o_now(w->ctx.loop);
        h2o_linklist_unlink(&r->conn_link);
        r->conn = NULL;
    }
    atomic_store_explicit(&w->in_flight, atomic_load_explicit(&w->in_flight, memory_order_relaxed) - 1,
                          memory_order_relaxed);
    if (!r->accounted)
        res_count_abort(r);

    if (r->def != NULL) {
        r->def->res = NULL;
        h2o_linklist_unlink(&r->def->link);
        r->def = NULL;
    }
    if (r->state == R_PULL && !r->pull.released) {
        r->pull.released = true;
        if (r->pull.p.release != NULL)
            r->pull.p.release(r->pull.p.ud, -EPIPE);
    }
    if (r->stream != NULL) {
        struct kvi_http_stream *st = r->stream;
        struct chunk *queued;
        bool last;
        r->stream = NULL;
        st->res = NULL;
        if (h2o_linklist_is_linked(&st->link))
            h2o_linklist_unlink(&st->link);
        struct chunk *sending = st->sending;
        st->sending = NULL;
        pthread_mutex_lock(&st->mu);
        st->gone = true;
        queued = st->head_chunk;
        st->head_chunk = NULL;
        st->tail = &st->head_chunk;
        st->queued = 0;
        st->loop_idle = false;
        last = --st->refs == 0;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        free_chunks(sending);
        free_chunks(queued);
        stream_release(st, last);
    }
}

static struct conn *conn_of(h2o_req_t *req);

static struct kvi_http_res *res_new(struct worker *w, h2o_req_t *req, int ctr_idx, uint64_t t0)
{
    struct kvi_http_res *r = h2o_mem_alloc_shared(&req->pool, sizeof *r, res_dispose);
    memset(r, 0, sizeof *r);
    r->req = req;
    r->w = w;
    r->ctr_idx = ctr_idx;
    r->t0 = t0;
    r->head = req->method.len == 4 && memcmp(req->method.base, "HEAD", 4) == 0;
    r->conn = conn_of(req);
    if (r->conn != NULL) {
        r->conn->inflight++;
        h2o_linklist_insert(&r->conn->reqs, &r->conn_link);
    }
    atomic_store_explicit(&w->in_flight, atomic_load_explicit(&w->in_flight, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    struct ctr *c = &w->ctr[ctr_idx];
    kvi_relaxed_add(&c->requests, 1);
    kvi_relaxed_add(&c->bytes_in, req->entity.len);
    return r;
}

/* ---- messages to a loop ---- */

/*
 * Post @p m to loop @p w from any thread. Once the loop is gone its request
 * objects are gone too, so the handler runs right here and only frees.
 */
static void post(struct worker *w, struct msg *m)
{
    pthread_mutex_lock(&w->mu);
    bool alive = w->alive;
    if (alive)
        h2o_multithread_send_message(&w->receiver, &m->super);
    pthread_mutex_unlock(&w->mu);
    if (!alive)
        m->fn(w, m);
}

/* ---- deferred answers ---- */

static void deferred_deliver(struct worker *w, struct msg *m)
{
    struct kvi_http_deferred *d = H2O_STRUCT_FROM_MEMBER(struct kvi_http_deferred, msg, m);
    struct kvi_http_res *r = d->res;
    if (r != NULL) {
        /* Detach first: nothing below may reach d once the answer is out. */
        h2o_linklist_unlink(&d->link);
        r->def = NULL;
        d->res = NULL;
        h2o_mem_link_shared(&r->req->pool, d->chunk);
        send_final(r, d->status, d->has_ctype ? d->chunk + d->len : NULL, d->chunk, d->len);
    }
    h2o_mem_release_shared(d->chunk);
    free(d);
}

struct kvi_http_deferred *kvi_http_defer(struct kvi_http_res *r)
{
    answer_check(r);
    struct kvi_http_deferred *d = kvi_xcalloc(1, sizeof *d);
    d->msg.fn = deferred_deliver;
    d->w = r->w;
    d->res = r;
    h2o_linklist_insert(&r->w->deferred, &d->link);
    r->def = d;
    r->state = R_DEFERRED;
    atomic_fetch_add_explicit(&r->w->srv->outstanding, 1, memory_order_relaxed);
    return d;
}

void kvi_http_complete(struct kvi_http_deferred *d, int status, const char *ctype, const void *body, size_t len)
{
    size_t ctlen = ctype != NULL ? strlen(ctype) : 0;
    d->chunk = h2o_mem_alloc_shared(NULL, len + ctlen + 1, NULL);
    if (len != 0)
        memcpy(d->chunk, body, len);
    if (ctlen != 0)
        memcpy(d->chunk + len, ctype, ctlen);
    d->chunk[len + ctlen] = '\0';
    d->len = len;
    d->has_ctype = ctype != NULL;
    d->status = status;
    struct worker *w = d->w;
    atomic_fetch_sub_explicit(&w->srv->outstanding, 1, memory_order_relaxed);
    post(w, &d->msg);
}

void kvi_http_complete_error(struct kvi_http_deferred *d, int status, const char *fmt, ...)
{
    char text[ERROR_TEXT_MAX + 1];
    char body[6 * ERROR_TEXT_MAX + 16];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if (n > ERROR_TEXT_MAX)
        n = ERROR_TEXT_MAX;
    size_t len = json_error_body(body, text, (size_t)n);
    kvi_http_complete(d, status, "application/json", body, len);
}

/* ---- pulled streams ---- */

static void pull_finish(struct kvi_http_res *r, int outcome)
{
    r->pull.released = true;
    if (outcome == 0)
        res_count_answer(r, r->status, r->pull.bytes);
    else
        res_count_abort(r);
    if (r->pull.p.release != NULL)
        r->pull.p.release(r->pull.p.ud, outcome);
}

static void pull_next(struct kvi_http_res *r)
{
    h2o_req_t *req = r->req;
    ssize_t n = r->pull.p.pull(r->pull.p.ud, r->pull.buf, KVI_HTTP_PULL_CHUNK);
    if (n > 0) {
        if ((size_t)n > KVI_HTTP_PULL_CHUNK)
            kvi_die("http: pull() returned %zd bytes for a %u-byte buffer", n, KVI_HTTP_PULL_CHUNK);
        h2o_iovec_t v = h2o_iovec_init(r->pull.buf, (size_t)n);
        r->pull.bytes += (uint64_t)n;
        h2o_send(req, &v, 1, H2O_SEND_STATE_IN_PROGRESS);
    } else if (n == 0) {
        pull_finish(r, 0);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        pull_finish(r, (int)n);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_ERROR);
    }
}

static void pull_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    struct kvi_http_res *r = H2O_STRUCT_FROM_MEMBER(struct kvi_http_res, gen, g);
    pull_next(r);
}

void kvi_http_stream_pull(struct kvi_http_res *r, int status, const char *ctype, const struct kvi_http_producer *p)
{
    answer_check(r);
    h2o_req_t *req = r->req;
    r->state = R_PULL;
    r->status = status;
    r->pull.p = *p;
    set_head(req, status, ctype);
    r->gen.proceed = pull_proceed;
    r->gen.stop = NULL; /* res_dispose releases the producer */
    h2o_start_response(req, &r->gen);
    if (r->head) {
        pull_finish(r, 0);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
        return;
    }
    r->pull.buf = h2o_mem_alloc_pool(&req->pool, KVI_HTTP_PULL_CHUNK);
    pull_next(r);
}

/* ---- pushed streams ---- */

static void push_finish(struct kvi_http_stream *st, bool ok)
{
    struct kvi_http_res *r = st->res;
    st->finished = true;
    if (h2o_linklist_is_linked(&st->link))
        h2o_linklist_unlink(&st->link);
    if (ok)
        res_count_answer(r, r->status, st->bytes);
    else
        res_count_abort(r);
}

/* Hand queued chunks to h2o (loop thread, st->res alive, no send in progress). */
static void push_flush(struct kvi_http_stream *st)
{
    struct chunk *take = NULL, **tp = &take;
    h2o_iovec_t iov[PUSH_IOV_MAX];
    size_t n = 0, bytes = 0;
    bool fin, err;

    pthread_mutex_lock(&st->mu);
    if (st->gone) {
        /* Cut by shutdown while a send was in progress. */
        st->loop_idle = false;
        pthread_mutex_unlock(&st->mu);
        push_finish(st, false);
        h2o_send(st->res->req, NULL, 0, H2O_SEND_STATE_ERROR);
        return;
    }
    while (st->head_chunk != NULL && n < PUSH_IOV_MAX) {
        struct chunk *c = st->head_chunk;
        st->head_chunk = c->next;
        c->next = NULL;
        *tp = c;
        tp = &c->next;
        iov[n++] = h2o_iovec_init(c->data, c->len);
        bytes += c->len;
    }
    if (st->head_chunk == NULL)
        st->tail = &st->head_chunk;
    st->queued -= bytes;
    st->taken += bytes;
    if (bytes != 0)
        pthread_cond_broadcast(&st->cv);
    /* END_STREAM goes out on its own (empty) send; see DESIGN. */
    fin = st->ended && st->head_chunk == NULL && n == 0;
    err = st->ended && st->error != 0;
    st->loop_idle = n == 0 && !fin;
    pthread_mutex_unlock(&st->mu);

    if (n == 0 && !fin)
        return;
    st->sending = take;
    h2o_req_t *req = st->res->req;
    if (err) {
        push_finish(st, false);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_ERROR);
        return;
    }
    st->bytes += bytes;
    if (fin)
        push_finish(st, true);
    h2o_send(req, iov, n, fin ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void push_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    struct kvi_http_stream *st = H2O_STRUCT_FROM_MEMBER(struct kvi_http_stream, gen, g);
    free_chunks(st->sending);
    st->sending = NULL;
    push_flush(st);
}

/*
 * A stalled stream: the client has not taken a byte for stall_ms while h2o
 * still holds a send it cannot finish, so no answer can be ended in-band.
 * Shut the connection down; h2o then fails the send and frees the request.
 */
static void push_cut(struct kvi_http_stream *st)
{
    struct conn *c = st->res->conn;
    if (c != NULL && !c->shut) {
        shutdown(c->fd, SHUT_RDWR);
        c->shut = true;
    }
}

static void push_wake(struct worker *w, struct msg *m)
{
    struct kvi_http_stream *st = H2O_STRUCT_FROM_MEMBER(struct kvi_http_stream, wake, m);
    bool idle, stalled, last;
    pthread_mutex_lock(&st->mu);
    st->wake_pending = false;
    idle = st->loop_idle;
    stalled = st->stalled;
    pthread_mutex_unlock(&st->mu);
    if (st->res != NULL && !st->finished && stalled)
        push_cut(st);
    else if (st->res != NULL && !st->finished && idle)
        push_flush(st);
    pthread_mutex_lock(&st->mu);
    last = --st->refs == 0;
    pthread_mutex_unlock(&st->mu);
    stream_release(st, last);
}

/* Caller holds st->mu; returns whether a wake message must be sent (after unlocking). */
static bool push_need_wake_locked(struct kvi_http_stream *st)
{
    if (!st->loop_idle || st->wake_pending)
        return false;
    st->wake_pending = true;
    st->refs++;
    return true;
}

struct kvi_http_stream *kvi_http_stream_open(struct kvi_http_res *r, int status, const char *ctype)
{
    answer_check(r);
    h2o_req_t *req = r->req;
    struct kvi_http_stream *st = kvi_xcalloc(1, sizeof *st);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, &ca);
    pthread_condattr_destroy(&ca);
    st->stall_ms = r->w->srv->opt.idle_timeout_ms;
    st->wake.fn = push_wake;
    st->w = r->w;
    st->res = r;
    st->tail = &st->head_chunk;
    st->refs = 2; /* the loop's (until dispose) and the writer's (until end) */
    st->loop_idle = true;
    st->head = r->head;
    r->state = R_PUSH;
    r->status = status;
    r->stream = st;
    set_head(req, status, ctype);
    st->gen.proceed = push_proceed;
    st->gen.stop = NULL; /* res_dispose cuts the stream */
    h2o_start_response(req, &st->gen);
    atomic_fetch_add_explicit(&r->w->srv->outstanding, 1, memory_order_relaxed);
    if (r->head) {
        st->loop_idle = false;
        push_finish(st, true);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        h2o_linklist_insert(&r->w->streams, &st->link);
    }
    return st;
}

static void deadline_in(struct timespec *dl, unsigned ms)
{
    clock_gettime(CLOCK_MONOTONIC, dl);
    dl->tv_sec += ms / 1000;
    dl->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl->tv_nsec >= 1000000000L) {
        dl->tv_sec++;
        dl->tv_nsec -= 1000000000L;
    }
}

/*
 * Wait (st->mu held) until the queue is under the high water or the stream
 * is gone. @return false when the loop took nothing for stall_ms meanwhile.
 */
static bool push_wait_room(struct kvi_http_stream *st)
{
    uint64_t seen = st->taken;
    struct timespec dl;
    if (st->stall_ms == 0) { /* no idle timeout: wait as long as it takes */
        while (!st->gone && st->queued >= KVI_HTTP_STREAM_HIGH_WATER)
            pthread_cond_wait(&st->cv, &st->mu);
        return true;
    }
    deadline_in(&dl, st->stall_ms);
    while (!st->gone && st->queued >= KVI_HTTP_STREAM_HIGH_WATER) {
        if (pthread_cond_timedwait(&st->cv, &st->mu, &dl) != ETIMEDOUT)
            continue;
        if (st->taken == seen)
            return st->gone || st->queued < KVI_HTTP_STREAM_HIGH_WATER;
        seen = st->taken; /* progress: a new period */
        deadline_in(&dl, st->stall_ms);
    }
    return true;
}

int kvi_http_stream_write(struct kvi_http_stream *st, const void *data, size_t len)
{
    bool wake;
    if (len == 0 || st->head)
        return 0;
    pthread_mutex_lock(&st->mu);
    if (!push_wait_room(st)) {
        /* Stalled: from now on the stream is gone for the writer; the loop cuts the connection. */
        st->stalled = st->gone = true;
        wake = !st->wake_pending;
        if (wake) {
            st->wake_pending = true;
            st->refs++;
        }
        pthread_mutex_unlock(&st->mu);
        if (wake)
            post(st->w, &st->wake);
        return -ETIMEDOUT;
    }
    if (st->gone) {
        pthread_mutex_unlock(&st->mu);
        return st->stalled ? -ETIMEDOUT : -EPIPE;
    }
    /* Coalesce into the tail chunk while it has room. */
    struct chunk *t = st->head_chunk == NULL ? NULL : H2O_STRUCT_FROM_MEMBER(struct chunk, next, st->tail);
    if (t != NULL && t->cap - t->len >= len) {
        memcpy(t->data + t->len, data, len);
        t->len += len;
    } else {
        size_t cap = len < PUSH_CHUNK_MIN ? PUSH_CHUNK_MIN : len;
        struct chunk *c = malloc(sizeof *c + cap);
        if (c == NULL) {
            pthread_mutex_unlock(&st->mu);
            return -ENOMEM;
        }
        c->next = NULL;
        c->len = len;
        c->cap = cap;
        memcpy(c->data, data, len);
        *st->tail = c;
        st->tail = &c->next;
    }
    st->queued += len;
    wake = push_need_wake_locked(st);
    pthread_mutex_unlock(&st->mu);
    if (wake)
        post(st->w, &st->wake);
    return 0;
}

void kvi_http_stream_end(struct kvi_http_stream *st, int error)
{
    struct worker *w = st->w;
    bool wake = false, last;
    atomic_fetch_sub_explicit(&w->srv->outstanding, 1, memory_order_relaxed);
    pthread_mutex_lock(&st->mu);
    st->ended = true;
    st->error = error;
    if (!st->gone)
        wake = push_need_wake_locked(st);
    last = --st->refs == 0;
    pthread_mutex_unlock(&st->mu);
    if (wake)
        post(w, &st->wake);
    stream_release(st, last);
}

/* ---- dispatch ---- */

static void on_sock_close(void *data);

static struct conn *conn_of(h2o_req_t *req)
{
    if (req->conn->callbacks->get_socket == NULL)
        return NULL;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    if (sock == NULL || sock->on_close.cb != on_sock_close)
        return NULL;
    return sock->on_close.data;
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    struct kvi_http_server *s = ((struct handler_ext *)self)->srv;
    struct worker *w = worker_of_ctx(req->conn->ctx);
    uint64_t t0 = kvi_now_ns();
    unsigned m = method_bit(req->method);
    const char *path = req->path_normalized.base;
    size_t plen = req->path_normalized.len;
    const struct route *seen = NULL;
    int ri = -1;

    for (int i = 0; i < s->nroutes; i++) {
        const struct route *rt = &s->routes[i];
        if (rt->path_len != plen || memcmp(rt->path, path, plen) != 0)
            continue;
        if (seen == NULL)
            seen = rt;
        if ((rt->methods & m) != 0 || (m == KVI_HTTP_HEAD && (rt->methods & KVI_HTTP_GET) != 0)) {
            ri = i;
            break;
        }
    }
    struct kvi_http_res *r = res_new(w, req, ri >= 0 ? ri : s->nroutes, t0);
    if (ri < 0) {
        if (seen != NULL) {
            kvi_http_add_header(r, "allow", seen->allow);
            send_error(r, 405, "method %.*s is not allowed on %.*s (allowed: %s)", (int)req->method.len,
                       req->method.base, (int)plen, path, seen->allow);
        } else {
            send_error(r, 404, "no route for %.*s", (int)plen, path);
        }
        return 0;
    }
    const struct route *rt = &s->routes[ri];
    struct kvi_http_str auth = header_of(req, H2O_TOKEN_AUTHORIZATION);
    if ((rt->flags & KVI_HTTP_ROUTE_ADMIN) != 0 && !bearer_matches(auth, s->opt.admin_token)) {
        kvi_http_add_header(r, "www-authenticate", "Bearer");
        send_error(r, 401, "%s needs the admin token (Authorization: Bearer ...)", rt->path);
        return 0;
    }
    if (req->entity.len > rt->body_limit) {
        send_error(r, 413, "request body of %zu bytes is over the %zu-byte limit of %s", req->entity.len,
                   rt->body_limit, rt->path);
        return 0;
    }

    struct kvi_http_req view = {
        .method = m,
        .method_name = {req->method.base, req->method.len},
        .path = {path, plen},
        .content_type = header_of(req, H2O_TOKEN_CONTENT_TYPE),
        .accept = header_of(req, H2O_TOKEN_ACCEPT),
        .authorization = auth,
        .body = req->entity.len != 0 ? (const uint8_t *)req->entity.base : NULL,
        .body_len = req->entity.len,
        .version = req->version,
        .tls = req->scheme == &H2O_URL_SCHEME_HTTPS,
        .thread = w->idx,
        .thread_ctx = w->thread_ctx,
        .route = ri,
        ._h2o = req,
    };
    if (req->query_at != SIZE_MAX && req->query_at < req->path.len) {
        view.query.p = req->path.base + req->query_at + 1;
        view.query.len = req->path.len - req->query_at - 1;
    }
    rt->fn(&view, r, rt->ud);
    if (r->state == R_NONE)
        send_error(r, 500, "the handler of %s did not answer", rt->path);
    return 0;
}

/* h2o's own error answers (fallback path) become JSON. */
struct errjson_ostream {
    h2o_ostream_t super;
    bool done;
};

static void errjson_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt, h2o_send_state_t state)
{
    struct errjson_ostream *o = (struct errjson_ostream *)self;
    if (o->done) {
        h2o_ostream_send_next(self, req, NULL, 0, state);
        return;
    }
    o->done = true;
    char text[256];
    size_t n = 0;
    for (size_t i = 0; i < bufcnt && n < sizeof text; i++) {
        size_t k = KVI_MIN(bufs[i].len, sizeof text - n);
        memcpy(text + n, bufs[i].base, k);
        n += k;
    }
    if (n == 0 && req->res.reason != NULL) {
        n = KVI_MIN(strlen(req->res.reason), sizeof text);
        memcpy(text, req->res.reason, n);
    }
    char *body = h2o_mem_alloc_pool(&req->pool, 6 * n + 16);
    h2o_iovec_t v = h2o_iovec_init(body, json_error_body(body, text, n));
    req->res.content_length = v.len;
    struct worker *w = worker_of_ctx(req->conn->ctx);
    bool head = req->method.len == 4 && memcmp(req->method.base, "HEAD", 4) == 0;
    count_answer(w, w->srv->nroutes, req->res.status, head ? 0 : v.len, 0);
    h2o_ostream_send_next(self, req, head ? NULL : &v, head ? 0 : 1, state);
}

static void errjson_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    if (req->res.status >= 400) {
        struct worker *w = worker_of_ctx(req->conn->ctx);
        kvi_relaxed_add(&w->ctr[w->srv->nroutes].requests, 1);
        h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, H2O_STRLIT("application/json"), 1);
        struct errjson_ostream *o = (struct errjson_ostream *)h2o_add_ostream(req, sizeof *o, slot);
        o->super.do_send = errjson_send;
        o->done = false;
        slot = &o->super.next;
    }
    h2o_setup_next_ostream(req, slot);
}

/* ---- connections and accepting ---- */

static void on_sock_close(void *data)
{
    struct conn *c = data;
    struct worker *w = c->w;
    while (!h2o_linklist_is_empty(&c->reqs)) {
        struct kvi_http_res *r = H2O_STRUCT_FROM_MEMBER(struct kvi_http_res, conn_link, c->reqs.next);
        h2o_linklist_unlink(&r->conn_link);
        r->conn = NULL;
    }
    h2o_linklist_unlink(&c->link);
    w->nconns--;
    atomic_fetch_sub_explicit(&w->srv->conns_open, 1, memory_order_relaxed);
    free(c);
    if (w->state == W_DRAINING && w->nconns == 0)
        w->state = W_DONE;
}

static void on_accept(h2o_socket_t *listener, const char *err);

static void accept_resume(h2o_timeout_entry_t *e)
{
    struct worker *w = H2O_STRUCT_FROM_MEMBER(struct worker, pause_entry, e);
    if (w->state == W_RUNNING && w->listener != NULL)
        h2o_socket_read_start(w->listener, on_accept);
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    struct worker *w = listener->data;
    struct kvi_http_server *s = w->srv;
    if (err != NULL || w->state != W_RUNNING)
        return;
    for (int i = 0; i < ACCEPT_BURST; i++) {
        int fd = accept4(w->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: stop polling the listener for a while instead of spinning. */
                h2o_socket_read_stop(w->listener);
                if (!h2o_timeout_is_linked(&w->pause_entry))
                    h2o_timeout_link(w->ctx.loop, &w->pause_timeout, &w->pause_entry);
            }
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;
        }
        if (atomic_fetch_add_explicit(&s->conns_open, 1, memory_order_relaxed) >= s->opt.max_connections) {
            atomic_fetch_sub_explicit(&s->conns_open, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->conns_rejected, 1, memory_order_relaxed);
            close(fd);
            continue;
        }
        atomic_fetch_add_explicit(&s->conns_accepted, 1, memory_order_relaxed);
        int on = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
        h2o_socket_t *sock = h2o_evloop_socket_create(w->ctx.loop, fd, H2O_SOCKET_FLAG_IS_ACCEPTED_CONNECTION);
        struct conn *c = kvi_xcalloc(1, sizeof *c);
        c->w = w;
        c->fd = fd;
        c->idle_since = h2o_now(w->ctx.loop);
        h2o_linklist_init_anchor(&c->reqs);
        h2o_linklist_insert(&w->conns, &c->link);
        w->nconns++;
        sock->on_close.cb = on_sock_close;
        sock->on_close.data = c;
        h2o_accept(&w->accept_ctx, sock);
    }
}

/* ---- idle reaper ---- */

/*
 * h2o closes an HTTP/1.1 connection whose request has not arrived whole
 * within idle_timeout_ms, and an idle HTTP/2 connection, but resets its
 * HTTP/2 idle timer on every frame: a stream trickling its body (or PINGs
 * alone) kept a connection and its slot forever. Every REAP_DIVISOR-th of
 * the timeout each loop shuts down the connections that have had no request
 * dispatched for twice the timeout (h2o's own, graceful close comes first
 * for every well-behaved idle connection).
 */
#define REAP_DIVISOR 4

static void on_reap(h2o_timeout_entry_t *e)
{
    struct worker *w = H2O_STRUCT_FROM_MEMBER(struct worker, reap_entry, e);
    uint64_t now = h2o_now(w->ctx.loop), limit = 2 * (uint64_t)w->srv->opt.idle_timeout_ms;
    for (h2o_linklist_t *n = w->conns.next; n != &w->conns; n = n->next) {
        struct conn *c = H2O_STRUCT_FROM_MEMBER(struct conn, link, n);
        if (!c->shut && c->inflight == 0 && now - c->idle_since >= limit) {
            shutdown(c->fd, SHUT_RDWR);
            c->shut = true;
        }
    }
    if (w->state == W_RUNNING)
        h2o_timeout_link(w->ctx.loop, &w->reap_timeout, &w->reap_entry);
}

/* ---- shutdown ---- */

static void abort_pending(struct worker *w)
{
    while (!h2o_linklist_is_empty(&w->deferred)) {
        struct kvi_http_deferred *d = H2O_STRUCT_FROM_MEMBER(struct kvi_http_deferred, link, w->deferred.next);
        struct kvi_http_res *r = d->res;
        h2o_linklist_unlink(&d->link);
        d->res = NULL;
        r->def = NULL;
        send_error(r, 503, "the server is shutting down");
    }
    while (!h2o_linklist_is_empty(&w->streams)) {
        struct kvi_http_stream *st = H2O_STRUCT_FROM_MEMBER(struct kvi_http_stream, link, w->streams.next);
        bool idle;
        h2o_linklist_unlink(&st->link);
        pthread_mutex_lock(&st->mu);
        st->gone = true;
        idle = st->loop_idle;
        st->loop_idle = false;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        if (idle) {
            push_finish(st, false);
            h2o_send(st->res->req, NULL, 0, H2O_SEND_STATE_ERROR);
        }
    }
}

static void sweep(struct worker *w)
{
    bool force = h2o_now(w->ctx.loop) >= w->deadline;
    if (force && !w->forced) {
        w->forced = true;
        atomic_store_explicit(&w->srv->forced, true, memory_order_relaxed);
        abort_pending(w);
    }
    for (h2o_linklist_t *n = w->conns.next; n != &w->conns; n = n->next) {
        struct conn *c = H2O_STRUCT_FROM_MEMBER(struct conn, link, n);
        if (!c->shut && (c->inflight == 0 || force)) {
            if (force && c->inflight != 0)
                atomic_store_explicit(&w->srv->forced, true, memory_order_relaxed);
            shutdown(c->fd, SHUT_RDWR);
            c->shut = true;
        }
    }
    if (w->nconns == 0)
        w->state = W_DONE;
    else if (!h2o_timeout_is_linked(&w->sweep_entry))
        h2o_timeout_link(w->ctx.loop, &w->sweep_timeout, &w->sweep_entry);
}

static void on_sweep(h2o_timeout_entry_t *e)
{
    sweep(H2O_STRUCT_FROM_MEMBER(struct worker, sweep_entry, e));
}

static void on_stop(struct worker *w, struct msg *m)
{
    if (tl_worker != w || w->state != W_RUNNING)
        return;
    w->state = W_DRAINING;
    if (w->listener != NULL) {
        h2o_socket_read_stop(w->listener);
        h2o_socket_close(w->listener);
        w->listener = NULL;
        w->listen_fd = -1;
        atomic_store_explicit(&w->listening, 0, memory_order_relaxed);
    }
    h2o_timeout_unlink(&w->pause_entry);
    h2o_timeout_unlink(&w->reap_entry);
    h2o_context_request_shutdown(&w->ctx);
    w->deadline = h2o_now(w->ctx.loop) + w->srv->opt.shutdown_grace_ms;
    sweep(w);
}

static void on_messages(h2o_multithread_receiver_t *recv, h2o_linklist_t *list)
{
    struct worker *w = H2O_STRUCT_FROM_MEMBER(struct worker, receiver, recv);
    while (!h2o_linklist_is_empty(list)) {
        struct msg *m = H2O_STRUCT_FROM_MEMBER(struct msg, super.link, list->next);
        h2o_linklist_unlink(&m->super.link);
        m->fn(w, m);
    }
}

/* ---- threads ---- */

static void worker_ctx_init(struct worker *w)
{
    struct kvi_http_server *s = w->srv;
    /* On the loop thread: h2o binds socket buffers to the creating thread's caches. */
    h2o_context_init(&w->ctx, h2o_evloop_create(), &s->cfg);
    w->accept_ctx.ctx = &w->ctx;
    w->accept_ctx.hosts = s->cfg.hosts;
    w->accept_ctx.ssl_ctx = s->ssl;
    h2o_multithread_register_receiver(w->ctx.queue, &w->receiver, on_messages);
    w->stop_msg.fn = on_stop;
    h2o_timeout_init(w->ctx.loop, &w->sweep_timeout, SWEEP_MS);
    h2o_timeout_init(w->ctx.loop, &w->pause_timeout, ACCEPT_PAUSE_MS);
    h2o_timeout_init(w->ctx.loop, &w->reap_timeout, KVI_MAX(s->opt.idle_timeout_ms / REAP_DIVISOR, 1u));
    w->sweep_entry.cb = on_sweep;
    w->pause_entry.cb = accept_resume;
    w->reap_entry.cb = on_reap;
    h2o_linklist_init_anchor(&w->conns);
    h2o_linklist_init_anchor(&w->deferred);
    h2o_linklist_init_anchor(&w->streams);
    w->listener = h2o_evloop_socket_create(w->ctx.loop, w->listen_fd, H2O_SOCKET_FLAG_DONT_READ);
    w->listener->data = w;
    h2o_socket_read_start(w->listener, on_accept);
    atomic_store_explicit(&w->listening, 1, memory_order_relaxed);
    w->state = W_RUNNING;
    if (s->opt.idle_timeout_ms != 0)
        h2o_timeout_link(w->ctx.loop, &w->reap_timeout, &w->reap_entry);
    pthread_mutex_lock(&w->mu);
    w->alive = true;
    pthread_mutex_unlock(&w->mu);
}

static void worker_ctx_dispose(struct worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->alive = false;
    pthread_mutex_unlock(&w->mu);
    /* Messages posted before the gate closed: their requests are gone, so this only frees. */
    while (!h2o_linklist_is_empty(&w->receiver._messages)) {
        struct msg *m = H2O_STRUCT_FROM_MEMBER(struct msg, super.link, w->receiver._messages.next);
        h2o_linklist_unlink(&m->super.link);
        m->fn(w, m);
    }
    h2o_multithread_unregister_receiver(w->ctx.queue, &w->receiver);
    if (w->listener != NULL) {
        h2o_socket_read_stop(w->listener);
        h2o_socket_close(w->listener);
        w->listener = NULL;
        w->listen_fd = -1;
    }
    atomic_store_explicit(&w->listening, 0, memory_order_relaxed);
    h2o_timeout_unlink(&w->sweep_entry);
    h2o_timeout_unlink(&w->pause_entry);
    h2o_timeout_unlink(&w->reap_entry);
    h2o_timeout_dispose(w->ctx.loop, &w->sweep_timeout);
    h2o_timeout_dispose(w->ctx.loop, &w->pause_timeout);
    h2o_timeout_dispose(w->ctx.loop, &w->reap_timeout);
    /* h2o's GOAWAY re-send timer may still be linked. */
    h2o_timeout_unlink(&w->ctx.http2._graceful_shutdown_timeout);
    h2o_loop_t *loop = w->ctx.loop;
    h2o_multithread_queue_t *queue = w->ctx.queue;
    h2o_context_dispose(&w->ctx);
    /* In the evloop build h2o_multithread_destroy_queue (called by
     * h2o_context_dispose) closes the queue but does not free it. */
    free(queue);
    h2o_evloop_destroy(loop);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kvi_http_server *s = w->srv;
    tl_worker = w;
    kvi_rcu_register_thread();
    worker_ctx_init(w);
    pthread_mutex_lock(&s->ready_mu);
    w->ready = true;
    pthread_cond_broadcast(&s->ready_cv);
    pthread_mutex_unlock(&s->ready_mu);
    if (s->opt.thread_init != NULL)
        w->thread_ctx = s->opt.thread_init(w->idx, s->opt.thread_ud);
    while (w->state != W_DONE)
        h2o_evloop_run(w->ctx.loop, INT32_MAX);
    if (s->opt.thread_fini != NULL)
        s->opt.thread_fini(w->idx, w->thread_ctx, s->opt.thread_ud);
    worker_ctx_dispose(w);
    kvi_rcu_unregister_thread();
    tl_worker = NULL;
    return NULL;
}

/* ---- server ---- */

void kvi_http_options_init(struct kvi_http_options *o)
{
    memset(o, 0, sizeof *o);
    o->host = "0.0.0.0";
    o->threads = 2;
    o->body_limit = 2u << 20;
    o->idle_timeout_ms = 60000;
    o->handshake_timeout_ms = 10000;
    o->max_connections = 16384;
    o->h2_max_streams = 100;
    o->shutdown_grace_ms = 1500;
    o->backlog = 4096;
}

static char *dup_opt(const char *p)
{
    if (p == NULL)
        return NULL;
    char *d = strdup(p);
    if (d == NULL)
        kvi_die("out of memory");
    return d;
}

/*
 * Raise the soft descriptor limit to the hard one (capped at NOFILE_CAP, but
 * at least @p want). Connections are not the only descriptors: every ZMQ
 * listener holds one or two, so sizing the limit by max_connections alone
 * made registrations fail with EMFILE once connections and listeners
 * together passed it. An epoll server gains nothing from a low soft limit.
 */
#define NOFILE_CAP ((rlim_t)1 << 20)

static void raise_nofile(unsigned want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t target = KVI_MAX(NOFILE_CAP, (rlim_t)want);
    if (rl.rlim_max != RLIM_INFINITY && target > rl.rlim_max)
        target = rl.rlim_max;
    if (rl.rlim_cur >= target)
        return;
    rl.rlim_cur = target;
    setrlimit(RLIMIT_NOFILE, &rl);
}

static int bind_one(const struct addrinfo *ai, uint16_t port, int backlog)
{
    struct sockaddr_storage ss;
    int on = 1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)&ss)->sin_port = htons(port);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0 ||
        bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

static int bind_all(struct kvi_http_server *s)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(s->opt.host, NULL, &hints, &ai);
    if (rc != 0 || ai == NULL)
        return -ENOENT;
    uint16_t port = s->opt.port;
    for (unsigned i = 0; i < s->nthreads; i++) {
        int fd = bind_one(ai, port, s->opt.backlog);
        if (fd < 0) {
            freeaddrinfo(ai);
            return fd;
        }
        s->workers[i].listen_fd = fd;
        if (i == 0) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
                freeaddrinfo(ai);
                return -errno;
            }
            port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
    }
    freeaddrinfo(ai);
    s->port = port;
    return 0;
}

static int tls_init(struct kvi_http_server *s)
{
    s->ssl = SSL_CTX_new(TLS_server_method());
    if (s->ssl == NULL)
        return -ENOMEM;
    SSL_CTX_set_min_proto_version(s->ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(s->ssl, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (SSL_CTX_use_certificate_chain_file(s->ssl, s->opt.tls_cert_file) != 1 ||
        SSL_CTX_use_PrivateKey_file(s->ssl, s->opt.tls_key_file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(s->ssl) != 1)
        return -EINVAL;
    h2o_ssl_register_alpn_protocols(s->ssl, h2o_alpn_protocols);
    return 0;
}

static void server_destroy(struct kvi_http_server *s)
{
    for (unsigned i = 0; s->workers != NULL && i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        if (w->listen_fd >= 0)
            close(w->listen_fd);
        pthread_mutex_destroy(&w->mu);
        free(w->ctr);
    }
    free(s->workers);
    for (int i = 0; i < s->nroutes; i++)
        free(s->routes[i].path);
    free(s->routes);
    if (s->hostconf != NULL)
        h2o_config_dispose(&s->cfg);
    if (s->ssl != NULL)
        SSL_CTX_free(s->ssl);
    free((char *)s->opt.host);
    free((char *)s->opt.tls_cert_file);
    free((char *)s->opt.tls_key_file);
    free((char *)s->opt.admin_token);
    pthread_mutex_destroy(&s->stop_mu);
    pthread_mutex_destroy(&s->ready_mu);
    pthread_cond_destroy(&s->ready_cv);
    free(s);
}

struct kvi_http_server *kvi_http_server_create(const struct kvi_http_options *o)
{
    struct kvi_http_options def;
    if (o == NULL) {
        kvi_http_options_init(&def);
        o = &def;
    }
    if (o->threads == 0 || o->threads > MAX_THREADS || o->max_connections == 0 || o->body_limit == 0 ||
        (o->tls_cert_file == NULL) != (o->tls_key_file == NULL)) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_http_server *s = kvi_xcalloc(1, sizeof *s);
    s->opt = *o;
    s->opt.host = dup_opt(o->host != NULL ? o->host : "0.0.0.0");
    s->opt.tls_cert_file = dup_opt(o->tls_cert_file);
    s->opt.tls_key_file = dup_opt(o->tls_key_file);
    s->opt.admin_token = o->admin_token != NULL && o->admin_token[0] != '\0' ? dup_opt(o->admin_token) : NULL;
    if (s->opt.backlog <= 0)
        s->opt.backlog = 4096;
    pthread_mutex_init(&s->stop_mu, NULL);
    pthread_mutex_init(&s->ready_mu, NULL);
    pthread_cond_init(&s->ready_cv, NULL);
    s->nthreads = o->threads;
    s->workers = kvi_xcalloc(s->nthreads, sizeof *s->workers);
    for (unsigned i = 0; i < s->nthreads; i++) {
        pthread_mutex_init(&s->workers[i].mu, NULL);
        s->workers[i].srv = s;
        s->workers[i].idx = i;
        s->workers[i].listen_fd = -1;
    }

    int rc = 0;
    if (s->opt.tls_cert_file != NULL)
        rc = tls_init(s);
    if (rc == 0) {
        raise_nofile(s->opt.max_connections + 64 + 8 * s->nthreads);
        rc = bind_all(s);
    }
    if (rc != 0) {
        server_destroy(s);
        errno = -rc;
        return NULL;
    }

    signal(SIGPIPE, SIG_IGN);
    h2o_config_init(&s->cfg);
    s->cfg.server_name = h2o_iovec_init(H2O_STRLIT("kvidx"));
    s->cfg.max_request_entity_size = s->opt.body_limit;
    s->cfg.handshake_timeout = s->opt.handshake_timeout_ms;
    s->cfg.http1.req_timeout = s->opt.idle_timeout_ms;
    s->cfg.http2.idle_timeout = s->opt.idle_timeout_ms;
    s->cfg.http2.graceful_shutdown_timeout = 0; /* our sweep closes stragglers */
    if (s->opt.h2_max_streams != 0)
        s->cfg.http2.max_concurrent_requests_per_connection = s->opt.h2_max_streams;
    s->hostconf = h2o_config_register_host(&s->cfg, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *pc = h2o_config_register_path(s->hostconf, "/", 0);
    struct handler_ext *h = (struct handler_ext *)h2o_create_handler(pc, sizeof *h);
    h->super.on_req = on_req;
    h->srv = s;
    h2o_filter_t *f = h2o_create_filter(&s->hostconf->fallback_path, sizeof *f);
    f->on_setup_ostream = errjson_setup;
    return s;
}

int kvi_http_server_route(struct kvi_http_server *s, unsigned methods, const char *path, kvi_http_handler_fn fn,
                          void *ud, const struct kvi_http_route_opts *opts)
{
    if (atomic_load(&s->started) || s->stopped)
        return -EBUSY;
    if (path == NULL || path[0] != '/' || fn == NULL || (methods & KVI_HTTP_ANY) == 0)
        return -EINVAL;
    if (s->nroutes == s->routes_cap) {
        s->routes_cap = s->routes_cap ? 2 * s->routes_cap : 16;
        s->routes = kvi_xrealloc(s->routes, (size_t)s->routes_cap * sizeof *s->routes);
    }
    struct route *rt = &s->routes[s->nroutes];
    memset(rt, 0, sizeof *rt);
    rt->path = dup_opt(path);
    rt->path_len = strlen(path);
    rt->methods = methods & KVI_HTTP_ANY;
    rt->fn = fn;
    rt->ud = ud;
    rt->body_limit = opts != NULL && opts->body_limit != 0 ? opts->body_limit : s->opt.body_limit;
    rt->flags = opts != NULL ? opts->flags : 0;
    return s->nroutes++;
}

/* Fill every route's Allow list and size h2o's body limit (before the loops start). */
static void routes_finish(struct kvi_http_server *s)
{
    size_t limit = s->opt.body_limit;
    for (int i = 0; i < s->nroutes; i++) {
        struct route *rt = &s->routes[i];
        unsigned all = 0;
        for (int j = 0; j < s->nroutes; j++)
            if (s->routes[j].path_len == rt->path_len && memcmp(s->routes[j].path, rt->path, rt->path_len) == 0)
                all |= s->routes[j].methods;
        if (all & KVI_HTTP_GET)
            all |= KVI_HTTP_HEAD;
        size_t n = 0;
        for (unsigned b = 0; b < KVI_ARRAY_LEN(method_names); b++) {
            if ((all & (1u << b)) == 0)
                continue;
            n += (size_t)snprintf(rt->allow + n, sizeof rt->allow - n, "%s%s", n ? ", " : "", method_names[b]);
        }
        if (limit < rt->body_limit)
            limit = rt->body_limit;
    }
    s->cfg.max_request_entity_size = limit;
}

int kvi_http_server_start(struct kvi_http_server *s)
{
    if (atomic_load(&s->started) || s->stopped)
        return -EBUSY;
    routes_finish(s);
    for (unsigned i = 0; i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        w->ctr = aligned_alloc(KVI_CACHE_LINE, (size_t)(s->nroutes + 1) * sizeof(struct ctr));
        if (w->ctr == NULL)
            kvi_die("out of memory");
        memset(w->ctr, 0, (size_t)(s->nroutes + 1) * sizeof(struct ctr));
    }
    atomic_store_explicit(&s->started, true, memory_order_release);
    for (unsigned i = 0; i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        int rc = pthread_create(&w->tid, NULL, worker_main, w);
        if (rc != 0) {
            kvi_http_server_stop(s);
            return -rc;
        }
        w->thread_started = true;
        /* Wait until the loop can take messages (a stop may follow at once). */
        pthread_mutex_lock(&s->ready_mu);
        while (!w->ready)
            pthread_cond_wait(&s->ready_cv, &s->ready_mu);
        pthread_mutex_unlock(&s->ready_mu);
    }
    return 0;
}

uint16_t kvi_http_server_port(const struct kvi_http_server *s)
{
    return s->port;
}

int kvi_http_server_stop(struct kvi_http_server *s)
{
    if (tl_worker != NULL && tl_worker->srv == s)
        return -EDEADLK;
    pthread_mutex_lock(&s->stop_mu);
    if (!s->stopped) {
        s->stopped = true;
        for (unsigned i = 0; i < s->nthreads; i++) {
            struct worker *w = &s->workers[i];
            if (w->thread_started)
                post(w, &w->stop_msg);
        }
        for (unsigned i = 0; i < s->nthreads; i++) {
            struct worker *w = &s->workers[i];
            if (w->thread_started) {
                pthread_join(w->tid, NULL);
                w->thread_started = false;
            }
            atomic_store_explicit(&w->listening, 0, memory_order_relaxed);
        }
        s->stop_result = atomic_load_explicit(&s->forced, memory_order_relaxed) ? 1 : 0;
    }
    int rc = s->stop_result;
    pthread_mutex_unlock(&s->stop_mu);
    return rc;
}

void kvi_http_server_free(struct kvi_http_server *s)
{
    if (s == NULL)
        return;
    if (atomic_load(&s->started))
        kvi_http_server_stop(s);
    int64_t left = atomic_load(&s->outstanding);
    if (left != 0)
        kvi_die("http: server freed with %lld deferred request(s) or stream(s) still open", (long long)left);
    server_destroy(s);
}

/* ---- counters ---- */

void kvi_http_server_stats(const struct kvi_http_server *s, struct kvi_http_stats *out)
{
    memset(out, 0, sizeof *out);
    out->conns_open = atomic_load_explicit(&s->conns_open, memory_order_relaxed);
    out->conns_accepted = atomic_load_explicit(&s->conns_accepted, memory_order_relaxed);
    out->conns_rejected = atomic_load_explicit(&s->conns_rejected, memory_order_relaxed);
    if (!atomic_load_explicit(&s->started, memory_order_acquire))
        return;
    for (unsigned i = 0; i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        for (int r = 0; r <= s->nroutes; r++)
            counters_add(&out->all, &w->ctr[r]);
        counters_add(&out->unmatched, &w->ctr[s->nroutes]);
        out->in_flight += atomic_load_explicit(&w->in_flight, memory_order_relaxed);
        out->listeners += atomic_load_explicit(&w->listening, memory_order_relaxed);
    }
}

int kvi_http_route_stats(const struct kvi_http_server *s, int route, struct kvi_http_counters *out)
{
    memset(out, 0, sizeof *out);
    if (route < 0 || route >= s->nroutes)
        return -ENOENT;
    if (!atomic_load_explicit(&s->started, memory_order_acquire))
        return 0;
    for (unsigned i = 0; i < s->nthreads; i++)
        counters_add(out, &s->workers[i].ctr[route]);
    return 0;
}

int kvi_http_route_count(const struct kvi_http_server *s)
{
    return s->nroutes;
}

const char *kvi_http_route_path(const struct kvi_http_server *s, int route, unsigned *methods)
{
    if (route < 0 || route >= s->nroutes)
        return NULL;
    if (methods != NULL)
        *methods = s->routes[route].methods;
    return s->routes[route].path;
}
