/*
 * cmocka group fixtures for test programs whose tests call the index from
 * the main thread: the thread is an RCU reader for the whole group.
 * Pass them to cmocka_run_group_tests.
 */
#ifndef KVI_TESTS_RCU_GROUP_H
#define KVI_TESTS_RCU_GROUP_H

#include "engine/rcu.h"

static inline int kvi_test_rcu_setup(void **state)
{
    (void)state;
    kvi_rcu_register_thread();
    return 0;
}

static inline int kvi_test_rcu_teardown(void **state)
{
    (void)state;
    kvi_rcu_unregister_thread();
    return 0;
}

#endif
