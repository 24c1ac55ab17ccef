/*
 * Internals shared by api/json.c, api/codec_msgpack.c and the route codecs.
 * Not part of the API: handlers include api/codec.h and api/json.h only.
 */
#ifndef KVI_API_CODEC_INTERNAL_H
#define KVI_API_CODEC_INTERNAL_H

#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "api/codec.h"
#include "engine/common.h"
#include "api/json.h"
#include "net/msgpack_wire.h"

/* ---- reader internals (json.c) ------------------------------------------- */

/** Mark the reader broken at its current position. @return -EBADMSG. */
int kvi_rd__fail(struct kvi_rd *rd, const char *what);
/** Mark the reader out of memory. @return -ENOMEM. */
int kvi_rd__nomem(struct kvi_rd *rd);
/** Enter a container with @p remain elements (msgpack). @return 0 or -EBADMSG. */
int kvi_rd__push(struct kvi_rd *rd, uint32_t remain);
/** Length of the valid UTF-8 sequence at @p p (lead byte >= 0x80), or 0. */
size_t kvi__utf8_seq(const uint8_t *p, const uint8_t *end);

/* ---- msgpack reader (codec_msgpack.c); callers checked rd->err ------------- */

enum kvi_vt kvi_mp__peek(struct kvi_rd *rd);
int kvi_mp__obj_begin(struct kvi_rd *rd);
int kvi_mp__obj_next(struct kvi_rd *rd, struct kvi_str *key);
int kvi_mp__arr_begin(struct kvi_rd *rd, uint32_t *count);
int kvi_mp__arr_next(struct kvi_rd *rd);
int kvi_mp__str(struct kvi_rd *rd, struct kvi_str *out);
int kvi_mp__num(struct kvi_rd *rd, struct kvi_num *out);
int kvi_mp__bool(struct kvi_rd *rd, bool *out);
bool kvi_mp__null(struct kvi_rd *rd);
int kvi_mp__bin(struct kvi_rd *rd, const uint8_t **p, size_t *len);
int kvi_mp__skip(struct kvi_rd *rd);
void kvi_mp__describe(struct kvi_rd *rd, char *out, size_t cap);
/** Read a msgpack integer element at the cursor (arrays fast path). */
int kvi_mp__int(struct kvi_rd *rd, struct kvi_num *out, enum kvi_vt *vt);

/** Integer array fast path (msgpack), as kvi_rd_u32_array with @p width 4 or 8. */
int kvi_mp__int_array(struct kvi_rd *rd, int64_t min, uint64_t max, void **out, size_t *n_out,
                      struct kvi_elem_err *e, int width);

/* ---- integer array helpers (json.c, codec_msgpack.c) ---------------------- */

static inline void kvi__store_elem(void *a, size_t i, uint64_t v, int width)
{
    if (width == 4)
        ((uint32_t *)a)[i] = (uint32_t)v;
    else
        ((uint64_t *)a)[i] = v;
}

/* Range check of an integer; the accepted value's bit pattern in *bits. */
static inline bool kvi__in_range(const struct kvi_num *n, int64_t min, uint64_t max, uint64_t *bits)
{
    if (n->neg) {
        /* n->mag <= 2^63 */
        if (min >= 0 || n->mag > (uint64_t)0 - (uint64_t)min)
            return false;
        *bits = (uint64_t)0 - n->mag;
        return true;
    }
    if (n->mag > max)
        return false;
    *bits = n->mag;
    return true;
}

/* ---- raw writers: write at a cursor the caller made room for ---------------
 * The response encoders of the query routes compute an upper bound of their
 * output once, reserve it, and then write through a bare char pointer: no
 * capacity check, no oom flag, no container stack per value. Each function
 * returns the new cursor. Their bytes are exactly what the kvi_wr_* writer
 * produces for the same value (the codec tests compare both).
 */

/** "00".."99", two characters each (json.c). */
extern const char kvi__digits2[201];

/** Number of decimal digits of @p v (1 for 0). */
static inline unsigned kvi__dec_len(uint64_t v)
{
    static const uint64_t pow10[20] = {1ull,
                                       10ull,
                                       100ull,
                                       1000ull,
                                       10000ull,
                                       100000ull,
                                       1000000ull,
                                       10000000ull,
                                       100000000ull,
                                       1000000000ull,
                                       10000000000ull,
                                       100000000000ull,
                                       1000000000000ull,
                                       10000000000000ull,
                                       100000000000000ull,
                                       1000000000000000ull,
                                       10000000000000000ull,
                                       100000000000000000ull,
                                       1000000000000000000ull,
                                       10000000000000000000ull};
    /* log10 estimate from the bit length (1233 / 4096 ~ log10(2)), exact after one compare */
    unsigned t = (unsigned)(64 - __builtin_clzll(v | 1)) * 1233u >> 12;
    return t + ((v | 1) >= pow10[t]); /* v | 1: 0 has one digit too */
}

/** Decimal @p v at @p o (room for 20 bytes). */
static inline __attribute__((always_inline)) char *kvi__w_dec(char *o, uint64_t v)
{
    if (v < 10) {
        *o = (char)('0' + v);
        return o + 1;
    }
    if (v < 100) {
        memcpy(o, kvi__digits2 + 2 * v, 2);
        return o + 2;
    }
    char *end = o + kvi__dec_len(v), *p = end;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        memcpy(p, kvi__digits2 + 2 * r, 2);
    }
    if (v >= 10)
        memcpy(p - 2, kvi__digits2 + 2 * v, 2);
    else
        p[-1] = (char)('0' + v);
    return end;
}

/** @p s JSON-escaped, without quotes (room for 6 * @p len bytes; json.c). */
char *kvi__w_json_esc(char *o, const char *s, size_t len);

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
    *o = (char)(0xa0 | (e - o - 1));
    return e;
}

/* ---- msgpack writer (codec_msgpack.c) ------------------------------------ */

void kvi_mp__put_map(struct kvi_buf *b, uint32_t n);
void kvi_mp__put_arr(struct kvi_buf *b, uint32_t n);
void kvi_mp__put_str(struct kvi_buf *b, const char *s, size_t len);
void kvi_mp__put_u64(struct kvi_buf *b, uint64_t v);
void kvi_mp__put_i64(struct kvi_buf *b, int64_t v);
void kvi_mp__put_nil(struct kvi_buf *b);
void kvi_mp__put_bool(struct kvi_buf *b, bool v);

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
