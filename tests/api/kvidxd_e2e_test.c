/* ctest-labels: integration */
/*
 * kvidxd end to end: real ZMQ publishers (the C publisher library) feed the
 * real daemon, and routers query it over HTTP/1.1 and h2c, in JSON and
 * msgpack, in both dialects:
 *   - Dynamo /query and /query_by_hash: scores, tree sizes, tiers (a cpu
 *     extension), removals, the same answer over every protocol/encoding;
 *   - Conductor /register, /query (docs shape for JSON, impl shape for
 *     msgpack with a bin of int32 tokens), /query_by_hash (seq hashes), the
 *     instance filter, /global_view, /services, /unregister, conflicts;
 *   - the test routes: pause -> batches lost -> resume -> replay -> the dump
 *     holds exactly the publisher's blocks.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <msgpack.h>

#include "kvidxd_fixture.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

static void dyn_register(struct kfx_daemon *d, uint64_t id, const char *model, struct kvidx_pub *p)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"model_name\":\"%s\",\"block_size\":%d,\"endpoint\":\"%s\","
             "\"replay_endpoint\":\"%s\"}",
             (unsigned long long)id, model, KFX_BS, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
    kfx_expect(d, "/register", j, 201, "{\"status\":\"ok\"}");
}

/* A msgpack map body: {model_key: model, tok_key: bin of n blocks of chain c as LE u32, extra...}. */
static void mp_query(msgpack_sbuffer *sb, const char *model_key, const char *model, uint32_t c, uint32_t n,
                     uint32_t bs)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, bs ? 3 : 2);
    msgpack_pack_str_with_body(&pk, model_key, strlen(model_key));
    msgpack_pack_str_with_body(&pk, model, strlen(model));
    if (bs) {
        msgpack_pack_str_with_body(&pk, "block_size", 10);
        msgpack_pack_uint32(&pk, bs);
    }
    msgpack_pack_str_with_body(&pk, "token_ids", 9);
    uint32_t tok[256];
    kfx_tokens(c, 0, n, tok);
    uint8_t le[1024];
    for (uint32_t i = 0; i < n * KFX_BS; i++)
        for (int k = 0; k < 4; k++)
            le[i * 4 + (uint32_t)k] = (uint8_t)(tok[i] >> (8 * k));
    msgpack_pack_bin_with_body(&pk, le, n * KFX_BS * 4);
}

/* Follow string keys through nested msgpack maps. */
static const msgpack_object *mp_path(const msgpack_object *o, int depth, ...)
{
    va_list ap;
    va_start(ap, depth);
    for (int d = 0; d < depth && o != NULL; d++) {
        const char *k = va_arg(ap, const char *);
        const msgpack_object *next = NULL;
        if (o->type == MSGPACK_OBJECT_MAP)
            for (uint32_t i = 0; i < o->via.map.size; i++) {
                const msgpack_object *key = &o->via.map.ptr[i].key;
                if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == strlen(k) &&
                    memcmp(key->via.str.ptr, k, key->via.str.size) == 0)
                    next = &o->via.map.ptr[i].val;
            }
        o = next;
    }
    va_end(ap);
    return o;
}

static uint64_t mp_u64(const msgpack_object *o)
{
    assert_non_null(o);
    assert_int_equal(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    return o->via.u64;
}

static char *hash_query_json(const char *model, uint32_t c, uint32_t n)
{
    char *s = malloc(64 + n * 24);
    size_t o = (size_t)sprintf(s, "{\"model_name\":\"%s\",\"block_hashes\":[", model);
    for (uint32_t i = 0; i < n; i++)
        o += (size_t)sprintf(s + o, "%s%lld", i ? "," : "", (long long)kfx_content(c, i));
    sprintf(s + o, "]}");
    return s;
}

static void test_dynamo_end_to_end(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    struct kvidx_pub *p1 = kfx_pub(0), *p2 = kfx_pub(0);
    struct kvidx_pub *pubs[2] = {p1, p2};
    dyn_register(&d, 1, "m", p1);
    dyn_register(&d, 2, "m", p2);
    kfx_publish(p1, 0, 0, 8, NULL);
    kfx_publish(p2, 0, 0, 4, NULL);
    char *q = kfx_query_json("m", 0, 8);
    const char *want = "{\"scores\":{\"1\":{\"0\":32},\"2\":{\"0\":16}},\"frequencies\":[],"
                       "\"tree_sizes\":{\"1\":{\"0\":8},\"2\":{\"0\":4}},"
                       "\"instances\":{\"1\":{\"longest_matched\":32,\"gpu\":32,\"dp\":{\"0\":32},\"cpu\":32,\"disk\":32},"
                       "\"2\":{\"longest_matched\":16,\"gpu\":16,\"dp\":{\"0\":16},\"cpu\":16,\"disk\":16}}}";
    kfx_until_query(&d, "/query", q, want, pubs, 2);
    kfx_expect(&d, "/query", q, 200, want);

    /* h2c prior knowledge: same answer */
    struct kfx_resp r;
    const char *hj[] = {"Content-Type: application/json", NULL};
    assert_int_equal(kfx_http(&d, KFX_H2C, "POST", "/query", hj, q, strlen(q), &r), 200);
    assert_int_equal(r.version, CURL_HTTP_VERSION_2_0);
    assert_string_equal(r.body, want);
    kfx_resp_free(&r);

    /* /query_by_hash with local content hashes as i64 */
    char *qh = hash_query_json("m", 0, 8);
    kfx_expect(&d, "/query_by_hash", qh, 200, want);

    /* msgpack request and response, both protocols */
    msgpack_sbuffer sb;
    mp_query(&sb, "model_name", "m", 0, 8, 0);
    const char *hm[] = {"Content-Type: application/msgpack", NULL};
    for (int proto = KFX_H1; proto <= KFX_H2C; proto++) {
        assert_int_equal(kfx_http(&d, proto, "POST", "/query", hm, sb.data, sb.size, &r), 200);
        assert_string_equal(r.ctype, "application/msgpack");
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, r.body, r.len, NULL), MSGPACK_UNPACK_SUCCESS);
        assert_int_equal(mp_u64(mp_path(&u.data, 3, "scores", "1", "0")), 32);
        assert_int_equal(mp_u64(mp_path(&u.data, 3, "scores", "2", "0")), 16);
        assert_int_equal(mp_u64(mp_path(&u.data, 3, "tree_sizes", "1", "0")), 8);
        assert_int_equal(mp_u64(mp_path(&u.data, 3, "instances", "2", "longest_matched")), 16);
        msgpack_unpacked_destroy(&u);
        kfx_resp_free(&r);
    }
    msgpack_sbuffer_destroy(&sb);
    /* a JSON request asking for msgpack gets msgpack */
    const char *ha[] = {"Content-Type: application/json", "Accept: application/msgpack", NULL};
    assert_int_equal(kfx_http(&d, KFX_H1, "POST", "/query", ha, q, strlen(q), &r), 200);
    assert_string_equal(r.ctype, "application/msgpack");
    kfx_resp_free(&r);

    /* tiers: instance 1 offloads blocks 8..10 to CPU; removals on instance 2 */
    kfx_publish(p1, 0, 8, 10, "CPU");
    kfx_unpublish(p2, 0, 2, 4);
    char *q10 = kfx_query_json("m", 0, 10);
    const char *want10 =
        "{\"scores\":{\"1\":{\"0\":32},\"2\":{\"0\":8}},\"frequencies\":[],"
        "\"tree_sizes\":{\"1\":{\"0\":8},\"2\":{\"0\":2}},"
        "\"instances\":{\"1\":{\"longest_matched\":40,\"gpu\":32,\"dp\":{\"0\":32},\"cpu\":40,\"disk\":40},"
        "\"2\":{\"longest_matched\":8,\"gpu\":8,\"dp\":{\"0\":8},\"cpu\":8,\"disk\":8}}}";
    kfx_until_query(&d, "/query", q10, want10, pubs, 2);
    /* a trailing partial block is ignored; another model does not match */
    kfx_expect(&d, "/query", "{\"model_name\":\"m\",\"token_ids\":[0,1,2]}", 200,
               "{\"scores\":{},\"frequencies\":[],\"tree_sizes\":{},\"instances\":{}}");
    free(q);
    free(qh);
    free(q10);
    kvidx_pub_destroy(p1);
    kvidx_pub_destroy(p2);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void cond_register(struct kfx_daemon *d, const char *inst, int rank, struct kvidx_pub *p, int status,
                          const char *body)
{
    char j[1024];
    snprintf(j, sizeof j,
             "{\"type\":\"vllm\",\"modelname\":\"cm\",\"instance_id\":\"%s\",\"block_size\":%d,\"dp_rank\":%d,"
             "\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\",\"additionalsalt\":\"\"}",
             inst, KFX_BS, rank, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
    kfx_expect(d, "/register", j, status, body);
}

static char *cond_query_json(uint32_t c, uint32_t n, const char *filter)
{
    char *dq = kfx_query_json("cm", c, n); /* {"model_name":"cm","token_ids":[...]} */
    char *s = malloc(strlen(dq) + 128);
    sprintf(s, "{\"model\":\"cm\",\"block_size\":%d,%s%s%s%s", KFX_BS, filter ? "\"instance_id\":\"" : "",
            filter ? filter : "", filter ? "\"," : "", strstr(dq, "\"token_ids\""));
    free(dq);
    return s;
}

static void test_conductor_end_to_end(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    struct kvidx_pub *pa = kfx_pub(0), *pb0 = kfx_pub(0), *pb1 = kfx_pub(1);
    struct kvidx_pub *pubs[3] = {pa, pb0, pb1};
    cond_register(&d, "node-a", 0, pa, 200, "{\"status\":\"registered successfully\",\"instance_id\":\"node-a\"}\n");
    cond_register(&d, "node-a", 0, pa, 200, NULL); /* identical: no-op */
    cond_register(&d, "node-b", 0, pb0, 200, NULL);
    cond_register(&d, "node-b", 1, pb1, 200, NULL);
    /* same key, other config; endpoint of another key */
    cond_register(&d, "node-b", 1, pb0, 400, NULL);
    struct kfx_resp r;
    char j[1024];
    snprintf(j, sizeof j,
             "{\"type\":\"vLLM\",\"modelname\":\"cm\",\"instance_id\":\"node-c\",\"block_size\":4,\"dp_rank\":0,"
             "\"endpoint\":\"%s\"}",
             kvidx_pub_endpoint(pa));
    assert_int_equal(kfx_post_json(&d, "/register", j, &r), 400);
    assert_non_null(strstr(r.body, "\"reason\":\"invalid_registration\""));
    kfx_resp_free(&r);

    kfx_publish(pa, 1, 0, 6, NULL);
    kfx_publish(pb1, 1, 0, 3, NULL);
    char *q = cond_query_json(1, 6, NULL);
    const char *want =
        "{\"default\":{\"node-a\":{\"longest_matched\":24,\"GPU\":24,\"DP\":{\"0\":24},\"CPU\":24,\"DISK\":24,"
        "\"rank_matches\":{\"0\":{\"gpu\":24,\"cpu\":24,\"disk\":24}}},"
        "\"node-b\":{\"longest_matched\":12,\"GPU\":12,\"DP\":{\"0\":0,\"1\":12},\"CPU\":12,\"DISK\":12,"
        "\"rank_matches\":{\"0\":{\"gpu\":0,\"cpu\":0,\"disk\":0},\"1\":{\"gpu\":12,\"cpu\":12,\"disk\":12}}}}}\n";
    kfx_until_query(&d, "/query", q, want, pubs, 3);
    kfx_expect(&d, "/query", q, 200, want);

    /* the instance filter */
    char *qf = cond_query_json(1, 6, "node-b");
    assert_int_equal(kfx_post_json(&d, "/query", qf, &r), 200);
    assert_null(strstr(r.body, "node-a"));
    assert_non_null(strstr(r.body, "\"node-b\":{\"longest_matched\":12"));
    kfx_resp_free(&r);

    /* /query_by_hash with RFC 1527 seq hashes (u64 in JSON) */
    uint64_t content[6], seq[6];
    for (uint32_t i = 0; i < 6; i++)
        content[i] = kfx_content(1, i);
    kvi_seq_hashes(content, 6, seq);
    char qs[1024];
    size_t o = (size_t)sprintf(qs, "{\"model\":\"cm\",\"block_size\":%d,\"seq_hashes\":[", KFX_BS);
    for (int i = 0; i < 6; i++)
        o += (size_t)sprintf(qs + o, "%s%llu", i ? "," : "", (unsigned long long)seq[i]);
    sprintf(qs + o, "]}");
    kfx_expect(&d, "/query_by_hash", qs, 200, want);

    /* msgpack: bin of LE int32 tokens -> the implemented shape */
    msgpack_sbuffer sb;
    mp_query(&sb, "model", "cm", 1, 6, KFX_BS);
    const char *hm[] = {"Content-Type: application/msgpack", NULL};
    for (int proto = KFX_H1; proto <= KFX_H2C; proto++) {
        assert_int_equal(kfx_http(&d, proto, "POST", "/query", hm, sb.data, sb.size, &r), 200);
        assert_string_equal(r.ctype, "application/msgpack");
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, r.body, r.len, NULL), MSGPACK_UNPACK_SUCCESS);
        assert_int_equal(mp_u64(mp_path(&u.data, 3, "instances", "node-a", "longest_matched")), 24);
        assert_int_equal(mp_u64(mp_path(&u.data, 4, "instances", "node-b", "dp", "0")), 0);
        assert_int_equal(mp_u64(mp_path(&u.data, 4, "instances", "node-b", "dp", "1")), 12);
        assert_int_equal(mp_u64(mp_path(&u.data, 5, "instances", "node-b", "rank_matches", "1", "disk")), 12);
        assert_int_equal(mp_u64(mp_path(&u.data, 3, "instances", "node-b", "gpu")), 12);
        msgpack_unpacked_destroy(&u);
        kfx_resp_free(&r);
    }
    msgpack_sbuffer_destroy(&sb);
    /* unknown context: empty */
    kfx_expect(&d, "/query", "{\"model\":\"cm\",\"block_size\":8,\"token_ids\":[1,2,3,4,5,6,7,8]}", 200,
               "{\"default\":{}}\n");

    /* /global_view and /services */
    assert_int_equal(kfx_get(&d, "/global_view", &r), 200);
    if (strstr(r.body, "\"context_count\":1") == NULL ||
        strstr(r.body, "\"instances\":{\"node-a\":[0],\"node-b\":[0,1]}") == NULL ||
        strstr(r.body, "\"prefix_count\":") == NULL)
        fail_msg("/global_view: %s", r.body);
    kfx_resp_free(&r);
    assert_int_equal(kfx_get(&d, "/services", &r), 200);
    if (strncmp(r.body, "{\"count\":3,", 11) != 0 || strstr(r.body, "\"InstanceID\":\"node-b\"") == NULL ||
        r.body[r.len - 1] != '}')
        fail_msg("/services: %s", r.body);
    kfx_resp_free(&r);

    /* /unregister */
    kfx_expect(&d, "/unregister", "{\"instance_id\":\"node-b\",\"tenant_id\":\"default\",\"dp_rank\":1,\"type\":\"vLLM\"}",
               200, "{\"status\":\"unregistered successfully\",\"removed_instances\":[\"node-b|default|1\"]}\n");
    kfx_expect(&d, "/unregister", "{\"instance_id\":\"node-b\",\"dp_rank\":1}", 404, "service not found: node-b|default|1\n");
    assert_int_equal(kfx_post_json(&d, "/query", q, &r), 200);
    if (strstr(r.body, "\"node-b\":{\"longest_matched\":0,\"GPU\":0,\"DP\":{\"0\":0},") == NULL)
        fail_msg("after unregistering node-b rank 1: %s", r.body);
    kfx_resp_free(&r);
    free(q);
    free(qf);
    kvidx_pub_destroy(pa);
    kvidx_pub_destroy(pb0);
    kvidx_pub_destroy(pb1);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* Count dump events and check that each of blocks [0, n) of chain c is there once. */
static void check_dump(struct kfx_daemon *d, uint32_t c, uint32_t n)
{
    struct kfx_resp r;
    assert_int_equal(kfx_get(d, "/dump", &r), 200);
    size_t events = 0;
    for (const char *p = r.body; (p = strstr(p, "\"block_hash\":")) != NULL; p++)
        events++;
    if (events != n)
        fail_msg("dump has %zu blocks, want %u: %.400s", events, n, r.body);
    for (uint32_t i = 0; i < n; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "\"block_hash\":%llu,", (unsigned long long)kfx_hash(c, i));
        if (strstr(r.body, needle) == NULL)
            fail_msg("dump lacks block %u: %.400s", i, r.body);
    }
    kfx_resp_free(&r);
}

static void test_pause_resume_replay(void **state)
{
    (void)state;
    struct kfx_daemon d;
    const char *env[] = {"DYN_KV_INDEXER_TEST_ENDPOINTS=1", NULL};
    kfx_start(&d, NULL, env);
    struct kvidx_pub *p = kfx_pub(0);
    dyn_register(&d, 7, "m", p);
    kfx_publish(p, 2, 0, 4, NULL);
    char *q = kfx_query_json("m", 2, 10);
    kfx_until_query(&d, "/query", q, "\"scores\":{\"7\":{\"0\":16}}", &p, 1);
    kfx_expect(&d, "/test/pause_listener", "{\"instance_id\":7,\"dp_rank\":0}", 200, NULL);
    kfx_publish(p, 2, 4, 6, NULL); /* lost: nobody listens */
    kfx_publish(p, 2, 6, 8, NULL);
    kfx_expect(&d, "/query", q, 200, NULL);
    assert_true(kfx_get_has(&d, "/status", 200, "\"paused\":1"));
    kfx_expect(&d, "/test/resume_listener", "{\"instance_id\":7}", 200, NULL);
    kfx_publish(p, 2, 8, 10, NULL); /* shows the gap: replay brings 4..8 */
    kfx_until_query(&d, "/query", q, "\"scores\":{\"7\":{\"0\":40}}", &p, 1);
    check_dump(&d, 2, 10);
    /* the two batches lost while paused came back by replay */
    assert_true(kfx_metric(&d, "kvidx_listener_replayed_total") >= 2);
    assert_true(kfx_metric(&d, "kvidx_listener_gaps_total") >= 1);
    free(q);
    kvidx_pub_destroy(p);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_dynamo_end_to_end, teardown),
        cmocka_unit_test_teardown(test_conductor_end_to_end, teardown),
        cmocka_unit_test_teardown(test_pause_resume_replay, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
