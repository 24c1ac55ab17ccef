/*
 * kvidx-bench ring: SPSC ring throughput by burst size.
 *
 * DESIGN: for each burst size B in {1, 8, 32}, one producer thread enqueues
 * N pointer-sized messages (sequence numbers) in bursts of B and one consumer
 * thread dequeues them in bursts of B, through a ring of 4096 slots. A side
 * that finds the ring full / empty spins with a pause instruction. The clock
 * starts when both threads are released from a start flag and stops when both
 * have been joined; throughput is N / elapsed. The consumer sums what it
 * receives and the sum is checked, so the copy cannot be optimised away and a
 * broken ring is reported instead of timed. Threads are not pinned.
 *
 * The loops are instantiated per burst size with a constant burst
 * (always_inline, as callers with fixed bursts get): measured on 2 vCPUs, a
 * runtime burst size cut burst 8 from ~250 to ~80 M msg/s. Small bursts are
 * bimodal: when the consumer keeps up it finds the ring empty and every call
 * pulls the producer's index line across cores (ping-pong, ~20-40 M msg/s at
 * burst 1); when it lags, both sides run from their cached indices.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "engine/common.h"
#include "engine/ring.h"

#define RING_BENCH_CAPACITY 4096u
#define RING_BENCH_DEFAULT_MESSAGES 20000000ull
#define RING_BENCH_MAX_BURST 32u

struct ring_bench_run {
    struct kvi_ring *ring;
    uint64_t messages;
    uint32_t burst;
    atomic_int go;
    uint64_t sum; /* written by the consumer, read after join */
};

static inline void ring_bench_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static void ring_bench_wait_go(struct ring_bench_run *run)
{
    while (!atomic_load_explicit(&run->go, memory_order_acquire))
        ring_bench_relax();
}

/*
 * Producer and consumer loops, instantiated below with a constant @p burst
 * so the ring's copy loops fold (see DESIGN).
 */
static inline __attribute__((always_inline)) void
ring_bench_produce(struct kvi_ring *r, uint64_t messages, const uint32_t burst)
{
    void *buf[RING_BENCH_MAX_BURST];
    uint64_t next = 0;
    while (messages - next >= burst) {
        for (uint32_t i = 0; i < burst; i++)
            buf[i] = (void *)(uintptr_t)(next + i);
        uint32_t done = 0;
        do {
            uint32_t got = kvi_ring_enqueue_burst(r, buf + done, burst - done);
            if (got == 0)
                ring_bench_relax();
            done += got;
        } while (done < burst);
        next += burst;
    }
    while (next < messages) { /* tail shorter than one burst */
        void *o = (void *)(uintptr_t)next;
        if (kvi_ring_enqueue_burst(r, &o, 1))
            next++;
        else
            ring_bench_relax();
    }
}

static inline __attribute__((always_inline)) uint64_t
ring_bench_consume(struct kvi_ring *r, uint64_t messages, const uint32_t burst)
{
    void *buf[RING_BENCH_MAX_BURST];
    uint64_t received = 0, sum = 0;
    while (received < messages) {
        uint32_t got = kvi_ring_dequeue_burst(r, buf, burst);
        if (got == 0) {
            ring_bench_relax();
            continue;
        }
        for (uint32_t i = 0; i < got; i++)
            sum += (uintptr_t)buf[i];
        received += got;
    }
    return sum;
}

static void *ring_bench_producer(void *arg)
{
    struct ring_bench_run *run = arg;
    struct kvi_ring *r = run->ring;
    uint64_t messages = run->messages;
    ring_bench_wait_go(run);
    switch (run->burst) {
    case 1:
        ring_bench_produce(r, messages, 1);
        break;
    case 8:
        ring_bench_produce(r, messages, 8);
        break;
    default:
        ring_bench_produce(r, messages, RING_BENCH_MAX_BURST);
        break;
    }
    return NULL;
}

static void *ring_bench_consumer(void *arg)
{
    struct ring_bench_run *run = arg;
    struct kvi_ring *r = run->ring;
    uint64_t messages = run->messages;
    ring_bench_wait_go(run);
    switch (run->burst) {
    case 1:
        run->sum = ring_bench_consume(r, messages, 1);
        break;
    case 8:
        run->sum = ring_bench_consume(r, messages, 8);
        break;
    default:
        run->sum = ring_bench_consume(r, messages, RING_BENCH_MAX_BURST);
        break;
    }
    return NULL;
}

/* One timed run; returns M messages per second, or a negative value on error. */
static double ring_bench_one(uint64_t messages, uint32_t burst)
{
    struct ring_bench_run run = {.messages = messages, .burst = burst};
    atomic_init(&run.go, 0);
    run.ring = kvi_ring_create(RING_BENCH_CAPACITY);
    if (run.ring == NULL) {
        fprintf(stderr, "ring bench: kvi_ring_create: %s\n", strerror(errno));
        return -1;
    }
    pthread_t prod, cons;
    int rc = pthread_create(&cons, NULL, ring_bench_consumer, &run);
    if (rc == 0)
        rc = pthread_create(&prod, NULL, ring_bench_producer, &run);
    if (rc != 0)
        kvi_die("pthread_create: %s", strerror(rc));

    uint64_t t0 = kvi_now_ns();
    atomic_store_explicit(&run.go, 1, memory_order_release); /* pairs with ring_bench_wait_go */
    pthread_join(prod, NULL);
    pthread_join(cons, NULL);
    uint64_t elapsed = kvi_now_ns() - t0;
    kvi_ring_free(run.ring);

    /* Sum of 0 .. N-1 modulo 2^64, as the consumer computed it. */
    uint64_t expect = messages % 2 == 0 ? (messages / 2) * (messages - 1)
                                        : messages * ((messages - 1) / 2);
    if (run.sum != expect) {
        fprintf(stderr, "ring bench: burst %u: checksum %" PRIu64 " != %" PRIu64 "\n", burst,
                run.sum, expect);
        return -1;
    }
    if (elapsed == 0)
        elapsed = 1;
    return (double)messages * 1e3 / (double)elapsed;
}

static void ring_bench_usage(FILE *f)
{
    fprintf(f,
            "usage: kvidx-bench ring [--messages N] [--help]\n"
            "\n"
            "One producer and one consumer thread pass N messages through a %u-slot\n"
            "SPSC ring (engine/ring.h) with bursts of 1, 8 and 32; prints M msg/s per\n"
            "burst size and a JSON summary as the last line.\n"
            "\n"
            "  --messages N  messages per burst size (default %llu; K/M/G suffixes ok)\n"
            "  --help        this text\n",
            RING_BENCH_CAPACITY, (unsigned long long)RING_BENCH_DEFAULT_MESSAGES);
}

/* Parse a positive count with an optional K/M/G (x1000) suffix; 0 on error. */
static uint64_t ring_bench_parse_count(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || s[0] == '-')
        return 0;
    uint64_t mult = 1;
    if (*end == 'k' || *end == 'K')
        mult = 1000ull;
    else if (*end == 'm' || *end == 'M')
        mult = 1000000ull;
    else if (*end == 'g' || *end == 'G')
        mult = 1000000000ull;
    if (mult != 1)
        end++;
    if (*end != '\0' || v > UINT64_MAX / mult)
        return 0;
    return (uint64_t)v * mult;
}

int kvi_bench_ring(int argc, char **argv)
{
    uint64_t messages = RING_BENCH_DEFAULT_MESSAGES;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ring_bench_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--messages")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ring bench: --messages needs a value\n");
                return 2;
            }
            val = argv[++i];
        } else if (!strncmp(a, "--messages=", 11)) {
            val = a + 11;
        } else {
            fprintf(stderr, "ring bench: unknown option '%s'\n", a);
            ring_bench_usage(stderr);
            return 2;
        }
        messages = ring_bench_parse_count(val);
        if (messages == 0 || messages > (UINT64_C(1) << 40)) {
            fprintf(stderr, "ring bench: bad --messages value '%s'\n", val);
            return 2;
        }
    }

    static const uint32_t bursts[] = {1, 8, 32};
    double mps[KVI_ARRAY_LEN(bursts)];
    printf("ring: 1 producer -> 1 consumer, %" PRIu64 " messages, ring of %u slots\n", messages,
           RING_BENCH_CAPACITY);
    printf("%8s %12s %12s\n", "burst", "M msg/s", "ns/msg");
    for (size_t i = 0; i < KVI_ARRAY_LEN(bursts); i++) {
        mps[i] = ring_bench_one(messages, bursts[i]);
        if (mps[i] < 0)
            return 1;
        printf("%8u %12.1f %12.2f\n", bursts[i], mps[i], 1e3 / mps[i]);
        fflush(stdout);
    }
    printf("{\"bench\":\"ring\",\"burst1_mps\":%.1f,\"burst8_mps\":%.1f,\"burst32_mps\":%.1f}\n",
           mps[0], mps[1], mps[2]);
    return 0;
}
