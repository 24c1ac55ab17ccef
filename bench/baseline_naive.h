/*
 * Baseline: the naive nested map of the Flash Indexer write-up — per worker,
 * the set of blocks it holds; a query walks every worker and follows the
 * query's blocks while the worker holds them (O(workers x depth)) — behind
 * one pthread rwlock (bench/ only).
 *
 * The write-up keys each worker's map by the chunk (content) hash, which
 * mistakes identical blocks at other positions or after other prefixes for
 * hits. To give exact answers (the same as kvidx's), this version keys the
 * set by the block's standard RFC 1527 sequence hash (engine/hash.h), which
 * names the whole prefix: a stored block's is computed from its parent's,
 * and a query computes its own once. A per-worker table maps engine hash ->
 * sequence hash for parents and removals. Removal semantics: see
 * baseline_common.h.
 *
 *   | call             | thread                              |
 *   |------------------|-------------------------------------|
 *   | create / destroy | control plane, no other users       |
 *   | store / remove   | any thread (takes the write lock)   |
 *   | find, holdings   | any thread (takes the read lock)    |
 */
#ifndef KVI_BENCH_BASELINE_NAIVE_H
#define KVI_BENCH_BASELINE_NAIVE_H

#include <stdbool.h>

#include "bench/baseline_common.h"

struct kvi_bl_naive;

/** Create an empty map for workers 0 .. n_workers-1. Aborts on out-of-memory. */
struct kvi_bl_naive *kvi_bl_naive_create(uint32_t n_workers);

/** Destroy a map. No other user may remain. */
void kvi_bl_naive_destroy(struct kvi_bl_naive *m);

/**
 * Store a run of @p n blocks for @p worker below @p parent (when
 * @p has_parent; else from the root). Idempotent.
 * @return 0, -ENOENT when the worker does not hold @p parent, -EINVAL for a
 *         worker out of range.
 */
int kvi_bl_naive_store(struct kvi_bl_naive *m, uint32_t worker, bool has_parent, uint64_t parent,
                       const uint64_t *engine_hash, const uint64_t *content, size_t n);

/**
 * Remove blocks of @p worker by engine hash (unknown hashes are skipped).
 * @return the number of hashes that were known.
 */
size_t kvi_bl_naive_remove(struct kvi_bl_naive *m, uint32_t worker, const uint64_t *engine_hash, size_t n);

/**
 * Every worker's longest contiguous prefix of @p content along its exact chain.
 * @param out  receives at most @p cap scores, in worker order
 * @return the number of workers with depth >= 1 (may exceed @p cap).
 */
size_t kvi_bl_naive_find(struct kvi_bl_naive *m, struct kvi_bl_scratch *s, const uint64_t *content, size_t n,
                         struct kvi_bl_score *out, size_t cap);

/** (block, worker) holdings currently in the map. */
uint64_t kvi_bl_naive_holdings(struct kvi_bl_naive *m);

#endif
