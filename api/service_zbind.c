/*
 * --zmq-bind and POST /zmq/bind: engines that connect to kvidx, the llm-d
 * convention. Every vLLM pod's publisher connects to tcp://<indexer>:<port>
 * with the topic kv@<pod-id>@<model-name>; nobody registers the pods.
 *
 * DESIGN (the whole service: api/service.h)
 *   Endpoints. svc->zb holds every endpoint ever opened (at most
 *   KVI_SVC_MAX_ZBINDS, freed at destroy only, so a pointer to one stays
 *   valid: the listener thread's ctx, posted jobs, pods): the flag's, bound
 *   at startup, and those of POST /zmq/bind (control thread). POST
 *   /zmq/unbind (control thread) clears zb->open (under svc->mu and zb->mu:
 *   zb_unknown takes no new pod, pod_add drops the posted ones), forgets
 *   its pods (unregistered, blocks removed) and closes the listener pool's
 *   endpoint (kvi_listeners_bind_close: no on_unknown call after it, held
 *   messages dropped, the port released). A closed endpoint is reopened in
 *   place.
 *
 *   Each open endpoint is an open bind endpoint of the listener pool
 *   (net/listener.h kvi_listeners_bind_open), subscribed to "kv@". A message
 *   whose topic no registration matches reaches zb_unknown on the endpoint's
 *   listener thread, which checks the topic's shape and the per-endpoint pod
 *   bound, learns the block size when the flag gave none (the first stored
 *   event's block_size), records the topic as a pod to come (zb->mu) and
 *   posts pod_add to the control thread; the listener pool holds the message
 *   and its followers until that registration exists, then applies them in
 *   order. pod_add finds or creates the namespace (<model-name>, tenant
 *   "default"), interns the pod as a string instance id and registers a
 *   bind-mode listener with the exact topic (rank 0 registered; the batches'
 *   ranks are bounded by --max-dp-ranks as for any registration). There is
 *   no replay endpoint: gaps are counted and logged per registration, and a
 *   pod whose seq starts over is a new engine (the listener's restart rule
 *   clears its ranks).
 *
 *   Idle pods: the control thread calls kvi_svc__zbind_sweep between posted
 *   functions (and when its queue is idle, at the sweep's period: a quarter
 *   of --zmq-bind-idle-s, at most 10 s); a pod whose last message is
 *   older than --zmq-bind-idle-s is unregistered, its blocks removed, and
 *   forgotten (its topic may come back as a new pod).
 *
 *   Threads: zb->topics (net/keyhash.h: zb_unknown's lookup costs one
 *   probe, not a scan over the endpoint's pods) under zb->mu (listener
 *   thread and control thread);
 *   svc->zp written by the control thread under svc->mu, read by /workers
 *   under it; counters relaxed atomics.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "api/service_internal.h"
#include "engine/common.h"
#include "net/decode.h"
#include "net/keyhash.h"
#include "net/log.h"

#define ZB_PREFIX "kv@"
#define ZB_TENANT "default"

struct svc_zbind {
    struct kvi_service *svc;
    char *endpoint;
    bool from_flag;           /* --zmq-bind (else POST /zmq/bind): control thread, read under svc->mu */
    bool open;                /* bound and taking pods: written under svc->mu and mu, read under either */
    pthread_mutex_t mu;       /* topics, block_size, open */
    uint32_t block_size;      /* 0 = learnt per model: written by the control thread under svc->mu and mu */
    struct kvi_khash topics;  /* pods registered or about to be: struct ztopic by topic (net/keyhash.h) */
    struct kvi_decoder *dec;  /* zb_unknown (the endpoint's listener thread) only */
    _Atomic uint64_t bad_topic, refused, no_bs;
};

struct svc_zpod {
    char *pod, *topic;
    struct kvi_ns *ns;
    uint32_t dense;
    struct svc_zbind *zb;
};

/* A pod to register (posted to the control thread; one allocation, freed by whoever runs or drops it). */
struct zpod_job {
    struct svc_zbind *zb;
    uint32_t block_size;
    char *pod, *model;  /* into topic */
    char topic[];       /* "kv@" pod '\0' model '\0', the topic is rebuilt in pod_add */
};

/* ---- topics (zb->mu) -------------------------------------------------------------------------- */

/* A topic of zb->topics (one allocation; node.key points at s). */
struct ztopic {
    struct kvi_khnode node;
    char s[];
};

static bool topic_known_locked(const struct svc_zbind *zb, const void *t, size_t len)
{
    return kvi_khash_find(&zb->topics, t, len) != NULL;
}

/* Add topic @p t (not there). */
static void topic_add_locked(struct svc_zbind *zb, const void *t, size_t len)
{
    struct ztopic *z = kvi_xmalloc(sizeof *z + len + 1);
    memcpy(z->s, t, len);
    z->s[len] = '\0';
    z->node.key = z->s;
    z->node.len = len;
    kvi_khash_add(&zb->topics, &z->node);
}

/* Forget every topic (the buckets stay). */
static void topics_clear_locked(struct svc_zbind *zb)
{
    for (struct kvi_khnode *x; (x = kvi_khash_pop(&zb->topics)) != NULL;)
        free((char *)x - offsetof(struct ztopic, node));
}

static void topic_forget(struct svc_zbind *zb, const char *t)
{
    pthread_mutex_lock(&zb->mu);
    struct kvi_khnode *x = kvi_khash_find(&zb->topics, t, strlen(t));
    if (x != NULL) {
        kvi_khash_del(&zb->topics, x);
        free((char *)x - offsetof(struct ztopic, node));
    }
    pthread_mutex_unlock(&zb->mu);
}

/*
 * Split kv@<pod>@<model>: pod and model non-empty, the pod without '@', no
 * NUL byte, shorter than a listener topic. @return whether it has that shape.
 */
static bool topic_parse(const char *t, size_t len, size_t *pod_len)
{
    size_t pl = strlen(ZB_PREFIX);
    if (len <= pl || len >= KVI_LISTEN_NAME_MAX || memcmp(t, ZB_PREFIX, pl) != 0 || memchr(t, '\0', len) != NULL)
        return false;
    const char *at = memchr(t + pl, '@', len - pl);
    if (at == NULL || at == t + pl || at + 1 == t + len)
        return false;
    *pod_len = (size_t)(at - (t + pl));
    return true;
}

/* The block_size of the first stored event of a batch that names one, or 0. */
static uint32_t first_block_size(struct kvi_decoder *d, const void *payload, size_t len)
{
    struct kvi_batch b;
    uint32_t bs = 0;
    if (kvi_decode_batch(d, payload, len, &b) == 0)
        for (uint32_t i = 0; i < b.n_events && bs == 0; i++)
            if (b.events[i].type == KVI_EV_STORED && b.events[i].has_block_size)
                bs = b.events[i].block_size;
    kvi_decoder_trim(d);
    return bs;
}

static void pod_add(struct kvi_service *svc, void *arg);

/* kvi_listener_unknown_fn of the endpoints (their listener thread; net/listener.h). */
static bool zb_unknown(void *ctx, const char *endpoint, const void *topic, size_t len, uint64_t seq,
                       const void *payload, size_t plen)
{
    (void)endpoint, (void)seq;
    struct svc_zbind *zb = ctx;
    size_t pod_len;
    if (!topic_parse(topic, len, &pod_len)) {
        kvi_relaxed_add(&zb->bad_topic, 1);
        return false;
    }
    uint32_t max = zb->svc->cfg.zbind_max_pods ? zb->svc->cfg.zbind_max_pods : KVI_SVC_DEFAULT_ZBIND_MAX_PODS;
    pthread_mutex_lock(&zb->mu);
    bool known = topic_known_locked(zb, topic, len);
    bool ok = known;
    if (!zb->open) {
        ok = false; /* being closed (POST /zmq/unbind): no new pod */
    } else if (!known && zb->topics.n >= max) {
        kvi_relaxed_add(&zb->refused, 1);
    } else if (!known) {
        uint32_t bs = zb->block_size ? zb->block_size : first_block_size(zb->dec, payload, plen);
        if (bs == 0) {
            kvi_relaxed_add(&zb->no_bs, 1);
        } else {
            size_t pl = strlen(ZB_PREFIX);
            struct zpod_job *j = kvi_xmalloc(sizeof *j + len + 1);
            j->zb = zb;
            j->block_size = bs;
            memcpy(j->topic, topic, len);
            j->topic[len] = '\0';
            j->pod = j->topic + pl;
            j->pod[pod_len] = '\0';
            j->model = j->pod + pod_len + 1;
            if (kvi_service_post(zb->svc, pod_add, j) == 0) {
                topic_add_locked(zb, topic, len);
                ok = true;
            } else {
                free(j);
            }
        }
    }
    pthread_mutex_unlock(&zb->mu);
    return ok;
}

/* ---- pods (control thread) -------------------------------------------------------------------- */

static void pod_add(struct kvi_service *svc, void *arg)
{
    struct zpod_job *j = arg;
    struct svc_zbind *zb = j->zb;
    char topic[KVI_LISTEN_NAME_MAX];
    snprintf(topic, sizeof topic, ZB_PREFIX "%s@%s", j->pod, j->model);
    if (!zb->open) { /* closed after zb_unknown posted this (its topics were cleared) */
        free(j);
        return;
    }
    bool created;
    struct kvi_ns *ns = kvi_svc__ns_get(svc, j->model, ZB_TENANT, j->block_size, &created);
    int64_t dense = -ENOMEM;
    int rc = -ENOENT;
    if (ns != NULL) {
        kvi_svc__ns_ref(svc, ns, +1);
        dense = kvi_index_intern_instance(ns->ix, 0, j->pod, false);
        if (dense >= 0) {
            struct kvi_listener_spec spec = {
                .ix = ns->ix,
                .instance_name = j->pod,
                .endpoint = zb->endpoint,
                .topic = topic,
                .mode = KVI_LISTEN_BIND,
                .exact_topic = true,
            };
            kvi_svc__bridge_spec(svc, &spec, ns->model, ns->tenant);
            rc = kvi_listeners_register(svc->listeners, &spec);
        }
    }
    if (rc != 0) {
        kvi_log_error("zmq-bind %s: pod %s of model %s not registered (%s): its messages are dropped", zb->endpoint,
                      j->pod, j->model, ns == NULL ? strerror(errno) : dense < 0 ? "out of memory" : strerror(-rc));
        kvi_relaxed_add(&zb->refused, 1);
        topic_forget(zb, topic);
        if (ns != NULL)
            kvi_svc__ns_ref(svc, ns, -1);
        free(j);
        return;
    }
    pthread_mutex_lock(&svc->mu);
    if (svc->n_zp == svc->cap_zp) {
        svc->cap_zp = svc->cap_zp ? 2 * svc->cap_zp : 16;
        svc->zp = kvi_xrealloc(svc->zp, svc->cap_zp * sizeof *svc->zp);
    }
    svc->zp[svc->n_zp++] = (struct svc_zpod){xstrdup(j->pod), xstrdup(topic), ns, (uint32_t)dense, zb};
    pthread_mutex_unlock(&svc->mu);
    kvi_relaxed_add(&svc->zb_created, 1);
    kvi_log_info("zmq-bind %s: pod %s of model %s registered (block_size %" PRIu32 ")", zb->endpoint, j->pod,
                 j->model, ns->block_size);
    free(j);
}

/* Unregister pod i, remove its blocks and forget it: idle for @p idle_s seconds, or (0) its endpoint closes. */
static void pod_forget(struct kvi_service *svc, size_t i, uint64_t idle_s)
{
    struct svc_zpod p = svc->zp[i];
    struct kvi_listener_key key = {p.ns->ix, 0, p.pod, 0};
    /* the topic first: while the listener is still registered its messages reach it, and once it
     * is gone they make a new pod (posted, so registered after this sweep), never a held message
     * for a pod nobody registers */
    topic_forget(p.zb, p.topic);
    (void)kvi_listeners_unregister(svc->listeners, &key);
    kvi_svc__submit_op(svc, KVI_OP_REMOVE_INSTANCE, p.ns, p.dense, 0);
    pthread_mutex_lock(&svc->mu);
    svc->zp[i] = svc->zp[--svc->n_zp];
    pthread_mutex_unlock(&svc->mu);
    if (idle_s > 0) {
        kvi_log_info("zmq-bind %s: pod %s of model %s forgotten: no message for %" PRIu64 " s, its blocks dropped",
                     p.zb->endpoint, p.pod, p.ns->model, idle_s);
        kvi_relaxed_add(&svc->zb_forgotten, 1);
    } else {
        kvi_log_info("zmq-bind %s: pod %s of model %s unregistered with its endpoint, its blocks dropped",
                     p.zb->endpoint, p.pod, p.ns->model);
    }
    kvi_svc__ns_ref(svc, p.ns, -1);
    free(p.pod);
    free(p.topic);
}

uint64_t kvi_svc__zbind_sweep(struct kvi_service *svc)
{
    uint64_t idle_s = svc->cfg.zbind_idle_s;
    if (idle_s == 0 || svc->n_zb == 0)
        return 0;
    uint64_t period = KVI_MIN(idle_s * 1000000000u / 4, (uint64_t)10000000000u);
    if (period == 0)
        period = 1;
    uint64_t now = kvi_now_ns();
    if (now < svc->zb_next_sweep_ns)
        return svc->zb_next_sweep_ns - now;
    svc->zb_next_sweep_ns = now + period;
    struct kvi_listener_info *info = kvi_xmalloc(sizeof *info);
    for (size_t i = 0; i < svc->n_zp;) {
        struct svc_zpod *p = &svc->zp[i];
        struct kvi_listener_key key = {p->ns->ix, 0, p->pod, 0};
        bool idle = kvi_listeners_get(svc->listeners, &key, info) != 0 ||
                    (info->last_message_set && info->last_message_age_ns >= idle_s * 1000000000u);
        if (idle)
            pod_forget(svc, i, idle_s); /* moves the last pod to i */
        else
            i++;
    }
    free(info);
    return period;
}

/* ---- endpoints: set-up, POST /zmq/bind and /zmq/unbind, teardown ----------------------------- */

/* A new endpoint slot (closed), added under svc->mu. NULL when KVI_SVC_MAX_ZBINDS are known. */
static struct svc_zbind *zb_add(struct kvi_service *svc, const char *endpoint, uint32_t block_size, bool from_flag)
{
    if (svc->n_zb == KVI_SVC_MAX_ZBINDS)
        return NULL;
    struct svc_zbind *zb = kvi_xcalloc(1, sizeof *zb);
    zb->svc = svc;
    zb->endpoint = xstrdup(endpoint);
    zb->block_size = block_size;
    zb->from_flag = from_flag;
    pthread_mutex_init(&zb->mu, NULL);
    pthread_mutex_lock(&svc->mu);
    svc->zb[svc->n_zb++] = zb;
    pthread_mutex_unlock(&svc->mu);
    return zb;
}

static void zb_set_open(struct svc_zbind *zb, bool open)
{
    pthread_mutex_lock(&zb->svc->mu);
    pthread_mutex_lock(&zb->mu);
    zb->open = open;
    pthread_mutex_unlock(&zb->mu);
    pthread_mutex_unlock(&zb->svc->mu);
}

#define ZB_REBIND_WAIT_MS 2000 /* a port closed by /zmq/unbind: libzmq releases it in the background */

/*
 * Bind closed endpoint @p zb with @p block_size. An endpoint bound before
 * (@p was_open) is retried for up to ZB_REBIND_WAIT_MS while its port is
 * still in use: libzmq closes a listening socket on its I/O thread after
 * zmq_close returned. Control thread. @return 0 or -errno (logged).
 */
static int zb_bind(struct kvi_service *svc, struct svc_zbind *zb, uint32_t block_size, bool was_open)
{
    if (zb->dec == NULL && (zb->dec = kvi_decoder_create()) == NULL) {
        kvi_log_error("zmq-bind %s: out of memory: not bound", zb->endpoint);
        return -ENOMEM;
    }
    pthread_mutex_lock(&svc->mu); /* GET /zmq/binds reads it under svc->mu, zb_unknown under zb->mu */
    pthread_mutex_lock(&zb->mu);
    zb->block_size = block_size;
    pthread_mutex_unlock(&zb->mu);
    pthread_mutex_unlock(&svc->mu);
    struct kvi_listener_bind_spec bs = {
        .endpoint = zb->endpoint, .prefix = ZB_PREFIX, .on_unknown = zb_unknown, .ctx = zb};
    zb_set_open(zb, true); /* before the first on_unknown */
    int rc = kvi_listeners_bind_open(svc->listeners, &bs);
    for (int waited = 0; rc == -EADDRINUSE && was_open && waited < ZB_REBIND_WAIT_MS; waited += 10) {
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
        rc = kvi_listeners_bind_open(svc->listeners, &bs);
    }
    if (rc != 0) {
        zb_set_open(zb, false);
        kvi_log_error("zmq-bind %s: cannot bind: %s", zb->endpoint, rc == -EINVAL ? "invalid endpoint"
                                                                                 : zmq_strerror(-rc));
        return rc;
    }
    kvi_log_info("zmq-bind %s: bound, waiting for engines (topic kv@<pod-id>@<model-name>)", zb->endpoint);
    return 0;
}

void kvi_svc__zbind_init(struct kvi_service *svc)
{
    for (size_t i = 0; i < svc->cfg.n_zbinds && i < KVI_SVC_MAX_ZBINDS; i++)
        (void)zb_add(svc, svc->cfg.zbinds[i].endpoint, svc->cfg.zbinds[i].block_size, true);
    svc->cfg.zbinds = NULL; /* not kept: the copies above are */
}

void kvi_svc__zbind_start(struct kvi_service *svc)
{
    for (size_t i = 0; i < svc->n_zb; i++)
        (void)zb_bind(svc, svc->zb[i], svc->zb[i]->block_size, false);
    kvi_svc__zbind_sweep(svc);
}

static struct svc_zbind *zb_find(struct kvi_service *svc, const char *endpoint)
{
    for (size_t i = 0; i < svc->n_zb; i++)
        if (strcmp(svc->zb[i]->endpoint, endpoint) == 0)
            return svc->zb[i];
    return NULL;
}

/* The endpoint of @p r as a string in @p ep, or -EINVAL with err (400). */
static int zb_endpoint(const struct kvi_dyn_zbind *r, char *ep, size_t cap, struct kvi_api_err *err)
{
    if (r->endpoint.len >= cap || memchr(r->endpoint.p, '\0', r->endpoint.len) != NULL)
        return kvi_dyn_err_zbind(err, 400, "(endpoint)", "endpoint too long or with a NUL byte");
    memcpy(ep, r->endpoint.p, r->endpoint.len);
    ep[r->endpoint.len] = '\0';
    char why[128];
    if (kvi_endpoint_validate(ep, why, sizeof why) != 0)
        return kvi_dyn_err_zbind(err, 400, ep, why);
    return 0;
}

int kvi_service_ctl_zbind_open(struct kvi_service *svc, const struct kvi_dyn_zbind *r, bool *created,
                               struct kvi_api_err *err)
{
    char ep[KVI_LISTEN_EP_MAX], why[160];
    *created = false;
    int rc = zb_endpoint(r, ep, sizeof ep, err);
    if (rc != 0)
        return rc;
    struct svc_zbind *zb = zb_find(svc, ep);
    if (zb != NULL && zb->open) {
        if (zb->block_size == r->block_size)
            return 0; /* idempotent */
        if (zb->block_size == 0)
            snprintf(why, sizeof why, "open without a block size (each model's from its first BlockStored)");
        else
            snprintf(why, sizeof why, "open with block_size %" PRIu32, zb->block_size);
        return kvi_dyn_err_zbind(err, 409, ep, why);
    }
    bool fresh = zb == NULL;
    if (fresh && (zb = zb_add(svc, ep, r->block_size, false)) == NULL) {
        snprintf(why, sizeof why, "%d bind endpoints are known already", KVI_SVC_MAX_ZBINDS);
        kvi_relaxed_add(&svc->zb_refused_endpoints, 1);
        kvi_log_warn("zmq-bind %s: not opened: %s (open or closed, the flag's included)", ep, why);
        return kvi_dyn_err_zbind(err, 429, ep, why);
    }
    rc = zb_bind(svc, zb, r->block_size, !fresh);
    if (rc != 0) {
        snprintf(why, sizeof why, "cannot bind: %s", rc == -EINVAL ? "invalid endpoint" : zmq_strerror(-rc));
        if (fresh) { /* never open: nothing refers to it */
            pthread_mutex_lock(&svc->mu);
            svc->n_zb--;
            pthread_mutex_unlock(&svc->mu);
            if (zb->dec != NULL)
                kvi_decoder_destroy(zb->dec);
            pthread_mutex_destroy(&zb->mu);
            free(zb->endpoint);
            free(zb);
        }
        return kvi_dyn_err_zbind(err, rc == -ENOMEM ? 500 : 400, ep, why);
    }
    pthread_mutex_lock(&svc->mu);
    zb->from_flag = false;
    pthread_mutex_unlock(&svc->mu);
    *created = true;
    return 0;
}

int kvi_service_ctl_zbind_close(struct kvi_service *svc, const struct kvi_dyn_zbind *r, struct kvi_api_err *err)
{
    char ep[KVI_LISTEN_EP_MAX];
    int rc = zb_endpoint(r, ep, sizeof ep, err);
    if (rc != 0)
        return rc;
    struct svc_zbind *zb = zb_find(svc, ep);
    if (zb == NULL || !zb->open)
        return kvi_dyn_err_zbind(err, 404, ep, "not an open bind endpoint");
    zb_set_open(zb, false); /* no new pod from here on (zb_unknown, pod_add) */
    size_t n_pods = 0;
    for (size_t i = 0; i < svc->n_zp;)
        if (svc->zp[i].zb == zb)
            pod_forget(svc, i, 0), n_pods++; /* moves the last pod to i */
        else
            i++;
    pthread_mutex_lock(&zb->mu);
    topics_clear_locked(zb); /* and pods posted, not added yet: pod_add drops them */
    pthread_mutex_unlock(&zb->mu);
    rc = kvi_listeners_bind_close(svc->listeners, ep);
    kvi_log_info("zmq-bind %s: closed (%zu pods unregistered)%s", ep, n_pods, rc == 0 ? "" : ": it was not bound");
    return 0;
}

void kvi_svc__zbind_free(struct kvi_service *svc)
{
    for (size_t i = 0; i < svc->n_zp; i++) {
        free(svc->zp[i].pod);
        free(svc->zp[i].topic);
    }
    free(svc->zp);
    for (size_t i = 0; i < svc->n_zb; i++) {
        struct svc_zbind *zb = svc->zb[i];
        topics_clear_locked(zb);
        kvi_khash_fini(&zb->topics);
        if (zb->dec != NULL)
            kvi_decoder_destroy(zb->dec);
        pthread_mutex_destroy(&zb->mu);
        free(zb->endpoint);
        free(zb);
    }
}

/* ---- inspection (any thread) ------------------------------------------------------------------ */

void kvi_service_zbind_counters(struct kvi_service *svc, struct kvi_zbind_counters *out)
{
    memset(out, 0, sizeof *out);
    out->pods_created = atomic_load_explicit(&svc->zb_created, memory_order_relaxed);
    out->pods_forgotten = atomic_load_explicit(&svc->zb_forgotten, memory_order_relaxed);
    out->endpoints_refused = atomic_load_explicit(&svc->zb_refused_endpoints, memory_order_relaxed);
    pthread_mutex_lock(&svc->mu);
    out->pods = svc->n_zp;
    for (size_t i = 0; i < svc->n_zb; i++) {
        out->endpoints_open += svc->zb[i]->open;
        out->bad_topic += atomic_load_explicit(&svc->zb[i]->bad_topic, memory_order_relaxed);
        out->pods_refused += atomic_load_explicit(&svc->zb[i]->refused, memory_order_relaxed);
        out->no_block_size += atomic_load_explicit(&svc->zb[i]->no_bs, memory_order_relaxed);
    }
    pthread_mutex_unlock(&svc->mu);
}

/* The ranks pod @p key's batches named (at least one: rank 0 before any batch), in scratch; NULL on OOM. */
static uint32_t *pod_ranks(struct kvi_service *svc, const struct kvi_listener_key *key, struct kvi_scratch *s,
                           size_t *n)
{
    uint32_t few[16];
    int rc = kvi_listeners_ranks(svc->listeners, key, few, 16);
    size_t cap = rc > 16 ? (size_t)rc + 16 : 16; /* more ranks may come between the two calls */
    uint32_t *r = kvi_scratch_alloc(s, cap * sizeof *r);
    if (r == NULL)
        return NULL;
    if (rc > 16)
        rc = kvi_listeners_ranks(svc->listeners, key, r, cap);
    else if (rc > 0)
        memcpy(r, few, (size_t)rc * sizeof *r);
    *n = rc > 0 ? KVI_MIN((size_t)rc, cap) : 0;
    if (*n == 0) {
        r[0] = 0;
        *n = 1;
    }
    return r;
}

size_t kvi_svc__zbind_worker_views(struct kvi_service *svc, const struct kvi_dyn_workers_filter *f,
                                   struct kvi_scratch *s, struct kvi_worker_view **out)
{
    *out = NULL;
    if (svc->n_zp == 0)
        return 0;
    struct kvi_worker_view *v = kvi_xcalloc(svc->n_zp, sizeof *v);
    struct kvi_listener_info *info = kvi_xmalloc(sizeof *info);
    size_t n = 0;
    for (size_t i = 0; i < svc->n_zp; i++) {
        const struct svc_zpod *p = &svc->zp[i];
        if (f != NULL && f->has_model && !kvi_str_eq(f->model_name, p->ns->model))
            continue;
        if (f != NULL && f->has_tenant && !kvi_str_eq(f->tenant_id, p->ns->tenant))
            continue;
        struct kvi_listener_key key = {p->ns->ix, 0, p->pod, 0};
        size_t n_ranks;
        uint32_t *ranks = pod_ranks(svc, &key, s, &n_ranks);
        struct kvi_listener_view *lv = ranks ? kvi_scratch_alloc(s, n_ranks * sizeof *lv) : NULL;
        if (lv == NULL)
            break;
        /* one registration (one topic) carries every rank: each rank shows its status and liveness */
        struct kvi_listener_view one = {.dp_rank = 0, .endpoint = p->zb->endpoint, .status = KVI_LS_FAILED,
                                        .last_error = "listener not found", .has_liveness = true};
        if (kvi_listeners_get(svc->listeners, &key, info) == 0) {
            one.status = info->state == KVI_LISTENER_ACTIVE    ? KVI_LS_ACTIVE
                         : info->state == KVI_LISTENER_PENDING ? KVI_LS_PENDING
                         : info->state == KVI_LISTENER_PAUSED  ? KVI_LS_PAUSED
                                                               : KVI_LS_FAILED;
            one.last_error = NULL;
            one.messages = info->ctr.messages;
            one.has_last_message = info->last_message_set;
            one.seconds_since_last_message = info->last_message_age_ns / 1000000000u;
            one.connected = (int8_t)(!info->monitored ? -1 : info->connected ? 1 : 0);
        }
        for (size_t k = 0; k < n_ranks; k++) {
            lv[k] = one;
            lv[k].dp_rank = ranks[k];
        }
        v[n++] = (struct kvi_worker_view){0,  p->ns->model, p->ns->tenant, p->ns->block_size, "zmq-bind", lv, n_ranks,
                                          p->pod};
    }
    free(info);
    *out = v;
    return n;
}

void kvi_service_encode_zbinds(struct kvi_service *svc, struct kvi_buf *out)
{
    struct kvi_wr w;
    kvi_wr_init(&w, out, KVI_ENC_JSON);
    pthread_mutex_lock(&svc->mu);
    uint32_t n = 0;
    for (size_t i = 0; i < svc->n_zb; i++)
        n += svc->zb[i]->open;
    kvi_wr_arr(&w, n);
    for (size_t i = 0; i < svc->n_zb; i++) {
        const struct svc_zbind *zb = svc->zb[i];
        if (!zb->open)
            continue;
        uint64_t pods = 0;
        for (size_t k = 0; k < svc->n_zp; k++)
            pods += svc->zp[k].zb == zb;
        kvi_wr_obj(&w, 4);
        kvi_wr_keyz(&w, "endpoint");
        kvi_wr_strz(&w, zb->endpoint);
        kvi_wr_keyz(&w, "block_size");
        if (zb->block_size != 0)
            kvi_wr_u64(&w, zb->block_size);
        else
            kvi_wr_null(&w);
        kvi_wr_keyz(&w, "source");
        kvi_wr_strz(&w, zb->from_flag ? "flag" : "http");
        kvi_wr_keyz(&w, "pods");
        kvi_wr_u64(&w, pods);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    pthread_mutex_unlock(&svc->mu);
}
