/*
 * Fuzz target: the Dynamo RouterEvent decoder (net/decode_router.h), on
 * whole NATS message payloads. Checks:
 *   - the result is OK or one of the documented reasons, with a detail text;
 *   - a decoded event is well-formed: a known kind, form and tier; arrays
 *     present for its blocks (stored: block and tokens hashes; removed: block
 *     hashes), at most KVI_ROUTER_MAX_BLOCKS; the form agrees with the first
 *     byte (JSON '{' after whitespace, else msgpack);
 *   - msgpack forms are one well-formed msgpack object to msgpack-c too;
 *   - a round trip: the event written back as JSON (the body layer's writer)
 *     decodes to the same fields;
 *   - the decoder stays usable: decoding the input twice gives the same
 *     result.
 */
#include <msgpack.h>

#include "engine/index.h"
#include "fuzz.h"
#include "net/body.h"
#include "net/decode_router.h"

static void write_json(const struct kvi_router_event *e, struct kvi_buf *b)
{
    static const char *const tiers[] = {"device", "host_pinned", "disk", "external"};
    struct kvi_wr w;
    kvi_wr_init(&w, b, KVI_ENC_JSON);
    kvi_wr_obj(&w, 3);
    kvi_wr_keyz(&w, "worker_id");
    kvi_wr_u64(&w, e->worker_id);
    kvi_wr_keyz(&w, "storage_tier");
    kvi_wr_strz(&w, e->tier_unknown ? "other" : tiers[e->tier]);
    kvi_wr_keyz(&w, "event");
    kvi_wr_obj(&w, 3);
    kvi_wr_keyz(&w, "event_id");
    kvi_wr_u64(&w, e->event_id);
    kvi_wr_keyz(&w, "dp_rank");
    kvi_wr_u64(&w, e->dp_rank);
    kvi_wr_keyz(&w, "data");
    if (e->kind == KVI_REV_CLEARED) {
        kvi_wr_strz(&w, "cleared");
    } else if (e->kind == KVI_REV_REMOVED) {
        kvi_wr_obj(&w, 1);
        kvi_wr_keyz(&w, "removed");
        kvi_wr_obj(&w, 1);
        kvi_wr_keyz(&w, "block_hashes");
        kvi_wr_arr(&w, e->n_blocks);
        for (uint32_t i = 0; i < e->n_blocks; i++)
            kvi_wr_u64(&w, e->block_hashes[i]);
        kvi_wr_end(&w);
        kvi_wr_end(&w);
        kvi_wr_end(&w);
    } else {
        kvi_wr_obj(&w, 1);
        kvi_wr_keyz(&w, "stored");
        kvi_wr_obj(&w, 3);
        kvi_wr_keyz(&w, "parent_hash");
        if (e->has_parent)
            kvi_wr_u64(&w, e->parent_hash);
        else
            kvi_wr_null(&w);
        kvi_wr_keyz(&w, "start_position");
        if (e->has_start_position)
            kvi_wr_u64(&w, e->start_position);
        else
            kvi_wr_null(&w);
        kvi_wr_keyz(&w, "blocks");
        kvi_wr_arr(&w, e->n_blocks);
        for (uint32_t i = 0; i < e->n_blocks; i++) {
            kvi_wr_obj(&w, 2);
            kvi_wr_keyz(&w, "block_hash");
            kvi_wr_u64(&w, e->block_hashes[i]);
            kvi_wr_keyz(&w, "tokens_hash");
            kvi_wr_u64(&w, e->tokens_hashes[i]);
            kvi_wr_end(&w);
        }
        kvi_wr_end(&w);
        kvi_wr_end(&w);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    kvi_wr_end(&w);
}

static bool same(const struct kvi_router_event *a, const struct kvi_router_event *b)
{
    if (a->kind != b->kind || a->tier != b->tier || a->tier_unknown != b->tier_unknown ||
        a->worker_id != b->worker_id || a->event_id != b->event_id || a->dp_rank != b->dp_rank ||
        a->n_blocks != b->n_blocks || a->has_parent != b->has_parent ||
        (a->has_parent && a->parent_hash != b->parent_hash) || a->has_start_position != b->has_start_position ||
        (a->has_start_position && a->start_position != b->start_position))
        return false;
    for (uint32_t i = 0; i < a->n_blocks; i++)
        if (a->block_hashes[i] != b->block_hashes[i] ||
            (a->kind == KVI_REV_STORED && a->tokens_hashes[i] != b->tokens_hashes[i]))
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kvi_router_decoder *d, *d2;
    if (d == NULL) {
        d = kvi_router_decoder_new();
        d2 = kvi_router_decoder_new();
        FZ_CHECK(d != NULL && d2 != NULL);
    }
    struct kvi_router_event e, e2;
    enum kvi_rev_err r = kvi_router_decode(d, data, size, &e);
    FZ_CHECK((unsigned)r < KVI_REV_ERR_COUNT);
    FZ_CHECK((r == KVI_REV_OK) == (kvi_router_decoder_what(d)[0] == '\0'));
    FZ_CHECK(kvi_router_decode(d2, data, size, &e2) == r);
    if (r != KVI_REV_OK)
        return 0;
    FZ_CHECK(same(&e, &e2));
    FZ_CHECK(e.kind <= KVI_REV_CLEARED && e.form < KVI_REVF_COUNT && e.tier < KVI_TIER_COUNT);
    FZ_CHECK(e.n_blocks <= KVI_ROUTER_MAX_BLOCKS);
    FZ_CHECK(e.kind == KVI_REV_CLEARED ? e.n_blocks == 0 : (e.n_blocks == 0 || e.block_hashes != NULL));
    FZ_CHECK(e.kind == KVI_REV_STORED ? (e.n_blocks == 0 || e.tokens_hashes != NULL) : e.tokens_hashes == NULL);
    size_t i = 0;
    while (i < size && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'))
        i++;
    FZ_CHECK((e.form == KVI_REVF_JSON) == (i < size && data[i] == '{'));
    if (e.form != KVI_REVF_JSON) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        FZ_CHECK(msgpack_unpack_next(&u, (const char *)data, size, &off) == MSGPACK_UNPACK_SUCCESS);
        FZ_CHECK(off == size);
        msgpack_unpacked_destroy(&u);
    }
    /* round trip through the JSON form */
    struct kvi_buf b;
    kvi_buf_init(&b);
    write_json(&e, &b);
    FZ_CHECK(kvi_buf_ok(&b));
    FZ_CHECK(kvi_router_decode(d2, b.data, b.len, &e2) == KVI_REV_OK);
    FZ_CHECK(e2.form == KVI_REVF_JSON);
    FZ_CHECK(same(&e, &e2));
    kvi_buf_free(&b);
    return 0;
}
