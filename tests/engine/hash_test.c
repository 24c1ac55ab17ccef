/* ctest-labels: unit */
/*
 * Golden-vector and behaviour tests for engine/hash.c.
 *
 *  (a) the vectors printed in index-semantics.md sections 1.2 and 1.3,
 *      hard-coded from the document;
 *  (b) every vector of hash_vectors.txt (generated independently of the C
 *      code by gen_hash_vectors.py with python3-xxhash; format documented at
 *      the top of both files), read from the working directory (tests/engine);
 *  (c) the hashing scenarios of index-semantics.md section 6.4 plus the API
 *      contracts of engine/hash.h (cap, aliasing, salt, multimodal order).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/hash.h"

#define VECTORS_FILE "hash_vectors.txt"
#define MIN_VECTORS 300

#define assert_u64_eq(got, want)                                                          \
    do {                                                                                  \
        uint64_t got_ = (got), want_ = (want);                                            \
        if (got_ != want_)                                                                \
            fail_msg("%s = 0x%016" PRIx64 ", expected 0x%016" PRIx64, #got, got_, want_); \
    } while (0)

#define assert_u64_ne(a, b)                                                                \
    do {                                                                                   \
        uint64_t a_ = (a), b_ = (b);                                                       \
        if (a_ == b_)                                                                      \
            fail_msg("%s == %s (0x%016" PRIx64 "), expected different", #a, #b, a_);      \
    } while (0)

static uint64_t seed_of(const char *lora, const char *salt)
{
    return kvi_hash_seed(lora, lora ? strlen(lora) : 0, salt, salt ? strlen(salt) : 0);
}

static void fill_range(uint32_t *t, size_t n, uint32_t first)
{
    for (size_t i = 0; i < n; i++)
        t[i] = first + (uint32_t)i;
}

/* ------------------------------------------------------------------------ */
/* (a) document vectors, index-semantics.md 1.2 and 1.3                      */
/* ------------------------------------------------------------------------ */

static void test_doc_block_0123(void **state)
{
    (void)state;
    const uint32_t t[4] = {0, 1, 2, 3};
    assert_u64_eq(kvi_hash_block(t, 4, KVI_HASH_SEED), 0x7ee2cbedc694ab46ull);
    assert_u64_eq(kvi_hash_block(t, 4, KVI_HASH_SEED), 9143094415614847814ull);
    uint64_t out[1];
    assert_int_equal(kvi_hash_blocks(t, 4, 4, KVI_HASH_SEED, out, 1), 1);
    assert_u64_eq(out[0], 0x7ee2cbedc694ab46ull);
}

static void test_doc_blocks_1_to_32(void **state)
{
    (void)state;
    uint32_t t[32];
    fill_range(t, 32, 1);
    uint64_t out[2];
    assert_int_equal(kvi_hash_blocks(t, 32, 16, seed_of(NULL, NULL), out, 2), 2);
    assert_u64_eq(out[0], 0xea06fc71a5ee6e88ull);
    assert_u64_eq(out[0], 16863443419780771464ull);
    assert_u64_eq(out[1], 0x1fbf39bd106be0b5ull);
    assert_u64_eq(out[1], 2287610619914608821ull);
    assert_u64_eq(kvi_hash_block(t, 16, KVI_HASH_SEED), 0xea06fc71a5ee6e88ull);
    assert_u64_eq(kvi_hash_block(t + 16, 16, KVI_HASH_SEED), 0x1fbf39bd106be0b5ull);
}

static void test_doc_lora(void **state)
{
    (void)state;
    /* XXH3-64("my-lora", seed 0) = LoRA seed - 1337 */
    assert_u64_eq(seed_of("my-lora", NULL) - KVI_HASH_SEED, 0xb2041cc45cbcf9a4ull);
    assert_u64_eq(seed_of("my-lora", NULL) - KVI_HASH_SEED, 12827409268353071524ull);
    assert_u64_eq(seed_of("my-lora", NULL), 0xb2041cc45cbcfeddull);
    assert_u64_eq(seed_of("my-lora", NULL), 12827409268353072861ull);
    uint32_t t[16];
    fill_range(t, 16, 1);
    assert_u64_eq(kvi_hash_block(t, 16, 0xb2041cc45cbcfeddull), 0x3990f1b14309d7e6ull);
    uint64_t out[1];
    assert_int_equal(kvi_hash_blocks(t, 16, 16, seed_of("my-lora", NULL), out, 1), 1);
    assert_u64_eq(out[0], 0x3990f1b14309d7e6ull);
    assert_u64_eq(out[0], 4148081000444450790ull);
}

static void test_doc_eagle(void **state)
{
    (void)state;
    const uint32_t w0[3] = {10, 11, 12}, w1[3] = {12, 13, 14};
    assert_u64_eq(kvi_hash_block(w0, 3, KVI_HASH_SEED), 0x52b31cbfa97a7586ull);
    assert_u64_eq(kvi_hash_block(w0, 3, KVI_HASH_SEED), 5959138341449004422ull);
    assert_u64_eq(kvi_hash_block(w1, 3, KVI_HASH_SEED), 0xc125dbec4fa7efdcull);
    assert_u64_eq(kvi_hash_block(w1, 3, KVI_HASH_SEED), 13917772031453556700ull);
    /* the same windows through the eagle API: tokens 10..14, B = 2 */
    uint32_t t[5];
    fill_range(t, 5, 10);
    uint64_t out[2];
    assert_int_equal(kvi_hash_blocks_eagle(t, 5, 2, KVI_HASH_SEED, out, 2), 2);
    assert_u64_eq(out[0], 0x52b31cbfa97a7586ull);
    assert_u64_eq(out[1], 0xc125dbec4fa7efdcull);
}

static void test_doc_seq(void **state)
{
    (void)state;
    uint32_t t[32];
    fill_range(t, 32, 1);
    uint64_t content[2], seq[2];
    assert_int_equal(kvi_hash_blocks(t, 32, 16, KVI_HASH_SEED, content, 2), 2);
    kvi_seq_hashes(content, 2, seq);
    assert_u64_eq(seq[0], 16863443419780771464ull);
    assert_u64_eq(seq[1], 0xad01835a37dd294cull);
    assert_u64_eq(seq[1], 12466389667045779788ull);
    assert_u64_eq(kvi_seq_hash_next(0xea06fc71a5ee6e88ull, 0x1fbf39bd106be0b5ull),
                  0xad01835a37dd294cull);
}

/* ------------------------------------------------------------------------ */
/* (b) hash_vectors.txt                                                      */
/* ------------------------------------------------------------------------ */

enum vkind { V_SEED, V_BLOCK, V_BLOCKS, V_EAGLE, V_MM, V_NEXT, V_SEQ, V_NKINDS };
static const char *const vkind_name[V_NKINDS] = {"seed", "block", "blocks", "eagle",
                                                 "mm",   "next",  "seq"};

struct u32v {
    uint32_t *v;
    size_t n, cap;
};
struct u64v {
    uint64_t *v;
    size_t n, cap;
};
struct bytev {
    char *v;
    size_t n, cap;
};

/* Capacity is always >= 1 so that data pointers are never NULL. */
static void u32v_push(struct u32v *a, uint32_t x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = realloc(a->v, a->cap * sizeof *a->v);
        assert_non_null(a->v);
    }
    a->v[a->n++] = x;
}
static void u64v_push(struct u64v *a, uint64_t x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = realloc(a->v, a->cap * sizeof *a->v);
        assert_non_null(a->v);
    }
    a->v[a->n++] = x;
}
static void bytev_push(struct bytev *a, char x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = realloc(a->v, a->cap);
        assert_non_null(a->v);
    }
    a->v[a->n++] = x;
}

static bool parse_hex64(const char *s, uint64_t *out)
{
    if (s == NULL || strlen(s) != 16)
        return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else
            return false;
        v = (v << 4) | d;
    }
    *out = v;
    return true;
}

static bool parse_dec(const char *s, uint64_t max, uint64_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return false;
    *out = v;
    return true;
}

/* Comma lists (split in place); "-" is the empty list. */
static bool parse_u32_list(char *s, struct u32v *out)
{
    out->n = 0;
    if (s == NULL)
        return false;
    if (strcmp(s, "-") == 0)
        return true;
    char *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (!parse_dec(tok, UINT32_MAX, &v))
            return false;
        u32v_push(out, (uint32_t)v);
    }
    return out->n > 0;
}

static bool parse_u64_list(char *s, struct u64v *out)
{
    out->n = 0;
    if (s == NULL)
        return false;
    if (strcmp(s, "-") == 0)
        return true;
    char *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (!parse_hex64(tok, &v))
            return false;
        u64v_push(out, v);
    }
    return out->n > 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Hex-encoded bytes; "-" is the empty string. */
static bool parse_bytes(const char *s, struct bytev *out)
{
    out->n = 0;
    if (s == NULL)
        return false;
    if (strcmp(s, "-") == 0)
        return true;
    size_t len = strlen(s);
    if (len == 0 || len % 2 != 0)
        return false;
    for (size_t i = 0; i < len; i += 2) {
        int hi = hexval(s[i]), lo = hexval(s[i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        bytev_push(out, (char)(hi << 4 | lo));
    }
    return true;
}

struct vctx {
    struct u32v tok;
    struct u64v a, b, work;
    struct bytev lora, salt;
    size_t lineno;
    size_t failures;
};

#define VFAIL(ctx, ...)                                                                \
    do {                                                                               \
        print_error("%s:%zu: ", VECTORS_FILE, (ctx)->lineno);                          \
        print_error(__VA_ARGS__);                                                      \
        print_error("\n");                                                             \
        (ctx)->failures++;                                                             \
    } while (0)

#define VCHECK64(ctx, what, got, want)                                                 \
    do {                                                                               \
        uint64_t g_ = (got), w_ = (want);                                              \
        if (g_ != w_)                                                                  \
            VFAIL(ctx, "%s = 0x%016" PRIx64 ", expected 0x%016" PRIx64, what, g_, w_); \
    } while (0)

static void reserve_work(struct vctx *c, size_t n)
{
    c->work.n = 0;
    while (c->work.n < n + 2)
        u64v_push(&c->work, 0);
}

/* Returns false if the line is malformed. */
static bool check_vector(struct vctx *c, enum vkind k, char **f, int nf)
{
    uint64_t seed, want, x, y, bs;
    switch (k) {
    case V_SEED: {
        if (nf != 4 || !parse_hex64(f[1], &want) || !parse_bytes(f[2], &c->lora) ||
            !parse_bytes(f[3], &c->salt))
            return false;
        bytev_push(&c->lora, '\0'); /* keeps pointers non-NULL; not counted */
        bytev_push(&c->salt, '\0');
        size_t ll = c->lora.n - 1, sl = c->salt.n - 1;
        VCHECK64(c, "kvi_hash_seed", kvi_hash_seed(c->lora.v, ll, c->salt.v, sl), want);
        /* "-" (empty) must behave identically as NULL and as "" */
        VCHECK64(c, "kvi_hash_seed(NULL for empty)",
                 kvi_hash_seed(ll ? c->lora.v : NULL, ll, sl ? c->salt.v : NULL, sl), want);
        return true;
    }
    case V_BLOCK: {
        if (nf != 4 || !parse_hex64(f[1], &seed) || !parse_hex64(f[2], &want) ||
            !parse_u32_list(f[3], &c->tok))
            return false;
        u32v_push(&c->tok, 0xa5a5a5a5u); /* non-NULL storage even for n = 0 */
        c->tok.n--;
        VCHECK64(c, "kvi_hash_block", kvi_hash_block(c->tok.v, c->tok.n, seed), want);
        /* a multimodal block without multimodal hashes is a plain block */
        const uint64_t dummy = 42;
        VCHECK64(c, "kvi_hash_block_mm(n_mm = 0)",
                 kvi_hash_block_mm(c->tok.v, c->tok.n, &dummy, 0, seed), want);
        return true;
    }
    case V_BLOCKS:
    case V_EAGLE: {
        if (nf != 5 || !parse_hex64(f[1], &seed) || !parse_dec(f[2], UINT32_MAX, &bs) ||
            !parse_u32_list(f[3], &c->tok) || !parse_u64_list(f[4], &c->a))
            return false;
        u32v_push(&c->tok, 0);
        c->tok.n--;
        reserve_work(c, c->tok.n);
        const uint64_t sentinel = 0x5e5e5e5e5e5e5e5eull;
        for (size_t i = 0; i < c->work.n; i++)
            c->work.v[i] = sentinel;
        size_t cap = c->tok.n + 1;
        size_t got = k == V_BLOCKS
                         ? kvi_hash_blocks(c->tok.v, c->tok.n, (uint32_t)bs, seed, c->work.v, cap)
                         : kvi_hash_blocks_eagle(c->tok.v, c->tok.n, (uint32_t)bs, seed,
                                                 c->work.v, cap);
        if (got != c->a.n) {
            VFAIL(c, "%s returned %zu hashes, expected %zu", vkind_name[k], got, c->a.n);
            return true;
        }
        for (size_t i = 0; i < got; i++) {
            char what[64];
            snprintf(what, sizeof what, "%s[%zu]", vkind_name[k], i);
            VCHECK64(c, what, c->work.v[i], c->a.v[i]);
        }
        if (c->work.v[got] != sentinel)
            VFAIL(c, "%s wrote past the returned count", vkind_name[k]);
        return true;
    }
    case V_MM: {
        if (nf != 5 || !parse_hex64(f[1], &seed) || !parse_hex64(f[2], &want) ||
            !parse_u32_list(f[3], &c->tok) || !parse_u64_list(f[4], &c->a))
            return false;
        u32v_push(&c->tok, 0);
        c->tok.n--;
        u64v_push(&c->a, 0);
        c->a.n--;
        c->b.n = 0;
        for (size_t i = 0; i < c->a.n; i++)
            u64v_push(&c->b, c->a.v[i]);
        VCHECK64(c, "kvi_hash_block_mm",
                 kvi_hash_block_mm(c->tok.v, c->tok.n, c->a.v, c->a.n, seed), want);
        if (c->a.n && memcmp(c->a.v, c->b.v, c->a.n * sizeof(uint64_t)) != 0)
            VFAIL(c, "kvi_hash_block_mm modified its mm input");
        return true;
    }
    case V_NEXT:
        if (nf != 4 || !parse_hex64(f[1], &x) || !parse_hex64(f[2], &y) ||
            !parse_hex64(f[3], &want))
            return false;
        VCHECK64(c, "kvi_seq_hash_next", kvi_seq_hash_next(x, y), want);
        return true;
    case V_SEQ: {
        if (nf != 3 || !parse_u64_list(f[1], &c->a) || !parse_u64_list(f[2], &c->b) ||
            c->a.n != c->b.n || c->a.n == 0)
            return false;
        reserve_work(c, c->a.n);
        kvi_seq_hashes(c->a.v, c->a.n, c->work.v);
        for (size_t i = 0; i < c->a.n; i++) {
            char what[64];
            snprintf(what, sizeof what, "seq[%zu]", i);
            VCHECK64(c, what, c->work.v[i], c->b.v[i]);
            if (i > 0) {
                snprintf(what, sizeof what, "kvi_seq_hash_next step %zu", i);
                VCHECK64(c, what, kvi_seq_hash_next(c->b.v[i - 1], c->a.v[i]), c->b.v[i]);
            }
        }
        /* in place: out aliases content */
        memcpy(c->work.v, c->a.v, c->a.n * sizeof(uint64_t));
        kvi_seq_hashes(c->work.v, c->a.n, c->work.v);
        for (size_t i = 0; i < c->a.n; i++) {
            char what[64];
            snprintf(what, sizeof what, "in-place seq[%zu]", i);
            VCHECK64(c, what, c->work.v[i], c->b.v[i]);
        }
        return true;
    }
    case V_NKINDS:
        break;
    }
    return false;
}

static void test_vector_file(void **state)
{
    (void)state;
    FILE *fp = fopen(VECTORS_FILE, "r");
    if (fp == NULL)
        fail_msg("cannot open %s (cwd must be tests/engine): %s", VECTORS_FILE, strerror(errno));

    struct vctx c;
    memset(&c, 0, sizeof c);
    size_t per_kind[V_NKINDS] = {0};
    size_t total = 0;
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    while ((len = getline(&line, &linecap, fp)) >= 0) {
        c.lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        char *f[8];
        int nf = 0;
        char *save = NULL;
        for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
            if (nf == (int)(sizeof f / sizeof f[0])) {
                nf = -1;
                break;
            }
            f[nf++] = tok;
        }
        int k = -1;
        if (nf > 0)
            for (int i = 0; i < V_NKINDS; i++)
                if (strcmp(f[0], vkind_name[i]) == 0)
                    k = i;
        if (k < 0 || !check_vector(&c, (enum vkind)k, f, nf)) {
            VFAIL(&c, "malformed vector line");
            continue;
        }
        per_kind[k]++;
        total++;
    }
    assert_false(ferror(fp));
    fclose(fp);
    free(line);
    free(c.tok.v);
    free(c.a.v);
    free(c.b.v);
    free(c.work.v);
    free(c.lora.v);
    free(c.salt.v);

    print_message("%s: %zu vectors (", VECTORS_FILE, total);
    for (int i = 0; i < V_NKINDS; i++)
        print_message("%s%s %zu", i ? ", " : "", vkind_name[i], per_kind[i]);
    print_message("), %zu failures\n", c.failures);

    assert_int_equal(c.failures, 0);
    if (total < MIN_VECTORS)
        fail_msg("%s has %zu vectors, expected at least %d", VECTORS_FILE, total, MIN_VECTORS);
    for (int i = 0; i < V_NKINDS; i++)
        if (per_kind[i] == 0)
            fail_msg("%s has no '%s' vectors", VECTORS_FILE, vkind_name[i]);
}

/* ------------------------------------------------------------------------ */
/* (c) index-semantics.md 6.4 and hash.h contracts                          */
/* ------------------------------------------------------------------------ */

static void test_block_counts(void **state)
{
    (void)state;
    static const uint32_t sizes[] = {11, 32, 64};
    uint32_t t[2 * 64 + 1];
    fill_range(t, sizeof t / sizeof t[0], 1000);
    uint64_t out[4];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t b = sizes[s];
        assert_int_equal(kvi_hash_blocks(t, b, b, KVI_HASH_SEED, out, 4), 1);
        assert_int_equal(kvi_hash_blocks(t, b + 1, b, KVI_HASH_SEED, out, 4), 1);
        assert_int_equal(kvi_hash_blocks(t, 2 * b + 1, b, KVI_HASH_SEED, out, 4), 2);
        assert_int_equal(kvi_hash_blocks(t, b - 1, b, KVI_HASH_SEED, out, 4), 0);
        assert_int_equal(kvi_hash_blocks(t, 0, b, KVI_HASH_SEED, out, 4), 0);
        /* the trailing partial block is ignored; full blocks hash independently */
        assert_u64_eq(out[0], kvi_hash_block(t, b, KVI_HASH_SEED));
        assert_u64_eq(out[1], kvi_hash_block(t + b, b, KVI_HASH_SEED));
        uint64_t two[2];
        assert_int_equal(kvi_hash_blocks(t, 2 * b, b, KVI_HASH_SEED, two, 2), 2);
        assert_u64_eq(two[0], out[0]);
        assert_u64_eq(two[1], out[1]);
    }
    /* B = 0 gives no blocks and writes nothing */
    out[0] = 77;
    assert_int_equal(kvi_hash_blocks(t, 10, 0, KVI_HASH_SEED, out, 4), 0);
    assert_int_equal(kvi_hash_blocks(t, 0, 0, KVI_HASH_SEED, out, 4), 0);
    assert_int_equal(kvi_hash_blocks_eagle(t, 10, 0, KVI_HASH_SEED, out, 4), 0);
    assert_u64_eq(out[0], 77);
}

static void test_lora_isolation(void **state)
{
    (void)state;
    enum { B = 32, NB = 4 };
    uint32_t t[B * NB];
    for (size_t i = 0; i < B * NB; i++)
        t[i] = (uint32_t)(i * 2654435761u);
    uint64_t s_base = seed_of(NULL, NULL), s_a = seed_of("adapter-a", NULL),
             s_b = seed_of("adapter-b", NULL);
    assert_u64_eq(s_base, KVI_HASH_SEED);
    assert_u64_ne(s_a, s_base);
    assert_u64_ne(s_b, s_base);
    assert_u64_ne(s_a, s_b);

    uint64_t hb[NB], ha[NB], hbb[NB], he[NB];
    assert_int_equal(kvi_hash_blocks(t, B * NB, B, s_base, hb, NB), NB);
    assert_int_equal(kvi_hash_blocks(t, B * NB, B, s_a, ha, NB), NB);
    assert_int_equal(kvi_hash_blocks(t, B * NB, B, s_b, hbb, NB), NB);
    for (size_t i = 0; i < NB; i++) {
        assert_u64_ne(hb[i], ha[i]);
        assert_u64_ne(hb[i], hbb[i]);
        assert_u64_ne(ha[i], hbb[i]);
    }

    /* empty lora name (NULL, "", or non-NULL with length 0) is the base model */
    assert_u64_eq(kvi_hash_seed("", 0, NULL, 0), KVI_HASH_SEED);
    assert_u64_eq(kvi_hash_seed("adapter-a", 0, NULL, 0), KVI_HASH_SEED);
    assert_u64_eq(kvi_hash_seed(NULL, 0, "", 0), KVI_HASH_SEED);
    assert_u64_eq(kvi_hash_seed("", 0, "", 0), KVI_HASH_SEED);
    assert_int_equal(kvi_hash_blocks(t, B * NB, B, kvi_hash_seed("", 0, "", 0), he, NB), NB);
    assert_memory_equal(he, hb, sizeof hb);

    /* only the given length of the name counts */
    assert_u64_eq(kvi_hash_seed("adapter-a-and-more", 9, NULL, 0), s_a);
}

static void test_eagle_scenario(void **state)
{
    (void)state;
    uint32_t t[6];
    fill_range(t, 6, 0);
    uint64_t normal[4], eagle[4];
    assert_int_equal(kvi_hash_blocks(t, 6, 2, KVI_HASH_SEED, normal, 4), 3);
    assert_int_equal(kvi_hash_blocks_eagle(t, 6, 2, KVI_HASH_SEED, eagle, 4), 2);
    const uint32_t w0[3] = {0, 1, 2}, w1[3] = {2, 3, 4};
    uint64_t n0, n1;
    assert_int_equal(kvi_hash_blocks(w0, 3, 3, KVI_HASH_SEED, &n0, 1), 1);
    assert_int_equal(kvi_hash_blocks(w1, 3, 3, KVI_HASH_SEED, &n1, 1), 1);
    assert_u64_eq(eagle[0], n0);
    assert_u64_eq(eagle[1], n1);
    assert_u64_eq(eagle[0], kvi_hash_block(t, 3, KVI_HASH_SEED));
    assert_u64_eq(eagle[1], kvi_hash_block(t + 2, 3, KVI_HASH_SEED));
    for (size_t i = 0; i < 3; i++)
        assert_u64_eq(normal[i], kvi_hash_block(t + 2 * i, 2, KVI_HASH_SEED));

    /* too short for one window: n < B + 1 */
    assert_int_equal(kvi_hash_blocks_eagle(t, 2, 2, KVI_HASH_SEED, eagle, 4), 0);
    assert_int_equal(kvi_hash_blocks_eagle(t, 3, 2, KVI_HASH_SEED, eagle, 4), 1);
    assert_int_equal(kvi_hash_blocks_eagle(t, 0, 2, KVI_HASH_SEED, eagle, 4), 0);
}

static void test_cap(void **state)
{
    (void)state;
    enum { N = 10 * 16 + 5 };
    uint32_t t[N];
    fill_range(t, N, 7);
    uint64_t full[10];
    assert_int_equal(kvi_hash_blocks(t, N, 16, KVI_HASH_SEED, full, 10), 10);
    const uint64_t sentinel = 0xdeadbeefcafef00dull;
    for (size_t cap = 0; cap <= 10; cap++) {
        uint64_t out[11];
        for (size_t i = 0; i < 11; i++)
            out[i] = sentinel;
        assert_int_equal(kvi_hash_blocks(t, N, 16, KVI_HASH_SEED, out, cap), 10);
        for (size_t i = 0; i < cap; i++)
            assert_u64_eq(out[i], full[i]);
        for (size_t i = cap; i < 11; i++)
            assert_u64_eq(out[i], sentinel);
    }
    /* eagle: (165 - 1) / 16 = 10 windows */
    uint64_t efull[10];
    assert_int_equal(kvi_hash_blocks_eagle(t, N, 16, KVI_HASH_SEED, efull, 10), 10);
    for (size_t cap = 0; cap <= 10; cap++) {
        uint64_t out[11];
        for (size_t i = 0; i < 11; i++)
            out[i] = sentinel;
        assert_int_equal(kvi_hash_blocks_eagle(t, N, 16, KVI_HASH_SEED, out, cap), 10);
        for (size_t i = 0; i < cap; i++)
            assert_u64_eq(out[i], efull[i]);
        for (size_t i = cap; i < 11; i++)
            assert_u64_eq(out[i], sentinel);
    }
}

static void test_salt(void **state)
{
    (void)state;
    const uint64_t s_lora = seed_of("my-lora", NULL);
    const uint64_t s_salt = seed_of(NULL, "tenant-42");
    const uint64_t s_both = seed_of("my-lora", "tenant-42");
    /* python3-xxhash: 1337 + xxh3_64("tenant-42", seed=1) and with "my-lora" */
    assert_u64_eq(s_salt, 0xd375808dd055d42dull);
    assert_u64_eq(s_both, 0x85799d522d12cdd1ull);

    assert_u64_ne(s_salt, KVI_HASH_SEED);
    assert_u64_ne(s_salt, s_lora);
    assert_u64_ne(s_both, s_lora);
    assert_u64_ne(s_both, s_salt);
    assert_u64_ne(s_both, KVI_HASH_SEED);
    /* seed = 1337 + xxh3(lora, 0) + xxh3(salt, 1), wrapping */
    assert_u64_eq(s_both, KVI_HASH_SEED + (s_lora - KVI_HASH_SEED) + (s_salt - KVI_HASH_SEED));
    assert_u64_eq(s_both, 0xb2041cc45cbcfeddull + (0xd375808dd055d42dull - KVI_HASH_SEED));
    /* the sum wraps here: both terms are >= 2^63 */
    assert_true(s_lora > s_both);

    /* the salt is hashed with seed 1, the lora name with seed 0: same string,
     * different role, different seed */
    assert_u64_ne(seed_of(NULL, "my-lora"), s_lora);

    /* salted blocks never match unsalted or LoRA-only ones */
    uint32_t t[32];
    fill_range(t, 32, 1);
    uint64_t hb = kvi_hash_block(t, 32, KVI_HASH_SEED), hl = kvi_hash_block(t, 32, s_lora),
             hs = kvi_hash_block(t, 32, s_salt), hx = kvi_hash_block(t, 32, s_both);
    assert_u64_ne(hs, hb);
    assert_u64_ne(hs, hl);
    assert_u64_ne(hx, hb);
    assert_u64_ne(hx, hl);
    assert_u64_ne(hx, hs);
}

static void test_seq_alias(void **state)
{
    (void)state;
    enum { N = 20 };
    uint32_t t[N * 16];
    fill_range(t, N * 16, 1);
    uint64_t content[N], sep[N], buf[N];
    assert_int_equal(kvi_hash_blocks(t, N * 16, 16, KVI_HASH_SEED, content, N), N);
    kvi_seq_hashes(content, N, sep);
    assert_u64_eq(sep[0], content[0]);
    for (size_t i = 1; i < N; i++)
        assert_u64_eq(sep[i], kvi_seq_hash_next(sep[i - 1], content[i]));
    assert_u64_eq(sep[1], 0xad01835a37dd294cull);

    memcpy(buf, content, sizeof buf);
    kvi_seq_hashes(buf, N, buf);
    assert_memory_equal(buf, sep, sizeof sep);

    /* n = 0 writes nothing */
    buf[0] = 99;
    kvi_seq_hashes(content, 0, buf);
    assert_u64_eq(buf[0], 99);
    /* n = 1: seq[0] = content[0] */
    kvi_seq_hashes(content, 1, buf);
    assert_u64_eq(buf[0], content[0]);
}

static void test_mm_order_independent(void **state)
{
    (void)state;
    const uint32_t t[4] = {5, 0, 0x80000000u, 17};
    enum { NMM = 40 }; /* above the 16-entry stack buffer of hash.c as well */
    uint64_t mm[NMM], sorted[NMM], perm[NMM];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < NMM; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        mm[i] = x;
    }
    mm[3] = mm[9]; /* duplicates are kept */
    mm[5] = 0;
    mm[6] = UINT64_MAX;

    for (size_t n_mm = 1; n_mm <= NMM; n_mm += (n_mm < 20 ? 1 : 19)) {
        memcpy(sorted, mm, n_mm * sizeof(uint64_t));
        /* insertion sort: the reference order */
        for (size_t i = 1; i < n_mm; i++)
            for (size_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
                uint64_t tmp = sorted[j];
                sorted[j] = sorted[j - 1];
                sorted[j - 1] = tmp;
            }
        const uint64_t want = kvi_hash_block_mm(t, 4, sorted, n_mm, KVI_HASH_SEED);
        for (unsigned round = 0; round < 8; round++) {
            memcpy(perm, mm, n_mm * sizeof(uint64_t));
            uint64_t r = 0x2545f4914f6cdd1dull * (round + 1);
            for (size_t i = n_mm; i > 1; i--) {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                size_t j = (size_t)(r % i);
                uint64_t tmp = perm[i - 1];
                perm[i - 1] = perm[j];
                perm[j] = tmp;
            }
            if (round == 1) /* reverse order */
                for (size_t i = 0; i < n_mm; i++)
                    perm[i] = sorted[n_mm - 1 - i];
            uint64_t before[NMM];
            memcpy(before, perm, n_mm * sizeof(uint64_t));
            assert_u64_eq(kvi_hash_block_mm(t, 4, perm, n_mm, KVI_HASH_SEED), want);
            assert_memory_equal(perm, before, n_mm * sizeof(uint64_t)); /* not modified */
        }
        /* multimodal hashes matter: differs from the plain block and from
         * another image set; seed still matters */
        assert_u64_ne(want, kvi_hash_block(t, 4, KVI_HASH_SEED));
        sorted[0] ^= 1;
        assert_u64_ne(kvi_hash_block_mm(t, 4, sorted, n_mm, KVI_HASH_SEED), want);
        sorted[0] ^= 1;
        assert_u64_ne(kvi_hash_block_mm(t, 4, sorted, n_mm, seed_of("my-lora", NULL)), want);
    }
    /* n_mm = 0 is the plain content hash */
    assert_u64_eq(kvi_hash_block_mm(t, 4, mm, 0, KVI_HASH_SEED),
                  kvi_hash_block(t, 4, KVI_HASH_SEED));
}

/*
 * Regression test for streaming with a stack-allocated XXH3 state: xxHash
 * requires XXH3_INITSTATE() (or a memset) before the first
 * XXH3_64bits_reset_withSeed(), which otherwise reads state->seed and
 * state->extSecret uninitialised and, when they happen to equal (seed, NULL),
 * skips deriving the custom secret from the seed. Inputs over 240 bytes then
 * hash with stale stack bytes as secret. poison_stack() leaves exactly that
 * pattern (at every 8-byte phase: the state is 64-byte aligned, seed at offset
 * 48 mod 64, extSecret at 0 mod 64) where kvi_hash_block_mm's frame will be.
 * A correct implementation is unaffected; an incorrect one usually fails.
 */
__attribute__((noinline)) static void poison_stack(uint64_t seed, size_t phase)
{
    volatile uint64_t a[2048];
    for (size_t i = 0; i < 2048; i++)
        a[i] = (i + phase) % 8 == 6 ? seed : (i + phase) % 8 == 0 ? 0 : 0x4141414141414141ull;
    __asm__ volatile("" : : "r"(a) : "memory");
}

__attribute__((noinline)) static uint64_t mm_long(uint64_t seed)
{
    uint32_t t[64]; /* 256 token bytes + 16 mm bytes: XXH3 long-input path */
    fill_range(t, 64, 1);
    const uint64_t mm[2] = {9, 7};
    return kvi_hash_block_mm(t, 64, mm, 2, seed);
}

static void test_mm_stack_state(void **state)
{
    (void)state;
    /* python3-xxhash: xxh3_64(le_u32(1..64) || le_u64(7) || le_u64(9), seed) */
    const uint64_t s_lora = seed_of("my-lora", NULL);
    const struct {
        uint64_t seed, want;
    } cases[] = {{KVI_HASH_SEED, 0x573a6b2f23ab6a0aull}, {s_lora, 0x82de01900101668full}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_u64_eq(mm_long(cases[c].seed), cases[c].want);
        for (size_t phase = 0; phase < 8; phase++) {
            poison_stack(cases[c].seed, phase);
            uint64_t got = mm_long(cases[c].seed);
            if (got != cases[c].want)
                fail_msg("kvi_hash_block_mm after stack poisoning (phase %zu) = 0x%016" PRIx64
                         ", expected 0x%016" PRIx64 ": XXH3 state used uninitialised "
                         "(missing XXH3_INITSTATE before XXH3_64bits_reset_withSeed)",
                         phase, got, cases[c].want);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_block_0123),
        cmocka_unit_test(test_doc_blocks_1_to_32),
        cmocka_unit_test(test_doc_lora),
        cmocka_unit_test(test_doc_eagle),
        cmocka_unit_test(test_doc_seq),
        cmocka_unit_test(test_vector_file),
        cmocka_unit_test(test_block_counts),
        cmocka_unit_test(test_lora_isolation),
        cmocka_unit_test(test_eagle_scenario),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_salt),
        cmocka_unit_test(test_seq_alias),
        cmocka_unit_test(test_mm_order_independent),
        cmocka_unit_test(test_mm_stack_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
