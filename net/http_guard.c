/*
 * kvidx HTTP server (net/http_server.h): the abuse limits, what keeps one
 * client from taking the server's connections, threads or memory ("Limits"
 * in net/http_server.h lists them with their defaults). The server and its
 * loops are in net/http_server.c, dispatch and whole answers in
 * net/http_request.c, streamed answers in net/http_stream.c.
 *
 * DESIGN
 *
 * Threads. Everything here runs on the loop threads, inside h2o callbacks;
 * each loop's counters are single-writer relaxed atomics summed by
 * kvi_http_server_stats. Two things are shared between the loops:
 *
 *   - the per-address connection table, one open-addressing table under one
 *     mutex, taken once when a connection is accepted and once when it
 *     closes (never on the request path, never across I/O);
 *   - nothing else: the server-wide output budget is split into one share
 *     per loop (output_limit / threads), so an answer is charged to its own
 *     loop's share with no shared cache line on the request path.
 *
 * Output budgets. A whole answer is charged when it is handed to h2o (its
 * body bytes plus ANSWER_OVERHEAD for the request's own memory: its pool,
 * headers and stream) and released when h2o disposes of the request, i.e.
 * once the client has taken all of it or the connection is gone. What a
 * zero-window HTTP/2 client or a client that never reads its socket holds
 * is therefore bounded per connection (conn_output_limit: the connection is
 * shut down) and per loop (answers past the share become a small 503).
 * Streamed answers hand h2o one chunk at a time (their producers wait for
 * h2o's proceed call) and are not charged.
 *
 * Write deadline. h2o 2.2 has none, and its HTTP/2 idle timer is off while
 * a stream is open, so a client that stops taking an answer kept the
 * connection and everything on it forever. A request whose data h2o holds
 * records since when (wait_since); HTTP/2 progress (req->bytes_sent grows as
 * DATA frames are written) moves it on. The reaper (net/http_server.c)
 * shuts down a connection with such a request older than idle_timeout_ms.
 *
 * Early resets (CVE-2023-44487, "rapid reset"). h2o 2.2.5 runs a request's
 * handler as soon as its HEADERS frame is parsed, so a client alternating
 * HEADERS and RST_STREAM makes the server work for answers nobody reads,
 * at the cost of a few bytes each. Once a connection has sent its first
 * request, its frame reader (h2o_http2_conn_t::_read_expect, declared in
 * h2o/http2_internal.h) is wrapped: a whole RST_STREAM frame for a stream
 * still open spends one token of a per-connection bucket (h2_max_resets
 * tokens, refilled at h2_max_resets per 10 s). With the bucket empty the
 * reader returns ENHANCE_YOUR_CALM, and h2o's own error path sends GOAWAY
 * with that code and closes the connection: no further frame of it is
 * parsed, so no further handler runs for it.
 */
#include "net/http_server_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <h2o.h>
#include <h2o/http2.h>
#include <h2o/http2_scheduler.h>

#include "engine/common.h"
#include "engine/hash.h"
#include "net/log.h"

#define ANSWER_OVERHEAD 4096u /* charged per whole answer beside its body */
#define WARN_EVERY_MS 1000u   /* one warning line per loop and second at most */
#define RESET_REFILL_MS 10000 /* the reset bucket refills whole in this time */

/* ---- warnings, rate-limited per loop ---- */

/* Whether a warning may be printed now; if not, it is counted as skipped. */
static bool warn_due(struct worker *w, unsigned *skipped)
{
    uint64_t now = h2o_now(w->ctx.loop);
    if (now < w->log_after) {
        w->log_skipped++;
        return false;
    }
    w->log_after = now + WARN_EVERY_MS;
    *skipped = w->log_skipped;
    w->log_skipped = 0;
    return true;
}

static void addr_text(const uint8_t a[16], char *out, size_t cap)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a, v4mapped, 12) == 0)
        inet_ntop(AF_INET, a + 12, out, (socklen_t)cap);
    else
        inet_ntop(AF_INET6, a, out, (socklen_t)cap);
}

/* One warning about the client at @p addr: "http: <what> <address>: <fmt...>", rate-limited. */
static void warn_peer(struct worker *w, const uint8_t addr[16], const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void warn_peer(struct worker *w, const uint8_t addr[16], const char *what, const char *fmt, ...)
{
    unsigned skipped;
    if (!warn_due(w, &skipped))
        return;
    char text[INET6_ADDRSTRLEN], why[256];
    addr_text(addr, text, sizeof text);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    kvi_log_warn("http: %s %s: %s (%u other warnings left out)", what, text, why, skipped);
}

/* ---- connections per client address ---- */

struct addr_ent {
    uint8_t a[16];
    uint32_t n; /* open connections; 0: free slot */
};

struct kvi_http_addrs {
    pthread_mutex_t mu;
    size_t mask; /* capacity - 1, a power of two at least twice max_connections */
    struct addr_ent *e;
};

void kvi_http__guard_init(struct kvi_http_server *s)
{
    if (s->opt.max_conns_per_addr == 0)
        return;
    size_t cap = 64;
    while (cap < 2 * (size_t)s->opt.max_connections)
        cap <<= 1;
    struct kvi_http_addrs *t = kvi_xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    t->mask = cap - 1;
    t->e = kvi_xcalloc(cap, sizeof *t->e);
    s->addrs = t;
}

void kvi_http__guard_fini(struct kvi_http_server *s)
{
    struct kvi_http_addrs *t = s->addrs;
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t->e);
    free(t);
    s->addrs = NULL;
}

static size_t addr_home(const struct kvi_http_addrs *t, const uint8_t a[16])
{
    uint64_t hi, lo;
    memcpy(&hi, a, 8);
    memcpy(&lo, a + 8, 8);
    return (size_t)kvi_fmix64(kvi_fmix64(hi) ^ lo) & t->mask;
}

/* The slot holding @p a, or the free slot where it would go (caller holds mu). */
static size_t addr_find(const struct kvi_http_addrs *t, const uint8_t a[16])
{
    size_t i = addr_home(t, a);
    while (t->e[i].n != 0 && memcmp(t->e[i].a, a, 16) != 0)
        i = (i + 1) & t->mask;
    return i;
}

/* Empty slot @p i and move later entries of its probe run back (no tombstones; caller holds mu). */
static void addr_remove_at(struct kvi_http_addrs *t, size_t i)
{
    size_t j = i;
    for (;;) {
        t->e[i].n = 0;
        for (;;) {
            j = (j + 1) & t->mask;
            if (t->e[j].n == 0)
                return;
            size_t home = addr_home(t, t->e[j].a);
            /* Movable to i when its home is not cyclically within (i, j]. */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j))
                break;
        }
        t->e[i] = t->e[j];
        i = j;
    }
}

static void addr_key(const struct sockaddr *sa, socklen_t len, uint8_t out[16])
{
    memset(out, 0, 16);
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
}

bool kvi_http__addr_acquire(struct worker *w, struct conn *c, const struct sockaddr *sa, socklen_t len)
{
    struct kvi_http_server *s = w->srv;
    struct kvi_http_addrs *t = s->addrs;
    addr_key(sa, len, c->addr);
    if (t == NULL)
        return true;
    uint32_t had;
    pthread_mutex_lock(&t->mu);
    size_t i = addr_find(t, c->addr);
    had = t->e[i].n;
    if (had < s->opt.max_conns_per_addr) {
        memcpy(t->e[i].a, c->addr, 16);
        t->e[i].n = had + 1;
    }
    pthread_mutex_unlock(&t->mu);
    if (had < s->opt.max_conns_per_addr) {
        c->addr_held = true;
        return true;
    }
    atomic_fetch_add_explicit(&s->conns_rejected_addr, 1, memory_order_relaxed);
    warn_peer(w, c->addr, "refused a connection from", "it has %u open, the --max-conns-per-addr limit", had);
    return false;
}

void kvi_http__addr_release(struct worker *w, struct conn *c)
{
    struct kvi_http_addrs *t = w->srv->addrs;
    if (!c->addr_held || t == NULL)
        return;
    c->addr_held = false;
    pthread_mutex_lock(&t->mu);
    size_t i = addr_find(t, c->addr);
    if (t->e[i].n == 0)
        kvi_die("http: per-address table lost a connection");
    if (--t->e[i].n == 0)
        addr_remove_at(t, i);
    pthread_mutex_unlock(&t->mu);
}

void kvi_http__accept_failed(struct worker *w, int err)
{
    kvi_relaxed_add(&w->accept_failures, 1);
    unsigned skipped;
    if (warn_due(w, &skipped))
        kvi_log_warn("http: accept failed: %s (%llu so far on this thread; %u other warnings left out); "
                     "accepting again in 100 ms",
                     strerror(err), (unsigned long long)atomic_load_explicit(&w->accept_failures, memory_order_relaxed),
                     skipped);
}

/* ---- output budgets and the write deadline ---- */

int kvi_http__out_charge(struct kvi_http_res *r, size_t len, bool force)
{
    struct worker *w = r->w;
    struct kvi_http_server *s = w->srv;
    struct conn *c = r->conn;
    size_t cost = len + ANSWER_OVERHEAD;
    uint64_t held = atomic_load_explicit(&w->out_buffered, memory_order_relaxed);
    if (!force && w->out_limit != 0 && held != 0 && held + cost > w->out_limit) {
        kvi_relaxed_add(&w->out_refused, 1);
        unsigned skipped;
        if (warn_due(w, &skipped))
            kvi_log_warn("http: answered 503: unread answers hold %llu bytes on this thread, over its share of "
                         "--http-output-limit (%zu) (%u other warnings left out)",
                         (unsigned long long)held, w->out_limit, skipped);
        return 1;
    }
    r->out += cost;
    atomic_store_explicit(&w->out_buffered, held + cost, memory_order_relaxed);
    if (c == NULL)
        return 0;
    size_t before = c->out;
    c->out += cost;
    if (s->opt.conn_output_limit == 0 || before == 0 || c->out <= s->opt.conn_output_limit || c->shut)
        return 0;
    shutdown(c->fd, SHUT_RDWR);
    c->shut = true;
    kvi_relaxed_add(&w->out_conn_closed, 1);
    warn_peer(w, c->addr, "closed a connection from",
              "its unread answers reached %zu bytes, over --http-conn-output-limit (%zu)", c->out,
              s->opt.conn_output_limit);
    return 2;
}

void kvi_http__out_release(struct kvi_http_res *r)
{
    if (r->out == 0)
        return;
    struct worker *w = r->w;
    atomic_store_explicit(&w->out_buffered, atomic_load_explicit(&w->out_buffered, memory_order_relaxed) - r->out,
                          memory_order_relaxed);
    if (r->conn != NULL)
        r->conn->out -= r->out;
    r->out = 0;
}

void kvi_http__out_waiting(struct kvi_http_res *r)
{
    uint64_t now = h2o_now(r->w->ctx.loop);
    r->wait_since = now != 0 ? now : 1;
    r->sent_seen = r->req != NULL ? r->req->bytes_sent : 0;
}

bool kvi_http__conn_stalled(struct worker *w, struct conn *c, uint64_t now, uint64_t limit_ms)
{
    for (h2o_linklist_t *n = c->reqs.next; n != &c->reqs; n = n->next) {
        struct kvi_http_res *r = H2O_STRUCT_FROM_MEMBER(struct kvi_http_res, conn_link, n);
        if (r->wait_since == 0 || r->req == NULL)
            continue;
        if (r->req->bytes_sent != r->sent_seen) { /* HTTP/2 DATA went out: progress */
            r->sent_seen = r->req->bytes_sent;
            r->wait_since = now;
            continue;
        }
        if (now - r->wait_since < limit_ms)
            continue;
        kvi_relaxed_add(&w->write_timeouts, 1);
        warn_peer(w, c->addr, "closed a connection from", "it took nothing of an answer for %llu ms (--idle-timeout-ms)",
                  (unsigned long long)(now - r->wait_since));
        return true;
    }
    return false;
}

/* ---- HTTP/2 early resets ---- */

/*
 * The leading members of h2o's HTTP/2 connection (struct st_h2o_http2_conn_t
 * in h2o/http2_internal.h), up to the frame reader. Debian 12's
 * libh2o-evloop-dev installs that header but not the khash.h it includes, so
 * it cannot be compiled against; this copy is pinned to h2o 2.2.5 below, and
 * kvi_http__h2_guard checks it against the live connection (its socket and
 * state) before it touches the reader.
 */
#if H2O_VERSION_MAJOR == 2 && H2O_VERSION_MINOR == 2 && H2O_VERSION_PATCH == 5
#define KVI_H2_GUARD 1
typedef ssize_t (*h2_reader_fn)(void *h2conn, const uint8_t *src, size_t len, const char **err_desc);
struct h2_conn_head {
    h2o_conn_t super;
    h2o_socket_t *sock;
    h2o_http2_settings_t peer_settings;
    void *streams; /* khash_t(h2o_http2_stream_t) * */
    struct {
        uint32_t max_open;
        uint32_t max_processed;
    } pull_stream_ids;
    struct {
        uint32_t max_open;
    } push_stream_ids;
    struct {
        struct {
            uint32_t open, half_closed, send_body;
        } priority, pull, push;
    } num_streams;
    h2o_http2_scheduler_node_t scheduler;
    int state; /* h2o_http2_conn_state_t; 0: OPEN */
    h2o_linklist_t _conns;
    h2_reader_fn _read_expect;
};
#define H2_FRAME_RST_STREAM 3
#endif

#ifdef KVI_H2_GUARD
static struct conn *conn_of_h2(struct h2_conn_head *h2)
{
    return h2->sock != NULL ? kvi_http__conn_of_sock(h2->sock) : NULL;
}

/* Take one token of @p c's reset bucket. @return false when it is empty. */
static bool reset_take(struct worker *w, struct conn *c)
{
    double burst = (double)w->srv->opt.h2_max_resets;
    uint64_t now = h2o_now(w->ctx.loop);
    if (now > c->reset_at) {
        c->reset_tokens += burst * (double)(now - c->reset_at) / RESET_REFILL_MS;
        if (c->reset_tokens > burst)
            c->reset_tokens = burst;
        c->reset_at = now;
    }
    if (c->reset_tokens < 1.0)
        return false;
    c->reset_tokens -= 1.0;
    return true;
}

/* The frame reader in front of h2o's: h2o calls it with its input buffer, a frame at its start. */
static ssize_t h2_read_guard(void *h2conn, const uint8_t *src, size_t len, const char **err_desc)
{
    struct h2_conn_head *h2 = h2conn;
    struct conn *c = conn_of_h2(h2);
    if (c == NULL || c->h2_next == NULL)
        kvi_die("http: HTTP/2 frame reader of an unknown connection");
    struct worker *w = c->w;
    if (len >= 9 && src[3] == H2_FRAME_RST_STREAM) {
        size_t flen = ((size_t)src[0] << 16) | ((size_t)src[1] << 8) | src[2];
        uint32_t id = (((uint32_t)src[5] & 0x7f) << 24) | ((uint32_t)src[6] << 16) | ((uint32_t)src[7] << 8) | src[8];
        /* Whole frames only (an incomplete one comes back with more bytes); a
         * malformed one is h2o's to refuse. */
        if (len >= 9 + flen && flen == 4 && id != 0) {
            kvi_relaxed_add(&w->h2_resets, 1);
            if (!reset_take(w, c)) {
                kvi_relaxed_add(&w->h2_floods, 1);
                warn_peer(w, c->addr, "GOAWAY (ENHANCE_YOUR_CALM) to",
                          "it reset streams faster than --h2-max-resets (%u per 10 s) allows",
                          w->srv->opt.h2_max_resets);
                *err_desc = "too many streams reset before their answer";
                return H2O_HTTP2_ERROR_ENHANCE_YOUR_CALM;
            }
        }
    }
    ssize_t ret = c->h2_next(h2, src, len, err_desc);
    /* h2o switches readers (preface, CONTINUATION); keep ours in front of the current one. */
    if (h2->_read_expect != h2_read_guard) {
        c->h2_next = h2->_read_expect;
        h2->_read_expect = h2_read_guard;
    }
    return ret;
}

void kvi_http__h2_guard(struct kvi_http_server *s, struct conn *c, h2o_req_t *req)
{
    if (s->opt.h2_max_resets == 0 || c == NULL || c->h2_next != NULL || req->version < 0x200)
        return;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    struct h2_conn_head *h2 = (struct h2_conn_head *)req->conn;
    /* An HTTP/2 connection of h2o's is its socket's data; the copy of its head
     * must agree: same socket, state OPEN, a reader. */
    if (sock == NULL || sock->data != (void *)req->conn)
        return; /* not an HTTP/2 connection of h2o's */
    if (h2->sock != sock || h2->state < 0 || h2->state > 2 || h2->_read_expect == NULL ||
        h2->_read_expect == h2_read_guard) {
        static atomic_bool said;
        if (!atomic_exchange_explicit(&said, true, memory_order_relaxed))
            kvi_log_error("http: h2o's HTTP/2 connection does not have the layout of h2o 2.2.5: "
                          "--h2-max-resets is not enforced");
        return;
    }
    c->reset_tokens = (double)s->opt.h2_max_resets;
    c->reset_at = h2o_now(c->w->ctx.loop);
    c->h2_next = h2->_read_expect;
    h2->_read_expect = h2_read_guard;
}
#else
void kvi_http__h2_guard(struct kvi_http_server *s, struct conn *c, h2o_req_t *req)
{
    (void)s, (void)c, (void)req; /* not h2o 2.2.5: see Limits in net/http_server.h */
}
#endif
