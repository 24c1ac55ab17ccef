/*
 * Slot tracker under concurrency: reader threads compute /loads and
 * /potential_loads without locks while a writer adds, completes and frees
 * requests and (un)registers a worker. Checks what must hold whatever the
 * interleaving:
 *   - a rank nobody touches is read exactly (blocks, requests, overlap);
 *   - a rank that always holds a prefix is never credited with less of it;
 *   - every projection is consistent with the counters read with it;
 *   - no use after free (ASan) and no data race (TSan) in the RCU protocol.
 * At the end the state is checked exactly against the writer's bookkeeping.
 * The file includes engine/slots.c to reach the two overlap walks and check
 * that the conservative one (taken when a write overlapped a read) agrees
 * with the fast one on quiet states.
 */
/* ctest-labels: stress tsan */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine/common.h"
#include "engine/rcu.h"
#include "engine/slots.c" /* static walk_fast / walk_slow */

#define PIN 16        /* blocks of the pinned prefix */
#define TAIL 8        /* at most this many blocks after it */
#define LIVE 256      /* request ids in rotation */
#define READERS 2
#define RUN_NS (1500ull * 1000000ull)

static const struct kvi_slots_key KEY = {"m", 1, "default", 7};
static uint64_t pinned[PIN];

struct shared {
    struct kvi_slots *s;
    _Atomic bool stop;
    _Atomic uint64_t reads[READERS]; /* completed, per reader: the writer waits on them */
    _Atomic int failures;
    char failure[256];
};

struct reader_arg {
    struct shared *sh;
    uint32_t id;
};

static void report(struct shared *sh, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(struct shared *sh, const char *fmt, ...)
{
    if (atomic_fetch_add(&sh->failures, 1) != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->failure, sizeof(sh->failure), fmt, ap);
    va_end(ap);
}

#define ULL(x) ((unsigned long long)(x))

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void *reader(void *arg)
{
    const struct reader_arg *ra = arg;
    struct shared *sh = ra->sh;
    kvi_rcu_register_thread();
    uint64_t rng = 0x1234567ull + (uint64_t)(uintptr_t)&rng;
    struct kvi_slots_potential p[16];
    struct kvi_slots_load l[16];
    uint64_t q[PIN + TAIL];
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        size_t n = PIN + (size_t)(xorshift(&rng) % (TAIL + 1));
        memcpy(q, pinned, sizeof(pinned));
        for (size_t i = PIN; i < n; i++)
            q[i] = xorshift(&rng) % 3;
        uint64_t isl = xorshift(&rng) % 64;
        size_t n_out = 0;
        kvi_rcu_read_lock();
        int rc = kvi_slots_potential_loads(sh->s, &KEY, q, n, isl, p, 16, &n_out);
        size_t nl = kvi_slots_loads(sh->s, &KEY, l, 16);
        kvi_rcu_read_unlock();
        if (rc != 0) {
            report(sh, "potential_loads returned %d", rc);
            break;
        }
        for (size_t i = 0; i < n_out; i++) {
            const struct kvi_slots_potential *x = &p[i];
            if (x->overlap_blocks > n)
                report(sh, "overlap %llu above the query length %llu", ULL(x->overlap_blocks), ULL(n));
            if (x->potential_decode_blocks != x->active_decode_blocks + n - x->overlap_blocks)
                report(sh, "inconsistent projection on worker %llu rank %llu", ULL(x->worker_id),
                       ULL(x->dp_rank));
            if (x->potential_prefill_tokens != x->active_prefill_tokens + isl)
                report(sh, "inconsistent prefill on worker %llu rank %llu", ULL(x->worker_id),
                       ULL(x->dp_rank));
            /* worker 2 holds the pinned prefix only and nobody touches it */
            if (x->worker_id == 2 &&
                (x->overlap_blocks != PIN || x->active_decode_blocks != PIN ||
                 x->active_requests != 1 || x->active_prefill_tokens != 0))
                report(sh, "untouched rank read as overlap %llu blocks %llu", ULL(x->overlap_blocks),
                       ULL(x->active_decode_blocks));
            /* worker 1 rank 0 always holds the pinned prefix, among others */
            if (x->worker_id == 1 && x->dp_rank == 0 && x->overlap_blocks < PIN)
                report(sh, "pinned prefix under-credited: %llu of %d", ULL(x->overlap_blocks), PIN);
        }
        if (n_out != 5 && n_out != 7)
            report(sh, "unexpected rank count %zu", n_out);
        if (nl != 5 && nl != 7)
            report(sh, "unexpected load count %zu", nl);
        for (size_t i = 0; i < nl && i < 16; i++)
            if (l[i].worker_id == 2 && (l[i].active_decode_blocks != PIN || l[i].active_requests != 1))
                report(sh, "untouched rank's load %llu blocks %llu requests",
                       ULL(l[i].active_decode_blocks), ULL(l[i].active_requests));
        atomic_fetch_add_explicit(&sh->reads[ra->id], 1, memory_order_relaxed);
    }
    kvi_rcu_unregister_thread();
    return NULL;
}

/* Every reader has completed two reads since reads0 was taken (or one failed). */
static bool readers_progressed(struct shared *sh, const uint64_t *reads0)
{
    if (atomic_load(&sh->failures) != 0)
        return true;
    for (int i = 0; i < READERS; i++)
        if (atomic_load(&sh->reads[i]) < reads0[i] + 2)
            return false;
    return true;
}

struct live_req {
    bool live;
    uint64_t worker;
    uint32_t rank;
};

static void test_readers_during_writes(void **state)
{
    (void)state;
    for (int i = 0; i < PIN; i++)
        pinned[i] = 1000 + (uint64_t)i;
    static struct shared sh; /* static, as ra: readers still run if an assert below fails */
    memset(&sh, 0, sizeof sh);
    sh.s = kvi_slots_create(NULL);
    assert_non_null(sh.s);
    struct kvi_slots *s = sh.s;
    assert_int_equal(kvi_slots_register(s, &KEY, 1, 16, 0, 4, NULL), 0);
    assert_int_equal(kvi_slots_register(s, &KEY, 2, 16, 0, 1, NULL), 0);
    struct kvi_slots_request pin = {KEY, "pin1", 4, 1, 0, pinned, PIN, 0};
    assert_int_equal(kvi_slots_add(s, &pin, NULL), 0);
    pin = (struct kvi_slots_request){KEY, "pin2", 4, 2, 0, pinned, PIN, 0};
    assert_int_equal(kvi_slots_add(s, &pin, NULL), 0);

    pthread_t th[READERS];
    static struct reader_arg ra[READERS];
    uint64_t reads0[READERS];
    for (int i = 0; i < READERS; i++) {
        ra[i] = (struct reader_arg){&sh, (uint32_t)i};
        reads0[i] = 0;
        assert_int_equal(pthread_create(&th[i], NULL, reader, &ra[i]), 0);
    }

    static struct live_req reqs[LIVE];
    memset(reqs, 0, sizeof(reqs));
    uint64_t rng = 0xfeedfacecafebeefull;
    uint64_t t0 = kvi_now_ns(), ops = 0;
    bool w3 = false;
    char id[32];
    /* The writer goes on until every reader has completed a read it started
     * after the first write (two completions counted from then), whatever
     * the scheduler did: a reader makes progress or reports a failure. */
    while (kvi_now_ns() - t0 < RUN_NS || ops < 2000 || !readers_progressed(&sh, reads0)) {
        if (ops == 1)
            for (int k = 0; k < READERS; k++)
                reads0[k] = atomic_load(&sh.reads[k]);
        size_t i = xorshift(&rng) % LIVE;
        snprintf(id, sizeof(id), "r%zu", i);
        struct kvi_slots_request r = {KEY, id, strlen(id), 0, 0, NULL, 0, 0};
        unsigned op = (unsigned)(xorshift(&rng) % 16);
        if (op == 0) {
            /* worker 3 comes and goes, taking its requests along */
            if (w3) {
                assert_int_equal(kvi_slots_unregister(s, &KEY, 3, NULL), 0);
                for (size_t k = 0; k < LIVE; k++)
                    if (reqs[k].live && reqs[k].worker == 3)
                        reqs[k].live = false;
            } else {
                assert_int_equal(kvi_slots_register(s, &KEY, 3, 16, 5, 2, NULL), 0);
            }
            w3 = !w3;
        } else if (op == 1) {
            kvi_slots_expire(s, 0); /* nothing is stale: reclaims retired memory */
        } else if (!reqs[i].live && op < 10) {
            uint64_t h[PIN + TAIL];
            size_t n;
            if (xorshift(&rng) % 2) {
                memcpy(h, pinned, sizeof(pinned));
                n = PIN + (size_t)(xorshift(&rng) % (TAIL + 1));
                for (size_t k = PIN; k < n; k++)
                    h[k] = xorshift(&rng) % 3;
            } else {
                n = (size_t)(xorshift(&rng) % (PIN + TAIL));
                for (size_t k = 0; k < n; k++)
                    h[k] = k < 4 ? pinned[k] : xorshift(&rng) % 3;
            }
            reqs[i].worker = w3 && xorshift(&rng) % 4 == 0 ? 3 : 1;
            reqs[i].rank = reqs[i].worker == 3 ? 5 + (uint32_t)(xorshift(&rng) % 2)
                                               : (uint32_t)(xorshift(&rng) % 4);
            r.worker_id = reqs[i].worker;
            r.dp_rank = reqs[i].rank;
            r.hashes = h;
            r.n_hashes = n;
            r.new_isl_tokens = xorshift(&rng) % 100;
            assert_int_equal(kvi_slots_add(s, &r, NULL), 0);
            reqs[i].live = true;
        } else if (op < 13) {
            assert_int_equal(kvi_slots_prefill_complete(s, &r, NULL), reqs[i].live ? 0 : -ENOENT);
        } else {
            assert_int_equal(kvi_slots_free(s, &r, NULL), 0);
            reqs[i].live = false;
        }
        ops++;
    }
    atomic_store(&sh.stop, true);
    for (int i = 0; i < READERS; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&sh.failures) != 0)
        fail_msg("%d reader failures, first: %s", atomic_load(&sh.failures), sh.failure);
    uint64_t reads = 0;
    for (int i = 0; i < READERS; i++) {
        uint64_t n = atomic_load(&sh.reads[i]);
        assert_true(n >= reads0[i] + 2); /* the protocol above */
        reads += n;
    }
    printf("writer ops %llu, reader queries %llu\n", (unsigned long long)ops, (unsigned long long)reads);

    /* quiescent: drop everything but the pins and check exactly */
    for (size_t i = 0; i < LIVE; i++) {
        snprintf(id, sizeof(id), "r%zu", i);
        struct kvi_slots_request r = {KEY, id, strlen(id), 0, 0, NULL, 0, 0};
        assert_int_equal(kvi_slots_free(s, &r, NULL), 0);
    }
    if (w3)
        assert_int_equal(kvi_slots_unregister(s, &KEY, 3, NULL), 0);
    kvi_rcu_register_thread();
    struct kvi_slots_potential p[8];
    size_t n_out;
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_potential_loads(s, &KEY, pinned, PIN, 0, p, 8, &n_out), 0);
    kvi_rcu_read_unlock();
    kvi_rcu_unregister_thread();
    assert_int_equal(n_out, 5);
    for (size_t i = 0; i < n_out; i++) {
        bool pinned_rank = p[i].dp_rank == 0;
        assert_int_equal(p[i].overlap_blocks, pinned_rank ? PIN : 0);
        assert_int_equal(p[i].active_decode_blocks, pinned_rank ? PIN : 0);
        assert_int_equal(p[i].active_requests, pinned_rank ? 1 : 0);
        assert_int_equal(p[i].active_prefill_tokens, 0);
    }
    struct kvi_slots_stats st;
    kvi_slots_stats(s, &st);
    assert_int_equal(st.nodes, PIN);
    assert_int_equal(st.requests, 2);
    kvi_slots_destroy(s);
}

/* On quiet states the conservative walk gives the fast walk's overlaps. */
static void test_walks_agree(void **state)
{
    (void)state;
    struct kvi_slots *s = kvi_slots_create(NULL);
    assert_int_equal(kvi_slots_register(s, &KEY, 1, 16, 0, 6, NULL), 0);
    assert_int_equal(kvi_slots_register(s, &KEY, 9, 16, 3, 2, NULL), 0);
    kvi_rcu_register_thread();
    uint64_t rng = 42;
    char id[32];
    uint64_t nonzero = 0;
    for (int round = 0; round < 400; round++) {
        for (int k = 0; k < 8; k++) {
            snprintf(id, sizeof(id), "r%d", (int)(xorshift(&rng) % 64));
            struct kvi_slots_request r = {KEY, id, strlen(id), 1, (uint32_t)(xorshift(&rng) % 6),
                                          NULL, 0, 0};
            if (xorshift(&rng) % 8 == 0) {
                r.worker_id = 9;
                r.dp_rank = 3 + (uint32_t)(xorshift(&rng) % 2);
            }
            uint64_t h[12];
            r.n_hashes = (size_t)(xorshift(&rng) % 12);
            for (size_t i = 0; i < r.n_hashes; i++)
                h[i] = xorshift(&rng) % 2;
            r.hashes = h;
            if (kvi_slots_add(s, &r, NULL) == -EEXIST)
                kvi_slots_free(s, &r, NULL);
        }
        for (int k = 0; k < 8; k++) {
            uint64_t q[14];
            size_t n = (size_t)(xorshift(&rng) % 14);
            for (size_t i = 0; i < n; i++)
                q[i] = xorshift(&rng) % 2;
            struct kvi_slots_potential a[8], b[8];
            kvi_rcu_read_lock();
            struct strk *t = find_reader(s, &KEY);
            const struct rtab *rt = kvi_rcu_deref(t->ranks);
            assert_int_equal(rt->n_ranks, 8);
            for (uint32_t i = 0; i < 8; i++)
                a[i].overlap_blocks = b[i].overlap_blocks = 0;
            walk_fast(s, t, rt, q, n, a);
            walk_slow(s, t, rt, q, n, b);
            kvi_rcu_read_unlock();
            for (uint32_t i = 0; i < 8; i++) {
                assert_int_equal(a[i].overlap_blocks, b[i].overlap_blocks);
                nonzero += a[i].overlap_blocks;
            }
        }
    }
    assert_true(nonzero > 0);
    kvi_rcu_unregister_thread();
    kvi_slots_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_walks_agree),
        cmocka_unit_test(test_readers_during_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
