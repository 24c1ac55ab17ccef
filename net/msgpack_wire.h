/*
 * Byte-order and msgpack primitives: the one copy every hand-written msgpack
 * path of kvidx uses.
 *
 *   | user                     | what it takes from here                      |
 *   |--------------------------|----------------------------------------------|
 *   | net/decode_msgpack.c,    | big-endian loads (the event decoder's reader |
 *   | net/decode_event.c       | is hand-written: 2.7x msgpack-c on events)   |
 *   | net/body_msgpack.c,      | loads (the body reader) and every writer     |
 *   | api/codec_internal.h     | (answers, msgpack bodies)                    |
 *   | net/publisher.c          | every writer (the C publisher library)       |
 *   | net/listener.c           | big-endian u64 (replay request and reply     |
 *   |                          | frames)                                      |
 *   | bench/h2c.c              | big-endian u32 (HTTP/2 frames)               |
 *
 * Header-only and libc-only: the publisher library (net/publisher.c) is
 * built from it and libzmq alone. Not installed.
 *
 * Loads read an unaligned big-endian word. Writers put one msgpack item at
 * @p w in its smallest encoding (the one msgpack-c, msgspec and Python's
 * msgpack choose) and return the byte after it. They check no bounds: the
 * caller has room for KVI_MP_HDR_MAX bytes per header (and the payload of a
 * string). Pointers are void * so that char and uint8_t buffers both pass.
 * Thread: any (pure functions).
 */
#ifndef KVI_NET_MSGPACK_WIRE_H
#define KVI_NET_MSGPACK_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/** The longest msgpack header (tag + 8-byte payload). */
#define KVI_MP_HDR_MAX 9

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVI__BSWAP16(v) __builtin_bswap16(v)
#define KVI__BSWAP32(v) __builtin_bswap32(v)
#define KVI__BSWAP64(v) __builtin_bswap64(v)
#else
#define KVI__BSWAP16(v) (v)
#define KVI__BSWAP32(v) (v)
#define KVI__BSWAP64(v) (v)
#endif

/* ---- big-endian loads and stores ---- */

static inline uint16_t kvi_load_be16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return KVI__BSWAP16(v);
}

static inline uint32_t kvi_load_be32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return KVI__BSWAP32(v);
}

static inline uint64_t kvi_load_be64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return KVI__BSWAP64(v);
}

/** Store @p v big-endian at @p w. @return the byte after it. */
static inline void *kvi_store_be16(void *w, uint16_t v)
{
    v = KVI__BSWAP16(v);
    memcpy(w, &v, sizeof v);
    return (uint8_t *)w + sizeof v;
}

static inline void *kvi_store_be32(void *w, uint32_t v)
{
    v = KVI__BSWAP32(v);
    memcpy(w, &v, sizeof v);
    return (uint8_t *)w + sizeof v;
}

static inline void *kvi_store_be64(void *w, uint64_t v)
{
    v = KVI__BSWAP64(v);
    memcpy(w, &v, sizeof v);
    return (uint8_t *)w + sizeof v;
}

/* ---- msgpack writers ---- */

/** A one-byte item: a fixint, nil (0xc0), false (0xc2), true (0xc3), or a fix* header. */
static inline void *kvi_mp_w_byte(void *w, uint8_t b)
{
    *(uint8_t *)w = b;
    return (uint8_t *)w + 1;
}

static inline void *kvi_mp_w_nil(void *w)
{
    return kvi_mp_w_byte(w, 0xc0);
}

static inline void *kvi_mp_w_bool(void *w, bool v)
{
    return kvi_mp_w_byte(w, v ? 0xc3 : 0xc2);
}

/** Unsigned integer (at most 9 bytes). */
static inline __attribute__((always_inline)) void *kvi_mp_w_uint(void *w, uint64_t v)
{
    uint8_t *o = w;
    if (v <= 0x7f)
        return kvi_mp_w_byte(o, (uint8_t)v);
    if (v <= 0xff) {
        o[0] = 0xcc;
        o[1] = (uint8_t)v;
        return o + 2;
    }
    if (v <= 0xffff) {
        o[0] = 0xcd;
        return kvi_store_be16(o + 1, (uint16_t)v);
    }
    if (v <= 0xffffffffu) {
        o[0] = 0xce;
        return kvi_store_be32(o + 1, (uint32_t)v);
    }
    o[0] = 0xcf;
    return kvi_store_be64(o + 1, v);
}

/** Signed integer; non-negative values as unsigned (at most 9 bytes). */
static inline void *kvi_mp_w_int(void *w, int64_t v)
{
    uint8_t *o = w;
    if (v >= 0)
        return kvi_mp_w_uint(o, (uint64_t)v);
    if (v >= -32)
        return kvi_mp_w_byte(o, (uint8_t)v); /* negative fixint */
    if (v >= INT8_MIN) {
        o[0] = 0xd0;
        o[1] = (uint8_t)v;
        return o + 2;
    }
    if (v >= INT16_MIN) {
        o[0] = 0xd1;
        return kvi_store_be16(o + 1, (uint16_t)v);
    }
    if (v >= INT32_MIN) {
        o[0] = 0xd2;
        return kvi_store_be32(o + 1, (uint32_t)v);
    }
    o[0] = 0xd3;
    return kvi_store_be64(o + 1, (uint64_t)v);
}

/** float 64 (9 bytes). */
static inline void *kvi_mp_w_f64(void *w, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    *(uint8_t *)w = 0xcb;
    return kvi_store_be64((uint8_t *)w + 1, bits);
}

/** str header for @p n bytes (at most 5 bytes). */
static inline void *kvi_mp_w_str_hdr(void *w, size_t n)
{
    uint8_t *o = w;
    if (n <= 31)
        return kvi_mp_w_byte(o, (uint8_t)(0xa0 | n));
    if (n <= 0xff) {
        o[0] = 0xd9;
        o[1] = (uint8_t)n;
        return o + 2;
    }
    if (n <= 0xffff) {
        o[0] = 0xda;
        return kvi_store_be16(o + 1, (uint16_t)n);
    }
    o[0] = 0xdb;
    return kvi_store_be32(o + 1, (uint32_t)n);
}

/** str: header and @p n bytes of @p s. */
static inline void *kvi_mp_w_str(void *w, const char *s, size_t n)
{
    uint8_t *o = kvi_mp_w_str_hdr(w, n);
    memcpy(o, s, n);
    return o + n;
}

/** array header (at most 5 bytes). */
static inline void *kvi_mp_w_array_hdr(void *w, uint32_t n)
{
    uint8_t *o = w;
    if (n <= 15)
        return kvi_mp_w_byte(o, (uint8_t)(0x90 | n));
    if (n <= 0xffff) {
        o[0] = 0xdc;
        return kvi_store_be16(o + 1, (uint16_t)n);
    }
    o[0] = 0xdd;
    return kvi_store_be32(o + 1, n);
}

/** The size of kvi_mp_w_array_hdr's header for @p n. */
static inline size_t kvi_mp_array_hdr_len(uint32_t n)
{
    return n <= 15 ? 1 : n <= 0xffff ? 3 : 5;
}

/**
 * map header (at most 5 bytes). @p wide: at least map16, even under 16
 * entries (a header written before its count is known keeps its size).
 */
static inline void *kvi_mp_w_map_hdr(void *w, uint32_t n, bool wide)
{
    uint8_t *o = w;
    if (n <= 15 && !wide)
        return kvi_mp_w_byte(o, (uint8_t)(0x80 | n));
    if (n <= 0xffff) {
        o[0] = 0xde;
        return kvi_store_be16(o + 1, (uint16_t)n);
    }
    o[0] = 0xdf;
    return kvi_store_be32(o + 1, n);
}

/** bin header for @p n bytes (at most 5 bytes). */
static inline void *kvi_mp_w_bin_hdr(void *w, uint32_t n)
{
    uint8_t *o = w;
    if (n <= 0xff) {
        o[0] = 0xc4;
        o[1] = (uint8_t)n;
        return o + 2;
    }
    if (n <= 0xffff) {
        o[0] = 0xc5;
        return kvi_store_be16(o + 1, (uint16_t)n);
    }
    o[0] = 0xc6;
    return kvi_store_be32(o + 1, n);
}

#endif
