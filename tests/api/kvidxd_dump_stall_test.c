/* ctest-labels: integration tsan */
/*
 * A /dump reader that stops reading must stall nothing but its own dump.
 *
 * kvidxd holds a large index (65,536 blocks, about 16 MB of dump: more than
 * the kernel's socket buffers plus the stream's 1 MiB high water). A raw
 * HTTP/1.1 client asks for /dump with a tiny receive buffer and reads
 * nothing, so the server's writes to it block. While it is stalled:
 *   - a newly published block is applied and visible to /query within 2 s
 *     (the writer threads do not wait for the client);
 *   - /register and /unregister of another worker answer within 2 s (the
 *     control thread does not wait for it), and so does the /unregister that
 *     deletes a whole namespace the stalled dump still has to visit;
 *   - a second /dump is served completely (dumps do not queue behind it).
 * The test checks that the server really was blocked on the client meanwhile
 * (the body is far larger than anything that could have been buffered). Then
 * the client drains and gets a complete dump that the dump decoder accepts,
 * with every block of the big namespace; the deleted namespace is freed once
 * that dump is done with it, and a later /dump shows the new block and no
 * deleted namespace. SIGTERM still exits 0 (sanitizer builds: no leak, no
 * use after free of the namespace whose free the dump deferred).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "kvidxd_fixture.h"

#include "api/codec_dump.h"

#if defined(__SANITIZE_THREAD__)
/* The publishers' libzmq is not built with TSan (as kvidxd.c says for the daemon). */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so\n";
}
#endif

#define MODEL "m"
#define MODEL2 "m2"
#define CHAINS 256
#define LEN 256
#define NEW_CHAIN 900   /* published while the reader is stalled */
#define DEADLINE_MS 2000 /* what "not stalled" means for ops and control routes */

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* ---- control routes with a deadline ---------------------------------------------------------- */

/*
 * POST `json` to `path` with a 5 s transport timeout and expect `status`
 * within DEADLINE_MS (a control thread stuck behind the reader answers
 * nothing, and the request then fails here instead of hanging).
 */
static void post_quick(const struct kfx_daemon *d, const char *path, const char *json, long status)
{
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", d->port, path);
    struct kfx_resp r = {0};
    r.body = calloc(1, 1);
    struct curl_slist *sl = curl_slist_append(NULL, "Content-Type: application/json");
    sl = curl_slist_append(sl, "Expect:");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(json));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, sl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kfx_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    int64_t t0 = kfx_now_ms();
    CURLcode cc = curl_easy_perform(h);
    int64_t ms = kfx_now_ms() - t0;
    if (cc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(sl);
    curl_easy_cleanup(h);
    print_message("POST %s: %ld after %lld ms\n", path, r.status, (long long)ms);
    if (cc != CURLE_OK || r.status != status || ms > DEADLINE_MS)
        fail_msg("POST %s %s while a /dump reader is stalled: %s, status %ld (want %ld) after %lld ms (limit %d)",
                 path, json, curl_easy_strerror(cc), r.status, status, (long long)ms, DEADLINE_MS);
    kfx_resp_free(&r);
}

static void reg(const struct kfx_daemon *d, uint64_t id, const char *model, struct kvidx_pub *p, bool quick)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"model_name\":\"%s\",\"block_size\":%d,\"endpoint\":\"%s\","
             "\"replay_endpoint\":\"%s\"}",
             (unsigned long long)id, model, KFX_BS, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
    if (quick)
        post_quick(d, "/register", j, 201);
    else
        kfx_expect(d, "/register", j, 201, NULL);
}

static void unreg_quick(const struct kfx_daemon *d, uint64_t id, const char *model)
{
    char j[256];
    snprintf(j, sizeof j, "{\"instance_id\":%llu,\"model_name\":\"%s\"}", (unsigned long long)id, model);
    post_quick(d, "/unregister", j, 200);
}

/* Whether POST /query `json` answers 200 with a body containing `needle`. */
static bool query_has(const struct kfx_daemon *d, const char *json, const char *needle)
{
    struct kfx_resp r;
    bool ok = kfx_post_json(d, "/query", json, &r) == 200 && strstr(r.body, needle) != NULL;
    kfx_resp_free(&r);
    return ok;
}

/* ---- the raw reader ------------------------------------------------------------------------- */

/* Connect with a 4 KiB receive buffer (set before connect: no autotuning) and send GET /dump. */
static int raw_dump_request(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    int rcv = 4096;
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char req[] = "GET /dump HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n";
    assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)(sizeof req - 1));
    return fd;
}

static int avail(int fd)
{
    int n = 0;
    assert_int_equal(ioctl(fd, FIONREAD, &n), 0);
    return n;
}

/*
 * Wait until the answer has started arriving and the bytes waiting in our
 * receive buffer stop growing for 300 ms (the buffer is full: the server's
 * writes to us now block). @return the bytes waiting.
 */
static int wait_stalled(int fd)
{
    int64_t end = kfx_now_ms() + KFX_WAIT_MS, since = kfx_now_ms();
    int last = -1;
    while (kfx_now_ms() < end) {
        int n = avail(fd);
        if (n != last) {
            last = n;
            since = kfx_now_ms();
        } else if (n > 0 && kfx_now_ms() - since >= 300) {
            return n;
        }
        kfx_nap(5);
    }
    fail_msg("the /dump answer never started or never stopped growing (%d bytes waiting)", last);
    return -1;
}

/* The largest send buffer the kernel gives a socket (tcp_wmem's maximum). */
static long wmem_max(void)
{
    long lo = 0, def = 0, max = 4L << 20;
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_wmem", "r");
    if (f != NULL) {
        if (fscanf(f, "%ld %ld %ld", &lo, &def, &max) != 3)
            max = 4L << 20;
        fclose(f);
    }
    return max;
}

struct body {
    char *p;
    size_t len, cap;
};

static void body_put(struct body *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/*
 * Read the whole answer (20 s at most) and decode its chunked body into *out.
 * The answer must be 200 with Transfer-Encoding: chunked and end with the
 * zero-size chunk (a cut dump fails here).
 */
static void drain_chunked(int fd, struct body *out)
{
    struct body raw = {0};
    size_t pos = 0; /* parse position in raw */
    bool head_done = false, done = false;
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    char buf[65536];
    while (!done) {
        /* parse what we have */
        if (!head_done) {
            char *eoh = raw.p ? strstr(raw.p, "\r\n\r\n") : NULL;
            if (eoh != NULL) {
                *eoh = '\0';
                if (strncmp(raw.p, "HTTP/1.1 200", 12) != 0 || strcasestr(raw.p, "transfer-encoding: chunked") == NULL)
                    fail_msg("unexpected /dump answer head:\n%s", raw.p);
                head_done = true;
                pos = (size_t)(eoh - raw.p) + 4;
            }
        }
        while (head_done && !done) {
            char *eol = memmem(raw.p + pos, raw.len - pos, "\r\n", 2);
            if (eol == NULL)
                break;
            size_t size = strtoul(raw.p + pos, NULL, 16);
            size_t data = (size_t)(eol - raw.p) + 2;
            if (raw.len < data + size + 2)
                break;
            if (size == 0) {
                done = true;
                break;
            }
            assert_memory_equal(raw.p + data + size, "\r\n", 2);
            body_put(out, raw.p + data, size);
            pos = data + size + 2;
        }
        if (done)
            break;
        struct pollfd pfd = {fd, POLLIN, 0};
        int64_t left = end - kfx_now_ms();
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            fail_msg("the /dump answer did not end in time (%zu body bytes so far)", out->len);
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0)
            fail_msg("the /dump connection ended before the last chunk (%zu body bytes)", out->len);
        body_put(&raw, buf, (size_t)n);
    }
    free(raw.p);
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
    body_put(ud, p, sz * nm);
    return sz * nm;
}

/*
 * GET /dump with curl into *out (the buffer grows geometrically: the
 * fixture's per-callback realloc is quadratic under TSan for a 20 MB body).
 * Fails unless it answers 200 within 120 s.
 */
static void dump_fetch(const struct kfx_daemon *d, struct body *out)
{
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/dump", d->port);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 120000L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    long status = 0;
    CURLcode cc = curl_easy_perform(h);
    if (cc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    if (cc != CURLE_OK || status != 200)
        fail_msg("GET /dump: %s, status %ld after %zu bytes", curl_easy_strerror(cc), status, out->len);
}

/* ---- decoding ------------------------------------------------------------------------------ */

struct counts {
    size_t m, m2, other;
    bool saw_m2;      /* the namespace m2 is in the dump */
    bool new_chain;   /* a block of NEW_CHAIN is */
};

static int on_ns(void *ctx, struct kvi_str model, struct kvi_str tenant, uint32_t bs)
{
    (void)tenant;
    (void)bs;
    struct counts *c = ctx;
    if (model.len == 2 && memcmp(model.p, MODEL2, 2) == 0)
        c->saw_m2 = true;
    return 0;
}

static int on_rec(void *ctx, const struct kvi_dump_rec *r)
{
    struct counts *c = ctx;
    if (r->model.len == 1 && r->model.p[0] == 'm')
        c->m++;
    else if (r->model.len == 2 && memcmp(r->model.p, MODEL2, 2) == 0)
        c->m2++;
    else
        c->other++;
    if (r->engine_hash == kfx_hash(NEW_CHAIN, 0))
        c->new_chain = true;
    return 0;
}

/* Decode a whole dump body with kvidx's dump decoder; fails the test unless it is complete and valid. */
static struct counts decode(const char *body, size_t len)
{
    struct counts c = {0};
    struct kvi_dump_dec_cb cb = {on_ns, on_rec, &c, NULL};
    struct kvi_dump_dec *dec = kvi_dump_dec_create(&cb);
    assert_non_null(dec);
    int rc = kvi_dump_dec_feed(dec, body, len);
    if (rc == 0)
        rc = kvi_dump_dec_finish(dec);
    if (rc != 0)
        fail_msg("the dump does not decode (%d: %s); %zu bytes, ends with: %.200s", rc, kvi_dump_dec_error(dec), len,
                 len > 200 ? body + len - 200 : body);
    kvi_dump_dec_destroy(dec);
    return c;
}

/* ---- the test ------------------------------------------------------------------------------- */

static void test_stalled_dump_reader_stalls_nothing_else(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *args[] = {"--log-level", "debug", NULL}; /* says when a deferred namespace is freed */
    kfx_start(&d, args, NULL);
    struct kvidx_pub *p1 = kfx_pub(0), *p2 = kfx_pub(0), *p3 = kfx_pub(0);
    reg(&d, 1, MODEL, p1, false);
    reg(&d, 3, MODEL2, p3, false);
    for (uint32_t ch = 0; ch < CHAINS; ch++)
        kfx_publish(p1, 10 + ch, 0, LEN, NULL);
    kfx_publish(p3, 5, 0, 8, NULL);
    char *q1 = kfx_query_json(MODEL, 10 + CHAINS - 1, 8);
    kfx_until_query(&d, "/query", q1, "\"scores\":{\"1\":{\"0\":32}}", &p1, 1);
    char *q3 = kfx_query_json(MODEL2, 5, 8);
    kfx_until_query(&d, "/query", q3, "\"scores\":{\"3\":{\"0\":32}}", &p3, 1);
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_listener_blocks_stored_total") == CHAINS * LEN + 8, KFX_WAIT_MS));

    /* the reader that never reads */
    int fd = raw_dump_request(d.port);
    int waiting = wait_stalled(fd);
    print_message("stalled with %d bytes waiting in the client's buffer\n", waiting);

    /* 1. ingestion goes on: a new chain is applied and visible within the deadline */
    kfx_publish(p1, NEW_CHAIN, 0, 4, NULL);
    char *qn = kfx_query_json(MODEL, NEW_CHAIN, 4);
    int64_t t0 = kfx_now_ms();
    bool seen = KFX_WAIT(query_has(&d, qn, "\"scores\":{\"1\":{\"0\":16}}"), DEADLINE_MS);
    print_message("new block visible: %s after %lld ms\n", seen ? "yes" : "no", (long long)(kfx_now_ms() - t0));
    if (!seen)
        fail_msg("a block published while a /dump reader is stalled was not applied within %d ms", DEADLINE_MS);

    /* 2. the control routes answer: register and unregister another worker, and
     *    delete namespace m2 (its last worker goes) while the dump still holds it */
    reg(&d, 2, MODEL, p2, true);
    unreg_quick(&d, 2, MODEL);
    unreg_quick(&d, 3, MODEL2);
    kfx_expect_get(&d, "/workers", 200, NULL);

    /* 3. another /dump is served in full meanwhile */
    struct body full = {0};
    dump_fetch(&d, &full);
    struct counts cf = decode(full.p, full.len);
    print_message("concurrent /dump: %zu bytes, %zu + %zu blocks\n", full.len, cf.m, cf.m2);
    assert_int_equal(cf.m, CHAINS * LEN + 4);
    assert_true(cf.new_chain);

    /* the reader still has not taken a byte: the server really was blocked on it */
    assert_int_equal(avail(fd), waiting);

    /* 4. the reader drains: a complete, valid dump */
    struct body b = {0};
    drain_chunked(fd, &b);
    close(fd);
    long bound = (long)waiting + wmem_max() + (3L << 20);
    print_message("stalled dump: %zu body bytes (could have been buffered: %ld)\n", b.len, bound);
    if ((long)b.len <= bound)
        fail_msg("the dump (%zu bytes) is too small to have stalled the server (%ld bytes could be buffered)", b.len,
                 bound);
    struct counts cs = decode(b.p, b.len);
    print_message("stalled dump: %zu blocks of " MODEL ", %zu of " MODEL2 " (namespace %s)\n", cs.m, cs.m2,
                  cs.saw_m2 ? "present" : "absent");
    /* weakly consistent: every old block, the new chain only if its partition was dumped after it */
    assert_true(cs.m == CHAINS * LEN || cs.m == CHAINS * LEN + 4);
    assert_true(cs.saw_m2); /* listed before it was deleted */
    assert_true(cs.m2 <= 8);
    assert_int_equal(cs.other, 0);
    free(b.p);
    /* the namespace deleted under the dump was freed once the dump was done with it */
    if (!kfx_log_has(&d, "namespace " MODEL2 ":default freed after the /dump that held it", NULL, KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("namespace " MODEL2 " was not freed after the dump");
    }

    /* 5. afterwards: the new block is in, the deleted namespace is gone */
    struct body after = {0};
    dump_fetch(&d, &after);
    struct counts ca = decode(after.p, after.len);
    assert_int_equal(ca.m, CHAINS * LEN + 4);
    assert_false(ca.saw_m2);
    kfx_expect(&d, "/query", q3, 404, NULL); /* no indexer for m2 any more */

    free(full.p);
    free(after.p);
    free(q1);
    free(q3);
    free(qn);
    kvidx_pub_destroy(p1);
    kvidx_pub_destroy(p2);
    kvidx_pub_destroy(p3);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_stalled_dump_reader_stalls_nothing_else, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
