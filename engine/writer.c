/*
 * Writer threads (see engine/writer.h).
 *
 * DESIGN
 *   Threads: N writer threads, each bound to its own jemalloc arena; any
 *   number of producer threads, each owning one SPSC ring per writer.
 *   Queues: ring (producer p, writer w) carries op pointers; the writer
 *   scans its rings round-robin, dequeuing bursts of up to 32.
 *   Ordering: a producer's ops for one writer are applied in submit order;
 *   every op of an instance goes to the same writer, so a worker's events
 *   are applied in the order its producer submitted them.
 *   Completion: after applying a burst the writer adds its size to the
 *   ring's `applied` counter (release, A1); flush waits until applied equals
 *   the producer's `submitted` (acquire, pairs with A1), so everything the
 *   writer did is visible to the flusher.
 *   Sleep/wake: a writer with empty rings spins briefly, then sets `sleeping`
 *   (seq_cst), re-checks the rings and waits on a futex. A producer enqueues,
 *   issues a seq_cst fence and wakes the writer if it saw `sleeping` — the
 *   two fences make a lost wake-up impossible (Dekker). Waits also time out
 *   after 100 ms as a second line of defence.
 *   Reclaim: memory an index retired waits for an RCU grace period. An
 *   idle writer frees it for every index it dirtied after one grace period,
 *   at most once per RECLAIM_IDLE_NS (a sleeping writer wakes for it).
 *   Shutdown: pool_destroy sets `stop`; each writer drains its rings, then
 *   exits. Producers must be destroyed first.
 */
#include "engine/writer.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "engine/arena.h"
#include "engine/common.h"
#include "engine/rcu.h"
#include "engine/ring.h"

#define BURST 32
/* An idle writer polls its rings for this long (PAUSE between scans), then
 * sleeps on its futex. It used to sched_yield 256 times instead: on a busy
 * machine each yield hands the core away for a time slice, and on a quiet
 * one the 256 syscalls kept an idle writer on the CPU whenever events came
 * more often than every ~0.3 ms.
 * measured (a harness outside the tree: one writer, one kvi_producer_call
 * every P us for 2 s, process cpu / wall, loaded 2-cpu VM, yield -> spin):
 * P = 50 us: 50 % -> 25 %; P = 200 us: 29 % -> 13 %; P = 1 ms: 8 % -> 4 %.
 * kvidx-bench ingest (writer busy > 99 %) unchanged within noise. */
#define SPIN_NS 20000
/* An idle writer frees retired memory (an RCU grace period) at most this
 * often; mutations still reclaim at once past their own limits (4 MiB or 64 k
 * entries waiting). With memb RCU every grace period interrupts each core
 * running a thread of the process (membarrier IPIs, costly in a VM), so
 * queries in flight pay for it. It used to reclaim at every idle moment.
 * measured (kvidx-bench trace, conversation trace, --window-ms 1000, 3
 * interleaved runs each, 2-cpu VM): membarrier calls per run 2,612 -> 1,138;
 * find p99 14.3 / 17.0 / 17.0 -> 12.3 / 12.3 / 13.4 us. */
#define RECLAIM_IDLE_NS 1000000
#define DIRTY_MAX 64

struct kvi_pring {
    struct kvi_ring *r;
    KVI_CACHE_ALIGNED _Atomic uint64_t submitted; /* producer */
    _Atomic uint32_t space_wait;                  /* producer: asleep until the ring is half empty */
    KVI_CACHE_ALIGNED _Atomic uint64_t applied;   /* writer (A1) */
    _Atomic uint32_t space_seq;                   /* writer: futex word of space_wait */
};

struct kvi_writer {
    pthread_t tid;
    uint32_t id;
    unsigned arena;
    struct kvi_writer_pool *pool;
    struct kvi_pring *_Atomic rings[KVI_PRODUCER_MAX];
    _Atomic uint32_t n_rings; /* highest ring slot in use + 1 */
    struct kvi_index *dirty[DIRTY_MAX];
    uint32_t n_dirty;
    uint64_t last_reclaim_ns; /* of the last idle reclaim (writer only) */

    KVI_CACHE_ALIGNED _Atomic uint32_t sleeping;
    _Atomic uint32_t futex;
    _Atomic uint64_t scan_gen;

    KVI_CACHE_ALIGNED _Atomic uint64_t ops;
    _Atomic uint64_t outcomes[KVI_OUT_COUNT];
    _Atomic uint64_t blocks_stored;
    _Atomic uint64_t hashes_removed;
    _Atomic uint64_t max_lag_ns;
    _Atomic uint64_t last_lag_ns;
    _Atomic uint64_t sleeps;
    _Atomic uint64_t busy_ns;
    _Atomic uint64_t idle_reclaims;
    KVI_CACHE_ALIGNED _Atomic uint64_t stalls; /* producers */
} KVI_CACHE_ALIGNED;

struct kvi_writer_pool {
    uint32_t n;
    uint32_t ring_cap;
    _Atomic bool stop;
    pthread_mutex_t lock;
    bool producer_used[KVI_PRODUCER_MAX];
    struct kvi_writer *w;
};

struct kvi_producer {
    struct kvi_writer_pool *pool;
    uint32_t slot;
    struct kvi_pring *pr[KVI_WRITER_MAX];
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, long timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}


/* After a dequeue from pr: wake its producer if it sleeps on a full ring
 * and the ring is now at most half full (one sleep per half ring, not one
 * per burst). Dekker with the producer's space_wait store (see
 * wait_for_space): a fence between our dequeue and our load of space_wait. */
static inline void space_made(struct kvi_pring *pr)
{
    kvi_fence_seq_cst();
    if (KVI_UNLIKELY(atomic_load_explicit(&pr->space_wait, memory_order_relaxed)) &&
        kvi_ring_count(pr->r) <= kvi_ring_capacity(pr->r) / 2) {
        atomic_fetch_add_explicit(&pr->space_seq, 1, memory_order_release);
        futex_wake(&pr->space_seq);
    }
}

static void mark_dirty(struct kvi_writer *w, struct kvi_index *ix)
{
    for (uint32_t i = 0; i < w->n_dirty; i++)
        if (w->dirty[i] == ix)
            return;
    if (w->n_dirty == DIRTY_MAX) {
        kvi_index_reclaim(w->dirty[0], w->id);
        w->dirty[0] = w->dirty[--w->n_dirty];
    }
    w->dirty[w->n_dirty++] = ix;
}

struct forget_arg {
    struct kvi_index *ix;
    struct kvi_writer_pool *pool;
};

/* Drop ix from the writer's dirty list and reclaim its partition. */
static void forget_dirty_on_writer(void *arg, uint32_t writer)
{
    struct forget_arg *f = arg;
    struct kvi_writer *w = &f->pool->w[writer];
    for (uint32_t i = 0; i < w->n_dirty; i++)
        if (w->dirty[i] == f->ix) {
            w->dirty[i] = w->dirty[--w->n_dirty];
            break;
        }
    kvi_index_reclaim(f->ix, writer);
}

/* Reclaim every dirty index after one grace period for all of them. */
static void reclaim_dirty(struct kvi_writer *w)
{
    bool wait = false;
    for (uint32_t i = 0; i < w->n_dirty; i++)
        wait |= kvi_index_reclaim_begin(w->dirty[i], w->id);
    if (wait) {
        kvi_relaxed_add(&w->idle_reclaims, 1);
        kvi_rcu_synchronize();
        for (uint32_t i = 0; i < w->n_dirty; i++)
            kvi_index_reclaim_end(w->dirty[i], w->id);
    }
    w->n_dirty = 0;
    w->last_reclaim_ns = kvi_now_ns();
}

static enum kvi_op_outcome store_outcome(int r)
{
    return r == -ENOENT ? KVI_OUT_PARENT_NOT_FOUND : r < 0 ? KVI_OUT_INVALID : KVI_OUT_APPLIED;
}

/* Relaxed add to a sink counter (plain u64, shared with its readers). */
static void sink_add(uint64_t *c, uint64_t v)
{
    if (v != 0)
        __atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

static void apply(struct kvi_writer *w, struct kvi_op *op)
{
    enum kvi_op_outcome out = KVI_OUT_APPLIED;
    uint64_t stored = 0, removed = 0, unknown = 0; /* for the op's sink */
    switch (op->type) {
    case KVI_OP_STORE: {
        int r;
        if (op->seq != NULL)
            r = kvi_index_store_seq(op->ix, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->has_parent,
                                    op->parent_engine_hash, op->position, op->blocks, op->seq, op->n);
        else
            r = kvi_index_store(op->ix, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->has_parent,
                                op->parent_engine_hash, op->blocks, op->n);
        out = store_outcome(r);
        stored = out == KVI_OUT_APPLIED ? op->n : 0;
        kvi_relaxed_add(&w->blocks_stored, op->n);
        mark_dirty(w, op->ix);
        break;
    }
    case KVI_OP_STORE_KNOWN: {
        size_t unres = 0;
        stored = kvi_index_store_known(op->ix, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->hashes, op->n,
                                       &unres);
        unknown = unres;
        kvi_relaxed_add(&w->blocks_stored, op->n);
        mark_dirty(w, op->ix);
        break;
    }
    case KVI_OP_STORE_SEQ_ONLY: {
        kvi_relaxed_add(&w->blocks_stored, op->n);
        if (op->seq == NULL && op->n > 0) {
            out = KVI_OUT_INVALID;
            break;
        }
        /* the index takes the engine hashes as one array: compact them in
         * place (hashes[i] overlays bytes of blocks[i / 2], already read) */
        for (uint32_t i = 0; i < op->n; i++) {
            uint64_t h = op->blocks[i].engine_hash;
            op->hashes[i] = h;
        }
        int r = kvi_index_store_seq_only(op->ix, op->instance, op->dp_rank, (enum kvi_tier)op->tier,
                                         op->has_parent, op->parent_engine_hash, op->position, op->hashes, op->seq,
                                         op->n);
        out = store_outcome(r);
        stored = out == KVI_OUT_APPLIED ? op->n : 0;
        mark_dirty(w, op->ix);
        break;
    }
    case KVI_OP_REMOVE:
        removed = kvi_index_remove(op->ix, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->hashes, op->n);
        kvi_relaxed_add(&w->hashes_removed, op->n);
        mark_dirty(w, op->ix);
        break;
    case KVI_OP_CLEAR:
        kvi_index_clear(op->ix, op->instance);
        mark_dirty(w, op->ix);
        break;
    case KVI_OP_CLEAR_DP_RANK:
        kvi_index_clear_dp_rank(op->ix, op->instance, op->dp_rank);
        mark_dirty(w, op->ix);
        break;
    case KVI_OP_REMOVE_DP_RANK:
        kvi_index_remove_dp_rank(op->ix, op->instance, op->dp_rank);
        mark_dirty(w, op->ix);
        break;
    case KVI_OP_REMOVE_INSTANCE:
        kvi_index_remove_instance(op->ix, op->instance);
        mark_dirty(w, op->ix);
        break;
    case KVI_OP_CALL:
        op->fn(op->arg, w->id);
        break;
    default:
        out = KVI_OUT_INVALID;
        break;
    }
    kvi_relaxed_add(&w->outcomes[out], 1);
    if (unknown != 0)
        kvi_relaxed_add(&w->outcomes[KVI_OUT_UNKNOWN_BLOCK], unknown);
    struct kvi_op_sink *sink = op->sink;
    if (sink != NULL) { /* before A1 of this burst: a flush sees these adds */
        sink_add(&sink->outcomes[out], 1);
        sink_add(&sink->outcomes[KVI_OUT_UNKNOWN_BLOCK], unknown);
        sink_add(&sink->blocks_stored, stored);
        sink_add(&sink->hashes_removed, removed);
        if (op->pub_applied) /* after the op: a dump on this writer sees both or neither */
            __atomic_store_n(&sink->applied1, op->applied1, __ATOMIC_RELEASE);
    }
    free(op);
}

void kvi_op_sink_read(const struct kvi_op_sink *sink, struct kvi_op_sink *out)
{
    for (int i = 0; i < KVI_OUT_COUNT; i++)
        out->outcomes[i] = __atomic_load_n(&sink->outcomes[i], __ATOMIC_RELAXED);
    out->blocks_stored = __atomic_load_n(&sink->blocks_stored, __ATOMIC_RELAXED);
    out->hashes_removed = __atomic_load_n(&sink->hashes_removed, __ATOMIC_RELAXED);
    out->applied1 = __atomic_load_n(&sink->applied1, __ATOMIC_ACQUIRE);
}

static bool rings_empty(struct kvi_writer *w)
{
    uint32_t nr = atomic_load_explicit(&w->n_rings, memory_order_acquire);
    for (uint32_t i = 0; i < nr; i++) {
        struct kvi_pring *pr = atomic_load_explicit(&w->rings[i], memory_order_acquire);
        if (pr != NULL && !kvi_ring_empty(pr->r))
            return false;
    }
    return true;
}

static void *writer_main(void *arg)
{
    struct kvi_writer *w = arg;
    char name[16];
    snprintf(name, sizeof name, "kvi-writer-%u", w->id);
    pthread_setname_np(pthread_self(), name);
    if (kvi_arena_bind_thread(w->arena) != 0)
        fprintf(stderr, "kvidx: writer %u could not bind its arena\n", w->id);
    void *buf[BURST];
    uint64_t idle_since = 0; /* 0: not idle */
    for (;;) {
        uint64_t got = 0;
        uint32_t nr = atomic_load_explicit(&w->n_rings, memory_order_acquire);
        for (uint32_t i = 0; i < nr; i++) {
            struct kvi_pring *pr = atomic_load_explicit(&w->rings[i], memory_order_acquire);
            if (pr == NULL)
                continue;
            uint32_t n = kvi_ring_dequeue_burst(pr->r, buf, BURST);
            if (n == 0)
                continue;
            space_made(pr);
            uint64_t t0 = kvi_now_ns();
            uint64_t lag = t0 - ((struct kvi_op *)buf[0])->enq_ns;
            atomic_store_explicit(&w->last_lag_ns, lag, memory_order_relaxed);
            if (lag > atomic_load_explicit(&w->max_lag_ns, memory_order_relaxed))
                atomic_store_explicit(&w->max_lag_ns, lag, memory_order_relaxed);
            for (uint32_t j = 0; j < n; j++) {
                if (j + 1 < n)
                    __builtin_prefetch(buf[j + 1]);
                apply(w, buf[j]);
            }
            kvi_relaxed_add(&w->ops, n);
            kvi_relaxed_add(&w->busy_ns, kvi_now_ns() - t0);
            atomic_fetch_add_explicit(&pr->applied, n, memory_order_release); /* A1 */
            got += n;
        }
        atomic_fetch_add_explicit(&w->scan_gen, 1, memory_order_release);
        if (got) {
            idle_since = 0;
            continue;
        }
        if (atomic_load_explicit(&w->pool->stop, memory_order_acquire) && rings_empty(w))
            break;
        uint64_t now = kvi_now_ns();
        if (w->n_dirty && now - w->last_reclaim_ns >= RECLAIM_IDLE_NS) {
            reclaim_dirty(w);
            continue;
        }
        if (idle_since == 0)
            idle_since = now;
        if (now - idle_since < SPIN_NS) {
            for (int i = 0; i < 32; i++)
                kvi_cpu_relax();
            continue;
        }
        uint32_t fv = atomic_load_explicit(&w->futex, memory_order_acquire);
        atomic_store_explicit(&w->sleeping, 1, memory_order_seq_cst);
        atomic_thread_fence(memory_order_seq_cst);
        if (rings_empty(w) && !atomic_load_explicit(&w->pool->stop, memory_order_acquire)) {
            kvi_relaxed_add(&w->sleeps, 1);
            /* dirty: wake up when the idle reclaim is due */
            long wait_ns = w->n_dirty ? (long)(RECLAIM_IDLE_NS - KVI_MIN(now - w->last_reclaim_ns, RECLAIM_IDLE_NS))
                                      : 100 * 1000 * 1000L;
            futex_wait(&w->futex, fv, KVI_MAX(wait_ns, 1000L));
        }
        atomic_store_explicit(&w->sleeping, 0, memory_order_relaxed);
        idle_since = 0;
    }
    reclaim_dirty(w);
    return NULL;
}

static void wake(struct kvi_writer *w)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&w->sleeping, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&w->futex, 1, memory_order_release);
        futex_wake(&w->futex);
    }
}

struct kvi_writer_pool *kvi_writer_pool_create(uint32_t n_writers, uint32_t ring_capacity)
{
    if (n_writers == 0 || n_writers > KVI_WRITER_MAX || ring_capacity > KVI_RING_MAX_CAPACITY) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_writer_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL)
        return NULL;
    pool->w = aligned_alloc(KVI_CACHE_LINE, sizeof(struct kvi_writer) * n_writers);
    if (pool->w == NULL) {
        free(pool);
        errno = ENOMEM;
        return NULL;
    }
    memset(pool->w, 0, sizeof(struct kvi_writer) * n_writers);
    pool->n = n_writers;
    pool->ring_cap = ring_capacity ? ring_capacity : 4096;
    pthread_mutex_init(&pool->lock, NULL);
    for (uint32_t i = 0; i < n_writers; i++) {
        struct kvi_writer *w = &pool->w[i];
        w->id = i;
        w->pool = pool;
        if (kvi_arena_create(&w->arena) != 0)
            w->arena = 0;
        int r = pthread_create(&w->tid, NULL, writer_main, w);
        if (r != 0) {
            atomic_store(&pool->stop, true);
            for (uint32_t j = 0; j < i; j++) {
                wake(&pool->w[j]);
                pthread_join(pool->w[j].tid, NULL);
            }
            pthread_mutex_destroy(&pool->lock);
            free(pool->w);
            free(pool);
            errno = r;
            return NULL;
        }
    }
    return pool;
}

void kvi_writer_pool_destroy(struct kvi_writer_pool *pool)
{
    if (pool == NULL)
        return;
    atomic_store_explicit(&pool->stop, true, memory_order_release);
    for (uint32_t i = 0; i < pool->n; i++) {
        struct kvi_writer *w = &pool->w[i];
        atomic_fetch_add_explicit(&w->futex, 1, memory_order_release);
        futex_wake(&w->futex);
        pthread_join(w->tid, NULL);
    }
    pthread_mutex_destroy(&pool->lock);
    free(pool->w);
    free(pool);
}

uint32_t kvi_writer_pool_size(const struct kvi_writer_pool *pool)
{
    return pool->n;
}

unsigned kvi_writer_arena(const struct kvi_writer_pool *pool, uint32_t w)
{
    return pool->w[w].arena;
}

struct kvi_producer *kvi_producer_create(struct kvi_writer_pool *pool)
{
    struct kvi_producer *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->pool = pool;
    pthread_mutex_lock(&pool->lock);
    uint32_t slot = KVI_PRODUCER_MAX;
    for (uint32_t i = 0; i < KVI_PRODUCER_MAX; i++)
        if (!pool->producer_used[i]) {
            slot = i;
            break;
        }
    if (slot == KVI_PRODUCER_MAX) {
        pthread_mutex_unlock(&pool->lock);
        free(p);
        errno = ENOSPC;
        return NULL;
    }
    pool->producer_used[slot] = true;
    p->slot = slot;
    for (uint32_t i = 0; i < pool->n; i++) {
        struct kvi_pring *pr = aligned_alloc(KVI_CACHE_LINE, sizeof *pr);
        if (pr == NULL)
            kvi_die("out of memory");
        memset(pr, 0, sizeof *pr);
        pr->r = kvi_ring_create(pool->ring_cap);
        if (pr->r == NULL)
            kvi_die("out of memory for a ring");
        p->pr[i] = pr;
        struct kvi_writer *w = &pool->w[i];
        atomic_store_explicit(&w->rings[slot], pr, memory_order_release);
        if (atomic_load_explicit(&w->n_rings, memory_order_relaxed) < slot + 1)
            atomic_store_explicit(&w->n_rings, slot + 1, memory_order_release);
    }
    pthread_mutex_unlock(&pool->lock);
    return p;
}

void kvi_producer_destroy(struct kvi_producer *p)
{
    if (p == NULL)
        return;
    kvi_producer_flush(p);
    struct kvi_writer_pool *pool = p->pool;
    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < pool->n; i++)
        atomic_store_explicit(&pool->w[i].rings[p->slot], NULL, memory_order_release);
    pthread_mutex_unlock(&pool->lock);
    /* wait until every writer has finished a scan that started after the
     * rings were unpublished: none can still hold a pointer to them */
    for (uint32_t i = 0; i < pool->n; i++) {
        struct kvi_writer *w = &pool->w[i];
        uint64_t g = atomic_load_explicit(&w->scan_gen, memory_order_acquire);
        while (atomic_load_explicit(&w->scan_gen, memory_order_acquire) < g + 2) {
            atomic_fetch_add_explicit(&w->futex, 1, memory_order_release);
            futex_wake(&w->futex);
            sched_yield();
        }
    }
    pthread_mutex_lock(&pool->lock); /* kvi_writer_stats reads rings under the lock */
    pool->producer_used[p->slot] = false;
    for (uint32_t i = 0; i < pool->n; i++) {
        kvi_ring_free(p->pr[i]->r);
        free(p->pr[i]);
    }
    pthread_mutex_unlock(&pool->lock);
    free(p);
}

struct kvi_op *kvi_op_alloc(uint32_t n, bool with_seq)
{
    size_t body = (size_t)n * sizeof(struct kvi_block);
    size_t seqb = with_seq ? (size_t)n * sizeof(uint64_t) : 0;
    struct kvi_op *op = kvi_xmalloc(sizeof *op + body + seqb);
    memset(op, 0, sizeof *op);
    op->n = n;
    if (with_seq)
        op->seq = (uint64_t *)((char *)(op + 1) + body);
    return op;
}

void kvi_op_free(struct kvi_op *op)
{
    free(op);
}

/*
 * The ring to writer w is full: spin briefly, then sleep until the writer has
 * emptied half of it (space_made), or 1 ms at most. A producer used to
 * sched_yield in a loop: with the writer saturated that tripled a listener's
 * CPU, and on a 2-core machine the spinning took CPU the writer needed.
 * measured (kvidx-bench ingest, 5 interleaved runs each, 2-cpu VM shared with
 * another benchmark): listener CPU 0.76-2.50 (median 1.43) -> 0.69-0.71 CPU-s
 * for the same batches; stored blocks/s 1.81-3.52 M -> 1.99-3.46 M (within
 * noise). A producer held 300 ms by a blocked writer: 277 -> 3.5 ms of CPU.
 */
static void wait_for_space(struct kvi_pring *pr, struct kvi_writer *w, uint32_t *spins)
{
    wake(w);
    if (++*spins <= 16) {
        for (int i = 0; i < 64; i++)
            kvi_cpu_relax();
        return;
    }
    uint32_t seq = atomic_load_explicit(&pr->space_seq, memory_order_acquire);
    atomic_store_explicit(&pr->space_wait, 1, memory_order_relaxed);
    kvi_fence_seq_cst(); /* Dekker with space_made */
    if (kvi_ring_count(pr->r) > kvi_ring_capacity(pr->r) / 2)
        futex_wait(&pr->space_seq, seq, 1000000L);
    atomic_store_explicit(&pr->space_wait, 0, memory_order_relaxed);
}

static void enqueue_all(struct kvi_producer *p, uint32_t wi, struct kvi_op **ops, uint32_t n)
{
    struct kvi_pring *pr = p->pr[wi];
    struct kvi_writer *w = &p->pool->w[wi];
    uint32_t done = 0, spins = 0;
    atomic_fetch_add_explicit(&pr->submitted, n, memory_order_relaxed);
    while (done < n) {
        uint32_t k = kvi_ring_enqueue_burst(pr->r, (void *const *)(ops + done), n - done);
        done += k;
        if (done < n) {
            if (spins == 0)
                atomic_fetch_add_explicit(&w->stalls, 1, memory_order_relaxed);
            wait_for_space(pr, w, &spins);
        }
    }
    wake(w);
}

void kvi_producer_submit(struct kvi_producer *p, struct kvi_op *op)
{
    kvi_producer_submit_burst(p, &op, 1);
}

static uint32_t op_writer(const struct kvi_producer *p, const struct kvi_op *op)
{
    if (op->type == KVI_OP_CALL)
        return op->instance % p->pool->n; /* instance carries the writer for CALL */
    return kvi_index_partition_of(op->ix, op->instance) % p->pool->n;
}

void kvi_producer_submit_burst(struct kvi_producer *p, struct kvi_op **ops, size_t n)
{
    uint64_t now = kvi_now_ns();
    size_t i = 0;
    while (i < n) {
        uint32_t wi = op_writer(p, ops[i]);
        size_t j = i;
        while (j < n && j - i < BURST && op_writer(p, ops[j]) == wi) {
            ops[j]->enq_ns = now;
            j++;
        }
        enqueue_all(p, wi, ops + i, (uint32_t)(j - i));
        i = j;
    }
}

void kvi_producer_flush(struct kvi_producer *p)
{
    for (uint32_t i = 0; i < p->pool->n; i++) {
        struct kvi_pring *pr = p->pr[i];
        uint64_t want = atomic_load_explicit(&pr->submitted, memory_order_relaxed);
        uint32_t spins = 0;
        while (atomic_load_explicit(&pr->applied, memory_order_acquire) < want) { /* pairs with A1 */
            wake(&p->pool->w[i]);
            if (++spins < 64)
                sched_yield();
            else
                usleep(50);
        }
    }
}

void kvi_producer_call(struct kvi_producer *p, uint32_t writer, void (*fn)(void *arg, uint32_t writer), void *arg)
{
    struct kvi_op *op = kvi_op_alloc(0, false);
    op->type = KVI_OP_CALL;
    op->instance = writer;
    op->fn = fn;
    op->arg = arg;
    kvi_producer_submit(p, op);
    kvi_producer_flush(p);
}

struct dump_call {
    struct kvi_index *ix;
    void (*pre)(void *ctx, uint32_t part);
    kvi_dump_fn emit;
    void *ctx;
};

static void dump_on_writer(void *arg, uint32_t writer)
{
    struct dump_call *d = arg;
    if (d->pre != NULL)
        d->pre(d->ctx, writer);
    kvi_index_dump_partition(d->ix, writer, d->emit, d->ctx);
}

void kvi_producer_dump_partition_pre(struct kvi_producer *p, struct kvi_index *ix, uint32_t part,
                                     void (*pre)(void *ctx, uint32_t part), kvi_dump_fn emit, void *ctx)
{
    if (part >= kvi_index_n_parts(ix) || part >= p->pool->n)
        return;
    struct dump_call d = {ix, pre, emit, ctx};
    kvi_producer_call(p, part, dump_on_writer, &d); /* partition `part` is writer `part`'s */
}

void kvi_producer_dump_partition(struct kvi_producer *p, struct kvi_index *ix, uint32_t part, kvi_dump_fn emit,
                                 void *ctx)
{
    kvi_producer_dump_partition_pre(p, ix, part, NULL, emit, ctx);
}

uint64_t kvi_op_sink_applied(const struct kvi_op_sink *sink)
{
    return __atomic_load_n(&sink->applied1, __ATOMIC_ACQUIRE);
}

void kvi_op_sink_set_applied(struct kvi_op_sink *sink, uint64_t applied1)
{
    __atomic_store_n(&sink->applied1, applied1, __ATOMIC_RELEASE);
}

void kvi_producer_dump(struct kvi_producer *p, struct kvi_index *ix, kvi_dump_fn emit, void *ctx)
{
    for (uint32_t w = 0; w < kvi_index_n_parts(ix) && w < p->pool->n; w++)
        kvi_producer_dump_partition(p, ix, w, emit, ctx);
}

void kvi_writer_stats(const struct kvi_writer_pool *pool, uint32_t wi, struct kvi_writer_stats *st)
{
    struct kvi_writer *w = &pool->w[wi];
    memset(st, 0, sizeof *st);
    st->ops = atomic_load_explicit(&w->ops, memory_order_relaxed);
    for (int i = 0; i < KVI_OUT_COUNT; i++)
        st->outcomes[i] = atomic_load_explicit(&w->outcomes[i], memory_order_relaxed);
    st->blocks_stored = atomic_load_explicit(&w->blocks_stored, memory_order_relaxed);
    st->hashes_removed = atomic_load_explicit(&w->hashes_removed, memory_order_relaxed);
    st->max_lag_ns = atomic_load_explicit(&w->max_lag_ns, memory_order_relaxed);
    st->last_lag_ns = atomic_load_explicit(&w->last_lag_ns, memory_order_relaxed);
    st->sleeps = atomic_load_explicit(&w->sleeps, memory_order_relaxed);
    st->stalls = atomic_load_explicit(&w->stalls, memory_order_relaxed);
    st->busy_ns = atomic_load_explicit(&w->busy_ns, memory_order_relaxed);
    st->idle_reclaims = atomic_load_explicit(&w->idle_reclaims, memory_order_relaxed);
    pthread_mutex_lock(&((struct kvi_writer_pool *)pool)->lock);
    uint32_t nr = atomic_load_explicit(&w->n_rings, memory_order_acquire);
    for (uint32_t i = 0; i < nr; i++) {
        struct kvi_pring *pr = atomic_load_explicit(&w->rings[i], memory_order_acquire);
        if (pr != NULL)
            st->queued += atomic_load_explicit(&pr->submitted, memory_order_relaxed) -
                          atomic_load_explicit(&pr->applied, memory_order_relaxed);
    }
    pthread_mutex_unlock(&((struct kvi_writer_pool *)pool)->lock);
}

void kvi_producer_forget_index(struct kvi_producer *p, struct kvi_index *ix)
{
    struct forget_arg f = {ix, p->pool};
    for (uint32_t i = 0; i < p->pool->n; i++)
        kvi_producer_call(p, i, forget_dirty_on_writer, &f);
}
