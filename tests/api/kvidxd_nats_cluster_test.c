/* ctest-labels: integration -- net/nats_source.c, api/service_nats.c: a replicated stream on a 3-node JetStream cluster, its leader killed mid-stream */
/*
 * A 3-node JetStream cluster on loopback (tests/net/nats_server_fixture.h),
 * a stream replicated on all three (R3), kvidxd with --nats listing the
 * three servers and --nats-stream on it, and an engine publishing Dynamo
 * RouterEvent JSON with the C publisher library's JetStream transport (one
 * publisher per worker, auto_flush 1, as an engine runs it), which holds a
 * publish that failed during the failover and retries it, in order, with
 * the same Nats-Msg-Id, on its next call or flush:
 *   - the stream's leader is killed (SIGKILL) mid-stream and restarted with
 *     its store while the engine keeps publishing; then the two other nodes
 *     in turn (one of them is kvidxd's server: it reconnects);
 *   - nothing is lost and nothing doubled: the stream holds one message per
 *     event, kvidxd saw no event_id gap, and its /dump equals the model;
 *   - a second kvidxd started after the failure (another durable) rebuilds
 *     the same /dump from the stream.
 * Waits are bounded polls (elections take seconds); checks run on the main
 * thread only.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <nats/nats.h>

#include "api/kvidxd_fixture.h"
#include "api/kvidxd_model.h"
#include "net/nats_server_fixture.h"

#define STREAM "kvc"
#define N_WORKERS 3
#define N_CHAINS 3
#define CHAIN_LEN 6
#define PHASE_EVENTS 24
#define PUB_DEADLINE_MS 45000

/* ---- the engine: one C publisher (JetStream transport) per worker ---------------------------- */

struct engine {
    natsConnection *nc;                /* the test's own: the stream, its message count */
    jsCtx *js;
    struct kvidx_pub *pub[N_WORKERS];  /* worker 71 + k, rank 0 */
    uint64_t published;                /* events the publishers accepted (gave an id) */
};

static void engine_open(struct engine *e, const struct kvi_nats_cluster *c)
{
    memset(e, 0, sizeof *e);
    natsOptions *o = NULL;
    assert_int_equal(natsOptions_Create(&o), NATS_OK);
    const char *urls[KVI_NATS_CLUSTER_MAX];
    for (int i = 0; i < c->n; i++)
        urls[i] = c->node[i].url;
    assert_int_equal(natsOptions_SetServers(o, urls, c->n), NATS_OK);
    assert_int_equal(natsOptions_SetMaxReconnect(o, -1), NATS_OK);
    assert_int_equal(natsOptions_SetReconnectWait(o, 100), NATS_OK);
    assert_int_equal(natsConnection_Connect(&e->nc, o), NATS_OK);
    natsOptions_Destroy(o);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 2000;
    assert_int_equal(natsConnection_JetStream(&e->js, e->nc, &jo), NATS_OK);
    /* the stream, on all three nodes (Dynamo's subjects: <stream>.*) */
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = STREAM;
    const char *subjects[] = {STREAM ".*"};
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    sc.Replicas = 3;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = NATS_ERR;
    int64_t until = kfx_now_ms() + PUB_DEADLINE_MS;
    while ((s = js_AddStream(&si, e->js, &sc, NULL, &jerr)) != NATS_OK && kfx_now_ms() < until)
        kfx_nap(100); /* (the cluster may still be placing its meta group) */
    if (s != NATS_OK)
        fail_msg("cannot create the R3 stream: %s (%d)", natsStatus_GetText(s), (int)jerr);
    jsStreamInfo_Destroy(si);
    for (int k = 0; k < N_WORKERS; k++) {
        struct kvidx_pub_config pc;
        kvidx_pub_config_init(&pc);
        pc.transport = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
        pc.nats_url = c->urls;
        pc.nats_stream = STREAM;
        pc.worker_id = 71 + (uint64_t)k;
        pc.dp_rank = 0;
        pc.auto_flush = 1;
        pc.nats_timeout_ms = 2000; /* one publish's wait for its acknowledgement */
        e->pub[k] = kvidx_pub_create(&pc);
        if (!e->pub[k])
            fail_msg("publisher %d: %s", k, strerror(errno));
    }
}

static void engine_close(struct engine *e)
{
    for (int k = 0; k < N_WORKERS; k++)
        kvidx_pub_destroy(e->pub[k]);
    jsCtx_Destroy(e->js);
    natsConnection_Destroy(e->nc);
}

/* Check a publish call's result: an accepted event (0, or -EIO: held for a retry) counts as
 * published; -ENOBUFS (the library's bound) is flushed and tried again by the caller. */
static bool engine_accepted(struct engine *e, int k, int rc, int64_t until)
{
    if (rc == 0 || rc == -EIO) {
        e->published++;
        return true;
    }
    if (rc != -ENOBUFS)
        fail_msg("worker %d: publish failed: %d (%s)", k, rc, strerror(-rc));
    if (kfx_now_ms() >= until)
        fail_msg("worker %d: the publisher stayed full", k);
    (void)kvidx_pub_flush(e->pub[k], NULL);
    kfx_nap(50);
    return false;
}

/* Worker slot k stores blocks [from, to) of chain c (one event), model updated. */
static void engine_store(struct engine *e, struct model *m, int k, uint32_t c, uint32_t from, uint32_t to)
{
    uint64_t hashes[CHAIN_LEN], parent = from ? kfx_hash(c, from - 1) : 0;
    uint32_t tokens[CHAIN_LEN * KFX_BS];
    for (uint32_t i = from; i < to; i++)
        hashes[i - from] = kfx_hash(c, i);
    kfx_tokens(c, from, to - from, tokens);
    int64_t until = kfx_now_ms() + PUB_DEADLINE_MS;
    while (!engine_accepted(e, k,
                            kvidx_pub_publish_stored(e->pub[k], hashes, to - from, from ? &parent : NULL,
                                                     tokens, (to - from) * KFX_BS, KFX_BS, NULL),
                            until)) {
    }
    struct held *h = held_of(m, 71 + (uint64_t)k, 0, c);
    assert_int_equal(h->n, from);
    h->n = to;
}

/* Worker slot k removes blocks [from, n) of chain c (one event), model updated. */
static void engine_remove(struct engine *e, struct model *m, int k, uint32_t c, uint32_t from)
{
    struct held *h = held_of(m, 71 + (uint64_t)k, 0, c);
    uint64_t hashes[CHAIN_LEN];
    for (uint32_t i = from; i < h->n; i++)
        hashes[i - from] = kfx_hash(c, i);
    int64_t until = kfx_now_ms() + PUB_DEADLINE_MS;
    while (!engine_accepted(e, k, kvidx_pub_publish_removed(e->pub[k], hashes, h->n - from, NULL), until)) {
    }
    h->n = from;
}

/* `count` more events: workers and chains in turn, each growing its chain by two blocks and cutting it
 * back to one block once full. */
static void engine_run(struct engine *e, struct model *m, int count)
{
    for (int i = 0; i < count; i++) {
        uint64_t step = e->published;
        int k = (int)(step % N_WORKERS);
        uint32_t c = (uint32_t)(step / N_WORKERS % N_CHAINS);
        struct held *h = held_of(m, 71 + (uint64_t)k, 0, c);
        if (h->n + 2 <= CHAIN_LEN)
            engine_store(e, m, k, c, h->n, h->n + 2);
        else
            engine_remove(e, m, k, c, 1);
    }
}

/* Flush every publisher until none holds an event (bounded: the stream has a leader again). */
static void engine_drain(struct engine *e, const struct kvi_nats_cluster *c)
{
    int64_t until = kfx_now_ms() + PUB_DEADLINE_MS;
    for (int k = 0; k < N_WORKERS; k++) {
        while (kvidx_pub_flush(e->pub[k], NULL) != 0 || kvidx_pub_pending(e->pub[k]) != 0) {
            if (kfx_now_ms() >= until) {
                kvi_nats_cluster_dump_logs(c);
                fail_msg("worker %d: %zu events never stored: %s", k, kvidx_pub_pending(e->pub[k]),
                         kvidx_pub_last_error_text(e->pub[k]));
            }
            kfx_nap(100);
        }
    }
}

/* Publishes tried again after a failure, and acknowledged as already stored, over every worker;
 * none may have been given up. */
static void engine_stats(const struct engine *e, uint64_t *retries, uint64_t *dups)
{
    *retries = *dups = 0;
    for (int k = 0; k < N_WORKERS; k++) {
        struct kvidx_pub_stats st;
        kvidx_pub_get_stats(e->pub[k], &st);
        assert_int_equal(st.dropped, 0);
        *retries += st.retries;
        *dups += st.duplicates;
    }
}

/* Messages the stream holds (asked of the cluster). */
static uint64_t stream_msgs(struct engine *e)
{
    jsStreamInfo *si = NULL;
    int64_t until = kfx_now_ms() + KFX_WAIT_MS;
    natsStatus s;
    while ((s = js_GetStreamInfo(&si, e->js, STREAM, NULL, NULL)) != NATS_OK && kfx_now_ms() < until)
        kfx_nap(100);
    assert_int_equal(s, NATS_OK);
    uint64_t n = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return n;
}

/* ---- kvidxd --------------------------------------------------------------------------------------- */

static char metric_name[256];

static const char *metric(const char *name)
{
    snprintf(metric_name, sizeof metric_name, "%s{source=\"" STREAM "\",model=\"m:t\"}", name);
    return metric_name;
}

static void start_kvidxd(struct kfx_daemon *d, const struct kvi_nats_cluster *c, const char *durable)
{
    char source[64];
    snprintf(source, sizeof source, STREAM "=m:t@%d", KFX_BS);
    const char *args[] = {"--nats", c->urls, "--nats-stream", source, "--nats-durable", durable, "--slot-port", "0",
                          NULL};
    kfx_start(d, args, NULL);
}

/* Wait (bounded, generously: the consumer's leader may be re-elected) until kvidxd acknowledged every
 * event published and has nothing pending, then compare its /dump with the model. */
static void converge(const struct kfx_daemon *d, const struct engine *e, const struct model *m,
                     const struct kvi_nats_cluster *c)
{
    long long want = (long long)e->published;
    if (!KFX_WAIT(kfx_metric(d, metric("kvidx_nats_acked_total")) >= want &&
                      kfx_metric(d, metric("kvidx_nats_consumer_pending")) == 0 &&
                      kfx_get_has(d, "/ready", 200, "\"ready\":true"),
                  60000)) {
        kfx_dump_log(d);
        kvi_nats_cluster_dump_logs(c);
        fail_msg("kvidxd acknowledged %lld of %lld events (pending %lld)",
                 kfx_metric(d, metric("kvidx_nats_acked_total")), want,
                 kfx_metric(d, metric("kvidx_nats_consumer_pending")));
    }
    check_dump(d, m, "\"m:t\"");
    /* every event once, in order: no event_id gap, nothing lost */
    assert_int_equal(kfx_metric(d, metric("kvidx_nats_gaps_total")), 0);
    assert_int_equal(kfx_metric(d, metric("kvidx_nats_events_lost_total")), 0);
}

static void test_leader_killed_mid_stream(void **state)
{
    (void)state;
    int64_t t0 = kfx_now_ms();
    struct kvi_nats_cluster c;
    assert_int_equal(kvi_nats_cluster_start(&c, 3, 30000), 0);
    struct engine e;
    engine_open(&e, &c);
    struct model m = {0};
    struct kfx_daemon d1, d2;
    start_kvidxd(&d1, &c, "kvidx-d1");
    engine_run(&e, &m, PHASE_EVENTS);
    engine_drain(&e, &c);
    converge(&d1, &e, &m, &c);

    /* the stream's leader killed mid-stream; the engine keeps publishing through the election */
    int leader = kvi_nats_cluster_stream_leader(&c, STREAM, 20000);
    assert_true(leader >= 0);
    kvi_nats_cluster_kill(&c, leader);
    engine_run(&e, &m, PHASE_EVENTS);
    int next = kvi_nats_cluster_stream_leader(&c, STREAM, 20000);
    assert_true(next >= 0 && next != leader);
    /* restarted with its store: it catches up as a follower */
    assert_int_equal(kvi_nats_cluster_restart(&c, leader, 10000), 0);
    engine_run(&e, &m, PHASE_EVENTS);
    /* then the two others in turn, each once the stream is whole again, so that the server kvidxd
     * is connected to goes too (libnats picks one of the list at random) */
    for (int k = 1; k < 3; k++) {
        int victim = (leader + k) % 3;
        if (kvi_nats_cluster_stream_current(&c, STREAM, 30000) < 0) {
            kvi_nats_cluster_dump_logs(&c);
            fail_msg("the stream never had three current replicas again");
        }
        kvi_nats_cluster_kill(&c, victim);
        engine_run(&e, &m, PHASE_EVENTS / 2);
        assert_int_equal(kvi_nats_cluster_restart(&c, victim, 10000), 0);
    }
    engine_drain(&e, &c);
    converge(&d1, &e, &m, &c);
    assert_true(kfx_metric(&d1, "kvidx_nats_reconnects_total") >= 1);
    /* nothing doubled: one message per event (the retried ones de-duplicated by their Nats-Msg-Id) */
    assert_int_equal(stream_msgs(&e), e.published);

    /* a kvidxd started after the failure rebuilds the same index from the stream */
    start_kvidxd(&d2, &c, "kvidx-d2");
    converge(&d2, &e, &m, &c);
    uint64_t retries, dups;
    engine_stats(&e, &retries, &dups);
    print_message("leader kvidx-%d killed, kvidx-%d elected; %" PRIu64 " events, %" PRIu64
                  " publishes retried, %" PRIu64 " acknowledged as duplicates; %.1f s\n",
                  leader, next, e.published, retries, dups, (double)(kfx_now_ms() - t0) / 1000.0);

    engine_close(&e);
    assert_int_equal(kfx_stop(&d1, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&d2, SIGTERM, NULL), 0);
    kvi_nats_cluster_stop(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leader_killed_mid_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
