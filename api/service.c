/*
 * kvidxd service: the service object, its control thread and queue, start /
 * stop / destroy, readiness and the counts, the /dump hand-off and the startup
 * sequence: what ties the other service files together (their list:
 * api/service_internal.h).
 *
 * DESIGN (the whole service: api/service.h)
 *   The control thread (ctl_main) owns a writer-pool producer. It runs the
 *   startup sequence (svc_startup: --workers, P2P recovery through
 *   api/recovery.h, the minimum-workers gate) first, then every posted
 *   function in arrival order. After each, once the queue is empty or
 *   SVC_RETIRED_MAX replaced rosters wait, it waits for one grace period and
 *   frees what the roster retired (kvi_svc__reclaim, api/service_roster.c).
 *   The queue is under `qmu`; stop lets the thread drain it (every function
 *   sees kvi_service_stopping() true) and closes it to new posts.
 *   Readiness: `registered`, `gate_open`, `recovery_result` and
 *   `recovery_running` (set by create) are atomics the control thread writes
 *   and any thread reads; kvi_service_counts and kvi_service_recovery_stats
 *   read the tables and the figures under `mu`. A /dump goes through the queue, so it
 *   starts after startup and recovery, and then runs on a thread of
 *   api/dump_pool.h.
 */
#include "api/service_internal.h"
#include "net/nats_bridge.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/dump_pool.h"
#include "api/recovery.h"
#include "engine/common.h"
#include "engine/rcu.h"
#include "net/log.h"

static void svc_teardown(struct kvi_service *x);

/** A function posted to the control thread (kvi_service_post), queued under qmu. */
struct svc_cmd {
    struct svc_cmd *next;
    void (*fn)(struct kvi_service *svc, void *arg);
    void *arg;
};

/* ---- lifecycle ------------------------------------------------------------------------ */

struct kvi_service *kvi_service_create(const struct kvi_service_config *cfg)
{
    struct kvi_service *svc = kvi_xcalloc(1, sizeof *svc);
    svc->cfg = *cfg;
    if (svc->cfg.writer_threads == 0)
        svc->cfg.writer_threads = KVI_SVC_DEFAULT_WRITERS;
    if (svc->cfg.recovery_timeout_ms == 0)
        svc->cfg.recovery_timeout_ms = KVI_SVC_DEFAULT_RECOVERY_TIMEOUT_MS;
    if (svc->cfg.max_models == 0)
        svc->cfg.max_models = KVI_SVC_DEFAULT_MAX_MODELS;
    if (svc->cfg.writer_threads > KVI_WRITER_MAX) {
        free(svc);
        errno = EINVAL;
        return NULL;
    }
    svc->model_name = xstrdup(cfg->model_name ? cfg->model_name : "default");
    svc->tenant_id = xstrdup(cfg->tenant_id ? cfg->tenant_id : "default");
    svc->cfg.model_name = svc->model_name;
    svc->cfg.tenant_id = svc->tenant_id;
    if (cfg->n_workers > 0) {
        svc->workers = kvi_xcalloc(cfg->n_workers, sizeof *svc->workers);
        memcpy(svc->workers, cfg->workers, cfg->n_workers * sizeof *svc->workers);
    }
    svc->cfg.workers = svc->workers;
    if (cfg->n_peers > 0) {
        svc->peers_cfg = kvi_xcalloc(cfg->n_peers, sizeof(char *));
        for (size_t i = 0; i < cfg->n_peers; i++)
            svc->peers_cfg[i] = xstrdup(cfg->peers[i]);
    }
    svc->cfg.peers = (const char *const *)svc->peers_cfg;
    pthread_mutex_init(&svc->qmu, NULL);
    pthread_cond_init(&svc->qcv, NULL);
    pthread_mutex_init(&svc->mu, NULL);
    atomic_store(&svc->recovery_running, cfg->n_peers > 0);
    kvi_svc__zbind_init(svc);

    struct kvi_index_config tmpl = {.block_size = 16, .n_parts = svc->cfg.writer_threads};
    int err = 0;
    svc->nsreg = kvi_nsreg_create(&tmpl);
    if (svc->nsreg == NULL) {
        err = errno;
        goto fail;
    }
    svc->writers = kvi_writer_pool_create(svc->cfg.writer_threads, cfg->ring_capacity);
    if (svc->writers == NULL) {
        err = errno;
        goto fail;
    }
    struct kvi_listeners_config lc = {
        .threads = cfg->listener_threads,
        .replay_timeout_ms = cfg->replay_timeout_ms,
        .gated = true,
        .quiet = cfg->listeners_quiet,
    };
    svc->listeners = kvi_listeners_create(svc->writers, &lc);
    if (svc->listeners == NULL) {
        err = errno;
        goto fail;
    }
    svc->dumps = kvi_dump_pool_create(svc->writers, svc->nsreg, KVI_SVC_DUMP_THREADS);
    if (svc->dumps == NULL) {
        err = errno;
        goto fail;
    }
    kvi_dump_pool_set_listeners(svc->dumps, svc->listeners);
    return svc;
fail:
    svc_teardown(svc);
    errno = err ? err : ENOMEM;
    return NULL;
}

/* Retired memory that makes the control thread wait for a grace period at once. */
#define SVC_RETIRED_MAX 256
static void svc_startup(struct kvi_service *svc, void *arg);

static void *ctl_main(void *arg)
{
    struct kvi_service *svc = arg;
    kvi_rcu_register_thread();
    svc->prod = kvi_producer_create(svc->writers);
    if (svc->prod == NULL)
        kvi_die("control thread: no producer: %s", strerror(errno));
    svc_startup(svc, NULL);
    for (;;) {
        uint64_t sweep_ns = kvi_svc__zbind_sweep(svc); /* --zmq-bind-idle-s: 0 = never */
        pthread_mutex_lock(&svc->qmu);
        if (svc->qhead == NULL && !svc->ctl_quit && sweep_ns > 0) {
            struct timespec ts = kvi_timespec_after(CLOCK_REALTIME, sweep_ns);
            pthread_cond_timedwait(&svc->qcv, &svc->qmu, &ts);
            if (svc->qhead == NULL && !svc->ctl_quit) {
                pthread_mutex_unlock(&svc->qmu);
                continue; /* a sweep is due */
            }
        }
        while (svc->qhead == NULL && !svc->ctl_quit)
            pthread_cond_wait(&svc->qcv, &svc->qmu);
        struct svc_cmd *c = svc->qhead;
        if (c == NULL) {
            svc->ctl_closed = true; /* quit with an empty queue: no post gets in any more */
            pthread_mutex_unlock(&svc->qmu);
            break;
        }
        svc->qhead = c->next;
        if (svc->qhead == NULL)
            svc->qtail = NULL;
        pthread_mutex_unlock(&svc->qmu);
        c->fn(svc, c->arg);
        free(c);
        /* one grace period for everything retired since the queue was last
         * empty (a burst of registrations waits for one, not one each) */
        pthread_mutex_lock(&svc->qmu);
        bool idle = svc->qhead == NULL;
        pthread_mutex_unlock(&svc->qmu);
        if (idle || svc->n_retired >= SVC_RETIRED_MAX)
            kvi_svc__reclaim(svc);
    }
    kvi_svc__reclaim(svc);
    kvi_producer_destroy(svc->prod);
    svc->prod = NULL;
    kvi_rcu_unregister_thread();
    return NULL;
}

int kvi_service_start(struct kvi_service *svc)
{
    /* ctl_started is written by main only; posts never read it (they queue
     * until the thread runs, so requests that arrive before start wait). */
    int rc = pthread_create(&svc->ctl, NULL, ctl_main, svc);
    if (rc != 0)
        return -rc;
    svc->ctl_started = true;
    return 0;
}

void kvi_service_begin_stop(struct kvi_service *svc)
{
    atomic_store(&svc->stopping, true);
    pthread_mutex_lock(&svc->qmu);
    pthread_cond_broadcast(&svc->qcv);
    pthread_mutex_unlock(&svc->qmu);
}

bool kvi_service_stopping(const struct kvi_service *svc)
{
    return atomic_load_explicit(&svc->stopping, memory_order_relaxed);
}

int kvi_service_stop(struct kvi_service *svc, uint32_t wait_ms)
{
    kvi_service_begin_stop(svc);
    pthread_mutex_lock(&svc->qmu);
    svc->ctl_quit = true;
    pthread_cond_broadcast(&svc->qcv);
    pthread_mutex_unlock(&svc->qmu);
    kvi_dump_pool_close(svc->dumps);
    /* one deadline for the control thread and the dump threads */
    struct timespec ts = kvi_timespec_after(CLOCK_REALTIME, (uint64_t)wait_ms * 1000000u);
    if (svc->ctl_started) {
        if (wait_ms == 0)
            pthread_join(svc->ctl, NULL);
        else if (pthread_timedjoin_np(svc->ctl, NULL, &ts) != 0)
            return -ETIMEDOUT;
        svc->ctl_started = false;
    }
    if (kvi_dump_pool_join(svc->dumps, wait_ms == 0 ? NULL : &ts) != 0)
        return -ETIMEDOUT;
    pthread_mutex_lock(&svc->qmu);
    svc->ctl_closed = true;
    pthread_mutex_unlock(&svc->qmu);
    return 0;
}

int kvi_service_post(struct kvi_service *svc, void (*fn)(struct kvi_service *svc, void *arg), void *arg)
{
    struct svc_cmd *c = kvi_xmalloc(sizeof *c);
    c->next = NULL;
    c->fn = fn;
    c->arg = arg;
    pthread_mutex_lock(&svc->qmu);
    if (svc->ctl_closed) {
        pthread_mutex_unlock(&svc->qmu);
        free(c);
        return -ESHUTDOWN;
    }
    if (svc->qtail)
        svc->qtail->next = c;
    else
        svc->qhead = c;
    svc->qtail = c;
    pthread_cond_signal(&svc->qcv);
    pthread_mutex_unlock(&svc->qmu);
    return 0;
}

bool kvi_service_ctl_wait(struct kvi_service *svc, uint32_t ms)
{
    struct timespec ts = kvi_timespec_after(CLOCK_REALTIME, (uint64_t)ms * 1000000u);
    pthread_mutex_lock(&svc->qmu);
    while (!kvi_service_stopping(svc)) {
        if (pthread_cond_timedwait(&svc->qcv, &svc->qmu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&svc->qmu);
    return !kvi_service_stopping(svc);
}

static void svc_teardown(struct kvi_service *svc)
{
    if (svc == NULL)
        return;
    if (svc->ctl_started)
        kvi_service_stop(svc, 0);
    kvi_dump_pool_destroy(svc->dumps); /* dumps may run without the control thread */
    for (struct svc_cmd *c = svc->qhead, *next; c != NULL; c = next) {
        next = c->next; /* posted but never run: the service was never started */
        free(c->arg);
        free(c);
    }
    if (svc->listeners)
        kvi_listeners_destroy(svc->listeners);
    kvi_svc__bridge_close(svc); /* after the listeners (they call its mirror hook), before the plane */
    kvi_svc__nats_stop(svc);    /* its sources submit to the writers (destroyed below) */
    kvi_svc__zbind_free(svc); /* after the listeners: their threads call into it */
    if (svc->writers)
        kvi_writer_pool_destroy(svc->writers);
    if (svc->nsreg)
        kvi_nsreg_destroy(svc->nsreg);
    kvi_svc__reclaim(svc); /* no reader is left: the HTTP server and the control thread are gone */
    kvi_svc__cond_view_free(atomic_load(&svc->cview));
    for (size_t i = 0; i < svc->n_dyn; i++)
        free(svc->dyn[i]);
    free(svc->dyn);
    free(svc->retired);
    for (size_t i = 0; i < svc->n_w; i++)
        kvi_svc__free_worker(&svc->w[i]);
    free(svc->w);
    for (size_t i = 0; i < svc->n_c; i++)
        kvi_svc__free_cond(&svc->c[i]);
    free(svc->c);
    free(svc->nsr);
    free(svc->rwm);
    for (size_t i = 0; i < svc->n_peers; i++)
        free(svc->peers[i]);
    free(svc->peers);
    for (size_t i = 0; i < svc->cfg.n_peers; i++)
        free(svc->peers_cfg[i]);
    free(svc->peers_cfg);
    free(svc->workers);
    free(svc->model_name);
    free(svc->tenant_id);
    pthread_mutex_destroy(&svc->mu);
    pthread_mutex_destroy(&svc->qmu);
    pthread_cond_destroy(&svc->qcv);
    free(svc);
}

/* ---- accessors ------------------------------------------------------------------------ */

struct kvi_nsreg *kvi_service_nsreg(const struct kvi_service *svc)
{
    return svc->nsreg;
}

struct kvi_listeners *kvi_service_listeners(const struct kvi_service *svc)
{
    return svc->listeners;
}

struct kvi_writer_pool *kvi_service_writers(const struct kvi_service *svc)
{
    return svc->writers;
}

struct kvi_producer *kvi_service_ctl_producer(struct kvi_service *svc)
{
    return svc->prod;
}

/* ---- readiness ------------------------------------------------------------------------- */

static uint64_t count_instances_locked(const struct kvi_service *svc)
{
    uint64_t n = svc->n_w;
    for (size_t i = 0; i < svc->n_c; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(svc->c[j].instance, svc->c[i].instance) == 0;
        n += !seen;
    }
    return n;
}

void kvi_svc__update_registered(struct kvi_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    uint64_t n = count_instances_locked(svc);
    pthread_mutex_unlock(&svc->mu);
    atomic_store(&svc->registered, n);
}

/* Open the listeners' gate once every --workers entry has been registered,
 * recovery is over and enough instances are registered. Control thread. */
void kvi_svc__maybe_open_gate(struct kvi_service *svc)
{
    if (atomic_load(&svc->gate_open) || !svc->startup_registered || atomic_load(&svc->recovery_running))
        return;
    if (svc->registry != NULL && !atomic_load(&svc->registry_loaded))
        return; /* (api/service_registry.c opens it once the bucket's registrations are applied) */
    uint64_t min = svc->cfg.min_initial_workers;
    if (min > 0 && atomic_load(&svc->registered) < min)
        return;
    kvi_listeners_open_gate(svc->listeners);
    atomic_store(&svc->gate_open, true);
    kvi_log_info("ready gate open: listeners draining (%" PRIu64 " instance(s) registered)",
                 atomic_load(&svc->registered));
}

void kvi_service_status(struct kvi_service *svc, struct kvi_status_view *out)
{
    struct kvi_listener_totals t;
    kvi_listeners_totals(svc->listeners, &t);
    memset(out, 0, sizeof *out);
    out->recovery_enabled = svc->cfg.n_peers > 0;
    out->recovery_in_progress = atomic_load(&svc->recovery_running);
    out->last_result = kvi_recovery_result_name((enum kvi_recovery_result)atomic_load(&svc->recovery_result));
    out->required_initial = svc->cfg.min_initial_workers;
    out->registered = atomic_load(&svc->registered);
    out->pending = t.by_state[KVI_LISTENER_PENDING];
    out->active = t.by_state[KVI_LISTENER_ACTIVE];
    out->paused = t.by_state[KVI_LISTENER_PAUSED];
    out->failed = t.by_state[KVI_LISTENER_FAILED];
    const char *reason = "ready";
    if (out->recovery_in_progress)
        reason = "recovering_from_peer";
    else if (!atomic_load(&svc->gate_open) && out->registered < out->required_initial)
        reason = "waiting_for_min_initial_workers";
    else if (out->failed > 0)
        reason = "listeners_failed";
    else if (atomic_load(&svc->registry_active) && !atomic_load(&svc->registry_loaded))
        reason = "registry_loading"; /* --nats-registry: the bucket's registrations not applied yet */
    else if (out->pending > 0 || !atomic_load(&svc->gate_open))
        reason = "listeners_pending"; /* (the gate opens once startup has registered --workers) */
    struct kvi_nats *n = kvi_service_nats(svc);
    if (n != NULL) {
        out->has_nats = true;
        struct kvi_nats_conn_info ci;
        kvi_nats_conn_info(n, &ci);
        out->nats_connected = ci.connected;
        bool caught_up = kvi_nats_ready(n, &out->nats_pending);
        if (!caught_up && strcmp(reason, "ready") == 0) /* (no server answers: nothing is caught up) */
            reason = !ci.connected            ? "nats_unreachable"
                     : kvi_nats_restoring(n) ? "nats_loading_snapshot"
                                             : "nats_catching_up";
    }
    struct kvi_nats_bridge *br = atomic_load_explicit(&svc->bridge, memory_order_acquire); /* N1 */
    out->has_bridge = br != NULL;
    if (br != NULL) {
        out->bridge_stream = kvi_nats_bridge_stream(br);
        kvi_nats_bridge_stats(br, &out->bridge);
        out->n_bridge_ns = kvi_nats_bridge_ns_list(br, out->bridge_ns, KVI_STATUS_BRIDGE_NS);
    }
    out->reason = reason;
    out->ready = strcmp(reason, "ready") == 0;
}

void kvi_service_counts(struct kvi_service *svc, struct kvi_service_counts *out)
{
    pthread_mutex_lock(&svc->mu);
    out->models = svc->n_nsr;
    out->workers = count_instances_locked(svc);
    out->services = svc->n_c;
    out->peers = svc->n_peers;
    pthread_mutex_unlock(&svc->mu);
}

/* Declared in api/recovery.h (recovery's figures, as the service keeps them). */
void kvi_service_recovery_stats(struct kvi_service *svc, struct kvi_recovery_stats *out)
{
    pthread_mutex_lock(&svc->mu);
    *out = svc->rstats;
    pthread_mutex_unlock(&svc->mu);
}

/* ---- /dump ----------------------------------------------------------------------------------- */

struct svc_dump_req {
    kvi_dump_sink_fn sink;
    kvi_dump_done_fn done;
    void *ctx;
};

/* Control thread, in its turn (after startup and P2P recovery): hand the dump to a dump thread. Never blocks. */
static void svc_dump_start(struct kvi_service *svc, void *arg)
{
    struct svc_dump_req *r = arg;
    int rc = kvi_dump_pool_submit(svc->dumps, r->sink, r->done, r->ctx);
    if (rc != 0)
        r->done(r->ctx, rc); /* -ESHUTDOWN (stop has begun), or no dump thread could start */
    free(r);
}

int kvi_service_dump(struct kvi_service *svc, kvi_dump_sink_fn sink, kvi_dump_done_fn done, void *ctx)
{
    struct svc_dump_req *r = kvi_xmalloc(sizeof *r);
    *r = (struct svc_dump_req){sink, done, ctx};
    int rc = kvi_service_post(svc, svc_dump_start, r);
    if (rc != 0)
        free(r);
    return rc;
}

/* ---- startup --------------------------------------------------------------------------------- */

static void svc_startup(struct kvi_service *svc, void *arg)
{
    (void)arg;
    /* the fleet's registrations first: the gate waits until the bucket's are applied */
    kvi_svc__bridge_open(svc); /* before any ZMQ registration (the registry's too): each one is bridged */
    kvi_svc__registry_open(svc, kvi_svc__nats_plane(svc));
    for (size_t i = 0; i < svc->cfg.n_workers && !kvi_service_stopping(svc); i++) {
        const struct kvi_worker_spec *ws = &svc->workers[i];
        struct kvi_api_err err;
        struct kvi_str none = {NULL, 0};
        if (kvi_svc__dyn_register(svc, ws->instance_id, zstr(svc->model_name), zstr(svc->tenant_id),
                                  svc->cfg.block_size, ws->dp_rank, zstr(ws->endpoint), none, false, false, &err) != 0)
            kvi_log_error("--workers entry %" PRIu64 ":%" PRIu32 "=%s: %s", ws->instance_id, ws->dp_rank,
                          ws->endpoint, err.msg);
    }
    /* the registrations above left the gate shut (kvi_svc__maybe_open_gate),
     * so that /ready never answers ready with --workers entries still to come */
    svc->startup_registered = true;
    if (svc->cfg.n_peers > 0) {
        struct kvi_recovery_stats st = {0};
        enum kvi_recovery_result res = kvi_recovery_run(svc, svc->cfg.peers, svc->cfg.n_peers,
                                                        svc->cfg.recovery_delay_ms, svc->cfg.recovery_timeout_ms, &st);
        pthread_mutex_lock(&svc->mu);
        svc->rstats = st;
        pthread_mutex_unlock(&svc->mu);
        for (size_t i = 0; i < svc->cfg.n_peers; i++)
            kvi_service_peer_add(svc, svc->cfg.peers[i], strlen(svc->cfg.peers[i]));
        atomic_store(&svc->recovery_running, false);
        /* the gate opens (when it can) before the result shows in /status */
        kvi_svc__maybe_open_gate(svc);
        atomic_store(&svc->recovery_result, (int)res);
    }
    /* NATS sources after recovery: a stream source rebuilds from its stream, over what a peer gave */
    if (!kvi_service_stopping(svc)) {
        kvi_svc__zbind_start(svc);
        kvi_svc__nats_start(svc);
    }
    if (svc->cfg.min_initial_workers > 0 && atomic_load(&svc->registered) < svc->cfg.min_initial_workers)
        kvi_log_info("waiting for %" PRIu64 " initial instance(s) to register (DYN_ROUTER_MIN_INITIAL_WORKERS)",
                     svc->cfg.min_initial_workers);
    kvi_svc__maybe_open_gate(svc);
}

/* The public destructor: the constructor's failure paths tear down through svc_teardown
 * (GCC's -Wmismatched-dealloc holds kvi_service_destroy to what the constructor returned). */
void kvi_service_destroy(struct kvi_service *x)
{
    svc_teardown(x);
}
