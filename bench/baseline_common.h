/*
 * Shared types of the trace benchmark's baseline indexes (bench/ only):
 *   baseline_radix.h  a compressed radix tree behind one rwlock;
 *   baseline_naive.h  the naive nested map (worker -> set of prefix hashes).
 * Both take the same events as kvidx (engine hashes opaque per worker, a
 * parent engine hash per stored run, content hashes from tokens) and answer
 * the same question: for a query of content hashes, every worker's longest
 * contiguous prefix along the query's exact chain.
 *
 * Removal semantics are the reference trees': removing a block drops only
 * that block (descendants are not cascaded; they stop counting because a
 * score is a contiguous prefix, and re-storing the block makes them count
 * again). kvidx cascades instead. The answers agree whenever a worker never
 * removes a block while it still holds a descendant — which is how engines
 * evict (leaves first; the mock engine guarantees it) — and this is tested.
 */
#ifndef KVI_BENCH_BASELINE_COMMON_H
#define KVI_BENCH_BASELINE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/** One worker's score. */
struct kvi_bl_score {
    uint32_t worker;
    uint32_t depth; /* matched blocks, >= 1 */
};

/** Per-thread scratch memory of baseline queries (owned by the caller). */
struct kvi_bl_scratch {
    uint32_t *a, *b;    /* worker sets */
    size_t cap_ab;
    uint64_t *seq;      /* prefix hashes */
    size_t cap_seq;
};

/** Free a scratch area (it is empty and reusable afterwards). */
static inline void kvi_bl_scratch_free(struct kvi_bl_scratch *s)
{
    free(s->a);
    free(s->b);
    free(s->seq);
    s->a = s->b = NULL;
    s->seq = NULL;
    s->cap_ab = s->cap_seq = 0;
}

#endif
