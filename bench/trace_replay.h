/*
 * Replay of a trace workload against one index backend, in process
 * (bench/ only).
 *
 * Backends (kvi_trace_backend_by_name):
 *   "kvidx"       kvidx's index: events become STORE / REMOVE ops through
 *                 the writer rings (kvi_producer_submit_burst to a
 *                 kvi_writer_pool of `writers` threads, one partition each);
 *                 queries call kvi_index_find_matches in an RCU read-side
 *                 section on the replay thread.
 *   "radix-lock"  baseline_radix.h: the compressed radix tree behind one
 *                 rwlock.
 *   "naive-map"   baseline_naive.h: the naive nested map behind one rwlock.
 * Baseline events travel the same rings and writer threads as kvidx's
 * (KVI_OP_CALL ops that apply the event under the baseline's write lock, with
 * the same sticky worker -> writer routing), so every backend pays the same
 * event plumbing and the same backlog accounting, and only the index differs.
 *
 * The replay threads ("lanes", cfg.readers of them) each own the workers
 * w with w % readers == lane and issue their timeline entries at
 * t0 + t_ns * window / span: a query is timed around the backend's find
 * (service latency, HDR histogram); an event is submitted to the writers.
 * A lane that falls behind issues at once (no sleeping) until it catches up.
 * The timeline is read-only and transport-neutral, so a later end-to-end mode
 * can put a ZMQ publisher behind the event side and an HTTP/2 client behind
 * the query side of the same lanes.
 */
#ifndef KVI_BENCH_TRACE_REPLAY_H
#define KVI_BENCH_TRACE_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/baseline_common.h"
#include "bench/hist.h"
#include "bench/trace.h"

struct kvi_trace_backend;
struct kvi_trace_be; /* an instance of a backend */

/** Backend by name ("kvidx", "radix-lock", "naive-map"), or NULL. */
const struct kvi_trace_backend *kvi_trace_backend_by_name(const char *name);

/** Name of a backend. */
const char *kvi_trace_backend_name(const struct kvi_trace_backend *be);

/** Comma-separated list of every backend name. */
const char *kvi_trace_backend_names(void);

/**
 * Create an instance for workers 0 .. n_workers-1 with @p n_parts partitions
 * (kvidx: writer threads that will apply its events; baselines ignore it).
 * @param jump      kvidx query jump (0 = default)
 * @param key_seed  kvidx prefix-key seed (0 = random)
 */
struct kvi_trace_be *kvi_trace_be_create(const struct kvi_trace_backend *be, uint32_t n_workers, uint32_t n_parts,
                                         uint32_t block_size, uint32_t jump, uint64_t key_seed);

/** Destroy an instance that no writer pool refers to any more. */
void kvi_trace_be_destroy(struct kvi_trace_be *b);

/**
 * Apply one STORE or REMOVE entry directly on the calling thread, which must
 * be the only thread changing the instance (tests; the replay uses writers).
 * @return 0, or a negative errno for a rejected store (-ENOENT: unknown parent).
 */
int kvi_trace_be_apply(struct kvi_trace_be *b, const struct kvi_trace_entry *e);

/**
 * Scores of a query, sorted by worker. For kvidx the caller must be a
 * registered RCU reader (the section is taken inside).
 * @return the number of workers with depth >= 1 (only @p cap are written).
 */
size_t kvi_trace_be_scores(struct kvi_trace_be *b, struct kvi_bl_scratch *s, const uint64_t *content, size_t n,
                           struct kvi_bl_score *out, size_t cap);

/** Stores the instance rejected (unknown parent or invalid), so far. */
uint64_t kvi_trace_be_rejected(struct kvi_trace_be *b);

/** (block, worker) holdings in the instance. No writer may be running. */
uint64_t kvi_trace_be_holdings(struct kvi_trace_be *b);

struct kvi_trace_run_cfg {
    double window_ms;        /* the benchmark window the timeline is squeezed into */
    uint32_t readers;        /* replay lanes: RCU readers and ring producers (>= 1) */
    uint32_t writers;        /* event writer threads (1 .. KVI_WRITER_MAX) */
    uint32_t ring_capacity;  /* ops per (lane, writer) ring; 0 = the pool's default */
    double max_overrun;      /* lanes stop issuing at this multiple of the window (> 1) */
    uint32_t jump;           /* kvidx query jump (0 = default) */
    uint64_t key_seed;       /* kvidx prefix-key seed */
    /* called on the calling thread about every 100 ms while lanes run */
    kvi_trace_progress_fn progress;
    void *pctx;
    /* called after the drain, before teardown (tests inspect the final state) */
    void (*inspect)(void *ctx, struct kvi_trace_be *b);
    void *ictx;
};

struct kvi_trace_run_result {
    char backend[32];
    double window_ms;
    double elapsed_ms;     /* start -> every lane issued and every event applied */
    double issue_end_ms;   /* start -> last lane finished issuing */
    uint64_t ops_total, ops_issued;             /* queries + events */
    uint64_t events_total, events_issued;
    uint64_t queries_issued;
    uint64_t block_ops_total, block_ops_issued; /* query + stored + removed hashes */
    double offered_ops_per_s, achieved_ops_per_s;
    double offered_block_ops_per_s, achieved_block_ops_per_s;
    uint64_t backlog_events; /* queued, not applied, when the last lane finished issuing */
    double backlog_pct;      /* of all events */
    bool issue_ok;           /* everything issued within 1.01 x window */
    bool aborted;            /* lanes stopped at max_overrun x window */
    bool valid;              /* issue_ok, not aborted, backlog <= 5 % */
    bool keep_up;            /* elapsed <= 1.10 x window */
    uint32_t threads;        /* lanes + writers */
    uint32_t readers;        /* lanes */
    struct kvi_hist_summary find;      /* find_matches service time, ns */
    uint64_t lag_p99_ns, lag_max_ns;   /* issue time - due time */
    uint64_t hit_queries;              /* queries with some match */
    double mean_best_depth;            /* of hit queries, blocks */
    uint64_t rejected;                 /* stores the backend rejected */
    uint64_t stalls;                   /* submits that found a ring full */
    double writer_busy_ms;             /* writers' time applying ops, summed */
};

struct kvi_hist;

/**
 * Fill the figures of @p res that follow from the run's counts, the same way
 * for every mode (in process and end to end): totals and offered rates from
 * @p w and @p cfg, achieved rates, the issue and keep-up verdicts (issued
 * everything by 1.01 x the window; finished by 1.10 x), the find and lag
 * percentiles, and the mean best depth of hit queries.
 * Expects res->ops_issued, block_ops_issued, hit_queries, elapsed_ms and
 * issue_end_ms to be set already.
 */
void kvi_trace_result_derive(const struct kvi_trace_workload *w, const struct kvi_trace_run_cfg *cfg,
                             const struct kvi_hist *find, const struct kvi_hist *lag, uint64_t best_depth_sum,
                             struct kvi_trace_run_result *res);

/**
 * Replay @p w against a fresh instance of @p be (index, writer pool and lanes
 * are created and torn down here). The calling thread only waits and reports
 * progress; if it is a registered RCU reader, cfg->inspect may query kvidx.
 * @return 0, or -EINVAL for a bad configuration (errno-style).
 */
int kvi_trace_run(const struct kvi_trace_workload *w, const struct kvi_trace_backend *be,
                  const struct kvi_trace_run_cfg *cfg, struct kvi_trace_run_result *res);

/* The serial replay's figures (kvi_trace_serial). */
struct kvi_trace_serial_result {
    char backend[32];
    uint64_t queries, hit_queries;
    /* find as the timeline leaves the caches (first call), and the same query
     * again at once (warm: the floor of the index's own work) */
    struct kvi_hist_summary first, again; /* ns */
    uint64_t events, event_blocks; /* stored + removed hashes */
    double apply_ns_per_block;     /* the events' apply time per hash */
    uint64_t rejected;
};

/**
 * Serial replay: one thread applies every event of @p w and runs every
 * query, in timeline order, on a fresh instance of @p be (one partition, no
 * writer threads, no window). Each query is timed twice in a row. It gives
 * the index's own service time without another core writing, sleeping lanes
 * or a clock to keep, so the in-process replay's latencies can be read
 * against it. Runs on a thread of its own.
 * @return 0, or a negative errno (thread creation).
 */
int kvi_trace_serial(const struct kvi_trace_workload *w, const struct kvi_trace_backend *be, uint32_t jump,
                     uint64_t key_seed, struct kvi_trace_serial_result *res);

#endif
