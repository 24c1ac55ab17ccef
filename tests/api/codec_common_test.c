/* ctest-labels: unit -- api/codec_common.c: routes, content types, dialect detection (§0), endpoints (§1.1), error answers */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "api/codec.h"

static void test_routes(void **state)
{
    static const struct {
        const char *path;
        enum kvi_route r;
        const char *method;
    } cases[] = {
        {"/health", KVI_R_HEALTH, "GET"},
        {"/ready", KVI_R_READY, "GET"},
        {"/status", KVI_R_STATUS, "GET"},
        {"/metrics", KVI_R_METRICS, "GET"},
        {"/register", KVI_R_REGISTER, "POST"},
        {"/unregister", KVI_R_UNREGISTER, "POST"},
        {"/workers", KVI_R_WORKERS, "GET"},
        {"/workers?model_name=m", KVI_R_WORKERS, "GET"},
        {"/query", KVI_R_QUERY, "POST"},
        {"/query_by_hash", KVI_R_QUERY_BY_HASH, "POST"},
        {"/dump", KVI_R_DUMP, "GET"},
        {"/register_peer", KVI_R_REGISTER_PEER, "POST"},
        {"/deregister_peer", KVI_R_DEREGISTER_PEER, "POST"},
        {"/peers", KVI_R_PEERS, "GET"},
        {"/test/pause_listener", KVI_R_TEST_PAUSE, "POST"},
        {"/test/resume_listener", KVI_R_TEST_RESUME, "POST"},
        {"/global_view", KVI_R_GLOBAL_VIEW, "GET"},
        {"/services", KVI_R_SERVICES, "GET"},
        {"/nats/sources", KVI_R_NATS_SOURCES, "POST"},
        {"/zmq/bind", KVI_R_ZMQ_BIND, "POST"},
        {"/zmq/unbind", KVI_R_ZMQ_UNBIND, "POST"},
        {"/zmq/binds", KVI_R_ZMQ_BINDS, "GET"},
        {"/", KVI_R_UNKNOWN, NULL},
        {"/queryx", KVI_R_UNKNOWN, NULL},
        {"/query/", KVI_R_UNKNOWN, NULL},
        {"", KVI_R_UNKNOWN, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum kvi_route r = kvi_route_of(cases[i].path, strlen(cases[i].path));
        if (r != cases[i].r)
            fail_msg("%s -> %d, want %d", cases[i].path, r, cases[i].r);
        const char *m = kvi_route_method(r);
        if (cases[i].method == NULL)
            assert_null(m);
        else
            assert_string_equal(m, cases[i].method);
    }
}

static void test_ctype(void **state)
{
    static const struct {
        const char *v;
        enum kvi_ctype ct;
    } cases[] = {
        {"application/json", KVI_CT_JSON},
        {"Application/JSON; charset=utf-8", KVI_CT_JSON},
        {"  application/json ", KVI_CT_JSON},
        {"application/vnd.api+json", KVI_CT_JSON},
        {"application/msgpack", KVI_CT_MSGPACK},
        {"application/x-msgpack", KVI_CT_MSGPACK},
        {"APPLICATION/MSGPACK;x=1", KVI_CT_MSGPACK},
        {"text/plain", KVI_CT_OTHER},
        {"application/jsonx", KVI_CT_OTHER},
        {"", KVI_CT_NONE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (kvi_ctype_of(cases[i].v, strlen(cases[i].v)) != cases[i].ct)
            fail_msg("'%s'", cases[i].v);
    assert_int_equal(kvi_ctype_of(NULL, 0), KVI_CT_NONE);
    const char *acc[] = {"application/msgpack", "text/html, application/x-msgpack;q=0.9",
                         "application/json", "*/*", ""};
    const bool want[] = {true, true, false, false, false};
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(kvi_accepts_msgpack(acc[i], strlen(acc[i])), want[i]);
}

static char *mp_body(size_t *len, int n, ...)
{
    /* n pairs of (key, kind, value): kind 's' string, 'u' uint, 'a' int array */
    static msgpack_sbuffer sb;
    msgpack_sbuffer_destroy(&sb);
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        const char *k = va_arg(ap, const char *);
        int kind = va_arg(ap, int);
        msgpack_pack_str_with_body(&pk, k, strlen(k));
        if (kind == 's') {
            const char *v = va_arg(ap, const char *);
            msgpack_pack_str_with_body(&pk, v, strlen(v));
        } else if (kind == 'u') {
            msgpack_pack_uint64(&pk, va_arg(ap, unsigned long long));
        } else {
            int cnt = va_arg(ap, int);
            msgpack_pack_array(&pk, (size_t)cnt);
            for (int j = 0; j < cnt; j++)
                msgpack_pack_uint32(&pk, (uint32_t)j);
        }
    }
    va_end(ap);
    *len = sb.size;
    return sb.data;
}

static void test_detect_table(void **state)
{
    static const struct {
        enum kvi_route r;
        const char *body;
        enum kvi_dialect d;
    } cases[] = {
        /* /register */
        {KVI_R_REGISTER, "{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\",\"block_size\":16}", KVI_DIALECT_DYNAMO},
        {KVI_R_REGISTER, "{\"endpoint\":\"tcp://h:1\",\"modelname\":\"m\",\"instance_id\":\"x\"}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_REGISTER, "{\"endpoint\":\"tcp://h:1\",\"type\":\"vLLM\"}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_REGISTER, "{\"endpoint\":\"tcp://h:1\"}", KVI_DIALECT_DYNAMO},
        {KVI_R_REGISTER, "not json", KVI_DIALECT_DYNAMO},
        /* /unregister: instance_id's type decides wherever it is */
        {KVI_R_UNREGISTER, "{\"instance_id\":7,\"model_name\":\"m\"}", KVI_DIALECT_DYNAMO},
        {KVI_R_UNREGISTER, "{\"instance_id\":\"w\",\"dp_rank\":0}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_UNREGISTER, "{\"modelname\":\"m\",\"instance_id\":\"w\",\"dp_rank\":0}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_UNREGISTER, "{\"model_name\":\"m\",\"instance_id\":\"w\"}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_UNREGISTER, "{\"type\":\"vLLM\",\"dp_rank\":0}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_UNREGISTER, "{\"model_name\":\"m\"}", KVI_DIALECT_DYNAMO},
        /* /query: a huge token array before the key */
        {KVI_R_QUERY, "{\"token_ids\":[1,2,3],\"model_name\":\"m\"}", KVI_DIALECT_DYNAMO},
        {KVI_R_QUERY, "{\"token_ids\":[1,2,3],\"model\":\"m\",\"block_size\":4}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_QUERY, "{\"model\":\"m\"}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_QUERY, "{\"token_ids\":[]}", KVI_DIALECT_DYNAMO},
        {KVI_R_QUERY, "{\"lora_name\":\"a\\\"b\",\"x\":{\"model\":1},\"model\":\"m\"}", KVI_DIALECT_CONDUCTOR},
        /* /query_by_hash */
        {KVI_R_QUERY_BY_HASH, "{\"block_hashes\":[-1],\"model_name\":\"m\"}", KVI_DIALECT_DYNAMO},
        {KVI_R_QUERY_BY_HASH, "{\"model\":\"m\",\"seq_hashes\":[1]}", KVI_DIALECT_CONDUCTOR},
        {KVI_R_QUERY_BY_HASH, "{\"block_hash\":[1],\"model\":\"m\"}", KVI_DIALECT_CONDUCTOR},
        /* routes of one dialect */
        {KVI_R_GLOBAL_VIEW, "", KVI_DIALECT_CONDUCTOR},
        {KVI_R_SERVICES, "", KVI_DIALECT_CONDUCTOR},
        {KVI_R_WORKERS, "", KVI_DIALECT_DYNAMO},
        {KVI_R_DUMP, "", KVI_DIALECT_DYNAMO},
        {KVI_R_REGISTER_PEER, "{\"url\":\"x\"}", KVI_DIALECT_DYNAMO},
        {KVI_R_TEST_PAUSE, "{\"instance_id\":\"x\"}", KVI_DIALECT_DYNAMO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum kvi_dialect d =
            kvi_detect_dialect(cases[i].r, KVI_CT_JSON, cases[i].body, strlen(cases[i].body));
        if (d != cases[i].d)
            fail_msg("case %zu (%s): got %d", i, cases[i].body, d);
    }
    /* msgpack: Conductor, unless the keys are Dynamo's */
    size_t len;
    char *b = mp_body(&len, 2, "token_ids", 'a', 3, "model_name", 's', "m");
    assert_int_equal(kvi_detect_dialect(KVI_R_QUERY, KVI_CT_MSGPACK, b, len), KVI_DIALECT_DYNAMO);
    b = mp_body(&len, 2, "token_ids", 'a', 3, "model", 's', "m");
    assert_int_equal(kvi_detect_dialect(KVI_R_QUERY, KVI_CT_MSGPACK, b, len), KVI_DIALECT_CONDUCTOR);
    b = mp_body(&len, 1, "token_ids", 'a', 3);
    assert_int_equal(kvi_detect_dialect(KVI_R_QUERY, KVI_CT_MSGPACK, b, len), KVI_DIALECT_CONDUCTOR);
    b = mp_body(&len, 2, "instance_id", 'u', 5ull, "model_name", 's', "m");
    assert_int_equal(kvi_detect_dialect(KVI_R_UNREGISTER, KVI_CT_MSGPACK, b, len), KVI_DIALECT_DYNAMO);
    b = mp_body(&len, 1, "block_hashes", 'a', 2);
    assert_int_equal(kvi_detect_dialect(KVI_R_QUERY_BY_HASH, KVI_CT_MSGPACK, b, len),
                     KVI_DIALECT_DYNAMO);
    assert_int_equal(kvi_detect_dialect(KVI_R_REGISTER, KVI_CT_MSGPACK, "\xc1", 1),
                     KVI_DIALECT_CONDUCTOR);
    assert_int_equal(kvi_detect_dialect(KVI_R_QUERY, KVI_CT_MSGPACK, NULL, 0), KVI_DIALECT_CONDUCTOR);
    assert_int_equal(kvi_detect_dialect(KVI_R_QUERY, KVI_CT_NONE, NULL, 0), KVI_DIALECT_DYNAMO);
}

static void test_endpoints(void **state)
{
    static const char *const ok[] = {
        "tcp://*:5558", "tcp://127.0.0.1:0", "tcp://host:65535", "tcp://[::1]:5557",
        "inproc://listener", "ipc://engine0.sock", "tcp://a.b-c.d:1",
    };
    static const struct {
        const char *ep, *why;
    } bad[] = {
        {"tcp://host", "missing port"},
        {"tcp://:5558", "missing host"},
        {"udp://host:5558", "unsupported scheme"},
        {"not-an-endpoint", "missing scheme"},
        {"tcp://host:", "missing port"},
        {"tcp://host:65536", "invalid port"},
        {"tcp://host:12x", "invalid port"},
        {"tcp://host:-1", "invalid port"},
        {"tcp://::1:5557", "an IPv6 host must be in brackets"},
        {"tcp://[::1]", "missing port"},
        {"tcp://[]:1", "invalid IPv6 host"},
        {"tcp://", "missing port"},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        const char *why = NULL;
        if (!kvi_endpoint_valid(ok[i], strlen(ok[i]), &why))
            fail_msg("%s rejected: %s", ok[i], why);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *why = NULL;
        if (kvi_endpoint_valid(bad[i].ep, strlen(bad[i].ep), &why))
            fail_msg("%s accepted", bad[i].ep);
        assert_string_equal(why, bad[i].why);
    }
}

static void assert_out(const struct kvi_buf *b, const char *want)
{
    if (b->len != strlen(want) || memcmp(b->data, want, b->len) != 0)
        fail_msg("got  '%.*s'\nwant '%s'", (int)b->len, b->data, want);
}

static void test_err_encode(void **state)
{
    struct kvi_api_err e;
    struct kvi_buf b;
    const char *ct;
    kvi_buf_init(&b);

    assert_int_equal(kvi_err_unknown_path(&e, "/nope", 5), -EINVAL);
    assert_int_equal(e.status, 404);
    assert_int_equal(kvi_err_encode(&e, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, &b, &ct), 0);
    assert_out(&b, "{\"error\":\"not found: /nope\"}");
    assert_string_equal(ct, KVI_MIME_JSON);

    /* Conductor 404/405/500: plain text with a newline */
    kvi_buf_reset(&b);
    kvi_err_method(&e);
    assert_int_equal(e.status, 405);
    assert_int_equal(kvi_err_encode(&e, KVI_DIALECT_CONDUCTOR, KVI_ENC_JSON, &b, &ct), 0);
    assert_out(&b, "Method not allowed\n");
    assert_string_equal(ct, KVI_MIME_TEXT);

    kvi_buf_reset(&b);
    kvi_err_too_large(&e, 8u << 20);
    assert_int_equal(e.status, 413);
    kvi_err_encode(&e, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, &b, &ct);
    assert_out(&b, "{\"error\":\"request body over the 8388608-byte limit\"}");

    kvi_buf_reset(&b);
    kvi_err_internal(&e, "indexer \"x\" failed");
    kvi_err_encode(&e, KVI_DIALECT_DYNAMO, KVI_ENC_JSON, &b, &ct);
    assert_int_equal(e.status, 500);
    assert_out(&b, "{\"error\":\"indexer \\\"x\\\" failed\"}");
    kvi_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_ctype),
        cmocka_unit_test(test_detect_table),
        cmocka_unit_test(test_endpoints),
        cmocka_unit_test(test_err_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
