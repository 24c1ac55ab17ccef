/*
 * KV-event batch decoder (net/decode.h): a hand-written zero-copy msgpack
 * cursor over the ZMQ payload frame.
 *
 * DECISION: cursor reader, not msgpack-c. Measured with `kvidx-bench decode`
 * (bench/decode_bench.c) on the same synthetic vLLM batches (Mooncake-like:
 * 1-8 events per batch, BlockStored of 1-32 u64 hashes with 16 token ids
 * per block from a 152k vocabulary, 20 % BlockRemoved; 4.7 KB per batch as
 * arrays, 5.2 KB as maps), one core, thread CPU time, on the shared 2-vCPU
 * VM (load ~11); 5 runs of 5 passes, best of the run bests / median of the
 * run medians:
 *
 *   form   decoder                       MB/s          batches/s  stored blocks/s
 *   array  cursor (this file)        1,244 / 1,164     0.26 M      15.7 / 14.7 M
 *   array  msgpack-c unpack + walk     460 /   444     0.10 M       5.8 /  5.6 M
 *   map    cursor (this file)        1,328 / 1,282     0.26 M      15.3 / 14.8 M
 *   map    msgpack-c unpack + walk     493 /   464     0.10 M       5.7 /  5.3 M
 *
 * (2.7-2.8x. Small SGLang-like batches, 1 event of 1 block: 5.2 M vs 3.8 M
 * batches/s as arrays, 5.0 M vs 3.1 M as maps. A 32k vocabulary, uniform
 * uint16 ids: 29 M vs 6.3 M blocks/s. bin32 hashes: 13.5 M vs 5.5 M.)
 * msgpack-c builds a 24-byte object per element in its zone and the walk
 * reads them again; the cursor reads each byte once and writes hashes and
 * token ids straight into reused scratch arrays. Before the hybrid token
 * loop below, the cursor ran at 880 MB/s / 11 M blocks/s: token ids are
 * ~80 % of the decoding time. The msgpack-c walker stays in the benchmark
 * as the reference.
 *
 * DESIGN
 *   - One pass over the frame. A value is read by mp_next (one header, and
 *     the payload of scalars, strings and bins); hash and token arrays have
 *     unrolled fast paths for the widths engines use (uint64, fixint,
 *     uint16, uint32) and fall back to mp_next for any other width.
 *   - Every value the decoder does not use is skipped structurally by
 *     mp_skip_body (iterative, depth-limited), so the whole frame is
 *     validated as msgpack: 0xc1, truncation and trailing bytes anywhere
 *     fail the batch (KVI_DEC_MSGPACK), even inside ignored keys.
 *   - Hostile input: every length and element count is checked against the
 *     bytes left before anything is read or reserved (an element takes at
 *     least one byte, a map entry two), so scratch never exceeds a few times
 *     the frame size, and frames are capped at KVI_DECODE_MAX_FRAME.
 *     Nesting is capped at KVI_DECODE_MAX_DEPTH. Multi-byte reads go
 *     through memcpy (no alignment assumptions). No recursion.
 *   - Scratch: events, hashes, tokens, mm hashes and mm offsets live in
 *     per-decoder growable arrays reused from batch to batch (high-water
 *     mark kept, up to KVI_DECODE_KEEP_SCRATCH once kvi_decoder_trim ran).
 *     Events record offsets while decoding and get their pointers at the
 *     end of the batch, because the arrays may move while they grow. A
 *     skipped event rolls the arrays back.
 *   - Map events are decoded in one pass whatever the key order: every
 *     known key is decoded as it comes; extra_keys / block_mm_infos need
 *     the block count, so their positions are remembered and they are read
 *     after the map.
 *   - The entry point takes (bytes, length) and touches no global state, so
 *     a libFuzzer target is one call.
 *
 * Thread-safety: a decoder is used by one thread at a time; decoders share
 * nothing.
 */
#include "net/decode.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "net/decode.c assumes a little-endian host"
#endif

/* Depths (the batch is depth 1), used when skipping. */
#define D_BATCH_ITEM 2 /* ts, events, rank, map-batch values */
#define D_EVENT 3
#define D_FIELD 4
#define D_ELEM 5

/* Initial scratch capacities (grown by doubling). */
#define INIT_EVENTS 64
#define INIT_HASHES 1024
#define INIT_TOKENS 8192
#define INIT_MM 64
#define INIT_MMOFF 256

/* ------------------------------------------------------------------------ */
/* msgpack cursor                                                            */
/* ------------------------------------------------------------------------ */

enum mp_type {
    MP_NIL,
    MP_BOOL,
    MP_UINT, /* any integer >= 0, whatever its wire width or signedness */
    MP_NINT, /* integer < 0 */
    MP_FLOAT,
    MP_STR,
    MP_BIN,
    MP_ARRAY,
    MP_MAP,
    MP_EXT,
};

struct mp_val {
    uint8_t t;     /* enum mp_type */
    uint32_t n;    /* ARRAY / MAP element (pair) count; STR / BIN / EXT length */
    const uint8_t *ptr; /* STR / BIN / EXT payload */
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
    };
};

struct cur {
    const uint8_t *p, *end;
};

static inline uint16_t be16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return __builtin_bswap16(v);
}
static inline uint32_t be32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return __builtin_bswap32(v);
}
static inline uint64_t be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return __builtin_bswap64(v);
}

/* Read one value header (and the payload of scalars, strings, bins, exts).
 * Containers: only the header; n = element (pair) count, already checked
 * against the bytes left. @return 0 or KVI_DEC_MSGPACK. */
static int mp_next(struct cur *c, struct mp_val *v)
{
    const uint8_t *p = c->p;
    size_t left = (size_t)(c->end - p);
    if (KVI_UNLIKELY(left == 0))
        return KVI_DEC_MSGPACK;
    uint8_t b = *p++;
    left--;
    size_t len; /* payload length (str/bin/ext) or element count */
    if (b <= 0x7f) {
        v->t = MP_UINT;
        v->u = b;
        c->p = p;
        return 0;
    }
    if (b >= 0xe0) {
        v->t = MP_NINT;
        v->i = (int8_t)b;
        c->p = p;
        return 0;
    }
    switch (b >> 4) {
    case 0x8:
        len = b & 0x0f;
        goto map;
    case 0x9:
        len = b & 0x0f;
        goto array;
    case 0xa:
    case 0xb:
        len = b & 0x1f;
        goto str;
    default:
        break;
    }
    /* 0xc0 .. 0xdf: width from a table of header sizes. */
    static const uint8_t need[32] = {
        /* c0 nil */ 0, /* c1 */ 0, /* c2 c3 */ 0, 0,
        /* c4 c5 c6 bin */ 1, 2, 4,
        /* c7 c8 c9 ext */ 2, 3, 5,
        /* ca cb float */ 4, 8,
        /* cc-cf uint */ 1, 2, 4, 8,
        /* d0-d3 int */ 1, 2, 4, 8,
        /* d4-d8 fixext */ 2, 3, 5, 9, 17,
        /* d9 da db str */ 1, 2, 4,
        /* dc dd array */ 2, 4,
        /* de df map */ 2, 4,
    };
    if (KVI_UNLIKELY(b == 0xc1))
        return KVI_DEC_MSGPACK;
    if (KVI_UNLIKELY(left < need[b - 0xc0]))
        return KVI_DEC_MSGPACK;
    switch (b) {
    case 0xc0:
        v->t = MP_NIL;
        break;
    case 0xc2:
    case 0xc3:
        v->t = MP_BOOL;
        v->b = b == 0xc3;
        break;
    case 0xc4:
        len = p[0];
        p += 1;
        goto bin;
    case 0xc5:
        len = be16(p);
        p += 2;
        goto bin;
    case 0xc6:
        len = be32(p);
        p += 4;
        goto bin;
    case 0xc7:
        len = p[0];
        p += 2;
        goto ext;
    case 0xc8:
        len = be16(p);
        p += 3;
        goto ext;
    case 0xc9:
        len = be32(p);
        p += 5;
        goto ext;
    case 0xca: {
        uint32_t w = be32(p);
        float f;
        memcpy(&f, &w, sizeof f);
        v->t = MP_FLOAT;
        v->f = f;
        p += 4;
        break;
    }
    case 0xcb: {
        uint64_t w = be64(p);
        v->t = MP_FLOAT;
        memcpy(&v->f, &w, sizeof v->f);
        p += 8;
        break;
    }
    case 0xcc:
        v->t = MP_UINT;
        v->u = p[0];
        p += 1;
        break;
    case 0xcd:
        v->t = MP_UINT;
        v->u = be16(p);
        p += 2;
        break;
    case 0xce:
        v->t = MP_UINT;
        v->u = be32(p);
        p += 4;
        break;
    case 0xcf:
        v->t = MP_UINT;
        v->u = be64(p);
        p += 8;
        break;
    case 0xd0:
        v->i = (int8_t)p[0];
        p += 1;
        goto sint;
    case 0xd1:
        v->i = (int16_t)be16(p);
        p += 2;
        goto sint;
    case 0xd2:
        v->i = (int32_t)be32(p);
        p += 4;
        goto sint;
    case 0xd3:
        v->i = (int64_t)be64(p);
        p += 8;
        goto sint;
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        len = (size_t)1 << (b - 0xd4);
        p += 1;
        v->t = MP_EXT;
        v->ptr = p;
        v->n = (uint32_t)len;
        p += len;
        break;
    case 0xd9:
        len = p[0];
        p += 1;
        goto str;
    case 0xda:
        len = be16(p);
        p += 2;
        goto str;
    case 0xdb:
        len = be32(p);
        p += 4;
        goto str;
    case 0xdc:
        len = be16(p);
        p += 2;
        goto array;
    case 0xdd:
        len = be32(p);
        p += 4;
        goto array;
    case 0xde:
        len = be16(p);
        p += 2;
        goto map;
    case 0xdf:
        len = be32(p);
        p += 4;
        goto map;
    default:
        return KVI_DEC_MSGPACK; /* unreachable: every byte is covered */
    }
    c->p = p;
    return 0;

sint:
    v->t = v->i < 0 ? MP_NINT : MP_UINT;
    c->p = p;
    return 0;
str:
    v->t = MP_STR;
    goto payload;
bin:
    v->t = MP_BIN;
    goto payload;
ext:
    v->t = MP_EXT;
payload:
    if (KVI_UNLIKELY(len > (size_t)(c->end - p)))
        return KVI_DEC_MSGPACK;
    v->ptr = p;
    v->n = (uint32_t)len;
    c->p = p + len;
    return 0;
array:
    /* every element takes at least one byte */
    if (KVI_UNLIKELY(len > (size_t)(c->end - p)))
        return KVI_DEC_MSGPACK;
    v->t = MP_ARRAY;
    v->n = (uint32_t)len;
    c->p = p;
    return 0;
map:
    /* every entry takes at least two bytes */
    if (KVI_UNLIKELY(len > (size_t)(c->end - p) / 2))
        return KVI_DEC_MSGPACK;
    v->t = MP_MAP;
    v->n = (uint32_t)len;
    c->p = p;
    return 0;
}

/* Skip the contents of a value whose header @p v was just read at depth
 * @p depth (a no-op for scalars). Iterative; containers nested deeper than
 * KVI_DECODE_MAX_DEPTH fail with KVI_DEC_LIMIT. */
static int mp_skip_body(struct cur *c, const struct mp_val *v, unsigned depth)
{
    uint64_t left[KVI_DECODE_MAX_DEPTH + 1]; /* items still unread per open container */
    unsigned top = 0;
    struct mp_val x = *v;
    for (;;) {
        if (x.t == MP_ARRAY || x.t == MP_MAP) {
            if (KVI_UNLIKELY(depth + top > KVI_DECODE_MAX_DEPTH))
                return KVI_DEC_LIMIT;
            uint64_t items = x.t == MP_MAP ? 2 * (uint64_t)x.n : x.n;
            if (items > 0) {
                left[top++] = items;
                goto next;
            }
        }
        /* one complete value consumed: close finished containers */
        while (top > 0 && --left[top - 1] == 0)
            top--;
        if (top == 0)
            return 0;
    next:;
        int e = mp_next(c, &x);
        if (KVI_UNLIKELY(e))
            return e;
    }
}

/* Skip one whole value at depth @p depth. */
static int mp_skip(struct cur *c, unsigned depth)
{
    struct mp_val v;
    int e = mp_next(c, &v);
    return e ? e : mp_skip_body(c, &v, depth);
}

/* Skip @p n values at depth @p depth. */
static int mp_skip_n(struct cur *c, uint64_t n, unsigned depth)
{
    for (uint64_t i = 0; i < n; i++) {
        int e = mp_skip(c, depth);
        if (e)
            return e;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* decoder state                                                             */
/* ------------------------------------------------------------------------ */

struct vec64 {
    uint64_t *v;
    size_t n, cap;
};
struct vec32 {
    uint32_t *v;
    size_t n, cap;
};

/* Offsets of an event's arrays in the scratch vectors, fixed up into
 * pointers at the end of the batch. SIZE_MAX = NULL. */
struct ev_fix {
    size_t h, t, mm, mo;
};

struct kvi_decoder {
    struct kvi_ev *ev;
    struct ev_fix *fix;
    size_t n_ev, cap_ev;
    struct vec64 hashes, mm;
    struct vec32 tokens, mmoff;
    const uint8_t *base; /* start of the frame being decoded (error offsets) */
    enum kvi_decode_err err;
    char msg[160];
};

KVI_WARN_UNUSED static int vec64_reserve(struct vec64 *a, size_t extra)
{
    if (KVI_LIKELY(a->cap - a->n >= extra))
        return 0;
    size_t cap = a->cap ? a->cap : 64;
    while (cap - a->n < extra)
        cap *= 2;
    uint64_t *v = realloc(a->v, cap * sizeof *v);
    if (v == NULL)
        return KVI_DEC_NOMEM;
    a->v = v;
    a->cap = cap;
    return 0;
}

KVI_WARN_UNUSED static int vec32_reserve(struct vec32 *a, size_t extra)
{
    if (KVI_LIKELY(a->cap - a->n >= extra))
        return 0;
    size_t cap = a->cap ? a->cap : 64;
    while (cap - a->n < extra)
        cap *= 2;
    uint32_t *v = realloc(a->v, cap * sizeof *v);
    if (v == NULL)
        return KVI_DEC_NOMEM;
    a->v = v;
    a->cap = cap;
    return 0;
}

KVI_WARN_UNUSED static int events_reserve(struct kvi_decoder *d, size_t extra)
{
    if (KVI_LIKELY(d->cap_ev - d->n_ev >= extra))
        return 0;
    size_t cap = d->cap_ev ? d->cap_ev : INIT_EVENTS;
    while (cap - d->n_ev < extra)
        cap *= 2;
    struct kvi_ev *ev = realloc(d->ev, cap * sizeof *ev);
    if (ev == NULL)
        return KVI_DEC_NOMEM;
    d->ev = ev;
    struct ev_fix *fix = realloc(d->fix, cap * sizeof *fix);
    if (fix == NULL)
        return KVI_DEC_NOMEM; /* d->ev keeps its larger block; cap_ev unchanged */
    d->fix = fix;
    d->cap_ev = cap;
    return 0;
}

struct kvi_decoder *kvi_decoder_create(void)
{
    struct kvi_decoder *d = calloc(1, sizeof *d);
    if (d == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    if (events_reserve(d, INIT_EVENTS) || vec64_reserve(&d->hashes, INIT_HASHES) ||
        vec64_reserve(&d->mm, INIT_MM) || vec32_reserve(&d->tokens, INIT_TOKENS) ||
        vec32_reserve(&d->mmoff, INIT_MMOFF)) {
        kvi_decoder_destroy(d);
        errno = ENOMEM;
        return NULL;
    }
    return d;
}

void kvi_decoder_destroy(struct kvi_decoder *d)
{
    if (d == NULL)
        return;
    free(d->ev);
    free(d->fix);
    free(d->hashes.v);
    free(d->mm.v);
    free(d->tokens.v);
    free(d->mmoff.v);
    free(d);
}

/* Shrink a scratch array of *cap elements to keep elements (when larger). */
static void *scratch_shrink(void *p, size_t *cap, size_t keep, size_t elem)
{
    if (*cap <= keep)
        return p;
    void *q = realloc(p, keep * elem);
    if (q == NULL)
        return p; /* the larger block stays valid */
    *cap = keep;
    return q;
}

void kvi_decoder_trim(struct kvi_decoder *d)
{
    size_t bytes = d->cap_ev * (sizeof *d->ev + sizeof *d->fix) + (d->hashes.cap + d->mm.cap) * sizeof(uint64_t) +
                   (d->tokens.cap + d->mmoff.cap) * sizeof(uint32_t);
    if (bytes <= KVI_DECODE_KEEP_SCRATCH)
        return;
    d->n_ev = 0;
    d->hashes.n = d->tokens.n = d->mm.n = d->mmoff.n = 0;
    size_t cap_ev = d->cap_ev, cap_fix = d->cap_ev;
    d->ev = scratch_shrink(d->ev, &cap_ev, INIT_EVENTS, sizeof *d->ev);
    d->fix = scratch_shrink(d->fix, &cap_fix, INIT_EVENTS, sizeof *d->fix);
    d->cap_ev = KVI_MIN(cap_ev, cap_fix); /* both blocks hold at least that many */
    d->hashes.v = scratch_shrink(d->hashes.v, &d->hashes.cap, INIT_HASHES, sizeof *d->hashes.v);
    d->mm.v = scratch_shrink(d->mm.v, &d->mm.cap, INIT_MM, sizeof *d->mm.v);
    d->tokens.v = scratch_shrink(d->tokens.v, &d->tokens.cap, INIT_TOKENS, sizeof *d->tokens.v);
    d->mmoff.v = scratch_shrink(d->mmoff.v, &d->mmoff.cap, INIT_MMOFF, sizeof *d->mmoff.v);
}

enum kvi_decode_err kvi_decoder_error(const struct kvi_decoder *d) { return d->err; }

const char *kvi_decoder_error_str(const struct kvi_decoder *d) { return d->msg; }

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

static inline bool key_is(const struct mp_val *k, const char *lit, size_t lit_len)
{
    return k->n == lit_len && memcmp(k->ptr, lit, lit_len) == 0;
}
#define KEY_IS(k, lit) key_is((k), lit, sizeof(lit) - 1)

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

/* Hash array elements, after the array header (@p n elements, depth of the
 * elements @p depth). Fast path: uint64, int64, fixint. */
static int read_hashes(struct cur *c, uint32_t n, unsigned depth, uint64_t *out, bool *bad)
{
    const uint8_t *p = c->p, *end = c->end;
    for (uint32_t i = 0; i < n; i++) {
        if (KVI_LIKELY(end - p >= 9)) {
            uint8_t b = *p;
            if (b == 0xcf || b == 0xd3) { /* u64 / i64: same bit pattern */
                out[i] = be64(p + 1);
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
        int e = mp_next(c, &v);
        if (e)
            return e;
        if (KVI_UNLIKELY(!hash_of(&v, &out[i]))) {
            *bad = true;
            e = mp_skip_body(c, &v, depth);
            return e ? e : mp_skip_n(c, n - i - 1, depth);
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
    out[1] = tok_val(be64(q), l1);
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
                out[i] = be32(p + 1);
                p += 5;
            } else if (b == 0xcd) {
                out[i] = be16(p + 1);
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
                out[i] = be32(p + 1);
                p += 5;
                continue;
            }
            if (b == 0xcd) {
                out[i] = be16(p + 1);
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
        int e = mp_next(c, &v);
        if (e)
            return e;
        if (KVI_UNLIKELY(!token_of(&v, &out[i]))) {
            *bad = true;
            e = mp_skip_body(c, &v, depth);
            return e ? e : mp_skip_n(c, n - i - 1, depth);
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
        if (i > 0 && (e = mp_next(c, &v)))
            return e;
        if (v.t != MP_ARRAY || v.n != 2) {
            *bad = true;
            e = mp_skip_body(c, &v, depth);
            return e ? e : mp_skip_n(c, n - i - 1, depth);
        }
        struct mp_val a, b;
        if ((e = mp_next(c, &a)) || (e = mp_skip_body(c, &a, depth + 1)) || (e = mp_next(c, &b)) ||
            (e = mp_skip_body(c, &b, depth + 1)))
            return e;
        uint32_t ta, tb;
        if (!token_of(&a, &ta) || !token_of(&b, &tb)) {
            *bad = true;
            return mp_skip_n(c, n - i - 1, depth);
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
    int e = mp_next(c, &v);
    if (e)
        return e;
    if (v.t != MP_ARRAY) {
        x->bad = true;
        x->have_hashes = false;
        return mp_skip_body(c, &v, D_FIELD);
    }
    if ((e = vec64_reserve(&d->hashes, v.n)))
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
    int e = mp_next(c, &v);
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
    return mp_skip_body(c, &v, D_FIELD);
}

/* token_ids: nil, [], flat ints or [a, b] pairs. */
static int field_tokens(struct kvi_decoder *d, struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = mp_next(c, &v);
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
        return mp_skip_body(c, &v, D_FIELD);
    }
    if ((e = vec32_reserve(&d->tokens, (size_t)v.n + 1)))
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
        if ((e = mp_next(c, &first)))
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
    int e = mp_next(c, &v);
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
    return mp_skip_body(c, &v, D_FIELD);
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
    return mp_skip_body(c, v, D_FIELD);
}

/* A string field: nil = NULL. */
static int field_str(struct cur *c, struct evctx *x, const char **s, uint32_t *len)
{
    struct mp_val v;
    int e = mp_next(c, &v);
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
    return mp_skip_body(c, &v, D_FIELD);
}

/* medium: nil = gpu; a string through kvi_medium_tier. */
static int field_medium(struct cur *c, struct evctx *x)
{
    struct mp_val v;
    int e = mp_next(c, &v);
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
    return mp_skip_body(c, &v, D_FIELD);
}

/* SGLang metadata map (array position 7) whose header @p v was read:
 * cache_salt is taken, other keys ignored. */
static int field_meta_map(struct cur *c, struct evctx *x, const struct mp_val *v)
{
    for (uint32_t i = 0; i < v->n; i++) {
        struct mp_val k;
        int e = mp_next(c, &k);
        if (e)
            return e;
        if (k.t == MP_STR && KEY_IS(&k, "cache_salt")) {
            e = field_str(c, x, &x->ev.cache_salt, &x->ev.salt_len);
        } else {
            e = mp_skip_body(c, &k, D_ELEM);
            if (!e)
                e = mp_skip(c, D_ELEM);
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
    return mp_skip(c, D_FIELD);
}

/* Start mm output for an event with @p nb blocks. */
static int mm_begin(struct kvi_decoder *d, struct evctx *x, uint32_t nb)
{
    int e = vec32_reserve(&d->mmoff, (size_t)nb + 1);
    if (e)
        return e;
    x->fix.mo = d->mmoff.n;
    x->fix.mm = d->mm.n;
    d->mmoff.v[d->mmoff.n] = 0;
    return 0;
}

static int mm_push(struct kvi_decoder *d, uint64_t h)
{
    int e = vec64_reserve(&d->mm, 1);
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
    int e = mp_next(c, &v);
    if (e || v.t == MP_NIL)
        return e;
    if (v.t != MP_ARRAY) {
        x->bad = true;
        return mp_skip_body(c, &v, D_FIELD);
    }
    uint32_t nb = x->ev.n_hashes;
    if ((e = mm_begin(d, x, nb)))
        return e;
    uint32_t b;
    for (b = 0; b < v.n; b++) {
        struct mp_val ent;
        if ((e = mp_next(c, &ent)))
            return e;
        if (ent.t == MP_ARRAY) {
            for (uint32_t i = 0; i < ent.n; i++) {
                struct mp_val it;
                uint64_t h;
                if ((e = mp_next(c, &it)))
                    return e;
                bool got = mm_hash_of_str(&it, &h);
                if (!got && it.t == MP_ARRAY && it.n == 2) {
                    struct mp_val s, off;
                    if ((e = mp_next(c, &s)) || (e = mp_skip_body(c, &s, D_ELEM + 2)) ||
                        (e = mp_next(c, &off)) || (e = mp_skip_body(c, &off, D_ELEM + 2)))
                        return e;
                    got = (off.t == MP_UINT || off.t == MP_NINT) && mm_hash_of_str(&s, &h);
                } else if ((e = mp_skip_body(c, &it, D_ELEM + 1))) {
                    return e;
                }
                if (got && b < nb && (e = mm_push(d, h)))
                    return e;
            }
        } else if (ent.t != MP_NIL) {
            x->bad = true;
            if ((e = mp_skip_body(c, &ent, D_ELEM)))
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
    int e = mp_next(c, &o);
    if (e)
        return e;
    bool got = false;
    uint64_t h = 0;
    if (o.t == MP_MAP) {
        for (uint32_t i = 0; i < o.n; i++) {
            struct mp_val k, val;
            if ((e = mp_next(c, &k)) || (e = mp_skip_body(c, &k, depth + 1)) || (e = mp_next(c, &val)) ||
                (e = mp_skip_body(c, &val, depth + 1)))
                return e;
            if (k.t == MP_STR && KEY_IS(&k, "mm_hash")) {
                got = val.t == MP_UINT || val.t == MP_NINT;
                h = val.t == MP_NINT ? (uint64_t)val.i : val.u;
            }
        }
    } else if (o.t == MP_ARRAY && o.n >= 1) {
        struct mp_val val;
        if ((e = mp_next(c, &val)) || (e = mp_skip_body(c, &val, depth + 1)) ||
            (e = mp_skip_n(c, o.n - 1, depth + 1)))
            return e;
        got = val.t == MP_UINT || val.t == MP_NINT;
        h = val.t == MP_NINT ? (uint64_t)val.i : val.u;
    } else if ((e = mp_skip_body(c, &o, depth))) {
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
    int e = mp_next(c, &v);
    if (e || v.t == MP_NIL)
        return e;
    if (v.t != MP_ARRAY) {
        x->bad = true;
        return mp_skip_body(c, &v, D_FIELD);
    }
    uint32_t nb = x->ev.n_hashes;
    if ((e = mm_begin(d, x, nb)))
        return e;
    uint32_t b;
    for (b = 0; b < v.n; b++) {
        bool keep = b < nb;
        struct mp_val ent;
        if ((e = mp_next(c, &ent)))
            return e;
        /* find the mm_objects array inside the entry */
        struct mp_val objs = {.t = MP_NIL};
        if (ent.t == MP_MAP) {
            for (uint32_t i = 0; i < ent.n; i++) {
                struct mp_val k;
                if ((e = mp_next(c, &k)) || (e = mp_skip_body(c, &k, D_ELEM + 1)))
                    return e;
                if (k.t == MP_STR && KEY_IS(&k, "mm_objects") && objs.t == MP_NIL) {
                    if ((e = mp_next(c, &objs)))
                        return e;
                    if (objs.t != MP_ARRAY) {
                        x->bad = true;
                        if ((e = mp_skip_body(c, &objs, D_ELEM + 1)))
                            return e;
                        objs.t = MP_BOOL; /* seen, unusable */
                        continue;
                    }
                    for (uint32_t j = 0; j < objs.n; j++)
                        if ((e = read_mm_object(d, c, x, keep, D_ELEM + 2)))
                            return e;
                } else if ((e = mp_skip(c, D_ELEM + 1))) {
                    return e;
                }
            }
            if (objs.t == MP_NIL)
                x->bad = true;
        } else if (ent.t == MP_ARRAY && ent.n >= 1) {
            if ((e = mp_next(c, &objs)))
                return e;
            if (objs.t == MP_ARRAY) {
                for (uint32_t j = 0; j < objs.n; j++)
                    if ((e = read_mm_object(d, c, x, keep, D_ELEM + 2)))
                        return e;
            } else {
                x->bad = true;
                if ((e = mp_skip_body(c, &objs, D_ELEM + 1)))
                    return e;
            }
            if ((e = mp_skip_n(c, ent.n - 1, D_ELEM + 1)))
                return e;
        } else if (ent.t != MP_NIL) {
            x->bad = true;
            if ((e = mp_skip_body(c, &ent, D_ELEM)))
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
        if ((e = mp_next(c, &tag)))
            return e;
        pos = 1;
        if (tag.t == MP_STR) {
            x.tag = classify_tag(&tag, &x.short_tag);
        } else if ((e = mp_skip_body(c, &tag, D_FIELD))) {
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
                    if (!(e = mp_next(c, &v)))
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
                } else if (!(e = mp_next(c, &v))) {
                    e = field_group(c, &x, &v);
                }
                break;
            case 10:
                e = field_str(c, &x, &x.ev.spec_kind, &x.ev.spec_kind_len);
                break;
            default: /* 5: lora_id, ignored */
                e = mp_skip(c, D_FIELD);
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
            } else if (!(e = mp_next(c, &v))) {
                e = field_group(c, &x, &v);
            }
            if (e)
                return e;
        }
    }
    /* AllBlocksCleared, unknown tags, no tag, and trailing extras */
    if ((e = mp_skip_n(c, n - pos, D_FIELD)))
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
    int e = mp_next(c, &v);
    if (e)
        return e;
    *short_tag = false;
    if (v.t == MP_STR) {
        *tag = classify_tag(&v, short_tag);
        return 0;
    }
    *tag = TAG_NONE; /* a non-string tag: the event cannot be classified */
    return mp_skip_body(c, &v, D_FIELD);
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
            return (e = mp_next(c, &v)) ? e : field_group(c, x, &v);
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
    return mp_skip(c, D_FIELD);
}

/* Tagged map / RFC 1527 event: @p n pairs, header already read. */
static int event_map(struct kvi_decoder *d, struct cur *c, uint32_t n, struct kvi_batch *out)
{
    struct evctx x;
    ev_init(d, &x, KVI_EVF_MAP);
    struct map_tags t = {TAG_NONE, TAG_NONE, false, false};
    for (uint32_t i = 0; i < n; i++) {
        struct mp_val k;
        int e = mp_next(c, &k);
        if (e)
            return e;
        if (k.t == MP_STR)
            e = map_field(d, c, &x, &k, &t);
        else if (!(e = mp_skip_body(c, &k, D_FIELD))) /* non-string keys are ignored */
            e = mp_skip(c, D_FIELD);
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
    int e = events_reserve(d, 1);
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
    if ((e = mp_next(c, &v)))
        return e;
    if (v.t == MP_ARRAY)
        return event_array(d, c, v.n, out);
    if (v.t == MP_MAP)
        return event_map(d, c, v.n, out);
    out->n_invalid++; /* a scalar, string, bin or ext is not an event */
    return mp_skip_body(c, &v, D_EVENT);
}

/* ------------------------------------------------------------------------ */
/* batch                                                                     */
/* ------------------------------------------------------------------------ */

static int batch_ts(struct cur *c, struct kvi_batch *out)
{
    struct mp_val v;
    int e = mp_next(c, &v);
    if (e)
        return e;
    switch (v.t) {
    case MP_FLOAT:
        out->ts = v.f;
        return 0;
    case MP_UINT:
        out->ts = (double)v.u;
        return 0;
    case MP_NINT:
        out->ts = (double)v.i;
        return 0;
    default:
        return KVI_DEC_SHAPE;
    }
}

static int batch_rank(struct cur *c, struct kvi_batch *out)
{
    struct mp_val v;
    int e = mp_next(c, &v);
    if (e)
        return e;
    if (v.t == MP_NIL) {
        out->has_dp_rank = false;
        return 0;
    }
    /* an i32 on the wire (Dynamo reinterprets it as u32); also accept the
     * u32 range so a rank written unsigned round-trips */
    if ((v.t == MP_UINT && v.u <= UINT32_MAX) || (v.t == MP_NINT && v.i >= INT32_MIN)) {
        out->has_dp_rank = true;
        out->dp_rank = v.t == MP_UINT ? (uint32_t)v.u : (uint32_t)(int32_t)v.i;
        return 0;
    }
    return KVI_DEC_SHAPE;
}

static int batch_events(struct kvi_decoder *d, struct cur *c, struct kvi_batch *out)
{
    struct mp_val v;
    int e = mp_next(c, &v);
    if (e)
        return e;
    if (v.t != MP_ARRAY)
        return KVI_DEC_EVENTS;
    for (uint32_t i = 0; i < v.n; i++)
        if ((e = event_one(d, c, out)))
            return e;
    return 0;
}

static int batch_map(struct kvi_decoder *d, struct cur *c, uint32_t n, struct kvi_batch *out)
{
    bool have_events = false;
    for (uint32_t i = 0; i < n; i++) {
        struct mp_val k;
        int e = mp_next(c, &k);
        if (e)
            return e;
        if (k.t == MP_STR && KEY_IS(&k, "events")) {
            if (have_events)
                return KVI_DEC_SHAPE; /* a second events array */
            have_events = true;
            e = batch_events(d, c, out);
        } else if (k.t == MP_STR && KEY_IS(&k, "ts")) {
            e = batch_ts(c, out);
        } else if (k.t == MP_STR &&
                   (KEY_IS(&k, "data_parallel_rank") || KEY_IS(&k, "dp_rank") || KEY_IS(&k, "attn_dp_rank"))) {
            e = batch_rank(c, out);
        } else {
            e = mp_skip_body(c, &k, D_BATCH_ITEM);
            if (!e)
                e = mp_skip(c, D_BATCH_ITEM);
        }
        if (e)
            return e;
    }
    return have_events ? 0 : KVI_DEC_SHAPE;
}

static int batch(struct kvi_decoder *d, struct cur *c, struct kvi_batch *out)
{
    struct mp_val v;
    int e = mp_next(c, &v);
    if (e)
        return e;
    if (v.t == MP_MAP)
        return batch_map(d, c, v.n, out);
    if (v.t != MP_ARRAY || v.n < 2)
        return KVI_DEC_SHAPE;
    if ((e = batch_ts(c, out)) || (e = batch_events(d, c, out)))
        return e;
    if (v.n >= 3 && (e = batch_rank(c, out)))
        return e;
    return v.n > 3 ? mp_skip_n(c, v.n - 3, D_BATCH_ITEM) : 0;
}

static const char *const err_names[] = {
    [KVI_DEC_OK] = "ok",
    [KVI_DEC_MSGPACK] = "malformed msgpack (truncated, 0xc1, or trailing bytes)",
    [KVI_DEC_SHAPE] = "batch is not [ts, events, rank?, ...] or {ts, events, rank}",
    [KVI_DEC_EVENTS] = "events is not an array",
    [KVI_DEC_LIMIT] = "over the decoder's limits",
    [KVI_DEC_NOMEM] = "out of memory for decoder scratch",
};

static int fail(struct kvi_decoder *d, int err, size_t off, size_t len, struct kvi_batch *out)
{
    d->err = (enum kvi_decode_err)err;
    snprintf(d->msg, sizeof d->msg, "%s at byte %zu of %zu", err_names[err], off, len);
    memset(out, 0, sizeof *out);
    d->n_ev = 0;
    return err == KVI_DEC_NOMEM ? -ENOMEM : -EBADMSG;
}

int kvi_decode_batch(struct kvi_decoder *d, const void *buf, size_t len, struct kvi_batch *out)
{
    memset(out, 0, sizeof *out);
    d->n_ev = 0;
    d->hashes.n = d->tokens.n = d->mm.n = d->mmoff.n = 0;
    if (len > KVI_DECODE_MAX_FRAME)
        return fail(d, KVI_DEC_LIMIT, 0, len, out);
    if (len == 0)
        return fail(d, KVI_DEC_MSGPACK, 0, len, out);
    struct cur c = {buf, (const uint8_t *)buf + len};
    d->base = buf;
    int e = batch(d, &c, out);
    if (e == 0 && c.p != c.end)
        e = KVI_DEC_MSGPACK; /* trailing bytes after the batch */
    if (e)
        return fail(d, e, (size_t)(c.p - d->base), len, out);
    for (size_t i = 0; i < d->n_ev; i++) {
        struct kvi_ev *ev = &d->ev[i];
        const struct ev_fix *f = &d->fix[i];
        ev->hashes = f->h == SIZE_MAX ? NULL : d->hashes.v + f->h;
        ev->tokens = f->t == SIZE_MAX ? NULL : d->tokens.v + f->t;
        ev->mm = f->mm == SIZE_MAX ? NULL : d->mm.v + f->mm;
        ev->mm_off = f->mo == SIZE_MAX ? NULL : d->mmoff.v + f->mo;
    }
    out->events = d->ev;
    out->n_events = (uint32_t)d->n_ev;
    d->err = KVI_DEC_OK;
    d->msg[0] = '\0';
    return 0;
}
