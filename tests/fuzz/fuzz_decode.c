/*
 * Fuzz target: the KV-event batch decoder (net/decode.h, kvi_decode_batch).
 *
 * The whole input is one ZMQ payload frame. Beyond "no crash, no overread"
 * (ASan + UBSan), every run checks:
 *   - the msgpack verdict against an independent well-formedness check
 *     written here (mpv_check): a frame that is exactly one msgpack object
 *     nested at most KVI_DECODE_MAX_DEPTH deep never fails as
 *     KVI_DEC_MSGPACK / KVI_DEC_LIMIT, and a frame that is not never
 *     succeeds;
 *   - on failure: -EBADMSG, the reason set, *out zeroed;
 *   - on success: every enum in range, counts bounded by the frame size,
 *     pointers non-NULL where net/decode.h promises, tokens_form consistent
 *     with tokens / n_tokens, mm offsets monotone, strings inside the frame;
 *     every array and string is read in full (ASan checks the extents);
 *   - on success, msgpack-c (an independent parser) accepts the frame whole,
 *     and agrees on ts, the rank and the number of events
 *     (n_events + n_unknown + n_invalid = the events array's length);
 *   - determinism: decoding again with the same (reused) decoder, and from a
 *     copy at an odd address, gives the same result, field by field.
 */
#include <errno.h>
#include <math.h>
#include <msgpack.h>

#include "fuzz.h"
#include "net/decode.h"

/* ---- an independent msgpack well-formedness check ------------------------------- */

enum mpv_verdict {
    MPV_OK = 0,      /* exactly one object, nesting within the limit */
    MPV_INVALID = 1, /* first defect: truncation, 0xc1 or trailing bytes */
    MPV_DEEP = 2,    /* first defect: a container nested too deep */
};

/* Payload bytes after the header byte @p b at p[0] (n bytes available from
 * p); sets *count for containers (items: a map counts keys and values).
 * @return false when the header itself is cut short or is 0xc1. */
static bool mpv_header(const uint8_t *p, size_t n, size_t *hdr, uint64_t *payload, uint64_t *count,
                       bool *container)
{
    uint8_t b = p[0];
    *hdr = 1;
    *payload = 0;
    *count = 0;
    *container = false;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return true;
    if (b >= 0xa0 && b <= 0xbf) {
        *payload = b & 0x1f;
        return true;
    }
    if (b >= 0x80 && b <= 0x9f) {
        *container = true;
        *count = (uint64_t)(b & 0x0f) * (b <= 0x8f ? 2 : 1);
        return true;
    }
    /* 0xc4..0xdf: a length or count of 1, 2 or 4 bytes, or a fixed size */
    static const uint8_t fixed[] = {
        [0xca - 0xc4] = 4, [0xcb - 0xc4] = 8, [0xcc - 0xc4] = 1, [0xcd - 0xc4] = 2,
        [0xce - 0xc4] = 4, [0xcf - 0xc4] = 8, [0xd0 - 0xc4] = 1, [0xd1 - 0xc4] = 2,
        [0xd2 - 0xc4] = 4, [0xd3 - 0xc4] = 8, [0xd4 - 0xc4] = 2, [0xd5 - 0xc4] = 3,
        [0xd6 - 0xc4] = 5, [0xd7 - 0xc4] = 9, [0xd8 - 0xc4] = 17,
    };
    if (b == 0xc1)
        return false;
    if (b >= 0xca && b <= 0xd8) {
        *payload = fixed[b - 0xc4];
        return true;
    }
    size_t w; /* width of the length field */
    switch (b) {
    case 0xc4: case 0xc7: case 0xd9: w = 1; break;
    case 0xc5: case 0xc8: case 0xda: case 0xdc: case 0xde: w = 2; break;
    default: w = 4; break; /* c6 c9 db dd df */
    }
    if (n < 1 + w)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < w; i++)
        v = v << 8 | p[1 + i];
    *hdr = 1 + w;
    if (b >= 0xdc) {
        *container = true;
        *count = b >= 0xde ? 2 * v : v;
    } else {
        *payload = v + (b >= 0xc7 && b <= 0xc9 ? 1 : 0); /* ext: the type byte */
    }
    return true;
}

/* Walk the frame; @return the first defect (MPV_OK when none). */
static enum mpv_verdict mpv_check(const uint8_t *p, size_t n, unsigned max_depth)
{
    uint64_t *left = malloc((n + 1) * sizeof(*left)); /* items left per open container */
    if (left == NULL)
        abort();
    size_t depth = 0, i = 0;
    enum mpv_verdict v = MPV_OK;
    bool top_read = false;
    for (;;) {
        while (depth > 0 && left[depth - 1] == 0)
            depth--;
        if (depth == 0 && top_read)
            break;
        if (i >= n) {
            v = MPV_INVALID;
            break;
        }
        size_t hdr;
        uint64_t payload, count;
        bool container;
        if (!mpv_header(p + i, n - i, &hdr, &payload, &count, &container)) {
            v = MPV_INVALID;
            break;
        }
        if (depth > 0)
            left[depth - 1]--;
        top_read = true;
        i += hdr;
        if (payload > n - i) {
            v = MPV_INVALID;
            break;
        }
        i += payload;
        if (container) {
            if (depth + 1 > max_depth) {
                v = MPV_DEEP;
                break;
            }
            left[depth++] = count;
        }
    }
    if (v == MPV_OK && i != n)
        v = MPV_INVALID; /* trailing bytes */
    free(left);
    return v;
}

/* ---- checks of a decoded batch --------------------------------------------------- */

static bool inside(const void *p, size_t len, const uint8_t *buf, size_t n)
{
    const uint8_t *q = p;
    return q >= buf && q <= buf + n && len <= (size_t)(buf + n - q);
}

static void check_str(const char *p, uint32_t len, const uint8_t *buf, size_t n, struct fz_dig *dg)
{
    if (p == NULL) {
        FZ_CHECK(len == 0);
    } else {
        FZ_CHECK(inside(p, len, buf, n)); /* strings are zero-copy slices of the frame */
    }
    fz_dig_str(dg, p, len);
}

/* Check one batch and digest its contents (not its pointers). */
static uint64_t check_batch(const struct kvi_batch *b, const uint8_t *buf, size_t n)
{
    struct fz_dig dg;
    fz_dig_init(&dg);
    uint64_t ts_bits;
    memcpy(&ts_bits, &b->ts, sizeof(ts_bits));
    fz_dig_u64(&dg, ts_bits);
    fz_dig_u64(&dg, b->has_dp_rank);
    fz_dig_u64(&dg, b->dp_rank);
    fz_dig_u64(&dg, b->n_events);
    fz_dig_u64(&dg, b->n_unknown);
    fz_dig_u64(&dg, b->n_invalid);
    /* every event, decoded or skipped, takes at least one byte */
    FZ_CHECK((uint64_t)b->n_events + b->n_unknown + b->n_invalid <= n);
    FZ_CHECK(b->n_events == 0 || b->events != NULL);
    uint64_t total_hashes = 0, total_tokens = 0;
    for (uint32_t i = 0; i < b->n_events; i++) {
        const struct kvi_ev *e = &b->events[i];
        FZ_CHECK(e->type <= KVI_EV_CLEARED);
        FZ_CHECK(e->family <= KVI_EVF_RFC1527);
        FZ_CHECK(e->tier < KVI_TIER_COUNT);
        FZ_CHECK(e->tokens_form <= KVI_TOK_PAIRS);
        FZ_CHECK(e->group_idx >= -1);
        /* stored and removed events carry an array of hashes (maybe empty) */
        if (e->type != KVI_EV_CLEARED)
            FZ_CHECK(e->hashes != NULL);
        FZ_CHECK(e->n_hashes == 0 || e->hashes != NULL);
        FZ_CHECK(e->n_hashes <= n);
        switch (e->tokens_form) {
        case KVI_TOK_ABSENT: FZ_CHECK(e->tokens == NULL && e->n_tokens == 0); break;
        case KVI_TOK_EMPTY: FZ_CHECK(e->tokens != NULL && e->n_tokens == 0); break;
        case KVI_TOK_FLAT: FZ_CHECK(e->tokens != NULL && e->n_tokens >= 1); break;
        case KVI_TOK_PAIRS: FZ_CHECK(e->tokens != NULL && e->n_tokens >= 2); break;
        }
        total_hashes += e->n_hashes;
        total_tokens += e->n_tokens;
        fz_dig_u64(&dg, (uint64_t)e->type << 24 | (uint64_t)e->family << 16 |
                             (uint64_t)e->tier << 8 | e->tokens_form);
        fz_dig_u64(&dg, (uint64_t)e->medium_unknown << 3 | (uint64_t)e->has_parent << 2 |
                             (uint64_t)e->has_base_idx << 1 | e->has_block_size);
        fz_dig_u64(&dg, e->has_block_size ? e->block_size : 0);
        fz_dig_u64(&dg, e->has_base_idx ? e->base_block_idx : 0);
        fz_dig_u64(&dg, (uint64_t)(int64_t)e->group_idx);
        fz_dig_u64(&dg, e->has_parent ? e->parent_hash : 0);
        fz_dig_bytes(&dg, e->hashes, (size_t)e->n_hashes * sizeof(uint64_t));
        fz_dig_bytes(&dg, e->tokens, (size_t)e->n_tokens * sizeof(uint32_t));
        fz_dig_u64(&dg, e->mm_off != NULL);
        if (e->mm_off != NULL) {
            FZ_CHECK(e->mm_off[0] == 0);
            for (uint32_t k = 0; k < e->n_hashes; k++)
                FZ_CHECK(e->mm_off[k] <= e->mm_off[k + 1]);
            uint32_t n_mm = e->mm_off[e->n_hashes];
            FZ_CHECK(n_mm <= n);
            FZ_CHECK(n_mm == 0 || e->mm != NULL);
            fz_dig_bytes(&dg, e->mm_off, ((size_t)e->n_hashes + 1) * sizeof(uint32_t));
            fz_dig_bytes(&dg, e->mm, (size_t)n_mm * sizeof(uint64_t));
        }
        check_str(e->lora_name, e->lora_len, buf, n, &dg);
        check_str(e->backend_id, e->backend_len, buf, n, &dg);
        check_str(e->cache_salt, e->salt_len, buf, n, &dg);
        check_str(e->spec_kind, e->spec_kind_len, buf, n, &dg);
        check_str(e->object_key, e->object_key_len, buf, n, &dg);
    }
    /* each hash or token id takes at least one byte of the frame (a pair of
     * token ids at least three bytes for the two ids it adds) */
    FZ_CHECK(total_hashes <= n && total_tokens <= n);
    return dg.h;
}

/* ---- msgpack-c cross-check of an accepted frame ---------------------------------- */

static bool mp_number(const msgpack_object *o, double *out)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; return true;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; return true;
    default: return false;
    }
}

static bool mp_key_is(const msgpack_object *k, const char *lit)
{
    size_t n = strlen(lit);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, lit, n) == 0;
}

/* The rank a msgpack object stands for (@return false for nil). */
static bool mp_rank(const msgpack_object *o, uint32_t *rank)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *rank = (uint32_t)o->via.u64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *rank = (uint32_t)o->via.i64;
        return true;
    }
    FZ_CHECK(o->type == MSGPACK_OBJECT_NIL); /* anything else fails the batch */
    return false;
}

static void cross_check(const uint8_t *buf, size_t n, const struct kvi_batch *b)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&u, (const char *)buf, n, &off);
    FZ_CHECK(r == MSGPACK_UNPACK_SUCCESS);
    FZ_CHECK(off == n);
    const msgpack_object *top = &u.data;
    const msgpack_object *events = NULL;
    double ts = 0;
    bool has_rank = false;
    uint32_t rank = 0;
    if (top->type == MSGPACK_OBJECT_ARRAY) {
        FZ_CHECK(top->via.array.size >= 2);
        FZ_CHECK(mp_number(&top->via.array.ptr[0], &ts));
        events = &top->via.array.ptr[1];
        if (top->via.array.size >= 3)
            has_rank = mp_rank(&top->via.array.ptr[2], &rank);
    } else {
        FZ_CHECK(top->type == MSGPACK_OBJECT_MAP);
        int n_rank_keys = 0, n_events = 0;
        const msgpack_object *rank_val = NULL;
        for (uint32_t i = 0; i < top->via.map.size; i++) {
            const msgpack_object_kv *kv = &top->via.map.ptr[i];
            if (mp_key_is(&kv->key, "events")) {
                events = &kv->val;
                n_events++;
            } else if (mp_key_is(&kv->key, "ts")) {
                FZ_CHECK(mp_number(&kv->val, &ts));
            } else if (mp_key_is(&kv->key, "data_parallel_rank") ||
                       mp_key_is(&kv->key, "dp_rank") || mp_key_is(&kv->key, "attn_dp_rank")) {
                rank_val = &kv->val;
                n_rank_keys++;
            }
        }
        FZ_CHECK(n_events == 1);
        /* with several rank keys the winner is the decoder's choice */
        if (n_rank_keys == 1)
            has_rank = mp_rank(rank_val, &rank);
        else
            has_rank = b->has_dp_rank, rank = b->dp_rank;
    }
    FZ_CHECK(events->type == MSGPACK_OBJECT_ARRAY);
    FZ_CHECK((uint64_t)events->via.array.size ==
             (uint64_t)b->n_events + b->n_unknown + b->n_invalid);
    FZ_CHECK(ts == b->ts || (isnan(ts) && isnan(b->ts)));
    FZ_CHECK(has_rank == b->has_dp_rank);
    if (has_rank)
        FZ_CHECK(rank == b->dp_rank);
    msgpack_unpacked_destroy(&u);
}

/* ---- entry point ---------------------------------------------------------------- */

static struct kvi_decoder *g_dec;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_dec == NULL && (g_dec = kvi_decoder_create()) == NULL)
        abort();
    struct kvi_batch out;
    memset(&out, 0x5a, sizeof(out));
    int rc = kvi_decode_batch(g_dec, data, size, &out);
    enum kvi_decode_err why = kvi_decoder_error(g_dec);
    enum mpv_verdict v = mpv_check(data, size, KVI_DECODE_MAX_DEPTH);
    uint64_t dig = 0;
    if (rc == 0) {
        FZ_CHECK(why == KVI_DEC_OK);
        FZ_CHECK(kvi_decoder_error_str(g_dec)[0] == '\0');
        FZ_CHECK(v == MPV_OK);
        dig = check_batch(&out, data, size);
        cross_check(data, size, &out);
    } else {
        FZ_CHECK(rc == -EBADMSG); /* -ENOMEM would need a frame near KVI_DECODE_MAX_FRAME */
        FZ_CHECK(why > KVI_DEC_OK && why <= KVI_DEC_LIMIT);
        FZ_CHECK(kvi_decoder_error_str(g_dec)[0] != '\0');
        struct kvi_batch zero;
        memset(&zero, 0, sizeof(zero));
        FZ_CHECK(memcmp(&out, &zero, sizeof(out)) == 0);
        /* a well-formed frame is never called malformed or too deep (a
         * malformed one may fail for its shape first: the decoder checks
         * the shape as it goes, and a count larger than the bytes left
         * fails at once, before what lies inside) */
        if (v == MPV_OK)
            FZ_CHECK(why != KVI_DEC_MSGPACK && why != KVI_DEC_LIMIT);
    }

    /* the same frame at an odd address, then the original again */
    uint8_t *odd = malloc(size + 1);
    if (odd == NULL)
        abort();
    if (size > 0)
        memcpy(odd + 1, data, size);
    struct kvi_batch again;
    int rc2 = kvi_decode_batch(g_dec, odd + 1, size, &again);
    FZ_CHECK(rc2 == rc && kvi_decoder_error(g_dec) == why);
    if (rc == 0)
        FZ_CHECK(check_batch(&again, odd + 1, size) == dig);
    free(odd);
    int rc3 = kvi_decode_batch(g_dec, data, size, &again);
    FZ_CHECK(rc3 == rc);
    if (rc == 0)
        FZ_CHECK(check_batch(&again, data, size) == dig);
    return 0;
}
