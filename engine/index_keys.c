/*
 * Prefix-key runs (engine/index_impl.h, kvi_ix__keys_run): the query side's
 * K[i] = K[i-1] + key_term(content[i], ...) chain, eight keys at a time with
 * AVX-512 where the CPU has it (AVX512F + AVX512DQ, for the 64-bit lane
 * multiply), else one at a time. Both give the same keys bit for bit
 * (tests/engine/index_keys_test.c). No state but the CPU-feature choice,
 * made once per process; callable from any thread.
 *
 * The vector step: the eight terms are independent (the position term is a
 * Weyl sequence), so fmix64 runs on eight lanes, and the chain's running
 * sum is an inclusive prefix sum across the lanes (three shifted adds) plus
 * the previous key in every lane.
 * measured (kvidx-bench micro, AMD EPYC 2-vCPU VM, 3 runs each interleaved
 * with the scalar build, 2026-11-28): 1,024 keys 1,057-1,078 -> 282-287 ns;
 * find full hit 1,259-1,295 -> 542-548 ns; find diverging 2,109-2,311 ->
 * 1,198-1,284 ns.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/index_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVI_KEYS_AVX512 1
#include <immintrin.h>
#endif

/* key_step with the secrets in registers (stores to keys[] could alias
 * ix's fields, so the compiler reloaded both every block) and the position
 * term (i + 1) * phi kept as a running sum instead of a multiply.
 * measured (kvidx-bench micro, 1,024 keys, interleaved runs, with the
 * folded-product step of the fourth session): 1,000-1,002 ns -> 870-962 ns.
 * With the fmix64 step (a bijection: engine/index_impl.h, key_term) 1,255-
 * 1,278 ns. */
void kvi_ix__keys_run_scalar(const struct kvi_index *ix, const uint64_t *content, size_t from, size_t to,
                             uint64_t *keys, uint64_t *kp, uint64_t *wp)
{
    const uint64_t sx = ix->kxor, sm = ix->kmul;
    uint64_t k = *kp, w = *wp;
    for (size_t i = from; i < to; i++) {
        w += PHI;
        k += key_term(content[i], sx, w, sm);
        keys[i] = k;
    }
    *kp = k;
    *wp = w;
}

#ifdef KVI_KEYS_AVX512

#define AVX512_TARGET __attribute__((target("avx512f,avx512dq")))

AVX512_TARGET static inline __m512i fmix64_x8(__m512i x)
{
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 33));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)0xff51afd7ed558ccdull));
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 33));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)0xc4ceb9fe1a85ec53ull));
    return _mm512_xor_si512(x, _mm512_srli_epi64(x, 33));
}

AVX512_TARGET static void keys_run_avx512(const struct kvi_index *ix, const uint64_t *content, size_t from,
                                          size_t to, uint64_t *keys, uint64_t *kp, uint64_t *wp)
{
    size_t i = from;
    if (to - from >= 8) {
        const __m512i sx = _mm512_set1_epi64((long long)ix->kxor), sm = _mm512_set1_epi64((long long)ix->kmul);
        const __m512i zero = _mm512_setzero_si512(), last = _mm512_set1_epi64(7);
        const __m512i step = _mm512_set1_epi64((long long)(8 * PHI));
        /* lane j: the Weyl value of position i + j, w + (j + 1) * phi */
        __m512i w = _mm512_add_epi64(_mm512_set1_epi64((long long)*wp),
                                     _mm512_set_epi64((long long)(8 * PHI), (long long)(7 * PHI),
                                                      (long long)(6 * PHI), (long long)(5 * PHI),
                                                      (long long)(4 * PHI), (long long)(3 * PHI),
                                                      (long long)(2 * PHI), (long long)PHI));
        __m512i k = _mm512_set1_epi64((long long)*kp);
        for (; i + 8 <= to; i += 8) {
            __m512i c = _mm512_loadu_si512((const void *)(content + i));
            __m512i t = fmix64_x8(_mm512_add_epi64(_mm512_xor_si512(c, sx), _mm512_xor_si512(w, sm)));
            /* inclusive prefix sum over the lanes: lane j += lanes j-1, j-2, j-4 */
            t = _mm512_add_epi64(t, _mm512_alignr_epi64(t, zero, 7));
            t = _mm512_add_epi64(t, _mm512_alignr_epi64(t, zero, 6));
            t = _mm512_add_epi64(t, _mm512_alignr_epi64(t, zero, 4));
            t = _mm512_add_epi64(t, k);
            _mm512_storeu_si512((void *)(keys + i), t);
            k = _mm512_permutexvar_epi64(last, t);
            w = _mm512_add_epi64(w, step);
        }
        *kp = keys[i - 1];
        *wp += (uint64_t)(i - from) * PHI;
    }
    kvi_ix__keys_run_scalar(ix, content, i, to, keys, kp, wp);
}

static bool have_avx512(void)
{
    static int have = -1; /* benign race: every thread computes the same value */
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h;
}

#endif

bool kvi_ix__keys_simd(void)
{
#ifdef KVI_KEYS_AVX512
    return have_avx512();
#else
    return false;
#endif
}

void kvi_ix__keys_run(const struct kvi_index *ix, const uint64_t *content, size_t from, size_t to, uint64_t *keys,
                      uint64_t *kp, uint64_t *wp)
{
#ifdef KVI_KEYS_AVX512
    if (have_avx512()) {
        keys_run_avx512(ix, content, from, to, keys, kp, wp);
        return;
    }
#endif
    kvi_ix__keys_run_scalar(ix, content, from, to, keys, kp, wp);
}
