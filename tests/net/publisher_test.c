/* ctest-labels: unit tsan */
/*
 * The C publisher (net/publisher.c), checked from the outside: a raw ZMQ SUB
 * and DEALER receive what it sends and msgpack-c objects decode it, with no
 * kvidx code besides the publisher itself. Covered: the 3 frames, topic and
 * sequence numbers, both event forms with every field (every array length),
 * each hash encoding, dp rank forms, flush and auto-flush, caller payloads
 * and raw messages; replay in both reply layouts with the sentinel, a start
 * past the newest batch, a start older than a wrapped ring, malformed
 * requests, skip_live and each replay fault; restart on the same endpoints
 * (TCP and inproc), the bind/connect rule, DP-rank endpoint offsets,
 * configuration errors, buffer recycling and messages outliving their
 * publisher in a shared context.
 *
 * PUB/SUB slow joiner: before a test expects batches, sync_sub sends probe
 * messages with kvidx_pub_send_raw (no sequence number consumed) until one
 * arrives, then a marker, and drains up to the marker. No fixed sleeps: the
 * only waits are "nothing arrives within N ms" checks of negative outcomes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include <kvidx/publisher.h>

#if defined(__SANITIZE_THREAD__)
/*
 * libzmq is not built with TSan: its I/O threads hand messages over with
 * atomics TSan cannot see, so TSan reports its memcpy of a message body, and
 * its use of socket descriptors, as races with the thread that queued them.
 * Ignore the interceptors libzmq calls; the publisher's own hand-over edges
 * (buffer reference counts, the ring mutex, the pool's stack) stay checked.
 */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so\n";
}
#endif

#define WAIT_MS 5000
#define QUIET_MS 250
#define MAX_FRAMES 8

/* ------------------------------------------------------------------------
 * ZMQ helpers
 * ------------------------------------------------------------------------ */

struct frames {
    int n;
    size_t len[MAX_FRAMES];
    uint8_t *buf[MAX_FRAMES];
};

static void frames_free(struct frames *m)
{
    for (int i = 0; i < m->n && i < MAX_FRAMES; i++)
        free(m->buf[i]);
    m->n = 0;
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static bool poll_in(void *sock, int timeout_ms)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    int64_t end = now_ms() + timeout_ms;
    for (;;) {
        int64_t left = end - now_ms();
        int rc = zmq_poll(&it, 1, left < 0 ? 0 : (long)left);
        if (rc > 0)
            return true;
        if (rc == 0 || zmq_errno() != EINTR)
            return false;
    }
}

/* Receive one multipart message; false on timeout. */
static bool recv_frames(void *sock, struct frames *m, int timeout_ms)
{
    m->n = 0;
    if (!poll_in(sock, timeout_ms))
        return false;
    for (;;) {
        zmq_msg_t z;
        zmq_msg_init(&z);
        int rc = zmq_msg_recv(&z, sock, 0);
        assert_true(rc >= 0);
        int more = zmq_msg_more(&z);
        assert_true(m->n < MAX_FRAMES);
        m->len[m->n] = zmq_msg_size(&z);
        m->buf[m->n] = malloc(m->len[m->n] + 1);
        assert_non_null(m->buf[m->n]);
        memcpy(m->buf[m->n], zmq_msg_data(&z), m->len[m->n]);
        m->buf[m->n][m->len[m->n]] = 0;
        m->n++;
        zmq_msg_close(&z);
        if (!more)
            return true;
    }
}

static void *socket_new(void *ctx, int type)
{
    void *s = zmq_socket(ctx, type);
    assert_non_null(s);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero)), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero)), 0);
    return s;
}

static void *sub_new(void *ctx)
{
    void *s = socket_new(ctx, ZMQ_SUB);
    assert_int_equal(zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0), 0);
    return s;
}

/* "tcp://0.0.0.0:port" (a bound wildcard) -> "tcp://127.0.0.1:port". */
static void local_ep(const char *bound, char *out, size_t cap)
{
    const char *p = strstr(bound, "0.0.0.0");
    if (p)
        snprintf(out, cap, "%.*s127.0.0.1%s", (int)(p - bound), bound, p + 7);
    else
        snprintf(out, cap, "%s", bound);
}

static void connect_to(void *sock, const char *bound)
{
    char ep[256];
    local_ep(bound, ep, sizeof(ep));
    assert_int_equal(zmq_connect(sock, ep), 0);
}

static void send_raw1(struct kvidx_pub *pub, const char *s)
{
    const void *f[1] = {s};
    size_t n[1] = {strlen(s)};
    assert_int_equal(kvidx_pub_send_raw(pub, f, n, 1), 0);
}

/* Wait until @p sub receives what @p pub sends, then drain the probes. */
static void sync_sub(struct kvidx_pub *pub, void *sub)
{
    int64_t end = now_ms() + WAIT_MS;
    for (;;) {
        send_raw1(pub, "probe");
        if (poll_in(sub, 5))
            break;
        assert_true(now_ms() < end);
    }
    send_raw1(pub, "sync-end");
    struct frames m;
    for (;;) {
        assert_true(recv_frames(sub, &m, WAIT_MS));
        assert_int_equal(m.n, 1);
        bool done = !strcmp((char *)m.buf[0], "sync-end");
        assert_true(done || !strcmp((char *)m.buf[0], "probe"));
        frames_free(&m);
        if (done)
            return;
    }
}

static void assert_nothing(void *sock, int ms)
{
    struct frames m;
    if (recv_frames(sock, &m, ms)) {
        frames_free(&m);
        fail_msg("unexpected message");
    }
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* ------------------------------------------------------------------------
 * Publisher set-up
 * ------------------------------------------------------------------------ */

static int inproc_counter;

/* A config on a fresh inproc endpoint of @p ctx. */
static void cfg_inproc(struct kvidx_pub_config *cfg, void *ctx, char *ep, size_t cap)
{
    kvidx_pub_config_init(cfg);
    snprintf(ep, cap, "inproc://pubtest-%d", inproc_counter++);
    cfg->endpoint = ep;
    cfg->zmq_ctx = ctx;
}

struct fixture {
    void *ctx;
    void *sub;
    struct kvidx_pub *pub;
    char ep[64];
};

/* Publisher on inproc in a shared context, SUB connected and synced. */
static void fx_open(struct fixture *fx, struct kvidx_pub_config *cfg)
{
    fx->pub = kvidx_pub_create(cfg);
    assert_non_null(fx->pub);
    fx->sub = sub_new(fx->ctx);
    assert_int_equal(zmq_connect(fx->sub, kvidx_pub_endpoint(fx->pub)), 0);
    sync_sub(fx->pub, fx->sub);
}

static void fx_init(struct fixture *fx, struct kvidx_pub_config *cfg)
{
    memset(fx, 0, sizeof(*fx));
    fx->ctx = zmq_ctx_new();
    assert_non_null(fx->ctx);
    cfg_inproc(cfg, fx->ctx, fx->ep, sizeof(fx->ep));
}

static void fx_close(struct fixture *fx)
{
    kvidx_pub_destroy(fx->pub);
    zmq_close(fx->sub);
    zmq_ctx_term(fx->ctx);
}

/* ------------------------------------------------------------------------
 * msgpack helpers
 * ------------------------------------------------------------------------ */

struct batch {
    msgpack_unpacked up;
    struct frames m;
    uint64_t seq;
    msgpack_object *events;  /* the events array */
    msgpack_object *root;
};

/* Decode a payload; the whole buffer must be one msgpack object. */
static void unpack_all(msgpack_unpacked *up, const uint8_t *p, size_t len)
{
    msgpack_unpacked_init(up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(up, (const char *)p, len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, len);
}

static msgpack_object *at(msgpack_object *o, uint32_t i)
{
    assert_int_equal(o->type, MSGPACK_OBJECT_ARRAY);
    assert_true(i < o->via.array.size);
    return &o->via.array.ptr[i];
}

static bool str_is(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           !memcmp(o->via.str.ptr, s, o->via.str.size);
}

static void assert_str(const msgpack_object *o, const char *s)
{
    if (!str_is(o, s))
        fail_msg("expected string \"%s\" (type %d)", s, o->type);
}

static msgpack_object *get(msgpack_object *map, const char *key)
{
    assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (str_is(&map->via.map.ptr[i].key, key))
            return &map->via.map.ptr[i].val;
    fail_msg("key %s missing", key);
    return NULL;
}

static bool has_key(msgpack_object *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (str_is(&map->via.map.ptr[i].key, key))
            return true;
    return false;
}

static void assert_keys(msgpack_object *map, const char *const *keys, uint32_t n)
{
    assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(map->via.map.size, n);
    for (uint32_t i = 0; i < n; i++)
        assert_str(&map->via.map.ptr[i].key, keys[i]);
}

static uint64_t get_u(const msgpack_object *o)
{
    assert_int_equal(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    return o->via.u64;
}

static void assert_nil(const msgpack_object *o)
{
    assert_int_equal(o->type, MSGPACK_OBJECT_NIL);
}

/* Receive a live batch: 3 frames, the topic, an 8-byte seq, a payload. */
static void recv_batch(void *sub, struct batch *b, const char *topic)
{
    assert_true(recv_frames(sub, &b->m, WAIT_MS));
    assert_int_equal(b->m.n, 3);
    assert_int_equal(b->m.len[0], strlen(topic));
    assert_memory_equal(b->m.buf[0], topic, strlen(topic));
    assert_int_equal(b->m.len[1], 8);
    b->seq = be64(b->m.buf[1]);
    unpack_all(&b->up, b->m.buf[2], b->m.len[2]);
    b->root = &b->up.data;
    assert_int_equal(b->root->type, MSGPACK_OBJECT_ARRAY);
    assert_true(b->root->via.array.size == 2 || b->root->via.array.size == 3);
    assert_int_equal(at(b->root, 0)->type, MSGPACK_OBJECT_FLOAT64);
    b->events = at(b->root, 1);
    assert_int_equal(b->events->type, MSGPACK_OBJECT_ARRAY);
}

static void batch_free(struct batch *b)
{
    msgpack_unpacked_destroy(&b->up);
    frames_free(&b->m);
}

static const uint64_t H1 = 0x44424a8f51260936u;
static const uint64_t H2 = 0xda7a5cbe4f4b0c4cu; /* >= 2^63 */
static const uint64_t H3 = 0x7dcd3f5d5b1f9a01u;

/* ------------------------------------------------------------------------
 * Tests: live stream
 * ------------------------------------------------------------------------ */

static void test_frames_seq_topic(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    cfg.topic = "kv@pod-7@llama";
    fx_open(&fx, &cfg);
    assert_int_equal(kvidx_pub_next_seq(fx.pub), 0);

    uint64_t seq = 0, id = 99;
    assert_int_equal(kvidx_pub_flush(fx.pub, &seq), 0); /* empty: nothing sent */
    assert_true(seq == KVIDX_PUB_NO_SEQ);

    uint32_t tok[16];
    for (int i = 0; i < 16; i++)
        tok[i] = (uint32_t)(100 + i);
    assert_int_equal(kvidx_pub_publish_stored(fx.pub, &H1, 1, NULL, tok, 16, 16, &id), 0);
    assert_int_equal(id, 0);
    assert_int_equal(kvidx_pub_pending(fx.pub), 1);
    assert_int_equal(kvidx_pub_flush(fx.pub, &seq), 0);
    assert_int_equal(seq, 0);
    assert_int_equal(kvidx_pub_pending(fx.pub), 0);
    assert_int_equal(kvidx_pub_publish_removed(fx.pub, &H1, 1, &id), 0);
    assert_int_equal(id, 1);
    assert_int_equal(kvidx_pub_flush(fx.pub, &seq), 0);
    assert_int_equal(seq, 1);
    assert_int_equal(kvidx_pub_publish_cleared(fx.pub, &id), 0);
    assert_int_equal(id, 2);
    assert_int_equal(kvidx_pub_flush(fx.pub, &seq), 0);
    assert_int_equal(seq, 2);
    assert_int_equal(kvidx_pub_next_seq(fx.pub), 3);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (uint64_t s = 0; s < 3; s++) {
        struct batch b;
        recv_batch(fx.sub, &b, "kv@pod-7@llama");
        assert_int_equal(b.seq, s);
        assert_int_equal(b.root->via.array.size, 3);
        double t = at(b.root, 0)->via.f64;
        assert_true(t > (double)ts.tv_sec - 60 && t < (double)ts.tv_sec + 60);
        assert_int_equal(b.events->via.array.size, 1);
        assert_int_equal(get_u(at(b.root, 2)), 0); /* dp rank */
        /* fixarray 3, float64 first (as msgspec writes the batch) */
        assert_int_equal(b.m.buf[2][0], 0x93);
        assert_int_equal(b.m.buf[2][1], 0xcb);
        batch_free(&b);
    }
    assert_nothing(fx.sub, 50);

    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(fx.pub, &st);
    assert_int_equal(st.batches, 3);
    assert_int_equal(st.batches_live, 3);
    assert_int_equal(st.events, 3);
    assert_int_equal(st.next_event_id, 3);
    assert_int_equal(st.next_seq, 3);
    fx_close(&fx);
}

static void test_map_form(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    cfg.lora_name = "my-lora";
    fx_open(&fx, &cfg);

    uint64_t hashes[2] = {H1, H2};
    /* every width boundary of msgpack's unsigned ints */
    uint32_t tok[8] = {0, 127, 128, 255, 256, 65535, 65536, UINT32_MAX};
    uint64_t parent = H3;
    assert_int_equal(kvidx_pub_publish_stored(fx.pub, hashes, 2, &parent, tok, 8, 4, NULL), 0);
    struct kvidx_pub_stored ph = {.block_hashes = &H1, .n_hashes = 1, .medium = "CPU",
                                  .lora_name = "", .group_idx = 1};
    assert_int_equal(kvidx_pub_publish_stored_ex(fx.pub, &ph, NULL), 0);
    struct kvidx_pub_stored nil_tok = {.block_hashes = &H2, .n_hashes = 1, .token_ids_nil = true,
                                       .n_tokens = 5, .block_size = 16};
    assert_int_equal(kvidx_pub_publish_stored_ex(fx.pub, &nil_tok, NULL), 0);
    assert_int_equal(kvidx_pub_publish_removed(fx.pub, hashes, 2, NULL), 0);
    struct kvidx_pub_removed rm = {.block_hashes = &H3, .n_hashes = 1, .medium = "STORAGE",
                                   .group_idx = 2};
    assert_int_equal(kvidx_pub_publish_removed_ex(fx.pub, &rm, NULL), 0);
    assert_int_equal(kvidx_pub_publish_cleared(fx.pub, NULL), 0);
    assert_int_equal(kvidx_pub_flush(fx.pub, NULL), 0);

    struct batch b;
    recv_batch(fx.sub, &b, "");
    assert_int_equal(b.events->via.array.size, 6);

    /* A full store: every vLLM key, in declaration order. */
    static const char *const stored_keys[] = {
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"};
    msgpack_object *e = at(b.events, 0);
    assert_keys(e, stored_keys, 11);
    assert_str(get(e, "type"), "BlockStored");
    msgpack_object *bh = get(e, "block_hashes");
    assert_int_equal(bh->via.array.size, 2);
    assert_true(get_u(at(bh, 0)) == H1);
    assert_true(get_u(at(bh, 1)) == H2);
    assert_true(get_u(get(e, "parent_block_hash")) == H3);
    msgpack_object *tk = get(e, "token_ids");
    assert_int_equal(tk->via.array.size, 8);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(get_u(at(tk, i)), tok[i]);
    /* smallest widths, as msgspec writes them */
    static const uint8_t tok_bytes[] = {0x98, 0x00, 0x7f, 0xcc, 0x80, 0xcc, 0xff, 0xcd, 0x01, 0x00,
                                        0xcd, 0xff, 0xff, 0xce, 0x00, 0x01, 0x00, 0x00,
                                        0xce, 0xff, 0xff, 0xff, 0xff};
    assert_non_null(memmem(b.m.buf[2], b.m.len[2], "\xa9" "token_ids", 10));
    assert_non_null(memmem(b.m.buf[2], b.m.len[2], tok_bytes, sizeof(tok_bytes)));
    assert_int_equal(get_u(get(e, "block_size")), 4);
    assert_nil(get(e, "lora_id"));
    assert_str(get(e, "medium"), "GPU");
    assert_str(get(e, "lora_name"), "my-lora");
    msgpack_object *xk = get(e, "extra_keys");
    assert_int_equal(xk->via.array.size, 2);
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(at(xk, i)->via.array.size, 1);
        assert_str(at(at(xk, i), 0), "my-lora");
    }
    assert_int_equal(get_u(get(e, "group_idx")), 0);
    assert_str(get(e, "kv_cache_spec_kind"), "full_attention");

    /* A placeholder (offload tier): no extra_keys, no spec kind. */
    static const char *const ph_keys[] = {"type", "block_hashes", "parent_block_hash",
                                          "token_ids", "block_size", "lora_id", "medium",
                                          "lora_name", "group_idx"};
    e = at(b.events, 1);
    assert_keys(e, ph_keys, 9);
    assert_nil(get(e, "parent_block_hash"));
    assert_int_equal(get(e, "token_ids")->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(get(e, "token_ids")->via.array.size, 0);
    assert_int_equal(get_u(get(e, "block_size")), 0);
    assert_str(get(e, "medium"), "CPU");
    assert_str(get(e, "lora_name"), "");
    assert_int_equal(get_u(get(e, "group_idx")), 1);

    /* token_ids nil (vLLM's Mooncake connector) */
    e = at(b.events, 2);
    assert_nil(get(e, "token_ids"));
    assert_int_equal(get_u(get(e, "block_size")), 16);
    assert_str(get(e, "lora_name"), "my-lora");
    assert_false(has_key(e, "extra_keys"));

    static const char *const rm_keys[] = {"type", "block_hashes", "medium", "group_idx"};
    e = at(b.events, 3);
    assert_keys(e, rm_keys, 4);
    assert_str(get(e, "type"), "BlockRemoved");
    assert_int_equal(get(e, "block_hashes")->via.array.size, 2);
    assert_str(get(e, "medium"), "GPU");
    assert_int_equal(get_u(get(e, "group_idx")), 0);
    e = at(b.events, 4);
    assert_true(get_u(at(get(e, "block_hashes"), 0)) == H3);
    assert_str(get(e, "medium"), "STORAGE");
    assert_int_equal(get_u(get(e, "group_idx")), 2);

    static const char *const clr_keys[] = {"type"};
    e = at(b.events, 5);
    assert_keys(e, clr_keys, 1);
    assert_str(get(e, "type"), "AllBlocksCleared");

    /* Raw bytes: fixarray 3, float64, fixarray 6, fixmap 11, "type". */
    const uint8_t *p = b.m.buf[2];
    assert_int_equal(p[10], 0x96);
    assert_int_equal(p[11], 0x8b);
    assert_memory_equal(p + 12, "\xa4" "type" "\xab" "BlockStored", 17);
    batch_free(&b);
    fx_close(&fx);
}

static void test_map_form_wide_headers_and_nil_medium(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    cfg.flags = KVIDX_PUB_F_WIDE_HEADERS;
    cfg.medium = NULL;
    fx_open(&fx, &cfg);
    uint32_t tok[2] = {1, 2};
    assert_int_equal(kvidx_pub_publish_stored(fx.pub, &H1, 1, NULL, tok, 2, 2, NULL), 0);
    assert_int_equal(kvidx_pub_publish_cleared(fx.pub, NULL), 0);
    assert_int_equal(kvidx_pub_flush(fx.pub, NULL), 0);
    struct batch b;
    recv_batch(fx.sub, &b, "");
    const uint8_t *p = b.m.buf[2];
    assert_int_equal(p[10], 0x92);                /* 2 events */
    assert_memory_equal(p + 11, "\xde\x00\x0b", 3); /* map16 holding 11 keys */
    msgpack_object *e = at(b.events, 0);
    assert_int_equal(e->via.map.size, 11);
    assert_nil(get(e, "medium"));
    assert_nil(get(e, "lora_name"));
    assert_nil(at(get(e, "extra_keys"), 0)); /* no adapter: nil per block */
    /* only BlockStored gets the wide header (msgspec: by possible fields) */
    const uint8_t *clr = memmem(p, b.m.len[2], "\xa4" "type" "\xb0" "AllBlocksCleared", 22);
    assert_non_null(clr);
    assert_int_equal(clr[-1], 0x81);
    assert_int_equal(at(b.events, 1)->via.map.size, 1);
    batch_free(&b);
    fx_close(&fx);
}

/* Every tagged-array length vLLM has sent, and the matching BlockRemoved. */
static void test_array_form_lengths(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    for (uint32_t len = 5; len <= 12; len++) {
        struct fixture fx;
        struct kvidx_pub_config cfg;
        memset(&fx, 0, sizeof(fx));
        fx.ctx = ctx;
        cfg_inproc(&cfg, ctx, fx.ep, sizeof(fx.ep));
        cfg.form = KVIDX_PUB_FORM_ARRAY;
        cfg.array_len = len;
        cfg.lora_name = "ad";
        fx_open(&fx, &cfg);
        uint64_t hashes[2] = {H1, H2};
        uint32_t tok[4] = {9, 8, 7, 6};
        uint64_t parent = H3;
        assert_int_equal(kvidx_pub_publish_stored(fx.pub, hashes, 2, &parent, tok, 4, 2, NULL), 0);
        struct kvidx_pub_stored ph = {.block_hashes = &H1, .n_hashes = 1, .medium = "CPU"};
        assert_int_equal(kvidx_pub_publish_stored_ex(fx.pub, &ph, NULL), 0);
        assert_int_equal(kvidx_pub_publish_removed(fx.pub, hashes, 2, NULL), 0);
        assert_int_equal(kvidx_pub_publish_cleared(fx.pub, NULL), 0);
        assert_int_equal(kvidx_pub_flush(fx.pub, NULL), 0);

        struct batch b;
        recv_batch(fx.sub, &b, "");
        assert_int_equal(b.events->via.array.size, 4);
        msgpack_object *e = at(b.events, 0);
        assert_int_equal(e->via.array.size, len);
        assert_str(at(e, 0), "BlockStored");
        assert_true(get_u(at(at(e, 1), 1)) == H2);
        assert_true(get_u(at(e, 2)) == H3);
        assert_int_equal(at(e, 3)->via.array.size, 4);
        assert_int_equal(get_u(at(at(e, 3), 3)), 6);
        assert_int_equal(get_u(at(e, 4)), 2);
        if (len > 5)
            assert_nil(at(e, 5));
        if (len > 6)
            assert_str(at(e, 6), "GPU");
        if (len > 7)
            assert_str(at(e, 7), "ad");
        if (len > 8) {
            assert_int_equal(at(e, 8)->via.array.size, 2);
            assert_str(at(at(at(e, 8), 1), 0), "ad");
        }
        if (len > 9)
            assert_int_equal(get_u(at(e, 9)), 0);
        if (len > 10)
            assert_str(at(e, 10), "full_attention");
        if (len > 11)
            assert_nil(at(e, 11));

        e = at(b.events, 1); /* placeholder: nil extra_keys and spec kind */
        assert_int_equal(e->via.array.size, len);
        assert_nil(at(e, 2));
        assert_int_equal(at(e, 3)->via.array.size, 0);
        if (len > 6)
            assert_str(at(e, 6), "CPU");
        if (len > 8)
            assert_nil(at(e, 8));
        if (len > 10)
            assert_nil(at(e, 10));

        e = at(b.events, 2);
        uint32_t rlen = len <= 6 ? 2 : len <= 9 ? 3 : 4;
        assert_int_equal(e->via.array.size, rlen);
        assert_str(at(e, 0), "BlockRemoved");
        assert_int_equal(at(e, 1)->via.array.size, 2);
        if (rlen > 2)
            assert_str(at(e, 2), "GPU");
        if (rlen > 3)
            assert_int_equal(get_u(at(e, 3)), 0);

        e = at(b.events, 3);
        assert_int_equal(e->via.array.size, 1);
        assert_str(at(e, 0), "AllBlocksCleared");
        batch_free(&b);
        kvidx_pub_destroy(fx.pub);
        zmq_close(fx.sub);
    }
    zmq_ctx_term(ctx);
}

/* The first hash's encoding in a stored event of @p enc; also the parent. */
static void check_hash_encoding(enum kvidx_pub_hash_enc enc)
{
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    cfg.hash_enc = enc;
    cfg.form = KVIDX_PUB_FORM_ARRAY;
    fx_open(&fx, &cfg);
    uint64_t hashes[3] = {H2, 5, 0};
    uint64_t parent = H2;
    assert_int_equal(kvidx_pub_publish_stored(fx.pub, hashes, 3, &parent, NULL, 0, 0, NULL), 0);
    assert_int_equal(kvidx_pub_flush(fx.pub, NULL), 0);
    struct batch b;
    recv_batch(fx.sub, &b, "");
    msgpack_object *e = at(b.events, 0);
    msgpack_object *hs = at(e, 1);
    msgpack_object *vals[4] = {at(hs, 0), at(hs, 1), at(hs, 2), at(e, 2)};
    uint64_t want[4] = {H2, 5, 0, H2};
    for (int i = 0; i < 4; i++) {
        msgpack_object *o = vals[i];
        switch (enc) {
        case KVIDX_PUB_HASH_U64:
            assert_true(get_u(o) == want[i]);
            break;
        case KVIDX_PUB_HASH_I64:
            if (want[i] >= (UINT64_C(1) << 63)) {
                assert_int_equal(o->type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
                assert_true(o->via.i64 == (int64_t)want[i]);
            } else {
                assert_true(get_u(o) == want[i]);
            }
            break;
        case KVIDX_PUB_HASH_BIN32:
        case KVIDX_PUB_HASH_BIN16: {
            uint32_t size = enc == KVIDX_PUB_HASH_BIN32 ? 32 : 16;
            assert_int_equal(o->type, MSGPACK_OBJECT_BIN);
            assert_int_equal(o->via.bin.size, size);
            const uint8_t *d = (const uint8_t *)o->via.bin.ptr;
            assert_true(be64(d + size - 8) == want[i]);
            bool nonzero = false;
            for (uint32_t j = 0; j < size - 8; j++)
                nonzero |= d[j] != 0;
            assert_true(nonzero);
            break;
        }
        }
    }
    /* The wire markers: uint64 0xcf, int64 0xd3, bin8 0xc4. After
     * [0x93 cb <8> 0x91 0x9c 0xab "BlockStored" 0x93] comes the first hash. */
    const uint8_t *p = b.m.buf[2] + 1 + 9 + 1 + 1 + 12 + 1;
    uint8_t marker = enc == KVIDX_PUB_HASH_U64 ? 0xcf : enc == KVIDX_PUB_HASH_I64 ? 0xd3 : 0xc4;
    assert_int_equal(p[0], marker);
    batch_free(&b);
    fx_close(&fx);
}

static void test_hash_encodings(void **state)
{
    (void)state;
    check_hash_encoding(KVIDX_PUB_HASH_U64);
    check_hash_encoding(KVIDX_PUB_HASH_I64);
    check_hash_encoding(KVIDX_PUB_HASH_BIN32);
    check_hash_encoding(KVIDX_PUB_HASH_BIN16);
}

static void test_dp_rank_forms(void **state)
{
    (void)state;
    int32_t ranks[4] = {3, 0, KVIDX_PUB_RANK_NIL, KVIDX_PUB_RANK_OMIT};
    for (int i = 0; i < 4; i++) {
        struct fixture fx;
        struct kvidx_pub_config cfg;
        fx_init(&fx, &cfg);
        cfg.dp_rank = ranks[i];
        fx_open(&fx, &cfg);
        assert_int_equal(kvidx_pub_publish_cleared(fx.pub, NULL), 0);
        assert_int_equal(kvidx_pub_flush(fx.pub, NULL), 0);
        struct batch b;
        recv_batch(fx.sub, &b, "");
        if (ranks[i] == KVIDX_PUB_RANK_OMIT) {
            assert_int_equal(b.root->via.array.size, 2);
        } else {
            assert_int_equal(b.root->via.array.size, 3);
            if (ranks[i] == KVIDX_PUB_RANK_NIL)
                assert_nil(at(b.root, 2));
            else
                assert_int_equal(get_u(at(b.root, 2)), (uint64_t)ranks[i]);
        }
        batch_free(&b);
        fx_close(&fx);
    }
}

static void test_auto_flush(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    cfg.auto_flush = 1;
    fx_open(&fx, &cfg);
    for (uint64_t i = 0; i < 3; i++)
        assert_int_equal(kvidx_pub_publish_removed(fx.pub, &H1, 1, NULL), 0);
    assert_int_equal(kvidx_pub_pending(fx.pub), 0);
    for (uint64_t i = 0; i < 3; i++) {
        struct batch b;
        recv_batch(fx.sub, &b, "");
        assert_int_equal(b.seq, i);
        assert_int_equal(b.events->via.array.size, 1);
        batch_free(&b);
    }
    fx_close(&fx);

    fx_init(&fx, &cfg);
    cfg.auto_flush = 3;
    fx_open(&fx, &cfg);
    uint64_t id;
    for (uint64_t i = 0; i < 7; i++) {
        assert_int_equal(kvidx_pub_publish_removed(fx.pub, &H1, 1, &id), 0);
        assert_int_equal(id, i);
    }
    assert_int_equal(kvidx_pub_pending(fx.pub), 1);
    uint64_t seq;
    assert_int_equal(kvidx_pub_flush(fx.pub, &seq), 0);
    assert_int_equal(seq, 2);
    assert_int_equal(kvidx_pub_flush_empty(fx.pub, &seq), 0);
    assert_int_equal(seq, 3);
    uint32_t want[4] = {3, 3, 1, 0};
    for (uint64_t i = 0; i < 4; i++) {
        struct batch b;
        recv_batch(fx.sub, &b, "");
        assert_int_equal(b.seq, i);
        assert_int_equal(b.events->via.array.size, want[i]);
        batch_free(&b);
    }
    assert_nothing(fx.sub, 50);
    fx_close(&fx);
}

static void test_payload_and_raw(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    cfg.topic = "t";
    fx_open(&fx, &cfg);
    /* A pending event is flushed first, then the caller's payload. */
    assert_int_equal(kvidx_pub_publish_cleared(fx.pub, NULL), 0);
    static const uint8_t custom[] = {0x92, 0x00, 0x90}; /* [0, []] */
    uint64_t seq;
    assert_int_equal(kvidx_pub_publish_payload(fx.pub, custom, sizeof(custom), &seq), 0);
    assert_int_equal(seq, 1);
    /* Garbage: two frames, then a 7-byte seq; no sequence number used. */
    const void *f2[2] = {"t", "xx"};
    size_t s2[2] = {1, 2};
    assert_int_equal(kvidx_pub_send_raw(fx.pub, f2, s2, 2), 0);
    const void *f3[3] = {"t", "1234567", NULL};
    size_t s3[3] = {1, 7, 0};
    assert_int_equal(kvidx_pub_send_raw(fx.pub, f3, s3, 3), 0);
    assert_int_equal(kvidx_pub_send_raw(fx.pub, f3, s3, 0), -EINVAL);
    assert_int_equal(kvidx_pub_publish_cleared(fx.pub, NULL), 0);
    assert_int_equal(kvidx_pub_flush(fx.pub, &seq), 0);
    assert_int_equal(seq, 2);

    struct batch b;
    recv_batch(fx.sub, &b, "t");
    assert_int_equal(b.seq, 0);
    batch_free(&b);
    struct frames m;
    assert_true(recv_frames(fx.sub, &m, WAIT_MS));
    assert_int_equal(m.n, 3);
    assert_int_equal(be64(m.buf[1]), 1);
    assert_int_equal(m.len[2], sizeof(custom));
    assert_memory_equal(m.buf[2], custom, sizeof(custom));
    frames_free(&m);
    assert_true(recv_frames(fx.sub, &m, WAIT_MS));
    assert_int_equal(m.n, 2);
    assert_memory_equal(m.buf[1], "xx", 2);
    frames_free(&m);
    assert_true(recv_frames(fx.sub, &m, WAIT_MS));
    assert_int_equal(m.n, 3);
    assert_int_equal(m.len[1], 7);
    assert_int_equal(m.len[2], 0);
    frames_free(&m);
    recv_batch(fx.sub, &b, "t");
    assert_int_equal(b.seq, 2);
    batch_free(&b);
    fx_close(&fx);
}

/* ------------------------------------------------------------------------
 * Tests: replay
 * ------------------------------------------------------------------------ */

struct reply {
    uint64_t seq[64];
    uint8_t *payload[64];
    size_t len[64];
    int n;
};

static void reply_free(struct reply *r)
{
    for (int i = 0; i < r->n; i++)
        free(r->payload[i]);
    r->n = 0;
}

static void *dealer_new(void *ctx, struct kvidx_pub *pub)
{
    void *d = socket_new(ctx, ZMQ_DEALER);
    connect_to(d, kvidx_pub_replay_endpoint(pub));
    return d;
}

static void request(void *dealer, uint64_t start)
{
    uint8_t s8[8];
    put_be64(s8, start);
    assert_int_equal(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(dealer, s8, 8, 0), 8);
}

/* Read replies up to the sentinel, checking the layout of each. */
static void read_reply(void *dealer, enum kvidx_pub_replay_layout layout, const char *topic,
                       struct reply *r)
{
    r->n = 0;
    int nf = layout == KVIDX_PUB_REPLAY_TOPIC ? 4 : 3;
    for (;;) {
        struct frames m;
        assert_true(recv_frames(dealer, &m, WAIT_MS));
        assert_int_equal(m.n, nf);
        assert_int_equal(m.len[0], 0); /* the empty delimiter */
        const uint8_t *seq8 = m.buf[nf - 2];
        assert_int_equal(m.len[nf - 2], 8);
        uint64_t seq = be64(seq8);
        if (seq == UINT64_MAX) {
            assert_int_equal(m.len[nf - 1], 0);
            if (nf == 4)
                assert_int_equal(m.len[1], 0); /* empty topic frame */
            frames_free(&m);
            return;
        }
        if (nf == 4) {
            assert_int_equal(m.len[1], strlen(topic));
            assert_memory_equal(m.buf[1], topic, strlen(topic));
        }
        assert_true(r->n < 64);
        r->seq[r->n] = seq;
        r->len[r->n] = m.len[nf - 1];
        r->payload[r->n] = m.buf[nf - 1];
        m.buf[nf - 1] = NULL;
        r->n++;
        frames_free(&m);
    }
}

/*
 * Request a replay from @p start on @p dealer and read it (read_reply):
 * exactly @p n batches and, when @p seqs is not NULL, batch i has seq seqs[i].
 */
static void expect_replay(void *dealer, enum kvidx_pub_replay_layout layout, const char *topic, uint64_t start, int n,
                          const uint64_t *seqs)
{
    request(dealer, start);
    struct reply r;
    read_reply(dealer, layout, topic, &r);
    assert_int_equal(r.n, n);
    for (int i = 0; seqs != NULL && i < n; i++)
        assert_int_equal(r.seq[i], seqs[i]);
    reply_free(&r);
}

struct rfix {
    void *ctx;
    void *sub;
    void *dealer;
    struct kvidx_pub *pub;
};

/* TCP publisher with replay on ephemeral ports; SUB synced; DEALER connected. */
static void rfix_open(struct rfix *f, struct kvidx_pub_config *cfg)
{
    f->ctx = zmq_ctx_new();
    f->pub = kvidx_pub_create(cfg);
    assert_non_null(f->pub);
    f->sub = sub_new(f->ctx);
    connect_to(f->sub, kvidx_pub_endpoint(f->pub));
    sync_sub(f->pub, f->sub);
    f->dealer = dealer_new(f->ctx, f->pub);
}

static void rfix_close(struct rfix *f)
{
    kvidx_pub_destroy(f->pub);
    zmq_close(f->sub);
    zmq_close(f->dealer);
    zmq_ctx_term(f->ctx);
}

static void tcp_cfg(struct kvidx_pub_config *cfg)
{
    kvidx_pub_config_init(cfg);
    cfg->endpoint = "tcp://127.0.0.1:*";
    cfg->replay_endpoint = "tcp://127.0.0.1:*";
}

/* Publish n one-event batches, each storing hash base+i. */
static void publish_n(struct kvidx_pub *pub, uint64_t base, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t h = base + (uint64_t)i;
        assert_int_equal(kvidx_pub_publish_removed(pub, &h, 1, NULL), 0);
        assert_int_equal(kvidx_pub_flush(pub, NULL), 0);
    }
}

/* Wait until the replay thread has handled @p n more requests of a kind. */
static void wait_stat(struct kvidx_pub *pub, size_t off, uint64_t want)
{
    int64_t end = now_ms() + WAIT_MS;
    for (;;) {
        struct kvidx_pub_stats st;
        kvidx_pub_get_stats(pub, &st);
        uint64_t v;
        memcpy(&v, (const char *)&st + off, sizeof(v));
        if (v >= want)
            return;
        assert_true(now_ms() < end);
        struct timespec t = {.tv_nsec = 1000000};
        nanosleep(&t, NULL);
    }
}

static void check_replay_layout(enum kvidx_pub_replay_layout layout)
{
    struct rfix f;
    struct kvidx_pub_config cfg;
    tcp_cfg(&cfg);
    cfg.replay_layout = layout;
    cfg.topic = "kv@a@b";
    rfix_open(&f, &cfg);
    publish_n(f.pub, 1000, 5);
    struct batch live[5];
    for (int i = 0; i < 5; i++) {
        recv_batch(f.sub, &live[i], "kv@a@b");
        assert_int_equal(live[i].seq, i);
    }
    request(f.dealer, 2);
    struct reply r;
    read_reply(f.dealer, layout, "kv@a@b", &r);
    assert_int_equal(r.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r.seq[i], 2 + i);
        /* replayed payloads are byte-identical to the live ones */
        assert_int_equal(r.len[i], live[2 + i].m.len[2]);
        assert_memory_equal(r.payload[i], live[2 + i].m.buf[2], r.len[i]);
    }
    reply_free(&r);
    /* From 0: everything; past the newest: only the sentinel. */
    expect_replay(f.dealer, layout, "kv@a@b", 0, 5, NULL);
    expect_replay(f.dealer, layout, "kv@a@b", 5, 0, NULL);
    expect_replay(f.dealer, layout, "kv@a@b", UINT64_MAX - 1, 0, NULL);
    for (int i = 0; i < 5; i++)
        batch_free(&live[i]);
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(f.pub, &st);
    assert_int_equal(st.replay_requests, 4);
    assert_int_equal(st.replay_batches, 8);
    assert_int_equal(st.replay_buffered, 5);
    rfix_close(&f);
}

static void test_replay_topic_layout(void **state)
{
    (void)state;
    check_replay_layout(KVIDX_PUB_REPLAY_TOPIC);
}

static void test_replay_legacy_layout(void **state)
{
    (void)state;
    check_replay_layout(KVIDX_PUB_REPLAY_LEGACY);
}

static void test_replay_ring_wrap(void **state)
{
    (void)state;
    struct rfix f;
    struct kvidx_pub_config cfg;
    tcp_cfg(&cfg);
    cfg.buffer_batches = 4;
    rfix_open(&f, &cfg);
    expect_replay(f.dealer, KVIDX_PUB_REPLAY_TOPIC, "", 0, 0, NULL); /* empty ring: only the sentinel */
    publish_n(f.pub, 0, 10);
    /* older than the buffer: silently starts at the oldest kept (6) */
    struct reply r;
    request(f.dealer, 0);
    read_reply(f.dealer, KVIDX_PUB_REPLAY_TOPIC, "", &r);
    assert_int_equal(r.n, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r.seq[i], 6 + i);
        msgpack_unpacked up;
        unpack_all(&up, r.payload[i], r.len[i]);
        msgpack_object *e = at(at(&up.data, 1), 0);
        assert_int_equal(get_u(at(get(e, "block_hashes"), 0)), 6 + i);
        msgpack_unpacked_destroy(&up);
    }
    reply_free(&r);
    expect_replay(f.dealer, KVIDX_PUB_REPLAY_TOPIC, "", 8, 2, (const uint64_t[]){8, 9});
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(f.pub, &st);
    assert_int_equal(st.replay_buffered, 4);
    rfix_close(&f);
}

static void test_replay_malformed(void **state)
{
    (void)state;
    struct rfix f;
    struct kvidx_pub_config cfg;
    tcp_cfg(&cfg);
    rfix_open(&f, &cfg);
    publish_n(f.pub, 0, 2);
    uint8_t s8[9] = {0};
    /* no empty delimiter (vLLM drops these too) */
    assert_int_equal(zmq_send(f.dealer, s8, 8, 0), 8);
    /* a 9-byte start */
    assert_int_equal(zmq_send(f.dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(f.dealer, s8, 9, 0), 9);
    /* a non-empty delimiter */
    assert_int_equal(zmq_send(f.dealer, "x", 1, ZMQ_SNDMORE), 1);
    assert_int_equal(zmq_send(f.dealer, s8, 8, 0), 8);
    /* four frames */
    assert_int_equal(zmq_send(f.dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(f.dealer, s8, 8, ZMQ_SNDMORE), 8);
    assert_int_equal(zmq_send(f.dealer, s8, 8, 0), 8);
    wait_stat(f.pub, offsetof(struct kvidx_pub_stats, replay_malformed), 4);
    assert_nothing(f.dealer, 50);
    /* the server still answers good requests */
    expect_replay(f.dealer, KVIDX_PUB_REPLAY_TOPIC, "", 1, 1, (const uint64_t[]){1});
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(f.pub, &st);
    assert_int_equal(st.replay_malformed, 4);
    assert_int_equal(st.replay_requests, 1);
    rfix_close(&f);
}

static void test_skip_live(void **state)
{
    (void)state;
    struct rfix f;
    struct kvidx_pub_config cfg;
    tcp_cfg(&cfg);
    rfix_open(&f, &cfg);
    publish_n(f.pub, 0, 1);
    kvidx_pub_skip_live(f.pub, 2);
    publish_n(f.pub, 1, 3);
    struct batch b;
    recv_batch(f.sub, &b, "");
    assert_int_equal(b.seq, 0);
    batch_free(&b);
    recv_batch(f.sub, &b, ""); /* 1 and 2 were lost on the live path */
    assert_int_equal(b.seq, 3);
    batch_free(&b);
    assert_nothing(f.sub, 50);
    expect_replay(f.dealer, KVIDX_PUB_REPLAY_TOPIC, "", 1, 3, (const uint64_t[]){1, 2, 3});
    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(f.pub, &st);
    assert_int_equal(st.batches, 4);
    assert_int_equal(st.batches_live, 2);
    assert_int_equal(st.batches_skipped, 2);
    rfix_close(&f);
}

static void test_replay_faults(void **state)
{
    (void)state;
    struct rfix f;
    struct kvidx_pub_config cfg;
    tcp_cfg(&cfg);
    cfg.replay_layout = KVIDX_PUB_REPLAY_LEGACY;
    rfix_open(&f, &cfg);
    publish_n(f.pub, 0, 6);
    struct reply r;

    /* drop every 2nd reply batch: 0, 2, 4 arrive, then the sentinel */
    struct kvidx_pub_replay_faults fl = {.drop_every = 2};
    assert_int_equal(kvidx_pub_set_replay_faults(f.pub, &fl), 0);
    expect_replay(f.dealer, KVIDX_PUB_REPLAY_LEGACY, "", 0, 3, (const uint64_t[]){0, 2, 4});

    /* delay */
    fl = (struct kvidx_pub_replay_faults){.delay_ms = 300};
    assert_int_equal(kvidx_pub_set_replay_faults(f.pub, &fl), 0);
    int64_t t0 = now_ms();
    request(f.dealer, 4);
    read_reply(f.dealer, KVIDX_PUB_REPLAY_LEGACY, "", &r);
    assert_true(now_ms() - t0 >= 295);
    assert_int_equal(r.n, 2);
    reply_free(&r);

    /* silent: counted, never answered */
    fl = (struct kvidx_pub_replay_faults){.silent = true};
    assert_int_equal(kvidx_pub_set_replay_faults(f.pub, &fl), 0);
    request(f.dealer, 0);
    wait_stat(f.pub, offsetof(struct kvidx_pub_stats, replay_silenced), 1);
    assert_nothing(f.dealer, QUIET_MS);

    /* faults off again */
    fl = (struct kvidx_pub_replay_faults){0};
    assert_int_equal(kvidx_pub_set_replay_faults(f.pub, &fl), 0);
    expect_replay(f.dealer, KVIDX_PUB_REPLAY_LEGACY, "", 3, 3, NULL);

    struct kvidx_pub_stats st;
    kvidx_pub_get_stats(f.pub, &st);
    assert_int_equal(st.replay_dropped, 3);
    assert_int_equal(st.replay_silenced, 1);
    assert_int_equal(st.replay_requests, 3);
    rfix_close(&f);

    /* a publisher without replay has no faults to set */
    struct kvidx_pub_config c2;
    kvidx_pub_config_init(&c2);
    c2.endpoint = "tcp://127.0.0.1:*";
    struct kvidx_pub *p = kvidx_pub_create(&c2);
    assert_non_null(p);
    assert_int_equal(kvidx_pub_set_replay_faults(p, &fl), -EINVAL);
    assert_null(kvidx_pub_replay_endpoint(p));
    kvidx_pub_destroy(p);
}

/* A delayed reply must not hold up destroy. */
static void test_destroy_during_delay(void **state)
{
    (void)state;
    struct rfix f;
    struct kvidx_pub_config cfg;
    tcp_cfg(&cfg);
    rfix_open(&f, &cfg);
    struct kvidx_pub_replay_faults fl = {.delay_ms = 60000};
    assert_int_equal(kvidx_pub_set_replay_faults(f.pub, &fl), 0);
    request(f.dealer, 0);
    assert_nothing(f.dealer, 50); /* the replay thread is (most likely) waiting now */
    int64_t t0 = now_ms();
    kvidx_pub_destroy(f.pub);
    /* it did not wait for the reply: far less than the delay (a bound in
     * seconds would measure the machine's load, not the publisher) */
    assert_true(now_ms() - t0 < (int64_t)fl.delay_ms / 2);
    f.pub = NULL;
    rfix_close(&f);
}

/* ------------------------------------------------------------------------
 * Tests: restart, bind/connect, endpoints, errors, lifetime
 * ------------------------------------------------------------------------ */

static void test_restart_tcp(void **state)
{
    (void)state;
    struct rfix f;
    struct kvidx_pub_config cfg;
    kvidx_pub_config_init(&cfg);
    cfg.endpoint = "tcp://*:*";
    cfg.replay_endpoint = "tcp://*:*";
    rfix_open(&f, &cfg);
    char ep[128], rep[128];
    /* "tcp://0.0.0.0:P" becomes "tcp://" "*:P" for the next incarnation */
    snprintf(ep, sizeof(ep), "tcp://*%s", strrchr(kvidx_pub_endpoint(f.pub), ':'));
    snprintf(rep, sizeof(rep), "tcp://*%s", strrchr(kvidx_pub_replay_endpoint(f.pub), ':'));
    publish_n(f.pub, 0, 3);
    for (int i = 0; i < 3; i++) {
        struct batch b;
        recv_batch(f.sub, &b, "");
        batch_free(&b);
    }
    for (int round = 0; round < 3; round++) {
        kvidx_pub_destroy(f.pub);
        cfg.endpoint = ep;
        cfg.replay_endpoint = rep;
        cfg.rebind_ms = 0; /* linger 0: the ports are free at once */
        f.pub = kvidx_pub_create(&cfg);
        assert_non_null(f.pub);
        assert_int_equal(kvidx_pub_next_seq(f.pub), 0);
        sync_sub(f.pub, f.sub); /* the SUB reconnects by itself */
        publish_n(f.pub, 100, 2);
        struct batch b;
        recv_batch(f.sub, &b, "");
        assert_int_equal(b.seq, 0); /* back to 0 */
        batch_free(&b);
        recv_batch(f.sub, &b, "");
        assert_int_equal(b.seq, 1);
        batch_free(&b);
        /* the DEALER reconnects too; the new ring has only the new batches */
        expect_replay(f.dealer, KVIDX_PUB_REPLAY_TOPIC, "", 0, 2, NULL);
    }
    rfix_close(&f);
}

static void test_restart_inproc_shared_ctx(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    char rep[96];
    snprintf(rep, sizeof(rep), "%s-replay", fx.ep);
    cfg.replay_endpoint = rep;
    fx_open(&fx, &cfg);
    publish_n(fx.pub, 0, 2);
    for (int round = 0; round < 3; round++) {
        kvidx_pub_destroy(fx.pub);
        fx.pub = kvidx_pub_create(&cfg); /* same inproc names, same context */
        assert_non_null(fx.pub);
        zmq_close(fx.sub);
        fx.sub = sub_new(fx.ctx);
        assert_int_equal(zmq_connect(fx.sub, fx.ep), 0);
        sync_sub(fx.pub, fx.sub);
        publish_n(fx.pub, 0, 1);
        struct batch b;
        recv_batch(fx.sub, &b, "");
        assert_int_equal(b.seq, 0);
        batch_free(&b);
    }
    void *d = socket_new(fx.ctx, ZMQ_DEALER);
    assert_int_equal(zmq_connect(d, rep), 0);
    expect_replay(d, KVIDX_PUB_REPLAY_TOPIC, "", 0, 1, NULL);
    zmq_close(d);
    fx_close(&fx);
}

/* An endpoint without a wildcard connects: the consumer's SUB binds. */
static void test_connect_mode(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    void *sub = sub_new(ctx);
    assert_int_equal(zmq_bind(sub, "tcp://127.0.0.1:*"), 0);
    char bound[128];
    size_t len = sizeof(bound);
    assert_int_equal(zmq_getsockopt(sub, ZMQ_LAST_ENDPOINT, bound, &len), 0);

    struct kvidx_pub_config cfg;
    kvidx_pub_config_init(&cfg);
    cfg.endpoint = bound; /* tcp://127.0.0.1:P: no '*', no '::' -> connect */
    cfg.topic = "kv@engine-1@m";
    struct kvidx_pub *pubs[2];
    for (int i = 0; i < 2; i++) {
        pubs[i] = kvidx_pub_create(&cfg);
        assert_non_null(pubs[i]);
        assert_string_equal(kvidx_pub_endpoint(pubs[i]), bound);
        sync_sub(pubs[i], sub);
    }
    /* two engines into one bound SUB */
    publish_n(pubs[0], 0, 1);
    publish_n(pubs[1], 0, 1);
    for (int i = 0; i < 2; i++) {
        struct batch b;
        recv_batch(sub, &b, "kv@engine-1@m");
        assert_int_equal(b.seq, 0);
        batch_free(&b);
    }
    for (int i = 0; i < 2; i++)
        kvidx_pub_destroy(pubs[i]);

    /* Forcing the mode: bind where AUTO would connect, and the reverse. */
    cfg.endpoint = "tcp://127.0.0.1:0";
    cfg.socket_mode = KVIDX_PUB_SOCKET_BIND;
    struct kvidx_pub *p = kvidx_pub_create(&cfg);
    assert_non_null(p);
    assert_string_not_equal(kvidx_pub_endpoint(p), "tcp://127.0.0.1:0"); /* resolved port */
    kvidx_pub_destroy(p);
    cfg.endpoint = "tcp://127.0.0.1:*";
    cfg.socket_mode = KVIDX_PUB_SOCKET_CONNECT;
    assert_null(kvidx_pub_create(&cfg)); /* cannot connect to a wildcard port */
    zmq_close(sub);
    zmq_ctx_term(ctx);
}

static void test_offset_endpoint(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(kvidx_pub_offset_endpoint("tcp://*:5557", 2, out, sizeof(out)), 0);
    assert_string_equal(out, "tcp://*:5559");
    assert_int_equal(kvidx_pub_offset_endpoint("tcp://10.0.0.7:5557", 0, out, sizeof(out)), 0);
    assert_string_equal(out, "tcp://10.0.0.7:5557");
    assert_int_equal(kvidx_pub_offset_endpoint("tcp://[::1]:6000", 3, out, sizeof(out)), 0);
    assert_string_equal(out, "tcp://[::1]:6003");
    assert_int_equal(kvidx_pub_offset_endpoint("inproc://cache", 1, out, sizeof(out)), 0);
    assert_string_equal(out, "inproc://cache_dp1");
    assert_int_equal(kvidx_pub_offset_endpoint("ipc:///tmp/x", 1, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvidx_pub_offset_endpoint("ipc:///tmp/x", 0, out, sizeof(out)), 0);
    assert_int_equal(kvidx_pub_offset_endpoint("tcp://*:65535", 1, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvidx_pub_offset_endpoint("tcp://*:*", 1, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvidx_pub_offset_endpoint("tcp://*:5557", -1, out, sizeof(out)), -EINVAL);
    assert_int_equal(kvidx_pub_offset_endpoint("tcp://*:5557", 1, out, 8), -ENOSPC);

    /* Applied by create, and the rank goes into the batches. */
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    char rep[80];
    snprintf(rep, sizeof(rep), "%s-r", fx.ep);
    cfg.replay_endpoint = rep;
    cfg.dp_rank = 2;
    cfg.flags = KVIDX_PUB_F_OFFSET_BY_RANK;
    fx.pub = kvidx_pub_create(&cfg);
    assert_non_null(fx.pub);
    char want[96];
    snprintf(want, sizeof(want), "%s_dp2", fx.ep);
    assert_string_equal(kvidx_pub_endpoint(fx.pub), want);
    snprintf(want, sizeof(want), "%s-r_dp2", fx.ep);
    assert_string_equal(kvidx_pub_replay_endpoint(fx.pub), want);
    fx.sub = sub_new(fx.ctx);
    assert_int_equal(zmq_connect(fx.sub, kvidx_pub_endpoint(fx.pub)), 0);
    sync_sub(fx.pub, fx.sub);
    publish_n(fx.pub, 0, 1);
    struct batch b;
    recv_batch(fx.sub, &b, "");
    assert_int_equal(get_u(at(b.root, 2)), 2);
    batch_free(&b);
    fx_close(&fx);
}

static void test_config_errors(void **state)
{
    (void)state;
    struct kvidx_pub_config cfg;
    kvidx_pub_config_init(&cfg);
    errno = 0;
    assert_null(kvidx_pub_create(&cfg)); /* no endpoint */
    assert_int_equal(errno, EINVAL);
    assert_null(kvidx_pub_create(NULL));
    cfg.endpoint = "tcp://127.0.0.1:*";
    cfg.array_len = 4;
    assert_null(kvidx_pub_create(&cfg));
    assert_int_equal(errno, EINVAL);
    cfg.array_len = 13;
    assert_null(kvidx_pub_create(&cfg));
    cfg.array_len = 0; /* 0 = default */
    cfg.form = (enum kvidx_pub_form)7;
    assert_null(kvidx_pub_create(&cfg));
    assert_int_equal(errno, EINVAL);
    cfg.form = KVIDX_PUB_FORM_MAP;
    cfg.hash_enc = (enum kvidx_pub_hash_enc)9;
    assert_null(kvidx_pub_create(&cfg));
    cfg.hash_enc = KVIDX_PUB_HASH_U64;
    cfg.replay_endpoint = "";
    assert_null(kvidx_pub_create(&cfg));
    cfg.replay_endpoint = NULL;
    cfg.endpoint = "bogus://x";
    assert_null(kvidx_pub_create(&cfg));
    assert_int_not_equal(errno, 0);

    /* A port held by a live publisher: EADDRINUSE once the retry expires. */
    cfg.endpoint = "tcp://*:*";
    struct kvidx_pub *a = kvidx_pub_create(&cfg);
    assert_non_null(a);
    char ep[128];
    snprintf(ep, sizeof(ep), "tcp://*%s", strrchr(kvidx_pub_endpoint(a), ':'));
    cfg.endpoint = ep;
    cfg.rebind_ms = 20;
    errno = 0;
    assert_null(kvidx_pub_create(&cfg));
    assert_int_equal(errno, EADDRINUSE);

    /* Bad arguments to the publish calls. */
    uint32_t tok = 1;
    assert_int_equal(kvidx_pub_publish_stored(a, NULL, 1, NULL, NULL, 0, 16, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_stored(a, &H1, 0, NULL, NULL, 0, 16, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_stored(a, &H1, 1, NULL, NULL, 1, 16, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_removed(a, &H1, 0, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_publish_payload(a, NULL, 3, NULL), -EINVAL);
    assert_int_equal(kvidx_pub_pending(a), 0);
    uint64_t id;
    assert_int_equal(kvidx_pub_publish_stored(a, &H1, 1, NULL, &tok, 1, 1, &id), 0);
    assert_int_equal(id, 0); /* failed calls used no id */
    assert_int_equal(kvidx_pub_last_error(a), 0);
    kvidx_pub_destroy(a); /* discards the pending event */
    kvidx_pub_destroy(NULL);
}

/* Many batches through a small ring: recycling keeps contents intact. */
static void test_many_batches(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    char rep[80];
    snprintf(rep, sizeof(rep), "%s-r", fx.ep);
    cfg.replay_endpoint = rep;
    cfg.buffer_batches = 64;
    cfg.hwm = 0;
    fx_open(&fx, &cfg);
    enum { N = 3000 };
    uint64_t hashes[16];
    uint32_t tok[256];
    for (int i = 0; i < 256; i++)
        tok[i] = (uint32_t)i * 977u;
    for (uint64_t s = 0; s < N; s++) {
        for (int e = 0; e < 4; e++) {
            for (int k = 0; k < 16; k++)
                hashes[k] = s * 1000 + (uint64_t)(e * 16 + k);
            assert_int_equal(kvidx_pub_publish_stored(fx.pub, hashes, 16, NULL, tok, 256, 16, NULL), 0);
        }
        assert_int_equal(kvidx_pub_flush(fx.pub, NULL), 0);
        if (s % 100 == 99 || s == N - 1) { /* keep the consumer close behind */
            for (uint64_t t = s - (s % 100); t <= s; t++) {
                struct batch b;
                recv_batch(fx.sub, &b, "");
                assert_int_equal(b.seq, t);
                assert_int_equal(b.events->via.array.size, 4);
                msgpack_object *e3 = at(b.events, 3);
                assert_int_equal(get_u(at(get(e3, "block_hashes"), 15)), t * 1000 + 63);
                assert_int_equal(get_u(at(get(e3, "token_ids"), 255)), 255u * 977u);
                batch_free(&b);
            }
        }
    }
    void *d = socket_new(fx.ctx, ZMQ_DEALER);
    assert_int_equal(zmq_connect(d, rep), 0);
    request(d, 0);
    struct reply r;
    read_reply(d, KVIDX_PUB_REPLAY_TOPIC, "", &r);
    assert_int_equal(r.n, 64);
    assert_int_equal(r.seq[0], N - 64);
    msgpack_unpacked up;
    unpack_all(&up, r.payload[63], r.len[63]);
    assert_int_equal(get_u(at(get(at(at(&up.data, 1), 0), "block_hashes"), 0)), (N - 1) * 1000ull);
    msgpack_unpacked_destroy(&up);
    reply_free(&r);
    zmq_close(d);
    fx_close(&fx);
}

/* In a shared context, queued messages outlive their publisher. */
static void test_messages_outlive_publisher(void **state)
{
    (void)state;
    struct fixture fx;
    struct kvidx_pub_config cfg;
    fx_init(&fx, &cfg);
    cfg.hwm = 0;
    fx_open(&fx, &cfg);
    publish_n(fx.pub, 500, 50);
    kvidx_pub_destroy(fx.pub);
    fx.pub = NULL;
    for (uint64_t i = 0; i < 50; i++) {
        struct batch b;
        recv_batch(fx.sub, &b, "");
        assert_int_equal(b.seq, i);
        assert_int_equal(get_u(at(get(at(b.events, 0), "block_hashes"), 0)), 500 + i);
        batch_free(&b);
    }
    fx_close(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frames_seq_topic),
        cmocka_unit_test(test_map_form),
        cmocka_unit_test(test_map_form_wide_headers_and_nil_medium),
        cmocka_unit_test(test_array_form_lengths),
        cmocka_unit_test(test_hash_encodings),
        cmocka_unit_test(test_dp_rank_forms),
        cmocka_unit_test(test_auto_flush),
        cmocka_unit_test(test_payload_and_raw),
        cmocka_unit_test(test_replay_topic_layout),
        cmocka_unit_test(test_replay_legacy_layout),
        cmocka_unit_test(test_replay_ring_wrap),
        cmocka_unit_test(test_replay_malformed),
        cmocka_unit_test(test_skip_live),
        cmocka_unit_test(test_replay_faults),
        cmocka_unit_test(test_destroy_during_delay),
        cmocka_unit_test(test_restart_tcp),
        cmocka_unit_test(test_restart_inproc_shared_ctx),
        cmocka_unit_test(test_connect_mode),
        cmocka_unit_test(test_offset_endpoint),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_many_batches),
        cmocka_unit_test(test_messages_outlive_publisher),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
