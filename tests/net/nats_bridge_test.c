/* ctest-labels: integration -- net/nats_bridge.c: mirrored ops -> RouterEvent messages in a real JetStream stream */
/*
 * The bridge alone (net/nats_bridge.h) on a real nats-server
 * (tests/net/nats_server_fixture.h): ops handed to kvi_nats_bridge_mirror
 * as a listener would must come out of the stream as the documented
 * messages (subject, Nats-Msg-Id, RouterEvent JSON byte for byte, with
 * tokens_hash = kvidx's content hash = Dynamo's), ops without a RouterEvent
 * form must be counted and not published, and RESUME must read back the
 * last stored position and skip what the stream holds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/hash.h"
#include "engine/writer.h"
#include "net/nats_bridge.h"
#include "net/nats_server_fixture.h"
#include "net/router_event.h"

#define STREAM "BT"

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

struct fx {
    struct kvi_nats_server ns;
    struct kvi_writer_pool *wp;
    struct kvi_nats *plane;
    struct kvi_nats_bridge *b;
    natsConnection *nc;
    jsCtx *js;
};

static void fx_open(struct fx *f)
{
    assert_int_equal(kvi_nats_server_start(&f->ns, 10000), 0);
    f->wp = kvi_writer_pool_create(1, 0);
    assert_non_null(f->wp);
    struct kvi_nats_config c = {.servers = f->ns.url, .writers = f->wp, .durable = "bt"};
    f->plane = kvi_nats_create(&c);
    assert_non_null(f->plane);
    f->b = kvi_nats_bridge_create(f->plane, STREAM, 0);
    assert_non_null(f->b);
    assert_int_equal(natsConnection_ConnectTo(&f->nc, f->ns.url), NATS_OK);
    assert_int_equal(natsConnection_JetStream(&f->js, f->nc, NULL), NATS_OK);
}

static void fx_close(struct fx *f)
{
    jsCtx_Destroy(f->js);
    natsConnection_Destroy(f->nc);
    kvi_nats_bridge_destroy(f->b);
    kvi_nats_destroy(f->plane);
    kvi_writer_pool_destroy(f->wp);
    kvi_nats_server_stop(&f->ns);
}

/* Wait (up to 30 s) until the bridge's acked + duplicates reach @p n. */
static void wait_acked(struct fx *f, uint64_t n)
{
    struct kvi_nats_bridge_stats s;
    for (int i = 0; i < 3000; i++) {
        kvi_nats_bridge_stats(f->b, &s);
        if (s.acked + s.duplicates >= n)
            return;
        nap_ms(10);
    }
    fail_msg("acked %" PRIu64 " + duplicates %" PRIu64 " never reached %" PRIu64, s.acked, s.duplicates, n);
}

/* Stream message @p seq: its subject, Nats-Msg-Id and payload must be as given. */
static void expect_msg(struct fx *f, uint64_t seq, const char *subject, const char *id, const char *json)
{
    natsMsg *m = NULL;
    assert_int_equal(js_GetMsg(&m, f->js, STREAM, seq, NULL, NULL), NATS_OK);
    assert_string_equal(natsMsg_GetSubject(m), subject);
    const char *got = NULL;
    assert_int_equal(natsMsgHeader_Get(m, "Nats-Msg-Id", &got), NATS_OK);
    assert_string_equal(got, id);
    char *body = strndup(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
    assert_string_equal(body, json);
    free(body);
    natsMsg_Destroy(m);
}

/* The end of a batch (the hook's op NULL call): its events are queued. */
static void end_batch(struct kvi_bridge_worker *w)
{
    kvi_nats_bridge_mirror(w, NULL, &(struct kvi_ingest_mirror_pos){0});
}

static struct kvi_op *store_op(uint32_t n, bool has_parent, uint64_t parent)
{
    struct kvi_op *op = kvi_op_alloc(n, false);
    op->type = KVI_OP_STORE;
    op->tier = KVI_TIER_GPU;
    op->dp_rank = 0;
    op->has_parent = has_parent;
    op->parent_engine_hash = parent;
    return op;
}

/* Ops of each kind -> the documented messages; numeric and string ids; skipped ops. */
static void test_messages(void **state)
{
    (void)state;
    struct fx f;
    fx_open(&f);
    struct kvi_bridge_worker *w = kvi_nats_bridge_worker(f.b, "m", "default", 7, NULL, 0);
    assert_non_null(w);
    assert_ptr_equal(kvi_nats_bridge_worker(f.b, "m", "default", 7, NULL, 0), w); /* interned */

    /* a store of 2 blocks under a parent, at ZMQ seq 5, first event of its batch */
    uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct kvi_op *op = store_op(2, true, 99);
    uint64_t seed = kvi_hash_seed(NULL, 0, NULL, 0);
    for (uint32_t i = 0; i < 2; i++) {
        op->blocks[i].engine_hash = 1000 + i;
        op->blocks[i].content_hash = kvi_hash_block(tok + 4 * i, 4, seed);
        /* the content hash is Dynamo's tokens_hash (XXH3-64 of LE u32 tokens, seed 1337) */
        assert_int_equal(op->blocks[i].content_hash, kvp_re_tokens_hash(tok + 4 * i, 4, kvp_re_seed(NULL, 0)));
    }
    struct kvi_ingest_mirror_pos pos = {.seq = 5, .idx = 0, .tag = 0xabc};
    kvi_nats_bridge_mirror(w, op, &pos);
    char json[512];
    snprintf(json, sizeof json,
             "{\"worker_id\":7,\"storage_tier\":\"device\",\"event\":{\"event_id\":%" PRIu64
             ",\"data\":{\"stored\":{\"parent_hash\":99,\"start_position\":null,\"blocks\":[{\"block_hash\":1000,\"tokens_hash\":%" PRIu64
             ",\"mm_extra_info\":null},{\"block_hash\":1001,\"tokens_hash\":%" PRIu64
             ",\"mm_extra_info\":null}]}},\"dp_rank\":0}}",
             (uint64_t)(6ull << 20 | 1), op->blocks[0].content_hash, op->blocks[1].content_hash);
    kvi_op_free(op);

    /* a removal on the cpu tier of rank 3, second event of the batch */
    op = kvi_op_alloc(1, false);
    op->type = KVI_OP_REMOVE;
    op->tier = KVI_TIER_CPU;
    op->dp_rank = 3;
    op->n = 1;
    op->hashes[0] = 1001;
    pos.idx = 1;
    kvi_nats_bridge_mirror(w, op, &pos);
    kvi_op_free(op);

    /* no RouterEvent form: a token-less store */
    op = kvi_op_alloc(1, false);
    op->type = KVI_OP_STORE_KNOWN;
    kvi_nats_bridge_mirror(w, op, &pos);
    kvi_op_free(op);
    struct kvi_nats_bridge_stats s;
    kvi_nats_bridge_stats(f.b, &s);
    assert_int_equal(s.events, 0); /* queued at the batch's end only */
    end_batch(w);

    /* a rank reset by a listener (engine restart seen at live seq 9) for a string id: held back
     * until the next batch (seq 0 of the new engine, replayed), then published before its event */
    struct kvi_bridge_worker *ws = kvi_nats_bridge_worker(f.b, "m.x", "", 0, "pod-1", 0);
    assert_non_null(ws);
    op = kvi_op_alloc(0, false);
    op->type = KVI_OP_REMOVE_DP_RANK;
    op->dp_rank = 0;
    struct kvi_ingest_mirror_pos rpos = {.seq = 9, .idx = 0, .reset = true};
    kvi_nats_bridge_mirror(ws, op, &rpos);
    kvi_nats_bridge_mirror(ws, op, &rpos); /* the same rank twice: one cleared */
    kvi_op_free(op);
    kvi_nats_bridge_stats(f.b, &s);
    assert_int_equal(s.events, 2);
    op = kvi_op_alloc(1, false);
    op->type = KVI_OP_REMOVE;
    op->n = 1;
    op->hashes[0] = 5;
    kvi_nats_bridge_mirror(ws, op, &(struct kvi_ingest_mirror_pos){.seq = 0, .idx = 0, .tag = 0x1f});
    end_batch(ws);
    kvi_op_free(op);

    wait_acked(&f, 4);
    kvi_nats_bridge_stats(f.b, &s);
    assert_int_equal(s.events, 4);
    assert_int_equal(s.acked, 4);
    assert_int_equal(s.skipped, 1);
    assert_int_equal(s.dropped, 0);
    assert_true(s.stream_ready);

    expect_msg(&f, 1, STREAM ".6d.64656661756c74.7.0", "kvb.7.0.5.0.0000000000000abc", json);
    snprintf(json, sizeof json,
             "{\"worker_id\":7,\"storage_tier\":\"host_pinned\",\"event\":{\"event_id\":%" PRIu64
             ",\"data\":{\"removed\":{\"block_hashes\":[1001]}},\"dp_rank\":3}}",
             (uint64_t)(6ull << 20 | 2));
    expect_msg(&f, 2, STREAM ".6d.64656661756c74.7.0", "kvb.7.0.5.1.0000000000000abc", json);
    uint64_t wid = kvi_nats_bridge_worker_id("pod-1");
    assert_true(wid >> 63);
    char subj[128], id[128];
    snprintf(subj, sizeof subj, STREAM ".6d2e78.-.%" PRIu64 ".0", wid); /* "m.x": hex keeps the '.' out */
    snprintf(id, sizeof id, "kvb.%" PRIu64 ".0.0.c0.000000000000001f", wid);
    snprintf(json, sizeof json,
             "{\"worker_id\":%" PRIu64 ",\"storage_tier\":\"device\",\"event\":{\"event_id\":%" PRIu64
             ",\"data\":\"cleared\",\"dp_rank\":0}}",
             wid, (uint64_t)(1ull << 20));
    expect_msg(&f, 3, subj, id, json);
    snprintf(id, sizeof id, "kvb.%" PRIu64 ".0.0.0.000000000000001f", wid);
    snprintf(json, sizeof json,
             "{\"worker_id\":%" PRIu64 ",\"storage_tier\":\"device\",\"event\":{\"event_id\":%" PRIu64
             ",\"data\":{\"removed\":{\"block_hashes\":[5]}},\"dp_rank\":0}}",
             wid, (uint64_t)(1ull << 20 | 1));
    expect_msg(&f, 4, subj, id, json);
    fx_close(&f);
}

/* The same op twice (a second replica, or a resend): stored once. RESUME: read back, skip, go on. */
static void test_dedup_and_resume(void **state)
{
    (void)state;
    struct fx f;
    fx_open(&f);
    struct kvi_bridge_worker *w = kvi_nats_bridge_worker(f.b, "m", "t", 3, NULL, 1);
    bool has = true;
    uint64_t seed = 0;
    /* nothing stored yet (the stream may not even exist): nothing to resume */
    assert_int_equal(kvi_nats_bridge_resume(f.b, w, &has, &seed), 0);
    assert_false(has);
    struct kvi_op *op = store_op(1, false, 0);
    op->blocks[0] = (struct kvi_block){41, 42};
    /* seq 10 holds 3 events, each mirrored twice */
    for (int k = 0; k < 2; k++) {
        for (uint32_t i = 0; i < 3; i++)
            kvi_nats_bridge_mirror(w, op, &(struct kvi_ingest_mirror_pos){.seq = 10, .idx = i});
        end_batch(w);
    }
    wait_acked(&f, 6);
    struct kvi_nats_bridge_stats s;
    kvi_nats_bridge_stats(f.b, &s);
    assert_int_equal(s.acked, 3);
    assert_int_equal(s.duplicates, 3);

    /* a restarted replica: the last stored event is (seq 10, index 2) */
    assert_int_equal(kvi_nats_bridge_resume(f.b, w, &has, &seed), 1);
    assert_true(has);
    assert_int_equal(seed, 9); /* the listener replays seq 10 whole */
    /* the replay brings seq 10 again (skipped: the stream has it), then seq 11 (published) */
    for (uint32_t i = 0; i < 3; i++)
        kvi_nats_bridge_mirror(w, op, &(struct kvi_ingest_mirror_pos){.seq = 10, .idx = i});
    end_batch(w);
    kvi_nats_bridge_mirror(w, op, &(struct kvi_ingest_mirror_pos){.seq = 11, .idx = 0});
    end_batch(w);
    wait_acked(&f, 7);
    kvi_nats_bridge_stats(f.b, &s);
    assert_int_equal(s.resumed_skipped, 3);
    assert_int_equal(s.acked, 4);
    assert_int_equal(s.duplicates, 3);
    kvi_op_free(op);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_dedup_and_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
