/* ctest-labels: integration */
/*
 * The HTTP and load half of the fault matrix (issue 7 §3), against the real
 * kvidxd binary. Raw sockets (HTTP/1.1 bytes and HTTP/2 frames written by
 * hand) for what no well-behaved client sends, libcurl for the rest.
 *
 *   1. test_slow_clients: 10,000 idle TCP connections; a client sending its
 *      headers a byte at a time, one trickling a POST body, one trickling
 *      HTTP/2 DATA frames, one asking for a big /dump and never reading it
 *      (tiny receive buffer, full), one pipelining queries and never reading
 *      the answers. Meanwhile /query from other clients answers within a
 *      bounded latency, on kept-alive and on fresh HTTP/1.1 and h2c
 *      connections; when the slow clients leave, every connection is gone.
 *   2. test_idle_timeouts: what --idle-timeout-ms closes and when: an idle
 *      connection, a partial request line, a slowloris, a trickled body, a
 *      chunked body that never ends, a short Content-Length, an idle
 *      keep-alive connection, HTTP/2 idle and HTTP/2 with a truncated frame
 *      or a trickled stream (cut at twice the timeout), and a /dump nobody
 *      reads (cut once kvidxd's stream took nothing for the timeout: the
 *      thread writing it is released, and a /register issued meanwhile
 *      completes within the timeout).
 *      test_connection_cap: over --max-connections a connection is accepted
 *      and closed at once; a freed slot serves again.
 *   3. test_bad_http1: bodies over both limits (with Content-Length and
 *      chunked), wrong Content-Type, invalid JSON and msgpack in both
 *      dialects, invalid request lines and headers: each gets a clear error
 *      (status and error body in the dialect's format) or a closed
 *      connection; the index, the registrations and a kept-alive client are
 *      unaffected.
 *   4. test_bad_http2: the same over HTTP/2 (curl h2c), plus a frame over
 *      the maximum size, garbage after the preface, broken HPACK and a stream
 *      over the largest body limit: GOAWAY or RST_STREAM as the protocol
 *      says, nothing else affected.
 *   5. test_10k_workers_memory: 10,000 workers registered over /register
 *      (fewer under a hard descriptor limit below 32,000: 3 per worker)
 *      (100 of them holding blocks from a real publisher, the others on an
 *      endpoint nobody publishes on) and unregistered, twice: every listener
 *      active, descriptors back to where they were, and, with jemalloc, RSS
 *      given back after the warm-up round and within 10 % of that baseline
 *      after the second.
 *
 * Every wait polls a condition up to a deadline. Latency bounds hold under
 * ASan on a loaded 2-core machine; a stalled event loop misses them by far.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <sys/ioctl.h>

#include "kvidxd_fixture.h"
#include "kvidxd_rawhttp.h"

static bool verbose(void)
{
    return getenv("KVI_TEST_VERBOSE") != NULL;
}

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* ---- a worker with blocks ------------------------------------------------------------------------------- */

static void dyn_register_pub(const struct kfx_daemon *d, uint64_t id, const char *model, struct kvidx_pub *p)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"model_name\":\"%s\",\"block_size\":%d,\"endpoint\":\"%s\","
             "\"replay_endpoint\":\"%s\"}",
             (unsigned long long)id, model, KFX_BS, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
    kfx_expect(d, "/register", j, 201, "{\"status\":\"ok\"}");
}

/* The Dynamo answer's score map for instance 1 holding n blocks of the query. */
static void want_score(char *out, size_t cap, unsigned n_blocks)
{
    snprintf(out, cap, "\"scores\":{\"1\":{\"0\":%u}}", n_blocks * KFX_BS);
}

/* =========================================================================================== */
/* 1. slow clients and 10,000 idle connections                                                 */
/* =========================================================================================== */

#define IDLE_CONNS 10000
#define DUMP_CHAINS 160  /* x 256 blocks: a /dump of about 9 MB, far over what the sockets buffer */
#define DUMP_DEPTH 256
#define N_SLOW 5
_Static_assert(N_SLOW <= RH_SLOW_MAX, "slow_thread drives them in one rh_slow_run");
#define WINDOW_MS 3000   /* how long the queries run against the slow clients */
/*
 * Latency bounds. A loop that a slow client could stall shows up as many slow
 * queries (each waits for a drip period), or as one that waits as long as the
 * client is slow (seconds, up to curl's 20 s timeout). A test machine shared
 * with builds stalls now and then on its own (once 1.65 s, on a kept-alive
 * connection, with CPU pressure at 98 %): a few outliers are allowed, none
 * past Q_MAX_MS.
 */
#define Q_P99_MS 50
#define Q_SLOW_MS 250    /* at most Q_SLOW_ALLOWED queries over this */
#define Q_SLOW_ALLOWED 3
#define Q_MAX_MS 2500

/* Test 1's clients, at file scope so that the teardown can stop them after a failure. */
static struct {
    struct rh_slow s[N_SLOW];
    atomic_bool stop;
    atomic_int run_rc; /* the client thread's rh_slow_run result: it records, the main thread asserts */
    bool running;
    pthread_t th;
    int idle[IDLE_CONNS];
    int n_idle;
} t1;

static void *slow_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&t1.stop)) {
        int rc = rh_slow_run(t1.s, N_SLOW, 50);
        if (rc != 0) {
            atomic_store(&t1.run_rc, rc);
            break;
        }
    }
    return NULL;
}

static void t1_stop_clients(void)
{
    if (t1.running) {
        atomic_store(&t1.stop, true);
        pthread_join(t1.th, NULL);
        t1.running = false;
    }
}

static void t1_close_all(void)
{
    t1_stop_clients();
    rh_slow_close_all(t1.s, N_SLOW);
    for (int i = 0; i < t1.n_idle; i++)
        close(t1.idle[i]);
    t1.n_idle = 0;
}

static int teardown_slow(void **state)
{
    t1_close_all();
    return teardown(state);
}

static void test_slow_clients(void **state)
{
    (void)state;
    struct kfx_daemon d;
    /* every client here is 127.0.0.1: lift the per-address limit (kvidxd_abuse_test covers it) */
    const char *args[] = {"--idle-timeout-ms", "60000", "--max-conns-per-addr", "0", NULL};
    if (rh_nofile_hard() < IDLE_CONNS + 1024) {
        print_message("the hard RLIMIT_NOFILE (%llu) is too low for %d connections\n",
                      (unsigned long long)rh_nofile_hard(), IDLE_CONNS);
        skip();
    }
    rh_start_low_nofile(&d, args);
    /* kvidxd raised its own soft limit, from 1,024 to the hard limit (capped at 2^20) */
    long long soft = rh_nofile_soft_of(d.pid);
    if (soft < (long long)KVI_MIN(rh_nofile_hard(), (rlim_t)1 << 20))
        fail_msg("kvidxd's soft RLIMIT_NOFILE is %lld (hard %llu)", soft, (unsigned long long)rh_nofile_hard());

    /* an index whose /dump is far larger than every buffer between kvidxd and a client */
    struct kvidx_pub *p = kfx_pub(0);
    dyn_register_pub(&d, 1, "m", p);
    for (uint32_t c = 0; c < DUMP_CHAINS; c++)
        kfx_publish(p, c, 0, DUMP_DEPTH, NULL);
    char want[128];
    want_score(want, sizeof want, 16);
    char *qlast = kfx_query_json("m", DUMP_CHAINS - 1, 16);
    kfx_until_query(&d, "/query", qlast, want, &p, 1);
    free(qlast);
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_index_holdings{model=\"m\",tenant=\"default\"}") ==
                             (long long)DUMP_CHAINS * DUMP_DEPTH,
                         KFX_WAIT_MS));

    /* 10,000 idle connections */
    int64_t t0 = kfx_now_ms();
    for (t1.n_idle = 0; t1.n_idle < IDLE_CONNS; t1.n_idle++)
        t1.idle[t1.n_idle] = rh_tcp_open(d.port, 0);
    if (!KFX_WAIT(kfx_metric(&d, "kvidx_http_connections_open") >= IDLE_CONNS, KFX_WAIT_MS))
        fail_msg("kvidxd holds %lld connections, want %d", kfx_metric(&d, "kvidx_http_connections_open"),
                 IDLE_CONNS);
    assert_int_equal(rh_metric(&d, "kvidx_http_connections_rejected_total"), 0);
    if (verbose())
        print_message("%d idle connections open in %lld ms; kvidxd holds %d descriptors\n", IDLE_CONNS,
                      (long long)(kfx_now_ms() - t0), rh_fd_count(d.pid));

    /* the slow clients */
    static const char hdr[] = "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                              "Content-Length: 100000\r\n\r\n";
    static const char trickle_hdr[] = "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                                      "Content-Length: 1000000\r\n\r\n[";
    static uint8_t spaces[1000000];
    memset(spaces, ' ', sizeof spaces);
    /* HTTP/2: a POST stream announcing 100,000 bytes, fed one-byte DATA frames */
    static uint8_t h2pre[512], h2drip[20000 * 10];
    uint8_t hb[256];
    size_t h2n = rh_h2_hello(h2pre);
    size_t hbn = rh_hpack_request(hb, true, "/query", "application/json", 100000);
    h2n += rh_h2_frame(h2pre + h2n, H2_HEADERS, H2_END_HEADERS, 1, hb, hbn);
    for (size_t i = 0; i < sizeof h2drip / 10; i++)
        rh_h2_frame(h2drip + 10 * i, H2_DATA, 0, 1, " ", 1);
    /* pipelined queries whose answers are never read */
    static char pipe_req[400 * 1024];
    char *q16 = kfx_query_json("m", 0, 16);
    size_t qlen = strlen(q16), pipe_len = 0;
    for (int i = 0; i < 400; i++)
        pipe_len += (size_t)snprintf(pipe_req + pipe_len, sizeof pipe_req - pipe_len,
                                     "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                                     "Content-Length: %zu\r\n\r\n%s",
                                     qlen, q16);
    assert_true(pipe_len < sizeof pipe_req - 1);
    free(q16);
    static const char dump_req[] = "GET /dump HTTP/1.1\r\nHost: kvidx\r\n\r\n";

    struct rh_slow *s = t1.s;
    rh_slow_open(&s[0], "headers a byte at a time", d.port, 0, NULL, 0, hdr, strlen(hdr), 1, 20, false);
    rh_slow_open(&s[1], "body at a trickle", d.port, 0, trickle_hdr, strlen(trickle_hdr), spaces, sizeof spaces, 16, 20,
                 false);
    rh_slow_open(&s[2], "HTTP/2 DATA at a trickle", d.port, 0, h2pre, h2n, h2drip, sizeof h2drip, 10, 20, false);
    rh_slow_open(&s[3], "/dump never read", d.port, 2048, dump_req, strlen(dump_req), NULL, 0, 0, 20, true);
    rh_slow_open(&s[4], "pipelined queries never read", d.port, 2048, NULL, 0, pipe_req, pipe_len, 16384, 5, true);
    atomic_store(&t1.stop, false);
    atomic_store(&t1.run_rc, 0);
    assert_int_equal(pthread_create(&t1.th, NULL, slow_thread, NULL), 0);
    t1.running = true;

    /* the /dump client is stalled: kvidxd filled its receive buffer and keeps the request open */
    int inq = 0;
    if (!KFX_WAIT(ioctl(s[3].fd, FIONREAD, &inq) == 0 && inq > 0 &&
                      kfx_metric(&d, "kvidx_http_requests_in_flight") >= 1,
                  KFX_WAIT_MS))
        fail_msg("the /dump client never got its first bytes");

    /* queries of other clients: kept-alive HTTP/1.1, and every 8th on a fresh HTTP/1.1 or h2c connection */
    struct rh_keep k;
    rh_keep_init(&k, &d, KFX_H1);
    size_t cap = 200000, n = 0, fresh = 0, n_slow = 0;
    int64_t *lat = malloc(cap * sizeof *lat), worst = 0, worst_at = 0, worst_fresh = 0;
    int64_t w0 = kfx_now_ms(), end = w0 + WINDOW_MS;
    for (uint32_t i = 0; kfx_now_ms() < end && n < cap; i++) {
        char *q = kfx_query_json("m", i % DUMP_CHAINS, 16);
        bool is_fresh = i % 8 == 7;
        int64_t a = rh_now_us();
        long st;
        const char *body;
        struct kfx_resp r = {0};
        if (is_fresh) {
            const char *h[] = {"Content-Type: application/json", NULL};
            st = kfx_http(&d, (i / 8) % 2 ? KFX_H2C : KFX_H1, "POST", "/query", h, q, strlen(q), &r);
            body = r.body;
            fresh++;
        } else {
            st = rh_keep_req(&k, "/query", q);
            body = k.r.body;
        }
        int64_t us = rh_now_us() - a;
        if (st != 200 || strstr(body, want) == NULL)
            fail_msg("query %u after %lld ms: %ld %.300s", i, (long long)(kfx_now_ms() - w0), st, body);
        kfx_resp_free(&r);
        free(q);
        lat[n++] = us;
        n_slow += us > Q_SLOW_MS * 1000;
        if (us > worst) {
            worst = us;
            worst_at = kfx_now_ms() - w0;
        }
        if (is_fresh)
            worst_fresh = KVI_MAX(worst_fresh, us);
    }
    int64_t p50 = rh_pct(lat, n, 0.50), p99 = rh_pct(lat, n, 0.99);
    print_message("%zu queries (%zu on fresh connections) against %d idle connections and %d slow clients: "
                  "p50 %.2f ms, p99 %.2f ms, max %.2f ms %lld ms into the window (fresh max %.2f ms), "
                  "%zu over %d ms\n",
                  n, fresh, IDLE_CONNS, N_SLOW, p50 / 1e3, p99 / 1e3, worst / 1e3, (long long)worst_at,
                  worst_fresh / 1e3, n_slow, Q_SLOW_MS);
    if (p99 > Q_P99_MS * 1000 || n_slow > Q_SLOW_ALLOWED || worst > Q_MAX_MS * 1000)
        fail_msg("queries stalled: p99 %.2f ms, %zu over %d ms, max %.2f ms", p99 / 1e3, n_slow, Q_SLOW_MS,
                 worst / 1e3);
    assert_true(n >= 200);
    free(lat);
    rh_keep_free(&k);

    t1_stop_clients();
    assert_int_equal(atomic_load(&t1.run_rc), 0); /* recorded by the client thread */
    /* still there: within the 60 s timeout nobody was cut, and no partial request was answered */
    for (int i = 0; i < N_SLOW; i++) {
        if (verbose())
            print_message("%s: sent %zu bytes, got %zu, %s\n", s[i].name, s[i].off, s[i].got,
                          s[i].closed_at < 0 ? "open" : "closed");
        if (s[i].closed_at >= 0)
            fail_msg("%s was closed after %lld ms", s[i].name, (long long)s[i].closed_at);
    }
    assert_int_equal(s[0].got, 0);
    assert_int_equal(s[1].got, 0);
    assert_true(s[2].off > 100 && s[4].off > 0);

    /* everyone leaves: kvidxd lets go of every connection */
    t1_close_all();
    if (!KFX_WAIT(kfx_metric(&d, "kvidx_http_connections_open") <= 2, KFX_WAIT_MS))
        fail_msg("%lld connections still open", kfx_metric(&d, "kvidx_http_connections_open"));
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_http_requests_in_flight") <= 1, KFX_WAIT_MS));
    /* the control plane is free again (the /dump writer was released when its client left) */
    struct kvidx_pub *p2 = kfx_pub(0);
    dyn_register_pub(&d, 2, "m", p2);
    kfx_publish(p2, DUMP_CHAINS, 0, 8, NULL);
    char *qn = kfx_query_json("m", DUMP_CHAINS, 8);
    kfx_until_query(&d, "/query", qn, "\"scores\":{\"2\":{\"0\":32}}", &p2, 1);
    free(qn);
    /* and /dump serves the next client whole */
    struct kfx_resp r;
    assert_int_equal(kfx_get(&d, "/dump", &r), 200);
    assert_true(r.len > 4u << 20);
    assert_non_null(strstr(r.body + r.len - 64, "]}}"));
    kfx_resp_free(&r);

    kvidx_pub_destroy(p);
    kvidx_pub_destroy(p2);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* =========================================================================================== */
/* 2. what --idle-timeout-ms closes, and when                                                  */
/* =========================================================================================== */

#define IDLE_MS 1500
#define CLOSE_SLACK_MS 3000 /* ASan on a loaded machine: the 1 s timer wheel plus scheduling */

/* Populate worker 1 (publisher p) with a /dump far larger than the socket buffers. */
static void big_index(struct kfx_daemon *d, struct kvidx_pub *p, uint32_t chains)
{
    dyn_register_pub(d, 1, "m", p);
    for (uint32_t c = 0; c < chains; c++)
        kfx_publish(p, c, 0, DUMP_DEPTH, NULL);
    char want[128];
    want_score(want, sizeof want, 16);
    char *q = kfx_query_json("m", chains - 1, 16);
    kfx_until_query(d, "/query", q, want, &p, 1);
    free(q);
    assert_true(KFX_WAIT(kfx_metric(d, "kvidx_index_holdings{model=\"m\",tenant=\"default\"}") ==
                             (long long)chains * DUMP_DEPTH,
                         KFX_WAIT_MS));
}

static void test_idle_timeouts(void **state)
{
    (void)state;
    struct kfx_daemon d;
    char ms[16];
    snprintf(ms, sizeof ms, "%d", IDLE_MS);
    const char *args[] = {"--idle-timeout-ms", ms, NULL};
    kfx_start(&d, args, NULL);
    struct kvidx_pub *p = kfx_pub(0);
    big_index(&d, p, DUMP_CHAINS);

    static const char post_hdr[] = "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                                   "Content-Length: 100000\r\n\r\n";
    static const char chunked[] = "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n";
    static const char short_cl[] = "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                                   "Content-Length: 100\r\n\r\n{\"model_na";
    static const char health[] = "GET /health HTTP/1.1\r\nHost: kvidx\r\n\r\n";
    static uint8_t spaces[4096];
    memset(spaces, ' ', sizeof spaces);
    uint8_t hello[128], trunc[256], h2post[512], hb[256], drip[10 * 400];
    size_t hello_n = rh_h2_hello(hello);
    memcpy(trunc, hello, hello_n);
    size_t trunc_n = hello_n;
    uint8_t junk[50] = {0};
    rh_h2_frame(trunc + trunc_n, H2_HEADERS, H2_END_HEADERS, 1, junk, sizeof junk);
    trunc_n += 9 + 10; /* the frame announces 50 bytes, 10 arrive */
    memcpy(h2post, hello, hello_n);
    size_t h2post_n = hello_n, hbn = rh_hpack_request(hb, true, "/query", "application/json", 100000);
    h2post_n += rh_h2_frame(h2post + h2post_n, H2_HEADERS, H2_END_HEADERS, 1, hb, hbn);
    for (size_t i = 0; i < 400; i++)
        rh_h2_frame(drip + 10 * i, H2_DATA, 0, 1, " ", 1);

    enum { N = 11 };
    struct rh_slow s[N];
    int64_t t0 = kfx_now_ms();
    rh_slow_open(&s[0], "idle connection", d.port, 0, NULL, 0, NULL, 0, 0, 50, false);
    rh_slow_open(&s[1], "partial request line", d.port, 0, "GET /heal", 9, NULL, 0, 0, 50, false);
    rh_slow_open(&s[2], "headers a byte every 50 ms", d.port, 0, NULL, 0, post_hdr, strlen(post_hdr), 1, 50, false);
    rh_slow_open(&s[3], "body 16 bytes every 50 ms", d.port, 0, post_hdr, strlen(post_hdr), spaces, sizeof spaces, 16,
                 50, false);
    rh_slow_open(&s[4], "chunked body that never ends", d.port, 0, chunked, strlen(chunked), NULL, 0, 0, 50, false);
    rh_slow_open(&s[5], "Content-Length 100, 10 bytes sent", d.port, 0, short_cl, strlen(short_cl), NULL, 0, 0, 50,
                 false);
    rh_slow_open(&s[6], "idle keep-alive after an answer", d.port, 0, health, strlen(health), NULL, 0, 0, 50, false);
    rh_slow_open(&s[7], "HTTP/2 idle after SETTINGS", d.port, 0, hello, hello_n, NULL, 0, 0, 50, false);
    rh_slow_open(&s[8], "HTTP/2 truncated frame", d.port, 0, trunc, trunc_n, NULL, 0, 0, 50, false);
    rh_slow_open(&s[9], "HTTP/2 DATA a byte every 50 ms", d.port, 0, h2post, h2post_n, drip, sizeof drip, 10, 50,
                 false);
    /* each closes within the timeout and its slack, dripping or not */
    for (int64_t end = kfx_now_ms() + 2 * IDLE_MS + CLOSE_SLACK_MS + 5000; kfx_now_ms() < end;) {
        assert_int_equal(rh_slow_run(s, N - 1, 50), 0);
        bool open = false;
        for (int i = 0; i < N - 1; i++)
            open |= s[i].closed_at < 0;
        if (!open)
            break;
    }
    /* the /dump client that never reads: the thread writing its body blocks on it */
    rh_slow_open(&s[10], "/dump never read", d.port, 2048, "GET /dump HTTP/1.1\r\nHost: kvidx\r\n\r\n", 35, NULL, 0, 0,
                 50, true);
    int inq = 0;
    if (!KFX_WAIT(ioctl(s[10].fd, FIONREAD, &inq) == 0 && inq > 0, KFX_WAIT_MS))
        fail_msg("the /dump client never got its first bytes");
    int64_t stalled = kfx_now_ms();

    /* a registration issued meanwhile completes within the timeout (even where it queues behind the dump) */
    struct kvidx_pub *p2 = kfx_pub(0);
    dyn_register_pub(&d, 2, "m", p2);
    int64_t reg_ms = kfx_now_ms() - stalled;
    if (reg_ms > IDLE_MS + CLOSE_SLACK_MS)
        fail_msg("/register waited %lld ms behind a /dump nobody reads", (long long)reg_ms);
    /* kvidxd lets go of the connection once its stream took nothing for the timeout (seen from the server:
     * the client cannot tell without reading, and reading would let the dump go on) */
    if (!KFX_WAIT(kfx_metric(&d, "kvidx_http_connections_open") <= 1, KFX_WAIT_MS))
        fail_msg("the /dump that nobody reads was not cut");
    s[10].closed_at = kfx_now_ms() - s[10].start;
    int64_t cut_ms = kfx_now_ms() - stalled;
    /* what it got is a cut answer: no last chunk */
    struct rh_raw dr = {0};
    rh_raw_read(s[10].fd, &dr, KFX_WAIT_MS, NULL);
    if (!dr.eof || (dr.len >= 5 && memcmp(dr.buf + dr.len - 5, "0\r\n\r\n", 5) == 0))
        fail_msg("the /dump nobody read was %s (%zu bytes)", dr.eof ? "completed" : "kept open", dr.len);
    rh_raw_free(&dr);
    /* ingest and /dump work again */
    kfx_publish(p2, DUMP_CHAINS, 0, 8, NULL);
    char *qn = kfx_query_json("m", DUMP_CHAINS, 8);
    kfx_until_query(&d, "/query", qn, "\"scores\":{\"2\":{\"0\":32}}", &p2, 1);
    free(qn);

    for (int i = 0; i < N; i++) {
        if (verbose())
            print_message("%-36s closed after %5lld ms, got %zu bytes%s%.12s\n", s[i].name, (long long)s[i].closed_at,
                          s[i].got, s[i].got ? ": " : "", s[i].got ? s[i].first : "");
        if (s[i].closed_at < 0)
            fail_msg("%s: still open %lld ms after it started", s[i].name, (long long)(kfx_now_ms() - s[i].start));
        /* h2o resets its HTTP/2 idle timer on every frame: kvidx's reaper cuts the trickled stream at 2 T */
        int64_t want = i == 9 ? 2 * IDLE_MS : IDLE_MS;
        if (s[i].closed_at < want - 300 || s[i].closed_at > want + IDLE_MS / 4 + CLOSE_SLACK_MS + (i == 10 ? 2000 : 0))
            fail_msg("%s closed after %lld ms, want about %lld ms (the idle timeout is %d ms)", s[i].name,
                     (long long)s[i].closed_at, (long long)want, IDLE_MS);
    }
    /* no answer to what never became a whole request; the kept-alive one got its 200 */
    for (int i = 0; i < 6; i++)
        if (s[i].got != 0)
            fail_msg("%s got an answer: %.40s", s[i].name, s[i].first);
    assert_memory_equal(s[6].first, "HTTP/1.1 200", 12);
    rh_slow_close_all(s, N);
    if (verbose())
        print_message("timeouts checked in %lld ms; /register during the stalled /dump took %lld ms, the cut came "
                      "%lld ms after the stall\n",
                      (long long)(kfx_now_ms() - t0), (long long)reg_ms, (long long)cut_ms);
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_http_connections_open") <= 1, KFX_WAIT_MS));
    kvidx_pub_destroy(p);
    kvidx_pub_destroy(p2);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/*
 * The connection cap: over --max-connections kvidxd accepts and closes at
 * once (counted), idle connections hold their slots until they time out, and
 * a slot freed is usable again.
 */
static void test_connection_cap(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--max-connections", "8", NULL};
    kfx_start(&d, args, NULL);
    struct rh_keep k;
    rh_keep_init(&k, &d, KFX_H1);
    assert_int_equal(rh_keep_req(&k, "/health", NULL), 200); /* slot 1 */
    int idle[7];
    for (int i = 0; i < 7; i++)
        idle[i] = rh_tcp_open(d.port, 0);
    assert_true(KFX_WAIT(rh_keep_req(&k, "/metrics", NULL) == 200 &&
                                     strstr(k.r.body, "\nkvidx_http_connections_open 8\n") != NULL,
                                     KFX_WAIT_MS));
    /* the 9th: accepted and closed without a byte */
    int extra = rh_tcp_open(d.port, 0);
    struct rh_raw r = {0};
    rh_raw_read(extra, &r, KFX_WAIT_MS, NULL);
    if (!r.eof || r.len != 0)
        fail_msg("a connection over the cap: %s, %zu bytes", r.eof ? "closed" : "open", r.len);
    close(extra);
    rh_raw_free(&r);
    assert_int_equal(rh_keep_req(&k, "/metrics", NULL), 200);
    assert_non_null(strstr(k.r.body, "\nkvidx_http_connections_rejected_total 1\n"));
    /* one idle client leaves: a new client gets its slot */
    close(idle[0]);
    assert_true(KFX_WAIT(rh_keep_req(&k, "/metrics", NULL) == 200 &&
                                     strstr(k.r.body, "\nkvidx_http_connections_open 7\n") != NULL,
                                     KFX_WAIT_MS));
    kfx_expect_get(&d, "/health", 200, "");
    for (int i = 1; i < 7; i++)
        close(idle[i]);
    rh_keep_free(&k);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* =========================================================================================== */
/* 3. and 4. malformed requests                                                                */
/* =========================================================================================== */

/* Everything a client can see of kvidxd's state. */
/* Drop a listener's liveness keys from a /workers body, in place (messages
 * and seconds since the last one move with time and heartbeats, not with the
 * state a fault could change). */
static void strip_liveness(char *body)
{
    char *at;
    while ((at = strstr(body, ",\"messages\":")) != NULL) {
        char *c = strstr(at, "\"connected\":");
        if (c == NULL)
            break;
        c += strlen("\"connected\":");
        while (*c != '\0' && *c != '}' && *c != ',')
            c++;
        memmove(at, c, strlen(c) + 1);
    }
}

static char *snapshot(const struct kfx_daemon *d)
{
    static const char *const paths[] = {"/dump", "/workers", "/services", "/global_view", "/peers"};
    size_t len = 0;
    char *out = calloc(1, 1);
    for (size_t i = 0; i < KVI_ARRAY_LEN(paths); i++) {
        struct kfx_resp r;
        if (kfx_get(d, paths[i], &r) != 200)
            fail_msg("GET %s: %ld", paths[i], r.status);
        if (strcmp(paths[i], "/workers") == 0)
            strip_liveness(r.body);
        r.len = strlen(r.body);
        out = realloc(out, len + r.len + strlen(paths[i]) + 3);
        len += (size_t)sprintf(out + len, "%s\n%s\n", paths[i], r.body);
        kfx_resp_free(&r);
    }
    static const char *const metrics[] = {"dynamo_kvindexer_workers", "dynamo_kvindexer_models",
                                          "kvidx_index_holdings{model=\"m\",tenant=\"default\"}",
                                          "kvidx_index_holdings{model=\"cm\",tenant=\"default\"}",
                                          "kvidx_conductor_services"};
    for (size_t i = 0; i < KVI_ARRAY_LEN(metrics); i++) {
        out = realloc(out, len + strlen(metrics[i]) + 32);
        len += (size_t)sprintf(out + len, "%s %lld\n", metrics[i], rh_metric(d, metrics[i]));
    }
    return out;
}

/* The state the malformed-request tests start from: a Dynamo and a Conductor worker with blocks. */
struct bad_env {
    struct kfx_daemon d;
    struct kvidx_pub *p1, *p2;
    char *before;
    int keep_fd; /* a kept-alive HTTP/1.1 connection opened before the faults */
};

static void keep_alive_health(int fd)
{
    static const char health[] = "GET /health HTTP/1.1\r\nHost: kvidx\r\n\r\n";
    struct rh_raw r = {0};
    assert_int_equal(rh_send_all(fd, health, strlen(health), 5000), 0);
    rh_raw_read(fd, &r, KFX_WAIT_MS, rh_h1_complete);
    if (rh_h1_status(&r) != 200 || r.eof)
        fail_msg("kept-alive client: %.100s%s", r.buf, r.eof ? " (closed)" : "");
    rh_raw_free(&r);
}

static void bad_env_up(struct bad_env *e)
{
    kfx_start(&e->d, NULL, NULL);
    e->p1 = kfx_pub(0);
    e->p2 = kfx_pub(0);
    dyn_register_pub(&e->d, 1, "m", e->p1);
    char j[512];
    snprintf(j, sizeof j,
             "{\"type\":\"vLLM\",\"modelname\":\"cm\",\"instance_id\":\"c1\",\"block_size\":%d,\"dp_rank\":0,"
             "\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\"}",
             KFX_BS, kvidx_pub_endpoint(e->p2), kvidx_pub_replay_endpoint(e->p2));
    kfx_expect(&e->d, "/register", j, 200, "{\"status\":\"registered successfully\",\"instance_id\":\"c1\"}\n");
    kfx_publish(e->p1, 0, 0, 8, NULL);
    kfx_publish(e->p2, 1, 0, 6, NULL);
    char *q = kfx_query_json("m", 0, 8);
    kfx_until_query(&e->d, "/query", q, "\"scores\":{\"1\":{\"0\":32}}", &e->p1, 1);
    free(q);
    /* the Conductor worker joined late too: nudge until its gap is replayed */
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while (kfx_metric(&e->d, "kvidx_index_holdings{model=\"cm\",tenant=\"default\"}") != 6 && kfx_now_ms() < end) {
        uint64_t seq;
        kvidx_pub_flush_empty(e->p2, &seq);
        kfx_nap(50);
    }
    assert_int_equal(kfx_metric(&e->d, "kvidx_index_holdings{model=\"cm\",tenant=\"default\"}"), 6);
    e->before = snapshot(&e->d);
    e->keep_fd = rh_tcp_open(e->d.port, 0);
    keep_alive_health(e->keep_fd);
}

/* Nothing changed, the kept-alive client is still served, every faulty connection is gone. */
static void bad_env_down(struct bad_env *e)
{
    keep_alive_health(e->keep_fd);
    char *after = snapshot(&e->d);
    if (strcmp(e->before, after) != 0)
        fail_msg("state changed:\n--- before\n%s\n--- after\n%s", e->before, after);
    free(after);
    if (!KFX_WAIT(kfx_metric(&e->d, "kvidx_http_connections_open") <= 2, KFX_WAIT_MS))
        fail_msg("%lld connections still open", kfx_metric(&e->d, "kvidx_http_connections_open"));
    close(e->keep_fd);
    free(e->before);
    kvidx_pub_destroy(e->p1);
    kvidx_pub_destroy(e->p2);
    assert_int_equal(kfx_stop(&e->d, SIGTERM, NULL), 0);
}

/* Send @p req (head and body) on a fresh connection; read the answer, then whether kvidxd closes. */
static void h1_exchange_to(uint16_t port, const void *head, size_t head_len, const void *body, size_t body_len,
                           struct rh_raw *r, bool to_close);

static void h1_exchange(uint16_t port, const void *head, size_t head_len, const void *body, size_t body_len,
                        struct rh_raw *r)
{
    h1_exchange_to(port, head, head_len, body, body_len, r, false);
}

/* As h1_exchange; @p to_close: read everything until kvidxd closes (several answers). */
static void h1_exchange_to(uint16_t port, const void *head, size_t head_len, const void *body, size_t body_len,
                           struct rh_raw *r, bool to_close)
{
    memset(r, 0, sizeof *r);
    int fd = rh_tcp_open(port, 0);
    int rc = rh_send_all(fd, head, head_len, 10000);
    if (rc == 0 && body_len != 0)
        rh_send_all(fd, body, body_len, 10000); /* kvidxd may answer and close before it is all sent */
    rh_raw_read(fd, r, KFX_WAIT_MS, to_close ? NULL : rh_h1_complete);
    if (!r->eof) { /* after the answer: closed, or kept alive (nothing more within 300 ms) */
        size_t had = r->len;
        rh_raw_read(fd, r, 300, NULL);
        assert_int_equal(r->len, had);
    }
    close(fd);
}

/* A whole answer with @p status, Content-Type @p ctype and a body containing @p needle. */
static void expect_h1(const char *what, const struct rh_raw *r, int status, const char *ctype, const char *needle)
{
    char ct[128] = "";
    rh_h1_header(r, "content-type", ct, sizeof ct);
    if (!rh_h1_complete(r) || rh_h1_status(r) != status || strcmp(ct, ctype) != 0 ||
                        (needle != NULL && strstr(rh_h1_body(r), needle) == NULL))
        fail_msg("%s: got [%.300s]%s; want %d %s with %s", what, r->buf ? r->buf : "", r->eof ? " (closed)" : "",
                 status, ctype, needle ? needle : "(any body)");
    if (verbose())
        print_message("%-44s -> %d %.90s%s\n", what, status, rh_h1_body(r), r->eof ? " (closed)" : "");
}

/* A JSON error body {"error":"..."}: whole and well formed enough for a JSON client. */
static void expect_h1_json_error(const char *what, const struct rh_raw *r, int status, const char *needle)
{
    expect_h1(what, r, status, "application/json", needle);
    const char *b = rh_h1_body(r);
    size_t n = strlen(b);
    if (strncmp(b, "{\"error\":\"", 10) != 0 || n < 12 || strcmp(b + n - 2, "\"}") != 0)
        fail_msg("%s: not a JSON error body: %s", what, b);
}

/* A whole error answer with @p status: h2o's canned text/plain one or kvidx's JSON one; closed or kept open. */
static void expect_h1_broken(const char *what, const struct rh_raw *r, int status, bool json, bool closes)
{
    if (json)
        expect_h1_json_error(what, r, status, NULL);
    else
        expect_h1(what, r, status, "text/plain; charset=utf-8", "Bad Request");
    if (r->eof != closes)
        fail_msg("%s: the connection was %s", what, r->eof ? "closed" : "kept open");
}

static void post_h1(struct bad_env *e, const char *path, const char *ctype, const void *body, size_t len,
                    struct rh_raw *r)
{
    char head[512];
    int n = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: kvidx\r\n%s%s%sContent-Length: %zu\r\n\r\n", path,
                     ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "", len);
    h1_exchange(e->d.port, head, (size_t)n, body, len, r);
}

static void test_bad_http1(void **state)
{
    (void)state;
    struct bad_env e;
    bad_env_up(&e);
    struct rh_raw r;
    const char *json = "application/json", *mp = "application/msgpack";

    /* ---- bodies over the limits ---- */
    size_t big = (8u << 20) + 4096;
    char *b = malloc(big);
    memset(b, ' ', big);
    /* over /register's 2 MiB, under the 8 MiB h2o reads: read whole, then 413 */
    post_h1(&e, "/register", json, b, (2u << 20) + 1, &r);
    expect_h1_json_error("/register, 2 MiB + 1", &r, 413, "over the 2097152-byte limit of /register");
    rh_raw_free(&r);
    post_h1(&e, "/query_by_hash", json, b, 3u << 20, &r);
    expect_h1_json_error("/query_by_hash, 3 MiB", &r, 413, "limit of /query_by_hash");
    rh_raw_free(&r);
    /* over the largest limit: answered from the headers, the body is never read */
    const char *huge[] = {"POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                          "Content-Length: 8388609\r\n\r\n",
                          "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                          "Content-Length: 1000000000000\r\n\r\n"};
    for (int i = 0; i < 2; i++) {
        h1_exchange(e.d.port, huge[i], strlen(huge[i]), NULL, 0, &r);
        expect_h1_json_error(i ? "/query, Content-Length 10^12" : "/query, Content-Length 8 MiB + 1", &r, 413,
                             NULL);
        rh_raw_free(&r);
    }
    /* chunked: over 8 MiB in 64 KiB chunks, and 3 MiB on /register */
    for (int i = 0; i < 2; i++) {
        size_t total = i ? 3u << 20 : big, chunk = 65536, o = 0;
        char *cb = malloc(total + (total / chunk + 1) * 16 + 64);
        for (size_t done = 0; done < total; done += chunk) {
            size_t k = KVI_MIN(chunk, total - done);
            o += (size_t)sprintf(cb + o, "%zx\r\n", k);
            memset(cb + o, ' ', k);
            o += k;
            o += (size_t)sprintf(cb + o, "\r\n");
        }
        o += (size_t)sprintf(cb + o, "0\r\n\r\n");
        char head[256];
        int n = snprintf(head, sizeof head,
                         "POST %s HTTP/1.1\r\nHost: kvidx\r\nContent-Type: application/json\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n",
                         i ? "/register" : "/query");
        h1_exchange(e.d.port, head, (size_t)n, cb, o, &r);
        expect_h1_json_error(i ? "/register, chunked 3 MiB" : "/query, chunked 8 MiB + 4 KiB", &r, 413, NULL);
        rh_raw_free(&r);
        free(cb);
    }
    free(b);

    /* ---- Content-Type ---- */
    const char *q = "{\"model_name\":\"m\",\"token_ids\":[1,2,3,4]}";
    post_h1(&e, "/query", "text/plain", q, strlen(q), &r);
    expect_h1_json_error("Dynamo /query as text/plain", &r, 415, "Content-Type: application/json");
    rh_raw_free(&r);
    post_h1(&e, "/query", NULL, q, strlen(q), &r);
    expect_h1_json_error("Dynamo /query without Content-Type", &r, 415, NULL);
    rh_raw_free(&r);
    const char *reg = "{\"instance_id\":9,\"model_name\":\"m\",\"block_size\":4,\"endpoint\":\"tcp://127.0.0.1:9\"}";
    post_h1(&e, "/register", "application/x-www-form-urlencoded", reg, strlen(reg), &r);
    expect_h1_json_error("Dynamo /register as a form", &r, 415, NULL);
    rh_raw_free(&r);
    /* Conductor reads any Content-Type but msgpack as JSON (its JSON revisions checked none) */
    const char *cq = "{\"model\":\"cm\",\"block_size\":4,\"token_ids\":[1,2,3,4]}";
    post_h1(&e, "/query", "text/plain", cq, strlen(cq), &r);
    expect_h1("Conductor /query as text/plain", &r, 200, json, "\"c1\":{\"longest_matched\":0");
    rh_raw_free(&r);
    /* a JSON body labelled msgpack */
    post_h1(&e, "/query", mp, q, strlen(q), &r);
    if (rh_h1_status(&r) != 400)
        fail_msg("JSON labelled msgpack: %.200s", r.buf);
    rh_raw_free(&r);

    /* ---- invalid JSON and msgpack, both dialects ---- */
    const char *bad_json = "{\"model_name\":\"m\",\"token_ids\":[1,2,";
    post_h1(&e, "/query", json, bad_json, strlen(bad_json), &r);
    expect_h1_json_error("Dynamo /query, cut JSON", &r, 400, NULL);
    rh_raw_free(&r);
    const char *bad_reg = "{\"instance_id\":9,\"model_name\":\"m\",\"block_size\":4,\"endpoint\":}";
    post_h1(&e, "/register", json, bad_reg, strlen(bad_reg), &r);
    expect_h1_json_error("Dynamo /register, bad JSON", &r, 400, NULL);
    rh_raw_free(&r);
    const char *cbad = "{\"model\":\"cm\",\"block_size\":4,\"token_ids\":[1,";
    post_h1(&e, "/query", json, cbad, strlen(cbad), &r);
    expect_h1("Conductor /query, cut JSON", &r, 400, json, "\"reason\":\"invalid_json\"");
    rh_raw_free(&r);
    const char *creg = "{\"type\":\"vLLM\",\"modelname\":\"cm\",\"instance_id\":\"c9\",";
    post_h1(&e, "/register", json, creg, strlen(creg), &r);
    expect_h1("Conductor /register, cut JSON", &r, 400, json, "\"reason\":\"invalid_json\"");
    rh_raw_free(&r);
    static const uint8_t dyn_mp[] = {0x82, 0xaa, 'm', 'o', 'd', 'e', 'l', '_', 'n', 'a', 'm', 'e', 0xa1, 'm',
                                     0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0xdc, 0x00, 0x10, 0x01};
    post_h1(&e, "/query", mp, dyn_mp, sizeof dyn_mp, &r);
    expect_h1_json_error("Dynamo /query, cut msgpack", &r, 400, "msgpack");
    rh_raw_free(&r);
    static const uint8_t cond_mp[] = {0x82, 0xa5, 'm', 'o', 'd', 'e', 'l', 0xa2, 'c', 'm', 0xa9,
                                      't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0xdc, 0x00, 0x10, 0x01};
    post_h1(&e, "/query", mp, cond_mp, sizeof cond_mp, &r);
    expect_h1("Conductor /query, cut msgpack", &r, 400, mp, "invalid_json");
    rh_raw_free(&r);
    static const uint8_t never[] = {0xc1};
    post_h1(&e, "/query", mp, never, 1, &r);
    expect_h1("/query, msgpack 0xc1", &r, 400, mp, NULL);
    rh_raw_free(&r);
    /* nesting a recursive parser would not survive: 1 MiB of '[' and of msgpack fixarray(1) */
    size_t deep = 1u << 20;
    char *nest = malloc(deep + 64);
    int o = sprintf(nest, "{\"model_name\":\"m\",\"token_ids\":");
    memset(nest + o, '[', deep);
    post_h1(&e, "/query", json, nest, (size_t)o + deep, &r);
    expect_h1_json_error("Dynamo /query, 1 MiB of [", &r, 422, NULL);
    rh_raw_free(&r);
    memcpy(nest, "\x81\xa5model", 7);
    memset(nest + 7, 0x91, deep);
    post_h1(&e, "/query", mp, nest, 7 + deep, &r);
    if (rh_h1_status(&r) != 400 && rh_h1_status(&r) != 422)
        fail_msg("msgpack nested 1 Mi deep: %.200s", r.buf);
    rh_raw_free(&r);
    free(nest);

    /*
     * ---- broken request lines and headers ----
     * h2o's HTTP/1.1 parser answers what it cannot parse with its own canned
     * `400 Bad Request` (text/plain) and closes; a broken Content-Length or
     * chunk size comes through kvidx's error filter as JSON, and closes too.
     */
    static const struct {
        const char *what, *req;
        size_t len;
        int status;
        bool json, closes;
    } broken[] = {
        {"garbage request line", "GARBAGE\r\n\r\n", 0, 400, false, true},
        {"three words and more", "GET /health HTTP/1.1 extra\r\nHost: kvidx\r\n\r\n", 0, 400, false, true},
        {"HTTP/9.9", "GET /health HTTP/9.9\r\nHost: kvidx\r\n\r\n", 0, 400, false, true},
        {"header without a colon", "GET /health HTTP/1.1\r\nHost kvidx\r\n\r\n", 0, 400, false, true},
        {"NUL in the path", "GET /hea\0lth HTTP/1.1\r\nHost: kvidx\r\n\r\n", 36, 400, false, true},
        {"a TLS ClientHello", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x00\x00\x00\x00\r\n\r\n", 0, 400, false,
         true},
        {"Content-Length not a number", "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Length: 12a\r\n\r\n", 0, 400,
         true, true},
        {"Content-Length and chunked",
         "POST /query HTTP/1.1\r\nHost: kvidx\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n", 0,
         400, true, true},
        {"bad chunk size", "POST /query HTTP/1.1\r\nHost: kvidx\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n", 0, 400,
         true, true},
        /* a method token h2o accepts: kvidx's own 405, and the connection serves on */
        {"bytes >= 0x80 in the method", "G\xff\xfeT /health HTTP/1.1\r\nHost: kvidx\r\n\r\n", 0, 405, true, false},
    };
    for (size_t i = 0; i < KVI_ARRAY_LEN(broken); i++) {
        h1_exchange(e.d.port, broken[i].req, broken[i].len ? broken[i].len : strlen(broken[i].req), NULL, 0, &r);
        expect_h1_broken(broken[i].what, &r, broken[i].status, broken[i].json, broken[i].closes);
        rh_raw_free(&r);
    }
    /* a 1 MiB header line, and more headers than h2o's 100 */
    size_t hl = 1u << 20;
    char *hh = malloc(hl + 200000);
    int n = sprintf(hh, "GET /health HTTP/1.1\r\nHost: kvidx\r\nX-Big: ");
    memset(hh + n, 'a', hl);
    n += (int)hl;
    n += sprintf(hh + n, "\r\n\r\n");
    h1_exchange(e.d.port, hh, (size_t)n, NULL, 0, &r);
    expect_h1_broken("a 1 MiB header", &r, 400, false, true);
    rh_raw_free(&r);
    n = sprintf(hh, "GET /health HTTP/1.1\r\nHost: kvidx\r\n");
    for (int i = 0; i < 2000; i++)
        n += sprintf(hh + n, "X-H%d: v\r\n", i);
    n += sprintf(hh + n, "\r\n");
    h1_exchange(e.d.port, hh, (size_t)n, NULL, 0, &r);
    expect_h1_broken("2,000 headers", &r, 400, false, true);
    rh_raw_free(&r);
    free(hh);
    /* a good request, then garbage on the same connection: the first is answered */
    static const char pipelined[] = "GET /health HTTP/1.1\r\nHost: kvidx\r\n\r\nGARBAGE\r\n\r\n";
    h1_exchange_to(e.d.port, pipelined, strlen(pipelined), NULL, 0, &r, true);
    if (rh_h1_status(&r) != 200)
        fail_msg("good request before garbage: %.200s", r.buf);
    {
        struct rh_raw rest = {0};
        size_t head = rh_h1_head_len(&r);
        rest.buf = r.buf + head;
        rest.len = r.len - head;
        rest.eof = r.eof;
        expect_h1_broken("garbage after a good request", &rest, 400, false, true);
    }
    rh_raw_free(&r);

    bad_env_down(&e);
}

/* Open an h2c connection by prior knowledge, send @p frames, read until GOAWAY and close or @p ms. */
static void h2_exchange(uint16_t port, const void *frames, size_t len, int ms, struct rh_raw *r,
                        struct rh_h2_seen *seen)
{
    uint8_t hello[64];
    size_t hn = rh_h2_hello(hello);
    memset(r, 0, sizeof *r);
    int fd = rh_tcp_open(port, 0);
    assert_int_equal(rh_send_all(fd, hello, hn, 5000), 0);
    rh_send_all(fd, frames, len, 5000);
    rh_raw_read(fd, r, ms, NULL);
    close(fd);
    /* skip the preface-less server stream: frames start at byte 0 */
    rh_h2_parse(r, seen);
}

static void expect_goaway(const char *what, const struct rh_raw *r, const struct rh_h2_seen *s, uint32_t code)
{
    if (!s->goaway || s->goaway_code != code || !r->eof)
        fail_msg("%s: goaway %d code %u, closed %d; want GOAWAY %u and a close", what, s->goaway, s->goaway_code,
                 r->eof, code);
    if (verbose())
        print_message("%-44s -> GOAWAY %u, closed\n", what, code);
}

static void test_bad_http2(void **state)
{
    (void)state;
    struct bad_env e;
    bad_env_up(&e);
    uint8_t f[4096], hb[512];
    struct rh_raw r;
    struct rh_h2_seen s;

    /* ---- protocol errors end the connection with GOAWAY ---- */
    /* a frame over SETTINGS_MAX_FRAME_SIZE (16 KiB): FRAME_SIZE_ERROR */
    size_t n = rh_h2_frame(f, H2_HEADERS, H2_END_HEADERS, 1, NULL, 0);
    f[0] = 0x10; /* 1 MiB announced */
    memset(f + 9, 0, 1024);
    h2_exchange(e.d.port, f, 9 + 1024, KFX_WAIT_MS, &r, &s);
    expect_goaway("a 1 MiB frame", &r, &s, 6);
    rh_raw_free(&r);
    /* broken HPACK: an index past every table: COMPRESSION_ERROR */
    static const uint8_t bad_hpack[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    n = rh_h2_frame(f, H2_HEADERS, H2_END_HEADERS | H2_END_STREAM, 1, bad_hpack, sizeof bad_hpack);
    h2_exchange(e.d.port, f, n, KFX_WAIT_MS, &r, &s);
    expect_goaway("HPACK index past the tables", &r, &s, 9);
    rh_raw_free(&r);
    /* DATA on stream 0, HEADERS on an even (server) stream: PROTOCOL_ERROR */
    n = rh_h2_frame(f, H2_DATA, 0, 0, "x", 1);
    h2_exchange(e.d.port, f, n, KFX_WAIT_MS, &r, &s);
    expect_goaway("DATA on stream 0", &r, &s, 1);
    rh_raw_free(&r);
    size_t hbn = rh_hpack_request(hb, false, "/health", NULL, -1);
    n = rh_h2_frame(f, H2_HEADERS, H2_END_HEADERS | H2_END_STREAM, 2, hb, hbn);
    h2_exchange(e.d.port, f, n, KFX_WAIT_MS, &r, &s);
    expect_goaway("HEADERS on stream 2", &r, &s, 1);
    rh_raw_free(&r);
    /* garbage instead of frames */
    memset(f, 0xee, 64);
    h2_exchange(e.d.port, f, 64, KFX_WAIT_MS, &r, &s);
    if (!r.eof || !s.goaway)
        fail_msg("garbage frames: goaway %d, closed %d", s.goaway, r.eof);
    if (verbose())
        print_message("%-44s -> GOAWAY %u, closed\n", "64 bytes of garbage as frames", s.goaway_code);
    rh_raw_free(&r);
    /* a broken preface: not HTTP/2, so an HTTP/1.1 error or a close */
    static const char bad_preface[] = "PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n";
    h1_exchange(e.d.port, bad_preface, strlen(bad_preface), NULL, 0, &r);
    if (!r.eof || r.len != 0)
        fail_msg("a broken preface: %.200s%s", r.buf, r.eof ? " (closed)" : " (open)");
    if (verbose())
        print_message("%-44s -> closed without an answer\n", "a broken preface");
    rh_raw_free(&r);

    /*
     * ---- stream errors: RST_STREAM, the connection serves on ----
     * A body over the largest limit (8 MiB): h2o resets the stream with
     * REFUSED_STREAM once the DATA passes the limit (the announced
     * content-length alone does not trigger it). DATA is sent as flow control
     * allows; then GET /health on stream 3 of the same connection.
     */
    {
        memset(&r, 0, sizeof r);
        int fd = rh_tcp_open(e.d.port, 0);
        uint8_t hello[64];
        size_t hn = rh_h2_hello(hello);
        hbn = rh_hpack_request(hb, true, "/query", "application/json", -1);
        n = rh_h2_frame(f, H2_HEADERS, H2_END_HEADERS, 1, hb, hbn);
        assert_int_equal(rh_send_all(fd, hello, hn, 5000), 0);
        assert_int_equal(rh_send_all(fd, f, n, 5000), 0);
        static uint8_t data[9 + 16384];
        const uint64_t total = (8u << 20) + (256u << 10);
        uint64_t sent = 0;
        int64_t end = kfx_now_ms() + KFX_WAIT_MS;
        for (;;) {
            rh_raw_drain(fd, &r);
            rh_h2_parse(&r, &s);
            if (s.rst_stream != 0 || s.goaway || r.eof || kfx_now_ms() > end)
                break;
            /* windows: 65,535 for the connection and 16 MiB for the stream (h2o's SETTINGS), plus updates;
             * after the last byte, wait for the reset (h2o reads what the socket holds first) */
            uint64_t room = KVI_MIN(65535 + s.win[0] - sent, (16u << 20) + s.win[1] - sent);
            size_t k = (size_t)KVI_MIN(KVI_MIN(room, (uint64_t)16384), total - sent);
            if (k == 0) {
                struct pollfd pf = {fd, POLLIN, 0};
                poll(&pf, 1, 50);
                continue;
            }
            memset(data + 9, ' ', k);
            rh_h2_frame(data, H2_DATA, 0, 1, NULL, k);
            if (rh_send_all(fd, data, 9 + k, 5000) != 0)
                break;
            sent += k;
        }
        if (s.rst_stream != 1 || s.rst_code != 7 || s.goaway)
            fail_msg("HTTP/2 body of %llu bytes: RST_STREAM %d code %u, GOAWAY %d (code %u)", (unsigned long long)sent,
                     s.rst_stream, s.rst_code, s.goaway, s.goaway_code);
        hbn = rh_hpack_request(hb, false, "/health", NULL, -1);
        n = rh_h2_frame(f, H2_HEADERS, H2_END_HEADERS | H2_END_STREAM, 3, hb, hbn);
        assert_int_equal(rh_send_all(fd, f, n, 5000), 0);
        for (end = kfx_now_ms() + KFX_WAIT_MS; s.headers_stream != 3 && !r.eof && kfx_now_ms() < end;) {
            struct pollfd pf = {fd, POLLIN, 0};
            poll(&pf, 1, 50);
            rh_raw_drain(fd, &r);
            rh_h2_parse(&r, &s);
        }
        if (s.headers_stream != 3 || s.headers_first != 0x88 || s.goaway)
            fail_msg("GET /health after the reset stream: HEADERS on %d (0x%02x), GOAWAY %d", s.headers_stream,
                     s.headers_first, s.goaway);
        if (verbose())
            print_message("%-44s -> RST_STREAM REFUSED_STREAM after %llu bytes; /health on stream 3: 200\n",
                          "HTTP/2 body over 8 MiB", (unsigned long long)sent);
        close(fd);
        rh_raw_free(&r);
    }

    /* ---- well-formed HTTP/2, bad bodies: the same answers as HTTP/1.1 ---- */
    static const struct {
        const char *what, *path, *ctype, *body;
        long status;
        const char *needle;
    } bodies[] = {
        {"h2c Dynamo /query, cut JSON", "/query", "application/json", "{\"model_name\":\"m\",\"token_ids\":[1,",
         400, "{\"error\":\""},
        {"h2c Dynamo /query as text/plain", "/query", "text/plain", "{\"model_name\":\"m\",\"token_ids\":[1]}", 415,
         "{\"error\":\""},
        {"h2c Conductor /query, cut JSON", "/query", "application/json", "{\"model\":\"cm\",\"block_size\":4,",
         400, "\"reason\":\"invalid_json\""},
        {"h2c Dynamo /register, wrong type", "/register", "application/json", "{\"instance_id\":\"x\"}", 422,
         "{\"error\":\""},
    };
    for (size_t i = 0; i < KVI_ARRAY_LEN(bodies); i++) {
        struct kfx_resp cr;
        char h[128];
        snprintf(h, sizeof h, "Content-Type: %s", bodies[i].ctype);
        const char *hs[] = {h, NULL};
        long st = kfx_http(&e.d, KFX_H2C, "POST", bodies[i].path, hs, bodies[i].body, strlen(bodies[i].body), &cr);
        if (st != bodies[i].status || strstr(cr.body, bodies[i].needle) == NULL ||
            strcmp(cr.ctype, "application/json") != 0 || cr.version != CURL_HTTP_VERSION_2_0)
            fail_msg("%s: %ld [%s] %s", bodies[i].what, st, cr.ctype, cr.body);
        if (verbose())
            print_message("%-44s -> %ld %.80s\n", bodies[i].what, st, cr.body);
        kfx_resp_free(&cr);
    }
    /* over /register's 2 MiB (under 8 MiB): read whole, then 413 */
    size_t big = (2u << 20) + 1;
    char *b = malloc(big);
    memset(b, ' ', big);
    struct kfx_resp cr;
    const char *hj[] = {"Content-Type: application/json", NULL};
    long st = kfx_http(&e.d, KFX_H2C, "POST", "/register", hj, b, big, &cr);
    if (st != 413 || strstr(cr.body, "over the 2097152-byte limit") == NULL)
        fail_msg("h2c /register 2 MiB + 1: %ld %s", st, cr.body);
    kfx_resp_free(&cr);
    free(b);

    bad_env_down(&e);
}

/* =========================================================================================== */
/* 5. 10,000 workers registered and removed                                                    */
/* =========================================================================================== */

#define N_WORKERS 10000 /* fewer where the hard descriptor limit cannot hold 3 per worker: n_workers */
static uint64_t n_workers = N_WORKERS;
#define N_LIVE 100     /* workers subscribed to a real publisher */
#define LIVE_CHAINS 32 /* x 64 blocks each live worker holds */
#define LIVE_DEPTH 64

struct round_figures {
    int64_t reg_ms, unreg_ms, hold_ms;
    long long peak_rss_kb;
    int peak_fds;
};

static void do_round(const struct kfx_daemon *d, struct rh_keep *k, struct kvidx_pub *p, const char *dead_ep,
                     struct round_figures *f)
{
    char j[512];
    int64_t t0 = kfx_now_ms();
    for (uint64_t id = 1; id <= n_workers; id++) {
        if (id <= N_LIVE)
            snprintf(j, sizeof j,
                     "{\"instance_id\":%llu,\"model_name\":\"m\",\"block_size\":%d,\"endpoint\":\"%s\","
                     "\"replay_endpoint\":\"%s\"}",
                     (unsigned long long)id, KFX_BS, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
        else
            snprintf(j, sizeof j, "{\"instance_id\":%llu,\"model_name\":\"m\",\"block_size\":%d,\"endpoint\":\"%s\"}",
                     (unsigned long long)id, KFX_BS, dead_ep);
        if (rh_keep_req(k, "/register", j) != 201)
            fail_msg("register %llu: %ld %s", (unsigned long long)id, k->r.status, k->r.body);
    }
    f->reg_ms = kfx_now_ms() - t0;
    int64_t th = kfx_now_ms();
    /* the live ones hold every block (late joiners replay what they missed) */
    for (uint32_t c = 0; c < LIVE_CHAINS; c++)
        kfx_publish(p, c, 0, LIVE_DEPTH, NULL);
    const long long want = (long long)N_LIVE * LIVE_CHAINS * LIVE_DEPTH;
    int64_t end = kfx_now_ms() + 60000;
    while (kfx_metric(d, "kvidx_index_holdings{model=\"m\",tenant=\"default\"}") != want && kfx_now_ms() < end) {
        uint64_t seq;
        kvidx_pub_flush_empty(p, &seq);
        kfx_nap(100);
    }
    assert_int_equal(kfx_metric(d, "kvidx_index_holdings{model=\"m\",tenant=\"default\"}"), want);
    assert_int_equal(rh_metric(d, "dynamo_kvindexer_workers"), n_workers);
    assert_int_equal(rh_metric(d, "dynamo_kvindexer_listeners{status=\"active\"}"), n_workers);
    assert_int_equal(rh_metric(d, "dynamo_kvindexer_listeners{status=\"failed\"}"), 0);
    f->hold_ms = kfx_now_ms() - th;
    f->peak_rss_kb = rh_rss_kb(d->pid);
    f->peak_fds = rh_fd_count(d->pid);
    /* oldest first: the order a list-walking registry handled worst
     * (6.5-8.5 s before the registry's hash, 1.5 s newest first) */
    t0 = kfx_now_ms();
    for (uint64_t id = 1; id <= n_workers; id++) {
        snprintf(j, sizeof j, "{\"instance_id\":%llu,\"model_name\":\"m\"}", (unsigned long long)id);
        if (rh_keep_req(k, "/unregister", j) != 200)
            fail_msg("unregister %llu: %ld %s", (unsigned long long)id, k->r.status, k->r.body);
    }
    f->unreg_ms = kfx_now_ms() - t0;
    assert_int_equal(rh_metric(d, "dynamo_kvindexer_workers"), 0);
    assert_int_equal(rh_metric(d, "dynamo_kvindexer_listeners{status=\"active\"}"), 0);
    assert_int_equal(kfx_metric(d, "kvidx_index_holdings{model=\"m\",tenant=\"default\"}"), -1); /* namespace gone */
    assert_int_equal(rh_keep_req(k, "/dump", NULL), 200);
    assert_string_equal(k->r.body, "{}");
}

/* Poll RSS until it is at most @p limit_kb; @return the last reading. */
static long long rss_until(pid_t pid, long long limit_kb, int ms)
{
    long long v = rh_rss_kb(pid);
    for (int64_t end = kfx_now_ms() + ms; v > limit_kb && kfx_now_ms() < end; v = rh_rss_kb(pid))
        kfx_nap(100);
    return v;
}

static void test_10k_workers_memory(void **state)
{
    (void)state;
    struct kfx_daemon d;
    /* HTTP connections capped low: the listeners' descriptors must not depend on that cap */
    const char *args[] = {"--max-connections", "1024", "--log-level", "warn", NULL};
    /* Every listener of the dead endpoint holds its socket's mailbox and, while ZMQ retries the
     * refused connect, a TCP socket: on a loaded machine the peak nears two descriptors per worker,
     * over a 20,000 hard limit. Raise it where the test may (root), as an operator would. */
    rh_raise_nofile_hard(1 << 16);
    /* Where it cannot be raised (a container's 20,000), the round is sized to the limit: three
     * descriptors per worker at most (its mailbox, a TCP socket, one more while a refused connect is
     * retried), 2,000 spare. The memory checks are relative, so they hold at any size. (At 10,000
     * under a 20,000 limit, registration 9,901 once failed with EMFILE in a ctest -j2 run.) */
    rlim_t hard = rh_nofile_hard();
    if (hard != RLIM_INFINITY && hard < 3 * N_WORKERS + 2000) {
        n_workers = hard > 5000 ? (uint64_t)(hard - 2000) / 3 : 1000;
        print_message("hard descriptor limit %llu: %llu workers instead of %d\n", (unsigned long long)hard,
                      (unsigned long long)n_workers, N_WORKERS);
    }
    rh_start_low_nofile(&d, args);
    /* an endpoint nobody publishes on: a port bound here and never listened on (refused) */
    int hole = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    assert_int_equal(bind(hole, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(hole, (struct sockaddr *)&a, &al), 0);
    char dead_ep[64];
    snprintf(dead_ep, sizeof dead_ep, "tcp://127.0.0.1:%u", ntohs(a.sin_port));
    struct kvidx_pub *p = kfx_pub(0);
    struct rh_keep k;
    rh_keep_init(&k, &d, KFX_H1);
    assert_int_equal(rh_keep_req(&k, "/health", NULL), 200);
    /* jemalloc: RSS is checked (sanitizer builds run on libc malloc and keep freed memory in quarantine) */
    bool jemalloc = kfx_metric(&d, "kvidx_memory_allocated_bytes") >= 0;
    long long fresh = rh_rss_kb(d.pid);
    int fresh_fds = rh_fd_count(d.pid);
    char *fresh_list = rh_fd_list(d.pid);

    struct round_figures f0, f1;
    do_round(&d, &k, p, dead_ep, &f0);
    /* every listener's descriptors are closed (libzmq's reaper closes them soon after); what stays is
     * libzmq's I/O and reaper threads (an epoll and an eventfd each, started with the first socket) */
    if (!KFX_WAIT(rh_fd_count(d.pid) <= fresh_fds + 6, KFX_WAIT_MS))
        fail_msg("kvidxd holds %d descriptors, %d before the round:\n%s--- before:\n%s", rh_fd_count(d.pid),
                 fresh_fds, rh_fd_list(d.pid), fresh_list);
    int round_fds = rh_fd_count(d.pid);
    print_message("%d workers (%d publishing %d blocks each): registered in %lld ms, unregistered in %lld ms; "
                  "at the peak %d descriptors and %lld KiB RSS (%lld KiB fresh)\n",
                  (int)n_workers, N_LIVE, LIVE_CHAINS * LIVE_DEPTH, (long long)f0.reg_ms, (long long)f0.unreg_ms,
                  f0.peak_fds, f0.peak_rss_kb, fresh);
    if (jemalloc) {
        /* the warm-up round gives back at least 85 % of what it took */
        long long keep_kb = fresh + (f0.peak_rss_kb - fresh) * 15 / 100;
        int64_t ts = kfx_now_ms();
        long long after0 = rss_until(d.pid, keep_kb, 40000);
        if (verbose())
            print_message("blocks held after %lld ms; RSS back under %lld KiB after %lld ms\n", (long long)f0.hold_ms,
                          keep_kb, (long long)(kfx_now_ms() - ts));
        if (after0 > keep_kb)
            fail_msg("RSS after the warm-up round: %lld KiB, fresh %lld, peak %lld: memory not returned", after0,
                     fresh, f0.peak_rss_kb);
        /* the baseline once it settles (two readings half a second apart within 1 %) */
        long long base = after0;
        for (int64_t end = kfx_now_ms() + 15000; kfx_now_ms() < end;) {
            kfx_nap(500);
            long long v = rh_rss_kb(d.pid);
            bool settled = v >= base - base / 100;
            base = KVI_MIN(base, v);
            if (settled)
                break;
        }
        if (verbose())
            print_message("baseline %lld KiB after %lld ms\n", base, (long long)(kfx_now_ms() - ts));
        do_round(&d, &k, p, dead_ep, &f1);
        ts = kfx_now_ms();
        long long after1 = rss_until(d.pid, base + base / 10, 40000);
        if (verbose())
            print_message("round 2: %lld + %lld + %lld ms; RSS back after %lld ms\n", (long long)f1.reg_ms,
                          (long long)f1.hold_ms, (long long)f1.unreg_ms, (long long)(kfx_now_ms() - ts));
        print_message("RSS: fresh %lld KiB, peaks %lld and %lld KiB, baseline after the warm-up %lld KiB, "
                      "after the second round %lld KiB (%+.1f %%)\n",
                      fresh, f0.peak_rss_kb, f1.peak_rss_kb, base, after1,
                      100.0 * (double)(after1 - base) / (double)base);
        if (after1 > base + base / 10)
            fail_msg("RSS %lld KiB after the second round, baseline %lld KiB", after1, base);
        if (!KFX_WAIT(rh_fd_count(d.pid) <= round_fds, KFX_WAIT_MS))
            fail_msg("kvidxd holds %d descriptors, %d after the first round", rh_fd_count(d.pid), round_fds);
    }
    free(fresh_list);
    rh_keep_free(&k);
    kvidx_pub_destroy(p);
    close(hole);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_slow_clients, teardown_slow),
        cmocka_unit_test_teardown(test_idle_timeouts, teardown),
        cmocka_unit_test_teardown(test_connection_cap, teardown),
        cmocka_unit_test_teardown(test_bad_http1, teardown),
        cmocka_unit_test_teardown(test_bad_http2, teardown),
        cmocka_unit_test_teardown(test_10k_workers_memory, teardown),
    };
    if (getenv("KVI_TEST_FILTER") != NULL) /* e.g. KVI_TEST_FILTER='test_bad_*' */
        cmocka_set_test_filter(getenv("KVI_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
