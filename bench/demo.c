/*
 * kvidx-bench demo: mock engines publishing a Mooncake trace over ZMQ into a
 * running kvidxd, registered over HTTP (see bench/demo.h for the model and
 * the DESIGN).
 */
#include "bench/demo.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvidx/publisher.h>

#include "bench/mock_engine.h"
#include "bench/trace_map.h"
#include "engine/common.h"
#include "net/http_client.h"
#include "net/log.h"

#define DEMO_TICK_MS 20
#define DEMO_FIRST_REPORT_MS 5000.0
#define DEMO_REPORT_MS 30000.0
#define DEMO_HINT_IDS 3
#define DEMO_REG_WAIT_MS 20000
/* Engine speed (wall-clock ms): 200 k prompt tokens/s, 2 ms per output token. */
#define DEMO_PREFILL_TOK_PER_MS 200.0
#define DEMO_DECODE_MS_PER_TOK 2.0

struct demo_engine {
    struct kvi_demo *d;
    uint32_t idx;
    struct kvidx_pub *pub;
    struct kvi_mock_engine *eng;
    uint32_t *reqs; /* this engine's requests, in trace order */
    size_t n_reqs, next;
    uint64_t loop;
    uint32_t *tok;  /* token scratch of a stored event */
    size_t tok_cap;
    bool pub_failed;
    uint32_t hint_req, hint_blocks; /* the last stored prefix: blocks [0, hint_blocks) of hint_req */
    uint64_t hint_seq;              /* 0: none yet */
    uint64_t requests, stores, stored_blocks, removes, removed_blocks;
};

struct kvi_demo {
    struct kvi_demo_config cfg;
    char model[128];
    char trace_path[4096];
    struct kvi_trace trace;
    struct kvi_trace_workload w;
    bool have_w;
    char url[1024];
    char token[512];
    pthread_t tid;
    bool started;
    _Atomic bool stop;
    _Atomic bool running; /* every engine registered, events flowing */
    _Atomic bool ended;   /* the demo thread returned (stopped, or nothing registered) */
    struct demo_engine *e;
    double period_ms; /* one loop of the trace, wall-clock */
    double scale;     /* wall ms per trace ms */
    uint64_t t_first; /* arrival of the trace's first request (trace ms) */
    uint64_t store_seq;
};

void kvi_demo_config_init(struct kvi_demo_config *c)
{
    *c = (struct kvi_demo_config){
        .url = "http://127.0.0.1:8090",
        .admin_token = NULL,
        .trace_path = NULL,
        .workers = 4,
        .first_instance = 1,
        .model = "demo",
        .block_size = 128,
        .gpu_blocks = 8192,
        .requests_per_s = 20.0,
        .synth_requests = 3000,
        .seed = 42,
    };
}

int kvi_demo_load_trace(const struct kvi_demo_config *c, struct kvi_trace *t, char *err, size_t err_len)
{
    kvi_trace_init(t);
    if (c->trace_path == NULL || c->trace_path[0] == '\0' || strcmp(c->trace_path, "synthetic") == 0) {
        struct kvi_trace_synth_cfg sc;
        kvi_trace_synth_defaults(&sc);
        /* the default generator's arrival rate (12,000 requests an hour) */
        sc.span_s = sc.span_s * (double)c->synth_requests / (double)sc.requests;
        sc.requests = c->synth_requests;
        sc.seed = c->seed;
        kvi_trace_synthesize(t, &sc);
        return 0;
    }
    char msg[512] = "";
    int rc = kvi_trace_load(t, c->trace_path, msg, sizeof msg);
    if (rc < 0) {
        snprintf(err, err_len, "--trace %s: %s", c->trace_path, msg[0] ? msg : strerror(-rc));
        kvi_trace_free(t);
        return rc;
    }
    if (t->n_req == 0) {
        snprintf(err, err_len, "--trace %s: no requests", c->trace_path);
        kvi_trace_free(t);
        return -EINVAL;
    }
    return 0;
}

void kvi_demo_workload_config(const struct kvi_demo_config *c, struct kvi_trace_workload_cfg *wc)
{
    kvi_trace_workload_defaults(wc);
    wc->n_workers = c->workers;
    wc->worker_dup = 1;
    wc->block_size = c->block_size;
    wc->gpu_blocks = c->gpu_blocks;
    wc->distinct_tokens = false; /* every token of hash id h is h: prompts are easy to type */
    wc->seed = c->seed;
}

struct kvi_demo *kvi_demo_create(const struct kvi_demo_config *c, char *err, size_t err_len)
{
    if (c->workers == 0 || c->workers > 1024) {
        snprintf(err, err_len, "--workers: expected 1..1024, got %" PRIu32, c->workers);
        return NULL;
    }
    if (c->block_size == 0 || KVI_TRACE_ID_TOKENS % c->block_size != 0 || c->gpu_blocks == 0 ||
        !(c->requests_per_s > 0) || c->synth_requests == 0 || c->model == NULL || c->model[0] == '\0' ||
        strlen(c->model) >= sizeof ((struct kvi_demo *)NULL)->model || c->url == NULL ||
        strlen(c->url) >= sizeof ((struct kvi_demo *)NULL)->url ||
        (c->admin_token != NULL && strlen(c->admin_token) >= sizeof ((struct kvi_demo *)NULL)->token)) {
        snprintf(err, err_len, "invalid demo settings");
        return NULL;
    }
    struct kvi_demo *d = kvi_xcalloc(1, sizeof *d);
    d->cfg = *c;
    snprintf(d->model, sizeof d->model, "%s", c->model);
    d->cfg.model = d->model;
    /* the base URL without a trailing '/' */
    snprintf(d->url, sizeof d->url, "%s", c->url);
    for (size_t n = strlen(d->url); n > 0 && d->url[n - 1] == '/'; n--)
        d->url[n - 1] = '\0';
    d->cfg.url = d->url;
    if (c->admin_token != NULL) {
        snprintf(d->token, sizeof d->token, "%s", c->admin_token);
        d->cfg.admin_token = d->token;
    }
    if (c->trace_path != NULL) {
        snprintf(d->trace_path, sizeof d->trace_path, "%s", c->trace_path);
        d->cfg.trace_path = d->trace_path;
    }
    if (kvi_demo_load_trace(&d->cfg, &d->trace, err, err_len) < 0) {
        free(d);
        return NULL;
    }
    return d;
}

/* ---- registrations (POST /register) -------------------------------------------------- */

static bool demo_cancelled(void *ud)
{
    const struct kvi_demo *d = ud;
    return atomic_load_explicit(&d->stop, memory_order_relaxed);
}

/* Register every engine at the daemon, as each engine of a fleet would.
 * @return the number registered. */
static uint32_t demo_register_all(struct kvi_demo *d)
{
    struct kvi_http_client_options o;
    kvi_http_client_options_init(&o);
    o.proto = KVI_HTTP_CLIENT_H1;
    o.bearer_token = d->cfg.admin_token;
    o.timeout_ms = DEMO_REG_WAIT_MS;
    o.cancel = demo_cancelled;
    o.cancel_ud = d;
    struct kvi_http_client *c = kvi_http_client_create(&o);
    if (c == NULL) {
        kvi_log_error("demo: cannot create an HTTP client: %s", strerror(errno));
        return 0;
    }
    char url[1100];
    snprintf(url, sizeof url, "%s/register", d->url);
    uint32_t ok = 0;
    for (uint32_t i = 0; i < d->cfg.workers && !atomic_load_explicit(&d->stop, memory_order_relaxed); i++) {
        char body[1024];
        int n = snprintf(body, sizeof body,
                         "{\"instance_id\":%" PRIu64 ",\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\","
                         "\"model_name\":\"%s\",\"tenant_id\":\"default\",\"block_size\":%" PRIu32
                         ",\"dp_rank\":0}",
                         d->cfg.first_instance + i, kvidx_pub_endpoint(d->e[i].pub),
                         kvidx_pub_replay_endpoint(d->e[i].pub), d->model, d->cfg.block_size);
        struct kvi_http_result res;
        int rc = kvi_http_post(c, url, "application/json", body, (size_t)n, NULL, NULL, &res);
        if (rc == 0)
            ok++;
        else
            kvi_log_warn("demo: cannot register engine %" PRIu64 " at %s: %s%s%s", d->cfg.first_instance + i, url,
                         res.status ? "" : strerror(-rc), res.status ? "" : ": ", res.error);
    }
    kvi_http_client_free(c);
    return ok;
}

/* ---- engines ------------------------------------------------------------------------------- */

/* Prompt tokens the trace's ids cover (as the workload counts them). */
static uint64_t eff_input(const struct kvi_trace_request *r)
{
    return KVI_MIN((uint64_t)r->input_len, (uint64_t)r->n_ids * KVI_TRACE_ID_TOKENS);
}

static void demo_emit(void *ctx, const struct kvi_mock_event *ev)
{
    struct demo_engine *e = ctx;
    struct kvi_demo *d = e->d;
    uint32_t bs = d->cfg.block_size;
    int rc;
    if (ev->kind == KVI_MOCK_STORED) {
        size_t nt = (size_t)ev->n * bs;
        if (nt > e->tok_cap) {
            e->tok_cap = nt;
            e->tok = kvi_xrealloc(e->tok, nt * sizeof *e->tok);
        }
        for (uint32_t i = 0; i < ev->n; i++)
            kvi_trace_block_tokens(&d->w, (uint32_t)ev->tag, ev->pos + i, e->tok + (size_t)i * bs);
        rc = kvidx_pub_publish_stored(e->pub, ev->engine_hash, ev->n, ev->has_parent ? &ev->parent : NULL, e->tok,
                                      nt, bs, NULL);
        e->stores++;
        e->stored_blocks += ev->n;
        e->hint_req = (uint32_t)ev->tag;
        e->hint_blocks = ev->pos + ev->n;
        e->hint_seq = ++d->store_seq;
    } else {
        rc = kvidx_pub_publish_removed(e->pub, ev->engine_hash, ev->n, NULL);
        e->removes++;
        e->removed_blocks += ev->n;
    }
    if (rc != 0 && !e->pub_failed) {
        e->pub_failed = true;
        kvi_log_warn("demo: engine %" PRIu64 ": publishing failed: %s", d->cfg.first_instance + e->idx,
                     strerror(-rc));
    }
}

static int demo_setup(struct kvi_demo *d)
{
    struct kvi_trace_workload_cfg wc;
    kvi_demo_workload_config(&d->cfg, &wc);
    if (kvi_trace_workload_build(&d->w, &d->trace, &wc, NULL, NULL) < 0) {
        kvi_log_error("demo: cannot build the workload");
        return -EINVAL;
    }
    d->have_w = true;
    const struct kvi_trace *t = &d->trace;
    d->t_first = t->req[0].t_ms;
    uint64_t span = t->req[t->n_req - 1].t_ms - d->t_first;
    double loop_ms = (double)t->n_req / d->cfg.requests_per_s * 1000.0;
    d->scale = span > 0 ? loop_ms / (double)span : 0.0;
    d->period_ms = loop_ms + loop_ms / (double)t->n_req; /* one mean inter-arrival between loops */
    d->e = kvi_xcalloc(d->cfg.workers, sizeof *d->e);
    for (uint32_t i = 0; i < d->cfg.workers; i++) {
        d->e[i].d = d;
        d->e[i].idx = i;
        d->e[i].reqs = kvi_xmalloc(t->n_req * sizeof *d->e[i].reqs);
    }
    for (size_t r = 0; r < t->n_req; r++) {
        struct demo_engine *e = &d->e[d->w.worker_of_req[r]];
        e->reqs[e->n_reqs++] = (uint32_t)r;
    }
    struct kvi_mock_cfg mc = {
        .num_blocks = d->cfg.gpu_blocks,
        .block_size = d->cfg.block_size,
        .prefill_tokens_per_ms = DEMO_PREFILL_TOK_PER_MS,
        .decode_ms_per_token = DEMO_DECODE_MS_PER_TOK,
    };
    for (uint32_t i = 0; i < d->cfg.workers; i++) {
        struct demo_engine *e = &d->e[i];
        struct kvidx_pub_config pc;
        kvidx_pub_config_init(&pc);
        pc.endpoint = "tcp://127.0.0.1:*";
        pc.replay_endpoint = "tcp://127.0.0.1:*";
        e->pub = kvidx_pub_create(&pc);
        if (e->pub == NULL) {
            kvi_log_error("demo: cannot create the publisher of engine %" PRIu32 ": %s", i, strerror(errno));
            return -errno;
        }
        mc.hash_seed = kvi_fmix64(d->cfg.seed * 0x9e3779b97f4a7c15ull + i + 1);
        e->eng = kvi_mock_create(&mc, demo_emit, e);
        if (e->eng == NULL) {
            kvi_log_error("demo: invalid mock engine settings");
            return -EINVAL;
        }
    }
    return 0;
}

/* Wall-clock arrival (ms since the start) of request r in loop k. */
static double demo_arrival(const struct kvi_demo *d, uint64_t k, uint32_t r)
{
    double within = d->scale > 0 ? (double)(d->trace.req[r].t_ms - d->t_first) * d->scale
                                 : d->period_ms * (double)r / (double)d->trace.n_req;
    return (double)k * d->period_ms + within;
}

/* Submit what is due, run the engine to now, send its events as one batch. */
static void demo_engine_step(struct demo_engine *e, double now_ms)
{
    struct kvi_demo *d = e->d;
    while (e->n_reqs > 0) {
        uint32_t r = e->reqs[e->next];
        double at = demo_arrival(d, e->loop, r);
        if (at > now_ms)
            break;
        const struct kvi_trace_request *q = &d->trace.req[r];
        struct kvi_mock_request mr = {
            .tag = r,
            .arrival_ms = at,
            .input_tokens = (uint32_t)eff_input(q),
            .output_tokens = q->output_len,
            .content = d->w.req_content[r],
        };
        kvi_mock_submit(e->eng, &mr); /* a request larger than the pool is dropped */
        e->requests++;
        if (++e->next == e->n_reqs) {
            e->next = 0;
            e->loop++;
        }
    }
    kvi_mock_advance(e->eng, now_ms);
    if (kvidx_pub_pending(e->pub) > 0) {
        int rc = kvidx_pub_flush(e->pub, NULL);
        if (rc != 0 && !e->pub_failed) {
            e->pub_failed = true;
            kvi_log_warn("demo: engine %" PRIu64 ": flush failed: %s", d->cfg.first_instance + e->idx, strerror(-rc));
        }
    }
}

/* Log a curl line whose prompt hits: hash ids some engine stored last. */
static void demo_hint(struct kvi_demo *d)
{
    const struct demo_engine *best = NULL;
    uint32_t best_ids = 0;
    for (uint32_t i = 0; i < d->cfg.workers; i++) {
        const struct demo_engine *e = &d->e[i];
        if (e->hint_seq == 0)
            continue;
        const struct kvi_trace_request *q = &d->trace.req[e->hint_req];
        uint64_t tokens = KVI_MIN((uint64_t)e->hint_blocks * d->cfg.block_size, eff_input(q));
        uint32_t ids = (uint32_t)KVI_MIN(tokens / KVI_TRACE_ID_TOKENS, (uint64_t)DEMO_HINT_IDS);
        if (ids > best_ids || (ids == best_ids && ids > 0 && e->hint_seq > best->hint_seq)) {
            best = e;
            best_ids = ids;
        }
    }
    char list[128] = "0";
    uint64_t worker = 0;
    if (best != NULL && best_ids > 0) {
        const struct kvi_trace_request *q = &d->trace.req[best->hint_req];
        size_t o = 0;
        for (uint32_t k = 0; k < best_ids; k++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%" PRIu64, k ? " " : "",
                                  d->trace.ids[q->ids_off + k]);
        worker = d->cfg.first_instance + best->idx;
    }
    if (worker)
        kvi_log_info("demo: worker %" PRIu64 " holds hash ids %s (%u tokens; id 0 is the system prompt every request "
                     "starts with). Query:",
                     worker, list, (unsigned)(best_ids * KVI_TRACE_ID_TOKENS));
    else
        kvi_log_info("demo: every request starts with hash id 0 (512 tokens of 0). Query:");
    kvi_log_info("  curl -s %s/query -H 'Content-Type: application/json' -d "
                 "\"{\\\"model_name\\\":\\\"%s\\\",\\\"token_ids\\\":[$(for id in %s; do yes $id | head -n %u; "
                 "done | paste -sd,)]}\"",
                 d->url, d->model, list, (unsigned)KVI_TRACE_ID_TOKENS);
}

static void demo_report(struct kvi_demo *d, double now_ms)
{
    uint64_t req = 0, st = 0, sb = 0, rm = 0, rb = 0, cached = 0;
    for (uint32_t i = 0; i < d->cfg.workers; i++) {
        const struct demo_engine *e = &d->e[i];
        req += e->requests;
        st += e->stores;
        sb += e->stored_blocks;
        rm += e->removes;
        rb += e->removed_blocks;
        cached += kvi_mock_cached_blocks(e->eng);
    }
    double loop = floor(now_ms / d->period_ms);
    kvi_log_info("demo: loop %.0f, %.0f %% through the trace: %" PRIu64 " requests; published %" PRIu64
                 " stored events (%" PRIu64 " blocks) and %" PRIu64 " removed events (%" PRIu64
                 " blocks); the engines cache %" PRIu64 " of %" PRIu64 " blocks",
                 loop + 1, 100.0 * (now_ms - loop * d->period_ms) / d->period_ms, req, st, sb, rm, rb, cached,
                 (uint64_t)d->cfg.gpu_blocks * d->cfg.workers);
    demo_hint(d);
}

static void demo_run(struct kvi_demo *d)
{
    uint64_t t0 = kvi_now_ns();
    double next_report = DEMO_FIRST_REPORT_MS;
    while (!atomic_load_explicit(&d->stop, memory_order_relaxed)) {
        double now_ms = (double)(kvi_now_ns() - t0) / 1e6;
        for (uint32_t i = 0; i < d->cfg.workers; i++)
            demo_engine_step(&d->e[i], now_ms);
        if (now_ms >= next_report) {
            demo_report(d, now_ms);
            next_report = now_ms + DEMO_REPORT_MS;
        }
        struct timespec ts = {0, DEMO_TICK_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void demo_teardown(struct kvi_demo *d)
{
    for (uint32_t i = 0; d->e != NULL && i < d->cfg.workers; i++) {
        kvi_mock_destroy(d->e[i].eng);
        kvidx_pub_destroy(d->e[i].pub);
        free(d->e[i].reqs);
        free(d->e[i].tok);
    }
    free(d->e);
    d->e = NULL;
    if (d->have_w)
        kvi_trace_workload_free(&d->w);
    d->have_w = false;
}

static void *demo_main(void *arg)
{
    struct kvi_demo *d = arg;
    pthread_setname_np(pthread_self(), "kvi-demo");
    if (demo_setup(d) == 0) {
        uint32_t ok = demo_register_all(d);
        /* Let the listeners' SUBs connect before the first batch. Not needed for correctness (a
         * listener that misses batches replays them from the engine's ROUTER), but it keeps the
         * demo's gap and replay counters at 0. */
        for (int i = 0; i < 10 && !atomic_load_explicit(&d->stop, memory_order_relaxed); i++) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (ok > 0 && !atomic_load_explicit(&d->stop, memory_order_relaxed)) {
            kvi_log_info("demo: %" PRIu32 " mock engine(s) registered as instances %" PRIu64 "..%" PRIu64
                         " of model \"%s\" (block size %" PRIu32 ", %" PRIu32
                         " GPU blocks each), publishing the %s trace (%zu requests) over ZMQ on loopback, "
                         "%.0f requests/s, one loop every %.0f s",
                         ok, d->cfg.first_instance, d->cfg.first_instance + d->cfg.workers - 1, d->model,
                         d->cfg.block_size, d->cfg.gpu_blocks, d->trace.name, d->trace.n_req,
                         d->cfg.requests_per_s, d->period_ms / 1e3);
            kvi_log_info("demo: try  curl -s %s/workers?model_name=%s  and  curl -s %s/metrics", d->url, d->model,
                         d->url);
            atomic_store_explicit(&d->running, ok == d->cfg.workers, memory_order_relaxed);
            demo_run(d);
        } else if (ok == 0) {
            kvi_log_error("demo: no engine could be registered; the demo does not run");
        }
    }
    demo_teardown(d);
    atomic_store_explicit(&d->ended, true, memory_order_relaxed);
    return NULL;
}

int kvi_demo_start(struct kvi_demo *d)
{
    int rc = pthread_create(&d->tid, NULL, demo_main, d);
    if (rc != 0)
        return -rc;
    d->started = true;
    return 0;
}

bool kvi_demo_running(const struct kvi_demo *d)
{
    return atomic_load_explicit(&d->running, memory_order_relaxed);
}

void kvi_demo_destroy(struct kvi_demo *d)
{
    if (d == NULL)
        return;
    atomic_store_explicit(&d->stop, true, memory_order_relaxed);
    if (d->started)
        pthread_join(d->tid, NULL);
    demo_teardown(d);
    kvi_trace_free(&d->trace);
    free(d);
}

/* ---- kvidx-bench demo ------------------------------------------------------------------------ */

static void demo_usage(FILE *f)
{
    fprintf(f, "usage: kvidx-bench demo [--url URL] [--trace PATH] [--workers N] [--admin-token TOKEN]\n"
               "\n"
               "Mock inference engines that publish a Mooncake trace over ZMQ into a running kvidxd\n"
               "and register themselves there (model \"demo\", instances 1..N). Runs until Ctrl-C.\n"
               "  --url URL            kvidxd's base URL (default http://127.0.0.1:8090)\n"
               "  --trace PATH         Mooncake JSONL (default: the built-in synthetic trace)\n"
               "  --workers N          mock engines, 1..1024 (default 4)\n"
               "  --admin-token TOKEN  for a kvidxd started with --admin-token (env KVIDX_ADMIN_TOKEN)\n");
}

int kvi_bench_demo(int argc, char **argv)
{
    struct kvi_demo_config c;
    kvi_demo_config_init(&c);
    c.admin_token = getenv("KVIDX_ADMIN_TOKEN");
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            demo_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--url") == 0 && v != NULL) {
            c.url = v;
        } else if (strcmp(argv[i], "--trace") == 0 && v != NULL) {
            c.trace_path = v;
        } else if (strcmp(argv[i], "--admin-token") == 0 && v != NULL) {
            c.admin_token = v;
        } else if (strcmp(argv[i], "--workers") == 0 && v != NULL) {
            char *end;
            unsigned long n = strtoul(v, &end, 10);
            c.workers = *end == '\0' && n <= UINT32_MAX ? (uint32_t)n : 0;
        } else {
            fprintf(stderr, "kvidx-bench demo: unknown or incomplete option '%s'\n", argv[i]);
            demo_usage(stderr);
            return 2;
        }
        i++;
    }
    char err[600];
    struct kvi_demo *d = kvi_demo_create(&c, err, sizeof err);
    if (d == NULL) {
        fprintf(stderr, "kvidx-bench demo: %s\n", err);
        return 2;
    }
    /* SIGINT and SIGTERM end the demo: blocked here (the demo thread inherits the mask), taken by sigwait. */
    sigset_t sigs, was;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &was);
    int rc = kvi_demo_start(d);
    if (rc != 0) {
        fprintf(stderr, "kvidx-bench demo: cannot start: %s\n", strerror(-rc));
        kvi_demo_destroy(d);
        pthread_sigmask(SIG_SETMASK, &was, NULL);
        return 1;
    }
    /* until a signal, or the demo thread gave up (no engine could be registered) */
    struct timespec tick = {0, 200 * 1000000L};
    int sig = -1;
    while (sig < 0 && !atomic_load_explicit(&d->ended, memory_order_relaxed))
        sig = sigtimedwait(&sigs, NULL, &tick);
    if (sig > 0)
        kvi_log_info("demo: stopping (%s)", strsignal(sig));
    kvi_demo_destroy(d);
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    return sig > 0 ? 0 : 1;
}
