/*
 * NATS event sources: Dynamo RouterEvents from Core NATS subjects and
 * JetStream streams, decoded (net/decode_router.h) and applied to an index
 * through the writer pool (net/ingest.h), like the ZMQ listeners' batches.
 * ../shared/reference/nats-event-plane.md is the wire contract.
 *
 * CONNECTION
 *   One connection per plane (kvi_nats_create) to the servers given
 *   (comma-separated URLs), with user/password, token, creds file and a TLS
 *   CA as libnats offers them. It is retried forever: a first connect that
 *   fails goes on in the background, and a lost connection reconnects with
 *   a backoff of reconnect_wait_ms doubling up to 2 s (libnats' custom
 *   reconnect delay). Core subscriptions survive reconnects (libnats
 *   re-subscribes); a JetStream source retries its consumer until the
 *   server answers.
 *
 * SOURCES (kvi_nats_add_source; one thread each, owning its decoder, its
 * writer-pool producer and its workers)
 *   core     a synchronous subscription to a subject (wildcards allowed).
 *            Order per (worker_id, dp_rank) by event_id, Dynamo's rule: the
 *            next id (or any id for the first event seen) is applied; an id
 *            <= the last applied is dropped and counted (stale); a larger
 *            one is applied, counted and logged as a gap (events_lost adds
 *            the ids skipped). Core NATS cannot repair a gap (Dynamo asks
 *            the worker over its own request plane, which kvidx does not
 *            speak): JetStream is the lossless choice. A new envelope
 *            publisher_id for a (worker_id, dp_rank) is a restarted
 *            publisher: its rank's blocks are dropped (the engine's cache
 *            went with it) and order starts over (counted in restarts).
 *            Messages the subscription dropped as a slow consumer (pending
 *            limits: pending_msgs / pending_bytes) are counted in dropped.
 *   stream   a JetStream durable pull consumer named `durable` on a stream
 *            (and an optional filter subject; without one the stream must
 *            have exactly one subject, which is used). kvidxd starts with an
 *            empty index, so at start-up the source re-creates its durable
 *            consumer to deliver the whole stream (deliver all, explicit
 *            ack): the stream is the event log, and a restarted kvidxd
 *            rebuilds from it alone. (A consumer that resumed at its old ack
 *            floor would skip everything an in-memory index lost in the
 *            crash.) Messages are fetched in batches of fetch_batch,
 *            applied in stream order, and acked only once the writers have
 *            applied them (kvi_producer_flush): a crash redelivers what was
 *            not acked. A redelivered message whose event_id is not past the
 *            last applied of its (worker_id, dp_rank) is dropped as stale
 *            (a redelivery must not undo a later remove); first deliveries
 *            are applied whatever their id (stream order is authoritative:
 *            a restarted publisher starts again at 0), and counted as gaps
 *            or restarts when their id is not the next one. Caught up once
 *            the consumer delivered the stream's last sequence seen at
 *            start-up (kvi_nats_ready). History the stream no longer holds
 *            (max age, purges) cannot be rebuilt from it: P2P recovery
 *            (--peers) covers that.
 *   snapshots  with hooks (kvi_nats_config.snap, struct kvi_nats_snap_hooks),
 *            a stream source first calls restore on its own thread (retried
 *            while NATS does not answer; kvi_nats_restoring is true until
 *            it is done), seeds its order state from the snapshot and
 *            re-creates its consumer to deliver from the snapshot's
 *            sequence + 1 (DeliverByStartSequence) instead of the whole
 *            stream. Every every_ms once caught up, at a sequence boundary (after a
 *            fetched batch is applied and kvi_producer_flush returned, before
 *            the next fetch) it calls take with the last sequence applied
 *            and the order state: nothing is applied while take runs, so the
 *            snapshot is exact (the stream waits meanwhile).
 *   The payload form (envelope, JSON, msgpack) is detected per message;
 *   a message that does not decode is counted by reason and skipped (a
 *   JetStream one is acked, so it is not redelivered forever).
 *
 * WORKERS
 *   A (worker_id, dp_rank) appears with its first event: worker_id is
 *   interned as the index's numeric instance id (the same id space as the
 *   Dynamo registrations), dp_rank is its rank. kvi_nats_foreach_worker
 *   lists them; kvi_nats_forget_worker drops one worker's blocks on every
 *   rank and forgets it (it reappears with its next event).
 *
 * THREADS
 *   | call                                 | thread                          |
 *   |--------------------------------------|---------------------------------|
 *   | create, add_source, destroy          | control plane, one at a time    |
 *   | forget_worker                        | any thread but a source's or a  |
 *   |                                      | writer's (it waits for the      |
 *   |                                      | source thread)                  |
 *   | foreach_worker, source_info, conn_   | any thread (counters relaxed,   |
 *   | info, ready                          | approximate while running)      |
 *   Sources own their workers; readers take the source's mutex, which the
 *   source thread takes only when a worker appears or is forgotten.
 *
 * ERRORS
 *   int functions return 0 or a negative errno; create returns NULL with
 *   errno set. Strings passed in are copied.
 */
#ifndef KVI_NET_NATS_SOURCE_H
#define KVI_NET_NATS_SOURCE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"
#include "engine/index.h"
#include "engine/writer.h"
#include "net/decode_router.h"

#define KVI_NATS_DEFAULT_FETCH_BATCH 256u
#define KVI_NATS_DEFAULT_RECONNECT_WAIT_MS 100u
#define KVI_NATS_DEFAULT_PENDING_MSGS 1000000
#define KVI_NATS_DEFAULT_PENDING_BYTES ((int64_t)1 << 30)
#define KVI_NATS_NAME_MAX 256 /* bytes of a subject, stream, durable or label, NUL included */

/** One (worker_id, dp_rank)'s order state (SOURCES), as a snapshot keeps it. */
struct kvi_nats_order {
    uint64_t worker_id;
    uint32_t dp_rank;
    bool has_pub;           /* publisher_id known (envelope form) */
    uint64_t last_event_id;
    uint64_t publisher_id;
};

/** A stream source at a sequence boundary, handed to the snapshot hooks. */
struct kvi_nats_snap_point {
    uint32_t source;        /* source index */
    const char *stream, *label;
    const char *subject;    /* the filter subject as configured ("" = none: the stream's only one) */
    struct kvi_index *ix;
    uint64_t seq;           /* take: every message of the source up to this stream sequence is
                               applied (the producer flushed), none after it */
    const struct kvi_nats_order *order; /* take: the order state at seq */
    size_t n_order;
    struct kvi_producer *prod; /* the source thread's producer (submit, flush, dump) */
};

/** What a restore found (kvi_nats_snap_hooks.restore). */
struct kvi_nats_restore {
    uint64_t seq;           /* the snapshot's sequence; 0: none loaded, read the whole stream */
    struct kvi_nats_order *order; /* malloc'ed, the source takes it (NULL when n_order is 0) */
    size_t n_order;
    uint64_t blocks;        /* blocks it stored */
    bool failed;            /* a snapshot was there but did not load (it fell back to the stream) */
};

/** What a stored snapshot took (kvi_nats_snap_hooks.take). */
struct kvi_nats_snap_result {
    uint64_t raw_bytes, bytes;  /* blob uncompressed / compressed */
    uint64_t purged_below;      /* the stream was purged below this sequence (0: not purged) */
};

/**
 * Snapshots of stream sources (kvidxd --nats-snapshot). Both hooks run on
 * the source's thread, which applies nothing while they run: restore once
 * before its consumer is set up, take at a sequence boundary every
 * every_ms (when messages were applied since the last one).
 */
struct kvi_nats_snap_hooks {
    /**
     * Load the newest snapshot into p->ix through p->prod (p->seq is 0, no
     * order). @return 0 (@p out filled: seq 0 = read the whole stream), or
     * -EAGAIN (NATS not answering: the source retries with a backoff).
     */
    int (*restore)(void *ctx, const struct kvi_nats_snap_point *p, struct kvi_nats_restore *out);
    /** Store a snapshot of @p p. @return 0 (@p r filled), -ESTALE (a newer one is stored), or a negative errno. */
    int (*take)(void *ctx, const struct kvi_nats_snap_point *p, struct kvi_nats_snap_result *r);
    void *ctx;
    uint32_t every_ms;      /* period of take (0: never) */
};

struct kvi_nats_config {
    const char *servers;        /* "nats://host:4222[,nats://...]" (required) */
    const char *user, *password;/* optional */
    const char *token;          /* optional */
    const char *creds_file;     /* optional: a .creds file (JWT + nkey seed) */
    const char *tls_ca;         /* optional: CA file; makes the connection TLS */
    const char *name;           /* connection name shown by the server (optional) */
    const char *durable;        /* JetStream durable consumer name (required for stream
                                   sources; no '.', '*', '>' or spaces) */
    struct kvi_writer_pool *writers; /* required; outlives the plane */
    uint32_t fetch_batch;       /* JetStream fetch size; 0 = default */
    uint32_t reconnect_wait_ms; /* first reconnect delay; 0 = default */
    int pending_msgs;           /* core subscription pending limit; 0 = default */
    int64_t pending_bytes;      /* core subscription pending limit; 0 = default */
    const struct kvi_nats_snap_hooks *snap; /* stream sources' snapshots (NULL: none); outlives the plane */
};

enum kvi_nats_kind {
    KVI_NATS_CORE = 0,
    KVI_NATS_STREAM = 1,
};

struct kvi_nats_source_spec {
    enum kvi_nats_kind kind;
    const char *subject;  /* core: required; stream: filter subject or NULL */
    const char *stream;   /* stream: required */
    struct kvi_index *ix; /* the index its events go to; outlives the source */
    uint32_t block_size;  /* the index's block size (0 = the index's) */
    const char *label;    /* for logs and metrics, e.g. "model:tenant" (optional) */
};

/** Per-source counters: written by the source thread (relaxed), read anywhere. */
struct kvi_nats_counters {
    _Atomic uint64_t messages;      /* messages received */
    _Atomic uint64_t bytes;         /* payload bytes received */
    _Atomic uint64_t applied;       /* events handed to the writers */
    _Atomic uint64_t decode_errors[KVI_REV_ERR_COUNT]; /* by enum kvi_rev_err (index 0 unused) */
    _Atomic uint64_t forms[KVI_REVF_COUNT];            /* decoded messages by form */
    _Atomic uint64_t stale;         /* dropped: event_id not past the last applied */
    _Atomic uint64_t gaps;          /* event_id jumps */
    _Atomic uint64_t events_lost;   /* ids skipped by those jumps */
    _Atomic uint64_t restarts;      /* publisher restarts seen (order started over) */
    _Atomic uint64_t dropped;       /* core: messages the client dropped (slow consumer) */
    _Atomic uint64_t redelivered;   /* stream: messages delivered more than once */
    _Atomic uint64_t acked;         /* stream: messages acked */
    _Atomic uint64_t ack_ns_total;  /* stream: receipt-to-ack time, summed */
    _Atomic uint64_t pending;       /* stream: messages the consumer has not delivered yet */
    _Atomic uint64_t last_stream_seq; /* stream: last stream sequence delivered */
    _Atomic uint64_t consumer_errors; /* stream: consumer set-up / fetch failures */
    _Atomic uint64_t invalid;       /* decoded but unusable (a stored event placed at
                                       start_position > 0 without a parent) */
    /* stream, with snapshot hooks (struct kvi_nats_snap_hooks) */
    _Atomic uint64_t snap_written;  /* snapshots stored */
    _Atomic uint64_t snap_failed;   /* snapshots that could not be stored (retried next period) */
    _Atomic uint64_t snap_superseded; /* snapshots discarded: another replica stored a newer one */
    _Atomic uint64_t snap_seq;      /* stream sequence of the last snapshot stored, loaded, or found
                                       stored as new by another replica */
    _Atomic uint64_t snap_bytes;    /* the last stored snapshot, compressed */
    _Atomic uint64_t snap_raw_bytes;/* the last stored snapshot, uncompressed */
    _Atomic uint64_t snap_write_ms; /* the last snapshot's time, dump to manifest and purge */
    _Atomic uint64_t snap_loaded;   /* snapshots loaded at start-up */
    _Atomic uint64_t snap_load_fallbacks; /* start-ups that fell back to the whole stream */
    _Atomic uint64_t snap_load_ms;  /* the start-up load's time */
    _Atomic uint64_t snap_loaded_blocks; /* blocks the start-up snapshot stored */
    _Atomic uint64_t snap_purges;   /* stream purges after a snapshot */
    _Atomic uint64_t snap_purged_below; /* the stream was last purged below this sequence */
};

struct kvi_nats_source_info {
    enum kvi_nats_kind kind;
    char subject[KVI_NATS_NAME_MAX];
    char stream[KVI_NATS_NAME_MAX];
    char label[KVI_NATS_NAME_MAX];
    struct kvi_index *ix;
    bool caught_up;       /* stream: delivered the start-up last sequence (core: true) */
    bool restoring;       /* stream: loading its snapshot (hooks set, not done yet) */
    uint64_t start_last_seq; /* stream: the stream's last sequence at start-up */
    uint64_t workers;     /* (worker_id, dp_rank) pairs known */
    char last_error[256]; /* "" when none */
    const struct kvi_nats_counters *ctr; /* live counters (valid while the plane lives) */
};

struct kvi_nats_conn_info {
    bool connected;
    uint64_t reconnects;
    uint64_t disconnects;
    char url[KVI_NATS_NAME_MAX]; /* the server connected to ("" when none) */
};

/** One known (worker_id, dp_rank) of a source (kvi_nats_foreach_worker). */
struct kvi_nats_worker_view {
    uint32_t source;       /* source index */
    const char *subject;   /* the source's subject (or stream) */
    struct kvi_index *ix;
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t events;       /* events applied */
    uint64_t last_event_id;
    uint64_t age_ns;       /* since its last event */
};

struct kvi_nats;

/** Stop every source (unsubscribe, join), close the connection, free. NULL: no-op. */
void kvi_nats_destroy(struct kvi_nats *n);

/**
 * Create a plane and start connecting (in the background when no server
 * answers yet). @return the plane, or NULL with errno EINVAL (servers or
 * writers missing, a bad durable name, a URL libnats rejects), ENOMEM, or
 * EIO (libnats failed: logged).
 */
KVI_DEALLOC(kvi_nats_destroy, 1) KVI_WARN_UNUSED
struct kvi_nats *kvi_nats_create(const struct kvi_nats_config *cfg);

/**
 * Add a source and start its thread. @return its index (>= 0), or -EINVAL
 * (a bad spec: kind, missing subject or stream, a stream source without a
 * durable name in the config), -ENOMEM.
 */
int kvi_nats_add_source(struct kvi_nats *n, const struct kvi_nats_source_spec *spec) KVI_WARN_UNUSED;

/** Number of sources. Any thread. */
size_t kvi_nats_n_sources(const struct kvi_nats *n);

/** Snapshot of source @p i. @return 0 or -ENOENT. Any thread. */
int kvi_nats_source_info(struct kvi_nats *n, size_t i, struct kvi_nats_source_info *out);

/** Connection state. Any thread. */
void kvi_nats_conn_info(struct kvi_nats *n, struct kvi_nats_conn_info *out);

/**
 * Every stream source caught up with its start-up last sequence? When not,
 * @p pending (may be NULL) receives the messages still to deliver, summed.
 * Any thread.
 */
bool kvi_nats_ready(struct kvi_nats *n, uint64_t *pending);

/** Is a stream source still loading its start-up snapshot? Any thread. */
bool kvi_nats_restoring(struct kvi_nats *n);

/**
 * Call @p fn for every known (worker_id, dp_rank), source by source, with
 * that source's mutex held: @p fn must not call into the plane. Any thread.
 */
void kvi_nats_foreach_worker(struct kvi_nats *n, void (*fn)(void *ctx, const struct kvi_nats_worker_view *w),
                             void *ctx);

/**
 * Drop @p worker_id's blocks in @p ix on every rank and tier and forget it,
 * in every source feeding @p ix; waits until the sources' threads did it
 * and the writers applied it. @return 0, or -ENOENT when no source knows
 * that worker for that index. Not from a source or writer thread.
 */
int kvi_nats_forget_worker(struct kvi_nats *n, struct kvi_index *ix, uint64_t worker_id);

/** "core" / "stream". */
const char *kvi_nats_kind_name(enum kvi_nats_kind k);

#endif
