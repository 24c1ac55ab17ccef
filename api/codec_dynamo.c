/*
 * Dynamo standalone indexer dialect (http-api.md §1): request parsers and
 * response encoders. Error texts follow axum + serde_json (§1.4), answered as
 * JSON {"error": ...} as decided for kvidx.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "api/codec_internal.h"

#define F(name, kind, flags, bit, type, member)                                                    \
    {name, kind, flags, bit, (uint16_t)offsetof(type, member), 0}
#define FA(name, kind, flags, bit, type, member, count)                                            \
    {name, kind, flags, bit, (uint16_t)offsetof(type, member), (uint16_t)offsetof(type, count)}

/* ---- requests ---------------------------------------------------------------------- */

static const struct kvi_field reg_fields[] = {
    F("instance_id", KVI_FK_U64, KVI_FF_REQ, 0, struct kvi_dyn_register, instance_id),
    F("endpoint", KVI_FK_STR, KVI_FF_REQ, 1, struct kvi_dyn_register, endpoint),
    /* non-empty: the index keys namespaces by model (an empty one was a bare 500) */
    F("model_name", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 2, struct kvi_dyn_register, model_name),
    F("block_size", KVI_FK_U32_NZ, KVI_FF_REQ, 3, struct kvi_dyn_register, block_size),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 4, struct kvi_dyn_register, tenant_id),
    F("dp_rank", KVI_FK_U32, KVI_FF_NULL, 5, struct kvi_dyn_register, dp_rank),
    F("replay_endpoint", KVI_FK_STR, KVI_FF_NULL, 6, struct kvi_dyn_register, replay_endpoint),
    F("additional_salt", KVI_FK_STR, KVI_FF_NULL, 7, struct kvi_dyn_register, additional_salt),
    F("additionalsalt", KVI_FK_STR, KVI_FF_NULL, 7, struct kvi_dyn_register, additional_salt),
    /* kvidx extension: the rank's block pool, pre-sizes the index (api/service_capacity.c) */
    F("capacity_blocks", KVI_FK_U64_NZ, KVI_FF_NULL, 8, struct kvi_dyn_register, capacity_blocks),
};

int kvi_dyn_parse_register(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                           struct kvi_dyn_register *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, "RegisterRequest", body, len, ct, false, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, reg_fields, KVI_ARRAY_LEN(reg_fields), out, &seen);
    if (r != 0)
        return r;
    if (!(seen & KVI_BIT(4)))
        out->tenant_id = kvi_str_default;
    out->has_replay = (seen & KVI_BIT(6)) != 0;
    out->has_salt = (seen & KVI_BIT(7)) != 0;
    out->has_capacity = (seen & KVI_BIT(8)) != 0;
    const char *why;
    if (!kvi_endpoint_valid(out->endpoint.p, out->endpoint.len, &why))
        return kvi_err__set(err, 400, NULL, NULL, -1, "invalid endpoint `%.*s`: %s",
                            (int)kvi_utf8_prefix(out->endpoint.p, out->endpoint.len, 200),
                            out->endpoint.p, why);
    if (out->has_replay &&
        !kvi_endpoint_valid(out->replay_endpoint.p, out->replay_endpoint.len, &why))
        return kvi_err__set(err, 400, NULL, NULL, -1, "invalid replay_endpoint `%.*s`: %s",
                            (int)kvi_utf8_prefix(out->replay_endpoint.p, out->replay_endpoint.len,
                                                 200),
                            out->replay_endpoint.p, why);
    return 0;
}

static const struct kvi_field unreg_fields[] = {
    F("instance_id", KVI_FK_U64, KVI_FF_REQ, 0, struct kvi_dyn_unregister, instance_id),
    F("model_name", KVI_FK_STR, KVI_FF_REQ, 1, struct kvi_dyn_unregister, model_name),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 2, struct kvi_dyn_unregister, tenant_id),
    F("dp_rank", KVI_FK_U32, KVI_FF_NULL, 3, struct kvi_dyn_unregister, dp_rank),
};

int kvi_dyn_parse_unregister(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                             struct kvi_dyn_unregister *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, "UnregisterRequest", body, len, ct, false, s,
                             err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, unreg_fields, KVI_ARRAY_LEN(unreg_fields), out, &seen);
    if (r != 0)
        return r;
    out->has_tenant = (seen & KVI_BIT(2)) != 0;
    out->has_dp_rank = (seen & KVI_BIT(3)) != 0;
    return 0;
}

static const struct kvi_field query_fields[] = {
    FA("token_ids", KVI_FK_TOKENS, KVI_FF_REQ, 0, struct kvi_dyn_query, token_ids, n_tokens),
    F("model_name", KVI_FK_STR, KVI_FF_REQ, 1, struct kvi_dyn_query, model_name),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 2, struct kvi_dyn_query, tenant_id),
    F("lora_name", KVI_FK_STR, KVI_FF_NULL, 3, struct kvi_dyn_query, lora_name),
    F("cache_salt", KVI_FK_STR, KVI_FF_NULL, 4, struct kvi_dyn_query, cache_salt),
};

int kvi_dyn_parse_query(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                        struct kvi_dyn_query *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, "QueryRequest", body, len, ct, true, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, query_fields, KVI_ARRAY_LEN(query_fields), out, &seen);
    if (r != 0)
        return r;
    if (!(seen & KVI_BIT(2)))
        out->tenant_id = kvi_str_default;
    return 0;
}

static const struct kvi_field qbh_fields[] = {
    FA("block_hashes", KVI_FK_HASHES, KVI_FF_REQ, 0, struct kvi_dyn_query_hash, block_hashes,
       n_hashes),
    F("model_name", KVI_FK_STR, KVI_FF_REQ, 1, struct kvi_dyn_query_hash, model_name),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 2, struct kvi_dyn_query_hash, tenant_id),
    F("cache_salt", KVI_FK_STR, KVI_FF_NULL, 3, struct kvi_dyn_query_hash, cache_salt),
};

int kvi_dyn_parse_query_by_hash(const void *body, size_t len, enum kvi_ctype ct,
                                struct kvi_scratch *s, struct kvi_dyn_query_hash *out,
                                struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, "QueryByHashRequest", body, len, ct, true, s,
                             err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, qbh_fields, KVI_ARRAY_LEN(qbh_fields), out, &seen);
    if (r != 0)
        return r;
    if (!(seen & KVI_BIT(2)))
        out->tenant_id = kvi_str_default;
    return 0;
}

static const struct kvi_field peer_fields[] = {
    F("url", KVI_FK_STR, KVI_FF_REQ, 0, struct kvi_dyn_peer, url),
};

int kvi_dyn_parse_peer(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                       struct kvi_dyn_peer *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, "PeerRequest", body, len, ct, false, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, peer_fields, KVI_ARRAY_LEN(peer_fields), out, &seen);
    return r;
}

static const struct kvi_field zbind_fields[] = {
    F("endpoint", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 0, struct kvi_dyn_zbind, endpoint),
    F("block_size", KVI_FK_U32_NZ, KVI_FF_NULL, 1, struct kvi_dyn_zbind, block_size),
};

int kvi_dyn_parse_zbind(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s, bool unbind,
                        struct kvi_dyn_zbind *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, unbind ? "ZmqUnbindRequest" : "ZmqBindRequest", body, len, ct,
                             false, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, zbind_fields, unbind ? 1 : KVI_ARRAY_LEN(zbind_fields), out, &seen);
    return r;
}

static const struct kvi_field nats_fields[] = {
    F("subject", KVI_FK_STR, KVI_FF_NULL | KVI_FF_NONEMPTY, 0, struct kvi_dyn_nats_source, subject),
    F("stream", KVI_FK_STR, KVI_FF_NULL | KVI_FF_NONEMPTY, 1, struct kvi_dyn_nats_source, stream),
    F("model_name", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 2, struct kvi_dyn_nats_source, model_name),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 3, struct kvi_dyn_nats_source, tenant_id),
    F("block_size", KVI_FK_U32_NZ, KVI_FF_REQ, 4, struct kvi_dyn_nats_source, block_size),
};

int kvi_dyn_parse_nats_source(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                              struct kvi_dyn_nats_source *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, "NatsSourceRequest", body, len, ct, false, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, nats_fields, KVI_ARRAY_LEN(nats_fields), out, &seen);
    if (r != 0)
        return r;
    if (!(seen & KVI_BIT(3)))
        out->tenant_id = kvi_str_default;
    if (out->subject.len == 0 && out->stream.len == 0)
        return kvi_err__set(err, 400, NULL, NULL, -1, "a NATS source needs a subject (Core NATS) or a stream");
    return 0;
}

static const struct kvi_field lctl_fields[] = {
    F("instance_id", KVI_FK_U64, KVI_FF_REQ, 0, struct kvi_dyn_listener_ctl, instance_id),
    F("dp_rank", KVI_FK_U32, KVI_FF_NULL, 1, struct kvi_dyn_listener_ctl, dp_rank),
};

int kvi_dyn_parse_listener_ctl(const void *body, size_t len, enum kvi_ctype ct,
                               struct kvi_scratch *s, struct kvi_dyn_listener_ctl *out,
                               struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_DYNAMO, "ListenerControlRequest", body, len, ct, false,
                             s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, lctl_fields, KVI_ARRAY_LEN(lctl_fields), out, &seen);
    return r;
}

/* application/x-www-form-urlencoded decoding; invalid escapes stay literal. */
static int form_decode(const char *p, size_t n, struct kvi_scratch *s, struct kvi_str *out)
{
    if (memchr(p, '%', n) == NULL && memchr(p, '+', n) == NULL) {
        out->p = p;
        out->len = n;
        return 0;
    }
    char *d = kvi_scratch_alloc(s, n + 1);
    if (d == NULL)
        return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '+') {
            d[k++] = ' ';
        } else if (p[i] == '%' && i + 2 < n && kvi_hexval(p[i + 1]) >= 0 && kvi_hexval(p[i + 2]) >= 0) {
            d[k++] = (char)(kvi_hexval(p[i + 1]) << 4 | kvi_hexval(p[i + 2]));
            i += 2;
        } else {
            d[k++] = p[i];
        }
    }
    d[k] = '\0';
    out->p = d;
    out->len = k;
    return 0;
}

int kvi_dyn_parse_workers_filter(const char *query, size_t len, struct kvi_scratch *s,
                                 struct kvi_dyn_workers_filter *out, struct kvi_api_err *err)
{
    memset(out, 0, sizeof(*out));
    while (len > 0) {
        const char *amp = memchr(query, '&', len);
        size_t part = amp ? (size_t)(amp - query) : len;
        const char *eq = memchr(query, '=', part);
        size_t klen = eq ? (size_t)(eq - query) : part;
        const char *v = eq ? eq + 1 : query + part;
        size_t vlen = eq ? part - klen - 1 : 0;
        struct kvi_str key, val;
        if (form_decode(query, klen, s, &key) != 0 || form_decode(v, vlen, s, &val) != 0) {
            kvi_err__set(err, 500, NULL, NULL, -1, "out of memory while parsing the query string");
            return -ENOMEM;
        }
        if (kvi_str_eq(key, "model_name")) {
            out->model_name = val;
            out->has_model = true;
        } else if (kvi_str_eq(key, "tenant_id")) {
            out->tenant_id = val;
            out->has_tenant = true;
        }
        if (amp == NULL)
            break;
        query = amp + 1;
        len -= part + 1;
    }
    return 0;
}

/* ---- handler-detected errors ------------------------------------------------------ */

/* A quoted string: at most 200 bytes, cut on a UTF-8 character boundary (the
 * answer is JSON, which must stay valid UTF-8). */
#define SF(s) (int)kvi_utf8_prefix((s).p, (s).len, 200), (s).p

int kvi_dyn_err_instance_elsewhere(struct kvi_api_err *e, uint64_t id, struct kvi_str model,
                                   struct kvi_str tenant)
{
    return kvi_err__set(e, 409, NULL, NULL, -1,
                        "instance %llu is already registered for model=%.*s tenant=%.*s",
                        (unsigned long long)id, SF(model), SF(tenant));
}

int kvi_dyn_err_rank_taken(struct kvi_api_err *e, uint64_t id, uint32_t rank)
{
    return kvi_err__set(e, 409, NULL, NULL, -1, "instance %llu dp_rank %u already registered",
                        (unsigned long long)id, rank);
}

int kvi_dyn_err_block_size(struct kvi_api_err *e, struct kvi_str model, struct kvi_str tenant,
                           uint32_t existing, uint32_t requested)
{
    return kvi_err__set(e, 409, NULL, NULL, -1,
                        "block_size mismatch for model=%.*s tenant=%.*s: existing=%u, requested=%u",
                        SF(model), SF(tenant), existing, requested);
}

int kvi_dyn_err_instance_not_found(struct kvi_api_err *e, uint64_t id)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "instance %llu not found", (unsigned long long)id);
}

int kvi_dyn_err_instance_other_ns(struct kvi_api_err *e, uint64_t id, struct kvi_str model,
                                  struct kvi_str tenant)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "instance %llu is registered for model=%.*s tenant=%.*s",
                        (unsigned long long)id, SF(model), SF(tenant));
}

int kvi_dyn_err_rank_not_found(struct kvi_api_err *e, uint64_t id, uint32_t rank)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "instance %llu dp_rank %u not found",
                        (unsigned long long)id, rank);
}

int kvi_dyn_err_no_indexer(struct kvi_api_err *e, struct kvi_str model, struct kvi_str tenant)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "no indexer for model=%.*s tenant=%.*s", SF(model),
                        SF(tenant));
}

int kvi_dyn_err_peer_not_found(struct kvi_api_err *e)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "peer not found");
}

int kvi_dyn_err_nats(struct kvi_api_err *e, int status, const char *what)
{
    return kvi_err__set(e, status, NULL, NULL, -1, "%s", what);
}

int kvi_dyn_err_zbind(struct kvi_api_err *e, int status, const char *endpoint, const char *what)
{
    return kvi_err__set(e, status, NULL, NULL, -1, "zmq-bind %.200s: %s", endpoint, what);
}

int kvi_dyn_err_listener_not_found(struct kvi_api_err *e, uint64_t id, uint32_t rank)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "listener for instance %llu dp_rank %u not found",
                        (unsigned long long)id, rank);
}

int kvi_dyn_err_listener_state(struct kvi_api_err *e, uint64_t id, uint32_t rank,
                               const char *status, bool pausing)
{
    return kvi_err__set(e, 409, NULL, NULL, -1, "listener for instance %llu dp_rank %u is %s: %s",
                        (unsigned long long)id, rank, status,
                        pausing ? "not pausable" : "not resumable");
}

int kvi_dyn_err_listener_failed(struct kvi_api_err *e, uint64_t id, uint32_t rank, const char *why)
{
    return kvi_err__set(e, 503, NULL, NULL, -1, "instance %llu dp_rank %u not registered: its listener failed: %.300s",
                        (unsigned long long)id, rank, why);
}

int kvi_dyn_err_bad_name(struct kvi_api_err *e, const char *field, const char *detail)
{
    return kvi_err__set(e, 422, NULL, NULL, -1,
                        "Failed to deserialize the JSON body into the target type: %s: %s", field, detail);
}

/* ---- responses ---------------------------------------------------------------------- */

static int done(const struct kvi_buf *out)
{
    return kvi_buf_ok(out) ? 0 : -ENOMEM;
}

static inline bool row_any(const struct kvi_score_row *r)
{
    return r->gpu > 0 || r->cpu > 0 || r->disk > 0;
}

/*
 * The score response is written straight into memory sized by
 * kvi_dyn_scores_max_len: it is the hot path of /query and /query_by_hash.
 * 16 single-rank instances (bench/http.sh): msgpack 4.2 us -> 0.3 us, JSON
 * 6.6 us -> 0.47 us, 48 k -> 5 k instructions, against kvi_wr_*, whose bytes
 * these are (tests/api/codec_dynamo_test.c compares).
 */

size_t kvi_dyn_scores_max_len(const struct kvi_score_row *rows, size_t n)
{
    /* Per row, at worst an instance of its own in each of the three maps:
     * its key three times, and in JSON at most 38 bytes in scores and in
     * tree_sizes (`,{"<rank>":<value>}` and separators) and 167 in instances
     * (five 20-digit values, the fixed keys and the rank); msgpack is
     * shorter. 128 bytes cover the fixed keys of the document. */
    size_t len = 128;
    for (size_t i = 0; i < n; i++)
        len += 3 * kvi_rows__key_max_len(&rows[i]) + 256;
    return len;
}

/* The per-(instance, rank) map of scores or tree sizes. */
static inline __attribute__((always_inline)) char *put_rank_map(char *o, const struct kvi_score_row *rows, size_t n,
                                                                uint32_t bs, bool tree, uint32_t n_inst, bool single,
                                                                bool mp)
{
    o = kvi__w_map(o, n_inst, mp);
    bool first = true;
    for (size_t i = 0, j; i < n; i = j) {
        uint32_t ng = 0;
        j = single ? i + 1 : rows[i]._end;
        for (size_t k = i; k < j; k++)
            ng += rows[k].gpu > 0;
        if (ng == 0)
            continue;
        o = kvi__w_sep(o, first, mp);
        first = false;
        o = kvi_rows__w_key(o, &rows[i], mp);
        o = kvi__w_map(o, ng, mp);
        bool first_rank = true;
        for (size_t k = i; k < j; k++) {
            if (rows[k].gpu == 0)
                continue;
            o = kvi__w_sep(o, first_rank, mp);
            first_rank = false;
            o = kvi__w_dec_key(o, rows[k].dp_rank, mp);
            o = kvi__w_uint(o, tree ? rows[k].tree_size : (uint64_t)rows[k].gpu * bs, mp);
        }
        o = kvi__w_end_map(o, mp);
    }
    return kvi__w_end_map(o, mp);
}

/* "instances": per instance with any tier, maxima and the per-rank gpu map. */
static inline __attribute__((always_inline)) char *put_instances(char *o, const struct kvi_score_row *rows, size_t n,
                                                                 uint32_t bs, uint32_t n_inst, bool single, bool mp)
{
    o = kvi__w_map(o, n_inst, mp);
    bool first = true;
    for (size_t i = 0, j; i < n; i = j) {
        uint32_t na = 0;
        uint64_t g = 0, c = 0, d = 0;
        j = single ? i + 1 : rows[i]._end;
        for (size_t k = i; k < j; k++) {
            na += row_any(&rows[k]);
            g = KVI_MAX(g, rows[k].gpu);
            c = KVI_MAX(c, rows[k].cpu);
            d = KVI_MAX(d, rows[k].disk);
        }
        if (na == 0)
            continue;
        uint64_t lm = KVI_MAX(g, KVI_MAX(c, d));
        o = kvi__w_sep(o, first, mp);
        first = false;
        o = kvi_rows__w_key(o, &rows[i], mp);
        o = kvi__w_map(o, 5, mp);
        o = KVI__W_KEY(o, mp, "longest_matched");
        o = kvi__w_uint(o, lm * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "gpu");
        o = kvi__w_uint(o, g * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "dp");
        o = kvi__w_map(o, na, mp);
        bool first_rank = true;
        for (size_t k = i; k < j; k++) {
            if (!row_any(&rows[k]))
                continue;
            o = kvi__w_sep(o, first_rank, mp);
            first_rank = false;
            o = kvi__w_dec_key(o, rows[k].dp_rank, mp);
            o = kvi__w_uint(o, (uint64_t)rows[k].gpu * bs, mp);
        }
        o = kvi__w_end_map(o, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "cpu");
        o = kvi__w_uint(o, c * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "disk");
        o = kvi__w_uint(o, d * bs, mp);
        o = kvi__w_end_map(o, mp);
    }
    return kvi__w_end_map(o, mp);
}

/* The whole answer on sorted and grouped rows, inlined once per encoding
 * and per @p single (every instance has one row, the common case: no
 * per-instance inner loops) as constants, so no write tests them. */
static inline __attribute__((always_inline)) size_t encode_scores(const struct kvi_score_row *rows, size_t n,
                                                                  uint32_t block_size, enum kvi_score_form form,
                                                                  bool single, bool mp, char *dst)
{
    uint32_t inst_gpu = 0, inst_any = 0;
    if (mp) { /* map sizes go first in msgpack */
        for (size_t i = 0, j; i < n; i = j) {
            bool ng = false, na = false;
            size_t end = single ? i + 1 : rows[i]._end;
            for (j = i; j < end; j++) {
                ng |= rows[j].gpu > 0;
                na |= row_any(&rows[j]);
            }
            inst_gpu += ng;
            inst_any += na;
        }
    }
    char *o = kvi__w_map(dst, form == KVI_SCORE_FULL ? 4 : 3, mp);
    o = KVI__W_KEY(o, mp, "scores");
    o = put_rank_map(o, rows, n, block_size, false, inst_gpu, single, mp);
    o = kvi__w_sep(o, false, mp);
    o = KVI__W_KEY(o, mp, "frequencies");
    o = mp ? KVI__W_LIT(o, "\x90") : KVI__W_LIT(o, "[]");
    o = kvi__w_sep(o, false, mp);
    o = KVI__W_KEY(o, mp, "tree_sizes");
    o = put_rank_map(o, rows, n, block_size, true, inst_gpu, single, mp);
    if (form == KVI_SCORE_FULL) {
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "instances");
        o = put_instances(o, rows, n, block_size, inst_any, single, mp);
    }
    o = kvi__w_end_map(o, mp);
    return (size_t)(o - dst);
}

size_t kvi_dyn_encode_scores_to(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                                enum kvi_score_form form, enum kvi_body_enc enc, char *dst)
{
    kvi_rows__sort(rows, n);
    bool single = kvi_rows__group(rows, n) == n;
    if (enc == KVI_ENC_MSGPACK)
        return single ? encode_scores(rows, n, block_size, form, true, true, dst)
                      : encode_scores(rows, n, block_size, form, false, true, dst);
    return single ? encode_scores(rows, n, block_size, form, true, false, dst)
                  : encode_scores(rows, n, block_size, form, false, false, dst);
}

int kvi_dyn_encode_scores(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                          enum kvi_score_form form, enum kvi_body_enc enc, struct kvi_buf *out)
{
    char *o = kvi_buf_reserve(out, kvi_dyn_scores_max_len(rows, n));
    if (o == NULL)
        return -ENOMEM;
    out->len += kvi_dyn_encode_scores_to(rows, n, block_size, form, enc, o);
    return 0;
}

int kvi_dyn_encode_ok(struct kvi_buf *out)
{
    kvi_buf_puts(out, "{\"status\":\"ok\"}");
    return done(out);
}

const char *kvi_listener_status_name(enum kvi_listener_status s)
{
    switch (s) {
    case KVI_LS_PENDING: return "pending";
    case KVI_LS_ACTIVE: return "active";
    case KVI_LS_PAUSED: return "paused";
    case KVI_LS_FAILED: return "failed";
    }
    return "unknown";
}

/* Aggregate priority failed > pending > active > paused. */
static enum kvi_listener_status worker_status(const struct kvi_worker_view *w)
{
    static const int prio[4] = {[KVI_LS_FAILED] = 3, [KVI_LS_PENDING] = 2, [KVI_LS_ACTIVE] = 1,
                                [KVI_LS_PAUSED] = 0};
    if (w->n_listeners == 0)
        return KVI_LS_ACTIVE;
    enum kvi_listener_status best = w->listeners[0].status;
    for (size_t i = 1; i < w->n_listeners; i++)
        if (prio[w->listeners[i].status] > prio[best])
            best = w->listeners[i].status;
    return best;
}

int kvi_dyn_encode_workers(const struct kvi_worker_view *ws, size_t n, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_worker_view *x = &ws[i];
        kvi_wr_obj(&w, 8);
        kvi_wr_keyz(&w, "instance_id");
        if (x->instance_name != NULL)
            kvi_wr_strz(&w, x->instance_name);
        else
            kvi_wr_u64(&w, x->instance_id);
        kvi_wr_keyz(&w, "model_name");
        kvi_wr_strz(&w, x->model_name ? x->model_name : "");
        kvi_wr_keyz(&w, "tenant_id");
        kvi_wr_strz(&w, x->tenant_id ? x->tenant_id : "");
        kvi_wr_keyz(&w, "block_size");
        kvi_wr_u64(&w, x->block_size);
        kvi_wr_keyz(&w, "source");
        kvi_wr_strz(&w, x->source ? x->source : "zmq");
        kvi_wr_keyz(&w, "status");
        kvi_wr_strz(&w, kvi_listener_status_name(worker_status(x)));
        kvi_wr_keyz(&w, "endpoints");
        kvi_wr_obj(&w, (uint32_t)x->n_listeners);
        for (size_t k = 0; k < x->n_listeners; k++) {
            kvi_wr_key_u64(&w, x->listeners[k].dp_rank);
            kvi_wr_strz(&w, x->listeners[k].endpoint ? x->listeners[k].endpoint : "");
        }
        kvi_wr_end(&w);
        kvi_wr_keyz(&w, "listeners");
        kvi_wr_obj(&w, (uint32_t)x->n_listeners);
        for (size_t k = 0; k < x->n_listeners; k++) {
            const struct kvi_listener_view *l = &x->listeners[k];
            kvi_wr_key_u64(&w, l->dp_rank);
            kvi_wr_obj(&w, (l->last_error ? 3 : 2) + (l->has_liveness ? 3 : 0) + (l->capacity_blocks ? 1 : 0));
            kvi_wr_keyz(&w, "endpoint");
            kvi_wr_strz(&w, l->endpoint ? l->endpoint : "");
            if (l->capacity_blocks) {
                kvi_wr_keyz(&w, "capacity_blocks");
                kvi_wr_u64(&w, l->capacity_blocks);
            }
            kvi_wr_keyz(&w, "status");
            kvi_wr_strz(&w, kvi_listener_status_name(l->status));
            if (l->last_error) {
                kvi_wr_keyz(&w, "last_error");
                kvi_wr_strz(&w, l->last_error);
            }
            if (l->has_liveness) {
                kvi_wr_keyz(&w, "messages");
                kvi_wr_u64(&w, l->messages);
                kvi_wr_keyz(&w, "seconds_since_last_message");
                if (l->has_last_message)
                    kvi_wr_u64(&w, l->seconds_since_last_message);
                else
                    kvi_wr_null(&w);
                kvi_wr_keyz(&w, "connected");
                if (l->connected < 0)
                    kvi_wr_null(&w);
                else
                    kvi_wr_bool(&w, l->connected > 0);
            }
            kvi_wr_end(&w);
        }
        kvi_wr_end(&w);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    return done(out);
}

/* "nats_bridge": the stream, its counters and each namespace's subject filter (kvidx, --nats-publish). */
static void encode_bridge(struct kvi_wr *w, const struct kvi_status_view *st)
{
    const struct kvi_nats_bridge_stats *s = &st->bridge;
    kvi_wr_keyz(w, "nats_bridge");
    kvi_wr_obj(w, 12);
    kvi_wr_keyz(w, "stream");
    kvi_wr_strz(w, st->bridge_stream ? st->bridge_stream : "");
    kvi_wr_keyz(w, "stream_ready");
    kvi_wr_bool(w, s->stream_ready);
    const struct {
        const char *k;
        uint64_t v;
    } f[] = {{"events", s->events},   {"acked", s->acked},   {"duplicates", s->duplicates},
             {"errors", s->errors},   {"dropped", s->dropped}, {"queued", s->queued},
             {"pending", s->pending}, {"skipped", s->skipped}, {"namespaces_total", st->n_bridge_ns}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        kvi_wr_keyz(w, f[i].k);
        kvi_wr_u64(w, f[i].v);
    }
    size_t n = st->n_bridge_ns < KVI_STATUS_BRIDGE_NS ? st->n_bridge_ns : KVI_STATUS_BRIDGE_NS;
    kvi_wr_keyz(w, "namespaces");
    kvi_wr_arr(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_nats_bridge_ns_view *v = &st->bridge_ns[i];
        kvi_wr_obj(w, 3);
        kvi_wr_keyz(w, "model_name");
        kvi_wr_strz(w, v->model);
        kvi_wr_keyz(w, "tenant_id");
        kvi_wr_strz(w, v->tenant);
        kvi_wr_keyz(w, "subject");
        kvi_wr_strz(w, v->subject);
        kvi_wr_end(w);
    }
    kvi_wr_end(w);
    kvi_wr_end(w);
}

int kvi_dyn_encode_status(const struct kvi_status_view *st, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_obj(&w, (st->has_nats ? 6 : 5) + (st->has_bridge ? 1 : 0));
    kvi_wr_keyz(&w, "ready");
    kvi_wr_bool(&w, st->ready);
    kvi_wr_keyz(&w, "reason");
    kvi_wr_strz(&w, st->reason ? st->reason : (st->ready ? "ready" : ""));
    kvi_wr_keyz(&w, "recovery");
    kvi_wr_obj(&w, st->last_result ? 3 : 2);
    kvi_wr_keyz(&w, "enabled");
    kvi_wr_bool(&w, st->recovery_enabled);
    kvi_wr_keyz(&w, "in_progress");
    kvi_wr_bool(&w, st->recovery_in_progress);
    if (st->last_result) {
        kvi_wr_keyz(&w, "last_result");
        kvi_wr_strz(&w, st->last_result);
    }
    kvi_wr_end(&w);
    kvi_wr_keyz(&w, "workers");
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "required_initial");
    kvi_wr_u64(&w, st->required_initial);
    kvi_wr_keyz(&w, "registered");
    kvi_wr_u64(&w, st->registered);
    kvi_wr_end(&w);
    kvi_wr_keyz(&w, "listeners");
    kvi_wr_obj(&w, 4);
    kvi_wr_keyz(&w, "pending");
    kvi_wr_u64(&w, st->pending);
    kvi_wr_keyz(&w, "active");
    kvi_wr_u64(&w, st->active);
    kvi_wr_keyz(&w, "paused");
    kvi_wr_u64(&w, st->paused);
    kvi_wr_keyz(&w, "failed");
    kvi_wr_u64(&w, st->failed);
    kvi_wr_end(&w);
    if (st->has_nats) {
        kvi_wr_keyz(&w, "nats");
        kvi_wr_obj(&w, 2);
        kvi_wr_keyz(&w, "connected");
        kvi_wr_bool(&w, st->nats_connected);
        kvi_wr_keyz(&w, "pending");
        kvi_wr_u64(&w, st->nats_pending);
        kvi_wr_end(&w);
    }
    if (st->has_bridge)
        encode_bridge(&w, st);
    kvi_wr_end(&w);
    return done(out);
}

int kvi_dyn_encode_ready(bool ready, const char *reason, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "ready");
    kvi_wr_bool(&w, ready);
    kvi_wr_keyz(&w, "reason");
    kvi_wr_strz(&w, reason ? reason : (ready ? "ready" : ""));
    kvi_wr_end(&w);
    return done(out);
}

int kvi_dyn_encode_peers(const char *const *urls, size_t n, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        kvi_wr_strz(&w, urls[i]);
    kvi_wr_end(&w);
    return done(out);
}
