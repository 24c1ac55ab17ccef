/*
 * Slot-tracker HTTP codecs (../shared/reference/dynamo-standalone-slot-tracker.md,
 * http-api.md §3): request parsers and response encoders of the routes the
 * slot-tracker port serves. Pure functions, as api/codec.h: bytes in, engine
 * structs out (ready for engine/slots.h); engine results in, bytes out. No
 * I/O and no access to the tracker.
 *
 * ROUTES, STATUSES AND BODIES (the handler's part is marked "handler")
 *   | route                  | parser / encoder                    | success            |
 *   |------------------------|-------------------------------------|--------------------|
 *   | POST /register         | kvi_slot_parse_register             | 201 {"status":"ok"}|
 *   | POST /unregister       | kvi_slot_parse_unregister           | 200 {"status":"ok"}|
 *   | GET  /workers          | kvi_slot_parse_filter, _parse_page, | 200 [...] sorted,  |
 *   |                        | _workers_fit, _encode_workers, _cursor | paged (kvidx)   |
 *   | POST /add              | kvi_slot_parse_add                  | 201 {"status":"ok"}|
 *   | POST /prefill_complete | kvi_slot_parse_lifecycle            | 200 {"status":"ok"}|
 *   | POST /free             | kvi_slot_parse_lifecycle            | 200 {"status":"ok"}|
 *   | GET  /loads            | kvi_slot_parse_filter, _parse_page, | 200 [...] sorted,  |
 *   |                        | _loads_fit, _encode_loads, _cursor  | paged (kvidx)      |
 *   | POST /potential_loads  | kvi_slot_parse_potential, _encode_potential | 200 [...]  |
 *   | POST /register_peer    | kvi_slot_parse_peer                 | 201 new, 200 known (handler) |
 *   | POST /deregister_peer  | kvi_slot_parse_peer                 | 200; 404 kvi_slot_err_peer_not_found |
 *   | POST /replica/events   | kvi_slot_parse_replica              | 200 {"applied","dropped"} |
 *   | GET  /peers            | kvi_slot_encode_peers               | 200 [...] sorted   |
 *   | GET  /health           | -                                   | 200, empty body    |
 *   Engine failures become answers with kvi_slot_err_engine() (404, 409 or
 *   400 with the reference's texts); unknown paths, wrong methods and bodies
 *   over the limit with kvi_slot_err_route_not_found(), kvi_slot_err_method()
 *   and kvi_slot_err_too_large(). Every error body is JSON {"error":"..."}
 *   (kvi_slot_encode_err), Content-Type application/json, including
 *   malformed JSON (400), a wrong Content-Type (415) and bad fields (422).
 *
 * BODIES (serde rules of the reference service)
 *   Content-Type must be application/json (or application/...+json), else
 *   415. Unknown keys are ignored; duplicate keys, a missing required field,
 *   a wrong type or an out-of-range integer are 422 ("Failed to deserialize
 *   the JSON body into the target type: <path>: <what> at line L column C");
 *   a syntax error is 400 ("Failed to parse the request body as JSON: ...").
 *   tenant_id defaults to "default" when absent (null is a 422: the
 *   reference's field is a plain String). worker_id is u64; dp_rank,
 *   dp_start, dp_size and block_size are u32 (0 passes the parser: the engine
 *   answers 400 for block_size or dp_size 0); new_isl_tokens is u64 (usize),
 *   default 0; sequence_hashes is required (may be empty) and holds signed
 *   64-bit integers reinterpreted bit for bit (-1 -> 0xffffffffffffffff).
 *
 * ERROR CONVENTION, OWNERSHIP, THREAD-SAFETY: as api/codec.h. Parsers return
 *   0, or -EINVAL / -ENOMEM with *err filled (err->status is the HTTP status).
 *   Parsed strings and hashes point into the body or @p s; the engine structs
 *   handed out point there too and are valid as long as they are. Encoders
 *   append to @p out and return 0 or -ENOMEM. All functions are reentrant.
 */
#ifndef KVI_API_CODEC_SLOTS_H
#define KVI_API_CODEC_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "api/codec.h"
#include "net/body.h"
#include "engine/slots.h"

/** The default slot-tracker port. */
#define KVI_SLOT_DEFAULT_PORT 8091

/* ---- requests -------------------------------------------------------------------------- */

/** POST /register. */
struct kvi_slot_register {
    struct kvi_slots_key key; /* model_name, tenant_id */
    uint64_t worker_id;
    uint32_t block_size;
    uint32_t dp_start;
    uint32_t dp_size;
};

/** POST /unregister. */
struct kvi_slot_unregister {
    struct kvi_slots_key key;
    uint64_t worker_id;
};

/** POST /potential_loads. */
struct kvi_slot_potential {
    struct kvi_slots_key key;
    const uint64_t *hashes; /* sequence_hashes as u64 bit patterns */
    size_t n_hashes;
    uint64_t new_isl_tokens; /* 0 when absent */
};

/**
 * POST /register: {worker_id, model_name, tenant_id?, block_size, dp_start,
 * dp_size}. @return 0, -EINVAL (415, 400, 422), -ENOMEM.
 */
int kvi_slot_parse_register(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                            struct kvi_slot_register *out, struct kvi_api_err *err);

/** POST /unregister: {worker_id, model_name, tenant_id?}. Returns as above. */
int kvi_slot_parse_unregister(const void *body, size_t len, enum kvi_ctype ct,
                              struct kvi_scratch *s, struct kvi_slot_unregister *out,
                              struct kvi_api_err *err);

/**
 * POST /add: {model_name, tenant_id?, request_id, worker_id, dp_rank,
 * sequence_hashes, new_isl_tokens?} into an engine request (for
 * kvi_slots_add). Returns as above.
 */
int kvi_slot_parse_add(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                       struct kvi_slots_request *out, struct kvi_api_err *err);

/**
 * POST /prefill_complete and /free: {model_name, tenant_id?, request_id}
 * into an engine request (worker, rank and hashes zero). Returns as above.
 */
int kvi_slot_parse_lifecycle(const void *body, size_t len, enum kvi_ctype ct,
                             struct kvi_scratch *s, struct kvi_slots_request *out,
                             struct kvi_api_err *err);

/**
 * POST /potential_loads: {model_name, tenant_id?, sequence_hashes,
 * new_isl_tokens?}. Returns as above.
 */
int kvi_slot_parse_potential(const void *body, size_t len, enum kvi_ctype ct,
                             struct kvi_scratch *s, struct kvi_slot_potential *out,
                             struct kvi_api_err *err);

/**
 * GET /workers and /loads: the query string after '?' (may be empty), with
 * the independent optional filters model_name and tenant_id
 * (percent-decoded; other parameters ignored). An absent filter is a NULL
 * pointer in @p out (match all), as kvi_slots_workers_page /
 * kvi_slots_loads_page take it. @return 0 or -ENOMEM (500).
 */
int kvi_slot_parse_filter(const char *query, size_t len, struct kvi_scratch *s,
                          struct kvi_slots_key *out, struct kvi_api_err *err);

/*
 * PAGING (kvidx extension; the reference answers every entry at once). GET
 * /workers and GET /loads answer at most one page: at most the page bound
 * (--slot-loads-page) entries, workers or ranks, fewer when the answer's
 * worst-case size would pass KVI_SLOT_LOADS_MAX_BYTES. When more follow, the
 * handler sets KVI_SLOT_CURSOR_HEADER to the cursor naming the last entry
 * returned, and ?cursor= resumes after it (engine/slots.h, Paging). An answer
 * that holds everything carries no header and is the document's body.
 */

/** Default and largest entries (ranks of /loads, workers of /workers) in one answer (--slot-loads-page). */
#define KVI_SLOT_LOADS_PAGE 16384u
/** Estimated bytes one paged answer may reach before it is cut (kvi_slot_loads_fit, _workers_fit). */
#define KVI_SLOT_LOADS_MAX_BYTES (8u << 20)
/** The response header that carries the next page's cursor. */
#define KVI_SLOT_CURSOR_HEADER "X-Kvidx-Next-Cursor"

/** The paged listings; a cursor belongs to one of them. */
enum kvi_slot_listing {
    KVI_SLOT_LIST_LOADS,   /* GET /loads:   <hex model>.<hex tenant>.<worker_id>.<dp_rank> */
    KVI_SLOT_LIST_WORKERS, /* GET /workers: <hex model>.<hex tenant>.<worker_id> */
};

/** A paged listing's parameters. */
struct kvi_slot_page {
    size_t limit;        /* entries in this answer: min(limit parameter, the page bound) */
    bool explicit_limit; /* a limit parameter was given */
    bool has_after;      /* a cursor was given: start after @p after */
    struct kvi_slots_pos after; /* dp_rank is 0 for KVI_SLOT_LIST_WORKERS */
};

/**
 * The paging parameters of listing @p what in the query string (raw, not
 * percent-decoded; other parameters ignored): limit (a decimal integer >= 1,
 * lowered to @p max_limit; absent: @p max_limit) and cursor (the
 * KVI_SLOT_CURSOR_HEADER value of a previous answer of the same listing, as
 * enum kvi_slot_listing spells it; hex in lowercase or uppercase). Strings
 * of @p out point into @p s. Reentrant.
 * @return 0, -EINVAL (400 "invalid query parameter limit: ..." or
 *         "... cursor: expected the X-Kvidx-Next-Cursor value of a previous
 *         /loads answer" (/workers answer)), -ENOMEM (500).
 */
int kvi_slot_parse_page(const char *query, size_t len, struct kvi_scratch *s, size_t max_limit,
                        enum kvi_slot_listing what, struct kvi_slot_page *out, struct kvi_api_err *err);

/**
 * How many of the first @p n loads fit an answer of @p max_bytes, counting
 * each entry at its worst-case size (every name byte escaped). At least 1
 * when @p n > 0. Reentrant.
 */
size_t kvi_slot_loads_fit(const struct kvi_slots_load *l, size_t n, size_t max_bytes);

/** As kvi_slot_loads_fit, for GET /workers entries. */
size_t kvi_slot_workers_fit(const struct kvi_slots_worker *w, size_t n, size_t max_bytes);

/**
 * The cursor of listing @p what that resumes after @p last (dp_rank is
 * ignored for KVI_SLOT_LIST_WORKERS), appended NUL-terminated (the NUL is
 * counted in out->len). Reentrant.
 * @return 0 or -ENOMEM.
 */
int kvi_slot_encode_cursor(enum kvi_slot_listing what, const struct kvi_slots_pos *last,
                           struct kvi_buf *out);

/** POST /register_peer and /deregister_peer: {"url": "..."}. Returns as above. */
int kvi_slot_parse_peer(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                        struct kvi_str *url, struct kvi_api_err *err);

/**
 * POST /replica/events (kvidx's replica sync, api/slot_service.h): a batch
 * {"source": "<16 hex digits>", "events": [event, ...]}, msgpack (what
 * senders write) or JSON. An event: {"type": "add"|"prefill_complete"|"free",
 * "model_name", "tenant_id" (default "default"), "block_size", "request_id",
 * "worker_id", "dp_rank", "sequence_hashes" (i64 or u64 values),
 * "new_isl_tokens"}; unknown keys are ignored. @p ct must be JSON or msgpack.
 * @param source  the sender's id, {NULL, 0} when absent
 * @param evs     receives a malloc'd array of *n events (NULL when none);
 *                the caller frees it, on failure too. Strings and hashes
 *                point into @p body or @p s.
 * @return 0, or -EINVAL (415; 400 malformed body; 422 "invalid replica
 *         batch: ...") / -ENOMEM (500) with @p err filled.
 */
int kvi_slot_parse_replica(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                           struct kvi_str *source, struct kvi_slots_event **evs, size_t *n,
                           struct kvi_api_err *err);

/* ---- errors ------------------------------------------------------------------------------ */

/**
 * The answer to an engine failure, with the reference's status and text:
 *   400 "block_size must be greater than 0"
 *   400 "dp_size must be greater than 0"
 *   400 "dp range overflows u32: start={s} size={n}"
 *   409 "block_size mismatch for model={m} tenant={t}: existing={a}, requested={b}"
 *   409 "worker {id} already registered for model={m} tenant={t}"
 *   404 "worker {id} not found for model={m} tenant={t}"      (unregister)
 *   404 "no slot tracker for model={m} tenant={t}"
 *   404 "Worker WorkerWithDpRank { worker_id: {id}, dp_rank: {r} } not found"
 *   409 "Request {rid} already exists (assigned to worker WorkerWithDpRank { worker_id: {id}, dp_rank: {r} })"
 *   404 "Request {rid} not found"
 *   400 "too many ranks for model={m} tenant={t}: {n} registered, dp_size={d}, limit {max}"
 *       (kvidx's guard, engine/slots.h KVI_SLOTS_MAX_RANKS; not in the reference)
 *   400 "dp_size {d} exceeds the limit {max} (--slot-max-dp-size)"  (kvidx's guard)
 *   429 "too many models: {n} slot trackers (model x tenant) exist, the most
 *       --slot-max-models allows; model={m} tenant={t} not created"  (kvidx's guard)
 * @param key         the request's (model, tenant)
 * @param request_id  the request id (lifecycle routes), or NULL
 * @return -EINVAL.
 */
int kvi_slot_err_engine(struct kvi_api_err *e, const struct kvi_slots_err *why,
                        const struct kvi_slots_key *key, const char *request_id,
                        size_t request_id_len);

/** 404 "route not found" (unknown path). @return -EINVAL. */
int kvi_slot_err_route_not_found(struct kvi_api_err *e);
/** 405 "method not allowed". @return -EINVAL. */
int kvi_slot_err_method(struct kvi_api_err *e);
/** 413 "Failed to buffer the request body: length limit exceeded". @return -EINVAL. */
int kvi_slot_err_too_large(struct kvi_api_err *e);
/** 409 "replica sync is disabled" (peer routes without replica sync). @return -EINVAL. */
int kvi_slot_err_sync_disabled(struct kvi_api_err *e);
/** 404 "peer not found" (/deregister_peer). @return -EINVAL. */
int kvi_slot_err_peer_not_found(struct kvi_api_err *e);

/** {"error":"<msg>"}; *content_type receives "application/json". @return 0 or -ENOMEM. */
int kvi_slot_encode_err(const struct kvi_api_err *e, struct kvi_buf *out, const char **content_type);

/* ---- responses ----------------------------------------------------------------------------- */

/** {"status":"ok"}. @return 0 or -ENOMEM. */
int kvi_slot_encode_ok(struct kvi_buf *out);

/**
 * GET /workers: [{"worker_id","model_name","tenant_id","block_size",
 * "dp_start","dp_size"}] in the given order (kvi_slots_workers and
 * kvi_slots_workers_page sort); one page of a paged answer is the same array.
 * @return 0 or -ENOMEM.
 */
int kvi_slot_encode_workers(const struct kvi_slots_worker *w, size_t n, struct kvi_buf *out);

/**
 * GET /loads: [{"model_name","tenant_id","worker_id","dp_rank",
 * "active_prefill_tokens","active_decode_blocks"}] in the given order
 * (kvi_slots_loads and kvi_slots_loads_page sort); one page of a paged
 * answer is the same array. @return 0 or -ENOMEM.
 */
int kvi_slot_encode_loads(const struct kvi_slots_load *l, size_t n, struct kvi_buf *out);

/**
 * POST /potential_loads: [{"worker_id","dp_rank","potential_prefill_tokens",
 * "potential_decode_blocks","active_requests"}] in the given order.
 * @return 0 or -ENOMEM.
 */
int kvi_slot_encode_potential(const struct kvi_slots_potential *p, size_t n, struct kvi_buf *out);

/** GET /peers: a JSON array of the URLs, sorted bytewise. @return 0 or -ENOMEM. */
int kvi_slot_encode_peers(const char *const *urls, size_t n, struct kvi_buf *out);

#endif
