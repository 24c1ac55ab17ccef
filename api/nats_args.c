/*
 * kvidxd's NATS flags (api/nats_args.h).
 */
#include "api/nats_args.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common.h"

enum {
    F_NATS, F_USER, F_PASSWORD, F_TOKEN, F_CREDS, F_TLS_CA, F_SOURCE, F_STREAM, F_DURABLE, F_FETCH, F_REGISTRY,
    F_SNAPSHOT, F_SNAP_EVERY, F_PUBLISH,
};

static const struct {
    const char *name;
} flags[] = {
    [F_NATS] = {"--nats"},           [F_USER] = {"--nats-user"},       [F_PASSWORD] = {"--nats-password"},
    [F_TOKEN] = {"--nats-token"},    [F_CREDS] = {"--nats-creds"},     [F_TLS_CA] = {"--nats-tls-ca"},
    [F_SOURCE] = {"--nats-source"},  [F_STREAM] = {"--nats-stream"},   [F_DURABLE] = {"--nats-durable"},
    [F_FETCH] = {"--nats-fetch-batch"}, [F_REGISTRY] = {"--nats-registry"},
    [F_SNAPSHOT] = {"--nats-snapshot"}, [F_SNAP_EVERY] = {"--nats-snapshot-every-s"},
    [F_PUBLISH] = {"--nats-publish"},
};

/* Which flag arg is (value after '=' in *v), or -1. */
static int flag_of(const char *arg, const char **v)
{
    *v = NULL;
    for (size_t f = 0; f < KVI_ARRAY_LEN(flags); f++) {
        size_t n = strlen(flags[f].name);
        if (strncmp(arg, flags[f].name, n) == 0 && (arg[n] == '\0' || arg[n] == '=')) {
            if (arg[n] == '=')
                *v = arg + n + 1;
            return (int)f;
        }
    }
    return -1;
}

int kvi_nats_source_parse(enum kvi_nats_kind kind, const char *s, struct kvi_nats_source_arg *out,
                          const char **why)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    const char *eq = strchr(s, '=');
    const char *at = strrchr(s, '@');
    if (eq == NULL || at == NULL || at < eq) {
        *why = "expected NAME=MODEL[:TENANT]@BLOCK_SIZE";
        return -EINVAL;
    }
    if (eq == s) {
        *why = kind == KVI_NATS_CORE ? "empty subject" : "empty stream name";
        return -EINVAL;
    }
    char *end;
    errno = 0;
    unsigned long bs = strtoul(at + 1, &end, 10);
    if (errno != 0 || end == at + 1 || *end != '\0' || bs == 0 || bs > UINT32_MAX || at[1] == '-') {
        *why = "BLOCK_SIZE is not a positive integer";
        return -EINVAL;
    }
    out->block_size = (uint32_t)bs;
    const char *m = eq + 1;
    size_t mlen = (size_t)(at - m);
    const char *colon = memrchr(m, ':', mlen);
    size_t model_len = colon ? (size_t)(colon - m) : mlen;
    if (model_len == 0 || (colon != NULL && colon + 1 == at)) {
        *why = "empty model or tenant";
        return -EINVAL;
    }
    out->model = strndup(m, model_len);
    out->tenant = colon ? strndup(colon + 1, (size_t)(at - colon - 1)) : strdup("default");
    size_t nlen = (size_t)(eq - s);
    if (kind == KVI_NATS_CORE) {
        out->subject = strndup(s, nlen);
    } else {
        const char *slash = memchr(s, '/', nlen);
        out->stream = strndup(s, slash ? (size_t)(slash - s) : nlen);
        if (slash != NULL && slash + 1 < eq)
            out->subject = strndup(slash + 1, (size_t)(eq - slash - 1));
        if (out->stream != NULL && out->stream[0] == '\0') {
            *why = "empty stream name";
            return -EINVAL;
        }
    }
    if (out->model == NULL || out->tenant == NULL || (kind == KVI_NATS_CORE ? out->subject : out->stream) == NULL)
        kvi_die("out of memory");
    return 0;
}

/* "kvidx-<host>", the host's characters outside [A-Za-z0-9_-] as '-'. */
static char *durable_default(void)
{
    char host[HOST_NAME_MAX + 1] = "host";
    if (gethostname(host, sizeof host) != 0)
        strcpy(host, "host");
    host[sizeof host - 1] = '\0';
    size_t n = strlen(host);
    char *d = kvi_xmalloc(n + 7);
    memcpy(d, "kvidx-", 6);
    for (size_t i = 0; i < n; i++) {
        char c = host[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                  c == '-';
        d[6 + i] = ok ? c : '-';
    }
    d[6 + n] = '\0';
    return d;
}

static int apply(struct kvi_nats_args *a, int f, const char *v)
{
    struct kvi_nats_config *c = &a->conn;
    switch (f) {
    case F_NATS: c->servers = v; return 0;
    case F_USER: c->user = v; return 0;
    case F_PASSWORD: c->password = v; return 0;
    case F_TOKEN: c->token = v; return 0;
    case F_CREDS: c->creds_file = v; return 0;
    case F_TLS_CA: c->tls_ca = v; return 0;
    case F_DURABLE: c->durable = v; return 0;
    case F_REGISTRY: a->registry = v; return 0;
    case F_SNAPSHOT: a->snapshot = v; return 0;
    case F_SNAP_EVERY: {
        char *end;
        errno = 0;
        unsigned long n = strtoul(v, &end, 10);
        if (errno != 0 || end == v || *end != '\0' || n == 0 || n > 86400 || *v == '-') {
            fprintf(stderr, "kvidxd: --nats-snapshot-every-s: invalid value '%s' (1..86400)\n", v);
            return -EINVAL;
        }
        a->snapshot_every_s = (uint32_t)n;
        return 0;
    }
    case F_PUBLISH: a->publish = v; return 0;
    case F_FETCH: {
        char *end;
        errno = 0;
        unsigned long n = strtoul(v, &end, 10);
        if (errno != 0 || end == v || *end != '\0' || n == 0 || n > 100000 || *v == '-') {
            fprintf(stderr, "kvidxd: --nats-fetch-batch: invalid value '%s' (1..100000)\n", v);
            return -EINVAL;
        }
        c->fetch_batch = (uint32_t)n;
        return 0;
    }
    case F_SOURCE:
    case F_STREAM: {
        a->sources = kvi_xrealloc(a->sources, (a->n_sources + 1) * sizeof *a->sources);
        const char *why;
        int rc = kvi_nats_source_parse(f == F_SOURCE ? KVI_NATS_CORE : KVI_NATS_STREAM, v,
                                       &a->sources[a->n_sources], &why);
        a->n_sources++; /* (freed by kvi_nats_args_free even when malformed) */
        if (rc != 0) {
            fprintf(stderr, "kvidxd: %s '%s': %s\n", flags[f].name, v, why);
            return rc;
        }
        return 0;
    }
    }
    return -EINVAL;
}

int kvi_nats_args(int *argc, char **argv, struct kvi_nats_args *out)
{
    memset(out, 0, sizeof *out);
    int keep = 1;
    bool any = false;
    for (int i = 1; i < *argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--") == 0) {
            while (i < *argc)
                argv[keep++] = argv[i++];
            break;
        }
        int f = flag_of(argv[i], &v);
        if (f < 0) {
            argv[keep++] = argv[i];
            continue;
        }
        if (v == NULL) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "kvidxd: %s needs a value (see --help)\n", flags[f].name);
                return -EINVAL;
            }
            v = argv[++i];
        }
        any = true;
        if (apply(out, f, v) != 0)
            return -EINVAL;
    }
    argv[keep] = NULL;
    *argc = keep;
    for (const char *p = out->registry; p != NULL && *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_')) {
            fprintf(stderr, "kvidxd: --nats-registry '%s': a bucket name is [A-Za-z0-9_-]+\n", out->registry);
            return -EINVAL;
        }
    for (const char *p = out->snapshot; p != NULL && *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_')) {
            fprintf(stderr, "kvidxd: --nats-snapshot '%s': a bucket name is [A-Za-z0-9_-]+\n", out->snapshot);
            return -EINVAL;
        }
    if (out->snapshot != NULL && *out->snapshot == '\0') {
        fprintf(stderr, "kvidxd: --nats-snapshot needs a bucket name\n");
        return -EINVAL;
    }
    if (out->snapshot_every_s == 0)
        out->snapshot_every_s = KVI_NATS_SNAPSHOT_EVERY_S_DEFAULT;
    for (const char *p = out->publish; p != NULL && *p; p++)
        if (*p == '.' || *p == '*' || *p == '>' || *p == '/' || *p == '\\' || (unsigned char)*p <= ' ') {
            fprintf(stderr, "kvidxd: --nats-publish '%s': a stream name has no '.', '*', '>', '/', '\\' or "
                            "white space\n", out->publish);
            return -EINVAL;
        }
    if (out->publish != NULL && (*out->publish == '\0' || strlen(out->publish) > 200)) {
        fprintf(stderr, "kvidxd: --nats-publish needs a stream name (1..200 bytes)\n");
        return -EINVAL;
    }
    if (out->registry != NULL && *out->registry == '\0') {
        fprintf(stderr, "kvidxd: --nats-registry needs a bucket name\n");
        return -EINVAL;
    }
    if (any && out->conn.servers == NULL) {
        fprintf(stderr, "kvidxd: NATS flags need --nats URL[,URL]\n");
        return -EINVAL;
    }
    if (out->conn.servers != NULL && out->conn.durable == NULL) {
        out->durable_default = durable_default();
        out->conn.durable = out->durable_default;
    }
    return 0;
}

void kvi_nats_args_free(struct kvi_nats_args *a)
{
    for (size_t i = 0; i < a->n_sources; i++) {
        free(a->sources[i].subject);
        free(a->sources[i].stream);
        free(a->sources[i].model);
        free(a->sources[i].tenant);
    }
    free(a->sources);
    free(a->durable_default);
    memset(a, 0, sizeof *a);
}

void kvi_nats_args_usage(FILE *f)
{
    fprintf(f,
            "\n"
            "Dynamo KV events on NATS (api/README.md, \"Dynamo on NATS\"):\n"
            "  --nats URLS            NATS servers, comma-separated (nats://host:4222); retried forever\n"
            "  --nats-source 'SUBJECT=MODEL[:TENANT]@BLOCK_SIZE'  Core NATS subject (wildcards allowed)\n"
            "                         whose RouterEvents feed that index; repeatable\n"
            "  --nats-stream 'STREAM[/SUBJECT]=MODEL[:TENANT]@BLOCK_SIZE'  JetStream stream (and\n"
            "                         filter subject) read whole by a durable pull consumer; repeatable\n"
            "  --nats-durable NAME    durable consumer name (default kvidx-<hostname>; no '.')\n"
            "  --nats-fetch-batch N   JetStream messages per fetch (default 256)\n"
            "  --nats-registry BUCKET share registrations with every replica through a JetStream\n"
            "                         Key-Value bucket (created if missing)\n"
            "  --nats-snapshot BUCKET write periodic snapshots of every --nats-stream namespace into\n"
            "                         that Key-Value bucket (created if missing), start from the newest\n"
            "                         one plus the stream after it, and purge what it and every\n"
            "                         durable consumer cover\n"
            "  --nats-snapshot-every-s N  snapshot period (default 300)\n"
            "  --nats-publish STREAM  publish every ZMQ registration's events to that JetStream stream\n"
            "                         as Dynamo RouterEvent JSON (created if missing; query-only\n"
            "                         replicas read it with --nats-stream)\n"
            "  --nats-user U --nats-password P, --nats-token T, --nats-creds FILE,\n"
            "  --nats-tls-ca FILE     authentication and TLS, as libnats offers them\n");
}
