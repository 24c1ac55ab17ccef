/*
 * kvidx HTTP client on libcurl's easy interface (see net/http_client.h).
 *
 * One easy handle per client, reused across requests so connections stay
 * alive (except with h2c prior knowledge, see the header). It runs through a
 * multi handle of the client's own, polled at most
 * KVI_HTTP_CLIENT_CANCEL_POLL_MS at a time, so the cancel hook is asked
 * while curl waits for a connection or an answer (curl_easy_perform would
 * block until a timeout, and its progress callback runs only about once a
 * second while nothing arrives). The write callback looks at the status once
 * per answer: 2xx bodies stream to the caller, other bodies are kept (cut) as
 * the error text. curl_global_init runs once, under pthread_once, before the
 * first handle exists.
 */
#include "net/http_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>


struct kvi_http_client {
    CURL *curl;
    CURLM *multi;
    struct kvi_http_client_options opt;
    char *token_header;
    char errbuf[CURL_ERROR_SIZE];
};

/* State of one request, seen by the callbacks. */
struct xfer {
    CURL *curl;
    struct kvi_http_result *res;
    kvi_http_body_fn fn;
    void *ud;
    int status; /* of the answer being received; 0 until known */
    size_t err_len;
    bool cancelled;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_ALL);
}

void kvi_http_client_options_init(struct kvi_http_client_options *o)
{
    memset(o, 0, sizeof *o);
    o->connect_timeout_ms = 2000;
    o->timeout_ms = 10000;
    o->proto = KVI_HTTP_CLIENT_H2C_UPGRADE;
}

static void client_free(struct kvi_http_client *c);

struct kvi_http_client *kvi_http_client_create(const struct kvi_http_client_options *o)
{
    struct kvi_http_client_options def;
    if (o == NULL) {
        kvi_http_client_options_init(&def);
        o = &def;
    }
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        errno = EIO;
        return NULL;
    }
    struct kvi_http_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    c->opt = *o;
    c->opt.bearer_token = NULL;
    c->opt.ca_file = o->ca_file != NULL ? strdup(o->ca_file) : NULL;
    if (o->bearer_token != NULL && o->bearer_token[0] != '\0') {
        size_t n = strlen(o->bearer_token) + sizeof "Authorization: Bearer ";
        c->token_header = malloc(n);
        if (c->token_header != NULL)
            snprintf(c->token_header, n, "Authorization: Bearer %s", o->bearer_token);
    }
    c->curl = curl_easy_init();
    c->multi = curl_multi_init();
    if (c->curl == NULL || c->multi == NULL || (o->ca_file != NULL && c->opt.ca_file == NULL) ||
        (o->bearer_token != NULL && o->bearer_token[0] != '\0' && c->token_header == NULL)) {
        client_free(c);
        errno = ENOMEM;
        return NULL;
    }
    return c;
}

/* kvi_http_client_free's work, also for a client kvi_http_client_create could not finish. */
static void client_free(struct kvi_http_client *c)
{
    if (c == NULL)
        return;
    if (c->curl != NULL)
        curl_easy_cleanup(c->curl);
    if (c->multi != NULL)
        curl_multi_cleanup(c->multi); /* closes the connections it kept */
    free((char *)c->opt.ca_file);
    free(c->token_header);
    free(c);
}

void kvi_http_client_free(struct kvi_http_client *c)
{
    client_free(c);
}

/* ---- callbacks ---- */

static void copy_trimmed(char *dst, size_t cap, const char *v, size_t n)
{
    while (n > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    struct xfer *x = arg;
    size_t len = size * n;
    if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) {
        /* A new answer starts (after 100 Continue or 101 Switching Protocols). */
        x->res->content_type[0] = '\0';
        x->status = 0;
    } else if (len > 13 && strncasecmp(p, "content-type:", 13) == 0) {
        copy_trimmed(x->res->content_type, sizeof x->res->content_type, p + 13, len - 13);
    }
    return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    struct xfer *x = arg;
    size_t len = size * n;
    if (x->status == 0) {
        long st = 0;
        curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &st);
        x->status = (int)st;
    }
    if (x->status < 200 || x->status > 299) {
        size_t room = sizeof x->res->error - 1 - x->err_len;
        size_t k = len < room ? len : room;
        memcpy(x->res->error + x->err_len, p, k);
        x->err_len += k;
        x->res->error[x->err_len] = '\0';
        return len;
    }
    if (x->fn != NULL && len != 0 && x->fn(x->ud, p, len) != 0) {
        x->cancelled = true;
        return 0; /* makes curl stop with CURLE_WRITE_ERROR */
    }
    x->res->body_bytes += len;
    return len;
}

/* ---- requests ---- */

static bool cancelled_by_caller(const struct kvi_http_client *c)
{
    return c->opt.cancel != NULL && c->opt.cancel(c->opt.cancel_ud);
}

/*
 * Run the prepared easy handle to completion through the client's multi
 * handle, asking the cancel hook between polls.
 * @return curl's result, or CURLE_ABORTED_BY_CALLBACK with *stopped set
 *         when the hook cancelled the request.
 */
static CURLcode perform(struct kvi_http_client *c, bool *stopped)
{
    CURL *h = c->curl;
    CURLM *m = c->multi;
    *stopped = false;
    if (cancelled_by_caller(c)) {
        *stopped = true;
        return CURLE_ABORTED_BY_CALLBACK;
    }
    CURLMcode mc = curl_multi_add_handle(m, h);
    if (mc != CURLM_OK)
        return mc == CURLM_OUT_OF_MEMORY ? CURLE_OUT_OF_MEMORY : CURLE_FAILED_INIT;
    CURLcode rc = CURLE_FAILED_INIT;
    for (;;) {
        int running = 0;
        mc = curl_multi_perform(m, &running);
        if (mc != CURLM_OK) {
            rc = mc == CURLM_OUT_OF_MEMORY ? CURLE_OUT_OF_MEMORY : CURLE_FAILED_INIT;
            break;
        }
        if (running == 0) {
            CURLMsg *msg;
            int left;
            while ((msg = curl_multi_info_read(m, &left)) != NULL)
                if (msg->msg == CURLMSG_DONE && msg->easy_handle == h)
                    rc = msg->data.result;
            break;
        }
        if (cancelled_by_caller(c)) {
            *stopped = true;
            rc = CURLE_ABORTED_BY_CALLBACK;
            break;
        }
        mc = curl_multi_poll(m, NULL, 0, KVI_HTTP_CLIENT_CANCEL_POLL_MS, NULL);
        if (mc != CURLM_OK) {
            rc = mc == CURLM_OUT_OF_MEMORY ? CURLE_OUT_OF_MEMORY : CURLE_FAILED_INIT;
            break;
        }
    }
    curl_multi_remove_handle(m, h); /* an unfinished transfer is dropped with its connection */
    return rc;
}

static int map_error(CURLcode rc)
{
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return -EHOSTUNREACH;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        return -EINVAL;
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_BAD_CONTENT_ENCODING:
        return -EPROTO;
    default:
        return -EIO;
    }
}

static int run(struct kvi_http_client *c, const char *url, const char *ctype, const void *body, size_t len,
               bool post, kvi_http_body_fn fn, void *ud, struct kvi_http_result *res)
{
    CURL *h = c->curl;
    struct xfer x = {.curl = h, .res = res, .fn = fn, .ud = ud};
    struct curl_slist *hdrs = NULL;
    char ctline[160];
    long version;

    memset(res, 0, sizeof *res);
    if (url == NULL) {
        snprintf(res->error, sizeof res->error, "no URL");
        return -EINVAL;
    }
    switch (c->opt.proto) {
    case KVI_HTTP_CLIENT_H1:
        version = CURL_HTTP_VERSION_1_1;
        break;
    case KVI_HTTP_CLIENT_H2C_PRIOR:
        version = strncasecmp(url, "https:", 6) == 0 ? CURL_HTTP_VERSION_2TLS : CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE;
        break;
    default:
        version = CURL_HTTP_VERSION_2_0;
        break;
    }

    curl_easy_reset(h);
    c->errbuf[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, version);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->opt.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)c->opt.timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, c->opt.proto == KVI_HTTP_CLIENT_H2C_PRIOR ? 1L : 0L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
    if (c->opt.ca_file != NULL)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->opt.ca_file);
    if (c->opt.insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (post) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body != NULL ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        hdrs = curl_slist_append(hdrs, "Expect:"); /* no 100-continue round trip */
        if (ctype != NULL) {
            snprintf(ctline, sizeof ctline, "Content-Type: %s", ctype);
            hdrs = curl_slist_append(hdrs, ctline);
        }
    }
    if (c->token_header != NULL)
        hdrs = curl_slist_append(hdrs, c->token_header);
    if (hdrs != NULL)
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);

    bool stopped;
    CURLcode rc = perform(c, &stopped);
    curl_slist_free_all(hdrs);

    long st = 0, hv = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_easy_getinfo(h, CURLINFO_HTTP_VERSION, &hv);
    res->status = (int)st;
    res->http_version = hv == CURL_HTTP_VERSION_1_0 ? 0x100
                        : hv == CURL_HTTP_VERSION_1_1 ? 0x101
                        : hv == CURL_HTTP_VERSION_2_0 ? 0x200
                                                       : 0;
    if (st == 0)
        res->http_version = 0;
    if (x.cancelled) {
        snprintf(res->error, sizeof res->error, "cancelled by the body callback after %llu bytes",
                 (unsigned long long)res->body_bytes);
        return -ECANCELED;
    }
    if (stopped) {
        snprintf(res->error, sizeof res->error, "cancelled by the caller after %llu body bytes",
                 (unsigned long long)res->body_bytes);
        return -ECANCELED;
    }
    if (rc != CURLE_OK) {
        snprintf(res->error, sizeof res->error, "%s", c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
        return map_error(rc);
    }
    if (st < 200 || st > 299) {
        if (x.err_len == 0)
            snprintf(res->error, sizeof res->error, "HTTP status %ld", st);
        return -EREMOTEIO;
    }
    return 0;
}

int kvi_http_get(struct kvi_http_client *c, const char *url, kvi_http_body_fn fn, void *ud,
                 struct kvi_http_result *res)
{
    return run(c, url, NULL, NULL, 0, false, fn, ud, res);
}

int kvi_http_post(struct kvi_http_client *c, const char *url, const char *ctype, const void *body, size_t len,
                  kvi_http_body_fn fn, void *ud, struct kvi_http_result *res)
{
    return run(c, url, ctype, body, len, true, fn, ud, res);
}
