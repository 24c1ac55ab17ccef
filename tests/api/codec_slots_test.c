/* ctest-labels: unit -- api/codec_slots.c: slot-tracker request parsers, error texts and response encoders (http-api.md §3) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_slots.h"
#include "engine/rcu.h"

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

static void assert_bytes(const char *p, size_t n, const char *want)
{
    if (n != strlen(want) || (n > 0 && memcmp(p, want, n) != 0))
        fail_msg("got '%.*s' want '%s'", (int)n, p ? p : "", want);
}

static void assert_out(struct kvi_buf *b, const char *want)
{
    if (b->len != strlen(want) || memcmp(b->data, want, b->len) != 0)
        fail_msg("got  '%.*s'\nwant '%s'", (int)b->len, b->data, want);
    kvi_buf_reset(b);
}

#define EXPECT_ERR(call, st, want)                                                                 \
    do {                                                                                           \
        kvi_scratch_reset(&S);                                                                     \
        int r_ = (call);                                                                           \
        if (r_ != -EINVAL)                                                                         \
            fail_msg("line %d: returned %d", __LINE__, r_);                                        \
        if (E.status != (st) || strcmp(E.msg, (want)) != 0)                                        \
            fail_msg("line %d: got %d '%s'\nwant %d '%s'", __LINE__, E.status, E.msg, (st), (want)); \
    } while (0)

/*
 * The same, for texts that end in a position: the serde text before it must
 * match exactly, then " at line L column C". Positions come from the shared
 * reader (api/codec_common.c), whose convention differs from serde_json's
 * for data errors (serde points after the offending value, the reader at
 * its start), so they are not pinned here.
 */
#define EXPECT_ERR_AT(call, st, want)                                                              \
    do {                                                                                           \
        kvi_scratch_reset(&S);                                                                     \
        int r_ = (call);                                                                           \
        if (r_ != -EINVAL)                                                                         \
            fail_msg("line %d: returned %d", __LINE__, r_);                                        \
        size_t wl_ = strlen(want);                                                                 \
        unsigned line_, col_;                                                                      \
        char end_;                                                                                 \
        if (E.status != (st) || strncmp(E.msg, (want), wl_) != 0 ||                                \
            sscanf(E.msg + wl_, " at line %u column %u%c", &line_, &col_, &end_) != 2)             \
            fail_msg("line %d: got %d '%s'\nwant %d '%s at line L column C'", __LINE__, E.status,   \
                     E.msg, (st), (want));                                                         \
    } while (0)

#define J(s) (s), strlen(s), KVI_CT_JSON, &S
#define PRE "Failed to deserialize the JSON body into the target type: "

/* ---- requests -------------------------------------------------------------------------- */

static void test_register(void **state)
{
    struct kvi_slot_register r;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_register(J("{\"worker_id\":7,\"model_name\":\"llama-3-8b\","
                                               "\"tenant_id\":\"default\",\"block_size\":16,"
                                               "\"dp_start\":0,\"dp_size\":2}"),
                                             &r, &E),
                     0);
    assert_int_equal(r.worker_id, 7);
    assert_bytes(r.key.model, r.key.model_len, "llama-3-8b");
    assert_bytes(r.key.tenant, r.key.tenant_len, "default");
    assert_int_equal(r.block_size, 16);
    assert_int_equal(r.dp_start, 0);
    assert_int_equal(r.dp_size, 2);

    /* tenant_id defaults; u64 ids; block_size 0 is the engine's 400 */
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_register(J("{\"dp_size\":1,\"dp_start\":4294967295,"
                                               "\"block_size\":0,\"model_name\":\"m\\u00e9\","
                                               "\"worker_id\":18446744073709551615,\"x\":[{}]}"),
                                             &r, &E),
                     0);
    assert_true(r.worker_id == UINT64_MAX);
    assert_bytes(r.key.model, r.key.model_len, "m\xc3\xa9");
    assert_bytes(r.key.tenant, r.key.tenant_len, "default");
    assert_int_equal(r.block_size, 0);
    assert_int_equal(r.dp_start, UINT32_MAX);

    EXPECT_ERR_AT(kvi_slot_parse_register(J("{\"worker_id\":7,\"model_name\":\"m\",\"block_size\":16,"
                                         "\"dp_start\":0}"),
                                       &r, &E),
               422, PRE "missing field `dp_size`");
    EXPECT_ERR_AT(kvi_slot_parse_register(J("{\"worker_id\":7,\"model_name\":\"m\",\"tenant_id\":null}"),
                                       &r, &E),
               422, PRE "tenant_id: invalid type: null, expected a string");
    EXPECT_ERR_AT(kvi_slot_parse_register(J("{\"block_size\":4294967296}"), &r, &E), 422,
               PRE "block_size: invalid value: integer `4294967296`, expected u32");
    EXPECT_ERR_AT(kvi_slot_parse_register(J("\"x\""), &r, &E), 422,
               PRE "invalid type: string \"x\", expected struct RegisterRequest");
    /* positions where the reader and serde_json agree */
    EXPECT_ERR(kvi_slot_parse_register(J("{\"worker_id\":7,\"model_name\":\"m\",\"block_size\":16,"
                                         "\"dp_start\":0,\"dp_size\":1} x"),
                                       &r, &E),
               400, "Failed to parse the request body as JSON: trailing characters at line 1 column 75");
    EXPECT_ERR(kvi_slot_parse_register(J("{\"worker_id\":1,}"), &r, &E), 400,
               "Failed to parse the request body as JSON: trailing comma at line 1 column 16");
    EXPECT_ERR_AT(kvi_slot_parse_register(J("{"), &r, &E), 400,
               "Failed to parse the request body as JSON: EOF while parsing an object");
    EXPECT_ERR(kvi_slot_parse_register("{}", 2, KVI_CT_OTHER, &S, &r, &E), 415,
               "Expected request with `Content-Type: application/json`");
    EXPECT_ERR(kvi_slot_parse_register("{}", 2, KVI_CT_NONE, &S, &r, &E), 415,
               "Expected request with `Content-Type: application/json`");
    EXPECT_ERR(kvi_slot_parse_register("\x80", 1, KVI_CT_MSGPACK, &S, &r, &E), 415,
               "Expected request with `Content-Type: application/json`");
}

static void test_unregister(void **state)
{
    struct kvi_slot_unregister u;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_unregister(J("{\"worker_id\":7,\"model_name\":\"llama-3-8b\"}"),
                                               &u, &E),
                     0);
    assert_int_equal(u.worker_id, 7);
    assert_bytes(u.key.tenant, u.key.tenant_len, "default");
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_unregister(J("{\"worker_id\":7,\"model_name\":\"m\","
                                                 "\"tenant_id\":\"\"}"),
                                               &u, &E),
                     0);
    assert_int_equal(u.key.tenant_len, 0);
    assert_non_null(u.key.tenant);
    EXPECT_ERR_AT(kvi_slot_parse_unregister(J("{\"model_name\":\"m\"}"), &u, &E), 422,
               PRE "missing field `worker_id`");
    EXPECT_ERR_AT(kvi_slot_parse_unregister(J("{\"worker_id\":1,\"worker_id\":2}"), &u, &E), 422,
               PRE "duplicate field `worker_id`");
}

static void test_add(void **state)
{
    struct kvi_slots_request a;
    kvi_scratch_reset(&S);
    assert_int_equal(
        kvi_slot_parse_add(J("{\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\","
                             "\"request_id\":\"req-123\",\"worker_id\":7,\"dp_rank\":0,"
                             "\"sequence_hashes\":[101,-22,303],\"new_isl_tokens\":48}"),
                           &a, &E),
        0);
    assert_bytes(a.key.model, a.key.model_len, "llama-3-8b");
    assert_bytes(a.request_id, a.request_id_len, "req-123");
    assert_int_equal(a.worker_id, 7);
    assert_int_equal(a.dp_rank, 0);
    assert_int_equal(a.n_hashes, 3);
    assert_int_equal(a.hashes[0], 101);
    assert_true(a.hashes[1] == 0xffffffffffffffeaull); /* -22 bit for bit */
    assert_int_equal(a.hashes[2], 303);
    assert_int_equal(a.new_isl_tokens, 48);

    /* defaults; empty hashes; the i64 extremes */
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_add(J("{\"model_name\":\"m\",\"request_id\":\"\",\"worker_id\":1,"
                                          "\"dp_rank\":3,\"sequence_hashes\":[]}"),
                                        &a, &E),
                     0);
    assert_bytes(a.key.tenant, a.key.tenant_len, "default");
    assert_int_equal(a.request_id_len, 0);
    assert_int_equal(a.n_hashes, 0);
    assert_int_equal(a.new_isl_tokens, 0);
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_add(J("{\"model_name\":\"m\",\"request_id\":\"r\",\"worker_id\":1,"
                                          "\"dp_rank\":0,\"sequence_hashes\":[-9223372036854775808,"
                                          "9223372036854775807,-1,0],"
                                          "\"new_isl_tokens\":18446744073709551615}"),
                                        &a, &E),
                     0);
    assert_true(a.hashes[0] == 0x8000000000000000ull);
    assert_true(a.hashes[1] == 0x7fffffffffffffffull);
    assert_true(a.hashes[2] == UINT64_MAX);
    assert_int_equal(a.hashes[3], 0);
    assert_true(a.new_isl_tokens == UINT64_MAX);

    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"model_name\":\"m\",\"request_id\":\"r\",\"worker_id\":1,"
                                    "\"dp_rank\":0,\"sequence_hashes\":[1,9223372036854775808]}"),
                                  &a, &E),
               422,
               PRE "sequence_hashes[1]: invalid value: integer `9223372036854775808`, expected i64");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"model_name\":\"m\",\"sequence_hashes\":\"x\"}"), &a, &E), 422,
               PRE "sequence_hashes: invalid type: string \"x\", expected an array of signed 64-bit "
                   "sequence hashes");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"sequence_hashes\":null}"), &a, &E), 422,
               PRE "sequence_hashes: invalid type: null, expected an array of signed 64-bit "
                   "sequence hashes");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"sequence_hashes\":[1,\"2\"]}"), &a, &E), 422,
               PRE "sequence_hashes[1]: invalid type: string \"2\", expected i64");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"new_isl_tokens\":-1}"), &a, &E), 422,
               PRE "new_isl_tokens: invalid value: integer `-1`, expected usize");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"new_isl_tokens\":1.5}"), &a, &E), 422,
               PRE "new_isl_tokens: invalid type: floating point `1.5`, expected usize");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"sequence_hashes\":5}"), &a, &E), 422,
               PRE "sequence_hashes: invalid type: integer `5`, expected an array of signed 64-bit "
                   "sequence hashes");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("{\"model_name\":\"m\",\"request_id\":\"r\",\"worker_id\":1,"
                                    "\"dp_rank\":0}"),
                                  &a, &E),
               422, PRE "missing field `sequence_hashes`");
    EXPECT_ERR_AT(kvi_slot_parse_add(J("7"), &a, &E), 422,
               PRE "invalid type: integer `7`, expected struct AddRequest");
}

static void test_lifecycle_potential_peer(void **state)
{
    struct kvi_slots_request l;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_lifecycle(J("{\"model_name\":\"llama-3-8b\","
                                                "\"request_id\":\"req-123\"}"),
                                              &l, &E),
                     0);
    assert_bytes(l.request_id, l.request_id_len, "req-123");
    assert_bytes(l.key.tenant, l.key.tenant_len, "default");
    assert_int_equal(l.n_hashes, 0);
    EXPECT_ERR_AT(kvi_slot_parse_lifecycle(J("{\"model_name\":\"m\",\"tenant_id\":\"t\"}"), &l, &E), 422,
               PRE "missing field `request_id`");
    EXPECT_ERR_AT(kvi_slot_parse_lifecycle(J("{\"request_id\":1}"), &l, &E), 422,
               PRE "request_id: invalid type: integer `1`, expected a string");

    struct kvi_slot_potential p;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_potential(J("{\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\","
                                                "\"sequence_hashes\":[101,-22,303,404],"
                                                "\"new_isl_tokens\":48}"),
                                              &p, &E),
                     0);
    assert_int_equal(p.n_hashes, 4);
    assert_true(p.hashes[1] == (uint64_t)-22);
    assert_int_equal(p.new_isl_tokens, 48);
    EXPECT_ERR_AT(kvi_slot_parse_potential(J("{\"model_name\":\"m\"}"), &p, &E), 422,
               PRE "missing field `sequence_hashes`");

    struct kvi_str url;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_peer(J("{\"url\":\"tcp://slot-tracker-b:8092\"}"), &url, &E), 0);
    assert_bytes(url.p, url.len, "tcp://slot-tracker-b:8092");
    EXPECT_ERR_AT(kvi_slot_parse_peer(J("{\"uri\":\"x\"}"), &url, &E), 422,
               PRE "missing field `url`");
}

static void test_filter(void **state)
{
    struct kvi_slots_key k;
    kvi_scratch_reset(&S);
    const char *q = "model_name=llama-3-8b&tenant_id=a%20b&other=1";
    assert_int_equal(kvi_slot_parse_filter(q, strlen(q), &S, &k, &E), 0);
    assert_bytes(k.model, k.model_len, "llama-3-8b");
    assert_bytes(k.tenant, k.tenant_len, "a b");
    assert_int_equal(kvi_slot_parse_filter("", 0, &S, &k, &E), 0);
    assert_null(k.model);
    assert_null(k.tenant);
    q = "tenant_id=";
    assert_int_equal(kvi_slot_parse_filter(q, strlen(q), &S, &k, &E), 0);
    assert_null(k.model);
    assert_non_null(k.tenant); /* a filter on the empty tenant */
    assert_int_equal(k.tenant_len, 0);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_engine_errors(void **state)
{
    struct kvi_slots_key key = {"llama-3-8b", 10, "default", 7};
    struct kvi_slots_err w;
    struct kvi_buf b;
    kvi_buf_init(&b);
    const char *ct;
#define WHY(...) (w = (struct kvi_slots_err){__VA_ARGS__}, &w)
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_BLOCK_SIZE), &key, NULL, 0), 400,
               "block_size must be greater than 0");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_DP_SIZE), &key, NULL, 0), 400,
               "dp_size must be greater than 0");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_DP_RANGE, .dp_start = 4294967295u,
                                           .dp_size = 1),
                                   &key, NULL, 0),
               400, "dp range overflows u32: start=4294967295 size=1");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_BLOCK_SIZE_MISMATCH,
                                           .existing_block_size = 16, .requested_block_size = 32),
                                   &key, NULL, 0),
               409, "block_size mismatch for model=llama-3-8b tenant=default: existing=16, requested=32");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_DUP_WORKER, .worker_id = 7), &key,
                                   NULL, 0),
               409, "worker 7 already registered for model=llama-3-8b tenant=default");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_NO_WORKER, .worker_id = 7), &key,
                                   NULL, 0),
               404, "worker 7 not found for model=llama-3-8b tenant=default");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_NO_TRACKER), &key, NULL, 0), 404,
               "no slot tracker for model=llama-3-8b tenant=default");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_NO_RANK, .worker_id = 7, .dp_rank = 1),
                                   &key, "req-1", 5),
               404, "Worker WorkerWithDpRank { worker_id: 7, dp_rank: 1 } not found");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_DUP_REQUEST, .worker_id = 7,
                                           .dp_rank = 0),
                                   &key, "req-123", 7),
               409,
               "Request req-123 already exists (assigned to worker WorkerWithDpRank { worker_id: 7, "
               "dp_rank: 0 })");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_NO_REQUEST), &key, "early-complete", 14),
               404, "Request early-complete not found");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_NO_REQUEST), &key, "", 0), 404,
               "Request  not found");
    EXPECT_ERR(kvi_slot_err_engine(&E, WHY(.why = KVI_SLOTS_E_TOO_MANY_RANKS, .ranks = 3,
                                           .dp_size = 2, .max_ranks = 4),
                                   &key, NULL, 0),
               400, "too many ranks for model=llama-3-8b tenant=default: 3 registered, dp_size=2, "
                    "limit 4");
#undef WHY
    EXPECT_ERR(kvi_slot_err_route_not_found(&E), 404, "route not found");
    EXPECT_ERR(kvi_slot_err_method(&E), 405, "method not allowed");
    EXPECT_ERR(kvi_slot_err_too_large(&E), 413,
               "Failed to buffer the request body: length limit exceeded");
    EXPECT_ERR(kvi_slot_err_sync_disabled(&E), 409, "replica sync is disabled");
    EXPECT_ERR(kvi_slot_err_peer_not_found(&E), 404, "peer not found");

    /* every error is JSON {"error": ...}, escaped */
    kvi_slot_err_route_not_found(&E);
    assert_int_equal(kvi_slot_encode_err(&E, &b, &ct), 0);
    assert_string_equal(ct, "application/json");
    assert_out(&b, "{\"error\":\"route not found\"}");
    struct kvi_slots_key q = {"a\"b\\c", 5, "t\n", 2};
    kvi_slot_err_engine(&E, &(struct kvi_slots_err){.why = KVI_SLOTS_E_NO_TRACKER}, &q, NULL, 0);
    assert_int_equal(kvi_slot_encode_err(&E, &b, &ct), 0);
    assert_out(&b, "{\"error\":\"no slot tracker for model=a\\\"b\\\\c tenant=t\\n\"}");
    kvi_scratch_reset(&S);
    struct kvi_slots_request a;
    kvi_slot_parse_add(J("{\"sequence_hashes\":\"x\"}"), &a, &E);
    assert_int_equal(kvi_slot_encode_err(&E, &b, &ct), 0);
    const char *want = "{\"error\":\"" PRE "sequence_hashes: invalid type: string \\\"x\\\", "
                       "expected an array of signed 64-bit sequence hashes at line 1 column ";
    assert_true(b.len > strlen(want) && memcmp(b.data, want, strlen(want)) == 0);
    assert_memory_equal(b.data + b.len - 2, "\"}", 2);
    kvi_buf_reset(&b);
    kvi_buf_free(&b);
}

/* ---- responses ----------------------------------------------------------------------------- */

static void test_encoders(void **state)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    assert_int_equal(kvi_slot_encode_ok(&b), 0);
    assert_out(&b, "{\"status\":\"ok\"}");

    assert_int_equal(kvi_slot_encode_workers(NULL, 0, &b), 0);
    assert_out(&b, "[]");
    struct kvi_slots_worker w[2] = {
        {"llama-3-8b", 10, "default", 7, 7, 16, 0, 2},
        {"m\0x", 3, "t\"", 2, UINT64_MAX, 64, 4294967294u, 1},
    };
    assert_int_equal(kvi_slot_encode_workers(w, 2, &b), 0);
    assert_out(&b, "[{\"worker_id\":7,\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\","
                   "\"block_size\":16,\"dp_start\":0,\"dp_size\":2},"
                   "{\"worker_id\":18446744073709551615,\"model_name\":\"m\\u0000x\","
                   "\"tenant_id\":\"t\\\"\",\"block_size\":64,\"dp_start\":4294967294,"
                   "\"dp_size\":1}]");

    assert_int_equal(kvi_slot_encode_loads(NULL, 0, &b), 0);
    assert_out(&b, "[]");
    struct kvi_slots_load l = {"llama-3-8b", 10, "default", 7, 7, 0, 48, 3, 2};
    assert_int_equal(kvi_slot_encode_loads(&l, 1, &b), 0);
    assert_out(&b, "[{\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\",\"worker_id\":7,"
                   "\"dp_rank\":0,\"active_prefill_tokens\":48,\"active_decode_blocks\":3}]");

    assert_int_equal(kvi_slot_encode_potential(NULL, 0, &b), 0);
    assert_out(&b, "[]");
    struct kvi_slots_potential p = {.worker_id = 7, .dp_rank = 0, .potential_prefill_tokens = 96,
                                    .potential_decode_blocks = 4, .active_requests = 2};
    assert_int_equal(kvi_slot_encode_potential(&p, 1, &b), 0);
    assert_out(&b, "[{\"worker_id\":7,\"dp_rank\":0,\"potential_prefill_tokens\":96,"
                   "\"potential_decode_blocks\":4,\"active_requests\":2}]");

    const char *urls[] = {"tcp://c:8092", "tcp://a:8092", "tcp://b:8092"};
    assert_int_equal(kvi_slot_encode_peers(urls, 3, &b), 0);
    assert_out(&b, "[\"tcp://a:8092\",\"tcp://b:8092\",\"tcp://c:8092\"]");
    assert_string_equal(urls[0], "tcp://c:8092"); /* the caller's array is left alone */
    assert_int_equal(kvi_slot_encode_peers(NULL, 0, &b), 0);
    assert_out(&b, "[]");
    kvi_buf_free(&b);
}

/* Bodies through the engine and back: the document's examples byte for byte. */
static void test_through_the_engine(void **state)
{
    kvi_rcu_register_thread();
    struct kvi_slots *t = kvi_slots_create(NULL);
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_slot_register reg;
    struct kvi_slots_err why;

    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_register(J("{\"worker_id\":7,\"model_name\":\"llama-3-8b\","
                                               "\"tenant_id\":\"default\",\"block_size\":16,"
                                               "\"dp_start\":0,\"dp_size\":2}"),
                                             &reg, &E),
                     0);
    assert_int_equal(kvi_slots_register(t, &reg.key, reg.worker_id, reg.block_size, reg.dp_start,
                                        reg.dp_size, &why),
                     0);
    assert_int_equal(kvi_slots_register(t, &reg.key, reg.worker_id, reg.block_size, reg.dp_start,
                                        reg.dp_size, &why),
                     -EEXIST);
    kvi_slot_err_engine(&E, &why, &reg.key, NULL, 0);
    assert_int_equal(E.status, 409);
    assert_string_equal(E.msg, "worker 7 already registered for model=llama-3-8b tenant=default");
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_register(J("{\"worker_id\":8,\"model_name\":\"llama-3-8b\","
                                               "\"block_size\":0,\"dp_start\":0,\"dp_size\":1}"),
                                             &reg, &E),
                     0);
    assert_int_equal(kvi_slots_register(t, &reg.key, reg.worker_id, reg.block_size, reg.dp_start,
                                        reg.dp_size, &why),
                     -EINVAL);
    kvi_slot_err_engine(&E, &why, &reg.key, NULL, 0);
    assert_int_equal(E.status, 400);
    assert_string_equal(E.msg, "block_size must be greater than 0");

    struct kvi_slots_request add;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_add(J("{\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\","
                                          "\"request_id\":\"req-123\",\"worker_id\":7,\"dp_rank\":0,"
                                          "\"sequence_hashes\":[101,-22,303],\"new_isl_tokens\":48}"),
                                        &add, &E),
                     0);
    assert_int_equal(kvi_slots_add(t, &add, &why), 0);
    assert_int_equal(kvi_slots_add(t, &add, &why), -EEXIST);
    kvi_slot_err_engine(&E, &why, &add.key, add.request_id, add.request_id_len);
    assert_int_equal(E.status, 409);
    assert_string_equal(E.msg, "Request req-123 already exists (assigned to worker "
                               "WorkerWithDpRank { worker_id: 7, dp_rank: 0 })");
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_add(J("{\"model_name\":\"llama-3-8b\",\"request_id\":\"req-2\","
                                          "\"worker_id\":7,\"dp_rank\":0,\"sequence_hashes\":[101]}"),
                                        &add, &E),
                     0);
    assert_int_equal(kvi_slots_add(t, &add, &why), 0);
    add.dp_rank = 2;
    add.request_id = "req-3";
    add.request_id_len = 5;
    assert_int_equal(kvi_slots_add(t, &add, &why), -ENOENT);
    kvi_slot_err_engine(&E, &why, &add.key, add.request_id, add.request_id_len);
    assert_int_equal(E.status, 404);
    assert_string_equal(E.msg, "Worker WorkerWithDpRank { worker_id: 7, dp_rank: 2 } not found");

    /* GET /loads?model_name=llama-3-8b */
    struct kvi_slots_key filter;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_filter("model_name=llama-3-8b", 21, &S, &filter, &E), 0);
    struct kvi_slots_load loads[4];
    kvi_rcu_read_lock();
    size_t n = kvi_slots_loads(t, &filter, loads, 4);
    assert_int_equal(kvi_slot_encode_loads(loads, n, &b), 0);
    kvi_rcu_read_unlock();
    assert_out(&b, "[{\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\",\"worker_id\":7,"
                   "\"dp_rank\":0,\"active_prefill_tokens\":48,\"active_decode_blocks\":3},"
                   "{\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\",\"worker_id\":7,"
                   "\"dp_rank\":1,\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");

    /* GET /workers */
    struct kvi_slots_worker ws[4];
    kvi_rcu_read_lock();
    n = kvi_slots_workers(t, NULL, ws, 4);
    assert_int_equal(kvi_slot_encode_workers(ws, n, &b), 0);
    kvi_rcu_read_unlock();
    assert_out(&b, "[{\"worker_id\":7,\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\","
                   "\"block_size\":16,\"dp_start\":0,\"dp_size\":2}]");

    /* POST /potential_loads: the document's example numbers on rank 0 */
    struct kvi_slot_potential pq;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_potential(J("{\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\","
                                                "\"sequence_hashes\":[101,-22,303,404],"
                                                "\"new_isl_tokens\":48}"),
                                              &pq, &E),
                     0);
    struct kvi_slots_potential pot[4];
    size_t n_out;
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_potential_loads(t, &pq.key, pq.hashes, pq.n_hashes,
                                               pq.new_isl_tokens, pot, 4, &n_out),
                     0);
    assert_int_equal(kvi_slot_encode_potential(pot, n_out, &b), 0);
    kvi_rcu_read_unlock();
    assert_out(&b, "[{\"worker_id\":7,\"dp_rank\":0,\"potential_prefill_tokens\":96,"
                   "\"potential_decode_blocks\":4,\"active_requests\":2},"
                   "{\"worker_id\":7,\"dp_rank\":1,\"potential_prefill_tokens\":48,"
                   "\"potential_decode_blocks\":4,\"active_requests\":0}]");

    /* unknown tracker on /potential_loads and /free: 404 */
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_potential(J("{\"model_name\":\"other\",\"sequence_hashes\":[]}"),
                                              &pq, &E),
                     0);
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_potential_loads(t, &pq.key, pq.hashes, pq.n_hashes, 0, pot, 4,
                                               &n_out),
                     -ENOENT);
    kvi_rcu_read_unlock();
    struct kvi_slots_request fr;
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_lifecycle(J("{\"model_name\":\"other\",\"request_id\":\"r\"}"),
                                              &fr, &E),
                     0);
    assert_int_equal(kvi_slots_free(t, &fr, &why), -ENOENT);
    kvi_slot_err_engine(&E, &why, &fr.key, fr.request_id, fr.request_id_len);
    assert_int_equal(E.status, 404);
    assert_string_equal(E.msg, "no slot tracker for model=other tenant=default");

    /* the signed hash -1 is the u64 0xffffffffffffffff, and matches itself */
    kvi_scratch_reset(&S);
    assert_int_equal(kvi_slot_parse_add(J("{\"model_name\":\"llama-3-8b\",\"request_id\":\"neg\","
                                          "\"worker_id\":7,\"dp_rank\":1,\"sequence_hashes\":[-1],"
                                          "\"new_isl_tokens\":4}"),
                                        &add, &E),
                     0);
    assert_int_equal(kvi_slots_add(t, &add, NULL), 0);
    uint64_t minus_one = UINT64_MAX;
    kvi_rcu_read_lock();
    assert_int_equal(kvi_slots_potential_loads(t, &add.key, &minus_one, 1, 0, pot, 4, &n_out), 0);
    kvi_rcu_read_unlock();
    assert_int_equal(pot[1].overlap_blocks, 1);
    assert_int_equal(pot[1].potential_decode_blocks, 1);

    kvi_buf_free(&b);
    kvi_slots_destroy(t);
    kvi_rcu_unregister_thread();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_unregister),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_lifecycle_potential_peer),
        cmocka_unit_test(test_filter),
        cmocka_unit_test(test_engine_errors),
        cmocka_unit_test(test_encoders),
        cmocka_unit_test(test_through_the_engine),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
