/* ctest-labels: integration */
/*
 * kvidxd, Dynamo dialect (http-api.md §1) against the real binary: exact
 * status codes and texts of /register and /unregister, /workers shape,
 * filters and order, namespace lifetime, /peers, the test routes' gating,
 * the admin token, /metrics names, and JSON bodies for every framework
 * error (400/404/405/413/415/422); the listeners' liveness in /workers
 * (connected, messages, seconds since the last one) against a real
 * publisher, and the daemon's log lines for a gap.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <regex.h>

#include "kvidxd_fixture.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

static void reg(struct kfx_daemon *d, uint64_t id, uint32_t rank, const char *model, const char *tenant, uint32_t bs,
                const char *ep, int status, const char *body)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"dp_rank\":%u,\"model_name\":\"%s\",\"tenant_id\":\"%s\",\"block_size\":%u,"
             "\"endpoint\":\"%s\"}",
             (unsigned long long)id, rank, model, tenant, bs, ep);
    kfx_expect(d, "/register", j, status, body);
}

static void test_register_unregister(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    const char *ok = "{\"status\":\"ok\"}";
    reg(&d, 1, 0, "m", "default", 16, "tcp://127.0.0.1:5999", 201, ok);
    reg(&d, 1, 0, "m", "default", 16, "tcp://127.0.0.1:5999", 409, "{\"error\":\"instance 1 dp_rank 0 already registered\"}");
    reg(&d, 1, 0, "m2", "default", 16, "tcp://127.0.0.1:5999", 409,
        "{\"error\":\"instance 1 is already registered for model=m tenant=default\"}");
    reg(&d, 2, 0, "m", "default", 32, "tcp://127.0.0.1:5999", 409,
        "{\"error\":\"block_size mismatch for model=m tenant=default: existing=16, requested=32\"}");
    reg(&d, 3, 0, "m", "default", 16, "tcp://host", 400, NULL);
    reg(&d, 3, 0, "m", "default", 16, "udp://host:5", 400, NULL);
    kfx_expect(&d, "/register",
               "{\"instance_id\":3,\"model_name\":\"m\",\"block_size\":16,\"endpoint\":\"tcp://127.0.0.1:1\","
               "\"replay_endpoint\":\"nope\"}",
               400, NULL);
    reg(&d, 1, 1, "m", "default", 16, "tcp://127.0.0.1:5998", 201, ok);
    reg(&d, 2, 0, "m", "t2", 8, "tcp://127.0.0.1:5997", 201, ok);
    /* model_name defaults: tenant default, dp_rank 0 */
    kfx_expect(&d, "/register",
               "{\"instance_id\":18446744073709551615,\"model_name\":\"z\",\"block_size\":4,"
               "\"endpoint\":\"ipc:///tmp/kvidxd-test.sock\",\"additionalsalt\":\"s\"}",
               201, ok);

    /* nothing listens on these ports: active, yet no message and not connected */
#define NO_PUB "\"messages\":0,\"seconds_since_last_message\":null,\"connected\":false"
    const char *w1 = "{\"instance_id\":1,\"model_name\":\"m\",\"tenant_id\":\"default\",\"block_size\":16,"
                     "\"source\":\"zmq\",\"status\":\"active\",\"endpoints\":{\"0\":\"tcp://127.0.0.1:5999\","
                     "\"1\":\"tcp://127.0.0.1:5998\"},\"listeners\":{\"0\":{\"endpoint\":\"tcp://127.0.0.1:5999\","
                     "\"status\":\"active\"," NO_PUB "},"
                     "\"1\":{\"endpoint\":\"tcp://127.0.0.1:5998\",\"status\":\"active\"," NO_PUB "}}}";
    const char *w2 = "{\"instance_id\":2,\"model_name\":\"m\",\"tenant_id\":\"t2\",\"block_size\":8,"
                     "\"source\":\"zmq\",\"status\":\"active\",\"endpoints\":{\"0\":\"tcp://127.0.0.1:5997\"},"
                     "\"listeners\":{\"0\":{\"endpoint\":\"tcp://127.0.0.1:5997\",\"status\":\"active\"," NO_PUB "}}}";
#undef NO_PUB
    char all[2048];
    snprintf(all, sizeof all, "[%s,%s,", w1, w2);
    struct kfx_resp r;
    assert_int_equal(kfx_get(&d, "/workers", &r), 200);
    assert_string_equal(r.ctype, "application/json");
    if (strncmp(r.body, all, strlen(all)) != 0 || !strstr(r.body, "\"instance_id\":18446744073709551615"))
        fail_msg("/workers: %s", r.body);
    kfx_resp_free(&r);
    char one[1024];
    snprintf(one, sizeof one, "[%s]", w2);
    kfx_expect_get(&d, "/workers?model_name=m&tenant_id=t2", 200, one);
    snprintf(one, sizeof one, "[%s,%s]", w1, w2);
    kfx_expect_get(&d, "/workers?model_name=m", 200, one);
    kfx_expect_get(&d, "/workers?tenant_id=nobody", 200, "[]");

    /* /unregister: 404 texts, then the three forms */
    kfx_expect(&d, "/unregister", "{\"instance_id\":9,\"model_name\":\"m\"}", 404,
               "{\"error\":\"instance 9 not found\"}");
    kfx_expect(&d, "/unregister", "{\"instance_id\":1,\"model_name\":\"other\"}", 404,
               "{\"error\":\"instance 1 is registered for model=m tenant=default\"}");
    kfx_expect(&d, "/unregister", "{\"instance_id\":1,\"model_name\":\"m\",\"tenant_id\":\"t2\"}", 404,
               "{\"error\":\"instance 1 is registered for model=m tenant=default\"}");
    kfx_expect(&d, "/unregister", "{\"instance_id\":1,\"model_name\":\"m\",\"tenant_id\":\"default\",\"dp_rank\":5}",
               404, "{\"error\":\"instance 1 dp_rank 5 not found\"}");
    kfx_expect(&d, "/unregister", "{\"instance_id\":1,\"model_name\":\"m\",\"tenant_id\":\"default\",\"dp_rank\":1}",
               200, ok);
    assert_true(kfx_get_has(&d, "/workers?model_name=m&tenant_id=default", 200,
                            "\"endpoints\":{\"0\":\"tcp://127.0.0.1:5999\"},"));
    kfx_expect(&d, "/unregister", "{\"instance_id\":1,\"model_name\":\"m\"}", 200, ok);
    kfx_expect_get(&d, "/workers?model_name=m&tenant_id=default", 200, "[]");
    /* the namespace went with its last instance; the other tenant's stays */
    kfx_expect(&d, "/query", "{\"model_name\":\"m\",\"token_ids\":[1,2,3]}", 404,
               "{\"error\":\"no indexer for model=m tenant=default\"}");
    kfx_expect(&d, "/query", "{\"model_name\":\"m\",\"tenant_id\":\"t2\",\"token_ids\":[1,2,3,4,5,6,7,8]}", 200,
               "{\"scores\":{},\"frequencies\":[],\"tree_sizes\":{},\"instances\":{}}");
    kfx_expect_get(&d, "/dump", 200, "{\"m:t2\":{\"block_size\":8,\"events\":[]},\"z:default\":{\"block_size\":4,\"events\":[]}}");
    /* a last-rank unregister by rank removes the whole instance */
    kfx_expect(&d, "/unregister", "{\"instance_id\":2,\"model_name\":\"m\",\"tenant_id\":\"t2\",\"dp_rank\":0}", 200,
               ok);
    kfx_expect_get(&d, "/dump", 200, "{\"z:default\":{\"block_size\":4,\"events\":[]}}");
    int64_t ms;
    assert_int_equal(kfx_stop(&d, SIGTERM, &ms), 0);
}

static void expect_json_error(struct kfx_daemon *d, const char *method, const char *path, const char *ctype,
                              const void *body, size_t len, long status)
{
    struct kfx_resp r;
    char hdr[128];
    snprintf(hdr, sizeof hdr, "Content-Type: %s", ctype ? ctype : "");
    /* a 413 comes before the body: with 100-continue curl waits for it instead of sending */
    const char *h[] = {ctype ? hdr : "Content-Type:", status == 413 ? "Expect: 100-continue" : NULL, NULL};
    for (int proto = KFX_H1; proto <= KFX_H2C; proto++) {
        long s = kfx_http(d, proto, method, path, h, body, len, &r);
        if (s != status || strncmp(r.body, "{\"error\":\"", 10) != 0 || strcmp(r.ctype, "application/json") != 0)
            fail_msg("%s %s (%s): got %ld [%s] %.200s, want %ld with a JSON error", method, path,
                     proto ? "h2c" : "http/1.1", s, r.ctype, r.body, status);
        kfx_resp_free(&r);
        if (status == 413 && proto == KFX_H1)
            break; /* over HTTP/2, h2o 2.2 resets a stream over the largest limit (REFUSED_STREAM) */
    }
}

static void test_errors(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    reg(&d, 1, 0, "m", "default", 4, "tcp://127.0.0.1:5999", 201, NULL);
    const char *q = "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4]}";
    expect_json_error(&d, "POST", "/query", "text/plain", q, strlen(q), 415);
    expect_json_error(&d, "POST", "/query", NULL, q, strlen(q), 415);
    expect_json_error(&d, "POST", "/register", "text/plain", "{}", 2, 415);
    expect_json_error(&d, "POST", "/query", "application/json", "{\"model_name\":", 14, 400);
    expect_json_error(&d, "POST", "/query", "application/json", "{\"token_ids\":[1]}", 17, 422);
    expect_json_error(&d, "POST", "/query", "application/json", "{\"model_name\":\"m\",\"token_ids\":[4294967296]}",
                      42, 422);
    expect_json_error(&d, "POST", "/query_by_hash", "application/json",
                      "{\"model_name\":\"m\",\"block_hashes\":[9223372036854775808]}", 54, 422);
    expect_json_error(&d, "POST", "/register", "application/json", "{\"instance_id\":\"x\"}", 19, 422);
    expect_json_error(&d, "GET", "/nope", NULL, NULL, 0, 404);
    expect_json_error(&d, "GET", "/register", NULL, NULL, 0, 405);
    expect_json_error(&d, "POST", "/workers", "application/json", "{}", 2, 405);
    /* 8 MiB on /query, 2 MB elsewhere */
    size_t big = 8u * 1024 * 1024 + 16;
    char *b = malloc(big);
    memset(b, ' ', big);
    memcpy(b, q, strlen(q));
    expect_json_error(&d, "POST", "/query", "application/json", b, big, 413);
    expect_json_error(&d, "POST", "/register", "application/json", b, 2u * 1024 * 1024 + 16, 413);
    /* just under 8 MiB on /query is served */
    struct kfx_resp r;
    const char *h[] = {"Content-Type: application/json", NULL};
    assert_int_equal(kfx_http(&d, KFX_H1, "POST", "/query", h, b, 8u * 1024 * 1024 - 64, &r), 200);
    kfx_resp_free(&r);
    free(b);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_metrics(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    reg(&d, 1, 0, "m", "default", 16, "tcp://127.0.0.1:5999", 201, NULL);
    reg(&d, 2, 0, "m", "default", 16, "tcp://127.0.0.1:5998", 201, NULL);
    kfx_expect(&d, "/query", "{\"model_name\":\"m\",\"token_ids\":[1]}", 200, NULL);
    kfx_expect(&d, "/query", "{\"model_name\":\"zz\",\"token_ids\":[1]}", 404, NULL);
    struct kfx_resp r;
    /* the handler adds its own time to kvidx_query_duration_seconds after its
     * answer is on the wire, so a /metrics served by the other loop thread
     * may come first: wait for it (bounded) rather than for the scheduler */
    if (!KFX_WAIT(kfx_get_has(&d, "/metrics", 200,
                              "kvidx_query_duration_seconds_count{route=\"/query\",dialect=\"dynamo\"} 2"),
                  KFX_WAIT_MS))
        fail_msg("kvidx_query_duration_seconds never counted both queries");
    assert_int_equal(kfx_get(&d, "/metrics", &r), 200);
    assert_string_equal(r.ctype, "text/plain; version=0.0.4");
    const char *want[] = {
        "# TYPE dynamo_kvindexer_request_duration_seconds histogram",
        "dynamo_kvindexer_request_duration_seconds_bucket{endpoint=\"/query\",le=\"0.0001\"}",
        "dynamo_kvindexer_request_duration_seconds_bucket{endpoint=\"/query\",le=\"52.4288\"}",
        "dynamo_kvindexer_request_duration_seconds_count{endpoint=\"/query\"} 2",
        "dynamo_kvindexer_requests_total{endpoint=\"/register\",method=\"POST\"} 2",
        "dynamo_kvindexer_requests_total{endpoint=\"/query\",method=\"POST\"} 2",
        "dynamo_kvindexer_errors_total{endpoint=\"/query\",status_class=\"4xx\"} 1",
        "\ndynamo_kvindexer_models 1\n",
        "\ndynamo_kvindexer_workers 2\n",
        "dynamo_kvindexer_listeners{status=\"pending\"} 0",
        "dynamo_kvindexer_listeners{status=\"active\"} 2",
        "dynamo_kvindexer_listeners{status=\"paused\"} 0",
        "dynamo_kvindexer_listeners{status=\"failed\"} 0",
        "kvidx_events_total{type=\"stored\"}",
        "kvidx_event_ops_total{outcome=\"applied\"}",
        "kvidx_listener_gaps_total",
        "kvidx_listener_replays_total",
        "kvidx_writer_queued_ops{writer=\"0\"}",
        "kvidx_writer_lag_seconds{writer=\"1\"}",
        "kvidx_index_entries{model=\"m\",tenant=\"default\"}",
        "# TYPE kvidx_index_table_rebuilds_total counter",
        "kvidx_index_table_rebuild_slots_total{model=\"m\",tenant=\"default\"} ",
        "kvidx_index_table_rebuild_seconds_total{model=\"m\",tenant=\"default\"} ",
        "kvidx_query_duration_seconds_count{route=\"/query\",dialect=\"dynamo\"} 2",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (strstr(r.body, want[i]) == NULL)
            fail_msg("/metrics lacks %s", want[i]);
    /* /metrics does not count itself */
    assert_null(strstr(r.body, "endpoint=\"/metrics\""));
    kfx_resp_free(&r);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_test_routes_and_peers(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    const char *ctl = "{\"instance_id\":1}";
    kfx_expect(&d, "/test/pause_listener", ctl, 404, NULL);
    kfx_expect(&d, "/test/resume_listener", ctl, 404, NULL);
    /* peers */
    kfx_expect(&d, "/register_peer", "{\"url\":\"http://a:1\"}", 201, "{\"status\":\"ok\"}");
    kfx_expect(&d, "/register_peer", "{\"url\":\"http://a:1\"}", 201, "{\"status\":\"ok\"}");
    kfx_expect(&d, "/register_peer", "{\"url\":\"http://b:2\"}", 201, NULL);
    kfx_expect_get(&d, "/peers", 200, "[\"http://a:1\",\"http://b:2\"]");
    kfx_expect(&d, "/deregister_peer", "{\"url\":\"http://a:1\"}", 200, "{\"status\":\"ok\"}");
    kfx_expect(&d, "/deregister_peer", "{\"url\":\"http://a:1\"}", 404, "{\"error\":\"peer not found\"}");
    kfx_expect_get(&d, "/peers", 200, "[\"http://b:2\"]");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    const char *env[] = {"DYN_KV_INDEXER_TEST_ENDPOINTS= Yes ", NULL};
    kfx_start(&d, NULL, env);
    reg(&d, 1, 0, "m", "default", 16, "tcp://127.0.0.1:5999", 201, NULL);
    kfx_expect(&d, "/test/pause_listener", "{\"instance_id\":7}", 404, NULL);
    kfx_expect(&d, "/test/pause_listener", "{\"instance_id\":1,\"dp_rank\":3}", 404, NULL);
    kfx_expect(&d, "/test/resume_listener", ctl, 409, NULL);
    kfx_expect(&d, "/test/pause_listener", ctl, 200, "{\"status\":\"ok\"}");
    assert_true(kfx_get_has(&d, "/workers", 200, "\"status\":\"paused\""));
    kfx_expect_get(&d, "/ready", 200, "{\"ready\":true,\"reason\":\"ready\"}");
    kfx_expect(&d, "/test/pause_listener", ctl, 409, NULL);
    kfx_expect(&d, "/test/resume_listener", ctl, 200, "{\"status\":\"ok\"}");
    assert_true(kfx_get_has(&d, "/workers", 200, "\"status\":\"active\""));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_admin_token(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--admin-token", "s3cret", NULL};
    kfx_start(&d, args, NULL);
    const char *j = "{\"instance_id\":1,\"model_name\":\"m\",\"block_size\":16,\"endpoint\":\"tcp://127.0.0.1:5999\"}";
    struct kfx_resp r;
    const char *no[] = {"Content-Type: application/json", NULL};
    const char *bad[] = {"Content-Type: application/json", "Authorization: Bearer nope", NULL};
    const char *yes[] = {"Content-Type: application/json", "Authorization: Bearer s3cret", NULL};
    assert_int_equal(kfx_http(&d, KFX_H1, "POST", "/register", no, j, strlen(j), &r), 401);
    assert_non_null(strstr(r.body, "\"error\""));
    kfx_resp_free(&r);
    assert_int_equal(kfx_http(&d, KFX_H1, "POST", "/register", bad, j, strlen(j), &r), 401);
    kfx_resp_free(&r);
    assert_int_equal(kfx_http(&d, KFX_H2C, "POST", "/register", yes, j, strlen(j), &r), 201);
    kfx_resp_free(&r);
    assert_int_equal(kfx_http(&d, KFX_H1, "POST", "/register_peer", no, "{\"url\":\"x\"}", 11, &r), 401);
    kfx_resp_free(&r);
    /* reads stay open */
    assert_true(kfx_get_has(&d, "/workers", 200, "\"instance_id\":1"));
    kfx_expect(&d, "/query", "{\"model_name\":\"m\",\"token_ids\":[1]}", 200, NULL);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* ---- /workers liveness ------------------------------------------------------------------- */

/* Whether the daemon's log has a line matching the extended regex @p re. */
static bool log_has(const struct kfx_daemon *d, const char *re)
{
    FILE *f = fopen(d->logfile, "r");
    if (f == NULL)
        return false;
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB | REG_NEWLINE), 0);
    char line[4096];
    bool hit = false;
    while (!hit && fgets(line, sizeof line, f) != NULL)
        hit = regexec(&rx, line, 0, NULL, 0) == 0;
    regfree(&rx);
    fclose(f);
    return hit;
}

/* The "listeners" entry of rank 0 in /workers?model_name=live, or "" (caller frees). */
static char *live_listener(const struct kfx_daemon *d)
{
    struct kfx_resp r;
    assert_int_equal(kfx_get(d, "/workers?model_name=live", &r), 200);
    const char *p = strstr(r.body, "\"listeners\":{\"0\":");
    const char *e = p ? strchr(p, '}') : NULL;
    char *out = p && e ? strndup(p, (size_t)(e - p + 1)) : strdup("");
    kfx_resp_free(&r);
    return out;
}

static bool live_matches(const struct kfx_daemon *d, const char *re)
{
    char *l = live_listener(d);
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
    bool hit = regexec(&rx, l, 0, NULL, 0) == 0;
    regfree(&rx);
    free(l);
    return hit;
}

/*
 * "status":"active" says nothing about the engine; the liveness keys do. A
 * listener on an endpoint nobody binds: 0 messages, none yet, not connected.
 * A publisher binds there: connected, and the messages it sends are counted
 * with the seconds since the last one. A gap it leaves is logged with the
 * daemon's timestamp and level. It goes away: not connected, count kept.
 */
static void test_workers_liveness(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/kvidxd-live-%d.sock", (int)getpid());
    unlink(ep + strlen("ipc://"));
    char j[512];
    snprintf(j, sizeof j, "{\"instance_id\":5,\"model_name\":\"live\",\"block_size\":%d,\"endpoint\":\"%s\"}",
             KFX_BS, ep);
    kfx_expect(&d, "/register", j, 201, "{\"status\":\"ok\"}");
    char want[512];
    snprintf(want, sizeof want,
             "\"listeners\":{\"0\":{\"endpoint\":\"%s\",\"status\":\"active\",\"messages\":0,"
             "\"seconds_since_last_message\":null,\"connected\":false}",
             ep);
    char *l = live_listener(&d);
    if (strcmp(l, want) != 0)
        fail_msg("/workers listener before any publisher: %s\nwant %s", l, want);
    free(l);

    /* a publisher without replay: every batch is handled as it arrives, in order */
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    if (!KFX_WAIT(live_matches(&d, "\"connected\":true\\}$"), KFX_WAIT_MS))
        fail_msg("never connected: %s", live_listener(&d));
    /* slow joiner: publish until batches arrive */
    uint32_t i = 0;
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while (!live_matches(&d, "\"messages\":[1-9]") && kfx_now_ms() < end) {
        kfx_publish(p, 0, i, i + 1, NULL);
        i++;
        kfx_nap(20);
    }
    if (!live_matches(&d, "\"status\":\"active\",\"messages\":[1-9][0-9]*,\"seconds_since_last_message\":[0-9]+,"
                          "\"connected\":true\\}$"))
        fail_msg("/workers listener after publishing: %s", live_listener(&d));

    /* two batches lost on the wire: the next one shows the gap (no replay endpoint) */
    kvidx_pub_skip_live(p, 2);
    kfx_publish(p, 0, i, i + 1, NULL);
    kfx_publish(p, 0, i + 1, i + 2, NULL);
    kfx_publish(p, 0, i + 2, i + 3, NULL);
    const char *gap = "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z WARN  listener instance 5 "
                      "rank 0: gap detected: expected seq [0-9]+, got seq [0-9]+; no replay endpoint: 2 batches lost$";
    if (!KFX_WAIT(log_has(&d, gap), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("no gap line in the daemon's log");
    }
    assert_false(log_has(&d, "^kvidx (listener|ingest) ")); /* the old unstamped format */

    kvidx_pub_destroy(p);
    if (!KFX_WAIT(live_matches(&d, "\"messages\":[1-9][0-9]*,\"seconds_since_last_message\":[0-9]+,"
                                   "\"connected\":false\\}$"),
                  KFX_WAIT_MS))
        fail_msg("still connected after the publisher went away: %s", live_listener(&d));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    unlink(ep + strlen("ipc://"));
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_register_unregister, teardown),
        cmocka_unit_test_teardown(test_errors, teardown),
        cmocka_unit_test_teardown(test_metrics, teardown),
        cmocka_unit_test_teardown(test_test_routes_and_peers, teardown),
        cmocka_unit_test_teardown(test_admin_token, teardown),
        cmocka_unit_test_teardown(test_workers_liveness, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
