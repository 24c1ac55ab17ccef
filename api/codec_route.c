/*
 * POST /route codec and ranking (api/codec_route.h). The parser walks the
 * body with the shared pull reader (net/body.h) because the request mixes
 * floats and booleans with the token and hash arrays the table parser
 * handles; its error texts follow the Dynamo dialect's (codec_common.c).
 * The response has floats, which kvi_wr does not write, so it has its own
 * small two-encoding writer.
 */
#include "api/codec_route.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_internal.h"

#define TYPE_NAME "RouteRequest"

/* ---- request ---------------------------------------------------------------------------------- */

enum {
    B_MODEL,
    B_TENANT,
    B_LORA,
    B_REQ,
    B_TOKENS,
    B_BLOCK_HASHES,
    B_SEQ_HASHES,
    B_ISL,
    B_OW,
    B_DW,
    B_COMMIT,
    B_COUNT
};

static const char *const key_names[B_COUNT] = {
    "model_name",   "tenant_id",       "lora_name",      "request_id",     "token_ids",     "block_hashes",
    "sequence_hashes", "new_isl_tokens", "overlap_weight", "decode_weight", "commit",
};

struct pctx {
    struct kvi_rd rd;
    const uint8_t *body;
    struct kvi_scratch *s;
    struct kvi_api_err *err;
};

/* 422 at byte @p off: "<field>: <detail>" (serde's wording, as the Dynamo routes). */
static int data_err(struct pctx *c, size_t off, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int data_err(struct pctx *c, size_t off, const char *field, const char *fmt, ...)
{
    char detail[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    const char *sep = field != NULL ? ": " : "";
    if (field == NULL)
        field = "";
    if (c->rd.enc == KVI_ENC_MSGPACK)
        return kvi_err__set(c->err, 422, NULL, NULL, -1,
                            "Failed to deserialize the msgpack body into the target type: %s%s%s at byte %zu",
                            field, sep, detail, off);
    size_t line, col;
    kvi_rd_line_col(&c->rd, off, &line, &col);
    return kvi_err__set(c->err, 422, NULL, NULL, -1,
                        "Failed to deserialize the JSON body into the target type: %s%s%s at line %zu column %zu",
                        field, sep, detail, line, col);
}

/* A reader failure (syntax, or out of memory) as the answer. */
static int rd_fail(struct pctx *c)
{
    return kvi_err__from_rd(c->err, KVI_DIALECT_DYNAMO, &c->rd);
}

/* 422 naming the type of the value at the cursor. */
static int type_err(struct pctx *c, const char *field, const char *expected)
{
    char what[96];
    size_t off = kvi_rd_offset(&c->rd);
    kvi_rd_describe(&c->rd, what, sizeof(what));
    return data_err(c, off, field, "invalid type: %s, expected %s", what, expected);
}

/* Map a reader result: 0 stays 0, KVI_RD_TYPE becomes a 422, errors the reader's answer. */
static int check(struct pctx *c, int r, const char *field, const char *expected)
{
    if (r == 0)
        return 0;
    if (r == KVI_RD_TYPE)
        return type_err(c, field, expected);
    return rd_fail(c);
}

static int read_str(struct pctx *c, const char *field, struct kvi_str *out)
{
    return check(c, kvi_rd_str(&c->rd, out), field, "a string");
}

static int read_u64(struct pctx *c, const char *field, uint64_t *out)
{
    struct kvi_num n;
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    size_t off = kvi_rd_offset(&c->rd);
    if (vt != KVI_VT_INT && vt != KVI_VT_FLOAT)
        return type_err(c, field, "u64");
    int r = kvi_rd_num(&c->rd, &n);
    if (r == KVI_NUM_FLOAT)
        return data_err(c, off, field, "invalid type: floating point, expected u64");
    if (r == KVI_NUM_BIG || (r == 0 && n.neg && n.mag > 0))
        return data_err(c, off, field, "invalid value: integer out of range, expected u64");
    if (r != 0)
        return check(c, r, field, "u64");
    *out = n.mag;
    return 0;
}

/* A weight: any finite number >= 0, integer or float, in either encoding. */
static int read_weight(struct pctx *c, const char *field, double *out)
{
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    size_t off = kvi_rd_offset(&c->rd);
    if (vt != KVI_VT_INT && vt != KVI_VT_FLOAT)
        return type_err(c, field, "a number");
    struct kvi_num n;
    int r = kvi_rd_num(&c->rd, &n);
    double v;
    if (r == 0) {
        v = n.neg ? -(double)n.mag : (double)n.mag;
    } else if (r == KVI_NUM_FLOAT || r == KVI_NUM_BIG) {
        if (c->rd.enc == KVI_ENC_MSGPACK) {
            const uint8_t *p = c->body + off;
            if (p[0] == 0xca) { /* float 32; else float 64 (the reader checked the length) */
                uint32_t b = kvi_load_be32(p + 1);
                float f;
                memcpy(&f, &b, 4);
                v = f;
            } else {
                uint64_t b = kvi_load_be64(p + 1);
                memcpy(&v, &b, 8);
            }
        } else {
            /* strtod needs a terminated copy; the reader checked the syntax (no hex, inf or nan) */
            char tmp[64], *txt = tmp;
            size_t len = kvi_rd_offset(&c->rd) - off;
            if (len >= sizeof(tmp) && (txt = kvi_scratch_alloc(c->s, len + 1)) == NULL)
                return kvi_err__set(c->err, 500, NULL, NULL, -1, "out of memory while parsing the request body");
            memcpy(txt, c->body + off, len);
            txt[len] = '\0';
            v = strtod(txt, NULL);
        }
    } else {
        return check(c, r, field, "a number");
    }
    if (!isfinite(v) || v < 0)
        return data_err(c, off, field, "invalid value: %g, expected a finite number >= 0", v);
    *out = v;
    return 0;
}

/* An element failure of an integer array as a 422. */
static int elem_err(struct pctx *c, const char *field, const struct kvi_elem_err *e, const char *expected)
{
    char path[64];
    snprintf(path, sizeof(path), "%s[%zu]", field, e->index);
    if (e->kind == KVI_EF_TYPE)
        return type_err(c, path, expected);
    if (e->kind == KVI_EF_FLOAT)
        return data_err(c, e->off, path, "invalid type: floating point, expected %s", expected);
    if (e->big)
        return data_err(c, e->off, path, "invalid value: integer out of range, expected %s", expected);
    return data_err(c, e->off, path, "invalid value: integer `%s%llu`, expected %s", e->num.neg ? "-" : "",
                    (unsigned long long)e->num.mag, expected);
}

/* A bin of little-endian @p width-byte words (kvi_bin__le_words). */
static int read_bin(struct pctx *c, struct kvi_scratch *s, const char *f, int width, void **out, size_t *n)
{
    const uint8_t *p;
    size_t len;
    size_t off = kvi_rd_offset(&c->rd);
    int r = kvi_rd_bin(&c->rd, &p, &len);
    if (r != 0)
        return check(c, r, f, "a sequence");
    r = kvi_bin__le_words(s, p, len, width, out, n);
    if (r == -ENOMEM)
        return kvi_err__set(c->err, 500, NULL, NULL, -1, "out of memory while parsing the request body");
    if (r != 0)
        return data_err(c, off, f, "invalid length %zu, expected a multiple of %d bytes", len, width);
    return 0;
}

/* token_ids: an array of u32, or (msgpack) a bin of little-endian u32. */
static int read_tokens(struct pctx *c, struct kvi_scratch *s, struct kvi_route_req *out)
{
    const char *f = key_names[B_TOKENS];
    if (kvi_rd_peek(&c->rd) == KVI_VT_BIN) {
        void *w;
        int r = read_bin(c, s, f, 4, &w, &out->n_tokens);
        if (r == 0)
            out->token_ids = w;
        return r;
    }
    uint32_t *t;
    size_t n;
    struct kvi_elem_err e;
    int r = kvi_rd_u32_array(&c->rd, 0, UINT32_MAX, &t, &n, &e);
    if (r == KVI_RD_ELEM)
        return elem_err(c, f, &e, "u32");
    if (r != 0)
        return check(c, r, f, "a sequence");
    out->token_ids = t;
    out->n_tokens = n;
    return 0;
}

/* A hash list: an array of i64 or u64, or (msgpack) a bin of little-endian u64. */
static int read_hashes(struct pctx *c, struct kvi_scratch *s, const char *f, struct kvi_route_req *out)
{
    if (kvi_rd_peek(&c->rd) == KVI_VT_BIN) {
        void *w;
        int r = read_bin(c, s, f, 8, &w, &out->n_hashes);
        if (r == 0)
            out->hashes = w;
        return r;
    }
    uint64_t *h;
    size_t n;
    struct kvi_elem_err e;
    int r = kvi_rd_u64_array(&c->rd, INT64_MIN, UINT64_MAX, &h, &n, &e);
    if (r == KVI_RD_ELEM)
        return elem_err(c, f, &e, "a 64-bit integer");
    if (r != 0)
        return check(c, r, f, "a sequence");
    out->hashes = h;
    out->n_hashes = n;
    return 0;
}

static int key_index(struct kvi_str k)
{
    for (int i = 0; i < B_COUNT; i++)
        if (kvi_str_eq(k, key_names[i]))
            return i;
    return -1;
}

static int read_field(struct pctx *c, struct kvi_scratch *s, int b, struct kvi_route_req *out, uint32_t *seen)
{
    const char *f = key_names[b];
    /* null means "absent" for every optional field */
    if (b != B_MODEL && kvi_rd_null(&c->rd)) {
        *seen &= ~(1u << b);
        return c->rd.err ? rd_fail(c) : 0;
    }
    switch (b) {
    case B_MODEL: return read_str(c, f, &out->model_name);
    case B_TENANT: return read_str(c, f, &out->tenant_id);
    case B_LORA: return read_str(c, f, &out->lora_name);
    case B_REQ: out->has_request_id = true; return read_str(c, f, &out->request_id);
    case B_TOKENS: out->input = KVI_ROUTE_TOKENS; return read_tokens(c, s, out);
    case B_BLOCK_HASHES: out->input = KVI_ROUTE_BLOCK_HASHES; return read_hashes(c, s, f, out);
    case B_SEQ_HASHES: out->input = KVI_ROUTE_SEQ_HASHES; return read_hashes(c, s, f, out);
    case B_ISL: out->has_isl = true; return read_u64(c, f, &out->new_isl_tokens);
    case B_OW: return read_weight(c, f, &out->overlap_weight);
    case B_DW: return read_weight(c, f, &out->decode_weight);
    case B_COMMIT: return check(c, kvi_rd_bool(&c->rd, &out->commit), f, "a boolean");
    default: return kvi_err__set(c->err, 500, NULL, NULL, -1, "internal error");
    }
}

int kvi_route_parse(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                    struct kvi_route_req *out, struct kvi_api_err *err)
{
    memset(out, 0, sizeof(*out));
    out->overlap_weight = 1.0;
    out->decode_weight = 1.0;
    out->tenant_id = kvi_str_default;
    if (ct != KVI_CT_JSON && ct != KVI_CT_MSGPACK)
        return kvi_err__set(err, 415, NULL, NULL, -1,
                            "Expected request with `Content-Type: application/json` or `application/msgpack`");
    struct pctx c = {.body = body, .s = s, .err = err};
    kvi_rd_init(&c.rd, body, len, ct == KVI_CT_MSGPACK ? KVI_ENC_MSGPACK : KVI_ENC_JSON, s);
    size_t off = 0;
    int r = kvi_rd_obj_begin(&c.rd);
    if (r == KVI_RD_TYPE)
        return type_err(&c, NULL, "struct " TYPE_NAME);
    if (r != 0)
        return rd_fail(&c);
    uint32_t seen = 0;
    struct kvi_str k;
    while ((r = kvi_rd_obj_next(&c.rd, &k)) == 1) {
        off = kvi_rd_offset(&c.rd);
        int b = key_index(k);
        if (b < 0) {
            if (kvi_rd_skip(&c.rd) != 0)
                return rd_fail(&c);
            continue;
        }
        if (seen & (1u << b))
            return data_err(&c, off, NULL, "duplicate field `%s`", key_names[b]);
        seen |= 1u << b;
        if ((r = read_field(&c, s, b, out, &seen)) != 0)
            return r;
    }
    if (r < 0 || kvi_rd_finish(&c.rd) != 0)
        return rd_fail(&c);
    off = kvi_rd_offset(&c.rd);
    if (!(seen & (1u << B_MODEL)))
        return data_err(&c, off, NULL, "missing field `model_name`");
    if (!(seen & (1u << B_TENANT)))
        out->tenant_id = kvi_str_default;
    if (!(seen & (1u << B_LORA)))
        out->lora_name = (struct kvi_str){NULL, 0};
    if (!(seen & (1u << B_ISL)))
        out->has_isl = false;
    if (!(seen & (1u << B_REQ)))
        out->has_request_id = false;
    if (!(seen & (1u << B_OW)))
        out->overlap_weight = 1.0;
    if (!(seen & (1u << B_DW)))
        out->decode_weight = 1.0;
    int prompts = !!(seen & (1u << B_TOKENS)) + !!(seen & (1u << B_BLOCK_HASHES)) + !!(seen & (1u << B_SEQ_HASHES));
    if (prompts != 1)
        return data_err(&c, off, NULL, "expected exactly one of `token_ids`, `block_hashes` and `sequence_hashes`");
    if (out->commit && !out->has_request_id)
        return data_err(&c, off, NULL, "missing field `request_id` (required with `commit`)");
    return 0;
}

/* ---- ranking ------------------------------------------------------------------------------------ */

static int cand_cmp(const void *pa, const void *pb)
{
    const struct kvi_route_cand *a = pa, *b = pb;
    if (a->cost != b->cost)
        return a->cost < b->cost ? -1 : 1;
    if (a->tree_size != b->tree_size)
        return a->tree_size < b->tree_size ? -1 : 1;
    if (a->worker_id != b->worker_id)
        return a->worker_id < b->worker_id ? -1 : 1;
    return a->dp_rank < b->dp_rank ? -1 : a->dp_rank > b->dp_rank;
}

void kvi_route_rank(struct kvi_route_cand *c, size_t n, const struct kvi_route_params *p)
{
    uint64_t bs = p->block_size ? p->block_size : 1;
    for (size_t i = 0; i < n; i++) {
        struct kvi_route_cand *x = &c[i];
        unsigned __int128 cached = (unsigned __int128)x->overlap_blocks * bs;
        x->new_prefill_tokens = cached >= p->new_isl_tokens ? 0 : p->new_isl_tokens - (uint64_t)cached;
        uint64_t sum = x->active_prefill_tokens + x->new_prefill_tokens;
        x->potential_prefill_tokens = sum < x->active_prefill_tokens ? UINT64_MAX : sum;
        x->prefill_blocks = (double)x->potential_prefill_tokens / (double)bs;
        x->cost = p->overlap_weight * x->prefill_blocks + p->decode_weight * (double)x->potential_decode_blocks;
    }
    if (n > 1)
        qsort(c, n, sizeof(*c), cand_cmp);
}

/* ---- response ----------------------------------------------------------------------------------- */

/* A writer of flat maps and one array of them, in JSON or msgpack, with floats. */
struct rw {
    struct kvi_buf *b;
    bool mp;
    bool after_key; /* JSON: the next value follows a key (no separator) */
    bool first[4];
    int depth;
};

/* msgpack items are written by net/msgpack_wire.h into room for one header
 * at the end of the buffer (NULL: out of memory, recorded by the buffer). */
static void *rw_mp_room(struct rw *w)
{
    return kvi_buf_reserve(w->b, KVI_MP_HDR_MAX);
}

/* Account what a writer put at @p at (rw_mp_room's answer), up to @p end. */
static void rw_mp_done(struct rw *w, void *at, void *end)
{
    w->b->len += (size_t)((char *)end - (char *)at);
}

static void rw_sep(struct rw *w)
{
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (w->mp || w->depth == 0)
        return;
    if (w->first[w->depth - 1])
        w->first[w->depth - 1] = false;
    else
        kvi_buf_putc(w->b, ',');
}

static void rw_open(struct rw *w, bool obj, uint32_t n)
{
    if (w->mp) {
        void *p = rw_mp_room(w);
        if (p != NULL)
            rw_mp_done(w, p, obj ? kvi_mp_w_map_hdr(p, n, false) : kvi_mp_w_array_hdr(p, n));
    } else {
        rw_sep(w);
        kvi_buf_putc(w->b, obj ? '{' : '[');
    }
    w->first[w->depth++] = true;
}

static void rw_close(struct rw *w, bool obj)
{
    w->depth--;
    if (!w->mp)
        kvi_buf_putc(w->b, obj ? '}' : ']');
}

static void rw_str(struct rw *w, const char *s, size_t len)
{
    if (w->mp) {
        void *p = rw_mp_room(w);
        if (p == NULL)
            return;
        rw_mp_done(w, p, kvi_mp_w_str_hdr(p, len));
        kvi_buf_put(w->b, s, len);
    } else {
        kvi_json_put_str(w->b, s, len);
    }
}

/* A string value. */
static void rw_v_str(struct rw *w, const char *s, size_t len)
{
    rw_sep(w);
    rw_str(w, s, len);
}

/* A key; the value follows with one of the rw_v_* calls or rw_open. */
static void rw_key(struct rw *w, const char *k)
{
    rw_sep(w);
    rw_str(w, k, strlen(k));
    if (!w->mp) {
        kvi_buf_putc(w->b, ':');
        w->after_key = true;
    }
}

static void rw_v_u64(struct rw *w, uint64_t v)
{
    rw_sep(w);
    if (!w->mp) {
        kvi_buf_put_u64(w->b, v);
        return;
    }
    void *p = rw_mp_room(w);
    if (p != NULL)
        rw_mp_done(w, p, kvi_mp_w_uint(p, v));
}

static void rw_v_bool(struct rw *w, bool v)
{
    rw_sep(w);
    if (w->mp) {
        void *p = rw_mp_room(w);
        if (p != NULL)
            rw_mp_done(w, p, kvi_mp_w_bool(p, v));
    } else {
        kvi_buf_puts(w->b, v ? "true" : "false");
    }
}

/* A float: msgpack float64; JSON the shortest of %.15g / %.17g that reads back exactly, with ".0" for
 * integers, and null for a non-finite value (JSON has none; serde_json writes null too). A cost is
 * infinite when a huge weight (above ~1e289) meets a large prefill. */
static void rw_v_f64(struct rw *w, double v)
{
    rw_sep(w);
    if (w->mp) {
        void *p = rw_mp_room(w);
        if (p != NULL)
            rw_mp_done(w, p, kvi_mp_w_f64(p, v));
        return;
    }
    if (!isfinite(v)) {
        kvi_buf_puts(w->b, "null");
        return;
    }
    char tmp[40];
    int n;
    if (v == floor(v) && fabs(v) < 1e15) {
        n = snprintf(tmp, sizeof(tmp), "%.1f", v);
    } else {
        n = snprintf(tmp, sizeof(tmp), "%.15g", v);
        if (strtod(tmp, NULL) != v)
            n = snprintf(tmp, sizeof(tmp), "%.17g", v);
    }
    kvi_buf_put(w->b, tmp, (size_t)n);
}

int kvi_route_encode(const struct kvi_route_answer *a, const struct kvi_route_params *p,
                     const struct kvi_route_cand *c, size_t n, enum kvi_body_enc enc, struct kvi_buf *out)
{
    if (n == 0)
        return -EINVAL;
    struct rw w = {.b = out, .mp = enc == KVI_ENC_MSGPACK};
    rw_open(&w, true, a->commit ? 12 : 11);
    rw_key(&w, "model_name");
    rw_v_str(&w, a->model_name.p, a->model_name.len);
    rw_key(&w, "tenant_id");
    rw_v_str(&w, a->tenant_id.p, a->tenant_id.len);
    rw_key(&w, "block_size");
    rw_v_u64(&w, p->block_size);
    rw_key(&w, "blocks");
    rw_v_u64(&w, a->blocks);
    rw_key(&w, "new_isl_tokens");
    rw_v_u64(&w, p->new_isl_tokens);
    rw_key(&w, "overlap_weight");
    rw_v_f64(&w, p->overlap_weight);
    rw_key(&w, "decode_weight");
    rw_v_f64(&w, p->decode_weight);
    rw_key(&w, "worker_id");
    rw_v_u64(&w, c[0].worker_id);
    rw_key(&w, "dp_rank");
    rw_v_u64(&w, c[0].dp_rank);
    rw_key(&w, "committed");
    rw_v_bool(&w, a->committed);
    if (a->commit) {
        rw_key(&w, "request_id");
        rw_v_str(&w, a->request_id.p, a->request_id.len);
    }
    rw_key(&w, "candidates");
    rw_open(&w, false, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const struct kvi_route_cand *x = &c[i];
        rw_open(&w, true, 10);
        rw_key(&w, "worker_id");
        rw_v_u64(&w, x->worker_id);
        rw_key(&w, "dp_rank");
        rw_v_u64(&w, x->dp_rank);
        rw_key(&w, "overlap_blocks");
        rw_v_u64(&w, x->overlap_blocks);
        rw_key(&w, "tree_size");
        rw_v_u64(&w, x->tree_size);
        rw_key(&w, "new_prefill_tokens");
        rw_v_u64(&w, x->new_prefill_tokens);
        rw_key(&w, "potential_prefill_tokens");
        rw_v_u64(&w, x->potential_prefill_tokens);
        rw_key(&w, "prefill_blocks");
        rw_v_f64(&w, x->prefill_blocks);
        rw_key(&w, "potential_decode_blocks");
        rw_v_u64(&w, x->potential_decode_blocks);
        rw_key(&w, "active_requests");
        rw_v_u64(&w, x->active_requests);
        rw_key(&w, "cost");
        rw_v_f64(&w, x->cost);
        rw_close(&w, true);
    }
    rw_close(&w, false);
    rw_close(&w, true);
    return kvi_buf_ok(out) ? 0 : -ENOMEM;
}

/* A quoted string: at most 200 bytes, cut on a UTF-8 character boundary. */
#define SK(s) (int)kvi_utf8_prefix((s).len > 0 ? (s).p : "", (s).len, 200), ((s).len > 0 ? (s).p : "")

int kvi_route_err_block_size(struct kvi_api_err *e, struct kvi_str model, struct kvi_str tenant,
                             uint32_t index_bs, uint32_t tracker_bs)
{
    return kvi_err__set(e, 409, NULL, NULL, -1,
                        "block_size mismatch for model=%.*s tenant=%.*s: index=%u, slot tracker=%u", SK(model),
                        SK(tenant), index_bs, tracker_bs);
}
