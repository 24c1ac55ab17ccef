/* ctest-labels: integration tsan */
/*
 * 1,000 registrations on 2 listener threads: no thread per registration
 * (the process's thread count does not move while they register), the
 * registrations are spread evenly, all become active, and those whose
 * engines publish receive and index their events. 8 publishers each feed
 * 125 registrations (connect mode, loopback TCP). Then half of them are
 * unregistered and the rest keep working.
 * Then 4,096 bind-mode registrations with exact topics share one endpoint
 * (kvidxd --zmq-bind's pods): each message reaches its own, and the
 * listener thread's CPU time per message is printed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
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

/* ---- one bind endpoint, 4,096 exact topics (llm-d: --zmq-bind pods) ------------------------------ */

#define NPODS 4096
#define ROUNDS 8

static void pod_topic(char *out, size_t cap, uint32_t k)
{
    snprintf(out, cap, "kv@pod-%04u@m", k);
}

/* Send [topic, seq, an empty batch] on @p p. */
static void send_empty(struct kvidx_pub *p, const char *topic, uint64_t seq)
{
    uint8_t s8[8], batch[11] = {0x93, 0xcb, 0x41, 0xda, 0, 0, 0, 0, 0, 0, 0x90}; /* [1.6e9, [], */
    uint8_t full[12];
    memcpy(full, batch, sizeof batch);
    full[11] = 0x00; /* 0] */
    for (int i = 0; i < 8; i++)
        s8[i] = (uint8_t)(seq >> (56 - 8 * i));
    const void *fr[3] = {topic, s8, full};
    size_t sz[3] = {strlen(topic), 8, sizeof full};
    assert_int_equal(kvidx_pub_send_raw(p, fr, sz, 3), 0);
}

/*
 * 4,096 bind-mode registrations with exact topics on one endpoint, one
 * engine publishing for all of them (as --zmq-bind pods): each message
 * reaches exactly its topic's registration (every one holds ROUNDS batches,
 * in order: no gap); a topic that extends an exact one goes to a prefix
 * registration below it, one that only prefixes it is unknown. Prints the listener thread's CPU time per
 * message (the topic lookup is a hash probe, not a scan over the 4,096:
 * net/listener.c bind_match), not asserted.
 */
static void test_bind_exact_topics(void **state)
{
    (void)state;
    struct lfx f;
    struct kvi_listeners_config cfg = {.threads = 1};
    lfx_init(&f, &cfg);
    char ep[96], topic[32];
    lfx_ipc(&f, ep, sizeof ep);
    /* opened as kvidxd opens it, subscribed to "kv@": the members' own subscriptions (4,096 of them)
     * are not all sent to an engine that connects later (libzmq queues them on the SUB's pipe to
     * that engine, within its send high-water mark) */
    struct kvi_listener_bind_spec bs = {.endpoint = ep, .prefix = "kv@"};
    assert_int_equal(kvi_listeners_bind_open(f.lp, &bs), 0);
    for (uint32_t k = 0; k < NPODS; k++) {
        pod_topic(topic, sizeof topic, k);
        struct kvi_listener_spec s = {.ix = f.ix, .instance_id = 1 + k, .endpoint = ep, .topic = topic,
                                      .mode = KVI_LISTEN_BIND, .exact_topic = true};
        assert_int_equal(kvi_listeners_register(f.lp, &s), 0);
    }
    /* and one prefix registration below an exact one: a topic that extends kv@pod-0001@m is its */
    struct kvi_listener_spec ps = {.ix = f.ix, .instance_id = 9999, .endpoint = ep, .topic = "kv@pod-0001@",
                                   .mode = KVI_LISTEN_BIND};
    assert_int_equal(kvi_listeners_register(f.lp, &ps), 0);
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    pc.socket_mode = KVIDX_PUB_SOCKET_CONNECT;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    pod_topic(topic, sizeof topic, NPODS - 1);
    lfx_sync_topic(&f, p, NPODS, topic); /* the last subscription reached the PUB: all did */

    struct kvi_listener_thread_stats t0, t1;
    kvi_listener_thread_stats(f.lp, 0, &t0);
    for (uint64_t r = 0; r < ROUNDS; r++)
        for (uint32_t k = 0; k < NPODS; k++) {
            pod_topic(topic, sizeof topic, k);
            send_empty(p, topic, r);
        }
    send_empty(p, "kv@pod-0001@mx", 0); /* extends an exact topic: the prefix registration's */
    send_empty(p, "kv@pod-0001@", 1);   /* the prefix registration's own */
    send_empty(p, "kv@pod-01@", 0);     /* prefixes an exact topic: unknown */
    struct kvi_listener_totals tot;
    bool all = WAIT_FOR((kvi_listeners_totals(f.lp, &tot), tot.ctr.batches == (uint64_t)ROUNDS * NPODS + 2 &&
                                                               tot.unknown_topic == 1),
                        WAIT_MS);
    if (!all)
        fail_msg("%" PRIu64 " batches, %" PRIu64 " unknown topics, %" PRIu64 " malformed, %" PRIu64
                 " decode errors", tot.ctr.batches, tot.unknown_topic, tot.ctr.malformed, tot.ctr.decode_errors);
    kvi_listener_thread_stats(f.lp, 0, &t1);
    assert_int_equal(tot.ctr.gaps, 0);
    for (uint32_t k = 0; k < NPODS; k += 511) {
        struct kvi_listener_info in = lfx_info(&f, 1 + k);
        assert_int_equal(in.ctr.batches, ROUNDS);
        assert_true(in.watermark_set);
        assert_int_equal(in.watermark, ROUNDS - 1);
    }
    assert_int_equal(lfx_info(&f, 9999).ctr.batches, 2);
    uint64_t msgs = t1.messages - t0.messages;
    printf("bind endpoint, %u exact topics: %" PRIu64 " messages, listener thread %.0f ns CPU per message\n",
           NPODS, msgs, (double)(t1.cpu_ns - t0.cpu_ns) / (double)msgs);
    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

int main(void)
{
    kvi_rcu_register_thread();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thousand_registrations),
        cmocka_unit_test(test_bind_exact_topics),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return rc;
}
