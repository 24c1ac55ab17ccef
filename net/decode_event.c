/*
 * KV-event batch decoder (net/decode.h): the event decoders, for a batch's
 * events array, one element at a time. Tagged arrays (vLLM, SGLang,
 * Dynamo) and tagged maps (vLLM, RFC 1527) share the field readers:
 * hashes and token ids (the hot loops), parents, sizes, strings, media
 * (kvi_medium_tier) and the multimodal hashes of extra_keys and
 * block_mm_infos. An event is kept, or counted unknown / invalid and rolled
 * back. The decoder and its design are in net/decode.c, the msgpack cursor
 * in net/decode_msgpack.c.
 */
#include "net/decode_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common.h"

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */

static inline char lower_ascii(uint8_t ch) { return (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch); }

/* Case-insensitive equality of a wire string with a lower-case literal. */
static bool ieq(const uint8_t *s, size_t len, const char *lit, size_t lit_len)
{
    if (len != lit_len)
        return false;
    for (size_t i = 0; i < len; i++)
        if (lower_ascii(s[i]) != lit[i])
            return false;
    return true;
}
#define IEQ(s, len, lit) ieq((s), (len), lit, sizeof(lit) - 1)

enum kvi_tier kvi_medium_tier(const char *s, size_t len, bool *known)
{
    if (known)
        *known = true;
    if (s == NULL)
        return KVI_TIER_GPU;
    const uint8_t *u = (const uint8_t *)s;
    switch (len) {
    case 3:
        if (IEQ(u, len, "gpu"))
            return KVI_TIER_GPU;
        if (IEQ(u, len, "cpu"))
            return KVI_TIER_CPU;
        break;
    case 4:
        if (IEQ(u, len, "disk") || IEQ(u, len, "nvme"))
            return KVI_TIER_DISK;
        break;
    case 6:
        if (IEQ(u, len, "device"))
            return KVI_TIER_GPU;
        if (IEQ(u, len, "remote") || IEQ(u, len, "shared"))
            return KVI_TIER_EXTERNAL;
        break;
    case 7:
        if (IEQ(u, len, "storage"))
            return KVI_TIER_DISK;
        if (IEQ(u, len, "network"))
            return KVI_TIER_EXTERNAL;
        break;
    case 8:
        if (IEQ(u, len, "external"))
            return KVI_TIER_EXTERNAL;
        break;
    case 9:
        if (IEQ(u, len, "cpu_tier1"))
            return KVI_TIER_CPU;
        if (IEQ(u, len, "cpu_tier2"))
            return KVI_TIER_DISK;
        break;
    case 10:
        if (IEQ(u, len, "cpu_pinned"))
            return KVI_TIER_CPU;
        break;
    default:
        break;
    }
    if (known)
        *known = false;
    return KVI_TIER_GPU;
}

/* Normalise a hash value: ints as their 64-bit two's complement, bins as
 * int.from_bytes(bytes, "big") mod 2^64 (the last min(len, 8) bytes,
 * big-endian, zero-extended; an empty bin is 0). */
static bool hash_of(const struct mp_val *v, uint64_t *out)
{
    switch (v->t) {
    case MP_UINT:
        *out = v->u;
        return true;
    case MP_NINT:
        *out = (uint64_t)v->i;
        return true;
    case MP_BIN: {
        uint64_t h = 0;
        uint32_t k = v->n < 8 ? v->n : 8;
        for (const uint8_t *p = v->ptr + v->n - k; k > 0; k--, p++)
            h = h << 8 | *p;
        *out = h;
        return true;
    }
    default:
        return false;
    }
}

static inline bool is_hex(uint8_t ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}
static inline unsigned hex_val(uint8_t ch)
{
    return ch <= '9' ? (unsigned)(ch - '0') : (unsigned)(lower_ascii(ch) - 'a' + 10);
}

/* Dynamo's multimodal rule: a 64-hex-digit string is an mm identifier; its
 * first 16 hex digits are the mm hash. */
static bool mm_hash_of_str(const struct mp_val *v, uint64_t *out)
{
    if (v->t != MP_STR || v->n != 64)
        return false;
    for (uint32_t i = 0; i < 64; i++)
        if (!is_hex(v->ptr[i]))
            return false;
    uint64_t h = 0;
    for (uint32_t i = 0; i < 16; i++)
        h = h << 4 | hex_val(v->ptr[i]);
    *out = h;
    return true;
}

/* ------------------------------------------------------------------------ */
/* events                                                                    */
/* ------------------------------------------------------------------------ */

enum tag {
    TAG_NONE = -1,
    TAG_STORED = KVI_EV_STORED,
    TAG_REMOVED = KVI_EV_REMOVED,
    TAG_CLEARED = KVI_EV_CLEARED,
    TAG_UNKNOWN = 3,
};

/* Decode state of one event. */
struct evctx {
    struct kvi_ev ev;
    struct ev_fix fix;
    int tag;          /* enum tag */
    bool short_tag;   /* tag spelled stored / removed / cleared (RFC 1527) */
    bool rfc_key;     /* event_type or seq_hashes key seen */
    bool have_hashes; /* block_hashes / seq_hashes decoded (an array) */
    bool bad;         /* a field kvidx reads has an unusable value */
    const uint8_t *xk;  /* extra_keys value, read after the fields */
    const uint8_t *mmi; /* block_mm_infos value, read after the fields */
    size_t h0, t0, mm0, mo0; /* scratch sizes at event start (rollback) */
};

static int classify_tag(const struct mp_val *v, bool *short_tag)
{
    *short_tag = false;
    const uint8_t *s = v->ptr;
    size_t n = v->n;
    /* exact spellings first (what every engine sends), then any case */
    if (n == 11 && memcmp(s, "BlockStored", 11) == 0)
        return TAG_STORED;
    if (n == 12 && memcmp(s, "BlockRemoved", 12) == 0)
        return TAG_REMOVED;
    if (IEQ(s, n, "blockstored"))
        return TAG_STORED;
    if (IEQ(s, n, "blockremoved"))
        return TAG_REMOVED;
    if (IEQ(s, n, "allblockscleared"))
        return TAG_CLEARED;
    *short_tag = true;
    if (IEQ(s, n, "stored"))
        return TAG_STORED;
    if (IEQ(s, n, "removed"))
        return TAG_REMOVED;
    if (IEQ(s, n, "cleared"))
        return TAG_CLEARED;
    *short_tag = false;
    return TAG_UNKNOWN;
}

/* Element v of an array does not have the expected type: mark the event bad
 * and skip v's body and the @p rest elements after it (depth of the
 * elements @p depth), so that the batch's next events still decode. */
static int skip_bad_rest(struct cur *c, const struct mp_val *v, uint64_t rest, unsigned depth, bool *bad)
{
    *bad = true;
    int e = kvi_dec__mp_skip_body(c, v, depth);
    return e ? e : kvi_dec__mp_skip_n(c, rest, depth);
}

/* Hash array elements, after the array header (@p n elements, depth of the
 * elements @p depth). Fast path: uint64, int64, fixint. */
static int read_hashes(struct cur *c, uint32_t n, unsigned depth, uint64_t *out, bool *bad)
{
    const uint8_t *p = c->p, *end = c->end;
    for (uint32_t i = 0; i < n; i++) {
        if (KVI_LIKELY(end - p >= 9)) {
            uint8_t b = *p;
            if (b == 0xcf || b == 0xd3) { /* u64 / i64: same bit pattern */
                out[i] = kvi_load_be64(p + 1);
                p += 9;
                continue;
            }
            if (b <= 0x7f) {
                out[i] = b;
                p++;
                continue;
            }
        }
        c->p = p;
        struct mp_val v;
        int e = kvi_dec__mp_next(c, &v);
        if (e)
            return e;
        if (KVI_UNLIKELY(!hash_of(&v, &out[i]))) {
            return skip_bad_rest(c, &v, n - i - 1, depth, bad);
        }
        p = c->p;
    }
    c->p = p;
    return 0;
}

/* One token id (any int width, value in [0, 2^32)). */
static inline bool token_of(const struct mp_val *v, uint32_t *out)
{
    if (v->t != MP_UINT || v->u > UINT32_MAX)
        return false;
    *out = (uint32_t)v->u;
    return true;
}

/*
 * Token ids are the hot loop: ~85 % of a vLLM batch's bytes. With a vocab
 * above 65,536 (Qwen 152k, Llama-3 128k) about half the ids are uint32 and
 * half uint16, in random order, so a per-token width branch mispredicts
 * on every other token. Arrays are therefore decoded in chunks of
 * TOK_CHUNK ids in one of two modes, re-chosen after every chunk from the
 * number of width changes seen in it:
 *   - branchy: one predicted branch per id (best when widths repeat);
 *   - pairs: two ids per step without width branches; the second id's
 *     type byte is found inside the first id's 8-byte load, so the
 *     load -> length -> pointer dependency chain is paid once per two ids.
 * A chunk runs only while TOK_CHUNK_BYTES bytes remain in the frame (the
 * worst-case advance of 32 steps plus the 8-byte reads), so neither mode
 * checks bounds per id. Any type byte other than fixint / uint8 / uint16 /
 * uint32 sends the rest of the array (pairs: from the chunk start) to the
 * careful loop, which handles every width and invalid values.
 * Measured on mixed 57 % uint32 ids: 4.6 ns/id branchy, 2.5 ns/id hybrid;
 * uniform widths: 0.6-1.0 ns/id either way.
 */
#define TOK_CHUNK 32
#define TOK_CHUNK_BYTES (TOK_CHUNK * 9 + 16)
#define TOK_PAIRS_ENTER 10 /* width changes among 32 ids (branchy mode) */
#define TOK_PAIRS_STAY 5   /* width changes among the 16 first ids of pairs */

/* Length of an id with type byte b: fixint 1, uint8 2, uint16 3, uint32 5
 * (other bytes give 2..9 and are rejected by tok_simple). */
static inline uint32_t tok_len(uint32_t b)
{
    uint32_t x = 1u + (1u << (b & 3));
    return b < 0x80 ? 1u : x;
}
static inline bool tok_simple(uint32_t b) { return b < 0x80 || b - 0xcc <= 2; }

/* Value of an id of length l whose 8 bytes, big-endian, are be. */
static inline uint32_t tok_val(uint64_t be, uint32_t l)
{
    uint32_t v = (uint32_t)((be << 8) >> ((72 - 8 * l) & 63)); /* l > 1: drop the type byte */
    return l == 1 ? (uint32_t)(be >> 56) : v;
}

/* Two ids at p (16 readable bytes + the second id's 8 guaranteed by the
 * caller). ok is cleared when either type byte is not a simple id. */
static inline const uint8_t *tok_pair(const uint8_t *p, uint32_t *out, uint32_t *ok)
{
    uint64_t w;
    memcpy(&w, p, sizeof w);
    uint32_t b0 = (uint32_t)(w & 0xff), l0 = tok_len(b0);
    uint32_t b1 = (uint32_t)(w >> ((8 * l0) & 63)) & 0xff, l1 = tok_len(b1); /* l0 <= 5 unless !ok */
    *ok &= (uint32_t)tok_simple(b0) & (uint32_t)tok_simple(b1); /* branch-free: both are pure */
    const uint8_t *q = p + l0;
    out[0] = tok_val(__builtin_bswap64(w), l0);
    out[1] = tok_val(kvi_load_be64(q), l1);
    return q + l1;
}

/* Flat token array elements (the first one not yet read). */
static int read_tokens_flat(struct cur *c, uint32_t n, unsigned depth, uint32_t *out, bool *bad)
{
    const uint8_t *p = c->p, *end = c->end;
    uint32_t i = 0;
    bool pairs = false;
    while (n - i >= TOK_CHUNK && (size_t)(end - p) >= TOK_CHUNK_BYTES) {
        uint32_t stop = i + TOK_CHUNK, changes = 0, prev = *p;
        if (pairs) {
            const uint8_t *p0 = p;
            uint32_t ok = 1;
            for (; i < stop; i += 2) {
                changes += *p != prev;
                prev = *p;
                p = tok_pair(p, out + i, &ok);
            }
            if (KVI_UNLIKELY(!ok)) {
                p = p0;
                i = stop - TOK_CHUNK;
                break;
            }
            pairs = changes >= TOK_PAIRS_STAY;
            continue;
        }
        for (; i < stop; i++) {
            uint8_t b = *p;
            changes += b != prev;
            prev = b;
            if (b <= 0x7f) {
                out[i] = b;
                p += 1;
            } else if (b == 0xce) {
                out[i] = kvi_load_be32(p + 1);
                p += 5;
            } else if (b == 0xcd) {
                out[i] = kvi_load_be16(p + 1);
                p += 3;
            } else if (b == 0xcc) {
                out[i] = p[1];
                p += 2;
            } else {
                goto careful;
            }
        }
        pairs = changes >= TOK_PAIRS_ENTER;
    }
careful:
    for (; i < n; i++) {
        if (KVI_LIKELY(end - p >= 5)) {
            uint8_t b = *p;
            if (b <= 0x7f) {
                out[i] = b;
                p += 1;
                continue;
            }
            if (b == 0xce) {
                out[i] = kvi_load_be32(p + 1);
                p += 5;
                continue;
            }
            if (b == 0xcd) {
                out[i] = kvi_load_be16(p + 1);
                p += 3;
                continue;
            }
            if (b == 0xcc) {
                out[i] = p[1];
                p += 2;
                continue;
            }
        }
        c->p = p;
        struct mp_val v;
        int e = kvi_dec__mp_next(c, &v);
        if (e)
            return e;
        if (KVI_UNLIKELY(!token_of(&v, &out[i]))) {
            return skip_bad_rest(c, &v, n - i - 1, depth, bad);
        }
        p = c->p;
    }
    c->p = p;
    return 0;
}

/* Pair token array: @p first is the header of element 0 (an array). Output:
 * the first of every pair, then the second of the last pair (n + 1 ids). */
static int read_tokens_pairs(struct cur *c, uint32_t n, unsigned depth, struct mp_val first, uint32_t *out,
                             bool *bad)
{
    struct mp_val v = first;
    for (uint32_t i = 0; i < n; i++) {
        int e;
        if (i > 0 && (e = kvi_dec__mp_next(c, &v)))
            return e;
        if (v.t != MP_ARRAY || v.n != 2) {
            return skip_bad_rest(c, &v, n - i - 1, depth, bad);
        }
        struct mp_val a, b;
        if ((e = kvi_dec__mp_next(c, &a)) || (e = kvi_dec__mp_skip_body(c, &a, depth + 1)) ||
            (e = kvi_dec__mp_next(c, &b)) || (e = kvi_dec__mp_skip_body(c, &b, depth + 1)))
            return e;
        uint32_t ta, tb;
        if (!token_of(&a, &ta) || !token_of(&b, &tb)) {
            *bad = true;
            return kvi_dec__mp_skip_n(c, n - i - 1, depth);
        }
        out[i] = ta;
        out[i + 1] = tb; /* overwritten by the next pair's first */
    }
    return 0;
}

/* block_hashes / seq_hashes value at depth D_FIELD. */
static int field_hashes(struct kvi_decoder *d, struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    if (v.t != MP_ARRAY) {
        x->bad = true;
        x->have_hashes = false;
        return kvi_dec__mp_skip_body(c, &v, D_FIELD);
    }
    if ((e = kvi_dec__vec64_reserve(&d->hashes, v.n)))
        return e;
    x->fix.h = d->hashes.n;
    x->ev.n_hashes = v.n;
    x->have_hashes = true;
    e = read_hashes(c, v.n, D_ELEM, d->hashes.v + d->hashes.n, &x->bad);
    d->hashes.n += v.n;
    return e;
}

/* parent_block_hash / parent_hash: nil, int or bin. */
static int field_parent(struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    x->ev.has_parent = false;
    if (v.t == MP_NIL)
        return 0;
    if (hash_of(&v, &x->ev.parent_hash)) {
        x->ev.has_parent = true;
        return 0;
    }
    x->bad = true;
    return kvi_dec__mp_skip_body(c, &v, D_FIELD);
}

/* token_ids: nil, [], flat ints or [a, b] pairs. */
static int field_tokens(struct kvi_decoder *d, struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    x->ev.n_tokens = 0;
    x->fix.t = SIZE_MAX;
    if (v.t == MP_NIL) {
        x->ev.tokens_form = KVI_TOK_ABSENT;
        return 0;
    }
    if (v.t != MP_ARRAY) {
        x->bad = true;
        return kvi_dec__mp_skip_body(c, &v, D_FIELD);
    }
    if ((e = kvi_dec__vec32_reserve(&d->tokens, (size_t)v.n + 1)))
        return e;
    x->fix.t = d->tokens.n;
    uint32_t *out = d->tokens.v + d->tokens.n;
    if (v.n == 0) {
        x->ev.tokens_form = KVI_TOK_EMPTY;
        return 0;
    }
    /* the first element decides flat or pairs */
    if (KVI_LIKELY(c->p < c->end && (*c->p & 0xf0) != 0x90 && *c->p != 0xdc && *c->p != 0xdd)) {
        x->ev.tokens_form = KVI_TOK_FLAT;
        x->ev.n_tokens = v.n;
        e = read_tokens_flat(c, v.n, D_ELEM, out, &x->bad);
    } else {
        struct mp_val first;
        if ((e = kvi_dec__mp_next(c, &first)))
            return e;
        x->ev.tokens_form = KVI_TOK_PAIRS;
        x->ev.n_tokens = v.n + 1;
        e = read_tokens_pairs(c, v.n, D_ELEM, first, out, &x->bad);
    }
    d->tokens.n += x->ev.n_tokens;
    return e;
}

/* An unsigned 32-bit field (block_size, base_block_idx): nil = absent. */
static int field_u32(struct cur *c, struct evctx *x, bool *has, uint32_t *val)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    *has = false;
    if (v.t == MP_NIL)
        return 0;
    if (v.t == MP_UINT && v.u <= UINT32_MAX) {
        *has = true;
        *val = (uint32_t)v.u;
        return 0;
    }
    x->bad = true;
    return kvi_dec__mp_skip_body(c, &v, D_FIELD);
}

/* group_idx: nil = -1, else an int in [0, 2^31). */
static int field_group(struct cur *c, struct evctx *x, const struct mp_val *v)
{
    if (v->t == MP_NIL) {
        x->ev.group_idx = -1;
        return 0;
    }
    if (v->t == MP_UINT && v->u <= INT32_MAX) {
        x->ev.group_idx = (int32_t)v->u;
        return 0;
    }
    x->bad = true;
    return kvi_dec__mp_skip_body(c, v, D_FIELD);
}

/* A string field: nil = NULL. */
static int field_str(struct cur *c, struct evctx *x, const char **s, uint32_t *len)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    *s = NULL;
    *len = 0;
    if (v.t == MP_NIL)
        return 0;
    if (v.t == MP_STR) {
        *s = (const char *)v.ptr;
        *len = v.n;
        return 0;
    }
    x->bad = true;
    return kvi_dec__mp_skip_body(c, &v, D_FIELD);
}

/* medium: nil = gpu; a string through kvi_medium_tier. */
static int field_medium(struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    x->ev.tier = KVI_TIER_GPU;
    x->ev.medium_unknown = false;
    if (v.t == MP_NIL)
        return 0;
    if (v.t == MP_STR) {
        bool known;
        x->ev.tier = (uint8_t)kvi_medium_tier((const char *)v.ptr, v.n, &known);
        x->ev.medium_unknown = !known;
        return 0;
    }
    x->bad = true;
    return kvi_dec__mp_skip_body(c, &v, D_FIELD);
}

/* SGLang metadata map (array position 7) whose header @p v was read:
 * cache_salt is taken, other keys ignored. */
static int field_meta_map(struct cur *c, struct evctx *x, const struct mp_val *v)
{
    for (uint32_t i = 0; i < v->n; i++) {
        struct mp_val k;
        int e = kvi_dec__mp_next(c, &k);
        if (e)
            return e;
        if (k.t == MP_STR && KEY_IS(&k, "cache_salt")) {
            e = field_str(c, x, &x->ev.cache_salt, &x->ev.salt_len);
        } else {
            e = kvi_dec__mp_skip_body(c, &k, D_ELEM);
            if (!e)
                e = kvi_dec__mp_skip(c, D_ELEM);
        }
        if (e)
            return e;
    }
    return 0;
}

/* Remember where a deferred field's value starts, and skip it. */
static int field_defer(struct cur *c, const uint8_t **where)
{
    *where = c->p;
    return kvi_dec__mp_skip(c, D_FIELD);
}

/* Start mm output for an event with @p nb blocks. */
static int mm_begin(struct kvi_decoder *d, struct evctx *x, uint32_t nb)
{
    int e = kvi_dec__vec32_reserve(&d->mmoff, (size_t)nb + 1);
    if (e)
        return e;
    x->fix.mo = d->mmoff.n;
    x->fix.mm = d->mm.n;
    d->mmoff.v[d->mmoff.n] = 0;
    return 0;
}

static int mm_push(struct kvi_decoder *d, uint64_t h)
{
    int e = kvi_dec__vec64_reserve(&d->mm, 1);
    if (e)
        return e;
    d->mm.v[d->mm.n++] = h;
    return 0;
}

/* Close block @p b (0-based; blocks >= nb are discarded by the caller). */
static inline void mm_close_block(struct kvi_decoder *d, struct evctx *x, uint32_t b)
{
    d->mmoff.v[x->fix.mo + b + 1] = (uint32_t)(d->mm.n - x->fix.mm);
}

/* Finish: fill offsets of blocks without entries; drop everything when no
 * block got an mm hash. */
static void mm_end(struct kvi_decoder *d, struct evctx *x, uint32_t filled, uint32_t nb)
{
    uint32_t total = (uint32_t)(d->mm.n - x->fix.mm);
    if (total == 0) {
        x->fix.mo = x->fix.mm = SIZE_MAX;
        return;
    }
    for (uint32_t b = filled; b < nb; b++)
        d->mmoff.v[x->fix.mo + b + 1] = total;
    d->mmoff.n += (size_t)nb + 1;
}

/* extra_keys (vLLM): nil, or per block nil / [items]; an item that is a
 * 64-hex string, or [64-hex string, int], is an mm hash; other items are
 * ignored. Entries past the last block are checked and dropped. */
static int read_extra_keys(struct kvi_decoder *d, struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e || v.t == MP_NIL)
        return e;
    if (v.t != MP_ARRAY) {
        x->bad = true;
        return kvi_dec__mp_skip_body(c, &v, D_FIELD);
    }
    uint32_t nb = x->ev.n_hashes;
    if ((e = mm_begin(d, x, nb)))
        return e;
    uint32_t b;
    for (b = 0; b < v.n; b++) {
        struct mp_val ent;
        if ((e = kvi_dec__mp_next(c, &ent)))
            return e;
        if (ent.t == MP_ARRAY) {
            for (uint32_t i = 0; i < ent.n; i++) {
                struct mp_val it;
                uint64_t h;
                if ((e = kvi_dec__mp_next(c, &it)))
                    return e;
                bool got = mm_hash_of_str(&it, &h);
                if (!got && it.t == MP_ARRAY && it.n == 2) {
                    struct mp_val s, off;
                    if ((e = kvi_dec__mp_next(c, &s)) || (e = kvi_dec__mp_skip_body(c, &s, D_ELEM + 2)) ||
                        (e = kvi_dec__mp_next(c, &off)) || (e = kvi_dec__mp_skip_body(c, &off, D_ELEM + 2)))
                        return e;
                    got = (off.t == MP_UINT || off.t == MP_NINT) && mm_hash_of_str(&s, &h);
                } else if ((e = kvi_dec__mp_skip_body(c, &it, D_ELEM + 1))) {
                    return e;
                }
                if (got && b < nb && (e = mm_push(d, h)))
                    return e;
            }
        } else if (ent.t != MP_NIL) {
            x->bad = true;
            if ((e = kvi_dec__mp_skip_body(c, &ent, D_ELEM)))
                return e;
        }
        if (b < nb)
            mm_close_block(d, x, b);
    }
    mm_end(d, x, b < nb ? b : nb, nb);
    return 0;
}

/* One BlockMmObjectInfo: {"mm_hash": int, "offsets": ...} or [mm_hash, offsets]. */
static int read_mm_object(struct kvi_decoder *d, struct cur *c, struct evctx *x, bool keep, unsigned depth)
{
    struct mp_val o;
    int e = kvi_dec__mp_next(c, &o);
    if (e)
        return e;
    bool got = false;
    uint64_t h = 0;
    if (o.t == MP_MAP) {
        for (uint32_t i = 0; i < o.n; i++) {
            struct mp_val k, val;
            if ((e = kvi_dec__mp_next(c, &k)) || (e = kvi_dec__mp_skip_body(c, &k, depth + 1)) ||
                (e = kvi_dec__mp_next(c, &val)) || (e = kvi_dec__mp_skip_body(c, &val, depth + 1)))
                return e;
            if (k.t == MP_STR && KEY_IS(&k, "mm_hash")) {
                got = val.t == MP_UINT || val.t == MP_NINT;
                h = val.t == MP_NINT ? (uint64_t)val.i : val.u;
            }
        }
    } else if (o.t == MP_ARRAY && o.n >= 1) {
        struct mp_val val;
        if ((e = kvi_dec__mp_next(c, &val)) || (e = kvi_dec__mp_skip_body(c, &val, depth + 1)) ||
            (e = kvi_dec__mp_skip_n(c, o.n - 1, depth + 1)))
            return e;
        got = val.t == MP_UINT || val.t == MP_NINT;
        h = val.t == MP_NINT ? (uint64_t)val.i : val.u;
    } else if ((e = kvi_dec__mp_skip_body(c, &o, depth))) {
        return e;
    }
    if (!got) {
        x->bad = true;
        return 0;
    }
    return keep ? mm_push(d, h) : 0;
}

/* block_mm_infos (Dynamo): nil, or per block nil / BlockExtraInfo, which is
 * {"mm_objects": [obj, ...]} or [[obj, ...]] (struct as array). */
static int read_block_mm_infos(struct kvi_decoder *d, struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e || v.t == MP_NIL)
        return e;
    if (v.t != MP_ARRAY) {
        x->bad = true;
        return kvi_dec__mp_skip_body(c, &v, D_FIELD);
    }
    uint32_t nb = x->ev.n_hashes;
    if ((e = mm_begin(d, x, nb)))
        return e;
    uint32_t b;
    for (b = 0; b < v.n; b++) {
        bool keep = b < nb;
        struct mp_val ent;
        if ((e = kvi_dec__mp_next(c, &ent)))
            return e;
        /* find the mm_objects array inside the entry */
        struct mp_val objs = {.t = MP_NIL};
        if (ent.t == MP_MAP) {
            for (uint32_t i = 0; i < ent.n; i++) {
                struct mp_val k;
                if ((e = kvi_dec__mp_next(c, &k)) || (e = kvi_dec__mp_skip_body(c, &k, D_ELEM + 1)))
                    return e;
                if (k.t == MP_STR && KEY_IS(&k, "mm_objects") && objs.t == MP_NIL) {
                    if ((e = kvi_dec__mp_next(c, &objs)))
                        return e;
                    if (objs.t != MP_ARRAY) {
                        x->bad = true;
                        if ((e = kvi_dec__mp_skip_body(c, &objs, D_ELEM + 1)))
                            return e;
                        objs.t = MP_BOOL; /* seen, unusable */
                        continue;
                    }
                    for (uint32_t j = 0; j < objs.n; j++)
                        if ((e = read_mm_object(d, c, x, keep, D_ELEM + 2)))
                            return e;
                } else if ((e = kvi_dec__mp_skip(c, D_ELEM + 1))) {
                    return e;
                }
            }
            if (objs.t == MP_NIL)
                x->bad = true;
        } else if (ent.t == MP_ARRAY && ent.n >= 1) {
            if ((e = kvi_dec__mp_next(c, &objs)))
                return e;
            if (objs.t == MP_ARRAY) {
                for (uint32_t j = 0; j < objs.n; j++)
                    if ((e = read_mm_object(d, c, x, keep, D_ELEM + 2)))
                        return e;
            } else {
                x->bad = true;
                if ((e = kvi_dec__mp_skip_body(c, &objs, D_ELEM + 1)))
                    return e;
            }
            if ((e = kvi_dec__mp_skip_n(c, ent.n - 1, D_ELEM + 1)))
                return e;
        } else if (ent.t != MP_NIL) {
            x->bad = true;
            if ((e = kvi_dec__mp_skip_body(c, &ent, D_ELEM)))
                return e;
        }
        if (keep)
            mm_close_block(d, x, b);
    }
    mm_end(d, x, b < nb ? b : nb, nb);
    return 0;
}

static void ev_init(struct kvi_decoder *d, struct evctx *x, uint8_t family)
{
    memset(x, 0, sizeof *x);
    x->ev.family = family;
    x->ev.tier = KVI_TIER_GPU;
    x->ev.group_idx = -1;
    x->fix = (struct ev_fix){SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    x->tag = TAG_NONE;
    x->h0 = d->hashes.n;
    x->t0 = d->tokens.n;
    x->mm0 = d->mm.n;
    x->mo0 = d->mmoff.n;
}

static void ev_rollback(struct kvi_decoder *d, const struct evctx *x)
{
    d->hashes.n = x->h0;
    d->tokens.n = x->t0;
    d->mm.n = x->mm0;
    d->mmoff.n = x->mo0;
}

/* Read the deferred mm fields (block_mm_infos wins over extra_keys, as in
 * Dynamo), then keep, or count and drop, the event. */
static int ev_finish(struct kvi_decoder *d, struct cur *c, struct evctx *x, struct kvi_batch *out)
{
    if (x->tag == TAG_STORED && (x->mmi || x->xk)) {
        struct cur sub = {x->mmi ? x->mmi : x->xk, c->end};
        int e = x->mmi ? read_block_mm_infos(d, &sub, x) : read_extra_keys(d, &sub, x);
        if (e)
            return e;
    }
    if (x->tag == TAG_UNKNOWN) {
        out->n_unknown++;
        ev_rollback(d, x);
        return 0;
    }
    bool need_hashes = x->tag == TAG_STORED || x->tag == TAG_REMOVED;
    if (x->tag == TAG_NONE || x->bad || (need_hashes && !x->have_hashes)) {
        out->n_invalid++;
        ev_rollback(d, x);
        return 0;
    }
    x->ev.type = (uint8_t)x->tag;
    if (x->ev.family == KVI_EVF_MAP && (x->rfc_key || x->short_tag))
        x->ev.family = KVI_EVF_RFC1527;
    d->ev[d->n_ev] = x->ev;
    d->fix[d->n_ev] = x->fix;
    d->n_ev++;
    return 0;
}

/* Tagged array event: @p n elements, header already read. */
static int event_array(struct kvi_decoder *d, struct cur *c, uint32_t n, struct kvi_batch *out)
{
    struct evctx x;
    ev_init(d, &x, KVI_EVF_ARRAY);
    uint32_t pos = 0;
    int e;
    if (n > 0) {
        struct mp_val tag;
        if ((e = kvi_dec__mp_next(c, &tag)))
            return e;
        pos = 1;
        if (tag.t == MP_STR) {
            x.tag = classify_tag(&tag, &x.short_tag);
        } else if ((e = kvi_dec__mp_skip_body(c, &tag, D_FIELD))) {
            return e;
        }
    }
    if (x.tag == TAG_STORED) {
        for (; pos < n && pos <= 10; pos++) {
            struct mp_val v;
            switch (pos) {
            case 1:
                e = field_hashes(d, c, &x);
                break;
            case 2:
                e = field_parent(c, &x);
                break;
            case 3:
                e = field_tokens(d, c, &x);
                break;
            case 4:
                e = field_u32(c, &x, &x.ev.has_block_size, &x.ev.block_size);
                break;
            case 6:
                e = field_medium(c, &x);
                break;
            case 7: /* lora_name (str / nil) or SGLang metadata map */
                if (c->p < c->end && ((*c->p & 0xf0) == 0x80 || *c->p == 0xde || *c->p == 0xdf)) {
                    if (!(e = kvi_dec__mp_next(c, &v)))
                        e = field_meta_map(c, &x, &v);
                } else {
                    e = field_str(c, &x, &x.ev.lora_name, &x.ev.lora_len);
                }
                break;
            case 8:
                e = field_defer(c, &x.xk);
                break;
            case 9: /* group_idx (int / nil) or Dynamo block_mm_infos (array) */
                if (c->p < c->end && ((*c->p & 0xf0) == 0x90 || *c->p == 0xdc || *c->p == 0xdd)) {
                    e = field_defer(c, &x.mmi);
                } else if (!(e = kvi_dec__mp_next(c, &v))) {
                    e = field_group(c, &x, &v);
                }
                break;
            case 10:
                e = field_str(c, &x, &x.ev.spec_kind, &x.ev.spec_kind_len);
                break;
            default: /* 5: lora_id, ignored */
                e = kvi_dec__mp_skip(c, D_FIELD);
                break;
            }
            if (e)
                return e;
        }
    } else if (x.tag == TAG_REMOVED) {
        for (; pos < n && pos <= 3; pos++) {
            struct mp_val v;
            if (pos == 1) {
                e = field_hashes(d, c, &x);
            } else if (pos == 2) {
                e = field_medium(c, &x);
            } else if (!(e = kvi_dec__mp_next(c, &v))) {
                e = field_group(c, &x, &v);
            }
            if (e)
                return e;
        }
    }
    /* AllBlocksCleared, unknown tags, no tag, and trailing extras */
    if ((e = kvi_dec__mp_skip_n(c, n - pos, D_FIELD)))
        return e;
    return ev_finish(d, c, &x, out);
}

/* Tags seen in a map event: `type` (vLLM, SGLang, Dynamo; RFC 1527 legacy
 * alias) and `event_type` (RFC 1527), which wins when both are present. */
struct map_tags {
    int type, etype;
    bool type_short, etype_short;
};

static int map_tag(struct cur *c, int *tag, bool *short_tag)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    *short_tag = false;
    if (v.t == MP_STR) {
        *tag = classify_tag(&v, short_tag);
        return 0;
    }
    *tag = TAG_NONE; /* a non-string tag: the event cannot be classified */
    return kvi_dec__mp_skip_body(c, &v, D_FIELD);
}

/* Decode the value of string key @p k of a map event. Unknown keys
 * (lora_id, locality, ownership, session_id, ...) are skipped. */
static int map_field(struct kvi_decoder *d, struct cur *c, struct evctx *x, const struct mp_val *k,
                     struct map_tags *t)
{
    struct mp_val v;
    int e;
    switch (k->n) {
    case 4:
        if (KEY_IS(k, "type"))
            return map_tag(c, &t->type, &t->type_short);
        break;
    case 6:
        if (KEY_IS(k, "medium"))
            return field_medium(c, x);
        break;
    case 9:
        if (KEY_IS(k, "token_ids"))
            return field_tokens(d, c, x);
        if (KEY_IS(k, "lora_name"))
            return field_str(c, x, &x->ev.lora_name, &x->ev.lora_len);
        if (KEY_IS(k, "group_idx"))
            return (e = kvi_dec__mp_next(c, &v)) ? e : field_group(c, x, &v);
        break;
    case 10:
        if (KEY_IS(k, "block_size"))
            return field_u32(c, x, &x->ev.has_block_size, &x->ev.block_size);
        if (KEY_IS(k, "event_type")) {
            x->rfc_key = true;
            return map_tag(c, &t->etype, &t->etype_short);
        }
        if (KEY_IS(k, "seq_hashes")) {
            x->rfc_key = true;
            return field_hashes(d, c, x);
        }
        if (KEY_IS(k, "extra_keys"))
            return field_defer(c, &x->xk);
        if (KEY_IS(k, "backend_id"))
            return field_str(c, x, &x->ev.backend_id, &x->ev.backend_len);
        if (KEY_IS(k, "object_key"))
            return field_str(c, x, &x->ev.object_key, &x->ev.object_key_len);
        if (KEY_IS(k, "cache_salt"))
            return field_str(c, x, &x->ev.cache_salt, &x->ev.salt_len);
        break;
    case 11:
        if (KEY_IS(k, "parent_hash"))
            return field_parent(c, x);
        break;
    case 12:
        if (KEY_IS(k, "block_hashes"))
            return field_hashes(d, c, x);
        break;
    case 14:
        if (KEY_IS(k, "base_block_idx"))
            return field_u32(c, x, &x->ev.has_base_idx, &x->ev.base_block_idx);
        if (KEY_IS(k, "block_mm_infos")) {
            if (c->p < c->end && *c->p == 0xc0) { /* nil: not given, extra_keys applies */
                c->p++;
                x->mmi = NULL;
                return 0;
            }
            return field_defer(c, &x->mmi);
        }
        break;
    case 17:
        if (KEY_IS(k, "parent_block_hash"))
            return field_parent(c, x);
        break;
    case 18:
        if (KEY_IS(k, "kv_cache_spec_kind"))
            return field_str(c, x, &x->ev.spec_kind, &x->ev.spec_kind_len);
        break;
    default:
        break;
    }
    return kvi_dec__mp_skip(c, D_FIELD);
}

/* Tagged map / RFC 1527 event: @p n pairs, header already read. */
static int event_map(struct kvi_decoder *d, struct cur *c, uint32_t n, struct kvi_batch *out)
{
    struct evctx x;
    ev_init(d, &x, KVI_EVF_MAP);
    struct map_tags t = {TAG_NONE, TAG_NONE, false, false};
    for (uint32_t i = 0; i < n; i++) {
        struct mp_val k;
        int e = kvi_dec__mp_next(c, &k);
        if (e)
            return e;
        if (k.t == MP_STR)
            e = map_field(d, c, &x, &k, &t);
        else if (!(e = kvi_dec__mp_skip_body(c, &k, D_FIELD))) /* non-string keys are ignored */
            e = kvi_dec__mp_skip(c, D_FIELD);
        if (e)
            return e;
    }
    x.tag = t.etype != TAG_NONE ? t.etype : t.type;
    x.short_tag = t.etype != TAG_NONE ? t.etype_short : t.type_short;
    return ev_finish(d, c, &x, out);
}

/* One element of the events array. */
static int event_one(struct kvi_decoder *d, struct cur *c, struct kvi_batch *out)
{
    int e = kvi_dec__events_reserve(d, 1);
    if (e)
        return e;
    /* fast dispatch on the header byte */
    if (c->p < c->end) {
        uint8_t b = *c->p;
        if ((b & 0xf0) == 0x90) {
            c->p++;
            return event_array(d, c, b & 0x0f, out);
        }
        if ((b & 0xf0) == 0x80) {
            c->p++;
            if ((size_t)(b & 0x0f) > (size_t)(c->end - c->p) / 2)
                return KVI_DEC_MSGPACK;
            return event_map(d, c, b & 0x0f, out);
        }
    }
    struct mp_val v;
    if ((e = kvi_dec__mp_next(c, &v)))
        return e;
    if (v.t == MP_ARRAY)
        return event_array(d, c, v.n, out);
    if (v.t == MP_MAP)
        return event_map(d, c, v.n, out);
    out->n_invalid++; /* a scalar, string, bin or ext is not an event */
    return kvi_dec__mp_skip_body(c, &v, D_EVENT);
}

/* ------------------------------------------------------------------------ */
/* the events array                                                          */
/* ------------------------------------------------------------------------ */

int kvi_dec__batch_events(struct kvi_decoder *d, struct cur *c, struct kvi_batch *out)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    if (e)
        return e;
    if (v.t != MP_ARRAY)
        return KVI_DEC_EVENTS;
    for (uint32_t i = 0; i < v.n; i++)
        if ((e = event_one(d, c, out)))
            return e;
    return 0;
}
