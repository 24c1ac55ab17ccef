/* ctest-labels: unit -- api/codec_dynamo.c: Dynamo dialect request parsers and response encoders (http-api.md §1) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "codec_ref.h"

static struct kvi_scratch S;
static struct kvi_api_err E;

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

static void assert_kstr(struct kvi_str s, const char *want)
{
    if (s.len != strlen(want) || memcmp(s.p, want, s.len) != 0)
        fail_msg("got '%.*s' want '%s'", (int)s.len, s.p, want);
}

static void assert_out(const struct kvi_buf *b, const char *want)
{
    if (b->len != strlen(want) || memcmp(b->data, want, b->len) != 0)
        fail_msg("got  '%.*s'\nwant '%s'", (int)b->len, b->data, want);
}

/* Expect a parse failure with @p status and exactly @p msg. */
#define EXPECT_ERR(call, st, want)                                                                 \
    do {                                                                                           \
        kvi_scratch_reset(&S);                                                                     \
        int r_ = (call);                                                                           \
        if (r_ != -EINVAL)                                                                         \
            fail_msg("line %d: returned %d", __LINE__, r_);                                        \
        if (E.status != (st) || strcmp(E.msg, (want)) != 0)                                        \
            fail_msg("line %d: got %d '%s'\nwant %d '%s'", __LINE__, E.status, E.msg, (st), (want)); \
    } while (0)

#define J(s) (s), strlen(s), KVI_CT_JSON, &S

/* ---- /register --------------------------------------------------------------------- */

static void test_register_valid(void **state)
{
    struct kvi_dyn_register r;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"tcp://127.0.0.1:5557\","
                                              "\"model_name\":\"llama-3-8b\",\"block_size\":16}"),
                                            &r, &E),
                     0);
    assert_int_equal(r.instance_id, 1);
    assert_kstr(r.endpoint, "tcp://127.0.0.1:5557");
    assert_kstr(r.model_name, "llama-3-8b");
    assert_kstr(r.tenant_id, "default");
    assert_int_equal(r.block_size, 16);
    assert_int_equal(r.dp_rank, 0);
    assert_false(r.has_replay);
    assert_false(r.has_salt);

    kvi_scratch_reset(&S);
    assert_int_equal(
        kvi_dyn_parse_register(J("{\"instance_id\":18446744073709551615,\"endpoint\":\"tcp://[::1]:5558\","
                                 "\"model_name\":\"m\",\"tenant_id\":\"customer-a\",\"block_size\":64,"
                                 "\"dp_rank\":3,\"replay_endpoint\":\"tcp://*:5560\",\"additionalsalt\":\"w8a8\","
                                 "\"unknown\":{\"nested\":[1,2]}}"),
                               &r, &E),
        0);
    assert_true(r.instance_id == UINT64_MAX);
    assert_kstr(r.tenant_id, "customer-a");
    assert_int_equal(r.dp_rank, 3);
    assert_true(r.has_replay);
    assert_kstr(r.replay_endpoint, "tcp://*:5560");
    assert_true(r.has_salt);
    assert_kstr(r.additional_salt, "w8a8");

    /* null optionals are absent; 2^63 fits */
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_register(J("{\"instance_id\":9223372036854775808,\"endpoint\":\"ipc://e\","
                                              "\"model_name\":\"m\",\"block_size\":1,\"tenant_id\":null,"
                                              "\"dp_rank\":null,\"replay_endpoint\":null}"),
                                            &r, &E),
                     0);
    assert_true(r.instance_id == 1ull << 63);
    assert_kstr(r.tenant_id, "default");
    assert_false(r.has_replay);
    assert_false(r.has_capacity);

    /* capacity_blocks (kvidx extension): a u64, null is absent */
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"ipc://e\",\"model_name\":\"m\","
                                              "\"block_size\":16,\"capacity_blocks\":18446744073709551615}"),
                                            &r, &E),
                     0);
    assert_true(r.has_capacity);
    assert_true(r.capacity_blocks == UINT64_MAX);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"ipc://e\",\"model_name\":\"m\","
                                              "\"block_size\":16,\"capacity_blocks\":null}"),
                                            &r, &E),
                     0);
    assert_false(r.has_capacity);
}

static void test_register_errors(void **state)
{
    struct kvi_dyn_register r;
    const char *pre = "Failed to deserialize the JSON body into the target type: ";
    char want[512];

    snprintf(want, sizeof(want), "%sinstance_id: invalid value: integer `-1`, expected u64 at line 1 column 16", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":-1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\",\"block_size\":16}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%sinstance_id: invalid value: integer `18446744073709551616`, expected u64 at line 1 column 16", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":18446744073709551616}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%sinstance_id: invalid type: string \"1\", expected u64 at line 1 column 16", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":\"1\"}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%sinstance_id: invalid type: floating point `1.0`, expected u64 at line 1 column 16", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1.0}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%smissing field `model_name` at line 1 column 57", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"block_size\":16}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%smissing field `instance_id` at line 1 column 3", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%sblock_size: invalid value: integer `0`, expected a nonzero u32 at line 1 column 71", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\",\"block_size\":0}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%scapacity_blocks: invalid value: integer `0`, expected a nonzero u64 at line 1 column 20", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"capacity_blocks\":0}"), &r, &E), 422, want);
    snprintf(want, sizeof(want), "%scapacity_blocks: invalid type: string \"8\", expected a nonzero u64 at line 1 column 20", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"capacity_blocks\":\"8\"}"), &r, &E), 422, want);
    snprintf(want, sizeof(want), "%scapacity_blocks: invalid value: integer `-5`, expected a nonzero u64 at line 1 column 20", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"capacity_blocks\":-5}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%sdp_rank: invalid value: integer `4294967296`, expected u32 at line 1 column 12", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"dp_rank\":4294967296}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%smodel_name: invalid type: null, expected a string at line 1 column 15", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"model_name\":null}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%smodel_name: invalid type: sequence, expected a string at line 1 column 15", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"model_name\":[1]}"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%sinvalid type: sequence, expected struct RegisterRequest at line 1 column 1", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("[1,2]"), &r, &E), 422, want);

    snprintf(want, sizeof(want), "%sduplicate field `instance_id` at line 1 column 32", pre);
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,\"instance_id\":2}"), &r, &E), 422, want);

    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,}"), &r, &E), 400,
               "Failed to parse the request body as JSON: trailing comma at line 1 column 18");
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1"), &r, &E), 400,
               "Failed to parse the request body as JSON: EOF while parsing an object at line 1 column 17");
    EXPECT_ERR(kvi_dyn_parse_register(J(""), &r, &E), 400,
               "Failed to parse the request body as JSON: EOF while parsing a value at line 1 column 1");
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\",\"block_size\":16} x"), &r, &E), 400,
               "Failed to parse the request body as JSON: trailing characters at line 1 column 75");
    EXPECT_ERR(kvi_dyn_parse_register(J("{\n\"instance_id\": 01}"), &r, &E), 400,
               "Failed to parse the request body as JSON: invalid number at line 2 column 17");

    /* endpoint validation: 400 */
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"tcp://host\",\"model_name\":\"m\",\"block_size\":16}"), &r, &E), 400,
               "invalid endpoint `tcp://host`: missing port");
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"udp://h:1\",\"model_name\":\"m\",\"block_size\":16}"), &r, &E), 400,
               "invalid endpoint `udp://h:1`: unsupported scheme");
    EXPECT_ERR(kvi_dyn_parse_register(J("{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\",\"block_size\":16,\"replay_endpoint\":\"tcp://:5\"}"), &r, &E), 400,
               "invalid replay_endpoint `tcp://:5`: missing host");

    /* Content-Type: 415 */
    const char *ok = "{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\",\"block_size\":16}";
    const char *ct415 = "Expected request with `Content-Type: application/json`";
    EXPECT_ERR(kvi_dyn_parse_register(ok, strlen(ok), KVI_CT_NONE, &S, &r, &E), 415, ct415);
    EXPECT_ERR(kvi_dyn_parse_register(ok, strlen(ok), KVI_CT_OTHER, &S, &r, &E), 415, ct415);
    EXPECT_ERR(kvi_dyn_parse_register(ok, strlen(ok), KVI_CT_MSGPACK, &S, &r, &E), 415, ct415);
}

/* ---- /unregister ------------------------------------------------------------------- */

static void test_unregister(void **state)
{
    struct kvi_dyn_unregister u;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_unregister(J("{\"instance_id\":1,\"model_name\":\"llama-3-8b\"}"), &u, &E), 0);
    assert_int_equal(u.instance_id, 1);
    assert_kstr(u.model_name, "llama-3-8b");
    assert_false(u.has_tenant);
    assert_false(u.has_dp_rank);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_unregister(J("{\"instance_id\":12345678901234567890,\"model_name\":\"m\","
                                                "\"tenant_id\":\"customer-a\",\"dp_rank\":0}"),
                                              &u, &E),
                     0);
    assert_true(u.instance_id == 12345678901234567890ull);
    assert_true(u.has_tenant);
    assert_kstr(u.tenant_id, "customer-a");
    assert_true(u.has_dp_rank);
    assert_int_equal(u.dp_rank, 0);
    EXPECT_ERR(kvi_dyn_parse_unregister(J("{\"model_name\":\"m\"}"), &u, &E), 422,
               "Failed to deserialize the JSON body into the target type: missing field `instance_id` at line 1 column 19");
}

/* ---- /query -------------------------------------------------------------------------- */

static void test_query_valid(void **state)
{
    struct kvi_dyn_query q;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query(J("{\"token_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], "
                                           "\"model_name\": \"llama-3-8b\"}"),
                                         &q, &E),
                     0);
    assert_int_equal(q.n_tokens, 16);
    assert_int_equal(q.token_ids[0], 1);
    assert_int_equal(q.token_ids[15], 16);
    assert_kstr(q.model_name, "llama-3-8b");
    assert_kstr(q.tenant_id, "default");
    assert_int_equal(q.lora_name.len, 0);

    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query(J("{\"model_name\":\"m\",\"tenant_id\":\"t\",\"lora_name\":\"sql\","
                                           "\"cache_salt\":\"s\",\"token_ids\":[0,4294967295]}"),
                                         &q, &E),
                     0);
    assert_int_equal(q.n_tokens, 2);
    assert_int_equal(q.token_ids[1], 4294967295u);
    assert_kstr(q.tenant_id, "t");
    assert_kstr(q.lora_name, "sql");
    assert_kstr(q.cache_salt, "s");

    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query(J("{\"model_name\":\"m\",\"lora_name\":null,\"token_ids\":[]}"), &q, &E), 0);
    assert_int_equal(q.n_tokens, 0);
    assert_int_equal(q.lora_name.len, 0);
}

static void test_query_errors(void **state)
{
    struct kvi_dyn_query q;
    const char *pre = "Failed to deserialize the JSON body into the target type: ";
    char want[512];
    snprintf(want, sizeof(want), "%stoken_ids[2]: invalid value: integer `4294967296`, expected u32 at line 1 column 19", pre);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":[1,2,4294967296],\"model_name\":\"m\"}"), &q, &E), 422, want);
    snprintf(want, sizeof(want), "%stoken_ids[1]: invalid value: integer `-1`, expected u32 at line 1 column 17", pre);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":[1,-1],\"model_name\":\"m\"}"), &q, &E), 422, want);
    snprintf(want, sizeof(want), "%stoken_ids[0]: invalid type: string \"1\", expected u32 at line 1 column 15", pre);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":[\"1\"],\"model_name\":\"m\"}"), &q, &E), 422, want);
    snprintf(want, sizeof(want), "%stoken_ids[0]: invalid type: floating point `2.5`, expected u32 at line 1 column 15", pre);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":[2.5],\"model_name\":\"m\"}"), &q, &E), 422, want);
    snprintf(want, sizeof(want), "%stoken_ids: invalid type: map, expected a sequence at line 1 column 14", pre);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":{},\"model_name\":\"m\"}"), &q, &E), 422, want);
    snprintf(want, sizeof(want), "%smissing field `token_ids` at line 1 column 19", pre);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"model_name\":\"m\"}"), &q, &E), 422, want);
    snprintf(want, sizeof(want), "%smissing field `model_name` at line 1 column 18", pre);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":[1]}"), &q, &E), 422, want);
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":[1,,2],\"model_name\":\"m\"}"), &q, &E), 400,
               "Failed to parse the request body as JSON: expected value at line 1 column 17");
    EXPECT_ERR(kvi_dyn_parse_query(J("{\"token_ids\":[1,2"), &q, &E), 400,
               "Failed to parse the request body as JSON: EOF while parsing a list at line 1 column 18");
}


static msgpack_sbuffer SB;
static msgpack_packer PK;

static void mp_reset(void)
{
    msgpack_sbuffer_destroy(&SB);
    msgpack_sbuffer_init(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
}

static void mp_key(const char *k)
{
    msgpack_pack_str_with_body(&PK, k, strlen(k));
}

static void test_query_msgpack(void **state)
{
    struct kvi_dyn_query q;
    /* int array (mixed widths) */
    mp_reset();
    msgpack_pack_map(&PK, 3);
    mp_key("token_ids");
    msgpack_pack_array(&PK, 5);
    msgpack_pack_uint8(&PK, 1);
    msgpack_pack_uint16(&PK, 300);
    msgpack_pack_uint32(&PK, 70000);
    msgpack_pack_uint64(&PK, 4294967295ull);
    msgpack_pack_int64(&PK, 5);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    mp_key("lora_name");
    msgpack_pack_nil(&PK);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 0);
    assert_int_equal(q.n_tokens, 5);
    assert_int_equal(q.token_ids[2], 70000);
    assert_int_equal(q.token_ids[3], 4294967295u);
    assert_int_equal(q.token_ids[4], 5);
    assert_kstr(q.tenant_id, "default");

    /* bin of little-endian u32 */
    mp_reset();
    msgpack_pack_map(&PK, 2);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    mp_key("token_ids");
    static const uint8_t raw[] = {0x65, 0, 0, 0, 0x0f, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    msgpack_pack_bin_with_body(&PK, raw, sizeof(raw));
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 0);
    assert_int_equal(q.n_tokens, 3);
    assert_int_equal(q.token_ids[0], 101);
    assert_int_equal(q.token_ids[1], 15);
    assert_int_equal(q.token_ids[2], 0xffffffffu);

    /* errors */
    mp_reset();
    msgpack_pack_map(&PK, 2);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    mp_key("token_ids");
    msgpack_pack_bin_with_body(&PK, raw, 5);
    EXPECT_ERR(kvi_dyn_parse_query(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 422,
               "Failed to deserialize the msgpack body into the target type: token_ids: invalid length 5, "
               "expected a multiple of 4 bytes at byte 31");
    mp_reset();
    msgpack_pack_map(&PK, 2);
    mp_key("token_ids");
    msgpack_pack_array(&PK, 2);
    msgpack_pack_uint8(&PK, 1);
    msgpack_pack_uint64(&PK, 4294967296ull);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    EXPECT_ERR(kvi_dyn_parse_query(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 422,
               "Failed to deserialize the msgpack body into the target type: token_ids[1]: invalid value: "
               "integer `4294967296`, expected u32 at byte 13");
    /* a valid body cut short: 400 */
    mp_reset();
    msgpack_pack_map(&PK, 2);
    mp_key("token_ids");
    msgpack_pack_array(&PK, 2);
    msgpack_pack_uint8(&PK, 1);
    msgpack_pack_uint8(&PK, 2);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    EXPECT_ERR(kvi_dyn_parse_query(SB.data, SB.size - 1, KVI_CT_MSGPACK, &S, &q, &E), 400,
               "Failed to parse the request body as msgpack: unexpected end of msgpack data at byte 25");
}

/* ---- /query_by_hash ------------------------------------------------------------------ */

static void test_query_by_hash(void **state)
{
    struct kvi_dyn_query_hash q;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query_by_hash(J("{\"block_hashes\":[123456,-1,9223372036854775807,-9223372036854775808],"
                                                   "\"model_name\":\"llama-3-8b\",\"tenant_id\":\"t\"}"),
                                                 &q, &E),
                     0);
    assert_int_equal(q.n_hashes, 4);
    assert_true(q.block_hashes[0] == 123456);
    assert_true(q.block_hashes[1] == UINT64_MAX);
    assert_true(q.block_hashes[2] == (uint64_t)INT64_MAX);
    assert_true(q.block_hashes[3] == 1ull << 63);
    assert_kstr(q.tenant_id, "t");
    EXPECT_ERR(kvi_dyn_parse_query_by_hash(J("{\"block_hashes\":[9223372036854775808],\"model_name\":\"m\"}"), &q, &E), 422,
               "Failed to deserialize the JSON body into the target type: block_hashes[0]: invalid value: "
               "integer `9223372036854775808`, expected i64 at line 1 column 18");

    /* msgpack: a u64 >= 2^63 is above i64::MAX too; bin of LE i64 */
    mp_reset();
    msgpack_pack_map(&PK, 2);
    mp_key("block_hashes");
    msgpack_pack_bin_with_body(&PK, "\xff\xff\xff\xff\xff\xff\xff\xff\x01\0\0\0\0\0\0\0", 16);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query_by_hash(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 0);
    assert_int_equal(q.n_hashes, 2);
    assert_true(q.block_hashes[0] == UINT64_MAX);
    assert_true(q.block_hashes[1] == 1);
    mp_reset();
    msgpack_pack_map(&PK, 2);
    mp_key("block_hashes");
    msgpack_pack_array(&PK, 2);
    msgpack_pack_int64(&PK, -5);
    msgpack_pack_uint64(&PK, 1ull << 63);
    mp_key("model_name");
    msgpack_pack_str_with_body(&PK, "m", 1);
    EXPECT_ERR(kvi_dyn_parse_query_by_hash(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 422,
               "Failed to deserialize the msgpack body into the target type: block_hashes[1]: invalid value: "
               "integer `9223372036854775808`, expected i64 at byte 16");
}

/* ---- peers, test routes, /workers filters --------------------------------------------- */

static void test_small_bodies(void **state)
{
    struct kvi_dyn_peer p;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_peer(J("{\"url\":\"http://peer:8091\"}"), &p, &E), 0);
    assert_kstr(p.url, "http://peer:8091");
    EXPECT_ERR(kvi_dyn_parse_peer(J("{\"uri\":\"x\"}"), &p, &E), 422,
               "Failed to deserialize the JSON body into the target type: missing field `url` at line 1 column 12");

    /* POST /zmq/bind, /zmq/unbind: block_size optional (absent or null: 0), positive when given */
    struct kvi_dyn_zbind z;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_zbind(J("{\"endpoint\":\"tcp://*:5557\",\"block_size\":16}"), false, &z, &E), 0);
    assert_kstr(z.endpoint, "tcp://*:5557");
    assert_int_equal(z.block_size, 16);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_zbind(J("{\"endpoint\":\"tcp://*:5557\",\"block_size\":null}"), false, &z, &E), 0);
    assert_int_equal(z.block_size, 0);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_zbind(J("{\"endpoint\":\"tcp://*:5557\"}"), true, &z, &E), 0);
    assert_kstr(z.endpoint, "tcp://*:5557");
    EXPECT_ERR(kvi_dyn_parse_zbind(J("{\"endpoint\":\"tcp://*:5557\",\"block_size\":0}"), false, &z, &E), 422,
               "Failed to deserialize the JSON body into the target type: block_size: invalid value: integer `0`, "
               "expected a nonzero u32 at line 1 column 41");
    EXPECT_ERR(kvi_dyn_parse_zbind(J("{\"endpoint\":\"\"}"), false, &z, &E), 422,
               "Failed to deserialize the JSON body into the target type: endpoint: invalid value: string \"\", "
               "expected a non-empty string at line 1 column 15");
    EXPECT_ERR(kvi_dyn_parse_zbind(J("{\"block_size\":4}"), false, &z, &E), 422,
               "Failed to deserialize the JSON body into the target type: missing field `endpoint` at line 1 column 17");

    struct kvi_dyn_listener_ctl l;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_listener_ctl(J("{\"instance_id\":7}"), &l, &E), 0);
    assert_int_equal(l.instance_id, 7);
    assert_int_equal(l.dp_rank, 0);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_listener_ctl(J("{\"instance_id\":7,\"dp_rank\":2}"), &l, &E), 0);
    assert_int_equal(l.dp_rank, 2);
    EXPECT_ERR(kvi_dyn_parse_listener_ctl(J("{\"dp_rank\":2}"), &l, &E), 422,
               "Failed to deserialize the JSON body into the target type: missing field `instance_id` at line 1 column 14");

    struct kvi_dyn_workers_filter f;
    kvi_scratch_reset(&S);
    const char *qs = "model_name=llama%203+8b&x=1&tenant_id=customer-a&bad=%zz";
    assert_int_equal(kvi_dyn_parse_workers_filter(qs, strlen(qs), &S, &f, &E), 0);
    assert_true(f.has_model);
    assert_kstr(f.model_name, "llama 3 8b");
    assert_true(f.has_tenant);
    assert_kstr(f.tenant_id, "customer-a");
    assert_int_equal(kvi_dyn_parse_workers_filter("", 0, &S, &f, &E), 0);
    assert_false(f.has_model);
    assert_false(f.has_tenant);
    assert_int_equal(kvi_dyn_parse_workers_filter("tenant_id=", 10, &S, &f, &E), 0);
    assert_true(f.has_tenant);
    assert_int_equal(f.tenant_id.len, 0);
    assert_int_equal(kvi_dyn_parse_workers_filter("model_name=%4", 13, &S, &f, &E), 0);
    assert_kstr(f.model_name, "%4");
}

static const struct kvi_str M = {"llama", 5}, T = {"default", 7};

static void test_handler_errors(void **state)
{
    struct {
        int r;
        int status;
        const char *msg;
    } cases[] = {
        {kvi_dyn_err_instance_elsewhere(&E, 7, M, T), 409, "instance 7 is already registered for model=llama tenant=default"},
        {kvi_dyn_err_rank_taken(&E, 7, 1), 409, "instance 7 dp_rank 1 already registered"},
        {kvi_dyn_err_block_size(&E, M, T, 16, 32), 409, "block_size mismatch for model=llama tenant=default: existing=16, requested=32"},
        {kvi_dyn_err_instance_not_found(&E, 18446744073709551615ull), 404, "instance 18446744073709551615 not found"},
        {kvi_dyn_err_instance_other_ns(&E, 7, M, T), 404, "instance 7 is registered for model=llama tenant=default"},
        {kvi_dyn_err_rank_not_found(&E, 7, 3), 404, "instance 7 dp_rank 3 not found"},
        {kvi_dyn_err_no_indexer(&E, M, T), 404, "no indexer for model=llama tenant=default"},
        {kvi_dyn_err_peer_not_found(&E), 404, "peer not found"},
        {kvi_dyn_err_listener_not_found(&E, 7, 0), 404, "listener for instance 7 dp_rank 0 not found"},
        {kvi_dyn_err_listener_state(&E, 7, 0, "paused", true), 409, "listener for instance 7 dp_rank 0 is paused: not pausable"},
    };
    /* each helper overwrote E; check them one by one */
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(cases[i].r, -EINVAL);
    struct kvi_buf b;
    const char *ct;
    kvi_buf_init(&b);
    kvi_dyn_err_no_indexer(&E, M, T);
    assert_int_equal(E.status, 404);
    assert_int_equal(kvi_err_encode(&E, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, &b, &ct), 0);
    assert_out(&b, "{\"error\":\"no indexer for model=llama tenant=default\"}");
    assert_string_equal(ct, "application/json");
    kvi_buf_free(&b);
    /* and the texts */
    kvi_dyn_err_instance_elsewhere(&E, 7, M, T);
    assert_string_equal(E.msg, cases[0].msg);
    assert_int_equal(E.status, cases[0].status);
    kvi_dyn_err_rank_taken(&E, 7, 1);
    assert_string_equal(E.msg, cases[1].msg);
    kvi_dyn_err_block_size(&E, M, T, 16, 32);
    assert_string_equal(E.msg, cases[2].msg);
    assert_int_equal(E.status, 409);
    kvi_dyn_err_instance_not_found(&E, 18446744073709551615ull);
    assert_string_equal(E.msg, cases[3].msg);
    assert_int_equal(E.status, 404);
    kvi_dyn_err_instance_other_ns(&E, 7, M, T);
    assert_string_equal(E.msg, cases[4].msg);
    kvi_dyn_err_rank_not_found(&E, 7, 3);
    assert_string_equal(E.msg, cases[5].msg);
    kvi_dyn_err_peer_not_found(&E);
    assert_string_equal(E.msg, cases[7].msg);
    kvi_dyn_err_listener_not_found(&E, 7, 0);
    assert_string_equal(E.msg, cases[8].msg);
    kvi_dyn_err_listener_state(&E, 7, 0, "paused", true);
    assert_string_equal(E.msg, cases[9].msg);
    assert_int_equal(E.status, 409);
    kvi_dyn_err_listener_state(&E, 7, 0, "active", false);
    assert_string_equal(E.msg, "listener for instance 7 dp_rank 0 is active: not resumable");

    /* a 422 from a parser, encoded */
    struct kvi_dyn_query q;
    kvi_buf_init(&b);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_dyn_parse_query(J("{\"token_ids\":[-1],\"model_name\":\"m\"}"), &q, &E), -EINVAL);
    kvi_err_encode(&E, KVI_DIALECT_DYNAMO, KVI_ENC_MSGPACK, &b, &ct);
    assert_out(&b, "{\"error\":\"Failed to deserialize the JSON body into the target type: token_ids[0]: "
                   "invalid value: integer `-1`, expected u32 at line 1 column 15\"}");
    assert_string_equal(ct, "application/json");
    kvi_buf_free(&b);
}

/* ---- responses ---------------------------------------------------------------------------- */

static void test_scores(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    /* §1.10 worked example (block size 4), rows out of order */
    struct kvi_score_row rows[] = {
        {8, NULL, 0, 2, 2, 2, 2, 0},
        {7, NULL, 0, 2, 3, 3, 2, 0},
    };
    assert_int_equal(kvi_dyn_encode_scores(rows, 2, 4, KVI_SCORE_FULL, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"scores\":{\"7\":{\"0\":8},\"8\":{\"0\":8}},\"frequencies\":[],"
                   "\"tree_sizes\":{\"7\":{\"0\":2},\"8\":{\"0\":2}},"
                   "\"instances\":{\"7\":{\"longest_matched\":12,\"gpu\":8,\"dp\":{\"0\":8},\"cpu\":12,\"disk\":12},"
                   "\"8\":{\"longest_matched\":8,\"gpu\":8,\"dp\":{\"0\":8},\"cpu\":8,\"disk\":8}}}");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_scores(rows, 2, 4, KVI_SCORE_FLAT, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"scores\":{\"7\":{\"0\":8},\"8\":{\"0\":8}},\"frequencies\":[],"
                   "\"tree_sizes\":{\"7\":{\"0\":2},\"8\":{\"0\":2}}}");

    /* no match */
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_scores(NULL, 0, 16, KVI_SCORE_FLAT, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"scores\":{},\"frequencies\":[],\"tree_sizes\":{}}");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_scores(NULL, 0, 16, KVI_SCORE_FULL, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"scores\":{},\"frequencies\":[],\"tree_sizes\":{},\"instances\":{}}");

    /* a rank with only a lower-tier extension is left out of scores but is in
     * instances; ids >= 2^63; several ranks */
    struct kvi_score_row r2[] = {
        {UINT64_MAX, NULL, 1, 0, 3, 5, 0, 0},
        {UINT64_MAX, NULL, 0, 1, 1, 1, 9, 0},
        {5, NULL, 2, 4, 4, 4, 4, 0},
        {5, NULL, 0, 2, 2, 2, 3, 0},
    };
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_scores(r2, 4, 16, KVI_SCORE_FULL, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"scores\":{\"5\":{\"0\":32,\"2\":64},\"18446744073709551615\":{\"0\":16}},\"frequencies\":[],"
                   "\"tree_sizes\":{\"5\":{\"0\":3,\"2\":4},\"18446744073709551615\":{\"0\":9}},"
                   "\"instances\":{\"5\":{\"longest_matched\":64,\"gpu\":64,\"dp\":{\"0\":32,\"2\":64},\"cpu\":64,\"disk\":64},"
                   "\"18446744073709551615\":{\"longest_matched\":80,\"gpu\":16,\"dp\":{\"0\":16,\"1\":0},\"cpu\":48,\"disk\":80}}}");

    /* msgpack mirrors the keys */
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_scores(rows, 2, 4, KVI_SCORE_FULL, KVI_ENC_MSGPACK, &b), 0);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, b.len);
    msgpack_object o = up.data;
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o.via.map.size, 4);
    const char *keys[] = {"scores", "frequencies", "tree_sizes", "instances"};
    for (int i = 0; i < 4; i++) {
        msgpack_object k = o.via.map.ptr[i].key;
        assert_int_equal(k.via.str.size, strlen(keys[i]));
        assert_memory_equal(k.via.str.ptr, keys[i], k.via.str.size);
    }
    msgpack_object sc = o.via.map.ptr[0].val;
    assert_int_equal(sc.via.map.size, 2);
    assert_memory_equal(sc.via.map.ptr[0].key.via.str.ptr, "7", 1);
    msgpack_object r7 = sc.via.map.ptr[0].val;
    assert_memory_equal(r7.via.map.ptr[0].key.via.str.ptr, "0", 1);
    assert_int_equal(r7.via.map.ptr[0].val.via.u64, 8);
    assert_int_equal(o.via.map.ptr[1].val.type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(o.via.map.ptr[1].val.via.array.size, 0);
    msgpack_object i7 = o.via.map.ptr[3].val.via.map.ptr[0].val;
    assert_int_equal(i7.via.map.size, 5);
    assert_memory_equal(i7.via.map.ptr[0].key.via.str.ptr, "longest_matched", 15);
    assert_int_equal(i7.via.map.ptr[0].val.via.u64, 12);
    msgpack_unpacked_destroy(&up);
    kvi_buf_free(&b);
}

/* ---- the score encoder against a reference on the generic writer -------------------------- */

/* The encoder as it was written on kvi_wr_* (before the direct writer): the
 * reference the direct writer must match byte for byte. */

static void ref_key(struct kvi_wr *w, const struct kvi_score_row *r)
{
    if (r->name != NULL)
        kvi_wr_keyz(w, r->name);
    else
        kvi_wr_key_u64(w, r->instance_id);
}

static bool ref_any(const struct kvi_score_row *r)
{
    return r->gpu > 0 || r->cpu > 0 || r->disk > 0;
}

static size_t ref_group(const struct kvi_score_row *rows, size_t n, size_t i, uint32_t *n_gpu, uint32_t *n_any)
{
    size_t j = i;
    *n_gpu = *n_any = 0;
    while (j < n && ref_same(&rows[i], &rows[j])) {
        *n_gpu += rows[j].gpu > 0;
        *n_any += ref_any(&rows[j]);
        j++;
    }
    return j;
}

static void ref_rank_map(struct kvi_wr *w, const struct kvi_score_row *rows, size_t n, uint32_t bs, bool tree,
                         uint32_t n_inst)
{
    kvi_wr_obj(w, n_inst);
    uint32_t ng, na;
    for (size_t i = 0, j; i < n; i = j) {
        j = ref_group(rows, n, i, &ng, &na);
        if (ng == 0)
            continue;
        ref_key(w, &rows[i]);
        kvi_wr_obj(w, ng);
        for (size_t k = i; k < j; k++) {
            if (rows[k].gpu == 0)
                continue;
            kvi_wr_key_u64(w, rows[k].dp_rank);
            kvi_wr_u64(w, tree ? rows[k].tree_size : (uint64_t)rows[k].gpu * bs);
        }
        kvi_wr_end(w);
    }
    kvi_wr_end(w);
}

static void ref_scores(struct kvi_score_row *rows, size_t n, uint32_t bs, enum kvi_score_form form,
                       enum kvi_body_enc enc, struct kvi_buf *out)
{
    ref_sort(rows, n);
    uint32_t inst_gpu = 0, inst_any = 0, ng, na;
    for (size_t i = 0, j; i < n; i = j) {
        j = ref_group(rows, n, i, &ng, &na);
        inst_gpu += ng > 0;
        inst_any += na > 0;
    }
    struct kvi_wr w;
    kvi_wr_init(&w, out, enc);
    kvi_wr_obj(&w, form == KVI_SCORE_FULL ? 4 : 3);
    kvi_wr_keyz(&w, "scores");
    ref_rank_map(&w, rows, n, bs, false, inst_gpu);
    kvi_wr_keyz(&w, "frequencies");
    kvi_wr_arr(&w, 0);
    kvi_wr_end(&w);
    kvi_wr_keyz(&w, "tree_sizes");
    ref_rank_map(&w, rows, n, bs, true, inst_gpu);
    if (form == KVI_SCORE_FULL) {
        kvi_wr_keyz(&w, "instances");
        kvi_wr_obj(&w, inst_any);
        for (size_t i = 0, j; i < n; i = j) {
            j = ref_group(rows, n, i, &ng, &na);
            if (na == 0)
                continue;
            uint64_t g = 0, c = 0, d = 0;
            for (size_t k = i; k < j; k++) {
                g = rows[k].gpu > g ? rows[k].gpu : g;
                c = rows[k].cpu > c ? rows[k].cpu : c;
                d = rows[k].disk > d ? rows[k].disk : d;
            }
            uint64_t lm = g > c ? g : c;
            lm = d > lm ? d : lm;
            ref_key(&w, &rows[i]);
            kvi_wr_obj(&w, 5);
            kvi_wr_keyz(&w, "longest_matched");
            kvi_wr_u64(&w, lm * bs);
            kvi_wr_keyz(&w, "gpu");
            kvi_wr_u64(&w, g * bs);
            kvi_wr_keyz(&w, "dp");
            kvi_wr_obj(&w, na);
            for (size_t k = i; k < j; k++) {
                if (!ref_any(&rows[k]))
                    continue;
                kvi_wr_key_u64(&w, rows[k].dp_rank);
                kvi_wr_u64(&w, (uint64_t)rows[k].gpu * bs);
            }
            kvi_wr_end(&w);
            kvi_wr_keyz(&w, "cpu");
            kvi_wr_u64(&w, c * bs);
            kvi_wr_keyz(&w, "disk");
            kvi_wr_u64(&w, d * bs);
            kvi_wr_end(&w);
        }
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static uint32_t rnd_u32_value(void)
{
    switch (rnd() % 6) {
    case 0: return 0;
    case 1: return 1;
    case 2: return UINT32_MAX;
    case 3: return (uint32_t)(rnd() % 300);
    case 4: return (uint32_t)(rnd() % 70000);
    default: return (uint32_t)rnd();
    }
}

/* Random rows with unique (instance, rank): ids and names from small pools so
 * instances have several ranks, values at the encodings' edges. */
static size_t random_rows(struct kvi_score_row *rows, size_t max, bool named)
{
    static const char *names[] = {"a", "b", "node-1", "quote\"back\\slash", "tab\tnl\nctl\x01\x1f",
                                  "\xc3\xbc-utf8", "a-name-longer-than-thirty-one-bytes-for-str8",
                                  "zz"};
    static const uint64_t ids[] = {0, 1, 7, 15, 16, 127, 128, 255, 256, 65535, 65536,
                                   UINT32_MAX, (uint64_t)UINT32_MAX + 1, 1ull << 63, UINT64_MAX};
    size_t n = (size_t)(rnd() % (max + 1));
    size_t k = 0;
    for (size_t tries = 0; k < n && tries < 4 * max; tries++) {
        struct kvi_score_row r = {0};
        if (named && rnd() % 2)
            r.name = names[rnd() % (sizeof names / sizeof names[0])];
        else
            r.instance_id = rnd() % 4 == 0 ? rnd() : ids[rnd() % (sizeof ids / sizeof ids[0])];
        r.dp_rank = rnd() % 8 == 0 ? (uint32_t)rnd() : (uint32_t)(rnd() % 20);
        r.gpu = rnd_u32_value();
        r.cpu = rnd_u32_value();
        r.disk = rnd_u32_value();
        r.tree_size = rnd_u32_value();
        bool dup = false;
        for (size_t i = 0; i < k && !dup; i++)
            dup = ref_same(&rows[i], &r) && rows[i].dp_rank == r.dp_rank;
        if (!dup)
            rows[k++] = r;
    }
    return k;
}

static void test_scores_match_reference(void **state)
{
    enum { MAX_ROWS = 80 };
    static const uint32_t block_sizes[] = {1, 16, 64, UINT32_MAX};
    struct kvi_score_row rows[MAX_ROWS], a[MAX_ROWS], b[MAX_ROWS];
    struct kvi_buf want, got;
    kvi_buf_init(&want);
    kvi_buf_init(&got);
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = random_rows(rows, iter % 10 == 0 ? MAX_ROWS : 20, iter % 3 == 0);
        uint32_t bs = block_sizes[rnd() % 4];
        for (int f = 0; f < 2; f++) {
            for (int enc = 0; enc < 2; enc++) {
                memcpy(a, rows, sizeof rows);
                memcpy(b, rows, sizeof rows);
                kvi_buf_reset(&want);
                kvi_buf_reset(&got);
                ref_scores(a, n, bs, (enum kvi_score_form)f, (enum kvi_body_enc)enc, &want);
                assert_true(kvi_buf_ok(&want));
                assert_int_equal(
                    kvi_dyn_encode_scores(b, n, bs, (enum kvi_score_form)f, (enum kvi_body_enc)enc, &got), 0);
                if (got.len != want.len || memcmp(got.data, want.data, got.len) != 0)
                    fail_msg("iter %d form %d enc %d n %zu:\ngot  '%.*s'\nwant '%.*s'", iter, f, enc, n, (int)got.len,
                             got.data, (int)want.len, want.data);
                /* the bound holds, and the caller-memory variant writes the same bytes into exactly that much */
                size_t max = kvi_dyn_scores_max_len(rows, n);
                assert_true(got.len <= max);
                char *dst = malloc(max);
                memcpy(b, rows, sizeof rows);
                size_t len = kvi_dyn_encode_scores_to(b, n, bs, (enum kvi_score_form)f, (enum kvi_body_enc)enc, dst);
                assert_int_equal(len, want.len);
                assert_memory_equal(dst, want.data, len);
                free(dst);
            }
        }
    }
    /* many rows: the qsort path, several-hundred-entry maps (map16 headers) */
    struct kvi_score_row *big = calloc(700, sizeof *big), *big2 = calloc(700, sizeof *big2);
    for (size_t i = 0; i < 700; i++)
        big[i] = (struct kvi_score_row){.instance_id = (i * 7919) % 350, .dp_rank = (uint32_t)(i % 2),
                                        .gpu = (uint32_t)i, .cpu = (uint32_t)i + 1, .disk = (uint32_t)i + 2,
                                        .tree_size = (uint32_t)i};
    for (int enc = 0; enc < 2; enc++) {
        memcpy(big2, big, 700 * sizeof *big);
        kvi_buf_reset(&want);
        ref_scores(big2, 700, 16, KVI_SCORE_FULL, (enum kvi_body_enc)enc, &want);
        memcpy(big2, big, 700 * sizeof *big);
        kvi_buf_reset(&got);
        assert_int_equal(kvi_dyn_encode_scores(big2, 700, 16, KVI_SCORE_FULL, (enum kvi_body_enc)enc, &got), 0);
        assert_int_equal(got.len, want.len);
        assert_memory_equal(got.data, want.data, got.len);
    }
    free(big);
    free(big2);
    /* a buffer that already failed stays failed */
    got.oom = true;
    assert_int_equal(kvi_dyn_encode_scores(rows, 0, 16, KVI_SCORE_FULL, KVI_ENC_JSON, &got), -ENOMEM);
    kvi_buf_free(&want);
    kvi_buf_free(&got);
}

static void test_workers_status_misc(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    /* liveness keys after the others: counts, null for "no message yet" and "not monitored" */
    struct kvi_listener_view l1[] = {
        {0, "tcp://127.0.0.1:5557", KVI_LS_ACTIVE, NULL, true, 42, true, 3, 1, 4096},
        {1, "tcp://127.0.0.1:5558", KVI_LS_FAILED, "failed to connect ZMQ SUB socket to tcp://127.0.0.1:5558", true, 0,
         false, 0, 0, 0},
    };
    struct kvi_listener_view l2[] = {
        {0, "tcp://h:1", KVI_LS_PAUSED, NULL, true, 7, true, 0, -1, 0},
        {1, "tcp://h:2", KVI_LS_ACTIVE, NULL, false, 0, false, 0, 0, 0},
    };
    struct kvi_listener_view l3[] = {
        {0, "tcp://h:3", KVI_LS_PAUSED, NULL, false, 0, false, 0, 0, 0},
        {2, "tcp://h:4", KVI_LS_PENDING, NULL, false, 0, false, 0, 0, 0},
    };
    struct kvi_worker_view w[] = {
        {1, "llama-3-8b", "default", 16, NULL, l1, 2, NULL},
        {18446744073709551615ull, "m", "t", 32, "zmq", l2, 2, NULL},
        {3, "m", "t", 32, NULL, l3, 2, NULL},
    };
    assert_int_equal(kvi_dyn_encode_workers(w, 3, &b), 0);
    assert_out(&b, "[{\"instance_id\":1,\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\",\"block_size\":16,"
                   "\"source\":\"zmq\",\"status\":\"failed\","
                   "\"endpoints\":{\"0\":\"tcp://127.0.0.1:5557\",\"1\":\"tcp://127.0.0.1:5558\"},"
                   "\"listeners\":{\"0\":{\"endpoint\":\"tcp://127.0.0.1:5557\",\"capacity_blocks\":4096,"
                   "\"status\":\"active\","
                   "\"messages\":42,\"seconds_since_last_message\":3,\"connected\":true},"
                   "\"1\":{\"endpoint\":\"tcp://127.0.0.1:5558\",\"status\":\"failed\","
                   "\"last_error\":\"failed to connect ZMQ SUB socket to tcp://127.0.0.1:5558\","
                   "\"messages\":0,\"seconds_since_last_message\":null,\"connected\":false}}},"
                   "{\"instance_id\":18446744073709551615,\"model_name\":\"m\",\"tenant_id\":\"t\",\"block_size\":32,"
                   "\"source\":\"zmq\",\"status\":\"active\",\"endpoints\":{\"0\":\"tcp://h:1\",\"1\":\"tcp://h:2\"},"
                   "\"listeners\":{\"0\":{\"endpoint\":\"tcp://h:1\",\"status\":\"paused\","
                   "\"messages\":7,\"seconds_since_last_message\":0,\"connected\":null},"
                   "\"1\":{\"endpoint\":\"tcp://h:2\",\"status\":\"active\"}}},"
                   "{\"instance_id\":3,\"model_name\":\"m\",\"tenant_id\":\"t\",\"block_size\":32,"
                   "\"source\":\"zmq\",\"status\":\"pending\",\"endpoints\":{\"0\":\"tcp://h:3\",\"2\":\"tcp://h:4\"},"
                   "\"listeners\":{\"0\":{\"endpoint\":\"tcp://h:3\",\"status\":\"paused\"},"
                   "\"2\":{\"endpoint\":\"tcp://h:4\",\"status\":\"pending\"}}}]");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_workers(NULL, 0, &b), 0);
    assert_out(&b, "[]");
    /* a string id (--zmq-bind pods): instance_id is the string */
    kvi_buf_reset(&b);
    struct kvi_worker_view ws = {0, "m1", "default", 16, "zmq-bind", l3, 1, "pod-\"a\""};
    assert_int_equal(kvi_dyn_encode_workers(&ws, 1, &b), 0);
    assert_out(&b, "[{\"instance_id\":\"pod-\\\"a\\\"\",\"model_name\":\"m1\",\"tenant_id\":\"default\",\"block_size\":16,"
                   "\"source\":\"zmq-bind\",\"status\":\"paused\",\"endpoints\":{\"0\":\"tcp://h:3\"},"
                   "\"listeners\":{\"0\":{\"endpoint\":\"tcp://h:3\",\"status\":\"paused\"}}}]");

    kvi_buf_reset(&b);
    struct kvi_status_view st = {.reason = "waiting_for_min_initial_workers", .required_initial = 2,
                                  .registered = 1, .pending = 1};
    assert_int_equal(kvi_dyn_encode_status(&st, &b), 0);
    assert_out(&b, "{\"ready\":false,\"reason\":\"waiting_for_min_initial_workers\","
                   "\"recovery\":{\"enabled\":false,\"in_progress\":false},"
                   "\"workers\":{\"required_initial\":2,\"registered\":1},"
                   "\"listeners\":{\"pending\":1,\"active\":0,\"paused\":0,\"failed\":0}}");
    kvi_buf_reset(&b);
    struct kvi_status_view st2 = {.ready = true, .reason = "ready", .recovery_enabled = true,
                                   .last_result = "succeeded", .registered = 3, .active = 3};
    assert_int_equal(kvi_dyn_encode_status(&st2, &b), 0);
    assert_out(&b, "{\"ready\":true,\"reason\":\"ready\","
                   "\"recovery\":{\"enabled\":true,\"in_progress\":false,\"last_result\":\"succeeded\"},"
                   "\"workers\":{\"required_initial\":0,\"registered\":3},"
                   "\"listeners\":{\"pending\":0,\"active\":3,\"paused\":0,\"failed\":0}}");
    /* with --nats: the connection and the stream messages still to deliver */
    kvi_buf_reset(&b);
    struct kvi_status_view st3 = {.reason = "nats_catching_up", .has_nats = true, .nats_connected = true,
                                   .nats_pending = 42};
    assert_int_equal(kvi_dyn_encode_status(&st3, &b), 0);
    assert_out(&b, "{\"ready\":false,\"reason\":\"nats_catching_up\","
                   "\"recovery\":{\"enabled\":false,\"in_progress\":false},"
                   "\"workers\":{\"required_initial\":0,\"registered\":0},"
                   "\"listeners\":{\"pending\":0,\"active\":0,\"paused\":0,\"failed\":0},"
                   "\"nats\":{\"connected\":true,\"pending\":42}}");
    /* with --nats-publish: the bridge's stream, counters and each namespace's subject filter */
    kvi_buf_reset(&b);
    st3.has_bridge = true;
    st3.bridge_stream = "KVB";
    st3.bridge = (struct kvi_nats_bridge_stats){.events = 9, .acked = 7, .duplicates = 1, .errors = 2, .dropped = 0,
                                                .queued = 1, .pending = 1, .skipped = 3, .stream_ready = true};
    st3.bridge_ns[0] = (struct kvi_nats_bridge_ns_view){"m", "default", "KVB.6d.64656661756c74.>"};
    st3.n_bridge_ns = 1;
    assert_int_equal(kvi_dyn_encode_status(&st3, &b), 0);
    assert_out(&b, "{\"ready\":false,\"reason\":\"nats_catching_up\","
                   "\"recovery\":{\"enabled\":false,\"in_progress\":false},"
                   "\"workers\":{\"required_initial\":0,\"registered\":0},"
                   "\"listeners\":{\"pending\":0,\"active\":0,\"paused\":0,\"failed\":0},"
                   "\"nats\":{\"connected\":true,\"pending\":42},"
                   "\"nats_bridge\":{\"stream\":\"KVB\",\"stream_ready\":true,\"events\":9,\"acked\":7,"
                   "\"duplicates\":1,\"errors\":2,\"dropped\":0,\"queued\":1,\"pending\":1,\"skipped\":3,"
                   "\"namespaces_total\":1,\"namespaces\":[{\"model_name\":\"m\",\"tenant_id\":\"default\","
                   "\"subject\":\"KVB.6d.64656661756c74.>\"}]}}");

    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_ready(true, "ready", &b), 0);
    assert_out(&b, "{\"ready\":true,\"reason\":\"ready\"}");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_ready(false, "recovering_from_peer", &b), 0);
    assert_out(&b, "{\"ready\":false,\"reason\":\"recovering_from_peer\"}");

    kvi_buf_reset(&b);
    const char *urls[] = {"http://peer:8091", "http://a\"b"};
    assert_int_equal(kvi_dyn_encode_peers(urls, 2, &b), 0);
    assert_out(&b, "[\"http://peer:8091\",\"http://a\\\"b\"]");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_peers(NULL, 0, &b), 0);
    assert_out(&b, "[]");

    kvi_buf_reset(&b);
    assert_int_equal(kvi_dyn_encode_ok(&b), 0);
    assert_out(&b, "{\"status\":\"ok\"}");
    kvi_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_valid),
        cmocka_unit_test(test_register_errors),
        cmocka_unit_test(test_unregister),
        cmocka_unit_test(test_query_valid),
        cmocka_unit_test(test_query_errors),
        cmocka_unit_test(test_query_msgpack),
        cmocka_unit_test(test_query_by_hash),
        cmocka_unit_test(test_small_bodies),
        cmocka_unit_test(test_handler_errors),
        cmocka_unit_test(test_scores),
        cmocka_unit_test(test_scores_match_reference),
        cmocka_unit_test(test_workers_status_misc),
    };
    int r = cmocka_run_group_tests(tests, setup, teardown);
    msgpack_sbuffer_destroy(&SB);
    return r;
}
