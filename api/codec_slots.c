/*
 * Slot-tracker codecs (api/codec_slots.h). The parsers use the table-driven
 * object parser of the Dynamo dialect (axum + serde texts); the reference
 * service's serde types are RegisterRequest, UnregisterRequest, AddRequest,
 * LifecycleRequest, PotentialLoadsRequest and PeerRequest.
 */
#include "api/codec_slots.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_internal.h"
#include "engine/common.h"

#define F(name, kind, flags, bit, type, member)                                                    \
    {name, kind, flags, bit, (uint16_t)offsetof(type, member), 0}
#define FA(name, kind, flags, bit, type, member, count)                                            \
    {name, kind, flags, bit, (uint16_t)offsetof(type, member), (uint16_t)offsetof(type, count)}

/* What the table parser fills (kvi_str fields); converted to engine structs. */
struct wire {
    struct kvi_str model_name;
    struct kvi_str tenant_id;
    struct kvi_str request_id;
    struct kvi_str url;
    uint64_t worker_id;
    uint64_t new_isl_tokens;
    const uint64_t *hashes;
    size_t n_hashes;
    uint32_t block_size;
    uint32_t dp_start;
    uint32_t dp_size;
    uint32_t dp_rank;
};

#define W(name, kind, flags, bit, member) F(name, kind, flags, bit, struct wire, member)

enum { B_MODEL, B_TENANT, B_REQ, B_WORKER, B_RANK, B_HASHES, B_ISL, B_BS, B_START, B_SIZE, B_URL };

static const struct kvi_field register_fields[] = {
    W("worker_id", KVI_FK_U64, KVI_FF_REQ, B_WORKER, worker_id),
    W("model_name", KVI_FK_STR, KVI_FF_REQ, B_MODEL, model_name),
    W("tenant_id", KVI_FK_STR, 0, B_TENANT, tenant_id),
    W("block_size", KVI_FK_U32, KVI_FF_REQ, B_BS, block_size),
    W("dp_start", KVI_FK_U32, KVI_FF_REQ, B_START, dp_start),
    W("dp_size", KVI_FK_U32, KVI_FF_REQ, B_SIZE, dp_size),
};

static const struct kvi_field unregister_fields[] = {
    W("worker_id", KVI_FK_U64, KVI_FF_REQ, B_WORKER, worker_id),
    W("model_name", KVI_FK_STR, KVI_FF_REQ, B_MODEL, model_name),
    W("tenant_id", KVI_FK_STR, 0, B_TENANT, tenant_id),
};

static const struct kvi_field add_fields[] = {
    W("model_name", KVI_FK_STR, KVI_FF_REQ, B_MODEL, model_name),
    W("tenant_id", KVI_FK_STR, 0, B_TENANT, tenant_id),
    W("request_id", KVI_FK_STR, KVI_FF_REQ, B_REQ, request_id),
    W("worker_id", KVI_FK_U64, KVI_FF_REQ, B_WORKER, worker_id),
    W("dp_rank", KVI_FK_U32, KVI_FF_REQ, B_RANK, dp_rank),
    FA("sequence_hashes", KVI_FK_HASHES, KVI_FF_REQ, B_HASHES, struct wire, hashes, n_hashes),
    W("new_isl_tokens", KVI_FK_U64, 0, B_ISL, new_isl_tokens),
};

static const struct kvi_field lifecycle_fields[] = {
    W("model_name", KVI_FK_STR, KVI_FF_REQ, B_MODEL, model_name),
    W("tenant_id", KVI_FK_STR, 0, B_TENANT, tenant_id),
    W("request_id", KVI_FK_STR, KVI_FF_REQ, B_REQ, request_id),
};

static const struct kvi_field potential_fields[] = {
    W("model_name", KVI_FK_STR, KVI_FF_REQ, B_MODEL, model_name),
    W("tenant_id", KVI_FK_STR, 0, B_TENANT, tenant_id),
    FA("sequence_hashes", KVI_FK_HASHES, KVI_FF_REQ, B_HASHES, struct wire, hashes, n_hashes),
    W("new_isl_tokens", KVI_FK_U64, 0, B_ISL, new_isl_tokens),
};

static const struct kvi_field peer_fields[] = {
    W("url", KVI_FK_STR, KVI_FF_REQ, B_URL, url),
};

/* Replace the first @p from after @p after in the message by @p to. */
static bool msg_replace(struct kvi_api_err *err, const char *after, const char *from,
                        const char *to)
{
    const char *at = after != NULL ? strstr(err->msg, after) : err->msg;
    const char *hit = at != NULL ? strstr(at, from) : NULL;
    if (hit == NULL)
        return false;
    char tmp[sizeof(err->msg)];
    snprintf(tmp, sizeof(tmp), "%.*s%s%s", (int)(hit - err->msg), err->msg, to, hit + strlen(from));
    memcpy(err->msg, tmp, sizeof(tmp));
    return true;
}

/*
 * Bring the shared parser's 422 texts to what serde says for the reference
 * types (checked against serde_json 1.0.87):
 *   - sequence_hashes has a custom visitor expecting "an array of signed
 *     64-bit sequence hashes", new_isl_tokens is a usize;
 *   - an integer where a string or an array is expected is an "invalid
 *     type", not an "invalid value" (serde's Unexpected::Signed/Unsigned).
 * Error path only.
 */
static void fix_expectation(struct kvi_api_err *err)
{
    if (err->status != 422)
        return;
    msg_replace(err, "sequence_hashes: ", ", expected a sequence at ",
                ", expected an array of signed 64-bit sequence hashes at ");
    msg_replace(err, "new_isl_tokens: ", ", expected u64 at ", ", expected usize at ");
    if (strstr(err->msg, ", expected a string at ") != NULL ||
        strstr(err->msg, ", expected an array of signed 64-bit sequence hashes at ") != NULL)
        msg_replace(err, NULL, ": invalid value: integer `", ": invalid type: integer `");
}

static int parse(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                 const char *type_name, const struct kvi_field *f, size_t nf, struct wire *w,
                 struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(w, 0, sizeof(*w));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, type_name, body, len, ct, false, s, err);
    uint64_t seen = 0;
    if (r == 0)
        r = kvi_parse__fields(&c, f, nf, w, &seen);
    if (r != 0) {
        fix_expectation(err);
        return r;
    }
    if (!(seen & KVI_BIT(B_TENANT)))
        w->tenant_id = kvi_str_default;
    return 0;
}

static struct kvi_slots_key key_of(const struct wire *w)
{
    return (struct kvi_slots_key){w->model_name.p, w->model_name.len, w->tenant_id.p,
                                  w->tenant_id.len};
}

int kvi_slot_parse_register(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                            struct kvi_slot_register *out, struct kvi_api_err *err)
{
    struct wire w;
    memset(out, 0, sizeof(*out));
    int r = parse(body, len, ct, s, "RegisterRequest", register_fields,
                  KVI_ARRAY_LEN(register_fields), &w, err);
    if (r != 0)
        return r;
    out->key = key_of(&w);
    out->worker_id = w.worker_id;
    out->block_size = w.block_size;
    out->dp_start = w.dp_start;
    out->dp_size = w.dp_size;
    return 0;
}

int kvi_slot_parse_unregister(const void *body, size_t len, enum kvi_ctype ct,
                              struct kvi_scratch *s, struct kvi_slot_unregister *out,
                              struct kvi_api_err *err)
{
    struct wire w;
    memset(out, 0, sizeof(*out));
    int r = parse(body, len, ct, s, "UnregisterRequest", unregister_fields,
                  KVI_ARRAY_LEN(unregister_fields), &w, err);
    if (r != 0)
        return r;
    out->key = key_of(&w);
    out->worker_id = w.worker_id;
    return 0;
}

int kvi_slot_parse_add(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                       struct kvi_slots_request *out, struct kvi_api_err *err)
{
    struct wire w;
    memset(out, 0, sizeof(*out));
    int r = parse(body, len, ct, s, "AddRequest", add_fields, KVI_ARRAY_LEN(add_fields), &w, err);
    if (r != 0)
        return r;
    out->key = key_of(&w);
    out->request_id = w.request_id.p;
    out->request_id_len = w.request_id.len;
    out->worker_id = w.worker_id;
    out->dp_rank = w.dp_rank;
    out->hashes = w.hashes;
    out->n_hashes = w.n_hashes;
    out->new_isl_tokens = w.new_isl_tokens;
    return 0;
}

int kvi_slot_parse_lifecycle(const void *body, size_t len, enum kvi_ctype ct,
                             struct kvi_scratch *s, struct kvi_slots_request *out,
                             struct kvi_api_err *err)
{
    struct wire w;
    memset(out, 0, sizeof(*out));
    int r = parse(body, len, ct, s, "LifecycleRequest", lifecycle_fields,
                  KVI_ARRAY_LEN(lifecycle_fields), &w, err);
    if (r != 0)
        return r;
    out->key = key_of(&w);
    out->request_id = w.request_id.p;
    out->request_id_len = w.request_id.len;
    return 0;
}

int kvi_slot_parse_potential(const void *body, size_t len, enum kvi_ctype ct,
                             struct kvi_scratch *s, struct kvi_slot_potential *out,
                             struct kvi_api_err *err)
{
    struct wire w;
    memset(out, 0, sizeof(*out));
    int r = parse(body, len, ct, s, "PotentialLoadsRequest", potential_fields,
                  KVI_ARRAY_LEN(potential_fields), &w, err);
    if (r != 0)
        return r;
    out->key = key_of(&w);
    out->hashes = w.hashes;
    out->n_hashes = w.n_hashes;
    out->new_isl_tokens = w.new_isl_tokens;
    return 0;
}

int kvi_slot_parse_filter(const char *query, size_t len, struct kvi_scratch *s,
                          struct kvi_slots_key *out, struct kvi_api_err *err)
{
    struct kvi_dyn_workers_filter f;
    memset(out, 0, sizeof(*out));
    int r = kvi_dyn_parse_workers_filter(query, len, s, &f, err);
    if (r != 0)
        return r;
    if (f.has_model) {
        out->model = f.model_name.p != NULL ? f.model_name.p : "";
        out->model_len = f.model_name.len;
    }
    if (f.has_tenant) {
        out->tenant = f.tenant_id.p != NULL ? f.tenant_id.p : "";
        out->tenant_len = f.tenant_id.len;
    }
    return 0;
}

/* The value of query parameter @p name (raw, not percent-decoded), or NULL. */
static const char *query_param(const char *q, size_t len, const char *name, size_t *vlen)
{
    size_t nl = strlen(name);
    while (len > 0) {
        const char *amp = memchr(q, '&', len);
        size_t part = amp ? (size_t)(amp - q) : len;
        if (part > nl && memcmp(q, name, nl) == 0 && q[nl] == '=') {
            *vlen = part - nl - 1;
            return q + nl + 1;
        }
        if (amp == NULL)
            break;
        q = amp + 1;
        len -= part + 1;
    }
    return NULL;
}

/* Decode the hex field [p, p + n) into scratch. @return 0, -EINVAL or -ENOMEM. */
static int unhex(const char *p, size_t n, struct kvi_scratch *s, const char **out, size_t *out_len)
{
    if (n % 2 != 0)
        return -EINVAL;
    char *d = kvi_scratch_alloc(s, n / 2 + 1);
    if (d == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < n; i += 2) {
        int a = kvi_hexval(p[i]), b = kvi_hexval(p[i + 1]);
        if (a < 0 || b < 0)
            return -EINVAL;
        d[i / 2] = (char)(a << 4 | b);
    }
    d[n / 2] = '\0';
    *out = d;
    *out_len = n / 2;
    return 0;
}

/* A decimal u64 of [p, p + n) at most @p max. */
static bool dec_u64(const char *p, size_t n, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (max - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* The dot-separated fields of a cursor of listing @p what (engine/slots.h, Paging). */
static size_t cursor_fields(enum kvi_slot_listing what)
{
    return what == KVI_SLOT_LIST_WORKERS ? 3 : 4;
}

static const char *listing_path(enum kvi_slot_listing what)
{
    return what == KVI_SLOT_LIST_WORKERS ? "/workers" : "/loads";
}

int kvi_slot_parse_page(const char *query, size_t len, struct kvi_scratch *s, size_t max_limit,
                        enum kvi_slot_listing what, struct kvi_slot_page *out, struct kvi_api_err *err)
{
    memset(out, 0, sizeof(*out));
    out->limit = max_limit;
    size_t vl;
    const char *v = query_param(query, len, "limit", &vl);
    if (v != NULL) {
        uint64_t x;
        if (!dec_u64(v, vl, UINT64_MAX, &x) || x == 0)
            return kvi_err__set(err, 400, NULL, NULL, -1,
                                "invalid query parameter limit: expected an integer >= 1");
        out->explicit_limit = true;
        out->limit = x < max_limit ? (size_t)x : max_limit;
    }
    v = query_param(query, len, "cursor", &vl);
    if (v == NULL)
        return 0;
    /* <hex model>.<hex tenant>.<worker_id>[.<dp_rank>] */
    size_t nf = cursor_fields(what);
    const char *f[4];
    size_t fl[4];
    size_t k = 0;
    const char *p = v, *end = v + vl;
    while (k < nf) {
        const char *dot = k + 1 < nf ? memchr(p, '.', (size_t)(end - p)) : NULL;
        const char *e = dot != NULL ? dot : end;
        if (k + 1 < nf && dot == NULL)
            break;
        f[k] = p;
        fl[k++] = (size_t)(e - p);
        p = e + 1;
    }
    uint64_t w, r = 0;
    int rc = -EINVAL;
    if (k == nf && (rc = unhex(f[0], fl[0], s, &out->after.key.model, &out->after.key.model_len)) == 0 &&
        (rc = unhex(f[1], fl[1], s, &out->after.key.tenant, &out->after.key.tenant_len)) == 0 &&
        dec_u64(f[2], fl[2], UINT64_MAX, &w) && (nf < 4 || dec_u64(f[3], fl[3], UINT32_MAX, &r))) {
        out->after.worker_id = w;
        out->after.dp_rank = (uint32_t)r;
        out->has_after = true;
        return 0;
    }
    if (rc == -ENOMEM)
        return kvi_err__set(err, 500, NULL, NULL, -1, "out of memory while parsing the query string");
    return kvi_err__set(err, 400, NULL, NULL, -1,
                        "invalid query parameter cursor: expected the X-Kvidx-Next-Cursor value of "
                        "a previous %s answer",
                        listing_path(what));
}

/* Count one more entry with @p names name bytes in an answer of *used bytes; false when it would pass
 * @p max_bytes (the first entry always fits). */
static bool fit_one(size_t *used, size_t i, size_t names, size_t max_bytes)
{
    /* worst case: every name byte escaped as \u00XX; keys, six integers and punctuation */
    size_t one = 6 * names + 192;
    if (i > 0 && *used + one > max_bytes)
        return false;
    *used += one;
    return true;
}

size_t kvi_slot_loads_fit(const struct kvi_slots_load *l, size_t n, size_t max_bytes)
{
    size_t used = 2, i = 0; /* [] */
    while (i < n && fit_one(&used, i, l[i].model_len + l[i].tenant_len, max_bytes))
        i++;
    return i;
}

size_t kvi_slot_workers_fit(const struct kvi_slots_worker *w, size_t n, size_t max_bytes)
{
    size_t used = 2, i = 0; /* [] */
    while (i < n && fit_one(&used, i, w[i].model_len + w[i].tenant_len, max_bytes))
        i++;
    return i;
}

int kvi_slot_encode_cursor(enum kvi_slot_listing what, const struct kvi_slots_pos *last,
                           struct kvi_buf *out)
{
    const char *str[2] = {last->key.model, last->key.tenant};
    size_t n[2] = {last->key.model_len, last->key.tenant_len};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n[k]; i++) {
            char h[2];
            kvi_hex_lower(h, str[k] + i, 1);
            kvi_buf_put(out, h, 2);
        }
        kvi_buf_putc(out, '.');
    }
    kvi_buf_put_u64(out, last->worker_id);
    if (what == KVI_SLOT_LIST_LOADS) {
        kvi_buf_putc(out, '.');
        kvi_buf_put_u64(out, last->dp_rank);
    }
    kvi_buf_putc(out, '\0');
    return kvi_buf_ok(out) ? 0 : -ENOMEM;
}

int kvi_slot_parse_peer(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                        struct kvi_str *url, struct kvi_api_err *err)
{
    struct wire w;
    url->p = NULL;
    url->len = 0;
    int r = parse(body, len, ct, s, "PeerRequest", peer_fields, KVI_ARRAY_LEN(peer_fields), &w,
                  err);
    if (r == 0)
        *url = w.url;
    return r;
}

/* ---- replica events (kvidx's sync route) ---------------------------------------------------- */

/* The replica batch's own small parser (not the table parser: a batch is an
 * array of tagged objects, msgpack from senders, JSON accepted too). */
struct rparse {
    struct kvi_rd rd;
    struct kvi_api_err *err;
    size_t idx; /* event being parsed */
};

static int rp_fail(struct rparse *c, const char *field, const char *what)
{
    if (c->rd.err == -ENOMEM)
        return kvi_err__set(c->err, 500, NULL, NULL, -1,
                            "out of memory while parsing the request body");
    if (c->rd.err != 0)
        return kvi_err__set(c->err, 400, NULL, NULL, -1,
                            "Failed to parse the replica batch: %s at byte %zu", c->rd.err_what,
                            c->rd.err_off);
    if (field[0] == '\0')
        return kvi_err__set(c->err, 422, NULL, NULL, -1,
                            "invalid replica batch: events[%zu]: expected %s", c->idx, what);
    return kvi_err__set(c->err, 422, NULL, NULL, -1,
                        "invalid replica batch: events[%zu].%s: expected %s", c->idx, field, what);
}

static int rp_u64(struct rparse *c, const char *field, uint64_t max, uint64_t *out)
{
    struct kvi_num n = {0};
    int r = kvi_rd_num(&c->rd, &n);
    if (r != 0 || n.neg || n.mag > max)
        return rp_fail(c, field, "an unsigned integer");
    *out = n.mag;
    return 0;
}

static int rp_str(struct rparse *c, const char *field, const char **p, size_t *len)
{
    struct kvi_str s;
    if (kvi_rd_str(&c->rd, &s) != 0)
        return rp_fail(c, field, "a string");
    *p = s.p != NULL ? s.p : "";
    *len = s.len;
    return 0;
}

static int rp_event(struct rparse *c, struct kvi_slots_event *ev)
{
    memset(ev, 0, sizeof(*ev));
    if (kvi_rd_obj_begin(&c->rd) != 0)
        return rp_fail(c, "", "an object");
    struct kvi_str k, type = {0};
    unsigned seen = 0;
    uint64_t v = 0;
    int r;
    struct kvi_slots_request *q = &ev->req;
    q->key.tenant = "default";
    q->key.tenant_len = 7;
    while ((r = kvi_rd_obj_next(&c->rd, &k)) == 1) {
        if (kvi_str_eq(k, "type")) {
            if (kvi_rd_str(&c->rd, &type) != 0)
                return rp_fail(c, "type", "a string");
            seen |= 1;
        } else if (kvi_str_eq(k, "model_name")) {
            if (rp_str(c, "model_name", &q->key.model, &q->key.model_len) != 0)
                return -EINVAL;
            seen |= 2;
        } else if (kvi_str_eq(k, "tenant_id")) {
            if (rp_str(c, "tenant_id", &q->key.tenant, &q->key.tenant_len) != 0)
                return -EINVAL;
        } else if (kvi_str_eq(k, "request_id")) {
            if (rp_str(c, "request_id", &q->request_id, &q->request_id_len) != 0)
                return -EINVAL;
            seen |= 4;
        } else if (kvi_str_eq(k, "block_size")) {
            if (rp_u64(c, "block_size", UINT32_MAX, &v) != 0)
                return -EINVAL;
            ev->block_size = (uint32_t)v;
            seen |= 8;
        } else if (kvi_str_eq(k, "worker_id")) {
            if (rp_u64(c, "worker_id", UINT64_MAX, &q->worker_id) != 0)
                return -EINVAL;
            seen |= 16;
        } else if (kvi_str_eq(k, "dp_rank")) {
            if (rp_u64(c, "dp_rank", UINT32_MAX, &v) != 0)
                return -EINVAL;
            q->dp_rank = (uint32_t)v;
            seen |= 32;
        } else if (kvi_str_eq(k, "new_isl_tokens")) {
            if (rp_u64(c, "new_isl_tokens", UINT64_MAX, &q->new_isl_tokens) != 0)
                return -EINVAL;
        } else if (kvi_str_eq(k, "sequence_hashes")) {
            uint64_t *h;
            size_t n;
            struct kvi_elem_err ee;
            if (kvi_rd_u64_array(&c->rd, INT64_MIN, UINT64_MAX, &h, &n, &ee) != 0)
                return rp_fail(c, "sequence_hashes", "an array of 64-bit integers");
            q->hashes = h;
            q->n_hashes = n;
        } else if (kvi_rd_skip(&c->rd) != 0) {
            return rp_fail(c, "", "a value");
        }
    }
    if (r < 0)
        return rp_fail(c, "", "an object");
    static const char *const req_names[] = {"type",       "model_name", "request_id",
                                            "block_size", "worker_id",  "dp_rank"};
    for (unsigned i = 0; i < 6; i++)
        if (!(seen & (1u << i)))
            return kvi_err__set(c->err, 422, NULL, NULL, -1,
                                "invalid replica batch: events[%zu]: missing field `%s`", c->idx,
                                req_names[i]);
    if (kvi_str_eq(type, "add"))
        ev->type = KVI_SLOTS_EV_ADD;
    else if (kvi_str_eq(type, "prefill_complete"))
        ev->type = KVI_SLOTS_EV_PREFILL_COMPLETE;
    else if (kvi_str_eq(type, "free"))
        ev->type = KVI_SLOTS_EV_FREE;
    else
        return rp_fail(c, "type", "\"add\", \"prefill_complete\" or \"free\"");
    return 0;
}

/* A container or top-level failure: the reader's (400) or a 422 @p what. */
static int rp_shape(struct rparse *c, const char *what)
{
    if (c->rd.err != 0)
        return rp_fail(c, "", "");
    return kvi_err__set(c->err, 422, NULL, NULL, -1, "invalid replica batch: %s", what);
}

int kvi_slot_parse_replica(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                           struct kvi_str *source, struct kvi_slots_event **evs, size_t *n_out,
                           struct kvi_api_err *err)
{
    *evs = NULL;
    *n_out = 0;
    *source = (struct kvi_str){NULL, 0};
    if (ct != KVI_CT_JSON && ct != KVI_CT_MSGPACK)
        return kvi_err__set(err, 415, NULL, NULL, -1,
                            "Expected request with `Content-Type: application/msgpack` or "
                            "`application/json`");
    struct rparse c = {.err = err};
    kvi_rd_init(&c.rd, body, len, ct == KVI_CT_MSGPACK ? KVI_ENC_MSGPACK : KVI_ENC_JSON, s);
    if (kvi_rd_obj_begin(&c.rd) != 0)
        return rp_shape(&c, "expected an object");
    struct kvi_str k;
    int r;
    bool have_events = false;
    size_t cap = 0;
    while ((r = kvi_rd_obj_next(&c.rd, &k)) == 1) {
        if (kvi_str_eq(k, "source")) {
            if (kvi_rd_str(&c.rd, source) != 0)
                return rp_shape(&c, "source: expected a string");
        } else if (kvi_str_eq(k, "events")) {
            if (kvi_rd_arr_begin(&c.rd) != 0)
                return rp_shape(&c, "events: expected an array");
            have_events = true;
            while ((r = kvi_rd_arr_next(&c.rd)) == 1) {
                if (*n_out == cap) {
                    cap = cap ? 2 * cap : 64;
                    *evs = kvi_xrealloc(*evs, cap * sizeof(**evs));
                }
                c.idx = *n_out;
                if (rp_event(&c, &(*evs)[*n_out]) != 0)
                    return -EINVAL;
                (*n_out)++;
            }
            if (r < 0)
                return rp_fail(&c, "", "");
        } else if (kvi_rd_skip(&c.rd) != 0) {
            return rp_fail(&c, "", "");
        }
    }
    if (r < 0 || kvi_rd_finish(&c.rd) != 0)
        return rp_fail(&c, "", "");
    if (!have_events)
        return kvi_err__set(err, 422, NULL, NULL, -1,
                            "invalid replica batch: missing field `events`");
    return 0;
}

/* ---- errors ------------------------------------------------------------------------------ */

/* A quoted string: at most 200 bytes, cut on a UTF-8 character boundary (the
 * answer is JSON, which must stay valid UTF-8). */
#define SK(p, n) (int)kvi_utf8_prefix((n) > 0 ? (p) : "", (n), 200), ((n) > 0 ? (p) : "")

int kvi_slot_err_engine(struct kvi_api_err *e, const struct kvi_slots_err *why,
                        const struct kvi_slots_key *key, const char *request_id,
                        size_t request_id_len)
{
    const char *m = key->model, *t = key->tenant, *rid = request_id;
    size_t ml = key->model_len, tl = key->tenant_len, rl = request_id != NULL ? request_id_len : 0;
    unsigned long long id = (unsigned long long)why->worker_id;
    switch (why->why) {
    case KVI_SLOTS_E_BLOCK_SIZE:
        return kvi_err__set(e, 400, NULL, NULL, -1, "block_size must be greater than 0");
    case KVI_SLOTS_E_DP_SIZE:
        return kvi_err__set(e, 400, NULL, NULL, -1, "dp_size must be greater than 0");
    case KVI_SLOTS_E_DP_RANGE:
        return kvi_err__set(e, 400, NULL, NULL, -1, "dp range overflows u32: start=%u size=%u",
                            why->dp_start, why->dp_size);
    case KVI_SLOTS_E_BLOCK_SIZE_MISMATCH:
        return kvi_err__set(e, 409, NULL, NULL, -1,
                            "block_size mismatch for model=%.*s tenant=%.*s: existing=%u, "
                            "requested=%u",
                            SK(m, ml), SK(t, tl), why->existing_block_size,
                            why->requested_block_size);
    case KVI_SLOTS_E_DUP_WORKER:
        return kvi_err__set(e, 409, NULL, NULL, -1,
                            "worker %llu already registered for model=%.*s tenant=%.*s", id,
                            SK(m, ml), SK(t, tl));
    case KVI_SLOTS_E_NO_WORKER:
        return kvi_err__set(e, 404, NULL, NULL, -1, "worker %llu not found for model=%.*s tenant=%.*s",
                            id, SK(m, ml), SK(t, tl));
    case KVI_SLOTS_E_NO_TRACKER:
        return kvi_err__set(e, 404, NULL, NULL, -1, "no slot tracker for model=%.*s tenant=%.*s",
                            SK(m, ml), SK(t, tl));
    case KVI_SLOTS_E_NO_RANK:
        return kvi_err__set(e, 404, NULL, NULL, -1,
                            "Worker WorkerWithDpRank { worker_id: %llu, dp_rank: %u } not found", id,
                            why->dp_rank);
    case KVI_SLOTS_E_DUP_REQUEST:
        return kvi_err__set(e, 409, NULL, NULL, -1,
                            "Request %.*s already exists (assigned to worker WorkerWithDpRank { "
                            "worker_id: %llu, dp_rank: %u })",
                            SK(rid, rl), id, why->dp_rank);
    case KVI_SLOTS_E_NO_REQUEST:
        return kvi_err__set(e, 404, NULL, NULL, -1, "Request %.*s not found", SK(rid, rl));
    case KVI_SLOTS_E_TOO_MANY_RANKS:
        return kvi_err__set(e, 400, NULL, NULL, -1,
                            "too many ranks for model=%.*s tenant=%.*s: %u registered, dp_size=%u, "
                            "limit %u",
                            SK(m, ml), SK(t, tl), why->ranks, why->dp_size, why->max_ranks);
    case KVI_SLOTS_E_TOO_MANY_TRACKERS:
        return kvi_err__set(e, 429, NULL, NULL, -1,
                            "too many models: %u slot trackers (model x tenant) exist, the most "
                            "--slot-max-models allows; model=%.*s tenant=%.*s not created",
                            why->trackers, SK(m, ml), SK(t, tl));
    case KVI_SLOTS_E_DP_SIZE_LIMIT:
        return kvi_err__set(e, 400, NULL, NULL, -1,
                            "dp_size %u exceeds the limit %u (--slot-max-dp-size)", why->dp_size,
                            why->max_dp_size);
    case KVI_SLOTS_OK:
        break;
    }
    return kvi_err__set(e, 500, NULL, NULL, -1, "internal error");
}

int kvi_slot_err_route_not_found(struct kvi_api_err *e)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "route not found");
}

int kvi_slot_err_method(struct kvi_api_err *e)
{
    return kvi_err__set(e, 405, NULL, NULL, -1, "method not allowed");
}

int kvi_slot_err_too_large(struct kvi_api_err *e)
{
    return kvi_err__set(e, 413, NULL, NULL, -1,
                        "Failed to buffer the request body: length limit exceeded");
}

int kvi_slot_err_sync_disabled(struct kvi_api_err *e)
{
    return kvi_err__set(e, 409, NULL, NULL, -1, "replica sync is disabled");
}

int kvi_slot_err_peer_not_found(struct kvi_api_err *e)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "peer not found");
}

int kvi_slot_encode_err(const struct kvi_api_err *e, struct kvi_buf *out, const char **content_type)
{
    return kvi_err_encode(e, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, out, content_type);
}

/* ---- responses ------------------------------------------------------------------------------ */

static int done(const struct kvi_buf *out)
{
    return kvi_buf_ok(out) ? 0 : -ENOMEM;
}

int kvi_slot_encode_ok(struct kvi_buf *out)
{
    kvi_buf_puts(out, "{\"status\":\"ok\"}");
    return done(out);
}

int kvi_slot_encode_workers(const struct kvi_slots_worker *ws, size_t n, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_slots_worker *x = &ws[i];
        kvi_wr_obj(&w, 6);
        kvi_wr_keyz(&w, "worker_id");
        kvi_wr_u64(&w, x->worker_id);
        kvi_wr_keyz(&w, "model_name");
        kvi_wr_str(&w, x->model, x->model_len);
        kvi_wr_keyz(&w, "tenant_id");
        kvi_wr_str(&w, x->tenant, x->tenant_len);
        kvi_wr_keyz(&w, "block_size");
        kvi_wr_u64(&w, x->block_size);
        kvi_wr_keyz(&w, "dp_start");
        kvi_wr_u64(&w, x->dp_start);
        kvi_wr_keyz(&w, "dp_size");
        kvi_wr_u64(&w, x->dp_size);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    return done(out);
}

int kvi_slot_encode_loads(const struct kvi_slots_load *ls, size_t n, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_slots_load *x = &ls[i];
        kvi_wr_obj(&w, 6);
        kvi_wr_keyz(&w, "model_name");
        kvi_wr_str(&w, x->model, x->model_len);
        kvi_wr_keyz(&w, "tenant_id");
        kvi_wr_str(&w, x->tenant, x->tenant_len);
        kvi_wr_keyz(&w, "worker_id");
        kvi_wr_u64(&w, x->worker_id);
        kvi_wr_keyz(&w, "dp_rank");
        kvi_wr_u64(&w, x->dp_rank);
        kvi_wr_keyz(&w, "active_prefill_tokens");
        kvi_wr_u64(&w, x->active_prefill_tokens);
        kvi_wr_keyz(&w, "active_decode_blocks");
        kvi_wr_u64(&w, x->active_decode_blocks);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    return done(out);
}

int kvi_slot_encode_potential(const struct kvi_slots_potential *ps, size_t n, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_slots_potential *x = &ps[i];
        kvi_wr_obj(&w, 5);
        kvi_wr_keyz(&w, "worker_id");
        kvi_wr_u64(&w, x->worker_id);
        kvi_wr_keyz(&w, "dp_rank");
        kvi_wr_u64(&w, x->dp_rank);
        kvi_wr_keyz(&w, "potential_prefill_tokens");
        kvi_wr_u64(&w, x->potential_prefill_tokens);
        kvi_wr_keyz(&w, "potential_decode_blocks");
        kvi_wr_u64(&w, x->potential_decode_blocks);
        kvi_wr_keyz(&w, "active_requests");
        kvi_wr_u64(&w, x->active_requests);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    return done(out);
}

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int kvi_slot_encode_peers(const char *const *urls, size_t n, struct kvi_buf *out)
{
    const char **sorted = kvi_xmalloc((n ? n : 1) * sizeof(*sorted));
    if (n > 0)
        memcpy(sorted, urls, n * sizeof(*sorted));
    if (n > 1)
        qsort(sorted, n, sizeof(*sorted), str_ptr_cmp);
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        kvi_wr_strz(&w, sorted[i]);
    kvi_wr_end(&w);
    free(sorted);
    return done(out);
}
