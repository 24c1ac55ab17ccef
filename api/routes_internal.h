/*
 * Internals shared by the indexer port's route files: routes_table.c (the
 * table, api/routes_common.h), routes_common.c (the helper library),
 * routes_dialect.c (the dialect dispatcher of the shared paths),
 * routes_dynamo.c and routes_conductor.c (the two dialects). Not used
 * outside api/routes_*.c.
 */
#ifndef KVI_API_ROUTES_INTERNAL_H
#define KVI_API_ROUTES_INTERNAL_H

#include <stdint.h>

#include "api/codec.h"
#include "api/metrics.h"
#include "api/routes_common.h"
#include "api/service.h"
#include "engine/index.h"
#include "net/http_server.h"

/** Per loop thread scratch, reused by every request of that thread. */
struct kvi_route_thread {
    unsigned idx;
    struct kvi_scratch scratch;      /* parser allocations, reset per request */
    struct kvi_buf out;              /* response body, reset per request */
    uint64_t *hashes;                /* query content hashes */
    size_t hashes_cap;
    struct kvi_tier_match *tm;       /* index results */
    size_t tm_cap;
    struct kvi_score_row *rows;      /* encoder input */
    size_t rows_cap;
    struct kvi_query_hist *hist;     /* KVI_QK_COUNT entries of the table's array */
};

struct kvi_routes {
    struct kvi_service *svc;
    struct kvi_http_server *srv;
    struct kvi_routes_config cfg;
    unsigned n_threads;
    struct kvi_route_thread *threads; /* n_threads */
    struct kvi_query_hist *hists;     /* n_threads x KVI_QK_COUNT */
    int metrics_route;
};

/** A request handed to the control thread (body copied). */
struct kvi_ctl_req {
    struct kvi_routes *rt;
    struct kvi_http_deferred *d;
    enum kvi_route route;
    enum kvi_dialect dialect;
    enum kvi_ctype ct;
    enum kvi_body_enc enc;
    size_t len;
    uint8_t body[];
};

/* ---- helpers (routes_common.c) ----
 * Loop thread (the request's) unless said otherwise. Out of memory while
 * encoding is answered 500 "out of memory" (and logged); growing an array
 * aborts (kvi_xmalloc). */

/** Answer with @p b's bytes (copied); 500 when @p b had a failed append. */
void kvi_routes_send(struct kvi_http_res *res, int status, const char *ctype, const struct kvi_buf *b);
/** Answer an error in dialect @p d (Dynamo: JSON; Conductor: §2.8). */
void kvi_routes_send_err(struct kvi_http_res *res, struct kvi_route_thread *t, enum kvi_dialect d,
                         enum kvi_body_enc enc, const struct kvi_api_err *e);
/**
 * Control thread: complete a deferred control request with @p b (status
 * @p status, the request's encoding), or with the error @p e encoded in the
 * request's dialect when @p rc != 0. Does not free @p c.
 */
void kvi_routes_complete(struct kvi_ctl_req *c, int rc, int status, const struct kvi_api_err *e,
                         const struct kvi_buf *b);
/**
 * Largest answer written straight into the request's pool (kvi_http_alloc)
 * and sent without a copy; larger ones go through the thread's buffer.
 */
#define KVI_ROUTES_POOL_BODY_MAX (16u * 1024u)

/**
 * Memory for an answer of at most @p max bytes: the request's pool when
 * @p max <= KVI_ROUTES_POOL_BODY_MAX, else t->out (reset and grown).
 * @return the memory, or NULL when t->out cannot grow.
 */
char *kvi_routes_body(struct kvi_route_thread *t, struct kvi_http_res *res, size_t max);
/** Answer with @p len bytes at @p body from kvi_routes_body (copied only when it is t->out). */
void kvi_routes_send_body(struct kvi_route_thread *t, struct kvi_http_res *res, int status, const char *ctype,
                          const char *body, size_t len);
/** Make room for @p n hashes / results / rows in the thread's arrays. */
void kvi_routes_reserve(struct kvi_route_thread *t, size_t hashes, size_t tm, size_t rows);
/**
 * Cumulative tier matches for @p n content hashes or seq hashes into t->tm
 * (grown as needed). Call inside an RCU read section. @return the count.
 */
size_t kvi_routes_tiered(struct kvi_route_thread *t, const struct kvi_index *ix, const uint64_t *content,
                         const uint64_t *seq, size_t n);
/** Response encoding: msgpack for a msgpack body or an Accept asking for it. Pure. */
enum kvi_body_enc kvi_routes_enc(const struct kvi_http_req *req, enum kvi_ctype ct);

/* ---- dialect dispatch (routes_dialect.c) ---- */

/**
 * Loop thread: copy a Dynamo control request @p r and hand it to the
 * control thread, which runs it (kvi_routes_dyn_ctl); the answer is
 * deferred, and is 503 "shutting down" when the service no longer takes
 * requests.
 */
void kvi_routes_to_control(struct kvi_routes *rt, const struct kvi_http_req *req, struct kvi_http_res *res,
                           enum kvi_route r);
/**
 * Control plane (kvi_routes_mount): mount the shared paths, each served by
 * the dialect its request selects unless rt->cfg.api forces one.
 * @return 0 or the negative error of kvi_http_server_route.
 */
int kvi_routes_shared_mount(struct kvi_routes *rt, struct kvi_http_server *srv);

/* ---- Dynamo (routes_dynamo.c) ---- */

/** POST /query or /query_by_hash in the Dynamo dialect (loop thread, inline). @return blocks looked up. */
size_t kvi_routes_dyn_query(struct kvi_routes *rt, struct kvi_route_thread *t, const struct kvi_http_req *req,
                          struct kvi_http_res *res, enum kvi_ctype ct, bool by_hash);
/** Control thread: Dynamo /register, /unregister and the test routes. */
void kvi_routes_dyn_ctl(struct kvi_service *svc, struct kvi_ctl_req *c);
/** Mount the Dynamo-only routes. @return 0 or a negative errno. */
int kvi_routes_dyn_mount(struct kvi_routes *rt, struct kvi_http_server *srv);

/* ---- Conductor (routes_conductor.c) ---- */

/** POST /query or /query_by_hash in the Conductor dialect (loop thread, inline). @return blocks looked up. */
size_t kvi_routes_cond_query(struct kvi_routes *rt, struct kvi_route_thread *t, const struct kvi_http_req *req,
                           struct kvi_http_res *res, enum kvi_ctype ct, bool by_hash);
/** Control thread: Conductor /register and /unregister. */
void kvi_routes_cond_ctl(struct kvi_service *svc, struct kvi_ctl_req *c);
/** Mount the Conductor-only routes. @return 0 or a negative errno. */
int kvi_routes_cond_mount(struct kvi_routes *rt, struct kvi_http_server *srv);

#endif
