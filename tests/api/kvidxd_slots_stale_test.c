/* ctest-labels: integration */
/*
 * kvidxd's 300-second stale-request cleanup over HTTP, with the injectable
 * clock: DYN_KV_INDEXER_TEST_ENDPOINTS mounts POST /test/advance_clock on the
 * slot port, which moves the tracker's clock forward. The cleanup ticks once
 * a second (kvidx_slots_expire_runs_total counts the ticks): a request is
 * removed once it is older than 300 s, by the ticker or, lazily, by a later
 * /add to the same tracker.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kvidxd_fixture.h"

#define OK "{\"status\":\"ok\"}"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

static void add(struct kfx_daemon *sv, const char *rid, const char *hashes, uint64_t isl)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"model_name\":\"m\",\"request_id\":\"%s\",\"worker_id\":1,\"dp_rank\":0,\"sequence_hashes\":[%s],"
             "\"new_isl_tokens\":%llu}",
             rid, hashes, (unsigned long long)isl);
    kfx_expect(sv, "/add", j, 201, OK);
}

static char *loads_of_rank0(uint64_t prefill, uint64_t blocks)
{
    static char buf[256];
    snprintf(buf, sizeof buf,
             "[{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":0,"
             "\"active_prefill_tokens\":%llu,\"active_decode_blocks\":%llu}]",
             (unsigned long long)prefill, (unsigned long long)blocks);
    return buf;
}

static bool loads_are(struct kfx_daemon *sv, uint64_t prefill, uint64_t blocks)
{
    struct kfx_resp r;
    bool ok = kfx_get(sv, "/loads", &r) == 200 && strcmp(r.body, loads_of_rank0(prefill, blocks)) == 0;
    kfx_resp_free(&r);
    return ok;
}

static void advance(struct kfx_daemon *sv, const char *json)
{
    kfx_expect(sv, "/test/advance_clock", json, 200, OK);
}

/* Wait until the cleanup ticked at least twice after now (so a tick saw the clock as it is now). */
static void two_ticks(struct kfx_daemon *sv)
{
    long long t0 = kfx_metric(sv, "kvidx_slots_expire_runs_total");
    assert_true(t0 >= 0);
    if (!KFX_WAIT(kfx_metric(sv, "kvidx_slots_expire_runs_total") >= t0 + 2, 5000))
        fail_msg("the cleanup did not tick");
}

static void test_ticker(void **state)
{
    (void)state;
    const char *env[] = {"DYN_KV_INDEXER_TEST_ENDPOINTS=1", NULL};
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, env);
    kfx_expect(&sv, "/register", "{\"worker_id\":1,\"model_name\":\"m\",\"block_size\":4,\"dp_start\":0,\"dp_size\":1}",
               201, OK);
    add(&sv, "old", "1,2,3", 30);
    advance(&sv, "{\"seconds\":200}");
    add(&sv, "young", "1,2,9", 5); /* shares 2 blocks with "old": 4 distinct */
    assert_true(loads_are(&sv, 35, 4));
    /* old is 295 s old (plus the real seconds two ticks take): not stale, the ticker leaves it */
    advance(&sv, "{\"seconds\":95}");
    two_ticks(&sv);
    assert_true(loads_are(&sv, 35, 4));
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_expired_total"), 0);
    /* over 301 s: the ticker removes it (and only it) within a second */
    advance(&sv, "{\"milliseconds\":6000}");
    if (!KFX_WAIT(loads_are(&sv, 5, 3), 5000))
        fail_msg("the stale request was not removed");
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_expired_total"), 1);
    /* an expired request is gone: its prefill_complete is a 404, its free a no-op */
    kfx_expect(&sv, "/prefill_complete", "{\"model_name\":\"m\",\"request_id\":\"old\"}", 404,
               "{\"error\":\"Request old not found\"}");
    kfx_expect(&sv, "/free", "{\"model_name\":\"m\",\"request_id\":\"old\"}", 200, OK);
    /* its id can be used again */
    add(&sv, "old", "7", 0);
    assert_true(loads_are(&sv, 5, 4));
    /* bad bodies of the test route */
    advance(&sv, "{\"seconds\":0}");
    kfx_expect(&sv, "/test/advance_clock", "{}", 422, NULL);
    kfx_expect(&sv, "/test/advance_clock", "{\"seconds\":-1}", 400, NULL);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_lazy_on_add(void **state)
{
    (void)state;
    const char *env[] = {"DYN_KV_INDEXER_TEST_ENDPOINTS=1", NULL};
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, env);
    kfx_expect(&sv, "/register", "{\"worker_id\":1,\"model_name\":\"m\",\"block_size\":4,\"dp_start\":0,\"dp_size\":1}",
               201, OK);
    add(&sv, "a", "1,2", 10);
    add(&sv, "b", "3", 20);
    /* an /add to the same tracker expires the stale ones first, whatever the ticker does */
    advance(&sv, "{\"seconds\":301}");
    add(&sv, "c", "4", 1);
    assert_true(loads_are(&sv, 1, 1));
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_expired_total"), 2);
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_requests"), 1);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_ticker, teardown),
        cmocka_unit_test_teardown(test_lazy_on_add, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
