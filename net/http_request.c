/*
 * kvidx HTTP server (net/http_server.h): requests. This file holds the
 * dispatch of every request to its route, whole answers (bodies, JSON
 * errors, h2o's own errors rewritten to JSON), the request helpers, the
 * per-request state, deferred answers and the per-route counting. The
 * server and its loops are in net/http_server.c (DESIGN there), streamed
 * answers in net/http_stream.c.
 *
 * DESIGN
 *
 * Dispatch. One h2o handler at "/" takes every request; it first refuses
 * ambiguous HTTP/1.x framing and targets that are not plain origin-form
 * paths (400; see "request checks" below and Bad input in
 * net/http_server.h), then our own exact-path route table (immutable after
 * start), matched against the path as received, picks the route, checks
 * method, admin token and the route's body limit, and calls the route's
 * callback. h2o's own error answers (malformed or oversize HTTP/1.1
 * bodies, a path h2o cannot map) come through the host's fallback path,
 * whose filter rewrites them to JSON.
 *
 * Per-request state (`struct kvi_http_res`) is a shared chunk hung on the
 * request's pool: its dispose callback runs on the loop thread when h2o frees
 * the request, whatever the reason (answer sent, client reset, connection
 * closed), and cuts every link to it (c-stack.md §2.1 pitfall 8). Deferred
 * answers and pushed streams live in malloc'd objects that point to the
 * `kvi_http_res` only while it is alive.
 */
#include "net/http_server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <h2o.h>

#include "engine/common.h"
#include "net/log.h"

#define ERROR_TEXT_MAX 1000

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

/* ---- answering ---- */

void kvi_http__set_head(h2o_req_t *req, int status, const char *ctype)
{
    req->res.status = status;
    req->res.reason = status_reason(status);
    if (ctype != NULL) {
        h2o_iovec_t v = h2o_strdup(&req->pool, ctype, strlen(ctype));
        h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, v.base, v.len, 1);
    }
}

/* Count @p r as answered with @p status and @p bytes_out body bytes (net/http_server_internal.h). */
void kvi_http__res_count_answer(struct kvi_http_res *r, int status, uint64_t bytes_out)
{
    r->accounted = true;
    count_answer(r->w, r->ctr_idx, status, bytes_out, r->t0);
}

void kvi_http__res_count_abort(struct kvi_http_res *r)
{
    r->accounted = true;
    kvi_relaxed_add(&r->w->ctr[r->ctr_idx].aborted, 1);
}

static size_t json_error_into_pool(struct kvi_http_res *r, const char *text, size_t n, char **body)
{
    *body = h2o_mem_alloc_pool(&r->req->pool, 6 * n + 16);
    return json_error_body(*body, text, n);
}

/*
 * Send a whole answer. With @p copy the body is copied into the request's
 * pool first (it need not outlive this call), otherwise it lives at least as
 * long as the request. The output budgets (net/http_guard.c) are checked
 * before anything is copied: past the loop's share the answer becomes a
 * short 503; past the connection's, the connection is shut.
 */
static void send_body(struct kvi_http_res *r, int status, const char *ctype, const void *body, size_t len, bool copy)
{
    h2o_req_t *req = r->req;
    if (kvi_http__out_charge(r, r->head ? 0 : len, false) == 1) {
        static const char text[] = "the server holds too many unread answers; retry later";
        char *b;
        len = json_error_into_pool(r, text, sizeof text - 1, &b);
        body = b;
        status = 503;
        ctype = "application/json";
        copy = false;
        kvi_http__out_charge(r, r->head ? 0 : len, true);
    }
    if (copy && len != 0 && !r->head) {
        void *dup = h2o_mem_alloc_pool(&req->pool, len);
        memcpy(dup, body, len);
        body = dup;
    }
    kvi_http__out_waiting(r);
    kvi_http__set_head(req, status, ctype);
    req->res.content_length = len;
    r->state = R_DONE;
    r->status = status;
    /* Count first: a client may read the counters as soon as it has the answer. */
    kvi_http__res_count_answer(r, status, r->head ? 0 : len);
    h2o_start_response(req, &static_gen);
    if (r->head || len == 0) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        h2o_iovec_t v = h2o_iovec_init(body, len);
        h2o_send(req, &v, 1, H2O_SEND_STATE_FINAL);
    }
}

static void send_final(struct kvi_http_res *r, int status, const char *ctype, const void *body, size_t len)
{
    send_body(r, status, ctype, body, len, false);
}

static void send_json_error(struct kvi_http_res *r, int status, const char *text, size_t n)
{
    char *body;
    size_t len = json_error_into_pool(r, text, n, &body);
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

void kvi_http__send_error(struct kvi_http_res *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsend_error(r, status, fmt, ap);
    va_end(ap);
}

void kvi_http__answer_check(struct kvi_http_res *r)
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
    kvi_http__answer_check(r);
    send_body(r, status, ctype, body, len, true);
}

void kvi_http_respond_nocopy(struct kvi_http_res *r, int status, const char *ctype, const void *body, size_t len)
{
    kvi_http__answer_check(r);
    send_final(r, status, ctype, body, len);
}

static void free_owned(void *slot)
{
    free(*(void **)slot);
}

void kvi_http_respond_owned(struct kvi_http_res *r, int status, const char *ctype, void *body, size_t len)
{
    kvi_http__answer_check(r);
    void **slot = h2o_mem_alloc_shared(&r->req->pool, sizeof *slot, free_owned);
    *slot = body;
    send_final(r, status, ctype, body, len);
}

void kvi_http_error(struct kvi_http_res *r, int status, const char *fmt, ...)
{
    kvi_http__answer_check(r);
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

/* Whether the request's client connects from a loopback address. */
static bool peer_is_loopback(h2o_req_t *req)
{
    struct sockaddr_storage ss;
    socklen_t n = req->conn->callbacks->get_peername != NULL
                      ? req->conn->callbacks->get_peername(req->conn, (struct sockaddr *)&ss)
                      : 0;
    if (n == 0)
        return false;
    if (ss.ss_family == AF_INET)
        return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return ss.ss_family == AF_UNIX;
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
    kvi_http__out_release(r);
    if (r->conn != NULL) {
        if (--r->conn->inflight == 0)
            r->conn->idle_since = h2o_now(w->ctx.loop);
        h2o_linklist_unlink(&r->conn_link);
        r->conn = NULL;
    }
    atomic_store_explicit(&w->in_flight, atomic_load_explicit(&w->in_flight, memory_order_relaxed) - 1,
                          memory_order_relaxed);
    if (!r->accounted)
        kvi_http__res_count_abort(r);

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
        kvi_http__free_chunks(sending);
        kvi_http__free_chunks(queued);
        kvi_http__stream_release(st, last);
    }
}

static struct kvi_http_res *res_new(struct worker *w, h2o_req_t *req, int ctr_idx, uint64_t t0)
{
    struct kvi_http_res *r = h2o_mem_alloc_shared(&req->pool, sizeof *r, res_dispose);
    memset(r, 0, sizeof *r);
    r->req = req;
    r->w = w;
    r->ctr_idx = ctr_idx;
    r->t0 = t0;
    r->head = req->method.len == 4 && memcmp(req->method.base, "HEAD", 4) == 0;
    r->conn = kvi_http__conn_of(req);
    if (r->conn != NULL) {
        r->conn->inflight++;
        h2o_linklist_insert(&r->conn->reqs, &r->conn_link);
        kvi_http__h2_guard(w->srv, r->conn, req);
    }
    atomic_store_explicit(&w->in_flight, atomic_load_explicit(&w->in_flight, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    struct ctr *c = &w->ctr[ctr_idx];
    kvi_relaxed_add(&c->requests, 1);
    kvi_relaxed_add(&c->bytes_in, req->entity.len);
    return r;
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
    kvi_http__answer_check(r);
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
    kvi_http__post(w, &d->msg);
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

/* ---- request checks: framing and target, before routing ---- */

/*
 * h2o 2.2.5 picks an HTTP/1.x body's framing from whichever of
 * Content-Length and Transfer-Encoding it meets (chunked wins, the first
 * Content-Length wins), and drops both headers from req->headers. A proxy in
 * front that frames by the other one would see our body as its next request
 * (request smuggling). So the raw request head, still at the start of the
 * connection's input buffer while the request is dispatched (h2o consumes it
 * only once the answer is sent; the chunked decoder rewrites only the bytes
 * after the head), is scanned again here, and an ambiguous one is refused.
 */

/* Framing headers of one raw HTTP/1.x request head. */
struct framing {
    unsigned content_length;    /* Content-Length header lines */
    unsigned transfer_encoding; /* Transfer-Encoding header lines */
    bool folded;                /* a header line continued on the next (obs-fold) */
};

/*
 * The next line of @p buf[*at .. len) without its CR LF (or LF) in @p line.
 * @return false when no line end is left.
 */
static bool next_line(const char *buf, size_t len, size_t *at, h2o_iovec_t *line)
{
    const char *lf = memchr(buf + *at, '\n', len - *at);
    if (lf == NULL)
        return false;
    size_t end = (size_t)(lf - buf);
    line->base = (char *)buf + *at;
    line->len = end - *at;
    if (line->len != 0 && line->base[line->len - 1] == '\r')
        line->len--;
    *at = end + 1;
    return true;
}

static bool name_is(h2o_iovec_t name, const char *lower)
{
    size_t n = strlen(lower);
    return name.len == n && h2o_lcstris(name.base, n, lower, n);
}

/*
 * Scan the raw head in @p buf for @p req's framing headers.
 * @return 0, or -1 when @p buf does not start with @p req's request line and
 *         a whole head (then nothing is known about it).
 */
static int scan_head(const char *buf, size_t len, const h2o_req_t *req, struct framing *f)
{
    size_t at = 0;
    h2o_iovec_t line;
    memset(f, 0, sizeof *f);
    if (!next_line(buf, len, &at, &line))
        return -1;
    if (line.len == 0 && !next_line(buf, len, &at, &line)) /* picohttpparser skips one empty line */
        return -1;
    /* "METHOD SP target SP HTTP/1.x": the same method and target as parsed. */
    h2o_iovec_t m = req->input.method, t = req->input.path;
    if (line.len < m.len + t.len + 2 || memcmp(line.base, m.base, m.len) != 0 || line.base[m.len] != ' ')
        return -1;
    size_t p = m.len;
    while (p < line.len && line.base[p] == ' ')
        p++;
    if (line.len - p < t.len + 1 || memcmp(line.base + p, t.base, t.len) != 0 || line.base[p + t.len] != ' ')
        return -1;
    for (;;) {
        if (!next_line(buf, len, &at, &line))
            return -1;
        if (line.len == 0)
            return 0;
        if (line.base[0] == ' ' || line.base[0] == '\t') {
            f->folded = true;
            continue;
        }
        const char *colon = memchr(line.base, ':', line.len);
        h2o_iovec_t name = h2o_iovec_init(line.base, colon != NULL ? (size_t)(colon - line.base) : line.len);
        if (name_is(name, "content-length"))
            f->content_length++;
        else if (name_is(name, "transfer-encoding"))
            f->transfer_encoding++;
    }
}

/*
 * Whether @p req (version < 2) came on an HTTP/2 connection: the request of
 * an `Upgrade: h2c`, answered as stream 1 after the 101. h2o keeps its raw
 * head only in a private field (h2o/http2_internal.h needs khash.h, which
 * Debian does not ship), and from the 101 on the connection is framed by
 * HTTP/2, so nothing after the head can be read as a further HTTP/1 request.
 * An HTTP/1 connection has no server push; an HTTP/2 one does.
 */
static bool upgraded_to_h2(const h2o_req_t *req)
{
    return req->conn->callbacks->push_path != NULL;
}

/* The input buffer holding @p req's raw HTTP/1.x head, or NULL. */
static h2o_buffer_t *raw_input(h2o_req_t *req)
{
    if (req->conn->callbacks->get_socket == NULL)
        return NULL;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    return sock != NULL ? sock->input : NULL;
}

/*
 * The HTTP/1.x framing rules (RFC 9112 6.1, 6.3; RFC 9110 8.6), strictest
 * reading: no Content-Length together with Transfer-Encoding, at most one
 * of each (identical Content-Length duplicates too: no proxy can read them
 * otherwise than we do if there are none), no Transfer-Encoding in HTTP/1.0,
 * no obs-fold. A head that cannot be found is refused as well.
 * @return NULL, or why @p req is refused.
 */
static const char *framing_problem(h2o_req_t *req)
{
    h2o_buffer_t *in = raw_input(req);
    struct framing f;
    if (in == NULL || scan_head(in->bytes, in->size, req, &f) != 0)
        return "the request head could not be checked";
    if (f.content_length != 0 && f.transfer_encoding != 0)
        return "a request must not carry both Content-Length and Transfer-Encoding";
    if (f.content_length > 1)
        return "a request must carry at most one Content-Length header";
    if (f.transfer_encoding > 1)
        return "a request must carry at most one Transfer-Encoding header";
    if (f.transfer_encoding != 0 && req->version < 0x101)
        return "Transfer-Encoding is not allowed in an HTTP/1.0 request";
    if (f.folded)
        return "folded header lines (obs-fold) are not allowed";
    return NULL;
}

/*
 * The target rules: routing is on the path exactly as received, so a
 * proxy's path rules see what we route on. h2o would decode %XX and resolve
 * dot segments first (/%72egister and /x/../register both reached
 * /register); such a path is refused instead. The query is not checked.
 * @return NULL with *path set to the path part (before '?'), or why the
 *         target is refused.
 */
static const char *target_problem(h2o_iovec_t target, h2o_iovec_t *path)
{
    if (target.len == 0 || target.base[0] != '/')
        return "the request target must be an absolute path (origin-form)";
    const char *q = memchr(target.base, '?', target.len);
    size_t n = q != NULL ? (size_t)(q - target.base) : target.len;
    if (memchr(target.base, '%', n) != NULL)
        return "percent-encoding is not allowed in the path";
    for (size_t seg = 1, i = 1; i <= n; i++) {
        if (i < n && target.base[i] != '/')
            continue;
        size_t l = i - seg;
        if ((l == 1 || l == 2) && target.base[seg] == '.' && target.base[seg + l - 1] == '.')
            return "dot segments (. and ..) are not allowed in the path";
        seg = i + 1;
    }
    *path = h2o_iovec_init(target.base, n);
    return NULL;
}

/*
 * Refuse @p req with 400 `{"error": why}`. An HTTP/1.x connection is closed
 * after the answer (Connection: close): what follows the head on it cannot
 * be trusted to start a request. Logged at debug, once per connection.
 */
static void reject(struct worker *w, h2o_req_t *req, uint64_t t0, const char *why)
{
    struct kvi_http_res *r = res_new(w, req, w->srv->nroutes, t0);
    kvi_relaxed_add(&w->rejected, 1);
    if (req->version < 0x200 && !upgraded_to_h2(req))
        req->http1_is_persistent = 0;
    if (r->conn == NULL || !r->conn->reject_logged) {
        if (r->conn != NULL)
            r->conn->reject_logged = true;
        kvi_log_debug("http: 400 for %.*s %.*s: %s", (int)KVI_MIN(req->input.method.len, 16), req->input.method.base,
                      (int)KVI_MIN(req->input.path.len, 200), req->input.path.base, why);
    }
    kvi_http__send_error(r, 400, "%s", why);
}

/* ---- dispatch ---- */

int kvi_http__on_req(h2o_handler_t *self, h2o_req_t *req)
{
    struct kvi_http_server *s = ((struct handler_ext *)self)->srv;
    struct worker *w = worker_of_ctx(req->conn->ctx);
    uint64_t t0 = kvi_now_ns();
    h2o_iovec_t target = req->input.path, rpath;
    const char *why = req->version < 0x200 && !upgraded_to_h2(req) ? framing_problem(req) : NULL;
    if (why == NULL)
        why = target_problem(target, &rpath);
    if (why != NULL) {
        reject(w, req, t0, why);
        return 0;
    }
    unsigned m = method_bit(req->method);
    const char *path = rpath.base; /* as received; equal to h2o's normalised path once checked */
    size_t plen = rpath.len;
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
            kvi_http__send_error(r, 405, "method %.*s is not allowed on %.*s (allowed: %s)", (int)req->method.len,
                       req->method.base, (int)plen, path, seen->allow);
        } else {
            kvi_http__send_error(r, 404, "no route for %.*s", (int)plen, path);
        }
        return 0;
    }
    const struct route *rt = &s->routes[ri];
    struct kvi_http_str auth = header_of(req, H2O_TOKEN_AUTHORIZATION);
    if ((rt->flags & KVI_HTTP_ROUTE_ADMIN) != 0 && !bearer_matches(auth, s->opt.admin_token)) {
        kvi_http_add_header(r, "www-authenticate", "Bearer");
        kvi_http__send_error(r, 401, "%s needs the admin token (Authorization: Bearer ...)", rt->path);
        return 0;
    }
    if ((rt->flags & KVI_HTTP_ROUTE_DATA) != 0 && s->opt.data_token != NULL && !bearer_matches(auth, s->opt.data_token) &&
        (s->opt.admin_token == NULL || !bearer_matches(auth, s->opt.admin_token))) {
        kvi_http_add_header(r, "www-authenticate", "Bearer");
        kvi_http__send_error(r, 401, "%s needs the data token (Authorization: Bearer ...)", rt->path);
        return 0;
    }
    if ((rt->flags & KVI_HTTP_ROUTE_ADMIN) != 0 && s->opt.admin_token == NULL && s->opt.admin_loopback_only &&
        !peer_is_loopback(req)) {
        kvi_http__send_error(r, 403, "%s accepts only loopback clients when no admin token is set%s%s", rt->path,
                             s->opt.admin_hint ? ": " : "", s->opt.admin_hint ? s->opt.admin_hint : "");
        return 0;
    }
    if (req->entity.len > rt->body_limit) {
        kvi_http__send_error(r, 413, "request body of %zu bytes is over the %zu-byte limit of %s", req->entity.len,
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
    if (plen < target.len) {
        view.query.p = target.base + plen + 1;
        view.query.len = target.len - plen - 1;
    }
    rt->fn(&view, r, rt->ud);
    if (r->state == R_NONE)
        kvi_http__send_error(r, 500, "the handler of %s did not answer", rt->path);
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

void kvi_http__errjson_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
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
