/*
 * Internals shared by api/json.c, api/codec_msgpack.c and the route codecs.
 * Not part of the API: handlers include api/codec.h and api/json.h only.
 */
#ifndef KVI_API_CODEC_INTERNAL_H
#define KVI_API_CODEC_INTERNAL_H

#include <errno.h>
#include <stdarg.h>

#include "api/codec.h"
#include "engine/common.h"
#include "api/json.h"

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
#define KVI_FF_NONEMPTY 2u /* Conductor: a string must not be empty */
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

/** Sort score rows by (name or id, dp_rank). */
void kvi_rows__sort(struct kvi_score_row *rows, size_t n);
/** Whether two rows belong to the same instance. */
bool kvi_rows__same_instance(const struct kvi_score_row *a, const struct kvi_score_row *b);
/** Write a row's instance as a key (decimal id or name). */
void kvi_rows__key(struct kvi_wr *w, const struct kvi_score_row *r);

#endif
