/*
 * kvidx common definitions: cache-line constants, branch hints, assertions,
 * fatal-error handling. Included by every engine module.
 *
 * Error conventions used throughout kvidx (one per return kind):
 *   - constructors return NULL on failure and set errno;
 *   - int functions return 0 on success or a negative errno value;
 *   - burst functions return the number of objects handled;
 *   - functions that cannot fail return void.
 * Out-of-memory in the control plane aborts with file:line (kvi_die); data
 * paths use try_ variants that report failure to the caller.
 */
#ifndef KVI_ENGINE_COMMON_H
#define KVI_ENGINE_COMMON_H

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define KVI_CACHE_LINE 64
#define KVI_ALIGNED(n) __attribute__((aligned(n)))
#define KVI_CACHE_ALIGNED KVI_ALIGNED(KVI_CACHE_LINE)
#define KVI_LIKELY(x) __builtin_expect(!!(x), 1)
#define KVI_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define KVI_UNUSED __attribute__((unused))
#define KVI_WARN_UNUSED __attribute__((warn_unused_result))
/*
 * On a constructor: pairs its result with the function that frees it (GCC >=
 * 11 then warns about a mismatched or missing free). Only the deallocator
 * form of the malloc attribute: the plain form would promise that the new
 * object holds no pointer to an existing one, which most constructors break.
 * @p fn must be declared before the constructor.
 */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define KVI_DEALLOC(fn, argno) __attribute__((malloc(fn, argno)))
#else
#define KVI_DEALLOC(fn, argno)
#endif
#define KVI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KVI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVI_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Abort with a message naming the source location. */
#define kvi_die(...)                                                           \
    do {                                                                       \
        fprintf(stderr, "kvidx fatal %s:%d: ", __FILE__, __LINE__);            \
        fprintf(stderr, __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                   \
        abort();                                                               \
    } while (0)

/* Always-on cheap assertion. */
#define KVI_ASSERT(cond)                                                       \
    do {                                                                       \
        if (KVI_UNLIKELY(!(cond)))                                             \
            kvi_die("assertion failed: %s", #cond);                            \
    } while (0)

/* Debug-only assertion; the expression stays type-checked in release builds. */
#ifdef KVI_DEBUG
#define KVI_DEBUG_ASSERT(cond) KVI_ASSERT(cond)
#else
#define KVI_DEBUG_ASSERT(cond) ((void)sizeof(!(cond)))
#endif

/* Control-plane allocation: aborts on out-of-memory. */
static inline void *kvi_xmalloc_(size_t n, const char *file, int line)
{
    void *p = malloc(n ? n : 1);
    if (KVI_UNLIKELY(p == NULL)) {
        fprintf(stderr, "kvidx fatal %s:%d: out of memory (%zu bytes)\n", file, line, n);
        abort();
    }
    return p;
}
static inline void *kvi_xcalloc_(size_t n, size_t sz, const char *file, int line)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (KVI_UNLIKELY(p == NULL)) {
        fprintf(stderr, "kvidx fatal %s:%d: out of memory (%zu x %zu bytes)\n", file, line, n, sz);
        abort();
    }
    return p;
}
static inline void *kvi_xrealloc_(void *old, size_t n, const char *file, int line)
{
    void *p = realloc(old, n ? n : 1);
    if (KVI_UNLIKELY(p == NULL)) {
        fprintf(stderr, "kvidx fatal %s:%d: out of memory (%zu bytes)\n", file, line, n);
        abort();
    }
    return p;
}
#define kvi_xmalloc(n) kvi_xmalloc_((n), __FILE__, __LINE__)
#define kvi_xcalloc(n, sz) kvi_xcalloc_((n), (sz), __FILE__, __LINE__)
#define kvi_xrealloc(p, n) kvi_xrealloc_((p), (n), __FILE__, __LINE__)

/** Lower-case hex of the @p n bytes at @p p into @p out (2n chars, no NUL). @return the end. */
static inline char *kvi_hex_lower(char *out, const void *p, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    for (const unsigned char *c = p, *e = c + n; c < e; c++) {
        *out++ = hx[*c >> 4];
        *out++ = hx[*c & 15];
    }
    return out;
}

/** Index of the first element of the ascending @p a[0..n) that is >= @p v (n if none). */
static inline uint32_t kvi_lower_bound_u32(const uint32_t *a, uint32_t n, uint32_t v)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Busy-wait hint for spin loops (PAUSE on x86: yields the pipeline to the
 * sibling hyperthread and avoids a memory-order flush when the loop exits). */
static inline void kvi_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A full fence, for Dekker pairs (a store, then a load of another word, on
 * each side). TSan does not model fences (and GCC rejects some under
 * -fsanitize=thread): its builds do a seq_cst read-modify-write of one
 * shared word instead, which orders the two sides for it as well. */
#ifdef KVI_TSAN
extern _Atomic uint32_t kvi__tsan_fence_word;
#define kvi_fence_seq_cst() ((void)atomic_fetch_add_explicit(&kvi__tsan_fence_word, 0, memory_order_seq_cst))
#else
#define kvi_fence_seq_cst() atomic_thread_fence(memory_order_seq_cst)
#endif

/* Add to a counter that only one thread writes (others may read it):
 * a relaxed load/store pair, cheaper than an atomic read-modify-write. */
static inline void kvi_relaxed_add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

/* Monotonic clock in nanoseconds. */
uint64_t kvi_now_ns(void);

/** The time @p ns nanoseconds from now on clock @p clk, as an absolute
 * timespec for timed waits (pthread_cond_timedwait, clock_nanosleep). */
struct timespec kvi_timespec_after(clockid_t clk, uint64_t ns);

#endif
