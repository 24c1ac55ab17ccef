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
 *       pause / resume, the startup sequence and P2P recovery. Handlers
 *       hand work to it with kvi_service_post and answer through
 *       kvi_http_defer / kvi_http_complete. Because it is the only thread
 *       that adds or deletes namespaces and table entries, it reads the
 *       tables without locking; it writes them under `mu`. It never waits
 *       for an HTTP client.
 *     - Dump threads (api/dump_pool.h: up to KVI_SVC_DUMP_THREADS, started
 *       on demand) serve /dump (kvi_service_dump: the control thread hands
 *       each dump to them in its turn), each with its own writer-pool
 *       producer (kvi_producer_dump_partition needs one, which a loop thread
 *       must not own). Per namespace and partition, the partition's writer
 *       encodes its blocks into the dump's spool (memory) and returns to its
 *       events; the dump thread then hands the spool to the sink, which may
 *       block on a slow client: that holds this dump only, never a writer,
 *       the control thread or another dump. More dumps than threads wait in
 *       a queue, in arrival order.
 *     - Writer threads (engine/writer.h) apply ops; listener threads
 *       (net/listener.h) feed them.
 *   Tables. Workers, services, namespace records and peers are guarded by
 *   one mutex, taken by the control thread when it writes and by non-query
 *   GET handlers (/workers, /status, /services, /global_view, /metrics) when
 *   they read. The Conductor query roster (which instances and ranks a
 *   context lists, zeros included) is an immutable snapshot published with
 *   RCU and replaced on every registration change of either dialect (a
 *   context lists Dynamo instances too: each namespace's Dynamo roster is
 *   rebuilt alone and shared by the views until it changes). Replaced views
 *   and rosters are freed after one grace period once the control queue is
 *   empty, so a burst of registrations waits for one grace period, not one
 *   each; a namespace is freed only after kvi_nsreg_unlink's own grace
 *   period, which covers every view published before it.
 *   Namespaces. One kvi_index per registry key (model, tenant), created by the
 *   first registration with its block size and deleted when the last
 *   registration under it goes. A Conductor context whose block size differs
 *   from an existing namespace of the same (model, tenant) lives under the
 *   registry key ("<model>#bs=<N>", tenant) (http-api.md §0: internally
 *   (model, tenant, block_size)); /dump shows that key. A dump pins the
 *   namespaces it listed until it has dumped each; deleting a pinned
 *   namespace unlinks it and makes the writers forget it at once, and the
 *   last dump holding it frees it (the control thread does not wait).
 *   Startup (newer Dynamo order, http-api.md §1.2): HTTP binds first; the
 *   control thread registers --workers (listeners pending: the pool is gated),
 *   runs P2P recovery when peers are configured, then opens the gate once the
 *   minimum number of instances is registered.
 *   Shutdown: kvi_service_begin_stop (cuts recovery short), stop HTTP (its
 *   streams are cut, so a dump's sink fails at once), kvi_service_stop (the
 *   control thread completes what is queued with 503; dump threads finish
 *   or fail what is queued and exit), kvi_service_destroy.
 *   Recovery (api/recovery.h) is a client of this module: the control thread
 *   runs kvi_recovery_run at startup, which works through the
 *   kvi_service_ctl_* calls below; its outcome, figures and their types are
 *   declared there, not here.
 *   Files: api/service.c ties the rest together (the object, the control
 *   thread, start / stop, readiness, /dump, startup); api/service_dynamo.c,
 *   service_conductor.c, service_ns.c and service_peers.c hold the tables
 *   and their mutations, api/service_roster.c the published roster; what
 *   they share is api/service_internal.h.
 *
 *   | call                                   | thread                          |
 *   |----------------------------------------|---------------------------------|
 *   | create, start, stop, destroy           | main                            |
 *   | begin_stop, post, dump                 | any                             |
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
#include "api/dump_pool.h"
#include "engine/namespace.h"
#include "engine/writer.h"
#include "net/endpoint.h"
#include "net/listener.h"
#include "net/nats_source.h"
#include "engine/common.h"

struct kvi_nats_args;

/** At most this many /dump requests are served at once (one dump thread each). */
#define KVI_SVC_DUMP_THREADS 4

/** Defaults of kvidxd's command line. */
#define KVI_SVC_DEFAULT_WRITERS 4
#define KVI_SVC_DEFAULT_RECOVERY_DELAY_MS 1000
#define KVI_SVC_DEFAULT_RECOVERY_TIMEOUT_MS 10000
#define KVI_SVC_DEFAULT_MAX_MODELS 1024

/** One --zmq-bind ENDPOINT[=BLOCK_SIZE]. */
struct kvi_zbind_arg {
    const char *endpoint;
    uint32_t block_size; /* 0 = each model's from its first BlockStored (or its namespace's) */
};

/* capacity_blocks of POST /register pre-sizes at most this many entries per partition and
 * blocks per slot map (--capacity-max-blocks; api/service_capacity.c) */
#define KVI_SVC_DEFAULT_CAPACITY_MAX_BLOCKS (1ull << 22)
#define KVI_SVC_CAPACITY_OFF UINT64_MAX /* --capacity-max-blocks 0: capacity_blocks pre-sizes nothing */

/** Pre-sizing from capacity_blocks (kvi_service_capacity_counters). */
struct kvi_capacity_counters {
    uint64_t reserved_entries; /* prefix entries the partitions are pre-sized for now, all namespaces */
    uint64_t reserved_blocks;  /* blocks the registered ranks' slot maps are pre-sized for now */
    uint64_t reservations;     /* registrations with capacity_blocks applied */
    uint64_t capped;           /* of them, cut to --capacity-max-blocks */
};

#define KVI_SVC_MAX_ZBINDS 16 /* --zmq-bind and POST /zmq/bind endpoints, open or closed */
#define KVI_SVC_DEFAULT_ZBIND_MAX_PODS 4096
#define KVI_SVC_DEFAULT_ZBIND_IDLE_S 600

/** Counters of the --zmq-bind endpoints, over all of them (kvi_service_zbind_counters). */
struct kvi_zbind_counters {
    uint64_t pods;            /* pods registered now */
    uint64_t pods_created;    /* pods registered on their first message */
    uint64_t pods_forgotten;  /* pods dropped after --zmq-bind-idle-s without a message */
    uint64_t bad_topic;       /* messages whose topic is not kv@<pod>@<model>: dropped */
    uint64_t pods_refused;    /* messages of a new pod past the per-endpoint bound, or whose
                                 namespace or registration could not be made: dropped */
    uint64_t no_block_size;   /* first messages of a new model without a BlockStored (and no flag): dropped */
    uint64_t endpoints_open;  /* bind endpoints open now (--zmq-bind and POST /zmq/bind) */
    uint64_t endpoints_refused; /* POST /zmq/bind answered 429: KVI_SVC_MAX_ZBINDS endpoints known */
};


struct kvi_service_config {
    uint32_t writer_threads;      /* partitions per index = writer threads; 0 = 4 */
    uint32_t listener_threads;    /* 0 = the listener pool's default */
    uint32_t replay_timeout_ms;   /* a replay without progress this long is given up; 0 = 5 s */
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
    /* --max-models: namespaces (model x tenant) that may exist; a registration past it is
     * refused (429), so clients cannot grow the index without bound; 0 = KVI_SVC_DEFAULT_MAX_MODELS */
    uint32_t max_models;
    /* --nats: the plane's connection and sources (api/nats_args.h); NULL or servers NULL = none.
     * Not copied: it must outlive the service. */
    const struct kvi_nats_args *nats;
    /* --zmq-bind: endpoints kvidx binds for engines that connect (llm-d: topic kv@<pod>@<model>;
     * api/service_zbind.c), copied */
    const struct kvi_zbind_arg *zbinds;
    size_t n_zbinds;
    uint32_t zbind_max_pods; /* pods per endpoint; 0 = KVI_SVC_DEFAULT_ZBIND_MAX_PODS */
    uint32_t zbind_idle_s;   /* a pod silent this long is forgotten; 0 = never */
    /* --capacity-max-blocks: the most capacity_blocks pre-sizes, per partition and per slot map;
     * 0 = KVI_SVC_DEFAULT_CAPACITY_MAX_BLOCKS, KVI_SVC_CAPACITY_OFF = pre-size nothing */
    uint64_t capacity_max_blocks;
};

struct kvi_service;

/** The capacity_blocks pre-sizing counters. Any thread. */
void kvi_service_capacity_counters(struct kvi_service *svc, struct kvi_capacity_counters *out);

/** The --zmq-bind counters. Any thread. */
void kvi_service_zbind_counters(struct kvi_service *svc, struct kvi_zbind_counters *out);

/** Destroy the listener pool, the writer pool and the registry. After a successful stop. */
void kvi_service_destroy(struct kvi_service *svc);

/**
 * Create the service: registry, writer pool and gated listener pool (strings
 * of @p cfg are copied). Nothing is registered until kvi_service_start.
 * @return the service, or NULL with errno (EINVAL bad counts, ENOMEM, or the
 *         error of a pool constructor).
 */
KVI_DEALLOC(kvi_service_destroy, 1) KVI_WARN_UNUSED
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
 * kvi_service_stopping() true) and destroyed its producer, and the dump
 * threads after they have served every queued dump (new kvi_service_dump
 * calls fail from now on). Main thread.
 * @param wait_ms  how long to wait for them, in all (0 = as long as it takes)
 * @return 0, or -ETIMEDOUT when one is still busy after @p wait_ms (a posted
 *         function that did not return, a peer fetch of recovery (it stops
 *         within ~50 ms of kvi_service_begin_stop), or a dump whose sink
 *         still blocks (stop HTTP first: its streams then fail at once)): the
 *         caller must then not destroy the service (exit the process).
 */
int kvi_service_stop(struct kvi_service *svc, uint32_t wait_ms);

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

/**
 * A Conductor context (tenant, model, lora_name, block_size) and its roster:
 * the instances registered through the Conductor dialect under it (`inst`)
 * and every Dynamo-registered instance of the same namespace (model, tenant,
 * block size; `dyn`), named by its decimal id. A Dynamo instance whose name
 * a Conductor instance of the context has is listed as the Conductor one
 * (kvi_service_cond_inst_find). lora NULL: the any-adapter context of a
 * namespace with Dynamo instances, found when no Conductor registration
 * names the query's adapter.
 */
struct kvi_svc_cond_ctx {
    const char *model;
    const char *tenant;
    const char *lora; /* NULL: any adapter (Dynamo instances only) */
    uint32_t block_size;
    struct kvi_ns *ns;
    size_t n_inst; /* ascending by name; storage pools (type Mooncake) excluded */
    const struct kvi_svc_cond_inst *inst;
    size_t n_dyn;  /* ascending by numeric id */
    const struct kvi_svc_cond_inst *dyn;
};

/** The Conductor instance of @p x named @p name, or NULL. Same section rules as kvi_service_cond_find. */
const struct kvi_svc_cond_inst *kvi_service_cond_inst_find(const struct kvi_svc_cond_ctx *x, const char *name);

/**
 * Find a Conductor context: the one registered for (model, tenant, lora,
 * block_size), else the any-adapter context of (model, tenant, block_size).
 * Call inside an RCU read-side section; the result stays valid until the
 * section ends.
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
/** The NATS plane, or NULL (no --nats, or not started yet). Any thread. */
struct kvi_nats *kvi_service_nats(const struct kvi_service *svc);

struct kvi_nats_bridge;
/** The --nats-publish bridge, or NULL (none, or not started yet). Any thread. */
struct kvi_nats_bridge *kvi_service_bridge(const struct kvi_service *svc);

/* ---- /dump: dump threads -------------------------------------------------------------- */

/**
 * GET /dump (§1.11): encode every namespace registered when the dump starts
 * (one consistent snapshot per partition, partitions one after the other;
 * the dump as a whole is weakly consistent) on a dump thread, handing the
 * body to @p sink (ctx @p ctx) as it is produced, then call @p done. Returns
 * at once (any thread; an HTTP loop thread in kvidxd).
 * The dump starts in the control thread's turn, after everything posted
 * before it (the startup sequence and P2P recovery included: a replica that
 * is still recovering serves its recovered state, not its empty start);
 * the control thread only hands it to a dump thread and goes on. Each
 * partition is encoded by its writer into memory without waiting for
 * @p sink; @p sink runs on the dump thread and may block (memory held: the
 * encoding of one partition of one namespace, plus what the sink keeps). A
 * nonzero return of @p sink ends the dump. @p done(ctx, rc) gets 0 or the
 * error (kvi_dump_done_fn; also -ESHUTDOWN, or -errno of pthread_create
 * when no dump thread could be started, then on the control thread). A dump
 * pins the namespaces it lists, so a concurrent deletion only frees one
 * after the dump is done with it.
 * @return 0 (@p done will be called), or -ESHUTDOWN once the control thread
 *         has stopped: @p done is then not called and the caller keeps @p ctx.
 */
int kvi_service_dump(struct kvi_service *svc, kvi_dump_sink_fn sink, kvi_dump_done_fn done, void *ctx);

/* ---- control thread (inside functions given to kvi_service_post) ------------------ */

/**
 * POST /register, Dynamo (§1.5). @return 0 (201), or -EINVAL with @p err
 * filled: 400 bad endpoint, 409 with the §1.5 texts, 422 an empty
 * model_name or one (or a tenant_id) with a NUL, 429 a new namespace past
 * --max-models, 503 a listener that failed while it was set up (no socket:
 * the descriptor limit; nothing stays registered), 500 (logged).
 */
int kvi_service_ctl_dyn_register(struct kvi_service *svc, const struct kvi_dyn_register *r,
                                 struct kvi_api_err *err);
/**
 * POST /zmq/bind: open a bind endpoint for engines that connect, as
 * --zmq-bind ENDPOINT[=BLOCK_SIZE] (api/README.md "llm-d: engines that
 * connect"). Idempotent: an endpoint open with the same block size is
 * accepted as it is (*created false). Control thread.
 * @return 0 (*created: whether it was opened now), or -EINVAL with err:
 *         400 (invalid endpoint, or the bind failed: address in use ...),
 *         409 (open with another block size), 429 (KVI_SVC_MAX_ZBINDS
 *         endpoints known).
 */
int kvi_service_ctl_zbind_open(struct kvi_service *svc, const struct kvi_dyn_zbind *r, bool *created,
                               struct kvi_api_err *err);
/**
 * POST /zmq/unbind: close an open bind endpoint (from the flag or
 * /zmq/bind): its pods are unregistered and their blocks removed, and the
 * port is released. Control thread. @return 0, or -EINVAL with err (404).
 */
int kvi_service_ctl_zbind_close(struct kvi_service *svc, const struct kvi_dyn_zbind *r, struct kvi_api_err *err);
/** GET /zmq/binds body: the open endpoints. Any thread. */
void kvi_service_encode_zbinds(struct kvi_service *svc, struct kvi_buf *out);
/** POST /unregister, Dynamo (§1.6). @return 0, or -EINVAL with err (404 texts). */
/** POST /nats/sources: start a NATS source into (model, tenant) (created if new). 409 without --nats. */
int kvi_service_ctl_nats_source(struct kvi_service *svc, const struct kvi_dyn_nats_source *r,
                                struct kvi_api_err *err);
int kvi_service_ctl_dyn_unregister(struct kvi_service *svc, const struct kvi_dyn_unregister *r,
                                   struct kvi_api_err *err);
/** /test/pause_listener (pause) or /test/resume_listener (§1.14). @return 0 or -EINVAL (404, 409). */
int kvi_service_ctl_listener(struct kvi_service *svc, const struct kvi_dyn_listener_ctl *r, bool pause,
                             struct kvi_api_err *err);
/**
 * POST /register, Conductor (§2.2). @return 0 (200), or -EINVAL with err:
 * 400 (a name with a NUL included: invalid_value and the field), 429 text (a
 * new namespace past --max-models), 500 (logged; `Failed to subscribe: ...`
 * for a listener that failed while it was set up, which then stays
 * unregistered); with --nats-registry also 400 invalid_registration (the key
 * taken with other values through another replica meanwhile: undone here) and
 * 503 (the bucket could not be written: undone here).
 */
int kvi_service_ctl_cond_register(struct kvi_service *svc, const struct kvi_cond_register *r,
                                  struct kvi_api_err *err);
/**
 * POST /unregister, Conductor (§2.3). @param removed  receives the removed key
 * (strings point into @p r). @return 0, or -EINVAL with err (404; 503 with
 * --nats-registry when the bucket's key could not be deleted: nothing changes).
 */
int kvi_service_ctl_cond_unregister(struct kvi_service *svc, const struct kvi_cond_unregister *r,
                                    struct kvi_cond_key *removed, struct kvi_api_err *err);

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
 * unlink, make the writers forget it, free it (or leave the free to the last
 * dump that pins it). @return true when deleted.
 */
bool kvi_service_ctl_ns_drop_unused(struct kvi_service *svc, struct kvi_ns *ns);

/**
 * A watermark recovered from a peer's /dump (recovery, after the dump was
 * applied whole): batch @p seq of (instance @p dense of @p ns, @p dp_rank)
 * is the last one in the recovered blocks. A registration of that key that
 * has not drained yet (the gated --workers listeners) is seeded at once
 * (kvi_listeners_seed); otherwise the watermark is kept and seeds the key's
 * first registration (kvi_listener_spec.seed_watermark), unless the
 * instance's blocks are removed first (unregistration, namespace deletion),
 * which discards it.
 */
void kvi_service_ctl_recovered_watermark(struct kvi_service *svc, struct kvi_ns *ns, uint32_t dense,
                                         uint64_t worker_id, const char *worker_name, uint32_t dp_rank,
                                         uint64_t seq);

#endif
