/*
 * Definitions of listener_fixture.h (where the contracts are): built once
 * into kvi_test_net (tests/CMakeLists.txt) and linked into the net tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#define LFX_LIBRARY 1 /* the TSan suppressions are the test program's (listener_fixture.h) */
#include "listener_fixture.h"

void lfx_init_quiet(struct lfx *f, const struct kvi_listeners_config *cfg, bool quiet)
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

struct kvidx_pub *lfx_pub(const char *endpoint, bool replay, const char *topic)
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

void lfx_register(struct lfx *f, uint64_t id, struct kvidx_pub *p, bool replay, enum kvi_gap_policy pol)
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

struct kvi_listener_info lfx_info(struct lfx *f, uint64_t id)
{
    struct kvi_listener_info info;
    struct kvi_listener_key k = lfx_key(f, id, 0);
    assert_int_equal(kvi_listeners_get(f->lp, &k, &info), 0);
    return info;
}

uint64_t lfx_sync_topic(struct lfx *f, struct kvidx_pub *p, uint64_t id, const char *topic)
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

void pub_store(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to)
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

void pub_remove(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to)
{
    uint64_t h[64];
    assert_true(to - from <= 64);
    for (uint32_t i = from; i < to; i++)
        h[i - from] = chain_hash(c, i);
    assert_int_equal(kvidx_pub_publish_removed(p, h, to - from, NULL), 0);
}

uint64_t pub_flush(struct kvidx_pub *p)
{
    uint64_t seq;
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    return seq;
}

uint32_t lfx_depth(struct lfx *f, uint64_t id, uint32_t c, uint32_t n)
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

void lfx_settle(struct lfx *f, uint64_t id, uint64_t w)
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

struct kvidx_pub *lfx_replay_pub(struct lfx *f, uint64_t id)
{
    struct kvidx_pub *p = lfx_pub(NULL, true, NULL);
    lfx_register(f, id, p, true, KVI_GAP_APPLY);
    lfx_sync(f, p, id);
    return p;
}
