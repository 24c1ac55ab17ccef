/* ctest-labels: unit -- bench/trace_load.c, trace_workload.c: parsing, expansion, generator, timelines */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/trace.h"
#include "bench/trace_map.h"
#include "engine/hash.h"

static int parse(struct kvi_trace *t, const char *line)
{
    char err[128];
    return kvi_trace_parse_line(t, line, strlen(line), err, sizeof err);
}

static void ids_equal(const struct kvi_trace *t, size_t r, const uint64_t *want, size_t n)
{
    assert_int_equal(t->req[r].n_ids, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(t->ids[t->req[r].ids_off + i], want[i]);
}

static void test_parse_lines(void **state)
{
    (void)state;
    struct kvi_trace t;
    kvi_trace_init(&t);
    assert_int_equal(parse(&t, "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, "
                               "\"hash_ids\": [0, 1, 2]}"),
                     0);
    /* aliases, unknown keys of every JSON kind, string session id */
    assert_int_equal(parse(&t, " {\"created_time\": 12.6, \"extra\": {\"a\": [1, {\"b\": \"x\\\"y\"}], \"c\": null},"
                               " \"input_tokens\": 100, \"output_tokens\": 7, \"flag\": true, \"session_id\": \"s-1\","
                               " \"hash_ids\": [5, 6]} "),
                     0);
    /* input_length defaults to ids x 512; numeric session id */
    assert_int_equal(parse(&t, "{\"hash_ids\":[7],\"output_length\":1,\"session_id\":3,\"timestamp\":20}"), 0);
    assert_int_equal(parse(&t, "   "), 1);
    assert_int_equal(t.n_req, 3);
    static const uint64_t a[] = {0, 1, 2}, b[] = {5, 6}, c[] = {7};
    ids_equal(&t, 0, a, 3);
    ids_equal(&t, 1, b, 2);
    ids_equal(&t, 2, c, 1);
    assert_int_equal(t.req[0].t_ms, 0);
    assert_int_equal(t.req[0].input_len, 6758);
    assert_int_equal(t.req[0].output_len, 500);
    assert_int_equal(t.req[1].t_ms, 13);
    assert_int_equal(t.req[1].input_len, 100);
    assert_int_equal(t.req[1].output_len, 7);
    assert_int_equal(t.req[2].input_len, 512);
    assert_int_equal(t.max_id, 7);
    assert_true(t.has_sessions);
    assert_true(t.req[1].session != t.req[2].session);
    /* rejected lines leave the trace unchanged */
    static const char *const bad[] = {
        "{\"timestamp\": 0, \"output_length\": 5}",                  /* no hash_ids */
        "{\"timestamp\": 0, \"hash_ids\": [1]}",                      /* no output_length */
        "{\"hash_ids\": [1, -2], \"output_length\": 1}",              /* negative id */
        "{\"hash_ids\": [1], \"output_length\": 1} x",                /* trailing garbage */
        "{\"hash_ids\": [1], \"output_length\": 1",                   /* unterminated */
        "[1, 2]",                                                     /* not an object */
        "{\"hash_ids\": [9], \"hash_ids\": [9], \"output_length\": 1}", /* twice */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse(&t, bad[i]), -EINVAL);
        assert_int_equal(t.n_req, 3);
        assert_int_equal(t.n_ids, 6);
        assert_int_equal(t.max_id, 7);
    }
    kvi_trace_free(&t);
}

static void test_sha256(void **state)
{
    (void)state;
    char h[65];
    kvi_sha256_hex("", 0, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    kvi_sha256_hex("abc", 3, h);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: two padding blocks */
    kvi_sha256_hex(m, strlen(m), h);
    assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *mil = malloc(1000000);
    memset(mil, 'a', 1000000);
    kvi_sha256_hex(mil, 1000000, h);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(mil);
}

static void test_load_file(void **state)
{
    (void)state;
    char path[] = "/tmp/kvidx-trace-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *body = "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [0, 1]}\n"
                       "\n"
                       "{\"timestamp\": 3000, \"input_length\": 600, \"output_length\": 9, \"hash_ids\": [0, 2]}\n";
    assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
    close(fd);
    struct kvi_trace t;
    kvi_trace_init(&t);
    char err[256];
    assert_int_equal(kvi_trace_load(&t, path, err, sizeof err), 0);
    assert_int_equal(t.n_req, 2);
    char want[65];
    kvi_sha256_hex(body, strlen(body), want);
    assert_string_equal(t.sha256, want);
    assert_non_null(strstr(path, t.name));
    kvi_trace_free(&t);
    /* a bad line is reported with its number */
    FILE *f = fopen(path, "w");
    fputs("{\"hash_ids\": [1], \"output_length\": 1}\n{\"hash_ids\": [1]}\n", f);
    fclose(f);
    kvi_trace_init(&t);
    assert_int_equal(kvi_trace_load(&t, path, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, ":2:"));
    kvi_trace_free(&t);
    unlink(path);
    kvi_trace_init(&t);
    assert_int_equal(kvi_trace_load(&t, "/nonexistent/trace.jsonl", err, sizeof err), -ENOENT);
    kvi_trace_free(&t);
}

/* The reference benchmark's self-test (performance-anchors.md §2.5). */
static void test_expand(void **state)
{
    (void)state;
    struct kvi_trace t, x;
    kvi_trace_init(&t);
    kvi_trace_init(&x);
    assert_int_equal(parse(&t, "{\"timestamp\":0,\"input_length\":6,\"output_length\":1,\"hash_ids\":[0,1,2]}"), 0);
    assert_int_equal(parse(&t, "{\"timestamp\":1,\"input_length\":8,\"output_length\":1,\"hash_ids\":[0,1,3,4]}"), 0);
    kvi_trace_expand(&t, 2, 2, &x);
    assert_int_equal(x.n_req, 4);
    static const uint64_t r0[] = {0, 1, 2, 3, 4, 5}, r1[] = {10, 11, 12, 13, 14, 15},
                          r2[] = {0, 1, 2, 3, 6, 7, 8, 9}, r3[] = {10, 11, 12, 13, 16, 17, 18, 19};
    ids_equal(&x, 0, r0, 6);
    ids_equal(&x, 1, r1, 6);
    ids_equal(&x, 2, r2, 8);
    ids_equal(&x, 3, r3, 8);
    assert_int_equal(x.req[0].input_len, 12);
    assert_int_equal(x.req[3].input_len, 16);
    assert_int_equal(x.req[1].t_ms, 0);
    assert_int_equal(x.req[2].t_ms, 1);
    assert_true(x.req[0].session != x.req[1].session); /* copies never share a session */
    assert_int_equal(x.max_id, 19);
    kvi_trace_free(&t);
    kvi_trace_free(&x);
}

static void test_stats(void **state)
{
    (void)state;
    struct kvi_trace t;
    kvi_trace_init(&t);
    assert_int_equal(parse(&t, "{\"timestamp\":0,\"input_length\":1500,\"output_length\":10,\"hash_ids\":[0,1,2]}"), 0);
    assert_int_equal(parse(&t, "{\"timestamp\":500,\"input_length\":1100,\"output_length\":30,\"hash_ids\":[0,1,3]}"), 0);
    struct kvi_trace_stats s;
    kvi_trace_stats(&t, &s);
    assert_int_equal(s.requests, 2);
    assert_int_equal(s.span_ms, 500);
    assert_int_equal(s.total_ids, 6);
    assert_int_equal(s.unique_ids, 4);
    assert_true(s.reuse > 0.333 && s.reuse < 0.334);
    assert_int_equal(s.max_input, 1500);
    assert_true(s.avg_output > 19.9 && s.avg_output < 20.1);
    kvi_trace_free(&t);
}

/* The generator: deterministic, conversation-like, and a valid trace (new ids
 * consecutive, each id always after the same predecessor). */
static void test_synthetic(void **state)
{
    (void)state;
    struct kvi_trace_synth_cfg c;
    kvi_trace_synth_defaults(&c);
    c.requests = 3000;
    struct kvi_trace a, b;
    kvi_trace_init(&a);
    kvi_trace_init(&b);
    kvi_trace_synthesize(&a, &c);
    kvi_trace_synthesize(&b, &c);
    assert_int_equal(a.n_req, 3000);
    assert_int_equal(a.n_ids, b.n_ids);
    assert_memory_equal(a.ids, b.ids, a.n_ids * sizeof *a.ids);
    struct kvi_u64map pred;
    kvi_u64map_init(&pred);
    uint64_t next_new = 0;
    for (size_t i = 0; i < a.n_req; i++) {
        const struct kvi_trace_request *r = &a.req[i];
        if (i)
            assert_true(r->t_ms >= a.req[i - 1].t_ms);
        assert_int_equal(r->n_ids, (r->input_len + 511) / 512);
        assert_int_equal(a.ids[r->ids_off], 0);
        for (uint32_t k = 0; k < r->n_ids; k++) {
            uint64_t id = a.ids[r->ids_off + k], p = k ? a.ids[r->ids_off + k - 1] + 1 : 0, old;
            if (kvi_u64map_get(&pred, id, &old)) {
                assert_int_equal(old, p);
            } else {
                assert_int_equal(id, next_new); /* first appearances are consecutive */
                next_new++;
                kvi_u64map_put(&pred, id, p);
            }
        }
    }
    kvi_u64map_free(&pred);
    struct kvi_trace_stats s;
    kvi_trace_stats(&a, &s);
    assert_true(s.reuse > 0.25 && s.reuse < 0.55);
    assert_true(s.avg_ids > 14 && s.avg_ids < 40);
    assert_true(s.avg_output > 250 && s.avg_output < 450);
    kvi_trace_free(&a);
    kvi_trace_free(&b);
}

static void small_trace(struct kvi_trace *t, size_t n, uint64_t seed)
{
    struct kvi_trace_synth_cfg c;
    kvi_trace_synth_defaults(&c);
    c.requests = n;
    c.span_s = 600;
    c.seed = seed;
    kvi_trace_init(t);
    kvi_trace_synthesize(t, &c);
}

struct held {
    struct kvi_u64map eh_parent; /* held engine hash -> parent engine hash + 1 (0: root) */
};

/* The timeline: time order; queries at arrivals with the request's prompt
 * blocks; each worker's events form a valid engine stream (parents held,
 * removes of held leaves only); content hashes match the tokens. */
static void test_workload_timeline(void **state)
{
    (void)state;
    struct kvi_trace t;
    small_trace(&t, 400, 3);
    struct kvi_trace_workload_cfg c;
    kvi_trace_workload_defaults(&c);
    c.n_workers = 8;
    c.gpu_blocks = 512;
    struct kvi_trace_workload w;
    assert_int_equal(kvi_trace_workload_build(&w, &t, &c, NULL, NULL), 0);
    assert_true(w.st.removes > 0);
    assert_true(w.st.stores > 0);
    assert_int_equal(w.n, w.st.queries + w.st.stores + w.st.removes);
    struct held *h = calloc(c.n_workers, sizeof *h);
    uint32_t *tok = malloc(c.block_size * sizeof *tok);
    uint64_t queries = 0, qblocks = 0;
    for (size_t i = 0; i < w.n; i++) {
        const struct kvi_trace_entry *e = &w.e[i];
        if (i)
            assert_true(e->t_ns >= w.e[i - 1].t_ns);
        assert_true(e->worker < c.n_workers);
        struct kvi_u64map *m = &h[e->worker].eh_parent;
        if (e->kind == KVI_TRACE_QUERY) {
            queries++;
            qblocks += e->n;
            assert_int_equal(e->worker, w.worker_of_req[e->req]);
            assert_int_equal(e->n, w.req_blocks[e->req]);
            assert_int_equal(e->n, t.req[e->req].input_len / c.block_size);
            kvi_trace_block_tokens(&w, e->req, e->n - 1, tok);
            assert_int_equal(kvi_hash_block(tok, c.block_size, KVI_HASH_SEED), e->content[e->n - 1]);
        } else if (e->kind == KVI_TRACE_STORE) {
            if (e->has_parent)
                assert_true(kvi_u64map_get(m, e->parent, NULL));
            else
                assert_int_equal(e->pos, 0);
            for (uint32_t k = 0; k < e->n; k++) {
                kvi_trace_block_tokens(&w, e->req, e->pos + k, tok);
                assert_int_equal(kvi_hash_block(tok, c.block_size, KVI_HASH_SEED), e->content[k]);
                uint64_t parent = k ? e->engine_hash[k - 1] + 1 : e->has_parent ? e->parent + 1 : 0;
                assert_true(kvi_u64map_put(m, e->engine_hash[k], parent)); /* never stored twice */
            }
        } else {
            for (uint32_t k = 0; k < e->n; k++) {
                assert_true(kvi_u64map_del(m, e->engine_hash[k], NULL));
                /* leaves first: nothing still held names it as parent */
                size_t pos = 0;
                uint64_t key, val;
                while (kvi_u64map_next(m, &pos, &key, &val))
                    assert_true(val != e->engine_hash[k] + 1);
            }
        }
    }
    assert_int_equal(queries, w.st.queries);
    assert_int_equal(qblocks, w.st.query_blocks);
    for (uint32_t k = 0; k < c.n_workers; k++)
        kvi_u64map_free(&h[k].eh_parent);
    free(h);
    free(tok);
    /* a session's requests share a worker; shared ids give shared content */
    for (size_t r = 1; r < t.n_req; r++)
        for (size_t q = 0; q < r; q++)
            if (t.req[q].session == t.req[r].session)
                assert_int_equal(w.worker_of_req[q], w.worker_of_req[r]);
    for (size_t r = 0; r < t.n_req; r++)
        if (w.req_blocks[r] > 0)
            assert_int_equal(w.req_content[r][0], w.req_content[0][0]); /* everyone starts with id 0 */
    kvi_trace_workload_free(&w);
    kvi_trace_free(&t);
}

/* Worker replicas repeat every worker's timeline under ids w + r * N. */
static void test_workload_replicas(void **state)
{
    (void)state;
    struct kvi_trace t;
    small_trace(&t, 150, 5);
    struct kvi_trace_workload_cfg c;
    kvi_trace_workload_defaults(&c);
    c.n_workers = 4;
    c.gpu_blocks = 256;
    struct kvi_trace_workload a, b;
    assert_int_equal(kvi_trace_workload_build(&a, &t, &c, NULL, NULL), 0);
    c.worker_dup = 3;
    assert_int_equal(kvi_trace_workload_build(&b, &t, &c, NULL, NULL), 0);
    assert_int_equal(b.n, 3 * a.n);
    assert_int_equal(b.n_workers_total, 12);
    assert_int_equal(b.st.stored_blocks, 3 * a.st.stored_blocks);
    assert_int_equal(b.st.removed_blocks, 3 * a.st.removed_blocks);
    assert_int_equal(b.st.query_blocks, 3 * a.st.query_blocks);
    size_t per[3] = {0};
    for (size_t i = 0; i < b.n; i++)
        per[b.e[i].worker / 4]++;
    assert_int_equal(per[0], a.n);
    assert_int_equal(per[1], a.n);
    assert_int_equal(per[2], a.n);
    kvi_trace_workload_free(&a);
    kvi_trace_workload_free(&b);
    /* invalid configurations */
    c.block_size = 100; /* does not divide 512 */
    assert_int_equal(kvi_trace_workload_build(&a, &t, &c, NULL, NULL), -EINVAL);
    kvi_trace_free(&t);
}

/* Distinct tokens change content hashes but not the timeline's shape. */
static void test_distinct_tokens(void **state)
{
    (void)state;
    struct kvi_trace t;
    small_trace(&t, 60, 9);
    struct kvi_trace_workload_cfg c;
    kvi_trace_workload_defaults(&c);
    c.n_workers = 2;
    struct kvi_trace_workload a, b;
    assert_int_equal(kvi_trace_workload_build(&a, &t, &c, NULL, NULL), 0);
    c.distinct_tokens = true;
    assert_int_equal(kvi_trace_workload_build(&b, &t, &c, NULL, NULL), 0);
    assert_int_equal(a.n, b.n);
    assert_int_equal(a.st.stored_blocks, b.st.stored_blocks);
    /* repeated tokens: the 4 sub-blocks of an id are identical chunks */
    assert_int_equal(a.req_content[0][0], a.req_content[0][1]);
    assert_true(b.req_content[0][0] != b.req_content[0][1]);
    kvi_trace_workload_free(&a);
    kvi_trace_workload_free(&b);
    kvi_trace_free(&t);
}

static void test_find_default(void **state)
{
    (void)state;
    char p[8192];
    if (kvi_trace_find_default(p, sizeof p)) {
        assert_non_null(strstr(p, "mooncake-traces/conversation_trace.jsonl"));
        assert_int_equal(access(p, R_OK), 0);
    }
    char small[16];
    assert_false(kvi_trace_find_default(small, sizeof small));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_lines),
        cmocka_unit_test(test_sha256),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_workload_timeline),
        cmocka_unit_test(test_workload_replicas),
        cmocka_unit_test(test_distinct_tokens),
        cmocka_unit_test(test_find_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
