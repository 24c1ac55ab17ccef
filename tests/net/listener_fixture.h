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
 * Declared here with their contracts, defined in listener_fixture.c (built
 * once into kvi_test_net, tests/CMakeLists.txt); small helpers and the
 * macros stay here. Functions that fail the test use cmocka: call them from
 * the test's main thread only.
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

#if defined(__SANITIZE_THREAD__) && !defined(LFX_LIBRARY)
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

#define BS 4
#define NW 2
#define WAIT_MS 15000
#define MAXM 256

static inline uint64_t lfx_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t chain_hash(uint32_t c, uint32_t i)
{
    return lfx_mix(((uint64_t)c << 32) | i);
}

static inline void chain_tokens(uint32_t c, uint32_t i, uint32_t *tok)
{
    for (uint32_t k = 0; k < BS; k++)
        tok[k] = 100000u * c + BS * i + k;
}

static inline uint64_t chain_content(uint32_t c, uint32_t i)
{
    uint32_t tok[BS];
    chain_tokens(c, i, tok);
    return kvi_hash_block(tok, BS, kvi_hash_seed(NULL, 0, NULL, 0));
}

static inline int64_t lfx_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static inline void lfx_nap(void)
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
void lfx_init_quiet(struct lfx *f, const struct kvi_listeners_config *cfg, bool quiet);

static inline void lfx_init(struct lfx *f, const struct kvi_listeners_config *cfg)
{
    lfx_init_quiet(f, cfg, getenv("KVI_TEST_VERBOSE") == NULL); /* listener warnings on stderr when set */
}

static inline void lfx_fini(struct lfx *f)
{
    kvi_listeners_destroy(f->lp);
    struct kvi_producer *p = kvi_producer_create(f->pool);
    kvi_producer_forget_index(p, f->ix);
    kvi_producer_destroy(p);
    kvi_index_destroy(f->ix);
    kvi_writer_pool_destroy(f->pool);
}

/* A fresh ipc:// endpoint under /tmp. */
static inline void lfx_ipc(struct lfx *f, char *out, size_t cap)
{
    snprintf(out, cap, "ipc:///tmp/kvidx-lis-%d-%p-%u.sock", (int)getpid(), (void *)f, f->ipc_n++);
}

/* A publisher bound on loopback (ephemeral ports), with or without replay. */
struct kvidx_pub *lfx_pub(const char *endpoint, bool replay, const char *topic);

static inline struct kvi_listener_key lfx_key(struct lfx *f, uint64_t id, uint32_t rank)
{
    return (struct kvi_listener_key){.ix = f->ix, .instance_id = id, .dp_rank = rank};
}

/* Register instance `id` rank 0 on pub's endpoints (connect mode). */
void lfx_register(struct lfx *f, uint64_t id, struct kvidx_pub *p, bool replay, enum kvi_gap_policy pol);

/* The listener info of instance @p id rank 0 (it must be registered). */
struct kvi_listener_info lfx_info(struct lfx *f, uint64_t id);

static inline uint64_t lfx_malformed(struct lfx *f, uint64_t id)
{
    return lfx_info(f, id).ctr.malformed;
}

/*
 * PUB/SUB slow joiner: send 1-frame probes until the listener of `id` has
 * counted one more malformed message than before. @return the malformed
 * count once the subscription is live (the caller's baseline).
 */
uint64_t lfx_sync_topic(struct lfx *f, struct kvidx_pub *p, uint64_t id, const char *topic);

/* lfx_sync_topic with a probe that a "" subscription receives. */
static inline uint64_t lfx_sync(struct lfx *f, struct kvidx_pub *p, uint64_t id)
{
    return lfx_sync_topic(f, p, id, "probe");
}

/* A publisher with replay on loopback TCP (lfx_pub), registered as instance
 * @p id rank 0 with replay and KVI_GAP_APPLY, and synced (lfx_sync). */
struct kvidx_pub *lfx_replay_pub(struct lfx *f, uint64_t id);

/* Append a stored event for blocks [from, to) of chain c. */
void pub_store(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to);

/* Append a removed event for blocks [from, to) of chain c. */
void pub_remove(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to);

/* Flush @p p's pending events as one batch; @return its seq. */
uint64_t pub_flush(struct kvidx_pub *p);

/* Publish blocks [from, to) of chain c, one block per batch. @return the last seq. */
static inline uint64_t pub_chain(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to)
{
    uint64_t seq = 0;
    for (uint32_t i = from; i < to; i++) {
        pub_store(p, c, i, i + 1);
        seq = pub_flush(p);
    }
    return seq;
}

/* Depth at which (dense instance, rank 0) matches the first n blocks of chain c. */
uint32_t lfx_depth(struct lfx *f, uint64_t id, uint32_t c, uint32_t n);

/* Wait until listener `id` has applied seq `w` and the writers applied every op it submitted. */
void lfx_settle(struct lfx *f, uint64_t id, uint64_t w);

#endif
