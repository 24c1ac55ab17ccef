/*
 * kvidx-bench trace: Mooncake-trace replay benchmark (bench/ only).
 *
 * The pipeline, one module each:
 *   trace_load.c      Mooncake JSONL -> struct kvi_trace (requests + hash ids),
 *                     the built-in synthetic generator, length/duplication
 *                     expansion, trace statistics, SHA-256 of the file.
 *   trace_workload.c  struct kvi_trace -> struct kvi_trace_workload: content
 *                     hashes from synthesised tokens, sessions partitioned over
 *                     workers, one mock engine per worker (mock_engine.h), and
 *                     the merged, time-ordered timeline of queries and KV
 *                     events. The timeline is transport-neutral: every entry
 *                     carries worker id, engine hashes, content hashes and the
 *                     (request, position) its tokens can be rebuilt from
 *                     (kvi_trace_block_tokens), so a ZMQ publisher or an HTTP/2
 *                     client can replay the same timeline later.
 *   trace_replay.c    replays a workload against one backend (trace_replay.h).
 *   trace_io.c        the timeline to and from a file (--export / --import,
 *                     trace_io.h; format: bench/README.md#timeline-format).
 *   trace.c           the subcommand: options, sweep, tables, JSON, plots.
 *
 * A "hash id" (Mooncake) covers KVI_TRACE_ID_TOKENS = 512 tokens and names a
 * whole prefix; the engine block size B must divide 512, so one id is 512 / B
 * engine blocks.
 */
#ifndef KVI_BENCH_TRACE_H
#define KVI_BENCH_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVI_TRACE_ID_TOKENS 512u

/* ---- traces ---------------------------------------------------------------- */

struct kvi_trace_request {
    uint64_t t_ms;       /* arrival, ms since the trace start */
    uint64_t session;    /* session key; requests of one session share a worker */
    uint32_t input_len;  /* prompt tokens */
    uint32_t output_len; /* generated tokens */
    uint32_t n_ids;
    uint64_t ids_off;    /* first id in kvi_trace.ids */
};

struct kvi_trace {
    char name[64];     /* file name, or "synthetic" */
    char path[4096];   /* resolved path ("" for synthetic) */
    char sha256[65];   /* of the file ("" for synthetic) */
    struct kvi_trace_request *req;
    size_t n_req, cap_req;
    uint64_t *ids;
    size_t n_ids, cap_ids;
    uint64_t max_id;
    bool has_sessions; /* some line had a session_id */
};

struct kvi_trace_stats {
    size_t requests;
    uint64_t span_ms;
    double avg_input, avg_output, avg_ids;
    uint32_t max_input, max_ids;
    uint64_t total_ids, unique_ids;
    double reuse; /* share of ids whose whole prefix appeared in an earlier request */
};

/** Synthetic generator settings (conversation-like by default). */
struct kvi_trace_synth_cfg {
    size_t requests;     /* default 12,000 */
    double span_s;       /* default 3,600 s */
    double followup;     /* probability that a session has one more turn: 0.39 */
    double think_s;      /* mean gap between turns: 60 s */
    uint64_t seed;
};

/** Initialise an empty trace. */
void kvi_trace_init(struct kvi_trace *t);

/** Free a trace's memory (it is empty afterwards). */
void kvi_trace_free(struct kvi_trace *t);

/**
 * Append one JSONL line (a Mooncake request). Accepted keys: timestamp or
 * created_time (ms), input_length or input_tokens, output_length or
 * output_tokens, hash_ids (required), session_id (number or string); others
 * are skipped. input_length defaults to ids x 512.
 * @param err  receives a message on failure
 * @return 0, 1 for a blank line (skipped), or -EINVAL.
 */
int kvi_trace_parse_line(struct kvi_trace *t, const char *line, size_t len, char *err, size_t err_len);

/**
 * Load a Mooncake JSONL file and compute its SHA-256.
 * @return 0, -errno when the file cannot be read, or -EINVAL (message in
 *         @p err, with the line number).
 */
int kvi_trace_load(struct kvi_trace *t, const char *path, char *err, size_t err_len);

/** Defaults for the synthetic generator. */
void kvi_trace_synth_defaults(struct kvi_trace_synth_cfg *c);

/** Generate a synthetic conversation-like trace into an empty @p t. */
void kvi_trace_synthesize(struct kvi_trace *t, const struct kvi_trace_synth_cfg *c);

/**
 * Expand a trace as the reference benchmark does: every id h becomes
 * h*f .. h*f+f-1 and input lengths are multiplied by f (deeper prefixes, same
 * tree shape); then @p dup disjoint copies, copy c offsetting every id by
 * (max_id + 1) * c (and its sessions, so copies never share a worker by
 * session). Requests stay in time order. @p out must be empty.
 */
void kvi_trace_expand(const struct kvi_trace *in, uint32_t f, uint32_t dup, struct kvi_trace *out);

/** Statistics of a trace. */
void kvi_trace_stats(const struct kvi_trace *t, struct kvi_trace_stats *st);

/**
 * Find the default trace: ../shared/data/mooncake-traces/conversation_trace.jsonl
 * relative to the repository root (from this source file's location), the
 * working directory and its parents, and the executable's directory and its
 * parents. @return true with the path in @p out.
 */
bool kvi_trace_find_default(char *out, size_t cap);

/** SHA-256 of @p n bytes as 64 lowercase hex digits. */
void kvi_sha256_hex(const void *data, size_t n, char hex[65]);

/* ---- workloads --------------------------------------------------------------- */

enum kvi_trace_kind {
    KVI_TRACE_QUERY = 0,  /* find_matches(content[0..n)) at the request's arrival */
    KVI_TRACE_STORE = 1,  /* worker stored engine_hash[0..n) with content[0..n) */
    KVI_TRACE_REMOVE = 2, /* worker evicted engine_hash[0..n) */
};

/** One timeline entry. Arrays point into the workload and live as long as it. */
struct kvi_trace_entry {
    uint64_t t_ns;          /* simulated time since the start */
    uint32_t worker;        /* 0 .. n_workers * worker_dup - 1 */
    uint8_t kind;           /* enum kvi_trace_kind */
    bool has_parent;        /* STORE */
    uint16_t _pad;
    uint32_t n;             /* hashes */
    uint32_t req;           /* QUERY/STORE: request index in the (expanded) trace */
    uint32_t pos;           /* STORE: position of the first block in that request */
    uint64_t parent;        /* STORE: engine hash of the parent */
    const uint64_t *engine_hash; /* STORE/REMOVE */
    const uint64_t *content;     /* QUERY/STORE */
};

struct kvi_trace_workload_cfg {
    uint32_t n_workers;        /* unique simulated workers (default 128) */
    uint32_t worker_dup;       /* replicas of every worker's timeline (1) */
    uint32_t block_size;       /* engine block size, divides 512 (128) */
    uint32_t gpu_blocks;       /* mock engine pool per worker (2048) */
    double sim_ms;             /* trace span squeezed into this much engine time (30,000; 0 = as is) */
    double speedup;            /* engine speed-up over real time (10) */
    double prefill_tok_per_s;  /* real-time prefill throughput (20,000) */
    double decode_ms_per_tok;  /* real-time decode time per token (20) */
    bool distinct_tokens;      /* tokens of an id all differ (else all = id, the reference's rule) */
    uint64_t seed;             /* partitioning and engine hash seeds (42) */
};

struct kvi_trace_workload_stats {
    uint64_t queries, query_blocks;
    uint64_t stores, stored_blocks;
    uint64_t removes, removed_blocks;
    uint64_t dropped;      /* requests too large for the pool (queried, never cached) */
    uint64_t waited;       /* requests that waited for blocks */
    uint64_t hit_blocks;   /* prompt blocks the engines reused */
    uint64_t computed_blocks;
};

struct kvi_trace_chunk;

struct kvi_trace_workload {
    struct kvi_trace_workload_cfg cfg;
    const struct kvi_trace *trace;     /* the trace it was built from (not owned) */
    struct kvi_trace_entry *e;         /* sorted by (t_ns, worker, generation order) */
    size_t n;
    uint64_t span_ns;                  /* time of the last entry */
    uint32_t n_workers_total;          /* n_workers * worker_dup */
    uint32_t *worker_of_req;           /* unique worker (0..n_workers-1) of each request */
    uint64_t **req_content;            /* content hashes of every full block of prompt + output */
    uint32_t *req_blocks;              /* full prompt blocks of each request */
    struct kvi_trace_workload_stats st;
    struct kvi_trace_chunk *chunks;    /* storage of the hash arrays */
};

/** Defaults (as commented in the struct). */
void kvi_trace_workload_defaults(struct kvi_trace_workload_cfg *c);

/** Progress callback: done out of total units of work. */
typedef void (*kvi_trace_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/**
 * Build the timeline of @p t (which must outlive the workload).
 * @return 0, or -EINVAL (block size not dividing 512, zero workers, ...).
 */
int kvi_trace_workload_build(struct kvi_trace_workload *w, const struct kvi_trace *t,
                             const struct kvi_trace_workload_cfg *cfg, kvi_trace_progress_fn progress, void *pctx);

/**
 * Storage for @p n hashes that lives as long as @p w (freed by
 * kvi_trace_workload_free); for the builders of a workload (trace_workload.c,
 * trace_io.c). Aborts when out of memory.
 */
uint64_t *kvi_trace__alloc_hashes(struct kvi_trace_workload *w, size_t n);

/** Free a workload. */
void kvi_trace_workload_free(struct kvi_trace_workload *w);

/**
 * Tokens of block @p pos (block_size tokens) of request @p req: prompt tokens
 * synthesised from its hash ids, then output tokens synthesised per request.
 * kvi_hash_block of them is the block's content hash in the timeline, so a
 * publisher that sends tokens (RFC 1527) can be driven from the timeline.
 */
void kvi_trace_block_tokens(const struct kvi_trace_workload *w, uint32_t req, uint32_t pos, uint32_t *tokens);

#endif
