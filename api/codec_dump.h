/*
 * GET /dump codec (http-api.md §1.11, §1.16): an incremental encoder of the
 * dump body from kvi_dump_block records, and a streaming decoder of a peer's
 * dump body into block records for P2P recovery.
 *
 * THE BODY
 *   {"<model>:<tenant>": {"block_size": N, "events": [RouterEvent, ...]},
 *    "<model>:<tenant>": {"error": "..."}, ...}
 *   kvidx emits one single-block Stored event per held block, parents before
 *   children, event_id renumbered from 0 per namespace:
 *   {"worker_id":1,"storage_tier":"device",
 *    "event":{"event_id":0,"dp_rank":0,
 *             "data":{"stored":{"parent_hash":null,"start_position":0,
 *                               "blocks":[{"block_hash":B,"tokens_hash":C,
 *                                          "mm_extra_info":null,"seq_hash":S}]}}}}
 *   block_hash is the engine hash, tokens_hash the kvidx content hash,
 *   parent_hash the same (instance, dp_rank)'s engine hash of the parent (null
 *   for a root), start_position the block's depth. storage_tier is device,
 *   host_pinned, disk or external. All hashes print as exact u64 integers.
 *   kvidx extensions a Dynamo peer ignores (serde skips unknown fields):
 *   "seq_hash" (the standard rolling hash of the prefix, needed to replay a
 *   lower-tier block placed by position), "no_content":true on a block placed
 *   by seq hash without tokens (its tokens_hash is then 0 and meaningless;
 *   replay it with kvi_index_store_seq_only), and a string "worker_id" for an
 *   instance registered by name (Conductor); a Dynamo peer cannot parse the
 *   last one, so dump Conductor namespaces only to kvidx peers.
 *   Watermarks (kvidx extension, after "events"; a Dynamo peer skips the
 *   key): "watermarks":[{"worker_id":1,"dp_rank":0,"seq":41},...], one per
 *   registration (worker_id a string for a named instance) whose applied
 *   position is set: seq is the last batch of that (worker, dp_rank)'s event
 *   stream all of whose ops are in the dumped blocks, read on the writer
 *   right before its partition was dumped (net/listener.h
 *   kvi_listeners_applied). A replica recovering from the dump seeds its
 *   listener's W with it (http-api.md §1.16). The key is left out when the
 *   namespace has no such registration.
 *
 * ENCODER: the caller opens the body, then per namespace ns_begin, blocks
 *   (directly or as the kvi_dump_fn of kvi_index_dump_partition), ns_end;
 *   then end. Output accumulates in enc->out; with a sink, it is handed over
 *   whenever it reaches flush_at bytes (and at end), so a dump of any size
 *   streams in bounded memory. Without a sink the caller drains enc->out
 *   itself (kvi_buf_reset after sending it).
 *
 * DECODER: feed the body in chunks of any size; it calls back once per
 *   namespace (when its block_size is known) and once per record, in body
 *   order. Memory is bounded by the largest single event (or watermarks
 *   array), not the dump
 *   (events that precede their namespace's "block_size" are held until it
 *   arrives). Unknown keys are skipped; the Dynamo reference's recovery
 *   rule holds: a namespace without both block_size and events, or with an
 *   "error", fails the whole body (-EBADMSG), and the caller moves on to the
 *   next peer (records already handed out then belong to a failed attempt).
 *
 * THREAD-SAFETY: an encoder or decoder is used by one thread at a time. The
 *   encoder's kvi_dump_emit may run on a partition's writer thread (it calls
 *   kvi_index_instance_info, which any thread may call).
 */
#ifndef KVI_API_CODEC_DUMP_H
#define KVI_API_CODEC_DUMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/body.h"
#include "engine/index.h"
#include "engine/common.h"

/* ---- encoder ------------------------------------------------------------------ */

/** Public identity of a worker: a u64 id, or a name (Conductor). */
struct kvi_dump_worker {
    uint64_t id;
    const char *name; /* NUL-terminated, or NULL for a numeric id */
};

/**
 * Receives encoded bytes. @return 0, or a negative errno that stops the
 * encoding (reported by kvi_dump_enc_end).
 */
typedef int (*kvi_dump_sink_fn)(void *ctx, const char *data, size_t len);

struct kvi_dump_enc {
    struct kvi_buf out;     /* encoded bytes not yet handed to the sink */
    uint64_t events;        /* events written in the current namespace */
    int err;                /* 0, -ENOMEM or the sink's error (sticky) */
    kvi_dump_sink_fn _sink;
    void *_sink_ctx;
    size_t _flush_at;
    struct kvi_index *_ix;
    bool _first_ns;
    bool _in_ns;
    bool _have_cache;
    uint32_t _cache_inst;
    struct kvi_dump_worker _cache_worker;
    struct kvi_buf _wm;     /* the current namespace's watermark entries */
};

/**
 * Initialise an encoder.
 * @param sink      NULL: the caller drains enc->out
 * @param flush_at  hand bytes to the sink once this many are buffered (0 = 64 KiB)
 */
void kvi_dump_enc_init(struct kvi_dump_enc *enc, kvi_dump_sink_fn sink, void *sink_ctx,
                       size_t flush_at);
/** Free the encoder's buffer. */
void kvi_dump_enc_free(struct kvi_dump_enc *enc);
/** Write the opening '{'. */
void kvi_dump_enc_begin(struct kvi_dump_enc *enc);
/**
 * Open namespace "<model>:<tenant>" with its block size; events restart at 0.
 * @param ix  index used by kvi_dump_emit to turn dense instance ids into
 *            public ones (may be NULL when only kvi_dump_enc_block is used)
 */
void kvi_dump_enc_ns_begin(struct kvi_dump_enc *enc, struct kvi_str model, struct kvi_str tenant,
                           uint32_t block_size, struct kvi_index *ix);
/** Write one block as a single-block Stored event for worker @p w. */
void kvi_dump_enc_block(struct kvi_dump_enc *enc, const struct kvi_dump_block *b,
                        const struct kvi_dump_worker *w);
/**
 * kvi_dump_fn adapter: @p ctx is the encoder; the worker is resolved through
 * the namespace's index (kvi_index_instance_info). A dense id the index does
 * not know is skipped.
 */
void kvi_dump_emit(void *ctx, const struct kvi_dump_block *b);
/**
 * Add a watermark entry to the current namespace (written by ns_end after
 * its events). Same thread rules as kvi_dump_enc_block (a partition's writer
 * may call it, in the `pre` hook of kvi_producer_dump_partition_pre).
 */
void kvi_dump_enc_watermark(struct kvi_dump_enc *enc, const struct kvi_dump_worker *w, uint32_t dp_rank,
                            uint64_t seq);
/** Close the current namespace (its watermarks, if any, then '}'). */
void kvi_dump_enc_ns_end(struct kvi_dump_enc *enc);
/** Write namespace "<model>:<tenant>" as {"error":"<msg>"} (no ns_begin). */
void kvi_dump_enc_ns_error(struct kvi_dump_enc *enc, struct kvi_str model, struct kvi_str tenant,
                           const char *msg);
/**
 * Write the closing '}' and hand everything left to the sink.
 * @return 0, -ENOMEM or the sink's error.
 */
int kvi_dump_enc_end(struct kvi_dump_enc *enc);

/* ---- decoder ------------------------------------------------------------------ */

enum kvi_dump_op {
    KVI_DUMP_STORED = 0,  /* one block (multi-block events are split) */
    KVI_DUMP_REMOVED = 1, /* one engine hash removed */
    KVI_DUMP_CLEARED = 2, /* every block of (worker, dp_rank) */
};

/** One decoded record. Strings are valid during the callback only. */
struct kvi_dump_rec {
    enum kvi_dump_op op;
    enum kvi_tier tier;
    struct kvi_str model;
    struct kvi_str tenant;
    uint32_t block_size;
    bool worker_named;         /* worker_name set instead of worker_id */
    uint64_t worker_id;
    struct kvi_str worker_name;
    uint32_t dp_rank;
    uint64_t event_id;
    bool has_parent;           /* STORED: parent_hash names the parent */
    uint64_t parent_hash;      /* engine hash of the parent */
    uint64_t engine_hash;      /* STORED / REMOVED: the block's engine hash */
    uint64_t content_hash;     /* STORED: tokens_hash */
    bool has_position;         /* STORED: start_position was given */
    uint32_t position;
    bool has_seq;              /* STORED: seq_hash extension present */
    uint64_t seq_hash;
    bool no_content;           /* STORED: content unknown (placed by seq without tokens) */
};

/** One decoded watermark entry. Strings are valid during the callback only. */
struct kvi_dump_wm {
    struct kvi_str model;
    struct kvi_str tenant;
    bool worker_named;         /* worker_name set instead of worker_id */
    uint64_t worker_id;
    struct kvi_str worker_name;
    uint32_t dp_rank;
    uint64_t seq;
};

struct kvi_dump_dec_cb {
    /** A namespace starts (block size known). Nonzero stops decoding. May be NULL. */
    int (*ns)(void *ctx, struct kvi_str model, struct kvi_str tenant, uint32_t block_size);
    /** One record. Nonzero stops decoding (returned by feed/finish). */
    int (*rec)(void *ctx, const struct kvi_dump_rec *r);
    void *ctx;
    /**
     * One watermark entry of the namespace being decoded (may be NULL), in
     * body order; a "watermarks" value that is not an array of objects with
     * worker_id, dp_rank (null = 0) and seq fails the body (-EBADMSG), and
     * the whole array is parsed before the first call. Nonzero stops
     * decoding.
     */
    int (*wm)(void *ctx, const struct kvi_dump_wm *w);
};

struct kvi_dump_dec;

/** Free a decoder. */
void kvi_dump_dec_destroy(struct kvi_dump_dec *d);

/**
 * Create a decoder.
 * @return the decoder, or NULL with errno = ENOMEM.
 */
KVI_DEALLOC(kvi_dump_dec_destroy, 1) KVI_WARN_UNUSED
struct kvi_dump_dec *kvi_dump_dec_create(const struct kvi_dump_dec_cb *cb);
/**
 * Feed the next @p len bytes of the body.
 * @return 0, -EBADMSG (malformed or rejected dump: kvi_dump_dec_error says
 *         why), -ENOMEM, or a callback's nonzero value. Errors are sticky.
 */
int kvi_dump_dec_feed(struct kvi_dump_dec *d, const void *data, size_t len);
/** The body ended. @return 0 when it was complete, else as kvi_dump_dec_feed. */
int kvi_dump_dec_finish(struct kvi_dump_dec *d);
/** Why the last call failed ("" when it did not). */
const char *kvi_dump_dec_error(const struct kvi_dump_dec *d);

/** Dynamo storage_tier name of a tier ("device", "host_pinned", "disk", "external"). */
const char *kvi_dump_tier_name(enum kvi_tier t);

#endif
