/* ctest-labels: unit -- net/watermark.{h,c}: every row of the wire-protocol.md §6.3 table */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "net/watermark.h"

/* Feed one live seq and check the verdict fields. */
static struct kvi_wm_verdict feed(struct kvi_wm *wm, uint64_t s, bool replay, enum kvi_gap_policy pol)
{
    struct kvi_wm_verdict v = kvi_wm_live(wm, s, replay, pol);
    assert_true(wm->l_set);
    assert_int_equal(wm->l, s);
    return v;
}

/* Apply what the verdict says should be applied. */
static void apply_if(struct kvi_wm *wm, struct kvi_wm_verdict v, uint64_t s)
{
    if (v.act == KVI_WM_APPLY || v.act == KVI_WM_LOSS || v.act == KVI_WM_LOSS_CLEAR)
        kvi_wm_applied(wm, s);
}

static void test_fresh_publisher_from_zero(void **state)
{
    (void)state;
    struct kvi_wm wm = {0};
    assert_int_equal(kvi_wm_next(&wm), 0);
    for (uint64_t s = 0; s < 100; s++) {
        struct kvi_wm_verdict v = feed(&wm, s, true, KVI_GAP_APPLY);
        assert_int_equal(v.act, KVI_WM_APPLY);
        assert_false(v.restart);
        kvi_wm_applied(&wm, s);
        assert_int_equal(kvi_wm_next(&wm), s + 1);
    }
}

static void test_joined_mid_stream(void **state)
{
    (void)state;
    /* With replay: replay everything from 0. */
    struct kvi_wm wm = {0};
    struct kvi_wm_verdict v = feed(&wm, 5, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_REPLAY);
    assert_int_equal(v.from, 0);
    assert_int_equal(v.lost, 5);
    assert_false(v.restart);
    assert_false(wm.w_set);

    /* Without replay: a loss, applied; the clear policy does not clear on join. */
    for (int pol = KVI_GAP_APPLY; pol <= KVI_GAP_CLEAR; pol++) {
        kvi_wm_reset(&wm);
        v = feed(&wm, 7, false, (enum kvi_gap_policy)pol);
        assert_int_equal(v.act, KVI_WM_LOSS);
        assert_int_equal(v.lost, 7);
        apply_if(&wm, v, 7);
        assert_int_equal(kvi_wm_next(&wm), 8);
    }
}

/* Dynamo cursor expectations with Live(10): 11 contiguous, 15 gap expecting 11, 10 and 9 stale.
 * Under the kvidx rule "stale" needs s > L, i.e. a seq already covered by a replay. */
static void test_cursor_expectations(void **state)
{
    (void)state;
    struct kvi_wm base = {.w = 10, .w_set = true, .l = 8, .l_set = true};

    struct kvi_wm wm = base;
    struct kvi_wm_verdict v = feed(&wm, 11, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_APPLY);

    wm = base;
    v = feed(&wm, 15, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_REPLAY);
    assert_int_equal(v.from, 11);
    assert_int_equal(v.lost, 4);
    assert_int_equal(wm.w, 10); /* W moves only when something is applied */

    wm = base;
    v = feed(&wm, 10, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_STALE);
    assert_false(v.restart);
    wm = base;
    v = feed(&wm, 9, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_STALE);
    assert_false(v.restart);
}

/* A replay ran ahead of the live stream: live seqs up to W are skipped, then contiguous. */
static void test_stale_after_replay(void **state)
{
    (void)state;
    struct kvi_wm wm = {0};
    struct kvi_wm_verdict v = feed(&wm, 3, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_REPLAY);
    for (uint64_t s = 0; s <= 6; s++) /* the replay applied 0..6 */
        kvi_wm_applied(&wm, s);
    for (uint64_t s = 4; s <= 6; s++) {
        v = feed(&wm, s, true, KVI_GAP_APPLY);
        assert_int_equal(v.act, KVI_WM_STALE);
        assert_false(v.restart);
    }
    v = feed(&wm, 7, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_APPLY);
}

static void test_gap_without_replay(void **state)
{
    (void)state;
    struct kvi_wm wm = {.w = 4, .w_set = true, .l = 4, .l_set = true};
    struct kvi_wm_verdict v = feed(&wm, 9, false, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_LOSS);
    assert_int_equal(v.from, 5);
    assert_int_equal(v.lost, 4);
    apply_if(&wm, v, 9);
    assert_int_equal(kvi_wm_next(&wm), 10);

    wm = (struct kvi_wm){.w = 4, .w_set = true, .l = 4, .l_set = true};
    v = feed(&wm, 6, false, KVI_GAP_CLEAR);
    assert_int_equal(v.act, KVI_WM_LOSS_CLEAR);
    assert_int_equal(v.lost, 1);
    assert_false(v.restart);
}

static void test_restart_detection(void **state)
{
    (void)state;
    /* Back to 0: restart, then a fresh publisher's first batch. */
    struct kvi_wm wm = {.w = 500, .w_set = true, .l = 500, .l_set = true};
    struct kvi_wm_verdict v = feed(&wm, 0, true, KVI_GAP_APPLY);
    assert_true(v.restart);
    assert_int_equal(v.act, KVI_WM_APPLY);
    assert_false(wm.w_set);
    kvi_wm_applied(&wm, 0);
    v = feed(&wm, 1, true, KVI_GAP_APPLY);
    assert_false(v.restart);
    assert_int_equal(v.act, KVI_WM_APPLY);

    /* Back to a small seq > 0 (slow joiner after the restart): restart, then replay from 0. */
    wm = (struct kvi_wm){.w = 500, .w_set = true, .l = 500, .l_set = true};
    v = feed(&wm, 3, true, KVI_GAP_APPLY);
    assert_true(v.restart);
    assert_int_equal(v.act, KVI_WM_REPLAY);
    assert_int_equal(v.from, 0);

    /* Same seq twice on the live stream is a restart too (never a duplicate on one connection). */
    wm = (struct kvi_wm){.w = 10, .w_set = true, .l = 10, .l_set = true};
    v = feed(&wm, 10, false, KVI_GAP_APPLY);
    assert_true(v.restart);
    assert_int_equal(v.act, KVI_WM_LOSS); /* W unset, s > 0, no replay */
    assert_int_equal(v.lost, 10);

    /* Restart while W is unset (first batches undecodable): L alone detects it. */
    wm = (struct kvi_wm){0};
    v = feed(&wm, 0, true, KVI_GAP_APPLY); /* suppose it failed to decode: not applied */
    v = feed(&wm, 0, true, KVI_GAP_APPLY);
    assert_true(v.restart);
    assert_int_equal(v.act, KVI_WM_APPLY);

    /* Without replay, clear policy: the restart clears; the join after it does not clear again. */
    wm = (struct kvi_wm){.w = 10, .w_set = true, .l = 10, .l_set = true};
    v = feed(&wm, 2, false, KVI_GAP_CLEAR);
    assert_true(v.restart);
    assert_int_equal(v.act, KVI_WM_LOSS);
}

/* A decode failure leaves W alone: the next live batch is a gap that replays the failed one. */
static void test_decode_failure_is_a_gap(void **state)
{
    (void)state;
    struct kvi_wm wm = {.w = 20, .w_set = true, .l = 20, .l_set = true};
    struct kvi_wm_verdict v = feed(&wm, 21, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_APPLY); /* ... but it fails to decode: no kvi_wm_applied */
    v = feed(&wm, 22, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_REPLAY);
    assert_int_equal(v.from, 21);
    assert_int_equal(v.lost, 1);
    assert_false(v.restart);
}

/* Large seqs (a publisher starting at time_ns): no overflow in next/lost. */
static void test_large_seqs(void **state)
{
    (void)state;
    uint64_t big = UINT64_MAX - 10;
    struct kvi_wm wm = {0};
    struct kvi_wm_verdict v = feed(&wm, big, false, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_LOSS);
    assert_true(v.lost == big);
    kvi_wm_applied(&wm, big);
    v = feed(&wm, big + 1, false, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_APPLY);
}

/* A random stream checked against an independent statement of the rule. */
static void test_random_against_model(void **state)
{
    (void)state;
    uint64_t rng = 12345;
    for (int round = 0; round < 200; round++) {
        struct kvi_wm wm = {0};
        bool w_set = false, l_set = false;
        uint64_t w = 0, l = 0;
        bool replay = round & 1;
        enum kvi_gap_policy pol = (round & 2) ? KVI_GAP_CLEAR : KVI_GAP_APPLY;
        uint64_t s = 0;
        for (int i = 0; i < 300; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33) % 100;
            if (r < 70)
                s = s + 1;
            else if (r < 85)
                s = s + 2 + r % 5;
            else if (r < 92)
                s = r % 4; /* restart */
            /* else: same s again */
            bool restart = l_set && s <= l;
            if (restart)
                w_set = l_set = false;
            uint8_t want;
            uint64_t next = w_set ? w + 1 : 0;
            if (w_set && s <= w)
                want = KVI_WM_STALE;
            else if (s == next)
                want = KVI_WM_APPLY;
            else if (replay)
                want = KVI_WM_REPLAY;
            else if (w_set && pol == KVI_GAP_CLEAR)
                want = KVI_WM_LOSS_CLEAR;
            else
                want = KVI_WM_LOSS;
            l = s;
            l_set = true;

            struct kvi_wm_verdict v = feed(&wm, s, replay, pol);
            assert_int_equal(v.act, want);
            assert_int_equal(v.restart, restart);
            if (want == KVI_WM_REPLAY) {
                /* Pretend the replay filled everything up to s. */
                assert_int_equal(v.from, next);
                kvi_wm_applied(&wm, s);
                w = s;
                w_set = true;
            } else if (want != KVI_WM_STALE && (r % 7) != 0) { /* 1 in 7 fails to decode */
                kvi_wm_applied(&wm, s);
                w = s;
                w_set = true;
            }
            assert_int_equal(wm.w_set, w_set);
            if (w_set)
                assert_int_equal(wm.w, w);
        }
    }
}

/* A seeded W (a watermark recovered from a peer's dump): L unset, the §6.3 rows with W set. */
static void test_seeded(void **state)
{
    (void)state;
    struct kvi_wm wm = {0};
    kvi_wm_seed(&wm, 10);
    assert_true(wm.w_set);
    assert_false(wm.l_set);
    assert_int_equal(kvi_wm_next(&wm), 11);
    /* s <= W: stale (covered by the dump), never a restart since L is unset */
    struct kvi_wm_verdict v = feed(&wm, 4, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_STALE);
    assert_false(v.restart);
    v = feed(&wm, 10, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_STALE);
    assert_false(v.restart);
    /* s = W + 1: applied */
    v = feed(&wm, 11, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_APPLY);
    apply_if(&wm, v, 11);
    assert_int_equal(kvi_wm_next(&wm), 12);

    /* s > W + 1: replay from W + 1 (not from 0) */
    kvi_wm_reset(&wm);
    kvi_wm_seed(&wm, 10);
    v = feed(&wm, 15, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_REPLAY);
    assert_int_equal(v.from, 11);
    assert_int_equal(v.lost, 4);
    assert_false(v.restart);
    /* without replay: a counted loss of W + 1 .. s - 1 (the clear policy clears: W is set) */
    kvi_wm_reset(&wm);
    kvi_wm_seed(&wm, 10);
    v = feed(&wm, 15, false, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_LOSS);
    assert_int_equal(v.lost, 4);
    kvi_wm_reset(&wm);
    kvi_wm_seed(&wm, 10);
    v = feed(&wm, 15, false, KVI_GAP_CLEAR);
    assert_int_equal(v.act, KVI_WM_LOSS_CLEAR);
    /* seeding keeps L: a later restart is still detected */
    kvi_wm_seed(&wm, 20);
    v = feed(&wm, 3, true, KVI_GAP_APPLY);
    assert_true(v.restart);
    assert_int_equal(v.act, KVI_WM_REPLAY);
    assert_int_equal(v.from, 0);
}

/* A live seq more than KVI_WM_MAX_JUMP past L (else W): IMPLAUSIBLE, W and L unchanged; a run resyncs. */
static void test_implausible_jump(void **state)
{
    (void)state;
    struct kvi_wm wm = {.w = 10, .w_set = true, .l = 10, .l_set = true};
    struct kvi_wm_verdict v = kvi_wm_live(&wm, 10 + KVI_WM_MAX_JUMP, false, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_LOSS); /* exactly the bound: a (huge) gap */
    wm = (struct kvi_wm){.w = 10, .w_set = true, .l = 10, .l_set = true};
    v = kvi_wm_live(&wm, 11 + KVI_WM_MAX_JUMP, false, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_IMPLAUSIBLE);
    assert_false(v.restart);
    assert_int_equal(v.lost, 0);
    assert_int_equal(wm.l, 10);
    assert_int_equal(wm.w, 10);
    v = kvi_wm_live(&wm, 10 + (UINT64_C(1) << 63), true, KVI_GAP_CLEAR);
    assert_int_equal(v.act, KVI_WM_IMPLAUSIBLE);
    v = feed(&wm, 11, false, KVI_GAP_APPLY); /* the real stream goes on */
    assert_int_equal(v.act, KVI_WM_APPLY);
    assert_false(v.restart);
    assert_int_equal(wm.n_odd, 0);

    /* seeded W, L unset: measured from W */
    wm = (struct kvi_wm){0};
    kvi_wm_seed(&wm, 100);
    v = kvi_wm_live(&wm, UINT64_MAX - 1, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_IMPLAUSIBLE);
    assert_false(wm.l_set);

    /* nothing seen: not judged (the join rows) */
    wm = (struct kvi_wm){0};
    assert_false(kvi_wm_implausible(&wm, UINT64_MAX - 1));

    /* a run of KVI_WM_RESYNC_RUN, each the previous + 1: a restart onto a fresh stream at s */
    wm = (struct kvi_wm){.w = 10, .w_set = true, .l = 10, .l_set = true};
    uint64_t b = UINT64_C(1) << 50;
    for (uint32_t k = 0; k + 1 < KVI_WM_RESYNC_RUN; k++)
        assert_int_equal(kvi_wm_live(&wm, b + k, true, KVI_GAP_APPLY).act, KVI_WM_IMPLAUSIBLE);
    v = feed(&wm, b + KVI_WM_RESYNC_RUN - 1, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_APPLY);
    assert_true(v.restart);
    assert_true(v.resync);
    assert_false(wm.w_set);
    kvi_wm_applied(&wm, b + KVI_WM_RESYNC_RUN - 1);
    v = feed(&wm, b + KVI_WM_RESYNC_RUN, true, KVI_GAP_APPLY);
    assert_int_equal(v.act, KVI_WM_APPLY);
    assert_false(v.restart);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seeded),
        cmocka_unit_test(test_fresh_publisher_from_zero),
        cmocka_unit_test(test_joined_mid_stream),
        cmocka_unit_test(test_cursor_expectations),
        cmocka_unit_test(test_stale_after_replay),
        cmocka_unit_test(test_gap_without_replay),
        cmocka_unit_test(test_restart_detection),
        cmocka_unit_test(test_decode_failure_is_a_gap),
        cmocka_unit_test(test_large_seqs),
        cmocka_unit_test(test_implausible_jump),
        cmocka_unit_test(test_random_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
