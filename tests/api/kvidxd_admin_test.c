/* ctest-labels: integration */
/*
 * Protected mode (issue 18, item 11): kvidxd listening beyond loopback with
 * no admin token accepts topology-changing routes (/register, /unregister,
 * peers, listener control) only from loopback clients; others get a 403 JSON
 * error naming --admin-token and --allow-remote-admin. Queries and probes
 * stay open. The non-loopback client is this machine's own non-loopback
 * address (getifaddrs); without one the remote half is skipped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "kvidxd_fixture.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* This machine's first non-loopback IPv4 address, or false. */
static bool local_remote_addr(char *out, size_t cap)
{
    struct ifaddrs *ifs, *i;
    bool found = false;
    if (getifaddrs(&ifs) != 0)
        return false;
    for (i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        const struct in_addr *a = &((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if ((ntohl(a->s_addr) >> 24) == 127)
            continue;
        found = inet_ntop(AF_INET, a, out, (socklen_t)cap) != NULL;
    }
    freeifaddrs(ifs);
    return found;
}

/* One HTTP/1.1 request to host:port; the status (0 on a transport error). */
static long http_to(const char *host, uint16_t port, const char *method, const char *path, const char *auth,
                    const char *json, struct kfx_resp *r)
{
    memset(r, 0, sizeof *r);
    r->body = calloc(1, 1);
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://%s:%u%s", host, port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    struct curl_slist *sl = curl_slist_append(NULL, "Content-Type: application/json");
    sl = curl_slist_append(sl, "Expect:");
    if (auth != NULL)
        sl = curl_slist_append(sl, auth);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, sl);
    if (json != NULL) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(json));
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kfx_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(sl);
    curl_easy_cleanup(h);
    return r->status;
}

static void expect_to(const char *host, uint16_t port, const char *method, const char *path, const char *auth,
                      const char *json, long status, const char *needle)
{
    struct kfx_resp r;
    long s = http_to(host, port, method, path, auth, json, &r);
    if (s != status || (needle != NULL && strstr(r.body, needle) == NULL))
        fail_msg("%s %s from %s: got %ld %s, want %ld with %s", method, path, host, s, r.body, status,
                 needle ? needle : "(any body)");
    kfx_resp_free(&r);
}

#define REG(id) "{\"instance_id\":" #id ",\"model_name\":\"m\",\"block_size\":4,\"endpoint\":\"tcp://127.0.0.1:1\"}"
#define UNREG(id) "{\"instance_id\":" #id ",\"model_name\":\"m\"}"

static void test_protected_mode(void **state)
{
    (void)state;
    char remote[64];
    bool have_remote = local_remote_addr(remote, sizeof remote);
    struct kfx_daemon d;
    const char *args[] = {"--host", "0.0.0.0", NULL};
    kfx_start(&d, args, NULL);
    /* loopback clients may change the topology */
    expect_to("127.0.0.1", d.port, "POST", "/register", NULL, REG(1), 201, "{\"status\":\"ok\"}");
    if (!have_remote) {
        assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
        skip();
    }
    /* others may not: 403 naming what opens the routes; nothing changed */
    expect_to(remote, d.port, "POST", "/register", NULL, REG(2), 403, "--allow-remote-admin");
    expect_to(remote, d.port, "POST", "/register", NULL,
              "{\"type\":\"vLLM\",\"modelname\":\"c\",\"instance_id\":\"n\",\"block_size\":4,"
              "\"endpoint\":\"tcp://127.0.0.1:2\"}",
              403, "--admin-token");
    expect_to(remote, d.port, "POST", "/unregister", NULL, UNREG(1), 403, "\"error\"");
    expect_to("127.0.0.1", d.port, "GET", "/workers", NULL, NULL, 200, "\"instance_id\":1,");
    struct kfx_resp r;
    assert_int_equal(kfx_get(&d, "/workers", &r), 200);
    assert_null(strstr(r.body, "\"instance_id\":2,"));
    kfx_resp_free(&r);
    /* queries and probes stay open to everyone */
    expect_to(remote, d.port, "GET", "/health", NULL, NULL, 200, NULL);
    expect_to(remote, d.port, "POST", "/query", NULL, "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4]}", 200,
              "\"scores\"");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* --allow-remote-admin opens them */
    const char *open_args[] = {"--host", "0.0.0.0", "--allow-remote-admin", NULL};
    kfx_start(&d, open_args, NULL);
    expect_to(remote, d.port, "POST", "/register", NULL, REG(2), 201, NULL);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* so does a token, for clients that send it */
    const char *tok_args[] = {"--host", "0.0.0.0", "--admin-token", "s3cret", NULL};
    kfx_start(&d, tok_args, NULL);
    expect_to(remote, d.port, "POST", "/register", NULL, REG(3), 401, NULL);
    expect_to(remote, d.port, "POST", "/register", "Authorization: Bearer s3cret", REG(3), 201, NULL);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* --data-token: data-plane writes and whole-index reads need it (or the admin
 * token); queries and reads of loads stay open. */
static void test_data_token(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    const char *extra[] = {"--data-token", "d4ta", "--admin-token", "adm", NULL};
    kfx_start_slots(&d, &sv, extra, NULL);
    const char *data = "Authorization: Bearer d4ta", *admin = "Authorization: Bearer adm";
    /* /dump: the whole index */
    expect_to("127.0.0.1", d.port, "GET", "/dump", NULL, NULL, 401, "data token");
    expect_to("127.0.0.1", d.port, "GET", "/dump", data, NULL, 200, NULL);
    expect_to("127.0.0.1", d.port, "GET", "/dump", admin, NULL, 200, NULL);
    /* the slot tracker's writes */
    expect_to("127.0.0.1", sv.port, "POST", "/register", admin,
              "{\"worker_id\":1,\"model_name\":\"m\",\"block_size\":4,\"dp_start\":0,\"dp_size\":1}", 201, NULL);
    const char *add = "{\"model_name\":\"m\",\"request_id\":\"r1\",\"worker_id\":1,\"dp_rank\":0,"
                      "\"sequence_hashes\":[1,2],\"new_isl_tokens\":8}";
    const char *rid = "{\"model_name\":\"m\",\"request_id\":\"r1\"}";
    expect_to("127.0.0.1", sv.port, "POST", "/add", NULL, add, 401, "data token");
    expect_to("127.0.0.1", sv.port, "POST", "/add", data, add, 201, NULL);
    expect_to("127.0.0.1", sv.port, "POST", "/prefill_complete", NULL, rid, 401, NULL);
    expect_to("127.0.0.1", sv.port, "POST", "/prefill_complete", data, rid, 200, NULL);
    expect_to("127.0.0.1", sv.port, "POST", "/free", NULL, rid, 401, NULL);
    expect_to("127.0.0.1", sv.port, "POST", "/free", data, rid, 200, NULL);
    expect_to("127.0.0.1", sv.port, "GET", "/loads", NULL, NULL, 200, NULL);
    /* /route: open without commit; a commit needs the token */
    const char *rq = "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4,5,6,7,8]}";
    const char *rc = "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4,5,6,7,8],\"commit\":true,\"request_id\":\"r2\"}";
    expect_to("127.0.0.1", d.port, "POST", "/route", NULL, rq, 200, "\"worker_id\":1");
    expect_to("127.0.0.1", d.port, "POST", "/route", NULL, rc, 401, "data token");
    expect_to("127.0.0.1", d.port, "POST", "/route", data, rc, 200, "\"worker_id\":1");
    /* queries stay open */
    expect_to("127.0.0.1", d.port, "POST", "/query", NULL, "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4]}", 404,
              NULL);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_protected_mode, teardown),
        cmocka_unit_test_teardown(test_data_token, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
