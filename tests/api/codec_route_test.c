/* ctest-labels: unit -- api/codec_route.c: POST /route parser (JSON and msgpack), cost ranking and response encoder */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_route.h"

static struct kvi_scratch S;
static struct kvi_api_err E;
static struct kvi_route_req Q;

static int setup(void **state)
{
    (void)state;
    kvi_scratch_init(&S);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvi_scratch_free(&S);
    return 0;
}

static int parse_json(const char *body)
{
    kvi_scratch_reset(&S);
    return kvi_route_parse(body, strlen(body), KVI_CT_JSON, &S, &Q, &E);
}

/* Expect a parse failure with @p status and a message starting with @p prefix. */
#define EXPECT_ERR(body, st, prefix)                                                                   \
    do {                                                                                               \
        int r_ = parse_json(body);                                                                     \
        if (r_ != -EINVAL || E.status != (st) || strncmp(E.msg, (prefix), strlen(prefix)) != 0)        \
            fail_msg("line %d: %s -> %d %d '%s', want %d '%s...'", __LINE__, (body), r_, E.status,      \
                     E.msg, (st), (prefix));                                                           \
    } while (0)

#define PRE "Failed to deserialize the JSON body into the target type: "

/* ---- parser --------------------------------------------------------------------------------------- */

static void test_parse_defaults(void **state)
{
    (void)state;
    assert_int_equal(parse_json("{\"model_name\":\"m\",\"token_ids\":[1,2,3,4294967295]}"), 0);
    assert_true(kvi_str_eq(Q.model_name, "m"));
    assert_true(kvi_str_eq(Q.tenant_id, "default"));
    assert_int_equal(Q.lora_name.len, 0);
    assert_int_equal(Q.input, KVI_ROUTE_TOKENS);
    assert_int_equal(Q.n_tokens, 4);
    assert_int_equal(Q.token_ids[3], 4294967295u);
    assert_false(Q.has_isl);
    assert_false(Q.commit);
    assert_false(Q.has_request_id);
    assert_true(Q.overlap_weight == 1.0);
    assert_true(Q.decode_weight == 1.0);

    /* nulls mean absent; unknown keys are ignored */
    assert_int_equal(parse_json("{\"tenant_id\":null,\"x\":{\"y\":[1]},\"model_name\":\"m\",\"lora_name\":null,"
                                "\"sequence_hashes\":[-1,9223372036854775807,18446744073709551615],"
                                "\"overlap_weight\":null,\"commit\":null}"),
                     0);
    assert_true(kvi_str_eq(Q.tenant_id, "default"));
    assert_int_equal(Q.input, KVI_ROUTE_SEQ_HASHES);
    assert_int_equal(Q.n_hashes, 3);
    assert_true(Q.hashes[0] == UINT64_MAX);
    assert_true(Q.hashes[1] == (uint64_t)INT64_MAX);
    assert_true(Q.hashes[2] == UINT64_MAX);
    assert_true(Q.overlap_weight == 1.0);
}

static void test_parse_all_fields(void **state)
{
    (void)state;
    assert_int_equal(parse_json("{\"model_name\":\"m\",\"tenant_id\":\"t\",\"block_hashes\":[5,-6],"
                                "\"new_isl_tokens\":100,\"overlap_weight\":2.5,\"decode_weight\":0,"
                                "\"commit\":true,\"request_id\":\"r-1\",\"lora_name\":\"ad\"}"),
                     0);
    assert_true(kvi_str_eq(Q.tenant_id, "t"));
    assert_int_equal(Q.input, KVI_ROUTE_BLOCK_HASHES);
    assert_int_equal(Q.n_hashes, 2);
    assert_true(Q.hashes[1] == (uint64_t)-6);
    assert_true(Q.has_isl);
    assert_int_equal(Q.new_isl_tokens, 100);
    assert_true(Q.overlap_weight == 2.5);
    assert_true(Q.decode_weight == 0.0);
    assert_true(Q.commit);
    assert_true(kvi_str_eq(Q.request_id, "r-1"));
    assert_true(kvi_str_eq(Q.lora_name, "ad"));
    assert_int_equal(parse_json("{\"model_name\":\"m\",\"token_ids\":[],\"overlap_weight\":1e-3,"
                                "\"decode_weight\":3}"),
                     0);
    assert_true(Q.overlap_weight == 1e-3);
    assert_true(Q.decode_weight == 3.0);
}

static void test_parse_errors(void **state)
{
    (void)state;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_route_parse("{}", 2, KVI_CT_OTHER, &S, &Q, &E), -EINVAL);
    assert_int_equal(E.status, 415);
    EXPECT_ERR("{\"model_name\":", 400, "Failed to parse the request body as JSON: ");
    EXPECT_ERR("[1]", 422, PRE "invalid type: sequence, expected struct RouteRequest");
    EXPECT_ERR("{\"token_ids\":[1]}", 422, PRE "missing field `model_name`");
    EXPECT_ERR("{\"model_name\":\"m\"}", 422,
               PRE "expected exactly one of `token_ids`, `block_hashes` and `sequence_hashes`");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"block_hashes\":[1]}", 422, PRE "expected exactly one");
    EXPECT_ERR("{\"model_name\":\"m\",\"model_name\":\"n\",\"token_ids\":[1]}", 422, PRE "duplicate field `model_name`");
    EXPECT_ERR("{\"model_name\":1,\"token_ids\":[1]}", 422, PRE "model_name: invalid type: integer `1`, expected a string");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1,-1]}", 422, PRE "token_ids[1]: invalid value: integer `-1`");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1,4294967296]}", 422, PRE "token_ids[1]: invalid value");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1.5]}", 422, PRE "token_ids[0]: invalid type: floating point");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":\"x\"}", 422, PRE "token_ids: invalid type: string");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"overlap_weight\":-1}", 422,
               PRE "overlap_weight: invalid value: -1, expected a finite number >= 0");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"decode_weight\":\"1\"}", 422,
               PRE "decode_weight: invalid type: string");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"overlap_weight\":1e999}", 422,
               PRE "overlap_weight: invalid value");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"commit\":1}", 422, PRE "commit: invalid type: integer");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"commit\":true}", 422,
               PRE "missing field `request_id` (required with `commit`)");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"new_isl_tokens\":-2}", 422,
               PRE "new_isl_tokens: invalid value");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1],\"new_isl_tokens\":2.5}", 422,
               PRE "new_isl_tokens: invalid type: floating point");
    EXPECT_ERR("{\"model_name\":\"m\",\"token_ids\":[1]} x", 400, "Failed to parse the request body as JSON: ");
}

static msgpack_sbuffer SB;
static msgpack_packer PK;

static void mp_begin(void)
{
    msgpack_sbuffer_destroy(&SB);
    msgpack_sbuffer_init(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
}

static void mp_key(const char *k)
{
    msgpack_pack_str_with_body(&PK, k, strlen(k));
}

static int mp_parse(void)
{
    kvi_scratch_reset(&S);
    return kvi_route_parse(SB.data, SB.size, KVI_CT_MSGPACK, &S, &Q, &E);
}

static void test_parse_msgpack(void **state)
{
    (void)state;
    msgpack_sbuffer_init(&SB);
    /* tokens as a bin of LE u32, float64 and float32 weights, an int weight */
    mp_begin();
    msgpack_pack_map(&PK, 5);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    mp_key("token_ids");
    const uint8_t raw[8] = {1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    msgpack_pack_bin_with_body(&PK, raw, sizeof(raw));
    mp_key("overlap_weight");
    msgpack_pack_double(&PK, 0.75);
    mp_key("decode_weight");
    msgpack_pack_float(&PK, 2.5f);
    mp_key("commit");
    msgpack_pack_false(&PK);
    assert_int_equal(mp_parse(), 0);
    assert_int_equal(Q.n_tokens, 2);
    assert_int_equal(Q.token_ids[0], 1);
    assert_int_equal(Q.token_ids[1], 0xffffffffu);
    assert_true(Q.overlap_weight == 0.75);
    assert_true(Q.decode_weight == 2.5);

    /* hashes as a bin of LE u64, and as an int array; an integer weight */
    mp_begin();
    msgpack_pack_map(&PK, 3);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    mp_key("sequence_hashes");
    uint8_t hraw[16] = {0};
    hraw[0] = 7;
    memset(hraw + 8, 0xff, 8);
    msgpack_pack_bin_with_body(&PK, hraw, sizeof(hraw));
    mp_key("overlap_weight");
    msgpack_pack_uint8(&PK, 4);
    assert_int_equal(mp_parse(), 0);
    assert_int_equal(Q.input, KVI_ROUTE_SEQ_HASHES);
    assert_int_equal(Q.n_hashes, 2);
    assert_true(Q.hashes[0] == 7);
    assert_true(Q.hashes[1] == UINT64_MAX);
    assert_true(Q.overlap_weight == 4.0);

    mp_begin();
    msgpack_pack_map(&PK, 2);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    mp_key("block_hashes");
    msgpack_pack_array(&PK, 2);
    msgpack_pack_int64(&PK, -5);
    msgpack_pack_uint64(&PK, UINT64_MAX);
    assert_int_equal(mp_parse(), 0);
    assert_int_equal(Q.input, KVI_ROUTE_BLOCK_HASHES);
    assert_true(Q.hashes[0] == (uint64_t)-5);

    /* a bin whose length is not a multiple of the element */
    mp_begin();
    msgpack_pack_map(&PK, 2);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    mp_key("token_ids");
    msgpack_pack_bin_with_body(&PK, raw, 3);
    assert_int_equal(mp_parse(), -EINVAL);
    assert_int_equal(E.status, 422);
    assert_non_null(strstr(E.msg, "msgpack body"));
    msgpack_sbuffer_destroy(&SB);
}

/* ---- ranking ------------------------------------------------------------------------------------------ */

static struct kvi_route_cand cand(uint64_t w, uint32_t r, uint32_t overlap, uint32_t tree, uint64_t prefill,
                                  uint64_t decode)
{
    return (struct kvi_route_cand){.worker_id = w,
                                   .dp_rank = r,
                                   .overlap_blocks = overlap,
                                   .tree_size = tree,
                                   .active_prefill_tokens = prefill,
                                   .potential_decode_blocks = decode};
}

static void test_rank_formula(void **state)
{
    (void)state;
    /* the reference router's worked example (block size 16, 128-token prompt) */
    struct kvi_route_cand c[3] = {cand(1, 0, 2, 0, 0, 10), cand(2, 0, 5, 0, 0, 5), cand(3, 0, 8, 0, 0, 9)};
    struct kvi_route_params p = {.block_size = 16, .new_isl_tokens = 128, .overlap_weight = 1.0, .decode_weight = 1.0};
    kvi_route_rank(c, 3, &p);
    assert_int_equal(c[0].worker_id, 2);
    assert_true(c[0].cost == 3.0 + 5.0);
    assert_int_equal(c[0].new_prefill_tokens, 48);
    assert_int_equal(c[1].worker_id, 3);
    assert_true(c[1].cost == 0.0 + 9.0);
    assert_int_equal(c[1].new_prefill_tokens, 0);
    assert_int_equal(c[2].worker_id, 1);
    assert_true(c[2].cost == 6.0 + 10.0);
    assert_true(c[2].prefill_blocks == 6.0);

    /* active prefill tokens add to the new ones; fractional blocks stay fractional */
    struct kvi_route_cand d[2] = {cand(1, 0, 0, 0, 8, 1), cand(1, 1, 0, 0, 0, 1)};
    struct kvi_route_params q = {.block_size = 16, .new_isl_tokens = 20, .overlap_weight = 1.0, .decode_weight = 1.0};
    kvi_route_rank(d, 2, &q);
    assert_int_equal(d[0].dp_rank, 1);
    assert_true(d[0].prefill_blocks == 20.0 / 16.0);
    assert_int_equal(d[1].potential_prefill_tokens, 28);
    assert_true(d[1].cost == 28.0 / 16.0 + 1.0);

    /* overlap x block size above the prompt: no new prefill */
    struct kvi_route_cand e1 = cand(9, 0, 100, 0, 0, 0);
    kvi_route_rank(&e1, 1, &q);
    assert_int_equal(e1.new_prefill_tokens, 0);
    assert_true(e1.cost == 0.0);
}

static void test_rank_weights_and_ties(void **state)
{
    (void)state;
    /* cached but busy (A) against idle but cold (B): the weight decides */
    struct kvi_route_params p = {.block_size = 4, .new_isl_tokens = 64, .overlap_weight = 1.0, .decode_weight = 1.0};
    struct kvi_route_cand c[2] = {cand(1, 0, 16, 16, 0, 30), cand(2, 0, 0, 0, 0, 16)};
    kvi_route_rank(c, 2, &p); /* A: 0 + 30, B: 16 + 16 */
    assert_int_equal(c[0].worker_id, 1);
    p.overlap_weight = 0.5; /* A: 30, B: 8 + 16 = 24 */
    kvi_route_rank(c, 2, &p);
    assert_int_equal(c[0].worker_id, 2);
    p.overlap_weight = 2.0;
    p.decode_weight = 0.0; /* pure cache affinity */
    kvi_route_rank(c, 2, &p);
    assert_int_equal(c[0].worker_id, 1);

    /* equal costs: smaller tree first, then (worker_id, dp_rank) */
    struct kvi_route_params t = {.block_size = 4, .new_isl_tokens = 8, .overlap_weight = 1.0, .decode_weight = 1.0};
    struct kvi_route_cand d[4] = {cand(5, 0, 0, 9, 0, 2), cand(3, 1, 0, 4, 0, 2), cand(3, 0, 0, 4, 0, 2),
                                  cand(1, 0, 0, 7, 0, 2)};
    kvi_route_rank(d, 4, &t);
    assert_int_equal(d[0].worker_id, 3);
    assert_int_equal(d[0].dp_rank, 0);
    assert_int_equal(d[1].worker_id, 3);
    assert_int_equal(d[1].dp_rank, 1);
    assert_int_equal(d[2].worker_id, 1);
    assert_int_equal(d[3].worker_id, 5);

    /* saturation: prefill tokens never wrap */
    struct kvi_route_cand s1 = cand(1, 0, 0, 0, UINT64_MAX - 1, 0);
    kvi_route_rank(&s1, 1, &t);
    assert_true(s1.potential_prefill_tokens == UINT64_MAX);
}

/* ---- encoder ------------------------------------------------------------------------------------------ */

static void test_encode_json(void **state)
{
    (void)state;
    struct kvi_route_cand c[2] = {cand(7, 0, 3, 5, 0, 4), cand(8, 1, 0, 0, 16, 2)};
    struct kvi_route_params p = {.block_size = 16, .new_isl_tokens = 64, .overlap_weight = 1.0, .decode_weight = 0.5};
    kvi_route_rank(c, 2, &p);
    struct kvi_route_answer a = {.model_name = {"m", 1}, .tenant_id = {"t\"x", 3}, .blocks = 4};
    struct kvi_buf b;
    kvi_buf_init(&b);
    assert_int_equal(kvi_route_encode(&a, &p, c, 2, KVI_ENC_JSON, &b), 0);
    const char *want =
        "{\"model_name\":\"m\",\"tenant_id\":\"t\\\"x\",\"block_size\":16,\"blocks\":4,\"new_isl_tokens\":64,"
        "\"overlap_weight\":1.0,\"decode_weight\":0.5,\"worker_id\":7,\"dp_rank\":0,\"committed\":false,"
        "\"candidates\":[{\"worker_id\":7,\"dp_rank\":0,\"overlap_blocks\":3,\"tree_size\":5,"
        "\"new_prefill_tokens\":16,\"potential_prefill_tokens\":16,\"prefill_blocks\":1.0,"
        "\"potential_decode_blocks\":4,\"active_requests\":0,\"cost\":3.0},"
        "{\"worker_id\":8,\"dp_rank\":1,\"overlap_blocks\":0,\"tree_size\":0,\"new_prefill_tokens\":64,"
        "\"potential_prefill_tokens\":80,\"prefill_blocks\":5.0,\"potential_decode_blocks\":2,"
        "\"active_requests\":0,\"cost\":6.0}]}";
    if (strlen(want) != b.len || memcmp(b.data, want, b.len) != 0)
        fail_msg("got  %.*s\nwant %s", (int)b.len, b.data, want);

    /* commit: request_id and committed; a float that needs 17 digits reads back exactly */
    kvi_buf_reset(&b);
    a.commit = true;
    a.committed = true;
    a.request_id = (struct kvi_str){"r1", 2};
    p.overlap_weight = 1.0 / 3.0;
    assert_int_equal(kvi_route_encode(&a, &p, c, 1, KVI_ENC_JSON, &b), 0);
    kvi_buf_putc(&b, '\0');
    assert_non_null(strstr(b.data, "\"committed\":true,\"request_id\":\"r1\",\"candidates\":[{"));
    const char *ow = strstr(b.data, "\"overlap_weight\":");
    assert_non_null(ow);
    assert_true(strtod(ow + strlen("\"overlap_weight\":"), NULL) == 1.0 / 3.0);
    kvi_buf_free(&b);
}

static void test_encode_msgpack(void **state)
{
    (void)state;
    struct kvi_route_cand c[3] = {cand(1, 0, 0, 0, 0, 1), cand(2, 0, 1, 1, 0, 1), cand(300, 70000, 2, 2, 5, 1)};
    struct kvi_route_params p = {.block_size = 4, .new_isl_tokens = 10, .overlap_weight = 1.5, .decode_weight = 1.0};
    kvi_route_rank(c, 3, &p);
    struct kvi_route_answer a = {.model_name = {"m", 1}, .tenant_id = {"default", 7}, .blocks = 2,
                                 .commit = true, .request_id = {"q", 1}};
    struct kvi_buf b;
    kvi_buf_init(&b);
    assert_int_equal(kvi_route_encode(&a, &p, c, 3, KVI_ENC_MSGPACK, &b), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, b.len);
    msgpack_object o = u.data;
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o.via.map.size, 12);
    bool saw_cands = false, saw_weight = false;
    for (uint32_t i = 0; i < o.via.map.size; i++) {
        msgpack_object k = o.via.map.ptr[i].key, v = o.via.map.ptr[i].val;
        assert_int_equal(k.type, MSGPACK_OBJECT_STR);
        if (k.via.str.size == 14 && memcmp(k.via.str.ptr, "overlap_weight", 14) == 0) {
            assert_int_equal(v.type, MSGPACK_OBJECT_FLOAT64);
            assert_true(v.via.f64 == 1.5);
            saw_weight = true;
        }
        if (k.via.str.size == 10 && memcmp(k.via.str.ptr, "candidates", 10) == 0) {
            assert_int_equal(v.type, MSGPACK_OBJECT_ARRAY);
            assert_int_equal(v.via.array.size, 3);
            msgpack_object c0 = v.via.array.ptr[0];
            assert_int_equal(c0.via.map.size, 10);
            assert_int_equal(c0.via.map.ptr[0].val.via.u64, c[0].worker_id);
            msgpack_object cost = c0.via.map.ptr[9].val;
            assert_int_equal(cost.type, MSGPACK_OBJECT_FLOAT64);
            assert_true(cost.via.f64 == c[0].cost);
            msgpack_object c2 = v.via.array.ptr[2];
            assert_int_equal(c2.via.map.ptr[1].val.via.u64, c[2].dp_rank);
            saw_cands = true;
        }
    }
    assert_true(saw_cands && saw_weight);
    msgpack_unpacked_destroy(&u);
    kvi_buf_free(&b);
}

static void test_err_block_size(void **state)
{
    (void)state;
    assert_int_equal(kvi_route_err_block_size(&E, (struct kvi_str){"m", 1}, (struct kvi_str){"t", 1}, 16, 32), -EINVAL);
    assert_int_equal(E.status, 409);
    assert_string_equal(E.msg, "block_size mismatch for model=m tenant=t: index=16, slot tracker=32");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_parse_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_all_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_msgpack, setup, teardown),
        cmocka_unit_test(test_rank_formula),
        cmocka_unit_test(test_rank_weights_and_ties),
        cmocka_unit_test(test_encode_json),
        cmocka_unit_test(test_encode_msgpack),
        cmocka_unit_test(test_err_block_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
