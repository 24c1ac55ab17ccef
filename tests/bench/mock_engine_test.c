/* ctest-labels: unit -- bench/mock_engine.{h,c}: prefix caching, LRU eviction of free blocks, opaque hashes */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/mock_engine.h"
#include "bench/trace_map.h"
#include "engine/hash.h"

#define BS 4 /* tokens per block */

struct ev {
    double t;
    enum kvi_mock_event_kind kind;
    bool has_parent;
    uint64_t parent, tag;
    uint32_t n, pos;
    uint64_t eh[64], c[64];
};

struct log {
    struct ev ev[256];
    size_t n;
};

static void record(void *ctx, const struct kvi_mock_event *e)
{
    struct log *l = ctx;
    assert_true(l->n < 256);
    assert_true(e->n <= 64);
    struct ev *x = &l->ev[l->n++];
    memset(x, 0, sizeof *x);
    x->t = e->t_ms;
    x->kind = e->kind;
    x->has_parent = e->has_parent;
    x->parent = e->parent;
    x->tag = e->tag;
    x->n = e->n;
    x->pos = e->pos;
    memcpy(x->eh, e->engine_hash, e->n * sizeof *x->eh);
    if (e->content)
        memcpy(x->c, e->content, e->n * sizeof *x->c);
    if (l->n > 1)
        assert_true(e->t_ms >= l->ev[l->n - 2].t);
}

/* An engine: 1 token/ms prefill, 1 ms per output token. */
static struct kvi_mock_engine *engine(uint32_t blocks, uint64_t seed, struct log *l)
{
    struct kvi_mock_cfg c = {
        .num_blocks = blocks, .block_size = BS, .prefill_tokens_per_ms = 1.0, .decode_ms_per_token = 1.0, .hash_seed = seed};
    memset(l, 0, sizeof *l);
    struct kvi_mock_engine *e = kvi_mock_create(&c, record, l);
    assert_non_null(e);
    return e;
}

static void submit(struct kvi_mock_engine *e, uint64_t tag, double at, uint32_t input, uint32_t output,
                   const uint64_t *c, int want)
{
    struct kvi_mock_request r = {tag, at, input, output, c};
    assert_int_equal(kvi_mock_submit(e, &r), want);
}

static uint64_t chain(uint64_t seed, const uint64_t *c, size_t n)
{
    uint64_t h = seed;
    for (size_t i = 0; i < n; i++)
        h = kvi_mock_hash(h, c[i]);
    return h;
}

/* A request stores its computed prompt blocks once prefill ends; a later
 * request reuses the cached prefix and stores only its new blocks, under the
 * last shared block. Engine hashes are the seeded chain. */
static void test_store_and_prefix_hit(void **state)
{
    (void)state;
    struct log l;
    struct kvi_mock_engine *e = engine(16, 99, &l);
    uint64_t a[] = {10, 11, 12, 13}, b[] = {10, 11, 22, 23};
    submit(e, 1, 0, 16, 0, a, 0);
    kvi_mock_advance(e, 100);
    assert_int_equal(l.n, 1);
    assert_int_equal(l.ev[0].kind, KVI_MOCK_STORED);
    assert_false(l.ev[0].has_parent);
    assert_int_equal(l.ev[0].n, 4);
    assert_true(l.ev[0].t == 16.0); /* 16 tokens at 1 token/ms */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(l.ev[0].eh[i], chain(99, a, i + 1));
        assert_int_equal(l.ev[0].c[i], a[i]);
    }
    assert_int_equal(l.ev[0].tag, 1);
    submit(e, 2, 200, 16, 0, b, 0);
    kvi_mock_drain(e);
    assert_int_equal(l.n, 2);
    assert_true(l.ev[1].has_parent);
    assert_int_equal(l.ev[1].parent, chain(99, a, 2));
    assert_int_equal(l.ev[1].n, 2);
    assert_int_equal(l.ev[1].pos, 2);
    assert_int_equal(l.ev[1].eh[0], chain(99, b, 3));
    assert_true(l.ev[1].t == 208.0); /* only the 8 uncached tokens are prefilled */
    struct kvi_mock_stats st;
    kvi_mock_stats(e, &st);
    assert_int_equal(st.hit_blocks, 2);
    assert_int_equal(st.computed_blocks, 6);
    assert_int_equal(st.removed_events, 0);
    assert_int_equal(kvi_mock_cached_blocks(e), 6);
    kvi_mock_destroy(e);
}

/* When the pool is full, the least recently used free cached blocks are
 * evicted — a finished request's blocks tail first — and reported in one
 * REMOVED event; blocks in use are never evicted. */
static void test_lru_eviction(void **state)
{
    (void)state;
    struct log l;
    struct kvi_mock_engine *e = engine(8, 5, &l);
    uint64_t a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8}, c[] = {9, 10}, d[] = {1, 2, 30, 31};
    submit(e, 1, 0, 16, 0, a, 0);  /* finishes at 16 */
    submit(e, 2, 20, 16, 0, b, 0); /* finishes at 36 */
    kvi_mock_advance(e, 50);
    assert_int_equal(kvi_mock_cached_blocks(e), 8);
    size_t before = l.n;
    submit(e, 3, 60, 8, 0, c, 0); /* needs 2 blocks: evicts a's last two, a[3] first */
    assert_int_equal(l.n, before + 1);
    struct ev *rm = &l.ev[before];
    assert_int_equal(rm->kind, KVI_MOCK_REMOVED);
    assert_int_equal(rm->n, 2);
    assert_int_equal(rm->eh[0], chain(5, a, 4));
    assert_int_equal(rm->eh[1], chain(5, a, 3));
    assert_true(rm->t == 60.0);
    assert_false(kvi_mock_is_cached(e, chain(5, a, 4)));
    assert_true(kvi_mock_is_cached(e, chain(5, a, 2)));
    kvi_mock_drain(e);
    /* 16 + 40 tokens = 14 blocks can never fit 8: dropped, nothing changes */
    submit(e, 4, 100, 16, 40, d, -E2BIG);
    struct kvi_mock_stats st;
    kvi_mock_stats(e, &st);
    assert_int_equal(st.dropped, 1);
    /* d shares a's first two blocks, which are still cached: it reuses them
     * (taking them off the LRU list) and its 2 new blocks evict the least
     * recently used, b's tail */
    before = l.n;
    submit(e, 5, 200, 16, 0, d, 0);
    kvi_mock_drain(e);
    assert_int_equal(l.ev[before].kind, KVI_MOCK_REMOVED);
    assert_int_equal(l.ev[before].n, 2);
    assert_int_equal(l.ev[before].eh[0], chain(5, b, 4));
    assert_int_equal(l.ev[before].eh[1], chain(5, b, 3));
    assert_int_equal(l.ev[before + 1].kind, KVI_MOCK_STORED);
    assert_int_equal(l.ev[before + 1].parent, chain(5, a, 2));
    kvi_mock_destroy(e);
}

/* A request that does not fit waits for running requests to release their
 * blocks (FIFO); one larger than the pool is dropped. */
static void test_wait_and_drop(void **state)
{
    (void)state;
    struct log l;
    struct kvi_mock_engine *e = engine(6, 1, &l);
    uint64_t a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8}, big[] = {1, 2, 3, 4, 5, 6, 7};
    submit(e, 1, 0, 16, 0, a, 0);                /* 4 blocks, busy until 16 */
    submit(e, 2, 1, 16, 0, b, 0);                /* needs 4, 2 free: waits */
    submit(e, 3, 2, 28, 0, big, -E2BIG);         /* 7 blocks > 6: dropped */
    kvi_mock_drain(e);
    struct kvi_mock_stats st;
    kvi_mock_stats(e, &st);
    assert_int_equal(st.waited, 1);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(st.completed, 2);
    /* b admitted at 16 (a's end), evicting two of a's blocks, stored at 32 */
    assert_int_equal(l.n, 3);
    assert_int_equal(l.ev[1].kind, KVI_MOCK_REMOVED);
    assert_true(l.ev[1].t == 16.0);
    assert_int_equal(l.ev[2].kind, KVI_MOCK_STORED);
    assert_true(l.ev[2].t == 32.0);
    assert_int_equal(l.ev[2].tag, 2);
    kvi_mock_destroy(e);
}

/* Output blocks are cached as they fill, one event each, under the previous
 * block; a request holds a partial tail block too. */
static void test_decode_blocks(void **state)
{
    (void)state;
    struct log l;
    struct kvi_mock_engine *e = engine(8, 3, &l);
    uint64_t c[] = {1, 2, 3, 4}; /* 2 prompt blocks + 2 output blocks */
    submit(e, 7, 0, 8, 9, c, 0); /* 17 tokens: 4 full blocks + a partial one = 5 */
    kvi_mock_drain(e);
    assert_int_equal(l.n, 3);
    assert_int_equal(l.ev[0].n, 2);
    assert_true(l.ev[0].t == 8.0);
    for (int i = 1; i <= 2; i++) {
        assert_int_equal(l.ev[i].n, 1);
        assert_int_equal(l.ev[i].pos, (uint32_t)(i + 1));
        assert_true(l.ev[i].has_parent);
        assert_int_equal(l.ev[i].parent, chain(3, c, i + 1));
        assert_int_equal(l.ev[i].c[0], c[i + 1]);
    }
    assert_true(l.ev[1].t == 12.0); /* 4 output tokens fill block 2 */
    assert_true(l.ev[2].t == 16.0);
    struct kvi_mock_stats st;
    kvi_mock_stats(e, &st);
    assert_int_equal(st.peak_in_use, 5);
    kvi_mock_destroy(e);
}

/* Two requests computing the same prefix at once: the second finds it cached
 * when its prefill ends, shares it and stores nothing for it. */
static void test_late_hit(void **state)
{
    (void)state;
    struct log l;
    struct kvi_mock_engine *e = engine(16, 4, &l);
    uint64_t a[] = {1, 2, 3}, b[] = {1, 2, 3, 9};
    submit(e, 1, 0, 12, 0, a, 0);
    submit(e, 2, 1, 16, 0, b, 0); /* arrives before a's prefill ends at 12 */
    kvi_mock_drain(e);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.ev[1].tag, 2);
    assert_int_equal(l.ev[1].n, 1);
    assert_int_equal(l.ev[1].pos, 3);
    assert_int_equal(l.ev[1].parent, chain(4, a, 3));
    struct kvi_mock_stats st;
    kvi_mock_stats(e, &st);
    assert_int_equal(st.late_hits, 3);
    kvi_mock_destroy(e);
}

/* Engine hashes are opaque and per engine: the same tokens under two seeds
 * differ, and never equal kvidx's content or standard sequence hashes. */
static void test_opaque_hashes(void **state)
{
    (void)state;
    struct log l1, l2;
    struct kvi_mock_engine *e1 = engine(8, 1, &l1), *e2 = engine(8, 2, &l2);
    uint64_t c[] = {0x1111, 0x2222, 0x3333};
    submit(e1, 1, 0, 12, 0, c, 0);
    submit(e2, 1, 0, 12, 0, c, 0);
    kvi_mock_drain(e1);
    kvi_mock_drain(e2);
    uint64_t seq[3];
    kvi_seq_hashes(c, 3, seq);
    for (int i = 0; i < 3; i++) {
        assert_true(l1.ev[0].eh[i] != l2.ev[0].eh[i]);
        assert_true(l1.ev[0].eh[i] != c[i] && l1.ev[0].eh[i] != seq[i]);
    }
    kvi_mock_destroy(e1);
    kvi_mock_destroy(e2);
}

/* Random requests under heavy pressure: the event stream always describes
 * the engine's cache exactly — stores under held parents, removes of held
 * leaves only — and the cache never exceeds the pool. */
struct model {
    struct kvi_u64map held; /* engine hash -> parent + 1 */
    uint64_t events;
};

static void model_apply(void *ctx, const struct kvi_mock_event *e)
{
    struct model *m = ctx;
    m->events++;
    for (uint32_t i = 0; i < e->n; i++) {
        if (e->kind == KVI_MOCK_STORED) {
            uint64_t parent = i ? e->engine_hash[i - 1] + 1 : e->has_parent ? e->parent + 1 : 0;
            if (i == 0 && e->has_parent)
                assert_true(kvi_u64map_get(&m->held, e->parent, NULL));
            assert_true(kvi_u64map_put(&m->held, e->engine_hash[i], parent));
        } else {
            assert_true(kvi_u64map_del(&m->held, e->engine_hash[i], NULL));
            size_t pos = 0;
            uint64_t k, v;
            while (kvi_u64map_next(&m->held, &pos, &k, &v))
                assert_true(v != e->engine_hash[i] + 1);
        }
    }
}

static void test_random_stream(void **state)
{
    (void)state;
    struct model m = {0};
    kvi_u64map_init(&m.held);
    struct kvi_mock_cfg c = {.num_blocks = 48, .block_size = BS, .prefill_tokens_per_ms = 2.0,
                             .decode_ms_per_token = 0.5, .hash_seed = 77};
    struct kvi_mock_engine *e = kvi_mock_create(&c, model_apply, &m);
    uint64_t rng = 12345, prefixes[6][20];
    for (int p = 0; p < 6; p++)
        for (int i = 0; i < 20; i++)
            prefixes[p][i] = kvi_bench_rand(&rng);
    double t = 0;
    uint64_t content[40];
    for (int r = 0; r < 600; r++) {
        t += (double)(kvi_bench_rand(&rng) % 20);
        int p = (int)(kvi_bench_rand(&rng) % 6);
        uint32_t shared = (uint32_t)(kvi_bench_rand(&rng) % 21);
        uint32_t input = (uint32_t)(kvi_bench_rand(&rng) % (30 * BS)) + 1;
        uint32_t output = (uint32_t)(kvi_bench_rand(&rng) % (8 * BS));
        uint32_t full = (input + output) / BS;
        for (uint32_t i = 0; i < full; i++)
            content[i] = i < shared ? prefixes[p][i] : kvi_bench_rand(&rng);
        struct kvi_mock_request q = {(uint64_t)r, t, input, output, content};
        kvi_mock_submit(e, &q);
        assert_true(kvi_mock_cached_blocks(e) <= c.num_blocks);
        assert_int_equal(kvi_mock_cached_blocks(e), kvi_u64map_size(&m.held));
    }
    kvi_mock_drain(e);
    struct kvi_mock_stats st;
    kvi_mock_stats(e, &st);
    assert_true(st.removed_blocks > 100);
    assert_true(st.hit_blocks > 0);
    assert_true(st.late_hits + st.waited > 0);
    assert_int_equal(m.events, st.stored_events + st.removed_events);
    assert_int_equal(kvi_mock_cached_blocks(e), kvi_u64map_size(&m.held));
    size_t pos = 0;
    uint64_t k, v;
    while (kvi_u64map_next(&m.held, &pos, &k, &v))
        assert_true(kvi_mock_is_cached(e, k));
    kvi_mock_destroy(e);
    kvi_u64map_free(&m.held);
}

/* Destroying an engine with running and waiting requests frees each once
 * (checked by the sanitizer builds) and emits nothing more. */
static void test_destroy_midway(void **state)
{
    (void)state;
    struct log l;
    struct kvi_mock_engine *e = engine(8, 2, &l);
    uint64_t a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10};
    submit(e, 1, 0, 8, 16, a, 0);  /* prefill until 8, decodes until 24 */
    submit(e, 2, 1, 16, 0, b, 0);  /* 4 blocks: 2 free, waits */
    submit(e, 3, 2, 12, 0, a, 0);  /* queued behind it (FIFO) */
    kvi_mock_advance(e, 10);       /* 1 is decoding: one STEP_FILL and a STEP_FINISH pending */
    size_t n = l.n;
    struct kvi_mock_stats st;
    kvi_mock_stats(e, &st);
    assert_int_equal(st.waited, 2);
    kvi_mock_destroy(e);
    assert_int_equal(l.n, n);
}

static void test_bad_config(void **state)
{
    (void)state;
    struct log l;
    struct kvi_mock_cfg c = {.num_blocks = 0, .block_size = 4, .prefill_tokens_per_ms = 1};
    assert_null(kvi_mock_create(&c, record, &l));
    c.num_blocks = 4;
    c.prefill_tokens_per_ms = 0;
    assert_null(kvi_mock_create(&c, record, &l));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_and_prefix_hit), cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_wait_and_drop),        cmocka_unit_test(test_decode_blocks),
        cmocka_unit_test(test_late_hit),             cmocka_unit_test(test_opaque_hashes),
        cmocka_unit_test(test_random_stream),        cmocka_unit_test(test_destroy_midway),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
