/* ctest-labels: integration */
/*
 * kvidxd's slot port against the real binary (dynamo-standalone-slot-tracker.md,
 * http-api.md §3): every route's status codes and bodies, the ordering rules
 * (arrival order, forgotten early frees, idempotent free, repeated
 * prefill_complete), sorting and filters, prefill and shared decode-block
 * accounting, signed hashes, peers with replica sync on and off, framework
 * errors as JSON, the admin token, HTTP/2, and the --slot-port switch.
 * The engine's rules are unit-tested in tests/engine; this covers their HTTP
 * mapping.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "kvidxd_fixture.h"

#define OK "{\"status\":\"ok\"}"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

static void reg(struct kfx_daemon *sv, uint64_t w, const char *model, const char *tenant, uint32_t bs, uint32_t start,
                uint32_t size, long status, const char *body)
{
    char j[512];
    if (tenant != NULL)
        snprintf(j, sizeof j,
                 "{\"worker_id\":%llu,\"model_name\":\"%s\",\"tenant_id\":\"%s\",\"block_size\":%u,\"dp_start\":%u,"
                 "\"dp_size\":%u}",
                 (unsigned long long)w, model, tenant, bs, start, size);
    else
        snprintf(j, sizeof j,
                 "{\"worker_id\":%llu,\"model_name\":\"%s\",\"block_size\":%u,\"dp_start\":%u,\"dp_size\":%u}",
                 (unsigned long long)w, model, bs, start, size);
    kfx_expect(sv, "/register", j, status, body);
}

static void add(struct kfx_daemon *sv, const char *model, const char *rid, uint64_t w, uint32_t rank,
                const char *hashes, uint64_t isl, long status, const char *body)
{
    char j[1024];
    snprintf(j, sizeof j,
             "{\"model_name\":\"%s\",\"request_id\":\"%s\",\"worker_id\":%llu,\"dp_rank\":%u,"
             "\"sequence_hashes\":[%s],\"new_isl_tokens\":%llu}",
             model, rid, (unsigned long long)w, rank, hashes, (unsigned long long)isl);
    kfx_expect(sv, "/add", j, status, body);
}

static void life(struct kfx_daemon *sv, const char *path, const char *model, const char *rid, long status,
                 const char *body)
{
    char j[256];
    snprintf(j, sizeof j, "{\"model_name\":\"%s\",\"request_id\":\"%s\"}", model, rid);
    kfx_expect(sv, path, j, status, body);
}

static void test_topology(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, NULL);
    kfx_expect_get(&sv, "/health", 200, "");
    reg(&sv, 7, "m", NULL, 16, 0, 2, 201, OK);
    reg(&sv, 3, "m", "default", 16, 4, 1, 201, OK);
    reg(&sv, 5, "a", "t2", 8, 0, 1, 201, OK);
    reg(&sv, 5, "a", "t1", 32, 0, 1, 201, OK);
    reg(&sv, 9, "m", NULL, 0, 0, 1, 400, "{\"error\":\"block_size must be greater than 0\"}");
    reg(&sv, 9, "m", NULL, 16, 0, 0, 400, "{\"error\":\"dp_size must be greater than 0\"}");
    reg(&sv, 9, "m", NULL, 16, 4294967295u, 2, 400,
        "{\"error\":\"dp range overflows u32: start=4294967295 size=2\"}");
    reg(&sv, 9, "m", NULL, 8, 0, 1, 409,
        "{\"error\":\"block_size mismatch for model=m tenant=default: existing=16, requested=8\"}");
    reg(&sv, 7, "m", NULL, 16, 5, 1, 409, "{\"error\":\"worker 7 already registered for model=m tenant=default\"}");
    /* sorted by (model, tenant, worker); the filters are independent */
    const char *all = "[{\"worker_id\":5,\"model_name\":\"a\",\"tenant_id\":\"t1\",\"block_size\":32,\"dp_start\":0,\"dp_size\":1},"
                      "{\"worker_id\":5,\"model_name\":\"a\",\"tenant_id\":\"t2\",\"block_size\":8,\"dp_start\":0,\"dp_size\":1},"
                      "{\"worker_id\":3,\"model_name\":\"m\",\"tenant_id\":\"default\",\"block_size\":16,\"dp_start\":4,\"dp_size\":1},"
                      "{\"worker_id\":7,\"model_name\":\"m\",\"tenant_id\":\"default\",\"block_size\":16,\"dp_start\":0,\"dp_size\":2}]";
    kfx_expect_get(&sv, "/workers", 200, all);
    kfx_expect_get(&sv, "/workers?tenant_id=t2", 200,
                   "[{\"worker_id\":5,\"model_name\":\"a\",\"tenant_id\":\"t2\",\"block_size\":8,\"dp_start\":0,\"dp_size\":1}]");
    kfx_expect_get(&sv, "/workers?model_name=m&tenant_id=t2", 200, "[]");
    kfx_expect_get(&sv, "/workers?model_name=%61", 200,
                   "[{\"worker_id\":5,\"model_name\":\"a\",\"tenant_id\":\"t1\",\"block_size\":32,\"dp_start\":0,\"dp_size\":1},"
                   "{\"worker_id\":5,\"model_name\":\"a\",\"tenant_id\":\"t2\",\"block_size\":8,\"dp_start\":0,\"dp_size\":1}]");
    /* unregister: 200, then 404; the last worker takes the tracker with it */
    kfx_expect(&sv, "/unregister", "{\"worker_id\":3,\"model_name\":\"m\"}", 200, OK);
    kfx_expect(&sv, "/unregister", "{\"worker_id\":3,\"model_name\":\"m\"}", 404,
               "{\"error\":\"worker 3 not found for model=m tenant=default\"}");
    kfx_expect(&sv, "/unregister", "{\"worker_id\":1,\"model_name\":\"zz\",\"tenant_id\":\"q\"}", 404,
               "{\"error\":\"worker 1 not found for model=zz tenant=q\"}");
    kfx_expect(&sv, "/unregister", "{\"worker_id\":5,\"model_name\":\"a\",\"tenant_id\":\"t1\"}", 200, OK);
    reg(&sv, 6, "a", "t1", 64, 0, 1, 201, OK); /* a fresh tracker: another block size is fine */
    /* body errors */
    kfx_expect(&sv, "/register", "{\"worker_id\":1", 400, NULL);
    kfx_expect(&sv, "/register", "{\"worker_id\":1,\"model_name\":\"m\",\"block_size\":16,\"dp_start\":0}", 422,
               NULL);
    struct kfx_resp r;
    const char *txt[] = {"Content-Type: text/plain", NULL};
    const char *body = "{\"worker_id\":1,\"model_name\":\"m\",\"block_size\":16,\"dp_start\":0,\"dp_size\":1}";
    assert_int_equal(kfx_http(&sv, KFX_H1, "POST", "/register", txt, body, strlen(body), &r), 415);
    assert_non_null(strstr(r.body, "{\"error\":"));
    kfx_resp_free(&r);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_lifecycle_and_loads(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, NULL);
    reg(&sv, 7, "m", NULL, 16, 0, 2, 201, OK);
    reg(&sv, 8, "m", NULL, 16, 0, 1, 201, OK);
    reg(&sv, 1, "b", NULL, 16, 0, 1, 201, OK);
    add(&sv, "m", "r1", 7, 0, "101,-22,303", 48, 201, OK);
    add(&sv, "m", "r1", 8, 0, "1", 0, 409,
        "{\"error\":\"Request r1 already exists (assigned to worker WorkerWithDpRank { worker_id: 7, dp_rank: 0 })\"}");
    add(&sv, "m", "r2", 7, 2, "1", 0, 404, "{\"error\":\"Worker WorkerWithDpRank { worker_id: 7, dp_rank: 2 } not found\"}");
    add(&sv, "m", "r2", 9, 0, "1", 0, 404, "{\"error\":\"Worker WorkerWithDpRank { worker_id: 9, dp_rank: 0 } not found\"}");
    add(&sv, "nope", "r2", 7, 0, "1", 0, 404, "{\"error\":\"no slot tracker for model=nope tenant=default\"}");
    add(&sv, "m", "r-empty", 8, 0, "", 0, 201, OK); /* sequence_hashes may be empty */
    kfx_expect(&sv, "/add", "{\"model_name\":\"m\",\"request_id\":\"x\",\"worker_id\":8,\"dp_rank\":0}", 422, NULL);
    kfx_expect(&sv, "/add",
               "{\"model_name\":\"m\",\"request_id\":\"x\",\"worker_id\":8,\"dp_rank\":0,"
               "\"sequence_hashes\":[9223372036854775808]}",
               422, NULL);
    /* shared decode blocks: [101,-22,303] + [101,-22,404] hold 4 distinct prefixes on (7,0) */
    add(&sv, "m", "r3", 7, 0, "101,-22,404", 0, 201, OK);
    kfx_expect_get(&sv, "/loads?model_name=m", 200,
                   "[{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":48,\"active_decode_blocks\":4},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":1,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":8,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    kfx_expect_get(&sv, "/loads?model_name=b&tenant_id=default", 200,
                   "[{\"model_name\":\"b\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    /* potential loads: the document's example, signed hashes bit for bit (-22 is the same block) */
    kfx_expect(&sv, "/potential_loads",
               "{\"model_name\":\"m\",\"sequence_hashes\":[101,-22,303,404],\"new_isl_tokens\":48}", 200,
               "[{\"worker_id\":7,\"dp_rank\":0,\"potential_prefill_tokens\":96,\"potential_decode_blocks\":5,"
               "\"active_requests\":2},"
               "{\"worker_id\":7,\"dp_rank\":1,\"potential_prefill_tokens\":48,\"potential_decode_blocks\":4,"
               "\"active_requests\":0},"
               "{\"worker_id\":8,\"dp_rank\":0,\"potential_prefill_tokens\":48,\"potential_decode_blocks\":4,"
               "\"active_requests\":1}]");
    kfx_expect(&sv, "/potential_loads", "{\"model_name\":\"zz\",\"sequence_hashes\":[]}", 404,
               "{\"error\":\"no slot tracker for model=zz tenant=default\"}");
    /* prefill_complete: 200, repeatable, 404 for unknown requests and trackers */
    life(&sv, "/prefill_complete", "m", "r1", 200, OK);
    life(&sv, "/prefill_complete", "m", "r1", 200, OK);
    life(&sv, "/prefill_complete", "m", "ghost", 404, "{\"error\":\"Request ghost not found\"}");
    life(&sv, "/prefill_complete", "zz", "r1", 404, "{\"error\":\"no slot tracker for model=zz tenant=default\"}");
    kfx_expect(&sv, "/potential_loads", "{\"model_name\":\"m\",\"sequence_hashes\":[101]}", 200,
               "[{\"worker_id\":7,\"dp_rank\":0,\"potential_prefill_tokens\":0,\"potential_decode_blocks\":4,"
               "\"active_requests\":2},"
               "{\"worker_id\":7,\"dp_rank\":1,\"potential_prefill_tokens\":0,\"potential_decode_blocks\":1,"
               "\"active_requests\":0},"
               "{\"worker_id\":8,\"dp_rank\":0,\"potential_prefill_tokens\":0,\"potential_decode_blocks\":1,"
               "\"active_requests\":1}]");
    /* free: idempotent while the tracker exists, 404 otherwise */
    life(&sv, "/free", "m", "r1", 200, OK);
    life(&sv, "/free", "m", "r1", 200, OK);
    life(&sv, "/free", "m", "ghost", 200, OK);
    life(&sv, "/free", "zz", "r1", 404, "{\"error\":\"no slot tracker for model=zz tenant=default\"}");
    life(&sv, "/free", "m", "r3", 200, OK);
    life(&sv, "/free", "m", "r-empty", 200, OK);
    kfx_expect_get(&sv, "/loads?model_name=m&tenant_id=default", 200,
                   "[{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":1,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":8,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");

    /* reordering is not repaired: an early free is forgotten, the later add stays */
    life(&sv, "/free", "m", "late", 200, OK);
    add(&sv, "m", "late", 8, 0, "5,6", 10, 201, OK);
    kfx_expect_get(&sv, "/loads?model_name=m", 200,
                   "[{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":1,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":8,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":10,\"active_decode_blocks\":2}]");
    /* unregister drops the worker's active requests at once */
    kfx_expect(&sv, "/unregister", "{\"worker_id\":8,\"model_name\":\"m\"}", 200, OK);
    life(&sv, "/prefill_complete", "m", "late", 404, "{\"error\":\"Request late not found\"}");
    /* arrival order: back-to-back add and free of many requests leave nothing */
    for (int i = 0; i < 100; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "burst-%d", i);
        add(&sv, "m", rid, 7, (uint32_t)(i % 2), "1,2,3", 16, 201, OK);
        life(&sv, "/free", "m", rid, 200, OK);
    }
    kfx_expect_get(&sv, "/loads?tenant_id=default&model_name=m", 200,
                   "[{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":7,\"dp_rank\":1,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_framework_errors_and_h2(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    const char *extra[] = {"--body-limit", "4096", NULL};
    kfx_start_slots(&d, &sv, extra, NULL);
    struct kfx_resp r;
    assert_int_equal(kfx_get(&sv, "/nope", &r), 404);
    assert_string_equal(r.ctype, "application/json");
    assert_non_null(strstr(r.body, "{\"error\":\""));
    kfx_resp_free(&r);
    assert_int_equal(kfx_get(&sv, "/add", &r), 405);
    assert_string_equal(r.body, "{\"error\":\"method not allowed\"}");
    kfx_resp_free(&r);
    assert_int_equal(kfx_http(&sv, KFX_H1, "POST", "/loads", NULL, "", 0, &r), 405);
    assert_string_equal(r.body, "{\"error\":\"method not allowed\"}");
    kfx_resp_free(&r);
    assert_int_equal(kfx_http(&sv, KFX_H1, "DELETE", "/workers", NULL, NULL, 0, &r), 405);
    kfx_resp_free(&r);
    /* a body over the limit */
    size_t big = 8192;
    char *b = malloc(big + 1);
    memset(b, ' ', big);
    b[big] = '\0';
    memcpy(b, "{\"model_name\":\"m\",\"sequence_hashes\":[]}", 38);
    assert_int_equal(kfx_post_json(&sv, "/potential_loads", b, &r), 413);
    assert_non_null(strstr(r.body, "{\"error\":\""));
    kfx_resp_free(&r);
    free(b);
    /* HTTP/2 with prior knowledge serves the same routes */
    const char *hj[] = {"Content-Type: application/json", NULL};
    const char *j = "{\"worker_id\":1,\"model_name\":\"m\",\"block_size\":16,\"dp_start\":0,\"dp_size\":1}";
    assert_int_equal(kfx_http(&sv, KFX_H2C, "POST", "/register", hj, j, strlen(j), &r), 201);
    assert_int_equal(r.version, CURL_HTTP_VERSION_2_0);
    assert_string_equal(r.body, OK);
    kfx_resp_free(&r);
    assert_int_equal(kfx_http(&sv, KFX_H2C, "GET", "/loads", NULL, NULL, 0, &r), 200);
    assert_string_equal(r.body, "[{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":0,"
                                "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    kfx_resp_free(&r);
    /* the slot port does not serve the indexer's routes, nor the indexer port the slot tracker's */
    assert_int_equal(kfx_get(&sv, "/dump", &r), 404);
    kfx_resp_free(&r);
    assert_int_equal(kfx_get(&d, "/loads", &r), 404);
    kfx_resp_free(&r);
    /* the test routes are not mounted without DYN_KV_INDEXER_TEST_ENDPOINTS */
    kfx_expect(&sv, "/test/advance_clock", "{\"seconds\":1}", 404, NULL);
    kfx_expect(&sv, "/metrics", "", 405, "{\"error\":\"method not allowed\"}");
    assert_true(kfx_get_has(&sv, "/metrics", 200, "\nkvidx_slots_workers 1\n"));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_peers(void **state)
{
    (void)state;
    /* replica sync off: the reference's 409, and an empty list */
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, NULL);
    kfx_expect(&sv, "/register_peer", "{\"url\":\"http://127.0.0.1:9\"}", 409, "{\"error\":\"replica sync is disabled\"}");
    kfx_expect(&sv, "/deregister_peer", "{\"url\":\"http://127.0.0.1:9\"}", 409,
               "{\"error\":\"replica sync is disabled\"}");
    kfx_expect_get(&sv, "/peers", 200, "[]");
    kfx_expect(&sv, "/replica/events", "{\"source\":\"1\",\"events\":[]}", 409, "{\"error\":\"replica sync is disabled\"}");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* on: 201 new, 200 known, sorted, 404 unknown, 400 bad or self */
    const char *extra[] = {"--replica-sync-peers", "http://127.0.0.1:9/,http://127.0.0.1:7", "--replica-sync-advertise",
                           "http://me:8091", NULL};
    kfx_start_slots(&d, &sv, extra, NULL);
    kfx_expect_get(&sv, "/peers", 200, "[\"http://127.0.0.1:7\",\"http://127.0.0.1:9\"]");
    kfx_expect(&sv, "/register_peer", "{\"url\":\"http://127.0.0.1:8\"}", 201, OK);
    kfx_expect(&sv, "/register_peer", "{\"url\":\"http://127.0.0.1:8\"}", 200, OK);
    kfx_expect(&sv, "/register_peer", "{\"url\":\"http://127.0.0.1:8/\"}", 200, OK);
    kfx_expect(&sv, "/register_peer", "{\"url\":\"tcp://127.0.0.1:8092\"}", 400,
               "{\"error\":\"peer url must be an http:// or https:// base URL\"}");
    kfx_expect(&sv, "/register_peer", "{\"url\":\"http://me:8091\"}", 400,
               "{\"error\":\"cannot register this replica's own advertised url as a peer\"}");
    kfx_expect(&sv, "/register_peer", "{\"uri\":\"http://x:1\"}", 422, NULL);
    kfx_expect_get(&sv, "/peers", 200, "[\"http://127.0.0.1:7\",\"http://127.0.0.1:8\",\"http://127.0.0.1:9\"]");
    kfx_expect(&sv, "/deregister_peer", "{\"url\":\"http://127.0.0.1:7\"}", 200, OK);
    kfx_expect(&sv, "/deregister_peer", "{\"url\":\"http://127.0.0.1:7\"}", 404, "{\"error\":\"peer not found\"}");
    kfx_expect_get(&sv, "/peers", 200, "[\"http://127.0.0.1:8\",\"http://127.0.0.1:9\"]");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_admin_token(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    const char *extra[] = {"--admin-token", "s3cret", "--replica-sync", NULL};
    kfx_start_slots(&d, &sv, extra, NULL);
    const char *j = "{\"worker_id\":1,\"model_name\":\"m\",\"block_size\":16,\"dp_start\":0,\"dp_size\":1}";
    kfx_expect(&sv, "/register", j, 401, NULL);
    kfx_expect(&sv, "/register_peer", "{\"url\":\"http://x:1\"}", 401, NULL);
    struct kfx_resp r;
    const char *h[] = {"Content-Type: application/json", "Authorization: Bearer s3cret", NULL};
    assert_int_equal(kfx_http(&sv, KFX_H1, "POST", "/register", h, j, strlen(j), &r), 201);
    kfx_resp_free(&r);
    /* lifecycle writes and reads stay open (a router's hot path) */
    add(&sv, "m", "r", 1, 0, "1", 0, 201, OK);
    life(&sv, "/free", "m", "r", 200, OK);
    kfx_expect_get(&sv, "/workers", 200, NULL);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_slot_port_switch(void **state)
{
    (void)state;
    /* --slot-port 0: no slot port; /route still answers (no tracker) */
    struct kfx_daemon d;
    const char *off[] = {"--slot-port", "0", NULL};
    kfx_start(&d, off, NULL);
    kfx_expect(&d, "/route", "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4]}", 404,
               "{\"error\":\"no slot tracker for model=m tenant=default\"}");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* an explicit port that is taken is fatal (exit 1) */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    char port[16];
    snprintf(port, sizeof port, "%u", ntohs(a.sin_port));
    const char *taken[] = {"--host", "127.0.0.1", "--slot-port", port, NULL};
    assert_int_equal(kfx_start_rc(&d, taken, NULL), 1);
    unlink(d.logfile);
    close(fd);
    /* bad values */
    const char *bad[] = {"--slot-port", "x", NULL};
    assert_int_equal(kfx_start_rc(&d, bad, NULL), 2);
    unlink(d.logfile);
    const char *bad2[] = {"--replica-sync-peers", "tcp://a:1", NULL};
    assert_int_equal(kfx_start_rc(&d, bad2, NULL), 1);
    unlink(d.logfile);
}

/* ---- issue 18: bounded models and dp sizes, paged /loads ---------------------------------------------- */

struct hdr_cap {
    char cursor[512]; /* X-Kvidx-Next-Cursor, "" when absent */
};

static size_t on_hdr(char *p, size_t sz, size_t nm, void *ud)
{
    struct hdr_cap *c = ud;
    size_t n = sz * nm;
    static const char name[] = "x-kvidx-next-cursor:";
    if (n > sizeof(name) - 1 && strncasecmp(p, name, sizeof(name) - 1) == 0) {
        size_t i = sizeof(name) - 1, e = n;
        while (i < e && p[i] == ' ')
            i++;
        while (e > i && (p[e - 1] == '\r' || p[e - 1] == '\n' || p[e - 1] == ' '))
            e--;
        if (e - i >= sizeof(c->cursor))
            fail_msg("cursor too long");
        memcpy(c->cursor, p + i, e - i);
        c->cursor[e - i] = '\0';
    }
    return n;
}

/* GET path; the body in r, the next-page cursor in cursor ("" when none). */
static long get_page(const struct kfx_daemon *d, const char *path, struct kfx_resp *r, char *cursor, size_t cap)
{
    struct hdr_cap c = {{0}};
    memset(r, 0, sizeof *r);
    r->body = calloc(1, 1);
    CURL *h = curl_easy_init();
    char url[1024];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", d->port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kfx_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_hdr);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &c);
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(h);
    snprintf(cursor, cap, "%s", c.cursor);
    return r->status;
}

/* Whether the daemon's log holds `needle` (read while it runs: kfx_stop removes the file). */
static bool log_has(const struct kfx_daemon *d, const char *needle)
{
    FILE *f = fopen(d->logfile, "r");
    if (f == NULL)
        return false;
    char line[2048];
    bool hit = false;
    while (!hit && fgets(line, sizeof line, f))
        hit = strstr(line, needle) != NULL;
    fclose(f);
    return hit;
}

static size_t count_of(const char *body, const char *needle)
{
    size_t n = 0;
    for (const char *p = body; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Follow the cursors of `base` (a /loads or /workers path with a query string, possibly "?", and no cursor),
 * from the first page or, with `from`, from that cursor on, checking each answer's size; @return the entries
 * (ranks or workers) seen; every page but the last holds `page` of them. `bodies`: NULL, or receives every
 * page's body, concatenated (malloc'd; the caller frees it). */
static size_t walk_pages_of(const struct kfx_daemon *sv, const char *base, const char *from, size_t page,
                            size_t *pages, char **bodies)
{
    char path[1024], cursor[512] = "";
    snprintf(cursor, sizeof cursor, "%s", from != NULL ? from : "");
    const char *entry = strncmp(base, "/workers", 8) == 0 ? "\"dp_start\":" : "\"dp_rank\":";
    size_t total = 0, blen = 0;
    *pages = 0;
    if (bodies != NULL)
        *bodies = calloc(1, 1);
    for (;;) {
        struct kfx_resp r;
        if (cursor[0] == '\0')
            snprintf(path, sizeof path, "%s", base);
        else
            snprintf(path, sizeof path, "%s%scursor=%s", base, strchr(base, '?') ? "&" : "?", cursor);
        assert_int_equal(get_page(sv, path, &r, cursor, sizeof cursor), 200);
        size_t n = count_of(r.body, entry);
        if (bodies != NULL) {
            size_t l = strlen(r.body);
            *bodies = realloc(*bodies, blen + l + 1);
            memcpy(*bodies + blen, r.body, l + 1);
            blen += l;
        }
        kfx_resp_free(&r);
        total += n;
        (*pages)++;
        if (cursor[0] == '\0')
            return total;
        assert_int_equal(n, page); /* only the last page is short */
        assert_true(*pages < 10000);
    }
}

static size_t walk_pages(const struct kfx_daemon *sv, const char *base, size_t page, size_t *pages)
{
    return walk_pages_of(sv, base, NULL, page, pages, NULL);
}

/* GET @p path (a cursor past the end of its listing) answers 200 [] with no next cursor. */
static void expect_past_end(const struct kfx_daemon *sv, const char *path)
{
    struct kfx_resp r;
    char cursor[512];
    assert_int_equal(get_page(sv, path, &r, cursor, sizeof cursor), 200);
    assert_string_equal(r.body, "[]");
    assert_string_equal(cursor, "");
    kfx_resp_free(&r);
}

/* The 400s of @p route's paging parameters, in this order: ?limit=0, ?limit=x,
 * then ?cursor= each of @p bad_cursors (NULL-terminated). */
static void expect_bad_paging(const struct kfx_daemon *sv, const char *route, const char *const *bad_cursors)
{
    static const char bad_limit[] = "{\"error\":\"invalid query parameter limit: expected an integer >= 1\"}";
    char path[256], bad_cursor[256];
    snprintf(path, sizeof path, "%s?limit=0", route);
    kfx_expect_get(sv, path, 400, bad_limit);
    snprintf(path, sizeof path, "%s?limit=x", route);
    kfx_expect_get(sv, path, 400, bad_limit);
    snprintf(bad_cursor, sizeof bad_cursor,
             "{\"error\":\"invalid query parameter cursor: expected the X-Kvidx-Next-Cursor value "
             "of a previous %s answer\"}",
             route);
    for (size_t i = 0; bad_cursors[i] != NULL; i++) {
        snprintf(path, sizeof path, "%s?cursor=%s", route, bad_cursors[i]);
        kfx_expect_get(sv, path, 400, bad_cursor);
    }
}

/* The defaults: 1,024 models, dp_size 1,024, 16,384 ranks per /loads answer. */
static void test_limits_defaults(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, NULL);
    reg(&sv, 1, "big", NULL, 16, 0, 1025, 400,
        "{\"error\":\"dp_size 1025 exceeds the limit 1024 (--slot-max-dp-size)\"}");
    reg(&sv, 1, "big", NULL, 16, 0, 65536, 400,
        "{\"error\":\"dp_size 65536 exceeds the limit 1024 (--slot-max-dp-size)\"}");
    kfx_expect_get(&sv, "/workers", 200, "[]");
    /* 17 workers x 1,024 ranks: 17,408 ranks, more than one answer holds */
    for (uint32_t w = 0; w < 17; w++)
        reg(&sv, w, "big", NULL, 16, 0, 1024, 201, OK);
    struct kfx_resp r;
    char cursor[512];
    assert_int_equal(get_page(&sv, "/loads", &r, cursor, sizeof cursor), 200);
    assert_int_equal(count_of(r.body, "\"dp_rank\":"), 16384);
    assert_true(r.len < 4u << 20);
    assert_true(cursor[0] != '\0');
    kfx_resp_free(&r);
    size_t pages;
    assert_int_equal(walk_pages(&sv, "/loads", 16384, &pages), 17408);
    assert_int_equal(pages, 2);
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_loads_paged_total"), 2);
    /* 1,024 trackers may exist ("big" is one); the next /register that would create one is 429 */
    char m[32];
    for (int i = 1; i < 1024; i++) {
        snprintf(m, sizeof m, "m%04d", i);
        reg(&sv, 1, m, NULL, 16, 0, 1, 201, OK);
    }
    reg(&sv, 1, "one-more", "t", 16, 0, 1, 429,
        "{\"error\":\"too many models: 1024 slot trackers (model x tenant) exist, the most --slot-max-models "
        "allows; model=one-more tenant=t not created\"}");
    reg(&sv, 99, "m0001", NULL, 16, 0, 1, 201, OK); /* an existing tracker still takes workers */
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_register_refused_models_total"), 1);
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_register_refused_ranks_total"), 2);
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_trackers"), 1024);
    assert_true(log_has(&d, "slot tracker: /register of worker 1 refused: too many models"));
    assert_true(log_has(&d, "slot tracker: /register of worker 1 refused: dp_size 1025 exceeds the limit 1024"));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* The flags, the paging parameters and their errors. */
static void test_limits_flags_and_paging(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    const char *extra[] = {"--slot-max-models", "3", "--slot-max-dp-size", "8", "--slot-loads-page", "5", NULL};
    kfx_start_slots(&d, &sv, extra, NULL);
    reg(&sv, 1, "m0", NULL, 16, 0, 2, 201, OK);
    /* a small deployment: one answer, no cursor, the reference's body */
    struct kfx_resp r;
    char cursor[512];
    assert_int_equal(get_page(&sv, "/loads", &r, cursor, sizeof cursor), 200);
    assert_string_equal(r.body,
                        "[{\"model_name\":\"m0\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":0,"
                        "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                        "{\"model_name\":\"m0\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":1,"
                        "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    assert_string_equal(cursor, "");
    kfx_resp_free(&r);
    reg(&sv, 1, "m1", NULL, 16, 0, 2, 201, OK);
    reg(&sv, 1, "m2", NULL, 16, 0, 9, 400, "{\"error\":\"dp_size 9 exceeds the limit 8 (--slot-max-dp-size)\"}");
    reg(&sv, 1, "m2", NULL, 16, 0, 2, 201, OK);
    reg(&sv, 2, "m0", NULL, 16, 0, 8, 201, OK);
    reg(&sv, 1, "m3", NULL, 16, 0, 1, 429,
        "{\"error\":\"too many models: 3 slot trackers (model x tenant) exist, the most --slot-max-models "
        "allows; model=m3 tenant=default not created\"}");
    /* 14 ranks (m0: 10, m1: 2, m2: 2) in pages of 5 */
    size_t pages;
    assert_int_equal(walk_pages(&sv, "/loads", 5, &pages), 14);
    assert_int_equal(pages, 3);
    /* the first page, and the second one resuming exactly after it */
    assert_int_equal(get_page(&sv, "/loads?limit=2", &r, cursor, sizeof cursor), 200);
    assert_string_equal(r.body,
                        "[{\"model_name\":\"m0\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":0,"
                        "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                        "{\"model_name\":\"m0\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":1,"
                        "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    assert_string_equal(cursor, "6d30.64656661756c74.1.1");
    kfx_resp_free(&r);
    assert_int_equal(get_page(&sv, "/loads?limit=1&cursor=6d30.64656661756c74.1.1", &r, cursor, sizeof cursor),
                     200);
    assert_string_equal(r.body, "[{\"model_name\":\"m0\",\"tenant_id\":\"default\",\"worker_id\":2,\"dp_rank\":0,"
                                "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    kfx_resp_free(&r);
    /* limit is lowered to the page; filters page too */
    assert_int_equal(walk_pages(&sv, "/loads?limit=100", 5, &pages), 14);
    assert_int_equal(walk_pages(&sv, "/loads?model_name=m0&limit=4", 4, &pages), 10);
    assert_int_equal(pages, 3);
    assert_int_equal(walk_pages(&sv, "/loads?tenant_id=default&limit=3", 3, &pages), 14);
    assert_int_equal(pages, 5);
    /* the last page carries no cursor; a cursor past the end answers [] */
    expect_past_end(&sv, "/loads?cursor=6d39.00.0.0");
    expect_bad_paging(&sv, "/loads",
                      (const char *const[]){"zz", "6d3.00.1.1", "6d30.00.1.4294967296", "6d30.00.1", NULL});
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_register_refused_models_total"), 1);
    assert_int_equal(kfx_metric(&sv, "kvidx_slots_register_refused_ranks_total"), 1);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    /* bad flag values */
    const char *bad[] = {"--slot-max-models", "0", NULL};
    assert_int_equal(kfx_start_rc(&d, bad, NULL), 2);
    unlink(d.logfile);
    const char *bad2[] = {"--slot-loads-page", "x", NULL};
    assert_int_equal(kfx_start_rc(&d, bad2, NULL), 2);
    unlink(d.logfile);
}

/* Issue 18, /workers: a worker as its answer spells it (the prefix up to block_size). */
static void worker_entry(char *out, size_t cap, uint64_t w, const char *model, const char *tenant)
{
    snprintf(out, cap, "{\"worker_id\":%llu,\"model_name\":\"%s\",\"tenant_id\":\"%s\",\"block_size\":",
             (unsigned long long)w, model, tenant);
}

/* GET /workers pages like /loads (the same --slot-loads-page bound, ?limit=, ?cursor= and header): every
 * worker exactly once, no header on the last page, cursors that survive writes between pages, 400s. */
static void test_workers_paging(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    const char *extra[] = {"--slot-loads-page", "5", NULL};
    kfx_start_slots(&d, &sv, extra, NULL);
    /* a small deployment: one answer, no cursor, the reference's body */
    reg(&sv, 1, "m0", NULL, 16, 0, 2, 201, OK);
    struct kfx_resp r;
    char cursor[512];
    assert_int_equal(get_page(&sv, "/workers", &r, cursor, sizeof cursor), 200);
    assert_string_equal(r.body, "[{\"worker_id\":1,\"model_name\":\"m0\",\"tenant_id\":\"default\",\"block_size\":16,"
                                "\"dp_start\":0,\"dp_size\":2}]");
    assert_string_equal(cursor, "");
    kfx_resp_free(&r);
    /* 23 workers over 6 trackers (3 models x 2 tenants), ids out of order */
    static const char *const models[] = {"m0", "m1", "m2"}, *const tenants[] = {"default", "t"};
    enum { N = 23 };
    uint64_t ids[N];
    for (unsigned i = 0; i < N; i++) {
        ids[i] = i == 0 ? 1 : 1000 - i * 37;
        if (i > 0)
            reg(&sv, ids[i], models[i % 3], tenants[i % 2], 16, i, 1 + i % 3, 201, OK);
    }
    /* i == 0 is worker 1 of (m0, default), registered above */
    size_t pages;
    char *all = NULL, e[256];
    const char *bases[] = {"/workers", "/workers?limit=100", "/workers?limit=3", "/workers?limit=1"};
    const size_t sizes[] = {5, 5, 3, 1}, n_pages[] = {5, 5, 8, 23};
    for (size_t b = 0; b < 4; b++) {
        assert_int_equal(walk_pages_of(&sv, bases[b], NULL, sizes[b], &pages, &all), N);
        assert_int_equal(pages, n_pages[b]);
        for (unsigned i = 0; i < N; i++) { /* every worker exactly once */
            worker_entry(e, sizeof e, ids[i], models[i % 3], tenants[i % 2]);
            assert_int_equal(count_of(all, e), 1);
        }
        free(all);
    }
    /* filters page too: (m1, *) holds the 8 workers with i % 3 == 1; (*, t) the 11 with i odd */
    assert_int_equal(walk_pages(&sv, "/workers?model_name=m1", 5, &pages), 8);
    assert_int_equal(pages, 2);
    assert_int_equal(walk_pages(&sv, "/workers?tenant_id=t&limit=4", 4, &pages), 11);
    assert_int_equal(pages, 3);
    assert_int_equal(walk_pages(&sv, "/workers?model_name=m2&tenant_id=default&limit=2", 2, &pages), 4);
    assert_int_equal(pages, 2);
    /* the first page, and the second one resuming exactly after it: (m0, default) holds 1, 334, 556, 778 */
    assert_int_equal(get_page(&sv, "/workers?limit=2", &r, cursor, sizeof cursor), 200);
    assert_string_equal(r.body, "[{\"worker_id\":1,\"model_name\":\"m0\",\"tenant_id\":\"default\",\"block_size\":16,"
                                "\"dp_start\":0,\"dp_size\":2},"
                                "{\"worker_id\":334,\"model_name\":\"m0\",\"tenant_id\":\"default\",\"block_size\":16,"
                                "\"dp_start\":18,\"dp_size\":1}]");
    assert_string_equal(cursor, "6d30.64656661756c74.334");
    kfx_resp_free(&r);
    assert_int_equal(get_page(&sv, "/workers?limit=1&cursor=6d30.64656661756c74.334", &r, cursor, sizeof cursor),
                     200);
    assert_string_equal(r.body, "[{\"worker_id\":556,\"model_name\":\"m0\",\"tenant_id\":\"default\",\"block_size\":16,"
                                "\"dp_start\":12,\"dp_size\":1}]");
    assert_string_equal(cursor, "6d30.64656661756c74.556");
    kfx_resp_free(&r);
    /* writes between pages: the cursor's own worker (556) and one ahead of it (778) removed, one registered
     * behind (2) and one ahead (999); every other worker after the cursor is listed exactly once */
    kfx_expect(&sv, "/unregister", "{\"worker_id\":556,\"model_name\":\"m0\"}", 200, OK);
    kfx_expect(&sv, "/unregister", "{\"worker_id\":778,\"model_name\":\"m0\"}", 200, OK);
    reg(&sv, 2, "m0", NULL, 16, 0, 1, 201, OK);
    reg(&sv, 999, "m0", NULL, 16, 0, 1, 201, OK);
    assert_int_equal(walk_pages_of(&sv, "/workers", "6d30.64656661756c74.556", 5, &pages, &all), 1 + 19);
    assert_int_equal(pages, 4);
    worker_entry(e, sizeof e, 999, "m0", "default");
    assert_int_equal(count_of(all, e), 1);
    worker_entry(e, sizeof e, 2, "m0", "default");
    assert_int_equal(count_of(all, e), 0);
    for (unsigned i = 0; i < N; i++) { /* (m0, default)'s were before the cursor or removed */
        worker_entry(e, sizeof e, ids[i], models[i % 3], tenants[i % 2]);
        assert_int_equal(count_of(all, e), i % 6 == 0 ? 0 : 1);
    }
    free(all);
    /* the last page carries no cursor; a cursor past the end answers [] */
    expect_past_end(&sv, "/workers?cursor=6d39.00.0");
    assert_true(kfx_metric(&sv, "kvidx_slots_workers_paged_total") > 0);
    /* errors: the same 400s as /loads; a /loads cursor is not a /workers cursor */
    expect_bad_paging(&sv, "/workers",
                      (const char *const[]){"zz", "6d3.00.1", "6d30.00", "6d30.00.18446744073709551616",
                                            "6d30.64656661756c74.1.1", NULL});
    kfx_expect_get(&sv, "/loads?cursor=6d30.64656661756c74.1", 400,
                   "{\"error\":\"invalid query parameter cursor: expected the X-Kvidx-Next-Cursor value "
                   "of a previous /loads answer\"}");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_topology, teardown),
        cmocka_unit_test_teardown(test_lifecycle_and_loads, teardown),
        cmocka_unit_test_teardown(test_framework_errors_and_h2, teardown),
        cmocka_unit_test_teardown(test_peers, teardown),
        cmocka_unit_test_teardown(test_admin_token, teardown),
        cmocka_unit_test_teardown(test_slot_port_switch, teardown),
        cmocka_unit_test_teardown(test_limits_defaults, teardown),
        cmocka_unit_test_teardown(test_limits_flags_and_paging, teardown),
        cmocka_unit_test_teardown(test_workers_paging, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
