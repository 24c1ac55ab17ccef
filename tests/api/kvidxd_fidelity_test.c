/* ctest-labels: integration */
/*
 * kvidxd answers what the engines hold, whatever the registration path, the
 * DP rank or the storage backend (issue 17), against the real daemon over
 * real ZMQ:
 *   - an AllBlocksCleared from one DP rank's publisher drops that rank only;
 *     unregistering the instance without dp_rank still drops every rank;
 *   - Conductor queries, /services and /global_view list Dynamo-registered
 *     instances (and Dynamo queries Conductor-registered ones);
 *   - a Mooncake store event whose parent lives on another backend is placed
 *     by position, so the pool's disk reach covers it.
 * Each test waits for the state it needs with a deadline (kfx_until_query),
 * never for a fixed time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <msgpack.h>

#include "kvidxd_fixture.h"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

static void dyn_register(struct kfx_daemon *d, uint64_t id, int rank, const char *model, struct kvidx_pub *p)
{
    char j[1024];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"dp_rank\":%d,\"model_name\":\"%s\",\"block_size\":%d,\"endpoint\":\"%s\","
             "\"replay_endpoint\":\"%s\"}",
             (unsigned long long)id, rank, model, KFX_BS, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
    kfx_expect(d, "/register", j, 201, "{\"status\":\"ok\"}");
}

/* POST json to path; the body, which the caller frees. */
static char *post_body(struct kfx_daemon *d, const char *path, const char *json)
{
    struct kfx_resp r;
    long s = kfx_post_json(d, path, json, &r);
    if (s != 200)
        fail_msg("POST %s %s: %ld %s", path, json, s, r.body);
    char *b = strdup(r.body);
    kfx_resp_free(&r);
    return b;
}

static char *get_body(struct kfx_daemon *d, const char *path)
{
    struct kfx_resp r;
    long s = kfx_get(d, path, &r);
    if (s != 200)
        fail_msg("GET %s: %ld %s", path, s, r.body);
    char *b = strdup(r.body);
    kfx_resp_free(&r);
    return b;
}

static void expect_has(const char *what, const char *body, const char *needle)
{
    if (strstr(body, needle) == NULL)
        fail_msg("%s: %.2000s lacks %s", what, body, needle);
}

static void expect_lacks(const char *what, const char *body, const char *needle)
{
    const char *at = strstr(body, needle);
    if (at != NULL)
        fail_msg("%s: has %s at offset %zu: ...%.300s", what, needle, (size_t)(at - body), at);
}

/* The /query_by_hash (Dynamo dialect) body of the first n blocks of chain c:
 * local content hashes as i64. */
static char *dyn_query_by_hash_json(const char *model, uint32_t c, uint32_t n)
{
    char *s = malloc(128 + (size_t)n * 24);
    size_t o = (size_t)sprintf(s, "{\"model_name\":\"%s\",\"block_hashes\":[", model);
    for (uint32_t i = 0; i < n; i++)
        o += (size_t)sprintf(s + o, "%s%lld", i ? "," : "", (long long)kfx_content(c, i));
    sprintf(s + o, "]}");
    return s;
}

/* ---- 1. a clear from one DP rank ------------------------------------------------------------ */

static void test_clear_drops_one_rank(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    /* one engine, two DP ranks: one scheduler, cache and publisher each */
    struct kvidx_pub *p0 = kfx_pub(0), *p1 = kfx_pub(1);
    struct kvidx_pub *pubs[2] = {p0, p1};
    dyn_register(&d, 1, 0, "m", p0);
    dyn_register(&d, 1, 1, "m", p1);
    kfx_publish(p0, 1, 0, 8, NULL);
    kfx_publish(p0, 1, 0, 8, "CPU");
    kfx_publish(p1, 1, 0, 8, NULL);
    char *q = kfx_query_json("m", 1, 8);
    kfx_until_query(&d, "/query", q, "\"scores\":{\"1\":{\"0\":32,\"1\":32}}", pubs, 2);

    /* rank 0's reset_prefix_cache succeeded, rank 1's did not */
    assert_int_equal(kvidx_pub_publish_cleared(p0, NULL), 0);
    uint64_t seq;
    assert_int_equal(kvidx_pub_flush(p0, &seq), 0);
    kfx_until_query(&d, "/query", q, "\"scores\":{\"1\":{\"1\":32}}", pubs, 2);
    char *b = post_body(&d, "/query", q);
    expect_has("/query after rank 0's clear", b, "\"tree_sizes\":{\"1\":{\"1\":8}}");
    free(b);
    char *qh = dyn_query_by_hash_json("m", 1, 8);
    b = post_body(&d, "/query_by_hash", qh);
    expect_has("/query_by_hash after rank 0's clear", b, "\"scores\":{\"1\":{\"1\":32}}");
    free(b);
    /* the dump holds rank 1's blocks, no block of rank 0 (on any tier) */
    b = get_body(&d, "/dump");
    expect_has("/dump after rank 0's clear", b, "\"dp_rank\":1,\"data\"");
    expect_lacks("/dump after rank 0's clear", b, "\"dp_rank\":0,\"data\"");
    free(b);

    /* rank 0 stores again; then the operator unregisters the instance without dp_rank: every rank goes */
    kfx_publish(p0, 1, 0, 4, NULL);
    kfx_until_query(&d, "/query", q, "\"scores\":{\"1\":{\"0\":16,\"1\":32}}", pubs, 2);
    kfx_expect(&d, "/unregister", "{\"instance_id\":1,\"model_name\":\"m\"}", 200, "{\"status\":\"ok\"}");
    kfx_expect(&d, "/query", q, 404, "{\"error\":\"no indexer for model=m tenant=default\"}");
    free(q);
    free(qh);
    kvidx_pub_destroy(p0);
    kvidx_pub_destroy(p1);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* ---- 2. both dialects see every registration -------------------------------------------------- */

static char *cond_query_json(const char *model, uint32_t c, uint32_t n, const char *lora)
{
    char *dq = kfx_query_json(model, c, n); /* {"model_name":"...","token_ids":[...]} */
    char *s = malloc(strlen(dq) + 256);
    sprintf(s, "{\"model\":\"%s\",\"block_size\":%d,%s%s%s%s", model, KFX_BS, lora ? "\"lora_name\":\"" : "",
            lora ? lora : "", lora ? "\"," : "", strstr(dq, "\"token_ids\""));
    free(dq);
    return s;
}

static void test_conductor_sees_dynamo_workers(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    struct kvidx_pub *p61 = kfx_pub(0), *p62 = kfx_pub(0), *p64a = kfx_pub(0), *p64b = kfx_pub(1);
    struct kvidx_pub *pubs[4] = {p61, p62, p64a, p64b};
    dyn_register(&d, 61, 0, "mc", p61);
    dyn_register(&d, 62, 0, "mc", p62);
    dyn_register(&d, 64, 0, "mc", p64a);
    dyn_register(&d, 64, 1, "mc", p64b);
    kfx_publish(p61, 2, 0, 6, NULL);
    kfx_publish(p62, 2, 0, 3, NULL);
    kfx_publish(p64b, 2, 0, 5, NULL);
    char *dq = kfx_query_json("mc", 2, 6);
    kfx_until_query(&d, "/query", dq, "\"scores\":{\"61\":{\"0\":24},\"62\":{\"0\":12},\"64\":{\"1\":20}}", pubs, 4);

    /* the Conductor dialect, with no Conductor registration at all: every instance, every rank, zeros included */
    const char *want =
        "{\"default\":{\"61\":{\"longest_matched\":24,\"GPU\":24,\"DP\":{\"0\":24},\"CPU\":24,\"DISK\":24,"
        "\"rank_matches\":{\"0\":{\"gpu\":24,\"cpu\":24,\"disk\":24}}},"
        "\"62\":{\"longest_matched\":12,\"GPU\":12,\"DP\":{\"0\":12},\"CPU\":12,\"DISK\":12,"
        "\"rank_matches\":{\"0\":{\"gpu\":12,\"cpu\":12,\"disk\":12}}},"
        "\"64\":{\"longest_matched\":20,\"GPU\":20,\"DP\":{\"0\":0,\"1\":20},\"CPU\":20,\"DISK\":20,"
        "\"rank_matches\":{\"0\":{\"gpu\":0,\"cpu\":0,\"disk\":0},\"1\":{\"gpu\":20,\"cpu\":20,\"disk\":20}}}}}\n";
    char *cq = cond_query_json("mc", 2, 6, NULL);
    kfx_expect(&d, "/query", cq, 200, want);
    /* by seq hashes, and under an adapter no registration names (Dynamo events carry the adapter) */
    uint64_t content[6], seq[6];
    for (uint32_t i = 0; i < 6; i++)
        content[i] = kfx_content(2, i);
    kvi_seq_hashes(content, 6, seq);
    char qs[1024];
    size_t o = (size_t)sprintf(qs, "{\"model\":\"mc\",\"block_size\":%d,\"seq_hashes\":[", KFX_BS);
    for (int i = 0; i < 6; i++)
        o += (size_t)sprintf(qs + o, "%s%llu", i ? "," : "", (unsigned long long)seq[i]);
    sprintf(qs + o, "]}");
    kfx_expect(&d, "/query_by_hash", qs, 200, want);
    char *cql = cond_query_json("mc", 2, 6, "some-adapter");
    char *b = post_body(&d, "/query", cql);
    expect_has("/query under an adapter", b, "\"61\":{\"longest_matched\":0,");
    expect_has("/query under an adapter", b, "\"64\":{\"longest_matched\":0,\"GPU\":0,\"DP\":{\"0\":0,\"1\":0}");
    free(b);

    /* a Conductor registration in the same context: one roster with both */
    struct kvidx_pub *pn = kfx_pub(0);
    char j[1024];
    snprintf(j, sizeof j,
             "{\"type\":\"vLLM\",\"modelname\":\"mc\",\"instance_id\":\"node-a\",\"block_size\":%d,\"dp_rank\":0,"
             "\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\"}",
             KFX_BS, kvidx_pub_endpoint(pn), kvidx_pub_replay_endpoint(pn));
    kfx_expect(&d, "/register", j, 200, NULL);
    kfx_publish(pn, 2, 0, 2, NULL);
    struct kvidx_pub *pubs5[5] = {p61, p62, p64a, p64b, pn};
    kfx_until_query(&d, "/query", cq, "\"node-a\":{\"longest_matched\":8,", pubs5, 5);
    b = post_body(&d, "/query", cq);
    expect_has("/query with both dialects", b, "{\"default\":{\"61\":{\"longest_matched\":24,");
    expect_has("/query with both dialects", b, "\"64\":{\"longest_matched\":20,");
    free(b);
    /* the reverse: a Dynamo query lists the Conductor instance (keep it so) */
    b = post_body(&d, "/query", dq);
    expect_has("Dynamo /query with both dialects", b, "\"61\":{\"0\":24}");
    expect_has("Dynamo /query with both dialects", b, "\"node-a\":{\"0\":8}");
    free(b);

    /* /services and /global_view list the Dynamo instances with the documented defaults */
    b = get_body(&d, "/services");
    expect_has("/services", b, "{\"count\":5,");
    expect_has("/services", b, "\"InstanceID\":\"64\"");
    expect_has("/services", b, "\"InstanceID\":\"node-a\"");
    expect_has("/services", b, kvidx_pub_endpoint(p64b));
    free(b);
    b = get_body(&d, "/global_view");
    expect_has("/global_view", b, "\"context_count\":1");
    expect_has("/global_view", b, "\"instances\":{\"node-a\":[0],\"61\":[0],\"62\":[0],\"64\":[0,1]}");
    free(b);

    /* an unregistered Dynamo instance leaves the Conductor roster */
    kfx_expect(&d, "/unregister", "{\"instance_id\":62,\"model_name\":\"mc\"}", 200, "{\"status\":\"ok\"}");
    b = post_body(&d, "/query", cq);
    expect_lacks("/query after unregistering 62", b, "\"62\"");
    expect_has("/query after unregistering 62", b, "\"61\":{\"longest_matched\":24,");
    free(b);
    free(dq);
    free(cq);
    free(cql);
    for (int i = 0; i < 5; i++)
        kvidx_pub_destroy(pubs5[i]);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

/* ---- 3. a Mooncake store event whose parent lives on another backend ------------------------------ */

/* One RFC 1527 stored event (map), as a Mooncake master sends it. */
static void mc_stored(msgpack_packer *pk, const uint64_t *seq, uint32_t n, uint32_t base, const uint64_t *parent,
                      const char *backend, const char *medium)
{
    msgpack_pack_map(pk, 6);
    msgpack_pack_str_with_body(pk, "event_type", 10);
    msgpack_pack_str_with_body(pk, "stored", 6);
    msgpack_pack_str_with_body(pk, "seq_hashes", 10);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, seq[i]);
    msgpack_pack_str_with_body(pk, "base_block_idx", 14);
    msgpack_pack_uint32(pk, base);
    msgpack_pack_str_with_body(pk, "parent_hash", 11);
    if (parent != NULL)
        msgpack_pack_uint64(pk, *parent);
    else
        msgpack_pack_nil(pk);
    msgpack_pack_str_with_body(pk, "backend_id", 10);
    msgpack_pack_str_with_body(pk, backend, strlen(backend));
    msgpack_pack_str_with_body(pk, "medium", 6);
    msgpack_pack_str_with_body(pk, medium, strlen(medium));
}

/* Send node-1's and node-2's events as one batch with sequence number seq
 * (frames: empty topic, big-endian seq, msgpack [ts, [events], rank]). */
static void mc_send(struct kvidx_pub *p, const uint64_t *s, uint64_t seq)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_array(&pk, 2);
    mc_stored(&pk, s, 7, 0, NULL, "node-1", "cpu");
    mc_stored(&pk, s + 7, 2, 7, &s[6], "node-2", "disk");
    msgpack_pack_uint32(&pk, 0);
    uint8_t be[8];
    for (int i = 0; i < 8; i++)
        be[i] = (uint8_t)(seq >> (56 - 8 * i));
    const void *frames[3] = {NULL, be, sb.data};
    size_t sizes[3] = {0, 8, sb.size};
    assert_int_equal(kvidx_pub_send_raw(p, frames, sizes, 3), 0);
    msgpack_sbuffer_destroy(&sb);
}

static void test_mooncake_parent_on_other_backend(void **state)
{
    (void)state;
    struct kfx_daemon d;
    kfx_start(&d, NULL, NULL);
    /* the store master (its PUB only: these events are sent raw) and one vLLM engine of the context */
    struct kvidx_pub *pm = kfx_pub(0), *pe = kfx_pub(0);
    char j[1024];
    snprintf(j, sizeof j,
             "{\"type\":\"Mooncake\",\"modelname\":\"mc\",\"block_size\":%d,\"dp_rank\":0,\"endpoint\":\"%s\"}", KFX_BS,
             kvidx_pub_endpoint(pm));
    kfx_expect(&d, "/register", j, 200, NULL);
    snprintf(j, sizeof j,
             "{\"type\":\"vLLM\",\"modelname\":\"mc\",\"instance_id\":\"node-a\",\"block_size\":%d,\"dp_rank\":0,"
             "\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\"}",
             KFX_BS, kvidx_pub_endpoint(pe), kvidx_pub_replay_endpoint(pe));
    kfx_expect(&d, "/register", j, 200, NULL);

    /* blocks 0..6 on node-1's cpu, 7..8 on node-2's disk below node-1's block 6; no token_ids */
    uint64_t content[9], s[9];
    for (uint32_t i = 0; i < 9; i++)
        content[i] = kfx_content(3, i);
    kvi_seq_hashes(content, 9, s);
    char *cq = cond_query_json("mc", 3, 9, NULL);
    /* PUB/SUB slow joiner: send until the answer is whole (the stores are
     * idempotent; the two backends' runs may be applied by two writers) */
    const char *want = "{\"default\":{\"node-a\":{\"longest_matched\":36,\"GPU\":0,\"DP\":{\"0\":0},\"CPU\":28,"
                       "\"DISK\":36,\"rank_matches\":{\"0\":{\"gpu\":0,\"cpu\":28,\"disk\":36}}}}}\n";
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    uint64_t seq = 0;
    char *b = NULL;
    for (;;) {
        mc_send(pm, s, seq++);
        kfx_nap(20);
        free(b);
        b = post_body(&d, "/query", cq);
        if (strcmp(b, want) == 0 || kfx_now_ms() > end)
            break;
    }
    if (strcmp(b, want) != 0)
        fail_msg("/query over the pool: %s, want %s", b, want);
    free(b);
    /* nothing was rejected for an unknown parent, and the placement is counted */
    assert_int_equal(kfx_metric(&d, "kvidx_listener_ops_parent_not_found_total"), 0);
    b = get_body(&d, "/metrics");
    expect_has("/metrics", b, "kvidx_index_parent_elsewhere_total{model=\"mc\",tenant=\"default\"} ");
    expect_lacks("/metrics", b, "kvidx_index_parent_elsewhere_total{model=\"mc\",tenant=\"default\"} 0\n");
    free(b);
    free(cq);
    kvidx_pub_destroy(pm);
    kvidx_pub_destroy(pe);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_clear_drops_one_rank, teardown),
        cmocka_unit_test_teardown(test_conductor_sees_dynamo_workers, teardown),
        cmocka_unit_test_teardown(test_mooncake_parent_on_other_backend, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
