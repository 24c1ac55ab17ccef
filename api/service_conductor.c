/*
 * The service's Conductor services table: registrations (POST /register),
 * unregistrations and the GET /services and GET /global_view bodies.
 *
 * DESIGN (the whole service: api/service.h)
 *   One entry per service key instance|tenant|rank (svc_cond, unordered).
 *   Mutations run on the control thread, which reads the table without a
 *   lock and writes it under `mu`; each change publishes a new query roster
 *   (kvi_svc__cond_view_publish, api/service_roster.c), takes or drops the
 *   namespace's reference (api/service_ns.c) and updates readiness
 *   (api/service.c). A context whose block size differs from its (model,
 *   tenant)'s namespace lives under ("<model>#bs=<N>", tenant) (cond_ns).
 *   The encoders run on any thread and read the tables under `mu`
 *   (/services lists the Dynamo instances' ranks too); /global_view also
 *   reads the published roster in an RCU read section of its own.
 *   With --nats-registry a /register is applied here first, then created in
 *   the bucket (undone here when that fails), an /unregister deletes the key
 *   first, and the bucket's changes come back through kvi_svc__cond_apply and
 *   kvi_svc__cond_drop_key, on the control thread (api/service_registry.c).
 */
#include "api/service_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/rcu.h"
#include "net/log.h"

/* ---- Conductor services --------------------------------------------------------------------- */

void kvi_svc__free_cond(struct svc_cond *c)
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

/* The namespace of a Conductor context: (model, tenant) when free or of the same
 * block size, else ("<model>#bs=<N>", tenant). */
static struct kvi_ns *cond_ns(struct kvi_service *svc, const char *model, const char *tenant, uint32_t bs,
                              bool *created)
{
    struct kvi_ns *ns = kvi_nsreg_find(svc->nsreg, model, tenant);
    if (ns == NULL || ns->block_size == bs)
        return kvi_svc__ns_get(svc, model, tenant, bs, created);
    size_t n = strlen(model) + 24;
    char *key = kvi_xmalloc(n);
    snprintf(key, n, "%s#bs=%" PRIu32, model, bs);
    ns = kvi_svc__ns_get(svc, key, tenant, bs, created);
    free(key);
    return ns;
}

/* Register here only (no registry write). *noop: this replica held the same registration already. */
static int cond_register_local(struct kvi_service *svc, const struct kvi_cond_register *r, bool *noop,
                               struct kvi_api_err *err)
{
    *noop = false;
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
        if (cond_same(old, r)) {
            *noop = true;
            return 0;
        }
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
    kvi_svc__rwm_seed_spec(svc, &spec, c.dense);
    kvi_svc__bridge_spec(svc, &spec, c.ns->model, c.ns->tenant);
    int lrc = kvi_listeners_register(svc->listeners, &spec);
    char failed[KVI_LISTEN_ERR_MAX];
    struct kvi_listener_key key = {c.ns->ix, 0, c.instance, c.dp_rank};
    if (lrc == 0 && kvi_svc__listener_failed_at_once(svc, &key, failed, sizeof failed)) {
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
        kvi_svc__rwm_drop(svc, c.ns->ix, c.dense, false, c.dp_rank, false); /* the listener owns it now */
    kvi_svc__ns_ref(svc, c.ns, +1);
    kvi_svc__cond_view_publish(svc);
    kvi_log_info("registered %s service %s|%s|%" PRIu32 " for model %s lora '%s' block_size %" PRIu32 " at %s",
                 kvi_cond_type_name(c.type), c.instance, c.tenant, c.dp_rank, c.model, c.lora, c.block_size,
                 c.endpoint);
    kvi_svc__update_registered(svc);
    kvi_svc__maybe_open_gate(svc);
    return 0;
fail_ns:
    if (created)
        kvi_service_ctl_ns_drop_unused(svc, c.ns);
fail:
    if (err->status >= 500) /* not the client's fault: the operator must see it */
        kvi_log_error("registration of %s|%s|%" PRIu32 " for model %s failed (%d): %s", c.instance, c.tenant,
                      c.dp_rank, c.model, err->status, err->msg);
    kvi_svc__free_cond(&c);
    return rc;
}

/* Unregister @p c here only (no registry write): its listener closed, its blocks removed. */
static void cond_drop(struct kvi_service *svc, struct svc_cond *c)
{
    struct kvi_listener_key key = {c->ns->ix, 0, c->instance, c->dp_rank};
    kvi_listeners_unregister(svc->listeners, &key);
    bool other_rank = false;
    for (size_t i = 0; i < svc->n_c; i++)
        other_rank |= &svc->c[i] != c && svc->c[i].ns == c->ns && !strcmp(svc->c[i].instance, c->instance);
    kvi_svc__submit_op(svc, other_rank ? KVI_OP_REMOVE_DP_RANK : KVI_OP_REMOVE_INSTANCE, c->ns, c->dense, c->dp_rank);
    kvi_log_info("unregistered service %s|%s|%" PRIu32, c->instance, c->tenant, c->dp_rank);
    struct kvi_ns *ns = c->ns;
    pthread_mutex_lock(&svc->mu);
    kvi_svc__free_cond(c);
    *c = svc->c[--svc->n_c];
    pthread_mutex_unlock(&svc->mu);
    kvi_svc__cond_view_publish(svc);
    kvi_svc__ns_ref(svc, ns, -1);
    kvi_svc__update_registered(svc);
}

int kvi_service_ctl_cond_register(struct kvi_service *svc, const struct kvi_cond_register *r, struct kvi_api_err *err)
{
    bool noop;
    int rc = cond_register_local(svc, r, &noop, err);
    if (rc != 0 || !kvi_svc__registry_on(svc))
        return rc;
    /* shared with the fleet (api/service_registry.c): created only if its key holds no value */
    int prc = kvi_svc__registry_put_cond(svc, r);
    if (prc == 0 || (prc == -EEXIST && noop))
        return 0; /* (an identical re-registration finds its own key: a no-op, as without a registry) */
    struct kvi_str inst = r->has_instance ? r->instance_id : r->endpoint;
    if (!noop) {
        /* not shared: undone here too, so every replica agrees */
        struct svc_cond *c = cond_find_key(svc, inst, r->tenant_id, r->dp_rank);
        if (c != NULL)
            cond_drop(svc, c);
    }
    if (prc == -EEXIST) /* registered with other values through another replica meanwhile */
        return kvi_cond_err_conflict(err, inst, r->tenant_id, r->dp_rank);
    return kvi_dyn_err_nats(err, 503, "the registration could not be stored in the --nats-registry bucket "
                                      "(NATS unreachable?); nothing was registered");
}

int kvi_service_ctl_cond_unregister(struct kvi_service *svc, const struct kvi_cond_unregister *r,
                                    struct kvi_cond_key *removed, struct kvi_api_err *err)
{
    struct svc_cond *c = cond_find_key(svc, r->instance_id, r->tenant_id, r->dp_rank);
    if (c == NULL)
        return kvi_cond_err_service_not_found(err, r->instance_id, r->tenant_id, r->dp_rank);
    /* the fleet's key goes first: a failure changes nothing anywhere (api/service_registry.c) */
    if (kvi_svc__registry_on(svc) && kvi_svc__registry_del_cond(svc, r->instance_id, r->tenant_id, r->dp_rank) != 0)
        return kvi_dyn_err_nats(err, 503, "the unregistration could not be stored in the --nats-registry bucket "
                                          "(NATS unreachable?)");
    cond_drop(svc, c);
    *removed = (struct kvi_cond_key){r->instance_id, r->tenant_id, r->dp_rank};
    return 0;
}

int kvi_svc__cond_apply(struct kvi_service *svc, const struct kvi_cond_register *r, struct kvi_api_err *err)
{
    struct kvi_str inst = r->has_instance ? r->instance_id : r->endpoint;
    struct svc_cond *old = cond_find_key(svc, inst, r->tenant_id, r->dp_rank);
    if (old != NULL && !cond_same(old, r)) {
        kvi_log_info("nats registry: service %s|%s|%" PRIu32 " re-registered elsewhere with other values", old->instance,
                     old->tenant, old->dp_rank);
        cond_drop(svc, old);
    }
    bool noop;
    return cond_register_local(svc, r, &noop, err);
}

void kvi_svc__cond_drop_key(struct kvi_service *svc, struct kvi_str inst, struct kvi_str tenant, uint32_t rank)
{
    struct svc_cond *c = cond_find_key(svc, inst, tenant, rank);
    if (c != NULL)
        cond_drop(svc, c);
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
