/*
 * HDR-style log-linear latency histogram for benchmarks (bench/ only).
 *
 * Values (nanoseconds, any u64) fall into buckets of constant relative width:
 * values below 2^(KVI_HIST_SUB_BITS+1) are counted exactly; above, every
 * power-of-two range [2^k, 2^(k+1)) is cut into 2^KVI_HIST_SUB_BITS equal
 * sub-buckets, so a reported percentile is within 1/2^KVI_HIST_SUB_BITS
 * (0.8 %) of a recorded value. The counts live inline in the struct: recording
 * is a few instructions and never allocates, so one histogram per thread can
 * record every sample of a run; merge them afterwards.
 *
 *   | call        | thread                                           |
 *   |-------------|--------------------------------------------------|
 *   | init, reset | the owner                                        |
 *   | record      | the owner only (not thread-safe)                 |
 *   | merge       | the owner of @p dst, after @p src's owner is done |
 *   | percentile  | any thread, once recording has stopped           |
 */
#ifndef KVI_BENCH_HIST_H
#define KVI_BENCH_HIST_H

#include <stddef.h>
#include <stdint.h>

#define KVI_HIST_SUB_BITS 7
#define KVI_HIST_SUB (1u << KVI_HIST_SUB_BITS)
/* exact range 0 .. 2*SUB-1, then one row of SUB buckets per exponent 1..63-SUB_BITS */
#define KVI_HIST_BUCKETS (2u * KVI_HIST_SUB + (63u - KVI_HIST_SUB_BITS) * KVI_HIST_SUB)

struct kvi_hist {
    uint64_t count;
    uint64_t sum; /* wraps only after ~584 years of nanoseconds */
    uint64_t min;
    uint64_t max;
    uint64_t counts[KVI_HIST_BUCKETS];
};

/** Empty a histogram. */
void kvi_hist_reset(struct kvi_hist *h);

/** Bucket index of @p v. */
static inline uint32_t kvi_hist_bucket(uint64_t v);

/** Smallest value that falls into bucket @p b. */
uint64_t kvi_hist_bucket_low(uint32_t b);

/** Largest value that falls into bucket @p b. */
uint64_t kvi_hist_bucket_high(uint32_t b);

/** Record one value (owner thread only). */
static inline void kvi_hist_record(struct kvi_hist *h, uint64_t v);

/** Add every count of @p src to @p dst. */
void kvi_hist_merge(struct kvi_hist *dst, const struct kvi_hist *src);

/**
 * Value at percentile @p p (0..100): the highest value of the bucket holding
 * the sample of that rank, clamped to [min, max]; p = 100 gives max exactly.
 * @return 0 for an empty histogram.
 */
uint64_t kvi_hist_percentile(const struct kvi_hist *h, double p);

/** Mean of the recorded values (0 when empty). */
double kvi_hist_mean(const struct kvi_hist *h);

/* The figures the benchmarks report of a latency histogram (0 when empty). */
struct kvi_hist_summary {
    uint64_t p50, p95, p99, p999, max;
    double mean;
};

/** Summarise @p h (percentiles as kvi_hist_percentile). */
void kvi_hist_summarize(const struct kvi_hist *h, struct kvi_hist_summary *s);

/* inline defs */

static inline uint32_t kvi_hist_bucket(uint64_t v)
{
    if (v < 2u * KVI_HIST_SUB)
        return (uint32_t)v;
    uint32_t msb = 63u - (uint32_t)__builtin_clzll(v);     /* >= SUB_BITS + 1 */
    uint32_t e = msb - KVI_HIST_SUB_BITS;                  /* >= 1 */
    uint32_t sub = (uint32_t)(v >> e) - KVI_HIST_SUB;      /* 0 .. SUB-1 */
    return 2u * KVI_HIST_SUB + (e - 1u) * KVI_HIST_SUB + sub;
}

static inline void kvi_hist_record(struct kvi_hist *h, uint64_t v)
{
    h->counts[kvi_hist_bucket(v)]++;
    h->count++;
    h->sum += v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

#endif
