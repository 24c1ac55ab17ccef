/*
 * The ZMQ -> JetStream bridge (kvidxd --nats-publish STREAM): every index
 * change a ZMQ listener makes for a registration is also published to a
 * JetStream stream as a Dynamo RouterEvent (JSON), one message per event,
 * so that query-only replicas (--nats-stream) and Dynamo routers can read
 * the engines' events without a route to them.
 *
 * WHAT IS PUBLISHED (net/ingest.h mirror hook, per op on the target's own
 * instance)
 *   KVI_OP_STORE without seq hashes -> {"stored": {parent_hash, blocks:
 *       [{block_hash = engine hash, tokens_hash = kvidx content hash}]}}
 *   KVI_OP_REMOVE                   -> {"removed": {block_hashes}}
 *   KVI_OP_CLEAR_DP_RANK, and KVI_OP_REMOVE_DP_RANK (the listener's rank
 *       reset on a publisher restart or an unrecoverable gap) -> "cleared"
 *   Anything else (token-less stores resolved on the writer, RFC 1527
 *   seq-only or seq-placed stores, shared pools) has no RouterEvent form:
 *   counted in `skipped`, not published.
 *
 * IDENTITY
 *   worker_id: a numeric (Dynamo) instance id as it is; a string id
 *   (Conductor, zmq-bind pod) = XXH3-64(name, seed 0) with bit 63 set, which
 *   every replica computes alike. Subject: STREAM.<hex model>.<hex tenant>.
 *   <worker_id>.<registered rank> (hex of the UTF-8 bytes, lower case, so any
 *   name is a valid token; "-" for an empty name). A namespace's events are
 *   STREAM.<hex model>.<hex tenant>.> (kvi_nats_bridge_ns_subject).
 *   event_id = ((zmq_seq + 1) << 20) | (event index + 1): increasing per
 *   (worker_id, dp_rank) while the engine's seq increases (an engine restart
 *   starts it over, after a "cleared"). Nats-Msg-Id =
 *   "kvb.<worker_id>.<rank>.<seq>.<index>.<tag>", tag = XXH3-64 of the
 *   batch's ZMQ payload in hex (set by the listener): two replicas bridging
 *   one engine publish identical messages and the stream's duplicate window
 *   (KVI_BRIDGE_DUP_WINDOW_NS) stores them once, while a restarted engine's
 *   batches (same seqs, other bytes) are not taken for duplicates.
 *   At most 2^20 - 1 events per batch are bridged (past that: skipped).
 *
 * RESETS
 *   A rank reset (the listener's, on an engine restart or a gap it cannot
 *   repair) is held back and published as "cleared" just before the next
 *   event of the registration, with event_id ((seq + 1) << 20) and
 *   Nats-Msg-Id "kvb.<worker_id>.<rank>.<seq>.c<k>.<tag>" of that next
 *   batch (k: the k-th rank reset): after a restart the next batch is the
 *   new engine's first one (replayed from its ring), which every replica
 *   bridging it sees alike, so they publish the same "cleared" once.
 *   Until that next event the stream still holds the old blocks.

 * RESUME (kvi_nats_bridge_resume)
 *   A bridging replica that restarts reads the last message of each
 *   (worker, rank) subject back from the stream: the caller seeds the
 *   listener's watermark one below its seq (the listener then replays the
 *   rest from the engine's ROUTER), and the bridge drops the events of that
 *   seq up to the stored index, so nothing is published twice even past the
 *   duplicate window.
 *
 * THREADS AND FLOW
 *   mirror callbacks run on listener threads: they encode the event into a
 *   heap node, and at the batch's end (the hook's op NULL call) append the
 *   batch's nodes to a mutex-protected FIFO with one lock (no NATS call). One
 *   bridge thread takes the FIFO and publishes with js_PublishMsgAsync
 *   (at most KVI_BRIDGE_MAX_PENDING unacknowledged); libnats' reply thread
 *   runs the ack handler, which counts acks, duplicates and errors; a
 *   message whose publish failed goes back to the FIFO's head and is sent
 *   again (at most 10 rounds of failures a second); one larger than the
 *   server's max_payload is dropped and counted. NATS down: the FIFO grows up to max_bytes (queued + retried
 *   bytes); past it new events are dropped, counted (dropped) and logged
 *   (one line per 10 s). Acks missing for 10 s while connected: the pending
 *   messages are taken back from libnats and resent (resent; duplicates are
 *   dropped by Nats-Msg-Id).
 *
 *   | call                          | thread                                 |
 *   |-------------------------------|----------------------------------------|
 *   | create / destroy              | control plane (destroy after the       |
 *   |                               | listener pool that calls mirror)       |
 *   | worker                        | any (serialised inside)                |
 *   | resume                        | control plane, before the registration |
 *   | kvi_nats_bridge_mirror        | the registration's listener thread     |
 *   | stats / ns_list               | any                                    |
 *
 * ERRORS
 *   int functions return 0 or a negative errno; create returns NULL with
 *   errno set.
 */
#ifndef KVI_NET_NATS_BRIDGE_H
#define KVI_NET_NATS_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/writer.h"
#include "net/ingest.h"
#include "net/nats_source.h"

#define KVI_BRIDGE_DUP_WINDOW_NS (120ull * 1000000000ull) /* the stream's duplicate window: 2 min */
#define KVI_BRIDGE_MAX_PENDING 65536                      /* unacknowledged async publishes */
#define KVI_BRIDGE_DEFAULT_MAX_BYTES (256ull << 20)       /* FIFO bound (bytes of messages) */

struct kvi_nats_bridge;
struct kvi_bridge_worker;

/** Counters (every one only grows, but `queued`, `queued_bytes`, `pending`). */
struct kvi_nats_bridge_stats {
    uint64_t events;        /* events handed to the bridge and queued */
    uint64_t published;     /* publishes handed to libnats (resends included) */
    uint64_t acked;         /* stored by the stream (acks without duplicate) */
    uint64_t duplicates;    /* acks saying the stream had the Nats-Msg-Id already */
    uint64_t errors;        /* failed publishes (each is queued again) */
    uint64_t resent;        /* messages taken back from libnats after missing acks and resent */
    uint64_t dropped;       /* events dropped: FIFO full (NATS unreachable for long) */
    uint64_t skipped;       /* ops with no RouterEvent form (see WHAT IS PUBLISHED) */
    uint64_t resumed_skipped; /* events already in the stream at a restart (RESUME) */
    uint64_t queued;        /* messages in the FIFO now */
    uint64_t queued_bytes;  /* their bytes */
    uint64_t pending;       /* published, not acknowledged yet */
    bool stream_ready;      /* the stream exists (created or found) */
};

/** A namespace the bridge publishes: its subject filter. */
struct kvi_nats_bridge_ns_view {
    const char *model, *tenant;
    const char *subject; /* STREAM.<hex model>.<hex tenant>.> */
};

/** Destroy: publishes what the FIFO holds for up to 0.4 s (and waits 0.3 s for acks), then frees:
 * what is left is lost, as on a crash (RESUME). Control plane. */
void kvi_nats_bridge_destroy(struct kvi_nats_bridge *b);

/**
 * Start a bridge on plane @p n's connection, into stream @p stream (created
 * if missing: subjects STREAM.>, file storage, duplicate window
 * KVI_BRIDGE_DUP_WINDOW_NS; created by the bridge thread, retried while
 * NATS is unreachable). @p max_bytes 0 = KVI_BRIDGE_DEFAULT_MAX_BYTES.
 * @return the bridge, or NULL with errno EINVAL (bad stream name), ENOMEM.
 */
struct kvi_nats_bridge *kvi_nats_bridge_create(struct kvi_nats *n, const char *stream, uint64_t max_bytes);

/**
 * The mirror context of a registration (interned: the same pointer for the
 * same (model, tenant, id, rank), valid until destroy). @p instance_name
 * NULL for a numeric id. Logs the namespace's subject the first time it
 * sees it. @return the worker, or NULL (ENOMEM).
 */
struct kvi_bridge_worker *kvi_nats_bridge_worker(struct kvi_nats_bridge *b, const char *model, const char *tenant,
                                                 uint64_t instance_id, const char *instance_name,
                                                 uint32_t dp_rank);

/**
 * RESUME: read the last message of @p w's subject from the stream (one NATS
 * round-trip, up to 2 s). When there is one, set @p *seed_watermark to the
 * seq below it (or leave it unset when that seq is 0), arm the skip and
 * @return 1; 0 when the subject is empty; a negative errno when NATS or the
 * stream did not answer, -ENOTCONN at once when the connection is down
 * (nothing armed; logged).
 */
int kvi_nats_bridge_resume(struct kvi_nats_bridge *b, struct kvi_bridge_worker *w, bool *has_seed,
                           uint64_t *seed_watermark);

/** The mirror hook (net/ingest.h kvi_ingest_mirror_fn); @p ctx is a struct kvi_bridge_worker. A
 * batch's events are queued when the hook is called with @p op NULL (its end). */
void kvi_nats_bridge_mirror(void *ctx, const struct kvi_op *op, const struct kvi_ingest_mirror_pos *pos);

/** Counters into @p out. Any thread. */
void kvi_nats_bridge_stats(struct kvi_nats_bridge *b, struct kvi_nats_bridge_stats *out);

/** The stream name. */
const char *kvi_nats_bridge_stream(const struct kvi_nats_bridge *b);

/**
 * The namespaces published so far, oldest first, into @p out (at most
 * @p cap); their strings stay valid until destroy. Any thread.
 * @return how many there are (may exceed @p cap).
 */
size_t kvi_nats_bridge_ns_list(struct kvi_nats_bridge *b, struct kvi_nats_bridge_ns_view *out, size_t cap);

/** worker_id of a string instance id: XXH3-64(name, 0) | 2^63. */
uint64_t kvi_nats_bridge_worker_id(const char *instance_name);

#endif
