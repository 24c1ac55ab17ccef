#include "engine/rcu.h"

#ifdef KVI_TSAN
#include <pthread.h>

/*
 * Registry of reader generation counters. A reader's unlock performs a release
 * increment on its counter; kvi_rcu_synchronize() performs an acquire load on
 * every counter after the grace period, which TSan records as the
 * happens-before edge that the grace period provides.
 */
_Thread_local _Atomic unsigned long kvi_rcu__tsan_gen;

#define KVI_RCU_TSAN_MAX 1024
static _Atomic unsigned long *registry[KVI_RCU_TSAN_MAX];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

void kvi_rcu__tsan_register(void)
{
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < KVI_RCU_TSAN_MAX; i++)
        if (registry[i] == NULL) {
            registry[i] = &kvi_rcu__tsan_gen;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}

void kvi_rcu__tsan_unregister(void)
{
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < KVI_RCU_TSAN_MAX; i++)
        if (registry[i] == &kvi_rcu__tsan_gen)
            registry[i] = NULL;
    pthread_mutex_unlock(&registry_lock);
}

void kvi_rcu__tsan_acquire_all(void)
{
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < KVI_RCU_TSAN_MAX; i++)
        if (registry[i] != NULL)
            (void)atomic_load_explicit(registry[i], memory_order_acquire);
    pthread_mutex_unlock(&registry_lock);
}
#else
/* Keep the translation unit non-empty in regular builds. */
typedef int kvi_rcu_no_tsan;
#endif
