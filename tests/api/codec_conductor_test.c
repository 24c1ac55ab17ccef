/* ctest-labels: unit -- api/codec_conductor.c: Conductor dialect request parsers and response encoders (http-api.md §2) */
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
static msgpack_sbuffer SB;
static msgpack_packer PK;

static int setup(void **state)
{
    kvi_scratch_init(&S);
    msgpack_sbuffer_init(&SB);
    return 0;
}

static int teardown(void **state)
{
    kvi_scratch_free(&S);
    msgpack_sbuffer_destroy(&SB);
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

#define J(s) (s), strlen(s), KVI_CT_JSON, &S

/* Expect a 400 whose encoded JSON body is exactly @p body (with its "\n"). */
#define EXPECT_400(call, body)                                                                     \
    do {                                                                                           \
        kvi_scratch_reset(&S);                                                                     \
        int r_ = (call);                                                                           \
        if (r_ != -EINVAL)                                                                         \
            fail_msg("line %d: returned %d", __LINE__, r_);                                        \
        assert_int_equal(E.status, 400);                                                           \
        struct kvi_buf b_;                                                                         \
        const char *ct_;                                                                           \
        kvi_buf_init(&b_);                                                                         \
        assert_int_equal(kvi_err_encode(&E, KVI_DIALECT_CONDUCTOR, KVI_ENC_JSON, &b_, &ct_), 0);   \
        if (b_.len != strlen(body) || memcmp(b_.data, body, b_.len) != 0)                          \
            fail_msg("line %d:\ngot  '%.*s'\nwant '%s'", __LINE__, (int)b_.len, b_.data, body);    \
        assert_string_equal(ct_, KVI_MIME_JSON);                                                   \
        kvi_buf_free(&b_);                                                                         \
    } while (0)

static const char *REG_DOC =
    "{\"endpoint\": \"tcp://1.1.1.1:5557\", \"replay_endpoint\": \"tcp://1.1.1.1:5558\","
    " \"type\": \"vLLM\", \"modelname\": \"deepseek\", \"lora_name\": \"sql-adapter\","
    " \"tenant_id\": \"default\", \"instance_id\": \"vllm-prefill-node1\","
    " \"block_size\": 128, \"dp_rank\": 0, \"additionalsalt\": \"w8a8\"}";

/* ---- /register ------------------------------------------------------------------------ */

static void test_register_valid(void **state)
{
    struct kvi_cond_register r;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_register(J(REG_DOC), &r, &E), 0);
    assert_kstr(r.endpoint, "tcp://1.1.1.1:5557");
    assert_kstr(r.replay_endpoint, "tcp://1.1.1.1:5558");
    assert_int_equal(r.type, KVI_COND_VLLM);
    assert_kstr(r.model_name, "deepseek");
    assert_kstr(r.lora_name, "sql-adapter");
    assert_kstr(r.tenant_id, "default");
    assert_true(r.has_instance);
    assert_kstr(r.instance_id, "vllm-prefill-node1");
    assert_int_equal(r.block_size, 128);
    assert_int_equal(r.dp_rank, 0);
    assert_kstr(r.additional_salt, "w8a8");
    assert_false(r.has_cache_group);
    assert_false(r.has_hash_profile);

    /* defaults, the `model` alias, case-insensitive type, a Mooncake stream
     * without instance_id, cache_group 0, hash_profile with a numeric seed */
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_register(
                         J("{\"endpoint\":\"tcp://m:1\",\"type\":\"MOONCAKE\",\"model\":\"ds\",\"block_size\":64,"
                           "\"dp_rank\":2147483647,\"tenant_id\":\"\",\"cache_group\":0,"
                           "\"hash_profile\":{\"strategy\":\"vllm_v1\",\"algorithm\":\"sha256_cbor\","
                           "\"python_hash_seed\":0,\"root_digest\":\"ab\",\"index_projection\":\"low64_be\","
                           "\"future\":[1]}}"),
                         &r, &E),
                     0);
    assert_int_equal(r.type, KVI_COND_MOONCAKE);
    assert_kstr(r.model_name, "ds");
    assert_kstr(r.tenant_id, "default");
    assert_false(r.has_instance);
    assert_int_equal(r.dp_rank, 2147483647);
    assert_int_equal(r.replay_endpoint.len, 0);
    assert_int_equal(r.lora_name.len, 0);
    assert_true(r.has_cache_group);
    assert_true(r.has_hash_profile);
    assert_kstr(r.hash_profile.strategy, "vllm_v1");
    assert_kstr(r.hash_profile.python_hash_seed, "0");
    assert_kstr(r.hash_profile.index_projection, "low64_be");

    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"type\":\"sglang\",\"modelname\":\"ds\","
                                               "\"instance_id\":\"s1\",\"block_size\":1,\"dp_rank\":0,"
                                               "\"cache_group\":null,\"additional_salt\":\"x\"}"),
                                             &r, &E),
                     0);
    assert_int_equal(r.type, KVI_COND_SGLANG);
    assert_false(r.has_cache_group);
    assert_kstr(r.additional_salt, "x");

    /* the same body in msgpack */
    msgpack_sbuffer_clear(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
    msgpack_pack_map(&PK, 6);
    const char *kv[][2] = {{"endpoint", "tcp://1.1.1.1:5557"}, {"type", "vLLM"}, {"modelname", "deepseek"},
                           {"instance_id", "vllm-prefill-node1"}};
    for (int i = 0; i < 4; i++) {
        msgpack_pack_str_with_body(&PK, kv[i][0], strlen(kv[i][0]));
        msgpack_pack_str_with_body(&PK, kv[i][1], strlen(kv[i][1]));
    }
    msgpack_pack_str_with_body(&PK, "block_size", 10);
    msgpack_pack_uint16(&PK, 128);
    msgpack_pack_str_with_body(&PK, "dp_rank", 7);
    msgpack_pack_int8(&PK, 3);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_register(SB.data, SB.size, KVI_CT_MSGPACK, &S, &r, &E), 0);
    assert_kstr(r.instance_id, "vllm-prefill-node1");
    assert_int_equal(r.block_size, 128);
    assert_int_equal(r.dp_rank, 3);
}

static void test_register_errors(void **state)
{
    struct kvi_cond_register r;
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"type\":\"trt\",\"modelname\":\"ds\",\"instance_id\":\"a\",\"block_size\":1,\"dp_rank\":0}"), &r, &E),
               "{\"error\":\"type must be vLLM, SGLang or Mooncake\",\"reason\":\"invalid_value\",\"field\":\"type\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"type\":\"vLLM\",\"modelname\":\"ds\",\"block_size\":1,\"dp_rank\":0}"), &r, &E),
               "{\"error\":\"missing required field: instance_id\",\"reason\":\"missing\",\"field\":\"instance_id\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"type\":\"vLLM\",\"instance_id\":\"a\",\"block_size\":1,\"dp_rank\":0}"), &r, &E),
               "{\"error\":\"missing required field: modelname\",\"reason\":\"missing\",\"field\":\"modelname\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"type\":\"vLLM\",\"modelname\":\"ds\",\"instance_id\":7,\"block_size\":1,\"dp_rank\":0}"), &r, &E),
               "{\"error\":\"instance_id must be a string\",\"reason\":\"invalid_type\",\"field\":\"instance_id\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"type\":\"vLLM\",\"modelname\":\"\",\"instance_id\":\"a\",\"block_size\":1,\"dp_rank\":0}"), &r, &E),
               "{\"error\":\"modelname must be a non-empty string\",\"reason\":\"invalid_value\",\"field\":\"modelname\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"block_size\":0}"), &r, &E),
               "{\"error\":\"block_size must be greater than 0\",\"reason\":\"invalid_value\",\"field\":\"block_size\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"block_size\":-4}"), &r, &E),
               "{\"error\":\"block_size must be greater than 0\",\"reason\":\"invalid_value\",\"field\":\"block_size\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"block_size\":\"16\"}"), &r, &E),
               "{\"error\":\"block_size must be an integer\",\"reason\":\"invalid_type\",\"field\":\"block_size\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"block_size\":16.5}"), &r, &E),
               "{\"error\":\"block_size must be an integer\",\"reason\":\"invalid_type\",\"field\":\"block_size\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"block_size\":4294967296}"), &r, &E),
               "{\"error\":\"block_size is out of range\",\"reason\":\"out_of_range\",\"field\":\"block_size\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"dp_rank\":-1}"), &r, &E),
               "{\"error\":\"dp_rank must be between 0 and 2147483647\",\"reason\":\"out_of_range\",\"field\":\"dp_rank\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"dp_rank\":2147483648}"), &r, &E),
               "{\"error\":\"dp_rank must be between 0 and 2147483647\",\"reason\":\"out_of_range\",\"field\":\"dp_rank\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"lora_id\":1}"), &r, &E),
               "{\"error\":\"unsupported request field: lora_id\",\"reason\":\"unknown_field\",\"field\":\"lora_id\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"cache_group\":1}"), &r, &E),
               "{\"error\":\"cache_group 1 is not supported (only 0)\",\"reason\":\"unsupported\",\"field\":\"cache_group\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"cache_group\":\"0\"}"), &r, &E),
               "{\"error\":\"cache_group must be an integer or null\",\"reason\":\"invalid_type\",\"field\":\"cache_group\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"hash_profile\":\"vllm\"}"), &r, &E),
               "{\"error\":\"hash_profile must be an object\",\"reason\":\"invalid_type\",\"field\":\"hash_profile\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"hash_profile\":{\"algorithm\":5}}"), &r, &E),
               "{\"error\":\"hash_profile.algorithm must be a string\",\"reason\":\"invalid_type\",\"field\":\"hash_profile.algorithm\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"modelname\":\"a\",\"model\":\"b\"}"), &r, &E),
               "{\"error\":\"duplicate request field: model\",\"reason\":\"invalid_value\",\"field\":\"model\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m\",\"type\":\"vLLM\",\"modelname\":\"ds\",\"instance_id\":\"a\",\"block_size\":1,\"dp_rank\":0}"), &r, &E),
               "{\"error\":\"endpoint is not a valid ZMQ endpoint: missing port\",\"reason\":\"invalid_value\",\"field\":\"endpoint\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\",\"replay_endpoint\":\"x\",\"type\":\"vLLM\",\"modelname\":\"ds\",\"instance_id\":\"a\",\"block_size\":1,\"dp_rank\":0}"), &r, &E),
               "{\"error\":\"replay_endpoint is not a valid ZMQ endpoint: missing scheme\",\"reason\":\"invalid_value\",\"field\":\"replay_endpoint\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"endpoint\":\"tcp://m:1\","), &r, &E),
               "{\"error\":\"Invalid JSON object\",\"reason\":\"invalid_json\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("[1]"), &r, &E),
               "{\"error\":\"Invalid JSON object\",\"reason\":\"invalid_json\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{} {}"), &r, &E),
               "{\"error\":\"Invalid JSON object\",\"reason\":\"invalid_json\"}\n");
    /* the whole document is checked before validation (JsonCpp): a syntax
     * error after a validation error still answers invalid_json */
    EXPECT_400(kvi_cond_parse_register(J("{\"block_size\":0,\"x\":}"), &r, &E),
               "{\"error\":\"Invalid JSON object\",\"reason\":\"invalid_json\"}\n");
    EXPECT_400(kvi_cond_parse_register(J("{\"foo\":1,\"type\":\"vLLM\""), &r, &E),
               "{\"error\":\"Invalid JSON object\",\"reason\":\"invalid_json\"}\n");
    EXPECT_400(kvi_cond_parse_register("\x81\xa1", 2, KVI_CT_MSGPACK, &S, &r, &E),
               "{\"error\":\"Invalid msgpack object\",\"reason\":\"invalid_json\"}\n");
    /* a JSON-looking body with a msgpack Content-Type is msgpack (and broken) */
    EXPECT_400(kvi_cond_parse_register(REG_DOC, strlen(REG_DOC), KVI_CT_MSGPACK, &S, &r, &E),
               "{\"error\":\"Invalid msgpack object\",\"reason\":\"invalid_json\"}\n");
}

/* ---- /unregister ------------------------------------------------------------------------ */

static void test_unregister(void **state)
{
    struct kvi_cond_unregister u;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_unregister(J("{\"type\":\"vLLM\",\"modelname\":\"deepseek\",\"lora_name\":\"sql-adapter\","
                                                 "\"tenant_id\":\"default\",\"instance_id\":\"vllm-prefill-node1\","
                                                 "\"block_size\":128,\"dp_rank\":0}"),
                                               &u, &E),
                     0);
    assert_kstr(u.instance_id, "vllm-prefill-node1");
    assert_kstr(u.tenant_id, "default");
    assert_int_equal(u.dp_rank, 0);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_unregister(J("{\"instance_id\":\"w\",\"dp_rank\":1}"), &u, &E), 0);
    assert_kstr(u.tenant_id, "default");
    assert_int_equal(u.dp_rank, 1);
    EXPECT_400(kvi_cond_parse_unregister(J("{\"instance_id\":\"w\"}"), &u, &E),
               "{\"error\":\"missing required field: dp_rank\",\"reason\":\"missing\",\"field\":\"dp_rank\"}\n");
    EXPECT_400(kvi_cond_parse_unregister(J("{\"instance_id\":\"w\",\"dp_rank\":0,\"endpoint\":\"x\"}"), &u, &E),
               "{\"error\":\"unsupported request field: endpoint\",\"reason\":\"unknown_field\",\"field\":\"endpoint\"}\n");
    EXPECT_400(kvi_cond_parse_unregister(J("{\"instance_id\":\"\",\"dp_rank\":0}"), &u, &E),
               "{\"error\":\"instance_id must be a non-empty string\",\"reason\":\"invalid_value\",\"field\":\"instance_id\"}\n");
}

/* ---- /query, /query_by_hash -------------------------------------------------------------- */

static void test_query(void **state)
{
    struct kvi_cond_query q;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query(J("{\"model\": \"deepseek\", \"lora_name\": \"sql-adapter\","
                                            " \"token_ids\": [101, 15, 100, 55, 89], \"tenant_id\": \"default\","
                                            " \"instance_id\": \"vllm-prefill-node1\", \"block_size\": 64,"
                                            " \"cache_salt\": \"w8a8\"}"),
                                          &q, &E),
                     0);
    assert_kstr(q.model, "deepseek");
    assert_int_equal(q.block_size, 64);
    assert_int_equal(q.n_tokens, 5);
    assert_int_equal(q.token_ids[0], 101);
    assert_int_equal(q.token_ids[4], 89);
    assert_kstr(q.lora_name, "sql-adapter");
    assert_true(q.has_instance);
    assert_kstr(q.instance_id, "vllm-prefill-node1");
    assert_kstr(q.cache_salt, "w8a8");

    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query(J("{\"model\":\"m\",\"block_size\":4,\"token_ids\":[-1,-2147483648,2147483647],"
                                            "\"instance_id\":\"\",\"cache_salt\":null,\"lora_id\":3,\"tenant_id\":null}"),
                                          &q, &E),
                     0);
    assert_int_equal(q.token_ids[0], 0xffffffffu);
    assert_int_equal(q.token_ids[1], 0x80000000u);
    assert_false(q.has_instance);
    assert_int_equal(q.cache_salt.len, 0);
    assert_kstr(q.tenant_id, "default");

    EXPECT_400(kvi_cond_parse_query(J("{\"model\":\"m\",\"block_size\":4,\"token_ids\":[1,2,3,2147483648]}"), &q, &E),
               "{\"error\":\"token_ids element is outside the int32 range\",\"reason\":\"out_of_range\",\"field\":\"token_ids\",\"index\":3}\n");
    EXPECT_400(kvi_cond_parse_query(J("{\"model\":\"m\",\"block_size\":4,\"token_ids\":[1,\"2\"]}"), &q, &E),
               "{\"error\":\"token_ids element must be an integer\",\"reason\":\"invalid_type\",\"field\":\"token_ids\",\"index\":1}\n");
    EXPECT_400(kvi_cond_parse_query(J("{\"model\":\"m\",\"block_size\":4,\"token_ids\":[1.5]}"), &q, &E),
               "{\"error\":\"token_ids element must be an integer\",\"reason\":\"invalid_type\",\"field\":\"token_ids\",\"index\":0}\n");
    EXPECT_400(kvi_cond_parse_query(J("{\"model\":\"m\",\"block_size\":4,\"token_ids\":\"1,2\"}"), &q, &E),
               "{\"error\":\"token_ids must be an array\",\"reason\":\"not_array\",\"field\":\"token_ids\"}\n");
    EXPECT_400(kvi_cond_parse_query(J("{\"model\":\"m\",\"token_ids\":[1]}"), &q, &E),
               "{\"error\":\"missing required field: block_size\",\"reason\":\"missing\",\"field\":\"block_size\"}\n");
    EXPECT_400(kvi_cond_parse_query(J("{\"model_name\":\"m\"}"), &q, &E),
               "{\"error\":\"unsupported request field: model_name\",\"reason\":\"unknown_field\",\"field\":\"model_name\"}\n");
    EXPECT_400(kvi_cond_parse_query(J("{\"model\":\"m\",\"block_size\":4,\"token_ids\":[1,2,],}"), &q, &E),
               "{\"error\":\"Invalid JSON object\",\"reason\":\"invalid_json\"}\n");

    /* msgpack: §2.4's bin of little-endian int32 */
    msgpack_sbuffer_clear(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
    msgpack_pack_map(&PK, 4);
    msgpack_pack_str_with_body(&PK, "model", 5);
    msgpack_pack_str_with_body(&PK, "deepseek", 8);
    msgpack_pack_str_with_body(&PK, "block_size", 10);
    msgpack_pack_uint8(&PK, 64);
    msgpack_pack_str_with_body(&PK, "tenant_id", 9);
    msgpack_pack_str_with_body(&PK, "default", 7);
    msgpack_pack_str_with_body(&PK, "token_ids", 9);
    static const uint8_t raw[] = {0x65, 0, 0, 0, 0x0f, 0, 0, 0, 0x64, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    msgpack_pack_bin_with_body(&PK, raw, sizeof(raw));
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 0);
    assert_int_equal(q.n_tokens, 4);
    assert_int_equal(q.token_ids[0], 101);
    assert_int_equal(q.token_ids[1], 15);
    assert_int_equal(q.token_ids[2], 100);
    assert_int_equal(q.token_ids[3], 0xffffffffu); /* -1 */
    /* a bin that is not a multiple of 4 */
    msgpack_sbuffer_clear(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
    msgpack_pack_map(&PK, 1);
    msgpack_pack_str_with_body(&PK, "token_ids", 9);
    msgpack_pack_bin_with_body(&PK, raw, 6);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), -EINVAL);
    struct kvi_buf b;
    const char *ct;
    kvi_buf_init(&b);
    assert_int_equal(kvi_err_encode(&E, KVI_DIALECT_CONDUCTOR, KVI_ENC_JSON, &b, &ct), 0);
    assert_out(&b, "{\"error\":\"token_ids bin length must be a multiple of 4 bytes\",\"reason\":\"invalid_value\",\"field\":\"token_ids\"}\n");
    /* the same error answered in msgpack */
    kvi_buf_reset(&b);
    assert_int_equal(kvi_err_encode(&E, KVI_DIALECT_CONDUCTOR, KVI_ENC_MSGPACK, &b, &ct), 0);
    assert_string_equal(ct, KVI_MIME_MSGPACK);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, b.len);
    assert_int_equal(up.data.via.map.size, 3);
    msgpack_object reason = up.data.via.map.ptr[1].val;
    assert_int_equal(reason.via.str.size, 13);
    assert_memory_equal(reason.via.str.ptr, "invalid_value", 13);
    msgpack_unpacked_destroy(&up);
    kvi_buf_free(&b);
    /* msgpack int array with a value out of int32 range */
    msgpack_sbuffer_clear(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
    msgpack_pack_map(&PK, 1);
    msgpack_pack_str_with_body(&PK, "token_ids", 9);
    msgpack_pack_array(&PK, 3);
    msgpack_pack_int32(&PK, -7);
    msgpack_pack_int64(&PK, -2147483649LL);
    msgpack_pack_int32(&PK, 1);
    EXPECT_400(kvi_cond_parse_query(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E),
               "{\"error\":\"token_ids element is outside the int32 range\",\"reason\":\"out_of_range\",\"field\":\"token_ids\",\"index\":1}\n");
}

static void test_query_by_hash(void **state)
{
    struct kvi_cond_query_hash q;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query_by_hash(J("{\"model\": \"deepseek\", \"lora_name\": \"sql-adapter\","
                                                    " \"seq_hashes\": [1234567890, 9876543210, 18446744073709551615, -2],"
                                                    " \"tenant_id\": \"default\", \"instance_id\": \"vllm-prefill-node1\","
                                                    " \"block_size\": 64, \"cache_salt\": \"w8a8\"}"),
                                                  &q, &E),
                     0);
    assert_int_equal(q.n_hashes, 4);
    assert_true(q.seq_hashes[1] == 9876543210ull);
    assert_true(q.seq_hashes[2] == UINT64_MAX);
    assert_true(q.seq_hashes[3] == (uint64_t)-2);
    assert_true(q.has_instance);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query_by_hash(J("{\"model\":\"m\",\"block_size\":8,\"block_hash\":[5]}"), &q, &E), 0);
    assert_int_equal(q.n_hashes, 1);
    assert_true(q.seq_hashes[0] == 5);
    EXPECT_400(kvi_cond_parse_query_by_hash(J("{\"model\":\"m\",\"block_size\":8}"), &q, &E),
               "{\"error\":\"missing required field: seq_hashes\",\"reason\":\"missing\",\"field\":\"seq_hashes\"}\n");
    EXPECT_400(kvi_cond_parse_query_by_hash(J("{\"seq_hashes\":[1],\"block_hash\":[2]}"), &q, &E),
               "{\"error\":\"duplicate request field: block_hash\",\"reason\":\"invalid_value\",\"field\":\"block_hash\"}\n");
    EXPECT_400(kvi_cond_parse_query_by_hash(J("{\"seq_hashes\":[18446744073709551616]}"), &q, &E),
               "{\"error\":\"seq_hashes element is outside the 64-bit integer range\",\"reason\":\"out_of_range\",\"field\":\"seq_hashes\",\"index\":0}\n");
    EXPECT_400(kvi_cond_parse_query_by_hash(J("{\"block_hash\":5}"), &q, &E),
               "{\"error\":\"block_hash must be an array\",\"reason\":\"not_array\",\"field\":\"block_hash\"}\n");
    /* msgpack: uint64 >= 2^63, negative int, and a bin of LE u64 */
    msgpack_sbuffer_clear(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
    msgpack_pack_map(&PK, 3);
    msgpack_pack_str_with_body(&PK, "model", 5);
    msgpack_pack_str_with_body(&PK, "m", 1);
    msgpack_pack_str_with_body(&PK, "block_size", 10);
    msgpack_pack_uint8(&PK, 8);
    msgpack_pack_str_with_body(&PK, "seq_hashes", 10);
    msgpack_pack_array(&PK, 2);
    msgpack_pack_uint64(&PK, 1ull << 63);
    msgpack_pack_int64(&PK, -1);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query_by_hash(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 0);
    assert_true(q.seq_hashes[0] == 1ull << 63);
    assert_true(q.seq_hashes[1] == UINT64_MAX);
    msgpack_sbuffer_clear(&SB);
    msgpack_packer_init(&PK, &SB, msgpack_sbuffer_write);
    msgpack_pack_map(&PK, 3);
    msgpack_pack_str_with_body(&PK, "model", 5);
    msgpack_pack_str_with_body(&PK, "m", 1);
    msgpack_pack_str_with_body(&PK, "block_size", 10);
    msgpack_pack_uint8(&PK, 8);
    msgpack_pack_str_with_body(&PK, "seq_hashes", 10);
    msgpack_pack_bin_with_body(&PK, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_cond_parse_query_by_hash(SB.data, SB.size, KVI_CT_MSGPACK, &S, &q, &E), 0);
    assert_int_equal(q.n_hashes, 1);
    assert_true(q.seq_hashes[0] == 0x0807060504030201ull);
}

/* ---- handler errors and responses -------------------------------------------------------- */

static void test_handler_errors(void **state)
{
    struct kvi_str inst = {"vllm-prefill-node1", 18}, ten = {"default", 7}, ep = {"tcp://1.1.1.1:5557", 18};
    struct kvi_buf b;
    const char *ct;
    kvi_buf_init(&b);
    assert_int_equal(kvi_cond_err_conflict(&E, inst, ten, 0), -EINVAL);
    kvi_err_encode(&E, KVI_DIALECT_CONDUCTOR, KVI_ENC_JSON, &b, &ct);
    assert_out(&b, "{\"error\":\"conflicting registration for service key: vllm-prefill-node1|default|0\","
                   "\"reason\":\"invalid_registration\"}\n");
    kvi_buf_reset(&b);
    kvi_cond_err_endpoint_taken(&E, ep);
    kvi_err_encode(&E, KVI_DIALECT_CONDUCTOR, KVI_ENC_JSON, &b, &ct);
    assert_out(&b, "{\"error\":\"conflicting active registration for endpoint: tcp://1.1.1.1:5557\","
                   "\"reason\":\"invalid_registration\",\"field\":\"endpoint\"}\n");
    kvi_buf_reset(&b);
    kvi_cond_err_hash_profile(&E, (struct kvi_str){"deepseek", 8});
    assert_int_equal(E.status, 400);
    assert_string_equal(E.reason, "invalid_registration");
    kvi_cond_err_service_not_found(&E, inst, ten, 1);
    assert_int_equal(E.status, 404);
    kvi_err_encode(&E, KVI_DIALECT_CONDUCTOR, KVI_ENC_JSON, &b, &ct);
    assert_out(&b, "service not found: vllm-prefill-node1|default|1\n");
    assert_string_equal(ct, "text/plain; charset=utf-8");
    kvi_buf_free(&b);
}

static void test_register_responses(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    assert_int_equal(kvi_cond_encode_registered((struct kvi_str){"vllm-prefill-node1", 18}, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"status\":\"registered successfully\",\"instance_id\":\"vllm-prefill-node1\"}\n");
    kvi_buf_reset(&b);
    struct kvi_cond_key keys[] = {{{"vllm-prefill-node1", 18}, {"default", 7}, 0}, {{"w", 1}, {"t", 1}, 12}};
    assert_int_equal(kvi_cond_encode_unregistered(keys, 2, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"status\":\"unregistered successfully\","
                   "\"removed_instances\":[\"vllm-prefill-node1|default|0\",\"w|t|12\"]}\n");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_unregistered(keys, 1, KVI_ENC_MSGPACK, &b), 0);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, b.len); /* no newline in msgpack */
    msgpack_object arr = up.data.via.map.ptr[1].val;
    assert_int_equal(arr.via.array.size, 1);
    assert_memory_equal(arr.via.array.ptr[0].via.str.ptr, "vllm-prefill-node1|default|0", 28);
    msgpack_unpacked_destroy(&up);
    kvi_buf_free(&b);
}

static void test_query_responses(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    /* §2.4's implemented example (block size 128), rows out of order */
    struct kvi_score_row rows[] = {
        {0, "vllm-prefill-node1", 1, 2, 2, 3, 0, 0},
        {0, "vllm-prefill-node1", 0, 1, 2, 3, 0, 0},
    };
    struct kvi_str tenant = {"default", 7};
    assert_int_equal(kvi_cond_encode_query(rows, 2, 128, tenant, KVI_COND_SHAPE_IMPL, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"instances\":{\"vllm-prefill-node1\":{\"longest_matched\":384,\"dp\":{\"0\":128,\"1\":256},"
                   "\"rank_matches\":{\"0\":{\"gpu\":128,\"cpu\":256,\"disk\":384},\"1\":{\"gpu\":256,\"cpu\":256,\"disk\":384}},"
                   "\"gpu\":256,\"cpu\":256,\"disk\":384}}}\n");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_query(rows, 2, 128, tenant, KVI_COND_SHAPE_AUTO, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"default\":{\"vllm-prefill-node1\":{\"longest_matched\":384,\"GPU\":256,\"DP\":{\"0\":128,\"1\":256},"
                   "\"CPU\":256,\"DISK\":384,"
                   "\"rank_matches\":{\"0\":{\"gpu\":128,\"cpu\":256,\"disk\":384},\"1\":{\"gpu\":256,\"cpu\":256,\"disk\":384}}}}}\n");

    /* every registered instance and rank appears, zeros included; names sorted */
    struct kvi_score_row r2[] = {
        {0, "b", 0, 0, 0, 0, 0, 0},
        {0, "a", 0, 1, 1, 1, 0, 0},
    };
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_query(r2, 2, 16, tenant, KVI_COND_SHAPE_IMPL, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"instances\":{\"a\":{\"longest_matched\":16,\"dp\":{\"0\":16},\"rank_matches\":{\"0\":{\"gpu\":16,\"cpu\":16,\"disk\":16}},"
                   "\"gpu\":16,\"cpu\":16,\"disk\":16},"
                   "\"b\":{\"longest_matched\":0,\"dp\":{\"0\":0},\"rank_matches\":{\"0\":{\"gpu\":0,\"cpu\":0,\"disk\":0}},"
                   "\"gpu\":0,\"cpu\":0,\"disk\":0}}}\n");

    /* unknown context: empty maps */
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_query(NULL, 0, 16, tenant, KVI_COND_SHAPE_IMPL, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"instances\":{}}\n");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_query(NULL, 0, 16, tenant, KVI_COND_SHAPE_DOCS, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"default\":{}}\n");

    /* msgpack answers in the implemented shape */
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_query(rows, 2, 128, tenant, KVI_COND_SHAPE_AUTO, KVI_ENC_MSGPACK, &b), 0);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b.data, b.len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, b.len);
    msgpack_object root = up.data;
    assert_int_equal(root.via.map.size, 1);
    assert_memory_equal(root.via.map.ptr[0].key.via.str.ptr, "instances", 9);
    msgpack_object inst = root.via.map.ptr[0].val.via.map.ptr[0].val;
    assert_int_equal(inst.via.map.size, 6);
    static const char *const keys[] = {"longest_matched", "dp", "rank_matches", "gpu", "cpu", "disk"};
    static const uint64_t vals[] = {384, 0, 0, 256, 256, 384};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(inst.via.map.ptr[i].key.via.str.size, strlen(keys[i]));
        assert_memory_equal(inst.via.map.ptr[i].key.via.str.ptr, keys[i], strlen(keys[i]));
        if (vals[i])
            assert_int_equal(inst.via.map.ptr[i].val.via.u64, vals[i]);
    }
    msgpack_object rm1 = inst.via.map.ptr[2].val.via.map.ptr[1].val;
    assert_int_equal(rm1.via.map.ptr[0].val.via.u64, 256);
    msgpack_unpacked_destroy(&up);
    kvi_buf_free(&b);
}

static void test_views(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_hash_profile hp = {{"vllm_v1", 7}, {"sha256_cbor", 11}, {"0", 1}, {"abc", 3}, {"low64_be", 8}};
    uint32_t ranks[] = {0, 1};
    struct kvi_cond_instance_view iv[] = {{"vllm-prefill-node1", ranks, 2}};
    struct kvi_cond_context_view cv[] = {{"deepseek", "", "default", 128, 5231, &hp, iv, 1}};
    assert_int_equal(kvi_cond_encode_global_view(cv, 1, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"context_count\":1,\"contexts\":[{\"model_name\":\"deepseek\",\"lora_name\":\"\",\"block_size\":128,"
                   "\"tenant_id\":\"default\",\"prefix_count\":5231,"
                   "\"hash_profile\":{\"strategy\":\"vllm_v1\",\"algorithm\":\"sha256_cbor\",\"python_hash_seed\":\"0\","
                   "\"root_digest\":\"abc\",\"index_projection\":\"low64_be\"},"
                   "\"instances\":{\"vllm-prefill-node1\":[0,1]}}]}\n");
    kvi_buf_reset(&b);
    struct kvi_cond_context_view cv2[] = {{"m", "l", "t", 16, 0, NULL, NULL, 0}};
    assert_int_equal(kvi_cond_encode_global_view(cv2, 1, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"context_count\":1,\"contexts\":[{\"model_name\":\"m\",\"lora_name\":\"l\",\"block_size\":16,"
                   "\"tenant_id\":\"t\",\"prefix_count\":0,"
                   "\"hash_profile\":{\"strategy\":\"\",\"algorithm\":\"\",\"python_hash_seed\":\"\","
                   "\"root_digest\":\"\",\"index_projection\":\"\"},\"instances\":{}}]}\n");
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_global_view(NULL, 0, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"context_count\":0,\"contexts\":[]}\n");

    kvi_buf_reset(&b);
    struct kvi_cond_service_view sv[] = {
        {"tcp://1.1.1.1:5557", "tcp://1.1.1.1:5558", KVI_COND_VLLM, "deepseek", "", "default",
         "vllm-prefill-node1", 128, 0, false, 0, &hp},
        {"tcp://m:1", "", KVI_COND_MOONCAKE, "deepseek", "", "default", "", 128, 0, true, 0, NULL},
    };
    assert_int_equal(kvi_cond_encode_services(sv, 2, KVI_ENC_JSON, &b), 0);
    assert_out(&b, "{\"count\":2,\"services\":[{\"Endpoint\":\"tcp://1.1.1.1:5557\",\"ReplayEndpoint\":\"tcp://1.1.1.1:5558\","
                   "\"Type\":\"vLLM\",\"ModelName\":\"deepseek\",\"LoraName\":\"\",\"TenantID\":\"default\","
                   "\"InstanceID\":\"vllm-prefill-node1\",\"BlockSize\":128,\"DPRank\":0,\"CacheGroup\":null,"
                   "\"HashProfile\":{\"strategy\":\"vllm_v1\",\"algorithm\":\"sha256_cbor\",\"python_hash_seed\":\"0\","
                   "\"root_digest\":\"abc\",\"index_projection\":\"low64_be\"}},"
                   "{\"Endpoint\":\"tcp://m:1\",\"ReplayEndpoint\":\"\",\"Type\":\"Mooncake\",\"ModelName\":\"deepseek\","
                   "\"LoraName\":\"\",\"TenantID\":\"default\",\"InstanceID\":\"\",\"BlockSize\":128,\"DPRank\":0,"
                   "\"CacheGroup\":0,\"HashProfile\":{\"strategy\":\"\",\"algorithm\":\"\",\"python_hash_seed\":\"\","
                   "\"root_digest\":\"\",\"index_projection\":\"\"}}]}");
    kvi_buf_free(&b);
}

/* The buffer is exactly one msgpack object whose root map has @p n entries. */
static void assert_mp_whole(const struct kvi_buf *b, uint32_t n)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, b->data, b->len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, b->len);
    assert_int_equal(up.data.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(up.data.via.map.size, n);
    msgpack_unpacked_destroy(&up);
}

/* Every encoder's msgpack output is one well-formed object (entry counts
 * announced up front match what follows). */
/* ---- the query encoder against a reference on the generic writer ----------------------------- */

/* The encoder as it was written on kvi_wr_* (before the direct writer). */

static uint64_t max64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

static void ref_instance(struct kvi_wr *w, const struct kvi_score_row *rows, size_t i, size_t j, uint32_t bs,
                         bool docs)
{
    uint64_t g = 0, c = 0, d = 0;
    for (size_t k = i; k < j; k++) {
        g = max64(g, rows[k].gpu);
        c = max64(c, rows[k].cpu);
        d = max64(d, rows[k].disk);
    }
    uint64_t lm = max64(g, max64(c, d));
    uint32_t nr = (uint32_t)(j - i);
    if (rows[i].name != NULL)
        kvi_wr_keyz(w, rows[i].name);
    else
        kvi_wr_key_u64(w, rows[i].instance_id);
    kvi_wr_obj(w, 6);
    kvi_wr_keyz(w, "longest_matched");
    kvi_wr_u64(w, lm * bs);
    if (docs) {
        kvi_wr_keyz(w, "GPU");
        kvi_wr_u64(w, g * bs);
    }
    kvi_wr_keyz(w, docs ? "DP" : "dp");
    kvi_wr_obj(w, nr);
    for (size_t k = i; k < j; k++) {
        kvi_wr_key_u64(w, rows[k].dp_rank);
        kvi_wr_u64(w, (uint64_t)rows[k].gpu * bs);
    }
    kvi_wr_end(w);
    if (docs) {
        kvi_wr_keyz(w, "CPU");
        kvi_wr_u64(w, c * bs);
        kvi_wr_keyz(w, "DISK");
        kvi_wr_u64(w, d * bs);
    }
    kvi_wr_keyz(w, "rank_matches");
    kvi_wr_obj(w, nr);
    for (size_t k = i; k < j; k++) {
        kvi_wr_key_u64(w, rows[k].dp_rank);
        kvi_wr_obj(w, 3);
        kvi_wr_keyz(w, "gpu");
        kvi_wr_u64(w, (uint64_t)rows[k].gpu * bs);
        kvi_wr_keyz(w, "cpu");
        kvi_wr_u64(w, (uint64_t)rows[k].cpu * bs);
        kvi_wr_keyz(w, "disk");
        kvi_wr_u64(w, (uint64_t)rows[k].disk * bs);
        kvi_wr_end(w);
    }
    kvi_wr_end(w);
    if (!docs) {
        kvi_wr_keyz(w, "gpu");
        kvi_wr_u64(w, g * bs);
        kvi_wr_keyz(w, "cpu");
        kvi_wr_u64(w, c * bs);
        kvi_wr_keyz(w, "disk");
        kvi_wr_u64(w, d * bs);
    }
    kvi_wr_end(w);
}

static void ref_query(struct kvi_score_row *rows, size_t n, uint32_t bs, struct kvi_str tenant,
                      enum kvi_cond_shape shape, enum kvi_body_enc enc, struct kvi_buf *out)
{
    if (shape == KVI_COND_SHAPE_AUTO)
        shape = enc == KVI_ENC_MSGPACK ? KVI_COND_SHAPE_IMPL : KVI_COND_SHAPE_DOCS;
    bool docs = shape == KVI_COND_SHAPE_DOCS;
    ref_sort(rows, n);
    uint32_t n_inst = 0;
    for (size_t i = 0; i < n; i++)
        n_inst += i == 0 || !ref_same(&rows[i - 1], &rows[i]);
    struct kvi_wr w;
    kvi_wr_init(&w, out, enc);
    kvi_wr_obj(&w, 1);
    if (docs)
        kvi_wr_key(&w, tenant.p, tenant.len);
    else
        kvi_wr_keyz(&w, "instances");
    kvi_wr_obj(&w, n_inst);
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && ref_same(&rows[i], &rows[j]); j++)
            ;
        ref_instance(&w, rows, i, j, bs, docs);
    }
    kvi_wr_end(&w);
    kvi_wr_end(&w);
    if (enc == KVI_ENC_JSON)
        kvi_buf_putc(out, '\n');
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static uint32_t rnd_value(void)
{
    switch (rnd() % 5) {
    case 0: return 0;
    case 1: return UINT32_MAX;
    case 2: return (uint32_t)(rnd() % 200);
    case 3: return (uint32_t)(rnd() % 100000);
    default: return (uint32_t)rnd();
    }
}

static void test_query_matches_reference(void **state)
{
    enum { MAX_ROWS = 60 };
    static const char *names[] = {"vllm-prefill-node1", "b", "quote\"bs\\", "ctl\x01\t\n", "\xe2\x82\xac",
                                  "a-name-longer-than-thirty-one-bytes-for-str8", "x"};
    static const struct kvi_str tenants[] = {{"default", 7}, {"t\"en\\ant\x02", 10}, {"", 0}, {NULL, 0},
                                             {"a-tenant-longer-than-thirty-one-bytes", 37}};
    struct kvi_score_row rows[MAX_ROWS], a[MAX_ROWS], b[MAX_ROWS];
    struct kvi_buf want, got;
    kvi_buf_init(&want);
    kvi_buf_init(&got);
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = (size_t)(rnd() % (iter % 10 == 0 ? MAX_ROWS : 12)), k = 0;
        for (size_t t = 0; k < n && t < 4 * MAX_ROWS; t++) {
            struct kvi_score_row r = {0};
            if (rnd() % 8 == 0)
                r.instance_id = rnd() % 3 == 0 ? rnd() : rnd() % 20; /* nameless rows sort first */
            else
                r.name = names[rnd() % (sizeof names / sizeof names[0])];
            r.dp_rank = rnd() % 6 == 0 ? (uint32_t)rnd() : (uint32_t)(rnd() % 18);
            r.gpu = rnd_value();
            r.cpu = rnd_value();
            r.disk = rnd_value();
            bool dup = false;
            for (size_t i = 0; i < k && !dup; i++)
                dup = ref_same(&rows[i], &r) && rows[i].dp_rank == r.dp_rank;
            if (!dup)
                rows[k++] = r;
        }
        n = k;
        uint32_t bs = rnd() % 4 == 0 ? UINT32_MAX : (uint32_t)(1 + rnd() % 128);
        struct kvi_str tenant = tenants[rnd() % (sizeof tenants / sizeof tenants[0])];
        for (int sh = KVI_COND_SHAPE_AUTO; sh <= KVI_COND_SHAPE_IMPL; sh++) {
            for (int enc = 0; enc < 2; enc++) {
                memcpy(a, rows, sizeof rows);
                memcpy(b, rows, sizeof rows);
                kvi_buf_reset(&want);
                kvi_buf_reset(&got);
                ref_query(a, n, bs, tenant, (enum kvi_cond_shape)sh, (enum kvi_body_enc)enc, &want);
                assert_true(kvi_buf_ok(&want));
                assert_int_equal(kvi_cond_encode_query(b, n, bs, tenant, (enum kvi_cond_shape)sh,
                                                       (enum kvi_body_enc)enc, &got), 0);
                if (got.len != want.len || memcmp(got.data, want.data, got.len) != 0)
                    fail_msg("iter %d shape %d enc %d n %zu:\ngot  '%.*s'\nwant '%.*s'", iter, sh, enc, n,
                             (int)got.len, got.data, (int)want.len, want.data);
                size_t max = kvi_cond_query_max_len(rows, n, tenant);
                assert_true(got.len <= max);
                char *dst = malloc(max);
                memcpy(b, rows, sizeof rows);
                size_t len = kvi_cond_encode_query_to(b, n, bs, tenant, (enum kvi_cond_shape)sh,
                                                      (enum kvi_body_enc)enc, dst);
                assert_int_equal(len, want.len);
                assert_memory_equal(dst, want.data, len);
                free(dst);
            }
        }
    }
    kvi_buf_free(&want);
    kvi_buf_free(&got);
}

static void test_msgpack_encoders(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_hash_profile hp = {{"vllm_v1", 7}, {"sha256_cbor", 11}, {"0", 1}, {"abc", 3}, {"low64_be", 8}};
    uint32_t ranks[] = {0, 1, 5};
    struct kvi_cond_instance_view iv[] = {{"a", ranks, 3}, {"b", ranks, 0}};
    struct kvi_cond_context_view cv[] = {{"m", "", "default", 128, 5, &hp, iv, 2}, {"m2", "l", "t", 16, 0, NULL, NULL, 0}};
    assert_int_equal(kvi_cond_encode_global_view(cv, 2, KVI_ENC_MSGPACK, &b), 0);
    assert_mp_whole(&b, 2);
    kvi_buf_reset(&b);
    struct kvi_cond_service_view sv[] = {
        {"tcp://a:1", "", KVI_COND_SGLANG, "m", "", "default", "i", 16, 2, true, 0, &hp},
        {"tcp://b:1", "tcp://b:2", KVI_COND_VLLM, "m", "", "default", "j", 16, 0, false, 0, NULL},
    };
    assert_int_equal(kvi_cond_encode_services(sv, 2, KVI_ENC_MSGPACK, &b), 0);
    assert_mp_whole(&b, 2);
    kvi_buf_reset(&b);
    assert_int_equal(kvi_cond_encode_registered((struct kvi_str){"i", 1}, KVI_ENC_MSGPACK, &b), 0);
    assert_mp_whole(&b, 2);
    struct kvi_score_row rows[40];
    for (int i = 0; i < 40; i++)
        rows[i] = (struct kvi_score_row){(uint64_t)(i % 7) * 0x9000000000000000ull, NULL,
                                         (uint32_t)(i / 7), (uint32_t)(i % 3), (uint32_t)(i % 3) + 1,
                                         (uint32_t)(i % 3) + 2, (uint32_t)i, 0};
    for (int f = 0; f < 2; f++) {
        kvi_buf_reset(&b);
        assert_int_equal(kvi_dyn_encode_scores(rows, 40, 16, f ? KVI_SCORE_FLAT : KVI_SCORE_FULL, KVI_ENC_MSGPACK, &b), 0);
        assert_mp_whole(&b, f ? 3 : 4);
    }
    static const char *names[] = {"x", "y", "z"};
    struct kvi_score_row crow[20];
    for (int i = 0; i < 20; i++)
        crow[i] = (struct kvi_score_row){0, names[i % 3], (uint32_t)i, 1, 2, 3, 0, 0};
    for (int sh = KVI_COND_SHAPE_DOCS; sh <= KVI_COND_SHAPE_IMPL; sh++) {
        kvi_buf_reset(&b);
        assert_int_equal(kvi_cond_encode_query(crow, 20, 8, (struct kvi_str){"t", 1}, (enum kvi_cond_shape)sh,
                                               KVI_ENC_MSGPACK, &b), 0);
        assert_mp_whole(&b, 1);
    }
    kvi_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_valid),
        cmocka_unit_test(test_register_errors),
        cmocka_unit_test(test_unregister),
        cmocka_unit_test(test_query),
        cmocka_unit_test(test_query_by_hash),
        cmocka_unit_test(test_handler_errors),
        cmocka_unit_test(test_register_responses),
        cmocka_unit_test(test_query_responses),
        cmocka_unit_test(test_query_matches_reference),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_msgpack_encoders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
