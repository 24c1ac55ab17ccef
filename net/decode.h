/*
 * KV-event batch decoder: turns one ZMQ payload frame (a msgpack batch, as
 * every real engine sends it; ../shared/reference/wire-protocol.md §2-§4) into
 * normalised events. No I/O, no engine calls: the ingest layer (net/ingest.h)
 * turns decoded events into index operations.
 *
 * Accepted (wire-protocol.md §9 checklist):
 *   - batch [ts, events] / [ts, events, dp_rank|nil, ...] and the map form
 *     {ts, events, data_parallel_rank|dp_rank|attn_dp_rank};
 *   - events as tagged arrays (vLLM 5..12+ fields, SGLang, Dynamo mocker),
 *     tagged maps (vLLM map form, SGLang, Dynamo dict form) and RFC 1527
 *     maps (event_type / seq_hashes / base_block_idx / parent_hash /
 *     backend_id / medium / object_key), mixed in one batch;
 *   - hashes as any int width (negative = two's complement) or bin (last 8
 *     bytes big-endian); token_ids flat, empty, nil or [a, b] pairs (eagle
 *     flattening); medium strings normalised case-insensitively.
 * An event with an unknown tag is skipped and counted (the batch survives);
 * a structurally broken batch fails as a whole.
 *
 * Ownership: a decoder owns scratch memory reused from batch to batch. The
 * events, hash arrays, token arrays and strings handed out point into that
 * scratch or into the input buffer, and stay valid until the next
 * kvi_decode_batch call on the same decoder or until the input buffer is
 * released, whichever comes first.
 *
 * Thread-safety: a decoder is used by one thread at a time (one per listener
 * thread). Different decoders are independent.
 */
#ifndef KVI_NET_DECODE_H
#define KVI_NET_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/index.h"

enum kvi_ev_type {
    KVI_EV_STORED = 0,
    KVI_EV_REMOVED = 1,
    KVI_EV_CLEARED = 2,
};

/** Which wire family an event came in (for counters and tests). */
enum kvi_ev_family {
    KVI_EVF_ARRAY = 0,   /* tagged array */
    KVI_EVF_MAP = 1,     /* tagged map: vLLM map form, SGLang, Dynamo dict */
    KVI_EVF_RFC1527 = 2, /* standardized event_type/seq_hashes map */
};

/** What the event said about token ids. */
enum kvi_ev_tokens {
    KVI_TOK_ABSENT = 0, /* field missing or nil */
    KVI_TOK_EMPTY = 1,  /* [] (offload placeholders) */
    KVI_TOK_FLAT = 2,   /* plain token ids */
    KVI_TOK_PAIRS = 3,  /* [a, b] pairs, flattened: eagle windows apply */
};

/** One decoded event. Pointers follow the decoder's ownership rule. */
struct kvi_ev {
    uint8_t type;          /* enum kvi_ev_type */
    uint8_t family;        /* enum kvi_ev_family */
    uint8_t tier;          /* enum kvi_tier from `medium` (absent = gpu) */
    uint8_t tokens_form;   /* enum kvi_ev_tokens */
    bool medium_unknown;   /* medium string not recognised (treated as gpu) */
    bool has_parent;       /* parent_block_hash / parent_hash present, not nil */
    bool has_base_idx;     /* base_block_idx present (RFC 1527) */
    bool has_block_size;   /* block_size present, not nil */
    uint32_t block_size;   /* the event's block_size (valid if has_block_size) */
    uint32_t base_block_idx;
    int32_t group_idx;     /* KV-cache group; -1 when absent or nil */
    uint32_t n_hashes;     /* block_hashes / seq_hashes */
    uint32_t n_tokens;     /* flattened token ids */
    uint64_t parent_hash;  /* normalised (valid if has_parent) */
    const uint64_t *hashes;/* n_hashes normalised hashes */
    const uint32_t *tokens;/* n_tokens token ids (flattened pairs for KVI_TOK_PAIRS) */
    /* Per-block multimodal hashes from extra_keys / block_mm_infos: block i
     * has mm[mm_off[i] .. mm_off[i+1]); mm_off is NULL when no block has any. */
    const uint64_t *mm;
    const uint32_t *mm_off;  /* n_hashes + 1 offsets, or NULL */
    const char *lora_name;   /* not NUL-terminated; NULL / len 0 = base model */
    uint32_t lora_len;
    uint32_t backend_len;
    const char *backend_id;  /* RFC 1527 owner (storage daemon); NULL if absent */
};

/** One decoded batch. */
struct kvi_batch {
    double ts;              /* seconds (ints and float32 accepted) */
    bool has_dp_rank;       /* a non-nil rank element/key was present */
    uint32_t dp_rank;       /* i32 on the wire, reinterpreted as u32 */
    uint32_t n_events;      /* decoded events (unknown types excluded) */
    uint32_t n_unknown;     /* events skipped: unknown tag or event_type */
    uint32_t n_invalid;     /* events skipped: known tag, unusable fields */
    struct kvi_ev *events;
};

/** Why a batch failed (kvi_decoder_error). */
enum kvi_decode_err {
    KVI_DEC_OK = 0,
    KVI_DEC_MSGPACK,     /* not one complete msgpack object / trailing bytes */
    KVI_DEC_SHAPE,       /* batch is not [ts, events, ...] or the map form */
    KVI_DEC_EVENTS,      /* events element is not an array */
    KVI_DEC_LIMIT,       /* nesting or element count over the decoder's limits */
};

struct kvi_decoder;

/**
 * Create a decoder.
 * @return the decoder, or NULL with errno = ENOMEM.
 */
struct kvi_decoder *kvi_decoder_create(void);

/** Free a decoder (and the scratch behind the last batch). */
void kvi_decoder_destroy(struct kvi_decoder *d);

/**
 * Decode one msgpack batch of @p len bytes at @p buf.
 * @param out  filled on success; its pointers follow the ownership rule above
 * @return 0 on success, -EBADMSG when the batch must be dropped as a whole
 *         (reason in kvi_decoder_error / kvi_decoder_error_str).
 */
int kvi_decode_batch(struct kvi_decoder *d, const void *buf, size_t len, struct kvi_batch *out);

/** Reason of the last failed kvi_decode_batch (KVI_DEC_OK after a success). */
enum kvi_decode_err kvi_decoder_error(const struct kvi_decoder *d);

/** Human-readable description of the last failure ("" after a success). */
const char *kvi_decoder_error_str(const struct kvi_decoder *d);

/**
 * Normalise a medium string (case-insensitive) to a tier.
 * @param known  set to false for an unrecognised string (returns gpu)
 */
enum kvi_tier kvi_medium_tier(const char *s, size_t len, bool *known);

#endif
