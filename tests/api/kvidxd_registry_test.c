/* ctest-labels: integration -- api/service_registry.c, net/nats_kv.c: registrations shared by replicas through a JetStream KV bucket */
/*
 * Two kvidxd replicas on one real nats-server with --nats-registry:
 *   - a registration through replica A appears on B (its /workers, and B's
 *     listener indexes the engine's events: a query on B answers), with its
 *     capacity_blocks (B pre-sizes its index too, and so does C below);
 *   - an unregistration through B closes A's registration;
 *   - a third replica started later loads the bucket before it is ready;
 *   - a registration A refuses (a bad endpoint, another block size) is not
 *     stored;
 *   - with the NATS server gone, /register answers 503 and registers
 *     nothing;
 *   - Conductor (Mooncake) registrations: one through A appears on B (its
 *     /services, and B's listener indexes the engine's events), an
 *     unregistration through B closes A's listener, and two replicas racing
 *     to register one service key with other values end with one value
 *     everywhere (one 200, one 400 invalid_registration).
 * Waits are bounded polls (KFX_WAIT); checks run on the main thread.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
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
             "{\"instance_id\":41,\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\",\"model_name\":\"m\",\"block_size\":%d,"
             "\"capacity_blocks\":2048}",
             kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p), KFX_BS);
    kfx_expect(&a, "/register", body, 201, NULL);
    /* B applies it from the bucket: listed, and its own listener indexes the engine */
    if (!KFX_WAIT(workers_has(&b, "\"instance_id\":41,\"model_name\":\"m\""), KFX_WAIT_MS)) {
        kfx_dump_log(&b);
        fail_msg("the registration through A never reached B");
    }
    /* with its capacity: B pre-sizes too */
    assert_true(KFX_WAIT(kfx_metric(&b, "kvidx_capacity_reserved_blocks") == 2048, KFX_WAIT_MS));
    assert_true(workers_has(&b, "\"capacity_blocks\":2048"));
    assert_int_equal(kfx_metric(&a, "kvidx_capacity_reserved_entries"), 2048);
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
    assert_true(KFX_WAIT(kfx_metric(&c, "kvidx_capacity_reserved_entries") == 2048, KFX_WAIT_MS));
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

/* ---- Conductor registrations ------------------------------------------------------------------ */

static bool services_has(const struct kfx_daemon *d, const char *needle)
{
    return kfx_get_has(d, "/services", 200, needle);
}

/* The Conductor /query body for the first n blocks of chain c in model "cm". */
static void cond_query(char *out, size_t cap, uint32_t c, uint32_t n)
{
    uint32_t tok[16 * KFX_BS];
    kfx_tokens(c, 0, n, tok);
    int k = snprintf(out, cap, "{\"model\":\"cm\",\"block_size\":%d,\"token_ids\":[", KFX_BS);
    for (uint32_t i = 0; i < n * KFX_BS; i++)
        k += snprintf(out + k, cap - (size_t)k, "%s%u", i ? "," : "", tok[i]);
    snprintf(out + k, cap - (size_t)k, "]}");
}

struct racer {
    const struct kfx_daemon *d;
    char body[256];
    long status;
};

static void *race_register(void *arg)
{
    struct racer *r = arg;
    struct kfx_resp resp;
    r->status = kfx_post_json(r->d, "/register", r->body, &resp);
    kfx_resp_free(&resp);
    return NULL;
}

static void test_conductor_registrations(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    struct kfx_daemon a, b;
    start_replica(&a, &ns);
    start_replica(&b, &ns);

    /* an engine, registered through A in the Conductor dialect */
    struct kvidx_pub *p = kfx_pub(0);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\",\"type\":\"vLLM\",\"modelname\":\"cm\","
             "\"instance_id\":\"node-a\",\"block_size\":%d,\"dp_rank\":0,\"additionalsalt\":\"w8\","
             "\"hash_profile\":{\"strategy\":\"vllm_v1\",\"python_hash_seed\":0}}",
             kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p), KFX_BS);
    kfx_expect(&a, "/register", body, 200, "{\"status\":\"registered successfully\",\"instance_id\":\"node-a\"}\n");
    char ep[160];
    snprintf(ep, sizeof ep, "\"Endpoint\":\"%s\"", kvidx_pub_endpoint(p));
    if (!KFX_WAIT(services_has(&b, "\"InstanceID\":\"node-a\"") && services_has(&b, ep), KFX_WAIT_MS)) {
        kfx_dump_log(&b);
        fail_msg("the Conductor registration through A never reached B");
    }
    /* B holds it as accepted: the same /services row (salt, profile) as A */
    struct kfx_resp ra, rb;
    assert_int_equal(kfx_get(&a, "/services", &ra), 200);
    assert_int_equal(kfx_get(&b, "/services", &rb), 200);
    assert_string_equal(ra.body, rb.body);
    assert_non_null(strstr(rb.body, "\"python_hash_seed\":\"0\""));
    kfx_resp_free(&ra);
    kfx_resp_free(&rb);
    /* re-registering the same values through B is the usual no-op */
    kfx_expect(&b, "/register", body, 200, NULL);
    /* B's own listener indexes the engine */
    kfx_publish(p, 0, 0, 3, NULL);
    char q[1024];
    cond_query(q, sizeof q, 0, 3);
    struct kvidx_pub *pubs[] = {p};
    kfx_until_query(&b, "/query", q, "\"node-a\":{\"longest_matched\":12", pubs, 1);
    kfx_until_query(&a, "/query", q, "\"node-a\":{\"longest_matched\":12", pubs, 1);

    /* an unregistration through B closes A's listener: A lists nothing and holds no listener */
    kfx_expect(&b, "/unregister", "{\"instance_id\":\"node-a\",\"dp_rank\":0}", 200,
               "{\"status\":\"unregistered successfully\",\"removed_instances\":[\"node-a|default|0\"]}\n");
    if (!KFX_WAIT(!services_has(&a, "node-a"), KFX_WAIT_MS)) {
        kfx_dump_log(&a);
        fail_msg("the unregistration through B never reached A");
    }
    assert_true(kfx_get_has(&a, "/status", 200, "\"listeners\":{\"pending\":0,\"active\":0,\"paused\":0"));
    assert_true(kfx_get_has(&b, "/status", 200, "\"listeners\":{\"pending\":0,\"active\":0,\"paused\":0"));
    assert_true(kfx_get_has(&a, "/global_view", 200, "\"context_count\":0"));
    kfx_expect(&a, "/unregister", "{\"instance_id\":\"node-a\",\"dp_rank\":0}", 404, NULL);

    /* a Mooncake storage master without an instance id (named by its endpoint) travels too */
    kfx_expect(&a, "/register",
               "{\"endpoint\":\"tcp://127.0.0.1:95\",\"type\":\"mooncake\",\"modelname\":\"cm\",\"block_size\":4,"
               "\"dp_rank\":0}",
               200, NULL);
    if (!KFX_WAIT(services_has(&b, "\"Type\":\"Mooncake\",\"ModelName\":\"cm\",\"LoraName\":\"\",\"TenantID\":"
                                   "\"default\",\"InstanceID\":\"tcp://127.0.0.1:95\""),
                  KFX_WAIT_MS))
        fail_msg("the Mooncake registration through A never reached B");
    kfx_expect(&b, "/unregister", "{\"instance_id\":\"tcp://127.0.0.1:95\",\"dp_rank\":0}", 200, NULL);
    if (!KFX_WAIT(!services_has(&a, "tcp://127.0.0.1:95"), KFX_WAIT_MS))
        fail_msg("the Mooncake unregistration through B never reached A");

    /* racing pairs: one service key registered with other endpoints through A and B at once */
    for (int round = 0; round < 4; round++) {
        struct racer r[2] = {{&a, "", 0}, {&b, "", 0}};
        for (int i = 0; i < 2; i++)
            snprintf(r[i].body, sizeof r[i].body,
                     "{\"endpoint\":\"tcp://127.0.0.1:%d\",\"type\":\"vLLM\",\"modelname\":\"cm\","
                     "\"instance_id\":\"race-%d\",\"block_size\":4,\"dp_rank\":0}",
                     100 + 2 * round + i, round);
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&th[i], NULL, race_register, &r[i]), 0);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        if (!((r[0].status == 200 && r[1].status == 400) || (r[0].status == 400 && r[1].status == 200)))
            fail_msg("round %d: A answered %ld, B %ld (want one 200 and one 400)", round, r[0].status, r[1].status);
        int win = r[0].status == 200 ? 0 : 1;
        char want[64], lose[64];
        snprintf(want, sizeof want, "\"Endpoint\":\"tcp://127.0.0.1:%d\"", 100 + 2 * round + win);
        snprintf(lose, sizeof lose, "\"Endpoint\":\"tcp://127.0.0.1:%d\"", 100 + 2 * round + 1 - win);
                if (!KFX_WAIT(services_has(&a, want) && services_has(&b, want), KFX_WAIT_MS))
            fail_msg("round %d: the winner's value never reached both replicas", round);
        assert_false(services_has(&a, lose));
        assert_false(services_has(&b, lose));
    }

    /* NATS gone: /unregister answers 503 and changes nothing (B stopped first: a stop with NATS away
     * waits for libnats' close; a /register's 503 is test_shared_registrations', the same path) */
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    kvi_nats_server_stop(&ns);
    kfx_expect(&a, "/unregister", "{\"instance_id\":\"race-0\",\"dp_rank\":0}", 503, NULL);
    assert_true(services_has(&a, "\"InstanceID\":\"race-0\""));

    kvidx_pub_destroy(p);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_registrations),
        cmocka_unit_test(test_nats_late),
        cmocka_unit_test(test_conductor_registrations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
