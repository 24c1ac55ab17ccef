/*
 * Dynamo RouterEvent decoder (net/decode_router.h): the envelope, the
 * RouterEvent and its three variants, read with the body layer's pull
 * reader, which parses JSON and msgpack through one API, so one decoder
 * serves every form Dynamo has published.
 */
#include "net/decode_router.h"

#include <errno.h>
#include <stdlib.h>
#include <strings.h>

#include "net/body.h"
#include "engine/index.h"

struct kvi_router_decoder {
    struct kvi_scratch scratch;
    const char *what;
};

/* Decoding state of one payload: the reader, the first error's reason. */
struct rctx {
    struct kvi_rd rd;
    struct kvi_router_decoder *d;
    enum kvi_rev_err err;
};

struct kvi_router_decoder *kvi_router_decoder_new(void)
{
    struct kvi_router_decoder *d = calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    kvi_scratch_init(&d->scratch);
    d->what = "";
    return d;
}

void kvi_router_decoder_free(struct kvi_router_decoder *d)
{
    if (d == NULL)
        return;
    kvi_scratch_free(&d->scratch);
    free(d);
}

const char *kvi_router_decoder_what(const struct kvi_router_decoder *d) { return d->what; }

const char *kvi_router_err_name(enum kvi_rev_err e)
{
    static const char *const names[KVI_REV_ERR_COUNT] = {"ok", "syntax", "shape", "variant", "limit", "nomem"};
    return (unsigned)e < KVI_REV_ERR_COUNT ? names[e] : "unknown";
}

const char *kvi_router_form_name(enum kvi_rev_form f)
{
    static const char *const names[KVI_REVF_COUNT] = {"envelope", "json", "msgpack"};
    return (unsigned)f < KVI_REVF_COUNT ? names[f] : "unknown";
}

/* ---- failures ------------------------------------------------------------------------- */

/* Record the first failure (a reader error wins: it is the syntax). @return -1. */
static int fail(struct rctx *c, enum kvi_rev_err e, const char *what)
{
    if (c->err != KVI_REV_OK)
        return -1;
    if (c->rd.err == -ENOMEM) {
        c->err = KVI_REV_NOMEM;
        c->d->what = "out of memory";
    } else if (c->rd.err != 0) {
        c->err = KVI_REV_SYNTAX;
        c->d->what = c->rd.err_what;
    } else {
        c->err = e;
        c->d->what = what;
    }
    return -1;
}

/* A reader call's result: 0 goes on; KVI_RD_TYPE is a shape error naming
 * `what`; a negative result is the reader's. */
static int check(struct rctx *c, int rc, const char *what)
{
    if (rc == 0)
        return 0;
    return fail(c, rc > 0 ? KVI_REV_SHAPE : KVI_REV_SYNTAX, what);
}

/* ---- values ----------------------------------------------------------------------------- */

/* An int of any width as a u64 bit pattern (negative: two's complement). */
static int rd_hash(struct rctx *c, uint64_t *out, const char *what)
{
    struct kvi_num n;
    int rc = kvi_rd_num(&c->rd, &n);
    if (rc != 0)
        return fail(c, rc < 0 ? KVI_REV_SYNTAX : KVI_REV_SHAPE, what);
    if (n.neg && n.mag > (uint64_t)1 << 63)
        return fail(c, KVI_REV_SHAPE, what);
    *out = n.neg ? (uint64_t)0 - n.mag : n.mag;
    return 0;
}

/* An int in [0, max]. */
static int rd_uint(struct rctx *c, uint64_t max, uint64_t *out, const char *what)
{
    struct kvi_num n;
    int rc = kvi_rd_num(&c->rd, &n);
    if (rc != 0 || (n.neg && n.mag != 0) || n.mag > max)
        return fail(c, rc < 0 ? KVI_REV_SYNTAX : KVI_REV_SHAPE, what);
    *out = n.mag;
    return 0;
}

static int rd_skip(struct rctx *c)
{
    return kvi_rd_skip(&c->rd) == 0 ? 0 : fail(c, KVI_REV_SYNTAX, "malformed value");
}

/* ---- stored / removed ------------------------------------------------------------------- */

/* Grow a u64 array in scratch to hold n + 1 elements (doubling). */
static uint64_t *grow(struct rctx *c, uint64_t *a, uint32_t n, uint32_t *cap)
{
    if (n < *cap)
        return a;
    uint32_t nc = *cap ? *cap * 2 : 64;
    uint64_t *b = kvi_scratch_alloc(&c->d->scratch, (size_t)nc * sizeof *b);
    if (b == NULL) {
        c->rd.err = -ENOMEM;
        fail(c, KVI_REV_NOMEM, "out of memory");
        return NULL;
    }
    if (n > 0)
        memcpy(b, a, (size_t)n * sizeof *a);
    *cap = nc;
    return b;
}

static int rd_block(struct rctx *c, uint64_t *bh, uint64_t *th)
{
    if (check(c, kvi_rd_obj_begin(&c->rd), "stored block is not a map") < 0)
        return -1;
    bool have_b = false, have_t = false;
    struct kvi_str k;
    int rc;
    while ((rc = kvi_rd_obj_next(&c->rd, &k)) == 1) {
        if (kvi_str_eq(k, "block_hash")) {
            if (rd_hash(c, bh, "block_hash is not an integer") < 0)
                return -1;
            have_b = true;
        } else if (kvi_str_eq(k, "tokens_hash")) {
            if (rd_hash(c, th, "tokens_hash is not an integer") < 0)
                return -1;
            have_t = true;
        } else if (rd_skip(c) < 0) {
            return -1;
        }
    }
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed block");
    if (!have_b)
        return fail(c, KVI_REV_SHAPE, "stored block without block_hash");
    if (!have_t)
        return fail(c, KVI_REV_SHAPE, "stored block without tokens_hash");
    return 0;
}

static int rd_stored(struct rctx *c, struct kvi_router_event *ev)
{
    if (check(c, kvi_rd_obj_begin(&c->rd), "stored is not a map") < 0)
        return -1;
    bool have_blocks = false;
    struct kvi_str k;
    int rc;
    while ((rc = kvi_rd_obj_next(&c->rd, &k)) == 1) {
        if (kvi_str_eq(k, "parent_hash")) {
            ev->has_parent = !kvi_rd_null(&c->rd);
            if (ev->has_parent && rd_hash(c, &ev->parent_hash, "parent_hash is not an integer or null") < 0)
                return -1;
        } else if (kvi_str_eq(k, "start_position")) {
            uint64_t v = 0;
            ev->has_start_position = !kvi_rd_null(&c->rd);
            if (ev->has_start_position && rd_uint(c, UINT32_MAX, &v, "start_position is not a u32 or null") < 0)
                return -1;
            ev->start_position = (uint32_t)v;
        } else if (kvi_str_eq(k, "blocks")) {
            if (check(c, kvi_rd_arr_begin(&c->rd), "blocks is not an array") < 0)
                return -1;
            uint64_t *bh = NULL, *th = NULL;
            uint32_t n = 0, cap_b = 0, cap_t = 0;
            while ((rc = kvi_rd_arr_next(&c->rd)) == 1) {
                if (n == KVI_ROUTER_MAX_BLOCKS)
                    return fail(c, KVI_REV_LIMIT, "more than KVI_ROUTER_MAX_BLOCKS blocks");
                if ((bh = grow(c, bh, n, &cap_b)) == NULL || (th = grow(c, th, n, &cap_t)) == NULL)
                    return -1;
                if (rd_block(c, &bh[n], &th[n]) < 0)
                    return -1;
                n++;
            }
            if (rc < 0)
                return fail(c, KVI_REV_SYNTAX, "malformed blocks");
            ev->block_hashes = bh;
            ev->tokens_hashes = th;
            ev->n_blocks = n;
            have_blocks = true;
        } else if (rd_skip(c) < 0) {
            return -1;
        }
    }
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed stored");
    if (!have_blocks)
        return fail(c, KVI_REV_SHAPE, "stored without blocks");
    return 0;
}

static int rd_removed(struct rctx *c, struct kvi_router_event *ev)
{
    if (check(c, kvi_rd_obj_begin(&c->rd), "removed is not a map") < 0)
        return -1;
    bool have = false;
    struct kvi_str k;
    int rc;
    while ((rc = kvi_rd_obj_next(&c->rd, &k)) == 1) {
        if (kvi_str_eq(k, "block_hashes")) {
            uint64_t *h;
            size_t n;
            struct kvi_elem_err e;
            rc = kvi_rd_u64_array(&c->rd, INT64_MIN, UINT64_MAX, &h, &n, &e);
            if (rc != 0)
                return fail(c, rc < 0 ? KVI_REV_SYNTAX : KVI_REV_SHAPE,
                            "block_hashes is not an array of integers");
            if (n > KVI_ROUTER_MAX_BLOCKS)
                return fail(c, KVI_REV_LIMIT, "more than KVI_ROUTER_MAX_BLOCKS block_hashes");
            ev->block_hashes = h;
            ev->n_blocks = (uint32_t)n;
            have = true;
        } else if (rd_skip(c) < 0) {
            return -1;
        }
    }
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed removed");
    if (!have)
        return fail(c, KVI_REV_SHAPE, "removed without block_hashes");
    return 0;
}

/* data: {"stored": {...}} | {"removed": {...}} | "cleared" | {"cleared": nil} */
static int rd_data(struct rctx *c, struct kvi_router_event *ev)
{
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    if (vt == KVI_VT_STR) {
        struct kvi_str s;
        if (check(c, kvi_rd_str(&c->rd, &s), "data") < 0)
            return -1;
        if (!kvi_str_eq(s, "cleared"))
            return fail(c, KVI_REV_VARIANT, "data names an unknown event kind");
        ev->kind = KVI_REV_CLEARED;
        return 0;
    }
    if (vt != KVI_VT_OBJ)
        return fail(c, vt == KVI_VT_BAD ? KVI_REV_SYNTAX : KVI_REV_SHAPE, "data is not a map or a string");
    if (check(c, kvi_rd_obj_begin(&c->rd), "data") < 0)
        return -1;
    struct kvi_str k;
    int rc = kvi_rd_obj_next(&c->rd, &k);
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed data");
    if (rc == 0)
        return fail(c, KVI_REV_VARIANT, "data is an empty map");
    if (kvi_str_eq(k, "stored")) {
        ev->kind = KVI_REV_STORED;
        if (rd_stored(c, ev) < 0)
            return -1;
    } else if (kvi_str_eq(k, "removed")) {
        ev->kind = KVI_REV_REMOVED;
        if (rd_removed(c, ev) < 0)
            return -1;
    } else if (kvi_str_eq(k, "cleared")) {
        ev->kind = KVI_REV_CLEARED;
        if (rd_skip(c) < 0)
            return -1;
    } else {
        return fail(c, KVI_REV_VARIANT, "data names an unknown event kind");
    }
    rc = kvi_rd_obj_next(&c->rd, &k);
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed data");
    if (rc == 1)
        return fail(c, KVI_REV_SHAPE, "data has more than one variant");
    return 0;
}

static int rd_event(struct rctx *c, struct kvi_router_event *ev)
{
    if (check(c, kvi_rd_obj_begin(&c->rd), "event is not a map") < 0)
        return -1;
    bool have_id = false, have_data = false;
    struct kvi_str k;
    int rc;
    while ((rc = kvi_rd_obj_next(&c->rd, &k)) == 1) {
        if (kvi_str_eq(k, "event_id")) {
            if (rd_uint(c, UINT64_MAX, &ev->event_id, "event_id is not a u64") < 0)
                return -1;
            have_id = true;
        } else if (kvi_str_eq(k, "dp_rank")) {
            uint64_t v = 0;
            if (!kvi_rd_null(&c->rd) && rd_uint(c, UINT32_MAX, &v, "dp_rank is not a u32 or null") < 0)
                return -1;
            ev->dp_rank = (uint32_t)v;
        } else if (kvi_str_eq(k, "data")) {
            if (rd_data(c, ev) < 0)
                return -1;
            have_data = true;
        } else if (rd_skip(c) < 0) {
            return -1;
        }
    }
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed event");
    if (!have_id)
        return fail(c, KVI_REV_SHAPE, "event without event_id");
    if (!have_data)
        return fail(c, KVI_REV_SHAPE, "event without data");
    return 0;
}

/* storage_tier: the last one given decides, flag included (a map that names
 * the key twice, an unknown tier then a known one, is a known tier). */
static int rd_tier(struct rctx *c, struct kvi_router_event *ev)
{
    ev->tier = KVI_TIER_GPU;
    ev->tier_unknown = false;
    if (kvi_rd_null(&c->rd))
        return 0;
    struct kvi_str s;
    if (check(c, kvi_rd_str(&c->rd, &s), "storage_tier is not a string or null") < 0)
        return -1;
    static const struct {
        const char *name;
        uint8_t tier;
    } tiers[] = {{"device", KVI_TIER_GPU},
                 {"host_pinned", KVI_TIER_CPU},
                 {"disk", KVI_TIER_DISK},
                 {"external", KVI_TIER_EXTERNAL}};
    for (size_t i = 0; i < KVI_ARRAY_LEN(tiers); i++)
        if (s.len == strlen(tiers[i].name) && strncasecmp(s.p, tiers[i].name, s.len) == 0) {
            ev->tier = tiers[i].tier;
            return 0;
        }
    ev->tier_unknown = true;
    return 0;
}

/* A RouterEvent starting at the reader's position (the whole reader). */
static int rd_router_event(struct rctx *c, struct kvi_router_event *ev)
{
    if (check(c, kvi_rd_obj_begin(&c->rd), "RouterEvent is not a map") < 0)
        return -1;
    bool have_worker = false, have_event = false;
    struct kvi_str k;
    int rc;
    while ((rc = kvi_rd_obj_next(&c->rd, &k)) == 1) {
        if (kvi_str_eq(k, "worker_id")) {
            if (rd_hash(c, &ev->worker_id, "worker_id is not an integer") < 0)
                return -1;
            have_worker = true;
        } else if (kvi_str_eq(k, "storage_tier")) {
            if (rd_tier(c, ev) < 0)
                return -1;
        } else if (kvi_str_eq(k, "event")) {
            if (rd_event(c, ev) < 0)
                return -1;
            have_event = true;
        } else if (rd_skip(c) < 0) {
            return -1;
        }
    }
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed RouterEvent");
    if (!have_worker)
        return fail(c, KVI_REV_SHAPE, "RouterEvent without worker_id");
    if (!have_event)
        return fail(c, KVI_REV_SHAPE, "RouterEvent without event");
    if (kvi_rd_finish(&c->rd) != 0)
        return fail(c, KVI_REV_SYNTAX, "trailing bytes");
    return 0;
}

/* JSON starts with '{' (after whitespace); msgpack maps with 0x80-0x8f, 0xde, 0xdf. */
static bool looks_json(const uint8_t *p, size_t len)
{
    size_t i = 0;
    while (i < len && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
        i++;
    return i < len && p[i] == '{';
}

static int key_is_payload(void *ctx, struct kvi_str key, enum kvi_vt vt)
{
    bool *found = ctx;
    if (kvi_str_eq(key, "payload") && vt == KVI_VT_BIN) {
        *found = true;
        return 1;
    }
    return 0;
}

/* The envelope: its fields, then the RouterEvent in its payload. */
static int rd_envelope(struct rctx *c, struct kvi_router_event *ev)
{
    if (check(c, kvi_rd_obj_begin(&c->rd), "envelope is not a map") < 0)
        return -1;
    const uint8_t *pl = NULL;
    size_t pl_len = 0;
    struct kvi_str k;
    int rc;
    while ((rc = kvi_rd_obj_next(&c->rd, &k)) == 1) {
        if (kvi_str_eq(k, "payload")) {
            if (check(c, kvi_rd_bin(&c->rd, &pl, &pl_len), "envelope payload is not bin") < 0)
                return -1;
        } else if (kvi_str_eq(k, "publisher_id")) {
            if (rd_uint(c, UINT64_MAX, &ev->publisher_id, "publisher_id is not a u64") < 0)
                return -1;
        } else if (kvi_str_eq(k, "sequence")) {
            if (rd_uint(c, UINT64_MAX, &ev->sequence, "sequence is not a u64") < 0)
                return -1;
        } else if (kvi_str_eq(k, "published_at")) {
            if (rd_uint(c, UINT64_MAX, &ev->published_at, "published_at is not a u64") < 0)
                return -1;
        } else if (rd_skip(c) < 0) {
            return -1;
        }
    }
    if (rc < 0)
        return fail(c, KVI_REV_SYNTAX, "malformed envelope");
    if (kvi_rd_finish(&c->rd) != 0)
        return fail(c, KVI_REV_SYNTAX, "trailing bytes after the envelope");
    if (pl == NULL)
        return fail(c, KVI_REV_SHAPE, "envelope without payload");
    kvi_rd_init(&c->rd, pl, pl_len, looks_json(pl, pl_len) ? KVI_ENC_JSON : KVI_ENC_MSGPACK, &c->d->scratch);
    return rd_router_event(c, ev);
}

enum kvi_rev_err kvi_router_decode(struct kvi_router_decoder *d, const void *payload, size_t len,
                                   struct kvi_router_event *out)
{
    memset(out, 0, sizeof *out);
    out->tier = KVI_TIER_GPU;
    kvi_scratch_reset(&d->scratch);
    d->what = "";
    if (len > KVI_ROUTER_MAX_PAYLOAD) {
        d->what = "payload larger than KVI_ROUTER_MAX_PAYLOAD";
        return KVI_REV_LIMIT;
    }
    struct rctx c = {.d = d};
    const uint8_t *p = payload;
    if (looks_json(p, len)) {
        out->form = KVI_REVF_JSON;
        kvi_rd_init(&c.rd, p, len, KVI_ENC_JSON, &d->scratch);
        rd_router_event(&c, out);
        return c.err;
    }
    bool env = false;
    if (kvi_rd_peek_keys(p, len, KVI_ENC_MSGPACK, key_is_payload, &env) < 0) {
        d->what = len == 0 ? "empty payload" : "neither a JSON nor a msgpack map";
        return KVI_REV_SYNTAX;
    }
    kvi_rd_init(&c.rd, p, len, KVI_ENC_MSGPACK, &d->scratch);
    out->form = env ? KVI_REVF_ENVELOPE : KVI_REVF_MSGPACK;
    if (env)
        rd_envelope(&c, out);
    else
        rd_router_event(&c, out);
    return c.err;
}
