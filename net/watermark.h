/*
 * Gap detection for one (instance, dp_rank) event stream: the kvidx rule of
 * wire-protocol.md §6.3, as a pure function so that every row of its table is
 * unit-testable (tests/net/watermark_test.c).
 *
 * Two numbers per stream:
 *   W  the applied watermark: the seq of the last batch applied (live or
 *      replayed); unset until the first batch is applied;
 *   L  the last seq seen on the live SUB; unset until the first live batch.
 * Live order on one PUB->SUB connection is strictly increasing, so a live
 * seq s <= L can only mean that the publisher restarted (its counter starts
 * at 0 with every process).
 *
 *   | live seq s                   | verdict                                 |
 *   |------------------------------|-----------------------------------------|
 *   | L set, s <= L                | restart: W, L reset, then as "W unset"  |
 *   | W unset, s = 0               | APPLY                                   |
 *   | W unset, s > 0               | joined mid-stream: REPLAY from 0, or    |
 *   |                              | LOSS without a replay endpoint          |
 *   | W set, s <= W                | STALE (already covered by a replay)     |
 *   | W set, s = W + 1             | APPLY                                   |
 *   | W set, s > W + 1             | gap: REPLAY from W + 1, or, without a   |
 *   |                              | replay endpoint, LOSS (policy apply) or |
 *   |                              | LOSS_CLEAR (policy clear)               |
 *
 * L := s after every verdict but IMPLAUSIBLE. W moves only through
 * kvi_wm_applied, so a batch that fails to decode leaves it where it was
 * (§2.2).
 *
 * IMPLAUSIBLE JUMPS. Checked before the table: a live s more than
 * KVI_WM_MAX_JUMP (2^32) past the stream's reference (L, else W when only
 * W is set) is IMPLAUSIBLE. No publisher gets there: 2^32 batches are 50
 * days at 1,000 batches/s without one being received, and an engine's
 * replay buffer holds 10^4..10^6 batches. It is a forged or corrupted seq
 * (a jump of 2^63 would otherwise add 2^63 to `lost` and make the next real
 * seq look like a restart). The batch is dropped: W and L stay, nothing is
 * counted lost, and the next real seq continues the stream as if it had
 * never come. Only KVI_WM_RESYNC_RUN (4) implausible seqs in a row, each
 * one past the previous one, are taken for a real publisher whose counter
 * moved on (a restart that kept no 0 base): the 4th is a restart verdict
 * (clear the rank when anything was seen) and is applied as the first batch
 * of a fresh stream, without a replay or a loss count from 0 (the distance
 * counts nothing real). A stream with no reference (W and L unset) is not
 * judged: its first seq may be anything (the join rows).
 *
 * Joining mid-stream never asks for a clear, even under the clear policy:
 * nothing of this stream has been applied yet (or it was just cleared by a
 * restart), and a clear would throw away blocks recovered from a peer.
 *
 * Thread-safety: a struct kvi_wm belongs to one thread (its listener thread).
 * The functions are pure apart from updating the struct passed in.
 */
#ifndef KVI_NET_WATERMARK_H
#define KVI_NET_WATERMARK_H

#include <stdbool.h>
#include <stdint.h>

/** Seq of the replay end sentinel (ff x 8); never a valid live seq. */
#define KVI_SEQ_SENTINEL UINT64_MAX

/** A live seq more than this past the stream's reference is IMPLAUSIBLE (header comment). */
#define KVI_WM_MAX_JUMP (UINT64_C(1) << 32)

/** Implausible seqs in a row, each the previous + 1, that re-base the stream (a resync). */
#define KVI_WM_RESYNC_RUN 4u

/** What to do on a gap when no replay endpoint is configured (§6.3). */
enum kvi_gap_policy {
    KVI_GAP_APPLY = 0, /* accept the loss and apply (Dynamo-compatible default) */
    KVI_GAP_CLEAR = 1, /* clear the (instance, rank) state and restart from s */
};

/** Watermarks of one stream. Zero-initialised = both unset. */
struct kvi_wm {
    uint64_t w;  /* applied watermark, valid when w_set */
    uint64_t l;  /* last live seq, valid when l_set */
    bool w_set;
    bool l_set;
    uint64_t odd;   /* the last IMPLAUSIBLE seq, valid when n_odd > 0 */
    uint32_t n_odd; /* IMPLAUSIBLE seqs in a row, each odd + 1 of the one before */
};

enum kvi_wm_act {
    KVI_WM_APPLY = 0,   /* apply s (first batch of a fresh publisher, or contiguous) */
    KVI_WM_STALE,       /* skip s: already applied */
    KVI_WM_REPLAY,      /* gap: replay from .from, then apply s or skip it */
    KVI_WM_LOSS,        /* gap, no replay: .lost batches are gone; apply s */
    KVI_WM_LOSS_CLEAR,  /* gap, no replay, clear policy: clear the rank, then apply s */
    KVI_WM_IMPLAUSIBLE, /* s jumped more than KVI_WM_MAX_JUMP: drop it; W and L unchanged */
};

/** Verdict on one live seq. */
struct kvi_wm_verdict {
    uint8_t act;    /* enum kvi_wm_act */
    bool restart;   /* the publisher restarted: clear the rank first (W and L were reset) */
    bool resync;    /* APPLY after a run of implausible seqs: s starts a fresh stream (W unset) */
    uint64_t from;  /* REPLAY: first seq to request (W + 1, or 0) */
    uint64_t lost;  /* REPLAY and LOSS*: seqs missing before s (s - from) */
};

/** Reset both watermarks to unset (registration, unregistration). */
void kvi_wm_reset(struct kvi_wm *wm);

/**
 * Whether live seq @p s jumps more than KVI_WM_MAX_JUMP past the stream's
 * reference (L, else W; never with both unset). Pure.
 */
bool kvi_wm_implausible(const struct kvi_wm *wm, uint64_t s);

/**
 * Classify live seq @p s and set L := s (pure apart from @p wm); an
 * IMPLAUSIBLE seq leaves W and L alone and only advances the run count.
 * @param can_replay  a replay endpoint is configured
 * @param policy      what a gap does without replay
 * @return the verdict; W is never changed except by a restart's reset.
 */
struct kvi_wm_verdict kvi_wm_live(struct kvi_wm *wm, uint64_t s, bool can_replay, enum kvi_gap_policy policy);

/** The next seq the stream expects: W + 1, or 0 while W is unset. */
static inline uint64_t kvi_wm_next(const struct kvi_wm *wm)
{
    return wm->w_set ? wm->w + 1 : 0;
}

/**
 * Seed W := @p w as if every batch up to @p w had been applied (a watermark
 * recovered from a peer's /dump); L is left as it is (unset on a fresh
 * stream). The table above then applies: live s <= W is stale, W + 1 is
 * applied, a later s replays from W + 1.
 */
static inline void kvi_wm_seed(struct kvi_wm *wm, uint64_t w)
{
    wm->w = w;
    wm->w_set = true;
}

/** Record that batch @p s was applied: W := s. */
static inline void kvi_wm_applied(struct kvi_wm *wm, uint64_t s)
{
    wm->w = s;
    wm->w_set = true;
}

#endif
