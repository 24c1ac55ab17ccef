/* ctest-labels: unit integration -- net/nats_snapshot.{h,c}: manifest and header codec; chunked store and verified load on a real nats-server */
/*
 * The codec (pure): manifests round-trip and every malformed one is
 * refused; key prefixes escape what a KV key cannot hold; the blob header
 * round-trips, asks for more bytes when cut, refuses a bad magic.
 * The store (tests/net/nats_server_fixture.h): a blob of many chunks
 * written and loaded back byte for byte; a snapshot older than the stored
 * one loses (-ESTALE) and leaves no chunk; a newer one purges the chunks
 * of the one it replaced; a corrupt chunk or manifest fails the load
 * before any byte is handed on; no snapshot is -ENOENT.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/writer.h"
#include "net/nats_conn.h"
#include "net/nats_server_fixture.h"
#include "net/nats_snapshot.h"

/* ---- codec ----------------------------------------------------------------------------------- */

static const struct kvi_snap_manifest M0 = {.seq = 4242,
                                            .id = "1092-0a0b0c0d",
                                            .chunks = 3,
                                            .chunk_size = 1000,
                                            .bytes = 2500,
                                            .raw_bytes = 99999,
                                            .crc32 = 4000000000u,
                                            .created_ms = 1700000000123ull};

static void test_manifest_roundtrip(void **state)
{
    (void)state;
    char buf[KVI_SNAP_MANIFEST_MAX];
    int n = kvi_snap_manifest_encode(&M0, buf, sizeof buf);
    assert_true(n > 0);
    struct kvi_snap_manifest m;
    assert_int_equal(kvi_snap_manifest_decode(buf, (size_t)n, &m), 0);
    assert_true(m.seq == M0.seq && m.chunks == M0.chunks && m.chunk_size == M0.chunk_size && m.bytes == M0.bytes &&
                m.raw_bytes == M0.raw_bytes && m.crc32 == M0.crc32 && m.created_ms == M0.created_ms);
    assert_string_equal(m.id, M0.id);
    char tiny[20];
    assert_int_equal(kvi_snap_manifest_encode(&M0, tiny, sizeof tiny), -ENOSPC);
    /* unknown keys are ignored */
    char more[KVI_SNAP_MANIFEST_MAX + 32];
    snprintf(more, sizeof more, "%.*sfuture=7\n", n, buf);
    assert_int_equal(kvi_snap_manifest_decode(more, strlen(more), &m), 0);
    assert_true(m.seq == M0.seq);
}

/* Replace the line starting with `key=` in an encoded M0 by `line` (NULL: drop it) and decode. */
static int decode_edited(const char *key, const char *line)
{
    char buf[KVI_SNAP_MANIFEST_MAX], out[KVI_SNAP_MANIFEST_MAX + 64] = "";
    int n = kvi_snap_manifest_encode(&M0, buf, sizeof buf);
    assert_true(n > 0);
    size_t o = 0;
    for (char *p = buf, *nl; (nl = strchr(p, '\n')) != NULL; p = nl + 1) {
        bool hit = strncmp(p, key, strlen(key)) == 0 && p[strlen(key)] == '=';
        const char *src = hit ? line : p;
        size_t len = hit ? (line ? strlen(line) : 0) : (size_t)(nl - p + 1);
        if (src != NULL) {
            memcpy(out + o, src, len);
            o += len;
        }
    }
    struct kvi_snap_manifest m;
    return kvi_snap_manifest_decode(out, o, &m);
}

static void test_manifest_rejects(void **state)
{
    (void)state;
    struct kvi_snap_manifest m;
    assert_int_equal(kvi_snap_manifest_decode("", 0, &m), -EBADMSG);
    assert_int_equal(kvi_snap_manifest_decode("kvidx-snapshot 2\nseq=1\n", 23, &m), -EBADMSG);
    const char *keys[] = {"seq", "id", "chunks", "chunk_size", "bytes", "raw_bytes", "crc32"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        assert_int_equal(decode_edited(keys[i], NULL), -EBADMSG); /* every key is required */
    assert_int_equal(decode_edited("created_ms", NULL), 0);       /* but this one */
    assert_int_equal(decode_edited("seq", "seq=12x\n"), -EBADMSG);
    assert_int_equal(decode_edited("seq", "seq=0\n"), -EBADMSG);
    assert_int_equal(decode_edited("seq", "seq=99999999999999999999999\n"), -EBADMSG);
    assert_int_equal(decode_edited("id", "id=../etc\n"), -EBADMSG);
    assert_int_equal(decode_edited("id", "id=\n"), -EBADMSG);
    assert_int_equal(decode_edited("chunks", "chunks=2\n"), -EBADMSG);     /* 2500 bytes / 1000 = 3 chunks */
    assert_int_equal(decode_edited("chunk_size", "chunk_size=0\n"), -EBADMSG);
    assert_int_equal(decode_edited("crc32", "crc32=4294967296\n"), -EBADMSG);
    assert_int_equal(decode_edited("bytes", "bytes=2000\n"), -EBADMSG);
    assert_int_equal(decode_edited("bytes", "bytes=3000\n"), 0);
    /* a line without '=' or without its newline */
    assert_int_equal(decode_edited("raw_bytes", "raw_bytes 5\n"), -EBADMSG);
    char buf[KVI_SNAP_MANIFEST_MAX];
    int n = kvi_snap_manifest_encode(&M0, buf, sizeof buf);
    assert_int_equal(kvi_snap_manifest_decode(buf, (size_t)n - 1, &m), -EBADMSG);
}

static void test_prefix(void **state)
{
    (void)state;
    char p[KVI_SNAP_PREFIX_MAX];
    assert_int_equal(kvi_snap_prefix(p, sizeof p, "dyn-kv_events", "ns.kv-events", "llama:t/1"), 0);
    assert_string_equal(p, "dyn-kv_events.ns=2Ekv-events.llama=3At=2F1");
    assert_int_equal(kvi_snap_prefix(p, sizeof p, "S", NULL, NULL), 0);
    assert_string_equal(p, "S.=.=");
    char small[8];
    assert_int_equal(kvi_snap_prefix(small, sizeof small, "stream", "a.b", "m"), -ENAMETOOLONG);
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char huge[4000];
    assert_int_equal(kvi_snap_prefix(huge, sizeof huge, big, NULL, NULL), -ENAMETOOLONG); /* capped */
}

static void test_header(void **state)
{
    (void)state;
    struct kvi_nats_order o[3] = {{1, 0, false, 7, 0},
                                  {UINT64_MAX, 3, true, UINT64_MAX - 1, 0x8000000000000001ull},
                                  {42, UINT32_MAX, true, 0, 9}};
    size_t hl = kvi_snap_header_size(3);
    assert_int_equal(hl, KVI_SNAP_HEADER_FIXED + 3 * KVI_SNAP_ORDER_REC);
    uint8_t *h = malloc(hl + 5);
    kvi_snap_header_encode(o, 3, h);
    memcpy(h + hl, "{body", 5);
    struct kvi_nats_order *got = NULL;
    size_t n = 99;
    for (size_t cut = 0; cut < hl; cut++) /* cut short: more bytes needed */
        assert_int_equal(kvi_snap_header_decode(h, cut, &got, &n), 0);
    assert_int_equal(kvi_snap_header_decode(h, hl + 5, &got, &n), (long)hl);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < 3; i++)
        assert_true(got[i].worker_id == o[i].worker_id && got[i].dp_rank == o[i].dp_rank &&
                    got[i].has_pub == o[i].has_pub && got[i].last_event_id == o[i].last_event_id &&
                    got[i].publisher_id == o[i].publisher_id);
    free(got);
    h[0] = 'X';
    assert_int_equal(kvi_snap_header_decode(h, hl, &got, &n), -EBADMSG);
    kvi_snap_header_encode(NULL, 0, h);
    assert_int_equal(kvi_snap_header_decode(h, KVI_SNAP_HEADER_FIXED, &got, &n), KVI_SNAP_HEADER_FIXED);
    assert_int_equal(n, 0);
    assert_null(got);
    h[8] = 0xff, h[9] = 0xff, h[10] = 0xff, h[11] = 0x7f; /* a count past 2^24 */
    assert_int_equal(kvi_snap_header_decode(h, hl, &got, &n), -EBADMSG);
    free(h);
}

/* ---- store on a real nats-server ------------------------------------------------------------- */

struct env {
    struct kvi_nats_server ns;
    struct kvi_writer_pool *wp;
    struct kvi_nats *plane;
    struct kvi_snap_store *st;
    jsCtx *js;
    kvStore *kv;
};

static int env_up(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    if (kvi_nats_server_start(&e->ns, 10000) != 0)
        return -1;
    e->wp = kvi_writer_pool_create(1, 1024);
    struct kvi_nats_config c = {.servers = e->ns.url, .writers = e->wp};
    e->plane = kvi_nats_create(&c);
    if (e->plane == NULL)
        return -1;
    int rc = -EAGAIN;
    for (int i = 0; i < 300 && rc == -EAGAIN; i++) { /* the first connect runs in the background */
        rc = kvi_snap_store_open(e->plane, "snaptest", &e->st);
        if (rc == -EAGAIN)
            nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    }
    if (rc != 0)
        return -1;
    if (natsConnection_JetStream(&e->js, kvi_nats__connection(e->plane), NULL) != NATS_OK ||
        js_KeyValue(&e->kv, e->js, "snaptest") != NATS_OK)
        return -1;
    *state = e;
    return 0;
}

static int env_down(void **state)
{
    struct env *e = *state;
    kvStore_Destroy(e->kv);
    jsCtx_Destroy(e->js);
    kvi_snap_store_close(e->st);
    kvi_nats_destroy(e->plane);
    kvi_writer_pool_destroy(e->wp);
    kvi_nats_server_stop(&e->ns);
    free(e);
    return 0;
}

/* A blob: a header for `n` ranks then `len` pseudo-random, half-compressible bytes. */
static uint8_t *make_blob(size_t len, uint64_t seed)
{
    uint8_t *b = malloc(len);
    uint64_t x = seed | 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (i / 64) % 2 ? (uint8_t)x : (uint8_t)('a' + i % 7);
    }
    return b;
}

struct got {
    struct kvi_nats_order *order;
    size_t n_order;
    uint8_t *body;
    size_t len, cap;
    int pieces;
};

static int got_order(void *ctx, struct kvi_nats_order *o, size_t n)
{
    struct got *g = ctx;
    g->order = o;
    g->n_order = n;
    return 0;
}

static int got_body(void *ctx, const void *d, size_t n)
{
    struct got *g = ctx;
    if (g->len + n > g->cap) {
        g->cap = 2 * (g->len + n);
        g->body = realloc(g->body, g->cap);
    }
    memcpy(g->body + g->len, d, n);
    g->len += n;
    g->pieces++;
    return 0;
}

static void got_free(struct got *g)
{
    free(g->order);
    free(g->body);
    memset(g, 0, sizeof *g);
}

/* Write a snapshot of `len` body bytes at `seq` in pieces of 7,777 bytes with 1,000-byte chunks;
 * `replace`: the id of a stored snapshot it may replace at the same seq (NULL: none). */
static int write_snap_r(struct env *e, const char *prefix, uint64_t seq, const uint8_t *body, size_t len,
                        struct kvi_snap_manifest *m, const char *replace)
{
    struct kvi_nats_order o[2] = {{5, 0, true, seq, 77}, {6, 1, false, seq / 2, 0}};
    struct kvi_snap_writer *w = kvi_snap_writer_begin(e->st, prefix, seq, 1000);
    if (replace != NULL)
        kvi_snap_writer_replace(w, replace);
    uint8_t h[KVI_SNAP_HEADER_FIXED + 2 * KVI_SNAP_ORDER_REC];
    kvi_snap_header_encode(o, 2, h);
    assert_int_equal(kvi_snap_writer_write(w, h, sizeof h), 0);
    for (size_t at = 0; at < len; at += 7777)
        assert_int_equal(kvi_snap_writer_write(w, body + at, len - at < 7777 ? len - at : 7777), 0);
    return kvi_snap_writer_commit(w, m);
}

static int write_snap(struct env *e, const char *prefix, uint64_t seq, const uint8_t *body, size_t len,
                      struct kvi_snap_manifest *m)
{
    return write_snap_r(e, prefix, seq, body, len, m, NULL);
}

/* Keys of the bucket with this prefix (a delete or purge marker is not a key). */
static size_t count_keys(struct env *e, const char *prefix)
{
    kvKeysList kl = {0};
    natsStatus s = kvStore_Keys(&kl, e->kv, NULL);
    if (s == NATS_NOT_FOUND)
        return 0;
    assert_int_equal(s, NATS_OK);
    size_t n = 0;
    for (int i = 0; i < kl.Count; i++)
        n += strncmp(kl.Keys[i], prefix, strlen(prefix)) == 0;
    kvKeysList_Destroy(&kl);
    return n;
}

static void test_store_roundtrip(void **state)
{
    struct env *e = *state;
    const char *pfx = "rt.a.b";
    struct got g = {0};
    struct kvi_snap_read_cb cb = {got_order, got_body, &g};
    char why[256];
    assert_int_equal(kvi_snap_load(e->st, pfx, &cb, NULL, why, sizeof why), -ENOENT);
    assert_int_equal(g.pieces, 0);

    size_t len = 600 * 1000;
    uint8_t *body = make_blob(len, 1);
    struct kvi_snap_manifest m1, lm;
    assert_int_equal(write_snap(e, pfx, 100, body, len, &m1), 0);
    assert_true(m1.chunks > 10 && m1.bytes < len && m1.raw_bytes == len + kvi_snap_header_size(2));
    assert_int_equal(count_keys(e, pfx), m1.chunks + 1); /* chunks and the manifest */
    assert_int_equal(kvi_snap_load(e->st, pfx, &cb, &lm, why, sizeof why), 0);
    assert_true(lm.seq == 100 && strcmp(lm.id, m1.id) == 0);
    assert_int_equal(g.n_order, 2);
    assert_true(g.order[0].worker_id == 5 && g.order[0].has_pub && g.order[0].publisher_id == 77 &&
                g.order[0].last_event_id == 100 && g.order[1].dp_rank == 1 && !g.order[1].has_pub &&
                g.order[1].last_event_id == 50);
    assert_int_equal(g.len, len);
    assert_memory_equal(g.body, body, len);
    got_free(&g);

    /* an older snapshot loses and leaves nothing behind */
    uint8_t *old = make_blob(len / 3, 2);
    assert_int_equal(write_snap(e, pfx, 90, old, len / 3, NULL), -ESTALE);
    assert_int_equal(write_snap(e, pfx, 100, old, len / 3, NULL), -ESTALE); /* an equal one too */
    assert_int_equal(count_keys(e, pfx), m1.chunks + 1);
    /* ... unless it names the stored one as broken (an older one never replaces it) */
    assert_int_equal(write_snap_r(e, pfx, 99, old, len / 3, NULL, m1.id), -ESTALE);
    assert_int_equal(write_snap_r(e, pfx, 100, body, len, &m1, "1-nope"), -ESTALE);
    struct kvi_snap_manifest m1b;
    assert_int_equal(write_snap_r(e, pfx, 100, body, len, &m1b, m1.id), 0);
    assert_true(strcmp(m1b.id, m1.id) != 0);
    assert_int_equal(count_keys(e, pfx), m1b.chunks + 1);
    /* a newer one replaces it, and the replaced chunks go */
    struct kvi_snap_manifest m2;
    assert_int_equal(write_snap(e, pfx, 250, old, len / 3, &m2), 0);
    assert_int_equal(count_keys(e, pfx), m2.chunks + 1);
    assert_int_equal(kvi_snap_load(e->st, pfx, &cb, &lm, why, sizeof why), 0);
    assert_true(lm.seq == 250 && g.len == len / 3);
    assert_memory_equal(g.body, old, len / 3);
    got_free(&g);
    /* another prefix is another snapshot */
    assert_int_equal(kvi_snap_load(e->st, "rt.a.c", &cb, NULL, why, sizeof why), -ENOENT);
    free(old);
    free(body);
}

static void test_store_corrupt(void **state)
{
    struct env *e = *state;
    const char *pfx = "bad.x.y";
    size_t len = 50 * 1000;
    uint8_t *body = make_blob(len, 3);
    struct kvi_snap_manifest m;
    assert_int_equal(write_snap(e, pfx, 7, body, len, &m), 0);
    struct got g = {0};
    struct kvi_snap_read_cb cb = {got_order, got_body, &g};
    char why[256], key[KVI_SNAP_KEY_MAX];
    uint64_t rev;

    /* a chunk with one byte flipped (same size): the checksum fails, nothing is handed on */
    snprintf(key, sizeof key, "%s.%s.%u", pfx, m.id, m.chunks / 2);
    kvEntry *ent = NULL;
    assert_int_equal(kvStore_Get(&ent, e->kv, key), NATS_OK);
    size_t cl = (size_t)kvEntry_ValueLen(ent);
    uint8_t *c = malloc(cl);
    memcpy(c, kvEntry_Value(ent), cl);
    kvEntry_Destroy(ent);
    c[cl / 2] ^= 0x5a;
    assert_int_equal(kvStore_Put(&rev, e->kv, key, c, (int)cl), NATS_OK);
    assert_int_equal(kvi_snap_load(e->st, pfx, &cb, NULL, why, sizeof why), -EBADMSG);
    assert_non_null(strstr(why, "checksum"));
    assert_true(g.pieces == 0 && g.order == NULL);
    /* a chunk of the wrong size */
    assert_int_equal(kvStore_Put(&rev, e->kv, key, c, (int)cl - 1), NATS_OK);
    assert_int_equal(kvi_snap_load(e->st, pfx, &cb, NULL, why, sizeof why), -EBADMSG);
    assert_true(g.pieces == 0);
    /* a chunk missing */
    assert_int_equal(kvStore_Delete(e->kv, key), NATS_OK);
    assert_int_equal(kvi_snap_load(e->st, pfx, &cb, NULL, why, sizeof why), -EBADMSG);
    assert_non_null(strstr(why, "missing"));
    assert_true(g.pieces == 0);
    free(c);

    /* a manifest that does not parse */
    snprintf(key, sizeof key, "%s.manifest", pfx);
    assert_int_equal(kvStore_PutString(&rev, e->kv, key, "kvidx-snapshot 1\nseq=oops\n"), NATS_OK);
    assert_int_equal(kvi_snap_load(e->st, pfx, &cb, NULL, why, sizeof why), -EBADMSG);
    /* a manifest whose checksum matches chunks that do not inflate to its raw size */
    assert_int_equal(write_snap(e, "bad.x.z", 8, body, len, &m), 0);
    m.raw_bytes += 1;
    char val[KVI_SNAP_MANIFEST_MAX];
    int vl = kvi_snap_manifest_encode(&m, val, sizeof val);
    snprintf(key, sizeof key, "bad.x.z.manifest");
    assert_int_equal(kvStore_Put(&rev, e->kv, key, val, vl), NATS_OK);
    assert_int_equal(kvi_snap_load(e->st, "bad.x.z", &cb, NULL, why, sizeof why), -EBADMSG);
    got_free(&g);
    free(body);
}

int main(void)
{
    const struct CMUnitTest codec[] = {
        cmocka_unit_test(test_manifest_roundtrip),
        cmocka_unit_test(test_manifest_rejects),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_header),
    };
    const struct CMUnitTest store[] = {
        cmocka_unit_test(test_store_roundtrip),
        cmocka_unit_test(test_store_corrupt),
    };
    int rc = cmocka_run_group_tests(codec, NULL, NULL);
    return rc + cmocka_run_group_tests(store, env_up, env_down);
}
