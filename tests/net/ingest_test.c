/* ctest-labels: unit -- net/ingest.{h,c}: decoded events -> index ops through the writers */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
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
 * DESIGN: every test builds a fresh 2-writer pool, an index with 2
 * partitions and block size BS, and the test thread's producer (fixture),
 * then feeds hand-built struct kvi_batch values through kvi_ingest_batch,
 * flushes, and checks the index with queries whose content hashes are
 * computed independently with engine/hash.h, plus the target's decode-side
 * counters and the writers' sink. The test thread is a registered RCU
 * reader (main) and holds a read section only around queries.
 */

#define BS 4
#define NW 2
#define MAXM 64

struct fx {
    struct kvi_writer_pool *pool;
    struct kvi_index *ix;
    struct kvi_producer *p;
};

static int fx_setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->pool = kvi_writer_pool_create(NW, 0);
    assert_non_null(f->pool);
    struct kvi_index_config cfg = {.block_size = BS, .n_parts = NW};
    f->ix = kvi_index_create(&cfg);
    assert_non_null(f->ix);
    f->p = kvi_producer_create(f->pool);
    assert_non_null(f->p);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *f = *state;
    kvi_producer_forget_index(f->p, f->ix);
    kvi_producer_destroy(f->p);
    kvi_writer_pool_destroy(f->pool);
    kvi_index_destroy(f->ix);
    free(f);
    return 0;
}

/* A registration: target + its counters and sink. */
struct reg {
    struct kvi_ingest_target t;
    struct kvi_ingest_counters ctr;
    struct kvi_op_sink sink;
};

static void reg_init(struct reg *r, struct fx *f, uint64_t id, uint32_t rank)
{
    memset(r, 0, sizeof *r);
    int64_t inst = kvi_index_intern_instance(f->ix, id, NULL, false);
    assert_true(inst >= 0);
    r->t.ix = f->ix;
    r->t.instance = (uint32_t)inst;
    r->t.dp_rank = rank;
    r->t.block_size = BS;
    r->t.name = "test";
    r->t.ctr = &r->ctr;
    r->t.sink = &r->sink;
    assert_int_equal(kvi_ingest_target_init(&r->t), 0);
}

static uint64_t ctr(_Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

static uint64_t sink_out(const struct reg *r, enum kvi_op_outcome o)
{
    return __atomic_load_n(&r->sink.outcomes[o], __ATOMIC_RELAXED);
}

/* ---- event builders --------------------------------------------------------- */

static struct kvi_ev ev_base(uint8_t type)
{
    struct kvi_ev e;
    memset(&e, 0, sizeof e);
    e.type = type;
    e.family = KVI_EVF_ARRAY;
    e.tier = KVI_TIER_GPU;
    e.group_idx = -1;
    return e;
}

/* A stored event with flat tokens (nt 0: token_ids = []) and block_size bs. */
static struct kvi_ev ev_stored(const uint64_t *h, uint32_t n, const uint64_t *parent, const uint32_t *tok,
                               uint32_t nt, uint32_t bs)
{
    struct kvi_ev e = ev_base(KVI_EV_STORED);
    e.hashes = h;
    e.n_hashes = n;
    if (parent != NULL) {
        e.has_parent = true;
        e.parent_hash = *parent;
    }
    e.tokens = nt ? tok : NULL;
    e.n_tokens = nt;
    e.tokens_form = nt ? KVI_TOK_FLAT : KVI_TOK_EMPTY;
    e.has_block_size = true;
    e.block_size = bs;
    return e;
}

static struct kvi_ev ev_removed(const uint64_t *h, uint32_t n, enum kvi_tier tier)
{
    struct kvi_ev e = ev_base(KVI_EV_REMOVED);
    e.hashes = h;
    e.n_hashes = n;
    e.tier = (uint8_t)tier;
    return e;
}

/* RFC 1527 stored event (tokens optional, base < 0: absent). */
static struct kvi_ev ev_rfc(const uint64_t *seq, uint32_t n, const uint64_t *parent, int64_t base,
                            const char *backend, enum kvi_tier tier, const uint32_t *tok, uint32_t nt)
{
    struct kvi_ev e = ev_base(KVI_EV_STORED);
    e.family = KVI_EVF_RFC1527;
    e.hashes = seq;
    e.n_hashes = n;
    e.tier = (uint8_t)tier;
    if (parent != NULL) {
        e.has_parent = true;
        e.parent_hash = *parent;
    }
    if (base >= 0) {
        e.has_base_idx = true;
        e.base_block_idx = (uint32_t)base;
    }
    if (backend != NULL) {
        e.backend_id = backend;
        e.backend_len = (uint32_t)strlen(backend);
    }
    e.tokens = tok;
    e.n_tokens = nt;
    e.tokens_form = nt ? KVI_TOK_FLAT : KVI_TOK_ABSENT;
    return e;
}

/* Ingest one batch (rank < 0: the batch has no rank) and wait until applied. */
static size_t feed(struct fx *f, struct reg *r, struct kvi_ev *evs, uint32_t n, int64_t rank)
{
    struct kvi_batch b;
    memset(&b, 0, sizeof b);
    b.ts = 1.0;
    b.events = evs;
    b.n_events = n;
    if (rank >= 0) {
        b.has_dp_rank = true;
        b.dp_rank = (uint32_t)rank;
    }
    size_t ops = kvi_ingest_batch(&r->t, &b, f->p);
    kvi_producer_flush(f->p);
    return ops;
}

static void fill_tokens(uint32_t *tok, uint32_t n, uint32_t first)
{
    for (uint32_t i = 0; i < n; i++)
        tok[i] = first + i;
}

/* Tokens of @p n blocks from @p first (fill_tokens) in tok, their content
 * hashes (base model) in c and, when @p s is not NULL, their seq hashes in s. */
static void chain_hashes(uint32_t *tok, uint32_t n, uint32_t first, uint64_t *c, uint64_t *s)
{
    fill_tokens(tok, n * BS, first);
    kvi_hash_blocks(tok, (size_t)n * BS, BS, KVI_HASH_SEED, c, n);
    if (s != NULL)
        kvi_seq_hashes(c, n, s);
}

/* ---- queries ------------------------------------------------------------------ */

/* Gpu depth of (inst, rank) for a content query (0 when absent). */
static uint32_t depth(struct fx *f, const uint64_t *content, size_t n, uint32_t inst, uint32_t rank)
{
    struct kvi_match m[MAXM];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(f->ix, content, n, m, MAXM);
    kvi_rcu_read_unlock();
    uint32_t d = 0;
    for (size_t i = 0; i < k && i < MAXM; i++)
        if (m[i].instance == inst && m[i].dp_rank == rank)
            d = m[i].depth;
    return d;
}

/* Number of gpu slots matching at least one block. */
static size_t n_matches(struct fx *f, const uint64_t *content, size_t n)
{
    struct kvi_match m[MAXM];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(f->ix, content, n, m, MAXM);
    kvi_rcu_read_unlock();
    return k;
}

/* Tiered row of (inst, rank); false when absent. */
static bool tiered(struct fx *f, const uint64_t *content, size_t n, uint32_t inst, uint32_t rank,
                   struct kvi_tier_match *out)
{
    struct kvi_tier_match m[MAXM];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_tiered(f->ix, content, NULL, n, m, MAXM);
    kvi_rcu_read_unlock();
    for (size_t i = 0; i < k && i < MAXM; i++)
        if (m[i].instance == inst && m[i].dp_rank == rank) {
            *out = m[i];
            return true;
        }
    memset(out, 0, sizeof *out);
    return false;
}

/* ---- tests ---------------------------------------------------------------------- */

static void test_target_init_rules(void **state)
{
    struct fx *f = *state;
    struct kvi_ingest_target t;
    memset(&t, 0, sizeof t);
    assert_int_equal(kvi_ingest_target_init(&t), -EINVAL); /* no index */
    t.ix = f->ix;
    t.block_size = BS + 1;
    assert_int_equal(kvi_ingest_target_init(&t), -EINVAL); /* not the namespace's */
    kvi_ingest_target_fini(&t);                            /* safe after a failed init */
    t.block_size = 0;                                      /* = the index's */
    assert_int_equal(kvi_ingest_target_init(&t), 0);
    assert_int_equal(t.warn_budget, KVI_INGEST_WARN_BUDGET);
    kvi_ingest_target_fini(&t);
    assert_null(t._s);
    kvi_ingest_target_fini(&t);
}

/* Content hashes are kvi_hash_blocks with the LoRA seed; adapters never match base. */
static void test_tokens_base_and_lora(void **state)
{
    struct fx *f = *state;
    struct reg a, l;
    reg_init(&a, f, 1, 0);
    reg_init(&l, f, 2, 0);
    uint32_t tok[3 * BS];
    fill_tokens(tok, 3 * BS, 100);
    uint64_t ha[3] = {0xa1, 0xa2, 0xa3}, hl[3] = {0xb1, 0xb2, 0xb3};

    struct kvi_ev e = ev_stored(ha, 3, NULL, tok, 3 * BS, BS);
    assert_int_equal(feed(f, &a, &e, 1, -1), 1);
    struct kvi_ev el = ev_stored(hl, 3, NULL, tok, 3 * BS, BS);
    el.lora_name = "my-lora-xyz";
    el.lora_len = 7; /* "my-lora": not NUL-terminated on the wire */
    assert_int_equal(feed(f, &l, &el, 1, -1), 1);

    uint64_t base[3], lora[3];
    assert_int_equal(kvi_hash_blocks(tok, 3 * BS, BS, KVI_HASH_SEED, base, 3), 3);
    uint64_t seed = kvi_hash_seed("my-lora", 7, NULL, 0);
    assert_int_equal(seed, 0xb2041cc45cbcfeddull); /* index-semantics.md §1.2 */
    assert_int_equal(kvi_hash_blocks(tok, 3 * BS, BS, seed, lora, 3), 3);
    for (int i = 0; i < 3; i++)
        assert_true(base[i] != lora[i]);

    assert_int_equal(depth(f, base, 3, a.t.instance, 0), 3);
    assert_int_equal(depth(f, base, 3, l.t.instance, 0), 0);
    assert_int_equal(n_matches(f, base, 3), 1);
    assert_int_equal(depth(f, lora, 3, l.t.instance, 0), 3);
    assert_int_equal(depth(f, lora, 3, a.t.instance, 0), 0);
    assert_int_equal(n_matches(f, lora, 3), 1);

    /* an empty lora_name is the base model; the seed cache handles a switch back */
    struct kvi_ev eb = ev_stored(hl, 3, NULL, tok, 3 * BS, BS);
    eb.lora_name = "";
    eb.lora_len = 0;
    struct reg b;
    reg_init(&b, f, 3, 0);
    feed(f, &b, &eb, 1, -1);
    assert_int_equal(depth(f, base, 3, b.t.instance, 0), 3);

    assert_int_equal(ctr(&a.ctr.events_stored), 1);
    assert_int_equal(ctr(&a.ctr.blocks_submitted), 3);
    assert_int_equal(ctr(&a.ctr.batches), 1);
    assert_int_equal(a.sink.blocks_stored, 3);
    assert_int_equal(sink_out(&a, KVI_OUT_APPLIED), 1);
    kvi_ingest_target_fini(&a.t);
    kvi_ingest_target_fini(&l.t);
    kvi_ingest_target_fini(&b.t);
}

/* Pair tokens: windows of BS + 1 with stride BS (kvi_hash_blocks_eagle). */
static void test_eagle_pairs(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[2 * BS + 1];
    fill_tokens(tok, 2 * BS + 1, 10);
    uint64_t h[2] = {21, 22};
    struct kvi_ev e = ev_stored(h, 2, NULL, tok, 2 * BS + 1, BS);
    e.tokens_form = KVI_TOK_PAIRS;
    feed(f, &r, &e, 1, 0);

    uint64_t eagle[2], flat[2];
    assert_int_equal(kvi_hash_blocks_eagle(tok, 2 * BS + 1, BS, KVI_HASH_SEED, eagle, 2), 2);
    assert_int_equal(kvi_hash_blocks(tok, 2 * BS + 1, BS, KVI_HASH_SEED, flat, 2), 2);
    assert_true(eagle[0] != flat[0]);
    assert_int_equal(depth(f, eagle, 2, r.t.instance, 0), 2);
    assert_int_equal(depth(f, flat, 2, r.t.instance, 0), 0);

    /* 2 * BS pair-flattened tokens only hold one window: the second is dropped */
    uint64_t h2[2] = {31, 32};
    struct kvi_ev s = ev_stored(h2, 2, NULL, tok, 2 * BS, BS);
    s.tokens_form = KVI_TOK_PAIRS;
    struct reg r2;
    reg_init(&r2, f, 2, 0);
    feed(f, &r2, &s, 1, 0);
    assert_int_equal(depth(f, eagle, 2, r2.t.instance, 0), 1);
    assert_int_equal(ctr(&r2.ctr.tokens_short), 1);
    assert_int_equal(ctr(&r2.ctr.blocks_dropped), 1);
    kvi_ingest_target_fini(&r.t);
    kvi_ingest_target_fini(&r2.t);
}

/* The reference vectors of index-semantics.md §1.2 through a block-size-2 namespace. */
static void test_eagle_reference_vectors(void **state)
{
    struct fx *f = *state;
    struct kvi_index_config cfg = {.block_size = 2, .n_parts = NW};
    struct kvi_index *ix2 = kvi_index_create(&cfg);
    assert_non_null(ix2);
    struct reg r;
    memset(&r, 0, sizeof r);
    r.t.ix = ix2;
    r.t.instance = (uint32_t)kvi_index_intern_instance(ix2, 5, NULL, false);
    r.t.ctr = &r.ctr;
    assert_int_equal(kvi_ingest_target_init(&r.t), 0);
    uint32_t tok[5] = {10, 11, 12, 13, 14}; /* pairs (10,11)..(13,14), flattened */
    uint64_t h[2] = {21, 22};
    struct kvi_ev e = ev_stored(h, 2, NULL, tok, 5, 2);
    e.tokens_form = KVI_TOK_PAIRS;
    struct kvi_batch b = {.events = &e, .n_events = 1};
    assert_int_equal(kvi_ingest_batch(&r.t, &b, f->p), 1);
    kvi_producer_flush(f->p);
    uint64_t want[2] = {0x52b31cbfa97a7586ull, 0xc125dbec4fa7efdcull};
    struct kvi_match m[4];
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(ix2, want, 2, m, 4);
    kvi_rcu_read_unlock();
    assert_int_equal(k, 1);
    assert_int_equal(m[0].depth, 2);
    kvi_ingest_target_fini(&r.t);
    kvi_producer_forget_index(f->p, ix2);
    kvi_index_destroy(ix2);
}

/* Blocks with multimodal hashes use kvi_hash_block_mm. */
static void test_multimodal(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[3 * BS];
    fill_tokens(tok, 3 * BS, 500);
    uint64_t h[3] = {1, 2, 3};
    uint64_t mm[3] = {0x0123456789abcdefull, 0x42, 0x7};
    uint32_t off[4] = {0, 0, 2, 3}; /* block 1: two hashes, block 2: one */
    struct kvi_ev e = ev_stored(h, 3, NULL, tok, 3 * BS, BS);
    e.mm = mm;
    e.mm_off = off;
    feed(f, &r, &e, 1, -1);

    uint64_t c[3];
    c[0] = kvi_hash_block(tok, BS, KVI_HASH_SEED);
    uint64_t mm_rev[2] = {0x42, 0x0123456789abcdefull}; /* order does not matter */
    c[1] = kvi_hash_block_mm(tok + BS, BS, mm_rev, 2, KVI_HASH_SEED);
    c[2] = kvi_hash_block_mm(tok + 2 * BS, BS, mm + 2, 1, KVI_HASH_SEED);
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 3);
    uint64_t plain[3];
    kvi_hash_blocks(tok, 3 * BS, BS, KVI_HASH_SEED, plain, 3);
    assert_int_equal(plain[0], c[0]);
    assert_int_equal(depth(f, plain, 3, r.t.instance, 0), 1); /* text-only query stops at the image */
    kvi_ingest_target_fini(&r.t);
}

/* Dynamo's conversion rule: stop at the first block-size mismatch; warn at most 3 times. */
static void test_block_size_mismatch(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[3 * BS];
    uint64_t h[3] = {11, 12, 13};
    uint64_t c[3];
    chain_hashes(tok, 3, 1, c, NULL);

    /* event block_size differs: zero blocks, even with enough tokens */
    struct kvi_ev e = ev_stored(h, 3, NULL, tok, 3 * BS, BS / 2);
    assert_int_equal(feed(f, &r, &e, 1, -1), 0);
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 0);
    assert_int_equal(ctr(&r.ctr.block_size_mismatch), 1);
    assert_int_equal(ctr(&r.ctr.blocks_dropped), 3);
    assert_int_equal(r.t.warn_budget, KVI_INGEST_WARN_BUDGET - 1);

    /* tokens run out inside block 2: the first two are stored */
    e = ev_stored(h, 3, NULL, tok, 3 * BS - 1, BS);
    assert_int_equal(feed(f, &r, &e, 1, -1), 1);
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 2);
    assert_int_equal(ctr(&r.ctr.tokens_short), 1);
    assert_int_equal(ctr(&r.ctr.blocks_dropped), 4);

    /* absent block_size is fine; fewer tokens than one block stores nothing */
    e = ev_stored(h, 3, NULL, tok, BS - 1, BS);
    e.has_block_size = false;
    assert_int_equal(feed(f, &r, &e, 1, -1), 0);
    assert_int_equal(ctr(&r.ctr.tokens_short), 2);
    /* the budget is spent: warnings stop, counting goes on */
    e = ev_stored(h, 3, NULL, tok, 3 * BS, BS + 1);
    feed(f, &r, &e, 1, -1);
    assert_int_equal(r.t.warn_budget, 0);
    assert_int_equal(ctr(&r.ctr.block_size_mismatch), 2);
    kvi_ingest_target_fini(&r.t);
}

/* The batch's rank overrides the registered one; no rank means the registered one. */
static void test_batch_rank(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 9, 2);
    uint32_t tok[2 * BS];
    uint64_t h[2] = {5, 6};
    uint64_t c[2];
    chain_hashes(tok, 2, 40, c, NULL);
    struct kvi_ev e = ev_stored(h, 2, NULL, tok, 2 * BS, BS);
    feed(f, &r, &e, 1, 7);
    assert_int_equal(depth(f, c, 2, r.t.instance, 7), 2);
    assert_int_equal(depth(f, c, 2, r.t.instance, 2), 0);
    feed(f, &r, &e, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 2), 2);
    assert_int_equal(n_matches(f, c, 2), 2);
    kvi_ingest_target_fini(&r.t);
}

/* Parents chain within a batch and across batches; an unknown parent is rejected and counted. */
static void test_parent_chains(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[6 * BS];
    uint64_t c[6];
    chain_hashes(tok, 6, 1000, c, NULL);
    uint64_t h[6] = {0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6};

    /* batch 1: [0,1] at the root, then [2] under 1 (one page per event, SGLang) */
    struct kvi_ev evs[2] = {ev_stored(h, 2, NULL, tok, 2 * BS, BS),
                            ev_stored(h + 2, 1, &h[1], tok + 2 * BS, BS, BS)};
    assert_int_equal(feed(f, &r, evs, 2, -1), 2);
    assert_int_equal(depth(f, c, 6, r.t.instance, 0), 3);
    /* batch 2: [3,4] under 2 */
    struct kvi_ev e = ev_stored(h + 3, 2, &h[2], tok + 3 * BS, 2 * BS, BS);
    feed(f, &r, &e, 1, -1);
    assert_int_equal(depth(f, c, 6, r.t.instance, 0), 5);
    /* [5] under an unknown parent: rejected */
    uint64_t bogus = 0xdead;
    e = ev_stored(h + 5, 1, &bogus, tok + 5 * BS, BS, BS);
    feed(f, &r, &e, 1, -1);
    assert_int_equal(depth(f, c, 6, r.t.instance, 0), 5);
    assert_int_equal(sink_out(&r, KVI_OUT_PARENT_NOT_FOUND), 1);
    assert_int_equal(sink_out(&r, KVI_OUT_APPLIED), 3);
    struct kvi_index_stats st;
    kvi_index_stats(f->ix, &st);
    assert_int_equal(st.parent_not_found, 1);
    kvi_rcu_read_lock();
    assert_int_equal(kvi_index_tree_size(f->ix, r.t.instance, 0), 5);
    kvi_rcu_read_unlock();
    kvi_ingest_target_fini(&r.t);
}

/* Token-less placeholders resolve through blocks the worker holds on another tier. */
static void test_placeholders(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[3 * BS];
    uint64_t c[3];
    chain_hashes(tok, 3, 77, c, NULL);
    uint64_t h[3] = {0x101, 0x102, 0x103};

    struct kvi_ev evs[4];
    evs[0] = ev_stored(h, 3, NULL, tok, 3 * BS, BS);
    evs[1] = ev_stored(h, 2, NULL, NULL, 0, 0); /* token_ids [], block_size 0, medium CPU */
    evs[1].tier = KVI_TIER_CPU;
    evs[2] = ev_stored(h + 2, 1, &h[1], NULL, 0, BS); /* token_ids nil on disk */
    evs[2].tokens_form = KVI_TOK_ABSENT;
    evs[2].tier = KVI_TIER_DISK;
    /* block_size 0 makes tokens unusable: resolved by hash, not a mismatch */
    evs[3] = ev_stored(h + 2, 1, &h[1], tok + 2 * BS, BS, 0);
    evs[3].tier = KVI_TIER_CPU;
    assert_int_equal(feed(f, &r, evs, 4, -1), 4);
    assert_int_equal(ctr(&r.ctr.placeholders), 3);
    assert_int_equal(ctr(&r.ctr.block_size_mismatch), 0);

    /* the gpu copies go away: the lower tiers still serve the prefix */
    struct kvi_ev rm = ev_removed(h, 1, KVI_TIER_GPU);
    feed(f, &r, &rm, 1, -1);
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 0);
    struct kvi_tier_match m;
    assert_true(tiered(f, c, 3, r.t.instance, 0, &m));
    assert_int_equal(m.gpu, 0);
    assert_int_equal(m.cpu, 3);
    assert_int_equal(m.disk, 3);
    assert_int_equal(sink_out(&r, KVI_OUT_UNKNOWN_BLOCK), 0);

    /* unresolvable placeholder hashes are counted by the writer, per hash */
    uint64_t unknown[2] = {0x999, 0x998};
    struct kvi_ev u = ev_stored(unknown, 2, NULL, NULL, 0, 0);
    u.tier = KVI_TIER_CPU;
    feed(f, &r, &u, 1, -1);
    assert_int_equal(sink_out(&r, KVI_OUT_UNKNOWN_BLOCK), 2);
    struct kvi_index_stats st;
    kvi_index_stats(f->ix, &st);
    assert_int_equal(st.unknown_blocks, 2);

    /* removing a cpu placeholder on its tier */
    rm = ev_removed(h, 1, KVI_TIER_CPU);
    feed(f, &r, &rm, 1, -1);
    (void)tiered(f, c, 3, r.t.instance, 0, &m); /* absent (no hit) or zero */
    assert_int_equal(m.cpu, 0);
    assert_int_equal(m.disk, 0);
    kvi_ingest_target_fini(&r.t);
}

/* RFC 1527 with tokens, into a shared pool another instance reaches through find_tiered. */
static void test_rfc1527_tokens_shared_pool(void **state)
{
    struct fx *f = *state;
    struct reg gpu, mc;
    reg_init(&gpu, f, 1, 0);
    reg_init(&mc, f, 50, 0); /* the Mooncake master's registration */
    uint32_t tok[4 * BS];
    uint64_t c[4], s[4];
    chain_hashes(tok, 4, 3000, c, s);

    /* worker 1 holds block 0 on its gpu */
    uint64_t h0 = 0x77;
    struct kvi_ev e = ev_stored(&h0, 1, NULL, tok, BS, BS);
    feed(f, &gpu, &e, 1, -1);
    /* the pool holds blocks 0..2 (root run) then 3 under seq[2] */
    struct kvi_ev evs[2] = {ev_rfc(s, 3, NULL, 0, "store-A", KVI_TIER_CPU, tok, 3 * BS),
                            ev_rfc(s + 3, 1, &s[2], 3, "store-A", KVI_TIER_CPU, tok + 3 * BS, BS)};
    assert_int_equal(feed(f, &mc, evs, 2, -1), 2);
    assert_int_equal(ctr(&mc.ctr.events_rfc1527), 2);

    int64_t pool = kvi_index_find_instance(f->ix, 0, "store-A");
    assert_true(pool >= 0);
    bool shared = false;
    assert_int_equal(kvi_index_instance_info(f->ix, (uint32_t)pool, NULL, NULL, &shared), 0);
    assert_true(shared);

    struct kvi_tier_match m;
    assert_true(tiered(f, c, 4, gpu.t.instance, 0, &m));
    assert_int_equal(m.gpu, 1);
    assert_int_equal(m.cpu, 4);
    assert_int_equal(m.disk, 4);
    /* an instance without blocks reaches the pool alone */
    uint32_t pc = 0, pd = 0;
    kvi_rcu_read_lock();
    kvi_index_pool_depths(f->ix, c, NULL, 4, &pc, &pd);
    kvi_rcu_read_unlock();
    assert_int_equal(pc, 4);
    assert_int_equal(pd, 4);
    /* nothing landed on the registration's own instance or on any gpu */
    assert_int_equal(n_matches(f, c, 4), 1);

    /* removes by seq hash under the pool; descendants go with it */
    struct kvi_ev rm = ev_removed(&s[2], 1, KVI_TIER_CPU);
    rm.family = KVI_EVF_RFC1527;
    rm.backend_id = "store-A";
    rm.backend_len = 7;
    feed(f, &mc, &rm, 1, -1);
    kvi_rcu_read_lock();
    kvi_index_pool_depths(f->ix, c, NULL, 4, &pc, &pd);
    kvi_rcu_read_unlock();
    assert_int_equal(pc, 2);
    kvi_ingest_target_fini(&gpu.t);
    kvi_ingest_target_fini(&mc.t);
}

/* A Mooncake store: node-1 holds blocks 0..6 on cpu, node-2 blocks 7..8 on
 * disk under node-1's block 6 (parent_hash = its seq hash, base_block_idx 7).
 * The seq hash names the whole prefix, so node-2's run is placed by position
 * (with and without tokens) and the pool reaches 9 blocks; without a
 * base_block_idx, or on the gpu tier, an unknown parent is still rejected. */
static void test_rfc1527_parent_on_other_backend(void **state)
{
    struct fx *f = *state;
    for (int with_tokens = 0; with_tokens < 2; with_tokens++) {
        struct reg mc;
        reg_init(&mc, f, 50 + (uint64_t)with_tokens, 0);
        uint32_t tok[9 * BS];
        uint64_t c[9], s[9];
        chain_hashes(tok, 9, 12000 + 1000 * (uint32_t)with_tokens, c, s);
        const uint32_t *t1 = with_tokens ? tok : NULL, *t2 = with_tokens ? tok + 7 * BS : NULL;
        struct kvi_ev evs[2] = {ev_rfc(s, 7, NULL, 0, "node-1", KVI_TIER_CPU, t1, with_tokens ? 7 * BS : 0),
                                ev_rfc(s + 7, 2, &s[6], 7, "node-2", KVI_TIER_DISK, t2, with_tokens ? 2 * BS : 0)};
        struct kvi_index_stats before, after;
        kvi_index_stats(f->ix, &before);
        assert_int_equal(feed(f, &mc, evs, 2, -1), 2);
        assert_int_equal(sink_out(&mc, KVI_OUT_APPLIED), 2);
        assert_int_equal(sink_out(&mc, KVI_OUT_PARENT_NOT_FOUND), 0);
        kvi_index_stats(f->ix, &after);
        assert_int_equal(after.parent_elsewhere, before.parent_elsewhere + 1);
        uint32_t pc = 0, pd = 0;
        kvi_rcu_read_lock();
        kvi_index_pool_depths(f->ix, c, NULL, 9, &pc, &pd);
        kvi_rcu_read_unlock();
        assert_int_equal(pc, 7);
        assert_int_equal(pd, 9); /* cumulative: node-1's cpu run, then node-2's disk run */

        /* still rejected: no base_block_idx, and the gpu tier */
        struct kvi_ev no_base = ev_rfc(s + 7, 2, &s[6], -1, "node-3", KVI_TIER_DISK, NULL, 0);
        struct kvi_ev gpu = ev_rfc(s + 7, 2, &s[6], 7, "node-3", KVI_TIER_GPU, NULL, 0);
        feed(f, &mc, &no_base, 1, -1);
        feed(f, &mc, &gpu, 1, -1);
        assert_int_equal(sink_out(&mc, KVI_OUT_PARENT_NOT_FOUND), 2);
        kvi_index_stats(f->ix, &after);
        assert_int_equal(after.parent_not_found, before.parent_not_found + 2);
        kvi_ingest_target_fini(&mc.t);
    }
}

/* RFC 1527 without tokens: STORE_SEQ_ONLY, resolved or placed by seq hash. */
static void test_rfc1527_seq_only(void **state)
{
    struct fx *f = *state;
    struct reg w, mc;
    reg_init(&w, f, 1, 0);
    reg_init(&mc, f, 50, 0);
    uint32_t tok[6 * BS];
    uint64_t c[6], s[6];
    chain_hashes(tok, 6, 9000, c, s);

    /* worker holds blocks 0..1 on gpu (content known there) */
    uint64_t h[2] = {0xe0, 0xe1};
    struct kvi_ev e = ev_stored(h, 2, NULL, tok, 2 * BS, BS);
    feed(f, &w, &e, 1, -1);
    /* pool: 0..2 token-less at the root, 3 under seq[2], and 5 placed at depth 5 */
    struct kvi_ev evs[3] = {ev_rfc(s, 3, NULL, 0, "pool-B", KVI_TIER_DISK, NULL, 0),
                            ev_rfc(s + 3, 1, &s[2], -1, "pool-B", KVI_TIER_DISK, NULL, 0),
                            ev_rfc(s + 5, 1, NULL, 5, "pool-B", KVI_TIER_DISK, NULL, 0)};
    assert_int_equal(feed(f, &mc, evs, 3, -1), 3);
    assert_int_equal(ctr(&mc.ctr.seq_only), 3);
    assert_int_equal(sink_out(&mc, KVI_OUT_APPLIED), 3);

    struct kvi_tier_match m;
    assert_true(tiered(f, c, 6, w.t.instance, 0, &m));
    assert_int_equal(m.gpu, 2);
    assert_int_equal(m.cpu, 2);
    assert_int_equal(m.disk, 4); /* block 4 is missing: 5 is not reachable */

    /* a token-less gpu run at depth > 0 without a parent cannot be placed */
    struct kvi_ev bad = ev_rfc(s + 4, 1, NULL, 4, NULL, KVI_TIER_GPU, NULL, 0);
    feed(f, &mc, &bad, 1, -1);
    assert_int_equal(sink_out(&mc, KVI_OUT_INVALID), 1);

    /* a cleared event without backend_id clears the registration and its pools */
    struct kvi_ev clr = ev_base(KVI_EV_CLEARED);
    clr.family = KVI_EVF_RFC1527;
    feed(f, &mc, &clr, 1, -1);
    assert_true(tiered(f, c, 6, w.t.instance, 0, &m));
    assert_int_equal(m.disk, 2);
    kvi_ingest_target_fini(&w.t);
    kvi_ingest_target_fini(&mc.t);
}

/* RFC 1527 with tokens placed at a depth with no parent (lower tier). */
static void test_rfc1527_tokens_placed(void **state)
{
    struct fx *f = *state;
    struct reg w, mc;
    reg_init(&w, f, 1, 0);
    reg_init(&mc, f, 50, 0);
    uint32_t tok[3 * BS];
    uint64_t c[3], s[3];
    chain_hashes(tok, 3, 123, c, s);
    uint64_t h0 = 0x55;
    struct kvi_ev e = ev_stored(&h0, 1, NULL, tok, BS, BS);
    feed(f, &w, &e, 1, -1);
    struct kvi_ev p = ev_rfc(s + 1, 2, NULL, 1, "pool-C", KVI_TIER_CPU, tok + BS, 2 * BS);
    feed(f, &mc, &p, 1, -1);
    assert_int_equal(sink_out(&mc, KVI_OUT_APPLIED), 1);
    struct kvi_tier_match m;
    assert_true(tiered(f, c, 3, w.t.instance, 0, &m));
    assert_int_equal(m.gpu, 1);
    assert_int_equal(m.cpu, 3);
    kvi_ingest_target_fini(&w.t);
    kvi_ingest_target_fini(&mc.t);
}

/* Removes cascade; cleared drops the rank whose stream carried it (the batch's,
 * else the registration's) and keeps the slots; other ranks keep their blocks. */
static void test_remove_and_clear(void **state)
{
    struct fx *f = *state;
    struct reg r, other;
    reg_init(&r, f, 1, 0);
    reg_init(&other, f, 2, 0);
    uint32_t tok[3 * BS];
    uint64_t c[3];
    chain_hashes(tok, 3, 60, c, NULL);
    uint64_t h[3] = {1, 2, 3};
    struct kvi_ev e = ev_stored(h, 3, NULL, tok, 3 * BS, BS);
    feed(f, &r, &e, 1, 0);
    feed(f, &r, &e, 1, 1);
    feed(f, &other, &e, 1, -1);

    struct kvi_ev rm = ev_removed(&h[1], 1, KVI_TIER_GPU);
    feed(f, &r, &rm, 1, 1);
    assert_int_equal(depth(f, c, 3, r.t.instance, 1), 1);
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 3);
    uint64_t nope = 0x4242;
    rm = ev_removed(&nope, 1, KVI_TIER_GPU);
    feed(f, &r, &rm, 1, 0);
    assert_int_equal(ctr(&r.ctr.hashes_remove_submitted), 2);
    assert_int_equal(r.sink.hashes_removed, 1);

    struct kvi_index_stats before, after;
    kvi_index_stats(f->ix, &before);
    struct kvi_ev clr = ev_base(KVI_EV_CLEARED);
    feed(f, &r, &clr, 1, 0); /* rank 0's publisher clears rank 0 only */
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 0);
    assert_int_equal(depth(f, c, 3, r.t.instance, 1), 1);
    assert_int_equal(depth(f, c, 3, other.t.instance, 0), 3);
    kvi_index_stats(f->ix, &after);
    assert_int_equal(after.slots, before.slots);
    assert_int_equal(ctr(&r.ctr.events_cleared), 1);
    feed(f, &r, &clr, 1, 1); /* then rank 1's */
    assert_int_equal(depth(f, c, 3, r.t.instance, 1), 0);
    feed(f, &r, &clr, 1, -1); /* a batch without a rank: the registration's (0) */
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 0);
    assert_int_equal(ctr(&r.ctr.events_cleared), 3);
    /* clear then re-store works */
    feed(f, &r, &e, 1, 0);
    assert_int_equal(depth(f, c, 3, r.t.instance, 0), 3);
    kvi_ingest_target_fini(&r.t);
    kvi_ingest_target_fini(&other.t);
}

/* Only group 0 (or nil) is indexed; other groups' stores and removes are skipped. */
static void test_group_filter(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[2 * BS];
    uint64_t c[2];
    chain_hashes(tok, 2, 7, c, NULL);
    uint64_t h[2] = {8, 9};
    struct kvi_ev e = ev_stored(h, 2, NULL, tok, 2 * BS, BS);
    e.group_idx = 1;
    assert_int_equal(feed(f, &r, &e, 1, -1), 0);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 0);
    assert_int_equal(ctr(&r.ctr.group_skipped), 1);
    e.group_idx = 0;
    feed(f, &r, &e, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 2);
    /* the same hash removed in group 1 leaves group 0's block alone */
    struct kvi_ev rm = ev_removed(h, 1, KVI_TIER_GPU);
    rm.group_idx = 1;
    feed(f, &r, &rm, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 2);
    assert_int_equal(ctr(&r.ctr.group_skipped), 2);
    rm.group_idx = -1;
    feed(f, &r, &rm, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 0);
    /* a target may index another group */
    r.t.group = 3;
    e.group_idx = 3;
    feed(f, &r, &e, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 2);
    kvi_ingest_target_fini(&r.t);
}

/* A hybrid model: the first full_attention group is the indexed one, whatever its number. */
static void test_full_attention_group(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[2 * BS];
    uint64_t c[2];
    chain_hashes(tok, 2, 70, c, NULL);
    uint64_t h[2] = {0x61, 0x62};
    /* one batch: the sliding-window group 0 first, then full attention in group 1 */
    struct kvi_ev evs[2] = {ev_stored(h, 2, NULL, tok, 2 * BS, BS), ev_stored(h, 2, NULL, tok, 2 * BS, BS)};
    evs[0].group_idx = 0;
    evs[0].spec_kind = "sliding_window";
    evs[0].spec_kind_len = 14;
    evs[1].group_idx = 1;
    evs[1].spec_kind = "FULL_ATTENTION";
    evs[1].spec_kind_len = 14;
    feed(f, &r, evs, 2, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 2);
    /* group 0 is no longer indexed: its removes leave the block alone */
    struct kvi_ev rm = ev_removed(&h[1], 1, KVI_TIER_GPU);
    rm.group_idx = 0;
    feed(f, &r, &rm, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 2);
    assert_int_equal(ctr(&r.ctr.group_skipped), 1);
    rm.group_idx = 1;
    feed(f, &r, &rm, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 1);
    /* a later full_attention group does not move the latch */
    struct kvi_ev e2 = ev_stored(h, 2, NULL, tok, 2 * BS, BS);
    e2.group_idx = 2;
    e2.spec_kind = "full_attention";
    e2.spec_kind_len = 14;
    feed(f, &r, &e2, 1, -1);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 1);
    assert_int_equal(ctr(&r.ctr.group_skipped), 2);
    kvi_ingest_target_fini(&r.t);
}

/* cache_salt joins the seed (kvi_hash_seed(lora, salt)); the seed cache follows switches. */
static void test_cache_salt(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[BS];
    fill_tokens(tok, BS, 4242);
    uint64_t plain, sa, sb, lsa;
    kvi_hash_blocks(tok, BS, BS, KVI_HASH_SEED, &plain, 1);
    kvi_hash_blocks(tok, BS, BS, kvi_hash_seed(NULL, 0, "salt-A", 6), &sa, 1);
    kvi_hash_blocks(tok, BS, BS, kvi_hash_seed(NULL, 0, "salt-B", 6), &sb, 1);
    kvi_hash_blocks(tok, BS, BS, kvi_hash_seed("lo", 2, "salt-A", 6), &lsa, 1);
    assert_true(plain != sa && sa != sb && sa != lsa);

    uint64_t h[4] = {1, 2, 3, 4};
    struct kvi_ev evs[4];
    for (int i = 0; i < 4; i++)
        evs[i] = ev_stored(&h[i], 1, NULL, tok, BS, BS);
    evs[0].cache_salt = "salt-A";
    evs[0].salt_len = 6;
    evs[1].cache_salt = "salt-B";
    evs[1].salt_len = 6;
    evs[2].cache_salt = "salt-A";
    evs[2].salt_len = 6;
    evs[2].lora_name = "lo";
    evs[2].lora_len = 2;
    evs[3].cache_salt = "salt-Bxx";
    evs[3].salt_len = 6; /* "salt-B" again, other bytes past the length */
    /* each on its own rank, to tell them apart */
    for (int i = 0; i < 4; i++)
        feed(f, &r, &evs[i], 1, i);
    assert_int_equal(depth(f, &sa, 1, r.t.instance, 0), 1);
    assert_int_equal(depth(f, &sb, 1, r.t.instance, 1), 1);
    assert_int_equal(depth(f, &lsa, 1, r.t.instance, 2), 1);
    assert_int_equal(depth(f, &sb, 1, r.t.instance, 3), 1);
    assert_int_equal(n_matches(f, &plain, 1), 0);
    assert_int_equal(n_matches(f, &sa, 1), 1);
    kvi_ingest_target_fini(&r.t);
}

/* Unknown media are indexed as gpu and counted; skip_tiers filters tiers. */
static void test_medium_and_skip_tiers(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[BS];
    fill_tokens(tok, BS, 300);
    uint64_t c;
    kvi_hash_blocks(tok, BS, BS, KVI_HASH_SEED, &c, 1);
    uint64_t h = 0x31;
    struct kvi_ev e = ev_stored(&h, 1, NULL, tok, BS, BS);
    e.medium_unknown = true;
    feed(f, &r, &e, 1, -1);
    assert_int_equal(ctr(&r.ctr.unknown_medium), 1);
    assert_int_equal(depth(f, &c, 1, r.t.instance, 0), 1);

    r.t.skip_tiers = 1u << KVI_TIER_CPU;
    struct kvi_ev cpu = ev_stored(&h, 1, NULL, tok, BS, BS);
    cpu.tier = KVI_TIER_CPU;
    assert_int_equal(feed(f, &r, &cpu, 1, -1), 0);
    assert_int_equal(ctr(&r.ctr.tier_skipped), 1);
    struct kvi_tier_match m;
    assert_true(tiered(f, &c, 1, r.t.instance, 0, &m));
    assert_int_equal(m.gpu, 1);
    struct kvi_ev rm = ev_removed(&h, 1, KVI_TIER_GPU);
    feed(f, &r, &rm, 1, -1);
    assert_false(tiered(f, &c, 1, r.t.instance, 0, &m)); /* nothing on cpu either */
    kvi_ingest_target_fini(&r.t);
}

/* Publisher restart: one rank (and the target's pools' rank) goes; kvi_ingest_clear drops all. */
static void test_reset_rank_and_clear(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    uint32_t tok[2 * BS];
    uint64_t c[2], s[2];
    chain_hashes(tok, 2, 900, c, s);
    uint64_t h[2] = {4, 5};
    struct kvi_ev e = ev_stored(h, 2, NULL, tok, 2 * BS, BS);
    feed(f, &r, &e, 1, 0);
    feed(f, &r, &e, 1, 1);
    struct kvi_ev pe = ev_rfc(s, 2, NULL, 0, "pool-R", KVI_TIER_CPU, NULL, 0);
    feed(f, &r, &pe, 1, 1);

    kvi_ingest_reset_rank(&r.t, 1, f->p);
    kvi_producer_flush(f->p);
    assert_int_equal(depth(f, c, 2, r.t.instance, 1), 0);
    assert_int_equal(depth(f, c, 2, r.t.instance, 0), 2);
    uint32_t pc = 9, pd = 9;
    kvi_rcu_read_lock();
    kvi_index_pool_depths(f->ix, c, NULL, 2, &pc, &pd);
    kvi_rcu_read_unlock();
    assert_int_equal(pc, 0);

    feed(f, &r, &e, 1, 1);
    kvi_ingest_clear(&r.t, f->p);
    kvi_producer_flush(f->p);
    assert_int_equal(n_matches(f, c, 2), 0);
    kvi_ingest_target_fini(&r.t);
}

/* Batches longer than one burst keep their order and count their ops. */
static void test_many_events(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    enum { N = 3 * KVI_INGEST_BURST + 5 };
    static uint32_t tok[N * BS];
    static uint64_t h[N], c[N];
    fill_tokens(tok, N * BS, 1);
    for (uint32_t i = 0; i < N; i++)
        h[i] = 0x1000 + i;
    kvi_hash_blocks(tok, N * BS, BS, KVI_HASH_SEED, c, N);
    static struct kvi_ev evs[N + 1];
    for (uint32_t i = 0; i < N; i++)
        evs[i] = ev_stored(&h[i], 1, i ? &h[i - 1] : NULL, tok + i * BS, BS, BS);
    evs[N] = ev_removed(&h[N - 1], 1, KVI_TIER_GPU); /* applied after the store it names */
    assert_int_equal(feed(f, &r, evs, N + 1, -1), N + 1);
    assert_int_equal(depth(f, c, N, r.t.instance, 0), N - 1);
    assert_int_equal(ctr(&r.ctr.ops_submitted), N + 1);
    assert_int_equal(sink_out(&r, KVI_OUT_APPLIED), N + 1);
    kvi_ingest_target_fini(&r.t);
}

/* Decoder counts are carried over; events without hashes do nothing. */
static void test_decoder_counts_and_empty(void **state)
{
    struct fx *f = *state;
    struct reg r;
    reg_init(&r, f, 1, 0);
    struct kvi_ev e = ev_stored(NULL, 0, NULL, NULL, 0, BS);
    struct kvi_batch b = {.events = &e, .n_events = 1, .n_unknown = 2, .n_invalid = 3};
    assert_int_equal(kvi_ingest_batch(&r.t, &b, f->p), 0);
    assert_int_equal(ctr(&r.ctr.events_unknown), 2);
    assert_int_equal(ctr(&r.ctr.events_invalid), 3);
    assert_int_equal(ctr(&r.ctr.events_stored), 1);
    b.n_events = 0;
    assert_int_equal(kvi_ingest_batch(&r.t, &b, f->p), 0);
    assert_int_equal(ctr(&r.ctr.batches), 2);
    kvi_ingest_target_fini(&r.t);
}

int main(void)
{
    kvi_rcu_register_thread();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_target_init_rules, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_base_and_lora, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_eagle_pairs, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_eagle_reference_vectors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_multimodal, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_block_size_mismatch, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_batch_rank, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_parent_chains, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_placeholders, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rfc1527_tokens_shared_pool, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rfc1527_seq_only, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rfc1527_parent_on_other_backend, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rfc1527_tokens_placed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_remove_and_clear, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_group_filter, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_full_attention_group, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cache_salt, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_medium_and_skip_tiers, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_reset_rank_and_clear, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_many_events, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_decoder_counts_and_empty, fx_setup, fx_teardown),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    kvi_rcu_unregister_thread();
    return r;
}
