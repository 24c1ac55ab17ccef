/*
 * Fuzz target: ZMQ endpoint validation and the `--workers` list
 * (net/endpoint.h: kvi_endpoint_check, kvi_endpoint_validate,
 * kvi_workers_parse; api/codec.h: kvi_endpoint_valid).
 *
 * The whole input is both an endpoint (exact-size, not NUL-terminated) and,
 * up to its first NUL, a `--workers` value. Checks:
 *   - an accepted endpoint has the documented shape, re-derived here:
 *     ipc:// or inproc://, or tcp://host:port with a non-empty host that has
 *     no ':' outside brackets and a decimal port <= 65535;
 *   - a rejected one gets one of the reasons net/endpoint.h lists;
 *   - kvi_endpoint_valid and kvi_endpoint_validate agree with it;
 *   - --workers: the return is 0, -EINVAL (with a message) or -ENOSPC; on
 *     success there is one entry per non-empty comma-separated item, every
 *     endpoint is valid, and printing the entries back as
 *     id:rank=endpoint,... parses to the same entries; with a capacity one
 *     short, the same list gives -ENOSPC.
 */
#include <errno.h>
#include <inttypes.h>

#include "api/codec.h"
#include "fuzz.h"
#include "net/endpoint.h"

#define MAX_WORKERS 64

static const char *const reasons[] = {
    "missing scheme", "unsupported scheme", "missing host",
    "missing port", "invalid port", "invalid host",
    "invalid IPv6 host", "an IPv6 host must be in brackets", "empty endpoint",
};

static bool has_prefix(const char *s, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    return n >= k && memcmp(s, lit, k) == 0;
}

/* The documented shape of a valid endpoint. */
static void check_valid_shape(const char *s, size_t n)
{
    if (has_prefix(s, n, "ipc://") || has_prefix(s, n, "inproc://"))
        return;
    FZ_CHECK(has_prefix(s, n, "tcp://"));
    const char *h = s + 6, *end = s + n;
    const char *colon = NULL;
    for (const char *q = end; q > h; q--)
        if (q[-1] == ':') {
            colon = q - 1;
            break;
        }
    FZ_CHECK(colon != NULL && colon > h); /* a port, after a non-empty host */
    size_t plen = (size_t)(end - colon - 1);
    FZ_CHECK(plen >= 1 && plen <= 20);
    uint64_t port = 0;
    for (size_t i = 0; i < plen; i++) {
        FZ_CHECK(colon[1 + i] >= '0' && colon[1 + i] <= '9');
        port = port * 10 + (uint64_t)(colon[1 + i] - '0');
        FZ_CHECK(port <= 65535);
    }
    if (h[0] == '[') {
        FZ_CHECK(colon[-1] == ']' && colon - h > 2); /* [x] at least */
    } else {
        FZ_CHECK(memchr(h, ':', (size_t)(colon - h)) == NULL);
        FZ_CHECK(memchr(h, '/', (size_t)(colon - h)) == NULL);
    }
}

static void check_endpoint(const uint8_t *data, size_t size)
{
    char *ep = fz_dup(data, size, false);
    const char *why = kvi_endpoint_check(ep, size);
    if (why == NULL) {
        check_valid_shape(ep, size);
    } else {
        bool listed = false;
        for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
            listed = listed || strcmp(why, reasons[i]) == 0;
        FZ_CHECK(listed);
    }
    const char *why2 = "unset";
    FZ_CHECK(kvi_endpoint_valid(ep, size, &why2) == (why == NULL));
    FZ_CHECK(why2 == why);
    if (memchr(ep, '\0', size) == NULL) {
        char *z = fz_dup(data, size, true);
        char err[128];
        err[0] = '\0';
        int r = kvi_endpoint_validate(z, err, sizeof(err));
        FZ_CHECK(r == (why == NULL ? 0 : -EINVAL));
        FZ_CHECK(r == 0 || (err[0] != '\0' && memchr(err, '\0', sizeof(err)) != NULL));
        free(z);
    }
    free(ep);
}

static size_t count_items(const char *spec)
{
    size_t n = 0;
    for (const char *s = spec;;) {
        const char *c = strchr(s, ',');
        size_t len = c != NULL ? (size_t)(c - s) : strlen(s);
        n += len > 0;
        if (c == NULL)
            return n;
        s = c + 1;
    }
}

static void check_workers(const uint8_t *data, size_t size)
{
    char *spec = fz_dup(data, size, true); /* up to the first NUL */
    struct kvi_worker_spec *w = calloc(MAX_WORKERS, sizeof(*w));
    struct kvi_worker_spec *w2 = calloc(MAX_WORKERS, sizeof(*w2));
    if (w == NULL || w2 == NULL)
        abort();
    char err[256];
    err[0] = '\0';
    size_t n = 12345;
    int r = kvi_workers_parse(spec, w, MAX_WORKERS, &n, err, sizeof(err));
    FZ_CHECK(r == 0 || r == -EINVAL || r == -ENOSPC);
    FZ_CHECK(n <= MAX_WORKERS);
    if (r == -EINVAL)
        FZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof(err)) != NULL);
    if (r == 0) {
        FZ_CHECK(n == count_items(spec));
        struct kvi_buf b;
        kvi_buf_init(&b);
        for (size_t i = 0; i < n; i++) {
            size_t el = strnlen(w[i].endpoint, sizeof(w[i].endpoint));
            FZ_CHECK(el < sizeof(w[i].endpoint));
            FZ_CHECK(kvi_endpoint_check(w[i].endpoint, el) == NULL);
            FZ_CHECK(strchr(w[i].endpoint, ',') == NULL);
            char head[48];
            snprintf(head, sizeof(head), "%s%" PRIu64 ":%" PRIu32 "=", i ? "," : "",
                     w[i].instance_id, w[i].dp_rank);
            kvi_buf_puts(&b, head);
            kvi_buf_puts(&b, w[i].endpoint);
        }
        kvi_buf_putc(&b, '\0');
        FZ_CHECK(kvi_buf_ok(&b));
        size_t n2 = 0;
        FZ_CHECK(kvi_workers_parse(b.data, w2, MAX_WORKERS, &n2, NULL, 0) == 0);
        FZ_CHECK(n2 == n);
        for (size_t i = 0; i < n; i++) {
            FZ_CHECK(w2[i].instance_id == w[i].instance_id && w2[i].dp_rank == w[i].dp_rank);
            FZ_CHECK(strcmp(w2[i].endpoint, w[i].endpoint) == 0);
        }
        if (n > 0) {
            n2 = 0;
            FZ_CHECK(kvi_workers_parse(spec, w2, n - 1, &n2, NULL, 0) == -ENOSPC);
            FZ_CHECK(n2 == n - 1);
        }
        kvi_buf_free(&b);
    }
    free(w);
    free(w2);
    free(spec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_endpoint(data, size);
    check_workers(data, size);
    return 0;
}
