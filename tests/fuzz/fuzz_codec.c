/*
 * Fuzz target: every HTTP request parser of api/codec.h, both dialects, JSON
 * and msgpack bodies, plus dialect detection, the GET /workers query string
 * and the header classifiers.
 *
 * INPUT: byte 0 selects what runs, the rest is the body.
 *   bits 0-3  the parser (enum op below)
 *   bits 4-5  the Content-Type class (KVI_CT_NONE, JSON, MSGPACK, OTHER)
 *   bits 6-7  msgpack header widths for the transcoded body (see below):
 *             bit 6 = every int as 64-bit, bit 7 = every string, array and
 *             map with a 32-bit length
 *
 * CHECKS (besides ASan + UBSan):
 *   - the return is 0 or -EINVAL (no -ENOMEM on small bodies);
 *   - failure: the status is one the parser documents (Dynamo 400/415/422,
 *     Conductor 400 with a reason), the message is set, and kvi_err_encode
 *     gives a body that kvidx's own strict reader accepts whole: valid JSON
 *     (UTF-8 included) or msgpack;
 *   - success: the documented guarantees of the parsed struct (block_size
 *     > 0, endpoints valid, Conductor strings non-empty, "default" tenants,
 *     instance_id present unless Mooncake, ranks <= INT_MAX, array lengths
 *     bounded by the body) and every string and array readable in full;
 *   - success: the errors a handler builds from the parsed strings
 *     (kvi_dyn_err_*, kvi_cond_err_*: conflicts, unknown instances) encode
 *     to valid answers, UTF-8 included, however long the strings are; so
 *     does the 404 quoting an unknown path (any bytes);
 *   - determinism: parsing again after kvi_scratch_reset gives the same
 *     result;
 *   - JSON and msgpack agree: a JSON body that parses as JSON is transcoded
 *     to msgpack (exact integers, strings unescaped, floats as float64) and
 *     parsed again with a msgpack Content-Type; both runs must give the same
 *     return, status, Conductor reason/field/index, and the same fields;
 *   - dialect detection follows http-api.md §0 as written in api/codec.h,
 *     recomputed here with a full (validating) walk of the body's keys.
 */
#include <errno.h>
#include <limits.h>
#include <strings.h>

#include "api/codec.h"
#include "fuzz.h"
#include "fuzz_body.h"
#include "net/endpoint.h"

enum op {
    OP_DYN_REGISTER,
    OP_DYN_UNREGISTER,
    OP_DYN_QUERY,
    OP_DYN_QBH,
    OP_DYN_PEER,
    OP_DYN_LCTL,
    OP_COND_REGISTER,
    OP_COND_UNREGISTER,
    OP_COND_QUERY,
    OP_COND_QBH,
    OP_WORKERS_FILTER,
    OP_FLOW_REGISTER, /* handler flow: detect the dialect, run its parser */
    OP_FLOW_UNREGISTER,
    OP_FLOW_QUERY,
    OP_FLOW_QBH,
    OP_HEADERS, /* kvi_route_of, kvi_ctype_of, kvi_accepts_msgpack */
};

union parsed {
    struct kvi_dyn_register dreg;
    struct kvi_dyn_unregister dunreg;
    struct kvi_dyn_query dq;
    struct kvi_dyn_query_hash dqh;
    struct kvi_dyn_peer dpeer;
    struct kvi_dyn_listener_ctl dlctl;
    struct kvi_cond_register creg;
    struct kvi_cond_unregister cunreg;
    struct kvi_cond_query cq;
    struct kvi_cond_query_hash cqh;
};

static bool is_conductor(enum op op)
{
    return op >= OP_COND_REGISTER && op <= OP_COND_QBH;
}

/* ---- checks of parsed values -------------------------------------------------- */

static void check_endpoint(struct kvi_str s)
{
    FZ_CHECK(s.len > 0 && kvi_endpoint_check(s.p, s.len) == NULL);
}

static void check_hash_profile(struct fz_dig *d, const struct kvi_hash_profile *hp)
{
    fz_dig_kstr(d, hp->strategy);
    fz_dig_kstr(d, hp->algorithm);
    fz_dig_kstr(d, hp->python_hash_seed);
    fz_dig_kstr(d, hp->root_digest);
    fz_dig_kstr(d, hp->index_projection);
}

/* Check the guarantees of a successful parse; @return its digest. */
static uint64_t check_parsed(enum op op, const union parsed *o, size_t len)
{
    struct fz_dig d;
    fz_dig_init(&d);
    switch (op) {
    case OP_DYN_REGISTER: {
        const struct kvi_dyn_register *r = &o->dreg;
        FZ_CHECK(r->block_size > 0);
        check_endpoint(r->endpoint);
        if (r->has_replay)
            check_endpoint(r->replay_endpoint);
        fz_dig_u64(&d, r->instance_id);
        fz_dig_u64(&d, r->block_size);
        fz_dig_u64(&d, r->dp_rank);
        fz_dig_u64(&d, (uint64_t)r->has_replay << 1 | r->has_salt);
        fz_dig_kstr(&d, r->endpoint);
        fz_dig_kstr(&d, r->model_name);
        fz_dig_kstr(&d, r->tenant_id);
        fz_dig_kstr(&d, r->replay_endpoint);
        fz_dig_kstr(&d, r->additional_salt);
        FZ_CHECK(r->tenant_id.p != NULL); /* given, or "default" */
        break;
    }
    case OP_DYN_UNREGISTER: {
        const struct kvi_dyn_unregister *r = &o->dunreg;
        fz_dig_u64(&d, r->instance_id);
        fz_dig_u64(&d, r->has_dp_rank ? r->dp_rank : ~0ull);
        fz_dig_u64(&d, r->has_tenant);
        fz_dig_kstr(&d, r->model_name);
        if (r->has_tenant)
            fz_dig_kstr(&d, r->tenant_id);
        break;
    }
    case OP_DYN_QUERY: {
        const struct kvi_dyn_query *q = &o->dq;
        FZ_CHECK(q->n_tokens <= len && (q->n_tokens == 0 || q->token_ids != NULL));
        fz_dig_bytes(&d, q->token_ids, q->n_tokens * sizeof(uint32_t));
        FZ_CHECK(q->tenant_id.p != NULL);
        fz_dig_kstr(&d, q->model_name);
        fz_dig_kstr(&d, q->tenant_id);
        fz_dig_kstr(&d, q->lora_name);
        fz_dig_kstr(&d, q->cache_salt);
        break;
    }
    case OP_DYN_QBH: {
        const struct kvi_dyn_query_hash *q = &o->dqh;
        FZ_CHECK(q->n_hashes <= len && (q->n_hashes == 0 || q->block_hashes != NULL));
        fz_dig_bytes(&d, q->block_hashes, q->n_hashes * sizeof(uint64_t));
        FZ_CHECK(q->tenant_id.p != NULL);
        fz_dig_kstr(&d, q->model_name);
        fz_dig_kstr(&d, q->tenant_id);
        fz_dig_kstr(&d, q->cache_salt);
        break;
    }
    case OP_DYN_PEER: fz_dig_kstr(&d, o->dpeer.url); break;
    case OP_DYN_LCTL:
        fz_dig_u64(&d, o->dlctl.instance_id);
        fz_dig_u64(&d, o->dlctl.dp_rank);
        break;
    case OP_COND_REGISTER: {
        const struct kvi_cond_register *r = &o->creg;
        check_endpoint(r->endpoint);
        if (r->replay_endpoint.len > 0)
            check_endpoint(r->replay_endpoint);
        FZ_CHECK(r->type <= KVI_COND_MOONCAKE);
        FZ_CHECK(r->model_name.len > 0 && r->tenant_id.len > 0);
        FZ_CHECK(r->has_instance ? r->instance_id.len > 0 : r->type == KVI_COND_MOONCAKE);
        FZ_CHECK(r->block_size > 0 && r->dp_rank <= INT_MAX);
        fz_dig_u64(&d, r->type);
        fz_dig_u64(&d, r->block_size);
        fz_dig_u64(&d, r->dp_rank);
        fz_dig_u64(&d, (uint64_t)r->has_instance << 2 | (uint64_t)r->has_cache_group << 1 |
                           r->has_hash_profile);
        fz_dig_kstr(&d, r->endpoint);
        fz_dig_kstr(&d, r->replay_endpoint);
        fz_dig_kstr(&d, r->model_name);
        fz_dig_kstr(&d, r->lora_name);
        fz_dig_kstr(&d, r->tenant_id);
        fz_dig_kstr(&d, r->instance_id);
        fz_dig_kstr(&d, r->additional_salt);
        if (r->has_hash_profile)
            check_hash_profile(&d, &r->hash_profile);
        break;
    }
    case OP_COND_UNREGISTER: {
        const struct kvi_cond_unregister *r = &o->cunreg;
        FZ_CHECK(r->instance_id.len > 0 && r->tenant_id.len > 0 && r->dp_rank <= INT_MAX);
        fz_dig_u64(&d, r->dp_rank);
        fz_dig_kstr(&d, r->instance_id);
        fz_dig_kstr(&d, r->tenant_id);
        break;
    }
    case OP_COND_QUERY: {
        const struct kvi_cond_query *q = &o->cq;
        FZ_CHECK(q->model.len > 0 && q->block_size > 0 && q->tenant_id.len > 0);
        FZ_CHECK(q->has_instance == (q->instance_id.len > 0));
        FZ_CHECK(q->n_tokens <= len && (q->n_tokens == 0 || q->token_ids != NULL));
        fz_dig_bytes(&d, q->token_ids, q->n_tokens * sizeof(uint32_t));
        fz_dig_u64(&d, q->block_size);
        fz_dig_kstr(&d, q->model);
        fz_dig_kstr(&d, q->tenant_id);
        fz_dig_kstr(&d, q->lora_name);
        fz_dig_kstr(&d, q->instance_id);
        fz_dig_kstr(&d, q->cache_salt);
        break;
    }
    case OP_COND_QBH: {
        const struct kvi_cond_query_hash *q = &o->cqh;
        FZ_CHECK(q->model.len > 0 && q->block_size > 0 && q->tenant_id.len > 0);
        FZ_CHECK(q->has_instance == (q->instance_id.len > 0));
        FZ_CHECK(q->n_hashes <= len && (q->n_hashes == 0 || q->seq_hashes != NULL));
        fz_dig_bytes(&d, q->seq_hashes, q->n_hashes * sizeof(uint64_t));
        fz_dig_u64(&d, q->block_size);
        fz_dig_kstr(&d, q->model);
        fz_dig_kstr(&d, q->tenant_id);
        fz_dig_kstr(&d, q->lora_name);
        fz_dig_kstr(&d, q->instance_id);
        fz_dig_kstr(&d, q->cache_salt);
        break;
    }
    default: FZ_CHECK(!"not a body parser");
    }
    return d.h;
}

/* ---- error answers -------------------------------------------------------------- */

static void check_error(const struct kvi_api_err *e, enum kvi_dialect dl)
{
    FZ_CHECK(memchr(e->msg, '\0', sizeof(e->msg)) != NULL && e->msg[0] != '\0');
    FZ_CHECK(e->index >= -1);
    if (dl == KVI_DIALECT_DYNAMO) {
        FZ_CHECK(e->status == 400 || e->status == 415 || e->status == 422);
        FZ_CHECK(e->reason == NULL);
    } else {
        FZ_CHECK(e->status == 400 && e->reason != NULL);
    }
    for (int enc = KVI_ENC_JSON; enc <= KVI_ENC_MSGPACK; enc++) {
        struct kvi_buf b;
        kvi_buf_init(&b);
        const char *ct = NULL;
        FZ_CHECK(kvi_err_encode(e, dl, (enum kvi_body_enc)enc, &b, &ct) == 0);
        FZ_CHECK(ct != NULL);
        bool mp = dl == KVI_DIALECT_CONDUCTOR && enc == KVI_ENC_MSGPACK;
        FZ_CHECK(strcmp(ct, mp ? KVI_MIME_MSGPACK : KVI_MIME_JSON) == 0);
        fz_check_doc(&b, mp ? KVI_ENC_MSGPACK : KVI_ENC_JSON);
        kvi_buf_free(&b);
    }
}

/* ---- handler errors that quote parsed strings ---------------------------------- */

/* A handler-detected error: its answer is valid in every encoding (a JSON
 * body valid UTF-8, a text body too) whatever the request's strings were. */
static void check_handler_error(int rc, const struct kvi_api_err *e, enum kvi_dialect dl)
{
    FZ_CHECK(rc == -EINVAL);
    FZ_CHECK(memchr(e->msg, '\0', sizeof(e->msg)) != NULL && e->msg[0] != '\0');
    for (int enc = KVI_ENC_JSON; enc <= KVI_ENC_MSGPACK; enc++) {
        struct kvi_buf b;
        kvi_buf_init(&b);
        const char *ct = NULL;
        FZ_CHECK(kvi_err_encode(e, dl, (enum kvi_body_enc)enc, &b, &ct) == 0 && ct != NULL);
        if (strcmp(ct, KVI_MIME_TEXT) == 0)
            FZ_CHECK(fz_utf8_valid((const uint8_t *)b.data, b.len));
        else
            fz_check_doc(&b, strcmp(ct, KVI_MIME_MSGPACK) == 0 ? KVI_ENC_MSGPACK : KVI_ENC_JSON);
        kvi_buf_free(&b);
    }
}

/* The errors a handler answers for a request that parsed, built from its strings. */
static void check_answers(enum op op, const union parsed *o)
{
    struct kvi_api_err e;
    const enum kvi_dialect dy = KVI_DIALECT_DYNAMO, co = KVI_DIALECT_CONDUCTOR;
    switch (op) {
    case OP_DYN_REGISTER: {
        const struct kvi_dyn_register *r = &o->dreg;
        struct kvi_str m = r->model_name, t = r->tenant_id;
        check_handler_error(kvi_dyn_err_instance_elsewhere(&e, r->instance_id, m, t), &e, dy);
        check_handler_error(kvi_dyn_err_block_size(&e, m, t, 1, r->block_size), &e, dy);
        check_handler_error(kvi_dyn_err_no_indexer(&e, m, t), &e, dy);
        break;
    }
    case OP_DYN_UNREGISTER: {
        const struct kvi_dyn_unregister *r = &o->dunreg;
        struct kvi_str t = r->has_tenant ? r->tenant_id : (struct kvi_str){"default", 7};
        check_handler_error(kvi_dyn_err_instance_other_ns(&e, r->instance_id, r->model_name, t), &e,
                            dy);
        break;
    }
    case OP_DYN_QUERY:
        check_handler_error(kvi_dyn_err_no_indexer(&e, o->dq.model_name, o->dq.tenant_id), &e, dy);
        break;
    case OP_DYN_QBH:
        check_handler_error(kvi_dyn_err_no_indexer(&e, o->dqh.model_name, o->dqh.tenant_id), &e,
                            dy);
        break;
    case OP_COND_REGISTER: {
        const struct kvi_cond_register *r = &o->creg;
        check_handler_error(kvi_cond_err_conflict(&e, r->instance_id, r->tenant_id, r->dp_rank), &e,
                            co);
        check_handler_error(kvi_cond_err_endpoint_taken(&e, r->endpoint), &e, co);
        check_handler_error(kvi_cond_err_hash_profile(&e, r->model_name), &e, co);
        break;
    }
    case OP_COND_UNREGISTER: {
        const struct kvi_cond_unregister *r = &o->cunreg;
        int rc = kvi_cond_err_service_not_found(&e, r->instance_id, r->tenant_id, r->dp_rank);
        check_handler_error(rc, &e, co);
        break;
    }
    default: break;
    }
}

/* ---- running a parser ----------------------------------------------------------- */

struct result {
    int rc;
    int status;
    const char *reason;
    char field[96];
    int64_t index;
    uint64_t dig;
};

static int call_parser(enum op op, const void *body, size_t len, enum kvi_ctype ct,
                       struct kvi_scratch *s, union parsed *o, struct kvi_api_err *e)
{
    switch (op) {
    case OP_DYN_REGISTER: return kvi_dyn_parse_register(body, len, ct, s, &o->dreg, e);
    case OP_DYN_UNREGISTER: return kvi_dyn_parse_unregister(body, len, ct, s, &o->dunreg, e);
    case OP_DYN_QUERY: return kvi_dyn_parse_query(body, len, ct, s, &o->dq, e);
    case OP_DYN_QBH: return kvi_dyn_parse_query_by_hash(body, len, ct, s, &o->dqh, e);
    case OP_DYN_PEER: return kvi_dyn_parse_peer(body, len, ct, s, &o->dpeer, e);
    case OP_DYN_LCTL: return kvi_dyn_parse_listener_ctl(body, len, ct, s, &o->dlctl, e);
    case OP_COND_REGISTER: return kvi_cond_parse_register(body, len, ct, s, &o->creg, e);
    case OP_COND_UNREGISTER: return kvi_cond_parse_unregister(body, len, ct, s, &o->cunreg, e);
    case OP_COND_QUERY: return kvi_cond_parse_query(body, len, ct, s, &o->cq, e);
    case OP_COND_QBH: return kvi_cond_parse_query_by_hash(body, len, ct, s, &o->cqh, e);
    default: fz_fail(__FILE__, __LINE__, "not a body parser");
    }
}

/* Parse, check, and reduce the outcome to a comparable result. */
static void run_parser(enum op op, const void *body, size_t len, enum kvi_ctype ct,
                       struct kvi_scratch *s, struct result *res)
{
    union parsed o;
    struct kvi_api_err e;
    memset(res, 0, sizeof(*res));
    kvi_scratch_reset(s);
    res->rc = call_parser(op, body, len, ct, s, &o, &e);
    if (res->rc == 0) {
        res->dig = check_parsed(op, &o, len);
        check_answers(op, &o);
        return;
    }
    FZ_CHECK(res->rc == -EINVAL);
    enum kvi_dialect dl = is_conductor(op) ? KVI_DIALECT_CONDUCTOR : KVI_DIALECT_DYNAMO;
    check_error(&e, dl);
    res->status = e.status;
    res->reason = e.reason;
    if (e.field != NULL)
        snprintf(res->field, sizeof(res->field), "%s", e.field);
    res->index = e.index;
}

static bool same_result(const struct result *a, const struct result *b)
{
    if (a->rc != b->rc || a->status != b->status || a->index != b->index || a->dig != b->dig)
        return false;
    if ((a->reason == NULL) != (b->reason == NULL))
        return false;
    if (a->reason != NULL && strcmp(a->reason, b->reason) != 0)
        return false;
    return strcmp(a->field, b->field) == 0;
}

/* ---- dialect detection, recomputed ----------------------------------------------- */

/* http-api.md §0 as api/codec.h states it, over a body that is one valid
 * object. @return the dialect, or -1 when the body is not one. */
static int expected_dialect(enum kvi_route r, const uint8_t *body, size_t len, enum kvi_body_enc enc)
{
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_rd rd;
    kvi_rd_init(&rd, body, len, enc, &s);
    int decided = -1, unreg_other = -1;
    struct kvi_str k;
    int res = -1;
    if (kvi_rd_obj_begin(&rd) != 0)
        goto out;
    int more;
    while ((more = kvi_rd_obj_next(&rd, &k)) == 1) {
        enum kvi_vt vt = kvi_rd_peek(&rd);
        bool cond_key = false, dyn_key = false;
        switch (r) {
        case KVI_R_REGISTER:
            cond_key = fz_kstr_is(k, "modelname") || fz_kstr_is(k, "type");
            dyn_key = fz_kstr_is(k, "model_name");
            break;
        case KVI_R_UNREGISTER:
            if (fz_kstr_is(k, "instance_id")) {
                cond_key = vt == KVI_VT_STR;
                dyn_key = vt == KVI_VT_INT;
            } else if (unreg_other < 0) {
                if (fz_kstr_is(k, "modelname") || fz_kstr_is(k, "type"))
                    unreg_other = KVI_DIALECT_CONDUCTOR;
                else if (fz_kstr_is(k, "model_name"))
                    unreg_other = KVI_DIALECT_DYNAMO;
            }
            break;
        case KVI_R_QUERY:
            cond_key = fz_kstr_is(k, "model");
            dyn_key = fz_kstr_is(k, "model_name");
            break;
        default:
            cond_key = fz_kstr_is(k, "seq_hashes") || fz_kstr_is(k, "block_hash");
            dyn_key = fz_kstr_is(k, "block_hashes");
            break;
        }
        if (decided < 0 && (cond_key || dyn_key))
            decided = cond_key ? KVI_DIALECT_CONDUCTOR : KVI_DIALECT_DYNAMO;
        if (kvi_rd_skip(&rd) != 0)
            goto out;
    }
    if (more != 0 || kvi_rd_finish(&rd) != 0)
        goto out;
    if (decided >= 0)
        res = decided;
    else if (unreg_other >= 0)
        res = unreg_other;
    else
        res = enc == KVI_ENC_MSGPACK ? KVI_DIALECT_CONDUCTOR : KVI_DIALECT_DYNAMO;
out:
    kvi_scratch_free(&s);
    return res;
}

static void run_flow(enum op op, const uint8_t *body, size_t len, enum kvi_ctype ct,
                     struct kvi_scratch *s)
{
    static const enum kvi_route routes[] = {KVI_R_REGISTER, KVI_R_UNREGISTER, KVI_R_QUERY,
                                            KVI_R_QUERY_BY_HASH};
    static const enum op dyn_ops[] = {OP_DYN_REGISTER, OP_DYN_UNREGISTER, OP_DYN_QUERY, OP_DYN_QBH};
    static const enum op cond_ops[] = {OP_COND_REGISTER, OP_COND_UNREGISTER, OP_COND_QUERY,
                                       OP_COND_QBH};
    int i = op - OP_FLOW_REGISTER;
    enum kvi_dialect d = kvi_detect_dialect(routes[i], ct, body, len);
    FZ_CHECK(d == KVI_DIALECT_DYNAMO || d == KVI_DIALECT_CONDUCTOR);
    enum kvi_body_enc enc = ct == KVI_CT_MSGPACK ? KVI_ENC_MSGPACK : KVI_ENC_JSON;
    int want = expected_dialect(routes[i], body, len, enc);
    if (want >= 0)
        FZ_CHECK((int)d == want);
    struct result res;
    run_parser(d == KVI_DIALECT_DYNAMO ? dyn_ops[i] : cond_ops[i], body, len, ct, s, &res);
}

/* ---- GET /workers query strings and header values ------------------------------- */

static void run_workers_filter(const uint8_t *body, size_t len, struct kvi_scratch *s)
{
    struct kvi_dyn_workers_filter f, g;
    struct kvi_api_err e;
    kvi_scratch_reset(s);
    int rc = kvi_dyn_parse_workers_filter((const char *)body, len, s, &f, &e);
    FZ_CHECK(rc == 0); /* bad escapes stay literal: nothing is rejected */
    FZ_CHECK(!f.has_model || f.model_name.len <= len);
    FZ_CHECK(!f.has_tenant || f.tenant_id.len <= len);
    /* re-encode what was understood; parsing that gives the same filter */
    struct kvi_buf q;
    kvi_buf_init(&q);
    if (f.has_model) {
        kvi_buf_puts(&q, "x=1&model_name=");
        fz_pct_encode(&q, f.model_name);
    }
    if (f.has_tenant) {
        kvi_buf_puts(&q, "&tenant_id=");
        fz_pct_encode(&q, f.tenant_id);
    }
    FZ_CHECK(kvi_buf_ok(&q));
    char *qs = fz_dup(q.data, q.len, false);
    FZ_CHECK(kvi_dyn_parse_workers_filter(qs, q.len, s, &g, &e) == 0);
    FZ_CHECK(g.has_model == f.has_model && g.has_tenant == f.has_tenant);
    if (f.has_model)
        FZ_CHECK(g.model_name.len == f.model_name.len &&
                 memcmp(g.model_name.p, f.model_name.p, f.model_name.len) == 0);
    if (f.has_tenant)
        FZ_CHECK(g.tenant_id.len == f.tenant_id.len &&
                 memcmp(g.tenant_id.p, f.tenant_id.p, f.tenant_id.len) == 0);
    free(qs);
    kvi_buf_free(&q);
}

static void run_headers(const uint8_t *body, size_t len)
{
    const char *v = (const char *)body;
    enum kvi_route r = kvi_route_of(v, len);
    FZ_CHECK(r >= KVI_R_UNKNOWN && r < KVI_R_COUNT);
    FZ_CHECK((kvi_route_method(r) == NULL) == (r == KVI_R_UNKNOWN));
    /* a query string is ignored */
    if (memchr(v, '?', len) == NULL) {
        char *q = malloc(len + 3);
        if (q == NULL)
            abort();
        if (len > 0)
            memcpy(q, v, len);
        memcpy(q + len, "?a?", 3);
        FZ_CHECK(kvi_route_of(q, len + 3) == r);
        free(q);
    }
    enum kvi_ctype ct = kvi_ctype_of(v, len);
    FZ_CHECK(ct >= KVI_CT_NONE && ct <= KVI_CT_OTHER);
    /* case-insensitive */
    char *up = fz_dup(v, len, false);
    for (size_t i = 0; i < len; i++)
        if (up[i] >= 'a' && up[i] <= 'z')
            up[i] = (char)(up[i] - 'a' + 'A');
    FZ_CHECK(kvi_ctype_of(up, len) == ct);
    free(up);
    (void)kvi_accepts_msgpack(v, len);
    /* an unknown path is quoted in the 404 answer, whatever its bytes */
    if (r == KVI_R_UNKNOWN) {
        struct kvi_api_err e;
        check_handler_error(kvi_err_unknown_path(&e, v, len), &e, KVI_DIALECT_DYNAMO);
        FZ_CHECK(e.status == 404);
    }
}

/* ---- entry point ---------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t sel = data[0];
    enum op op = (enum op)(sel & 15);
    enum kvi_ctype ct = (enum kvi_ctype)((sel >> 4) & 3);
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    if (op == OP_WORKERS_FILTER) {
        run_workers_filter(body, len, &s);
    } else if (op == OP_HEADERS) {
        run_headers(body, len);
    } else if (op >= OP_FLOW_REGISTER) {
        run_flow(op, body, len, ct, &s);
    } else {
        struct result a, b;
        run_parser(op, body, len, ct, &s, &a);
        run_parser(op, body, len, ct, &s, &b);
        FZ_CHECK(same_result(&a, &b));
        /* JSON and msgpack must agree: Dynamo takes msgpack on the two query
         * routes, Conductor everywhere (any non-msgpack type means JSON) */
        bool json = is_conductor(op) ? ct != KVI_CT_MSGPACK : ct == KVI_CT_JSON;
        bool mp_ok = is_conductor(op) || op == OP_DYN_QUERY || op == OP_DYN_QBH;
        struct kvi_buf mp;
        kvi_buf_init(&mp);
        if (json && mp_ok && fz_transcode(body, len, (uint8_t)(sel >> 6), &mp)) {
            char *twin = fz_dup(mp.data, mp.len, false);
            run_parser(op, twin, mp.len, KVI_CT_MSGPACK, &s, &b);
            if (!same_result(&a, &b)) {
                fprintf(stderr, "json: rc %d status %d reason %s field %s index %lld\n", a.rc,
                        a.status, a.reason ? a.reason : "-", a.field, (long long)a.index);
                fprintf(stderr, "mpk:  rc %d status %d reason %s field %s index %lld\n", b.rc,
                        b.status, b.reason ? b.reason : "-", b.field, (long long)b.index);
            }
            FZ_CHECK(same_result(&a, &b));
            free(twin);
        }
        kvi_buf_free(&mp);
    }
    kvi_scratch_free(&s);
    return 0;
}
