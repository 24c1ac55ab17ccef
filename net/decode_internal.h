/*
 * KV-event batch decoder internals shared by net/decode.c (the decoder, its
 * scratch and the batch envelope), net/decode_msgpack.c (the msgpack
 * cursor) and net/decode_event.c (the event decoders). Not installed; see
 * net/decode.h for the API and net/decode.c for the design.
 */
#ifndef KVI_NET_DECODE_INTERNAL_H
#define KVI_NET_DECODE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/common.h"
#include "net/decode.h"
#include "net/msgpack_wire.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the KV-event decoder (net/decode*.c) assumes a little-endian host"
#endif

/* Depths (the batch is depth 1), used when skipping. */
#define D_BATCH_ITEM 2 /* ts, events, rank, map-batch values */
#define D_EVENT 3
#define D_FIELD 4
#define D_ELEM 5

/* ---- msgpack cursor (net/decode_msgpack.c) ---- */

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

static inline bool key_is(const struct mp_val *k, const char *lit, size_t lit_len)
{
    return k->n == lit_len && memcmp(k->ptr, lit, lit_len) == 0;
}
#define KEY_IS(k, lit) key_is((k), lit, sizeof(lit) - 1)

/* ---- decoder state (net/decode.c) ---- */

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

/* ---- shared between the three files ---------------------------------------- */

/* decode_msgpack.c (the two skip wrappers below are inline, as they were in every caller) */

/** Read one value header (and the payload of scalars, strings, bins, exts). @return 0 or KVI_DEC_MSGPACK. */
int kvi_dec__mp_next(struct cur *c, struct mp_val *v);

/** Skip the contents of a value whose header @p v was just read at depth @p depth. */
int kvi_dec__mp_skip_body(struct cur *c, const struct mp_val *v, unsigned depth);

/* Skip one whole value at depth @p depth. */
static inline int kvi_dec__mp_skip(struct cur *c, unsigned depth)
{
    struct mp_val v;
    int e = kvi_dec__mp_next(c, &v);
    return e ? e : kvi_dec__mp_skip_body(c, &v, depth);
}

/* Skip @p n values at depth @p depth. */
static inline int kvi_dec__mp_skip_n(struct cur *c, uint64_t n, unsigned depth)
{
    for (uint64_t i = 0; i < n; i++) {
        int e = kvi_dec__mp_skip(c, depth);
        if (e)
            return e;
    }
    return 0;
}

/* decode.c */

/** Make room for @p extra more elements. @return 0 or KVI_DEC_NOMEM. */
KVI_WARN_UNUSED int kvi_dec__vec64_reserve(struct vec64 *a, size_t extra);
KVI_WARN_UNUSED int kvi_dec__vec32_reserve(struct vec32 *a, size_t extra);

/** Make room for @p extra more events (and their fix-ups). @return 0 or KVI_DEC_NOMEM. */
KVI_WARN_UNUSED int kvi_dec__events_reserve(struct kvi_decoder *d, size_t extra);

/* decode_event.c */

/** Read a batch's events value, an array: every event is decoded into d's scratch,
 * or counted in @p out and dropped. @return 0 or a KVI_DEC_* error. */
int kvi_dec__batch_events(struct kvi_decoder *d, struct cur *c, struct kvi_batch *out);

#endif
