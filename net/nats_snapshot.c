/*
 * Snapshots in a JetStream KV bucket (net/nats_snapshot.h): the manifest
 * and header codec, deflate into chunks, the revision-checked manifest, the
 * verified load, and the purge below every consumer's ack floor.
 * Not threaded: a store belongs to its caller's thread at a time.
 */
#include "net/nats_snapshot.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "net/log.h"
#include "net/nats_conn.h"

#define MAGIC "KVISNAP1"
#define LOAD_TRIES 3
#define INFLATE_OUT (256u * 1024)

/* ---- codec ------------------------------------------------------------------------------------- */

int kvi_snap_manifest_encode(const struct kvi_snap_manifest *m, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     "kvidx-snapshot 1\nseq=%" PRIu64 "\nid=%s\nchunks=%" PRIu32 "\nchunk_size=%" PRIu32
                     "\nbytes=%" PRIu64 "\nraw_bytes=%" PRIu64 "\ncrc32=%" PRIu32 "\ncreated_ms=%" PRIu64 "\n",
                     m->seq, m->id, m->chunks, m->chunk_size, m->bytes, m->raw_bytes, m->crc32, m->created_ms);
    return n < 0 || (size_t)n >= cap ? -ENOSPC : n;
}

static bool parse_u64(const char *v, size_t len, uint64_t *out)
{
    if (len == 0 || len > 20)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return false;
        uint64_t d = (uint64_t)(v[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *out = x;
    return true;
}

static bool id_ok(const char *v, size_t len)
{
    if (len == 0 || len >= sizeof(((struct kvi_snap_manifest *)0)->id))
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'z') || v[i] == '-'))
            return false;
    return true;
}

int kvi_snap_manifest_decode(const void *buf, size_t len, struct kvi_snap_manifest *m)
{
    static const char head[] = "kvidx-snapshot 1\n";
    const char *p = buf, *end = p + len;
    if (len < sizeof head - 1 || memcmp(p, head, sizeof head - 1) != 0)
        return -EBADMSG;
    p += sizeof head - 1;
    memset(m, 0, sizeof *m);
    enum { SEQ = 1, ID = 2, CHUNKS = 4, CSIZE = 8, BYTES = 16, RAW = 32, CRC = 64, ALL = 127 };
    unsigned seen = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            return -EBADMSG;
        const char *eq = memchr(p, '=', (size_t)(nl - p));
        if (eq == NULL)
            return -EBADMSG;
        size_t klen = (size_t)(eq - p), vlen = (size_t)(nl - eq - 1);
        const char *v = eq + 1;
        uint64_t x = 0;
#define KEY(s) (klen == sizeof(s) - 1 && memcmp(p, s, klen) == 0)
        if (KEY("id")) {
            if (!id_ok(v, vlen))
                return -EBADMSG;
            memcpy(m->id, v, vlen);
            m->id[vlen] = '\0';
            seen |= ID;
        } else if (KEY("seq") || KEY("chunks") || KEY("chunk_size") || KEY("bytes") || KEY("raw_bytes") ||
                   KEY("crc32") || KEY("created_ms")) {
            if (!parse_u64(v, vlen, &x))
                return -EBADMSG;
            if (KEY("seq"))
                m->seq = x, seen |= SEQ;
            else if (KEY("chunks") && x <= UINT32_MAX)
                m->chunks = (uint32_t)x, seen |= CHUNKS;
            else if (KEY("chunk_size") && x <= UINT32_MAX)
                m->chunk_size = (uint32_t)x, seen |= CSIZE;
            else if (KEY("bytes"))
                m->bytes = x, seen |= BYTES;
            else if (KEY("raw_bytes"))
                m->raw_bytes = x, seen |= RAW;
            else if (KEY("crc32") && x <= UINT32_MAX)
                m->crc32 = (uint32_t)x, seen |= CRC;
            else if (KEY("created_ms"))
                m->created_ms = x;
            else
                return -EBADMSG;
        } /* (other keys: ignored) */
#undef KEY
        p = nl + 1;
    }
    if (seen != ALL || m->chunk_size == 0 || m->seq == 0)
        return -EBADMSG;
    if ((uint64_t)m->chunks != (m->bytes + m->chunk_size - 1) / m->chunk_size)
        return -EBADMSG;
    return 0;
}

int kvi_snap_prefix(char *out, size_t cap, const char *stream, const char *subject, const char *label)
{
    static const char hex[] = "0123456789ABCDEF";
    const char *parts[3] = {stream, subject ? subject : "", label ? label : ""};
    size_t o = 0;
    if (cap > KVI_SNAP_PREFIX_MAX)
        cap = KVI_SNAP_PREFIX_MAX;
    for (int k = 0; k < 3; k++) {
        if (k > 0) {
            if (o + 1 >= cap)
                return -ENAMETOOLONG;
            out[o++] = '.';
        }
        if (parts[k][0] == '\0') { /* (a key has no empty token) */
            if (o + 1 >= cap)
                return -ENAMETOOLONG;
            out[o++] = '=';
        }
        for (const unsigned char *c = (const unsigned char *)parts[k]; *c; c++) {
            bool plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                         *c == '_' || *c == '-';
            if (o + (plain ? 1 : 3) >= cap)
                return -ENAMETOOLONG;
            if (plain) {
                out[o++] = (char)*c;
            } else {
                out[o++] = '=';
                out[o++] = hex[*c >> 4];
                out[o++] = hex[*c & 15];
            }
        }
    }
    out[o] = '\0';
    return 0;
}

size_t kvi_snap_header_size(size_t n) { return KVI_SNAP_HEADER_FIXED + n * KVI_SNAP_ORDER_REC; }

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void kvi_snap_header_encode(const struct kvi_nats_order *order, size_t n, uint8_t *out)
{
    memcpy(out, MAGIC, 8);
    put_le(out + 8, n, 4);
    for (size_t i = 0; i < n; i++) {
        uint8_t *r = out + KVI_SNAP_HEADER_FIXED + i * KVI_SNAP_ORDER_REC;
        put_le(r, order[i].worker_id, 8);
        put_le(r + 8, order[i].dp_rank, 4);
        put_le(r + 12, order[i].has_pub ? 1 : 0, 4);
        put_le(r + 16, order[i].last_event_id, 8);
        put_le(r + 24, order[i].publisher_id, 8);
    }
}

long kvi_snap_header_decode(const uint8_t *buf, size_t len, struct kvi_nats_order **order, size_t *n)
{
    if (len < KVI_SNAP_HEADER_FIXED)
        return 0;
    if (memcmp(buf, MAGIC, 8) != 0)
        return -EBADMSG;
    uint64_t k = get_le(buf + 8, 4);
    if (k > (1u << 24))
        return -EBADMSG;
    size_t need = kvi_snap_header_size((size_t)k);
    if (len < need)
        return 0;
    struct kvi_nats_order *o = k ? kvi_xcalloc((size_t)k, sizeof *o) : NULL;
    for (size_t i = 0; i < k; i++) {
        const uint8_t *r = buf + KVI_SNAP_HEADER_FIXED + i * KVI_SNAP_ORDER_REC;
        o[i].worker_id = get_le(r, 8);
        o[i].dp_rank = (uint32_t)get_le(r + 8, 4);
        o[i].has_pub = (get_le(r + 12, 4) & 1) != 0;
        o[i].last_event_id = get_le(r + 16, 8);
        o[i].publisher_id = get_le(r + 24, 8);
    }
    *order = o;
    *n = (size_t)k;
    return (long)need;
}

/* ---- store ------------------------------------------------------------------------------------- */

struct kvi_snap_store {
    jsCtx *js;
    kvStore *kv;
    char bucket[KVI_NATS_NAME_MAX];
};

void kvi_snap_store_close(struct kvi_snap_store *st)
{
    if (st == NULL)
        return;
    kvStore_Destroy(st->kv);
    jsCtx_Destroy(st->js);
    free(st);
}

int kvi_snap_store_open(struct kvi_nats *plane, const char *bucket, struct kvi_snap_store **out)
{
    *out = NULL;
    if (bucket == NULL || *bucket == '\0' || strlen(bucket) >= KVI_NATS_NAME_MAX ||
        strspn(bucket, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != strlen(bucket))
        return -EINVAL;
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    natsStatus s = natsConnection_JetStream(&js, kvi_nats__connection(plane), NULL);
    if (s == NATS_OK) {
        s = js_KeyValue(&kv, js, bucket);
        if (s == NATS_NOT_FOUND) {
            kvConfig c;
            kvConfig_Init(&c);
            c.Bucket = bucket;
            c.History = 1;
            c.StorageType = js_FileStorage;
            s = js_CreateKeyValue(&kv, js, &c);
            if (s == NATS_OK)
                kvi_log_info("nats snapshot: bucket %s created", bucket);
        }
    }
    if (s != NATS_OK) {
        jsCtx_Destroy(js);
        return -EAGAIN;
    }
    struct kvi_snap_store *st = kvi_xcalloc(1, sizeof *st);
    st->js = js;
    st->kv = kv;
    snprintf(st->bucket, sizeof st->bucket, "%s", bucket);
    *out = st;
    return 0;
}

static void chunk_key(char *out, size_t cap, const char *prefix, const char *id, uint32_t k)
{
    snprintf(out, cap, "%.900s.%.39s.%" PRIu32, prefix, id, k);
}

static void purge_chunks(struct kvi_snap_store *st, const char *prefix, const char *id, uint32_t n)
{
    char key[KVI_SNAP_KEY_MAX];
    for (uint32_t k = 0; k < n; k++) {
        chunk_key(key, sizeof key, prefix, id, k);
        (void)kvStore_Purge(st->kv, key, NULL); /* (a failure leaves an orphan: harmless) */
    }
}

/* The stored manifest: 0 (*m, *rev set), -ENOENT, -EBADMSG (*rev set), -EAGAIN. */
static int manifest_get(struct kvi_snap_store *st, const char *key, struct kvi_snap_manifest *m, uint64_t *rev)
{
    kvEntry *e = NULL;
    natsStatus s = kvStore_Get(&e, st->kv, key);
    *rev = 0;
    if (s == NATS_NOT_FOUND)
        return -ENOENT;
    if (s != NATS_OK)
        return -EAGAIN;
    *rev = kvEntry_Revision(e);
    int rc = kvEntry_Operation(e) != kvOp_Put ? -ENOENT
                                               : kvi_snap_manifest_decode(kvEntry_Value(e), (size_t)kvEntry_ValueLen(e), m);
    kvEntry_Destroy(e);
    return rc;
}

/* ---- writer ------------------------------------------------------------------------------------ */

struct kvi_snap_writer {
    struct kvi_snap_store *st;
    char prefix[KVI_SNAP_PREFIX_MAX];
    struct kvi_snap_manifest m;
    z_stream z;
    uint8_t *chunk;
    int err;
    char replace_id[40]; /* a stored snapshot that may be replaced at the same seq ("" = none) */
};

void kvi_snap_writer_replace(struct kvi_snap_writer *w, const char *id)
{
    snprintf(w->replace_id, sizeof w->replace_id, "%s", id);
}

struct kvi_snap_writer *kvi_snap_writer_begin(struct kvi_snap_store *st, const char *prefix, uint64_t seq,
                                              uint32_t chunk_size)
{
    struct kvi_snap_writer *w = kvi_xcalloc(1, sizeof *w);
    w->st = st;
    snprintf(w->prefix, sizeof w->prefix, "%s", prefix);
    w->m.seq = seq;
    w->m.chunk_size = chunk_size ? chunk_size : KVI_SNAP_CHUNK_DEFAULT;
    w->m.crc32 = (uint32_t)crc32(0L, Z_NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    w->m.created_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    uint64_t r = (uint64_t)ts.tv_nsec ^ ((uint64_t)(uintptr_t)w << 16) ^ (uint64_t)rand();
    snprintf(w->m.id, sizeof w->m.id, "%" PRIx64 "-%08" PRIx32, seq, (uint32_t)(r ^ (r >> 32)));
    w->chunk = kvi_xmalloc(w->m.chunk_size);
    /* level 1: the snapshot pauses its source; speed matters more than the last few percent */
    if (deflateInit(&w->z, 1) != Z_OK)
        kvi_die("out of memory");
    w->z.next_out = w->chunk;
    w->z.avail_out = w->m.chunk_size;
    return w;
}

/* Store the chunk buffer's bytes as chunk number m.chunks. */
static int put_chunk(struct kvi_snap_writer *w)
{
    size_t len = w->m.chunk_size - w->z.avail_out;
    if (len == 0)
        return 0;
    char key[KVI_SNAP_KEY_MAX];
    chunk_key(key, sizeof key, w->prefix, w->m.id, w->m.chunks);
    uint64_t rev = 0;
    natsStatus s = kvStore_Put(&rev, w->st->kv, key, w->chunk, (int)len);
    if (s != NATS_OK) {
        kvi_log_warn("nats snapshot %s: chunk %" PRIu32 " not stored (%s: %s)", w->prefix, w->m.chunks,
                     natsStatus_GetText(s), nats_GetLastError(NULL));
        return -EIO;
    }
    w->m.crc32 = (uint32_t)crc32(w->m.crc32, w->chunk, (uInt)len);
    w->m.bytes += len;
    w->m.chunks++;
    w->z.next_out = w->chunk;
    w->z.avail_out = w->m.chunk_size;
    return 0;
}

static int pump(struct kvi_snap_writer *w, int flush)
{
    for (;;) {
        int zr = deflate(&w->z, flush);
        if (zr == Z_STREAM_ERROR)
            return -EIO;
        if (w->z.avail_out == 0) {
            if (put_chunk(w) != 0)
                return -EIO;
            continue;
        }
        if (flush == Z_FINISH ? zr == Z_STREAM_END : w->z.avail_in == 0)
            return 0;
    }
}

int kvi_snap_writer_write(struct kvi_snap_writer *w, const void *data, size_t len)
{
    if (w->err != 0)
        return w->err;
    const uint8_t *p = data;
    while (len > 0) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        w->z.next_in = (Bytef *)(uintptr_t)p;
        w->z.avail_in = n;
        w->m.raw_bytes += n;
        if ((w->err = pump(w, Z_NO_FLUSH)) != 0)
            return w->err;
        p += n;
        len -= n;
    }
    return 0;
}

static void writer_free(struct kvi_snap_writer *w)
{
    deflateEnd(&w->z);
    free(w->chunk);
    free(w);
}

void kvi_snap_writer_abort(struct kvi_snap_writer *w)
{
    if (w == NULL)
        return;
    purge_chunks(w->st, w->prefix, w->m.id, w->m.chunks);
    writer_free(w);
}

int kvi_snap_writer_commit(struct kvi_snap_writer *w, struct kvi_snap_manifest *out)
{
    if (w->err == 0) {
        w->z.next_in = NULL;
        w->z.avail_in = 0;
        w->err = pump(w, Z_FINISH);
        if (w->err == 0)
            w->err = put_chunk(w);
    }
    if (w->err != 0) {
        kvi_snap_writer_abort(w);
        return -EIO;
    }
    char key[KVI_SNAP_KEY_MAX], val[KVI_SNAP_MANIFEST_MAX];
    snprintf(key, sizeof key, "%.900s.manifest", w->prefix);
    int vlen = kvi_snap_manifest_encode(&w->m, val, sizeof val);
    int rc = -EIO;
    for (int tries = 0; tries < 5; tries++) {
        struct kvi_snap_manifest old;
        uint64_t rev = 0, nrev = 0;
        int g = manifest_get(w->st, key, &old, &rev);
        if (g == -EAGAIN)
            break;
        bool broken = w->replace_id[0] != '\0' && strcmp(old.id, w->replace_id) == 0 && old.seq == w->m.seq;
        if (g == 0 && old.seq >= w->m.seq && !broken) {
            rc = -ESTALE; /* newest seq wins */
            break;
        }
        natsStatus s = rev == 0 ? kvStore_Create(&nrev, w->st->kv, key, val, vlen)
                                : kvStore_Update(&nrev, w->st->kv, key, val, vlen, rev);
        if (s == NATS_OK) {
            if (g == 0 && strcmp(old.id, w->m.id) != 0)
                purge_chunks(w->st, w->prefix, old.id, old.chunks);
            if (out != NULL)
                *out = w->m;
            writer_free(w);
            return 0;
        }
        /* another writer got there between the read and the write: read again */
    }
    kvi_snap_writer_abort(w);
    return rc;
}

/* ---- load -------------------------------------------------------------------------------------- */

struct load {
    const struct kvi_snap_read_cb *cb;
    uint8_t *hdr;          /* header bytes gathered so far */
    size_t hdr_len, hdr_cap;
    bool hdr_done;
    int cb_rc;
};

/* Hand inflated bytes on: the header first, then the body. */
static int hand_on(struct load *l, const uint8_t *p, size_t n)
{
    if (!l->hdr_done) {
        if (l->hdr_len + n > l->hdr_cap) {
            l->hdr_cap = KVI_MAX(2 * l->hdr_cap, l->hdr_len + n);
            l->hdr = kvi_xrealloc(l->hdr, l->hdr_cap);
        }
        memcpy(l->hdr + l->hdr_len, p, n);
        l->hdr_len += n;
        struct kvi_nats_order *o = NULL;
        size_t k = 0;
        long h = kvi_snap_header_decode(l->hdr, l->hdr_len, &o, &k);
        if (h < 0)
            return -EBADMSG;
        if (h == 0)
            return 0;
        l->hdr_done = true;
        int rc = l->cb->order(l->cb->ctx, o, k);
        if (rc == 0 && l->hdr_len > (size_t)h)
            rc = l->cb->body(l->cb->ctx, l->hdr + h, l->hdr_len - (size_t)h);
        return rc == 0 ? 0 : (l->cb_rc = rc < 0 ? rc : -ECANCELED);
    }
    int rc = l->cb->body(l->cb->ctx, p, n);
    return rc == 0 ? 0 : (l->cb_rc = rc < 0 ? rc : -ECANCELED);
}

static int inflate_all(const uint8_t *blob, size_t len, uint64_t raw, struct load *l, char *why, size_t wl)
{
    z_stream z = {0};
    if (inflateInit(&z) != Z_OK)
        kvi_die("out of memory");
    uint8_t *out = kvi_xmalloc(INFLATE_OUT);
    z.next_in = (Bytef *)(uintptr_t)blob;
    z.avail_in = (uInt)len;
    uint64_t total = 0;
    int rc = 0, zr = Z_OK;
    while (rc == 0 && zr != Z_STREAM_END) {
        z.next_out = out;
        z.avail_out = INFLATE_OUT;
        zr = inflate(&z, Z_NO_FLUSH);
        if (zr != Z_OK && zr != Z_STREAM_END) {
            snprintf(why, wl, "inflate: %s", z.msg ? z.msg : "corrupt data");
            rc = -EBADMSG;
            break;
        }
        size_t n = INFLATE_OUT - z.avail_out;
        total += n;
        if (n > 0)
            rc = hand_on(l, out, n);
        if (rc == -EBADMSG)
            snprintf(why, wl, "bad blob header");
        if (zr == Z_OK && n == 0 && z.avail_in == 0) {
            snprintf(why, wl, "truncated compressed data");
            rc = -EBADMSG;
        }
    }
    if (rc == 0 && (!l->hdr_done || total != raw)) {
        snprintf(why, wl, "blob of %" PRIu64 " bytes, manifest says %" PRIu64 "%s", total, raw,
                 l->hdr_done ? "" : " (no header)");
        rc = -EBADMSG;
    }
    inflateEnd(&z);
    free(out);
    return rc;
}

/* One attempt: -EAGAIN on a missing chunk is mapped to a retry by the caller (via -ESTALE). */
static int load_once(struct kvi_snap_store *st, const char *prefix, const struct kvi_snap_read_cb *cb,
                     struct kvi_snap_manifest *m, char *why, size_t wl)
{
    char key[KVI_SNAP_KEY_MAX];
    snprintf(key, sizeof key, "%.900s.manifest", prefix);
    uint64_t rev;
    int rc = manifest_get(st, key, m, &rev);
    if (rc == -ENOENT)
        snprintf(why, wl, "no snapshot");
    if (rc == -EBADMSG)
        snprintf(why, wl, "manifest %s does not parse", key);
    if (rc == -EAGAIN)
        snprintf(why, wl, "NATS did not answer");
    if (rc != 0)
        return rc;
    if (m->bytes > ((uint64_t)1 << 40) || m->raw_bytes > ((uint64_t)1 << 42)) {
        snprintf(why, wl, "implausible sizes in the manifest");
        return -EBADMSG;
    }
    uint8_t *blob = kvi_xmalloc(m->bytes ? (size_t)m->bytes : 1);
    size_t at = 0;
    for (uint32_t k = 0; k < m->chunks && rc == 0; k++) {
        chunk_key(key, sizeof key, prefix, m->id, k);
        kvEntry *e = NULL;
        natsStatus s = kvStore_Get(&e, st->kv, key);
        if (s == NATS_NOT_FOUND || (s == NATS_OK && kvEntry_Operation(e) != kvOp_Put)) {
            snprintf(why, wl, "chunk %s missing", key);
            rc = -ESTALE;
        } else if (s != NATS_OK) {
            snprintf(why, wl, "NATS did not answer");
            rc = -EAGAIN;
        } else {
            size_t n = (size_t)kvEntry_ValueLen(e);
            size_t want = k + 1 < m->chunks ? m->chunk_size : (size_t)(m->bytes - at);
            if (n != want || at + n > m->bytes) {
                snprintf(why, wl, "chunk %s has %zu bytes, not %zu", key, n, want);
                rc = -EBADMSG;
            } else {
                memcpy(blob + at, kvEntry_Value(e), n);
                at += n;
            }
        }
        kvEntry_Destroy(e);
    }
    if (rc == 0) {
        uLong c = crc32(0L, Z_NULL, 0);
        for (size_t off = 0; off < at;) { /* (crc32 takes uInt lengths) */
            size_t n = KVI_MIN(at - off, (size_t)1 << 30);
            c = crc32(c, blob + off, (uInt)n);
            off += n;
        }
        if ((uint32_t)c != m->crc32) {
            snprintf(why, wl, "checksum mismatch (%08" PRIx32 ", manifest %08" PRIx32 ")", (uint32_t)c, m->crc32);
            rc = -EBADMSG;
        }
    }
    if (rc == 0) {
        struct load l = {.cb = cb};
        rc = inflate_all(blob, at, m->raw_bytes, &l, why, wl);
        if (l.cb_rc != 0) {
            rc = l.cb_rc;
            snprintf(why, wl, "the snapshot's content was refused");
        }
        free(l.hdr);
    }
    free(blob);
    return rc;
}

int kvi_snap_load(struct kvi_snap_store *st, const char *prefix, const struct kvi_snap_read_cb *cb,
                  struct kvi_snap_manifest *m, char *why, size_t why_len)
{
    struct kvi_snap_manifest mm;
    char w[256];
    if (m == NULL)
        m = &mm;
    if (why == NULL) {
        why = w;
        why_len = sizeof w;
    }
    why[0] = '\0';
    int rc = -ESTALE;
    for (int t = 0; t < LOAD_TRIES && rc == -ESTALE; t++)
        rc = load_once(st, prefix, cb, m, why, why_len);
    return rc == -ESTALE ? -EBADMSG : rc;
}

/* ---- purge ------------------------------------------------------------------------------------- */

int kvi_snap_purge(struct kvi_nats *plane, const char *stream, const char *subject, uint64_t upto,
                   uint64_t *below)
{
    *below = 0;
    jsCtx *js = NULL;
    if (natsConnection_JetStream(&js, kvi_nats__connection(plane), NULL) != NATS_OK)
        return -EAGAIN;
    jsConsumerInfoList *list = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Consumers(&list, js, stream, NULL, &jerr);
    if (s != NATS_OK && s != NATS_NOT_FOUND) {
        jsCtx_Destroy(js);
        return -EAGAIN;
    }
    uint64_t floor1 = upto + 1; /* purge below this */
    for (int i = 0; list != NULL && i < list->Count; i++) {
        const jsConsumerInfo *ci = list->List[i];
        if (ci->Config == NULL || ci->Config->Durable == NULL) /* ephemeral: it goes with its client */
            continue;
        floor1 = KVI_MIN(floor1, ci->AckFloor.Stream + 1);
    }
    jsConsumerInfoList_Destroy(list);
    int rc = 0;
    if (floor1 > 1) {
        jsOptions o;
        jsOptions_Init(&o);
        o.Stream.Purge.Subject = subject;
        o.Stream.Purge.Sequence = floor1;
        s = js_PurgeStream(js, stream, &o, &jerr);
        if (s == NATS_OK) {
            *below = floor1;
        } else {
            kvi_log_warn("nats snapshot: purge of stream %s below %" PRIu64 " failed (%s, %d)", stream, floor1,
                         natsStatus_GetText(s), (int)jerr);
            rc = -EIO;
        }
    }
    jsCtx_Destroy(js);
    return rc;
}
