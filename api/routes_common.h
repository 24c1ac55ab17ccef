/*
 * kvidxd route table: mounts both HTTP dialects (http-api.md §1 Dynamo, §2
 * Conductor) on one net/http_server.h server.
 *
 * FILES
 *   routes_table.c     this header: the table, thread hooks, mounting
 *   routes_dialect.c   the shared paths, dispatched on the dialect
 *   routes_dynamo.c, routes_conductor.c   each dialect's handlers
 *   routes_common.c    the helper library the route files share
 *   routes_internal.h  what they share (not used outside api/routes_*.c)
 *
 * ROUTES
 *   Dynamo:    GET /health /ready /status /metrics /workers /dump /peers;
 *              POST /register_peer /deregister_peer;
 *              POST /test/pause_listener /test/resume_listener (only when
 *              test endpoints are enabled; otherwise they are unknown: 404).
 *   Conductor: GET /global_view /services.
 *   Shared:    POST /register /unregister /query /query_by_hash, served by
 *              the dialect the request itself selects (api/codec.h
 *              kvi_detect_dialect, http-api.md §0) unless `api` forces one.
 *
 * WHERE HANDLERS RUN
 *   - /query and /query_by_hash run inline on the loop thread inside one RCU
 *     read section: parse, hash, index lookup, encode; no hop to another
 *     thread, no lock, no log line. Per-thread scratch (parser scratch,
 *     output buffer, hash and result arrays) is reused across requests.
 *   - GET routes run inline and read the service's tables (api/service.h).
 *   - /register, /unregister and the test routes are handed to the
 *     service's control thread (kvi_service_post), where mutations are
 *     serialised; the request body is copied and the answer deferred
 *     (kvi_http_defer). /dump also takes its turn there, but the control
 *     thread only hands it to a dump thread (api/dump_pool.h), which streams
 *     it (kvi_http_stream_open) as each partition's writer spools it.
 *   Mutating routes (/register, /unregister, peers, test routes) require the
 *   admin token when the server has one.
 *
 * THREADS: create / mount / free on the control plane (main); the thread
 * hooks run on each loop thread (pass them in kvi_http_options).
 */
#ifndef KVI_API_ROUTES_COMMON_H
#define KVI_API_ROUTES_COMMON_H

#include <stdbool.h>
#include <stddef.h>

#include "api/service.h"
#include "net/http_server.h"
#include "engine/common.h"

/** Which dialect serves the shared paths. */
enum kvi_api_mode {
    KVI_API_AUTO = 0,  /* detected per request (default) */
    KVI_API_DYNAMO,    /* always Dynamo */
    KVI_API_CONDUCTOR, /* always Conductor */
};

/** Default body limits (Dynamo: 2 MB everywhere, 8 MiB on /query). */
#define KVI_ROUTES_DEFAULT_BODY_LIMIT (2u * 1024u * 1024u)
#define KVI_ROUTES_DEFAULT_QUERY_LIMIT (8u * 1024u * 1024u)

struct kvi_routes_config {
    size_t body_limit;       /* every route but /query; 0 = KVI_ROUTES_DEFAULT_BODY_LIMIT */
    size_t query_body_limit; /* /query; 0 = KVI_ROUTES_DEFAULT_QUERY_LIMIT */
    bool test_endpoints;     /* mount /test/pause_listener and /test/resume_listener */
    enum kvi_api_mode api;
};

struct kvi_routes;

/** Free the table (after the server is freed). */
void kvi_routes_free(struct kvi_routes *rt);

/**
 * Create the route table for @p svc, for a server with @p n_threads loop
 * threads. @return the table (never NULL: aborts on out-of-memory).
 */
KVI_DEALLOC(kvi_routes_free, 1) KVI_WARN_UNUSED
struct kvi_routes *kvi_routes_create(struct kvi_service *svc, const struct kvi_routes_config *cfg, unsigned n_threads);

/** kvi_http_options.thread_init hook (ud = the table): per-thread scratch. */
void *kvi_routes_thread_init(unsigned thread, void *ud);
/** kvi_http_options.thread_fini hook. */
void kvi_routes_thread_fini(unsigned thread, void *thread_ctx, void *ud);

/**
 * Register every route on @p srv (before kvi_http_server_start).
 * @return 0 or the negative error of kvi_http_server_route.
 */
int kvi_routes_mount(struct kvi_routes *rt, struct kvi_http_server *srv);

#endif
