/*
 * Test support: a model of what each (worker, dp_rank) holds, for the NATS
 * tests (kvidxd_nats_test.c, kvidxd_nats_cluster_test.c), and the check of
 * kvidxd's /dump against it. Every (worker, rank) holds a prefix of each
 * chain of the kvidxd fixture's corpus (block i of chain c: engine hash
 * kfx_hash(c, i), content hash kfx_content(c, i)).
 *
 * Defined in kvidxd_model.c (built into kvi_test_api). The functions fail
 * the test with cmocka: call them from the test's main thread only.
 */
#ifndef KVI_TESTS_API_KVIDXD_MODEL_H
#define KVI_TESTS_API_KVIDXD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "api/kvidxd_fixture.h"

#define KMD_MAX_HELD 64

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

/* The entry of (worker w, rank r, chain c), added (holding nothing) when new; fails past KMD_MAX_HELD. */
struct held *held_of(struct model *m, uint64_t w, uint32_t r, uint32_t c);

/* /dump's namespace @p ns_key (e.g. "\"m:t\"") equals the model: the same (worker, rank, block hash,
 * content hash) rows, compared sorted (at most 512); fails the test, printing the dump, otherwise. */
void check_dump(const struct kfx_daemon *d, const struct model *m, const char *ns_key);

#endif
