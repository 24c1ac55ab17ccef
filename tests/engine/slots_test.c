/*
 * Slot tracker (engine/slots.h): every status rule of
 * dynamo-standalone-slot-tracker.md at the engine API, the load formulas on
 * crafted states (shared prefixes included), stale cleanup with an injected
 * clock, replica-event drop rules, the event hook, and a randomized
 * differential test against a brute-force model.
 */
/* ctest-labels: unit */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/rcu.h"
#include "engine/slots.h"

/* ---- helpers ------------------------------------------------------------------------ */

static struct kvi_slots_key K(const char *model, const char *tenant)
{
    return (struct kvi_slots_key){model, model ? strlen(model) : 0, tenant,
                                  tenant ? strlen(tenant) : 0};
}

static const struct kvi_slots_key *KP(const char *model, const char *tenant)
{
    static struct kvi_slots_key keys[8];
    static unsigned next;
    struct kvi_slots_key *k = &keys[next++ % 8];
    *k = K(model, tenant);
    return k;
}

static int reg(struct kvi_slots *s, const char *model, const char *tenant, uint64_t w, uint32_t bs,
               uint32_t start, uint32_t size)
{
    return kvi_slots_register(s, KP(model, tenant), w, bs, start, size, NULL);
}

static struct kvi_slots_request R(const char *model, const char *tenant, const char *id,
                                  uint64_t w, uint32_t rank, const uint64_t *h, size_t n,
                                  uint64_t isl)
{
    return (struct kvi_slots_request){K(model, tenant), id, strlen(id), w, rank, h, n, isl};
}

static int add(struct kvi_slots *s, const char *id, uint64_t w, uint32_t rank, const uint64_t *h,
               size_t n, uint64_t isl)
{
    struct kvi_slots_request r = R("m", "default", id, w, rank, h, n, isl);
    return kvi_slots_add(s, &r, NULL);
}

static int fin(struct kvi_slots *s, const char *id)
{
    struct kvi_slots_request r = R("m", "default", id, 0, 0, NULL, 0, 0);
    return kvi_slots_free(s, &r, NULL);
}

static int pdone(struct kvi_slots *s, const char *id)
{
    struct kvi_slots_request r = R("m", "default", id, 0, 0, NULL, 0, 0);
    return kvi_slots_prefill_complete(s, &r, NULL);
}

/* The load of (worker, rank) in tracker ("m", "default"), or fail. */
static struct kvi_slots_load load_of(struct kvi_slots *s, uint64_t w, uint32_t rank)
{
    struct kvi_slots_load out[64];
    kvi_rcu_read_lock();
    size_t n = kvi_slots_loads(s, KP("m", "default"), out, 64);
    kvi_rcu_read_unlock();
    for (size_t i = 0; i < n && i < 64; i++)
        if (out[i].worker_id == w && out[i].dp_rank == rank)
            return out[i];
    fail_msg("no load for worker %llu rank %u", (unsigned long long)w, rank);
    return out[0];
}

static size_t potential(struct kvi_slots *s, const uint64_t *h, size_t n, uint64_t isl,
                        struct kvi_slots_potential *out, size_t cap)
{
    size_t n_out = 0;
    kvi_rcu_read_lock();
    int rc = kvi_slots_potential_loads(s, KP("m", "default"), h, n, isl, out, cap, &n_out);
    kvi_rcu_read_unlock();
    assert_int_equal(rc, 0);
    return n_out;
}

static const struct kvi_slots_potential *pot_of(const struct kvi_slots_potential *p, size_t n,
                                                uint64_t w, uint32_t rank)
{
    for (size_t i = 0; i < n; i++)
        if (p[i].worker_id == w && p[i].dp_rank == rank)
            return &p[i];
    fail_msg("no potential load for worker %llu rank %u", (unsigned long long)w, rank);
    return NULL;
}

static int setup(void **state)
{
    kvi_rcu_register_thread();
    *state = kvi_slots_create(NULL);
    return *state == NULL;
}

static int teardown(void **state)
{
    kvi_slots_destroy(*state);
    kvi_rcu_unregister_thread();
    return 0;
}

/* ---- topology ------------------------------------------------------------------------- */

static void test_register_validation(void **state)
{
    struct kvi_slots *s = *state;
    struct kvi_slots_err why;
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 0, 0, 1, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_BLOCK_SIZE);
    /* block_size is checked before the range */
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 0, 0, 0, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_BLOCK_SIZE);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, 0, 0, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_DP_SIZE);
    assert_int_equal(why.worker_id, 1);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, UINT32_MAX, 1, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_DP_RANGE);
    assert_int_equal(why.dp_start, UINT32_MAX);
    assert_int_equal(why.dp_size, 1);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, 10, UINT32_MAX - 9, &why),
                     -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_DP_RANGE);
    /* a failed registration creates no tracker */
    struct kvi_slots_info info;
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_tracker_info(s, KP("m", "default"), &info), -ENOENT);
    kvi_rcu_read_unlock();
    /* the largest range that does not overflow: start + size == u32::MAX */
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, UINT32_MAX - 1, 1, &why), 0);
    assert_int_equal(why.why, KVI_SLOTS_OK);
    assert_int_equal(load_of(s, 1, UINT32_MAX - 1).active_decode_blocks, 0);
}

static void test_register_expands_range_and_conflicts(void **state)
{
    struct kvi_slots *s = *state;
    struct kvi_slots_err why;
    assert_int_equal(reg(s, "m", "default", 1, 16, 2, 2), 0);
    struct kvi_slots_load l[8];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(s, NULL, l, 8), 2);
    kvi_rcu_read_unlock();
    assert_int_equal(l[0].worker_id, 1);
    assert_int_equal(l[0].dp_rank, 2);
    assert_int_equal(l[1].dp_rank, 3);
    assert_int_equal(l[0].active_prefill_tokens + l[0].active_decode_blocks + l[0].active_requests,
                     0);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, 0, 1, &why), -EEXIST);
    assert_int_equal(why.why, KVI_SLOTS_E_DUP_WORKER);
    assert_int_equal(why.worker_id, 1);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 2, 32, 0, 1, &why), -EEXIST);
    assert_int_equal(why.why, KVI_SLOTS_E_BLOCK_SIZE_MISMATCH);
    assert_int_equal(why.existing_block_size, 16);
    assert_int_equal(why.requested_block_size, 32);
    /* the block size is compared before the worker id */
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 32, 0, 1, &why), -EEXIST);
    assert_int_equal(why.why, KVI_SLOTS_E_BLOCK_SIZE_MISMATCH);
    /* ranges of different workers may overlap (ranks are per worker) */
    assert_int_equal(reg(s, "m", "default", 2, 16, 2, 1), 0);
    struct kvi_slots_info info;
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_tracker_info(s, KP("m", "default"), &info), 0);
    kvi_rcu_read_unlock();
    assert_int_equal(info.block_size, 16);
    assert_int_equal(info.n_workers, 2);
    assert_int_equal(info.n_ranks, 3);
}

static void test_rank_cap(void **state)
{
    (void)state;
    struct kvi_slots_config cfg = {.max_ranks = 4};
    struct kvi_slots *s = kvi_slots_create(&cfg);
    struct kvi_slots_err why;
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, 0, 5, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_TOO_MANY_RANKS);
    assert_int_equal(why.ranks, 0);
    assert_int_equal(why.max_ranks, 4);
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_workers(s, NULL, NULL, 0), 0); /* no tracker was left behind */
    kvi_rcu_read_unlock();
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, 0, 3, &why), 0);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 2, 16, 0, 2, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_TOO_MANY_RANKS);
    assert_int_equal(why.ranks, 3);
    assert_int_equal(why.dp_size, 2);
    /* conflicts are reported before the cap */
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 1, 16, 0, 9, &why), -EEXIST);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 2, 16, 0, 1, &why), 0);
    assert_int_equal(kvi_slots_register(s, KP("m", "other"), 2, 16, 0, 4, &why), 0); /* per tracker */
    kvi_slots_destroy(s);
}

static void test_workers_scoped_filtered_sorted(void **state)
{
    struct kvi_slots *s = *state;
    /* worker ids are scoped by (model, tenant): same id, other tenants */
    assert_int_equal(reg(s, "model", "b", 1, 16, 0, 1), 0);
    assert_int_equal(reg(s, "model", "a", 1, 16, 0, 1), 0);
    assert_int_equal(reg(s, "model", "a", 0, 16, 4, 3), 0);
    assert_int_equal(reg(s, "alpha", "b", 9, 64, 0, 2), 0);
    assert_int_equal(reg(s, "model", "", 5, 8, 0, 1), 0);
    assert_int_equal(reg(s, "mode", "z", 5, 8, 0, 1), 0);

    struct kvi_slots_worker w[16];
    kvi_rcu_read_lock();
    size_t n = kvi_slots_workers(s, NULL, w, 16);
    kvi_rcu_read_unlock();
    assert_int_equal(n, 6);
    /* sorted by (model, tenant, worker_id), bytewise: "mode" < "model", "" < "a" */
    const char *exp_m[] = {"alpha", "mode", "model", "model", "model", "model"};
    const char *exp_t[] = {"b", "z", "", "a", "a", "b"};
    uint64_t exp_w[] = {9, 5, 5, 0, 1, 1};
    for (size_t i = 0; i < 6; i++) {
        assert_string_equal(w[i].model, exp_m[i]);
        assert_string_equal(w[i].tenant, exp_t[i]);
        assert_int_equal(w[i].worker_id, exp_w[i]);
    }
    assert_int_equal(w[0].block_size, 64);
    assert_int_equal(w[0].dp_size, 2);
    assert_int_equal(w[3].dp_start, 4);
    assert_int_equal(w[3].dp_size, 3);

    kvi_rcu_read_lock();
    /* independent filters */
    assert_int_equal(kvi_slots_workers(s, KP("model", NULL), w, 16), 4);
    assert_int_equal(kvi_slots_workers(s, KP(NULL, "b"), w, 16), 2);
    assert_string_equal(w[0].model, "alpha");
    assert_string_equal(w[1].model, "model");
    assert_int_equal(kvi_slots_workers(s, KP("model", "a"), w, 16), 2);
    assert_int_equal(kvi_slots_workers(s, KP("model", ""), w, 16), 1); /* "" is a tenant */
    assert_int_equal(w[0].worker_id, 5);
    assert_int_equal(kvi_slots_workers(s, KP("nope", NULL), w, 16), 0);
    assert_int_equal(kvi_slots_workers(s, KP("alpha", "a"), w, 16), 0);
    /* the count is returned even when the array is short */
    assert_int_equal(kvi_slots_workers(s, NULL, w, 2), 6);
    assert_string_equal(w[1].model, "mode");

    /* loads: every rank, sorted by (model, tenant, worker, rank) */
    struct kvi_slots_load l[16];
    assert_int_equal(kvi_slots_loads(s, NULL, l, 16), 9);
    assert_string_equal(l[0].model, "alpha");
    assert_int_equal(l[0].dp_rank, 0);
    assert_int_equal(l[1].dp_rank, 1);
    assert_string_equal(l[3].tenant, "");
    assert_int_equal(l[4].worker_id, 0);
    assert_int_equal(l[4].dp_rank, 4);
    assert_int_equal(l[6].dp_rank, 6);
    assert_int_equal(l[7].worker_id, 1);
    assert_string_equal(l[8].tenant, "b");
    assert_int_equal(kvi_slots_loads(s, KP(NULL, "a"), l, 16), 4);
    assert_int_equal(kvi_slots_loads(s, KP("x", "a"), l, 16), 0);
    kvi_rcu_read_unlock();
}

static void test_names_with_nul_bytes(void **state)
{
    struct kvi_slots *s = *state;
    struct kvi_slots_key a = {"m\0x", 3, "t", 1}, b = {"m", 1, "t", 1};
    assert_int_equal(kvi_slots_register(s, &a, 1, 16, 0, 1, NULL), 0);
    assert_int_equal(kvi_slots_register(s, &b, 1, 32, 0, 1, NULL), 0); /* another tracker */
    struct kvi_slots_worker w[4];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_workers(s, NULL, w, 4), 2);
    kvi_rcu_read_unlock();
    assert_int_equal(w[0].model_len, 1);
    assert_int_equal(w[1].model_len, 3);
    assert_memory_equal(w[1].model, "m\0x", 3);
}

static void test_unregister(void **state)
{
    struct kvi_slots *s = *state;
    struct kvi_slots_err why;
    assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 7, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_WORKER);
    assert_int_equal(why.worker_id, 7);
    assert_int_equal(reg(s, "m", "default", 1, 16, 0, 1), 0);
    assert_int_equal(reg(s, "m", "default", 2, 16, 0, 2), 0);
    assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 7, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_WORKER);
    /* another tenant's worker 1 is not this one */
    assert_int_equal(kvi_slots_unregister(s, KP("m", "other"), 1, &why), -ENOENT);

    uint64_t h[] = {1, 2, 3};
    assert_int_equal(add(s, "r1", 1, 0, h, 3, 8), 0);
    assert_int_equal(add(s, "r2", 2, 1, h, 2, 4), 0);
    /* unregister removes the worker's ranks and active requests at once */
    assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 1, &why), 0);
    assert_int_equal(why.why, KVI_SLOTS_OK);
    struct kvi_slots_load l[8];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(s, NULL, l, 8), 2);
    kvi_rcu_read_unlock();
    assert_int_equal(l[0].worker_id, 2);
    assert_int_equal(l[1].active_decode_blocks, 2);
    assert_int_equal(l[1].active_prefill_tokens, 4);
    /* r1 is gone: its id is free again, on a registered rank */
    assert_int_equal(pdone(s, "r1"), -ENOENT);
    assert_int_equal(add(s, "r1", 2, 0, h, 3, 0), 0);
    /* the last worker takes the tracker with it */
    assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 2, NULL), 0);
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(s, NULL, l, 8), 0);
    assert_int_equal(kvi_slots_workers(s, NULL, NULL, 0), 0);
    size_t n_out = 99;
    struct kvi_slots_potential p[4];
    assert_int_equal(kvi_slots_potential_loads(s, KP("m", "default"), h, 1, 0, p, 4, &n_out),
                     -ENOENT);
    assert_int_equal(n_out, 0);
    kvi_rcu_read_unlock();
    assert_int_equal(add(s, "x", 2, 0, h, 1, 0), -ENOENT);
    assert_int_equal(fin(s, "x"), -ENOENT);
    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.trackers, 0);
    assert_int_equal(st.workers, 0);
    assert_int_equal(st.ranks, 0);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.nodes, 0);
    /* re-registration starts fresh, with any block size */
    assert_int_equal(reg(s, "m", "default", 2, 32, 2, 2), 0);
    assert_int_equal(add(s, "r1", 2, 2, (uint64_t[]){201}, 1, 0), 0);
    assert_int_equal(load_of(s, 2, 2).active_decode_blocks, 1);
    assert_int_equal(load_of(s, 2, 3).active_decode_blocks, 0);
}

/* ---- lifecycle ------------------------------------------------------------------------- */

static void test_lifecycle_statuses_and_order(void **state)
{
    struct kvi_slots *s = *state;
    struct kvi_slots_err why;
    assert_int_equal(reg(s, "m", "default", 1, 16, 0, 1), 0);

    /* unknown tracker: 404 for every lifecycle write */
    struct kvi_slots_request r = R("m", "nope", "q", 1, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_add(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_TRACKER);
    assert_int_equal(kvi_slots_prefill_complete(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_TRACKER);
    assert_int_equal(kvi_slots_free(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_TRACKER);

    /* an early free of an unknown request is a 200 no-op and is forgotten */
    r = R("m", "default", "early-free", 0, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_free(s, &r, &why), 0);
    assert_int_equal(why.why, KVI_SLOTS_OK);
    r = R("m", "default", "early-complete", 0, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_prefill_complete(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_REQUEST);

    /* unknown rank of a known worker; unknown worker */
    uint64_t h1[] = {1};
    r = R("m", "default", "bad-rank", 1, 1, h1, 1, 0);
    assert_int_equal(kvi_slots_add(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_RANK);
    assert_int_equal(why.worker_id, 1);
    assert_int_equal(why.dp_rank, 1);
    r = R("m", "default", "bad-worker", 3, 0, h1, 1, 0);
    assert_int_equal(kvi_slots_add(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_RANK);
    assert_int_equal(why.worker_id, 3);

    /* the early free did not stop this add from being accounted */
    uint64_t h12[] = {1, 2};
    assert_int_equal(add(s, "early-free", 1, 0, h12, 2, 8), 0);
    struct kvi_slots_load l = load_of(s, 1, 0);
    assert_int_equal(l.active_decode_blocks, 2);
    assert_int_equal(l.active_prefill_tokens, 8);
    assert_int_equal(l.active_requests, 1);

    /* duplicate id: 409, whatever the rank, naming the owner */
    assert_int_equal(reg(s, "m", "default", 2, 16, 0, 1), 0);
    r = R("m", "default", "early-free", 2, 0, h12, 2, 8);
    assert_int_equal(kvi_slots_add(s, &r, &why), -EEXIST);
    assert_int_equal(why.why, KVI_SLOTS_E_DUP_REQUEST);
    assert_int_equal(why.worker_id, 1);
    assert_int_equal(why.dp_rank, 0);
    /* the rank is checked before the duplicate */
    r = R("m", "default", "early-free", 1, 5, h12, 2, 8);
    assert_int_equal(kvi_slots_add(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_RANK);
    assert_int_equal(load_of(s, 1, 0).active_requests, 1);

    /* repeated completion and repeated free are no-ops */
    assert_int_equal(pdone(s, "early-free"), 0);
    assert_int_equal(load_of(s, 1, 0).active_prefill_tokens, 0);
    assert_int_equal(pdone(s, "early-free"), 0);
    assert_int_equal(load_of(s, 1, 0).active_decode_blocks, 2);
    assert_int_equal(fin(s, "early-free"), 0);
    assert_int_equal(fin(s, "early-free"), 0);
    assert_int_equal(pdone(s, "early-free"), -ENOENT);
    l = load_of(s, 1, 0);
    assert_int_equal(l.active_decode_blocks + l.active_prefill_tokens + l.active_requests, 0);

    /* an add with new_isl_tokens 0 (the default) adds no prefill tokens */
    assert_int_equal(add(s, "no-prefill", 1, 0, h12, 2, 0), 0);
    assert_int_equal(load_of(s, 1, 0).active_prefill_tokens, 0);
    assert_int_equal(load_of(s, 1, 0).active_requests, 1);
    /* sequence_hashes may be empty: a request without blocks */
    assert_int_equal(add(s, "empty", 1, 0, NULL, 0, 5), 0);
    l = load_of(s, 1, 0);
    assert_int_equal(l.active_decode_blocks, 2);
    assert_int_equal(l.active_prefill_tokens, 5);
    assert_int_equal(l.active_requests, 2);
    assert_int_equal(fin(s, "empty"), 0);
    assert_int_equal(fin(s, "no-prefill"), 0);
    /* the empty string is a request id like any other */
    assert_int_equal(add(s, "", 1, 0, h1, 1, 0), 0);
    assert_int_equal(add(s, "", 1, 0, h1, 1, 0), -EEXIST);
    assert_int_equal(fin(s, ""), 0);
}

/* dynamo tests: test_prefill_lifecycle_updates_both_load_dimensions */
static void test_prefill_accounting(void **state)
{
    struct kvi_slots *s = *state;
    assert_int_equal(reg(s, "m", "default", 4, 16, 0, 1), 0);
    assert_int_equal(add(s, "req-a", 4, 0, (uint64_t[]){1, 2}, 2, 48), 0);
    assert_int_equal(add(s, "req-b", 4, 0, (uint64_t[]){1, 3}, 2, 16), 0);
    struct kvi_slots_load l = load_of(s, 4, 0);
    assert_int_equal(l.active_prefill_tokens, 64);
    assert_int_equal(l.active_decode_blocks, 3);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pdone(s, "req-a"), 0);
    l = load_of(s, 4, 0);
    assert_int_equal(l.active_prefill_tokens, 16);
    assert_int_equal(l.active_decode_blocks, 3);
    assert_int_equal(fin(s, "req-b"), 0);
    l = load_of(s, 4, 0);
    assert_int_equal(l.active_prefill_tokens, 0);
    assert_int_equal(l.active_decode_blocks, 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(fin(s, "req-a"), 0);
    assert_int_equal(load_of(s, 4, 0).active_decode_blocks, 0);

    /* huge token counts saturate instead of wrapping, and come back exactly */
    assert_int_equal(add(s, "big1", 4, 0, NULL, 0, UINT64_MAX), 0);
    assert_int_equal(add(s, "big2", 4, 0, NULL, 0, 10), 0);
    assert_true(load_of(s, 4, 0).active_prefill_tokens == UINT64_MAX);
    struct kvi_slots_potential p[2];
    assert_int_equal(potential(s, NULL, 0, 5, p, 2), 1);
    assert_true(p[0].potential_prefill_tokens == UINT64_MAX);
    assert_int_equal(pdone(s, "big1"), 0);
    assert_int_equal(load_of(s, 4, 0).active_prefill_tokens, 10);
}

/* dynamo tests: test_shared_prefix_accounting_and_unregister */
static void test_shared_prefix_accounting(void **state)
{
    struct kvi_slots *s = *state;
    assert_int_equal(reg(s, "m", "default", 7, 16, 0, 2), 0);
    assert_int_equal(reg(s, "m", "default", 8, 16, 0, 1), 0);
    uint64_t m22 = (uint64_t)-22;
    assert_int_equal(add(s, "req-a", 7, 0, (uint64_t[]){11, m22, 33}, 3, 0), 0);
    assert_int_equal(add(s, "req-b", 7, 0, (uint64_t[]){11, m22, 44}, 3, 0), 0);
    assert_int_equal(add(s, "req-c", 7, 1, (uint64_t[]){11, m22, 55}, 3, 0), 0);
    assert_int_equal(load_of(s, 7, 0).active_decode_blocks, 4);
    assert_int_equal(load_of(s, 7, 1).active_decode_blocks, 3);
    assert_int_equal(load_of(s, 8, 0).active_decode_blocks, 0);

    struct kvi_slots_potential p[8];
    uint64_t q[] = {11, m22, 33, 66};
    size_t n = potential(s, q, 4, 0, p, 8);
    assert_int_equal(n, 3);
    /* sorted by (worker, rank) */
    assert_int_equal(p[0].worker_id, 7);
    assert_int_equal(p[0].dp_rank, 0);
    assert_int_equal(p[1].dp_rank, 1);
    assert_int_equal(p[2].worker_id, 8);
    assert_int_equal(p[0].overlap_blocks, 3);
    assert_int_equal(p[0].potential_decode_blocks, 5);
    assert_int_equal(p[0].active_requests, 2);
    assert_int_equal(p[1].overlap_blocks, 2);
    assert_int_equal(p[1].potential_decode_blocks, 5);
    assert_int_equal(p[1].active_requests, 1);
    assert_int_equal(p[2].overlap_blocks, 0);
    assert_int_equal(p[2].potential_decode_blocks, 4);
    assert_int_equal(p[2].active_requests, 0);

    assert_int_equal(fin(s, "req-b"), 0);
    assert_int_equal(load_of(s, 7, 0).active_decode_blocks, 3);
    assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 7, NULL), 0);
    struct kvi_slots_load l[4];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(s, KP("m", NULL), l, 4), 1);
    kvi_rcu_read_unlock();
    assert_int_equal(l[0].worker_id, 8);
    assert_int_equal(l[0].active_decode_blocks, 0);
    struct kvi_slots_err why;
    struct kvi_slots_request r = R("m", "default", "stale-selection", 7, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_add(s, &r, &why), -ENOENT);
    assert_int_equal(why.why, KVI_SLOTS_E_NO_RANK);
}

/* Blocks are shared only through a common prefix. */
static void test_prefix_semantics(void **state)
{
    struct kvi_slots *s = *state;
    assert_int_equal(reg(s, "m", "default", 1, 16, 0, 1), 0);
    /* the reference's potential_loads_reuse_active_hashes_and_add_uniform_prefill */
    assert_int_equal(add(s, "req-1", 1, 0, (uint64_t[]){1, 2, 3}, 3, 8), 0);
    struct kvi_slots_potential p[2];
    assert_int_equal(potential(s, (uint64_t[]){1, 2, 4}, 3, 5, p, 2), 1);
    assert_int_equal(p[0].potential_prefill_tokens, 13);
    assert_int_equal(p[0].potential_decode_blocks, 4);
    assert_int_equal(p[0].overlap_blocks, 2);
    assert_int_equal(p[0].active_prefill_tokens, 8);
    assert_int_equal(p[0].active_decode_blocks, 3);
    assert_int_equal(fin(s, "req-1"), 0);

    /* same hash under another parent is another block */
    assert_int_equal(add(s, "a", 1, 0, (uint64_t[]){1, 2}, 2, 0), 0);
    assert_int_equal(add(s, "b", 1, 0, (uint64_t[]){9, 2}, 2, 0), 0);
    assert_int_equal(load_of(s, 1, 0).active_decode_blocks, 4);
    /* a query matches along its own chain only */
    assert_int_equal(potential(s, (uint64_t[]){9, 2, 3}, 3, 0, p, 2), 1);
    assert_int_equal(p[0].overlap_blocks, 2);
    assert_int_equal(p[0].potential_decode_blocks, 5);
    assert_int_equal(potential(s, (uint64_t[]){2}, 1, 0, p, 2), 1);
    assert_int_equal(p[0].overlap_blocks, 0);
    assert_int_equal(p[0].potential_decode_blocks, 5);
    assert_int_equal(potential(s, (uint64_t[]){1, 9}, 2, 0, p, 2), 1);
    assert_int_equal(p[0].overlap_blocks, 1);
    /* an empty projection: active load, no new blocks */
    assert_int_equal(potential(s, NULL, 0, 7, p, 2), 1);
    assert_int_equal(p[0].overlap_blocks, 0);
    assert_int_equal(p[0].potential_decode_blocks, 4);
    assert_int_equal(p[0].potential_prefill_tokens, 7);
    assert_int_equal(fin(s, "a"), 0);
    assert_int_equal(fin(s, "b"), 0);

    /* a repeated hash is a new block at each depth */
    assert_int_equal(add(s, "rep", 1, 0, (uint64_t[]){5, 5, 5}, 3, 0), 0);
    assert_int_equal(load_of(s, 1, 0).active_decode_blocks, 3);
    assert_int_equal(potential(s, (uint64_t[]){5, 5, 5, 5}, 4, 0, p, 2), 1);
    assert_int_equal(p[0].overlap_blocks, 3);
    /* the same prompt twice holds its blocks once, until both are freed */
    assert_int_equal(add(s, "rep2", 1, 0, (uint64_t[]){5, 5, 5}, 3, 0), 0);
    assert_int_equal(load_of(s, 1, 0).active_decode_blocks, 3);
    assert_int_equal(add(s, "short", 1, 0, (uint64_t[]){5}, 1, 0), 0);
    assert_int_equal(fin(s, "rep"), 0);
    assert_int_equal(load_of(s, 1, 0).active_decode_blocks, 3);
    assert_int_equal(fin(s, "rep2"), 0);
    assert_int_equal(load_of(s, 1, 0).active_decode_blocks, 1);
    assert_int_equal(fin(s, "short"), 0);
    assert_int_equal(load_of(s, 1, 0).active_decode_blocks, 0);
    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.nodes, 0);
}

/* Overlaps of several ranks that drop out at different depths. */
static void test_potential_drop_points(void **state)
{
    struct kvi_slots *s = *state;
    assert_int_equal(reg(s, "m", "default", 3, 16, 0, 2), 0);
    assert_int_equal(reg(s, "m", "default", 1, 16, 0, 2), 0);
    assert_int_equal(add(s, "a", 1, 0, (uint64_t[]){1, 2, 3, 4}, 4, 0), 0);
    assert_int_equal(add(s, "b", 1, 1, (uint64_t[]){1, 2}, 2, 0), 0);
    assert_int_equal(add(s, "c", 3, 0, (uint64_t[]){1, 2, 3}, 3, 0), 0);
    assert_int_equal(add(s, "d", 3, 1, (uint64_t[]){7}, 1, 0), 0);
    assert_int_equal(add(s, "e", 3, 1, (uint64_t[]){1, 8}, 2, 0), 0);
    struct kvi_slots_potential p[4];
    uint64_t q[] = {1, 2, 3, 4, 5};
    assert_int_equal(potential(s, q, 5, 0, p, 4), 4);
    const struct kvi_slots_potential *a = pot_of(p, 4, 1, 0), *b = pot_of(p, 4, 1, 1),
                                      *c = pot_of(p, 4, 3, 0), *d = pot_of(p, 4, 3, 1);
    assert_int_equal(a->overlap_blocks, 4);
    assert_int_equal(a->potential_decode_blocks, 4 + 1);
    assert_int_equal(b->overlap_blocks, 2);
    assert_int_equal(b->potential_decode_blocks, 2 + 3);
    assert_int_equal(c->overlap_blocks, 3);
    assert_int_equal(c->potential_decode_blocks, 3 + 2);
    assert_int_equal(d->overlap_blocks, 1);
    assert_int_equal(d->potential_decode_blocks, 3 + 4);
    /* a too small array: -ENOSPC with the size needed */
    size_t n_out = 0;
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_potential_loads(s, KP("m", "default"), q, 5, 0, p, 3, &n_out),
                     -ENOSPC);
    kvi_rcu_read_unlock();
    assert_int_equal(n_out, 4);
}

/* ---- stale cleanup ---------------------------------------------------------------------- */

static uint64_t fake_now(void *ctx)
{
    return *(uint64_t *)ctx;
}

#define SEC 1000000000ull

static void test_stale_cleanup(void **state)
{
    (void)state;
    uint64_t clock = 1000 * SEC;
    struct kvi_slots_config cfg = {.now_ns = fake_now, .clock_ctx = &clock};
    struct kvi_slots *s = kvi_slots_create(&cfg);
    assert_int_equal(reg(s, "m", "default", 1, 16, 0, 1), 0);
    assert_int_equal(add(s, "r0", 1, 0, (uint64_t[]){1, 2}, 2, 10), 0);
    clock += 100 * SEC;
    assert_int_equal(add(s, "r1", 1, 0, (uint64_t[]){1, 3}, 2, 20), 0);
    clock += 100 * SEC;
    assert_int_equal(add(s, "r2", 1, 0, (uint64_t[]){4}, 1, 30), 0);

    /* exactly 300 s old is not stale yet */
    assert_int_equal(kvi_slots_expire(s, 1300 * SEC), 0);
    assert_int_equal(load_of(s, 1, 0).active_requests, 3);
    assert_int_equal(kvi_slots_expire(s, 1300 * SEC + 1), 1);
    struct kvi_slots_load l = load_of(s, 1, 0);
    assert_int_equal(l.active_requests, 2);
    assert_int_equal(l.active_prefill_tokens, 50);
    assert_int_equal(l.active_decode_blocks, 3); /* (1), (1 3), (4) */
    assert_int_equal(pdone(s, "r0"), -ENOENT);
    assert_int_equal(fin(s, "r0"), 0); /* forgotten: free stays idempotent */
    /* an earlier time removes nothing; a clock behind the add never underflows */
    assert_int_equal(kvi_slots_expire(s, 0), 0);
    assert_int_equal(kvi_slots_expire(s, 1450 * SEC), 1);
    assert_int_equal(load_of(s, 1, 0).active_requests, 1);

    /* an /add expires the tracker's stale requests lazily */
    clock = 1501 * SEC; /* r2 added at 1200 s */
    assert_int_equal(add(s, "r3", 1, 0, (uint64_t[]){4}, 1, 0), 0);
    l = load_of(s, 1, 0);
    assert_int_equal(l.active_requests, 1);
    assert_int_equal(l.active_prefill_tokens, 0);
    assert_int_equal(l.active_decode_blocks, 1);
    assert_int_equal(pdone(s, "r2"), -ENOENT);

    /* a stale duplicate id is still a conflict (checked before cleanup, as in
     * the reference), and the cleanup then runs on the next good add */
    clock = 1900 * SEC;
    assert_int_equal(add(s, "r3", 1, 0, NULL, 0, 0), -EEXIST);
    assert_int_equal(add(s, "r4", 1, 0, NULL, 0, 0), 0);
    assert_int_equal(pdone(s, "r3"), -ENOENT);

    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.expired, 4);
    assert_int_equal(st.requests, 1);
    kvi_slots_destroy(s);

    /* a configured age */
    clock = 0;
    cfg.stale_after_ns = 5 * SEC;
    s = kvi_slots_create(&cfg);
    assert_int_equal(reg(s, "m", "default", 1, 16, 0, 1), 0);
    clock = 10 * SEC;
    assert_int_equal(add(s, "r", 1, 0, NULL, 0, 0), 0);
    assert_int_equal(kvi_slots_expire(s, 15 * SEC), 0);
    assert_int_equal(kvi_slots_expire(s, 15 * SEC + 1), 1);
    kvi_slots_destroy(s);
}

/* ---- replica events and the event hook ---------------------------------------------------- */

struct rec {
    int n;
    struct kvi_slots_event ev[16];
    char ids[16][32];
    char model[16][16];
    char tenant[16][16];
    uint64_t hashes[16][4];
};

static void record(void *ctx, const struct kvi_slots_event *ev)
{
    struct rec *r = ctx;
    assert_true(r->n < 16);
    struct kvi_slots_event *e = &r->ev[r->n];
    *e = *ev;
    snprintf(r->ids[r->n], 32, "%.*s", (int)ev->req.request_id_len, ev->req.request_id);
    snprintf(r->model[r->n], 16, "%.*s", (int)ev->req.key.model_len, ev->req.key.model);
    snprintf(r->tenant[r->n], 16, "%.*s", (int)ev->req.key.tenant_len, ev->req.key.tenant);
    for (size_t i = 0; i < ev->req.n_hashes && i < 4; i++)
        r->hashes[r->n][i] = ev->req.hashes[i];
    e->req.request_id = r->ids[r->n];
    e->req.key.model = r->model[r->n];
    e->req.key.tenant = r->tenant[r->n];
    e->req.hashes = r->hashes[r->n];
    r->n++;
}

static struct kvi_slots_event EV(enum kvi_slots_event_type type, const char *tenant,
                                 uint32_t bs, const char *id, uint64_t w, uint32_t rank,
                                 const uint64_t *h, size_t n, uint64_t isl)
{
    return (struct kvi_slots_event){type, bs, R("model", tenant, id, w, rank, h, n, isl)};
}

static void test_replica_events(void **state)
{
    (void)state;
    struct rec rec = {0};
    struct kvi_slots_config cfg = {.on_event = record, .event_ctx = &rec};
    struct kvi_slots *s = kvi_slots_create(&cfg);
    assert_int_equal(reg(s, "model", "default", 1, 16, 0, 2), 0);
    uint64_t h[] = {1, 2, 3};

    /* the reference's replica_dispatch_requires_registered_worker_and_matching_configuration */
    struct kvi_slots_event e = EV(KVI_SLOTS_EV_ADD, "default", 16, "replica-request", 1, 2, h, 3, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -ENOENT); /* unknown rank */
    e = EV(KVI_SLOTS_EV_ADD, "default", 16, "replica-request", 2, 0, h, 3, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -ENOENT); /* unknown worker */
    e = EV(KVI_SLOTS_EV_ADD, "default", 32, "replica-request", 1, 0, h, 3, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -ENOENT); /* block size */
    e = EV(KVI_SLOTS_EV_ADD, "other", 16, "replica-request", 1, 0, h, 3, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -ENOENT); /* unknown tenant */
    struct kvi_slots_load l[4];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(s, NULL, l, 4), 2); /* nothing was created */
    assert_int_equal(kvi_slots_workers(s, NULL, NULL, 0), 1);
    kvi_rcu_read_unlock();
    assert_int_equal(l[0].active_decode_blocks, 0);

    e = EV(KVI_SLOTS_EV_ADD, "default", 16, "replica-request", 1, 0, h, 3, 12);
    assert_int_equal(kvi_slots_apply_replica(s, &e), 0);
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(s, NULL, l, 4), 2);
    kvi_rcu_read_unlock();
    assert_int_equal(l[0].active_decode_blocks, 3);
    assert_int_equal(l[0].active_prefill_tokens, 12);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -EEXIST); /* duplicate add */

    /* prefill_complete / free must name the request's own rank */
    e = EV(KVI_SLOTS_EV_FREE, "default", 16, "replica-request", 1, 1, NULL, 0, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -ENOENT);
    e = EV(KVI_SLOTS_EV_PREFILL_COMPLETE, "default", 16, "replica-request", 1, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), 0);
    kvi_rcu_read_lock();
    kvi_slots_loads(s, NULL, l, 4);
    kvi_rcu_read_unlock();
    assert_int_equal(l[0].active_prefill_tokens, 0);
    assert_int_equal(l[0].active_decode_blocks, 3);
    e = EV(KVI_SLOTS_EV_FREE, "default", 16, "replica-request", 1, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -ENOENT); /* unknown request now */
    e = EV(KVI_SLOTS_EV_PREFILL_COMPLETE, "default", 16, "nope", 1, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), -ENOENT);
    kvi_rcu_read_lock();
    kvi_slots_loads(s, NULL, l, 4);
    kvi_rcu_read_unlock();
    assert_int_equal(l[0].active_decode_blocks + l[0].active_requests, 0);

    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.replica_applied, 3);
    assert_int_equal(st.replica_dropped_worker, 2);
    assert_int_equal(st.replica_dropped_block_size, 1);
    assert_int_equal(st.replica_dropped_tracker, 1);
    assert_int_equal(st.replica_dropped_duplicate, 1);
    assert_int_equal(st.replica_dropped_request, 3);
    /* replica traffic is never re-announced */
    assert_int_equal(rec.n, 0);
    assert_int_equal(st.events_emitted, 0);

    /* a replica add and a local add share the request-id space */
    e = EV(KVI_SLOTS_EV_ADD, "default", 16, "shared", 1, 1, h, 1, 0);
    assert_int_equal(kvi_slots_apply_replica(s, &e), 0);
    struct kvi_slots_request r = R("model", "default", "shared", 1, 0, h, 1, 0);
    assert_int_equal(kvi_slots_add(s, &r, NULL), -EEXIST);
    assert_int_equal(kvi_slots_free(s, &r, NULL), 0); /* local free of a replica's request */
    assert_int_equal(rec.n, 1);
    assert_int_equal(rec.ev[0].type, KVI_SLOTS_EV_FREE);
    assert_int_equal(rec.ev[0].req.dp_rank, 1);
    kvi_slots_destroy(s);
}

static void test_event_hook(void **state)
{
    (void)state;
    struct rec rec = {0};
    uint64_t clock = 0;
    struct kvi_slots_config cfg = {.on_event = record, .event_ctx = &rec, .now_ns = fake_now,
                                   .clock_ctx = &clock};
    struct kvi_slots *s = kvi_slots_create(&cfg);
    assert_int_equal(reg(s, "model", "t", 4, 32, 2, 2), 0);
    uint64_t h[] = {(uint64_t)-1, 7};
    struct kvi_slots_request r = R("model", "t", "q1", 4, 3, h, 2, 99);
    assert_int_equal(kvi_slots_add(s, &r, NULL), 0);
    assert_int_equal(kvi_slots_add(s, &r, NULL), -EEXIST); /* failures are not announced */
    r = R("model", "t", "q1", 0, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_prefill_complete(s, &r, NULL), 0);
    r = R("model", "t", "unknown", 0, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_free(s, &r, NULL), 0); /* nothing freed: no event */
    r = R("model", "t", "q1", 0, 0, NULL, 0, 0);
    assert_int_equal(kvi_slots_free(s, &r, NULL), 0);
    r = R("model", "t", "q2", 4, 2, NULL, 0, 0);
    assert_int_equal(kvi_slots_add(s, &r, NULL), 0);
    clock = 400 * SEC;
    assert_int_equal(kvi_slots_expire(s, clock), 1); /* expiry is not announced */
    r = R("model", "t", "q3", 4, 2, NULL, 0, 0);
    assert_int_equal(kvi_slots_add(s, &r, NULL), 0);
    assert_int_equal(kvi_slots_unregister(s, KP("model", "t"), 4, NULL), 0); /* nor this */

    assert_int_equal(rec.n, 5);
    assert_int_equal(rec.ev[0].type, KVI_SLOTS_EV_ADD);
    assert_int_equal(rec.ev[0].block_size, 32);
    assert_string_equal(rec.ev[0].req.key.model, "model");
    assert_memory_equal(rec.ev[0].req.key.tenant, "t", 1);
    assert_string_equal(rec.ev[0].req.request_id, "q1");
    assert_int_equal(rec.ev[0].req.worker_id, 4);
    assert_int_equal(rec.ev[0].req.dp_rank, 3);
    assert_int_equal(rec.ev[0].req.n_hashes, 2);
    assert_true(rec.ev[0].req.hashes[0] == UINT64_MAX);
    assert_int_equal(rec.ev[0].req.hashes[1], 7);
    assert_int_equal(rec.ev[0].req.new_isl_tokens, 99);
    assert_int_equal(rec.ev[1].type, KVI_SLOTS_EV_PREFILL_COMPLETE);
    assert_int_equal(rec.ev[1].req.worker_id, 4);
    assert_int_equal(rec.ev[1].req.dp_rank, 3);
    assert_int_equal(rec.ev[2].type, KVI_SLOTS_EV_FREE);
    assert_string_equal(rec.ev[2].req.request_id, "q1");
    assert_int_equal(rec.ev[2].req.dp_rank, 3);
    assert_int_equal(rec.ev[3].type, KVI_SLOTS_EV_ADD);
    assert_string_equal(rec.ev[4].req.request_id, "q3");

    /* the events replay into a peer with the same registrations */
    struct kvi_slots *peer = kvi_slots_create(NULL);
    assert_int_equal(reg(peer, "model", "t", 4, 32, 2, 2), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(kvi_slots_apply_replica(peer, &rec.ev[i]), 0);
    struct kvi_slots_load l[4];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(peer, NULL, l, 4), 2);
    kvi_rcu_read_unlock();
    assert_int_equal(l[1].active_decode_blocks, 2);
    assert_int_equal(l[1].active_prefill_tokens, 0);
    assert_int_equal(kvi_slots_apply_replica(peer, &rec.ev[2]), 0);
    kvi_rcu_read_lock();
    kvi_slots_loads(peer, NULL, l, 4);
    kvi_rcu_read_unlock();
    assert_int_equal(l[1].active_decode_blocks + l[1].active_requests, 0);
    kvi_slots_destroy(peer);
    kvi_slots_destroy(s);
}

/* ---- randomized differential test against a brute-force model --------------------------------- */

#define DM_RANKS 5
#define DM_MAXLEN 12
#define DM_REQS 600

struct dm_req {
    bool live;
    uint32_t rank;
    size_t n;
    uint64_t h[DM_MAXLEN];
    uint64_t isl;
    bool prefill_open;
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Number of distinct prefixes held by the model's rank. */
static uint64_t dm_blocks(const struct dm_req *m, uint32_t rank)
{
    uint64_t count = 0;
    for (size_t i = 0; i < DM_REQS; i++) {
        if (!m[i].live || m[i].rank != rank)
            continue;
        for (size_t d = 1; d <= m[i].n; d++) {
            /* counted at its first holder (lowest index) */
            bool earlier = false;
            for (size_t j = 0; j < i && !earlier; j++)
                earlier = m[j].live && m[j].rank == rank && m[j].n >= d &&
                          memcmp(m[j].h, m[i].h, d * sizeof(uint64_t)) == 0;
            count += !earlier;
        }
    }
    return count;
}

static uint64_t dm_overlap(const struct dm_req *m, uint32_t rank, const uint64_t *q, size_t n)
{
    uint64_t best = 0;
    for (size_t i = 0; i < DM_REQS; i++) {
        if (!m[i].live || m[i].rank != rank)
            continue;
        size_t k = 0;
        while (k < n && k < m[i].n && m[i].h[k] == q[k])
            k++;
        best = k > best ? k : best;
    }
    return best;
}

static void dm_check(struct kvi_slots *s, const struct dm_req *m)
{
    struct kvi_slots_load l[DM_RANKS];
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_loads(s, NULL, l, DM_RANKS), DM_RANKS);
    kvi_rcu_read_unlock();
    for (uint32_t r = 0; r < DM_RANKS; r++) {
        uint64_t prefill = 0, reqs = 0;
        for (size_t i = 0; i < DM_REQS; i++)
            if (m[i].live && m[i].rank == r) {
                reqs++;
                prefill += m[i].prefill_open ? m[i].isl : 0;
            }
        assert_int_equal(l[r].dp_rank, r);
        assert_int_equal(l[r].active_requests, reqs);
        assert_int_equal(l[r].active_prefill_tokens, prefill);
        assert_int_equal(l[r].active_decode_blocks, dm_blocks(m, r));
    }
    for (int k = 0; k < 20; k++) {
        uint64_t q[DM_MAXLEN + 2];
        size_t n = (size_t)(rnd() % (DM_MAXLEN + 3));
        const struct dm_req *base = &m[rnd() % DM_REQS];
        for (size_t i = 0; i < n; i++)
            q[i] = i < base->n && rnd() % 8 != 0 ? base->h[i] : rnd() % 3;
        struct kvi_slots_potential p[DM_RANKS];
        uint64_t isl = rnd() % 100;
        assert_int_equal(potential(s, q, n, isl, p, DM_RANKS), DM_RANKS);
        for (uint32_t r = 0; r < DM_RANKS; r++) {
            uint64_t ov = dm_overlap(m, r, q, n);
            assert_int_equal(p[r].overlap_blocks, ov);
            assert_int_equal(p[r].potential_decode_blocks, l[r].active_decode_blocks + n - ov);
            assert_int_equal(p[r].potential_prefill_tokens, l[r].active_prefill_tokens + isl);
        }
    }
}

static void test_differential(void **state)
{
    struct kvi_slots *s = *state;
    static struct dm_req m[DM_REQS];
    memset(m, 0, sizeof(m));
    assert_int_equal(reg(s, "m", "default", 0, 16, 0, DM_RANKS), 0);
    char id[32];
    for (int step = 0; step < 30000; step++) {
        size_t i = rnd() % DM_REQS;
        snprintf(id, sizeof(id), "req-%zu", i);
        unsigned op = (unsigned)(rnd() % 10);
        if (!m[i].live && op < 6) {
            /* few distinct values: plenty of shared prefixes and repeats */
            m[i].rank = (uint32_t)(rnd() % DM_RANKS);
            m[i].n = (size_t)(rnd() % (DM_MAXLEN + 1));
            for (size_t k = 0; k < m[i].n; k++)
                m[i].h[k] = rnd() % 3;
            m[i].isl = rnd() % 4 == 0 ? 0 : rnd() % 1000;
            m[i].prefill_open = m[i].isl > 0;
            m[i].live = true;
            assert_int_equal(add(s, id, 0, m[i].rank, m[i].h, m[i].n, m[i].isl), 0);
        } else if (m[i].live && op < 3) {
            assert_int_equal(add(s, id, 0, m[i].rank, m[i].h, m[i].n, m[i].isl), -EEXIST);
        } else if (op < 8) {
            assert_int_equal(fin(s, id), 0);
            m[i].live = false;
        } else {
            assert_int_equal(pdone(s, id), m[i].live ? 0 : -ENOENT);
            m[i].prefill_open = false;
        }
        if (step % 3000 == 2999)
            dm_check(s, m);
    }
    dm_check(s, m);
    kvi_slots_expire(s, 0); /* reclaims */
    for (size_t i = 0; i < DM_REQS; i++) {
        snprintf(id, sizeof(id), "req-%zu", i);
        assert_int_equal(fin(s, id), 0);
        m[i].live = false;
    }
    dm_check(s, m);
    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.nodes, 0);
    assert_int_equal(st.requests, 0);
}

/* Issue 18: a bounded number of trackers; a new (model, tenant) past the cap is
 * refused (-ENOSPC, counted), existing trackers still take workers, and a
 * deleted tracker frees its place. */
static void test_tracker_cap(void **state)
{
    (void)state;
    struct kvi_slots_config cfg = {.max_trackers = 2};
    struct kvi_slots *s = kvi_slots_create(&cfg);
    struct kvi_slots_err why;
    assert_int_equal(kvi_slots_register(s, KP("a", "default"), 1, 16, 0, 1, &why), 0);
    assert_int_equal(kvi_slots_register(s, KP("b", "default"), 1, 16, 0, 1, &why), 0);
    assert_int_equal(kvi_slots_register(s, KP("c", "default"), 7, 16, 0, 1, &why), -ENOSPC);
    assert_int_equal(why.why, KVI_SLOTS_E_TOO_MANY_TRACKERS);
    assert_int_equal(why.trackers, 2);
    assert_int_equal(why.max_trackers, 2);
    assert_int_equal(why.worker_id, 7);
    assert_int_equal(kvi_slots_register(s, KP("a", "t2"), 1, 16, 0, 1, &why), -ENOSPC); /* per pair */
    /* conflicts on an existing tracker come first; existing trackers grow */
    assert_int_equal(kvi_slots_register(s, KP("a", "default"), 1, 16, 0, 1, &why), -EEXIST);
    assert_int_equal(kvi_slots_register(s, KP("a", "default"), 2, 16, 0, 1, &why), 0);
    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.trackers, 2);
    assert_int_equal(st.refused_trackers, 2);
    assert_int_equal(st.refused_ranks, 0);
    assert_int_equal(kvi_slots_unregister(s, KP("b", "default"), 1, &why), 0);
    assert_int_equal(kvi_slots_register(s, KP("c", "default"), 7, 16, 0, 1, &why), 0);
    kvi_slots_destroy(s);
}

/* Issue 18: dp_size past max_dp_size is refused before anything is created;
 * the default is KVI_SLOTS_MAX_DP_SIZE. */
static void test_dp_size_cap(void **state)
{
    struct kvi_slots *d = *state;
    struct kvi_slots_err why;
    assert_int_equal(kvi_slots_register(d, KP("m", "default"), 1, 16, 0, KVI_SLOTS_MAX_DP_SIZE + 1, &why),
                     -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_DP_SIZE_LIMIT);
    assert_int_equal(why.max_dp_size, KVI_SLOTS_MAX_DP_SIZE);
    assert_int_equal(kvi_slots_register(d, KP("m", "default"), 1, 16, 0, 65536, &why), -EINVAL);
    assert_int_equal(why.dp_size, 65536);

    struct kvi_slots_config cfg = {.max_dp_size = 4};
    struct kvi_slots *s = kvi_slots_create(&cfg);
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 3, 16, 10, 5, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_DP_SIZE_LIMIT);
    assert_int_equal(why.worker_id, 3);
    assert_int_equal(why.dp_start, 10);
    assert_int_equal(why.dp_size, 5);
    assert_int_equal(why.max_dp_size, 4);
    /* checked before the other rules (block size 0 and dp_size 0 still first) */
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 3, 0, 10, 5, &why), -EINVAL);
    assert_int_equal(why.why, KVI_SLOTS_E_BLOCK_SIZE);
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_workers(s, NULL, NULL, 0), 0); /* no tracker was left behind */
    kvi_rcu_read_unlock();
    assert_int_equal(kvi_slots_register(s, KP("m", "default"), 3, 16, 10, 4, &why), 0);
    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.refused_ranks, 1);
    assert_int_equal(st.ranks, 4);
    kvi_slots_destroy(s);
}

/*
 * One paged listing of the slot tracker (/loads or /workers): its whole
 * listing, one page after a position, the check that a page entry equals the
 * listing's, and the position after an entry (@p cap: the page size).
 */
struct paged {
    size_t elem; /* sizeof one entry */
    size_t (*all)(const struct kvi_slots *s, const struct kvi_slots_key *f, void *out, size_t cap);
    size_t (*page)(const struct kvi_slots *s, const struct kvi_slots_key *f, const struct kvi_slots_pos *after,
                   void *out, size_t cap);
    void (*expect_same)(const void *page_entry, const void *listed);
    struct kvi_slots_pos (*after)(const void *last, size_t cap);
};

/*
 * Walking @p p's pages with any page size from the start, resuming after the
 * last entry, yields exactly its whole listing, for each of @p nf filters
 * (filters[0]: no filter, NULL).
 */
static void expect_paged_walk(struct kvi_slots *s, const struct paged *p, const struct kvi_slots_key *filters,
                              size_t nf)
{
    union {
        struct kvi_slots_load load[32];
        struct kvi_slots_worker worker[32];
    } all_, page_;
    char *all = (char *)&all_, *page = (char *)&page_;
    assert_true(p->elem * 32 <= sizeof all_);
    for (size_t fi = 0; fi < nf; fi++) {
        const struct kvi_slots_key *f = fi == 0 ? NULL : &filters[fi];
        kvi_rcu_read_lock();
        size_t n = p->all(s, f, all, 32);
        assert_true(n <= 32);
        for (size_t cap = 1; cap <= n + 1; cap++) {
            struct kvi_slots_pos after;
            size_t got = 0, k;
            bool first = true;
            do {
                k = p->page(s, f, first ? NULL : &after, page, cap);
                assert_true(k <= cap);
                for (size_t i = 0; i < k; i++, got++) {
                    assert_true(got < n);
                    p->expect_same(page + i * p->elem, all + got * p->elem);
                }
                if (k > 0) {
                    after = p->after(page + (k - 1) * p->elem, cap);
                    first = false;
                }
            } while (k == cap);
            assert_int_equal(got, n);
        }
        kvi_rcu_read_unlock();
    }
}

static size_t loads_all(const struct kvi_slots *s, const struct kvi_slots_key *f, void *out, size_t cap)
{
    return kvi_slots_loads(s, f, out, cap);
}

static size_t loads_page(const struct kvi_slots *s, const struct kvi_slots_key *f, const struct kvi_slots_pos *after,
                         void *out, size_t cap)
{
    return kvi_slots_loads_page(s, f, after, out, cap);
}

static void loads_same(const void *x, const void *y)
{
    const struct kvi_slots_load *a = x, *b = y;
    assert_int_equal(a->model_len, b->model_len);
    assert_memory_equal(a->model, b->model, b->model_len);
    assert_int_equal(a->tenant_len, b->tenant_len);
    assert_memory_equal(a->tenant, b->tenant, b->tenant_len);
    assert_int_equal(a->worker_id, b->worker_id);
    assert_int_equal(a->dp_rank, b->dp_rank);
}

static struct kvi_slots_pos loads_after(const void *x, size_t cap)
{
    const struct kvi_slots_load *l = x;
    (void)cap;
    return (struct kvi_slots_pos){{l->model, l->model_len, l->tenant, l->tenant_len}, l->worker_id, l->dp_rank};
}

static const struct paged loads_paged = {sizeof(struct kvi_slots_load), loads_all, loads_page, loads_same,
                                         loads_after};

static size_t workers_all(const struct kvi_slots *s, const struct kvi_slots_key *f, void *out, size_t cap)
{
    return kvi_slots_workers(s, f, out, cap);
}

static size_t workers_page(const struct kvi_slots *s, const struct kvi_slots_key *f,
                           const struct kvi_slots_pos *after, void *out, size_t cap)
{
    return kvi_slots_workers_page(s, f, after, out, cap);
}

static void workers_same(const void *x, const void *y)
{
    const struct kvi_slots_worker *a = x, *b = y;
    assert_int_equal(a->model_len, b->model_len);
    assert_memory_equal(a->model, b->model, b->model_len);
    assert_int_equal(a->tenant_len, b->tenant_len);
    assert_memory_equal(a->tenant, b->tenant, b->tenant_len);
    assert_int_equal(a->worker_id, b->worker_id);
    assert_int_equal(a->block_size, b->block_size);
    assert_int_equal(a->dp_start, b->dp_start);
    assert_int_equal(a->dp_size, b->dp_size);
}

/* The position's dp_rank is ignored by /workers: give it junk. */
static struct kvi_slots_pos workers_after(const void *x, size_t cap)
{
    const struct kvi_slots_worker *w = x;
    return (struct kvi_slots_pos){{w->model, w->model_len, w->tenant, w->tenant_len}, w->worker_id,
                                  (uint32_t)(cap * 7919u)};
}

static const struct paged workers_paged = {sizeof(struct kvi_slots_worker), workers_all, workers_page, workers_same,
                                           workers_after};

/* Issue 18: /loads pages: walking kvi_slots_loads_page with any page size
 * from the start, resuming after the last entry, yields exactly
 * kvi_slots_loads' listing, with and without filters. */
static void test_loads_page(void **state)
{
    struct kvi_slots *s = *state;
    assert_int_equal(reg(s, "b", "default", 9, 16, 0, 3), 0);
    assert_int_equal(reg(s, "b", "default", 2, 16, 5, 2), 0);
    assert_int_equal(reg(s, "a", "t", 4, 16, 0, 1), 0);
    assert_int_equal(reg(s, "a", "default", 4, 16, 0, 2), 0);
    assert_int_equal(reg(s, "c", "default", 1, 16, 0, 4), 0);
    const struct kvi_slots_key filters[] = {{NULL, 0, NULL, 0}, K("b", NULL), K(NULL, "default"), K("zz", NULL)};
    expect_paged_walk(s, &loads_paged, filters, 4);
    /* a cursor naming a tracker or rank that no longer exists resumes after its place */
    struct kvi_slots_load page[32];
    struct kvi_slots_pos gone = {K("b", "default"), 3, 0};
    kvi_rcu_read_lock();
    size_t k = kvi_slots_loads_page(s, NULL, &gone, page, 32);
    kvi_rcu_read_unlock();
    assert_int_equal(k, 3 + 4); /* b's worker 9, then c */
    assert_int_equal(page[0].worker_id, 9);
    assert_int_equal(page[0].dp_rank, 0);
    gone = (struct kvi_slots_pos){K("bb", "x"), 0, 0};
    kvi_rcu_read_lock();
    k = kvi_slots_loads_page(s, NULL, &gone, page, 32);
    kvi_rcu_read_unlock();
    assert_int_equal(k, 4);
    assert_memory_equal(page[0].model, "c", 1);
}

/* Issue 18, /workers: walking kvi_slots_workers_page with any page size from
 * the start, resuming after the last entry, yields exactly kvi_slots_workers'
 * listing, with and without filters; the position's dp_rank is ignored. */
static void test_workers_page(void **state)
{
    struct kvi_slots *s = *state;
    assert_int_equal(reg(s, "b", "default", 9, 16, 0, 3), 0);
    assert_int_equal(reg(s, "b", "default", 2, 16, 5, 2), 0);
    assert_int_equal(reg(s, "a", "t", 4, 32, 0, 1), 0);
    assert_int_equal(reg(s, "a", "default", 4, 16, 0, 2), 0);
    assert_int_equal(reg(s, "a", "default", 7, 16, 2, 1), 0);
    assert_int_equal(reg(s, "c", "default", 1, 8, 0, 4), 0);
    assert_int_equal(reg(s, "c", "default", UINT64_MAX, 8, 0, 1), 0); /* resuming after it must not wrap */
    const struct kvi_slots_key filters[] = {{NULL, 0, NULL, 0}, K("b", NULL), K(NULL, "default"), K("zz", NULL),
                                            K("a", "default")};
    expect_paged_walk(s, &workers_paged, filters, 5);
    /* a position naming a tracker or worker that no longer exists resumes after its place */
    struct kvi_slots_worker page[32];
    struct kvi_slots_pos gone = {K("b", "default"), 3, 0};
    kvi_rcu_read_lock();
    size_t k = kvi_slots_workers_page(s, NULL, &gone, page, 32);
    assert_int_equal(k, 1 + 2); /* b's worker 9, then c's two */
    assert_int_equal(page[0].worker_id, 9);
    assert_int_equal(page[2].worker_id, UINT64_MAX);
    gone = (struct kvi_slots_pos){K("bb", "x"), 0, 0};
    k = kvi_slots_workers_page(s, NULL, &gone, page, 32);
    assert_int_equal(k, 2);
    assert_memory_equal(page[0].model, "c", 1);
    assert_int_equal(page[0].worker_id, 1);
    gone = (struct kvi_slots_pos){K("c", "default"), UINT64_MAX, 0}; /* the last worker: nothing follows */
    assert_int_equal(kvi_slots_workers_page(s, NULL, &gone, page, 32), 0);
    assert_int_equal(kvi_slots_workers_page(s, NULL, NULL, page, 0), 0);
    kvi_rcu_read_unlock();
}

/* /workers pages across writes between them: a worker unchanged during the
 * walk is listed exactly once; one registered behind the position is not seen,
 * one registered ahead of it is; one removed (the position's own included) is
 * not repeated and the walk resumes after its place. */
static void test_workers_page_changes(void **state)
{
    struct kvi_slots *s = *state;
    for (uint64_t w = 10; w <= 100; w += 10)
        assert_int_equal(reg(s, "m", "default", w, 16, 0, 1), 0);
    assert_int_equal(reg(s, "n", "default", 1, 16, 0, 1), 0);
    struct kvi_slots_worker page[4];
    struct kvi_slots_pos after;
    uint64_t seen[64];
    char seen_m[64];
    size_t n_seen = 0, k;
    bool first = true;
    for (int round = 0;; round++) {
        kvi_rcu_read_lock();
        k = kvi_slots_workers_page(s, NULL, first ? NULL : &after, page, 3);
        for (size_t i = 0; i < k; i++) {
            assert_true(n_seen < 64);
            seen_m[n_seen] = page[i].model[0];
            seen[n_seen++] = page[i].worker_id;
        }
        char m = k > 0 ? page[k - 1].model[0] : 0;
        if (k > 0)
            after = (struct kvi_slots_pos){K(m == 'm' ? "m" : m == 'n' ? "n" : "z", "default"),
                                           page[k - 1].worker_id, 0};
        kvi_rcu_read_unlock();
        first = false;
        if (k < 3)
            break;
        if (round == 0) { /* after 10, 20, 30 */
            assert_int_equal(reg(s, "m", "default", 5, 16, 0, 1), 0);   /* behind: not seen */
            assert_int_equal(reg(s, "m", "default", 35, 16, 0, 1), 0);  /* ahead: seen */
            assert_int_equal(reg(s, "a", "default", 1, 16, 0, 1), 0);   /* a tracker behind: not seen */
            assert_int_equal(reg(s, "z", "default", 1, 16, 0, 1), 0);   /* a tracker ahead: seen */
            assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 20, NULL), 0); /* seen already */
            assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 50, NULL), 0); /* ahead: not seen */
            assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 30, NULL), 0); /* the position */
        } else if (round == 1) { /* after 35, 40, 60 */
            assert_int_equal(kvi_slots_unregister(s, KP("m", "default"), 60, NULL), 0);
            assert_int_equal(reg(s, "m", "default", 60, 16, 0, 2), 0); /* re-registered at the position */
        }
    }
    const char exp_m[] = {'m', 'm', 'm', 'm', 'm', 'm', 'm', 'm', 'm', 'm', 'n', 'z'};
    const uint64_t exp_w[] = {10, 20, 30, 35, 40, 60, 70, 80, 90, 100, 1, 1};
    assert_int_equal(n_seen, sizeof(exp_w) / sizeof(exp_w[0]));
    for (size_t i = 0; i < n_seen; i++) {
        assert_int_equal(seen_m[i], exp_m[i]);
        assert_int_equal(seen[i], exp_w[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_register_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_register_expands_range_and_conflicts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rank_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_scoped_filtered_sorted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_with_nul_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unregister, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lifecycle_statuses_and_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefill_accounting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_prefix_accounting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_semantics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_potential_drop_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_cleanup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replica_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_differential, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tracker_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dp_size_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loads_page, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_page, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_page_changes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
