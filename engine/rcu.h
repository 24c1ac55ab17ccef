/*
 * kvidx RCU: a thin layer over liburcu's memb flavour.
 *
 * Every thread that reads the index must be a registered reader
 * (kvi_rcu_register_thread) and must hold a read-side critical section
 * (kvi_rcu_read_lock ... kvi_rcu_read_unlock) around each query. Read-side
 * sections are wait-free (~1 ns with membarrier support) and may nest.
 *
 * Writers retire memory with kvi_rcu_synchronize() (blocking until every
 * pre-existing read-side section has ended) and then free it. Under
 * ThreadSanitizer (KVI_TSAN) the layer adds release/acquire edges between the
 * end of each read-side section and the grace-period wait, which liburcu 0.13
 * does not annotate, so TSan sees the happens-before that RCU guarantees.
 */
#ifndef KVI_ENGINE_RCU_H
#define KVI_ENGINE_RCU_H

#include <urcu/urcu-memb.h>

#ifdef KVI_TSAN
#include <stdatomic.h>
extern _Thread_local _Atomic unsigned long kvi_rcu__tsan_gen;
void kvi_rcu__tsan_register(void);
void kvi_rcu__tsan_unregister(void);
void kvi_rcu__tsan_acquire_all(void);
#endif

/** Register the calling thread as an RCU reader. Call once per thread. */
static inline void kvi_rcu_register_thread(void)
{
    urcu_memb_register_thread();
#ifdef KVI_TSAN
    kvi_rcu__tsan_register();
#endif
}

/** Unregister the calling thread. Not inside a read-side section. */
static inline void kvi_rcu_unregister_thread(void)
{
#ifdef KVI_TSAN
    kvi_rcu__tsan_unregister();
#endif
    urcu_memb_unregister_thread();
}

/** Enter a read-side critical section (wait-free, nestable). */
static inline void kvi_rcu_read_lock(void)
{
    urcu_memb_read_lock();
}

/** Leave a read-side critical section. */
static inline void kvi_rcu_read_unlock(void)
{
#ifdef KVI_TSAN
    atomic_fetch_add_explicit(&kvi_rcu__tsan_gen, 1, memory_order_release); /* pairs with acquire_all */
#endif
    urcu_memb_read_unlock();
}

/**
 * Wait for a grace period: every read-side section that began before the call
 * has ended when it returns. Must not be called inside a read-side section.
 */
static inline void kvi_rcu_synchronize(void)
{
    urcu_memb_synchronize_rcu();
#ifdef KVI_TSAN
    kvi_rcu__tsan_acquire_all();
#endif
}

/** Publish a pointer to readers (release store). */
#define kvi_rcu_assign(p, v) atomic_store_explicit(&(p), (v), memory_order_release)
/** Read an RCU-published pointer inside a read-side section (acquire load). */
#define kvi_rcu_deref(p) atomic_load_explicit(&(p), memory_order_acquire)

#endif
