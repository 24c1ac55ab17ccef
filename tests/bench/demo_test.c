/* ctest-labels: integration */
/*
 * kvidx-bench demo (bench/demo.h) against the real daemon: the demo's mock
 * engines run in this process and register over HTTP, as any engine fleet:
 *   - /workers lists the demo engines (instances 1..N of model "demo"), each
 *     active;
 *   - within a deadline, /dump holds stored blocks of demo:default and the
 *     index gauges grow;
 *   - a /query built with the demo's own token generator (the demo's trace
 *     and workload settings, kvi_trace_block_tokens) scores > 0, and a prompt
 *     the demo never produced scores nothing;
 *   - config.workers picks the number of engines, and a daemon started with
 *     --admin-token takes the demo's registrations with that token;
 *   - bad settings (a trace that cannot be read, 0 workers, an unknown flag)
 *     are refused before anything runs (the subcommand exits 2), and a demo
 *     that cannot register anything ends (exit 1) instead of idling.
 * Every wait polls up to a deadline (KFX_WAIT_MS).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "api/kvidxd_fixture.h"

#include "bench/demo.h"
#include "engine/common.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* Whether /workers?model_name=demo lists instances 1..n, every one active. */
static bool demo_workers_active(const struct kfx_daemon *d, uint32_t n)
{
    struct kfx_resp r;
    bool ok = kfx_get(d, "/workers?model_name=demo", &r) == 200;
    for (uint32_t i = 1; ok && i <= n; i++) {
        char needle[96];
        snprintf(needle, sizeof needle, "{\"instance_id\":%u,\"model_name\":\"demo\"", i);
        const char *p = strstr(r.body, needle);
        const char *end = p ? strstr(p, "\"listeners\"") : NULL;
        const char *st = p ? strstr(p, "\"status\":\"active\"") : NULL;
        ok = p != NULL && st != NULL && end != NULL && st < end;
    }
    /* exactly n workers */
    size_t count = 0;
    for (const char *p = r.body; ok && (p = strstr(p, "\"instance_id\":")) != NULL; p++)
        count++;
    ok = ok && count == n;
    kfx_resp_free(&r);
    return ok;
}

/* Whether /dump holds stored blocks of the demo's namespace. */
static bool dump_has_blocks(const struct kfx_daemon *d)
{
    struct kfx_resp r;
    bool ok = kfx_get(d, "/dump", &r) == 200 && strstr(r.body, "\"demo:default\"") != NULL &&
              strstr(r.body, "\"tokens_hash\"") != NULL;
    kfx_resp_free(&r);
    return ok;
}

/* The Dynamo /query body for the first n prompt blocks of request `req` of the demo's workload. */
static char *demo_query_json(const struct kvi_trace_workload *w, uint32_t req, uint32_t n)
{
    uint32_t bs = w->cfg.block_size;
    uint32_t *tok = calloc((size_t)n * bs, sizeof *tok);
    assert_non_null(tok);
    for (uint32_t i = 0; i < n; i++)
        kvi_trace_block_tokens(w, req, i, tok + (size_t)i * bs);
    size_t cap = 128 + (size_t)n * bs * 12, o = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    o += (size_t)snprintf(s + o, cap - o, "{\"model_name\":\"demo\",\"token_ids\":[");
    for (size_t i = 0; i < (size_t)n * bs; i++)
        o += (size_t)snprintf(s + o, cap - o, "%s%u", i ? "," : "", tok[i]);
    snprintf(s + o, cap - o, "]}");
    free(tok);
    return s;
}

/* The largest score in a Dynamo score response ("scores":{"id":{"rank":tokens},...}). */
static long max_score(const char *body)
{
    const char *p = strstr(body, "\"scores\":{");
    if (p == NULL)
        return -1;
    const char *end = strstr(p, "\"frequencies\"");
    long best = 0;
    for (p += 10; (p = strstr(p, "\":")) != NULL && (end == NULL || p < end); p += 2) {
        if (p[2] == '{')
            continue; /* an instance's rank map opens */
        best = KVI_MAX(best, strtol(p + 2, NULL, 10));
    }
    return best;
}

static bool query_scores(const struct kfx_daemon *d, const char *json, long *best)
{
    struct kfx_resp r;
    bool ok = kfx_post_json(d, "/query", json, &r) == 200;
    *best = ok ? max_score(r.body) : -1;
    kfx_resp_free(&r);
    return ok && *best > 0;
}

/* Start a demo of @p workers engines against @p d (with @p token, may be NULL). */
static struct kvi_demo *demo_at(const struct kfx_daemon *d, uint32_t workers, const char *token)
{
    static char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", d->port);
    struct kvi_demo_config c;
    kvi_demo_config_init(&c);
    c.url = url;
    c.workers = workers;
    c.admin_token = token;
    char err[256] = "";
    struct kvi_demo *demo = kvi_demo_create(&c, err, sizeof err);
    if (demo == NULL)
        fail_msg("kvi_demo_create: %s", err);
    assert_int_equal(kvi_demo_start(demo), 0);
    return demo;
}

static void test_demo_end_to_end(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    struct kvi_demo *demo = demo_at(&d, 4, NULL);

    if (!KFX_WAIT(demo_workers_active(&d, 4) && kvi_demo_running(demo), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("/workers never listed 4 active demo engines");
    }
    if (!KFX_WAIT(dump_has_blocks(&d), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("/dump never showed demo blocks");
    }
    const char *entries = "kvidx_index_entries{model=\"demo\",tenant=\"default\"}";
    long long e1 = kfx_metric(&d, entries);
    assert_true(e1 > 0);

    /* the demo's own token generator: same trace, same workload settings */
    struct kvi_demo_config c;
    kvi_demo_config_init(&c);
    struct kvi_trace t;
    char err[256] = "";
    assert_int_equal(kvi_demo_load_trace(&c, &t, err, sizeof err), 0);
    struct kvi_trace_workload_cfg wc;
    kvi_demo_workload_config(&c, &wc);
    struct kvi_trace_workload w;
    assert_int_equal(kvi_trace_workload_build(&w, &t, &wc, NULL, NULL), 0);
    uint32_t n = KVI_MIN(w.req_blocks[0], 12u);
    assert_true(n >= 1);
    char *q = demo_query_json(&w, 0, n);
    long best = -1;
    if (!KFX_WAIT(query_scores(&d, q, &best), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("a prompt of the demo's trace never scored (last best %ld)", best);
    }
    assert_true(best > 0 && best % (long)c.block_size == 0 && best <= (long)(n * c.block_size));
    free(q);

    /* tokens no request of the trace has: nothing matches */
    char miss[256];
    snprintf(miss, sizeof miss, "{\"model_name\":\"demo\",\"token_ids\":[%u", 0x7ffffff0u);
    for (uint32_t i = 1; i < c.block_size && strlen(miss) < sizeof miss - 16; i++)
        strcat(miss, ",1");
    strcat(miss, "]}");
    struct kfx_resp r;
    assert_int_equal(kfx_post_json(&d, "/query", miss, &r), 200);
    assert_int_equal(max_score(r.body), 0);
    kfx_resp_free(&r);

    /* the index keeps changing: new blocks arrive */
    uint64_t stored0 = 0;
    {
        long long v = kfx_metric(&d, "kvidx_events_total{type=\"stored\"}");
        assert_true(v > 0);
        stored0 = (uint64_t)v;
    }
    if (!KFX_WAIT((uint64_t)kfx_metric(&d, "kvidx_events_total{type=\"stored\"}") > stored0, KFX_WAIT_MS))
        fail_msg("no stored events after the first ones");
    assert_true(kfx_metric(&d, "kvidx_listener_lost_total") == 0);

    kvi_trace_workload_free(&w);
    kvi_trace_free(&t);
    kvi_demo_destroy(demo);
    int64_t ms = 0;
    assert_int_equal(kfx_stop(&d, SIGTERM, &ms), 0);
    assert_true(ms < 2000);
}

static void test_demo_workers_and_token(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--admin-token", "s3cret", NULL};
    kfx_start(&d, args, NULL);
    struct kvi_demo *demo = demo_at(&d, 2, "s3cret");
    if (!KFX_WAIT(demo_workers_active(&d, 2) && kvi_demo_running(demo), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("/workers never listed 2 active demo engines");
    }
    kvi_demo_destroy(demo);
    assert_int_equal(kfx_stop(&d, SIGINT, NULL), 0);
}

static void test_demo_bad_settings(void **state)
{
    (void)state;
    struct kvi_demo_config c;
    char err[600] = "";
    kvi_demo_config_init(&c);
    c.trace_path = "/nonexistent/trace.jsonl";
    assert_null(kvi_demo_create(&c, err, sizeof err));
    assert_non_null(strstr(err, "--trace /nonexistent/trace.jsonl"));
    kvi_demo_config_init(&c);
    c.workers = 0;
    assert_null(kvi_demo_create(&c, err, sizeof err));
    assert_non_null(strstr(err, "--workers"));
    /* the subcommand: bad flags exit 2 before anything runs */
    char *bad_trace[] = {"demo", "--trace", "/nonexistent/trace.jsonl", NULL};
    assert_int_equal(kvi_bench_demo(3, bad_trace), 2);
    char *bad_flag[] = {"demo", "--frobnicate", NULL};
    assert_int_equal(kvi_bench_demo(2, bad_flag), 2);
    /* nobody listens at the URL: nothing registers, the demo ends with 1 */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0); /* bound, never listening: refused */
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", ntohs(a.sin_port));
    char *nobody[] = {"demo", "--url", url, "--workers", "1", NULL};
    assert_int_equal(kvi_bench_demo(5, nobody), 1);
    close(fd);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_demo_end_to_end, teardown),
        cmocka_unit_test_teardown(test_demo_workers_and_token, teardown),
        cmocka_unit_test_teardown(test_demo_bad_settings, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
