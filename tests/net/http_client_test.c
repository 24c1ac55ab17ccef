/*
 * HTTP client (net/http_client.h) against the kvidx HTTP server: every
 * protocol mode, a streamed multi-MB body, POST, status errors, transport
 * errors (refused, silent socket timing out), callback cancellation, and
 * cancellation through the options' hook while the server says nothing.
 */
/* ctest-labels: integration */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "net/http_client.h"
#include "net/http_server.h"

static uint8_t pat(uint64_t i)
{
    return (uint8_t)((i * 167u) ^ (i >> 9));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- server side ---- */

#define DUMP_SIZE (5u * 1024u * 1024u + 333u)

struct dump_state {
    size_t pos;
};

static ssize_t dump_pull(void *ud, void *buf, size_t cap)
{
    struct dump_state *d = ud;
    size_t n = DUMP_SIZE - d->pos < cap ? DUMP_SIZE - d->pos : cap;
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)buf)[i] = pat(d->pos + i);
    d->pos += n;
    return (ssize_t)n;
}

static void dump_release(void *ud, int outcome)
{
    free(ud);
}

static void h_dump(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_http_producer p = {dump_pull, dump_release, calloc(1, sizeof(struct dump_state))};
    kvi_http_stream_pull(res, 200, "application/json", &p);
}

static void h_echo(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    char out[256];
    int n = snprintf(out, sizeof out, "%.*s|%.*s|%.*s|%zu", (int)req->content_type.len,
                     req->content_type.p ? req->content_type.p : "", (int)req->authorization.len,
                     req->authorization.p ? req->authorization.p : "", (int)(req->body_len < 64 ? req->body_len : 64),
                     req->body ? (const char *)req->body : "", req->body_len);
    kvi_http_respond(res, 200, "text/plain", out, (size_t)n);
}

static void h_version(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    char out[32];
    int n = snprintf(out, sizeof out, "%d", req->version);
    kvi_http_respond(res, 200, "text/plain", out, (size_t)n);
}

static void h_conflict(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    kvi_http_error(res, 409, "already registered");
}

static struct kvi_http_server *g_srv;
static char g_base[64];

static int setup(void **state)
{
    struct kvi_http_options o;
    kvi_http_options_init(&o);
    o.host = "127.0.0.1";
    o.threads = 2;
    g_srv = kvi_http_server_create(&o);
    if (g_srv == NULL)
        return -1;
    kvi_http_server_route(g_srv, KVI_HTTP_GET, "/dump", h_dump, NULL, NULL);
    kvi_http_server_route(g_srv, KVI_HTTP_POST, "/echo", h_echo, NULL, NULL);
    kvi_http_server_route(g_srv, KVI_HTTP_GET, "/version", h_version, NULL, NULL);
    kvi_http_server_route(g_srv, KVI_HTTP_POST, "/register", h_conflict, NULL, NULL);
    if (kvi_http_server_start(g_srv) != 0)
        return -1;
    snprintf(g_base, sizeof g_base, "http://127.0.0.1:%u", kvi_http_server_port(g_srv));
    return 0;
}

static int teardown(void **state)
{
    int rc = kvi_http_server_stop(g_srv);
    kvi_http_server_free(g_srv);
    return rc;
}

static const char *url(const char *path)
{
    static char buf[128];
    snprintf(buf, sizeof buf, "%s%s", g_base, path);
    return buf;
}

static struct kvi_http_client *client(enum kvi_http_client_proto proto, unsigned timeout_ms)
{
    struct kvi_http_client_options o;
    kvi_http_client_options_init(&o);
    o.proto = proto;
    if (timeout_ms != 0)
        o.timeout_ms = timeout_ms;
    o.bearer_token = "tok123";
    struct kvi_http_client *c = kvi_http_client_create(&o);
    assert_non_null(c);
    return c;
}

/* ---- body sinks ---- */

struct sink {
    size_t bytes;
    size_t calls;
    bool bad;
    size_t stop_after; /* 0: never */
};

static int sink_fn(void *ud, const void *data, size_t len)
{
    struct sink *s = ud;
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++)
        if (p[i] != pat(s->bytes + i))
            s->bad = true;
    s->bytes += len;
    s->calls++;
    return s->stop_after != 0 && s->bytes >= s->stop_after ? 1 : 0;
}

struct text {
    char buf[512];
    size_t len;
};

static int text_fn(void *ud, const void *data, size_t len)
{
    struct text *t = ud;
    size_t k = len < sizeof t->buf - 1 - t->len ? len : sizeof t->buf - 1 - t->len;
    memcpy(t->buf + t->len, data, k);
    t->len += k;
    t->buf[t->len] = 0;
    return 0;
}

/* ---- tests ---- */

static void test_streamed_body_every_protocol(void **state)
{
    enum kvi_http_client_proto protos[] = {KVI_HTTP_CLIENT_H1, KVI_HTTP_CLIENT_H2C_UPGRADE, KVI_HTTP_CLIENT_H2C_PRIOR};
    int want_version[] = {0x101, 0x200, 0x200};
    for (int p = 0; p < 3; p++) {
        struct kvi_http_client *c = client(protos[p], 0);
        for (int round = 0; round < 2; round++) { /* the second round reuses the connection (not with prior knowledge) */
            struct sink s = {0};
            struct kvi_http_result res;
            assert_int_equal(kvi_http_get(c, url("/dump"), sink_fn, &s, &res), 0);
            assert_int_equal(res.status, 200);
            assert_int_equal(res.http_version, want_version[p]);
            assert_string_equal(res.content_type, "application/json");
            assert_int_equal(res.body_bytes, DUMP_SIZE);
            assert_int_equal(s.bytes, DUMP_SIZE);
            assert_false(s.bad);
            assert_true(s.calls > 1); /* applied as it arrived, not as one buffer */
            assert_string_equal(res.error, "");
        }
        struct text t = {0};
        struct kvi_http_result res;
        assert_int_equal(kvi_http_get(c, url("/version"), text_fn, &t, &res), 0);
        assert_int_equal(atoi(t.buf), want_version[p]);
        kvi_http_client_free(c);
    }
}

static void test_post(void **state)
{
    enum kvi_http_client_proto protos[] = {KVI_HTTP_CLIENT_H1, KVI_HTTP_CLIENT_H2C_UPGRADE, KVI_HTTP_CLIENT_H2C_PRIOR};
    for (int p = 0; p < 3; p++) {
        struct kvi_http_client *c = client(protos[p], 0);
        struct text t = {0};
        struct kvi_http_result res;
        const char body[] = "{\"url\":\"http://peer:8090\"}";
        assert_int_equal(kvi_http_post(c, url("/echo"), "application/json", body, strlen(body), text_fn, &t, &res), 0);
        assert_int_equal(res.status, 200);
        char want[256];
        snprintf(want, sizeof want, "application/json|Bearer tok123|%s|%zu", body, strlen(body));
        assert_string_equal(t.buf, want);

        /* a large body (over curl's small-POST path) */
        size_t big = 1024 * 1024;
        char *b = malloc(big);
        memset(b, 'z', big);
        memset(&t, 0, sizeof t);
        assert_int_equal(kvi_http_post(c, url("/echo"), "application/msgpack", b, big, text_fn, &t, &res), 0);
        assert_non_null(strstr(t.buf, "|1048576"));
        free(b);
        kvi_http_client_free(c);
    }
}

static void test_status_errors(void **state)
{
    struct kvi_http_client *c = client(KVI_HTTP_CLIENT_H2C_UPGRADE, 0);
    struct sink s = {0};
    struct kvi_http_result res;
    assert_int_equal(kvi_http_get(c, url("/nope"), sink_fn, &s, &res), -EREMOTEIO);
    assert_int_equal(res.status, 404);
    assert_string_equal(res.content_type, "application/json");
    assert_non_null(strstr(res.error, "{\"error\":\"no route for /nope\"}"));
    assert_int_equal(s.calls, 0); /* error bodies never reach the callback */
    assert_int_equal(res.body_bytes, 0);

    assert_int_equal(kvi_http_post(c, url("/register"), "application/json", "{}", 2, sink_fn, &s, &res),
                     -EREMOTEIO);
    assert_int_equal(res.status, 409);
    assert_non_null(strstr(res.error, "already registered"));

    assert_int_equal(kvi_http_post(c, url("/dump"), NULL, NULL, 0, NULL, NULL, &res), -EREMOTEIO);
    assert_int_equal(res.status, 405);

    /* the client still works after errors */
    assert_int_equal(kvi_http_get(c, url("/dump"), sink_fn, &s, &res), 0);
    assert_int_equal(s.bytes, DUMP_SIZE);
    kvi_http_client_free(c);
}

static void test_cancel(void **state)
{
    struct kvi_http_client *c = client(KVI_HTTP_CLIENT_H1, 0);
    struct sink s = {.stop_after = 200 * 1024};
    struct kvi_http_result res;
    assert_int_equal(kvi_http_get(c, url("/dump"), sink_fn, &s, &res), -ECANCELED);
    assert_int_equal(res.status, 200);
    assert_true(s.bytes >= 200 * 1024 && s.bytes < DUMP_SIZE);
    assert_non_null(strstr(res.error, "cancelled"));
    kvi_http_client_free(c);
}

static void test_transport_errors(void **state)
{
    /* nobody listens: a port we bound and closed */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    char u[128];
    snprintf(u, sizeof u, "http://127.0.0.1:%u/dump", ntohs(a.sin_port));
    struct kvi_http_client *c = client(KVI_HTTP_CLIENT_H1, 2000);
    struct kvi_http_result res;
    assert_int_equal(kvi_http_get(c, u, NULL, NULL, &res), -ECONNREFUSED);
    assert_int_equal(res.status, 0);
    assert_true(res.error[0] != '\0');

    /* a silent server: accepts (kernel backlog) and never answers */
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    a.sin_port = 0;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    snprintf(u, sizeof u, "http://127.0.0.1:%u/dump", ntohs(a.sin_port));
    kvi_http_client_free(c);
    enum kvi_http_client_proto protos[] = {KVI_HTTP_CLIENT_H1, KVI_HTTP_CLIENT_H2C_PRIOR};
    for (int p = 0; p < 2; p++) {
        c = client(protos[p], 300);
        double t0 = now_s();
        assert_int_equal(kvi_http_get(c, u, NULL, NULL, &res), -ETIMEDOUT);
        double dt = now_s() - t0;
        assert_true(dt >= 0.25 && dt < 5.0);
        assert_int_equal(res.status, 0);
        assert_non_null(strstr(res.error, "imed out"));
        kvi_http_client_free(c);
    }
    close(fd);

    /* bad URLs */
    c = client(KVI_HTTP_CLIENT_H1, 0);
    assert_int_equal(kvi_http_get(c, "ftp://127.0.0.1/x", NULL, NULL, &res), -EINVAL);
    assert_int_equal(kvi_http_get(c, NULL, NULL, NULL, &res), -EINVAL);
    int rc = kvi_http_get(c, "http://no-such-host.invalid/x", NULL, NULL, &res);
    assert_true(rc == -EHOSTUNREACH || rc == -ETIMEDOUT); /* -ETIMEDOUT: a resolver that does not answer */
    kvi_http_client_free(c);
}

/* ---- cancellation through options.cancel ---- */

/*
 * The canceller sets the flag from another thread once the hook has answered
 * false `after_calls` times, i.e. once the request is running and has polled:
 * the request's progress, not a delay, decides when the cancel comes, so a
 * busy machine changes nothing the test asserts.
 */
struct canceller {
    _Atomic bool flag;
    _Atomic bool done;          /* the request returned: stop waiting for calls */
    _Atomic unsigned calls;     /* hook calls */
    _Atomic unsigned trues;     /* of them, answered true */
    unsigned after_calls;
};

static bool cancel_hook(void *ud)
{
    struct canceller *k = ud;
    atomic_fetch_add(&k->calls, 1);
    bool stop = atomic_load(&k->flag);
    if (stop)
        atomic_fetch_add(&k->trues, 1);
    return stop;
}

static void *canceller_main(void *arg)
{
    struct canceller *k = arg;
    while (atomic_load(&k->calls) < k->after_calls && !atomic_load(&k->done))
        sched_yield();
    atomic_store(&k->flag, true);
    return NULL;
}

/* A listening socket whose connections are accepted by the kernel and never answered. */
static int silent_listener(char *u, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    snprintf(u, cap, "http://127.0.0.1:%u/dump", ntohs(a.sin_port));
    return fd;
}

/* Sends the status line, the headers and a few body bytes of a 1 MB answer, then stalls. */
struct staller {
    int lfd;
    _Atomic bool quit;
};

static void *staller_main(void *arg)
{
    struct staller *st = arg;
    int fd = accept(st->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    char req[4096];
    ssize_t n = read(fd, req, sizeof req); /* the request fits one read */
    (void)n;
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{\"a\":";
    ssize_t w = write(fd, head, sizeof head - 1);
    (void)w;
    while (!atomic_load(&st->quit)) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    close(fd);
    return NULL;
}

/* The staller's body bytes arrived, then the hook was asked twice more (the
 * body stalls and the client keeps polling): cancel. Runs on the requesting
 * thread, as the hook does, so it may read the body sink. */
struct body_canceller {
    const struct text *t;
    unsigned after_body;
    unsigned trues;
};

static bool cancel_after_body(void *ud)
{
    struct body_canceller *k = ud;
    if (k->t->len < 5)
        return false;
    if (k->after_body < 2) {
        k->after_body++;
        return false;
    }
    k->trues++;
    return true;
}

static void test_cancel_hook(void **state)
{
    char u[128];
    int fd = silent_listener(u, sizeof u);
    enum kvi_http_client_proto protos[] = {KVI_HTTP_CLIENT_H1, KVI_HTTP_CLIENT_H2C_UPGRADE, KVI_HTTP_CLIENT_H2C_PRIOR};
    for (int p = 0; p < 3; p++) {
        /* waiting for an answer that never comes, with a 10 s budget: once
         * the hook has been asked five times (the request is sent and the
         * client polls for the answer), another thread cancels */
        struct canceller k = {.after_calls = 5};
        struct kvi_http_client_options o;
        kvi_http_client_options_init(&o);
        o.proto = protos[p];
        o.timeout_ms = 10000;
        o.cancel = cancel_hook;
        o.cancel_ud = &k;
        struct kvi_http_client *c = kvi_http_client_create(&o);
        assert_non_null(c);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, canceller_main, &k), 0);
        struct kvi_http_result res;
        int rc = kvi_http_get(c, u, NULL, NULL, &res);
        atomic_store(&k.done, true);
        pthread_join(th, NULL);
        assert_int_equal(rc, -ECANCELED);
        /* the hook was asked while the request waited, and its first true
         * answer stopped the request */
        assert_true(atomic_load(&k.calls) > k.after_calls);
        assert_int_equal(atomic_load(&k.trues), 1);
        assert_int_equal(res.status, 0);
        assert_non_null(strstr(res.error, "cancelled by the caller"));

        /* already cancelled: returns at once (one question, no transfer),
         * and the client is still usable afterwards */
        unsigned calls = atomic_load(&k.calls);
        assert_int_equal(kvi_http_get(c, url("/version"), NULL, NULL, &res), -ECANCELED);
        assert_int_equal(atomic_load(&k.calls), calls + 1);
        atomic_store(&k.flag, false);
        struct text t = {0};
        assert_int_equal(kvi_http_get(c, url("/version"), text_fn, &t, &res), 0);
        assert_int_equal(res.status, 200);
        kvi_http_client_free(c);
    }
    close(fd);

    /* headers arrived, the body stalls: the hook stops it too */
    struct staller st = {.quit = false};
    st.lfd = silent_listener(u, sizeof u);
    pthread_t sth;
    assert_int_equal(pthread_create(&sth, NULL, staller_main, &st), 0);
    struct text t = {0};
    struct body_canceller k = {.t = &t};
    struct kvi_http_client_options o;
    kvi_http_client_options_init(&o);
    o.proto = KVI_HTTP_CLIENT_H1;
    o.cancel = cancel_after_body;
    o.cancel_ud = &k;
    struct kvi_http_client *c = kvi_http_client_create(&o);
    struct kvi_http_result res;
    assert_int_equal(kvi_http_get(c, u, text_fn, &t, &res), -ECANCELED);
    assert_int_equal(k.trues, 1);
    assert_int_equal(res.status, 200);
    assert_string_equal(t.buf, "{\"a\":");
    kvi_http_client_free(c);
    atomic_store(&st.quit, true);
    pthread_join(sth, NULL);
    close(st.lfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streamed_body_every_protocol),
        cmocka_unit_test(test_post),
        cmocka_unit_test(test_status_errors),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_transport_errors),
        cmocka_unit_test(test_cancel_hook),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
