/*
 * kvidx-bench demo: mock inference engines that fill a running kvidxd, so
 * that a fresh daemon shows workers, growing indexes and non-trivial /query
 * answers at once. It is a client of the daemon like any engine fleet: the
 * daemon has no demo code.
 *
 * Each demo engine is the trace benchmark's mock engine (bench/mock_engine.h:
 * a vLLM-like scheduler with prefix caching over a finite GPU block pool, LRU
 * eviction, opaque engine hashes) fed with a Mooncake trace (the built-in
 * synthetic one, or a JSONL file) whose sessions are spread over the engines.
 * The engines run online, in wall-clock time, at a fixed request rate, and
 * loop the trace forever; their caches persist across loops, so later loops
 * hit what earlier ones cached and evictions go on. Every KV event goes out
 * through the C publisher library (<kvidx/publisher.h>) on a real ZMQ PUB
 * socket bound on loopback, with a replay ROUTER, and every engine is
 * registered with POST /register (Dynamo dialect) at the daemon's URL.
 *
 * Tokens: the trace's rule (bench/trace.h) with all 512 tokens of hash id h
 * equal to h, so a prompt that hits is easy to type: 512 zeros are the shared
 * system prompt every request starts with. The demo logs a fresh
 * ready-to-paste curl line (hash ids some engine holds right now) every 30 s.
 *
 * DESIGN
 *   Threads: kvi_demo_start starts one demo thread that builds the workload
 *   (content hashes of every request), creates the publishers, registers
 *   every engine over HTTP, then drives every engine: each tick (20 ms) it
 *   submits the requests that are due, advances each engine to now, and
 *   flushes each publisher (one batch per engine per tick with events). Only
 *   the demo thread touches the engines, the publishers and the HTTP client.
 *   kvi_demo_destroy stops and joins the thread (the engines' registrations
 *   stay: the daemon sees their publishers go quiet).
 */
#ifndef KVI_BENCH_DEMO_H
#define KVI_BENCH_DEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/trace.h"

/** Demo settings; fill with kvi_demo_config_init, then override. */
struct kvi_demo_config {
    const char *url;         /* kvidxd's base URL ("http://127.0.0.1:8090") */
    const char *admin_token; /* bearer token for /register; NULL: none (a loopback daemon needs none) */
    const char *trace_path;  /* Mooncake JSONL; NULL = the built-in synthetic trace */
    uint32_t workers;        /* mock engines (4), instance ids first_instance.. */
    uint64_t first_instance; /* instance id of engine 0 (1) */
    const char *model;       /* model_name of the registrations ("demo") */
    uint32_t block_size;     /* engine block size, divides 512 (128) */
    uint32_t gpu_blocks;     /* GPU blocks per engine (8192) */
    double requests_per_s;   /* replay pace over all engines (20) */
    size_t synth_requests;   /* requests of the synthetic trace (3000) */
    uint64_t seed;           /* trace, partition and engine-hash seed (42) */
};

struct kvi_demo;

/** Fill @p c with the defaults listed at each field. */
void kvi_demo_config_init(struct kvi_demo_config *c);

/**
 * Load the demo's trace into an empty @p t: the file, or the synthetic trace.
 * @return 0, or a negative errno with a message in @p err.
 */
int kvi_demo_load_trace(const struct kvi_demo_config *c, struct kvi_trace *t, char *err, size_t err_len);

/** The workload settings the demo builds its requests' content hashes with. */
void kvi_demo_workload_config(const struct kvi_demo_config *c, struct kvi_trace_workload_cfg *wc);

/**
 * Create a demo: check the settings and load the trace (nothing runs yet).
 * @return the demo, or NULL with a message in @p err (bad settings, a trace
 *         that cannot be read or parsed).
 */
struct kvi_demo *kvi_demo_create(const struct kvi_demo_config *c, char *err, size_t err_len);

/**
 * Start the demo thread (see DESIGN); it registers the engines at
 * config.url and runs until kvi_demo_destroy.
 * @return 0 or -errno from pthread_create.
 */
int kvi_demo_start(struct kvi_demo *d);

/** Whether every engine is registered and the demo runs (any thread). */
bool kvi_demo_running(const struct kvi_demo *d);

/** The `kvidx-bench demo` subcommand: parse flags, run until SIGINT or SIGTERM. */
int kvi_bench_demo(int argc, char **argv);

/** Stop the engines, close their publishers and free the demo. NULL is a no-op. */
void kvi_demo_destroy(struct kvi_demo *d);

#endif
