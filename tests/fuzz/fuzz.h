/*
 * Shared helpers of the libFuzzer targets in tests/fuzz/ (fuzz_*.c).
 *
 * Each target defines LLVMFuzzerTestOneInput. It is linked two ways:
 *   - with -fsanitize=fuzzer (the KVI_FUZZ=ON clang build, ci/fuzz.sh), where
 *     libFuzzer provides main();
 *   - with regress_main.c (every normal build), whose main() feeds it the
 *     committed corpus and regression inputs (CTest fuzz_<name>_regress).
 * So every check below must hold in Release builds too: FZ_CHECK is always
 * on (it does not use assert(), which NDEBUG removes).
 *
 * Thread-safety: targets are single-threaded; the helpers keep no state.
 */
#ifndef KVI_TESTS_FUZZ_H
#define KVI_TESTS_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/** libFuzzer entry point: run one input. @return 0 (libFuzzer's convention). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/** Report a broken invariant and abort (libFuzzer saves the input as a crash). */
#define FZ_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0))                                                          \
            fz_fail(__FILE__, __LINE__, #cond);                                                    \
    } while (0)

__attribute__((noreturn, cold)) static inline void fz_fail(const char *file, int line,
                                                           const char *what)
{
    fprintf(stderr, "fuzz invariant broken at %s:%d: %s\n", file, line, what);
    fflush(stderr);
    abort();
}

/* ---- a digest, to compare two runs' results field by field ------------------------ */

/** An FNV-1a-style 64-bit running digest (collisions are harmless: a check
 * that compares digests can only miss a difference, never invent one). */
struct fz_dig {
    uint64_t h;
    uint64_t n; /* items mixed in */
};

static inline void fz_dig_init(struct fz_dig *d)
{
    d->h = 0xcbf29ce484222325ull;
    d->n = 0;
}

static inline void fz_dig_u64(struct fz_dig *d, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        d->h ^= (v >> (8 * i)) & 0xff;
        d->h *= 0x100000001b3ull;
    }
    d->n++;
}

/** Mix @p n bytes at @p p (NULL allowed when n is 0), length-prefixed. */
static inline void fz_dig_bytes(struct fz_dig *d, const void *p, size_t n)
{
    fz_dig_u64(d, n);
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        d->h ^= b[i];
        d->h *= 0x100000001b3ull;
    }
}

/** Mix an optional string: presence, then contents. */
static inline void fz_dig_str(struct fz_dig *d, const char *p, size_t n)
{
    fz_dig_u64(d, p != NULL);
    fz_dig_bytes(d, p, p != NULL ? n : 0);
}

/* ---- reading the input as parameters ---------------------------------------------- */

/** A cursor over the fuzz input; reads past the end give zeros. */
struct fz_in {
    const uint8_t *p;
    size_t n;
};

static inline uint8_t fz_u8(struct fz_in *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint64_t fz_u64(struct fz_in *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | fz_u8(in);
    return v;
}

/** A small deterministic PRNG (xorshift64*), seeded from the input. */
static inline uint64_t fz_rng(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/** A heap copy of @p n bytes with nothing readable after them (ASan sees
 * any overread); @p nul appends a NUL terminator. Never NULL. */
static inline char *fz_dup(const void *p, size_t n, bool nul)
{
    /* calloc: never uninitialised, even when n is 0 (glibc returns a unique
     * pointer for a zero size) */
    char *c = calloc(n + (nul ? 1 : 0), 1);
    if (c == NULL)
        abort();
    if (n > 0)
        memcpy(c, p, n);
    if (nul)
        c[n] = '\0';
    return c;
}

/** True when [p, p + n) is valid UTF-8 (RFC 3629: no overlongs, surrogates
 * or code points above U+10FFFF). */
static inline bool fz_utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1, cp = c & 0x1f, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

#endif
