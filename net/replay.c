/*
 * One stream's ordering logic: watermarks, replay state machine and the
 * buffer of batches waiting for their turn (rules in net/replay.h).
 *
 * The buffer is an array sorted by seq with a consumed head: live batches
 * arrive in increasing order (appended), replies that overtook a hole are
 * inserted by binary search (rare), duplicates are refused on insert.
 */
#include "net/replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"

#define CTR(st, field, v) kvi_relaxed_add(&(st)->ctr->field, (uint64_t)(v))

static void note(struct kvi_stream *st, const struct kvi_stream_note *n)
{
    if (st->ops->note != NULL)
        st->ops->note(st->ctx, n);
}

void kvi_stream_init(struct kvi_stream *st, const struct kvi_stream_cfg *cfg, const struct kvi_stream_ops *ops,
                     void *ctx, struct kvi_stream_ctr *ctr)
{
    memset(st, 0, sizeof *st);
    st->can_replay = cfg->can_replay;
    st->policy = (uint8_t)cfg->policy;
    st->max_retries = cfg->max_retries;
    st->max_buffered = cfg->max_buffered ? cfg->max_buffered : 1;
    st->timeout_ns = cfg->timeout_ns;
    st->ops = ops;
    st->ctx = ctx;
    st->ctr = ctr;
}

static void buf_clear(struct kvi_stream *st)
{
    for (size_t i = st->head; i < st->len; i++)
        zmq_msg_close(&st->buf[i].msg);
    st->head = st->len = 0;
}

void kvi_stream_fini(struct kvi_stream *st)
{
    buf_clear(st);
    free(st->buf);
    st->buf = NULL;
    st->cap = 0;
    st->replaying = false;
}

/* Insert a batch by seq, taking the payload. @return false for a seq already buffered (msg untouched). */
static bool buf_insert(struct kvi_stream *st, uint64_t seq, bool replayed, zmq_msg_t *msg)
{
    size_t at = st->len;
    if (st->len > st->head && st->buf[st->len - 1].seq >= seq) {
        size_t lo = st->head, hi = st->len;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (st->buf[mid].seq < seq)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (st->buf[lo].seq == seq)
            return false;
        at = lo;
    }
    if (st->len == st->cap) {
        if (st->head > 0) {
            /* zmq_msg_t is relocatable: zmq_msg_move is a bitwise copy too. */
            memmove(st->buf, st->buf + st->head, (st->len - st->head) * sizeof *st->buf);
            at -= st->head;
            st->len -= st->head;
            st->head = 0;
        } else {
            st->cap = st->cap ? st->cap * 2 : 64;
            st->buf = kvi_xrealloc(st->buf, st->cap * sizeof *st->buf);
        }
    }
    memmove(st->buf + at + 1, st->buf + at, (st->len - at) * sizeof *st->buf);
    struct kvi_stream_buf *e = &st->buf[at];
    e->seq = seq;
    e->replayed = replayed;
    zmq_msg_init(&e->msg);
    zmq_msg_move(&e->msg, msg);
    st->len++;
    return true;
}

/* Apply one batch and move W. A replayed batch moves W even when it fails to decode. */
static void apply_one(struct kvi_stream *st, uint64_t seq, zmq_msg_t *msg, bool replayed)
{
    int rc = st->ops->apply(st->ctx, seq, zmq_msg_data(msg), zmq_msg_size(msg));
    if (rc == KVI_STREAM_SKIPPED) {
        kvi_wm_applied(&st->wm, seq); /* the owner counted it; the same bytes would be dropped again */
    } else if (rc == 0) {
        kvi_wm_applied(&st->wm, seq);
        CTR(st, batches, 1);
        if (replayed) {
            CTR(st, replayed, 1);
            st->rep_applied++;
        }
    } else if (replayed) {
        kvi_wm_applied(&st->wm, seq);
        CTR(st, replay_undecodable, 1);
    } else {
        CTR(st, decode_errors, 1);
    }
}

/* Drop buffered batches already covered and apply those that became contiguous. */
static void drain(struct kvi_stream *st)
{
    while (st->head < st->len) {
        struct kvi_stream_buf *e = &st->buf[st->head];
        uint64_t next = kvi_wm_next(&st->wm);
        if (e->seq > next)
            break;
        if (e->seq == next)
            apply_one(st, e->seq, &e->msg, e->replayed);
        else if (e->replayed)
            CTR(st, replay_dups, 1);
        else
            CTR(st, stale, 1);
        zmq_msg_close(&e->msg);
        st->head++;
    }
    if (st->head == st->len)
        st->head = st->len = 0;
}

static void end_replay(struct kvi_stream *st)
{
    st->replaying = false;
    st->got_first = false;
    st->retries = 0;
}

/*
 * Give the replay up: accept the loss (or clear the rank under the clear
 * policy) and apply what was buffered, in seq order. @p why is the note's.
 */
static void give_up(struct kvi_stream *st, bool discard_dealer, const char *why, uint64_t now_ns)
{
    CTR(st, replay_fallbacks, 1);
    if (discard_dealer)
        st->ops->reset_dealer(st->ctx);
    end_replay(st);
    drain(st);
    struct kvi_stream_note n = {
        .type = KVI_NOTE_GIVEN_UP,
        .expected = st->first_from,
        .ns = now_ns > st->started_ns ? now_ns - st->started_ns : 0,
        .why = why,
    };
    if (st->head < st->len && st->policy == KVI_GAP_CLEAR && st->wm.w_set) {
        st->ops->clear(st->ctx);
        CTR(st, gap_clears, 1);
        n.cleared = true;
    }
    for (size_t i = st->head; i < st->len; i++) {
        struct kvi_stream_buf *e = &st->buf[i];
        uint64_t next = kvi_wm_next(&st->wm);
        if (e->seq >= next) {
            if (e->seq > next) {
                CTR(st, lost, e->seq - next);
                n.lost += e->seq - next;
            }
            apply_one(st, e->seq, &e->msg, e->replayed);
        } else {
            CTR(st, stale, 1);
        }
        zmq_msg_close(&e->msg);
    }
    st->head = st->len = 0;
    n.batches = st->rep_applied;
    note(st, &n);
}

static void send_request(struct kvi_stream *st, uint64_t from, uint64_t now_ns)
{
    st->req_from = from;
    st->got_first = false;
    st->deadline_ns = now_ns + st->timeout_ns;
    CTR(st, replay_requests, 1);
    note(st, &(struct kvi_stream_note){.type = KVI_NOTE_REQUEST, .expected = from, .retry = st->retries});
    if (st->ops->request(st->ctx, from) < 0)
        give_up(st, true, "request failed", now_ns);
}

static void start_replay(struct kvi_stream *st, uint64_t from, uint64_t now_ns)
{
    st->replaying = true;
    st->retries = 0;
    st->started_ns = now_ns;
    st->first_from = from;
    st->rep_applied = 0;
    CTR(st, replays, 1);
    send_request(st, from, now_ns);
}

static void check_overflow(struct kvi_stream *st, uint64_t now_ns)
{
    if (st->replaying && kvi_stream_buffered(st) > st->max_buffered) {
        CTR(st, buffer_overflows, 1);
        give_up(st, true, "buffer limit reached", now_ns);
    }
}

void kvi_stream_abort(struct kvi_stream *st)
{
    buf_clear(st);
    end_replay(st);
}

void kvi_stream_live(struct kvi_stream *st, uint64_t seq, zmq_msg_t *msg, uint64_t now_ns)
{
    bool was_replaying = st->replaying;
    if (st->replaying && !kvi_wm_implausible(&st->wm, seq)) {
        st->wm.n_odd = 0; /* a plausible seq ends any run of implausible ones */
        if (!(st->wm.l_set && seq <= st->wm.l)) {
            st->wm.l = seq;
            st->wm.l_set = true;
            if (st->wm.w_set && seq <= st->wm.w) {
                CTR(st, stale, 1); /* the replay got there first */
                return;
            }
            if (buf_insert(st, seq, false, msg))
                CTR(st, live_buffered, 1);
            check_overflow(st, now_ns);
            return;
        }
        /* Restart during the replay: whatever the old publisher still sends is void. */
        st->ops->reset_dealer(st->ctx);
        kvi_stream_abort(st);
    }

    uint64_t last_live = st->wm.l_set ? st->wm.l : st->wm.w;
    struct kvi_wm_verdict v = kvi_wm_live(&st->wm, seq, st->can_replay, (enum kvi_gap_policy)st->policy);
    if (v.act == KVI_WM_IMPLAUSIBLE) {
        CTR(st, implausible_seq, 1); /* a running replay goes on: nothing moved */
        note(st, &(struct kvi_stream_note){.type = KVI_NOTE_IMPLAUSIBLE, .expected = last_live, .seq = seq});
        return;
    }
    if (v.resync) {
        if (st->replaying) { /* the replay was for the old stream */
            st->ops->reset_dealer(st->ctx);
            kvi_stream_abort(st);
        }
        CTR(st, restarts, 1);
        st->ops->clear(st->ctx);
        note(st, &(struct kvi_stream_note){
                     .type = KVI_NOTE_RESYNC, .expected = last_live, .seq = seq, .in_replay = was_replaying});
    } else if (v.restart) {
        CTR(st, restarts, 1);
        st->ops->clear(st->ctx);
        note(st, &(struct kvi_stream_note){
                     .type = KVI_NOTE_RESTART, .expected = last_live, .seq = seq, .in_replay = was_replaying});
    }
    switch (v.act) {
    case KVI_WM_APPLY:
        apply_one(st, seq, msg, false);
        break;
    case KVI_WM_STALE:
        CTR(st, stale, 1);
        break;
    case KVI_WM_REPLAY:
        CTR(st, gaps, 1);
        note(st, &(struct kvi_stream_note){.type = KVI_NOTE_GAP, .expected = v.from, .seq = seq});
        buf_insert(st, seq, false, msg);
        start_replay(st, v.from, now_ns);
        break;
    case KVI_WM_IMPLAUSIBLE: /* returned above */
        break;
    case KVI_WM_LOSS_CLEAR:
        CTR(st, gap_clears, 1);
        st->ops->clear(st->ctx);
        /* fall through */
    case KVI_WM_LOSS:
        CTR(st, gaps, 1);
        CTR(st, lost, v.lost);
        note(st, &(struct kvi_stream_note){.type = KVI_NOTE_LOSS,
                                           .expected = seq - v.lost,
                                           .seq = seq,
                                           .lost = v.lost,
                                           .cleared = v.act == KVI_WM_LOSS_CLEAR});
        apply_one(st, seq, msg, false);
        break;
    }
}

void kvi_stream_reply(struct kvi_stream *st, uint64_t seq, zmq_msg_t *msg, uint64_t now_ns)
{
    if (!st->replaying) {
        CTR(st, replay_dups, 1); /* a late reply: nothing asked for it any more */
        return;
    }
    uint64_t next = kvi_wm_next(&st->wm);
    if (seq > next && seq - next > KVI_WM_MAX_JUMP) {
        CTR(st, replay_malformed, 1); /* no engine buffer spans that: forged or corrupt */
        return;
    }
    st->deadline_ns = now_ns + st->timeout_ns;
    bool first = !st->got_first;
    uint64_t expect = first ? st->req_from : st->last_reply + 1;
    st->got_first = true;
    st->last_reply = seq;

    if (first && seq > st->req_from && st->req_from == next) {
        /* The engine's buffer no longer reaches the start (§7.2): lost for good. */
        CTR(st, replay_overruns, 1);
        CTR(st, lost, seq - next);
        struct kvi_stream_note n = {.type = KVI_NOTE_OVERRUN, .expected = st->req_from, .seq = seq, .lost = seq - next};
        if (st->policy == KVI_GAP_CLEAR && st->wm.w_set) {
            st->ops->clear(st->ctx);
            CTR(st, gap_clears, 1);
            n.cleared = true;
        }
        note(st, &n);
        apply_one(st, seq, msg, true);
        drain(st);
        return;
    }
    if (seq < next) {
        CTR(st, replay_dups, 1);
        return;
    }
    if (seq == next) {
        apply_one(st, seq, msg, true);
        drain(st);
        return;
    }
    /* seq > next: a reply before this one went missing; keep this one for later. */
    uint64_t hole_from = KVI_MAX(expect, next);
    if (seq > hole_from)
        CTR(st, replay_holes, seq - hole_from);
    if (!buf_insert(st, seq, true, msg))
        CTR(st, replay_dups, 1);
    check_overflow(st, now_ns);
}

void kvi_stream_sentinel(struct kvi_stream *st, uint64_t now_ns)
{
    if (!st->replaying)
        return;
    drain(st);
    if (st->head == st->len) {
        end_replay(st);
        note(st, &(struct kvi_stream_note){.type = KVI_NOTE_REPLAY_DONE,
                                           .expected = st->first_from,
                                           .batches = st->rep_applied,
                                           .ns = now_ns > st->started_ns ? now_ns - st->started_ns : 0});
        return;
    }
    if (st->retries < st->max_retries) {
        st->retries++;
        CTR(st, replay_retries, 1);
        send_request(st, kvi_wm_next(&st->wm), now_ns);
    } else {
        give_up(st, false, "retries exhausted", now_ns);
    }
}

bool kvi_stream_tick(struct kvi_stream *st, uint64_t now_ns)
{
    if (!st->replaying || now_ns < st->deadline_ns)
        return false;
    CTR(st, replay_timeouts, 1);
    give_up(st, true, "timed out without progress", now_ns);
    return true;
}
