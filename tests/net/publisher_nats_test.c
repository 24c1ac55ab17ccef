/* ctest-labels: integration -- net/publisher_nats.c: the C publisher's NATS transports against a real nats-server */
/*
 * The C publisher's NATS transports (net/publisher_nats.c, net/router_event.c),
 * checked from the outside against a private nats-server with JetStream
 * (tests/net/nats_server_fixture.h): a libnats subscriber (Core) or direct
 * stream reads (JetStream, js_GetMsg) receive what the publisher sends, and
 * every message is compared byte for byte with an expected encoding built
 * here field by field (msgpack-c's packer for msgpack, printf for JSON), with
 * tokens_hash from kvidx's own content hash (engine/hash.h).
 *
 * Covered: the Core envelope (publisher_id above 2^63, sequence, published_at
 * within the publish window, topic, bin payload) around the msgpack
 * RouterEvent; stored with and without parent, u64 hashes above 2^63,
 * removed, cleared; a LoRA changing tokens_hash; dp_rank 3; storage tiers;
 * a comma-separated server list; skip_live's event_id and sequence gap;
 * send_raw and publish_payload; a message over max_payload dropped and the
 * rest of its batch sent; JetStream stream creation and its config,
 * stream order, Nats-Msg-Id, JSON bytes, a restarted publisher's repeated
 * message ids dropped by the server; the stream-name helper; errors.
 * Failover (JetStream): the only server stopped and resumed mid-stream
 * (events held in order, the nats_max_pending bound and -ENOBUFS, a retry
 * acknowledged as a duplicate), and a 3-node cluster whose stream leader is
 * killed mid-stream and restarted: a consumer reads every event once, in
 * order, byte for byte.
 *
 * No thread of the test asserts; every wait is bounded (NextMsg timeouts of
 * seconds). Core subscriptions are flushed to the server (a PING/PONG)
 * before the publisher sends, so no message can precede them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <msgpack.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvidx/publisher.h>

#include "engine/hash.h"
#include "net/nats_server_fixture.h"

#define WAIT_MS 10000    /* a message that must come */
#define QUIET_MS 300     /* "nothing more comes" checks of negative outcomes */
#define START_MS 30000   /* nats-server start on a loaded machine */

#define BIG1 UINT64_C(0xfedcba9876543210)
#define BIG2 UINT64_C(0x8000000000000001)
#define BIG3 UINT64_C(0xffffffffffffffff)
#define PUB_ID UINT64_C(0xc0ffee0000000042)

static struct kvi_nats_server g_srv;
static natsConnection *g_nc;

/* ------------------------------------------------------------------------
 * Expected encodings
 * ------------------------------------------------------------------------ */

struct ex {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static void ex_init(struct ex *e)
{
    msgpack_sbuffer_init(&e->sb);
    msgpack_packer_init(&e->pk, &e->sb, msgpack_sbuffer_write);
}

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* {"worker_id": W, "storage_tier": T, "event": {"event_id": E, "data": */
static void pk_head(msgpack_packer *pk, uint64_t worker, const char *tier, uint64_t event_id)
{
    msgpack_pack_map(pk, 3);
    pk_str(pk, "worker_id");
    msgpack_pack_uint64(pk, worker);
    pk_str(pk, "storage_tier");
    pk_str(pk, tier);
    pk_str(pk, "event");
    msgpack_pack_map(pk, 3);
    pk_str(pk, "event_id");
    msgpack_pack_uint64(pk, event_id);
    pk_str(pk, "data");
}

static void pk_tail(msgpack_packer *pk, uint32_t rank)
{
    pk_str(pk, "dp_rank");
    msgpack_pack_uint32(pk, rank);
}

static void ex_stored(struct ex *e, uint64_t worker, const char *tier, uint64_t event_id,
                      const uint64_t *parent, const uint64_t *hashes, const uint64_t *th, size_t n,
                      uint32_t rank)
{
    ex_init(e);
    msgpack_packer *pk = &e->pk;
    pk_head(pk, worker, tier, event_id);
    msgpack_pack_map(pk, 1);
    pk_str(pk, "stored");
    msgpack_pack_map(pk, 3);
    pk_str(pk, "parent_hash");
    if (parent)
        msgpack_pack_uint64(pk, *parent);
    else
        msgpack_pack_nil(pk);
    pk_str(pk, "start_position");
    msgpack_pack_nil(pk);
    pk_str(pk, "blocks");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) {
        msgpack_pack_map(pk, 3);
        pk_str(pk, "block_hash");
        msgpack_pack_uint64(pk, hashes[i]);
        pk_str(pk, "tokens_hash");
        msgpack_pack_uint64(pk, th[i]);
        pk_str(pk, "mm_extra_info");
        msgpack_pack_nil(pk);
    }
    pk_tail(pk, rank);
}

static void ex_removed(struct ex *e, uint64_t worker, const char *tier, uint64_t event_id,
                       const uint64_t *hashes, size_t n, uint32_t rank)
{
    ex_init(e);
    msgpack_packer *pk = &e->pk;
    pk_head(pk, worker, tier, event_id);
    msgpack_pack_map(pk, 1);
    pk_str(pk, "removed");
    msgpack_pack_map(pk, 1);
    pk_str(pk, "block_hashes");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, hashes[i]);
    pk_tail(pk, rank);
}

static void ex_cleared(struct ex *e, uint64_t worker, const char *tier, uint64_t event_id,
                       uint32_t rank)
{
    ex_init(e);
    pk_head(&e->pk, worker, tier, event_id);
    pk_str(&e->pk, "cleared");
    pk_tail(&e->pk, rank);
}

static void ex_envelope(struct ex *e, uint64_t pub_id, uint64_t seq, uint64_t at,
                        const void *payload, size_t len)
{
    ex_init(e);
    msgpack_packer *pk = &e->pk;
    msgpack_pack_map(pk, 5);
    pk_str(pk, "publisher_id");
    msgpack_pack_uint64(pk, pub_id);
    pk_str(pk, "sequence");
    msgpack_pack_uint64(pk, seq);
    pk_str(pk, "published_at");
    msgpack_pack_uint64(pk, at);
    pk_str(pk, "topic");
    pk_str(pk, "kv-events");
    pk_str(pk, "payload");
    msgpack_pack_bin(pk, len);
    msgpack_pack_bin_body(pk, payload, len);
}

static void ex_free(struct ex *e)
{
    msgpack_sbuffer_destroy(&e->sb);
}

/* tokens_hash as kvidx's engine computes content hashes. */
static uint64_t content_hash(const uint32_t *tokens, uint32_t bs, const char *lora)
{
    uint64_t seed = kvi_hash_seed(lora, lora ? strlen(lora) : 0, NULL, 0);
    return kvi_hash_block(tokens, bs, seed);
}

/* JSON appender. */
struct js {
    char b[4096];
    size_t n;
};

__attribute__((format(printf, 2, 3))) static void js_cat(struct js *j, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(j->b + j->n, sizeof(j->b) - j->n, fmt, ap);
    va_end(ap);
    assert_true(k >= 0 && (size_t)k < sizeof(j->b) - j->n);
    j->n += (size_t)k;
}

static void js_head(struct js *j, uint64_t worker, const char *tier, uint64_t event_id)
{
    j->n = 0;
    js_cat(j, "{\"worker_id\":%" PRIu64 ",\"storage_tier\":\"%s\",\"event\":{\"event_id\":%" PRIu64
              ",\"data\":",
           worker, tier, event_id);
}

static void js_tail(struct js *j, uint32_t rank)
{
    js_cat(j, ",\"dp_rank\":%" PRIu32 "}}", rank);
}

/* ------------------------------------------------------------------------
 * NATS helpers
 * ------------------------------------------------------------------------ */

static int64_t now_wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A subscription the server has registered (flushed) before we return. */
static natsSubscription *subscribe(const char *subject)
{
    natsSubscription *sub = NULL;
    assert_int_equal(natsConnection_SubscribeSync(&sub, g_nc, subject), NATS_OK);
    assert_int_equal(natsConnection_FlushTimeout(g_nc, WAIT_MS), NATS_OK);
    return sub;
}

static natsMsg *next_msg(natsSubscription *sub)
{
    natsMsg *m = NULL;
    natsStatus s = natsSubscription_NextMsg(&m, sub, WAIT_MS);
    if (s != NATS_OK)
        kvi_nats_server_dump_log(&g_srv);
    assert_int_equal(s, NATS_OK);
    return m;
}

static void expect_quiet(natsSubscription *sub)
{
    natsMsg *m = NULL;
    assert_int_equal(natsSubscription_NextMsg(&m, sub, QUIET_MS), NATS_TIMEOUT);
}

static void expect_bytes(const void *got, size_t got_len, const void *want, size_t want_len)
{
    if (got_len != want_len || memcmp(got, want, want_len)) {
        fprintf(stderr, "got  %zu bytes:", got_len);
        for (size_t i = 0; i < got_len; i++)
            fprintf(stderr, " %02x", ((const uint8_t *)got)[i]);
        fprintf(stderr, "\nwant %zu bytes:", want_len);
        for (size_t i = 0; i < want_len; i++)
            fprintf(stderr, " %02x", ((const uint8_t *)want)[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(got_len, want_len);
    assert_memory_equal(got, want, want_len);
}

static size_t mp_uint_len(uint64_t v)
{
    return v <= 0x7f ? 1 : v <= 0xff ? 2 : v <= 0xffff ? 3 : v <= 0xffffffffu ? 5 : 9;
}

/*
 * Check one Core message: the envelope with @p seq, published_at within
 * [t0, t1], and the RouterEvent @p ev as its payload, byte for byte.
 */
static void expect_core(natsMsg *m, uint64_t seq, int64_t t0, int64_t t1, const struct ex *ev)
{
    const uint8_t *d = (const uint8_t *)natsMsg_GetData(m);
    size_t len = (size_t)natsMsg_GetDataLength(m);
    /* 0x85, "publisher_id", id, "sequence", seq, "published_at" (13), then 0xcf + 8 */
    size_t off = 1 + 13 + mp_uint_len(PUB_ID) + 9 + mp_uint_len(seq) + 13;
    assert_true(len > off + 9);
    assert_int_equal(d[off], 0xcf);
    uint64_t at = 0;
    for (int i = 1; i <= 8; i++)
        at = at << 8 | d[off + i];
    assert_true(at >= (uint64_t)t0 && at <= (uint64_t)t1);
    struct ex env;
    ex_envelope(&env, PUB_ID, seq, at, ev->sb.data, ev->sb.size);
    expect_bytes(d, len, env.sb.data, env.sb.size);
    ex_free(&env);
}

static struct kvidx_pub *core_pub(const char *subject, uint64_t worker, int32_t rank,
                                  const char *url)
{
    struct kvidx_pub_config c;
    kvidx_pub_config_init(&c);
    c.transport = KVIDX_PUB_TRANSPORT_NATS_CORE;
    c.nats_url = url ? url : g_srv.url;
    c.nats_subject = subject;
    c.worker_id = worker;
    c.dp_rank = rank;
    c.nats_publisher_id = PUB_ID;
    struct kvidx_pub *p = kvidx_pub_create(&c);
    if (!p)
        fprintf(stderr, "create: %s\n", strerror(errno));
    assert_non_null(p);
    assert_int_equal(kvidx_pub_nats_publisher_id(p), PUB_ID);
    assert_string_equal(kvidx_pub_endpoint(p), subject);
    return p;
}

/* ------------------------------------------------------------------------
 * Core NATS
 * ------------------------------------------------------------------------ */

static const uint32_t TOKENS[8] = {1, 2, 3, 4, 100000, 200000, 4000000000u, 7};

/* Stored without parent, u64 hashes and worker_id above 2^63, in a batch
 * with a stored with parent, a removed and a cleared: 4 messages. */
static void test_core_events(void **state)
{
    (void)state;
    const char *subj = "namespace.t.component.core1.kv-events";
    natsSubscription *sub = subscribe(subj);
    struct kvidx_pub *p = core_pub(subj, BIG2, 0, NULL);

    const uint64_t h1[2] = {BIG1, 42};
    const uint64_t h2[1] = {BIG3};
    const uint64_t parent = BIG1 - 1;
    uint64_t id = 99;
    assert_int_equal(kvidx_pub_publish_stored(p, h1, 2, NULL, TOKENS, 8, 4, &id), 0);
    assert_int_equal(id, 0);
    assert_int_equal(kvidx_pub_publish_stored(p, h2, 1, &parent, TOKENS + 4, 4, 4, &id), 0);
    assert_int_equal(id, 1);
    assert_int_equal(kvidx_pub_publish_removed(p, h1, 2, &id), 0);
    assert_int_equal(id, 2);
    assert_int_equal(kvidx_pub_publish_cleared(p, &id), 0);
    assert_int_equal(id, 3);
    assert_int_equal(kvidx_pub_pending(p), 4);
    int64_t t0 = now_wall_ms();
    uint64_t seq = 0;
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    int64_t t1 = now_wall_ms();
    assert_int_equal(seq, 3);
    assert_int_equal(kvidx_pub_pending(p), 0);
    assert_int_equal(kvidx_pub_next_seq(p), 4);

    const uint64_t th1[2] = {content_hash(TOKENS, 4, NULL), content_hash(TOKENS + 4, 4, NULL)};
    struct ex ev[4];
    ex_stored(&ev[0], BIG2, "device", 0, NULL, h1, th1, 2, 0);
    ex_stored(&ev[1], BIG2, "device", 1, &parent, h2, th1 + 1, 1, 0);
    ex_removed(&ev[2], BIG2, "device", 2, h1, 2, 0);
    ex_cleared(&ev[3], BIG2, "device", 3, 0);
    /* u64 above 2^63 as msgpack uint 64: worker_id right after its key. */
    assert_int_equal((uint8_t)ev[0].sb.data[1 + 10], 0xcf);

    uint64_t bytes = 0;
    for (int i = 0; i < 4; i++) {
        natsMsg *m = next_msg(sub);
        assert_string_equal(natsMsg_GetSubject(m), subj);
        expect_core(m, (uint64_t)i, t0, t1, &ev[i]);
        bytes += (uint64_t)natsMsg_GetDataLength(m);
        natsMsg_Destroy(m);
        ex_free(&ev[i]);
    }
    expect_quiet(sub);

    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.next_seq, 4);
    assert_int_equal(st.next_event_id, 4);
    assert_int_equal(st.batches, 4);
    assert_int_equal(st.batches_live, 4);
    assert_int_equal(st.events, 4);
    assert_int_equal(st.bytes, bytes);
    assert_int_equal(st.send_errors, 0);
    /* An empty flush sends nothing. */
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    assert_int_equal(seq, KVIDX_PUB_NO_SEQ);
    kvidx_pub_destroy(p);
    natsSubscription_Destroy(sub);
}

/* dp_rank 3, a LoRA (publisher-wide and per event), storage tiers, a server
 * list whose first entry refuses connections, auto_flush 1. */
static void test_core_lora_rank_tiers(void **state)
{
    (void)state;
    const char *subj = "namespace.t.component.core2.kv-events";
    natsSubscription *sub = subscribe(subj);
    char urls[160];
    snprintf(urls, sizeof(urls), "nats://127.0.0.1:1 , %s", g_srv.url);
    struct kvidx_pub_config c;
    kvidx_pub_config_init(&c);
    c.transport = KVIDX_PUB_TRANSPORT_NATS_CORE;
    c.nats_url = urls;
    c.nats_subject = subj;
    c.worker_id = 7;
    c.dp_rank = 3;
    c.nats_publisher_id = PUB_ID;
    c.auto_flush = 1;
    c.medium = "CPU";
    c.lora_name = "sql-adapter";
    struct kvidx_pub *p = kvidx_pub_create(&c);
    assert_non_null(p);

    const uint64_t h[2] = {11, BIG1};
    /* publisher-wide LoRA and medium */
    int64_t t0 = now_wall_ms();
    assert_int_equal(kvidx_pub_publish_stored(p, h, 2, NULL, TOKENS, 8, 4, NULL), 0);
    /* per-event LoRA and medium */
    struct kvidx_pub_stored se = {.block_hashes = h, .n_hashes = 1, .token_ids = TOKENS,
                                  .n_tokens = 4, .block_size = 4, .medium = "disk",
                                  .lora_name = "other"};
    assert_int_equal(kvidx_pub_publish_stored_ex(p, &se, NULL), 0);
    struct kvidx_pub_removed re = {.block_hashes = h, .n_hashes = 2, .medium = "NVMe"};
    assert_int_equal(kvidx_pub_publish_removed_ex(p, &re, NULL), 0);
    re.medium = "GPU";
    assert_int_equal(kvidx_pub_publish_removed_ex(p, &re, NULL), 0);
    int64_t t1 = now_wall_ms();
    assert_int_equal(kvidx_pub_pending(p), 0); /* auto-flushed */

    uint64_t base = content_hash(TOKENS, 4, NULL);
    const uint64_t th[2] = {content_hash(TOKENS, 4, "sql-adapter"),
                            content_hash(TOKENS + 4, 4, "sql-adapter")};
    const uint64_t th_other = content_hash(TOKENS, 4, "other");
    assert_true(th[0] != base && th_other != base && th_other != th[0]);
    struct ex ev[4];
    ex_stored(&ev[0], 7, "host_pinned", 0, NULL, h, th, 2, 3);
    ex_stored(&ev[1], 7, "disk", 1, NULL, h, &th_other, 1, 3);
    ex_removed(&ev[2], 7, "external", 2, h, 2, 3);
    ex_removed(&ev[3], 7, "device", 3, h, 2, 3);
    for (int i = 0; i < 4; i++) {
        natsMsg *m = next_msg(sub);
        expect_core(m, (uint64_t)i, t0, t1, &ev[i]);
        natsMsg_Destroy(m);
        ex_free(&ev[i]);
    }
    kvidx_pub_destroy(p);
    natsSubscription_Destroy(sub);
}

/* skip_live: an event_id and sequence gap; send_raw: raw bytes, one message
 * per frame, no sequence consumed; publish_payload: the caller's bytes in
 * the envelope. */
static void test_core_faults(void **state)
{
    (void)state;
    const char *subj = "namespace.t.component.core3.kv-events";
    natsSubscription *sub = subscribe(subj);
    struct kvidx_pub *p = core_pub(subj, 5, 1, NULL);

    int64_t t0 = now_wall_ms();
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);   /* id 0, seq 0 */
    assert_int_equal(kvidx_pub_flush(p, NULL), 0);
    kvidx_pub_skip_live(p, 2);
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);   /* id 1, withheld */
    assert_int_equal(kvidx_pub_flush(p, NULL), 0);
    const void *frames[2] = {"\xc1 not msgpack", NULL};
    const size_t sizes[2] = {13, 0};
    assert_int_equal(kvidx_pub_send_raw(p, frames, sizes, 2), 0);
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);   /* id 2, withheld */
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);   /* id 3, seq 3 */
    uint64_t seq = 0;
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    assert_int_equal(seq, 3);
    assert_int_equal(kvidx_pub_publish_payload(p, "\x92\x01\x02", 3, &seq), 0);
    assert_int_equal(seq, 4);
    int64_t t1 = now_wall_ms();

    struct ex ev;
    natsMsg *m = next_msg(sub);
    ex_cleared(&ev, 5, "device", 0, 1);
    expect_core(m, 0, t0, t1, &ev);
    ex_free(&ev);
    natsMsg_Destroy(m);
    m = next_msg(sub);
    expect_bytes(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), "\xc1 not msgpack", 13);
    natsMsg_Destroy(m);
    m = next_msg(sub);
    assert_int_equal(natsMsg_GetDataLength(m), 0);
    natsMsg_Destroy(m);
    m = next_msg(sub);
    ex_cleared(&ev, 5, "device", 3, 1);
    expect_core(m, 3, t0, t1, &ev);
    ex_free(&ev);
    natsMsg_Destroy(m);
    m = next_msg(sub);
    ex_init(&ev);
    msgpack_pack_array(&ev.pk, 2);
    msgpack_pack_uint8(&ev.pk, 1);
    msgpack_pack_uint8(&ev.pk, 2);
    expect_core(m, 4, t0, t1, &ev);
    ex_free(&ev);
    natsMsg_Destroy(m);
    expect_quiet(sub);

    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.batches, 5);
    assert_int_equal(st.batches_live, 3);
    assert_int_equal(st.batches_skipped, 2);
    assert_int_equal(st.events, 4);
    assert_int_equal(st.raw_messages, 2);
    assert_int_equal(st.next_event_id, 4);
    assert_int_equal(st.next_seq, 5);
    kvidx_pub_destroy(p);
    natsSubscription_Destroy(sub);
}

static struct kvidx_pub *try_create(struct kvidx_pub_config *c, int want_errno)
{
    errno = 0;
    struct kvidx_pub *p = kvidx_pub_create(c);
    assert_null(p);
    assert_int_equal(errno, want_errno);
    return p;
}

static void test_errors(void **state)
{
    (void)state;
    struct kvidx_pub_config c;
    kvidx_pub_config_init(&c);
    c.transport = KVIDX_PUB_TRANSPORT_NATS_CORE;
    c.nats_url = g_srv.url;
    c.nats_timeout_ms = 3000;
    try_create(&c, EINVAL); /* no subject */
    c.nats_subject = "x.kv-events";
    c.dp_rank = KVIDX_PUB_RANK_NIL;
    try_create(&c, EINVAL);
    c.dp_rank = 0;
    c.transport = (enum kvidx_pub_transport)7;
    try_create(&c, EINVAL);
    c.transport = KVIDX_PUB_TRANSPORT_NATS_CORE;
    c.nats_url = "nats://127.0.0.1:1";
    try_create(&c, ECONNREFUSED);
    c.nats_url = g_srv.url;
    c.transport = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    c.nats_subject = NULL;
    try_create(&c, EINVAL); /* neither subject nor stream */
    c.nats_stream = "no-such-stream";
    try_create(&c, ENOENT); /* not to be created */

    c.transport = KVIDX_PUB_TRANSPORT_NATS_CORE;
    c.nats_subject = "x.kv-events";
    struct kvidx_pub *p = kvidx_pub_create(&c);
    assert_non_null(p);
    const uint64_t h[2] = {1, 2};
    assert_int_equal(kvidx_pub_publish_stored(p, h, 2, NULL, NULL, 0, 4, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_stored(p, h, 2, NULL, TOKENS, 7, 4, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_stored(p, h, 2, NULL, TOKENS, 8, 0, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_stored(p, h, 1, NULL, TOKENS, 8, 4, NULL), -EINVAL);
    struct kvidx_pub_stored se = {.block_hashes = h, .n_hashes = 1, .n_tokens = 4,
                                  .block_size = 4, .token_ids_nil = true, .token_ids = TOKENS};
    assert_int_equal(kvidx_pub_publish_stored_ex(p, &se, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_removed(p, h, 0, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_flush_empty(p, NULL), -ENOTSUP);
    struct kvidx_pub_replay_faults f = {.silent = true};
    assert_int_equal(kvidx_pub_set_replay_faults(p, &f), -EINVAL);
    assert_null(kvidx_pub_replay_endpoint(p));
    assert_int_equal(kvidx_pub_pending(p), 0);
    assert_int_equal(kvidx_pub_last_error(p), 0);
    assert_string_equal(kvidx_pub_last_error_text(p), "");
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.next_event_id, 0);
    kvidx_pub_destroy(p);
}

/* A message over the server's max_payload (1 MiB) can never be published:
 * it is dropped (its id and sequence number consumed, counted in dropped),
 * the rest of its batch goes out in order, and the flush returns -EIO with
 * the natsStatus; nothing stays held. */
static void test_core_send_error(void **state)
{
    (void)state;
    const char *subj = "namespace.t.component.core4.kv-events";
    natsSubscription *sub = subscribe(subj);
    struct kvidx_pub *p = core_pub(subj, 1, 0, NULL);
    enum { NB = 20000 };
    uint64_t *h = calloc(NB, sizeof(*h));
    uint32_t *tok = calloc(NB, sizeof(*tok));
    assert_non_null(h);
    assert_non_null(tok);
    for (uint32_t i = 0; i < NB; i++) {
        h[i] = BIG1 + i;
        tok[i] = i;
    }
    assert_int_equal(kvidx_pub_publish_stored(p, h, NB, NULL, tok, NB, 1, NULL), 0);
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);
    uint64_t seq = 0;
    int64_t t0 = now_wall_ms();
    assert_int_equal(kvidx_pub_flush(p, &seq), -EIO);
    assert_int_equal(seq, 1);
    assert_int_equal(kvidx_pub_pending(p), 0);
    assert_int_equal(kvidx_pub_last_error(p), NATS_MAX_PAYLOAD);
    assert_string_equal(kvidx_pub_last_error_text(p), natsStatus_GetText(NATS_MAX_PAYLOAD));
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    int64_t t1 = now_wall_ms();
    assert_int_equal(seq, 2);
    for (uint64_t i = 1; i <= 2; i++) {
        natsMsg *m = next_msg(sub);
        struct ex ev;
        ex_cleared(&ev, 1, "device", i, 0);
        expect_core(m, i, t0, t1, &ev);
        ex_free(&ev);
        natsMsg_Destroy(m);
    }
    expect_quiet(sub);
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.batches, 3);
    assert_int_equal(st.batches_live, 2);
    assert_int_equal(st.send_errors, 1);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(st.retries, 0);
    free(h);
    free(tok);
    kvidx_pub_destroy(p);
    natsSubscription_Destroy(sub);
}

static void test_stream_name(void **state)
{
    (void)state;
    char out[128];
    assert_int_equal(
        kvidx_pub_nats_stream_name("namespace.dynamo.component.backend.kv-events", out, sizeof(out)),
        0);
    assert_string_equal(out, "namespace-dynamo-component-backend-kv-events");
    assert_int_equal(kvidx_pub_nats_stream_name("NS.My_Model.x y*>", out, sizeof(out)), 0);
    assert_string_equal(out, "ns-my-model-x-y--");
    assert_int_equal(kvidx_pub_nats_stream_name("a\xc3\xa9" "b", out, sizeof(out)), 0);
    assert_string_equal(out, "a-b");
    assert_int_equal(kvidx_pub_nats_stream_name("abc", out, 4), 0);
    assert_int_equal(kvidx_pub_nats_stream_name("abcd", out, 4), -ENOSPC);
    assert_int_equal(kvidx_pub_nats_stream_name("", out, sizeof(out)), -EINVAL);
    assert_int_equal(kvidx_pub_nats_stream_name(NULL, out, sizeof(out)), -EINVAL);
}

/* ------------------------------------------------------------------------
 * JetStream
 * ------------------------------------------------------------------------ */

static void expect_js_msg(jsCtx *js, const char *stream, uint64_t sseq, const char *msg_id,
                          const struct js *want)
{
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    assert_int_equal(js_GetMsg(&m, js, stream, sseq, NULL, &jerr), NATS_OK);
    const char *id = NULL;
    natsStatus s = natsMsgHeader_Get(m, "Nats-Msg-Id", &id);
    if (msg_id) {
        assert_int_equal(s, NATS_OK);
        assert_string_equal(id, msg_id);
    } else {
        assert_int_equal(s, NATS_NOT_FOUND);
    }
    expect_bytes(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), want->b, want->n);
    natsMsg_Destroy(m);
}

static void test_jetstream(void **state)
{
    (void)state;
    const char *subj = "namespace.T.component.js1.kv-events";
    const char *stream = "namespace-t-component-js1-kv-events";
    struct kvidx_pub_config c;
    kvidx_pub_config_init(&c);
    c.transport = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    c.nats_url = g_srv.url;
    c.nats_subject = subj;
    c.worker_id = BIG1;
    c.dp_rank = 2;
    c.flags = KVIDX_PUB_F_NATS_CREATE_STREAM;
    struct kvidx_pub *p = kvidx_pub_create(&c);
    assert_non_null(p);
    assert_string_equal(kvidx_pub_endpoint(p), "namespace-t-component-js1-kv-events.kv-events");

    jsCtx *js = NULL;
    assert_int_equal(natsConnection_JetStream(&js, g_nc, NULL), NATS_OK);
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    assert_int_equal(js_GetStreamInfo(&si, js, stream, NULL, &jerr), NATS_OK);
    assert_int_equal(si->Config->SubjectsLen, 1);
    assert_string_equal(si->Config->Subjects[0], "namespace-t-component-js1-kv-events.*");
    assert_int_equal(si->Config->Storage, js_FileStorage);
    assert_int_equal(si->Config->MaxAge, INT64_C(3600) * 1000 * 1000 * 1000);
    assert_int_equal(si->State.Msgs, 0);
    jsStreamInfo_Destroy(si);

    const uint64_t h[2] = {BIG3, 9};
    const uint64_t parent = BIG2;
    assert_int_equal(kvidx_pub_publish_stored(p, h, 2, &parent, TOKENS, 8, 4, NULL), 0);
    assert_int_equal(kvidx_pub_publish_stored(p, h + 1, 1, NULL, TOKENS, 4, 4, NULL), 0);
    assert_int_equal(kvidx_pub_publish_removed(p, h, 2, NULL), 0);
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);
    uint64_t seq = 0;
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    assert_int_equal(seq, 3);

    const uint64_t th0 = content_hash(TOKENS, 4, NULL), th1 = content_hash(TOKENS + 4, 4, NULL);
    struct js want[4];
    js_head(&want[0], BIG1, "device", 0);
    js_cat(&want[0],
           "{\"stored\":{\"parent_hash\":%" PRIu64 ",\"start_position\":null,\"blocks\":["
           "{\"block_hash\":%" PRIu64 ",\"tokens_hash\":%" PRIu64 ",\"mm_extra_info\":null},"
           "{\"block_hash\":%" PRIu64 ",\"tokens_hash\":%" PRIu64 ",\"mm_extra_info\":null}]}}",
           parent, h[0], th0, h[1], th1);
    js_tail(&want[0], 2);
    js_head(&want[1], BIG1, "device", 1);
    js_cat(&want[1],
           "{\"stored\":{\"parent_hash\":null,\"start_position\":null,\"blocks\":["
           "{\"block_hash\":9,\"tokens_hash\":%" PRIu64 ",\"mm_extra_info\":null}]}}",
           th0);
    js_tail(&want[1], 2);
    js_head(&want[2], BIG1, "device", 2);
    js_cat(&want[2], "{\"removed\":{\"block_hashes\":[18446744073709551615,9]}}");
    js_tail(&want[2], 2);
    js_head(&want[3], BIG1, "device", 3);
    js_cat(&want[3], "\"cleared\"");
    js_tail(&want[3], 2);
    assert_non_null(strstr(want[0].b, "{\"worker_id\":18364758544493064720,"));
    char id[128];
    uint64_t pid = kvidx_pub_nats_publisher_id(p);
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof(id), "%" PRIu64 "-2-%" PRIu64 "-%d", BIG1, pid, i);
        expect_js_msg(js, stream, (uint64_t)i + 1, id, &want[i]);
    }

    /* A publisher restarted with the same identity (worker, rank, stream and
     * publisher id; the stream found, not created) repeats message ids 0..3:
     * the server drops them. skip_live withholds id 4; send_raw adds a
     * message without id. */
    kvidx_pub_destroy(p);
    c.flags = 0;
    c.nats_subject = NULL;
    c.nats_stream = stream;
    c.nats_publisher_id = pid;
    p = kvidx_pub_create(&c);
    assert_non_null(p);
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    assert_int_equal(seq, 3);
    kvidx_pub_skip_live(p, 1);
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    assert_int_equal(seq, 5);
    const void *frames[1] = {"{not json"};
    const size_t sizes[1] = {9};
    assert_int_equal(kvidx_pub_send_raw(p, frames, sizes, 1), 0);
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.batches, 6);
    assert_int_equal(st.batches_live, 5); /* the duplicates were acknowledged */
    assert_int_equal(st.batches_skipped, 1);
    assert_int_equal(st.raw_messages, 1);
    assert_int_equal(st.send_errors, 0);

    si = NULL;
    assert_int_equal(js_GetStreamInfo(&si, js, stream, NULL, &jerr), NATS_OK);
    assert_int_equal(si->State.Msgs, 6);
    assert_int_equal(si->State.LastSeq, 6);
    jsStreamInfo_Destroy(si);
    struct js w;
    js_head(&w, BIG1, "device", 5);
    js_cat(&w, "\"cleared\"");
    js_tail(&w, 2);
    snprintf(id, sizeof(id), "%" PRIu64 "-2-%" PRIu64 "-5", BIG1, pid);
    expect_js_msg(js, stream, 5, id, &w);
    w.n = 0;
    js_cat(&w, "{not json");
    expect_js_msg(js, stream, 6, NULL, &w);
    kvidx_pub_destroy(p);

    /* A restarted engine (a new random publisher id) starts again at event 0:
     * its events are new messages, not duplicates. */
    c.nats_publisher_id = 0;
    p = kvidx_pub_create(&c);
    assert_non_null(p);
    assert_true(kvidx_pub_nats_publisher_id(p) != pid);
    assert_int_equal(kvidx_pub_publish_cleared(p, NULL), 0);
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    js_head(&w, BIG1, "device", 0);
    js_cat(&w, "\"cleared\"");
    js_tail(&w, 2);
    snprintf(id, sizeof(id), "%" PRIu64 "-2-%" PRIu64 "-0", BIG1, kvidx_pub_nats_publisher_id(p));
    expect_js_msg(js, stream, 7, id, &w);
    kvidx_pub_destroy(p);
    jsCtx_Destroy(js);
}

/* ------------------------------------------------------------------------
 * JetStream failover: the engine keeps publishing while the stream is away
 * ------------------------------------------------------------------------ */

#define FO_DEADLINE_MS 45000 /* an outage's backlog drained, a consumer caught up */
#define FO_TIMEOUT_MS 1000   /* the publisher's nats_timeout_ms: one failing try */

static int64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void nap_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* What the engine published: the expected JSON of every accepted event, by
 * event id, built independently of the library (js_head / js_cat). */
struct evlog {
    struct js *want;
    size_t n, cap;
    uint64_t worker;
    uint32_t rank;
};

/*
 * Publish event number evlog->n (a stored event with parent, a removed or a
 * cleared, by turns; its hashes derived from the number). An accepted event
 * (0, or -EIO from its automatic flush) must carry the next id and goes into
 * the log; -ENOBUFS must leave the id counter alone. @return the call's rc.
 */
static int fo_publish(struct kvidx_pub *p, struct evlog *lg)
{
    if (lg->n == lg->cap) {
        lg->cap = lg->cap ? lg->cap * 2 : 64;
        lg->want = realloc(lg->want, lg->cap * sizeof(*lg->want));
        assert_non_null(lg->want);
    }
    uint64_t k = lg->n;
    struct js *w = &lg->want[k];
    const uint64_t h[2] = {BIG1 + 2 * k, 2 * k + 1};
    const uint64_t parent = BIG2 + k;
    struct kvidx_pub_stats before;
    kvidx_pub_get_stats(p, &before);
    uint64_t id = UINT64_C(777777);
    int rc;
    js_head(w, lg->worker, "device", k);
    switch (k % 3) {
    case 0:
        rc = kvidx_pub_publish_stored(p, h, 2, &parent, TOKENS, 8, 4, &id);
        js_cat(w,
               "{\"stored\":{\"parent_hash\":%" PRIu64 ",\"start_position\":null,\"blocks\":["
               "{\"block_hash\":%" PRIu64 ",\"tokens_hash\":%" PRIu64 ",\"mm_extra_info\":null},"
               "{\"block_hash\":%" PRIu64 ",\"tokens_hash\":%" PRIu64 ",\"mm_extra_info\":null}]}}",
               parent, h[0], content_hash(TOKENS, 4, NULL), h[1], content_hash(TOKENS + 4, 4, NULL));
        break;
    case 1:
        rc = kvidx_pub_publish_removed(p, h, 2, &id);
        js_cat(w, "{\"removed\":{\"block_hashes\":[%" PRIu64 ",%" PRIu64 "]}}", h[0], h[1]);
        break;
    default:
        rc = kvidx_pub_publish_cleared(p, &id);
        js_cat(w, "\"cleared\"");
        break;
    }
    js_tail(w, lg->rank);
    struct kvidx_pub_stats after;
    kvidx_pub_get_stats(p, &after);
    if (rc == -ENOBUFS) {
        assert_int_equal(id, 777777);
        assert_int_equal(after.next_event_id, before.next_event_id);
        return rc;
    }
    if (rc != 0 && rc != -EIO)
        fail_msg("publish of event %" PRIu64 ": %d (%s)", k, rc, strerror(-rc));
    assert_int_equal(id, k);
    assert_int_equal(after.next_event_id, k + 1);
    lg->n++;
    return rc;
}

/* Publish @p count more events, accepted whatever happens: on -ENOBUFS flush
 * and try again (bounded). @p nap between publishes, ms. */
static void fo_run(struct kvidx_pub *p, struct evlog *lg, size_t count, long nap)
{
    int64_t until = mono_ms() + FO_DEADLINE_MS;
    for (size_t target = lg->n + count; lg->n < target;) {
        if (fo_publish(p, lg) == -ENOBUFS) {
            if (mono_ms() > until)
                fail_msg("the publisher stayed full for %d ms", FO_DEADLINE_MS);
            (void)kvidx_pub_flush(p, NULL);
            nap_ms(100);
        } else if (nap) {
            nap_ms(nap);
        }
    }
}

/* Flush until nothing is held (bounded: the stream comes back). */
static void fo_drain(struct kvidx_pub *p)
{
    int64_t until = mono_ms() + FO_DEADLINE_MS;
    int rc;
    while ((rc = kvidx_pub_flush(p, NULL)) != 0 || kvidx_pub_pending(p) != 0) {
        if (mono_ms() > until)
            fail_msg("%zu events still held after %d ms: %s", kvidx_pub_pending(p),
                     FO_DEADLINE_MS, kvidx_pub_last_error_text(p));
        nap_ms(100);
    }
}

/*
 * Read @p stream back from the start with a consumer of its own: message i
 * must be event i of the log (its JSON byte for byte, its Nats-Msg-Id, a
 * stream sequence above the one before), and nothing after the last. @p js may have to wait for a
 * stream leader (bounded).
 */
static void fo_expect_stream(jsCtx *js, const char *stream, const char *subject,
                             const struct evlog *lg, uint64_t pub_id)
{
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Config.AckPolicy = js_AckNone;
    so.Config.DeliverPolicy = js_DeliverAll;
    natsSubscription *sub = NULL;
    int64_t until = mono_ms() + FO_DEADLINE_MS;
    natsStatus s;
    jsErrCode jerr = 0;
    while ((s = js_SubscribeSync(&sub, js, subject, NULL, &so, &jerr)) != NATS_OK &&
           mono_ms() < until)
        nap_ms(200);
    if (s != NATS_OK)
        fail_msg("no consumer on %s: %s (%d)", stream, natsStatus_GetText(s), (int)jerr);
    uint64_t last_seq = 0;
    for (size_t i = 0; i < lg->n; i++) {
        natsMsg *m = NULL;
        s = natsSubscription_NextMsg(&m, sub, FO_DEADLINE_MS);
        if (s != NATS_OK)
            fail_msg("stream %s: message %zu of %zu missing: %s", stream, i + 1, lg->n,
                     natsStatus_GetText(s));
        const char *id = NULL;
        assert_int_equal(natsMsgHeader_Get(m, "Nats-Msg-Id", &id), NATS_OK);
        char want_id[128];
        snprintf(want_id, sizeof(want_id), "%" PRIu64 "-%" PRIu32 "-%" PRIu64 "-%zu", lg->worker,
                 lg->rank, pub_id, i);
        if (strcmp(id, want_id))
            fail_msg("stream %s: message %zu is %s, want %s", stream, i + 1, id, want_id);
        expect_bytes(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), lg->want[i].b,
                     lg->want[i].n);
        jsMsgMetaData *md = NULL;
        assert_int_equal(natsMsg_GetMetaData(&md, m), NATS_OK);
        assert_true(md->Sequence.Stream > last_seq);
        last_seq = md->Sequence.Stream;
        jsMsgMetaData_Destroy(md);
        natsMsg_Destroy(m);
    }
    natsMsg *m = NULL;
    assert_int_equal(natsSubscription_NextMsg(&m, sub, QUIET_MS), NATS_TIMEOUT);
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
}

/* A client connection that reconnects quickly and for ever, and its JetStream context. */
static natsConnection *fo_connect(const struct kvi_nats_server *srv, int n, jsCtx **js)
{
    const char *urls[KVI_NATS_CLUSTER_MAX];
    for (int i = 0; i < n; i++)
        urls[i] = srv[i].url;
    natsOptions *o = NULL;
    assert_int_equal(natsOptions_Create(&o), NATS_OK);
    assert_int_equal(natsOptions_SetServers(o, urls, n), NATS_OK);
    assert_int_equal(natsOptions_SetMaxReconnect(o, -1), NATS_OK);
    assert_int_equal(natsOptions_SetReconnectWait(o, 100), NATS_OK);
    natsConnection *nc = NULL;
    assert_int_equal(natsConnection_Connect(&nc, o), NATS_OK);
    natsOptions_Destroy(o);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 2000;
    assert_int_equal(natsConnection_JetStream(js, nc, &jo), NATS_OK);
    return nc;
}

/*
 * The only server stops (SIGTERM) mid-stream and comes back on its port and
 * store while the engine goes on publishing and flushing (no auto_flush):
 *   - during the outage flush fails with -EIO and every event stays held,
 *     in order; at nats_max_pending (12) a publish fails with -ENOBUFS and
 *     gets no id; another flush keeps all 12;
 *   - publish_payload does not overtake the held events (-EIO, not sent);
 *   - the front event's failed try is taken to have been stored (the test
 *     stores a copy with its Nats-Msg-Id once the server is back): the
 *     library's retry is acknowledged as a duplicate and not stored again;
 *   - a second publisher (its own stream) with auto_flush 1 retries on each
 *     publish call: every call during the outage returns -EIO with its event
 *     accepted and held, and at its bound (3) the call tries one flush and
 *     then refuses the event (-ENOBUFS);
 *   - after the backlogs drained, a consumer reads every event once, in
 *     order, byte for byte, under its own Nats-Msg-Id.
 */
static void test_jetstream_server_outage(void **state)
{
    (void)state;
    int64_t t0 = mono_ms();
    struct kvi_nats_server srv;
    int rc = kvi_nats_server_start(&srv, START_MS);
    if (rc)
        fail_msg("nats-server did not start: %s", strerror(-rc));
    jsCtx *js = NULL;
    natsConnection *nc = fo_connect(&srv, 1, &js);
    const char *stream = "fo-single", *subject = "fo-single.kv-events";

    struct kvidx_pub_config c;
    kvidx_pub_config_init(&c);
    c.transport = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    c.nats_url = srv.url;
    c.nats_stream = stream;
    c.flags = KVIDX_PUB_F_NATS_CREATE_STREAM;
    c.worker_id = 9;
    c.dp_rank = 1;
    c.nats_timeout_ms = FO_TIMEOUT_MS / 2; /* each try during the outage waits this long */
    c.nats_max_pending = 12;
    struct kvidx_pub *p = kvidx_pub_create(&c);
    assert_non_null(p);
    uint64_t pid = kvidx_pub_nats_publisher_id(p);
    struct evlog lg = {.worker = 9, .rank = 1};
    c.nats_stream = "fo-single-af";
    c.worker_id = 10;
    c.dp_rank = 0;
    c.auto_flush = 1;
    c.nats_max_pending = 3;
    struct kvidx_pub *p2 = kvidx_pub_create(&c);
    assert_non_null(p2);
    struct evlog lg2 = {.worker = 10, .rank = 0};

    /* 10 and 2 events before the outage, all stored (an acknowledgement slower than the
     * timeout on a busy machine is retried; the checks below count from here) */
    fo_run(p2, &lg2, 2, 0);
    fo_drain(p2);
    for (int i = 0; i < 10; i += 3) {
        fo_run(p, &lg, i + 3 <= 10 ? 3 : 10 - (size_t)i, 0);
        (void)kvidx_pub_flush(p, NULL);
    }
    fo_drain(p);
    struct kvidx_pub_stats st0, st0b;
    kvidx_pub_get_stats(p, &st0);
    kvidx_pub_get_stats(p2, &st0b);

    kvi_nats_server_pause(&srv);
    for (int i = 0; i < 5; i++)
        assert_int_equal(fo_publish(p, &lg), 0);
    assert_int_equal(kvidx_pub_flush(p, NULL), -EIO);
    assert_int_equal(kvidx_pub_pending(p), 5);
    while (lg.n < 22)
        assert_int_equal(fo_publish(p, &lg), 0);
    assert_int_equal(kvidx_pub_pending(p), 12);
    assert_int_equal(fo_publish(p, &lg), -ENOBUFS); /* full: refused, nothing changes */
    assert_int_equal(kvidx_pub_flush(p, NULL), -EIO);
    assert_int_equal(kvidx_pub_pending(p), 12);
    assert_int_equal(fo_publish(p, &lg), -ENOBUFS);
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.events, 10);
    assert_int_equal(st.batches_live, 10);
    assert_int_equal(st.send_errors - st0.send_errors, 2);
    assert_int_equal(st.retries - st0.retries, 1);
    assert_int_equal(st.next_event_id, 22);
    assert_int_equal(st.dropped, 0);
    /* a caller's payload never overtakes a held event: not sent */
    uint64_t seq = 99;
    assert_int_equal(kvidx_pub_publish_payload(p, "{}", 2, &seq), -EIO);
    assert_int_equal(seq, 99);
    assert_int_equal(kvidx_pub_pending(p), 12);
    for (int i = 0; i < 3; i++) /* accepted, held: each call retries the front once */
        assert_int_equal(fo_publish(p2, &lg2), -EIO);
    assert_int_equal(kvidx_pub_pending(p2), 3);
    assert_int_equal(fo_publish(p2, &lg2), -ENOBUFS); /* one more try, then refused */
    kvidx_pub_get_stats(p2, &st);
    assert_int_equal(st.send_errors - st0b.send_errors, 4);
    assert_int_equal(st.retries - st0b.retries, 3);
    assert_int_equal(st.batches_live, 2);
    assert_int_equal(st.next_event_id, 5);

    /* back; the front event (10) as if its failed try had been stored */
    assert_int_equal(kvi_nats_server_resume(&srv), 0);
    char id10[128];
    snprintf(id10, sizeof(id10), "9-1-%" PRIu64 "-10", pid);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id10;
    int64_t until = mono_ms() + FO_DEADLINE_MS;
    natsStatus s;
    while ((s = js_Publish(NULL, js, subject, lg.want[10].b, (int)lg.want[10].n, &po, NULL)) !=
               NATS_OK &&
           mono_ms() < until)
        nap_ms(100);
    if (s != NATS_OK) {
        kvi_nats_server_dump_log(&srv);
        fail_msg("the server did not come back: %s", natsStatus_GetText(s));
    }
    fo_run(p, &lg, 18, 0);
    fo_drain(p);
    fo_run(p2, &lg2, 3, 0);
    fo_drain(p2);
    fo_expect_stream(js, "fo-single-af", "fo-single-af.kv-events", &lg2,
                     kvidx_pub_nats_publisher_id(p2));
    kvidx_pub_get_stats(p2, &st);
    assert_int_equal(st.batches_live, 8);
    assert_int_equal(st.dropped, 0);
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.next_event_id, 40);
    assert_int_equal(st.events, 40);
    assert_int_equal(st.batches, 40);
    assert_int_equal(st.batches_live, 40);
    assert_int_equal(st.dropped, 0);
    assert_true(st.retries >= 2);
    assert_true(st.duplicates >= 1); /* event 10's retry, at least */
    fo_expect_stream(js, stream, subject, &lg, pid);
    jsStreamInfo *si = NULL;
    assert_int_equal(js_GetStreamInfo(&si, js, stream, NULL, NULL), NATS_OK);
    assert_int_equal(si->State.Msgs, 40);
    jsStreamInfo_Destroy(si);
    print_message("outage: 40 events once, in order; %" PRIu64 " failed publishes, %" PRIu64
                  " retries, %" PRIu64 " duplicates; %.1f s\n",
                  st.send_errors, st.retries, st.duplicates, (double)(mono_ms() - t0) / 1000.0);

    kvidx_pub_destroy(p);
    kvidx_pub_destroy(p2);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    free(lg.want);
    free(lg2.want);
    kvi_nats_server_stop(&srv);
}

/*
 * A stream replicated on a 3-node JetStream cluster (R3); the publisher
 * (auto_flush 1, as an engine runs it) lists the three servers. The stream
 * leader is killed (SIGKILL) mid-stream while the engine keeps publishing,
 * and restarted with its store: every event is in the stream once, in
 * order, read back by a consumer.
 */
static void test_jetstream_cluster_leader_killed(void **state)
{
    (void)state;
    int64_t t0 = mono_ms();
    struct kvi_nats_cluster cl;
    int rc = kvi_nats_cluster_start(&cl, 3, START_MS);
    if (rc)
        fail_msg("cluster did not start: %s", strerror(-rc));
    jsCtx *js = NULL;
    natsConnection *nc = fo_connect(cl.node, cl.n, &js);
    const char *stream = "fo-r3", *subject = "fo-r3.kv-events";
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = stream;
    const char *subjects[] = {"fo-r3.*"};
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    sc.Replicas = 3;
    jsErrCode jerr = 0;
    natsStatus s;
    int64_t until = mono_ms() + FO_DEADLINE_MS;
    while ((s = js_AddStream(NULL, js, &sc, NULL, &jerr)) != NATS_OK && mono_ms() < until)
        nap_ms(200); /* the meta group may still be settling */
    if (s != NATS_OK)
        fail_msg("cannot create the R3 stream: %s (%d)", natsStatus_GetText(s), (int)jerr);

    struct kvidx_pub_config c;
    kvidx_pub_config_init(&c);
    c.transport = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    c.nats_url = cl.urls;
    c.nats_stream = stream;
    c.worker_id = 31;
    c.dp_rank = 0;
    c.auto_flush = 1;
    c.nats_timeout_ms = FO_TIMEOUT_MS;
    struct kvidx_pub *p = kvidx_pub_create(&c);
    assert_non_null(p);
    struct evlog lg = {.worker = 31, .rank = 0};

    fo_run(p, &lg, 20, 0);
    int leader = kvi_nats_cluster_stream_leader(&cl, stream, 20000);
    assert_true(leader >= 0);
    int64_t t_kill = mono_ms();
    kvi_nats_cluster_kill(&cl, leader);
    fo_run(p, &lg, 20, 20); /* through the election */
    assert_int_equal(kvi_nats_cluster_restart(&cl, leader, 20000), 0);
    fo_run(p, &lg, 20, 0);
    fo_drain(p);
    double stall = (double)(mono_ms() - t_kill) / 1000.0;
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(p, &st);
    assert_int_equal(st.next_event_id, 60);
    assert_int_equal(st.batches_live, 60);
    assert_int_equal(st.dropped, 0);
    assert_true(st.retries >= 1); /* the leader's death was felt */
    fo_expect_stream(js, stream, subject, &lg, kvidx_pub_nats_publisher_id(p));
    jsStreamInfo *si = NULL;
    until = mono_ms() + FO_DEADLINE_MS;
    while ((s = js_GetStreamInfo(&si, js, stream, NULL, NULL)) != NATS_OK && mono_ms() < until)
        nap_ms(200);
    assert_int_equal(s, NATS_OK);
    assert_int_equal(si->State.Msgs, 60);
    jsStreamInfo_Destroy(si);
    print_message("leader kvidx-%d killed: 60 events once, in order; %" PRIu64
                  " failed publishes, %" PRIu64 " retries, %" PRIu64
                  " duplicates; kill to drained %.1f s; %.1f s\n",
                  leader, st.send_errors, st.retries, st.duplicates, stall,
                  (double)(mono_ms() - t0) / 1000.0);

    kvidx_pub_destroy(p);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    free(lg.want);
    kvi_nats_cluster_stop(&cl);
}

/* ------------------------------------------------------------------------ */

static int group_setup(void **state)
{
    (void)state;
    int rc = kvi_nats_server_start(&g_srv, START_MS);
    if (rc) {
        fprintf(stderr, "nats-server did not start: %s\n", strerror(-rc));
        return -1;
    }
    if (natsConnection_ConnectTo(&g_nc, g_srv.url) != NATS_OK) {
        kvi_nats_server_stop(&g_srv);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    natsConnection_Destroy(g_nc);
    g_nc = NULL;
    kvi_nats_server_stop(&g_srv);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_name),
        cmocka_unit_test(test_core_events),
        cmocka_unit_test(test_core_lora_rank_tiers),
        cmocka_unit_test(test_core_faults),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_core_send_error),
        cmocka_unit_test(test_jetstream),
        cmocka_unit_test(test_jetstream_server_outage),
        cmocka_unit_test(test_jetstream_cluster_leader_killed),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
