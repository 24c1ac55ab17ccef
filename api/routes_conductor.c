/*
 * Mooncake Conductor dialect (http-api.md §2): /query and /query_by_hash
 * inline on the loop thread over the RCU-published roster, /register and
 * /unregister on the control thread, /global_view and /services over the
 * service's tables. DESIGN: api/routes_common.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/routes_internal.h"
#include "engine/common.h"
#include "engine/hash.h"
#include "engine/rcu.h"
#include "net/log.h"

static int cmp_tm(const void *a, const void *b)
{
    const struct kvi_tier_match *x = a, *y = b;
    if (x->instance != y->instance)
        return x->instance < y->instance ? -1 : 1;
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

static const struct kvi_tier_match *tm_find(const struct kvi_tier_match *tm, size_t n, uint32_t inst, uint32_t rank)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tm[mid].instance < inst || (tm[mid].instance == inst && tm[mid].dp_rank < rank))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && tm[lo].instance == inst && tm[lo].dp_rank == rank ? &tm[lo] : NULL;
}

/* Rows of instance `in` (one per registered rank, zeros included). */
static size_t inst_rows(struct kvi_route_thread *t, size_t k, const struct kvi_svc_cond_inst *in, size_t n_tm,
                        uint32_t pool_cpu, uint32_t pool_disk)
{
    for (uint32_t j = 0; j < in->n_ranks; j++) {
        const struct kvi_tier_match *m = tm_find(t->tm, n_tm, in->dense, in->ranks[j]);
        struct kvi_score_row *r = &t->rows[k++];
        *r = (struct kvi_score_row){.name = in->name, .dp_rank = in->ranks[j], .cpu = pool_cpu, .disk = pool_disk};
        if (m != NULL) {
            r->gpu = m->gpu;
            r->cpu = m->cpu;
            r->disk = m->disk;
            r->tree_size = m->tree_size;
        }
    }
    return k;
}

/* One row per registered rank of every instance of the context (or the
 * filtered one), zeros included: the Conductor instances, then the Dynamo
 * ones whose names no Conductor instance has. */
static size_t cond_rows(struct kvi_route_thread *t, const struct kvi_svc_cond_ctx *x, const uint64_t *content,
                        const uint64_t *seq, size_t n, bool has_filter, struct kvi_str filter)
{
    size_t n_tm = kvi_routes_tiered(t, x->ns->ix, content, seq, n);
    qsort(t->tm, n_tm, sizeof *t->tm, cmp_tm);
    uint32_t pool_cpu = 0, pool_disk = 0;
    if (n > 0)
        kvi_index_pool_depths(x->ns->ix, content, seq, n, &pool_cpu, &pool_disk);
    size_t need = 0;
    for (size_t i = 0; i < x->n_inst; i++)
        need += x->inst[i].n_ranks;
    for (size_t i = 0; i < x->n_dyn; i++)
        need += x->dyn[i].n_ranks;
    kvi_routes_reserve(t, 0, 0, need);
    size_t k = 0;
    for (size_t i = 0; i < x->n_inst; i++)
        if (!has_filter || kvi_str_eq(filter, x->inst[i].name))
            k = inst_rows(t, k, &x->inst[i], n_tm, pool_cpu, pool_disk);
    for (size_t i = 0; i < x->n_dyn; i++)
        if ((!has_filter || kvi_str_eq(filter, x->dyn[i].name)) &&
            (x->n_inst == 0 || kvi_service_cond_inst_find(x, x->dyn[i].name) == NULL))
            k = inst_rows(t, k, &x->dyn[i], n_tm, pool_cpu, pool_disk);
    return k;
}

size_t kvi_routes_cond_query(struct kvi_routes *rt, struct kvi_route_thread *t, const struct kvi_http_req *req,
                             struct kvi_http_res *res, enum kvi_ctype ct, bool by_hash)
{
    struct kvi_api_err err;
    struct kvi_cond_query q;
    struct kvi_cond_query_hash qh;
    enum kvi_body_enc enc = kvi_routes_enc(req, ct);
    int rc = by_hash ? kvi_cond_parse_query_by_hash(req->body, req->body_len, ct, &t->scratch, &qh, &err)
                     : kvi_cond_parse_query(req->body, req->body_len, ct, &t->scratch, &q, &err);
    if (rc != 0) {
        kvi_routes_send_err(res, t, KVI_DIALECT_CONDUCTOR, enc, &err);
        return 0;
    }
    struct kvi_str model = by_hash ? qh.model : q.model;
    struct kvi_str tenant = by_hash ? qh.tenant_id : q.tenant_id;
    struct kvi_str lora = by_hash ? qh.lora_name : q.lora_name;
    struct kvi_str filter = by_hash ? qh.instance_id : q.instance_id;
    bool has_filter = by_hash ? qh.has_instance : q.has_instance;
    uint32_t bs = by_hash ? qh.block_size : q.block_size;
    size_t n = 0, n_rows = 0;
    kvi_rcu_read_lock();
    const struct kvi_svc_cond_ctx *x = kvi_service_cond_find(rt->svc, model, tenant, lora, bs);
    if (x != NULL && x->n_inst + x->n_dyn > 0) {
        if (by_hash) {
            n = qh.n_hashes;
            n_rows = cond_rows(t, x, NULL, qh.seq_hashes, n, has_filter, filter);
        } else {
            n = q.n_tokens / bs;
            kvi_routes_reserve(t, n, 0, 0);
            uint64_t seed = kvi_hash_seed(q.lora_name.p, q.lora_name.len, q.cache_salt.p, q.cache_salt.len);
            kvi_hash_blocks(q.token_ids, q.n_tokens, bs, seed, t->hashes, t->hashes_cap);
            n_rows = cond_rows(t, x, t->hashes, NULL, n, has_filter, filter);
        }
    }
    char *body = kvi_routes_body(t, res, kvi_cond_query_max_len(t->rows, n_rows, tenant));
    size_t len = 0;
    if (body != NULL)
        len = kvi_cond_encode_query_to(t->rows, n_rows, bs, tenant, KVI_COND_SHAPE_AUTO, enc, body);
    kvi_rcu_read_unlock(); /* row names live in the roster: encoded above */
    if (body == NULL) {
        kvi_log_error("out of memory answering %.*s", (int)req->path.len, req->path.p); /* every 500 is logged */
        kvi_http_error(res, 500, "out of memory");
        return n;
    }
    kvi_routes_send_body(t, res, 200, enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, body, len);
    return n;
}

/* ---- control requests (control thread) ---------------------------------------------------------- */

void kvi_routes_cond_ctl(struct kvi_service *svc, struct kvi_ctl_req *c)
{
    struct kvi_scratch s;
    struct kvi_buf out;
    struct kvi_api_err err;
    kvi_scratch_init(&s);
    kvi_buf_init(&out);
    int rc;
    if (c->route == KVI_R_REGISTER) {
        struct kvi_cond_register r;
        rc = kvi_cond_parse_register(c->body, c->len, c->ct, &s, &r, &err);
        if (rc == 0)
            rc = kvi_service_ctl_cond_register(svc, &r, &err);
        if (rc == 0)
            kvi_cond_encode_registered(r.has_instance ? r.instance_id : r.endpoint, c->enc, &out);
    } else if (c->route == KVI_R_UNREGISTER) {
        struct kvi_cond_unregister r;
        struct kvi_cond_key key;
        rc = kvi_cond_parse_unregister(c->body, c->len, c->ct, &s, &r, &err);
        if (rc == 0)
            rc = kvi_service_ctl_cond_unregister(svc, &r, &key, &err);
        if (rc == 0)
            kvi_cond_encode_unregistered(&key, 1, c->enc, &out);
    } else {
        kvi_log_error("unexpected control route %d", (int)c->route);
        rc = kvi_err_internal(&err, "unexpected control route");
    }
    kvi_routes_complete(c, rc, 200, &err, &out);
    kvi_buf_free(&out);
    kvi_scratch_free(&s);
}

/* ---- GET routes ------------------------------------------------------------------------------------ */

static void h_global_view(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    enum kvi_body_enc enc = kvi_routes_enc(req, KVI_CT_NONE);
    kvi_buf_reset(&t->out);
    kvi_service_encode_global_view(rt->svc, enc, &t->out);
    kvi_routes_send(res, 200, enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, &t->out);
}

static void h_services(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_routes *rt = ud;
    struct kvi_route_thread *t = req->thread_ctx;
    enum kvi_body_enc enc = kvi_routes_enc(req, KVI_CT_NONE);
    kvi_buf_reset(&t->out);
    kvi_service_encode_services(rt->svc, enc, &t->out);
    kvi_routes_send(res, 200, enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, &t->out);
}

int kvi_routes_cond_mount(struct kvi_routes *rt, struct kvi_http_server *srv)
{
    struct kvi_http_route_opts plain = {rt->cfg.body_limit, 0};
    int rc;
    if ((rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/global_view", h_global_view, rt, &plain)) < 0 ||
        (rc = kvi_http_server_route(srv, KVI_HTTP_GET, "/services", h_services, rt, &plain)) < 0)
        return rc;
    return 0;
}
