/* ctest-labels: unit -- api/codec_dump.c: /dump encoder and streaming decoder (http-api.md §1.11, §1.16) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_dump.h"
#include "engine/hash.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "rcu_group.h"

static void assert_out(const struct kvi_buf *b, const char *want)
{
    if (b->len != strlen(want) || memcmp(b->data, want, b->len) != 0)
        fail_msg("got  '%.*s'\nwant '%s'", (int)b->len, b->data, want);
}

/* ---- a canonical record, comparable across indexes ------------------------------- */

struct rec {
    int op;
    char ns[32];
    uint32_t block_size;
    char worker[40]; /* decimal id or "name:<name>" */
    uint32_t dp_rank;
    int tier;
    uint32_t position;
    bool has_position;
    bool has_parent;
    uint64_t parent, engine, content, seq;
    bool has_seq;
    bool no_content;
};

struct recs {
    struct rec *v;
    size_t n, cap;
    int ns_calls;
    char ns_seen[256];
    int stop_after; /* return 99 from the record callback after this many (0 = never) */
};

static void recs_push(struct recs *r, const struct rec *x)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->v = realloc(r->v, r->cap * sizeof(*r->v));
    }
    r->v[r->n++] = *x;
}

static int rec_cmp(const void *a, const void *b)
{
    const struct rec *x = a, *y = b;
    int c = strcmp(x->worker, y->worker);
    if (c)
        return c;
    if (x->dp_rank != y->dp_rank)
        return x->dp_rank < y->dp_rank ? -1 : 1;
    if (x->tier != y->tier)
        return x->tier < y->tier ? -1 : 1;
    if (x->position != y->position)
        return x->position < y->position ? -1 : 1;
    return x->engine < y->engine ? -1 : x->engine > y->engine;
}

static void worker_name(char *out, size_t n, bool named, uint64_t id, const char *name, size_t len)
{
    if (named)
        snprintf(out, n, "name:%.*s", (int)len, name);
    else
        snprintf(out, n, "%llu", (unsigned long long)id);
}

/* decoder callbacks */
static int on_ns(void *ctx, struct kvi_str model, struct kvi_str tenant, uint32_t bs)
{
    struct recs *r = ctx;
    size_t l = strlen(r->ns_seen);
    snprintf(r->ns_seen + l, sizeof(r->ns_seen) - l, "[%.*s|%.*s|%u]", (int)model.len, model.p,
             (int)tenant.len, tenant.p, bs);
    r->ns_calls++;
    return 0;
}

static int on_rec(void *ctx, const struct kvi_dump_rec *d)
{
    struct recs *r = ctx;
    if (r->stop_after && (int)r->n >= r->stop_after)
        return 99;
    struct rec x;
    memset(&x, 0, sizeof(x));
    x.op = d->op;
    snprintf(x.ns, sizeof(x.ns), "%.*s|%.*s", (int)d->model.len, d->model.p, (int)d->tenant.len,
             d->tenant.p);
    x.block_size = d->block_size;
    worker_name(x.worker, sizeof(x.worker), d->worker_named, d->worker_id, d->worker_name.p,
                d->worker_name.len);
    x.dp_rank = d->dp_rank;
    x.tier = d->tier;
    x.position = d->position;
    x.has_position = d->has_position;
    x.has_parent = d->has_parent;
    x.parent = d->has_parent ? d->parent_hash : 0;
    x.engine = d->engine_hash;
    x.content = d->content_hash;
    x.seq = d->seq_hash;
    x.has_seq = d->has_seq;
    x.no_content = d->no_content;
    recs_push(r, &x);
    return 0;
}

/* Decode @p body in chunks of @p chunk bytes (0 = whole). @return feed/finish result. */
static int decode(const char *body, size_t len, size_t chunk, struct recs *out, char *err, size_t errn)
{
    struct kvi_dump_dec_cb cb = {on_ns, on_rec, out, NULL};
    struct kvi_dump_dec *d = kvi_dump_dec_create(&cb);
    assert_non_null(d);
    int r = 0;
    if (chunk == 0)
        chunk = len ? len : 1;
    for (size_t off = 0; off < len && r == 0; off += chunk)
        r = kvi_dump_dec_feed(d, body + off, len - off < chunk ? len - off : chunk);
    if (r == 0)
        r = kvi_dump_dec_finish(d);
    if (err)
        snprintf(err, errn, "%s", kvi_dump_dec_error(d));
    kvi_dump_dec_destroy(d);
    return r;
}

/* ---- an index to dump -------------------------------------------------------------- */

struct dump_ctx {
    struct kvi_index *ix;
    struct recs *out;
    const char *ns;
    uint32_t bs;
};

static void collect_block(void *ctx, const struct kvi_dump_block *b)
{
    struct dump_ctx *c = ctx;
    uint64_t id;
    const char *name;
    bool shared;
    assert_int_equal(kvi_index_instance_info(c->ix, b->instance, &id, &name, &shared), 0);
    struct rec x;
    memset(&x, 0, sizeof(x));
    x.op = KVI_DUMP_STORED;
    snprintf(x.ns, sizeof(x.ns), "%s", c->ns);
    x.block_size = c->bs;
    worker_name(x.worker, sizeof(x.worker), name != NULL, id, name, name ? strlen(name) : 0);
    x.dp_rank = b->dp_rank;
    x.tier = b->tier;
    x.position = b->position;
    x.has_position = true;
    x.has_parent = b->has_parent;
    x.parent = b->has_parent ? b->parent_engine_hash : 0;
    x.engine = b->engine_hash;
    x.content = b->content_hash;
    x.seq = b->seq_hash;
    x.has_seq = true;
    x.no_content = b->no_content;
    recs_push(c->out, &x);
}

static const uint64_t BIG_ID = (1ull << 63) + 5;

/* Engine hash of a test block: spread over the whole u64 range. */
static uint64_t eh(uint64_t salt, uint64_t i)
{
    uint64_t x = salt * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
    x ^= x >> 31;
    return x | (i & 1 ? 1ull << 63 : 0);
}

static struct kvi_index *build_index(void)
{
    struct kvi_index_config cfg = {4, 1, 0, 0x1234};
    struct kvi_index *ix = kvi_index_create(&cfg);
    assert_non_null(ix);
    int64_t a = kvi_index_intern_instance(ix, 7, NULL, false);
    int64_t b = kvi_index_intern_instance(ix, BIG_ID, NULL, false);
    int64_t c = kvi_index_intern_instance(ix, 0, "vllm-node-1", false);
    assert_true(a >= 0 && b >= 0 && c >= 0);
    struct kvi_block blk[8];
    /* A rank 0: a 5-block gpu chain, then 2 cpu blocks below its last block */
    for (int i = 0; i < 5; i++)
        blk[i] = (struct kvi_block){eh(1, (uint64_t)i), 1000 + (uint64_t)i};
    assert_int_equal(kvi_index_store(ix, (uint32_t)a, 0, KVI_TIER_GPU, false, 0, blk, 5), 0);
    struct kvi_block cpu[2] = {{eh(2, 0), 2000}, {eh(2, 1), 2001}};
    assert_int_equal(kvi_index_store(ix, (uint32_t)a, 0, KVI_TIER_CPU, true, blk[4].engine_hash, cpu, 2), 0);
    /* A rank 1: the same first 3 blocks under other engine hashes */
    for (int i = 0; i < 3; i++)
        blk[i] = (struct kvi_block){eh(3, (uint64_t)i), 1000 + (uint64_t)i};
    assert_int_equal(kvi_index_store(ix, (uint32_t)a, 1, KVI_TIER_GPU, false, 0, blk, 3), 0);
    /* B: a branchy tree [1,2,3] and [1,2,4] */
    for (int i = 0; i < 3; i++)
        blk[i] = (struct kvi_block){eh(4, (uint64_t)i), 1 + (uint64_t)i};
    assert_int_equal(kvi_index_store(ix, (uint32_t)b, 0, KVI_TIER_GPU, false, 0, blk, 3), 0);
    struct kvi_block br = {eh(5, 0), 4};
    assert_int_equal(kvi_index_store(ix, (uint32_t)b, 0, KVI_TIER_GPU, true, blk[1].engine_hash, &br, 1), 0);
    /* C (named): gpu [9], and a disk block placed by position 3 with no parent */
    struct kvi_block c0 = {eh(6, 0), 9};
    assert_int_equal(kvi_index_store(ix, (uint32_t)c, 2, KVI_TIER_GPU, false, 0, &c0, 1), 0);
    uint64_t content[4] = {50, 51, 52, 53}, seq[4];
    kvi_seq_hashes(content, 4, seq);
    struct kvi_block placed = {eh(7, 0), 53};
    assert_int_equal(kvi_index_store_seq(ix, (uint32_t)c, 2, KVI_TIER_DISK, false, 0, 3, &placed, &seq[3], 1), 0);
    /* C: a cpu block placed by a seq hash nobody has, without tokens */
    uint64_t tokless_engine = eh(8, 0), tokless_seq = 0x5eed5eed5eed5eedull;
    assert_int_equal(kvi_index_store_seq_only(ix, (uint32_t)c, 2, KVI_TIER_CPU, false, 0, 6, &tokless_engine,
                                              &tokless_seq, 1),
                     0);
    return ix;
}

static int sink_collect(void *ctx, const char *data, size_t len)
{
    struct kvi_buf *b = ctx;
    assert_true(len > 0);
    kvi_buf_put(b, data, len);
    return 0;
}

static void dump_index(struct kvi_index *ix, struct kvi_buf *body, size_t flush_at)
{
    struct kvi_dump_enc enc;
    kvi_dump_enc_init(&enc, sink_collect, body, flush_at);
    kvi_dump_enc_begin(&enc);
    kvi_dump_enc_ns_begin(&enc, (struct kvi_str){"llama", 5}, (struct kvi_str){"default", 7}, 4, ix);
    for (uint32_t p = 0; p < kvi_index_n_parts(ix); p++)
        kvi_index_dump_partition(ix, p, kvi_dump_emit, &enc);
    kvi_dump_enc_ns_end(&enc);
    assert_int_equal(kvi_dump_enc_end(&enc), 0);
    assert_int_equal(enc.out.len, 0); /* everything went to the sink */
    kvi_dump_enc_free(&enc);
}

static void test_round_trip(void **state)
{
    struct kvi_index *ix = build_index();
    struct recs want = {0};
    struct dump_ctx dc = {ix, &want, "llama|default", 4};
    kvi_index_dump_partition(ix, 0, collect_block, &dc);
    assert_int_equal(want.n, 5 + 2 + 3 + 4 + 1 + 1 + 1);
    size_t n_tokless = 0;
    for (size_t i = 0; i < want.n; i++)
        n_tokless += want.v[i].no_content;
    assert_int_equal(n_tokless, 1);

    struct kvi_buf body;
    kvi_buf_init(&body);
    dump_index(ix, &body, 100); /* tiny flush threshold: many sink calls */

    static const size_t chunks[] = {0, 1, 2, 7, 64, 333, 4096};
    for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
        struct recs got = {0};
        char err[256];
        int r = decode(body.data, body.len, chunks[ci], &got, err, sizeof(err));
        if (r != 0)
            fail_msg("chunk %zu: %d %s", chunks[ci], r, err);
        assert_int_equal(got.ns_calls, 1);
        assert_string_equal(got.ns_seen, "[llama|default|4]");
        assert_int_equal(got.n, want.n);
        /* same records in the same (parents-first) order */
        for (size_t i = 0; i < want.n; i++) {
            if (memcmp(&got.v[i], &want.v[i], sizeof(struct rec)) != 0)
                fail_msg("chunk %zu, record %zu differs (worker %s/%s engine %llx/%llx)", chunks[ci], i,
                         got.v[i].worker, want.v[i].worker, (unsigned long long)got.v[i].engine,
                         (unsigned long long)want.v[i].engine);
        }
        free(got.v);
    }

    /* replay the decoded records into an empty index: it dumps the same blocks */
    struct recs got = {0};
    assert_int_equal(decode(body.data, body.len, 0, &got, NULL, 0), 0);
    struct kvi_index_config cfg = {4, 1, 0, 0x777};
    struct kvi_index *ix2 = kvi_index_create(&cfg);
    for (size_t i = 0; i < got.n; i++) {
        const struct rec *x = &got.v[i];
        int64_t inst = strncmp(x->worker, "name:", 5) == 0
                           ? kvi_index_intern_instance(ix2, 0, x->worker + 5, false)
                           : kvi_index_intern_instance(ix2, strtoull(x->worker, NULL, 10), NULL, false);
        assert_true(inst >= 0);
        struct kvi_block blk = {x->engine, x->content};
        int r;
        if (x->no_content)
            r = kvi_index_store_seq_only(ix2, (uint32_t)inst, x->dp_rank, (enum kvi_tier)x->tier, x->has_parent,
                                         x->parent, x->position, &x->engine, &x->seq, 1);
        else if (x->has_parent)
            r = kvi_index_store(ix2, (uint32_t)inst, x->dp_rank, (enum kvi_tier)x->tier, true, x->parent, &blk, 1);
        else if (x->position == 0)
            r = kvi_index_store(ix2, (uint32_t)inst, x->dp_rank, (enum kvi_tier)x->tier, false, 0, &blk, 1);
        else
            r = kvi_index_store_seq(ix2, (uint32_t)inst, x->dp_rank, (enum kvi_tier)x->tier, false, 0,
                                    x->position, &blk, &x->seq, 1);
        assert_int_equal(r, 0);
    }
    struct recs again = {0};
    struct dump_ctx dc2 = {ix2, &again, "llama|default", 4};
    kvi_index_dump_partition(ix2, 0, collect_block, &dc2);
    assert_int_equal(again.n, want.n);
    qsort(again.v, again.n, sizeof(struct rec), rec_cmp);
    qsort(want.v, want.n, sizeof(struct rec), rec_cmp);
    for (size_t i = 0; i < want.n; i++)
        assert_memory_equal(&again.v[i], &want.v[i], sizeof(struct rec));

    free(got.v);
    free(again.v);
    free(want.v);
    kvi_buf_free(&body);
    kvi_index_destroy(ix2);
    kvi_index_destroy(ix);
}

static void test_encoder_bytes(void **state)
{
    struct kvi_dump_enc enc;
    kvi_dump_enc_init(&enc, NULL, NULL, 0);
    kvi_dump_enc_begin(&enc);
    assert_int_equal(kvi_dump_enc_end(&enc), 0);
    assert_out(&enc.out, "{}");
    kvi_buf_reset(&enc.out);

    kvi_dump_enc_begin(&enc);
    kvi_dump_enc_ns_begin(&enc, (struct kvi_str){"m", 1}, (struct kvi_str){"t\"x", 3}, 16, NULL);
    struct kvi_dump_block b1 = {.instance = 0, .dp_rank = 0, .tier = KVI_TIER_GPU, .position = 0,
                                .engine_hash = 123, .content_hash = 456, .seq_hash = 456};
    struct kvi_dump_block b2 = {.instance = 0, .dp_rank = 2, .tier = KVI_TIER_CPU, .position = 1,
                                .engine_hash = 18446744073709551615ull, .content_hash = 7, .seq_hash = 99,
                                .has_parent = true, .parent_engine_hash = 123};
    struct kvi_dump_block b3 = {.instance = 0, .dp_rank = 0, .tier = KVI_TIER_DISK, .position = 4,
                                .engine_hash = 5, .seq_hash = 6, .no_content = true};
    struct kvi_dump_worker w1 = {1, NULL}, w2 = {0, "node\"a"};
    kvi_dump_enc_block(&enc, &b1, &w1);
    kvi_dump_enc_block(&enc, &b2, &w2);
    kvi_dump_enc_block(&enc, &b3, &w1);
    kvi_dump_enc_ns_end(&enc);
    kvi_dump_enc_ns_error(&enc, (struct kvi_str){"m2", 2}, (struct kvi_str){"default", 7}, "dump failed");
    kvi_dump_enc_ns_begin(&enc, (struct kvi_str){"m3", 2}, (struct kvi_str){"default", 7}, 8, NULL);
    kvi_dump_enc_ns_end(&enc);
    assert_int_equal(kvi_dump_enc_end(&enc), 0);
    assert_out(&enc.out,
               "{\"m:t\\\"x\":{\"block_size\":16,\"events\":["
               "{\"worker_id\":1,\"storage_tier\":\"device\",\"event\":{\"event_id\":0,\"dp_rank\":0,"
               "\"data\":{\"stored\":{\"parent_hash\":null,\"start_position\":0,\"blocks\":[{\"block_hash\":123,"
               "\"tokens_hash\":456,\"mm_extra_info\":null,\"seq_hash\":456}]}}}},"
               "{\"worker_id\":\"node\\\"a\",\"storage_tier\":\"host_pinned\",\"event\":{\"event_id\":1,\"dp_rank\":2,"
               "\"data\":{\"stored\":{\"parent_hash\":123,\"start_position\":1,\"blocks\":[{\"block_hash\":18446744073709551615,"
               "\"tokens_hash\":7,\"mm_extra_info\":null,\"seq_hash\":99}]}}}},"
               "{\"worker_id\":1,\"storage_tier\":\"disk\",\"event\":{\"event_id\":2,\"dp_rank\":0,"
               "\"data\":{\"stored\":{\"parent_hash\":null,\"start_position\":4,\"blocks\":[{\"block_hash\":5,"
               "\"tokens_hash\":0,\"mm_extra_info\":null,\"seq_hash\":6,\"no_content\":true}]}}}}]},"
               "\"m2:default\":{\"error\":\"dump failed\"},"
               "\"m3:default\":{\"block_size\":8,\"events\":[]}}");
    kvi_dump_enc_free(&enc);
    assert_string_equal(kvi_dump_tier_name(KVI_TIER_DISK), "disk");
    assert_string_equal(kvi_dump_tier_name(KVI_TIER_EXTERNAL), "external");
}

/* A dump as a reference Dynamo peer writes it (tree backend): multi-block
 * events, no start_position, removed and cleared events, block_size after
 * the events, a key without ':' */
static const char *DYNAMO_DUMP =
    "{\n"
    "  \"llama-3-8b:default\": {\n"
    "    \"events\": [\n"
    "      {\"worker_id\": 18446744073709551615, \"event\": {\"event_id\": 0, \"dp_rank\": 1,\n"
    "        \"data\": {\"stored\": {\"parent_hash\": null, \"blocks\": [\n"
    "          {\"block_hash\": 11, \"tokens_hash\": 101, \"mm_extra_info\": null},\n"
    "          {\"block_hash\": -2, \"tokens_hash\": 102, \"mm_extra_info\": {\"mm_objects\": []}},\n"
    "          {\"block_hash\": 13, \"tokens_hash\": 103}]}}}},\n"
    "      {\"worker_id\": 2, \"storage_tier\": \"disk\", \"event\": {\"event_id\": 1,\n"
    "        \"data\": {\"stored\": {\"parent_hash\": 12, \"start_position\": 5, \"blocks\": [\n"
    "          {\"block_hash\": 21, \"tokens_hash\": 201}]}}}},\n"
    "      {\"worker_id\": 2, \"event\": {\"event_id\": 2, \"dp_rank\": 0, \"data\": {\"removed\": {\"block_hashes\": [21, -1]}}}},\n"
    "      {\"worker_id\": 2, \"event\": {\"event_id\": 3, \"dp_rank\": 0, \"data\": \"cleared\"}, \"extra\": [1, {\"a\": \"]\"}]}\n"
    "    ],\n"
    "    \"block_size\": 16\n"
    "  },\n"
    "  \"nocolon\": {\"block_size\": 32, \"ignored\": {\"x\": [1, 2]}, \"events\": []}\n"
    "}\n";

static void test_decode_dynamo(void **state)
{
    static const size_t chunks[] = {0, 1, 5, 100};
    for (size_t ci = 0; ci < 4; ci++) {
        struct recs got = {0};
        char err[256];
        int r = decode(DYNAMO_DUMP, strlen(DYNAMO_DUMP), chunks[ci], &got, err, sizeof(err));
        if (r != 0)
            fail_msg("%d %s", r, err);
        assert_int_equal(got.ns_calls, 2);
        assert_string_equal(got.ns_seen, "[llama-3-8b|default|16][nocolon|default|32]");
        assert_int_equal(got.n, 3 + 1 + 2 + 1);
        /* the multi-block event is split, each block naming its parent */
        struct rec *v = got.v;
        assert_string_equal(v[0].worker, "18446744073709551615");
        assert_int_equal(v[0].op, KVI_DUMP_STORED);
        assert_int_equal(v[0].dp_rank, 1);
        assert_int_equal(v[0].tier, KVI_TIER_GPU);
        assert_int_equal(v[0].block_size, 16);
        assert_false(v[0].has_parent);
        assert_false(v[0].has_position);
        assert_false(v[0].has_seq);
        assert_true(v[0].engine == 11 && v[0].content == 101);
        assert_true(v[1].has_parent && v[1].parent == 11);
        assert_true(v[1].engine == (uint64_t)-2);
        assert_true(v[2].has_parent && v[2].parent == (uint64_t)-2 && v[2].engine == 13);
        assert_string_equal(v[3].worker, "2");
        assert_int_equal(v[3].tier, KVI_TIER_DISK);
        assert_true(v[3].has_parent && v[3].parent == 12);
        assert_true(v[3].has_position && v[3].position == 5);
        assert_int_equal(v[4].op, KVI_DUMP_REMOVED);
        assert_true(v[4].engine == 21);
        assert_int_equal(v[5].op, KVI_DUMP_REMOVED);
        assert_true(v[5].engine == UINT64_MAX);
        assert_int_equal(v[6].op, KVI_DUMP_CLEARED);
        assert_string_equal(v[6].ns, "llama-3-8b|default");
        free(got.v);
    }
}

static void test_decode_errors(void **state)
{
    static const struct {
        const char *body;
        const char *err; /* prefix of the message */
    } cases[] = {
        {"{\"m:t\":{\"error\":\"indexer failed\"}}", "namespace m:t reported an error: indexer failed"},
        {"{\"m:t\":{\"events\":[]}}", "namespace m:t has no block_size"},
        {"{\"m:t\":{\"block_size\":16}}", "namespace m:t has no events"},
        {"{\"m:t\":{\"block_size\":0,\"events\":[]}}", "invalid block_size"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[{\"worker_id\":1}]}}", "invalid RouterEvent"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"storage_tier\":\"gpu\",\"event\":"
         "{\"event_id\":0,\"data\":\"cleared\"}}]}}", "invalid RouterEvent"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"event\":{\"event_id\":0,\"data\":"
         "{\"stored\":{\"parent_hash\":null,\"blocks\":[{\"block_hash\":1.5,\"tokens_hash\":2}]}}}}]}}",
         "invalid RouterEvent"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"event\":{\"event_id\":0,\"data\":"
         "{\"stored\":{\"blocks\":[{\"block_hash\":1}]}}}}]}}", "invalid RouterEvent"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[{\"worker_id\":1,\"event\":{\"data\":{\"stored\":{\"blocks\":[]},"
         "\"removed\":{\"block_hashes\":[]}}}}]}}", "invalid RouterEvent"},
        {"{\"m:t\":[]}", "namespace m:t is not an object"},
        {"[]", "dump is not a JSON object"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[]}} x", "trailing characters"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[]}", "EOF while parsing the dump"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[{\"worker_id\":1", "EOF while parsing a value"},
        {"{\"m:t\":{\"block_size\":16,\"events\":[]},}", "key must be a string"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (size_t chunk = 0; chunk < 3; chunk++) {
            struct recs got = {0};
            char err[256];
            int r = decode(cases[i].body, strlen(cases[i].body), chunk, &got, err, sizeof(err));
            if (r != -EBADMSG || strncmp(err, cases[i].err, strlen(cases[i].err)) != 0)
                fail_msg("case %zu chunk %zu: %d '%s', want '%s'", i, chunk, r, err, cases[i].err);
            free(got.v);
        }
    }
    /* a callback stops decoding with its own value */
    struct recs got = {0};
    got.stop_after = 2;
    assert_int_equal(decode(DYNAMO_DUMP, strlen(DYNAMO_DUMP), 0, &got, NULL, 0), 99);
    assert_int_equal(got.n, 2);
    free(got.v);
}

/* ---- watermarks ------------------------------------------------------------------------ */

struct wms {
    char got[1024];
    int stop_at; /* return 77 from the watermark callback at this entry (1-based; 0 = never) */
    int n;
};

static int on_wm(void *ctx, const struct kvi_dump_wm *w)
{
    struct wms *x = ctx;
    if (x->stop_at && ++x->n == x->stop_at)
        return 77;
    char who[64];
    worker_name(who, sizeof who, w->worker_named, w->worker_id, w->worker_name.p, w->worker_name.len);
    size_t l = strlen(x->got);
    snprintf(x->got + l, sizeof(x->got) - l, "[%.*s|%.*s %s/%u@%llu]", (int)w->model.len, w->model.p,
             (int)w->tenant.len, w->tenant.p, who, w->dp_rank, (unsigned long long)w->seq);
    return 0;
}

/* Decode @p body twice (the decoder has one ctx): records into @p recs, watermarks into @p wms. */
static int decode_wm(const char *body, size_t chunk, struct recs *recs, struct wms *wms, char *err, size_t errn)
{
    int r = decode(body, strlen(body), chunk, recs, err, errn);
    struct kvi_dump_dec_cb cbw = {NULL, NULL, wms, on_wm};
    struct kvi_dump_dec *d = kvi_dump_dec_create(&cbw);
    assert_non_null(d);
    size_t len = strlen(body);
    if (chunk == 0)
        chunk = len;
    int rw = 0;
    for (size_t off = 0; off < len && rw == 0; off += chunk)
        rw = kvi_dump_dec_feed(d, body + off, len - off < chunk ? len - off : chunk);
    if (rw == 0)
        rw = kvi_dump_dec_finish(d);
    if (rw != 0 && err)
        snprintf(err, errn, "%s", kvi_dump_dec_error(d));
    kvi_dump_dec_destroy(d);
    return rw != 0 ? rw : r;
}

/* The watermarks extension: written after a namespace's events (only when it has some),
 * decoded in order, and ignored by a decoder without the callback. */
static void test_watermarks(void **state)
{
    (void)state;
    struct kvi_dump_enc enc;
    kvi_dump_enc_init(&enc, NULL, NULL, 0);
    kvi_dump_enc_begin(&enc);
    kvi_dump_enc_ns_begin(&enc, (struct kvi_str){"m", 1}, (struct kvi_str){"t", 1}, 16, NULL);
    struct kvi_dump_block b1 = {.instance = 0, .dp_rank = 0, .tier = KVI_TIER_GPU, .position = 0,
                                .engine_hash = 123, .content_hash = 456, .seq_hash = 456};
    struct kvi_dump_worker w1 = {1, NULL}, w2 = {0, "node-a"};
    kvi_dump_enc_watermark(&enc, &w1, 0, 41); /* a partition's hook may run before any block */
    kvi_dump_enc_block(&enc, &b1, &w1);
    kvi_dump_enc_watermark(&enc, &w2, 3, 18446744073709551614ull);
    kvi_dump_enc_ns_end(&enc);
    kvi_dump_enc_ns_begin(&enc, (struct kvi_str){"m2", 2}, (struct kvi_str){"default", 7}, 8, NULL);
    kvi_dump_enc_ns_end(&enc); /* none: no key */
    kvi_dump_enc_ns_begin(&enc, (struct kvi_str){"m3", 2}, (struct kvi_str){"default", 7}, 8, NULL);
    kvi_dump_enc_watermark(&enc, &w1, 1, 0);
    kvi_dump_enc_ns_end(&enc);
    assert_int_equal(kvi_dump_enc_end(&enc), 0);
    const char *want =
        "{\"m:t\":{\"block_size\":16,\"events\":["
        "{\"worker_id\":1,\"storage_tier\":\"device\",\"event\":{\"event_id\":0,\"dp_rank\":0,"
        "\"data\":{\"stored\":{\"parent_hash\":null,\"start_position\":0,\"blocks\":[{\"block_hash\":123,"
        "\"tokens_hash\":456,\"mm_extra_info\":null,\"seq_hash\":456}]}}}}],"
        "\"watermarks\":[{\"worker_id\":1,\"dp_rank\":0,\"seq\":41},"
        "{\"worker_id\":\"node-a\",\"dp_rank\":3,\"seq\":18446744073709551614}]},"
        "\"m2:default\":{\"block_size\":8,\"events\":[]},"
        "\"m3:default\":{\"block_size\":8,\"events\":[],\"watermarks\":[{\"worker_id\":1,\"dp_rank\":1,\"seq\":0}]}}";
    assert_out(&enc.out, want);
    char *body = strndup(enc.out.data, enc.out.len);
    kvi_dump_enc_free(&enc);

    static const size_t chunks[] = {0, 1, 7};
    for (size_t ci = 0; ci < 3; ci++) {
        struct recs got = {0};
        struct wms wm = {0};
        char err[256] = "";
        assert_int_equal(decode_wm(body, chunks[ci], &got, &wm, err, sizeof err), 0);
        assert_int_equal(got.n, 1); /* the watermarks are no records */
        assert_string_equal(got.ns_seen, "[m|t|16][m2|default|8][m3|default|8]");
        assert_string_equal(wm.got, "[m|t 1/0@41][m|t name:node-a/3@18446744073709551614][m3|default 1/1@0]");
        free(got.v);
    }
    /* a Dynamo-style reader (no watermark callback) decodes the same records */
    struct recs plain = {0};
    assert_int_equal(decode(body, strlen(body), 0, &plain, NULL, 0), 0);
    assert_int_equal(plain.n, 1);
    free(plain.v);
    /* before block_size, null dp_rank, unknown keys skipped */
    struct recs got = {0};
    struct wms wm = {0};
    assert_int_equal(decode_wm("{\"x:y\":{\"watermarks\":[{\"seq\":5,\"x\":[1],\"worker_id\":7,\"dp_rank\":null}],"
                               "\"block_size\":4,\"events\":[]}}",
                               0, &got, &wm, NULL, 0),
                     0);
    assert_string_equal(wm.got, "[x|y 7/0@5]");
    free(got.v);
    /* a callback's nonzero value stops the decoding */
    struct wms stop = {.stop_at = 2};
    got = (struct recs){0};
    char err[256];
    assert_int_equal(decode_wm(body, 0, &got, &stop, err, sizeof err), 77);
    free(got.v);
    free(body);

    static const char *bad[] = {
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":{}}}",
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":[1]}}",
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":[{\"worker_id\":1,\"dp_rank\":0}]}}",
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":[{\"dp_rank\":0,\"seq\":1}]}}",
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":[{\"worker_id\":1,\"seq\":-1}]}}",
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":[{\"worker_id\":1,\"seq\":1.5}]}}",
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":[{\"worker_id\":1,\"seq\":18446744073709551615}]}}",
        "{\"m:t\":{\"block_size\":16,\"events\":[],\"watermarks\":[{\"worker_id\":1,\"dp_rank\":-1,\"seq\":1}]}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct recs g = {0};
        struct wms w = {0};
        char e[256] = "";
        int r = decode_wm(bad[i], 0, &g, &w, e, sizeof e);
        if (r != -EBADMSG || strncmp(e, "invalid watermarks", 18) != 0)
            fail_msg("bad %zu: %d '%s'", i, r, e);
        assert_string_equal(w.got, ""); /* nothing handed out from a bad array */
        free(g.v);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_encoder_bytes),
        cmocka_unit_test(test_decode_dynamo),
        cmocka_unit_test(test_decode_errors),
        cmocka_unit_test(test_watermarks),
    };
    return cmocka_run_group_tests(tests, kvi_test_rcu_setup, kvi_test_rcu_teardown);
}
