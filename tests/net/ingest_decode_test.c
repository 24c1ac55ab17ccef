/* ctest-labels: unit -- net/decode + net/ingest: real msgpack frames end to end into the index */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <msgpack.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/hash.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "engine/writer.h"
#include "net/decode.h"
#include "net/ingest.h"

/*
 * DESIGN: frames are packed with msgpack-c in the shapes real publishers
 * send (wire-protocol.md §3: vLLM tagged arrays and maps, SGLang pairs with
 * negative hashes, bin digests, RFC 1527 maps from a Mooncake master),
 * decoded with kvi_decode_batch and ingested; the index is then checked with
 * content hashes computed independently from the tokens.
 */

#define BS 4
#define NW 2
#define MAXM 32

static struct kvi_writer_pool *g_pool;
static struct kvi_index *g_ix;
static struct kvi_producer *g_p;
static struct kvi_decoder *g_dec;

struct reg {
    struct kvi_ingest_target t;
    struct kvi_ingest_counters ctr;
    struct kvi_op_sink sink;
};

static void reg_init(struct reg *r, uint64_t id, uint32_t rank)
{
    memset(r, 0, sizeof *r);
    r->t.ix = g_ix;
    r->t.instance = (uint32_t)kvi_index_intern_instance(g_ix, id, NULL, false);
    r->t.dp_rank = rank;
    r->t.block_size = BS;
    r->t.ctr = &r->ctr;
    r->t.sink = &r->sink;
    assert_int_equal(kvi_ingest_target_init(&r->t), 0);
}

/* ---- packing helpers ------------------------------------------------------------ */

static void pk_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pk_u64s(msgpack_packer *pk, const uint64_t *v, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, v[i]);
}

static void pk_tokens(msgpack_packer *pk, const uint32_t *t, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint32(pk, t[i]);
}

/* A 32-byte digest whose last 8 bytes (big-endian) are h. */
static void pk_bin_hash(msgpack_packer *pk, uint64_t h)
{
    uint8_t d[32];
    for (int i = 0; i < 24; i++)
        d[i] = (uint8_t)(0xa0 + i);
    for (int i = 0; i < 8; i++)
        d[24 + i] = (uint8_t)(h >> (56 - 8 * i));
    msgpack_pack_bin(pk, sizeof d);
    msgpack_pack_bin_body(pk, d, sizeof d);
}

/* Decode sb's bytes and ingest them for r; wait until applied. */
static void ingest_frame(struct reg *r, msgpack_sbuffer *sb)
{
    struct kvi_batch b;
    assert_int_equal(kvi_decode_batch(g_dec, sb->data, sb->size, &b), 0);
    kvi_ingest_batch(&r->t, &b, g_p);
    kvi_producer_flush(g_p);
    msgpack_sbuffer_clear(sb);
}

static uint32_t depth(const uint64_t *c, size_t n, uint32_t inst, uint32_t rank)
{
    struct kvi_match m[MAXM];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(g_ix, c, n, m, MAXM);
    kvi_rcu_read_unlock();
    for (size_t i = 0; i < k && i < MAXM; i++)
        if (m[i].instance == inst && m[i].dp_rank == rank)
            return m[i].depth;
    return 0;
}

static void tiered(const uint64_t *c, size_t n, uint32_t inst, uint32_t rank, struct kvi_tier_match *out)
{
    struct kvi_tier_match m[MAXM];
    memset(out, 0, sizeof *out);
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_tiered(g_ix, c, NULL, n, m, MAXM);
    kvi_rcu_read_unlock();
    for (size_t i = 0; i < k && i < MAXM; i++)
        if (m[i].instance == inst && m[i].dp_rank == rank)
            *out = m[i];
}

/* ---- the scenario ------------------------------------------------------------------ */

static void test_engines_end_to_end(void **state)
{
    (void)state;
    struct reg a, sg, mc;
    reg_init(&a, 1, 0);   /* vLLM worker */
    reg_init(&sg, 2, 0);  /* SGLang worker, publishing rank 1 */
    reg_init(&mc, 50, 0); /* Mooncake master */
    uint32_t tok[3 * BS];
    for (uint32_t i = 0; i < 3 * BS; i++)
        tok[i] = 70000 + i * 3; /* ids above u16: uint32 on the wire */
    uint64_t c[3], s[3];
    kvi_hash_blocks(tok, 3 * BS, BS, KVI_HASH_SEED, c, 3);
    kvi_seq_hashes(c, 3, s);
    uint64_t h[3] = {4918575722444228918ull, 15742941330807156044ull, 9064777777991361533ull};

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);

    /* 1. vLLM tagged array, 12 fields: blocks 0-1 */
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1795250797.88);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 12);
    pk_str(&pk, "BlockStored");
    pk_u64s(&pk, h, 2);
    msgpack_pack_nil(&pk);
    pk_tokens(&pk, tok, 2 * BS);
    msgpack_pack_uint32(&pk, BS);
    msgpack_pack_nil(&pk);
    pk_str(&pk, "GPU");
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_nil(&pk);
    msgpack_pack_nil(&pk);
    msgpack_pack_uint32(&pk, 0);
    pk_str(&pk, "full_attention");
    msgpack_pack_nil(&pk);
    msgpack_pack_uint32(&pk, 0);
    ingest_frame(&a, &sb);
    assert_int_equal(depth(c, 3, a.t.instance, 0), 2);

    /* 2. vLLM map form: block 2 under block 1, and a CPU placeholder for block 0
     *    whose hash arrives as a 32-byte digest */
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1795250798.0);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 10);
    pk_str(&pk, "type");
    pk_str(&pk, "BlockStored");
    pk_str(&pk, "block_hashes");
    pk_u64s(&pk, &h[2], 1);
    pk_str(&pk, "parent_block_hash");
    msgpack_pack_uint64(&pk, h[1]);
    pk_str(&pk, "token_ids");
    pk_tokens(&pk, tok + 2 * BS, BS);
    pk_str(&pk, "block_size");
    msgpack_pack_uint32(&pk, BS);
    pk_str(&pk, "lora_id");
    msgpack_pack_nil(&pk);
    pk_str(&pk, "medium");
    pk_str(&pk, "GPU");
    pk_str(&pk, "lora_name");
    msgpack_pack_nil(&pk);
    pk_str(&pk, "group_idx");
    msgpack_pack_uint32(&pk, 0);
    pk_str(&pk, "kv_cache_spec_kind");
    pk_str(&pk, "full_attention");
    msgpack_pack_map(&pk, 7);
    pk_str(&pk, "type");
    pk_str(&pk, "BlockStored");
    pk_str(&pk, "block_hashes");
    msgpack_pack_array(&pk, 1);
    pk_bin_hash(&pk, h[0]);
    pk_str(&pk, "parent_block_hash");
    msgpack_pack_nil(&pk);
    pk_str(&pk, "token_ids");
    msgpack_pack_array(&pk, 0);
    pk_str(&pk, "block_size");
    msgpack_pack_uint32(&pk, 0);
    pk_str(&pk, "medium");
    pk_str(&pk, "CPU");
    pk_str(&pk, "locality");
    pk_str(&pk, "LOCAL");
    msgpack_pack_uint32(&pk, 0);
    ingest_frame(&a, &sb);
    assert_int_equal(depth(c, 3, a.t.instance, 0), 3);
    assert_int_equal(atomic_load(&a.ctr.placeholders), 1);
    assert_int_equal(a.sink.outcomes[KVI_OUT_UNKNOWN_BLOCK], 0);

    /* 3. a 2-element batch (no rank): remove block 1 on the gpu, plus an unknown tag */
    msgpack_pack_array(&pk, 2);
    msgpack_pack_double(&pk, 1795250799.0);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_array(&pk, 4);
    pk_str(&pk, "BlockRemoved");
    pk_u64s(&pk, &h[1], 1);
    pk_str(&pk, "GPU");
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, 2);
    pk_str(&pk, "BlockInactive");
    pk_u64s(&pk, h, 1);
    ingest_frame(&a, &sb);
    assert_int_equal(depth(c, 3, a.t.instance, 0), 1);
    assert_int_equal(atomic_load(&a.ctr.events_unknown), 1);
    struct kvi_tier_match m;
    tiered(c, 3, a.t.instance, 0, &m);
    assert_int_equal(m.gpu, 1);
    assert_int_equal(m.cpu, 1); /* the placeholder covers block 0 only */

    /* 4. SGLang: eagle pairs, a negative int64 hash, rank 1 in the batch */
    uint32_t pt[BS + 1];
    for (uint32_t i = 0; i < BS + 1; i++)
        pt[i] = 10 + i;
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 7);
    pk_str(&pk, "BlockStored");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_int64(&pk, -1944566869021170841ll);
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, BS);
    for (uint32_t i = 0; i < BS; i++) {
        msgpack_pack_array(&pk, 2);
        msgpack_pack_uint32(&pk, pt[i]);
        msgpack_pack_uint32(&pk, pt[i + 1]);
    }
    msgpack_pack_uint32(&pk, BS);
    msgpack_pack_nil(&pk);
    pk_str(&pk, "GPU");
    msgpack_pack_uint32(&pk, 1);
    ingest_frame(&sg, &sb);
    uint64_t ce;
    assert_int_equal(kvi_hash_blocks_eagle(pt, BS + 1, BS, KVI_HASH_SEED, &ce, 1), 1);
    assert_int_equal(depth(&ce, 1, sg.t.instance, 1), 1);
    assert_int_equal(depth(&ce, 1, sg.t.instance, 0), 0);

    /* 5. Mooncake master: RFC 1527 token-less stored of blocks 0-2 in a shared cpu pool */
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 2.0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 7);
    pk_str(&pk, "event_type");
    pk_str(&pk, "stored");
    pk_str(&pk, "seq_hashes");
    pk_u64s(&pk, s, 3);
    pk_str(&pk, "base_block_idx");
    msgpack_pack_uint32(&pk, 0);
    pk_str(&pk, "parent_hash");
    msgpack_pack_nil(&pk);
    pk_str(&pk, "backend_id");
    pk_str(&pk, "mc-store-1");
    pk_str(&pk, "medium");
    pk_str(&pk, "cpu");
    pk_str(&pk, "object_key");
    pk_str(&pk, "k-0001");
    msgpack_pack_uint32(&pk, 0);
    ingest_frame(&mc, &sb);
    assert_int_equal(atomic_load(&mc.ctr.seq_only), 1);
    tiered(c, 3, a.t.instance, 0, &m);
    assert_int_equal(m.gpu, 1);
    assert_int_equal(m.cpu, 3); /* the worker reaches the shared pool */

    /* 6. AllBlocksCleared from the vLLM worker: its blocks go, the pool and SGLang stay */
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 3.0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 1);
    pk_str(&pk, "AllBlocksCleared");
    msgpack_pack_uint32(&pk, 0);
    ingest_frame(&a, &sb);
    assert_int_equal(depth(c, 3, a.t.instance, 0), 0);
    assert_int_equal(depth(&ce, 1, sg.t.instance, 1), 1);
    uint32_t pc = 0, pd = 0;
    kvi_rcu_read_lock();
    kvi_index_pool_depths(g_ix, c, NULL, 3, &pc, &pd);
    kvi_rcu_read_unlock();
    assert_int_equal(pc, 3);

    assert_int_equal(atomic_load(&a.ctr.batches), 4);
    assert_int_equal(atomic_load(&a.ctr.events_stored), 3);
    assert_int_equal(atomic_load(&a.ctr.events_removed), 1);
    assert_int_equal(atomic_load(&a.ctr.events_cleared), 1);
    assert_int_equal(a.sink.outcomes[KVI_OUT_PARENT_NOT_FOUND], 0);
    assert_int_equal(a.sink.outcomes[KVI_OUT_INVALID], 0);
    msgpack_sbuffer_destroy(&sb);
    kvi_ingest_target_fini(&a.t);
    kvi_ingest_target_fini(&sg.t);
    kvi_ingest_target_fini(&mc.t);
}

static int setup(void **state)
{
    (void)state;
    g_pool = kvi_writer_pool_create(NW, 0);
    struct kvi_index_config cfg = {.block_size = BS, .n_parts = NW};
    g_ix = kvi_index_create(&cfg);
    g_p = kvi_producer_create(g_pool);
    g_dec = kvi_decoder_create();
    return g_pool && g_ix && g_p && g_dec ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvi_decoder_destroy(g_dec);
    kvi_producer_forget_index(g_p, g_ix);
    kvi_producer_destroy(g_p);
    kvi_writer_pool_destroy(g_pool);
    kvi_index_destroy(g_ix);
    return 0;
}

int main(void)
{
    kvi_rcu_register_thread();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_engines_end_to_end, setup, teardown),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return r;
}
