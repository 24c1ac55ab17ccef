/*
 * POST /route on the indexer port (api/route_route.c): joins the index's
 * cache overlap (api/service.h) with the slot tracker's loads
 * (api/slot_service.h), ranks every worker rank of a (model, tenant) and,
 * with "commit": true, records the /add for the best one. Request, answer,
 * cost and error statuses: api/codec_route.h.
 *
 * WHERE IT RUNS
 *   Without commit the whole request runs inline on the indexer port's loop
 *   thread inside one RCU read section (parse, hash, index lookup, tracker
 *   projection, ranking, encoding): no lock, no hop. With commit the loop
 *   thread computes the index side and posts the rest to the slot service's
 *   mutation thread (kvi_slot_service_post), the tracker's only writer,
 *   which re-reads the loads, ranks, records the /add and completes the
 *   deferred answer; 503 when the service is shutting down. A commit needs
 *   the data token when one is set (kvi_slot_service_commit_allowed): 401.
 *   Per-thread scratch is indexed by the request's loop-thread number and
 *   created by that thread's first /route: the indexer port's thread hooks
 *   belong to api/routes_common.h.
 *
 * THREADS: create, mount and free on the control plane (main).
 */
#ifndef KVI_API_ROUTE_ROUTE_H
#define KVI_API_ROUTE_ROUTE_H

#include <stddef.h>

#include "api/service.h"
#include "api/slot_service.h"
#include "net/http_server.h"
#include "engine/common.h"

struct kvi_route_route;

/**
 * Free the state (main thread): after the indexer port is freed and after
 * the slot service's mutation thread has exited (kvi_slot_service_stop or
 * _free), since a commit there uses it. NULL is a no-op.
 */
void kvi_route_route_free(struct kvi_route_route *rr);

/**
 * Create /route's state for an indexer port with @p n_threads loop threads
 * (0 counts as 1): the tracker comes from @p s, the indexes from @p svc;
 * both must outlive it. Main thread.
 * @return the state (never NULL: aborts on out-of-memory).
 */
KVI_DEALLOC(kvi_route_route_free, 1) KVI_WARN_UNUSED
struct kvi_route_route *kvi_route_route_create(struct kvi_slot_service *s, struct kvi_service *svc,
                                               unsigned n_threads);

/**
 * Register POST /route on the indexer port @p srv with body limit
 * @p body_limit (main thread, before kvi_http_server_start; @p srv must have
 * the @p n_threads given to create).
 * @return 0 or the negative error of kvi_http_server_route (-EINVAL, -EBUSY).
 */
int kvi_route_route_mount(struct kvi_route_route *rr, struct kvi_http_server *srv, size_t body_limit);

#endif
