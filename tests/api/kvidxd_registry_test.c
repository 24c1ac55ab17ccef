/* ctest-labels: integration -- api/service_registry.c, net/nats_kv.c: registrations shared by replicas through a JetStream KV bucket */
/*
 * Two kvidxd replicas on one real nats-server with --nats-registry:
 *   - a registration through replica A appears on B (its /workers, and B's
 *     listener indexes the engine's events: a query on B answers);
 *   - an unregistration through B closes A's registration;
 *   - a third replica started later loads the bucket before it is ready;
 *   - a registration A refuses (a bad endpoint, another block size) is not
 *     stored;
 *   - with the NATS server gone, /register answers 503 and registers
 *     nothing.
 * Waits are bounded polls (KFX_WAIT); checks run on the main thread.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/kvidxd_fixture.h"
#include "net/nats_server_fixture.h"

static bool workers_has(const struct kfx_daemon *d, const char *needle)
{
    return kfx_get_has(d, "/workers", 200, needle);
}

static void start_replica(struct kfx_daemon *d, const struct kvi_nats_server *ns)
{
    const char *args[] = {"--nats", ns->url, "--nats-registry", "kvidx-registrations", "--slot-port", "0", NULL};
    kfx_start(d, args, NULL);
    if (!KFX_WAIT(kfx_get_has(d, "/ready", 200, "\"ready\":true"), KFX_WAIT_MS)) {
        kfx_dump_log(d);
        fail_msg("replica never ready");
    }
}

static void test_shared_registrations(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    struct kfx_daemon a, b, c;
    start_replica(&a, &ns);
    start_replica(&b, &ns);

    /* an engine, registered through A only */
    struct kvidx_pub *p = kfx_pub(0);
    char body[512];
    snprintf(body, sizeof body,
             "{\"instance_id\":41,\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\",\"model_name\":\"m\",\"block_size\":%d}",
             kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p), KFX_BS);
    kfx_expect(&a, "/register", body, 201, NULL);
    /* B applies it from the bucket: listed, and its own listener indexes the engine */
    if (!KFX_WAIT(workers_has(&b, "\"instance_id\":41,\"model_name\":\"m\""), KFX_WAIT_MS)) {
        kfx_dump_log(&b);
        fail_msg("the registration through A never reached B");
    }
    kfx_publish(p, 0, 0, 3, NULL);
    char *q = kfx_query_json("m", 0, 3);
    struct kvidx_pub *pubs[] = {p};
    kfx_until_query(&b, "/query", q, "\"scores\":{\"41\":{\"0\":12}}", pubs, 1);
    kfx_until_query(&a, "/query", q, "\"scores\":{\"41\":{\"0\":12}}", pubs, 1);

    /* the same rank through two replicas: the second answers 409 (taken here already, or refused by
     * the bucket's revision check while A's write is on its way), and every replica keeps A's */
    kfx_expect(&a, "/register", "{\"instance_id\":50,\"endpoint\":\"tcp://127.0.0.1:2\",\"model_name\":\"m\",\"block_size\":4}",
               201, NULL);
    kfx_expect(&b, "/register", "{\"instance_id\":50,\"endpoint\":\"tcp://127.0.0.1:3\",\"model_name\":\"m\",\"block_size\":4}",
               409, NULL);
    if (!KFX_WAIT(workers_has(&b, "\"instance_id\":50,") && workers_has(&b, "\"tcp://127.0.0.1:2\""), KFX_WAIT_MS))
        fail_msg("B never took A's registration of instance 50");
    assert_false(workers_has(&b, "\"tcp://127.0.0.1:3\""));
    assert_false(workers_has(&a, "\"tcp://127.0.0.1:3\""));
    kfx_expect(&a, "/unregister", "{\"instance_id\":50,\"model_name\":\"m\"}", 200, NULL);

    /* refusals are not shared: another block size, a bad endpoint */
    snprintf(body, sizeof body, "{\"instance_id\":42,\"endpoint\":\"tcp://127.0.0.1:1\",\"model_name\":\"m\",\"block_size\":8}");
    kfx_expect(&b, "/register", body, 409, NULL);
    kfx_expect(&b, "/register", "{\"instance_id\":43,\"endpoint\":\"udp://x\",\"model_name\":\"m\",\"block_size\":4}", 400,
               NULL);

    /* a NATS source added through A runs on B too (and on C below) */
    kfx_expect(&a, "/nats/sources", "{\"subject\":\"fleet.kv-events\",\"model_name\":\"m2\",\"block_size\":4}", 201,
               NULL);
    if (!KFX_WAIT(kfx_log_has(&b, "nats: core source", "fleet.kv-events", 100), KFX_WAIT_MS)) {
        kfx_dump_log(&b);
        fail_msg("the NATS source added through A never started on B");
    }
    /* the same source again is accepted as it is (no second subscription) */
    kfx_expect(&b, "/nats/sources", "{\"subject\":\"fleet.kv-events\",\"model_name\":\"m2\",\"block_size\":4}", 201,
               NULL);

    /* a replica started now loads the bucket before it is ready */
    start_replica(&c, &ns);
    assert_true(workers_has(&c, "\"instance_id\":41,\"model_name\":\"m\""));
    assert_false(workers_has(&c, "\"instance_id\":42"));
    assert_false(workers_has(&c, "\"instance_id\":43"));
    assert_true(kfx_log_has(&c, "nats: core source", "fleet.kv-events", KFX_WAIT_MS));

    /* an unregistration through B reaches A and C */
    kfx_expect(&b, "/unregister", "{\"instance_id\":41,\"model_name\":\"m\"}", 200, NULL);
    assert_false(workers_has(&b, "\"instance_id\":41"));
    if (!KFX_WAIT(!workers_has(&a, "\"instance_id\":41") && !workers_has(&c, "\"instance_id\":41"), KFX_WAIT_MS)) {
        kfx_dump_log(&a);
        fail_msg("the unregistration through B never reached A and C");
    }
    /* (the namespace went with its last registration) */
    struct kfx_resp r;
    assert_int_equal(kfx_post_json(&a, "/query", q, &r), 404);
    kfx_resp_free(&r);

    /* NATS gone: /register answers 503 and registers nothing */
    kvi_nats_server_stop(&ns);
    snprintf(body, sizeof body, "{\"instance_id\":44,\"endpoint\":\"tcp://127.0.0.1:1\",\"model_name\":\"m\",\"block_size\":%d}",
             KFX_BS);
    kfx_expect(&a, "/register", body, 503, NULL);
    assert_false(workers_has(&a, "\"instance_id\":44"));

    free(q);
    kvidx_pub_destroy(p);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&c, SIGTERM, NULL), 0);
}

/* NATS unreachable at start-up: kvidxd serves (/health), is not ready (registry_loading), and
 * converges once NATS comes: the bucket's registrations are applied and /ready answers 200. */
static void test_nats_late(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    struct kfx_daemon a, b;
    start_replica(&a, &ns);
    kfx_expect(&a, "/register", "{\"instance_id\":60,\"endpoint\":\"tcp://127.0.0.1:4\",\"model_name\":\"m\",\"block_size\":4}",
               201, NULL);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
    /* the server goes away (its store stays), then a replica starts */
    kvi_nats_server_pause(&ns);
    const char *args[] = {"--nats", ns.url, "--nats-registry", "kvidx-registrations", "--slot-port", "0", NULL};
    kfx_start(&b, args, NULL);
    assert_true(kfx_get_has(&b, "/health", 200, ""));
    /* (bounded: the control thread opens the registry right after start-up) */
    assert_true(KFX_WAIT(kfx_get_has(&b, "/ready", 503, "registry_loading"), KFX_WAIT_MS));
    assert_int_equal(kvi_nats_server_resume(&ns), 0);
    if (!KFX_WAIT(kfx_get_has(&b, "/ready", 200, "\"ready\":true"), KFX_WAIT_MS)) {
        kfx_dump_log(&b);
        fail_msg("the replica never converged once NATS came");
    }
    assert_true(workers_has(&b, "\"instance_id\":60,"));
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    kvi_nats_server_stop(&ns);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_registrations),
        cmocka_unit_test(test_nats_late),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
