/* Namespace registry: add/find/list/unlink, and readers racing with changes. */
/* ctest-labels: unit tsan */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/namespace.h"
#include "engine/rcu.h"

static const struct kvi_index_config TMPL = {.block_size = 0, .n_parts = 1, .jump = 0, .key_seed = 7};

static void test_add_find_unlink(void **state)
{
    struct kvi_nsreg *r = kvi_nsreg_create(&TMPL);
    assert_non_null(r);
    struct kvi_ns *a, *b, *again;
    assert_int_equal(kvi_nsreg_add(r, "llama", "default", 16, &a), 1);
    assert_int_equal(kvi_index_block_size(a->ix), 16);
    assert_int_equal(kvi_nsreg_add(r, "llama", "default", 32, &again), 0);
    assert_ptr_equal(again, a);
    assert_int_equal(again->block_size, 16);
    assert_int_equal(kvi_nsreg_add(r, "llama", "acme", 32, &b), 1);
    assert_int_equal(kvi_nsreg_add(r, "", "x", 16, &again), -EINVAL);
    assert_int_equal(kvi_nsreg_add(r, "m", "t", 0, &again), -EINVAL);

    kvi_rcu_register_thread();
    kvi_rcu_read_lock();
    assert_ptr_equal(kvi_nsreg_find(r, "llama", "default"), a);
    assert_ptr_equal(kvi_nsreg_find(r, "llama", "acme"), b);
    assert_null(kvi_nsreg_find(r, "llama", "other"));
    assert_null(kvi_nsreg_find(r, "llamadefault", ""));
    struct kvi_ns *list[4];
    assert_int_equal(kvi_nsreg_list(r, list, 4), 2);
    assert_ptr_equal(list[0], b); /* sorted: acme < default */
    assert_ptr_equal(list[1], a);
    kvi_rcu_read_unlock();

    assert_int_equal(kvi_nsreg_unlink(r, a), 0);
    assert_int_equal(kvi_nsreg_unlink(r, a), -ENOENT);
    kvi_rcu_read_lock();
    assert_null(kvi_nsreg_find(r, "llama", "default"));
    assert_int_equal(kvi_nsreg_list(r, list, 4), 1);
    kvi_rcu_read_unlock();
    kvi_ns_free(a);
    kvi_rcu_unregister_thread();
    kvi_nsreg_destroy(r);
}

static void test_many(void **state)
{
    struct kvi_nsreg *r = kvi_nsreg_create(&TMPL);
    char m[32];
    struct kvi_ns *ns;
    for (int i = 0; i < 300; i++) {
        snprintf(m, sizeof(m), "model-%d", i);
        assert_int_equal(kvi_nsreg_add(r, m, "t", 16, &ns), 1);
    }
    kvi_rcu_register_thread();
    kvi_rcu_read_lock();
    for (int i = 0; i < 300; i++) {
        snprintf(m, sizeof(m), "model-%d", i);
        ns = kvi_nsreg_find(r, m, "t");
        assert_non_null(ns);
        assert_string_equal(ns->model, m);
    }
    assert_int_equal(kvi_nsreg_list(r, NULL, 0), 300);
    kvi_rcu_read_unlock();
    kvi_rcu_unregister_thread();
    kvi_nsreg_destroy(r);
}

#define RACE_READERS 2

struct race {
    struct kvi_nsreg *r;
    atomic_bool stop;
    atomic_bool waiting;                 /* the writer waits for the readers */
    atomic_ulong lookups[RACE_READERS];  /* lookups of "stable" completed, per reader */
    atomic_ulong bad;                    /* lookups that missed it or saw it wrong */
};

struct race_reader {
    struct race *x;
    int id;
};

/* Looks up the namespace nobody changes, without pause. A miss is counted,
 * not asserted (cmocka asserts belong to the main thread), and the reader
 * goes on: the writer waits for its progress. */
static void *reader(void *arg)
{
    const struct race_reader *rr = arg;
    struct race *x = rr->x;
    kvi_rcu_register_thread();
    while (!atomic_load(&x->stop)) {
        kvi_rcu_read_lock();
        struct kvi_ns *ns = kvi_nsreg_find(x->r, "stable", "t");
        if (ns == NULL || strcmp(ns->model, "stable") != 0 || kvi_index_block_size(ns->ix) != 16)
            atomic_fetch_add(&x->bad, 1);
        kvi_rcu_read_unlock();
        atomic_fetch_add(&x->lookups[rr->id], 1);
        if (atomic_load_explicit(&x->waiting, memory_order_relaxed))
            sched_yield(); /* hand the cpu back to the waiting writer */
    }
    kvi_rcu_unregister_thread();
    return NULL;
}

/* Return once every reader has run a whole lookup on the registry as it is
 * now (the second completion from here started after this call). */
static void wait_readers(struct race *x)
{
    unsigned long want[RACE_READERS];
    for (int i = 0; i < RACE_READERS; i++)
        want[i] = atomic_load(&x->lookups[i]) + 2;
    atomic_store(&x->waiting, true);
    for (int i = 0; i < RACE_READERS; i++)
        while (atomic_load(&x->lookups[i]) < want[i])
            sched_yield();
    atomic_store(&x->waiting, false);
}

static void test_readers_race_changes(void **state)
{
    static struct race x; /* static: readers still run if an assert below fails */
    memset(&x, 0, sizeof x);
    x.r = kvi_nsreg_create(&TMPL);
    struct kvi_ns *stable, *ns;
    assert_int_equal(kvi_nsreg_add(x.r, "stable", "t", 16, &stable), 1);
    pthread_t th[RACE_READERS];
    static struct race_reader rr[RACE_READERS]; /* static, as x: readers outlive a failed assert */
    for (int i = 0; i < RACE_READERS; i++) {
        rr[i] = (struct race_reader){&x, i};
        assert_int_equal(pthread_create(&th[i], NULL, reader, &rr[i]), 0);
    }
    /* the readers run before the first change and between every two rounds
     * of changes (their part of the race is the protocol's, not the
     * scheduler's) */
    wait_readers(&x);
    char m[32];
    for (int i = 0; i < 200; i++) {
        snprintf(m, sizeof(m), "churn-%d", i);
        assert_int_equal(kvi_nsreg_add(x.r, m, "t", 8, &ns), 1);
        if (i % 2 == 0) {
            assert_int_equal(kvi_nsreg_unlink(x.r, ns), 0);
            kvi_ns_free(ns);
        }
        wait_readers(&x);
    }
    atomic_store(&x.stop, true);
    for (int i = 0; i < RACE_READERS; i++) {
        pthread_join(th[i], NULL);
        assert_true(atomic_load(&x.lookups[i]) >= 2 * (1 + 200)); /* the protocol */
    }
    assert_int_equal(atomic_load(&x.bad), 0);
    kvi_nsreg_destroy(x.r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_find_unlink),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_readers_race_changes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
