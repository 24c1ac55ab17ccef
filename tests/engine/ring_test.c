/* ctest-labels: unit -- engine/ring.{h,c} single-threaded behaviour */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "engine/ring.h"

#define OBJ(i) ((void *)(uintptr_t)(i))
#define VAL(p) ((uintptr_t)(p))

/* Check the count functions against the number of objects known to be in r. */
static void check_counts(const struct kvi_ring *r, uint32_t expect)
{
    assert_int_equal(kvi_ring_count(r), expect);
    assert_int_equal(kvi_ring_free_count(r), kvi_ring_capacity(r) - expect);
    assert_int_equal(kvi_ring_count(r) + kvi_ring_free_count(r), kvi_ring_capacity(r));
    assert_int_equal(!!kvi_ring_empty(r), expect == 0);
}

static void test_create_rounding(void **state)
{
    static const struct {
        uint32_t ask, cap;
    } cases[] = {
        {1, 2},     {2, 2},       {3, 4},       {4, 4},         {5, 8},
        {7, 8},     {8, 8},       {9, 16},      {1000, 1024},   {1024, 1024},
        {1025, 2048}, {65535, 65536}, {(1u << 20) + 1, 1u << 21},
    };
    for (size_t i = 0; i < KVI_ARRAY_LEN(cases); i++) {
        struct kvi_ring *r = kvi_ring_create(cases[i].ask);
        assert_non_null(r);
        assert_int_equal(kvi_ring_capacity(r), cases[i].cap);
        assert_int_equal((uintptr_t)r % KVI_CACHE_LINE, 0);
        assert_int_equal((uintptr_t)&r->_slots[0] % KVI_CACHE_LINE, 0);
        check_counts(r, 0);
        kvi_ring_free(r);
    }
}

static void test_create_errors(void **state)
{
    static const uint32_t bad[] = {0, KVI_RING_MAX_CAPACITY + 1, 3u << 30, UINT32_MAX};
    for (size_t i = 0; i < KVI_ARRAY_LEN(bad); i++) {
        errno = 0;
        struct kvi_ring *r = kvi_ring_create(bad[i]);
        assert_null(r);
        assert_int_equal(errno, EINVAL);
    }
    kvi_ring_free(NULL); /* no-op */
}

static void test_fill_exact_capacity(void **state)
{
    static const uint32_t caps[] = {2, 8, 64, 1024};
    for (size_t c = 0; c < KVI_ARRAY_LEN(caps); c++) {
        struct kvi_ring *r = kvi_ring_create(caps[c]);
        assert_non_null(r);
        uint32_t cap = kvi_ring_capacity(r);
        assert_int_equal(cap, caps[c]);

        /* One at a time until full: exactly cap objects go in. */
        uint32_t n = 0;
        while (kvi_ring_enqueue_burst(r, (void *const[]){OBJ(n)}, 1) == 1) {
            n++;
            check_counts(r, n);
            assert_true(n <= cap);
        }
        assert_int_equal(n, cap);
        assert_int_equal(kvi_ring_free_count(r), 0);
        assert_int_equal(kvi_ring_enqueue_bulk(r, (void *const[]){OBJ(0)}, 1), 0);
        check_counts(r, cap);

        /* Out in order. */
        for (uint32_t i = 0; i < cap; i++) {
            void *o = OBJ(~0u);
            assert_int_equal(kvi_ring_dequeue_burst(r, &o, 1), 1);
            assert_int_equal(VAL(o), i);
            check_counts(r, cap - i - 1);
        }
        void *o;
        assert_int_equal(kvi_ring_dequeue_burst(r, &o, 1), 0);

        /* And in one burst: as many as fit, the rest refused. */
        void *in[2048], *out[2048];
        for (uint32_t i = 0; i < 2 * cap; i++)
            in[i] = OBJ(1000 + i);
        assert_int_equal(kvi_ring_enqueue_burst(r, in, 2 * cap), cap);
        check_counts(r, cap);
        assert_int_equal(kvi_ring_enqueue_burst(r, in, 1), 0);
        assert_int_equal(kvi_ring_dequeue_burst(r, out, 2 * cap), cap);
        for (uint32_t i = 0; i < cap; i++)
            assert_int_equal(VAL(out[i]), 1000 + i);
        check_counts(r, 0);
        kvi_ring_free(r);
    }
}

static void test_bulk_all_or_nothing(void **state)
{
    struct kvi_ring *r = kvi_ring_create(8);
    assert_non_null(r);
    void *in[16], *out[16];
    for (uint32_t i = 0; i < 16; i++)
        in[i] = OBJ(100 + i);

    assert_int_equal(kvi_ring_enqueue_bulk(r, in, 0), 0);
    assert_int_equal(kvi_ring_enqueue_bulk(r, in, 9), 0); /* more than capacity */
    check_counts(r, 0);
    assert_int_equal(kvi_ring_enqueue_bulk(r, in, 5), 5);
    check_counts(r, 5);
    assert_int_equal(kvi_ring_enqueue_bulk(r, in + 5, 4), 0); /* only 3 free */
    check_counts(r, 5);
    assert_int_equal(kvi_ring_enqueue_bulk(r, in + 5, 3), 3);
    check_counts(r, 8);
    assert_int_equal(kvi_ring_enqueue_bulk(r, in, 1), 0);

    /* Dequeue bulk: all or nothing as well. */
    assert_int_equal(kvi_ring_dequeue_bulk(r, out, 9), 0);
    check_counts(r, 8);
    assert_int_equal(kvi_ring_dequeue_bulk(r, out, 6), 6);
    check_counts(r, 2);
    assert_int_equal(kvi_ring_dequeue_bulk(r, out + 6, 3), 0);
    check_counts(r, 2);
    assert_int_equal(kvi_ring_dequeue_bulk(r, out + 6, 2), 2);
    check_counts(r, 0);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(VAL(out[i]), 100 + i);

    /* A refused bulk leaves the ring contents unchanged (across the wrap). */
    assert_int_equal(kvi_ring_enqueue_bulk(r, in, 3), 3);
    assert_int_equal(kvi_ring_dequeue_bulk(r, out, 3), 3); /* head and tail at slot 3 */
    assert_int_equal(kvi_ring_enqueue_bulk(r, in, 7), 7);  /* slots 3..7, 0..1 */
    assert_int_equal(kvi_ring_enqueue_bulk(r, in + 7, 2), 0);
    assert_int_equal(kvi_ring_enqueue_burst(r, in + 7, 2), 1);
    assert_int_equal(kvi_ring_dequeue_burst(r, out, 16), 8);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(VAL(out[i]), 100 + i);
    assert_int_equal(kvi_ring_dequeue_bulk(r, out, 0), 0);
    assert_int_equal(kvi_ring_dequeue_burst(r, out, 0), 0);
    check_counts(r, 0);
    kvi_ring_free(r);
}

/*
 * Pass @p total sequence numbers through @p r in a single thread, with burst
 * sizes cycling through two coprime patterns of odd lengths, checking order,
 * loss and counts after every operation.
 */
static void pump(struct kvi_ring *r, uint32_t total)
{
    static const uint32_t enq_sizes[] = {1, 3, 5, 7, 11, 13, 17, 31, 9};
    static const uint32_t deq_sizes[] = {7, 2, 19, 5, 1, 23, 3};
    void *buf[64];
    uint32_t sent = 0, recvd = 0, ei = 0, di = 0;
    while (recvd < total) {
        uint32_t want = enq_sizes[ei++ % KVI_ARRAY_LEN(enq_sizes)];
        want = KVI_MIN(want, total - sent); /* KVI_MIN evaluates twice: no ++ inside */
        for (uint32_t i = 0; i < want; i++)
            buf[i] = OBJ(sent + i);
        uint32_t in_ring = sent - recvd;
        uint32_t got = kvi_ring_enqueue_burst(r, buf, want);
        assert_int_equal(got, KVI_MIN(want, kvi_ring_capacity(r) - in_ring));
        sent += got;
        check_counts(r, sent - recvd);

        uint32_t take = deq_sizes[di++ % KVI_ARRAY_LEN(deq_sizes)];
        in_ring = sent - recvd;
        uint32_t out = kvi_ring_dequeue_burst(r, buf, take);
        assert_int_equal(out, KVI_MIN(take, in_ring));
        for (uint32_t i = 0; i < out; i++)
            assert_int_equal(VAL(buf[i]), recvd + i);
        recvd += out;
        check_counts(r, sent - recvd);
    }
    assert_int_equal(sent, total);
    assert_true(kvi_ring_empty(r));
}

static void test_wrap_around_odd_bursts(void **state)
{
    static const uint32_t caps[] = {2, 16, 32, 128};
    for (size_t c = 0; c < KVI_ARRAY_LEN(caps); c++) {
        struct kvi_ring *r = kvi_ring_create(caps[c]);
        assert_non_null(r);
        pump(r, 200000); /* wraps the slot array thousands of times */
        kvi_ring_free(r);
    }
}

/* Free-running 32-bit indices crossing UINT32_MAX. */
static void test_index_wrap_past_uint32_max(void **state)
{
    struct kvi_ring *r = kvi_ring_create(16);
    assert_non_null(r);
    uint32_t start = UINT32_MAX - 100;
    atomic_store(&r->_head, start);
    atomic_store(&r->_tail, start);
    r->_head_cache = start;
    r->_tail_cache = start;
    check_counts(r, 0);
    pump(r, 5000);
    assert_true(atomic_load(&r->_head) < start); /* really wrapped */

    /* Fill to capacity right across the index wrap. */
    atomic_store(&r->_head, UINT32_MAX - 3);
    atomic_store(&r->_tail, UINT32_MAX - 3);
    r->_head_cache = r->_tail_cache = UINT32_MAX - 3;
    void *in[16], *out[16];
    for (uint32_t i = 0; i < 16; i++)
        in[i] = OBJ(i);
    assert_int_equal(kvi_ring_enqueue_bulk(r, in, 16), 16);
    check_counts(r, 16);
    assert_int_equal(kvi_ring_enqueue_burst(r, in, 1), 0);
    assert_int_equal(kvi_ring_dequeue_bulk(r, out, 16), 16);
    for (uint32_t i = 0; i < 16; i++)
        assert_int_equal(VAL(out[i]), i);
    check_counts(r, 0);
    kvi_ring_free(r);
}

static void test_count_invariants(void **state)
{
    struct kvi_ring *r = kvi_ring_create(100); /* -> 128 */
    assert_non_null(r);
    assert_int_equal(kvi_ring_capacity(r), 128);
    uint64_t seed = 12345;
    uint32_t sent = 0, recvd = 0;
    void *buf[200];
    for (int step = 0; step < 20000; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t n = (uint32_t)(seed >> 33) % 200;
        uint32_t before = kvi_ring_count(r);
        assert_int_equal(before, sent - recvd);
        switch ((seed >> 20) & 3) {
        case 0: { /* burst enqueue */
            for (uint32_t i = 0; i < n; i++)
                buf[i] = OBJ(sent + i);
            uint32_t got = kvi_ring_enqueue_burst(r, buf, n);
            assert_int_equal(got, KVI_MIN(n, 128 - before));
            sent += got;
            break;
        }
        case 1: { /* bulk enqueue */
            for (uint32_t i = 0; i < n; i++)
                buf[i] = OBJ(sent + i);
            uint32_t got = kvi_ring_enqueue_bulk(r, buf, n);
            assert_int_equal(got, n <= 128 - before ? n : 0);
            sent += got;
            break;
        }
        case 2: { /* burst dequeue */
            uint32_t got = kvi_ring_dequeue_burst(r, buf, n);
            assert_int_equal(got, KVI_MIN(n, before));
            for (uint32_t i = 0; i < got; i++)
                assert_int_equal(VAL(buf[i]), recvd + i);
            recvd += got;
            break;
        }
        default: { /* bulk dequeue */
            uint32_t got = kvi_ring_dequeue_bulk(r, buf, n);
            assert_int_equal(got, n <= before ? n : 0);
            for (uint32_t i = 0; i < got; i++)
                assert_int_equal(VAL(buf[i]), recvd + i);
            recvd += got;
            break;
        }
        }
        check_counts(r, sent - recvd);
    }
    kvi_ring_free(r);
}

/* Write @p n sequence numbers from @p first into a zero-copy reservation. */
static void zc_fill(const struct kvi_ring_zc *zc, uint32_t n, uint32_t first)
{
    for (uint32_t i = 0; i < n; i++) {
        if (i < zc->n1)
            zc->ptr1[i] = OBJ(first + i);
        else
            zc->ptr2[i - zc->n1] = OBJ(first + i);
    }
}

static void test_zero_copy_enqueue(void **state)
{
    struct kvi_ring *r = kvi_ring_create(8);
    assert_non_null(r);
    struct kvi_ring_zc zc;
    void *out[16];

    /* Contiguous reservation. */
    assert_int_equal(kvi_ring_enqueue_zc_burst_start(r, 5, &zc), 5);
    assert_int_equal(zc.n1, 5);
    assert_null(zc.ptr2);
    zc_fill(&zc, 5, 0);
    check_counts(r, 0); /* not yet published */
    assert_int_equal(kvi_ring_dequeue_burst(r, out, 8), 0);
    kvi_ring_enqueue_zc_finish(r, 5);
    check_counts(r, 5);
    assert_int_equal(kvi_ring_dequeue_burst(r, out, 8), 5);
    for (uint32_t i = 0; i < 5; i++)
        assert_int_equal(VAL(out[i]), i);

    /* Wrapping reservation: head at slot 5, so 3 + 5 slots. */
    assert_int_equal(kvi_ring_enqueue_zc_burst_start(r, 20, &zc), 8);
    assert_int_equal(zc.n1, 3);
    assert_ptr_equal(zc.ptr1, &r->_slots[5]);
    assert_ptr_equal(zc.ptr2, &r->_slots[0]);
    zc_fill(&zc, 8, 5);
    kvi_ring_enqueue_zc_finish(r, 8);
    check_counts(r, 8);
    assert_int_equal(kvi_ring_enqueue_zc_burst_start(r, 1, &zc), 0); /* full */
    assert_int_equal(kvi_ring_dequeue_burst(r, out, 16), 8);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(VAL(out[i]), 5 + i);

    /* Partial finish: only the first 2 of 4 reserved slots are published. */
    assert_int_equal(kvi_ring_enqueue_zc_burst_start(r, 4, &zc), 4);
    zc_fill(&zc, 2, 13);
    kvi_ring_enqueue_zc_finish(r, 2);
    check_counts(r, 2);
    /* Cancelled reservation publishes nothing. */
    assert_int_equal(kvi_ring_enqueue_zc_burst_start(r, 3, &zc), 3);
    kvi_ring_enqueue_zc_finish(r, 0);
    check_counts(r, 2);
    /* Mixed with ordinary enqueue afterwards. */
    assert_int_equal(kvi_ring_enqueue_burst(r, (void *const[]){OBJ(15), OBJ(16)}, 2), 2);
    assert_int_equal(kvi_ring_dequeue_burst(r, out, 16), 4);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(VAL(out[i]), 13 + i);

    /* Many zero-copy rounds with odd sizes across the wrap. */
    uint32_t sent = 17, recvd = 17;
    for (uint32_t round = 0; round < 10000; round++) {
        uint32_t want = 1 + round % 7;
        uint32_t got = kvi_ring_enqueue_zc_burst_start(r, want, &zc);
        assert_int_equal(got, KVI_MIN(want, 8 - (sent - recvd)));
        if (got) {
            assert_int_equal(zc.n1 + (zc.ptr2 ? got - zc.n1 : 0), got);
            zc_fill(&zc, got, sent);
            kvi_ring_enqueue_zc_finish(r, got);
            sent += got;
        }
        uint32_t take = kvi_ring_dequeue_burst(r, out, 1 + round % 5);
        for (uint32_t i = 0; i < take; i++)
            assert_int_equal(VAL(out[i]), recvd + i);
        recvd += take;
        check_counts(r, sent - recvd);
    }
    kvi_ring_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_rounding),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_fill_exact_capacity),
        cmocka_unit_test(test_bulk_all_or_nothing),
        cmocka_unit_test(test_wrap_around_odd_bursts),
        cmocka_unit_test(test_index_wrap_past_uint32_max),
        cmocka_unit_test(test_count_invariants),
        cmocka_unit_test(test_zero_copy_enqueue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
