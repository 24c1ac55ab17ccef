/*
 * The dialect dispatcher: the shared paths (/register, /unregister, /query,
 * /query_by_hash) go to the dialect the request selects (api/codec.h
 * kvi_detect_dialect) unless --api forces one: queries inline on the loop
 * thread, control requests copied and handed to the control thread, where
 * they run in their dialect. DESIGN: api/routes_common.h.
 */
#include "api/routes_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common.h"

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

int kvi_routes_shared_mount(struct kvi_routes *rt, struct kvi_http_server *srv)
{
    struct kvi_http_route_opts admin = {rt->cfg.body_limit, KVI_HTTP_ROUTE_ADMIN};
    struct kvi_http_route_opts query = {rt->cfg.query_body_limit, 0};
    struct kvi_http_route_opts plain = {rt->cfg.body_limit, 0};
    int rc;
    if ((rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/register", h_register, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/unregister", h_unregister, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/query", h_query_tokens, rt, &query)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/query_by_hash", h_query_hash, rt, &plain)) < 0)
        return rc;
    return 0;
}
