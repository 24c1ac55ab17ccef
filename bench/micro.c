/*
 * kvidx-bench micro: engine costs on the reference micro-benchmark shape
 * (Dynamo's crate README: 1 M blocks, depth 1,024, 128 workers).
 *
 * Shape: S sequences of D blocks (default 1,024 x 1,024 = 1 M blocks), each
 * stored by R workers out of W (default R = 1, W = 128), every sequence
 * stored as one D-block event (as the reference measured: per sequence).
 * Engine hashes are random 64-bit values (opaque, as vLLM's are); content
 * hashes are random. Measured in-process on one writer thread:
 *   store   — ns per block, storing every sequence: cold (the index grows
 *             from empty), again (idempotent), and into a fresh index
 *             pre-sized with kvi_index_reserve / kvi_index_reserve_slot;
 *             the cold store's table rebuilds (growth: time and slots
 *             moved, from kvi_index_stats) are given apart;
 *   find    — one full-depth hit query (find_hit_ns), and one query that
 *             diverges at a random depth (find_partial_ns), per jump size;
 *   remove  — ns per block, removing every sequence tail first;
 *   readers — query latency p50/p99 with 1 and 2 reader threads, idle and
 *             while a writer thread stores and removes flat out;
 *   memory  — index bytes per (block, worker) holding.
 * Store, remove and query means are also given in thread CPU time (the *_cpu_*
 * fields): on a shared, oversubscribed machine wall-clock figures include the
 * time the thread was descheduled, CPU time does not.
 * Prints a table, then one JSON line.
 *
 * --replay runs a different measurement instead: the Mooncake trace's KV
 * events (kvidx-bench trace's workload: mock engines, LRU eviction, opaque
 * engine hashes) applied on this one thread straight to the index, no rings
 * and no queries, so that the writer's cost per stored and removed block can
 * be measured alone (thread CPU time; callgrind with --toggle-collect on
 * kvi_index_store / kvi_index_remove for instruction counts).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "bench/trace.h"
#include "engine/common.h"
#include "engine/index.h"
#include "engine/rcu.h"

struct micro_cfg {
    uint32_t seqs, depth, workers, replicas, queries;
    double reader_secs;
    uint64_t seed;
    bool seq_tables; /* --seq-tables: the index keeps seq tables from the start */
};

struct shape {
    struct micro_cfg c;
    uint64_t *content; /* seqs x depth */
    uint64_t *eh;      /* seqs x replicas x depth */
    uint32_t *owner;   /* seqs x replicas: dense instance id */
};

static uint64_t *content_of(const struct shape *s, uint32_t q) { return s->content + (size_t)q * s->c.depth; }
static uint64_t *eh_of(const struct shape *s, uint32_t q, uint32_t r)
{
    return s->eh + ((size_t)q * s->c.replicas + r) * s->c.depth;
}

static uint32_t gcd_u32(uint32_t a, uint32_t b)
{
    while (b != 0) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void shape_build(struct shape *s, struct kvi_index *ix)
{
    uint64_t rng = s->c.seed;
    size_t nb = (size_t)s->c.seqs * s->c.depth;
    s->content = kvi_xmalloc(nb * sizeof(uint64_t));
    s->eh = kvi_xmalloc(nb * s->c.replicas * sizeof(uint64_t));
    s->owner = kvi_xmalloc((size_t)s->c.seqs * s->c.replicas * sizeof(uint32_t));
    for (size_t i = 0; i < nb; i++)
        s->content[i] = kvi_bench_rand(&rng);
    for (size_t i = 0; i < nb * s->c.replicas; i++)
        s->eh[i] = kvi_bench_rand(&rng);
    uint32_t *inst = kvi_xmalloc(s->c.workers * sizeof(uint32_t));
    for (uint32_t w = 0; w < s->c.workers; w++)
        inst[w] = (uint32_t)kvi_index_intern_instance(ix, 1000 + w, NULL, false);
    /* a sequence's R holders are W / R + 1 workers apart, or the next
     * stride coprime to W: R distinct workers (a stride sharing a factor
     * with W, as 2 with R = W = 128, named only W / 2 of them) */
    uint32_t stride = s->c.workers / s->c.replicas + 1;
    while (gcd_u32(stride, s->c.workers) != 1)
        stride++;
    for (uint32_t q = 0; q < s->c.seqs; q++)
        for (uint32_t r = 0; r < s->c.replicas; r++)
            s->owner[q * s->c.replicas + r] = inst[(q + (uint64_t)r * stride) % s->c.workers];
    free(inst);
}

static void store_seq(struct kvi_index *ix, const struct shape *s, uint32_t q, uint32_t r, struct kvi_block *b)
{
    const uint64_t *c = content_of(s, q), *e = eh_of(s, q, r);
    for (uint32_t i = 0; i < s->c.depth; i++)
        b[i] = (struct kvi_block){e[i], c[i]};
    int rc = kvi_index_store(ix, s->owner[q * s->c.replicas + r], 0, KVI_TIER_GPU, false, 0, b, s->c.depth);
    if (rc != 0)
        kvi_die("store failed: %d", rc);
}

static void remove_seq(struct kvi_index *ix, const struct shape *s, uint32_t q, uint32_t r, uint64_t *tmp)
{
    const uint64_t *e = eh_of(s, q, r);
    for (uint32_t i = 0; i < s->c.depth; i++)
        tmp[i] = e[s->c.depth - 1 - i];
    kvi_index_remove(ix, s->owner[q * s->c.replicas + r], 0, KVI_TIER_GPU, tmp, s->c.depth);
}

/* Store every sequence. One function per measured phase, so that callgrind
 * --toggle-collect=store_cold (store_presized, store_again) counts that phase alone. */
static void store_all(struct kvi_index *ix, const struct shape *s, struct kvi_block *b)
{
    for (uint32_t q = 0; q < s->c.seqs; q++)
        for (uint32_t r = 0; r < s->c.replicas; r++)
            store_seq(ix, s, q, r, b);
}

static volatile int store_phase; /* different in each: identical bodies would be folded into one */

static __attribute__((noinline)) void store_cold(struct kvi_index *ix, const struct shape *s, struct kvi_block *b)
{
    store_phase = 1;
    store_all(ix, s, b);
}

static __attribute__((noinline)) void store_presized(struct kvi_index *ix, const struct shape *s, struct kvi_block *b)
{
    store_phase = 2;
    store_all(ix, s, b);
}

static __attribute__((noinline)) void store_again(struct kvi_index *ix, const struct shape *s, struct kvi_block *b)
{
    store_phase = 3;
    store_all(ix, s, b);
}

/* CPU time of the calling thread, ns. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct qstat {
    double mean_ns, p50_ns, p99_ns;
    double cpu_mean_ns; /* thread CPU time per query (time_queries only) */
};

/* Time `n` queries; partial: diverge at a random depth. */
static struct qstat time_queries(struct kvi_index *ix, const struct shape *s, uint32_t n, bool partial, uint64_t seed)
{
    uint64_t rng = seed;
    uint64_t *lat = kvi_xmalloc(n * sizeof(uint64_t));
    uint64_t *qbuf = kvi_xmalloc(s->c.depth * sizeof(uint64_t));
    struct kvi_match m[256];
    uint64_t total = 0, sink = 0, c0 = cpu_ns();
    for (uint32_t i = 0; i < n; i++) {
        uint32_t q = (uint32_t)(kvi_bench_rand(&rng) % s->c.seqs);
        memcpy(qbuf, content_of(s, q), s->c.depth * sizeof(uint64_t));
        uint32_t expect = s->c.depth;
        if (partial) {
            expect = 1 + (uint32_t)(kvi_bench_rand(&rng) % (s->c.depth - 1));
            qbuf[expect] ^= 0x5555;
        }
        uint64_t t0 = kvi_now_ns();
        kvi_rcu_read_lock();
        size_t k = kvi_index_find_matches(ix, qbuf, s->c.depth, m, 256);
        kvi_rcu_read_unlock();
        uint64_t dt = kvi_now_ns() - t0;
        if (k != s->c.replicas || m[0].depth != expect)
            kvi_die("wrong answer: %zu matches, depth %u, expected %u x %u", k, k ? m[0].depth : 0, s->c.replicas,
                    expect);
        sink += k;
        lat[i] = dt;
        total += dt;
    }
    double cpu_mean = (double)(cpu_ns() - c0) / n; /* includes the clock reads and the query set-up */
    qsort(lat, n, sizeof(uint64_t), kvi_bench_cmp_u64);
    struct qstat st = {(double)total / n, kvi_bench_pct(lat, n, 50), kvi_bench_pct(lat, n, 99), cpu_mean};
    free(lat);
    free(qbuf);
    (void)sink;
    return st;
}

/* ---- readers under writes -------------------------------------------------- */

struct rt {
    struct kvi_index *ix;
    const struct shape *s;
    _Atomic bool *stop;
    uint64_t seed;
    uint64_t *lat;
    size_t n, cap;
    pthread_t tid;
};

static void *reader_main(void *arg)
{
    struct rt *r = arg;
    kvi_rcu_register_thread();
    uint64_t rng = r->seed;
    struct kvi_match m[256];
    /* queries touch only the first half of the sequences: the writer churns
     * the second half */
    uint32_t stable = r->s->c.seqs / 2;
    while (!atomic_load_explicit(r->stop, memory_order_relaxed) && r->n < r->cap) {
        uint32_t q = (uint32_t)(kvi_bench_rand(&rng) % stable);
        uint64_t t0 = kvi_now_ns();
        kvi_rcu_read_lock();
        size_t k = kvi_index_find_matches(r->ix, content_of(r->s, q), r->s->c.depth, m, 256);
        kvi_rcu_read_unlock();
        r->lat[r->n++] = kvi_now_ns() - t0;
        if (k != r->s->c.replicas)
            kvi_die("reader saw %zu matches", k);
    }
    kvi_rcu_unregister_thread();
    return NULL;
}

struct wt {
    struct kvi_index *ix;
    const struct shape *s;
    _Atomic bool *stop;
    uint64_t blocks;
    pthread_t tid;
};

static void *writer_main(void *arg)
{
    struct wt *w = arg;
    struct kvi_block *b = kvi_xmalloc(w->s->c.depth * sizeof *b);
    uint64_t *tmp = kvi_xmalloc(w->s->c.depth * sizeof(uint64_t));
    uint32_t half = w->s->c.seqs / 2, q = half;
    while (!atomic_load_explicit(w->stop, memory_order_relaxed)) {
        for (uint32_t r = 0; r < w->s->c.replicas; r++)
            remove_seq(w->ix, w->s, q, r, tmp);
        for (uint32_t r = 0; r < w->s->c.replicas; r++)
            store_seq(w->ix, w->s, q, r, b);
        w->blocks += 2ull * w->s->c.depth * w->s->c.replicas;
        q = q + 1 < w->s->c.seqs ? q + 1 : half;
    }
    kvi_index_reclaim(w->ix, 0);
    free(b);
    free(tmp);
    return NULL;
}

static struct qstat readers_run(struct kvi_index *ix, const struct shape *s, int n_readers, bool with_writer,
                                double secs, double *writer_blocks_per_s)
{
    _Atomic bool stop = false;
    struct rt r[2];
    struct wt w = {.ix = ix, .s = s, .stop = &stop};
    size_t cap = 4000000;
    for (int i = 0; i < n_readers; i++) {
        r[i] = (struct rt){.ix = ix, .s = s, .stop = &stop, .seed = s->c.seed + 77 + i, .cap = cap};
        r[i].lat = kvi_xmalloc(cap * sizeof(uint64_t));
    }
    uint64_t t0 = kvi_now_ns();
    if (with_writer)
        pthread_create(&w.tid, NULL, writer_main, &w);
    for (int i = 0; i < n_readers; i++)
        pthread_create(&r[i].tid, NULL, reader_main, &r[i]);
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    nanosleep(&ts, NULL);
    atomic_store(&stop, true);
    for (int i = 0; i < n_readers; i++)
        pthread_join(r[i].tid, NULL);
    if (with_writer)
        pthread_join(w.tid, NULL);
    double el = (double)(kvi_now_ns() - t0) / 1e9;
    if (writer_blocks_per_s)
        *writer_blocks_per_s = with_writer ? (double)w.blocks / el : 0;
    size_t n = 0;
    for (int i = 0; i < n_readers; i++)
        n += r[i].n;
    uint64_t *all = kvi_xmalloc((n ? n : 1) * sizeof(uint64_t));
    size_t k = 0;
    double sum = 0;
    for (int i = 0; i < n_readers; i++) {
        memcpy(all + k, r[i].lat, r[i].n * sizeof(uint64_t));
        k += r[i].n;
        free(r[i].lat);
    }
    for (size_t i = 0; i < n; i++)
        sum += (double)all[i];
    qsort(all, n, sizeof(uint64_t), kvi_bench_cmp_u64);
    struct qstat st = {n ? sum / (double)n : 0, kvi_bench_pct(all, n, 50), kvi_bench_pct(all, n, 99), 0};
    free(all);
    return st;
}

/* ---- trace event replay ------------------------------------------------------ */

struct replay_cfg {
    const char *trace; /* path, "synthetic", or "" for the default trace */
    uint32_t block_size, gpu_blocks, workers, reps;
};

static int replay_run(const struct replay_cfg *rc)
{
    struct kvi_trace t;
    kvi_trace_init(&t);
    char path[4096] = "";
    if (strcmp(rc->trace, "synthetic") != 0) {
        if (rc->trace[0])
            snprintf(path, sizeof path, "%s", rc->trace);
        else if (!kvi_trace_find_default(path, sizeof path))
            path[0] = 0;
    }
    if (path[0]) {
        char err[512];
        if (kvi_trace_load(&t, path, err, sizeof err) < 0) {
            fprintf(stderr, "micro --replay: %s\n", err);
            return 1;
        }
    } else {
        struct kvi_trace_synth_cfg sc;
        kvi_trace_synth_defaults(&sc);
        kvi_trace_synthesize(&t, &sc);
    }
    struct kvi_trace_workload_cfg wc;
    kvi_trace_workload_defaults(&wc);
    wc.block_size = rc->block_size;
    wc.gpu_blocks = rc->gpu_blocks;
    wc.n_workers = rc->workers;
    struct kvi_trace_workload w;
    if (kvi_trace_workload_build(&w, &t, &wc, NULL, NULL) < 0) {
        fprintf(stderr, "micro --replay: invalid workload configuration\n");
        kvi_trace_free(&t);
        return 2;
    }
    printf("kvidx micro --replay: %s, %u workers, block %u tokens, %u gpu blocks per worker\n"
           "  %llu stored events (%llu blocks), %llu removed events (%llu blocks), applied on one thread, x%u\n",
           t.name, w.n_workers_total, wc.block_size, wc.gpu_blocks, (unsigned long long)w.st.stores,
           (unsigned long long)w.st.stored_blocks, (unsigned long long)w.st.removes,
           (unsigned long long)w.st.removed_blocks, rc->reps);
    size_t maxn = 1;
    for (size_t i = 0; i < w.n; i++)
        maxn = KVI_MAX(maxn, (size_t)w.e[i].n);
    struct kvi_block *b = kvi_xmalloc(maxn * sizeof *b);
    double best_cpu = 0, best_store = 0, best_remove = 0, best_rebuild = 0;
    uint64_t rejected = 0;
    for (uint32_t rep = 0; rep < rc->reps; rep++) {
        struct kvi_index_config icfg = {.block_size = wc.block_size, .n_parts = 1, .key_seed = 42};
        struct kvi_index *ix = kvi_index_create(&icfg);
        uint32_t *dense = kvi_xmalloc(w.n_workers_total * sizeof(uint32_t));
        for (uint32_t i = 0; i < w.n_workers_total; i++)
            dense[i] = (uint32_t)kvi_index_intern_instance(ix, i, NULL, false);
        /* one thread-cpu clock read per event: the time since the previous
         * read goes to the event's kind (the read's own cost is shared) */
        uint64_t cpu_store = 0, cpu_remove = 0, blocks = 0;
        rejected = 0;
        uint64_t c0 = cpu_ns(), prev = c0;
        for (size_t i = 0; i < w.n; i++) {
            const struct kvi_trace_entry *e = &w.e[i];
            if (e->kind == KVI_TRACE_QUERY)
                continue;
            if (e->kind == KVI_TRACE_REMOVE) {
                kvi_index_remove(ix, dense[e->worker], 0, KVI_TIER_GPU, e->engine_hash, e->n);
            } else {
                for (uint32_t j = 0; j < e->n; j++)
                    b[j] = (struct kvi_block){e->engine_hash[j], e->content[j]};
                if (kvi_index_store(ix, dense[e->worker], 0, KVI_TIER_GPU, e->has_parent, e->parent, b, e->n) != 0)
                    rejected++;
            }
            uint64_t now = cpu_ns();
            *(e->kind == KVI_TRACE_REMOVE ? &cpu_remove : &cpu_store) += now - prev;
            prev = now;
            blocks += e->n;
        }
        double cpu = (double)(prev - c0) / (double)blocks;
        struct kvi_index_stats st;
        kvi_index_stats(ix, &st);
        double rb = (double)st.table_rebuild_ns / (double)blocks;
        double ws = (double)cpu_store / (double)w.st.stored_blocks, wr = (double)cpu_remove / (double)w.st.removed_blocks;
        printf("  run %u: thread cpu ns per block: %.1f per block-op (store + remove), store %.1f, remove %.1f;"
               " table rebuilds %.1f ns per block-op (%llu, %.2f slots moved per block-op)\n",
               rep + 1, cpu, ws, wr, rb, (unsigned long long)st.table_rebuilds,
               (double)st.table_rebuild_slots / (double)blocks);
        if (rep == 0 || cpu < best_cpu) {
            best_cpu = cpu;
            best_store = ws;
            best_remove = wr;
            best_rebuild = rb;
        }
        kvi_index_destroy(ix);
        free(dense);
    }
    printf("{\"bench\":\"micro-replay\",\"trace\":\"%s\",\"block_size\":%u,\"stored_blocks\":%llu,"
           "\"removed_blocks\":%llu,\"rejected\":%llu,\"cpu_ns_per_block_op\":%.1f,\"store_cpu_ns_per_block\":%.1f,"
           "\"remove_cpu_ns_per_block\":%.1f,\"rebuild_ns_per_block_op\":%.1f}\n",
           t.name, wc.block_size, (unsigned long long)w.st.stored_blocks, (unsigned long long)w.st.removed_blocks,
           (unsigned long long)rejected, best_cpu, best_store, best_remove, best_rebuild);
    free(b);
    kvi_trace_workload_free(&w);
    kvi_trace_free(&t);
    return 0;
}

/* Turn ix's seq tables on, as a first seq query does (kvidxd serving
 * Mooncake's /query_by_hash): stores then keep each entry's seq hash and
 * look prefixes up by it. */
static void seq_tables_on(struct kvi_index *ix)
{
    uint64_t sq = 1;
    struct kvi_match m[1];
    kvi_rcu_read_lock();
    (void)kvi_index_find_matches_by_seq(ix, &sq, 1, m, 1);
    kvi_rcu_read_unlock();
}

static void usage(void)
{
    printf("usage: kvidx-bench micro [--seqs N] [--depth D] [--workers W] [--replicas R]\n"
           "                         [--queries Q] [--reader-secs S] [--seed X] [--seq-tables]\n"
           "       kvidx-bench micro --replay [PATH|synthetic] [--replay-block-size B]\n"
           "                         [--replay-gpu-blocks N] [--workers W] [--replay-reps R]\n"
           "defaults: 1024 sequences x 1024 blocks (1 M blocks), 128 workers, 1 replica,\n"
           "          20000 queries per measurement, 2 s per reader run, seed 42\n"
           "--replay: the trace's stored/removed events (kvidx-bench trace's workload, default\n"
           "          conversation trace, block 128, 2048 gpu blocks per worker) applied on one\n"
           "          thread, best of R = 3 runs: writer cost per block without rings or queries\n"
           "--seq-tables: seq tables on from the start (as after a first seq query)\n");
}

int kvi_bench_micro(int argc, char **argv)
{
    struct micro_cfg c = {1024, 1024, 128, 1, 20000, 2.0, 42, false};
    static const struct option opts[] = {
        {"seqs", required_argument, NULL, 's'},    {"depth", required_argument, NULL, 'd'},
        {"workers", required_argument, NULL, 'w'}, {"replicas", required_argument, NULL, 'r'},
        {"queries", required_argument, NULL, 'q'}, {"reader-secs", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 'x'},    {"help", no_argument, NULL, 'h'},
        {"replay", optional_argument, NULL, 'R'},  {"replay-block-size", required_argument, NULL, 'B'},
        {"replay-gpu-blocks", required_argument, NULL, 'G'}, {"replay-reps", required_argument, NULL, 'N'},
        {"seq-tables", no_argument, NULL, 'S'},
        {NULL, 0, NULL, 0},
    };
    struct replay_cfg rcfg = {NULL, 128, 2048, 128, 3};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 's': c.seqs = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'd': c.depth = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'w': c.workers = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'r': c.replicas = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'q': c.queries = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 't': c.reader_secs = strtod(optarg, NULL); break;
        case 'x': c.seed = strtoull(optarg, NULL, 10); break;
        case 'S': c.seq_tables = true; break;
        case 'R': rcfg.trace = optarg ? optarg : (optind < argc && argv[optind][0] != '-' ? argv[optind++] : ""); break;
        case 'B': rcfg.block_size = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'G': rcfg.gpu_blocks = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'N': rcfg.reps = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (rcfg.trace != NULL) {
        rcfg.workers = c.workers;
        if (rcfg.reps == 0)
            rcfg.reps = 1;
        kvi_rcu_register_thread();
        int rc = replay_run(&rcfg);
        kvi_rcu_unregister_thread();
        return rc;
    }
    if (c.seqs < 2 || c.depth < 2 || c.workers == 0 || c.replicas == 0 || c.replicas > c.workers ||
        c.replicas > 256 || c.queries == 0) {
        fprintf(stderr, "micro: invalid shape\n");
        return 2;
    }
    kvi_rcu_register_thread();
    struct kvi_index_config icfg = {.block_size = 16, .n_parts = 1, .key_seed = c.seed};
    struct kvi_index *ix = kvi_index_create(&icfg);
    if (c.seq_tables)
        seq_tables_on(ix);
    struct shape s = {.c = c};
    shape_build(&s, ix);
    struct kvi_block *b = kvi_xmalloc(c.depth * sizeof *b);
    uint64_t *tmp = kvi_xmalloc(c.depth * sizeof(uint64_t));
    uint64_t holdings = (uint64_t)c.seqs * c.depth * c.replicas;

    printf("kvidx micro: %u sequences x %u blocks = %.2f M blocks, %u workers, %u replica(s) per sequence\n",
           c.seqs, c.depth, (double)c.seqs * c.depth / 1e6, c.workers, c.replicas);

    /* store (cold: the index grows from empty) */
    uint64_t t0 = kvi_now_ns(), c0 = cpu_ns();
    store_cold(ix, &s, b);
    double store_ns = (double)(kvi_now_ns() - t0) / (double)holdings;
    double store_cpu = (double)(cpu_ns() - c0) / (double)holdings;
    kvi_index_reclaim(ix, 0);
    struct kvi_index_stats st;
    kvi_index_stats(ix, &st);
    double bytes_per = (double)st.bytes / (double)st.holdings;
    /* the cold store's table rebuilds (growth), by the index's own counters */
    double rebuild_ns = (double)st.table_rebuild_ns / (double)holdings;
    double rebuild_slots = (double)st.table_rebuild_slots / (double)holdings;
    uint64_t rebuilds = st.table_rebuilds;

    /* store again (warm: everything already present, idempotent) */
    t0 = kvi_now_ns();
    c0 = cpu_ns();
    store_again(ix, &s, b);
    double restore_ns = (double)(kvi_now_ns() - t0) / (double)holdings;
    double restore_cpu = (double)(cpu_ns() - c0) / (double)holdings;

    /* queries by jump size */
    static const uint32_t jumps[] = {1, 8, 32, 64, 256, 0};
    struct qstat hit[6], part[6];
    printf("\n%-10s %14s %14s %14s %14s\n", "jump", "hit mean ns", "hit p99 ns", "partial mean", "partial p99");
    for (size_t j = 0; j < KVI_ARRAY_LEN(jumps); j++) {
        kvi_index_set_jump(ix, jumps[j]);
        hit[j] = time_queries(ix, &s, c.queries, false, c.seed + j);
        part[j] = time_queries(ix, &s, c.queries, true, c.seed + 100 + j);
        char name[16];
        snprintf(name, sizeof name, jumps[j] ? "%u" : "end", jumps[j]);
        printf("%-10s %14.0f %14.0f %14.0f %14.0f\n", name, hit[j].mean_ns, hit[j].p99_ns, part[j].mean_ns,
               part[j].p99_ns);
    }
    kvi_index_set_jump(ix, KVI_DEFAULT_JUMP);
    struct qstat dhit = time_queries(ix, &s, c.queries, false, c.seed + 1000);
    struct qstat dpart = time_queries(ix, &s, c.queries, true, c.seed + 2000);

    /* prefix-key computation alone, for the breakdown */
    uint64_t *keys = kvi_xmalloc(c.depth * sizeof(uint64_t));
    t0 = kvi_now_ns();
    for (uint32_t i = 0; i < c.queries; i++)
        kvi_index_prefix_keys(ix, content_of(&s, i % c.seqs), c.depth, keys);
    double keys_ns = (double)(kvi_now_ns() - t0) / c.queries;
    free(keys);

    /* readers, idle and under writes */
    double wbps1 = 0, wbps2 = 0;
    struct qstat idle1 = readers_run(ix, &s, 1, false, c.reader_secs, NULL);
    struct qstat busy1 = readers_run(ix, &s, 1, true, c.reader_secs, &wbps1);
    struct qstat idle2 = readers_run(ix, &s, 2, false, c.reader_secs, NULL);
    struct qstat busy2 = readers_run(ix, &s, 2, true, c.reader_secs, &wbps2);

    /* remove everything, leaves first */
    t0 = kvi_now_ns();
    c0 = cpu_ns();
    for (uint32_t q = 0; q < c.seqs; q++)
        for (uint32_t r = 0; r < c.replicas; r++)
            remove_seq(ix, &s, q, r, tmp);
    double remove_ns = (double)(kvi_now_ns() - t0) / (double)holdings;
    double remove_cpu = (double)(cpu_ns() - c0) / (double)holdings;
    kvi_index_reclaim(ix, 0);
    struct kvi_index_stats st2;
    kvi_index_stats(ix, &st2);
    if (st2.holdings != 0 || st2.entries != 0)
        kvi_die("index not empty after removing everything");

    /* store into a fresh index pre-sized with kvi_index_reserve and
     * kvi_index_reserve_slot: no rehash and no fresh page left in the loop */
    kvi_index_destroy(ix);
    ix = kvi_index_create(&icfg);
    if (c.seq_tables)
        seq_tables_on(ix);
    uint64_t *per_inst = kvi_xcalloc(c.workers, sizeof(uint64_t));
    for (uint32_t w = 0; w < c.workers; w++)
        if ((uint32_t)kvi_index_intern_instance(ix, 1000 + w, NULL, false) != w)
            kvi_die("dense ids differ from the first index's");
    for (uint32_t q = 0; q < c.seqs * c.replicas; q++)
        per_inst[s.owner[q]] += c.depth;
    if (kvi_index_reserve(ix, 0, (uint64_t)c.seqs * c.depth) != 0)
        kvi_die("kvi_index_reserve failed");
    for (uint32_t w = 0; w < c.workers; w++)
        if (per_inst[w] > 0 && kvi_index_reserve_slot(ix, w, 0, KVI_TIER_GPU, per_inst[w]) != 0)
            kvi_die("kvi_index_reserve_slot failed");
    free(per_inst);
    kvi_index_stats(ix, &st);
    uint64_t pre_rebuilds = st.table_rebuilds;
    t0 = kvi_now_ns();
    c0 = cpu_ns();
    store_presized(ix, &s, b);
    double presized_ns = (double)(kvi_now_ns() - t0) / (double)holdings;
    double presized_cpu = (double)(cpu_ns() - c0) / (double)holdings;
    kvi_index_stats(ix, &st);
    pre_rebuilds = st.table_rebuilds - pre_rebuilds;

    printf("\n%-44s %12s\n", "operation", "value");
    printf("%-44s %12s %12s\n", "", "wall", "thread cpu");
    printf("%-44s %12.1f %12.1f\n", "store, ns per block (cold)", store_ns, store_cpu);
    printf("%-44s %12.1f  (%llu rebuilds, %.2f slots moved per block)\n", "  of which table rebuilds, ns per block",
           rebuild_ns, (unsigned long long)rebuilds, rebuild_slots);
    printf("%-44s %12.1f %12.1f\n", "store, ns per block (idempotent re-store)", restore_ns, restore_cpu);
    printf("%-44s %12.1f %12.1f  (%llu table rebuilds)\n", "store, ns per block (pre-sized index)", presized_ns,
           presized_cpu, (unsigned long long)pre_rebuilds);
    printf("%-44s %12.1f %12.1f\n", "remove, ns per block (tail first)", remove_ns, remove_cpu);
    printf("%-44s %12.0f %12.0f\n", "find full hit, ns per query (default jump)", dhit.mean_ns, dhit.cpu_mean_ns);
    printf("%-44s %12.0f %12.0f\n", "find partial, ns per query (default jump)", dpart.mean_ns, dpart.cpu_mean_ns);
    printf("%-44s %12.0f\n", "  of which prefix keys for D blocks, ns", keys_ns);
    printf("%-44s %12.1f\n", "bytes per (block, worker)", bytes_per);
    printf("%-44s %12.0f / %.0f\n", "1 reader idle p50 / p99 ns", idle1.p50_ns, idle1.p99_ns);
    printf("%-44s %12.0f / %.0f  (writer %.1f M blocks/s)\n", "1 reader under writes p50 / p99 ns", busy1.p50_ns,
           busy1.p99_ns, wbps1 / 1e6);
    printf("%-44s %12.0f / %.0f\n", "2 readers idle p50 / p99 ns", idle2.p50_ns, idle2.p99_ns);
    printf("%-44s %12.0f / %.0f  (writer %.1f M blocks/s)\n", "2 readers under writes p50 / p99 ns", busy2.p50_ns,
           busy2.p99_ns, wbps2 / 1e6);
    printf("(2 readers + 1 writer on a 2-core machine oversubscribes the cores)\n\n");
    printf("{\"bench\":\"micro\",\"blocks\":%llu,\"workers\":%u,\"depth\":%u,\"replicas\":%u,"
           "\"store_ns_per_block\":%.1f,\"remove_ns_per_block\":%.1f,\"find_hit_ns\":%.0f,"
           "\"find_partial_ns\":%.0f,\"reader_p99_ns_idle\":%.0f,\"reader_p99_ns_under_writes\":%.0f,"
           "\"reader2_p99_ns_idle\":%.0f,\"reader2_p99_ns_under_writes\":%.0f,\"bytes_per_block_worker\":%.1f,"
           "\"store_cpu_ns_per_block\":%.1f,\"remove_cpu_ns_per_block\":%.1f,\"find_hit_cpu_ns\":%.0f,"
           "\"find_partial_cpu_ns\":%.0f,\"store_presized_ns_per_block\":%.1f,\"store_presized_cpu_ns_per_block\":%.1f,"
           "\"store_rebuild_ns_per_block\":%.1f,\"store_rebuild_slots_per_block\":%.2f,"
           "\"store_again_ns_per_block\":%.1f,\"prefix_keys_ns\":%.0f,\"seq_tables\":%d}\n",
           (unsigned long long)c.seqs * c.depth, c.workers, c.depth, c.replicas, store_ns, remove_ns, dhit.mean_ns,
           dpart.mean_ns, idle1.p99_ns, busy1.p99_ns, idle2.p99_ns, busy2.p99_ns, bytes_per, store_cpu, remove_cpu,
           dhit.cpu_mean_ns, dpart.cpu_mean_ns, presized_ns, presized_cpu, rebuild_ns, rebuild_slots, restore_ns,
           keys_ns, c.seq_tables ? 1 : 0);

    free(b);
    free(tmp);
    free(s.content);
    free(s.eh);
    free(s.owner);
    kvi_index_destroy(ix);
    kvi_rcu_unregister_thread();
    return 0;
}
