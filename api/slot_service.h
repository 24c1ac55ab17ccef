/*
 * kvidxd slot-tracker service: the state and the threads behind the Dynamo
 * standalone slot tracker (../shared/reference/dynamo-standalone-slot-tracker.md,
 * http-api.md §3) that kvidxd serves on a second HTTP port, replica
 * synchronisation between kvidxd instances over HTTP/2, and the tracker
 * side of the indexer port's POST /route. The service owns no HTTP server
 * and mounts no routes: kvidxd (api/kvidxd.c) creates the slot port's server
 * and its route table (api/routes_slots.h) and mounts POST /route
 * (api/route_route.h) on the indexer port, as siblings of this service, as
 * it does for the indexer's service (api/service.h) and routes
 * (api/routes_common.h). The handlers call the operations below back.
 *
 * DESIGN
 *   State. One engine/slots.h registry (struct kvi_slots) per process. Its
 *   clock is CLOCK_MONOTONIC plus a test offset (POST /test/advance_clock).
 *
 *   Threads.
 *     - Slot-port loop threads (net/http_server.h, --slot-http-threads) run
 *       the handlers of api/routes_slots.c. Reads (/workers, /loads,
 *       /potential_loads) run inline inside an RCU read section. Bodies of
 *       writes are parsed inline too (errors answer at once); the parsed
 *       request is then packed into one allocation and posted to the
 *       mutation thread (kvi_slot_service_post), and the answer is deferred
 *       (kvi_http_defer).
 *     - One mutation thread runs every tracker write in the order it was
 *       posted: /register, /unregister, /add, /prefill_complete, /free,
 *       replica batches, /route commits, and the stale-request cleanup
 *       (kvi_slots_expire once per second). Engine writes may wait for an
 *       RCU grace period; measured with two busy readers on this 2-vCPU VM
 *       an /add + /free took 3.4 us at p50 but 8 ms at p99.9 and 50 ms at
 *       worst (grace periods), so they never run on a loop thread. Because
 *       it is the tracker's only writer, a /route commit (read the loads,
 *       choose, add) is atomic with respect to every other tracker write.
 *     - One sender thread (replica sync enabled) drains the outbound event
 *       queue and POSTs batches to every peer (net/http_client.h, h2c with
 *       prior knowledge, one connection per batch: Debian's libcurl cannot
 *       reuse those).
 *   Queues.
 *     - Jobs: a mutex-protected FIFO (loop threads -> mutation thread); the
 *       mutation thread sleeps on a condition variable until a job arrives
 *       or the next cleanup tick is due.
 *     - Outbound replica events: a bounded single-producer single-consumer
 *       ring of encoded events. The producer is the tracker's on_event hook,
 *       which only the mutation thread triggers; a full ring drops the event
 *       and counts it (never blocks). The sender sleeps on a futex and is
 *       woken only when it said it would sleep.
 *   Replica sync (kvidx deviation: HTTP/2 instead of ZMQ). Each local add,
 *   prefill_complete and free that changed state becomes an event; the
 *   sender POSTs batches as application/msgpack to {peer}/replica/events.
 *   Peers apply them with kvi_slots_apply_replica (never creating trackers
 *   or workers; unknown model/tenant/block size/worker/rank dropped and
 *   counted). Best effort: no acknowledgement, replay or snapshot; a peer
 *   that fails is skipped (its batches dropped and counted) for a backoff
 *   of 100 ms doubling up to 5 s. Every batch carries this process's random
 *   replica id; a replica drops batches carrying its own id.
 *   Startup (kvidxd): create the service, then the slot port's routes and
 *   server (bound at once), mount POST /route on the indexer port; start the
 *   slot port, then the service (a write posted before start waits for
 *   it), then the indexer port.
 *   Shutdown: kvidxd stops the indexer port and the slot port (in-flight
 *   requests finish), then kvi_slot_service_stop lets the mutation thread
 *   run what is queued (completing the deferred answers of both ports) and
 *   exit, and stops the sender (a POST in flight may hold it up to
 *   --replica-sync-timeout-ms; past the deadline it is left behind and its
 *   memory is not freed).
 *
 *   | call                               | thread                             |
 *   |------------------------------------|------------------------------------|
 *   | args, usage, create, start, stop,  | main                               |
 *   | free                               |                                    |
 *   | post, slots, peers_*, sync_*,      | any                                |
 *   | clock_*, sender_pause, stats       |                                    |
 *   | functions given to post            | run on the mutation thread (a      |
 *   |                                    | registered RCU reader, outside any |
 *   |                                    | read section)                      |
 */
#ifndef KVI_API_SLOT_SERVICE_H
#define KVI_API_SLOT_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "net/body.h"
#include "engine/slots.h"
#include "net/http_server.h"
#include "engine/common.h"

/** --slot-port values besides a port number. */
#define KVI_SLOT_PORT_OFF 0        /* no slot port (the tracker still serves /route) */
#define KVI_SLOT_PORT_EPHEMERAL -1 /* --slot-port auto: a free port (see --slot-port-file) */

/** Replica-sync defaults. */
#define KVI_SLOT_SYNC_QUEUE 65536u  /* outbound events buffered before drops */
#define KVI_SLOT_SYNC_BATCH 1024u   /* events per POST */
#define KVI_SLOT_SYNC_TIMEOUT_MS 1000u
/** The kvidx replica-sync route on the slot port. */
#define KVI_SLOT_SYNC_PATH "/replica/events"

struct kvi_slot_service_config {
    /* from kvi_slot_service_args (the --replica-sync-* and --slot-max-* flags) */
    bool sync;             /* replica sync enabled */
    const char *peers;     /* comma-separated peer base URLs (http://host:port), or NULL */
    const char *advertise; /* this replica's own base URL (refused as a peer), or NULL */
    uint32_t sync_queue;   /* 0 = KVI_SLOT_SYNC_QUEUE (rounded up to a power of two) */
    uint32_t sync_batch;   /* 0 = KVI_SLOT_SYNC_BATCH */
    uint32_t sync_timeout_ms; /* per POST; 0 = KVI_SLOT_SYNC_TIMEOUT_MS */
    uint32_t max_models;   /* --slot-max-models: trackers; 0 = KVI_SLOTS_MAX_TRACKERS (1024) */
    uint32_t max_dp_size;  /* --slot-max-dp-size: per /register; 0 = KVI_SLOTS_MAX_DP_SIZE (1024) */
    uint32_t max_ranks;    /* --slot-max-ranks: per tracker; 0 = KVI_SLOTS_MAX_RANKS (65536) */
    uint32_t loads_page;   /* --slot-loads-page: ranks per /loads, workers per /workers answer;
                            * 0 = KVI_SLOT_LOADS_PAGE */
    /* set by kvidxd from its own flags */
    const char *admin_token; /* sent to peers as the bearer token of replica batches; also admits a
                              * /route commit; NULL or "" = none */
    const char *data_token;  /* required on /route with commit (or the admin token); NULL or "" = open
                              * (the slot port's server checks it on /add, /prefill_complete, /free) */
};

/**
 * The slot port's flags, taken out of argv with the service's own. The
 * service does not read them: kvidxd creates the slot port from them.
 */
struct kvi_slot_port_flags {
    int32_t port;          /* --slot-port: KVI_SLOT_DEFAULT_PORT (8091), KVI_SLOT_PORT_OFF or _EPHEMERAL */
    bool port_explicit;    /* --slot-port given: a bind failure is fatal (else a warning) */
    const char *port_file; /* --slot-port-file: write the bound slot port here once listening, or NULL */
    unsigned http_threads; /* --slot-http-threads: slot-port loop threads; 0 = the caller's default */
};

/**
 * Take the slot-tracker flags out of @p argv (they are removed, so the
 * caller's own parser never sees them) and fill @p cfg's first block and
 * @p port with them or their defaults. Other fields of @p cfg are zeroed.
 * Strings point into @p argv. Prints the reason on stderr when a value is
 * invalid. Main thread.
 * @return 0, or -EINVAL (the daemon exits with status 2).
 */
int kvi_slot_service_args(int *argc, char **argv, struct kvi_slot_service_config *cfg,
                          struct kvi_slot_port_flags *port);

/** Print the slot-tracker part of --help to @p f. Main thread. */
void kvi_slot_service_usage(FILE *f);

struct kvi_slot_service;

/**
 * Free the service (main thread; after stop, or without start: it stops
 * first). Jobs posted but never run (the mutation thread never started) run
 * here with stopping = true, so free it before the servers their answers
 * were deferred on. NULL is a no-op.
 */
void kvi_slot_service_free(struct kvi_slot_service *s);

/**
 * Create the service: the tracker, the queues and the peer list (strings of
 * @p cfg are copied). No thread starts yet. Main thread.
 * @return the service (free with kvi_slot_service_free), or NULL with errno
 *         EINVAL (a bad --replica-sync-peers or --replica-sync-advertise
 *         URL, logged) or ENOMEM.
 */
KVI_DEALLOC(kvi_slot_service_free, 1) KVI_WARN_UNUSED
struct kvi_slot_service *kvi_slot_service_create(const struct kvi_slot_service_config *cfg);

/**
 * Start the mutation thread and, with replica sync, the sender; log the
 * replica-sync line. Main thread, once. Jobs posted before wait for it.
 * @return 0 or a negative errno from pthread_create (threads already
 *         started are stopped again by kvi_slot_service_stop or _free).
 */
int kvi_slot_service_start(struct kvi_slot_service *s);

/** Most entries in one GET /loads (ranks) or GET /workers (workers) answer (--slot-loads-page,
 *  defaulted; api/codec_slots.h PAGING). Any thread. */
uint32_t kvi_slot_service_loads_page(const struct kvi_slot_service *s);

/**
 * Stop (see Shutdown above): the mutation thread (after running the jobs
 * queued before), then the sender. Main thread. Call after the indexer port
 * and the slot port have stopped and before they are freed: the mutation
 * thread completes answers deferred on either (slot writes, /route
 * commits). Idempotent; a no-op before start.
 */
void kvi_slot_service_stop(struct kvi_slot_service *s);

/* ---- operations the routes call (api/routes_slots.c, api/route_route.c) ------------------------ */

/** The tracker. Any thread (reads inside RCU sections; writes on the mutation thread only). */
struct kvi_slots *kvi_slot_service_slots(const struct kvi_slot_service *s);

/** A unit of work for the mutation thread; embed it first in the caller's allocation. */
struct kvi_slot_job {
    struct kvi_slot_job *_next;
    /** Runs on the mutation thread and owns @p j (frees it). @p stopping: the
     *  service is shutting down (answer 503 instead of doing the work). */
    void (*fn)(struct kvi_slot_service *s, struct kvi_slot_job *j, bool stopping);
};

/**
 * Queue @p j for the mutation thread, after everything posted before. Any
 * thread. Jobs posted before start wait for it; jobs still queued when the
 * thread exits run with stopping = true.
 * @return 0, or -ESHUTDOWN once the thread has exited (the caller keeps @p j).
 */
int kvi_slot_service_post(struct kvi_slot_service *s, struct kvi_slot_job *j);

/** Whether a /route with "commit": true carries the data token (or the admin token) when one is set. Any thread. */
bool kvi_slot_service_commit_allowed(const struct kvi_slot_service *s, const struct kvi_http_req *req);

/** Whether replica sync is enabled. */
bool kvi_slot_service_sync_enabled(const struct kvi_slot_service *s);

/**
 * POST /register_peer: add a peer base URL (http:// or https://, a trailing
 * '/' dropped). @return 1 added, 0 already known, -ENOTSUP sync disabled,
 * -EINVAL not an http(s) URL (@p why set), -EEXIST the advertised URL of
 * this replica itself.
 */
int kvi_slot_service_peer_add(struct kvi_slot_service *s, const char *url, size_t len, const char **why);

/** POST /deregister_peer. @return 0, -ENOENT unknown, -ENOTSUP sync disabled. */
int kvi_slot_service_peer_remove(struct kvi_slot_service *s, const char *url, size_t len);

/** GET /peers body: the sorted URLs ([] when sync is disabled). @return 0 or -ENOMEM. */
int kvi_slot_service_encode_peers(struct kvi_slot_service *s, struct kvi_buf *out);

/** This process's replica id (random, nonzero). */
uint64_t kvi_slot_service_replica_id(const struct kvi_slot_service *s);

/** The tracker's clock (ns; CLOCK_MONOTONIC plus the test offset). */
uint64_t kvi_slot_service_now(const struct kvi_slot_service *s);

/** Move the tracker's clock forward by @p ns (test route). */
void kvi_slot_service_clock_advance(struct kvi_slot_service *s, uint64_t ns);

/** Stop or resume draining the outbound queue (test route: fills it on purpose). */
void kvi_slot_service_sender_pause(struct kvi_slot_service *s, bool paused);

/** Count a received replica batch: @p applied and @p dropped events, @p self from this replica. */
void kvi_slot_service_count_received(struct kvi_slot_service *s, uint64_t applied, uint64_t dropped, bool self);

/** Counters of the service (monotonic unless marked as gauges). */
struct kvi_slot_service_stats {
    uint64_t jobs;             /* run by the mutation thread */
    uint64_t job_queue;        /* gauge: jobs waiting */
    uint64_t expire_runs;      /* cleanup ticks */
    uint64_t sync_queued;      /* events put in the outbound queue */
    uint64_t sync_queue_full;  /* events dropped: queue full */
    uint64_t sync_queue_depth; /* gauge */
    uint64_t sync_batches;     /* batches sent and answered 2xx (per peer) */
    uint64_t sync_events;      /* events in those batches */
    uint64_t sync_errors;      /* failed POSTs */
    uint64_t sync_dropped;     /* events not delivered to a peer (failed POST or backoff) */
    uint64_t sync_peers;       /* gauge */
    uint64_t recv_batches;     /* replica batches received */
    uint64_t recv_applied;     /* events applied */
    uint64_t recv_dropped;     /* events dropped (engine rules or own replica id) */
    uint64_t recv_self;        /* batches carrying this replica's id */
    uint64_t route_requests;   /* POST /route answered */
    uint64_t route_commits;    /* /route commits recorded */
};

/** Snapshot of the counters. Any thread. */
void kvi_slot_service_stats(const struct kvi_slot_service *s, struct kvi_slot_service_stats *out);

/** Count an answered /route (@p committed: an /add was recorded). Any thread. */
void kvi_slot_service_count_route(struct kvi_slot_service *s, bool committed);

#endif
