/* ctest-labels: unit -- api codecs: every parser on every truncation and on byte mutations of valid bodies (JSON, msgpack, /dump) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "api/codec_dump.h"

static struct kvi_scratch S;

/* Every parser behind one signature. */
static int p_dyn_register(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_dyn_register o;
    return kvi_dyn_parse_register(b, n, ct, &S, &o, e);
}
static int p_dyn_unregister(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_dyn_unregister o;
    return kvi_dyn_parse_unregister(b, n, ct, &S, &o, e);
}
static int p_dyn_query(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_dyn_query o;
    return kvi_dyn_parse_query(b, n, ct, &S, &o, e);
}
static int p_dyn_qbh(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_dyn_query_hash o;
    return kvi_dyn_parse_query_by_hash(b, n, ct, &S, &o, e);
}
static int p_dyn_peer(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_dyn_peer o;
    return kvi_dyn_parse_peer(b, n, ct, &S, &o, e);
}
static int p_dyn_lctl(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_dyn_listener_ctl o;
    return kvi_dyn_parse_listener_ctl(b, n, ct, &S, &o, e);
}
static int p_cond_register(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_cond_register o;
    return kvi_cond_parse_register(b, n, ct, &S, &o, e);
}
static int p_cond_unregister(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_cond_unregister o;
    return kvi_cond_parse_unregister(b, n, ct, &S, &o, e);
}
static int p_cond_query(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_cond_query o;
    return kvi_cond_parse_query(b, n, ct, &S, &o, e);
}
static int p_cond_qbh(const void *b, size_t n, enum kvi_ctype ct, struct kvi_api_err *e)
{
    struct kvi_cond_query_hash o;
    return kvi_cond_parse_query_by_hash(b, n, ct, &S, &o, e);
}

typedef int (*parse_fn)(const void *, size_t, enum kvi_ctype, struct kvi_api_err *);

static const struct {
    parse_fn fn;
    const char *body;
} json_cases[] = {
    {p_dyn_register, "{\"instance_id\":18446744073709551615,\"endpoint\":\"tcp://[::1]:5557\",\"model_name\":\"m\\u00e9\","
                     "\"tenant_id\":\"t\",\"block_size\":16,\"dp_rank\":1,\"replay_endpoint\":\"ipc://r\",\"x\":[{\"y\":null}]}"},
    {p_dyn_unregister, "{\"instance_id\":1,\"model_name\":\"m\",\"tenant_id\":\"t\",\"dp_rank\":0}"},
    {p_dyn_query, "{\"token_ids\":[1,22,333,4444,55555,666666,4294967295],\"model_name\":\"m\",\"lora_name\":\"a\\\"b\"}"},
    {p_dyn_qbh, "{\"block_hashes\":[-9223372036854775808,9223372036854775807,0,-1],\"model_name\":\"m\"}"},
    {p_dyn_peer, "{\"url\":\"http://peer:8091\"}"},
    {p_dyn_lctl, "{\"instance_id\":7,\"dp_rank\":2}"},
    {p_cond_register, "{\"endpoint\":\"tcp://1.1.1.1:5557\",\"type\":\"vLLM\",\"modelname\":\"ds\",\"instance_id\":\"i\","
                      "\"block_size\":128,\"dp_rank\":0,\"cache_group\":0,\"hash_profile\":{\"strategy\":\"vllm_v1\","
                      "\"python_hash_seed\":0}}"},
    {p_cond_unregister, "{\"type\":\"vLLM\",\"instance_id\":\"i\",\"tenant_id\":\"t\",\"dp_rank\":3,\"block_size\":4}"},
    {p_cond_query, "{\"model\":\"m\",\"block_size\":4,\"token_ids\":[-2147483648,2147483647,5],\"lora_id\":[1]}"},
    {p_cond_qbh, "{\"model\":\"m\",\"block_size\":4,\"seq_hashes\":[18446744073709551615,-1]}"},
};

static void check_result(int r, const struct kvi_api_err *e, const char *what, size_t at)
{
    if (r == 0)
        return;
    if (r != -EINVAL)
        fail_msg("%s at %zu: returned %d", what, at, r);
    if (e->status != 400 && e->status != 415 && e->status != 422)
        fail_msg("%s at %zu: status %d (%s)", what, at, e->status, e->msg);
    if (e->msg[0] == '\0')
        fail_msg("%s at %zu: empty message", what, at);
}

static void test_json_truncations_and_mutations(void **state)
{
    static const char subst[] = "{}[]\",:0-9a\\ \x80\xff";
    for (size_t c = 0; c < sizeof(json_cases) / sizeof(json_cases[0]); c++) {
        const char *b = json_cases[c].body;
        size_t n = strlen(b);
        struct kvi_api_err e;
        kvi_scratch_reset(&S);
        if (json_cases[c].fn(b, n, KVI_CT_JSON, &e) != 0)
            fail_msg("case %zu: valid body rejected: %s", c, e.msg);
        /* every strict prefix is an error, never a crash */
        for (size_t cut = 0; cut < n; cut++) {
            kvi_scratch_reset(&S);
            int r = json_cases[c].fn(b, cut, KVI_CT_JSON, &e);
            if (r == 0)
                fail_msg("case %zu: prefix of %zu bytes accepted", c, cut);
            check_result(r, &e, "prefix", cut);
        }
        /* every single-byte substitution: accepted or a clean error */
        char *m = malloc(n);
        for (size_t at = 0; at < n; at++) {
            for (size_t k = 0; k < sizeof(subst) - 1; k++) {
                memcpy(m, b, n);
                m[at] = subst[k];
                kvi_scratch_reset(&S);
                check_result(json_cases[c].fn(m, n, KVI_CT_JSON, &e), &e, "mutation", at);
                kvi_scratch_reset(&S);
                check_result(json_cases[c].fn(m, n, KVI_CT_MSGPACK, &e), &e, "as msgpack", at);
            }
        }
        free(m);
    }
}

static void test_msgpack_truncations(void **state)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    msgpack_pack_str_with_body(&pk, "model", 5);
    msgpack_pack_str_with_body(&pk, "deepseek", 8);
    msgpack_pack_str_with_body(&pk, "block_size", 10);
    msgpack_pack_uint16(&pk, 300);
    msgpack_pack_str_with_body(&pk, "token_ids", 9);
    msgpack_pack_bin_with_body(&pk, "\x01\0\0\0\x02\0\0\0", 8);
    msgpack_pack_str_with_body(&pk, "cache_salt", 10);
    msgpack_pack_nil(&pk);
    msgpack_pack_str_with_body(&pk, "instance_id", 11);
    msgpack_pack_str_with_body(&pk, "i", 1);
    struct kvi_api_err e;
    kvi_scratch_reset(&S);
    assert_int_equal(p_cond_query(sb.data, sb.size, KVI_CT_MSGPACK, &e), 0);
    for (size_t cut = 0; cut < sb.size; cut++) {
        kvi_scratch_reset(&S);
        int r = p_cond_query(sb.data, cut, KVI_CT_MSGPACK, &e);
        assert_int_equal(r, -EINVAL);
        check_result(r, &e, "msgpack prefix", cut);
    }
    char *m = malloc(sb.size);
    for (size_t at = 0; at < sb.size; at++) {
        for (int v = 0; v < 256; v += 7) {
            memcpy(m, sb.data, sb.size);
            m[at] = (char)v;
            kvi_scratch_reset(&S);
            check_result(p_cond_query(m, sb.size, KVI_CT_MSGPACK, &e), &e, "msgpack mutation", at);
            kvi_scratch_reset(&S);
            check_result(p_dyn_query(m, sb.size, KVI_CT_MSGPACK, &e), &e, "msgpack mutation (dyn)", at);
            (void)kvi_detect_dialect(KVI_R_QUERY, KVI_CT_MSGPACK, m, sb.size);
        }
    }
    free(m);
    msgpack_sbuffer_destroy(&sb);
}

static int count_rec(void *ctx, const struct kvi_dump_rec *r)
{
    (*(size_t *)ctx)++;
    return 0;
}

static void test_dump_truncations(void **state)
{
    const char *body = "{\"a:b\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"storage_tier\":\"host_pinned\","
                       "\"event\":{\"event_id\":0,\"dp_rank\":0,\"data\":{\"stored\":{\"parent_hash\":null,"
                       "\"start_position\":0,\"blocks\":[{\"block_hash\":1,\"tokens_hash\":2,\"seq_hash\":2}]}}}},"
                       "{\"worker_id\":\"n\",\"event\":{\"event_id\":1,\"data\":{\"removed\":{\"block_hashes\":[1]}}}}]},"
                       "\"c\":{\"events\":[],\"block_size\":4}}";
    size_t n = strlen(body);
    for (size_t cut = 0; cut <= n; cut++) {
        size_t recs = 0;
        struct kvi_dump_dec_cb cb = {NULL, count_rec, &recs, NULL};
        struct kvi_dump_dec *d = kvi_dump_dec_create(&cb);
        int r = kvi_dump_dec_feed(d, body, cut);
        if (r == 0)
            r = kvi_dump_dec_finish(d);
        if (cut == n) {
            assert_int_equal(r, 0);
            assert_int_equal(recs, 2);
        } else {
            assert_int_equal(r, -EBADMSG);
        }
        kvi_dump_dec_destroy(d);
    }
    char *m = malloc(n);
    static const char subst[] = "{}[]\",:0-a\\ ";
    for (size_t at = 0; at < n; at++) {
        for (size_t k = 0; k < sizeof(subst) - 1; k++) {
            memcpy(m, body, n);
            m[at] = subst[k];
            size_t recs = 0;
            struct kvi_dump_dec_cb cb = {NULL, count_rec, &recs, NULL};
            struct kvi_dump_dec *d = kvi_dump_dec_create(&cb);
            int r = kvi_dump_dec_feed(d, m, n);
            if (r == 0)
                r = kvi_dump_dec_finish(d);
            assert_true(r == 0 || r == -EBADMSG);
            kvi_dump_dec_destroy(d);
        }
    }
    free(m);
}

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_truncations_and_mutations),
        cmocka_unit_test(test_msgpack_truncations),
        cmocka_unit_test(test_dump_truncations),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
