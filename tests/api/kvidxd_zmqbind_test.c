/* ctest-labels: integration */
/*
 * kvidxd --zmq-bind, the llm-d convention: engines connect to one endpoint
 * kvidxd binds, each publishing with the topic kv@<pod-id>@<model-name>, and
 * nobody registers them. Real ZMQ over loopback TCP, C publishers in
 * connect mode:
 *   - three pods of two models: each model's queries score exactly what its
 *     pods stored, /dump holds exactly a model of their blocks, /workers
 *     lists them with "source":"zmq-bind";
 *   - a topic of another shape, and a pod past --zmq-bind-max-pods, are
 *     counted and stored nowhere;
 *   - a pod that restarts (seq back to 0) is a new engine: its old blocks go;
 *   - without a block size in the flag, the first BlockStored gives it;
 *   - a pod silent for --zmq-bind-idle-s is forgotten, its blocks dropped;
 *   - POST /zmq/bind opens the same over HTTP (400, 409, idempotent, GET
 *     /zmq/binds), POST /zmq/unbind closes it with its pods;
 *   - vLLM's own wire form from Python publishers (tests/api/vllm_pub.py);
 *   - an endpoint holding 4,096 pods refuses a flood from further pods.
 * Waits are bounded polls.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvidxd_fixture.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* A loopback TCP port free a moment ago (bound to port 0, then closed). */
static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/*
 * Start kvidxd with --zmq-bind tcp://127.0.0.1:<free port><suffix> and
 * --zmq-bind-idle-s @p idle and --zmq-bind-max-pods @p max_pods; another port when the bind lost a race.
 * @p ep receives the endpoint the publishers connect to.
 */
static void start_zbind(struct kfx_daemon *d, const char *suffix, const char *idle, const char *max_pods, char *ep,
                        size_t cap)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        snprintf(ep, cap, "tcp://127.0.0.1:%u", free_port());
        char flag[160];
        snprintf(flag, sizeof flag, "%s%s", ep, suffix);
        const char *args[] = {"--zmq-bind", flag, "--zmq-bind-idle-s", idle, "--zmq-bind-max-pods", max_pods, NULL};
        kfx_start(d, args, NULL);
        if (kfx_log_has(d, "zmq-bind", "bound, waiting", 5000))
            return;
        kfx_stop(d, SIGTERM, NULL);
    }
    fail_msg("kvidxd never bound its --zmq-bind endpoint");
}

/* A publisher that connects to @p ep with topic @p topic (no replay: the llm-d deployment has none). */
static struct kvidx_pub *pod_pub(const char *ep, const char *topic)
{
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = ep;
    pc.topic = topic;
    pc.socket_mode = KVIDX_PUB_SOCKET_CONNECT;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    return p;
}

/*
 * PUB/SUB slow joiner: send 1-frame probes of @p p's topic (never stored:
 * not a 3-frame message) until the daemon's counter @p metric has grown,
 * i.e. the subscription reached the publisher.
 */
static void sync_pub(const struct kfx_daemon *d, struct kvidx_pub *p, const char *topic, const char *metric)
{
    long long before = kfx_metric(d, metric);
    const void *fr[1] = {topic};
    size_t sz[1] = {strlen(topic)};
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while (kfx_now_ms() < end) {
        assert_int_equal(kvidx_pub_send_raw(p, fr, sz, 1), 0);
        if (KFX_WAIT(kfx_metric(d, metric) > before, 100))
            return;
    }
    fail_msg("%s never received a probe of %s", metric, topic);
}

/*
 * Whether the "scores" object of a Dynamo /query answer holds every
 * "pod":{"0":tokens} of @p want (NULL-terminated) and nothing of @p absent
 * (NULL: anything else is fine). A score is matched blocks x block size.
 */
static bool scores_are(const char *body, const char *const *want, const char *absent)
{
    const char *s = body ? strstr(body, "\"scores\":{") : NULL;
    const char *e = s ? strstr(s, "},\"frequencies\"") : NULL;
    if (e == NULL)
        return false;
    char buf[1024];
    snprintf(buf, sizeof buf, "%.*s", (int)(e + 1 - s), s);
    for (size_t i = 0; want[i] != NULL; i++)
        if (strstr(buf, want[i]) == NULL)
            return false;
    return absent == NULL || strstr(buf, absent) == NULL;
}

/* POST a Dynamo /query of the first n blocks of chain c until scores_are(want, absent). */
static void until_scores(const struct kfx_daemon *d, const char *model, uint32_t c, uint32_t n,
                         const char *const *want, const char *absent)
{
    char *q = kfx_query_json(model, c, n);
    struct kfx_resp r = {0};
    bool ok = KFX_WAIT((kfx_resp_free(&r), kfx_post_json(d, "/query", q, &r) == 200 && scores_are(r.body, want, absent)),
                       KFX_WAIT_MS);
    if (!ok) {
        kfx_dump_log(d);
        fail_msg("/query %s chain %u: want %s..., got %s", model, c, want[0] ? want[0] : "", r.body ? r.body : "(none)");
    }
    kfx_resp_free(&r);
    free(q);
}

#define WANT(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- /dump against a model: "pod/rank/engine hash" lines, sorted ------------------------------ */

struct lines {
    char **v;
    size_t n, cap;
};

__attribute__((format(printf, 2, 3))) static void lines_add(struct lines *l, const char *fmt, ...)
{
    if (l->n == l->cap)
        l->v = realloc(l->v, (l->cap = l->cap ? 2 * l->cap : 64) * sizeof *l->v);
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    l->v[l->n++] = strdup(buf);
}

static void lines_free(struct lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int line_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Blocks [from, to) of chain c held by @p pod on @p rank, as /dump lines. */
static void model_chain(struct lines *m, const char *pod, uint32_t rank, uint32_t c, uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++)
        lines_add(m, "%s/%u/%llu", pod, rank, (unsigned long long)kfx_hash(c, i));
}

/* Every block of /dump as a line "worker/dp_rank/block_hash" (string worker ids; watermarks skipped). */
static bool dump_lines(const struct kfx_daemon *d, struct lines *out)
{
    struct kfx_resp r = {0};
    if (kfx_get(d, "/dump", &r) != 200) {
        kfx_resp_free(&r);
        return false;
    }
    for (const char *p = r.body; (p = strstr(p, "{\"worker_id\":\"")) != NULL;) {
        p += strlen("{\"worker_id\":\"");
        const char *q = strchr(p, '"');
        if (q == NULL || strncmp(q, "\",\"storage_tier\":", 16) != 0)
            continue; /* a watermark, not a block */
        const char *rk = strstr(q, "\"dp_rank\":");
        const char *bh = rk ? strstr(rk, "\"block_hash\":") : NULL;
        if (bh == NULL)
            break;
        lines_add(out, "%.*s/%lu/%llu", (int)(q - p), p, strtoul(rk + strlen("\"dp_rank\":"), NULL, 10),
                  strtoull(bh + strlen("\"block_hash\":"), NULL, 10));
    }
    kfx_resp_free(&r);
    return true;
}

/* Poll /dump until its blocks are exactly @p model's (sorted here); fail with the difference. */
static void until_dump_is(const struct kfx_daemon *d, struct lines *model)
{
    qsort(model->v, model->n, sizeof *model->v, line_cmp);
    char why[512] = "";
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    for (;;) {
        struct lines got = {0};
        bool ok = dump_lines(d, &got);
        if (ok) {
            qsort(got.v, got.n, sizeof *got.v, line_cmp);
            size_t k = 0;
            while (k < got.n && k < model->n && strcmp(got.v[k], model->v[k]) == 0)
                k++;
            ok = k == got.n && k == model->n;
            snprintf(why, sizeof why, "%zu blocks, want %zu; first difference at %zu: got %s, want %s", got.n,
                     model->n, k, k < got.n ? got.v[k] : "-", k < model->n ? model->v[k] : "-");
        }
        lines_free(&got);
        if (ok)
            return;
        if (kfx_now_ms() >= end)
            fail_msg("/dump never equalled the model: %s", why);
        kfx_nap(50);
    }
}

/* Pods of two models on one endpoint; a bad topic; a pod that restarts. */
static void test_pods_models_bad_topic_restart(void **state)
{
    (void)state;
    struct kfx_daemon d;
    char ep[64];
    start_zbind(&d, "=4", "0", "3", ep, sizeof ep);

    struct kvidx_pub *a = pod_pub(ep, "kv@pod-a@m1");
    struct kvidx_pub *b = pod_pub(ep, "kv@pod-b@m1");
    struct kvidx_pub *c = pod_pub(ep, "kv@pod-c@m2");
    struct kvidx_pub *bad = pod_pub(ep, "kv@no-model");
    struct kvidx_pub *x = pod_pub(ep, "kv@pod-x@m1"); /* a 4th pod: past --zmq-bind-max-pods 3 */
    sync_pub(&d, a, "kv@pod-a@m1", "kvidx_listener_unknown_topic_total");
    sync_pub(&d, b, "kv@pod-b@m1", "kvidx_listener_unknown_topic_total");
    sync_pub(&d, c, "kv@pod-c@m2", "kvidx_listener_unknown_topic_total");
    sync_pub(&d, bad, "kv@no-model", "kvidx_listener_unknown_topic_total");
    sync_pub(&d, x, "kv@pod-x@m1", "kvidx_listener_unknown_topic_total");

    /* pod-a: chain 0 blocks 0..3; pod-b: chain 0 blocks 0..1, chain 1 0..2; pod-c: chain 0 0..4 */
    kfx_publish(a, 0, 0, 2, NULL);
    kfx_publish(a, 0, 2, 4, NULL);
    kfx_publish(b, 0, 0, 2, NULL);
    kfx_publish(b, 1, 0, 3, NULL);
    kfx_publish(c, 0, 0, 4, NULL);
    kfx_publish(bad, 0, 0, 4, NULL);
    kfx_publish(bad, 5, 0, 4, NULL);

    until_scores(&d, "m1", 0, 4, WANT("\"pod-a\":{\"0\":16}", "\"pod-b\":{\"0\":8}"), "pod-c");
    until_scores(&d, "m1", 1, 3, WANT("\"scores\":{\"pod-b\":{\"0\":12}}"), NULL);
    until_scores(&d, "m2", 0, 4, WANT("\"scores\":{\"pod-c\":{\"0\":16}}"), NULL);
    kfx_publish(x, 0, 0, 4, NULL); /* after the three are registered: refused */
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_zmq_bind_pods_refused_total") >= 1, KFX_WAIT_MS));
    until_scores(&d, "m2", 1, 3, WANT("\"scores\":{"), "pod-");
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_zmq_bind_bad_topic_total") >= 2, KFX_WAIT_MS));
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_bad_topic_total"), 2); /* its two batches (probes are 1-frame) */
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods"), 3);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods_created_total"), 3);
    assert_int_equal(kfx_metric(&d, "kvidx_listener_blocks_stored_total"), 4 + 2 + 3 + 4); /* nothing of bad's */
    struct lines model = {0};
    model_chain(&model, "pod-a", 0, 0, 0, 4);
    model_chain(&model, "pod-b", 0, 0, 0, 2);
    model_chain(&model, "pod-b", 0, 1, 0, 3);
    model_chain(&model, "pod-c", 0, 0, 0, 4);
    until_dump_is(&d, &model);
    lines_free(&model);

    struct kfx_resp r = {0};
    assert_int_equal(kfx_get(&d, "/workers", &r), 200);
    assert_non_null(strstr(r.body, "\"instance_id\":\"pod-a\",\"model_name\":\"m1\",\"tenant_id\":\"default\","
                                   "\"block_size\":4,\"source\":\"zmq-bind\""));
    assert_non_null(strstr(r.body, "\"instance_id\":\"pod-c\",\"model_name\":\"m2\""));
    assert_null(strstr(r.body, "no-model"));
    assert_null(strstr(r.body, "pod-x"));
    kfx_resp_free(&r);
    assert_int_equal(kfx_get(&d, "/workers?model_name=m2", &r), 200);
    assert_null(strstr(r.body, "pod-a"));
    kfx_resp_free(&r);

    /* pod-a restarts: a new publisher, seq from 0 again: its old blocks go, the new ones count */
    kvidx_pub_destroy(a);
    a = pod_pub(ep, "kv@pod-a@m1");
    sync_pub(&d, a, "kv@pod-a@m1", "kvidx_listener_malformed_total");
    kfx_publish(a, 2, 0, 2, NULL);
    until_scores(&d, "m1", 2, 2, WANT("\"scores\":{\"pod-a\":{\"0\":8}}"), NULL);
    until_scores(&d, "m1", 0, 4, WANT("\"scores\":{\"pod-b\":{\"0\":8}}"), NULL);
    assert_true(kfx_metric(&d, "kvidx_listener_restarts_total") >= 1);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods"), 3);
    model_chain(&model, "pod-a", 0, 2, 0, 2);
    model_chain(&model, "pod-b", 0, 0, 0, 2);
    model_chain(&model, "pod-b", 0, 1, 0, 3);
    model_chain(&model, "pod-c", 0, 0, 0, 4);
    until_dump_is(&d, &model);
    lines_free(&model);

    kvidx_pub_destroy(a);
    kvidx_pub_destroy(b);
    kvidx_pub_destroy(c);
    kvidx_pub_destroy(bad);
    kvidx_pub_destroy(x);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* No block size in the flag: the first BlockStored's; a pod silent for --zmq-bind-idle-s is forgotten. */
static void test_learnt_block_size_and_idle_pod(void **state)
{
    (void)state;
    struct kfx_daemon d;
    char ep[64];
    start_zbind(&d, "", "1", "4096", ep, sizeof ep);
    struct kvidx_pub *p = pod_pub(ep, "kv@pod-d@m3");
    struct kvidx_pub *q = pod_pub(ep, "kv@pod-e@m3");
    sync_pub(&d, p, "kv@pod-d@m3", "kvidx_listener_unknown_topic_total");
    sync_pub(&d, q, "kv@pod-e@m3", "kvidx_listener_unknown_topic_total");
    kfx_publish(p, 0, 0, 3, NULL);
    kfx_publish(q, 0, 0, 2, NULL);
    until_scores(&d, "m3", 0, 3, WANT("\"pod-d\":{\"0\":12}", "\"pod-e\":{\"0\":8}"), NULL);
    assert_true(kfx_get_has(&d, "/workers", 200, "\"instance_id\":\"pod-d\",\"model_name\":\"m3\","
                                                 "\"tenant_id\":\"default\",\"block_size\":4"));

    /* pod-e keeps talking (one more block each 200 ms), pod-d goes quiet: only pod-d is forgotten */
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    uint32_t next = 2;
    while (kfx_metric(&d, "kvidx_zmq_bind_pods_forgotten_total") < 1 && kfx_now_ms() < end) {
        if (next < 40)
            kfx_publish(q, 0, next, next + 1, NULL), next++;
        kfx_nap(200);
    }
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods_forgotten_total"), 1);
    assert_true(kfx_log_has(&d, "pod pod-d of model m3 forgotten", NULL, 1000));
    assert_false(kfx_get_has(&d, "/workers", 200, "pod-d"));
    assert_true(kfx_get_has(&d, "/workers", 200, "pod-e"));
    until_scores(&d, "m3", 0, 3, WANT("\"scores\":{\"pod-e\":{\"0\":12}}"), "pod-d");

    /* pod-d comes back: a new pod, registered on its first message again */
    kfx_publish(p, 1, 0, 2, NULL);
    until_scores(&d, "m3", 1, 2, WANT("\"scores\":{\"pod-d\":{\"0\":8}}"), NULL);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods_created_total"), 3);

    kvidx_pub_destroy(p);
    kvidx_pub_destroy(q);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* POST /zmq/bind @p ep (block size @p bs, 0 = none): the status. */
static long http_bind(const struct kfx_daemon *d, const char *path, const char *ep, uint32_t bs)
{
    char body[256];
    if (bs != 0)
        snprintf(body, sizeof body, "{\"endpoint\":\"%s\",\"block_size\":%u}", ep, bs);
    else
        snprintf(body, sizeof body, "{\"endpoint\":\"%s\"}", ep);
    struct kfx_resp r = {0};
    long st = kfx_post_json(d, path, body, &r);
    kfx_resp_free(&r);
    return st;
}

/*
 * POST /zmq/bind opens what --zmq-bind opens: validated (400 bad endpoint,
 * 409 another block size), idempotent, listed by GET /zmq/binds; pods come
 * as with the flag; POST /zmq/unbind unregisters them, drops their blocks,
 * frees the port (it can be bound again) and answers 404 the second time.
 */
static void test_http_bind_unbind(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--zmq-bind-idle-s", "0", NULL};
    kfx_start(&d, args, NULL);
    kfx_expect_get(&d, "/zmq/binds", 200, "[]");

    char ep[64];
    long st = 0;
    for (int attempt = 0; attempt < 5 && st != 201; attempt++) { /* another port when the bind lost a race */
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%u", free_port());
        st = http_bind(&d, "/zmq/bind", ep, 4);
    }
    assert_int_equal(st, 201);
    assert_int_equal(http_bind(&d, "/zmq/bind", ep, 4), 201); /* idempotent */
    assert_int_equal(http_bind(&d, "/zmq/bind", ep, 8), 409);
    assert_int_equal(http_bind(&d, "/zmq/bind", ep, 0), 409);
    assert_int_equal(http_bind(&d, "/zmq/bind", "tcp://127.0.0.1", 4), 400);     /* no port */
    assert_int_equal(http_bind(&d, "/zmq/bind", "udp://127.0.0.1:1", 4), 400);   /* transport */
    assert_int_equal(http_bind(&d, "/zmq/bind", "tcp://192.0.2.1:5557", 4), 400); /* not an address of ours */
    kfx_expect(&d, "/zmq/bind", "{\"block_size\":4}", 422, NULL); /* as Dynamo: a missing field */
    char want[256];
    snprintf(want, sizeof want, "[{\"endpoint\":\"%s\",\"block_size\":4,\"source\":\"http\",\"pods\":0}]", ep);
    kfx_expect_get(&d, "/zmq/binds", 200, want);

    struct kvidx_pub *a = pod_pub(ep, "kv@pod-a@m1");
    struct kvidx_pub *c = pod_pub(ep, "kv@pod-c@m2");
    sync_pub(&d, a, "kv@pod-a@m1", "kvidx_listener_unknown_topic_total");
    sync_pub(&d, c, "kv@pod-c@m2", "kvidx_listener_unknown_topic_total");
    kfx_publish(a, 0, 0, 3, NULL);
    kfx_publish(c, 0, 0, 2, NULL);
    until_scores(&d, "m1", 0, 3, WANT("\"scores\":{\"pod-a\":{\"0\":12}}"), NULL);
    until_scores(&d, "m2", 0, 3, WANT("\"scores\":{\"pod-c\":{\"0\":8}}"), NULL);
    snprintf(want, sizeof want, "[{\"endpoint\":\"%s\",\"block_size\":4,\"source\":\"http\",\"pods\":2}]", ep);
    kfx_expect_get(&d, "/zmq/binds", 200, want);
    assert_true(kfx_get_has(&d, "/workers", 200, "\"instance_id\":\"pod-a\",\"model_name\":\"m1\""));

    /* unbind: the pods and their blocks go, the port is free again */
    char body[128];
    snprintf(body, sizeof body, "{\"endpoint\":\"%s\"}", ep);
    kfx_expect(&d, "/zmq/unbind", body, 200, "{\"status\":\"ok\"}");
    kfx_expect(&d, "/zmq/unbind", body, 404, NULL);
    kfx_expect_get(&d, "/zmq/binds", 200, "[]");
    assert_false(kfx_get_has(&d, "/workers", 200, "pod-a"));
    assert_false(kfx_get_has(&d, "/workers", 200, "pod-c"));
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods"), 0);
    for (int m = 1; m <= 2; m++) { /* a namespace goes with its last instance */
        char model[16];
        snprintf(model, sizeof model, "m%d", m);
        char *q = kfx_query_json(model, 0, 3);
        struct kfx_resp r = {0};
        assert_true(KFX_WAIT((kfx_resp_free(&r), kfx_post_json(&d, "/query", q, &r) == 404), KFX_WAIT_MS));
        kfx_resp_free(&r);
        free(q);
    }

    /* bound again, without a block size: m1 comes back with pod-a's first store's (4); pod-a is a new pod */
    assert_int_equal(http_bind(&d, "/zmq/bind", ep, 0), 201);
    snprintf(want, sizeof want, "[{\"endpoint\":\"%s\",\"block_size\":null,\"source\":\"http\",\"pods\":0}]", ep);
    kfx_expect_get(&d, "/zmq/binds", 200, want);
    kvidx_pub_destroy(a);
    a = pod_pub(ep, "kv@pod-a@m1");
    sync_pub(&d, a, "kv@pod-a@m1", "kvidx_listener_unknown_topic_total");
    kfx_publish(a, 1, 0, 2, NULL);
    until_scores(&d, "m1", 1, 2, WANT("\"scores\":{\"pod-a\":{\"0\":8}}"), NULL);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods_created_total"), 3);

    kvidx_pub_destroy(a);
    kvidx_pub_destroy(c);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* ---- vLLM's own wire form (tests/api/vllm_pub.py) ---------------------------------------------- */

/*
 * A vLLM-form publisher: tests/api/vllm_pub.py (PUB connected to @p ep,
 * topic @p topic, events in @p form "array" or "map"), driven through its
 * stdin. It exits when its stdin closes (quit, or this process ending).
 */
static FILE *vllm_pub(const char *ep, const char *topic, const char *form)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "exec /usr/bin/python3 %s '%s' '%s' %s >/dev/null", KVI_VLLM_PUB, ep, topic, form);
    FILE *f = popen(cmd, "w");
    assert_non_null(f);
    return f;
}

__attribute__((format(printf, 2, 3))) static void vcmd(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    assert_true(vfprintf(f, fmt, ap) > 0);
    va_end(ap);
    assert_int_equal(fputc('\n', f), '\n');
    assert_int_equal(fflush(f), 0);
}

static void vllm_quit(FILE *f)
{
    vcmd(f, "quit");
    assert_int_equal(pclose(f), 0);
}

/* sync_pub for a vLLM-form publisher: probes until @p metric grew. */
static void vllm_sync(const struct kfx_daemon *d, FILE *f, const char *metric)
{
    long long before = kfx_metric(d, metric);
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while (kfx_now_ms() < end) {
        vcmd(f, "probe");
        if (KFX_WAIT(kfx_metric(d, metric) > before, 200))
            return;
    }
    fail_msg("%s never received a vLLM probe", metric);
}

/* GET /workers holds @p needle (else the body is printed and the test fails). */
static void workers_have(const struct kfx_daemon *d, const char *needle)
{
    struct kfx_resp r = {0};
    assert_int_equal(kfx_get(d, "/workers", &r), 200);
    if (strstr(r.body, needle) == NULL)
        fail_msg("/workers lacks %s: %s", needle, r.body);
    kfx_resp_free(&r);
}

/* At most KVI_SVC_MAX_ZBINDS (16) bind endpoints, open or closed: the 17th POST /zmq/bind is 429,
 * counted and logged, and one closed does not free its place. */
static void test_endpoint_limit(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--zmq-bind-idle-s", "0", NULL};
    kfx_start(&d, args, NULL);
    char ep[128];
    for (int i = 0; i < 16; i++) {
        snprintf(ep, sizeof ep, "ipc:///tmp/kvidx-zblimit-%d-%d", (int)getpid(), i);
        assert_int_equal(http_bind(&d, "/zmq/bind", ep, 4), 201);
    }
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_endpoints"), 16);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_endpoints_refused_total"), 0);
    snprintf(ep, sizeof ep, "ipc:///tmp/kvidx-zblimit-%d-16", (int)getpid());
    assert_int_equal(http_bind(&d, "/zmq/bind", ep, 4), 429);
    assert_true(kfx_log_has(&d, "not opened", "16 bind endpoints are known already", 5000));
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_endpoints_refused_total"), 1);
    char first[128];
    snprintf(first, sizeof first, "ipc:///tmp/kvidx-zblimit-%d-0", (int)getpid());
    assert_int_equal(http_bind(&d, "/zmq/unbind", first, 0), 200);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_endpoints"), 15);
    assert_int_equal(http_bind(&d, "/zmq/bind", ep, 4), 429); /* a closed endpoint keeps its place */
    assert_int_equal(http_bind(&d, "/zmq/bind", first, 4), 201); /* and may open again */
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_endpoints"), 16);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_endpoints_refused_total"), 2);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/*
 * vLLM's wire form, as llm-d runs it: three Python publishers (pyzmq +
 * msgpack, PUB connected, topic kv@<pod>@<model>, seq 8-byte big-endian,
 * array-like KVEventBatch; pod-c's events in the map form of newer vLLM)
 * on one endpoint bound without a block size. The block size is learnt
 * from the first store; each model's answers equal a model of what its
 * pods stored (pod-b's dp rank 1 batches under rank 1), and so does
 * /dump, block by block; a removal and a pod that restarts (a new process,
 * seq from 0) are applied.
 */
static void test_vllm_wire_form(void **state)
{
    (void)state;
    struct kfx_daemon d;
    char ep[64];
    start_zbind(&d, "", "0", "4096", ep, sizeof ep);
    FILE *a = vllm_pub(ep, "kv@pod-a@m1", "array");
    FILE *b = vllm_pub(ep, "kv@pod-b@m1", "array");
    FILE *c = vllm_pub(ep, "kv@pod-c@m2", "map");
    vllm_sync(&d, a, "kvidx_listener_unknown_topic_total");
    vllm_sync(&d, b, "kvidx_listener_unknown_topic_total");
    vllm_sync(&d, c, "kvidx_listener_unknown_topic_total");

    /* model: m1 chain 0: pod-a rank 0 blocks 0..3, pod-b rank 0 blocks 0..1; m1 chain 1: pod-b rank 1
     * blocks 0..2; m2 chain 0: pod-c rank 0 blocks 0..3 (block size 4: a score is 4 per block) */
    vcmd(a, "store 0 0 0 2 4");
    vcmd(a, "store 0 0 2 4 4");
    vcmd(b, "store 0 0 0 2 4");
    vcmd(b, "store 1 1 0 3 4");
    vcmd(c, "store 0 0 0 4 4");
    until_scores(&d, "m1", 0, 4, WANT("\"pod-a\":{\"0\":16}", "\"pod-b\":{\"0\":8}"), "pod-c");
    until_scores(&d, "m1", 1, 3, WANT("\"scores\":{\"pod-b\":{\"1\":12}}"), NULL);
    until_scores(&d, "m2", 0, 4, WANT("\"scores\":{\"pod-c\":{\"0\":16}}"), NULL);
    until_scores(&d, "m2", 1, 3, WANT("\"scores\":{}"), NULL);
    assert_true(kfx_get_has(&d, "/workers?model_name=m1", 200, "\"instance_id\":\"pod-b\",\"model_name\":\"m1\","
                                                               "\"tenant_id\":\"default\",\"block_size\":4,"
                                                               "\"source\":\"zmq-bind\""));
    assert_true(kfx_get_has(&d, "/workers?model_name=m2", 200, "\"instance_id\":\"pod-c\",\"model_name\":\"m2\","
                                                               "\"tenant_id\":\"default\",\"block_size\":4,"));
    /* /workers lists each rank a pod's batches named: pod-b 0 and 1, the others 0 */
    char want[512];
    snprintf(want, sizeof want, "\"instance_id\":\"pod-b\",%s\"endpoints\":{\"0\":\"%s\",\"1\":\"%s\"},",
             "\"model_name\":\"m1\",\"tenant_id\":\"default\",\"block_size\":4,\"source\":\"zmq-bind\","
             "\"status\":\"active\",", ep, ep);
    workers_have(&d, want);
    snprintf(want, sizeof want, "\"instance_id\":\"pod-a\",%s\"endpoints\":{\"0\":\"%s\"},",
             "\"model_name\":\"m1\",\"tenant_id\":\"default\",\"block_size\":4,\"source\":\"zmq-bind\","
             "\"status\":\"active\",", ep);
    workers_have(&d, want);
    assert_int_equal(kfx_metric(&d, "kvidx_listener_blocks_stored_total"), 4 + 2 + 3 + 4);
    assert_int_equal(kfx_metric(&d, "kvidx_listener_malformed_total") +
                         kfx_metric(&d, "kvidx_listener_decode_errors_total") +
                         kfx_metric(&d, "kvidx_listener_block_size_mismatch_total"), 0);

    /* pod-a removes blocks 2..3 (its chain now ends at 8 tokens) */
    vcmd(a, "remove 0 0 2 4");
    until_scores(&d, "m1", 0, 4, WANT("\"pod-a\":{\"0\":8}", "\"pod-b\":{\"0\":8}"), "\":16}");
    struct lines model = {0};
    model_chain(&model, "pod-a", 0, 0, 0, 2);
    model_chain(&model, "pod-b", 0, 0, 0, 2);
    model_chain(&model, "pod-b", 1, 1, 0, 3);
    model_chain(&model, "pod-c", 0, 0, 0, 4);
    until_dump_is(&d, &model);
    lines_free(&model);

    /* pod-a restarts: a new process, seq from 0: a new engine, its old blocks go */
    vllm_quit(a);
    a = vllm_pub(ep, "kv@pod-a@m1", "array");
    vllm_sync(&d, a, "kvidx_listener_malformed_total");
    vcmd(a, "store 0 2 0 2 4");
    until_scores(&d, "m1", 2, 2, WANT("\"scores\":{\"pod-a\":{\"0\":8}}"), NULL);
    until_scores(&d, "m1", 0, 4, WANT("\"scores\":{\"pod-b\":{\"0\":8}}"), NULL);
    assert_true(kfx_metric(&d, "kvidx_listener_restarts_total") >= 1);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods"), 3);
    model_chain(&model, "pod-a", 0, 2, 0, 2);
    model_chain(&model, "pod-b", 0, 0, 0, 2);
    model_chain(&model, "pod-b", 1, 1, 0, 3);
    model_chain(&model, "pod-c", 0, 0, 0, 4);
    until_dump_is(&d, &model);
    lines_free(&model);

    vllm_quit(a);
    vllm_quit(b);
    vllm_quit(c);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* CPU time (user + system) process @p pid has used, in ns, from /proc/<pid>/stat. */
static uint64_t proc_cpu_ns(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* fields after the command name: state is field 3 */
    assert_non_null(p);
    unsigned long long ut = 0, st = 0;
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st), 2);
    return (ut + st) * (1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK));
}

/* Send [topic, seq, an empty batch [ts, [], 0]] on @p p. */
static void send_empty(struct kvidx_pub *p, const char *topic, uint64_t seq)
{
    static const uint8_t batch[] = {0x93, 0xcb, 0x41, 0xda, 0, 0, 0, 0, 0, 0, 0x90, 0x00};
    uint8_t s8[8];
    for (int i = 0; i < 8; i++)
        s8[i] = (uint8_t)(seq >> (56 - 8 * i));
    const void *fr[3] = {topic, s8, batch};
    size_t sz[3] = {strlen(topic), 8, sizeof batch};
    assert_int_equal(kvidx_pub_send_raw(p, fr, sz, 3), 0);
}

#define FLOOD_PODS 4096
#define FLOOD_MSGS 50000

/*
 * An endpoint full of pods (--zmq-bind-max-pods 4,096, all registered by
 * their first message, sent by one engine for all of them) and a flood of
 * messages from 64 further pods: every one is counted as refused, none
 * stored or registered. Prints kvidxd's CPU time per refused message (the
 * pod's topic is looked up in a hash, not a scan of the 4,096), not asserted.
 */
static void test_full_endpoint_flood(void **state)
{
    (void)state;
    struct kfx_daemon d;
    char ep[64], topic[48];
    start_zbind(&d, "=4", "0", "4096", ep, sizeof ep);
    struct kvidx_pub *p = pod_pub(ep, "kv@probe@m");
    sync_pub(&d, p, "kv@probe@m", "kvidx_listener_unknown_topic_total");
    for (uint32_t k = 0; k < FLOOD_PODS; k++) {
        snprintf(topic, sizeof topic, "kv@pod-%04u@m", k);
        send_empty(p, topic, 0);
        if (k % 512 == 511) /* within the messages an endpoint holds while pods register (4,096) */
            assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_zmq_bind_pods_created_total") == k + 1, KFX_WAIT_MS));
    }
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods"), FLOOD_PODS);
    assert_int_equal(kfx_metric(&d, "kvidx_listener_held_dropped_total"), 0);

    uint64_t cpu0 = proc_cpu_ns(d.pid);
    for (uint32_t i = 0; i < FLOOD_MSGS; i++) {
        snprintf(topic, sizeof topic, "kv@flood-%02u@m", i % 64);
        send_empty(p, topic, i / 64);
    }
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_zmq_bind_pods_refused_total") == FLOOD_MSGS, KFX_WAIT_MS));
    uint64_t cpu1 = proc_cpu_ns(d.pid);
    printf("kvidxd, %u pods on the endpoint: %u refused messages, %.0f ns CPU each (whole process)\n", FLOOD_PODS,
           FLOOD_MSGS, (double)(cpu1 - cpu0) / FLOOD_MSGS);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods"), FLOOD_PODS);
    assert_int_equal(kfx_metric(&d, "kvidx_zmq_bind_pods_created_total"), FLOOD_PODS);
    assert_false(kfx_get_has(&d, "/workers?model_name=m", 200, "flood-"));
    kvidx_pub_destroy(p);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_pods_models_bad_topic_restart, teardown),
        cmocka_unit_test_teardown(test_learnt_block_size_and_idle_pod, teardown),
        cmocka_unit_test_teardown(test_http_bind_unbind, teardown),
        cmocka_unit_test_teardown(test_endpoint_limit, teardown),
        cmocka_unit_test_teardown(test_vllm_wire_form, teardown),
        cmocka_unit_test_teardown(test_full_endpoint_flood, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
