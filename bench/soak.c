/*
 * kvidx-bench soak (see bench/soak.h).
 *
 * DESIGN
 *   Threads: the caller (control: loads the trace, spawns kvidxd through
 *   trace_e2e.h, creates and registers the publishers, runs the handshake,
 *   samples kvidxd's RSS and /metrics while the lanes run, then waits for the
 *   drain, compares /dump with the model and unregisters), `lanes` lane
 *   threads, the publishers' replay threads and one shared ZMQ I/O thread.
 *   Ownership: lane k owns the workers w with w % lanes == k: their
 *   publishers, engines and their part of the model (kvi_soak_model keeps one
 *   table per worker), so a lane never touches another lane's state. The
 *   caller creates everything before the lanes start and reads it after the
 *   joins (thread creation and join are the happens-before edges).
 *   Start: lanes connect their h2c connection, meet the caller at a barrier
 *   and wait for t0 (R1: release store by the caller, A1: acquire loads in
 *   the lanes). Stop: at t0 + seconds, or when the caller sets `stop` (kvidxd
 *   died); relaxed, the join orders the rest.
 *   The trace is walked lazily: each lane scans the trace's requests in order
 *   and takes those whose (session, loop) falls on one of its workers, so no
 *   timeline is ever built and memory does not grow with the run length.
 */
#include "bench/soak.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/trace.h"
#include "bench/trace_map.h"
#include "engine/common.h"

#define NO_WORKER UINT32_MAX

#include <kvidx/publisher.h>
#include <msgpack.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <zmq.h>

#include "bench/bench.h"
#include "bench/h2c.h"
#include "bench/hist.h"
#include "bench/mock_engine.h"
#include "bench/trace_e2e.h"
#include "engine/hash.h"
#include "net/http_client.h"

#define TICK_NS 5000000ull  /* a lane advances its engines and flushes at least this often */
#define SLEEP_MIN_NS 50000  /* below this a lane yields instead of sleeping */
#define HANDSHAKE_MS 30000  /* every listener connected and caught up within this */
#define DRAIN_MS 120000     /* everything published applied within this after the load */
#define H2C_TIMEOUT_MS 30000
#define CTRL_TIMEOUT_MS 300000 /* control requests, /dump included */
#define PROMPT_SALT 0x70726f6d70742121ull
#define OUTPUT_SALT 0x6f75747075742121ull

struct soak_run;
struct soak_lane;

struct soak_worker {
    struct soak_lane *lane;
    uint32_t id;
    bool dirty; /* events appended since the last flush */
    struct kvidx_pub *pub;
    struct kvi_mock_engine *eng;
};

struct soak_lane {
    struct soak_run *run;
    uint32_t id;
    pthread_t tid;
    struct kvi_h2c *h2;
    /* the cursor: the lane's next request (trace index `next` of loop `loop`) */
    uint64_t loop;
    size_t next;
    uint32_t next_worker; /* NO_WORKER: no request of this lane within a whole scan */
    double next_sim;      /* its arrival, engine ms */
    double last_arrival;
    uint32_t *dirty;
    size_t n_dirty;
    uint32_t *tok;
    size_t tcap;
    uint64_t *content;
    size_t ccap;
    uint8_t *qbin;
    size_t qcap;
    msgpack_sbuffer body;
    msgpack_unpacked ans;
    struct kvi_hist qlat, lag;
    uint64_t loops; /* loops with a request issued by this lane */
    uint64_t requests, dropped, queries, query_errors, hits, publish_errors;
    uint64_t ev_stored, ev_removed, blocks_stored, blocks_removed;
    uint64_t model_rejected, model_applied_blocks, model_removed_known;
    double cpu_s; /* the lane thread's CPU time */
    _Atomic uint64_t live_queries, live_events, live_loop; /* progress lines and backlog samples (relaxed) */
    char err[256];
};

struct soak_run {
    const struct kvi_soak_cfg *cfg;
    const struct kvi_trace *trace;
    struct kvi_soak_model *model;
    struct soak_worker *workers;
    struct soak_lane **lanes;
    char model_name[64];
    uint64_t id0;
    char host[64];
    uint16_t port;
    double loop_sim_ms, trace_scale; /* trace ms -> engine ms inside a loop */
    uint64_t trace_t0;
    uint64_t id_stride;              /* max_id + 1: hash ids of loop L are id + L * stride */
    double ms_per_ns;                /* engine ms per real ns */
    pthread_barrier_t ready;
    _Atomic uint64_t t0;
    uint64_t t_end;                  /* written before t0 is released */
    _Atomic bool stop;
};

static void note(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void note(char *dst, size_t cap, const char *fmt, ...)
{
    if (dst[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

/* ---- the looped trace ------------------------------------------------------------- */

static uint64_t eff_input(const struct kvi_trace_request *q)
{
    return KVI_MIN((uint64_t)q->input_len, (uint64_t)q->n_ids * KVI_TRACE_ID_TOKENS);
}

/* The worker of a session in a loop: fresh sessions every loop. */
static uint32_t worker_of(const struct soak_run *r, uint64_t session, uint64_t loop)
{
    uint64_t k = kvi_fmix64(r->cfg->seed * 0x9e3779b97f4a7c15ull + loop + 1);
    return (uint32_t)(kvi_fmix64(session ^ k) % r->cfg->workers);
}

static double arrival_of(const struct soak_run *r, uint64_t loop, size_t idx)
{
    return (double)loop * r->loop_sim_ms + (double)(r->trace->req[idx].t_ms - r->trace_t0) * r->trace_scale;
}

/* Tokens of block @p pos of request tag = loop << 32 | trace index: the prompt's
 * from its hash ids (fresh per loop), then the output's (per request). */
static void block_tokens(const struct soak_run *r, uint64_t tag, uint32_t pos, uint32_t *tok)
{
    uint64_t loop = tag >> 32;
    const struct kvi_trace_request *q = &r->trace->req[(uint32_t)tag];
    uint64_t in = eff_input(q);
    uint32_t bs = r->cfg->block_size;
    uint64_t k0 = (uint64_t)pos * bs;
    for (uint32_t i = 0; i < bs; i++) {
        uint64_t k = k0 + i;
        if (k < in) {
            uint64_t id = r->trace->ids[q->ids_off + k / KVI_TRACE_ID_TOKENS] + loop * r->id_stride;
            tok[i] = (uint32_t)((kvi_fmix64(id ^ PROMPT_SALT) + k % KVI_TRACE_ID_TOKENS) & 0x7fffffffu);
        } else {
            tok[i] = (uint32_t)((kvi_fmix64(tag ^ OUTPUT_SALT) + (k - in)) & 0x7fffffffu);
        }
    }
}

/* Move the cursor to the lane's first request at or after (loop, next). */
static void cursor_seek(struct soak_lane *l)
{
    struct soak_run *r = l->run;
    size_t n = r->trace->n_req;
    for (size_t scanned = 0; scanned <= n; scanned++) {
        if (l->next >= n) {
            l->next = 0;
            l->loop++;
            atomic_store_explicit(&l->live_loop, l->loop, memory_order_relaxed);
        }
        uint32_t w = worker_of(r, r->trace->req[l->next].session, l->loop);
        if (w % r->cfg->lanes == l->id) {
            l->next_worker = w;
            l->next_sim = arrival_of(r, l->loop, l->next);
            return;
        }
        l->next++;
    }
    l->next_worker = NO_WORKER; /* resume the scan from here when this time comes */
    l->next_sim = arrival_of(r, l->loop, KVI_MIN(l->next, n - 1));
}

/* ---- lanes: events ------------------------------------------------------------------ */

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    *cap = KVI_MAX(need, 2 * *cap);
    return kvi_xrealloc(p, *cap * elem);
}

static void mark_dirty(struct soak_lane *l, struct soak_worker *sw)
{
    if (!sw->dirty) {
        sw->dirty = true;
        l->dirty[l->n_dirty++] = sw->id;
    }
}

static void flush_dirty(struct soak_lane *l)
{
    for (size_t i = 0; i < l->n_dirty; i++) {
        struct soak_worker *sw = &l->run->workers[l->dirty[i]];
        int rc = kvidx_pub_flush(sw->pub, NULL);
        if (rc != 0) {
            l->publish_errors++;
            note(l->err, sizeof l->err, "flush: %s (worker %u)", strerror(-rc), sw->id);
        }
        sw->dirty = false;
    }
    l->n_dirty = 0;
}

/* Engine event (on the owning lane): publish it and apply it to the model. */
static void on_event(void *ctx, const struct kvi_mock_event *ev)
{
    struct soak_worker *sw = ctx;
    struct soak_lane *l = sw->lane;
    struct soak_run *r = l->run;
    int rc;
    if (ev->kind == KVI_MOCK_STORED) {
        uint32_t bs = r->cfg->block_size;
        size_t nt = (size_t)ev->n * bs;
        l->tok = grow(l->tok, &l->tcap, nt, sizeof *l->tok);
        for (uint32_t i = 0; i < ev->n; i++)
            block_tokens(r, ev->tag, ev->pos + i, l->tok + (size_t)i * bs);
        rc = kvidx_pub_publish_stored(sw->pub, ev->engine_hash, ev->n, ev->has_parent ? &ev->parent : NULL, l->tok,
                                      nt, bs, NULL);
        if (kvi_soak_model_store(r->model, sw->id, ev->has_parent, ev->parent, ev->engine_hash, ev->content,
                                 ev->n) == 0)
            l->model_applied_blocks += ev->n;
        else
            l->model_rejected++;
        l->ev_stored++;
        l->blocks_stored += ev->n;
    } else {
        rc = kvidx_pub_publish_removed(sw->pub, ev->engine_hash, ev->n, NULL);
        l->model_removed_known += kvi_soak_model_remove(r->model, sw->id, ev->engine_hash, ev->n);
        l->ev_removed++;
        l->blocks_removed += ev->n;
    }
    if (rc != 0) {
        l->publish_errors++;
        note(l->err, sizeof l->err, "publish: %s (worker %u)", strerror(-rc), sw->id);
    }
    atomic_store_explicit(&l->live_events, l->ev_stored + l->ev_removed, memory_order_relaxed);
    mark_dirty(l, sw);
}

/* ---- lanes: queries ------------------------------------------------------------------ */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static bool key_is(const msgpack_object *k, const char *s)
{
    size_t n = strlen(s);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, s, n) == 0;
}

static bool instance_of(const msgpack_object *k, uint64_t *id)
{
    if (k->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *id = k->via.u64;
        return true;
    }
    if (k->type != MSGPACK_OBJECT_STR || k->via.str.size == 0 || k->via.str.size > 20)
        return false;
    char buf[24], *end;
    memcpy(buf, k->via.str.ptr, k->via.str.size);
    buf[k->via.str.size] = '\0';
    if (buf[0] < '0' || buf[0] > '9')
        return false;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *id = v;
    return true;
}

/* A Dynamo score answer {"scores": {instance: {rank: tokens}}, ...} for a query of
 * @p n blocks: only soak workers, whole blocks, at most n.
 * @return 1 (some worker matched), 0 (none), -1 (bad answer, reason in @p why). */
static int check_answer(struct soak_lane *l, const uint8_t *p, size_t len, uint32_t n, char *why, size_t wl)
{
    const struct soak_run *r = l->run;
    size_t off = 0;
    if (msgpack_unpack_next(&l->ans, (const char *)p, len, &off) != MSGPACK_UNPACK_SUCCESS ||
        l->ans.data.type != MSGPACK_OBJECT_MAP) {
        snprintf(why, wl, "the answer is not a msgpack map (%zu bytes)", len);
        return -1;
    }
    const msgpack_object_map *root = &l->ans.data.via.map;
    const msgpack_object *scores = NULL;
    for (uint32_t i = 0; i < root->size; i++)
        if (key_is(&root->ptr[i].key, "scores"))
            scores = &root->ptr[i].val;
    if (scores == NULL || scores->type != MSGPACK_OBJECT_MAP) {
        snprintf(why, wl, "the answer has no \"scores\" map");
        return -1;
    }
    uint32_t bs = r->cfg->block_size;
    int hit = 0;
    for (uint32_t i = 0; i < scores->via.map.size; i++) {
        const msgpack_object_kv *kv = &scores->via.map.ptr[i];
        uint64_t id;
        if (!instance_of(&kv->key, &id) || id < r->id0 || id - r->id0 >= r->cfg->workers) {
            snprintf(why, wl, "the answer scores an instance that is no soak worker");
            return -1;
        }
        if (kv->val.type != MSGPACK_OBJECT_MAP) {
            snprintf(why, wl, "instance %llu: scores are not a map of ranks", (unsigned long long)id);
            return -1;
        }
        for (uint32_t j = 0; j < kv->val.via.map.size; j++) {
            const msgpack_object *t = &kv->val.via.map.ptr[j].val;
            if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > (uint64_t)n * bs || t->via.u64 % bs) {
                snprintf(why, wl, "instance %llu: score is not a whole number of blocks within the query's %u",
                         (unsigned long long)id, n);
                return -1;
            }
            hit |= t->via.u64 > 0;
        }
    }
    return hit;
}

static void lane_query(struct soak_lane *l, const uint64_t *content, uint32_t n)
{
    struct soak_run *r = l->run;
    size_t nb = (size_t)n * 8;
    l->qbin = grow(l->qbin, &l->qcap, nb, 1);
    for (uint32_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            l->qbin[(size_t)i * 8 + (size_t)b] = (uint8_t)(content[i] >> (8 * b)); /* little-endian u64 */
    msgpack_sbuffer_clear(&l->body);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &l->body, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, "model_name");
    pack_str(&pk, r->model_name);
    pack_str(&pk, "block_hashes");
    msgpack_pack_bin(&pk, nb);
    msgpack_pack_bin_body(&pk, l->qbin, nb);
    struct kvi_h2c_resp resp;
    const char *ct = "application/msgpack";
    uint64_t t1 = kvi_now_ns();
    int rc = l->h2 ? kvi_h2c_post(l->h2, "/query_by_hash", ct, l->body.data, l->body.size, &resp) : -ECONNRESET;
    if (rc == -ECONNRESET) { /* idle timeout or GOAWAY: reconnect and retry once */
        char err[256] = "";
        kvi_h2c_close(l->h2);
        l->h2 = kvi_h2c_connect(r->host, r->port, H2C_TIMEOUT_MS, err, sizeof err);
        t1 = kvi_now_ns();
        rc = l->h2 ? kvi_h2c_post(l->h2, "/query_by_hash", ct, l->body.data, l->body.size, &resp) : -ECONNRESET;
    }
    uint64_t t2 = kvi_now_ns();
    l->queries++;
    atomic_store_explicit(&l->live_queries, l->queries, memory_order_relaxed);
    char why[160];
    if (rc != 0) {
        l->query_errors++;
        note(l->err, sizeof l->err, "query: %s", strerror(-rc));
    } else if (resp.status != 200) {
        l->query_errors++;
        note(l->err, sizeof l->err, "query answered %d: %.*s", resp.status, (int)KVI_MIN(resp.len, 120),
             (const char *)resp.body);
    } else {
        kvi_hist_record(&l->qlat, t2 - t1);
        int hit = check_answer(l, resp.body, resp.len, n, why, sizeof why);
        if (hit < 0) {
            l->query_errors++;
            note(l->err, sizeof l->err, "query: %s", why);
        } else {
            l->hits += (uint64_t)hit;
        }
    }
}

/* ---- lanes: the loop ------------------------------------------------------------------- */

/* Query the request's prompt, then submit it to its worker's engine. */
static void issue(struct soak_lane *l)
{
    struct soak_run *r = l->run;
    const struct kvi_trace_request *q = &r->trace->req[l->next];
    uint32_t bs = r->cfg->block_size;
    uint64_t in = eff_input(q);
    size_t n_full = (size_t)((in + q->output_len) / bs);
    uint32_t n_prompt = (uint32_t)(in / bs);
    uint64_t tag = l->loop << 32 | (uint64_t)l->next;
    l->content = grow(l->content, &l->ccap, n_full + 1, sizeof *l->content);
    l->tok = grow(l->tok, &l->tcap, bs, sizeof *l->tok);
    for (size_t j = 0; j < n_full; j++) {
        block_tokens(r, tag, (uint32_t)j, l->tok);
        l->content[j] = kvi_hash_block(l->tok, bs, KVI_HASH_SEED);
    }
    if (n_prompt > 0) {
        flush_dirty(l);
        lane_query(l, l->content, n_prompt);
    }
    double at = KVI_MAX(l->next_sim, l->last_arrival);
    l->last_arrival = at;
    struct kvi_mock_request mr = {
        .tag = tag,
        .arrival_ms = at,
        .input_tokens = (uint32_t)in,
        .output_tokens = q->output_len,
        .content = l->content,
    };
    if (kvi_mock_submit(r->workers[l->next_worker].eng, &mr) == -E2BIG)
        l->dropped++;
    l->requests++;
    l->loops = l->loop + 1;
}

static void sleep_until(uint64_t due)
{
    uint64_t now = kvi_now_ns();
    if (now >= due)
        return;
    if (due - now < SLEEP_MIN_NS) {
        sched_yield();
        return;
    }
    struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
}

static void *lane_main(void *arg)
{
    struct soak_lane *l = arg;
    struct soak_run *r = l->run;
    char name[16], err[256] = "";
    snprintf(name, sizeof name, "kvi-soak-%u", l->id);
    pthread_setname_np(pthread_self(), name);
    l->h2 = kvi_h2c_connect(r->host, r->port, H2C_TIMEOUT_MS, err, sizeof err);
    if (l->h2 == NULL)
        note(l->err, sizeof l->err, "h2c: %s", err);
    pthread_barrier_wait(&r->ready);
    uint64_t t0;
    while ((t0 = atomic_load_explicit(&r->t0, memory_order_acquire)) == 0) /* A1: pairs with R1 */
        sched_yield();
    uint64_t t_end = r->t_end;
    while (kvi_now_ns() < t0)
        sleep_until(t0);
    cursor_seek(l);
    for (;;) {
        uint64_t now = kvi_now_ns();
        if (now >= t_end || atomic_load_explicit(&r->stop, memory_order_relaxed))
            break;
        double sim_now = (double)(now - t0) * r->ms_per_ns;
        while (l->next_sim <= sim_now && now < t_end) {
            if (l->next_worker != NO_WORKER) {
                uint64_t due = t0 + (uint64_t)(l->next_sim / r->ms_per_ns);
                kvi_hist_record(&l->lag, now > due ? now - due : 0);
                issue(l);
            }
            l->next++;
            cursor_seek(l);
            now = kvi_now_ns();
        }
        for (uint32_t w = l->id; w < r->cfg->workers; w += r->cfg->lanes)
            kvi_mock_advance(r->workers[w].eng, sim_now);
        flush_dirty(l);
        uint64_t due = t0 + (uint64_t)(l->next_sim / r->ms_per_ns);
        sleep_until(KVI_MIN(KVI_MIN(due, kvi_now_ns() + TICK_NS), t_end));
    }
    flush_dirty(l);
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    l->cpu_s = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    return NULL;
}

/* ---- control: HTTP, /metrics, RSS ------------------------------------------------------- */

struct soak_ctl {
    struct kvi_e2e *e;
    struct kvi_http_client *http;
    struct kvi_e2e_text t;
    int pid;
};

static int ctl_get(struct soak_ctl *c, const char *path, kvi_http_body_fn fn, void *ud, char *err, size_t el)
{
    char e[300];
    int rc = kvi_e2e_get(c->http, kvi_e2e_url(c->e), path, fn, ud, e, sizeof e);
    if (rc != 0)
        note(err, el, "%s", e);
    return rc;
}

static int ctl_post_json(struct soak_ctl *c, const char *path, const char *json, char *err, size_t el)
{
    char e[300];
    int rc = kvi_e2e_post_json(c->http, kvi_e2e_url(c->e), path, json, e, sizeof e);
    if (rc != 0)
        note(err, el, "%s", e);
    return rc;
}

/* kvidxd's listener counters (totals over every listener). */
struct soak_metrics {
    double ev_stored, ev_removed, ev_other;
    double submitted, applied, rejected;
    double blocks_stored, hashes_removed, blocks_dropped, unknown_blocks;
    double batches, gaps, replays, lost, bad;
    double index_bytes, holdings, alloc_bytes; /* gauges: the index, jemalloc's stats.allocated (0 without) */
};

static double lctr(const char *body, const char *name)
{
    char full[96];
    snprintf(full, sizeof full, "kvidx_listener_%s_total", name);
    return kvi_e2e_metric_sum(body, full, NULL);
}

static int read_metrics(struct soak_ctl *c, struct soak_metrics *m, char *err, size_t el)
{
    c->t.len = 0;
    int rc = ctl_get(c, "/metrics", kvi_e2e_text_sink, &c->t, err, el);
    if (rc != 0 || c->t.p == NULL)
        return rc ? rc : -EPROTO;
    const char *b = c->t.p;
    m->ev_stored = lctr(b, "events_stored");
    m->ev_removed = lctr(b, "events_removed");
    m->ev_other = lctr(b, "events_cleared") + lctr(b, "events_unknown") + lctr(b, "events_invalid");
    m->submitted = lctr(b, "ops_submitted");
    m->applied = lctr(b, "ops_applied");
    m->rejected = lctr(b, "ops_parent_not_found") + lctr(b, "ops_invalid");
    m->blocks_stored = lctr(b, "blocks_stored");
    m->hashes_removed = lctr(b, "hashes_removed");
    m->blocks_dropped = lctr(b, "blocks_dropped");
    m->unknown_blocks = lctr(b, "unknown_blocks");
    m->batches = lctr(b, "batches");
    m->gaps = lctr(b, "gaps");
    m->replays = lctr(b, "replays");
    m->lost = lctr(b, "lost");
    /* everything that means a batch or an event did not arrive intact (stale
     * batches and replay retries are normal around a replayed gap) */
    m->bad = lctr(b, "malformed") + lctr(b, "decode_errors") + lctr(b, "restarts") + lctr(b, "gap_clears") +
             lctr(b, "replay_overruns") + lctr(b, "replay_fallbacks") + lctr(b, "replay_malformed") +
             lctr(b, "replay_undecodable") + lctr(b, "buffer_overflows") + lctr(b, "block_size_mismatch");
    m->index_bytes = kvi_e2e_metric_sum(b, "kvidx_index_bytes", NULL);
    m->holdings = kvi_e2e_metric_sum(b, "kvidx_index_holdings", NULL);
    m->alloc_bytes = kvi_e2e_metric_sum(b, "kvidx_memory_allocated_bytes", NULL);
    return 0;
}

/* A "Vm...:  N kB" line of /proc/<pid>/status (pid 0: this process); 0 when unknown. */
static uint64_t status_kb(int pid, const char *field)
{
    char path[64], line[256];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/status", pid);
    else
        snprintf(path, sizeof path, "/proc/self/status");
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t fl = strlen(field);
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
            kb = strtoull(line + fl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

static uint64_t rss_kb(int pid)
{
    return status_kb(pid, "VmRSS");
}

/* The child is alive: /proc/<pid>/stat exists and its state is not zombie or dead. */
static bool alive(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X' && p[2] != 'x';
}

/* One sample of kvidxd: RSS and, from /metrics, what it holds and what is in flight. */
struct sample {
    double t_s;
    uint64_t rss_kb;
    int64_t backlog;      /* events published and not yet applied (-1: /metrics failed) */
    uint64_t index_kb;    /* bytes the indexes allocated */
    uint64_t alloc_kb;    /* jemalloc stats.allocated (0 when kvidxd has no jemalloc) */
    uint64_t holdings;    /* (block, worker) pairs held */
};

struct rss_series {
    struct sample *v;
    size_t n, cap;
};

static void rss_add(struct rss_series *s, const struct sample *x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->v = kvi_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = *x;
}

static void rss_judge(const struct rss_series *s, double warm_s, double bound, struct kvi_soak_result *res)
{
    res->rss_samples = (uint32_t)s->n;
    if (s->n == 0)
        return;
    double *t = kvi_xmalloc(s->n * sizeof *t);
    uint64_t *kb = kvi_xmalloc(s->n * sizeof *kb);
    size_t first = s->n;
    for (size_t i = 0; i < s->n; i++) {
        t[i] = s->v[i].t_s;
        kb[i] = s->v[i].rss_kb;
        if (s->v[i].backlog > 0)
            res->backlog_max = KVI_MAX(res->backlog_max, (uint64_t)s->v[i].backlog);
        if (first == s->n && t[i] >= warm_s)
            first = i;
    }
    struct kvi_soak_rss v;
    kvi_soak_rss_judge(t, kb, s->n, warm_s, bound, &v);
    res->rss_start_kb = kb[0];
    res->rss_end_kb = kb[s->n - 1];
    res->rss_max_kb = v.max_kb;
    res->rss_level_kb = v.level_kb;
    res->rss_min_after_kb = v.min_after_kb;
    res->rss_max_after_kb = v.max_after_kb;
    res->rss_raw_max_after_kb = v.raw_max_after_kb;
    res->rss_slope_kb_per_min = v.slope_kb_per_min;
    res->ok_rss = v.ok;
    if (first < s->n) {
        res->index_level_kb = s->v[first].index_kb;
        res->alloc_level_kb = s->v[first].alloc_kb;
    }
    res->index_end_kb = s->v[s->n - 1].index_kb;
    res->alloc_end_kb = s->v[s->n - 1].alloc_kb;
    free(t);
    free(kb);
}

/* ---- control: setup --------------------------------------------------------------------- */

static int load_trace(const struct kvi_soak_cfg *cfg, struct kvi_trace *t, FILE *log, char *err, size_t el)
{
    kvi_trace_init(t);
    char path[PATH_MAX] = "";
    if (cfg->trace != NULL && strcmp(cfg->trace, "synthetic") == 0) {
        path[0] = '\0';
    } else if (cfg->trace != NULL && cfg->trace[0] != '\0') {
        snprintf(path, sizeof path, "%s", cfg->trace);
    } else if (!kvi_trace_find_default(path, sizeof path)) {
        if (log)
            fprintf(log, "note: ../shared/data/mooncake-traces/conversation_trace.jsonl not found; "
                         "using the built-in synthetic trace\n");
        path[0] = '\0';
    }
    if (path[0] == '\0') {
        struct kvi_trace_synth_cfg sc;
        kvi_trace_synth_defaults(&sc);
        sc.requests = cfg->synth_requests ? cfg->synth_requests : sc.requests;
        sc.seed = cfg->seed;
        kvi_trace_synthesize(t, &sc);
        return 0;
    }
    return kvi_trace_load(t, path, err, el);
}

static int setup_workers(struct soak_run *r, void *zctx, char *err, size_t el)
{
    const struct kvi_soak_cfg *cfg = r->cfg;
    struct kvi_trace_workload_cfg wl;
    kvi_trace_workload_defaults(&wl);
    struct kvi_mock_cfg mc = {
        .num_blocks = cfg->gpu_blocks,
        .block_size = cfg->block_size,
        .prefill_tokens_per_ms = wl.prefill_tok_per_s / 1000.0 * wl.speedup,
        .decode_ms_per_token = wl.decode_ms_per_tok / wl.speedup,
    };
    for (uint32_t w = 0; w < cfg->workers; w++) {
        struct soak_worker *sw = &r->workers[w];
        sw->id = w;
        sw->lane = r->lanes[w % cfg->lanes];
        struct kvidx_pub_config pc;
        kvidx_pub_config_init(&pc);
        pc.endpoint = "tcp://127.0.0.1:*";
        pc.replay_endpoint = "tcp://127.0.0.1:*";
        pc.zmq_ctx = zctx;
        pc.hwm = 0; /* never drop a live batch in the publisher */
        pc.buffer_batches = cfg->replay_batches;
        sw->pub = kvidx_pub_create(&pc);
        if (sw->pub == NULL) {
            int e = errno;
            note(err, el, "kvidx_pub_create: %s", strerror(e));
            return -e;
        }
        mc.hash_seed = kvi_fmix64(cfg->seed * 0x100000001b3ull + w + 1);
        sw->eng = kvi_mock_create(&mc, on_event, sw);
        if (sw->eng == NULL) {
            note(err, el, "mock engine: invalid configuration");
            return -EINVAL;
        }
    }
    return 0;
}

static int register_all(struct soak_run *r, struct soak_ctl *c, char *err, size_t el)
{
    for (uint32_t w = 0; w < r->cfg->workers; w++) {
        char j[1024];
        snprintf(j, sizeof j,
                 "{\"instance_id\":%llu,\"model_name\":\"%s\",\"block_size\":%u,\"endpoint\":\"%s\","
                 "\"replay_endpoint\":\"%s\"}",
                 (unsigned long long)(r->id0 + w), r->model_name, r->cfg->block_size,
                 kvidx_pub_endpoint(r->workers[w].pub), kvidx_pub_replay_endpoint(r->workers[w].pub));
        int rc = ctl_post_json(c, "/register", j, err, el);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static void unregister_all(struct soak_run *r, struct soak_ctl *c)
{
    char ignored[8] = "x"; /* note() keeps the first message only: this buffer never takes one */
    for (uint32_t w = 0; w < r->cfg->workers; w++) {
        char j[256];
        snprintf(j, sizeof j, "{\"instance_id\":%llu,\"model_name\":\"%s\"}", (unsigned long long)(r->id0 + w),
                 r->model_name);
        ctl_post_json(c, "/unregister", j, ignored, sizeof ignored);
    }
}

/* Empty batches until kvidxd applied every one: each listener is connected and caught up. */
static int handshake(struct soak_run *r, struct soak_ctl *c, char *err, size_t el)
{
    struct soak_metrics m0, m;
    int rc = read_metrics(c, &m0, err, el);
    uint64_t sent = 0, end = kvi_now_ns() + (uint64_t)HANDSHAKE_MS * 1000000u;
    while (rc == 0) {
        for (uint32_t w = 0; w < r->cfg->workers; w++)
            if (kvidx_pub_flush_empty(r->workers[w].pub, NULL) == 0)
                sent++;
        struct timespec ts = {0, 30000000};
        nanosleep(&ts, NULL);
        if ((rc = read_metrics(c, &m, err, el)) != 0)
            break;
        if (m.batches - m0.batches >= (double)sent)
            return 0;
        if (kvi_now_ns() > end) {
            note(err, el, "handshake: kvidxd applied %.0f of %llu empty batches within %d ms",
                 m.batches - m0.batches, (unsigned long long)sent, HANDSHAKE_MS);
            return -ETIMEDOUT;
        }
    }
    return rc;
}

/* ---- control: the run ----------------------------------------------------------------------- */

static void progress_line(struct soak_run *r, struct soak_ctl *c, const struct soak_metrics *m0, double t_s,
                          uint64_t kb)
{
    struct soak_metrics m;
    char err[256] = "";
    int rc = read_metrics(c, &m, err, sizeof err); /* first: lanes count an event before they flush it */
    uint64_t q = 0, ev = 0, loop = 0;
    for (uint32_t k = 0; k < r->cfg->lanes; k++) {
        q += atomic_load_explicit(&r->lanes[k]->live_queries, memory_order_relaxed);
        ev += atomic_load_explicit(&r->lanes[k]->live_events, memory_order_relaxed);
        loop = KVI_MAX(loop, atomic_load_explicit(&r->lanes[k]->live_loop, memory_order_relaxed));
    }
    if (rc == 0) {
        double dec = (m.ev_stored - m0->ev_stored) + (m.ev_removed - m0->ev_removed);
        fprintf(r->cfg->log,
                "[%7.1f s] loop %llu, %llu queries, %llu events published, %.0f decoded, %.0f applied, gaps %.0f, "
                "lost %.0f; kvidxd RSS %llu kB\n",
                t_s, (unsigned long long)loop + 1, (unsigned long long)q, (unsigned long long)ev, dec,
                m.applied - m0->applied, m.gaps - m0->gaps, m.lost - m0->lost, (unsigned long long)kb);
    } else {
        fprintf(r->cfg->log, "[%7.1f s] /metrics failed: %s\n", t_s, err);
    }
    fflush(r->cfg->log);
}

/* Sample kvidxd at @p t_s: RSS, then /metrics, then the lanes' counts (a lane
 * counts an event before it flushes it, so the backlog is never negative). */
static void take_sample(struct soak_run *r, struct soak_ctl *c, const struct soak_metrics *m0, double t_s,
                        struct sample *x)
{
    *x = (struct sample){.t_s = t_s, .rss_kb = rss_kb(c->pid), .backlog = -1};
    struct soak_metrics m;
    char err[256] = "";
    if (read_metrics(c, &m, err, sizeof err) != 0)
        return;
    uint64_t ev = 0;
    for (uint32_t k = 0; k < r->cfg->lanes; k++)
        ev += atomic_load_explicit(&r->lanes[k]->live_events, memory_order_relaxed);
    double done = (m.applied - m0->applied) + (m.rejected - m0->rejected);
    x->backlog = (int64_t)KVI_MAX(0.0, (double)ev - done);
    x->index_kb = (uint64_t)(m.index_bytes / 1024);
    x->alloc_kb = (uint64_t)(m.alloc_bytes / 1024);
    x->holdings = (uint64_t)m.holdings;
}

/* Start the lanes, sample RSS and liveness until the end, join. */
static void run_load(struct soak_run *r, struct soak_ctl *c, const struct soak_metrics *m0, struct rss_series *rs,
                     struct kvi_soak_result *res)
{
    const struct kvi_soak_cfg *cfg = r->cfg;
    pthread_barrier_init(&r->ready, NULL, cfg->lanes + 1);
    for (uint32_t k = 0; k < cfg->lanes; k++) {
        int rc = pthread_create(&r->lanes[k]->tid, NULL, lane_main, r->lanes[k]);
        if (rc != 0)
            kvi_die("pthread_create: %d", rc);
    }
    pthread_barrier_wait(&r->ready);
    uint64_t t0 = kvi_now_ns() + 1000000u;
    r->t_end = t0 + (uint64_t)(cfg->seconds * 1e9);
    atomic_store_explicit(&r->t0, t0, memory_order_release); /* R1: pairs with A1 in lane_main */
    uint64_t iv = (uint64_t)(cfg->rss_interval_s * 1e9), next_rss = t0 + iv;
    uint64_t rep = cfg->report_s > 0 && cfg->log ? (uint64_t)(cfg->report_s * 1e9) : 0, next_rep = t0 + rep;
    res->kvidxd_alive = true;
    for (;;) {
        uint64_t now = kvi_now_ns();
        if (now >= r->t_end)
            break;
        if (now >= next_rss) {
            struct sample x;
            take_sample(r, c, m0, (double)(now - t0) / 1e9, &x);
            if (!alive(c->pid) || x.rss_kb == 0) {
                res->kvidxd_alive = false;
                note(res->first_error, sizeof res->first_error, "kvidxd died at %.1f s", (double)(now - t0) / 1e9);
                atomic_store_explicit(&r->stop, true, memory_order_relaxed);
                break;
            }
            rss_add(rs, &x);
            next_rss += iv;
        }
        if (rep && now >= next_rep) {
            progress_line(r, c, m0, (double)(now - t0) / 1e9, rs->n ? rs->v[rs->n - 1].rss_kb : 0);
            next_rep += rep;
        }
        uint64_t wake = KVI_MIN(KVI_MIN(next_rss, rep ? next_rep : UINT64_MAX), r->t_end);
        sleep_until(KVI_MIN(wake, kvi_now_ns() + 100000000u));
    }
    for (uint32_t k = 0; k < cfg->lanes; k++)
        pthread_join(r->lanes[k]->tid, NULL);
    pthread_barrier_destroy(&r->ready);
    res->seconds = (double)(KVI_MIN(kvi_now_ns(), r->t_end) - t0) / 1e9;
}

/* Sum the lanes' counters into @p res (after the joins). */
static void gather(struct soak_run *r, struct kvi_soak_result *res)
{
    struct kvi_hist *q = kvi_xmalloc(sizeof *q), *lag = kvi_xmalloc(sizeof *lag);
    kvi_hist_reset(q);
    kvi_hist_reset(lag);
    for (uint32_t k = 0; k < r->cfg->lanes; k++) {
        struct soak_lane *l = r->lanes[k];
        res->loops_started = KVI_MAX(res->loops_started, l->loops);
        res->requests += l->requests;
        res->dropped += l->dropped;
        res->queries += l->queries;
        res->query_errors += l->query_errors;
        res->hits += l->hits;
        res->publish_errors += l->publish_errors;
        res->ev_stored += l->ev_stored;
        res->ev_removed += l->ev_removed;
        res->blocks_stored += l->blocks_stored;
        res->blocks_removed += l->blocks_removed;
        res->model_rejected += l->model_rejected;
        res->model_applied_blocks += l->model_applied_blocks;
        res->model_removed_known += l->model_removed_known;
        res->lanes_cpu_s += l->cpu_s;
        kvi_hist_merge(q, &l->qlat);
        kvi_hist_merge(lag, &l->lag);
        if (l->err[0] != '\0')
            note(res->first_error, sizeof res->first_error, "lane %u: %s", k, l->err);
    }
    res->query_p50_ns = kvi_hist_percentile(q, 50);
    res->query_p99_ns = kvi_hist_percentile(q, 99);
    res->query_max_ns = q->count ? q->max : 0;
    res->lag_p99_ns = kvi_hist_percentile(lag, 99);
    res->lag_max_ns = lag->count ? lag->max : 0;
    free(q);
    free(lag);
    for (uint32_t w = 0; w < r->cfg->workers; w++) {
        struct kvidx_pub_stats ps;
        kvidx_pub_get_stats(r->workers[w].pub, &ps);
        res->pub_events += ps.events;
        res->pub_batches += ps.batches;
        res->pub_bytes += ps.bytes;
    }
}

/* Wait until kvidxd decoded and applied everything published; fill the k_* figures. */
static void drain(struct soak_run *r, struct soak_ctl *c, const struct soak_metrics *m0, struct kvi_soak_result *res,
                  bool *drained)
{
    uint64_t t_start = kvi_now_ns(), end = t_start + (uint64_t)DRAIN_MS * 1000000u;
    struct soak_metrics m;
    char err[256] = "";
    int rc;
    *drained = false;
    while ((rc = read_metrics(c, &m, err, sizeof err)) == 0) {
        double st = m.ev_stored - m0->ev_stored, rm = m.ev_removed - m0->ev_removed;
        double sub = m.submitted - m0->submitted, done = (m.applied - m0->applied) + (m.rejected - m0->rejected);
        if (st >= (double)res->ev_stored && rm >= (double)res->ev_removed && sub == done) {
            *drained = true;
            break;
        }
        if (kvi_now_ns() > end || !alive(c->pid))
            break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    res->drain_s = (double)(kvi_now_ns() - t_start) / 1e9;
    if (rc != 0) {
        note(res->first_error, sizeof res->first_error, "%s", err);
        return;
    }
    if (!*drained)
        note(res->first_error, sizeof res->first_error,
             "kvidxd did not decode and apply everything published within %d s", DRAIN_MS / 1000);
    res->k_ev_stored = (uint64_t)(m.ev_stored - m0->ev_stored);
    res->k_ev_removed = (uint64_t)(m.ev_removed - m0->ev_removed);
    res->k_ev_other = (uint64_t)(m.ev_other - m0->ev_other);
    res->k_ops_submitted = (uint64_t)(m.submitted - m0->submitted);
    res->k_ops_applied = (uint64_t)(m.applied - m0->applied);
    res->k_ops_rejected = (uint64_t)(m.rejected - m0->rejected);
    res->k_blocks_stored = (uint64_t)(m.blocks_stored - m0->blocks_stored);
    res->k_hashes_removed = (uint64_t)(m.hashes_removed - m0->hashes_removed);
    res->k_blocks_dropped = (uint64_t)(m.blocks_dropped - m0->blocks_dropped);
    res->k_unknown_blocks = (uint64_t)(m.unknown_blocks - m0->unknown_blocks);
    res->k_gaps = (uint64_t)(m.gaps - m0->gaps);
    res->k_replays = (uint64_t)(m.replays - m0->replays);
    res->k_lost = (uint64_t)(m.lost - m0->lost);
    res->k_bad = (uint64_t)(m.bad - m0->bad);
}

static int dump_sink(void *ud, const void *data, size_t len)
{
    return kvi_soak_cmp_feed(ud, data, len) == 0 ? 0 : 1;
}

static void compare_dump(struct soak_run *r, struct soak_ctl *c, struct kvi_soak_result *res)
{
    struct kvi_soak_cmp *cmp = kvi_soak_cmp_begin(r->model, r->model_name, r->id0, &res->diff);
    char err[256] = "";
    int rc = ctl_get(c, "/dump", dump_sink, cmp, err, sizeof err);
    if (rc != 0 && res->diff.error[0] == '\0')
        snprintf(res->diff.error, sizeof res->diff.error, "%s", err);
    if (kvi_soak_cmp_end(cmp) == 0 && rc != 0)
        res->diff.decoded = res->diff.equal = false; /* the transfer failed although what came decoded */
}

/* Every engine's cached set is exactly the model's set for its worker. */
static bool engines_match(struct soak_run *r, char *err, size_t el)
{
    for (uint32_t w = 0; w < r->cfg->workers; w++) {
        const struct kvi_mock_engine *e = r->workers[w].eng;
        size_t n = kvi_soak_model_blocks(r->model, w);
        if (kvi_mock_cached_blocks(e) != n) {
            note(err, el, "worker %u: the engine caches %u blocks, the model holds %zu", w,
                 kvi_mock_cached_blocks(e), n);
            return false;
        }
        size_t pos = 0;
        uint64_t eh;
        while (kvi_soak_model_next(r->model, w, &pos, &eh))
            if (!kvi_mock_is_cached(e, eh)) {
                note(err, el, "worker %u: block %#llx is in the model, not in the engine", w,
                     (unsigned long long)eh);
                return false;
            }
    }
    return true;
}

static void verdicts(struct soak_run *r, struct kvi_soak_result *res, bool drained)
{
    uint64_t published = res->ev_stored + res->ev_removed;
    res->ok_errors = res->kvidxd_alive && drained && res->queries > 0 && res->query_errors == 0 &&
                     res->publish_errors == 0 && res->k_lost == 0 && res->k_bad == 0 && res->k_ev_other == 0 &&
                     res->k_blocks_dropped == 0 && res->k_unknown_blocks == 0;
    res->ok_dump = res->diff.equal && res->engines_match && kvi_soak_model_orphaning_removes(r->model) == 0;
    res->ok_counters = drained && res->k_ev_stored == res->ev_stored && res->k_ev_removed == res->ev_removed &&
                       res->pub_events == published && res->k_ops_submitted == published &&
                       res->k_ops_applied + res->k_ops_rejected == published &&
                       res->k_ops_rejected == res->model_rejected &&
                       res->k_blocks_stored == res->model_applied_blocks &&
                       res->k_hashes_removed == res->model_removed_known;
    res->ok = res->ok_errors && res->ok_rss && res->ok_dump && res->ok_counters;
}

/* ---- control: the report ------------------------------------------------------------------- */

static void print_summary(FILE *f, const struct soak_run *r, const struct kvi_soak_result *x, double warm_s)
{
    const struct kvi_soak_cfg *cfg = r->cfg;
    double s = x->seconds > 0 ? x->seconds : 1;
    fprintf(f, "\nsoak summary (%.1f min of load)\n", x->seconds / 60);
    fprintf(f, "  load: %llu trace loop(s) begun, %llu requests (%llu too large for a pool), %.0f requests/s; "
               "issue lag p99 %.2f ms, max %.2f ms\n",
            (unsigned long long)x->loops_started, (unsigned long long)x->requests, (unsigned long long)x->dropped,
            (double)x->requests / s, (double)x->lag_p99_ns / 1e6, (double)x->lag_max_ns / 1e6);
    fprintf(f, "  CPU during the load: lanes %.1f s (%.1f %% of a core), kvidxd %.1f s (%.1f %% of a core); "
               "this process peaked at %llu kB\n",
            x->lanes_cpu_s, 100.0 * x->lanes_cpu_s / s, x->kvidxd_cpu_s, 100.0 * x->kvidxd_cpu_s / s,
            (unsigned long long)x->bench_peak_rss_kb);
    fprintf(f, "  queries: %llu POST /query_by_hash over h2c, %llu errors, %.1f %% hit; round trip p50 %.0f us, "
               "p99 %.0f us, max %.1f ms\n",
            (unsigned long long)x->queries, (unsigned long long)x->query_errors,
            x->queries ? 100.0 * (double)x->hits / (double)x->queries : 0.0, (double)x->query_p50_ns / 1e3,
            (double)x->query_p99_ns / 1e3, (double)x->query_max_ns / 1e6);
    fprintf(f, "  published: %llu stored events (%llu blocks), %llu removed events (%llu hashes); %llu batches, "
               "%.1f MB; %llu publish errors; model rejected %llu stores\n",
            (unsigned long long)x->ev_stored, (unsigned long long)x->blocks_stored, (unsigned long long)x->ev_removed,
            (unsigned long long)x->blocks_removed, (unsigned long long)x->pub_batches, (double)x->pub_bytes / 1e6,
            (unsigned long long)x->publish_errors, (unsigned long long)x->model_rejected);
    fprintf(f, "  kvidxd: decoded %llu stored + %llu removed (+%llu other); ops submitted %llu = applied %llu + "
               "rejected %llu; blocks stored %llu, hashes removed %llu, dropped %llu; gaps %llu, replays %llu, "
               "lost %llu, bad %llu; drained %.2f s after the load\n",
            (unsigned long long)x->k_ev_stored, (unsigned long long)x->k_ev_removed, (unsigned long long)x->k_ev_other,
            (unsigned long long)x->k_ops_submitted, (unsigned long long)x->k_ops_applied,
            (unsigned long long)x->k_ops_rejected, (unsigned long long)x->k_blocks_stored,
            (unsigned long long)x->k_hashes_removed, (unsigned long long)x->k_blocks_dropped,
            (unsigned long long)x->k_gaps, (unsigned long long)x->k_replays, (unsigned long long)x->k_lost,
            (unsigned long long)x->k_bad, x->drain_s);
    double pct = x->rss_level_kb ? 100.0 * ((double)x->rss_max_after_kb / (double)x->rss_level_kb - 1.0) : 0;
    fprintf(f, "  kvidxd RSS (%u samples every %g s): start %llu kB, max %llu kB; after the %.0f s warm-up "
               "(medians of 3 samples): level %llu kB, min %llu, max %llu (%+.1f %%, bound +%.0f %%), raw max %llu; "
               "slope %+.0f kB/min; end %llu kB; ingest backlog at most %llu events at a sample\n",
            x->rss_samples, cfg->rss_interval_s, (unsigned long long)x->rss_start_kb,
            (unsigned long long)x->rss_max_kb, warm_s, (unsigned long long)x->rss_level_kb,
            (unsigned long long)x->rss_min_after_kb, (unsigned long long)x->rss_max_after_kb, pct,
            100.0 * cfg->rss_bound, (unsigned long long)x->rss_raw_max_after_kb, x->rss_slope_kb_per_min,
            (unsigned long long)x->rss_end_kb, (unsigned long long)x->backlog_max);
    fprintf(f, "  kvidxd memory at the level -> at the end: index %llu -> %llu kB, allocated (jemalloc) %llu -> %llu "
               "kB\n",
            (unsigned long long)x->index_level_kb, (unsigned long long)x->index_end_kb,
            (unsigned long long)x->alloc_level_kb, (unsigned long long)x->alloc_end_kb);
    const struct kvi_soak_diff *d = &x->diff;
    fprintf(f, "  /dump: %llu blocks listed, %llu matched; %llu missing, %llu extra, %llu wrong, %llu duplicated "
               "(model: %llu blocks over %u workers); engines %s the model\n",
            (unsigned long long)d->dump_blocks, (unsigned long long)d->matched, (unsigned long long)d->missing,
            (unsigned long long)d->extra, (unsigned long long)d->wrong, (unsigned long long)d->duplicates,
            (unsigned long long)x->model_blocks, cfg->workers, x->engines_match ? "match" : "DO NOT match");
    if (d->error[0])
        fprintf(f, "    /dump did not decode: %s\n", d->error);
    for (uint32_t i = 0; i < d->n_shown; i++)
        fprintf(f, "    %s\n", d->shown[i]);
    fprintf(f, "  checks: no errors %s, RSS flat %s, /dump = model %s, counters balance %s => %s\n",
            x->ok_errors ? "ok" : "FAILED", x->ok_rss ? "ok" : "FAILED", x->ok_dump ? "ok" : "FAILED",
            x->ok_counters ? "ok" : "FAILED", x->ok ? "PASS" : "FAIL");
    if (x->first_error[0])
        fprintf(f, "  first error: %s\n", x->first_error);
    fflush(f);
}

static void write_csv(const char *path, const struct rss_series *rs, FILE *log)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        if (log)
            fprintf(log, "could not write %s: %s\n", path, strerror(errno));
        return;
    }
    fprintf(f, "t_s,rss_kb,backlog_events,index_kb,alloc_kb,holdings\n");
    for (size_t i = 0; i < rs->n; i++) {
        const struct sample *x = &rs->v[i];
        fprintf(f, "%.1f,%llu,%lld,%llu,%llu,%llu\n", x->t_s, (unsigned long long)x->rss_kb, (long long)x->backlog,
                (unsigned long long)x->index_kb, (unsigned long long)x->alloc_kb, (unsigned long long)x->holdings);
    }
    if (fclose(f) == 0 && log)
        fprintf(log, "wrote %s\n", path);
}

/* ---- kvi_soak_run ------------------------------------------------------------------------------ */

static bool cfg_valid(const struct kvi_soak_cfg *c)
{
    return c->seconds > 0 && c->kvidxd != NULL && c->workers > 0 && c->workers < (1u << 24) && c->lanes > 0 &&
           c->lanes <= c->workers && c->writers > 0 && c->block_size > 0 && KVI_TRACE_ID_TOKENS % c->block_size == 0 &&
           c->gpu_blocks > 0 && c->loop_s > 0 && c->sim_ms > 0 && c->warmup_frac >= 0 && c->warmup_frac < 1 &&
           c->rss_bound >= 0 && c->rss_interval_s > 0 && c->report_s >= 0;
}

static void lanes_free(struct soak_run *r)
{
    for (uint32_t k = 0; r->lanes != NULL && k < r->cfg->lanes; k++) {
        struct soak_lane *l = r->lanes[k];
        kvi_h2c_close(l->h2);
        msgpack_sbuffer_destroy(&l->body);
        msgpack_unpacked_destroy(&l->ans);
        free(l->dirty);
        free(l->tok);
        free(l->content);
        free(l->qbin);
        free(l);
    }
    free(r->lanes);
}

int kvi_soak_run(const struct kvi_soak_cfg *cfg, struct kvi_soak_result *res)
{
    memset(res, 0, sizeof *res);
    if (!cfg_valid(cfg)) {
        note(res->first_error, sizeof res->first_error, "invalid soak configuration");
        return -EINVAL;
    }
    FILE *log = cfg->log;
    struct kvi_trace trace;
    char *err = res->first_error;
    size_t el = sizeof res->first_error;
    char terr[512] = "";
    int rc = load_trace(cfg, &trace, log, terr, sizeof terr);
    if (rc == 0 && (trace.n_req == 0 || trace.n_req > UINT32_MAX))
        rc = -EINVAL;
    if (rc < 0) {
        note(err, el, "trace: %s", terr[0] ? terr : "no requests");
        kvi_trace_free(&trace);
        return rc;
    }
    struct soak_run r = {.cfg = cfg, .trace = &trace};
    r.trace_t0 = trace.req[0].t_ms;
    uint64_t span = trace.req[trace.n_req - 1].t_ms - r.trace_t0;
    r.loop_sim_ms = cfg->sim_ms;
    r.trace_scale = span > 0 ? cfg->sim_ms / (double)span : 0;
    r.id_stride = trace.max_id + 1;
    r.ms_per_ns = cfg->sim_ms / (cfg->loop_s * 1e9);
    snprintf(r.model_name, sizeof r.model_name, "soak-%d", (int)getpid());
    r.id0 = ((uint64_t)getpid() << 32) + 1;
    if (log) {
        struct kvi_trace_stats ts;
        kvi_trace_stats(&trace, &ts);
        fprintf(log, "soak: trace %s%s%s: %zu requests over %.1f s, input avg %.0f tokens, %.1f hash ids avg\n",
                trace.name, trace.path[0] ? " " : "", trace.path, ts.requests, (double)ts.span_ms / 1e3,
                ts.avg_input, ts.avg_ids);
        fprintf(log, "soak: %.1f min; one loop of the trace = %.0f s real = %.0f ms engine time, fresh hash ids and "
                     "sessions per loop; %u workers (block %u, %u GPU blocks each), %u lane(s), kvidxd --threads %u\n",
                cfg->seconds / 60, cfg->loop_s, cfg->sim_ms, cfg->workers, cfg->block_size, cfg->gpu_blocks,
                cfg->lanes, cfg->writers);
        fflush(log);
    }

    struct soak_ctl c = {0};
    struct kvi_e2e_cfg ec = {.spawn = cfg->kvidxd, .spawn_writers = cfg->writers, .query = KVI_E2E_QUERY_HASH};
    c.e = kvi_e2e_open(&ec, terr, sizeof terr);
    if (c.e == NULL) {
        note(err, el, "kvidxd: %s", terr);
        kvi_trace_free(&trace);
        return -ECHILD;
    }
    c.pid = kvi_e2e_pid(c.e);
    unsigned port = 0;
    if (sscanf(kvi_e2e_url(c.e), "http://%63[^:]:%u", r.host, &port) != 2 || port == 0 || port > 65535 || c.pid <= 0)
        kvi_die("soak: unexpected kvidxd URL %s", kvi_e2e_url(c.e));
    r.port = (uint16_t)port;
    struct kvi_http_client_options ho;
    kvi_http_client_options_init(&ho);
    ho.proto = KVI_HTTP_CLIENT_H1;
    ho.timeout_ms = CTRL_TIMEOUT_MS;
    ho.bearer_token = getenv("KVIDX_ADMIN_TOKEN");
    c.http = kvi_http_client_create(&ho);
    if (c.http == NULL)
        kvi_die("soak: cannot create the HTTP client");
    if (log)
        fprintf(log, "soak: kvidxd %s pid %d at %s, model %s\n", cfg->kvidxd, c.pid, kvi_e2e_url(c.e), r.model_name);

    r.model = kvi_soak_model_create(cfg->workers);
    r.workers = kvi_xcalloc(cfg->workers, sizeof *r.workers);
    r.lanes = kvi_xcalloc(cfg->lanes, sizeof *r.lanes);
    for (uint32_t k = 0; k < cfg->lanes; k++) {
        struct soak_lane *l = kvi_xcalloc(1, sizeof *l);
        l->run = &r;
        l->id = k;
        l->dirty = kvi_xmalloc(((size_t)cfg->workers / cfg->lanes + 1) * sizeof *l->dirty);
        msgpack_sbuffer_init(&l->body);
        msgpack_unpacked_init(&l->ans);
        kvi_hist_reset(&l->qlat);
        kvi_hist_reset(&l->lag);
        r.lanes[k] = l;
    }
    void *zctx = zmq_ctx_new();
    if (zctx == NULL)
        kvi_die("zmq_ctx_new failed");
    zmq_ctx_set(zctx, ZMQ_IO_THREADS, 1);
    zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, (int)KVI_MIN(2u * cfg->workers + 64u, 65536u));
    struct soak_metrics m0;
    rc = setup_workers(&r, zctx, err, el);
    if (rc == 0)
        rc = register_all(&r, &c, err, el);
    if (rc == 0)
        rc = handshake(&r, &c, err, el);
    if (rc == 0)
        rc = read_metrics(&c, &m0, err, el);
    struct rss_series rs = {0};
    if (rc == 0) {
        struct sample x;
        take_sample(&r, &c, &m0, 0, &x);
        rss_add(&rs, &x);
        double cpu0 = kvi_bench_proc_cpu_s(c.pid);
        run_load(&r, &c, &m0, &rs, res);
        double cpu1 = kvi_bench_proc_cpu_s(c.pid);
        res->kvidxd_cpu_s = cpu0 >= 0 && cpu1 >= 0 ? cpu1 - cpu0 : -1;
        gather(&r, res);
        bool drained = false;
        if (res->kvidxd_alive)
            drain(&r, &c, &m0, res, &drained);
        res->kvidxd_alive = res->kvidxd_alive && alive(c.pid);
        if (res->kvidxd_alive) {
            take_sample(&r, &c, &m0, res->seconds + res->drain_s, &x);
            rss_add(&rs, &x);
            compare_dump(&r, &c, res);
        } else {
            snprintf(res->diff.error, sizeof res->diff.error, "not fetched: kvidxd is not running");
        }
        double warm_s = cfg->warmup_frac * cfg->seconds;
        rss_judge(&rs, warm_s, cfg->rss_bound, res);
        res->model_blocks = kvi_soak_model_total(r.model);
        char eerr[256] = "";
        res->engines_match = engines_match(&r, eerr, sizeof eerr);
        if (!res->engines_match)
            note(err, el, "%s", eerr);
        if (kvi_soak_model_orphaning_removes(r.model) > 0)
            note(err, el, "%llu removals of a block with held children (the model does not cascade)",
                 (unsigned long long)kvi_soak_model_orphaning_removes(r.model));
        res->bench_peak_rss_kb = status_kb(0, "VmHWM");
        verdicts(&r, res, drained);
        if (log)
            print_summary(log, &r, res, warm_s);
        if (cfg->rss_csv != NULL)
            write_csv(cfg->rss_csv, &rs, log);
    }
    if (alive(c.pid))
        unregister_all(&r, &c);
    for (uint32_t w = 0; w < cfg->workers; w++) {
        kvidx_pub_destroy(r.workers[w].pub);
        kvi_mock_destroy(r.workers[w].eng);
    }
    zmq_ctx_term(zctx);
    lanes_free(&r);
    free(r.workers);
    kvi_soak_model_destroy(r.model);
    free(rs.v);
    free(c.t.p);
    kvi_http_client_free(c.http);
    kvi_e2e_close(c.e);
    kvi_trace_free(&trace);
    return rc;
}


/* ---- the subcommand ------------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvidx-bench soak --minutes N [options]\n"
            "\n"
            "Replays a Mooncake trace in a loop through a spawned kvidxd for N minutes: one mock\n"
            "engine and one C publisher (ZMQ) per worker, fresh hash ids and sessions every loop\n"
            "(pools stay full, so stores and evictions go on), and a POST /query_by_hash over\n"
            "HTTP/2 (h2c) at every request's arrival. Then it checks:\n"
            "  1. no errors: every query answered 200 with a valid score map, kvidxd alive, no\n"
            "     batch lost or undecodable (gaps only when replay filled them);\n"
            "  2. RSS flat: kvidxd's VmRSS after the warm-up stays within the bound of its level;\n"
            "  3. GET /dump equals the model built from everything published (and the model\n"
            "     equals what the engines cache);\n"
            "  4. counters balance: published = decoded per type = applied + rejected.\n"
            "Prints progress lines, a summary and, last, one JSON line; exits 1 when a check fails.\n"
            "\n"
            "  --minutes N | --seconds N   duration (1 minute)\n"
            "  --kvidxd PATH               kvidxd binary (default: ../api/kvidxd beside this program)\n"
            "  --trace PATH|synthetic      Mooncake JSONL (default: ../shared/data/mooncake-traces/\n"
            "                              conversation_trace.jsonl beside the repository, else the\n"
            "                              built-in generator)\n"
            "  --synthetic-requests N      requests of the generator (12000)\n"
            "  --workers N                 simulated workers = publishers (128)\n"
            "  --block-size B              engine block size, divides 512 (128)\n"
            "  --gpu-blocks N              mock engine pool per worker (2048)\n"
            "  --lanes N                   threads driving engines and queries (2)\n"
            "  --writers N                 kvidxd --threads (1)\n"
            "  --replay-batches N          replay ring of each publisher (64)\n"
            "  --loop-s S                  real seconds per trace loop (30): the load\n"
            "  --sim-ms MS                 engine time per trace loop (30000)\n"
            "  --warmup-pct P              RSS level taken after P %% of the run (20)\n"
            "  --rss-bound-pct P           allowed RSS growth over the level (10)\n"
            "  --rss-interval-s S          RSS sampling period (5)\n"
            "  --report-s S                progress line period, 0 = none (30)\n"
            "  --seed S                    worker assignment and engine-hash seed (42)\n"
            "  --rss-csv PATH              write kvidxd's samples (t_s, rss_kb, backlog_events,\n"
            "                              index_kb, alloc_kb, holdings) as CSV\n"
            "\n"
            "usually through the wrapper, which builds first:  bash bench/soak.sh --minutes 30\n");
}

static bool opt_num(const char *s, double min, double *v)
{
    char *e;
    errno = 0;
    double x = strtod(s, &e);
    if (errno != 0 || *e != '\0' || e == s || !(x >= min) || isinf(x))
        return false;
    *v = x;
    return true;
}

static bool opt_u32(const char *s, uint32_t min, uint32_t *v)
{
    double x;
    if (!opt_num(s, min, &x) || x > UINT32_MAX || x != floor(x))
        return false;
    *v = (uint32_t)x;
    return true;
}

static void default_kvidxd(char *out, size_t cap)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    out[0] = '\0';
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return;
    *slash = '\0';
    snprintf(out, cap, "%.*s/../api/kvidxd", (int)(cap - 16), exe);
}

enum {
    O_MINUTES = 256, O_SECONDS, O_KVIDXD, O_TRACE, O_SYNTH, O_WORKERS, O_BLOCK, O_GPU, O_LANES, O_WRITERS, O_REPLAY,
    O_LOOP, O_SIM, O_WARMUP, O_BOUND, O_RSSIV, O_REPORT, O_SEED, O_CSV,
};

int kvi_bench_soak(int argc, char **argv)
{
    static const struct option opts[] = {
        {"minutes", required_argument, NULL, O_MINUTES}, {"seconds", required_argument, NULL, O_SECONDS},
        {"kvidxd", required_argument, NULL, O_KVIDXD}, {"trace", required_argument, NULL, O_TRACE},
        {"synthetic-requests", required_argument, NULL, O_SYNTH}, {"workers", required_argument, NULL, O_WORKERS},
        {"block-size", required_argument, NULL, O_BLOCK}, {"gpu-blocks", required_argument, NULL, O_GPU},
        {"lanes", required_argument, NULL, O_LANES}, {"writers", required_argument, NULL, O_WRITERS},
        {"replay-batches", required_argument, NULL, O_REPLAY}, {"loop-s", required_argument, NULL, O_LOOP},
        {"sim-ms", required_argument, NULL, O_SIM}, {"warmup-pct", required_argument, NULL, O_WARMUP},
        {"rss-bound-pct", required_argument, NULL, O_BOUND}, {"rss-interval-s", required_argument, NULL, O_RSSIV},
        {"report-s", required_argument, NULL, O_REPORT}, {"seed", required_argument, NULL, O_SEED},
        {"rss-csv", required_argument, NULL, O_CSV}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    struct kvi_soak_cfg cfg;
    kvi_soak_defaults(&cfg);
    cfg.log = stdout;
    char kvidxd[PATH_MAX];
    default_kvidxd(kvidxd, sizeof kvidxd);
    double v = 0;
    uint32_t u = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case O_MINUTES: ok = opt_num(optarg, 0, &v) && v > 0; cfg.seconds = v * 60; break;
        case O_SECONDS: ok = opt_num(optarg, 0, &v) && v > 0; cfg.seconds = v; break;
        case O_KVIDXD: snprintf(kvidxd, sizeof kvidxd, "%s", optarg); break;
        case O_TRACE: cfg.trace = optarg; break;
        case O_SYNTH: ok = opt_u32(optarg, 1, &u); cfg.synth_requests = u; break;
        case O_WORKERS: ok = opt_u32(optarg, 1, &cfg.workers) && cfg.workers < (1u << 24); break;
        case O_BLOCK: ok = opt_u32(optarg, 1, &cfg.block_size) && KVI_TRACE_ID_TOKENS % cfg.block_size == 0; break;
        case O_GPU: ok = opt_u32(optarg, 1, &cfg.gpu_blocks); break;
        case O_LANES: ok = opt_u32(optarg, 1, &cfg.lanes) && cfg.lanes <= 64; break;
        case O_WRITERS: ok = opt_u32(optarg, 1, &cfg.writers) && cfg.writers <= 64; break;
        case O_REPLAY: ok = opt_u32(optarg, 1, &cfg.replay_batches); break;
        case O_LOOP: ok = opt_num(optarg, 0, &cfg.loop_s) && cfg.loop_s > 0; break;
        case O_SIM: ok = opt_num(optarg, 0, &cfg.sim_ms) && cfg.sim_ms > 0; break;
        case O_WARMUP: ok = opt_num(optarg, 0, &v) && v < 100; cfg.warmup_frac = v / 100; break;
        case O_BOUND: ok = opt_num(optarg, 0, &v); cfg.rss_bound = v / 100; break;
        case O_RSSIV: ok = opt_num(optarg, 0, &cfg.rss_interval_s) && cfg.rss_interval_s > 0; break;
        case O_REPORT: ok = opt_num(optarg, 0, &cfg.report_s); break;
        case O_SEED: cfg.seed = strtoull(optarg, NULL, 0); break;
        case O_CSV: cfg.rss_csv = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "soak: invalid value for --%s: %s\n", opts[c - O_MINUTES].name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "soak: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (cfg.lanes > cfg.workers) {
        fprintf(stderr, "soak: --lanes must not exceed --workers\n");
        return 2;
    }
    if (kvidxd[0] == '\0' || access(kvidxd, X_OK) != 0) {
        fprintf(stderr, "soak: kvidxd binary '%s' is not executable (--kvidxd PATH)\n", kvidxd);
        return 2;
    }
    cfg.kvidxd = kvidxd;
    struct kvi_soak_result *res = kvi_xcalloc(1, sizeof *res);
    int rc = kvi_soak_run(&cfg, res);
    if (rc != 0)
        fprintf(stderr, "soak: %s\n", res->first_error[0] ? res->first_error : strerror(-rc));
    kvi_soak_print_json(stdout, cfg.seconds / 60, res);
    bool ok = rc == 0 && res->ok;
    free(res);
    return ok ? 0 : 1;
}
