/* ctest-labels: integration tsan */
/*
 * POST /route on the indexer port against the real binary: engines publish
 * KV events (the index's overlaps), a router registers the same workers on
 * the slot port (the loads), and /route must rank them with
 * overlap_weight x prefill_blocks + decode_weight x decode_blocks:
 * cache overlap against load, per-request weights, ties by smaller tree
 * size, the three prompt forms (tokens, block hashes, sequence hashes),
 * msgpack, commit (the /add recorded for the best rank, duplicates 409), the
 * atomicity of concurrent commits, and the error statuses.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <msgpack.h>
#include <pthread.h>

#include "kvidxd_fixture.h"

#define OK "{\"status\":\"ok\"}"

#if defined(__SANITIZE_THREAD__)
/* The publishers' libzmq is not built with TSan (as kvidxd.c says for the daemon). */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so\n";
}
#endif

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
    kfx_expect(d, "/register", j, 201, OK);
}

static void slot_reg(struct kfx_daemon *sv, uint64_t w, const char *model, uint32_t bs, uint32_t size)
{
    char j[256];
    snprintf(j, sizeof j, "{\"worker_id\":%llu,\"model_name\":\"%s\",\"block_size\":%u,\"dp_start\":0,\"dp_size\":%u}",
             (unsigned long long)w, model, bs, size);
    kfx_expect(sv, "/register", j, 201, OK);
}

/* {"model_name":model,"token_ids":[n blocks of chain c]<extra>} */
static char *route_tokens(const char *model, uint32_t c, uint32_t n, const char *extra)
{
    char *q = kfx_query_json(model, c, n); /* {"model_name":"m","token_ids":[...]} */
    size_t len = strlen(q);
    char *s = malloc(len + strlen(extra) + 1);
    memcpy(s, q, len - 1);
    strcpy(s + len - 1, extra);
    strcat(s, "}");
    free(q);
    return s;
}

/* POST /route; the chosen (worker_id, dp_rank) from the top-level keys. @return the status. */
static long route(struct kfx_daemon *d, const char *json, uint64_t *w, uint32_t *r, struct kfx_resp *resp)
{
    long st = kfx_post_json(d, "/route", json, resp);
    if (st == 200) {
        const char *cands = strstr(resp->body, "\"candidates\":");
        const char *wk = strstr(resp->body, "\"worker_id\":");
        const char *rk = strstr(resp->body, "\"dp_rank\":");
        assert_non_null(cands);
        assert_true(wk != NULL && wk < cands && rk != NULL && rk < cands);
        *w = strtoull(wk + 12, NULL, 10);
        *r = (uint32_t)strtoul(rk + 10, NULL, 10);
    }
    return st;
}

static void expect_choice(struct kfx_daemon *d, const char *json, uint64_t want_w, uint32_t want_r)
{
    struct kfx_resp resp;
    uint64_t w = 0;
    uint32_t r = 0;
    long st = route(d, json, &w, &r, &resp);
    if (st != 200 || w != want_w || r != want_r)
        fail_msg("/route %s: %ld, chose (%llu,%u), want (%llu,%u): %s", json, st, (unsigned long long)w, r,
                 (unsigned long long)want_w, want_r, resp.body);
    kfx_resp_free(&resp);
}

/* The index side: instance 1 rank 0 holds chain 0 (8 blocks), instance 2 rank 0 chain 5 (2 blocks). */
static void setup_index(struct kfx_daemon *d, struct kvidx_pub **p1, struct kvidx_pub **p2)
{
    *p1 = kfx_pub(0);
    *p2 = kfx_pub(0);
    struct kvidx_pub *pubs[2] = {*p1, *p2};
    dyn_register(d, 1, "m", *p1);
    dyn_register(d, 2, "m", *p2);
    kfx_publish(*p1, 0, 0, 8, NULL);
    kfx_publish(*p2, 5, 0, 2, NULL);
    char *q0 = kfx_query_json("m", 0, 8), *q5 = kfx_query_json("m", 5, 2);
    kfx_until_query(d, "/query", q0, "\"scores\":{\"1\":{\"0\":32}}", pubs, 2);
    kfx_until_query(d, "/query", q5, "\"scores\":{\"2\":{\"0\":8}}", pubs, 2);
    free(q0);
    free(q5);
}

static void test_overlap_load_weights_ties(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, NULL);
    struct kvidx_pub *p1, *p2;
    setup_index(&d, &p1, &p2);
    slot_reg(&sv, 1, "m", KFX_BS, 2);
    slot_reg(&sv, 2, "m", KFX_BS, 1);

    /* idle workers: the cached one wins; exact answer */
    char *q = route_tokens("m", 0, 8, "");
    kfx_expect(&d, "/route", q, 200,
               "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"block_size\":4,\"blocks\":8,\"new_isl_tokens\":32,"
               "\"overlap_weight\":1.0,\"decode_weight\":1.0,\"worker_id\":1,\"dp_rank\":0,\"committed\":false,"
               "\"candidates\":["
               "{\"worker_id\":1,\"dp_rank\":0,\"overlap_blocks\":8,\"tree_size\":8,\"new_prefill_tokens\":0,"
               "\"potential_prefill_tokens\":0,\"prefill_blocks\":0.0,\"potential_decode_blocks\":8,"
               "\"active_requests\":0,\"cost\":8.0},"
               "{\"worker_id\":1,\"dp_rank\":1,\"overlap_blocks\":0,\"tree_size\":0,\"new_prefill_tokens\":32,"
               "\"potential_prefill_tokens\":32,\"prefill_blocks\":8.0,\"potential_decode_blocks\":8,"
               "\"active_requests\":0,\"cost\":16.0},"
               "{\"worker_id\":2,\"dp_rank\":0,\"overlap_blocks\":0,\"tree_size\":2,\"new_prefill_tokens\":32,"
               "\"potential_prefill_tokens\":32,\"prefill_blocks\":8.0,\"potential_decode_blocks\":8,"
               "\"active_requests\":0,\"cost\":16.0}]}");
    /* ties: an uncached prompt costs the same everywhere; the smaller tree wins, (2,0) before (1,0) */
    char *cold = route_tokens("m", 9, 8, "");
    struct kfx_resp resp;
    uint64_t w;
    uint32_t r;
    assert_int_equal(route(&d, cold, &w, &r, &resp), 200);
    const char *c11 = strstr(resp.body, "{\"worker_id\":1,\"dp_rank\":1,");
    const char *c20 = strstr(resp.body, "{\"worker_id\":2,\"dp_rank\":0,");
    const char *c10 = strstr(resp.body, "{\"worker_id\":1,\"dp_rank\":0,");
    assert_true(c11 != NULL && c20 != NULL && c10 != NULL && c11 < c20 && c20 < c10);
    kfx_resp_free(&resp);

    /* load the cached rank: 24 active blocks make it the worse choice ... */
    char j[1024];
    size_t o = (size_t)snprintf(j, sizeof j,
                                "{\"model_name\":\"m\",\"request_id\":\"busy\",\"worker_id\":1,\"dp_rank\":0,"
                                "\"sequence_hashes\":[");
    for (int i = 0; i < 24; i++)
        o += (size_t)snprintf(j + o, sizeof j - o, "%s%d", i ? "," : "", 1000 + i);
    snprintf(j + o, sizeof j - o, "]}");
    kfx_expect(&sv, "/add", j, 201, OK);
    expect_choice(&d, q, 1, 1); /* (1,0): 0 + 32; (1,1) and (2,0): 8 + 8, tree 0 < 2 */
    /* ... unless the request weighs the prefill more, or ignores the decode load */
    char *q4 = route_tokens("m", 0, 8, ",\"overlap_weight\":4");
    expect_choice(&d, q4, 1, 0); /* 32 against 40 */
    char *q3 = route_tokens("m", 0, 8, ",\"overlap_weight\":2.5,\"decode_weight\":1");
    expect_choice(&d, q3, 1, 1); /* 32 against 20 + 8: still (1,1) (they break even at 3) */
    char *qd = route_tokens("m", 0, 8, ",\"decode_weight\":0");
    expect_choice(&d, qd, 1, 0);
    /* prefill load counts too: a long prefill on (1,1) moves the choice to (2,0) */
    kfx_expect(&sv, "/add",
               "{\"model_name\":\"m\",\"request_id\":\"pf\",\"worker_id\":1,\"dp_rank\":1,\"sequence_hashes\":[],"
               "\"new_isl_tokens\":400}",
               201, OK);
    expect_choice(&d, q, 2, 0);
    kfx_expect(&sv, "/prefill_complete", "{\"model_name\":\"m\",\"request_id\":\"pf\"}", 200, OK);
    expect_choice(&d, q, 1, 1);
    kfx_expect(&sv, "/free", "{\"model_name\":\"m\",\"request_id\":\"busy\"}", 200, OK);
    expect_choice(&d, q, 1, 0);
    /* a new_isl_tokens given by the caller replaces the prompt length */
    char *qi = route_tokens("m", 0, 8, ",\"new_isl_tokens\":100");
    assert_int_equal(route(&d, qi, &w, &r, &resp), 200);
    assert_non_null(strstr(resp.body, "\"new_isl_tokens\":100,"));
    assert_non_null(strstr(resp.body, "{\"worker_id\":1,\"dp_rank\":0,\"overlap_blocks\":8,\"tree_size\":8,"
                                      "\"new_prefill_tokens\":68,"));
    kfx_resp_free(&resp);
    free(q);
    free(cold);
    free(q4);
    free(q3);
    free(qd);
    free(qi);

    /* the three prompt forms agree */
    o = (size_t)snprintf(j, sizeof j, "{\"model_name\":\"m\",\"block_hashes\":[");
    uint64_t content[8], seq[8];
    for (uint32_t i = 0; i < 8; i++) {
        content[i] = kfx_content(0, i);
        o += (size_t)snprintf(j + o, sizeof j - o, "%s%lld", i ? "," : "", (long long)content[i]);
    }
    snprintf(j + o, sizeof j - o, "]}");
    assert_int_equal(route(&d, j, &w, &r, &resp), 200);
    assert_true(w == 1 && r == 0);
    assert_non_null(strstr(resp.body, "\"overlap_blocks\":8,\"tree_size\":8,"));
    kfx_resp_free(&resp);
    kvi_seq_hashes(content, 8, seq);
    o = (size_t)snprintf(j, sizeof j, "{\"model_name\":\"m\",\"sequence_hashes\":[");
    for (uint32_t i = 0; i < 8; i++)
        o += (size_t)snprintf(j + o, sizeof j - o, "%s%lld", i ? "," : "", (long long)seq[i]);
    snprintf(j + o, sizeof j - o, "]}");
    assert_int_equal(route(&d, j, &w, &r, &resp), 200);
    assert_true(w == 1 && r == 0);
    assert_non_null(strstr(resp.body, "\"overlap_blocks\":8,\"tree_size\":8,"));
    kfx_resp_free(&resp);

    /* msgpack in, msgpack out (and Accept: msgpack with a JSON body) */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "model_name", 10);
    msgpack_pack_str_with_body(&pk, "m", 1);
    msgpack_pack_str_with_body(&pk, "token_ids", 9);
    uint32_t tok[8 * KFX_BS];
    kfx_tokens(0, 0, 8, tok);
    msgpack_pack_bin_with_body(&pk, tok, sizeof tok); /* x86: already little-endian */
    msgpack_pack_str_with_body(&pk, "overlap_weight", 14);
    msgpack_pack_double(&pk, 0.5);
    const char *hm[] = {"Content-Type: application/msgpack", NULL};
    for (int proto = KFX_H1; proto <= KFX_H2C; proto++) {
        assert_int_equal(kfx_http(&d, proto, "POST", "/route", hm, sb.data, sb.size, &resp), 200);
        assert_string_equal(resp.ctype, "application/msgpack");
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        assert_int_equal(msgpack_unpack_next(&u, resp.body, resp.len, &off), MSGPACK_UNPACK_SUCCESS);
        bool seen = false;
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.via.str.size == 14 && memcmp(kv->key.via.str.ptr, "overlap_weight", 14) == 0)
                assert_true(kv->val.type == MSGPACK_OBJECT_FLOAT64 && kv->val.via.f64 == 0.5);
            if (kv->key.via.str.size == 9 && memcmp(kv->key.via.str.ptr, "worker_id", 9) == 0) {
                assert_int_equal(kv->val.via.u64, 1);
                seen = true;
            }
        }
        assert_true(seen);
        msgpack_unpacked_destroy(&u);
        kfx_resp_free(&resp);
    }
    msgpack_sbuffer_destroy(&sb);
    kvidx_pub_destroy(p1);
    kvidx_pub_destroy(p2);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

static void test_commit_and_errors(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, NULL);
    struct kvidx_pub *p1, *p2;
    setup_index(&d, &p1, &p2);
    slot_reg(&sv, 1, "m", KFX_BS, 2);
    slot_reg(&sv, 2, "m", KFX_BS, 1);
    /* 10 blocks of chain 0: 8 cached on (1,0), so 8 tokens to prefill there */
    char *c1 = route_tokens("m", 0, 10, ",\"commit\":true,\"request_id\":\"c1\"");
    struct kfx_resp resp;
    uint64_t w;
    uint32_t r;
    assert_int_equal(route(&d, c1, &w, &r, &resp), 200);
    assert_true(w == 1 && r == 0);
    assert_non_null(strstr(resp.body, "\"committed\":true,\"request_id\":\"c1\",\"candidates\":[{\"worker_id\":1,"
                                      "\"dp_rank\":0,\"overlap_blocks\":8,\"tree_size\":8,\"new_prefill_tokens\":8,"));
    kfx_resp_free(&resp);
    kfx_expect_get(&sv, "/loads", 200,
                   "[{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":8,\"active_decode_blocks\":10},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":1,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0},"
                   "{\"model_name\":\"m\",\"tenant_id\":\"default\",\"worker_id\":2,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":0,\"active_decode_blocks\":0}]");
    /* the recorded request is an ordinary one: duplicate 409, prefill_complete and free work */
    kfx_expect(&d, "/route", c1, 409,
               "{\"error\":\"Request c1 already exists (assigned to worker WorkerWithDpRank { worker_id: 1, "
               "dp_rank: 0 })\"}");
    /* its blocks are now active on (1,0): the same prompt adds no decode blocks there */
    char *again = route_tokens("m", 0, 10, "");
    assert_int_equal(route(&d, again, &w, &r, &resp), 200);
    assert_non_null(strstr(resp.body, "{\"worker_id\":1,\"dp_rank\":0,\"overlap_blocks\":8,\"tree_size\":8,"
                                      "\"new_prefill_tokens\":8,\"potential_prefill_tokens\":16,"
                                      "\"prefill_blocks\":4.0,\"potential_decode_blocks\":10,\"active_requests\":1,"));
    kfx_resp_free(&resp);
    kfx_expect(&sv, "/prefill_complete", "{\"model_name\":\"m\",\"request_id\":\"c1\"}", 200, OK);
    kfx_expect(&sv, "/free", "{\"model_name\":\"m\",\"request_id\":\"c1\"}", 200, OK);
    assert_true(kfx_get_has(&sv, "/metrics", 200, "\nkvidx_slots_route_commits_total 1\n"));

    /* errors */
    kfx_expect(&d, "/route", "{\"model_name\":\"zz\",\"token_ids\":[1]}", 404,
               "{\"error\":\"no slot tracker for model=zz tenant=default\"}");
    struct kvidx_pub *p3 = kfx_pub(0);
    dyn_register(&d, 3, "m2", p3); /* index block size 4 */
    slot_reg(&sv, 3, "m2", 8, 1);
    kfx_expect(&d, "/route", "{\"model_name\":\"m2\",\"token_ids\":[1]}", 409,
               "{\"error\":\"block_size mismatch for model=m2 tenant=default: index=4, slot tracker=8\"}");
    kfx_expect(&d, "/route", "{\"model_name\":\"m\"}", 422, NULL);
    kfx_expect(&d, "/route", "{\"model_name\":\"m\",\"token_ids\":[1],\"commit\":true}", 422, NULL);
    kfx_expect(&d, "/route", "{\"model_name\":\"m\",\"token_ids\":[1],\"overlap_weight\":-1}", 422, NULL);
    kfx_expect(&d, "/route", "{\"model_name\":", 400, NULL);
    const char *txt[] = {"Content-Type: text/plain", NULL};
    assert_int_equal(kfx_http(&d, KFX_H1, "POST", "/route", txt, "{}", 2, &resp), 415);
    kfx_resp_free(&resp);
    assert_int_equal(kfx_get(&d, "/route", &resp), 405);
    kfx_resp_free(&resp);
    /* a tracker without an index namespace: overlaps are 0, loads still rank */
    slot_reg(&sv, 4, "solo", 4, 1);
    expect_choice(&d, "{\"model_name\":\"solo\",\"sequence_hashes\":[1,2]}", 4, 0);
    free(c1);
    free(again);
    kvidx_pub_destroy(p1);
    kvidx_pub_destroy(p2);
    kvidx_pub_destroy(p3);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

struct commit_arg {
    struct kfx_daemon *d;
    int i;
    long status;
};

static void *commit_thread(void *p)
{
    struct commit_arg *a = p;
    char j[256];
    snprintf(j, sizeof j,
             "{\"model_name\":\"n\",\"sequence_hashes\":[%d,%d],\"new_isl_tokens\":8,\"commit\":true,"
             "\"request_id\":\"k%d\"}",
             a->i * 100 + 1, a->i * 100 + 2, a->i);
    struct kfx_resp r;
    a->status = kfx_post_json(a->d, "/route", j, &r);
    kfx_resp_free(&r);
    return NULL;
}

static void test_concurrent_commits_are_atomic(void **state)
{
    (void)state;
    struct kfx_daemon d, sv;
    kfx_start_slots(&d, &sv, NULL, NULL);
    slot_reg(&sv, 1, "n", 4, 1);
    slot_reg(&sv, 2, "n", 4, 1);
    /* every commit sees the ones before it: the least-loaded rank alternates, 10 and 10 */
    enum { N = 20 };
    pthread_t th[N];
    struct commit_arg args[N];
    for (int i = 0; i < N; i++) {
        args[i] = (struct commit_arg){&d, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, commit_thread, &args[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].status, 200);
    }
    kfx_expect_get(&sv, "/loads", 200,
                   "[{\"model_name\":\"n\",\"tenant_id\":\"default\",\"worker_id\":1,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":80,\"active_decode_blocks\":20},"
                   "{\"model_name\":\"n\",\"tenant_id\":\"default\",\"worker_id\":2,\"dp_rank\":0,"
                   "\"active_prefill_tokens\":80,\"active_decode_blocks\":20}]");
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_overlap_load_weights_ties, teardown),
        cmocka_unit_test_teardown(test_commit_and_errors, teardown),
        cmocka_unit_test_teardown(test_concurrent_commits_are_atomic, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
