/*
 * --zmq-bind: engines that connect to kvidx, the llm-d convention. Every
 * vLLM pod's publisher connects to tcp://<indexer>:<port> with the topic
 * kv@<pod-id>@<model-name>; nobody registers the pods.
 *
 * DESIGN (the whole service: api/service.h)
 *   Each --zmq-bind endpoint is an open bind endpoint of the listener pool
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
 *   Threads: zb->topics under zb->mu (listener thread and control thread);
 *   svc->zp written by the control thread under svc->mu, read by /workers
 *   under it; counters relaxed atomics.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "api/service_internal.h"
#include "engine/common.h"
#include "net/decode.h"
#include "net/log.h"

#define ZB_PREFIX "kv@"
#define ZB_TENANT "default"

struct svc_zbind {
    struct kvi_service *svc;
    char *endpoint;
    uint32_t block_size;      /* 0 = learnt per model */
    bool open;
    pthread_mutex_t mu;       /* topics */
    char **topics;            /* pods registered or about to be, by topic */
    size_t n_topics, cap_topics;
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

static bool topic_find_locked(struct svc_zbind *zb, const void *t, size_t len, size_t *at)
{
    for (size_t i = 0; i < zb->n_topics; i++)
        if (strlen(zb->topics[i]) == len && memcmp(zb->topics[i], t, len) == 0) {
            if (at != NULL)
                *at = i;
            return true;
        }
    return false;
}

static void topic_forget(struct svc_zbind *zb, const char *t)
{
    pthread_mutex_lock(&zb->mu);
    size_t at;
    if (topic_find_locked(zb, t, strlen(t), &at)) {
        free(zb->topics[at]);
        zb->topics[at] = zb->topics[--zb->n_topics];
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
    bool known = topic_find_locked(zb, topic, len, NULL);
    bool ok = known;
    if (!known && zb->n_topics >= max) {
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
                if (zb->n_topics == zb->cap_topics) {
                    zb->cap_topics = zb->cap_topics ? 2 * zb->cap_topics : 16;
                    zb->topics = kvi_xrealloc(zb->topics, zb->cap_topics * sizeof *zb->topics);
                }
                zb->topics[zb->n_topics++] = xstrndup(topic, len);
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

/* Unregister pod i, remove its blocks and forget it. */
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
    kvi_log_info("zmq-bind %s: pod %s of model %s forgotten: no message for %" PRIu64 " s, its blocks dropped",
                 p.zb->endpoint, p.pod, p.ns->model, idle_s);
    kvi_relaxed_add(&svc->zb_forgotten, 1);
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

/* ---- set-up and teardown ---------------------------------------------------------------------- */

void kvi_svc__zbind_init(struct kvi_service *svc)
{
    svc->n_zb = svc->cfg.n_zbinds;
    svc->zb = svc->n_zb ? kvi_xcalloc(svc->n_zb, sizeof *svc->zb) : NULL;
    for (size_t i = 0; i < svc->n_zb; i++) {
        struct svc_zbind *zb = &svc->zb[i];
        zb->svc = svc;
        zb->endpoint = xstrdup(svc->cfg.zbinds[i].endpoint);
        zb->block_size = svc->cfg.zbinds[i].block_size;
        pthread_mutex_init(&zb->mu, NULL);
    }
    svc->cfg.zbinds = NULL; /* not kept: the copies above are */
}

void kvi_svc__zbind_start(struct kvi_service *svc)
{
    for (size_t i = 0; i < svc->n_zb; i++) {
        struct svc_zbind *zb = &svc->zb[i];
        zb->dec = kvi_decoder_create();
        if (zb->dec == NULL) {
            kvi_log_error("zmq-bind %s: out of memory: not bound", zb->endpoint);
            continue;
        }
        struct kvi_listener_bind_spec bs = {
            .endpoint = zb->endpoint, .prefix = ZB_PREFIX, .on_unknown = zb_unknown, .ctx = zb};
        int rc = kvi_listeners_bind_open(svc->listeners, &bs);
        if (rc != 0) {
            kvi_log_error("zmq-bind %s: cannot bind: %s", zb->endpoint, rc == -EINVAL ? "invalid endpoint"
                                                                                     : zmq_strerror(-rc));
            continue;
        }
        zb->open = true;
        kvi_log_info("zmq-bind %s: bound, waiting for engines (topic kv@<pod-id>@<model-name>)", zb->endpoint);
    }
    kvi_svc__zbind_sweep(svc);
}

void kvi_svc__zbind_free(struct kvi_service *svc)
{
    for (size_t i = 0; i < svc->n_zp; i++) {
        free(svc->zp[i].pod);
        free(svc->zp[i].topic);
    }
    free(svc->zp);
    for (size_t i = 0; i < svc->n_zb; i++) {
        struct svc_zbind *zb = &svc->zb[i];
        for (size_t k = 0; k < zb->n_topics; k++)
            free(zb->topics[k]);
        free(zb->topics);
        if (zb->dec != NULL)
            kvi_decoder_destroy(zb->dec);
        pthread_mutex_destroy(&zb->mu);
        free(zb->endpoint);
    }
    free(svc->zb);
}

/* ---- inspection (any thread) ------------------------------------------------------------------ */

void kvi_service_zbind_counters(struct kvi_service *svc, struct kvi_zbind_counters *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&svc->mu);
    out->pods = svc->n_zp;
    pthread_mutex_unlock(&svc->mu);
    out->pods_created = atomic_load_explicit(&svc->zb_created, memory_order_relaxed);
    out->pods_forgotten = atomic_load_explicit(&svc->zb_forgotten, memory_order_relaxed);
    for (size_t i = 0; i < svc->n_zb; i++) {
        out->bad_topic += atomic_load_explicit(&svc->zb[i].bad_topic, memory_order_relaxed);
        out->pods_refused += atomic_load_explicit(&svc->zb[i].refused, memory_order_relaxed);
        out->no_block_size += atomic_load_explicit(&svc->zb[i].no_bs, memory_order_relaxed);
    }
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
        struct kvi_listener_view *lv = kvi_scratch_alloc(s, sizeof *lv);
        if (lv == NULL)
            break;
        *lv = (struct kvi_listener_view){.dp_rank = 0, .endpoint = p->zb->endpoint, .status = KVI_LS_FAILED,
                                         .last_error = "listener not found", .has_liveness = true};
        struct kvi_listener_key key = {p->ns->ix, 0, p->pod, 0};
        if (kvi_listeners_get(svc->listeners, &key, info) == 0) {
            lv->status = info->state == KVI_LISTENER_ACTIVE    ? KVI_LS_ACTIVE
                         : info->state == KVI_LISTENER_PENDING ? KVI_LS_PENDING
                         : info->state == KVI_LISTENER_PAUSED  ? KVI_LS_PAUSED
                                                               : KVI_LS_FAILED;
            lv->last_error = NULL;
            lv->messages = info->ctr.messages;
            lv->has_last_message = info->last_message_set;
            lv->seconds_since_last_message = info->last_message_age_ns / 1000000000u;
            lv->connected = (int8_t)(!info->monitored ? -1 : info->connected ? 1 : 0);
        }
        v[n++] = (struct kvi_worker_view){0,  p->ns->model, p->ns->tenant, p->ns->block_size, "zmq-bind", lv, 1,
                                          p->pod};
    }
    free(info);
    *out = v;
    return n;
}
