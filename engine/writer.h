/*
 * Writer threads: per-core threads that own one partition of every index and
 * apply KV events to it, fed by single-producer/single-consumer burst rings.
 *
 * Every producer thread (a ZMQ listener, an HTTP loop, a benchmark driver)
 * creates its own kvi_producer, which owns one ring per writer, so no ring
 * ever has two producers or two consumers. An op for instance i of index ix
 * goes to writer kvi_index_partition_of(ix, i) (sticky routing): all events
 * of one worker are applied in order by one writer. Indexes used with a pool
 * must have n_parts == the pool's writer count.
 *
 * Backpressure: kvi_producer_submit never drops an op; when the target ring
 * is full it wakes the writer and waits (spinning briefly, then sleeping on a
 * futex until the writer has emptied half the ring, 1 ms at most per sleep),
 * counting the stall.
 *
 * Writers poll their empty rings for 20 us, then sleep on a futex; producers wake a writer
 * only when they see it asleep. Each writer binds itself to its own jemalloc
 * arena, so all index memory of its partitions lives there, and reclaims
 * retired memory (after one RCU grace period for all its indexes) when it
 * goes idle, at most once per millisecond.
 *
 *   | call                       | thread                                   |
 *   |----------------------------|------------------------------------------|
 *   | pool_create / pool_destroy | control plane (destroy after producers)  |
 *   | producer_create / _destroy | the producer's own thread or control     |
 *   | op_alloc, submit, flush    | the producer's owning thread only        |
 *   | call, dump, dump_partition | any thread that owns a producer          |
 *   | pool_stats                 | any thread (approximate)                 |
 */
#ifndef KVI_ENGINE_WRITER_H
#define KVI_ENGINE_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/index.h"
#include "engine/common.h"

#define KVI_WRITER_MAX 64
#define KVI_PRODUCER_MAX 1024

enum kvi_op_type {
    KVI_OP_STORE,            /* kvi_index_store (or store_seq when seq != NULL) */
    KVI_OP_REMOVE,           /* kvi_index_remove of hashes[0..n) */
    KVI_OP_CLEAR,            /* kvi_index_clear */
    KVI_OP_REMOVE_DP_RANK,   /* kvi_index_remove_dp_rank */
    KVI_OP_REMOVE_INSTANCE,  /* kvi_index_remove_instance */
    KVI_OP_CALL,             /* run fn(arg) on the writer thread */
    KVI_OP_STORE_KNOWN,      /* kvi_index_store_known of hashes[0..n) (engine hashes) */
    KVI_OP_STORE_SEQ_ONLY,   /* kvi_index_store_seq_only: blocks[i].engine_hash + seq[i];
                              * parent / position as STORE with seq (content_hash unused;
                              * allocate with kvi_op_alloc(n, true); seq NULL: INVALID) */
    KVI_OP_CLEAR_DP_RANK,    /* kvi_index_clear_dp_rank */
};

/**
 * Outcome of an applied op, reported through the pool's counters and the op's
 * sink. Every op counts once under exactly one of APPLIED, PARENT_NOT_FOUND
 * and INVALID; UNKNOWN_BLOCK counts hashes, not ops.
 */
enum kvi_op_outcome {
    KVI_OUT_APPLIED,          /* the op was applied (STORE_KNOWN always is, even partly) */
    KVI_OUT_PARENT_NOT_FOUND, /* a store rejected with -ENOENT */
    KVI_OUT_INVALID,          /* a store rejected with -EINVAL, or an unknown op type */
    KVI_OUT_UNKNOWN_BLOCK,    /* STORE_KNOWN hashes that resolved to nothing, per hash */
    KVI_OUT_COUNT,
};

/**
 * Where a writer reports the outcomes of the ops that point at it (a listener's
 * counters, say). The writer adds with relaxed atomics; readers load relaxed
 * (kvi_op_sink_read). Owned by the submitter (zero it before use); must
 * outlive every op that points at it (flush first). Several producers and
 * writers may share one sink. After kvi_producer_flush returns, the sink
 * includes every op that producer submitted.
 *
 * For each applied op with op->sink set, the writer adds:
 *   outcomes[o]        1, o = the op's outcome (APPLIED, PARENT_NOT_FOUND or
 *                      INVALID), for every op type (CALL and clears included);
 *   outcomes[UNKNOWN_BLOCK]  STORE_KNOWN: the hashes that resolved to nothing;
 *   blocks_stored      STORE, STORE_SEQ_ONLY: n when the outcome is APPLIED
 *                      (0 when rejected); STORE_KNOWN: the blocks now held on
 *                      the op's tier from the run (kvi_index_store_known's
 *                      return); other ops: 0;
 *   hashes_removed     REMOVE: the hashes the slot knew (kvi_index_remove's
 *                      return; cascaded descendants are not counted); other
 *                      ops: 0.
 * (The writer's own kvi_writer_stats count differently: blocks and hashes of
 * every store and remove op, whatever its outcome.)
 *
 * Applied position (the source's watermark as the index sees it): after
 * applying an op with pub_applied set (whatever its outcome), the writer
 * stores op->applied1 into applied1 (release; read with kvi_op_sink_applied).
 * The submitter chooses the value; a listener uses seq + 1 of the last batch
 * of its stream all of whose ops on that writer are applied once this op is
 * (0 = none), and sets pub_applied only on ops that go to one writer (its
 * own instance's), so that the value is a property of that writer's
 * partition. Because one writer applies one source's ops in submission order
 * and a partition dump (kvi_producer_dump_partition_pre) runs on the
 * partition's writer between two ops, applied1 read in the dump's `pre`
 * hook names exactly the last batch whose ops are in the dumped blocks.
 */
struct kvi_op_sink {
    uint64_t outcomes[KVI_OUT_COUNT]; /* ops by outcome (UNKNOWN_BLOCK: hashes) */
    uint64_t blocks_stored;           /* blocks in applied store ops */
    uint64_t hashes_removed;          /* hashes known to removes */
    uint64_t applied1;                /* the last pub_applied op's applied1 (0 until one) */
};

/**
 * One event for a writer. Allocate with kvi_op_alloc; ownership passes to the
 * writer on submit, and the writer frees it after applying it.
 */
struct kvi_op {
    uint8_t type;        /* enum kvi_op_type */
    uint8_t tier;        /* enum kvi_tier */
    bool has_parent;
    bool pub_applied;    /* with sink: publish applied1 into sink->applied1 (below) */
    uint32_t n;          /* blocks (STORE, STORE_SEQ_ONLY) or hashes (REMOVE, STORE_KNOWN) */
    struct kvi_index *ix;
    uint32_t instance;
    uint32_t dp_rank;
    uint64_t parent_engine_hash;
    uint32_t position;   /* STORE with seq, STORE_SEQ_ONLY: without a parent */
    uint32_t _pad2;
    uint64_t enq_ns;     /* set by submit: for writer lag */
    void (*fn)(void *arg, uint32_t writer); /* CALL */
    void *arg;
    uint64_t *seq;       /* STORE: standard seq hashes, or NULL; STORE_SEQ_ONLY: required */
    struct kvi_op_sink *sink; /* optional: outcome counters of this op's source */
    uint64_t applied1;   /* with pub_applied: the source's applied position (see kvi_op_sink) */
    union {
        struct kvi_block blocks[0]; /* STORE, STORE_SEQ_ONLY */
        uint64_t hashes[0];         /* REMOVE, STORE_KNOWN */
    };
};

struct kvi_writer_pool;
struct kvi_producer;

/** Per-writer counters. */
struct kvi_writer_stats {
    uint64_t ops;                       /* ops applied */
    uint64_t outcomes[KVI_OUT_COUNT];   /* ops by outcome (UNKNOWN_BLOCK: hashes) */
    uint64_t blocks_stored;             /* n of every store op applied (any type or outcome) */
    uint64_t hashes_removed;            /* n of every remove op applied */
    uint64_t queued;                    /* ops submitted but not applied yet */
    uint64_t max_lag_ns;                /* largest submit -> apply delay seen */
    uint64_t last_lag_ns;
    uint64_t sleeps;                    /* times the writer went to sleep */
    uint64_t stalls;                    /* submits that found the ring full */
    uint64_t busy_ns;                   /* time spent applying ops */
    uint64_t idle_reclaims;             /* idle reclaims that waited for a grace period
                                         * (at most one per millisecond) */
};

/**
 * Stop the writers after they drain every ring, and free the pool. Every
 * producer must have been destroyed first.
 */
void kvi_writer_pool_destroy(struct kvi_writer_pool *pool);

/**
 * Start @p n_writers writer threads (1..KVI_WRITER_MAX), each with its own
 * arena. @param ring_capacity  ops per (producer, writer) ring (power of two
 * rounding; 0 = 4096; at most KVI_RING_MAX_CAPACITY).
 * @return the pool, or NULL with errno (EINVAL for a bad count or capacity,
 *         ENOMEM, or a pthread error).
 */
KVI_DEALLOC(kvi_writer_pool_destroy, 1) KVI_WARN_UNUSED
struct kvi_writer_pool *kvi_writer_pool_create(uint32_t n_writers, uint32_t ring_capacity);

/** Number of writer threads. */
uint32_t kvi_writer_pool_size(const struct kvi_writer_pool *pool);

/** Flush and destroy a producer. Owning thread only. */
void kvi_producer_destroy(struct kvi_producer *p);

/**
 * Create a producer (one ring per writer) for the calling thread.
 * @return the producer or NULL with errno (ENOSPC past KVI_PRODUCER_MAX, ENOMEM).
 */
KVI_DEALLOC(kvi_producer_destroy, 1) KVI_WARN_UNUSED
struct kvi_producer *kvi_producer_create(struct kvi_writer_pool *pool);

/**
 * Allocate an op with room for @p n blocks (STORE, STORE_SEQ_ONLY) or hashes
 * (REMOVE, STORE_KNOWN: the union is sized for blocks, so either fits),
 * zeroed header (sink NULL). Aborts on out-of-memory (control of memory is
 * the caller's job).
 * @param with_seq  also allocate room for n seq hashes (op->seq): STORE with
 *                  seq hashes and STORE_SEQ_ONLY
 */
struct kvi_op *kvi_op_alloc(uint32_t n, bool with_seq);

/** Free an op that was never submitted. */
void kvi_op_free(struct kvi_op *op);

/**
 * Submit an op to the writer owning its instance (owning thread only).
 * Never drops: waits for room when the ring is full. Takes ownership of op.
 */
void kvi_producer_submit(struct kvi_producer *p, struct kvi_op *op);

/**
 * Submit a burst of ops (owning thread only): same as calling submit for each
 * in order, with one ring operation per writer run. Takes ownership.
 */
void kvi_producer_submit_burst(struct kvi_producer *p, struct kvi_op **ops, size_t n);

/**
 * Wait until every op this producer submitted has been applied (owning
 * thread only).
 */
void kvi_producer_flush(struct kvi_producer *p);

/**
 * Run @p fn(arg, writer) on writer @p writer after everything this producer
 * submitted before, and wait for it to finish (owning thread only).
 */
void kvi_producer_call(struct kvi_producer *p, uint32_t writer, void (*fn)(void *arg, uint32_t writer), void *arg);

/**
 * Dump index @p ix through the writers: each partition is emitted on its own
 * writer thread (a consistent snapshot of that partition at a point in its
 * event stream), one partition after the other; @p emit is never called
 * concurrently with itself. Same as kvi_producer_dump_partition for every
 * partition in turn (see there: @p emit must not block). Owning thread of
 * @p p only.
 */
void kvi_producer_dump(struct kvi_producer *p, struct kvi_index *ix, kvi_dump_fn emit, void *ctx);

/**
 * Dump partition @p part of index @p ix on its writer thread, after
 * everything this producer submitted before, and wait until it is done.
 * @p emit(ctx, block) is called once per held block, on the writer, with
 * nothing applied to the partition meanwhile: the blocks are a consistent
 * snapshot of the partition at one point of its event stream (parents before
 * children). Because the writer applies nothing else while @p emit runs,
 * @p emit should not block (on a network client, say): collect the blocks in
 * memory and send them from the calling thread after the call returns. If
 * it does block, the partition's writer waits with it (the daemon's /dump
 * accepts that past 64 MiB of spool, bounded by its idle timeout).
 * Whatever @p emit wrote to @p ctx is visible to the caller on return.
 * Nothing is emitted when @p part >= kvi_index_n_parts(ix) or >= the pool's
 * writer count. @p ix must stay allocated until the call returns; the dump
 * changes none of its blocks, so an index whose writers already forgot it
 * (kvi_producer_forget_index) may still be dumped. Owning thread of @p p only.
 */
void kvi_producer_dump_partition(struct kvi_producer *p, struct kvi_index *ix, uint32_t part, kvi_dump_fn emit,
                                 void *ctx);

/**
 * kvi_producer_dump_partition with a hook: @p pre(ctx, part), when not NULL,
 * runs on the partition's writer right before the first block is emitted,
 * at the same point of the partition's event stream as the blocks (nothing
 * is applied to the partition between the two). It is called even when the
 * partition holds no block (and not at all when nothing would be emitted
 * because @p part is out of range). Use it to read state published by the
 * writer for that point, such as kvi_op_sink_applied of the sources whose
 * ops go to this writer. Same rules as @p emit (do not block).
 */
void kvi_producer_dump_partition_pre(struct kvi_producer *p, struct kvi_index *ix, uint32_t part,
                                     void (*pre)(void *ctx, uint32_t part), kvi_dump_fn emit, void *ctx);

/**
 * Make every writer forget index @p ix (reclaiming its retired memory) after
 * everything this producer submitted. Call before kvi_index_destroy, once no
 * producer submits ops for @p ix any more. Owning thread of @p p only.
 */
void kvi_producer_forget_index(struct kvi_producer *p, struct kvi_index *ix);

/**
 * Read a sink's counters (relaxed loads; any thread). Each counter is exact
 * for the ops applied so far, but the counters are not one snapshot.
 */
void kvi_op_sink_read(const struct kvi_op_sink *sink, struct kvi_op_sink *out);

/**
 * A sink's applied position (acquire load; any thread): the applied1 of the
 * last op with pub_applied the writers applied for it, or what
 * kvi_op_sink_set_applied stored (0 = none).
 */
uint64_t kvi_op_sink_applied(const struct kvi_op_sink *sink);

/**
 * Store @p applied1 as the sink's applied position (release), as a writer
 * would: to seed it (a watermark recovered from a peer) before any op of the
 * source is submitted.
 */
void kvi_op_sink_set_applied(struct kvi_op_sink *sink, uint64_t applied1);

/** Counters of writer @p w (approximate while running). */
void kvi_writer_stats(const struct kvi_writer_pool *pool, uint32_t w, struct kvi_writer_stats *st);

/** Jemalloc arena of writer @p w (0 without jemalloc). */
unsigned kvi_writer_arena(const struct kvi_writer_pool *pool, uint32_t w);

#endif
