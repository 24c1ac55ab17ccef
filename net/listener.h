/*
 * ZMQ event listeners: one logical listener per registration (instance,
 * dp_rank), served by a small pool of listener threads.
 *
 * WHAT A LISTENER DOES (wire-protocol.md §1, §6, §7)
 *   It receives the engine's 3-frame messages [topic, seq8, payload] on a SUB
 *   socket, checks the framing, runs the §6.3 gap rule (net/watermark.h),
 *   decodes the batch (net/decode.h) and turns it into index ops
 *   (kvi_ingest_batch, net/ingest.h) submitted through its thread's producer
 *   to the writer pool, with sticky routing: all events of one worker are
 *   applied in order. Gaps are filled by replay over a DEALER to the
 *   engine's ROUTER; live messages that arrive meanwhile are buffered and
 *   applied afterwards in seq order (net/replay.h).
 *
 *   Modes:
 *     KVI_LISTEN_CONNECT  (default) the engine's PUB binds; the listener
 *                         connects one SUB to `endpoint`, subscribed to
 *                         `topic` (a prefix; "" = everything). The socket is
 *                         the stream's identity.
 *     KVI_LISTEN_BIND     the engine's PUB connects; kvidx binds one SUB per
 *                         bind endpoint, shared by every registration naming
 *                         that endpoint. The topic is the only identity: a
 *                         message goes to the registration whose topic is the
 *                         longest prefix of frame 0 (use delimited prefixes
 *                         such as "kv@pod-1@"; a registration with
 *                         exact_topic matches frame 0 only when equal,
 *                         found by one hash probe: no scan over them).
 *                         Unmatched topics are counted.
 *
 *   Open bind endpoints (kvi_listeners_bind_open): a bind endpoint the pool
 *   keeps bound with no registration, subscribed to a prefix (llm-d's
 *   "kv@"), for engines nobody registers. A message whose topic no
 *   registration matches is offered to the caller's on_unknown callback (on
 *   the listener thread); when it answers true (a registration for that
 *   topic is coming, made from another thread), the message is held, at
 *   most max_held per endpoint (past that the oldest is dropped and counted
 *   in held_dropped), and handed to the registration whose topic it matches
 *   as soon as that registration is added, before any later message. When it
 *   answers false the message is counted in unknown_topic and dropped.
 *
 * STATES
 *   pending  registered, sockets connected (buffering up to the receive HWM)
 *            but not drained: the pool was created gated and
 *            kvi_listeners_open_gate has not run yet (http-api.md §1.2, §1.16)
 *   active   draining (does not mean the publisher is up: ZMQ connects
 *            asynchronously and reconnects by itself; see LIVENESS)
 *   paused   sockets closed (batches published meanwhile are lost to kvidx);
 *            the watermarks are kept, so the first batch after resume shows
 *            the gap and triggers a replay
 *   failed   last_error says why (connect or bind failure, receive error);
 *            resume retries
 *
 * LIVENESS
 *   What the state cannot say, the snapshot (kvi_listener_info) does:
 *   `connected`, from the SUB socket's connection events (zmq_socket_monitor,
 *   read by the listener thread in its epoll loop): connect mode, the SUB's
 *   connection to the engine's PUB is up; bind mode, at least one engine's
 *   connection was accepted on the endpoint and not all have gone since. A
 *   monitor costs two descriptors (two inproc PAIR sockets, one eventfd
 *   each), so a pool monitors at most `monitors` sockets (default: an eighth
 *   of RLIMIT_NOFILE); past that `monitored` is false and `connected` is
 *   unknown. `ctr.messages` counts live messages and `last_message_age_ns`
 *   says how long ago the last one arrived.
 *
 * LOGGING
 *   Through net/log.h (kvi_log): gaps, restarts, lost batches and replay
 *   overruns at warn, each replay's request and result at info, a replay
 *   given up and a listener that failed at error, dropped messages at warn.
 *   Each listener prints at most KVI_LIS_WARN_BUDGET warnings and errors
 *   (its info lines print while some remain), then says further lines are
 *   suppressed; `quiet` prints nothing.
 *
 * RANKS
 *   A batch names its dp rank (data_parallel_rank: any i32 on the wire), and
 *   every rank costs the index a rank of the instance. A registration holds
 *   at most `max_ranks` distinct ranks (default KVI_LISTEN_MAX_RANKS_DEFAULT,
 *   1,024; its registered rank, used by batches naming none, is one of them
 *   and always accepted). A batch whose rank is new when the registration
 *   already holds max_ranks is dropped whole (nothing of it is indexed),
 *   counted in `ranks_dropped`, and warned about once per registration; its
 *   seq counts as handled (W moves past it: a replay would bring the same
 *   bytes, so it is neither a gap nor replayed). The ranks are those the
 *   stream carried since its last clear: a publisher restart (or a clear by
 *   the gap policy) drops every one of them from the index and the set
 *   starts over. kvi_listeners_set_max_ranks changes the bound at run time.
 *
 * THREADS AND OWNERSHIP
 *   A pool owns N listener threads (default 1, or 2 on machines with more
 *   than 4 CPUs), each serving many registrations from one epoll set over
 *   the sockets' ZMQ_FDs, each with its own decoder and writer-pool
 *   producer. A registration goes to the least-loaded thread (bind mode: the
 *   thread that owns the bind endpoint). Every ZMQ socket is created, used
 *   and closed by its thread only: control calls queue a command to the
 *   thread, wake it through an eventfd and wait for it to finish.
 *
 *   | call                                 | thread                          |
 *   |--------------------------------------|---------------------------------|
 *   | create / destroy                     | control plane (destroy: no      |
 *   |                                      | other call running)             |
 *   | register, unregister, pause, resume, | any thread; serialised inside;  |
 *   | open_gate, seed, bind_open           | they wait for the listener      |
 *   |                                      | thread, so never call them from |
 *   |                                      | a writer thread                 |
 *   | get, foreach, totals, thread_stats,  | any thread (counters are        |
 *   | applied                              | approximate while running;      |
 *   |                                      | applied: writer threads too)    |
 *
 *   Registration data (strings) are copied. The index named by a
 *   registration must outlive it: unregister first (it waits until every op
 *   the listener submitted has been applied), then forget the index. Destroy
 *   the pool before the indexes it feeds and before the writer pool.
 *
 * ERRORS
 *   int functions return 0 or a negative errno; the constructor returns NULL
 *   with errno set.
 */
#ifndef KVI_NET_LISTENER_H
#define KVI_NET_LISTENER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/index.h"
#include "engine/writer.h"
#include "net/ingest.h"
#include "net/watermark.h"
#include "engine/common.h"

#define KVI_LISTEN_EP_MAX 256   /* bytes of an endpoint, NUL included */
#define KVI_LISTEN_NAME_MAX 256 /* bytes of an instance name or topic, NUL included */
#define KVI_LISTEN_ERR_MAX 256  /* bytes of last_error */
#define KVI_LISTEN_MAX_THREADS 16

/** Defaults (kvi_listeners_config fields left at 0). */
#define KVI_LISTEN_DEFAULT_SUB_HWM 1000000       /* SUB receive high-water mark, messages */
#define KVI_LISTEN_DEFAULT_REPLAY_TIMEOUT_MS 5000 /* replay given up after this long without progress */
#define KVI_LISTEN_DEFAULT_REPLAY_RETRIES 3       /* re-requests after holes in one replay */
#define KVI_LISTEN_DEFAULT_MAX_BUFFERED 1000000   /* batches buffered during one replay */
#define KVI_LISTEN_DEFAULT_BUDGET 256             /* messages drained per socket per turn */
#define KVI_LISTEN_MAX_RANKS_DEFAULT 1024         /* distinct dp ranks per registration (RANKS) */

enum kvi_listen_mode {
    KVI_LISTEN_CONNECT = 0, /* kvidx connects a SUB to the engine's PUB (default) */
    KVI_LISTEN_BIND = 1,    /* kvidx binds a SUB that engines connect to; topic = identity */
};

enum kvi_listener_state {
    KVI_LISTENER_PENDING = 0,
    KVI_LISTENER_ACTIVE = 1,
    KVI_LISTENER_PAUSED = 2,
    KVI_LISTENER_FAILED = 3,
};
#define KVI_LISTENER_STATES 4

/** "pending", "active", "paused", "failed". */
const char *kvi_listener_state_name(enum kvi_listener_state s);

/**
 * Transport, watermark and replay counters of a listener: X(name, help).
 * Every counter only grows. The daemon can expand the list for /metrics.
 */
#define KVI_LISTENER_COUNTERS(X)                                                                   \
    X(messages, "live messages received with a valid frame layout")                               \
    X(bytes, "payload bytes of those messages")                                                   \
    X(malformed, "live messages dropped: not 3 frames, or a seq frame that is not 8 bytes")      \
    X(batches, "batches applied (live and replayed)")                                             \
    X(decode_errors, "live batches dropped because the payload failed to decode")                 \
    X(stale, "live batches skipped: already applied (seq <= watermark)")                          \
    X(gaps, "gaps found on the live stream")                                                      \
    X(lost, "batches lost for good: gaps without replay, replay overruns and fallbacks")          \
    X(restarts, "publisher restarts detected (live seq went backwards); the rank was cleared")   \
    X(gap_clears, "rank clears by the clear-on-gap policy")                                       \
    X(replays, "replays started")                                                                 \
    X(replay_requests, "replay requests sent (retries included)")                                 \
    X(replay_retries, "re-requests from the first missing seq after a hole")                      \
    X(replayed, "batches applied from replay replies")                                            \
    X(replay_dups, "replay replies skipped: already applied or already buffered")                 \
    X(replay_holes, "replay replies found missing by the contiguity check")                       \
    X(replay_overruns, "replies that started later than requested (engine buffer overrun)")      \
    X(replay_timeouts, "replays abandoned after the timeout without progress")                    \
    X(replay_fallbacks, "replays given up (timeout, retries, buffer limit): loss accepted or rank cleared") \
    X(replay_malformed, "replay replies with a bad layout, ignored")                              \
    X(replay_undecodable, "replayed batches that failed to decode (skipped: identical bytes never decode)") \
    X(live_buffered, "live batches buffered while a replay ran")                                  \
    X(buffer_overflows, "replays abandoned because too many batches were buffered")                \
    X(ranks_dropped, "batches dropped: their dp rank would exceed the listener's max_ranks distinct ranks") \
    X(implausible_seq, "live batches dropped: seq jumped more than 2^32 past the last one (forged or corrupt)")

/**
 * Event-side counters of a listener, from its ingest target (net/ingest.h)
 * and its writer sink (engine/writer.h): X(name, help).
 */
#define KVI_LISTENER_EVENT_COUNTERS(X)                                                             \
    X(events_stored, "stored events decoded")                                                     \
    X(events_removed, "removed events decoded")                                                   \
    X(events_cleared, "cleared events decoded")                                                   \
    X(events_unknown, "events skipped: unknown type")                                             \
    X(events_invalid, "events skipped: unusable fields")                                          \
    X(placeholders, "token-less stores resolved through known hashes")                            \
    X(block_size_mismatch, "stores whose block_size differs from the registered one")             \
    X(blocks_dropped, "hashes not stored: block size mismatch or tokens short")                   \
    X(ops_submitted, "index ops handed to the writers")                                           \
    X(ops_applied, "ops applied by the writers")                                                  \
    X(ops_parent_not_found, "stores rejected: parent unknown for the (instance, rank)")           \
    X(ops_invalid, "stores rejected as invalid")                                                  \
    X(unknown_blocks, "token-less store hashes that resolved to nothing")                         \
    X(blocks_stored, "blocks stored by applied ops")                                              \
    X(hashes_removed, "removed hashes that the slot knew")

#define KVI_LISTEN_X_FIELD(name, help) uint64_t name;

/** Counters of one listener (or totals). */
struct kvi_listener_counters {
    KVI_LISTENER_COUNTERS(KVI_LISTEN_X_FIELD)
    KVI_LISTENER_EVENT_COUNTERS(KVI_LISTEN_X_FIELD)
};

/** Pool settings; zero fields take the defaults. */
struct kvi_listeners_config {
    uint32_t threads;           /* listener threads, 1..KVI_LISTEN_MAX_THREADS; 0 = default */
    uint32_t io_threads;        /* ZMQ I/O threads; 0 = 1 */
    int sub_hwm;                /* SUB ZMQ_RCVHWM; 0 = KVI_LISTEN_DEFAULT_SUB_HWM, < 0 = unlimited */
    uint32_t replay_timeout_ms; /* 0 = KVI_LISTEN_DEFAULT_REPLAY_TIMEOUT_MS */
    uint32_t replay_retries;    /* 0 = KVI_LISTEN_DEFAULT_REPLAY_RETRIES */
    uint32_t max_buffered;      /* 0 = KVI_LISTEN_DEFAULT_MAX_BUFFERED */
    uint32_t budget;            /* 0 = KVI_LISTEN_DEFAULT_BUDGET */
    bool gated;                 /* registrations stay pending until kvi_listeners_open_gate */
    bool timing;                /* measure decode / ingest time per thread (kvi_listener_thread_stats) */
    bool quiet;                 /* no log lines (counters still count) */
    void *zmq_ctx;              /* a ZMQ context to use (inproc:// engines in this process; it
                                   must outlive the pool); NULL = the pool creates its own */
    uint32_t max_ranks;         /* distinct dp ranks per registration (RANKS); 0 = KVI_LISTEN_MAX_RANKS_DEFAULT */
    int monitors;               /* SUB sockets with a connection monitor (2 descriptors each; LIVENESS):
                                   0 = RLIMIT_NOFILE's soft limit / 8, read when a socket opens;
                                   < 0 = none */
};

/** One registration. Strings are copied by kvi_listeners_register. */
struct kvi_listener_spec {
    struct kvi_index *ix;         /* the namespace's index (must outlive the registration) */
    uint64_t instance_id;         /* Dynamo u64 id (with instance_name NULL) */
    const char *instance_name;    /* Mooncake string id, or NULL */
    uint32_t dp_rank;             /* registered rank (used when a batch names none) */
    const char *endpoint;         /* engine PUB (connect) or the address kvidx binds (bind mode) */
    const char *replay_endpoint;  /* engine ROUTER, or NULL / "" for none */
    const char *topic;            /* subscription prefix (connect; NULL = "") or identity (bind) */
    enum kvi_listen_mode mode;
    enum kvi_gap_policy gap_policy; /* gaps without replay: apply (default) or clear */
    uint32_t block_size;          /* registered block size; 0 = the index's */
    int32_t group;                /* KV-cache group indexed (0) */
    uint32_t skip_tiers;          /* bit (1u << tier): skip events on that tier */
    bool exact_topic;             /* bind mode: frame 0 must equal topic (not just start with it) */
    bool seed_watermark;          /* start with W = watermark (kvi_listeners_seed) rather than unset */
    uint64_t watermark;           /* with seed_watermark */
    kvi_ingest_mirror_fn mirror;  /* called for each index op made for this registration (net/ingest.h
                                     MIRROR; pos.seq = the batch's seq), or NULL */
    void *mirror_ctx;             /* must outlive the registration */
};

/** The key of a registration. */
struct kvi_listener_key {
    struct kvi_index *ix;
    uint64_t instance_id;
    const char *instance_name; /* NULL for numeric ids */
    uint32_t dp_rank;
};

/** A snapshot of one listener. */
struct kvi_listener_info {
    struct kvi_index *ix;
    uint64_t instance_id;
    bool has_name;
    char instance_name[KVI_LISTEN_NAME_MAX];
    uint32_t instance;           /* dense id in ix */
    uint32_t dp_rank;
    enum kvi_listen_mode mode;
    enum kvi_gap_policy gap_policy;
    char endpoint[KVI_LISTEN_EP_MAX];
    char replay_endpoint[KVI_LISTEN_EP_MAX]; /* "" when none */
    char topic[KVI_LISTEN_NAME_MAX];
    enum kvi_listener_state state;
    char last_error[KVI_LISTEN_ERR_MAX];     /* "" when none */
    bool watermark_set;
    uint64_t watermark;          /* W: last applied seq */
    bool last_live_set;
    uint64_t last_live;          /* L: last seq seen live */
    bool replaying;
    uint32_t thread;             /* listener thread index */
    struct kvi_listener_counters ctr;
    /*
     * Liveness (LIVENESS above). Written by the
     * listener thread as relaxed atomics: each field is current on its own,
     * not as of one instant with the others. The message count is
     * ctr.messages.
     */
    bool monitored;              /* connected is known: false only while the SUB is open without a monitor */
    bool connected;              /* ZMQ reports a connection up: connect mode, the SUB's to the engine; bind
                                    mode, at least one engine accepted on the endpoint and not disconnected
                                    (false while paused, failed or unsubscribed) */
    uint32_t peers;              /* connections up (bind mode: engines connected to the shared endpoint) */
    bool last_message_set;       /* a live message has arrived since registration */
    uint64_t last_message_age_ns; /* how long before the snapshot the last live message arrived */
};

/** Totals over every listener, departed ones included (counters only grow). */
struct kvi_listener_totals {
    uint32_t listeners;                          /* registered now */
    uint32_t by_state[KVI_LISTENER_STATES];      /* registered now, by state */
    uint32_t threads;
    uint64_t unknown_topic;    /* bind mode: messages whose topic matched no registration (and not held) */
    uint64_t held_dropped;     /* open bind endpoints: held messages dropped past max_held */
    uint64_t writer_stalls;    /* writer-pool submits that found a ring full (all producers) */
    struct kvi_listener_counters ctr;
};

/** Per-thread figures (for benchmarks and /metrics). */
struct kvi_listener_thread_stats {
    uint32_t listeners;   /* registrations served */
    uint32_t sockets;     /* ZMQ sockets open */
    uint64_t wakeups;     /* epoll_wait returns */
    uint64_t messages;    /* messages read (live, replay, malformed) */
    uint64_t decode_ns;   /* time in kvi_decode_batch (config.timing) */
    uint64_t ingest_ns;   /* time in kvi_ingest_batch, submits included (config.timing) */
    uint64_t busy_ns;     /* time not waiting in epoll (config.timing) */
    uint64_t cpu_ns;      /* CPU time the thread has used (user + system) */
};

struct kvi_listeners;

/**
 * Stop every listener (as unregister does, in turn), then the threads, and
 * free the pool. Destroy it before the writer pool. No other call may run.
 */
void kvi_listeners_destroy(struct kvi_listeners *lp);

/**
 * Create the pool and start its threads (each creates its producer on
 * @p writers and its decoder).
 * @param cfg  settings, or NULL for the defaults
 * @return the pool, or NULL with errno: EINVAL (thread count), ENOMEM,
 *         ENOSPC (no producer left on @p writers), or the error of
 *         zmq_ctx_new / eventfd / epoll_create / pthread_create.
 */
KVI_DEALLOC(kvi_listeners_destroy, 1) KVI_WARN_UNUSED
struct kvi_listeners *kvi_listeners_create(struct kvi_writer_pool *writers, const struct kvi_listeners_config *cfg);

/**
 * Register a listener. Validates the spec, then hands it to a thread and
 * waits until the thread has set up its sockets: on return the listener is
 * active (or pending in a gated pool), or failed with last_error set (bind
 * failure, connect error): that is not an error of this call.
 * @return 0; -EINVAL (ix NULL, endpoint or replay endpoint invalid per
 *         kvi_endpoint_validate, string too long, block size or mode wrong:
 *         the daemon's 400); -EEXIST (the key is registered, or in bind mode
 *         the endpoint already has a registration with this topic: the
 *         daemon's 409); -ENOMEM.
 */
int kvi_listeners_register(struct kvi_listeners *lp, const struct kvi_listener_spec *spec);

/**
 * Validate a spec as register would, without registering (for the daemon's
 * 400 before it creates anything). @param err  one-line reason (may be NULL)
 * @return 0 or -EINVAL.
 */
int kvi_listeners_validate(const struct kvi_listener_spec *spec, char *err, size_t errlen);

/**
 * Unregister: close the sockets, drop any replay and buffered batches,
 * delete the watermarks (a re-registration starts fresh), and wait until
 * every op the listener submitted has been applied. The rank's blocks stay
 * in the index (dropping them is the caller's decision: remove_dp_rank or
 * remove_instance through its own producer, now correctly ordered after the
 * listener's ops). Its counters move into the totals.
 * @return 0, or -ENOENT when the key is not registered.
 */
int kvi_listeners_unregister(struct kvi_listeners *lp, const struct kvi_listener_key *key);

/**
 * Pause a pending or active listener: close its SUB (bind mode: unsubscribe
 * its topic) and DEALER, abandon a running replay and its buffered batches;
 * the watermarks are kept.
 * @return 0, -ENOENT (not registered), -EBUSY (paused or failed: not pausable).
 */
int kvi_listeners_pause(struct kvi_listeners *lp, const struct kvi_listener_key *key);

/**
 * Resume a paused or failed listener: new sockets, state active (pending in
 * a gated pool whose gate is still closed) or failed again.
 * @return 0, -ENOENT, -EBUSY (pending or active: not resumable).
 */
int kvi_listeners_resume(struct kvi_listeners *lp, const struct kvi_listener_key *key);

/**
 * Open the gate of a gated pool: every pending listener starts draining what
 * its sockets buffered (active). Later registrations start active. No-op on
 * an ungated pool or an open gate.
 */
void kvi_listeners_open_gate(struct kvi_listeners *lp);

/**
 * Seed a registration's watermark W := @p seq, as if every batch up to @p seq
 * had been applied (L stays unset): a watermark recovered from a peer's
 * /dump (http-api.md §1.11), whose blocks are already in the index. Only
 * before the listener drains anything: a pending listener of a gated pool
 * (the buffered messages are then judged against W), or paused / failed
 * ones that never drained. The listener's applied position (below) is set
 * to @p seq as well, so a dump of this replica names the seeded batches.
 * The same at registration: kvi_listener_spec.seed_watermark.
 * @return 0, -ENOENT (not registered), -EBUSY (it has drained already).
 */
int kvi_listeners_seed(struct kvi_listeners *lp, const struct kvi_listener_key *key, uint64_t seq);

/** One registration's applied position, for a dump (kvi_listeners_applied). */
struct kvi_listener_applied {
    uint64_t instance_id;
    const char *instance_name; /* NULL for numeric ids; valid during the callback only */
    uint32_t dp_rank;
    uint64_t seq;              /* the last batch all of whose ops are applied */
};

/**
 * Call @p fn for every registration of index @p ix whose instance is in
 * partition @p part and whose applied position is set: the seq of the last
 * batch of its stream all of whose ops on its own instance the partition's
 * writer has applied (published by that writer, engine/writer.h struct
 * kvi_op_sink: batches without ops, or whose ops are on shared pools only,
 * are named by the next batch). Called on the partition's writer (the `pre`
 * hook of kvi_producer_dump_partition_pre), the positions are exactly those
 * of the blocks dumped. Any thread, writer threads included (the registry
 * lock is never held while waiting for a writer); @p fn runs with that lock
 * held and must not call into the pool. @return the number of calls.
 */
size_t kvi_listeners_applied(struct kvi_listeners *lp, struct kvi_index *ix, uint32_t part,
                             void (*fn)(void *ctx, const struct kvi_listener_applied *a), void *ctx);

/** @return 0 with @p out filled, or -ENOENT. */
int kvi_listeners_get(struct kvi_listeners *lp, const struct kvi_listener_key *key, struct kvi_listener_info *out);

/**
 * Call @p fn once per registered listener (order unspecified) with a
 * snapshot. @p fn runs with the pool's registry lock held: it must not call
 * back into the pool. @return the number of listeners visited.
 */
size_t kvi_listeners_foreach(struct kvi_listeners *lp, void (*fn)(void *ctx, const struct kvi_listener_info *info),
                             void *ctx);

/** Totals over every listener and thread. */
void kvi_listeners_totals(struct kvi_listeners *lp, struct kvi_listener_totals *out);

/**
 * Set the most distinct dp ranks a registration may hold (RANKS); 0 = the
 * default (KVI_LISTEN_MAX_RANKS_DEFAULT). Any thread. Applies to the ranks
 * that batches name from now on: ranks a registration already holds stay
 * (until its next clear), a lower bound only refuses new ones.
 */
void kvi_listeners_set_max_ranks(struct kvi_listeners *lp, uint32_t max_ranks);

/**
 * Called on a listener thread for a message of an open bind endpoint whose
 * topic (@p topic_len bytes, not NUL-terminated) no registration matches,
 * with its seq and payload (valid during the call). It must not call into
 * the pool (it may hand work to a thread that does). @return true to hold the
 * message for a registration of that topic about to be made.
 */
typedef bool (*kvi_listener_unknown_fn)(void *ctx, const char *endpoint, const void *topic, size_t topic_len,
                                        uint64_t seq, const void *payload, size_t payload_len);

#define KVI_LISTEN_DEFAULT_MAX_HELD 4096 /* messages an open bind endpoint holds (kvi_listeners_bind_open) */

/** An open bind endpoint (kvi_listeners_bind_open). Strings are copied. */
struct kvi_listener_bind_spec {
    const char *endpoint;           /* the address kvidx binds */
    const char *prefix;             /* subscribed topic prefix ("" = every message) */
    kvi_listener_unknown_fn on_unknown; /* NULL: unmatched messages are counted and dropped */
    void *ctx;
    uint32_t max_held;              /* 0 = KVI_LISTEN_DEFAULT_MAX_HELD */
};

/**
 * Open a bind endpoint that stays bound without registrations (open bind
 * endpoints, MODES above) until kvi_listeners_bind_close or the pool is
 * destroyed. Bind-mode
 * registrations naming the same endpoint share its socket (their topics are
 * subscribed as usual; the prefix stays subscribed). Any thread, as
 * register.
 * @return 0; -EINVAL (endpoint invalid, prefix too long); -EEXIST (the
 *         endpoint is open or registered already); or the bind's -errno
 *         (-EADDRINUSE ...), in which case nothing is kept.
 */
int kvi_listeners_bind_open(struct kvi_listeners *lp, const struct kvi_listener_bind_spec *spec);

/**
 * Close an open bind endpoint: once this returns, on_unknown is not called
 * for it any more, its held messages are dropped and its prefix is
 * unsubscribed. The socket closes now when no registration names the
 * endpoint, else with the last of them (unregister them first to free the
 * port). Once no registration names it, it may be opened again
 * (kvi_listeners_bind_open answers -EEXIST before). Any thread, as
 * unregister.
 * @return 0; -ENOENT (@p endpoint is not an open bind endpoint).
 */
int kvi_listeners_bind_close(struct kvi_listeners *lp, const char *endpoint);

/**
 * The dp ranks the batches of registration @p key named since its last
 * clear (a restart, a clear policy: RANKS), ascending; its registered rank
 * counts once a batch used it (naming it, or no rank). Any thread.
 * @return how many there are (the first @p cap written to @p out), or -ENOENT.
 */
int kvi_listeners_ranks(struct kvi_listeners *lp, const struct kvi_listener_key *key, uint32_t *out, size_t cap);

/** The current bound of kvi_listeners_set_max_ranks. Any thread. */
uint32_t kvi_listeners_max_ranks(const struct kvi_listeners *lp);

/** Number of listener threads. */
uint32_t kvi_listeners_threads(const struct kvi_listeners *lp);

/** Figures of listener thread @p t (< kvi_listeners_threads). */
void kvi_listener_thread_stats(struct kvi_listeners *lp, uint32_t t, struct kvi_listener_thread_stats *out);

#endif
