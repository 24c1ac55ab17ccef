/* ctest-labels: integration tsan */
/*
 * Listeners end to end, bounds on what one stream may make kvidx hold or
 * count (issue 18, items 1, 6 and 10): the distinct dp ranks of one
 * registration (max_ranks), a publisher restart after many ranks (every one
 * is cleared), and a forged seq jump of 2^63 (dropped without touching the
 * watermarks or `lost`). Real publishers (net/include/kvidx/publisher.h)
 * over loopback TCP; batches with a chosen rank are encoded here (msgpack,
 * vLLM #16750 layout) and sent with kvidx_pub_publish_payload (next seq) or
 * kvidx_pub_send_raw (a forged seq). Waits are bounded polls
 * (listener_fixture.h); the rank warning is captured with kvi_log_set_sink.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdbool.h>

#include "net/log.h"
#include "tests/net/listener_fixture.h"

/* ---- batches with a chosen rank --------------------------------------------- */

static size_t put_be(uint8_t *o, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--) {
        o[i] = (uint8_t)v;
        v >>= 8;
    }
    return (size_t)bytes;
}

/*
 * [ts, [["BlockStored", [hash], nil, [tokens], BS, nil]], rank]: block 0 of
 * chain c (no parent), on the batch's rank. @return the payload length.
 */
static size_t enc_batch(uint8_t *o, uint32_t c, int32_t rank)
{
    size_t n = 0;
    o[n++] = 0x93;                            /* [ts, events, rank] */
    o[n++] = 0xcb;                            /* float64 ts = 0 */
    n += put_be(o + n, 0, 8);
    o[n++] = 0x91;                            /* one event */
    o[n++] = 0x96;                            /* 6 elements */
    o[n++] = 0xab;                            /* fixstr 11 */
    memcpy(o + n, "BlockStored", 11);
    n += 11;
    o[n++] = 0x91;
    o[n++] = 0xcf;                            /* uint64 hash */
    n += put_be(o + n, chain_hash(c, 0), 8);
    o[n++] = 0xc0;                            /* no parent */
    uint32_t tok[BS];
    chain_tokens(c, 0, tok);
    o[n++] = (uint8_t)(0x90 | BS);
    for (int k = 0; k < BS; k++) {
        o[n++] = 0xce;                        /* uint32 token */
        n += put_be(o + n, tok[k], 4);
    }
    o[n++] = BS;                              /* block_size */
    o[n++] = 0xc0;                            /* lora_id nil */
    o[n++] = 0xd2;                            /* int32 rank */
    n += put_be(o + n, (uint32_t)rank, 4);
    return n;
}

/* Publish block 0 of chain c on rank `rank` with the publisher's next seq. @return the seq. */
static uint64_t pub_rank(struct kvidx_pub *p, uint32_t c, int32_t rank)
{
    uint8_t buf[128];
    size_t len = enc_batch(buf, c, rank);
    uint64_t seq;
    assert_int_equal(kvidx_pub_publish_payload(p, buf, len, &seq), 0);
    return seq;
}

/* Send block 0 of chain c on rank 0 under a forged seq (consumes none of the publisher's). */
static void pub_forged(struct kvidx_pub *p, uint32_t c, uint64_t seq)
{
    uint8_t buf[128], s8[8];
    size_t len = enc_batch(buf, c, 0);
    put_be(s8, seq, 8);
    const void *fr[3] = {NULL, s8, buf};
    size_t sz[3] = {0, 8, len};
    assert_int_equal(kvidx_pub_send_raw(p, fr, sz, 3), 0);
}

/* The ranks of instance `id` that hold block 0 of chain c: count, and a bit per rank below 64. */
static uint32_t ranks_holding(struct lfx *f, uint64_t id, uint32_t c, uint64_t *bits)
{
    int64_t inst = kvi_index_find_instance(f->ix, id, NULL);
    *bits = 0;
    if (inst < 0)
        return 0;
    uint64_t q = chain_content(c, 0);
    struct kvi_match m[MAXM];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(f->ix, &q, 1, m, MAXM);
    kvi_rcu_read_unlock();
    assert_true(k <= MAXM);
    uint32_t n = 0;
    for (size_t i = 0; i < k; i++)
        if (m[i].instance == (uint32_t)inst && m[i].depth >= 1) {
            n++;
            if (m[i].dp_rank < 64)
                *bits |= 1ull << m[i].dp_rank;
        }
    return n;
}

/* ---- log capture ------------------------------------------------------------ */

struct cap {
    _Atomic uint32_t rank_warnings; /* lines about the rank bound */
    _Atomic uint32_t lines;
};

static void cap_sink(void *ctx, enum kvi_log_level level, const char *line, size_t len)
{
    struct cap *c = ctx;
    atomic_fetch_add(&c->lines, 1);
    static const char needle[] = "distinct ranks a registration may hold";
    if (level == KVI_LOG_WARN && len >= sizeof needle - 1 && memmem(line, len, needle, sizeof needle - 1) != NULL)
        atomic_fetch_add(&c->rank_warnings, 1);
}

/* ---- tests ------------------------------------------------------------------ */

/*
 * max_ranks 4: of ranks 0..9, the registered rank 0 and the first three new
 * ones (1, 2, 3) are indexed; batches of ranks 4..9 are dropped whole and
 * counted, with one warning for the registration. Their seqs count as
 * handled: no gap, the watermark reaches the last seq. A batch of a rank
 * already held is still applied, and a further new rank is dropped without
 * a second warning.
 */
static void test_rank_bound(void **state)
{
    (void)state;
    struct cap c = {0};
    kvi_log_set_sink(cap_sink, &c);
    struct lfx f;
    setenv("KVI_TEST_VERBOSE", "1", 1); /* lfx_init: a pool that logs (into the sink) */
    lfx_init(&f, NULL);
    unsetenv("KVI_TEST_VERBOSE");
    kvi_listeners_set_max_ranks(f.lp, 4);
    struct kvidx_pub *p = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 1, p, false, KVI_GAP_APPLY);
    lfx_sync(&f, p, 1);
    struct kvi_listener_key key = lfx_key(&f, 1, 0);
    uint32_t held[8];
    assert_int_equal(kvi_listeners_ranks(f.lp, &key, held, 8), 0); /* no batch yet: none, not even rank 0 */

    uint64_t last = 0;
    for (int32_t r = 0; r < 10; r++)
        last = pub_rank(p, 1, r); /* seqs 0..9 */
    assert_int_equal(last, 9);
    lfx_settle(&f, 1, 9);

    uint64_t bits;
    assert_int_equal(ranks_holding(&f, 1, 1, &bits), 4);
    assert_int_equal(bits, 0xf);
    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.ranks_dropped, 6);
    assert_int_equal(in.ctr.batches, 4);
    assert_int_equal(in.ctr.gaps, 0);
    assert_int_equal(in.ctr.lost, 0);
    assert_int_equal(in.ctr.decode_errors, 0);
    assert_int_equal(in.ctr.events_stored, 4);
    assert_int_equal(kvi_listeners_ranks(f.lp, &key, held, 8), 4); /* those held, not those dropped */
    assert_int_equal(held[0], 0);
    assert_int_equal(held[1], 1);
    assert_int_equal(held[2], 2);
    assert_int_equal(held[3], 3);
    assert_int_equal(kvi_listeners_ranks(f.lp, &key, held, 2), 4); /* the count past cap */
    struct kvi_listener_key nokey = lfx_key(&f, 2, 0);
    assert_int_equal(kvi_listeners_ranks(f.lp, &nokey, held, 8), -ENOENT);
    assert_true(WAIT_FOR(atomic_load(&c.rank_warnings) == 1, WAIT_MS));

    /* a held rank still goes in; another new one is dropped, without a second warning */
    pub_rank(p, 2, 3);
    last = pub_rank(p, 2, 12);
    lfx_settle(&f, 1, last);
    assert_int_equal(ranks_holding(&f, 1, 2, &bits), 1);
    assert_int_equal(bits, 1ull << 3);
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.ranks_dropped, 7);
    assert_int_equal(in.ctr.batches, 5);
    assert_int_equal(atomic_load(&c.rank_warnings), 1);

    struct kvi_listener_totals tot;
    kvi_listeners_totals(f.lp, &tot);
    assert_int_equal(tot.ctr.ranks_dropped, 7);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
    kvi_log_set_sink(NULL, NULL);
}

/*
 * A publisher restart clears every rank its stream carried: 20 ranks
 * (within the default bound), then the engine restarts (seq back to 0):
 * none of the 20 still answers, and the new stream is indexed.
 */
static void test_restart_clears_every_rank(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub *p = lfx_pub(NULL, false, NULL);
    char ep[128];
    snprintf(ep, sizeof ep, "%s", kvidx_pub_endpoint(p));
    lfx_register(&f, 1, p, false, KVI_GAP_APPLY);
    lfx_sync(&f, p, 1);

    uint64_t last = 0;
    for (int32_t r = 19; r >= 1; r--) /* ranks 19..1, then 0: kvi_listeners_ranks sorts them */
        pub_rank(p, 1, r);
    last = pub_rank(p, 1, 0); /* seqs 0..19 */
    lfx_settle(&f, 1, last);
    struct kvi_listener_key key = lfx_key(&f, 1, 0);
    uint32_t held[32];
    assert_int_equal(kvi_listeners_ranks(f.lp, &key, held, 32), 20);
    for (uint32_t r = 0; r < 20; r++)
        assert_int_equal(held[r], r);
    uint64_t bits;
    assert_int_equal(ranks_holding(&f, 1, 1, &bits), 20);
    assert_int_equal(bits, (1ull << 20) - 1);

    kvidx_pub_destroy(p);
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    pc.socket_mode = KVIDX_PUB_SOCKET_BIND; /* the resolved endpoint has no '*' */
    p = kvidx_pub_create(&pc);
    assert_non_null(p);
    lfx_sync(&f, p, 1);
    last = pub_rank(p, 2, 0); /* seq 0 of the new process */
    assert_int_equal(last, 0);
    lfx_settle(&f, 1, 0);

    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.restarts, 1);
    assert_int_equal(ranks_holding(&f, 1, 1, &bits), 0); /* all 20 gone */
    assert_int_equal(kvi_listeners_ranks(f.lp, &key, held, 32), 1); /* rank 0, of the new stream */
    assert_int_equal(held[0], 0);
    assert_int_equal(bits, 0);
    assert_int_equal(ranks_holding(&f, 1, 2, &bits), 1);
    assert_int_equal(bits, 1);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/*
 * A forged live seq 2^63 past the stream (no replay endpoint, so a gap
 * would count its whole width as lost): dropped and counted; W and L stay,
 * `lost` and `gaps` do not move, the forged batch is not indexed, and the
 * publisher's next real seq continues the stream (no restart, no clear).
 */
static void test_forged_seq_jump(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub *p = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 1, p, false, KVI_GAP_APPLY);
    lfx_sync(&f, p, 1);

    lfx_settle(&f, 1, pub_chain(p, 0, 0, 5)); /* seqs 0..4 */
    uint64_t msgs = lfx_info(&f, 1).ctr.messages;
    pub_forged(p, 3, 4 + (UINT64_C(1) << 63));
    struct kvi_listener_info in;
    assert_true(WAIT_FOR((in = lfx_info(&f, 1), in.ctr.messages > msgs), WAIT_MS));
    assert_int_equal(in.ctr.implausible_seq, 1);
    assert_true(in.last_live_set);
    assert_int_equal(in.last_live, 4);
    assert_int_equal(in.watermark, 4);

    lfx_settle(&f, 1, pub_chain(p, 0, 5, 8)); /* seqs 5..7: the real stream goes on */
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.lost, 0);
    assert_int_equal(in.ctr.gaps, 0);
    assert_int_equal(in.ctr.restarts, 0);
    assert_int_equal(in.ctr.implausible_seq, 1);
    assert_int_equal(in.ctr.batches, 8);
    assert_int_equal(in.last_live, 7);
    assert_int_equal(lfx_depth(&f, 1, 0, 8), 8); /* nothing cleared */
    assert_int_equal(lfx_depth(&f, 1, 3, 1), 0); /* the forged batch is not indexed */

    struct kvi_listener_totals tot;
    kvi_listeners_totals(f.lp, &tot);
    assert_int_equal(tot.ctr.lost, 0);
    assert_int_equal(tot.ctr.implausible_seq, 1);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

int main(void)
{
    kvi_rcu_register_thread(); /* the queries read the index in RCU read sections */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_bound),
        cmocka_unit_test(test_restart_clears_every_rank),
        cmocka_unit_test(test_forged_seq_jump),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return rc;
}
