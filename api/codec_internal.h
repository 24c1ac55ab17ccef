/*
 * Internals shared by the route codecs (api/codec_*.c): error helpers, the
 * table-driven object parser, score-row helpers and the compound raw
 * writers of the query answers. Built on the body layer's contract
 * (net/body.h) and msgpack primitives (net/msgpack_wire.h); the body layer
 * never includes this header. Not part of the API: handlers include
 * api/codec.h and net/body.h only.
 */
#ifndef KVI_API_CODEC_INTERNAL_H
#define KVI_API_CODEC_INTERNAL_H

#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "api/codec.h"
#include "engine/common.h"
#include "net/body.h"
#include "net/msgpack_wire.h"

/* ---- raw writers: write at a cursor the caller made room for ---------------
 * The response encoders of the query routes compute an upper bound of their
 * output once, reserve it, and then write through a bare char pointer: no
 * capacity check, no oom flag, no container stack per value. Each function
 * returns the new cursor. Their bytes are exactly what the kvi_wr_* writer
 * produces for the same value (the codec tests compare both).
 */

/* Decimal digits and JSON escaping: net/body.h (kvi__w_dec, kvi__w_json_esc). */

/** @p s JSON-escaped between quotes (room for 6 * @p len + 2 bytes). */
static inline char *kvi__w_json_str(char *o, const char *s, size_t len)
{
    *o++ = '"';
    o = kvi__w_json_esc(o, s, len);
    *o++ = '"';
    return o;
}

/** Copy @p n bytes. */
static inline char *kvi__w_mem(char *o, const void *s, size_t n)
{
    memcpy(o, s, n);
    return o + n;
}

/** Copy a string literal (without its NUL). */
#define KVI__W_LIT(o, lit) kvi__w_mem((o), (lit), sizeof(lit) - 1)

/* msgpack writers: net/msgpack_wire.h (kvi_mp_w_*). */

/** A msgpack str holding the decimal form of @p v (at most 21 bytes). */
static inline __attribute__((always_inline)) char *kvi__w_mp_dec_str(char *o, uint64_t v)
{
    char *e = kvi__w_dec(o + 1, v);
    kvi_mp_w_str_hdr(o, (size_t)(e - o - 1)); /* a fixstr: at most 20 digits */
    return e;
}

/* ---- error helpers (codec_common.c) --------------------------------------- */

/** Fill @p e (status, reason, field, index, printf message). @return -EINVAL. */
int kvi_err__set(struct kvi_api_err *e, int status, const char *reason, const char *field,
                 int64_t index, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/** Body-level failure of a reader as an error for @p dialect. @return rd->err. */
int kvi_err__from_rd(struct kvi_api_err *e, enum kvi_dialect dialect, struct kvi_rd *rd);

/**
 * A msgpack bin of little-endian @p width-byte words (4 or 8) copied into
 * @p s as host u32 / u64 values (*out, *n). @return 0, -EINVAL when @p len is
 * not a multiple of @p width (nothing allocated), or -ENOMEM.
 */
int kvi_bin__le_words(struct kvi_scratch *s, const uint8_t *p, size_t len, int width, void **out, size_t *n);

/** Bit of a field in a parser's "seen" set (duplicate and missing checks). */
#define KVI_BIT(i) (1ull << (i))

/* ---- table-driven object parser (codec_common.c) --------------------------- */

/** Field kinds; the destination type at `off` (and `off2`) follows the kind. */
enum kvi_fk {
    KVI_FK_U64,          /* uint64_t: Dynamo u64 */
    KVI_FK_U32,          /* uint32_t: Dynamo u32 */
    KVI_FK_U32_NZ,       /* uint32_t: Dynamo u32 > 0 (block_size) */
    KVI_FK_U64_NZ,       /* uint64_t: Dynamo u64 > 0 (capacity_blocks) */
    KVI_FK_POS_U32,      /* uint32_t: Conductor integer > 0 */
    KVI_FK_RANK,         /* uint32_t: Conductor integer 0 .. INT_MAX */
    KVI_FK_STR,          /* struct kvi_str */
    KVI_FK_TOKENS,       /* const uint32_t * at off, size_t at off2 */
    KVI_FK_HASHES,       /* const uint64_t * at off, size_t at off2 */
    KVI_FK_TYPE,         /* enum kvi_cond_type */
    KVI_FK_CACHE_GROUP,  /* bool (given and not null) */
    KVI_FK_HASH_PROFILE, /* struct kvi_hash_profile */
    KVI_FK_IGNORE,       /* accepted, value only syntax-checked */
};

#define KVI_FF_REQ 1u      /* required */
#define KVI_FF_NONEMPTY 2u /* a string must not be empty (Conductor 400, Dynamo 422) */
#define KVI_FF_NULL 4u     /* null is accepted and means absent */

struct kvi_field {
    const char *name;
    uint8_t kind;  /* enum kvi_fk */
    uint8_t flags; /* KVI_FF_* */
    uint8_t bit;   /* seen-set bit; aliases share one */
    uint16_t off;
    uint16_t off2;
};

/** What a route parser walks. */
struct kvi_pctx {
    enum kvi_dialect d;
    struct kvi_rd rd;
    struct kvi_api_err *err;
    const char *type_name; /* serde struct name for Dynamo messages */
};

/**
 * Begin a body: check the Content-Type (@p msgpack_ok: Dynamo routes that
 * take msgpack), start the reader. @return 0 or -EINVAL (err set).
 */
int kvi_parse__begin(struct kvi_pctx *c, enum kvi_dialect d, const char *type_name,
                     const void *body, size_t len, enum kvi_ctype ct, bool msgpack_ok,
                     struct kvi_scratch *s, struct kvi_api_err *err);

/**
 * Parse the body's object against the field table: duplicates, types,
 * ranges, unknown keys (Conductor rejects them, Dynamo skips them), missing
 * required fields, trailing bytes. Writes each field given (and not null)
 * to @p out and sets its bit in *seen.
 * @return 0, -EINVAL or -ENOMEM with c->err filled.
 */
int kvi_parse__fields(struct kvi_pctx *c, const struct kvi_field *f, size_t nf, void *out,
                      uint64_t *seen);

/** The default tenant "default". */
extern const struct kvi_str kvi_str_default;

/** Sort score rows by (name or id, dp_rank); stable. */
void kvi_rows__sort(struct kvi_score_row *rows, size_t n);
/** Upper bound of a row's instance key as kvi_rows__w_key writes it (either encoding). */
static inline size_t kvi_rows__key_max_len(const struct kvi_score_row *r)
{
    /* JSON: quotes, escapes (at most 6 bytes per byte) and ':'; msgpack: a
     * 5-byte str header at most */
    return r->name == NULL ? 24 : 6 * strlen(r->name) + 8;
}

/** Whether two rows belong to the same instance. */
static inline bool kvi_rows__same_inst(const struct kvi_score_row *a, const struct kvi_score_row *b)
{
    if (a->name != NULL || b->name != NULL)
        return a->name != NULL && b->name != NULL && strcmp(a->name, b->name) == 0;
    return a->instance_id == b->instance_id;
}

/** A map key holding a decimal number (a dp rank, an instance id). */
static inline __attribute__((always_inline)) char *kvi__w_dec_key(char *o, uint64_t v, bool mp)
{
    if (mp)
        return kvi__w_mp_dec_str(o, v);
    *o++ = '"';
    o = kvi__w_dec(o, v);
    *o++ = '"';
    *o++ = ':';
    return o;
}

/** A map key holding a string (escaped in JSON). */
static inline char *kvi__w_str_key(char *o, const char *s, size_t len, bool mp)
{
    if (mp)
        return len > 0 ? kvi__w_mem(kvi_mp_w_str_hdr(o, len), s, len) : kvi_mp_w_str_hdr(o, 0);
    o = kvi__w_json_str(o, s, len);
    *o++ = ':';
    return o;
}

/** A constant key (a string literal of at most 31 bytes, nothing to escape). */
#define KVI__W_KEY(o, mp, k)                                                                       \
    ((mp) ? kvi__w_mem(kvi_mp_w_str_hdr((o), sizeof(k) - 1), (k), sizeof(k) - 1)                 \
          : KVI__W_LIT((o), "\"" k "\":"))

/** An unsigned value. */
static inline char *kvi__w_uint(char *o, uint64_t v, bool mp)
{
    return mp ? kvi_mp_w_uint(o, v) : kvi__w_dec(o, v);
}

/** Open a map of @p n entries ('{' in JSON). */
static inline char *kvi__w_map(char *o, uint32_t n, bool mp)
{
    if (mp)
        return kvi_mp_w_map_hdr(o, n, false);
    *o = '{';
    return o + 1;
}

/** Close a map ('}' in JSON, nothing in msgpack). */
static inline char *kvi__w_end_map(char *o, bool mp)
{
    if (!mp)
        *o++ = '}';
    return o;
}

/** The JSON separator before an entry that is not the first. */
static inline char *kvi__w_sep(char *o, bool first, bool mp)
{
    if (!mp && !first)
        *o++ = ',';
    return o;
}

/**
 * Mark the instances of sorted rows: rows[i]._end is the end of the rows of
 * the instance that starts at row i (set on each instance's first row).
 * @return the number of instances.
 */
static inline uint32_t kvi_rows__group(struct kvi_score_row *rows, size_t n)
{
    uint32_t n_inst = 0;
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && kvi_rows__same_inst(&rows[i], &rows[j]); j++)
            ;
        rows[i]._end = (uint32_t)j;
        n_inst++;
    }
    return n_inst;
}

/** A row's instance as a map key: decimal id, or name. */
static inline __attribute__((always_inline)) char *kvi_rows__w_key(char *o, const struct kvi_score_row *r, bool mp)
{
    if (r->name == NULL)
        return kvi__w_dec_key(o, r->instance_id, mp);
    return kvi__w_str_key(o, r->name, strlen(r->name), mp);
}

/** The value of hex digit @p c (either case), or -1. */
static inline int kvi_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
