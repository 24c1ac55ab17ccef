/*
 * /dump threads (see api/dump_pool.h).
 *
 * DESIGN
 *   State under `mu`: the job queue, the thread handles and counts, and the
 *   pin table (one entry per namespace some running dump still has to
 *   visit). A thread waits on `cv` for a job; submit starts a thread when
 *   the jobs queued outnumber the idle threads and the pool is not full.
 *   Pinning: dump_run takes `mu`, enters an RCU read section, lists the
 *   registry and pins every namespace listed, then leaves both. The deleting
 *   thread unlinks (a grace period: it returns only after that read section
 *   ended) before it looks at the pin table under `mu`, so a namespace a
 *   dump listed is found pinned, and one it did not list can no longer be
 *   listed. Nobody calls synchronize_rcu with `mu` held.
 *   Watermarks: the `pre` hook of kvi_producer_dump_partition_pre reads the
 *   applied positions of the partition's listeners on the writer, at the
 *   point of the partition's blocks, into the encoder's watermark buffer;
 *   ns_end writes them after the namespace's events.
 *   Spool hand-off: the encoder is written on the writer thread inside
 *   kvi_producer_dump_partition and read by the dump thread after it
 *   returns (the producer's flush orders the two).
 *   Spool bound: the JSON dump takes about 280 bytes per block, so one
 *   partition of a large index would spool gigabytes. The encoder is given
 *   the real sink with a flush threshold of DUMP_SPOOL_MAX: a partition whose
 *   encoding passes it is written to the client from the writer thread (the
 *   sink is used by one thread at a time: the dump thread waits for the
 *   writer meanwhile). Only such partitions make their writer wait for the
 *   client again, and no longer than --idle-timeout-ms without progress
 *   (the stream write then fails and the dump is cut).
 */
#include "api/dump_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/rcu.h"
#include "net/log.h"

#define DUMP_PIECE (64u * 1024u)             /* bytes per sink call */
#define DUMP_SPOOL_KEEP (4u * 1024u * 1024u) /* a drained spool with more capacity is freed */
#define DUMP_SPOOL_MAX (64u * 1024u * 1024u) /* past this, the writer hands bytes to the sink itself */
#define DUMP_THREADS_MAX 64

struct dump_job {
    struct dump_job *next;
    kvi_dump_sink_fn sink;
    kvi_dump_done_fn done;
    void *ctx;
};

struct dump_pin {
    struct kvi_ns *ns;
    uint32_t pins; /* dumps holding it */
    bool dead;     /* deleted meanwhile: the last unpin frees it */
};

struct kvi_dump_pool {
    struct kvi_writer_pool *writers;
    struct kvi_listeners *listeners; /* watermarks (may be NULL) */
    struct kvi_nsreg *nsreg;
    unsigned max_threads;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct dump_job *head, *tail;
    size_t queued;   /* jobs not taken yet */
    pthread_t thr[DUMP_THREADS_MAX];
    unsigned n_thr;  /* started and not joined */
    unsigned idle;   /* threads waiting for a job */
    bool closed;     /* submit refuses; threads exit once the queue is empty */
    struct dump_pin *pins;
    size_t n_pins, cap_pins;
};

struct kvi_dump_pool *kvi_dump_pool_create(struct kvi_writer_pool *writers, struct kvi_nsreg *nsreg,
                                           unsigned max_threads)
{
    if (max_threads == 0) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_dump_pool *dp = kvi_xcalloc(1, sizeof *dp);
    dp->writers = writers;
    dp->nsreg = nsreg;
    dp->max_threads = KVI_MIN(max_threads, DUMP_THREADS_MAX);
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->cv, NULL);
    return dp;
}

void kvi_dump_pool_set_listeners(struct kvi_dump_pool *dp, struct kvi_listeners *lp)
{
    dp->listeners = lp;
}

/* ---- pins ------------------------------------------------------------------------------ */

static struct dump_pin *pin_find_locked(struct kvi_dump_pool *dp, const struct kvi_ns *ns)
{
    for (size_t i = 0; i < dp->n_pins; i++)
        if (dp->pins[i].ns == ns)
            return &dp->pins[i];
    return NULL;
}

static void pin_locked(struct kvi_dump_pool *dp, struct kvi_ns *ns)
{
    struct dump_pin *p = pin_find_locked(dp, ns);
    if (p == NULL) {
        if (dp->n_pins == dp->cap_pins) {
            dp->cap_pins = dp->cap_pins ? dp->cap_pins * 2 : 8;
            dp->pins = kvi_xrealloc(dp->pins, dp->cap_pins * sizeof *dp->pins);
        }
        p = &dp->pins[dp->n_pins++];
        *p = (struct dump_pin){ns, 0, false};
    }
    p->pins++;
}

/* Drop a dump's pin of ns; the last pin of a deleted namespace frees it. */
static void unpin(struct kvi_dump_pool *dp, struct kvi_ns *ns)
{
    bool free_it = false;
    pthread_mutex_lock(&dp->mu);
    struct dump_pin *p = pin_find_locked(dp, ns);
    KVI_ASSERT(p != NULL);
    if (--p->pins == 0) {
        free_it = p->dead;
        *p = dp->pins[--dp->n_pins];
    }
    pthread_mutex_unlock(&dp->mu);
    if (free_it) {
        kvi_log_debug("namespace %s:%s freed after the /dump that held it", ns->model, ns->tenant);
        kvi_ns_free(ns);
    }
}

bool kvi_dump_pool_defer_free(struct kvi_dump_pool *dp, struct kvi_ns *ns)
{
    pthread_mutex_lock(&dp->mu);
    struct dump_pin *p = pin_find_locked(dp, ns);
    if (p != NULL)
        p->dead = true;
    pthread_mutex_unlock(&dp->mu);
    return p != NULL;
}

/* ---- one dump ---------------------------------------------------------------------------- */

static struct kvi_str zstr(const char *s)
{
    return (struct kvi_str){s, strlen(s)};
}

/* One partition's dump on its writer: the watermarks, then the blocks. */
struct part_ctx {
    struct kvi_dump_enc *enc;
    struct kvi_listeners *lp;
    struct kvi_index *ix;
};

static void part_wm(void *ctx, const struct kvi_listener_applied *a)
{
    struct part_ctx *pc = ctx;
    struct kvi_dump_worker w = {a->instance_id, a->instance_name};
    kvi_dump_enc_watermark(pc->enc, &w, a->dp_rank, a->seq);
}

static void part_pre(void *ctx, uint32_t part)
{
    struct part_ctx *pc = ctx;
    if (pc->lp != NULL)
        kvi_listeners_applied(pc->lp, pc->ix, part, part_wm, pc);
}

static void part_emit(void *ctx, const struct kvi_dump_block *b)
{
    kvi_dump_emit(((struct part_ctx *)ctx)->enc, b);
}

/* Hand the spool to the sink, then empty it. @return 0, -ENOMEM or the sink's error. */
static int spool_drain(struct kvi_dump_enc *enc, kvi_dump_sink_fn sink, void *ctx)
{
    if (enc->err != 0)
        return enc->err;
    if (!kvi_buf_ok(&enc->out))
        return -ENOMEM;
    for (size_t off = 0; off < enc->out.len;) {
        size_t n = KVI_MIN(enc->out.len - off, (size_t)DUMP_PIECE);
        int r = sink(ctx, enc->out.data + off, n);
        if (r != 0)
            return r < 0 ? r : -EIO;
        off += n;
    }
    if (enc->out.cap > DUMP_SPOOL_KEEP)
        kvi_buf_free(&enc->out); /* one huge partition does not keep its memory for the rest */
    else
        kvi_buf_reset(&enc->out);
    return 0;
}

/* One /dump, on a dump thread. @return 0, -ENOMEM or the sink's error. */
static int dump_run(struct kvi_dump_pool *dp, struct kvi_producer *prod, kvi_dump_sink_fn sink, void *ctx)
{
    size_t cap = 16, n;
    struct kvi_ns **list = NULL;
    for (;;) {
        list = kvi_xrealloc(list, cap * sizeof *list);
        pthread_mutex_lock(&dp->mu);
        kvi_rcu_read_lock();
        n = kvi_nsreg_list(dp->nsreg, list, cap);
        for (size_t i = 0; n <= cap && i < n; i++)
            pin_locked(dp, list[i]);
        kvi_rcu_read_unlock();
        pthread_mutex_unlock(&dp->mu);
        if (n <= cap)
            break;
        cap = n;
    }
    struct kvi_dump_enc enc;
    kvi_dump_enc_init(&enc, sink, ctx, DUMP_SPOOL_MAX); /* enc.out is the spool, up to DUMP_SPOOL_MAX */
    kvi_dump_enc_begin(&enc);
    int rc = 0;
    size_t i = 0;
    for (; i < n && rc == 0; i++) {
        struct kvi_ns *ns = list[i];
        kvi_dump_enc_ns_begin(&enc, zstr(ns->model), zstr(ns->tenant), ns->block_size, ns->ix);
        for (uint32_t part = 0; part < kvi_index_n_parts(ns->ix) && rc == 0; part++) {
            struct part_ctx pc = {&enc, dp->listeners, ns->ix};
            kvi_producer_dump_partition_pre(prod, ns->ix, part, part_pre, part_emit, &pc);
            rc = spool_drain(&enc, sink, ctx);
        }
        kvi_dump_enc_ns_end(&enc);
        unpin(dp, ns);
    }
    for (; i < n; i++) /* cut short */
        unpin(dp, list[i]);
    if (rc == 0) {
        kvi_dump_enc_end(&enc);
        rc = spool_drain(&enc, sink, ctx);
    }
    kvi_dump_enc_free(&enc);
    free(list);
    return rc;
}

/* ---- threads ----------------------------------------------------------------------------- */

static void *dump_main(void *arg)
{
    struct kvi_dump_pool *dp = arg;
    pthread_setname_np(pthread_self(), "kvi-dump");
    kvi_rcu_register_thread();
    struct kvi_producer *prod = kvi_producer_create(dp->writers);
    int perr = prod == NULL ? -errno : 0;
    if (prod == NULL)
        kvi_log_error("dump thread: no writer-pool producer: %s", strerror(-perr));
    pthread_mutex_lock(&dp->mu);
    for (;;) {
        while (dp->head == NULL && !dp->closed) {
            dp->idle++;
            pthread_cond_wait(&dp->cv, &dp->mu);
            dp->idle--;
        }
        struct dump_job *j = dp->head;
        if (j == NULL)
            break; /* closed and nothing queued */
        dp->head = j->next;
        if (dp->head == NULL)
            dp->tail = NULL;
        dp->queued--;
        pthread_mutex_unlock(&dp->mu);
        int rc = prod != NULL ? dump_run(dp, prod, j->sink, j->ctx) : perr;
        j->done(j->ctx, rc);
        free(j);
        pthread_mutex_lock(&dp->mu);
    }
    pthread_mutex_unlock(&dp->mu);
    kvi_producer_destroy(prod);
    kvi_rcu_unregister_thread();
    return NULL;
}

int kvi_dump_pool_submit(struct kvi_dump_pool *dp, kvi_dump_sink_fn sink, kvi_dump_done_fn done, void *ctx)
{
    struct dump_job *j = kvi_xmalloc(sizeof *j);
    *j = (struct dump_job){NULL, sink, done, ctx};
    int rc = 0;
    pthread_mutex_lock(&dp->mu);
    if (dp->closed) {
        rc = -ESHUTDOWN;
    } else if (dp->queued + 1 > dp->idle && dp->n_thr < dp->max_threads) {
        int e = pthread_create(&dp->thr[dp->n_thr], NULL, dump_main, dp);
        if (e == 0)
            dp->n_thr++;
        else if (dp->n_thr == 0)
            rc = -e;
        else
            kvi_log_warn("/dump: cannot start another dump thread (%s): it waits for a running one", strerror(e));
    }
    if (rc == 0) {
        if (dp->tail != NULL)
            dp->tail->next = j;
        else
            dp->head = j;
        dp->tail = j;
        dp->queued++;
        pthread_cond_signal(&dp->cv);
    }
    pthread_mutex_unlock(&dp->mu);
    if (rc != 0)
        free(j);
    return rc;
}

void kvi_dump_pool_close(struct kvi_dump_pool *dp)
{
    if (dp == NULL)
        return;
    pthread_mutex_lock(&dp->mu);
    dp->closed = true;
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
}

int kvi_dump_pool_join(struct kvi_dump_pool *dp, const struct timespec *deadline)
{
    if (dp == NULL)
        return 0;
    for (;;) {
        pthread_mutex_lock(&dp->mu);
        unsigned n = dp->n_thr; /* none is added once closed */
        pthread_mutex_unlock(&dp->mu);
        if (n == 0)
            return 0;
        pthread_t t = dp->thr[n - 1];
        if ((deadline == NULL ? pthread_join(t, NULL) : pthread_timedjoin_np(t, NULL, deadline)) != 0)
            return -ETIMEDOUT;
        pthread_mutex_lock(&dp->mu);
        dp->n_thr--;
        pthread_mutex_unlock(&dp->mu);
    }
}

void kvi_dump_pool_destroy(struct kvi_dump_pool *dp)
{
    if (dp == NULL)
        return;
    kvi_dump_pool_close(dp);
    kvi_dump_pool_join(dp, NULL);
    for (size_t i = 0; i < dp->n_pins; i++) /* none: every dump unpinned what it listed */
        if (dp->pins[i].dead)
            kvi_ns_free(dp->pins[i].ns);
    free(dp->pins);
    pthread_mutex_destroy(&dp->mu);
    pthread_cond_destroy(&dp->cv);
    free(dp);
}
