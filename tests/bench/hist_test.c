/* ctest-labels: unit -- bench/hist.{h,c}: log-linear buckets, percentiles, merge */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>

#include "bench/bench.h"
#include "bench/hist.h"

static struct kvi_hist *new_hist(void)
{
    struct kvi_hist *h = malloc(sizeof *h);
    assert_non_null(h);
    kvi_hist_reset(h);
    return h;
}

/* Every value lies inside its bucket, buckets are contiguous and ordered,
 * and a bucket is at most 1/128 of its low bound wide. */
static void test_buckets(void **state)
{
    (void)state;
    for (uint32_t b = 0; b + 1 < KVI_HIST_BUCKETS; b++) {
        uint64_t lo = kvi_hist_bucket_low(b), hi = kvi_hist_bucket_high(b);
        assert_true(lo <= hi);
        assert_int_equal(kvi_hist_bucket_low(b + 1), hi + 1);
        assert_int_equal(kvi_hist_bucket(lo), b);
        assert_int_equal(kvi_hist_bucket(hi), b);
        if (lo >= 2 * KVI_HIST_SUB)
            assert_true((hi - lo + 1) * KVI_HIST_SUB <= lo);
    }
    assert_int_equal(kvi_hist_bucket(UINT64_MAX), KVI_HIST_BUCKETS - 1);
    uint64_t rng = 7;
    for (int i = 0; i < 100000; i++) {
        uint64_t v = kvi_bench_rand(&rng) >> (kvi_bench_rand(&rng) % 64);
        uint32_t b = kvi_hist_bucket(v);
        assert_true(b < KVI_HIST_BUCKETS);
        assert_true(kvi_hist_bucket_low(b) <= v && v <= kvi_hist_bucket_high(b));
    }
}

/* Exact below 256; percentiles of 1..10000 within 1 % of the true rank value. */
static void test_percentiles(void **state)
{
    (void)state;
    struct kvi_hist *h = new_hist();
    assert_int_equal(kvi_hist_percentile(h, 50), 0);
    for (uint64_t v = 1; v <= 10000; v++)
        kvi_hist_record(h, v);
    assert_int_equal(h->count, 10000);
    assert_int_equal(h->min, 1);
    assert_int_equal(h->max, 10000);
    assert_int_equal(kvi_hist_percentile(h, 100), 10000);
    assert_int_equal(kvi_hist_percentile(h, 0), 1);
    assert_int_equal(kvi_hist_percentile(h, 1), 100); /* exact range */
    static const double ps[] = {50, 90, 95, 99, 99.9};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        double want = ps[i] * 100.0;
        double got = (double)kvi_hist_percentile(h, ps[i]);
        assert_true(got >= want && got <= want * 1.01);
    }
    assert_true(kvi_hist_mean(h) > 5000.4 && kvi_hist_mean(h) < 5000.6);
    free(h);
}

/* A single huge outlier is the max and the p100, not the p99. */
static void test_outlier_and_merge(void **state)
{
    (void)state;
    struct kvi_hist *a = new_hist(), *b = new_hist();
    for (int i = 0; i < 990; i++)
        kvi_hist_record(a, 1000);
    for (int i = 0; i < 9; i++)
        kvi_hist_record(b, 2000);
    kvi_hist_record(b, 5000000000ull);
    kvi_hist_merge(a, b);
    assert_int_equal(a->count, 1000);
    assert_int_equal(a->max, 5000000000ull);
    uint64_t p99 = kvi_hist_percentile(a, 99);
    assert_true(p99 >= 1000 && p99 <= 1008);
    uint64_t p999 = kvi_hist_percentile(a, 99.9);
    assert_true(p999 >= 2000 && p999 <= 2016);
    assert_int_equal(kvi_hist_percentile(a, 100), 5000000000ull);
    /* merging an empty histogram changes nothing */
    struct kvi_hist *e = new_hist();
    kvi_hist_merge(a, e);
    assert_int_equal(a->count, 1000);
    assert_int_equal(a->min, 1000);
    free(a);
    free(b);
    free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_percentiles),
        cmocka_unit_test(test_outlier_and_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
