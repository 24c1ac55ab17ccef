/* ctest-labels: unit tsan -- engine/index_write.c: the store's fresh-tail path against the model (index_model.h) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/hash.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "index_model.h"
#include "rcu_group.h"

/*
 * DESIGN: do_store stores the rest of a run in one loop (store_fresh_tail)
 * once it has created an entry below another one it created, when the
 * partition keeps no seq table and the slot holds none of the run's
 * remaining engine hashes. These tests drive runs that switch between that
 * loop and the general one at every place the switch depends on, and compare
 * everything with the brute-force model (index_model.h): return codes, stats
 * (entries too: the closure of the held prefixes under their parents), the
 * canonical dump and content queries; then seq queries once seq tables are
 * built from the entries the loop wrote.
 *   - scenarios: a tail holding a block the slot already holds (same name:
 *     idempotent; another prefix: a rename cascade), a prefix renamed within
 *     the run, runs crossing the growth of the key table and of the slot map,
 *     runs below a named parent, lower tiers, entries recycled after removal;
 *   - a randomized run over branching documents (long runs, shared prefixes,
 *     fresh names, reused names, removals, clears, reclaims), seq tables
 *     turned on halfway for some seeds;
 *   - readers querying by content while a writer stores long fresh runs and
 *     removes them (TSan: every entry is whole when a reader reaches it); the
 *     writer waits until every reader has queried each state it leaves, so
 *     the readers' part does not depend on the scheduler.
 */

#define MAX_RUN 1500u
#define MAX_MATCH 256u

/* ---- fixture ---------------------------------------------------------------- */

struct st_run {
    struct kvi_index *ix;
    struct km_model m;
    uint32_t n_inst;
    bool seq_on;
};

static struct st_run *cur_run; /* freed by teardown after a failed assertion */

static struct kvi_index *st_index(uint32_t n_parts, uint64_t seed)
{
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = n_parts, .key_seed = seed};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    return ix;
}

static void run_init(struct st_run *r, uint32_t n_parts, uint32_t n_inst, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->ix = st_index(n_parts, seed);
    r->n_inst = n_inst;
    km_init(&r->m, n_inst);
    for (uint32_t i = 0; i < n_inst; i++)
        assert_int_equal(kvi_index_intern_instance(r->ix, 500 + i, NULL, false), (int64_t)i);
    cur_run = r;
}

static void run_free(struct st_run *r)
{
    kvi_index_destroy(r->ix);
    km_free(&r->m);
    memset(r, 0, sizeof *r);
    cur_run = NULL;
}

static int st_teardown(void **state)
{
    (void)state;
    if (cur_run != NULL)
        run_free(cur_run);
    return 0;
}

/* Content hash of token t under document family f. */
static uint64_t ch(uint32_t f, uint32_t t)
{
    uint32_t tok[2] = {f, t};
    return kvi_hash_block(tok, 2, KVI_HASH_SEED);
}

static int store(struct st_run *r, uint32_t inst, enum kvi_tier tier, bool has_parent, uint64_t peh,
                 const struct kvi_block *b, size_t n)
{
    int want = km_store(&r->m, inst, 0, tier, has_parent, peh, b, n);
    int got = kvi_index_store(r->ix, inst, 0, tier, has_parent, peh, b, n);
    assert_int_equal(got, want);
    return got;
}

static void remove_ehs(struct st_run *r, uint32_t inst, enum kvi_tier tier, const uint64_t *eh, size_t n)
{
    size_t want = km_remove(&r->m, inst, 0, tier, eh, n);
    assert_int_equal(kvi_index_remove(r->ix, inst, 0, tier, eh, n), want);
}

/* ---- comparisons ------------------------------------------------------------ */

static void dump_collect(void *arg, const struct kvi_dump_block *b)
{
    kd_push(arg, b);
}

/* Live entries the model implies: in each partition, the prefixes its
 * instances hold and their ancestors. */
static uint64_t model_entries(const struct km_model *m, uint32_t n_parts)
{
    uint8_t *live = km_alloc(m->n_pf);
    uint64_t n = 0;
    for (uint32_t part = 0; part < n_parts; part++) {
        memset(live, 0, m->n_pf);
        for (uint32_t i = 0; i < m->n_slots; i++) {
            const struct km_slot *s = &m->slots[i];
            if (s->instance % n_parts != part)
                continue;
            for (uint32_t j = 0; j < s->by_pid.cap; j++) {
                if (!s->by_pid.used[j])
                    continue;
                for (uint32_t pid = (uint32_t)s->by_pid.k[j]; pid != KM_ROOT && !live[pid];
                     pid = m->pf[pid].parent) {
                    live[pid] = 1;
                    n++;
                }
            }
        }
    }
    free(live);
    return n;
}

static void check_stats(struct st_run *r)
{
    struct kvi_index_stats s;
    kvi_index_stats(r->ix, &s);
    const struct kvi_index_stats *e = &r->m.st;
    assert_int_equal(s.holdings, e->holdings);
    assert_int_equal(s.slots, e->slots);
    assert_int_equal(s.stored_blocks, e->stored_blocks);
    assert_int_equal(s.removed_blocks, e->removed_blocks);
    assert_int_equal(s.parent_not_found, e->parent_not_found);
    assert_int_equal(s.parent_elsewhere, e->parent_elsewhere);
    assert_int_equal(s.unknown_removes, e->unknown_removes);
    assert_int_equal(s.invalid_events, e->invalid_events);
    assert_int_equal(s.entries, model_entries(&r->m, kvi_index_n_parts(r->ix)));
    for (uint32_t i = 0; i < r->n_inst; i++)
        assert_int_equal(kvi_index_tree_size(r->ix, i, 0), km_tree_size(&r->m, i, 0));
}

static void check_dump(struct st_run *r)
{
    struct kd_set got = {0}, want = {0};
    for (uint32_t p = 0; p < kvi_index_n_parts(r->ix); p++)
        kvi_index_dump_partition(r->ix, p, dump_collect, &got);
    km_dump(&r->m, &want);
    kd_sort(&got);
    kd_sort(&want);
    bool same = got.n == want.n;
    for (uint32_t i = 0; same && i < got.n; i++)
        same = kd_cmp(&got.r[i], &want.r[i]) == 0;
    if (!same) {
        fprintf(stderr, "dump: index %u records, model %u\n", got.n, want.n);
        for (uint32_t i = 0, shown = 0; i < got.n && i < want.n && shown < 8; i++)
            if (kd_cmp(&got.r[i], &want.r[i]) != 0) {
                kd_print_rec(stderr, "index", &got.r[i]);
                kd_print_rec(stderr, "model", &want.r[i]);
                shown++;
            }
    }
    kd_free(&got);
    kd_free(&want);
    assert_true(same);
}

/* Query q[0..n) by content (and by seq hashes once seq tables are on). */
static void check_query(struct st_run *r, const uint64_t *q, size_t n)
{
    static struct kvi_match want[MAX_MATCH], got[MAX_MATCH];
    uint64_t *seq = km_alloc(n * sizeof *seq);
    kvi_seq_hashes(q, n, seq);
    size_t ne = km_match(&r->m, q, n, want);
    for (int by_seq = 0; by_seq < (r->seq_on ? 2 : 1); by_seq++) {
        kvi_rcu_read_lock();
        size_t ng = by_seq ? kvi_index_find_matches_by_seq(r->ix, seq, n, got, MAX_MATCH)
                           : kvi_index_find_matches(r->ix, q, n, got, MAX_MATCH);
        kvi_rcu_read_unlock();
        if (ng > 1)
            qsort(got, ng, sizeof *got, km_cmp_match);
        bool same = ng == ne;
        for (size_t i = 0; same && i < ng; i++)
            same = got[i].instance == want[i].instance && got[i].dp_rank == want[i].dp_rank &&
                   got[i].depth == want[i].depth && got[i].tree_size == want[i].tree_size;
        if (!same) {
            fprintf(stderr, "query (%zu blocks, %s): index", n, by_seq ? "by seq" : "by content");
            for (size_t i = 0; i < ng; i++)
                fprintf(stderr, " [i%u d%u t%u]", got[i].instance, got[i].depth, got[i].tree_size);
            fprintf(stderr, "; model");
            for (size_t i = 0; i < ne; i++)
                fprintf(stderr, " [i%u d%u t%u]", want[i].instance, want[i].depth, want[i].tree_size);
            fprintf(stderr, "\n");
        }
        assert_true(same);
    }
    free(seq);
}

/* Seq tables on from now on (a seq query asks for them). */
static void seq_on(struct st_run *r)
{
    uint64_t s = 1;
    struct kvi_match m[4];
    kvi_rcu_read_lock();
    (void)kvi_index_find_matches_by_seq(r->ix, &s, 1, m, 4);
    kvi_rcu_read_unlock();
    r->seq_on = true;
}

/* ---- scenarios -------------------------------------------------------------- */

/* Blocks [from, to) of document f: engine hash base + position. */
static void blocks(struct kvi_block *b, uint32_t f, uint32_t from, uint32_t to, uint64_t base)
{
    for (uint32_t i = from; i < to; i++)
        b[i - from] = (struct kvi_block){base + i, ch(f, i)};
}

static void doc(uint64_t *q, uint32_t f, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        q[i] = ch(f, i);
}

static void check_all(struct st_run *r, const uint32_t *fams, uint32_t n_fams, uint32_t len)
{
    static uint64_t q[MAX_RUN];
    check_stats(r);
    check_dump(r);
    for (uint32_t k = 0; k < n_fams; k++) {
        doc(q, fams[k], len);
        check_query(r, q, len);
        check_query(r, q, len / 3 + 1);
    }
}

static void scenarios(bool with_seq_after)
{
    static struct st_run run;
    struct st_run *r = &run;
    static struct kvi_block b[MAX_RUN];
    static uint64_t e[MAX_RUN];
    run_init(r, 1, 4, 0x5eed);
    const uint32_t fams[] = {1, 2, 3};

    /* a long first run from empty tables: the key table and the slot map grow
     * from 16 slots across the tail (room made once) */
    blocks(b, 1, 0, 1000, 0x10000);
    assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, 1000), 0);
    check_all(r, fams, 3, 1000);

    /* re-store with the same names: idempotent, no new entry */
    assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, 1000), 0);
    /* a second slot shares the prefix, then diverges: tail new to the slot
     * from the start, new to the partition from position 600 */
    for (uint32_t i = 0; i < 1000; i++)
        b[i] = (struct kvi_block){0x20000 + i, i < 600 ? ch(1, i) : ch(2, i)};
    assert_int_equal(store(r, 1, KVI_TIER_GPU, false, 0, b, 1000), 0);
    check_all(r, fams, 3, 1000);

    /* below a named parent: slot 0 continues document 1 at 1000 (a new tail
     * right after the parent, slot map crossing its growth again) */
    blocks(b, 1, 1000, 1400, 0x10000);
    assert_int_equal(store(r, 0, KVI_TIER_GPU, true, 0x10000 + 999, b, 400), 0);
    check_all(r, fams, 3, 1400);

    /* a run whose head the slot already holds under the same names: slot 2
     * holds document 3's blocks 0..99, then stores 0..399 (idempotent up to
     * 99, a new entry at 100, the fresh tail from 101) */
    blocks(b, 3, 0, 100, 0x30000);
    assert_int_equal(store(r, 2, KVI_TIER_GPU, false, 0, b, 100), 0);
    blocks(b, 3, 0, 400, 0x30000);
    assert_int_equal(store(r, 2, KVI_TIER_GPU, false, 0, b, 400), 0);
    check_all(r, fams, 3, 400);

    /* a new run whose tail contains an engine hash the slot holds for
     * another prefix: the general loop renames (cascade) at that block; the
     * fresh tail only starts after it */
    for (uint32_t i = 0; i < 300; i++)
        b[i] = (struct kvi_block){0x40000 + i, ch(4, i)};
    b[250].engine_hash = 0x30000 + 350; /* slot 2 holds doc 3 block 350 under this name */
    assert_int_equal(store(r, 2, KVI_TIER_GPU, false, 0, b, 300), 0);
    check_all(r, fams, 3, 400);
    doc(e, 4, 300);
    check_query(r, e, 300);

    /* a rename within the run: slot 2 re-stores doc 4 with new names from
     * block 100 on (same prefixes, other engine hashes), then new blocks */
    for (uint32_t i = 0; i < 500; i++)
        b[i] = (struct kvi_block){(i < 100 ? 0x40000 : 0x50000) + i, ch(4, i)};
    assert_int_equal(store(r, 2, KVI_TIER_GPU, false, 0, b, 500), 0);
    doc(e, 4, 500);
    check_query(r, e, 500);
    check_all(r, fams, 3, 400);

    /* a tail that would rename a block of the run's own parent chain:
     * rejected whole, before anything changes */
    blocks(b, 1, 1400, 1450, 0x60000);
    b[40].engine_hash = 0x10000 + 500; /* slot 0 names doc 1 block 500 so: its own chain */
    assert_int_equal(store(r, 0, KVI_TIER_GPU, true, 0x10000 + 1399, b, 50), -EINVAL);
    check_all(r, fams, 3, 1400);

    /* lower tier: cpu copies of document 2 below the gpu chain of slot 1 */
    for (uint32_t i = 0; i < 300; i++)
        b[i] = (struct kvi_block){0x70000 + i, ch(2, 1000 + i)};
    assert_int_equal(store(r, 1, KVI_TIER_CPU, true, 0x20000 + 999, b, 300), 0);
    check_all(r, fams, 3, 1000);

    /* removal, reclaim, and new runs into recycled entries */
    for (uint32_t i = 0; i < 400; i++)
        e[i] = 0x10000 + 1399 - i;
    remove_ehs(r, 0, KVI_TIER_GPU, e, 400);
    e[0] = 0x20000 + 700;
    remove_ehs(r, 1, KVI_TIER_GPU, e, 1);
    kvi_index_reclaim(r->ix, 0);
    for (uint32_t i = 0; i < 900; i++)
        b[i] = (struct kvi_block){0x80000 + i, ch(5, i)};
    assert_int_equal(store(r, 3, KVI_TIER_GPU, false, 0, b, 900), 0);
    const uint32_t fams2[] = {1, 2, 5};
    check_all(r, fams2, 3, 1000);

    /* single-block and two-block runs: the tail starts at the last block */
    for (uint32_t k = 0; k < 20; k++) {
        b[0] = (struct kvi_block){0x90000 + 2 * k, ch(6 + k, 0)};
        b[1] = (struct kvi_block){0x90000 + 2 * k + 1, ch(6 + k, 1)};
        assert_int_equal(store(r, 3, KVI_TIER_GPU, false, 0, b, 1 + k % 2), 0);
    }
    check_all(r, fams2, 3, 1000);

    if (with_seq_after) {
        /* seq tables built from the entries the tail loop wrote */
        seq_on(r);
        check_all(r, fams2, 3, 1000);
        for (uint32_t i = 0; i < 200; i++)
            b[i] = (struct kvi_block){0xa0000 + i, ch(5, 900 + i)};
        assert_int_equal(store(r, 3, KVI_TIER_GPU, true, 0x80000 + 899, b, 200), 0);
        check_all(r, fams2, 3, 1100);
    }
    run_free(r);
}

static void test_scenarios(void **state)
{
    (void)state;
    scenarios(false);
}

static void test_scenarios_then_seq_tables(void **state)
{
    (void)state;
    scenarios(true);
}

/* The run's duplicate check (run_has_duplicates, a scratch set for runs of
 * more than 8 blocks, holding no 0): repeated hashes anywhere, 0 once or
 * twice, the parent's hash in the run, the parent's hash 0. */
static void test_duplicates(void **state)
{
    (void)state;
    static struct st_run run;
    struct st_run *r = &run;
    static struct kvi_block b[300];
    run_init(r, 1, 2, 0xd0d0);
    for (uint32_t n = 9; n <= 300; n = n * 2 + 1) {
        uint64_t base = (uint64_t)n << 32;
        blocks(b, 7, 0, n, base);
        b[n - 1].engine_hash = b[0].engine_hash; /* ends */
        assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, n), -EINVAL);
        blocks(b, 7, 0, n, base);
        b[n / 2].engine_hash = b[n / 2 - 1].engine_hash; /* neighbours */
        assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, n), -EINVAL);
        blocks(b, 7, 0, n, base);
        b[3].engine_hash = 0;
        b[n - 2].engine_hash = 0; /* 0 twice */
        assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, n), -EINVAL);
        blocks(b, 8 + n, 0, n, base);
        b[n / 3].engine_hash = 0; /* 0 once: valid */
        assert_int_equal(store(r, 1, KVI_TIER_GPU, false, 0, b, n), 0);
        uint64_t parent = b[n - 1].engine_hash;
        blocks(b, 8 + n, n, 2 * n, base + n);
        b[n - 1].engine_hash = parent; /* the parent's hash in the run */
        assert_int_equal(store(r, 1, KVI_TIER_GPU, true, parent, b, n), -EINVAL);
        blocks(b, 8 + n, n, 2 * n, base + n);
        b[1].engine_hash = 0; /* 0 under a parent named 0 */
        assert_int_equal(store(r, 1, KVI_TIER_GPU, true, 0, b, n), -EINVAL);
        blocks(b, 8 + n, n, 2 * n, base + n);
        assert_int_equal(store(r, 1, KVI_TIER_GPU, true, parent, b, n), 0);
        check_stats(r);
        check_dump(r);
    }
    run_free(r);
}

/* Re-stores of runs the slot already holds (do_store's read-only walk,
 * run_held, before the general loops), each against the model: whole runs,
 * below a named parent, across a branch point (the run's next block is not
 * its parent's first child), on entries with several members, on a lower
 * tier, and runs the walk must give up on: a new last block, a block held
 * under another name, a name the slot holds for another prefix, a
 * duplicate name, a parent the slot does not hold. */
static int store_seq(struct st_run *r, uint32_t inst, enum kvi_tier tier, bool has_parent, uint64_t peh,
                     uint32_t position, const struct kvi_block *b, const uint64_t *seq, size_t n)
{
    int want = km_store_any(&r->m, inst, 0, tier, has_parent, peh, position, b, seq, n);
    int got = kvi_index_store_seq(r->ix, inst, 0, tier, has_parent, peh, position, b, seq, n);
    assert_int_equal(got, want);
    return got;
}

static void restores(bool with_seq)
{
    static struct st_run run;
    struct st_run *r = &run;
    static struct kvi_block b[600];
    run_init(r, 1, 3, 0xa9a1);
    const uint32_t fams[] = {1, 2, 3};
    if (with_seq)
        seq_on(r);

    /* slot 0: doc 1 [0, 500); slot 1 shares [0, 300) (two members), then
     * doc 2's blocks: entry 299 gets a second child, linked first */
    blocks(b, 1, 0, 500, 0x10000);
    assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, 500), 0);
    for (uint32_t i = 0; i < 500; i++)
        b[i] = (struct kvi_block){0x20000 + i, i < 300 ? ch(1, i) : ch(2, i)};
    assert_int_equal(store(r, 1, KVI_TIER_GPU, false, 0, b, 500), 0);
    check_all(r, fams, 3, 500);

    /* whole runs again, from position 0 and below a named parent, across the
     * branch point at 299 (slot 0's block 300 is no longer 299's first child) */
    blocks(b, 1, 0, 500, 0x10000);
    assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, 500), 0);
    blocks(b, 1, 250, 500, 0x10000);
    assert_int_equal(store(r, 0, KVI_TIER_GPU, true, 0x10000 + 249, b, 250), 0);
    blocks(b, 1, 299, 301, 0x10000);
    assert_int_equal(store(r, 0, KVI_TIER_GPU, true, 0x10000 + 298, b, 2), 0);
    for (uint32_t i = 0; i < 500; i++)
        b[i] = (struct kvi_block){0x20000 + i, i < 300 ? ch(1, i) : ch(2, i)};
    assert_int_equal(store(r, 1, KVI_TIER_GPU, false, 0, b, 500), 0);
    assert_int_equal(store(r, 1, KVI_TIER_GPU, true, 0x20000 + 99, b + 100, 400), 0);
    check_all(r, fams, 3, 500);

    /* held except a new last block: stored */
    blocks(b, 1, 400, 501, 0x10000);
    assert_int_equal(store(r, 0, KVI_TIER_GPU, true, 0x10000 + 399, b, 101), 0);
    check_all(r, fams, 3, 501);

    /* held except one block, held under another name: a rename */
    blocks(b, 1, 0, 501, 0x10000);
    b[450].engine_hash = 0x30000;
    assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, 501), 0);
    check_all(r, fams, 3, 501);

    /* a name the slot holds for another prefix (slot 1's block 350 of doc 2,
     * named where doc 1's block 350 is): the old holding and its
     * descendants go */
    blocks(b, 1, 300, 400, 0x40000);
    assert_int_equal(store(r, 1, KVI_TIER_GPU, true, 0x20000 + 299, b, 100), 0);
    b[50].engine_hash = 0x20000 + 350;
    assert_int_equal(store(r, 1, KVI_TIER_GPU, true, 0x20000 + 299, b, 100), 0);
    check_all(r, fams, 3, 501);

    /* a held run with a name repeated, or its parent's name in it: rejected
     * as before */
    blocks(b, 1, 0, 100, 0x10000);
    b[60].engine_hash = b[20].engine_hash;
    assert_int_equal(store(r, 0, KVI_TIER_GPU, false, 0, b, 100), -EINVAL);
    blocks(b, 1, 100, 200, 0x10000);
    b[7].engine_hash = 0x10000 + 99;
    assert_int_equal(store(r, 0, KVI_TIER_GPU, true, 0x10000 + 99, b, 100), -EINVAL);
    /* a parent the slot does not hold */
    blocks(b, 1, 100, 200, 0x10000);
    assert_int_equal(store(r, 2, KVI_TIER_GPU, true, 0x10000 + 99, b, 100), -ENOENT);
    check_all(r, fams, 3, 501);

    /* lower tier: cpu copies below slot 0's gpu blocks, then again below
     * the gpu parent and below their own cpu parent */
    for (uint32_t i = 0; i < 100; i++)
        b[i] = (struct kvi_block){0x50000 + i, ch(1, 100 + i)};
    assert_int_equal(store(r, 0, KVI_TIER_CPU, true, 0x10000 + 99, b, 100), 0);
    assert_int_equal(store(r, 0, KVI_TIER_CPU, true, 0x10000 + 99, b, 100), 0);
    assert_int_equal(store(r, 0, KVI_TIER_CPU, true, 0x50000 + 49, b + 50, 50), 0);
    check_all(r, fams, 3, 501);

    /* single blocks, at a root and below a parent */
    blocks(b, 3, 0, 2, 0x60000);
    assert_int_equal(store(r, 2, KVI_TIER_GPU, false, 0, b, 2), 0);
    assert_int_equal(store(r, 2, KVI_TIER_GPU, false, 0, b, 1), 0);
    assert_int_equal(store(r, 2, KVI_TIER_GPU, true, 0x60000, b + 1, 1), 0);
    check_all(r, fams, 3, 501);

    if (with_seq) {
        /* runs with their standard seq hashes: again, below a parent, and a
         * lower-tier run placed by position (a root of its slot, below no
         * held parent: the general loops) stored twice */
        static uint64_t q[600], sq[600];
        doc(q, 1, 501);
        kvi_seq_hashes(q, 501, sq);
        blocks(b, 1, 0, 501, 0x10000);
        b[450].engine_hash = 0x30000;
        assert_int_equal(store_seq(r, 0, KVI_TIER_GPU, false, 0, 0, b, sq, 501), 0);
        assert_int_equal(store_seq(r, 0, KVI_TIER_GPU, true, 0x10000 + 99, 100, b + 100, sq + 100, 401), 0);
        for (uint32_t i = 0; i < 50; i++)
            b[i] = (struct kvi_block){0x70000 + i, ch(1, 200 + i)};
        assert_int_equal(store_seq(r, 2, KVI_TIER_CPU, false, 0, 200, b, sq + 200, 50), 0);
        assert_int_equal(store_seq(r, 2, KVI_TIER_CPU, false, 0, 200, b, sq + 200, 50), 0);
        assert_int_equal(store_seq(r, 2, KVI_TIER_CPU, true, 0x70000 + 9, 210, b + 10, sq + 210, 40), 0);
        check_all(r, fams, 3, 501);
    }
    run_free(r);
}

static void test_restores(void **state)
{
    (void)state;
    restores(false);
}

static void test_restores_seq_tables(void **state)
{
    (void)state;
    restores(true);
}

/* ---- randomized ------------------------------------------------------------- */

#define R_DOCS 24u
#define R_LEN 1200u

struct r_doc {
    uint32_t len;
    uint64_t c[R_LEN];
};

/* Engine hash of slot (inst, tier)'s block at prefix seq hash `sq`: stable
 * names, so that re-stores are idempotent unless the op renames. */
static uint64_t name_of(uint32_t inst, enum kvi_tier tier, uint64_t sq)
{
    return kvi_fmix64(sq ^ kvi_fmix64(((uint64_t)inst << 8 | tier) + 0x51ed));
}

static void random_seed(uint64_t seed, uint32_t n_ops)
{
    static struct st_run run;
    static struct r_doc docs[R_DOCS];
    static uint64_t seqs[R_DOCS][R_LEN];
    static struct kvi_block b[R_LEN];
    static uint64_t e[R_LEN];
    struct st_run *r = &run;
    struct kr_rng rng = {seed};
    run_init(r, 1 + kr_below(&rng, 2), 6, seed * 7 + 1);
    /* documents branch from earlier ones at random points */
    for (uint32_t d = 0; d < R_DOCS; d++) {
        docs[d].len = 50 + kr_below(&rng, R_LEN - 50);
        uint32_t share = 0;
        if (d > 0 && kr_chance(&rng, 700)) {
            const struct r_doc *o = &docs[kr_below(&rng, d)];
            share = kr_below(&rng, KVI_MIN(o->len, docs[d].len));
            memcpy(docs[d].c, o->c, share * sizeof(uint64_t));
        }
        for (uint32_t i = share; i < docs[d].len; i++)
            docs[d].c[i] = ch(100 + d, i);
        kvi_seq_hashes(docs[d].c, docs[d].len, seqs[d]);
    }
    uint32_t seq_at = kr_chance(&rng, 500) ? n_ops / 2 : UINT32_MAX;
    for (uint32_t op = 0; op < n_ops; op++) {
        if (op == seq_at)
            seq_on(r);
        uint32_t inst = kr_below(&rng, r->n_inst);
        enum kvi_tier tier = kr_chance(&rng, 150) ? KVI_TIER_CPU : KVI_TIER_GPU;
        uint32_t x = kr_below(&rng, 1000);
        uint32_t d = kr_below(&rng, R_DOCS);
        const struct r_doc *dc = &docs[d];
        if (x < 650) {
            /* a store of document d from `from` (below the slot's block at
             * from - 1 when it has one), `n` blocks */
            uint32_t from = kr_chance(&rng, 400) ? 0 : kr_below(&rng, dc->len);
            uint32_t n = 1 + kr_below(&rng, dc->len - from);
            bool has_parent = from > 0;
            uint64_t peh = has_parent ? name_of(inst, tier, seqs[d][from - 1]) : 0;
            if (has_parent && kr_chance(&rng, 300) && tier != KVI_TIER_GPU)
                peh = name_of(inst, KVI_TIER_GPU, seqs[d][from - 1]); /* parent on the gpu tier */
            if (has_parent && kr_chance(&rng, 100)) {
                has_parent = false; /* store the middle of a document as if at position 0 */
                peh = 0;
            }
            for (uint32_t i = 0; i < n; i++)
                b[i] = (struct kvi_block){name_of(inst, tier, seqs[d][from + i]), dc->c[from + i]};
            uint32_t y = kr_below(&rng, 1000);
            if (y < 150) {
                /* fresh names from a random block on: renames of held prefixes */
                for (uint32_t i = kr_below(&rng, n); i < n; i++)
                    b[i].engine_hash = kr_next(&rng);
            } else if (y < 250) {
                /* one block named as another prefix the slot may hold */
                const struct r_doc *o = &docs[kr_below(&rng, R_DOCS)];
                uint32_t at = kr_below(&rng, o->len);
                uint64_t other = name_of(inst, tier, seqs[o - docs][at]);
                bool dup = false;
                for (uint32_t i = 0; i < n; i++)
                    dup |= b[i].engine_hash == other;
                if (!dup && (!has_parent || other != peh))
                    b[kr_below(&rng, n)].engine_hash = other;
            }
            store(r, inst, tier, has_parent, peh, b, n);
        } else if (x < 850) {
            /* remove a tail, a middle block, or a few random blocks */
            uint32_t n = 1 + kr_below(&rng, 8);
            for (uint32_t i = 0; i < n; i++)
                e[i] = name_of(inst, tier, seqs[d][kr_below(&rng, dc->len)]);
            if (kr_chance(&rng, 300)) {
                uint32_t from = kr_below(&rng, dc->len);
                n = dc->len - from;
                for (uint32_t i = 0; i < n; i++)
                    e[i] = name_of(inst, tier, seqs[d][dc->len - 1 - i]);
            }
            remove_ehs(r, inst, tier, e, n);
        } else if (x < 880) {
            km_clear(&r->m, inst);
            kvi_index_clear(r->ix, inst);
        } else if (x < 890) {
            km_remove_instance(&r->m, inst);
            kvi_index_remove_instance(r->ix, inst);
        } else if (x < 950) {
            for (uint32_t p = 0; p < kvi_index_n_parts(r->ix); p++)
                kvi_index_reclaim(r->ix, p);
        } else {
            check_query(r, dc->c, dc->len);
            check_query(r, dc->c, 1 + kr_below(&rng, dc->len));
        }
        check_stats(r);
        if (op % 16 == 15)
            check_dump(r);
    }
    check_dump(r);
    for (uint32_t d = 0; d < R_DOCS; d++)
        check_query(r, docs[d].c, docs[d].len);
    if (!r->seq_on) {
        seq_on(r);
        check_dump(r);
        for (uint32_t d = 0; d < R_DOCS; d++)
            check_query(r, docs[d].c, docs[d].len);
    }
    run_free(r);
}

static void test_randomized(void **state)
{
    (void)state;
    const char *env = getenv("KVI_STORE_SEEDS");
    uint32_t seeds = env && *env ? (uint32_t)strtoul(env, NULL, 0) : 8;
    for (uint32_t s = 1; s <= seeds; s++)
        random_seed(s, 300);
}

/* ---- concurrent readers ----------------------------------------------------- */

#define C_LEN 600u
#define C_DOCS 6u
#define C_READERS 2u

struct c_reader {
    pthread_t t;
    struct c_shared *c;
    _Atomic uint64_t queries; /* completed; the writer waits on it */
    _Atomic uint64_t overlapped; /* of them, ran while a write was in flight */
};

struct c_shared {
    struct kvi_index *ix;
    uint64_t docs[C_DOCS][C_LEN];
    _Atomic bool stop;
    _Atomic uint64_t bad;
    _Atomic uint64_t wgen; /* odd while the writer is inside a mutation */
    _Atomic bool waiting;  /* the writer waits for the readers (c_wait_readers) */
    struct c_reader r[C_READERS];
};

/* Readers: instance 0 holds document 0 whole the whole time (exact depth and
 * tree size); every other match is a gpu slot of a known instance with
 * 1 <= depth <= the query's length. A violation is counted, never asserted
 * here (cmocka asserts belong to the main thread), and the reader goes on:
 * the writer waits for its progress. */
static void *c_reader(void *arg)
{
    struct c_reader *r = arg;
    struct c_shared *c = r->c;
    kvi_rcu_register_thread();
    struct kvi_match m[16];
    uint64_t k = 0;
    while (!atomic_load(&c->stop)) {
        uint32_t d = (uint32_t)(k % C_DOCS), n = (uint32_t)(1 + (k * 7919) % C_LEN);
        k++;
        uint64_t g0 = atomic_load(&c->wgen);
        kvi_rcu_read_lock();
        size_t got = kvi_index_find_matches(c->ix, c->docs[d], n, m, 16);
        kvi_rcu_read_unlock();
        if ((g0 & 1) || atomic_load(&c->wgen) != g0)
            atomic_fetch_add(&r->overlapped, 1);
        bool saw0 = false;
        for (size_t i = 0; i < got && i < 16; i++) {
            if (m[i].instance >= 4 || m[i].depth < 1 || m[i].depth > n)
                atomic_fetch_add(&c->bad, 1);
            if (m[i].instance == 0) {
                saw0 = true;
                if (d == 0 && (m[i].depth != n || m[i].tree_size != C_LEN))
                    atomic_fetch_add(&c->bad, 1);
            }
        }
        if (d == 0 && !saw0)
            atomic_fetch_add(&c->bad, 1);
        atomic_fetch_add(&r->queries, 1);
        /* hand the cpu back to a waiting writer: with more threads than cpus
         * it would otherwise wait a whole time slice for each state */
        if (atomic_load_explicit(&c->waiting, memory_order_relaxed))
            sched_yield();
    }
    kvi_rcu_unregister_thread();
    return NULL;
}

/* The writer's side of the protocol: return once every reader has run a whole
 * query on the index as the writer left it (two completions after the call:
 * the second one started after it). Readers never block, so this only waits
 * for the scheduler, however busy the machine. */
static void c_wait_readers(struct c_shared *c)
{
    uint64_t want[C_READERS];
    for (uint32_t t = 0; t < C_READERS; t++)
        want[t] = atomic_load(&c->r[t].queries) + 2;
    atomic_store(&c->waiting, true);
    for (uint32_t t = 0; t < C_READERS; t++)
        while (atomic_load(&c->r[t].queries) < want[t])
            sched_yield();
    atomic_store(&c->waiting, false);
}

static void c_write_begin(struct c_shared *c)
{
    atomic_fetch_add(&c->wgen, 1);
}

/* the end of a mutation, and every reader queries the state it left */
static void c_write_end(struct c_shared *c)
{
    atomic_fetch_add(&c->wgen, 1);
    c_wait_readers(c);
}

static void test_concurrent_readers(void **state)
{
    (void)state;
    static struct c_shared c;
    static struct kvi_block b[C_LEN];
    static uint64_t e[C_LEN];
    memset(&c, 0, sizeof c);
    c.ix = st_index(1, 77);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(kvi_index_intern_instance(c.ix, 900 + i, NULL, false), (int64_t)i);
    for (uint32_t d = 0; d < C_DOCS; d++)
        for (uint32_t i = 0; i < C_LEN; i++)
            c.docs[d][i] = d > 0 && i < 100 * d ? c.docs[0][i] : ch(200 + d, i); /* shared heads */
    for (uint32_t i = 0; i < C_LEN; i++)
        b[i] = (struct kvi_block){0x1000 + i, c.docs[0][i]};
    assert_int_equal(kvi_index_store(c.ix, 0, 0, KVI_TIER_GPU, false, 0, b, C_LEN), 0);
    for (uint32_t t = 0; t < C_READERS; t++) {
        c.r[t].c = &c;
        assert_int_equal(pthread_create(&c.r[t].t, NULL, c_reader, &c.r[t]), 0);
    }
    /* readers are running before the first write */
    c_wait_readers(&c);
    /* the writer: fresh runs of documents 1.. on instances 1..3 (below the
     * heads they share with document 0), each removed tail first before the
     * instance stores its next one, reclaimed (recycled entries); every
     * reader queries each state in between (c_write_end) */
    uint32_t states = 0;
    for (uint32_t round = 0; round < 60; round++) {
        uint32_t inst = 1 + round % 3, d = 1 + round % (C_DOCS - 1);
        if (round >= 3) {
            uint64_t old = ((uint64_t)(round - 3) << 20) | 0x100000;
            for (uint32_t i = 0; i < C_LEN; i++)
                e[i] = old + C_LEN - 1 - i;
            c_write_begin(&c);
            size_t rc = kvi_index_remove(c.ix, inst, 0, KVI_TIER_GPU, e, C_LEN);
            c_write_end(&c);
            states++;
            assert_int_equal(rc, C_LEN);
        }
        uint64_t base = ((uint64_t)round << 20) | 0x100000;
        for (uint32_t i = 0; i < C_LEN; i++)
            b[i] = (struct kvi_block){base + i, c.docs[d][i]};
        c_write_begin(&c);
        int rc = kvi_index_store(c.ix, inst, 0, KVI_TIER_GPU, false, 0, b, C_LEN);
        c_write_end(&c);
        states++;
        assert_int_equal(rc, 0);
        if (round % 4 == 3) {
            c_write_begin(&c);
            kvi_index_reclaim(c.ix, 0);
            c_write_end(&c);
            states++;
        }
    }
    atomic_store(&c.stop, true);
    uint64_t queries = 0, overlapped = 0;
    for (uint32_t t = 0; t < C_READERS; t++) {
        pthread_join(c.r[t].t, NULL);
        uint64_t q = atomic_load(&c.r[t].queries);
        /* the protocol: two completions per state and before the first write */
        assert_true(q >= 2 * (uint64_t)(states + 1));
        queries += q;
        overlapped += atomic_load(&c.r[t].overlapped);
    }
    print_message("%u states, %" PRIu64 " queries, %" PRIu64 " during a write\n", states, queries, overlapped);
    assert_int_equal(atomic_load(&c.bad), 0);
    kvi_index_destroy(c.ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_scenarios, st_teardown),
        cmocka_unit_test_teardown(test_scenarios_then_seq_tables, st_teardown),
        cmocka_unit_test_teardown(test_duplicates, st_teardown),
        cmocka_unit_test_teardown(test_restores, st_teardown),
        cmocka_unit_test_teardown(test_restores_seq_tables, st_teardown),
        cmocka_unit_test_teardown(test_randomized, st_teardown),
        cmocka_unit_test(test_concurrent_readers),
    };
    return cmocka_run_group_tests(tests, kvi_test_rcu_setup, kvi_test_rcu_teardown);
}
