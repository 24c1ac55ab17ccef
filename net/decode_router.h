/*
 * Dynamo RouterEvent decoder: one NATS message payload (Core NATS envelope,
 * or a bare RouterEvent in JSON or msgpack) into one normalised event.
 * No I/O, no engine calls: net/nats_source.c hands the result to the ingest
 * layer (net/ingest.h). ../shared/reference/nats-event-plane.md §1-§2 is
 * the wire contract; api/README.md ("Dynamo on NATS") the version table.
 *
 * FORMS (detected per message from its first byte and its keys)
 *   envelope  a msgpack map {publisher_id, sequence, published_at, topic,
 *             payload: bin} (Dynamo >= 1.0, Core NATS); payload is the
 *             RouterEvent, msgpack with named fields (a JSON payload inside
 *             the envelope is accepted too). Told from a bare msgpack
 *             RouterEvent by its `payload` key.
 *   json      a JSON RouterEvent (JetStream, and Core NATS up to 0.9).
 *   msgpack   a bare msgpack RouterEvent with named fields.
 *
 * ROUTEREVENT (maps decoded by key, in any order; unknown keys skipped,
 * whatever they hold, so newer fields never break the decoder)
 *   worker_id      int, required; negative values (i64 before 0.5) are
 *                  taken as their 64-bit two's complement
 *   storage_tier   "device" | "host_pinned" | "disk" | "external" (any
 *                  letter case), nil or absent = device; another string is
 *                  indexed as device and flagged (tier_unknown)
 *   event          map, required:
 *     event_id     int >= 0, required
 *     dp_rank      int in [0, 2^32) or nil; absent or nil = 0
 *     data         required: {"stored": {...}} | {"removed": {...}} |
 *                  "cleared" (also {"cleared": nil}); any other variant is
 *                  KVI_REV_VARIANT
 *   stored         blocks: array (required) of maps {block_hash: int
 *                  (required), tokens_hash: int (required: the content
 *                  hash, XXH3-64 of the block's tokens with seed 1337, the
 *                  LoRA mixed in: engine/hash.h), mm_extra_info: anything
 *                  (its hashes are in tokens_hash already)};
 *                  parent_hash: int or nil; start_position: int in
 *                  [0, 2^32) or nil
 *   removed        block_hashes: array of ints (required)
 *   Hash values are ints of any width (u64 above 2^63 as msgpack 0xcf or
 *   plain JSON integers; negative values as two's complement), never floats.
 *
 * ERRORS (kvi_router_decode returns one; the message is dropped whole and
 * counted by reason; nothing of it is applied)
 *   KVI_REV_SYNTAX   not one well-formed JSON / msgpack value (truncated,
 *                    trailing bytes, bad UTF-8 in a JSON string, nesting
 *                    deeper than KVI_RD_MAX_DEPTH)
 *   KVI_REV_SHAPE    envelope or RouterEvent not a map, a required key
 *                    missing, or a field of the wrong type or range
 *   KVI_REV_VARIANT  data names no known variant (unknown event kind)
 *   KVI_REV_LIMIT    payload over KVI_ROUTER_MAX_PAYLOAD bytes, or more
 *                    than KVI_ROUTER_MAX_BLOCKS blocks / hashes
 *   KVI_REV_NOMEM    scratch could not grow
 *   err_what says which field, for logs.
 *
 * OWNERSHIP AND THREADS
 *   A decoder owns a scratch reused from message to message; the arrays of
 *   an event point into it (or into the payload) and stay valid until the
 *   next kvi_router_decode on the same decoder or until the payload is
 *   freed. One thread at a time per decoder.
 */
#ifndef KVI_NET_DECODE_ROUTER_H
#define KVI_NET_DECODE_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"

/** Largest payload accepted (a NATS server's max_payload is 1 MiB by default, 64 MiB at most). */
#define KVI_ROUTER_MAX_PAYLOAD ((size_t)64 << 20)
/** Most blocks (stored) or hashes (removed) in one event. */
#define KVI_ROUTER_MAX_BLOCKS (1u << 20)

enum kvi_rev_kind {
    KVI_REV_STORED = 0,
    KVI_REV_REMOVED = 1,
    KVI_REV_CLEARED = 2,
};

enum kvi_rev_form {
    KVI_REVF_ENVELOPE = 0, /* Core NATS msgpack envelope (Dynamo >= 1.0) */
    KVI_REVF_JSON = 1,     /* JSON RouterEvent */
    KVI_REVF_MSGPACK = 2,  /* bare msgpack RouterEvent */
};
#define KVI_REVF_COUNT 3

enum kvi_rev_err {
    KVI_REV_OK = 0,
    KVI_REV_SYNTAX,
    KVI_REV_SHAPE,
    KVI_REV_VARIANT,
    KVI_REV_LIMIT,
    KVI_REV_NOMEM,
};
#define KVI_REV_ERR_COUNT 6

/** One decoded RouterEvent. Arrays follow the decoder's ownership rule. */
struct kvi_router_event {
    uint8_t kind;          /* enum kvi_rev_kind */
    uint8_t form;          /* enum kvi_rev_form */
    uint8_t tier;          /* enum kvi_tier from storage_tier */
    bool tier_unknown;     /* storage_tier named no known tier (indexed as device) */
    bool has_parent;       /* stored: parent_hash present and not nil */
    bool has_start_position;
    uint32_t dp_rank;
    uint32_t start_position;
    uint32_t n_blocks;     /* stored: blocks; removed: block_hashes */
    uint64_t worker_id;
    uint64_t event_id;
    uint64_t parent_hash;
    const uint64_t *block_hashes;  /* n_blocks engine hashes */
    const uint64_t *tokens_hashes; /* stored: n_blocks content hashes; else NULL */
    /* envelope fields (form KVI_REVF_ENVELOPE; zero otherwise) */
    uint64_t publisher_id;
    uint64_t sequence;
    uint64_t published_at;
};

struct kvi_router_decoder;

/** Free a decoder (NULL: no-op). */
void kvi_router_decoder_free(struct kvi_router_decoder *d);

/** A decoder. @return it, or NULL (ENOMEM). Free with kvi_router_decoder_free. */
KVI_DEALLOC(kvi_router_decoder_free, 1) KVI_WARN_UNUSED
struct kvi_router_decoder *kvi_router_decoder_new(void);

/**
 * Decode one payload into @p out.
 * @return KVI_REV_OK, or the reason it was dropped (ERRORS above); then
 *         kvi_router_decoder_what says which field or rule.
 */
enum kvi_rev_err kvi_router_decode(struct kvi_router_decoder *d, const void *payload, size_t len,
                                   struct kvi_router_event *out);

/** Detail of the last error (static text, "" after success). */
const char *kvi_router_decoder_what(const struct kvi_router_decoder *d);

/** Stable names: "syntax", "shape", "variant", "limit", "nomem" ("ok" for 0). */
const char *kvi_router_err_name(enum kvi_rev_err e);
/** "envelope", "json", "msgpack". */
const char *kvi_router_form_name(enum kvi_rev_form f);

#endif
