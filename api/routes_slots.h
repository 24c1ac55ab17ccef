/*
 * The slot port's route table (api/routes_slots.c): the Dynamo standalone
 * slot tracker's routes (../shared/reference/dynamo-standalone-slot-tracker.md,
 * http-api.md §3) plus kvidx's replica-sync route, /metrics and the test
 * routes, mounted on the slot port's net/http_server.h server. The handlers
 * call the slot-tracker service (api/slot_service.h) back; they own no
 * tracker state themselves.
 *
 * ROUTES
 *   GET  /health /workers /loads /peers /metrics
 *   POST /register /unregister                 (admin token)
 *        /add /prefill_complete /free           (data token)
 *        /potential_loads
 *        /register_peer /deregister_peer        (admin token)
 *        /replica/events (KVI_SLOT_SYNC_PATH)   (admin token)
 *        /test/advance_clock /test/replica_sender
 *                                               (admin token; mounted only with
 *                                                test endpoints, else 404)
 *   Every path takes any method; a wrong one answers the reference's 405
 *   {"error":"method not allowed"} with Allow. The tokens are checked by the
 *   server (kvi_http_options admin_token / data_token) before the handler.
 *
 * WHERE HANDLERS RUN
 *   - Reads (/workers, /loads, /potential_loads, /peers, /metrics) run inline
 *     on the loop thread, inside an RCU read section where they read the
 *     tracker. /workers and /loads are paged (--slot-loads-page,
 *     api/codec_slots.h PAGING).
 *   - Writes (/register, /unregister, /add, /prefill_complete, /free, replica
 *     batches) are parsed inline (errors answer at once); the parsed request
 *     is packed into one allocation and posted to the service's mutation
 *     thread (kvi_slot_service_post), which runs it and completes the
 *     deferred answer (kvi_http_defer), or answers 503 when shutting down.
 *   Per-thread scratch (parser scratch, output buffer, result arrays) is
 *   created by the thread hooks and reused across requests.
 *
 * THREADS: create, mount and free on the control plane (main); the thread
 * hooks run on each loop thread of the slot port (pass them in
 * kvi_http_options).
 */
#ifndef KVI_API_ROUTES_SLOTS_H
#define KVI_API_ROUTES_SLOTS_H

#include <stdbool.h>
#include <stddef.h>

#include "api/slot_service.h"
#include "net/http_server.h"
#include "engine/common.h"

struct kvi_slot_routes;

/** Free the table (main thread, after the server it is mounted on is freed). NULL is a no-op. */
void kvi_slot_routes_free(struct kvi_slot_routes *rt);

/**
 * Create the slot port's route table for the service @p s, for a server with
 * @p n_threads loop threads (0 counts as 1). @p body_limit is the body limit
 * of every slot route; @p test_endpoints mounts the test routes. @p s must
 * outlive the table. Main thread.
 * @return the table (never NULL: aborts on out-of-memory).
 */
KVI_DEALLOC(kvi_slot_routes_free, 1) KVI_WARN_UNUSED
struct kvi_slot_routes *kvi_slot_routes_create(struct kvi_slot_service *s, unsigned n_threads, size_t body_limit,
                                               bool test_endpoints);

/**
 * kvi_http_options.thread_init hook (ud = the table): sets up loop thread
 * @p thread's scratch (@p thread < the table's n_threads). Runs on that loop
 * thread. @return the thread's context (never NULL).
 */
void *kvi_slot_routes_thread_init(unsigned thread, void *ud);

/** kvi_http_options.thread_fini hook: frees @p thread_ctx's scratch. Runs on that loop thread. */
void kvi_slot_routes_thread_fini(unsigned thread, void *thread_ctx, void *ud);

/**
 * Register every slot route on @p srv (main thread, before
 * kvi_http_server_start; @p srv's thread hooks must be this table's).
 * @return 0 or the negative error of kvi_http_server_route (-EINVAL, -EBUSY).
 */
int kvi_slot_routes_mount(struct kvi_slot_routes *rt, struct kvi_http_server *srv);

#endif
