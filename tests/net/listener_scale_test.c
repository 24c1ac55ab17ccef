/* ctest-labels: integration tsan */
/*
 * 1,000 registrations on 2 listener threads: no thread per registration
 * (the process's thread count does not move while they register), the
 * registrations are spread evenly, all become active, and those whose
 * engines publish receive and index their events. 8 publishers each feed
 * 125 registrations (connect mode, loopback TCP). Then half of them are
 * unregistered and the rest keep working.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdbool.h>

#include "tests/net/listener_fixture.h"

#define NREG 1000
#define NPUB 8

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

struct scan {
    uint32_t active, with_batches, with_probe;
    uint64_t id_min_probe;
};

static void count_cb(void *ctx, const struct kvi_listener_info *in)
{
    struct scan *s = ctx;
    s->active += in->state == KVI_LISTENER_ACTIVE;
    s->with_batches += in->ctr.batches >= 1 && in->watermark_set && in->watermark == 0;
    s->with_probe += in->ctr.malformed >= 1;
}

static struct scan scan(struct lfx *f)
{
    struct scan s = {0};
    kvi_listeners_foreach(f->lp, count_cb, &s);
    return s;
}

static void test_thousand_registrations(void **state)
{
    (void)state;
    struct lfx f;
    struct kvi_listeners_config cfg = {.threads = 2};
    lfx_init(&f, &cfg);
    assert_int_equal(kvi_listeners_threads(f.lp), 2);

    struct kvidx_pub *pubs[NPUB];
    for (int i = 0; i < NPUB; i++)
        pubs[i] = lfx_pub(NULL, false, NULL);

    int before = 0;
    for (uint64_t id = 0; id < NREG; id++) {
        struct kvi_listener_spec s = {.ix = f.ix, .instance_id = 1000 + id,
                                      .endpoint = kvidx_pub_endpoint(pubs[id % NPUB])};
        assert_int_equal(kvi_listeners_register(f.lp, &s), 0);
        if (id == 0) /* the pool's ZMQ context starts its I/O thread and reaper with the first socket */
            before = thread_count();
    }
    assert_int_equal(thread_count(), before); /* no thread per registration */

    struct kvi_listener_thread_stats t0, t1;
    kvi_listener_thread_stats(f.lp, 0, &t0);
    kvi_listener_thread_stats(f.lp, 1, &t1);
    assert_int_equal(t0.listeners + t1.listeners, NREG);
    assert_int_equal(t0.listeners, NREG / 2); /* least-loaded placement */
    assert_int_equal(t1.listeners, NREG / 2);
    assert_int_equal(scan(&f).active, NREG);

    /* slow joiner: probe until every SUB has received one */
    const void *fr[1] = {"probe"};
    size_t sz[1] = {5};
    int64_t end = lfx_now_ms() + WAIT_MS;
    while (scan(&f).with_probe < NREG && lfx_now_ms() < end) {
        for (int i = 0; i < NPUB; i++)
            assert_int_equal(kvidx_pub_send_raw(pubs[i], fr, sz, 1), 0);
        WAIT_FOR(scan(&f).with_probe == NREG, 50);
    }
    assert_int_equal(scan(&f).with_probe, NREG);

    /* publishers 0..3 publish one batch each; their 500 registrations index it */
    for (int i = 0; i < NPUB / 2; i++)
        pub_chain(pubs[i], (uint32_t)i, 0, 1);
    assert_true(WAIT_FOR(scan(&f).with_batches == NREG / 2, WAIT_MS));
    for (uint64_t id = 0; id < NREG; id += 97) {
        uint32_t c = (uint32_t)(id % NPUB);
        bool fed = c < NPUB / 2;
        if (fed)
            lfx_settle(&f, 1000 + id, 0);
        assert_int_equal(lfx_depth(&f, 1000 + id, c, 8), fed ? 1 : 0);
    }
    struct kvi_listener_totals tot;
    kvi_listeners_totals(f.lp, &tot);
    assert_int_equal(tot.listeners, NREG);
    assert_int_equal(tot.by_state[KVI_LISTENER_ACTIVE], NREG);
    assert_int_equal(tot.ctr.batches, NREG / 2);

    /* unregister every odd registration; the others keep receiving */
    for (uint64_t id = 1; id < NREG; id += 2) {
        struct kvi_listener_key k = lfx_key(&f, 1000 + id, 0);
        assert_int_equal(kvi_listeners_unregister(f.lp, &k), 0);
    }
    for (int i = 0; i < NPUB; i++)
        pub_chain(pubs[i], 100 + (uint32_t)i, 0, 1);
    assert_true(WAIT_FOR((kvi_listeners_totals(f.lp, &tot), tot.ctr.batches == NREG / 2 + NREG / 2), WAIT_MS));
    assert_int_equal(tot.listeners, NREG / 2);
    assert_int_equal(thread_count(), before);

    for (int i = 0; i < NPUB; i++)
        kvidx_pub_destroy(pubs[i]);
    lfx_fini(&f);
}

int main(void)
{
    kvi_rcu_register_thread();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thousand_registrations),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return rc;
}
