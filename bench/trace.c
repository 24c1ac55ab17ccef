/*
 * kvidx-bench trace: Mooncake-trace replay, in process (issue: trace bench).
 *
 * Workload and rules follow ../shared/reference/performance-anchors.md §2.2–2.7:
 * tokens synthesised per hash id (512 each) and re-chunked at the engine block
 * size, sessions partitioned over N workers, one mock engine per worker
 * (finite pool, prefix caching, LRU eviction, opaque engine hashes) emitting
 * stored / removed events, queries and events merged and squeezed into the
 * benchmark window, replayed by reader lanes through kvidx's real writer
 * rings. Block-ops = query hashes + stored hashes + removed hashes. A run is
 * valid when everything was issued within 1.01 x the window and at most 5 %
 * of the events were still queued when issuing ended; it keeps up when the
 * drain finished within 1.10 x the window.
 *
 * Modes: a sweep over log-spaced windows (default), kvidx from the highest
 * load down (stopping after --sweep-stop good steps in a row), baselines from
 * the lowest load up (stopping after two steps that do not keep up); or one
 * window (--window-ms). Prints a row per run, a summary, writes the sweep
 * as JSON and plots, and ends with one JSON line for kvidx's highest load
 * that keeps up.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/plot.h"
#include "bench/trace.h"
#include "bench/trace_e2e.h"
#include "bench/trace_io.h"
#include "bench/trace_replay.h"
#include "engine/common.h"
#include "engine/index.h"

#define MAX_BACKENDS 3
#define MAX_STEPS 64

struct trace_opts {
    char trace[PATH_MAX];
    size_t synth_requests;
    uint32_t trace_dup, length_factor;
    struct kvi_trace_workload_cfg wl;
    uint32_t readers, writers, ring_capacity, jump;
    bool serial;    /* --serial: one thread applies and queries (kvi_trace_serial) */
    char export_path[PATH_MAX]; /* --export: write the timeline there and stop */
    char import_path[PATH_MAX]; /* --import: the timeline from there, not from a trace */
    char backends[256];
    double window_ms;
    double sweep_min_ms, sweep_max_ms;
    uint32_t sweep_steps, sweep_stop;
    double max_overrun;
    char out[PATH_MAX];
    bool plot, progress;
    /* --e2e: end to end through kvidxd (trace_e2e.h) */
    char e2e_url[256], e2e_spawn[PATH_MAX];
    enum kvi_e2e_query e2e_query;
    struct kvi_e2e *e2e;
};

/* ---- progress bar (stderr, only on a terminal) -------------------------------- */

struct progress {
    bool on;
    char label[96];
    int last_pct;
};

static void progress_draw(void *ctx, uint64_t done, uint64_t total)
{
    struct progress *p = ctx;
    if (!p->on || total == 0)
        return;
    int pct = (int)(100.0 * (double)done / (double)total);
    if (pct == p->last_pct)
        return;
    p->last_pct = pct;
    char bar[31];
    int fill = pct * 30 / 100;
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r\033[K%-44s [%s] %3d%%", p->label, bar, pct);
    fflush(stderr);
}

static void progress_start(struct progress *p, const char *label)
{
    snprintf(p->label, sizeof p->label, "%s", label);
    p->last_pct = -1;
    progress_draw(p, 0, 1);
}

static void progress_clear(struct progress *p)
{
    if (p->on) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
}

/* ---- options ---------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvidx-bench trace [options]\n"
            "\n"
            "Replays a Mooncake trace against kvidx's index and two baselines in process:\n"
            "mock engines (prefix caching, LRU eviction of free blocks, opaque engine\n"
            "hashes) turn the requests into stored/removed events; reader lanes issue\n"
            "find_matches at their due times; events go through the writer rings.\n"
            "Block-ops = query hashes + stored hashes + removed hashes.\n"
            "\n"
            "trace and workload:\n"
            "  --trace PATH|synthetic  Mooncake JSONL (default: ../shared/data/mooncake-traces/\n"
            "                          conversation_trace.jsonl beside the repository, else the\n"
            "                          built-in conversation-like generator)\n"
            "  --synthetic-requests N  requests of the generator (12000)\n"
            "  --workers N             simulated workers, sessions partitioned at random (128)\n"
            "  --worker-dup D          replicas of every worker's timeline (1)\n"
            "  --trace-dup C           disjoint copies of the trace (1)\n"
            "  --length-factor F       each hash id becomes F ids: deeper prefixes (1)\n"
            "  --block-size B          engine block size in tokens, divides 512 (128)\n"
            "  --gpu-blocks N          mock engine pool per worker (2048)\n"
            "  --sim-ms MS             engine time the trace span is squeezed into (30000)\n"
            "  --speedup X             engine speed-up over real time (10)\n"
            "  --prefill-tps T         prefill tokens/s, real time (20000)\n"
            "  --decode-ms MS          decode ms per output token, real time (20)\n"
            "  --distinct-tokens       tokens of an id all differ (default: all equal the id,\n"
            "                          the reference benchmark's rule)\n"
            "  --seed S                partitioning and engine-hash seed (42)\n"
            "  --export FILE           write the replay's exact timeline to FILE and stop (no\n"
            "                          replay): msgpack, format \"kvidx-timeline\" version 1,\n"
            "                          specified in bench/README.md#timeline-format\n"
            "  --import FILE           replay the timeline of FILE instead of simulating a trace\n"
            "                          (the trace and workload options above do not apply; in\n"
            "                          process or --serial, not --e2e, which needs the tokens)\n"
            "\n"
            "replay:\n"
            "  --backends LIST         of kvidx,radix-lock,naive-map (all)\n"
            "  --readers R             replay lanes: RCU readers and ring producers (1)\n"
            "  --writers W             event writer threads = kvidx partitions (1)\n"
            "  --ring-capacity N       ops per (lane, writer) ring (4096)\n"
            "  --jump J                kvidx query jump (%u)\n"
            "  --max-overrun X         lanes give up at X times the window (3)\n"
            "  --serial                no window: one thread applies every event and runs every\n"
            "                          query in timeline order, each query timed twice (first\n"
            "                          call, then warm): the index's own service time\n"
            "  --window-ms MS          one run per backend at this window (no sweep)\n"
            "  --sweep-min-ms MS       shortest window = highest load (62.5)\n"
            "  --sweep-max-ms MS       longest window = lowest load (4000)\n"
            "  --sweep-steps N         log-spaced windows (7)\n"
            "  --sweep-stop N          kvidx stops after N good steps in a row (3)\n"
            "  --out PREFIX            sweep files PREFIX.{json,png,svg,gp,dat}\n"
            "                          (default: trace-sweep beside the executable)\n"
            "  --no-plot               skip gnuplot\n"
            "  --no-progress           no progress bar (it is off anyway when stderr is not a TTY)\n"
            "\n"
            "end to end (kvidx only):\n"
            "  --e2e URL               replay through a running kvidxd (http://HOST:PORT on this\n"
            "                          machine): events from one C publisher per worker over ZMQ,\n"
            "                          registered with POST /register; queries over HTTP/2 (h2c),\n"
            "                          one connection per lane; find = the query's round trip\n"
            "  --e2e-spawn PATH        start this kvidxd binary on a free port for the run instead\n"
            "                          (--threads = --writers), and stop it at the end\n"
            "  --e2e-query hash|tokens POST /query_by_hash with content hashes (default, the exact\n"
            "                          in-process input) or POST /query with the tokens\n"
            "\n"
            "A run is valid when every op was issued within 1.01 x the window and at most\n"
            "5 %% of the events were still queued then; it keeps up when every event was\n"
            "applied within 1.10 x the window. The last line is a JSON summary of kvidx's\n"
            "highest load that keeps up.\n"
            "\n"
            "example (30-60 s on a 2-vCPU VM):\n"
            "  build/release/bench/kvidx-bench trace\n"
            "expect: the conversation trace (12,031 requests) replayed as 12,031 queries,\n"
            "44,020 stored and 9,429 removed events = 65,480 ops and 3.07 M block-ops per\n"
            "replay; one row per run (offered and achieved M block-ops/s, per core, find\n"
            "p50/p95/p99/p99.9/max in us, backlog, issue lag, writer utilisation, verdict);\n"
            "a summary of each backend's highest load that keeps up and its peak, with\n"
            "kvidx/baseline ratios; trace-sweep.{json,png,svg} beside the executable; and\n"
            "the JSON line. wr_busy near 100 %% means event application is the limit,\n"
            "a large lag99 with idle writers means the lanes (queries) are.\n"
            "long sweep (more load per replay, more lanes and writers):\n"
            "  kvidx-bench trace --worker-dup 8 --readers 2 --writers 2 \\\n"
            "      --sweep-min-ms 250 --sweep-max-ms 24000 --sweep-steps 12 --sweep-stop 5\n",
            KVI_DEFAULT_JUMP);
}

static bool parse_u32(const char *s, uint32_t *v, uint32_t min)
{
    char *e;
    errno = 0;
    unsigned long x = strtoul(s, &e, 10);
    if (errno || *e || e == s || x > UINT32_MAX || x < min)
        return false;
    *v = (uint32_t)x;
    return true;
}

static bool parse_pos(const char *s, double *v)
{
    char *e;
    double x = strtod(s, &e);
    if (*e || e == s || !(x > 0) || isinf(x))
        return false;
    *v = x;
    return true;
}

static bool parse_nonneg(const char *s, double *v)
{
    char *e;
    double x = strtod(s, &e);
    if (*e || e == s || !(x >= 0) || isinf(x))
        return false;
    *v = x;
    return true;
}

static void default_out(char *out, size_t cap)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            *slash = 0;
            snprintf(out, cap, "%.*s/trace-sweep", (int)(cap - 16), exe);
            return;
        }
    }
    snprintf(out, cap, "trace-sweep");
}

enum {
    O_TRACE = 256, O_SYNTH_REQ, O_WORKERS, O_WORKER_DUP, O_TRACE_DUP, O_LENGTH, O_BLOCK, O_GPU, O_SIM, O_SPEEDUP,
    O_PREFILL, O_DECODE, O_DISTINCT, O_SEED, O_BACKENDS, O_READERS, O_WRITERS, O_RING, O_JUMP, O_OVERRUN,
    O_WINDOW, O_SMIN, O_SMAX, O_STEPS, O_STOP, O_OUT, O_NOPLOT, O_NOPROG, O_E2E, O_E2E_SPAWN, O_E2E_QUERY,
    O_SERIAL, O_EXPORT, O_IMPORT,
};

/* @return 0 to run, 1 after --help, 2 on a usage error */
static int parse_opts(int argc, char **argv, struct trace_opts *o)
{
    memset(o, 0, sizeof *o);
    kvi_trace_workload_defaults(&o->wl);
    o->synth_requests = 12000;
    o->trace_dup = o->length_factor = 1;
    o->readers = o->writers = 1;
    snprintf(o->backends, sizeof o->backends, "%s", kvi_trace_backend_names());
    o->sweep_min_ms = 62.5;
    o->sweep_max_ms = 4000;
    o->sweep_steps = 7;
    o->sweep_stop = 3;
    o->max_overrun = 3;
    o->plot = true;
    o->progress = isatty(STDERR_FILENO);
    default_out(o->out, sizeof o->out);
    static const struct option opts[] = {
        {"trace", required_argument, NULL, O_TRACE},
        {"synthetic-requests", required_argument, NULL, O_SYNTH_REQ},
        {"workers", required_argument, NULL, O_WORKERS},
        {"worker-dup", required_argument, NULL, O_WORKER_DUP},
        {"trace-dup", required_argument, NULL, O_TRACE_DUP},
        {"length-factor", required_argument, NULL, O_LENGTH},
        {"block-size", required_argument, NULL, O_BLOCK},
        {"gpu-blocks", required_argument, NULL, O_GPU},
        {"sim-ms", required_argument, NULL, O_SIM},
        {"speedup", required_argument, NULL, O_SPEEDUP},
        {"prefill-tps", required_argument, NULL, O_PREFILL},
        {"decode-ms", required_argument, NULL, O_DECODE},
        {"distinct-tokens", no_argument, NULL, O_DISTINCT},
        {"seed", required_argument, NULL, O_SEED},
        {"backends", required_argument, NULL, O_BACKENDS},
        {"readers", required_argument, NULL, O_READERS},
        {"writers", required_argument, NULL, O_WRITERS},
        {"ring-capacity", required_argument, NULL, O_RING},
        {"jump", required_argument, NULL, O_JUMP},
        {"max-overrun", required_argument, NULL, O_OVERRUN},
        {"window-ms", required_argument, NULL, O_WINDOW},
        {"sweep-min-ms", required_argument, NULL, O_SMIN},
        {"sweep-max-ms", required_argument, NULL, O_SMAX},
        {"sweep-steps", required_argument, NULL, O_STEPS},
        {"sweep-stop", required_argument, NULL, O_STOP},
        {"out", required_argument, NULL, O_OUT},
        {"no-plot", no_argument, NULL, O_NOPLOT},
        {"no-progress", no_argument, NULL, O_NOPROG},
        {"e2e", required_argument, NULL, O_E2E},
        {"e2e-spawn", required_argument, NULL, O_E2E_SPAWN},
        {"e2e-query", required_argument, NULL, O_E2E_QUERY},
        {"serial", no_argument, NULL, O_SERIAL}, /* opts[c - O_TRACE]: enum order */
        {"export", required_argument, NULL, O_EXPORT},
        {"import", required_argument, NULL, O_IMPORT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        bool ok = true;
        uint32_t u;
        switch (c) {
        case O_TRACE: snprintf(o->trace, sizeof o->trace, "%s", optarg); break;
        case O_SYNTH_REQ: ok = parse_u32(optarg, &u, 1); o->synth_requests = u; break;
        case O_WORKERS: ok = parse_u32(optarg, &o->wl.n_workers, 1); break;
        case O_WORKER_DUP: ok = parse_u32(optarg, &o->wl.worker_dup, 1); break;
        case O_TRACE_DUP: ok = parse_u32(optarg, &o->trace_dup, 1); break;
        case O_LENGTH: ok = parse_u32(optarg, &o->length_factor, 1); break;
        case O_BLOCK: ok = parse_u32(optarg, &o->wl.block_size, 1) && KVI_TRACE_ID_TOKENS % o->wl.block_size == 0; break;
        case O_GPU: ok = parse_u32(optarg, &o->wl.gpu_blocks, 1); break;
        case O_SIM: ok = parse_nonneg(optarg, &o->wl.sim_ms); break;
        case O_SPEEDUP: ok = parse_pos(optarg, &o->wl.speedup); break;
        case O_PREFILL: ok = parse_pos(optarg, &o->wl.prefill_tok_per_s); break;
        case O_DECODE: ok = parse_nonneg(optarg, &o->wl.decode_ms_per_tok); break;
        case O_DISTINCT: o->wl.distinct_tokens = true; break;
        case O_SEED: o->wl.seed = strtoull(optarg, NULL, 0); break;
        case O_BACKENDS: snprintf(o->backends, sizeof o->backends, "%s", optarg); break;
        case O_READERS: ok = parse_u32(optarg, &o->readers, 1) && o->readers < 1000; break;
        case O_WRITERS: ok = parse_u32(optarg, &o->writers, 1) && o->writers <= 64; break;
        case O_RING: ok = parse_u32(optarg, &o->ring_capacity, 2); break;
        case O_JUMP: ok = parse_u32(optarg, &o->jump, 0); break;
        case O_SERIAL: o->serial = true; break;
        case O_EXPORT: ok = optarg[0] != 0; snprintf(o->export_path, sizeof o->export_path, "%s", optarg); break;
        case O_IMPORT: ok = optarg[0] != 0; snprintf(o->import_path, sizeof o->import_path, "%s", optarg); break;
        case O_OVERRUN: ok = parse_pos(optarg, &o->max_overrun) && o->max_overrun > 1.0; break;
        case O_WINDOW: ok = parse_pos(optarg, &o->window_ms); break;
        case O_SMIN: ok = parse_pos(optarg, &o->sweep_min_ms); break;
        case O_SMAX: ok = parse_pos(optarg, &o->sweep_max_ms); break;
        case O_STEPS: ok = parse_u32(optarg, &o->sweep_steps, 1) && o->sweep_steps <= MAX_STEPS; break;
        case O_STOP: ok = parse_u32(optarg, &o->sweep_stop, 1); break;
        case O_OUT: snprintf(o->out, sizeof o->out, "%s", optarg); break;
        case O_NOPLOT: o->plot = false; break;
        case O_NOPROG: o->progress = false; break;
        case O_E2E: snprintf(o->e2e_url, sizeof o->e2e_url, "%s", optarg); break;
        case O_E2E_SPAWN: snprintf(o->e2e_spawn, sizeof o->e2e_spawn, "%s", optarg); break;
        case O_E2E_QUERY:
            ok = !strcmp(optarg, "hash") || !strcmp(optarg, "tokens");
            o->e2e_query = !strcmp(optarg, "tokens") ? KVI_E2E_QUERY_TOKENS : KVI_E2E_QUERY_HASH;
            break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "trace: invalid value for --%s: %s\n", opts[c - O_TRACE].name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "trace: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->export_path[0] && o->import_path[0]) {
        fprintf(stderr, "trace: --export and --import exclude each other\n");
        return 2;
    }
    if (o->sweep_min_ms > o->sweep_max_ms) {
        fprintf(stderr, "trace: --sweep-min-ms must not exceed --sweep-max-ms\n");
        return 2;
    }
    return 0;
}

/* ---- loading -------------------------------------------------------------------- */

static int load_trace(const struct trace_opts *o, struct kvi_trace *base)
{
    kvi_trace_init(base);
    char path[PATH_MAX] = "";
    if (!strcmp(o->trace, "synthetic")) {
        path[0] = 0;
    } else if (o->trace[0]) {
        snprintf(path, sizeof path, "%s", o->trace);
    } else if (!kvi_trace_find_default(path, sizeof path)) {
        printf("note: ../shared/data/mooncake-traces/conversation_trace.jsonl not found; "
               "using the built-in synthetic trace\n");
        path[0] = 0;
    }
    if (path[0] == 0) {
        struct kvi_trace_synth_cfg sc;
        kvi_trace_synth_defaults(&sc);
        sc.requests = o->synth_requests;
        sc.seed = o->wl.seed;
        kvi_trace_synthesize(base, &sc);
        return 0;
    }
    char err[512];
    int rc = kvi_trace_load(base, path, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "trace: %s\n", err);
    return rc;
}

static void print_trace(const struct kvi_trace *t, const struct kvi_trace *x, const struct trace_opts *o)
{
    struct kvi_trace_stats s;
    kvi_trace_stats(x, &s);
    printf("kvidx trace: %s", t->name);
    if (t->path[0])
        printf("  (%s, sha256 %s)", t->path, t->sha256);
    printf("\n");
    printf("  requests %zu (length factor %u, %u cop%s), span %.1f s, input avg %.0f / max %u tokens, output avg %.0f\n",
           s.requests, o->length_factor, o->trace_dup, o->trace_dup == 1 ? "y" : "ies", (double)s.span_ms / 1e3,
           s.avg_input, s.max_input, s.avg_output);
    printf("  hash ids per request avg %.1f / max %u, total %llu, unique %llu, infinite-cache prefix reuse %.1f %%\n",
           s.avg_ids, s.max_ids, (unsigned long long)s.total_ids, (unsigned long long)s.unique_ids, 100.0 * s.reuse);
}

static void print_workload(const struct kvi_trace_workload *w)
{
    const struct kvi_trace_workload_stats *s = &w->st;
    const struct kvi_trace_workload_cfg *c = &w->cfg;
    uint64_t blocks = s->query_blocks + s->stored_blocks + s->removed_blocks;
    printf("workload: %u workers x %u replica(s), block %u tokens, %u GPU blocks per worker, seed %llu\n",
           c->n_workers, c->worker_dup, c->block_size, c->gpu_blocks, (unsigned long long)c->seed);
    if (w->trace != NULL) { /* imported: the engines' figures are not in the file */
        printf("  engine: trace squeezed into %.0f ms, speedup %.0f, prefill %.0f tok/s, decode %.0f ms/tok; "
               "%llu requests waited for blocks, %llu dropped (too large for the pool)\n",
               c->sim_ms, c->speedup, c->prefill_tok_per_s, c->decode_ms_per_tok, (unsigned long long)s->waited,
               (unsigned long long)s->dropped);
        uint64_t all = s->hit_blocks + s->computed_blocks;
        printf("  engine prefix-cache hit rate %.1f %% of prompt blocks\n",
               all ? 100.0 * (double)s->hit_blocks / (double)all : 0.0);
    }
    printf("  %llu queries (%llu blocks), %llu stored events (%llu blocks), %llu removed events (%llu blocks)\n",
           (unsigned long long)s->queries, (unsigned long long)s->query_blocks, (unsigned long long)s->stores,
           (unsigned long long)s->stored_blocks, (unsigned long long)s->removes, (unsigned long long)s->removed_blocks);
    printf("  per replay: %zu ops, %.3f M block-ops (query + stored + removed hashes)\n", w->n, (double)blocks / 1e6);
}

/* ---- runs and the sweep ------------------------------------------------------------ */

struct series {
    const struct kvi_trace_backend *be;
    struct kvi_trace_run_result r[MAX_STEPS];
    size_t n;
};

static bool good(const struct kvi_trace_run_result *r)
{
    return r->valid && r->keep_up && r->achieved_block_ops_per_s >= 0.95 * r->offered_block_ops_per_s;
}

static uint32_t cores_for(uint32_t threads)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && (uint32_t)n < threads ? (uint32_t)n : threads;
}

static void print_header(void)
{
    printf("\n%-10s %9s %9s %9s %8s %8s %7s %7s %7s %8s %9s %7s %8s %7s %s\n", "backend", "window_ms", "off_Mblk",
           "ach_Mblk", "Mblk/core", "ach_Mops", "p50_us", "p95_us", "p99_us", "p999_us", "max_us", "backlog",
           "lag99_ms", "wr_busy", "verdict");
}

static void print_row(const struct kvi_trace_run_result *r)
{
    const char *verdict = !r->valid ? (r->aborted ? "INVALID (gave up)" : r->backlog_pct > 5.0 ? "INVALID (backlog)" : "INVALID (issued late)")
                          : r->keep_up ? "keeps up" : "falls behind";
    printf("%-10s %9.1f %9.3f %9.3f %9.3f %8.3f %7.2f %7.2f %7.2f %8.2f %9.1f %6.2f%% %8.2f %6.0f%% %s\n", r->backend,
           r->window_ms, r->offered_block_ops_per_s / 1e6, r->achieved_block_ops_per_s / 1e6,
           r->achieved_block_ops_per_s / 1e6 / cores_for(r->threads), r->achieved_ops_per_s / 1e6,
           (double)r->find.p50 / 1e3, (double)r->find.p95 / 1e3, (double)r->find.p99 / 1e3,
           (double)r->find.p999 / 1e3, (double)r->find.max / 1e3, r->backlog_pct, (double)r->lag_p99_ns / 1e6,
           r->elapsed_ms > 0 ? 100.0 * r->writer_busy_ms / r->elapsed_ms / (r->threads - r->readers) : 0.0, verdict);
    if (r->rejected)
        printf("%-10s   warning: %llu stores rejected (parent unknown)\n", "", (unsigned long long)r->rejected);
    fflush(stdout);
}

static int run_one(const struct kvi_trace_workload *w, const struct trace_opts *o, const struct kvi_trace_backend *be,
                   double window_ms, struct progress *pg, const char *step, struct kvi_trace_run_result *res)
{
    struct kvi_trace_run_cfg cfg = {
        .window_ms = window_ms,
        .readers = o->readers,
        .writers = o->writers,
        .ring_capacity = o->ring_capacity,
        .max_overrun = o->max_overrun,
        .jump = o->jump,
        .key_seed = w->cfg.seed,
        .progress = progress_draw,
        .pctx = pg,
    };
    char label[96];
    snprintf(label, sizeof label, "%s %-10s window %.1f ms", step, kvi_trace_backend_name(be), window_ms);
    progress_start(pg, label);
    struct kvi_e2e_extra x;
    int rc = o->e2e ? kvi_e2e_run(o->e2e, w, &cfg, res, &x) : kvi_trace_run(w, be, &cfg, res);
    progress_clear(pg);
    if (rc == 0)
        print_row(res);
    if (o->e2e && (rc == 0 || x.first_error[0]))
        kvi_e2e_print(&x);
    return rc;
}

/* Windows: index 0 = longest (lowest load). */
static void sweep_windows(const struct trace_opts *o, double *win, uint32_t *n)
{
    if (o->window_ms > 0) {
        win[0] = o->window_ms;
        *n = 1;
        return;
    }
    uint32_t k = o->sweep_steps;
    for (uint32_t i = 0; i < k; i++)
        win[i] = k == 1 ? o->sweep_max_ms : o->sweep_max_ms * pow(o->sweep_min_ms / o->sweep_max_ms, (double)i / (k - 1));
    *n = k;
}

static int sweep_backend(const struct kvi_trace_workload *w, const struct trace_opts *o, struct series *s,
                         const double *win, uint32_t n_win, struct progress *pg)
{
    bool high_first = !strcmp(kvi_trace_backend_name(s->be), "kvidx");
    uint32_t streak = 0;
    for (uint32_t k = 0; k < n_win; k++) {
        uint32_t i = high_first ? n_win - 1 - k : k;
        char step[24];
        snprintf(step, sizeof step, "[%u/%u]", k + 1, n_win);
        struct kvi_trace_run_result *r = &s->r[s->n];
        if (run_one(w, o, s->be, win[i], pg, step, r) < 0)
            return -EINVAL;
        s->n++;
        if (high_first) {
            streak = good(r) ? streak + 1 : 0;
            if (streak >= o->sweep_stop)
                break;
        } else {
            streak = good(r) ? 0 : streak + 1;
            if (streak >= 2)
                break;
        }
    }
    return 0;
}

static int cmp_offered(const void *a, const void *b)
{
    const struct kvi_trace_run_result *x = a, *y = b;
    return (x->offered_block_ops_per_s > y->offered_block_ops_per_s) -
           (x->offered_block_ops_per_s < y->offered_block_ops_per_s);
}

/* Highest offered load that keeps up (valid, keep_up), or NULL. */
static const struct kvi_trace_run_result *best_keep_up(const struct series *s)
{
    const struct kvi_trace_run_result *b = NULL;
    for (size_t i = 0; i < s->n; i++)
        if (s->r[i].valid && s->r[i].keep_up && (!b || s->r[i].offered_block_ops_per_s > b->offered_block_ops_per_s))
            b = &s->r[i];
    return b;
}

static const struct kvi_trace_run_result *peak(const struct series *s)
{
    const struct kvi_trace_run_result *b = NULL;
    for (size_t i = 0; i < s->n; i++)
        if (!b || s->r[i].achieved_block_ops_per_s > b->achieved_block_ops_per_s)
            b = &s->r[i];
    return b;
}

static void print_summary(const struct series *s, size_t n)
{
    printf("\nsummary (block-ops/s; per core = / min(threads, online CPUs)):\n");
    const struct kvi_trace_run_result *kv = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct kvi_trace_run_result *b = best_keep_up(&s[i]), *p = peak(&s[i]);
        const char *name = kvi_trace_backend_name(s[i].be);
        if (!strcmp(name, "kvidx"))
            kv = b;
        if (b)
            printf("  %-10s keeps up at %8.3f M (%7.3f M per core), find p50 %.2f us, p99 %.2f us", name,
                   b->offered_block_ops_per_s / 1e6, b->offered_block_ops_per_s / 1e6 / cores_for(b->threads),
                   (double)b->find.p50 / 1e3, (double)b->find.p99 / 1e3);
        else
            printf("  %-10s keeps up at no measured load", name);
        if (p)
            printf("; peak achieved %.3f M\n", p->achieved_block_ops_per_s / 1e6);
        else
            printf("\n");
    }
    for (size_t i = 0; kv && i < n; i++) {
        const struct kvi_trace_run_result *b = best_keep_up(&s[i]);
        const char *name = kvi_trace_backend_name(s[i].be);
        if (strcmp(name, "kvidx") && b)
            printf("  kvidx / %-10s keep-up block-ops/s ratio %.2f, find p99 ratio %.2f\n", name,
                   kv->offered_block_ops_per_s / b->offered_block_ops_per_s,
                   b->find.p99 ? (double)kv->find.p99 / (double)b->find.p99 : 0.0);
    }
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static int write_json(const char *path, const struct kvi_trace *t, const struct kvi_trace_workload *w,
                      const struct trace_opts *o, const struct series *s, size_t n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -errno;
    const struct kvi_trace_workload_stats *st = &w->st;
    fprintf(f, "{\"bench\":\"trace\",\"trace\":");
    json_str(f, t->name);
    fprintf(f, ",\"sha256\":");
    json_str(f, t->sha256);
    fprintf(f, ",\"workers\":%u,\"worker_dup\":%u,\"trace_dup\":%u,\"length_factor\":%u,\"block_size\":%u,"
               "\"gpu_blocks\":%u,\"seed\":%llu,\"readers\":%u,\"writers\":%u,\"cpus\":%ld,",
            w->cfg.n_workers, w->cfg.worker_dup, o->trace_dup, o->length_factor, w->cfg.block_size,
            w->cfg.gpu_blocks, (unsigned long long)w->cfg.seed, o->readers, o->writers,
            sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(f, "\"workload\":{\"requests\":%zu,\"ops\":%zu,\"queries\":%llu,\"query_blocks\":%llu,\"stores\":%llu,"
               "\"stored_blocks\":%llu,\"removes\":%llu,\"removed_blocks\":%llu},\"backends\":{",
            t->n_req, w->n, (unsigned long long)st->queries, (unsigned long long)st->query_blocks,
            (unsigned long long)st->stores, (unsigned long long)st->stored_blocks, (unsigned long long)st->removes,
            (unsigned long long)st->removed_blocks);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s", i ? "," : "");
        json_str(f, kvi_trace_backend_name(s[i].be));
        fprintf(f, ":[");
        for (size_t j = 0; j < s[i].n; j++) {
            const struct kvi_trace_run_result *r = &s[i].r[j];
            fprintf(f,
                    "%s{\"duration_ms\":%.3f,\"elapsed_ms\":%.3f,\"offered_ops_throughput\":%.0f,"
                    "\"ops_throughput\":%.0f,\"offered_block_throughput\":%.0f,\"block_throughput\":%.0f,"
                    "\"latency_p50_us\":%.3f,\"latency_p95_us\":%.3f,\"latency_p99_us\":%.3f,"
                    "\"latency_p999_us\":%.3f,\"latency_max_us\":%.3f,\"backlog_pct\":%.3f,\"threads\":%u,"
                    "\"valid\":%s,\"keep_up\":%s}",
                    j ? "," : "", r->window_ms, r->elapsed_ms, r->offered_ops_per_s, r->achieved_ops_per_s,
                    r->offered_block_ops_per_s, r->achieved_block_ops_per_s, (double)r->find.p50 / 1e3,
                    (double)r->find.p95 / 1e3, (double)r->find.p99 / 1e3, (double)r->find.p999 / 1e3,
                    (double)r->find.max / 1e3, r->backlog_pct, r->threads, r->valid ? "true" : "false",
                    r->keep_up ? "true" : "false");
        }
        fprintf(f, "]");
    }
    fprintf(f, "}}\n");
    return fclose(f) == 0 ? 0 : -EIO;
}

static void write_outputs(const struct kvi_trace *t, const struct kvi_trace_workload *w, const struct trace_opts *o,
                          const struct series *s, size_t n)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s.json", o->out);
    int rc = write_json(path, t, w, o, s, n);
    if (rc < 0)
        printf("could not write %s: %s\n", path, strerror(-rc));
    else
        printf("wrote %s\n", path);
    if (!o->plot)
        return;
    struct kvi_plot_point pts[MAX_BACKENDS][MAX_STEPS];
    struct kvi_plot_line lines[MAX_BACKENDS];
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < s[i].n; j++)
            pts[i][j] = (struct kvi_plot_point){s[i].r[j].offered_block_ops_per_s, s[i].r[j].achieved_block_ops_per_s,
                                                (double)s[i].r[j].find.p99, s[i].r[j].keep_up};
        lines[i] = (struct kvi_plot_line){kvi_trace_backend_name(s[i].be), pts[i], s[i].n};
    }
    char title[256], msg[PATH_MAX * 2 + 64];
    snprintf(title, sizeof title, "kvidx-bench trace: %s, %u workers x %u, block %u, %u lane(s) + %u writer(s)",
             t->name, w->cfg.n_workers, w->cfg.worker_dup, w->cfg.block_size, o->readers, o->writers);
    kvi_plot_sweep(o->out, title, lines, n, msg, sizeof msg);
    printf("%s\n", msg);
}

static void print_final(const struct kvi_trace *t, const struct kvi_trace_workload *w, const struct series *kv,
                        bool e2e)
{
    const struct kvi_trace_run_result *b = kv ? best_keep_up(kv) : NULL;
    if (kv && b == NULL) /* nothing kept up: report the lowest load measured */
        for (size_t i = 0; i < kv->n; i++)
            if (!b || kv->r[i].offered_block_ops_per_s < b->offered_block_ops_per_s)
                b = &kv->r[i];
    struct kvi_trace_run_result none = {0};
    if (b == NULL)
        b = &none;
    printf("{\"bench\":\"trace\",\"trace\":");
    json_str(stdout, t->name);
    printf(",\"workers\":%u,\"valid\":%s,\"keep_up\":%s,\"offered_block_ops_per_s\":%.0f,"
           "\"achieved_block_ops_per_s\":%.0f,\"threads\":%u,\"find_p50_ns\":%llu,\"find_p99_ns\":%llu,"
           "\"backlog_pct\":%.3f%s}\n",
           w->n_workers_total, b->valid ? "true" : "false", b->keep_up ? "true" : "false",
           b->offered_block_ops_per_s, b->achieved_block_ops_per_s, b->threads,
           (unsigned long long)b->find.p50, (unsigned long long)b->find.p99, b->backlog_pct,
           e2e ? ",\"mode\":\"e2e\"" : "");
}

static int pick_backends(const char *list, struct series *s, size_t *n)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const struct kvi_trace_backend *be = kvi_trace_backend_by_name(tok);
        if (be == NULL) {
            fprintf(stderr, "trace: unknown backend '%s' (have %s)\n", tok, kvi_trace_backend_names());
            return -EINVAL;
        }
        for (size_t i = 0; i < *n; i++)
            if (s[i].be == be)
                be = NULL;
        if (be == NULL)
            continue;
        if (*n == MAX_BACKENDS)
            return -EINVAL;
        s[(*n)++].be = be;
    }
    return *n ? 0 : -EINVAL;
}

/* The workload: imported (--import), or simulated from the trace. @p base
 * names it (for an import: the file's name and SHA-256; @p x stays empty).
 * @return 0, 1 when the input cannot be read, 2 for an invalid configuration. */
static int prepare_workload(const struct trace_opts *o, struct kvi_trace *base, struct kvi_trace *x,
                            struct kvi_trace_workload *w)
{
    kvi_trace_init(base);
    kvi_trace_init(x);
    if (o->import_path[0]) {
        char err[512];
        if (kvi_trace_import(w, o->import_path, base->sha256, err, sizeof err) < 0) {
            fprintf(stderr, "trace: --import: %s\n", err);
            return 1;
        }
        const char *slash = strrchr(o->import_path, '/');
        snprintf(base->name, sizeof base->name, "%.63s", slash ? slash + 1 : o->import_path);
        snprintf(base->path, sizeof base->path, "%s", o->import_path);
        printf("kvidx trace: imported timeline %s (sha256 %s)\n", base->path, base->sha256);
        return 0;
    }
    if (load_trace(o, base) < 0) {
        kvi_trace_free(base);
        return 1;
    }
    kvi_trace_expand(base, o->length_factor, o->trace_dup, x);
    print_trace(base, x, o);
    struct progress pg = {.on = o->progress};
    progress_start(&pg, "simulating engines");
    int rc = kvi_trace_workload_build(w, x, &o->wl, progress_draw, &pg);
    progress_clear(&pg);
    if (rc < 0) {
        fprintf(stderr, "trace: invalid workload configuration\n");
        kvi_trace_free(x);
        kvi_trace_free(base);
        return 2;
    }
    return 0;
}

/* --serial: every backend once, then one JSON line for kvidx. */
static int run_serial(const struct kvi_trace *t, const struct kvi_trace_workload *w, const struct trace_opts *o,
                      const struct series *s, size_t ns)
{
    printf("serial: one thread applies every event and runs every query in timeline order; each query is timed\n"
           "twice in a row (first: as the timeline leaves the caches; again: warm)\n\n");
    printf("%-10s %8s %9s %9s %9s %9s %9s %9s %9s %12s\n", "backend", "queries", "1st p50", "1st p99", "1st p999",
           "1st max", "again p50", "again p99", "again max", "apply ns/blk");
    struct kvi_trace_serial_result kv = {0};
    bool have_kv = false;
    for (size_t i = 0; i < ns; i++) {
        struct kvi_trace_serial_result r;
        int rc = kvi_trace_serial(w, s[i].be, o->jump, w->cfg.seed, &r);
        if (rc < 0) {
            fprintf(stderr, "trace: --serial: %s\n", strerror(-rc));
            return rc;
        }
        printf("%-10s %8llu %7.2f us %6.2f us %6.2f us %6.1f us %6.2f us %6.2f us %6.1f us %12.1f\n", r.backend,
               (unsigned long long)r.queries, r.first.p50 / 1e3, r.first.p99 / 1e3, r.first.p999 / 1e3,
               r.first.max / 1e3, r.again.p50 / 1e3, r.again.p99 / 1e3, r.again.max / 1e3,
               r.apply_ns_per_block);
        if (r.rejected)
            printf("%-10s   warning: %llu stores rejected (parent unknown)\n", "", (unsigned long long)r.rejected);
        if (!strcmp(r.backend, "kvidx")) {
            kv = r;
            have_kv = true;
        }
    }
    if (!have_kv)
        printf("(no kvidx run: the summary line below is empty)\n");
    printf("{\"bench\":\"trace\",\"mode\":\"serial\",\"trace\":");
    json_str(stdout, t->name);
    printf(",\"workers\":%u,\"queries\":%llu,\"find_first_p50_ns\":%llu,\"find_first_p99_ns\":%llu,"
           "\"find_again_p50_ns\":%llu,\"find_again_p99_ns\":%llu,\"apply_ns_per_block\":%.1f}\n",
           w->n_workers_total, (unsigned long long)kv.queries, (unsigned long long)kv.first.p50,
           (unsigned long long)kv.first.p99, (unsigned long long)kv.again.p50, (unsigned long long)kv.again.p99,
           kv.apply_ns_per_block);
    return 0;
}

int kvi_bench_trace(int argc, char **argv)
{
    struct trace_opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc)
        return prc == 1 ? 0 : 2;
    struct series *s = kvi_xcalloc(MAX_BACKENDS, sizeof *s);
    size_t ns;
    if (pick_backends(o.backends, s, &ns) < 0) {
        free(s);
        return 2;
    }
    bool e2e = o.e2e_url[0] || o.e2e_spawn[0];
    if (e2e && o.import_path[0]) {
        fprintf(stderr, "trace: --import replays in process only (--e2e needs the trace's tokens)\n");
        free(s);
        return 2;
    }
    if (e2e && o.serial) {
        fprintf(stderr, "trace: --serial runs in process only\n");
        free(s);
        return 2;
    }
    if (e2e) {
        if (ns != 1 || strcmp(kvi_trace_backend_name(s[0].be), "kvidx") != 0)
            printf("note: --e2e replays through kvidxd only (the baselines run in process only)\n");
        s[0].be = kvi_trace_backend_by_name("kvidx");
        ns = 1;
        struct kvi_e2e_cfg ec = {
            .url = o.e2e_url[0] ? o.e2e_url : NULL,
            .spawn = o.e2e_spawn[0] ? o.e2e_spawn : NULL,
            .spawn_writers = o.writers,
            .query = o.e2e_query,
        };
        char err[512] = "";
        o.e2e = kvi_e2e_open(&ec, err, sizeof err);
        if (o.e2e == NULL) {
            fprintf(stderr, "trace: --e2e: %s\n", err);
            free(s);
            return 1;
        }
    }
    struct kvi_trace base, x;
    struct kvi_trace_workload w;
    int rc = prepare_workload(&o, &base, &x, &w);
    if (rc != 0) {
        kvi_e2e_close(o.e2e);
        free(s);
        return rc;
    }
    if (o.export_path[0]) {
        char source[512];
        snprintf(source, sizeof source, "%s%s%s", base.name, base.sha256[0] ? " sha256 " : "", base.sha256);
        rc = kvi_trace_export(&w, source, o.export_path);
        if (rc < 0)
            fprintf(stderr, "trace: --export %s: %s\n", o.export_path, strerror(-rc));
        else
            printf("wrote the timeline (%zu entries, format %s version %u) to %s\n", w.n, KVI_TIMELINE_FORMAT,
                   KVI_TIMELINE_VERSION, o.export_path);
        kvi_trace_workload_free(&w);
        kvi_trace_free(&x);
        kvi_trace_free(&base);
        free(s);
        return rc < 0 ? 1 : 0;
    }
    print_workload(&w);
    struct progress pg = {.on = o.progress};
    if (o.serial) {
        rc = run_serial(&base, &w, &o, s, ns);
        kvi_trace_workload_free(&w);
        kvi_trace_free(&x);
        kvi_trace_free(&base);
        free(s);
        return rc == 0 ? 0 : 1;
    }
    if (o.e2e)
        printf("replay: end to end through kvidxd at %s: %u lane(s), one h2c connection each, %s; one C publisher "
               "per worker over ZMQ; find latency = the query's HTTP/2 round trip\n",
               kvi_e2e_url(o.e2e), o.readers,
               o.e2e_query == KVI_E2E_QUERY_TOKENS ? "POST /query (msgpack tokens)"
                                                   : "POST /query_by_hash (msgpack content hashes)");
    else
        printf("replay: %u lane(s) (RCU readers + ring producers) + %u writer thread(s), %ld online CPU(s); "
               "find latency = service time inside the index\n",
               o.readers, o.writers, sysconf(_SC_NPROCESSORS_ONLN));
    double win[MAX_STEPS];
    uint32_t n_win;
    sweep_windows(&o, win, &n_win);
    print_header();
    for (size_t i = 0; i < ns && rc == 0; i++)
        rc = sweep_backend(&w, &o, &s[i], win, n_win, &pg);
    if (rc == 0) {
        for (size_t i = 0; i < ns; i++)
            qsort(s[i].r, s[i].n, sizeof s[i].r[0], cmp_offered);
        print_summary(s, ns);
        if (o.window_ms == 0 || o.out[0])
            write_outputs(&base, &w, &o, s, ns);
        const struct series *kv = NULL;
        for (size_t i = 0; i < ns; i++)
            if (!strcmp(kvi_trace_backend_name(s[i].be), "kvidx"))
                kv = &s[i];
        if (kv == NULL)
            printf("(no kvidx runs: the summary line below is empty)\n");
        print_final(&base, &w, kv, o.e2e != NULL);
    }
    kvi_trace_workload_free(&w);
    kvi_trace_free(&x);
    kvi_trace_free(&base);
    kvi_e2e_close(o.e2e);
    free(s);
    return rc == 0 ? 0 : 1;
}
