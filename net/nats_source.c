/*
 * NATS event sources (net/nats_source.h): one thread per source, receiving
 * (core: a synchronous subscription; stream: a durable pull consumer),
 * decoding, ordering per (worker_id, dp_rank) and applying through the
 * thread's writer-pool producer.
 *
 * DESIGN
 *   Everything a message touches belongs to its source's thread: the
 *   decoder, the producer, the workers (ingest targets) and the (worker,
 *   rank) order state, found through two open-addressing maps the thread
 *   alone mutates. Other threads read workers only through
 *   kvi_nats_foreach_worker under the source's mutex, which the thread
 *   takes when it adds or removes one (never per message). Counters are
 *   relaxed atomics written by the thread alone.
 *
 *   Control reaches a thread through a one-slot command (forget a worker)
 *   under the mutex; the thread polls it between receives (a receive waits
 *   at most POLL_MS) and signals the condition variable when done. Stop is
 *   an atomic flag read at the same points.
 *
 *   Memory-ordering edges:
 *     C1  the command's fields are written under the mutex before `cmd` is
 *         set; the thread reads them under the same mutex.
 *     S1  `stop` (relaxed): a late read only delays the exit by one poll.
 */
#include "net/nats_source.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/hash.h"
#include "net/ingest.h"
#include "net/log.h"
#include "net/nats_conn.h"

#define POLL_MS 200               /* longest receive wait: bounds command and stop latency */
#define RETRY_MS_MAX 2000         /* consumer set-up retry backoff ceiling */
#define WARN_BUDGET 8             /* decode warnings per source */

/* One (worker_id, dp_rank): its order state. */
struct rank_state {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t worker;        /* index in src->workers */
    bool has_last;
    bool has_pub;
    _Atomic uint64_t last_id; /* (read by kvi_nats_foreach_worker without the thread's help) */
    uint64_t publisher_id;
    _Atomic uint64_t events;
    _Atomic uint64_t last_ns;
};

/* One worker_id: its ingest target (instance = the interned worker id). */
struct worker {
    uint64_t worker_id;
    struct kvi_ingest_target t;
    char name[48];
};

struct source {
    struct kvi_nats *plane;
    uint32_t index;
    enum kvi_nats_kind kind;
    char subject[KVI_NATS_NAME_MAX];
    char filter[KVI_NATS_NAME_MAX]; /* stream: the filter subject as configured ("" = none) */
    char stream[KVI_NATS_NAME_MAX];
    char label[KVI_NATS_NAME_MAX];
    struct kvi_index *ix;
    uint32_t block_size;
    pthread_t thread;
    bool started;

    /* thread-owned */
    struct kvi_router_decoder *dec;
    struct kvi_producer *prod;
    struct kvi_ingest_counters ictr; /* shared by the source's ingest targets */
    uint32_t warn_budget;
    uint64_t dropped_seen;

    /* workers and ranks: arrays (stable while the mutex is not held by the
     * thread for a change) and maps slot -> index + 1 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct worker *workers;
    size_t n_workers, cap_workers;
    struct rank_state *ranks;
    size_t n_ranks, cap_ranks;
    uint32_t *wmap, *rmap;
    uint32_t wmask, rmask;

    /* command (C1) */
    bool cmd;
    uint64_t cmd_worker;
    bool cmd_found;
    uint64_t cmd_gen, cmd_done_gen;

    /* stream state */
    _Atomic bool caught_up;
    _Atomic bool restoring;  /* snapshot hooks set and the restore not done (kvi_nats_restoring) */
    uint64_t start_last_seq;
    uint64_t applied_seq;    /* thread: highest stream sequence applied (and flushed at boundaries) */
    uint64_t snap_seq;       /* thread: sequence of the last snapshot stored or loaded */
    uint64_t next_snap_ns;   /* thread: when the next snapshot is due */
    char last_error[256];

    struct kvi_nats_counters ctr;
};

struct kvi_nats {
    struct kvi_nats_conn conn;
    struct kvi_writer_pool *writers;
    char durable[KVI_NATS_NAME_MAX];
    uint32_t fetch_batch;
    int pending_msgs;
    int64_t pending_bytes;
    const struct kvi_nats_snap_hooks *snap; /* NULL: no snapshots */
    _Atomic bool stop; /* S1 */
    pthread_mutex_t mu; /* sources array (control plane) */
    struct source **src;
    size_t n_src;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define CTR_ADD(s, f, v) atomic_fetch_add_explicit(&(s)->ctr.f, (v), memory_order_relaxed)
#define CTR_SET(s, f, v) atomic_store_explicit(&(s)->ctr.f, (v), memory_order_relaxed)

const char *kvi_nats_kind_name(enum kvi_nats_kind k) { return k == KVI_NATS_STREAM ? "stream" : "core"; }

/* Record the source's last error ("" clears it); shown by kvi_nats_source_info. */
__attribute__((format(printf, 2, 3))) static void set_error(struct source *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&s->mu);
    vsnprintf(s->last_error, sizeof s->last_error, fmt, ap);
    pthread_mutex_unlock(&s->mu);
    va_end(ap);
}

/* ---- maps (thread writes under mu; lookups by the thread without it) ------------------------- */

static uint32_t slot_of(uint64_t h, uint32_t mask) { return (uint32_t)kvi_fmix64(h) & mask; }
static uint64_t rank_key(uint64_t w, uint32_t r) { return w ^ ((uint64_t)r * 0x9e3779b97f4a7c15ull); }

static void rebuild_maps(struct source *s)
{
    uint32_t wc = 16, rc = 16;
    while (wc < 2 * s->n_workers + 2)
        wc *= 2;
    while (rc < 2 * s->n_ranks + 2)
        rc *= 2;
    free(s->wmap);
    free(s->rmap);
    s->wmap = kvi_xcalloc(wc, sizeof *s->wmap);
    s->rmap = kvi_xcalloc(rc, sizeof *s->rmap);
    s->wmask = wc - 1;
    s->rmask = rc - 1;
    for (size_t i = 0; i < s->n_workers; i++) {
        uint32_t j = slot_of(s->workers[i].worker_id, s->wmask);
        while (s->wmap[j] != 0)
            j = (j + 1) & s->wmask;
        s->wmap[j] = (uint32_t)i + 1;
    }
    for (size_t i = 0; i < s->n_ranks; i++) {
        uint32_t j = slot_of(rank_key(s->ranks[i].worker_id, s->ranks[i].dp_rank), s->rmask);
        while (s->rmap[j] != 0)
            j = (j + 1) & s->rmask;
        s->rmap[j] = (uint32_t)i + 1;
    }
}

static struct worker *worker_find(struct source *s, uint64_t id, size_t *at)
{
    for (uint32_t j = slot_of(id, s->wmask); s->wmap[j] != 0; j = (j + 1) & s->wmask) {
        struct worker *w = &s->workers[s->wmap[j] - 1];
        if (w->worker_id == id) {
            if (at != NULL)
                *at = s->wmap[j] - 1;
            return w;
        }
    }
    return NULL;
}

static struct rank_state *rank_find(struct source *s, uint64_t id, uint32_t rank)
{
    for (uint32_t j = slot_of(rank_key(id, rank), s->rmask); s->rmap[j] != 0; j = (j + 1) & s->rmask) {
        struct rank_state *r = &s->ranks[s->rmap[j] - 1];
        if (r->worker_id == id && r->dp_rank == rank)
            return r;
    }
    return NULL;
}

/* The worker's target, created (instance interned) with its first event. NULL: intern failed. */
static struct worker *worker_get(struct source *s, uint64_t id, size_t *at)
{
    struct worker *w = worker_find(s, id, at);
    if (w != NULL)
        return w;
    int64_t inst = kvi_index_intern_instance(s->ix, id, NULL, false);
    if (inst < 0)
        return NULL;
    struct worker nw = {.worker_id = id};
    snprintf(nw.name, sizeof nw.name, "nats worker %" PRIu64, id);
    nw.t = (struct kvi_ingest_target){.ix = s->ix, .instance = (uint32_t)inst, .block_size = s->block_size,
                                      .warn_budget = 0, .name = NULL, .ctr = &s->ictr};
    if (kvi_ingest_target_init(&nw.t) != 0)
        return NULL;
    pthread_mutex_lock(&s->mu);
    if (s->n_workers == s->cap_workers) {
        s->cap_workers = s->cap_workers ? 2 * s->cap_workers : 16;
        s->workers = kvi_xrealloc(s->workers, s->cap_workers * sizeof *s->workers);
        /* targets keep no pointer to themselves: moving them is fine; names are re-pointed below */
    }
    s->workers[s->n_workers++] = nw;
    for (size_t i = 0; i < s->n_workers; i++)
        s->workers[i].t.name = s->workers[i].name;
    if (2 * s->n_workers + 2 > (size_t)s->wmask + 1)
        rebuild_maps(s);
    else {
        uint32_t j = slot_of(id, s->wmask);
        while (s->wmap[j] != 0)
            j = (j + 1) & s->wmask;
        s->wmap[j] = (uint32_t)s->n_workers;
    }
    pthread_mutex_unlock(&s->mu);
    *at = s->n_workers - 1;
    kvi_log_info("nats %s: worker %" PRIu64 " appeared (%s)", s->subject, id, s->label);
    return &s->workers[s->n_workers - 1];
}

static struct rank_state *rank_get(struct source *s, uint64_t id, uint32_t rank, uint32_t widx)
{
    struct rank_state *r = rank_find(s, id, rank);
    if (r != NULL)
        return r;
    pthread_mutex_lock(&s->mu);
    if (s->n_ranks == s->cap_ranks) {
        s->cap_ranks = s->cap_ranks ? 2 * s->cap_ranks : 16;
        s->ranks = kvi_xrealloc(s->ranks, s->cap_ranks * sizeof *s->ranks);
    }
    r = &s->ranks[s->n_ranks++];
    memset(r, 0, sizeof *r);
    r->worker_id = id;
    r->dp_rank = rank;
    r->worker = widx;
    if (2 * s->n_ranks + 2 > (size_t)s->rmask + 1)
        rebuild_maps(s);
    else {
        uint32_t j = slot_of(rank_key(id, rank), s->rmask);
        while (s->rmap[j] != 0)
            j = (j + 1) & s->rmask;
        s->rmap[j] = (uint32_t)s->n_ranks;
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* Forget worker `id` (its blocks cleared first). Source thread. @return found? */
static bool worker_forget(struct source *s, uint64_t id)
{
    size_t at;
    struct worker *w = worker_find(s, id, &at);
    if (w == NULL)
        return false;
    kvi_ingest_clear(&w->t, s->prod);
    kvi_producer_flush(s->prod);
    kvi_ingest_target_fini(&w->t);
    pthread_mutex_lock(&s->mu);
    s->workers[at] = s->workers[--s->n_workers];
    size_t k = 0;
    for (size_t i = 0; i < s->n_ranks; i++)
        if (s->ranks[i].worker_id != id) {
            if (k != i) /* (this thread is the only writer; readers hold mu) */
                s->ranks[k] = s->ranks[i];
            k++;
        }
    s->n_ranks = k;
    for (size_t i = 0; i < s->n_workers; i++)
        s->workers[i].t.name = s->workers[i].name;
    rebuild_maps(s);
    for (size_t i = 0; i < s->n_ranks; i++) {
        size_t wi = 0;
        if (worker_find(s, s->ranks[i].worker_id, &wi) != NULL)
            s->ranks[i].worker = (uint32_t)wi;
    }
    pthread_mutex_unlock(&s->mu);
    kvi_log_info("nats %s: worker %" PRIu64 " forgotten and its blocks dropped (%s)", s->subject, id, s->label);
    return true;
}

/* ---- one message ------------------------------------------------------------------------------ */

static void warn_decode(struct source *s, enum kvi_rev_err e)
{
    if (s->warn_budget == 0)
        return;
    s->warn_budget--;
    kvi_log_warn("nats %s: message dropped (%s: %s)%s", s->subject, kvi_router_err_name(e),
                 kvi_router_decoder_what(s->dec), s->warn_budget == 0 ? "; further ones are counted only" : "");
}

/*
 * Decode, order and apply one payload. redelivered: a JetStream message
 * delivered before (metadata NumDelivered > 1). sparse: the event ids
 * increase with gaps by design (kvidx's bridge, net/nats_bridge.h: its
 * Nats-Msg-Id starts with "kvb."), so a jump is not a gap.
 */
static void handle(struct source *s, const void *data, size_t len, bool redelivered, bool sparse)
{
    CTR_ADD(s, messages, 1);
    CTR_ADD(s, bytes, len);
    struct kvi_router_event ev;
    enum kvi_rev_err e = kvi_router_decode(s->dec, data, len, &ev);
    if (e != KVI_REV_OK) {
        CTR_ADD(s, decode_errors[e], 1);
        warn_decode(s, e);
        return;
    }
    CTR_ADD(s, forms[ev.form], 1);
    size_t widx;
    struct worker *w = worker_get(s, ev.worker_id, &widx);
    if (w == NULL) {
        CTR_ADD(s, decode_errors[KVI_REV_NOMEM], 1);
        return;
    }
    struct rank_state *r = rank_get(s, ev.worker_id, ev.dp_rank, (uint32_t)widx);
    w = &s->workers[widx];

    /* order (net/nats_source.h, SOURCES) */
    if (r->has_last) {
        bool restarted = s->kind == KVI_NATS_CORE && ev.form == KVI_REVF_ENVELOPE && r->has_pub &&
                         ev.publisher_id != r->publisher_id;
        if (restarted) {
            CTR_ADD(s, restarts, 1);
            kvi_log_warn("nats %s: worker %" PRIu64 " dp_rank %" PRIu32 " restarted (publisher %" PRIu64
                         " -> %" PRIu64 "): its blocks on that rank are dropped",
                         s->subject, ev.worker_id, ev.dp_rank, r->publisher_id, ev.publisher_id);
            kvi_ingest_reset_rank(&w->t, ev.dp_rank, s->prod);
        } else if (ev.event_id <= atomic_load_explicit(&r->last_id, memory_order_relaxed)) {
            if (s->kind == KVI_NATS_CORE || redelivered) {
                CTR_ADD(s, stale, 1);
                return;
            }
            /* a first delivery from the stream: the publisher started over */
            CTR_ADD(s, restarts, 1);
            kvi_log_warn("nats %s: worker %" PRIu64 " dp_rank %" PRIu32 " event_id went back from %" PRIu64
                         " to %" PRIu64 " (a restarted publisher): applied in stream order",
                         s->subject, ev.worker_id, ev.dp_rank,
                         atomic_load_explicit(&r->last_id, memory_order_relaxed), ev.event_id);
        } else if (!sparse && ev.event_id != atomic_load_explicit(&r->last_id, memory_order_relaxed) + 1) {
            uint64_t last = atomic_load_explicit(&r->last_id, memory_order_relaxed);
            uint64_t lost = ev.event_id - last - 1;
            CTR_ADD(s, gaps, 1);
            CTR_ADD(s, events_lost, lost);
            kvi_log_warn("nats %s: gap for worker %" PRIu64 " dp_rank %" PRIu32 ": event_id %" PRIu64
                         " after %" PRIu64 " (%" PRIu64 " events lost%s)",
                         s->subject, ev.worker_id, ev.dp_rank, ev.event_id, last, lost,
                         s->kind == KVI_NATS_CORE ? "; Core NATS cannot repair a gap: use JetStream" : "");
        }
    }
    r->has_last = true;
    atomic_store_explicit(&r->last_id, ev.event_id, memory_order_relaxed);
    if (ev.form == KVI_REVF_ENVELOPE) {
        r->has_pub = true;
        r->publisher_id = ev.publisher_id;
    }

    static const uint8_t type_of[] = {[KVI_REV_STORED] = KVI_EV_STORED, [KVI_REV_REMOVED] = KVI_EV_REMOVED,
                                      [KVI_REV_CLEARED] = KVI_EV_CLEARED};
    struct kvi_ev x = {
        .type = type_of[ev.kind],
        .family = KVI_EVF_ROUTER,
        .tier = ev.tier,
        .medium_unknown = ev.tier_unknown,
        .has_parent = ev.has_parent,
        .parent_hash = ev.parent_hash,
        .has_base_idx = ev.has_start_position,
        .base_block_idx = ev.start_position,
        .group_idx = -1,
        .n_hashes = ev.n_blocks,
        .hashes = ev.block_hashes,
        .content = ev.tokens_hashes,
    };
    struct kvi_batch b = {.has_dp_rank = true, .dp_rank = ev.dp_rank, .n_events = 1, .events = &x};
    uint64_t inv0 = atomic_load_explicit(&s->ictr.events_invalid, memory_order_relaxed);
    kvi_ingest_batch(&w->t, &b, s->prod);
    if (atomic_load_explicit(&s->ictr.events_invalid, memory_order_relaxed) != inv0)
        CTR_ADD(s, invalid, 1);
    else
        CTR_ADD(s, applied, 1);
    atomic_fetch_add_explicit(&r->events, 1, memory_order_relaxed);
    atomic_store_explicit(&r->last_ns, now_ns(), memory_order_relaxed);
}

/* Run a pending command (C1). Source thread. */
static void run_command(struct source *s)
{
    pthread_mutex_lock(&s->mu);
    bool have = s->cmd;
    uint64_t id = s->cmd_worker, gen = s->cmd_gen;
    pthread_mutex_unlock(&s->mu);
    if (!have)
        return;
    bool found = worker_forget(s, id);
    pthread_mutex_lock(&s->mu);
    s->cmd = false;
    s->cmd_found = found;
    s->cmd_done_gen = gen;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static bool stopping(const struct source *s)
{
    return atomic_load_explicit(&s->plane->stop, memory_order_relaxed);
}

/* Sleep up to ms, waking for stop or a command. */
static void pause_ms(struct source *s, uint32_t ms)
{
    for (uint32_t t = 0; t < ms && !stopping(s); t += 50) {
        run_command(s);
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- core ------------------------------------------------------------------------------------- */

static void core_loop(struct source *s)
{
    natsSubscription *sub = NULL;
    natsConnection *nc = s->plane->conn.nc;
    uint32_t backoff = 100;
    while (!stopping(s) && sub == NULL) {
        natsStatus st = natsConnection_SubscribeSync(&sub, nc, s->subject);
        if (st == NATS_OK)
            st = natsSubscription_SetPendingLimits(
                sub, s->plane->pending_msgs,
                s->plane->pending_bytes > INT32_MAX ? INT32_MAX : (int)s->plane->pending_bytes);
        if (st != NATS_OK) {
            natsSubscription_Destroy(sub);
            sub = NULL;
            set_error(s, "subscribe: %s (%s)", natsStatus_GetText(st), nats_GetLastError(NULL));
            pause_ms(s, backoff);
            backoff = KVI_MIN(backoff * 2, RETRY_MS_MAX);
        }
    }
    if (sub != NULL)
        set_error(s, "%s", "");
    while (!stopping(s)) {
        run_command(s);
        natsMsg *m = NULL;
        natsStatus st = natsSubscription_NextMsg(&m, sub, POLL_MS);
        if (st == NATS_OK) {
            handle(s, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), false, false);
            natsMsg_Destroy(m);
        } else if (st != NATS_TIMEOUT && st != NATS_SLOW_CONSUMER) {
            set_error(s, "receive: %s", natsStatus_GetText(st));
            pause_ms(s, POLL_MS);
        }
        int64_t dropped = 0;
        if (natsSubscription_GetDropped(sub, &dropped) == NATS_OK && (uint64_t)dropped > s->dropped_seen) {
            CTR_ADD(s, dropped, (uint64_t)dropped - s->dropped_seen);
            kvi_log_warn("nats %s: %" PRIu64 " messages dropped by the client (slow consumer)", s->subject,
                         (uint64_t)dropped - s->dropped_seen);
            s->dropped_seen = (uint64_t)dropped;
        }
    }
    if (sub != NULL) {
        natsSubscription_Unsubscribe(sub);
        natsSubscription_Destroy(sub);
    }
}

/* ---- stream ----------------------------------------------------------------------------------- */

/*
 * Set up the durable pull consumer: look the stream up (its last sequence,
 * its subject when none was given), and at first set-up re-create the
 * consumer to deliver everything (SOURCES); afterwards (a consumer lost
 * while running) from start_seq. @return the subscription or NULL (error
 * recorded).
 */
static natsSubscription *stream_setup(struct source *s, jsCtx *js, bool first, uint64_t start_seq)
{
    jsErrCode jerr = 0;
    jsStreamInfo *si = NULL;
    natsStatus st = js_GetStreamInfo(&si, js, s->stream, NULL, &jerr);
    if (st != NATS_OK) {
        set_error(s, "stream %s: %s", s->stream, jerr == JSStreamNotFoundErr ? "not found" : natsStatus_GetText(st));
        return NULL;
    }
    if (s->subject[0] == '\0') {
        if (si->Config == NULL || si->Config->SubjectsLen != 1) {
            set_error(s, "stream %s has %s subjects: name one (--nats-stream STREAM/SUBJECT=...)", s->stream,
                      si->Config == NULL ? "no" : "several");
            jsStreamInfo_Destroy(si);
            return NULL;
        }
        pthread_mutex_lock(&s->mu); /* (kvi_nats_source_info reads it under mu) */
        snprintf(s->subject, sizeof s->subject, "%s", si->Config->Subjects[0]);
        pthread_mutex_unlock(&s->mu);
    }
    if (first) {
        pthread_mutex_lock(&s->mu);
        s->start_last_seq = si->State.LastSeq;
        pthread_mutex_unlock(&s->mu);
        if (si->State.LastSeq == 0 || si->State.Msgs == 0 || (start_seq > 0 && si->State.LastSeq < start_seq))
            atomic_store_explicit(&s->caught_up, true, memory_order_release);
        if (start_seq > 0 && si->State.FirstSeq > start_seq)
            kvi_log_warn("nats stream %s: the snapshot covers up to %" PRIu64 " but the stream starts at %" PRIu64
                         ": the messages between are lost to this replica",
                         s->stream, start_seq - 1, si->State.FirstSeq);
        else if (start_seq == 0 && si->State.FirstSeq > 1)
            kvi_log_warn("nats stream %s starts at sequence %" PRIu64 ": what came before (purged or aged out) is "
                         "not rebuilt from it (--nats-snapshot or --peers cover that)",
                         s->stream, si->State.FirstSeq);
    }
    jsStreamInfo_Destroy(si);

    const char *durable = s->plane->durable;
    if (first) {
        st = js_DeleteConsumer(js, s->stream, durable, NULL, &jerr);
        if (st == NATS_OK)
            kvi_log_info("nats stream %s: consumer %s re-created to read the stream from %s", s->stream, durable,
                         start_seq > 0 ? "after its snapshot" : "its start");
    }
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = durable;
    cc.AckPolicy = js_AckExplicit;
    cc.AckWait = (int64_t)30 * 1000000000;
    cc.MaxAckPending = 100000;
    cc.FilterSubject = s->subject;
    if (start_seq == 0) {
        cc.DeliverPolicy = js_DeliverAll;
    } else {
        cc.DeliverPolicy = js_DeliverByStartSequence;
        cc.OptStartSeq = start_seq;
    }
    jsConsumerInfo *ci = NULL;
    st = js_AddConsumer(&ci, js, s->stream, &cc, NULL, &jerr);
    jsConsumerInfo_Destroy(ci);
    if (st != NATS_OK && !first) /* it may still exist (a transient error): bind to it */
        st = NATS_OK;
    if (st != NATS_OK) {
        set_error(s, "consumer: %s (%s)", natsStatus_GetText(st), nats_GetLastError(NULL));
        return NULL;
    }
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = s->stream;
    so.Consumer = durable;
    natsSubscription *sub = NULL;
    st = js_PullSubscribe(&sub, js, s->subject, durable, NULL, &so, &jerr);
    if (st != NATS_OK) {
        set_error(s, "pull subscribe: %s (%s)", natsStatus_GetText(st), nats_GetLastError(NULL));
        return NULL;
    }
    set_error(s, "%s", "");
    return sub;
}

static void stream_batch(struct source *s, natsMsgList *list)
{
    uint64_t t0 = now_ns();
    for (int i = 0; i < list->Count; i++) {
        natsMsg *m = list->Msgs[i];
        jsMsgMetaData *md = NULL;
        bool redelivered = false;
        if (natsMsg_GetMetaData(&md, m) == NATS_OK) {
            redelivered = md->NumDelivered > 1;
            CTR_SET(s, pending, md->NumPending);
            CTR_SET(s, last_stream_seq, md->Sequence.Stream);
            s->applied_seq = KVI_MAX(s->applied_seq, md->Sequence.Stream);
            if (md->NumPending == 0 || md->Sequence.Stream >= s->start_last_seq)
                atomic_store_explicit(&s->caught_up, true, memory_order_release);
            jsMsgMetaData_Destroy(md);
        }
        if (redelivered)
            CTR_ADD(s, redelivered, 1);
        const char *id = NULL;
        bool sparse = natsMsgHeader_Get(m, "Nats-Msg-Id", &id) == NATS_OK && id != NULL && strncmp(id, "kvb.", 4) == 0;
        handle(s, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), redelivered, sparse);
    }
    /* acked once applied: a crash before this point redelivers */
    kvi_producer_flush(s->prod);
    uint64_t acked = 0;
    for (int i = 0; i < list->Count; i++)
        if (natsMsg_Ack(list->Msgs[i], NULL) == NATS_OK)
            acked++;
    CTR_ADD(s, acked, acked);
    CTR_ADD(s, ack_ns_total, (now_ns() - t0) * acked);
}

/* Nothing came: caught up when the consumer has nothing pending (the
 * stream's last messages may be on subjects the filter leaves out). */
static void check_caught_up(struct source *s, natsSubscription *sub)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    if (natsSubscription_GetConsumerInfo(&ci, sub, NULL, &jerr) != NATS_OK)
        return;
    CTR_SET(s, pending, ci->NumPending);
    if (ci->NumPending == 0 && ci->NumAckPending == 0)
        atomic_store_explicit(&s->caught_up, true, memory_order_release);
    jsConsumerInfo_Destroy(ci);
}

/* The hooks' view of the source now. order: NULL for a restore. */
static struct kvi_nats_snap_point snap_point(struct source *s, const struct kvi_nats_order *order, size_t n)
{
    return (struct kvi_nats_snap_point){.source = s->index, .stream = s->stream, .subject = s->filter,
                                        .label = s->label, .ix = s->ix, .seq = order ? s->applied_seq : 0,
                                        .order = order, .n_order = n, .prod = s->prod};
}

/*
 * Load the start-up snapshot (hooks' restore) and seed the order state from
 * it. @return the sequence to start the consumer at (0: the whole stream),
 * or -EAGAIN (NATS not answering: retry).
 */
static int64_t stream_restore(struct source *s)
{
    const struct kvi_nats_snap_hooks *h = s->plane->snap;
    struct kvi_nats_restore r = {0};
    struct kvi_nats_snap_point p = snap_point(s, NULL, 0);
    uint64_t t0 = now_ns();
    int rc = h->restore(h->ctx, &p, &r);
    if (rc == -EAGAIN) {
        set_error(s, "snapshot: NATS did not answer; retrying");
        return -EAGAIN;
    }
    kvi_producer_flush(s->prod);
    if (r.failed)
        CTR_ADD(s, snap_load_fallbacks, 1);
    if (rc != 0 || r.seq == 0) {
        free(r.order);
        return 0;
    }
    for (size_t i = 0; i < r.n_order; i++) {
        const struct kvi_nats_order *o = &r.order[i];
        size_t widx;
        if (worker_get(s, o->worker_id, &widx) == NULL)
            continue;
        struct rank_state *rs = rank_get(s, o->worker_id, o->dp_rank, (uint32_t)widx);
        rs->has_last = true;
        atomic_store_explicit(&rs->last_id, o->last_event_id, memory_order_relaxed);
        rs->has_pub = o->has_pub;
        rs->publisher_id = o->publisher_id;
    }
    free(r.order);
    s->applied_seq = s->snap_seq = r.seq;
    CTR_SET(s, last_stream_seq, r.seq);
    CTR_ADD(s, snap_loaded, 1);
    CTR_SET(s, snap_seq, r.seq);
    CTR_SET(s, snap_loaded_blocks, r.blocks);
    CTR_SET(s, snap_load_ms, (now_ns() - t0) / 1000000u);
    kvi_log_info("nats stream %s: snapshot at sequence %" PRIu64 " loaded (%" PRIu64 " blocks, %zu ranks, %" PRIu64
                 " ms); reading the stream after it",
                 s->stream, r.seq, r.blocks, r.n_order, (now_ns() - t0) / 1000000u);
    return (int64_t)r.seq + 1;
}

/* At a sequence boundary (everything fetched is applied and flushed): take a snapshot when due. */
static void maybe_snapshot(struct source *s)
{
    const struct kvi_nats_snap_hooks *h = s->plane->snap;
    if (h == NULL || h->take == NULL || h->every_ms == 0)
        return;
    uint64_t t = now_ns();
    /* (not while catching up: each snapshot would pause the catch-up it does not need) */
    if (t < s->next_snap_ns || s->applied_seq <= s->snap_seq ||
        !atomic_load_explicit(&s->caught_up, memory_order_relaxed))
        return;
    s->next_snap_ns = t + (uint64_t)h->every_ms * 1000000u;
    kvi_producer_flush(s->prod);
    size_t n = 0;
    struct kvi_nats_order *o = kvi_xmalloc((s->n_ranks ? s->n_ranks : 1) * sizeof *o);
    for (size_t i = 0; i < s->n_ranks; i++) {
        const struct rank_state *r = &s->ranks[i];
        if (r->has_last)
            o[n++] = (struct kvi_nats_order){r->worker_id, r->dp_rank, r->has_pub,
                                             atomic_load_explicit(&((struct rank_state *)r)->last_id,
                                                                  memory_order_relaxed),
                                             r->publisher_id};
    }
    struct kvi_nats_snap_point p = snap_point(s, o, n);
    struct kvi_nats_snap_result res = {0};
    int rc = h->take(h->ctx, &p, &res);
    free(o);
    if (rc == 0) {
        s->snap_seq = p.seq;
        CTR_ADD(s, snap_written, 1);
        CTR_SET(s, snap_seq, p.seq);
        CTR_SET(s, snap_bytes, res.bytes);
        CTR_SET(s, snap_raw_bytes, res.raw_bytes);
        CTR_SET(s, snap_write_ms, (now_ns() - t) / 1000000u);
        if (res.purged_below > 0) {
            CTR_ADD(s, snap_purges, 1);
            CTR_SET(s, snap_purged_below, res.purged_below);
        }
    } else if (rc == -ESTALE) {
        s->snap_seq = p.seq; /* one as new is stored: nothing to add until more is applied */
        CTR_ADD(s, snap_superseded, 1);
        CTR_SET(s, snap_seq, p.seq);
    } else {
        CTR_ADD(s, snap_failed, 1);
    }
}

static void stream_loop(struct source *s)
{
    jsCtx *js = NULL;
    if (natsConnection_JetStream(&js, s->plane->conn.nc, NULL) != NATS_OK) {
        set_error(s, "jetstream: %s", nats_GetLastError(NULL));
        return;
    }
    natsSubscription *sub = NULL;
    bool first = true;
    uint32_t backoff = 100, fails = 0;
    int batch = (int)s->plane->fetch_batch;
    s->next_snap_ns = now_ns() + (s->plane->snap ? (uint64_t)s->plane->snap->every_ms * 1000000u : 0);
    while (!stopping(s)) {
        run_command(s);
        if (atomic_load_explicit(&s->restoring, memory_order_relaxed)) {
            if (stream_restore(s) == -EAGAIN) {
                pause_ms(s, backoff);
                backoff = KVI_MIN(backoff * 2, RETRY_MS_MAX);
                continue;
            }
            backoff = 100;
            atomic_store_explicit(&s->restoring, false, memory_order_release);
        }
        if (sub == NULL) {
            uint64_t next = s->applied_seq;
            sub = stream_setup(s, js, first, next ? next + 1 : 0);
            if (sub == NULL) {
                CTR_ADD(s, consumer_errors, 1);
                pause_ms(s, backoff);
                backoff = KVI_MIN(backoff * 2, RETRY_MS_MAX);
                continue;
            }
            first = false;
            backoff = 100;
        }
        natsMsgList list = {0};
        jsErrCode jerr = 0;
        natsStatus st = natsSubscription_Fetch(&list, sub, batch, POLL_MS, &jerr);
        if (st == NATS_OK) {
            fails = 0;
            stream_batch(s, &list);
            natsMsgList_Destroy(&list);
            maybe_snapshot(s);
            continue;
        }
        natsMsgList_Destroy(&list);
        if (st == NATS_TIMEOUT) {
            fails = 0;
            maybe_snapshot(s);
            if (!atomic_load_explicit(&s->caught_up, memory_order_relaxed))
                check_caught_up(s, sub);
            continue;
        }
        /* disconnected, or the consumer went away: wait, and after a few
         * failures set the consumer up again from the next sequence */
        CTR_ADD(s, consumer_errors, 1);
        set_error(s, "fetch: %s (%s)", natsStatus_GetText(st), nats_GetLastError(NULL));
        if (++fails >= 5) {
            natsSubscription_Destroy(sub);
            sub = NULL;
            fails = 0;
        }
        pause_ms(s, backoff);
        backoff = KVI_MIN(backoff * 2, RETRY_MS_MAX);
    }
    natsSubscription_Destroy(sub);
    jsCtx_Destroy(js);
}

static void *source_main(void *arg)
{
    struct source *s = arg;
    s->prod = kvi_producer_create(s->plane->writers);
    if (s->prod == NULL) {
        set_error(s, "no producer: %s", strerror(errno));
        kvi_log_error("nats %s: cannot create a writer producer", s->subject);
    } else {
        if (s->kind == KVI_NATS_CORE)
            core_loop(s);
        else
            stream_loop(s);
        kvi_producer_flush(s->prod);
        for (size_t i = 0; i < s->n_workers; i++)
            kvi_ingest_target_fini(&s->workers[i].t);
        kvi_producer_destroy(s->prod);
    }
    /* a command that arrived at the end finds nothing */
    pthread_mutex_lock(&s->mu);
    if (s->cmd) {
        s->cmd = false;
        s->cmd_found = false;
        s->cmd_done_gen = s->cmd_gen;
        pthread_cond_broadcast(&s->cv);
    }
    s->started = false;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- plane ------------------------------------------------------------------------------------ */

static bool durable_ok(const char *d)
{
    if (d == NULL || *d == '\0' || strlen(d) >= KVI_NATS_NAME_MAX)
        return false;
    for (const char *p = d; *p; p++)
        if (*p == '.' || *p == '*' || *p == '>' || *p == ' ' || *p == '\t')
            return false;
    return true;
}

struct kvi_nats *kvi_nats_create(const struct kvi_nats_config *cfg)
{
    if (cfg == NULL || cfg->servers == NULL || cfg->writers == NULL ||
        (cfg->durable != NULL && !durable_ok(cfg->durable))) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_nats *n = kvi_xcalloc(1, sizeof *n);
    n->writers = cfg->writers;
    if (cfg->durable != NULL)
        snprintf(n->durable, sizeof n->durable, "%s", cfg->durable);
    n->fetch_batch = cfg->fetch_batch ? cfg->fetch_batch : KVI_NATS_DEFAULT_FETCH_BATCH;
    n->pending_msgs = cfg->pending_msgs ? cfg->pending_msgs : KVI_NATS_DEFAULT_PENDING_MSGS;
    n->pending_bytes = cfg->pending_bytes ? cfg->pending_bytes : KVI_NATS_DEFAULT_PENDING_BYTES;
    n->snap = cfg->snap;
    pthread_mutex_init(&n->mu, NULL);
    int rc = kvi_nats_conn_open(&n->conn, cfg);
    if (rc != 0) {
        pthread_mutex_destroy(&n->mu);
        free(n);
        errno = -rc;
        return NULL;
    }
    return n;
}

int kvi_nats_add_source(struct kvi_nats *n, const struct kvi_nats_source_spec *spec)
{
    bool core = spec->kind == KVI_NATS_CORE;
    if ((spec->kind != KVI_NATS_CORE && spec->kind != KVI_NATS_STREAM) || spec->ix == NULL ||
        (core && (spec->subject == NULL || *spec->subject == '\0')) ||
        (!core && (spec->stream == NULL || *spec->stream == '\0' || n->durable[0] == '\0')) ||
        (spec->subject != NULL && strlen(spec->subject) >= KVI_NATS_NAME_MAX) ||
        (spec->stream != NULL && strlen(spec->stream) >= KVI_NATS_NAME_MAX))
        return -EINVAL;
    struct source *s = kvi_xcalloc(1, sizeof *s);
    s->plane = n;
    s->kind = spec->kind;
    s->ix = spec->ix;
    s->block_size = spec->block_size;
    snprintf(s->subject, sizeof s->subject, "%s", spec->subject ? spec->subject : "");
    snprintf(s->filter, sizeof s->filter, "%s", s->subject);
    snprintf(s->stream, sizeof s->stream, "%s", spec->stream ? spec->stream : "");
    snprintf(s->label, sizeof s->label, "%s", spec->label ? spec->label : "");
    s->warn_budget = WARN_BUDGET;
    atomic_store_explicit(&s->caught_up, core, memory_order_relaxed);
    atomic_store_explicit(&s->restoring, !core && n->snap != NULL && n->snap->restore != NULL,
                          memory_order_relaxed);
    s->dec = kvi_router_decoder_new();
    if (s->dec == NULL) {
        free(s);
        return -ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    rebuild_maps(s);
    pthread_mutex_lock(&n->mu);
    s->index = (uint32_t)n->n_src;
    n->src = kvi_xrealloc(n->src, (n->n_src + 1) * sizeof *n->src);
    n->src[n->n_src++] = s;
    pthread_mutex_unlock(&n->mu);
    s->started = true;
    int rc = pthread_create(&s->thread, NULL, source_main, s);
    if (rc != 0) {
        s->started = false;
        return -rc;
    }
    kvi_log_info("nats: %s source %s%s%s -> %s", kvi_nats_kind_name(s->kind), core ? s->subject : s->stream,
                 !core && s->subject[0] ? "/" : "", !core ? s->subject : "", s->label);
    return (int)s->index;
}

void kvi_nats_destroy(struct kvi_nats *n)
{
    if (n == NULL)
        return;
    atomic_store_explicit(&n->stop, true, memory_order_relaxed);
    for (size_t i = 0; i < n->n_src; i++) {
        struct source *s = n->src[i];
        pthread_join(s->thread, NULL);
    }
    bool freeable = kvi_nats_conn_close(&n->conn);
    for (size_t i = 0; i < n->n_src; i++) {
        struct source *s = n->src[i];
        kvi_router_decoder_free(s->dec);
        free(s->workers);
        free(s->ranks);
        free(s->wmap);
        free(s->rmap);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
    free(n->src);
    pthread_mutex_destroy(&n->mu);
    if (freeable) /* (else libnats may still call back into n->conn: left allocated) */
        free(n);
}

size_t kvi_nats_n_sources(const struct kvi_nats *n)
{
    pthread_mutex_lock((pthread_mutex_t *)&n->mu);
    size_t k = n->n_src;
    pthread_mutex_unlock((pthread_mutex_t *)&n->mu);
    return k;
}

static struct source *source_at(struct kvi_nats *n, size_t i)
{
    pthread_mutex_lock(&n->mu);
    struct source *s = i < n->n_src ? n->src[i] : NULL;
    pthread_mutex_unlock(&n->mu);
    return s;
}

int kvi_nats_source_info(struct kvi_nats *n, size_t i, struct kvi_nats_source_info *out)
{
    struct source *s = source_at(n, i);
    if (s == NULL)
        return -ENOENT;
    memset(out, 0, sizeof *out);
    out->kind = s->kind;
    out->ix = s->ix;
    out->ctr = &s->ctr;
    out->caught_up = atomic_load_explicit(&s->caught_up, memory_order_acquire);
    out->restoring = atomic_load_explicit(&s->restoring, memory_order_acquire);
    snprintf(out->stream, sizeof out->stream, "%s", s->stream);
    snprintf(out->label, sizeof out->label, "%s", s->label);
    pthread_mutex_lock(&s->mu);
    snprintf(out->subject, sizeof out->subject, "%s", s->subject);
    snprintf(out->last_error, sizeof out->last_error, "%s", s->last_error);
    out->start_last_seq = s->start_last_seq;
    out->workers = s->n_ranks;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void kvi_nats_conn_info(struct kvi_nats *n, struct kvi_nats_conn_info *out) { kvi_nats_conn_read(&n->conn, out); }

natsConnection *kvi_nats__connection(struct kvi_nats *n) { return n->conn.nc; }

bool kvi_nats_ready(struct kvi_nats *n, uint64_t *pending)
{
    bool ready = true;
    uint64_t sum = 0;
    for (size_t i = 0;; i++) {
        struct source *s = source_at(n, i);
        if (s == NULL)
            break;
        if (s->kind != KVI_NATS_STREAM)
            continue;
        if (!atomic_load_explicit(&s->caught_up, memory_order_acquire)) {
            ready = false;
            sum += atomic_load_explicit(&s->ctr.pending, memory_order_relaxed);
        }
    }
    if (pending != NULL)
        *pending = sum;
    return ready;
}

bool kvi_nats_restoring(struct kvi_nats *n)
{
    bool any = false;
    for (size_t i = 0; !any; i++) {
        struct source *s = source_at(n, i);
        if (s == NULL)
            break;
        any = atomic_load_explicit(&s->restoring, memory_order_acquire);
    }
    return any;
}

void kvi_nats_foreach_worker(struct kvi_nats *n, void (*fn)(void *ctx, const struct kvi_nats_worker_view *w),
                             void *ctx)
{
    uint64_t t = now_ns();
    for (size_t i = 0;; i++) {
        struct source *s = source_at(n, i);
        if (s == NULL)
            break;
        pthread_mutex_lock(&s->mu);
        for (size_t k = 0; k < s->n_ranks; k++) {
            const struct rank_state *r = &s->ranks[k];
            uint64_t last = atomic_load_explicit(&((struct rank_state *)r)->last_ns, memory_order_relaxed);
            struct kvi_nats_worker_view v = {
                .source = s->index,
                .subject = s->kind == KVI_NATS_CORE ? s->subject : s->stream,
                .ix = s->ix,
                .worker_id = r->worker_id,
                .dp_rank = r->dp_rank,
                .events = atomic_load_explicit(&((struct rank_state *)r)->events, memory_order_relaxed),
                .last_event_id = atomic_load_explicit(&((struct rank_state *)r)->last_id, memory_order_relaxed),
                .age_ns = last != 0 && t > last ? t - last : 0,
            };
            fn(ctx, &v);
        }
        pthread_mutex_unlock(&s->mu);
    }
}

int kvi_nats_forget_worker(struct kvi_nats *n, struct kvi_index *ix, uint64_t worker_id)
{
    bool found = false;
    for (size_t i = 0;; i++) {
        struct source *s = source_at(n, i);
        if (s == NULL)
            break;
        if (s->ix != ix)
            continue;
        pthread_mutex_lock(&s->mu);
        while (s->cmd && s->started) /* one command at a time */
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->started) {
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        s->cmd_worker = worker_id;
        s->cmd_gen++;
        uint64_t gen = s->cmd_gen;
        s->cmd = true; /* C1 */
        while (s->cmd_done_gen < gen)
            pthread_cond_wait(&s->cv, &s->mu);
        found |= s->cmd_found;
        pthread_mutex_unlock(&s->mu);
    }
    return found ? 0 : -ENOENT;
}
