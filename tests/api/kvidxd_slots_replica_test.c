/* ctest-labels: integration tsan */
/*
 * Replica synchronisation between two kvidxd processes over HTTP/2 (kvidx's
 * deviation from the document's ZMQ transport): lifecycle events of one
 * replica reach its peers; events for an unknown (model, tenant), block
 * size, worker or rank are dropped and counted and never create workers; a
 * full outbound queue drops and counts instead of blocking (the sender is
 * paused with the test route to fill it); peers added at runtime; a
 * replica's own events that come back are dropped; a dead peer costs the
 * HTTP path nothing; the sync route's own statuses.
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

static const char *const test_routes_env[] = {"DYN_KV_INDEXER_TEST_ENDPOINTS=1", NULL};

static void url_of(const struct kfx_daemon *sv, char *out, size_t cap)
{
    snprintf(out, cap, "http://127.0.0.1:%u", sv->port);
}

static void reg(struct kfx_daemon *sv, uint64_t w, const char *model, uint32_t bs, uint32_t size)
{
    char j[256];
    snprintf(j, sizeof j, "{\"worker_id\":%llu,\"model_name\":\"%s\",\"block_size\":%u,\"dp_start\":0,\"dp_size\":%u}",
             (unsigned long long)w, model, bs, size);
    kfx_expect(sv, "/register", j, 201, OK);
}

static void add(struct kfx_daemon *sv, const char *model, const char *rid, uint64_t w, uint32_t rank,
                const char *hashes, uint64_t isl)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"model_name\":\"%s\",\"request_id\":\"%s\",\"worker_id\":%llu,\"dp_rank\":%u,\"sequence_hashes\":[%s],"
             "\"new_isl_tokens\":%llu}",
             model, rid, (unsigned long long)w, rank, hashes, (unsigned long long)isl);
    kfx_expect(sv, "/add", j, 201, OK);
}

static void life(struct kfx_daemon *sv, const char *path, const char *model, const char *rid)
{
    char j[256];
    snprintf(j, sizeof j, "{\"model_name\":\"%s\",\"request_id\":\"%s\"}", model, rid);
    kfx_expect(sv, path, j, 200, OK);
}

static bool get_is(struct kfx_daemon *sv, const char *path, const char *want)
{
    struct kfx_resp r;
    bool ok = kfx_get(sv, path, &r) == 200 && strcmp(r.body, want) == 0;
    kfx_resp_free(&r);
    return ok;
}

static void wait_get(struct kfx_daemon *sv, const char *path, const char *want)
{
    if (!KFX_WAIT(get_is(sv, path, want), KFX_WAIT_MS)) {
        struct kfx_resp r;
        kfx_get(sv, path, &r);
        fail_msg("GET %s never answered %s; last %s", path, want, r.body);
    }
}

static void wait_metric(struct kfx_daemon *sv, const char *name, long long want)
{
    if (!KFX_WAIT(kfx_metric(sv, name) == want, KFX_WAIT_MS))
        fail_msg("%s: %lld, want %lld", name, kfx_metric(sv, name), want);
}

#define LOAD(w, r, p, b)                                                                                             \
    "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":" #w ",\"dp_rank\":" #r                          \
    ",\"active_prefill_tokens\":" #p ",\"active_decode_blocks\":" #b "}"

static void test_two_replicas(void **state)
{
    (void)state;
    struct kfx_daemon b, bs, a, as;
    const char *b_args[] = {"--replica-sync", NULL};
    kfx_start_slots(&b, &bs, b_args, test_routes_env);
    char b_url[64];
    url_of(&bs, b_url, sizeof b_url);
    const char *a_args[] = {"--replica-sync-peers", b_url, NULL};
    kfx_start_slots(&a, &as, a_args, test_routes_env);
    kfx_expect_get(&as, "/peers", 200, NULL);

    /* the same registrations on both, except worker 9 (A only), model "x" (A only), "q" (other block size) */
    reg(&as, 1, "m", 16, 2);
    reg(&bs, 1, "m", 16, 2);
    reg(&as, 9, "m", 16, 1);
    reg(&as, 1, "x", 16, 1);
    reg(&as, 1, "q", 16, 1);
    reg(&bs, 1, "q", 32, 1);

    /* add, prefill_complete and free on A show up on B */
    add(&as, "m", "r1", 1, 1, "5,6,7", 40);
    wait_get(&bs, "/loads?model_name=m", "[" LOAD(1, 0, 0, 0) "," LOAD(1, 1, 40, 3) "]");
    life(&as, "/prefill_complete", "m", "r1");
    wait_get(&bs, "/loads?model_name=m", "[" LOAD(1, 0, 0, 0) "," LOAD(1, 1, 0, 3) "]");
    life(&as, "/free", "m", "r1");
    wait_get(&bs, "/loads?model_name=m", "[" LOAD(1, 0, 0, 0) "," LOAD(1, 1, 0, 0) "]");
    wait_metric(&bs, "kvidx_slots_replica_applied_total", 3);

    /* drops: unknown worker (9), unknown model (x), block size (q); nothing is created */
    add(&as, "m", "r9", 9, 0, "1", 1);
    add(&as, "x", "rx", 1, 0, "1", 1);
    add(&as, "q", "rq", 1, 0, "1", 1);
    wait_metric(&bs, "kvidx_slots_replica_dropped_worker_total", 1);
    wait_metric(&bs, "kvidx_slots_replica_dropped_tracker_total", 1);
    wait_metric(&bs, "kvidx_slots_replica_dropped_block_size_total", 1);
    kfx_expect_get(&bs, "/workers?model_name=m", 200,
                   "[{\"worker_id\":1,\"model_name\":\"m\",\"tenant_id\":\"default\",\"block_size\":16,\"dp_start\":0,"
                   "\"dp_size\":2}]");
    kfx_expect_get(&bs, "/workers?model_name=x", 200, "[]");
    /* the free of a request B dropped is dropped too (its worker is unknown there) */
    life(&as, "/free", "m", "r9");
    wait_metric(&bs, "kvidx_slots_replica_dropped_worker_total", 2);
    /* a free for a request B no longer has (freed there locally) is dropped as unknown */
    add(&as, "m", "rz", 1, 0, "4", 0);
    wait_metric(&bs, "kvidx_slots_replica_applied_total", 4);
    life(&bs, "/free", "m", "rz");
    life(&as, "/free", "m", "rz");
    wait_metric(&bs, "kvidx_slots_replica_dropped_request_total", 1);
    assert_int_equal(kfx_metric(&bs, "kvidx_slots_replica_applied_total"), 4);
    assert_int_equal(kfx_metric(&as, "kvidx_slots_replica_send_errors_total"), 0);

    /* replication is directional: B's writes do not reach A until A is B's peer */
    add(&bs, "m", "rb", 1, 0, "8", 3);
    char a_url[64];
    url_of(&as, a_url, sizeof a_url);
    char pj[128];
    snprintf(pj, sizeof pj, "{\"url\":\"%s\"}", a_url);
    kfx_expect(&bs, "/register_peer", pj, 201, OK);
    add(&bs, "m", "rb2", 1, 0, "9", 4);
    wait_get(&as, "/loads?model_name=m", "[" LOAD(1, 0, 4, 1) "," LOAD(1, 1, 0, 0) "," LOAD(9, 0, 0, 0) "]");
    /* A applied B's event, and did not send it back (replica events never emit) */
    assert_int_equal(kfx_metric(&as, "kvidx_slots_replica_applied_total"), 1);
    assert_int_equal(kfx_metric(&bs, "kvidx_slots_replica_dropped_duplicate_total"), 0);
    kfx_expect(&bs, "/deregister_peer", pj, 200, OK);

    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
}

static void test_queue_full(void **state)
{
    (void)state;
    struct kfx_daemon b, bs, a, as;
    const char *b_args[] = {"--replica-sync", NULL};
    kfx_start_slots(&b, &bs, b_args, test_routes_env);
    char b_url[64];
    url_of(&bs, b_url, sizeof b_url);
    const char *a_args[] = {"--replica-sync-peers", b_url, "--replica-sync-queue", "4", NULL};
    kfx_start_slots(&a, &as, a_args, test_routes_env);
    reg(&as, 1, "m", 16, 1);
    reg(&bs, 1, "m", 16, 1);
    kfx_expect(&as, "/test/replica_sender", "{\"paused\":true}", 200, OK);
    for (int i = 0; i < 10; i++) { /* every /add answers at once though the queue is full */
        char rid[16];
        snprintf(rid, sizeof rid, "q%d", i);
        add(&as, "m", rid, 1, 0, "1,2", 1);
    }
    assert_int_equal(kfx_metric(&as, "kvidx_slots_replica_queued_total"), 4);
    assert_int_equal(kfx_metric(&as, "kvidx_slots_replica_queue_full_total"), 6);
    assert_int_equal(kfx_metric(&as, "kvidx_slots_replica_queue_depth"), 4);
    assert_int_equal(kfx_metric(&bs, "kvidx_slots_replica_applied_total"), 0);
    kfx_expect(&as, "/test/replica_sender", "{\"paused\":false}", 200, OK);
    wait_metric(&bs, "kvidx_slots_replica_applied_total", 4);
    wait_get(&bs, "/loads", "[" LOAD(1, 0, 4, 2) "]");
    wait_metric(&as, "kvidx_slots_replica_queue_depth", 0);
    /* the sender counts a delivery after the peer's answer, which can come
     * after the peer applied the events and the queue emptied: wait for it */
    wait_metric(&as, "kvidx_slots_replica_sent_events_total", 4);
    kfx_expect(&as, "/test/replica_sender", "{\"paused\":1}", 400, NULL);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
}

static void test_self_dead_peer_and_route(void **state)
{
    (void)state;
    struct kfx_daemon a, as;
    /* a peer nobody listens on (port 1), then this replica itself */
    const char *a_args[] = {"--replica-sync-peers", "http://127.0.0.1:1", "--replica-sync-timeout-ms", "500", NULL};
    kfx_start_slots(&a, &as, a_args, test_routes_env);
    reg(&as, 1, "m", 16, 1);
    int64_t t0 = kfx_now_ms();
    for (int i = 0; i < 20; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "d%d", i);
        add(&as, "m", rid, 1, 0, "1", 0);
    }
    assert_true(kfx_now_ms() - t0 < 5000); /* never waits for the peer */
    wait_metric(&as, "kvidx_slots_replica_send_dropped_total", 20);
    assert_true(kfx_metric(&as, "kvidx_slots_replica_send_errors_total") >= 1);
    kfx_expect(&as, "/deregister_peer", "{\"url\":\"http://127.0.0.1:1\"}", 200, OK);
    /* without --replica-sync-advertise a replica may name itself: its own events come back and are dropped */
    char own[64], pj[128];
    url_of(&as, own, sizeof own);
    snprintf(pj, sizeof pj, "{\"url\":\"%s\"}", own);
    kfx_expect(&as, "/register_peer", pj, 201, OK);
    add(&as, "m", "self", 1, 0, "1", 0);
    wait_metric(&as, "kvidx_slots_replica_received_self_total", 1);
    assert_int_equal(kfx_metric(&as, "kvidx_slots_replica_applied_total"), 0);

    /* the sync route: JSON bodies too, with its own errors */
    const char *ev = "{\"source\":\"00000000000000aa\",\"events\":[{\"type\":\"add\",\"model_name\":\"m\","
                     "\"block_size\":16,\"request_id\":\"j1\",\"worker_id\":1,\"dp_rank\":0,"
                     "\"sequence_hashes\":[-1,2],\"new_isl_tokens\":7},{\"type\":\"add\",\"model_name\":\"m\","
                     "\"block_size\":16,\"request_id\":\"j2\",\"worker_id\":2,\"dp_rank\":0}]}";
    kfx_expect(&as, "/replica/events", ev, 200, "{\"applied\":1,\"dropped\":1}");
    kfx_expect(&as, "/replica/events", "{\"source\":\"x\",\"events\":[{\"type\":\"boom\",\"model_name\":\"m\","
               "\"block_size\":16,\"request_id\":\"j1\",\"worker_id\":1,\"dp_rank\":0}]}", 422, NULL);
    kfx_expect(&as, "/replica/events", "{\"source\":\"x\",\"events\":[{\"type\":\"free\"}]}", 422, NULL);
    kfx_expect(&as, "/replica/events", "{\"source\":\"x\"}", 422, NULL);
    kfx_expect(&as, "/replica/events", "{\"events\":[", 400, NULL);
    struct kfx_resp r;
    const char *txt[] = {"Content-Type: text/plain", NULL};
    assert_int_equal(kfx_http(&as, KFX_H1, "POST", "/replica/events", txt, "{}", 2, &r), 415);
    kfx_resp_free(&r);
    kfx_expect_get(&as, "/loads", 200, "[" LOAD(1, 0, 7, 3) "]");
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_two_replicas, teardown),
        cmocka_unit_test_teardown(test_queue_full, teardown),
        cmocka_unit_test_teardown(test_self_dead_peer_and_route, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
