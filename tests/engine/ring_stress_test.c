/* ctest-labels: stress -- engine/ring.h with a real producer and consumer thread */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>

#include "engine/ring.h"

/*
 * DESIGN: each test passes sequence numbers 0 .. N-1 (stored in the void *
 * slots) from one producer thread to one consumer thread through one ring.
 * The consumer checks that every value is exactly the next expected number,
 * which catches loss, duplication and reordering. Failures are recorded by
 * the threads and asserted by the main thread after pthread_join (cmocka
 * asserts must not run off the main thread). A failing consumer raises
 * `stop` so a producer blocked on a full ring exits too.
 *
 * Where a configuration expects the producer to find the ring full (or the
 * consumer to find it empty), the other side starts only once that has
 * happened: the slow side's delays make it likely again and again, the gate
 * makes it certain at least once, however the threads are scheduled.
 */

#ifdef KVI_TSAN
#define STRESS_MESSAGES 200000u /* TSan is ~10-20x slower; stays well under 20 s */
#else
#define STRESS_MESSAGES 2000000u
#endif

#define MAX_BURST 64

enum prod_mode { PROD_BURST, PROD_MIXED }; /* MIXED: rotate burst, bulk, zero-copy */
enum cons_mode { CONS_BURST, CONS_MIXED }; /* MIXED: rotate burst, bulk */

struct stress_cfg {
    const char *name;
    uint32_t capacity;
    const uint32_t *prod_sizes;
    size_t n_prod_sizes;
    const uint32_t *cons_sizes;
    size_t n_cons_sizes;
    enum prod_mode prod_mode;
    enum cons_mode cons_mode;
    unsigned prod_delay; /* pause iterations after every producer call */
    unsigned cons_delay; /* pause iterations after every consumer call */
    int expect_full;     /* the producer must have found the ring full */
    int expect_empty;    /* the consumer must have found the ring empty */
};

struct stress_run {
    const struct stress_cfg *cfg;
    struct kvi_ring *ring;
    uint32_t total;
    atomic_int stop;
    atomic_int saw_full;  /* the producer found the ring full (the gate of expect_full) */
    atomic_int saw_empty; /* the consumer found the ring empty (the gate of expect_empty) */
    /* producer results (read after join) */
    uint32_t sent;
    uint64_t full_events;
    /* consumer results (read after join) */
    uint32_t received;
    uint64_t empty_events;
    int bad;
    uint32_t bad_expected;
    uintptr_t bad_value;
    uint32_t bad_count;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static void spin(unsigned iterations)
{
    for (unsigned i = 0; i < iterations; i++)
        cpu_relax();
}

/* Back off after a failed ring call; yields so two spinning threads share few cores. */
static void backoff(unsigned *fails)
{
    if (++*fails < 64)
        cpu_relax();
    else
        sched_yield();
}

static void *producer_main(void *arg)
{
    struct stress_run *run = arg;
    const struct stress_cfg *cfg = run->cfg;
    struct kvi_ring *r = run->ring;
    void *buf[MAX_BURST];
    uint32_t sent = 0;
    uint64_t iter = 0;
    unsigned fails = 0;

    while (cfg->expect_empty && !atomic_load(&run->saw_empty) && !atomic_load(&run->stop))
        sched_yield();
    while (sent < run->total && !atomic_load_explicit(&run->stop, memory_order_relaxed)) {
        uint32_t want = cfg->prod_sizes[iter % cfg->n_prod_sizes];
        if (want > run->total - sent)
            want = run->total - sent;
        unsigned op = cfg->prod_mode == PROD_MIXED ? (unsigned)(iter % 3) : 0;
        iter++;
        uint32_t got;
        if (op == 2) {
            struct kvi_ring_zc zc;
            got = kvi_ring_enqueue_zc_burst_start(r, want, &zc);
            for (uint32_t i = 0; i < got; i++) {
                void *o = (void *)(uintptr_t)(sent + i);
                if (i < zc.n1)
                    zc.ptr1[i] = o;
                else
                    zc.ptr2[i - zc.n1] = o;
            }
            if (got)
                kvi_ring_enqueue_zc_finish(r, got);
        } else {
            for (uint32_t i = 0; i < want; i++)
                buf[i] = (void *)(uintptr_t)(sent + i);
            got = op == 1 ? kvi_ring_enqueue_bulk(r, buf, want)
                          : kvi_ring_enqueue_burst(r, buf, want);
        }
        sent += got;
        if (got < want) {
            if (run->full_events++ == 0)
                atomic_store(&run->saw_full, 1);
            backoff(&fails);
        } else {
            fails = 0;
        }
        spin(cfg->prod_delay);
    }
    run->sent = sent;
    return NULL;
}

static void *consumer_main(void *arg)
{
    struct stress_run *run = arg;
    const struct stress_cfg *cfg = run->cfg;
    struct kvi_ring *r = run->ring;
    void *buf[MAX_BURST];
    uint32_t received = 0;
    uint64_t iter = 0;
    unsigned fails = 0;

    while (cfg->expect_full && !atomic_load(&run->saw_full))
        sched_yield(); /* the producer fills the ring first: nothing drains it */
    while (received < run->total) {
        uint32_t want = cfg->cons_sizes[iter % cfg->n_cons_sizes];
        int bulk = cfg->cons_mode == CONS_MIXED && (iter & 1);
        iter++;
        uint32_t got = bulk ? kvi_ring_dequeue_bulk(r, buf, want)
                            : kvi_ring_dequeue_burst(r, buf, want);
        if (got > want) {
            run->bad = 1;
            run->bad_count = got;
            break;
        }
        for (uint32_t i = 0; i < got; i++) {
            if ((uintptr_t)buf[i] != received + i) {
                run->bad = 1;
                run->bad_expected = received + i;
                run->bad_value = (uintptr_t)buf[i];
                goto out;
            }
        }
        received += got;
        if (got == 0) {
            if (run->empty_events++ == 0)
                atomic_store(&run->saw_empty, 1);
            backoff(&fails);
        } else {
            fails = 0;
        }
        spin(cfg->cons_delay);
    }
out:
    run->received = received;
    if (run->bad)
        atomic_store_explicit(&run->stop, 1, memory_order_relaxed);
    return NULL;
}

static void run_stress(void **state)
{
    const struct stress_cfg *cfg = *state;
    struct stress_run run = {.cfg = cfg, .total = STRESS_MESSAGES};
    atomic_init(&run.stop, 0);
    atomic_init(&run.saw_full, 0);
    atomic_init(&run.saw_empty, 0);
    run.ring = kvi_ring_create(cfg->capacity);
    assert_non_null(run.ring);
    assert_int_equal(kvi_ring_capacity(run.ring), cfg->capacity);

    uint64_t t0 = kvi_now_ns();
    pthread_t prod, cons;
    assert_int_equal(pthread_create(&cons, NULL, consumer_main, &run), 0);
    assert_int_equal(pthread_create(&prod, NULL, producer_main, &run), 0);
    assert_int_equal(pthread_join(prod, NULL), 0);
    assert_int_equal(pthread_join(cons, NULL), 0);
    double ms = (double)(kvi_now_ns() - t0) / 1e6;

    printf("  %-14s cap %4u: %u msgs in %7.1f ms; producer saw full %llu times, "
           "consumer saw empty %llu times\n",
           cfg->name, cfg->capacity, run.received, ms, (unsigned long long)run.full_events,
           (unsigned long long)run.empty_events);
    if (run.bad)
        fail_msg("%s: expected %u, got %lu (call returned %u)", cfg->name, run.bad_expected,
                 (unsigned long)run.bad_value, run.bad_count);
    assert_int_equal(run.sent, run.total);
    assert_int_equal(run.received, run.total);
    assert_true(kvi_ring_empty(run.ring));
    assert_int_equal(kvi_ring_count(run.ring), 0);
    void *extra;
    assert_int_equal(kvi_ring_dequeue_burst(run.ring, &extra, 1), 0);
    /* A slow side must really have made the other see a full / empty ring
     * (at least once by the gates above). */
    if (cfg->expect_full)
        assert_true(run.full_events > 0);
    if (cfg->expect_empty)
        assert_true(run.empty_events > 0);
    kvi_ring_free(run.ring);
}

static const uint32_t sz_32[] = {32};
static const uint32_t sz_7[] = {7};
static const uint32_t sz_1[] = {1};
static const uint32_t sz_tiny[] = {2, 1, 3, 1};
static const uint32_t sz_vary_a[] = {1, 2, 3, 5, 8, 13, 21, 34, 55, 64, 32, 7, 63, 4, 17};
static const uint32_t sz_vary_b[] = {64, 1, 7, 32, 3, 19, 9, 48, 2, 11, 5, 27, 64};

#define PROD_SIZES(a) .prod_sizes = (a), .n_prod_sizes = KVI_ARRAY_LEN(a)
#define CONS_SIZES(a) .cons_sizes = (a), .n_cons_sizes = KVI_ARRAY_LEN(a)

static const struct stress_cfg cfg_p32_c7 = {
    .name = "burst32->7", .capacity = 1024, PROD_SIZES(sz_32), CONS_SIZES(sz_7)};
static const struct stress_cfg cfg_p7_c32 = {
    .name = "burst7->32", .capacity = 1024, PROD_SIZES(sz_7), CONS_SIZES(sz_32)};
static const struct stress_cfg cfg_varying = {
    .name = "varying", .capacity = 256, PROD_SIZES(sz_vary_a),
    CONS_SIZES(sz_vary_b), .prod_mode = PROD_MIXED, .cons_mode = CONS_MIXED};
static const struct stress_cfg cfg_tiny = {
    .name = "tiny-ring", .capacity = 2, PROD_SIZES(sz_tiny), CONS_SIZES(sz_1),
    .prod_mode = PROD_MIXED};
static const struct stress_cfg cfg_slow_cons = {
    .name = "slow-consumer", .capacity = 64, PROD_SIZES(sz_32), CONS_SIZES(sz_7),
    .prod_mode = PROD_MIXED, .cons_mode = CONS_MIXED, .cons_delay = 24, .expect_full = 1};
static const struct stress_cfg cfg_slow_prod = {
    .name = "slow-producer", .capacity = 64, PROD_SIZES(sz_7), CONS_SIZES(sz_32),
    .prod_mode = PROD_MIXED, .prod_delay = 24, .expect_empty = 1};

#define STRESS_TEST(cfg) {(cfg).name, run_stress, NULL, NULL, (void *)&(cfg)}

int main(void)
{
    const struct CMUnitTest tests[] = {
        STRESS_TEST(cfg_p32_c7),    STRESS_TEST(cfg_p7_c32),    STRESS_TEST(cfg_varying),
        STRESS_TEST(cfg_tiny),      STRESS_TEST(cfg_slow_cons), STRESS_TEST(cfg_slow_prod),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
