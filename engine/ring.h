/*
 * kvidx ring: a bounded single-producer / single-consumer FIFO of pointers
 * with burst operations, used between producer threads and the per-core
 * writer threads (one ring per (producer, writer) pair).
 *
 * Indices are free-running 32-bit counters: _head counts objects ever
 * enqueued, _tail objects ever dequeued, slot = index & _mask. head - tail
 * (unsigned, wrapping) is the number of objects in the ring, so all
 * 2^k slots are usable (no wasted slot). Capacity is at most 2^30, far below
 * the 2^31 limit at which the subtraction would become ambiguous.
 *
 * Each side keeps a private cached copy of the other side's index
 * (_tail_cache, _head_cache) and reads the shared index only when the cached
 * copy says there is not enough room / not enough objects. In steady state a
 * burst therefore touches only its own cache line plus the slots.
 *
 * Synchronisation table (X: the pair must not run concurrently; the caller
 * provides exclusion, normally by giving each role to one thread; -: the pair
 * may run concurrently on the same ring):
 *
 *                      enqueue*  dequeue*  count/free_count/empty  create/free
 *   enqueue*  (+ zc)      X         -               -                   X
 *   dequeue*              -         X               -                   X
 *   count/free_count/...  -         -               -                   X
 *
 * A role may move to another thread only across a happens-before edge
 * (mutex, pthread_join, a release/acquire pair), because the cached index of
 * that role is a plain field.
 *
 * Memory-ordering edges (labels are used at each atomic operation):
 *   R1 (enqueue: release store of _head) pairs with A1 (dequeue: acquire load
 *      of _head): slot writes, and everything the producer wrote before the
 *      enqueue, are visible to the consumer that dequeues the objects.
 *   R2 (dequeue: release store of _tail) pairs with A2 (enqueue: acquire load
 *      of _tail): the consumer's slot reads finish before the producer
 *      overwrites those slots.
 *   R3 (zc finish: release store of _head) pairs with A1 like R1.
 *   A3/A4 (count: acquire loads) pair with R2/R1; they only make the
 *      snapshot ordered (tail read before head) so it is never negative.
 */
#ifndef KVI_ENGINE_RING_H
#define KVI_ENGINE_RING_H

#include <assert.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"

/** Largest capacity kvi_ring_create accepts. */
#define KVI_RING_MAX_CAPACITY (UINT32_C(1) << 30)


/**
 * The ring. Fields are private (leading underscore); use the functions below.
 *
 * Layout: the producer line (_head, _tail_cache, _zc_reserved) and the
 * consumer line (_tail, _head_cache) are written by different threads, so
 * each has its own cache line, followed by a guard line so the adjacent-line
 * prefetcher does not pair them either (false sharing between producer and
 * consumer). The read-only line (_mask, _capacity) is never written after
 * create, so both sides keep it shared. Slots start on their own line so
 * producer writes to slot 0 do not invalidate the read-only line.
 */
struct kvi_ring {
    /* producer line: written only by the producer */
    alignas(KVI_CACHE_LINE) _Atomic uint32_t _head; /* objects ever enqueued */
    uint32_t _tail_cache;                           /* producer's last view of _tail */
    uint32_t _zc_reserved;                          /* slots held by a zc start */
    alignas(KVI_CACHE_LINE) char _guard_prod[KVI_CACHE_LINE];

    /* consumer line: written only by the consumer */
    alignas(KVI_CACHE_LINE) _Atomic uint32_t _tail; /* objects ever dequeued */
    uint32_t _head_cache;                           /* consumer's last view of _head */
    alignas(KVI_CACHE_LINE) char _guard_cons[KVI_CACHE_LINE];

    /* read-only after kvi_ring_create */
    alignas(KVI_CACHE_LINE) uint32_t _mask; /* capacity - 1 */
    uint32_t _capacity;                     /* power of two, 2 .. 2^30 */

    alignas(KVI_CACHE_LINE) void *_slots[];
};

static_assert(ATOMIC_INT_LOCK_FREE == 2, "kvi_ring needs lock-free 32-bit atomics");
static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t), "atomic index size");
#define KVI_RING__OFF(f) offsetof(struct kvi_ring, f)
static_assert(KVI_RING__OFF(_head) % KVI_CACHE_LINE == 0, "producer line aligned");
static_assert(KVI_RING__OFF(_tail) % KVI_CACHE_LINE == 0, "consumer line aligned");
static_assert(KVI_RING__OFF(_mask) % KVI_CACHE_LINE == 0, "read-only line aligned");
static_assert(KVI_RING__OFF(_slots) % KVI_CACHE_LINE == 0, "slots aligned");
static_assert(KVI_RING__OFF(_guard_prod) - KVI_RING__OFF(_head) == KVI_CACHE_LINE,
              "producer fields fit one line");
static_assert(KVI_RING__OFF(_guard_cons) - KVI_RING__OFF(_tail) == KVI_CACHE_LINE,
              "consumer fields fit one line");
static_assert(KVI_RING__OFF(_tail) - KVI_RING__OFF(_head) >= 2 * KVI_CACHE_LINE,
              "guard line between producer and consumer");
static_assert(KVI_RING__OFF(_mask) - KVI_RING__OFF(_tail) >= 2 * KVI_CACHE_LINE,
              "guard line between consumer and read-only fields");
#undef KVI_RING__OFF
static_assert(sizeof(struct kvi_ring) % KVI_CACHE_LINE == 0, "header is whole cache lines");
static_assert(alignof(struct kvi_ring) == KVI_CACHE_LINE, "ring is cache-line aligned");

/**
 * Free slots handed out by kvi_ring_enqueue_zc_burst_start: the caller writes
 * ptr1[0 .. n1-1] and then ptr2[0 .. n - n1 - 1] (ptr2 is NULL when the
 * reservation does not wrap), where n is the start function's return value.
 */
struct kvi_ring_zc {
    void **ptr1;
    uint32_t n1;
    void **ptr2;
};

/**
 * Free a ring; objects still in it are not touched.
 * No enqueue, dequeue or count may be running on @p r or follow the call.
 * @param r  the ring, or NULL (no-op)
 */
void kvi_ring_free(struct kvi_ring *r);

/**
 * Create an empty ring. Any thread; hand the ring to its producer and
 * consumer threads across a happens-before edge (pthread_create, a mutex, a
 * release store).
 *
 * @param capacity  requested number of objects; rounded up to a power of two,
 *                  at least 2. All of the rounded capacity is usable.
 * @return the ring, cache-line aligned; free it with kvi_ring_free. On failure
 *         NULL with errno set to:
 *         - EINVAL: @p capacity is 0 or greater than KVI_RING_MAX_CAPACITY;
 *         - ENOMEM: out of memory.
 */
KVI_DEALLOC(kvi_ring_free, 1) KVI_WARN_UNUSED struct kvi_ring *kvi_ring_create(uint32_t capacity);

/**
 * Enqueue as many of @p n objects as fit (single producer only).
 *
 * Safe concurrently with one consumer. Acts as a release store: everything
 * the producer wrote before the call is visible to the consumer once it has
 * dequeued the objects.
 * @param r     the ring
 * @param objs  the objects (any pointer values, NULL included), in order
 * @param n     number of objects in @p objs
 * @return the number enqueued, objs[0 .. return-1], 0 .. @p n; 0 when full.
 */
static inline uint32_t kvi_ring_enqueue_burst(struct kvi_ring *r, void *const *objs, uint32_t n);

/**
 * Enqueue all @p n objects or none (single producer only).
 *
 * Same contract as kvi_ring_enqueue_burst.
 * @return @p n if all were enqueued, otherwise 0 and the ring is unchanged
 *         (also 0 when @p n exceeds the capacity).
 */
static inline uint32_t kvi_ring_enqueue_bulk(struct kvi_ring *r, void *const *objs, uint32_t n);

/**
 * Dequeue up to @p n objects in FIFO order (single consumer only).
 *
 * Safe concurrently with one producer. Acts as an acquire load: what the
 * producer wrote before enqueuing the returned objects is visible.
 * @param r     the ring
 * @param objs  receives the objects; room for @p n
 * @param n     maximum number to dequeue
 * @return the number dequeued, 0 .. @p n; 0 when empty.
 */
static inline uint32_t kvi_ring_dequeue_burst(struct kvi_ring *r, void **objs, uint32_t n);

/**
 * Dequeue exactly @p n objects or none (single consumer only).
 *
 * Same contract as kvi_ring_dequeue_burst.
 * @return @p n if that many were available, otherwise 0 and the ring is
 *         unchanged.
 */
static inline uint32_t kvi_ring_dequeue_bulk(struct kvi_ring *r, void **objs, uint32_t n);

/**
 * Reserve up to @p n free slots for zero-copy enqueue (single producer only).
 *
 * The producer writes the objects straight into the slots described by
 * @p zc, then publishes them with kvi_ring_enqueue_zc_finish. Until then the
 * reserved slots are invisible to the consumer, and the producer must not
 * call any other enqueue function on @p r.
 * @param r   the ring
 * @param n   maximum number of slots wanted
 * @param zc  receives the slot pointers ({NULL, 0, NULL} when 0 is returned)
 * @return the number of slots reserved, 0 .. @p n; 0 when full (then there is
 *         nothing to finish).
 */
static inline uint32_t kvi_ring_enqueue_zc_burst_start(struct kvi_ring *r, uint32_t n,
                                                       struct kvi_ring_zc *zc);

/**
 * Publish the first @p n slots of the last zero-copy reservation (single
 * producer only). Acts as a release store, as kvi_ring_enqueue_burst.
 * @param r  the ring
 * @param n  number of slots written, at most the reserved count (0 cancels
 *           the reservation); unwritten reserved slots return to the ring.
 */
static inline void kvi_ring_enqueue_zc_finish(struct kvi_ring *r, uint32_t n);

/**
 * Number of objects in the ring. Exact when neither side is running;
 * approximate when called concurrently with enqueue or dequeue (a snapshot
 * that may be stale by the time it returns). From the consumer thread it is a
 * lower bound of what the next dequeue can get. Any thread.
 * @return 0 .. capacity.
 */
static inline uint32_t kvi_ring_count(const struct kvi_ring *r);

/**
 * Number of free slots: capacity - kvi_ring_count. Approximate when called
 * concurrently, as kvi_ring_count; from the producer thread it is a lower
 * bound of what the next enqueue can store. Any thread.
 * @return 0 .. capacity.
 */
static inline uint32_t kvi_ring_free_count(const struct kvi_ring *r);

/** Usable capacity (the rounded power of two). Exact; any thread. */
static inline uint32_t kvi_ring_capacity(const struct kvi_ring *r);

/**
 * Whether the ring holds no objects. Approximate when called concurrently, as
 * kvi_ring_count. Any thread.
 * @return nonzero if empty.
 */
static inline int kvi_ring_empty(const struct kvi_ring *r);

/* inline defs */

/* How many objects a core operation moves. Constant at every call site. */
enum kvi_ring__mode {
    KVI_RING__FIXED = 0,    /* bulk: all or nothing */
    KVI_RING__VARIABLE = 1, /* burst: as many as possible */
};

/*
 * Free slots as seen by the producer, refreshing the cached tail only when
 * the cached view does not already show @p want free slots.
 */
static inline uint32_t kvi_ring__prod_free(struct kvi_ring *r, uint32_t head, uint32_t want)
{
    uint32_t free_n = r->_capacity - (head - r->_tail_cache);
    if (free_n < want) {
        /* A2: pairs with R2 in kvi_ring_dequeue_burst */
        r->_tail_cache = atomic_load_explicit(&r->_tail, memory_order_acquire);
        free_n = r->_capacity - (head - r->_tail_cache);
    }
    return free_n;
}

/* Core enqueue: @p mode is a constant so the untaken branch folds away. */
static inline uint32_t kvi_ring__do_enqueue(struct kvi_ring *r, void *const *objs, uint32_t n,
                                            enum kvi_ring__mode mode)
{
    KVI_DEBUG_ASSERT(r->_zc_reserved == 0);
    uint32_t head = atomic_load_explicit(&r->_head, memory_order_relaxed); /* own index */
    uint32_t free_n = kvi_ring__prod_free(r, head, n);
    if (n > free_n) {
        if (mode == KVI_RING__FIXED)
            return 0;
        n = free_n;
    }
    if (KVI_UNLIKELY(n == 0))
        return 0;

    uint32_t idx = head & r->_mask;
    uint32_t first = r->_capacity - idx; /* slots before the wrap */
    void **slots = r->_slots;
    if (KVI_LIKELY(n <= first)) {
        for (uint32_t i = 0; i < n; i++)
            slots[idx + i] = objs[i];
    } else {
        for (uint32_t i = 0; i < first; i++)
            slots[idx + i] = objs[i];
        for (uint32_t i = first; i < n; i++)
            slots[i - first] = objs[i];
    }
    /* R1: pairs with A1 in kvi_ring_dequeue_burst */
    atomic_store_explicit(&r->_head, head + n, memory_order_release);
    return n;
}

/* Core dequeue: @p mode is a constant so the untaken branch folds away. */
static inline uint32_t kvi_ring__do_dequeue(struct kvi_ring *r, void **objs, uint32_t n,
                                            enum kvi_ring__mode mode)
{
    uint32_t tail = atomic_load_explicit(&r->_tail, memory_order_relaxed); /* own index */
    uint32_t avail = r->_head_cache - tail;
    if (avail < n) {
        /* A1: pairs with R1 in kvi_ring_enqueue_burst and R3 in kvi_ring_enqueue_zc_finish */
        r->_head_cache = atomic_load_explicit(&r->_head, memory_order_acquire);
        avail = r->_head_cache - tail;
        if (n > avail) {
            if (mode == KVI_RING__FIXED)
                return 0;
            n = avail;
        }
    }
    if (KVI_UNLIKELY(n == 0))
        return 0;

    uint32_t idx = tail & r->_mask;
    uint32_t first = r->_capacity - idx;
    void *const *slots = r->_slots;
    if (KVI_LIKELY(n <= first)) {
        for (uint32_t i = 0; i < n; i++)
            objs[i] = slots[idx + i];
    } else {
        for (uint32_t i = 0; i < first; i++)
            objs[i] = slots[idx + i];
        for (uint32_t i = first; i < n; i++)
            objs[i] = slots[i - first];
    }
    /* R2: pairs with A2 in kvi_ring_enqueue_burst */
    atomic_store_explicit(&r->_tail, tail + n, memory_order_release);
    return n;
}

static inline uint32_t kvi_ring_enqueue_burst(struct kvi_ring *r, void *const *objs, uint32_t n)
{
    return kvi_ring__do_enqueue(r, objs, n, KVI_RING__VARIABLE);
}

static inline uint32_t kvi_ring_enqueue_bulk(struct kvi_ring *r, void *const *objs, uint32_t n)
{
    return kvi_ring__do_enqueue(r, objs, n, KVI_RING__FIXED);
}

static inline uint32_t kvi_ring_dequeue_burst(struct kvi_ring *r, void **objs, uint32_t n)
{
    return kvi_ring__do_dequeue(r, objs, n, KVI_RING__VARIABLE);
}

static inline uint32_t kvi_ring_dequeue_bulk(struct kvi_ring *r, void **objs, uint32_t n)
{
    return kvi_ring__do_dequeue(r, objs, n, KVI_RING__FIXED);
}

static inline uint32_t kvi_ring_enqueue_zc_burst_start(struct kvi_ring *r, uint32_t n,
                                                       struct kvi_ring_zc *zc)
{
    KVI_DEBUG_ASSERT(r->_zc_reserved == 0);
    uint32_t head = atomic_load_explicit(&r->_head, memory_order_relaxed); /* own index */
    uint32_t free_n = kvi_ring__prod_free(r, head, n);
    if (n > free_n)
        n = free_n;
    if (KVI_UNLIKELY(n == 0)) {
        *zc = (struct kvi_ring_zc){NULL, 0, NULL};
        return 0;
    }

    uint32_t idx = head & r->_mask;
    uint32_t first = r->_capacity - idx;
    zc->ptr1 = &r->_slots[idx];
    if (KVI_LIKELY(n <= first)) {
        zc->n1 = n;
        zc->ptr2 = NULL;
    } else {
        zc->n1 = first;
        zc->ptr2 = &r->_slots[0];
    }
    r->_zc_reserved = n;
    return n;
}

static inline void kvi_ring_enqueue_zc_finish(struct kvi_ring *r, uint32_t n)
{
    KVI_DEBUG_ASSERT(n <= r->_zc_reserved);
    r->_zc_reserved = 0;
    if (n == 0)
        return;
    uint32_t head = atomic_load_explicit(&r->_head, memory_order_relaxed); /* own index */
    /* R3: pairs with A1 in kvi_ring_dequeue_burst */
    atomic_store_explicit(&r->_head, head + n, memory_order_release);
}

static inline uint32_t kvi_ring_count(const struct kvi_ring *r)
{
    /* A3: pairs with R2 in kvi_ring_dequeue_burst; orders the head load after it */
    uint32_t tail = atomic_load_explicit(&r->_tail, memory_order_acquire);
    /* A4: pairs with R1 in kvi_ring_enqueue_burst */
    uint32_t head = atomic_load_explicit(&r->_head, memory_order_acquire);
    uint32_t n = head - tail; /* head read last: never below tail */
    /* Both sides may have moved between the loads: clamp the snapshot. */
    return n > r->_capacity ? r->_capacity : n;
}

static inline uint32_t kvi_ring_free_count(const struct kvi_ring *r)
{
    return r->_capacity - kvi_ring_count(r);
}

static inline uint32_t kvi_ring_capacity(const struct kvi_ring *r)
{
    return r->_capacity;
}

static inline int kvi_ring_empty(const struct kvi_ring *r)
{
    return kvi_ring_count(r) == 0;
}

#endif
