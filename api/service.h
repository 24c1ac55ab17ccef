/*
 * kvidxd service state: the namespace registry and its indexes, the writer
 * pool, the ZMQ listener pool, the workers table (Dynamo instances and
 * Conductor services), the peer list, readiness, and the control thread.
 *
 * DESIGN
 *   Threads.
 *     - HTTP loop threads (net/http_server.h) run the route handlers. Queries
 *       run inline inside an RCU read section: they find the namespace in the
 *       registry (kvi_nsreg_find) or the Conductor context in the published
 *       context view (kvi_service_cond_find), then query the index. They
 *       never take a lock of this module.
 *     - One control thread owns a writer-pool producer and runs every
 *       mutation in arrival order: registrations, unregistrations, listener
 *       pause / resume, /dump (kvi_producer_dump needs a producer, which a
 *       loop thread must not own), the startup sequence and P2P recovery.
 *       Handlers hand work to it with kvi_service_post and answer through
 *       kvi_http_defer / kvi_http_complete. Because it is the only thread
 *       that adds or deletes namespaces and table entries, it reads the
 *       tables without locking; it writes them under `mu`.
 *     - Writer threads (engine/writer.h) apply ops; listener threads
 *       (net/listener.h) feed them.
 *   Tables. Workers, services, namespace records and peers are guarded by
 *   one mutex, taken by the control thread when it writes and by non-query
 *   GET handlers (/workers, /status, /services, /global_view, /metrics) when
 *   they read. The Conductor query roster (which instances and ranks a
 *   context lists, zeros included) is an immutable snapshot published with
 *   RCU and replaced on every Conductor registration change; the old one is
 *   freed after a grace period.
 *   Namespaces. One kvi_index per registry key (model, tenant), created by the
 *   first registration with its block size and deleted when the last
 *   registration under it goes. A Conductor context whose block size differs
 *   from an existing namespace of the same (model, tenant) lives under the
 *   registry key ("<model>#bs=<N>", tenant) (http-api.md §0: internally
 *   (model, tenant, block_size)); /dump shows that key.
 *   Startup (newer Dynamo order, http-api.md §1.2): HTTP binds first; the
 *   control thread registers --workers (listeners pending: the pool is gated),
 *   runs P2P recovery when peers are configured, then opens the gate once the
 *   minimum number of instances is registered.
 *   Shutdown: kvi_service_begin_stop (cuts recovery short), stop HTTP,
 *   kvi_service_stop (the control thread completes what is queued with 503),
 *   kvi_service_destroy.
 *
 *   | call                                   | thread                          |
 *   |----------------------------------------|---------------------------------|
 *   | create, start, stop, destroy           | main                            |
 *   | begin_stop, post                       | any                             |
 *   | kvi_service_ctl_*                      | the control thread (posted fns) |
 *   | nsreg, cond_find                       | RCU readers in a read section   |
 *   | encode_*, status, peers_*, counts      | any (take `mu` briefly);        |
 *   |                                        | encode_global_view: registered  |
 *   |                                        | RCU readers (not in a section)  |
 */
#ifndef KVI_API_SERVICE_H
#define KVI_API_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/codec.h"
#include "api/codec_dump.h"
#include "engine/namespace.h"
#include "engine/writer.h"
#include "net/endpoint.h"
#include "net/listener.h"

/** Defaults of kvidxd's command line. */
#define KVI_SVC_DEFAULT_WRITERS 4
#define KVI_SVC_DEFAULT_RECOVERY_DELAY_MS 1000
#define KVI_SVC_DEFAULT_RECOVERY_TIMEOUT_MS 10000

struct kvi_service_config {
    uint32_t writer_threads;      /* partitions per index = writer threads; 0 = 4 */
    uint32_t listener_threads;    /* 0 = the listener pool's default */
    uint32_t ring_capacity;       /* per (producer, writer) ring; 0 = writer default */
    uint64_t min_initial_workers; /* DYN_ROUTER_MIN_INITIAL_WORKERS; 0 = no gate */
    /* --workers, registered at startup under (model_name, tenant_id, block_size) */
    const struct kvi_worker_spec *workers;
    size_t n_workers;
    uint32_t block_size;
    const char *model_name; /* NULL = "default" */
    const char *tenant_id;  /* NULL = "default" */
    /* --peers: P2P recovery at startup, in this order */
    const char *const *peers;
    size_t n_peers;
    uint32_t recovery_delay_ms;   /* wait before fetching; 0 = none (see create) */
    uint32_t recovery_timeout_ms; /* per peer fetch; 0 = KVI_SVC_DEFAULT_RECOVERY_TIMEOUT_MS */
    bool listeners_quiet;         /* listener pool prints no warnings */
};

/** P2P recovery outcome (/status "recovery"). */
enum kvi_recovery_result {
    KVI_RECOVERY_NONE = 0,        /* not finished (or not configured) */
    KVI_RECOVERY_SUCCEEDED,
    KVI_RECOVERY_NO_REACHABLE_PEERS,
    KVI_RECOVERY_FAILED,
};

/** "succeeded", "no_reachable_peers", "failed"; NULL for NONE. */
const char *kvi_recovery_result_name(enum kvi_recovery_result r);

struct kvi_service;

/**
 * Create the service: registry, writer pool and gated listener pool (strings
 * of @p cfg are copied). Nothing is registered until kvi_service_start.
 * @return the service, or NULL with errno (EINVAL bad counts, ENOMEM, or the
 *         error of a pool constructor).
 */
struct kvi_service *kvi_service_create(const struct kvi_service_config *cfg);

/**
 * Start the control thread; it runs the startup sequence (--workers, P2P
 * recovery, the minimum-workers gate) in the background.
 * @return 0 or -errno from pthread_create.
 */
int kvi_service_start(struct kvi_service *svc);

/** Ask the control thread to cut long work short (recovery). Any thread; idempotent. */
void kvi_service_begin_stop(struct kvi_service *svc);

/**
 * Stop the control thread after it has run every posted function (each sees
 * kvi_service_stopping() true) and destroyed its producer. Main thread.
 * @param wait_ms  how long to wait for it (0 = as long as it takes)
 * @return 0, or -ETIMEDOUT when it is still busy after @p wait_ms (a posted
 *         function that did not return; a peer fetch of recovery stops within
 *         ~50 ms of kvi_service_begin_stop): the caller must then not destroy
 *         the service (exit the process).
 */
int kvi_service_stop(struct kvi_service *svc, uint32_t wait_ms);

/** Destroy the listener pool, the writer pool and the registry. After a successful stop. */
void kvi_service_destroy(struct kvi_service *svc);

/** Whether shutdown has begun. Any thread. */
bool kvi_service_stopping(const struct kvi_service *svc);

/**
 * Run @p fn(svc, arg) on the control thread, after everything posted before
 * (posts made before kvi_service_start wait for it). @p arg is malloc'd;
 * @p fn owns it (a service destroyed without being started frees it).
 * @return 0, or -ESHUTDOWN once the control thread has stopped (fn is not
 *         called; the caller keeps @p arg).
 */
int kvi_service_post(struct kvi_service *svc, void (*fn)(struct kvi_service *svc, void *arg), void *arg);

/* ---- read side: HTTP loop threads --------------------------------------------- */

/** The namespace registry (kvi_nsreg_find / list inside an RCU read section). */
struct kvi_nsreg *kvi_service_nsreg(const struct kvi_service *svc);

/** One Conductor instance of a context: its registered ranks, ascending. */
struct kvi_svc_cond_inst {
    const char *name;
    uint32_t dense; /* dense id in the context's index */
    uint32_t n_ranks;
    const uint32_t *ranks;
};

/** A Conductor context (tenant, model, lora_name, block_size) and its roster. */
struct kvi_svc_cond_ctx {
    const char *model;
    const char *tenant;
    const char *lora;
    uint32_t block_size;
    struct kvi_ns *ns;
    size_t n_inst; /* ascending by name; storage pools (type Mooncake) excluded */
    const struct kvi_svc_cond_inst *inst;
};

/**
 * Find a Conductor context. Call inside an RCU read-side section; the result
 * stays valid until the section ends.
 * @return the context, or NULL when nothing is registered under it.
 */
const struct kvi_svc_cond_ctx *kvi_service_cond_find(const struct kvi_service *svc, struct kvi_str model,
                                                     struct kvi_str tenant, struct kvi_str lora,
                                                     uint32_t block_size);

/** Readiness (http-api.md §1.12). Any thread. */
void kvi_service_status(struct kvi_service *svc, struct kvi_status_view *out);

/** GET /workers body (§1.7), sorted by instance id; ranks ascending. Any thread. */
int kvi_service_encode_workers(struct kvi_service *svc, const struct kvi_dyn_workers_filter *f,
                               struct kvi_buf *out);
/** GET /services body (§2.7), sorted by (instance, tenant, rank). Any thread. */
int kvi_service_encode_services(struct kvi_service *svc, enum kvi_body_enc enc, struct kvi_buf *out);
/** GET /global_view body (§2.6). A registered RCU reader thread, outside a read section. */
int kvi_service_encode_global_view(struct kvi_service *svc, enum kvi_body_enc enc, struct kvi_buf *out);

/** Add a peer URL (idempotent). Any thread. */
void kvi_service_peer_add(struct kvi_service *svc, const char *url, size_t len);
/** Remove a peer URL. @return 0 or -ENOENT. Any thread. */
int kvi_service_peer_remove(struct kvi_service *svc, const char *url, size_t len);
/** GET /peers body. Any thread. */
int kvi_service_encode_peers(struct kvi_service *svc, struct kvi_buf *out);

/** Counts for the gauges. Any thread. */
struct kvi_service_counts {
    uint64_t models;      /* namespaces in the registry */
    uint64_t workers;     /* registered instances (Dynamo instances + Conductor instances) */
    uint64_t services;    /* Conductor service keys */
    uint64_t peers;
};
void kvi_service_counts(struct kvi_service *svc, struct kvi_service_counts *out);

/** The pools, for /metrics (their stats calls are any-thread). */
struct kvi_listeners *kvi_service_listeners(const struct kvi_service *svc);
struct kvi_writer_pool *kvi_service_writers(const struct kvi_service *svc);

/** Recovery figures for /metrics. */
struct kvi_recovery_stats {
    uint64_t attempts;     /* peer fetches started */
    uint64_t blocks;       /* blocks applied by the successful attempt */
    uint64_t rejected;     /* blocks the index rejected (unknown parent, invalid) */
    uint64_t duration_ms;  /* of the whole recovery */
};
void kvi_service_recovery_stats(struct kvi_service *svc, struct kvi_recovery_stats *out);

/* ---- control thread (inside functions given to kvi_service_post) ------------------ */

/**
 * POST /register, Dynamo (§1.5). @return 0 (201), or -EINVAL with @p err
 * filled: 400 bad endpoint, 409 with the §1.5 texts, 500.
 */
int kvi_service_ctl_dyn_register(struct kvi_service *svc, const struct kvi_dyn_register *r,
                                 struct kvi_api_err *err);
/** POST /unregister, Dynamo (§1.6). @return 0, or -EINVAL with err (404 texts). */
int kvi_service_ctl_dyn_unregister(struct kvi_service *svc, const struct kvi_dyn_unregister *r,
                                   struct kvi_api_err *err);
/** /test/pause_listener (pause) or /test/resume_listener (§1.14). @return 0 or -EINVAL (404, 409). */
int kvi_service_ctl_listener(struct kvi_service *svc, const struct kvi_dyn_listener_ctl *r, bool pause,
                             struct kvi_api_err *err);
/** POST /register, Conductor (§2.2). @return 0 (200), or -EINVAL with err (400, 500). */
int kvi_service_ctl_cond_register(struct kvi_service *svc, const struct kvi_cond_register *r,
                                  struct kvi_api_err *err);
/**
 * POST /unregister, Conductor (§2.3). @param removed  receives the removed key
 * (strings point into @p r). @return 0, or -EINVAL with err (404).
 */
int kvi_service_ctl_cond_unregister(struct kvi_service *svc, const struct kvi_cond_unregister *r,
                                    struct kvi_cond_key *removed, struct kvi_api_err *err);

/**
 * GET /dump (§1.11): encode every namespace through the writers (one
 * consistent snapshot per partition), handing bytes to @p sink as they are
 * produced. @return 0, -ENOMEM or the sink's error.
 */
int kvi_service_ctl_dump(struct kvi_service *svc, kvi_dump_sink_fn sink, void *sink_ctx);

/**
 * Sleep up to @p ms on the control thread, waking early when shutdown begins.
 * @return false when shutdown has begun.
 */
bool kvi_service_ctl_wait(struct kvi_service *svc, uint32_t ms);

/** The control thread's producer (ops for recovery). */
struct kvi_producer *kvi_service_ctl_producer(struct kvi_service *svc);

/**
 * Find or create namespace (model, tenant) for recovery. A block size that
 * differs from the existing namespace's only warns (the existing one is
 * kept, as Dynamo does). @param created  set when the namespace is new.
 * @return the namespace or NULL (ENOMEM / EINVAL for an empty model).
 */
struct kvi_ns *kvi_service_ctl_ns_get(struct kvi_service *svc, const char *model, const char *tenant,
                                      uint32_t block_size, bool *created);
/**
 * Delete namespace @p ns if no registration uses it (recovery rollback):
 * unlink, make the writers forget it, free it. @return true when deleted.
 */
bool kvi_service_ctl_ns_drop_unused(struct kvi_service *svc, struct kvi_ns *ns);

#endif
