/* ctest-labels: unit -- net/replay.{h,c}: one stream's ordering and replay state machine, event by event */
/*
 * The stream is driven directly with live batches, replay replies,
 * sentinels and clock ticks, in orders that the integration tests
 * (listener_replay_test.c) can only produce by chance: replies overtaking a
 * hole, duplicates from both paths, several retries, a restart in the middle
 * of a replay, undecodable batches on either path. The stream's callbacks
 * are its owner's interface (apply a batch, clear the rank, send a request,
 * discard the DEALER); here they record what the stream asked for, so each
 * test can check the exact sequence of applied batches.
 *
 * A payload is the 8-byte seq it belongs to followed by a tag byte ('L' for
 * a live copy, 'R' for a replayed one), so a test sees which copy was applied.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "net/replay.h"

#define MAXREC 256
#define SEC 1000000000ull

struct rec {
    uint64_t applied[MAXREC];
    char copy[MAXREC];
    size_t n_applied;
    uint64_t requests[MAXREC];
    size_t n_requests;
    unsigned clears, resets;
    uint64_t bad_seq; /* apply fails for this seq (UINT64_MAX: none) */
    int request_rc;
    struct kvi_stream_note notes[MAXREC]; /* what the stream reported for the log */
    size_t n_notes;
};

static int rec_apply(void *ctx, uint64_t seq, const void *buf, size_t len)
{
    struct rec *r = ctx;
    assert_int_equal(len, 9);
    uint64_t s;
    memcpy(&s, buf, 8);
    assert_true(s == seq); /* the payload applied is the one of that seq */
    if (seq == r->bad_seq)
        return -EBADMSG;
    assert_true(r->n_applied < MAXREC);
    r->applied[r->n_applied] = seq;
    r->copy[r->n_applied++] = ((const char *)buf)[8];
    return 0;
}

static void rec_clear(void *ctx)
{
    ((struct rec *)ctx)->clears++;
}

static int rec_request(void *ctx, uint64_t from)
{
    struct rec *r = ctx;
    assert_true(r->n_requests < MAXREC);
    r->requests[r->n_requests++] = from;
    return r->request_rc;
}

static void rec_reset(void *ctx)
{
    ((struct rec *)ctx)->resets++;
}

static void rec_note(void *ctx, const struct kvi_stream_note *n)
{
    struct rec *r = ctx;
    assert_true(r->n_notes < MAXREC);
    r->notes[r->n_notes++] = *n;
}

static const struct kvi_stream_ops ops = {rec_apply, rec_clear, rec_request, rec_reset, rec_note};

struct fx {
    struct kvi_stream st;
    struct kvi_stream_ctr ctr;
    struct rec r;
    uint64_t now;
};

static void fx_init(struct fx *f, bool replay, enum kvi_gap_policy pol, uint32_t max_buffered)
{
    memset(f, 0, sizeof *f);
    f->r.bad_seq = UINT64_MAX;
    f->now = 1000 * SEC;
    struct kvi_stream_cfg cfg = {.can_replay = replay, .policy = pol, .max_retries = 2,
                                 .max_buffered = max_buffered ? max_buffered : 1000, .timeout_ns = 5 * SEC};
    kvi_stream_init(&f->st, &cfg, &ops, &f->r, &f->ctr);
}

static void msg_of(zmq_msg_t *m, uint64_t seq, char tag)
{
    assert_int_equal(zmq_msg_init_size(m, 9), 0);
    memcpy(zmq_msg_data(m), &seq, 8);
    ((char *)zmq_msg_data(m))[8] = tag;
}

static void live(struct fx *f, uint64_t seq)
{
    zmq_msg_t m;
    msg_of(&m, seq, 'L');
    kvi_stream_live(&f->st, seq, &m, f->now);
    zmq_msg_close(&m);
}

static void reply(struct fx *f, uint64_t seq)
{
    zmq_msg_t m;
    msg_of(&m, seq, 'R');
    kvi_stream_reply(&f->st, seq, &m, f->now);
    zmq_msg_close(&m);
}

static uint64_t C(struct fx *f, _Atomic uint64_t *c)
{
    (void)f;
    return atomic_load(c);
}

/* The applied seqs are exactly from..to, in order, once each. */
static void assert_applied_range(struct fx *f, uint64_t from, uint64_t to)
{
    assert_int_equal(f->r.n_applied, to - from + 1);
    for (size_t i = 0; i < f->r.n_applied; i++)
        assert_int_equal(f->r.applied[i], from + i);
}

static void test_contiguous_and_stale(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    for (uint64_t s = 0; s < 5; s++)
        live(&f, s);
    assert_applied_range(&f, 0, 4);
    assert_int_equal(C(&f, &f.ctr.batches), 5);
    assert_int_equal(f.r.n_requests, 0);
    assert_false(kvi_stream_replaying(&f.st));
    kvi_stream_sentinel(&f.st, f.now); /* stray sentinel: ignored */
    reply(&f, 3);                      /* stray reply: counted, ignored */
    assert_int_equal(C(&f, &f.ctr.replay_dups), 1);
    assert_int_equal(f.r.n_applied, 5);
    kvi_stream_fini(&f.st);
}

/* Replies overtake a hole; the re-request fills it; every batch is applied once, in order. */
static void test_hole_then_rerequest(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    live(&f, 0);
    live(&f, 4); /* gap: replay from 1 */
    assert_true(kvi_stream_replaying(&f.st));
    assert_int_equal(f.r.n_requests, 1);
    assert_int_equal(f.r.requests[0], 1);
    live(&f, 5); /* buffered */
    assert_int_equal(f.r.n_applied, 1);
    reply(&f, 1);
    reply(&f, 3); /* 2 went missing */
    reply(&f, 4); /* buffered already (live): duplicate */
    reply(&f, 5);
    assert_int_equal(C(&f, &f.ctr.replay_holes), 1);
    kvi_stream_sentinel(&f.st, f.now);
    assert_int_equal(f.r.n_requests, 2);
    assert_int_equal(f.r.requests[1], 2); /* from the first missing seq */
    assert_int_equal(C(&f, &f.ctr.replay_retries), 1);
    reply(&f, 2);
    reply(&f, 3);
    reply(&f, 4);
    reply(&f, 5);
    kvi_stream_sentinel(&f.st, f.now);
    assert_false(kvi_stream_replaying(&f.st));
    assert_applied_range(&f, 0, 5);
    assert_int_equal(f.r.copy[3], 'R'); /* 3 came from the first pass, buffered */
    assert_int_equal(f.r.copy[4], 'L'); /* 4 and 5: the live copies, buffered first */
    assert_int_equal(f.r.copy[5], 'L');
    assert_int_equal(C(&f, &f.ctr.replayed), 3);
    assert_int_equal(C(&f, &f.ctr.lost), 0);
    assert_int_equal(kvi_stream_buffered(&f.st), 0);
    live(&f, 6);
    assert_applied_range(&f, 0, 6);
    kvi_stream_fini(&f.st);
}

/*
 * Each pass fills one hole but the first reply of every request is there
 * (so no overrun): after the last retry the loss is accepted and the buffer
 * applied in order.
 */
static void test_retries_exhausted(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    live(&f, 0);
    live(&f, 10); /* replay from 1 */
    static const uint64_t pass1[] = {1, 3, 4, 6, 7, 9, 10};  /* 2, 5, 8 missing */
    static const uint64_t pass2[] = {2, 3, 4, 6, 7, 9, 10};  /* 5, 8 missing */
    static const uint64_t pass3[] = {5, 6, 7, 9, 10};        /* 8 missing */
    for (size_t i = 0; i < sizeof pass1 / sizeof *pass1; i++)
        reply(&f, pass1[i]);
    kvi_stream_sentinel(&f.st, f.now);
    for (size_t i = 0; i < sizeof pass2 / sizeof *pass2; i++)
        reply(&f, pass2[i]);
    kvi_stream_sentinel(&f.st, f.now);
    for (size_t i = 0; i < sizeof pass3 / sizeof *pass3; i++)
        reply(&f, pass3[i]);
    kvi_stream_sentinel(&f.st, f.now);
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(f.r.n_requests, 3); /* the first request and 2 retries */
    assert_int_equal(f.r.requests[1], 2);
    assert_int_equal(f.r.requests[2], 5);
    assert_int_equal(C(&f, &f.ctr.replay_fallbacks), 1);
    assert_int_equal(C(&f, &f.ctr.replay_overruns), 0);
    assert_int_equal(C(&f, &f.ctr.lost), 1);
    static const uint64_t want[] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10};
    assert_int_equal(f.r.n_applied, sizeof want / sizeof *want);
    for (size_t i = 0; i < f.r.n_applied; i++)
        assert_int_equal(f.r.applied[i], want[i]);
    assert_int_equal(f.r.resets, 0); /* nothing outstanding after a sentinel */
    assert_int_equal(f.r.clears, 0);
    kvi_stream_fini(&f.st);
}

/* The engine's buffer starts after the requested seq: lost for good; the clear policy clears. */
static void test_overrun(void **state)
{
    (void)state;
    for (int pol = KVI_GAP_APPLY; pol <= KVI_GAP_CLEAR; pol++) {
        struct fx f;
        fx_init(&f, true, (enum kvi_gap_policy)pol, 0);
        live(&f, 0);
        live(&f, 20); /* replay from 1 */
        reply(&f, 15);
        for (uint64_t s = 16; s <= 20; s++)
            reply(&f, s);
        kvi_stream_sentinel(&f.st, f.now);
        assert_false(kvi_stream_replaying(&f.st));
        assert_int_equal(C(&f, &f.ctr.replay_overruns), 1);
        assert_int_equal(C(&f, &f.ctr.lost), 14);
        assert_int_equal(f.r.clears, pol == KVI_GAP_CLEAR ? 1 : 0);
        assert_int_equal(f.r.n_applied, 7); /* 0, 15..20 */
        assert_int_equal(f.r.applied[1], 15);
        assert_int_equal(f.r.applied[6], 20);
        kvi_stream_fini(&f.st);
    }
}

/* No progress before the deadline: the DEALER is discarded and the buffer applied. */
static void test_timeout(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    live(&f, 0);
    live(&f, 5);
    live(&f, 6);
    f.now += 4 * SEC;
    reply(&f, 1); /* progress moves the deadline */
    f.now += 4 * SEC;
    assert_false(kvi_stream_tick(&f.st, f.now));
    f.now += 2 * SEC;
    assert_true(kvi_stream_tick(&f.st, f.now));
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(f.r.resets, 1);
    assert_int_equal(C(&f, &f.ctr.replay_timeouts), 1);
    assert_int_equal(C(&f, &f.ctr.lost), 3); /* 2..4 */
    assert_int_equal(f.r.n_applied, 4);      /* 0, 1, 5, 6 */
    assert_int_equal(f.r.applied[2], 5);
    reply(&f, 2); /* a late reply after the give-up is ignored */
    assert_int_equal(f.r.n_applied, 4);
    kvi_stream_fini(&f.st);
}

/* A live seq <= L during a replay: restart. Replay and buffer dropped, rank cleared, fresh stream. */
static void test_restart_during_replay(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    for (uint64_t s = 0; s < 3; s++)
        live(&f, s);
    live(&f, 9);  /* replay from 3 */
    live(&f, 10); /* buffered */
    live(&f, 0);  /* the engine restarted */
    assert_int_equal(C(&f, &f.ctr.restarts), 1);
    assert_int_equal(f.r.clears, 1);
    assert_int_equal(f.r.resets, 1);
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(kvi_stream_buffered(&f.st), 0);
    assert_int_equal(f.r.n_applied, 4); /* 0, 1, 2, then the new 0 */
    assert_int_equal(f.r.applied[3], 0);
    assert_int_equal(f.st.wm.w, 0);
    live(&f, 1);
    assert_int_equal(f.r.n_applied, 5);
    kvi_stream_fini(&f.st);
}

/* Decode failures: a live one leaves W (the gap replays it); the replayed copy is skipped. */
static void test_undecodable(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    f.r.bad_seq = 2;
    live(&f, 0);
    live(&f, 1);
    live(&f, 2); /* fails */
    assert_int_equal(C(&f, &f.ctr.decode_errors), 1);
    assert_int_equal(f.st.wm.w, 1);
    live(&f, 3); /* gap: replay from 2 */
    assert_int_equal(f.r.requests[0], 2);
    reply(&f, 2); /* fails again: skipped, W moves */
    assert_int_equal(C(&f, &f.ctr.replay_undecodable), 1);
    reply(&f, 3);
    kvi_stream_sentinel(&f.st, f.now);
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(f.st.wm.w, 3);
    assert_int_equal(f.r.n_applied, 3); /* 0, 1, 3 */
    assert_int_equal(C(&f, &f.ctr.lost), 0);
    kvi_stream_fini(&f.st);
}

/* Too many buffered batches: give up at once. A failed request gives up too. */
static void test_overflow_and_request_failure(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 3);
    live(&f, 0);
    live(&f, 2); /* replay from 1, buffer {2} */
    live(&f, 3);
    live(&f, 4);
    assert_true(kvi_stream_replaying(&f.st));
    live(&f, 5); /* 4 buffered > 3 */
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(C(&f, &f.ctr.buffer_overflows), 1);
    assert_int_equal(f.r.resets, 1);
    assert_int_equal(C(&f, &f.ctr.lost), 1);
    assert_int_equal(f.r.n_applied, 5); /* 0, 2..5 */
    kvi_stream_fini(&f.st);

    fx_init(&f, true, KVI_GAP_CLEAR, 0);
    f.r.request_rc = -EAGAIN;
    live(&f, 0);
    live(&f, 3);
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(C(&f, &f.ctr.replay_fallbacks), 1);
    assert_int_equal(f.r.clears, 1); /* clear policy */
    assert_int_equal(C(&f, &f.ctr.lost), 2);
    assert_int_equal(f.r.n_applied, 2);
    kvi_stream_fini(&f.st);
}

/* Without a replay endpoint: loss counted and applied, or cleared under the clear policy. */
static void test_no_replay(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, false, KVI_GAP_CLEAR, 0);
    live(&f, 4); /* joined mid-stream: counted, never cleared */
    assert_int_equal(f.r.clears, 0);
    assert_int_equal(C(&f, &f.ctr.lost), 4);
    live(&f, 5);
    live(&f, 9);
    assert_int_equal(f.r.clears, 1);
    assert_int_equal(C(&f, &f.ctr.gap_clears), 1);
    assert_int_equal(C(&f, &f.ctr.gaps), 2);
    assert_int_equal(C(&f, &f.ctr.lost), 7);
    assert_int_equal(f.r.n_applied, 3);
    assert_int_equal(f.r.n_requests, 0);
    kvi_stream_fini(&f.st);
}

/* Replies arriving far out of order (a second pass interleaving with buffered ones). */
/* The notes a stream gives its owner's log: one per event, with the figures the log line needs. */
static void assert_note(const struct kvi_stream_note *n, enum kvi_stream_note_type type, uint64_t expected,
                        uint64_t seq)
{
    assert_int_equal(n->type, type);
    assert_int_equal(n->expected, expected);
    assert_int_equal(n->seq, seq);
}

static void test_notes(void **state)
{
    (void)state;
    struct fx f;
    /* gap -> request -> replies -> sentinel: GAP, REQUEST, REPLAY_DONE with the batches and the time */
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    live(&f, 0);
    assert_int_equal(f.r.n_notes, 0); /* nothing to say about a contiguous stream */
    live(&f, 4);
    assert_int_equal(f.r.n_notes, 2);
    assert_note(&f.r.notes[0], KVI_NOTE_GAP, 1, 4);
    assert_note(&f.r.notes[1], KVI_NOTE_REQUEST, 1, 0);
    assert_int_equal(f.r.notes[1].retry, 0);
    f.now += 3000000; /* 3 ms */
    reply(&f, 1);
    reply(&f, 3); /* 2 missing: a retry */
    kvi_stream_sentinel(&f.st, f.now);
    assert_int_equal(f.r.n_notes, 3);
    assert_note(&f.r.notes[2], KVI_NOTE_REQUEST, 2, 0);
    assert_int_equal(f.r.notes[2].retry, 1);
    f.now += 2000000;
    reply(&f, 2);
    reply(&f, 3);
    kvi_stream_sentinel(&f.st, f.now);
    assert_int_equal(f.r.n_notes, 4);
    assert_note(&f.r.notes[3], KVI_NOTE_REPLAY_DONE, 1, 0);
    assert_int_equal(f.r.notes[3].batches, 3); /* 1, 2, 3; 4 was live */
    assert_int_equal(f.r.notes[3].ns, 5000000);
    /* a silent engine: GIVEN_UP after the timeout, with the loss */
    live(&f, 8);
    assert_note(&f.r.notes[4], KVI_NOTE_GAP, 5, 8);
    f.now += 6 * SEC;
    assert_true(kvi_stream_tick(&f.st, f.now));
    assert_int_equal(f.r.n_notes, 7);
    assert_int_equal(f.r.notes[6].type, KVI_NOTE_GIVEN_UP);
    assert_int_equal(f.r.notes[6].expected, 5);
    assert_int_equal(f.r.notes[6].lost, 3);
    assert_int_equal(f.r.notes[6].batches, 0);
    assert_int_equal(f.r.notes[6].ns, 6 * SEC);
    assert_string_equal(f.r.notes[6].why, "timed out without progress");
    /* a restart: the last live seq and the new one */
    live(&f, 2);
    assert_note(&f.r.notes[7], KVI_NOTE_RESTART, 8, 2);
    assert_false(f.r.notes[7].in_replay);
    kvi_stream_fini(&f.st);

    /* an overrun, then no replay at all: OVERRUN and LOSS with the batches lost */
    fx_init(&f, true, KVI_GAP_CLEAR, 0);
    live(&f, 0);
    live(&f, 5);
    reply(&f, 3); /* the engine's buffer starts at 3 */
    assert_note(&f.r.notes[2], KVI_NOTE_OVERRUN, 1, 3);
    assert_int_equal(f.r.notes[2].lost, 2);
    assert_true(f.r.notes[2].cleared);
    kvi_stream_fini(&f.st);
    fx_init(&f, false, KVI_GAP_CLEAR, 0);
    live(&f, 0);
    live(&f, 3);
    assert_int_equal(f.r.n_notes, 1);
    assert_note(&f.r.notes[0], KVI_NOTE_LOSS, 1, 3);
    assert_int_equal(f.r.notes[0].lost, 2);
    assert_true(f.r.notes[0].cleared);
    kvi_stream_fini(&f.st);
}

static void test_out_of_order_inserts(void **state)
{
    (void)state;
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    live(&f, 0);
    live(&f, 40); /* replay from 1 */
    reply(&f, 1);
    for (uint64_t s = 39; s >= 3; s--) /* newest first: every insert lands before the others */
        reply(&f, s);
    reply(&f, 20); /* duplicate of a buffered one */
    assert_int_equal(f.r.n_applied, 2);
    assert_int_equal(kvi_stream_buffered(&f.st), 38);
    reply(&f, 2);
    assert_applied_range(&f, 0, 40);
    kvi_stream_sentinel(&f.st, f.now);
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(kvi_stream_buffered(&f.st), 0);
    kvi_stream_fini(&f.st);
}

/*
 * A forged seq 2^63 past L (issue 18 item 10): dropped and counted; W, L,
 * gaps and lost unchanged, also during a replay (neither buffered nor a
 * gap); the next real seq goes on with no restart. A replay reply that far
 * ahead is ignored as malformed (no hole of that width is counted).
 */
static void test_implausible_jump(void **state)
{
    (void)state;
    uint64_t far = UINT64_C(1) << 63;
    for (int replay = 0; replay <= 1; replay++) {
        struct fx f;
        fx_init(&f, replay, KVI_GAP_APPLY, 0);
        for (uint64_t s = 0; s < 5; s++)
            live(&f, s);
        live(&f, 4 + far);
        assert_int_equal(C(&f, &f.ctr.implausible_seq), 1);
        assert_int_equal(f.st.wm.l, 4);
        assert_int_equal(f.st.wm.w, 4);
        assert_int_equal(f.r.n_notes, 1);
        assert_int_equal(f.r.notes[0].type, KVI_NOTE_IMPLAUSIBLE);
        assert_int_equal(f.r.notes[0].expected, 4);
        for (uint64_t s = 5; s < 8; s++)
            live(&f, s);
        assert_applied_range(&f, 0, 7);
        assert_int_equal(C(&f, &f.ctr.lost), 0);
        assert_int_equal(C(&f, &f.ctr.gaps), 0);
        assert_int_equal(C(&f, &f.ctr.restarts), 0);
        assert_int_equal(f.r.clears, 0);
        assert_int_equal(f.r.n_requests, 0);
        kvi_stream_fini(&f.st);
    }

    /* during a replay: not buffered, the replay finishes as if it never came */
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    live(&f, 0);
    live(&f, 3); /* gap: replay from 1 */
    assert_true(kvi_stream_replaying(&f.st));
    live(&f, 3 + far);
    assert_int_equal(C(&f, &f.ctr.implausible_seq), 1);
    assert_int_equal(kvi_stream_buffered(&f.st), 1);
    reply(&f, 1 + far); /* a reply that far ahead: ignored */
    assert_int_equal(C(&f, &f.ctr.replay_malformed), 1);
    assert_int_equal(C(&f, &f.ctr.replay_holes), 0);
    reply(&f, 1);
    reply(&f, 2);
    kvi_stream_sentinel(&f.st, f.now);
    assert_false(kvi_stream_replaying(&f.st));
    live(&f, 4);
    assert_applied_range(&f, 0, 4);
    assert_int_equal(C(&f, &f.ctr.lost), 0);
    assert_int_equal(C(&f, &f.ctr.restarts), 0);
    assert_int_equal(f.r.clears, 0);
    kvi_stream_fini(&f.st);
}

/*
 * KVI_WM_RESYNC_RUN implausible seqs in a row, each the previous + 1: a
 * publisher whose counter really moved on. The last one is a restart
 * (rank cleared, any replay dropped) and is applied as the first batch of a
 * fresh stream, with no loss counted for the distance; the stream follows.
 */
static void test_implausible_run_resyncs(void **state)
{
    (void)state;
    uint64_t base = (UINT64_C(1) << 40);
    struct fx f;
    fx_init(&f, true, KVI_GAP_APPLY, 0);
    live(&f, 0);
    live(&f, 2); /* a replay runs */
    assert_true(kvi_stream_replaying(&f.st));
    for (uint64_t k = 0; k < KVI_WM_RESYNC_RUN; k++)
        live(&f, base + k);
    assert_int_equal(C(&f, &f.ctr.implausible_seq), KVI_WM_RESYNC_RUN - 1);
    assert_int_equal(C(&f, &f.ctr.restarts), 1);
    assert_int_equal(f.r.clears, 1);
    assert_int_equal(f.r.resets, 1);
    assert_false(kvi_stream_replaying(&f.st));
    assert_int_equal(f.st.wm.w, base + KVI_WM_RESYNC_RUN - 1);
    live(&f, base + KVI_WM_RESYNC_RUN);
    assert_int_equal(f.r.n_applied, 3);
    assert_int_equal(f.r.applied[0], 0);
    assert_int_equal(f.r.applied[1], base + KVI_WM_RESYNC_RUN - 1);
    assert_int_equal(f.r.applied[2], base + KVI_WM_RESYNC_RUN);
    assert_int_equal(C(&f, &f.ctr.lost), 0);
    assert_int_equal(f.r.notes[f.r.n_notes - 1].type, KVI_NOTE_RESYNC);

    /* a run broken by a real seq starts over: no resync */
    struct fx g;
    fx_init(&g, false, KVI_GAP_APPLY, 0);
    live(&g, 0);
    live(&g, base);
    live(&g, base + 1);
    live(&g, 1);
    live(&g, base + 2);
    live(&g, base + 3);
    assert_int_equal(C(&g, &g.ctr.implausible_seq), 4);
    assert_int_equal(C(&g, &g.ctr.restarts), 0);
    assert_applied_range(&g, 0, 1);
    kvi_stream_fini(&f.st);
    kvi_stream_fini(&g.st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous_and_stale),
        cmocka_unit_test(test_hole_then_rerequest),
        cmocka_unit_test(test_retries_exhausted),
        cmocka_unit_test(test_overrun),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_restart_during_replay),
        cmocka_unit_test(test_implausible_jump),
        cmocka_unit_test(test_implausible_run_resyncs),
        cmocka_unit_test(test_undecodable),
        cmocka_unit_test(test_overflow_and_request_failure),
        cmocka_unit_test(test_no_replay),
        cmocka_unit_test(test_out_of_order_inserts),
        cmocka_unit_test(test_notes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
