/*
 * Baseline: a compressed radix (prefix) tree keyed by content hashes, behind
 * one pthread rwlock — the reference radix tree of the Flash Indexer
 * write-up, made thread-safe the simplest way (bench/ only).
 *
 * Every node holds an edge (a run of blocks: content hashes) and the sorted
 * set of workers that hold the whole edge; children are keyed by the first
 * content hash of their edge. A node is split wherever a worker's holding
 * ends inside an edge, so every block of an edge has the same holders, and a
 * node that ends up with the same holders as its only child absorbs it. Per
 * worker, a lookup table maps engine hash -> block, used only to attach
 * stored runs under their parent and to resolve removals. Removal semantics:
 * see baseline_common.h.
 *
 *   | call                 | thread                                 |
 *   |----------------------|----------------------------------------|
 *   | create / destroy     | control plane, no other users          |
 *   | store / remove       | any thread (takes the write lock)      |
 *   | find                 | any thread (takes the read lock)       |
 *   | blocks / nodes       | any thread (takes the read lock)       |
 *
 * The rwlock prefers writers, so queries cannot starve event application.
 */
#ifndef KVI_BENCH_BASELINE_RADIX_H
#define KVI_BENCH_BASELINE_RADIX_H

#include <stdbool.h>

#include "bench/baseline_common.h"

struct kvi_bl_radix;

/** Create an empty tree for workers 0 .. n_workers-1. Aborts on out-of-memory. */
struct kvi_bl_radix *kvi_bl_radix_create(uint32_t n_workers);

/** Destroy a tree. No other user may remain. */
void kvi_bl_radix_destroy(struct kvi_bl_radix *t);

/**
 * Store a run of @p n blocks for @p worker below @p parent (when
 * @p has_parent; else from the root). Idempotent for blocks already held.
 * @return 0, -ENOENT when the worker does not hold @p parent, -EINVAL for a
 *         worker out of range.
 */
int kvi_bl_radix_store(struct kvi_bl_radix *t, uint32_t worker, bool has_parent, uint64_t parent,
                       const uint64_t *engine_hash, const uint64_t *content, size_t n);

/**
 * Remove blocks of @p worker by engine hash (unknown hashes are skipped).
 * @return the number of hashes that were known.
 */
size_t kvi_bl_radix_remove(struct kvi_bl_radix *t, uint32_t worker, const uint64_t *engine_hash, size_t n);

/**
 * Every worker's longest contiguous prefix of @p content along its exact chain.
 * @param out  receives at most @p cap scores, in no particular order
 * @return the number of workers with depth >= 1 (may exceed @p cap).
 */
size_t kvi_bl_radix_find(struct kvi_bl_radix *t, struct kvi_bl_scratch *s, const uint64_t *content, size_t n,
                         struct kvi_bl_score *out, size_t cap);

/** (block, worker) holdings currently in the tree. */
uint64_t kvi_bl_radix_holdings(struct kvi_bl_radix *t);

/** Nodes currently in the tree (root excluded). */
uint64_t kvi_bl_radix_nodes(struct kvi_bl_radix *t);

#endif
