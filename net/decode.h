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
 * WHAT FAILS THE WHOLE BATCH (kvi_decode_batch returns an error, nothing is
 * applied, the caller must not advance its watermark):
 *   - KVI_DEC_MSGPACK: the frame is not exactly one well-formed msgpack
 *     object: empty, truncated anywhere (including a length or element
 *     count larger than the bytes left), a 0xc1 byte, or trailing bytes.
 *     Every byte is checked, also inside keys and elements kvidx ignores.
 *   - KVI_DEC_SHAPE: the batch is neither an array of >= 2 elements nor a
 *     map with an `events` key (exactly one); ts is not a number (float64,
 *     float32 or int); the rank is not nil or an int in [-2^31, 2^32).
 *   - KVI_DEC_EVENTS: the events element is not an array (nil included).
 *   - KVI_DEC_LIMIT: the frame exceeds KVI_DECODE_MAX_FRAME bytes, or a
 *     container is nested deeper than KVI_DECODE_MAX_DEPTH (the batch is at
 *     depth 1).
 *   - KVI_DEC_NOMEM: scratch could not grow (returns -ENOMEM).
 *
 * WHAT SKIPS ONE EVENT (the batch is kept; counted in n_unknown/n_invalid):
 *   - n_unknown: the tag is a string naming no known event: not
 *     BlockStored/BlockRemoved/AllBlocksCleared or stored/removed/cleared in
 *     any letter case (e.g. BlockInactive, Dynamo's Ignored).
 *   - n_invalid: the event is not an array or a map; an array event whose
 *     element 0 is not a string (or that is empty); a map event with no
 *     string `type` / `event_type`; a stored or removed event without an
 *     array of hashes; or a field kvidx reads with an unusable value:
 *       hashes / parent       not an int or bin (parent may be nil);
 *       token_ids             not nil or an array of ints in [0, 2^32) or
 *                             of [int, int] pairs (mixed forms are invalid);
 *       block_size,
 *       base_block_idx        not nil or an int in [0, 2^32);
 *       group_idx             not nil or an int in [0, 2^31);
 *       medium, lora_name,
 *       backend_id, object_key,
 *       cache_salt,
 *       kv_cache_spec_kind    not nil or a string (array position 7 may
 *                             also be the SGLang metadata map);
 *       extra_keys            not nil or an array of nil / arrays;
 *       block_mm_infos        not nil or an array of nil / BlockExtraInfo
 *                             ({"mm_objects": [...]} or [[...]]) whose
 *                             objects carry an int mm_hash.
 *     Fields kvidx does not read (lora_id, locality, session_id,
 *     kv_cache_spec_sliding_window, unknown keys, extra trailing array
 *     elements) may hold anything well-formed.
 *
 * FIELD RULES
 *   - Batch: elements after the third are ignored; a nil or missing rank
 *     leaves has_dp_rank false. Map form: a missing ts is 0, other keys are
 *     ignored.
 *   - Every event reports each known field it carried, whatever its type
 *     (a cleared event may carry a medium); fields absent keep the defaults
 *     (tier gpu, group_idx -1, has_* false, NULL strings).
 *   - Tags are matched case-insensitively. A map event is KVI_EVF_RFC1527
 *     when it has an `event_type` or `seq_hashes` key or its tag is the
 *     short form (stored / removed / cleared); `event_type` wins over
 *     `type`. Keys are matched exactly (case-sensitive), in any order;
 *     non-string keys are ignored; a repeated key's last value wins.
 *   - Hashes: ints of any width (negative = 64-bit two's complement); a bin
 *     of n bytes is int.from_bytes(bytes, "big") mod 2^64, i.e. its last
 *     min(n, 8) bytes big-endian, zero-extended (32- and 16-byte digests
 *     give their last 8 bytes, shorter bins their value, an empty bin 0).
 *   - token_ids: ints of any wire width whose value fits u32. Pairs
 *     [[a0,b0],...,[ak,bk]] flatten to a0..ak, bk (KVI_TOK_PAIRS).
 *   - Tagged arrays: BlockStored positions 1 hashes, 2 parent, 3 tokens,
 *     4 block_size, 5 lora_id (ignored), 6 medium, 7 lora_name or SGLang
 *     metadata map (cache_salt taken), 8 extra_keys, 9 group_idx (int/nil)
 *     or Dynamo block_mm_infos (array), 10 kv_cache_spec_kind; BlockRemoved
 *     1 hashes, 2 medium, 3 group_idx. Missing trailing elements are nil,
 *     extra elements are ignored.
 *   - Multimodal (stored events only): block_mm_infos, when given and not
 *     nil, wins over extra_keys (Dynamo's rule). From extra_keys, an item
 *     that is a 64-hex-digit string, or a [64-hex string, int] pair, gives
 *     the mm hash = its first 16 hex digits; other items are ignored. mm
 *     hashes are in wire order per block; entries past the last block are
 *     ignored, missing entries mean none; mm_off is NULL when no block has
 *     one.
 *   - Arrays that were present (even empty) have non-NULL pointers; absent
 *     token_ids (missing or nil) give tokens == NULL.
 *
 * Ownership: a decoder owns scratch memory reused from batch to batch
 * (kvi_decoder_trim gives back what a large batch grew). The
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
#include "engine/common.h"

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
    KVI_EVF_ROUTER = 3,  /* a Dynamo RouterEvent (net/decode_router.h, built by net/nats_source.c) */
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
    /* n_hashes content hashes given by the publisher (a Dynamo RouterEvent's
     * tokens_hash), or NULL: the ZMQ decoder never sets it */
    const uint64_t *content;
    /* Per-block multimodal hashes from extra_keys / block_mm_infos: block i
     * has mm[mm_off[i] .. mm_off[i+1]); mm_off is NULL when no block has any. */
    const uint64_t *mm;
    const uint32_t *mm_off;  /* n_hashes + 1 offsets, or NULL */
    const char *lora_name;   /* not NUL-terminated; NULL / len 0 = base model */
    uint32_t lora_len;
    uint32_t backend_len;
    const char *backend_id;  /* RFC 1527 owner (storage daemon); NULL if absent */
    /* Added by the decoder (strings not NUL-terminated, NULL when absent or nil): */
    const char *cache_salt;  /* SGLang position-7 metadata map / `cache_salt` key */
    uint32_t salt_len;
    uint32_t spec_kind_len;
    const char *spec_kind;   /* kv_cache_spec_kind, e.g. "full_attention" */
    const char *object_key;  /* RFC 1527 Mooncake object key */
    uint32_t object_key_len;
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
    KVI_DEC_LIMIT,       /* frame size or nesting depth over the decoder's limits */
    KVI_DEC_NOMEM,       /* scratch allocation failed (kvi_decode_batch returns -ENOMEM) */
};

/** Largest frame kvi_decode_batch accepts (KVI_DEC_LIMIT above). Scratch is
 * bounded by about 19 bytes per frame byte (168 per 9-byte ["cleared"] event,
 * 8 per one-byte hash), so this bounds memory too; kvi_decoder_trim gives it
 * back after a large batch. */
#define KVI_DECODE_MAX_FRAME ((size_t)64 << 20)

/** Scratch a decoder keeps across kvi_decoder_trim, in bytes. Batches of real
 * engines need far less (about 100 KB for 700 blocks of 16 tokens). */
#define KVI_DECODE_KEEP_SCRATCH ((size_t)4 << 20)

/** Deepest container nesting accepted; the batch itself is at depth 1
 * (msgpack-c's own parser stack is also 32 deep). */
#define KVI_DECODE_MAX_DEPTH 32

struct kvi_decoder;

/** Free a decoder (and the scratch behind the last batch). */
void kvi_decoder_destroy(struct kvi_decoder *d);

/**
 * Create a decoder.
 * @return the decoder, or NULL with errno = ENOMEM.
 */
KVI_DEALLOC(kvi_decoder_destroy, 1) KVI_WARN_UNUSED struct kvi_decoder *kvi_decoder_create(void);

/**
 * Decode one msgpack batch of @p len bytes at @p buf (single-threaded per
 * decoder). Reads nothing outside [buf, buf + len); no alignment needed.
 * @param out  filled on success; its pointers follow the ownership rule
 *             above. Zeroed on failure.
 * @return 0 on success (possibly with skipped events counted in
 *         out->n_unknown / n_invalid); -EBADMSG when the batch must be
 *         dropped as a whole (reason in kvi_decoder_error /
 *         kvi_decoder_error_str); -ENOMEM when scratch could not grow
 *         (KVI_DEC_NOMEM; the decoder stays usable).
 */
int kvi_decode_batch(struct kvi_decoder *d, const void *buf, size_t len, struct kvi_batch *out);

/**
 * Give back the scratch a large batch grew: when it holds more than
 * KVI_DECODE_KEEP_SCRATCH bytes, every array shrinks to its initial size.
 * Scratch can reach about 19 times the frame size (KVI_DECODE_MAX_FRAME), and
 * is otherwise kept for the decoder's lifetime, so call this once the last
 * batch's events have been consumed: it invalidates them. Cheap when there
 * is nothing to give back; a failed shrink keeps the larger block.
 */
void kvi_decoder_trim(struct kvi_decoder *d);

/** Reason of the last failed kvi_decode_batch (KVI_DEC_OK after a success). */
enum kvi_decode_err kvi_decoder_error(const struct kvi_decoder *d);

/** Human-readable description of the last failure ("" after a success). */
const char *kvi_decoder_error_str(const struct kvi_decoder *d);

/**
 * Normalise a medium string (case-insensitive; wire-protocol.md §4.4) to a
 * tier: NULL (nil / absent), GPU, DEVICE -> gpu; CPU, CPU_PINNED, CPU_TIER1
 * -> cpu; STORAGE, DISK, NVME, CPU_TIER2 -> disk; EXTERNAL, NETWORK, REMOTE,
 * SHARED -> external (the engine folds external into disk for cumulative
 * walks). Thread-safe, no allocation.
 * @param s      the string (not NUL-terminated), or NULL for nil
 * @param known  may be NULL; set to false for an unrecognised string,
 *               the empty string included (returns gpu), else true
 */
enum kvi_tier kvi_medium_tier(const char *s, size_t len, bool *known);

#endif
