/* ctest-labels: unit -- engine/index_query.c: prefix keys computed chunk by chunk as the search advances */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/index.h"
#include "engine/rcu.h"
#include "rcu_group.h"

/*
 * A query computes its prefix keys lazily, QKEY_CHUNK (64) positions at a
 * time, as the jump search reaches them (engine/index_query.c, keys_upto).
 * These cases put chain ends and divergences on both sides of every chunk
 * edge, for several jump sizes and partition counts, and check each answer
 * exactly; and they check the paths that read keys past where the gpu
 * search stopped (lower tiers, shared pools), after a query that left other
 * keys in the per-thread buffer.
 */

#define QLEN 300u

static const uint32_t chain_len[] = {1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 256, 257, QLEN};
#define N_CHAINS (sizeof chain_len / sizeof chain_len[0])

static uint64_t content_at(uint32_t i) { return 0x9000000000000000ull + i * 0x10001ull; }
static uint64_t eh_of(uint32_t inst, uint32_t i) { return ((uint64_t)(inst + 1) << 32) | (i + 1); }

static void store_chain(struct kvi_index *ix, uint32_t inst, enum kvi_tier tier, uint32_t len)
{
    struct kvi_block b[QLEN];
    for (uint32_t i = 0; i < len; i++)
        b[i] = (struct kvi_block){eh_of(inst + 100u * tier, i), content_at(i)};
    assert_int_equal(kvi_index_store(ix, inst, 0, tier, false, 0, b, len), 0);
}

static struct kvi_index *make_index(uint32_t n_parts)
{
    struct kvi_index_config ic = {.block_size = 16, .n_parts = n_parts, .key_seed = 0x77 + n_parts};
    struct kvi_index *ix = kvi_index_create(&ic);
    assert_non_null(ix);
    for (uint32_t w = 0; w < N_CHAINS; w++) {
        assert_int_equal(kvi_index_intern_instance(ix, 500 + w, NULL, false), w);
        store_chain(ix, w, KVI_TIER_GPU, chain_len[w]);
    }
    return ix;
}

/* Query the first QLEN blocks, changed at position d (d >= QLEN: none):
 * instance w matches min(chain_len[w], d) blocks, and nothing else matches. */
static void check_query(struct kvi_index *ix, uint32_t d, uint32_t jump, uint32_t n_parts)
{
    uint64_t q[QLEN];
    for (uint32_t i = 0; i < QLEN; i++)
        q[i] = content_at(i);
    if (d < QLEN)
        q[d] ^= 0x5555;
    struct kvi_match m[N_CHAINS + 4];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(ix, q, QLEN, m, N_CHAINS + 4);
    kvi_rcu_read_unlock();
    uint32_t want[N_CHAINS], got[N_CHAINS] = {0};
    size_t want_n = 0;
    for (uint32_t w = 0; w < N_CHAINS; w++) {
        want[w] = chain_len[w] < d ? chain_len[w] : d;
        want_n += want[w] > 0;
    }
    for (size_t i = 0; i < k && i < N_CHAINS + 4; i++) {
        assert_true(m[i].instance < N_CHAINS);
        assert_int_equal(got[m[i].instance], 0); /* once each */
        got[m[i].instance] = m[i].depth;
    }
    for (uint32_t w = 0; w < N_CHAINS; w++)
        if (got[w] != want[w])
            fail_msg("%u partition(s), jump %u, diverging at %u: chain of %u matched %u, not %u", n_parts, jump, d,
                     chain_len[w], got[w], want[w]);
    assert_int_equal(k, want_n);
}

static void test_chunk_edges(void **state)
{
    (void)state;
    static const uint32_t parts[] = {1, 3};
    static const uint32_t jumps[] = {1, 7, 32, 63, 64, 65, 100, 256, 0};
    static const uint32_t div[] = {1, 2, 62, 63, 64, 65, 66, 127, 128, 129, 130, 191, 192, 193, 255, 256, 257, 299, QLEN};
    for (size_t p = 0; p < 2; p++) {
        struct kvi_index *ix = make_index(parts[p]);
        for (size_t j = 0; j < sizeof jumps / sizeof jumps[0]; j++) {
            kvi_index_set_jump(ix, jumps[j]);
            for (size_t d = 0; d < sizeof div / sizeof div[0]; d++)
                check_query(ix, div[d], jumps[j], parts[p]);
        }
        kvi_index_destroy(ix);
    }
}

/* A query whose gpu match ends in the first chunk while a cpu tier (and a
 * shared pool) holds the whole prompt: the tier walk reads keys far past
 * where the gpu search stopped. An unrelated query first fills the
 * per-thread key buffer with other keys. */
static void test_lower_tiers_read_every_key(void **state)
{
    (void)state;
    struct kvi_index_config ic = {.block_size = 16, .n_parts = 1, .key_seed = 5};
    struct kvi_index *ix = kvi_index_create(&ic);
    assert_non_null(ix);
    assert_int_equal(kvi_index_intern_instance(ix, 1, NULL, false), 0);
    assert_int_equal(kvi_index_intern_instance(ix, 2, NULL, true), 1); /* a shared pool */
    kvi_index_set_jump(ix, 1); /* the gpu search stops at position 2 */
    store_chain(ix, 0, KVI_TIER_GPU, 2);
    store_chain(ix, 0, KVI_TIER_CPU, QLEN);
    store_chain(ix, 1, KVI_TIER_DISK, QLEN);
    uint64_t q[QLEN], other[QLEN];
    for (uint32_t i = 0; i < QLEN; i++) {
        q[i] = content_at(i);
        other[i] = ~content_at(i);
    }
    struct kvi_match m[4];
    struct kvi_tier_match t[4];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_index_find_matches(ix, other, QLEN, m, 4), 0);
    size_t k = kvi_index_find_tiered(ix, q, NULL, QLEN, t, 4);
    size_t row = k;
    for (size_t i = 0; i < k && i < 4; i++)
        if (t[i].instance == 0)
            row = i;
    assert_true(row < k);
    assert_int_equal(t[row].gpu, 2);
    assert_int_equal(t[row].cpu, QLEN);
    assert_int_equal(t[row].disk, QLEN);
    /* a gpu miss at the first block, then the pool alone */
    assert_int_equal(kvi_index_find_matches(ix, other, QLEN, m, 4), 0);
    uint32_t cpu = 99, disk = 99;
    kvi_index_pool_depths(ix, q, NULL, QLEN, &cpu, &disk);
    assert_int_equal(cpu, 0);
    assert_int_equal(disk, QLEN);
    kvi_rcu_read_unlock();
    kvi_index_destroy(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_edges),
        cmocka_unit_test(test_lower_tiers_read_every_key),
    };
    return cmocka_run_group_tests(tests, kvi_test_rcu_setup, kvi_test_rcu_teardown);
}
