/* ctest-labels: unit -- engine/index_query.c: a writer's change between two probes of one query, made deterministic */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "engine/common.h"
#include "engine/index.h"
#include "engine/rcu.h"

/*
 * DESIGN
 *   A query's jump search compares gpu member counts read at different
 *   moments; when a writer changes the index between two probes, counts can
 *   agree across a drain point the search then never sees, and the slow path
 *   (verify_members, after the partition's write generation moved) must
 *   still give every member of the first entry its depth.
 *
 *   This program is built with its own copy of engine/index_query.c compiled
 *   with KVI_TEST_PROBE_HOOK (tests/CMakeLists.txt): the query calls
 *   kvi_ix__test_probe_hook before every probe. The hook below fires once,
 *   at the first probe of a chosen position after position 0, and there
 *   runs the "concurrent" writer's ops itself, in the querying thread,
 *   inside its read-side section (a handful of stores: no reclaim, which
 *   would wait for that section, is due). So the interleaving is exact and
 *   no thread scheduling is involved.
 *
 *   Every case checks the whole result against what the index holds after
 *   the ops: slots that held their blocks throughout must be reported with
 *   their exact depth (the writer's ops never touched them).
 */

#define QLEN_MAX 16u

/* content hash of block i of the query document, and of the one-block
 * prefix the "stable" instances hold (the document's first block) */
static uint64_t content_at(uint32_t i) { return 0x1000u + i; }

/* ---- the hook --------------------------------------------------------------- */

struct op {
    bool remove;
    uint32_t inst; /* dense instance id */
    uint32_t len;  /* store: blocks of the query document from position 0 */
};

static struct {
    struct kvi_index *ix;
    bool armed;
    uint32_t fire_at; /* position whose first probe runs the ops */
    const struct op *ops;
    size_t n_ops;
    uint32_t fired;
} hk;

static uint64_t eh_of(uint32_t inst, uint32_t i) { return ((uint64_t)(inst + 1) << 32) | (i + 1); }

static void run_op(struct kvi_index *ix, const struct op *o)
{
    if (o->remove) {
        uint64_t h = eh_of(o->inst, 0); /* the chain's root: the whole chain goes */
        assert_int_equal(kvi_index_remove(ix, o->inst, 0, KVI_TIER_GPU, &h, 1), 1);
        return;
    }
    struct kvi_block b[QLEN_MAX];
    for (uint32_t i = 0; i < o->len; i++)
        b[i] = (struct kvi_block){eh_of(o->inst, i), content_at(i)};
    assert_int_equal(kvi_index_store(ix, o->inst, 0, KVI_TIER_GPU, false, 0, b, o->len), 0);
}

void kvi_ix__test_probe_hook(const struct kvi_index *ix, uint32_t t);
void kvi_ix__test_probe_hook(const struct kvi_index *ix, uint32_t t)
{
    if (!hk.armed || ix != hk.ix || t != hk.fire_at)
        return;
    hk.armed = false;
    hk.fired++;
    for (size_t i = 0; i < hk.n_ops; i++)
        run_op(hk.ix, &hk.ops[i]);
}

/* ---- cases ------------------------------------------------------------------ */

struct want {
    uint32_t inst;
    uint32_t depth;
};

/*
 * Index with one partition and jump `jump`: `before` applied, then a content
 * query over the document's first qlen blocks, with `during` run at the first
 * probe of position fire_at. The result must be exactly `want` (instance,
 * depth), each instance once.
 */
static void run_case(const char *name, uint32_t jump, uint32_t qlen, uint32_t fire_at, const struct op *before,
                     size_t n_before, const struct op *during, size_t n_during, const struct want *want, size_t n_want)
{
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = 1, .key_seed = 0x5eed};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    kvi_index_set_jump(ix, jump);
    for (uint32_t i = 0; i < 8; i++) {
        assert_int_equal(kvi_index_intern_instance(ix, 100 + i, NULL, false), (int64_t)i);
        /* every instance's gpu slot exists before the query (a query reports
         * only slots that existed when it began), holding an unrelated block */
        struct kvi_block other = {0xff00u + i, 0xabc0u + i};
        assert_int_equal(kvi_index_store(ix, i, 0, KVI_TIER_GPU, false, 0, &other, 1), 0);
    }
    for (size_t i = 0; i < n_before; i++)
        run_op(ix, &before[i]);

    uint64_t q[QLEN_MAX];
    for (uint32_t i = 0; i < qlen; i++)
        q[i] = content_at(i);
    hk.ix = ix;
    hk.fire_at = fire_at;
    hk.ops = during;
    hk.n_ops = n_during;
    hk.fired = 0;
    hk.armed = true;
    struct kvi_match got[16];
    kvi_rcu_read_lock();
    size_t ng = kvi_index_find_matches(ix, q, qlen, got, KVI_ARRAY_LEN(got));
    kvi_rcu_read_unlock();
    hk.armed = false;

    bool ok = hk.fired == 1 && ng == n_want;
    for (size_t i = 0; i < n_want && ok; i++) {
        bool found = false;
        for (size_t j = 0; j < ng && !found; j++)
            found = got[j].instance == want[i].inst && got[j].depth == want[i].depth;
        ok = found;
    }
    if (!ok) {
        printf("%s (jump %u, %u blocks, ops at position %u): hook fired %u times; got %zu:", name, jump, qlen,
               fire_at, hk.fired, ng);
        for (size_t j = 0; j < ng && j < KVI_ARRAY_LEN(got); j++)
            printf(" i%u@%u", got[j].instance, got[j].depth);
        printf("; want %zu:", n_want);
        for (size_t i = 0; i < n_want; i++)
            printf(" i%u@%u", want[i].inst, want[i].depth);
        printf("\n");
    }
    kvi_index_destroy(ix);
    assert_true(ok);
}

/* the jumps the case runs with: 1 (every position probed), 2, and 0 (to the end) */
static const uint32_t jumps[] = {1, 2, 0};

/*
 * Instances 0 and 1 hold the first block only (depth 1). Between the probe
 * of position 0 (count 2) and the next probe, two instances store the whole
 * query: that position's count is 2 as well, so the search sees no drain and
 * assigns only the newcomers; the slow path must give 0 and 1 their depth.
 * (Before the fix, the walk from depth 0 ran at the first unassigned member
 * and later ones were skipped as walked: instance 1 was missing.)
 */
static void test_members_added_between_probes(void **state)
{
    (void)state;
    static const struct op before[] = {{false, 0, 1}, {false, 1, 1}};
    static const struct op during[] = {{false, 2, 8}, {false, 3, 8}};
    static const struct want want[] = {{0, 1}, {1, 1}, {2, 8}, {3, 8}};
    for (size_t j = 0; j < KVI_ARRAY_LEN(jumps); j++) {
        uint32_t fire = jumps[j] == 0 ? 7 : jumps[j];
        run_case("added", jumps[j], 8, fire, before, 2, during, 2, want, 4);
    }
}

/* Two whole-query holders leave and four others arrive between the probes:
 * counts again agree (4 at position 0 before, 4 at the next position after). */
static void test_members_replaced_between_probes(void **state)
{
    (void)state;
    static const struct op before[] = {{false, 0, 1}, {false, 1, 1}, {false, 2, 8}, {false, 3, 8}};
    static const struct op during[] = {{true, 2, 0}, {true, 3, 0}, {false, 4, 8},
                                       {false, 5, 8}, {false, 6, 8}, {false, 7, 8}};
    static const struct want want[] = {{0, 1}, {1, 1}, {4, 8}, {5, 8}, {6, 8}, {7, 8}};
    for (size_t j = 0; j < KVI_ARRAY_LEN(jumps); j++) {
        uint32_t fire = jumps[j] == 0 ? 7 : jumps[j];
        run_case("replaced", jumps[j], 8, fire, before, 4, during, 6, want, 6);
    }
}

/* Three members at three depths, none reached by the search (the count at
 * the next probe matches after two whole-query stores): each keeps its depth. */
static void test_members_at_several_depths(void **state)
{
    (void)state;
    static const struct op before[] = {{false, 0, 1}, {false, 1, 3}, {false, 5, 3}};
    static const struct op during[] = {{false, 2, 8}, {false, 3, 8}, {false, 4, 8}};
    static const struct want want[] = {{0, 1}, {1, 3}, {5, 3}, {2, 8}, {3, 8}, {4, 8}};
    run_case("depths", 0, 8, 7, before, 3, during, 3, want, 6);
}

static int setup(void **state)
{
    (void)state;
    kvi_rcu_register_thread();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvi_rcu_unregister_thread();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_members_added_between_probes),
        cmocka_unit_test(test_members_replaced_between_probes),
        cmocka_unit_test(test_members_at_several_depths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
