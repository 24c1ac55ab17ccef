#include "engine/hash.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/hash_impl.h"

/* Token ids are hashed as little-endian u32; x86-64 and arm64 are LE. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvidx hashes assume a little-endian host"
#endif

uint64_t kvi_hash_seed(const char *lora, size_t lora_len, const char *salt, size_t salt_len)
{
    uint64_t seed = KVI_HASH_SEED;
    if (lora != NULL && lora_len > 0)
        seed += XXH3_64bits_withSeed(lora, lora_len, 0);
    if (salt != NULL && salt_len > 0)
        seed += XXH3_64bits_withSeed(salt, salt_len, 1);
    return seed;
}

uint64_t kvi_hash_block(const uint32_t *tokens, size_t n, uint64_t seed)
{
    return XXH3_64bits_withSeed(tokens, n * sizeof(uint32_t), seed);
}

size_t kvi_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                       uint64_t seed, uint64_t *out, size_t cap)
{
    if (block_size == 0)
        return 0;
    size_t nb = n_tokens / block_size;
    size_t lim = KVI_MIN(nb, cap);
    for (size_t i = 0; i < lim; i++)
        out[i] = kvi_hash_block(tokens + i * block_size, block_size, seed);
    return nb;
}

size_t kvi_hash_blocks_eagle(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                             uint64_t seed, uint64_t *out, size_t cap)
{
    if (block_size == 0 || n_tokens < (size_t)block_size + 1)
        return 0;
    size_t nb = (n_tokens - 1) / block_size;
    size_t lim = KVI_MIN(nb, cap);
    for (size_t i = 0; i < lim; i++)
        out[i] = kvi_hash_block(tokens + i * block_size, (size_t)block_size + 1, seed);
    return nb;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

uint64_t kvi_hash_block_mm(const uint32_t *tokens, size_t n, const uint64_t *mm, size_t n_mm,
                           uint64_t seed)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    XXH3_64bits_update(&st, tokens, n * sizeof(uint32_t));
    uint64_t small[16];
    uint64_t *sorted = n_mm <= KVI_ARRAY_LEN(small) ? small : kvi_xmalloc(n_mm * sizeof(uint64_t));
    if (n_mm > 0)
        memcpy(sorted, mm, n_mm * sizeof(uint64_t));
    qsort(sorted, n_mm, sizeof(uint64_t), cmp_u64);
    XXH3_64bits_update(&st, sorted, n_mm * sizeof(uint64_t));
    if (sorted != small)
        free(sorted);
    return XXH3_64bits_digest(&st);
}

uint64_t kvi_seq_hash_next(uint64_t prev_seq, uint64_t content)
{
    return kvi__seq_step(prev_seq, content);
}

void kvi_seq_hashes(const uint64_t *content, size_t n, uint64_t *out)
{
    if (n == 0)
        return;
    uint64_t s = content[0];
    out[0] = s;
    for (size_t i = 1; i < n; i++) {
        s = kvi_seq_hash_next(s, content[i]);
        out[i] = s;
    }
}
