/* ctest-labels: integration -- api/service_bridge.c, net/nats_bridge.c: ZMQ engines -> bridging kvidxd -> JetStream -> query-only kvidxd */
/*
 * The ZMQ -> JetStream bridge (--nats-publish) on a real nats-server
 * (tests/net/nats_server_fixture.h), with engines from the C publisher
 * library (ZMQ PUB + replay ROUTER) registered on the bridging replicas:
 *   (a) bridging replica A + query-only replica Q (--nats-stream on A's
 *       stream, no ZMQ listener): Q's /dump equals the model, after an
 *       engine restart too (A's rank reset is published as a "cleared"),
 *       and again after Q restarts; A's /status names the namespace's
 *       subject;
 *   (b) kill -9 of A mid-stream and a restart while the engines keep
 *       publishing: Q's /dump equals the model at the end (the restarted A
 *       resumes after what the stream holds and replays the rest from the
 *       engines' ROUTERs);
 *   (c) two bridging replicas on the same engines: the stream holds each
 *       event once (the acks of both replicas: N stored, N duplicates; the
 *       stream's message count is N), and Q's /dump equals the model;
 *   (d) nats-server stopped and restarted mid-stream while the engines
 *       publish: A's index keeps up, nothing is dropped, and the stream
 *       ends complete (Q's /dump equals the model).
 * Waits are bounded polls (60 s) of final states; no sleep is a
 * synchronisation. Checks run on the main thread only.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <nats/nats.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/kvidxd_fixture.h"
#include "api/kvidxd_model.h"
#include "net/nats_server_fixture.h"

#define STREAM "KVB"
#define MODEL "m"
#define NS_KEY "\"" MODEL ":default\""
/* the namespace's subjects: STREAM.<hex "m">.<hex "default">.> */
#define NS_SUBJECT STREAM ".6d.64656661756c74.>"
#define Q_SOURCE STREAM "/" NS_SUBJECT "=" MODEL "@4"
#define WAIT_MS 60000
#define N_ENG 2
#define RING 8192

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

struct eng {
    struct kvidx_pub *p;
    uint64_t id;
};

static void eng_open(struct eng *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        e[i].p = kfx_pub_ring(0, RING);
        assert_non_null(e[i].p);
        e[i].id = 11 + i;
    }
}

static void eng_close(struct eng *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvidx_pub_destroy(e[i].p);
}

/*
 * Engine e restarts: a new publisher bound to the same endpoints, seq from 0, nothing held. The old
 * one first runs 300 batches ahead, so that the new counter cannot pass the last seq kvidxd saw
 * before it reconnects (a restart is seen as a seq that goes back: wire-protocol.md §6.3).
 */
static void eng_restart(struct eng *e, struct model *m)
{
    for (int i = 0; i < 300; i++)
        assert_int_equal(kvidx_pub_flush_empty(e->p, NULL), 0);
    char ep[128], rep[128];
    snprintf(ep, sizeof ep, "%s", kvidx_pub_endpoint(e->p));
    snprintf(rep, sizeof rep, "%s", kvidx_pub_replay_endpoint(e->p));
    kvidx_pub_destroy(e->p);
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    pc.replay_endpoint = rep;
    pc.socket_mode = KVIDX_PUB_SOCKET_BIND;
    pc.buffer_batches = RING;
    e->p = kvidx_pub_create(&pc);
    assert_non_null(e->p);
    for (size_t i = 0; i < m->n; i++)
        if (m->h[i].w == e->id)
            m->h[i].n = 0;
}

static void reg(const struct kfx_daemon *d, const struct eng *e)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%" PRIu64 ",\"model_name\":\"" MODEL "\",\"block_size\":%d,\"endpoint\":\"%s\","
             "\"replay_endpoint\":\"%s\"}",
             e->id, KFX_BS, kvidx_pub_endpoint(e->p), kvidx_pub_replay_endpoint(e->p));
    kfx_expect(d, "/register", j, 201, NULL);
}

/* A bridging replica, with engines e[0, n) registered through it. */
static void start_bridge(struct kfx_daemon *d, const struct kvi_nats_server *ns, const struct eng *e, size_t n)
{
    const char *args[] = {"--nats", ns->url, "--nats-publish", STREAM, NULL};
    kfx_start(d, args, NULL);
    for (size_t i = 0; i < n; i++)
        reg(d, &e[i]);
}

static void start_query_only(struct kfx_daemon *d, const struct kvi_nats_server *ns)
{
    const char *args[] = {"--nats", ns->url, "--nats-stream", Q_SOURCE, "--nats-durable", "kvidx-q", NULL};
    kfx_start(d, args, NULL);
}

/*
 * Round r of the workload, on every engine: chain c = r * N_ENG + i gets
 * blocks [0, 3), then [3, 6) under them, and every third chain loses
 * [4, 6) again: three batches of one event each (two on the others).
 * @return the events published.
 */
static uint64_t round_pub(struct eng *e, size_t n, struct model *m, uint32_t r)
{
    uint64_t ev = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = r * (uint32_t)n + (uint32_t)i;
        struct held *h = held_of(m, e[i].id, 0, c);
        kfx_publish(e[i].p, c, 0, 3, NULL);
        kfx_publish(e[i].p, c, 3, 6, NULL);
        h->n = 6;
        ev += 2;
        if (r % 3 == 0) {
            kfx_unpublish(e[i].p, c, 4, 6);
            h->n = 4;
            ev++;
        }
    }
    return ev;
}

/* Poll until @p d's /dump equals the model, nudging the engines (a late joiner then replays). */
static void until_dump(const struct kfx_daemon *d, const struct model *m, struct eng *e, size_t n, const char *who)
{
    int64_t end = kfx_now_ms() + WAIT_MS, nudge = 0;
    while (!check_dump_model(d, m, NS_KEY, true)) {
        if (kfx_now_ms() > end) {
            kfx_dump_log(d);
            check_dump(d, m, NS_KEY); /* fails with the difference */
            fail_msg("%s: /dump never equalled the model", who);
        }
        if (kfx_now_ms() >= nudge) {
            for (size_t i = 0; i < n; i++) {
                uint64_t seq;
                kvidx_pub_flush_empty(e[i].p, &seq);
            }
            nudge = kfx_now_ms() + 200;
        }
        kfx_nap(20);
    }
}

static void wait_metric(const struct kfx_daemon *d, const char *name, long long want)
{
    if (!KFX_WAIT(kfx_metric(d, name) == want, WAIT_MS)) {
        kfx_dump_log(d);
        fail_msg("%s never reached %lld (now %lld)", name, want, kfx_metric(d, name));
    }
}

/* Messages the stream holds (libnats, a client of our own). */
static uint64_t stream_msgs(const struct kvi_nats_server *ns)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, ns->url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_GetStreamInfo(&si, js, STREAM, NULL, NULL), NATS_OK);
    uint64_t n = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return n;
}

/* (a) A bridges two engines; Q reads the stream only. */
static void test_query_only(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    struct eng e[N_ENG];
    eng_open(e, N_ENG);
    struct kfx_daemon a, q;
    start_bridge(&a, &ns, e, N_ENG);
    static struct model m;
    memset(&m, 0, sizeof m);
    uint64_t events = 0;
    for (uint32_t r = 0; r < 12; r++)
        events += round_pub(e, N_ENG, &m, r);
    until_dump(&a, &m, e, N_ENG, "bridging replica");
    /* the operator's hint: the namespace's subject filter in /status */
    assert_true(kfx_get_has(&a, "/status", 200, "\"subject\":\"" NS_SUBJECT "\""));
    wait_metric(&a, "kvidx_nats_bridge_acked_total", (long long)events);

    start_query_only(&q, &ns);
    until_dump(&q, &m, e, 0, "query-only replica");
    /* more events while Q runs, an engine restarts (its blocks go: A publishes a cleared), more
     * events; then Q restarts and rebuilds from the stream alone */
    for (uint32_t r = 12; r < 15; r++)
        events += round_pub(e, N_ENG, &m, r);
    eng_restart(&e[0], &m);
    uint32_t r = 15;
    for (; r < 18; r++)
        round_pub(e, N_ENG, &m, r);
    until_dump(&a, &m, e, N_ENG, "bridging replica after an engine restart");
    until_dump(&q, &m, e, N_ENG, "query-only replica, live");
    assert_true(kfx_log_has(&q, "went back", NULL, 0)); /* Q saw the engine start over */
    assert_int_equal(kfx_stop(&q, SIGTERM, NULL), 0);
    start_query_only(&q, &ns);
    until_dump(&q, &m, e, 0, "query-only replica, restarted");
    assert_int_equal(kfx_metric(&a, "kvidx_nats_bridge_dropped_total"), 0);
    assert_int_equal(kfx_metric(&a, "kvidx_nats_bridge_errors_total"), 0);

    kfx_stop(&q, SIGTERM, NULL);
    kfx_stop(&a, SIGTERM, NULL);
    eng_close(e, N_ENG);
    kvi_nats_server_stop(&ns);
}

/* (b) kill -9 of the bridging replica mid-stream, restart, engines publishing all along. */
static void test_bridge_crash(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    struct eng e[N_ENG];
    eng_open(e, N_ENG);
    struct kfx_daemon a, q;
    start_bridge(&a, &ns, e, N_ENG);
    start_query_only(&q, &ns);
    static struct model m;
    memset(&m, 0, sizeof m);
    uint32_t r = 0;
    uint64_t events = 0;
    for (; r < 4; r++)
        events += round_pub(e, N_ENG, &m, r);
    until_dump(&a, &m, e, N_ENG, "bridging replica"); /* A has joined both engines */
    wait_metric(&a, "kvidx_nats_bridge_acked_total", (long long)events); /* the stream holds a start */
    /* mid-stream: A dies while it still has events to publish */
    for (; r < 30; r++)
        round_pub(e, N_ENG, &m, r);
    assert_int_equal(kfx_stop(&a, SIGKILL, NULL), 128 + SIGKILL);
    for (; r < 45; r++) /* published while no replica bridges: only the engines' rings hold them */
        round_pub(e, N_ENG, &m, r);
    start_bridge(&a, &ns, e, N_ENG);
    for (; r < 60; r++)
        round_pub(e, N_ENG, &m, r);
    until_dump(&q, &m, e, N_ENG, "query-only replica after the bridge's crash");
    /* the restarted A went on after what the stream held (RESUME), for each engine, and
     * published nothing twice: no duplicate, and Q never saw an event_id go back */
    assert_true(kfx_log_has(&a, "11.0 resumes after seq", NULL, 0));
    assert_true(kfx_log_has(&a, "12.0 resumes after seq", NULL, 0));
    assert_int_equal(kfx_metric(&a, "kvidx_nats_bridge_duplicates_total"), 0);
    assert_false(kfx_log_has(&q, "went back", NULL, 0));

    kfx_stop(&q, SIGTERM, NULL);
    kfx_stop(&a, SIGTERM, NULL);
    eng_close(e, N_ENG);
    kvi_nats_server_stop(&ns);
}

/* (c) two bridging replicas on the same engines: each event stored once. */
static void test_two_bridges(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    struct eng e[N_ENG];
    eng_open(e, N_ENG);
    struct kfx_daemon a, b, q;
    start_bridge(&a, &ns, e, N_ENG);
    start_bridge(&b, &ns, e, N_ENG);
    static struct model m;
    memset(&m, 0, sizeof m);
    uint64_t events = 0;
    for (uint32_t r = 0; r < 20; r++)
        events += round_pub(e, N_ENG, &m, r);
    until_dump(&a, &m, e, N_ENG, "bridging replica A");
    until_dump(&b, &m, e, N_ENG, "bridging replica B");
    /* every event reached the stream from both: stored once, refused once as a duplicate */
    long long acked = 0, dups = 0;
    int64_t end = kfx_now_ms() + WAIT_MS;
    while (kfx_now_ms() < end) {
        acked = kfx_metric(&a, "kvidx_nats_bridge_acked_total") + kfx_metric(&b, "kvidx_nats_bridge_acked_total");
        dups = kfx_metric(&a, "kvidx_nats_bridge_duplicates_total") +
               kfx_metric(&b, "kvidx_nats_bridge_duplicates_total");
        if (acked + dups >= 2 * (long long)events)
            break;
        kfx_nap(20);
    }
    assert_int_equal(acked, events);
    assert_int_equal(dups, events);
    assert_int_equal(stream_msgs(&ns), events);
    start_query_only(&q, &ns);
    until_dump(&q, &m, e, 0, "query-only replica");

    kfx_stop(&q, SIGTERM, NULL);
    kfx_stop(&b, SIGTERM, NULL);
    kfx_stop(&a, SIGTERM, NULL);
    eng_close(e, N_ENG);
    kvi_nats_server_stop(&ns);
}

/* (d) NATS away mid-stream: the bridge queues and catches up, nothing dropped. */
static void test_nats_down(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    struct eng e[N_ENG];
    eng_open(e, N_ENG);
    struct kfx_daemon a, q;
    start_bridge(&a, &ns, e, N_ENG);
    static struct model m;
    memset(&m, 0, sizeof m);
    uint64_t events = 0;
    uint32_t r = 0;
    for (; r < 5; r++)
        events += round_pub(e, N_ENG, &m, r);
    until_dump(&a, &m, e, N_ENG, "bridging replica");
    wait_metric(&a, "kvidx_nats_bridge_acked_total", (long long)events);
    kvi_nats_server_pause(&ns);
    for (; r < 25; r++)
        events += round_pub(e, N_ENG, &m, r);
    until_dump(&a, &m, e, N_ENG, "bridging replica, NATS away"); /* ZMQ ingest does not wait for NATS */
    assert_int_equal(kvi_nats_server_resume(&ns), 0);
    for (; r < 35; r++)
        events += round_pub(e, N_ENG, &m, r);
    start_query_only(&q, &ns);
    until_dump(&q, &m, e, N_ENG, "query-only replica after NATS came back");
    assert_int_equal(kfx_metric(&a, "kvidx_nats_bridge_dropped_total"), 0);
    assert_int_equal(stream_msgs(&ns), events);

    kfx_stop(&q, SIGTERM, NULL);
    kfx_stop(&a, SIGTERM, NULL);
    eng_close(e, N_ENG);
    kvi_nats_server_stop(&ns);
}

/* --nats-publish needs --nats and a stream name JetStream accepts: refused at start-up otherwise. */
static void test_flags(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *no_nats[] = {"--nats-publish", STREAM, NULL};
    assert_int_not_equal(kfx_start_rc(&d, no_nats, NULL), 0);
    const char *dotted[] = {"--nats", "nats://127.0.0.1:1", "--nats-publish", "a.b", NULL};
    assert_int_not_equal(kfx_start_rc(&d, dotted, NULL), 0);
    const char *empty[] = {"--nats", "nats://127.0.0.1:1", "--nats-publish", "", NULL};
    assert_int_not_equal(kfx_start_rc(&d, empty, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_flags, teardown),
        cmocka_unit_test_teardown(test_query_only, teardown),
        cmocka_unit_test_teardown(test_bridge_crash, teardown),
        cmocka_unit_test_teardown(test_two_bridges, teardown),
        cmocka_unit_test_teardown(test_nats_down, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
