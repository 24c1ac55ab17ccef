/*
 * The model of the kvidxd integration tests that compare /dump with what
 * the engines published (kvidxd_nats_test.c, kvidxd_bridge_test.c,
 * kvidxd_nats_cluster_test.c): which
 * blocks of which chain (tests/api/kvidxd_fixture.h: kfx_hash, kfx_content)
 * each (worker, dp_rank) holds, always a prefix of the chain.
 * Also the NATS engines that feed it (struct npub: the C publisher library).
 * Functions fail the test through cmocka: main thread only.
 */
#ifndef KVI_TESTS_API_KVIDXD_MODEL_H
#define KVI_TESTS_API_KVIDXD_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/kvidxd_fixture.h"
#include <kvidx/publisher.h>

#define KMD_MAX_HELD 256

struct held {
    uint64_t w;
    uint32_t r;
    uint32_t c;
    uint32_t n; /* blocks 0..n-1 of chain c */
};

struct model {
    struct held h[KMD_MAX_HELD];
    size_t n;
};

/* The entry of (worker, rank, chain), added (n = 0) when new. */
struct held *held_of(struct model *m, uint64_t w, uint32_t r, uint32_t c);

/*
 * Fail the test unless /dump's namespace @p ns_key ("\"model:tenant\"")
 * holds exactly the model's (worker_id, dp_rank, block_hash, tokens_hash)
 * rows (the body is printed on a mismatch). With @p quiet it returns
 * whether they are equal instead of failing (for polling).
 */
bool check_dump_model(const struct kfx_daemon *d, const struct model *m, const char *ns_key, bool quiet);

/* check_dump_model, failing the test on a mismatch. */
static inline void check_dump(const struct kfx_daemon *d, const struct model *m, const char *ns_key)
{
    (void)check_dump_model(d, m, ns_key, false);
}

/* An engine publishing on NATS through the C publisher library as (worker w, rank r). */
struct npub {
    struct kvidx_pub *p;
    uint64_t w;
    uint32_t r;
};

/* Open one (transport t: KVIDX_PUB_TRANSPORT_NATS_CORE with @p subject, or _NATS_JETSTREAM with
 * @p stream, created if missing); fails the test when it cannot. */
struct npub npub_open(enum kvidx_pub_transport t, const char *url, const char *subject, const char *stream,
                      uint64_t w, uint32_t r);

/* Store blocks [from, to) of chain c (one event; the model must hold exactly [0, from)), model updated. */
void pub_store(struct npub *n, struct model *m, uint32_t c, uint32_t from, uint32_t to);

/* Remove blocks [from, n) of chain c (one event), model updated. */
void pub_remove(struct npub *n, struct model *m, uint32_t c, uint32_t from);

#endif
