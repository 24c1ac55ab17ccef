/*
 * kvidxd slot-tracker service: the Dynamo standalone slot tracker
 * (../shared/reference/dynamo-standalone-slot-tracker.md, http-api.md §3)
 * served by kvidxd on a second HTTP port, replica synchronisation between
 * kvidxd instances over HTTP/2, and the indexer port's POST /route.
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
 *       mutation thread, and the answer is deferred (kvi_http_defer).
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
 *   Shutdown (kvi_slot_service_stop): stop the slot port (in-flight requests
 *   finish), let the mutation thread run what is queued and exit, stop the
 *   sender (a POST in flight may hold it up to --replica-sync-timeout-ms;
 *   past the deadline it is left behind and its memory is not freed).
 *
 *   | call                               | thread                             |
 *   |------------------------------------|------------------------------------|
 *   | args, usage, create, start, stop,  | main                               |
 *   | free, mount_route                  |                                    |
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

#include "api/json.h"
#include "api/service.h"
#include "engine/slots.h"
#include "net/http_server.h"

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
    /* from kvi_slot_service_args (the --slot-* and --replica-sync-* flags) */
    int32_t port;          /* KVI_SLOT_DEFAULT_PORT (8091), KVI_SLOT_PORT_OFF or _EPHEMERAL */
    bool port_explicit;    /* --slot-port given: a bind failure is fatal (else a warning) */
    const char *port_file; /* write the bound slot port here once listening, or NULL */
    unsigned http_threads; /* slot-port loop threads; 0 = the caller's default */
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
    const char *host;         /* bind address; NULL = "0.0.0.0" */
    size_t body_limit;        /* 0 = 2 MiB */
    const char *admin_token;  /* required on topology, peer, replica and test routes; NULL = open */
    bool admin_loopback_only; /* without admin_token: those routes answer 403 to non-loopback clients */
    const char *tls_cert;     /* PEM chain and key: HTTPS on the slot port too (kvidxd's --tls-cert,
                               * so its bearer tokens never travel in clear); NULL = plaintext */
    const char *tls_key;
    const char *data_token;   /* required on /add, /prefill_complete, /free and /route with commit (or
                               * the admin token); NULL = open */
    unsigned idle_timeout_ms; /* 0 = the server's default */
    unsigned max_connections; /* 0 = the server's default */
    /* The HTTP abuse limits (net/http_server.h "Limits"); set together, 0 = no limit.
     * kvi_slot_service_args leaves them at the HTTP layer's defaults. */
    unsigned max_conns_per_addr;
    unsigned h2_max_resets;
    size_t conn_output_limit;
    size_t output_limit;
    bool test_endpoints;      /* mount /test/advance_clock and /test/replica_sender */
};

/**
 * Take the slot-tracker flags out of @p argv (they are removed, so the
 * caller's own parser never sees them) and fill @p cfg's first block with
 * them or their defaults. Other fields of @p cfg are zeroed. Strings point
 * into @p argv. Prints the reason on stderr when a value is invalid.
 * @return 0, or -EINVAL (the daemon exits with status 2).
 */
int kvi_slot_service_args(int *argc, char **argv, struct kvi_slot_service_config *cfg);

/** Print the slot-tracker part of --help to @p f. */
void kvi_slot_service_usage(FILE *f);

struct kvi_slot_service;

/**
 * Create the service: the tracker, the queues and, when a slot port is
 * configured, its HTTP server (bound at once). Strings of @p cfg are copied.
 * A default port that cannot be bound only warns (the service then runs
 * without a slot port); an explicit one fails.
 * @return the service, or NULL with errno (EINVAL bad peer URL, or the
 *         server's bind error).
 */
struct kvi_slot_service *kvi_slot_service_create(const struct kvi_slot_service_config *cfg);

/**
 * Start the mutation thread, the sender (replica sync) and the slot port;
 * write the port file. @return 0 or a negative errno (threads already
 * started are stopped again by kvi_slot_service_stop).
 */
int kvi_slot_service_start(struct kvi_slot_service *s);

/** The bound slot port, 0 when there is none. Any thread. */
uint16_t kvi_slot_service_port(const struct kvi_slot_service *s);

/** Most entries in one GET /loads (ranks) or GET /workers (workers) answer (--slot-loads-page,
 *  defaulted; api/codec_slots.h PAGING). Any thread. */
uint32_t kvi_slot_service_loads_page(const struct kvi_slot_service *s);

/**
 * Stop (see Shutdown above): slot port, mutation thread (after the jobs
 * queued before), sender. Call after the indexer port has stopped, before it
 * is freed (a /route commit deferred there is completed by the mutation
 * thread). Idempotent.
 */
void kvi_slot_service_stop(struct kvi_slot_service *s);

/** Free the service (after stop, or without start). NULL is a no-op. */
void kvi_slot_service_free(struct kvi_slot_service *s);

/**
 * Mount POST /route (api/route_route.c) on the indexer port @p srv, which
 * has @p n_threads loop threads; indexes come from @p svc. Before @p srv
 * starts. @return 0 or the negative error of kvi_http_server_route.
 */
int kvi_slot_service_mount_route(struct kvi_slot_service *s, struct kvi_http_server *srv, struct kvi_service *svc,
                                 unsigned n_threads, size_t body_limit);

/* ---- shared by api/slot_service.c, api/routes_slots.c and api/route_route.c ------------------ */

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
