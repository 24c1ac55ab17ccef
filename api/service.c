/*
 * kvidxd service state. DESIGN: see api/service.h (threads, tables, startup,
 * shutdown). In short: one control thread serialises every mutation and owns
 * a writer-pool producer; HTTP loop threads read the registry and the
 * Conductor roster through RCU and the other tables under `mu`; /dump runs
 * on the dump threads of api/dump_pool.h.
 */
#include "api/service.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <time.h>

#include "api/dump_pool.h"
#include "api/recovery.h"
#include "engine/common.h"
#include "engine/rcu.h"
#include "net/log.h"

/* ---- tables -------------------------------------------------------------------------- */

struct svc_rank {
    uint32_t dp_rank;
    char *endpoint;
    char *replay; /* NULL when none */
};

/** A Dynamo instance: one (model, tenant), one listener per rank. */
struct svc_worker {
    uint64_t id;
    struct kvi_ns *ns;
    uint32_t dense;
    size_t n_ranks;
    struct svc_rank *ranks; /* ascending by dp_rank */
};

/** A Conductor service key instance|tenant|rank and its registration. */
struct svc_cond {
    char *instance;
    char *tenant;
    uint32_t dp_rank;
    char *model; /* as registered */
    char *lora;
    uint32_t block_size;
    enum kvi_cond_type type;
    char *endpoint;
    char *replay; /* "" when none */
    char *salt;
    bool has_cache_group;
    bool has_profile;
    char *hp[5]; /* strategy, algorithm, python_hash_seed, root_digest, index_projection */
    struct kvi_ns *ns;
    uint32_t dense;
};

/** A namespace the service created (or recovered), with its registration count. */
struct svc_nsrec {
    struct kvi_ns *ns;
    uint32_t refs; /* Dynamo instances + Conductor keys registered under it */
};

/**
 * The Dynamo instances of one namespace as Conductor contexts list them
 * (immutable once published; one allocation: the struct, then n instances,
 * their decimal names and their ranks). Replaced as a whole when a Dynamo
 * registration of the namespace changes, so a registration costs one copy
 * of its namespace's roster, not a rebuild of every context.
 */
struct dyn_roster {
    struct kvi_ns *ns;
    size_t n;
    struct kvi_svc_cond_inst *inst; /* ascending by numeric id */
};

/** The Conductor roster published to query threads (immutable). The
 * Dynamo rosters it points to are not its own: each is retired when a newer
 * one replaces it. */
struct cond_view {
    size_t n;
    struct kvi_svc_cond_ctx *ctx;
};

/** Memory readers may still hold, freed after one grace period. */
struct svc_retired {
    void *p;
    bool view; /* a struct cond_view (else a struct dyn_roster) */
};

struct svc_cmd {
    struct svc_cmd *next;
    void (*fn)(struct kvi_service *svc, void *arg);
    void *arg;
};

struct kvi_service {
    /* configuration (owned copies) */
    struct kvi_service_config cfg;
    char *model_name;
    char *tenant_id;
    struct kvi_worker_spec *workers;
    char **peers_cfg;

    struct kvi_nsreg *nsreg;
    struct kvi_writer_pool *writers;
    struct kvi_listeners *listeners;
    struct kvi_dump_pool *dumps; /* /dump threads */

    /* control thread */
    pthread_t ctl;
    bool ctl_started;
    struct kvi_producer *prod; /* owned by the control thread */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    struct svc_cmd *qhead, *qtail;
    bool ctl_quit;   /* under qmu: drain and exit */
    bool ctl_closed; /* under qmu: no more posts */
    _Atomic bool stopping;

    /* tables, under mu (written by the control thread only) */
    pthread_mutex_t mu;
    struct svc_worker *w;
    size_t n_w, cap_w;
    struct svc_cond *c;
    size_t n_c, cap_c;
    struct svc_nsrec *nsr;
    size_t n_nsr, cap_nsr;
    char **peers;
    size_t n_peers, cap_peers;
    struct cond_view *_Atomic cview; /* RCU-published */
    struct dyn_roster **dyn;         /* control thread: the current Dynamo roster of each namespace */
    size_t n_dyn, cap_dyn;
    struct svc_retired *retired;     /* control thread: freed after a grace period (svc_reclaim) */
    size_t n_retired, cap_retired;

    /* watermarks recovered from a peer for keys not registered yet (control thread) */
    struct svc_rwm {
        struct kvi_index *ix;
        uint32_t dense;
        uint32_t dp_rank;
        uint64_t seq;
    } *rwm;
    size_t n_rwm, cap_rwm;

    /* readiness */
    _Atomic bool recovery_running;
    _Atomic int recovery_result;
    _Atomic bool gate_open;
    bool startup_registered;     /* control thread: svc_startup has registered every --workers entry */
    _Atomic uint64_t registered; /* instances, for the min-initial-workers gate */
    struct kvi_recovery_stats rstats; /* under mu */
};

static char *xstrndup(const char *p, size_t n)
{
    char *s = kvi_xmalloc(n + 1);
    if (n > 0)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static char *xstrdup(const char *p)
{
    return xstrndup(p, strlen(p));
}

static char *sdup(struct kvi_str s)
{
    return xstrndup(s.p, s.len);
}

static struct kvi_str zstr(const char *s)
{
    return (struct kvi_str){s, strlen(s)};
}

const char *kvi_recovery_result_name(enum kvi_recovery_result r)
{
    switch (r) {
    case KVI_RECOVERY_SUCCEEDED: return "succeeded";
    case KVI_RECOVERY_NO_REACHABLE_PEERS: return "no_reachable_peers";
    case KVI_RECOVERY_FAILED: return "failed";
    default: return NULL;
    }
}

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
    kvi_service_destroy(svc);
    errno = err ? err : ENOMEM;
    return NULL;
}

static void cond_view_free(struct cond_view *v);
static void cond_view_publish(struct kvi_service *svc);
static void dyn_roster_update(struct kvi_service *svc, struct kvi_ns *ns);
static void svc_reclaim(struct kvi_service *svc);

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
        pthread_mutex_lock(&svc->qmu);
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
            svc_reclaim(svc);
    }
    svc_reclaim(svc);
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

static void free_worker(struct svc_worker *w)
{
    for (size_t i = 0; i < w->n_ranks; i++) {
        free(w->ranks[i].endpoint);
        free(w->ranks[i].replay);
    }
    free(w->ranks);
}

static void free_cond(struct svc_cond *c)
{
    free(c->instance);
    free(c->tenant);
    free(c->model);
    free(c->lora);
    free(c->endpoint);
    free(c->replay);
    free(c->salt);
    for (int i = 0; i < 5; i++)
        free(c->hp[i]);
}

void kvi_service_destroy(struct kvi_service *svc)
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
    if (svc->writers)
        kvi_writer_pool_destroy(svc->writers);
    if (svc->nsreg)
        kvi_nsreg_destroy(svc->nsreg);
    svc_reclaim(svc); /* no reader is left: the HTTP server and the control thread are gone */
    cond_view_free(atomic_load(&svc->cview));
    for (size_t i = 0; i < svc->n_dyn; i++)
        free(svc->dyn[i]);
    free(svc->dyn);
    free(svc->retired);
    for (size_t i = 0; i < svc->n_w; i++)
        free_worker(&svc->w[i]);
    free(svc->w);
    for (size_t i = 0; i < svc->n_c; i++)
        free_cond(&svc->c[i]);
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

/* ---- namespace records (control thread) ------------------------------------------------- */

static struct svc_nsrec *nsrec_find(struct kvi_service *svc, const struct kvi_ns *ns)
{
    for (size_t i = 0; i < svc->n_nsr; i++)
        if (svc->nsr[i].ns == ns)
            return &svc->nsr[i];
    return NULL;
}

/*
 * Find or create (model, tenant) with block size bs; *created when new. NULL:
 * errno, ENOSPC when creating it would pass --max-models (logged: the
 * operator must see a client being refused, or raise the flag).
 */
static struct kvi_ns *ns_get(struct kvi_service *svc, const char *model, const char *tenant, uint32_t bs,
                             bool *created)
{
    if (svc->n_nsr >= svc->cfg.max_models && kvi_nsreg_find(svc->nsreg, model, tenant) == NULL) {
        kvi_log_warn("namespace %s:%s not created: %" PRIu32 " exist, the most --max-models allows", model, tenant,
                     svc->cfg.max_models);
        errno = ENOSPC;
        return NULL;
    }
    struct kvi_ns *ns = NULL;
    int rc = kvi_nsreg_add(svc->nsreg, model, tenant, bs, &ns);
    if (rc < 0) {
        errno = -rc;
        return NULL;
    }
    *created = rc == 1;
    if (nsrec_find(svc, ns) == NULL) {
        pthread_mutex_lock(&svc->mu);
        if (svc->n_nsr == svc->cap_nsr) {
            svc->cap_nsr = svc->cap_nsr ? svc->cap_nsr * 2 : 8;
            svc->nsr = kvi_xrealloc(svc->nsr, svc->cap_nsr * sizeof *svc->nsr);
        }
        svc->nsr[svc->n_nsr++] = (struct svc_nsrec){ns, 0};
        pthread_mutex_unlock(&svc->mu);
    }
    if (*created)
        kvi_log_info("namespace %s:%s created (block_size %" PRIu32 ")", model, tenant, bs);
    return ns;
}

/* Unlink, forget and free a namespace nobody uses (control thread, outside any read section). */
/* ---- recovered watermarks (control thread) ---------------------------------------------- */

/* Drop the entries of (ix, dense, rank); any instance when all_inst, any rank when all_ranks. */
static void rwm_drop(struct kvi_service *svc, const struct kvi_index *ix, uint32_t dense, bool all_inst,
                     uint32_t rank, bool all_ranks)
{
    for (size_t i = svc->n_rwm; i-- > 0;) {
        const struct svc_rwm *e = &svc->rwm[i];
        if (e->ix == ix && (all_inst || e->dense == dense) && (all_ranks || e->dp_rank == rank))
            svc->rwm[i] = svc->rwm[--svc->n_rwm];
    }
}

/* The recovered watermark of a key about to be registered: seeds its spec. */
static void rwm_seed_spec(struct kvi_service *svc, struct kvi_listener_spec *spec, uint32_t dense)
{
    for (size_t i = 0; i < svc->n_rwm; i++) {
        const struct svc_rwm *e = &svc->rwm[i];
        if (e->ix == spec->ix && e->dense == dense && e->dp_rank == spec->dp_rank) {
            spec->seed_watermark = true;
            spec->watermark = e->seq;
            return;
        }
    }
}

void kvi_service_ctl_recovered_watermark(struct kvi_service *svc, struct kvi_ns *ns, uint32_t dense,
                                         uint64_t worker_id, const char *worker_name, uint32_t dp_rank,
                                         uint64_t seq)
{
    struct kvi_listener_key key = {ns->ix, worker_name ? 0 : worker_id, worker_name, dp_rank};
    int rc = kvi_listeners_seed(svc->listeners, &key, seq);
    if (rc == 0) {
        kvi_log_debug("recovery: listener %s%s%" PRIu64 " dp_rank %" PRIu32 " starts after seq %" PRIu64,
                      worker_name ? worker_name : "", worker_name ? " " : "", worker_name ? 0 : worker_id, dp_rank,
                      seq);
        return;
    }
    if (rc == -EBUSY) { /* registered and already ingesting: its own W rules */
        kvi_log_warn("recovery: watermark of instance %s%" PRIu64 " dp_rank %" PRIu32 " ignored: already ingesting",
                     worker_name ? worker_name : "", worker_name ? 0 : worker_id, dp_rank);
        return;
    }
    rwm_drop(svc, ns->ix, dense, false, dp_rank, false);
    if (svc->n_rwm == svc->cap_rwm) {
        svc->cap_rwm = svc->cap_rwm ? svc->cap_rwm * 2 : 16;
        svc->rwm = kvi_xrealloc(svc->rwm, svc->cap_rwm * sizeof *svc->rwm);
    }
    svc->rwm[svc->n_rwm++] = (struct svc_rwm){ns->ix, dense, dp_rank, seq};
}

static void ns_delete(struct kvi_service *svc, struct kvi_ns *ns)
{
    rwm_drop(svc, ns->ix, 0, true, 0, true);
    struct svc_nsrec *r = nsrec_find(svc, ns);
    pthread_mutex_lock(&svc->mu);
    if (r != NULL)
        *r = svc->nsr[--svc->n_nsr];
    pthread_mutex_unlock(&svc->mu);
    kvi_log_info("namespace %s:%s deleted (no registration left)", ns->model, ns->tenant);
    if (kvi_nsreg_unlink(svc->nsreg, ns) != 0)
        return;
    kvi_producer_forget_index(svc->prod, ns->ix);
    if (!kvi_dump_pool_defer_free(svc->dumps, ns)) /* else the last /dump holding it frees it */
        kvi_ns_free(ns);
}

static void ns_ref(struct kvi_service *svc, struct kvi_ns *ns, int delta)
{
    struct svc_nsrec *r = nsrec_find(svc, ns);
    KVI_ASSERT(r != NULL);
    pthread_mutex_lock(&svc->mu);
    r->refs = (uint32_t)((int)r->refs + delta);
    pthread_mutex_unlock(&svc->mu);
    if (delta < 0 && r->refs == 0)
        ns_delete(svc, ns);
}

struct kvi_ns *kvi_service_ctl_ns_get(struct kvi_service *svc, const char *model, const char *tenant,
                                      uint32_t block_size, bool *created)
{
    struct kvi_ns *ns = ns_get(svc, model, tenant, block_size, created);
    if (ns != NULL && !*created && ns->block_size != block_size)
        kvi_log_warn("recovery: namespace %s:%s has block_size %" PRIu32 ", the peer's dump %" PRIu32
                     "; keeping the existing one",
                     model, tenant, ns->block_size, block_size);
    return ns;
}

bool kvi_service_ctl_ns_drop_unused(struct kvi_service *svc, struct kvi_ns *ns)
{
    struct svc_nsrec *r = nsrec_find(svc, ns);
    if (r != NULL && r->refs > 0)
        return false;
    ns_delete(svc, ns);
    return true;
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

static void update_registered(struct kvi_service *svc)
{
    pthread_mutex_lock(&svc->mu);
    uint64_t n = count_instances_locked(svc);
    pthread_mutex_unlock(&svc->mu);
    atomic_store(&svc->registered, n);
}

/* Open the listeners' gate once every --workers entry has been registered,
 * recovery is over and enough instances are registered. Control thread. */
static void maybe_open_gate(struct kvi_service *svc)
{
    if (atomic_load(&svc->gate_open) || !svc->startup_registered || atomic_load(&svc->recovery_running))
        return;
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
    else if (out->pending > 0 || !atomic_load(&svc->gate_open))
        reason = "listeners_pending"; /* (the gate opens once startup has registered --workers) */
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

void kvi_service_recovery_stats(struct kvi_service *svc, struct kvi_recovery_stats *out)
{
    pthread_mutex_lock(&svc->mu);
    *out = svc->rstats;
    pthread_mutex_unlock(&svc->mu);
}

/* ---- peers ------------------------------------------------------------------------------- */

static ssize_t peer_index_locked(struct kvi_service *svc, const char *url, size_t len)
{
    for (size_t i = 0; i < svc->n_peers; i++)
        if (strlen(svc->peers[i]) == len && memcmp(svc->peers[i], url, len) == 0)
            return (ssize_t)i;
    return -1;
}

void kvi_service_peer_add(struct kvi_service *svc, const char *url, size_t len)
{
    pthread_mutex_lock(&svc->mu);
    if (peer_index_locked(svc, url, len) < 0) {
        if (svc->n_peers == svc->cap_peers) {
            svc->cap_peers = svc->cap_peers ? svc->cap_peers * 2 : 4;
            svc->peers = kvi_xrealloc(svc->peers, svc->cap_peers * sizeof(char *));
        }
        svc->peers[svc->n_peers++] = xstrndup(url, len);
    }
    pthread_mutex_unlock(&svc->mu);
}

int kvi_service_peer_remove(struct kvi_service *svc, const char *url, size_t len)
{
    pthread_mutex_lock(&svc->mu);
    ssize_t i = peer_index_locked(svc, url, len);
    if (i >= 0) {
        free(svc->peers[i]);
        memmove(&svc->peers[i], &svc->peers[i + 1], (svc->n_peers - (size_t)i - 1) * sizeof(char *));
        svc->n_peers--;
    }
    pthread_mutex_unlock(&svc->mu);
    return i >= 0 ? 0 : -ENOENT;
}

int kvi_service_encode_peers(struct kvi_service *svc, struct kvi_buf *out)
{
    pthread_mutex_lock(&svc->mu);
    int rc = kvi_dyn_encode_peers((const char *const *)svc->peers, svc->n_peers, out);
    pthread_mutex_unlock(&svc->mu);
    return rc;
}

/* ---- Dynamo workers ------------------------------------------------------------------------ */

static struct svc_worker *worker_find(struct kvi_service *svc, uint64_t id)
{
    size_t lo = 0, hi = svc->n_w;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (svc->w[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < svc->n_w && svc->w[lo].id == id ? &svc->w[lo] : NULL;
}

static struct svc_rank *rank_find(struct svc_worker *w, uint32_t rank)
{
    for (size_t i = 0; i < w->n_ranks; i++)
        if (w->ranks[i].dp_rank == rank)
            return &w->ranks[i];
    return NULL;
}

/* Insert worker `id` (sorted); caller holds mu. */
static struct svc_worker *worker_insert_locked(struct kvi_service *svc, uint64_t id)
{
    if (svc->n_w == svc->cap_w) {
        svc->cap_w = svc->cap_w ? svc->cap_w * 2 : 16;
        svc->w = kvi_xrealloc(svc->w, svc->cap_w * sizeof *svc->w);
    }
    size_t at = 0;
    while (at < svc->n_w && svc->w[at].id < id)
        at++;
    memmove(&svc->w[at + 1], &svc->w[at], (svc->n_w - at) * sizeof *svc->w);
    svc->n_w++;
    memset(&svc->w[at], 0, sizeof svc->w[at]);
    svc->w[at].id = id;
    return &svc->w[at];
}

static void rank_insert_locked(struct svc_worker *w, uint32_t rank, const char *ep, const char *replay)
{
    w->ranks = kvi_xrealloc(w->ranks, (w->n_ranks + 1) * sizeof *w->ranks);
    size_t at = 0;
    while (at < w->n_ranks && w->ranks[at].dp_rank < rank)
        at++;
    memmove(&w->ranks[at + 1], &w->ranks[at], (w->n_ranks - at) * sizeof *w->ranks);
    w->n_ranks++;
    w->ranks[at] = (struct svc_rank){rank, xstrdup(ep), replay ? xstrdup(replay) : NULL};
}

static void rank_remove_locked(struct svc_worker *w, uint32_t rank)
{
    for (size_t i = 0; i < w->n_ranks; i++) {
        if (w->ranks[i].dp_rank != rank)
            continue;
        free(w->ranks[i].endpoint);
        free(w->ranks[i].replay);
        memmove(&w->ranks[i], &w->ranks[i + 1], (w->n_ranks - i - 1) * sizeof *w->ranks);
        w->n_ranks--;
        return;
    }
}

static void worker_remove_locked(struct kvi_service *svc, struct svc_worker *w)
{
    size_t i = (size_t)(w - svc->w);
    free_worker(w);
    memmove(&svc->w[i], &svc->w[i + 1], (svc->n_w - i - 1) * sizeof *svc->w);
    svc->n_w--;
}

static void submit_op(struct kvi_service *svc, enum kvi_op_type type, struct kvi_ns *ns, uint32_t dense,
                      uint32_t rank)
{
    struct kvi_op *op = kvi_op_alloc(0, false);
    op->type = (uint8_t)type;
    op->ix = ns->ix;
    op->instance = dense;
    op->dp_rank = rank;
    kvi_producer_submit(svc->prod, op);
    kvi_producer_flush(svc->prod);
    if (type == KVI_OP_REMOVE_INSTANCE || type == KVI_OP_REMOVE_DP_RANK) /* the blocks it named are gone */
        rwm_drop(svc, ns->ix, dense, false, rank, type == KVI_OP_REMOVE_INSTANCE);
}

/* A listener registration failed with rc: fill err. */
static int listener_err(int rc, const struct kvi_listener_spec *spec, uint64_t id, struct kvi_api_err *err)
{
    if (rc == -EEXIST)
        return kvi_dyn_err_rank_taken(err, id, spec->dp_rank);
    if (rc == -EINVAL) {
        char why[256] = "invalid registration";
        kvi_listeners_validate(spec, why, sizeof why);
        err->status = 400;
        err->reason = NULL;
        err->field = NULL;
        err->index = -1;
        snprintf(err->msg, sizeof err->msg, "%s", why);
        return -EINVAL;
    }
    return kvi_err_internal(err, "listener registration failed");
}

/*
 * Whether the listener just registered under @p key failed while its thread set
 * it up (kvi_listeners_register waits for that): no socket at the descriptor
 * limit (EMFILE), an endpoint ZMQ refuses at once (an ipc path too long). Such
 * a listener never reads, so a registration must not answer success for it
 * (issue 18 item 8): it is unregistered and its last_error copied to @p why.
 */
static bool listener_failed_at_once(struct kvi_service *svc, const struct kvi_listener_key *key, char *why,
                                    size_t cap)
{
    struct kvi_listener_info *info = kvi_xmalloc(sizeof *info);
    bool failed = kvi_listeners_get(svc->listeners, key, info) == 0 && info->state == KVI_LISTENER_FAILED;
    if (failed) {
        snprintf(why, cap, "%s", info->last_error[0] ? info->last_error : "unknown error");
        kvi_listeners_unregister(svc->listeners, key);
    }
    free(info);
    return failed;
}

/* Whether a name from a request holds a NUL byte: names are C strings from here on (sdup would cut them). */
static bool has_nul(struct kvi_str s)
{
    return s.len > 0 && memchr(s.p, '\0', s.len) != NULL;
}

/*
 * @param undo_failed  answer 503 and keep nothing when the listener fails at
 *                     once (/register); false for --workers, whose failed
 *                     listener stays listed (and resumable) as before
 */
static int dyn_register(struct kvi_service *svc, uint64_t id, struct kvi_str model, struct kvi_str tenant,
                        uint32_t bs, uint32_t rank, struct kvi_str ep, struct kvi_str replay, bool has_replay,
                        bool undo_failed, struct kvi_api_err *err)
{
    struct svc_worker *w = worker_find(svc, id);
    if (w != NULL && (!kvi_str_eq(model, w->ns->model) || !kvi_str_eq(tenant, w->ns->tenant)))
        return kvi_dyn_err_instance_elsewhere(err, id, zstr(w->ns->model), zstr(w->ns->tenant));
    char *m = sdup(model), *t = sdup(tenant);
    int rc = 0;
    struct kvi_ns *ns = kvi_nsreg_find(svc->nsreg, m, t);
    if (ns != NULL && ns->block_size != bs) {
        rc = kvi_dyn_err_block_size(err, model, tenant, ns->block_size, bs);
        goto out;
    }
    if (w != NULL && rank_find(w, rank) != NULL) {
        rc = kvi_dyn_err_rank_taken(err, id, rank);
        goto out;
    }
    bool created = false;
    ns = ns_get(svc, m, t, bs, &created);
    if (ns == NULL) {
        rc = errno == ENOSPC ? kvi_err_too_many_models(err, svc->cfg.max_models)
                             : kvi_err_internal(err, "cannot create the namespace");
        goto out;
    }
    int64_t dense = kvi_index_intern_instance(ns->ix, id, NULL, false);
    if (dense < 0) {
        rc = kvi_err_internal(err, "cannot intern the instance");
        goto undo_ns;
    }
    char *e = sdup(ep), *r = has_replay ? sdup(replay) : NULL;
    struct kvi_listener_spec spec = {
        .ix = ns->ix,
        .instance_id = id,
        .dp_rank = rank,
        .endpoint = e,
        .replay_endpoint = r,
        .block_size = bs,
    };
    rwm_seed_spec(svc, &spec, (uint32_t)dense);
    int lrc = kvi_listeners_register(svc->listeners, &spec);
    if (lrc != 0) {
        rc = listener_err(lrc, &spec, id, err);
        free(e);
        free(r);
        goto undo_ns;
    }
    char why[KVI_LISTEN_ERR_MAX];
    struct kvi_listener_key key = {ns->ix, id, NULL, rank};
    if (undo_failed && listener_failed_at_once(svc, &key, why, sizeof why)) {
        rc = kvi_dyn_err_listener_failed(err, id, rank, why);
        free(e);
        free(r);
        goto undo_ns;
    }
    pthread_mutex_lock(&svc->mu);
    bool new_worker = w == NULL;
    if (new_worker) {
        w = worker_insert_locked(svc, id);
        w->ns = ns;
        w->dense = (uint32_t)dense;
    }
    rank_insert_locked(w, rank, e, r);
    pthread_mutex_unlock(&svc->mu);
    dyn_roster_update(svc, ns); /* Conductor queries list Dynamo instances too */
    if (spec.seed_watermark) {
        kvi_log_info("instance %" PRIu64 " dp_rank %" PRIu32 " starts after seq %" PRIu64 " (recovered)", id, rank,
                     spec.watermark);
        rwm_drop(svc, ns->ix, (uint32_t)dense, false, rank, false); /* the listener owns it now */
    }
    if (new_worker)
        ns_ref(svc, ns, +1);
    kvi_log_info("registered instance %" PRIu64 " dp_rank %" PRIu32 " for %s:%s at %s%s%s", id, rank, m, t, e,
                 r ? " replay " : "", r ? r : "");
    free(e);
    free(r);
    update_registered(svc);
    maybe_open_gate(svc);
    goto out;
undo_ns:
    if (created)
        kvi_service_ctl_ns_drop_unused(svc, ns);
out:
    if (rc != 0 && err->status >= 500) /* not the client's fault: the operator must see it */
        kvi_log_error("registration of instance %" PRIu64 " dp_rank %" PRIu32 " for %s:%s failed (%d): %s", id, rank,
                      m, t, err->status, err->msg);
    free(m);
    free(t);
    return rc;
}

int kvi_service_ctl_dyn_register(struct kvi_service *svc, const struct kvi_dyn_register *r, struct kvi_api_err *err)
{
    static const char nul[] = "invalid value: a string with a NUL character, expected a name without one";
    if (has_nul(r->model_name))
        return kvi_dyn_err_bad_name(err, "model_name", nul);
    if (has_nul(r->tenant_id))
        return kvi_dyn_err_bad_name(err, "tenant_id", nul);
    return dyn_register(svc, r->instance_id, r->model_name, r->tenant_id, r->block_size, r->dp_rank, r->endpoint,
                        r->replay_endpoint, r->has_replay, true, err);
}

static void dyn_unregister_rank(struct kvi_service *svc, struct svc_worker *w, uint32_t rank)
{
    struct kvi_listener_key key = {w->ns->ix, w->id, NULL, rank};
    kvi_listeners_unregister(svc->listeners, &key);
    submit_op(svc, KVI_OP_REMOVE_DP_RANK, w->ns, w->dense, rank);
    pthread_mutex_lock(&svc->mu);
    rank_remove_locked(w, rank);
    pthread_mutex_unlock(&svc->mu);
    dyn_roster_update(svc, w->ns);
    kvi_log_info("unregistered instance %" PRIu64 " dp_rank %" PRIu32, w->id, rank);
}

static void dyn_unregister_all(struct kvi_service *svc, struct svc_worker *w)
{
    for (size_t i = 0; i < w->n_ranks; i++) {
        struct kvi_listener_key key = {w->ns->ix, w->id, NULL, w->ranks[i].dp_rank};
        kvi_listeners_unregister(svc->listeners, &key);
    }
    struct kvi_ns *ns = w->ns;
    uint64_t id = w->id;
    submit_op(svc, KVI_OP_REMOVE_INSTANCE, ns, w->dense, 0);
    pthread_mutex_lock(&svc->mu);
    worker_remove_locked(svc, w);
    pthread_mutex_unlock(&svc->mu);
    dyn_roster_update(svc, ns); /* before the namespace can go (ns_ref below) */
    kvi_log_info("unregistered instance %" PRIu64 " (every rank) from %s:%s", id, ns->model, ns->tenant);
    ns_ref(svc, ns, -1);
    update_registered(svc);
}

int kvi_service_ctl_dyn_unregister(struct kvi_service *svc, const struct kvi_dyn_unregister *r,
                                   struct kvi_api_err *err)
{
    struct svc_worker *w = worker_find(svc, r->instance_id);
    if (w == NULL)
        return kvi_dyn_err_instance_not_found(err, r->instance_id);
    if (!kvi_str_eq(r->model_name, w->ns->model) || (r->has_tenant && !kvi_str_eq(r->tenant_id, w->ns->tenant)))
        return kvi_dyn_err_instance_other_ns(err, r->instance_id, zstr(w->ns->model), zstr(w->ns->tenant));
    if (r->has_tenant && r->has_dp_rank) {
        if (rank_find(w, r->dp_rank) == NULL)
            return kvi_dyn_err_rank_not_found(err, r->instance_id, r->dp_rank);
        if (w->n_ranks > 1) {
            dyn_unregister_rank(svc, w, r->dp_rank);
            return 0;
        }
    }
    dyn_unregister_all(svc, w);
    return 0;
}

int kvi_service_ctl_listener(struct kvi_service *svc, const struct kvi_dyn_listener_ctl *r, bool pause,
                             struct kvi_api_err *err)
{
    struct svc_worker *w = worker_find(svc, r->instance_id);
    if (w == NULL || rank_find(w, r->dp_rank) == NULL)
        return kvi_dyn_err_listener_not_found(err, r->instance_id, r->dp_rank);
    struct kvi_listener_key key = {w->ns->ix, w->id, NULL, r->dp_rank};
    int rc = pause ? kvi_listeners_pause(svc->listeners, &key) : kvi_listeners_resume(svc->listeners, &key);
    if (rc == -ENOENT)
        return kvi_dyn_err_listener_not_found(err, r->instance_id, r->dp_rank);
    if (rc == -EBUSY) {
        struct kvi_listener_info *info = kvi_xmalloc(sizeof *info);
        const char *st = "unknown";
        if (kvi_listeners_get(svc->listeners, &key, info) == 0)
            st = kvi_listener_state_name(info->state);
        rc = kvi_dyn_err_listener_state(err, r->instance_id, r->dp_rank, st, pause);
        free(info);
        return rc;
    }
    if (rc != 0) {
        kvi_log_error("%s listener of instance %" PRIu64 " dp_rank %" PRIu32 " failed: %s",
                      pause ? "pausing" : "resuming", r->instance_id, r->dp_rank, strerror(-rc));
        return kvi_err_internal(err, "listener control failed");
    }
    kvi_log_info("%s listener of instance %" PRIu64 " dp_rank %" PRIu32, pause ? "paused" : "resumed",
                 r->instance_id, r->dp_rank);
    return 0;
}

/* ---- /workers ------------------------------------------------------------------------------ */

static enum kvi_listener_status status_of(enum kvi_listener_state s)
{
    switch (s) {
    case KVI_LISTENER_PENDING: return KVI_LS_PENDING;
    case KVI_LISTENER_ACTIVE: return KVI_LS_ACTIVE;
    case KVI_LISTENER_PAUSED: return KVI_LS_PAUSED;
    default: return KVI_LS_FAILED;
    }
}

int kvi_service_encode_workers(struct kvi_service *svc, const struct kvi_dyn_workers_filter *f, struct kvi_buf *out)
{
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_listener_info *info = kvi_xmalloc(sizeof *info);
    pthread_mutex_lock(&svc->mu);
    struct kvi_worker_view *v = kvi_xcalloc(svc->n_w, sizeof *v);
    size_t n = 0;
    for (size_t i = 0; i < svc->n_w; i++) {
        struct svc_worker *w = &svc->w[i];
        if (f != NULL && f->has_model && !kvi_str_eq(f->model_name, w->ns->model))
            continue;
        if (f != NULL && f->has_tenant && !kvi_str_eq(f->tenant_id, w->ns->tenant))
            continue;
        struct kvi_listener_view *lv = kvi_scratch_alloc(&s, (w->n_ranks + 1) * sizeof *lv);
        if (lv == NULL)
            break;
        for (size_t j = 0; j < w->n_ranks; j++) {
            struct kvi_listener_key key = {w->ns->ix, w->id, NULL, w->ranks[j].dp_rank};
            lv[j] = (struct kvi_listener_view){.dp_rank = w->ranks[j].dp_rank,
                                               .endpoint = w->ranks[j].endpoint,
                                               .status = KVI_LS_FAILED,
                                               .last_error = "listener not found",
                                               .has_liveness = true}; /* 0 messages, none yet, not connected */
            if (kvi_listeners_get(svc->listeners, &key, info) == 0) {
                lv[j].status = status_of(info->state);
                lv[j].last_error = info->last_error[0]
                                       ? kvi_scratch_strdup(&s, info->last_error, strlen(info->last_error))
                                       : NULL;
                lv[j].messages = info->ctr.messages;
                lv[j].has_last_message = info->last_message_set;
                lv[j].seconds_since_last_message = info->last_message_age_ns / 1000000000u;
                lv[j].connected = (int8_t)(!info->monitored ? -1 : info->connected ? 1 : 0);
            }
        }
        v[n++] = (struct kvi_worker_view){w->id, w->ns->model, w->ns->tenant, w->ns->block_size, NULL, lv,
                                          w->n_ranks};
    }
    int rc = kvi_dyn_encode_workers(v, n, out);
    pthread_mutex_unlock(&svc->mu);
    free(v);
    free(info);
    kvi_scratch_free(&s);
    return rc;
}

/* ---- Conductor services --------------------------------------------------------------------- */

static struct svc_cond *cond_find_key(struct kvi_service *svc, struct kvi_str inst, struct kvi_str tenant,
                                      uint32_t rank)
{
    for (size_t i = 0; i < svc->n_c; i++) {
        struct svc_cond *c = &svc->c[i];
        if (c->dp_rank == rank && kvi_str_eq(inst, c->instance) && kvi_str_eq(tenant, c->tenant))
            return c;
    }
    return NULL;
}

static bool opt_eq(const char *a, struct kvi_str b)
{
    return kvi_str_eq(b, a ? a : "");
}

static const struct kvi_str *profile_field(const struct kvi_hash_profile *p, int i)
{
    switch (i) {
    case 0: return &p->strategy;
    case 1: return &p->algorithm;
    case 2: return &p->python_hash_seed;
    case 3: return &p->root_digest;
    default: return &p->index_projection;
    }
}

static bool profile_eq(const struct svc_cond *c, const struct kvi_cond_register *r)
{
    if (c->has_profile != r->has_hash_profile)
        return false;
    for (int i = 0; c->has_profile && i < 5; i++)
        if (!opt_eq(c->hp[i], *profile_field(&r->hash_profile, i)))
            return false;
    return true;
}

/* Same registration as r (re-registering it is a no-op). */
static bool cond_same(const struct svc_cond *c, const struct kvi_cond_register *r)
{
    return c->type == r->type && c->block_size == r->block_size && kvi_str_eq(r->model_name, c->model) &&
           kvi_str_eq(r->lora_name, c->lora) && kvi_str_eq(r->endpoint, c->endpoint) &&
           kvi_str_eq(r->replay_endpoint, c->replay) && kvi_str_eq(r->additional_salt, c->salt) &&
           c->has_cache_group == r->has_cache_group && profile_eq(c, r);
}

static bool same_context(const struct svc_cond *c, struct kvi_str model, struct kvi_str tenant, struct kvi_str lora,
                         uint32_t bs)
{
    return c->block_size == bs && kvi_str_eq(model, c->model) && kvi_str_eq(tenant, c->tenant) &&
           kvi_str_eq(lora, c->lora);
}

static void cond_view_free(struct cond_view *v)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < v->n; i++) {
        struct kvi_svc_cond_ctx *x = &v->ctx[i];
        for (size_t j = 0; j < x->n_inst; j++) {
            free((char *)x->inst[j].name);
            free((uint32_t *)x->inst[j].ranks);
        }
        free((struct kvi_svc_cond_inst *)x->inst);
        free((char *)x->model);
        free((char *)x->tenant);
        free((char *)x->lora);
    }
    free(v->ctx);
    free(v);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_inst(const void *a, const void *b)
{
    return strcmp(((const struct kvi_svc_cond_inst *)a)->name, ((const struct kvi_svc_cond_inst *)b)->name);
}

/* Free after a grace period (control thread). */
static void svc_retire(struct kvi_service *svc, void *p, bool view)
{
    if (p == NULL)
        return;
    if (svc->n_retired == svc->cap_retired) {
        svc->cap_retired = svc->cap_retired ? svc->cap_retired * 2 : 16;
        svc->retired = kvi_xrealloc(svc->retired, svc->cap_retired * sizeof *svc->retired);
    }
    svc->retired[svc->n_retired++] = (struct svc_retired){p, view};
}

/* Wait for one grace period, then free what was retired (control thread, or
 * destroy with no reader left). */
static void svc_reclaim(struct kvi_service *svc)
{
    if (svc->n_retired == 0)
        return;
    kvi_rcu_synchronize();
    for (size_t i = 0; i < svc->n_retired; i++) {
        if (svc->retired[i].view)
            cond_view_free(svc->retired[i].p);
        else
            free(svc->retired[i].p);
    }
    svc->n_retired = 0;
}

/* The Dynamo roster of ns now, built from the workers table (control
 * thread): NULL when ns has no Dynamo instance. Linear in the workers. */
static struct dyn_roster *dyn_roster_build(const struct kvi_service *svc, struct kvi_ns *ns)
{
    size_t n = 0, n_ranks = 0;
    for (size_t i = 0; i < svc->n_w; i++)
        if (svc->w[i].ns == ns && svc->w[i].n_ranks > 0) {
            n++;
            n_ranks += svc->w[i].n_ranks;
        }
    if (n == 0)
        return NULL;
    typedef char name_t[24];
    struct dyn_roster *r =
        kvi_xmalloc(sizeof *r + n * (sizeof(struct kvi_svc_cond_inst) + sizeof(name_t)) + n_ranks * sizeof(uint32_t));
    r->ns = ns;
    r->n = n;
    r->inst = (struct kvi_svc_cond_inst *)(r + 1);
    name_t *names = (name_t *)(r->inst + n);
    uint32_t *ranks = (uint32_t *)(names + n);
    size_t k = 0;
    for (size_t i = 0; i < svc->n_w; i++) { /* workers are sorted by id */
        const struct svc_worker *w = &svc->w[i];
        if (w->ns != ns || w->n_ranks == 0)
            continue;
        snprintf(names[k], sizeof names[k], "%" PRIu64, w->id);
        r->inst[k] = (struct kvi_svc_cond_inst){names[k], w->dense, (uint32_t)w->n_ranks, ranks};
        for (size_t j = 0; j < w->n_ranks; j++) /* ascending */
            *ranks++ = w->ranks[j].dp_rank;
        k++;
    }
    return r;
}

/* The Dynamo registrations of ns changed (control thread): rebuild its
 * roster, publish a view that uses it, retire the old ones. */
static void dyn_roster_update(struct kvi_service *svc, struct kvi_ns *ns)
{
    struct dyn_roster *r = dyn_roster_build(svc, ns);
    size_t i = 0;
    while (i < svc->n_dyn && svc->dyn[i]->ns != ns)
        i++;
    if (i < svc->n_dyn) {
        svc_retire(svc, svc->dyn[i], false);
        if (r != NULL)
            svc->dyn[i] = r;
        else
            svc->dyn[i] = svc->dyn[--svc->n_dyn];
    } else if (r != NULL) {
        if (svc->n_dyn == svc->cap_dyn) {
            svc->cap_dyn = svc->cap_dyn ? svc->cap_dyn * 2 : 8;
            svc->dyn = kvi_xrealloc(svc->dyn, svc->cap_dyn * sizeof *svc->dyn);
        }
        svc->dyn[svc->n_dyn++] = r;
    }
    cond_view_publish(svc);
}

static const struct dyn_roster *dyn_roster_of(const struct kvi_service *svc, const struct kvi_ns *ns)
{
    for (size_t i = 0; i < svc->n_dyn; i++)
        if (svc->dyn[i]->ns == ns)
            return svc->dyn[i];
    return NULL;
}

/* Build the roster from both tables (control thread) and publish it; the old
 * view is freed after a grace period. A Conductor context (model, tenant,
 * lora, block size) lists its Conductor instances and the Dynamo roster of
 * its namespace (same model, tenant and block size: Dynamo registrations
 * carry no adapter, their events name it). Each namespace with Dynamo
 * instances also gets an any-adapter context (lora NULL) for queries whose
 * adapter no Conductor registration names. Linear in the Conductor
 * registrations per context, plus one entry per namespace. */
static void cond_view_publish(struct kvi_service *svc)
{
    struct cond_view *v = kvi_xcalloc(1, sizeof *v);
    size_t cap = svc->n_c + svc->n_dyn;
    v->ctx = kvi_xcalloc(cap ? cap : 1, sizeof *v->ctx);
    for (size_t i = 0; i < svc->n_c; i++) {
        const struct svc_cond *c = &svc->c[i];
        struct kvi_svc_cond_ctx *x = NULL;
        for (size_t k = 0; k < v->n && x == NULL; k++) {
            struct kvi_svc_cond_ctx *y = &v->ctx[k];
            if (y->block_size == c->block_size && !strcmp(y->model, c->model) && !strcmp(y->tenant, c->tenant) &&
                !strcmp(y->lora, c->lora))
                x = y;
        }
        if (x == NULL) {
            x = &v->ctx[v->n++];
            x->model = xstrdup(c->model);
            x->tenant = xstrdup(c->tenant);
            x->lora = xstrdup(c->lora);
            x->block_size = c->block_size;
            x->ns = c->ns;
            x->inst = kvi_xcalloc(svc->n_c, sizeof *x->inst);
        }
        if (c->type == KVI_COND_MOONCAKE)
            continue; /* a storage pool, not a query target */
        struct kvi_svc_cond_inst *in = NULL;
        for (size_t k = 0; k < x->n_inst && in == NULL; k++)
            if (!strcmp(x->inst[k].name, c->instance))
                in = (struct kvi_svc_cond_inst *)&x->inst[k];
        if (in == NULL) {
            in = (struct kvi_svc_cond_inst *)&x->inst[x->n_inst++];
            in->name = xstrdup(c->instance);
            in->dense = c->dense;
            in->ranks = kvi_xcalloc(svc->n_c, sizeof(uint32_t));
        }
        ((uint32_t *)in->ranks)[in->n_ranks++] = c->dp_rank;
    }
    for (size_t k = 0; k < v->n; k++) {
        struct kvi_svc_cond_ctx *x = &v->ctx[k];
        for (size_t j = 0; j < x->n_inst; j++)
            qsort((uint32_t *)x->inst[j].ranks, x->inst[j].n_ranks, sizeof(uint32_t), cmp_u32);
        qsort((struct kvi_svc_cond_inst *)x->inst, x->n_inst, sizeof *x->inst, cmp_inst);
        const struct dyn_roster *r = dyn_roster_of(svc, x->ns);
        if (r != NULL) {
            x->dyn = r->inst;
            x->n_dyn = r->n;
        }
    }
    for (size_t i = 0; i < svc->n_dyn; i++) {
        const struct dyn_roster *r = svc->dyn[i];
        struct kvi_svc_cond_ctx *x = &v->ctx[v->n++];
        x->model = xstrdup(r->ns->model);
        x->tenant = xstrdup(r->ns->tenant);
        x->lora = NULL;
        x->block_size = r->ns->block_size;
        x->ns = r->ns;
        x->dyn = r->inst;
        x->n_dyn = r->n;
    }
    struct cond_view *old = atomic_load(&svc->cview);
    kvi_rcu_assign(svc->cview, v);
    svc_retire(svc, old, true);
}

const struct kvi_svc_cond_ctx *kvi_service_cond_find(const struct kvi_service *svc, struct kvi_str model,
                                                     struct kvi_str tenant, struct kvi_str lora, uint32_t block_size)
{
    struct cond_view *v = kvi_rcu_deref(((struct kvi_service *)svc)->cview);
    if (v == NULL)
        return NULL;
    const struct kvi_svc_cond_ctx *any = NULL;
    for (size_t i = 0; i < v->n; i++) {
        const struct kvi_svc_cond_ctx *x = &v->ctx[i];
        if (x->block_size != block_size || !kvi_str_eq(model, x->model) || !kvi_str_eq(tenant, x->tenant))
            continue;
        if (x->lora == NULL)
            any = x;
        else if (kvi_str_eq(lora, x->lora))
            return x;
    }
    return any;
}

const struct kvi_svc_cond_inst *kvi_service_cond_inst_find(const struct kvi_svc_cond_ctx *x, const char *name)
{
    size_t lo = 0, hi = x->n_inst;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(x->inst[mid].name, name);
        if (c == 0)
            return &x->inst[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The namespace of a Conductor context: (model, tenant) when free or of the same
 * block size, else ("<model>#bs=<N>", tenant). */
static struct kvi_ns *cond_ns(struct kvi_service *svc, const char *model, const char *tenant, uint32_t bs,
                              bool *created)
{
    struct kvi_ns *ns = kvi_nsreg_find(svc->nsreg, model, tenant);
    if (ns == NULL || ns->block_size == bs)
        return ns_get(svc, model, tenant, bs, created);
    size_t n = strlen(model) + 24;
    char *key = kvi_xmalloc(n);
    snprintf(key, n, "%s#bs=%" PRIu32, model, bs);
    ns = ns_get(svc, key, tenant, bs, created);
    free(key);
    return ns;
}

int kvi_service_ctl_cond_register(struct kvi_service *svc, const struct kvi_cond_register *r, struct kvi_api_err *err)
{
    /* A Mooncake storage master may come without an instance id: it is named by its endpoint. */
    struct kvi_str inst = r->has_instance ? r->instance_id : r->endpoint;
    static const char *const names[] = {"modelname", "tenant_id", "instance_id", "lora_name"};
    const struct kvi_str vals[] = {r->model_name, r->tenant_id, r->has_instance ? r->instance_id : (struct kvi_str){0},
                                   r->lora_name};
    for (size_t i = 0; i < KVI_ARRAY_LEN(names); i++) {
        if (!has_nul(vals[i]))
            continue;
        err->status = 400; /* the parser's own shape for a bad field (§2.8) */
        err->reason = "invalid_value";
        snprintf(err->_field, sizeof err->_field, "%s", names[i]);
        err->field = err->_field;
        err->index = -1;
        snprintf(err->msg, sizeof err->msg, "%s must not contain a NUL character", names[i]);
        return -EINVAL;
    }
    struct svc_cond *old = cond_find_key(svc, inst, r->tenant_id, r->dp_rank);
    if (old != NULL) {
        if (cond_same(old, r))
            return 0;
        return kvi_cond_err_conflict(err, inst, r->tenant_id, r->dp_rank);
    }
    for (size_t i = 0; i < svc->n_c; i++) {
        const struct svc_cond *c = &svc->c[i];
        if (kvi_str_eq(r->endpoint, c->endpoint))
            return kvi_cond_err_endpoint_taken(err, r->endpoint);
        if (r->has_hash_profile && c->has_profile &&
            same_context(c, r->model_name, r->tenant_id, r->lora_name, r->block_size) && !profile_eq(c, r))
            return kvi_cond_err_hash_profile(err, r->model_name);
    }
    struct svc_cond c = {0};
    c.instance = sdup(inst);
    c.tenant = sdup(r->tenant_id);
    c.dp_rank = r->dp_rank;
    c.model = sdup(r->model_name);
    c.lora = sdup(r->lora_name);
    c.block_size = r->block_size;
    c.type = r->type;
    c.endpoint = sdup(r->endpoint);
    c.replay = sdup(r->replay_endpoint);
    c.salt = sdup(r->additional_salt);
    c.has_cache_group = r->has_cache_group;
    c.has_profile = r->has_hash_profile;
    for (int i = 0; c.has_profile && i < 5; i++)
        c.hp[i] = sdup(*profile_field(&r->hash_profile, i));

    bool created = false;
    int rc = 0;
    c.ns = cond_ns(svc, c.model, c.tenant, c.block_size, &created);
    if (c.ns == NULL) {
        rc = errno == ENOSPC ? kvi_err_too_many_models(err, svc->cfg.max_models)
                             : kvi_err_internal(err, "cannot create the namespace");
        goto fail;
    }
    int64_t dense = kvi_index_intern_instance(c.ns->ix, 0, c.instance, c.type == KVI_COND_MOONCAKE);
    if (dense < 0) {
        rc = kvi_err_internal(err, "cannot intern the instance");
        goto fail_ns;
    }
    c.dense = (uint32_t)dense;
    struct kvi_listener_spec spec = {
        .ix = c.ns->ix,
        .instance_name = c.instance,
        .dp_rank = c.dp_rank,
        .endpoint = c.endpoint,
        .replay_endpoint = c.replay[0] ? c.replay : NULL,
        .block_size = c.block_size,
    };
    rwm_seed_spec(svc, &spec, c.dense);
    int lrc = kvi_listeners_register(svc->listeners, &spec);
    char failed[KVI_LISTEN_ERR_MAX];
    struct kvi_listener_key key = {c.ns->ix, 0, c.instance, c.dp_rank};
    if (lrc == 0 && listener_failed_at_once(svc, &key, failed, sizeof failed)) {
        /* Conductor's answer when its ZMQ client cannot start (http-api.md §2): 500 text */
        rc = kvi_err_internal(err, "");
        snprintf(err->msg, sizeof err->msg, "Failed to subscribe: failed to start ZMQ client: %s", failed);
        goto fail_ns;
    }
    if (lrc != 0) {
        if (lrc == -EEXIST) {
            rc = kvi_cond_err_conflict(err, inst, r->tenant_id, r->dp_rank);
        } else if (lrc == -EINVAL) {
            char why[256] = "invalid registration";
            kvi_listeners_validate(&spec, why, sizeof why);
            rc = kvi_err_internal(err, "");
            err->status = 500;
            snprintf(err->msg, sizeof err->msg, "Failed to subscribe: failed to start ZMQ client: %s", why);
        } else {
            rc = kvi_err_internal(err, "Failed to subscribe: failed to start ZMQ client");
        }
        goto fail_ns;
    }
    pthread_mutex_lock(&svc->mu);
    if (svc->n_c == svc->cap_c) {
        svc->cap_c = svc->cap_c ? svc->cap_c * 2 : 16;
        svc->c = kvi_xrealloc(svc->c, svc->cap_c * sizeof *svc->c);
    }
    svc->c[svc->n_c++] = c;
    pthread_mutex_unlock(&svc->mu);
    if (spec.seed_watermark)
        rwm_drop(svc, c.ns->ix, c.dense, false, c.dp_rank, false); /* the listener owns it now */
    ns_ref(svc, c.ns, +1);
    cond_view_publish(svc);
    kvi_log_info("registered %s service %s|%s|%" PRIu32 " for model %s lora '%s' block_size %" PRIu32 " at %s",
                 kvi_cond_type_name(c.type), c.instance, c.tenant, c.dp_rank, c.model, c.lora, c.block_size,
                 c.endpoint);
    update_registered(svc);
    maybe_open_gate(svc);
    return 0;
fail_ns:
    if (created)
        kvi_service_ctl_ns_drop_unused(svc, c.ns);
fail:
    if (err->status >= 500) /* not the client's fault: the operator must see it */
        kvi_log_error("registration of %s|%s|%" PRIu32 " for model %s failed (%d): %s", c.instance, c.tenant,
                      c.dp_rank, c.model, err->status, err->msg);
    free_cond(&c);
    return rc;
}

int kvi_service_ctl_cond_unregister(struct kvi_service *svc, const struct kvi_cond_unregister *r,
                                    struct kvi_cond_key *removed, struct kvi_api_err *err)
{
    struct svc_cond *c = cond_find_key(svc, r->instance_id, r->tenant_id, r->dp_rank);
    if (c == NULL)
        return kvi_cond_err_service_not_found(err, r->instance_id, r->tenant_id, r->dp_rank);
    struct kvi_listener_key key = {c->ns->ix, 0, c->instance, c->dp_rank};
    kvi_listeners_unregister(svc->listeners, &key);
    bool other_rank = false;
    for (size_t i = 0; i < svc->n_c; i++)
        other_rank |= &svc->c[i] != c && svc->c[i].ns == c->ns && !strcmp(svc->c[i].instance, c->instance);
    submit_op(svc, other_rank ? KVI_OP_REMOVE_DP_RANK : KVI_OP_REMOVE_INSTANCE, c->ns, c->dense, c->dp_rank);
    kvi_log_info("unregistered service %s|%s|%" PRIu32, c->instance, c->tenant, c->dp_rank);
    struct kvi_ns *ns = c->ns;
    pthread_mutex_lock(&svc->mu);
    free_cond(c);
    *c = svc->c[--svc->n_c];
    pthread_mutex_unlock(&svc->mu);
    cond_view_publish(svc);
    ns_ref(svc, ns, -1);
    update_registered(svc);
    *removed = (struct kvi_cond_key){r->instance_id, r->tenant_id, r->dp_rank};
    return 0;
}

static void hp_view(const struct svc_cond *c, struct kvi_hash_profile *hp)
{
    memset(hp, 0, sizeof *hp);
    if (!c->has_profile)
        return;
    for (int i = 0; i < 5; i++)
        *(struct kvi_str *)profile_field(hp, i) = zstr(c->hp[i]);
}

static int cmp_service_view(const void *a, const void *b)
{
    const struct kvi_cond_service_view *x = a, *y = b;
    int r = strcmp(x->instance_id, y->instance_id);
    if (r == 0)
        r = strcmp(x->tenant_id, y->tenant_id);
    if (r == 0)
        r = x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
    return r;
}

/* One row per Conductor registration and per rank of a Dynamo instance (named
 * by its decimal id, type vLLM, no adapter, CacheGroup null, empty profile). */
int kvi_service_encode_services(struct kvi_service *svc, enum kvi_body_enc enc, struct kvi_buf *out)
{
    pthread_mutex_lock(&svc->mu);
    size_t n = svc->n_c, n_dyn = 0;
    for (size_t i = 0; i < svc->n_w; i++)
        n_dyn += svc->w[i].n_ranks;
    struct kvi_cond_service_view *v = kvi_xcalloc(n + n_dyn + 1, sizeof *v);
    struct kvi_hash_profile *hp = kvi_xcalloc(n + 1, sizeof *hp);
    char(*ids)[24] = kvi_xcalloc(svc->n_w + 1, sizeof *ids);
    for (size_t i = 0; i < svc->n_c; i++) {
        const struct svc_cond *c = &svc->c[i];
        hp_view(c, &hp[i]);
        v[i] = (struct kvi_cond_service_view){c->endpoint, c->replay, c->type, c->model, c->lora, c->tenant,
                                              c->instance, c->block_size, c->dp_rank, c->has_cache_group, 0,
                                              c->has_profile ? &hp[i] : NULL};
    }
    for (size_t i = 0; i < svc->n_w; i++) {
        const struct svc_worker *w = &svc->w[i];
        snprintf(ids[i], sizeof ids[i], "%" PRIu64, w->id);
        for (size_t r = 0; r < w->n_ranks; r++)
            v[n++] = (struct kvi_cond_service_view){w->ranks[r].endpoint,
                                                    w->ranks[r].replay ? w->ranks[r].replay : "",
                                                    KVI_COND_VLLM,
                                                    w->ns->model,
                                                    "",
                                                    w->ns->tenant,
                                                    ids[i],
                                                    w->ns->block_size,
                                                    w->ranks[r].dp_rank,
                                                    false,
                                                    0,
                                                    NULL};
    }
    qsort(v, n, sizeof *v, cmp_service_view);
    int rc = kvi_cond_encode_services(v, n, enc, out);
    pthread_mutex_unlock(&svc->mu);
    free(v);
    free(hp);
    free(ids);
    return rc;
}

/* An any-adapter context that a Conductor context with no adapter of the same
 * (model, tenant, block size) already shows in /global_view. */
static bool any_ctx_shadowed(const struct cond_view *v, const struct kvi_svc_cond_ctx *x)
{
    for (size_t k = 0; x->lora == NULL && k < v->n; k++) {
        const struct kvi_svc_cond_ctx *y = &v->ctx[k];
        if (y->lora != NULL && y->lora[0] == '\0' && y->block_size == x->block_size && !strcmp(y->model, x->model) &&
            !strcmp(y->tenant, x->tenant))
            return true;
    }
    return false;
}

int kvi_service_encode_global_view(struct kvi_service *svc, enum kvi_body_enc enc, struct kvi_buf *out)
{
    /* The roster is RCU-published; read it in a section (loop threads are readers). */
    kvi_rcu_read_lock();
    struct cond_view *v = kvi_rcu_deref(svc->cview);
    size_t n_all = v ? v->n : 0, n = 0;
    struct kvi_cond_context_view *cv = kvi_xcalloc(n_all ? n_all : 1, sizeof *cv);
    struct kvi_hash_profile *hp = kvi_xcalloc(n_all ? n_all : 1, sizeof *hp);
    struct kvi_cond_instance_view **iv = kvi_xcalloc(n_all ? n_all : 1, sizeof *iv);
    pthread_mutex_lock(&svc->mu);
    for (size_t i = 0; i < n_all; i++) {
        const struct kvi_svc_cond_ctx *x = &v->ctx[i];
        if (any_ctx_shadowed(v, x))
            continue;
        const char *lora = x->lora ? x->lora : ""; /* Dynamo instances: no adapter */
        struct kvi_index_stats st;
        kvi_index_stats(x->ns->ix, &st);
        const struct kvi_hash_profile *pp = NULL;
        for (size_t k = 0; k < svc->n_c && pp == NULL; k++) {
            const struct svc_cond *c = &svc->c[k];
            if (c->has_profile && same_context(c, zstr(x->model), zstr(x->tenant), zstr(lora), x->block_size)) {
                hp_view(c, &hp[n]);
                pp = &hp[n];
            }
        }
        iv[n] = kvi_xcalloc(x->n_inst + x->n_dyn + 1, sizeof **iv);
        size_t ni = 0;
        for (size_t j = 0; j < x->n_inst; j++)
            iv[n][ni++] = (struct kvi_cond_instance_view){x->inst[j].name, x->inst[j].ranks, x->inst[j].n_ranks};
        for (size_t j = 0; j < x->n_dyn; j++)
            if (kvi_service_cond_inst_find(x, x->dyn[j].name) == NULL)
                iv[n][ni++] = (struct kvi_cond_instance_view){x->dyn[j].name, x->dyn[j].ranks, x->dyn[j].n_ranks};
        cv[n] = (struct kvi_cond_context_view){x->model, lora, x->tenant, x->block_size, st.entries, pp, iv[n], ni};
        n++;
    }
    int rc = kvi_cond_encode_global_view(cv, n, enc, out);
    pthread_mutex_unlock(&svc->mu);
    kvi_rcu_read_unlock();
    for (size_t i = 0; i < n; i++)
        free(iv[i]);
    free(iv);
    free(cv);
    free(hp);
    return rc;
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
    for (size_t i = 0; i < svc->cfg.n_workers && !kvi_service_stopping(svc); i++) {
        const struct kvi_worker_spec *ws = &svc->workers[i];
        struct kvi_api_err err;
        struct kvi_str none = {NULL, 0};
        if (dyn_register(svc, ws->instance_id, zstr(svc->model_name), zstr(svc->tenant_id), svc->cfg.block_size,
                         ws->dp_rank, zstr(ws->endpoint), none, false, false, &err) != 0)
            kvi_log_error("--workers entry %" PRIu64 ":%" PRIu32 "=%s: %s", ws->instance_id, ws->dp_rank,
                          ws->endpoint, err.msg);
    }
    /* the registrations above left the gate shut (maybe_open_gate), so that
     * /ready never answers ready with --workers entries still to come */
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
        maybe_open_gate(svc);
        atomic_store(&svc->recovery_result, (int)res);
    }
    if (svc->cfg.min_initial_workers > 0 && atomic_load(&svc->registered) < svc->cfg.min_initial_workers)
        kvi_log_info("waiting for %" PRIu64 " initial instance(s) to register (DYN_ROUTER_MIN_INITIAL_WORKERS)",
                     svc->cfg.min_initial_workers);
    maybe_open_gate(svc);
}
