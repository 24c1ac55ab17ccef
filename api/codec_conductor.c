/*
 * Mooncake Conductor dialect (http-api.md §2): request parsers and response
 * encoders, JSON and msgpack. Validation errors are 400 with the §2.8 JSON
 * object; unknown fields are rejected as the Conductor implementation does,
 * except the documented extras kvidx accepts (§2.9).
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
#define FIGN(name, bit) {name, KVI_FK_IGNORE, KVI_FF_NULL, bit, 0, 0}

const char *kvi_cond_type_name(enum kvi_cond_type t)
{
    switch (t) {
    case KVI_COND_VLLM: return "vLLM";
    case KVI_COND_SGLANG: return "SGLang";
    case KVI_COND_MOONCAKE: return "Mooncake";
    }
    return "";
}

static struct kvi_str tenant_or_default(struct kvi_str t, bool given)
{
    return given && t.len > 0 ? t : kvi_str_default;
}

static int check_endpoint(struct kvi_api_err *err, const char *field, struct kvi_str ep)
{
    const char *why;
    if (kvi_endpoint_valid(ep.p, ep.len, &why))
        return 0;
    return kvi_err__set(err, 400, "invalid_value", field, -1, "%s is not a valid ZMQ endpoint: %s",
                        field, why);
}

/* ---- requests ----------------------------------------------------------------------- */

static const struct kvi_field reg_fields[] = {
    F("endpoint", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 0, struct kvi_cond_register, endpoint),
    F("replay_endpoint", KVI_FK_STR, KVI_FF_NULL, 1, struct kvi_cond_register, replay_endpoint),
    F("type", KVI_FK_TYPE, KVI_FF_REQ, 2, struct kvi_cond_register, type),
    F("modelname", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 3, struct kvi_cond_register,
      model_name),
    F("model", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 3, struct kvi_cond_register, model_name),
    F("lora_name", KVI_FK_STR, KVI_FF_NULL, 4, struct kvi_cond_register, lora_name),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 5, struct kvi_cond_register, tenant_id),
    F("instance_id", KVI_FK_STR, KVI_FF_NONEMPTY, 6, struct kvi_cond_register, instance_id),
    F("block_size", KVI_FK_POS_U32, KVI_FF_REQ, 7, struct kvi_cond_register, block_size),
    F("dp_rank", KVI_FK_RANK, KVI_FF_REQ, 8, struct kvi_cond_register, dp_rank),
    F("additionalsalt", KVI_FK_STR, KVI_FF_NULL, 9, struct kvi_cond_register, additional_salt),
    F("additional_salt", KVI_FK_STR, KVI_FF_NULL, 9, struct kvi_cond_register, additional_salt),
    F("cache_group", KVI_FK_CACHE_GROUP, KVI_FF_NULL, 10, struct kvi_cond_register,
      has_cache_group),
    F("hash_profile", KVI_FK_HASH_PROFILE, KVI_FF_NULL, 11, struct kvi_cond_register, hash_profile),
};

int kvi_cond_parse_register(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                            struct kvi_cond_register *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_CONDUCTOR, NULL, body, len, ct, true, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, reg_fields, KVI_ARRAY_LEN(reg_fields), out, &seen);
    if (r != 0)
        return r;
    out->tenant_id = tenant_or_default(out->tenant_id, seen & KVI_BIT(5));
    out->has_instance = (seen & KVI_BIT(6)) != 0;
    out->has_hash_profile = (seen & KVI_BIT(11)) != 0;
    if (!out->has_instance && out->type != KVI_COND_MOONCAKE)
        return kvi_err__set(err, 400, "missing", "instance_id", -1,
                            "missing required field: instance_id");
    if ((r = check_endpoint(err, "endpoint", out->endpoint)) != 0)
        return r;
    if (out->replay_endpoint.len > 0 &&
        (r = check_endpoint(err, "replay_endpoint", out->replay_endpoint)) != 0)
        return r;
    return 0;
}

static const struct kvi_field unreg_fields[] = {
    F("instance_id", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 0, struct kvi_cond_unregister,
      instance_id),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 1, struct kvi_cond_unregister, tenant_id),
    F("dp_rank", KVI_FK_RANK, KVI_FF_REQ, 2, struct kvi_cond_unregister, dp_rank),
    /* documented fields the implementation rejects; kvidx accepts and ignores them */
    FIGN("type", 3),
    FIGN("modelname", 4),
    FIGN("model", 4),
    FIGN("lora_name", 5),
    FIGN("block_size", 6),
};

int kvi_cond_parse_unregister(const void *body, size_t len, enum kvi_ctype ct,
                              struct kvi_scratch *s, struct kvi_cond_unregister *out,
                              struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_CONDUCTOR, NULL, body, len, ct, true, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, unreg_fields, KVI_ARRAY_LEN(unreg_fields), out, &seen);
    if (r != 0)
        return r;
    out->tenant_id = tenant_or_default(out->tenant_id, seen & KVI_BIT(1));
    return 0;
}

static const struct kvi_field query_fields[] = {
    F("model", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 0, struct kvi_cond_query, model),
    F("block_size", KVI_FK_POS_U32, KVI_FF_REQ, 1, struct kvi_cond_query, block_size),
    FA("token_ids", KVI_FK_TOKENS, KVI_FF_REQ, 2, struct kvi_cond_query, token_ids, n_tokens),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 3, struct kvi_cond_query, tenant_id),
    F("lora_name", KVI_FK_STR, KVI_FF_NULL, 4, struct kvi_cond_query, lora_name),
    F("instance_id", KVI_FK_STR, KVI_FF_NULL, 5, struct kvi_cond_query, instance_id),
    F("cache_salt", KVI_FK_STR, KVI_FF_NULL, 6, struct kvi_cond_query, cache_salt),
    FIGN("lora_id", 7),
};

int kvi_cond_parse_query(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                         struct kvi_cond_query *out, struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_CONDUCTOR, NULL, body, len, ct, true, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, query_fields, KVI_ARRAY_LEN(query_fields), out, &seen);
    if (r != 0)
        return r;
    out->tenant_id = tenant_or_default(out->tenant_id, seen & KVI_BIT(3));
    out->has_instance = out->instance_id.len > 0;
    return 0;
}

static const struct kvi_field qbh_fields[] = {
    F("model", KVI_FK_STR, KVI_FF_REQ | KVI_FF_NONEMPTY, 0, struct kvi_cond_query_hash, model),
    F("block_size", KVI_FK_POS_U32, KVI_FF_REQ, 1, struct kvi_cond_query_hash, block_size),
    FA("seq_hashes", KVI_FK_HASHES, KVI_FF_REQ, 2, struct kvi_cond_query_hash, seq_hashes,
       n_hashes),
    FA("block_hash", KVI_FK_HASHES, KVI_FF_REQ, 2, struct kvi_cond_query_hash, seq_hashes,
       n_hashes),
    F("tenant_id", KVI_FK_STR, KVI_FF_NULL, 3, struct kvi_cond_query_hash, tenant_id),
    F("lora_name", KVI_FK_STR, KVI_FF_NULL, 4, struct kvi_cond_query_hash, lora_name),
    F("instance_id", KVI_FK_STR, KVI_FF_NULL, 5, struct kvi_cond_query_hash, instance_id),
    F("cache_salt", KVI_FK_STR, KVI_FF_NULL, 6, struct kvi_cond_query_hash, cache_salt),
    FIGN("lora_id", 7),
};

int kvi_cond_parse_query_by_hash(const void *body, size_t len, enum kvi_ctype ct,
                                 struct kvi_scratch *s, struct kvi_cond_query_hash *out,
                                 struct kvi_api_err *err)
{
    struct kvi_pctx c;
    memset(out, 0, sizeof(*out));
    int r = kvi_parse__begin(&c, KVI_DIALECT_CONDUCTOR, NULL, body, len, ct, true, s, err);
    uint64_t seen;
    if (r == 0)
        r = kvi_parse__fields(&c, qbh_fields, KVI_ARRAY_LEN(qbh_fields), out, &seen);
    if (r != 0)
        return r;
    out->tenant_id = tenant_or_default(out->tenant_id, seen & KVI_BIT(3));
    out->has_instance = out->instance_id.len > 0;
    return 0;
}

/* ---- handler-detected errors ------------------------------------------------------- */

/* A quoted string: at most 200 bytes, cut on a UTF-8 character boundary (the
 * answer is JSON or text/plain; charset=utf-8). */
#define SF(s) (int)kvi_utf8_prefix((s).p, (s).len, 200), (s).p

int kvi_cond_err_conflict(struct kvi_api_err *e, struct kvi_str instance, struct kvi_str tenant,
                          uint32_t rank)
{
    return kvi_err__set(e, 400, "invalid_registration", NULL, -1,
                        "conflicting registration for service key: %.*s|%.*s|%u", SF(instance),
                        SF(tenant), rank);
}

int kvi_cond_err_endpoint_taken(struct kvi_api_err *e, struct kvi_str endpoint)
{
    return kvi_err__set(e, 400, "invalid_registration", "endpoint", -1,
                        "conflicting active registration for endpoint: %.*s", SF(endpoint));
}

int kvi_cond_err_hash_profile(struct kvi_api_err *e, struct kvi_str model)
{
    return kvi_err__set(e, 400, "invalid_registration", "hash_profile", -1,
                        "conflicting hash_profile for context: model=%.*s", SF(model));
}

int kvi_cond_err_service_not_found(struct kvi_api_err *e, struct kvi_str instance,
                                   struct kvi_str tenant, uint32_t rank)
{
    return kvi_err__set(e, 404, NULL, NULL, -1, "service not found: %.*s|%.*s|%u", SF(instance),
                        SF(tenant), rank);
}

/* ---- responses ---------------------------------------------------------------------- */

static int finish(struct kvi_buf *out, enum kvi_body_enc enc, bool newline)
{
    if (enc == KVI_ENC_JSON && newline)
        kvi_buf_putc(out, '\n');
    return kvi_buf_ok(out) ? 0 : -ENOMEM;
}

int kvi_cond_encode_registered(struct kvi_str instance_id, enum kvi_body_enc enc,
                               struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, enc);
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "status");
    kvi_wr_strz(&w, "registered successfully");
    kvi_wr_keyz(&w, "instance_id");
    kvi_wr_str(&w, instance_id.p, instance_id.len);
    kvi_wr_end(&w);
    return finish(out, enc, true);
}

int kvi_cond_encode_unregistered(const struct kvi_cond_key *keys, size_t n, enum kvi_body_enc enc,
                                 struct kvi_buf *out)
{
    struct kvi_wr w;
    struct kvi_buf tmp;
    kvi_buf_init(&tmp);
    kvi_wr_init(&w, out, enc);
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "status");
    kvi_wr_strz(&w, "unregistered successfully");
    kvi_wr_keyz(&w, "removed_instances");
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        kvi_buf_reset(&tmp);
        kvi_buf_put(&tmp, keys[i].instance.p, keys[i].instance.len);
        kvi_buf_putc(&tmp, '|');
        kvi_buf_put(&tmp, keys[i].tenant.p, keys[i].tenant.len);
        kvi_buf_putc(&tmp, '|');
        kvi_buf_put_u64(&tmp, keys[i].dp_rank);
        if (!kvi_buf_ok(&tmp))
            out->oom = true;
        kvi_wr_str(&w, tmp.data, tmp.len);
    }
    kvi_wr_end(&w);
    kvi_wr_end(&w);
    kvi_buf_free(&tmp);
    return finish(out, enc, true);
}

/*
 * The query response is written straight into memory sized by
 * kvi_cond_query_max_len (the /query hot path), with the bytes of the
 * kvi_wr_* writer (tests/api/codec_conductor_test.c compares).
 */

size_t kvi_cond_query_max_len(const struct kvi_score_row *rows, size_t n, struct kvi_str tenant)
{
    /* The tenant key (escaped) and the fixed keys; per row, at worst an
     * instance of its own: its key, ~150 bytes of maxima and keys, and
     * 34 + 98 bytes for its rank in DP and rank_matches (JSON, 20-digit
     * values; msgpack is shorter). */
    size_t len = 64 + 6 * tenant.len;
    for (size_t i = 0; i < n; i++)
        len += kvi_rows__key_max_len(&rows[i]) + 320;
    return len;
}

/* One instance's rows [i, j): per-rank maps and maxima. */
static inline __attribute__((always_inline)) char *put_instance(char *o, const struct kvi_score_row *rows, size_t i,
                                                                size_t j, uint32_t bs, bool docs, bool mp)
{
    uint64_t g = 0, c = 0, d = 0;
    for (size_t k = i; k < j; k++) {
        g = KVI_MAX(g, rows[k].gpu);
        c = KVI_MAX(c, rows[k].cpu);
        d = KVI_MAX(d, rows[k].disk);
    }
    uint64_t lm = KVI_MAX(g, KVI_MAX(c, d));
    uint32_t nr = (uint32_t)(j - i);
    o = kvi_rows__w_key(o, &rows[i], mp);
    o = kvi__w_map(o, 6, mp);
    o = KVI__W_KEY(o, mp, "longest_matched");
    o = kvi__w_uint(o, lm * bs, mp);
    o = kvi__w_sep(o, false, mp);
    if (docs) {
        o = KVI__W_KEY(o, mp, "GPU");
        o = kvi__w_uint(o, g * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "DP");
    } else {
        o = KVI__W_KEY(o, mp, "dp");
    }
    o = kvi__w_map(o, nr, mp);
    for (size_t k = i; k < j; k++) {
        o = kvi__w_sep(o, k == i, mp);
        o = kvi__w_dec_key(o, rows[k].dp_rank, mp);
        o = kvi__w_uint(o, (uint64_t)rows[k].gpu * bs, mp);
    }
    o = kvi__w_end_map(o, mp);
    o = kvi__w_sep(o, false, mp);
    if (docs) {
        o = KVI__W_KEY(o, mp, "CPU");
        o = kvi__w_uint(o, c * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "DISK");
        o = kvi__w_uint(o, d * bs, mp);
        o = kvi__w_sep(o, false, mp);
    }
    o = KVI__W_KEY(o, mp, "rank_matches");
    o = kvi__w_map(o, nr, mp);
    for (size_t k = i; k < j; k++) {
        o = kvi__w_sep(o, k == i, mp);
        o = kvi__w_dec_key(o, rows[k].dp_rank, mp);
        o = kvi__w_map(o, 3, mp);
        o = KVI__W_KEY(o, mp, "gpu");
        o = kvi__w_uint(o, (uint64_t)rows[k].gpu * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "cpu");
        o = kvi__w_uint(o, (uint64_t)rows[k].cpu * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "disk");
        o = kvi__w_uint(o, (uint64_t)rows[k].disk * bs, mp);
        o = kvi__w_end_map(o, mp);
    }
    o = kvi__w_end_map(o, mp);
    if (!docs) {
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "gpu");
        o = kvi__w_uint(o, g * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "cpu");
        o = kvi__w_uint(o, c * bs, mp);
        o = kvi__w_sep(o, false, mp);
        o = KVI__W_KEY(o, mp, "disk");
        o = kvi__w_uint(o, d * bs, mp);
    }
    return kvi__w_end_map(o, mp);
}

/* The whole answer, inlined once per encoding (@p mp constant). */
static inline __attribute__((always_inline)) size_t encode_query(struct kvi_score_row *rows, size_t n,
                                                                 uint32_t block_size, struct kvi_str tenant,
                                                                 bool docs, bool mp, char *dst)
{
    kvi_rows__sort(rows, n);
    uint32_t n_inst = kvi_rows__group(rows, n);
    char *o = kvi__w_map(dst, 1, mp);
    if (docs)
        o = kvi__w_str_key(o, tenant.p, tenant.len, mp);
    else
        o = KVI__W_KEY(o, mp, "instances");
    o = kvi__w_map(o, n_inst, mp);
    for (size_t i = 0, j; i < n; i = j) {
        j = rows[i]._end;
        o = kvi__w_sep(o, i == 0, mp);
        o = put_instance(o, rows, i, j, block_size, docs, mp);
    }
    o = kvi__w_end_map(o, mp);
    o = kvi__w_end_map(o, mp);
    if (!mp)
        *o++ = '\n';
    return (size_t)(o - dst);
}

size_t kvi_cond_encode_query_to(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                                struct kvi_str tenant, enum kvi_cond_shape shape, enum kvi_body_enc enc,
                                char *dst)
{
    bool mp = enc == KVI_ENC_MSGPACK;
    if (shape == KVI_COND_SHAPE_AUTO)
        shape = mp ? KVI_COND_SHAPE_IMPL : KVI_COND_SHAPE_DOCS;
    bool docs = shape == KVI_COND_SHAPE_DOCS;
    if (mp)
        return encode_query(rows, n, block_size, tenant, docs, true, dst);
    return encode_query(rows, n, block_size, tenant, docs, false, dst);
}

int kvi_cond_encode_query(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                          struct kvi_str tenant, enum kvi_cond_shape shape, enum kvi_body_enc enc,
                          struct kvi_buf *out)
{
    char *o = kvi_buf_reserve(out, kvi_cond_query_max_len(rows, n, tenant));
    if (o == NULL)
        return -ENOMEM;
    out->len += kvi_cond_encode_query_to(rows, n, block_size, tenant, shape, enc, o);
    return 0;
}

static void put_hash_profile(struct kvi_wr *w, const struct kvi_hash_profile *hp)
{
    static const struct kvi_hash_profile none;
    if (hp == NULL)
        hp = &none;
    const struct {
        const char *k;
        struct kvi_str v;
    } f[5] = {{"strategy", hp->strategy},
              {"algorithm", hp->algorithm},
              {"python_hash_seed", hp->python_hash_seed},
              {"root_digest", hp->root_digest},
              {"index_projection", hp->index_projection}};
    kvi_wr_obj(w, 5);
    for (int i = 0; i < 5; i++) {
        kvi_wr_keyz(w, f[i].k);
        kvi_wr_str(w, f[i].v.p ? f[i].v.p : "", f[i].v.len);
    }
    kvi_wr_end(w);
}

static void put_strz(struct kvi_wr *w, const char *k, const char *v)
{
    kvi_wr_keyz(w, k);
    kvi_wr_strz(w, v ? v : "");
}

int kvi_cond_encode_global_view(const struct kvi_cond_context_view *cv, size_t n,
                                enum kvi_body_enc enc, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, enc);
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "context_count");
    kvi_wr_u64(&w, n);
    kvi_wr_keyz(&w, "contexts");
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_cond_context_view *c = &cv[i];
        kvi_wr_obj(&w, 7);
        put_strz(&w, "model_name", c->model_name);
        put_strz(&w, "lora_name", c->lora_name);
        kvi_wr_keyz(&w, "block_size");
        kvi_wr_u64(&w, c->block_size);
        put_strz(&w, "tenant_id", c->tenant_id);
        kvi_wr_keyz(&w, "prefix_count");
        kvi_wr_u64(&w, c->prefix_count);
        kvi_wr_keyz(&w, "hash_profile");
        put_hash_profile(&w, c->hash_profile);
        kvi_wr_keyz(&w, "instances");
        kvi_wr_obj(&w, (uint32_t)c->n_instances);
        for (size_t k = 0; k < c->n_instances; k++) {
            const struct kvi_cond_instance_view *iv = &c->instances[k];
            kvi_wr_keyz(&w, iv->name ? iv->name : "");
            kvi_wr_arr(&w, (uint32_t)iv->n_ranks);
            for (size_t r = 0; r < iv->n_ranks; r++)
                kvi_wr_u64(&w, iv->dp_ranks[r]);
            kvi_wr_end(&w);
        }
        kvi_wr_end(&w);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    kvi_wr_end(&w);
    return finish(out, enc, true);
}

int kvi_cond_encode_services(const struct kvi_cond_service_view *sv, size_t n,
                             enum kvi_body_enc enc, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, enc);
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "count");
    kvi_wr_u64(&w, n);
    kvi_wr_keyz(&w, "services");
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_cond_service_view *s = &sv[i];
        kvi_wr_obj(&w, 11);
        put_strz(&w, "Endpoint", s->endpoint);
        put_strz(&w, "ReplayEndpoint", s->replay_endpoint);
        put_strz(&w, "Type", kvi_cond_type_name(s->type));
        put_strz(&w, "ModelName", s->model_name);
        put_strz(&w, "LoraName", s->lora_name);
        put_strz(&w, "TenantID", s->tenant_id);
        put_strz(&w, "InstanceID", s->instance_id);
        kvi_wr_keyz(&w, "BlockSize");
        kvi_wr_u64(&w, s->block_size);
        kvi_wr_keyz(&w, "DPRank");
        kvi_wr_u64(&w, s->dp_rank);
        kvi_wr_keyz(&w, "CacheGroup");
        if (s->has_cache_group)
            kvi_wr_i64(&w, s->cache_group);
        else
            kvi_wr_null(&w);
        kvi_wr_keyz(&w, "HashProfile");
        put_hash_profile(&w, s->hash_profile);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    kvi_wr_end(&w);
    return finish(out, enc, false);
}
