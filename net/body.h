/*
 * kvidx body layer, the request/response body of every route in either
 * encoding: a growable output buffer, a per-request scratch allocator, one
 * pull reader for JSON and msgpack request bodies, and one writer that emits
 * either encoding. The route codecs (api/codec.h, api/codec_*.c) are built
 * on these; nothing here knows about routes, HTTP or the index.
 *
 * FILES
 *   net/body.h          this contract
 *   net/body.c          buffer, scratch, reader state, and the kvi_rd_* /
 *                       kvi_wr_* entry points, which dispatch on the encoding
 *   net/body_json.c     the JSON reader and writer
 *   net/body_msgpack.c  the msgpack reader and writer (primitives from
 *                       net/msgpack_wire.h)
 *   net/body_internal.h what those three share; no one else includes it
 *
 * WHY A HAND-WRITTEN LAYER (measured; figures at the top of net/body_json.c)
 *   /query bodies carry up to 8 MiB of token ids on the router's hot path.
 *   The Debian candidates either cannot represent our numbers (cJSON keeps
 *   doubles: u64 ids and hashes lose bits; jansson stops at INT64_MAX, and
 *   Dynamo instance ids and dump hashes use the whole u64 range) or build a
 *   DOM per element; yajl is exact through its raw-number callback but pays a
 *   callback per token. The pull reader below parses token arrays straight
 *   into a u32 array with no per-element allocation or callback.
 *
 * READER MODEL
 *   A struct kvi_rd walks one body front to back. Containers are entered
 *   with kvi_rd_obj_begin / kvi_rd_arr_begin and iterated with
 *   kvi_rd_obj_next / kvi_rd_arr_next, which also consume the closing
 *   bracket (JSON) or count down the header's element count (msgpack). Values
 *   are read by type: reading a value of another type returns KVI_RD_TYPE and
 *   consumes nothing, so the caller can name the offending type in its error
 *   message (kvi_rd_describe). JSON is parsed strictly (RFC 8259: no comments,
 *   no trailing commas, no leading zeros, UTF-8 checked inside strings,
 *   nothing but whitespace after the top-level value).
 *
 * RETURN CONVENTION (every kvi_rd_* function that returns int)
 *   0              success, the value was consumed
 *   KVI_RD_TYPE    (> 0) the next value has another type; nothing consumed
 *   KVI_RD_ELEM    (> 0) an array element failed (kvi_rd_*_array only)
 *   -EBADMSG       malformed body; rd->err_what and rd->err_off describe it,
 *                  and every later call fails the same way
 *   -ENOMEM        scratch allocation failed
 *
 * OWNERSHIP
 *   Strings and arrays handed out point into the body (when no copy is
 *   needed) or into the reader's scratch. They stay valid until the body is
 *   released or the scratch is reset, whichever comes first.
 *
 * THREAD-SAFETY
 *   None of these objects is shared: a buffer, scratch, reader or writer is
 *   used by one thread at a time. Different objects are independent.
 */
#ifndef KVI_API_BODY_H
#define KVI_API_BODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- byte buffer ---------------------------------------------------------- */

/**
 * A growable byte buffer. Appends never fail visibly: when growing fails the
 * buffer sets @c oom, drops that append and every later one, and the caller
 * checks kvi_buf_ok() once at the end (a sticky error keeps encoders short).
 */
struct kvi_buf {
    char *data;
    size_t len;
    size_t cap;
    bool oom;
};

/** Initialise an empty buffer (no allocation). */
void kvi_buf_init(struct kvi_buf *b);
/** Free the buffer's memory; the buffer is empty and reusable afterwards. */
void kvi_buf_free(struct kvi_buf *b);
/** Forget the contents, keep the memory, clear the oom flag. */
void kvi_buf_reset(struct kvi_buf *b);
/** Make room for @p n more bytes. @return the write position, or NULL (oom set). */
char *kvi_buf_reserve(struct kvi_buf *b, size_t n);
/** Append @p n bytes. */
void kvi_buf_put(struct kvi_buf *b, const void *p, size_t n);
/** Append a NUL-terminated string (without the NUL). */
void kvi_buf_puts(struct kvi_buf *b, const char *s);
/** Append one byte. */
void kvi_buf_putc(struct kvi_buf *b, char c);
/** Append the decimal form of @p v. */
void kvi_buf_put_u64(struct kvi_buf *b, uint64_t v);
/** Append the decimal form of @p v (with '-' when negative). */
void kvi_buf_put_i64(struct kvi_buf *b, int64_t v);
/** Drop the first @p n bytes (a consumer took them). */
void kvi_buf_consume(struct kvi_buf *b, size_t n);
/** @return true when no append has failed since the last reset. */
static inline bool kvi_buf_ok(const struct kvi_buf *b) { return !b->oom; }

/** Write the decimal form of @p v at @p out (room for 20 bytes). @return length. */
size_t kvi_u64_to_dec(uint64_t v, char *out);
/** Number of decimal digits of @p v (1 for 0). */
unsigned kvi_dec_len(uint64_t v);

/* ---- scratch allocator ---------------------------------------------------- */

struct kvi_scratch_chunk;

/**
 * A bump allocator for one request at a time: allocate freely, then
 * kvi_scratch_reset() releases everything at once. Reset keeps the largest
 * chunk, so a thread that serves similar requests stops calling malloc.
 */
struct kvi_scratch {
    struct kvi_scratch_chunk *_head; /* current chunk; older ones follow */
};

/** Initialise an empty scratch (no allocation). */
void kvi_scratch_init(struct kvi_scratch *s);
/** Free every chunk. The scratch is empty and reusable afterwards. */
void kvi_scratch_free(struct kvi_scratch *s);
/** Release every allocation (pointers handed out become invalid). */
void kvi_scratch_reset(struct kvi_scratch *s);
/**
 * Allocate @p n bytes aligned to 8 (never zeroed).
 * @return the memory, or NULL when malloc failed.
 */
void *kvi_scratch_alloc(struct kvi_scratch *s, size_t n);
/** Copy @p n bytes into the scratch, NUL-terminated. @return copy or NULL. */
char *kvi_scratch_strdup(struct kvi_scratch *s, const char *p, size_t n);

/* ---- reader ----------------------------------------------------------------- */

/** A string slice (not NUL-terminated). */
struct kvi_str {
    const char *p;
    size_t len;
};

/**
 * True when @p s equals the NUL-terminated @p lit. An absent string
 * ({NULL, 0}) equals "".
 */
static inline bool kvi_str_eq(struct kvi_str s, const char *lit);

/** Body encodings. */
enum kvi_body_enc {
    KVI_ENC_JSON = 0,
    KVI_ENC_MSGPACK = 1,
};

/** Value types as seen by kvi_rd_peek. */
enum kvi_vt {
    KVI_VT_NULL = 0,
    KVI_VT_BOOL,
    KVI_VT_INT,   /* msgpack int, or a JSON number (may still be a float) */
    KVI_VT_FLOAT, /* msgpack float32/64 (JSON floats peek as KVI_VT_INT) */
    KVI_VT_STR,
    KVI_VT_BIN,   /* msgpack only */
    KVI_VT_ARR,
    KVI_VT_OBJ,
    KVI_VT_EXT,   /* msgpack only */
    KVI_VT_BAD,   /* not the start of a value */
};

/** An integer read from a body: value = neg ? -mag : mag. */
struct kvi_num {
    uint64_t mag;
    bool neg;
};

/** Results of kvi_rd_num besides 0. */
enum {
    KVI_NUM_FLOAT = 1, /* a valid number that is not an integer (consumed) */
    KVI_NUM_BIG = 2,   /* an integer beyond the 64-bit range (consumed) */
};

#define KVI_RD_TYPE 1
#define KVI_RD_ELEM 2
#define KVI_RD_MAX_DEPTH 64

/** A reader over one body. Fields starting with _ are private. */
struct kvi_rd {
    const uint8_t *_p;
    const uint8_t *_end;
    const uint8_t *_base;
    struct kvi_scratch *_scratch;
    enum kvi_body_enc enc;
    uint32_t _depth;
    uint8_t _first[KVI_RD_MAX_DEPTH];   /* JSON: next element is the first */
    uint32_t _remain[KVI_RD_MAX_DEPTH]; /* msgpack: elements left */
    int err;              /* 0, -EBADMSG or -ENOMEM (sticky) */
    size_t err_off;       /* byte offset of the error */
    const char *err_what; /* static description of the error */
};

/**
 * Start reading @p len bytes at @p body in encoding @p enc. Copies (escaped
 * strings, arrays) go to @p scratch.
 */
void kvi_rd_init(struct kvi_rd *rd, const void *body, size_t len, enum kvi_body_enc enc,
                 struct kvi_scratch *scratch);

/** Type of the next value (KVI_VT_BAD at the end or on garbage). */
enum kvi_vt kvi_rd_peek(struct kvi_rd *rd);

/** Enter an object. @return 0, KVI_RD_TYPE, -EBADMSG. */
int kvi_rd_obj_begin(struct kvi_rd *rd);
/**
 * Next key of the current object.
 * @return 1 with @p key set (its value follows), 0 at the end of the object
 *         (the object is left), -EBADMSG (a msgpack key that is not a string
 *         counts as malformed), -ENOMEM.
 */
int kvi_rd_obj_next(struct kvi_rd *rd, struct kvi_str *key);
/** Enter an array. @return 0, KVI_RD_TYPE, -EBADMSG. */
int kvi_rd_arr_begin(struct kvi_rd *rd);
/** @return 1 when an element follows, 0 at the end (array left), -EBADMSG. */
int kvi_rd_arr_next(struct kvi_rd *rd);

/** Read a string (unescaped; zero-copy when it has no escapes). */
int kvi_rd_str(struct kvi_rd *rd, struct kvi_str *out);
/** Read a number: 0, KVI_NUM_FLOAT, KVI_NUM_BIG, KVI_RD_TYPE or -EBADMSG. *out is
 *  filled on 0 and zeroed on every other result. */
int kvi_rd_num(struct kvi_rd *rd, struct kvi_num *out);
/** Read a boolean. */
int kvi_rd_bool(struct kvi_rd *rd, bool *out);
/** Consume a null. @return true when the next value was null (and is consumed). */
bool kvi_rd_null(struct kvi_rd *rd);
/** Read a msgpack bin (zero-copy). KVI_RD_TYPE for JSON bodies. */
int kvi_rd_bin(struct kvi_rd *rd, const uint8_t **p, size_t *len);
/** Skip one value of any type, checking its syntax. */
int kvi_rd_skip(struct kvi_rd *rd);
/**
 * After the top-level value: only whitespace may follow (JSON) or nothing
 * (msgpack). @return 0 or -EBADMSG ("trailing characters").
 */
int kvi_rd_finish(struct kvi_rd *rd);

/** Byte offset of the reader in the body. */
size_t kvi_rd_offset(const struct kvi_rd *rd);
/** 1-based line and column of byte offset @p off (JSON error messages). */
void kvi_rd_line_col(const struct kvi_rd *rd, size_t off, size_t *line, size_t *col);

/**
 * Longest prefix of the UTF-8 text @p p (@p len bytes) that is at most
 * @p max bytes and does not split a multi-byte character (for error texts).
 */
size_t kvi_utf8_prefix(const char *p, size_t len, size_t max);

/**
 * Describe the next value for an error message, serde style, without
 * consuming it: `integer `-1``, `floating point `1.5``, `string "x"`,
 * `boolean `true``, `null`, `sequence`, `map`, `byte array`.
 * Writes a NUL-terminated text of at most @p cap bytes (empty when the
 * reader has failed). The reader is unchanged afterwards, even when the
 * value is malformed.
 */
void kvi_rd_describe(struct kvi_rd *rd, char *out, size_t cap);

/** Why an array element failed (kvi_rd_u32_array / kvi_rd_u64_array). */
enum kvi_elem_fail {
    KVI_EF_TYPE = 1,  /* not a number (vt says which type) */
    KVI_EF_FLOAT = 2, /* a number with a fraction or exponent */
    KVI_EF_RANGE = 3, /* an integer outside [min, max] (num holds it, unless big) */
};

/** Details of a failed element. The reader stays on the element. */
struct kvi_elem_err {
    size_t index;
    enum kvi_elem_fail kind;
    enum kvi_vt vt;     /* type of the element (KVI_EF_TYPE) */
    struct kvi_num num; /* the integer (KVI_EF_RANGE, unless big) */
    bool big;           /* the integer did not fit 64 bits */
    size_t off;         /* byte offset of the element */
};

/**
 * Read an array of integers in [@p min, @p max] (@p min <= 0 <= @p max,
 * @p max <= UINT32_MAX, @p min >= INT32_MIN) as u32 bit patterns (negative
 * values keep their two's-complement bits), into scratch memory. This is the
 * token-id hot path: one pass, no per-element allocation.
 * @return 0 with *out / *n set, KVI_RD_TYPE (not an array), KVI_RD_ELEM (@p e
 *         filled), -EBADMSG, -ENOMEM.
 */
int kvi_rd_u32_array(struct kvi_rd *rd, int64_t min, uint64_t max, uint32_t **out, size_t *n,
                     struct kvi_elem_err *e);
/**
 * Read an array of integers in [@p min, @p max] as u64 bit patterns
 * (negative values reinterpreted: -1 -> 2^64 - 1). @p min may be INT64_MIN
 * and @p max UINT64_MAX. Same returns as kvi_rd_u32_array.
 */
int kvi_rd_u64_array(struct kvi_rd *rd, int64_t min, uint64_t max, uint64_t **out, size_t *n,
                     struct kvi_elem_err *e);

/**
 * Walk the top-level keys of a body's object without checking the values'
 * syntax (a cheap look for dialect detection). @p fn returns nonzero to stop.
 * For each key, @p vt is the type of its value.
 * @return 0 when walked to the end or stopped, -EBADMSG when the body is not
 *         an object or is cut short.
 */
int kvi_rd_peek_keys(const void *body, size_t len, enum kvi_body_enc enc,
                     int (*fn)(void *ctx, struct kvi_str key, enum kvi_vt vt), void *ctx);

/* ---- writer ----------------------------------------------------------------- */

#define KVI_WR_MAX_DEPTH 32

/**
 * A writer of one JSON or msgpack document into a kvi_buf. The same calls
 * produce both encodings: containers are opened with their entry count
 * (msgpack needs it up front; JSON ignores it) and closed with kvi_wr_end.
 * JSON output is compact (no spaces), as serde_json writes it.
 */
struct kvi_wr {
    struct kvi_buf *b;
    enum kvi_body_enc enc;
    uint32_t _depth;
    uint8_t _first[KVI_WR_MAX_DEPTH];
    uint8_t _is_obj[KVI_WR_MAX_DEPTH];
    bool _after_key;
};

/** Start a document in @p enc, appended to @p b. */
void kvi_wr_init(struct kvi_wr *w, struct kvi_buf *b, enum kvi_body_enc enc);
/** Open an object of @p n entries. */
void kvi_wr_obj(struct kvi_wr *w, uint32_t n);
/** Open an array of @p n elements. */
void kvi_wr_arr(struct kvi_wr *w, uint32_t n);
/** Close the innermost container. */
void kvi_wr_end(struct kvi_wr *w);
/** Write an object key. */
void kvi_wr_key(struct kvi_wr *w, const char *s, size_t len);
/** Write an object key given as a NUL-terminated string. */
void kvi_wr_keyz(struct kvi_wr *w, const char *s);
/** Write an object key that is the decimal form of @p v. */
void kvi_wr_key_u64(struct kvi_wr *w, uint64_t v);
/** Write a string value (JSON-escaped as needed). */
void kvi_wr_str(struct kvi_wr *w, const char *s, size_t len);
/** Write a NUL-terminated string value. */
void kvi_wr_strz(struct kvi_wr *w, const char *s);
/** Write an unsigned integer value (msgpack: its smallest encoding). */
void kvi_wr_u64(struct kvi_wr *w, uint64_t v);
/** Write a signed integer value (msgpack: non-negative values as unsigned). */
void kvi_wr_i64(struct kvi_wr *w, int64_t v);
/** Write a boolean value. */
void kvi_wr_bool(struct kvi_wr *w, bool v);
/** Write a null (msgpack nil). */
void kvi_wr_null(struct kvi_wr *w);

/** Append @p s JSON-escaped, between quotes, to @p b. */
void kvi_json_put_str(struct kvi_buf *b, const char *s, size_t len);

/* ---- for the codecs built on the layer -------------------------------------------
 * Route parsers that read beyond the kvi_rd_* calls, and response encoders
 * that compute an upper bound of their output once, reserve it, and then
 * write through a bare char pointer (no capacity check, no oom flag, no
 * container stack per value). Each raw writer returns the new cursor; its
 * bytes are exactly what the kvi_wr_* writer produces for the same value.
 * The compound raw writers (keys, maps, msgpack items) are in
 * api/codec_internal.h. Pure functions: any thread.
 */

/**
 * Mark the reader out of memory (a codec's own scratch allocation failed).
 * @return rd->err (-ENOMEM, or the earlier error, which is kept).
 */
int kvi_rd__nomem(struct kvi_rd *rd);

/** Length of the valid UTF-8 sequence at @p p (lead byte >= 0x80, before @p end), or 0. */
size_t kvi__utf8_seq(const uint8_t *p, const uint8_t *end);

/** "00".."99", two characters each. */
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

/** @p s JSON-escaped, without quotes (room for 6 * @p len bytes). */
char *kvi__w_json_esc(char *o, const char *s, size_t len);

/* inline defs */

static inline bool kvi_str_eq(struct kvi_str s, const char *lit)
{
    size_t n = strlen(lit);
    /* s.p may be NULL when s.len is 0: memcmp must not see it */
    return s.len == n && (n == 0 || memcmp(s.p, lit, n) == 0);
}

#endif
