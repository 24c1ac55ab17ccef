/*
 * The service's namespaces and the per-key state both registration dialects
 * and recovery share: namespace records (creation under --max-models,
 * reference counts, deletion), the watermarks recovered from a peer for keys
 * not registered yet, the removal ops of an unregistration, and the check
 * for a listener that failed while it was set up.
 *
 * DESIGN (the whole service: api/service.h)
 *   Control thread only: it is the only thread that adds or deletes
 *   namespaces, records and watermarks, so it reads them without a lock. The
 *   namespace records are also read by kvi_service_counts (any thread), so
 *   the control thread writes them under `mu`; the watermarks (`rwm`) are its
 *   own. A namespace is deleted (ns_delete) outside any RCU read section:
 *   kvi_nsreg_unlink waits for a grace period, the writers forget it through
 *   the control thread's producer, and it is freed at once or by the last
 *   dump that pins it (kvi_dump_pool_defer_free).
 */
#include "api/service_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/dump_pool.h"
#include "engine/common.h"
#include "net/log.h"

/* ---- namespace records (control thread) ------------------------------------------------- */

static struct svc_nsrec *nsrec_find(struct kvi_service *svc, const struct kvi_ns *ns)
{
    for (size_t i = 0; i < svc->n_nsr; i++)
        if (svc->nsr[i].ns == ns)
            return &svc->nsr[i];
    return NULL;
}

struct kvi_ns *kvi_svc__ns_get(struct kvi_service *svc, const char *model, const char *tenant, uint32_t bs,
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
static void ns_delete(struct kvi_service *svc, struct kvi_ns *ns)
{
    kvi_svc__rwm_drop(svc, ns->ix, 0, true, 0, true);
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

void kvi_svc__ns_ref(struct kvi_service *svc, struct kvi_ns *ns, int delta)
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
    struct kvi_ns *ns = kvi_svc__ns_get(svc, model, tenant, block_size, created);
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

/* ---- recovered watermarks (control thread) ---------------------------------------------- */

/* Drop the entries of (ix, dense, rank); any instance when all_inst, any rank when all_ranks. */
void kvi_svc__rwm_drop(struct kvi_service *svc, const struct kvi_index *ix, uint32_t dense, bool all_inst,
                       uint32_t rank, bool all_ranks)
{
    for (size_t i = svc->n_rwm; i-- > 0;) {
        const struct svc_rwm *e = &svc->rwm[i];
        if (e->ix == ix && (all_inst || e->dense == dense) && (all_ranks || e->dp_rank == rank))
            svc->rwm[i] = svc->rwm[--svc->n_rwm];
    }
}

/* The recovered watermark of a key about to be registered: seeds its spec. */
void kvi_svc__rwm_seed_spec(struct kvi_service *svc, struct kvi_listener_spec *spec, uint32_t dense)
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
    kvi_svc__rwm_drop(svc, ns->ix, dense, false, dp_rank, false);
    if (svc->n_rwm == svc->cap_rwm) {
        svc->cap_rwm = svc->cap_rwm ? svc->cap_rwm * 2 : 16;
        svc->rwm = kvi_xrealloc(svc->rwm, svc->cap_rwm * sizeof *svc->rwm);
    }
    svc->rwm[svc->n_rwm++] = (struct svc_rwm){ns->ix, dense, dp_rank, seq};
}

/* ---- shared by the registrations of both dialects (control thread) ---------------------- */

void kvi_svc__submit_op(struct kvi_service *svc, enum kvi_op_type type, struct kvi_ns *ns, uint32_t dense,
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
        kvi_svc__rwm_drop(svc, ns->ix, dense, false, rank, type == KVI_OP_REMOVE_INSTANCE);
}

bool kvi_svc__listener_failed_at_once(struct kvi_service *svc, const struct kvi_listener_key *key, char *why,
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
