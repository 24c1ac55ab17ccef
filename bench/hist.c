/* HDR-style log-linear histogram (see bench/hist.h). */
#include "bench/hist.h"

#include <math.h>
#include <string.h>

void kvi_hist_reset(struct kvi_hist *h)
{
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

uint64_t kvi_hist_bucket_low(uint32_t b)
{
    if (b < 2u * KVI_HIST_SUB)
        return b;
    uint32_t e = (b - 2u * KVI_HIST_SUB) / KVI_HIST_SUB + 1u;
    uint64_t sub = (b - 2u * KVI_HIST_SUB) % KVI_HIST_SUB;
    return (KVI_HIST_SUB + sub) << e;
}

uint64_t kvi_hist_bucket_high(uint32_t b)
{
    if (b + 1u >= KVI_HIST_BUCKETS)
        return UINT64_MAX;
    return kvi_hist_bucket_low(b + 1u) - 1u;
}

void kvi_hist_merge(struct kvi_hist *dst, const struct kvi_hist *src)
{
    if (src->count == 0)
        return;
    for (uint32_t i = 0; i < KVI_HIST_BUCKETS; i++)
        dst->counts[i] += src->counts[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t kvi_hist_percentile(const struct kvi_hist *h, double p)
{
    if (h->count == 0)
        return 0;
    if (p >= 100.0)
        return h->max;
    if (p <= 0.0)
        return h->min;
    /* rank of the sample (1-based), nearest-rank definition */
    uint64_t rank = (uint64_t)ceil(p / 100.0 * (double)h->count - 1e-9);
    if (rank == 0)
        rank = 1;
    if (rank > h->count)
        rank = h->count;
    uint64_t seen = 0;
    for (uint32_t i = 0; i < KVI_HIST_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t v = kvi_hist_bucket_high(i);
            if (v > h->max)
                v = h->max;
            if (v < h->min)
                v = h->min;
            return v;
        }
    }
    return h->max;
}

double kvi_hist_mean(const struct kvi_hist *h)
{
    return h->count ? (double)h->sum / (double)h->count : 0.0;
}

void kvi_hist_summarize(const struct kvi_hist *h, struct kvi_hist_summary *s)
{
    s->p50 = kvi_hist_percentile(h, 50);
    s->p95 = kvi_hist_percentile(h, 95);
    s->p99 = kvi_hist_percentile(h, 99);
    s->p999 = kvi_hist_percentile(h, 99.9);
    s->max = h->count ? h->max : 0;
    s->mean = kvi_hist_mean(h);
}
