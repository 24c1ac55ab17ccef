/*
 * Dynamo standalone-indexer dialect (http-api.md §1): queries inline on the
 * loop thread, GET routes over the service's tables, and the control
 * requests run on the control thread. DESIGN: api/routes_common.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/routes_internal.h"
#include "engine/common.h"
#include "engine/hash.h"
#include "engine/rcu.h"
#include "net/log.h"

#define MIME_PROM "text/plain; version=0.0.4"

/* ---- /query, /query_by_hash ------------------------------------------------------------------- */

/* Rows for the Dynamo answer from t->tm: every non-pool (instance, rank). RCU section held. */
static size_t dyn_rows(struct kvi_route_thread *t, struct kvi_index *ix, size_t n_tm)
{
    kvi_routes_reserve(t, 0, 0, n_tm);
    size_t k = 0;
    for (size_t i = 0; i < n_tm; i++) {
        const struct kvi_tier_match *m = &t->tm[i];
        uint64_t id = 0;
        const char *name = NULL;
        bool shared = false;
        if (kvi_index_instance_info(ix, m->instance, &id, &name, &shared) != 0 || shared)
            continue; /* storage pools only extend instances' cpu/disk reach */
        t->rows[k++] = (struct kvi_score_row){.instance_id = id, .name = name, .dp_rank = m->dp_rank, .gpu = m->gpu,
                                              .cpu = m->cpu, .disk = m->disk, .tree_size = m->tree_size};
    }
    return k;
}

size_t kvi_routes_dyn_query(struct kvi_routes *rt, struct kvi_route_thread *t, const struct kvi_http_req *req,
                            struct kvi_http_res *res, enum kvi_ctype ct, bool by_hash)
{
    struct kvi_api_err err;
    struct kvi_dyn_query q;
    struct kvi_dyn_query_hash qh;
    struct kvi_str model, tenant;
    enum kvi_body_enc enc = kvi_routes_enc(req, ct);
    int rc = by_hash ? kvi_dyn_parse_query_by_hash(req->body, req->body_len, ct, &t->scratch, &qh, &err)
                     : kvi_dyn_parse_query(req->body, req->body_len, ct, &t->scratch, &q, &err);
    if (rc != 0) {
        kvi_routes_send_err(res, t, KVI_DIALECT_DYNAMO, enc, &err);
        return 0;
    }
    model = by_hash ? qh.model_name : q.model_name;
    tenant = by_hash ? qh.tenant_id : q.tenant_id;
    char *m = kvi_scratch_strdup(&t->scratch, model.p, model.len);
    char *tn = kvi_scratch_strdup(&t->scratch, tenant.p, tenant.len);
    if (m == NULL || tn == NULL) {
        kvi_log_error("out of memory answering %.*s", (int)req->path.len, req->path.p); /* every 500 is logged */
        kvi_http_error(res, 500, "out of memory");
        return 0;
    }
    kvi_rcu_read_lock();
    struct kvi_ns *ns = kvi_nsreg_find(kvi_service_nsreg(rt->svc), m, tn);
    if (ns == NULL) {
        kvi_rcu_read_unlock();
        kvi_dyn_err_no_indexer(&err, model, tenant);
        kvi_routes_send_err(res, t, KVI_DIALECT_DYNAMO, enc, &err);
        return 0;
    }
    uint32_t bs = ns->block_size;
    const uint64_t *h;
    size_t n;
    if (by_hash) {
        h = qh.block_hashes;
        n = qh.n_hashes;
    } else {
        n = q.n_tokens / bs;
        kvi_routes_reserve(t, n, 0, 0);
        uint64_t seed = kvi_hash_seed(q.lora_name.p, q.lora_name.len, NULL, 0);
        kvi_hash_blocks(q.token_ids, q.n_tokens, bs, seed, t->hashes, t->hashes_cap);
        h = t->hashes;
    }
    size_t n_tm = kvi_routes_tiered(t, ns->ix, h, NULL, n);
    size_t n_rows = dyn_rows(t, ns->ix, n_tm);
    char *body = kvi_routes_body(t, res, kvi_dyn_scores_max_len(t->rows, n_rows));
    size_t len = 0;
    if (body != NULL)
        len = kvi_dyn_encode_scores_to(t->rows, n_rows, bs, KVI_SCORE_FULL, enc, body);
    kvi_rcu_read_unlock(); /* rows name instances through index memory: encoded above */
    if (body == NULL) {
        kvi_log_error("out of memory answering %.*s", (int)req->path.len, req->path.p); /* every 500 is logged */
        kvi_http_error(res, 500, "out of memory");
        return n;
    }
    kvi_routes_send_body(t, res, 200, enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, body, len);
    return n;
}

/* ---- control requests (control thread) ---------------------------------------------------------- */

void kvi_routes_dyn_ctl(struct kvi_service *svc, struct kvi_ctl_req *c)
{
    struct kvi_scratch s;
    struct kvi_buf out;
    struct kvi_api_err err;
    kvi_scratch_init(&s);
    kvi_buf_init(&out);
    int rc, status = 200;
    switch (c->route) {
    case KVI_R_REGISTER: {
        struct kvi_dyn_register r;
        rc = kvi_dyn_parse_register(c->body, c->len, c->ct, &s, &r, &err);
        if (rc == 0)
            rc = kvi_service_ctl_dyn_register(svc, &r, &err);
        status = 201;
        break;
    }
    case KVI_R_UNREGISTER: {
        struct kvi_dyn_unregister r;
        rc = kvi_dyn_parse_unregister(c->body, c->len, c->ct, &s, &r, &err);
        if (rc == 0)
            rc = kvi_service_ctl_dyn_unregister(svc, &r, &err);
        break;
    }
    case KVI_R_NATS_SOURCES: {
        struct kvi_dyn_nats_source r;
        rc = kvi_dyn_parse_nats_source(c->body, c->len, c->ct, &s, &r, &err);
        if (rc == 0)
            rc = kvi_service_ctl_nats_source(svc, &r, &err);
        status = 201;
        break;
    }
    case KVI_R_ZMQ_BIND:
    case KVI_R_ZMQ_UNBIND: {
        struct kvi_dyn_zbind r;
        bool bind = c->route == KVI_R_ZMQ_BIND, created = false;
        rc = kvi_dyn_parse_zbind(c->body, c->len, c->ct, &s, !bind, &r, &err);
        if (rc == 0)
            rc = bind ? kvi_service_ctl_zbind_open(svc, &r, &created, &err) : kvi_service_ctl_zbind_close(svc, &r, &err);
        status = bind ? 201 : 200;
        break;
    }
    case KVI_R_TEST_PAUSE:
    case KVI_R_TEST_RESUME: {
        struct kvi_dyn_listener_ctl r;
        rc = kvi_dyn_parse_listener_ctl(c->body, c->len, c->ct, &s, &r, &err);
        if (rc == 0)
            rc = kvi_service_ctl_listener(svc, &r, c->route == KVI_R_TEST_PAUSE, &err);
        break;
    }
    default:
        kvi_log_error("unexpected control route %d", (int)c->route);
        rc = kvi_err_internal(&err, "unexpected control route");
        break;
    }
    if (rc == 0)
        kvi_dyn_encode_ok(&out);
    kvi_routes_complete(c, rc, status, &err, &out);
    kvi_buf_free(&out);
    kvi_scratch_free(&s);
}

/* ---- GET routes ------------------------------------------------------------------------------------ */

static void h_health(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    (void)req;
    (void)ud;
    kvi_http_respond(res, 200, NULL, NULL, 0);
}

static void h_ready(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    struct kvi_status_view st;
    kvi_service_status(rt->svc, &st);
    kvi_buf_reset(&t->out);
    kvi_dyn_encode_ready(st.ready, st.reason, &t->out);
    kvi_routes_send(res, st.ready ? 200 : 503, KVI_MIME_JSON, &t->out);
}

static void h_status(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    struct kvi_status_view st;
    kvi_service_status(rt->svc, &st);
    kvi_buf_reset(&t->out);
    kvi_dyn_encode_status(&st, &t->out);
    kvi_routes_send(res, 200, KVI_MIME_JSON, &t->out);
}

static void h_metrics(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    struct kvi_metrics_src src = {rt->svc, rt->srv, rt->metrics_route, rt->hists, rt->n_threads};
    kvi_buf_reset(&t->out);
    kvi_metrics_render(&src, &t->out);
    kvi_routes_send(res, 200, MIME_PROM, &t->out);
}

static void h_workers(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    struct kvi_dyn_workers_filter f;
    struct kvi_api_err err;
    if (kvi_dyn_parse_workers_filter(req->query.p, req->query.len, &t->scratch, &f, &err) != 0) {
        kvi_routes_send_err(res, t, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, &err);
    } else {
        kvi_buf_reset(&t->out);
        kvi_service_encode_workers(rt->svc, &f, &t->out);
        kvi_routes_send(res, 200, KVI_MIME_JSON, &t->out);
    }
    kvi_scratch_reset(&t->scratch);
}

static void h_peers(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    kvi_buf_reset(&t->out);
    kvi_service_encode_peers(rt->svc, &t->out);
    kvi_routes_send(res, 200, KVI_MIME_JSON, &t->out);
}

static void h_peer(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud, bool add)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    enum kvi_ctype ct = kvi_ctype_of(req->content_type.p, req->content_type.len);
    struct kvi_dyn_peer p;
    struct kvi_api_err err;
    if (kvi_dyn_parse_peer(req->body, req->body_len, ct, &t->scratch, &p, &err) != 0) {
        kvi_routes_send_err(res, t, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, &err);
    } else if (add) {
        kvi_service_peer_add(rt->svc, p.url.p, p.url.len);
        kvi_log_info("peer %.*s registered", (int)p.url.len, p.url.p);
        kvi_buf_reset(&t->out);
        kvi_dyn_encode_ok(&t->out);
        kvi_routes_send(res, 201, KVI_MIME_JSON, &t->out);
    } else if (kvi_service_peer_remove(rt->svc, p.url.p, p.url.len) != 0) {
        kvi_dyn_err_peer_not_found(&err);
        kvi_routes_send_err(res, t, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, &err);
    } else {
        kvi_log_info("peer %.*s deregistered", (int)p.url.len, p.url.p);
        kvi_buf_reset(&t->out);
        kvi_dyn_encode_ok(&t->out);
        kvi_routes_send(res, 200, KVI_MIME_JSON, &t->out);
    }
    kvi_scratch_reset(&t->scratch);
}

static void h_register_peer(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    h_peer(req, res, ud, true);
}

static void h_deregister_peer(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    h_peer(req, res, ud, false);
}

static void h_nats_source(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    kvi_routes_to_control(ud, req, res, KVI_R_NATS_SOURCES);
}

static void h_zmq_bind(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    kvi_routes_to_control(ud, req, res, KVI_R_ZMQ_BIND);
}

static void h_zmq_unbind(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    kvi_routes_to_control(ud, req, res, KVI_R_ZMQ_UNBIND);
}

static void h_zmq_binds(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    kvi_buf_reset(&t->out);
    kvi_service_encode_zbinds(rt->svc, &t->out);
    kvi_routes_send(res, 200, KVI_MIME_JSON, &t->out);
}

static void h_pause(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    kvi_routes_to_control(ud, req, res, KVI_R_TEST_PAUSE);
}

static void h_resume(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    kvi_routes_to_control(ud, req, res, KVI_R_TEST_RESUME);
}

/* ---- /dump: encoded by the writers into a spool, streamed from a dump thread ------------------- */

struct dump_req {
    struct kvi_http_stream *st;
    uint64_t t0;
};

/* On the dump thread: may block while the client is slow (only this dump waits). */
static int dump_sink(void *ctx, const char *data, size_t len)
{
    struct dump_req *d = ctx;
    return kvi_http_stream_write(d->st, data, len);
}

static void dump_done(void *ctx, int rc)
{
    struct dump_req *d = ctx;
    if (rc != 0)
        kvi_log_warn("/dump cut short: %s", strerror(-rc));
    else
        kvi_log_debug("/dump served in %.1f ms", (double)(kvi_now_ns() - d->t0) / 1e6);
    kvi_http_stream_end(d->st, rc != 0);
    free(d);
}

static void h_dump(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    (void)req;
    struct dump_req *d = kvi_xmalloc(sizeof *d);
    d->t0 = kvi_now_ns();
    d->st = kvi_http_stream_open(res, 200, KVI_MIME_JSON);
    if (kvi_service_dump(rt->svc, dump_sink, dump_done, d) != 0) {
        kvi_http_stream_end(d->st, 1);
        free(d);
    }
}

int kvi_routes_dyn_mount(struct kvi_routes *rt, struct kvi_http_server *srv)
{
    struct kvi_http_route_opts admin = {rt->cfg.body_limit, KVI_HTTP_ROUTE_ADMIN};
    struct kvi_http_route_opts plain = {rt->cfg.body_limit, 0};
    struct kvi_http_route_opts data = {rt->cfg.body_limit, KVI_HTTP_ROUTE_DATA}; /* the whole index */
    int rc;
    if ((rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/health", h_health, rt, &plain)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/ready", h_ready, rt, &plain)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/status", h_status, rt, &plain)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/metrics", h_metrics, rt, &plain)) < 0)
        return rc;
    rt->metrics_route = rc;
    if ((rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/workers", h_workers, rt, &plain)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/dump", h_dump, rt, &data)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/peers", h_peers, rt, &plain)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/register_peer", h_register_peer, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/deregister_peer", h_deregister_peer, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/nats/sources", h_nats_source, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/zmq/bind", h_zmq_bind, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/zmq/unbind", h_zmq_unbind, rt, &admin)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/zmq/binds", h_zmq_binds, rt, &plain)) < 0)
        return rc;
    if (rt->cfg.test_endpoints) {
        if ((rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/test/pause_listener", h_pause, rt, &admin)) < 0 ||
            (rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/test/resume_listener", h_resume, rt, &admin)) < 0)
            return rc;
    }
    return 0;
}
