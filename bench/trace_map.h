/*
 * u64 -> u64 open-addressing hash map for the trace benchmark's mock engines
 * and baseline indexes (bench/ only; kvidx's own tables live in engine/).
 *
 * Linear probing over a power-of-two table, kept at most 3/4 full; deletion by
 * backward shift (no tombstones). Key 0 is stored out of line, so every u64 is
 * a valid key. Not thread-safe: the owner serialises access (the baselines
 * hold their lock). Allocation aborts on out-of-memory (control-plane rule).
 */
#ifndef KVI_BENCH_TRACE_MAP_H
#define KVI_BENCH_TRACE_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/hash.h" /* kvi_fmix64: the map's hash, and the benchmarks' seed mixer */

struct kvi_u64map_slot {
    uint64_t key; /* 0 = empty */
    uint64_t val;
};

struct kvi_u64map {
    struct kvi_u64map_slot *slots;
    uint32_t mask; /* capacity - 1, or 0 before the first insert */
    uint32_t n;    /* entries in slots (key 0 not included) */
    bool has_zero;
    uint64_t zero_val;
};

/** Initialise an empty map (no allocation until the first insert). */
void kvi_u64map_init(struct kvi_u64map *m);

/** Free the map's memory; it is empty (and reusable) afterwards. */
void kvi_u64map_free(struct kvi_u64map *m);

/** Number of keys. */
static inline size_t kvi_u64map_size(const struct kvi_u64map *m)
{
    return m->n + (m->has_zero ? 1u : 0u);
}

/**
 * Look up @p key.
 * @return true and *val (when @p val is not NULL) if present.
 */
bool kvi_u64map_get(const struct kvi_u64map *m, uint64_t key, uint64_t *val);

/**
 * Insert or overwrite @p key.
 * @return true if the key was new.
 */
bool kvi_u64map_put(struct kvi_u64map *m, uint64_t key, uint64_t val);

/**
 * Remove @p key.
 * @return true and *val (when @p val is not NULL) if it was present.
 */
bool kvi_u64map_del(struct kvi_u64map *m, uint64_t key, uint64_t *val);

/**
 * Iterate: call with *pos = 0, then again while it returns true.
 * The map must not change during an iteration.
 */
bool kvi_u64map_next(const struct kvi_u64map *m, size_t *pos, uint64_t *key, uint64_t *val);


#endif
