/*
 * The ZMQ -> JetStream bridge (contract and DESIGN in net/nats_bridge.h).
 *
 * DESIGN
 *   Listener threads (producers) -> mu-protected FIFO of encoded messages
 *   -> one bridge thread (consumer) -> js_PublishMsgAsync -> libnats'
 *   reply thread -> on_ack (counters; a failed message goes back to the
 *   FIFO's head). The FIFO's lock is held for a pointer swap only: no
 *   encoding and no NATS call under it. Counters are relaxed atomics read
 *   by /metrics (approximate while running).
 *
 *   | state                       | written by              | lock          |
 *   |-----------------------------|-------------------------|---------------|
 *   | FIFO, q_n, q_bytes, stop    | listeners, bridge, ack  | mu            |
 *   | workers, namespaces         | control plane           | wmu           |
 *   | worker resume state         | control plane (before   | - (the        |
 *   |                             | registration), then its | registration  |
 *   |                             | listener thread         | hands it on)  |
 *   | counters                    | any                     | atomics       |
 */
#include "net/nats_bridge.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/common.h"
#include "net/log.h"
#include "net/nats_conn.h"
#include "net/router_event.h"

#define BR_NAME_MAX 256           /* stream name */
#define BR_SUBJ_MAX 1200          /* STREAM + hex model + hex tenant + ids */
#define BR_ID_MAX 112             /* Nats-Msg-Id */
#define BR_IDX_MAX ((1u << 20) - 1) /* events bridged per batch */
#define BR_TAKE 1024              /* nodes taken off the FIFO at a time */
#define BR_ACK_STALL_NS (10ull * 1000000000ull)
#define BR_DROP_LOG_NS (10ull * 1000000000ull)
#define BR_STACK_BLOCKS 128

/* One encoded message. */
struct bnode {
    struct bnode *next;
    const char *subject; /* the worker's (lives until destroy) */
    char id[BR_ID_MAX];
    size_t len;
    uint8_t data[];
};

struct bns {
    char *model, *tenant;
    char *subject; /* STREAM.<hex model>.<hex tenant>.> (heap: views keep pointing at it) */
};

struct kvi_bridge_worker {
    struct kvi_nats_bridge *b;
    uint64_t worker_id;
    uint32_t rank;
    size_t ns;
    char subject[BR_SUBJ_MAX];
    char *model, *tenant, *name; /* identity (name NULL: numeric) */
    /* RESUME: the registration's listener thread after the hand-over */
    bool resume_armed;
    uint64_t resume_seq;
    uint32_t resume_idx1; /* index + 1 of the last event of resume_seq in the stream (0: none) */
    /* the current batch's messages, queued at its end with one lock (listener thread) */
    struct bnode *lhead, *ltail;
    uint64_t ln, lbytes;
    /* rank resets not published yet (RESETS in the header): listener thread */
    uint32_t *resets;
    uint32_t n_resets, cap_resets;
};

struct kvi_nats_bridge {
    struct kvi_nats *plane;
    char stream[BR_NAME_MAX];
    uint64_t max_bytes;
    jsCtx *js;
    pthread_t tid;
    bool started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct bnode *head, *tail;
    uint64_t q_n, q_bytes;
    bool stop;
    uint64_t last_drop_log_ns;

    pthread_mutex_t wmu;
    struct kvi_bridge_worker **workers;
    size_t n_workers, cap_workers;
    struct bns *ns;
    size_t n_ns, cap_ns;

    _Atomic bool stream_ready;
    _Atomic uint64_t events, published, acked, duplicates, errors, resent, dropped, skipped, resumed_skipped,
        pending;
};

#define RELAXED_ADD(f, v) atomic_fetch_add_explicit(&(f), (uint64_t)(v), memory_order_relaxed)
#define RELAXED_LOAD(f) atomic_load_explicit(&(f), memory_order_relaxed)

/* ---- names ------------------------------------------------------------------ */

static char *br_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kvi_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

uint64_t kvi_nats_bridge_worker_id(const char *instance_name)
{
    return XXH3_64bits_withSeed(instance_name, strlen(instance_name), 0) | (1ull << 63);
}

/* Lower-case hex of @p s ("-" when empty) at @p w; returns the end. */
static char *hex_token(char *w, const char *s)
{
    if (*s == '\0') {
        *w++ = '-';
        return w;
    }
    return kvi_hex_lower(w, s, strlen(s));
}

/* A stream name: not empty, no '.', '*', '>', white space or '/' (JetStream's rules). */
static bool stream_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= BR_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '.' || s[i] == '*' || s[i] == '>' || s[i] == '/' || s[i] == '\\' || (unsigned char)s[i] <= ' ')
            return false;
    return true;
}

/* ---- FIFO ------------------------------------------------------------------- */

/* Put a node back at the FIFO's head (a failed or taken-back publish: already counted in the bound's
 * budget once, so not refused; at most KVI_BRIDGE_MAX_PENDING of them at a time). */
static void fifo_requeue(struct kvi_nats_bridge *b, struct bnode *n)
{
    pthread_mutex_lock(&b->mu);
    n->next = b->head;
    b->head = n;
    if (b->tail == NULL)
        b->tail = n;
    b->q_n++;
    b->q_bytes += n->len;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Append a chain of @p n nodes, @p bytes in all, or drop it whole past max_bytes. @return appended? */
static bool fifo_append_chain(struct kvi_nats_bridge *b, struct bnode *first, struct bnode *last, uint64_t n,
                              uint64_t bytes)
{
    pthread_mutex_lock(&b->mu);
    if (b->q_bytes + bytes > b->max_bytes) {
        uint64_t now = kvi_now_ns();
        bool log = now - b->last_drop_log_ns >= BR_DROP_LOG_NS;
        if (log)
            b->last_drop_log_ns = now;
        uint64_t qb = b->q_bytes;
        pthread_mutex_unlock(&b->mu);
        if (log)
            kvi_log_warn("nats bridge %s: %" PRIu64 " bytes wait for NATS (the bound): events are dropped "
                         "(kvidx_nats_bridge_dropped_total)",
                         b->stream, qb);
        return false;
    }
    last->next = NULL;
    if (b->tail)
        b->tail->next = first;
    else
        b->head = first;
    b->tail = last;
    b->q_n += n;
    b->q_bytes += bytes;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return true;
}

/* Put a chain (first .. its end) back at the head, in order. */
static void fifo_unshift(struct kvi_nats_bridge *b, struct bnode *first)
{
    if (first == NULL)
        return;
    uint64_t n = 0, bytes = 0;
    struct bnode *last = first;
    for (struct bnode *x = first;; x = x->next) {
        n++;
        bytes += x->len;
        last = x;
        if (x->next == NULL)
            break;
    }
    pthread_mutex_lock(&b->mu);
    last->next = b->head;
    b->head = first;
    if (b->tail == NULL)
        b->tail = last;
    b->q_n += n;
    b->q_bytes += bytes;
    pthread_mutex_unlock(&b->mu);
}

/* Take up to BR_TAKE nodes (waits up to @p wait_ms for one). */
static struct bnode *fifo_take(struct kvi_nats_bridge *b, int wait_ms)
{
    pthread_mutex_lock(&b->mu);
    if (b->head == NULL && !b->stop && wait_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    struct bnode *first = b->head, *x = first, *prev = NULL;
    uint32_t k = 0;
    while (x != NULL && k < BR_TAKE) {
        b->q_n--;
        b->q_bytes -= x->len;
        prev = x;
        x = x->next;
        k++;
    }
    if (prev != NULL)
        prev->next = NULL;
    b->head = x;
    if (x == NULL)
        b->tail = NULL;
    pthread_mutex_unlock(&b->mu);
    return first;
}

static struct bnode *node_new(const char *subject, size_t len)
{
    struct bnode *n = malloc(sizeof *n + len);
    if (n == NULL)
        return NULL;
    n->next = NULL;
    n->subject = subject;
    n->len = len;
    n->id[0] = '\0';
    return n;
}

/* A node back from a libnats message (a failed or taken-back publish); NULL when out of memory. */
static struct bnode *node_from_msg(struct kvi_nats_bridge *b, natsMsg *m)
{
    const char *subj = natsMsg_GetSubject(m);
    const char *id = NULL;
    natsMsgHeader_Get(m, "Nats-Msg-Id", &id);
    /* the subject must outlive the node: find the worker's copy */
    const char *keep = NULL;
    pthread_mutex_lock(&b->wmu);
    for (size_t i = 0; i < b->n_workers && keep == NULL; i++)
        if (strcmp(b->workers[i]->subject, subj) == 0)
            keep = b->workers[i]->subject;
    pthread_mutex_unlock(&b->wmu);
    if (keep == NULL)
        return NULL;
    int len = natsMsg_GetDataLength(m);
    struct bnode *n = node_new(keep, (size_t)len);
    if (n == NULL)
        return NULL;
    memcpy(n->data, natsMsg_GetData(m), (size_t)len);
    snprintf(n->id, sizeof n->id, "%s", id ? id : "");
    return n;
}

/* ---- libnats callbacks ------------------------------------------------------------ */

/* libnats' reply thread: an ack or an error for one async publish. */
static void on_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    struct kvi_nats_bridge *b = closure;
    atomic_fetch_sub_explicit(&b->pending, 1, memory_order_relaxed);
    if (pa != NULL) {
        if (pa->Duplicate)
            RELAXED_ADD(b->duplicates, 1);
        else
            RELAXED_ADD(b->acked, 1);
    } else {
        RELAXED_ADD(b->errors, 1);
        struct bnode *n = msg ? node_from_msg(b, msg) : NULL;
        if (n != NULL)
            fifo_requeue(b, n);
        else
            RELAXED_ADD(b->dropped, 1);
        kvi_log_debug("nats bridge %s: publish failed (%s): queued again", b->stream,
                      pae && pae->ErrText ? pae->ErrText : natsStatus_GetText(pae ? pae->Err : NATS_ERR));
    }
    natsMsg_Destroy(msg);
}

/* ---- the bridge thread ------------------------------------------------------------------ */

static bool stream_ensure(struct kvi_nats_bridge *b)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 2000;
    natsStatus s = js_GetStreamInfo(&si, b->js, b->stream, &jo, &jerr);
    if (s == NATS_OK) {
        jsStreamInfo_Destroy(si);
        return true;
    }
    if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr)
        return false;
    char subj[BR_NAME_MAX + 3];
    snprintf(subj, sizeof subj, "%s.>", b->stream);
    const char *subjects[1] = {subj};
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = b->stream;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    sc.Duplicates = (int64_t)KVI_BRIDGE_DUP_WINDOW_NS;
    jerr = 0;
    s = js_AddStream(&si, b->js, &sc, &jo, &jerr);
    if (s == NATS_OK) {
        jsStreamInfo_Destroy(si);
        kvi_log_info("nats bridge: stream %s created (subjects %s, file storage, duplicate window %llu s)",
                     b->stream, subj, (unsigned long long)(KVI_BRIDGE_DUP_WINDOW_NS / 1000000000ull));
        return true;
    }
    return jerr == JSStreamNameExistErr; /* created meanwhile by another replica */
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Publish a chain; returns the nodes not handed to libnats (to go back to the FIFO). */
static struct bnode *publish_chain(struct kvi_nats_bridge *b, struct bnode *x)
{
    while (x != NULL) {
        natsMsg *m = NULL;
        natsStatus s = natsMsg_Create(&m, x->subject, NULL, (const char *)x->data, (int)x->len);
        if (s == NATS_OK && x->id[0] != '\0')
            s = natsMsgHeader_Set(m, "Nats-Msg-Id", x->id);
        if (s == NATS_OK) {
            atomic_fetch_add_explicit(&b->pending, 1, memory_order_relaxed);
            s = js_PublishMsgAsync(b->js, &m, NULL);
            if (s != NATS_OK)
                atomic_fetch_sub_explicit(&b->pending, 1, memory_order_relaxed);
        }
        if (s == NATS_MAX_PAYLOAD) {
            /* larger than the server accepts: it never will (about 9,000 blocks in one event) */
            natsMsg_Destroy(m);
            RELAXED_ADD(b->errors, 1);
            RELAXED_ADD(b->dropped, 1);
            kvi_log_warn("nats bridge %s: event %s (%zu bytes) exceeds the server's max_payload: dropped", b->stream,
                         x->id, x->len);
            struct bnode *next = x->next;
            free(x);
            x = next;
            continue;
        }
        if (s != NATS_OK) {
            natsMsg_Destroy(m); /* NULL after a successful hand-over */
            return x;
        }
        RELAXED_ADD(b->published, 1);
        struct bnode *next = x->next;
        free(x);
        x = next;
    }
    return NULL;
}

/* Acks missing for long while connected: take the pending messages back and send them again. */
static void resend_stalled(struct kvi_nats_bridge *b)
{
    natsMsgList pl = {0};
    if (js_PublishAsyncGetPendingList(&pl, b->js) != NATS_OK)
        return;
    atomic_fetch_sub_explicit(&b->pending, (uint64_t)pl.Count, memory_order_relaxed);
    for (int i = 0; i < pl.Count; i++) {
        struct bnode *n = node_from_msg(b, pl.Msgs[i]);
        if (n != NULL)
            fifo_requeue(b, n);
        else
            RELAXED_ADD(b->dropped, 1);
    }
    RELAXED_ADD(b->resent, (uint64_t)pl.Count);
    kvi_log_warn("nats bridge %s: no ack for %d publishes in %llu s: sent again", b->stream, pl.Count,
                 (unsigned long long)(BR_ACK_STALL_NS / 1000000000ull));
    natsMsgList_Destroy(&pl);
}

static void *bridge_main(void *arg)
{
    struct kvi_nats_bridge *b = arg;
    pthread_setname_np(pthread_self(), "kvi-nats-bridge");
    uint64_t last_done = 0, last_change_ns = kvi_now_ns(), last_errors = 0;
    bool warned = false;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        bool stop = b->stop;
        pthread_mutex_unlock(&b->mu);
        if (stop)
            break;
        if (!atomic_load_explicit(&b->stream_ready, memory_order_acquire)) {
            if (stream_ensure(b)) {
                atomic_store_explicit(&b->stream_ready, true, memory_order_release);
            } else {
                if (!warned)
                    kvi_log_warn("nats bridge: stream %s not reachable yet: events wait (bounded), retried",
                                 b->stream);
                warned = true;
                sleep_ms(500);
                continue;
            }
        }
        /* failed publishes come back at the queue's head: not faster than 10 rounds a second */
        uint64_t errors = RELAXED_LOAD(b->errors);
        if (errors != last_errors) {
            last_errors = errors;
            sleep_ms(100);
        }
        struct bnode *chain = fifo_take(b, 200);
        struct bnode *left = publish_chain(b, chain);
        if (left != NULL) {
            fifo_unshift(b, left);
            sleep_ms(50);
        }
        /* ack stall (N1: approximate counters are enough for a 10 s rule) */
        uint64_t done = RELAXED_LOAD(b->acked) + RELAXED_LOAD(b->duplicates) + RELAXED_LOAD(b->errors);
        uint64_t now = kvi_now_ns();
        if (done != last_done || RELAXED_LOAD(b->pending) == 0) {
            last_done = done;
            last_change_ns = now;
        } else if (now - last_change_ns >= BR_ACK_STALL_NS && natsConnection_Status(kvi_nats__connection(b->plane)) ==
                                                                  NATS_CONN_STATUS_CONNECTED) {
            resend_stalled(b);
            last_change_ns = now;
        }
    }
    /* shutdown: what is queued, for up to 0.4 s plus 0.3 s for the acks (kvidxd stops within 2 s) */
    uint64_t until = kvi_now_ns() + 400000000ull;
    while (atomic_load_explicit(&b->stream_ready, memory_order_acquire) && kvi_now_ns() < until) {
        struct bnode *chain = fifo_take(b, 0);
        if (chain == NULL)
            break;
        struct bnode *left = publish_chain(b, chain);
        if (left != NULL) {
            fifo_unshift(b, left);
            sleep_ms(50);
        }
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 300;
    (void)js_PublishAsyncComplete(b->js, &po);
    return NULL;
}

/* ---- public API ---------------------------------------------------------------------- */

struct kvi_nats_bridge *kvi_nats_bridge_create(struct kvi_nats *n, const char *stream, uint64_t max_bytes)
{
    if (n == NULL || stream == NULL || !stream_ok(stream)) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_nats_bridge *b = kvi_xcalloc(1, sizeof *b);
    b->plane = n;
    snprintf(b->stream, sizeof b->stream, "%s", stream);
    b->max_bytes = max_bytes ? max_bytes : KVI_BRIDGE_DEFAULT_MAX_BYTES;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    pthread_mutex_init(&b->wmu, NULL);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    jo.PublishAsync.MaxPending = KVI_BRIDGE_MAX_PENDING;
    jo.PublishAsync.AckHandler = on_ack;
    jo.PublishAsync.AckHandlerClosure = b;
    jo.PublishAsync.StallWait = 500;
    int err = ENOMEM;
    if (natsConnection_JetStream(&b->js, kvi_nats__connection(n), &jo) != NATS_OK) {
        goto fail;
    }
    err = pthread_create(&b->tid, NULL, bridge_main, b);
    if (err != 0)
        goto fail;
    b->started = true;
    return b;
fail:
    kvi_nats_bridge_destroy(b);
    errno = err;
    return NULL;
}

void kvi_nats_bridge_destroy(struct kvi_nats_bridge *b)
{
    if (b == NULL)
        return;
    if (b->started) {
        pthread_mutex_lock(&b->mu);
        b->stop = true;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->tid, NULL);
    }
    jsCtx_Destroy(b->js); /* no ack callback runs after this */
    for (struct bnode *x = b->head, *nx; x != NULL; x = nx) {
        nx = x->next;
        free(x);
    }
    for (size_t i = 0; i < b->n_workers; i++) {
        free(b->workers[i]->model);
        free(b->workers[i]->tenant);
        free(b->workers[i]->name);
        free(b->workers[i]->resets);
        for (struct bnode *x = b->workers[i]->lhead, *nx; x != NULL; x = nx) {
            nx = x->next;
            free(x);
        }
        free(b->workers[i]);
    }
    free(b->workers);
    for (size_t i = 0; i < b->n_ns; i++) {
        free(b->ns[i].model);
        free(b->ns[i].tenant);
        free(b->ns[i].subject);
    }
    free(b->ns);
    pthread_mutex_destroy(&b->wmu);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static bool same(const char *a, const char *c)
{
    return (a == NULL && c == NULL) || (a != NULL && c != NULL && strcmp(a, c) == 0);
}

/* The namespace's index in b->ns (added, and logged, when new). wmu held. */
static size_t ns_get(struct kvi_nats_bridge *b, const char *model, const char *tenant)
{
    for (size_t i = 0; i < b->n_ns; i++)
        if (strcmp(b->ns[i].model, model) == 0 && strcmp(b->ns[i].tenant, tenant) == 0)
            return i;
    if (b->n_ns == b->cap_ns) {
        b->cap_ns = b->cap_ns ? 2 * b->cap_ns : 8;
        struct bns *nn = realloc(b->ns, b->cap_ns * sizeof *nn);
        KVI_ASSERT(nn != NULL);
        b->ns = nn;
    }
    struct bns *s = &b->ns[b->n_ns];
    s->model = br_strdup(model);
    s->tenant = br_strdup(tenant);
    s->subject = kvi_xmalloc(BR_SUBJ_MAX);
    char *w = s->subject + sprintf(s->subject, "%s.", b->stream);
    w = hex_token(w, model);
    *w++ = '.';
    w = hex_token(w, tenant);
    strcpy(w, ".>");
    kvi_log_info("nats bridge: model '%s' tenant '%s' is published to stream %s, subjects %s: a query-only "
                 "replica reads it with --nats-stream '%s/%s=%s:%s@BLOCK_SIZE'",
                 model, tenant, b->stream, s->subject, b->stream, s->subject, model, tenant);
    return b->n_ns++;
}

struct kvi_bridge_worker *kvi_nats_bridge_worker(struct kvi_nats_bridge *b, const char *model, const char *tenant,
                                                 uint64_t instance_id, const char *instance_name,
                                                 uint32_t dp_rank)
{
    if (strlen(model) + strlen(tenant) > (BR_SUBJ_MAX - BR_NAME_MAX - 64) / 2) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    pthread_mutex_lock(&b->wmu);
    for (size_t i = 0; i < b->n_workers; i++) {
        struct kvi_bridge_worker *w = b->workers[i];
        if (w->rank == dp_rank && w->worker_id == (instance_name ? kvi_nats_bridge_worker_id(instance_name)
                                                                  : instance_id) &&
            same(w->name, instance_name) && strcmp(w->model, model) == 0 && strcmp(w->tenant, tenant) == 0) {
            pthread_mutex_unlock(&b->wmu);
            return w;
        }
    }
    if (b->n_workers == b->cap_workers) {
        b->cap_workers = b->cap_workers ? 2 * b->cap_workers : 16;
        struct kvi_bridge_worker **nw = realloc(b->workers, b->cap_workers * sizeof *nw);
        KVI_ASSERT(nw != NULL);
        b->workers = nw;
    }
    struct kvi_bridge_worker *w = kvi_xcalloc(1, sizeof *w);
    w->b = b;
    w->worker_id = instance_name ? kvi_nats_bridge_worker_id(instance_name) : instance_id;
    w->rank = dp_rank;
    w->model = br_strdup(model);
    w->tenant = br_strdup(tenant);
    w->name = instance_name ? br_strdup(instance_name) : NULL;
    w->ns = ns_get(b, model, tenant);
    size_t pl = strlen(b->ns[w->ns].subject) - 1; /* without the '>' */
    snprintf(w->subject, sizeof w->subject, "%.*s%" PRIu64 ".%" PRIu32, (int)pl, b->ns[w->ns].subject,
             w->worker_id, dp_rank);
    b->workers[b->n_workers++] = w;
    pthread_mutex_unlock(&b->wmu);
    return w;
}

int kvi_nats_bridge_resume(struct kvi_nats_bridge *b, struct kvi_bridge_worker *w, bool *has_seed,
                           uint64_t *seed_watermark)
{
    *has_seed = false;
    w->resume_armed = false;
    if (natsConnection_Status(kvi_nats__connection(b->plane)) != NATS_CONN_STATUS_CONNECTED) {
        /* no 2 s wait per registration while NATS is away */
        kvi_log_warn("nats bridge %s: NATS unreachable: %s starts at the engine's next batch, without reading "
                     "back what the stream holds",
                     b->stream, w->subject);
        return -ENOTCONN;
    }
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 2000;
    natsStatus s = js_GetLastMsg(&m, b->js, b->stream, w->subject, &jo, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr || jerr == JSStreamNotFoundErr) {
        kvi_log_debug("nats bridge %s: nothing of %s in the stream yet (%s, %d)", b->stream, w->subject, natsStatus_GetText(s), (int)jerr);
        return 0;
    }
    if (s != NATS_OK) {
        kvi_log_warn("nats bridge %s: cannot read back the last event of %s (%s): the listener starts at the "
                     "engine's next batch",
                     b->stream, w->subject, natsStatus_GetText(s));
        return -EIO;
    }
    const char *id = NULL;
    uint64_t wid = 0, seq = 0;
    uint32_t rank = 0, idx = 0;
    int rc = 0;
    int got = 0;
    if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) == NATS_OK && id != NULL)
        got = sscanf(id, "kvb.%" SCNu64 ".%" SCNu32 ".%" SCNu64 ".%" SCNu32, &wid, &rank, &seq, &idx);
    /* an event (4 numbers), or a "cleared" (".c<k>" after the seq: nothing of that seq's batch yet) */
    bool cleared = got == 3 && strstr(id, ".c") != NULL;
    if ((got == 4 || cleared) && wid == w->worker_id && rank == w->rank) {
        w->resume_armed = true;
        w->resume_seq = seq;
        w->resume_idx1 = cleared ? 0 : idx + 1;
        if (seq > 0) {
            *has_seed = true;
            *seed_watermark = seq - 1;
        }
        kvi_log_info("nats bridge %s: %s resumes after seq %" PRIu64 " event %" PRIu32
                     " (the engine's replay ring brings the rest)",
                     b->stream, w->subject, seq, w->resume_idx1);
        rc = 1;
    }
    natsMsg_Destroy(m);
    return rc;
}

static const char *op_tier(const struct kvi_op *op)
{
    return kvp_re_tier(kvi_tier_name((enum kvi_tier)op->tier));
}

/* Encode one op into a node; NULL when it has no RouterEvent form. */
static struct bnode *encode(struct kvi_bridge_worker *w, const struct kvi_op *op, const struct kvp_re_head *h)
{
    struct bnode *n = NULL;
    switch ((enum kvi_op_type)op->type) {
    case KVI_OP_STORE: {
        if (op->seq != NULL)
            return NULL;
        uint64_t sb[BR_STACK_BLOCKS], st[BR_STACK_BLOCKS];
        uint64_t *bh = sb, *th = st;
        if (op->n > BR_STACK_BLOCKS) {
            bh = malloc(2 * (size_t)op->n * sizeof *bh);
            if (bh == NULL)
                return NULL;
            th = bh + op->n;
        }
        for (uint32_t i = 0; i < op->n; i++) {
            bh[i] = op->blocks[i].engine_hash;
            th[i] = op->blocks[i].content_hash;
        }
        n = node_new(w->subject, kvp_re_stored_max(op->n));
        if (n != NULL)
            n->len = (size_t)(kvp_re_stored(n->data, KVP_RE_JSON, h, op->has_parent ? &op->parent_engine_hash : NULL,
                                            bh, th, op->n) -
                              n->data);
        if (bh != sb)
            free(bh);
        return n;
    }
    case KVI_OP_REMOVE:
        n = node_new(w->subject, kvp_re_removed_max(op->n));
        if (n != NULL)
            n->len = (size_t)(kvp_re_removed(n->data, KVP_RE_JSON, h, op->hashes, op->n) - n->data);
        return n;
    case KVI_OP_CLEAR_DP_RANK:
    case KVI_OP_REMOVE_DP_RANK:
        n = node_new(w->subject, kvp_re_cleared_max());
        if (n != NULL)
            n->len = (size_t)(kvp_re_cleared(n->data, KVP_RE_JSON, h) - n->data);
        return n;
    default:
        return NULL;
    }
}

/* Encode one event and queue it (or count it dropped / skipped). */
static void publish_one(struct kvi_bridge_worker *w, const struct kvi_op *op, uint64_t event_id, const char *id)
{
    struct kvi_nats_bridge *b = w->b;
    struct kvp_re_head h = {
        .worker_id = w->worker_id,
        .tier = op_tier(op),
        .event_id = event_id,
        .dp_rank = op->dp_rank,
    };
    struct bnode *n = encode(w, op, &h);
    if (n == NULL) {
        RELAXED_ADD(b->skipped, 1);
        return;
    }
    snprintf(n->id, sizeof n->id, "%s", id);
    n->next = NULL;
    if (w->ltail)
        w->ltail->next = n;
    else
        w->lhead = n;
    w->ltail = n;
    w->ln++;
    w->lbytes += n->len;
}

/* The batch is complete: its messages go to the FIFO under one lock (or are dropped together). */
static void flush_local(struct kvi_bridge_worker *w)
{
    struct kvi_nats_bridge *b = w->b;
    if (w->lhead == NULL)
        return;
    if (fifo_append_chain(b, w->lhead, w->ltail, w->ln, w->lbytes)) {
        RELAXED_ADD(b->events, w->ln);
    } else {
        for (struct bnode *x = w->lhead, *nx; x != NULL; x = nx) {
            nx = x->next;
            free(x);
        }
        RELAXED_ADD(b->dropped, w->ln);
    }
    w->lhead = w->ltail = NULL;
    w->ln = w->lbytes = 0;
}

/* RESETS: the pending "cleared" of each reset rank, named by the batch that follows them. */
static void publish_resets(struct kvi_bridge_worker *w, const struct kvi_ingest_mirror_pos *pos)
{
    struct kvi_op *op = kvi_op_alloc(0, false);
    op->type = KVI_OP_CLEAR_DP_RANK;
    op->tier = KVI_TIER_GPU;
    for (uint32_t k = 0; k < w->n_resets; k++) {
        op->dp_rank = w->resets[k];
        char id[BR_ID_MAX];
        snprintf(id, sizeof id, "kvb.%" PRIu64 ".%" PRIu32 ".%" PRIu64 ".c%" PRIu32 ".%016" PRIx64, w->worker_id,
                 w->rank, pos->seq, k, pos->tag);
        publish_one(w, op, (pos->seq + 1) << 20, id);
    }
    kvi_op_free(op);
    w->n_resets = 0;
}

void kvi_nats_bridge_mirror(void *ctx, const struct kvi_op *op, const struct kvi_ingest_mirror_pos *pos)
{
    struct kvi_bridge_worker *w = ctx;
    struct kvi_nats_bridge *b = w->b;
    if (op == NULL) {
        flush_local(w);
        return;
    }
    if (pos->reset) {
        w->resume_armed = false; /* the stream starts over: nothing of it is in the stream yet */
        for (uint32_t k = 0; k < w->n_resets; k++)
            if (w->resets[k] == op->dp_rank)
                return;
        if (w->n_resets == w->cap_resets) {
            w->cap_resets = w->cap_resets ? 2 * w->cap_resets : 4;
            uint32_t *nr = realloc(w->resets, w->cap_resets * sizeof *nr);
            KVI_ASSERT(nr != NULL);
            w->resets = nr;
        }
        w->resets[w->n_resets++] = op->dp_rank;
        return;
    }
    if (w->resume_armed) {
        if (pos->seq < w->resume_seq || (pos->seq == w->resume_seq && pos->idx < w->resume_idx1)) {
            RELAXED_ADD(b->resumed_skipped, 1);
            return;
        }
        w->resume_armed = false;
    }
    if (w->n_resets > 0)
        publish_resets(w, pos);
    if (pos->idx >= BR_IDX_MAX) {
        RELAXED_ADD(b->skipped, 1);
        return;
    }
    char id[BR_ID_MAX];
    snprintf(id, sizeof id, "kvb.%" PRIu64 ".%" PRIu32 ".%" PRIu64 ".%" PRIu32 ".%016" PRIx64, w->worker_id, w->rank,
             pos->seq, pos->idx, pos->tag);
    publish_one(w, op, ((pos->seq + 1) << 20) | (pos->idx + 1), id);
}

void kvi_nats_bridge_stats(struct kvi_nats_bridge *b, struct kvi_nats_bridge_stats *out)
{
    *out = (struct kvi_nats_bridge_stats){
        .events = RELAXED_LOAD(b->events),
        .published = RELAXED_LOAD(b->published),
        .acked = RELAXED_LOAD(b->acked),
        .duplicates = RELAXED_LOAD(b->duplicates),
        .errors = RELAXED_LOAD(b->errors),
        .resent = RELAXED_LOAD(b->resent),
        .dropped = RELAXED_LOAD(b->dropped),
        .skipped = RELAXED_LOAD(b->skipped),
        .resumed_skipped = RELAXED_LOAD(b->resumed_skipped),
        .pending = RELAXED_LOAD(b->pending),
        .stream_ready = atomic_load_explicit(&b->stream_ready, memory_order_relaxed),
    };
    pthread_mutex_lock(&b->mu);
    out->queued = b->q_n;
    out->queued_bytes = b->q_bytes;
    pthread_mutex_unlock(&b->mu);
}

const char *kvi_nats_bridge_stream(const struct kvi_nats_bridge *b)
{
    return b->stream;
}

size_t kvi_nats_bridge_ns_list(struct kvi_nats_bridge *b, struct kvi_nats_bridge_ns_view *out, size_t cap)
{
    pthread_mutex_lock(&b->wmu);
    size_t n = b->n_ns;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = (struct kvi_nats_bridge_ns_view){b->ns[i].model, b->ns[i].tenant, b->ns[i].subject};
    pthread_mutex_unlock(&b->wmu);
    return n;
}
