/*
 * One event stream's ordering logic: the §6.3 watermark rule plus the replay
 * state machine of wire-protocol.md §7, without sockets. The listener
 * (net/listener.c) feeds it live messages, replay replies, sentinels and
 * clock ticks; the stream calls back to apply batches, clear the rank, send
 * replay requests and discard the DEALER.
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

/** Callbacks into the owner (the listener). */
struct kvi_stream_ops {
    /** Decode and ingest one batch. @return 0, or -EBADMSG when it failed to decode. */
    int (*apply)(void *ctx, uint64_t seq, const void *buf, size_t len);
    /** Drop this (instance, rank)'s blocks (restart, clear policy). */
    void (*clear)(void *ctx);
    /** Send a replay request from @p from. @return 0 or -errno (then the replay gives up). */
    int (*request)(void *ctx, uint64_t from);
    /** Discard the DEALER and open a new one (stale replies must not be read). */
    void (*reset_dealer)(void *ctx);
};

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
