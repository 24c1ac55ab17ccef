/*
 * The service's query roster: the Conductor contexts published to query
 * threads with RCU (kvi_service_cond_find), the per-namespace Dynamo rosters
 * they share, and the deferred free of the ones replaced.
 *
 * DESIGN (the whole service: api/service.h)
 *   A view (struct cond_view) and a Dynamo roster (struct dyn_roster) are
 *   immutable once published. The control thread builds them from the
 *   tables it owns (no lock needed: it is their only writer), publishes the
 *   view with kvi_rcu_assign and retires what it replaced; the memory is
 *   freed by kvi_svc__reclaim after one grace period, which the control
 *   thread calls once its queue is empty (or earlier when SVC_RETIRED_MAX
 *   wait; api/service.c), so a burst of registrations waits for one grace
 *   period, not one each. A Dynamo
 *   registration change rebuilds its namespace's roster alone, then a view;
 *   a Conductor one rebuilds the view, which points at the current Dynamo
 *   rosters. Query threads call kvi_service_cond_find and
 *   kvi_service_cond_inst_find inside an RCU read section.
 */
#include "api/service_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/rcu.h"

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

/** Memory readers may still hold, freed after one grace period. */
struct svc_retired {
    void *p;
    bool view; /* a struct cond_view (else a struct dyn_roster) */
};

void kvi_svc__cond_view_free(struct cond_view *v)
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
void kvi_svc__reclaim(struct kvi_service *svc)
{
    if (svc->n_retired == 0)
        return;
    kvi_rcu_synchronize();
    for (size_t i = 0; i < svc->n_retired; i++) {
        if (svc->retired[i].view)
            kvi_svc__cond_view_free(svc->retired[i].p);
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
void kvi_svc__dyn_roster_update(struct kvi_service *svc, struct kvi_ns *ns)
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
    kvi_svc__cond_view_publish(svc);
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
void kvi_svc__cond_view_publish(struct kvi_service *svc)
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
