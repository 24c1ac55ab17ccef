/* ctest-labels: unit */
/*
 * Behaviour tests for the positional index (engine/index.h), following
 * ../shared/reference/index-semantics.md:
 *
 *   s01..s35, s38, s39  the index scenarios of section 6.5, one cmocka test
 *                       each. 6.5.36 (frequencies) and 6.5.37 (routing
 *                       decisions) are optional approximate modes that kvidx's
 *                       index does not implement: skipped.
 *   the rest            section 2.2 consequences, section 4 tree sizes,
 *                       section 5 dump/replay equivalence, tiers (section 3),
 *                       error returns, stats, dp-rank and instance removal.
 *
 * Conventions (section 6): "store [1,2,3] for W0" = content hashes 1, 2, 3 in
 * one event, engine hashes = the standard rolling hashes of those ids
 * (kvi_seq_hashes), parent = the previous block's engine hash. Workers are
 * numeric instance ids interned with kvi_index_intern_instance.
 *
 * Every scenario runs against every configuration of fx_cfgs
 * (index_fixture.h): 1 and 3 partitions x jump sizes 1, 2, 7, 32, 64 and 0
 * (jump to the end), the default jump with a random key secret, and two
 * configurations with an extra lower-tier instance so that find_tiered walks
 * tiers. Every match expectation is exact (depth, tree size, no extra slots)
 * and is cross-checked against find_matches_by_seq and find_tiered.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "index_fixture.h"
#include "engine/index_internal.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define SCENARIO(name, bs)                                                                         \
    static void sc_##name(struct fx *f);                                                           \
    static void test_##name(void **state)                                                          \
    {                                                                                              \
        (void)state;                                                                               \
        fx_run(sc_##name, #name, (bs));                                                            \
    }                                                                                              \
    static void sc_##name(struct fx *f)

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t *xalloc_u64(size_t n)
{
    uint64_t *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static struct kvi_index_stats stats_of(struct fx *f)
{
    struct kvi_index_stats st;
    kvi_index_stats(f->ix, &st);
    return st;
}

/* Forget the probe instance so that absolute counts and snapshots hold. */
static void drop_probe(struct fx *f)
{
    if (f->probe != FX_ANY) {
        kvi_index_remove_instance(f->ix, f->probe);
        fx_reclaim_all(f);
        f->probe = FX_ANY;
    }
}

/* ======================================================================== */
/* 6.5 index behaviour                                                      */
/* ======================================================================== */

/* 6.5.1 store then find: store [1,2,3] for W0; query [1,2,3] -> W0 = 3. */
SCENARIO(s01_store_then_find, 32)
{
    uint64_t c[4] = {1, 2, 3, 4};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3});
    EXPECT(f, c, 1, {w0, 0, 1, 3});
    EXPECT(f, c, 2, {w0, 0, 2, 3});
    EXPECT(f, c, 4, {w0, 0, 3, 3}); /* a longer query scores what is held */
    CHECK_EQ(fx_tree(f, w0, 0), 3);
    CHECK_EQ(kvi_index_block_size(f->ix), 32);
}

/* 6.5.2 partial match: query [1,2,999] -> W0 = 2. */
SCENARIO(s02_partial_match, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    uint64_t q1[3] = {1, 2, 999}, q2[3] = {1, 999, 3}, q3[3] = {999, 2, 3}, q4[2] = {2, 3};
    EXPECT(f, q1, 3, {w0, 0, 2, 3});
    EXPECT(f, q2, 3, {w0, 0, 1, 3});
    EXPECT_NONE(f, q3, 3);
    EXPECT_NONE(f, q4, 2); /* the same content hashes at other positions are not a match */
}

/* 6.5.3 remove all: store then remove [1,2,3] -> no scores. */
SCENARIO(s03_remove_all, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    CHECK_EQ(REMOVE_REV(f, w0, c, 0, 3), 3);
    EXPECT_NONE(f, c, 3);
    EXPECT_NONE(f, c, 1);
    CHECK_EQ(fx_tree(f, w0, 0), 0);
    /* parent-first order: removing block 1 already cascades to 2 and 3 */
    STORE(f, w0, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3});
    CHECK(REMOVE(f, w0, c, 0, 3) >= 1);
    EXPECT_NONE(f, c, 3);
    CHECK_EQ(fx_tree(f, w0, 0), 0);
}

/* 6.5.4 shared prefix: W0 [1,2], W1 [1,3]. [1] -> both 1; [1,2] -> W0 2, W1 1. */
SCENARIO(s04_shared_prefix, 32)
{
    uint64_t a[2] = {1, 2}, b[2] = {1, 3};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, a, 0, 2);
    STORE(f, w1, b, 0, 2);
    EXPECT(f, a, 1, {w0, 0, 1, 2}, {w1, 0, 1, 2});
    EXPECT(f, a, 2, {w0, 0, 2, 2}, {w1, 0, 1, 2});
    EXPECT(f, b, 2, {w0, 0, 1, 2}, {w1, 0, 2, 2});
}

/* 6.5.5 remove worker: W0 and W1 hold [1,2,3]; remove W0 -> only W1 = 3. */
SCENARIO(s05_remove_worker, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint64_t slots0 = stats_of(f).slots;
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 3);
    STORE(f, w1, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3}, {w1, 0, 3, 3});
    CHECK_EQ(stats_of(f).slots, slots0 + 2);
    kvi_index_remove_instance(f->ix, w0);
    EXPECT(f, c, 3, {w1, 0, 3, 3});
    CHECK_EQ(fx_tree(f, w0, 0), 0);
    CHECK_EQ(stats_of(f).slots, slots0 + 1);
    /* the worker can come back */
    STORE(f, w0, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3}, {w1, 0, 3, 3});
}

/* 6.5.6 large stores: 10 workers store 1, 2, 4, ..., 512 blocks of one chain;
 * the 512-block query finds all of them with exact depths. */
SCENARIO(s06_large_stores, 32)
{
    uint64_t c[512];
    fx_range(c, 512, 1);
    uint32_t w[10];
    struct fx_exp e[10];
    for (uint32_t i = 0; i < 10; i++) {
        w[i] = fx_w(f, 100 + i);
        STORE(f, w[i], c, 0, 1u << i);
        e[i] = (struct fx_exp){w[i], 0, 1u << i, 1u << i};
    }
    fx_expect(f, __LINE__, c, 512, e, 10);
    for (uint32_t i = 0; i < 10; i++)
        e[i].depth = FX_MIN(1u << i, 100u);
    fx_expect(f, __LINE__, c, 100, e, 10);
    /* a result buffer smaller than the result: the count is still complete */
    CHECK_EQ(fx_find(f->ix, c, 512, fx_out, 3), 10);
    CHECK_EQ(fx_find(f->ix, c, 512, fx_out, 0), 10);
}

static void snap_add_chain(struct fx_snap *s, uint64_t id, uint32_t rank, enum kvi_tier tier, const uint64_t *chain,
                           size_t from, size_t to)
{
    uint64_t *sq = fx_seqs(chain, to);
    for (size_t i = from; i < to; i++) {
        if (s->n == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 64;
            s->t = realloc(s->t, s->cap * sizeof *s->t);
            assert_non_null(s->t);
        }
        s->t[s->n++] = (struct fx_tuple){.id = id,
                                         .rank = rank,
                                         .tier = (uint32_t)tier,
                                         .has_parent = i > 0,
                                         .eh = sq[i],
                                         .ch = chain[i],
                                         .peh = i > 0 ? sq[i - 1] : 0,
                                         .pos = (uint32_t)i,
                                         .seq = sq[i]};
    }
    free(sq);
    qsort(s->t, s->n, sizeof *s->t, fx_cmp_tuple);
}

/* 6.5.7 dump and restore: W0 [1,2,3], W1 [1,2,4]; dump, replay into a fresh
 * index -> equal snapshots (and equal answers). */
SCENARIO(s07_dump_restore, 32)
{
    drop_probe(f);
    uint64_t a[3] = {1, 2, 3}, b[3] = {1, 2, 4};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, a, 0, 3);
    STORE(f, w1, b, 0, 3);
    /* the snapshot is exactly the six stored blocks */
    struct fx_snap want = {0}, got;
    snap_add_chain(&want, 0, 0, KVI_TIER_GPU, a, 0, 3);
    snap_add_chain(&want, 1, 0, KVI_TIER_GPU, b, 0, 3);
    fx_snapshot(f->ix, __LINE__, &got);
    fx_snap_equal(__LINE__, &want, &got, "dump of W0 [1,2,3] + W1 [1,2,4]");
    CHECK_EQ(got.order_errors, 0);
    fx_snap_free(&got);
    fx_snap_free(&want);
    const struct fx_q qs[] = {{a, 3}, {b, 3}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
}

/* 6.5.8 positional dump form: a lower-tier store at start position 10 dumps as
 * single blocks with positions 10 and 11 (the first without a parent); the
 * Dynamo form (two single-block events with null parents) as well; replay gives
 * an equal snapshot and equal answers. */
SCENARIO(s08_positional_dump, 32)
{
    f->tiered_same = false;
    drop_probe(f);
    uint64_t c[12];
    fx_range(c, 12, 1);
    uint64_t *s = fx_seqs(c, 12);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 10);
    STORE(f, w1, c, 0, 10);
    struct kvi_block b[2] = {{0xa10, 11}, {0xa11, 12}};
    /* W0: one event of two blocks at position 10 */
    CHECK_EQ(kvi_index_store_seq(f->ix, w0, 0, KVI_TIER_CPU, false, 0, 10, b, s + 10, 2), 0);
    /* W1: two single-block events with null parents at positions 10 and 11 */
    CHECK_EQ(kvi_index_store_seq(f->ix, w1, 0, KVI_TIER_CPU, false, 0, 10, &b[0], s + 10, 1), 0);
    CHECK_EQ(kvi_index_store_seq(f->ix, w1, 0, KVI_TIER_CPU, false, 0, 11, &b[1], s + 11, 1), 0);

    struct fx_snap got;
    fx_snapshot(f->ix, __LINE__, &got);
    int seen = 0;
    for (size_t i = 0; i < got.n; i++) {
        const struct fx_tuple *t = &got.t[i];
        if (t->tier != KVI_TIER_CPU)
            continue;
        seen++;
        CHECK(t->eh == 0xa10 || t->eh == 0xa11);
        uint32_t want_pos = t->eh == 0xa10 ? 10 : 11;
        CHECK_EQ(t->pos, want_pos);
        CHECK_EQ(t->seq, s[want_pos]);
        CHECK_EQ(t->ch, c[want_pos]);
        if (t->eh == 0xa10 || t->id == 1)
            CHECK_EQ(t->has_parent, 0); /* position 10, and both of W1's single-block events */
        else
            CHECK(t->has_parent == 1 && t->peh == 0xa10); /* W0's block 11 is linked to block 10 of its event */
    }
    CHECK_EQ(seen, 4);
    fx_snap_free(&got);

    /* by seq, both walk gpu 10 then cpu 10 and 11 */
    TIERED_SEQ(f, s, 12, {w0, 0, 10, 12, 12, 10}, {w1, 0, 10, 12, 12, 10});
    const struct fx_q qs[] = {{c, 12}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* 6.5.9 clear: a clear for W0 leaves only W1; clear then re-store works. */
SCENARIO(s09_clear, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 3);
    STORE(f, w1, c, 0, 3);
    uint64_t slots = stats_of(f).slots;
    kvi_index_clear(f->ix, w0);
    EXPECT(f, c, 3, {w1, 0, 3, 3});
    CHECK_EQ(fx_tree(f, w0, 0), 0);
    CHECK_EQ(stats_of(f).slots, slots); /* the worker stays known */
    CHECK_EQ(kvi_index_find_instance(f->ix, 0, NULL), w0);
    kvi_index_clear(f->ix, w0); /* twice is fine */
    STORE(f, w0, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3}, {w1, 0, 3, 3});
}

/* 6.5.10 clear with dp ranks: a clear of W0 removes all its ranks. */
SCENARIO(s10_clear_dp_ranks, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    for (uint32_t r = 0; r < 3; r++)
        STORE_AT(f, w0, r, KVI_TIER_GPU, c, 0, 3);
    STORE(f, w1, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3}, {w0, 1, 3, 3}, {w0, 2, 3, 3}, {w1, 0, 3, 3});
    uint64_t slots = stats_of(f).slots;
    kvi_index_clear(f->ix, w0);
    EXPECT(f, c, 3, {w1, 0, 3, 3});
    for (uint32_t r = 0; r < 3; r++)
        CHECK_EQ(fx_tree(f, w0, r), 0);
    CHECK_EQ(stats_of(f).slots, slots);
    STORE_AT(f, w0, 1, KVI_TIER_GPU, c, 0, 2);
    EXPECT(f, c, 3, {w0, 1, 2, 2}, {w1, 0, 3, 3});
}

/* 6.5.11 empty and miss: an empty query and a query nobody holds score nothing. */
SCENARIO(s11_empty_and_miss, 32)
{
    uint64_t c[3] = {1, 2, 3}, miss[2] = {7, 8};
    EXPECT_NONE(f, c, 3); /* empty index */
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    EXPECT_NONE(f, c, 0);
    EXPECT_NONE(f, miss, 2);
    CHECK_EQ(fx_tiered(f->ix, c, NULL, 0, fx_tout, FX_MAX_OUT), 0);
    CHECK_EQ(fx_tiered(f->ix, NULL, c, 0, fx_tout, FX_MAX_OUT), 0);
}

/* 6.5.12 shutdown works, and "twice" is fine (destroy(NULL) is a no-op). */
SCENARIO(s12_shutdown, 32)
{
    struct fx g;
    fx_open(&g, f->cfg, f->bs);
    fx_close(&g);
    fx_open(&g, f->cfg, f->bs);
    uint64_t c[100];
    fx_range(c, 100, 1);
    uint32_t w = fx_w(&g, 5);
    STORE(&g, w, c, 0, 100);
    CHECK_EQ(fx_remove_tier(&g, w, 0, KVI_TIER_GPU, c, 50, 51, false), 1);
    EXPECT(&g, c, 100, {w, 0, 50, 50});
    fx_close(&g);
    kvi_index_destroy(NULL);
    kvi_index_destroy(NULL);
}

/* 6.5.13 parent chains: [1,2,3], then [4,5] with parent = block 3. */
SCENARIO(s13_parent_chains, 32)
{
    uint64_t c[5] = {1, 2, 3, 4, 5};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    STORE(f, w0, c, 3, 5);
    EXPECT(f, c, 5, {w0, 0, 5, 5});
    EXPECT(f, c, 3, {w0, 0, 3, 5});
    EXPECT_NONE(f, c + 3, 2);
}

/* 6.5.14 dp ranks: W0 stores [1,2,3] under ranks 0, 1, 2 -> three entries. */
SCENARIO(s14_dp_ranks, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0);
    for (uint32_t r = 0; r < 3; r++)
        STORE_AT(f, w0, r, KVI_TIER_GPU, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3}, {w0, 1, 3, 3}, {w0, 2, 3, 3});
    /* the ranks are independent */
    CHECK_EQ(fx_remove_tier(f, w0, 1, KVI_TIER_GPU, c, 2, 3, false), 1);
    EXPECT(f, c, 3, {w0, 0, 3, 3}, {w0, 1, 2, 2}, {w0, 2, 3, 3});
}

/* 6.5.15 tail removal: remove block 3 -> [1,2,3] scores 2. */
SCENARIO(s15_tail_removal, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    CHECK_EQ(REMOVE(f, w0, c, 2, 3), 1);
    EXPECT(f, c, 3, {w0, 0, 2, 2});
}

/* 6.5.16 mid-chain removal orphans descendants; re-store of 3 gives 3, not 5. */
SCENARIO(s16_mid_chain_removal, 32)
{
    uint64_t c[5] = {1, 2, 3, 4, 5};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 5);
    CHECK_EQ(REMOVE(f, w0, c, 2, 3), 1);
    EXPECT(f, c, 5, {w0, 0, 2, 2});
    EXPECT(f, c, 2, {w0, 0, 2, 2});
    STORE(f, w0, c, 2, 3);
    EXPECT(f, c, 5, {w0, 0, 3, 3});
    CHECK_EQ(REMOVE(f, w0, c, 3, 5), 0); /* 4 and 5 are gone for good */
    STORE(f, w0, c, 3, 5);
    EXPECT(f, c, 5, {w0, 0, 5, 5});
}

/* 6.5.17 unknown removes change nothing and do not fail. */
SCENARIO(s17_unknown_removes, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0), w9 = fx_w(f, 9);
    STORE(f, w0, c, 0, 3);
    struct fx_snap s0;
    fx_snapshot(f->ix, __LINE__, &s0);
    struct kvi_index_stats st0 = stats_of(f);
    uint64_t bogus[3] = {777, 888, 999};
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_GPU, bogus, 3), 0);
    CHECK_EQ(kvi_index_remove(f->ix, w9, 0, KVI_TIER_GPU, bogus, 3), 0); /* known worker, no slot */
    CHECK_EQ(kvi_index_remove(f->ix, 4000, 0, KVI_TIER_GPU, bogus, 3), 0); /* never interned */
    CHECK_EQ(kvi_index_remove(f->ix, w0, 7, KVI_TIER_GPU, bogus, 1), 0);  /* unknown rank */
    uint64_t s3 = fx_eh(c, 2);
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_CPU, &s3, 1), 0);  /* known hash, other tier */
    CHECK_EQ(kvi_index_remove(f->ix, w0, 1, KVI_TIER_GPU, &s3, 1), 0);  /* known hash, other rank */
    CHECK_EQ(kvi_index_remove(f->ix, w9, 0, KVI_TIER_GPU, &s3, 1), 0);  /* known hash, other worker */
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, (enum kvi_tier)9, &s3, 1), 0);
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_GPU, bogus, 0), 0);
    kvi_index_clear(f->ix, 4000);
    kvi_index_remove_dp_rank(f->ix, 4000, 0);
    kvi_index_remove_instance(f->ix, 4000);
    kvi_index_clear(f->ix, w9);
    kvi_index_remove_dp_rank(f->ix, w9, 0);
    kvi_index_remove_dp_rank(f->ix, w0, 5);
    kvi_index_remove_instance(f->ix, w9);
    fx_expect_snap(f, __LINE__, &s0, "after unknown removes");
    EXPECT(f, c, 3, {w0, 0, 3, 3});
    struct kvi_index_stats st1 = stats_of(f);
    CHECK_EQ(st1.entries, st0.entries);
    CHECK_EQ(st1.holdings, st0.holdings);
    CHECK_EQ(st1.slots, st0.slots);
    CHECK_EQ(st1.removed_blocks, st0.removed_blocks);
    CHECK(st1.unknown_removes >= st0.unknown_removes + 3);
    fx_snap_free(&s0);
}

/* 6.5.18 two sequences per worker. */
SCENARIO(s18_two_sequences, 32)
{
    uint64_t a[3] = {1, 2, 3}, b[3] = {100, 101, 102};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, a, 0, 3);
    STORE(f, w0, b, 0, 3);
    EXPECT(f, a, 3, {w0, 0, 3, 6});
    EXPECT(f, b, 3, {w0, 0, 3, 6});
    uint64_t m1[2] = {1, 100}, m2[2] = {100, 1}, m3[3] = {100, 101, 3};
    EXPECT(f, m1, 2, {w0, 0, 1, 6});
    EXPECT(f, m2, 2, {w0, 0, 1, 6});
    EXPECT(f, m3, 3, {w0, 0, 2, 6});
}

/* 6.5.19 LoRA isolation: the same tokens under base, adapter-a and adapter-b
 * (kvi_hash_seed / kvi_hash_blocks) never match each other. */
SCENARIO(s19_lora_isolation, 32)
{
    uint32_t tok[96];
    for (uint32_t i = 0; i < 96; i++)
        tok[i] = 1000 + i;
    uint64_t seeds[3] = {kvi_hash_seed(NULL, 0, NULL, 0), kvi_hash_seed("adapter-a", 9, NULL, 0),
                         kvi_hash_seed("adapter-b", 9, NULL, 0)};
    CHECK_EQ(seeds[0], KVI_HASH_SEED);
    CHECK_EQ(kvi_hash_seed("", 0, NULL, 0), KVI_HASH_SEED);
    uint64_t h[3][3];
    for (int k = 0; k < 3; k++)
        CHECK_EQ(kvi_hash_blocks(tok, 96, f->bs, seeds[k], h[k], 3), 3);
    for (int k = 0; k < 3; k++)
        for (int l = k + 1; l < 3; l++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++)
                    CHECK(h[k][i] != h[l][j]);
    uint32_t w[4] = {fx_w(f, 0), fx_w(f, 1), fx_w(f, 2), fx_w(f, 3)};
    STORE(f, w[0], h[0], 0, 3);
    STORE(f, w[1], h[1], 0, 3);
    STORE(f, w[2], h[2], 0, 3);
    STORE(f, w[3], h[0], 0, 3); /* a second base-model worker */
    EXPECT(f, h[0], 3, {w[0], 0, 3, 3}, {w[3], 0, 3, 3});
    EXPECT(f, h[1], 3, {w[1], 0, 3, 3});
    EXPECT(f, h[2], 3, {w[2], 0, 3, 3});
    uint64_t mixed[2] = {h[0][0], h[1][1]};
    EXPECT(f, mixed, 2, {w[0], 0, 1, 3}, {w[3], 0, 1, 3});
}

/* 6.5.20 long sequence: 128 blocks in one store. */
SCENARIO(s20_long_sequence, 32)
{
    uint64_t c[128], q[128];
    fx_range(c, 128, 1);
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 128);
    EXPECT(f, c, 128, {w0, 0, 128, 128});
    EXPECT(f, c, 64, {w0, 0, 64, 128});
    memcpy(q, c, sizeof q);
    q[49] = 999999;
    EXPECT(f, q, 128, {w0, 0, 49, 128});
    memcpy(q, c, sizeof q);
    q[127] = 999999;
    EXPECT(f, q, 128, {w0, 0, 127, 128});
}

/* 6.5.21 continuations: 1-50, 51-100, 101-150 chained -> 150; a query starting
 * at block 45 scores nothing. */
SCENARIO(s21_continuations, 32)
{
    uint64_t c[150];
    fx_range(c, 150, 1);
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 50);
    STORE(f, w0, c, 50, 100);
    STORE(f, w0, c, 100, 150);
    EXPECT(f, c, 150, {w0, 0, 150, 150});
    EXPECT(f, c, 100, {w0, 0, 100, 150});
    EXPECT_NONE(f, c + 44, 106);
}

/* 6.5.22 branching: shared prefix 1-30; W0 continues 31-60, W1 131-160. */
SCENARIO(s22_branching, 32)
{
    uint64_t a[60], b[60];
    fx_range(a, 60, 1);
    fx_range(b, 30, 1);
    fx_range(b + 30, 30, 131);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, a, 0, 30);
    STORE(f, w0, a, 30, 60);
    STORE(f, w1, b, 0, 30);
    STORE(f, w1, b, 30, 60);
    EXPECT(f, a, 30, {w0, 0, 30, 60}, {w1, 0, 30, 60});
    EXPECT(f, a, 60, {w0, 0, 60, 60}, {w1, 0, 30, 60});
    EXPECT(f, b, 60, {w0, 0, 30, 60}, {w1, 0, 60, 60});
}

/* 6.5.23 tail range removal: remove blocks 80-100 (1-based) of 100 -> 79. */
SCENARIO(s23_tail_range_removal, 32)
{
    uint64_t c[100];
    fx_range(c, 100, 1);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 100);
    STORE(f, w1, c, 0, 100);
    CHECK_EQ(REMOVE_REV(f, w0, c, 79, 100), 21);
    CHECK(fx_remove_tier(f, w1, 0, KVI_TIER_GPU, c, 79, 100, false) >= 1);
    EXPECT(f, c, 100, {w0, 0, 79, 79}, {w1, 0, 79, 79});
}

/* 6.5.24 staggered workers: 100, 75, 50, 25 blocks, query 60 -> 60, 60, 50, 25. */
SCENARIO(s24_staggered_workers, 32)
{
    uint64_t c[100];
    fx_range(c, 100, 1);
    uint32_t w[4];
    const uint32_t len[4] = {100, 75, 50, 25};
    for (int i = 0; i < 4; i++) {
        w[i] = fx_w(f, (uint64_t)i);
        STORE(f, w[i], c, 0, len[i]);
    }
    EXPECT(f, c, 60, {w[0], 0, 60, 100}, {w[1], 0, 60, 75}, {w[2], 0, 50, 50}, {w[3], 0, 25, 25});
}

/* Interesting chain lengths / divergence points: around every multiple of the
 * jump sizes 1, 2, 7, 32, 64 up to 200, and the chain's end. */
static const uint32_t k_lens[] = {1,  2,  3,  4,  5,  6,  7,   8,   9,   13,  14,  15,  16,  17,  21,  31, 32,
                                  33, 63, 64, 65, 66, 95, 96,  97,  127, 128, 129, 130, 191, 192, 193, 198, 199,
                                  200};
#define JN 200u

/* 6.5.25 jump boundaries: chains ending on, just before and just after jump
 * boundaries score exactly; so do divergences and removals exactly at a
 * boundary, and many workers draining inside one jump (bisection). */
SCENARIO(s25_jump_boundaries, 32)
{
    uint64_t c[JN + 40], q[JN + 40];
    fx_range(c, JN + 40, 1);
    const size_t nl = ARRAY_LEN(k_lens);
    struct fx_exp e[ARRAY_LEN(k_lens) + 1];
    uint32_t w[ARRAY_LEN(k_lens)];

    /* A: one worker per chain length, queried with every interesting length */
    for (size_t i = 0; i < nl; i++) {
        w[i] = fx_w(f, 100 + i);
        STORE(f, w[i], c, 0, k_lens[i]);
    }
    for (size_t qi = 0; qi <= nl; qi++) {
        size_t qn = qi < nl ? k_lens[qi] : JN + 40;
        for (size_t i = 0; i < nl; i++)
            e[i] = (struct fx_exp){w[i], 0, (uint32_t)FX_MIN(k_lens[i], qn), k_lens[i]};
        fx_expect(f, __LINE__, c, qn, e, nl);
    }

    /* B: one worker with JN blocks; the query diverges at d */
    fx_reset(f);
    uint32_t v = fx_w(f, 1);
    STORE(f, v, c, 0, JN);
    for (size_t i = 0; i <= nl; i++) {
        uint32_t d = i < nl ? k_lens[i] : 0;
        if (d >= JN)
            continue;
        memcpy(q, c, sizeof q);
        q[d] = 5000000 + d;
        if (d == 0) {
            EXPECT_NONE(f, q, JN);
            continue;
        }
        EXPECT(f, q, JN, {v, 0, d, JN});
        EXPECT(f, q, JN + 40, {v, 0, d, JN});
        EXPECT(f, q, d + 1, {v, 0, d, JN});
    }

    /* C: workers branching off one chain at every interesting point */
    fx_reset(f);
    uint32_t full = fx_w(f, 1);
    STORE(f, full, c, 0, JN);
    uint64_t *br[ARRAY_LEN(k_lens)] = {NULL};
    size_t nb = 0;
    uint32_t blen[ARRAY_LEN(k_lens)];
    for (size_t i = 0; i < nl; i++) {
        if (k_lens[i] >= JN)
            continue;
        blen[nb] = k_lens[i];
        br[nb] = xalloc_u64(blen[nb] + 10);
        memcpy(br[nb], c, blen[nb] * sizeof(uint64_t));
        fx_range(br[nb] + blen[nb], 10, 9000000 + 100 * nb);
        w[nb] = fx_w(f, 200 + nb);
        STORE(f, w[nb], br[nb], 0, blen[nb] + 10);
        nb++;
    }
    for (size_t i = 0; i < nb; i++)
        e[i] = (struct fx_exp){w[i], 0, blen[i], blen[i] + 10};
    e[nb] = (struct fx_exp){full, 0, JN, JN};
    fx_expect(f, __LINE__, c, JN, e, nb + 1);
    for (size_t k = 0; k < nb; k++) { /* query along branch k */
        for (size_t i = 0; i < nb; i++)
            e[i] = (struct fx_exp){w[i], 0, i == k ? blen[k] + 10 : FX_MIN(blen[i], blen[k]), blen[i] + 10};
        e[nb] = (struct fx_exp){full, 0, blen[k], JN};
        fx_expect(f, __LINE__, br[k], blen[k] + 10, e, nb + 1);
    }
    for (size_t i = 0; i < nb; i++)
        free(br[i]);

    /* D: mid-chain removal exactly at the interesting points */
    fx_reset(f);
    nb = 0;
    for (size_t i = 0; i < nl; i++) {
        if (k_lens[i] >= JN)
            continue;
        w[nb] = fx_w(f, 300 + nb);
        STORE(f, w[nb], c, 0, JN);
        CHECK_EQ(fx_remove_tier(f, w[nb], 0, KVI_TIER_GPU, c, k_lens[i], k_lens[i] + 1, false), 1);
        e[nb] = (struct fx_exp){w[nb], 0, k_lens[i], k_lens[i]};
        nb++;
    }
    fx_expect(f, __LINE__, c, JN, e, nb);
    fx_expect(f, __LINE__, c, JN + 40, e, nb);
}

/* 6.5.26 many continuations: 20 continuations of 10 blocks -> 200; 75 -> 75. */
SCENARIO(s26_many_continuations, 32)
{
    uint64_t c[200];
    fx_range(c, 200, 1);
    uint32_t w0 = fx_w(f, 0);
    for (size_t k = 0; k < 20; k++)
        STORE(f, w0, c, 10 * k, 10 * k + 10);
    EXPECT(f, c, 200, {w0, 0, 200, 200});
    EXPECT(f, c, 75, {w0, 0, 75, 200});
}

/* 6.5.27 clear and rebuild with a different sequence. */
SCENARIO(s27_clear_and_rebuild, 32)
{
    uint64_t a[100], b[100];
    fx_range(a, 100, 1);
    fx_range(b, 100, 1001);
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, a, 0, 100);
    kvi_index_clear(f->ix, w0);
    STORE(f, w0, b, 0, 100);
    EXPECT(f, b, 100, {w0, 0, 100, 100});
    EXPECT_NONE(f, a, 100);
}

/* 6.5.28 shared 40-block prefix then divergence. */
SCENARIO(s28_shared_prefix_divergence, 32)
{
    uint64_t a[100], b[100], d[100];
    fx_range(a, 100, 1);
    fx_range(b, 40, 1);
    fx_range(b + 40, 60, 2001);
    fx_range(d, 40, 1);
    fx_range(d + 40, 60, 3001);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1), w2 = fx_w(f, 2);
    STORE(f, w0, a, 0, 100);
    STORE(f, w1, b, 0, 100);
    STORE(f, w2, d, 0, 100);
    EXPECT(f, a, 100, {w0, 0, 100, 100}, {w1, 0, 40, 100}, {w2, 0, 40, 100});
    EXPECT(f, b, 100, {w0, 0, 40, 100}, {w1, 0, 100, 100}, {w2, 0, 40, 100});
}

/* 6.5.29 staggered lengths 10, 20, 35, 64, 100. */
SCENARIO(s29_staggered_lengths, 32)
{
    uint64_t c[100];
    fx_range(c, 100, 1);
    const uint32_t len[5] = {10, 20, 35, 64, 100};
    uint32_t w[5];
    for (int i = 0; i < 5; i++) {
        w[i] = fx_w(f, 10 + (uint64_t)i);
        STORE(f, w[i], c, 0, len[i]);
    }
    EXPECT(f, c, 100, {w[0], 0, 10, 10}, {w[1], 0, 20, 20}, {w[2], 0, 35, 35}, {w[3], 0, 64, 64},
           {w[4], 0, 100, 100});
}

/* 6.5.30 1000-block sequence. */
SCENARIO(s30_thousand_blocks, 32)
{
    enum { N = 1000 };
    uint64_t *c = xalloc_u64(N), *q = xalloc_u64(N);
    fx_range(c, N, 1);
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, N);
    EXPECT(f, c, N, {w0, 0, N, N});
    EXPECT(f, c, 500, {w0, 0, 500, N});
    const uint32_t div[] = {499, 1, 511, 512, 513, 999};
    for (size_t i = 0; i < ARRAY_LEN(div); i++) {
        memcpy(q, c, N * sizeof *q);
        q[div[i]] = 77777777;
        EXPECT(f, q, N, {w0, 0, div[i], N});
    }
    free(c);
    free(q);
}

/* 6.5.31 idempotence: add/remove cycles restore the original snapshot. */
SCENARIO(s31_idempotence, 32)
{
    uint64_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[4] = {1, 2, 3, 60};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, a, 0, 3);
    STORE(f, w1, a, 0, 2);
    struct fx_snap s0;
    fx_snapshot(f->ix, __LINE__, &s0);
    for (int round = 0; round < 2; round++) { /* interleaved, twice */
        STORE(f, w0, a, 3, 5);
        CHECK_EQ(REMOVE(f, w0, a, 3, 4), 1);
        STORE(f, w0, b, 3, 4);
        STORE(f, w1, a, 2, 4);
        CHECK_EQ(REMOVE(f, w0, b, 3, 4), 1);
        CHECK_EQ(REMOVE_REV(f, w1, a, 2, 4), 2);
        fx_expect_snap(f, __LINE__, &s0, "after an interleaved add/remove cycle");
    }
    /* all adds, then all removes */
    STORE(f, w0, a, 3, 5);
    STORE(f, w0, b, 3, 4);
    STORE(f, w0, a, 5, 8);
    STORE(f, w1, a, 2, 8);
    CHECK_EQ(REMOVE(f, w0, a, 3, 4), 1); /* cascades 4..8 */
    CHECK_EQ(REMOVE(f, w0, b, 3, 4), 1);
    CHECK_EQ(REMOVE_REV(f, w1, a, 2, 8), 6);
    fx_expect_snap(f, __LINE__, &s0, "after all adds then all removes");
    EXPECT(f, a, 8, {w0, 0, 3, 3}, {w1, 0, 2, 2});
    fx_snap_free(&s0);
}

/* 6.5.32 tree sizes (section 4): stable under replayed stores and removes. */
SCENARIO(s32_tree_sizes, 32)
{
    uint64_t c[5] = {1, 2, 3, 4, 5};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3});
    struct fx_snap s3, s5;
    fx_snapshot(f->ix, __LINE__, &s3);
    struct kvi_index_stats st = stats_of(f);
    STORE(f, w0, c, 0, 3); /* replay */
    EXPECT(f, c, 3, {w0, 0, 3, 3});
    fx_expect_snap(f, __LINE__, &s3, "after a replayed store");
    CHECK_EQ(stats_of(f).stored_blocks, st.stored_blocks);
    CHECK_EQ(stats_of(f).holdings, st.holdings);
    STORE(f, w0, c, 3, 5);
    EXPECT(f, c, 5, {w0, 0, 5, 5});
    fx_snapshot(f->ix, __LINE__, &s5);
    STORE(f, w0, c, 3, 5);
    STORE(f, w0, c, 0, 5);
    EXPECT(f, c, 5, {w0, 0, 5, 5});
    fx_expect_snap(f, __LINE__, &s5, "after replayed continuation");
    CHECK(REMOVE(f, w0, c, 3, 5) >= 1);
    EXPECT(f, c, 5, {w0, 0, 3, 3});
    fx_expect_snap(f, __LINE__, &s3, "after removing the continuation");
    CHECK_EQ(REMOVE(f, w0, c, 3, 5), 0); /* replayed remove */
    EXPECT(f, c, 5, {w0, 0, 3, 3});
    CHECK_EQ(fx_tree(f, w0, 0), 3);
    CHECK(REMOVE(f, w0, c, 0, 3) >= 1);
    EXPECT_NONE(f, c, 5);
    CHECK_EQ(fx_tree(f, w0, 0), 0);
    CHECK_EQ(REMOVE(f, w0, c, 0, 3), 0); /* duplicate remove */
    EXPECT_NONE(f, c, 5);
    CHECK_EQ(fx_tree(f, w0, 0), 0);
    fx_snap_free(&s3);
    fx_snap_free(&s5);
}

/* 6.5.33 middle re-store: remove block 2 of [1,2,3], re-store [2,3] under [1]. */
SCENARIO(s33_middle_restore, 32)
{
    uint64_t c[3] = {1, 2, 3};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    CHECK_EQ(REMOVE(f, w0, c, 1, 2), 1);
    EXPECT(f, c, 3, {w0, 0, 1, 1});
    STORE(f, w0, c, 1, 3);
    EXPECT(f, c, 3, {w0, 0, 3, 3});
}

/* 6.5.34 snapshot after middle removal equals "store W0 [1]". */
SCENARIO(s34_snapshot_after_middle_removal, 32)
{
    uint64_t c[5] = {1, 2, 3, 4, 5};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 5);
    CHECK_EQ(REMOVE(f, w0, c, 1, 2), 1);
    struct fx g;
    fx_open(&g, f->cfg, f->bs);
    uint32_t g0 = fx_w(&g, 0);
    STORE(&g, g0, c, 0, 1);
    struct fx_snap want;
    fx_snapshot(g.ix, __LINE__, &want);
    fx_expect_snap(f, __LINE__, &want, "W0 [1..5] minus block 2 vs W0 [1]");
    fx_snap_free(&want);
    fx_close(&g);
    EXPECT(f, c, 5, {w0, 0, 1, 1});
}

/* 6.5.35 cleanup: removing two sibling continuations leaves nothing behind
 * (kvidx frees entries eagerly; kvi_index_reclaim recycles the memory) and
 * changes neither the snapshot nor any score. */
SCENARIO(s35_cleanup, 32)
{
    uint64_t a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 2, 3, 6, 7};
    uint32_t w0 = fx_w(f, 0);
    struct kvi_index_stats st0 = stats_of(f);
    STORE(f, w0, a, 0, 3);
    struct fx_snap s0;
    fx_snapshot(f->ix, __LINE__, &s0);
    STORE(f, w0, a, 3, 5);
    STORE(f, w0, b, 3, 5);
    CHECK_EQ(stats_of(f).entries, st0.entries + 7);
    CHECK_EQ(REMOVE(f, w0, a, 3, 4), 1);
    CHECK_EQ(REMOVE(f, w0, b, 3, 4), 1);
    CHECK_EQ(stats_of(f).entries, st0.entries + 3);
    CHECK_EQ(stats_of(f).holdings, st0.holdings + 3);
    fx_expect_snap(f, __LINE__, &s0, "after removing both continuations");
    EXPECT(f, a, 5, {w0, 0, 3, 3});
    EXPECT(f, b, 5, {w0, 0, 3, 3});
    fx_reclaim_all(f);
    fx_expect_snap(f, __LINE__, &s0, "after reclaim");
    EXPECT(f, a, 5, {w0, 0, 3, 3});
    EXPECT(f, b, 5, {w0, 0, 3, 3});
    CHECK_EQ(stats_of(f).entries, st0.entries + 3);
    /* recycled entries work */
    STORE(f, w0, b, 3, 5);
    STORE(f, w0, a, 3, 5);
    EXPECT(f, a, 5, {w0, 0, 5, 7});
    EXPECT(f, b, 5, {w0, 0, 5, 7});
    fx_snap_free(&s0);
}

/* 6.5.36 / 6.5.37 (frequencies, routing decisions) are optional approximate
 * modes that the positional index does not implement: not tested. */

/* 6.5.38 tiers, Dynamo shape: block size 4; W7 and W8 store [11,12] on gpu, W7
 * [13] on cpu under [12]. Query [11,12,13]: W7 gpu 8 cpu 12 disk 12 tokens,
 * W8 8/8/8. */
SCENARIO(s38_tiers_dynamo, 4)
{
    f->tiered_same = false;
    uint64_t c[4] = {11, 12, 13, 14};
    uint32_t w7 = fx_w(f, 7), w8 = fx_w(f, 8);
    STORE(f, w7, c, 0, 2);
    STORE(f, w8, c, 0, 2);
    STORE_AT(f, w7, 0, KVI_TIER_CPU, c, 2, 3);
    EXPECT(f, c, 3, {w7, 0, 2, 2}, {w8, 0, 2, 2}); /* scores: 2 blocks = 8 tokens each */
    CHECK_EQ(2 * kvi_index_block_size(f->ix), 8);
    TIERED(f, c, 3, {w7, 0, 2, 3, 3, 2}, {w8, 0, 2, 2, 2, 2});
    /* external folds into disk */
    STORE_AT(f, w7, 0, KVI_TIER_EXTERNAL, c, 3, 4);
    TIERED(f, c, 4, {w7, 0, 2, 3, 4, 2}, {w8, 0, 2, 2, 2, 2});
    EXPECT(f, c, 4, {w7, 0, 2, 2}, {w8, 0, 2, 2});
    const struct fx_q qs[] = {{c, 4}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
}

/* 6.5.39 tiers, Conductor shape: A rank 0 holds [1,2] on gpu; a shared cpu pool
 * holds [3,4]; a shared disk pool holds [5]; B holds nothing. Query [1..6]:
 * A -> gpu 2, cpu 4, disk 5 blocks. B has no hit on any tier, so the engine
 * result omits it: the service adds a zero row for every registered (instance,
 * rank) in the Conductor dialect. The pools hold blocks at positions > 0 with
 * no parent known to them: they store by position and standard seq hashes. */
SCENARIO(s39_tiers_conductor, 16)
{
    f->tiered_same = false;
    uint64_t c[6] = {1, 2, 3, 4, 5, 6};
    uint64_t *s = fx_seqs(c, 6);
    uint32_t a = fx_w(f, 1), b = fx_w(f, 2);
    uint32_t pc = fx_inst(f, 100, true), pd = fx_inst(f, 101, true);
    bool sh = false;
    CHECK_EQ(kvi_index_instance_info(f->ix, pc, NULL, NULL, &sh), 0);
    CHECK(sh);
    STORE(f, a, c, 0, 2);
    struct kvi_block cpu[2] = {{0xc3, 3}, {0xc4, 4}}, disk[1] = {{0xd5, 5}};
    CHECK_EQ(kvi_index_store_seq(f->ix, pc, 0, KVI_TIER_CPU, false, 0, 2, cpu, s + 2, 2), 0);
    CHECK_EQ(kvi_index_store_seq(f->ix, pd, 0, KVI_TIER_DISK, false, 0, 4, disk, s + 4, 1), 0);
    (void)b;
    EXPECT(f, c, 6, {a, 0, 2, 2});
    TIERED_CONTENT(f, c, 6, {a, 0, 2, 4, 5, 2});
    TIERED_SEQ(f, s, 6, {a, 0, 2, 4, 5, 2});
    const struct fx_q qs[] = {{c, 6}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));

    free(s);
}

/* Conductor shape with the pools holding the chain from its root (position 0,
 * so placed by content): every instance may use them, including B with no gpu
 * hit at all -> B 0/4/5. */
SCENARIO(tiers_conductor_root_pools, 16)
{
    f->tiered_same = false;
    drop_probe(f); /* the probe instance would be entitled to the pools too */
    uint64_t c[6] = {1, 2, 3, 4, 5, 6}, other[1] = {9};
    uint32_t a = fx_w(f, 1), b = fx_w(f, 2);
    uint32_t pc = fx_inst(f, 100, true), pd = fx_inst(f, 101, true);
    STORE(f, a, c, 0, 2);
    STORE_AT(f, pc, 0, KVI_TIER_CPU, c, 0, 4);
    STORE_AT(f, pd, 0, KVI_TIER_DISK, c, 0, 5);
    STORE(f, b, other, 0, 1); /* B holds an unrelated block */
    EXPECT(f, c, 6, {a, 0, 2, 2});
    TIERED(f, c, 6, {a, 0, 2, 4, 5, 2}, {b, 0, 0, 4, 5, 1});
    const struct fx_q qs[] = {{c, 6}, {other, 1}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
}

/*
 * An instance whose gpu slot is empty (it stored and removed a block) gets no
 * engine row, exactly like an instance that never stored anything, so a dump
 * (which lists no blocks for it) replays to the same answers (section 5).
 * Conductor's zero rows for registered instances are the service's job:
 * kvi_index_pool_depths gives the depths the shared pools alone reach (4/5).
 */
SCENARIO(tiers_empty_slot_round_trip, 16)
{
    f->tiered_same = false;
    drop_probe(f);
    uint64_t c[6] = {1, 2, 3, 4, 5, 6}, nine[1] = {9};
    uint32_t a = fx_w(f, 1), b = fx_w(f, 2);
    uint32_t pc = fx_inst(f, 100, true), pd = fx_inst(f, 101, true);
    STORE(f, a, c, 0, 2);
    STORE_AT(f, pc, 0, KVI_TIER_CPU, c, 0, 4);
    STORE_AT(f, pd, 0, KVI_TIER_DISK, c, 0, 5);
    STORE(f, b, nine, 0, 1);
    CHECK_EQ(REMOVE(f, b, nine, 0, 1), 1);
    TIERED(f, c, 6, {a, 0, 2, 4, 5, 2});
    (void)b;
    uint32_t pc4 = 0, pd5 = 0;
    kvi_rcu_read_lock();
    kvi_index_pool_depths(f->ix, c, NULL, 6, &pc4, &pd5);
    kvi_rcu_read_unlock();
    CHECK_EQ(pc4, 4);
    CHECK_EQ(pd5, 5);
    const struct fx_q qs[] = {{c, 6}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
}

/* ======================================================================== */
/* tiers (section 3.2) beyond the two reference shapes                       */
/* ======================================================================== */

/* Cumulative walk g <= c <= d: tiers extend the gpu prefix, in order, per rank. */
SCENARIO(tiers_cumulative_rules, 16)
{
    f->tiered_same = false;
    uint64_t c[5] = {11, 12, 13, 14, 15}, other[1] = {13};
    uint32_t w9 = fx_w(f, 9), w10 = fx_w(f, 10), w11 = fx_w(f, 11), w12 = fx_w(f, 12), w13 = fx_w(f, 13),
             w14 = fx_w(f, 14), w15 = fx_w(f, 15), w16 = fx_w(f, 16);
    STORE_AT(f, w9, 0, KVI_TIER_CPU, c, 0, 3); /* lower tier only: walk starts at 0 */
    STORE(f, w10, c, 0, 1);                    /* disk right after gpu */
    STORE_AT(f, w10, 0, KVI_TIER_DISK, c, 1, 3);
    STORE(f, w11, c, 0, 1); /* gpu, cpu, disk in turn; disk names a cpu parent */
    STORE_AT(f, w11, 0, KVI_TIER_CPU, c, 1, 2);
    STORE_AT(f, w11, 0, KVI_TIER_DISK, c, 2, 3);
    STORE(f, w12, c, 0, 1); /* cpu after disk does not count */
    STORE_AT(f, w12, 0, KVI_TIER_DISK, c, 1, 2);
    STORE_AT(f, w12, 0, KVI_TIER_CPU, c, 2, 3);
    STORE(f, w13, c, 0, 2); /* cpu holds [13] on another prefix */
    STORE_AT(f, w13, 0, KVI_TIER_CPU, other, 0, 1);
    STORE_AT(f, w14, 1, KVI_TIER_GPU, c, 0, 1); /* tiers are per rank */
    STORE_AT(f, w14, 0, KVI_TIER_CPU, c, 0, 2);
    STORE(f, w15, c, 0, 3); /* lower tiers below g change nothing */
    STORE_AT(f, w15, 0, KVI_TIER_CPU, c, 0, 1);
    STORE(f, w16, c, 0, 2); /* a block on gpu and cpu at once */
    STORE_AT(f, w16, 0, KVI_TIER_CPU, c, 1, 2);
    TIERED(f, c, 5, {w9, 0, 0, 3, 3, 0}, {w10, 0, 1, 1, 3, 1}, {w11, 0, 1, 2, 3, 1}, {w12, 0, 1, 1, 2, 1},
           {w13, 0, 2, 2, 2, 2}, {w14, 0, 0, 2, 2, 0}, {w14, 1, 1, 1, 1, 1}, {w15, 0, 3, 3, 3, 3},
           {w16, 0, 2, 2, 2, 2});
    EXPECT(f, c, 5, {w10, 0, 1, 1}, {w11, 0, 1, 1}, {w12, 0, 1, 1}, {w13, 0, 2, 2}, {w14, 1, 1, 1},
           {w15, 0, 3, 3}, {w16, 0, 2, 2});
    /* removing a gpu block leaves the lower tiers alone (the walk then starts lower) */
    CHECK_EQ(REMOVE(f, w11, c, 0, 1), 1);
    TIERED(f, c, 5, {w9, 0, 0, 3, 3, 0}, {w10, 0, 1, 1, 3, 1}, {w12, 0, 1, 1, 2, 1}, {w13, 0, 2, 2, 2, 2},
           {w14, 0, 0, 2, 2, 0}, {w14, 1, 1, 1, 1, 1}, {w15, 0, 3, 3, 3, 3}, {w16, 0, 2, 2, 2, 2});
    const struct fx_q qs[] = {{c, 5}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
}

/* A seq-placed pool block and a gpu chain covering the same prefix: both
 * query paths must still see both (find_matches_by_seq == find_matches). */
SCENARIO(tiers_shared_pool_overlap, 16)
{
    f->tiered_same = false;
    uint64_t c[6] = {1, 2, 3, 4, 5, 6};
    uint64_t *s = fx_seqs(c, 6);
    struct kvi_block cpu[2] = {{0xc3, 3}, {0xc4, 4}};
    for (int order = 0; order < 2; order++) {
        if (order == 1)
            fx_reset(f);
        uint32_t a = fx_w(f, 1), pc = fx_inst(f, 100, true);
        if (order == 1)
            STORE(f, a, c, 0, 3);
        CHECK_EQ(kvi_index_store_seq(f->ix, pc, 0, KVI_TIER_CPU, false, 0, 2, cpu, s + 2, 2), 0);
        if (order == 0)
            STORE(f, a, c, 0, 3); /* gpu [1,2,3] overlaps the pool's position 2 */
        EXPECT(f, c, 6, {a, 0, 3, 3});
        TIERED_CONTENT(f, c, 6, {a, 0, 3, 4, 4, 3});
        TIERED_SEQ(f, s, 6, {a, 0, 3, 4, 4, 3});
    }
    free(s);
}

/* ======================================================================== */
/* section 2.2 consequences and API contracts                               */
/* ======================================================================== */

/* Chunk-hash collisions: the same content hash after different prefixes, and
 * repeated content within one chain. */
SCENARIO(chunk_hash_collisions, 32)
{
    uint64_t c0[3] = {1, 2, 3}, c1[3] = {9, 2, 3}, c2[2] = {2, 3};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1), w2 = fx_w(f, 2);
    STORE(f, w0, c0, 0, 3);
    STORE(f, w1, c1, 0, 3);
    EXPECT(f, c0, 3, {w0, 0, 3, 3});
    EXPECT(f, c1, 3, {w1, 0, 3, 3});
    EXPECT_NONE(f, c2, 2);
    STORE(f, w2, c2, 0, 2);
    EXPECT(f, c2, 2, {w2, 0, 2, 2});
    EXPECT(f, c0, 3, {w0, 0, 3, 3});
    /* long chains sharing every content hash but the first */
    uint64_t a[70], b[70];
    fx_range(a, 70, 1);
    memcpy(b, a, sizeof b);
    b[0] = 1000;
    uint32_t w3 = fx_w(f, 3), w4 = fx_w(f, 4);
    STORE(f, w3, a, 0, 70);
    STORE(f, w4, b, 0, 70);
    EXPECT(f, a, 70, {w3, 0, 70, 70}, {w0, 0, 3, 3});
    EXPECT(f, b, 70, {w4, 0, 70, 70});
    /* repeated content within one chain */
    uint64_t r[150];
    for (size_t i = 0; i < 150; i++)
        r[i] = 5;
    uint32_t w5 = fx_w(f, 5), w6 = fx_w(f, 6), w7 = fx_w(f, 7);
    STORE(f, w5, r, 0, 4);
    EXPECT(f, r, 4, {w5, 0, 4, 4});
    EXPECT(f, r, 2, {w5, 0, 2, 4});
    EXPECT(f, r, 5, {w5, 0, 4, 4});
    STORE(f, w6, r, 0, 1);
    EXPECT(f, r, 3, {w5, 0, 3, 4}, {w6, 0, 1, 1});
    STORE(f, w7, r, 0, 100);
    EXPECT(f, r, 150, {w5, 0, 4, 4}, {w6, 0, 1, 1}, {w7, 0, 100, 100});
    CHECK_EQ(fx_remove_tier(f, w7, 0, KVI_TIER_GPU, r, 64, 65, false), 1);
    EXPECT(f, r, 150, {w5, 0, 4, 4}, {w6, 0, 1, 1}, {w7, 0, 64, 64});
}

/* Engine hashes are opaque per-slot names. */
SCENARIO(opaque_engine_hashes, 32)
{
    enum { N = 70 };
    uint64_t c[N], d[N], e0[N], e0b[N], e1[N], x = 1, y = 2, z = 3;
    fx_range(c, N, 1);
    fx_range(d, N, 1001);
    for (size_t i = 0; i < N; i++) {
        e0[i] = splitmix(&x);
        e0b[i] = splitmix(&y);
        e1[i] = splitmix(&z) | (1ull << 63); /* >= 2^63: "negative" as int64 */
    }
    e1[0] = 0;
    e1[1] = UINT64_MAX;       /* -1 */
    e1[2] = 1ull << 63;       /* INT64_MIN */
    e1[3] = (1ull << 63) + 1; /* INT64_MIN + 1 */
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1), w2 = fx_w(f, 2), w3 = fx_w(f, 3);
    CHECK_EQ(fx_store_eh(f, w0, 0, KVI_TIER_GPU, c, e0, 0, 40), 0);
    CHECK_EQ(fx_store_eh(f, w0, 0, KVI_TIER_GPU, c, e0, 40, N), 0);
    CHECK_EQ(fx_store_eh(f, w1, 0, KVI_TIER_GPU, c, e1, 0, N), 0);
    STORE(f, w2, c, 0, N);
    EXPECT(f, c, N, {w0, 0, N, N}, {w1, 0, N, N}, {w2, 0, N, N});
    EXPECT(f, c, 35, {w0, 0, 35, N}, {w1, 0, 35, N}, {w2, 0, 35, N});

    /* re-storing the same prefix under new names: still counted once */
    struct kvi_index_stats st = stats_of(f);
    CHECK_EQ(fx_store_eh(f, w0, 0, KVI_TIER_GPU, c, e0b, 0, N), 0);
    EXPECT(f, c, N, {w0, 0, N, N}, {w1, 0, N, N}, {w2, 0, N, N});
    CHECK_EQ(stats_of(f).holdings, st.holdings);
    CHECK_EQ(stats_of(f).entries, st.entries);
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_GPU, e0, N), 0); /* the old names are gone */
    EXPECT(f, c, N, {w0, 0, N, N}, {w1, 0, N, N}, {w2, 0, N, N});
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_GPU, &e0b[35], 1), 1);
    CHECK_EQ(kvi_index_remove(f->ix, w1, 0, KVI_TIER_GPU, &e1[1], 1), 1); /* remove by -1 */
    EXPECT(f, c, N, {w0, 0, 35, 35}, {w1, 0, 1, 1}, {w2, 0, N, N});
    CHECK_EQ(fx_store_eh(f, w1, 0, KVI_TIER_GPU, c, e1, 1, 3), 0); /* parent named 0 */
    EXPECT(f, c, N, {w0, 0, 35, 35}, {w1, 0, 3, 3}, {w2, 0, N, N});

    /* the same names for different content on another worker are independent */
    CHECK_EQ(fx_store_eh(f, w3, 0, KVI_TIER_GPU, d, e0b, 0, N), 0);
    EXPECT(f, d, N, {w3, 0, N, N});
    EXPECT(f, c, N, {w0, 0, 35, 35}, {w1, 0, 3, 3}, {w2, 0, N, N});
    CHECK_EQ(kvi_index_remove(f->ix, w3, 0, KVI_TIER_GPU, &e0b[10], 1), 1);
    EXPECT(f, d, N, {w3, 0, 10, 10});
    EXPECT(f, c, N, {w0, 0, 35, 35}, {w1, 0, 3, 3}, {w2, 0, N, N});

    /* renaming one middle block (parent = its old name of the previous block) */
    struct kvi_block blk = {0xabcdef, c[20]};
    CHECK_EQ(kvi_index_store(f->ix, w2, 0, KVI_TIER_GPU, true, fx_eh(c, 19), &blk, 1), 0);
    EXPECT(f, c, N, {w0, 0, 35, 35}, {w1, 0, 3, 3}, {w2, 0, N, N});
    uint64_t old20 = fx_eh(c, 20), new20 = 0xabcdef;
    CHECK_EQ(kvi_index_remove(f->ix, w2, 0, KVI_TIER_GPU, &old20, 1), 0);
    CHECK_EQ(kvi_index_remove(f->ix, w2, 0, KVI_TIER_GPU, &new20, 1), 1);
    EXPECT(f, c, N, {w0, 0, 35, 35}, {w1, 0, 3, 3}, {w2, 0, 20, 20});
    const struct fx_q qs[] = {{c, N}, {d, N}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
}

/* kvi_index_store_seq with standard seq hashes is the same as kvi_index_store. */
SCENARIO(store_seq_matches_store, 32)
{
    enum { N = 70 };
    uint64_t c[N];
    fx_range(c, N, 1);
    uint64_t *s = fx_seqs(c, N);
    struct kvi_block b[N];
    for (size_t i = 0; i < N; i++)
        b[i] = (struct kvi_block){s[i], c[i]};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, N);
    CHECK_EQ(kvi_index_store_seq(f->ix, w1, 0, KVI_TIER_GPU, false, 0, 0, b, s, 40), 0);
    /* with a parent, the position argument is ignored */
    CHECK_EQ(kvi_index_store_seq(f->ix, w1, 0, KVI_TIER_GPU, true, s[39], 12345, b + 40, s + 40, N - 40), 0);
    EXPECT(f, c, N, {w0, 0, N, N}, {w1, 0, N, N});
    struct fx_snap sn;
    fx_snapshot(f->ix, __LINE__, &sn);
    size_t n0 = 0, n1 = 0;
    for (size_t i = 0; i < sn.n; i++) {
        if (sn.t[i].id == 0)
            n0++;
        if (sn.t[i].id == 1) {
            struct fx_tuple t = sn.t[i];
            t.id = 0;
            CHECK(bsearch(&t, sn.t, sn.n, sizeof t, fx_cmp_tuple) != NULL);
            n1++;
        }
    }
    CHECK_EQ(n0, N);
    CHECK_EQ(n1, N);
    fx_snap_free(&sn);
    free(s);
}

/* Unknown parents are rejected (-ENOENT), counted, and change nothing. */
SCENARIO(err_unknown_parent, 32)
{
    f->tiered_same = false;
    uint64_t c[5] = {1, 2, 3, 4, 5}, cc[4] = {1, 2, 3, 9};
    uint64_t *s = fx_seqs(c, 5);
    uint64_t cpu9 = fx_eh(cc, 3);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 3);
    STORE_AT(f, w0, 0, KVI_TIER_CPU, cc, 3, 4); /* cpu [9] under gpu [3] */
    struct fx_snap s0;
    fx_snapshot(f->ix, __LINE__, &s0);
    struct kvi_index_stats st0 = stats_of(f);
    struct kvi_block b4 = {s[3], 4};
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, 0x12345, &b4, 1), -ENOENT);
    CHECK_EQ(kvi_index_store(f->ix, w1, 0, KVI_TIER_GPU, true, s[2], &b4, 1), -ENOENT);      /* other worker's */
    CHECK_EQ(kvi_index_store(f->ix, w0, 1, KVI_TIER_GPU, true, s[2], &b4, 1), -ENOENT);      /* other rank's */
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, cpu9, &b4, 1), -ENOENT);      /* gpu under cpu */
    CHECK_EQ(kvi_index_store(f->ix, w0, 1, KVI_TIER_CPU, true, s[2], &b4, 1), -ENOENT);      /* cpu, other rank */
    CHECK_EQ(kvi_index_store_seq(f->ix, w0, 0, KVI_TIER_GPU, true, 0x12345, 0, &b4, s + 3, 1), -ENOENT);
    fx_expect_snap(f, __LINE__, &s0, "after rejected stores");
    struct kvi_index_stats st1 = stats_of(f);
    CHECK_EQ(st1.parent_not_found, st0.parent_not_found + 6);
    CHECK_EQ(st1.entries, st0.entries);
    CHECK_EQ(st1.holdings, st0.holdings);
    CHECK_EQ(st1.slots, st0.slots); /* no slot was created for the rejected stores */
    EXPECT(f, c, 5, {w0, 0, 3, 3});

    /* a parent the worker no longer holds */
    CHECK_EQ(REMOVE(f, w0, c, 2, 3), 1);
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, s[2], &b4, 1), -ENOENT);
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_CPU, true, s[2], &b4, 1), -ENOENT);
    /* a parent orphaned by a mid-chain removal */
    STORE(f, w0, c, 2, 4);
    CHECK_EQ(REMOVE(f, w0, c, 1, 2), 1);
    struct kvi_block b5 = {s[4], 5};
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, s[3], &b5, 1), -ENOENT);
    EXPECT(f, c, 5, {w0, 0, 1, 1});
    CHECK_EQ(stats_of(f).parent_not_found, st0.parent_not_found + 9);
    fx_snap_free(&s0);
    free(s);
}

/* A run repeating an engine hash, or containing its parent: -EINVAL, unchanged. */
SCENARIO(err_invalid_runs, 32)
{
    uint64_t c[40];
    fx_range(c, 40, 1);
    uint64_t *s = fx_seqs(c, 40);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 3);
    struct fx_snap s0;
    fx_snapshot(f->ix, __LINE__, &s0);
    struct kvi_index_stats st0 = stats_of(f);
    struct kvi_block dup[2] = {{0x50, 7}, {0x50, 8}};
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, false, 0, dup, 2), -EINVAL);
    CHECK_EQ(kvi_index_store(f->ix, w1, 0, KVI_TIER_GPU, false, 0, dup, 2), -EINVAL);
    struct kvi_block withp[2] = {{0x60, 4}, {s[2], 5}};
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, s[2], withp, 2), -EINVAL);
    struct kvi_block self = {s[2], 4};
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, s[2], &self, 1), -EINVAL);
    /* long runs (more than 16 hashes) */
    struct kvi_block big[30];
    for (size_t i = 0; i < 30; i++)
        big[i] = (struct kvi_block){s[3 + i], c[3 + i]};
    big[29].engine_hash = big[0].engine_hash;
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, s[2], big, 30), -EINVAL);
    big[29].engine_hash = s[32];
    big[20].engine_hash = s[2];
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, s[2], big, 30), -EINVAL);
    CHECK_EQ(kvi_index_store_seq(f->ix, w0, 0, KVI_TIER_GPU, true, s[2], 0, big, s + 3, 30), -EINVAL);
    big[20].engine_hash = s[23];
    CHECK_EQ(kvi_index_store_seq(f->ix, w0, 0, KVI_TIER_CPU, false, 0, 3, dup, s + 3, 2), -EINVAL);
    fx_expect_snap(f, __LINE__, &s0, "after rejected runs");
    struct kvi_index_stats st1 = stats_of(f);
    CHECK_EQ(st1.invalid_events, st0.invalid_events + 8);
    CHECK_EQ(st1.entries, st0.entries);
    CHECK_EQ(st1.holdings, st0.holdings);
    CHECK_EQ(st1.slots, st0.slots);
    EXPECT(f, c, 40, {w0, 0, 3, 3});
    /* the corrected run is accepted */
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, s[2], big, 30), 0);
    EXPECT(f, c, 40, {w0, 0, 33, 33});
    fx_snap_free(&s0);
    free(s);
}

/* Other invalid arguments and empty runs. */
SCENARIO(err_invalid_args, 32)
{
    uint64_t c[5] = {1, 2, 3, 4, 5};
    uint64_t *s = fx_seqs(c, 5);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 3);
    struct fx_snap s0;
    fx_snapshot(f->ix, __LINE__, &s0);
    uint64_t slots = stats_of(f).slots;
    struct kvi_block b = {s[3], 4};
    CHECK(kvi_index_store(f->ix, 4000, 0, KVI_TIER_GPU, false, 0, &b, 1) < 0); /* never interned */
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, (enum kvi_tier)9, false, 0, &b, 1), -EINVAL);
    /* position > 0 without a parent is not allowed on the gpu tier */
    CHECK_EQ(kvi_index_store_seq(f->ix, w0, 0, KVI_TIER_GPU, false, 0, 3, &b, s + 3, 1), -EINVAL);
    CHECK_EQ(kvi_index_store_seq(f->ix, w1, 0, KVI_TIER_GPU, false, 0, 3, &b, s + 3, 1), -EINVAL);
    /* empty runs are accepted and change nothing */
    CHECK_EQ(kvi_index_store(f->ix, w1, 0, KVI_TIER_GPU, false, 0, &b, 0), 0);
    CHECK_EQ(kvi_index_store(f->ix, w0, 0, KVI_TIER_GPU, true, 0x999, &b, 0), 0);
    fx_expect_snap(f, __LINE__, &s0, "after invalid arguments");
    CHECK_EQ(stats_of(f).slots, slots);
    EXPECT(f, c, 5, {w0, 0, 3, 3});
    fx_snap_free(&s0);
    free(s);
}

/* Stats after known operations; everything removed + reclaim -> 0 entries. */
SCENARIO(stats_counts, 32)
{
    drop_probe(f);
    struct kvi_index_stats st = stats_of(f);
    CHECK_EQ(st.entries, 0);
    CHECK_EQ(st.holdings, 0);
    CHECK_EQ(st.slots, 0);
    uint64_t c0[3] = {1, 2, 3}, c1[3] = {1, 2, 4}, c2[4] = {1, 2, 3, 5};
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    bool same = kvi_index_partition_of(f->ix, w0) == kvi_index_partition_of(f->ix, w1);
    CHECK(kvi_index_partition_of(f->ix, w0) < kvi_index_n_parts(f->ix));
    uint64_t base = stats_of(f).stored_blocks;
    STORE(f, w0, c0, 0, 3);
    STORE(f, w1, c1, 0, 3);
    st = stats_of(f);
    CHECK_EQ(st.entries, same ? 4 : 6); /* distinct prefixes per partition */
    CHECK_EQ(st.holdings, 6);
    CHECK_EQ(st.slots, 2);
    CHECK_EQ(st.stored_blocks - base, 6);
    CHECK(st.bytes > 0);
    STORE(f, w0, c0, 0, 3); /* idempotent */
    CHECK_EQ(stats_of(f).stored_blocks - base, 6);
    CHECK_EQ(stats_of(f).holdings, 6);
    STORE_AT(f, w0, 1, KVI_TIER_GPU, c0, 0, 3);
    STORE_AT(f, w0, 0, KVI_TIER_CPU, c2, 3, 4);
    st = stats_of(f);
    CHECK_EQ(st.entries, same ? 5 : 7);
    CHECK_EQ(st.holdings, 10);
    CHECK_EQ(st.slots, 4);
    CHECK_EQ(REMOVE(f, w0, c0, 2, 3), 1);
    st = stats_of(f);
    CHECK_EQ(st.holdings, 9);
    CHECK_EQ(st.entries, same ? 5 : 7); /* still held by rank 1, and a parent */
    uint64_t unk = st.unknown_removes;
    uint64_t bogus[2] = {4242, 4343};
    CHECK_EQ(kvi_index_remove(f->ix, w1, 0, KVI_TIER_GPU, bogus, 2), 0);
    CHECK_EQ(stats_of(f).unknown_removes, unk + 2);
    kvi_index_remove_dp_rank(f->ix, w0, 1);
    kvi_index_clear(f->ix, w0);
    CHECK_EQ(REMOVE_REV(f, w1, c1, 0, 3), 3);
    st = stats_of(f);
    CHECK_EQ(st.entries, 0);
    CHECK_EQ(st.holdings, 0);
    CHECK_EQ(st.slots, 3); /* w0 rank 0 gpu + cpu (cleared, kept), w1 gpu */
    CHECK_EQ(st.removed_blocks, st.stored_blocks);
    CHECK_EQ(st.stored_blocks - base, 10);
    fx_reclaim_all(f);
    st = stats_of(f);
    CHECK_EQ(st.entries, 0);
    CHECK_EQ(st.holdings, 0);
    EXPECT_NONE(f, c0, 3);
    kvi_index_remove_instance(f->ix, w0);
    kvi_index_remove_instance(f->ix, w1);
    fx_reclaim_all(f);
    st = stats_of(f);
    CHECK_EQ(st.slots, 0);
    CHECK_EQ(st.entries, 0);
    CHECK_EQ(st.holdings, 0);
    /* and everything works again afterwards */
    STORE(f, w1, c2, 0, 4);
    EXPECT(f, c2, 4, {w1, 0, 4, 4});
    CHECK_EQ(stats_of(f).entries, 4);
}

/* remove_dp_rank drops one rank (all tiers) and forgets its slots. */
SCENARIO(remove_dp_rank, 32)
{
    f->tiered_same = false;
    uint64_t c[4] = {1, 2, 3, 4};
    uint64_t slots0 = stats_of(f).slots;
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    for (uint32_t r = 0; r < 3; r++)
        STORE_AT(f, w0, r, KVI_TIER_GPU, c, 0, 3);
    STORE_AT(f, w0, 1, KVI_TIER_CPU, c, 3, 4);
    STORE(f, w1, c, 0, 3);
    CHECK_EQ(stats_of(f).slots, slots0 + 5);
    TIERED(f, c, 4, {w0, 0, 3, 3, 3, 3}, {w0, 1, 3, 4, 4, 3}, {w0, 2, 3, 3, 3, 3}, {w1, 0, 3, 3, 3, 3});
    kvi_index_remove_dp_rank(f->ix, w0, 1);
    CHECK_EQ(stats_of(f).slots, slots0 + 3);
    CHECK_EQ(fx_tree(f, w0, 1), 0);
    EXPECT(f, c, 4, {w0, 0, 3, 3}, {w0, 2, 3, 3}, {w1, 0, 3, 3});
    TIERED(f, c, 4, {w0, 0, 3, 3, 3, 3}, {w0, 2, 3, 3, 3, 3}, {w1, 0, 3, 3, 3, 3});
    struct fx_snap sn;
    fx_snapshot(f->ix, __LINE__, &sn);
    for (size_t i = 0; i < sn.n; i++)
        CHECK(!(sn.t[i].id == 0 && sn.t[i].rank == 1));
    fx_snap_free(&sn);
    /* the rank's names are forgotten with it */
    struct kvi_block b = {0x77, 5};
    CHECK_EQ(kvi_index_store(f->ix, w0, 1, KVI_TIER_CPU, true, fx_eh(c, 3), &b, 1), -ENOENT);
    STORE_AT(f, w0, 1, KVI_TIER_GPU, c, 0, 2);
    EXPECT(f, c, 4, {w0, 0, 3, 3}, {w0, 1, 2, 2}, {w0, 2, 3, 3}, {w1, 0, 3, 3});
}

/* remove_instance drops every slot of the instance. */
SCENARIO(remove_instance, 32)
{
    f->tiered_same = false;
    uint64_t c[4] = {1, 2, 3, 4};
    uint64_t slots0 = stats_of(f).slots;
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE_AT(f, w0, 0, KVI_TIER_GPU, c, 0, 3);
    STORE_AT(f, w0, 1, KVI_TIER_GPU, c, 0, 2);
    STORE_AT(f, w0, 0, KVI_TIER_CPU, c, 3, 4);
    STORE(f, w1, c, 0, 3);
    CHECK_EQ(stats_of(f).slots, slots0 + 4);
    size_t n = fx_find(f->ix, c, 4, fx_out, FX_MAX_OUT);
    uint32_t gone[4];
    size_t ng = 0;
    for (size_t i = 0; i < n && i < FX_MAX_OUT; i++)
        if (fx_out[i].instance == w0 && ng < 4)
            gone[ng++] = fx_out[i].slot;
    CHECK_EQ(ng, 2);
    kvi_index_remove_instance(f->ix, w0);
    CHECK_EQ(stats_of(f).slots, slots0 + 1);
    struct kvi_slot_info si;
    for (size_t i = 0; i < ng; i++) {
        kvi_rcu_read_lock();
        CHECK_EQ(kvi_index_slot_info(f->ix, gone[i], &si), -ENOENT);
        kvi_rcu_read_unlock();
    }
    EXPECT(f, c, 4, {w1, 0, 3, 3});
    TIERED(f, c, 4, {w1, 0, 3, 3, 3, 3});
    CHECK_EQ(fx_tree(f, w0, 0), 0);
    CHECK_EQ(fx_tree(f, w0, 1), 0);
    CHECK_EQ(kvi_index_find_instance(f->ix, 0, NULL), w0); /* the dense id stays */
    fx_reclaim_all(f);
    STORE(f, w0, c, 0, 4);
    EXPECT(f, c, 4, {w0, 0, 4, 4}, {w1, 0, 3, 3});
    kvi_index_remove_instance(f->ix, w0);
    kvi_index_remove_instance(f->ix, w0); /* twice is fine */
    EXPECT(f, c, 4, {w1, 0, 3, 3});
}

/* ======================================================================== */
/* section 5: dump and restore                                               */
/* ======================================================================== */

/* A mixed index: ranks, branches, removals, renamed blocks, every tier, shared
 * pools placed by seq hashes and by content, a removed and re-stored dp rank. */
SCENARIO(dump_round_trip_mixed, 16)
{
    f->tiered_same = false;
    uint64_t a[46], br[40], cc[10], d[50], e2[40], x = 99;
    fx_range(a, 46, 1);
    fx_range(br, 20, 1);
    fx_range(br + 20, 20, 501);
    fx_range(cc, 10, 1001);
    fx_range(d, 50, 1);
    for (size_t i = 0; i < 40; i++)
        e2[i] = splitmix(&x);
    uint64_t *sd = fx_seqs(d, 50);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1), w2 = fx_w(f, 2), w3 = fx_w(f, 3), w4 = fx_w(f, 4), w5 = fx_w(f, 5);
    uint32_t pc = fx_inst(f, 100, true), pd = fx_inst(f, 101, true);
    STORE(f, w0, a, 0, 40);
    STORE_AT(f, w0, 1, KVI_TIER_GPU, a, 0, 10);
    STORE_AT(f, w0, 0, KVI_TIER_CPU, a, 40, 44);  /* under gpu block 40 */
    STORE_AT(f, w0, 0, KVI_TIER_DISK, a, 44, 46); /* under cpu block 44 */
    STORE(f, w1, br, 0, 20);
    STORE(f, w1, br, 20, 40);
    CHECK_EQ(fx_remove_tier(f, w1, 0, KVI_TIER_GPU, br, 30, 31, false), 1);
    CHECK_EQ(fx_store_eh(f, w2, 0, KVI_TIER_GPU, a, e2, 0, 40), 0);
    struct kvi_block ren = {0x5eed, a[5]};
    CHECK_EQ(kvi_index_store(f->ix, w2, 0, KVI_TIER_GPU, true, e2[4], &ren, 1), 0);
    STORE_AT(f, w3, 0, KVI_TIER_EXTERNAL, cc, 0, 10);
    STORE(f, w4, d, 0, 20);
    struct kvi_block pcb[10], pdb[5];
    for (size_t i = 0; i < 10; i++)
        pcb[i] = (struct kvi_block){0xc000 + i, d[20 + i]};
    for (size_t i = 0; i < 5; i++)
        pdb[i] = (struct kvi_block){0xd000 + i, d[30 + i]};
    CHECK_EQ(kvi_index_store_seq(f->ix, pc, 0, KVI_TIER_CPU, false, 0, 20, pcb, sd + 20, 10), 0);
    CHECK_EQ(kvi_index_store_seq(f->ix, pd, 0, KVI_TIER_DISK, false, 0, 30, pdb, sd + 30, 5), 0);
    STORE_AT(f, pc, 0, KVI_TIER_CPU, cc, 0, 5);
    STORE(f, w5, cc, 0, 3); /* w5: a second worker on cc, then clear w0's rank 1 */
    STORE_AT(f, w0, 1, KVI_TIER_CPU, a, 10, 12);
    kvi_index_remove_dp_rank(f->ix, w0, 1);
    STORE_AT(f, w0, 1, KVI_TIER_GPU, a, 0, 5);
    /* (a worker left with an empty slot is covered by tiers_empty_slot_round_trip) */
    const struct fx_q qs[] = {{a, 46}, {br, 40}, {cc, 10}, {d, 50}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(sd);
}

/* A lower-tier block whose parent is held on another lower tier of the same
 * worker (allowed by kvi_index_store): the dump must keep the link. */
SCENARIO(dump_cross_tier_parent, 16)
{
    f->tiered_same = false;
    drop_probe(f);
    uint64_t c[5] = {1, 2, 3, 4, 5};
    uint64_t *s = fx_seqs(c, 5);
    uint32_t w0 = fx_w(f, 0), pc = fx_inst(f, 100, true);
    STORE(f, w0, c, 0, 2);
    STORE_AT(f, w0, 0, KVI_TIER_DISK, c, 2, 3); /* disk [3] under gpu [2] */
    STORE_AT(f, w0, 0, KVI_TIER_CPU, c, 3, 4);  /* cpu [4] under disk [3] */
    STORE_AT(f, pc, 0, KVI_TIER_CPU, c, 0, 3);  /* a shared cpu pool holds [1,2,3] */
    /* g = 2; cpu: the pool holds block 3, W0's cpu block 4 -> 4; disk: no 5 */
    TIERED(f, c, 5, {w0, 0, 2, 4, 4, 2});
    struct fx_snap sn;
    fx_snapshot(f->ix, __LINE__, &sn);
    bool found = false;
    for (size_t i = 0; i < sn.n; i++)
        if (sn.t[i].id == 0 && sn.t[i].tier == KVI_TIER_CPU) {
            found = true;
            FX_CHECK(__LINE__, sn.t[i].has_parent && sn.t[i].peh == s[2],
                     "dump of W0's cpu block 4: has_parent %u parent %" PRIx64 ", expected the disk block %" PRIx64,
                     sn.t[i].has_parent, sn.t[i].peh, s[2]);
        }
    CHECK(found);
    fx_snap_free(&sn);
    const struct fx_q qs[] = {{c, 5}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* ======================================================================== */
/* token-less stores: kvi_index_store_known, kvi_index_store_seq_only       */
/* ======================================================================== */

/* The rows of a snapshot for one worker id and tier, by position (at most n). */
static size_t snap_rows(const struct fx_snap *sn, uint64_t id, enum kvi_tier tier, struct fx_tuple *out, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < sn->n; i++)
        if (sn->t[i].id == id && sn->t[i].tier == (uint32_t)tier && m < n)
            out[m++] = sn->t[i];
    for (size_t i = 1; i < m; i++) /* insertion sort by position */
        for (size_t j = i; j > 0 && out[j - 1].pos > out[j].pos; j--) {
            struct fx_tuple t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return m;
}

/* Offload placeholders: a worker's gpu blocks stored again on cpu and disk by
 * engine hash alone, resolved through the worker's own names on other tiers. */
SCENARIO(known_offload, 16)
{
    f->tiered_same = false;
    uint64_t c[6] = {1, 2, 3, 4, 5, 6};
    uint64_t *s = fx_seqs(c, 6);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w(f, 1);
    STORE(f, w0, c, 0, 6);
    STORE(f, w1, c, 0, 2);
    struct kvi_index_stats st0 = stats_of(f);
    size_t unres = 99;
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_CPU, s, 6, &unres), 6);
    CHECK_EQ(unres, 0);
    CHECK_EQ(stats_of(f).holdings, st0.holdings + 6);
    CHECK_EQ(stats_of(f).entries, st0.entries); /* the same prefixes */
    EXPECT(f, c, 6, {w0, 0, 6, 6}, {w1, 0, 2, 2});
    TIERED(f, c, 6, {w0, 0, 6, 6, 6, 6}, {w1, 0, 2, 2, 2, 2});
    /* the gpu evicts blocks 3..5 (block 3 takes its descendants along): cpu keeps them */
    CHECK_EQ(REMOVE(f, w0, c, 3, 4), 1);
    EXPECT(f, c, 6, {w0, 0, 3, 3}, {w1, 0, 2, 2});
    TIERED(f, c, 6, {w0, 0, 3, 6, 6, 3}, {w1, 0, 2, 2, 2, 2});
    /* disk, out of order and with an unknown hash: 5 and 4 now resolve through cpu */
    uint64_t d[3] = {s[5], 0x777, s[4]};
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_DISK, d, 3, &unres), 2);
    CHECK_EQ(unres, 1);
    struct kvi_index_stats st1 = stats_of(f);
    CHECK_EQ(st1.unknown_blocks, st0.unknown_blocks + 1);
    /* cpu drops 4 (and 5 below it): cpu reaches 4, the disk continues to 6 */
    CHECK_EQ(fx_remove_tier(f, w0, 0, KVI_TIER_CPU, c, 4, 5, false), 1);
    TIERED(f, c, 6, {w0, 0, 3, 4, 6, 3}, {w1, 0, 2, 2, 2, 2});
    EXPECT(f, c, 6, {w0, 0, 3, 3}, {w1, 0, 2, 2});
    /* idempotent (no unresolved count wanted) */
    st1 = stats_of(f);
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_DISK, d, 3, NULL), 2);
    struct kvi_index_stats st2 = stats_of(f);
    CHECK_EQ(st2.holdings, st1.holdings);
    CHECK_EQ(st2.stored_blocks, st1.stored_blocks);
    CHECK_EQ(st2.unknown_blocks, st1.unknown_blocks + 1);
    /* names are per (instance, dp_rank): another worker's or rank's resolve
     * nothing, and create no slot */
    CHECK_EQ(kvi_index_store_known(f->ix, w1, 0, KVI_TIER_CPU, s + 2, 4, &unres), 0);
    CHECK_EQ(unres, 4);
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 1, KVI_TIER_CPU, s, 2, &unres), 0);
    CHECK_EQ(unres, 2);
    CHECK_EQ(stats_of(f).slots, st2.slots);
    /* invalid instance or tier: nothing resolves, no counter moves */
    CHECK_EQ(kvi_index_store_known(f->ix, 4000, 0, KVI_TIER_CPU, s, 2, &unres), 0);
    CHECK_EQ(unres, 2);
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, (enum kvi_tier)9, s, 2, &unres), 0);
    CHECK_EQ(unres, 2);
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_CPU, s, 0, &unres), 0);
    CHECK_EQ(unres, 0);
    CHECK_EQ(stats_of(f).unknown_blocks, st2.unknown_blocks + 6);
    /* the disk blocks hang below their cpu parent in the dump */
    struct fx_snap sn;
    struct fx_tuple rows[8];
    fx_snapshot(f->ix, __LINE__, &sn);
    CHECK_EQ(snap_rows(&sn, 0, KVI_TIER_DISK, rows, 8), 2);
    CHECK(rows[0].pos == 4 && rows[0].has_parent && rows[0].peh == s[3] && rows[0].ch == c[4]);
    CHECK(rows[1].pos == 5 && rows[1].has_parent && rows[1].peh == s[4] && rows[1].ch == c[5]);
    fx_snap_free(&sn);
    const struct fx_q qs[] = {{c, 6}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* On the gpu tier a token-less block needs its parent on the gpu tier
 * (holdings stay ancestor-closed); runs are applied parents first. */
SCENARIO(known_gpu_rules, 16)
{
    f->tiered_same = false;
    uint64_t c[4] = {1, 2, 3, 4};
    uint64_t *s = fx_seqs(c, 4);
    uint32_t w0 = fx_w(f, 0);
    STORE_AT(f, w0, 0, KVI_TIER_CPU, c, 0, 4);
    EXPECT_NONE(f, c, 4);
    size_t unres = 99;
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_GPU, s, 2, &unres), 2); /* reloaded onto the gpu */
    CHECK_EQ(unres, 0);
    EXPECT(f, c, 4, {w0, 0, 2, 2});
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_GPU, s + 3, 1, &unres), 0); /* parent 2 not on gpu */
    CHECK_EQ(unres, 1);
    EXPECT(f, c, 4, {w0, 0, 2, 2});
    uint64_t rev[2] = {s[3], s[2]};
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_GPU, rev, 2, &unres), 2);
    CHECK_EQ(unres, 0);
    EXPECT(f, c, 4, {w0, 0, 4, 4});
    TIERED(f, c, 4, {w0, 0, 4, 4, 4, 4});
    /* a gpu removal cascades on the gpu only */
    CHECK_EQ(REMOVE(f, w0, c, 1, 2), 1);
    EXPECT(f, c, 4, {w0, 0, 1, 1});
    TIERED(f, c, 4, {w0, 0, 1, 4, 4, 1});
    const struct fx_q qs[] = {{c, 4}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* Names on the target tier: the same prefix under another name is renamed;
 * a name that means another prefix there drops that block first. */
SCENARIO(known_renames, 16)
{
    f->tiered_same = false;
    uint64_t c[3] = {1, 2, 3}, o[3] = {7, 8, 9};
    uint64_t *s = fx_seqs(c, 3);
    uint64_t cpu_names[3] = {0xc1, 0xc2, 0xc3};
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 3);
    CHECK_EQ(fx_store_eh(f, w0, 0, KVI_TIER_CPU, c, cpu_names, 0, 3), 0);
    struct kvi_index_stats st = stats_of(f);
    size_t unres = 99;
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_CPU, s, 3, &unres), 3);
    CHECK_EQ(unres, 0);
    CHECK_EQ(stats_of(f).holdings, st.holdings); /* renamed, not added */
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_CPU, cpu_names, 3), 0);
    TIERED(f, c, 3, {w0, 0, 3, 3, 3, 3});
    /* the disk names [7,8,9] with the gpu's names of [1,2,3] */
    CHECK_EQ(fx_store_eh(f, w0, 0, KVI_TIER_DISK, o, s, 0, 3), 0);
    TIERED(f, o, 3, {w0, 0, 0, 0, 3, 3});
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_DISK, s, 1, &unres), 1); /* gpu's s[0] wins */
    CHECK_EQ(unres, 0);
    fx_expect_tiered(f, __LINE__, o, 3, NULL, 0); /* [7,8,9] went with its root */
    TIERED(f, c, 3, {w0, 0, 3, 3, 3, 3});
    struct fx_snap sn;
    struct fx_tuple rows[4];
    fx_snapshot(f->ix, __LINE__, &sn);
    CHECK_EQ(snap_rows(&sn, 0, KVI_TIER_DISK, rows, 4), 1);
    CHECK(rows[0].eh == s[0] && rows[0].ch == c[0] && rows[0].pos == 0);
    fx_snap_free(&sn);
    const struct fx_q qs[] = {{c, 3}, {o, 3}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* A token-less lower-tier block whose parent no tier of the worker holds is
 * a positional root: removals above it never take it along. */
SCENARIO(known_positional_root, 16)
{
    f->tiered_same = false;
    uint64_t c[5] = {1, 2, 3, 4, 5};
    uint64_t *s = fx_seqs(c, 5);
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 2);
    /* cpu: [3,4] placed by position 2 (no parent named) */
    struct kvi_block placed[2] = {{0xa2, 3}, {0xa3, 4}};
    CHECK_EQ(kvi_index_store_seq(f->ix, w0, 0, KVI_TIER_CPU, false, 0, 2, placed, s + 2, 2), 0);
    TIERED(f, c, 5, {w0, 0, 2, 4, 4, 2});
    size_t unres = 99;
    uint64_t names[2] = {0xa3, 0xa2};
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_DISK, names, 2, &unres), 2);
    CHECK_EQ(unres, 0);
    /* the cpu root goes with its child; the disk copies stay */
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_CPU, &names[1], 1), 1);
    TIERED(f, c, 5, {w0, 0, 2, 2, 4, 2});
    /* the gpu losing block 1 changes no lower tier */
    CHECK_EQ(REMOVE(f, w0, c, 1, 2), 1);
    TIERED(f, c, 5, {w0, 0, 1, 1, 1, 1});
    struct fx_snap sn;
    struct fx_tuple rows[4];
    fx_snapshot(f->ix, __LINE__, &sn);
    CHECK_EQ(snap_rows(&sn, 0, KVI_TIER_DISK, rows, 4), 2);
    CHECK(rows[0].pos == 2 && !rows[0].has_parent && rows[0].eh == 0xa2);
    CHECK(rows[1].pos == 3 && rows[1].has_parent && rows[1].peh == 0xa2);
    fx_snap_free(&sn);
    uint64_t *ss = fx_seqs(c, 5);
    TIERED_SEQ(f, ss, 5, {w0, 0, 1, 1, 1, 1});
    free(ss);
    const struct fx_q qs[] = {{c, 5}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* Whether a token-less lower-tier block hangs below its parent is decided when
 * it is stored: a block stored while no tier of the worker held its parent
 * stays a root of its slot even after the slot gains the parent, so removing
 * the parent there leaves it (as for a block placed by position). */
SCENARIO(known_root_decided_at_store, 16)
{
    f->tiered_same = false;
    uint64_t c[4] = {1, 2, 3, 4};
    uint64_t *s = fx_seqs(c, 4);
    uint32_t w0 = fx_w(f, 0);
    STORE(f, w0, c, 0, 4);
    size_t unres = 99;
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_CPU, s + 2, 1, &unres), 1); /* below the gpu's [2] */
    CHECK_EQ(REMOVE(f, w0, c, 1, 2), 1); /* the gpu keeps [1] only */
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_DISK, s + 2, 1, &unres), 1); /* no tier holds [2]: a root */
    STORE(f, w0, c, 1, 2); /* the gpu holds [1,2] again */
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_DISK, s + 1, 1, &unres), 1); /* below the gpu's [1] */
    struct fx_snap sn;
    struct fx_tuple rows[4];
    fx_snapshot(f->ix, __LINE__, &sn);
    CHECK_EQ(snap_rows(&sn, 0, KVI_TIER_DISK, rows, 4), 2);
    CHECK(rows[0].pos == 1 && rows[0].has_parent && rows[0].peh == s[0]);
    CHECK(rows[1].pos == 2 && !rows[1].has_parent);
    fx_snap_free(&sn);
    /* removing [2] from the disk leaves the root [3] */
    CHECK_EQ(fx_remove_tier(f, w0, 0, KVI_TIER_DISK, c, 1, 2, false), 1);
    fx_snapshot(f->ix, __LINE__, &sn);
    CHECK_EQ(snap_rows(&sn, 0, KVI_TIER_DISK, rows, 4), 1);
    CHECK(rows[0].pos == 2 && rows[0].eh == s[2]);
    fx_snap_free(&sn);
    /* a block stored below a held parent is taken along */
    CHECK_EQ(kvi_index_store_known(f->ix, w0, 0, KVI_TIER_CPU, s + 1, 1, &unres), 1);
    CHECK_EQ(fx_remove_tier(f, w0, 0, KVI_TIER_CPU, c, 1, 2, false), 1);
    fx_snapshot(f->ix, __LINE__, &sn);
    CHECK_EQ(snap_rows(&sn, 0, KVI_TIER_CPU, rows, 4), 0);
    fx_snap_free(&sn);
    const struct fx_q qs[] = {{c, 4}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* RFC 1527 token-less stores (a Mooncake master): a shared pool names blocks
 * by their seq hashes. Prefixes the pool's partition has are reused (content
 * known; entries are per partition); the others are placed by seq alone
 * until tokens arrive in that partition. */
SCENARIO(seq_only_pool, 16)
{
    f->tiered_same = false;
    drop_probe(f); /* the probe instance would be entitled to the pools too */
    uint64_t c[6] = {1, 2, 3, 4, 5, 6}, x[5] = {21, 22, 23, 24, 25};
    uint64_t *s = fx_seqs(c, 6), *sx = fx_seqs(x, 5);
    uint32_t a = fx_w(f, 1), pc = fx_inst(f, 100, true), pd = fx_inst(f, 101, true);
    STORE(f, a, c, 0, 4);
    CHECK_EQ(kvi_index_store_seq_only(f->ix, pc, 0, KVI_TIER_CPU, false, 0, 0, s, s, 6), 0);
    EXPECT(f, c, 6, {a, 0, 4, 4});
    TIERED(f, c, 6, {a, 0, 4, 6, 6, 4});
    /* a disk pool places [24,25] of another chain by position 3 */
    uint64_t xn[2] = {0xd4, 0xd5};
    CHECK_EQ(kvi_index_store_seq_only(f->ix, pd, 0, KVI_TIER_DISK, false, 0, 3, xn, sx + 3, 2), 0);
    struct fx_snap sn;
    struct fx_tuple rows[8];
    fx_snapshot(f->ix, __LINE__, &sn);
    CHECK_EQ(snap_rows(&sn, 100, KVI_TIER_CPU, rows, 8), 6);
    bool same = kvi_index_partition_of(f->ix, a) == kvi_index_partition_of(f->ix, pc);
    for (size_t i = 0; i < 6; i++) {
        bool known = i == 0 || (i < 4 && same); /* a's entries; position 0: content = seq */
        CHECK(rows[i].pos == i && rows[i].eh == s[i] && rows[i].seq == s[i]);
        CHECK_EQ(rows[i].no_content, !known);
        CHECK_EQ(rows[i].ch, known ? c[i] : 0);
        CHECK_EQ(rows[i].has_parent, i > 0);
    }
    CHECK_EQ(snap_rows(&sn, 101, KVI_TIER_DISK, rows, 8), 2);
    CHECK(rows[0].pos == 3 && !rows[0].has_parent && rows[0].no_content && rows[0].seq == sx[3]);
    CHECK(rows[1].pos == 4 && rows[1].has_parent && rows[1].peh == 0xd4 && rows[1].no_content);
    fx_snap_free(&sn);
    const struct fx_q qs[] = {{c, 6}, {x, 5}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    /* b holds [21,22,23] on gpu: the disk pool extends it */
    uint32_t b = fx_w(f, 2);
    STORE(f, b, x, 0, 3);
    TIERED(f, x, 5, {b, 0, 3, 3, 5, 3});
    /* tokens arrive: the pool's blocks get their content */
    uint32_t d = fx_w(f, 3);
    STORE(f, d, c, 0, 6);
    STORE(f, d, x, 0, 5);
    EXPECT(f, c, 6, {a, 0, 4, 4}, {d, 0, 6, 11});
    EXPECT(f, x, 5, {b, 0, 3, 3}, {d, 0, 5, 11});
    TIERED(f, c, 6, {a, 0, 4, 6, 6, 4}, {b, 0, 0, 6, 6, 3}, {d, 0, 6, 6, 6, 11}); /* b may use the pool too */
    fx_snapshot(f->ix, __LINE__, &sn);
    for (size_t i = 0; i < sn.n; i++) {
        int64_t inst = kvi_index_find_instance(f->ix, sn.t[i].id, NULL);
        CHECK(inst >= 0);
        if (kvi_index_partition_of(f->ix, (uint32_t)inst) == kvi_index_partition_of(f->ix, d))
            CHECK_EQ(sn.t[i].no_content, 0);
    }
    fx_snap_free(&sn);
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
    free(sx);
}

/* A gpu worker that publishes seq hashes only: its chain matches content
 * queries (through seq hashes), continues under a named parent, shares
 * entries with a worker that sends tokens, and follows the usual errors. */
SCENARIO(seq_only_gpu, 32)
{
    enum { N = 8 };
    uint64_t c[N], eh[N];
    fx_range(c, N, 11);
    for (size_t i = 0; i < N; i++)
        eh[i] = 0x5000 + i;
    uint64_t *s = fx_seqs(c, N);
    uint32_t w0 = fx_w(f, 0), w1 = fx_w_near(f, 1, w0);
    uint64_t entries0 = stats_of(f).entries;
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w0, 0, KVI_TIER_GPU, false, 0, 0, eh, s, 5), 0);
    EXPECT(f, c, N, {w0, 0, 5, 5});
    /* continued under a named parent (the position argument is then ignored) */
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w0, 0, KVI_TIER_GPU, true, eh[4], 999, eh + 5, s + 5, N - 5), 0);
    EXPECT(f, c, N, {w0, 0, N, N});
    EXPECT(f, c, 3, {w0, 0, 3, N});
    const struct fx_q qs[] = {{c, N}};
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    /* idempotent */
    struct kvi_index_stats st = stats_of(f);
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w0, 0, KVI_TIER_GPU, false, 0, 0, eh, s, N), 0);
    CHECK_EQ(stats_of(f).holdings, st.holdings);
    /* errors: the index stays unchanged */
    struct fx_snap s0;
    fx_snapshot(f->ix, __LINE__, &s0);
    uint64_t dup[2] = {0x77, 0x77};
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w0, 0, KVI_TIER_GPU, false, 0, 3, eh + 3, s + 3, 1), -EINVAL);
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w0, 0, KVI_TIER_GPU, true, 0x12345, 0, eh + 5, s + 5, 1), -ENOENT);
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w1, 0, KVI_TIER_GPU, false, 0, 0, dup, s, 2), -EINVAL);
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w1, 0, KVI_TIER_GPU, false, 0, 0, eh, NULL, 2), -EINVAL);
    CHECK_EQ(kvi_index_store_seq_only(f->ix, 4000, 0, KVI_TIER_GPU, false, 0, 0, eh, s, 2), -EINVAL);
    CHECK_EQ(kvi_index_store_seq_only(f->ix, w1, 0, KVI_TIER_GPU, false, 0, 0, eh, s, 0), 0);
    fx_expect_snap(f, __LINE__, &s0, "after rejected seq-only stores");
    fx_snap_free(&s0);
    struct kvi_index_stats st2 = stats_of(f);
    CHECK_EQ(st2.invalid_events, st.invalid_events + 2);
    CHECK_EQ(st2.parent_not_found, st.parent_not_found + 1);
    CHECK_EQ(st2.slots, st.slots);
    /* a worker with tokens shares the entries and fills in their content */
    STORE(f, w1, c, 0, N);
    EXPECT(f, c, N, {w0, 0, N, N}, {w1, 0, N, N});
    CHECK_EQ(stats_of(f).entries, entries0 + N);
    struct fx_snap sn;
    fx_snapshot(f->ix, __LINE__, &sn);
    for (size_t i = 0; i < sn.n; i++)
        if (sn.t[i].id == 0) {
            CHECK_EQ(sn.t[i].no_content, 0);
            CHECK_EQ(sn.t[i].ch, c[sn.t[i].pos]);
        }
    fx_snap_free(&sn);
    /* removals cascade as usual */
    CHECK_EQ(kvi_index_remove(f->ix, w0, 0, KVI_TIER_GPU, &eh[2], 1), 1);
    EXPECT(f, c, N, {w0, 0, 2, 2}, {w1, 0, N, N});
    fx_round_trip(f, __LINE__, qs, ARRAY_LEN(qs));
    free(s);
}

/* ======================================================================== */
/* plain tests                                                               */
/* ======================================================================== */

/* Run fn in a child process, so that a crash fails this test only. fn reports
 * a failed check by exiting with a non-zero status. */
static void run_in_child(void (*fn)(void), const char *what)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        fail_msg("%s: the child was killed by signal %d", what, WTERMSIG(st));
    if (WEXITSTATUS(st) != 0)
        fail_msg("%s: the child exited with status %d", what, WEXITSTATUS(st));
}

#define CHILD_CHECK(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #cond);               \
            _exit(3);                                                                              \
        }                                                                                          \
    } while (0)

/* An entry held by two workers, then released by both, then destroy (with and
 * without a reclaim in between). */
static void child_destroy_after_release(void)
{
    for (int reclaim = 0; reclaim < 2; reclaim++) {
        struct kvi_index_config cfg = {.block_size = 32, .n_parts = 1, .jump = 0, .key_seed = 1};
        struct kvi_index *ix = kvi_index_create(&cfg);
        CHILD_CHECK(ix != NULL);
        uint32_t w0 = (uint32_t)kvi_index_intern_instance(ix, 0, NULL, false);
        uint32_t w1 = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
        struct kvi_block b = {.engine_hash = 1, .content_hash = 1};
        uint64_t eh = 1;
        CHILD_CHECK(kvi_index_store(ix, w0, 0, KVI_TIER_GPU, false, 0, &b, 1) == 0);
        CHILD_CHECK(kvi_index_store(ix, w1, 0, KVI_TIER_GPU, false, 0, &b, 1) == 0);
        CHILD_CHECK(kvi_index_remove(ix, w0, 0, KVI_TIER_GPU, &eh, 1) == 1);
        CHILD_CHECK(kvi_index_remove(ix, w1, 0, KVI_TIER_GPU, &eh, 1) == 1);
        if (reclaim)
            kvi_index_reclaim(ix, 0);
        kvi_index_destroy(ix);
    }
}

/* kvi_index_destroy after an entry that once had two members was released:
 * must not free the entry's member array twice. */
static void test_destroy_after_shared_entry_released(void **state)
{
    (void)state;
    run_in_child(child_destroy_after_release, "store [1] for W0 and W1, remove both, destroy");
}

/* A slot whose blocks were all removed, in a partition that never sorted
 * anything: dump and clear must work (no qsort on a NULL buffer). */
static void child_dump_emptied_slot(void)
{
    struct kvi_index_config cfg = {.block_size = 32, .n_parts = 1, .jump = 0, .key_seed = 1};
    struct kvi_index *ix = kvi_index_create(&cfg);
    CHILD_CHECK(ix != NULL);
    uint32_t w0 = (uint32_t)kvi_index_intern_instance(ix, 0, NULL, false);
    struct kvi_block b = {.engine_hash = 1, .content_hash = 1};
    uint64_t eh = 1;
    CHILD_CHECK(kvi_index_store(ix, w0, 0, KVI_TIER_GPU, false, 0, &b, 1) == 0);
    CHILD_CHECK(kvi_index_remove(ix, w0, 0, KVI_TIER_GPU, &eh, 1) == 1);
    struct fx_snap s;
    memset(&s, 0, sizeof s);
    s.ix = ix;
    kvi_index_dump_partition(ix, 0, fx_dump_emit, &s);
    CHILD_CHECK(s.n == 0);
    kvi_index_clear(ix, w0);
    kvi_index_destroy(ix);
}

static void test_dump_and_clear_emptied_slot(void **state)
{
    (void)state;
    run_in_child(child_dump_emptied_slot, "store [1], remove it, dump_partition, clear");
}

static void test_create_invalid(void **state)
{
    (void)state;
    errno = 0;
    assert_null(kvi_index_create(NULL));
    assert_int_equal(errno, EINVAL);
    const struct kvi_index_config bad[] = {{0, 1, 0, 0}, {32, 0, 0, 0}, {32, 1025, 0, 0}, {0, 0, 0, 0}};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        errno = 0;
        assert_null(kvi_index_create(&bad[i]));
        assert_int_equal(errno, EINVAL);
    }
    struct kvi_index_config ok = {1, 1024, 0, 0};
    struct kvi_index *ix = kvi_index_create(&ok);
    assert_non_null(ix);
    assert_int_equal(kvi_index_block_size(ix), 1);
    assert_int_equal(kvi_index_n_parts(ix), 1024);
    for (uint32_t i = 0; i < 2048; i++) {
        int64_t d = kvi_index_intern_instance(ix, i, NULL, false);
        assert_int_equal(d, (int64_t)i);
        assert_true(kvi_index_partition_of(ix, (uint32_t)d) < 1024);
    }
    assert_int_equal(kvi_index_find_instance(ix, 5, NULL), 5);
    assert_int_equal(kvi_index_find_instance(ix, 99999, NULL), -ENOENT);
    assert_int_equal(kvi_index_instance_info(ix, 99999, NULL, NULL, NULL), -ENOENT);
    /* numeric and string ids are distinct spaces */
    int64_t named = kvi_index_intern_instance(ix, 5, "5", false);
    assert_true(named >= 2048);
    const char *name = NULL;
    uint64_t id = 1;
    assert_int_equal(kvi_index_instance_info(ix, (uint32_t)named, &id, &name, NULL), 0);
    assert_string_equal(name, "5");
    kvi_index_destroy(ix);
    kvi_index_destroy(NULL);
}

/*
 * Regression (writer_stress_test under TSan): an entry released after it had
 * a member array must name no member in `one`. Readers still probing it (they
 * found it before its tombstones) read `one` first; with the old layout the
 * member `one` named before the array existed could still be there, and its
 * slot may have been forgotten and its id recycled by then (a read racing
 * with the new slot's initialisation, and a wrong slot credited).
 */
static void test_released_entry_names_no_member(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 1, .key_seed = 7};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    uint32_t w[3];
    for (uint32_t i = 0; i < 3; i++)
        w[i] = (uint32_t)kvi_index_intern_instance(ix, i, NULL, false);
    struct kvi_block b = {.engine_hash = 0x42, .content_hash = 1};
    uint64_t eh = 0x42;
    /* orders of removal: the first member last, first, in the middle */
    static const uint32_t orders[3][3] = {{1, 2, 0}, {0, 1, 2}, {1, 0, 2}};
    for (int o = 0; o < 3; o++) {
        for (uint32_t i = 0; i < 3; i++)
            assert_int_equal(kvi_index_store(ix, w[i], 0, KVI_TIER_GPU, false, 0, &b, 1), 0);
        struct kvi_part *p = &ix->parts[0];
        uint32_t pending0 = p->n_pending;
        for (uint32_t k = 0; k < 3; k++)
            assert_int_equal(kvi_index_remove(ix, w[orders[o][k]], 0, KVI_TIER_GPU, &eh, 1), 1);
        assert_int_equal(p->n_pending, pending0 + 1);
        const struct kvi_entry *e = kvi__entry(p, p->pending_idx[p->n_pending - 1]);
        /* no member left for a reader: `one` no longer says KVI_MANY_BIT */
        assert_int_equal(atomic_load(&((struct kvi_entry *)e)->one), KVI_NONE);
    }
    kvi_index_destroy(ix);
}

static size_t seq_matches(struct kvi_index *ix, const uint64_t *seq, size_t n, struct kvi_match *out)
{
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches_by_seq(ix, seq, n, out, 16);
    kvi_rcu_read_unlock();
    qsort(out, r < 16 ? r : 16, sizeof *out, fx_cmp_match);
    return r;
}

/*
 * Seq tables are built on demand: content stores leave them out; a query by
 * seq hashes in a partition without one walks child links (exact answers)
 * and asks for them; each writer builds its partition's table at its next
 * mutation or reclaim (skipping freed entries) and maintains it after; a
 * store given seq hashes builds it at once.
 */
static void test_seq_table_on_demand(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 2, .jump = 4, .key_seed = 11};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    uint32_t w0 = (uint32_t)kvi_index_intern_instance(ix, 10, NULL, false); /* partition 0 */
    uint32_t w1 = (uint32_t)kvi_index_intern_instance(ix, 11, NULL, false); /* partition 1 */
    uint32_t w2 = (uint32_t)kvi_index_intern_instance(ix, 12, NULL, false); /* partition 0 */
    assert_int_equal(kvi_index_partition_of(ix, w0), kvi_index_partition_of(ix, w2));
    enum { N = 50 };
    uint64_t a[N], b[N], sa[N], sb[N];
    fx_range(a, N, 1);
    memcpy(b, a, sizeof b);
    b[20] = 999; /* b branches from a at position 20 */
    kvi_seq_hashes(a, N, sa);
    kvi_seq_hashes(b, N, sb);
    struct kvi_block blk[N];
    for (uint32_t i = 0; i < N; i++)
        blk[i] = (struct kvi_block){sa[i], a[i]};
    assert_int_equal(kvi_index_store(ix, w0, 0, KVI_TIER_GPU, false, 0, blk, N), 0);
    assert_int_equal(kvi_index_store(ix, w1, 0, KVI_TIER_GPU, false, 0, blk, 30), 0);
    /* freed entries in partition 0 before any seq table exists */
    for (uint32_t i = 0; i < N; i++)
        blk[i] = (struct kvi_block){sb[i] ^ 1, b[i]};
    assert_int_equal(kvi_index_store(ix, w2, 0, KVI_TIER_GPU, false, 0, blk, N), 0);
    uint64_t gone = sb[35] ^ 1;
    assert_int_equal(kvi_index_remove(ix, w2, 0, KVI_TIER_GPU, &gone, 1), 1);
    for (uint32_t pi = 0; pi < 2; pi++)
        assert_null(atomic_load(&ix->parts[pi].stab.t));
    assert_false(atomic_load(&ix->seq_wanted));
    struct kvi_index_stats st0;
    kvi_index_stats(ix, &st0);

    /* answers through seq walks */
    struct kvi_match m[16];
    assert_int_equal(seq_matches(ix, sa, N, m), 3);
    assert_int_equal(m[0].depth, N);
    assert_int_equal(m[1].depth, 30);
    assert_int_equal(m[2].depth, 20);
    assert_int_equal(seq_matches(ix, sb, N, m), 3);
    assert_int_equal(m[0].depth, 20);
    assert_int_equal(m[1].depth, 20);
    assert_int_equal(m[2].depth, 35);
    assert_true(atomic_load(&ix->seq_wanted));
    for (uint32_t pi = 0; pi < 2; pi++)
        assert_null(atomic_load(&ix->parts[pi].stab.t)); /* readers never build */

    /* partition 0 builds at its writer's reclaim; mixed answers agree */
    kvi_index_reclaim(ix, 0);
    struct kvi_tab *t0 = atomic_load(&ix->parts[0].stab.t);
    assert_non_null(t0);
    assert_int_equal(t0->live, atomic_load(&ix->parts[0].entries)); /* freed entries left out */
    assert_null(atomic_load(&ix->parts[1].stab.t));
    assert_int_equal(seq_matches(ix, sb, N, m), 3);
    assert_int_equal(m[2].depth, 35);
    /* partition 1 builds at its writer's next mutation */
    uint64_t unknown = 0x1234;
    assert_int_equal(kvi_index_remove(ix, w1, 0, KVI_TIER_GPU, &unknown, 1), 0);
    assert_non_null(atomic_load(&ix->parts[1].stab.t));
    struct kvi_index_stats st1;
    kvi_index_stats(ix, &st1);
    assert_true(st1.bytes > st0.bytes);
    assert_int_equal(st1.entries, st0.entries);
    /* maintained from now on */
    uint64_t cut = sa[10];
    assert_int_equal(kvi_index_remove(ix, w0, 0, KVI_TIER_GPU, &cut, 1), 1);
    for (uint32_t i = 0; i < N; i++)
        blk[i] = (struct kvi_block){sa[i] ^ 7, a[i]};
    assert_int_equal(kvi_index_store(ix, w1, 1, KVI_TIER_GPU, false, 0, blk, 40), 0);
    assert_int_equal(seq_matches(ix, sa, N, m), 4);
    uint32_t depths[4] = {m[0].depth, m[1].depth, m[2].depth, m[3].depth};
    assert_int_equal(depths[0], 10);
    assert_int_equal(depths[1], 30);
    assert_int_equal(depths[2], 20); /* w2 */
    assert_int_equal(depths[3], 40); /* w1 rank 1: the newest slot */
    assert_int_equal(atomic_load(&ix->parts[0].stab.t)->live, atomic_load(&ix->parts[0].entries));
    assert_int_equal(atomic_load(&ix->parts[1].stab.t)->live, atomic_load(&ix->parts[1].entries));
    kvi_index_destroy(ix);

    /* a store given seq hashes builds its partition's table at once */
    ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    w0 = (uint32_t)kvi_index_intern_instance(ix, 10, NULL, false);
    for (uint32_t i = 0; i < N; i++)
        blk[i] = (struct kvi_block){sa[i], a[i]};
    assert_int_equal(kvi_index_store_seq(ix, w0, 0, KVI_TIER_GPU, false, 0, 0, blk, sa, 5), 0);
    assert_non_null(atomic_load(&ix->parts[0].stab.t));
    assert_null(atomic_load(&ix->parts[1].stab.t));
    assert_true(atomic_load(&ix->seq_wanted));
    assert_int_equal(seq_matches(ix, sa, N, m), 1);
    assert_int_equal(m[0].depth, 5);
    kvi_index_destroy(ix);
}

/* Walk parent's child list forwards, checking every back link and parent
 * link. @return the number of children. */
static uint32_t child_list_check(const struct kvi_part *p, uint32_t parent)
{
    uint32_t n = 0, prev = KVI_NONE;
    for (uint32_t c = atomic_load(&kvi__entry(p, parent)->first_child); c != KVI_NONE;
         c = atomic_load(&kvi__entry(p, c)->next_sibling)) {
        const struct kvi_entry *e = kvi__entry(p, c);
        assert_int_equal(e->prev_sibling, prev);
        assert_int_equal(e->up & KVI_UP_PARENT, parent);
        prev = c;
        n++;
        assert_true(n <= 1u << 20);
    }
    return n;
}

/*
 * Children are unlinked in O(1) through a back link: one entry shared by
 * every worker (a system prompt's first block) with a child per worker;
 * children removed in a scrambled order (first, last and middle of the list),
 * some re-stored, some with children of their own (cascades). After every
 * step the list's links are consistent, and a query by seq hashes, which
 * follows the child links while the partition has no seq table, answers
 * exactly.
 */
static void test_child_list_unlink(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 1, .jump = 2, .key_seed = 5};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    enum { K = 48, D = 3 };
    uint32_t w[K];
    uint64_t c[K][D], sq[K][D];
    for (uint32_t i = 0; i < K; i++) {
        w[i] = (uint32_t)kvi_index_intern_instance(ix, 100 + i, NULL, false);
        c[i][0] = 7; /* shared first block */
        c[i][1] = 1000 + i;
        c[i][2] = 5000 + i;
        kvi_seq_hashes(c[i], D, sq[i]);
    }
    struct kvi_part *p = &ix->parts[0];
    bool held[K];
    uint64_t rng = 99;
    for (uint32_t i = 0; i < K; i++) {
        struct kvi_block b[D];
        for (uint32_t j = 0; j < D; j++)
            b[j] = (struct kvi_block){sq[i][j], c[i][j]};
        assert_int_equal(kvi_index_store(ix, w[i], 0, KVI_TIER_GPU, false, 0, b, i % 2 ? D : 2), 0);
        held[i] = true;
    }
    uint32_t root = KVI_NONE; /* the one entry at position 0 */
    for (uint32_t i = 1; i < p->next_fresh; i++)
        if (kvi__entry(p, i)->pos == 0)
            root = i;
    assert_int_not_equal(root, KVI_NONE);
    assert_int_equal(child_list_check(p, root), K);
    uint32_t live = K;
    for (uint32_t step = 0; step < 4 * K; step++) {
        uint32_t i = step < 3 ? (step == 0 ? K - 1 : step == 1 ? 0 : K / 2) /* head, tail, middle */
                              : (uint32_t)(splitmix(&rng) % K);
        if (held[i]) {
            uint64_t eh = sq[i][1]; /* cascades to the third block where held */
            assert_int_equal(kvi_index_remove(ix, w[i], 0, KVI_TIER_GPU, &eh, 1), 1);
            held[i] = false;
            live--;
        } else {
            struct kvi_block b = {sq[i][1], c[i][1]};
            assert_int_equal(kvi_index_store(ix, w[i], 0, KVI_TIER_GPU, true, sq[i][0], &b, 1), 0);
            held[i] = true;
            live++;
        }
        if (step % 3 == 0)
            kvi_index_reclaim(ix, 0); /* recycle freed entries into new children */
        assert_int_equal(child_list_check(p, root), live);
        /* seq walks over the list (keep the partition without a seq table) */
        for (uint32_t x = 0; x < K; x += 5) {
            struct kvi_match m[K];
            kvi_rcu_read_lock();
            size_t r = kvi_index_find_matches_by_seq(ix, sq[x], 2, m, K);
            kvi_rcu_read_unlock();
            assert_int_equal(r, K);
            for (size_t j = 0; j < r; j++)
                assert_int_equal(m[j].depth, m[j].instance == w[x] && held[x] ? 2 : 1);
        }
        atomic_store(&ix->seq_wanted, false);
        assert_null(atomic_load(&p->stab.t));
    }
    kvi_index_destroy(ix);
}

/*
 * A store looks up the whole run's engine hashes first; a rename earlier in
 * the run can make a later lookup stale. Here block 2 is held under h3
 * (renamed by a store below h1, which dropped the block h3 named before), and
 * the original run is stored again: at block 2 the slot renames h3 -> h2, so
 * at block 3, h3 names nothing any more and must not drop block 2.
 * (Found by index_diff_test, seed 14, while the lookups moved ahead of the
 * store loop.)
 */
static void test_store_rename_then_reuse_name(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 1, .key_seed = 3};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    uint32_t w = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
    enum { N = 12 };
    uint64_t c[N];
    struct kvi_block run[N];
    for (uint32_t i = 0; i < N; i++) {
        c[i] = 100 + i;
        run[i] = (struct kvi_block){0xe000 + i, c[i]};
    }
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, run, N), 0);
    /* below h1: the prefix of block 2, named h(N-1) (which named the last block) */
    struct kvi_block b = {0xe000 + N - 1, c[2]};
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, true, 0xe001, &b, 1), 0);
    struct kvi_match m[4];
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches(ix, c, N, m, 4);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, N - 1); /* the last block was dropped */
    assert_int_equal(m[0].tree_size, N - 1);
    /* the original run again (longer than the small-run paths): back to N */
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, run, N), 0);
    kvi_rcu_read_lock();
    r = kvi_index_find_matches(ix, c, N, m, 4);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, N);
    assert_int_equal(m[0].tree_size, N);
    uint64_t last = 0xe000 + N - 1, two = 0xe002;
    assert_int_equal(kvi_index_remove(ix, w, 0, KVI_TIER_GPU, &last, 1), 1);
    assert_int_equal(kvi_index_remove(ix, w, 0, KVI_TIER_GPU, &two, 1), 1);
    kvi_rcu_read_lock();
    r = kvi_index_find_matches(ix, c, N, m, 4);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, 2);
    kvi_index_destroy(ix);
}

/* Worker w stores the 2-block sequence q of test_tables_shrink_and_regrow. */
static void shrink_store(struct kvi_index *ix, uint32_t w, uint32_t q)
{
    struct kvi_block b[2] = {{0xe000000000ull + 2 * q, 0x5100000000ull + 2 * q},
                             {0xe000000001ull + 2 * q, 0x5100000001ull + 2 * q}};
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, b, 2), 0);
}

/* Depth of the match for the 2-block sequence q of
 * test_tables_shrink_and_regrow (0: none). */
static uint32_t shrink_depth(struct kvi_index *ix, uint32_t q)
{
    uint64_t c[2] = {0x5100000000ull + 2 * q, 0x5100000001ull + 2 * q};
    struct kvi_match m[2];
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches(ix, c, 2, m, 2);
    kvi_rcu_read_unlock();
    assert_true(r <= 1);
    return r ? m[0].depth : 0;
}

/*
 * Tables shrink as blocks go and grow again as they come back, and every
 * rehash keeps every live slot: one worker stores 3,000 two-block
 * sequences, removes them in a shuffled order (each root removal takes its
 * child along), checking every sequence's answer after each tenth, then
 * stores them all again. The key table and the slot map must have shrunk
 * (tombstone-heavy tables: the rehash gathers live slots among tombstones and
 * empty ones in blocks of 256, and small tables are shorter than a block).
 */
static void test_tables_shrink_and_regrow(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 1, .key_seed = 21};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    uint32_t w = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
    struct kvi_part *p = &ix->parts[0];
    enum { Q = 3000 };
    uint32_t *order = malloc(Q * sizeof *order);
    bool *gone = calloc(Q, sizeof *gone);
    assert_non_null(order);
    assert_non_null(gone);
    for (int round = 0; round < 2; round++) {
        for (uint32_t q = 0; q < Q; q++) {
            shrink_store(ix, w, q);
            gone[q] = false;
        }
        uint32_t kcap_full = atomic_load(&p->ktab.t)->mask + 1;
        struct kvi_index_stats st;
        kvi_index_stats(ix, &st);
        assert_int_equal(st.entries, 2 * Q);
        uint64_t rng = 77 + (uint64_t)round;
        for (uint32_t q = 0; q < Q; q++)
            order[q] = q;
        for (uint32_t q = Q - 1; q > 0; q--) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t j = (uint32_t)((rng >> 33) % (q + 1)), t = order[q];
            order[q] = order[j];
            order[j] = t;
        }
        uint32_t kcap_min = kcap_full;
        for (uint32_t k = 0; k < Q; k++) {
            uint64_t root = 0xe000000000ull + 2 * order[k];
            assert_int_equal(kvi_index_remove(ix, w, 0, KVI_TIER_GPU, &root, 1), 1);
            gone[order[k]] = true;
            struct kvi_tab *kt = atomic_load(&p->ktab.t);
            if (kt != NULL && kt->mask + 1 < kcap_min)
                kcap_min = kt->mask + 1;
            if ((k + 1) % (Q / 10) == 0 || Q - k < 20) {
                kvi_index_reclaim(ix, 0);
                kvi_index_stats(ix, &st);
                assert_int_equal(st.entries, 2 * (uint64_t)(Q - k - 1));
                for (uint32_t q = 0; q < Q; q++)
                    assert_int_equal(shrink_depth(ix, q), gone[q] ? 0 : 2);
            }
        }
        assert_true(kcap_min * 16 <= kcap_full); /* the key table shrank, more than once */
    }
    /* the slot map shrank too: all but 3 sequences gone */
    for (uint32_t q = 0; q < Q; q++)
        shrink_store(ix, w, q);
    uint32_t sid = 0;
    for (uint32_t id = 1; id < atomic_load(&ix->n_slot_ids); id++)
        if (kvi__slot(ix, id)->instance == w)
            sid = id;
    assert_int_not_equal(sid, 0);
    uint32_t mcap_full = atomic_load(&kvi__slot(ix, sid)->map.t)->mask + 1;
    for (uint32_t q = 3; q < Q; q++) {
        uint64_t root = 0xe000000000ull + 2 * q;
        assert_int_equal(kvi_index_remove(ix, w, 0, KVI_TIER_GPU, &root, 1), 1);
    }
    assert_true((atomic_load(&kvi__slot(ix, sid)->map.t)->mask + 1) * 16 <= mcap_full);
    for (uint32_t q = 0; q < Q; q++)
        assert_int_equal(shrink_depth(ix, q), q < 3 ? 2 : 0);
    free(order);
    free(gone);
    kvi_index_destroy(ix);
}

/*
 * Capacity hints: kvi_index_reserve and kvi_index_reserve_slot size the key
 * table, entry storage and a slot's map up front, so that storing that much
 * neither rehashes nor allocates entry chunks; contents and answers are
 * unchanged, and invalid arguments are rejected.
 */
static void test_reserve(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 2, .key_seed = 9};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    uint32_t w = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
    struct kvi_part *p = &ix->parts[kvi_index_partition_of(ix, w)];
    enum { N = 3000 };
    uint64_t *c = xalloc_u64(N);
    struct kvi_block *b = calloc(N, sizeof *b);
    assert_non_null(b);
    for (uint32_t i = 0; i < N; i++) {
        c[i] = 7000 + i;
        b[i] = (struct kvi_block){0xb000 + i, c[i]};
    }
    /* some content first: reserving keeps it */
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, b, 10), 0);
    assert_int_equal(kvi_index_reserve(ix, kvi_index_partition_of(ix, w), 2 * N), 0);
    assert_int_equal(kvi_index_reserve_slot(ix, w, 0, KVI_TIER_GPU, N), 0);
    struct kvi_tab *kt = atomic_load(&p->ktab.t);
    assert_true((uint64_t)kt->mask + 1 >= 2 * N);
    uint32_t sid = 0;
    for (uint32_t id = 1; id < atomic_load(&ix->n_slot_ids); id++)
        if (kvi__slot(ix, id)->instance == w)
            sid = id;
    assert_int_not_equal(sid, 0);
    struct kvi_tab *mt = atomic_load(&kvi__slot(ix, sid)->map.t);
    uint32_t chunks = p->n_chunks;
    assert_true(chunks >= (2 * N + KVI_ENTRY_CHUNK) / KVI_ENTRY_CHUNK);
    struct kvi_match m[2];
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches(ix, c, N, m, 2);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, 10);
    /* storing up to the hint: no table replaced (nor counted as rebuilt),
     * no chunk added */
    struct kvi_index_stats sr0, sr1;
    kvi_index_stats(ix, &sr0);
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, b, N), 0);
    kvi_index_stats(ix, &sr1);
    assert_int_equal(sr1.table_rebuilds, sr0.table_rebuilds);
    assert_int_equal(sr1.table_rebuild_slots, sr0.table_rebuild_slots);
    assert_ptr_equal(atomic_load(&p->ktab.t), kt);
    assert_ptr_equal(atomic_load(&kvi__slot(ix, sid)->map.t), mt);
    assert_int_equal(p->n_chunks, chunks);
    kvi_rcu_read_lock();
    r = kvi_index_find_matches(ix, c, N, m, 2);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, N);
    assert_int_equal(m[0].tree_size, N);
    /* a smaller hint changes nothing; a slot can be created by its hint */
    assert_int_equal(kvi_index_reserve(ix, kvi_index_partition_of(ix, w), 5), 0);
    assert_ptr_equal(atomic_load(&p->ktab.t), kt);
    struct kvi_index_stats st0, st1;
    kvi_index_stats(ix, &st0);
    assert_int_equal(kvi_index_reserve_slot(ix, w, 3, KVI_TIER_CPU, 100), 0);
    kvi_index_stats(ix, &st1);
    assert_int_equal(st1.slots, st0.slots + 1);
    assert_int_equal(st1.holdings, st0.holdings);
    assert_int_equal(kvi_index_tree_size(ix, w, 3), 0);
    /* errors */
    assert_int_equal(kvi_index_reserve(ix, 2, 10), -EINVAL);
    assert_int_equal(kvi_index_reserve(ix, 0, 1ull << 40), -EINVAL);
    assert_int_equal(kvi_index_reserve_slot(ix, 99, 0, KVI_TIER_GPU, 10), -EINVAL);
    assert_int_equal(kvi_index_reserve_slot(ix, w, 0, (enum kvi_tier)7, 10), -EINVAL);
    assert_int_equal(kvi_index_reserve_slot(ix, w, 0, KVI_TIER_GPU, 1ull << 40), -EINVAL);
    assert_int_equal(kvi_index_reserve_slot(ix, w, 0, KVI_TIER_GPU, UINT64_MAX), -EINVAL);
    assert_int_equal(kvi_index_reserve(ix, 0, UINT64_MAX), -EINVAL);
    /* with a seq table, it is sized too */
    uint64_t sq[4];
    kvi_seq_hashes(c, 4, sq);
    kvi_rcu_read_lock();
    (void)kvi_index_find_matches_by_seq(ix, sq, 4, m, 2); /* asks for seq tables */
    kvi_rcu_read_unlock();
    assert_int_equal(kvi_index_reserve(ix, kvi_index_partition_of(ix, w), 4 * N), 0);
    struct kvi_tab *stt = atomic_load(&p->stab.t);
    assert_non_null(stt);
    assert_true((uint64_t)stt->mask + 1 >= 4 * N);
    assert_int_equal(stt->live, atomic_load(&p->entries));
    kvi_rcu_read_lock();
    r = kvi_index_find_matches_by_seq(ix, sq, 4, m, 2);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, 4);
    free(b);
    free(c);
    kvi_index_destroy(ix);
}

/*
 * A reservation is a floor: the partition's key table and the slot's map
 * keep their reserved size while the pool drains (block by block, or all at
 * once by AllBlocksCleared) and fills again, so that nothing is rebuilt up
 * to the reserved size; the same cycle without a reservation rebuilds (the
 * tables shrink as they empty, then grow), and so does it once the floor is
 * dropped (kvi_index_reserve with 0 entries).
 */
static uint64_t floor_cycle(struct kvi_index *ix, uint32_t w, const struct kvi_block *b, const uint64_t *eh, size_t n)
{
    struct kvi_index_stats s0, s1;
    kvi_index_stats(ix, &s0);
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, b, n), 0);
    for (size_t i = n; i-- > 0;) /* tail first, as engines evict */
        assert_int_equal(kvi_index_remove(ix, w, 0, KVI_TIER_GPU, &eh[i], 1), 1);
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, b, n), 0);
    kvi_index_clear(ix, w);
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, b, n), 0);
    kvi_index_stats(ix, &s1);
    assert_int_equal(s1.holdings, n);
    assert_int_equal(s1.entries, n);
    return s1.table_rebuilds - s0.table_rebuilds;
}

static void test_reserve_floor(void **state)
{
    (void)state;
    enum { N = 2000 };
    struct kvi_block *b = calloc(N, sizeof *b);
    uint64_t *eh = xalloc_u64(N);
    assert_non_null(b);
    for (uint32_t i = 0; i < N; i++) {
        eh[i] = 0xe000 + i;
        b[i] = (struct kvi_block){eh[i], 9000 + i};
    }
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 2, .key_seed = 3};
    /* no reservation: the cycle rebuilds */
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    uint32_t w = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
    assert_int_not_equal(floor_cycle(ix, w, b, eh, N), 0);
    kvi_index_destroy(ix);
    /* reserved for the pool: the first fill and every refill rebuild nothing */
    ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    w = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
    uint32_t part = kvi_index_partition_of(ix, w);
    assert_int_equal(kvi_index_reserve(ix, part, N), 0);
    assert_int_equal(kvi_index_reserve_slot(ix, w, 0, KVI_TIER_GPU, N), 0);
    struct kvi_tab *kt = atomic_load(&ix->parts[part].ktab.t);
    assert_int_equal(floor_cycle(ix, w, b, eh, N), 0);
    assert_int_equal(floor_cycle(ix, w, b, eh, N), 0);
    assert_ptr_equal(atomic_load(&ix->parts[part].ktab.t), kt);
    struct kvi_match m[2];
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches(ix, (const uint64_t[]){9000, 9001, 9002}, 3, m, 2);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, 3);
    /* the floor dropped (key table) and a fresh slot without one: rebuilds again */
    assert_int_equal(kvi_index_reserve(ix, part, 0), 0);
    kvi_index_remove_dp_rank(ix, w, 0);
    assert_int_not_equal(floor_cycle(ix, w, b, eh, N), 0);
    kvi_index_destroy(ix);
    free(eh);
    free(b);
}

/*
 * Table rebuild counters (kvi_index_stats.table_rebuild_*): a chain stored
 * 100 blocks at a time grows the key table and the slot's map alike. A run's
 * first block is inserted alone (its parent is not this store's: the table
 * is created at 16 slots for the very first), then room is made for the 99
 * others at once, doubling past 3/4 used: rebuilt to 256 slots with 1 key
 * in, then to 512, 1,024, 2,048 and 4,096 with 101, 301, 701 and 1,501
 * keys in, so 5 rebuilds moving 2,605 slots per table. The first array of
 * a table is not a rebuild. Removing the chain shrinks both, each shrink
 * counted with the slots it moved; time is counted with them.
 */
static void test_rebuild_counters(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 1, .key_seed = 5};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    uint32_t w = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
    enum { RUN = 100, RUNS = 30, N = RUN * RUNS };
    struct kvi_block *b = calloc(N, sizeof *b);
    uint64_t *eh = xalloc_u64(N);
    assert_non_null(b);
    for (uint32_t i = 0; i < N; i++) {
        eh[i] = 0x5100000000ull + i * 0x9e3779b97f4a7c15ull;
        b[i] = (struct kvi_block){eh[i], 0x77000 + i};
    }
    struct kvi_index_stats st;
    assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, false, 0, b, RUN), 0);
    kvi_index_stats(ix, &st);
    assert_int_equal(st.table_rebuilds, 2); /* the root's 16 slots, then room for 99 more */
    assert_int_equal(st.table_rebuild_slots, 2);
    for (uint32_t r = 1; r < RUNS; r++)
        assert_int_equal(kvi_index_store(ix, w, 0, KVI_TIER_GPU, true, eh[r * RUN - 1], b + r * RUN, RUN), 0);
    kvi_index_stats(ix, &st);
    assert_int_equal(st.holdings, N);
    assert_int_equal(st.table_rebuilds, 2 * 5);
    assert_int_equal(st.table_rebuild_slots, 2 * (1 + 101 + 301 + 701 + 1501));
    assert_true(st.table_rebuild_ns > 0);
    /* tail first, a run at a time: live falls under 1/8 of 4,096 at 511
     * keys (shrunk to 1,024), under 1/8 of 1,024 at 127 (to 256) and under
     * 1/8 of 256 at 31 (to 64): 3 rebuilds per table */
    uint64_t ns = st.table_rebuild_ns;
    for (uint32_t r = RUNS; r-- > 0;) /* known: the run's first; the rest go as its descendants */
        assert_int_equal(kvi_index_remove(ix, w, 0, KVI_TIER_GPU, eh + r * RUN, RUN), 1);
    kvi_index_stats(ix, &st);
    assert_int_equal(st.holdings, 0);
    assert_int_equal(st.table_rebuilds, 2 * 5 + 2 * 3);
    assert_int_equal(st.table_rebuild_slots, 2 * (1 + 101 + 301 + 701 + 1501) + 2 * (511 + 127 + 31));
    assert_true(st.table_rebuild_ns > ns);
    free(eh);
    free(b);
    kvi_index_destroy(ix);
}

/* kvi_index_prefix_keys (the query side) equals the key chain computed from
 * its definition, for short lengths and a long run, and writes nothing past
 * n: stores chain keys one block at a time and queries must agree bit for
 * bit, whatever way either is computed (a vectorised version was tried and
 * checked against this; engine/README.md, "Identity and tables"). */
static void test_prefix_keys_match_definition(void **state)
{
    (void)state;
    struct kvi_index_config ic = {.block_size = 16, .n_parts = 1, .key_seed = 7};
    struct kvi_index *ix = kvi_index_create(&ic);
    assert_non_null(ix);
    enum { N = 1037 };
    uint64_t *c = malloc(N * sizeof *c), *got = malloc(N * sizeof *got), *want = malloc(N * sizeof *want);
    uint64_t rng = 99;
    for (size_t i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        c[i] = rng ^ (rng >> 29);
    }
    c[3] = 0;
    c[4] = UINT64_MAX;
    c[5] = ix->kxor; /* the content operand of the step is 0 */
    uint64_t k = ix->kseed;
    for (size_t i = 0; i < N; i++) {
        uint64_t w = ((uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull) ^ ix->kmul;
        want[i] = k += kvi_fmix64((c[i] ^ ix->kxor) + w);
    }
    for (size_t n = 0; n <= 70; n++) {
        memset(got, 0, N * sizeof *got);
        kvi_index_prefix_keys(ix, c, n, got);
        assert_memory_equal(got, want, n * sizeof *got);
        if (n < N)
            assert_int_equal(got[n], 0); /* nothing written past n */
    }
    kvi_index_prefix_keys(ix, c, N, got);
    assert_memory_equal(got, want, N * sizeof *got);
    free(c);
    free(got);
    free(want);
    kvi_index_destroy(ix);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Structured content hashes (small integers, single bits, all ones but one
 * bit: what a client hashing with something weaker than XXH3 might send) give
 * distinct prefix keys: the 4.1 M chains of 3 blocks over 160 such values
 * all end in different keys, and the keys' top bits (table tags and home
 * slots) spread evenly. A step that is linear, or whose low bits ignore high input bits,
 * fails this: chains that differ by small amounts at two depths cancel. */
static void test_prefix_keys_structured_contents(void **state)
{
    (void)state;
    struct kvi_index_config ic = {.block_size = 16, .n_parts = 1, .key_seed = 11};
    struct kvi_index *ix = kvi_index_create(&ic);
    assert_non_null(ix);
    enum { V = 160 };
    uint64_t val[V];
    for (size_t i = 0; i < 64; i++)
        val[i] = i; /* small integers */
    for (size_t i = 0; i < 58; i++)
        val[64 + i] = 1ull << (i + 6); /* single bits above them */
    for (size_t i = 0; i < 7; i++)
        val[122 + i] = (uint64_t)(2 * i + 3) << 56; /* top bits only */
    for (size_t i = 0; i < 31; i++)
        val[129 + i] = ~(1ull << (2 * i)); /* all ones but one bit */
    for (size_t i = 0; i < V; i++)
        for (size_t j = 0; j < i; j++)
            assert_true(val[i] != val[j]);
    size_t n = (size_t)V * V * V;
    uint64_t *keys = malloc(n * sizeof *keys);
    assert_non_null(keys);
    size_t m = 0;
    for (size_t a = 0; a < V; a++)
        for (size_t b = 0; b < V; b++)
            for (size_t c = 0; c < V; c++) {
                uint64_t ch[3] = {val[a], val[b], val[c]}, k[3];
                kvi_index_prefix_keys(ix, ch, 3, k);
                keys[m++] = k[2];
            }
    qsort(keys, n, sizeof *keys, cmp_u64);
    for (size_t i = 1; i < n; i++)
        assert_true(keys[i] != keys[i - 1]);
    /* tags: 4.1 M keys in 2^16 buckets by their top 16 bits, each near 62.5 */
    uint32_t *bucket = calloc(1u << 16, sizeof *bucket);
    assert_non_null(bucket);
    for (size_t i = 0; i < n; i++)
        bucket[keys[i] >> 48]++;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (size_t i = 0; i < (1u << 16); i++) {
        lo = bucket[i] < lo ? bucket[i] : lo;
        hi = bucket[i] > hi ? bucket[i] : hi;
    }
    assert_true(lo >= 20 && hi <= 120); /* Poisson(62.5): 6 sigma is 15..110 */
    free(bucket);
    free(keys);
    kvi_index_destroy(ix);
}

/* Content hashes of entries whose key is a stand-in (placed by seq hash
 * alone, KVI_UP_ASIDE) are kept beside the entries: a positional run's first
 * block, and blocks placed without tokens that a later store with tokens
 * reaches. They are dumped right and go with their entries. */
struct aside_ctx {
    uint64_t (*content)[4];
    uint64_t (*seq)[4];
    uint32_t rows, rows_content, wrong;
};

static void aside_emit(void *vctx, const struct kvi_dump_block *b)
{
    struct aside_ctx *x = vctx;
    x->rows++;
    if (b->no_content)
        return;
    x->rows_content++;
    uint32_t r = (b->position - 5) / 8, j = (b->position - 5) % 8;
    if (j >= 4 || x->seq[r][j] != b->seq_hash || x->content[r][j] != b->content_hash)
        x->wrong++;
}

static void test_aside_contents(void **state)
{
    (void)state;
    struct kvi_index_config ic = {.block_size = 16, .n_parts = 1, .key_seed = 5};
    struct kvi_index *ix = kvi_index_create(&ic);
    assert_non_null(ix);
    uint32_t wa = (uint32_t)kvi_index_intern_instance(ix, 1, NULL, false);
    uint32_t wb = (uint32_t)kvi_index_intern_instance(ix, 2, NULL, false);
    enum { R = 300, L = 4 };
    static uint64_t content[R][L], seq[R][L], eh[R][L];
    uint64_t rng = 17;
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t j = 0; j < L; j++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            content[r][j] = kvi_fmix64(rng);
            seq[r][j] = kvi_fmix64(rng ^ 1);
            eh[r][j] = kvi_fmix64(rng ^ 2);
        }
    struct kvi_part *p = &ix->parts[0];
    uint32_t want_aside = 0;
    for (uint32_t r = 0; r < R; r++) {
        struct kvi_block blk[L];
        for (uint32_t j = 0; j < L; j++)
            blk[j] = (struct kvi_block){eh[r][j], content[r][j]};
        uint32_t pos = 5 + 8 * r;
        if (r % 2 == 0) { /* with tokens at a position: the first key is a stand-in */
            assert_int_equal(kvi_index_store_seq(ix, wa, 0, KVI_TIER_CPU, false, 0, pos, blk, seq[r], L), 0);
            want_aside += 1;
        } else { /* without tokens, then with them by another worker: every key is a stand-in */
            assert_int_equal(kvi_index_store_seq_only(ix, wa, 0, KVI_TIER_CPU, false, 0, pos, eh[r], seq[r], L), 0);
            assert_int_equal(p->aside_n, want_aside);
            assert_int_equal(kvi_index_store_seq(ix, wb, 0, KVI_TIER_CPU, false, 0, pos, blk, seq[r], L), 0);
            want_aside += L;
        }
        assert_int_equal(p->aside_n, want_aside);
    }
    struct aside_ctx x = {content, seq, 0, 0, 0};
    kvi_index_dump_partition(ix, 0, aside_emit, &x);
    assert_int_equal(x.rows, R / 2 * L + R / 2 * 2 * L);
    assert_int_equal(x.rows_content, x.rows); /* every block learned its content */
    assert_int_equal(x.wrong, 0);
    /* worker b goes: the entries stay (a holds them), their contents too */
    kvi_index_remove_instance(ix, wb);
    memset(&x, 0, sizeof x);
    x.content = content;
    x.seq = seq;
    kvi_index_dump_partition(ix, 0, aside_emit, &x);
    assert_int_equal(x.rows, R * L);
    assert_int_equal(x.wrong, 0);
    assert_int_equal(p->aside_n, want_aside);
    /* worker a's blocks go, runs in a scattered order, each run tail first */
    for (uint32_t k = 0; k < R; k++) {
        uint32_t r = (k * 7) % R;
        for (uint32_t j = L; j-- > 0;)
            assert_int_equal(kvi_index_remove(ix, wa, 0, KVI_TIER_CPU, &eh[r][j], 1), 1);
        want_aside -= r % 2 == 0 ? 1 : L;
        assert_int_equal(p->aside_n, want_aside);
        if (k == R / 2) { /* what is left still dumps right */
            memset(&x, 0, sizeof x);
            x.content = content;
            x.seq = seq;
            kvi_index_dump_partition(ix, 0, aside_emit, &x);
            assert_int_equal(x.rows, (R - k - 1) * L);
            assert_int_equal(x.wrong, 0);
        }
    }
    assert_int_equal(p->aside_n, 0);
    kvi_index_destroy(ix);
}

/* Scratch grown by one huge op is given back at the next reclaim (the
 * writer's idle point); small scratch is kept. */
static void test_reclaim_trims_scratch(void **state)
{
    (void)state;
    struct kvi_index_config ic = {.block_size = 16, .n_parts = 1, .key_seed = 3};
    struct kvi_index *ix = kvi_index_create(&ic);
    int64_t w = kvi_index_intern_instance(ix, 1, NULL, false);
    assert_true(w >= 0);
    enum { N = 100000 };
    struct kvi_block *b = malloc(N * sizeof *b);
    uint64_t *eh = malloc(N * sizeof *eh);
    for (size_t i = 0; i < N; i++) {
        b[i] = (struct kvi_block){1000 + i, 77 + i};
        eh[i] = 1000 + (N - 1 - i); /* tail first: each remove is a leaf */
    }
    struct kvi_part *p = &ix->parts[0];
    assert_int_equal(kvi_index_store(ix, (uint32_t)w, 0, KVI_TIER_GPU, false, 0, b, 8), 0);
    kvi_index_reclaim(ix, 0);
    size_t small = p->cap_runbuf;
    assert_true(small > 0 && small <= 64);
    assert_int_equal(kvi_index_store(ix, (uint32_t)w, 0, KVI_TIER_GPU, false, 0, b, N), 0);
    assert_true(p->cap_runbuf >= 4 * (size_t)N);
    assert_true(p->cap_dup > 64u << 10);
    kvi_index_reclaim(ix, 0);
    assert_int_equal(p->cap_runbuf, 0);
    assert_int_equal(p->cap_dup, 0);
    /* still works after the trim, and the index is intact */
    assert_int_equal(kvi_index_remove(ix, (uint32_t)w, 0, KVI_TIER_GPU, eh, N / 2), N / 2);
    uint64_t *c = malloc(N * sizeof *c);
    for (size_t i = 0; i < N; i++)
        c[i] = b[i].content_hash;
    struct kvi_match m[2];
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches(ix, c, N, m, 2);
    kvi_rcu_read_unlock();
    assert_int_equal(r, 1);
    assert_int_equal(m[0].depth, N / 2);
    free(b);
    free(eh);
    free(c);
    kvi_index_destroy(ix);
}

static int group_setup(void **state)
{
    (void)state;
    kvi_rcu_register_thread();
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    kvi_rcu_unregister_thread();
    return 0;
}

/* kvi_index_check_tables passes on @p ix. */
static void expect_tables_ok(const struct kvi_index *ix)
{
    char why[200];
    if (kvi_index_check_tables(ix, why, sizeof why) != 0)
        fail_msg("%s", why);
}

/* The cpu and disk depths of the seq chain @p q (n hashes) over the shared pools. */
static void expect_pool_depths(const struct kvi_index *ix, const uint64_t *q, size_t n, uint32_t cpu_want,
                               uint32_t disk_want)
{
    uint32_t cpu = 0, disk = 0;
    kvi_rcu_read_lock();
    kvi_index_pool_depths(ix, NULL, q, n, &cpu, &disk);
    kvi_rcu_read_unlock();
    assert_int_equal(cpu, cpu_want);
    assert_int_equal(disk, disk_want);
}

/* A publisher's seq hash at two depths (token-less RFC 1527 stores: the
 * hashes are the publisher's) names one entry per depth, each found at its
 * own: the seq table stays whole and both answer (fuzz_ingest finding). */
static void test_seq_hash_at_two_depths(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 4, .n_parts = 1};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    int64_t pool = kvi_index_intern_instance(ix, 0, "store-0", true);
    int64_t w = kvi_index_intern_instance(ix, 2, NULL, false);
    assert_true(pool >= 0 && w >= 0);
    uint64_t s1[2] = {0x65, 0x66}, s2[1] = {0x66};
    assert_int_equal(kvi_index_store_seq_only(ix, (uint32_t)pool, 0, KVI_TIER_CPU, false, 0, 0, s1, s1, 2), 0);
    assert_int_equal(kvi_index_store_seq_only(ix, (uint32_t)w, 0, KVI_TIER_EXTERNAL, false, 0, 0, s2, s2, 1), 0);
    expect_tables_ok(ix);
    struct kvi_tier_match m[4];
    kvi_rcu_read_lock();
    size_t n = kvi_index_find_tiered(ix, NULL, s2, 1, m, 4); /* 0x66 at depth 0: instance 2 */
    kvi_rcu_read_unlock();
    assert_int_equal(n, 1);
    assert_int_equal(m[0].instance, (uint32_t)w);
    assert_int_equal(m[0].disk, 1);
    uint32_t cpu = 0, disk = 0;
    kvi_rcu_read_lock();
    kvi_index_pool_depths(ix, NULL, s1, 2, &cpu, &disk); /* 0x65, 0x66: the pool's two blocks */
    kvi_rcu_read_unlock();
    assert_int_equal(cpu, 2);
    kvi_index_destroy(ix);
}

/* An index of block size 4 with the Mooncake pool "store-0" (*pool), which
 * holds seq hashes 101, 102 at positions 0, 1 on cpu for rank 3. */
static struct kvi_index *seq_pool_index(uint32_t *pool)
{
    struct kvi_index_config cfg = {.block_size = 4, .n_parts = 1};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    int64_t in = kvi_index_intern_instance(ix, 0, "store-0", true);
    assert_true(in >= 0);
    *pool = (uint32_t)in;
    uint64_t s0[2] = {101, 102};
    assert_int_equal(kvi_index_store_seq_only(ix, *pool, 3, KVI_TIER_CPU, false, 0, 0, s0, s0, 2), 0);
    return ix;
}

/*
 * Two stores of one content chain under two seq hashes that are not the
 * standard ones of its tokens (fuzz_ingest, finding 9): the second named no
 * prefix by its seq hash and got a second entry under the same prefix key at
 * the same depth, so the key table held two entries under one key and
 * content queries reached only one of them. It joins the prefix its content
 * names (which keeps its first seq hash), counted in seq_conflicts.
 */
static void test_seq_hashes_disagree_with_content(void **state)
{
    (void)state;
    uint32_t pool;
    struct kvi_index *ix = seq_pool_index(&pool);
    uint64_t s1 = 103, s2 = 71, content = 0xc0ffee;
    struct kvi_block b1 = {103, content}, b2 = {71, content};
    assert_int_equal(kvi_index_store_seq(ix, pool, 3, KVI_TIER_DISK, true, 102, 2, &b1, &s1, 1), 0);
    assert_int_equal(kvi_index_store_seq(ix, pool, 3, KVI_TIER_DISK, true, 102, 2, &b2, &s2, 1), 0);
    expect_tables_ok(ix);
    struct kvi_index_stats st;
    kvi_index_stats(ix, &st);
    assert_int_equal(st.seq_conflicts, 1);
    assert_int_equal(st.entries, 3);
    /* the prefix keeps its first seq hash: 101, 102, 103 reach depth 3 on disk */
    uint64_t q[3] = {101, 102, 103};
    expect_pool_depths(ix, q, 3, 2, 3);
    kvi_index_destroy(ix);
}

/*
 * A block that joined a prefix by its content (seq hash 71 where the prefix
 * has 103, as above) is re-stored: the same event twice is idempotent. The
 * slot holds the prefix under engine hash 71, whose seq hash is not 71, and
 * the re-store took that for a renamed block: it dropped the holding with
 * the child stored under it (104) and placed the block again, as a new
 * prefix named by 71 (disk depth of 101, 102, 103, 104: 4 -> 2).
 */
static void test_seq_conflict_restore_idempotent(void **state)
{
    (void)state;
    uint32_t in;
    struct kvi_index *ix = seq_pool_index(&in);
    uint64_t s1 = 103, s2 = 71, s3 = 104, content = 0xc0ffee;
    struct kvi_block b1 = {103, content}, b2 = {71, content}, b3 = {104, 0xbeef};
    assert_int_equal(kvi_index_store_seq(ix, in, 3, KVI_TIER_DISK, true, 102, 2, &b1, &s1, 1), 0);
    assert_int_equal(kvi_index_store_seq(ix, in, 3, KVI_TIER_DISK, true, 103, 3, &b3, &s3, 1), 0);
    assert_int_equal(kvi_index_store_seq(ix, in, 3, KVI_TIER_DISK, true, 102, 2, &b2, &s2, 1), 0);
    struct kvi_index_stats st;
    kvi_index_stats(ix, &st);
    assert_int_equal(st.seq_conflicts, 1);
    assert_int_equal(st.entries, 4);
    assert_int_equal(st.holdings, 4);
    uint64_t q[4] = {101, 102, 103, 104};
    for (int round = 0; round < 2; round++) {
        /* the joined block again, then with its child (parent 71, the name
         * the disk slot now holds it under) */
        if (round == 0)
            assert_int_equal(kvi_index_store_seq(ix, in, 3, KVI_TIER_DISK, true, 102, 2, &b2, &s2, 1), 0);
        else
            assert_int_equal(kvi_index_store_seq(ix, in, 3, KVI_TIER_DISK, true, 71, 3, &b3, &s3, 1), 0);
        expect_tables_ok(ix);
        kvi_index_stats(ix, &st);
        assert_int_equal(st.seq_conflicts, 1); /* a re-store joins nothing */
        assert_int_equal(st.entries, 4);
        assert_int_equal(st.holdings, 4);
        assert_int_equal(st.invalid_events, 0);
        expect_pool_depths(ix, q, 4, 2, 4);
    }
    kvi_index_destroy(ix);
}

/* Resident bytes of [p, p + len) (mincore over the pages it spans). */
static uint64_t resident_bytes(const void *p, size_t len)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), e = ((uintptr_t)p + len + pg - 1) & ~(uintptr_t)(pg - 1);
    size_t n = (e - a) / pg;
    unsigned char *v = malloc(n);
    assert_non_null(v);
    assert_int_equal(mincore((void *)a, e - a, v), 0);
    uint64_t r = 0;
    for (size_t i = 0; i < n; i++)
        r += v[i] & 1;
    free(v);
    return r * pg;
}

/* A new index costs what it uses, not its partitions' full pointer arrays
 * (1 MiB each, for the largest partition): with 4 partitions a new model
 * name cost kvidxd 4.1 MB of resident memory. */
static void test_new_index_memory(void **state)
{
    (void)state;
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 4};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    /* one instance and one block: partition 0 uses its first entry chunk */
    assert_int_equal(kvi_index_intern_instance(ix, 4, NULL, false), 0);
    struct kvi_block b = {7, 8};
    assert_int_equal(kvi_index_store(ix, 0, 0, KVI_TIER_GPU, false, 0, &b, 1), 0);
    size_t len = sizeof(struct kvi_part) * cfg.n_parts;
    uint64_t res = resident_bytes(ix->parts, len);
    print_message("partitions: %zu KiB, %" PRIu64 " KiB resident\n", len / 1024, res / 1024);
    assert_true(res <= 64 * 1024);
    kvi_index_destroy(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_destroy_after_shared_entry_released),
        cmocka_unit_test(test_dump_and_clear_emptied_slot),
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_prefix_keys_match_definition),
        cmocka_unit_test(test_prefix_keys_structured_contents),
        cmocka_unit_test(test_tables_shrink_and_regrow),
        cmocka_unit_test(test_aside_contents),
        cmocka_unit_test(test_reclaim_trims_scratch),
        cmocka_unit_test(test_s01_store_then_find),
        cmocka_unit_test(test_s02_partial_match),
        cmocka_unit_test(test_s03_remove_all),
        cmocka_unit_test(test_s04_shared_prefix),
        cmocka_unit_test(test_s05_remove_worker),
        cmocka_unit_test(test_s06_large_stores),
        cmocka_unit_test(test_s07_dump_restore),
        cmocka_unit_test(test_s08_positional_dump),
        cmocka_unit_test(test_s09_clear),
        cmocka_unit_test(test_s10_clear_dp_ranks),
        cmocka_unit_test(test_s11_empty_and_miss),
        cmocka_unit_test(test_s12_shutdown),
        cmocka_unit_test(test_s13_parent_chains),
        cmocka_unit_test(test_s14_dp_ranks),
        cmocka_unit_test(test_s15_tail_removal),
        cmocka_unit_test(test_s16_mid_chain_removal),
        cmocka_unit_test(test_s17_unknown_removes),
        cmocka_unit_test(test_s18_two_sequences),
        cmocka_unit_test(test_s19_lora_isolation),
        cmocka_unit_test(test_s20_long_sequence),
        cmocka_unit_test(test_s21_continuations),
        cmocka_unit_test(test_s22_branching),
        cmocka_unit_test(test_s23_tail_range_removal),
        cmocka_unit_test(test_s24_staggered_workers),
        cmocka_unit_test(test_s25_jump_boundaries),
        cmocka_unit_test(test_s26_many_continuations),
        cmocka_unit_test(test_s27_clear_and_rebuild),
        cmocka_unit_test(test_s28_shared_prefix_divergence),
        cmocka_unit_test(test_s29_staggered_lengths),
        cmocka_unit_test(test_s30_thousand_blocks),
        cmocka_unit_test(test_s31_idempotence),
        cmocka_unit_test(test_s32_tree_sizes),
        cmocka_unit_test(test_s33_middle_restore),
        cmocka_unit_test(test_s34_snapshot_after_middle_removal),
        cmocka_unit_test(test_s35_cleanup),
        cmocka_unit_test(test_s38_tiers_dynamo),
        cmocka_unit_test(test_s39_tiers_conductor),
        cmocka_unit_test(test_tiers_conductor_root_pools),
        cmocka_unit_test(test_tiers_empty_slot_round_trip),
        cmocka_unit_test(test_tiers_cumulative_rules),
        cmocka_unit_test(test_tiers_shared_pool_overlap),
        cmocka_unit_test(test_chunk_hash_collisions),
        cmocka_unit_test(test_opaque_engine_hashes),
        cmocka_unit_test(test_store_seq_matches_store),
        cmocka_unit_test(test_err_unknown_parent),
        cmocka_unit_test(test_err_invalid_runs),
        cmocka_unit_test(test_err_invalid_args),
        cmocka_unit_test(test_stats_counts),
        cmocka_unit_test(test_remove_dp_rank),
        cmocka_unit_test(test_remove_instance),
        cmocka_unit_test(test_dump_round_trip_mixed),
        cmocka_unit_test(test_dump_cross_tier_parent),
        cmocka_unit_test(test_known_offload),
        cmocka_unit_test(test_known_gpu_rules),
        cmocka_unit_test(test_known_renames),
        cmocka_unit_test(test_known_positional_root),
        cmocka_unit_test(test_known_root_decided_at_store),
        cmocka_unit_test(test_seq_only_pool),
        cmocka_unit_test(test_seq_only_gpu),
        cmocka_unit_test(test_released_entry_names_no_member),
        cmocka_unit_test(test_seq_table_on_demand),
        cmocka_unit_test(test_child_list_unlink),
        cmocka_unit_test(test_store_rename_then_reuse_name),
        cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_reserve_floor),
        cmocka_unit_test(test_rebuild_counters),
        cmocka_unit_test(test_new_index_memory),
        cmocka_unit_test(test_seq_hash_at_two_depths),
        cmocka_unit_test(test_seq_hashes_disagree_with_content),
        cmocka_unit_test(test_seq_conflict_restore_idempotent),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
