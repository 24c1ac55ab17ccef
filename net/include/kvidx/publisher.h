/*
 * kvidx publisher: publish KV-cache events from a C or C++ inference engine
 * over ZeroMQ, byte-compatible with vLLM's ZmqEventPublisher, so that kvidx,
 * Dynamo, llm-d or any other vLLM event consumer can index the engine's
 * cache. It is the C counterpart of Dynamo's Python KvEventPublisher in
 * direct-publishing mode.
 *
 * On the wire (one ZMQ multipart message per batch, as vLLM sends it):
 *
 *     frame 0  topic (the configured string; "" gives an empty frame)
 *     frame 1  sequence number: 8 bytes, big-endian, unsigned; 0 for the
 *              first batch of a publisher, +1 per batch
 *     frame 2  msgpack [ts float64, [event, ...], dp_rank]
 *
 * Each event is a vLLM "BlockStored", "BlockRemoved" or "AllBlocksCleared",
 * encoded either as a tagged map (vLLM >= #42892, the default) or as a tagged
 * array (vLLM <= #40984, SGLang); block hashes go out as uint64 (vLLM >=
 * 0.10.2), int64 (SGLang), or as 32- or 16-byte bin digests
 * (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
 *
 * Usage: publish_* calls append events to the current batch; kvidx_pub_flush
 * sends the batch as one message with the next sequence number (or let the
 * publisher flush automatically, see kvidx_pub_config.auto_flush). With a
 * replay endpoint, the last `buffer_batches` batches are kept and served to
 * consumers that detect a gap, from a ROUTER socket answered by an internal
 * thread (vLLM's replay protocol, both reply layouts).
 *
 * Errors: functions returning int return 0 on success or a negative errno:
 * -EINVAL for a bad argument, -ENOMEM when memory ran out, -EIO when a ZMQ
 * call failed (the ZMQ errno is then available from kvidx_pub_last_error),
 * or a NATS call failed (then it holds the natsStatus); NATS also -ENOBUFS
 * when a publisher holds nats_max_pending events (see "Delivery" in the
 * NATS section). kvidx_pub_create returns NULL with errno set.
 *
 * Thread-safety: a publisher is used by one thread at a time (every function
 * taking a publisher, unless its comment says otherwise). Moving a publisher
 * to another thread needs a happens-before edge (a mutex, a thread join).
 * Different publishers are independent. The replay ROUTER is served by a
 * thread each publisher starts and stops itself; a NATS publisher's
 * connection has libnats' own threads, which never call back into it.
 *
 * Fault injection (section at the end): kvidx_pub_skip_live,
 * kvidx_pub_set_replay_faults and kvidx_pub_send_raw deliberately break the
 * stream (lost live batches, lost or late replay replies, garbage messages).
 * They exist for consumers' tests; an engine never calls them.
 *
 * NATS transports (kvidx_pub_config.transport): the same calls publish
 * Dynamo RouterEvents on NATS instead, one message per event, to Core NATS
 * (Dynamo >= 1.0's event plane: a msgpack envelope around a msgpack
 * RouterEvent) or to a JetStream stream (a JSON RouterEvent with a
 * Nats-Msg-Id header for de-duplication). See "NATS transports" below for
 * the wire format and for what each function does there.
 *
 * Link with -lkvidx_publisher (pkg-config: kvidx-publisher). The library
 * depends on libzmq, libnats and pthreads only (it writes its msgpack with
 * kvidx's own primitives, net/msgpack_wire.h, compiled in, and hashes tokens
 * with xxhash's header-only XXH3); this header needs none of them.
 */
#ifndef KVIDX_PUBLISHER_H
#define KVIDX_PUBLISHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && __GNUC__ >= 4
#define KVIDX_PUB_API __attribute__((visibility("default")))
#else
#define KVIDX_PUB_API
#endif

/** Default ring size of the replay buffer, in batches (vLLM buffer_steps). */
#define KVIDX_PUB_DEFAULT_BUFFER_BATCHES 10000u
/** Default send high-water mark of the PUB socket, in messages (vLLM hwm). */
#define KVIDX_PUB_DEFAULT_HWM 100000
/** Default time create() keeps retrying a bind whose address is still in use. */
#define KVIDX_PUB_DEFAULT_REBIND_MS 2000u

/** dp_rank value: the batch's rank element is nil. */
#define KVIDX_PUB_RANK_NIL INT32_MIN
/** dp_rank value: 2-element batches [ts, events] (vLLM < #18925, SGLang < #6852). */
#define KVIDX_PUB_RANK_OMIT (INT32_MIN + 1)

/** kvidx_pub_flush's sequence number when nothing was sent. */
#define KVIDX_PUB_NO_SEQ UINT64_MAX

/** Event encoding. */
enum kvidx_pub_form {
    /** Tagged maps {"type": "BlockStored", ...} (vLLM >= #42892, mid-2026). */
    KVIDX_PUB_FORM_MAP = 0,
    /** Tagged arrays ["BlockStored", ...] (vLLM <= #40984, SGLang). */
    KVIDX_PUB_FORM_ARRAY = 1,
};

/** How block hashes (and parent hashes) are written. */
enum kvidx_pub_hash_enc {
    /** msgpack unsigned int, smallest width (vLLM >= 0.10.2). */
    KVIDX_PUB_HASH_U64 = 0,
    /** the u64 reinterpreted as int64: values >= 2^63 go out negative (SGLang). */
    KVIDX_PUB_HASH_I64 = 1,
    /**
     * bin 32: a SHA-256-sized digest whose last 8 bytes are the u64 big-endian
     * (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0). The first 24 bytes are a
     * deterministic non-zero mix of the hash, so a consumer that reads the
     * wrong bytes gets a wrong hash.
     */
    KVIDX_PUB_HASH_BIN32 = 2,
    /** bin 16 (vLLM's xxhash digests), last 8 bytes big-endian as above. */
    KVIDX_PUB_HASH_BIN16 = 3,
};

/** Replay reply layout, as a DEALER receives it. */
enum kvidx_pub_replay_layout {
    /**
     * vLLM >= #45177: ["", topic, seq8, payload] per batch, sentinel
     * ["", "", ff x 8, ""].
     */
    KVIDX_PUB_REPLAY_TOPIC = 0,
    /** older vLLM, SGLang, Dynamo's mocker: ["", seq8, payload], sentinel ["", ff x 8, ""]. */
    KVIDX_PUB_REPLAY_LEGACY = 1,
};

/** Whether the PUB socket binds or connects. */
enum kvidx_pub_socket_mode {
    /**
     * vLLM's rule: bind when the endpoint contains "*" or "::" or starts with
     * "ipc://" or "inproc://"; connect otherwise (then the consumer binds).
     */
    KVIDX_PUB_SOCKET_AUTO = 0,
    KVIDX_PUB_SOCKET_BIND = 1,
    KVIDX_PUB_SOCKET_CONNECT = 2,
};

/**
 * Transport (kvidx_pub_config.transport).
 *
 * NATS transports. Each event is one message holding one Dynamo RouterEvent
 * (net/README.md, "NATS transport"):
 *
 *     {"worker_id": u64, "storage_tier": str,
 *      "event": {"event_id": u64,
 *                "data": {"stored": {"parent_hash": u64|null,
 *                                    "start_position": null,
 *                                    "blocks": [{"block_hash": u64,
 *                                                "tokens_hash": u64,
 *                                                "mm_extra_info": null}, ...]}}
 *                      | {"removed": {"block_hashes": [u64, ...]}}
 *                      | "cleared",
 *                "dp_rank": u32}}
 *
 * - worker_id and dp_rank come from the config (dp_rank must be >= 0);
 *   event_id is the publisher's event counter (0, 1, 2, ...).
 * - storage_tier comes from the event's medium (the publisher's for
 *   cleared), compared case-insensitively: "GPU" or NULL -> "device",
 *   "CPU" -> "host_pinned", "DISK" -> "disk", any other -> "external".
 * - tokens_hash of block i is XXH3-64 of its block_size token ids as
 *   little-endian u32, seed 1337, plus XXH3-64(lora_name, seed 0) (wrapping)
 *   when the event's lora_name is non-empty: kvidx's content hash. A stored
 *   event therefore needs its tokens: n_tokens == n_hashes * block_size,
 *   block_size > 0, token_ids_nil false; otherwise -EINVAL.
 * - start_position is always null (struct kvidx_pub_stored has no field
 *   for it); group_idx is not sent; mm_extra_info is always null.
 * - u64 values are written exactly (msgpack uint 64 / JSON integers).
 *
 * KVIDX_PUB_TRANSPORT_NATS_CORE publishes on nats_subject (Dynamo's is
 * "namespace.{ns}.component.{comp}.kv-events") a msgpack map
 *
 *     {"publisher_id": u64, "sequence": u64, "published_at": u64 (ms since
 *      the epoch), "topic": "kv-events", "payload": bin}
 *
 * whose payload is the RouterEvent as a msgpack map with named fields (the
 * variants as one-entry maps, "cleared" as a string, null as nil). sequence
 * counts the publisher's messages from 0 (kvidx_pub_next_seq).
 *
 * KVIDX_PUB_TRANSPORT_NATS_JETSTREAM publishes the RouterEvent as JSON with
 * js_Publish (waiting for the stream's acknowledgement) to the subject
 * "<stream>.kv-events", with header Nats-Msg-Id "<worker_id>-<dp_rank>-
 * <publisher_id>-<event_id>": the server drops a message whose id it saw
 * within the stream's duplicate window (2 minutes by default), so a publish
 * retried after a lost acknowledgement is stored once. publisher_id is in
 * the id because a restarted publisher starts again at event_id 0: with a
 * new (random) publisher_id its events are new messages; one restarted with
 * the same configured nats_publisher_id inside the window would have its
 * first events dropped as duplicates.
 */
enum kvidx_pub_transport {
    KVIDX_PUB_TRANSPORT_ZMQ = 0,            /**< vLLM batches over ZMQ (default) */
    KVIDX_PUB_TRANSPORT_NATS_CORE = 1,      /**< Dynamo >= 1.0 Core NATS event plane */
    KVIDX_PUB_TRANSPORT_NATS_JETSTREAM = 2, /**< Dynamo JetStream (durable) event plane */
};

/** Default NATS server list (libnats' NATS_DEFAULT_URL). */
#define KVIDX_PUB_DEFAULT_NATS_URL "nats://localhost:4222"
/** Default NATS timeout (connect, JetStream requests and acks, final flush), ms. */
#define KVIDX_PUB_DEFAULT_NATS_TIMEOUT_MS 5000u
/** Default bound on the events a NATS publisher holds unpublished (kvidx_pub_config.nats_max_pending). */
#define KVIDX_PUB_DEFAULT_NATS_MAX_PENDING 100000u

/** kvidx_pub_config.flags */
enum kvidx_pub_flags {
    /**
     * Write map-form BlockStored headers as map16 even when they hold fewer
     * than 16 keys, as msgspec does for a struct with 16 or more possible
     * fields (wire-protocol.md section 3.2: accept any header width).
     * BlockRemoved and AllBlocksCleared keep fixmap headers.
     */
    KVIDX_PUB_F_WIDE_HEADERS = 1u << 0,
    /**
     * Offset both endpoints by dp_rank like vLLM's offset_endpoint_port
     * (see kvidx_pub_offset_endpoint). Ignored when dp_rank <= 0.
     */
    KVIDX_PUB_F_OFFSET_BY_RANK = 1u << 1,
    /**
     * JetStream transport: create the stream when it does not exist (subjects
     * "<stream>.*", file storage, max age 1 hour, otherwise the server's
     * defaults, as Dynamo creates it). Without it a missing stream makes
     * kvidx_pub_create fail with ENOENT.
     */
    KVIDX_PUB_F_NATS_CREATE_STREAM = 1u << 2,
};

/**
 * Publisher settings. Fill with kvidx_pub_config_init, then override.
 * Strings are copied by kvidx_pub_create; the caller keeps ownership.
 */
struct kvidx_pub_config {
    /** PUB endpoint (required for ZMQ), e.g. "tcp://" "*:5557" (a wildcard host binds). */
    const char *endpoint;
    /** Replay ROUTER endpoint (always bound), e.g. "tcp://" "*:5558"; NULL: no replay. */
    const char *replay_endpoint;
    /** Topic, frame 0 of every live message. NULL or "": empty frame. Default "". */
    const char *topic;
    /** Default `medium` of events; NULL writes nil. Default "GPU". */
    const char *medium;
    /** Default `lora_name` of stored events; NULL writes nil. Default NULL.
     *  NATS: not sent; a non-empty name changes tokens_hash. */
    const char *lora_name;
    /**
     * A ZMQ context (void * from zmq_ctx_new) to create the sockets in, for
     * inproc:// endpoints shared with the consumer. It must outlive the
     * publisher. NULL (default): the publisher owns a context of its own.
     */
    void *zmq_ctx;
    /** Replay ring size in batches; 0 means the default (10,000). Used only with a replay endpoint. */
    uint32_t buffer_batches;
    /**
     * 0 (default): batches are sent only by kvidx_pub_flush. 1: every
     * publish call sends its event as a batch of one. N > 1: a batch is sent
     * when it reaches N events (and by kvidx_pub_flush).
     */
    uint32_t auto_flush;
    /** The batch's rank element; KVIDX_PUB_RANK_NIL / KVIDX_PUB_RANK_OMIT. Default 0.
     *  NATS: the RouterEvent's dp_rank, >= 0 (and part of the Nats-Msg-Id). */
    int32_t dp_rank;
    /** PUB send high-water mark in messages (0 = unlimited). Default 100,000. */
    int hwm;
    /**
     * Array form only: number of BlockStored elements, 5..12, for the layouts
     * of successive vLLM versions (wire-protocol.md section 3.1): 5 Dynamo
     * mocker, 6 #16750, 7 +medium, 8 +lora_name, 9 +extra_keys,
     * 10 +group_idx, 12 +kv_cache_spec_kind and _sliding_window (#40984);
     * 11 (kind without the window) was never released but is accepted.
     * BlockRemoved follows: 2 elements up to 6, 3 up to 9, 4 from 10.
     * 0 or 12 (default): vLLM #40984, the last array-form vLLM.
     */
    uint32_t array_len;
    /** How long create() retries binds failing with EADDRINUSE (ms). Default 2,000. */
    uint32_t rebind_ms;
    enum kvidx_pub_form form;                   /**< default KVIDX_PUB_FORM_MAP */
    enum kvidx_pub_hash_enc hash_enc;           /**< default KVIDX_PUB_HASH_U64 */
    enum kvidx_pub_replay_layout replay_layout; /**< default KVIDX_PUB_REPLAY_TOPIC */
    enum kvidx_pub_socket_mode socket_mode;     /**< default KVIDX_PUB_SOCKET_AUTO */
    uint32_t flags;                             /**< enum kvidx_pub_flags; default 0 */

    /* --- appended for the NATS transports (ZMQ ignores them) --- */

    /** default KVIDX_PUB_TRANSPORT_ZMQ. The NATS transports ignore endpoint
     *  and every ZMQ-only field (replay, topic, form, hash_enc, array_len,
     *  hwm, rebind_ms, socket_mode, zmq_ctx). */
    enum kvidx_pub_transport transport;
    /** NATS server URL, or a comma-separated list of them (reconnects go
     *  through the list). NULL (default): KVIDX_PUB_DEFAULT_NATS_URL. */
    const char *nats_url;
    /** Core: the subject (required). JetStream: the subject the stream name
     *  is derived from (kvidx_pub_nats_stream_name) when nats_stream is NULL. */
    const char *nats_subject;
    /** JetStream: the stream name; NULL: derived from nats_subject. */
    const char *nats_stream;
    /** RouterEvent worker_id. Default 0. */
    uint64_t worker_id;
    /** Core envelope publisher_id; 0 (default): a random non-zero id drawn
     *  at create (kvidx_pub_nats_publisher_id). */
    uint64_t nats_publisher_id;
    /** ms; 0 (default): KVIDX_PUB_DEFAULT_NATS_TIMEOUT_MS. */
    uint32_t nats_timeout_ms;
    /**
     * The most events the publisher holds accepted but not yet published:
     * those of the current batch plus those kept after a failed publish, to
     * be retried (see "Delivery" in the NATS section below). A publish call
     * that would exceed it fails with -ENOBUFS. 0 (default):
     * KVIDX_PUB_DEFAULT_NATS_MAX_PENDING.
     */
    uint32_t nats_max_pending;
};

/**
 * A stored event with every per-event field. A zero-initialised struct plus
 * the hashes is a valid event: no parent, empty token_ids, block_size 0,
 * the publisher's medium and lora_name, group_idx 0.
 */
struct kvidx_pub_stored {
    const uint64_t *block_hashes; /**< n_hashes hashes (chained, oldest first) */
    size_t n_hashes;
    const uint64_t *parent_hash;  /**< hash of the block before the first; NULL: nil */
    const uint32_t *token_ids;    /**< n_tokens token ids; may be NULL when n_tokens is 0 */
    size_t n_tokens;
    bool token_ids_nil;           /**< write token_ids as nil instead of an array */
    uint32_t block_size;          /**< tokens per block (0 for offload placeholders) */
    const char *medium;           /**< NULL: the publisher's medium */
    const char *lora_name;        /**< NULL: the publisher's lora_name */
    int32_t group_idx;            /**< KV-cache group (hybrid models); normally 0 */
};

/** A removed event with every per-event field (zero-initialised = defaults). */
struct kvidx_pub_removed {
    const uint64_t *block_hashes;
    size_t n_hashes;
    const char *medium;           /**< NULL: the publisher's medium */
    int32_t group_idx;
};

/** Counters (kvidx_pub_get_stats). */
struct kvidx_pub_stats {
    uint64_t next_seq;          /**< sequence number of the next batch */
    uint64_t next_event_id;     /**< id of the next event */
    uint64_t batches;           /**< batches flushed (sequence numbers consumed) */
    uint64_t batches_live;      /**< of which sent on the PUB */
    uint64_t batches_skipped;   /**< of which withheld by kvidx_pub_skip_live */
    uint64_t events;            /**< events flushed */
    uint64_t bytes;             /**< payload bytes flushed */
    uint64_t send_errors;       /**< failed PUB sends */
    uint64_t raw_messages;      /**< kvidx_pub_send_raw messages */
    uint64_t replay_requests;   /**< well-formed replay requests received */
    uint64_t replay_malformed;  /**< replay requests ignored as malformed */
    uint64_t replay_silenced;   /**< requests ignored by the silent fault */
    uint64_t replay_batches;    /**< batches sent in replay replies */
    uint64_t replay_dropped;    /**< reply batches withheld by the drop fault */
    uint64_t replay_buffered;   /**< batches in the replay ring now */
    /* --- appended for the NATS transports (0 on ZMQ) --- */
    uint64_t retries;           /**< publishes of a message whose earlier publish had failed */
    uint64_t duplicates;        /**< JetStream acks saying the stream already held the message
                                 *   (a retried one whose failed publish had in fact been stored) */
    uint64_t dropped;           /**< messages given up because they can never be published
                                 *   (over max_payload): their ids and sequence numbers consumed */
};

/** Replay faults (kvidx_pub_set_replay_faults); all zero = no fault. */
struct kvidx_pub_replay_faults {
    /** k > 0: withhold the k-th, 2k-th, ... batch of every reply (the sentinel still goes out). */
    uint32_t drop_every;
    /** Wait this many ms before answering each request. */
    uint32_t delay_ms;
    /** Ignore requests altogether (no reply, no sentinel). */
    bool silent;
};

struct kvidx_pub;

/**
 * Fill @p cfg with the defaults listed at each field (endpoint NULL).
 * Thread-safe.
 */
KVIDX_PUB_API void kvidx_pub_config_init(struct kvidx_pub_config *cfg);

/**
 * Create a publisher: create, set up and bind or connect the PUB socket and,
 * with a replay endpoint, bind the ROUTER and start the replay thread.
 * Both sockets use ZMQ_LINGER 0, so destroying a publisher and creating one
 * on the same endpoints right away works (a "restart": the sequence starts
 * again at 0); a bind failing with EADDRINUSE is retried for cfg->rebind_ms.
 * Thread-safe.
 *
 * @param cfg  settings; copied, the caller keeps ownership.
 * @return the publisher (free with kvidx_pub_destroy), or NULL with errno:
 *         EINVAL (missing endpoint, an enum or array_len out of range, a rank
 *         offset that cannot be applied), ENOMEM, or the ZMQ errno of a
 *         failed socket call (e.g. EADDRINUSE, EPROTONOSUPPORT, ENOENT).
 */
KVIDX_PUB_API struct kvidx_pub *kvidx_pub_create(const struct kvidx_pub_config *cfg);

/**
 * Destroy a publisher: stop the replay thread, close both sockets (pending
 * messages are dropped, linger 0) and free everything. Events not yet flushed
 * are discarded: call kvidx_pub_flush first to send them. NULL is a no-op.
 * Not thread-safe with any other call on @p pub.
 */
KVIDX_PUB_API void kvidx_pub_destroy(struct kvidx_pub *pub);

/**
 * Append a BlockStored event to the current batch, with the publisher's
 * medium and lora_name, group_idx 0 (see kvidx_pub_publish_stored_ex).
 *
 * @param hashes      n_hashes block hashes, chained, oldest first (n_hashes >= 1)
 * @param parent      the hash of the block before hashes[0]; NULL: nil (sequence start)
 * @param tokens      n_tokens token ids (block_size per block); NULL only if n_tokens is 0
 * @param block_size  tokens per block
 * @param event_id    out, may be NULL: the event's id (0, 1, 2, ... per publisher)
 * @return 0, -EINVAL (hashes NULL or n_hashes 0, tokens NULL with n_tokens > 0),
 *         -ENOMEM, or the error of an automatic flush (then the event was
 *         appended and given its id, and the batch was consumed as described
 *         at kvidx_pub_flush; NATS: held for a retry, see Delivery). NATS
 *         also: -ENOBUFS (nats_max_pending events held; not accepted).
 */
KVIDX_PUB_API int kvidx_pub_publish_stored(struct kvidx_pub *pub, const uint64_t *hashes,
                                           size_t n_hashes, const uint64_t *parent,
                                           const uint32_t *tokens, size_t n_tokens,
                                           uint32_t block_size, uint64_t *event_id);

/**
 * Append a BlockStored event with every field given by @p ev.
 * @return as kvidx_pub_publish_stored.
 */
KVIDX_PUB_API int kvidx_pub_publish_stored_ex(struct kvidx_pub *pub,
                                              const struct kvidx_pub_stored *ev,
                                              uint64_t *event_id);

/**
 * Append a BlockRemoved event (publisher's medium, group_idx 0).
 * @param hashes    n_hashes hashes (n_hashes >= 1)
 * @param event_id  out, may be NULL
 * @return 0, -EINVAL, -ENOMEM, or the error of an automatic flush.
 */
KVIDX_PUB_API int kvidx_pub_publish_removed(struct kvidx_pub *pub, const uint64_t *hashes,
                                            size_t n_hashes, uint64_t *event_id);

/** Append a BlockRemoved event with every field given by @p ev. @return as above. */
KVIDX_PUB_API int kvidx_pub_publish_removed_ex(struct kvidx_pub *pub,
                                               const struct kvidx_pub_removed *ev,
                                               uint64_t *event_id);

/**
 * Append an AllBlocksCleared event (the whole cache of this engine is gone).
 * @return 0, -ENOMEM, or the error of an automatic flush.
 */
KVIDX_PUB_API int kvidx_pub_publish_cleared(struct kvidx_pub *pub, uint64_t *event_id);

/**
 * Send the current batch as one message with the next sequence number, and
 * keep it in the replay ring. An empty batch sends nothing (like vLLM).
 *
 * The sequence number is consumed and the batch enters the replay ring before
 * the PUB send; if the send fails, consumers see a gap that replay can fill.
 *
 * @param seq  out, may be NULL: the batch's sequence number, or
 *             KVIDX_PUB_NO_SEQ when there was nothing to send.
 * @return 0, -ENOMEM, or -EIO (the PUB send failed; kvidx_pub_last_error).
 */
KVIDX_PUB_API int kvidx_pub_flush(struct kvidx_pub *pub, uint64_t *seq);

/**
 * Send a batch with an empty event list ([ts, [], rank]), consuming a
 * sequence number (a heartbeat, as some TensorRT-LLM builds send). Pending
 * events are flushed first, as their own batch.
 * @return as kvidx_pub_flush.
 */
KVIDX_PUB_API int kvidx_pub_flush_empty(struct kvidx_pub *pub, uint64_t *seq);

/**
 * Send a caller-encoded payload as frame 2 of a batch with the next sequence
 * number, and keep it for replay, exactly as a flushed batch (for consumers'
 * tests of encodings this library does not produce). Pending events are
 * flushed first, as their own batch. The payload is copied.
 * @return 0, -EINVAL (payload NULL with len > 0), -ENOMEM, -EIO.
 */
KVIDX_PUB_API int kvidx_pub_publish_payload(struct kvidx_pub *pub, const void *payload,
                                            size_t len, uint64_t *seq);

/** Number of events in the current (unflushed) batch (NATS: every event held, see Delivery). */
KVIDX_PUB_API size_t kvidx_pub_pending(const struct kvidx_pub *pub);

/** Sequence number the next batch will carry (0 for a fresh publisher). */
KVIDX_PUB_API uint64_t kvidx_pub_next_seq(const struct kvidx_pub *pub);

/**
 * The PUB endpoint: when bound, the resolved address (ZMQ_LAST_ENDPOINT,
 * e.g. "tcp://0.0.0.0:40123" for "tcp://" "*:*"); when connected, the endpoint
 * as configured (after any rank offset). Owned by the publisher, valid until
 * it is destroyed.
 */
KVIDX_PUB_API const char *kvidx_pub_endpoint(const struct kvidx_pub *pub);

/** The bound replay endpoint (resolved as above), or NULL without replay. */
KVIDX_PUB_API const char *kvidx_pub_replay_endpoint(const struct kvidx_pub *pub);

/**
 * The ZMQ errno of the last call on @p pub that returned -EIO (0 if none).
 * Pass it to zmq_strerror for a message.
 */
KVIDX_PUB_API int kvidx_pub_last_error(const struct kvidx_pub *pub);

/**
 * Read the counters. The replay counters are updated by the replay thread
 * and read atomically; a request and its batches are counted just before its
 * sentinel is sent, so a client that received the sentinel sees them.
 */
KVIDX_PUB_API void kvidx_pub_get_stats(const struct kvidx_pub *pub, struct kvidx_pub_stats *out);

/**
 * Apply vLLM's DP-rank endpoint convention: rank 0 and NULL are unchanged;
 * "tcp://host:port" becomes "tcp://host:(port + rank)"; "inproc://x" becomes
 * "inproc://x_dp<rank>". Thread-safe.
 * @param out  receives the NUL-terminated result (cap bytes)
 * @return 0, -EINVAL (rank < 0, an ipc:// endpoint with rank > 0 as in vLLM,
 *         no numeric port, port + rank > 65535), -ENOSPC (out too small).
 */
KVIDX_PUB_API int kvidx_pub_offset_endpoint(const char *endpoint, int32_t rank, char *out,
                                            size_t cap);

/* ------------------------------------------------------------------------
 * NATS transports (kvidx_pub_config.transport != KVIDX_PUB_TRANSPORT_ZMQ)
 *
 * The functions above behave as documented, with these differences:
 *
 * kvidx_pub_create connects (waiting up to nats_timeout_ms; afterwards
 *   libnats reconnects by itself, without limit, buffering Core messages
 *   meanwhile) and, for JetStream, looks the stream up (creating it with
 *   KVIDX_PUB_F_NATS_CREATE_STREAM). errno: EINVAL (no nats_subject, or for
 *   JetStream neither nats_subject nor nats_stream; dp_rank < 0; transport
 *   out of range), ENOMEM, ECONNREFUSED (no server reachable), ETIMEDOUT,
 *   ENOENT (the stream does not exist and was not to be created), EIO (any
 *   other NATS failure, e.g. JetStream not enabled on the server).
 * kvidx_pub_destroy waits up to nats_timeout_ms for libnats to send what it
 *   still buffers, then closes the connection. It does not call nats_Close:
 *   libnats' global state stays for other users in the process.
 * kvidx_pub_publish_stored(_ex) also return -EINVAL when the event has no
 *   tokens to hash (see enum kvidx_pub_transport).
 * Every publish_* call also returns -ENOBUFS when nats_max_pending events
 *   are held already (see Delivery): the event is not accepted (no id is
 *   given, *event_id is left alone) and nothing held changes. With
 *   auto_flush > 0 the call first tries one flush to make room.
 * kvidx_pub_flush publishes the held events one message each, oldest first,
 *   and returns 0 once every one is published (Core: queued by libnats,
 *   whose flusher thread sends it; JetStream: acknowledged by the stream),
 *   or -EIO with kvidx_pub_last_error = the natsStatus of the last failure.
 *   @p seq receives the sequence number of the last message that left the
 *   queue in this call (published, withheld by skip_live or dropped), or
 *   KVIDX_PUB_NO_SEQ. After -EIO, kvidx_pub_pending says whether events are
 *   still held (a transient failure) or none (only drops).
 * kvidx_pub_pending counts the held events: the current batch plus those
 *   kept after a failed publish.
 *
 * Delivery (NATS). An event accepted by a publish_* call (0, or -EIO from
 *   its automatic flush: it got its id) is held, encoded once, until it is
 *   published; events leave in event_id order and none overtakes another.
 *   When a publish fails (no server, no stream leader during an election,
 *   no acknowledgement within nats_timeout_ms, the reconnect buffer full),
 *   flush stops at that event: it and every later event stay held, with
 *   their bytes, event ids and Nats-Msg-Ids, and the next flush (or the
 *   next automatically flushing publish call) starts with it again. On
 *   JetStream the retry carries the same Nats-Msg-Id, so if the failed try
 *   was in fact stored (its acknowledgement lost, or sent later from
 *   libnats' reconnect buffer) the stream drops the new copy (counted in
 *   duplicates): the stream holds every event once, in order, as long as a
 *   retry comes within the stream's duplicate window (2 minutes by
 *   default). Sequence numbers are given when a message leaves the queue,
 *   so a Core message retried keeps the numbering gap-free.
 *   Only a message that can never be published is given up: larger than
 *   the server's max_payload (1 MiB by default: a stored event of about
 *   18,000 blocks on Core, 11,000 on JetStream) or refused by the stream as
 *   too large (JetStream error 10054). It is dropped (counted in dropped
 *   and send_errors, its id and sequence number consumed; consumers see an
 *   event_id gap), the flush goes on with the next event, and returns -EIO.
 *   The bound: at most nats_max_pending events are held (default 100,000;
 *   the memory is their encoded size, about 100 bytes per block of a
 *   stored event); a publish call beyond it fails with -ENOBUFS, so an
 *   engine learns of a long outage and decides (wait and flush, or stop);
 *   what was accepted is never dropped for room. Blocking: a flush waits
 *   at most nats_timeout_ms per try and stops at the first transient
 *   failure, so a flush during an outage costs at most one timeout (less
 *   when the failure is immediate, e.g. no responders). kvidx_pub_destroy
 *   discards what is still held (flush until kvidx_pub_pending is 0
 *   first).
 * kvidx_pub_flush_empty returns -ENOTSUP (a RouterEvent holds one event).
 * kvidx_pub_publish_payload: Core: the caller's bytes as the envelope's
 *   payload, with the next sequence number; JetStream: the caller's bytes as
 *   the message, without Nats-Msg-Id. The held events are flushed first; if
 *   that returns -EIO the payload is not sent (it never overtakes an event).
 *   A payload whose own publish fails is not kept (-EIO).
 * kvidx_pub_endpoint returns the subject published to; kvidx_pub_replay_
 *   endpoint NULL; kvidx_pub_set_replay_faults -EINVAL (there is no replay).
 * kvidx_pub_last_error returns the natsStatus of the last -EIO.
 * kvidx_pub_get_stats: a "batch" is one message: batches counts messages
 *   flushed (sequence numbers consumed), batches_live those published,
 *   batches_skipped those withheld by kvidx_pub_skip_live; bytes counts the
 *   message data published (envelope or JSON); send_errors counts failed
 *   publishes (each try), retries the tries of a message that had failed
 *   before, duplicates and dropped as described at their fields; the
 *   replay counters are 0.
 * ------------------------------------------------------------------------ */

/**
 * Dynamo's JetStream stream name for @p subject: lower case (ASCII), then
 * every character outside [a-z0-9_-] becomes "_", then every "_" becomes
 * "-" ("namespace.dynamo.component.backend.kv-events" ->
 * "namespace-dynamo-component-backend-kv-events"). A multi-byte UTF-8
 * character counts as one character. Thread-safe.
 * @param out  receives the NUL-terminated name (cap bytes)
 * @return 0, -EINVAL (subject or out NULL, subject empty), -ENOSPC.
 */
KVIDX_PUB_API int kvidx_pub_nats_stream_name(const char *subject, char *out, size_t cap);

/** The Core envelope's publisher_id (configured or drawn); 0 on ZMQ. */
KVIDX_PUB_API uint64_t kvidx_pub_nats_publisher_id(const struct kvidx_pub *pub);

/**
 * Text for kvidx_pub_last_error (zmq_strerror or natsStatus_GetText, by
 * transport): a static string, or "" when there was no error.
 */
KVIDX_PUB_API const char *kvidx_pub_last_error_text(const struct kvidx_pub *pub);

/* ------------------------------------------------------------------------
 * Fault injection: for consumers' tests only. Engines never call these.
 * ------------------------------------------------------------------------ */

/**
 * FAULT INJECTION. The next @p n flushed batches consume their sequence
 * numbers and enter the replay ring but are not sent on the PUB, as if the
 * PUB's high-water mark had dropped them. Adds to any count still pending.
 */
KVIDX_PUB_API void kvidx_pub_skip_live(struct kvidx_pub *pub, uint64_t n);
/*
 * NATS: the next n messages flushed (events, or kvidx_pub_publish_payload
 * payloads) consume their event ids and sequence numbers but are not
 * published: consumers see a gap in event_id (and in the Core sequence).
 */

/**
 * FAULT INJECTION. Set the replay faults applied to requests received from
 * now on (replaces the previous setting; all-zero removes them).
 * Thread-safe with respect to the replay thread (and to other calls of this
 * function).
 * @return 0, or -EINVAL (f NULL, or the publisher has no replay endpoint).
 */
KVIDX_PUB_API int kvidx_pub_set_replay_faults(struct kvidx_pub *pub,
                                              const struct kvidx_pub_replay_faults *f);

/**
 * FAULT INJECTION. Send an arbitrary multipart message on the PUB (e.g. two
 * frames, a 7-byte sequence frame, a payload that is not msgpack). It
 * consumes no sequence number and never enters the replay ring. Also handy
 * as a probe to wait for a subscriber (PUB/SUB slow joiner). The frames are
 * copied. A pending batch is left pending.
 * NATS: each frame is published unchanged as one message on the subject
 * (JetStream: with js_Publish, acknowledged, without Nats-Msg-Id), so that
 * bad payloads can be interleaved with events; raw_messages counts frames.
 * @param frames  n_frames pointers (a pointer may be NULL when its size is 0)
 * @return 0, -EINVAL (n_frames 0, NULL arrays), -EIO.
 */
KVIDX_PUB_API int kvidx_pub_send_raw(struct kvidx_pub *pub, const void *const *frames,
                                     const size_t *sizes, size_t n_frames);

#ifdef __cplusplus
}
#endif

#endif
