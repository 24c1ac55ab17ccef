/*
 * Dynamo RouterEvent encoders of the C publisher's NATS transports
 * (net/publisher_nats.c): the RouterEvent as a msgpack map with named fields
 * (Core NATS payload) or as JSON (JetStream), the Core envelope around it,
 * the tokens_hash of a block and the storage tier of a medium. The wire
 * format is documented at enum kvidx_pub_transport in
 * net/include/kvidx/publisher.h.
 *
 * Part of the publisher library (header-only xxhash and net/msgpack_wire.h
 * only). Not installed.
 *
 * Writers put one item at @p w and return the byte after it; they check no
 * bounds: the caller reserves the matching *_max bound first. Every
 * function is pure. Thread: any.
 */
#ifndef KVI_NET_ROUTER_EVENT_H
#define KVI_NET_ROUTER_EVENT_H

#include <stddef.h>
#include <stdint.h>

/** Encoding of a RouterEvent. */
enum kvp_re_enc {
    KVP_RE_MSGPACK = 0, /**< msgpack map, named fields */
    KVP_RE_JSON = 1,    /**< JSON object, no white space */
};

/** The fields every RouterEvent carries. */
struct kvp_re_head {
    uint64_t worker_id;
    const char *tier; /**< storage_tier: a kvp_re_tier string */
    uint64_t event_id;
    uint32_t dp_rank;
};

/** storage_tier of @p medium (NULL = the default "GPU"): a static string. */
const char *kvp_re_tier(const char *medium);

/** The seed of tokens_hash: 1337 + XXH3-64(lora, 0) when lora_len > 0. */
uint64_t kvp_re_seed(const char *lora, size_t lora_len);

/** tokens_hash of one block: XXH3-64 of @p n tokens as little-endian u32. */
uint64_t kvp_re_tokens_hash(const uint32_t *tokens, size_t n, uint64_t seed);

/** Upper bounds of the writers' output, in bytes. */
size_t kvp_re_stored_max(size_t n_blocks);
size_t kvp_re_removed_max(size_t n_hashes);
size_t kvp_re_cleared_max(void);

/**
 * A stored event: blocks[i] = {block_hashes[i], tokens_hashes[i], null}.
 * @param parent  NULL: null
 */
uint8_t *kvp_re_stored(uint8_t *w, enum kvp_re_enc enc, const struct kvp_re_head *h,
                       const uint64_t *parent, const uint64_t *block_hashes,
                       const uint64_t *tokens_hashes, size_t n);

uint8_t *kvp_re_removed(uint8_t *w, enum kvp_re_enc enc, const struct kvp_re_head *h,
                        const uint64_t *hashes, size_t n);

uint8_t *kvp_re_cleared(uint8_t *w, enum kvp_re_enc enc, const struct kvp_re_head *h);

/** Bytes of the Core envelope in front of a payload of @p len bytes (bound). */
#define KVP_RE_ENVELOPE_MAX 96u

/**
 * The Core NATS envelope up to and including the payload's bin header:
 * {"publisher_id", "sequence", "published_at", "topic": "kv-events",
 * "payload": bin(len)}; the caller appends the @p len payload bytes.
 */
uint8_t *kvp_re_envelope_head(uint8_t *w, uint64_t publisher_id, uint64_t sequence,
                              uint64_t published_at_ms, uint32_t len);

#endif
