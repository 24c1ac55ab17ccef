/* ctest-labels: integration */
/*
 * P2P recovery (http-api.md §1.16) between two real daemons: A indexes live
 * events (two namespaces, a cpu tier, a Conductor instance); B starts with
 * --peers listing an unreachable peer, a peer answering 404, then A: /ready
 * says recovering_from_peer meanwhile, B falls through to A, applies A's
 * /dump, and answers queries exactly as A does; their dumps hold the same
 * events. B then subscribes to the same publisher and both converge on new
 * live events. A daemon whose only peer is unreachable starts empty with
 * last_result no_reachable_peers. Peers whose dumps fail part-way are rolled
 * back before the next peer is tried.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "kvidxd_fixture.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * The dump's events as sorted lines "<namespace> <event without event_id>"
 * (the order of events and their ids depend on partitions and dense ids).
 */
static char *dump_canon(const struct kfx_daemon *d)
{
    struct kfx_resp r;
    assert_int_equal(kfx_get(d, "/dump", &r), 200);
    /* the watermarks extension (a daemon's own listeners) is not block state: cut it out */
    for (char *w; (w = strstr(r.body, ",\"watermarks\":[")) != NULL;) {
        char *e = strchr(w, ']');
        assert_non_null(e);
        memmove(w, e + 1, strlen(e + 1) + 1);
    }
    char **lines = NULL;
    size_t n = 0;
    char ns[256] = "";
    for (char *p = r.body; *p;) {
        char *ev = strstr(p, "{\"worker_id\":");
        char *nk = strstr(p, "\":{\"block_size\":");
        if (nk != NULL && (ev == NULL || nk < ev)) {
            char *start = nk;
            while (start > r.body && start[-1] != '"')
                start--;
            snprintf(ns, sizeof ns, "%.*s", (int)(nk - start), start);
            p = nk + 3;
            continue;
        }
        if (ev == NULL)
            break;
        /* the event object ends where the next one starts or the array closes */
        char *next = strstr(ev + 1, "{\"worker_id\":");
        char *end = strstr(ev, "}]}");
        char *stop = next && (!end || next < end) ? next - 1 : end + 1;
        char *line = malloc((size_t)(stop - ev) + strlen(ns) + 2);
        size_t o = (size_t)sprintf(line, "%s ", ns);
        for (char *q = ev; q < stop; q++) {
            if (strncmp(q, "\"event_id\":", 11) == 0) {
                q += 11;
                while (*q >= '0' && *q <= '9')
                    q++;
                q++; /* the comma */
            }
            line[o++] = *q;
        }
        line[o] = '\0';
        lines = realloc(lines, (n + 1) * sizeof *lines);
        lines[n++] = line;
        p = stop;
    }
    qsort(lines, n, sizeof *lines, cmp_str);
    size_t total = 1;
    for (size_t i = 0; i < n; i++)
        total += strlen(lines[i]) + 1;
    char *out = malloc(total);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strcat(out, lines[i]);
        strcat(out, "\n");
        free(lines[i]);
    }
    free(lines);
    kfx_resp_free(&r);
    return out;
}

static void reg(struct kfx_daemon *d, uint64_t id, const char *model, const char *tenant, struct kvidx_pub *p)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"model_name\":\"%s\",\"tenant_id\":\"%s\",\"block_size\":%d,\"endpoint\":\"%s\","
             "\"replay_endpoint\":\"%s\"}",
             (unsigned long long)id, model, tenant, KFX_BS, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
    kfx_expect(d, "/register", j, 201, NULL);
}

static char *tenant_query(const char *model, const char *tenant, uint32_t c, uint32_t n)
{
    char *q = kfx_query_json(model, c, n);
    char *s = malloc(strlen(q) + 64);
    sprintf(s, "{\"tenant_id\":\"%s\",%s", tenant, q + 1);
    free(q);
    return s;
}

static void same_answer(struct kfx_daemon *a, struct kfx_daemon *b, const char *path, const char *q)
{
    struct kfx_resp ra, rb;
    assert_int_equal(kfx_post_json(a, path, q, &ra), 200);
    assert_int_equal(kfx_post_json(b, path, q, &rb), 200);
    if (strcmp(ra.body, rb.body) != 0)
        fail_msg("%s differs:\nA %s\nB %s", path, ra.body, rb.body);
    kfx_resp_free(&ra);
    kfx_resp_free(&rb);
}

static void test_two_replicas(void **state)
{
    (void)state;
    struct kfx_daemon a, b;
    kfx_start(&a, NULL, NULL);
    struct kvidx_pub *p1 = kfx_pub(0), *p2 = kfx_pub(0), *pc = kfx_pub(0);
    struct kvidx_pub *pubs[3] = {p1, p2, pc};
    reg(&a, 1, "m", "default", p1);
    reg(&a, 2, "m", "t2", p2);
    char j[512];
    snprintf(j, sizeof j,
             "{\"type\":\"SGLang\",\"modelname\":\"cm\",\"instance_id\":\"node-a\",\"block_size\":%d,\"dp_rank\":0,"
             "\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\"}",
             KFX_BS, kvidx_pub_endpoint(pc), kvidx_pub_replay_endpoint(pc));
    kfx_expect(&a, "/register", j, 200, NULL);
    kfx_publish(p1, 3, 0, 12, NULL);
    kfx_publish(p1, 3, 12, 14, "CPU");
    kfx_publish(p2, 4, 0, 5, NULL);
    kfx_publish(pc, 5, 0, 3, NULL);
    char *q1 = kfx_query_json("m", 3, 14), *q2 = tenant_query("m", "t2", 4, 5);
    kfx_until_query(&a, "/query", q1, "\"1\":{\"longest_matched\":56,\"gpu\":48,", pubs, 3);
    kfx_until_query(&a, "/query", q2, "\"scores\":{\"2\":{\"0\":20}}", pubs, 3);
    char *dq = kfx_query_json("cm", 5, 3);
    char cq[1024];
    snprintf(cq, sizeof cq, "{\"model\":\"cm\",\"block_size\":%d,%s", KFX_BS, strstr(dq, "\"token_ids\""));
    kfx_until_query(&a, "/query", cq, "\"node-a\":{\"longest_matched\":12,", pubs, 3);

    /* A's dump names the last batch of each stream in its blocks (two batches of p1, one of the others) */
    struct kfx_resp dr;
    assert_int_equal(kfx_get(&a, "/dump", &dr), 200);
    assert_non_null(strstr(dr.body, "}]}}}}],\"watermarks\":[{\"worker_id\":1,\"dp_rank\":0,\"seq\":1}]}"));
    assert_non_null(strstr(dr.body, "\"watermarks\":[{\"worker_id\":2,\"dp_rank\":0,\"seq\":0}]"));
    assert_non_null(strstr(dr.body, "\"watermarks\":[{\"worker_id\":\"node-a\",\"dp_rank\":0,\"seq\":0}]"));
    kfx_resp_free(&dr);

    char peers[256];
    snprintf(peers, sizeof peers, "http://127.0.0.1:1,http://127.0.0.1:%u/nope/,http://127.0.0.1:%u", a.port, a.port);
    const char *args[] = {"--peers", peers, "--recovery-delay-ms", "1500", "--recovery-timeout-ms", "5000", NULL};
    kfx_start(&b, args, NULL);
    kfx_expect_get(&b, "/ready", 503, "{\"ready\":false,\"reason\":\"recovering_from_peer\"}");
    if (!KFX_WAIT(kfx_get_has(&b, "/status", 200, "\"last_result\":\"succeeded\""), KFX_WAIT_MS)) {
        kfx_dump_log(&b);
        fail_msg("B did not recover");
    }
    assert_true(KFX_WAIT(kfx_get_has(&b, "/ready", 200, "{\"ready\":true,\"reason\":\"ready\"}"), KFX_WAIT_MS));
    assert_true(kfx_get_has(&b, "/status", 200,
                            "\"recovery\":{\"enabled\":true,\"in_progress\":false,\"last_result\":\"succeeded\"}"));
    struct kfx_resp r;
    assert_int_equal(kfx_get(&b, "/peers", &r), 200);
    char pa[64];
    snprintf(pa, sizeof pa, "\"http://127.0.0.1:%u\"", a.port);
    assert_non_null(strstr(r.body, pa));
    assert_non_null(strstr(r.body, "\"http://127.0.0.1:1\""));
    kfx_resp_free(&r);
    assert_true(kfx_metric(&b, "kvidx_recovery_attempts_total") == 3);
    assert_true(kfx_metric(&b, "kvidx_recovery_blocks") == 12 + 2 + 5 + 3);

    char *da = dump_canon(&a), *db = dump_canon(&b);
    if (strcmp(da, db) != 0)
        fail_msg("dumps differ:\nA\n%s\nB\n%s", da, db);
    size_t lines = 0;
    for (const char *c = da; *c; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 12 + 2 + 5 + 3);
    assert_non_null(strstr(da, "cm:default {\"worker_id\":\"node-a\""));
    assert_non_null(strstr(da, "\"storage_tier\":\"host_pinned\""));
    free(da);
    free(db);
    same_answer(&a, &b, "/query", q1);
    same_answer(&a, &b, "/query", q2);
    /* recovered instances have no listener: not in /workers */
    kfx_expect_get(&b, "/workers", 200, "[]");

    /* B subscribes to instance 1's publisher too; both converge on new live events */
    reg(&b, 1, "m", "default", p1);
    kfx_unpublish(p1, 3, 8, 12);
    kfx_publish(p1, 6, 0, 4, NULL);
    char *q6 = kfx_query_json("m", 6, 4);
    kfx_until_query(&a, "/query", q6, "\"scores\":{\"1\":{\"0\":16}}", &p1, 1);
    kfx_until_query(&b, "/query", q6, "\"scores\":{\"1\":{\"0\":16}}", &p1, 1);
    kfx_until_query(&b, "/query", q1, "\"scores\":{\"1\":{\"0\":32}}", &p1, 1);
    same_answer(&a, &b, "/query", q1);
    da = dump_canon(&a);
    db = dump_canon(&b);
    if (strcmp(da, db) != 0)
        fail_msg("dumps differ after live events:\nA\n%s\nB\n%s", da, db);
    free(da);
    free(db);
    free(q1);
    free(q2);
    free(q6);
    free(dq);
    kvidx_pub_destroy(p1);
    kvidx_pub_destroy(p2);
    kvidx_pub_destroy(pc);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

static void test_no_reachable_peer(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--peers", "http://127.0.0.1:1", "--recovery-delay-ms", "0", "--recovery-timeout-ms",
                          "2000", NULL};
    kfx_start(&d, args, NULL);
    assert_true(KFX_WAIT(kfx_get_has(&d, "/status", 200,
                                     "\"recovery\":{\"enabled\":true,\"in_progress\":false,"
                                     "\"last_result\":\"no_reachable_peers\"}"),
                         KFX_WAIT_MS));
    assert_true(KFX_WAIT(kfx_get_has(&d, "/ready", 200, "{\"ready\":true,\"reason\":\"ready\"}"), KFX_WAIT_MS));
    kfx_expect_get(&d, "/dump", 200, "{}");
    kfx_expect_get(&d, "/peers", 200, "[\"http://127.0.0.1:1\"]");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* A one-shot HTTP server answering every connection with a fixed response. */
struct fake_peer {
    int fd;
    uint16_t port;
    const char *response;
    pthread_t thr;
    int served;
};

static void *fake_peer_main(void *arg)
{
    struct fake_peer *f = arg;
    for (;;) {
        int c = accept(f->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char req[4096];
        ssize_t n = 0, got;
        while (n < (ssize_t)sizeof req - 1 && (got = read(c, req + n, sizeof req - 1 - (size_t)n)) > 0) {
            n += got;
            req[n] = '\0';
            if (strstr(req, "\r\n\r\n") != NULL)
                break;
        }
        ssize_t w = write(c, f->response, strlen(f->response));
        (void)w;
        close(c);
        __atomic_add_fetch(&f->served, 1, __ATOMIC_RELAXED);
    }
}

static void fake_peer_start(struct fake_peer *f, const char *response)
{
    memset(f, 0, sizeof *f);
    f->response = response;
    f->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(f->fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f->fd, 8), 0);
    socklen_t len = sizeof a;
    getsockname(f->fd, (struct sockaddr *)&a, &len);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->thr, NULL, fake_peer_main, f), 0);
}

static void fake_peer_stop(struct fake_peer *f)
{
    shutdown(f->fd, SHUT_RDWR);
    close(f->fd);
    pthread_join(f->thr, NULL);
}

/*
 * Peers whose dumps fail part-way (an "error" namespace after a valid one; a
 * body cut short) are rolled back: nothing they carried survives, and the
 * next peer's state is applied alone.
 */
static void test_bad_peers_rolled_back(void **state)
{
    (void)state;
    struct kfx_daemon a, b;
    kfx_start(&a, NULL, NULL);
    struct kvidx_pub *p = kfx_pub(0);
    reg(&a, 1, "m", "default", p);
    kfx_publish(p, 7, 0, 3, NULL);
    char *q = kfx_query_json("m", 7, 3);
    kfx_until_query(&a, "/query", q, "\"scores\":{\"1\":{\"0\":12}}", &p, 1);

    /* valid events of instance 9 in two namespaces, then a namespace that failed */
    static const char ev[] =
        "{\"worker_id\":9,\"storage_tier\":\"device\",\"event\":{\"event_id\":0,\"dp_rank\":0,\"data\":{\"stored\":"
        "{\"parent_hash\":null,\"start_position\":0,\"blocks\":[{\"block_hash\":1,\"tokens_hash\":2,"
        "\"mm_extra_info\":null}]}}}}";
    static char body1[2048], resp1[4096], resp2[4096];
    snprintf(body1, sizeof body1,
             "{\"m:default\":{\"block_size\":4,\"events\":[%s]},\"bad:default\":{\"block_size\":4,\"events\":[%s]},"
             "\"m:t9\":{\"error\":\"dump failed\"}}",
             ev, ev);
    snprintf(resp1, sizeof resp1,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
             strlen(body1), body1);
    /* a body cut short: Content-Length promises more than is sent */
    snprintf(resp2, sizeof resp2,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n"
             "{\"cut:default\":{\"block_size\":4,\"events\":[%s",
             strlen(body1), ev);
    struct fake_peer f1, f2;
    fake_peer_start(&f1, resp1);
    fake_peer_start(&f2, resp2);
    char peers[256];
    snprintf(peers, sizeof peers, "http://127.0.0.1:%u,http://127.0.0.1:%u,http://127.0.0.1:%u", f1.port, f2.port,
             a.port);
    const char *args[] = {"--peers", peers, "--recovery-delay-ms", "0", NULL};
    kfx_start(&b, args, NULL);
    assert_true(KFX_WAIT(kfx_get_has(&b, "/status", 200, "\"last_result\":\"succeeded\""), KFX_WAIT_MS));
    assert_int_equal(__atomic_load_n(&f1.served, __ATOMIC_RELAXED), 1);
    assert_int_equal(__atomic_load_n(&f2.served, __ATOMIC_RELAXED), 1);
    /* only A's state: no namespace of the failed peers, no instance 9 */
    char *da = dump_canon(&a), *db = dump_canon(&b);
    if (strcmp(da, db) != 0)
        fail_msg("dumps differ:\nA\n%s\nB\n%s", da, db);
    struct kfx_resp r;
    assert_int_equal(kfx_get(&b, "/dump", &r), 200);
    if (strstr(r.body, "bad:default") || strstr(r.body, "cut:default") || strstr(r.body, "\"worker_id\":9"))
        fail_msg("failed peers left state behind: %s", r.body);
    kfx_resp_free(&r);
    same_answer(&a, &b, "/query", q);
    fake_peer_stop(&f1);
    fake_peer_stop(&f2);
    free(da);
    free(db);
    free(q);
    kvidx_pub_destroy(p);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_two_replicas, teardown),
        cmocka_unit_test_teardown(test_no_reachable_peer, teardown),
        cmocka_unit_test_teardown(test_bad_peers_rolled_back, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
