/*
 * Event ingest: turns decoded KV-event batches (net/decode.h) of one
 * registration into index operations (engine/index.h) and submits them to the
 * writer threads through the calling thread's producer (engine/writer.h).
 * wire-protocol.md §5 ("From event to index operation") is the contract.
 *
 * PER EVENT (dp_rank = the batch's rank when it has one, else the target's)
 *   stored, tokens usable (FLAT or PAIRS, event block_size absent or > 0):
 *       tokens are cut into blocks of the registered block size B (PAIRS:
 *       eagle windows of B + 1 tokens with a stride of B); content hashes use
 *       the seed of the event's lora_name and cache_salt (kvi_hash_seed,
 *       see DECISIONS); a block with
 *       multimodal hashes is hashed with kvi_hash_block_mm. Conversion stops
 *       at the first block-size mismatch (Dynamo's rule): an event block_size
 *       other than B stops at block 0 (nothing is stored), tokens running out
 *       stop at the first block they do not cover. Both are counted and
 *       warned about (at most warn_budget times per target). The converted
 *       prefix is stored under the parent (KVI_OP_STORE) on the event's tier.
 *   stored, no usable tokens (token_ids nil or [], or block_size 0):
 *       KVI_OP_STORE_KNOWN: each engine hash is resolved through what
 *       (instance, dp_rank) already holds on another tier; the writer counts
 *       unresolved hashes in the sink as KVI_OUT_UNKNOWN_BLOCK. The parent is
 *       not needed (the resolved entry already names its prefix).
 *   removed:  KVI_OP_REMOVE of the hashes on the event's tier.
 *   cleared:  KVI_OP_CLEAR_DP_RANK of (instance, dp_rank): every tier of the
 *             rank whose stream carried it; the slots stay, and the
 *             instance's other ranks keep their blocks. vLLM and SGLang run
 *             one scheduler, cache and publisher per data-parallel rank, and
 *             reset_prefix_cache can succeed on one rank and fail on another.
 *             (Dynamo's reference clears every rank of the worker.)
 *   Tiers come from `medium` (external folds into disk inside the engine's
 *   tier walks); an unknown medium is indexed as gpu and counted.
 *
 * DYNAMO ROUTEREVENTS (family KVI_EVF_ROUTER: NATS sources, net/nats_source.h)
 *   A stored event carries its content hashes (`content`, the RouterEvent's
 *   tokens_hash, kvidx's own content hash): stored as they are (KVI_OP_STORE
 *   under the parent), without tokens; a run without a parent whose
 *   start_position is past 0 cannot be placed (no seq hashes) and is counted
 *   invalid. Removed and cleared as above.
 *
 * RFC 1527 EVENTS (family KVI_EVF_RFC1527: Mooncake master, standard publishers)
 *   The hashes are the publisher's rolling sequence hashes and are used as
 *   the blocks' engine hashes. backend_id names a shared storage pool: the
 *   blocks are stored under the instance interned as
 *   kvi_index_intern_instance(ix, 0, backend_id, shared = true), usable by
 *   every instance of the namespace through kvi_index_find_tiered; without
 *   backend_id they belong to the target's instance. The parent is the
 *   previous block's seq hash (parent_hash); an absent base_block_idx with no
 *   parent means position 0.
 *   - with usable tokens: content hashes from the tokens (rules above);
 *     on the gpu tier with a parent, or at position 0, a plain store; else
 *     (position > 0 without a parent, or a lower tier with a parent) a store
 *     whose seq hashes are the event's (trusting that such a publisher
 *     follows the standard): placed by position without a parent, and on a
 *     lower tier also when the rank does not hold the parent (another
 *     backend's block: kvi_index_store_seq); blocks past a token mismatch
 *     are not stored.
 *   - without tokens: KVI_OP_STORE_SEQ_ONLY: the block is the prefix the
 *     index already knows under that seq hash (content queries then match),
 *     otherwise it is placed by seq hash alone (reachable by seq queries and
 *     tier walks only). A lower-tier run whose parent the rank does not hold
 *     is placed at its base_block_idx (kvi_index_store_seq). So a
 *     token-less standard event is always indexed, except on the gpu tier at
 *     a position > 0 without a parent (KVI_OUT_INVALID), and below a parent
 *     the rank does not hold when it is on the gpu tier or has no
 *     base_block_idx (KVI_OUT_PARENT_NOT_FOUND).
 *   - removed: KVI_OP_REMOVE of the seq hashes under the pool (or instance).
 *   - cleared with backend_id: clear that pool (every rank). Without
 *     backend_id: clear the rank (as above) of the target's instance and of
 *     every pool this target has stored into.
 *
 * DECISIONS
 *   - Salts: the seed is kvi_hash_seed(lora_name, cache_salt) — the salt the
 *     decoder surfaces (SGLang's metadata map / a `cache_salt` key), mixed as
 *     Dynamo's shared hashing crate does, so salted blocks only match queries
 *     hashed under the same salt (Mooncake cache_salt / additional_salt).
 *     vLLM's extra_keys salt is not used: vLLM puts it on the first block of
 *     a request only, so continuation events could not carry it, and the
 *     decoder does not surface it. Such requests are indexed unsalted.
 *   - group_idx: one KV-cache group is indexed per target; events without a
 *     group (nil) always are. The indexed group is the group of the first
 *     event whose kv_cache_spec_kind is "full_attention" (case-insensitive),
 *     latched for the target's life; until one is seen (older engines,
 *     single-group models, sliding-window-only models) it is the target's
 *     `group` (0 by default). Stores and removes of other groups (hybrid
 *     models: sliding-window groups share hashes with the full-attention
 *     group) are skipped and counted, so a removal in another group never
 *     erases an indexed block. Clears ignore groups.
 *   - skip_tiers: events on a tier whose bit is set are skipped and counted
 *     (e.g. 1u << KVI_TIER_CPU | ... to index the device tier only, as
 *     Dynamo's 2026-04 listener did). Clears are never skipped.
 *   - Events of a batch keep their order: every op of a batch goes to the
 *     writer of its instance in submission order (bursts of up to
 *     KVI_INGEST_BURST ops).
 *
 * MEMORY
 *   One op per event from kvi_op_alloc, whose ownership passes to the writer
 *   on submit. Nothing else is allocated per event or per block: the op
 *   pointer burst, the seed cache (last adapter and salt) and the pool name
 *   cache live in the target's scratch (kvi_ingest_target_init), which
 *   grows only when a new backend_id appears. The pool cache is searched linearly (a Mooncake
 *   master names a handful of backends; the last hit is tried first).
 *
 * THREADS
 *   A target is used by one thread at a time (its listener thread): ingest,
 *   reset and clear calls on one target must not overlap. Different targets
 *   may be used concurrently, on the same index too. The producer passed in
 *   must belong to the calling thread (engine/writer.h). Counters are written
 *   by that thread with relaxed stores and may be read by any thread with
 *   relaxed loads (approximate). The sink is written by the writers.
 *
 *   | call                     | thread                                   |
 *   |--------------------------|------------------------------------------|
 *   | target_init / _fini      | control plane, no ingest call running    |
 *   | ingest_batch, reset_rank,| the target's current owner thread, with  |
 *   | clear                    | that thread's producer                   |
 *   | reading counters         | any thread (relaxed loads)               |
 */
#ifndef KVI_NET_INGEST_H
#define KVI_NET_INGEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/index.h"
#include "engine/writer.h"
#include "net/decode.h"

/** Ops handed to kvi_producer_submit_burst at a time. */
#define KVI_INGEST_BURST 64

/** Default number of warnings a target prints (Dynamo prints at most 3). */
#define KVI_INGEST_WARN_BUDGET 3

/**
 * Decode-side counters of one registration. Written by the target's thread
 * (relaxed single-writer stores), read by anyone with relaxed loads. The
 * writer-side outcomes (parent not found, unknown blocks, invalid runs) are
 * in the target's struct kvi_op_sink.
 */
struct kvi_ingest_counters {
    _Atomic uint64_t batches;            /* batches ingested */
    _Atomic uint64_t events_stored;      /* stored events seen (all families) */
    _Atomic uint64_t events_removed;     /* removed events seen */
    _Atomic uint64_t events_cleared;     /* cleared events seen */
    _Atomic uint64_t events_rfc1527;     /* of the above, RFC 1527 events */
    _Atomic uint64_t events_unknown;     /* skipped by the decoder: unknown tag (batch n_unknown) */
    _Atomic uint64_t events_invalid;     /* skipped by the decoder (n_invalid) or here (no hashes,
                                            pool intern failure) */
    _Atomic uint64_t placeholders;       /* token-less stores sent as STORE_KNOWN */
    _Atomic uint64_t seq_only;           /* token-less RFC 1527 stores (STORE_SEQ_ONLY) */
    _Atomic uint64_t block_size_mismatch;/* stores whose block_size differs from the registered one */
    _Atomic uint64_t tokens_short;       /* stores whose tokens ran out before their hashes */
    _Atomic uint64_t blocks_dropped;     /* hashes not stored because of the two above */
    _Atomic uint64_t blocks_submitted;   /* blocks / hashes in submitted store ops */
    _Atomic uint64_t hashes_remove_submitted; /* hashes in submitted remove ops */
    _Atomic uint64_t unknown_medium;     /* events whose medium was not recognised (indexed as gpu) */
    _Atomic uint64_t group_skipped;      /* events of another KV-cache group, skipped */
    _Atomic uint64_t tier_skipped;       /* events on a tier in skip_tiers, skipped */
    _Atomic uint64_t ops_submitted;      /* ops handed to the writers */
};

struct kvi_ingest_scratch; /* private, per target */

/**
 * Where a mirrored op sits in its owner's stream (MIRROR below). The owner
 * sets seq and tag (and idx for a reset) before each call; ingest sets idx
 * for the ops of a batch and `reset`.
 */
struct kvi_ingest_mirror_pos {
    uint64_t seq;  /* the batch's seq; a reset: the seq being handled when it happened */
    uint32_t idx;  /* a batch: the op's index among the batch's mirrored ops (0-based);
                      a reset: the owner's count of resets at this seq */
    bool reset;    /* the op is a rank reset (kvi_ingest_reset_rank), not a batch's */
    uint64_t tag;  /* a batch: a hash of its payload bytes (tells an engine's incarnations apart) */
};

/**
 * MIRROR: called for every op on the target's own instance (never a shared
 * pool's) just before it is queued, on the target's thread; @p op is valid
 * only during the call and must not be changed. After the last op of a
 * batch that mirrored any, it is called once more with @p op NULL (the
 * batch is complete). It must not block (the listener's hot path): copy
 * what it needs and return.
 */
typedef void (*kvi_ingest_mirror_fn)(void *ctx, const struct kvi_op *op, const struct kvi_ingest_mirror_pos *pos);

/**
 * One registration's view of the index. Owned by the caller; fill the public
 * fields, then call kvi_ingest_target_init. Public fields may be changed
 * between calls by the owner thread (not while a call runs).
 */
struct kvi_ingest_target {
    struct kvi_index *ix;             /* the namespace's index */
    uint32_t instance;                /* dense id (kvi_index_intern_instance) */
    uint32_t dp_rank;                 /* registered rank: used when the batch has none */
    uint32_t block_size;              /* registered block size; 0 = the index's */
    int32_t group;                    /* KV-cache group indexed until a full_attention
                                         event names one (0 by default; DECISIONS) */
    uint32_t skip_tiers;              /* bit (1u << tier): skip events on that tier */
    uint32_t warn_budget;             /* warnings still to print; init sets
                                         KVI_INGEST_WARN_BUDGET when 0 */
    const char *name;                 /* for warnings (e.g. "instance 7 rank 0"); may be NULL */
    struct kvi_op_sink *sink;         /* writer-side outcome counters (may be NULL) */
    struct kvi_ingest_counters *ctr;  /* decode-side counters (may be NULL) */
    /* Applied position (engine/writer.h, struct kvi_op_sink), with sink set:
     * while pub_applied is true, every op on the target's own instance
     * (never a shared pool's: those may go to another writer) is submitted
     * with pub_applied and applied1, and kvi_ingest_batch gives the last
     * such op of its batch still parked at the end applied1_end instead.
     * A listener sets applied1 = W + 1 before the batch (0 = W unset) and
     * applied1_end = the batch's seq + 1, so the sink names the last batch
     * whose ops on the writer are all applied (a batch of more than
     * KVI_INGEST_BURST ops whose tail is on pools only is named one batch
     * late; a batch with no such op names nothing: both err on the side of
     * an older position). */
    bool pub_applied;
    uint64_t applied1;
    uint64_t applied1_end;
    kvi_ingest_mirror_fn mirror;      /* MIRROR hook, or NULL */
    void *mirror_ctx;
    struct kvi_ingest_mirror_pos mirror_pos; /* owner: seq, tag (and idx before a reset) */
    struct kvi_ingest_scratch *_s;    /* private: set by init */
};

/**
 * Prepare @p t for ingest (allocates its scratch). Control plane.
 * @return 0, -EINVAL (ix NULL, or block_size set and different from the
 *         index's), -ENOMEM.
 */
int kvi_ingest_target_init(struct kvi_ingest_target *t);

/**
 * Free @p t's scratch. Ops already submitted keep pointing at t->sink: flush
 * the producer(s) first if the sink is freed with the target. Safe on a
 * target whose init failed or that was zero-initialised.
 */
void kvi_ingest_target_fini(struct kvi_ingest_target *t);

/**
 * Turn one decoded batch into engine ops and submit them through @p p
 * (the calling thread's producer); returns once they are queued (call
 * kvi_producer_flush to wait until they are applied). One thread at a time
 * per target.
 * @return the number of ops submitted (0 for a batch with nothing to apply).
 */
size_t kvi_ingest_batch(struct kvi_ingest_target *t, const struct kvi_batch *b, struct kvi_producer *p);

/**
 * Drop one dp rank's blocks of the target's instance on every tier and
 * forget its slots (publisher restart: wire-protocol.md §6.3), and the same
 * rank of every shared pool this target has stored into (the publisher's
 * pool state is gone with it). Queued through @p p after everything @p p
 * submitted before. One thread at a time per target.
 */
void kvi_ingest_reset_rank(struct kvi_ingest_target *t, uint32_t dp_rank, struct kvi_producer *p);

/**
 * Drop every block of the target's instance on every rank and tier (the
 * slots stay; an operator's clear, wider than an engine's AllBlocksCleared,
 * which is one rank's) and of every shared pool this
 * target has stored into. Queued through @p p. One thread at a time per
 * target.
 */
void kvi_ingest_clear(struct kvi_ingest_target *t, struct kvi_producer *p);

#endif
