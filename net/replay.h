/*
 * One event stream's ordering logic: the §6.3 watermark rule plus the replay
 * state machine of wire-protocol.md §7, without sockets. The listener
 * (net/listener.c) feeds it live messages, replay replies, sentinels and
 * clock ticks; the stream calls back to apply batches, clear the rank, send
 * replay requests and discard the DEALER, and reports gaps, restarts and how
 * each replay went (kvi_stream_ops.note) for the owner's log.
 *
 * REPLAY
 *   A gap (live s > W + 1, or a first live s > 0) starts a replay from
 *   next = W + 1 (0 while W is unset). Live messages received while it runs
 *   are buffered (the one that revealed the gap too). Replies are handled
 *   in seq order:
 *     r < next         duplicate, skipped;
 *     r == next        applied, then buffered batches that became
 *                      contiguous are applied;
 *     r > next         a reply went missing (a ROUTER drops silently when
 *                      its pipe fills, §7.4): buffered, and the hole counted;
 *   except the first reply of a request: r > requested start means the
 *   engine's buffer no longer holds the start (§7.2): the batches before r
 *   are lost for good (counted), the rank is cleared under the clear policy,
 *   and r is applied.
 *   At the sentinel the buffered batches are drained; if some seq is still
 *   missing the replay re-requests from it (at most `max_retries` times),
 *   otherwise it ends. A timeout without progress, running out of retries or
 *   too many buffered batches give up: the DEALER is discarded (late replies
 *   must not reach the next request), the loss is accepted (each jump
 *   counted in `lost`) or, under the clear policy, the rank is cleared, and
 *   the buffered batches are applied in seq order.
 *   Every batch is therefore applied exactly in seq order with duplicates
 *   dropped by seq, so a replayed Stored never lands after a newer live
 *   Removed of the same block.
 *
 *   A live seq s <= L during a replay is a publisher restart: the replay
 *   and its buffer are dropped (the DEALER discarded) and s is handled as
 *   on a fresh stream after clearing the rank.
 *
 * IMPLAUSIBLE SEQS (net/watermark.h)
 *   A live seq more than KVI_WM_MAX_JUMP past L (or W) is dropped and
 *   counted in `implausible_seq`, during a replay too (it is neither
 *   buffered nor a gap): W, L, `gaps` and `lost` do not move, so the next
 *   real seq continues the stream. A run of KVI_WM_RESYNC_RUN such seqs is
 *   a resync: counted as a restart (rank cleared, any replay dropped), and
 *   the last one is applied as the first batch of a fresh stream. A replay
 *   reply more than KVI_WM_MAX_JUMP past the next seq due is ignored and
 *   counted in `replay_malformed` (no hole or loss of that size is counted).
 *
 * DECODE FAILURES
 *   A live batch that fails to decode leaves W alone (§2.2): the next live
 *   batch is a gap and the replay re-fetches it. A replayed batch that fails
 *   to decode is skipped and W moves past it: its bytes are the live ones,
 *   so fetching it again cannot help.
 *
 * Thread-safety: a stream belongs to one thread. Counters are written with
 * relaxed single-writer stores (read them with relaxed loads anywhere).
 */
#ifndef KVI_NET_REPLAY_H
#define KVI_NET_REPLAY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "net/listener.h"
#include "net/watermark.h"

#define KVI_LISTEN_X_ATOMIC(name, help) _Atomic uint64_t name;

/** The listener counters (KVI_LISTENER_COUNTERS), as single-writer atomics. */
struct kvi_stream_ctr {
    KVI_LISTENER_COUNTERS(KVI_LISTEN_X_ATOMIC)
};

/** What a stream tells its owner's log (kvi_stream_ops.note); the owner picks the level. */
enum kvi_stream_note_type {
    KVI_NOTE_GAP,         /* a live seq past the next one due: a replay from `expected` follows */
    KVI_NOTE_LOSS,        /* the same without a replay endpoint: `lost` batches lost for good */
    KVI_NOTE_RESTART,     /* a live seq at or below L: publisher restart, the rank was cleared */
    KVI_NOTE_REQUEST,     /* a replay request is about to be sent */
    KVI_NOTE_REPLAY_DONE, /* the replay ended with every batch up to the buffered ones applied */
    KVI_NOTE_GIVEN_UP,    /* the replay was given up: loss accepted (or rank cleared) */
    KVI_NOTE_OVERRUN,     /* the first reply started past the requested seq (engine buffer overrun) */
    KVI_NOTE_IMPLAUSIBLE, /* a live seq jumped more than KVI_WM_MAX_JUMP: dropped */
    KVI_NOTE_RESYNC,      /* a run of implausible seqs: restart, rank cleared, s applied as a fresh stream */
};

/**
 * One note. Fields not listed for a type are 0 / NULL / false.
 *   GAP          expected (W + 1, or 0 while W is unset), seq (the live seq received)
 *   LOSS         expected, seq, lost (= seq - expected), cleared (clear policy)
 *   RESTART      expected (L, the last live seq), seq (<= L), in_replay (a replay and
 *                its buffer were dropped)
 *   REQUEST      expected (the start seq), retry (0 for the first request of a replay,
 *                then 1 .. max_retries)
 *   REPLAY_DONE  expected (the start seq of the replay's first request), batches (applied
 *                from replies), ns (since the replay started)
 *   GIVEN_UP     expected, batches, ns as above; lost (batches skipped when the
 *                buffer was applied), cleared, why (a static string: "timed out
 *                without progress", "retries exhausted", "buffer limit reached",
 *                "request failed")
 *   OVERRUN      expected (the start requested), seq (the first reply), lost, cleared
 *   IMPLAUSIBLE  expected (the reference: L, else W), seq
 *   RESYNC       expected (the reference before the run), seq (the one applied), in_replay
 * The watermarks after the event are the stream's own (st->wm) when the note is made.
 */
struct kvi_stream_note {
    enum kvi_stream_note_type type;
    uint64_t expected;
    uint64_t seq;
    uint64_t lost;
    uint64_t batches;
    uint64_t ns;
    uint32_t retry;
    bool cleared;
    bool in_replay;
    const char *why;
};

/** Callbacks into the owner (the listener). */
struct kvi_stream_ops {
    /**
     * Decode and ingest one batch. @return 0; KVI_STREAM_SKIPPED when the
     * owner dropped a good batch on purpose and counted it (W moves past it,
     * `batches` is not counted: a replay would bring the same bytes); or
     * -EBADMSG when it failed to decode.
     */
    int (*apply)(void *ctx, uint64_t seq, const void *buf, size_t len);
    /** Drop this (instance, rank)'s blocks (restart, clear policy). */
    void (*clear)(void *ctx);
    /** Send a replay request from @p from. @return 0 or -errno (then the replay gives up). */
    int (*request)(void *ctx, uint64_t from);
    /** Discard the DEALER and open a new one (stale replies must not be read). */
    void (*reset_dealer)(void *ctx);
    /**
     * Optional (NULL = none): an event worth a log line, called on the
     * stream's thread from inside the kvi_stream_* call that made it, after
     * the counters moved. @p n is valid during the call only.
     */
    void (*note)(void *ctx, const struct kvi_stream_note *n);
};

/** kvi_stream_ops.apply: the batch decoded and was dropped by the owner (e.g. its rank bound). */
#define KVI_STREAM_SKIPPED 1

/** A buffered batch. */
struct kvi_stream_buf {
    uint64_t seq;
    bool replayed;
    zmq_msg_t msg;
};

struct kvi_stream {
    struct kvi_wm wm;
    /* settings */
    bool can_replay;
    uint8_t policy;         /* enum kvi_gap_policy */
    uint32_t max_retries;
    uint32_t max_buffered;
    uint64_t timeout_ns;
    /* replay state */
    bool replaying;
    bool got_first;         /* a reply to the current request arrived */
    uint32_t retries;
    uint64_t req_from;
    uint64_t last_reply;    /* seq of the previous reply to the current request */
    uint64_t deadline_ns;
    uint64_t started_ns;    /* when the replay started (its notes' ns) */
    uint64_t first_from;    /* start seq of the replay's first request */
    uint64_t rep_applied;   /* batches applied from replies during this replay */
    /* buffered batches, sorted by seq, unique: buf[head .. len) */
    struct kvi_stream_buf *buf;
    size_t head, len, cap;
    const struct kvi_stream_ops *ops;
    void *ctx;
    struct kvi_stream_ctr *ctr;
};

/** Settings of a stream. */
struct kvi_stream_cfg {
    bool can_replay;
    enum kvi_gap_policy policy;
    uint32_t max_retries;
    uint32_t max_buffered;
    uint64_t timeout_ns;
};

/** Initialise @p st (both watermarks unset, no replay). @p ops and @p ctr must outlive it. */
void kvi_stream_init(struct kvi_stream *st, const struct kvi_stream_cfg *cfg, const struct kvi_stream_ops *ops,
                     void *ctx, struct kvi_stream_ctr *ctr);

/** Free the buffered batches. The stream can be re-initialised afterwards. */
void kvi_stream_fini(struct kvi_stream *st);

/**
 * Abandon a running replay and drop the buffered batches, keeping the
 * watermarks (pause). Does not call reset_dealer: the caller closes it.
 */
void kvi_stream_abort(struct kvi_stream *st);

/**
 * A live batch with seq @p seq; @p msg holds its payload. The stream either
 * applies it now (msg untouched) or takes the payload (msg left empty).
 */
void kvi_stream_live(struct kvi_stream *st, uint64_t seq, zmq_msg_t *msg, uint64_t now_ns);

/** A replay reply (not the sentinel); the payload may be taken as above. */
void kvi_stream_reply(struct kvi_stream *st, uint64_t seq, zmq_msg_t *msg, uint64_t now_ns);

/** The replay end sentinel. */
void kvi_stream_sentinel(struct kvi_stream *st, uint64_t now_ns);

/** Give up a replay whose deadline passed. @return true when it timed out now. */
bool kvi_stream_tick(struct kvi_stream *st, uint64_t now_ns);

/** Whether a replay runs; its deadline (monotonic ns) is st->deadline_ns. */
static inline bool kvi_stream_replaying(const struct kvi_stream *st)
{
    return st->replaying;
}

/** Number of buffered batches. */
static inline size_t kvi_stream_buffered(const struct kvi_stream *st)
{
    return st->len - st->head;
}

#endif
