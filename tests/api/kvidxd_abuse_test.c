/* ctest-labels: integration */
/*
 * Cheap ways to hang kvidxd or grow it, against the real daemon (issue 18,
 * items 2, 3, 8 and 13): each limit holds, answers or closes as documented
 * (tests/README.md, "Bad input"), is counted in /metrics and logged, and leaves other
 * clients served.
 *
 *   1. test_rapid_reset: HEADERS + RST_STREAM pairs on one HTTP/2
 *      connection: past --h2-max-resets the connection gets GOAWAY
 *      (ENHANCE_YOUR_CALM) and is closed, with at most that many handlers
 *      run for it; a client resetting fewer streams keeps its connection;
 *      during repeated attacks another client's /query answers.
 *   2. test_zero_window: an HTTP/2 client that announces a zero stream
 *      window and asks for answers it can never take is closed once it has
 *      taken nothing for --idle-timeout-ms (not before), and what its
 *      answers held is given back.
 *   3. test_conn_output_limit / test_output_limit: unread answers past
 *      --http-conn-output-limit close their connection long before the
 *      idle timeout; past --http-output-limit other clients get a 503
 *      until the reader that holds the bytes is gone.
 *   4. test_conns_per_addr: past --max-conns-per-addr a connection from
 *      that address is closed at once; another address is served, and a
 *      freed slot serves again.
 *   5. test_accept_failures: kvidxd under `ulimit -n 64` with more clients
 *      than descriptors counts and logs the failed accepts, and serves
 *      again once they leave.
 *
 * Every wait polls a condition up to a deadline; time bounds here are lower
 * bounds (nothing closed too early) or generous upper ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>

#include "kvidxd_fixture.h"
#include "kvidxd_rawhttp.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* A metric that may be absent yet (a per-route count before the route's first request): 0. */
static long long metric0(const struct kfx_daemon *d, const char *name)
{
    long long v = kfx_metric(d, name);
    return v < 0 ? 0 : v;
}

/* A blocking TCP connection to 127.0.0.1:@p port from @p from (NULL: any local address). */
static int tcp_from(uint16_t port, const char *from)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (from != NULL) {
        struct sockaddr_in b = {.sin_family = AF_INET};
        assert_int_equal(inet_pton(AF_INET, from, &b.sin_addr), 1);
        if (bind(fd, (struct sockaddr *)&b, sizeof b) != 0)
            fail_msg("bind %s: %s", from, strerror(errno));
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        fail_msg("connect to %u: %s", port, strerror(errno));
    return fd;
}

/* One GET over HTTP/1.1 on @p fd (kept alive). @return the status, 0 when kvidxd closed first (r->eof). */
static int h1_get(int fd, const char *path, struct rh_raw *r)
{
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: kvidx\r\n\r\n", path);
    memset(r, 0, sizeof *r);
    int rc = rh_send_all(fd, req, (size_t)n, KFX_WAIT_MS);
    if (rc != 0) { /* EPIPE / ECONNRESET: kvidxd closed before the request went out */
        r->eof = rc == -EPIPE || rc == -ECONNRESET;
        return 0;
    }
    rh_raw_read(fd, r, KFX_WAIT_MS, rh_h1_complete);
    return rh_h1_complete(r) ? rh_h1_status(r) : 0;
}

/* ---- HTTP/2 by hand ------------------------------------------------------------------------- */

#define H2_SETTINGS_INITIAL_WINDOW_SIZE 4
#define H2_CANCEL 8
#define H2_ENHANCE_YOUR_CALM 11

/* Preface, SETTINGS (initial stream window @p window) and an ACK of the server's. */
static size_t h2_hello_window(uint8_t *out, uint32_t window)
{
    uint8_t set[6] = {0, H2_SETTINGS_INITIAL_WINDOW_SIZE, (uint8_t)(window >> 24), (uint8_t)(window >> 16),
                      (uint8_t)(window >> 8), (uint8_t)window};
    size_t o = strlen(H2_PREFACE);
    memcpy(out, H2_PREFACE, o);
    o += rh_h2_frame(out + o, H2_SETTINGS, 0, 0, set, sizeof set);
    o += rh_h2_frame(out + o, H2_SETTINGS, H2_ACK, 0, NULL, 0);
    return o;
}

/* A whole GET request on stream @p id. */
static size_t h2_get(uint8_t *out, uint32_t id, const char *path)
{
    uint8_t hb[256];
    size_t n = rh_hpack_request(hb, false, path, NULL, -1);
    return rh_h2_frame(out, H2_HEADERS, H2_END_HEADERS | H2_END_STREAM, id, hb, n);
}

/* The client's half of a rapid reset: @p pairs GETs of @p path, each cancelled at once. */
static size_t h2_reset_pairs(uint8_t *out, unsigned pairs, const char *path)
{
    size_t o = h2_hello_window(out, 65535);
    uint8_t code[4] = {0, 0, 0, H2_CANCEL};
    for (unsigned i = 0; i < pairs; i++) {
        o += h2_get(out + o, 2 * i + 1, path);
        o += rh_h2_frame(out + o, H2_RST, 0, 2 * i + 1, code, sizeof code);
    }
    return o;
}

/* ---- 1. rapid reset ------------------------------------------------------------------------- */

#define RESETS 100
#define WORKERS_GETS "dynamo_kvindexer_requests_total{endpoint=\"/workers\",method=\"GET\"}"

/* The attacker thread records what it saw; the main thread asserts (cmocka's checks are not thread-safe). */
struct attacker {
    uint16_t port;
    atomic_bool stop;
    atomic_int rounds, closed, goaways, connect_failures;
};

/* A TCP connection to 127.0.0.1:@p port, or -1 (no assertion: for threads). */
static int tcp_try(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void *attack_main(void *arg)
{
    struct attacker *a = arg;
    uint8_t *buf = malloc(64 * (RESETS + 50) + 256);
    size_t len = h2_reset_pairs(buf, RESETS + 50, "/workers");
    while (!atomic_load(&a->stop)) {
        int fd = tcp_try(a->port);
        if (fd < 0) {
            a->connect_failures++;
            kfx_nap(10);
            continue;
        }
        struct rh_raw r = {0};
        struct rh_h2_seen seen;
        rh_send_all(fd, buf, len, KFX_WAIT_MS);
        rh_raw_read(fd, &r, KFX_WAIT_MS, NULL);
        rh_h2_parse(&r, &seen);
        a->rounds++;
        a->closed += r.eof;
        a->goaways += seen.goaway && seen.goaway_code == H2_ENHANCE_YOUR_CALM;
        rh_raw_free(&r);
        close(fd);
    }
    free(buf);
    return NULL;
}

static void test_rapid_reset(void **state)
{
    (void)state;
    struct kfx_daemon d;
    char lim[16];
    snprintf(lim, sizeof lim, "%d", RESETS);
    const char *args[] = {"--h2-max-resets", lim, NULL};
    kfx_start(&d, args, NULL);
    uint8_t *buf = malloc(64 * 2 * RESETS + 256);

    /* Half the budget: nothing happens, the connection still answers. */
    int fd = rh_tcp_open(d.port, 0);
    size_t len = h2_reset_pairs(buf, RESETS / 2, "/workers");
    len += h2_get(buf + len, RESETS + 1, "/health");
    assert_int_equal(rh_send_all(fd, buf, len, KFX_WAIT_MS), 0);
    struct rh_raw r = {0};
    struct rh_h2_seen seen;
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    do {
        rh_raw_read(fd, &r, 50, NULL);
        rh_h2_parse(&r, &seen);
    } while (seen.headers_stream != RESETS + 1 && !r.eof && kfx_now_ms() < end);
    if (seen.headers_stream != RESETS + 1 || seen.goaway || r.eof)
        fail_msg("%d resets (limit %d): no answer on the same connection (goaway %d, closed %d)", RESETS / 2, RESETS,
                 seen.goaway, r.eof);
    rh_raw_free(&r);
    close(fd);

    /* Past it: GOAWAY ENHANCE_YOUR_CALM and the close, at most the budget's handlers run. */
    long long runs0 = metric0(&d, WORKERS_GETS);
    fd = rh_tcp_open(d.port, 0);
    /* 30 past the budget: room for a slow run's refill (10 a second), and little input left unread
     * when kvidxd closes (a close with unread input is a reset, which may cost the GOAWAY) */
    len = h2_reset_pairs(buf, RESETS + 30, "/workers");
    int64_t t0 = kfx_now_ms();
    int rc = rh_send_all(fd, buf, len, KFX_WAIT_MS);
    assert_true(rc == 0 || rc == -EPIPE || rc == -ECONNRESET);
    rh_raw_read(fd, &r, KFX_WAIT_MS, NULL);
    int64_t took = kfx_now_ms() - t0;
    rh_h2_parse(&r, &seen);
    if (!r.eof || !seen.goaway || seen.goaway_code != H2_ENHANCE_YOUR_CALM)
        fail_msg("%d resets (limit %d): closed %d, GOAWAY %d code %u", RESETS + 30, RESETS, r.eof, seen.goaway,
                 seen.goaway_code);
    rh_raw_free(&r);
    close(fd);
    /* the bucket refills RESETS per 10 s: a slow run may earn a few more */
    long long runs = metric0(&d, WORKERS_GETS) - runs0;
    long long most = RESETS + 1 + (RESETS * took) / 10000 + 1;
    if (runs < 1 || runs > most)
        fail_msg("%lld /workers handlers ran for the attack (at most %lld)", runs, most);
    assert_true(rh_metric(&d, "kvidx_http_h2_reset_floods_total") >= 1);
    assert_true(rh_metric(&d, "kvidx_http_h2_stream_resets_total") >= RESETS + RESETS / 2 + 1);
    assert_true(kfx_log_has(&d, "GOAWAY (ENHANCE_YOUR_CALM)", "--h2-max-resets", KFX_WAIT_MS));

    /* Repeated attacks from one client; another client's queries answer meanwhile. */
    struct attacker a = {.port = d.port};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, attack_main, &a), 0);
    /* at least 30 queries, and on until the attacker has done 3 rounds (a loaded machine may run
     * the main thread first; bounded) */
    int64_t until = kfx_now_ms() + KFX_WAIT_MS;
    for (int i = 0; i < 30 || (atomic_load(&a.rounds) < 3 && kfx_now_ms() < until); i++) {
        struct kfx_resp q;
        long s = kfx_post_json(&d, "/query", "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4]}", &q);
        if (s != 200 && s != 404)
            fail_msg("/query during the attack: %ld %s", s, q.body);
        kfx_resp_free(&q);
    }
    atomic_store(&a.stop, true);
    pthread_join(t, NULL);
    /* every round closed by kvidxd; its GOAWAY may be lost to the reset of a close with unread input */
    assert_true(atomic_load(&a.rounds) >= 3);
    assert_int_equal(atomic_load(&a.closed), atomic_load(&a.rounds));
    assert_true(atomic_load(&a.goaways) >= 1);
    assert_int_equal(atomic_load(&a.connect_failures), 0);
    free(buf);
    kfx_stop(&d, SIGTERM, NULL);
}

/* ---- 2. a client that never takes its answers ----------------------------------------------- */

#define STREAMS 40

/* Open an h2c connection with a zero stream window and ask for @p n answers of @p path. */
static int h2_never_reads(uint16_t port, unsigned n, const char *path)
{
    uint8_t buf[64 * STREAMS + 256];
    size_t len = h2_hello_window(buf, 0);
    for (unsigned i = 0; i < n; i++)
        len += h2_get(buf + len, 2 * i + 1, path);
    int fd = rh_tcp_open(port, 0);
    assert_int_equal(rh_send_all(fd, buf, len, KFX_WAIT_MS), 0);
    return fd;
}

static void test_zero_window(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--idle-timeout-ms", "1000", NULL};
    kfx_start(&d, args, NULL);
    int64_t t0 = kfx_now_ms();
    int fd = h2_never_reads(d.port, STREAMS, "/metrics");
    struct rh_raw r = {0};
    rh_raw_read(fd, &r, KFX_WAIT_MS, NULL); /* HEADERS frames come, DATA cannot */
    int64_t took = kfx_now_ms() - t0;
    struct rh_h2_seen seen;
    rh_h2_parse(&r, &seen);
    if (!r.eof)
        fail_msg("a zero-window client is still connected after %d ms (--idle-timeout-ms 1000)", KFX_WAIT_MS);
    if (took < 900) /* the loop clock counts whole milliseconds and is read once per loop turn */
        fail_msg("closed after %lld ms, before --idle-timeout-ms", (long long)took);
    assert_int_equal(seen.data, 0);
    rh_raw_free(&r);
    close(fd);
    assert_true(rh_metric(&d, "kvidx_http_write_timeouts_total") >= 1);
    /* what its answers held is given back */
    if (!KFX_WAIT(kfx_metric(&d, "kvidx_http_output_buffered_bytes") == 0, KFX_WAIT_MS))
        fail_msg("%lld unread answer bytes still held", kfx_metric(&d, "kvidx_http_output_buffered_bytes"));
    assert_true(kfx_log_has(&d, "took nothing of an answer", "--idle-timeout-ms", KFX_WAIT_MS));
    kfx_stop(&d, SIGTERM, NULL);
}

/* ---- 3. output budgets ---------------------------------------------------------------------- */

static void test_conn_output_limit(void **state)
{
    (void)state;
    struct kfx_daemon d;
    /* /metrics answers are about 25 kB: the third unread one is over 60 kB */
    const char *args[] = {"--http-conn-output-limit", "60000", NULL};
    kfx_start(&d, args, NULL);
    int fd = h2_never_reads(d.port, 10, "/metrics");
    struct rh_raw r = {0};
    rh_raw_read(fd, &r, KFX_WAIT_MS, NULL); /* idle timeout 60 s: only the limit closes it here */
    if (!r.eof)
        fail_msg("10 unread /metrics answers over --http-conn-output-limit 60000: still connected");
    rh_raw_free(&r);
    close(fd);
    long long closed = -1;
    if (!KFX_WAIT((closed = kfx_metric(&d, "kvidx_http_output_conn_closed_total")) >= 1, KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("the connection was closed, but kvidx_http_output_conn_closed_total is %lld", closed);
    }
    assert_true(kfx_log_has(&d, "unread answers reached", "--http-conn-output-limit", KFX_WAIT_MS));
    kfx_expect_get(&d, "/health", 200, NULL);
    kfx_stop(&d, SIGTERM, NULL);
}

static void test_output_limit(void **state)
{
    (void)state;
    struct kfx_daemon d;
    /* one loop thread: the whole limit is its share */
    const char *args[] = {"--http-threads", "1", "--http-output-limit", "150000", NULL};
    kfx_start(&d, args, NULL);
    /* Unread /metrics answers (about 25 kB + 4 kB each) until the share is spent, then 503s (4 kB
     * each, charged whatever the budget says): over 150 kB in all. */
    int hog = h2_never_reads(d.port, 16, "/metrics");
    int fd = tcp_from(d.port, NULL);
    struct rh_raw r;
    int st = 0;
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while ((st = h1_get(fd, "/health", &r)) == 200 && kfx_now_ms() < end) {
        rh_raw_free(&r);
        kfx_nap(10);
    }
    if (st != 503 || strstr(rh_h1_body(&r), "too many unread answers") == NULL)
        fail_msg("with 16 unread /metrics answers over --http-output-limit 150000, /health got %d %s", st,
                 r.buf ? r.buf : "");
    rh_raw_free(&r);
    assert_true(kfx_log_has(&d, "answered 503", "--http-output-limit", KFX_WAIT_MS));
    /* the reader that held them leaves: served again */
    close(hog);
    end = kfx_now_ms() + KFX_WAIT_MS;
    while ((st = h1_get(fd, "/health", &r)) == 503 && kfx_now_ms() < end) {
        rh_raw_free(&r);
        kfx_nap(10);
    }
    assert_int_equal(st, 200);
    rh_raw_free(&r);
    close(fd);
    assert_true(rh_metric(&d, "kvidx_http_output_refused_total") >= 1); /* /metrics itself was refused before */
    kfx_stop(&d, SIGTERM, NULL);
}

/* ---- 4. connections per client address ------------------------------------------------------ */

static void test_conns_per_addr(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--max-conns-per-addr", "3", NULL};
    kfx_start(&d, args, NULL);
    int fds[3];
    struct rh_raw r;
    for (int i = 0; i < 3; i++) {
        fds[i] = tcp_from(d.port, "127.0.0.1");
        assert_int_equal(h1_get(fds[i], "/health", &r), 200);
        rh_raw_free(&r);
    }
    /* a fourth from the same address: closed without an answer */
    int extra = tcp_from(d.port, "127.0.0.1");
    int st = h1_get(extra, "/health", &r);
    if (st != 0 || !r.eof)
        fail_msg("a fourth connection from 127.0.0.1 (limit 3) got %d, closed %d", st, r.eof);
    rh_raw_free(&r);
    close(extra);
    /* another address is served */
    int other = tcp_from(d.port, "127.0.0.2");
    assert_int_equal(h1_get(other, "/health", &r), 200);
    rh_raw_free(&r);
    close(other);
    assert_true(kfx_log_has(&d, "refused a connection from 127.0.0.1", "--max-conns-per-addr", KFX_WAIT_MS));
    /* a freed slot serves again (once kvidxd has seen the close) */
    close(fds[0]);
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    do {
        fds[0] = tcp_from(d.port, "127.0.0.1");
        st = h1_get(fds[0], "/health", &r);
        rh_raw_free(&r);
        if (st != 200) {
            close(fds[0]);
            kfx_nap(20);
        }
    } while (st != 200 && kfx_now_ms() < end);
    assert_int_equal(st, 200);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    /* counted (read over a connection of 127.0.0.1 once the slots are free again) */
    long long refused = -1;
    if (!KFX_WAIT((refused = kfx_metric(&d, "kvidx_http_connections_rejected_per_address_total")) >= 1, KFX_WAIT_MS))
        fail_msg("kvidx_http_connections_rejected_per_address_total is %lld", refused);
    kfx_stop(&d, SIGTERM, NULL);
}

/* ---- 5. accepts at the descriptor limit ----------------------------------------------------- */

#define FLOOD 96

static void test_accept_failures(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--log-level", "warn", NULL};
    int rc = kfx_start_nofile(&d, args, 64);
    if (rc != 0) {
        kfx_dump_log(&d);
        fail_msg("kvidxd under ulimit -n 64 did not start (%d)", rc);
    }
    /* more clients than kvidxd has descriptors: the kernel queues them, accept(2) fails */
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        fds[i] = tcp_from(d.port, NULL);
    bool logged = kfx_log_has(&d, "accept failed: Too many open files", NULL, KFX_WAIT_MS);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    if (!logged) {
        kfx_dump_log(&d);
        fail_msg("no 'accept failed' line with %d clients under ulimit -n 64", FLOOD);
    }
    /* accepting resumes once they are gone; the failures are counted */
    long long failed = -1;
    if (!KFX_WAIT((failed = kfx_metric(&d, "kvidx_http_accept_failures_total")) >= 1, KFX_WAIT_MS))
        fail_msg("kvidx_http_accept_failures_total is %lld", failed);
    kfx_expect_get(&d, "/health", 200, NULL);
    kfx_stop(&d, SIGTERM, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_rapid_reset, teardown),
        cmocka_unit_test_teardown(test_zero_window, teardown),
        cmocka_unit_test_teardown(test_conn_output_limit, teardown),
        cmocka_unit_test_teardown(test_output_limit, teardown),
        cmocka_unit_test_teardown(test_conns_per_addr, teardown),
        cmocka_unit_test_teardown(test_accept_failures, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
