/*
 * Route table, per-thread scratch, the shared paths (/register, /unregister,
 * /query, /query_by_hash) and the hand-off of control requests. DESIGN: see
 * api/routes_common.h.
 */
#include "api/routes_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/rcu.h"
#include "net/log.h"

/* ---- helpers ------------------------------------------------------------------------------ */

void kvi_routes_send(struct kvi_http_res *res, int status, const char *ctype, const struct kvi_buf *b)
{
    if (!kvi_buf_ok(b)) {
        kvi_log_error("out of memory encoding an answer of status %d", status); /* every 500 is logged */
        kvi_http_error(res, 500, "out of memory");
        return;
    }
    kvi_http_respond(res, status, ctype, b->data, b->len);
}

char *kvi_routes_body(struct kvi_route_thread *t, struct kvi_http_res *res, size_t max)
{
    if (max <= KVI_ROUTES_POOL_BODY_MAX)
        return kvi_http_alloc(res, max);
    kvi_buf_reset(&t->out);
    return kvi_buf_reserve(&t->out, max);
}

void kvi_routes_send_body(struct kvi_route_thread *t, struct kvi_http_res *res, int status, const char *ctype,
                          const char *body, size_t len)
{
    if (body == t->out.data) /* the thread's buffer is reused by the next request: copy */
        kvi_http_respond(res, status, ctype, body, len);
    else
        kvi_http_respond_nocopy(res, status, ctype, body, len);
}

void kvi_routes_send_err(struct kvi_http_res *res, struct kvi_route_thread *t, enum kvi_dialect d,
                         enum kvi_body_enc enc, const struct kvi_api_err *e)
{
    const char *ctype = KVI_MIME_JSON;
    kvi_buf_reset(&t->out);
    if (kvi_err_encode(e, d, enc, &t->out, &ctype) != 0) {
        kvi_http_error(res, e->status, "%s", e->msg);
        return;
    }
    kvi_http_respond(res, e->status, ctype, t->out.data, t->out.len);
}

void kvi_routes_complete(struct kvi_ctl_req *c, int rc, int status, const struct kvi_api_err *e,
                         const struct kvi_buf *b)
{
    if (rc != 0) {
        struct kvi_buf eb;
        const char *ctype = KVI_MIME_JSON;
        kvi_buf_init(&eb);
        if (kvi_err_encode(e, c->dialect, c->enc, &eb, &ctype) == 0)
            kvi_http_complete(c->d, e->status, ctype, eb.data, eb.len);
        else
            kvi_http_complete_error(c->d, e->status, "%s", e->msg);
        kvi_buf_free(&eb);
        return;
    }
    if (!kvi_buf_ok(b)) {
        kvi_log_error("out of memory encoding an answer of status %d", status); /* every 500 is logged */
        kvi_http_complete_error(c->d, 500, "out of memory");
        return;
    }
    kvi_http_complete(c->d, status, c->enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, b->data, b->len);
}

void kvi_routes_reserve(struct kvi_route_thread *t, size_t hashes, size_t tm, size_t rows)
{
    if (hashes > t->hashes_cap) {
        t->hashes_cap = hashes + hashes / 2;
        free(t->hashes);
        t->hashes = kvi_xmalloc(t->hashes_cap * sizeof *t->hashes);
    }
    if (tm > t->tm_cap) {
        t->tm_cap = tm + tm / 2;
        free(t->tm);
        t->tm = kvi_xmalloc(t->tm_cap * sizeof *t->tm);
    }
    if (rows > t->rows_cap) {
        t->rows_cap = rows + rows / 2;
        free(t->rows);
        t->rows = kvi_xmalloc(t->rows_cap * sizeof *t->rows);
    }
}

size_t kvi_routes_tiered(struct kvi_route_thread *t, const struct kvi_index *ix, const uint64_t *content,
                         const uint64_t *seq, size_t n)
{
    if (n == 0)
        return 0;
    size_t r = kvi_index_find_tiered(ix, content, seq, n, t->tm, t->tm_cap);
    if (r > t->tm_cap) {
        kvi_routes_reserve(t, 0, r, 0);
        r = kvi_index_find_tiered(ix, content, seq, n, t->tm, t->tm_cap);
        if (r > t->tm_cap)
            r = t->tm_cap; /* grew again meanwhile: answer with what fits */
    }
    return r;
}

enum kvi_body_enc kvi_routes_enc(const struct kvi_http_req *req, enum kvi_ctype ct)
{
    if (ct == KVI_CT_MSGPACK || kvi_accepts_msgpack(req->accept.p, req->accept.len))
        return KVI_ENC_MSGPACK;
    return KVI_ENC_JSON;
}

/* ---- per-thread scratch ----------------------------------------------------------------------- */

struct kvi_routes *kvi_routes_create(struct kvi_service *svc, const struct kvi_routes_config *cfg, unsigned n_threads)
{
    struct kvi_routes *rt = kvi_xcalloc(1, sizeof *rt);
    rt->svc = svc;
    rt->cfg = *cfg;
    if (rt->cfg.body_limit == 0)
        rt->cfg.body_limit = KVI_ROUTES_DEFAULT_BODY_LIMIT;
    if (rt->cfg.query_body_limit == 0)
        rt->cfg.query_body_limit = KVI_ROUTES_DEFAULT_QUERY_LIMIT;
    rt->n_threads = n_threads ? n_threads : 1;
    rt->threads = kvi_xcalloc(rt->n_threads, sizeof *rt->threads);
    rt->hists = aligned_alloc(KVI_CACHE_LINE, (size_t)rt->n_threads * KVI_QK_COUNT * sizeof *rt->hists);
    if (rt->hists == NULL)
        kvi_die("out of memory");
    memset(rt->hists, 0, (size_t)rt->n_threads * KVI_QK_COUNT * sizeof *rt->hists);
    rt->metrics_route = -1;
    return rt;
}

void *kvi_routes_thread_init(unsigned thread, void *ud)
{
    struct kvi_routes *rt = ud;
    KVI_ASSERT(thread < rt->n_threads);
    struct kvi_route_thread *t = &rt->threads[thread];
    t->idx = thread;
    kvi_scratch_init(&t->scratch);
    kvi_buf_init(&t->out);
    t->hist = &rt->hists[(size_t)thread * KVI_QK_COUNT];
    kvi_routes_reserve(t, 1024, 256, 256);
    return t;
}

void kvi_routes_thread_fini(unsigned thread, void *thread_ctx, void *ud)
{
    (void)thread;
    (void)ud;
    struct kvi_route_thread *t = thread_ctx;
    kvi_scratch_free(&t->scratch);
    kvi_buf_free(&t->out);
    free(t->hashes);
    free(t->tm);
    free(t->rows);
    t->hashes = NULL;
    t->tm = NULL;
    t->rows = NULL;
    t->hashes_cap = t->tm_cap = t->rows_cap = 0;
}

void kvi_routes_free(struct kvi_routes *rt)
{
    if (rt == NULL)
        return;
    free(rt->threads);
    free(rt->hists);
    free(rt);
}

/* ---- shared paths ------------------------------------------------------------------------------ */

static enum kvi_dialect dialect_of(const struct kvi_routes *rt, enum kvi_route r, enum kvi_ctype ct,
                                   const struct kvi_http_req *req)
{
    switch (rt->cfg.api) {
    case KVI_API_DYNAMO: return KVI_DIALECT_DYNAMO;
    case KVI_API_CONDUCTOR: return KVI_DIALECT_CONDUCTOR;
    default: return kvi_detect_dialect(r, ct, req->body, req->body_len);
    }
}

static void h_query(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud, bool by_hash)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    uint64_t t0 = kvi_now_ns();
    enum kvi_ctype ct = kvi_ctype_of(req->content_type.p, req->content_type.len);
    enum kvi_route r = by_hash ? KVI_R_QUERY_BY_HASH : KVI_R_QUERY;
    enum kvi_dialect d = dialect_of(rt, r, ct, req);
    size_t blocks = d == KVI_DIALECT_DYNAMO ? kvi_routes_dyn_query(rt, t, req, res, ct, by_hash)
                                            : kvi_routes_cond_query(rt, t, req, res, ct, by_hash);
    kvi_scratch_reset(&t->scratch);
    kvi_buf_reset(&t->out);
    enum kvi_query_kind k = d == KVI_DIALECT_DYNAMO ? (by_hash ? KVI_QK_DYN_HASH : KVI_QK_DYN_QUERY)
                                                    : (by_hash ? KVI_QK_COND_HASH : KVI_QK_COND_QUERY);
    kvi_query_hist_add(&t->hist[k], kvi_now_ns() - t0, blocks);
}

static void h_query_tokens(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    h_query(req, res, ud, false);
}

static void h_query_hash(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    h_query(req, res, ud, true);
}

static void run_ctl(struct kvi_service *svc, void *arg)
{
    struct kvi_ctl_req *c = arg;
    if (c->dialect == KVI_DIALECT_DYNAMO)
        kvi_routes_dyn_ctl(svc, c);
    else
        kvi_routes_cond_ctl(svc, c);
    free(c);
}

/* Copy the request, defer the answer and hand it to the control thread. */
static void to_control(struct kvi_routes *rt, const struct kvi_http_req *req, struct kvi_http_res *res,
                       enum kvi_route r, enum kvi_dialect d, enum kvi_ctype ct)
{
    struct kvi_ctl_req *c = kvi_xmalloc(sizeof *c + req->body_len);
    c->rt = rt;
    c->route = r;
    c->dialect = d;
    c->ct = ct;
    c->enc = d == KVI_DIALECT_CONDUCTOR ? kvi_routes_enc(req, ct) : KVI_ENC_JSON;
    c->len = req->body_len;
    if (req->body_len > 0)
        memcpy(c->body, req->body, req->body_len);
    c->d = kvi_http_defer(res);
    if (kvi_service_post(rt->svc, run_ctl, c) != 0) {
        kvi_http_complete_error(c->d, 503, "shutting down");
        free(c);
    }
}

static void h_register(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    enum kvi_ctype ct = kvi_ctype_of(req->content_type.p, req->content_type.len);
    to_control(rt, req, res, KVI_R_REGISTER, dialect_of(rt, KVI_R_REGISTER, ct, req), ct);
}

static void h_unregister(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    enum kvi_ctype ct = kvi_ctype_of(req->content_type.p, req->content_type.len);
    to_control(rt, req, res, KVI_R_UNREGISTER, dialect_of(rt, KVI_R_UNREGISTER, ct, req), ct);
}

void kvi_routes_to_control(struct kvi_routes *rt, const struct kvi_http_req *req, struct kvi_http_res *res,
                           enum kvi_route r)
{
    enum kvi_ctype ct = kvi_ctype_of(req->content_type.p, req->content_type.len);
    to_control(rt, req, res, r, KVI_DIALECT_DYNAMO, ct);
}

int kvi_routes_mount(struct kvi_routes *rt, struct kvi_http_server *srv)
{
    rt->srv = srv;
    struct kvi_http_route_opts admin = {rt->cfg.body_limit, KVI_HTTP_ROUTE_ADMIN};
    struct kvi_http_route_opts query = {rt->cfg.query_body_limit, 0};
    struct kvi_http_route_opts plain = {rt->cfg.body_limit, 0};
    int rc;
    if ((rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/register", h_register, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/unregister", h_unregister, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/query", h_query_tokens, rt, &query)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/query_by_hash", h_query_hash, rt, &plain)) < 0)
        return rc;
    if ((rc = kvi_routes_dyn_mount(rt, srv)) < 0)
        return rc;
    return kvi_routes_cond_mount(rt, srv);
}
