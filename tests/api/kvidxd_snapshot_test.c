/* ctest-labels: integration -- api/service_snapshot.c, net/nats_snapshot.c, net/nats_source.c: --nats-snapshot on a real nats-server */
/*
 * --nats-snapshot end to end: C publishers (the library's JetStream
 * transport) -> nats-server -> a query-only kvidxd (--nats-stream, no ZMQ
 * listener) that writes snapshots into a KV bucket and purges the stream:
 *   - restart from the snapshot plus the tail: the stream is purged below
 *     the snapshot (a full replay is impossible: its first sequence is past
 *     the purged range), the restarted kvidxd is delivered only the tail
 *     (counted), /dump equals the model, and the order state came back with
 *     the snapshot (an old event_id of a worker silent since the restart is
 *     seen as a publisher restart, which needs its last event_id); with
 *     NATS unreachable at start-up, /ready says nats_unreachable until
 *     the server is back and the snapshot loaded; a replica without
 *     --nats-snapshot on the purged stream logs that it cannot rebuild it;
 *   - a durable consumer that has acked nothing keeps the history (no
 *     purge); a corrupt chunk, then a corrupt manifest, make kvidxd fall back
 *     to the whole stream (counted, logged) and /dump still equals the model;
 *   - two replicas write the same namespace's snapshots into one bucket: it
 *     ends with one snapshot of the last sequence and its chunks only, and a
 *     third replica starts from it with nothing left to read.
 * /dump is read with the daemon's own dump decoder and compared with a model
 * of what each (worker, dp_rank) holds. Waits are bounded polls of kvidxd's
 * counters.
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
#include <unistd.h>

#include "api/kvidxd_fixture.h"
#include "api/kvidxd_model.h"
#include "net/nats_server_fixture.h"
#include "net/nats_snapshot.h"

/* ---- metrics and NATS state ---- */

static char mname[512];

static const char *metric(const char *name, const char *stream)
{
    snprintf(mname, sizeof mname, "%s{source=\"%s\",model=\"m:t\"}", name, stream);
    return mname;
}

static void wait_metric(const struct kfx_daemon *d, const char *name, const char *stream, long long want)
{
    const char *full = metric(name, stream);
    if (!KFX_WAIT(kfx_metric(d, full) == want, KFX_WAIT_MS * 2)) {
        kfx_dump_log(d);
        fail_msg("%s never reached %lld (now %lld)", full, want, kfx_metric(d, metric(name, stream)));
    }
}

static long long get_metric(const struct kfx_daemon *d, const char *name, const char *stream)
{
    return kfx_metric(d, metric(name, stream));
}

struct js {
    natsConnection *nc;
    jsCtx *js;
};

static struct js js_open(const char *url)
{
    struct js j = {0};
    assert_int_equal(natsConnection_ConnectTo(&j.nc, url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&j.js, j.nc, NULL), NATS_OK);
    return j;
}

static void js_close(struct js *j)
{
    jsCtx_Destroy(j->js);
    natsConnection_Destroy(j->nc);
}

static void stream_state(struct js *j, const char *stream, uint64_t *first, uint64_t *last, uint64_t *msgs)
{
    jsStreamInfo *si = NULL;
    assert_int_equal(js_GetStreamInfo(&si, j->js, stream, NULL, NULL), NATS_OK);
    *first = si->State.FirstSeq;
    *last = si->State.LastSeq;
    *msgs = si->State.Msgs;
    jsStreamInfo_Destroy(si);
}

static void wait_ready(struct kfx_daemon *d)
{
    if (!KFX_WAIT(kfx_get_has(d, "/ready", 200, "\"ready\":true"), KFX_WAIT_MS * 2)) {
        kfx_dump_log(d);
        fail_msg("/ready never 200");
    }
}

/* ---- restart from a snapshot plus the tail ---- */

static void test_restart_from_snapshot(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    const char *stream = "snap-s";
    struct model m = {0};
    const enum kvidx_pub_transport jst = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    struct npub p0 = npub_open(jst, ns.url, NULL, stream, 51, 0), p1 = npub_open(jst, ns.url, NULL, stream, 52, 1);
    pub_store(&p0, &m, 0, 0, 4);
    pub_store(&p1, &m, 1, 0, 6);
    pub_remove(&p0, &m, 0, 2);
    pub_store(&p1, &m, 2, 0, 3); /* seq 4 */

    char source[128];
    snprintf(source, sizeof source, "%s=m:t@%d", stream, KFX_BS);
    const char *args[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "snapd", "--nats-snapshot",
                          "SNAPB", "--nats-snapshot-every-s", "1", "--slot-port", "0", NULL};
    struct kfx_daemon d;
    kfx_start(&d, args, NULL);
    wait_metric(&d, "kvidx_nats_acked_total", stream, 4);
    /* a snapshot of sequence 4, then the stream purged below 5 */
    wait_metric(&d, "kvidx_nats_snapshot_seq", stream, 4);
    wait_metric(&d, "kvidx_nats_snapshot_purged_below_seq", stream, 5);
    assert_true(get_metric(&d, "kvidx_nats_snapshot_written_total", stream) >= 1);
    assert_true(get_metric(&d, "kvidx_nats_snapshot_raw_bytes", stream) >
                get_metric(&d, "kvidx_nats_snapshot_bytes", stream));
    check_dump(&d, &m, "\"m:t\"");
    struct js j = js_open(ns.url);
    uint64_t first, last, msgs;
    stream_state(&j, stream, &first, &last, &msgs);
    assert_true(first == 5 && last == 4 && msgs == 0);

    /* the next period covers a new event */
    pub_store(&p0, &m, 3, 0, 5); /* seq 5 */
    wait_metric(&d, "kvidx_nats_snapshot_seq", stream, 5);
    wait_metric(&d, "kvidx_nats_snapshot_purged_below_seq", stream, 6);
    check_dump(&d, &m, "\"m:t\"");

    /* kill -9, then a tail only worker 51 publishes */
    assert_int_equal(kill(d.pid, SIGKILL), 0);
    kfx_stop(&d, 0, NULL);
    pub_remove(&p0, &m, 3, 2);   /* seq 6 */
    pub_store(&p0, &m, 4, 0, 3); /* seq 7 */
    pub_store(&p0, &m, 3, 2, 4); /* seq 8 */
    stream_state(&j, stream, &first, &last, &msgs);
    assert_true(first == 6 && last == 8 && msgs == 3); /* a whole replay is impossible */

    kfx_start(&d, args, NULL);
    wait_ready(&d);
    assert_int_equal(get_metric(&d, "kvidx_nats_snapshot_loaded_total", stream), 1);
    assert_int_equal(get_metric(&d, "kvidx_nats_snapshot_load_fallbacks_total", stream), 0);
    assert_true(get_metric(&d, "kvidx_nats_snapshot_loaded_blocks", stream) == 2 + 6 + 3 + 5);
    wait_metric(&d, "kvidx_nats_acked_total", stream, 3);
    assert_int_equal(get_metric(&d, "kvidx_nats_messages_total", stream), 3); /* the tail only */
    check_dump(&d, &m, "\"m:t\"");
    assert_int_equal(get_metric(&d, "kvidx_nats_publisher_restarts_total", stream), 0);

    /* worker 52 (silent since the restart) sends an old event_id: only the restored order state
     * knows its last one, and sees it go back (a restarted publisher, applied in stream order) */
    char raw[256];
    snprintf(raw, sizeof raw,
             "{\"worker_id\":52,\"event\":{\"event_id\":0,\"data\":{\"removed\":{\"block_hashes\":[%" PRIu64
             "]}},\"dp_rank\":1}}",
             kfx_hash(2, 2));
    const void *bufs[] = {raw};
    size_t lens[] = {strlen(raw)};
    assert_int_equal(kvidx_pub_send_raw(p1.p, bufs, lens, 1), 0);
    held_of(&m, 52, 1, 2)->n = 2;
    wait_metric(&d, "kvidx_nats_acked_total", stream, 4);
    assert_int_equal(get_metric(&d, "kvidx_nats_publisher_restarts_total", stream), 1);
    assert_int_equal(get_metric(&d, "kvidx_nats_events_stale_total", stream), 0);
    check_dump(&d, &m, "\"m:t\"");
    /* and the restarted replica snapshots and purges on its own */
    wait_metric(&d, "kvidx_nats_snapshot_seq", stream, 9);
    wait_metric(&d, "kvidx_nats_snapshot_purged_below_seq", stream, 10);
    js_close(&j);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* NATS unreachable at start-up: not ready, with the reason, until the snapshot loads */
    kvi_nats_server_pause(&ns);
    kfx_start(&d, args, NULL);
    if (!KFX_WAIT(kfx_get_has(&d, "/ready", 503, "nats_unreachable"), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("/ready never said nats_unreachable");
    }
    assert_int_equal(kvi_nats_server_resume(&ns), 0);
    wait_ready(&d);
    assert_int_equal(get_metric(&d, "kvidx_nats_snapshot_loaded_total", stream), 1);
    assert_int_equal(get_metric(&d, "kvidx_nats_messages_total", stream), 0);
    check_dump(&d, &m, "\"m:t\"");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* a replica without --nats-snapshot cannot rebuild the purged history: it says so */
    const char *plain[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "plain", "--slot-port", "0",
                           NULL};
    kfx_start(&d, plain, NULL);
    assert_true(kfx_log_has(&d, "starts at sequence 10", "not rebuilt", KFX_WAIT_MS));

    kvidx_pub_destroy(p0.p);
    kvidx_pub_destroy(p1.p);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    kvi_nats_server_stop(&ns);
}

/* ---- a consumer that acked nothing keeps the history; corrupt snapshots fall back ---- */

/* The manifest key of the bucket's only snapshot, and its decoded manifest. */
static void find_manifest(kvStore *kv, char *key, size_t cap, struct kvi_snap_manifest *m)
{
    kvKeysList kl = {0};
    assert_int_equal(kvStore_Keys(&kl, kv, NULL), NATS_OK);
    key[0] = '\0';
    for (int i = 0; i < kl.Count; i++) {
        size_t n = strlen(kl.Keys[i]);
        if (n > 9 && strcmp(kl.Keys[i] + n - 9, ".manifest") == 0)
            snprintf(key, cap, "%s", kl.Keys[i]);
    }
    kvKeysList_Destroy(&kl);
    assert_true(key[0] != '\0');
    kvEntry *e = NULL;
    assert_int_equal(kvStore_Get(&e, kv, key), NATS_OK);
    assert_int_equal(kvi_snap_manifest_decode(kvEntry_Value(e), (size_t)kvEntry_ValueLen(e), m), 0);
    kvEntry_Destroy(e);
}

static void test_history_kept_and_fallback(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    const char *stream = "snap-c";
    struct model m = {0};
    struct npub p0 = npub_open(KVIDX_PUB_TRANSPORT_NATS_JETSTREAM, ns.url, NULL, stream, 61, 0);
    pub_store(&p0, &m, 0, 0, 5);
    pub_store(&p0, &m, 1, 0, 2);
    pub_remove(&p0, &m, 0, 3); /* seq 3 */
    /* a durable consumer (a Dynamo router, say) that acks nothing */
    struct js j = js_open(ns.url);
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "laggard";
    cc.AckPolicy = js_AckExplicit;
    jsConsumerInfo *ci = NULL;
    assert_int_equal(js_AddConsumer(&ci, j.js, stream, &cc, NULL, NULL), NATS_OK);
    jsConsumerInfo_Destroy(ci);

    char source[128];
    snprintf(source, sizeof source, "%s=m:t@%d", stream, KFX_BS);
    const char *args[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "snapc", "--nats-snapshot",
                          "SNAPC", "--nats-snapshot-every-s", "1", "--slot-port", "0", NULL};
    struct kfx_daemon d;
    kfx_start(&d, args, NULL);
    wait_metric(&d, "kvidx_nats_snapshot_seq", stream, 3);
    check_dump(&d, &m, "\"m:t\"");
    /* the laggard's ack floor (0) keeps everything */
    assert_int_equal(get_metric(&d, "kvidx_nats_snapshot_purges_total", stream), 0);
    uint64_t first, last, msgs;
    stream_state(&j, stream, &first, &last, &msgs);
    assert_true(first == 1 && last == 3 && msgs == 3);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* a chunk with a byte flipped: the load falls back to the whole stream */
    kvStore *kv = NULL;
    assert_int_equal(js_KeyValue(&kv, j.js, "SNAPC"), NATS_OK);
    char mkey[KVI_SNAP_KEY_MAX], ckey[KVI_SNAP_KEY_MAX + 64];
    struct kvi_snap_manifest man;
    find_manifest(kv, mkey, sizeof mkey, &man);
    assert_int_equal(man.seq, 3);
    snprintf(ckey, sizeof ckey, "%.*s.%s.0", (int)(strlen(mkey) - 9), mkey, man.id);
    kvEntry *e = NULL;
    assert_int_equal(kvStore_Get(&e, kv, ckey), NATS_OK);
    size_t cl = (size_t)kvEntry_ValueLen(e);
    char *c = malloc(cl);
    memcpy(c, kvEntry_Value(e), cl);
    kvEntry_Destroy(e);
    c[cl / 2] ^= 0x21;
    uint64_t rev;
    assert_int_equal(kvStore_Put(&rev, kv, ckey, c, (int)cl), NATS_OK);
    free(c);
    kfx_start(&d, args, NULL);
    wait_ready(&d);
    assert_int_equal(get_metric(&d, "kvidx_nats_snapshot_load_fallbacks_total", stream), 1);
    assert_int_equal(get_metric(&d, "kvidx_nats_snapshot_loaded_total", stream), 0);
    assert_true(kfx_log_has(&d, "does not load", "checksum mismatch", KFX_WAIT_MS));
    wait_metric(&d, "kvidx_nats_acked_total", stream, 3);
    assert_int_equal(get_metric(&d, "kvidx_nats_messages_total", stream), 3); /* the whole stream */
    check_dump(&d, &m, "\"m:t\"");
    /* the broken snapshot is replaced at the same sequence */
    wait_metric(&d, "kvidx_nats_snapshot_written_total", stream, 1);
    struct kvi_snap_manifest man2;
    find_manifest(kv, mkey, sizeof mkey, &man2);
    assert_true(man2.seq == 3 && strcmp(man2.id, man.id) != 0);
    /* a new event, a new snapshot */
    pub_store(&p0, &m, 2, 0, 4); /* seq 4 */
    wait_metric(&d, "kvidx_nats_snapshot_seq", stream, 4);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* a manifest that does not parse: the same fallback */
    find_manifest(kv, mkey, sizeof mkey, &man);
    assert_int_equal(man.seq, 4);
    assert_int_equal(kvStore_PutString(&rev, kv, mkey, "kvidx-snapshot 1\nseq=four\n"), NATS_OK);
    kfx_start(&d, args, NULL);
    wait_ready(&d);
    assert_int_equal(get_metric(&d, "kvidx_nats_snapshot_load_fallbacks_total", stream), 1);
    wait_metric(&d, "kvidx_nats_acked_total", stream, 4);
    check_dump(&d, &m, "\"m:t\"");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    kvStore_Destroy(kv);
    js_close(&j);
    kvidx_pub_destroy(p0.p);
    kvi_nats_server_stop(&ns);
}

/* ---- two replicas writing the same namespace's snapshots ---- */

static void test_two_writers(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    const char *stream = "snap-2";
    struct model m = {0};
    const enum kvidx_pub_transport jst = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    struct npub p0 = npub_open(jst, ns.url, NULL, stream, 71, 0), p1 = npub_open(jst, ns.url, NULL, stream, 72, 0);
    char source[128];
    snprintf(source, sizeof source, "%s=m:t@%d", stream, KFX_BS);
    const char *args_a[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "ra", "--nats-snapshot",
                            "SNAP2", "--nats-snapshot-every-s", "1", "--slot-port", "0", NULL};
    const char *args_b[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "rb", "--nats-snapshot",
                            "SNAP2", "--nats-snapshot-every-s", "1", "--slot-port", "0", NULL};
    pub_store(&p0, &m, 0, 0, 3); /* the stream exists before the replicas start */
    struct kfx_daemon a, b;
    kfx_start(&a, args_a, NULL);
    kfx_start(&b, args_b, NULL);
    /* rounds of events; after each, both replicas' newest snapshot covers the round's last
     * sequence: one of them stored it, the other found it stored (or stored it first) */
    uint64_t seq = 1;
    for (uint32_t round = 0; round < 4; round++) {
        pub_store(&p0, &m, 10 + round, 0, 4);
        pub_store(&p1, &m, 20 + round, 0, 2 + round);
        if (round % 2 == 1)
            pub_remove(&p0, &m, 10 + round - 1, 1);
        seq += round % 2 == 1 ? 3 : 2;
        for (int k = 0; k < 2; k++) {
            struct kfx_daemon *d = k ? &b : &a;
            if (!KFX_WAIT(get_metric(d, "kvidx_nats_snapshot_seq", stream) == (long long)seq, KFX_WAIT_MS * 2)) {
                kfx_dump_log(d);
                fail_msg("replica %c: snapshot_seq %lld, want %" PRIu64, "ab"[k],
                         get_metric(d, "kvidx_nats_snapshot_seq", stream), seq);
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        struct kfx_daemon *d = k ? &b : &a;
        assert_int_equal(get_metric(d, "kvidx_nats_snapshot_failed_total", stream), 0);
        check_dump(d, &m, "\"m:t\"");
    }
    assert_true(get_metric(&a, "kvidx_nats_snapshot_written_total", stream) +
                    get_metric(&b, "kvidx_nats_snapshot_written_total", stream) >= 4);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    /* the bucket holds one verified snapshot of the last sequence and no stray chunk */
    struct js j = js_open(ns.url);
    kvStore *kv = NULL;
    assert_int_equal(js_KeyValue(&kv, j.js, "SNAP2"), NATS_OK);
    char mkey[KVI_SNAP_KEY_MAX];
    struct kvi_snap_manifest man;
    find_manifest(kv, mkey, sizeof mkey, &man);
    assert_true(man.seq == seq);
    kvKeysList kl = {0};
    assert_int_equal(kvStore_Keys(&kl, kv, NULL), NATS_OK);
    assert_int_equal(kl.Count, (int)man.chunks + 1);
    kvKeysList_Destroy(&kl);
    /* a third replica starts from it: nothing after it to read */
    const char *args_c[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "rc", "--nats-snapshot",
                            "SNAP2", "--slot-port", "0", NULL};
    struct kfx_daemon c;
    kfx_start(&c, args_c, NULL);
    wait_ready(&c);
    assert_int_equal(get_metric(&c, "kvidx_nats_snapshot_loaded_total", stream), 1);
    assert_int_equal(get_metric(&c, "kvidx_nats_messages_total", stream), 0);
    check_dump(&c, &m, "\"m:t\"");
    assert_int_equal(kfx_stop(&c, SIGTERM, NULL), 0);
    kvStore_Destroy(kv);
    js_close(&j);
    kvidx_pub_destroy(p0.p);
    kvidx_pub_destroy(p1.p);
    kvi_nats_server_stop(&ns);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_from_snapshot),
        cmocka_unit_test(test_history_kept_and_fallback),
        cmocka_unit_test(test_two_writers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
