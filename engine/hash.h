/*
 * kvidx hashing: content ("local block") hashes, LoRA / salt seeds and the
 * standard rolling sequence hash (RFC 1527). All functions are pure and
 * thread-safe.
 *
 *   content hash  = XXH3-64(block tokens as little-endian u32, seed)
 *   seed          = 1337 (+ XXH3-64(lora_name, 0) if lora_name non-empty)
 *                        (+ XXH3-64(salt, 1)      if salt non-empty), wrapping
 *   seq[0]        = content[0]
 *   seq[i]        = XXH3-64(le_u64(seq[i-1]) || le_u64(content[i]), 1337)
 *
 * The salt term follows Dynamo's shared hashing crate: a query under another
 * salt (Mooncake cache_salt / additional_salt) hashes every block differently
 * and therefore never matches. The rolling hash always uses seed 1337; LoRA and
 * salt isolation come from the content hashes it consumes.
 */
#ifndef KVI_ENGINE_HASH_H
#define KVI_ENGINE_HASH_H

#include <stddef.h>
#include <stdint.h>

/** MurmurHash3's 64-bit finaliser: a bijective mix of every input bit into
 * every output bit. Not a block hash (XXH3 below is); for table positions,
 * prefix-key steps and seeds. */
static inline uint64_t kvi_fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

/** The inverse of kvi_fmix64: kvi_fmix64_inv(kvi_fmix64(k)) == k (x ^= x >> 33
 * undoes itself; the multipliers are the inverses of fmix64's mod 2^64). */
static inline uint64_t kvi_fmix64_inv(uint64_t k)
{
    k ^= k >> 33;
    k *= 0x9cb4b2f8129337dbull;
    k ^= k >> 33;
    k *= 0x4f74430c22a54005ull;
    k ^= k >> 33;
    return k;
}

#define KVI_HASH_SEED 1337ull

/**
 * Seed for content hashes of a LoRA adapter and salt namespace.
 * @param lora      adapter name bytes, NULL or length 0 for the base model
 * @param lora_len  length of @p lora
 * @param salt      salt bytes, NULL or length 0 for none
 * @param salt_len  length of @p salt
 * @return the seed (1337 for base model without salt).
 */
uint64_t kvi_hash_seed(const char *lora, size_t lora_len, const char *salt, size_t salt_len);

/**
 * Content hash of one block of @p n tokens (each laid out as LE u32).
 * @return XXH3-64 of the token bytes with @p seed.
 */
uint64_t kvi_hash_block(const uint32_t *tokens, size_t n, uint64_t seed);

/**
 * Content hashes of every full block of @p block_size tokens; a trailing
 * partial block is ignored.
 * @param out  receives at most @p cap hashes
 * @return number of full blocks (may exceed @p cap: then only @p cap were
 *         written); 0 when @p block_size is 0.
 */
size_t kvi_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                       uint64_t seed, uint64_t *out, size_t cap);

/**
 * Eagle / bigram content hashes (SGLang pair tokens): windows of
 * block_size + 1 tokens with a stride of block_size, as many as fit.
 * @return number of windows (may exceed @p cap as for kvi_hash_blocks).
 */
size_t kvi_hash_blocks_eagle(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                             uint64_t seed, uint64_t *out, size_t cap);

/**
 * Content hash of a multimodal block: token bytes followed by the block's
 * multimodal hashes sorted ascending, each LE u64.
 * @param mm  the multimodal hashes (need not be sorted; not modified)
 */
uint64_t kvi_hash_block_mm(const uint32_t *tokens, size_t n, const uint64_t *mm, size_t n_mm,
                           uint64_t seed);

/** One step of the standard rolling sequence hash. */
uint64_t kvi_seq_hash_next(uint64_t prev_seq, uint64_t content);

/**
 * Standard rolling sequence hashes of @p n content hashes (out may alias
 * content).
 */
void kvi_seq_hashes(const uint64_t *content, size_t n, uint64_t *out);

#endif
