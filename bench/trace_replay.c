/*
 * Trace replay (see bench/trace_replay.h).
 *
 * DESIGN
 *   Threads: the caller (control: creates everything, reports progress,
 *   collects results), `readers` lanes, and the writer pool's `writers`
 *   threads. Lanes are registered RCU readers (kvidx) and each owns one
 *   kvi_producer, so every (lane, writer) ring is SPSC.
 *   Start: lanes get ready (RCU registration, producer), meet the caller at a
 *   barrier, then wait for the caller to publish t0 (release; the lanes'
 *   acquire loads pair with it), 1 ms in the future.
 *   Issue: a lane sleeps until an entry's due time unless it is late; events
 *   due together are submitted as one burst, flushed before any query or
 *   sleep so a worker's events are enqueued before its next query runs.
 *   End: each lane records when it issued its last entry; the last lane to
 *   finish (acq_rel counter) samples the writers' backlog. Then each lane
 *   flushes its producer (waits until the writers applied everything it
 *   submitted) and records the drain time. elapsed = latest drain - t0.
 *   Teardown: lanes destroy their producers; the caller makes the writers
 *   forget the kvidx index, destroys the pool, then the backend.
 */
#include "bench/trace_replay.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "bench/baseline_naive.h"
#include "bench/baseline_radix.h"
#include "engine/common.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "engine/writer.h"

#define LANE_BURST 32
#define SLEEP_MIN_NS 20000 /* below this a lane spins instead of sleeping */

/* Per-lane query scratch, shared by every backend. */
struct lane_scratch {
    struct kvi_match *m;      /* kvidx results */
    struct kvi_bl_score *sc;  /* baseline results */
    struct kvi_bl_scratch bl;
    size_t cap;               /* n_workers */
};

struct kvi_trace_backend {
    const char *name;
    bool rcu; /* queries need registered RCU readers */
    void *(*create)(uint32_t n_workers, uint32_t n_parts, uint32_t block_size, uint32_t jump, uint64_t seed);
    void (*destroy)(void *ix);
    /* timed query: returns the number of matching workers; results stay in s */
    size_t (*find)(void *ix, struct lane_scratch *s, const uint64_t *c, size_t n);
    /* results of the last find as scores (unsorted), at most s->cap */
    size_t (*scores)(void *ix, struct lane_scratch *s, size_t k);
    /* direct application on the calling thread (tests) */
    int (*apply)(void *ix, const struct kvi_trace_entry *e);
    /* an op that applies e on a writer */
    struct kvi_op *(*make_op)(struct kvi_trace_be *b, const struct kvi_trace_entry *e, uint32_t n_writers);
    /* before the pool goes: make its writers forget ix */
    void (*forget)(void *ix, struct kvi_producer *p);
    /* rejected stores, when the index counts them itself (else NULL) */
    uint64_t (*rejected)(void *ix);
    uint64_t (*holdings)(void *ix);
};

struct kvi_trace_be {
    const struct kvi_trace_backend *be;
    void *ix;
    uint32_t n_workers;
    _Atomic uint64_t rejected; /* baselines: stores rejected on writers */
};

/* ---- kvidx ------------------------------------------------------------------ */

struct kvidx_ix {
    struct kvi_index *ix;
    uint32_t *dense;  /* worker -> dense instance id */
    uint32_t *worker; /* dense instance id -> worker */
    uint32_t n_workers;
};

static void *kvidx_create(uint32_t n_workers, uint32_t n_parts, uint32_t block_size, uint32_t jump, uint64_t seed)
{
    struct kvi_index_config c = {.block_size = block_size, .n_parts = n_parts, .jump = jump, .key_seed = seed};
    struct kvidx_ix *k = kvi_xcalloc(1, sizeof *k);
    k->ix = kvi_index_create(&c);
    if (k->ix == NULL)
        kvi_die("kvi_index_create failed");
    k->n_workers = n_workers;
    k->dense = kvi_xmalloc((n_workers ? n_workers : 1) * sizeof *k->dense);
    k->worker = kvi_xmalloc((n_workers ? n_workers : 1) * sizeof *k->worker);
    for (uint32_t w = 0; w < n_workers; w++) {
        int64_t d = kvi_index_intern_instance(k->ix, (uint64_t)w + 1, NULL, false);
        if (d < 0 || (uint64_t)d >= n_workers)
            kvi_die("intern_instance: %lld", (long long)d);
        k->dense[w] = (uint32_t)d;
        k->worker[d] = w;
    }
    return k;
}

static void kvidx_destroy(void *p)
{
    struct kvidx_ix *k = p;
    kvi_index_destroy(k->ix);
    free(k->dense);
    free(k->worker);
    free(k);
}

static size_t kvidx_find(void *p, struct lane_scratch *s, const uint64_t *c, size_t n)
{
    struct kvidx_ix *k = p;
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches(k->ix, c, n, s->m, s->cap);
    kvi_rcu_read_unlock();
    return r;
}

static size_t kvidx_scores(void *p, struct lane_scratch *s, size_t k)
{
    struct kvidx_ix *x = p;
    size_t n = KVI_MIN(k, s->cap);
    for (size_t i = 0; i < n; i++)
        s->sc[i] = (struct kvi_bl_score){x->worker[s->m[i].instance], s->m[i].depth};
    return n;
}

static int kvidx_apply(void *p, const struct kvi_trace_entry *e)
{
    struct kvidx_ix *k = p;
    uint32_t inst = k->dense[e->worker];
    if (e->kind == KVI_TRACE_REMOVE) {
        kvi_index_remove(k->ix, inst, 0, KVI_TIER_GPU, e->engine_hash, e->n);
        return 0;
    }
    struct kvi_block *b = kvi_xmalloc((e->n ? e->n : 1) * sizeof *b);
    for (uint32_t i = 0; i < e->n; i++)
        b[i] = (struct kvi_block){e->engine_hash[i], e->content[i]};
    int r = kvi_index_store(k->ix, inst, 0, KVI_TIER_GPU, e->has_parent, e->parent, b, e->n);
    free(b);
    return r;
}

static struct kvi_op *kvidx_make_op(struct kvi_trace_be *b, const struct kvi_trace_entry *e, uint32_t n_writers)
{
    (void)n_writers; /* the pool routes by kvi_index_partition_of */
    struct kvidx_ix *k = b->ix;
    struct kvi_op *op = kvi_op_alloc(e->n, false);
    op->tier = KVI_TIER_GPU;
    op->ix = k->ix;
    op->instance = k->dense[e->worker];
    op->dp_rank = 0;
    if (e->kind == KVI_TRACE_REMOVE) {
        op->type = KVI_OP_REMOVE;
        memcpy(op->hashes, e->engine_hash, e->n * sizeof *op->hashes);
    } else {
        op->type = KVI_OP_STORE;
        op->has_parent = e->has_parent;
        op->parent_engine_hash = e->parent;
        for (uint32_t i = 0; i < e->n; i++)
            op->blocks[i] = (struct kvi_block){e->engine_hash[i], e->content[i]};
    }
    return op;
}

static void kvidx_forget(void *p, struct kvi_producer *prod)
{
    struct kvidx_ix *k = p;
    kvi_producer_forget_index(prod, k->ix);
}

static uint64_t kvidx_rejected(void *p)
{
    struct kvidx_ix *k = p;
    struct kvi_index_stats st;
    kvi_index_stats(k->ix, &st);
    return st.parent_not_found + st.invalid_events;
}

static uint64_t kvidx_holdings(void *p)
{
    struct kvidx_ix *k = p;
    struct kvi_index_stats st;
    kvi_index_stats(k->ix, &st);
    return st.holdings;
}

/* ---- baselines ---------------------------------------------------------------- */

/* A baseline event travels as a KVI_OP_CALL op whose arg is the op itself:
 * blocks[0] carries the instance and the entry. */
static void bl_call(void *arg, uint32_t writer)
{
    (void)writer;
    struct kvi_op *op = arg;
    struct kvi_trace_be *b = (struct kvi_trace_be *)(uintptr_t)op->blocks[0].engine_hash;
    const struct kvi_trace_entry *e = (const struct kvi_trace_entry *)(uintptr_t)op->blocks[0].content_hash;
    if (b->be->apply(b->ix, e) < 0)
        atomic_fetch_add_explicit(&b->rejected, 1, memory_order_relaxed);
}

static struct kvi_op *bl_make_op(struct kvi_trace_be *b, const struct kvi_trace_entry *e, uint32_t n_writers)
{
    struct kvi_op *op = kvi_op_alloc(1, false);
    op->type = KVI_OP_CALL;
    op->instance = e->worker % n_writers; /* CALL: the writer; sticky per worker */
    op->fn = bl_call;
    op->arg = op;
    op->blocks[0].engine_hash = (uint64_t)(uintptr_t)b;
    op->blocks[0].content_hash = (uint64_t)(uintptr_t)e;
    return op;
}

static void bl_forget(void *ix, struct kvi_producer *p)
{
    (void)ix;
    (void)p;
}

static uint64_t radix_holdings(void *ix)
{
    return kvi_bl_radix_holdings(ix);
}

static uint64_t naive_holdings(void *ix)
{
    return kvi_bl_naive_holdings(ix);
}

static void *radix_create(uint32_t n_workers, uint32_t n_parts, uint32_t block_size, uint32_t jump, uint64_t seed)
{
    (void)n_parts;
    (void)block_size;
    (void)jump;
    (void)seed;
    return kvi_bl_radix_create(n_workers);
}

static void radix_destroy(void *ix)
{
    kvi_bl_radix_destroy(ix);
}

static size_t radix_find(void *ix, struct lane_scratch *s, const uint64_t *c, size_t n)
{
    return kvi_bl_radix_find(ix, &s->bl, c, n, s->sc, s->cap);
}

static size_t bl_scores(void *ix, struct lane_scratch *s, size_t k)
{
    (void)ix;
    return KVI_MIN(k, s->cap);
}

static int radix_apply(void *ix, const struct kvi_trace_entry *e)
{
    if (e->kind == KVI_TRACE_REMOVE) {
        kvi_bl_radix_remove(ix, e->worker, e->engine_hash, e->n);
        return 0;
    }
    return kvi_bl_radix_store(ix, e->worker, e->has_parent, e->parent, e->engine_hash, e->content, e->n);
}

static void *naive_create(uint32_t n_workers, uint32_t n_parts, uint32_t block_size, uint32_t jump, uint64_t seed)
{
    (void)n_parts;
    (void)block_size;
    (void)jump;
    (void)seed;
    return kvi_bl_naive_create(n_workers);
}

static void naive_destroy(void *ix)
{
    kvi_bl_naive_destroy(ix);
}

static size_t naive_find(void *ix, struct lane_scratch *s, const uint64_t *c, size_t n)
{
    return kvi_bl_naive_find(ix, &s->bl, c, n, s->sc, s->cap);
}

static int naive_apply(void *ix, const struct kvi_trace_entry *e)
{
    if (e->kind == KVI_TRACE_REMOVE) {
        kvi_bl_naive_remove(ix, e->worker, e->engine_hash, e->n);
        return 0;
    }
    return kvi_bl_naive_store(ix, e->worker, e->has_parent, e->parent, e->engine_hash, e->content, e->n);
}

static const struct kvi_trace_backend backends[] = {
    {"kvidx", true, kvidx_create, kvidx_destroy, kvidx_find, kvidx_scores, kvidx_apply, kvidx_make_op, kvidx_forget,
     kvidx_rejected, kvidx_holdings},
    {"radix-lock", false, radix_create, radix_destroy, radix_find, bl_scores, radix_apply, bl_make_op, bl_forget,
     NULL, radix_holdings},
    {"naive-map", false, naive_create, naive_destroy, naive_find, bl_scores, naive_apply, bl_make_op, bl_forget,
     NULL, naive_holdings},
};

const struct kvi_trace_backend *kvi_trace_backend_by_name(const char *name)
{
    for (size_t i = 0; i < KVI_ARRAY_LEN(backends); i++)
        if (!strcmp(backends[i].name, name))
            return &backends[i];
    return NULL;
}

const char *kvi_trace_backend_name(const struct kvi_trace_backend *be)
{
    return be->name;
}

const char *kvi_trace_backend_names(void)
{
    return "kvidx,radix-lock,naive-map";
}

/* ---- instances ------------------------------------------------------------------ */

struct kvi_trace_be *kvi_trace_be_create(const struct kvi_trace_backend *be, uint32_t n_workers, uint32_t n_parts,
                                         uint32_t block_size, uint32_t jump, uint64_t key_seed)
{
    struct kvi_trace_be *b = kvi_xcalloc(1, sizeof *b);
    b->be = be;
    b->n_workers = n_workers;
    b->ix = be->create(n_workers, n_parts ? n_parts : 1, block_size, jump, key_seed);
    return b;
}

void kvi_trace_be_destroy(struct kvi_trace_be *b)
{
    if (b == NULL)
        return;
    b->be->destroy(b->ix);
    free(b);
}

int kvi_trace_be_apply(struct kvi_trace_be *b, const struct kvi_trace_entry *e)
{
    if (e->kind == KVI_TRACE_QUERY)
        return -EINVAL;
    int r = b->be->apply(b->ix, e);
    if (r < 0)
        atomic_fetch_add_explicit(&b->rejected, 1, memory_order_relaxed);
    return r;
}

static int cmp_score(const void *a, const void *b)
{
    const struct kvi_bl_score *x = a, *y = b;
    return (x->worker > y->worker) - (x->worker < y->worker);
}

static void lane_sort(struct kvi_bl_score *s, size_t n)
{
    qsort(s, n, sizeof *s, cmp_score);
}

static void scratch_init(struct lane_scratch *s, uint32_t n_workers)
{
    memset(s, 0, sizeof *s);
    s->cap = n_workers ? n_workers : 1;
    s->m = kvi_xmalloc(s->cap * sizeof *s->m);
    s->sc = kvi_xmalloc(s->cap * sizeof *s->sc);
}

static void scratch_free(struct lane_scratch *s)
{
    free(s->m);
    free(s->sc);
    kvi_bl_scratch_free(&s->bl);
}

size_t kvi_trace_be_scores(struct kvi_trace_be *b, struct kvi_bl_scratch *s, const uint64_t *content, size_t n,
                           struct kvi_bl_score *out, size_t cap)
{
    struct lane_scratch ls;
    scratch_init(&ls, b->n_workers);
    ls.bl = *s;
    size_t k = b->be->find(b->ix, &ls, content, n);
    size_t m = b->be->scores(b->ix, &ls, k);
    lane_sort(ls.sc, m);
    memcpy(out, ls.sc, KVI_MIN(m, cap) * sizeof *out);
    *s = ls.bl; /* keep the grown scratch */
    ls.bl = (struct kvi_bl_scratch){0};
    scratch_free(&ls);
    return k;
}

uint64_t kvi_trace_be_rejected(struct kvi_trace_be *b)
{
    if (b->be->rejected != NULL)
        return b->be->rejected(b->ix);
    return atomic_load_explicit(&b->rejected, memory_order_relaxed);
}

uint64_t kvi_trace_be_holdings(struct kvi_trace_be *b)
{
    return b->be->holdings(b->ix);
}

/* ---- lanes ------------------------------------------------------------------------ */

struct run;

struct lane {
    struct run *run;
    uint32_t id;
    uint32_t *idx; /* entries of this lane, in timeline order */
    size_t n;
    pthread_t tid;
    struct lane_scratch s;
    struct kvi_hist find, lag;
    KVI_CACHE_ALIGNED _Atomic uint64_t issued; /* progress, read by the caller */
    _Atomic bool done;
    uint64_t queries, events, block_ops, hits, best_depth_sum;
    uint64_t t_issue_end, t_drained;
} KVI_CACHE_ALIGNED;

struct run {
    const struct kvi_trace_workload *w;
    struct kvi_trace_be *b;
    const struct kvi_trace_run_cfg *cfg;
    struct kvi_writer_pool *pool;
    pthread_barrier_t ready;
    _Atomic uint64_t t0;
    double scale;         /* wall ns per timeline ns */
    uint64_t stop_after;  /* ns after t0 when lanes stop issuing */
    _Atomic uint32_t lanes_issued;
    uint64_t backlog;     /* sampled by the last lane to finish issuing */
    uint64_t t_last_issue;
    _Atomic bool aborted; /* any lane stopped early (read after join) */
};

static void sleep_until(uint64_t due)
{
    for (;;) {
        uint64_t now = kvi_now_ns();
        if (now >= due)
            return;
        if (due - now > SLEEP_MIN_NS) {
            struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        } else {
            sched_yield();
        }
    }
}

static void submit(struct kvi_producer *p, struct kvi_op **burst, uint32_t *nb)
{
    if (*nb == 0)
        return;
    kvi_producer_submit_burst(p, burst, *nb);
    *nb = 0;
}

static void lane_query(struct lane *l, const struct kvi_trace_entry *e)
{
    struct run *r = l->run;
    uint64_t t1 = kvi_now_ns();
    size_t k = r->b->be->find(r->b->ix, &l->s, e->content, e->n);
    uint64_t t2 = kvi_now_ns();
    kvi_hist_record(&l->find, t2 - t1);
    l->queries++;
    if (k > 0) {
        size_t m = r->b->be->scores(r->b->ix, &l->s, k);
        uint32_t best = 0;
        for (size_t i = 0; i < m; i++)
            best = KVI_MAX(best, l->s.sc[i].depth);
        l->hits++;
        l->best_depth_sum += best;
    }
}

static void *lane_main(void *arg)
{
    struct lane *l = arg;
    struct run *r = l->run;
    const struct kvi_trace_be *b = r->b;
    if (b->be->rcu)
        kvi_rcu_register_thread();
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    char name[16];
    snprintf(name, sizeof name, "kvi-lane-%u", l->id);
    pthread_setname_np(pthread_self(), name);
    struct kvi_producer *p = kvi_producer_create(r->pool);
    if (p == NULL)
        kvi_die("kvi_producer_create failed");
    pthread_barrier_wait(&r->ready);
    uint64_t t0;
    while ((t0 = atomic_load_explicit(&r->t0, memory_order_acquire)) == 0) /* pairs with the caller's release */
        sched_yield();
    uint64_t stop = t0 + r->stop_after;
    struct kvi_op *burst[LANE_BURST];
    uint32_t nb = 0;
    uint32_t n_writers = kvi_writer_pool_size(r->pool);
    const struct kvi_trace_entry *ents = r->w->e;
    size_t i;
    for (i = 0; i < l->n; i++) {
        const struct kvi_trace_entry *e = &ents[l->idx[i]];
        uint64_t due = t0 + (uint64_t)((double)e->t_ns * r->scale);
        uint64_t now = kvi_now_ns();
        if (now < due) {
            submit(p, burst, &nb);
            sleep_until(due);
            now = kvi_now_ns();
        }
        if (now > stop)
            break;
        kvi_hist_record(&l->lag, now - due);
        if (e->kind == KVI_TRACE_QUERY) {
            submit(p, burst, &nb);
            lane_query(l, e);
        } else {
            burst[nb++] = b->be->make_op(r->b, e, n_writers);
            l->events++;
            if (nb == LANE_BURST)
                submit(p, burst, &nb);
        }
        l->block_ops += e->n;
        atomic_store_explicit(&l->issued, i + 1, memory_order_relaxed);
    }
    submit(p, burst, &nb);
    l->t_issue_end = kvi_now_ns();
    if (i < l->n)
        atomic_store_explicit(&r->aborted, true, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&r->lanes_issued, 1, memory_order_acq_rel) + 1 == r->cfg->readers) {
        uint64_t q = 0;
        for (uint32_t wi = 0; wi < n_writers; wi++) {
            struct kvi_writer_stats ws;
            kvi_writer_stats(r->pool, wi, &ws);
            q += ws.queued;
        }
        r->backlog = q;
        r->t_last_issue = l->t_issue_end;
    }
    kvi_producer_flush(p);
    l->t_drained = kvi_now_ns();
    kvi_producer_destroy(p);
    if (b->be->rcu)
        kvi_rcu_unregister_thread();
    atomic_store_explicit(&l->done, true, memory_order_release);
    return NULL;
}

static void split_lanes(const struct kvi_trace_workload *w, struct lane *lanes, uint32_t n_lanes)
{
    for (size_t i = 0; i < w->n; i++)
        lanes[w->e[i].worker % n_lanes].n++;
    for (uint32_t k = 0; k < n_lanes; k++) {
        lanes[k].idx = kvi_xmalloc((lanes[k].n ? lanes[k].n : 1) * sizeof *lanes[k].idx);
        lanes[k].n = 0;
    }
    for (size_t i = 0; i < w->n; i++) {
        struct lane *l = &lanes[w->e[i].worker % n_lanes];
        l->idx[l->n++] = (uint32_t)i;
    }
}

void kvi_trace_result_derive(const struct kvi_trace_workload *w, const struct kvi_trace_run_cfg *cfg,
                             const struct kvi_hist *find, const struct kvi_hist *lag, uint64_t best_depth_sum,
                             struct kvi_trace_run_result *res)
{
    double window_s = cfg->window_ms / 1e3;
    res->window_ms = cfg->window_ms;
    res->ops_total = w->n;
    res->events_total = w->st.stores + w->st.removes;
    res->block_ops_total = w->st.query_blocks + w->st.stored_blocks + w->st.removed_blocks;
    res->offered_ops_per_s = (double)res->ops_total / window_s;
    res->offered_block_ops_per_s = (double)res->block_ops_total / window_s;
    double el_s = res->elapsed_ms / 1e3;
    res->achieved_ops_per_s = el_s > 0 ? (double)res->ops_issued / el_s : 0;
    res->achieved_block_ops_per_s = el_s > 0 ? (double)res->block_ops_issued / el_s : 0;
    res->issue_ok = res->ops_issued == res->ops_total && res->issue_end_ms <= 1.01 * cfg->window_ms;
    res->keep_up = res->elapsed_ms <= 1.10 * cfg->window_ms;
    kvi_hist_summarize(find, &res->find);
    res->lag_p99_ns = kvi_hist_percentile(lag, 99);
    res->lag_max_ns = lag->count ? lag->max : 0;
    res->mean_best_depth = res->hit_queries ? (double)best_depth_sum / (double)res->hit_queries : 0;
}

static void fill_result(const struct kvi_trace_workload *w, const struct run *r, struct lane *lanes,
                        struct kvi_trace_run_result *res)
{
    const struct kvi_trace_run_cfg *cfg = r->cfg;
    uint64_t t0 = atomic_load(&r->t0), t_end = t0;
    struct kvi_hist *find = kvi_xmalloc(sizeof *find), *lag = kvi_xmalloc(sizeof *lag);
    kvi_hist_reset(find);
    kvi_hist_reset(lag);
    uint64_t best = 0;
    for (uint32_t k = 0; k < cfg->readers; k++) {
        struct lane *l = &lanes[k];
        res->ops_issued += atomic_load_explicit(&l->issued, memory_order_relaxed);
        res->events_issued += l->events;
        res->queries_issued += l->queries;
        res->block_ops_issued += l->block_ops;
        res->hit_queries += l->hits;
        best += l->best_depth_sum;
        t_end = KVI_MAX(t_end, l->t_drained);
        kvi_hist_merge(find, &l->find);
        kvi_hist_merge(lag, &l->lag);
    }
    res->elapsed_ms = (double)(t_end - t0) / 1e6;
    res->issue_end_ms = (double)(r->t_last_issue - t0) / 1e6;
    kvi_trace_result_derive(w, cfg, find, lag, best, res);
    res->backlog_events = r->backlog;
    res->backlog_pct = res->events_total ? 100.0 * (double)r->backlog / (double)res->events_total : 0;
    res->aborted = atomic_load_explicit(&r->aborted, memory_order_relaxed);
    res->valid = res->issue_ok && !res->aborted && res->backlog_pct <= 5.0;
    res->threads = cfg->readers + cfg->writers;
    res->readers = cfg->readers;
    free(find);
    free(lag);
}

int kvi_trace_run(const struct kvi_trace_workload *w, const struct kvi_trace_backend *be,
                  const struct kvi_trace_run_cfg *cfg, struct kvi_trace_run_result *res)
{
    memset(res, 0, sizeof *res);
    if (!(cfg->window_ms > 0) || cfg->readers == 0 || cfg->writers == 0 || cfg->writers > KVI_WRITER_MAX ||
        cfg->readers > KVI_PRODUCER_MAX - 1 || !(cfg->max_overrun > 1.0) || w->n == 0)
        return -EINVAL;
    snprintf(res->backend, sizeof res->backend, "%s", be->name);
    struct run r = {.w = w, .cfg = cfg};
    r.b = kvi_trace_be_create(be, w->n_workers_total, cfg->writers, w->cfg.block_size, cfg->jump, cfg->key_seed);
    r.pool = kvi_writer_pool_create(cfg->writers, cfg->ring_capacity);
    if (r.pool == NULL)
        kvi_die("kvi_writer_pool_create: errno %d", errno);
    double span = w->span_ns ? (double)w->span_ns : 1.0;
    r.scale = cfg->window_ms * 1e6 / span;
    r.stop_after = (uint64_t)(cfg->max_overrun * cfg->window_ms * 1e6);
    struct lane *lanes = aligned_alloc(KVI_CACHE_LINE, cfg->readers * sizeof *lanes);
    if (lanes == NULL)
        kvi_die("out of memory");
    memset(lanes, 0, cfg->readers * sizeof *lanes);
    split_lanes(w, lanes, cfg->readers);
    pthread_barrier_init(&r.ready, NULL, cfg->readers + 1);
    for (uint32_t k = 0; k < cfg->readers; k++) {
        struct lane *l = &lanes[k];
        l->run = &r;
        l->id = k;
        scratch_init(&l->s, w->n_workers_total);
        kvi_hist_reset(&l->find);
        kvi_hist_reset(&l->lag);
        int rc = pthread_create(&l->tid, NULL, lane_main, l);
        if (rc != 0)
            kvi_die("pthread_create: %d", rc);
    }
    pthread_barrier_wait(&r.ready);
    atomic_store_explicit(&r.t0, kvi_now_ns() + 1000000u, memory_order_release);
    for (;;) {
        bool all = true;
        uint64_t done = 0;
        for (uint32_t k = 0; k < cfg->readers; k++) {
            all &= atomic_load_explicit(&lanes[k].done, memory_order_acquire);
            done += atomic_load_explicit(&lanes[k].issued, memory_order_relaxed);
        }
        if (cfg->progress)
            cfg->progress(cfg->pctx, done, w->n);
        if (all)
            break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (uint32_t k = 0; k < cfg->readers; k++)
        pthread_join(lanes[k].tid, NULL);
    pthread_barrier_destroy(&r.ready);
    fill_result(w, &r, lanes, res);
    for (uint32_t wi = 0; wi < cfg->writers; wi++) {
        struct kvi_writer_stats ws;
        kvi_writer_stats(r.pool, wi, &ws);
        res->stalls += ws.stalls;
        res->writer_busy_ms += (double)ws.busy_ns / 1e6;
    }
    res->rejected = kvi_trace_be_rejected(r.b);
    if (cfg->inspect)
        cfg->inspect(cfg->ictx, r.b);
    struct kvi_producer *p = kvi_producer_create(r.pool);
    if (p == NULL)
        kvi_die("kvi_producer_create failed");
    be->forget(r.b->ix, p);
    kvi_producer_destroy(p);
    kvi_writer_pool_destroy(r.pool);
    kvi_trace_be_destroy(r.b);
    for (uint32_t k = 0; k < cfg->readers; k++) {
        scratch_free(&lanes[k].s);
        free(lanes[k].idx);
    }
    free(lanes);
    return 0;
}

/* ---- serial replay ---------------------------------------------------------- */

struct serial_arg {
    const struct kvi_trace_workload *w;
    const struct kvi_trace_backend *be;
    uint32_t jump;
    uint64_t key_seed;
    struct kvi_trace_serial_result *res;
};

/* On a thread of its own: the caller may be an RCU reader already. */
static void *serial_main(void *arg)
{
    const struct serial_arg *a = arg;
    const struct kvi_trace_workload *w = a->w;
    const struct kvi_trace_backend *be = a->be;
    struct kvi_trace_serial_result *res = a->res;
    uint32_t jump = a->jump;
    uint64_t key_seed = a->key_seed;
    memset(res, 0, sizeof *res);
    snprintf(res->backend, sizeof res->backend, "%s", be->name);
    struct kvi_trace_be *b = kvi_trace_be_create(be, w->n_workers_total, 1, w->cfg.block_size, jump, key_seed);
    if (be->rcu)
        kvi_rcu_register_thread();
    struct lane_scratch s;
    scratch_init(&s, w->n_workers_total);
    struct kvi_hist *first = kvi_xmalloc(sizeof *first), *again = kvi_xmalloc(sizeof *again);
    kvi_hist_reset(first);
    kvi_hist_reset(again);
    uint64_t apply_ns = 0;
    for (size_t i = 0; i < w->n; i++) {
        const struct kvi_trace_entry *e = &w->e[i];
        if (e->kind != KVI_TRACE_QUERY) {
            uint64_t t0 = kvi_now_ns();
            (void)kvi_trace_be_apply(b, e);
            apply_ns += kvi_now_ns() - t0;
            res->events++;
            res->event_blocks += e->n;
            continue;
        }
        uint64_t t0 = kvi_now_ns();
        size_t k = be->find(b->ix, &s, e->content, e->n);
        uint64_t t1 = kvi_now_ns();
        (void)be->find(b->ix, &s, e->content, e->n);
        uint64_t t2 = kvi_now_ns();
        kvi_hist_record(first, t1 - t0);
        kvi_hist_record(again, t2 - t1);
        res->queries++;
        res->hit_queries += k > 0;
    }
    kvi_hist_summarize(first, &res->first);
    kvi_hist_summarize(again, &res->again);
    res->apply_ns_per_block = res->event_blocks ? (double)apply_ns / (double)res->event_blocks : 0;
    res->rejected = kvi_trace_be_rejected(b);
    free(first);
    free(again);
    scratch_free(&s);
    if (be->rcu)
        kvi_rcu_unregister_thread();
    kvi_trace_be_destroy(b);
    return NULL;
}

int kvi_trace_serial(const struct kvi_trace_workload *w, const struct kvi_trace_backend *be, uint32_t jump,
                     uint64_t key_seed, struct kvi_trace_serial_result *res)
{
    struct serial_arg a = {w, be, jump, key_seed, res};
    pthread_t t;
    int rc = pthread_create(&t, NULL, serial_main, &a);
    if (rc != 0)
        return -rc;
    pthread_join(t, NULL);
    return 0;
}
