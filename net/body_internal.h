/*
 * Internals of the body layer, shared by its three files only: net/body.c
 * (buffer, scratch, dispatch), net/body_json.c and net/body_msgpack.c (the
 * two encodings). Route codecs use net/body.h; nothing outside net/body*.c
 * includes this header (the body layer's unit test does, to drive a reader
 * into an error state).
 *
 * CALLING CONVENTION of the kvi_js__* and kvi_mp__* reader entry points:
 * net/body.c calls them only with rd->err == 0, for a reader of their
 * encoding; they return what the kvi_rd_* function of the same name
 * returns (net/body.h, RETURN CONVENTION) and set rd->err on failure.
 * Thread: that of the reader or writer (none is shared).
 */
#ifndef KVI_API_BODY_INTERNAL_H
#define KVI_API_BODY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/body.h"
#include "net/msgpack_wire.h"

/* ---- reader state (body.c) -------------------------------------------------- */

/**
 * Mark the reader broken at its current position with the static text
 * @p what (kept only by the first failure). @return rd->err (-EBADMSG, or
 * the earlier error).
 */
int kvi_rd__fail(struct kvi_rd *rd, const char *what);
/**
 * Enter a container: push a level whose next element is the first, with
 * @p remain elements left (msgpack; 0 for JSON).
 * @return 0, or -EBADMSG past KVI_RD_MAX_DEPTH ("recursion limit exceeded").
 */
int kvi_rd__push(struct kvi_rd *rd, uint32_t remain);

/* ---- JSON reader (body_json.c) ------------------------------------------------ */

/** Skip JSON whitespace at the cursor (never fails). */
void kvi_js__ws(struct kvi_rd *rd);
/** As kvi_rd_peek. */
enum kvi_vt kvi_js__peek(struct kvi_rd *rd);
/** As kvi_rd_obj_begin. */
int kvi_js__obj_begin(struct kvi_rd *rd);
/** As kvi_rd_obj_next. */
int kvi_js__obj_next(struct kvi_rd *rd, struct kvi_str *key);
/** As kvi_rd_arr_begin. */
int kvi_js__arr_begin(struct kvi_rd *rd);
/** As kvi_rd_arr_next. */
int kvi_js__arr_next(struct kvi_rd *rd);
/** As kvi_rd_str. */
int kvi_js__str(struct kvi_rd *rd, struct kvi_str *out);
/** As kvi_rd_num (*out is already zeroed). */
int kvi_js__num(struct kvi_rd *rd, struct kvi_num *out);
/** As kvi_rd_bool. */
int kvi_js__bool(struct kvi_rd *rd, bool *out);
/** As kvi_rd_null. */
bool kvi_js__null(struct kvi_rd *rd);
/** kvi_rd_bin on a JSON body: KVI_RD_TYPE, or -EBADMSG on garbage. */
int kvi_js__bin(struct kvi_rd *rd);
/** As kvi_rd_skip. */
int kvi_js__skip(struct kvi_rd *rd);
/** As kvi_rd_describe (out[0] is already NUL; the reader is left unchanged). */
void kvi_js__describe(struct kvi_rd *rd, char *out, size_t cap);
/** kvi_rd_u32_array (@p width 4) or kvi_rd_u64_array (@p width 8); *out in scratch. */
int kvi_js__int_array(struct kvi_rd *rd, int64_t min, uint64_t max, void **out, size_t *n_out,
                      struct kvi_elem_err *e, int width);
/**
 * Skip the JSON value at @p p (before @p e) without checking it (dialect
 * detection; number arrays are jumped with memchr). Pure.
 * @return the byte after it, or NULL when it is cut short.
 */
const uint8_t *kvi_js__fast_skip(const uint8_t *p, const uint8_t *e);

/* ---- msgpack reader (body_msgpack.c) ----------------------------------------- */

/** As kvi_rd_peek. */
enum kvi_vt kvi_mp__peek(struct kvi_rd *rd);
/** As kvi_rd_obj_begin. */
int kvi_mp__obj_begin(struct kvi_rd *rd);
/** As kvi_rd_obj_next. */
int kvi_mp__obj_next(struct kvi_rd *rd, struct kvi_str *key);
/** kvi_rd_arr_begin; the element count in *@p count when @p count is not NULL. */
int kvi_mp__arr_begin(struct kvi_rd *rd, uint32_t *count);
/** As kvi_rd_arr_next. */
int kvi_mp__arr_next(struct kvi_rd *rd);
/** As kvi_rd_str. */
int kvi_mp__str(struct kvi_rd *rd, struct kvi_str *out);
/** As kvi_rd_num (*out is already zeroed). */
int kvi_mp__num(struct kvi_rd *rd, struct kvi_num *out);
/** As kvi_rd_bool. */
int kvi_mp__bool(struct kvi_rd *rd, bool *out);
/** As kvi_rd_null. */
bool kvi_mp__null(struct kvi_rd *rd);
/** As kvi_rd_bin. */
int kvi_mp__bin(struct kvi_rd *rd, const uint8_t **p, size_t *len);
/** As kvi_rd_skip. */
int kvi_mp__skip(struct kvi_rd *rd);
/** As kvi_rd_describe (out[0] is already NUL; the reader is left unchanged). */
void kvi_mp__describe(struct kvi_rd *rd, char *out, size_t cap);
/**
 * Read a msgpack integer at the cursor (the arrays' element path): 0 with
 * *@p out set, KVI_RD_TYPE with *@p vt the element's type, or -EBADMSG.
 */
int kvi_mp__int(struct kvi_rd *rd, struct kvi_num *out, enum kvi_vt *vt);
/** As kvi_js__int_array, for msgpack (an int array; a bin is the codecs' business). */
int kvi_mp__int_array(struct kvi_rd *rd, int64_t min, uint64_t max, void **out, size_t *n_out,
                      struct kvi_elem_err *e, int width);

/* ---- integer array helpers (body_json.c, body_msgpack.c) ----------------------- */

/** Store @p v as element @p i of a u32 (@p width 4) or u64 (@p width 8) array. */
static inline void kvi__store_elem(void *a, size_t i, uint64_t v, int width)
{
    if (width == 4)
        ((uint32_t *)a)[i] = (uint32_t)v;
    else
        ((uint64_t *)a)[i] = v;
}

/**
 * Range check of an integer against [@p min, @p max] (@p min <= 0).
 * @return true with the accepted value's bit pattern in *@p bits.
 */
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

/* ---- JSON writer (body_json.c): the bytes; net/body.c keeps the container stack -- */

/** Separator if needed, then '{' (@p obj) or '['. Appends to w->b (sticky oom). */
void kvi_js__wr_open(struct kvi_wr *w, bool obj);
/** '}' (@p obj) or ']'. */
void kvi_js__wr_close(struct kvi_wr *w, bool obj);
/** Separator, the escaped key and ':'; the next value follows without a separator. */
void kvi_js__wr_key(struct kvi_wr *w, const char *s, size_t len);
/** Separator and one value. */
void kvi_js__wr_str(struct kvi_wr *w, const char *s, size_t len);
/** Separator and the decimal @p v. */
void kvi_js__wr_u64(struct kvi_wr *w, uint64_t v);
/** Separator and the decimal @p v ('-' when negative). */
void kvi_js__wr_i64(struct kvi_wr *w, int64_t v);
/** Separator and true or false. */
void kvi_js__wr_bool(struct kvi_wr *w, bool v);
/** Separator and null. */
void kvi_js__wr_null(struct kvi_wr *w);

/* ---- msgpack writer (body_msgpack.c): one item appended to @p b -------------------
 * Each writes the item's smallest encoding (net/msgpack_wire.h); a failed
 * growth sets b->oom and drops the item (kvi_buf's sticky error). */

/** A map header for @p n entries. */
void kvi_mp__put_map(struct kvi_buf *b, uint32_t n);
/** An array header for @p n elements. */
void kvi_mp__put_arr(struct kvi_buf *b, uint32_t n);
/** A str of @p len bytes at @p s. */
void kvi_mp__put_str(struct kvi_buf *b, const char *s, size_t len);
/** An unsigned integer. */
void kvi_mp__put_u64(struct kvi_buf *b, uint64_t v);
/** A signed integer (non-negative values as unsigned). */
void kvi_mp__put_i64(struct kvi_buf *b, int64_t v);
/** nil. */
void kvi_mp__put_nil(struct kvi_buf *b);
/** true or false. */
void kvi_mp__put_bool(struct kvi_buf *b, bool v);

#endif
