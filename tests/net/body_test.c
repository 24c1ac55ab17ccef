/* ctest-labels: unit -- the body layer (net/body.h; body.c, body_json.c, body_msgpack.c): buffer, scratch, pull reader, writer */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/body.h"
#include "net/body_internal.h" /* kvi_rd__fail */

static struct kvi_scratch S;

static int setup(void **state)
{
    kvi_scratch_init(&S);
    return 0;
}

static int teardown(void **state)
{
    kvi_scratch_free(&S);
    return 0;
}

static void rd_json(struct kvi_rd *rd, const char *s)
{
    kvi_scratch_reset(&S);
    kvi_rd_init(rd, s, strlen(s), KVI_ENC_JSON, &S);
}

static void assert_str(struct kvi_str s, const char *want)
{
    assert_int_equal(s.len, strlen(want));
    assert_memory_equal(s.p, want, s.len);
}

/* ---- buffer and scratch ------------------------------------------------------- */

static void test_buf(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    kvi_buf_puts(&b, "ab");
    kvi_buf_putc(&b, 'c');
    kvi_buf_put_u64(&b, 0);
    kvi_buf_putc(&b, ' ');
    kvi_buf_put_u64(&b, UINT64_MAX);
    kvi_buf_putc(&b, ' ');
    kvi_buf_put_i64(&b, INT64_MIN);
    kvi_buf_putc(&b, ' ');
    kvi_buf_put_i64(&b, -7);
    kvi_buf_putc(&b, ' ');
    kvi_buf_put_u64(&b, 1234567890123ull);
    const char *want = "abc0 18446744073709551615 -9223372036854775808 -7 1234567890123";
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.data, want, b.len);
    assert_true(kvi_buf_ok(&b));
    kvi_buf_consume(&b, 5);
    assert_memory_equal(b.data, "18446744073709551615", 20);
    for (int i = 0; i < 10000; i++)
        kvi_buf_puts(&b, "0123456789");
    assert_int_equal(b.len, strlen(want) - 5 + 100000);
    kvi_buf_reset(&b);
    assert_int_equal(b.len, 0);
    kvi_buf_free(&b);

    char tmp[20];
    for (uint64_t v = 1, k = 0; k < 20; k++, v *= 10) {
        char ref[24];
        snprintf(ref, sizeof(ref), "%llu", (unsigned long long)(v - 1));
        assert_int_equal(kvi_u64_to_dec(v - 1, tmp), strlen(ref));
        assert_memory_equal(tmp, ref, strlen(ref));
    }
}

static void test_scratch(void **state)
{
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    char *a = kvi_scratch_alloc(&s, 3);
    char *b = kvi_scratch_alloc(&s, 100000); /* bigger than a chunk */
    char *c = kvi_scratch_alloc(&s, 5);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal((uintptr_t)a % 8, 0);
    assert_int_equal((uintptr_t)b % 8, 0);
    assert_int_equal((uintptr_t)c % 8, 0);
    memset(b, 1, 100000);
    memset(a, 2, 3);
    memset(c, 3, 5);
    assert_int_equal(b[99999], 1);
    char *d = kvi_scratch_strdup(&s, "hello", 5);
    assert_string_equal(d, "hello");
    kvi_scratch_reset(&s);
    /* the largest chunk is kept: a big allocation now needs no malloc */
    char *e = kvi_scratch_alloc(&s, 100000);
    assert_ptr_equal(e, b);
    kvi_scratch_free(&s);
}

/* ---- JSON reader ---------------------------------------------------------------- */

static void test_json_object_walk(void **state)
{
    struct kvi_rd rd;
    rd_json(&rd, " { \"a\" : 1 , \"b\":[true,false,null], \"c\":\"x\\\"y\", \"d\":{} , \"e\":-0}\n");
    struct kvi_str k, s;
    struct kvi_num n;
    bool b;
    assert_int_equal(kvi_rd_obj_begin(&rd), 0);
    assert_int_equal(kvi_rd_obj_next(&rd, &k), 1);
    assert_str(k, "a");
    assert_int_equal(kvi_rd_peek(&rd), KVI_VT_INT);
    assert_int_equal(kvi_rd_num(&rd, &n), 0);
    assert_int_equal(n.mag, 1);
    assert_false(n.neg);
    assert_int_equal(kvi_rd_obj_next(&rd, &k), 1);
    assert_str(k, "b");
    assert_int_equal(kvi_rd_arr_begin(&rd), 0);
    assert_int_equal(kvi_rd_arr_next(&rd), 1);
    assert_int_equal(kvi_rd_bool(&rd, &b), 0);
    assert_true(b);
    assert_int_equal(kvi_rd_arr_next(&rd), 1);
    assert_int_equal(kvi_rd_bool(&rd, &b), 0);
    assert_false(b);
    assert_int_equal(kvi_rd_arr_next(&rd), 1);
    assert_true(kvi_rd_null(&rd));
    assert_int_equal(kvi_rd_arr_next(&rd), 0);
    assert_int_equal(kvi_rd_obj_next(&rd, &k), 1);
    assert_str(k, "c");
    /* a wrong-type read consumes nothing */
    assert_int_equal(kvi_rd_num(&rd, &n), KVI_RD_TYPE);
    assert_int_equal(kvi_rd_str(&rd, &s), 0);
    assert_str(s, "x\"y");
    assert_int_equal(kvi_rd_obj_next(&rd, &k), 1);
    assert_str(k, "d");
    assert_int_equal(kvi_rd_skip(&rd), 0);
    assert_int_equal(kvi_rd_obj_next(&rd, &k), 1);
    assert_int_equal(kvi_rd_num(&rd, &n), 0);
    assert_int_equal(n.mag, 0);
    assert_false(n.neg); /* -0 is 0 */
    assert_int_equal(kvi_rd_obj_next(&rd, &k), 0);
    assert_int_equal(kvi_rd_finish(&rd), 0);
}

static void test_json_strings(void **state)
{
    static const struct {
        const char *in, *out;
    } ok[] = {
        {"\"plain\"", "plain"},
        {"\"\\n\\t\\r\\b\\f\\/\\\\\"", "\n\t\r\b\f/\\"},
        {"\"\\u0041\\u00e9\\u20ac\"", "A\xc3\xa9\xe2\x82\xac"},
        {"\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80"},
        {"\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"\"\"", ""},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        struct kvi_rd rd;
        struct kvi_str s;
        rd_json(&rd, ok[i].in);
        assert_int_equal(kvi_rd_str(&rd, &s), 0);
        assert_str(s, ok[i].out);
        assert_int_equal(kvi_rd_finish(&rd), 0);
    }
    static const char *const bad[] = {
        "\"abc",           /* EOF */
        "\"a\\qb\"",       /* invalid escape */
        "\"\\u12\"",       /* short \u */
        "\"\\ud83d\"",     /* lone high surrogate */
        "\"\\ude00\"",     /* lone low surrogate */
        "\"a\x01b\"",      /* raw control character */
        "\"\xc3\x28\"",    /* bad continuation */
        "\"\xed\xa0\x80\"",/* encoded surrogate */
        "\"\xf5\x80\x80\x80\"", /* beyond U+10FFFF */
        "\"\xc0\xaf\"",    /* overlong */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct kvi_rd rd;
        struct kvi_str s;
        rd_json(&rd, bad[i]);
        assert_int_equal(kvi_rd_str(&rd, &s), -EBADMSG);
        assert_non_null(rd.err_what);
    }
}

static void test_json_numbers(void **state)
{
    static const struct {
        const char *in;
        int r;
        uint64_t mag;
        bool neg;
    } cases[] = {
        {"0", 0, 0, false},
        {"42", 0, 42, false},
        {"-42", 0, 42, true},
        {"18446744073709551615", 0, UINT64_MAX, false},
        {"18446744073709551616", KVI_NUM_BIG, 0, false},
        {"-9223372036854775808", 0, 1ull << 63, true},
        {"-9223372036854775809", KVI_NUM_BIG, 0, false},
        {"99999999999999999999999", KVI_NUM_BIG, 0, false},
        {"1.5", KVI_NUM_FLOAT, 0, false},
        {"1e3", KVI_NUM_FLOAT, 0, false},
        {"-2.5E-3", KVI_NUM_FLOAT, 0, false},
        {"01", -EBADMSG, 0, false},
        {"-", -EBADMSG, 0, false},
        {"1.", -EBADMSG, 0, false},
        {"1e", -EBADMSG, 0, false},
        {"-a", -EBADMSG, 0, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct kvi_rd rd;
        struct kvi_num n = {0, false};
        rd_json(&rd, cases[i].in);
        int r = kvi_rd_num(&rd, &n);
        if (r != cases[i].r)
            fail_msg("%s: got %d want %d", cases[i].in, r, cases[i].r);
        if (r == 0) {
            assert_int_equal(n.mag, cases[i].mag);
            assert_int_equal(n.neg, cases[i].neg);
            assert_int_equal(kvi_rd_finish(&rd), 0);
        }
    }
}

static void test_json_syntax_errors(void **state)
{
    static const char *const bad[] = {
        "",         "{",           "{\"a\"}",     "{\"a\":}",   "{\"a\":1,}", "{a:1}",
        "{\"a\":1 \"b\":2}", "[1,]",  "[1 2]",   "{\"a\":tru}", "{\"a\":nul}", "{\"a\":1}x",
        "{\"a\":[1,2}",  "}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct kvi_rd rd;
        rd_json(&rd, bad[i]);
        int r = kvi_rd_skip(&rd);
        if (r == 0)
            r = kvi_rd_finish(&rd);
        if (r != -EBADMSG)
            fail_msg("'%s' accepted (%d)", bad[i], r);
        /* errors are sticky */
        assert_int_equal(kvi_rd_skip(&rd), -EBADMSG);
    }
    /* deep nesting is bounded */
    char deep[400];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    struct kvi_rd rd;
    kvi_scratch_reset(&S);
    kvi_rd_init(&rd, deep, 400, KVI_ENC_JSON, &S);
    assert_int_equal(kvi_rd_skip(&rd), -EBADMSG);
    assert_string_equal(rd.err_what, "recursion limit exceeded");
}

static void test_json_line_col(void **state)
{
    struct kvi_rd rd;
    rd_json(&rd, "{\n  \"a\": 1,\n  \"b\": x}");
    assert_int_equal(kvi_rd_skip(&rd), -EBADMSG);
    size_t line, col;
    kvi_rd_line_col(&rd, rd.err_off, &line, &col);
    assert_int_equal(line, 3);
    assert_int_equal(col, 8);
}

static void test_json_describe(void **state)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"-1", "integer `-1`"},
        {"1.5", "floating point `1.5`"},
        {"\"x\"", "string \"x\""},
        {"true", "boolean `true`"},
        {"null", "null"},
        {"[1]", "sequence"},
        {"{}", "map"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct kvi_rd rd;
        char out[64];
        rd_json(&rd, cases[i].in);
        kvi_rd_describe(&rd, out, sizeof(out));
        assert_string_equal(out, cases[i].want);
        /* describing does not move the reader */
        assert_int_equal(kvi_rd_skip(&rd), 0);
        assert_int_equal(kvi_rd_finish(&rd), 0);
    }
}

static void test_json_u32_array(void **state)
{
    struct kvi_rd rd;
    uint32_t *a;
    size_t n;
    struct kvi_elem_err e;
    rd_json(&rd, "[ 0 , 1,4294967295,\n42 ,7]");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), 0);
    assert_int_equal(n, 5);
    assert_int_equal(a[0], 0);
    assert_int_equal(a[2], UINT32_MAX);
    assert_int_equal(a[4], 7);
    assert_int_equal(kvi_rd_finish(&rd), 0);

    rd_json(&rd, "[]");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), 0);
    assert_int_equal(n, 0);

    rd_json(&rd, "[1,2,4294967296]");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), KVI_RD_ELEM);
    assert_int_equal(e.index, 2);
    assert_int_equal(e.kind, KVI_EF_RANGE);
    assert_int_equal(e.num.mag, 4294967296ull);
    char what[64];
    kvi_rd_describe(&rd, what, sizeof(what));
    assert_string_equal(what, "integer `4294967296`");

    rd_json(&rd, "[1,-1]");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), KVI_RD_ELEM);
    assert_int_equal(e.index, 1);
    assert_int_equal(e.kind, KVI_EF_RANGE);

    /* int32 range: negatives keep their bits */
    rd_json(&rd, "[-1,-2147483648,2147483647]");
    assert_int_equal(kvi_rd_u32_array(&rd, INT32_MIN, INT32_MAX, &a, &n, &e), 0);
    assert_int_equal(a[0], 0xffffffffu);
    assert_int_equal(a[1], 0x80000000u);
    assert_int_equal(a[2], 0x7fffffffu);
    rd_json(&rd, "[2147483648]");
    assert_int_equal(kvi_rd_u32_array(&rd, INT32_MIN, INT32_MAX, &a, &n, &e), KVI_RD_ELEM);
    rd_json(&rd, "[-2147483649]");
    assert_int_equal(kvi_rd_u32_array(&rd, INT32_MIN, INT32_MAX, &a, &n, &e), KVI_RD_ELEM);

    rd_json(&rd, "[1,1.5]");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), KVI_RD_ELEM);
    assert_int_equal(e.kind, KVI_EF_FLOAT);
    rd_json(&rd, "[1,\"2\"]");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), KVI_RD_ELEM);
    assert_int_equal(e.kind, KVI_EF_TYPE);
    assert_int_equal(e.vt, KVI_VT_STR);
    rd_json(&rd, "[1,123456789012345678901234]");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), KVI_RD_ELEM);
    assert_true(e.big);

    static const char *const bad[] = {"[1,]", "[1 2]", "[01]", "[1", "[,1]", "[1,2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rd_json(&rd, bad[i]);
        if (kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e) != -EBADMSG)
            fail_msg("'%s' accepted", bad[i]);
    }
    rd_json(&rd, "{\"a\":1}");
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), KVI_RD_TYPE);
}

static void test_json_u64_array(void **state)
{
    struct kvi_rd rd;
    uint64_t *a;
    size_t n;
    struct kvi_elem_err e;
    rd_json(&rd, "[-1,9223372036854775807,-9223372036854775808,0]");
    assert_int_equal(kvi_rd_u64_array(&rd, INT64_MIN, INT64_MAX, &a, &n, &e), 0);
    assert_int_equal(n, 4);
    assert_true(a[0] == UINT64_MAX);
    assert_true(a[1] == (uint64_t)INT64_MAX);
    assert_true(a[2] == 1ull << 63);
    rd_json(&rd, "[9223372036854775808]");
    assert_int_equal(kvi_rd_u64_array(&rd, INT64_MIN, INT64_MAX, &a, &n, &e), KVI_RD_ELEM);
    rd_json(&rd, "[18446744073709551615,-5]");
    assert_int_equal(kvi_rd_u64_array(&rd, INT64_MIN, UINT64_MAX, &a, &n, &e), 0);
    assert_true(a[0] == UINT64_MAX);
    assert_true(a[1] == (uint64_t)-5);
}

/* A long random token array parses exactly (the fast path over chunk edges). */
static void test_json_long_array(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    uint32_t *want = malloc(100000 * sizeof(*want));
    uint64_t x = 88172645463325252ull;
    kvi_buf_putc(&b, '[');
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        want[i] = (uint32_t)(x >> (x & 31));
        if (i)
            kvi_buf_puts(&b, i % 7 ? "," : " ,\n ");
        kvi_buf_put_u64(&b, want[i]);
    }
    kvi_buf_putc(&b, ']');
    struct kvi_rd rd;
    uint32_t *a;
    size_t n;
    struct kvi_elem_err e;
    kvi_scratch_reset(&S);
    kvi_rd_init(&rd, b.data, b.len, KVI_ENC_JSON, &S);
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &n, &e), 0);
    assert_int_equal(n, 100000);
    assert_memory_equal(a, want, n * sizeof(*a));
    free(want);
    kvi_buf_free(&b);
}

/* ---- integer arrays against the previous implementation ---------------------------------- */

/* The integer-array reader as it was before the fast loop (a SWAR fast path
 * for up to 7 digits, everything else through the general number lexer),
 * written on the public reader: the new reader must return the same values,
 * codes, error texts, offsets and element details for any input. */

static uint32_t ref_swar(const uint8_t *p, uint64_t *v)
{
    uint64_t x;
    memcpy(&x, p, 8);
    uint64_t d = x ^ 0x3030303030303030ull;
    uint64_t nd = (((d & 0x7f7f7f7f7f7f7f7full) + 0x7676767676767676ull) | d) & 0x8080808080808080ull;
    if (nd == 0)
        return 8;
    uint32_t k = (uint32_t)__builtin_ctzll(nd) >> 3;
    if (k == 0)
        return 0;
    uint64_t val = 0;
    for (uint32_t i = 0; i < k; i++)
        val = val * 10 + (uint64_t)(p[i] - '0');
    *v = val;
    return k;
}

static bool ref_ws(uint8_t c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static bool ref_in_range(const struct kvi_num *n, int64_t min, uint64_t max, uint64_t *bits)
{
    if (n->neg) {
        if (min >= 0 || n->mag > (uint64_t)0 - (uint64_t)min)
            return false;
        *bits = (uint64_t)0 - n->mag;
        return true;
    }
    if (n->mag > max)
        return false;
    *bits = n->mag;
    return true;
}

static int ref_wrong(struct kvi_rd *rd, enum kvi_vt vt)
{
    if (vt == KVI_VT_BAD)
        return kvi_rd__fail(rd, rd->_p >= rd->_end ? "EOF while parsing a value" : "expected value");
    return KVI_RD_TYPE;
}

static int ref_int_array(struct kvi_rd *rd, int64_t min, uint64_t max, uint64_t *a, size_t *n_out,
                         struct kvi_elem_err *e)
{
    enum kvi_vt vt = kvi_rd_peek(rd);
    if (vt != KVI_VT_ARR)
        return ref_wrong(rd, vt);
    rd->_p++;
    const uint8_t *p = rd->_p, *end = rd->_end;
    size_t n = 0;
    for (;;) {
        while (p < end && ref_ws(*p))
            p++;
        if (p >= end) {
            rd->_p = p;
            return kvi_rd__fail(rd, "EOF while parsing a list");
        }
        if (*p == ']') {
            if (n > 0) {
                rd->_p = p;
                return kvi_rd__fail(rd, "trailing comma");
            }
            p++;
            break;
        }
        const uint8_t *el = p;
        uint64_t v = (uint64_t)(*p - '0');
        if (v < 10 && v != 0) {
            uint32_t k;
            if (end - p >= 8 && (k = ref_swar(p, &v)) < 8) {
                p += k;
            } else {
                const uint8_t *lim = end - p > 19 ? p + 19 : end;
                v = (uint64_t)(*p - '0');
                p++;
                while (p < lim && *p >= '0' && *p <= '9')
                    v = v * 10 + (uint64_t)(*p++ - '0');
            }
            if (p < end && ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E'))
                goto slow;
            if (v > max) {
                e->index = n;
                e->kind = KVI_EF_RANGE;
                e->num.mag = v;
                e->num.neg = false;
                e->big = false;
                e->off = (size_t)(el - rd->_base);
                rd->_p = el;
                return KVI_RD_ELEM;
            }
            a[n] = v;
        } else {
        slow:
            rd->_p = p = el;
            vt = kvi_rd_peek(rd);
            if (vt != KVI_VT_INT) {
                if (vt == KVI_VT_BAD)
                    return ref_wrong(rd, vt);
                e->index = n;
                e->kind = KVI_EF_TYPE;
                e->vt = vt;
                e->off = (size_t)(el - rd->_base);
                return KVI_RD_ELEM;
            }
            struct kvi_num num = {0, false};
            int r = kvi_rd_num(rd, &num);
            if (r < 0)
                return r;
            uint64_t bits;
            if (r != 0 || !ref_in_range(&num, min, max, &bits)) {
                e->index = n;
                e->kind = r == KVI_NUM_FLOAT ? KVI_EF_FLOAT : KVI_EF_RANGE;
                e->num = num;
                e->big = r == KVI_NUM_BIG;
                e->vt = KVI_VT_INT;
                e->off = (size_t)(el - rd->_base);
                rd->_p = el;
                return KVI_RD_ELEM;
            }
            a[n] = bits;
            p = rd->_p;
        }
        n++;
        while (p < end && ref_ws(*p))
            p++;
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == ']') {
            p++;
            break;
        }
        rd->_p = p;
        return kvi_rd__fail(rd, p >= end ? "EOF while parsing a list" : "expected `,` or `]`");
    }
    rd->_p = p;
    *n_out = n;
    return 0;
}

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Append a random array element: mostly plain integers of every length and
 * sign, sometimes something the fast path must hand over. */
static void put_random_elem(struct kvi_buf *b)
{
    static const char *const odd[] = {
        "-0", "0", "00", "01", "-01", "-", "--1", "1.5", "1e5", "1E+5", "2e-3", "-0.0", "1.", ".5",
        "\"7\"", "null", "true", "false", "[1]", "{}", "x", "+1", "0x10", "1a", "18446744073709551615",
        "18446744073709551616", "-9223372036854775808", "-9223372036854775809", "99999999999999999999",
        "100000000000000000000", "123456789012345678901234", "4294967295", "4294967296", "2147483647",
        "2147483648", "-2147483648", "-2147483649", "9223372036854775807", "9223372036854775808",
        "1\x01", "\xff",
    };
    if (rnd() % 40 == 0) {
        kvi_buf_puts(b, odd[rnd() % (sizeof odd / sizeof odd[0])]);
        return;
    }
    if (rnd() % 8 == 0)
        kvi_buf_putc(b, '-');
    unsigned digits = 1 + (unsigned)(rnd() % (rnd() % 4 == 0 ? 21 : 8));
    kvi_buf_putc(b, (char)('1' + rnd() % 9));
    for (unsigned i = 1; i < digits; i++)
        kvi_buf_putc(b, (char)('0' + rnd() % 10));
}

static void put_random_ws(struct kvi_buf *b)
{
    static const char *const ws[] = {"", "", "", "", " ", " ", "\n", "\t", "\r\n", "  "};
    kvi_buf_puts(b, ws[rnd() % (sizeof ws / sizeof ws[0])]);
}

static void test_json_int_array_matches_reference(void **state)
{
    static const struct {
        int64_t min;
        uint64_t max;
    } ranges[] = {{0, UINT32_MAX}, {INT32_MIN, INT32_MAX}, {INT64_MIN, INT64_MAX}, {INT64_MIN, UINT64_MAX}};
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_scratch s2;
    kvi_scratch_init(&s2);
    for (int iter = 0; iter < 20000; iter++) {
        kvi_buf_reset(&b);
        put_random_ws(&b);
        kvi_buf_putc(&b, '[');
        size_t n_el = (size_t)(rnd() % (iter % 5 == 0 ? 300 : 12));
        for (size_t i = 0; i < n_el; i++) {
            if (i > 0) {
                put_random_ws(&b);
                kvi_buf_putc(&b, rnd() % 300 == 0 ? ';' : ',');
            }
            put_random_ws(&b);
            put_random_elem(&b);
        }
        put_random_ws(&b);
        if (rnd() % 30 == 0)
            kvi_buf_putc(&b, ',');
        kvi_buf_putc(&b, ']');
        kvi_buf_puts(&b, "}  ");
        size_t len = b.len;
        if (rnd() % 10 == 0)
            len = (size_t)(rnd() % (b.len + 1)); /* cut short */
        /* the body in its own allocation, so ASan sees any read past its end */
        char *body = malloc(len ? len : 1);
        memcpy(body, b.data, len);
        int ri = (int)(rnd() % 4);
        bool wide = ranges[ri].max > UINT32_MAX || ranges[ri].min < INT32_MIN;

        struct kvi_rd want_rd, got_rd;
        struct kvi_elem_err we, ge;
        memset(&we, 0, sizeof we);
        memset(&ge, 0, sizeof ge);
        uint64_t *want = calloc(len / 2 + 2, sizeof *want);
        size_t wn = 0, gn = 0;
        kvi_scratch_reset(&S);
        kvi_rd_init(&want_rd, body, len, KVI_ENC_JSON, &S);
        int wr = ref_int_array(&want_rd, ranges[ri].min, ranges[ri].max, want, &wn, &we);
        kvi_scratch_reset(&s2);
        kvi_rd_init(&got_rd, body, len, KVI_ENC_JSON, &s2);
        int gr;
        uint64_t got_at = 0;
        const void *ga = NULL;
        if (wide) {
            uint64_t *a = NULL;
            gr = kvi_rd_u64_array(&got_rd, ranges[ri].min, ranges[ri].max, &a, &gn, &ge);
            ga = a;
        } else {
            uint32_t *a = NULL;
            gr = kvi_rd_u32_array(&got_rd, ranges[ri].min, ranges[ri].max, &a, &gn, &ge);
            ga = a;
        }
        if (gr != wr)
            fail_msg("iter %d range %d: returned %d, want %d, body '%.*s'", iter, ri, gr, wr, (int)len, body);
        assert_int_equal(kvi_rd_offset(&got_rd), kvi_rd_offset(&want_rd));
        assert_int_equal(got_rd.err, want_rd.err);
        if (wr < 0) {
            assert_int_equal(got_rd.err_off, want_rd.err_off);
            assert_string_equal(got_rd.err_what, want_rd.err_what);
        } else if (wr == KVI_RD_ELEM) {
            assert_int_equal(ge.index, we.index);
            assert_int_equal(ge.kind, we.kind);
            assert_int_equal(ge.off, we.off);
            assert_int_equal(ge.big, we.big);
            if (we.kind == KVI_EF_TYPE)
                assert_int_equal(ge.vt, we.vt);
            if (we.kind == KVI_EF_RANGE && !we.big) {
                assert_true(ge.num.mag == we.num.mag);
                assert_int_equal(ge.num.neg, we.num.neg);
            }
        } else if (wr == 0) {
            assert_int_equal(gn, wn);
            for (size_t i = 0; i < wn; i++) {
                got_at = wide ? ((const uint64_t *)ga)[i] : ((const uint32_t *)ga)[i];
                if (!wide)
                    want[i] = (uint32_t)want[i]; /* u32 arrays keep the low 32 bits */
                if (got_at != want[i])
                    fail_msg("iter %d element %zu: %llu, want %llu", iter, i, (unsigned long long)got_at,
                             (unsigned long long)want[i]);
            }
        }
        free(want);
        free(body);
    }
    kvi_scratch_free(&s2);
    kvi_buf_free(&b);
}

static void test_str_eq(void **state)
{
    /* an absent string equals "" without handing NULL to memcmp (UBSan) */
    struct kvi_str none = {NULL, 0};
    assert_true(kvi_str_eq(none, ""));
    assert_false(kvi_str_eq(none, "a"));
    assert_true(kvi_str_eq((struct kvi_str){"ab", 2}, "ab"));
    assert_false(kvi_str_eq((struct kvi_str){"ab", 2}, "abc"));
    assert_false(kvi_str_eq((struct kvi_str){"ab", 1}, "b"));
}

static void test_u64_to_dec(void **state)
{
    char tmp[24];
    uint64_t v = 1;
    for (int i = 0; i < 20; i++, v *= 10) {
        uint64_t cases[3] = {v - 1, v, v + 1};
        for (int k = 0; k < 3; k++) {
            char want[24];
            int wl = snprintf(want, sizeof want, "%llu", (unsigned long long)cases[k]);
            size_t n = kvi_u64_to_dec(cases[k], tmp);
            assert_int_equal(n, (size_t)wl);
            assert_memory_equal(tmp, want, n);
            assert_int_equal(kvi_dec_len(cases[k]), (unsigned)wl);
        }
    }
    assert_int_equal(kvi_u64_to_dec(UINT64_MAX, tmp), 20);
    assert_memory_equal(tmp, "18446744073709551615", 20);
    assert_int_equal(kvi_dec_len(0), 1);
    for (int i = 0; i < 100000; i++) {
        uint64_t x = rnd() >> (rnd() % 64);
        char want[24];
        int wl = snprintf(want, sizeof want, "%llu", (unsigned long long)x);
        assert_int_equal(kvi_u64_to_dec(x, tmp), (size_t)wl);
        assert_memory_equal(tmp, want, (size_t)wl);
    }
}

static int count_keys(void *ctx, struct kvi_str key, enum kvi_vt vt)
{
    char *seen = ctx;
    size_t l = strlen(seen);
    snprintf(seen + l, 200 - l, "%.*s:%d,", (int)key.len, key.p, (int)vt);
    return kvi_str_eq(key, "stop");
}

static void test_peek_keys(void **state)
{
    char seen[200] = "";
    const char *body = "{\"t\":[1,2,3],\"s\":\"a]b\",\"o\":{\"x\":[\"]\"]},\"n\":-5,\"stop\":1,\"z\":2}";
    assert_int_equal(kvi_rd_peek_keys(body, strlen(body), KVI_ENC_JSON, count_keys, seen), 0);
    char want[200];
    snprintf(want, sizeof(want), "t:%d,s:%d,o:%d,n:%d,stop:%d,", KVI_VT_ARR, KVI_VT_STR, KVI_VT_OBJ,
             KVI_VT_INT, KVI_VT_INT);
    assert_string_equal(seen, want);
    seen[0] = '\0';
    assert_int_equal(kvi_rd_peek_keys("[1]", 3, KVI_ENC_JSON, count_keys, seen), -EBADMSG);
    assert_int_equal(kvi_rd_peek_keys("{\"a\":[1,2", 9, KVI_ENC_JSON, count_keys, seen), -EBADMSG);
}

/* ---- JSON writer ------------------------------------------------------------------ */

static void test_json_writer(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_wr w;
    kvi_wr_init(&w, &b, KVI_ENC_JSON);
    kvi_wr_obj(&w, 5);
    kvi_wr_keyz(&w, "a");
    kvi_wr_arr(&w, 3);
    kvi_wr_u64(&w, UINT64_MAX);
    kvi_wr_i64(&w, -3);
    kvi_wr_null(&w);
    kvi_wr_end(&w);
    kvi_wr_key_u64(&w, 42);
    kvi_wr_obj(&w, 0);
    kvi_wr_end(&w);
    kvi_wr_keyz(&w, "s\"");
    kvi_wr_strz(&w, "q\"b\\s\n\x01\xc3\xa9");
    kvi_wr_keyz(&w, "t");
    kvi_wr_bool(&w, true);
    kvi_wr_keyz(&w, "e");
    kvi_wr_arr(&w, 0);
    kvi_wr_end(&w);
    kvi_wr_end(&w);
    const char *want = "{\"a\":[18446744073709551615,-3,null],\"42\":{},\"s\\\"\":"
                       "\"q\\\"b\\\\s\\n\\u0001\xc3\xa9\",\"t\":true,\"e\":[]}";
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.data, want, b.len);
    /* what the writer escapes, the reader restores */
    struct kvi_rd rd;
    struct kvi_str k, s;
    kvi_scratch_reset(&S);
    kvi_rd_init(&rd, b.data, b.len, KVI_ENC_JSON, &S);
    assert_int_equal(kvi_rd_obj_begin(&rd), 0);
    while (kvi_rd_obj_next(&rd, &k) == 1) {
        if (kvi_str_eq(k, "s\"")) {
            assert_int_equal(kvi_rd_str(&rd, &s), 0);
            assert_str(s, "q\"b\\s\n\x01\xc3\xa9");
        } else {
            assert_int_equal(kvi_rd_skip(&rd), 0);
        }
    }
    assert_int_equal(kvi_rd_finish(&rd), 0);
    kvi_buf_free(&b);
}

/* ---- msgpack: reader against msgpack-c's packer, writer against its unpacker ---- */

static void test_msgpack_reader(void **state)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 8);
    msgpack_pack_str_with_body(&pk, "u", 1);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    msgpack_pack_str_with_body(&pk, "i", 1);
    msgpack_pack_int64(&pk, INT64_MIN);
    msgpack_pack_str_with_body(&pk, "small", 5);
    msgpack_pack_int8(&pk, -5);
    msgpack_pack_str_with_body(&pk, "f", 1);
    msgpack_pack_double(&pk, 1.5);
    char longs[300];
    memset(longs, 'x', sizeof(longs));
    msgpack_pack_str_with_body(&pk, "s", 1);
    msgpack_pack_str_with_body(&pk, longs, sizeof(longs));
    msgpack_pack_str_with_body(&pk, "b", 1);
    msgpack_pack_bin_with_body(&pk, "\x01\x02\x03", 3);
    msgpack_pack_str_with_body(&pk, "a", 1);
    msgpack_pack_array(&pk, 20);
    for (int i = 0; i < 20; i++)
        msgpack_pack_int32(&pk, i * 1000 - 3);
    msgpack_pack_str_with_body(&pk, "n", 1);
    msgpack_pack_nil(&pk);

    struct kvi_rd rd;
    struct kvi_str k, s;
    struct kvi_num n;
    const uint8_t *bin;
    size_t blen;
    kvi_scratch_reset(&S);
    kvi_rd_init(&rd, sb.data, sb.size, KVI_ENC_MSGPACK, &S);
    assert_int_equal(kvi_rd_obj_begin(&rd), 0);
    int seen = 0;
    while (kvi_rd_obj_next(&rd, &k) == 1) {
        seen++;
        if (kvi_str_eq(k, "u")) {
            assert_int_equal(kvi_rd_num(&rd, &n), 0);
            assert_true(n.mag == UINT64_MAX && !n.neg);
        } else if (kvi_str_eq(k, "i")) {
            assert_int_equal(kvi_rd_num(&rd, &n), 0);
            assert_true(n.mag == 1ull << 63 && n.neg);
        } else if (kvi_str_eq(k, "small")) {
            assert_int_equal(kvi_rd_num(&rd, &n), 0);
            assert_true(n.mag == 5 && n.neg);
        } else if (kvi_str_eq(k, "f")) {
            char what[64];
            kvi_rd_describe(&rd, what, sizeof(what));
            assert_string_equal(what, "floating point `1.5`");
            assert_int_equal(kvi_rd_num(&rd, &n), KVI_NUM_FLOAT);
        } else if (kvi_str_eq(k, "s")) {
            assert_int_equal(kvi_rd_str(&rd, &s), 0);
            assert_int_equal(s.len, 300);
        } else if (kvi_str_eq(k, "b")) {
            assert_int_equal(kvi_rd_str(&rd, &s), KVI_RD_TYPE);
            assert_int_equal(kvi_rd_bin(&rd, &bin, &blen), 0);
            assert_int_equal(blen, 3);
            assert_memory_equal(bin, "\x01\x02\x03", 3);
        } else if (kvi_str_eq(k, "a")) {
            uint32_t *a;
            size_t cnt;
            struct kvi_elem_err e;
            assert_int_equal(kvi_rd_u32_array(&rd, INT32_MIN, INT32_MAX, &a, &cnt, &e), 0);
            assert_int_equal(cnt, 20);
            assert_int_equal(a[0], (uint32_t)-3);
            assert_int_equal(a[19], 18997);
        } else if (kvi_str_eq(k, "n")) {
            assert_true(kvi_rd_null(&rd));
        }
    }
    assert_int_equal(seen, 8);
    assert_int_equal(kvi_rd_finish(&rd), 0);

    /* truncated input at every length fails cleanly */
    for (size_t cut = 0; cut < sb.size; cut++) {
        kvi_scratch_reset(&S);
        kvi_rd_init(&rd, sb.data, cut, KVI_ENC_MSGPACK, &S);
        int r = kvi_rd_skip(&rd);
        if (r == 0)
            r = kvi_rd_finish(&rd);
        assert_int_equal(r, -EBADMSG);
    }
    /* skip of the whole body */
    kvi_scratch_reset(&S);
    kvi_rd_init(&rd, sb.data, sb.size, KVI_ENC_MSGPACK, &S);
    assert_int_equal(kvi_rd_skip(&rd), 0);
    assert_int_equal(kvi_rd_finish(&rd), 0);
    msgpack_sbuffer_destroy(&sb);

    /* 0xc1 and an oversized array header */
    static const uint8_t c1[] = {0x81, 0xa1, 'a', 0xc1};
    kvi_rd_init(&rd, c1, sizeof(c1), KVI_ENC_MSGPACK, &S);
    assert_int_equal(kvi_rd_skip(&rd), -EBADMSG);
    static const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
    uint32_t *a;
    size_t cnt;
    struct kvi_elem_err e;
    kvi_rd_init(&rd, huge, sizeof(huge), KVI_ENC_MSGPACK, &S);
    assert_int_equal(kvi_rd_u32_array(&rd, 0, UINT32_MAX, &a, &cnt, &e), -EBADMSG);
    /* a map key that is not a string */
    static const uint8_t intkey[] = {0x81, 0x01, 0x02};
    struct kvi_str key;
    kvi_rd_init(&rd, intkey, sizeof(intkey), KVI_ENC_MSGPACK, &S);
    assert_int_equal(kvi_rd_obj_begin(&rd), 0);
    assert_int_equal(kvi_rd_obj_next(&rd, &key), -EBADMSG);
}

static void test_msgpack_writer(void **state)
{
    static const int64_t ints[] = {0,      1,      127,        128,         255,        256,
                                   65535,  65536,  4294967295, 4294967296LL, -1,        -32,
                                   -33,    -128,   -129,       -32768,      -32769,     INT32_MIN,
                                   (int64_t)INT32_MIN - 1, INT64_MIN, INT64_MAX};
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_wr w;
    kvi_wr_init(&w, &b, KVI_ENC_MSGPACK);
    size_t n_ints = sizeof(ints) / sizeof(ints[0]);
    kvi_wr_obj(&w, 5);
    kvi_wr_keyz(&w, "ints");
    kvi_wr_arr(&w, (uint32_t)n_ints);
    for (size_t i = 0; i < n_ints; i++)
        kvi_wr_i64(&w, ints[i]);
    kvi_wr_end(&w);
    kvi_wr_keyz(&w, "u");
    kvi_wr_u64(&w, UINT64_MAX);
    char s40[40], s300[300], s70k[70000];
    memset(s40, 'a', sizeof(s40));
    memset(s300, 'b', sizeof(s300));
    memset(s70k, 'c', sizeof(s70k));
    kvi_wr_keyz(&w, "strs");
    kvi_wr_arr(&w, 3);
    kvi_wr_str(&w, s40, sizeof(s40));
    kvi_wr_str(&w, s300, sizeof(s300));
    kvi_wr_str(&w, s70k, sizeof(s70k));
    kvi_wr_end(&w);
    kvi_wr_key_u64(&w, 7);
    kvi_wr_arr(&w, 17);
    for (int i = 0; i < 17; i++)
        kvi_wr_bool(&w, i & 1);
    kvi_wr_end(&w);
    kvi_wr_keyz(&w, "nil");
    kvi_wr_null(&w);
    kvi_wr_end(&w);
    assert_true(kvi_buf_ok(&b));

    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, b.len);
    msgpack_object o = up.data;
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o.via.map.size, 5);
    msgpack_object a = o.via.map.ptr[0].val;
    assert_int_equal(a.via.array.size, n_ints);
    for (size_t i = 0; i < n_ints; i++) {
        msgpack_object x = a.via.array.ptr[i];
        if (ints[i] >= 0) {
            assert_int_equal(x.type, MSGPACK_OBJECT_POSITIVE_INTEGER);
            assert_true(x.via.u64 == (uint64_t)ints[i]);
        } else {
            assert_int_equal(x.type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
            assert_true(x.via.i64 == ints[i]);
        }
    }
    assert_true(o.via.map.ptr[1].val.via.u64 == UINT64_MAX);
    msgpack_object strs = o.via.map.ptr[2].val;
    assert_int_equal(strs.via.array.ptr[0].via.str.size, 40);
    assert_int_equal(strs.via.array.ptr[1].via.str.size, 300);
    assert_int_equal(strs.via.array.ptr[2].via.str.size, 70000);
    assert_int_equal(o.via.map.ptr[3].key.via.str.size, 1);
    assert_memory_equal(o.via.map.ptr[3].key.via.str.ptr, "7", 1);
    assert_int_equal(o.via.map.ptr[3].val.via.array.size, 17);
    assert_true(o.via.map.ptr[3].val.via.array.ptr[1].via.boolean);
    assert_int_equal(o.via.map.ptr[4].val.type, MSGPACK_OBJECT_NIL);
    msgpack_unpacked_destroy(&up);

    /* and our own reader reads it back */
    struct kvi_rd rd;
    kvi_scratch_reset(&S);
    kvi_rd_init(&rd, b.data, b.len, KVI_ENC_MSGPACK, &S);
    assert_int_equal(kvi_rd_skip(&rd), 0);
    assert_int_equal(kvi_rd_finish(&rd), 0);
    kvi_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf),
        cmocka_unit_test(test_scratch),
        cmocka_unit_test(test_json_object_walk),
        cmocka_unit_test(test_json_strings),
        cmocka_unit_test(test_json_numbers),
        cmocka_unit_test(test_json_syntax_errors),
        cmocka_unit_test(test_json_line_col),
        cmocka_unit_test(test_json_describe),
        cmocka_unit_test(test_json_u32_array),
        cmocka_unit_test(test_json_u64_array),
        cmocka_unit_test(test_json_long_array),
        cmocka_unit_test(test_json_int_array_matches_reference),
        cmocka_unit_test(test_str_eq),
        cmocka_unit_test(test_u64_to_dec),
        cmocka_unit_test(test_peek_keys),
        cmocka_unit_test(test_json_writer),
        cmocka_unit_test(test_msgpack_reader),
        cmocka_unit_test(test_msgpack_writer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
