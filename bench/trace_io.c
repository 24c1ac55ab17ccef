/*
 * kvidx-bench trace --export / --import (bench/trace_io.h): the timeline as
 * a msgpack stream, written with msgpack-c's packer into a FILE and read back
 * whole (one buffer, msgpack_unpack_next object by object). The format is
 * bench/README.md#timeline-format.
 */
#include <errno.h>
#include <msgpack.h>
#include <msgpack/fbuffer.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace.h"
#include "bench/trace_io.h"
#include "engine/common.h"

/* ---- export ----------------------------------------------------------------- */

static void pk_key(msgpack_packer *pk, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, k, n);
}

static void pk_u64s(msgpack_packer *pk, const char *k, const uint64_t *v, uint32_t n)
{
    pk_key(pk, k);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, v[i]);
}

static const char *const kind_name[] = {"query", "store", "remove"};

static void pack_entry(msgpack_packer *pk, const struct kvi_trace_entry *e)
{
    size_t fields = e->kind == KVI_TRACE_STORE ? 7 : 5;
    msgpack_pack_map(pk, fields);
    pk_key(pk, "t");
    msgpack_pack_uint64(pk, e->t_ns);
    pk_key(pk, "op");
    pk_key(pk, kind_name[e->kind]);
    pk_key(pk, "worker");
    msgpack_pack_uint32(pk, e->worker);
    pk_key(pk, "rank");
    msgpack_pack_uint32(pk, 0);
    if (e->kind != KVI_TRACE_QUERY)
        pk_u64s(pk, "hashes", e->engine_hash, e->n);
    if (e->kind != KVI_TRACE_REMOVE)
        pk_u64s(pk, "content", e->content, e->n);
    if (e->kind == KVI_TRACE_STORE) {
        pk_key(pk, "parent");
        if (e->has_parent)
            msgpack_pack_uint64(pk, e->parent);
        else
            msgpack_pack_nil(pk);
    }
}

int kvi_trace_export(const struct kvi_trace_workload *w, const char *source, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -errno;
    msgpack_packer pk;
    msgpack_packer_init(&pk, f, msgpack_fbuffer_write);
    msgpack_pack_map(&pk, 8);
    pk_key(&pk, "format");
    pk_key(&pk, KVI_TIMELINE_FORMAT);
    pk_key(&pk, "version");
    msgpack_pack_uint32(&pk, KVI_TIMELINE_VERSION);
    pk_key(&pk, "workers");
    msgpack_pack_uint32(&pk, w->n_workers_total);
    pk_key(&pk, "block_size");
    msgpack_pack_uint32(&pk, w->cfg.block_size);
    pk_key(&pk, "entries");
    msgpack_pack_uint64(&pk, w->n);
    pk_key(&pk, "span_ns");
    msgpack_pack_uint64(&pk, w->span_ns);
    pk_key(&pk, "seed");
    msgpack_pack_uint64(&pk, w->cfg.seed);
    pk_key(&pk, "source");
    pk_key(&pk, source ? source : "");
    for (size_t i = 0; i < w->n; i++)
        pack_entry(&pk, &w->e[i]);
    int rc = ferror(f) ? -EIO : 0;
    if (fclose(f) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* ---- import ----------------------------------------------------------------- */

struct reader {
    const char *buf;
    size_t len, off;
    msgpack_unpacked obj;
    char *err;
    size_t err_len;
};

static int fail(struct reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->err_len, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static bool key_is(const msgpack_object *k, const char *name)
{
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, name, n) == 0;
}

/* The value under @p name in map @p m, or NULL (also when @p m is no map). */
static const msgpack_object *field(const msgpack_object *m, const char *name)
{
    if (m->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i].key, name))
            return &m->via.map.ptr[i].val;
    return NULL;
}

static bool get_u64(const msgpack_object *m, const char *name, uint64_t max, uint64_t *v)
{
    const msgpack_object *o = field(m, name);
    if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
        return false;
    *v = o->via.u64;
    return true;
}

static bool get_str(const msgpack_object *m, const char *name, const char *want)
{
    const msgpack_object *o = field(m, name);
    return o != NULL && key_is(o, want);
}

/* An array of unsigned integers: its length, or -1. */
static long u64_array(const msgpack_object *m, const char *name)
{
    const msgpack_object *o = field(m, name);
    if (o == NULL || o->type != MSGPACK_OBJECT_ARRAY)
        return -1;
    for (uint32_t i = 0; i < o->via.array.size; i++)
        if (o->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return -1;
    return (long)o->via.array.size;
}

static uint64_t *copy_u64s(struct kvi_trace_workload *w, const msgpack_object *m, const char *name)
{
    const msgpack_object *o = field(m, name);
    uint64_t *out = kvi_trace__alloc_hashes(w, o->via.array.size);
    for (uint32_t i = 0; i < o->via.array.size; i++)
        out[i] = o->via.array.ptr[i].via.u64;
    return out;
}

static int next_object(struct reader *r, const char *what, size_t idx)
{
    msgpack_unpack_return ret = msgpack_unpack_next(&r->obj, r->buf, r->len, &r->off);
    if (ret == MSGPACK_UNPACK_SUCCESS)
        return 0;
    if (ret == MSGPACK_UNPACK_CONTINUE)
        return fail(r, "%s %zu: the file ends inside it or before it (truncated)", what, idx);
    return fail(r, "%s %zu: not msgpack (at byte %zu)", what, idx, r->off);
}

static int read_header(struct reader *r, struct kvi_trace_workload *w, uint64_t *entries)
{
    if (next_object(r, "header", 0) < 0)
        return -EINVAL;
    const msgpack_object *h = &r->obj.data;
    if (!get_str(h, "format", KVI_TIMELINE_FORMAT))
        return fail(r, "header: not a \"%s\" file", KVI_TIMELINE_FORMAT);
    uint64_t version, workers, bs, seed, span;
    if (!get_u64(h, "version", UINT32_MAX, &version) || version != KVI_TIMELINE_VERSION)
        return fail(r, "header: version missing or not %u", KVI_TIMELINE_VERSION);
    if (!get_u64(h, "workers", UINT32_MAX, &workers) || workers == 0 || !get_u64(h, "block_size", UINT32_MAX, &bs) ||
        bs == 0 || !get_u64(h, "entries", UINT32_MAX, entries) || !get_u64(h, "span_ns", UINT64_MAX, &span) ||
        !get_u64(h, "seed", UINT64_MAX, &seed))
        return fail(r, "header: workers, block_size, entries, span_ns and seed must be unsigned integers "
                       "(workers and block_size >= 1)");
    if (*entries > r->len / 16) /* an entry takes more than 30 bytes */
        return fail(r, "header: %llu entries cannot fit in %zu bytes (truncated?)", (unsigned long long)*entries,
                    r->len);
    kvi_trace_workload_defaults(&w->cfg);
    w->cfg.n_workers = (uint32_t)workers;
    w->cfg.worker_dup = 1;
    w->cfg.block_size = (uint32_t)bs;
    w->cfg.seed = seed;
    w->n_workers_total = (uint32_t)workers;
    w->span_ns = span;
    return 0;
}

static int read_entry(struct reader *r, struct kvi_trace_workload *w, size_t i, uint64_t prev_t)
{
    if (next_object(r, "entry", i) < 0)
        return -EINVAL;
    const msgpack_object *m = &r->obj.data;
    struct kvi_trace_entry *e = &w->e[i];
    memset(e, 0, sizeof *e);
    uint64_t t, worker, rank;
    if (m->type != MSGPACK_OBJECT_MAP || !get_u64(m, "t", UINT64_MAX, &t) ||
        !get_u64(m, "worker", w->n_workers_total - 1, &worker) || !get_u64(m, "rank", UINT32_MAX, &rank))
        return fail(r, "entry %zu: needs t, worker (< %u) and rank", i, w->n_workers_total);
    if (t < prev_t)
        return fail(r, "entry %zu: t %llu goes back in time", i, (unsigned long long)t);
    if (rank != 0)
        return fail(r, "entry %zu: rank %llu (the in-process replay keys by worker: rank 0 only)", i,
                    (unsigned long long)rank);
    e->t_ns = t;
    e->worker = (uint32_t)worker;
    long nh = u64_array(m, "hashes"), nc = u64_array(m, "content");
    if (get_str(m, "op", "query")) {
        e->kind = KVI_TRACE_QUERY;
        if (nc < 1)
            return fail(r, "entry %zu: a query needs content, one or more unsigned integers", i);
    } else if (get_str(m, "op", "store")) {
        e->kind = KVI_TRACE_STORE;
        const msgpack_object *p = field(m, "parent");
        if (nh < 1 || nc != nh || p == NULL ||
            (p->type != MSGPACK_OBJECT_NIL && p->type != MSGPACK_OBJECT_POSITIVE_INTEGER))
            return fail(r, "entry %zu: a store needs hashes and content of one equal length >= 1, and parent "
                           "(an unsigned integer or nil)", i);
        e->has_parent = p->type == MSGPACK_OBJECT_POSITIVE_INTEGER;
        e->parent = e->has_parent ? p->via.u64 : 0;
    } else if (get_str(m, "op", "remove")) {
        e->kind = KVI_TRACE_REMOVE;
        if (nh < 1)
            return fail(r, "entry %zu: a remove needs hashes, one or more unsigned integers", i);
    } else {
        return fail(r, "entry %zu: op is not \"query\", \"store\" or \"remove\"", i);
    }
    e->n = (uint32_t)(e->kind == KVI_TRACE_REMOVE ? nh : nc);
    if (e->kind != KVI_TRACE_QUERY)
        e->engine_hash = copy_u64s(w, m, "hashes");
    if (e->kind != KVI_TRACE_REMOVE)
        e->content = copy_u64s(w, m, "content");
    struct kvi_trace_workload_stats *st = &w->st;
    switch (e->kind) {
    case KVI_TRACE_QUERY: st->queries++; st->query_blocks += e->n; break;
    case KVI_TRACE_STORE: st->stores++; st->stored_blocks += e->n; break;
    default: st->removes++; st->removed_blocks += e->n; break;
    }
    return 0;
}

static int read_all(struct reader *r, struct kvi_trace_workload *w)
{
    uint64_t entries = 0;
    if (read_header(r, w, &entries) < 0)
        return -EINVAL;
    w->e = kvi_xcalloc(entries ? entries : 1, sizeof *w->e);
    uint64_t prev_t = 0;
    for (size_t i = 0; i < entries; i++) {
        if (read_entry(r, w, i, prev_t) < 0)
            return -EINVAL;
        prev_t = w->e[i].t_ns;
        w->n = i + 1;
    }
    if (r->off != r->len)
        return fail(r, "%zu bytes after the %llu entries the header announces", r->len - r->off,
                    (unsigned long long)entries);
    if (w->span_ns != prev_t)
        return fail(r, "header: span_ns %llu is not the last entry's t %llu", (unsigned long long)w->span_ns,
                    (unsigned long long)prev_t);
    return 0;
}

static int slurp(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -errno;
    size_t cap = 1 << 20, n = 0;
    char *b = kvi_xmalloc(cap);
    for (;;) {
        if (n == cap)
            b = kvi_xrealloc(b, cap *= 2);
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int rc = ferror(f) ? -EIO : 0;
    fclose(f);
    if (rc < 0) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = n;
    return 0;
}

int kvi_trace_import(struct kvi_trace_workload *w, const char *path, char sha256[65], char *err, size_t err_len)
{
    memset(w, 0, sizeof *w);
    char *buf = NULL;
    size_t len = 0;
    int rc = slurp(path, &buf, &len);
    if (rc < 0) {
        snprintf(err, err_len, "%s: %s", path, strerror(-rc));
        return rc;
    }
    if (sha256 != NULL)
        kvi_sha256_hex(buf, len, sha256);
    struct reader r = {.buf = buf, .len = len, .err = err, .err_len = err_len};
    msgpack_unpacked_init(&r.obj);
    rc = read_all(&r, w);
    msgpack_unpacked_destroy(&r.obj);
    free(buf);
    if (rc < 0)
        kvi_trace_workload_free(w);
    return rc;
}
