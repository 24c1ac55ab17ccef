/* ctest-labels: integration */
/*
 * kvidxd: capacity_blocks in POST /register pre-sizes the index
 * (api/service_capacity.c), against the real daemon and real ZMQ publishers.
 *   - the rule: a rank's slot map is reserved for its capacity, a partition
 *     for its ranks' capacities added up (--threads 2: instances 1 and 3
 *     share partition 0, instance 2 has partition 1), shown by the
 *     kvidx_capacity_* metrics and /workers; an unregistration lowers it;
 *   - the effect, counted rather than timed: storing a rank's whole pool
 *     rebuilds no table (kvidx_index_table_rebuilds_total does not move),
 *     while storing past a rank's capacity in the other partition does;
 *   - --capacity-max-blocks cuts a reservation (counted, logged) and 0 turns
 *     pre-sizing off; capacity_blocks 0 is a 422.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kvidxd_fixture.h"

#define REBUILDS "kvidx_index_table_rebuilds_total{model=\"m\",tenant=\"default\"}"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

static void reg(struct kfx_daemon *d, uint64_t id, const char *ep, const char *replay, const char *capacity,
                long status)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"model_name\":\"m\",\"block_size\":%d,\"endpoint\":\"%s\"%s%s%s"
             ",\"capacity_blocks\":%s}",
             (unsigned long long)id, KFX_BS, ep, replay ? ",\"replay_endpoint\":\"" : "", replay ? replay : "",
             replay ? "\"" : "", capacity);
    kfx_expect(d, "/register", j, status, status == 201 ? "{\"status\":\"ok\"}" : NULL);
}

static void reg_pub(struct kfx_daemon *d, uint64_t id, struct kvidx_pub *p, const char *capacity)
{
    reg(d, id, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p), capacity, 201);
}

/* Publish blocks [0, n) of chain c in events of 100 and wait until instance id answers all of them. */
static void fill(struct kfx_daemon *d, struct kvidx_pub *p, uint64_t id, uint32_t c, uint32_t n)
{
    for (uint32_t from = 0; from < n; from += 100)
        kfx_publish(p, c, from, from + 100 < n ? from + 100 : n, NULL);
    char *q = kfx_query_json("m", c, n);
    char want[128];
    snprintf(want, sizeof want, "\"scores\":{\"%llu\":{\"0\":%u}}", (unsigned long long)id, n * KFX_BS);
    kfx_until_query(d, "/query", q, want, &p, 1);
    free(q);
}

static void test_capacity_presizes(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    struct kvidx_pub *p1 = kfx_pub(0), *p2 = kfx_pub(0);
    reg_pub(&d, 1, p1, "600");
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_registrations_total"), 1);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_blocks"), 600);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_entries"), 600);
    reg_pub(&d, 2, p2, "400");
    reg(&d, 3, "tcp://127.0.0.1:5999", NULL, "500", 201);
    /* partition 0: 600 + 500; partition 1: 400 */
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_blocks"), 1500);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_entries"), 1500);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_registrations_total"), 3);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_capped_total"), 0);
    assert_true(kfx_get_has(&d, "/workers", 200, "\"capacity_blocks\":600"));
    assert_true(kfx_log_has(&d, "instance 1 dp_rank 0 of m:default reports capacity_blocks 600", NULL, 0));
    /* a whole pool stored: no table rebuilt */
    long long r0 = kfx_metric(&d, REBUILDS);
    assert_true(r0 >= 0);
    fill(&d, p1, 1, 0, 600);
    assert_int_equal(kfx_metric(&d, REBUILDS), r0);
    /* past its capacity (the other partition): rebuilt */
    fill(&d, p2, 2, 1, 1000);
    assert_true(kfx_metric(&d, REBUILDS) > r0);
    /* an unregistration lowers the partition's reservation */
    kfx_expect(&d, "/unregister", "{\"instance_id\":3,\"model_name\":\"m\"}", 200, "{\"status\":\"ok\"}");
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_blocks"), 1000);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_entries"), 1000);
    /* invalid capacities change nothing */
    reg(&d, 4, "tcp://127.0.0.1:5998", NULL, "0", 422);
    reg(&d, 4, "tcp://127.0.0.1:5998", NULL, "\"1000\"", 422);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_registrations_total"), 3);
    assert_true(kfx_get_has(&d, "/workers", 200, "\"instance_id\":2"));
    assert_false(kfx_get_has(&d, "/workers", 200, "\"instance_id\":4"));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    kvidx_pub_destroy(p1);
    kvidx_pub_destroy(p2);
}

static void test_capacity_max(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *cut[] = {"--capacity-max-blocks", "1000", NULL};
    kfx_start(&d, cut, NULL);
    reg(&d, 1, "tcp://127.0.0.1:5999", NULL, "5000", 201);
    reg(&d, 2, "tcp://127.0.0.1:5997", NULL, "100", 201);
    reg(&d, 3, "tcp://127.0.0.1:5998", NULL, "800", 201); /* partition 0: 1000 (cut) + 800, cut to 1000 */
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_registrations_total"), 3);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_capped_total"), 1);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_blocks"), 1900);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_entries"), 1100);
    assert_true(kfx_log_has(&d, "reports capacity_blocks 5000", "cut to --capacity-max-blocks", 0));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    const char *off[] = {"--capacity-max-blocks", "0", NULL};
    kfx_start(&d, off, NULL);
    reg(&d, 1, "tcp://127.0.0.1:5999", NULL, "5000", 201);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_registrations_total"), 0);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_blocks"), 0);
    assert_int_equal(kfx_metric(&d, "kvidx_capacity_reserved_entries"), 0);
    assert_false(kfx_get_has(&d, "/workers", 200, "capacity_blocks"));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    const char *bad[] = {"--capacity-max-blocks", "-1", NULL};
    assert_int_not_equal(kfx_start_rc(&d, bad, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_capacity_presizes, teardown),
        cmocka_unit_test_teardown(test_capacity_max, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
