/*
 * The service's Dynamo workers table: registrations (POST /register, the
 * startup's --workers), unregistrations, listener pause / resume and the
 * GET /workers body.
 *
 * DESIGN (the whole service: api/service.h)
 *   One entry per instance (svc_worker, sorted by id), one listener per rank.
 *   Mutations run on the control thread, which reads the table without a
 *   lock and writes it under `mu`. Each registration or unregistration
 *   rebuilds the namespace's Dynamo roster and publishes a new query roster
 *   (kvi_svc__dyn_roster_update, api/service_roster.c); a new instance takes
 *   a reference on its namespace and a removed one drops it
 *   (api/service_ns.c); registrations and removed instances update readiness
 *   (api/service.c). kvi_service_encode_workers runs on any thread and reads
 *   the table under `mu`.
 */
#include "api/service_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "net/log.h"

/* ---- Dynamo workers ------------------------------------------------------------------------ */

void kvi_svc__free_worker(struct svc_worker *w)
{
    for (size_t i = 0; i < w->n_ranks; i++) {
        free(w->ranks[i].endpoint);
        free(w->ranks[i].replay);
    }
    free(w->ranks);
}

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
    w->ranks[at] = (struct svc_rank){rank, xstrdup(ep), replay ? xstrdup(replay) : NULL, 0};
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
    kvi_svc__free_worker(w);
    memmove(&svc->w[i], &svc->w[i + 1], (svc->n_w - i - 1) * sizeof *svc->w);
    svc->n_w--;
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

/* Contract: api/service_internal.h. */
int kvi_svc__dyn_register(struct kvi_service *svc, uint64_t id, struct kvi_str model, struct kvi_str tenant,
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
    ns = kvi_svc__ns_get(svc, m, t, bs, &created);
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
    kvi_svc__rwm_seed_spec(svc, &spec, (uint32_t)dense);
    kvi_svc__bridge_spec(svc, &spec, ns->model, ns->tenant);
    int lrc = kvi_listeners_register(svc->listeners, &spec);
    if (lrc != 0) {
        rc = listener_err(lrc, &spec, id, err);
        free(e);
        free(r);
        goto undo_ns;
    }
    char why[KVI_LISTEN_ERR_MAX];
    struct kvi_listener_key key = {ns->ix, id, NULL, rank};
    if (undo_failed && kvi_svc__listener_failed_at_once(svc, &key, why, sizeof why)) {
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
    kvi_svc__dyn_roster_update(svc, ns); /* Conductor queries list Dynamo instances too */
    if (spec.seed_watermark) {
        kvi_log_info("instance %" PRIu64 " dp_rank %" PRIu32 " starts after seq %" PRIu64 " (recovered)", id, rank,
                     spec.watermark);
        kvi_svc__rwm_drop(svc, ns->ix, (uint32_t)dense, false, rank, false); /* the listener owns it now */
    }
    if (new_worker)
        kvi_svc__ns_ref(svc, ns, +1);
    kvi_log_info("registered instance %" PRIu64 " dp_rank %" PRIu32 " for %s:%s at %s%s%s", id, rank, m, t, e,
                 r ? " replay " : "", r ? r : "");
    free(e);
    free(r);
    kvi_svc__update_registered(svc);
    kvi_svc__maybe_open_gate(svc);
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
    int rc = kvi_svc__dyn_register(svc, r->instance_id, r->model_name, r->tenant_id, r->block_size, r->dp_rank,
                                   r->endpoint, r->replay_endpoint, r->has_replay, true, err);
    int prc = rc == 0 && kvi_svc__registry_on(svc) ? kvi_svc__registry_put_dyn(svc, r) : 0;
    if (prc != 0) {
        /* not shared with the fleet: undone here too, so every replica agrees (api/service_registry.c) */
        kvi_svc__dyn_drop_rank(svc, r->instance_id, r->dp_rank);
        if (prc == -EEXIST) /* registered through another replica meanwhile */
            return kvi_dyn_err_rank_taken(err, r->instance_id, r->dp_rank);
        return kvi_dyn_err_nats(err, 503, "the registration could not be stored in the --nats-registry bucket "
                                          "(NATS unreachable?); nothing was registered");
    }
    if (rc == 0 && r->has_capacity)
        kvi_svc__dyn_capacity(svc, r->instance_id, r->dp_rank, r->capacity_blocks);
    return rc;
}

void kvi_svc__dyn_capacity(struct kvi_service *svc, uint64_t id, uint32_t rank, uint64_t capacity)
{
    struct svc_worker *w = worker_find(svc, id);
    struct svc_rank *rk = w != NULL ? rank_find(w, rank) : NULL;
    if (rk != NULL)
        kvi_svc__capacity_register(svc, w, rk, capacity);
}

static void dyn_unregister_rank(struct kvi_service *svc, struct svc_worker *w, uint32_t rank)
{
    struct kvi_listener_key key = {w->ns->ix, w->id, NULL, rank};
    kvi_listeners_unregister(svc->listeners, &key);
    kvi_svc__submit_op(svc, KVI_OP_REMOVE_DP_RANK, w->ns, w->dense, rank);
    bool had_capacity = rank_find(w, rank)->capacity > 0;
    pthread_mutex_lock(&svc->mu);
    rank_remove_locked(w, rank);
    pthread_mutex_unlock(&svc->mu);
    if (had_capacity)
        kvi_svc__capacity_forget(svc, w->ns, w->dense);
    kvi_svc__dyn_roster_update(svc, w->ns);
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
    uint32_t dense = w->dense;
    bool had_capacity = false;
    for (size_t i = 0; i < w->n_ranks; i++)
        had_capacity |= w->ranks[i].capacity > 0;
    kvi_svc__submit_op(svc, KVI_OP_REMOVE_INSTANCE, ns, dense, 0);
    pthread_mutex_lock(&svc->mu);
    worker_remove_locked(svc, w);
    pthread_mutex_unlock(&svc->mu);
    if (had_capacity)
        kvi_svc__capacity_forget(svc, ns, dense);
    kvi_svc__dyn_roster_update(svc, ns); /* before the namespace can go (kvi_svc__ns_ref below) */
    kvi_log_info("unregistered instance %" PRIu64 " (every rank) from %s:%s", id, ns->model, ns->tenant);
    kvi_svc__ns_ref(svc, ns, -1);
    kvi_svc__update_registered(svc);
}

int kvi_service_ctl_dyn_unregister(struct kvi_service *svc, const struct kvi_dyn_unregister *r,
                                   struct kvi_api_err *err)
{
    struct svc_worker *w = worker_find(svc, r->instance_id);
    if (w == NULL) {
        /* a worker that came with its events over NATS (api/service_nats.c) */
        if (kvi_svc__nats_unregister(svc, r->instance_id, r->model_name, r->tenant_id, r->has_tenant) == 0)
            return 0;
        return kvi_dyn_err_instance_not_found(err, r->instance_id);
    }
    if (!kvi_str_eq(r->model_name, w->ns->model) || (r->has_tenant && !kvi_str_eq(r->tenant_id, w->ns->tenant)))
        return kvi_dyn_err_instance_other_ns(err, r->instance_id, zstr(w->ns->model), zstr(w->ns->tenant));
    bool one = r->has_tenant && r->has_dp_rank;
    if (one && rank_find(w, r->dp_rank) == NULL)
        return kvi_dyn_err_rank_not_found(err, r->instance_id, r->dp_rank);
    if (kvi_svc__registry_on(svc)) {
        /* the fleet's keys go first: a failure changes nothing anywhere (api/service_registry.c) */
        struct kvi_str m = {w->ns->model, strlen(w->ns->model)}, t = {w->ns->tenant, strlen(w->ns->tenant)};
        for (size_t i = 0; i < w->n_ranks; i++)
            if ((!one || w->ranks[i].dp_rank == r->dp_rank) &&
                kvi_svc__registry_del_dyn(svc, m, t, w->id, w->ranks[i].dp_rank) != 0)
                return kvi_dyn_err_nats(err, 503, "the unregistration could not be stored in the --nats-registry "
                                                  "bucket (NATS unreachable?)");
    }
    if (one && w->n_ranks > 1) {
        dyn_unregister_rank(svc, w, r->dp_rank);
        return 0;
    }
    dyn_unregister_all(svc, w);
    return 0;
}

const char *kvi_svc__dyn_held(struct kvi_service *svc, uint64_t id, struct kvi_str model, struct kvi_str tenant,
                              uint32_t rank)
{
    struct svc_worker *w = worker_find(svc, id);
    if (w == NULL || !kvi_str_eq(model, w->ns->model) || !kvi_str_eq(tenant, w->ns->tenant))
        return NULL;
    struct svc_rank *rk = rank_find(w, rank);
    return rk != NULL ? rk->endpoint : NULL;
}

void kvi_svc__dyn_drop_rank(struct kvi_service *svc, uint64_t id, uint32_t rank)
{
    struct svc_worker *w = worker_find(svc, id);
    if (w == NULL || rank_find(w, rank) == NULL)
        return;
    if (w->n_ranks > 1)
        dyn_unregister_rank(svc, w, rank);
    else
        dyn_unregister_all(svc, w);
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
                                               .capacity_blocks = w->ranks[j].capacity,
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
                                          w->n_ranks, NULL};
    }
    struct kvi_worker_view *nv = NULL;
    size_t nn = kvi_svc__nats_worker_views(svc, f, &s, &nv);
    if (nn > 0) {
        v = kvi_xrealloc(v, (n + nn) * sizeof *v);
        memcpy(v + n, nv, nn * sizeof *v);
        n += nn;
    }
    free(nv);
    nn = kvi_svc__zbind_worker_views(svc, f, &s, &nv);
    if (nn > 0) {
        v = kvi_xrealloc(v, (n + nn) * sizeof *v);
        memcpy(v + n, nv, nn * sizeof *v);
        n += nn;
    }
    free(nv);
    int rc = kvi_dyn_encode_workers(v, n, out);
    pthread_mutex_unlock(&svc->mu);
    free(v);
    free(info);
    kvi_scratch_free(&s);
    return rc;
}
