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

const char *kvi_endpoint_check(const char *s, size_t len)
{
    if (len == 0)
        return "empty endpoint";
    if ((len >= 6 && memcmp(s, "ipc://", 6) == 0) || (len >= 9 && memcmp(s, "inproc://", 9) == 0))
        return NULL;
    if (len < 6 || memcmp(s, "tcp://", 6) != 0) {
        for (size_t i = 0; i + 3 <= len; i++)
            if (memcmp(s + i, "://", 3) == 0)
                return "unsupported scheme";
        return "missing scheme";
    }
    const char *h = s + 6, *end = s + len, *colon;
    if (h < end && *h == '[') {
        const char *close = memchr(h, ']', (size_t)(end - h));
        if (close == NULL || close == h + 1)
            return "invalid IPv6 host";
        if (close + 1 >= end || close[1] != ':')
            return "missing port";
        colon = close + 1;
    } else {
        colon = NULL;
        for (const char *q = end; q > h; q--)
            if (q[-1] == ':') {
                colon = q - 1;
                break;
            }
        if (colon == NULL)
            return "missing port";
        size_t hostlen = (size_t)(colon - h);
        if (hostlen == 0)
            return "missing host";
        if (memchr(h, ':', hostlen) != NULL)
            return "an IPv6 host must be in brackets";
        for (size_t i = 0; i < hostlen; i++)
            if (h[i] == '[' || h[i] == ']' || h[i] == '/' || h[i] == ' ')
                return "invalid host";
    }
    uint64_t port;
    if (!parse_uint(colon + 1, (size_t)(end - colon - 1), 65535, &port))
        return colon + 1 == end ? "missing port" : "invalid port";
    return NULL;
}

int kvi_endpoint_validate(const char *ep, char *err, size_t errlen)
{
    const char *why = kvi_endpoint_check(ep, ep != NULL ? strlen(ep) : 0);
    if (why == NULL)
        return 0;
    return fail(err, errlen, "invalid endpoint '%s': %s (expected tcp://host:port, ipc://... or inproc://...)",
                ep != NULL ? ep : "", why);
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
