/* ctest-labels: integration tsan */
/*
 * Listeners end to end, modes and control plane: garbage frames among good
 * batches, engine-connects mode (kvidx binds, the topic identifies the
 * engine), pause / resume, unregister then register again, registration
 * errors and failed listeners, and a gated pool (pending until the gate
 * opens), and liveness (connected / messages / last message, from the
 * sockets' connection monitors), and an open bind endpoint (messages of
 * unknown topics held for the registration its callback announces). Real publishers over loopback TCP and ipc,
 * real writers and index (listener_fixture.h); waits are bounded polls.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>

#include "tests/net/listener_fixture.h"

/* Send one raw multipart message. */
static void raw(struct kvidx_pub *p, size_t n, const void *const *fr, const size_t *sz)
{
    assert_int_equal(kvidx_pub_send_raw(p, fr, sz, n), 0);
}

/*
 * Malformed messages (wrong frame counts, a 7-byte seq, the sentinel seq)
 * are dropped and counted without touching the watermark; an undecodable
 * payload with a real seq is dropped and counted and shows up as a gap.
 * The good batches around them end up exactly as published.
 */
static void test_garbage_between_good_batches(void **state)
{
    (void)state;
    for (int with_replay = 0; with_replay <= 1; with_replay++) {
        struct lfx f;
        lfx_init(&f, NULL);
        struct kvidx_pub *p = lfx_pub(NULL, with_replay, NULL);
        lfx_register(&f, 1, p, with_replay, KVI_GAP_APPLY);
        uint64_t base = lfx_sync(&f, p, 1);

        static const uint8_t seq7[7] = {0}, ffff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        pub_chain(p, 0, 0, 2);                       /* 0, 1 */
        raw(p, 2, (const void *[]){"", "x"}, (size_t[]){0, 1});
        pub_chain(p, 0, 2, 3);                       /* 2 */
        raw(p, 4, (const void *[]){"", ffff, "a", "b"}, (size_t[]){0, 8, 1, 1});
        raw(p, 3, (const void *[]){"", seq7, "\x93"}, (size_t[]){0, 7, 1});
        raw(p, 3, (const void *[]){"", ffff, "\x90"}, (size_t[]){0, 8, 1});
        pub_store(p, 0, 3, 4);
        pub_remove(p, 0, 1, 2);                      /* 3: store block 3, then remove 1 (and 2, 3) */
        pub_flush(p);
        pub_chain(p, 1, 0, 2);                       /* 4, 5 */
        uint64_t s;
        assert_int_equal(kvidx_pub_publish_payload(p, "\xc1garbage", 8, &s), 0); /* 6: not msgpack */
        assert_int_equal(s, 6);
        uint64_t last = pub_chain(p, 1, 2, 4);       /* 7, 8 */
        lfx_settle(&f, 1, last);

        struct kvi_listener_info in = lfx_info(&f, 1);
        assert_int_equal(in.ctr.malformed - base, 4);
        assert_int_equal(in.ctr.decode_errors, 1);
        assert_int_equal(in.ctr.gaps, 1);            /* 7 arrived with W = 5 */
        if (with_replay) {
            assert_int_equal(in.ctr.replay_undecodable, 1);
            assert_int_equal(in.ctr.lost, 0);
        } else {
            assert_int_equal(in.ctr.lost, 1);
        }
        assert_int_equal(in.ctr.batches, 8);         /* every good batch, once */
        assert_int_equal(lfx_depth(&f, 1, 0, 4), 1); /* block 0 only: 1 was removed with its descendants */
        assert_int_equal(lfx_depth(&f, 1, 1, 4), 4);
        assert_int_equal(in.ctr.restarts, 0);
        kvidx_pub_destroy(p);
        lfx_fini(&f);
    }
}

static struct kvidx_pub *connecting_pub(const char *ep, const char *topic, bool replay)
{
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    pc.socket_mode = KVIDX_PUB_SOCKET_CONNECT;
    pc.topic = topic;
    pc.replay_endpoint = replay ? "tcp://127.0.0.1:*" : NULL;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    return p;
}

static void register_bind(struct lfx *f, uint64_t id, const char *ep, const char *topic, const char *replay)
{
    struct kvi_listener_spec s = {
        .ix = f->ix, .instance_id = id, .endpoint = ep, .topic = topic, .replay_endpoint = replay,
        .mode = KVI_LISTEN_BIND,
    };
    assert_int_equal(kvi_listeners_register(f->lp, &s), 0);
}

/* Engine-connects mode: one bound SUB, two engines told apart by topic, plus replay for one of them. */
static void test_engine_connects_mode(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    char ep[128];
    lfx_ipc(&f, ep, sizeof ep);
    struct kvidx_pub *a = connecting_pub(ep, "kv@pod-1@llama", true);
    struct kvidx_pub *b = connecting_pub(ep, "kv@pod-10@llama", false);
    struct kvidx_pub *c = connecting_pub(ep, "kv@pod-7@llama", false);  /* never registered */
    register_bind(&f, 1, ep, "kv@pod-1@", kvidx_pub_replay_endpoint(a));
    register_bind(&f, 10, ep, "kv@pod-10@", NULL);

    /* the same topic twice on one bind endpoint is a conflict */
    struct kvi_listener_spec dup = {.ix = f.ix, .instance_id = 11, .endpoint = ep, .topic = "kv@pod-10@",
                                    .mode = KVI_LISTEN_BIND};
    assert_int_equal(kvi_listeners_register(f.lp, &dup), -EEXIST);

    struct kvi_listener_info ia = lfx_info(&f, 1), ib = lfx_info(&f, 10);
    assert_int_equal(ia.state, KVI_LISTENER_ACTIVE);
    assert_int_equal(ia.thread, ib.thread); /* one socket, one thread */
    lfx_sync_topic(&f, a, 1, "kv@pod-1@llama");
    lfx_sync_topic(&f, b, 10, "kv@pod-10@llama");

    pub_chain(a, 0, 0, 3);
    kvidx_pub_skip_live(a, 2);
    pub_chain(a, 0, 3, 5);
    uint64_t la = pub_chain(a, 0, 5, 6);   /* gap 3, 4: replayed */
    uint64_t lb = pub_chain(b, 1, 0, 4);
    pub_chain(c, 2, 0, 2);
    lfx_settle(&f, 1, la);
    lfx_settle(&f, 10, lb);

    assert_int_equal(lfx_depth(&f, 1, 0, 6), 6);
    assert_int_equal(lfx_depth(&f, 1, 1, 4), 0);
    assert_int_equal(lfx_depth(&f, 10, 1, 4), 4);
    assert_int_equal(lfx_depth(&f, 10, 0, 6), 0);
    assert_int_equal(lfx_info(&f, 1).ctr.replayed, 2);
    assert_int_equal(lfx_info(&f, 10).ctr.batches, 4);

    /* unregistering one engine keeps the shared socket for the other */
    struct kvi_listener_key k1 = lfx_key(&f, 1, 0);
    assert_int_equal(kvi_listeners_unregister(f.lp, &k1), 0);
    uint64_t lb2 = pub_chain(b, 1, 4, 5);
    lfx_settle(&f, 10, lb2);
    assert_int_equal(lfx_depth(&f, 10, 1, 5), 5);

    kvidx_pub_destroy(a);
    kvidx_pub_destroy(b);
    kvidx_pub_destroy(c);
    lfx_fini(&f);
    unlink(ep + strlen("ipc://")); /* libzmq leaves the socket file behind */
}

/* Pause closes the sockets and keeps the watermark; resume continues and replays what was missed. */
static void test_pause_resume(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub *p = lfx_replay_pub(&f, 1);
    struct kvi_listener_key k = lfx_key(&f, 1, 0);

    uint64_t last = pub_chain(p, 0, 0, 3);
    lfx_settle(&f, 1, last);
    assert_int_equal(kvi_listeners_resume(f.lp, &k), -EBUSY); /* active: not resumable */
    assert_int_equal(kvi_listeners_pause(f.lp, &k), 0);
    assert_int_equal(kvi_listeners_pause(f.lp, &k), -EBUSY);  /* paused: not pausable */
    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.state, KVI_LISTENER_PAUSED);
    assert_true(in.watermark_set);
    assert_int_equal(in.watermark, 2);

    pub_chain(p, 0, 3, 6);                   /* 3..5 published while paused: lost to kvidx */
    assert_int_equal(lfx_info(&f, 1).ctr.batches, 3);
    assert_int_equal(kvi_listeners_resume(f.lp, &k), 0);
    in = lfx_info(&f, 1);
    assert_int_equal(in.state, KVI_LISTENER_ACTIVE);
    assert_int_equal(in.watermark, 2);       /* kept across pause / resume */
    lfx_sync(&f, p, 1);
    last = pub_chain(p, 0, 6, 7);            /* 6 shows the gap */
    lfx_settle(&f, 1, last);
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.gaps, 1);
    assert_int_equal(in.ctr.replayed, 3);
    assert_int_equal(lfx_depth(&f, 1, 0, 7), 7);

    struct kvi_listener_key missing = lfx_key(&f, 99, 0);
    assert_int_equal(kvi_listeners_pause(f.lp, &missing), -ENOENT);
    assert_int_equal(kvi_listeners_resume(f.lp, &missing), -ENOENT);
    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* Unregister deletes the watermark: the same key registered again starts fresh (replays from 0). */
static void test_unregister_then_register_fresh(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub *p = lfx_replay_pub(&f, 1);
    struct kvi_listener_key k = lfx_key(&f, 1, 0);
    uint64_t last = pub_chain(p, 0, 0, 4);
    lfx_settle(&f, 1, last);

    struct kvi_listener_spec again = {.ix = f.ix, .instance_id = 1, .endpoint = kvidx_pub_endpoint(p)};
    assert_int_equal(kvi_listeners_register(f.lp, &again), -EEXIST);
    assert_int_equal(kvi_listeners_unregister(f.lp, &k), 0);
    assert_int_equal(kvi_listeners_unregister(f.lp, &k), -ENOENT);
    struct kvi_listener_info in;
    assert_int_equal(kvi_listeners_get(f.lp, &k, &in), -ENOENT);
    struct kvi_listener_totals tot;
    kvi_listeners_totals(f.lp, &tot);
    assert_int_equal(tot.listeners, 0);
    assert_int_equal(tot.ctr.batches, 4); /* departed counters stay in the totals */

    pub_chain(p, 0, 4, 6);                 /* 4, 5 while unregistered */
    lfx_register(&f, 1, p, true, KVI_GAP_APPLY);
    in = lfx_info(&f, 1);
    assert_false(in.watermark_set);
    assert_false(in.last_live_set);
    assert_int_equal(in.ctr.batches, 0);
    lfx_sync(&f, p, 1);
    last = pub_chain(p, 0, 6, 7);          /* 6: a fresh cursor sees s > 0 and replays from 0 */
    lfx_settle(&f, 1, last);
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.replays, 1);
    assert_int_equal(in.ctr.replayed, 6);
    assert_int_equal(in.ctr.restarts, 0);
    assert_int_equal(lfx_depth(&f, 1, 0, 7), 7);
    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* Validation errors, bind failures (failed state, last_error, resume retries), and a gated pool. */
static void test_errors_and_gate(void **state)
{
    (void)state;
    struct kvi_listeners_config cfg = {.gated = true, .threads = 1};
    struct lfx f;
    lfx_init(&f, &cfg);

    struct kvi_listener_spec bad = {.ix = f.ix, .instance_id = 5, .endpoint = "tcp://host"};
    char err[256];
    assert_int_equal(kvi_listeners_validate(&bad, err, sizeof err), -EINVAL);
    assert_true(strlen(err) > 0);
    assert_int_equal(kvi_listeners_register(f.lp, &bad), -EINVAL);
    bad.endpoint = "tcp://127.0.0.1:5557";
    bad.replay_endpoint = "udp://x:1";
    assert_int_equal(kvi_listeners_register(f.lp, &bad), -EINVAL);
    bad.replay_endpoint = NULL;
    bad.block_size = BS + 1;
    assert_int_equal(kvi_listeners_register(f.lp, &bad), -EINVAL);

    /* bind failure: an address the engine side already holds */
    struct kvidx_pub *holder = lfx_pub(NULL, false, NULL);
    char held[128];
    snprintf(held, sizeof held, "%s", kvidx_pub_endpoint(holder));
    struct kvi_listener_spec s = {.ix = f.ix, .instance_id = 6, .endpoint = held, .mode = KVI_LISTEN_BIND};
    assert_int_equal(kvi_listeners_register(f.lp, &s), 0);
    struct kvi_listener_info in = lfx_info(&f, 6);
    assert_int_equal(in.state, KVI_LISTENER_FAILED);
    assert_non_null(strstr(in.last_error, "failed to bind"));
    struct kvi_listener_key k6 = lfx_key(&f, 6, 0);
    assert_int_equal(kvi_listeners_pause(f.lp, &k6), -EBUSY);
    kvidx_pub_destroy(holder); /* the address is free now: resume binds it */
    assert_int_equal(kvi_listeners_resume(f.lp, &k6), 0);
    in = lfx_info(&f, 6);
    assert_int_equal(in.state, KVI_LISTENER_PENDING); /* gate still closed */
    assert_string_equal(in.last_error, "");

    /* gated: connected and buffering, not drained until the gate opens */
    struct kvidx_pub *p = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 1, p, false, KVI_GAP_APPLY);
    assert_int_equal(lfx_info(&f, 1).state, KVI_LISTENER_PENDING);
    struct kvi_listener_totals tot;
    kvi_listeners_totals(f.lp, &tot);
    assert_int_equal(tot.by_state[KVI_LISTENER_PENDING], 2);
    assert_int_equal(tot.listeners, 2);
    kvi_listeners_open_gate(f.lp);
    assert_int_equal(lfx_info(&f, 1).state, KVI_LISTENER_ACTIVE);
    assert_int_equal(lfx_info(&f, 6).state, KVI_LISTENER_ACTIVE);
    lfx_sync(&f, p, 1);
    uint64_t last = pub_chain(p, 0, 0, 2);
    lfx_settle(&f, 1, last);
    assert_int_equal(lfx_depth(&f, 1, 0, 2), 2);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* A pending listener buffers: batches published before the gate opens are applied after it. */
static void test_gate_drains_buffered(void **state)
{
    (void)state;
    struct kvi_listeners_config cfg = {.gated = true};
    struct lfx f;
    lfx_init(&f, &cfg);
    struct kvidx_pub *p = lfx_pub(NULL, true, NULL);
    lfx_register(&f, 1, p, true, KVI_GAP_APPLY);
    /* The SUB is connected but nobody reads it. Batches 0..4 either reach its
     * buffer (and are applied when the gate opens) or are lost to the slow
     * joiner (then batch 5 triggers a replay from 0): all end up applied. */
    uint64_t last = pub_chain(p, 0, 0, 5);
    assert_int_equal(lfx_info(&f, 1).ctr.messages, 0);
    kvi_listeners_open_gate(f.lp);
    lfx_sync(&f, p, 1);
    last = pub_chain(p, 0, 5, 6);
    lfx_settle(&f, 1, last);
    assert_int_equal(lfx_depth(&f, 1, 0, 6), 6);
    assert_int_equal(lfx_info(&f, 1).ctr.lost, 0);
    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* The applied position kvi_listeners_applied reports for instance id rank 0 (-1: none). */
struct applied_q {
    uint64_t id;
    int64_t seq;
};

static void applied_cb(void *ctx, const struct kvi_listener_applied *a)
{
    struct applied_q *q = ctx;
    assert_int_equal(a->dp_rank, 0);
    assert_null(a->instance_name);
    if (a->instance_id == q->id)
        q->seq = (int64_t)a->seq;
}

static int64_t applied_of(struct lfx *f, uint64_t id)
{
    int64_t inst = kvi_index_find_instance(f->ix, id, NULL);
    assert_true(inst >= 0);
    struct applied_q q = {id, -1}, other = {id, -1};
    uint32_t part = kvi_index_partition_of(f->ix, (uint32_t)inst);
    kvi_listeners_applied(f->lp, f->ix, part, applied_cb, &q);
    kvi_listeners_applied(f->lp, f->ix, (part + 1) % NW, applied_cb, &other);
    assert_int_equal(other.seq, -1); /* only the instance's own partition lists it */
    return q.seq;
}

/*
 * A seeded watermark W (recovered from a peer's dump): batches up to W count
 * as applied. A gated listener seeded before the gate opens skips its
 * buffered s <= W and applies from W + 1 (or replays from W + 1 when it
 * joined later); a registration seeded in its spec replays from W + 1, not
 * from 0. The applied position follows (seeded, then moved by the writers).
 */
static void test_seeded_watermarks(void **state)
{
    (void)state;
    struct kvi_listeners_config cfg = {.gated = true};
    struct lfx f;
    lfx_init(&f, &cfg);
    struct kvidx_pub *p = lfx_pub(NULL, true, NULL);
    lfx_register(&f, 1, p, true, KVI_GAP_APPLY);
    struct kvi_listener_key k1 = lfx_key(&f, 1, 0), k9 = lfx_key(&f, 9, 0);
    assert_int_equal(applied_of(&f, 1), -1);
    assert_int_equal(kvi_listeners_seed(f.lp, &k9, 2), -ENOENT);
    assert_int_equal(kvi_listeners_seed(f.lp, &k1, 2), 0);
    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_true(in.watermark_set);
    assert_int_equal(in.watermark, 2);
    assert_false(in.last_live_set);
    assert_int_equal(applied_of(&f, 1), 2);
    pub_chain(p, 0, 0, 6); /* seqs 0..5, buffered by the pending SUB (or replayed later) */
    kvi_listeners_open_gate(f.lp);
    lfx_sync(&f, p, 1);
    uint64_t last = pub_chain(p, 0, 6, 7);
    lfx_settle(&f, 1, last);
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.batches, 4); /* seqs 3..6 only */
    assert_int_equal(in.ctr.lost, 0);
    assert_int_equal(in.ctr.replay_overruns, 0);
    assert_int_equal(applied_of(&f, 1), (int64_t)last);
    assert_int_equal(kvi_listeners_seed(f.lp, &k1, 1), -EBUSY); /* it has drained */

    /* seeded at registration (the gate is open: active at once) */
    struct kvidx_pub *p2 = lfx_pub(NULL, true, NULL);
    pub_chain(p2, 1, 0, 5); /* seqs 0..4, before the registration: only in the replay ring */
    struct kvi_listener_spec s2 = {
        .ix = f.ix,
        .instance_id = 2,
        .endpoint = kvidx_pub_endpoint(p2),
        .replay_endpoint = kvidx_pub_replay_endpoint(p2),
        .seed_watermark = true,
        .watermark = 2,
    };
    assert_int_equal(kvi_listeners_register(f.lp, &s2), 0);
    assert_int_equal(applied_of(&f, 2), 2);
    lfx_sync(&f, p2, 2);
    last = pub_chain(p2, 1, 5, 6); /* seq 5: a gap after W = 2 */
    lfx_settle(&f, 2, last);
    in = lfx_info(&f, 2);
    assert_int_equal(in.ctr.replays, 1);
    assert_int_equal(in.ctr.replayed, 2); /* 3 and 4, not 0..4 */
    assert_int_equal(in.ctr.batches, 3);
    assert_int_equal(in.ctr.lost, 0);
    assert_int_equal(applied_of(&f, 2), (int64_t)last);
    kvidx_pub_destroy(p);
    kvidx_pub_destroy(p2);
    lfx_fini(&f);
}

/* ---- liveness ------------------------------------------------------------------ */

static bool conn(struct lfx *f, uint64_t id)
{
    return lfx_info(f, id).connected;
}

/*
 * Connect mode: a listener whose endpoint nobody binds is active but not
 * connected and has no message; once a publisher binds there it connects
 * (ZMQ retries by itself) and counts what it receives; when the publisher
 * goes, connected goes false again while the count stays.
 */
static void test_liveness_connect_mode(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    char ep[128];
    lfx_ipc(&f, ep, sizeof ep);
    struct kvi_listener_spec s = {.ix = f.ix, .instance_id = 1, .endpoint = ep};
    assert_int_equal(kvi_listeners_register(f.lp, &s), 0);
    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.state, KVI_LISTENER_ACTIVE); /* what /workers said, and all it said */
    assert_true(in.monitored);
    assert_false(in.connected); /* nothing is bound at ep: no connection can exist */
    assert_int_equal(in.peers, 0);
    assert_int_equal(in.ctr.messages, 0);
    assert_false(in.last_message_set);

    struct kvidx_pub *p = lfx_pub(ep, false, NULL);
    if (!WAIT_FOR(conn(&f, 1), WAIT_MS))
        fail_msg("listener never reported the publisher's connection");
    assert_int_equal(lfx_info(&f, 1).peers, 1);
    lfx_sync(&f, p, 1); /* probes are malformed: not counted as messages */
    assert_int_equal(lfx_info(&f, 1).ctr.messages, 0);
    uint64_t last = pub_chain(p, 0, 0, 3);
    lfx_settle(&f, 1, last);
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.messages, 3);
    assert_true(in.last_message_set);
    assert_true(in.last_message_age_ns < (uint64_t)WAIT_MS * 4 * 1000000u); /* a snapshot of a recent arrival */

    kvidx_pub_destroy(p);
    if (!WAIT_FOR(!conn(&f, 1), WAIT_MS))
        fail_msg("listener still connected after the publisher went away");
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.messages, 3);
    assert_true(in.last_message_set);

    /* pause closes the socket: not connected; resume monitors the new one */
    p = lfx_pub(ep, false, NULL);
    assert_true(WAIT_FOR(conn(&f, 1), WAIT_MS));
    struct kvi_listener_key k = lfx_key(&f, 1, 0);
    assert_int_equal(kvi_listeners_pause(f.lp, &k), 0);
    in = lfx_info(&f, 1);
    assert_false(in.connected);
    assert_true(in.monitored);
    assert_int_equal(kvi_listeners_resume(f.lp, &k), 0);
    assert_true(WAIT_FOR(conn(&f, 1), WAIT_MS));
    kvidx_pub_destroy(p);
    lfx_fini(&f);
    unlink(ep + strlen("ipc://"));
}

/* The same over TCP, a gated pool (pending listeners report their connection too), and the monitor budget. */
static void test_liveness_tcp_gated_and_budget(void **state)
{
    (void)state;
    struct kvi_listeners_config cfg = {.gated = true, .monitors = 2};
    struct lfx f;
    lfx_init(&f, &cfg);
    struct kvidx_pub *p1 = lfx_pub(NULL, false, NULL), *p2 = lfx_pub(NULL, false, NULL),
                     *p3 = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 1, p1, false, KVI_GAP_APPLY);
    lfx_register(&f, 2, p2, false, KVI_GAP_APPLY);
    lfx_register(&f, 3, p3, false, KVI_GAP_APPLY); /* past the budget of 2 */
    assert_int_equal(lfx_info(&f, 1).state, KVI_LISTENER_PENDING);
    if (!WAIT_FOR(conn(&f, 1) && conn(&f, 2), WAIT_MS))
        fail_msg("pending listeners never reported their connections");
    struct kvi_listener_info in = lfx_info(&f, 3);
    assert_false(in.monitored);
    assert_false(in.connected);
    /* the budget frees with the socket: a new registration gets the monitor */
    struct kvi_listener_key k1 = lfx_key(&f, 1, 0);
    assert_int_equal(kvi_listeners_unregister(f.lp, &k1), 0);
    struct kvidx_pub *p4 = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 4, p4, false, KVI_GAP_APPLY);
    assert_true(lfx_info(&f, 4).monitored);
    assert_true(WAIT_FOR(conn(&f, 4), WAIT_MS));
    kvi_listeners_open_gate(f.lp);
    lfx_sync(&f, p4, 4);
    uint64_t last = pub_chain(p4, 0, 0, 2);
    lfx_settle(&f, 4, last);
    assert_int_equal(lfx_info(&f, 4).ctr.messages, 2);
    assert_true(conn(&f, 4));
    kvidx_pub_destroy(p1);
    kvidx_pub_destroy(p2);
    kvidx_pub_destroy(p3);
    kvidx_pub_destroy(p4);
    lfx_fini(&f);

    struct kvi_listeners_config none = {.monitors = -1};
    lfx_init(&f, &none);
    p1 = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 1, p1, false, KVI_GAP_APPLY);
    lfx_sync(&f, p1, 1); /* it is connected, yet nothing says so: unknown */
    in = lfx_info(&f, 1);
    assert_false(in.monitored);
    assert_false(in.connected);
    kvidx_pub_destroy(p1);
    lfx_fini(&f);
}

/*
 * Bind mode: kvidx binds, engines connect. Every registration of the shared
 * endpoint is connected while at least one engine is; each counts only the
 * messages of its own topic.
 */
static void test_liveness_bind_mode(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    char ep[128];
    lfx_ipc(&f, ep, sizeof ep);
    register_bind(&f, 1, ep, "kv@pod-1@", NULL);
    register_bind(&f, 2, ep, "kv@pod-2@", NULL);
    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_true(in.monitored);
    assert_false(in.connected); /* nobody connected to the endpoint yet */
    assert_int_equal(in.ctr.messages, 0);

    struct kvidx_pub *a = connecting_pub(ep, "kv@pod-1@m", false);
    if (!WAIT_FOR(conn(&f, 1) && conn(&f, 2), WAIT_MS))
        fail_msg("bind endpoint never reported the engine's connection");
    struct kvidx_pub *b = connecting_pub(ep, "kv@pod-2@m", false);
    assert_true(WAIT_FOR(lfx_info(&f, 1).peers == 2, WAIT_MS));
    lfx_sync_topic(&f, a, 1, "kv@pod-1@m");
    uint64_t last = pub_chain(a, 0, 0, 3);
    lfx_settle(&f, 1, last);
    assert_int_equal(lfx_info(&f, 1).ctr.messages, 3);
    assert_int_equal(lfx_info(&f, 2).ctr.messages, 0);
    assert_false(lfx_info(&f, 2).last_message_set);

    kvidx_pub_destroy(a);
    assert_true(WAIT_FOR(lfx_info(&f, 1).peers == 1, WAIT_MS));
    assert_true(conn(&f, 1)); /* b is still there */
    kvidx_pub_destroy(b);
    if (!WAIT_FOR(!conn(&f, 1) && !conn(&f, 2), WAIT_MS))
        fail_msg("bind endpoint still connected after every engine left");
    lfx_fini(&f);
    unlink(ep + strlen("ipc://"));
}

/* on_unknown of the open endpoint below: accepts "kv@pod-1@m" only, counts every call. */
static _Atomic uint32_t offered, offered_ok;
static bool hold_pod1(void *ctx, const char *endpoint, const void *topic, size_t len, uint64_t seq,
                      const void *payload, size_t plen)
{
    (void)ctx, (void)endpoint, (void)seq, (void)payload, (void)plen;
    bool ok = len == strlen("kv@pod-1@m") && memcmp(topic, "kv@pod-1@m", len) == 0;
    atomic_fetch_add(&offered, 1);
    if (ok)
        atomic_fetch_add(&offered_ok, 1);
    return ok;
}

static uint64_t unknown_topics(struct lfx *f)
{
    struct kvi_listener_totals t;
    kvi_listeners_totals(f->lp, &t);
    return t.unknown_topic;
}

/*
 * An open bind endpoint: bound with no registration; batches of a topic the
 * callback accepts are held and applied, in order, once that topic is
 * registered (exact topic: "kv@pod-1@mx" is not pod 1's); refused ones are
 * counted as unknown topics. Closed (kvi_listeners_bind_close), it drops
 * what it held, can be opened again, and a registration keeps its socket.
 */
static void test_open_bind_endpoint(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    char ep[128];
    lfx_ipc(&f, ep, sizeof ep);
    struct kvi_listener_bind_spec bs = {.endpoint = ep, .prefix = "kv@", .on_unknown = hold_pod1, .max_held = 8};
    assert_int_equal(kvi_listeners_bind_open(f.lp, &bs), 0);
    assert_int_equal(kvi_listeners_bind_open(f.lp, &bs), -EEXIST);

    struct kvidx_pub *a = connecting_pub(ep, "kv@pod-1@m", false);
    struct kvidx_pub *x = connecting_pub(ep, "kv@pod-1@mx", false);
    /* slow joiner: 1-frame probes (never offered) until the subscription is up */
    const void *fr[1] = {"kv@pod-1@m"};
    size_t sz[1] = {strlen("kv@pod-1@m")};
    if (!WAIT_FOR((raw(a, 1, fr, sz), unknown_topics(&f) > 0), WAIT_MS))
        fail_msg("open bind endpoint never received a probe");
    const void *frx[1] = {"kv@pod-1@mx"};
    size_t szx[1] = {strlen("kv@pod-1@mx")};
    uint64_t u0 = unknown_topics(&f);
    if (!WAIT_FOR((raw(x, 1, frx, szx), unknown_topics(&f) > u0), WAIT_MS))
        fail_msg("open bind endpoint never received the second engine's probe");

    uint64_t last = pub_chain(a, 0, 0, 3); /* held: nothing registered */
    assert_true(WAIT_FOR(atomic_load(&offered_ok) == 3, WAIT_MS));
    pub_chain(x, 1, 0, 2);                 /* refused */
    assert_true(WAIT_FOR(atomic_load(&offered) == 5, WAIT_MS));
    uint64_t u1 = unknown_topics(&f);

    struct kvi_listener_spec s = {.ix = f.ix, .instance_id = 1, .endpoint = ep, .topic = "kv@pod-1@m",
                                  .mode = KVI_LISTEN_BIND, .exact_topic = true};
    assert_int_equal(kvi_listeners_register(f.lp, &s), 0);
    lfx_settle(&f, 1, last);
    assert_int_equal(lfx_depth(&f, 1, 0, 3), 3);
    last = pub_chain(a, 0, 3, 4); /* live now */
    lfx_settle(&f, 1, last);
    assert_int_equal(lfx_depth(&f, 1, 0, 4), 4);
    pub_chain(x, 1, 2, 3); /* still nobody's: exact topic */
    assert_true(WAIT_FOR(atomic_load(&offered) == 6, WAIT_MS));
    assert_int_equal(unknown_topics(&f), u1 + 1);
    assert_int_equal(lfx_info(&f, 1).ctr.batches, 4);

    /* the endpoint stays bound once its last registration goes */
    struct kvi_listener_key k1 = lfx_key(&f, 1, 0);
    assert_int_equal(kvi_listeners_unregister(f.lp, &k1), 0);
    pub_chain(a, 0, 4, 5);
    assert_true(WAIT_FOR(atomic_load(&offered_ok) == 4, WAIT_MS)); /* held again */

    /* closed: the held message is dropped; the endpoint can be opened again at once, and a
     * registration of the topic then gets only what comes after */
    assert_int_equal(kvi_listeners_bind_close(f.lp, ep), 0);
    assert_int_equal(kvi_listeners_bind_close(f.lp, ep), -ENOENT);
    assert_int_equal(kvi_listeners_bind_open(f.lp, &bs), 0);
    struct kvi_listener_spec s2 = s;
    s2.instance_id = 2;
    assert_int_equal(kvi_listeners_register(f.lp, &s2), 0);
    assert_int_equal(lfx_info(&f, 2).ctr.batches, 0); /* nothing held survived the close */
    lfx_sync_topic(&f, a, 2, "kv@pod-1@m");
    last = pub_chain(a, 7, 0, 2);
    lfx_settle(&f, 2, last);
    assert_int_equal(lfx_depth(&f, 2, 7, 2), 2);
    assert_int_equal(lfx_info(&f, 2).ctr.batches, 2);
    /* closing an endpoint with a registration keeps the socket for it: it still receives */
    assert_int_equal(kvi_listeners_bind_close(f.lp, ep), 0);
    last = pub_chain(a, 7, 2, 3);
    lfx_settle(&f, 2, last);
    assert_int_equal(lfx_depth(&f, 2, 7, 3), 3);
    uint32_t offered_before = atomic_load(&offered);
    uint64_t u2 = unknown_topics(&f);
    pub_chain(x, 1, 3, 4); /* reaches the socket (pod 2's "kv@pod-1@m" covers it): unknown, not offered */
    assert_true(WAIT_FOR(unknown_topics(&f) == u2 + 1, WAIT_MS));
    assert_int_equal(atomic_load(&offered), offered_before);

    kvidx_pub_destroy(a);
    kvidx_pub_destroy(x);
    lfx_fini(&f);
    unlink(ep + strlen("ipc://"));
}

int main(void)
{
    kvi_rcu_register_thread();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage_between_good_batches),
        cmocka_unit_test(test_engine_connects_mode),
        cmocka_unit_test(test_pause_resume),
        cmocka_unit_test(test_unregister_then_register_fresh),
        cmocka_unit_test(test_errors_and_gate),
        cmocka_unit_test(test_gate_drains_buffered),
        cmocka_unit_test(test_seeded_watermarks),
        cmocka_unit_test(test_liveness_connect_mode),
        cmocka_unit_test(test_liveness_tcp_gated_and_budget),
        cmocka_unit_test(test_liveness_bind_mode),
        cmocka_unit_test(test_open_bind_endpoint),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return rc;
}
