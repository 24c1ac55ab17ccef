/*
 * ZMQ event listeners: the pool, its registry and the control calls
 * (net/listener.h). Control calls hold pool->ctl for their whole duration,
 * change the registry under pool->mu and hand the socket work to the
 * listener's thread with kvi_lis__call (design in net/listener.c).
 */
#include "net/listener_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "engine/common.h"
#include "net/endpoint.h"

/* ---- pool ----------------------------------------------------------------- */

static uint32_t default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 4 ? 2 : 1;
}

static void listeners_free(struct kvi_listeners *lp);

struct kvi_listeners *kvi_listeners_create(struct kvi_writer_pool *writers, const struct kvi_listeners_config *cfg)
{
    struct kvi_listeners_config c = cfg ? *cfg : (struct kvi_listeners_config){0};
    if (c.threads == 0)
        c.threads = default_threads();
    if (c.threads > KVI_LISTEN_MAX_THREADS || writers == NULL) {
        errno = EINVAL;
        return NULL;
    }
    if (c.io_threads == 0)
        c.io_threads = 1;
    if (c.sub_hwm == 0)
        c.sub_hwm = KVI_LISTEN_DEFAULT_SUB_HWM;
    if (c.replay_timeout_ms == 0)
        c.replay_timeout_ms = KVI_LISTEN_DEFAULT_REPLAY_TIMEOUT_MS;
    if (c.replay_retries == 0)
        c.replay_retries = KVI_LISTEN_DEFAULT_REPLAY_RETRIES;
    if (c.max_buffered == 0)
        c.max_buffered = KVI_LISTEN_DEFAULT_MAX_BUFFERED;
    if (c.budget == 0)
        c.budget = KVI_LISTEN_DEFAULT_BUDGET;
    if (c.max_ranks == 0)
        c.max_ranks = KVI_LISTEN_MAX_RANKS_DEFAULT;

    struct kvi_listeners *lp = kvi_xcalloc(1, sizeof *lp);
    lp->writers = writers;
    lp->cfg = c;
    atomic_store(&lp->gate_open, !c.gated);
    atomic_init(&lp->max_ranks, c.max_ranks);
    pthread_mutex_init(&lp->ctl, NULL);
    pthread_mutex_init(&lp->mu, NULL);
    if (c.zmq_ctx != NULL) {
        lp->zctx = c.zmq_ctx;
    } else {
        lp->zctx = zmq_ctx_new();
        if (lp->zctx == NULL) {
            int e = errno;
            free(lp);
            errno = e;
            return NULL;
        }
        lp->own_zctx = true;
        zmq_ctx_set(lp->zctx, ZMQ_IO_THREADS, (int)c.io_threads);
        int limit = zmq_ctx_get(lp->zctx, ZMQ_SOCKET_LIMIT);
        zmq_ctx_set(lp->zctx, ZMQ_MAX_SOCKETS, limit > 0 && limit < 65535 ? limit : 65535);
    }

    lp->thr = kvi_xcalloc(c.threads, sizeof *lp->thr);
    for (uint32_t i = 0; i < c.threads; i++) {
        int rc = kvi_lis__thread_start(lp, &lp->thr[i], i);
        if (rc != 0) {
            kvi_lis__thread_cleanup(&lp->thr[i]);
            lp->n_threads = i;
            listeners_free(lp);
            errno = -rc;
            return NULL;
        }
        lp->n_threads = i + 1;
    }
    return lp;
}

static void stop_threads(struct kvi_listeners *lp)
{
    for (uint32_t i = 0; i < lp->n_threads; i++) {
        kvi_lis__call(&lp->thr[i], CMD_STOP, NULL);
        pthread_join(lp->thr[i].tid, NULL);
        kvi_lis__thread_cleanup(&lp->thr[i]);
    }
    lp->n_threads = 0;
}

/* ---- registry (control side) ---------------------------------------------- */

static bool key_match(const struct listener *l, struct kvi_index *ix, uint32_t instance, uint32_t rank)
{
    return l->ix == ix && l->instance == instance && l->dp_rank == rank;
}

/*
 * The registry: a list (newest first, for listing and teardown) and a
 * chained hash of it by (index, instance, dp_rank), so that finding, adding
 * and removing a registration cost O(1) however many there are. A list walk
 * per lookup made unregistering 10,000 workers oldest-first take 6.5-8.5 s,
 * against 1.5 s newest-first (tests/api/kvidxd_faults_http_test.c).
 * All under pool->mu.
 */
static uint32_t key_bucket(const struct kvi_listeners *lp, const struct kvi_index *ix, uint32_t inst, uint32_t rank)
{
    uint64_t h = (uint64_t)(uintptr_t)ix ^ ((uint64_t)inst << 32 | rank) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return (uint32_t)h & (lp->n_bucket - 1);
}

static void hash_insert_locked(struct kvi_listeners *lp, struct listener *l)
{
    uint32_t b = key_bucket(lp, l->ix, l->instance, l->dp_rank);
    l->hnext = lp->bucket[b];
    lp->bucket[b] = l;
}

/* Grow the hash to at least twice the list's length (then rehash the list). */
static void hash_reserve_locked(struct kvi_listeners *lp, uint32_t n)
{
    if (lp->n_bucket != 0 && n <= lp->n_bucket / 2)
        return;
    uint32_t nb = lp->n_bucket ? lp->n_bucket : 64;
    while (n > nb / 2)
        nb *= 2;
    free(lp->bucket);
    lp->bucket = kvi_xcalloc(nb, sizeof *lp->bucket);
    lp->n_bucket = nb;
    for (struct listener *l = lp->list; l != NULL; l = l->next)
        hash_insert_locked(lp, l);
}

/* Find by key under pool->mu. */
static struct listener *find_locked(struct kvi_listeners *lp, const struct kvi_listener_key *k)
{
    if (k == NULL || k->ix == NULL || lp->n_bucket == 0)
        return NULL;
    int64_t inst = kvi_index_find_instance(k->ix, k->instance_name ? 0 : k->instance_id, k->instance_name);
    if (inst < 0)
        return NULL;
    for (struct listener *l = lp->bucket[key_bucket(lp, k->ix, (uint32_t)inst, k->dp_rank)]; l != NULL; l = l->hnext)
        if (key_match(l, k->ix, (uint32_t)inst, k->dp_rank))
            return l;
    return NULL;
}

static void link_locked(struct kvi_listeners *lp, struct listener *l)
{
    hash_reserve_locked(lp, lp->n_list + 1);
    l->prev = NULL;
    l->next = lp->list;
    if (lp->list != NULL)
        lp->list->prev = l;
    lp->list = l;
    lp->n_list++;
    hash_insert_locked(lp, l);
}

static void unlink_locked(struct kvi_listeners *lp, struct listener *l)
{
    if (l->prev != NULL)
        l->prev->next = l->next;
    else
        lp->list = l->next;
    if (l->next != NULL)
        l->next->prev = l->prev;
    lp->n_list--;
    for (struct listener **pp = &lp->bucket[key_bucket(lp, l->ix, l->instance, l->dp_rank)]; *pp != NULL;
         pp = &(*pp)->hnext)
        if (*pp == l) {
            *pp = l->hnext;
            break;
        }
    l->thr->load--;
    if (l->mode != KVI_LISTEN_BIND)
        return;
    for (struct bind_reg **pp = &lp->binds; *pp != NULL; pp = &(*pp)->next) {
        struct bind_reg *b = *pp;
        if (strcmp(b->endpoint, l->endpoint) == 0) {
            if (--b->refs == 0) {
                *pp = b->next;
                free(b->endpoint);
                free(b);
            }
            break;
        }
    }
}

int kvi_listeners_validate(const struct kvi_listener_spec *s, char *err, size_t errlen)
{
#define BAD(...)                                                               \
    do {                                                                       \
        if (err != NULL && errlen > 0)                                         \
            snprintf(err, errlen, __VA_ARGS__);                                \
        return -EINVAL;                                                        \
    } while (0)
    if (s == NULL || s->ix == NULL)
        BAD("no index");
    if (kvi_endpoint_validate(s->endpoint, err, errlen) != 0)
        return -EINVAL;
    if (strlen(s->endpoint) >= KVI_LISTEN_EP_MAX)
        BAD("endpoint longer than %d bytes", KVI_LISTEN_EP_MAX - 1);
    if (s->replay_endpoint != NULL && s->replay_endpoint[0] != '\0') {
        if (kvi_endpoint_validate(s->replay_endpoint, err, errlen) != 0)
            return -EINVAL;
        if (strlen(s->replay_endpoint) >= KVI_LISTEN_EP_MAX)
            BAD("replay endpoint longer than %d bytes", KVI_LISTEN_EP_MAX - 1);
    }
    if (s->topic != NULL && strlen(s->topic) >= KVI_LISTEN_NAME_MAX)
        BAD("topic longer than %d bytes", KVI_LISTEN_NAME_MAX - 1);
    if (s->instance_name != NULL && (s->instance_name[0] == '\0' || strlen(s->instance_name) >= KVI_LISTEN_NAME_MAX))
        BAD("instance name empty or longer than %d bytes", KVI_LISTEN_NAME_MAX - 1);
    if (s->mode != KVI_LISTEN_CONNECT && s->mode != KVI_LISTEN_BIND)
        BAD("unknown listen mode %d", (int)s->mode);
    if (s->gap_policy != KVI_GAP_APPLY && s->gap_policy != KVI_GAP_CLEAR)
        BAD("unknown gap policy %d", (int)s->gap_policy);
    if (s->block_size != 0 && s->block_size != kvi_index_block_size(s->ix))
        BAD("block_size mismatch: index has %u, registration says %u", kvi_index_block_size(s->ix), s->block_size);
    return 0;
#undef BAD
}

static struct lis_thread *pick_thread_locked(struct kvi_listeners *lp, const struct kvi_listener_spec *s)
{
    if (s->mode == KVI_LISTEN_BIND)
        for (struct bind_reg *b = lp->binds; b != NULL; b = b->next)
            if (strcmp(b->endpoint, s->endpoint) == 0)
                return b->thr;
    struct lis_thread *best = &lp->thr[0];
    for (uint32_t i = 1; i < lp->n_threads; i++)
        if (lp->thr[i].load < best->load)
            best = &lp->thr[i];
    return best;
}

static void listener_free(struct listener *l)
{
    kvi_ingest_target_fini(&l->tgt);
    kvi_stream_fini(&l->stream);
    free(l->instance_name);
    free(l->endpoint);
    free(l->replay_ep);
    free(l->topic);
    free(l->ranks);
    free(l);
}

int kvi_listeners_register(struct kvi_listeners *lp, const struct kvi_listener_spec *s)
{
    int rc = kvi_listeners_validate(s, NULL, 0);
    if (rc != 0)
        return rc;
    int64_t inst = kvi_index_intern_instance(s->ix, s->instance_name ? 0 : s->instance_id, s->instance_name, false);
    if (inst < 0)
        return (int)inst;

    struct listener *l = kvi_xcalloc(1, sizeof *l);
    l->lp = lp;
    l->ix = s->ix;
    l->instance_id = s->instance_name ? 0 : s->instance_id;
    l->instance_name = s->instance_name ? kvi_lis__strdup(s->instance_name) : NULL;
    l->instance = (uint32_t)inst;
    l->dp_rank = s->dp_rank;
    l->endpoint = kvi_lis__strdup(s->endpoint);
    l->replay_ep = s->replay_endpoint && s->replay_endpoint[0] ? kvi_lis__strdup(s->replay_endpoint) : NULL;
    l->topic = kvi_lis__strdup(s->topic ? s->topic : "");
    l->topic_len = strlen(l->topic);
    l->mode = (uint8_t)s->mode;
    l->exact = s->exact_topic;
    l->policy = (uint8_t)s->gap_policy;
    l->warn_budget = KVI_LIS_WARN_BUDGET;
    l->state = KVI_LISTENER_PENDING;
    if (l->instance_name)
        snprintf(l->tgt_name, sizeof l->tgt_name, "instance '%.48s' rank %u", l->instance_name, l->dp_rank);
    else
        snprintf(l->tgt_name, sizeof l->tgt_name, "instance %llu rank %u", (unsigned long long)l->instance_id,
                 l->dp_rank);
    l->tgt = (struct kvi_ingest_target){
        .ix = s->ix,
        .instance = l->instance,
        .dp_rank = s->dp_rank,
        .block_size = s->block_size,
        .group = s->group,
        .skip_tiers = s->skip_tiers,
        .warn_budget = KVI_INGEST_WARN_BUDGET,
        .name = l->tgt_name,
        .sink = &l->sink,
        .ctr = &l->ictr,
        .pub_applied = true, /* the sink names the last batch applied, for /dump */
        .mirror = s->mirror,
        .mirror_ctx = s->mirror_ctx,
    };
    rc = kvi_ingest_target_init(&l->tgt);
    if (rc != 0) {
        listener_free(l);
        return rc;
    }
    if (lp->cfg.quiet)
        l->tgt.warn_budget = 0; /* init sets the default budget when 0 */
    struct kvi_stream_cfg scfg = {
        .can_replay = l->replay_ep != NULL,
        .policy = s->gap_policy,
        .max_retries = lp->cfg.replay_retries,
        .max_buffered = lp->cfg.max_buffered,
        .timeout_ns = (uint64_t)lp->cfg.replay_timeout_ms * 1000000ull,
    };
    kvi_stream_init(&l->stream, &scfg, &kvi_lis__stream_ops, l, &l->ctr);
    if (s->seed_watermark)
        kvi_lis__seed(l, s->watermark); /* not on a thread yet: nothing else sees l */

    pthread_mutex_lock(&lp->ctl);
    pthread_mutex_lock(&lp->mu);
    bool dup = false;
    if (lp->n_bucket != 0)
        for (struct listener *o = lp->bucket[key_bucket(lp, l->ix, l->instance, l->dp_rank)]; o != NULL && !dup;
             o = o->hnext)
            dup = key_match(o, l->ix, l->instance, l->dp_rank);
    if (l->mode == KVI_LISTEN_BIND) /* a topic already bound on the endpoint */
        for (struct listener *o = lp->list; o != NULL && !dup; o = o->next)
            dup = o->mode == KVI_LISTEN_BIND && strcmp(o->endpoint, l->endpoint) == 0 &&
                  strcmp(o->topic, l->topic) == 0;
    if (dup) {
        pthread_mutex_unlock(&lp->mu);
        pthread_mutex_unlock(&lp->ctl);
        listener_free(l);
        return -EEXIST;
    }
    struct lis_thread *t = pick_thread_locked(lp, s);
    l->thr = t;
    t->load++;
    if (l->mode == KVI_LISTEN_BIND) {
        struct bind_reg *b = lp->binds;
        while (b != NULL && strcmp(b->endpoint, l->endpoint) != 0)
            b = b->next;
        if (b == NULL) {
            b = kvi_xcalloc(1, sizeof *b);
            b->endpoint = kvi_lis__strdup(l->endpoint);
            b->thr = t;
            b->next = lp->binds;
            lp->binds = b;
        }
        b->refs++;
    }
    link_locked(lp, l);
    pthread_mutex_unlock(&lp->mu);
    kvi_lis__call(t, CMD_ADD, l);
    pthread_mutex_unlock(&lp->ctl);
    return 0;
}

int kvi_listeners_bind_open(struct kvi_listeners *lp, const struct kvi_listener_bind_spec *spec)
{
    char err[128];
    if (spec == NULL || spec->endpoint == NULL || kvi_endpoint_validate(spec->endpoint, err, sizeof err) != 0 ||
        strlen(spec->endpoint) >= KVI_LISTEN_EP_MAX)
        return -EINVAL;
    const char *prefix = spec->prefix ? spec->prefix : "";
    if (strlen(prefix) >= KVI_LISTEN_NAME_MAX)
        return -EINVAL;
    struct bind_ep *be = kvi_xcalloc(1, sizeof *be);
    be->endpoint = kvi_lis__strdup(spec->endpoint);
    be->held_open = true;
    be->prefix = kvi_lis__strdup(prefix);
    be->prefix_len = strlen(prefix);
    be->on_unknown = spec->on_unknown;
    be->ctx = spec->ctx;
    be->max_held = spec->max_held ? spec->max_held : KVI_LISTEN_DEFAULT_MAX_HELD;
    be->held = kvi_xcalloc(be->max_held, sizeof *be->held);

    pthread_mutex_lock(&lp->ctl);
    pthread_mutex_lock(&lp->mu);
    struct bind_reg *b = lp->binds;
    while (b != NULL && strcmp(b->endpoint, spec->endpoint) != 0)
        b = b->next;
    if (b != NULL) {
        pthread_mutex_unlock(&lp->mu);
        pthread_mutex_unlock(&lp->ctl);
        free(be->held);
        free(be->prefix);
        free(be->endpoint);
        free(be);
        return -EEXIST;
    }
    struct kvi_listener_spec pick = {.mode = KVI_LISTEN_CONNECT}; /* the least-loaded thread */
    struct lis_thread *t = pick_thread_locked(lp, &pick);
    b = kvi_xcalloc(1, sizeof *b);
    b->endpoint = kvi_lis__strdup(spec->endpoint);
    b->thr = t;
    b->refs = 1; /* the open endpoint's own: released by kvi_listeners_bind_close */
    b->open = true;
    b->next = lp->binds;
    lp->binds = b;
    pthread_mutex_unlock(&lp->mu);
    int rc = kvi_lis__call_arg(t, CMD_BIND_OPEN, NULL, (uint64_t)(uintptr_t)be); /* frees be on failure */
    if (rc != 0) {
        pthread_mutex_lock(&lp->mu);
        for (struct bind_reg **pp = &lp->binds; *pp != NULL; pp = &(*pp)->next)
            if (*pp == b) {
                *pp = b->next;
                break;
            }
        pthread_mutex_unlock(&lp->mu);
        free(b->endpoint);
        free(b);
    }
    pthread_mutex_unlock(&lp->ctl);
    return rc;
}

int kvi_listeners_bind_close(struct kvi_listeners *lp, const char *endpoint)
{
    pthread_mutex_lock(&lp->ctl);
    pthread_mutex_lock(&lp->mu);
    struct bind_reg **pp = &lp->binds;
    while (*pp != NULL && strcmp((*pp)->endpoint, endpoint) != 0)
        pp = &(*pp)->next;
    struct bind_reg *b = *pp;
    if (b == NULL || !b->open) {
        pthread_mutex_unlock(&lp->mu);
        pthread_mutex_unlock(&lp->ctl);
        return -ENOENT;
    }
    b->open = false;
    struct lis_thread *t = b->thr;
    bool last = --b->refs == 0;
    if (last)
        *pp = b->next;
    pthread_mutex_unlock(&lp->mu);
    (void)kvi_lis__call_arg(t, CMD_BIND_CLOSE, NULL, (uint64_t)(uintptr_t)endpoint);
    pthread_mutex_unlock(&lp->ctl);
    if (last) {
        free(b->endpoint);
        free(b);
    }
    return 0;
}

/* Read l's counters (relaxed loads). */
static void read_counters(struct listener *l, struct kvi_listener_counters *c)
{
#define LOAD_CTR(name, help) c->name = atomic_load_explicit(&l->ctr.name, memory_order_relaxed);
    KVI_LISTENER_COUNTERS(LOAD_CTR)
#undef LOAD_CTR
#define LOAD_I(dst, src) c->dst = atomic_load_explicit(&l->ictr.src, memory_order_relaxed)
    LOAD_I(events_stored, events_stored);
    LOAD_I(events_removed, events_removed);
    LOAD_I(events_cleared, events_cleared);
    LOAD_I(events_unknown, events_unknown);
    LOAD_I(events_invalid, events_invalid);
    LOAD_I(placeholders, placeholders);
    LOAD_I(block_size_mismatch, block_size_mismatch);
    LOAD_I(blocks_dropped, blocks_dropped);
    LOAD_I(ops_submitted, ops_submitted);
#undef LOAD_I
    struct kvi_op_sink s;
    kvi_op_sink_read(&l->sink, &s);
    c->ops_applied = s.outcomes[KVI_OUT_APPLIED];
    c->ops_parent_not_found = s.outcomes[KVI_OUT_PARENT_NOT_FOUND];
    c->ops_invalid = s.outcomes[KVI_OUT_INVALID];
    c->unknown_blocks = s.outcomes[KVI_OUT_UNKNOWN_BLOCK];
    c->blocks_stored = s.blocks_stored;
    c->hashes_removed = s.hashes_removed;
}

static void add_counters(struct kvi_listener_counters *dst, const struct kvi_listener_counters *src)
{
#define ADD_CTR(name, help) dst->name += src->name;
    KVI_LISTENER_COUNTERS(ADD_CTR)
    KVI_LISTENER_EVENT_COUNTERS(ADD_CTR)
#undef ADD_CTR
}

int kvi_listeners_unregister(struct kvi_listeners *lp, const struct kvi_listener_key *key)
{
    pthread_mutex_lock(&lp->ctl);
    pthread_mutex_lock(&lp->mu);
    struct listener *l = find_locked(lp, key);
    if (l != NULL)
        unlink_locked(lp, l);
    pthread_mutex_unlock(&lp->mu);
    if (l == NULL) {
        pthread_mutex_unlock(&lp->ctl);
        return -ENOENT;
    }
    kvi_lis__call(l->thr, CMD_REMOVE, l);
    struct kvi_listener_counters c;
    read_counters(l, &c);
    pthread_mutex_lock(&lp->mu);
    add_counters(&lp->departed, &c);
    pthread_mutex_unlock(&lp->mu);
    pthread_mutex_unlock(&lp->ctl);
    listener_free(l);
    return 0;
}

static int pause_resume(struct kvi_listeners *lp, const struct kvi_listener_key *key, bool pause)
{
    pthread_mutex_lock(&lp->ctl);
    pthread_mutex_lock(&lp->mu);
    struct listener *l = find_locked(lp, key);
    int rc = 0;
    if (l == NULL)
        rc = -ENOENT;
    else if (pause && l->state != KVI_LISTENER_PENDING && l->state != KVI_LISTENER_ACTIVE)
        rc = -EBUSY;
    else if (!pause && l->state != KVI_LISTENER_PAUSED && l->state != KVI_LISTENER_FAILED)
        rc = -EBUSY;
    pthread_mutex_unlock(&lp->mu);
    if (rc == 0)
        kvi_lis__call(l->thr, pause ? CMD_PAUSE : CMD_RESUME, l);
    pthread_mutex_unlock(&lp->ctl);
    return rc;
}

int kvi_listeners_pause(struct kvi_listeners *lp, const struct kvi_listener_key *key)
{
    return pause_resume(lp, key, true);
}

int kvi_listeners_resume(struct kvi_listeners *lp, const struct kvi_listener_key *key)
{
    return pause_resume(lp, key, false);
}

int kvi_listeners_seed(struct kvi_listeners *lp, const struct kvi_listener_key *key, uint64_t seq)
{
    pthread_mutex_lock(&lp->ctl);
    pthread_mutex_lock(&lp->mu);
    struct listener *l = find_locked(lp, key);
    pthread_mutex_unlock(&lp->mu);
    int rc = l == NULL ? -ENOENT : kvi_lis__call_arg(l->thr, CMD_SEED, l, seq);
    pthread_mutex_unlock(&lp->ctl);
    return rc;
}

size_t kvi_listeners_applied(struct kvi_listeners *lp, struct kvi_index *ix, uint32_t part,
                             void (*fn)(void *ctx, const struct kvi_listener_applied *a), void *ctx)
{
    size_t n = 0;
    pthread_mutex_lock(&lp->mu);
    for (struct listener *l = lp->list; l != NULL; l = l->next) {
        if (l->ix != ix || kvi_index_partition_of(ix, l->instance) != part)
            continue;
        uint64_t a1 = kvi_op_sink_applied(&l->sink);
        if (a1 == 0)
            continue;
        struct kvi_listener_applied a = {l->instance_id, l->instance_name, l->dp_rank, a1 - 1};
        fn(ctx, &a);
        n++;
    }
    pthread_mutex_unlock(&lp->mu);
    return n;
}

void kvi_listeners_open_gate(struct kvi_listeners *lp)
{
    pthread_mutex_lock(&lp->ctl);
    if (!atomic_exchange_explicit(&lp->gate_open, true, memory_order_acq_rel))
        for (uint32_t i = 0; i < lp->n_threads; i++)
            kvi_lis__call(&lp->thr[i], CMD_GATE, NULL);
    pthread_mutex_unlock(&lp->ctl);
}

/* kvi_listeners_destroy's work, also for a pool kvi_listeners_create could not finish. */
static void listeners_free(struct kvi_listeners *lp)
{
    if (lp == NULL)
        return;
    for (;;) {
        pthread_mutex_lock(&lp->mu);
        struct listener *l = lp->list;
        struct kvi_listener_key k = {0};
        if (l != NULL)
            k = (struct kvi_listener_key){l->ix, l->instance_id, l->instance_name, l->dp_rank};
        pthread_mutex_unlock(&lp->mu);
        if (l == NULL)
            break;
        kvi_listeners_unregister(lp, &k);
    }
    stop_threads(lp); /* the threads free their open bind endpoints */
    while (lp->binds != NULL) {
        struct bind_reg *b = lp->binds;
        lp->binds = b->next;
        free(b->endpoint);
        free(b);
    }
    if (lp->own_zctx)
        zmq_ctx_term(lp->zctx);
    pthread_mutex_destroy(&lp->ctl);
    pthread_mutex_destroy(&lp->mu);
    free(lp->thr);
    free(lp->bucket);
    free(lp);
}

void kvi_listeners_destroy(struct kvi_listeners *lp)
{
    listeners_free(lp);
}

/* ---- inspection ----------------------------------------------------------- */

static void fill_info(struct listener *l, struct kvi_listener_info *o)
{
    memset(o, 0, sizeof *o);
    o->ix = l->ix;
    o->instance_id = l->instance_id;
    o->has_name = l->instance_name != NULL;
    if (l->instance_name)
        snprintf(o->instance_name, sizeof o->instance_name, "%s", l->instance_name);
    o->instance = l->instance;
    o->dp_rank = l->dp_rank;
    o->mode = (enum kvi_listen_mode)l->mode;
    o->gap_policy = (enum kvi_gap_policy)l->policy;
    snprintf(o->endpoint, sizeof o->endpoint, "%s", l->endpoint);
    if (l->replay_ep)
        snprintf(o->replay_endpoint, sizeof o->replay_endpoint, "%s", l->replay_ep);
    snprintf(o->topic, sizeof o->topic, "%s", l->topic);
    o->state = (enum kvi_listener_state)l->state;
    snprintf(o->last_error, sizeof o->last_error, "%s", l->last_error);
    uint64_t w1 = atomic_load_explicit(&l->pub_w1, memory_order_relaxed);
    uint64_t l1 = atomic_load_explicit(&l->pub_l1, memory_order_relaxed);
    o->watermark_set = w1 != 0;
    o->watermark = w1 ? w1 - 1 : 0;
    o->last_live_set = l1 != 0;
    o->last_live = l1 ? l1 - 1 : 0;
    o->replaying = atomic_load_explicit(&l->pub_replaying, memory_order_relaxed);
    o->thread = l->thr->idx;
    read_counters(l, &o->ctr);
    /* relaxed: each liveness field stands alone (net/listener.c DESIGN, "Published state") */
    int32_t peers = atomic_load_explicit(&l->pub_peers, memory_order_relaxed);
    o->monitored = peers >= 0;
    o->connected = peers > 0;
    o->peers = peers > 0 ? (uint32_t)peers : 0;
    uint64_t last = atomic_load_explicit(&l->pub_last_msg_ns, memory_order_relaxed);
    uint64_t now = kvi_now_ns();
    o->last_message_set = last != 0;
    o->last_message_age_ns = last != 0 && now > last ? now - last : 0;
}

int kvi_listeners_get(struct kvi_listeners *lp, const struct kvi_listener_key *key, struct kvi_listener_info *out)
{
    pthread_mutex_lock(&lp->mu);
    struct listener *l = find_locked(lp, key);
    if (l != NULL)
        fill_info(l, out);
    pthread_mutex_unlock(&lp->mu);
    return l != NULL ? 0 : -ENOENT;
}

int kvi_listeners_ranks(struct kvi_listeners *lp, const struct kvi_listener_key *key, uint32_t *out, size_t cap)
{
    pthread_mutex_lock(&lp->mu);
    struct listener *l = find_locked(lp, key);
    if (l == NULL) {
        pthread_mutex_unlock(&lp->mu);
        return -ENOENT;
    }
    size_t n = 0;
    bool own = l->own_rank_seen;
    for (uint32_t i = 0; i <= l->n_ranks; i++) { /* merge dp_rank into the sorted set */
        uint32_t r = i < l->n_ranks ? l->ranks[i] : UINT32_MAX;
        if (own && l->dp_rank <= r) {
            if (n < cap)
                out[n] = l->dp_rank;
            n++;
            own = false;
        }
        if (i < l->n_ranks) {
            if (n < cap)
                out[n] = r;
            n++;
        }
    }
    pthread_mutex_unlock(&lp->mu);
    return (int)n;
}

size_t kvi_listeners_foreach(struct kvi_listeners *lp, void (*fn)(void *ctx, const struct kvi_listener_info *info),
                             void *ctx)
{
    struct kvi_listener_info *info = kvi_xmalloc(sizeof *info);
    size_t n = 0;
    pthread_mutex_lock(&lp->mu);
    for (struct listener *l = lp->list; l != NULL; l = l->next, n++) {
        fill_info(l, info);
        fn(ctx, info);
    }
    pthread_mutex_unlock(&lp->mu);
    free(info);
    return n;
}

void kvi_listeners_totals(struct kvi_listeners *lp, struct kvi_listener_totals *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&lp->mu);
    out->ctr = lp->departed;
    for (struct listener *l = lp->list; l != NULL; l = l->next) {
        struct kvi_listener_counters c;
        read_counters(l, &c);
        add_counters(&out->ctr, &c);
        out->by_state[l->state < KVI_LISTENER_STATES ? l->state : KVI_LISTENER_FAILED]++;
        out->listeners++;
    }
    pthread_mutex_unlock(&lp->mu);
    out->threads = lp->n_threads;
    for (uint32_t i = 0; i < lp->n_threads; i++)
    {
        out->unknown_topic += atomic_load_explicit(&lp->thr[i].unknown_topic, memory_order_relaxed);
        out->held_dropped += atomic_load_explicit(&lp->thr[i].held_dropped, memory_order_relaxed);
    }
    uint32_t nw = kvi_writer_pool_size(lp->writers);
    for (uint32_t w = 0; w < nw; w++) {
        struct kvi_writer_stats ws;
        kvi_writer_stats(lp->writers, w, &ws);
        out->writer_stalls += ws.stalls;
    }
}

void kvi_listeners_set_max_ranks(struct kvi_listeners *lp, uint32_t max_ranks)
{
    /* relaxed: a setting on its own; listener threads read it per new rank (net/listener.c DESIGN) */
    atomic_store_explicit(&lp->max_ranks, max_ranks ? max_ranks : KVI_LISTEN_MAX_RANKS_DEFAULT, memory_order_relaxed);
}

uint32_t kvi_listeners_max_ranks(const struct kvi_listeners *lp)
{
    return atomic_load_explicit(&lp->max_ranks, memory_order_relaxed); /* relaxed: as above */
}

uint32_t kvi_listeners_threads(const struct kvi_listeners *lp)
{
    return lp->n_threads;
}

void kvi_listener_thread_stats(struct kvi_listeners *lp, uint32_t i, struct kvi_listener_thread_stats *o)
{
    memset(o, 0, sizeof *o);
    if (i >= lp->n_threads)
        return;
    struct lis_thread *t = &lp->thr[i];
    o->listeners = atomic_load_explicit(&t->n_listeners, memory_order_relaxed);
    o->sockets = atomic_load_explicit(&t->n_sockets, memory_order_relaxed);
    o->wakeups = atomic_load_explicit(&t->wakeups, memory_order_relaxed);
    o->messages = atomic_load_explicit(&t->messages, memory_order_relaxed);
    o->decode_ns = atomic_load_explicit(&t->decode_ns, memory_order_relaxed);
    o->ingest_ns = atomic_load_explicit(&t->ingest_ns, memory_order_relaxed);
    o->busy_ns = atomic_load_explicit(&t->busy_ns, memory_order_relaxed);
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(t->tid, &cid) == 0 && clock_gettime(cid, &ts) == 0)
        o->cpu_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
