/*
 * Helpers of the fuzz targets that parse HTTP request bodies (fuzz_codec.c,
 * fuzz_slots.c), on top of net/body.h:
 *   - fz_dig_kstr / fz_kstr_is: digest and compare parsed string slices;
 *   - fz_check_doc: an encoded answer is one complete, valid document;
 *   - fz_transcode: the exact msgpack twin of a JSON body, so a target can
 *     check that both encodings of one request parse to the same result;
 *   - fz_pct_encode: percent-encode every byte (query strings).
 *
 * Thread-safety: none needed (targets are single-threaded); no state.
 */
#ifndef KVI_TESTS_FUZZ_BODY_H
#define KVI_TESTS_FUZZ_BODY_H

#include <limits.h>

#include "net/body.h"
#include "fuzz.h"
#include "net/msgpack_wire.h"

/** Mix a parsed string slice into @p d; a non-empty slice must have a pointer. */
static inline void fz_dig_kstr(struct fz_dig *d, struct kvi_str s)
{
    FZ_CHECK(s.len == 0 || s.p != NULL);
    fz_dig_bytes(d, s.p, s.len);
}

/** True when @p s is exactly the NUL-terminated @p lit. */
static inline bool fz_kstr_is(struct kvi_str s, const char *lit)
{
    return s.len == strlen(lit) && (s.len == 0 || memcmp(s.p, lit, s.len) == 0);
}

/** The encoded answer in @p b must be one complete, valid document of
 * encoding @p enc whose top level is an object (@p top_obj) or an array;
 * JSON must be valid UTF-8 and may end in one newline. */
static inline void fz_check_doc_of(const struct kvi_buf *b, enum kvi_body_enc enc, bool top_obj)
{
    size_t n = b->len;
    if (enc == KVI_ENC_JSON) {
        FZ_CHECK(fz_utf8_valid((const uint8_t *)b->data, n));
        if (n > 0 && b->data[n - 1] == '\n')
            n--;
    }
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_rd rd;
    kvi_rd_init(&rd, b->data, n, enc, &s);
    FZ_CHECK(kvi_rd_peek(&rd) == (top_obj ? KVI_VT_OBJ : KVI_VT_ARR));
    FZ_CHECK(kvi_rd_skip(&rd) == 0 && kvi_rd_finish(&rd) == 0);
    kvi_scratch_free(&s);
}

/** As fz_check_doc_of, for an object. */
static inline void fz_check_doc(const struct kvi_buf *b, enum kvi_body_enc enc)
{
    fz_check_doc_of(b, enc, true);
}

/* ---- JSON -> msgpack transcoder ------------------------------------------------- */

struct fz_tc {
    struct kvi_rd rd;
    const uint8_t *body;
    bool wide_ints;
    bool wide_lens;
};

/* @p tag and @p v big-endian in @p bytes (1, 2, 4 or 8) bytes: a header of a
 * chosen width, not necessarily the smallest (net/msgpack_wire.h's writers
 * always pick the smallest; the byte order comes from there). */
static inline void fz_mp_be(struct kvi_buf *o, uint8_t tag, uint64_t v, int bytes)
{
    uint8_t b[9];
    b[0] = tag;
    if (bytes == 1)
        b[1] = (uint8_t)v;
    else if (bytes == 2)
        kvi_store_be16(b + 1, (uint16_t)v);
    else if (bytes == 4)
        kvi_store_be32(b + 1, (uint32_t)v);
    else
        kvi_store_be64(b + 1, v);
    kvi_buf_put(o, b, (size_t)bytes + 1);
}

/* A length header: fix form (@p fix_tag | n, when @p fix_max allows), else
 * the 8/16/32-bit forms @p t8 (0 = none), t16, t32. */
static inline void fz_mp_len(struct fz_tc *t, struct kvi_buf *o, uint64_t n, uint8_t fix_tag,
                             uint64_t fix_max, uint8_t t8, uint8_t t16, uint8_t t32)
{
    if (t->wide_lens)
        fz_mp_be(o, t32, n, 4);
    else if (n <= fix_max)
        kvi_buf_putc(o, (char)(fix_tag | n));
    else if (t8 != 0 && n <= 0xff)
        fz_mp_be(o, t8, n, 1);
    else if (n <= 0xffff)
        fz_mp_be(o, t16, n, 2);
    else
        fz_mp_be(o, t32, n, 4);
}

static inline void fz_mp_uint(struct fz_tc *t, struct kvi_buf *o, uint64_t v)
{
    if (t->wide_ints)
        fz_mp_be(o, 0xcf, v, 8);
    else if (v <= 0x7f)
        kvi_buf_putc(o, (char)v);
    else if (v <= 0xff)
        fz_mp_be(o, 0xcc, v, 1);
    else if (v <= 0xffff)
        fz_mp_be(o, 0xcd, v, 2);
    else if (v <= 0xffffffffu)
        fz_mp_be(o, 0xce, v, 4);
    else
        fz_mp_be(o, 0xcf, v, 8);
}

static inline void fz_mp_neg(struct fz_tc *t, struct kvi_buf *o, int64_t v)
{
    uint64_t u = (uint64_t)v;
    if (t->wide_ints)
        fz_mp_be(o, 0xd3, u, 8);
    else if (v >= -32)
        kvi_buf_putc(o, (char)(uint8_t)v);
    else if (v >= INT8_MIN)
        fz_mp_be(o, 0xd0, u, 1);
    else if (v >= INT16_MIN)
        fz_mp_be(o, 0xd1, u, 2);
    else if (v >= INT32_MIN)
        fz_mp_be(o, 0xd2, u, 4);
    else
        fz_mp_be(o, 0xd3, u, 8);
}

static inline void fz_mp_str(struct fz_tc *t, struct kvi_buf *o, struct kvi_str s)
{
    fz_mp_len(t, o, s.len, 0xa0, 31, 0xd9, 0xda, 0xdb);
    kvi_buf_put(o, s.p, s.len);
}

/* Transcode one value into @p o. @return false when it has no exact
 * msgpack twin (integers beyond 64 bits, -0) or the JSON is broken. */
static inline bool fz_tc_value(struct fz_tc *t, struct kvi_buf *o)
{
    struct kvi_str s;
    bool b;
    switch (kvi_rd_peek(&t->rd)) {
    case KVI_VT_NULL:
        kvi_rd_null(&t->rd);
        kvi_buf_putc(o, (char)0xc0);
        return true;
    case KVI_VT_BOOL:
        if (kvi_rd_bool(&t->rd, &b) != 0)
            return false;
        kvi_buf_putc(o, (char)(b ? 0xc3 : 0xc2));
        return true;
    case KVI_VT_STR:
        if (kvi_rd_str(&t->rd, &s) != 0)
            return false;
        fz_mp_str(t, o, s);
        return true;
    case KVI_VT_INT: {
        size_t off = kvi_rd_offset(&t->rd);
        struct kvi_num n;
        int r = kvi_rd_num(&t->rd, &n);
        if (r == 0 && !n.neg) {
            fz_mp_uint(t, o, n.mag);
            return true;
        }
        if (r == 0 && n.mag > 0 && n.mag <= (uint64_t)1 << 63) {
            fz_mp_neg(t, o, n.mag == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)n.mag);
            return true;
        }
        if (r != KVI_NUM_FLOAT)
            return false; /* -0, beyond 64 bits, or broken */
        size_t end = kvi_rd_offset(&t->rd);
        char *txt = fz_dup(t->body + off, end - off, true);
        double v = strtod(txt, NULL);
        free(txt);
        uint64_t bits;
        memcpy(&bits, &v, sizeof(bits));
        fz_mp_be(o, 0xcb, bits, 8);
        return true;
    }
    case KVI_VT_ARR:
    case KVI_VT_OBJ: {
        bool obj = kvi_rd_peek(&t->rd) == KVI_VT_OBJ;
        if ((obj ? kvi_rd_obj_begin(&t->rd) : kvi_rd_arr_begin(&t->rd)) != 0)
            return false;
        struct kvi_buf kids;
        kvi_buf_init(&kids);
        uint64_t n = 0;
        int r;
        bool ok = true;
        while (ok && (r = obj ? kvi_rd_obj_next(&t->rd, &s) : kvi_rd_arr_next(&t->rd)) == 1) {
            if (obj)
                fz_mp_str(t, &kids, s);
            ok = fz_tc_value(t, &kids);
            n++;
        }
        if (ok && r == 0) {
            if (obj)
                fz_mp_len(t, o, n, 0x80, 15, 0, 0xde, 0xdf);
            else
                fz_mp_len(t, o, n, 0x90, 15, 0, 0xdc, 0xdd);
            kvi_buf_put(o, kids.data, kids.len);
        }
        kvi_buf_free(&kids);
        return ok && r == 0;
    }
    default: return false;
    }
}

/**
 * The msgpack twin of a JSON body: exact integers, strings unescaped, floats
 * as float64; @p style bit 0 writes every int 64-bit wide, bit 1 every
 * length 32-bit wide. @return true with the twin in @p out, false when the
 * body is not valid JSON or has no exact twin.
 */
static inline bool fz_transcode(const uint8_t *body, size_t len, uint8_t style, struct kvi_buf *out)
{
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct fz_tc t;
    kvi_rd_init(&t.rd, body, len, KVI_ENC_JSON, &s);
    t.body = body;
    t.wide_ints = style & 1;
    t.wide_lens = style & 2;
    bool ok = fz_tc_value(&t, out) && kvi_rd_finish(&t.rd) == 0;
    FZ_CHECK(kvi_buf_ok(out));
    kvi_scratch_free(&s);
    return ok;
}

/** Append every byte of @p s percent-encoded. */
static inline void fz_pct_encode(struct kvi_buf *b, struct kvi_str s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < s.len; i++) {
        uint8_t c = (uint8_t)s.p[i];
        char e[3] = {'%', hex[c >> 4], hex[c & 15]};
        kvi_buf_put(b, e, 3);
    }
}

#endif
