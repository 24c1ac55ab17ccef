/*
 * Internals shared by the service files; not used outside api/service*.c
 * (everyone else includes api/service.h).
 *
 *   api/service.c            the service object: create / destroy, the control
 *                            thread and its queue, start / stop, readiness and
 *                            the counts, the /dump hand-off, the startup
 *                            sequence
 *   api/service_ns.c         namespace records (creation under --max-models,
 *                            reference counts, deletion), the watermarks
 *                            recovered for keys not registered yet, and what
 *                            the registrations of both dialects share (removal
 *                            ops, the listener set-up check)
 *   api/service_dynamo.c     the Dynamo workers table: registrations,
 *                            unregistrations, listener pause / resume, /workers
 *   api/service_conductor.c  the Conductor services table: registrations,
 *                            unregistrations, /services, /global_view
 *   api/service_roster.c     the RCU-published query roster (Conductor
 *                            contexts and the per-namespace Dynamo rosters
 *                            they share), its lookups, and the deferred free
 *                            of the ones replaced
 *   api/service_peers.c      the peer list
 *
 * DESIGN: api/service.h. Threads: every function declared here runs on the
 * control thread unless its comment says otherwise. The control thread is the
 * only writer of the tables below (the peers aside), so it reads them without
 * a lock and takes `mu` only to write them; other threads read them under
 * `mu`. It calls them outside any RCU read section: some wait for a grace
 * period (kvi_svc__ns_ref, kvi_svc__reclaim).
 */
#ifndef KVI_API_SERVICE_INTERNAL_H
#define KVI_API_SERVICE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api/codec.h"
#include "api/recovery.h"
#include "api/service.h"
#include "engine/common.h"
#include "engine/namespace.h"
#include "engine/writer.h"
#include "net/listener.h"

/* ---- tables ------------------------------------------------------------------------------ */

struct svc_rank {
    uint32_t dp_rank;
    char *endpoint;
    char *replay;      /* NULL when none */
    uint64_t capacity; /* capacity_blocks as registered; 0 = none (api/service_capacity.c) */
};

/** A Dynamo instance: one (model, tenant), one listener per rank (api/service_dynamo.c). */
struct svc_worker {
    uint64_t id;
    struct kvi_ns *ns;
    uint32_t dense;
    size_t n_ranks;
    struct svc_rank *ranks; /* ascending by dp_rank */
};

/** A Conductor service key instance|tenant|rank and its registration (api/service_conductor.c). */
struct svc_cond {
    char *instance;
    char *tenant;
    uint32_t dp_rank;
    char *model; /* as registered */
    char *lora;
    uint32_t block_size;
    enum kvi_cond_type type;
    char *endpoint;
    char *replay; /* "" when none */
    char *salt;
    bool has_cache_group;
    bool has_profile;
    char *hp[5]; /* strategy, algorithm, python_hash_seed, root_digest, index_projection */
    struct kvi_ns *ns;
    uint32_t dense;
};

/** A namespace the service created (or recovered), with its registration count (api/service_ns.c). */
struct svc_nsrec {
    struct kvi_ns *ns;
    uint32_t refs; /* Dynamo instances + Conductor keys registered under it */
};

/** The Conductor roster published to query threads (immutable; api/service_roster.c). The
 * Dynamo rosters it points to are not its own: each is retired when a newer
 * one replaces it. */
struct cond_view {
    size_t n;
    struct kvi_svc_cond_ctx *ctx;
};

struct kvi_service {
    /* configuration (owned copies) */
    struct kvi_service_config cfg;
    char *model_name;
    char *tenant_id;
    struct kvi_worker_spec *workers;
    char **peers_cfg;

    struct kvi_nsreg *nsreg;
    struct kvi_writer_pool *writers;
    struct kvi_listeners *listeners;
    struct kvi_dump_pool *dumps; /* /dump threads */

    /* control thread (api/service.c) */
    pthread_t ctl;
    bool ctl_started;
    struct kvi_producer *prod; /* owned by the control thread */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    struct svc_cmd *qhead, *qtail;
    bool ctl_quit;   /* under qmu: drain and exit */
    bool ctl_closed; /* under qmu: no more posts */
    _Atomic bool stopping;

    /* tables, under mu (written by the control thread only, the peers aside) */
    pthread_mutex_t mu;
    struct svc_worker *w;            /* api/service_dynamo.c */
    size_t n_w, cap_w;
    struct svc_cond *c;              /* api/service_conductor.c */
    size_t n_c, cap_c;
    struct svc_nsrec *nsr;           /* api/service_ns.c */
    size_t n_nsr, cap_nsr;
    char **peers;                    /* api/service_peers.c: written by any thread under mu */
    size_t n_peers, cap_peers;
    struct cond_view *_Atomic cview; /* RCU-published (api/service_roster.c) */
    struct dyn_roster **dyn;         /* control thread: the current Dynamo roster of each namespace */
    size_t n_dyn, cap_dyn;
    struct svc_retired *retired;     /* control thread: freed after a grace period (kvi_svc__reclaim) */
    size_t n_retired, cap_retired;

    /* watermarks recovered from a peer for keys not registered yet (control thread; api/service_ns.c) */
    struct svc_rwm {
        struct kvi_index *ix;
        uint32_t dense;
        uint32_t dp_rank;
        uint64_t seq;
    } *rwm;
    size_t n_rwm, cap_rwm;

    /* --nats (api/service_nats.c): the plane, published by the control thread (N1), and the
     * namespaces its sources feed (each holds a reference; written before the plane is published) */
    struct kvi_nats *_Atomic nats;
    struct kvi_ns **nats_ns;
    size_t n_nats_ns;
    /* --nats-registry (api/service_registry.c): the bucket, and whether its current values are
     * applied (the gate waits for it) */
    struct kvi_nats_kv *registry;  /* control thread (and destroy) */
    _Atomic bool registry_active;  /* the bucket is watched: /ready waits for registry_loaded */
    _Atomic bool registry_loaded;
    bool nats_failed; /* control thread: the plane could not be created (logged once) */
    /* --nats-snapshot (api/service_snapshot.c): the stream sources' snapshot hooks; created with the
     * plane (control thread), freed after it */
    struct kvi_svc_snap *snap;
    /* --nats-publish (api/service_bridge.c): the ZMQ -> JetStream bridge, published by the control
     * thread at startup (N1), destroyed after the listeners */
    struct kvi_nats_bridge *_Atomic bridge;

    /* --zmq-bind and POST /zmq/bind (api/service_zbind.c): the endpoints (slots added by the
     * control thread under mu, each freed only at destroy: a closed one is reopened in place) and
     * the pods registered on them (written by the control thread under mu) */
    struct svc_zbind *zb[KVI_SVC_MAX_ZBINDS];
    size_t n_zb;
    struct svc_zpod *zp;
    size_t n_zp, cap_zp;
    uint64_t zb_next_sweep_ns; /* control thread */
    _Atomic uint64_t zb_created, zb_forgotten, zb_refused_endpoints;

    /* capacity_blocks (api/service_capacity.c): what the partitions and slot maps are pre-sized
     * for now, and the registrations that asked; written by the control thread */
    _Atomic uint64_t cap_entries, cap_blocks, cap_reservations, cap_capped;

    /* readiness (api/service.c) */
    _Atomic bool recovery_running;
    _Atomic int recovery_result;
    _Atomic bool gate_open;
    bool startup_registered;     /* control thread: svc_startup has registered every --workers entry */
    _Atomic uint64_t registered; /* instances, for the min-initial-workers gate */
    struct kvi_recovery_stats rstats; /* under mu */
};

/* ---- strings (any thread; out of memory aborts) -------------------------------------------- */

static inline char *xstrndup(const char *p, size_t n)
{
    char *s = kvi_xmalloc(n + 1);
    if (n > 0)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static inline char *xstrdup(const char *p)
{
    return xstrndup(p, strlen(p));
}

static inline char *sdup(struct kvi_str s)
{
    return xstrndup(s.p, s.len);
}

static inline struct kvi_str zstr(const char *s)
{
    return (struct kvi_str){s, strlen(s)};
}

/* Whether a name from a request holds a NUL byte: names are C strings from here on (sdup would cut them). */
static inline bool has_nul(struct kvi_str s)
{
    return s.len > 0 && memchr(s.p, '\0', s.len) != NULL;
}

/* ---- readiness (api/service.c) --------------------------------------------------------------- */

/** Recount the registered instances (Dynamo instances + distinct Conductor instances) into
 * `registered`. Takes `mu`. */
void kvi_svc__update_registered(struct kvi_service *svc);

/** Open the listeners' gate once every --workers entry has been registered, recovery is over and
 * enough instances are registered; no-op otherwise, or when it is open already. */
void kvi_svc__maybe_open_gate(struct kvi_service *svc);

/* ---- namespaces, recovered watermarks, shared registration steps (api/service_ns.c) --------- */

/**
 * Find or create (model, tenant) with block size @p bs (an existing namespace
 * keeps its own); @p created is set when it is new. Writes its record under
 * `mu` (refs 0: the caller takes a reference with kvi_svc__ns_ref).
 * @return the namespace, or NULL with errno: ENOSPC when creating it would pass
 *         --max-models (logged: the operator must see a client being refused,
 *         or raise the flag), else the error of kvi_nsreg_add.
 */
struct kvi_ns *kvi_svc__ns_get(struct kvi_service *svc, const char *model, const char *tenant, uint32_t bs,
                               bool *created);

/**
 * Add @p delta (+1 or -1) to the registrations under @p ns (it must have a
 * record). At 0 after a decrement the namespace is deleted: its recovered
 * watermarks and record go, it is unlinked (waits for a grace period), the
 * writers forget it, and it is freed now or by the last /dump that pins it.
 */
void kvi_svc__ns_ref(struct kvi_service *svc, struct kvi_ns *ns, int delta);

/** Drop the recovered watermarks of (@p ix, @p dense, @p rank); of any instance when @p all_inst, any
 * rank when @p all_ranks. */
void kvi_svc__rwm_drop(struct kvi_service *svc, const struct kvi_index *ix, uint32_t dense, bool all_inst,
                       uint32_t rank, bool all_ranks);

/** The recovered watermark of a key about to be registered, if any: sets @p spec's seed_watermark and
 * watermark (the entry stays: the caller drops it once the listener is registered). */
void kvi_svc__rwm_seed_spec(struct kvi_service *svc, struct kvi_listener_spec *spec, uint32_t dense);

/**
 * Submit a blockless op of @p type (KVI_OP_REMOVE_INSTANCE, KVI_OP_REMOVE_DP_RANK)
 * for (@p ns, @p dense, @p rank) through the control thread's producer and
 * flush it; the recovered watermarks of the blocks it removes are dropped.
 */
void kvi_svc__submit_op(struct kvi_service *svc, enum kvi_op_type type, struct kvi_ns *ns, uint32_t dense,
                        uint32_t rank);

/**
 * Whether the listener just registered under @p key failed while its thread set
 * it up (kvi_listeners_register waits for that): no socket at the descriptor
 * limit (EMFILE), an endpoint ZMQ refuses at once (an ipc path too long). Such
 * a listener never reads, so a registration must not answer success for it
 * (issue 18 item 8): it is unregistered and its last_error copied to @p why
 * (@p cap bytes, NUL-terminated). @return true when it failed.
 */
bool kvi_svc__listener_failed_at_once(struct kvi_service *svc, const struct kvi_listener_key *key, char *why,
                                      size_t cap);

/* ---- Dynamo workers (api/service_dynamo.c) ------------------------------------------------- */

/** Free what @p w owns (its ranks), not @p w. Control thread, or destroy. */
void kvi_svc__free_worker(struct svc_worker *w);

/**
 * Register rank @p rank of Dynamo instance @p id under (@p model, @p tenant,
 * block size @p bs) at @p ep (and @p replay when @p has_replay): find or create
 * the namespace, register the listener (seeded from a recovered watermark),
 * add the table entry, publish the roster, update readiness.
 * @param undo_failed  answer 503 and keep nothing when the listener fails at
 *                     once (/register); false for --workers, whose failed
 *                     listener stays listed (and resumable) as before
 * @return 0, or -EINVAL with @p err filled as kvi_service_ctl_dyn_register
 *         describes (errors of status 500 and up are logged); nothing is kept
 *         on an error, and a namespace created for it is deleted again.
 */
int kvi_svc__dyn_register(struct kvi_service *svc, uint64_t id, struct kvi_str model, struct kvi_str tenant,
                          uint32_t bs, uint32_t rank, struct kvi_str ep, struct kvi_str replay, bool has_replay,
                          bool undo_failed, struct kvi_api_err *err);

/**
 * The registered rank (@p id, @p rank) reports @p capacity blocks
 * (kvi_svc__capacity_register); no-op when it is not registered. Control thread.
 */
void kvi_svc__dyn_capacity(struct kvi_service *svc, uint64_t id, uint32_t rank, uint64_t capacity);

/* ---- Conductor services (api/service_conductor.c) ---------------------------------------------- */

/** Free what @p c owns (its strings), not @p c. Control thread, or destroy. */
void kvi_svc__free_cond(struct svc_cond *c);

/* ---- the published roster (api/service_roster.c) ---------------------------------------------- */

/** Free view @p v (NULL allowed) and what it owns (not the Dynamo rosters it points to). After a grace
 * period (kvi_svc__reclaim), or in destroy with no reader left. */
void kvi_svc__cond_view_free(struct cond_view *v);

/** Build the Conductor roster from both tables, publish it and retire the old view. */
void kvi_svc__cond_view_publish(struct kvi_service *svc);

/** The Dynamo registrations of @p ns changed: rebuild its roster, publish a view that uses it, retire
 * the old ones. */
void kvi_svc__dyn_roster_update(struct kvi_service *svc, struct kvi_ns *ns);

/** Wait for one grace period, then free what was retired; no wait when nothing was. Control thread
 * (outside a read section), or destroy with no reader left. */
void kvi_svc__reclaim(struct kvi_service *svc);

/* ---- ZMQ -> JetStream bridge (api/service_bridge.c) ----------------------------------------- */

/** Start the --nats-publish bridge on the NATS plane (no-op without it; logged on failure). Control
 * thread, at startup, before any registration. */
void kvi_svc__bridge_open(struct kvi_service *svc);
/** Destroy the bridge: after the listener pool, before the NATS plane. Main, at destroy. */
void kvi_svc__bridge_close(struct kvi_service *svc);
/** With the bridge on: make @p spec mirror its index changes into the stream, and (unless it is
 * seeded already) resume it after what the stream holds of it (net/nats_bridge.h RESUME).
 * Control thread, just before kvi_listeners_register. */
void kvi_svc__bridge_spec(struct kvi_service *svc, struct kvi_listener_spec *spec, const char *model,
                          const char *tenant);

/* ---- fleet registry (api/service_registry.c) ------------------------------------------------ */

/** Is --nats-registry on (the bucket watched)? */
bool kvi_svc__registry_on(const struct kvi_service *svc);
/** Watch the registry bucket on plane @p n (no-op without --nats-registry). Control thread, at startup. */
void kvi_svc__registry_open(struct kvi_service *svc, struct kvi_nats *n);
/** Stop watching (before the plane goes). Main, at destroy. */
void kvi_svc__registry_close(struct kvi_service *svc);
/** Store a Dynamo registration as accepted, if its key holds no value. Control thread.
 * @return 0, -EEXIST (the rank is registered through another replica), or a negative errno (logged). */
int kvi_svc__registry_put_dyn(struct kvi_service *svc, const struct kvi_dyn_register *r);
/** Delete one (model, tenant, instance, rank)'s key. Control thread. @return 0 or a negative errno. */
int kvi_svc__registry_del_dyn(struct kvi_service *svc, struct kvi_str model, struct kvi_str tenant, uint64_t id,
                              uint32_t rank);
/** The endpoint this replica holds for (instance, rank) in (model, tenant), or NULL. Control thread. */
const char *kvi_svc__dyn_held(struct kvi_service *svc, uint64_t id, struct kvi_str model, struct kvi_str tenant,
                              uint32_t rank);
/** Store a Conductor registration as accepted, if its key holds no value. Control thread.
 * @return 0, -EEXIST (the service key is registered through another replica), or a negative errno. */
int kvi_svc__registry_put_cond(struct kvi_service *svc, const struct kvi_cond_register *r);
/** Delete one Conductor service key's (instance|tenant|rank) key. Control thread. @return 0 or a negative errno. */
int kvi_svc__registry_del_cond(struct kvi_service *svc, struct kvi_str inst, struct kvi_str tenant, uint32_t rank);
/** Apply a Conductor registration read from the registry here, without writing it back: a held one with
 * other values is replaced, an identical one left as it is. Control thread. @return 0 or as
 * kvi_service_ctl_cond_register (err filled). */
int kvi_svc__cond_apply(struct kvi_service *svc, const struct kvi_cond_register *r, struct kvi_api_err *err);
/** Drop the Conductor service key (instance|tenant|rank) here, without touching the registry (no-op when
 * not held). Control thread. */
void kvi_svc__cond_drop_key(struct kvi_service *svc, struct kvi_str inst, struct kvi_str tenant, uint32_t rank);
/** Store a NATS source added through POST /nats/sources. Control thread. @return 0 or a negative errno. */
int kvi_svc__registry_put_source(struct kvi_service *svc, const struct kvi_dyn_nats_source *r);
/** Add a NATS source (POST /nats/sources, or @p from_registry: one another replica stored, not written
 * back); a source the plane runs already is accepted. Control thread. @return 0 or a negative errno with
 * @p err filled. */
int kvi_svc__nats_source(struct kvi_service *svc, const struct kvi_dyn_nats_source *r, bool from_registry,
                         struct kvi_api_err *err);
/** Drop one rank of a Dynamo instance here (the whole instance when it is the last), without touching the
 * registry. Control thread. */
void kvi_svc__dyn_drop_rank(struct kvi_service *svc, uint64_t id, uint32_t rank);

/* ---- NATS sources (api/service_nats.c) ----------------------------------------------------- */

/** The snapshot hooks of --nats-snapshot (created at the first call), or NULL without it. Control
 * thread, before the plane is created. */
const struct kvi_nats_snap_hooks *kvi_svc__snap_hooks(struct kvi_service *svc);
/** Free the snapshot hooks and their bucket handle: after the plane is destroyed. Control thread. */
void kvi_svc__snap_free(struct kvi_service *svc);

/** The plane, created at the first call when --nats is set (NULL otherwise, or when it cannot start).
 * Control thread. */
struct kvi_nats *kvi_svc__nats_plane(struct kvi_service *svc);

/** Start the NATS plane and its sources (--nats); no-op without. Control thread, at startup. */
void kvi_svc__nats_start(struct kvi_service *svc);
/** Stop and free the plane (before the writer pool goes). Main, at destroy. */
void kvi_svc__nats_stop(struct kvi_service *svc);
/**
 * /unregister of an instance no registration knows: drop NATS worker @p id of the namespaces
 * (model[, tenant]) its sources feed. @return 0, or -ENOENT when no source knows it. Control thread.
 */
int kvi_svc__nats_unregister(struct kvi_service *svc, uint64_t id, struct kvi_str model, struct kvi_str tenant,
                             bool has_tenant);
/**
 * The NATS workers as /workers views (source "nats", one listener per dp rank whose endpoint is the
 * subject or stream), filtered by @p f; strings and listener arrays in @p s, the array malloc'd
 * (*out, free it). @return how many. Any thread.
 */
size_t kvi_svc__nats_worker_views(struct kvi_service *svc, const struct kvi_dyn_workers_filter *f,
                                  struct kvi_scratch *s, struct kvi_worker_view **out);

/* ---- capacity_blocks (api/service_capacity.c) ---------------------------------------------- */

/**
 * Rank @p rk of the registered worker @p w reports a block pool of
 * @p capacity blocks: record it and pre-size its GPU slot map and its
 * partition (the rule: api/service_capacity.c), waiting for the partition's
 * writer. No-op for 0 or with --capacity-max-blocks 0. Control thread.
 */
void kvi_svc__capacity_register(struct kvi_service *svc, struct svc_worker *w, struct svc_rank *rk, uint64_t capacity);

/**
 * A rank that reported a capacity left namespace @p ns (its instance's dense
 * id @p dense): set its partition's floor to what the ranks still registered
 * add up to. Call after the workers table no longer lists it, while @p ns
 * lives. Control thread.
 */
void kvi_svc__capacity_forget(struct kvi_service *svc, struct kvi_ns *ns, uint32_t dense);

/* ---- --zmq-bind (api/service_zbind.c) ------------------------------------------------------- */

/** Copy the --zmq-bind endpoints of the configuration into the service. At create. */
void kvi_svc__zbind_init(struct kvi_service *svc);
/** Open the --zmq-bind endpoints (failures logged). Control thread, at startup. */
void kvi_svc__zbind_start(struct kvi_service *svc);
/** Forget the pods silent for --zmq-bind-idle-s when a sweep is due. Control thread. @return the
 * nanoseconds until the next sweep is due, or 0 when idle pods are never forgotten. */
uint64_t kvi_svc__zbind_sweep(struct kvi_service *svc);
/** Free the endpoints and pods. Destroy, after the listener pool. */
void kvi_svc__zbind_free(struct kvi_service *svc);
/** The --zmq-bind pods as /workers views (source "zmq-bind"), filtered by @p f; like
 * kvi_svc__nats_worker_views. Called with `mu` held. */
size_t kvi_svc__zbind_worker_views(struct kvi_service *svc, const struct kvi_dyn_workers_filter *f,
                                   struct kvi_scratch *s, struct kvi_worker_view **out);

#endif
