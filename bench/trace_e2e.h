/*
 * kvidx-bench trace --e2e: the trace timeline replayed end to end through a
 * running kvidxd (bench/ only).
 *
 * The same workload and lanes as the in-process replay (trace_replay.h), but
 * the event side goes through the real ingest path and the query side
 * through the real HTTP path:
 *   - every simulated worker is a C publisher (<kvidx/publisher.h>) with a
 *     replay ROUTER, bound on loopback, registered as Dynamo instance
 *     (pid << 32) + (run << 24) + 1 + worker (never an id already registered)
 *     of a fresh model through kvidxd's POST /register, so
 *     kvidxd's listeners subscribe to it; a lane publishes its workers'
 *     events (stored events carry their tokens, kvidxd hashes them) and
 *     sends the batches of everything due together before sleeping or
 *     querying;
 *   - queries are POST /query_by_hash with a msgpack body (model_name and
 *     the content hashes as a bin of little-endian u64, the exact input of
 *     the in-process find_matches), or POST /query with the tokens as a bin
 *     of little-endian int32 (--e2e-query tokens), over one HTTP/2 h2c
 *     connection per lane (bench/h2c.h), one request in flight per lane.
 * Latency = the lane's round trip (request written -> response complete);
 * the lane's CPU per query (building the body, the syscalls, decoding the
 * answer with msgpack-c) is measured too, so client cost is visible.
 * kvidxd's own handler time comes from its /metrics
 * (kvidx_query_duration_seconds).
 *
 * Backlog and drain come from /metrics: events decoded
 * (kvidx_events_total), ops handed to and finished by the writers
 * (kvidx_listener_ops_*_total), all as deltas over the run. Backlog when the
 * last lane finished issuing = events published - events decoded + ops not
 * yet applied; elapsed = start -> the first /metrics answer showing every
 * published event decoded and applied (polled every few ms: resolution about
 * one poll). Same gates as in process: issued within 1.01 x the window,
 * backlog <= 5 %, keep-up within 1.10 x the window.
 *
 * Before the clock starts, every publisher sends empty batches until
 * kvidxd's applied-batch counter shows all of them (every listener is
 * connected and caught up); after the run, every instance is unregistered.
 * The publishers bind on 127.0.0.1: kvidxd must run on this machine.
 */
#ifndef KVI_BENCH_TRACE_E2E_H
#define KVI_BENCH_TRACE_E2E_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/trace.h"
#include "bench/trace_replay.h"

enum kvi_e2e_query {
    KVI_E2E_QUERY_HASH = 0, /* POST /query_by_hash, content hashes */
    KVI_E2E_QUERY_TOKENS,   /* POST /query, tokens */
};

struct kvi_e2e_cfg {
    const char *url;          /* http://host:port of a running kvidxd; NULL with spawn */
    const char *spawn;        /* kvidxd binary to start on an ephemeral port, or NULL */
    uint32_t spawn_writers;   /* its --threads (writer threads) */
    enum kvi_e2e_query query;
};

/** End-to-end figures beyond struct kvi_trace_run_result. */
struct kvi_e2e_extra {
    uint64_t query_errors;        /* transport errors and non-200 answers */
    char first_error[256];
    double client_cpu_us;         /* lane CPU per query: body, syscalls, answer decoding */
    double publish_cpu_s;         /* lanes' CPU spent publishing events (tokens, msgpack, ZMQ sends) */
    double server_handler_us;     /* kvidxd's mean handler time per query (its /metrics) */
    double server_cpu_s;          /* kvidxd's user + system CPU over the run (spawned only; else -1) */
    uint64_t batches, bytes;      /* published */
    uint64_t gaps, lost, replays; /* kvidxd's listener counters over the run */
    double hit_pct;               /* queries with a match */
    double setup_ms;              /* publishers, registrations, handshake */
    double drain_poll_ms;         /* mean /metrics round trip while draining (elapsed resolution) */
    bool drained;                 /* every published event was applied */
    bool ran;                     /* the lanes ran (else only first_error is set) */
};

struct kvi_e2e;

/**
 * Connect to kvidxd (or start it with cfg->spawn and wait for its port) and
 * check /health. @return the handle, or NULL with a message in @p err.
 */
struct kvi_e2e *kvi_e2e_open(const struct kvi_e2e_cfg *cfg, char *err, size_t err_len);

/** Stop a spawned kvidxd (SIGTERM) and free the handle (NULL is a no-op). */
void kvi_e2e_close(struct kvi_e2e *e);

/** The base URL in use. */
const char *kvi_e2e_url(const struct kvi_e2e *e);

/** Process id of the spawned kvidxd, or 0 when kvidxd was reached by URL. */
int kvi_e2e_pid(const struct kvi_e2e *e);

/**
 * Sum of the samples of metric @p name in a Prometheus text body whose label
 * set contains the text @p labels (NULL: every sample; "": unlabelled ones
 * only). @return the sum (0 when there is none).
 */
double kvi_e2e_metric_sum(const char *body, const char *name, const char *labels);

struct kvi_http_client;

/** A growing NUL-terminated text (an HTTP body). The owner frees p. */
struct kvi_e2e_text {
    char *p;
    size_t len, cap;
};

/** Body callback (a kvi_http_body_fn) that appends to the struct kvi_e2e_text @p ud. @return 0. */
int kvi_e2e_text_sink(void *ud, const void *data, size_t len);

/**
 * GET @p base + @p path with @p http (a client is used by one thread at a
 * time), the body going to fn(ud). @return 0, or the client's error with
 * "GET url: status error" in @p err (when err is not NULL).
 */
int kvi_e2e_get(struct kvi_http_client *http, const char *base, const char *path,
                int (*fn)(void *ud, const void *data, size_t len), void *ud, char *err, size_t err_len);

/** POST a JSON body, as kvi_e2e_get (the answer's body is dropped). */
int kvi_e2e_post_json(struct kvi_http_client *http, const char *base, const char *path, const char *json, char *err,
                      size_t err_len);

/**
 * Replay @p w through kvidxd at cfg->window_ms (cfg->readers lanes; writers,
 * ring capacity, jump and key seed are kvidxd's own and ignored). Fills @p res
 * as kvi_trace_run does (backend "kvidxd-e2e"; writer_busy_ms and stalls
 * from kvidxd's /metrics; threads = lanes + kvidxd's writers) and @p x.
 * @return 0, -EINVAL (bad configuration), or a negative errno when the
 *         setup failed (message in x->first_error).
 */
int kvi_e2e_run(struct kvi_e2e *e, const struct kvi_trace_workload *w, const struct kvi_trace_run_cfg *cfg,
                struct kvi_trace_run_result *res, struct kvi_e2e_extra *x);

/** Print @p x as one indented line under a result row. */
void kvi_e2e_print(const struct kvi_e2e_extra *x);

#endif
