/*
 * Slot tracker: the active-request accounting of the Dynamo standalone slot
 * tracker (../shared/reference/dynamo-standalone-slot-tracker.md, condensed
 * in http-api.md §3). Routers register workers, report each request's
 * lifecycle (add, prefill_complete, free) and read advisory load snapshots
 * (loads, potential loads) for their own routing decisions. State only: no
 * I/O, no HTTP, no replica transport (the api/ layer and the replica-sync
 * module drive it).
 *
 * MODEL
 *   A tracker exists per (model_name, tenant_id). The first /register of a
 *   pair creates it with that registration's block size; it is deleted when
 *   its last worker unregisters (a later /register starts afresh, possibly
 *   with another block size). A worker (worker_id, scoped by the tracker)
 *   owns the contiguous DP range [dp_start, dp_start + dp_size); each
 *   (worker_id, dp_rank) of the range is a *rank* with its own load. Request
 *   ids are unique per tracker. Sequence hashes are the ordered, chained
 *   per-block hashes of a prompt (u64; the wire's signed i64 reinterpreted
 *   bit for bit by the codec).
 *
 * LOAD FORMULAS (the reference KV router's ActiveSequences, which the
 * document's service exposes; "advisory snapshots, not reservations")
 *   For a rank r:
 *     active_requests(r)       = requests added on r and not yet freed,
 *                                expired or unregistered.
 *     active_prefill_tokens(r) = sum of new_isl_tokens over r's requests
 *                                whose prefill is still open. "new_isl_tokens
 *                                defaults to 0; positive values enable
 *                                prefill-token accounting": a request added
 *                                with 0 contributes nothing. /prefill_complete,
 *                                /free, expiry and unregistration close it.
 *                                No time decay: the standalone service passes
 *                                no prefill-duration model, so the reference's
 *                                decay anchor never decays.
 *     active_decode_blocks(r)  = |B(r)|, B(r) the set of distinct block
 *                                *prefixes* held by r's active requests. A
 *                                request with hashes h0..h(n-1) holds the n
 *                                prefixes (h0), (h0 h1), ..., (h0..h(n-1)). Two
 *                                requests share a block iff they share the
 *                                whole prefix up to it, as in the reference's
 *                                per-worker prompt trie ("decode-block
 *                                accounting shared between requests with
 *                                common prefixes"): [1,2,3] + [1,2,4] hold 4
 *                                blocks on one rank; [1,2] + [9,2] hold 4.
 *   For a hypothetical request q0..q(n-1) with new_isl_tokens T:
 *     overlap(r)                   = the largest k <= n with (q0..q(k-1)) in
 *                                    B(r) (0 when q0 is not held by r)
 *     potential_prefill_tokens(r)  = active_prefill_tokens(r) + T
 *                                    (T is added as given, to every rank: the
 *                                    reference's uniform prefill delta; the
 *                                    caller nets out cached tokens itself)
 *     potential_decode_blocks(r)   = active_decode_blocks(r) + n - overlap(r)
 *     active_requests(r)           = as above
 *   Sums saturate at UINT64_MAX (kept exactly inside).
 *
 * STALE-REQUEST CLEANUP
 *   A request added at time a (the tracker's clock, CLOCK_MONOTONIC by
 *   default, injectable for tests) is *stale* at time now when
 *   now - a > stale_after_ns (default 300 s, the document's "older than 300
 *   seconds"). Stale requests are removed as if freed (no replica event) by
 *   kvi_slots_expire() (call it periodically, e.g. every second: it costs
 *   O(1) plus O(expired)) and, lazily, by an /add to the same tracker (as the
 *   reference's add does).
 *
 * ORDERING (document, "Lifecycle writes preserve ... arrival ordering")
 *   Operations apply in the order they take the writer lock. No reordering is
 *   repaired: a /free or /prefill_complete for a request not (yet) added is
 *   forgotten, so a later /add stays accounted until a later free or expiry.
 *
 * REPLICA EVENTS
 *   kvi_slots_apply_replica() applies a peer's lifecycle event with the
 *   document's rules: it never creates trackers or workers; an event whose
 *   (model, tenant) is unknown, whose block size differs from the tracker's,
 *   or whose (worker_id, dp_rank) is not registered is dropped and counted.
 *   Local lifecycle writes that change state are reported to the optional
 *   on_event hook (config), for the replica-sync module to forward.
 *
 * CONCURRENCY
 *   Writers are serialised by one mutex; readers never take it. Readers see
 *   RCU-published immutable tables (trackers, per-tracker rank tables) and a
 *   per-tracker prompt trie whose nodes are found through a single-writer
 *   open-addressing table and whose holder sets are immutable copies; each
 *   rank's counters are relaxed atomics. Retired memory is freed after a
 *   grace period, in batches. A reader computing an overlap while the writer
 *   changes the same tracker's trie (detected with a sequence counter)
 *   re-walks in a mode that credits a rank only for positions it was seen
 *   to hold at every earlier position.
 *
 *   | call                                   | who may call                      |
 *   |----------------------------------------|-----------------------------------|
 *   | create / destroy                       | control plane; destroy only when  |
 *   |                                        | no other thread uses the tracker  |
 *   | register, unregister, add,             | any thread, never inside an RCU   |
 *   | prefill_complete, free, expire,        | read-side section (internally     |
 *   | apply_replica                          | serialised; may wait for a grace  |
 *   |                                        | period)                           |
 *   | workers, loads, workers_page,          | registered RCU readers inside a   |
 *   | loads_page, potential_loads,           | read-side section; wait-free;     |
 *   | tracker_info                           |                                   |
 *   |                                        | returned strings valid until the  |
 *   |                                        | section ends                      |
 *   | stats                                  | any thread (relaxed counters)     |
 *
 *   A reader and a writer on the same tracker never block each other. Values
 *   read during a concurrent write mix states from before and after it (the
 *   reference documents the same torn reads as intentional).
 *
 * ERRORS
 *   int functions return 0 or a negative errno: -ENOENT (not found: 404),
 *   -EEXIST (conflict: 409), -EINVAL (bad input: 400), -ENOSPC (an output
 *   array is too small; for register, the tracker cap: 429). Out-of-memory aborts (control plane). When @p why
 *   is not NULL it receives the precise reason and the values the
 *   document's error texts need (api/codec_slots.h turns it into the
 *   answer).
 */
#ifndef KVI_ENGINE_SLOTS_H
#define KVI_ENGINE_SLOTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"

/** Default stale-request age: 300 seconds. */
#define KVI_SLOTS_STALE_NS (300ull * 1000000000ull)
/** Default cap on the ranks of one tracker (kvidx's guard; the document has none). */
#define KVI_SLOTS_MAX_RANKS 65536u
/** Default cap on the trackers, (model, tenant) pairs (kvidx's guard; the document has none). */
#define KVI_SLOTS_MAX_TRACKERS 1024u
/** Default cap on the dp_size of one registration (kvidx's guard; the document has none). */
#define KVI_SLOTS_MAX_DP_SIZE 1024u

struct kvi_slots;

/** A (model_name, tenant_id) pair as byte strings (not NUL-terminated). As a
 *  filter, a NULL pointer means "any" (a non-NULL empty string matches "").*/
struct kvi_slots_key {
    const char *model;
    size_t model_len;
    const char *tenant;
    size_t tenant_len;
};

/** One lifecycle request (the fields an operation does not use are ignored). */
struct kvi_slots_request {
    struct kvi_slots_key key;
    const char *request_id; /* bytes, not NUL-terminated */
    size_t request_id_len;
    uint64_t worker_id;      /* add */
    uint32_t dp_rank;        /* add */
    const uint64_t *hashes;  /* add: sequence hashes, may be NULL when n_hashes is 0 */
    size_t n_hashes;
    uint64_t new_isl_tokens; /* add: 0 = no prefill-token accounting */
};

enum kvi_slots_event_type {
    KVI_SLOTS_EV_ADD = 0,
    KVI_SLOTS_EV_PREFILL_COMPLETE = 1,
    KVI_SLOTS_EV_FREE = 2,
};

/**
 * A lifecycle event: what the on_event hook reports for local writes, and
 * what kvi_slots_apply_replica() takes from peers. req.worker_id and
 * req.dp_rank name the request's rank for every type; hashes and
 * new_isl_tokens are meaningful for KVI_SLOTS_EV_ADD only.
 */
struct kvi_slots_event {
    enum kvi_slots_event_type type;
    uint32_t block_size; /* the sender's tracker block size */
    struct kvi_slots_request req;
};

/** Why an operation failed (see each function). */
enum kvi_slots_why {
    KVI_SLOTS_OK = 0,
    KVI_SLOTS_E_BLOCK_SIZE,          /* -EINVAL: block_size is 0 */
    KVI_SLOTS_E_DP_SIZE,             /* -EINVAL: dp_size is 0 */
    KVI_SLOTS_E_DP_RANGE,            /* -EINVAL: dp_start + dp_size overflows u32 */
    KVI_SLOTS_E_BLOCK_SIZE_MISMATCH, /* -EEXIST: tracker exists with another block size */
    KVI_SLOTS_E_DUP_WORKER,          /* -EEXIST: worker_id already registered in the tracker */
    KVI_SLOTS_E_NO_WORKER,           /* -ENOENT: unregister of an unknown worker or tracker */
    KVI_SLOTS_E_NO_TRACKER,          /* -ENOENT: no tracker for (model, tenant) */
    KVI_SLOTS_E_NO_RANK,             /* -ENOENT: add on an unregistered (worker, rank) */
    KVI_SLOTS_E_DUP_REQUEST,         /* -EEXIST: request id already active in the tracker */
    KVI_SLOTS_E_NO_REQUEST,          /* -ENOENT: prefill_complete of an unknown request */
    KVI_SLOTS_E_TOO_MANY_RANKS,      /* -EINVAL: the tracker would exceed max_ranks */
    KVI_SLOTS_E_TOO_MANY_TRACKERS,   /* -ENOSPC: a new tracker would exceed max_trackers */
    KVI_SLOTS_E_DP_SIZE_LIMIT,       /* -EINVAL: dp_size exceeds max_dp_size */
};

/** Failure details. Fields not named by the reason are left 0. */
struct kvi_slots_err {
    enum kvi_slots_why why;
    uint64_t worker_id;           /* DUP_WORKER, NO_WORKER, NO_RANK, DUP_REQUEST (its owner) */
    uint32_t dp_rank;             /* NO_RANK, DUP_REQUEST (its owner) */
    uint32_t dp_start, dp_size;   /* DP_SIZE, DP_RANGE, TOO_MANY_RANKS */
    uint32_t ranks, max_ranks;    /* TOO_MANY_RANKS: ranks registered, the cap */
    uint32_t existing_block_size; /* BLOCK_SIZE_MISMATCH */
    uint32_t requested_block_size;/* BLOCK_SIZE_MISMATCH */
    uint32_t max_dp_size;         /* DP_SIZE_LIMIT (with dp_start, dp_size) */
    uint32_t trackers, max_trackers; /* TOO_MANY_TRACKERS: trackers existing, the cap */
};

/** Construction options; zero-initialise and set what you need. */
struct kvi_slots_config {
    /** Clock in nanoseconds, monotonic (never going backwards). NULL:
     *  kvi_now_ns (CLOCK_MONOTONIC). Called under the writer lock. */
    uint64_t (*now_ns)(void *ctx);
    void *clock_ctx;
    /** Stale-request age; 0 = KVI_SLOTS_STALE_NS (300 s). */
    uint64_t stale_after_ns;
    /** Most ranks one tracker may hold; 0 = KVI_SLOTS_MAX_RANKS. Each rank
     *  costs a cache line and a slot in every /potential_loads answer, so an
     *  absurd dp_size is refused instead of exhausting memory. */
    uint32_t max_ranks;
    /** Most trackers ((model, tenant) pairs) that may exist; 0 =
     *  KVI_SLOTS_MAX_TRACKERS. A tracker costs its rank table (80 bytes per
     *  rank) and an entry in every unfiltered /loads, so a /register that
     *  would create one more is refused. */
    uint32_t max_trackers;
    /** Largest dp_size of one /register; 0 = KVI_SLOTS_MAX_DP_SIZE. */
    uint32_t max_dp_size;
    /**
     * Called after every local add, every prefill_complete of an active
     * request and every free that removed a request, in application order,
     * with the writer lock held. The event and everything it points to are
     * valid during the call only. The hook must not block (a replica queue
     * that is full drops) and must not call back into this tracker. NULL:
     * no events. Replica applications and expiry never call it.
     */
    void (*on_event)(void *ctx, const struct kvi_slots_event *ev);
    void *event_ctx;
};

/** A registered worker (GET /workers). */
struct kvi_slots_worker {
    const char *model; /* NUL-terminated copy (may contain NULs: use the lengths) */
    size_t model_len;
    const char *tenant;
    size_t tenant_len;
    uint64_t worker_id;
    uint32_t block_size;
    uint32_t dp_start;
    uint32_t dp_size;
};

/** The current load of one rank (GET /loads). */
struct kvi_slots_load {
    const char *model;
    size_t model_len;
    const char *tenant;
    size_t tenant_len;
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t active_prefill_tokens;
    uint64_t active_decode_blocks;
    uint64_t active_requests;
};

/** The projected load of one rank for a hypothetical request (POST /potential_loads). */
struct kvi_slots_potential {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint64_t overlap_blocks;           /* overlap(r) of LOAD FORMULAS */
    uint64_t active_prefill_tokens;
    uint64_t active_decode_blocks;
    uint64_t active_requests;
    uint64_t potential_prefill_tokens;
    uint64_t potential_decode_blocks;
};

/** A tracker's shape (for /route). */
struct kvi_slots_info {
    uint32_t block_size;
    uint32_t n_workers;
    uint32_t n_ranks;
};

/** Counters (monotonic unless marked as gauges). */
struct kvi_slots_stats {
    uint64_t trackers;                  /* gauge */
    uint64_t workers;                   /* gauge */
    uint64_t ranks;                     /* gauge */
    uint64_t requests;                  /* gauge: active requests */
    uint64_t nodes;                     /* gauge: live prompt-trie nodes */
    uint64_t adds, frees, prefill_completes; /* local writes that changed state */
    uint64_t expired;                   /* requests removed as stale */
    uint64_t replica_applied;
    uint64_t replica_dropped_tracker;   /* unknown (model, tenant) */
    uint64_t replica_dropped_block_size;
    uint64_t replica_dropped_worker;    /* unknown worker_id or dp_rank */
    uint64_t replica_dropped_duplicate; /* add of an active request id */
    uint64_t replica_dropped_request;   /* prefill_complete/free of an unknown request */
    uint64_t events_emitted;            /* on_event calls */
    uint64_t refused_trackers;          /* registrations refused: TOO_MANY_TRACKERS */
    uint64_t refused_ranks;             /* registrations refused: DP_SIZE_LIMIT or TOO_MANY_RANKS */
};

/* ---- lifetime --------------------------------------------------------------------- */

/** Free the registry and everything in it. No other thread may use it. */
void kvi_slots_destroy(struct kvi_slots *s);

/**
 * Create an empty slot tracker registry.
 * @param cfg  options, or NULL for the defaults (copied)
 * @return the registry, or NULL with errno = ENOMEM.
 */
KVI_DEALLOC(kvi_slots_destroy, 1) KVI_WARN_UNUSED
struct kvi_slots *kvi_slots_create(const struct kvi_slots_config *cfg);

/* ---- topology (writers) ------------------------------------------------------------- */

/**
 * POST /register: register worker @p worker_id with ranks
 * [dp_start, dp_start + dp_size) in the tracker of @p key, creating the
 * tracker with @p block_size when it does not exist. Not inside a read-side
 * section.
 * @return 0 (201), -EINVAL (block_size 0, dp_size 0, range overflow, then
 *         DP_SIZE_LIMIT, checked in that order before anything else;
 *         TOO_MANY_RANKS, checked after the conflicts), -EEXIST
 *         (BLOCK_SIZE_MISMATCH, then DUP_WORKER), -ENOSPC (TOO_MANY_TRACKERS:
 *         the tracker does not exist and max_trackers do; checked last).
 */
int kvi_slots_register(struct kvi_slots *s, const struct kvi_slots_key *key, uint64_t worker_id,
                       uint32_t block_size, uint32_t dp_start, uint32_t dp_size,
                       struct kvi_slots_err *why);

/**
 * POST /unregister: remove the worker's whole DP range and its active
 * requests at once (no events); delete the tracker when it was the last
 * worker. Not inside a read-side section.
 * @return 0 (200), -ENOENT (NO_WORKER: unknown tracker or worker).
 */
int kvi_slots_unregister(struct kvi_slots *s, const struct kvi_slots_key *key, uint64_t worker_id,
                         struct kvi_slots_err *why);

/* ---- lifecycle (writers) ------------------------------------------------------------ */

/**
 * POST /add: record request @p r on rank (r->worker_id, r->dp_rank): its
 * prompt blocks (r->hashes) and, when r->new_isl_tokens > 0, its prefill
 * tokens. Stale requests of the tracker are expired first (after the checks).
 * Not inside a read-side section.
 * @return 0 (201), -ENOENT (NO_TRACKER, then NO_RANK), -EEXIST (DUP_REQUEST;
 *         why->worker_id/dp_rank name the rank holding it).
 */
int kvi_slots_add(struct kvi_slots *s, const struct kvi_slots_request *r,
                  struct kvi_slots_err *why);

/**
 * POST /prefill_complete: stop counting the request's prefill tokens.
 * Repeating it is a no-op. Not inside a read-side section.
 * @return 0 (200), -ENOENT (NO_TRACKER, or NO_REQUEST).
 */
int kvi_slots_prefill_complete(struct kvi_slots *s, const struct kvi_slots_request *r,
                               struct kvi_slots_err *why);

/**
 * POST /free: release the request's prompt blocks and any open prefill.
 * Idempotent while the tracker exists: an unknown request is a no-op that
 * returns 0. Not inside a read-side section.
 * @return 0 (200), -ENOENT (NO_TRACKER).
 */
int kvi_slots_free(struct kvi_slots *s, const struct kvi_slots_request *r,
                   struct kvi_slots_err *why);

/**
 * Remove every stale request (STALE-REQUEST CLEANUP) of every tracker as of
 * @p now_ns (the configured clock's time base), and free memory retired by
 * earlier writes. Not inside a read-side section.
 * @return the number of requests removed.
 */
size_t kvi_slots_expire(struct kvi_slots *s, uint64_t now_ns);

/**
 * Apply a lifecycle event received from a peer replica. Never creates a
 * tracker or a worker and never calls on_event. Not inside a read-side
 * section.
 * @return 0 applied, -ENOENT dropped (unknown tracker, block size mismatch,
 *         unknown worker or rank, or, for prefill_complete and free, a
 *         request that is not active on that rank), -EEXIST dropped (add of
 *         a request id already active in the tracker). Every drop is counted
 *         in kvi_slots_stats.
 */
int kvi_slots_apply_replica(struct kvi_slots *s, const struct kvi_slots_event *ev);

/* ---- reads (registered RCU readers, inside a read-side section) --------------------- */

/*
 * Sizing the output: the listing functions return the full count, so a
 * handler may call with cap 0, allocate (scratch), and call again in the same
 * read-side section; a writer may register ranks in between, so repeat while
 * the count exceeds the capacity. kvi_slots_potential_loads says the same
 * with -ENOSPC and *n_out.
 */

/**
 * GET /workers: the registered workers of every tracker matching @p filter
 * (model and tenant filters are independent; NULL pointers match all),
 * sorted by (model_name, tenant_id, worker_id), strings compared bytewise.
 * Writes at most @p cap entries. Call inside an RCU read-side section.
 * @return the number of matching workers (may exceed @p cap).
 */
size_t kvi_slots_workers(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                         struct kvi_slots_worker *out, size_t cap);

/**
 * GET /loads: the load of every rank of every tracker matching @p filter,
 * sorted by (model_name, tenant_id, worker_id, dp_rank); idle ranks
 * included. Call inside an RCU read-side section.
 * @return the number of matching ranks (may exceed @p cap).
 */
size_t kvi_slots_loads(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                       struct kvi_slots_load *out, size_t cap);

/*
 * Paging (GET /workers and GET /loads answer one page at a time): a listing
 * is cut after any entry and resumed after it by naming that entry, its
 * *position*, not by an offset. Both listings share one walk: the trackers
 * from the position's (model, tenant) on, then inside the position's own
 * tracker the entries that sort after it. A position, not a snapshot: a
 * writer may change the set between pages; entries that are unchanged
 * between two pages are neither repeated nor skipped, an entry registered
 * behind the position is not seen and one removed is not repeated. The
 * position need not exist any more (its tracker or worker may be gone): the
 * walk resumes at the place it would sort.
 */

/** A position in a listing: the last entry a page returned. Strings are not
 *  NUL-terminated and are only read during the call. */
struct kvi_slots_pos {
    struct kvi_slots_key key; /* model and tenant, both non-NULL (may be empty) */
    uint64_t worker_id;
    uint32_t dp_rank;         /* /loads only; ignored by kvi_slots_workers_page */
};

/**
 * GET /workers, one page: as kvi_slots_workers, but only the workers that
 * sort after the worker (after->key, after->worker_id) (NULL: from the
 * first), at most @p cap of them (Paging, above). Costs O(log(trackers) +
 * log(workers) + cap) plus one step per tracker skipped by the filter. Call
 * inside an RCU read-side section; the strings written are valid until it
 * ends. Never fails.
 * @return the number written (<= @p cap); ask for one more than the page to
 *         learn whether another page follows.
 */
size_t kvi_slots_workers_page(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                              const struct kvi_slots_pos *after, struct kvi_slots_worker *out,
                              size_t cap);

/**
 * GET /loads, one page: as kvi_slots_loads, but only the ranks that sort
 * after the rank (after->key, after->worker_id, after->dp_rank) (NULL: from
 * the first), at most @p cap of them (Paging, above). Costs O(log(trackers)
 * + log(ranks) + cap) plus one step per tracker skipped by the filter. Call
 * inside an RCU read-side section; the strings written are valid until it
 * ends. Never fails.
 * @return the number written (<= @p cap); ask for one more than the page to
 *         learn whether another page follows.
 */
size_t kvi_slots_loads_page(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                            const struct kvi_slots_pos *after, struct kvi_slots_load *out,
                            size_t cap);

/**
 * POST /potential_loads: project every rank of the tracker of @p key for a
 * request with @p hashes and @p new_isl_tokens (LOAD FORMULAS). Entries come
 * sorted by (worker_id, dp_rank). Call inside an RCU read-side section.
 * @param n_out  receives the number of ranks (on -ENOSPC: the size needed)
 * @return 0, -ENOENT (no tracker), -ENOSPC (@p cap below the rank count;
 *         retry with a larger array, possibly in the same section).
 */
int kvi_slots_potential_loads(const struct kvi_slots *s, const struct kvi_slots_key *key,
                              const uint64_t *hashes, size_t n_hashes, uint64_t new_isl_tokens,
                              struct kvi_slots_potential *out, size_t cap, size_t *n_out);

/**
 * The block size and size of the tracker of @p key. Call inside an RCU
 * read-side section.
 * @return 0, or -ENOENT (no tracker).
 */
int kvi_slots_tracker_info(const struct kvi_slots *s, const struct kvi_slots_key *key,
                           struct kvi_slots_info *info);

/** Snapshot of the counters (any thread; each value read relaxed). */
void kvi_slots_stats(const struct kvi_slots *s, struct kvi_slots_stats *out);

#endif
