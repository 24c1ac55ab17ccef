/*
 * HTTP server (net/http_server.h) against libcurl: HTTP/1.1, h2c (prior
 * knowledge and Upgrade), HTTPS with ALPN h2, JSON errors, body limits,
 * deferred completion (also after the client left), pulled and pushed
 * streams, both loops serving, idle connections, counters, graceful stop.
 */
/* ctest-labels: integration */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "net/http_server.h"

/* ---- time and waiting ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Poll @p pred every 2 ms for up to 10 s. */
static bool wait_for(bool (*pred)(void *), void *arg)
{
    double end = now_s() + 10.0;
    while (!pred(arg)) {
        if (now_s() > end)
            return false;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return true;
}

/* ---- body pattern ---- */

static uint8_t pat(uint64_t i)
{
    return (uint8_t)((i * 131u) ^ (i >> 11));
}

static bool pat_ok(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != pat(i))
            return false;
    return true;
}

static size_t query_size(const struct kvi_http_req *req)
{
    const char *q = req->query.p;
    if (q == NULL || req->query.len < 6 || strncmp(q, "size=", 5) != 0)
        return 0;
    return strtoull(q + 5, NULL, 10);
}

/* ---- handlers ---- */

static void h_hello(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    char body[96];
    int n = snprintf(body, sizeof body, "{\"hello\":\"world\",\"thread\":%u,\"version\":%d}", req->thread,
                     req->version);
    kvi_http_respond(res, 200, "application/json", body, (size_t)n);
}

static void h_echo(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    char ct[128] = "application/octet-stream";
    if (req->content_type.p != NULL && req->content_type.len < sizeof ct) {
        memcpy(ct, req->content_type.p, req->content_type.len);
        ct[req->content_type.len] = '\0';
    }
    kvi_http_add_header(res, "X-Echo-Len", "yes");
    kvi_http_respond(res, 201, ct, req->body, req->body_len);
}

/* Reports what the request view holds. */
static void h_view(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_http_str custom = kvi_http_req_header(req, "X-Custom");
    char *out = kvi_http_alloc(res, 1024);
    int n = snprintf(out, 1024, "method=%.*s path=%.*s query=%.*s ct=%.*s accept=%.*s auth=%.*s custom=%.*s tls=%d",
                     (int)req->method_name.len, req->method_name.p, (int)req->path.len, req->path.p,
                     (int)req->query.len, req->query.p ? req->query.p : "", (int)req->content_type.len,
                     req->content_type.p ? req->content_type.p : "", (int)req->accept.len,
                     req->accept.p ? req->accept.p : "", (int)req->authorization.len,
                     req->authorization.p ? req->authorization.p : "", (int)custom.len, custom.p ? custom.p : "",
                     req->tls);
    kvi_http_respond_nocopy(res, 200, "text/plain", out, (size_t)n);
}

static void h_owned(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    char *b = strdup("owned body");
    kvi_http_respond_owned(res, 200, "text/plain", b, strlen(b));
}

static void h_noanswer(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
}

static void h_badjson(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    kvi_http_error(res, 400, "bad \"json\" at byte %d\n\x01", 7);
}

/* Deferred handles wait here for the test to complete them. */
static pthread_mutex_t dq_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dq_cv = PTHREAD_COND_INITIALIZER;
static struct kvi_http_deferred *dq[64];
static int dq_n;

static void h_deferred(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_http_deferred *d = kvi_http_defer(res);
    pthread_mutex_lock(&dq_mu);
    dq[dq_n++] = d;
    pthread_cond_broadcast(&dq_cv);
    pthread_mutex_unlock(&dq_mu);
}

static struct kvi_http_deferred *dq_take(void)
{
    struct kvi_http_deferred *d = NULL;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&dq_mu);
    while (dq_n == 0)
        if (pthread_cond_timedwait(&dq_cv, &dq_mu, &until) == ETIMEDOUT)
            break;
    if (dq_n > 0) {
        d = dq[0];
        memmove(dq, dq + 1, (size_t)(--dq_n) * sizeof dq[0]);
    }
    pthread_mutex_unlock(&dq_mu);
    return d;
}

/* Pulled stream of ?size=N pattern bytes. */
struct pull_state {
    size_t size, pos;
};
static atomic_int pull_calls, pull_released, pull_outcome;

static ssize_t pull_fn(void *ud, void *buf, size_t cap)
{
    struct pull_state *p = ud;
    size_t n = p->size - p->pos < cap ? p->size - p->pos : cap;
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)buf)[i] = pat(p->pos + i);
    p->pos += n;
    atomic_fetch_add(&pull_calls, 1);
    return (ssize_t)n;
}

static void pull_release(void *ud, int outcome)
{
    atomic_store(&pull_outcome, outcome);
    atomic_fetch_add(&pull_released, 1);
    free(ud);
}

static void h_pull(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct pull_state *p = calloc(1, sizeof *p);
    p->size = query_size(req);
    struct kvi_http_producer prod = {pull_fn, pull_release, p};
    kvi_http_stream_pull(res, 200, "application/octet-stream", &prod);
}

/* Pushed stream: a writer thread feeds ?size=N pattern bytes in uneven pieces. */
struct push_job {
    struct kvi_http_stream *st;
    size_t size;
    int first_error; /* first nonzero kvi_http_stream_write result */
    size_t written;
};
static pthread_t push_threads[16];
static struct push_job *push_jobs[16];
static int push_n;

static void *push_main(void *arg)
{
    struct push_job *j = arg;
    uint8_t piece[70001];
    size_t step[] = {1, 100, 70001, 4096, 33333};
    size_t k = 0;
    while (j->written < j->size) {
        size_t n = step[k++ % 5];
        if (n > j->size - j->written)
            n = j->size - j->written;
        for (size_t i = 0; i < n; i++)
            piece[i] = pat(j->written + i);
        int rc = kvi_http_stream_write(j->st, piece, n);
        if (rc != 0) {
            j->first_error = rc;
            break;
        }
        j->written += n;
    }
    kvi_http_stream_end(j->st, 0);
    return NULL;
}

static void h_push(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct push_job *j = calloc(1, sizeof *j);
    j->size = query_size(req);
    j->st = kvi_http_stream_open(res, 200, "application/octet-stream");
    pthread_mutex_lock(&dq_mu);
    push_jobs[push_n] = j;
    pthread_create(&push_threads[push_n], NULL, push_main, j);
    push_n++;
    pthread_mutex_unlock(&dq_mu);
}

static void push_join_all(void)
{
    pthread_mutex_lock(&dq_mu);
    int n = push_n;
    pthread_mutex_unlock(&dq_mu);
    for (int i = 0; i < n; i++) {
        pthread_join(push_threads[i], NULL);
        free(push_jobs[i]);
    }
    push_n = 0;
}

/* ---- client ---- */

struct resp {
    long status;
    long version;
    CURLcode rc;
    uint8_t *body;
    size_t len;
    size_t cap;
    size_t abort_after; /* 0: never */
    char ctype[128];
    char allow[128];
    char www[64];
    char echo[16];
};

struct reqspec {
    const char *path;
    long httpver; /* CURL_HTTP_VERSION_* */
    const char *method;
    const void *body;
    size_t body_len;
    const char *ctype;
    const char *auth;
    long timeout_ms;
    bool tls;
    const char *cafile;
    uint16_t port;
    size_t abort_after; /* the client stops reading after this many bytes; 0: never */
    bool path_as_is;    /* send the path unchanged (curl squashes dot segments otherwise) */
};

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    struct resp *r = ud;
    size_t k = sz * n;
    if (r->len + k + 1 > r->cap) {
        r->cap = (r->len + k + 1) * 2;
        r->body = realloc(r->body, r->cap);
    }
    memcpy(r->body + r->len, p, k);
    r->len += k;
    r->body[r->len] = 0;
    if (r->abort_after != 0 && r->len >= r->abort_after)
        return 0;
    return k;
}

static void copy_header(char *dst, size_t cap, const char *v, size_t n)
{
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n'))
        n--;
    while (n > 0 && *v == ' ') {
        v++;
        n--;
    }
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud)
{
    struct resp *r = ud;
    size_t k = sz * n;
    if (k > 13 && strncasecmp(p, "content-type:", 13) == 0)
        copy_header(r->ctype, sizeof r->ctype, p + 13, k - 13);
    else if (k > 6 && strncasecmp(p, "allow:", 6) == 0)
        copy_header(r->allow, sizeof r->allow, p + 6, k - 6);
    else if (k > 17 && strncasecmp(p, "www-authenticate:", 17) == 0)
        copy_header(r->www, sizeof r->www, p + 17, k - 17);
    else if (k > 11 && strncasecmp(p, "x-echo-len:", 11) == 0)
        copy_header(r->echo, sizeof r->echo, p + 11, k - 11);
    return k;
}

static void resp_free(struct resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

static uint16_t g_port;

static void fetch(const struct reqspec *q, struct resp *r)
{
    char url[512];
    struct curl_slist *hdrs = NULL;
    CURL *c = curl_easy_init();
    memset(r, 0, sizeof *r);
    r->abort_after = q->abort_after;
    snprintf(url, sizeof url, "%s://%s:%u%s", q->tls ? "https" : "http", q->tls ? "localhost" : "127.0.0.1",
             q->port ? q->port : g_port, q->path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, q->httpver ? q->httpver : (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, q->timeout_ms ? q->timeout_ms : 20000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    if (q->tls) {
        char res[64];
        snprintf(res, sizeof res, "localhost:%u:127.0.0.1", q->port ? q->port : g_port);
        hdrs = NULL;
        struct curl_slist *resolve = curl_slist_append(NULL, res);
        curl_easy_setopt(c, CURLOPT_RESOLVE, resolve);
        curl_easy_setopt(c, CURLOPT_CAINFO, q->cafile);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
        curl_easy_setopt(c, CURLOPT_PRIVATE, resolve);
    }
    if (q->path_as_is)
        curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    if (q->method != NULL)
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
    if (q->method != NULL && strcmp(q->method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (q->body != NULL) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
    }
    char line[256];
    if (q->ctype != NULL) {
        snprintf(line, sizeof line, "Content-Type: %s", q->ctype);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (q->auth != NULL) {
        snprintf(line, sizeof line, "Authorization: %s", q->auth);
        hdrs = curl_slist_append(hdrs, line);
    }
    hdrs = curl_slist_append(hdrs, "Accept: application/json");
    hdrs = curl_slist_append(hdrs, "X-Custom: custom-value");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    r->rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_getinfo(c, CURLINFO_HTTP_VERSION, &r->version);
    if (q->tls) {
        struct curl_slist *resolve = NULL;
        curl_easy_getinfo(c, CURLINFO_PRIVATE, (char **)&resolve);
        curl_slist_free_all(resolve);
    }
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
}

static void get(const char *path, long httpver, struct resp *r)
{
    struct reqspec q = {.path = path, .httpver = httpver};
    fetch(&q, r);
}

static bool is_json_error(const struct resp *r)
{
    return strcmp(r->ctype, "application/json") == 0 && r->len > 12 &&
           memcmp(r->body, "{\"error\":\"", 10) == 0 && memcmp(r->body + r->len - 2, "\"}", 2) == 0;
}

/* ---- the shared server ---- */

static struct kvi_http_server *g_srv;
static int r_hello, r_echo, r_small, r_deferred;
static atomic_int thread_inits, thread_finis;

static void *t_init(unsigned idx, void *ud)
{
    atomic_fetch_add(&thread_inits, 1);
    return (void *)(uintptr_t)(idx + 100);
}

static void t_fini(unsigned idx, void *tctx, void *ud)
{
    if ((uintptr_t)tctx == idx + 100)
        atomic_fetch_add(&thread_finis, 1);
}

static void add_routes(struct kvi_http_server *s)
{
    struct kvi_http_route_opts small = {.body_limit = 1024};
    struct kvi_http_route_opts admin = {.flags = KVI_HTTP_ROUTE_ADMIN};
    r_hello = kvi_http_server_route(s, KVI_HTTP_GET, "/hello", h_hello, NULL, NULL);
    r_echo = kvi_http_server_route(s, KVI_HTTP_POST | KVI_HTTP_PUT, "/echo", h_echo, NULL, NULL);
    r_small = kvi_http_server_route(s, KVI_HTTP_POST, "/small", h_echo, NULL, &small);
    assert_int_equal(kvi_http_server_route(s, KVI_HTTP_ANY, "/view", h_view, NULL, NULL), 3);
    kvi_http_server_route(s, KVI_HTTP_GET, "/owned", h_owned, NULL, NULL);
    kvi_http_server_route(s, KVI_HTTP_GET, "/noanswer", h_noanswer, NULL, NULL);
    kvi_http_server_route(s, KVI_HTTP_POST, "/badjson", h_badjson, NULL, NULL);
    r_deferred = kvi_http_server_route(s, KVI_HTTP_GET | KVI_HTTP_POST, "/deferred", h_deferred, NULL, NULL);
    kvi_http_server_route(s, KVI_HTTP_GET, "/pull", h_pull, NULL, NULL);
    kvi_http_server_route(s, KVI_HTTP_GET, "/push", h_push, NULL, NULL);
    kvi_http_server_route(s, KVI_HTTP_GET, "/admin", h_hello, NULL, &admin);
    kvi_http_server_route(s, KVI_HTTP_DELETE, "/hello", h_hello, NULL, NULL);
    assert_int_equal(kvi_http_server_route(s, KVI_HTTP_GET, "nope", h_hello, NULL, NULL), -EINVAL);
    assert_int_equal(kvi_http_server_route(s, 0, "/x", h_hello, NULL, NULL), -EINVAL);
}

static int group_setup(void **state)
{
    curl_global_init(CURL_GLOBAL_ALL);
    struct kvi_http_options o;
    kvi_http_options_init(&o);
    o.host = "127.0.0.1";
    o.port = 0;
    o.threads = 2;
    o.body_limit = 64 * 1024;
    o.admin_token = "s3cret";
    o.max_conns_per_addr = 0; /* test_idle_connections opens thousands from 127.0.0.1 */
    o.thread_init = t_init;
    o.thread_fini = t_fini;
    g_srv = kvi_http_server_create(&o);
    if (g_srv == NULL)
        return -1;
    add_routes(g_srv);
    if (kvi_http_server_start(g_srv) != 0)
        return -1;
    assert_int_equal(kvi_http_server_route(g_srv, KVI_HTTP_GET, "/late", h_hello, NULL, NULL), -EBUSY);
    g_port = kvi_http_server_port(g_srv);
    return g_port == 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
    int rc = kvi_http_server_stop(g_srv);
    push_join_all();
    kvi_http_server_free(g_srv);
    curl_global_cleanup();
    /* Both loops ran their per-thread hooks. */
    return rc == 0 && atomic_load(&thread_inits) == 2 && atomic_load(&thread_finis) == 2 ? 0 : -1;
}

/* ---- tests: protocols ---- */

static void test_http11(void **state)
{
    struct resp r;
    get("/hello", CURL_HTTP_VERSION_1_1, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.version, CURL_HTTP_VERSION_1_1);
    assert_string_equal(r.ctype, "application/json");
    assert_non_null(strstr((char *)r.body, "\"hello\":\"world\""));
    assert_non_null(strstr((char *)r.body, "\"version\":257"));
    resp_free(&r);

    /* HEAD on a GET route: headers only. */
    struct reqspec q = {.path = "/hello", .method = "HEAD"};
    fetch(&q, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, 0);
    resp_free(&r);
}

static void test_h2c_prior_knowledge(void **state)
{
    struct resp r;
    get("/hello", CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.version, CURL_HTTP_VERSION_2_0);
    assert_non_null(strstr((char *)r.body, "\"version\":512"));
    resp_free(&r);
}

static void test_h2c_upgrade(void **state)
{
    struct resp r;
    get("/hello", CURL_HTTP_VERSION_2_0, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.version, CURL_HTTP_VERSION_2_0);
    resp_free(&r);

    /* POST with a body through the upgrade: the body is echoed back. */
    const char body[] = "{\"k\":[1,2,3]}";
    struct reqspec q = {.path = "/echo", .httpver = CURL_HTTP_VERSION_2_0, .body = body,
                        .body_len = strlen(body), .ctype = "application/json"};
    fetch(&q, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 201);
    assert_int_equal(r.version, CURL_HTTP_VERSION_2_0);
    assert_int_equal(r.len, strlen(body));
    assert_memory_equal(r.body, body, r.len);
    assert_string_equal(r.ctype, "application/json");
    assert_string_equal(r.echo, "yes");
    resp_free(&r);
}

static void test_request_view(void **state)
{
    struct resp r;
    struct reqspec q = {.path = "/view?a=1&b=two", .method = "PATCH", .body = "x", .body_len = 1,
                        .ctype = "application/msgpack", .auth = "Bearer tok"};
    fetch(&q, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal((char *)r.body, "method=PATCH path=/view query=a=1&b=two ct=application/msgpack "
                                        "accept=application/json auth=Bearer tok custom=custom-value tls=0");
    resp_free(&r);

    get("/owned", CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal((char *)r.body, "owned body");
    resp_free(&r);
}

/* ---- TLS ---- */

static char tls_dir[64], tls_cert[128], tls_key[128];

static int write_self_signed(void)
{
    snprintf(tls_dir, sizeof tls_dir, "/tmp/kvi-http-tls-XXXXXX");
    if (mkdtemp(tls_dir) == NULL)
        return -1;
    snprintf(tls_cert, sizeof tls_cert, "%s/cert.pem", tls_dir);
    snprintf(tls_key, sizeof tls_key, "%s/key.pem", tls_dir);
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1, -1, 0);
    X509_set_issuer_name(x, name);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
    const char *exts[][2] = {{"subjectAltName", "DNS:localhost,IP:127.0.0.1"}, {"basicConstraints", "critical,CA:TRUE"}};
    for (size_t i = 0; i < 2; i++) {
        X509_EXTENSION *e = X509V3_EXT_conf(NULL, &v3, exts[i][0], exts[i][1]);
        X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
    }
    X509_sign(x, key, EVP_sha256());
    FILE *f = fopen(tls_cert, "w");
    PEM_write_X509(f, x);
    fclose(f);
    f = fopen(tls_key, "w");
    PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(key);
    return 0;
}

static void test_tls_alpn(void **state)
{
    assert_int_equal(write_self_signed(), 0);
    struct kvi_http_options o;
    kvi_http_options_init(&o);
    o.host = "127.0.0.1";
    o.threads = 1;
    o.tls_cert_file = tls_cert;
    o.tls_key_file = tls_key;
    struct kvi_http_server *s = kvi_http_server_create(&o);
    assert_non_null(s);
    add_routes(s);
    assert_int_equal(kvi_http_server_start(s), 0);
    uint16_t port = kvi_http_server_port(s);

    struct resp r;
    struct reqspec q = {.path = "/view", .httpver = CURL_HTTP_VERSION_2TLS, .tls = true, .cafile = tls_cert,
                        .port = port};
    fetch(&q, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.version, CURL_HTTP_VERSION_2_0); /* ALPN chose h2 */
    assert_non_null(strstr((char *)r.body, "tls=1"));
    resp_free(&r);

    q.httpver = CURL_HTTP_VERSION_1_1; /* ALPN offers http/1.1 only */
    fetch(&q, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.version, CURL_HTTP_VERSION_1_1);
    resp_free(&r);

    q.path = "/nope"; /* JSON errors over TLS too */
    q.httpver = CURL_HTTP_VERSION_2TLS;
    fetch(&q, &r);
    assert_int_equal(r.status, 404);
    assert_true(is_json_error(&r));
    resp_free(&r);

    assert_int_equal(kvi_http_server_stop(s), 0);
    kvi_http_server_free(s);

    /* A key that does not match the certificate is refused. */
    o.tls_key_file = tls_cert;
    errno = 0;
    assert_null(kvi_http_server_create(&o));
    assert_int_equal(errno, EINVAL);
    unlink(tls_cert);
    unlink(tls_key);
    rmdir(tls_dir);
}

/* ---- errors ---- */

static void test_json_errors(void **state)
{
    long versions[] = {CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE};
    for (int v = 0; v < 2; v++) {
        struct resp r;
        get("/no/such/path", versions[v], &r);
        assert_int_equal(r.status, 404);
        assert_true(is_json_error(&r));
        assert_non_null(strstr((char *)r.body, "/no/such/path"));
        resp_free(&r);

        struct reqspec q = {.path = "/hello", .httpver = versions[v], .body = "{}", .body_len = 2};
        fetch(&q, &r); /* POST on GET+DELETE */
        assert_int_equal(r.status, 405);
        assert_true(is_json_error(&r));
        assert_string_equal(r.allow, "GET, HEAD, DELETE");
        resp_free(&r);

        get("/noanswer", versions[v], &r);
        assert_int_equal(r.status, 500);
        assert_true(is_json_error(&r));
        resp_free(&r);

        q = (struct reqspec){.path = "/badjson", .httpver = versions[v], .body = "{", .body_len = 1};
        fetch(&q, &r); /* handler error: quotes and control characters escaped */
        assert_int_equal(r.status, 400);
        assert_true(is_json_error(&r));
        assert_string_equal((char *)r.body, "{\"error\":\"bad \\\"json\\\" at byte 7\\u000a\\u0001\"}");
        resp_free(&r);

        get("/admin", versions[v], &r);
        assert_int_equal(r.status, 401);
        assert_true(is_json_error(&r));
        assert_string_equal(r.www, "Bearer");
        resp_free(&r);
        q = (struct reqspec){.path = "/admin", .httpver = versions[v], .auth = "Bearer wrong"};
        fetch(&q, &r);
        assert_int_equal(r.status, 401);
        resp_free(&r);
        q.auth = "bearer s3cret";
        fetch(&q, &r);
        assert_int_equal(r.status, 200);
        resp_free(&r);
    }
}

static void test_body_limits(void **state)
{
    size_t big = 100 * 1024; /* over the global 64 KiB */
    uint8_t *body = malloc(big);
    for (size_t i = 0; i < big; i++)
        body[i] = pat(i);
    long versions[] = {CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE};
    for (int v = 0; v < 2; v++) {
        struct resp r;
        /* per-route limit 1 KiB: 2 KiB is refused with JSON 413, 1 KiB passes */
        struct reqspec q = {.path = "/small", .httpver = versions[v], .body = body, .body_len = 2048};
        fetch(&q, &r);
        assert_int_equal(r.status, 413);
        assert_true(is_json_error(&r));
        assert_non_null(strstr((char *)r.body, "1024-byte limit"));
        resp_free(&r);
        q.body_len = 1024;
        fetch(&q, &r);
        assert_int_equal(r.status, 201);
        assert_int_equal(r.len, 1024);
        assert_true(pat_ok(r.body, r.len));
        resp_free(&r);

        /* a body under the global limit is echoed whole */
        q = (struct reqspec){.path = "/echo", .httpver = versions[v], .body = body, .body_len = 60000};
        fetch(&q, &r);
        assert_int_equal(r.status, 201);
        assert_int_equal(r.len, 60000);
        assert_true(pat_ok(r.body, r.len));
        resp_free(&r);

        /* over the global limit */
        q.body_len = big;
        fetch(&q, &r);
        if (v == 0) {
            /* HTTP/1.1: refused from Content-Length before the body is read, as JSON */
            assert_int_equal(r.status, 413);
            assert_true(is_json_error(&r));
        } else {
            /* HTTP/2: h2o 2.2 resets the stream */
            assert_true(r.rc != CURLE_OK || r.status == 413);
            assert_int_not_equal(r.status, 201);
        }
        resp_free(&r);
    }
    free(body);
}

/* ---- deferred completion ---- */

struct client_job {
    struct reqspec q;
    struct resp r;
    pthread_t tid;
};

static void *client_main(void *arg)
{
    struct client_job *j = arg;
    fetch(&j->q, &j->r);
    return NULL;
}

static void client_start(struct client_job *j)
{
    pthread_create(&j->tid, NULL, client_main, j);
}

static void test_deferred_other_thread(void **state)
{
    long versions[] = {CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, CURL_HTTP_VERSION_2_0};
    for (int v = 0; v < 3; v++) {
        struct client_job j = {.q = {.path = "/deferred", .httpver = versions[v]}};
        client_start(&j);
        struct kvi_http_deferred *d = dq_take();
        assert_non_null(d);
        char body[32];
        int n = snprintf(body, sizeof body, "{\"late\":%d}", v);
        kvi_http_complete(d, 202, "application/json", body, (size_t)n);
        pthread_join(j.tid, NULL);
        assert_int_equal(j.r.rc, CURLE_OK);
        assert_int_equal(j.r.status, 202);
        assert_int_equal(j.r.len, (size_t)n);
        assert_memory_equal(j.r.body, body, (size_t)n);
        resp_free(&j.r);
    }
    /* error completion */
    struct client_job j = {.q = {.path = "/deferred", .httpver = CURL_HTTP_VERSION_1_1}};
    client_start(&j);
    struct kvi_http_deferred *d = dq_take();
    assert_non_null(d);
    kvi_http_complete_error(d, 409, "conflict on %s", "x");
    pthread_join(j.tid, NULL);
    assert_int_equal(j.r.status, 409);
    assert_string_equal((char *)j.r.body, "{\"error\":\"conflict on x\"}");
    resp_free(&j.r);
}

static bool aborted_at_least(void *arg)
{
    struct kvi_http_counters c;
    kvi_http_route_stats(g_srv, r_deferred, &c);
    return c.aborted >= *(uint64_t *)arg;
}

static bool nothing_in_flight(void *arg)
{
    struct kvi_http_stats st;
    kvi_http_server_stats(arg, &st);
    return st.in_flight == 0;
}

static void test_deferred_client_gone(void **state)
{
    long versions[] = {CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, CURL_HTTP_VERSION_1_1};
    for (int v = 0; v < 2; v++) {
        struct kvi_http_counters before;
        kvi_http_route_stats(g_srv, r_deferred, &before);
        struct client_job j = {.q = {.path = "/deferred", .httpver = versions[v], .timeout_ms = 300}};
        client_start(&j);
        struct kvi_http_deferred *d = dq_take();
        assert_non_null(d);
        pthread_join(j.tid, NULL); /* the client gave up and closed its connection */
        assert_int_equal(j.r.rc, CURLE_OPERATION_TIMEDOUT);
        resp_free(&j.r);
        uint64_t want = before.aborted + 1;
        if (v == 0) /* HTTP/2: the request is freed as soon as the connection closes */
            assert_true(wait_for(aborted_at_least, &want));
        /* Completing afterwards must be harmless (ASan checks the rest); over
         * HTTP/1.1 the late answer goes to the closed socket. */
        kvi_http_complete(d, 200, "text/plain", "too late", 8);
        assert_true(wait_for(nothing_in_flight, g_srv));
    }
    /* The server still serves. */
    struct resp r;
    get("/hello", CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, &r);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

/* ---- streams ---- */

static bool pull_was_released(void *arg)
{
    return atomic_load(&pull_released) == 1;
}

static void test_stream_pull(void **state)
{
    size_t size = 6 * 1024 * 1024 + 12345;
    char path[64];
    snprintf(path, sizeof path, "/pull?size=%zu", size);
    long versions[] = {CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE};
    for (int v = 0; v < 2; v++) {
        atomic_store(&pull_calls, 0);
        atomic_store(&pull_released, 0);
        atomic_store(&pull_outcome, 99);
        struct resp r;
        get(path, versions[v], &r);
        assert_int_equal(r.rc, CURLE_OK);
        assert_int_equal(r.status, 200);
        assert_int_equal(r.len, size);
        assert_true(pat_ok(r.body, r.len));
        resp_free(&r);
        /* pulled in chunks as the client drained, released once with success */
        assert_true(atomic_load(&pull_calls) >= (int)(size / KVI_HTTP_PULL_CHUNK));
        assert_int_equal(atomic_load(&pull_released), 1);
        assert_int_equal(atomic_load(&pull_outcome), 0);
    }

    /* The client aborts half-way: the producer is released with -EPIPE. */
    atomic_store(&pull_released, 0);
    struct resp r;
    struct reqspec q = {.path = path, .httpver = CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, .abort_after = 1024 * 1024};
    fetch(&q, &r);
    assert_int_equal(r.rc, CURLE_WRITE_ERROR);
    resp_free(&r);
    assert_true(wait_for(pull_was_released, NULL));
    assert_int_equal(atomic_load(&pull_outcome), -EPIPE);
}

static void test_stream_push(void **state)
{
    size_t size = 8 * 1024 * 1024 + 777;
    char path[64];
    snprintf(path, sizeof path, "/push?size=%zu", size);
    long versions[] = {CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE};
    for (int v = 0; v < 2; v++) {
        struct resp r;
        get(path, versions[v], &r);
        if (r.rc != CURLE_OK)
            fprintf(stderr, "push v=%d rc=%d len=%zu status=%ld\n", v, r.rc, r.len, r.status);
        assert_int_equal(r.rc, CURLE_OK);
        assert_int_equal(r.status, 200);
        assert_int_equal(r.len, size);
        assert_true(pat_ok(r.body, r.len));
        resp_free(&r);
        pthread_mutex_lock(&dq_mu);
        struct push_job *j = push_jobs[push_n - 1];
        pthread_mutex_unlock(&dq_mu);
        pthread_join(push_threads[push_n - 1], NULL);
        assert_int_equal(j->first_error, 0);
        assert_int_equal(j->written, size);
        free(j);
        push_n--;
    }

    /* The client leaves after 1 MiB: the writer gets -EPIPE and stops. */
    snprintf(path, sizeof path, "/push?size=%zu", (size_t)512 * 1024 * 1024);
    struct resp r;
    struct reqspec q = {.path = path, .httpver = CURL_HTTP_VERSION_1_1, .abort_after = 1024 * 1024};
    fetch(&q, &r);
    assert_int_equal(r.rc, CURLE_WRITE_ERROR);
    resp_free(&r);
    pthread_join(push_threads[push_n - 1], NULL);
    struct push_job *j = push_jobs[push_n - 1];
    assert_int_equal(j->first_error, -EPIPE);
    assert_true(j->written < (size_t)512 * 1024 * 1024);
    free(j);
    push_n--;
}

/* ---- threads, connections, counters ---- */

static void test_both_loops_serve(void **state)
{
    bool seen[2] = {false, false};
    for (int i = 0; i < 400 && !(seen[0] && seen[1]); i++) {
        struct resp r;
        get("/hello", CURL_HTTP_VERSION_1_1, &r); /* a new connection each time */
        assert_int_equal(r.status, 200);
        char *t = strstr((char *)r.body, "\"thread\":");
        assert_non_null(t);
        int idx = atoi(t + 9);
        assert_true(idx == 0 || idx == 1);
        seen[idx] = true;
        resp_free(&r);
    }
    assert_true(seen[0]);
    assert_true(seen[1]);
}

/* A failure is counted (with the first bad status), not asserted: cmocka
 * asserts belong to the main thread, which checks after the join. */
static atomic_int hammer_bad;
static atomic_long hammer_bad_status;

static void *hammer(void *arg)
{
    long ver = (long)(intptr_t)arg;
    for (int i = 0; i < 50; i++) {
        struct resp r;
        get("/hello", ver, &r);
        if (r.status != 200 && atomic_fetch_add(&hammer_bad, 1) == 0)
            atomic_store(&hammer_bad_status, r.status);
        resp_free(&r);
    }
    return NULL;
}

static void test_concurrent_clients(void **state)
{
    pthread_t t[6];
    long vers[] = {CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, CURL_HTTP_VERSION_2_0};
    atomic_store(&hammer_bad, 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&t[i], NULL, hammer, (void *)(intptr_t)vers[i % 3]), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    if (atomic_load(&hammer_bad) != 0)
        fail_msg("%d of 300 requests failed, the first with status %ld", atomic_load(&hammer_bad),
                 atomic_load(&hammer_bad_status));
}

struct conns_want {
    struct kvi_http_server *s;
    uint64_t n;
};

static bool conns_open_at_least(void *arg)
{
    struct conns_want *w = arg;
    struct kvi_http_stats st;
    kvi_http_server_stats(w->s, &st);
    return st.conns_accepted >= w->n;
}

static void test_idle_connections(void **state)
{
    /* Thousands of idle connections do not stall a query (10,000 in
     * production; here bounded by this process's descriptor limit). */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl); /* the server raised the soft limit as far as it could */
    int N = rl.rlim_cur > 6400 ? 3000 : (int)(rl.rlim_cur - 400) / 2;
    assert_true(N >= 500);
    int *fds = malloc((size_t)N * sizeof *fds);
    struct kvi_http_stats base;
    kvi_http_server_stats(g_srv, &base);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(g_port), .sin_addr.s_addr = htonl(0x7f000001)};
    int opened = 0;
    for (; opened < N; opened++) {
        fds[opened] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fds[opened] >= 0);
        assert_int_equal(connect(fds[opened], (struct sockaddr *)&a, sizeof a), 0);
    }
    struct conns_want want = {g_srv, base.conns_accepted + (uint64_t)N};
    assert_true(wait_for(conns_open_at_least, &want));
    double t0 = now_s();
    for (int i = 0; i < 20; i++) {
        struct resp r;
        get("/hello", i % 2 ? CURL_HTTP_VERSION_1_1 : CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, &r);
        assert_int_equal(r.status, 200);
        resp_free(&r);
    }
    double dt = now_s() - t0;
    assert_true(dt < 2.0); /* 20 queries, each a fresh connection */
    struct kvi_http_stats st;
    kvi_http_server_stats(g_srv, &st);
    assert_true(st.conns_open >= (uint64_t)N);
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    free(fds);
}

static void test_counters(void **state)
{
    struct kvi_http_counters before, after;
    assert_int_equal(kvi_http_route_stats(g_srv, r_hello, &before), 0);
    for (int i = 0; i < 5; i++) {
        struct resp r;
        get("/hello", CURL_HTTP_VERSION_1_1, &r);
        resp_free(&r);
    }
    struct resp r;
    struct reqspec q = {.path = "/hello", .method = "PUT", .body = "abc", .body_len = 3};
    fetch(&q, &r); /* 405: counted as unmatched */
    resp_free(&r);
    assert_int_equal(kvi_http_route_stats(g_srv, r_hello, &after), 0);
    assert_int_equal(after.requests - before.requests, 5);
    assert_int_equal(after.status[2] - before.status[2], 5);
    assert_true(after.bytes_out - before.bytes_out >= 5 * 20);
    assert_true(after.latency_ns_sum > before.latency_ns_sum);
    uint64_t sum = 0;
    for (int i = 0; i <= KVI_HTTP_LATENCY_BUCKETS; i++)
        sum += after.latency_buckets[i] - before.latency_buckets[i];
    assert_int_equal(sum, 5);

    struct kvi_http_stats st;
    kvi_http_server_stats(g_srv, &st);
    assert_true(st.unmatched.status[4] >= 1);
    assert_true(st.all.requests >= st.unmatched.requests + after.requests);
    assert_int_equal(st.listeners, 2);
    assert_int_equal(kvi_http_route_count(g_srv), 12);
    unsigned m = 0;
    assert_string_equal(kvi_http_route_path(g_srv, r_echo, &m), "/echo");
    assert_int_equal(m, KVI_HTTP_POST | KVI_HTTP_PUT);
    assert_null(kvi_http_route_path(g_srv, 99, NULL));
    assert_int_equal(kvi_http_route_stats(g_srv, 99, &after), -ENOENT);
    assert_int_equal(kvi_http_route_stats(g_srv, r_small, &after), 0);
}

/* ---- HTTP/1.1 framing and request targets (issue 18, item 7) ---- */

/* A raw TCP connection to the shared server; reads give up after 5 s. */
static int raw_connect(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(g_port), .sin_addr.s_addr = htonl(0x7f000001)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Send all of @p s in one write where the kernel allows (one segment on loopback). */
static void raw_send(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        assert_true(k > 0);
        s += k;
        n -= (size_t)k;
    }
}

/*
 * Read until the server closes the connection or 5 s pass without a byte.
 * @return bytes read into @p buf (NUL-terminated); *closed tells whether the
 *         server closed (end-of-file, or a reset after its answer).
 */
static size_t raw_read_to_close(int fd, char *buf, size_t cap, bool *closed)
{
    size_t n = 0;
    *closed = false;
    for (;;) {
        ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
        if (k > 0) {
            n += (size_t)k;
            if (n == cap - 1)
                break;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        *closed = k == 0 || errno == ECONNRESET;
        break;
    }
    buf[n] = '\0';
    return n;
}

/* Bytes of the whole responses (head and Content-Length body) at the start of @p buf, up to @p count. */
static size_t raw_whole(const char *buf, size_t n, int count)
{
    size_t at = 0;
    for (int k = 0; k < count; k++) {
        const char *end = strstr(buf + at, "\r\n\r\n");
        if (end == NULL)
            return 0;
        const char *cl = strcasestr(buf + at, "\r\ncontent-length:");
        size_t want = (size_t)(end + 4 - buf) + (cl != NULL && cl < end ? strtoull(cl + 17, NULL, 10) : 0);
        if (n < want)
            return 0;
        at = want;
    }
    return at;
}

/* Read @p count whole responses into @p buf (NUL-terminated) without waiting for a close. */
static size_t raw_read_n(int fd, char *buf, size_t cap, int count)
{
    size_t n = 0;
    for (;;) {
        buf[n] = '\0';
        if (raw_whole(buf, n, count) != 0 || n == cap - 1)
            return n;
        ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return n;
        n += (size_t)k;
    }
}

/* How many status lines @p buf holds (anywhere: a body may run into the next answer). */
static int raw_count_responses(const char *buf)
{
    int n = 0;
    for (const char *p = buf; (p = strstr(p, "HTTP/1.1 ")) != NULL; p += 9)
        n++;
    return n;
}

static int raw_status(const char *buf)
{
    return strncmp(buf, "HTTP/1.1 ", 9) == 0 ? atoi(buf + 9) : -1;
}

static const char *raw_body(const char *buf)
{
    const char *end = strstr(buf, "\r\n\r\n");
    return end != NULL ? end + 4 : "";
}

static uint64_t rejected_now(void)
{
    struct kvi_http_stats st;
    kvi_http_server_stats(g_srv, &st);
    return st.rejected;
}

/*
 * Send @p req on a fresh connection and expect exactly one answer: 400 with
 * a JSON error naming @p why and `Connection: close`, then the close.
 */
static void expect_400_close(const char *req, size_t len, const char *why)
{
    char buf[8192];
    bool closed;
    int fd = raw_connect();
    raw_send(fd, req, len);
    raw_read_to_close(fd, buf, sizeof buf, &closed);
    close(fd);
    if (raw_count_responses(buf) != 1 || raw_status(buf) != 400 || !closed)
        print_error("request:\n%s\nanswer (closed=%d):\n%s\n", req, closed, buf);
    assert_int_equal(raw_count_responses(buf), 1);
    assert_int_equal(raw_status(buf), 400);
    assert_non_null(strcasestr(buf, "\r\nconnection: close\r\n"));
    assert_non_null(strcasestr(buf, "\r\ncontent-type: application/json\r\n"));
    assert_true(strncmp(raw_body(buf), "{\"error\":\"", 10) == 0);
    assert_non_null(strstr(raw_body(buf), why));
    assert_true(closed);
}

#define EXPECT_400_CLOSE(lit, why) expect_400_close(lit, sizeof(lit) - 1, why)

static void test_framing_rejected(void **state)
{
    uint64_t r0 = rejected_now();
    /* Content-Length and Transfer-Encoding together, either order: h2o reads it chunked. */
    EXPECT_400_CLOSE("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "0\r\n\r\n",
                     "Content-Length and Transfer-Encoding");
    EXPECT_400_CLOSE("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\ncontent-length: 3\r\n\r\n"
                     "3\r\nabc\r\n0\r\n\r\n",
                     "Content-Length and Transfer-Encoding");
    /* Two Content-Length values, 0 then 38: the 38-byte body is a whole
     * request that h2o (first value wins) would have served as the next one. */
    EXPECT_400_CLOSE("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 38\r\n"
                     "Content-Type: application/json\r\n\r\n"
                     "GET /hello HTTP/1.1\r\nHost: xxxxxxx\r\n\r\n",
                     "Content-Length");
    /* Identical duplicates are refused too (RFC 9110 8.6 allows either). */
    EXPECT_400_CLOSE("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
                     "Content-Length");
    /* Transfer-Encoding twice (h2o reads only the last). */
    EXPECT_400_CLOSE("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "3\r\nabc\r\n0\r\n\r\n",
                     "Transfer-Encoding");
    /* Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1). */
    EXPECT_400_CLOSE("POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                     "Transfer-Encoding");
    /* A header folded onto the next line (obs-fold). */
    EXPECT_400_CLOSE("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nX-Folded: a\r\n b\r\n\r\nabc",
                     "folded");
    assert_int_equal(rejected_now() - r0, 7);
}

static void test_target_rejected(void **state)
{
    uint64_t r0 = rejected_now();
    /* Percent-encoding anywhere in the path: h2o decoded %68 to reach /hello. */
    EXPECT_400_CLOSE("GET /%68ello HTTP/1.1\r\nHost: x\r\n\r\n", "percent");
    EXPECT_400_CLOSE("GET /hello%2F HTTP/1.1\r\nHost: x\r\n\r\n", "percent");
    EXPECT_400_CLOSE("GET /hel%zzlo HTTP/1.1\r\nHost: x\r\n\r\n", "percent");
    /* Dot segments: h2o resolved them to reach /hello. */
    EXPECT_400_CLOSE("GET /x/../hello HTTP/1.1\r\nHost: x\r\n\r\n", "dot segment");
    EXPECT_400_CLOSE("GET /./hello HTTP/1.1\r\nHost: x\r\n\r\n", "dot segment");
    EXPECT_400_CLOSE("GET /hello/.. HTTP/1.1\r\nHost: x\r\n\r\n", "dot segment");
    EXPECT_400_CLOSE("GET /hello/.?a=b HTTP/1.1\r\nHost: x\r\n\r\n", "dot segment");
    /* Absolute-form, asterisk-form and authority-form targets. */
    EXPECT_400_CLOSE("GET http://127.0.0.1/hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "origin-form");
    EXPECT_400_CLOSE("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", "origin-form");
    EXPECT_400_CLOSE("CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: x\r\n\r\n", "origin-form");
    assert_int_equal(rejected_now() - r0, 10);

    /* HTTP/2: the same path rules, answered on the stream. */
    const char *bad[] = {"/%68ello", "/x/../hello", "/hello/."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct resp r;
        struct reqspec q = {.path = bad[i], .httpver = CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, .path_as_is = true};
        fetch(&q, &r);
        assert_int_equal(r.rc, CURLE_OK);
        assert_int_equal(r.version, CURL_HTTP_VERSION_2_0);
        assert_int_equal(r.status, 400);
        assert_true(is_json_error(&r));
        resp_free(&r);
    }
    assert_int_equal(rejected_now() - r0, 13);
}

static void test_target_allowed(void **state)
{
    char buf[8192];
    uint64_t r0 = rejected_now();
    int fd = raw_connect();
    /* A plain request, then a query string (where '%' and dots are the handler's business) on the same connection. */
    const char a[] = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, a, sizeof a - 1);
    raw_read_n(fd, buf, sizeof buf, 1);
    assert_int_equal(raw_status(buf), 200);
    assert_non_null(strcasestr(buf, "\r\nconnection: keep-alive\r\n"));
    const char b[] = "GET /view?model_name=m%2F..&x=/../y HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, b, sizeof b - 1);
    raw_read_n(fd, buf, sizeof buf, 1);
    assert_int_equal(raw_status(buf), 200);
    assert_non_null(strstr(raw_body(buf), "method=GET path=/view query=model_name=m%2F..&x=/../y "));
    /* Two pipelined requests in one write, a body by Content-Length and one chunked. */
    const char c[] = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                     "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n0\r\n\r\n";
    raw_send(fd, c, sizeof c - 1);
    raw_read_n(fd, buf, sizeof buf, 2);
    assert_int_equal(raw_whole(buf, strlen(buf), 2), strlen(buf));
    size_t first = raw_whole(buf, strlen(buf), 1);
    assert_int_equal(raw_status(buf), 201);
    assert_memory_equal(buf + first - 3, "abc", 3);
    assert_int_equal(raw_status(buf + first), 201);
    assert_string_equal(raw_body(buf + first), "de");
    /* Dots inside a segment are no dot segments. */
    const char d[] = "GET /.well-known/x..y HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, d, sizeof d - 1);
    raw_read_n(fd, buf, sizeof buf, 1);
    assert_int_equal(raw_status(buf), 404);
    close(fd);
    /* An empty segment is routed as received, not squashed: no route. */
    struct resp r;
    struct reqspec q = {.path = "//hello", .path_as_is = true};
    fetch(&q, &r);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    q = (struct reqspec){.path = "/view?a=%41", .httpver = CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE};
    fetch(&q, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr((char *)r.body, "path=/view query=a=%41 "));
    resp_free(&r);
    assert_int_equal(rejected_now() - r0, 0);
}

/* ---- graceful stop ---- */

struct stopper {
    struct kvi_http_server *s;
    pthread_t tid;
    int rc;
    double took;
};

static void *stop_main(void *arg)
{
    struct stopper *st = arg;
    double t0 = now_s();
    st->rc = kvi_http_server_stop(st->s);
    st->took = now_s() - t0;
    return NULL;
}

static bool listeners_closed(void *arg)
{
    struct kvi_http_stats st;
    kvi_http_server_stats(arg, &st);
    return st.listeners == 0;
}

static struct kvi_http_server *small_server(unsigned grace_ms)
{
    struct kvi_http_options o;
    kvi_http_options_init(&o);
    o.host = "127.0.0.1";
    o.threads = 2;
    o.shutdown_grace_ms = grace_ms;
    struct kvi_http_server *s = kvi_http_server_create(&o);
    assert_non_null(s);
    add_routes(s);
    assert_int_equal(kvi_http_server_start(s), 0);
    return s;
}

static void test_stop_graceful(void **state)
{
    long versions[] = {CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE};
    for (int v = 0; v < 2; v++) {
        struct kvi_http_server *s = small_server(1500);
        uint16_t port = kvi_http_server_port(s);

        /* An idle keep-alive connection must not hold the stop up. */
        CURL *idle = curl_easy_init();
        char url[128];
        snprintf(url, sizeof url, "http://127.0.0.1:%u/hello", port);
        curl_easy_setopt(idle, CURLOPT_URL, url);
        curl_easy_setopt(idle, CURLOPT_WRITEFUNCTION, on_body);
        struct resp ir = {0};
        curl_easy_setopt(idle, CURLOPT_WRITEDATA, &ir);
        assert_int_equal(curl_easy_perform(idle), CURLE_OK);
        resp_free(&ir);

        struct client_job j = {.q = {.path = "/deferred", .httpver = versions[v], .port = port}};
        client_start(&j);
        struct kvi_http_deferred *d = dq_take();
        assert_non_null(d);

        struct stopper st = {.s = s};
        pthread_create(&st.tid, NULL, stop_main, &st);
        assert_true(wait_for(listeners_closed, s));
        /* New connections are refused now. */
        struct resp r;
        struct reqspec q = {.path = "/hello", .port = port, .timeout_ms = 2000};
        fetch(&q, &r);
        assert_int_equal(r.rc, CURLE_COULDNT_CONNECT);
        resp_free(&r);

        /* The in-flight request still completes. */
        kvi_http_complete(d, 200, "application/json", "{\"ok\":true}", 11);
        pthread_join(j.tid, NULL);
        assert_int_equal(j.r.rc, CURLE_OK);
        assert_int_equal(j.r.status, 200);
        assert_string_equal((char *)j.r.body, "{\"ok\":true}");
        resp_free(&j.r);

        pthread_join(st.tid, NULL);
        assert_int_equal(st.rc, 0); /* nothing had to be cut */
        assert_true(st.took < 2.0);
        assert_int_equal(kvi_http_server_stop(s), 0); /* idempotent */
        kvi_http_server_free(s);
        curl_easy_cleanup(idle);
    }
}

static bool push_started(void *arg)
{
    pthread_mutex_lock(&dq_mu);
    int n = push_n;
    pthread_mutex_unlock(&dq_mu);
    return n > 0;
}

static void test_stop_forced(void **state)
{
    struct kvi_http_server *s = small_server(300);
    uint16_t port = kvi_http_server_port(s);
    struct client_job j = {.q = {.path = "/deferred", .httpver = CURL_HTTP_VERSION_1_1, .port = port}};
    client_start(&j);
    struct kvi_http_deferred *d = dq_take();
    assert_non_null(d);
    char path[64];
    snprintf(path, sizeof path, "/push?size=%zu", (size_t)1 << 40); /* never ends by itself */
    struct client_job pj = {.q = {.path = path, .httpver = CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE, .port = port}};
    client_start(&pj);
    assert_true(wait_for(push_started, NULL));
    double t0 = now_s();
    int rc = kvi_http_server_stop(s);
    double took = now_s() - t0;
    assert_int_equal(rc, 1);
    assert_true(took < 2.0);
    pthread_join(j.tid, NULL);
    /* The pending deferred request was answered 503 at the deadline. */
    assert_int_equal(j.r.status, 503);
    assert_true(is_json_error(&j.r));
    resp_free(&j.r);
    pthread_join(pj.tid, NULL);
    assert_int_not_equal(pj.r.rc, CURLE_OK);
    resp_free(&pj.r);
    pthread_join(push_threads[push_n - 1], NULL);
    assert_int_equal(push_jobs[push_n - 1]->first_error, -EPIPE);
    free(push_jobs[push_n - 1]);
    push_n--;
    /* Completing after the stop is still safe; then the server can be freed. */
    kvi_http_complete(d, 200, NULL, "x", 1);
    kvi_http_server_free(s);
}

static void test_create_errors(void **state)
{
    struct kvi_http_options o;
    kvi_http_options_init(&o);
    o.host = "127.0.0.1";
    o.threads = 0;
    assert_null(kvi_http_server_create(&o));
    assert_int_equal(errno, EINVAL);
    o.threads = 1;
    o.tls_cert_file = "/nonexistent";
    assert_null(kvi_http_server_create(&o));
    assert_int_equal(errno, EINVAL);
    o.tls_key_file = "/nonexistent";
    assert_null(kvi_http_server_create(&o));
    assert_int_equal(errno, EINVAL);

    /* A port in use by a socket without SO_REUSEPORT is refused. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(0x7f000001)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    kvi_http_options_init(&o);
    o.host = "127.0.0.1";
    o.port = ntohs(a.sin_port);
    assert_null(kvi_http_server_create(&o));
    assert_int_equal(errno, EADDRINUSE);
    close(fd);

    /* Created but never started: free releases the sockets. */
    o.port = 0;
    struct kvi_http_server *s = kvi_http_server_create(&o);
    assert_non_null(s);
    assert_true(kvi_http_server_port(s) != 0);
    assert_int_equal(kvi_http_server_stop(s), 0);
    kvi_http_server_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http11),
        cmocka_unit_test(test_h2c_prior_knowledge),
        cmocka_unit_test(test_h2c_upgrade),
        cmocka_unit_test(test_request_view),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_body_limits),
        cmocka_unit_test(test_deferred_other_thread),
        cmocka_unit_test(test_deferred_client_gone),
        cmocka_unit_test(test_stream_pull),
        cmocka_unit_test(test_stream_push),
        cmocka_unit_test(test_both_loops_serve),
        cmocka_unit_test(test_concurrent_clients),
        cmocka_unit_test(test_idle_connections),
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_framing_rejected),
        cmocka_unit_test(test_target_rejected),
        cmocka_unit_test(test_target_allowed),
        cmocka_unit_test(test_tls_alpn),
        cmocka_unit_test(test_stop_graceful),
        cmocka_unit_test(test_stop_forced),
        cmocka_unit_test(test_create_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
