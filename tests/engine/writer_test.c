/* ctest-labels: unit -- engine/writer.{h,c}: pools, producers, ordering, flush, call, dump, stats */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common.h"
#include "engine/hash.h"
#include "engine/index.h"
#include "engine/index_internal.h"
#include "engine/rcu.h"
#include "engine/ring.h"
#include "engine/writer.h"
#include "writer_fixture.h"

/*
 * DESIGN: most tests build an op stream with the helpers below and, before
 * submitting each op, apply the very same op directly to a second
 * ("reference") index on the test thread (mirror_submit). Writers apply ops
 * of one instance in submit order, so once the producer is flushed the
 * pooled index must equal the reference: same canonical dump (as a set of
 * rows), same query results (compared by (instance, dp_rank, depth,
 * tree_size), since slot ids depend on the interleaving of instances), same
 * deterministic counters. The direct application also yields the expected
 * outcome of every op, to check the writers' outcome counters.
 *
 * The test thread is a registered RCU reader for the whole run (main), and
 * never holds a read-side section while it waits for a writer.
 */

#define NW 2          /* writers in most tests (= index partitions) */
#define NCHAIN 8      /* corpus chains */
#define CHAIN_LEN 24  /* blocks per chain */
#define MAX_MATCH 256

/* ---- corpus: chains of content hashes, engine hashes per slot ------------- */

static uint64_t g_content[NCHAIN][CHAIN_LEN];
static uint64_t g_seq[NCHAIN][CHAIN_LEN];

/* Chain c shares its first (c % 3) * 2 blocks with chain 0, so entries get
 * several members and parents are shared. */
static void corpus_init(void)
{
    for (uint32_t c = 0; c < NCHAIN; c++) {
        uint32_t share = c == 0 ? 0 : (c % 3) * 2;
        for (uint32_t i = 0; i < CHAIN_LEN; i++)
            g_content[c][i] = i < share ? g_content[0][i] : mix64(((uint64_t)c << 32) | i);
        kvi_seq_hashes(g_content[c], CHAIN_LEN, g_seq[c]);
    }
}

/* The engine hash slot (inst, rank) uses for block pos of chain c: a function
 * of the prefix, like a real engine's block hash. */
static uint64_t eh_of(uint32_t inst, uint32_t rank, uint32_t c, uint32_t pos)
{
    return mix64(g_seq[c][pos] ^ mix64(((uint64_t)(inst + 1) << 20) ^ rank));
}

/* ---- op builders ------------------------------------------------------------ */

/* Store blocks [start, start + n) of chain c; parent = block start - 1. */
static struct kvi_op *op_store(struct kvi_index *ix, uint32_t inst, uint32_t rank, enum kvi_tier tier, uint32_t c,
                               uint32_t start, uint32_t n, bool with_seq)
{
    struct kvi_op *op = kvi_op_alloc(n, with_seq);
    op->type = KVI_OP_STORE;
    op->tier = (uint8_t)tier;
    op->ix = ix;
    op->instance = inst;
    op->dp_rank = rank;
    op->has_parent = start > 0;
    op->parent_engine_hash = start > 0 ? eh_of(inst, rank, c, start - 1) : 0;
    op->position = start;
    for (uint32_t i = 0; i < n; i++) {
        op->blocks[i].engine_hash = eh_of(inst, rank, c, start + i);
        op->blocks[i].content_hash = g_content[c][start + i];
        if (with_seq)
            op->seq[i] = g_seq[c][start + i];
    }
    return op;
}

/* A store whose parent the slot has never seen: -ENOENT. */
static struct kvi_op *op_store_orphan(struct kvi_index *ix, uint32_t inst, uint32_t rank, uint32_t c, uint32_t start,
                                      uint32_t n)
{
    struct kvi_op *op = op_store(ix, inst, rank, KVI_TIER_GPU, c, start, n, false);
    op->has_parent = true;
    op->parent_engine_hash = 0xdead000000000000ull | mix64(start);
    return op;
}

/* A store repeating an engine hash: -EINVAL, index unchanged. */
static struct kvi_op *op_store_dup(struct kvi_index *ix, uint32_t inst, uint32_t rank, uint32_t c, uint32_t n)
{
    struct kvi_op *op = op_store(ix, inst, rank, KVI_TIER_GPU, c, 0, n, false);
    op->blocks[n - 1].engine_hash = op->blocks[0].engine_hash;
    return op;
}

/* Remove the given positions of chain c from (inst, rank, tier). */
static struct kvi_op *op_remove(struct kvi_index *ix, uint32_t inst, uint32_t rank, enum kvi_tier tier, uint32_t c,
                                const uint32_t *pos, uint32_t n)
{
    struct kvi_op *op = kvi_op_alloc(n, false);
    op->type = KVI_OP_REMOVE;
    op->tier = (uint8_t)tier;
    op->ix = ix;
    op->instance = inst;
    op->dp_rank = rank;
    for (uint32_t i = 0; i < n; i++)
        op->hashes[i] = eh_of(inst, rank, c, pos[i]);
    return op;
}

static struct kvi_op *op_remove1(struct kvi_index *ix, uint32_t inst, uint32_t rank, uint32_t c, uint32_t pos)
{
    return op_remove(ix, inst, rank, KVI_TIER_GPU, c, &pos, 1);
}

/* Token-less store of the given positions of chain c by (inst, rank)'s own
 * engine hashes (KVI_OP_STORE_KNOWN), onto tier. */
static struct kvi_op *op_store_known(struct kvi_index *ix, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                                     uint32_t c, const uint32_t *pos, uint32_t n)
{
    struct kvi_op *op = kvi_op_alloc(n, false);
    op->type = KVI_OP_STORE_KNOWN;
    op->tier = (uint8_t)tier;
    op->ix = ix;
    op->instance = inst;
    op->dp_rank = rank;
    for (uint32_t i = 0; i < n; i++)
        op->hashes[i] = eh_of(inst, rank, c, pos[i]);
    return op;
}

/* RFC 1527 store of blocks [start, start + n) of chain c without tokens
 * (KVI_OP_STORE_SEQ_ONLY): named by the slot's engine hashes, identified by
 * seq hashes; parent = block start - 1 when with_parent, else placed by
 * position. content_hash is garbage: the writer must not use it. */
static struct kvi_op *op_store_seq_only(struct kvi_index *ix, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                                        uint32_t c, uint32_t start, uint32_t n, bool with_parent)
{
    struct kvi_op *op = kvi_op_alloc(n, true);
    op->type = KVI_OP_STORE_SEQ_ONLY;
    op->tier = (uint8_t)tier;
    op->ix = ix;
    op->instance = inst;
    op->dp_rank = rank;
    op->has_parent = with_parent && start > 0;
    op->parent_engine_hash = op->has_parent ? eh_of(inst, rank, c, start - 1) : 0;
    op->position = start;
    for (uint32_t i = 0; i < n; i++) {
        op->blocks[i].engine_hash = eh_of(inst, rank, c, start + i);
        op->blocks[i].content_hash = 0xbad0000000000000ull | i;
        op->seq[i] = g_seq[c][start + i];
    }
    return op;
}

/* CLEAR, REMOVE_DP_RANK, REMOVE_INSTANCE */
static struct kvi_op *op_simple(struct kvi_index *ix, enum kvi_op_type type, uint32_t inst, uint32_t rank)
{
    struct kvi_op *op = kvi_op_alloc(0, false);
    op->type = (uint8_t)type;
    op->ix = ix;
    op->instance = inst;
    op->dp_rank = rank;
    return op;
}

/* Bookkeeping of what was submitted, for the writer counters. */
struct expect {
    uint64_t ops;
    uint64_t outcomes[KVI_OUT_COUNT]; /* UNKNOWN_BLOCK: hashes */
    uint64_t blocks; /* blocks of every store op (whatever its type or outcome) */
    uint64_t hashes; /* hashes of every remove op */
};

static void expect_note(struct expect *e, const struct kvi_op *op, enum kvi_op_outcome out, uint64_t unknown)
{
    e->ops++;
    e->outcomes[out]++;
    e->outcomes[KVI_OUT_UNKNOWN_BLOCK] += unknown;
    if (op->type == KVI_OP_STORE || op->type == KVI_OP_STORE_KNOWN || op->type == KVI_OP_STORE_SEQ_ONLY)
        e->blocks += op->n;
    else if (op->type == KVI_OP_REMOVE)
        e->hashes += op->n;
}

/* Apply op to ref (when non-NULL), note it in e (when non-NULL), submit it. */
static void mirror_submit(struct kvi_producer *p, struct kvi_index *ref, struct expect *e, struct kvi_op *op)
{
    uint64_t unknown = 0;
    enum kvi_op_outcome out = ref ? apply_direct(ref, op, &unknown) : KVI_OUT_APPLIED;
    if (e)
        expect_note(e, op, out, unknown);
    kvi_producer_submit(p, op);
}

/* Same for a burst: mirror every op in order, then submit them together. */
static void mirror_submit_burst(struct kvi_producer *p, struct kvi_index *ref, struct expect *e, struct kvi_op **ops,
                                size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t unknown = 0;
        enum kvi_op_outcome out = ref ? apply_direct(ref, ops[i], &unknown) : KVI_OUT_APPLIED;
        if (e)
            expect_note(e, ops[i], out, unknown);
    }
    kvi_producer_submit_burst(p, ops, n);
}

/* ---- indexes ------------------------------------------------------------------ */

static struct kvi_index *index_new(uint32_t n_parts, uint32_t n_inst)
{
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = n_parts, .key_seed = 0x5eed5eed12345678ull};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    for (uint32_t i = 0; i < n_inst; i++)
        assert_int_equal(kvi_index_intern_instance(ix, 1000 + i, NULL, false), (int64_t)i);
    return ix;
}

/* ---- a pool with one producer ------------------------------------------------ */

/* A writer pool (kvi_writer_pool_create(@p n_writers, @p ring_cap), in
 * *pool) and one producer of it, which is returned; both checked non-NULL. */
static struct kvi_producer *pool_open(uint32_t n_writers, uint32_t ring_cap, struct kvi_writer_pool **pool)
{
    *pool = kvi_writer_pool_create(n_writers, ring_cap);
    assert_non_null(*pool);
    struct kvi_producer *p = kvi_producer_create(*pool);
    assert_non_null(p);
    return p;
}

/* The producer forgets @p ix, then the producer, the pool and @p ix are destroyed. */
static void pool_close(struct kvi_writer_pool *pool, struct kvi_producer *p, struct kvi_index *ix)
{
    kvi_producer_forget_index(p, ix);
    kvi_producer_destroy(p);
    kvi_writer_pool_destroy(pool);
    kvi_index_destroy(ix);
}

/* ---- canonical snapshots ----------------------------------------------------- */

struct snap {
    struct row *r;
    size_t n, cap;
    /* producer dumps: where each row was emitted */
    uint32_t n_parts;
    pthread_t *thr;
    atomic_int concurrent; /* emit callbacks running right now */
    int overlap;           /* emit ever ran concurrently with itself */
};

static void snap_emit(void *ctx, const struct kvi_dump_block *b)
{
    struct snap *s = ctx;
    if (atomic_fetch_add(&s->concurrent, 1) != 0)
        s->overlap = 1;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->r = realloc(s->r, s->cap * sizeof *s->r);
        s->thr = realloc(s->thr, s->cap * sizeof *s->thr);
        if (s->r == NULL || s->thr == NULL)
            abort();
    }
    row_fill(&s->r[s->n], b);
    s->thr[s->n] = pthread_self();
    s->n++;
    atomic_fetch_sub(&s->concurrent, 1);
}

static void snap_free(struct snap *s)
{
    free(s->r);
    free(s->thr);
    memset(s, 0, sizeof *s);
}

/* Dump every partition of ix on this thread (ix has no writer running). */
static void snap_direct(struct kvi_index *ix, struct snap *s)
{
    for (uint32_t part = 0; part < kvi_index_n_parts(ix); part++)
        kvi_index_dump_partition(ix, part, snap_emit, s);
}

static void print_row(const char *what, const struct row *r)
{
    fprintf(stderr, "  %s: inst %u rank %u tier %u pos %u eh %016llx content %016llx parent %d:%016llx\n", what,
            r->inst, r->rank, r->tier, r->pos, (unsigned long long)r->eh, (unsigned long long)r->content,
            (int)r->has_parent, (unsigned long long)r->parent_eh);
}

/* Sort both and require equal sets (rows are unique in a dump). */
static void snap_assert_equal(struct snap *got, struct snap *want)
{
    qsort(got->r, got->n, sizeof *got->r, row_cmp);
    qsort(want->r, want->n, sizeof *want->r, row_cmp);
    size_t i = 0;
    for (; i < got->n && i < want->n; i++)
        if (row_cmp(&got->r[i], &want->r[i]) != 0)
            break;
    if (i < got->n || i < want->n) {
        fprintf(stderr, "snapshots differ: %zu rows vs %zu expected; first difference at row %zu\n", got->n, want->n,
                i);
        if (i < got->n)
            print_row("got ", &got->r[i]);
        if (i < want->n)
            print_row("want", &want->r[i]);
    }
    assert_int_equal(got->n, want->n);
    assert_int_equal(i, want->n);
    for (size_t k = 1; k < got->n; k++)
        assert_int_not_equal(row_cmp(&got->r[k - 1], &got->r[k]), 0);
}

/* Snapshot of ix through the pool == direct snapshot of ref. */
static void assert_dump_equal(struct kvi_producer *p, struct kvi_index *ix, struct kvi_index *ref)
{
    struct snap got = {0}, want = {0};
    kvi_producer_dump(p, ix, snap_emit, &got);
    snap_direct(ref, &want);
    assert_int_equal(got.overlap, 0);
    snap_assert_equal(&got, &want);
    snap_free(&got);
    snap_free(&want);
}

/* ---- queries ------------------------------------------------------------------ */

/* Gpu matches of chain c's first len blocks, sorted. by_seq: query by seq. */
static size_t query(const struct kvi_index *ix, uint32_t c, uint32_t len, bool by_seq, struct qrow *out)
{
    struct kvi_match m[MAX_MATCH];
    kvi_rcu_read_lock();
    size_t n = by_seq ? kvi_index_find_matches_by_seq(ix, g_seq[c], len, m, MAX_MATCH)
                      : kvi_index_find_matches(ix, g_content[c], len, m, MAX_MATCH);
    kvi_rcu_read_unlock();
    assert_true(n <= MAX_MATCH);
    for (size_t i = 0; i < n; i++) {
        assert_true(m[i].depth >= 1 && m[i].depth <= len);
        out[i] = (struct qrow){m[i].instance, m[i].dp_rank, m[i].depth, m[i].tree_size};
    }
    qsort(out, n, sizeof *out, qrow_cmp);
    return n;
}

static void assert_queries_equal(const struct kvi_index *ix, const struct kvi_index *ref)
{
    static const uint32_t lens[] = {1, 2, 3, 5, 8, 13, CHAIN_LEN};
    struct qrow a[MAX_MATCH], b[MAX_MATCH];
    for (uint32_t c = 0; c < NCHAIN; c++)
        for (size_t l = 0; l < KVI_ARRAY_LEN(lens); l++)
            for (int by_seq = 0; by_seq < 2; by_seq++) {
                size_t na = query(ix, c, lens[l], by_seq, a);
                size_t nb = query(ref, c, lens[l], by_seq, b);
                if (na != nb || memcmp(a, b, na * sizeof *a) != 0)
                    fprintf(stderr, "query chain %u len %u by_seq %d: %zu matches vs %zu expected\n", c, lens[l],
                            by_seq, na, nb);
                assert_int_equal(na, nb);
                assert_memory_equal(a, b, na * sizeof *a);
            }
}

static void assert_index_stats_equal(const struct kvi_index *ix, const struct kvi_index *ref)
{
    struct kvi_index_stats a, b;
    kvi_index_stats(ix, &a);
    kvi_index_stats(ref, &b);
    assert_int_equal(a.entries, b.entries);
    assert_int_equal(a.holdings, b.holdings);
    assert_int_equal(a.slots, b.slots);
    assert_int_equal(a.stored_blocks, b.stored_blocks);
    assert_int_equal(a.removed_blocks, b.removed_blocks);
    assert_int_equal(a.parent_not_found, b.parent_not_found);
    assert_int_equal(a.parent_elsewhere, b.parent_elsewhere);
    assert_int_equal(a.unknown_removes, b.unknown_removes);
    assert_int_equal(a.invalid_events, b.invalid_events);
    assert_int_equal(a.unknown_blocks, b.unknown_blocks);
}

/* Full comparison of a pooled index (producer p flushed) with its reference. */
static void assert_same_state(struct kvi_producer *p, struct kvi_index *ix, struct kvi_index *ref, uint32_t n_inst)
{
    assert_dump_equal(p, ix, ref);
    assert_queries_equal(ix, ref);
    assert_index_stats_equal(ix, ref);
    for (uint32_t i = 0; i < n_inst; i++)
        for (uint32_t r = 0; r < 3; r++)
            assert_int_equal(kvi_index_tree_size(ix, i, r), kvi_index_tree_size(ref, i, r));
}

static void stats_sum(const struct kvi_writer_pool *pool, struct kvi_writer_stats *sum)
{
    memset(sum, 0, sizeof *sum);
    for (uint32_t w = 0; w < kvi_writer_pool_size(pool); w++) {
        struct kvi_writer_stats st;
        kvi_writer_stats(pool, w, &st);
        sum->ops += st.ops;
        for (int o = 0; o < KVI_OUT_COUNT; o++)
            sum->outcomes[o] += st.outcomes[o];
        sum->blocks_stored += st.blocks_stored;
        sum->hashes_removed += st.hashes_removed;
        sum->queued += st.queued;
        sum->sleeps += st.sleeps;
        sum->stalls += st.stalls;
    }
}

static void assert_stats_match(const struct kvi_writer_pool *pool, const struct expect *e)
{
    struct kvi_writer_stats s;
    stats_sum(pool, &s);
    assert_int_equal(s.ops, e->ops);
    assert_int_equal(s.outcomes[KVI_OUT_APPLIED], e->outcomes[KVI_OUT_APPLIED]);
    assert_int_equal(s.outcomes[KVI_OUT_PARENT_NOT_FOUND], e->outcomes[KVI_OUT_PARENT_NOT_FOUND]);
    assert_int_equal(s.outcomes[KVI_OUT_INVALID], e->outcomes[KVI_OUT_INVALID]);
    assert_int_equal(s.outcomes[KVI_OUT_UNKNOWN_BLOCK], e->outcomes[KVI_OUT_UNKNOWN_BLOCK]);
    assert_int_equal(s.blocks_stored, e->blocks);
    assert_int_equal(s.hashes_removed, e->hashes);
    assert_int_equal(s.queued, 0);
}

/* ---- tests: pool and producer lifecycle ------------------------------------- */

static void test_pool_create_errors(void **state)
{
    static const uint32_t bad[] = {0, KVI_WRITER_MAX + 1, 1000, UINT32_MAX};
    for (size_t i = 0; i < KVI_ARRAY_LEN(bad); i++) {
        errno = 0;
        assert_null(kvi_writer_pool_create(bad[i], 0));
        assert_int_equal(errno, EINVAL);
        errno = 0;
        assert_null(kvi_writer_pool_create(bad[i], 16));
        assert_int_equal(errno, EINVAL);
    }
    kvi_writer_pool_destroy(NULL); /* no-op */
    kvi_producer_destroy(NULL);    /* no-op */

    struct kvi_writer_pool *pool = kvi_writer_pool_create(1, 0);
    assert_non_null(pool);
    assert_int_equal(kvi_writer_pool_size(pool), 1);
    kvi_writer_pool_destroy(pool); /* never had a producer */
}

static void count_call(void *arg, uint32_t writer)
{
    atomic_fetch_add((atomic_uint *)arg + writer, 1);
}

/* The largest pool: every writer reachable through one producer. */
static void test_pool_max_writers(void **state)
{
    struct kvi_writer_pool *pool = kvi_writer_pool_create(KVI_WRITER_MAX, 2);
    assert_non_null(pool);
    assert_int_equal(kvi_writer_pool_size(pool), KVI_WRITER_MAX);
    struct kvi_producer *p = kvi_producer_create(pool);
    assert_non_null(p);
    static atomic_uint calls[KVI_WRITER_MAX];
    for (uint32_t w = 0; w < KVI_WRITER_MAX; w++)
        atomic_store(&calls[w], 0);
    for (uint32_t w = 0; w < KVI_WRITER_MAX; w++)
        kvi_producer_call(p, w, count_call, calls);
    for (uint32_t w = 0; w < KVI_WRITER_MAX; w++)
        assert_int_equal(atomic_load(&calls[w]), 1);
    kvi_producer_destroy(p);
    kvi_writer_pool_destroy(pool);
}

/*
 * ring_capacity is used only when a producer creates its rings, where a
 * capacity kvi_ring_create refuses would abort kvi_producer_create; the
 * constructor rejects it up front (EINVAL), and accepts the largest one.
 */
static void test_pool_create_rejects_bad_ring_capacity(void **state)
{
    static const uint32_t bad[] = {KVI_RING_MAX_CAPACITY + 1, UINT32_MAX};
    for (size_t i = 0; i < KVI_ARRAY_LEN(bad); i++) {
        errno = 0;
        struct kvi_writer_pool *pool = kvi_writer_pool_create(1, bad[i]);
        int err = errno;
        if (pool != NULL)
            kvi_writer_pool_destroy(pool); /* no producer: the bad capacity is never used */
        assert_null(pool);
        assert_int_equal(err, EINVAL);
    }
    struct kvi_writer_pool *pool = kvi_writer_pool_create(1, KVI_RING_MAX_CAPACITY);
    assert_non_null(pool); /* rings are only allocated by producers */
    kvi_writer_pool_destroy(pool);
}

/* Create and destroy more producers than there are slots, one at a time:
 * slots are recycled, and every producer's op (submitted without an explicit
 * flush) is applied by the time destroy returns, in producer order. */
static void test_producer_slot_reuse(void **state)
{
    const uint32_t rounds = KVI_PRODUCER_MAX + 100;
    struct kvi_writer_pool *pool = kvi_writer_pool_create(NW, 2);
    assert_non_null(pool);
    struct kvi_index *ix = index_new(NW, 2);
    /* A long-lived producer alongside the short-lived ones. */
    struct kvi_producer *keep = kvi_producer_create(pool);
    assert_non_null(keep);
    for (uint32_t i = 0; i < rounds; i++) {
        struct kvi_producer *p = kvi_producer_create(pool);
        if (p == NULL)
            fprintf(stderr, "kvi_producer_create failed at round %u: %s\n", i, strerror(errno));
        assert_non_null(p);
        /* instance 0: chain 0 block (i % CHAIN_LEN) on the next rank once a chain is complete */
        uint32_t rank = i / CHAIN_LEN, pos = i % CHAIN_LEN;
        kvi_producer_submit(p, op_store(ix, 0, rank, KVI_TIER_GPU, 0, pos, 1, false));
        kvi_producer_destroy(p);
    }
    kvi_producer_flush(keep);
    uint32_t full = rounds / CHAIN_LEN;
    for (uint32_t r = 0; r < full; r++)
        assert_int_equal(kvi_index_tree_size(ix, 0, r), CHAIN_LEN);
    assert_int_equal(kvi_index_tree_size(ix, 0, full), rounds % CHAIN_LEN);
    struct kvi_writer_stats s;
    stats_sum(pool, &s);
    assert_int_equal(s.ops, rounds);
    assert_int_equal(s.outcomes[KVI_OUT_APPLIED], rounds);
    assert_int_equal(s.queued, 0);
    kvi_producer_forget_index(keep, ix);
    kvi_producer_destroy(keep);
    kvi_writer_pool_destroy(pool);
    kvi_index_destroy(ix);
}

/* ---- tests: ordering ---------------------------------------------------------- */

/*
 * A scenario whose result depends on the order of the ops of each instance:
 * 6 instances over 2 partitions, every op type. Returns the expected gpu
 * matches for the full chain 0 in want (sorted), their count as result.
 */
static size_t scenario(struct kvi_producer *p, struct kvi_index *ix, struct kvi_index *ref, struct expect *e,
                       bool as_burst, struct qrow *want)
{
    struct kvi_op *ops[64];
    size_t n = 0;
    const uint32_t mid = 3;
    /* inst 0 (part 0): store chain, remove the middle (drops 3..7), re-store 3..5 */
    ops[n++] = op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, 8, false);
    ops[n++] = op_remove1(ix, 0, 0, 0, mid);
    ops[n++] = op_store(ix, 0, 0, KVI_TIER_GPU, 0, 3, 3, false);
    /* inst 1 (part 1): two ranks, clear, store again */
    ops[n++] = op_store(ix, 1, 0, KVI_TIER_GPU, 0, 0, 8, false);
    ops[n++] = op_store(ix, 1, 1, KVI_TIER_GPU, 0, 0, 4, false);
    ops[n++] = op_simple(ix, KVI_OP_CLEAR, 1, 0);
    ops[n++] = op_store(ix, 1, 0, KVI_TIER_GPU, 0, 0, 2, false);
    /* inst 2 (part 0): rejected stores leave it unchanged; a cpu run on a gpu parent */
    ops[n++] = op_store(ix, 2, 0, KVI_TIER_GPU, 0, 0, 5, false);
    ops[n++] = op_store_orphan(ix, 2, 0, 0, 5, 3);
    ops[n++] = op_store_dup(ix, 2, 0, 0, 6);
    ops[n++] = op_store(ix, 2, 0, KVI_TIER_CPU, 0, 5, 2, false);
    /* inst 3 (part 1): second rank stored then dropped */
    ops[n++] = op_store(ix, 3, 0, KVI_TIER_GPU, 0, 0, 4, false);
    ops[n++] = op_store(ix, 3, 1, KVI_TIER_GPU, 0, 0, 6, false);
    ops[n++] = op_simple(ix, KVI_OP_REMOVE_DP_RANK, 3, 1);
    /* inst 4 (part 0): stored then removed entirely */
    ops[n++] = op_store(ix, 4, 0, KVI_TIER_GPU, 0, 0, 7, false);
    ops[n++] = op_simple(ix, KVI_OP_REMOVE_INSTANCE, 4, 0);
    /* inst 5 (part 1): a seq store (kvi_index_store_seq path), then its tail removed */
    ops[n++] = op_store(ix, 5, 0, KVI_TIER_GPU, 0, 0, 9, true);
    ops[n++] = op_store(ix, 5, 0, KVI_TIER_GPU, 0, 9, 3, true);
    ops[n++] = op_remove1(ix, 5, 0, 0, 10);
    /* inst 0 again: remove the re-stored tail, store a sibling chain on rank 1 */
    ops[n++] = op_remove1(ix, 0, 0, 0, 5);
    ops[n++] = op_store(ix, 0, 1, KVI_TIER_GPU, 2, 0, 10, false);
    if (as_burst) {
        mirror_submit_burst(p, ref, e, ops, n);
    } else {
        for (size_t i = 0; i < n; i++)
            mirror_submit(p, ref, e, ops[i]);
    }
    size_t k = 0;
    want[k++] = (struct qrow){0, 0, 5, 5};  /* 0..7, minus 3..7, plus 3..5, minus 5 */
    want[k++] = (struct qrow){0, 1, 4, 10}; /* chain 2 shares 4 blocks with chain 0 */
    want[k++] = (struct qrow){1, 0, 2, 2};
    want[k++] = (struct qrow){2, 0, 5, 5};
    want[k++] = (struct qrow){3, 0, 4, 4};
    want[k++] = (struct qrow){5, 0, 10, 10};
    return k;
}

static void run_ordered(bool as_burst)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 0, &pool);
    struct kvi_index *ix = index_new(NW, 6), *ref = index_new(NW, 6);
    struct expect e = {0};
    struct qrow want[16], got[MAX_MATCH];
    size_t nw = scenario(p, ix, ref, &e, as_burst, want);
    kvi_producer_flush(p);

    /* the reference itself gives the expected answer (sanity of the scenario) */
    assert_int_equal(query(ref, 0, CHAIN_LEN, false, got), nw);
    assert_memory_equal(got, want, nw * sizeof *want);
    /* and the pooled index equals it */
    assert_int_equal(query(ix, 0, CHAIN_LEN, false, got), nw);
    assert_memory_equal(got, want, nw * sizeof *want);
    assert_int_equal(e.outcomes[KVI_OUT_PARENT_NOT_FOUND], 1);
    assert_int_equal(e.outcomes[KVI_OUT_INVALID], 1);
    assert_stats_match(pool, &e);
    assert_same_state(p, ix, ref, 6);

    pool_close(pool, p, ix);
    kvi_index_destroy(ref);
}

static void test_ordered_ops_single(void **state)
{
    run_ordered(false);
}

static void test_ordered_ops_burst(void **state)
{
    run_ordered(true);
}

/* Many rounds of order-sensitive ops per instance with no flush in between,
 * as singles and bursts that alternate between partitions. */
static void test_ordered_rounds(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 64, &pool);
    enum { NI = 4, ROUNDS = 300 };
    struct kvi_index *ix = index_new(NW, NI), *ref = index_new(NW, NI);
    struct expect e = {0};
    uint64_t rng = 42;
    for (uint32_t round = 0; round < ROUNDS; round++) {
        struct kvi_op *ops[NI * 4];
        size_t n = 0;
        for (uint32_t i = 0; i < NI; i++) {
            rng = mix64(rng);
            uint32_t c = (uint32_t)(rng % NCHAIN), len = 4 + (uint32_t)(rng >> 8) % (CHAIN_LEN - 4);
            uint32_t cut = 1 + (uint32_t)(rng >> 16) % (len - 1);
            ops[n++] = op_store(ix, i, 0, KVI_TIER_GPU, c, 0, len, false);
            ops[n++] = op_remove1(ix, i, 0, c, cut);
            if ((rng >> 24) % 4 == 0)
                ops[n++] = op_simple(ix, KVI_OP_CLEAR, i, 0);
            else
                ops[n++] = op_store(ix, i, 0, KVI_TIER_GPU, c, cut, 1, false);
        }
        if (round % 2)
            mirror_submit_burst(p, ref, &e, ops, n);
        else
            for (size_t k = 0; k < n; k++)
                mirror_submit(p, ref, &e, ops[k]);
    }
    kvi_producer_flush(p);
    assert_stats_match(pool, &e);
    assert_same_state(p, ix, ref, NI);
    pool_close(pool, p, ix);
    kvi_index_destroy(ref);
}

/* ---- tests: flush, call, dump ------------------------------------------------- */

/* After each flush, a registered RCU reader sees the whole chain so far. */
static void test_flush_visibility(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 0, &pool);
    struct kvi_index *ix = index_new(NW, 2);
    struct qrow got[MAX_MATCH];
    for (uint32_t pos = 0; pos < CHAIN_LEN; pos++) {
        kvi_producer_submit(p, op_store(ix, 0, 0, KVI_TIER_GPU, 1, pos, 1, false));
        kvi_producer_submit(p, op_store(ix, 1, 0, KVI_TIER_GPU, 1, pos, 1, pos % 2 == 0));
        kvi_producer_flush(p);
        assert_int_equal(query(ix, 1, CHAIN_LEN, false, got), 2);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(got[k].inst, (uint32_t)k);
            assert_int_equal(got[k].depth, pos + 1);
            assert_int_equal(got[k].tree, pos + 1);
        }
        assert_int_equal(query(ix, 1, CHAIN_LEN, true, got), 2);
        assert_int_equal(got[0].depth, pos + 1);
        assert_int_equal(kvi_index_tree_size(ix, 1, 0), pos + 1);
    }
    /* removals too: the root removal cascades */
    kvi_producer_submit(p, op_remove1(ix, 0, 0, 1, 0));
    kvi_producer_flush(p);
    assert_int_equal(query(ix, 1, CHAIN_LEN, false, got), 1);
    assert_int_equal(got[0].inst, 1);
    assert_int_equal(kvi_index_tree_size(ix, 0, 0), 0);
    pool_close(pool, p, ix);
}

struct call_rec {
    struct kvi_index *ix;
    uint32_t writer;
    pthread_t thr;
    uint64_t blocks; /* blocks in the writer's partition when the call ran */
    int calls;
};

static void count_block(void *ctx, const struct kvi_dump_block *b)
{
    (void)b;
    (*(uint64_t *)ctx)++;
}

static void record_call(void *arg, uint32_t writer)
{
    struct call_rec *r = arg;
    r->writer = writer;
    r->thr = pthread_self();
    r->calls++;
    r->blocks = 0;
    if (r->ix != NULL)
        kvi_index_dump_partition(r->ix, writer, count_block, &r->blocks); /* allowed: we are its writer */
}

/* kvi_producer_call runs fn on the requested writer, on that writer's own
 * thread, after every op the producer submitted before. */
static void test_call_runs_on_writer(void **state)
{
    const uint32_t nw = 4;
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(nw, 8, &pool);
    struct kvi_index *ix = index_new(nw, 8);
    pthread_t thr[4];
    for (uint32_t round = 0; round < 3; round++) {
        for (uint32_t w = 0; w < nw; w++) {
            /* unflushed stores for both instances of partition w (w, w + 4):
             * round r adds a full chain to (w, rank r), 1 block to (w + 4, rank r) */
            for (uint32_t pos = 0; pos < CHAIN_LEN; pos++)
                kvi_producer_submit(p, op_store(ix, w, round, KVI_TIER_GPU, 3, pos, 1, false));
            kvi_producer_submit(p, op_store(ix, w + nw, round, KVI_TIER_GPU, 0, 0, 1, false));
            struct call_rec r = {.ix = ix, .writer = UINT32_MAX};
            kvi_producer_call(p, w, record_call, &r);
            assert_int_equal(r.calls, 1);
            assert_int_equal(r.writer, w);
            assert_int_equal(r.blocks, (uint64_t)(round + 1) * (CHAIN_LEN + 1));
            assert_false(pthread_equal(r.thr, pthread_self()));
            if (round == 0)
                thr[w] = r.thr;
            else
                assert_true(pthread_equal(r.thr, thr[w]));
            for (uint32_t v = 0; v < w; v++)
                assert_false(pthread_equal(thr[v], thr[w]));
        }
    }
    /* a call that mutates nothing, without any index */
    struct call_rec r = {.writer = UINT32_MAX};
    kvi_producer_call(p, nw - 1, record_call, &r);
    assert_int_equal(r.writer, nw - 1);
    assert_true(pthread_equal(r.thr, thr[nw - 1]));
    pool_close(pool, p, ix);
}

/* kvi_producer_dump: every partition emitted once, on its own writer, never
 * concurrently; the union equals a direct dump of the same ops. Then each
 * partition alone through kvi_producer_dump_partition. */
static void test_dump_matches_direct(void **state)
{
    const uint32_t nw = 3, ni = 9;
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(nw, 0, &pool);
    struct kvi_index *ix = index_new(nw, ni), *ref = index_new(nw, ni);
    struct expect e = {0};
    uint64_t rng = 7;
    for (int k = 0; k < 600; k++) {
        rng = mix64(rng);
        uint32_t inst = (uint32_t)(rng % ni), rank = (uint32_t)(rng >> 8) % 2, c = (uint32_t)(rng >> 16) % NCHAIN;
        uint32_t start = (uint32_t)(rng >> 24) % 6, len = 1 + (uint32_t)(rng >> 32) % 8;
        enum kvi_tier tier = (rng >> 40) % 5 == 0 ? KVI_TIER_CPU : KVI_TIER_GPU;
        switch ((rng >> 48) % 8) {
        case 0:
        case 1: {
            uint32_t pos = (uint32_t)(rng >> 56) % CHAIN_LEN;
            mirror_submit(p, ref, &e, op_remove(ix, inst, rank, tier, c, &pos, 1));
            break;
        }
        default:
            mirror_submit(p, ref, &e, op_store(ix, inst, rank, tier, c, start, len, (rng >> 60) & 1));
            break;
        }
    }
    kvi_producer_flush(p);
    /* writer threads, to check where each partition is emitted */
    pthread_t thr[3];
    for (uint32_t w = 0; w < nw; w++) {
        struct call_rec r = {0};
        kvi_producer_call(p, w, record_call, &r);
        thr[w] = r.thr;
    }
    struct snap got = {0}, want = {0};
    kvi_producer_dump(p, ix, snap_emit, &got);
    snap_direct(ref, &want);
    assert_int_equal(got.overlap, 0);
    assert_true(want.n > 100); /* the stream leaves a sizeable index */
    uint64_t per_part[3] = {0}, want_part[3] = {0};
    uint32_t last = 0;
    for (size_t i = 0; i < got.n; i++) {
        uint32_t part = kvi_index_partition_of(ix, got.r[i].inst);
        assert_true(part >= last); /* partitions one after the other: each once */
        last = part;
        per_part[part]++;
        assert_true(pthread_equal(got.thr[i], thr[part]));
    }
    for (size_t i = 0; i < want.n; i++)
        want_part[kvi_index_partition_of(ref, want.r[i].inst)]++;
    for (uint32_t w = 0; w < nw; w++) {
        assert_true(want_part[w] > 0);
        assert_int_equal(per_part[w], want_part[w]);
    }
    snap_assert_equal(&got, &want);
    snap_free(&got);
    snap_free(&want);
    assert_queries_equal(ix, ref);
    assert_stats_match(pool, &(struct expect){
                                 .ops = e.ops + nw + nw, /* + the record calls and the dump calls */
                                 .outcomes = {e.outcomes[0] + nw + nw, e.outcomes[1], e.outcomes[2]},
                                 .blocks = e.blocks,
                                 .hashes = e.hashes,
                             });
    /* kvi_producer_dump_partition: one partition, on its own writer, whole;
     * a partition past the index's or the pool's count emits nothing */
    for (uint32_t w = 0; w <= nw; w++) {
        struct snap pw = {0};
        kvi_producer_dump_partition(p, ix, w, snap_emit, &pw);
        assert_int_equal(pw.n, w < nw ? want_part[w] : 0);
        for (size_t i = 0; i < pw.n; i++) {
            assert_int_equal(kvi_index_partition_of(ix, pw.r[i].inst), w);
            assert_true(pthread_equal(pw.thr[i], thr[w]));
        }
        snap_free(&pw);
    }
    pool_close(pool, p, ix);
    kvi_index_destroy(ref);
}

/* A dump of an empty index emits nothing. */
static void test_dump_empty(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 0, &pool);
    struct kvi_index *ix = index_new(NW, 4);
    struct snap got = {0};
    kvi_producer_dump(p, ix, snap_emit, &got);
    assert_int_equal(got.n, 0);
    snap_free(&got);
    pool_close(pool, p, ix);
}

/* ---- tests: backpressure and statistics --------------------------------------- */

/* Rings of 2 ops, thousands of ops in singles and bursts of up to 100: none
 * is lost, outcomes are counted, producers stall. */
static void test_backpressure(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 2, &pool);
    enum { NI = 4, TOTAL = 6000 };
    struct kvi_index *ix = index_new(NW, NI), *ref = index_new(NW, NI);
    struct expect e = {0};
    uint64_t rng = 99;
    uint32_t next_pos[NI] = {0};
    struct kvi_op *burst[100];
    size_t submitted = 0;
    while (submitted < TOTAL) {
        rng = mix64(rng);
        size_t bn = (rng & 3) == 0 ? 1 : 1 + (size_t)(rng >> 8) % KVI_ARRAY_LEN(burst);
        if (bn > TOTAL - submitted)
            bn = TOTAL - submitted;
        for (size_t k = 0; k < bn; k++) {
            rng = mix64(rng);
            uint32_t inst = (uint32_t)(rng % NI);
            uint32_t kind = (uint32_t)(rng >> 8) % 16;
            struct kvi_op *op;
            if (kind < 9) { /* extend the chain: applied */
                op = op_store(ix, inst, 0, KVI_TIER_GPU, 4, next_pos[inst], 1, false);
                next_pos[inst] = (next_pos[inst] + 1) % CHAIN_LEN;
            } else if (kind < 11) {
                op = op_store_orphan(ix, inst, 0, 5, 3, 2);
            } else if (kind < 13) {
                op = op_store_dup(ix, inst, 0, 5, 3);
            } else if (kind < 15) {
                uint32_t pos[3] = {(uint32_t)(rng >> 16) % CHAIN_LEN, 1, 2};
                op = op_remove(ix, inst, 0, KVI_TIER_GPU, 4, pos, 3);
                next_pos[inst] = 0; /* block 1 and its descendants are gone: restart */
            } else {
                op = op_simple(ix, KVI_OP_CLEAR, inst, 0);
                next_pos[inst] = 0;
            }
            burst[k] = op;
        }
        if (bn == 1)
            mirror_submit(p, ref, &e, burst[0]);
        else
            mirror_submit_burst(p, ref, &e, burst, bn);
        submitted += bn;
    }
    kvi_producer_flush(p);
    assert_int_equal(e.ops, TOTAL);
    /* every outcome kind occurs (the stream really exercises them) */
    assert_true(e.outcomes[KVI_OUT_APPLIED] > 1000);
    assert_true(e.outcomes[KVI_OUT_PARENT_NOT_FOUND] > 100);
    assert_true(e.outcomes[KVI_OUT_INVALID] > 100);
    assert_stats_match(pool, &e);
    struct kvi_writer_stats s;
    stats_sum(pool, &s);
    assert_true(s.stalls > 0); /* bursts larger than a ring must wait */
    assert_same_state(p, ix, ref, NI);
    pool_close(pool, p, ix);
    kvi_index_destroy(ref);
}

/* Exact counters on a small known stream, per writer. */
static void test_writer_stats(void **state)
{
    struct kvi_writer_pool *pool = kvi_writer_pool_create(NW, 0);
    assert_non_null(pool);
    struct kvi_writer_stats st;
    for (uint32_t w = 0; w < NW; w++) {
        kvi_writer_stats(pool, w, &st);
        assert_int_equal(st.ops, 0);
        assert_int_equal(st.queued, 0);
        assert_int_equal(st.blocks_stored, 0);
        assert_int_equal(st.stalls, 0);
    }
    struct kvi_producer *p = kvi_producer_create(pool);
    assert_non_null(p);
    struct kvi_index *ix = index_new(NW, 2); /* instance 0: writer 0, instance 1: writer 1 */
    /* writer 0: three stores of 4 + 5 + 6 blocks, one rejected (unknown parent) */
    kvi_producer_submit(p, op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, 4, false));
    kvi_producer_submit(p, op_store(ix, 0, 0, KVI_TIER_GPU, 0, 4, 5, false));
    kvi_producer_submit(p, op_store_orphan(ix, 0, 0, 1, 10, 6));
    /* writer 1: a store of 8, removes of 2 + 3 hashes (one unknown), a clear */
    kvi_producer_submit(p, op_store(ix, 1, 0, KVI_TIER_GPU, 0, 0, 8, false));
    uint32_t r1[2] = {7, 6}, r2[3] = {5, 23, 22};
    kvi_producer_submit(p, op_remove(ix, 1, 0, KVI_TIER_GPU, 0, r1, 2));
    kvi_producer_submit(p, op_remove(ix, 1, 0, KVI_TIER_GPU, 0, r2, 3));
    kvi_producer_submit(p, op_simple(ix, KVI_OP_CLEAR, 1, 0));
    kvi_producer_flush(p);

    kvi_writer_stats(pool, 0, &st);
    assert_int_equal(st.ops, 3);
    assert_int_equal(st.outcomes[KVI_OUT_APPLIED], 2);
    assert_int_equal(st.outcomes[KVI_OUT_PARENT_NOT_FOUND], 1);
    assert_int_equal(st.outcomes[KVI_OUT_INVALID], 0);
    assert_int_equal(st.blocks_stored, 15); /* blocks of every store op the writer applied */
    assert_int_equal(st.hashes_removed, 0);
    assert_int_equal(st.queued, 0);
    assert_true(st.max_lag_ns >= st.last_lag_ns);
    assert_int_equal(kvi_index_tree_size(ix, 0, 0), 9);

    kvi_writer_stats(pool, 1, &st);
    assert_int_equal(st.ops, 4);
    assert_int_equal(st.outcomes[KVI_OUT_APPLIED], 4);
    assert_int_equal(st.blocks_stored, 8);
    assert_int_equal(st.hashes_removed, 5);
    assert_int_equal(st.queued, 0);
    assert_int_equal(kvi_index_tree_size(ix, 1, 0), 0);

    /* a call counts as one applied op of its writer */
    atomic_uint calls[NW] = {0};
    kvi_producer_call(p, 1, count_call, calls);
    assert_int_equal(atomic_load(&calls[1]), 1);
    kvi_writer_stats(pool, 1, &st);
    assert_int_equal(st.ops, 5);
    assert_int_equal(st.outcomes[KVI_OUT_APPLIED], 5);
    kvi_writer_stats(pool, 0, &st);
    assert_int_equal(st.ops, 3);

    /* an op of an unknown type is counted invalid (and freed) */
    struct kvi_op *bad = op_simple(ix, KVI_OP_CLEAR, 0, 0);
    bad->type = 200;
    kvi_producer_submit(p, bad);
    kvi_producer_flush(p);
    kvi_writer_stats(pool, 0, &st);
    assert_int_equal(st.ops, 4);
    assert_int_equal(st.outcomes[KVI_OUT_INVALID], 1);

    /* an allocated op that is never submitted */
    kvi_op_free(op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, 3, true));

    pool_close(pool, p, ix);
}

/* ---- tests: token-less stores and sinks ----------------------------------------- */

/*
 * STORE_KNOWN and STORE_SEQ_ONLY ops in a random stream with ordinary stores,
 * removes and clears on 6 instances over both writers, singles and bursts:
 * the pooled index equals the directly applied reference, unresolved hashes
 * are counted per hash, and the garbage content hashes of STORE_SEQ_ONLY ops
 * never reach the index.
 */
static void test_token_less_ops(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 16, &pool);
    enum { NI = 6, TOTAL = 3000 };
    struct kvi_index *ix = index_new(NW, NI), *ref = index_new(NW, NI);
    struct expect e = {0};
    uint64_t rng = 2024;
    uint64_t kinds[6] = {0};
    struct kvi_op *burst[24];
    size_t nb = 0;
    for (uint32_t k = 0; k < TOTAL; k++) {
        rng = mix64(rng);
        uint32_t inst = (uint32_t)(rng % NI), rank = (uint32_t)(rng >> 8) % 2, c = (uint32_t)(rng >> 16) % NCHAIN;
        uint32_t start = (uint32_t)(rng >> 24) % 8, len = 1 + (uint32_t)(rng >> 32) % 10;
        enum kvi_tier tier = (enum kvi_tier)((rng >> 40) % KVI_TIER_COUNT);
        uint32_t kind = (uint32_t)(rng >> 44) % 16;
        struct kvi_op *op;
        if (kind < 4) { /* a chain from the root */
            op = op_store(ix, inst, rank, KVI_TIER_GPU, c, 0, start + len, false);
            kinds[0]++;
        } else if (kind < 8) { /* offload some of it by name (some unknown, some out of order) */
            uint32_t pos[8];
            for (uint32_t i = 0; i < 8; i++)
                pos[i] = (uint32_t)(mix64(rng + i) % (CHAIN_LEN - 1));
            op = op_store_known(ix, inst, rank, tier, c, pos, 1 + (uint32_t)(rng >> 52) % 8);
            kinds[1]++;
        } else if (kind < 11) { /* seq only: under a parent, or placed by position (lower tiers) */
            bool with_parent = (rng >> 56) & 1;
            op = op_store_seq_only(ix, inst, rank, tier, c, with_parent ? start : start % 4, len, with_parent);
            kinds[2]++;
        } else if (kind < 14) {
            uint32_t pos[2] = {start, (start + len) % CHAIN_LEN};
            op = op_remove(ix, inst, rank, tier, c, pos, 2);
            kinds[3]++;
        } else if (kind < 15) {
            op = op_simple(ix, KVI_OP_CLEAR, inst, 0);
            kinds[4]++;
        } else {
            op = op_store_seq_only(ix, inst, rank, KVI_TIER_GPU, c, 0, start + len, false); /* gpu, from the root */
            kinds[5]++;
        }
        burst[nb++] = op;
        if (nb == KVI_ARRAY_LEN(burst) || (rng >> 60) % 3 == 0) {
            if (nb == 1)
                mirror_submit(p, ref, &e, burst[0]);
            else
                mirror_submit_burst(p, ref, &e, burst, nb);
            nb = 0;
        }
    }
    if (nb > 0)
        mirror_submit_burst(p, ref, &e, burst, nb);
    kvi_producer_flush(p);
    for (int i = 0; i < 6; i++)
        assert_true(kinds[i] > 100);
    /* the stream exercises every outcome */
    assert_true(e.outcomes[KVI_OUT_UNKNOWN_BLOCK] > 100);
    assert_true(e.outcomes[KVI_OUT_PARENT_NOT_FOUND] > 10);
    assert_true(e.outcomes[KVI_OUT_INVALID] > 10); /* gpu runs placed by position */
    assert_stats_match(pool, &e);
    assert_same_state(p, ix, ref, NI);
    struct kvi_index_stats st;
    kvi_index_stats(ix, &st);
    assert_int_equal(st.unknown_blocks, e.outcomes[KVI_OUT_UNKNOWN_BLOCK]);
    /* no garbage content reached the index: every known content is the
     * corpus hash of its block, and seq-only placements were made */
    struct snap got = {0};
    snap_direct(ix, &got);
    size_t no_content = 0;
    for (size_t i = 0; i < got.n; i++) {
        const struct row *r = &got.r[i];
        if (r->no_content) {
            assert_int_equal(r->content, 0);
            no_content++;
            continue;
        }
        bool found = false;
        for (uint32_t c = 0; c < NCHAIN && !found; c++)
            found = r->pos < CHAIN_LEN && g_seq[c][r->pos] == r->seq && g_content[c][r->pos] == r->content;
        assert_true(found);
    }
    assert_true(no_content > 0);
    snap_free(&got);
    pool_close(pool, p, ix);
    kvi_index_destroy(ref);
}

static struct kvi_op *with_sink(struct kvi_op *op, struct kvi_op_sink *sink)
{
    op->sink = sink;
    return op;
}

static void sink_call(void *arg, uint32_t writer)
{
    (void)arg;
    (void)writer;
}

/* Exact sink accounting: per op type and outcome, across writers and two
 * producers sharing a sink; ops without a sink touch none. */
static void test_op_sinks(void **state)
{
    struct kvi_writer_pool *pool = kvi_writer_pool_create(NW, 0);
    assert_non_null(pool);
    struct kvi_producer *p = kvi_producer_create(pool), *q = kvi_producer_create(pool);
    assert_non_null(p);
    assert_non_null(q);
    struct kvi_index *ix = index_new(NW, 2); /* instance 0: writer 0, instance 1: writer 1 */
    struct kvi_op_sink a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    struct kvi_op *op;
    /* sink a, writer 0 */
    kvi_producer_submit(p, with_sink(op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, 6, false), &a)); /* applied: 6 */
    kvi_producer_submit(p, with_sink(op_store_orphan(ix, 0, 0, 1, 10, 4), &a));              /* parent not found */
    kvi_producer_submit(p, with_sink(op_store_dup(ix, 0, 0, 1, 5), &a));                     /* invalid */
    uint32_t kp[4] = {1, 2, 30 % CHAIN_LEN, 5};
    op = op_store_known(ix, 0, 0, KVI_TIER_CPU, 0, kp, 4);
    op->hashes[2] = 0xfeedull; /* unknown */
    kvi_producer_submit(p, with_sink(op, &a));                                               /* applied: 3, 1 unknown */
    kvi_producer_submit(p, with_sink(op_store_known(ix, 0, 0, KVI_TIER_CPU, 0, kp, 2), &a)); /* idempotent: 2 */
    uint32_t rp[3] = {5, 23, 4};
    kvi_producer_submit(p, with_sink(op_remove(ix, 0, 0, KVI_TIER_GPU, 0, rp, 3), &a)); /* known 2 (23 unknown) */
    kvi_producer_submit(p, op_store(ix, 0, 0, KVI_TIER_GPU, 0, 4, 2, false));            /* no sink */
    op = op_store_seq_only(ix, 0, 0, KVI_TIER_CPU, 3, 2, 3, false);
    op->seq = NULL;
    kvi_producer_submit(p, with_sink(op, &a));                                           /* invalid: no seq */
    op = kvi_op_alloc(0, false);
    op->type = 250;
    op->ix = ix;
    kvi_producer_submit(p, with_sink(op, &a));                                           /* invalid type */
    op = kvi_op_alloc(0, false);
    op->type = KVI_OP_CALL;
    op->instance = 0; /* writer 0 */
    op->fn = sink_call;
    kvi_producer_submit(p, with_sink(op, &a));                                           /* applied */
    /* sink b, shared by producers p and q, on both writers */
    kvi_producer_submit(p, with_sink(op_store_seq_only(ix, 1, 0, KVI_TIER_GPU, 2, 0, 7, false), &b)); /* 7 */
    kvi_producer_submit(q, with_sink(op_store_seq_only(ix, 1, 0, KVI_TIER_GPU, 2, 7, 3, true), &b));  /* 3 */
    kvi_producer_flush(p); /* q's continuation must follow p's store of its parent */
    kvi_producer_submit(q, with_sink(op_store_seq_only(ix, 1, 0, KVI_TIER_GPU, 2, 7, 3, true), &b));  /* again: 3 */
    kvi_producer_submit(q, with_sink(op_store_seq_only(ix, 1, 0, KVI_TIER_GPU, 2, 4, 3, false), &b)); /* gpu by position: invalid */
    kvi_producer_submit(q, with_sink(op_simple(ix, KVI_OP_CLEAR, 0, 0), &b));                          /* applied */
    uint32_t rq[2] = {9, 0};
    kvi_producer_submit(q, with_sink(op_remove(ix, 1, 0, KVI_TIER_GPU, 2, rq, 2), &b));                /* known 2 */
    kvi_producer_flush(p);
    kvi_producer_flush(q);

    struct kvi_op_sink ra, rb;
    kvi_op_sink_read(&a, &ra);
    kvi_op_sink_read(&b, &rb);
    assert_int_equal(ra.outcomes[KVI_OUT_APPLIED], 5);
    assert_int_equal(ra.outcomes[KVI_OUT_PARENT_NOT_FOUND], 1);
    assert_int_equal(ra.outcomes[KVI_OUT_INVALID], 3);
    assert_int_equal(ra.outcomes[KVI_OUT_UNKNOWN_BLOCK], 1);
    assert_int_equal(ra.blocks_stored, 6 + 3 + 2);
    assert_int_equal(ra.hashes_removed, 2);
    assert_int_equal(rb.outcomes[KVI_OUT_APPLIED], 5);
    assert_int_equal(rb.outcomes[KVI_OUT_PARENT_NOT_FOUND], 0);
    assert_int_equal(rb.outcomes[KVI_OUT_INVALID], 1);
    assert_int_equal(rb.outcomes[KVI_OUT_UNKNOWN_BLOCK], 0);
    assert_int_equal(rb.blocks_stored, 7 + 3 + 3);
    assert_int_equal(rb.hashes_removed, 2);
    /* the writers' own counters: every op, blocks and hashes whatever the outcome */
    struct kvi_writer_stats s;
    stats_sum(pool, &s);
    assert_int_equal(s.ops, 16);
    assert_int_equal(s.outcomes[KVI_OUT_APPLIED], 11);
    assert_int_equal(s.outcomes[KVI_OUT_PARENT_NOT_FOUND], 1);
    assert_int_equal(s.outcomes[KVI_OUT_INVALID], 4);
    assert_int_equal(s.outcomes[KVI_OUT_UNKNOWN_BLOCK], 1);
    assert_int_equal(s.blocks_stored, 6 + 4 + 5 + 4 + 2 + 2 + 3 + 7 + 3 + 3 + 3);
    assert_int_equal(s.hashes_removed, 3 + 2);
    /* the state the ops left: instance 0 cleared; instance 1 lost block 0 and so everything */
    assert_int_equal(kvi_index_tree_size(ix, 0, 0), 0);
    assert_int_equal(kvi_index_tree_size(ix, 1, 0), 0); /* removing block 0 took everything */
    kvi_producer_forget_index(p, ix);
    kvi_producer_destroy(q);
    kvi_producer_destroy(p);
    kvi_writer_pool_destroy(pool);
    kvi_index_destroy(ix);
}

/* With pub_applied, a writer publishes op->applied1 into the sink after the op, whatever
 * its outcome; ops without it leave the position alone. */
static struct kvi_op *with_applied(struct kvi_op *op, struct kvi_op_sink *sink, uint64_t applied1)
{
    op->sink = sink;
    op->pub_applied = true;
    op->applied1 = applied1;
    return op;
}

struct applied_probe {
    struct kvi_op_sink *sink;
    uint64_t seen;   /* the sink's position when pre ran */
    uint32_t part;   /* pre's partition */
    uint64_t blocks; /* blocks emitted before pre ran (must be 0) */
    uint64_t emitted;
    bool pre_ran;
};

static void probe_pre(void *ctx, uint32_t part)
{
    struct applied_probe *pr = ctx;
    pr->pre_ran = true;
    pr->part = part;
    pr->seen = kvi_op_sink_applied(pr->sink);
    pr->blocks = pr->emitted;
}

static void probe_emit(void *ctx, const struct kvi_dump_block *b)
{
    (void)b;
    ((struct applied_probe *)ctx)->emitted++;
}

static void test_sink_applied_position(void **state)
{
    (void)state;
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 0, &pool);
    struct kvi_index *ix = index_new(NW, 2); /* instance 0: writer 0 */
    struct kvi_op_sink a;
    memset(&a, 0, sizeof a);
    assert_int_equal(kvi_op_sink_applied(&a), 0);
    kvi_producer_submit(p, with_applied(op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, 4, false), &a, 1)); /* applied */
    kvi_producer_flush(p);
    assert_int_equal(kvi_op_sink_applied(&a), 1);
    kvi_producer_submit(p, with_sink(op_store(ix, 0, 0, KVI_TIER_GPU, 0, 4, 2, false), &a)); /* no pub_applied */
    kvi_producer_flush(p);
    assert_int_equal(kvi_op_sink_applied(&a), 1);
    kvi_producer_submit(p, with_applied(op_store_orphan(ix, 0, 0, 1, 10, 4), &a, 8)); /* rejected: published too */
    kvi_producer_flush(p);
    assert_int_equal(kvi_op_sink_applied(&a), 8);
    kvi_producer_submit(p, with_applied(op_simple(ix, KVI_OP_REMOVE_DP_RANK, 0, 0), &a, 0)); /* back to unset */
    kvi_producer_flush(p);
    assert_int_equal(kvi_op_sink_applied(&a), 0);
    struct kvi_op_sink r;
    kvi_op_sink_read(&a, &r);
    assert_int_equal(r.applied1, 0);
    kvi_op_sink_set_applied(&a, 42);
    assert_int_equal(kvi_op_sink_applied(&a), 42);

    /* the dump hook runs on the partition's writer, before its blocks, at the position of the blocks */
    kvi_producer_submit(p, with_applied(op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, 6, false), &a, 43));
    struct applied_probe pr = {.sink = &a};
    kvi_producer_dump_partition_pre(p, ix, 0, probe_pre, probe_emit, &pr);
    assert_true(pr.pre_ran);
    assert_int_equal(pr.part, 0);
    assert_int_equal(pr.seen, 43);
    assert_int_equal(pr.blocks, 0);
    assert_int_equal(pr.emitted, 6);
    /* an empty partition still runs the hook; an out-of-range one does not */
    struct applied_probe pr1 = {.sink = &a};
    kvi_producer_dump_partition_pre(p, ix, 1, probe_pre, probe_emit, &pr1);
    assert_true(pr1.pre_ran);
    assert_int_equal(pr1.part, 1);
    assert_int_equal(pr1.emitted, 0);
    struct applied_probe pr2 = {.sink = &a};
    kvi_producer_dump_partition_pre(p, ix, NW, probe_pre, probe_emit, &pr2);
    assert_false(pr2.pre_ran);
    pool_close(pool, p, ix);
}

struct blocker {
    struct kvi_writer_pool *pool;
    uint32_t w;
    atomic_int started;
    atomic_int release;
};

static void block_fn(void *arg, uint32_t writer)
{
    struct blocker *b = arg;
    atomic_store(&b->started, 1);
    while (!atomic_load(&b->release))
        usleep(100);
}

static void *blocker_main(void *arg)
{
    struct blocker *b = arg;
    struct kvi_producer *p = kvi_producer_create(b->pool);
    if (p == NULL)
        abort();
    kvi_producer_call(p, b->w, block_fn, b);
    kvi_producer_destroy(p);
    return NULL;
}

/* While writer 0 is stuck in a call from another producer: the ops queued
 * for it are counted in `queued`, and writer 1 keeps applying ops. */
static void test_queued_while_writer_busy(void **state)
{
    struct kvi_writer_pool *pool = kvi_writer_pool_create(NW, 0);
    assert_non_null(pool);
    struct kvi_index *ix = index_new(NW, 2);
    struct blocker b = {.pool = pool, .w = 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, blocker_main, &b), 0);
    while (!atomic_load(&b.started))
        usleep(100);
    struct kvi_producer *p = kvi_producer_create(pool);
    assert_non_null(p);
    for (uint32_t pos = 0; pos < 5; pos++)
        kvi_producer_submit(p, op_store(ix, 0, 0, KVI_TIER_GPU, 0, pos, 1, false));
    for (uint32_t pos = 0; pos < 7; pos++)
        kvi_producer_submit(p, op_store(ix, 1, 0, KVI_TIER_GPU, 0, pos, 1, false));
    struct kvi_writer_stats st;
    for (int i = 0; i < 20000; i++) { /* writer 1 is not held up by writer 0 */
        kvi_writer_stats(pool, 1, &st);
        /* a writer counts a burst's ops before it marks the burst applied:
         * wait for both (the TSan build once read the stats in between) */
        if (st.ops == 7 && st.queued == 0)
            break;
        usleep(100);
    }
    assert_int_equal(st.ops, 7);
    assert_int_equal(st.queued, 0);
    kvi_writer_stats(pool, 0, &st);
    assert_int_equal(st.queued, 6); /* the running call + 5 stores */
    assert_int_equal(st.ops, 0);
    atomic_store(&b.release, 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    kvi_producer_flush(p);
    kvi_writer_stats(pool, 0, &st);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.ops, 6);
    assert_int_equal(kvi_index_tree_size(ix, 0, 0), 5);
    pool_close(pool, p, ix);
}

/* Idle writers go to sleep and a plain submit (no flush) wakes them
 * promptly: a lost wake-up would show as a ~100 ms delay (the futex
 * timeout) on every trial. Each trial waits until its writer has gone to
 * sleep since its last op, so every submit is one that must wake it. */
static void test_sleep_and_wake(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 0, &pool);
    struct kvi_index *ix = index_new(NW, 2);
    enum { TRIALS = 20 };
    int slow = 0;
    struct kvi_writer_stats st;
    uint64_t slept[NW] = {0}; /* a writer's sleeps when its last op was submitted */
    for (uint32_t trial = 0; trial < TRIALS; trial++) {
        uint32_t w = trial % NW;
        /* 20 ms: past the idle reclaim a writer does first (1 ms at most),
         * so its sleep is the long one, where a lost wake-up costs the
         * timeout; the loop, not this nap, makes sure it went to sleep */
        usleep(20000);
        for (uint64_t t = kvi_now_ns(); kvi_now_ns() - t < 10000000000ull; sched_yield()) {
            kvi_writer_stats(pool, w, &st);
            if (st.sleeps > slept[w])
                break;
        }
        assert_true(st.sleeps > slept[w]); /* it went to sleep (10 s: a hung writer fails, not hangs) */
        slept[w] = st.sleeps;
        uint64_t before = st.ops;
        uint64_t t0 = kvi_now_ns();
        kvi_producer_submit(p, op_store(ix, w, 0, KVI_TIER_GPU, 0, trial / NW, 1, false));
        for (;;) {
            kvi_writer_stats(pool, w, &st);
            if (st.ops > before)
                break;
            usleep(50);
        }
        if (kvi_now_ns() - t0 > 50u * 1000 * 1000)
            slow++;
    }
    kvi_producer_flush(p);
    struct kvi_writer_stats sum;
    stats_sum(pool, &sum);
    assert_true(sum.sleeps >= TRIALS); /* the protocol above */
    if (slow > 0)
        fprintf(stderr, "%d of %d wake-ups took more than 50 ms\n", slow, TRIALS);
    assert_true(slow <= TRIALS / 4);
    assert_int_equal(kvi_index_tree_size(ix, 0, 0), TRIALS / NW);
    assert_int_equal(kvi_index_tree_size(ix, 1, 0), TRIALS / NW);
    pool_close(pool, p, ix);
}

/* ---- tests: teardown ---------------------------------------------------------- */

/* forget_index reclaims the index's retired memory on every writer and drops
 * it from their dirty lists, so it can be destroyed while the pool goes on
 * (ASan/LSan: no leak, no use after free when the writers idle afterwards). */
static void test_forget_index_then_destroy(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 0, &pool);
    for (int round = 0; round < 6; round++) {
        struct kvi_index *ix = index_new(NW, 6), *ref = index_new(NW, 6);
        uint64_t rng = (uint64_t)round + 1000;
        /* shared prefixes (multi-member entries), renames, cascades, clears:
         * lots of retired memory */
        for (int k = 0; k < 400; k++) {
            rng = mix64(rng);
            uint32_t inst = (uint32_t)(rng % 6), c = (uint32_t)(rng >> 8) % NCHAIN;
            switch ((rng >> 16) % 5) {
            case 0:
                mirror_submit(p, ref, NULL, op_remove1(ix, inst, 0, c, (uint32_t)(rng >> 24) % 4));
                break;
            case 1:
                if ((rng >> 32) % 8 == 0) {
                    mirror_submit(p, ref, NULL, op_simple(ix, KVI_OP_REMOVE_INSTANCE, inst, 0));
                    break;
                }
                mirror_submit(p, ref, NULL, op_simple(ix, KVI_OP_CLEAR, inst, 0));
                break;
            default:
                mirror_submit(p, ref, NULL, op_store(ix, inst, (uint32_t)(rng >> 40) % 2, KVI_TIER_GPU, c, 0,
                                                     1 + (uint32_t)(rng >> 24) % CHAIN_LEN, false));
                break;
            }
        }
        kvi_producer_flush(p);
        assert_same_state(p, ix, ref, 6);
        kvi_producer_forget_index(p, ix);
        for (uint32_t part = 0; part < NW; part++) { /* reclaimed (read after the calls: ordered) */
            assert_int_equal(ix->parts[part].n_retired, 0);
            assert_int_equal(ix->parts[part].n_pending, 0);
        }
        kvi_index_destroy(ix);
        kvi_index_destroy(ref);
        usleep(2000); /* writers go idle with the index gone */
    }
    kvi_producer_destroy(p);
    kvi_writer_pool_destroy(pool);
}

/* Forget and destroy an index while the writers still have a deep backlog
 * of ops for another index, so they do not go idle in between: the forgotten
 * index must be off their dirty lists by then, or their next idle-time
 * reclaim touches freed memory (ASan). */
static void test_forget_index_while_busy(void **state)
{
    enum { BACKLOG = 40000 }; /* ops per writer: tens of ms of work */
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 2 * BACKLOG, &pool);
    struct kvi_index *ix = index_new(NW, 4), *other = index_new(NW, 2);
    /* hold both writers; queue ops that dirty ix (with retired memory) and
     * the backlog behind them; release them */
    struct blocker b[NW];
    pthread_t t[NW];
    for (uint32_t w = 0; w < NW; w++) {
        b[w] = (struct blocker){.pool = pool, .w = w};
        assert_int_equal(pthread_create(&t[w], NULL, blocker_main, &b[w]), 0);
        while (!atomic_load(&b[w].started))
            usleep(100);
    }
    for (uint32_t i = 0; i < 4; i++)
        for (uint32_t c = 0; c < NCHAIN; c++) {
            kvi_producer_submit(p, op_store(ix, i, 0, KVI_TIER_GPU, c, 0, CHAIN_LEN, false));
            kvi_producer_submit(p, op_remove1(ix, i, 0, c, 1));
        }
    struct kvi_producer *q = kvi_producer_create(pool);
    assert_non_null(q);
    for (uint32_t k = 0; k < BACKLOG; k++)
        for (uint32_t inst = 0; inst < 2; inst++) {
            uint32_t pos = k % CHAIN_LEN;
            if (pos == 0 && k > 0)
                kvi_producer_submit(q, op_simple(other, KVI_OP_CLEAR, inst, 0));
            kvi_producer_submit(q, op_store(other, inst, 0, KVI_TIER_GPU, 6, pos, 1, false));
        }
    for (uint32_t w = 0; w < NW; w++)
        atomic_store(&b[w].release, 1);
    kvi_producer_forget_index(p, ix);
    struct kvi_writer_stats st;
    kvi_writer_stats(pool, 0, &st);
    if (st.queued == 0)
        fprintf(stderr, "note: the backlog drained before the index was destroyed\n");
    kvi_index_destroy(ix); /* while the writers work through the backlog */
    for (uint32_t w = 0; w < NW; w++)
        assert_int_equal(pthread_join(t[w], NULL), 0);
    kvi_producer_flush(q);
    usleep(5000); /* writers go idle and reclaim whatever is on their dirty lists */
    assert_int_equal(kvi_index_tree_size(other, 0, 0), (BACKLOG - 1) % CHAIN_LEN + 1);
    assert_int_equal(kvi_index_tree_size(other, 1, 0), (BACKLOG - 1) % CHAIN_LEN + 1);
    kvi_producer_forget_index(q, other);
    kvi_producer_destroy(q);
    kvi_producer_destroy(p);
    kvi_writer_pool_destroy(pool);
    kvi_index_destroy(other);
}

/* An idle writer frees retired memory at most once per millisecond, however
 * often it goes idle with something to free (each grace period costs every
 * core running a reader an IPI), and still frees it when it goes to sleep. */
static void test_idle_reclaim_rate_limited(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(1, 64, &pool);
    struct kvi_index *ix = index_new(1, 1);
    struct kvi_writer_stats st;
    kvi_writer_stats(pool, 0, &st);
    uint64_t r0 = st.idle_reclaims, t0 = kvi_now_ns(), rounds = 0;
    /* each round leaves freed entries waiting, then lets the writer go idle;
     * for 200 ms, and until the writer has done one idle reclaim (however
     * little cpu it got meanwhile) */
    while (kvi_now_ns() - t0 < 200000000ull || st.idle_reclaims == r0) {
        kvi_producer_submit(p, op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, CHAIN_LEN, false));
        kvi_producer_submit(p, op_remove1(ix, 0, 0, 0, 0));
        kvi_producer_flush(p);
        usleep(50);
        rounds++;
        kvi_writer_stats(pool, 0, &st);
    }
    kvi_writer_stats(pool, 0, &st);
    uint64_t ms = (kvi_now_ns() - t0) / 1000000u + 1, n = st.idle_reclaims - r0;
    print_message("%" PRIu64 " idle rounds in %" PRIu64 " ms: %" PRIu64 " grace periods\n", rounds, ms, n);
    assert_true(n >= 1);
    assert_true(n <= ms + 2);
    /* memory freed just before the writer goes to sleep is still reclaimed:
     * once nothing is pending (no grace period for 20 ms), one more round
     * must be followed by a grace period with no further op */
    uint64_t last = st.idle_reclaims, quiet_since = kvi_now_ns(), deadline = quiet_since + 5000000000ull;
    while (kvi_now_ns() - quiet_since < 20000000ull && kvi_now_ns() < deadline) {
        usleep(1000);
        kvi_writer_stats(pool, 0, &st);
        if (st.idle_reclaims != last) {
            last = st.idle_reclaims;
            quiet_since = kvi_now_ns();
        }
    }
    kvi_producer_submit(p, op_store(ix, 0, 0, KVI_TIER_GPU, 0, 0, CHAIN_LEN, false));
    kvi_producer_submit(p, op_remove1(ix, 0, 0, 0, 0));
    kvi_producer_flush(p);
    do {
        usleep(200);
        kvi_writer_stats(pool, 0, &st);
    } while (st.idle_reclaims == last && kvi_now_ns() < deadline);
    assert_true(st.idle_reclaims > last);
    pool_close(pool, p, ix);
}

struct stall_producer {
    struct kvi_writer_pool *pool;
    struct kvi_index *ix;
    uint32_t n;
    uint64_t cpu_ns; /* the producer thread's CPU time while submitting */
};

static void *stall_producer_main(void *arg)
{
    struct stall_producer *sp = arg;
    struct kvi_producer *p = kvi_producer_create(sp->pool);
    if (p == NULL)
        abort();
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (uint32_t i = 0; i < sp->n; i++)
        kvi_producer_submit(p, op_simple(sp->ix, KVI_OP_CLEAR, 0, 0));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    sp->cpu_ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)b.tv_nsec - (uint64_t)a.tv_nsec;
    kvi_producer_flush(p);
    kvi_producer_forget_index(p, sp->ix);
    kvi_producer_destroy(p);
    return NULL;
}

/* A producer facing a full ring sleeps until the writer has made room,
 * instead of spinning: while the writer is held for 300 ms after the
 * producer found its ring full, it uses a small part of that time in CPU,
 * and every op is applied once the writer runs. */
static void test_full_ring_producer_sleeps(void **state)
{
    enum { HOLD_MS = 300, OPS = 200 };
    struct kvi_writer_pool *pool = kvi_writer_pool_create(1, 16);
    assert_non_null(pool);
    struct kvi_index *ix = index_new(1, 1);
    struct blocker b = {.pool = pool, .w = 0};
    pthread_t tb, tp;
    assert_int_equal(pthread_create(&tb, NULL, blocker_main, &b), 0);
    while (!atomic_load(&b.started))
        usleep(100);
    struct stall_producer sp = {.pool = pool, .ix = ix, .n = OPS};
    assert_int_equal(pthread_create(&tp, NULL, stall_producer_main, &sp), 0);
    /* the producer fills the ring (16 of OPS ops: the writer is held) */
    struct kvi_writer_stats st;
    for (uint64_t t = kvi_now_ns(); kvi_now_ns() - t < 10000000000ull; sched_yield()) {
        kvi_writer_stats(pool, 0, &st);
        if (st.stalls >= 1)
            break;
    }
    assert_true(st.stalls >= 1);
    usleep(HOLD_MS * 1000); /* the measured time: the producer must sleep through it */
    kvi_writer_stats(pool, 0, &st);
    assert_true(st.queued < OPS); /* the producer is stuck on the full ring */
    atomic_store(&b.release, 1);
    assert_int_equal(pthread_join(tp, NULL), 0);
    assert_int_equal(pthread_join(tb, NULL), 0);
    kvi_writer_stats(pool, 0, &st);
    assert_int_equal(st.ops, OPS + 2); /* the clears, the blocking call and forget_index's */
    print_message("producer CPU while blocked %" PRIu64 " us of %d ms\n", sp.cpu_ns / 1000, HOLD_MS);
    assert_true(sp.cpu_ns < HOLD_MS * 1000000ull / 4);
    kvi_writer_pool_destroy(pool);
    kvi_index_destroy(ix);
}

/* Ops submitted without a flush are applied before kvi_producer_destroy
 * returns, and the pool shuts down cleanly after it. */
static void test_pool_destroy_drains(void **state)
{
    struct kvi_writer_pool *pool;
    struct kvi_producer *p = pool_open(NW, 16, &pool);
    enum { NI = 4 };
    struct kvi_index *ix = index_new(NW, NI), *ref = index_new(NW, NI);
    struct expect e = {0};
    struct kvi_op *ops[40];
    for (int k = 0; k < 50; k++) {
        size_t n = 0;
        for (uint32_t i = 0; i < NI; i++)
            for (uint32_t pos = 0; pos < 10; pos++)
                ops[n++] = op_store(ix, i, (uint32_t)k % 3, KVI_TIER_GPU, ((uint32_t)k + i) % NCHAIN, pos, 1,
                                    false);
        mirror_submit_burst(p, ref, &e, ops, n);
        mirror_submit(p, ref, &e, op_remove1(ix, (uint32_t)k % NI, (uint32_t)k % 3, ((uint32_t)k + 1) % NCHAIN, 5));
    }
    kvi_producer_destroy(p); /* no flush before: destroy flushes */
    assert_stats_match(pool, &e);
    kvi_writer_pool_destroy(pool);
    /* writers are gone: this thread may dump the partitions itself */
    struct snap got = {0}, want = {0};
    snap_direct(ix, &got);
    snap_direct(ref, &want);
    snap_assert_equal(&got, &want);
    snap_free(&got);
    snap_free(&want);
    assert_queries_equal(ix, ref);
    assert_index_stats_equal(ix, ref);
    kvi_index_destroy(ix);
    kvi_index_destroy(ref);
}

int main(void)
{
    corpus_init();
    kvi_rcu_register_thread();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_create_errors),
        cmocka_unit_test(test_pool_max_writers),
        cmocka_unit_test(test_pool_create_rejects_bad_ring_capacity),
        cmocka_unit_test(test_producer_slot_reuse),
        cmocka_unit_test(test_ordered_ops_single),
        cmocka_unit_test(test_ordered_ops_burst),
        cmocka_unit_test(test_ordered_rounds),
        cmocka_unit_test(test_flush_visibility),
        cmocka_unit_test(test_call_runs_on_writer),
        cmocka_unit_test(test_dump_matches_direct),
        cmocka_unit_test(test_dump_empty),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_writer_stats),
        cmocka_unit_test(test_token_less_ops),
        cmocka_unit_test(test_op_sinks),
        cmocka_unit_test(test_sink_applied_position),
        cmocka_unit_test(test_queued_while_writer_busy),
        cmocka_unit_test(test_sleep_and_wake),
        cmocka_unit_test(test_forget_index_then_destroy),
        cmocka_unit_test(test_forget_index_while_busy),
        cmocka_unit_test(test_pool_destroy_drains),
        cmocka_unit_test(test_idle_reclaim_rate_limited),
        cmocka_unit_test(test_full_ring_producer_sleeps),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return r;
}
