/*
 * kvidx-bench soak: a long end-to-end run against a spawned kvidxd, then four
 * checks (bench/ only; bench/soak.sh wraps it, issue 7 §4).
 *
 * THE LOAD
 *   The trace (Mooncake JSONL or the built-in generator) is replayed in a loop
 *   for the whole duration at a steady rate: one loop takes cfg.loop_s real
 *   seconds and cfg.sim_ms engine milliseconds. Every loop gets fresh hash ids
 *   (offset by (max_id + 1) * loop) and fresh sessions (each session goes to a
 *   worker drawn from (session, loop)), so engines keep computing and storing
 *   new blocks. One mock engine per worker (bench/mock_engine.h) lives for the
 *   whole run: its pool fills during the first loop, and from then on every
 *   admission evicts, so stores and removals go on at a steady rate while the
 *   number of held blocks stays bounded.
 *   The engines run in real time on `lanes` threads (lane k owns the workers
 *   w with w % lanes == k): a lane submits each request when it is due (after
 *   a POST /query_by_hash of its prompt's content hashes over the lane's HTTP/2
 *   h2c connection, msgpack body) and advances its engines every tick. Every
 *   event an engine emits is published at once by the worker's C publisher
 *   (<kvidx/publisher.h>, ZMQ, stored events with their tokens) and applied to
 *   the model; pending batches are flushed before each query and each sleep.
 *
 * THE CHECKS (after the run, once kvidxd has applied every published event)
 *   1. no errors: every query answered 200 with a decodable score map naming
 *      only soak workers; no publish error; kvidxd alive at every sample; no
 *      batch lost, malformed or undecodable, no replay fallback or overrun
 *      (gaps are allowed only when replay filled them: lost == 0); no invalid
 *      or unknown event, no dropped block.
 *   2. RSS flat: kvidxd's VmRSS, sampled every cfg.rss_interval_s (with the
 *      ingest backlog at that moment). After the warm-up (cfg.warmup_frac of
 *      the run) each sample is read as the median of itself and its two
 *      neighbours (a one-sample peak from a burst queued in ZMQ is not
 *      growth); the first such value is the level, and every later one must
 *      stay <= level * (1 + cfg.rss_bound).
 *   3. /dump equal to the model: the model holds, per worker, every block
 *      published as stored and not removed since, with its parent, content
 *      hash and depth. GET /dump is decoded as it streams (api/codec_dump.h)
 *      and compared record by record: exact equality (no block missing, none
 *      extra, none listed twice, same parent, content hash and depth). The
 *      model is itself checked against the engines (each engine's cached set
 *      is exactly the model's set for its worker).
 *   4. counters balance, from kvidxd's /metrics over the run: per type,
 *      events decoded = events published (counted at the publishers);
 *      ops submitted = events published = applied + rejected (parent not
 *      found + invalid), with rejected = what the model rejected; blocks
 *      stored and hashes removed equal the model's counts.
 *
 * THREADS: kvi_soak_run is called from one thread; it starts the lanes and
 * joins them before returning. The model and comparator are single-threaded
 * objects (the soak gives each worker's part of the model to one lane).
 */
#ifndef KVI_BENCH_SOAK_H
#define KVI_BENCH_SOAK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- the model and the /dump comparator ------------------------------------------ */

/**
 * Expected index state: per worker, the set of blocks it holds, keyed by
 * engine hash, with parent engine hash (or root), content hash and depth.
 * Semantics follow kvi_index_store / kvi_index_remove for one (instance,
 * dp_rank 0, device tier) slot, except that a removal does not cascade: it
 * counts the removal of a block that still has held children in
 * kvi_soak_model_orphaning_removes instead (mock engines evict leaves first,
 * so that count stays 0 in a soak).
 * Not thread-safe; calls on different workers may run on different threads.
 */
struct kvi_soak_model;

/** Create an empty model of @p n_workers workers. Aborts on out-of-memory. */
struct kvi_soak_model *kvi_soak_model_create(uint32_t n_workers);

/** Free a model (NULL is a no-op). */
void kvi_soak_model_destroy(struct kvi_soak_model *m);

/**
 * Store a run of @p n blocks for worker @p w: block i has engine hash eh[i],
 * content hash content[i], and parent eh[i - 1] (block 0: @p parent when
 * @p has_parent, else it is a root). Blocks already held are kept as they are
 * (idempotent re-store).
 * @return 0, -ENOENT (has_parent and the parent is not held: nothing stored),
 *         -EINVAL (w out of range, n == 0, or the run repeats an engine hash
 *         or contains its parent: nothing stored).
 */
int kvi_soak_model_store(struct kvi_soak_model *m, uint32_t w, bool has_parent, uint64_t parent,
                         const uint64_t *eh, const uint64_t *content, uint32_t n);

/**
 * Remove @p n engine hashes from worker @p w (unknown ones are skipped).
 * @return the number of hashes that were held.
 */
uint32_t kvi_soak_model_remove(struct kvi_soak_model *m, uint32_t w, const uint64_t *eh, uint32_t n);

/** Blocks worker @p w holds (0 when out of range). */
size_t kvi_soak_model_blocks(const struct kvi_soak_model *m, uint32_t w);

/** Blocks held by all workers. */
size_t kvi_soak_model_total(const struct kvi_soak_model *m);

/** Whether worker @p w holds @p eh. */
bool kvi_soak_model_holds(const struct kvi_soak_model *m, uint32_t w, uint64_t eh);

/**
 * Iterate over worker @p w's engine hashes: *pos = 0 first, then call while
 * it returns true. The model must not change during an iteration.
 */
bool kvi_soak_model_next(const struct kvi_soak_model *m, uint32_t w, size_t *pos, uint64_t *eh);

/** Removals of a block that still had held children (see above). */
uint64_t kvi_soak_model_orphaning_removes(const struct kvi_soak_model *m);

#define KVI_SOAK_DIFF_SHOW 8

/** Outcome of a dump comparison. */
struct kvi_soak_diff {
    uint64_t dump_blocks; /* stored records in the dump (every namespace) */
    uint64_t matched;     /* records equal to a model block */
    uint64_t missing;     /* model blocks the dump does not list */
    uint64_t extra;       /* records the model has no block for (unknown namespace, worker or block too) */
    uint64_t wrong;       /* records of a model block with another parent, content hash or depth */
    uint64_t duplicates;  /* records of a block already listed */
    bool decoded;         /* the whole body decoded */
    bool equal;           /* decoded, and nothing missing, extra, wrong or duplicated */
    uint32_t n_shown;     /* first differences, one line each */
    char shown[KVI_SOAK_DIFF_SHOW][224];
    char error[256];      /* why decoding failed ("" when it did not) */
};

/**
 * Streaming comparison of a GET /dump body with a model whose worker w is
 * Dynamo instance @p id0 + w of namespace "<model_name>:default" (dp_rank 0,
 * device tier). The model must not change until kvi_soak_cmp_end.
 */
struct kvi_soak_cmp;

/** Start a comparison (resets @p d). Aborts on out-of-memory. */
struct kvi_soak_cmp *kvi_soak_cmp_begin(struct kvi_soak_model *m, const char *model_name, uint64_t id0,
                                        struct kvi_soak_diff *d);

/**
 * Feed the next @p len bytes of the body.
 * @return 0, or -EBADMSG (the body is malformed: d->error says why; sticky).
 */
int kvi_soak_cmp_feed(struct kvi_soak_cmp *c, const void *data, size_t len);

/**
 * The body ended: count the model blocks never listed, fill d->equal and
 * free @p c.
 * @return 0 when the body decoded completely (d->equal tells the verdict),
 *         or -EBADMSG.
 */
int kvi_soak_cmp_end(struct kvi_soak_cmp *c);

/* ---- the RSS verdict ------------------------------------------------------------- */

/** What kvi_soak_rss_judge found. */
struct kvi_soak_rss {
    uint64_t max_kb;           /* every sample */
    uint32_t after;            /* samples at or after the warm-up */
    uint64_t level_kb;         /* the first of them (as a median, below) */
    uint64_t min_after_kb, max_after_kb; /* of the medians after the warm-up */
    uint64_t raw_max_after_kb; /* of the raw samples after the warm-up */
    double slope_kb_per_min;   /* least squares over the raw samples after the warm-up */
    bool ok;                   /* at least 3 samples after the warm-up, max_after <= level * (1 + bound) */
};

/**
 * Judge an RSS series (@p n samples of @p kb at times @p t_s, ascending).
 * After the warm-up (t_s >= @p warm_s) each sample counts as the median of
 * itself and its neighbours after the warm-up (the first and the last count
 * as they are), so a value holds only when two consecutive samples reach it:
 * a one-sample peak (a burst of events queued in ZMQ for a moment) is not
 * growth, a level that stays is.
 */
void kvi_soak_rss_judge(const double *t_s, const uint64_t *kb, size_t n, double warm_s, double bound,
                        struct kvi_soak_rss *out);

/* ---- the soak -------------------------------------------------------------------- */

struct kvi_soak_cfg {
    double seconds;          /* run length (> 0) */
    const char *kvidxd;      /* kvidxd binary to spawn on an ephemeral loopback port */
    const char *trace;       /* Mooncake JSONL path, "synthetic", or NULL for the default trace
                                (kvi_trace_find_default, else the generator) */
    size_t synth_requests;   /* requests of the generator (12,000) */
    uint32_t workers;        /* simulated workers = publishers (128) */
    uint32_t block_size;     /* engine block size, divides 512 (128) */
    uint32_t gpu_blocks;     /* mock engine pool per worker (2,048) */
    uint32_t lanes;          /* threads driving engines and queries (2) */
    uint32_t writers;        /* kvidxd --threads (1) */
    uint32_t replay_batches; /* replay ring of each publisher, in batches (64) */
    double loop_s;           /* real seconds per trace loop (30) */
    double sim_ms;           /* engine milliseconds per trace loop (30,000) */
    double warmup_frac;      /* share of the run before the RSS level is taken (0.2) */
    double rss_bound;        /* allowed growth over the level (0.10 = +10 %) */
    double rss_interval_s;   /* RSS sampling period (5) */
    double report_s;         /* progress line period; 0 = none (30) */
    uint64_t seed;           /* worker assignment and engine hash seeds (42) */
    const char *rss_csv;     /* write the RSS series here (t_s,rss_kb), or NULL */
    FILE *log;               /* progress and summary; NULL = silent */
};

/** Fill @p c with the defaults listed above (kvidxd NULL, seconds 60). */
void kvi_soak_defaults(struct kvi_soak_cfg *c);

/** Figures and verdicts of a soak. */
struct kvi_soak_result {
    double seconds;                    /* measured run length (load phase) */
    uint64_t loops_started;            /* trace loops begun (the last one partly) */
    uint64_t requests, dropped;        /* submitted to engines; too large for a pool */
    uint64_t queries, query_errors, hits;
    uint64_t query_p50_ns, query_p99_ns, query_max_ns;
    uint64_t lag_p99_ns, lag_max_ns;   /* request issue time - due time */
    uint64_t publish_errors;
    uint64_t ev_stored, ev_removed;    /* events published, per type */
    uint64_t blocks_stored, blocks_removed; /* hashes in those events */
    uint64_t pub_events, pub_batches, pub_bytes; /* the publishers' own counters */
    uint64_t model_rejected;           /* stores the model rejected (expected 0) */
    uint64_t model_applied_blocks, model_removed_known;
    /* kvidxd's /metrics over the run */
    uint64_t k_ev_stored, k_ev_removed, k_ev_other; /* decoded; other = cleared + unknown + invalid */
    uint64_t k_ops_submitted, k_ops_applied, k_ops_rejected;
    uint64_t k_blocks_stored, k_hashes_removed, k_blocks_dropped, k_unknown_blocks;
    uint64_t k_gaps, k_replays, k_lost, k_bad;  /* bad = malformed + decode errors + fallbacks + ... */
    double drain_s;                    /* end of load -> everything applied */
    double lanes_cpu_s, kvidxd_cpu_s;  /* CPU time of the lanes and of kvidxd during the load (-1: unknown) */
    uint64_t bench_peak_rss_kb;        /* this process's VmHWM (publishers' replay rings, engines, model) */
    /* RSS (kB) */
    uint64_t rss_start_kb;             /* before the load */
    uint64_t rss_level_kb;             /* first sample after the warm-up */
    uint64_t rss_max_kb;               /* whole run */
    uint64_t rss_max_after_kb, rss_min_after_kb; /* after the warm-up, each sample as the median of
                                                    it and its neighbours (the check) */
    uint64_t rss_raw_max_after_kb;     /* after the warm-up, raw samples */
    uint64_t backlog_max;              /* most events published and not yet applied at a sample */
    uint64_t index_level_kb, index_end_kb; /* kvidx_index_bytes at the level's sample and at the end */
    uint64_t alloc_level_kb, alloc_end_kb; /* kvidx_memory_allocated_bytes (jemalloc; 0 without) */
    uint64_t rss_end_kb;               /* after the drain */
    double rss_slope_kb_per_min;       /* least squares over the post-warm-up samples */
    uint32_t rss_samples;
    uint64_t model_blocks;             /* held at the end */
    struct kvi_soak_diff diff;
    bool engines_match;                /* every engine's cached set == the model's */
    bool kvidxd_alive;
    /* verdicts */
    bool ok_errors, ok_rss, ok_dump, ok_counters, ok;
    char first_error[256];
};

/**
 * Run a soak (see the top of this file). Progress and the human summary go to
 * cfg->log.
 * @return 0 when the soak ran (res->ok says whether every check passed),
 *         -EINVAL (bad configuration), or a negative errno when the setup
 *         failed (trace, kvidxd, publishers, registration; res->first_error
 *         says why).
 */
int kvi_soak_run(const struct kvi_soak_cfg *cfg, struct kvi_soak_result *res);

/** Print the one-line JSON summary of @p r (ends with a newline). */
void kvi_soak_print_json(FILE *f, double minutes, const struct kvi_soak_result *r);

/** The `kvidx-bench soak` subcommand. @return a process exit code. */
int kvi_bench_soak(int argc, char **argv);

#endif
