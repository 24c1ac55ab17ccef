/*
 * Shared fixture of the listener integration tests (tests/net/listener_*_test.c):
 * a real writer pool, index and listener pool, real publishers
 * (net/include/kvidx/publisher.h) over loopback TCP or ipc, and queries with
 * kvi_index_find_matches.
 *
 * Corpus: chain c, block i has BS tokens 100000*c + BS*i + (0..BS), engine
 * hash chain_hash(c, i) and parent chain_hash(c, i - 1). Its content hash
 * is computed here with engine/hash.h, independently of the ingest code.
 *
 * Waiting: every wait polls a condition every millisecond up to WAIT_MS and
 * fails the test when it does not hold by then; nothing sleeps for a fixed
 * time and then assumes something happened. PUB/SUB slow joiner: before a
 * test publishes batches it must not lose, lfx_sync sends probe messages
 * (1 frame, no sequence number consumed) until the listener has counted one
 * as malformed; tests compare malformed counts against that baseline.
 *
 * Header-only (static functions): each test program includes it once.
 */
#ifndef KVI_TESTS_NET_LISTENER_FIXTURE_H
#define KVI_TESTS_NET_LISTENER_FIXTURE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kvidx/publisher.h>

#include "engine/hash.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "engine/writer.h"
#include "net/listener.h"

#if defined(__SANITIZE_THREAD__)
/*
 * libzmq is not built with TSan: its I/O threads hand messages over with
 * atomics TSan cannot see, so TSan reports libzmq's memcpy of message bodies
 * and its use of descriptors as races. Ignore the interceptors libzmq calls;
 * kvidx's own hand-overs (commands, rings, counters, RCU) stay checked.
 */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so\n";
}
#endif

/* Not every test program uses every helper. */
#define LFX_FN static __attribute__((unused))

#define BS 4
#define NW 2
#define WAIT_MS 15000
#define MAXM 256

LFX_FN uint64_t lfx_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

LFX_FN uint64_t chain_hash(uint32_t c, uint32_t i)
{
    return lfx_mix(((uint64_t)c << 32) | i);
}

LFX_FN void chain_tokens(uint32_t c, uint32_t i, uint32_t *tok)
{
    for (uint32_t k = 0; k < BS; k++)
        tok[k] = 100000u * c + BS * i + k;
}

LFX_FN uint64_t chain_content(uint32_t c, uint32_t i)
{
    uint32_t tok[BS];
    chain_tokens(c, i, tok);
    return kvi_hash_block(tok, BS, kvi_hash_seed(NULL, 0, NULL, 0));
}

LFX_FN int64_t lfx_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

LFX_FN void lfx_nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

/* Poll `cond` every millisecond for up to `ms`; evaluates to whether it held. */
#define WAIT_FOR(cond, ms)                                                     \
    ({                                                                         \
        int64_t wf_end_ = lfx_now_ms() + (ms);                                 \
        bool wf_ok_;                                                           \
        while (!(wf_ok_ = (cond)) && lfx_now_ms() < wf_end_)                   \
            lfx_nap();                                                         \
        wf_ok_;                                                                \
    })

struct lfx {
    struct kvi_writer_pool *pool;
    struct kvi_index *ix;
    struct kvi_listeners *lp;
    char ipc_dir[64];
    unsigned ipc_n;
};

/* lfx_init with the pool's log lines on or off (quiet) whatever the environment. */
LFX_FN void lfx_init_quiet(struct lfx *f, const struct kvi_listeners_config *cfg, bool quiet)
{
    memset(f, 0, sizeof *f);
    f->pool = kvi_writer_pool_create(NW, 0);
    assert_non_null(f->pool);
    struct kvi_index_config icfg = {.block_size = BS, .n_parts = NW};
    f->ix = kvi_index_create(&icfg);
    assert_non_null(f->ix);
    struct kvi_listeners_config c = cfg ? *cfg : (struct kvi_listeners_config){0};
    c.quiet = quiet;
    if (c.threads == 0)
        c.threads = 2;
    f->lp = kvi_listeners_create(f->pool, &c);
    assert_non_null(f->lp);
}

LFX_FN void lfx_init(struct lfx *f, const struct kvi_listeners_config *cfg)
{
    lfx_init_quiet(f, cfg, getenv("KVI_TEST_VERBOSE") == NULL); /* listener warnings on stderr when set */
}

LFX_FN void lfx_fini(struct lfx *f)
{
    kvi_listeners_destroy(f->lp);
    struct kvi_producer *p = kvi_producer_create(f->pool);
    kvi_producer_forget_index(p, f->ix);
    kvi_producer_destroy(p);
    kvi_index_destroy(f->ix);
    kvi_writer_pool_destroy(f->pool);
}

/* A fresh ipc:// endpoint under /tmp. */
LFX_FN void lfx_ipc(struct lfx *f, char *out, size_t cap)
{
    snprintf(out, cap, "ipc:///tmp/kvidx-lis-%d-%p-%u.sock", (int)getpid(), (void *)f, f->ipc_n++);
}

/* A publisher bound on loopback (ephemeral ports), with or without replay. */
LFX_FN struct kvidx_pub *lfx_pub(const char *endpoint, bool replay, const char *topic)
{
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = endpoint ? endpoint : "tcp://127.0.0.1:*";
    pc.replay_endpoint = replay ? "tcp://127.0.0.1:*" : NULL;
    pc.topic = topic;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    return p;
}

LFX_FN struct kvi_listener_key lfx_key(struct lfx *f, uint64_t id, uint32_t rank)
{
    return (struct kvi_listener_key){.ix = f->ix, .instance_id = id, .dp_rank = rank};
}

/* Register instance `id` rank 0 on pub's endpoints (connect mode). */
LFX_FN void lfx_register(struct lfx *f, uint64_t id, struct kvidx_pub *p, bool replay, enum kvi_gap_policy pol)
{
    struct kvi_listener_spec s = {
        .ix = f->ix,
        .instance_id = id,
        .endpoint = kvidx_pub_endpoint(p),
        .replay_endpoint = replay ? kvidx_pub_replay_endpoint(p) : NULL,
        .gap_policy = pol,
    };
    assert_int_equal(kvi_listeners_register(f->lp, &s), 0);
}

LFX_FN struct kvi_listener_info lfx_info(struct lfx *f, uint64_t id)
{
    struct kvi_listener_info info;
    struct kvi_listener_key k = lfx_key(f, id, 0);
    assert_int_equal(kvi_listeners_get(f->lp, &k, &info), 0);
    return info;
}

LFX_FN uint64_t lfx_malformed(struct lfx *f, uint64_t id)
{
    return lfx_info(f, id).ctr.malformed;
}

/*
 * PUB/SUB slow joiner: send 1-frame probes until the listener of `id` has
 * counted one more malformed message than before. @return the malformed
 * count once the subscription is live (the caller's baseline).
 */
LFX_FN uint64_t lfx_sync_topic(struct lfx *f, struct kvidx_pub *p, uint64_t id, const char *topic)
{
    uint64_t base = lfx_malformed(f, id);
    const void *fr[1] = {topic};
    size_t sz[1] = {strlen(topic)};
    int64_t end = lfx_now_ms() + WAIT_MS;
    while (lfx_now_ms() < end) {
        assert_int_equal(kvidx_pub_send_raw(p, fr, sz, 1), 0);
        if (WAIT_FOR(lfx_malformed(f, id) > base, 20)) {
            /* later probes may still be in flight: wait until the count settles */
            uint64_t m;
            do {
                m = lfx_malformed(f, id);
            } while (WAIT_FOR(lfx_malformed(f, id) != m, 30));
            return m;
        }
    }
    fail_msg("listener %llu never received a probe", (unsigned long long)id);
    return 0;
}

/* lfx_sync_topic with a probe that a "" subscription receives. */
LFX_FN uint64_t lfx_sync(struct lfx *f, struct kvidx_pub *p, uint64_t id)
{
    return lfx_sync_topic(f, p, id, "probe");
}

/* Append a stored event for blocks [from, to) of chain c. */
LFX_FN void pub_store(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to)
{
    uint32_t n = to - from;
    uint64_t *h = calloc(n, sizeof *h);
    uint32_t *tok = calloc((size_t)n * BS, sizeof *tok);
    for (uint32_t i = 0; i < n; i++) {
        h[i] = chain_hash(c, from + i);
        chain_tokens(c, from + i, tok + (size_t)i * BS);
    }
    uint64_t parent = from > 0 ? chain_hash(c, from - 1) : 0;
    assert_int_equal(kvidx_pub_publish_stored(p, h, n, from > 0 ? &parent : NULL, tok, (size_t)n * BS, BS, NULL), 0);
    free(h);
    free(tok);
}

/* Append a removed event for blocks [from, to) of chain c. */
LFX_FN void pub_remove(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to)
{
    uint64_t h[64];
    assert_true(to - from <= 64);
    for (uint32_t i = from; i < to; i++)
        h[i - from] = chain_hash(c, i);
    assert_int_equal(kvidx_pub_publish_removed(p, h, to - from, NULL), 0);
}

LFX_FN uint64_t pub_flush(struct kvidx_pub *p)
{
    uint64_t seq;
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    return seq;
}

/* Publish blocks [from, to) of chain c, one block per batch. @return the last seq. */
LFX_FN uint64_t pub_chain(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to)
{
    uint64_t seq = 0;
    for (uint32_t i = from; i < to; i++) {
        pub_store(p, c, i, i + 1);
        seq = pub_flush(p);
    }
    return seq;
}

/* Depth at which (dense instance, rank 0) matches the first n blocks of chain c. */
LFX_FN uint32_t lfx_depth(struct lfx *f, uint64_t id, uint32_t c, uint32_t n)
{
    int64_t inst = kvi_index_find_instance(f->ix, id, NULL);
    if (inst < 0)
        return 0;
    uint64_t q[MAXM];
    assert_true(n <= MAXM);
    for (uint32_t i = 0; i < n; i++)
        q[i] = chain_content(c, i);
    struct kvi_match m[MAXM];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(f->ix, q, n, m, MAXM);
    kvi_rcu_read_unlock();
    uint32_t d = 0;
    for (size_t i = 0; i < k && i < MAXM; i++)
        if (m[i].instance == (uint32_t)inst && m[i].dp_rank == 0)
            d = m[i].depth;
    return d;
}

/* Wait until listener `id` has applied seq `w` and the writers applied every op it submitted. */
LFX_FN void lfx_settle(struct lfx *f, uint64_t id, uint64_t w)
{
    struct kvi_listener_info in;
    bool ok = WAIT_FOR((in = lfx_info(f, id), in.watermark_set && in.watermark == w && !in.replaying), WAIT_MS);
    if (!ok)
        fail_msg("listener %llu: watermark %s%llu (want %llu), replaying %d, gaps %llu replays %llu",
                 (unsigned long long)id, in.watermark_set ? "" : "unset ", (unsigned long long)in.watermark,
                 (unsigned long long)w, in.replaying, (unsigned long long)in.ctr.gaps,
                 (unsigned long long)in.ctr.replays);
    ok = WAIT_FOR((in = lfx_info(f, id),
                   in.ctr.ops_applied + in.ctr.ops_parent_not_found + in.ctr.ops_invalid >= in.ctr.ops_submitted),
                  WAIT_MS);
    assert_true(ok);
}

#endif
