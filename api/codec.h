/*
 * kvidx HTTP codecs: request parsers and response encoders of the two HTTP
 * dialects (../shared/reference/http-api.md): the Dynamo standalone indexer
 * (§1) and the Mooncake Conductor (§2), in JSON and msgpack. Pure functions:
 * bytes in, structs out; structs in, bytes out. No I/O, no index access, no
 * dependency on net/. The P2P /dump codec is in api/codec_dump.h.
 *
 * HANDLER FLOW
 *     enum kvi_route r   = kvi_route_of(path, path_len);
 *     enum kvi_ctype ct  = kvi_ctype_of(content_type, ct_len);
 *     enum kvi_dialect d = kvi_detect_dialect(r, ct, body, len);   (§0)
 *     enum kvi_body_enc enc = ct == KVI_CT_MSGPACK || kvi_accepts_msgpack(accept, n)
 *                             ? KVI_ENC_MSGPACK : KVI_ENC_JSON;    (response encoding)
 *     struct kvi_api_err err;
 *     if (kvi_dyn_parse_query(body, len, ct, scratch, &q, &err) != 0)
 *         kvi_err_encode(&err, d, enc, &out, &content_type);  -> err.status
 *     ... query the index, fill struct kvi_score_row rows ...
 *     kvi_dyn_encode_scores(rows, n, block_size, KVI_SCORE_FULL, enc, &out);
 *   The response encoding follows the request body's (§2.1), or Accept for
 *   GET routes and JSON bodies. Msgpack answers exist for /query and
 *   /query_by_hash in both dialects and for every Conductor route; Dynamo's
 *   other routes and all Dynamo errors are JSON only.
 *
 * ERROR CONVENTION (every kvi_*_parse_* function)
 *   Return 0 on success with *out filled (defaults applied), or a negative
 *   errno-style code with *err filled so the handler answers with one call
 *   to kvi_err_encode():
 *     -EINVAL   the request is invalid (status 400, 415 or 422; Conductor
 *               reason/field/index set where §2.8 defines them)
 *     -ENOMEM   scratch allocation failed (status 500)
 *   err->status is always the HTTP status to answer with, err->msg the text.
 *   The kvi_*_err_* helpers fill *err the same way for the conditions a
 *   handler detects itself (conflicts, unknown instances), with the exact
 *   texts of http-api.md, and also return -EINVAL.
 *
 * OWNERSHIP
 *   Parsed strings and arrays point into the body or into @p scratch; they
 *   stay valid until the body is released or the scratch reset. Strings are
 *   not NUL-terminated (struct kvi_str). Encoders append to a struct kvi_buf
 *   and return 0 or -ENOMEM (the buffer's sticky oom flag).
 *
 * THREAD-SAFETY
 *   All functions are reentrant; concurrent calls need distinct scratch and
 *   output buffers.
 *
 * MSGPACK BODIES (kvidx extension for Dynamo, §2.1 for Conductor)
 *   Requests: same keys as JSON. token_ids may be an int array or a bin of
 *   little-endian 32-bit values (4 bytes per token); hash lists an int array
 *   or a bin of little-endian 64-bit values (8 bytes per hash).
 *   Responses: the same keys and shapes as the JSON response; map keys that
 *   are numbers in JSON (instance ids, dp ranks) stay decimal strings.
 */
#ifndef KVI_API_CODEC_H
#define KVI_API_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/body.h"
#include "net/nats_bridge.h"

#define KVI_STATUS_BRIDGE_NS 64 /* namespaces /status lists under nats_bridge */

/* ---- routes, content types, dialects ---------------------------------------- */

enum kvi_route {
    KVI_R_UNKNOWN = 0,
    KVI_R_HEALTH,          /* GET  /health            Dynamo */
    KVI_R_READY,           /* GET  /ready             Dynamo */
    KVI_R_STATUS,          /* GET  /status            Dynamo */
    KVI_R_METRICS,         /* GET  /metrics           Dynamo */
    KVI_R_REGISTER,        /* POST /register          both */
    KVI_R_UNREGISTER,      /* POST /unregister        both */
    KVI_R_WORKERS,         /* GET  /workers           Dynamo */
    KVI_R_QUERY,           /* POST /query             both */
    KVI_R_QUERY_BY_HASH,   /* POST /query_by_hash     both */
    KVI_R_DUMP,            /* GET  /dump              Dynamo */
    KVI_R_REGISTER_PEER,   /* POST /register_peer     Dynamo */
    KVI_R_DEREGISTER_PEER, /* POST /deregister_peer   Dynamo */
    KVI_R_PEERS,           /* GET  /peers             Dynamo */
    KVI_R_TEST_PAUSE,      /* POST /test/pause_listener  Dynamo */
    KVI_R_TEST_RESUME,     /* POST /test/resume_listener Dynamo */
    KVI_R_GLOBAL_VIEW,     /* GET  /global_view       Conductor */
    KVI_R_SERVICES,        /* GET  /services          Conductor */
    KVI_R_NATS_SOURCES,    /* POST /nats/sources      kvidx (api/README.md, "Dynamo on NATS") */
    KVI_R_ZMQ_BIND,        /* POST /zmq/bind          kvidx (api/README.md, "llm-d: engines that connect") */
    KVI_R_ZMQ_UNBIND,      /* POST /zmq/unbind        kvidx */
    KVI_R_ZMQ_BINDS,       /* GET  /zmq/binds         kvidx */
    KVI_R_COUNT
};

/** Route of a request path (a query string after '?' is ignored). */
enum kvi_route kvi_route_of(const char *path, size_t len);
/** The method a route answers ("GET" or "POST"); NULL for KVI_R_UNKNOWN. */
const char *kvi_route_method(enum kvi_route r);

/** Content-Type classes. */
enum kvi_ctype {
    KVI_CT_NONE = 0, /* header absent */
    KVI_CT_JSON,     /* application/json, or any application/...+json */
    KVI_CT_MSGPACK,  /* application/msgpack, application/x-msgpack */
    KVI_CT_OTHER,
};

/** Classify a Content-Type value (case-insensitive, parameters ignored). */
enum kvi_ctype kvi_ctype_of(const char *value, size_t len);
/** True when an Accept header value lists application/msgpack or x-msgpack. */
bool kvi_accepts_msgpack(const char *value, size_t len);

enum kvi_dialect {
    KVI_DIALECT_DYNAMO = 0,
    KVI_DIALECT_CONDUCTOR = 1,
};

/**
 * Which dialect serves a request (http-api.md §0).
 *   - Routes of one dialect only: that dialect.
 *   - /register: `modelname` or `type` -> Conductor; `model_name` -> Dynamo.
 *   - /unregister: `instance_id` a string -> Conductor, a number -> Dynamo;
 *     without instance_id, `modelname`/`type` -> Conductor, `model_name` ->
 *     Dynamo.
 *   - /query: `model` -> Conductor; `model_name` -> Dynamo.
 *   - /query_by_hash: `seq_hashes`/`block_hash` -> Conductor;
 *     `block_hashes` -> Dynamo.
 *   - The first decisive key wins. A msgpack body goes to Conductor unless
 *     its keys are Dynamo's (kvidx's msgpack fast path of the Dynamo
 *     /query and /query_by_hash); a body with no decisive key goes to
 *     Conductor when msgpack and to Dynamo otherwise, whose parser then
 *     reports what is missing.
 * Looks at top-level keys only, without validating values (cost: a memchr
 * over each number array before the decisive key).
 */
enum kvi_dialect kvi_detect_dialect(enum kvi_route r, enum kvi_ctype ct, const void *body,
                                    size_t len);

/* ---- errors --------------------------------------------------------------------- */

/** An error answer. See ERROR CONVENTION above. */
struct kvi_api_err {
    int status;         /* HTTP status to answer with */
    const char *reason; /* Conductor reason code (§2.8), or NULL */
    const char *field;  /* Conductor field name, or NULL (may point into _field) */
    int64_t index;      /* Conductor element index, or -1 */
    char msg[512];      /* the message (NUL-terminated) */
    char _field[96];
};

#define KVI_MIME_JSON "application/json"
#define KVI_MIME_MSGPACK "application/msgpack"
#define KVI_MIME_TEXT "text/plain; charset=utf-8"

/**
 * Encode an error answer into @p out.
 *   Dynamo: always JSON {"error":"<msg>"} (kvidx answers JSON for the
 *   framework errors too, §1.4).
 *   Conductor: status 400 -> {"error","reason","field","index"} (field and
 *   index only when set) followed by "\n", or the same map in msgpack when
 *   @p enc is KVI_ENC_MSGPACK; any other status -> text/plain "<msg>\n".
 * @param content_type  receives the Content-Type to send (static string)
 * @return 0 or -ENOMEM.
 */
int kvi_err_encode(const struct kvi_api_err *e, enum kvi_dialect d, enum kvi_body_enc enc,
                   struct kvi_buf *out, const char **content_type);

/** 404 for an unknown path ("not found: <path>"). @return -EINVAL. */
int kvi_err_unknown_path(struct kvi_api_err *e, const char *path, size_t len);
/** 405 for a wrong method ("Method not allowed"). @return -EINVAL. */
int kvi_err_method(struct kvi_api_err *e);
/** 413 for a body over @p limit bytes. @return -EINVAL. */
int kvi_err_too_large(struct kvi_api_err *e, size_t limit);
/** 500 with a message. @return -EINVAL. */
int kvi_err_internal(struct kvi_api_err *e, const char *msg);
/**
 * 429 "too many models: {limit} namespaces (model x tenant) exist, the most
 * --max-models allows; a registration may not create another" (kvidx: bounds
 * the index's memory; Dynamo answers it as JSON, Conductor as text).
 */
int kvi_err_too_many_models(struct kvi_api_err *e, size_t limit);

/**
 * Check a ZMQ endpoint (http-api.md §1.1) with net/endpoint.h's rules:
 * tcp://host:port (host non-empty, '*' allowed, IPv6 in brackets, port a
 * u16), ipc://..., inproc://...
 * @param why  receives the reason on failure (static string)
 * @return true when valid.
 */
bool kvi_endpoint_valid(const char *s, size_t len, const char **why);

/* ---- Dynamo dialect: requests ------------------------------------------------ */

/** POST /register (§1.5). */
struct kvi_dyn_register {
    uint64_t instance_id;
    struct kvi_str endpoint;        /* validated */
    struct kvi_str model_name;
    struct kvi_str tenant_id;       /* "default" when absent or null */
    struct kvi_str replay_endpoint; /* validated when has_replay */
    struct kvi_str additional_salt; /* accepted and ignored (alias additionalsalt) */
    uint32_t block_size;            /* > 0 */
    uint32_t dp_rank;               /* 0 when absent */
    uint64_t capacity_blocks;       /* the rank's KV block pool (kvidx extension): > 0 when
                                     * has_capacity; pre-sizes the index (api/service_capacity.c) */
    bool has_replay;
    bool has_salt;
    bool has_capacity;
};

/** POST /unregister (§1.6). */
struct kvi_dyn_unregister {
    uint64_t instance_id;
    struct kvi_str model_name;
    struct kvi_str tenant_id; /* valid when has_tenant */
    uint32_t dp_rank;         /* valid when has_dp_rank */
    bool has_tenant;
    bool has_dp_rank;
};

/** POST /query (§1.8). */
struct kvi_dyn_query {
    const uint32_t *token_ids;
    size_t n_tokens;
    struct kvi_str model_name;
    struct kvi_str tenant_id;  /* "default" when absent or null */
    struct kvi_str lora_name;  /* len 0 = base model (absent, null or "") */
    struct kvi_str cache_salt; /* accepted and ignored */
};

/** POST /query_by_hash (§1.9). */
struct kvi_dyn_query_hash {
    const uint64_t *block_hashes; /* i64 on the wire, bits reinterpreted */
    size_t n_hashes;
    struct kvi_str model_name;
    struct kvi_str tenant_id;
    struct kvi_str cache_salt;
};

/** POST /register_peer and /deregister_peer (§1.13). */
struct kvi_dyn_peer {
    struct kvi_str url;
};

/**
 * POST /nats/sources: a NATS source added at run time, as --nats-source
 * (subject) or --nats-stream (stream, optional filter subject) would.
 */
struct kvi_dyn_nats_source {
    struct kvi_str subject; /* core: required; stream: the filter subject or empty */
    struct kvi_str stream;  /* empty: a Core NATS source */
    struct kvi_str model_name;
    struct kvi_str tenant_id; /* "default" when absent */
    uint32_t block_size;
};

/**
 * POST /zmq/bind and /zmq/unbind: a bind endpoint for engines that connect
 * (llm-d), as --zmq-bind ENDPOINT[=BLOCK_SIZE] (block_size only on /zmq/bind).
 */
struct kvi_dyn_zbind {
    struct kvi_str endpoint;
    uint32_t block_size; /* 0 when absent or null: each model's from its first BlockStored */
};

/** POST /test/pause_listener and /test/resume_listener (§1.14). */
struct kvi_dyn_listener_ctl {
    uint64_t instance_id;
    uint32_t dp_rank; /* 0 when absent */
};

/** GET /workers filters (§1.7): ?model_name=&tenant_id= (percent-decoded). */
struct kvi_dyn_workers_filter {
    struct kvi_str model_name; /* valid when has_model */
    struct kvi_str tenant_id;  /* valid when has_tenant */
    bool has_model;
    bool has_tenant;
};

/*
 * Dynamo parsers. @p ct must be JSON (else 415), or msgpack for /query and
 * /query_by_hash. Statuses: 415 wrong Content-Type; 400 syntax error
 * ("Failed to parse the request body as JSON: ..."); 422 missing field,
 * wrong type, token id above u32::MAX, hash above i64::MAX ("Failed to
 * deserialize the JSON body into the target type: ..."); 400 for a bad
 * endpoint on /register. Unknown keys are ignored (as serde does).
 */
int kvi_dyn_parse_register(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                           struct kvi_dyn_register *out, struct kvi_api_err *err);
int kvi_dyn_parse_unregister(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                             struct kvi_dyn_unregister *out, struct kvi_api_err *err);
int kvi_dyn_parse_query(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                        struct kvi_dyn_query *out, struct kvi_api_err *err);
int kvi_dyn_parse_query_by_hash(const void *body, size_t len, enum kvi_ctype ct,
                                struct kvi_scratch *s, struct kvi_dyn_query_hash *out,
                                struct kvi_api_err *err);
int kvi_dyn_parse_peer(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                       struct kvi_dyn_peer *out, struct kvi_api_err *err);
/**
 * Parse POST /nats/sources: {"subject"?, "stream"?, "model_name", "tenant_id"?, "block_size"}.
 * Errors: 400 (malformed, or neither a subject nor a stream), 422 (a field's type or range).
 * Strings point into the body or @p s. @return 0 or a negative errno with @p err filled.
 */
int kvi_dyn_parse_nats_source(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                              struct kvi_dyn_nats_source *out, struct kvi_api_err *err);
/**
 * Parse POST /zmq/bind (@p unbind false: {"endpoint", "block_size"?}) or /zmq/unbind
 * ({"endpoint"}). The endpoint is not checked here (the service binds it). Errors, strings and
 * return as kvi_dyn_parse_nats_source.
 */
int kvi_dyn_parse_zbind(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s, bool unbind,
                        struct kvi_dyn_zbind *out, struct kvi_api_err *err);
int kvi_dyn_parse_listener_ctl(const void *body, size_t len, enum kvi_ctype ct,
                               struct kvi_scratch *s, struct kvi_dyn_listener_ctl *out,
                               struct kvi_api_err *err);
/**
 * Parse the query string of GET /workers (the part after '?', may be empty).
 * Unknown parameters are ignored. @return 0, or -EINVAL (400, bad
 * percent-encoding), -ENOMEM.
 */
int kvi_dyn_parse_workers_filter(const char *query, size_t len, struct kvi_scratch *s,
                                 struct kvi_dyn_workers_filter *out, struct kvi_api_err *err);

/* Dynamo errors a handler detects (exact texts of §1.5, §1.6, §1.3, §1.13). */
/** 409 "instance {id} is already registered for model={m} tenant={t}". */
int kvi_dyn_err_instance_elsewhere(struct kvi_api_err *e, uint64_t id, struct kvi_str model,
                                   struct kvi_str tenant);
/** 409 "instance {id} dp_rank {r} already registered". */
int kvi_dyn_err_rank_taken(struct kvi_api_err *e, uint64_t id, uint32_t rank);
/** 409 "block_size mismatch for model={m} tenant={t}: existing={a}, requested={b}". */
int kvi_dyn_err_block_size(struct kvi_api_err *e, struct kvi_str model, struct kvi_str tenant,
                           uint32_t existing, uint32_t requested);
/** 404 "instance {id} not found". */
int kvi_dyn_err_instance_not_found(struct kvi_api_err *e, uint64_t id);
/** 404 "instance {id} is registered for model={m} tenant={t}". */
int kvi_dyn_err_instance_other_ns(struct kvi_api_err *e, uint64_t id, struct kvi_str model,
                                  struct kvi_str tenant);
/** 404 "instance {id} dp_rank {r} not found". */
int kvi_dyn_err_rank_not_found(struct kvi_api_err *e, uint64_t id, uint32_t rank);
/** 404 "no indexer for model={m} tenant={t}". */
int kvi_dyn_err_no_indexer(struct kvi_api_err *e, struct kvi_str model, struct kvi_str tenant);
/** 404 "peer not found". */
int kvi_dyn_err_peer_not_found(struct kvi_api_err *e);
/** A NATS source that cannot be added: @p status (409 without --nats, 400 a bad source, 429 too many
 * models, 500) and the reason. */
int kvi_dyn_err_nats(struct kvi_api_err *e, int status, const char *what);
/** A /zmq/bind or /zmq/unbind refusal: @p status with the message "zmq-bind <endpoint>: <what>". */
int kvi_dyn_err_zbind(struct kvi_api_err *e, int status, const char *endpoint, const char *what);
/** 404 "listener for instance {id} dp_rank {r} not found". */
int kvi_dyn_err_listener_not_found(struct kvi_api_err *e, uint64_t id, uint32_t rank);
/** 409 "listener for instance {id} dp_rank {r} is {status}: not pausable|not resumable". */
int kvi_dyn_err_listener_state(struct kvi_api_err *e, uint64_t id, uint32_t rank,
                               const char *status, bool pausing);
/**
 * 503 "instance {id} dp_rank {r} not registered: its listener failed: {why}"
 * (kvidx: a listener whose socket could not even be set up, e.g. at the
 * descriptor limit; nothing stays registered).
 */
int kvi_dyn_err_listener_failed(struct kvi_api_err *e, uint64_t id, uint32_t rank, const char *why);
/**
 * 422 "Failed to deserialize the JSON body into the target type: {field}:
 * {detail}" without a position (kvidx: a name the index cannot key, such as
 * an empty model_name or one with a NUL character).
 */
int kvi_dyn_err_bad_name(struct kvi_api_err *e, const char *field, const char *detail);

/* ---- Dynamo dialect: responses ---------------------------------------------- */

/** One (instance, dp_rank) of a query answer, in blocks (both dialects). */
struct kvi_score_row {
    uint64_t instance_id; /* Dynamo id, printed in decimal when name is NULL */
    const char *name;     /* Conductor instance name (NUL-terminated), or NULL */
    uint32_t dp_rank;
    uint32_t gpu;         /* cumulative tiers, blocks: gpu <= cpu <= disk */
    uint32_t cpu;
    uint32_t disk;
    uint32_t tree_size;   /* gpu blocks held by (instance, dp_rank) */
    uint32_t _end;        /* encoders' scratch: end of the instance's rows (set while encoding) */
};

/** Score response forms (§1.10). */
enum kvi_score_form {
    KVI_SCORE_FULL = 0, /* scores, frequencies, tree_sizes, instances (kvidx default) */
    KVI_SCORE_FLAT = 1, /* scores, frequencies, tree_sizes (Dynamo 2026-04) */
};

/**
 * The Dynamo score response (§1.10), all values but tree sizes in tokens
 * (blocks x @p block_size):
 *   {"scores":{"<id>":{"<rank>":t}},"frequencies":[],
 *    "tree_sizes":{"<id>":{"<rank>":blocks}},
 *    "instances":{"<id>":{"longest_matched":t,"gpu":t,"dp":{"<rank>":t},
 *                         "cpu":t,"disk":t}}}
 * scores/tree_sizes list rows with gpu > 0; instances lists every instance
 * with a row that has any tier > 0, its dp map those rows' gpu tokens, and
 * gpu/cpu/disk the maxima over them (longest_matched = max of the three).
 * Instances ascend by id, ranks by rank. @p rows is sorted in place.
 * @return 0 or -ENOMEM.
 */
int kvi_dyn_encode_scores(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                          enum kvi_score_form form, enum kvi_body_enc enc, struct kvi_buf *out);

/**
 * Upper bound of the bytes kvi_dyn_encode_scores_to writes for @p rows, in
 * either encoding and form (about 330 bytes per row keyed by id).
 */
size_t kvi_dyn_scores_max_len(const struct kvi_score_row *rows, size_t n);

/**
 * kvi_dyn_encode_scores into caller memory, for a handler that answers
 * from memory it allocated itself (e.g. the request's pool, without a copy).
 * @param dst  room for kvi_dyn_scores_max_len(rows, n) bytes
 * @return the bytes written (cannot fail).
 */
size_t kvi_dyn_encode_scores_to(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                                enum kvi_score_form form, enum kvi_body_enc enc, char *dst);

/** {"status":"ok"} (201 /register, 200 elsewhere). @return 0 or -ENOMEM. */
int kvi_dyn_encode_ok(struct kvi_buf *out);

enum kvi_listener_status {
    KVI_LS_PENDING = 0,
    KVI_LS_ACTIVE = 1,
    KVI_LS_PAUSED = 2,
    KVI_LS_FAILED = 3,
};
/** "pending", "active", "paused", "failed". */
const char *kvi_listener_status_name(enum kvi_listener_status s);

struct kvi_listener_view {
    uint32_t dp_rank;
    const char *endpoint;
    enum kvi_listener_status status;
    const char *last_error; /* NULL = key omitted */
    /* liveness (net/listener.h LIVENESS); has_liveness false = the three keys omitted */
    bool has_liveness;
    uint64_t messages;                   /* live messages received */
    bool has_last_message;               /* false: "seconds_since_last_message":null */
    uint64_t seconds_since_last_message; /* whole seconds */
    int8_t connected;                    /* 1 true, 0 false, -1 null (not monitored) */
    uint64_t capacity_blocks;            /* as registered (kvidx extension); 0 = key omitted */
};

struct kvi_worker_view {
    uint64_t instance_id;
    const char *model_name;
    const char *tenant_id;
    uint32_t block_size;
    const char *source; /* NULL = "zmq" */
    const struct kvi_listener_view *listeners; /* emitted in this order */
    size_t n_listeners;
    const char *instance_name; /* a string id (--zmq-bind pods): "instance_id" is this string; NULL = the u64 */
};

/**
 * GET /workers (§1.7): an array of
 * {"instance_id","model_name","tenant_id","block_size","source","status",
 *  (instance_id a u64, or a string for a view with instance_name)
 *  "endpoints":{"<rank>":ep},"listeners":{"<rank>":{"endpoint","status"[,"last_error"]
 *  [,"messages","seconds_since_last_message","connected"]}}}
 * in the given order; "status" aggregates listeners (failed > pending >
 * active > paused; "active" when there are none). The liveness keys (kvidx's,
 * with has_liveness) come last: messages a u64, seconds_since_last_message a
 * u64 or null (no message yet), connected a bool or null (not monitored).
 * @return 0 or -ENOMEM.
 */
int kvi_dyn_encode_workers(const struct kvi_worker_view *w, size_t n, struct kvi_buf *out);

struct kvi_status_view {
    bool ready;
    const char *reason;            /* "ready" or a §1.12 reason */
    bool recovery_enabled;
    bool recovery_in_progress;
    const char *last_result;       /* NULL = omitted */
    uint64_t required_initial;
    uint64_t registered;
    uint64_t pending, active, paused, failed; /* listeners per status */
    bool has_nats;                 /* --nats: the "nats" object is written */
    bool nats_connected;
    uint64_t nats_pending;         /* stream messages still to deliver before caught up */
    /* --nats-publish: the "nats_bridge" object (has_bridge false: omitted) */
    bool has_bridge;
    const char *bridge_stream;
    struct kvi_nats_bridge_stats bridge;
    struct kvi_nats_bridge_ns_view bridge_ns[KVI_STATUS_BRIDGE_NS]; /* the first ones */
    size_t n_bridge_ns;            /* all of them (those past KVI_STATUS_BRIDGE_NS are not listed) */
};

/** GET /status (§1.12). @return 0 or -ENOMEM. */
int kvi_dyn_encode_status(const struct kvi_status_view *st, struct kvi_buf *out);
/** GET /ready body {"ready":b,"reason":r} (status 200 / 503 is the caller's). */
int kvi_dyn_encode_ready(bool ready, const char *reason, struct kvi_buf *out);
/** GET /peers: a JSON array of the URLs. @return 0 or -ENOMEM. */
int kvi_dyn_encode_peers(const char *const *urls, size_t n, struct kvi_buf *out);

/* ---- Conductor dialect: requests -------------------------------------------- */

enum kvi_cond_type {
    KVI_COND_VLLM = 0,
    KVI_COND_SGLANG = 1,
    KVI_COND_MOONCAKE = 2, /* storage-master stream: shared cpu/disk pools */
};
/** Canonical spelling: "vLLM", "SGLang", "Mooncake". */
const char *kvi_cond_type_name(enum kvi_cond_type t);

/** hash_profile (§2.2); fields are empty when not given. */
struct kvi_hash_profile {
    struct kvi_str strategy;
    struct kvi_str algorithm;
    struct kvi_str python_hash_seed; /* a string, or an integer's decimal text */
    struct kvi_str root_digest;
    struct kvi_str index_projection;
};

/** POST /register (§2.2). */
struct kvi_cond_register {
    struct kvi_str endpoint;        /* non-empty, validated as §1.1 */
    struct kvi_str replay_endpoint; /* "" when absent; validated when non-empty */
    enum kvi_cond_type type;        /* matched case-insensitively */
    struct kvi_str model_name;      /* `modelname` (alias `model`), non-empty */
    struct kvi_str lora_name;       /* "" = base model */
    struct kvi_str tenant_id;       /* "default" when absent, null or "" */
    struct kvi_str instance_id;     /* non-empty; may be absent for Mooncake */
    struct kvi_str additional_salt; /* `additionalsalt` (alias additional_salt), "" default */
    uint32_t block_size;            /* > 0 */
    uint32_t dp_rank;               /* 0 .. INT_MAX */
    bool has_instance;
    bool has_cache_group;           /* cache_group given and not null (then 0) */
    bool has_hash_profile;
    struct kvi_hash_profile hash_profile;
};

/** POST /unregister (§2.3); documented extra fields are accepted and ignored. */
struct kvi_cond_unregister {
    struct kvi_str instance_id;
    struct kvi_str tenant_id; /* "default" when absent, null or "" */
    uint32_t dp_rank;
};

/** POST /query (§2.4). */
struct kvi_cond_query {
    struct kvi_str model;
    uint32_t block_size;
    const uint32_t *token_ids; /* int32 on the wire, two's-complement bits */
    size_t n_tokens;
    struct kvi_str tenant_id;   /* "default" when absent, null or "" */
    struct kvi_str lora_name;   /* "" = base model */
    struct kvi_str instance_id; /* filter, valid when has_instance (non-empty) */
    struct kvi_str cache_salt;  /* "" = none */
    bool has_instance;
};

/** POST /query_by_hash (§2.5): rolling sequence hashes. */
struct kvi_cond_query_hash {
    struct kvi_str model;
    uint32_t block_size;
    const uint64_t *seq_hashes; /* u64, or negative i64 reinterpreted */
    size_t n_hashes;
    struct kvi_str tenant_id;
    struct kvi_str lora_name;
    struct kvi_str instance_id;
    struct kvi_str cache_salt;
    bool has_instance;
};

/*
 * Conductor parsers. A msgpack Content-Type selects msgpack, anything else
 * JSON. All failures are 400 with §2.8 reason codes: invalid_json (syntax,
 * or the body is not an object), missing, invalid_type, invalid_value,
 * out_of_range (with index for array elements), not_array, unknown_field
 * (any key outside the accepted set), unsupported (cache_group != 0),
 * invalid_registration is the handler's (kvi_cond_err_conflict).
 */
int kvi_cond_parse_register(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                            struct kvi_cond_register *out, struct kvi_api_err *err);
int kvi_cond_parse_unregister(const void *body, size_t len, enum kvi_ctype ct,
                              struct kvi_scratch *s, struct kvi_cond_unregister *out,
                              struct kvi_api_err *err);
int kvi_cond_parse_query(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                         struct kvi_cond_query *out, struct kvi_api_err *err);
int kvi_cond_parse_query_by_hash(const void *body, size_t len, enum kvi_ctype ct,
                                 struct kvi_scratch *s, struct kvi_cond_query_hash *out,
                                 struct kvi_api_err *err);

/* Conductor errors a handler detects (§2.2, §2.3). */
/** 400 invalid_registration "conflicting registration for service key: I|T|R". */
int kvi_cond_err_conflict(struct kvi_api_err *e, struct kvi_str instance, struct kvi_str tenant,
                          uint32_t rank);
/** 400 invalid_registration "conflicting active registration for endpoint: E". */
int kvi_cond_err_endpoint_taken(struct kvi_api_err *e, struct kvi_str endpoint);
/** 400 invalid_registration "conflicting hash_profile for context: model=M ...". */
int kvi_cond_err_hash_profile(struct kvi_api_err *e, struct kvi_str model);
/** 404 text "service not found: I|T|R". */
int kvi_cond_err_service_not_found(struct kvi_api_err *e, struct kvi_str instance,
                                   struct kvi_str tenant, uint32_t rank);

/* ---- Conductor dialect: responses ------------------------------------------- */

/** {"status":"registered successfully","instance_id":"<id>"} (+"\n" in JSON). */
int kvi_cond_encode_registered(struct kvi_str instance_id, enum kvi_body_enc enc,
                               struct kvi_buf *out);

/** One removed service key instance|tenant|rank. */
struct kvi_cond_key {
    struct kvi_str instance;
    struct kvi_str tenant;
    uint32_t dp_rank;
};
/** {"status":"unregistered successfully","removed_instances":["I|T|R",...]}. */
int kvi_cond_encode_unregistered(const struct kvi_cond_key *keys, size_t n, enum kvi_body_enc enc,
                                 struct kvi_buf *out);

/**
 * Conductor query response shapes (§2.4):
 *   DOCS  {"<tenant>":{"<inst>":{"longest_matched","GPU","DP","CPU","DISK","rank_matches"}}}
 *   IMPL  {"instances":{"<inst>":{"longest_matched","dp","rank_matches","gpu","cpu","disk"}}}
 */
enum kvi_cond_shape {
    KVI_COND_SHAPE_AUTO = 0, /* DOCS for JSON, IMPL for msgpack */
    KVI_COND_SHAPE_DOCS,
    KVI_COND_SHAPE_IMPL,
};

/**
 * The Conductor /query and /query_by_hash response (§2.4), tokens
 * everywhere (blocks x @p block_size). Every row given is emitted, zeros
 * included (the handler passes every registered rank of every registered
 * instance, or only the filtered one). Per instance GPU/CPU/DISK are maxima
 * over its ranks, DP[rank] = the rank's gpu, longest_matched = DISK;
 * rank_matches[rank] = {"gpu","cpu","disk"}. Instances ascend by name, ranks
 * by rank; @p rows is sorted in place. JSON ends with "\n".
 * @param tenant  outer key of the DOCS shape
 * @return 0 or -ENOMEM.
 */
int kvi_cond_encode_query(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                          struct kvi_str tenant, enum kvi_cond_shape shape, enum kvi_body_enc enc,
                          struct kvi_buf *out);

/** Upper bound of the bytes kvi_cond_encode_query_to writes (either encoding and shape). */
size_t kvi_cond_query_max_len(const struct kvi_score_row *rows, size_t n, struct kvi_str tenant);

/**
 * kvi_cond_encode_query into caller memory.
 * @param dst  room for kvi_cond_query_max_len(rows, n, tenant) bytes
 * @return the bytes written (cannot fail).
 */
size_t kvi_cond_encode_query_to(struct kvi_score_row *rows, size_t n, uint32_t block_size,
                                struct kvi_str tenant, enum kvi_cond_shape shape, enum kvi_body_enc enc,
                                char *dst);

struct kvi_cond_instance_view {
    const char *name;
    const uint32_t *dp_ranks;
    size_t n_ranks;
};

struct kvi_cond_context_view {
    const char *model_name;
    const char *lora_name;
    const char *tenant_id;
    uint32_t block_size;
    uint64_t prefix_count;
    const struct kvi_hash_profile *hash_profile; /* NULL = empty strings */
    const struct kvi_cond_instance_view *instances;
    size_t n_instances;
};

/** GET /global_view (§2.6), "\n"-terminated in JSON. @return 0 or -ENOMEM. */
int kvi_cond_encode_global_view(const struct kvi_cond_context_view *c, size_t n,
                                enum kvi_body_enc enc, struct kvi_buf *out);

struct kvi_cond_service_view {
    const char *endpoint;
    const char *replay_endpoint;
    enum kvi_cond_type type;
    const char *model_name;
    const char *lora_name;
    const char *tenant_id;
    const char *instance_id;
    uint32_t block_size;
    uint32_t dp_rank;
    bool has_cache_group; /* false = "CacheGroup":null */
    int64_t cache_group;
    const struct kvi_hash_profile *hash_profile; /* NULL = empty strings */
};

/** GET /services (§2.7): Go-style keys, no trailing newline. @return 0 or -ENOMEM. */
int kvi_cond_encode_services(const struct kvi_cond_service_view *s, size_t n,
                             enum kvi_body_enc enc, struct kvi_buf *out);

#endif
