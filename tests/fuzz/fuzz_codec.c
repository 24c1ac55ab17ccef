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

static void dig_kstr(struct fz_dig *d, struct kvi_str s)
{
    FZ_CHECK(s.len == 0 || s.p != NULL);
    fz_dig_bytes(d, s.p, s.len);
}

static bool kstr_is(struct kvi_str s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.p, lit, s.len) == 0;
}

static void check_endpoint(struct kvi_str s)
{
    FZ_CHECK(s.len > 0 && kvi_endpoint_check(s.p, s.len) == NULL);
}

static void check_hash_profile(struct fz_dig *d, const struct kvi_hash_profile *hp)
{
    dig_kstr(d, hp->strategy);
    dig_kstr(d, hp->algorithm);
    dig_kstr(d, hp->python_hash_seed);
    dig_kstr(d, hp->root_digest);
    dig_kstr(d, hp->index_projection);
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
        dig_kstr(&d, r->endpoint);
        dig_kstr(&d, r->model_name);
        dig_kstr(&d, r->tenant_id);
        dig_kstr(&d, r->replay_endpoint);
        dig_kstr(&d, r->additional_salt);
        FZ_CHECK(r->tenant_id.p != NULL); /* given, or "default" */
        break;
    }
    case OP_DYN_UNREGISTER: {
        const struct kvi_dyn_unregister *r = &o->dunreg;
        fz_dig_u64(&d, r->instance_id);
        fz_dig_u64(&d, r->has_dp_rank ? r->dp_rank : ~0ull);
        fz_dig_u64(&d, r->has_tenant);
        dig_kstr(&d, r->model_name);
        if (r->has_tenant)
            dig_kstr(&d, r->tenant_id);
        break;
    }
    case OP_DYN_QUERY: {
        const struct kvi_dyn_query *q = &o->dq;
        FZ_CHECK(q->n_tokens <= len && (q->n_tokens == 0 || q->token_ids != NULL));
        fz_dig_bytes(&d, q->token_ids, q->n_tokens * sizeof(uint32_t));
        FZ_CHECK(q->tenant_id.p != NULL);
        dig_kstr(&d, q->model_name);
        dig_kstr(&d, q->tenant_id);
        dig_kstr(&d, q->lora_name);
        dig_kstr(&d, q->cache_salt);
        break;
    }
    case OP_DYN_QBH: {
        const struct kvi_dyn_query_hash *q = &o->dqh;
        FZ_CHECK(q->n_hashes <= len && (q->n_hashes == 0 || q->block_hashes != NULL));
        fz_dig_bytes(&d, q->block_hashes, q->n_hashes * sizeof(uint64_t));
        FZ_CHECK(q->tenant_id.p != NULL);
        dig_kstr(&d, q->model_name);
        dig_kstr(&d, q->tenant_id);
        dig_kstr(&d, q->cache_salt);
        break;
    }
    case OP_DYN_PEER: dig_kstr(&d, o->dpeer.url); break;
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
        dig_kstr(&d, r->endpoint);
        dig_kstr(&d, r->replay_endpoint);
        dig_kstr(&d, r->model_name);
        dig_kstr(&d, r->lora_name);
        dig_kstr(&d, r->tenant_id);
        dig_kstr(&d, r->instance_id);
        dig_kstr(&d, r->additional_salt);
        if (r->has_hash_profile)
            check_hash_profile(&d, &r->hash_profile);
        break;
    }
    case OP_COND_UNREGISTER: {
        const struct kvi_cond_unregister *r = &o->cunreg;
        FZ_CHECK(r->instance_id.len > 0 && r->tenant_id.len > 0 && r->dp_rank <= INT_MAX);
        fz_dig_u64(&d, r->dp_rank);
        dig_kstr(&d, r->instance_id);
        dig_kstr(&d, r->tenant_id);
        break;
    }
    case OP_COND_QUERY: {
        const struct kvi_cond_query *q = &o->cq;
        FZ_CHECK(q->model.len > 0 && q->block_size > 0 && q->tenant_id.len > 0);
        FZ_CHECK(q->has_instance == (q->instance_id.len > 0));
        FZ_CHECK(q->n_tokens <= len && (q->n_tokens == 0 || q->token_ids != NULL));
        fz_dig_bytes(&d, q->token_ids, q->n_tokens * sizeof(uint32_t));
        fz_dig_u64(&d, q->block_size);
        dig_kstr(&d, q->model);
        dig_kstr(&d, q->tenant_id);
        dig_kstr(&d, q->lora_name);
        dig_kstr(&d, q->instance_id);
        dig_kstr(&d, q->cache_salt);
        break;
    }
    case OP_COND_QBH: {
        const struct kvi_cond_query_hash *q = &o->cqh;
        FZ_CHECK(q->model.len > 0 && q->block_size > 0 && q->tenant_id.len > 0);
        FZ_CHECK(q->has_instance == (q->instance_id.len > 0));
        FZ_CHECK(q->n_hashes <= len && (q->n_hashes == 0 || q->seq_hashes != NULL));
        fz_dig_bytes(&d, q->seq_hashes, q->n_hashes * sizeof(uint64_t));
        fz_dig_u64(&d, q->block_size);
        dig_kstr(&d, q->model);
        dig_kstr(&d, q->tenant_id);
        dig_kstr(&d, q->lora_name);
        dig_kstr(&d, q->instance_id);
        dig_kstr(&d, q->cache_salt);
        break;
    }
    default: FZ_CHECK(!"not a body parser");
    }
    return d.h;
}

/* ---- error answers -------------------------------------------------------------- */

/* The encoded error must be one complete, valid document of its encoding. */
static void check_doc(const struct kvi_buf *b, enum kvi_body_enc enc)
{
    size_t n = b->len;
    if (enc == KVI_ENC_JSON) {
        FZ_CHECK(fz_utf8_valid((const uint8_t *)b->data, n));
        if (n > 0 && b->data[n - 1] == '\n')
            n--;
    }
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_rd rd;
    kvi_rd_init(&rd, b->data, n, enc, &s);
    FZ_CHECK(kvi_rd_peek(&rd) == KVI_VT_OBJ);
    FZ_CHECK(kvi_rd_skip(&rd) == 0 && kvi_rd_finish(&rd) == 0);
    kvi_scratch_free(&s);
}

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
        check_doc(&b, mp ? KVI_ENC_MSGPACK : KVI_ENC_JSON);
        kvi_buf_free(&b);
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

/* ---- JSON -> msgpack transcoder ------------------------------------------------- */

struct tc {
    struct kvi_rd rd;
    const uint8_t *body;
    bool wide_ints;
    bool wide_lens;
};

static void mp_be(struct kvi_buf *o, uint8_t tag, uint64_t v, int bytes)
{
    uint8_t b[9];
    b[0] = tag;
    for (int i = 0; i < bytes; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    kvi_buf_put(o, b, (size_t)bytes + 1);
}

/* A length header: fix form (@p fix_tag | n, when @p fix_max allows), else
 * the 8/16/32-bit forms @p t8 (0 = none), t16, t32. */
static void mp_len(struct tc *t, struct kvi_buf *o, uint64_t n, uint8_t fix_tag, uint64_t fix_max,
                   uint8_t t8, uint8_t t16, uint8_t t32)
{
    if (t->wide_lens)
        mp_be(o, t32, n, 4);
    else if (n <= fix_max)
        kvi_buf_putc(o, (char)(fix_tag | n));
    else if (t8 != 0 && n <= 0xff)
        mp_be(o, t8, n, 1);
    else if (n <= 0xffff)
        mp_be(o, t16, n, 2);
    else
        mp_be(o, t32, n, 4);
}

static void mp_uint(struct tc *t, struct kvi_buf *o, uint64_t v)
{
    if (t->wide_ints)
        mp_be(o, 0xcf, v, 8);
    else if (v <= 0x7f)
        kvi_buf_putc(o, (char)v);
    else if (v <= 0xff)
        mp_be(o, 0xcc, v, 1);
    else if (v <= 0xffff)
        mp_be(o, 0xcd, v, 2);
    else if (v <= 0xffffffffu)
        mp_be(o, 0xce, v, 4);
    else
        mp_be(o, 0xcf, v, 8);
}

static void mp_neg(struct tc *t, struct kvi_buf *o, int64_t v)
{
    uint64_t u = (uint64_t)v;
    if (t->wide_ints)
        mp_be(o, 0xd3, u, 8);
    else if (v >= -32)
        kvi_buf_putc(o, (char)(uint8_t)v);
    else if (v >= INT8_MIN)
        mp_be(o, 0xd0, u, 1);
    else if (v >= INT16_MIN)
        mp_be(o, 0xd1, u, 2);
    else if (v >= INT32_MIN)
        mp_be(o, 0xd2, u, 4);
    else
        mp_be(o, 0xd3, u, 8);
}

static void mp_str(struct tc *t, struct kvi_buf *o, struct kvi_str s)
{
    mp_len(t, o, s.len, 0xa0, 31, 0xd9, 0xda, 0xdb);
    kvi_buf_put(o, s.p, s.len);
}

/* Transcode one value into @p o. @return false when it has no exact
 * msgpack twin (integers beyond 64 bits, -0) or the JSON is broken. */
static bool tc_value(struct tc *t, struct kvi_buf *o)
{
    struct kvi_str s;
    bool b;
    switch (kvi_rd_peek(&t->rd)) {
    case KVI_VT_NULL:
        kvi_rd_null(&t->rd);
        kvi_buf_putc(o, (char)0xc0);
        return true;
    case KVI_VT_BOOL:
        if (kvi_rd_bool(&t->rd, &b) != 0)
            return false;
        kvi_buf_putc(o, (char)(b ? 0xc3 : 0xc2));
        return true;
    case KVI_VT_STR:
        if (kvi_rd_str(&t->rd, &s) != 0)
            return false;
        mp_str(t, o, s);
        return true;
    case KVI_VT_INT: {
        size_t off = kvi_rd_offset(&t->rd);
        struct kvi_num n;
        int r = kvi_rd_num(&t->rd, &n);
        if (r == 0 && !n.neg) {
            mp_uint(t, o, n.mag);
            return true;
        }
        if (r == 0 && n.mag > 0 && n.mag <= (uint64_t)1 << 63) {
            mp_neg(t, o, n.mag == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)n.mag);
            return true;
        }
        if (r != KVI_NUM_FLOAT)
            return false; /* -0, beyond 64 bits, or broken */
        size_t end = kvi_rd_offset(&t->rd);
        char *txt = fz_dup(t->body + off, end - off, true);
        double v = strtod(txt, NULL);
        free(txt);
        uint64_t bits;
        memcpy(&bits, &v, sizeof(bits));
        mp_be(o, 0xcb, bits, 8);
        return true;
    }
    case KVI_VT_ARR:
    case KVI_VT_OBJ: {
        bool obj = kvi_rd_peek(&t->rd) == KVI_VT_OBJ;
        if ((obj ? kvi_rd_obj_begin(&t->rd) : kvi_rd_arr_begin(&t->rd)) != 0)
            return false;
        struct kvi_buf kids;
        kvi_buf_init(&kids);
        uint64_t n = 0;
        int r;
        bool ok = true;
        while (ok && (r = obj ? kvi_rd_obj_next(&t->rd, &s) : kvi_rd_arr_next(&t->rd)) == 1) {
            if (obj)
                mp_str(t, &kids, s);
            ok = tc_value(t, &kids);
            n++;
        }
        if (ok && r == 0) {
            if (obj)
                mp_len(t, o, n, 0x80, 15, 0, 0xde, 0xdf);
            else
                mp_len(t, o, n, 0x90, 15, 0, 0xdc, 0xdd);
            kvi_buf_put(o, kids.data, kids.len);
        }
        kvi_buf_free(&kids);
        return ok && r == 0;
    }
    default: return false;
    }
}

/* @return true with the msgpack twin of a JSON body in @p out. */
static bool transcode(const uint8_t *body, size_t len, uint8_t style, struct kvi_buf *out)
{
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct tc t;
    kvi_rd_init(&t.rd, body, len, KVI_ENC_JSON, &s);
    t.body = body;
    t.wide_ints = style & 1;
    t.wide_lens = style & 2;
    bool ok = tc_value(&t, out) && kvi_rd_finish(&t.rd) == 0;
    FZ_CHECK(kvi_buf_ok(out));
    kvi_scratch_free(&s);
    return ok;
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
            cond_key = kstr_is(k, "modelname") || kstr_is(k, "type");
            dyn_key = kstr_is(k, "model_name");
            break;
        case KVI_R_UNREGISTER:
            if (kstr_is(k, "instance_id")) {
                cond_key = vt == KVI_VT_STR;
                dyn_key = vt == KVI_VT_INT;
            } else if (unreg_other < 0) {
                if (kstr_is(k, "modelname") || kstr_is(k, "type"))
                    unreg_other = KVI_DIALECT_CONDUCTOR;
                else if (kstr_is(k, "model_name"))
                    unreg_other = KVI_DIALECT_DYNAMO;
            }
            break;
        case KVI_R_QUERY:
            cond_key = kstr_is(k, "model");
            dyn_key = kstr_is(k, "model_name");
            break;
        default:
            cond_key = kstr_is(k, "seq_hashes") || kstr_is(k, "block_hash");
            dyn_key = kstr_is(k, "block_hashes");
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

static void pct_encode(struct kvi_buf *b, struct kvi_str s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < s.len; i++) {
        uint8_t c = (uint8_t)s.p[i];
        char e[3] = {'%', hex[c >> 4], hex[c & 15]};
        kvi_buf_put(b, e, 3);
    }
}

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
        pct_encode(&q, f.model_name);
    }
    if (f.has_tenant) {
        kvi_buf_puts(&q, "&tenant_id=");
        pct_encode(&q, f.tenant_id);
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
        if (json && mp_ok && transcode(body, len, (uint8_t)(sel >> 6), &mp)) {
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
