/*
 * kvidx HTTP server: HTTP/1.1, HTTP/2 cleartext (prior knowledge and
 * `Upgrade: h2c`) and HTTPS with ALPN h2/http1.1, on h2o 2.2.5 (libh2o-evloop).
 *
 * The daemon's route handlers (api/) register (method, exact path) routes with
 * a callback; this layer owns sockets, threads, protocol, body limits, error
 * bodies, cross-thread completion, streaming, shutdown and counters.
 *
 * Threads. `threads` event loops, one per thread, each with its own listening
 * socket bound with SO_REUSEPORT to the same address (the kernel spreads
 * connections). Each loop thread is a registered RCU reader (memb flavour,
 * engine/rcu.h), so handlers may run index queries inline inside their own
 * kvi_rcu_read_lock / kvi_rcu_read_unlock section. Handlers must not block
 * the loop: a handler that waits for another thread answers through
 * kvi_http_defer / kvi_http_complete.
 *
 * Errors. Every error this layer produces is JSON `{"error":"..."}` with
 * `Content-Type: application/json`: 400 bad input (below), 404 unknown
 * path, 405 wrong method (with `Allow`), 413 body over the limit, 401 admin
 * routes without the token, 500 a handler that did not answer, 503 a
 * deferred request still pending when shutdown's grace period ran out, and
 * h2o's own 400/413 for malformed or oversize HTTP/1.1 bodies. Handlers answer their own 400/415/422 with
 * kvi_http_error.
 *
 * Bad input (checked before routing; 400 `{"error":"..."}`, counted in
 * stats.rejected and stats.unmatched, logged at debug once per connection).
 * Over HTTP/1.x the connection is closed after the answer (`Connection:
 * close`): what follows the head cannot be trusted to start a request.
 *   - HTTP/1.x framing, from the raw head (h2o 2.2.5 drops these headers and
 *     would frame by chunked / the first Content-Length): Content-Length
 *     together with Transfer-Encoding; more than one Content-Length line
 *     (identical values too); more than one Transfer-Encoding line;
 *     Transfer-Encoding in HTTP/1.0; a folded header line (obs-fold). h2o
 *     has read the body by its own framing first (within the body limit
 *     and T); the request is never dispatched. Not checked for the request
 *     of an `Upgrade: h2c` (h2o has answered 101 and the connection is
 *     framed by HTTP/2 from then on).
 *   - The target, for every version: routing is on the path exactly as
 *     received (h2o's decoding of %XX and resolving of dot segments is not
 *     used), and a target that is not origin-form (absolute-form, `*`,
 *     authority-form), a path (before '?') with a '%', or a `.` or `..`
 *     segment is refused. The query is the handler's business. Empty
 *     segments (`//hello`) are not refused: they match no route (404).
 *   h2o answers what it cannot parse itself (400, connection closed).
 *
 * Timeouts (options.idle_timeout_ms, T). An HTTP/1.1 request must arrive
 * whole (headers and body) within T of its first byte, and a kept-alive
 * connection is closed after T without a request (h2o's req_timeout). An
 * HTTP/2 connection is closed after T without a frame (h2o's idle timeout,
 * with GOAWAY); h2o resets that timer on every frame, so this layer also
 * shuts down any connection that has had no request dispatched for 2 T (a
 * stream trickling its body, or PINGs alone, do not keep it). A pushed
 * stream whose client takes nothing for T is cut (kvi_http_stream_write).
 * Write deadline: a connection holding an answer (whole, pulled chunk or
 * pushed send) the client has taken nothing of for T is shut down (HTTP/2
 * DATA frames written count as progress; h2o 2.2 has no write timeout of
 * its own). Closes for T carry no answer.
 *
 * Limits (net/http_guard.c; each counted in kvi_http_stats and logged at
 * warn, at most one line a second per loop thread):
 *   - max_conns_per_addr: a connection from an address that already has
 *     that many open is accepted and closed at once (conns_rejected_addr);
 *   - h2_max_resets: RST_STREAM frames of one HTTP/2 connection spend a
 *     bucket of that many tokens refilled at that many per 10 s; with it
 *     empty the connection gets GOAWAY ENHANCE_YOUR_CALM and is closed
 *     (h2_reset_floods; only with h2o 2.2.5, whose connection head is
 *     known, see http_guard.c);
 *   - conn_output_limit: whole answers count their body plus 4 KiB from
 *     when they are handed to h2o until the client has taken them; a
 *     connection past the limit (with at least one answer before) is shut
 *     down (output_conn_closed);
 *   - output_limit: the same summed over connections, each loop thread
 *     holding output_limit / threads; an answer past its loop's share (with
 *     at least one answer held) is replaced by 503 JSON (output_refused);
 *   - a failed accept(2) for want of descriptors or memory pauses accepting
 *     for 100 ms (accept_failures).
 *
 * Body limits. h2o 2.2 buffers the whole request body before the handler
 * runs. h2o enforces the largest configured limit (global or any route's)
 * while reading: an HTTP/1.1 request whose Content-Length is over it gets 413
 * before its body is read; over HTTP/2 such a stream is reset
 * (REFUSED_STREAM), the only answer h2o 2.2 gives there. A route's smaller
 * limit is checked when the body is complete and answered with 413.
 *
 * Calls and threads:
 *
 *   | call                                   | thread                                  |
 *   |----------------------------------------|-----------------------------------------|
 *   | options_init, server_create            | control plane                           |
 *   | server_route                           | control plane, before server_start      |
 *   | server_start, server_stop, server_free | control plane (stop: any non-loop thread)|
 *   | server_port, server_stats, route_stats | any thread                              |
 *   | kvi_http_req_* , kvi_http_respond*,    | the loop thread running the handler,    |
 *   | kvi_http_error, defer, stream_pull,    | during the handler call                 |
 *   | stream_open, add_header, alloc         |                                         |
 *   | kvi_http_complete*, stream_write/_end  | any one thread per handle               |
 *
 * Shutdown (kvi_http_server_stop): every loop closes its listener, disables
 * keep-alive and sends HTTP/2 GOAWAY, closes idle connections at once, lets
 * dispatched requests finish (deferred and streamed ones included) for up to
 * `shutdown_grace_ms`, then answers still-pending deferred requests with 503,
 * aborts unfinished streams and closes what is left. The threads are joined
 * before stop returns (default grace 1.5 s: stop returns within 2 s).
 */
#ifndef KVI_NET_HTTP_SERVER_H
#define KVI_NET_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine/common.h"

struct kvi_http_server;
struct kvi_http_res;
struct kvi_http_deferred;
struct kvi_http_stream;

/** A byte string that is not NUL-terminated; {NULL, 0} when absent. */
struct kvi_http_str {
    const char *p;
    size_t len;
};

/** Request methods, as bits so a route can accept several. */
enum {
    KVI_HTTP_GET = 1u << 0,
    KVI_HTTP_HEAD = 1u << 1, /* also served by GET routes */
    KVI_HTTP_POST = 1u << 2,
    KVI_HTTP_PUT = 1u << 3,
    KVI_HTTP_DELETE = 1u << 4,
    KVI_HTTP_PATCH = 1u << 5,
    KVI_HTTP_OPTIONS = 1u << 6,
    KVI_HTTP_OTHER = 1u << 7, /* any other method token */
    KVI_HTTP_ANY = 0xffu,
};

/**
 * The request as a handler sees it. Every pointer is valid until the handler
 * returns (deferred and streamed handlers copy what they need first). Fields
 * starting with `_` are private.
 */
struct kvi_http_req {
    unsigned method;                   /* one KVI_HTTP_* bit */
    struct kvi_http_str method_name;   /* as sent, e.g. "POST" */
    struct kvi_http_str path;          /* path as received (see Bad input), without the query */
    struct kvi_http_str query;         /* after '?', without it; {NULL,0} if none */
    struct kvi_http_str content_type;  /* {NULL,0} when absent */
    struct kvi_http_str accept;        /* {NULL,0} when absent */
    struct kvi_http_str authorization; /* {NULL,0} when absent */
    const uint8_t *body;               /* whole request body; NULL when empty */
    size_t body_len;
    int version;                       /* 0x100, 0x101 (HTTP/1.x) or 0x200 (HTTP/2) */
    bool tls;                          /* arrived over HTTPS */
    unsigned thread;                   /* index of the loop thread, 0 .. threads-1 */
    void *thread_ctx;                  /* what options.thread_init returned for it */
    int route;                         /* route id (kvi_http_server_route's return) */
    void *_h2o;                        /* h2o_req_t */
};

/**
 * A route handler. Called on a loop thread. It must answer exactly once,
 * before returning (kvi_http_respond*, kvi_http_error) or by handing the
 * answer on (kvi_http_defer, kvi_http_stream_pull, kvi_http_stream_open). A
 * handler that does none of these gets a 500 JSON error sent for it.
 */
typedef void (*kvi_http_handler_fn)(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud);

/** Route flags. */
enum {
    /** Requires `Authorization: Bearer <options.admin_token>` when a token is set (else 401);
     * without one, a loopback client when options.admin_loopback_only is set (else 403). */
    KVI_HTTP_ROUTE_ADMIN = 1u << 0,
    /** Data-plane writes and whole-index reads: require `Authorization: Bearer
     * <options.data_token>` (or the admin token) when a data token is set (else 401). */
    KVI_HTTP_ROUTE_DATA = 1u << 1,
};

/** Per-route options (NULL: defaults). */
struct kvi_http_route_opts {
    size_t body_limit; /* bytes; 0 = the server's body_limit */
    unsigned flags;    /* KVI_HTTP_ROUTE_* */
};

/** Server options; fill with kvi_http_options_init, then override. */
struct kvi_http_options {
    const char *host;              /* bind address or name; default "0.0.0.0" */
    uint16_t port;                 /* 0 = ephemeral: see kvi_http_server_port */
    unsigned threads;              /* event-loop threads; default 2, max 64 */
    size_t body_limit;             /* request body limit, bytes; default 2 MiB */
    const char *tls_cert_file;     /* PEM chain; with tls_key_file enables HTTPS */
    const char *tls_key_file;      /* PEM private key */
    const char *admin_token;       /* checked for KVI_HTTP_ROUTE_ADMIN routes; NULL = open */
    /* Without an admin_token: KVI_HTTP_ROUTE_ADMIN routes answer 403 to clients
     * whose address is not loopback (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104),
     * the error ending with admin_hint (what opens them). Default false. */
    bool admin_loopback_only;
    const char *admin_hint;        /* e.g. "set --admin-token or --allow-remote-admin"; may be NULL */
    const char *data_token;        /* checked for KVI_HTTP_ROUTE_DATA routes; NULL = open */
    unsigned idle_timeout_ms;      /* default 60 000; see Timeouts above */
    unsigned handshake_timeout_ms; /* TLS handshake; default 10 000 */
    unsigned max_connections;      /* open connections over all threads; default 16 384 */
    unsigned max_conns_per_addr;   /* open connections from one client address; default 1 024, 0 = no limit */
    unsigned h2_max_streams;       /* concurrent requests per HTTP/2 connection; default 100 */
    unsigned h2_max_resets;        /* streams one HTTP/2 connection may reset early; default 1 000, 0 = no limit */
    size_t conn_output_limit;      /* unread answer bytes one connection may hold; default 16 MiB, 0 = no limit */
    size_t output_limit;           /* unread answer bytes over all connections; default 256 MiB, 0 = no limit */
    unsigned shutdown_grace_ms;    /* how long stop lets requests finish; default 1 500 */
    int backlog;                   /* listen(2) backlog per socket; default 4 096 */
    /* Per-thread hooks, both optional, run on each loop thread: init after it
     * registered with RCU and before it serves, fini after it stopped serving. */
    void *(*thread_init)(unsigned thread, void *ud);
    void (*thread_fini)(unsigned thread, void *thread_ctx, void *ud);
    void *thread_ud;
};

/** Fill @p o with the defaults above. */
void kvi_http_options_init(struct kvi_http_options *o);

/**
 * Free the server (control plane, after kvi_http_server_stop, or without
 * start). Every handle from kvi_http_defer must have been completed and every
 * kvi_http_stream ended before; an outstanding one is a fatal error.
 */
void kvi_http_server_free(struct kvi_http_server *s);

/**
 * Create a server: set up h2o, load the TLS certificate if configured, and
 * bind and listen on every thread's socket (so the port is known at once).
 * Process-wide effects: SIGPIPE is ignored (writes to closed sockets must
 * fail with EPIPE instead), and the soft RLIMIT_NOFILE is raised to the hard
 * limit (capped at 1,048,576, but never below max_connections + 64 + 8 per
 * thread when the hard limit allows): the process's other descriptors (a
 * ZMQ socket per registered listener, peers, files) must not be limited by
 * what HTTP connections need. Connections wait in the backlog until
 * kvi_http_server_start.
 * @return the server, or NULL with errno set: EINVAL (bad options, TLS
 *         certificate or key unusable), EADDRINUSE / EACCES / other socket
 *         errors from bind or listen, ENOENT (host does not resolve).
 */
KVI_DEALLOC(kvi_http_server_free, 1) KVI_WARN_UNUSED
struct kvi_http_server *kvi_http_server_create(const struct kvi_http_options *o);

/**
 * Register a route: requests whose path equals @p path exactly and whose
 * method is in @p methods go to @p fn with @p ud (control plane, before
 * kvi_http_server_start). Several routes may share a path with different
 * methods; the first registered match wins.
 * @param methods  KVI_HTTP_* bits, or KVI_HTTP_ANY
 * @param path     exact path starting with '/'; copied
 * @param opts     NULL for defaults
 * @return the route id (>= 0, dense from 0 in registration order), -EINVAL
 *         (bad path, no methods, NULL fn), -EBUSY (server already started).
 */
int kvi_http_server_route(struct kvi_http_server *s, unsigned methods, const char *path, kvi_http_handler_fn fn,
                          void *ud, const struct kvi_http_route_opts *opts);

/**
 * Start the loop threads (control plane, once).
 * @return 0, -EBUSY (already started or stopped), or -errno from
 *         pthread_create (threads already running are stopped again).
 */
int kvi_http_server_start(struct kvi_http_server *s);

/** The bound TCP port (any thread; valid from create on). */
uint16_t kvi_http_server_port(const struct kvi_http_server *s);

/**
 * Stop gracefully and join the loop threads (see Shutdown above). Blocking;
 * callable from any thread that is not a loop thread, e.g. one waiting in
 * sigwait(); not from a signal handler. Idempotent: later calls wait for the
 * first to finish.
 * @return 0 when every connection finished within the grace period, 1 when
 *         some had to be cut, -EDEADLK when called from a loop thread.
 */
int kvi_http_server_stop(struct kvi_http_server *s);

/* ---- request helpers (loop thread, during the handler) ---- */

/**
 * Look up a request header by name (case-insensitive).
 * @return its first value, or {NULL, 0} when absent.
 */
struct kvi_http_str kvi_http_req_header(const struct kvi_http_req *req, const char *name);

/**
 * Whether the request carries `Authorization: Bearer <token>` (constant-time
 * compare). Any request passes when @p token is NULL or empty.
 */
bool kvi_http_req_bearer_ok(const struct kvi_http_req *req, const char *token);

/* ---- answering (loop thread, during the handler, exactly once) ---- */

/**
 * Add a response header (copied). Call before answering or deferring.
 * @return 0, -EINVAL (empty name).
 */
int kvi_http_add_header(struct kvi_http_res *res, const char *name, const char *value);

/**
 * Allocate @p n bytes in the request's pool, freed with the request. Use it
 * to build a body for kvi_http_respond_nocopy. Aborts on out-of-memory.
 */
void *kvi_http_alloc(struct kvi_http_res *res, size_t n);

/** Answer with @p body copied into the request's pool. @p ctype may be NULL (no Content-Type). */
void kvi_http_respond(struct kvi_http_res *res, int status, const char *ctype, const void *body, size_t len);

/** Answer without copying: @p body is pool memory (kvi_http_alloc) or static. */
void kvi_http_respond_nocopy(struct kvi_http_res *res, int status, const char *ctype, const void *body, size_t len);

/** Answer with a malloc'd @p body; ownership passes here and it is free()d with the request. */
void kvi_http_respond_owned(struct kvi_http_res *res, int status, const char *ctype, void *body, size_t len);

/**
 * Answer `{"error":"<formatted text>"}` (JSON-escaped, application/json)
 * with @p status. The text is cut at 1,000 bytes.
 */
void kvi_http_error(struct kvi_http_res *res, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- answering later, from any thread ---- */

/**
 * Take the answer out of the handler: the handler returns without
 * responding, and some thread later calls kvi_http_complete or
 * kvi_http_complete_error on the handle, exactly once. Safe when the client
 * disconnected meanwhile (the answer is dropped). Headers added with
 * kvi_http_add_header before deferring are kept.
 * @return the handle; owned by the caller until completed.
 */
struct kvi_http_deferred *kvi_http_defer(struct kvi_http_res *res);

/**
 * Complete a deferred request (any thread; @p body and @p ctype are copied;
 * the handle is invalid afterwards). The loop thread sends the answer.
 */
void kvi_http_complete(struct kvi_http_deferred *d, int status, const char *ctype, const void *body, size_t len);

/** Complete a deferred request with `{"error":"..."}` (as kvi_http_error). */
void kvi_http_complete_error(struct kvi_http_deferred *d, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- streamed answers (large bodies such as /dump) ---- */

/**
 * A body produced on the loop thread, pulled as the client drains: pull() is
 * called whenever the previous chunk has been handed to the socket.
 * pull(ud, buf, cap) writes up to @p cap bytes and returns how many (> 0),
 * 0 at the end of the body, or < 0 to abort the response (the client sees a
 * truncated body / reset stream). release(ud, outcome) is called exactly
 * once afterwards: outcome 0 when the body was completed, -EPIPE when the
 * client went away (or shutdown cut it), the negative pull() value otherwise.
 * pull must not block; long work belongs in a thread with kvi_http_stream_open.
 */
struct kvi_http_producer {
    ssize_t (*pull)(void *ud, void *buf, size_t cap);
    void (*release)(void *ud, int outcome); /* may be NULL */
    void *ud;
};

/** Bytes offered to kvi_http_producer.pull per call. */
#define KVI_HTTP_PULL_CHUNK (64u * 1024u)

/** Answer with a pulled body (loop thread, during the handler); *p is copied. */
void kvi_http_stream_pull(struct kvi_http_res *res, int status, const char *ctype, const struct kvi_http_producer *p);

/** Bytes a kvi_http_stream buffers before kvi_http_stream_write blocks. */
#define KVI_HTTP_STREAM_HIGH_WATER (1024u * 1024u)

/**
 * Answer with a body that another thread feeds (loop thread, during the
 * handler). Status and Content-Type go out with the first bytes.
 * @return the handle; one thread writes to it and must end it with
 *         kvi_http_stream_end.
 */
struct kvi_http_stream *kvi_http_stream_open(struct kvi_http_res *res, int status, const char *ctype);

/**
 * Append @p len bytes (copied) to the body (the handle's one writer thread,
 * never a loop thread of this server). Blocks while more than
 * KVI_HTTP_STREAM_HIGH_WATER bytes wait to be sent, but not longer than
 * options.idle_timeout_ms without the client taking a byte: then the
 * connection is shut down (h2o 2.2 has no write timeout of its own) and the
 * call fails, so a client that stops reading holds the writing thread for
 * at most that long.
 * @return 0; -EPIPE when the client went away or shutdown cut the response;
 *         -ETIMEDOUT when the client took nothing for idle_timeout_ms (the
 *         connection is being closed); -ENOMEM. On an error stop writing and
 *         end the stream.
 */
int kvi_http_stream_write(struct kvi_http_stream *s, const void *data, size_t len);

/**
 * Finish the body (the handle is invalid afterwards). Never blocks: may also
 * be called on the loop thread, e.g. by a handler whose hand-off failed.
 * @param error  0: the body is complete; nonzero: abort it (truncated
 *               body / reset stream)
 */
void kvi_http_stream_end(struct kvi_http_stream *s, int error);

/* ---- counters, for /metrics (any thread; approximate while running) ---- */

/** Latency buckets: bucket i counts answers taking <= 100 us * 2^i; one more bucket counts the rest. */
#define KVI_HTTP_LATENCY_BUCKETS 20

/** Counters of one route (or of all requests). */
struct kvi_http_counters {
    uint64_t requests;     /* dispatched (or answered by h2o itself) */
    uint64_t status[6];    /* answers by status class: [1]..[5] = 1xx..5xx; [0] unused */
    uint64_t aborted;      /* dispatched, client gone before an answer was sent */
    uint64_t bytes_in;     /* request body bytes */
    uint64_t bytes_out;    /* response body bytes handed to the protocol layer */
    uint64_t latency_ns_sum; /* dispatch to final answer, over answered requests */
    uint64_t latency_buckets[KVI_HTTP_LATENCY_BUCKETS + 1]; /* not cumulative */
};

/** Server-wide figures. */
struct kvi_http_stats {
    struct kvi_http_counters all;
    struct kvi_http_counters unmatched; /* no route (404) and h2o's own errors */
    uint64_t conns_open;
    uint64_t conns_accepted;
    uint64_t conns_rejected; /* over max_connections */
    uint64_t in_flight;      /* dispatched requests not yet finished */
    uint64_t rejected;       /* 400s for ambiguous framing or a refused target (see Bad input); also in unmatched */
    unsigned listeners;      /* listening sockets still open */
    /* Abuse limits (see Limits above). */
    uint64_t conns_rejected_addr; /* over max_conns_per_addr */
    uint64_t accept_failures;     /* accept(2) failed for want of descriptors or memory */
    uint64_t h2_resets;           /* HTTP/2 streams the client reset before their answer was done */
    uint64_t h2_reset_floods;     /* connections closed with GOAWAY ENHANCE_YOUR_CALM past h2_max_resets */
    uint64_t output_buffered;     /* unread answer bytes held now (gauge, with the per-answer overhead) */
    uint64_t output_conn_closed;  /* connections closed past conn_output_limit */
    uint64_t output_refused;      /* answers replaced by 503 past output_limit */
    uint64_t write_timeouts;      /* connections closed: an answer not taken for idle_timeout_ms */
};

/** Sum the server-wide figures over every thread. */
void kvi_http_server_stats(const struct kvi_http_server *s, struct kvi_http_stats *out);

/**
 * Sum one route's counters over every thread.
 * @return 0, -ENOENT (no such route).
 */
int kvi_http_route_stats(const struct kvi_http_server *s, int route, struct kvi_http_counters *out);

/** Number of registered routes (route ids are 0 .. n-1). */
int kvi_http_route_count(const struct kvi_http_server *s);

/** A route's path and methods; NULL for an unknown id. */
const char *kvi_http_route_path(const struct kvi_http_server *s, int route, unsigned *methods);

/** Upper bound of latency bucket @p i in nanoseconds (100 us * 2^i). */
static inline uint64_t kvi_http_latency_bound_ns(unsigned i);

/* inline defs */

inline uint64_t kvi_http_latency_bound_ns(unsigned i)
{
    return 100000ull << i;
}

#endif
