/* ctest-labels: unit -- engine/index_keys.c: the AVX-512 and scalar prefix-key runs equal the definition */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/hash.h"
#include "engine/index.h"
#include "engine/index_impl.h"

enum { N = 700 };

struct fx {
    struct kvi_index *ix;
    uint64_t c[N], want[N], got[N + 1];
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    struct kvi_index_config ic = {.block_size = 16, .n_parts = 1, .key_seed = 0x5eed};
    f->ix = kvi_index_create(&ic);
    if (f->ix == NULL)
        return -1;
    uint64_t rng = 12345;
    for (size_t i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        f->c[i] = rng ^ (rng >> 31);
    }
    /* edge values of the content operand, in several lanes */
    f->c[1] = 0;
    f->c[8] = UINT64_MAX;
    f->c[13] = f->ix->kxor;
    f->c[22] = f->ix->kxor ^ UINT64_MAX;
    /* the definition: K[i] = K[i-1] + fmix64((c ^ kxor) + ((i+1) phi ^ kmul)) */
    uint64_t k = f->ix->kseed;
    for (size_t i = 0; i < N; i++)
        f->want[i] = k += kvi_fmix64((f->c[i] ^ f->ix->kxor) + (((uint64_t)(i + 1) * PHI) ^ f->ix->kmul));
    *state = f;
    printf("kvi_ix__keys_run: %s path on this CPU\n", kvi_ix__keys_simd() ? "AVX-512" : "scalar");
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    kvi_index_destroy(f->ix);
    free(f);
    return 0;
}

typedef void (*run_fn)(const struct kvi_index *, const uint64_t *, size_t, size_t, uint64_t *, uint64_t *,
                       uint64_t *);

/* Every run [from, to) resumed from the definition's state at `from` gives
 * the definition's keys there, writes nothing outside, and leaves the state
 * at `to`; then a whole chain built from runs of varied lengths (as a query
 * computes its keys chunk by chunk) equals the definition. */
static void check_runs(struct fx *f, run_fn run, const char *name)
{
    for (size_t from = 0; from <= 24; from++)
        for (size_t to = from; to <= from + 40; to++) {
            for (size_t i = 0; i <= N; i++)
                f->got[i] = 0xabababababababab;
            uint64_t k = from ? f->want[from - 1] : f->ix->kseed, w = (uint64_t)from * PHI;
            run(f->ix, f->c, from, to, f->got, &k, &w);
            for (size_t i = 0; i <= N; i++) {
                uint64_t exp = i >= from && i < to ? f->want[i] : 0xabababababababab;
                if (f->got[i] != exp)
                    fail_msg("%s [%zu, %zu): key %zu is %016llx, not %016llx", name, from, to, i,
                             (unsigned long long)f->got[i], (unsigned long long)exp);
            }
            assert_int_equal(k, to ? f->want[to - 1] : f->ix->kseed);
            assert_int_equal(w, (uint64_t)to * PHI);
        }
    static const size_t steps[] = {1, 7, 8, 9, 64, 3, 200, 16, 31};
    uint64_t k = f->ix->kseed, w = 0;
    size_t at = 0;
    for (size_t s = 0; at < N; s++) {
        size_t to = at + steps[s % 9] < N ? at + steps[s % 9] : N;
        run(f->ix, f->c, at, to, f->got, &k, &w);
        at = to;
    }
    assert_memory_equal(f->got, f->want, N * sizeof(uint64_t));
}

static void test_scalar_run(void **state)
{
    check_runs(*state, kvi_ix__keys_run_scalar, "scalar");
}

static void test_dispatched_run(void **state)
{
    check_runs(*state, kvi_ix__keys_run, kvi_ix__keys_simd() ? "avx512" : "scalar (no AVX-512 here)");
}

/* The public whole-chain call goes through the dispatched run. */
static void test_prefix_keys(void **state)
{
    struct fx *f = *state;
    memset(f->got, 0, sizeof f->got);
    kvi_index_prefix_keys(f->ix, f->c, N, f->got);
    assert_memory_equal(f->got, f->want, N * sizeof(uint64_t));
    assert_int_equal(f->got[N], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalar_run),
        cmocka_unit_test(test_dispatched_run),
        cmocka_unit_test(test_prefix_keys),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
