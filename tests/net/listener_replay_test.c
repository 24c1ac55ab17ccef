/* ctest-labels: integration tsan */
/*
 * Listeners end to end, gap and replay paths (wire-protocol.md §6, §7):
 * real publishers (net/include/kvidx/publisher.h) over loopback TCP ->
 * listener pool -> writer pool -> index, checked with kvi_index_find_matches
 * and the listener's counters. Faults come from the publisher's fault
 * injection: skip_live (lost live batches), replay drop / delay / silence,
 * a small replay ring (buffer overrun), and destroy + create on the same
 * endpoints (engine restart). Waits are bounded polls (listener_fixture.h).
 * The log lines of gaps and replays are captured with kvi_log_set_sink and
 * checked whole: timestamp, level and text.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <regex.h>
#include <stdbool.h>

#include "net/log.h"
#include "tests/net/listener_fixture.h"

/*
 * A gap on the live stream is filled by replay, with either reply layout
 * (["", topic, seq, payload] and the legacy ["", seq, payload]); the live
 * batch that revealed the gap is not applied twice.
 */
static void gap_filled_by_replay(enum kvidx_pub_replay_layout layout)
{
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = "tcp://127.0.0.1:*";
    pc.replay_endpoint = "tcp://127.0.0.1:*";
    pc.topic = "kv@e1@m";
    pc.replay_layout = layout;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    lfx_register(&f, 1, p, true, KVI_GAP_APPLY);
    lfx_sync(&f, p, 1);

    pub_chain(p, 0, 0, 5);        /* seqs 0..4 */
    kvidx_pub_skip_live(p, 3);
    pub_chain(p, 0, 5, 8);        /* seqs 5..7: lost live, in the replay ring */
    uint64_t last = pub_chain(p, 0, 8, 9); /* seq 8 reveals the gap */
    assert_int_equal(last, 8);
    lfx_settle(&f, 1, 8);
    pub_chain(p, 0, 9, 10);       /* seq 9: contiguous again */
    lfx_settle(&f, 1, 9);

    assert_int_equal(lfx_depth(&f, 1, 0, 10), 10);
    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.gaps, 1);
    assert_int_equal(in.ctr.replays, 1);
    assert_int_equal(in.ctr.replayed, 3); /* 5, 6, 7; 8 arrived live first and waited for them */
    assert_int_equal(in.ctr.stale + in.ctr.replay_dups, 1); /* the replayed copy of 8 */
    assert_int_equal(in.ctr.lost, 0);
    assert_int_equal(in.ctr.batches, 10);
    assert_int_equal(in.ctr.ops_parent_not_found, 0);
    assert_int_equal(in.ctr.events_stored, 10);
    assert_int_equal(in.ctr.blocks_stored, 10);
    assert_true(in.last_live_set);
    assert_int_equal(in.last_live, 9);
    assert_int_equal(in.state, KVI_LISTENER_ACTIVE);
    assert_int_equal(in.ctr.replay_malformed, 0);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

static void test_gap_filled_by_replay(void **state)
{
    (void)state;
    gap_filled_by_replay(KVIDX_PUB_REPLAY_TOPIC);
}

static void test_gap_filled_by_legacy_replay(void **state)
{
    (void)state;
    gap_filled_by_replay(KVIDX_PUB_REPLAY_LEGACY);
}

/* No replay endpoint: the gap is counted and the batch after it applied; the clear policy clears the rank. */
static void test_gap_without_replay(void **state)
{
    (void)state;
    for (int pol = KVI_GAP_APPLY; pol <= KVI_GAP_CLEAR; pol++) {
        struct lfx f;
        lfx_init(&f, NULL);
        struct kvidx_pub *p = lfx_pub(NULL, false, NULL);
        lfx_register(&f, 1, p, false, (enum kvi_gap_policy)pol);
        lfx_sync(&f, p, 1);

        pub_chain(p, 0, 0, 4); /* seqs 0..3 */
        kvidx_pub_skip_live(p, 2);
        pub_chain(p, 0, 4, 6); /* seqs 4, 5 lost */
        pub_chain(p, 0, 6, 7); /* seq 6: its parent was lost */
        uint64_t last = pub_chain(p, 1, 0, 3); /* seqs 7..9: a new chain */
        lfx_settle(&f, 1, last);

        struct kvi_listener_info in = lfx_info(&f, 1);
        assert_int_equal(in.ctr.gaps, 1);
        assert_int_equal(in.ctr.lost, 2);
        assert_int_equal(in.ctr.replays, 0);
        assert_int_equal(lfx_depth(&f, 1, 1, 3), 3);
        if (pol == KVI_GAP_APPLY) {
            assert_int_equal(lfx_depth(&f, 1, 0, 7), 4);
            assert_int_equal(in.ctr.ops_parent_not_found, 1); /* block 6 */
            assert_int_equal(in.ctr.gap_clears, 0);
        } else {
            assert_int_equal(lfx_depth(&f, 1, 0, 7), 0); /* cleared, and block 6 has no parent */
            assert_int_equal(in.ctr.gap_clears, 1);
        }
        kvidx_pub_destroy(p);
        lfx_fini(&f);
    }
}

/* Replay replies dropped by the engine (§7.4): the contiguity check re-requests from the hole. */
static void test_lost_replay_replies(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub *p = lfx_replay_pub(&f, 1);

    struct kvidx_pub_replay_faults fl = {.drop_every = 4};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &fl), 0);
    pub_chain(p, 0, 0, 2);
    kvidx_pub_skip_live(p, 30);
    pub_chain(p, 0, 2, 32);
    uint64_t last = pub_chain(p, 0, 32, 33); /* 32 reveals the gap */
    lfx_settle(&f, 1, last);

    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(lfx_depth(&f, 1, 0, 33), 33);
    assert_int_equal(in.ctr.lost, 0);
    assert_true(in.ctr.replay_holes > 0);
    assert_true(in.ctr.replay_retries >= 1);
    assert_int_equal(in.ctr.replay_fallbacks, 0);
    assert_int_equal(in.ctr.replayed, 30);
    struct kvidx_pub_stats ps;
    kvidx_pub_get_stats(p, &ps);
    assert_true(ps.replay_dropped > 0);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* A silent replay endpoint times out (loss accepted); once it answers again, later gaps are replayed. */
static void test_replay_timeout_then_recovery(void **state)
{
    (void)state;
    struct kvi_listeners_config cfg = {.replay_timeout_ms = 300};
    struct lfx f;
    lfx_init(&f, &cfg);
    struct kvidx_pub *p = lfx_replay_pub(&f, 1);

    struct kvidx_pub_replay_faults silent = {.silent = true};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &silent), 0);
    pub_chain(p, 0, 0, 3);            /* 0..2 */
    kvidx_pub_skip_live(p, 2);
    pub_chain(p, 0, 3, 5);            /* 3, 4 lost */
    uint64_t last = pub_chain(p, 1, 0, 2); /* 5, 6 live (new chain) */
    lfx_settle(&f, 1, last);
    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.replay_timeouts, 1);
    assert_int_equal(in.ctr.replay_fallbacks, 1);
    assert_int_equal(in.ctr.replayed, 0);
    assert_int_equal(in.ctr.lost, 2);
    assert_int_equal(lfx_depth(&f, 1, 0, 5), 3);
    assert_int_equal(lfx_depth(&f, 1, 1, 2), 2);
    assert_int_equal(in.state, KVI_LISTENER_ACTIVE);

    struct kvidx_pub_replay_faults none = {0};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &none), 0);
    kvidx_pub_skip_live(p, 3);
    pub_chain(p, 1, 2, 5);            /* 7..9 lost live */
    last = pub_chain(p, 1, 5, 6);     /* 10 */
    lfx_settle(&f, 1, last);
    in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.replays, 2);
    assert_int_equal(in.ctr.replay_timeouts, 1);
    assert_int_equal(in.ctr.replayed, 3);
    assert_int_equal(in.ctr.lost, 2);
    assert_int_equal(lfx_depth(&f, 1, 1, 6), 6);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/*
 * A live Removed published while the replay runs must win over the replayed
 * Stored of the same block: live batches are buffered during the replay and
 * applied in seq order afterwards.
 */
static void test_live_during_replay(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub *p = lfx_replay_pub(&f, 1);

    pub_chain(p, 0, 0, 2);             /* 0, 1: chain 0 blocks 0, 1 */
    kvidx_pub_skip_live(p, 1);
    pub_chain(p, 2, 0, 1);             /* 2: chain 2 block 0 (X), lost live */
    struct kvidx_pub_replay_faults slow = {.delay_ms = 400};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &slow), 0);
    pub_chain(p, 0, 2, 3);             /* 3: reveals the gap; the replay waits 400 ms */
    assert_true(WAIT_FOR(lfx_info(&f, 1).replaying, WAIT_MS));
    pub_remove(p, 2, 0, 1);            /* 4: Removed X, live while the replay runs */
    uint64_t last = pub_flush(p);
    assert_true(WAIT_FOR(lfx_info(&f, 1).ctr.live_buffered >= 1, WAIT_MS));
    lfx_settle(&f, 1, last);

    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_true(in.ctr.live_buffered >= 1);
    assert_int_equal(in.ctr.lost, 0);
    assert_int_equal(lfx_depth(&f, 1, 2, 1), 0); /* X stays removed */
    assert_int_equal(lfx_depth(&f, 1, 0, 3), 3);
    assert_int_equal(in.ctr.hashes_removed, 1);

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* The replay ring no longer holds the start of the gap: counted as an overrun, the rest applied. */
static void test_replay_overrun(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = "tcp://127.0.0.1:*";
    pc.replay_endpoint = "tcp://127.0.0.1:*";
    pc.buffer_batches = 4;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    lfx_register(&f, 1, p, true, KVI_GAP_APPLY);
    lfx_sync(&f, p, 1);

    pub_chain(p, 0, 0, 2);             /* 0, 1 */
    kvidx_pub_skip_live(p, 10);
    pub_chain(p, 1, 0, 10);            /* 2..11: chain 1 blocks 0..9, lost live */
    uint64_t last = pub_chain(p, 1, 10, 11); /* 12: block 10; the ring now holds 9..12 */
    lfx_settle(&f, 1, last);

    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.replay_overruns, 1);
    assert_int_equal(in.ctr.lost, 7);  /* 2..8 */
    assert_int_equal(in.ctr.replayed, 3); /* 9..11; 12 came live */
    assert_int_equal(lfx_depth(&f, 1, 0, 2), 2);
    assert_int_equal(lfx_depth(&f, 1, 1, 11), 0); /* chain 1 lost its first blocks: no prefix */
    assert_int_equal(in.ctr.ops_parent_not_found, 4); /* blocks 7..10: parents lost */

    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* Engine restart: destroy + create on the same endpoints; seq back to 0 clears that rank's blocks. */
static void test_engine_restart(void **state)
{
    (void)state;
    struct lfx f;
    lfx_init(&f, NULL);
    struct kvidx_pub *p = lfx_pub(NULL, true, NULL);
    char ep[128], rep[128];
    snprintf(ep, sizeof ep, "%s", kvidx_pub_endpoint(p));
    snprintf(rep, sizeof rep, "%s", kvidx_pub_replay_endpoint(p));
    lfx_register(&f, 1, p, true, KVI_GAP_APPLY);
    /* a second instance on another publisher must keep its blocks */
    struct kvidx_pub *q = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 2, q, false, KVI_GAP_APPLY);
    lfx_sync(&f, p, 1);
    lfx_sync(&f, q, 2);

    uint64_t last = pub_chain(p, 0, 0, 8); /* 0..7 */
    lfx_settle(&f, 1, last);
    pub_chain(q, 0, 0, 3);
    lfx_settle(&f, 2, 2);
    assert_int_equal(lfx_depth(&f, 1, 0, 8), 8);

    kvidx_pub_destroy(p);
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    pc.replay_endpoint = rep;
    pc.socket_mode = KVIDX_PUB_SOCKET_BIND; /* the resolved endpoint has no '*' (vLLM's rule would connect) */
    p = kvidx_pub_create(&pc);
    assert_non_null(p);
    lfx_sync(&f, p, 1);
    last = pub_chain(p, 1, 0, 3); /* seqs 0..2 of the new process */
    assert_int_equal(last, 2);
    lfx_settle(&f, 1, 2);

    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.restarts, 1);
    assert_int_equal(lfx_depth(&f, 1, 0, 8), 0); /* the dead engine's blocks are gone */
    assert_int_equal(lfx_depth(&f, 1, 1, 3), 3);
    assert_int_equal(lfx_depth(&f, 2, 0, 3), 3); /* untouched */
    assert_int_equal(in.ctr.lost, 0);

    kvidx_pub_destroy(p);
    kvidx_pub_destroy(q);
    lfx_fini(&f);
}

/* The engine restarts while a replay is running: the replay is dropped and the rank cleared. */
static void test_restart_during_replay(void **state)
{
    (void)state;
    struct kvi_listeners_config cfg = {.replay_timeout_ms = 20000};
    struct lfx f;
    lfx_init(&f, &cfg);
    struct kvidx_pub *p = lfx_pub(NULL, true, NULL);
    char ep[128], rep[128];
    snprintf(ep, sizeof ep, "%s", kvidx_pub_endpoint(p));
    snprintf(rep, sizeof rep, "%s", kvidx_pub_replay_endpoint(p));
    lfx_register(&f, 1, p, true, KVI_GAP_APPLY);
    lfx_sync(&f, p, 1);

    pub_chain(p, 0, 0, 3);                 /* 0..2 */
    kvidx_pub_skip_live(p, 2);
    pub_chain(p, 0, 3, 5);                 /* 3, 4 lost */
    struct kvidx_pub_replay_faults silent = {.silent = true};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &silent), 0);
    pub_chain(p, 0, 5, 6);                 /* 5: replay from 3, never answered */
    assert_true(WAIT_FOR(lfx_info(&f, 1).replaying, WAIT_MS));
    /* Let the old engine take the request first: a request still queued in the DEALER would be
     * delivered to the new process after the reconnect (the test would then race its answer). */
    struct kvidx_pub_stats ps;
    assert_true(WAIT_FOR((kvidx_pub_get_stats(p, &ps), ps.replay_silenced == 1), WAIT_MS));
    kvidx_pub_destroy(p);                  /* the engine dies without answering */

    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    pc.replay_endpoint = rep;
    pc.socket_mode = KVIDX_PUB_SOCKET_BIND;
    p = kvidx_pub_create(&pc);
    assert_non_null(p);
    lfx_sync(&f, p, 1);
    assert_true(lfx_info(&f, 1).replaying); /* still waiting for the dead engine's replay */
    uint64_t last = pub_chain(p, 1, 0, 2); /* the new process: seqs 0, 1 */
    lfx_settle(&f, 1, last);

    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.restarts, 1);
    assert_int_equal(in.ctr.replay_timeouts, 0);
    assert_int_equal(in.ctr.replayed, 0);
    assert_int_equal(lfx_depth(&f, 1, 0, 6), 0); /* the dead engine's blocks are gone */
    assert_int_equal(lfx_depth(&f, 1, 1, 2), 2);
    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* Too many live batches buffered while a replay waits: it is given up and the buffer applied. */
static void test_buffer_overflow_gives_up(void **state)
{
    (void)state;
    struct kvi_listeners_config cfg = {.max_buffered = 3};
    struct lfx f;
    lfx_init(&f, &cfg);
    struct kvidx_pub *p = lfx_replay_pub(&f, 1);

    pub_chain(p, 0, 0, 1);                  /* 0 */
    kvidx_pub_skip_live(p, 1);
    pub_chain(p, 1, 0, 1);                  /* 1: lost */
    struct kvidx_pub_replay_faults slow = {.delay_ms = 2000};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &slow), 0);
    pub_chain(p, 0, 1, 2);                  /* 2: replay from 1, answered 2 s later */
    assert_true(WAIT_FOR(lfx_info(&f, 1).replaying, WAIT_MS));
    uint64_t last = pub_chain(p, 0, 2, 6);  /* 3..6: the 4th buffered batch overflows */
    lfx_settle(&f, 1, last);

    struct kvi_listener_info in = lfx_info(&f, 1);
    assert_int_equal(in.ctr.buffer_overflows, 1);
    assert_int_equal(in.ctr.replay_fallbacks, 1);
    assert_int_equal(in.ctr.lost, 1);
    assert_int_equal(in.ctr.replayed, 0);
    assert_int_equal(lfx_depth(&f, 1, 0, 6), 6);
    assert_int_equal(lfx_depth(&f, 1, 1, 1), 0);
    kvidx_pub_destroy(p);
    lfx_fini(&f);
}

/* ---- log lines ------------------------------------------------------------------- */

/*
 * What kvi_log printed, line by line. The sink runs on listener threads, so
 * it checks nothing itself: a line it could not keep is recorded (lost) and
 * the main thread asserts on that (captured, and after the sink is removed).
 */
struct capture {
    pthread_mutex_t mu;
    char *text;
    size_t len, cap;
    bool lost; /* realloc failed for some line */
};

static void capture_sink(void *ctx, enum kvi_log_level level, const char *line, size_t len)
{
    (void)level;
    struct capture *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (c->len + len + 1 > c->cap) {
        size_t cap = (c->len + len + 1) * 2;
        char *t = realloc(c->text, cap);
        if (t == NULL) {
            c->lost = true;
            pthread_mutex_unlock(&c->mu);
            return;
        }
        c->text = t;
        c->cap = cap;
    }
    memcpy(c->text + c->len, line, len);
    c->len += len;
    c->text[c->len] = '\0';
    pthread_mutex_unlock(&c->mu);
}

/* Whether some captured line matches the extended regex @p re (anchored per line by the caller). */
static bool captured(struct capture *c, const char *re)
{
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NEWLINE | REG_NOSUB), 0);
    pthread_mutex_lock(&c->mu);
    bool hit = c->text != NULL && regexec(&rx, c->text, 0, NULL, 0) == 0;
    bool lost = c->lost;
    pthread_mutex_unlock(&c->mu);
    regfree(&rx);
    assert_false(lost); /* the sink kept every line */
    return hit;
}

static void expect_line(struct capture *c, const char *re)
{
    if (!WAIT_FOR(captured(c, re), WAIT_MS)) {
        pthread_mutex_lock(&c->mu);
        fail_msg("no log line matches\n  %s\ncaptured:\n%s", re, c->text ? c->text : "(nothing)");
        pthread_mutex_unlock(&c->mu);
    }
}

/* The timestamp and level every kvidx line starts with (net/log.h). */
#define TS "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "

/* lfx_init with the pool's log lines on (the fixture's pools are quiet). */
static void init_logging(struct lfx *f, const struct kvi_listeners_config *cfg, bool quiet)
{
    struct kvi_listeners_config c = cfg ? *cfg : (struct kvi_listeners_config){0};
    c.threads = 2;
    lfx_init_quiet(f, &c, quiet);
}

/*
 * A replay that works says so: the gap (warn, with the seq expected and the
 * seq received), the request (info) and the result (info: batches replayed
 * and the time taken). One that is given up says so at error; a gap without
 * a replay endpoint at warn. Every line has the daemon's timestamp and level.
 * A quiet pool prints nothing.
 */
static void test_replay_log_lines(void **state)
{
    (void)state;
    struct capture c = {.mu = PTHREAD_MUTEX_INITIALIZER};
    enum kvi_log_level saved = kvi_log_level();
    kvi_log_set_level(KVI_LOG_INFO);
    kvi_log_set_sink(capture_sink, &c);

    /* a replay that fills the gap */
    struct lfx f;
    init_logging(&f, NULL, false);
    struct kvidx_pub *p = lfx_replay_pub(&f, 1);
    pub_chain(p, 0, 0, 5);  /* 0..4 */
    kvidx_pub_skip_live(p, 3);
    pub_chain(p, 0, 5, 8);  /* 5..7 lost live */
    lfx_settle(&f, 1, pub_chain(p, 0, 8, 9));
    expect_line(&c, TS "WARN  listener instance 1 rank 0: gap detected: expected seq 5, got seq 8 "
                       "\\(3 batches missing\\)$");
    char re[512];
    snprintf(re, sizeof re, TS "INFO  listener instance 1 rank 0: replay requested from seq 5 \\(%s\\)$",
             kvidx_pub_replay_endpoint(p));
    expect_line(&c, re);
    expect_line(&c, TS "INFO  listener instance 1 rank 0: replay from seq 5 done: 3 batches replayed in "
                       "[0-9]+\\.[0-9] ms; watermark 8$");
    assert_false(captured(&c, "ERROR")); /* nothing went wrong */
    kvidx_pub_destroy(p);
    lfx_fini(&f);

    /* a silent replay endpoint: given up at error, with the loss */
    struct kvi_listeners_config cfg = {.replay_timeout_ms = 300};
    init_logging(&f, &cfg, false);
    p = lfx_replay_pub(&f, 2);
    struct kvidx_pub_replay_faults silent = {.silent = true};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &silent), 0);
    pub_chain(p, 0, 0, 3);  /* 0..2 */
    kvidx_pub_skip_live(p, 2);
    pub_chain(p, 0, 3, 5);  /* 3, 4 lost */
    lfx_settle(&f, 2, pub_chain(p, 1, 0, 1));
    snprintf(re, sizeof re,
             TS "ERROR listener instance 2 rank 0: replay from seq 3 \\(%s\\) given up, timed out without "
                "progress, after [0-9]+\\.[0-9] ms: 0 batches replayed, 2 lost; watermark 5$",
             kvidx_pub_replay_endpoint(p));
    expect_line(&c, re);
    kvidx_pub_destroy(p);
    lfx_fini(&f);

    /* no replay endpoint: the gap and its loss at warn */
    init_logging(&f, NULL, false);
    p = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 3, p, false, KVI_GAP_APPLY);
    lfx_sync(&f, p, 3);
    pub_chain(p, 0, 0, 2);
    kvidx_pub_skip_live(p, 4);
    pub_chain(p, 0, 2, 6);
    lfx_settle(&f, 3, pub_chain(p, 0, 6, 7));
    expect_line(&c, TS "WARN  listener instance 3 rank 0: gap detected: expected seq 2, got seq 6; no replay "
                       "endpoint: 4 batches lost$");
    kvidx_pub_destroy(p);
    lfx_fini(&f);

    /* quiet: the same gap, not a line */
    init_logging(&f, NULL, true);
    p = lfx_pub(NULL, false, NULL);
    lfx_register(&f, 4, p, false, KVI_GAP_APPLY);
    lfx_sync(&f, p, 4);
    pub_chain(p, 0, 0, 2);
    kvidx_pub_skip_live(p, 4);
    pub_chain(p, 0, 2, 6);
    lfx_settle(&f, 4, pub_chain(p, 0, 6, 7));
    assert_int_equal(lfx_info(&f, 4).ctr.gaps, 1);
    assert_false(captured(&c, "listener instance 4 "));
    kvidx_pub_destroy(p);
    lfx_fini(&f);

    kvi_log_set_sink(NULL, NULL);
    kvi_log_set_level(saved);
    free(c.text);
    assert_false(c.lost);
}

int main(void)
{
    kvi_rcu_register_thread();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gap_filled_by_replay),
        cmocka_unit_test(test_gap_filled_by_legacy_replay),
        cmocka_unit_test(test_gap_without_replay),
        cmocka_unit_test(test_lost_replay_replies),
        cmocka_unit_test(test_replay_timeout_then_recovery),
        cmocka_unit_test(test_live_during_replay),
        cmocka_unit_test(test_replay_overrun),
        cmocka_unit_test(test_engine_restart),
        cmocka_unit_test(test_restart_during_replay),
        cmocka_unit_test(test_buffer_overflow_gives_up),
        cmocka_unit_test(test_replay_log_lines),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return rc;
}
