/*
 * The standard sequence-hash step (engine/hash.h: kvi_seq_hash_next) as a
 * static inline, for engine files whose hot loops chain it (the store's key
 * loop). Includes xxhash with XXH_INLINE_ALL, as every engine file that
 * hashes does. Engine files only.
 */
#ifndef KVI_ENGINE_HASH_IMPL_H
#define KVI_ENGINE_HASH_IMPL_H

#include <stdint.h>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "engine/hash.h"

/* seq[i] = XXH3-64(LE u64 seq[i-1] || LE u64 content[i], KVI_HASH_SEED) */
static inline uint64_t kvi__seq_step(uint64_t prev_seq, uint64_t content)
{
    uint64_t buf[2] = {prev_seq, content};
    return XXH3_64bits_withSeed(buf, sizeof buf, KVI_HASH_SEED);
}

#endif
