/*
 * The service's NATS plane (--nats: api/nats_args.h, net/nats_source.h):
 * started by the control thread once startup (--workers, P2P recovery) is
 * over, each source bound to the namespace it names (which it keeps alive
 * with a reference); its workers listed by /workers and dropped by
 * /unregister like registered ones; /ready waits for the stream sources to
 * catch up.
 */
#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "api/nats_args.h"
#include "api/service_internal.h"
#include "net/log.h"

/*
 * Bind one source to its namespace (found or created, a reference taken,
 * recorded under `mu`: /workers reads the list under it) and start it.
 * Control thread. @return the source's index, or a negative errno (-ENOSPC:
 * past --max-models; -EINVAL: a spec the plane refuses).
 */
static int source_add(struct kvi_service *svc, struct kvi_nats *n, const struct kvi_nats_source_arg *s)
{
    const char *what = s->subject ? s->subject : s->stream;
    bool created;
    struct kvi_ns *ns = kvi_svc__ns_get(svc, s->model, s->tenant, s->block_size, &created);
    if (ns == NULL) {
        int rc = errno ? -errno : -ENOMEM;
        kvi_log_error("nats: source %s: no index for %s:%s (%s)", what, s->model, s->tenant, strerror(-rc));
        return rc;
    }
    if (ns->block_size != s->block_size)
        kvi_log_warn("nats: source %s: %s:%s exists with block size %" PRIu32 ", not %" PRIu32 ": its own is used",
                     what, s->model, s->tenant, ns->block_size, s->block_size);
    char label[KVI_NATS_NAME_MAX];
    snprintf(label, sizeof label, "%s:%s", ns->model, ns->tenant);
    struct kvi_nats_source_spec spec = {
        .kind = s->kind,
        .subject = s->subject,
        .stream = s->stream,
        .ix = ns->ix,
        .block_size = ns->block_size,
        .label = label,
    };
    kvi_svc__ns_ref(svc, ns, +1);
    pthread_mutex_lock(&svc->mu);
    svc->nats_ns = kvi_xrealloc(svc->nats_ns, (svc->n_nats_ns + 1) * sizeof *svc->nats_ns);
    svc->nats_ns[svc->n_nats_ns++] = ns;
    pthread_mutex_unlock(&svc->mu);
    int rc = kvi_nats_add_source(n, &spec);
    if (rc < 0)
        kvi_log_error("nats: source %s: %s", what, strerror(-rc));
    return rc;
}

struct kvi_nats *kvi_svc__nats_plane(struct kvi_service *svc)
{
    struct kvi_nats *n = atomic_load_explicit(&svc->nats, memory_order_relaxed);
    const struct kvi_nats_args *a = svc->cfg.nats;
    if (n != NULL || svc->nats_failed || a == NULL || a->conn.servers == NULL)
        return n;
    struct kvi_nats_config c = a->conn;
    c.writers = svc->writers;
    c.name = "kvidx";
    c.snap = kvi_svc__snap_hooks(svc);
    n = kvi_nats_create(&c);
    if (n == NULL) {
        kvi_log_error("nats: cannot start the NATS plane (%s): no NATS source or registry runs", strerror(errno));
        svc->nats_failed = true;
        return NULL;
    }
    atomic_store_explicit(&svc->nats, n, memory_order_release); /* N1: pairs with kvi_service_nats */
    return n;
}

void kvi_svc__nats_start(struct kvi_service *svc)
{
    const struct kvi_nats_args *a = svc->cfg.nats;
    struct kvi_nats *n = kvi_svc__nats_plane(svc);
    if (n == NULL)
        return;
    for (size_t i = 0; i < a->n_sources; i++)
        (void)source_add(svc, n, &a->sources[i]);
}

/* Does the plane run this source already (kind, subject or stream, namespace)? */
static bool source_known(struct kvi_nats *n, const struct kvi_nats_source_arg *a)
{
    char label[2 * KVI_NATS_NAME_MAX + 2];
    snprintf(label, sizeof label, "%s:%s", a->model, a->tenant);
    struct kvi_nats_source_info *si = kvi_xmalloc(sizeof *si);
    bool found = false;
    for (size_t i = 0; i < kvi_nats_n_sources(n) && !found; i++)
        found = kvi_nats_source_info(n, i, si) == 0 && si->kind == a->kind && strcmp(si->label, label) == 0 &&
                (a->kind == KVI_NATS_CORE ? strcmp(si->subject, a->subject) == 0
                                          : strcmp(si->stream, a->stream) == 0);
    free(si);
    return found;
}

/*
 * POST /nats/sources, or a source another replica stored in the registry
 * (`from_registry`: not written back). A source the plane runs already is
 * accepted as it is. Control thread.
 */
int kvi_svc__nats_source(struct kvi_service *svc, const struct kvi_dyn_nats_source *r, bool from_registry,
                         struct kvi_api_err *err)
{
    struct kvi_nats *n = kvi_service_nats(svc);
    if (n == NULL)
        return kvi_dyn_err_nats(err, 409, "kvidxd runs without --nats: no NATS connection to add a source to");
    bool core = r->stream.len == 0;
    char *subject = r->subject.len ? strndup(r->subject.p, r->subject.len) : NULL;
    char *stream = core ? NULL : strndup(r->stream.p, r->stream.len);
    char *model = strndup(r->model_name.p, r->model_name.len);
    char *tenant = strndup(r->tenant_id.p, r->tenant_id.len);
    if ((r->subject.len && subject == NULL) || (!core && stream == NULL) || model == NULL || tenant == NULL)
        kvi_die("out of memory");
    struct kvi_nats_source_arg a = {core ? KVI_NATS_CORE : KVI_NATS_STREAM, subject, stream, model, tenant,
                                    r->block_size};
    int rc = 0;
    if (memchr(r->model_name.p, '\0', r->model_name.len) || memchr(r->tenant_id.p, '\0', r->tenant_id.len) ||
        (subject && strlen(subject) != r->subject.len) || (stream && strlen(stream) != r->stream.len))
        rc = kvi_dyn_err_nats(err, 400, "a NUL character in a name");
    else if (source_known(n, &a))
        rc = 0;
    else if (!from_registry && kvi_svc__registry_on(svc) && kvi_svc__registry_put_source(svc, r) != 0)
        rc = kvi_dyn_err_nats(err, 503, "the source could not be stored in the --nats-registry bucket (NATS "
                                        "unreachable?); it was not added");
    else if ((rc = source_add(svc, n, &a)) < 0)
        rc = rc == -ENOSPC ? kvi_err_too_many_models(err, svc->cfg.max_models ? svc->cfg.max_models
                                                                                : KVI_SVC_DEFAULT_MAX_MODELS)
             : rc == -EINVAL
                 ? kvi_dyn_err_nats(err, 400, "the NATS source was refused (a stream source needs --nats-durable's "
                                              "name, names are at most 255 bytes)")
                 : kvi_dyn_err_nats(err, 500, "the NATS source could not start");
    else
        rc = 0;
    free(subject);
    free(stream);
    free(model);
    free(tenant);
    return rc;
}

int kvi_service_ctl_nats_source(struct kvi_service *svc, const struct kvi_dyn_nats_source *r,
                                struct kvi_api_err *err)
{
    return kvi_svc__nats_source(svc, r, false, err);
}

void kvi_svc__nats_stop(struct kvi_service *svc)
{
    kvi_svc__registry_close(svc); /* it watches through the plane's connection */
    struct kvi_nats *n = atomic_exchange(&svc->nats, NULL);
    kvi_nats_destroy(n);
    kvi_svc__snap_free(svc); /* (its hooks ran on the sources' threads, joined now) */
    free(svc->nats_ns); /* (the namespaces go with the registry) */
    svc->nats_ns = NULL;
    svc->n_nats_ns = 0;
}

struct kvi_nats *kvi_service_nats(const struct kvi_service *svc)
{
    return atomic_load_explicit(&((struct kvi_service *)svc)->nats, memory_order_acquire); /* N1 */
}

/* The namespace a source feeds, by index. */
static const struct kvi_ns *ns_of(const struct kvi_service *svc, const struct kvi_index *ix)
{
    for (size_t i = 0; i < svc->n_nats_ns; i++)
        if (svc->nats_ns[i]->ix == ix)
            return svc->nats_ns[i];
    return NULL;
}

int kvi_svc__nats_unregister(struct kvi_service *svc, uint64_t id, struct kvi_str model, struct kvi_str tenant,
                             bool has_tenant)
{
    struct kvi_nats *n = kvi_service_nats(svc);
    if (n == NULL)
        return -ENOENT;
    int rc = -ENOENT;
    for (size_t i = 0; i < svc->n_nats_ns; i++) {
        const struct kvi_ns *ns = svc->nats_ns[i];
        if (!kvi_str_eq(model, ns->model) || (has_tenant && !kvi_str_eq(tenant, ns->tenant)))
            continue;
        bool seen = false; /* one call per index (two sources may feed one) */
        for (size_t j = 0; j < i && !seen; j++)
            seen = svc->nats_ns[j] == ns;
        if (!seen && kvi_nats_forget_worker(n, ns->ix, id) == 0) {
            kvi_log_info("unregistered NATS worker %" PRIu64 " of %s:%s (its blocks dropped)", id, ns->model,
                         ns->tenant);
            rc = 0;
        }
    }
    return rc;
}

/* ---- /workers ---------------------------------------------------------------------------------- */

struct nats_collect {
    const struct kvi_service *svc;
    const struct kvi_dyn_workers_filter *f;
    struct kvi_scratch *s;
    struct kvi_worker_view *v;
    size_t n, cap;
    bool connected;
    bool oom;
};

static void collect(void *ctx, const struct kvi_nats_worker_view *w)
{
    struct nats_collect *c = ctx;
    const struct kvi_ns *ns = ns_of(c->svc, w->ix);
    if (ns == NULL || c->oom)
        return;
    if (c->f != NULL && c->f->has_model && !kvi_str_eq(c->f->model_name, ns->model))
        return;
    if (c->f != NULL && c->f->has_tenant && !kvi_str_eq(c->f->tenant_id, ns->tenant))
        return;
    struct kvi_worker_view *x = NULL;
    for (size_t i = 0; i < c->n && x == NULL; i++)
        if (c->v[i].instance_id == w->worker_id && c->v[i].model_name == ns->model &&
            c->v[i].tenant_id == ns->tenant)
            x = &c->v[i];
    if (x == NULL) {
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 16;
            c->v = kvi_xrealloc(c->v, c->cap * sizeof *c->v);
        }
        x = &c->v[c->n++];
        *x = (struct kvi_worker_view){w->worker_id, ns->model, ns->tenant, ns->block_size, "nats", NULL, 0, NULL};
    }
    /* listeners grow by one (scratch: a copy per rank, old arrays left to the scratch) */
    struct kvi_listener_view *lv = kvi_scratch_alloc(c->s, (x->n_listeners + 1) * sizeof *lv);
    char *ep = kvi_scratch_strdup(c->s, w->subject, strlen(w->subject));
    if (lv == NULL || ep == NULL) {
        c->oom = true;
        return;
    }
    if (x->n_listeners > 0)
        memcpy(lv, x->listeners, x->n_listeners * sizeof *lv);
    lv[x->n_listeners] = (struct kvi_listener_view){
        .dp_rank = w->dp_rank,
        .endpoint = ep,
        .status = KVI_LS_ACTIVE,
        .has_liveness = true,
        .messages = w->events,
        .has_last_message = w->events > 0,
        .seconds_since_last_message = w->age_ns / 1000000000u,
        .connected = c->connected ? 1 : 0,
    };
    x->listeners = lv;
    x->n_listeners++;
}

size_t kvi_svc__nats_worker_views(struct kvi_service *svc, const struct kvi_dyn_workers_filter *f,
                                  struct kvi_scratch *s, struct kvi_worker_view **out)
{
    *out = NULL;
    struct kvi_nats *n = kvi_service_nats(svc);
    if (n == NULL)
        return 0;
    struct kvi_nats_conn_info ci;
    kvi_nats_conn_info(n, &ci);
    struct nats_collect c = {.svc = svc, .f = f, .s = s, .connected = ci.connected};
    kvi_nats_foreach_worker(n, collect, &c);
    *out = c.v;
    return c.n;
}
