/*
 * KV-event batch decoder (net/decode.h): the msgpack cursor. One value
 * header at a time (kvi_dec__mp_next), and structural skipping that
 * validates everything it passes over (kvi_dec__mp_skip_body, iterative
 * and depth-limited). Bounds are checked against the bytes left before
 * anything is read. The decoder and its design are in net/decode.c; the
 * types are in net/decode_internal.h.
 */
#include "net/decode_internal.h"

#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"

/* ------------------------------------------------------------------------ */
/* msgpack cursor                                                            */
/* ------------------------------------------------------------------------ */

/* Read one value header (and the payload of scalars, strings, bins, exts).
 * Containers: only the header; n = element (pair) count, already checked
 * against the bytes left. @return 0 or KVI_DEC_MSGPACK. */
int kvi_dec__mp_next(struct cur *c, struct mp_val *v)
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
        len = kvi_load_be16(p);
        p += 2;
        goto bin;
    case 0xc6:
        len = kvi_load_be32(p);
        p += 4;
        goto bin;
    case 0xc7:
        len = p[0];
        p += 2;
        goto ext;
    case 0xc8:
        len = kvi_load_be16(p);
        p += 3;
        goto ext;
    case 0xc9:
        len = kvi_load_be32(p);
        p += 5;
        goto ext;
    case 0xca: {
        uint32_t w = kvi_load_be32(p);
        float f;
        memcpy(&f, &w, sizeof f);
        v->t = MP_FLOAT;
        v->f = f;
        p += 4;
        break;
    }
    case 0xcb: {
        uint64_t w = kvi_load_be64(p);
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
        v->u = kvi_load_be16(p);
        p += 2;
        break;
    case 0xce:
        v->t = MP_UINT;
        v->u = kvi_load_be32(p);
        p += 4;
        break;
    case 0xcf:
        v->t = MP_UINT;
        v->u = kvi_load_be64(p);
        p += 8;
        break;
    case 0xd0:
        v->i = (int8_t)p[0];
        p += 1;
        goto sint;
    case 0xd1:
        v->i = (int16_t)kvi_load_be16(p);
        p += 2;
        goto sint;
    case 0xd2:
        v->i = (int32_t)kvi_load_be32(p);
        p += 4;
        goto sint;
    case 0xd3:
        v->i = (int64_t)kvi_load_be64(p);
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
        len = kvi_load_be16(p);
        p += 2;
        goto str;
    case 0xdb:
        len = kvi_load_be32(p);
        p += 4;
        goto str;
    case 0xdc:
        len = kvi_load_be16(p);
        p += 2;
        goto array;
    case 0xdd:
        len = kvi_load_be32(p);
        p += 4;
        goto array;
    case 0xde:
        len = kvi_load_be16(p);
        p += 2;
        goto map;
    case 0xdf:
        len = kvi_load_be32(p);
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
int kvi_dec__mp_skip_body(struct cur *c, const struct mp_val *v, unsigned depth)
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
        int e = kvi_dec__mp_next(c, &x);
        if (KVI_UNLIKELY(e))
            return e;
    }
}
