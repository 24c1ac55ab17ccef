/* ctest-labels: integration */
/*
 * Registrations that must not succeed, against the real daemon (issue 18,
 * items 8 and 9):
 *   - a listener that fails while it is set up (its socket cannot be created
 *     or connected at once) is not registered: Dynamo answers 503 with the
 *     reason, Conductor its 500 `Failed to subscribe: ...`; nothing is left
 *     behind (no instance, no namespace, no failed listener). Two causes: an
 *     ipc path longer than sun_path (ZMQ refuses it at once) and the
 *     descriptor limit (kvidxd run under `ulimit -n 64`);
 *   - a name the index cannot key (empty model_name, a NUL character) is the
 *     client's error (Dynamo 422 naming the field, Conductor 400 with
 *     `field`), not a bare 500; a 500 that remains is logged;
 *   - (item 4) a registration past --max-models namespaces: 429.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvidxd_fixture.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* POST and expect `status` and a body containing every needle (NULL-terminated). */
static void expect_has(const struct kfx_daemon *d, const char *path, const char *json, long status,
                       const char *const *needles)
{
    struct kfx_resp r;
    long s = kfx_post_json(d, path, json, &r);
    bool ok = s == status;
    for (int i = 0; ok && needles[i] != NULL; i++)
        ok = strstr(r.body, needles[i]) != NULL;
    if (!ok)
        fail_msg("POST %s %s: got %ld %s, want %ld", path, json, s, r.body, status);
    kfx_resp_free(&r);
}

/* The daemon holds no registration at all (either dialect) and no failed listener. */
static void expect_empty(const struct kfx_daemon *d)
{
    kfx_expect_get(d, "/workers", 200, "[]");
    kfx_expect_get(d, "/services", 200, "{\"count\":0,\"services\":[]}");
    assert_int_equal(kfx_metric(d, "dynamo_kvindexer_models"), 0);
    assert_int_equal(kfx_metric(d, "dynamo_kvindexer_listeners{status=\"failed\"}"), 0);
}

/* An ipc endpoint whose path does not fit sun_path (108 bytes): zmq_connect fails at once. */
static void long_ipc(char *out, size_t cap)
{
    snprintf(out, cap, "ipc:///tmp/kvidx-safety-");
    size_t n = strlen(out);
    while (n < 180 && n + 1 < cap)
        out[n++] = 'x';
    out[n] = '\0';
}

static void test_listener_fails_at_once(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    char ep[256], body[512];
    long_ipc(ep, sizeof ep);

    /* Dynamo: 503 with the listener's reason; the instance and its namespace are gone */
    snprintf(body, sizeof body, "{\"instance_id\":7,\"endpoint\":\"%s\",\"model_name\":\"m\",\"block_size\":16}", ep);
    const char *dyn[] = {"{\"error\":\"instance 7 dp_rank 0 not registered: its listener failed: ",
                         "File name too long", NULL};
    expect_has(&d, "/register", body, 503, dyn);
    expect_empty(&d);
    assert_true(kfx_log_has(&d, "ERROR", "instance 7 dp_rank 0 not registered", 5000));

    /* Conductor: its own answer for a ZMQ client that cannot start (500 text), logged */
    snprintf(body, sizeof body,
             "{\"type\":\"vLLM\",\"modelname\":\"c\",\"instance_id\":\"p1\",\"block_size\":16,\"dp_rank\":0,"
             "\"endpoint\":\"%s\"}",
             ep);
    const char *cond[] = {"Failed to subscribe: failed to start ZMQ client: ", "File name too long", NULL};
    expect_has(&d, "/register", body, 500, cond);
    expect_empty(&d);
    assert_true(kfx_log_has(&d, "ERROR", "registration of p1|default|0 for model c failed (500)", 5000));

    /* nothing was left behind: the same keys register normally */
    kfx_expect(&d, "/register",
               "{\"instance_id\":7,\"endpoint\":\"tcp://127.0.0.1:1\",\"model_name\":\"m\",\"block_size\":16}", 201,
               "{\"status\":\"ok\"}");
    struct kfx_resp r;
    assert_int_equal(kfx_post_json(&d, "/register",
                                   "{\"type\":\"vLLM\",\"modelname\":\"c\",\"instance_id\":\"p1\",\"block_size\":16,"
                                   "\"dp_rank\":0,\"endpoint\":\"tcp://127.0.0.1:2\"}",
                                   &r),
                     200);
    kfx_resp_free(&r);
    assert_true(kfx_get_has(&d, "/workers", 200, "\"instance_id\":7,"));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* Kill a daemon without a graceful stop (and without printing its log). */
static void kill_daemon(struct kfx_daemon *d)
{
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    kfx_track(d->pid, NULL, NULL);
    d->pid = 0;
    unlink(d->portfile);
    unlink(d->logfile);
}

/*
 * The case: at the descriptor limit a listener's socket cannot be
 * created (EMFILE). kvidxd runs under `ulimit -n 64` (soft and hard, so it
 * cannot raise it) through a wrapper script; inproc endpoints take one
 * descriptor per listener (its socket's mailbox), so registrations succeed
 * until the limit and then must answer 503, never 201 for a failed listener.
 */
static void test_fd_limit(void **state)
{
    (void)state;
    struct kfx_daemon d;
    int rc = kfx_start_nofile(&d, NULL, 64);
    if (rc != 0) {
        kfx_dump_log(&d);
        fail_msg("kvidxd under ulimit -n 64 did not start (%d)", rc);
    }

    int ok = 0, refused = 0, last = 0;
    bool registered[201] = {false};
    for (int i = 1; i <= 200 && refused < 3; i++) {
        last = i;
        char body[256];
        snprintf(body, sizeof body,
                 "{\"instance_id\":%d,\"endpoint\":\"inproc://kvidx-safety-%d\",\"model_name\":\"m\","
                 "\"block_size\":16}",
                 i, i);
        struct kfx_resp r;
        long s = kfx_post_json(&d, "/register", body, &r);
        if (s == 201) {
            /* (a descriptor freed meanwhile, an HTTP connection's or one of ZMQ's, can make room
             * again after a 503: the rule is that a 201 always means a working listener, below) */
            ok++;
            registered[i] = true;
        } else if (s == 503) {
            if (strstr(r.body, "Too many open files") == NULL || strstr(r.body, "not registered") == NULL)
                fail_msg("instance %d: 503 without the reason: %s", i, r.body);
            refused++;
        } else {
            fail_msg("instance %d: got %ld %s, want 201 or 503", i, s, r.body);
        }
        kfx_resp_free(&r);
    }
    if (refused == 0)
        fail_msg("200 registrations under ulimit -n 64 all answered 201");
    assert_true(ok > 0);
    /* the refused ones left nothing: only the registered instances, none failed */
    struct kfx_resp r;
    assert_int_equal(kfx_get(&d, "/workers", &r), 200);
    assert_null(strstr(r.body, "\"failed\""));
    for (int i = 1; i <= last; i++) { /* exactly the instances that got 201 */
        char id[64];
        snprintf(id, sizeof id, "\"instance_id\":%d,", i);
        if ((strstr(r.body, id) != NULL) != registered[i])
            fail_msg("instance %d: %s in /workers, but it got %s", i, registered[i] ? "missing" : "listed",
                     registered[i] ? "201" : "503");
    }
    kfx_resp_free(&r);
    assert_int_equal(kfx_metric(&d, "dynamo_kvindexer_workers"), ok);
    assert_int_equal(kfx_metric(&d, "dynamo_kvindexer_listeners{status=\"failed\"}"), 0);
    assert_true(kfx_log_has(&d, "ERROR", "Too many open files", 5000));
    /* not SIGTERM: libzmq asserts (ctx.cpp) when it cannot open a socket while terminating at the limit */
    kill_daemon(&d);
}

static void test_bad_names(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    /* Dynamo: 422 naming the field, as for any other value of the wrong kind */
    const char *empty[] = {"Failed to deserialize the JSON body into the target type: model_name: ",
                           "expected a non-empty string", NULL};
    expect_has(&d, "/register",
               "{\"instance_id\":1,\"endpoint\":\"tcp://127.0.0.1:1\",\"model_name\":\"\",\"block_size\":16}", 422,
               empty);
    const char *nul_model[] = {"model_name: ", "NUL character", NULL};
    expect_has(&d, "/register",
               "{\"instance_id\":1,\"endpoint\":\"tcp://127.0.0.1:1\",\"model_name\":\"\\u0000\",\"block_size\":16}",
               422, nul_model);
    const char *nul_tenant[] = {"tenant_id: ", "NUL character", NULL};
    expect_has(&d, "/register",
               "{\"instance_id\":1,\"endpoint\":\"tcp://127.0.0.1:1\",\"model_name\":\"m\",\"tenant_id\":\"t\\u0000x\","
               "\"block_size\":16}",
               422, nul_tenant);
    /* Conductor: 400 with the field (an empty modelname already was) */
    const char *c_empty[] = {"\"field\":\"modelname\"", NULL};
    expect_has(&d, "/register",
               "{\"type\":\"vLLM\",\"modelname\":\"\",\"instance_id\":\"a\",\"block_size\":16,\"dp_rank\":0,"
               "\"endpoint\":\"tcp://127.0.0.1:2\"}",
               400, c_empty);
    const char *c_model[] = {"\"reason\":\"invalid_value\"", "\"field\":\"modelname\"", "NUL", NULL};
    expect_has(&d, "/register",
               "{\"type\":\"vLLM\",\"modelname\":\"a\\u0000b\",\"instance_id\":\"a\",\"block_size\":16,\"dp_rank\":0,"
               "\"endpoint\":\"tcp://127.0.0.1:2\"}",
               400, c_model);
    const char *c_inst[] = {"\"field\":\"instance_id\"", NULL};
    expect_has(&d, "/register",
               "{\"type\":\"vLLM\",\"modelname\":\"a\",\"instance_id\":\"\\u0000\",\"block_size\":16,\"dp_rank\":0,"
               "\"endpoint\":\"tcp://127.0.0.1:2\"}",
               400, c_inst);
    expect_empty(&d);
    /* a client's mistake is no server error (each answer came after anything it logged) */
    assert_false(kfx_log_has(&d, "ERROR", NULL, 0));
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* Dynamo /register of instance @p id in (model, tenant); @return the status, body in @p r. */
static long dyn_reg(const struct kfx_daemon *d, int id, const char *model, const char *tenant, struct kfx_resp *r)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"instance_id\":%d,\"endpoint\":\"tcp://127.0.0.1:%d\",\"model_name\":\"%s\",\"tenant_id\":\"%s\","
             "\"block_size\":16}",
             id, 1000 + id, model, tenant);
    return kfx_post_json(d, "/register", body, r);
}

/*
 * Issue 18 item 4: namespaces (model x tenant) are bounded by --max-models;
 * a registration that would create one more answers 429 naming the limit and
 * the flag, registrations into existing ones go on, and deleting one frees its
 * place.
 */
static void test_max_models(void **state)
{
    (void)state;
    const char *args[] = {"--max-models", "2", NULL};
    struct kfx_daemon d;
    kfx_start(&d, args, NULL);
    struct kfx_resp r;
    assert_int_equal(dyn_reg(&d, 1, "m1", "t", &r), 201);
    kfx_resp_free(&r);
    assert_int_equal(dyn_reg(&d, 2, "m2", "t", &r), 201);
    kfx_resp_free(&r);
    assert_int_equal(dyn_reg(&d, 3, "m1", "t", &r), 201); /* an existing namespace: no limit */
    kfx_resp_free(&r);

    const char *full[] = {"{\"error\":\"too many models: 2 namespaces", "--max-models", NULL};
    expect_has(&d, "/register",
               "{\"instance_id\":4,\"endpoint\":\"tcp://127.0.0.1:4\",\"model_name\":\"m3\",\"block_size\":16}",
               429, full);
    /* another tenant of a known model is another namespace */
    expect_has(&d, "/register",
               "{\"instance_id\":4,\"endpoint\":\"tcp://127.0.0.1:4\",\"model_name\":\"m1\",\"tenant_id\":\"u\","
               "\"block_size\":16}",
               429, full);
    const char *cond[] = {"too many models: 2 namespaces", "--max-models", NULL};
    expect_has(&d, "/register",
               "{\"type\":\"vLLM\",\"modelname\":\"c\",\"instance_id\":\"p1\",\"block_size\":16,\"dp_rank\":0,"
               "\"endpoint\":\"tcp://127.0.0.1:5\"}",
               429, cond);
    assert_int_equal(kfx_metric(&d, "dynamo_kvindexer_models"), 2);
    assert_int_equal(kfx_metric(&d, "dynamo_kvindexer_workers"), 3);
    assert_true(kfx_log_has(&d, "namespace m3:default not created", "--max-models", 5000));

    /* the last instance of m2 gone, its namespace is deleted and m3 fits */
    kfx_expect(&d, "/unregister", "{\"instance_id\":2,\"model_name\":\"m2\",\"tenant_id\":\"t\"}", 200, NULL);
    assert_int_equal(dyn_reg(&d, 4, "m3", "t", &r), 201);
    kfx_resp_free(&r);
    assert_int_equal(kfx_metric(&d, "dynamo_kvindexer_models"), 2);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_listener_fails_at_once, teardown),
        cmocka_unit_test_teardown(test_fd_limit, teardown),
        cmocka_unit_test_teardown(test_bad_names, teardown),
        cmocka_unit_test_teardown(test_max_models, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
