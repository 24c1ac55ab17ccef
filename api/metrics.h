/*
 * GET /metrics: Prometheus text exposition (version 0.0.4).
 *
 * Dynamo's six metrics, names, labels and buckets unchanged (http-api.md
 * §1.15): dynamo_kvindexer_request_duration_seconds{endpoint} (histogram,
 * 100 us x 2^i, 20 buckets), _requests_total{endpoint,method},
 * _errors_total{endpoint,status_class}, _models, _workers,
 * _listeners{status}. Every route but /metrics is counted; requests that
 * matched no route are endpoint="unknown".
 *
 * kvidx's own metrics (prefix kvidx_): events by type and outcome, every
 * listener transport / replay counter, writer queues (ring occupancy), lag
 * and busy time, index entries / blocks / bytes per namespace, jemalloc
 * memory, an in-handler query latency histogram per query route and dialect,
 * HTTP connection figures, readiness and recovery.
 *
 * The query histograms are written by the loop thread that owns them
 * (relaxed single-writer stores) and read by the scraping thread.
 */
#ifndef KVI_API_METRICS_H
#define KVI_API_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "net/body.h"
#include "api/service.h"
#include "engine/common.h"
#include "net/http_server.h"

/** Query histogram buckets: <= 1 us x 2^i for i < KVI_QUERY_BUCKETS, then the rest. */
#define KVI_QUERY_BUCKETS 20

/** The query routes timed in the handler. */
enum kvi_query_kind {
    KVI_QK_DYN_QUERY = 0,   /* /query, Dynamo */
    KVI_QK_DYN_HASH = 1,    /* /query_by_hash, Dynamo */
    KVI_QK_COND_QUERY = 2,  /* /query, Conductor */
    KVI_QK_COND_HASH = 3,   /* /query_by_hash, Conductor */
    KVI_QK_COUNT
};

/** One thread's figures for one query kind (single writer: its loop thread). */
struct kvi_query_hist {
    _Atomic uint64_t buckets[KVI_QUERY_BUCKETS + 1]; /* not cumulative */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_ns;
    _Atomic uint64_t blocks; /* query blocks (hashes) looked up */
} KVI_CACHE_ALIGNED;

/** Record one query of @p ns nanoseconds over @p blocks blocks (owning loop thread only). */
static inline void kvi_query_hist_add(struct kvi_query_hist *h, uint64_t ns, uint64_t blocks)
{
    unsigned b = 0;
    uint64_t bound = 1000;
    while (b < KVI_QUERY_BUCKETS && ns > bound) {
        bound <<= 1;
        b++;
    }
    kvi_relaxed_add(&h->buckets[b], 1);
    kvi_relaxed_add(&h->count, 1);
    kvi_relaxed_add(&h->sum_ns, ns);
    kvi_relaxed_add(&h->blocks, blocks);
}

/** What /metrics reads. */
struct kvi_metrics_src {
    struct kvi_service *svc;
    const struct kvi_http_server *srv;
    int metrics_route;                   /* route id of /metrics (not counted), or -1 */
    const struct kvi_query_hist *hists;  /* n_threads x KVI_QK_COUNT, thread-major */
    unsigned n_threads;
};

/**
 * Render every metric into @p out (appended). Any thread that is a
 * registered RCU reader (it lists the namespaces in a read section).
 * @return 0 or -ENOMEM.
 */
int kvi_metrics_render(const struct kvi_metrics_src *src, struct kvi_buf *out);

#endif
