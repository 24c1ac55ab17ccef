/*
 * Mock inference engine for the trace benchmark: a vLLM-like scheduler with
 * prefix caching over a finite pool of GPU blocks, simulated offline, that
 * emits the KV events a real engine would publish (bench/ only).
 *
 * MODEL (one engine = one worker)
 *   - A pool of cfg.num_blocks blocks of cfg.block_size tokens. A block is
 *     free (not cached), cached and free (on the LRU list), or in use
 *     (reference count > 0; cached or not).
 *   - Engine hashes are opaque chains, as vLLM's are:
 *         eh[0] = kvi_mock_hash(cfg.hash_seed, content[0]),
 *         eh[i] = kvi_mock_hash(eh[i-1], content[i]);
 *     hash_seed plays vLLM's per-process random NONE_HASH, so two engines
 *     holding the same tokens publish different hashes. They are never
 *     kvidx's content hashes nor the RFC 1527 sequence hashes.
 *   - Admission (FCFS, no batch or sequence limits): a request reuses the
 *     longest cached prefix of its prompt's full blocks, and takes blocks for
 *     the rest of its prompt, its output and a partial tail block. Blocks come
 *     from the free list first, then by evicting the least recently used
 *     cached free block (one REMOVED event per admission lists every evicted
 *     hash). A request that does not fit waits in FIFO order until running
 *     requests release blocks; one larger than the whole pool is dropped.
 *   - Prefill of the uncached prompt tokens takes
 *     tokens / cfg.prefill_tokens_per_ms; then the newly computed full blocks
 *     become cached: one STORED event per contiguous run, naming the run's
 *     parent (the previous block's engine hash) unless it starts at position
 *     0. If another request cached an identical block meanwhile, the request
 *     drops its copy and shares the cached one (no event for it).
 *   - Decode produces one token per cfg.decode_ms_per_token; every output
 *     block that fills becomes cached with a one-block STORED event.
 *   - At completion the request releases its blocks last block first, so the
 *     LRU list always holds a block's descendants before the block itself:
 *     evictions take leaves first and a worker never removes a block while it
 *     still holds a descendant (vLLM frees in reverse order for this reason).
 *
 * Time is simulated (double milliseconds); nothing here sleeps. Requests must
 * be submitted in nondecreasing arrival order. Single-threaded: one engine is
 * used by one thread at a time.
 */
#ifndef KVI_BENCH_MOCK_ENGINE_H
#define KVI_BENCH_MOCK_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvi_mock_cfg {
    uint32_t num_blocks;         /* GPU blocks in the pool (>= 1) */
    uint32_t block_size;         /* tokens per block (>= 1) */
    double prefill_tokens_per_ms; /* prefill throughput (> 0) */
    double decode_ms_per_token;  /* per sequence (>= 0) */
    uint64_t hash_seed;          /* the engine's NONE_HASH */
};

enum kvi_mock_event_kind {
    KVI_MOCK_STORED,
    KVI_MOCK_REMOVED,
};

/** A KV event. The arrays belong to the engine and are valid during the callback only. */
struct kvi_mock_event {
    double t_ms;
    enum kvi_mock_event_kind kind;
    bool has_parent;             /* STORED */
    uint64_t parent;             /* STORED: engine hash of the run's parent */
    uint32_t n;                  /* hashes */
    const uint64_t *engine_hash; /* n engine hashes (REMOVED: in eviction order) */
    const uint64_t *content;     /* STORED: n content hashes; NULL for REMOVED */
    uint64_t tag;                /* STORED: tag of the request that computed the run */
    uint32_t pos;                /* STORED: position of the run's first block in that request */
};
typedef void (*kvi_mock_emit_fn)(void *ctx, const struct kvi_mock_event *ev);

struct kvi_mock_request {
    uint64_t tag;            /* caller's id, echoed in STORED events */
    double arrival_ms;       /* nondecreasing across submissions */
    uint32_t input_tokens;
    uint32_t output_tokens;
    const uint64_t *content; /* content hashes of every full block of prompt + output
                                (floor((input + output) / block_size)); copied */
};

struct kvi_mock_stats {
    uint64_t requests;       /* submitted */
    uint64_t dropped;        /* larger than the pool */
    uint64_t waited;         /* not admitted on arrival */
    uint64_t completed;
    uint64_t hit_blocks;     /* prompt blocks reused from the cache at admission */
    uint64_t computed_blocks; /* prompt blocks computed */
    uint64_t late_hits;      /* computed blocks dropped for an identical cached one */
    uint64_t stored_events, stored_blocks;
    uint64_t removed_events, removed_blocks;
    uint32_t peak_in_use;    /* most blocks referenced at once */
};

struct kvi_mock_engine;

/**
 * Create an engine. @p emit receives every event, in simulated time order.
 * @return the engine, or NULL with errno = EINVAL for a bad configuration.
 */
struct kvi_mock_engine *kvi_mock_create(const struct kvi_mock_cfg *cfg, kvi_mock_emit_fn emit, void *ctx);

/** Destroy an engine (pending requests are discarded without events). */
void kvi_mock_destroy(struct kvi_mock_engine *e);

/**
 * Run the simulation up to time @p t_ms (every internal step due at or before
 * it), emitting events. Call before submitting a request that arrives at
 * @p t_ms so events up to its arrival come first.
 */
void kvi_mock_advance(struct kvi_mock_engine *e, double t_ms);

/**
 * Submit a request arriving at r->arrival_ms (advances the simulation there
 * first). It is admitted now if its blocks fit, else queued.
 * @return 0, or -E2BIG when it can never fit the pool (dropped and counted).
 */
int kvi_mock_submit(struct kvi_mock_engine *e, const struct kvi_mock_request *r);

/** Run every admitted and waiting request to completion. */
void kvi_mock_drain(struct kvi_mock_engine *e);

/** Counters. */
void kvi_mock_stats(const struct kvi_mock_engine *e, struct kvi_mock_stats *st);

/** Blocks currently cached (in use or on the LRU list). */
uint32_t kvi_mock_cached_blocks(const struct kvi_mock_engine *e);

/** Whether the engine has @p engine_hash cached. */
bool kvi_mock_is_cached(const struct kvi_mock_engine *e, uint64_t engine_hash);

/** One step of the engine hash chain (opaque, vLLM-like). */
uint64_t kvi_mock_hash(uint64_t parent, uint64_t content);

#endif
