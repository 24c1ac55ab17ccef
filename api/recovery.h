/*
 * P2P recovery (http-api.md §1.16): at startup, fetch GET {peer}/dump from the
 * first peer that answers with a complete, valid dump and apply it to the
 * local indexes through the control thread's producer.
 *
 *   1. wait `delay_ms` (the local SUB sockets are already connected and
 *      buffering, the gate is closed; the delay makes the peer's snapshot
 *      cover the slow-joiner window);
 *   2. for each peer in order: GET {peer}/dump with a `timeout_ms` budget,
 *      streamed into the dump decoder (api/codec_dump.h) and applied block
 *      by block: namespaces are found or created with the dump's block size
 *      (a mismatch with an existing namespace only warns), instances are
 *      interned by id or name;
 *   3. a peer fails on a transport error, a non-2xx status, or a body the
 *      decoder rejects (malformed, or a namespace without both block_size and
 *      events, such as an {"error":...} entry): what its attempt applied is
 *      rolled back (its instances are removed, namespaces it created and no
 *      registration uses are deleted), its watermarks discarded, and the
 *      next peer is tried; the first peer whose dump applied whole has its
 *      watermarks (api/codec_dump.h) handed to the service
 *      (kvi_service_ctl_recovered_watermark), which seeds the gated
 *      listeners before the gate opens, or later registrations;
 *   4. no peer works: start empty (KVI_RECOVERY_NO_REACHABLE_PEERS).
 *
 * Every step stops early once shutdown has begun (KVI_RECOVERY_FAILED).
 * Listeners stay gated (pending) the whole time, so nothing live is applied
 * meanwhile and a rollback cannot erase live state.
 *
 * Recovery owns its outcome and figures (below). It uses the service only
 * through the control thread's calls of api/service.h (kvi_service_ctl_*);
 * the service runs it and keeps its result, so this header needs no service
 * definition, and whoever reads recovery's figures includes it.
 *
 * THREAD: kvi_recovery_run, the service's control thread only (it owns the
 * producer used); the other calls, any thread.
 */
#ifndef KVI_API_RECOVERY_H
#define KVI_API_RECOVERY_H

#include <stddef.h>
#include <stdint.h>

struct kvi_service;
struct kvi_dump_rec;
struct kvi_op;

/**
 * Turn one decoded dump record into the single-block op that replays it
 * (ix, instance and sink left for the caller). @return the op (the
 * caller submits it), or NULL when the record cannot be replayed (a block
 * without content or position that names no seq hash). Any thread.
 */
struct kvi_op *kvi_recovery_rec_op(const struct kvi_dump_rec *r);

/** P2P recovery outcome (/status "recovery"). */
enum kvi_recovery_result {
    KVI_RECOVERY_NONE = 0,        /* not finished (or not configured) */
    KVI_RECOVERY_SUCCEEDED,
    KVI_RECOVERY_NO_REACHABLE_PEERS,
    KVI_RECOVERY_FAILED,
};

/** "succeeded", "no_reachable_peers", "failed"; NULL for NONE (static strings). Any thread. */
const char *kvi_recovery_result_name(enum kvi_recovery_result r);

/** Recovery figures for /metrics. */
struct kvi_recovery_stats {
    uint64_t attempts;     /* peer fetches started */
    uint64_t blocks;       /* blocks applied by the successful attempt */
    uint64_t rejected;     /* blocks the index rejected (unknown parent, invalid) */
    uint64_t duration_ms;  /* of the whole recovery */
};

/**
 * The figures of the startup recovery, as the service keeps them (defined in
 * api/service.c): all zero until it has finished, and when no peer is
 * configured. Any thread (takes the service's table mutex briefly).
 */
void kvi_service_recovery_stats(struct kvi_service *svc, struct kvi_recovery_stats *out);

/**
 * Run P2P recovery (control thread).
 * @param peers     base URLs such as "http://host:8090" (a trailing '/' is allowed)
 * @param st        receives the figures (attempts, blocks, rejected, duration)
 * @return the outcome; never KVI_RECOVERY_NONE.
 */
enum kvi_recovery_result kvi_recovery_run(struct kvi_service *svc, const char *const *peers, size_t n_peers,
                                          uint32_t delay_ms, uint32_t timeout_ms, struct kvi_recovery_stats *st);

#endif
