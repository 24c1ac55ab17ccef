/* ctest-labels: integration -- net/nats_source.c, api/service_nats.c: a replicated stream on a 3-node JetStream cluster, its leader killed mid-stream */
/*
 * A 3-node JetStream cluster on loopback (tests/net/nats_server_fixture.h),
 * a stream replicated on all three (R3), kvidxd with --nats listing the
 * three servers and --nats-stream on it, and an engine publishing Dynamo
 * RouterEvent JSON with js_Publish and Nats-Msg-Id "<worker>-<rank>-<event>"
 * (as the C publisher's JetStream transport does), retrying a publish that
 * failed during the failover with the same id until the stream acknowledges
 * it:
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

/* ---- the engine: RouterEvent JSON through js_Publish, retried with its Nats-Msg-Id ---------- */

struct engine {
    natsConnection *nc;
    jsCtx *js;
    uint64_t next_id[N_WORKERS]; /* event_id per worker (rank 0) */
    uint64_t published;          /* events acknowledged by the stream */
    uint64_t retries;            /* publishes tried again after a failure */
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
    jo.Wait = 2000; /* one publish's wait for its acknowledgement */
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
}

static void engine_close(struct engine *e)
{
    jsCtx_Destroy(e->js);
    natsConnection_Destroy(e->nc);
}

/* Publish one RouterEvent of worker slot k until the stream acknowledges it (the same Nats-Msg-Id
 * every try: a try whose acknowledgement was lost is stored once). */
static void engine_send(struct engine *e, int k, const char *json)
{
    uint64_t w = 71 + (uint64_t)k, id = e->next_id[k]++;
    char msg_id[64];
    snprintf(msg_id, sizeof msg_id, "%" PRIu64 "-0-%" PRIu64, w, id);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = msg_id;
    int64_t until = kfx_now_ms() + PUB_DEADLINE_MS;
    for (;;) {
        jsErrCode jerr = 0;
        jsPubAck *ack = NULL;
        natsStatus s = js_Publish(&ack, e->js, STREAM ".kv-events", json, (int)strlen(json), &po, &jerr);
        jsPubAck_Destroy(ack);
        if (s == NATS_OK)
            break;
        if (kfx_now_ms() >= until)
            fail_msg("event %s never stored: %s (%d)", msg_id, natsStatus_GetText(s), (int)jerr);
        e->retries++;
        kfx_nap(50);
    }
    e->published++;
}

/* Worker slot k stores blocks [from, to) of chain c (one event), model updated. */
static void engine_store(struct engine *e, struct model *m, int k, uint32_t c, uint32_t from, uint32_t to)
{
    char json[2048];
    int n = snprintf(json, sizeof json,
                     "{\"worker_id\":%d,\"storage_tier\":\"device\",\"event\":{\"event_id\":%" PRIu64
                     ",\"dp_rank\":0,\"data\":{\"stored\":{\"parent_hash\":",
                     71 + k, e->next_id[k]);
    n += from == 0 ? snprintf(json + n, sizeof json - (size_t)n, "null")
                   : snprintf(json + n, sizeof json - (size_t)n, "%" PRIu64, kfx_hash(c, from - 1));
    n += snprintf(json + n, sizeof json - (size_t)n, ",\"blocks\":[");
    for (uint32_t i = from; i < to; i++)
        n += snprintf(json + n, sizeof json - (size_t)n, "%s{\"block_hash\":%" PRIu64 ",\"tokens_hash\":%" PRIu64 "}",
                      i > from ? "," : "", kfx_hash(c, i), kfx_content(c, i));
    snprintf(json + n, sizeof json - (size_t)n, "]}}}}");
    engine_send(e, k, json);
    struct held *h = held_of(m, 71 + (uint64_t)k, 0, c);
    assert_int_equal(h->n, from);
    h->n = to;
}

/* Worker slot k removes blocks [from, n) of chain c (one event), model updated. */
static void engine_remove(struct engine *e, struct model *m, int k, uint32_t c, uint32_t from)
{
    struct held *h = held_of(m, 71 + (uint64_t)k, 0, c);
    char json[2048];
    int n = snprintf(json, sizeof json,
                     "{\"worker_id\":%d,\"event\":{\"event_id\":%" PRIu64
                     ",\"dp_rank\":0,\"data\":{\"removed\":{\"block_hashes\":[",
                     71 + k, e->next_id[k]);
    for (uint32_t i = from; i < h->n; i++)
        n += snprintf(json + n, sizeof json - (size_t)n, "%s%" PRIu64, i > from ? "," : "", kfx_hash(c, i));
    snprintf(json + n, sizeof json - (size_t)n, "]}}}}");
    engine_send(e, k, json);
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
    converge(&d1, &e, &m, &c);
    assert_true(kfx_metric(&d1, "kvidx_nats_reconnects_total") >= 1);
    /* nothing doubled: one message per event (the retried ones de-duplicated by their Nats-Msg-Id) */
    assert_int_equal(stream_msgs(&e), e.published);

    /* a kvidxd started after the failure rebuilds the same index from the stream */
    start_kvidxd(&d2, &c, "kvidx-d2");
    converge(&d2, &e, &m, &c);
    print_message("leader kvidx-%d killed, kvidx-%d elected; %" PRIu64 " events, %" PRIu64
                  " publishes retried; %.1f s\n",
                  leader, next, e.published, e.retries, (double)(kfx_now_ms() - t0) / 1000.0);

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
