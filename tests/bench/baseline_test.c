/* ctest-labels: unit -- bench/baseline_*.c, trace_replay.c: the baselines answer as kvidx does; replay accounting */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace.h"
#include "bench/trace_replay.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "rcu_group.h"

#define NB 3
static const char *const names[NB] = {"kvidx", "radix-lock", "naive-map"};

struct fx {
    struct kvi_trace_be *b[NB];
    struct kvi_bl_scratch s;
    struct kvi_bl_score out[NB][256];
    uint32_t n_workers;
};

static struct fx *fx_new(uint32_t n_workers)
{
    struct fx *f = calloc(1, sizeof *f);
    f->n_workers = n_workers;
    for (int i = 0; i < NB; i++) {
        const struct kvi_trace_backend *be = kvi_trace_backend_by_name(names[i]);
        assert_non_null(be);
        f->b[i] = kvi_trace_be_create(be, n_workers, 2, 16, 0, 42);
    }
    return f;
}

static void fx_free(struct fx *f)
{
    for (int i = 0; i < NB; i++)
        kvi_trace_be_destroy(f->b[i]);
    kvi_bl_scratch_free(&f->s);
    free(f);
}

/* Store on every backend; engine hashes are the content ids scrambled per
 * worker (opaque: workers name the same block differently). */
static uint64_t eh_of(uint32_t w, uint64_t c, uint32_t pos)
{
    return (c * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)w << 48) ^ ((uint64_t)pos << 40) ^ 0xabcdefull;
}

static void store(struct fx *f, uint32_t w, int parent_pos, const uint64_t *c, uint32_t first_pos, size_t n,
                  int want)
{
    uint64_t eh[64];
    for (size_t i = 0; i < n; i++)
        eh[i] = eh_of(w, c[i], first_pos + (uint32_t)i);
    /* the parent is named by its engine hash, derived from its content
     * c[-1] and its position parent_pos */
    struct kvi_trace_entry e = {.worker = w, .kind = KVI_TRACE_STORE, .n = (uint32_t)n, .engine_hash = eh, .content = c};
    if (parent_pos >= 0) {
        e.has_parent = true;
        e.parent = eh_of(w, c[-1], (uint32_t)parent_pos);
    }
    for (int i = 0; i < NB; i++) {
        int r = kvi_trace_be_apply(f->b[i], &e);
        assert_int_equal(r < 0 ? r : 0, want);
    }
}

static void removes(struct fx *f, uint32_t w, const uint64_t *c, uint32_t first_pos, size_t n)
{
    uint64_t eh[64];
    for (size_t i = 0; i < n; i++)
        eh[i] = eh_of(w, c[i], first_pos + (uint32_t)i);
    struct kvi_trace_entry e = {.worker = w, .kind = KVI_TRACE_REMOVE, .n = (uint32_t)n, .engine_hash = eh};
    for (int i = 0; i < NB; i++)
        assert_int_equal(kvi_trace_be_apply(f->b[i], &e), 0);
}

/* Query every backend; all must agree. @return the number of scores. */
static size_t query(struct fx *f, const uint64_t *c, size_t n)
{
    size_t k0 = 0;
    for (int i = 0; i < NB; i++) {
        size_t k = kvi_trace_be_scores(f->b[i], &f->s, c, n, f->out[i], 256);
        if (i == 0)
            k0 = k;
        if (k != k0)
            fail_msg("%s: %zu scores, kvidx %zu", names[i], k, k0);
        for (size_t j = 0; j < k && j < 256; j++)
            if (f->out[i][j].worker != f->out[0][j].worker || f->out[i][j].depth != f->out[0][j].depth)
                fail_msg("%s: score %zu is (%u, %u), kvidx (%u, %u)", names[i], j, f->out[i][j].worker,
                         f->out[i][j].depth, f->out[0][j].worker, f->out[0][j].depth);
    }
    return k0;
}

static uint32_t depth_of(struct fx *f, size_t k, uint32_t w)
{
    for (size_t j = 0; j < k; j++)
        if (f->out[0][j].worker == w)
            return f->out[0][j].depth;
    return 0;
}

/* index-semantics.md §6.5, on every backend. */
static void test_scenarios(void **state)
{
    (void)state;
    struct fx *f = fx_new(4);
    uint64_t a[] = {1, 2, 3}, q1[] = {1, 2, 999}, b[] = {1, 2}, b2[] = {1, 3};
    store(f, 0, -1, a, 0, 3, 0);
    size_t k = query(f, a, 3);
    assert_int_equal(k, 1);
    assert_int_equal(depth_of(f, k, 0), 3);
    k = query(f, q1, 3);
    assert_int_equal(depth_of(f, k, 0), 2);
    removes(f, 0, a, 0, 3);
    assert_int_equal(query(f, a, 3), 0);
    /* shared prefix */
    store(f, 0, -1, b, 0, 2, 0);
    store(f, 1, -1, b2, 0, 2, 0);
    k = query(f, b, 1);
    assert_int_equal(k, 2);
    assert_int_equal(depth_of(f, k, 0), 1);
    assert_int_equal(depth_of(f, k, 1), 1);
    k = query(f, b, 2);
    assert_int_equal(depth_of(f, k, 0), 2);
    assert_int_equal(depth_of(f, k, 1), 1);
    /* a run attached under a parent, by the parent's engine hash */
    uint64_t ext[] = {2, 7, 8}; /* ext[0] is the parent's content (position 1) */
    store(f, 0, 1, ext + 1, 2, 2, 0);
    uint64_t full[] = {1, 2, 7, 8};
    k = query(f, full, 4);
    assert_int_equal(depth_of(f, k, 0), 4);
    assert_int_equal(depth_of(f, k, 1), 1);
    /* idempotent re-store; unknown removes are no-ops */
    store(f, 0, 1, ext + 1, 2, 2, 0);
    uint64_t nothing[] = {555};
    removes(f, 0, nothing, 9, 1);
    removes(f, 3, nothing, 0, 1);
    k = query(f, full, 4);
    assert_int_equal(depth_of(f, k, 0), 4);
    /* unknown parent: rejected by every backend */
    uint64_t orphan[] = {40, 41};
    store(f, 2, 5, orphan + 1, 6, 1, -ENOENT);
    /* chunk collisions: identical blocks at several positions, and the same
     * block after another prefix, never count as the chain */
    uint64_t same[] = {5, 5, 5}, other[] = {7, 5};
    store(f, 2, -1, same, 0, 3, 0);
    store(f, 3, -1, other, 0, 2, 0);
    uint64_t q5[] = {5, 5, 5, 5};
    k = query(f, q5, 4);
    assert_int_equal(k, 1);
    assert_int_equal(depth_of(f, k, 2), 3);
    k = query(f, q5, 1);
    assert_int_equal(depth_of(f, k, 3), 0);
    /* removing the tail of one worker leaves the others alone */
    removes(f, 2, same + 2, 2, 1);
    k = query(f, q5, 4);
    assert_int_equal(depth_of(f, k, 2), 2);
    for (int i = 0; i < NB; i++)
        assert_int_equal(kvi_trace_be_rejected(f->b[i]), 1);
    fx_free(f);
}

/* Removing a whole chain leaf first, then re-storing part of it. */
static void test_leaf_first_removal(void **state)
{
    (void)state;
    struct fx *f = fx_new(2);
    uint64_t c[] = {11, 12, 13, 14, 15, 16};
    store(f, 0, -1, c, 0, 6, 0);
    store(f, 1, -1, c, 0, 4, 0);
    uint64_t rev[] = {16, 15, 14};
    uint64_t eh[3];
    for (int i = 0; i < 3; i++)
        eh[i] = eh_of(0, rev[i], 5 - (uint32_t)i);
    struct kvi_trace_entry e = {.worker = 0, .kind = KVI_TRACE_REMOVE, .n = 3, .engine_hash = eh};
    for (int i = 0; i < NB; i++)
        kvi_trace_be_apply(f->b[i], &e);
    size_t k = query(f, c, 6);
    assert_int_equal(k, 2);
    assert_int_equal(depth_of(f, k, 0), 3);
    assert_int_equal(depth_of(f, k, 1), 4);
    store(f, 0, 2, c + 3, 3, 1, 0); /* re-store block 3 (content 14) under block 2 */
    k = query(f, c, 6);
    assert_int_equal(depth_of(f, k, 0), 4);
    fx_free(f);
}

static void build(struct kvi_trace *t, struct kvi_trace_workload *w, size_t requests, uint32_t workers,
                  uint32_t block_size, uint32_t gpu_blocks, uint32_t dup)
{
    struct kvi_trace_synth_cfg sc;
    kvi_trace_synth_defaults(&sc);
    sc.requests = requests;
    sc.span_s = 900;
    kvi_trace_init(t);
    kvi_trace_synthesize(t, &sc);
    struct kvi_trace_workload_cfg c;
    kvi_trace_workload_defaults(&c);
    c.n_workers = workers;
    c.worker_dup = dup;
    c.block_size = block_size;
    c.gpu_blocks = gpu_blocks;
    assert_int_equal(kvi_trace_workload_build(w, t, &c, NULL, NULL), 0);
    assert_true(w->st.removes > 0);
}

/* The three backends give the same answer to every query of a mock-engine
 * timeline, applied in order, and hold the same blocks at the end. */
static void test_same_answers_on_timeline(void **state)
{
    (void)state;
    struct kvi_trace t;
    struct kvi_trace_workload w;
    build(&t, &w, 500, 12, 64, 192, 2);
    struct fx *f = fx_new(w.n_workers_total);
    uint64_t hits = 0, deep = 0;
    for (size_t i = 0; i < w.n; i++) {
        const struct kvi_trace_entry *e = &w.e[i];
        if (e->kind == KVI_TRACE_QUERY) {
            size_t k = query(f, e->content, e->n);
            hits += k > 0;
            for (size_t j = 0; j < k; j++)
                deep += f->out[0][j].depth > 8;
        } else {
            for (int b = 0; b < NB; b++)
                assert_int_equal(kvi_trace_be_apply(f->b[b], e), 0);
        }
    }
    assert_true(hits > w.st.queries / 2);
    assert_true(deep > 0);
    for (size_t r = 0; r < t.n_req; r++)
        if (w.req_blocks[r] > 0)
            query(f, w.req_content[r], w.req_blocks[r]);
    /* same holdings everywhere: what the events say the engines hold */
    uint64_t held = w.st.stored_blocks - w.st.removed_blocks;
    for (int b = 0; b < NB; b++)
        assert_int_equal(kvi_trace_be_holdings(f->b[b]), held);
    fx_free(f);
    kvi_trace_workload_free(&w);
    kvi_trace_free(&t);
}

/* Replays through lanes and writer threads: every op is issued and applied,
 * nothing is rejected, the counts add up, and the final state answers as a
 * sequential application does. */
struct final_check {
    const struct kvi_trace_workload *w;
    struct fx *ref;
    int checked;
};

static void inspect(void *ctx, struct kvi_trace_be *b)
{
    struct final_check *fc = ctx;
    struct kvi_bl_scratch s = {0};
    struct kvi_bl_score *out = malloc(fc->w->n_workers_total * sizeof *out);
    for (size_t r = 0; r < fc->w->trace->n_req; r++) {
        uint32_t n = fc->w->req_blocks[r];
        if (n == 0)
            continue;
        size_t k = kvi_trace_be_scores(b, &s, fc->w->req_content[r], n, out, fc->w->n_workers_total);
        size_t kr = kvi_trace_be_scores(fc->ref->b[1], &fc->ref->s, fc->w->req_content[r], n, fc->ref->out[1], 256);
        assert_int_equal(k, kr);
        for (size_t j = 0; j < k; j++) {
            assert_int_equal(out[j].worker, fc->ref->out[1][j].worker);
            assert_int_equal(out[j].depth, fc->ref->out[1][j].depth);
        }
    }
    free(out);
    kvi_bl_scratch_free(&s);
    fc->checked++;
}

static void test_replay(void **state)
{
    (void)state;
    struct kvi_trace t;
    struct kvi_trace_workload w;
    build(&t, &w, 300, 6, 128, 256, 1);
    struct fx *ref = fx_new(w.n_workers_total);
    for (size_t i = 0; i < w.n; i++)
        if (w.e[i].kind != KVI_TRACE_QUERY)
            kvi_trace_be_apply(ref->b[1], &w.e[i]);
    for (int i = 0; i < NB; i++) {
        struct final_check fc = {&w, ref, 0};
        struct kvi_trace_run_cfg cfg = {
            .window_ms = 300, .readers = 2, .writers = 2, .max_overrun = 50, .inspect = inspect, .ictx = &fc};
        struct kvi_trace_run_result r;
        assert_int_equal(kvi_trace_run(&w, kvi_trace_backend_by_name(names[i]), &cfg, &r), 0);
        assert_string_equal(r.backend, names[i]);
        assert_int_equal(fc.checked, 1);
        assert_int_equal(r.ops_total, w.n);
        assert_int_equal(r.ops_issued, w.n);
        assert_false(r.aborted);
        assert_int_equal(r.events_issued, w.st.stores + w.st.removes);
        assert_int_equal(r.queries_issued, w.st.queries);
        assert_int_equal(r.block_ops_total, w.st.query_blocks + w.st.stored_blocks + w.st.removed_blocks);
        assert_int_equal(r.block_ops_issued, r.block_ops_total);
        assert_int_equal(r.rejected, 0);
        assert_true(r.backlog_events <= r.events_total);
        assert_true(r.elapsed_ms >= r.issue_end_ms);
        assert_true(r.issue_end_ms >= 0.9 * 300);
        assert_true(r.find.p50 > 0 && r.find.p50 <= r.find.p99 && r.find.p99 <= r.find.max);
        assert_int_equal(r.threads, 4);
        assert_true(r.offered_block_ops_per_s > 0);
        assert_true(r.hit_queries > 0);
        assert_true(r.valid == (r.issue_ok && !r.aborted && r.backlog_pct <= 5.0));
        assert_true(r.keep_up == (r.elapsed_ms <= 1.10 * 300));
    }
    fx_free(ref);
    /* the serial replay runs every entry once, on one thread */
    for (int i = 0; i < NB; i++) {
        struct kvi_trace_serial_result sr;
        assert_int_equal(kvi_trace_serial(&w, kvi_trace_backend_by_name(names[i]), 0, 7, &sr), 0);
        assert_string_equal(sr.backend, names[i]);
        assert_int_equal(sr.queries, w.st.queries);
        assert_int_equal(sr.events, w.st.stores + w.st.removes);
        assert_int_equal(sr.event_blocks, w.st.stored_blocks + w.st.removed_blocks);
        assert_int_equal(sr.rejected, 0);
        assert_true(sr.hit_queries > 0 && sr.hit_queries <= sr.queries);
        assert_true(sr.first.p50 > 0 && sr.first.p50 <= sr.first.p99 && sr.first.p99 <= sr.first.max);
        assert_true(sr.again.p50 > 0 && sr.again.p50 <= sr.again.p99 && sr.again.p99 <= sr.again.max);
        assert_true(sr.apply_ns_per_block > 0);
    }
    /* a bad configuration is refused */
    struct kvi_trace_run_cfg bad = {.window_ms = 0, .readers = 1, .writers = 1, .max_overrun = 3};
    struct kvi_trace_run_result r;
    assert_int_equal(kvi_trace_run(&w, kvi_trace_backend_by_name("kvidx"), &bad, &r), -EINVAL);
    assert_null(kvi_trace_backend_by_name("nope"));
    kvi_trace_workload_free(&w);
    kvi_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scenarios),
        cmocka_unit_test(test_leaf_first_removal),
        cmocka_unit_test(test_same_answers_on_timeline),
        cmocka_unit_test(test_replay),
    };
    return cmocka_run_group_tests(tests, kvi_test_rcu_setup, kvi_test_rcu_teardown);
}
