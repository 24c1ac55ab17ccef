/* ctest-labels: stress -- engine/index.c: two partition writers and two RCU readers, then a model comparison */
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

#include "engine/common.h"
#include "engine/hash.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "index_model.h"

/*
 * DESIGN
 *   n_parts = 2. Each partition has one writer thread (the single-writer
 *   contract: it mutates only instances whose kvi_index_partition_of is its
 *   partition) and keeps its own model (index_model.h) of its partition.
 *
 *   Writer p first stores the "stable" chains of instance p (rank 0: whole
 *   documents, rank 1: half documents), never touched again, then churns the
 *   other instances of its partition with the seeded workload of
 *   index_model.h (stores, some through store_seq or placed by position,
 *   mid-chain removes, renames, clears, remove_dp_rank, remove_instance;
 *   not the semantic corner cases, which index_diff_test covers) over the
 *   same documents, so the churn shares the stable chains' prefixes. It checks every return code against
 *   its model, logs every op, calls kvi_index_reclaim periodically, and, as a
 *   registered reader itself, runs queries whose results restricted to its own
 *   partition must equal its model exactly (the other partition keeps changing
 *   meanwhile), and dumps its partition (a consistent snapshot: it is the
 *   only mutator) against its model.
 *
 *   Halfway through, writer 0 places two cpu blocks by position and seq hash
 *   (store_seq without parent) on an instance nothing else touches: from then
 *   on content queries go through the seq table (index.c: has_seq_only), so
 *   readers cross that switch and both query paths run under churn. (Other
 *   placements are left to index_diff_test: how removals treat blocks placed
 *   below held ones is a semantic question, not a concurrency one.)
 *
 *   Two reader threads query without pause, each query in its own read-side
 *   section, by content and by seq, and check what must hold under any
 *   interleaving: 1 <= depth <= query length; every slot a gpu slot of a known
 *   instance (slot_info agrees when the slot is still live); no slot twice;
 *   and every stable slot present with its exact depth and tree size. (tree
 *   size >= depth is not guaranteed for churning slots and is not checked.)
 *
 *   After the writers stop, the main thread replays both logs into one fresh
 *   model (partitions are independent) and requires exact equality of return
 *   codes, query results, the canonical dump and the stats counters.
 *
 *   Threads record failures; cmocka asserts run on the main thread only.
 */

#define N_PARTS 2u
#define N_INST 48u
#define PLACER_INST 2u /* partition 0: only the mid-run store_seq placement */
#define N_RANKS 2u
#define N_DOCS 40u
#define STABLE_DOCS 10u
#define QMAX 256u
#define MATCH_CAP 512u
#define MAX_NOTES 6

#ifdef KVI_TSAN
#define CHURN_NS 10000000000ull /* TSan: 10 s, and at most */
#define MAX_OPS 60000u         /* ops per writer */
#else
#define CHURN_NS 5000000000ull
#define MAX_OPS 600000u
#endif

struct squery {
    uint32_t n;
    uint64_t q[QMAX], seq[QMAX];
    const char *kind;
    uint32_t n_stable;
    struct kvi_match stable[2 * N_RANKS]; /* expected stable slots: instance, rank, depth, tree size */
};

struct shared {
    struct kvi_index *ix;
    struct kw_corpus corp;
    struct squery *qs;
    uint32_t n_qs;
    struct kw_op *stable_ops[N_PARTS];
    uint32_t n_stable_ops[N_PARTS], cap_stable_ops[N_PARTS];
    _Atomic uint32_t writers_ready;
    _Atomic bool stop_readers;
    uint64_t deadline;
};

struct notes {
    uint64_t count;
    char text[MAX_NOTES][400];
};

static void note(struct notes *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct notes *n, const char *fmt, ...)
{
    if (n->count < MAX_NOTES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(n->text[n->count], sizeof n->text[0], fmt, ap);
        va_end(ap);
    }
    n->count++;
}

struct writer {
    pthread_t t;
    struct shared *sh;
    uint32_t part;
    uint32_t inst[N_INST];
    uint32_t n_inst;
    struct km_model m;
    struct kw_gen g;
    struct kw_op *log;
    uint32_t n_log, cap_log;
    uint64_t n_queries, n_dumps, n_reclaims;
    uint32_t placed_at; /* op number of the mid-run placement (writer 0) */
    struct notes bad;
};

struct reader {
    pthread_t t;
    struct shared *sh;
    uint32_t id;
    uint64_t n_queries, n_matches, n_stable;
    uint64_t v_depth, v_slot, v_dup, v_stable_missing, v_stable_depth, v_stable_tree;
    struct notes bad;
};

static void log_op(struct writer *w, const struct kw_op *op)
{
    w->log = km_grow(w->log, sizeof *w->log, &w->cap_log, w->n_log + 1);
    kw_op_copy(&w->log[w->n_log++], op);
}

/* ---- writer-side exact checks --------------------------------------------------- */

static void writer_query(struct writer *w, const uint64_t *q, uint32_t n, const char *kind)
{
    static _Thread_local struct kvi_match got[MATCH_CAP], exp[MATCH_CAP], mine[MATCH_CAP];
    static _Thread_local uint64_t seq[QMAX];
    kvi_seq_hashes(q, n, seq);
    size_t ne = km_match(&w->m, q, n, exp); /* this model holds this partition only */
    for (int by_seq = 0; by_seq < 2; by_seq++) {
        kvi_rcu_read_lock();
        size_t ng = by_seq ? kvi_index_find_matches_by_seq(w->sh->ix, seq, n, got, MATCH_CAP)
                           : kvi_index_find_matches(w->sh->ix, q, n, got, MATCH_CAP);
        kvi_rcu_read_unlock();
        w->n_queries++;
        size_t nm = 0;
        for (size_t i = 0; i < ng && i < MATCH_CAP; i++)
            if (kvi_index_partition_of(w->sh->ix, got[i].instance) == w->part)
                mine[nm++] = got[i];
        if (nm > 1)
            qsort(mine, nm, sizeof *mine, km_cmp_match);
        bool same = nm == ne;
        for (size_t i = 0; i < nm && same; i++)
            same = mine[i].instance == exp[i].instance && mine[i].dp_rank == exp[i].dp_rank &&
                   mine[i].depth == exp[i].depth && mine[i].tree_size == exp[i].tree_size;
        if (same)
            continue;
        char a[160] = "", b[160] = "";
        for (size_t i = 0, o = 0; i < nm && o < sizeof a - 24; i++)
            o += (size_t)snprintf(a + o, sizeof a - o, " i%u/r%u/d%u/t%u", mine[i].instance, mine[i].dp_rank,
                                  mine[i].depth, mine[i].tree_size);
        for (size_t i = 0, o = 0; i < ne && o < sizeof b - 24; i++)
            o += (size_t)snprintf(b + o, sizeof b - o, " i%u/r%u/d%u/t%u", exp[i].instance, exp[i].dp_rank,
                                  exp[i].depth, exp[i].tree_size);
        note(&w->bad, "writer %u after op %u: %s query (%s, %u blocks), own partition: index {%s } model {%s }",
             w->part, w->n_log, by_seq ? "by-seq" : "content", kind, n, a, b);
    }
}

struct dump_ctx {
    struct kd_set *set;
};

static void dump_collect(void *arg, const struct kvi_dump_block *b)
{
    kd_push(((struct dump_ctx *)arg)->set, b);
}

static void writer_dump(struct writer *w)
{
    struct kd_set got = {0}, exp = {0};
    struct dump_ctx c = {&got};
    kvi_index_dump_partition(w->sh->ix, w->part, dump_collect, &c);
    km_dump(&w->m, &exp);
    kd_sort(&got);
    kd_sort(&exp);
    w->n_dumps++;
    bool same = got.n == exp.n;
    for (uint32_t i = 0; i < got.n && same; i++)
        same = kd_cmp(&got.r[i], &exp.r[i]) == 0;
    if (!same)
        note(&w->bad, "writer %u after op %u: dump of its partition: %u records, model %u (or contents differ)",
             w->part, w->n_log, got.n, exp.n);
    kd_free(&got);
    kd_free(&exp);
}

/* Writer 0, halfway: place two blocks of a long doc on PLACER_INST's cpu tier
 * by position and seq hash alone. */
static void writer_place(struct writer *w)
{
    struct shared *sh = w->sh;
    const struct kw_doc *d = &sh->corp.d[sh->corp.n - 1];
    uint32_t pos = d->len / 2, cur = KM_ROOT;
    uint64_t above[QMAX], seq[2];
    struct kvi_block b[2];
    for (uint32_t i = 0; i < pos + 2; i++) {
        if (i < pos)
            above[i] = d->content[i];
        cur = km_intern(&w->m, cur, d->content[i]);
        if (i >= pos) {
            b[i - pos] = (struct kvi_block){kw_name(&w->m, PLACER_INST, 0, cur), d->content[i]};
            seq[i - pos] = w->m.pf[cur].seq;
        }
    }
    struct kw_op op = {.kind = KW_STORE, .why = "placed", .inst = PLACER_INST, .rank = 0, .tier = KVI_TIER_CPU,
                       .n = 2, .b = b, .seq = seq, .position = pos, .above = above};
    long want = kw_apply_model(&w->m, &op);
    op.rc = kw_apply_index(sh->ix, &op);
    if (op.rc != want || want != 0)
        note(&w->bad, "writer %u: mid-run placement returned %ld, model %ld", w->part, op.rc, want);
    w->placed_at = w->n_log;
    log_op(w, &op);
}

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    struct shared *sh = w->sh;
    kvi_rcu_register_thread();
    struct kr_rng rng = {kvi_fmix64(0x5eed + w->part)};
    /* the stable chains first */
    for (uint32_t i = 0; i < sh->n_stable_ops[w->part]; i++) {
        struct kw_op op = sh->stable_ops[w->part][i];
        long want = kw_apply_model(&w->m, &op);
        op.rc = kw_apply_index(sh->ix, &op);
        if (op.rc != want)
            note(&w->bad, "writer %u: stable store %u returned %ld, model %ld", w->part, i, op.rc, want);
        log_op(w, &op);
    }
    atomic_fetch_add(&sh->writers_ready, 1);
    uint64_t i = 0, mid = sh->deadline - CHURN_NS / 2;
    bool placed = w->part != 0;
    while (w->n_log < MAX_OPS && (i & 63 || kvi_now_ns() < sh->deadline)) {
        if (!placed && (i & 63) == 0 && (kvi_now_ns() >= mid || w->n_log >= MAX_OPS / 2)) {
            writer_place(w);
            placed = true;
        }
        struct kw_op op;
        long want;
        kw_gen_next(&w->g, &w->m, &op);
        want = kw_apply_model(&w->m, &op);
        op.rc = kw_apply_index(sh->ix, &op);
        if (op.rc != want && w->bad.count < MAX_NOTES) {
            char buf[300];
            FILE *f = fmemopen(buf, sizeof buf, "w");
            if (f != NULL) {
                kw_op_print(f, &op);
                fclose(f);
            } else {
                buf[0] = 0;
            }
            note(&w->bad, "writer %u op %u returned %ld, model %ld: %s", w->part, w->n_log, op.rc, want, buf);
        }
        log_op(w, &op);
        if (op.kind == KW_STORE && op.rc == 0)
            kw_gen_remember(&w->g, &op);
        i++;
        if (i % 64 == 0) {
            kvi_index_reclaim(sh->ix, w->part);
            w->n_reclaims++;
        }
        if (i % 97 == 0) {
            const struct squery *sq = &sh->qs[kr_below(&rng, sh->n_qs)];
            writer_query(w, sq->q, sq->n, sq->kind);
        }
        if (i % 4099 == 0)
            writer_dump(w);
    }
    writer_dump(w);
    kvi_index_reclaim(sh->ix, w->part);
    kvi_rcu_unregister_thread();
    return NULL;
}

/* ---- readers ------------------------------------------------------------------ */

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    struct shared *sh = r->sh;
    struct kvi_match got[MATCH_CAP];
    struct kr_rng rng = {kvi_fmix64(0xabcdef + r->id)};
    kvi_rcu_register_thread();
    while (!atomic_load_explicit(&sh->stop_readers, memory_order_relaxed)) {
        uint32_t k = kr_below(&rng, sh->n_qs);
        const struct squery *sq = &sh->qs[k];
        bool by_seq = kr_chance(&rng, 500);
        kvi_rcu_read_lock();
        size_t ng = by_seq ? kvi_index_find_matches_by_seq(sh->ix, sq->seq, sq->n, got, MATCH_CAP)
                           : kvi_index_find_matches(sh->ix, sq->q, sq->n, got, MATCH_CAP);
        size_t have = ng < MATCH_CAP ? ng : MATCH_CAP;
        const char *how = by_seq ? "by-seq" : "content";
        for (size_t i = 0; i < have; i++) {
            const struct kvi_match *m = &got[i];
            if (m->depth < 1 || m->depth > sq->n) {
                r->v_depth++;
                note(&r->bad, "reader %u: %s query %u (%s, %u blocks): slot %u i%u r%u depth %u", r->id, how, k,
                     sq->kind, sq->n, m->slot, m->instance, m->dp_rank, m->depth);
            }
            struct kvi_slot_info si;
            int rc = kvi_index_slot_info(sh->ix, m->slot, &si);
            if (m->instance >= N_INST || m->dp_rank >= N_RANKS ||
                (rc == 0 && (si.tier != KVI_TIER_GPU || si.instance != m->instance || si.dp_rank != m->dp_rank)) ||
                (rc != 0 && rc != -ENOENT)) {
                r->v_slot++;
                note(&r->bad, "reader %u: %s query %u: slot %u reported as i%u r%u, slot_info rc %d i%u r%u %s",
                     r->id, how, k, m->slot, m->instance, m->dp_rank, rc, rc ? 0 : si.instance,
                     rc ? 0 : si.dp_rank, rc ? "-" : kvi_tier_name(si.tier));
            }
            for (size_t j = 0; j < i; j++)
                if (got[j].slot == m->slot) {
                    r->v_dup++;
                    note(&r->bad, "reader %u: %s query %u: slot %u twice", r->id, how, k, m->slot);
                }
        }
        kvi_rcu_read_unlock();
        r->n_queries++;
        r->n_matches += have;
        for (uint32_t e = 0; e < sq->n_stable; e++) {
            const struct kvi_match *x = &sq->stable[e];
            const struct kvi_match *m = NULL;
            for (size_t i = 0; i < have && m == NULL; i++)
                if (got[i].instance == x->instance && got[i].dp_rank == x->dp_rank)
                    m = &got[i];
            r->n_stable++;
            if (m == NULL) {
                r->v_stable_missing++;
                note(&r->bad, "reader %u: %s query %u (%s, %u blocks): stable i%u r%u (depth %u) missing", r->id,
                     how, k, sq->kind, sq->n, x->instance, x->dp_rank, x->depth);
            } else if (m->depth != x->depth) {
                r->v_stable_depth++;
                note(&r->bad, "reader %u: %s query %u (%s, %u blocks): stable i%u r%u depth %u, expected %u", r->id,
                     how, k, sq->kind, sq->n, x->instance, x->dp_rank, m->depth, x->depth);
            } else if (m->tree_size != x->tree_size) {
                r->v_stable_tree++;
                note(&r->bad, "reader %u: %s query %u: stable i%u r%u tree size %u, expected %u", r->id, how, k,
                     x->instance, x->dp_rank, m->tree_size, x->tree_size);
            }
        }
    }
    kvi_rcu_unregister_thread();
    return NULL;
}

/* ---- setup ------------------------------------------------------------------ */

/* Stable chains of instance `inst`: STABLE_DOCS docs on rank 0 (whole) and
 * rank 1 (first half), each stored as a few chained runs. */
static void build_stable(struct shared *sh, struct km_model *em, uint32_t inst, struct kr_rng *rng)
{
    uint32_t part = kvi_index_partition_of(sh->ix, inst);
    for (uint32_t k = 0; k < STABLE_DOCS; k++) {
        /* instance p: docs p, p + 2, ... and two of the long docs at the end */
        uint32_t di = k < STABLE_DOCS - 2 ? 2 * k + inst : N_DOCS - 4 + 2 * (k - (STABLE_DOCS - 2)) + inst;
        const struct kw_doc *d = &sh->corp.d[di];
        for (uint32_t rank = 0; rank < N_RANKS; rank++) {
            uint32_t len = rank == 0 ? d->len : (d->len + 1) / 2, at = 0, cur = KM_ROOT;
            uint64_t peh = 0;
            while (at < len) {
                uint32_t run = 1 + kr_below(rng, KVI_MIN(len - at, 40u));
                struct kw_op op = {.kind = KW_STORE, .why = "stable", .inst = inst, .rank = rank,
                                   .tier = KVI_TIER_GPU, .has_parent = at > 0, .peh = peh, .n = run};
                op.b = km_alloc(run * sizeof *op.b);
                for (uint32_t i = 0; i < run; i++) {
                    cur = km_intern(em, cur, d->content[at + i]);
                    op.b[i] = (struct kvi_block){kw_name(em, inst, rank, cur), d->content[at + i]};
                }
                peh = op.b[run - 1].engine_hash;
                long rc = kw_apply_model(em, &op);
                assert_int_equal(rc, 0);
                sh->stable_ops[part] = km_grow(sh->stable_ops[part], sizeof(struct kw_op), &sh->cap_stable_ops[part],
                                               sh->n_stable_ops[part] + 1);
                sh->stable_ops[part][sh->n_stable_ops[part]++] = op;
                at += run;
            }
        }
    }
}

static void add_query(struct shared *sh, const struct km_model *em, const uint64_t *q, uint32_t n, const char *kind)
{
    struct squery *s = &sh->qs[sh->n_qs++];
    s->n = n;
    s->kind = kind;
    memcpy(s->q, q, n * sizeof *q);
    kvi_seq_hashes(q, n, s->seq);
    struct kvi_match exp[MATCH_CAP];
    size_t ne = km_match(em, q, n, exp);
    assert_true(ne <= KVI_ARRAY_LEN(s->stable));
    memcpy(s->stable, exp, ne * sizeof *exp);
    s->n_stable = (uint32_t)ne;
}

/* Queries over every doc: whole, prefixes, extended past the end, diverging. */
static void build_queries(struct shared *sh, const struct km_model *em, struct kr_rng *rng)
{
    sh->qs = km_alloc(N_DOCS * 6 * sizeof *sh->qs);
    uint64_t q[QMAX];
    for (uint32_t k = 0; k < sh->corp.n; k++) {
        const struct kw_doc *d = &sh->corp.d[k];
        uint32_t n = KVI_MIN(d->len, QMAX - 8);
        memcpy(q, d->content, n * sizeof *q);
        add_query(sh, em, q, n, "whole doc");
        uint32_t cut = 1 + kr_below(rng, n);
        add_query(sh, em, q, cut, "doc prefix");
        uint32_t half = (n + 1) / 2 + kr_below(rng, 3);
        add_query(sh, em, q, half > n ? n : half, "around the rank-1 half");
        uint32_t ext = n;
        for (uint32_t e = 1 + kr_below(rng, 6); e > 0; e--)
            q[ext++] = kw_content(&sh->corp, kw_token(rng), d->lora);
        add_query(sh, em, q, ext, "doc extended");
        memcpy(q, d->content, n * sizeof *q);
        uint32_t at = kr_below(rng, n);
        q[at] = kw_content(&sh->corp, 3 + kr_below(rng, 7), (d->lora + 1) % KW_LORAS);
        add_query(sh, em, q, n, "doc diverging");
    }
}

/* ---- the test ------------------------------------------------------------------ */

static int cmp_match_sort(const void *a, const void *b)
{
    return km_cmp_match(a, b);
}

static void test_stress(void **state)
{
    (void)state;
    static struct shared sh;
    memset(&sh, 0, sizeof sh);
    struct kvi_index_config cfg = {.block_size = 16, .n_parts = N_PARTS, .jump = 0, .key_seed = 0x5712e55};
    sh.ix = kvi_index_create(&cfg);
    assert_non_null(sh.ix);
    kvi_index_set_jump(sh.ix, 8);
    for (uint32_t i = 0; i < N_INST; i++)
        assert_int_equal(kvi_index_intern_instance(sh.ix, 1000 + i * 13, NULL, false), (int64_t)i);
    kw_corpus_build(&sh.corp, 0xd0c5, N_DOCS, 60, 4, 90);
    struct kr_rng rng = {0x57ab1e};

    /* stable chains (instance p belongs to partition p) and their expected answers */
    struct km_model em;
    km_init(&em, N_INST);
    for (uint32_t p = 0; p < N_PARTS; p++) {
        assert_int_equal(kvi_index_partition_of(sh.ix, p), p);
        build_stable(&sh, &em, p, &rng);
    }
    build_queries(&sh, &em, &rng);
    km_free(&em);

    static struct writer w[N_PARTS];
    static struct reader r[2];
    memset(w, 0, sizeof w);
    memset(r, 0, sizeof r);
    for (uint32_t p = 0; p < N_PARTS; p++) {
        w[p].sh = &sh;
        w[p].part = p;
        for (uint32_t i = N_PARTS; i < N_INST; i++)
            if (kvi_index_partition_of(sh.ix, i) == p && i != PLACER_INST)
                w[p].inst[w[p].n_inst++] = i;
        km_init(&w[p].m, N_INST);
        kw_gen_init(&w[p].g, kvi_fmix64(0x77 + p), &sh.corp, w[p].inst, w[p].n_inst, N_RANKS, N_INST);
        w[p].g.corners = false; /* semantic corner cases are index_diff_test's: keep this one about concurrency */
        w[p].g.placements = false;
    }
    uint64_t t0 = kvi_now_ns();
    sh.deadline = t0 + CHURN_NS;
    for (uint32_t p = 0; p < N_PARTS; p++)
        assert_int_equal(pthread_create(&w[p].t, NULL, writer_main, &w[p]), 0);
    while (atomic_load(&sh.writers_ready) < N_PARTS)
        sched_yield();
    for (uint32_t i = 0; i < 2; i++) {
        r[i].sh = &sh;
        r[i].id = i;
        assert_int_equal(pthread_create(&r[i].t, NULL, reader_main, &r[i]), 0);
    }
    for (uint32_t p = 0; p < N_PARTS; p++)
        assert_int_equal(pthread_join(w[p].t, NULL), 0);
    atomic_store(&sh.stop_readers, true);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(pthread_join(r[i].t, NULL), 0);
    double churn_s = (double)(kvi_now_ns() - t0) / 1e9;

    /* ---- report what the threads saw ---- */
    uint64_t bad = 0;
    for (uint32_t p = 0; p < N_PARTS; p++) {
        printf("  writer %u: %u ops, %" PRIu64 " own-partition queries, %" PRIu64 " dumps, %" PRIu64
               " reclaims, %" PRIu64 " problems",
               p, w[p].n_log, w[p].n_queries, w[p].n_dumps, w[p].n_reclaims, w[p].bad.count);
        if (p == 0)
            printf("; store_seq placement (content queries switch to the seq table) at op %u", w[p].placed_at);
        printf("\n");
        for (uint64_t i = 0; i < w[p].bad.count && i < MAX_NOTES; i++)
            printf("    %s\n", w[p].bad.text[i]);
        bad += w[p].bad.count;
    }
    for (uint32_t i = 0; i < 2; i++) {
        printf("  reader %u: %" PRIu64 " queries, %" PRIu64 " matches, %" PRIu64 " stable checks; violations: depth %"
               PRIu64 ", slot %" PRIu64 ", duplicate %" PRIu64 ", stable missing %" PRIu64 ", stable depth %" PRIu64
               ", stable tree size %" PRIu64 "\n",
               i, r[i].n_queries, r[i].n_matches, r[i].n_stable, r[i].v_depth, r[i].v_slot, r[i].v_dup,
               r[i].v_stable_missing, r[i].v_stable_depth, r[i].v_stable_tree);
        for (uint64_t k = 0; k < r[i].bad.count && k < MAX_NOTES; k++)
            printf("    %s\n", r[i].bad.text[k]);
        bad += r[i].bad.count;
    }
    printf("  churn %.2f s\n", churn_s);

    /* ---- quiescent comparison: replay both logs into one model ---- */
    kvi_rcu_register_thread();
    struct km_model fm;
    km_init(&fm, N_INST);
    uint64_t rc_diff = 0;
    for (uint32_t p = 0; p < N_PARTS; p++)
        for (uint32_t i = 0; i < w[p].n_log; i++) {
            long want = kw_apply_model(&fm, &w[p].log[i]);
            if (want != w[p].log[i].rc && rc_diff++ == 0) {
                printf("  replay: writer %u op %u: index returned %ld, model %ld: ", p, i, w[p].log[i].rc, want);
                kw_op_print(stdout, &w[p].log[i]);
            }
        }
    bad += rc_diff;

    uint64_t q_diff = 0, n_final = 0;
    struct kvi_match got[MATCH_CAP], exp[MATCH_CAP];
    for (uint32_t round = 0; round < 2; round++)
        for (uint32_t k = 0; k < sh.n_qs; k++) {
            const struct squery *sq = &sh.qs[k];
            size_t ne = km_match(&fm, sq->q, sq->n, exp);
            kvi_rcu_read_lock();
            size_t ng = round ? kvi_index_find_matches_by_seq(sh.ix, sq->seq, sq->n, got, MATCH_CAP)
                              : kvi_index_find_matches(sh.ix, sq->q, sq->n, got, MATCH_CAP);
            kvi_rcu_read_unlock();
            n_final++;
            if (ng > 1)
                qsort(got, ng, sizeof *got, cmp_match_sort);
            bool same = ng == ne;
            for (size_t i = 0; i < ng && same; i++)
                same = got[i].instance == exp[i].instance && got[i].dp_rank == exp[i].dp_rank &&
                       got[i].depth == exp[i].depth && got[i].tree_size == exp[i].tree_size;
            if (!same && q_diff++ < 4) {
                printf("  final %s query %u (%s, %u blocks): index %zu matches, model %zu\n",
                       round ? "by-seq" : "content", k, sq->kind, sq->n, ng, ne);
                for (size_t i = 0; i < ng || i < ne; i++) {
                    if (i < ng)
                        printf("    index i%u r%u d%u t%u", got[i].instance, got[i].dp_rank, got[i].depth,
                               got[i].tree_size);
                    else
                        printf("    index -");
                    if (i < ne)
                        printf("   model i%u r%u d%u t%u\n", exp[i].instance, exp[i].dp_rank, exp[i].depth,
                               exp[i].tree_size);
                    else
                        printf("   model -\n");
                }
            }
        }
    bad += q_diff;

    struct kd_set dg = {0}, de = {0};
    struct dump_ctx c = {&dg};
    for (uint32_t p = 0; p < N_PARTS; p++)
        kvi_index_dump_partition(sh.ix, p, dump_collect, &c);
    km_dump(&fm, &de);
    kd_sort(&dg);
    kd_sort(&de);
    uint64_t d_diff = dg.n != de.n;
    for (uint32_t i = 0; i < dg.n && i < de.n; i++)
        if (kd_cmp(&dg.r[i], &de.r[i]) != 0 && d_diff++ < 3) {
            kd_print_rec(stdout, "index", &dg.r[i]);
            kd_print_rec(stdout, "model", &de.r[i]);
        }
    bad += d_diff;

    struct kvi_index_stats st;
    kvi_index_stats(sh.ix, &st);
    bool st_ok = st.holdings == fm.st.holdings && st.slots == fm.st.slots &&
                 st.stored_blocks == fm.st.stored_blocks && st.removed_blocks == fm.st.removed_blocks;
    printf("  final: %" PRIu64 " queries (%" PRIu64 " differ), dump %u records (model %u, %" PRIu64
           " differ), %" PRIu64 " return codes differ; holdings %" PRIu64 "/%" PRIu64 ", slots %" PRIu64 "/%" PRIu64
           "\n",
           n_final, q_diff, dg.n, de.n, d_diff, rc_diff, st.holdings, fm.st.holdings, st.slots, fm.st.slots);
    bad += !st_ok;

    /* ---- free everything ---- */
    kd_free(&dg);
    kd_free(&de);
    km_free(&fm);
    for (uint32_t p = 0; p < N_PARTS; p++) {
        for (uint32_t i = 0; i < w[p].n_log; i++)
            kw_op_free(&w[p].log[i]);
        free(w[p].log);
        km_free(&w[p].m);
        kw_gen_free(&w[p].g);
        for (uint32_t i = 0; i < sh.n_stable_ops[p]; i++)
            free(sh.stable_ops[p][i].b);
        free(sh.stable_ops[p]);
    }
    kvi_rcu_unregister_thread();
    kvi_index_destroy(sh.ix);
    free(sh.qs);
    kw_corpus_free(&sh.corp);
    if (bad)
        fail_msg("%" PRIu64 " problems (details above)", bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
