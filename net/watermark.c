/* Gap detection: the kvidx rule of wire-protocol.md §6.3 (see watermark.h). */
#include "net/watermark.h"

void kvi_wm_reset(struct kvi_wm *wm)
{
    *wm = (struct kvi_wm){0};
}

bool kvi_wm_implausible(const struct kvi_wm *wm, uint64_t s)
{
    if (!wm->l_set && !wm->w_set)
        return false; /* nothing to measure against: the join rows */
    uint64_t ref = wm->l_set ? wm->l : wm->w;
    return s > ref && s - ref > KVI_WM_MAX_JUMP;
}

struct kvi_wm_verdict kvi_wm_live(struct kvi_wm *wm, uint64_t s, bool can_replay, enum kvi_gap_policy policy)
{
    struct kvi_wm_verdict v = {.act = KVI_WM_APPLY};

    if (kvi_wm_implausible(wm, s)) {
        wm->n_odd = wm->n_odd > 0 && s == wm->odd + 1 ? wm->n_odd + 1 : 1;
        wm->odd = s;
        if (wm->n_odd < KVI_WM_RESYNC_RUN) {
            v.act = KVI_WM_IMPLAUSIBLE;
            return v;
        }
        /* A run: a publisher that really moved on. s starts a fresh stream. */
        v.restart = true;
        v.resync = true;
        kvi_wm_reset(wm);
        wm->l = s;
        wm->l_set = true;
        return v;
    }
    wm->n_odd = 0;

    if (wm->l_set && s <= wm->l) {
        /* Live order is strictly increasing on one connection: a restart. */
        v.restart = true;
        kvi_wm_reset(wm);
    }
    wm->l = s;
    wm->l_set = true;

    uint64_t next = kvi_wm_next(wm);
    if (wm->w_set && s <= wm->w) {
        v.act = KVI_WM_STALE;
    } else if (s > next) {
        v.from = next;
        v.lost = s - next;
        if (can_replay)
            v.act = KVI_WM_REPLAY;
        else if (wm->w_set && policy == KVI_GAP_CLEAR)
            v.act = KVI_WM_LOSS_CLEAR;
        else
            v.act = KVI_WM_LOSS;
    }
    return v;
}
