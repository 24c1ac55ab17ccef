/*
 * kvidx body layer, the msgpack half: the pull reader over a complete
 * msgpack body and the msgpack side of the writer, behind the kvi_mp__*
 * entry points that net/body.c dispatches to (net/body_internal.h). The JSON
 * half is body_json.c; every msgpack primitive (byte order, header forms,
 * the item writers) comes from net/msgpack_wire.h.
 *
 * Hand-written rather than through msgpack-c's unpacker so that one route
 * parser serves JSON and msgpack bodies alike, and so that a 1 M-element
 * token array is read without a msgpack_object per element (24 bytes each in
 * msgpack-c's zone). tests/net/body_test.c cross-checks both directions
 * against msgpack-c 4.0; the codec fuzz target checks that a JSON body and
 * its msgpack twin parse alike.
 *
 * Every reader function here is called with rd->err == 0 (net/body.c
 * checks). Element counts are checked against the bytes left before
 * anything is allocated: a header cannot make the reader reserve more than
 * the body's size.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "net/body_internal.h"

static inline size_t left(const struct kvi_rd *rd)
{
    return (size_t)(rd->_end - rd->_p);
}

static int eof(struct kvi_rd *rd)
{
    return kvi_rd__fail(rd, "unexpected end of msgpack data");
}

enum kvi_vt kvi_mp__peek(struct kvi_rd *rd)
{
    if (rd->_p >= rd->_end)
        return KVI_VT_BAD;
    uint8_t c = *rd->_p;
    if (c <= 0x7f || c >= 0xe0)
        return KVI_VT_INT;
    if (c <= 0x8f)
        return KVI_VT_OBJ;
    if (c <= 0x9f)
        return KVI_VT_ARR;
    if (c <= 0xbf)
        return KVI_VT_STR;
    switch (c) {
    case 0xc0: return KVI_VT_NULL;
    case 0xc2:
    case 0xc3: return KVI_VT_BOOL;
    case 0xc4:
    case 0xc5:
    case 0xc6: return KVI_VT_BIN;
    case 0xc7:
    case 0xc8:
    case 0xc9:
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8: return KVI_VT_EXT;
    case 0xca:
    case 0xcb: return KVI_VT_FLOAT;
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: return KVI_VT_INT;
    case 0xd9:
    case 0xda:
    case 0xdb: return KVI_VT_STR;
    case 0xdc:
    case 0xdd: return KVI_VT_ARR;
    case 0xde:
    case 0xdf: return KVI_VT_OBJ;
    default: return KVI_VT_BAD; /* 0xc1 */
    }
}

static int wrong(struct kvi_rd *rd, enum kvi_vt vt)
{
    if (vt == KVI_VT_BAD)
        return rd->_p >= rd->_end ? eof(rd) : kvi_rd__fail(rd, "invalid msgpack type byte 0xc1");
    return KVI_RD_TYPE;
}

/*
 * Read a length-prefixed header: the length for fix formats is in the low
 * bits of the type byte (@p fixmask), else in the 1/2/4 bytes that follow.
 */
static int read_len(struct kvi_rd *rd, uint8_t fixmask, int width, uint32_t *n)
{
    uint8_t c = *rd->_p;
    if (width == 0) {
        *n = c & fixmask;
        rd->_p += 1;
        return 0;
    }
    if (left(rd) < 1 + (size_t)width)
        return eof(rd);
    const uint8_t *q = rd->_p + 1;
    *n = width == 1 ? q[0] : width == 2 ? kvi_load_be16(q) : kvi_load_be32(q);
    rd->_p += 1 + width;
    return 0;
}

static int container_len(struct kvi_rd *rd, bool map, uint32_t *n)
{
    uint8_t c = *rd->_p;
    int r;
    if (map)
        r = c <= 0x8f ? read_len(rd, 0x0f, 0, n) : read_len(rd, 0, c == 0xde ? 2 : 4, n);
    else
        r = c <= 0x9f ? read_len(rd, 0x0f, 0, n) : read_len(rd, 0, c == 0xdc ? 2 : 4, n);
    if (r != 0)
        return r;
    /* each element takes at least one byte (a map entry two) */
    if ((uint64_t)*n * (map ? 2u : 1u) > left(rd))
        return eof(rd);
    return 0;
}

int kvi_mp__obj_begin(struct kvi_rd *rd)
{
    enum kvi_vt vt = kvi_mp__peek(rd);
    if (vt != KVI_VT_OBJ)
        return wrong(rd, vt);
    uint32_t n;
    int r = container_len(rd, true, &n);
    if (r != 0)
        return r;
    return kvi_rd__push(rd, n);
}

int kvi_mp__obj_next(struct kvi_rd *rd, struct kvi_str *key)
{
    uint32_t *remain = &rd->_remain[rd->_depth - 1];
    if (*remain == 0) {
        rd->_depth--;
        return 0;
    }
    (*remain)--;
    if ((rd->_p >= rd->_end || (*rd->_p & 0xe0) != 0xa0) && kvi_mp__peek(rd) != KVI_VT_STR) {
        if (rd->_p >= rd->_end)
            return eof(rd);
        return kvi_rd__fail(rd, "map key must be a string");
    }
    int r = kvi_mp__str(rd, key);
    return r < 0 ? r : 1;
}

int kvi_mp__arr_begin(struct kvi_rd *rd, uint32_t *count)
{
    enum kvi_vt vt = kvi_mp__peek(rd);
    if (vt != KVI_VT_ARR)
        return wrong(rd, vt);
    uint32_t n;
    int r = container_len(rd, false, &n);
    if (r != 0)
        return r;
    if (count != NULL)
        *count = n;
    return kvi_rd__push(rd, n);
}

int kvi_mp__arr_next(struct kvi_rd *rd)
{
    uint32_t *remain = &rd->_remain[rd->_depth - 1];
    if (*remain == 0) {
        rd->_depth--;
        return 0;
    }
    (*remain)--;
    return 1;
}

/* Length and payload position of a str/bin/ext at the cursor (not consumed). */
static int payload(struct kvi_rd *rd, const uint8_t **data, uint32_t *n, size_t *hdr)
{
    uint8_t c = *rd->_p;
    size_t h, w;
    if (c >= 0xa0 && c <= 0xbf) {
        *n = c & 0x1f;
        h = 1;
    } else {
        switch (c) {
        case 0xd9:
        case 0xc4: w = 1; break;
        case 0xda:
        case 0xc5: w = 2; break;
        case 0xdb:
        case 0xc6: w = 4; break;
        case 0xc7: w = 1; break;
        case 0xc8: w = 2; break;
        case 0xc9: w = 4; break;
        default: w = 0; break;
        }
        if (c >= 0xd4 && c <= 0xd8) { /* fixext: type byte + 1..16 bytes */
            *n = 1u << (c - 0xd4);
            h = 2;
        } else {
            if (left(rd) < 1 + w)
                return eof(rd);
            const uint8_t *q = rd->_p + 1;
            *n = w == 1 ? q[0] : w == 2 ? kvi_load_be16(q) : kvi_load_be32(q);
            h = 1 + w;
            if (c >= 0xc7 && c <= 0xc9)
                h++; /* ext type byte */
        }
    }
    if (left(rd) < h || left(rd) - h < *n)
        return eof(rd);
    *data = rd->_p + h;
    *hdr = h;
    return 0;
}

int kvi_mp__str(struct kvi_rd *rd, struct kvi_str *out)
{
    const uint8_t *d;
    uint32_t n;
    if (rd->_p < rd->_end && (*rd->_p & 0xe0) == 0xa0) { /* fixstr: keys and short values */
        n = *rd->_p & 0x1f;
        if (left(rd) - 1 < n)
            return eof(rd);
        d = rd->_p + 1;
    } else {
        enum kvi_vt vt = kvi_mp__peek(rd);
        if (vt != KVI_VT_STR)
            return wrong(rd, vt);
        size_t h;
        int r = payload(rd, &d, &n, &h);
        if (r != 0)
            return r;
    }
    for (uint32_t i = 0; i < n;) {
        uint64_t w;
        if (n - i >= 8 && (memcpy(&w, d + i, 8), (w & 0x8080808080808080ull) == 0)) {
            i += 8; /* eight ASCII bytes */
            continue;
        }
        if (d[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = kvi__utf8_seq(d + i, d + n);
        if (k == 0) {
            rd->_p = d + i;
            return kvi_rd__fail(rd, "invalid UTF-8 in msgpack string");
        }
        i += (uint32_t)k;
    }
    out->p = (const char *)d;
    out->len = n;
    rd->_p = d + n;
    return 0;
}

int kvi_mp__bin(struct kvi_rd *rd, const uint8_t **p, size_t *len)
{
    enum kvi_vt vt = kvi_mp__peek(rd);
    if (vt != KVI_VT_BIN)
        return wrong(rd, vt);
    const uint8_t *d;
    uint32_t n;
    size_t h;
    int r = payload(rd, &d, &n, &h);
    if (r != 0)
        return r;
    *p = d;
    *len = n;
    rd->_p = d + n;
    return 0;
}

/* Decode the integer at the cursor. 0, or KVI_RD_TYPE (nothing consumed). */
static inline int mp_int(struct kvi_rd *rd, struct kvi_num *out, enum kvi_vt *vt)
{
    if (rd->_p >= rd->_end)
        return eof(rd);
    uint8_t c = *rd->_p;
    if (c <= 0x7f) {
        out->mag = c;
        out->neg = false;
        rd->_p++;
        return 0;
    }
    if (c >= 0xe0) {
        out->mag = (uint64_t)(0x100 - c);
        out->neg = true;
        rd->_p++;
        return 0;
    }
    static const uint8_t width[8] = {1, 2, 4, 8, 1, 2, 4, 8};
    if (c < 0xcc || c > 0xd3) {
        *vt = kvi_mp__peek(rd);
        if (*vt == KVI_VT_BAD)
            return wrong(rd, *vt);
        return KVI_RD_TYPE;
    }
    size_t w = width[c - 0xcc];
    if (left(rd) < 1 + w)
        return eof(rd);
    const uint8_t *q = rd->_p + 1;
    uint64_t u = w == 1 ? q[0] : w == 2 ? kvi_load_be16(q) : w == 4 ? kvi_load_be32(q) : kvi_load_be64(q);
    rd->_p += 1 + w;
    if (c <= 0xcf) {
        out->mag = u;
        out->neg = false;
        return 0;
    }
    /* signed: sign-extend from w bytes */
    int64_t s;
    if (w == 1)
        s = (int8_t)u;
    else if (w == 2)
        s = (int16_t)u;
    else if (w == 4)
        s = (int32_t)u;
    else
        s = (int64_t)u;
    out->neg = s < 0;
    out->mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 0;
}

int kvi_mp__int(struct kvi_rd *rd, struct kvi_num *out, enum kvi_vt *vt)
{
    return mp_int(rd, out, vt);
}

int kvi_mp__int_array(struct kvi_rd *rd, int64_t min, uint64_t max, void **out, size_t *n_out,
                        struct kvi_elem_err *e, int width)
{
    uint32_t count;
    int r = kvi_mp__arr_begin(rd, &count);
    if (r != 0)
        return r;
    void *a = kvi_scratch_alloc(rd->_scratch, (size_t)count * (size_t)width);
    if (a == NULL)
        return kvi_rd__nomem(rd);
    for (uint32_t i = 0; i < count; i++) {
        struct kvi_num num = {0, false};
        enum kvi_vt vt = KVI_VT_INT;
        const uint8_t *el = rd->_p;
        r = mp_int(rd, &num, &vt);
        if (r < 0)
            return r;
        uint64_t bits;
        if (r != 0 || !kvi__in_range(&num, min, max, &bits)) {
            rd->_remain[rd->_depth - 1] = count - i; /* the reader stays on element i */
            rd->_p = el;
            e->index = i;
            e->kind = r != 0 ? (vt == KVI_VT_FLOAT ? KVI_EF_FLOAT : KVI_EF_TYPE) : KVI_EF_RANGE;
            e->vt = vt;
            e->num = num;
            e->big = false;
            e->off = (size_t)(el - rd->_base);
            return KVI_RD_ELEM;
        }
        kvi__store_elem(a, i, bits, width);
    }
    rd->_remain[rd->_depth - 1] = 0;
    rd->_depth--;
    *out = a;
    *n_out = count;
    return 0;
}

int kvi_mp__num(struct kvi_rd *rd, struct kvi_num *out)
{
    enum kvi_vt vt = kvi_mp__peek(rd);
    if (vt == KVI_VT_FLOAT) {
        size_t w = *rd->_p == 0xca ? 4 : 8;
        if (left(rd) < 1 + w)
            return eof(rd);
        rd->_p += 1 + w;
        return KVI_NUM_FLOAT;
    }
    if (vt != KVI_VT_INT)
        return wrong(rd, vt);
    return kvi_mp__int(rd, out, &vt);
}

int kvi_mp__bool(struct kvi_rd *rd, bool *out)
{
    enum kvi_vt vt = kvi_mp__peek(rd);
    if (vt != KVI_VT_BOOL)
        return wrong(rd, vt);
    *out = *rd->_p == 0xc3;
    rd->_p++;
    return 0;
}

bool kvi_mp__null(struct kvi_rd *rd)
{
    if (kvi_mp__peek(rd) != KVI_VT_NULL)
        return false;
    rd->_p++;
    return true;
}

static int skip_depth(struct kvi_rd *rd, unsigned depth)
{
    if (depth > KVI_RD_MAX_DEPTH)
        return kvi_rd__fail(rd, "recursion limit exceeded");
    enum kvi_vt vt = kvi_mp__peek(rd);
    struct kvi_num n;
    const uint8_t *d;
    uint32_t len;
    size_t h;
    int r;
    switch (vt) {
    case KVI_VT_NULL:
    case KVI_VT_BOOL: rd->_p++; return 0;
    case KVI_VT_INT: return kvi_mp__int(rd, &n, &vt);
    case KVI_VT_FLOAT: r = kvi_mp__num(rd, &n); return r < 0 ? r : 0;
    case KVI_VT_STR: {
        struct kvi_str s;
        return kvi_mp__str(rd, &s);
    }
    case KVI_VT_BIN:
    case KVI_VT_EXT:
        if ((r = payload(rd, &d, &len, &h)) != 0)
            return r;
        rd->_p = d + len;
        return 0;
    case KVI_VT_ARR:
    case KVI_VT_OBJ: {
        uint32_t cnt;
        if ((r = container_len(rd, vt == KVI_VT_OBJ, &cnt)) != 0)
            return r;
        uint64_t items = (uint64_t)cnt * (vt == KVI_VT_OBJ ? 2 : 1);
        for (uint64_t i = 0; i < items; i++)
            if ((r = skip_depth(rd, depth + 1)) != 0)
                return r;
        return 0;
    }
    default: return wrong(rd, vt);
    }
}

int kvi_mp__skip(struct kvi_rd *rd)
{
    return skip_depth(rd, rd->_depth);
}

void kvi_mp__describe(struct kvi_rd *rd, char *out, size_t cap)
{
    const uint8_t *save = rd->_p;
    uint32_t depth = rd->_depth;
    enum kvi_vt vt = kvi_mp__peek(rd);
    struct kvi_num n;
    struct kvi_str s;
    switch (vt) {
    case KVI_VT_NULL: snprintf(out, cap, "null"); break;
    case KVI_VT_BOOL: snprintf(out, cap, "boolean `%s`", *rd->_p == 0xc3 ? "true" : "false"); break;
    case KVI_VT_INT:
        if (kvi_mp__int(rd, &n, &vt) == 0)
            snprintf(out, cap, "integer `%s%llu`", n.neg ? "-" : "", (unsigned long long)n.mag);
        break;
    case KVI_VT_FLOAT: {
        double d = 0;
        if (*rd->_p == 0xca && left(rd) >= 5) {
            uint32_t u = kvi_load_be32(rd->_p + 1);
            float f;
            memcpy(&f, &u, 4);
            d = f;
        } else if (left(rd) >= 9) {
            uint64_t u = kvi_load_be64(rd->_p + 1);
            memcpy(&d, &u, 8);
        }
        snprintf(out, cap, "floating point `%g`", d);
        break;
    }
    case KVI_VT_STR:
        if (kvi_mp__str(rd, &s) == 0)
            snprintf(out, cap, "string \"%.*s\"", (int)kvi_utf8_prefix(s.p, s.len, 64), s.p);
        break;
    case KVI_VT_BIN: snprintf(out, cap, "byte array"); break;
    case KVI_VT_EXT: snprintf(out, cap, "extension"); break;
    case KVI_VT_ARR: snprintf(out, cap, "sequence"); break;
    case KVI_VT_OBJ: snprintf(out, cap, "map"); break;
    default: snprintf(out, cap, "value"); break;
    }
    rd->_p = save;
    rd->_depth = depth;
    rd->err = 0;
    rd->err_what = NULL;
    rd->err_off = 0;
}

/* ---- writer ------------------------------------------------------------------ */

/* Room for one header at the end of @p b, or NULL (out of memory: the buffer records it). */
static inline void *put_room(struct kvi_buf *b)
{
    return kvi_buf_reserve(b, KVI_MP_HDR_MAX);
}

/* Account what a writer put at the end of @p b (@p at: kvi_buf_reserve's answer). */
static inline void put_done(struct kvi_buf *b, void *at, void *end)
{
    b->len += (size_t)((char *)end - (char *)at);
}

void kvi_mp__put_map(struct kvi_buf *b, uint32_t n)
{
    void *p = put_room(b);
    if (p != NULL)
        put_done(b, p, kvi_mp_w_map_hdr(p, n, false));
}

void kvi_mp__put_arr(struct kvi_buf *b, uint32_t n)
{
    void *p = put_room(b);
    if (p != NULL)
        put_done(b, p, kvi_mp_w_array_hdr(p, n));
}

void kvi_mp__put_str(struct kvi_buf *b, const char *s, size_t len)
{
    void *p = put_room(b);
    if (p == NULL)
        return;
    put_done(b, p, kvi_mp_w_str_hdr(p, len));
    kvi_buf_put(b, s, len);
}

void kvi_mp__put_u64(struct kvi_buf *b, uint64_t v)
{
    void *p = put_room(b);
    if (p != NULL)
        put_done(b, p, kvi_mp_w_uint(p, v));
}

void kvi_mp__put_i64(struct kvi_buf *b, int64_t v)
{
    void *p = put_room(b);
    if (p != NULL)
        put_done(b, p, kvi_mp_w_int(p, v));
}

void kvi_mp__put_nil(struct kvi_buf *b)
{
    void *p = put_room(b);
    if (p != NULL)
        put_done(b, p, kvi_mp_w_nil(p));
}

void kvi_mp__put_bool(struct kvi_buf *b, bool v)
{
    void *p = put_room(b);
    if (p != NULL)
        put_done(b, p, kvi_mp_w_bool(p, v));
}
