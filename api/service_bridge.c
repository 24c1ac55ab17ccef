/*
 * --nats-publish STREAM (issue 21 §2): the service's side of the ZMQ ->
 * JetStream bridge (net/nats_bridge.h). The bridge is created on the NATS
 * plane at startup, before the --workers registrations; every ZMQ
 * registration (Dynamo, Conductor, --zmq-bind pods) gets the bridge's
 * mirror hook and, when the stream already holds events of it (a restarted
 * bridging replica), a watermark one below the last stored seq, so that the
 * listener replays the rest from the engine's ROUTER (api/README.md, "The
 * ZMQ -> JetStream bridge").
 *
 * THREADS: open, spec on the control thread; close at destroy, after the
 * listener pool. svc->bridge is published with a release store (N1: pairs
 * with the acquire loads of /status and /metrics).
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "api/nats_args.h"
#include "api/service_internal.h"
#include "net/log.h"
#include "net/nats_bridge.h"

void kvi_svc__bridge_open(struct kvi_service *svc)
{
    const struct kvi_nats_args *a = svc->cfg.nats;
    if (a == NULL || a->publish == NULL)
        return;
    struct kvi_nats *n = kvi_svc__nats_plane(svc);
    if (n == NULL)
        return; /* (logged by the plane) */
    struct kvi_nats_bridge *b = kvi_nats_bridge_create(n, a->publish, 0);
    if (b == NULL) {
        kvi_log_error("nats bridge: cannot start (--nats-publish %s): %s; ZMQ events are not published",
                      a->publish, strerror(errno));
        return;
    }
    /* the --workers registrations come next: give NATS up to 2 s, so that they can resume after
     * what the stream holds (kvi_nats_bridge_resume does not wait for a connection) */
    struct kvi_nats_conn_info ci;
    for (int i = 0; i < 200 && !kvi_service_stopping(svc); i++) {
        kvi_nats_conn_info(n, &ci);
        if (ci.connected)
            break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    atomic_store_explicit(&svc->bridge, b, memory_order_release); /* N1 */
    kvi_log_info("nats bridge: every ZMQ registration's events are published to JetStream stream %s", a->publish);
}

void kvi_svc__bridge_close(struct kvi_service *svc)
{
    kvi_nats_bridge_destroy(atomic_exchange(&svc->bridge, NULL));
}

void kvi_svc__bridge_spec(struct kvi_service *svc, struct kvi_listener_spec *spec, const char *model,
                          const char *tenant)
{
    struct kvi_nats_bridge *b = atomic_load_explicit(&svc->bridge, memory_order_relaxed); /* control thread */
    if (b == NULL)
        return;
    struct kvi_bridge_worker *w =
        kvi_nats_bridge_worker(b, model, tenant, spec->instance_id, spec->instance_name, spec->dp_rank);
    if (w == NULL) {
        kvi_log_error("nats bridge: registration of %s:%s not bridged (%s)", model, tenant, strerror(errno));
        return;
    }
    spec->mirror = kvi_nats_bridge_mirror;
    spec->mirror_ctx = w;
    if (spec->seed_watermark)
        return; /* recovered from a peer: that watermark rules */
    bool has_seed = false;
    uint64_t seed = 0;
    if (kvi_nats_bridge_resume(b, w, &has_seed, &seed) > 0 && has_seed) {
        spec->seed_watermark = true;
        spec->watermark = seed;
    }
}

struct kvi_nats_bridge *kvi_service_bridge(const struct kvi_service *svc)
{
    return atomic_load_explicit(&((struct kvi_service *)svc)->bridge, memory_order_acquire); /* N1 */
}
