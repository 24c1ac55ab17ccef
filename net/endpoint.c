/* Endpoint validation and --workers parsing (http-api.md §1.1). */
#include "net/endpoint.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* Parse all of [s, s+len) as an unsigned decimal no larger than max. */
static bool parse_uint(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    if (len == 0 || len > 20)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

int kvi_endpoint_validate(const char *ep, char *err, size_t errlen)
{
    if (ep == NULL || *ep == '\0')
        return fail(err, errlen, "empty endpoint");
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return 0;
    const char *sep = strstr(ep, "://");
    if (sep == NULL)
        return fail(err, errlen, "invalid endpoint '%s': missing scheme (expected tcp://host:port, ipc:// or inproc://)", ep);
    if (sep - ep != 3 || strncmp(ep, "tcp", 3) != 0)
        return fail(err, errlen, "invalid endpoint '%s': unsupported scheme '%.*s'", ep, (int)(sep - ep), ep);
    const char *host = sep + 3, *colon;
    size_t hostlen;
    if (*host == '[') {
        const char *close = strchr(host, ']');
        if (close == NULL || close == host + 1)
            return fail(err, errlen, "invalid endpoint '%s': malformed IPv6 host", ep);
        if (close[1] != ':')
            return fail(err, errlen, "invalid endpoint '%s': missing port", ep);
        colon = close + 1;
        hostlen = (size_t)(close - host - 1);
    } else {
        colon = strrchr(host, ':');
        if (colon == NULL)
            return fail(err, errlen, "invalid endpoint '%s': missing port", ep);
        hostlen = (size_t)(colon - host);
        if (memchr(host, ':', hostlen) != NULL)
            return fail(err, errlen, "invalid endpoint '%s': IPv6 hosts must be in brackets", ep);
    }
    if (hostlen == 0)
        return fail(err, errlen, "invalid endpoint '%s': missing host", ep);
    uint64_t port;
    const char *p = colon + 1;
    if (!parse_uint(p, strlen(p), 65535, &port))
        return fail(err, errlen, "invalid endpoint '%s': port must be 0-65535", ep);
    return 0;
}

int kvi_workers_parse(const char *spec, struct kvi_worker_spec *out, size_t cap, size_t *n, char *err,
                      size_t errlen)
{
    *n = 0;
    if (spec == NULL)
        return 0;
    const char *s = spec;
    while (*s != '\0') {
        const char *end = strchr(s, ',');
        size_t len = end != NULL ? (size_t)(end - s) : strlen(s);
        const char *next = end != NULL ? end + 1 : s + len;
        if (len == 0) {
            s = next;
            continue;
        }
        const char *eq = memchr(s, '=', len);
        if (eq == NULL)
            return fail(err, errlen, "invalid worker entry '%.*s': expected id[:dp_rank]=endpoint", (int)len, s);
        const char *rc = memchr(s, ':', (size_t)(eq - s));
        size_t idlen = (size_t)((rc != NULL ? rc : eq) - s);
        uint64_t id, rank = 0;
        if (!parse_uint(s, idlen, UINT64_MAX, &id))
            return fail(err, errlen, "invalid worker entry '%.*s': instance id must be a u64", (int)len, s);
        if (rc != NULL && !parse_uint(rc + 1, (size_t)(eq - rc - 1), UINT32_MAX, &rank))
            return fail(err, errlen, "invalid worker entry '%.*s': dp_rank must be a u32", (int)len, s);
        size_t eplen = len - (size_t)(eq + 1 - s);
        if (*n == cap)
            return -ENOSPC;
        struct kvi_worker_spec *w = &out[*n];
        if (eplen >= sizeof(w->endpoint))
            return fail(err, errlen, "invalid worker entry '%.*s': endpoint too long", (int)len, s);
        memcpy(w->endpoint, eq + 1, eplen);
        w->endpoint[eplen] = '\0';
        char why[200];
        if (kvi_endpoint_validate(w->endpoint, why, sizeof(why)) != 0)
            return fail(err, errlen, "invalid worker entry '%.*s': %s", (int)len, s, why);
        w->instance_id = id;
        w->dp_rank = (uint32_t)rank;
        (*n)++;
        s = next;
    }
    return 0;
}
