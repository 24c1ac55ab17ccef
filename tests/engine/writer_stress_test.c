/* ctest-labels: stress -- engine/writer.{h,c}: concurrent producers, writers and RCU readers */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
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
#include "engine/rcu.h"
#include "engine/writer.h"
#include "writer_fixture.h"

/*
 * DESIGN: NPROD producer threads each own a disjoint set of instances (spread
 * over both partitions) and submit a seeded pseudo-random stream of store /
 * remove / clear (and a few remove_dp_rank, rejected and lower-tier) ops,
 * in single submits and bursts, with occasional flushes, calls and dumps.
 * Token-less stores (STORE_KNOWN, STORE_SEQ_ONLY under a parent or from the
 * root) are part of the stream; stores placed by position are not (no op
 * names a position, so a lower-tier store below a parent the rank does not
 * hold is rejected rather than placed), because whether an entry placed that
 * way is linked to its parent depends on the interleaving of producers (and
 * so would the pooled index and the reference).
 * NREAD registered RCU readers query the index all the while and check that
 * every result is sane. Failures on those threads are recorded and asserted
 * by the main thread after pthread_join (cmocka asserts must not run off the
 * main thread).
 *
 * At the end the streams are regenerated from their seeds (the generator
 * depends on nothing but its seed; burst sizes come from a separate RNG) and
 * applied directly, single-threaded, to a reference index. A writer applies
 * the ops of one instance in submit order and instances of different
 * producers are disjoint, so the pooled index must equal the reference:
 * canonical dump, query results, deterministic counters, and the writers'
 * outcome counters.
 *
 * Run time is bounded by a deadline per run (and an op cap, which bounds
 * the reference replay); under TSan both are smaller. What the assertions
 * count on does not depend on the scheduler: each producer submits at least
 * MIN_OPS ops (a fixed prefix of its stream, so every outcome kind occurs
 * and both writers are fed) and goes on past the deadline until every
 * reader has completed a query it started after that producer's first
 * submit; at the end every reader queries the final state before it stops.
 */

#define NWR 2    /* writers = partitions */
#define NPROD 3  /* producer threads */
#define NREAD 2  /* reader threads */
#define IPP 4    /* instances per producer: producer k owns k, k + NPROD, ... */
#define NI (NPROD * IPP)
#define NRANK 2
#define NCHAIN 24
#define LEN 48
#define MAX_BURST 64

#ifdef KVI_TSAN
#define RUN_MS_DEFAULT 9000u /* TSan is ~10-20x slower: keep the test under ~60 s */
#define RUN_MS_SMALL 6000u
#define MAX_OPS 60000u       /* per producer and run: bounds the reference replay */
#else
#define RUN_MS_DEFAULT 2000u
#define RUN_MS_SMALL 1200u
#define MAX_OPS 400000u
#endif
#define MIN_OPS 3000u /* per producer and run, whatever the deadline */

/* ---- corpus ------------------------------------------------------------------ */

static uint64_t g_content[NCHAIN][LEN];
static uint64_t g_seq[NCHAIN][LEN];

/* Chain c >= 1 shares its first (c % 5) * 4 blocks with chain c / 2: a tree
 * of prefixes, so entries have many members and parents are shared. */
static void corpus_init(void)
{
    for (uint32_t c = 0; c < NCHAIN; c++) {
        uint32_t share = c == 0 ? 0 : (c % 5) * 4;
        for (uint32_t i = 0; i < LEN; i++)
            g_content[c][i] = i < share ? g_content[c / 2][i] : mix64(((uint64_t)c << 32) | i | 0x77000000u);
        kvi_seq_hashes(g_content[c], LEN, g_seq[c]);
    }
}

static uint64_t eh_of(uint32_t inst, uint32_t rank, uint32_t c, uint32_t pos)
{
    return mix64(g_seq[c][pos] ^ mix64(((uint64_t)(inst + 1) << 20) ^ rank));
}

/* The chain a dumped block belongs to (by its prefix), or -1. */
static int chain_of(uint64_t seq, uint32_t pos)
{
    if (pos >= LEN)
        return -1;
    for (int c = 0; c < NCHAIN; c++)
        if (g_seq[c][pos] == seq)
            return c;
    return -1;
}

/* ---- op generator -------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return mix64(*s);
}

static struct kvi_op *op_new(uint32_t n, bool with_seq, uint8_t type, struct kvi_index *ix, uint32_t inst,
                             uint32_t rank)
{
    struct kvi_op *op = kvi_op_alloc(n, with_seq);
    op->type = type;
    op->ix = ix;
    op->instance = inst;
    op->dp_rank = rank;
    return op;
}

static struct kvi_op *op_store(struct kvi_index *ix, uint32_t inst, uint32_t rank, enum kvi_tier tier, uint32_t c,
                               uint32_t start, uint32_t n, bool with_seq)
{
    struct kvi_op *op = op_new(n, with_seq, KVI_OP_STORE, ix, inst, rank);
    op->tier = (uint8_t)tier;
    op->has_parent = start > 0;
    op->parent_engine_hash = start > 0 ? eh_of(inst, rank, c, start - 1) : 0;
    op->position = 0; /* never placed by position (see DESIGN) */
    for (uint32_t i = 0; i < n; i++) {
        op->blocks[i].engine_hash = eh_of(inst, rank, c, start + i);
        op->blocks[i].content_hash = g_content[c][start + i];
        if (with_seq)
            op->seq[i] = g_seq[c][start + i];
    }
    return op;
}

/* The next op of producer `prod`'s stream. Depends only on *rng. */
static struct kvi_op *gen_op(uint64_t *rng, uint32_t prod, struct kvi_index *ix)
{
    uint64_t r = rng_next(rng), r2 = rng_next(rng);
    uint32_t inst = prod + NPROD * (uint32_t)(r % IPP);
    uint32_t rank = (uint32_t)(r >> 8) % NRANK;
    uint32_t c = (uint32_t)(r >> 16) % NCHAIN;
    uint32_t kind = (uint32_t)(r >> 24) % 1000;
    uint32_t a = (uint32_t)r2, b = (uint32_t)(r2 >> 32);
    if (kind < 420) { /* extend or re-store a run somewhere on a chain */
        uint32_t start = a % 3 == 0 ? 0 : (a >> 4) % LEN;
        uint32_t n = KVI_MIN(1 + b % 12, LEN - start);
        enum kvi_tier tier = (b >> 8) % 8 == 0 ? KVI_TIER_CPU : KVI_TIER_GPU;
        return op_store(ix, inst, rank, tier, c, start, n, (b >> 12) % 4 == 0);
    }
    if (kind < 460) { /* offload or reload 1..6 blocks by engine hash (some unknown) */
        uint32_t n = 1 + a % 6;
        struct kvi_op *op = op_new(n, false, KVI_OP_STORE_KNOWN, ix, inst, rank);
        op->tier = (uint8_t)((a >> 4) % 4 == 0 ? KVI_TIER_GPU : KVI_TIER_CPU);
        for (uint32_t i = 0; i < n; i++)
            op->hashes[i] = (b >> (i * 5)) % 16 == 0 ? 0xfeed000000000000ull | i
                                                      : eh_of(inst, rank, c, (b >> (i * 5)) % LEN);
        return op;
    }
    if (kind < 500) { /* RFC 1527 without tokens: under a parent, or from the root */
        uint32_t start = a % 3 == 0 ? 0 : (a >> 4) % LEN;
        uint32_t n = KVI_MIN(1 + b % 12, LEN - start);
        struct kvi_op *op = op_new(n, true, KVI_OP_STORE_SEQ_ONLY, ix, inst, rank);
        op->tier = (uint8_t)((b >> 8) % 4 == 0 ? KVI_TIER_CPU : KVI_TIER_GPU);
        op->has_parent = start > 0;
        op->parent_engine_hash = start > 0 ? eh_of(inst, rank, c, start - 1) : 0;
        for (uint32_t i = 0; i < n; i++) {
            op->blocks[i].engine_hash = eh_of(inst, rank, c, start + i);
            op->blocks[i].content_hash = 0xbad0000000000000ull; /* unused */
            op->seq[i] = g_seq[c][start + i];
        }
        return op;
    }
    if (kind < 600) /* a long run from the root */
        return op_store(ix, inst, rank, KVI_TIER_GPU, c, 0, LEN / 2 + a % (LEN / 2 + 1), (b & 1) != 0);
    if (kind < 900) { /* remove 1..4 blocks (some unknown, some cascading) */
        uint32_t n = 1 + a % 4;
        enum kvi_tier tier = (a >> 4) % 8 == 0 ? KVI_TIER_CPU : KVI_TIER_GPU;
        struct kvi_op *op = op_new(n, false, KVI_OP_REMOVE, ix, inst, rank);
        op->tier = (uint8_t)tier;
        for (uint32_t i = 0; i < n; i++)
            op->hashes[i] = eh_of(inst, rank, c, (b >> (i * 6)) % LEN);
        return op;
    }
    if (kind < 930)
        return op_new(0, false, KVI_OP_CLEAR, ix, inst, rank);
    if (kind < 940)
        return op_new(0, false, KVI_OP_REMOVE_DP_RANK, ix, inst, rank);
    if (kind < 970) { /* unknown parent: rejected */
        struct kvi_op *op = op_store(ix, inst, rank, KVI_TIER_GPU, c, 1 + a % (LEN - 4), 3, false);
        op->parent_engine_hash = 0xbad0000000000000ull | b;
        return op;
    }
    /* repeated engine hash: rejected, index unchanged */
    uint32_t n = 2 + a % 10;
    struct kvi_op *op = op_store(ix, inst, rank, KVI_TIER_GPU, c, 0, n, false);
    op->blocks[n - 1].engine_hash = op->blocks[b % (n - 1)].engine_hash;
    return op;
}

/* ---- failures recorded off the main thread ------------------------------------ */

static atomic_uint g_fail;
static pthread_mutex_t g_fail_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_fail_msg[256];

__attribute__((format(printf, 1, 2))) static void record_failure(const char *fmt, ...)
{
    if (atomic_fetch_add(&g_fail, 1) != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_fail_lock);
    vsnprintf(g_fail_msg, sizeof g_fail_msg, fmt, ap);
    pthread_mutex_unlock(&g_fail_lock);
    va_end(ap);
}

static void assert_no_failure(void)
{
    pthread_mutex_lock(&g_fail_lock);
    if (atomic_load(&g_fail) != 0)
        fprintf(stderr, "%u failure(s) on worker threads; first: %s\n", atomic_load(&g_fail), g_fail_msg);
    pthread_mutex_unlock(&g_fail_lock);
    assert_int_equal(atomic_load(&g_fail), 0);
}

/* ---- dump rows ------------------------------------------------------------------ */

struct snap {
    struct row *r;
    size_t n, cap;
};

/* Every dumped block must be a block of the corpus, named the way its slot
 * names it, with its parent named the same way. */
static void check_row(const struct row *r)
{
    int c = chain_of(r->seq, r->pos);
    if (r->inst >= NI || r->rank >= NRANK || r->tier > KVI_TIER_CPU || c < 0) {
        record_failure("dump: bad block inst %u rank %u tier %u pos %u", r->inst, r->rank, r->tier, r->pos);
        return;
    }
    /* a block stored without tokens has no content until tokens reach it */
    if (r->no_content ? r->content != 0 || r->pos == 0 : r->content != g_content[c][r->pos])
        record_failure("dump: block inst %u rank %u pos %u: content %016llx (no_content %d), chain %d", r->inst,
                       r->rank, r->pos, (unsigned long long)r->content, (int)r->no_content, c);
    if (r->eh != eh_of(r->inst, r->rank, (uint32_t)c, r->pos))
        record_failure("dump: block inst %u rank %u pos %u does not match chain %d", r->inst, r->rank, r->pos, c);
    /* A lower-tier block may outlive its parent: removing a gpu block does
     * not cascade to the cpu blocks stored below it (cascades follow the
     * slot's own holdings), and the dump then emits it as a positional root
     * (no parent, position > 0). Gpu holdings are ancestor-closed. */
    bool orphan_ok = r->tier != KVI_TIER_GPU && !r->has_parent;
    if (r->pos > 0 && !orphan_ok &&
        (!r->has_parent || r->parent_eh != eh_of(r->inst, r->rank, (uint32_t)c, r->pos - 1)))
        record_failure("dump: block inst %u rank %u tier %u pos %u: parent %d:%016llx", r->inst, r->rank, r->tier,
                       r->pos, (int)r->has_parent, (unsigned long long)r->parent_eh);
    if (r->pos == 0 && r->has_parent)
        record_failure("dump: root block with a parent");
}

static void snap_emit(void *ctx, const struct kvi_dump_block *b)
{
    struct snap *s = ctx;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->r = realloc(s->r, s->cap * sizeof *s->r);
        if (s->r == NULL)
            abort();
    }
    struct row *r = &s->r[s->n++];
    row_fill(r, b);
    check_row(r);
}

/* ---- producers --------------------------------------------------------------------- */

struct run;
struct reader;

struct prod {
    pthread_t t;
    struct run *run;
    uint32_t id;
    uint64_t seed;
    uint64_t n_ops; /* ops submitted (read after join) */
    uint64_t calls;
    uint64_t dumps;
};

struct run {
    struct kvi_writer_pool *pool;
    struct kvi_index *ix;
    uint64_t deadline_ns;
    atomic_int stop_readers;
    unsigned reader_pause_us; /* readers sleep this long every 16 queries (0: never) */
    struct prod prod[NPROD];
    struct reader *rd;        /* NREAD readers */
};

struct call_check {
    uint32_t want;
    atomic_uint got;
    atomic_uint count;
};

static void call_fn(void *arg, uint32_t writer)
{
    struct call_check *cc = arg;
    atomic_store(&cc->got, writer);
    atomic_fetch_add(&cc->count, 1);
}

static uint64_t reader_queries(const struct run *run, uint32_t i);

/* Every reader has completed two queries since q0 was taken: the second
 * one started after it. */
static bool readers_went_on(const struct run *run, const uint64_t *q0)
{
    for (uint32_t i = 0; i < NREAD; i++)
        if (reader_queries(run, i) < q0[i] + 2)
            return false;
    return true;
}

static void *producer_main(void *arg)
{
    struct prod *pr = arg;
    struct run *run = pr->run;
    struct kvi_producer *p = kvi_producer_create(run->pool);
    if (p == NULL) {
        record_failure("producer %u: kvi_producer_create: %s", pr->id, strerror(errno));
        return NULL;
    }
    uint64_t rng = pr->seed;                   /* the op stream (replayed) */
    uint64_t srng = mix64(pr->seed ^ 0xabcd); /* burst sizes and extras (not replayed) */
    struct kvi_op *burst[MAX_BURST];
    uint64_t iter = 0, q0[NREAD]; /* the readers' counts after this producer's first submit */
    for (uint32_t i = 0; i < NREAD; i++)
        q0[i] = reader_queries(run, i);
    while (pr->n_ops < MAX_OPS &&
           (pr->n_ops < MIN_OPS || kvi_now_ns() < run->deadline_ns || !readers_went_on(run, q0))) {
        uint64_t s = rng_next(&srng);
        uint32_t n = (s & 3) == 0 ? 1 : 1 + (uint32_t)(s >> 8) % MAX_BURST;
        if (n > MAX_OPS - pr->n_ops)
            n = (uint32_t)(MAX_OPS - pr->n_ops);
        for (uint32_t i = 0; i < n; i++)
            burst[i] = gen_op(&rng, pr->id, run->ix);
        if (n == 1)
            kvi_producer_submit(p, burst[0]);
        else
            kvi_producer_submit_burst(p, burst, n);
        pr->n_ops += n;
        if (iter++ == 0)
            for (uint32_t i = 0; i < NREAD; i++)
                q0[i] = reader_queries(run, i);
        uint32_t extra = (uint32_t)(s >> 32) % 1024;
        if (extra < 8) {
            kvi_producer_flush(p);
        } else if (extra < 12) {
            struct call_check cc = {.want = (uint32_t)(s >> 48) % NWR};
            kvi_producer_call(p, cc.want, call_fn, &cc);
            if (atomic_load(&cc.count) != 1 || atomic_load(&cc.got) != cc.want)
                record_failure("producer %u: call for writer %u ran %u times, last on writer %u", pr->id, cc.want,
                     atomic_load(&cc.count), atomic_load(&cc.got));
            pr->calls++;
        } else if (extra < 13 && pr->id == 0) {
            /* a dump while the other producers keep writing: every row sane */
            struct snap s2 = {0};
            kvi_producer_dump(p, run->ix, snap_emit, &s2);
            free(s2.r);
            pr->dumps++;
        }
    }
    kvi_producer_destroy(p); /* flushes */
    return NULL;
}

/* ---- readers ------------------------------------------------------------------------ */

struct reader {
    pthread_t t;
    struct run *run;
    uint32_t id;
    _Atomic uint64_t queries; /* completed: producers and the main thread wait on it */
    uint64_t hits;
    uint64_t gone; /* matched slots forgotten meanwhile (remove_dp_rank) */
};

#define QCAP 64

static uint64_t reader_queries(const struct run *run, uint32_t i)
{
    return atomic_load_explicit(&run->rd[i].queries, memory_order_relaxed);
}

static void check_matches(struct reader *rd, const struct kvi_index *ix, const struct kvi_match *m, size_t n,
                          uint32_t len)
{
    if (n > NI * NRANK) {
        record_failure("reader: %zu gpu matches, at most %u slots exist", n, NI * NRANK);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i].depth < 1 || m[i].depth > len)
            record_failure("reader: depth %u for a query of %u blocks", m[i].depth, len);
        if (m[i].instance >= NI || m[i].dp_rank >= NRANK || m[i].slot == 0)
            record_failure("reader: match of unknown slot %u inst %u rank %u", m[i].slot, m[i].instance, m[i].dp_rank);
        for (size_t j = 0; j < i; j++)
            if (m[j].slot == m[i].slot || (m[j].instance == m[i].instance && m[j].dp_rank == m[i].dp_rank))
                record_failure("reader: duplicate match slot %u inst %u rank %u", m[i].slot, m[i].instance, m[i].dp_rank);
        struct kvi_slot_info si;
        int r = kvi_index_slot_info(ix, m[i].slot, &si);
        if (r == -ENOENT) {
            rd->gone++;
        } else if (r != 0 || si.tier != KVI_TIER_GPU || si.instance != m[i].instance || si.dp_rank != m[i].dp_rank) {
            record_failure("reader: slot %u is (inst %u rank %u tier %d), match says inst %u rank %u", m[i].slot, si.instance,
                 si.dp_rank, (int)si.tier, m[i].instance, m[i].dp_rank);
        }
    }
}

static void check_tiered(const struct kvi_tier_match *t, size_t n, uint32_t len)
{
    if (n > NI * NRANK) {
        record_failure("reader: %zu tiered results, at most %u (instance, rank) pairs", n, NI * NRANK);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!(t[i].gpu <= t[i].cpu && t[i].cpu <= t[i].disk && t[i].disk <= len && t[i].disk >= 1))
            record_failure("reader: tiered g %u c %u d %u for %u blocks", t[i].gpu, t[i].cpu, t[i].disk, len);
        if (t[i].instance >= NI || t[i].dp_rank >= NRANK)
            record_failure("reader: tiered result of unknown inst %u rank %u", t[i].instance, t[i].dp_rank);
        for (size_t j = 0; j < i; j++)
            if (t[j].instance == t[i].instance && t[j].dp_rank == t[i].dp_rank)
                record_failure("reader: duplicate tiered result inst %u rank %u", t[i].instance, t[i].dp_rank);
    }
}

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    const struct kvi_index *ix = rd->run->ix;
    kvi_rcu_register_thread();
    uint64_t rng = 0x1234567ull * (rd->id + 1);
    struct kvi_match m[QCAP];
    struct kvi_tier_match t[QCAP];
    while (!atomic_load_explicit(&rd->run->stop_readers, memory_order_acquire)) {
        uint64_t r = rng_next(&rng);
        uint32_t c = (uint32_t)(r % NCHAIN), len = 1 + (uint32_t)(r >> 8) % LEN;
        uint32_t mode = (uint32_t)(r >> 16) % 4;
        kvi_rcu_read_lock();
        if (mode < 2) {
            size_t n = kvi_index_find_matches(ix, g_content[c], len, m, QCAP);
            check_matches(rd, ix, m, KVI_MIN(n, (size_t)QCAP), len);
            rd->hits += n > 0;
        } else if (mode == 2) {
            size_t n = kvi_index_find_matches_by_seq(ix, g_seq[c], len, m, QCAP);
            check_matches(rd, ix, m, KVI_MIN(n, (size_t)QCAP), len);
            rd->hits += n > 0;
        } else {
            size_t n = kvi_index_find_tiered(ix, (r >> 24) & 1 ? g_content[c] : NULL, g_seq[c], len, t, QCAP);
            check_tiered(t, KVI_MIN(n, (size_t)QCAP), len);
        }
        kvi_rcu_read_unlock();
        uint64_t done = atomic_fetch_add_explicit(&rd->queries, 1, memory_order_relaxed) + 1;
        if (rd->run->reader_pause_us && done % 16 == 0)
            usleep(rd->run->reader_pause_us); /* leave the cpus to producers and writers */
    }
    kvi_rcu_unregister_thread();
    return NULL;
}

/* ---- final comparison ------------------------------------------------------------------ */

static size_t query(const struct kvi_index *ix, uint32_t c, uint32_t len, bool by_seq, struct qrow *out)
{
    struct kvi_match m[QCAP];
    kvi_rcu_read_lock();
    size_t n = by_seq ? kvi_index_find_matches_by_seq(ix, g_seq[c], len, m, QCAP)
                      : kvi_index_find_matches(ix, g_content[c], len, m, QCAP);
    kvi_rcu_read_unlock();
    assert_true(n <= QCAP);
    for (size_t i = 0; i < n; i++) {
        assert_true(m[i].depth >= 1 && m[i].depth <= len);
        assert_true(m[i].depth <= m[i].tree_size); /* quiescent: holdings are ancestor-closed */
        out[i] = (struct qrow){m[i].instance, m[i].dp_rank, m[i].depth, m[i].tree_size};
    }
    qsort(out, n, sizeof *out, qrow_cmp);
    return n;
}

static void compare_with_reference(struct run *run, struct kvi_index *ref)
{
    struct kvi_index *ix = run->ix;
    /* canonical snapshots: pooled index through its writers, reference directly */
    struct kvi_producer *p = kvi_producer_create(run->pool);
    assert_non_null(p);
    struct snap got = {0}, want = {0};
    kvi_producer_dump(p, ix, snap_emit, &got);
    for (uint32_t part = 0; part < kvi_index_n_parts(ref); part++)
        kvi_index_dump_partition(ref, part, snap_emit, &want);
    assert_no_failure();
    /* content hashes left out (row_cmp_identity): whether a block stored
     * without tokens knows its content depends on which producer's store
     * reached its entry first, an interleaving the reference cannot
     * reproduce; check_row checks every known content against the corpus */
    qsort(got.r, got.n, sizeof *got.r, row_cmp_identity);
    qsort(want.r, want.n, sizeof *want.r, row_cmp_identity);
    size_t i = 0;
    while (i < got.n && i < want.n && row_cmp_identity(&got.r[i], &want.r[i]) == 0)
        i++;
    if (i < got.n || i < want.n)
        fprintf(stderr, "snapshots differ: %zu rows vs %zu expected, first difference at row %zu\n", got.n, want.n,
                i);
    assert_int_equal(got.n, want.n);
    assert_int_equal(i, want.n);
    assert_true(want.n > 0);
    free(got.r);
    free(want.r);

    /* queries: every chain, every length, both key kinds */
    struct qrow a[QCAP], b[QCAP];
    uint64_t hits = 0;
    for (uint32_t c = 0; c < NCHAIN; c++)
        for (uint32_t len = 1; len <= LEN; len++)
            for (int by_seq = 0; by_seq < 2; by_seq++) {
                size_t na = query(ix, c, len, by_seq, a), nb = query(ref, c, len, by_seq, b);
                if (na != nb || memcmp(a, b, na * sizeof *a) != 0)
                    fprintf(stderr, "query chain %u len %u by_seq %d: %zu matches vs %zu expected\n", c, len, by_seq,
                            na, nb);
                assert_int_equal(na, nb);
                assert_memory_equal(a, b, na * sizeof *a);
                hits += na;
            }
    assert_true(hits > 0);

    struct kvi_index_stats sa, sb;
    kvi_index_stats(ix, &sa);
    kvi_index_stats(ref, &sb);
    assert_int_equal(sa.entries, sb.entries);
    assert_int_equal(sa.holdings, sb.holdings);
    assert_int_equal(sa.slots, sb.slots);
    assert_int_equal(sa.stored_blocks, sb.stored_blocks);
    assert_int_equal(sa.removed_blocks, sb.removed_blocks);
    assert_int_equal(sa.parent_not_found, sb.parent_not_found);
    assert_int_equal(sa.parent_elsewhere, sb.parent_elsewhere);
    assert_int_equal(sa.unknown_removes, sb.unknown_removes);
    assert_int_equal(sa.invalid_events, sb.invalid_events);
    assert_int_equal(sa.unknown_blocks, sb.unknown_blocks);
    for (uint32_t inst = 0; inst < NI; inst++)
        for (uint32_t rank = 0; rank < NRANK; rank++)
            assert_int_equal(kvi_index_tree_size(ix, inst, rank), kvi_index_tree_size(ref, inst, rank));

    kvi_producer_forget_index(p, ix);
    kvi_producer_destroy(p);
}

static struct kvi_index *index_new(void)
{
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = NWR, .jump = 8, .key_seed = 0x5eedfeed00000001ull};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    for (uint32_t i = 0; i < NI; i++)
        assert_int_equal(kvi_index_intern_instance(ix, 500 + i, NULL, false), (int64_t)i);
    return ix;
}

static void run_stress(uint32_t ring_cap, uint32_t run_ms, unsigned reader_pause_us, uint64_t seed)
{
    atomic_store(&g_fail, 0);
    struct run run = {.reader_pause_us = reader_pause_us};
    run.pool = kvi_writer_pool_create(NWR, ring_cap);
    assert_non_null(run.pool);
    run.ix = index_new();
    run.deadline_ns = kvi_now_ns() + (uint64_t)run_ms * 1000000u;
    struct reader rd[NREAD] = {0};
    run.rd = rd;
    for (uint32_t i = 0; i < NREAD; i++) {
        rd[i].run = &run;
        rd[i].id = i;
        assert_int_equal(pthread_create(&rd[i].t, NULL, reader_main, &rd[i]), 0);
    }
    for (uint32_t k = 0; k < NPROD; k++) {
        run.prod[k] = (struct prod){.run = &run, .id = k, .seed = mix64(seed + k)};
        assert_int_equal(pthread_create(&run.prod[k].t, NULL, producer_main, &run.prod[k]), 0);
    }
    uint64_t total = 0, calls = 0, dumps = 0;
    for (uint32_t k = 0; k < NPROD; k++) {
        assert_int_equal(pthread_join(run.prod[k].t, NULL), 0);
        total += run.prod[k].n_ops;
        calls += run.prod[k].calls;
        dumps += run.prod[k].dumps;
    }
    /* the producers flushed when they were destroyed: every reader queries
     * the final state before it stops (readers never block, so this waits
     * for the scheduler only) */
    uint64_t q0[NREAD];
    for (uint32_t i = 0; i < NREAD; i++)
        q0[i] = reader_queries(&run, i);
    while (!readers_went_on(&run, q0))
        sched_yield();
    atomic_store_explicit(&run.stop_readers, 1, memory_order_release);
    uint64_t queries = 0, gone = 0;
    for (uint32_t i = 0; i < NREAD; i++) {
        assert_int_equal(pthread_join(rd[i].t, NULL), 0);
        queries += atomic_load(&rd[i].queries);
        gone += rd[i].gone;
    }
    assert_no_failure();

    /* writer counters: every op applied, none lost, none still queued */
    struct kvi_writer_stats sum = {0};
    for (uint32_t w = 0; w < NWR; w++) {
        struct kvi_writer_stats st;
        kvi_writer_stats(run.pool, w, &st);
        assert_true(st.ops > 0); /* both writers were fed */
        sum.ops += st.ops;
        for (int o = 0; o < KVI_OUT_COUNT; o++)
            sum.outcomes[o] += st.outcomes[o];
        sum.queued += st.queued;
        sum.stalls += st.stalls;
        sum.sleeps += st.sleeps;
    }
    uint64_t dump_calls = dumps * NWR;
    assert_int_equal(sum.queued, 0);
    assert_int_equal(sum.ops, total + calls + dump_calls);

    /* replay the streams directly */
    struct kvi_index *ref = index_new();
    uint64_t out[KVI_OUT_COUNT] = {0};
    for (uint32_t k = 0; k < NPROD; k++) {
        uint64_t rng = run.prod[k].seed;
        for (uint64_t j = 0; j < run.prod[k].n_ops; j++) {
            struct kvi_op *op = gen_op(&rng, k, ref);
            uint64_t unknown = 0;
            out[apply_direct(ref, op, &unknown)]++;
            out[KVI_OUT_UNKNOWN_BLOCK] += unknown;
            kvi_op_free(op);
        }
    }
    assert_int_equal(sum.outcomes[KVI_OUT_APPLIED], out[KVI_OUT_APPLIED] + calls + dump_calls);
    assert_int_equal(sum.outcomes[KVI_OUT_PARENT_NOT_FOUND], out[KVI_OUT_PARENT_NOT_FOUND]);
    assert_int_equal(sum.outcomes[KVI_OUT_INVALID], out[KVI_OUT_INVALID]);
    assert_int_equal(sum.outcomes[KVI_OUT_UNKNOWN_BLOCK], out[KVI_OUT_UNKNOWN_BLOCK]);
    assert_true(out[KVI_OUT_UNKNOWN_BLOCK] > 0);
    assert_true(out[KVI_OUT_PARENT_NOT_FOUND] > 0);
    assert_true(out[KVI_OUT_INVALID] > 0);

    compare_with_reference(&run, ref);
    fprintf(stderr,
            "  ring %u: %llu ops (%llu calls, %llu dumps), %llu queries (%llu on forgotten slots), "
            "%llu stalls, %llu sleeps\n",
            ring_cap, (unsigned long long)total, (unsigned long long)calls, (unsigned long long)dumps,
            (unsigned long long)queries, (unsigned long long)gone, (unsigned long long)sum.stalls,
            (unsigned long long)sum.sleeps);

    kvi_writer_pool_destroy(run.pool);
    kvi_index_destroy(run.ix);
    kvi_index_destroy(ref);
}

static void test_stress_default_rings(void **state)
{
    run_stress(0, RUN_MS_DEFAULT, 0, 1);
}

/*
 * Rings of 4 ops: producers stall constantly (backpressure under load).
 * Readers pause now and then: with rings this small every hand-off between
 * a producer and its writer goes through sched_yield (and the writer's
 * idle-time grace period), and readers that never leave the cpu would cut
 * the run to a few thousand ops on a 2-cpu machine.
 */
static void test_stress_small_rings(void **state)
{
    run_stress(4, RUN_MS_SMALL, 100, 2);
}

int main(void)
{
    corpus_init();
    kvi_rcu_register_thread(); /* final queries run on this thread */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress_default_rings),
        cmocka_unit_test(test_stress_small_rings),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return r;
}
