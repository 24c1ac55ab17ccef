/*
 * Dynamo RouterEvent encoders (see router_event.h). The msgpack side uses
 * net/msgpack_wire.h's writers; the JSON side writes its fixed keys as
 * literals and its numbers in decimal (u64 exact, never through a double).
 */
#include "router_event.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "msgpack_wire.h" /* same folder: the library builds with net/include alone */

#define KVP_RE_SEED 1337ull

const char *kvp_re_tier(const char *medium)
{
    if (!medium || !strcasecmp(medium, "GPU"))
        return "device";
    if (!strcasecmp(medium, "CPU"))
        return "host_pinned";
    if (!strcasecmp(medium, "DISK"))
        return "disk";
    return "external";
}

uint64_t kvp_re_seed(const char *lora, size_t lora_len)
{
    uint64_t seed = KVP_RE_SEED;
    if (lora && lora_len > 0)
        seed += XXH3_64bits_withSeed(lora, lora_len, 0);
    return seed;
}

uint64_t kvp_re_tokens_hash(const uint32_t *tokens, size_t n, uint64_t seed)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return XXH3_64bits_withSeed(tokens, n * sizeof(uint32_t), seed);
#else
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    uint32_t le[64];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < 64 ? n - i : 64;
        for (size_t j = 0; j < k; j++)
            le[j] = __builtin_bswap32(tokens[i + j]);
        XXH3_64bits_update(&st, le, k * sizeof(uint32_t));
        i += k;
    }
    return XXH3_64bits_digest(&st);
#endif
}

/* ------------------------------------------------------------------------
 * Bounds
 * ------------------------------------------------------------------------ */

/* worker_id, storage_tier (longest "host_pinned"), event_id, dp_rank and the
 * keys and punctuation around them, in either encoding. */
#define KVP_RE_FIXED 160u

size_t kvp_re_stored_max(size_t n_blocks)
{
    /* JSON block: {"block_hash":U,"tokens_hash":U,"mm_extra_info":null}, = 52 + 2 * 20;
     * msgpack: 1 + 11 + 9 + 12 + 9 + 14 + 1 = 57. Plus a parent (20). */
    return KVP_RE_FIXED + 80 + n_blocks * 96;
}

size_t kvp_re_removed_max(size_t n_hashes)
{
    return KVP_RE_FIXED + 48 + n_hashes * 21;
}

size_t kvp_re_cleared_max(void)
{
    return KVP_RE_FIXED + 16;
}

/* ------------------------------------------------------------------------
 * JSON
 * ------------------------------------------------------------------------ */

static uint8_t *js_lit(uint8_t *w, const char *s, size_t n)
{
    memcpy(w, s, n);
    return w + n;
}

#define JS_LIT(w, s) js_lit((w), (s), sizeof(s) - 1)

static uint8_t *js_u64(uint8_t *w, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *w++ = (uint8_t)tmp[--n];
    return w;
}

/* The tier strings need no escaping. */
static uint8_t *js_str(uint8_t *w, const char *s)
{
    *w++ = '"';
    w = js_lit(w, s, strlen(s));
    *w++ = '"';
    return w;
}

/* {"worker_id":W,"storage_tier":"T","event":{"event_id":E,"data": */
static uint8_t *js_head(uint8_t *w, const struct kvp_re_head *h)
{
    w = JS_LIT(w, "{\"worker_id\":");
    w = js_u64(w, h->worker_id);
    w = JS_LIT(w, ",\"storage_tier\":");
    w = js_str(w, h->tier);
    w = JS_LIT(w, ",\"event\":{\"event_id\":");
    w = js_u64(w, h->event_id);
    return JS_LIT(w, ",\"data\":");
}

/* ,"dp_rank":R}} */
static uint8_t *js_tail(uint8_t *w, const struct kvp_re_head *h)
{
    w = JS_LIT(w, ",\"dp_rank\":");
    w = js_u64(w, h->dp_rank);
    return JS_LIT(w, "}}");
}

/* ------------------------------------------------------------------------
 * msgpack (named fields)
 * ------------------------------------------------------------------------ */

#define MP_LIT(w, s) kvi_mp_w_str((w), (s), sizeof(s) - 1)

/* {"worker_id": W, "storage_tier": T, "event": {"event_id": E, "data": */
static uint8_t *mp_head(uint8_t *w, const struct kvp_re_head *h)
{
    w = kvi_mp_w_map_hdr(w, 3, false);
    w = MP_LIT(w, "worker_id");
    w = kvi_mp_w_uint(w, h->worker_id);
    w = MP_LIT(w, "storage_tier");
    w = kvi_mp_w_str(w, h->tier, strlen(h->tier));
    w = MP_LIT(w, "event");
    w = kvi_mp_w_map_hdr(w, 3, false);
    w = MP_LIT(w, "event_id");
    w = kvi_mp_w_uint(w, h->event_id);
    return MP_LIT(w, "data");
}

/* "dp_rank": R (closes both maps: their counts are fixed) */
static uint8_t *mp_tail(uint8_t *w, const struct kvp_re_head *h)
{
    w = MP_LIT(w, "dp_rank");
    return kvi_mp_w_uint(w, h->dp_rank);
}

/* ------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------ */

uint8_t *kvp_re_stored(uint8_t *w, enum kvp_re_enc enc, const struct kvp_re_head *h,
                       const uint64_t *parent, const uint64_t *block_hashes,
                       const uint64_t *tokens_hashes, size_t n)
{
    if (enc == KVP_RE_JSON) {
        w = js_head(w, h);
        w = JS_LIT(w, "{\"stored\":{\"parent_hash\":");
        w = parent ? js_u64(w, *parent) : JS_LIT(w, "null");
        w = JS_LIT(w, ",\"start_position\":null,\"blocks\":[");
        for (size_t i = 0; i < n; i++) {
            if (i)
                *w++ = ',';
            w = JS_LIT(w, "{\"block_hash\":");
            w = js_u64(w, block_hashes[i]);
            w = JS_LIT(w, ",\"tokens_hash\":");
            w = js_u64(w, tokens_hashes[i]);
            w = JS_LIT(w, ",\"mm_extra_info\":null}");
        }
        w = JS_LIT(w, "]}}");
        return js_tail(w, h);
    }
    w = mp_head(w, h);
    w = kvi_mp_w_map_hdr(w, 1, false);
    w = MP_LIT(w, "stored");
    w = kvi_mp_w_map_hdr(w, 3, false);
    w = MP_LIT(w, "parent_hash");
    w = parent ? kvi_mp_w_uint(w, *parent) : kvi_mp_w_nil(w);
    w = MP_LIT(w, "start_position");
    w = kvi_mp_w_nil(w);
    w = MP_LIT(w, "blocks");
    w = kvi_mp_w_array_hdr(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        w = kvi_mp_w_map_hdr(w, 3, false);
        w = MP_LIT(w, "block_hash");
        w = kvi_mp_w_uint(w, block_hashes[i]);
        w = MP_LIT(w, "tokens_hash");
        w = kvi_mp_w_uint(w, tokens_hashes[i]);
        w = MP_LIT(w, "mm_extra_info");
        w = kvi_mp_w_nil(w);
    }
    return mp_tail(w, h);
}

uint8_t *kvp_re_removed(uint8_t *w, enum kvp_re_enc enc, const struct kvp_re_head *h,
                        const uint64_t *hashes, size_t n)
{
    if (enc == KVP_RE_JSON) {
        w = js_head(w, h);
        w = JS_LIT(w, "{\"removed\":{\"block_hashes\":[");
        for (size_t i = 0; i < n; i++) {
            if (i)
                *w++ = ',';
            w = js_u64(w, hashes[i]);
        }
        w = JS_LIT(w, "]}}");
        return js_tail(w, h);
    }
    w = mp_head(w, h);
    w = kvi_mp_w_map_hdr(w, 1, false);
    w = MP_LIT(w, "removed");
    w = kvi_mp_w_map_hdr(w, 1, false);
    w = MP_LIT(w, "block_hashes");
    w = kvi_mp_w_array_hdr(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        w = kvi_mp_w_uint(w, hashes[i]);
    return mp_tail(w, h);
}

uint8_t *kvp_re_cleared(uint8_t *w, enum kvp_re_enc enc, const struct kvp_re_head *h)
{
    if (enc == KVP_RE_JSON) {
        w = js_head(w, h);
        w = JS_LIT(w, "\"cleared\"");
        return js_tail(w, h);
    }
    w = mp_head(w, h);
    w = MP_LIT(w, "cleared");
    return mp_tail(w, h);
}

uint8_t *kvp_re_envelope_head(uint8_t *w, uint64_t publisher_id, uint64_t sequence,
                              uint64_t published_at_ms, uint32_t len)
{
    w = kvi_mp_w_map_hdr(w, 5, false);
    w = MP_LIT(w, "publisher_id");
    w = kvi_mp_w_uint(w, publisher_id);
    w = MP_LIT(w, "sequence");
    w = kvi_mp_w_uint(w, sequence);
    w = MP_LIT(w, "published_at");
    w = kvi_mp_w_uint(w, published_at_ms);
    w = MP_LIT(w, "topic");
    w = MP_LIT(w, "kv-events");
    w = MP_LIT(w, "payload");
    return kvi_mp_w_bin_hdr(w, len);
}
