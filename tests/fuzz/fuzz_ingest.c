/*
 * Fuzz target: the ingest conversion (net/ingest.h, kvi_ingest_batch) with
 * real writer threads and a live index.
 *
 * INPUT: 2 selector bytes, then one ZMQ payload frame (as fuzz_decode):
 *   byte 0  bits 0-2  the target (below)
 *           bits 3-4  the target's registered dp_rank (used when the batch
 *                     has no rank)
 *           bits 5-6  skip_tiers: none, all but gpu, gpu, external
 *           bit 7     start from fresh indexes (drop every earlier input's
 *                     state first: a recorded input with it set reproduces
 *                     alone)
 *   byte 1  bits 0-1  the target's `group`; bit 2: pub_applied
 * A frame that kvi_decode_batch rejects is skipped (fuzz_decode covers it).
 *
 * STATE: one writer pool of 2 writers, four indexes (n_parts 2, block sizes
 * 1, 2, 4 and 16: the decoder fixtures use all four, fixed key seeds), and
 * eight targets on them: numeric instances (Dynamo) and string ones
 * (Mooncake), two of them sharing the bs 4 and bs 16 indexes with a third.
 * RFC 1527 events with a backend_id store into shared pools. The state
 * carries over from input to input (the fuzzer explores sequences of
 * batches), and everything is rebuilt every RESET_EVERY inputs, when an index
 * grows past its bound, or on the fresh bit; so a finding may need the
 * inputs before it (set its fresh bit to check whether it reproduces alone).
 *
 * CHECKS, after kvi_ingest_batch and kvi_producer_flush (writers idle):
 *   - return value = ops_submitted delta; the sink's outcomes add up to the
 *     ops (APPLIED + PARENT_NOT_FOUND + INVALID); blocks stored, unknown
 *     blocks and known removed hashes are bounded by what was submitted; the
 *     applied position is unchanged or one of the batch's two values;
 *   - the decode-side counters: one batch; stored/removed/cleared/RFC 1527
 *     events exactly as in the batch; unknown = n_unknown; invalid within
 *     [n_invalid, n_invalid + n_events]; skips, mismatches, placeholders and
 *     token-less stores bounded by the events, blocks by the hashes;
 *   - kvi_index_stats: cumulative counters never go back; parent_not_found,
 *     invalid_events and unknown_blocks deltas equal the sink's (only this
 *     target wrote to its index);
 *   - queries (RCU read section), for the content chain of every stored
 *     event with usable tokens (hashed as net/ingest.h says), its standard
 *     seq hashes, its raw hashes, and random hashes from the input:
 *     find_matches gives 1 <= depth <= n <= tree_size, distinct slots whose
 *     slot_info agrees (gpu tier); find_tiered gives gpu <= cpu <= disk <= n,
 *     gpu <= tree_size and a hit; the gpu depth of a slot found by both
 *     agrees; pool_depths gives cpu <= disk <= n; by-seq queries as
 *     find_matches;
 *   - a batch of one plain gpu store from position 0 (usable tokens, no
 *     parent, not skipped, applied): its (instance, rank) matches the
 *     content chain to its full length;
 *   - a dump of the index (kvi_producer_dump): as many blocks as
 *     stats.holdings, and each (instance, rank)'s gpu blocks =
 *     kvi_index_tree_size; kvi_index_check_tables on the index (left out
 *     only with KVI_FUZZ_INGEST_SKIP_TABLES=1), writers parked.
 * Everything is freed at exit (atexit), so -detect_leaks sees no leak.
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>

#include "engine/hash.h"
#include "engine/index.h"
#include "engine/index_internal.h"
#include "engine/rcu.h"
#include "engine/writer.h"
#include "fuzz.h"
#include "net/decode.h"
#include "net/ingest.h"
#include "net/log.h"

/* LeakSanitizer does not scan anonymous mappings, and an index keeps its
 * partitions (with the pointers to its entry chunks, tables and scratch) in
 * one (kvi_index_create): without registering it as a root, libFuzzer's
 * leak check after an input that grew the index calls all of that leaked. */
#if defined(__SANITIZE_ADDRESS__)
#define FZ_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_LSAN 1
#endif
#endif
#ifdef FZ_LSAN
void __lsan_register_root_region(const void *p, size_t size);
void __lsan_unregister_root_region(const void *p, size_t size);
#define FZ_LSAN_ROOT(ix) __lsan_register_root_region((ix)->parts, (ix)->parts_bytes)
#define FZ_LSAN_UNROOT(ix) __lsan_unregister_root_region((ix)->parts, (ix)->parts_bytes)
#else
#define FZ_LSAN_ROOT(ix) ((void)(ix))
#define FZ_LSAN_UNROOT(ix) ((void)(ix))
#endif

#define N_IX 4
#define N_TGT 8
#define N_WRITERS 2
#define RESET_EVERY 256
#define MAX_ENTRIES 50000 /* per index, before a rebuild */
#define MAX_SLOTS 512
#define MAXQ 512  /* blocks per query */
#define MAXM 256  /* match results read */
#define MAX_EV_QUERIES 16

static const uint32_t ix_bs[N_IX] = {1, 2, 4, 16};

struct tgt_def {
    int ix;
    uint64_t id;
    const char *name; /* interned name (Mooncake-style) or NULL */
};
static const struct tgt_def tdefs[N_TGT] = {
    {0, 1, NULL}, {1, 1, NULL}, {2, 1, NULL}, {2, 2, NULL},
    {2, 0, "mooncake-node-a"}, {3, 1, NULL}, {3, 2, NULL}, {3, 0, "mooncake-node-b"},
};

struct reg {
    struct kvi_ingest_target t;
    struct kvi_ingest_counters ctr;
    struct kvi_op_sink sink;
    uint64_t seq; /* batches fed (pub_applied positions) */
};

static struct {
    bool ready;
    struct kvi_writer_pool *pool;
    struct kvi_producer *p;
    struct kvi_decoder *dec;
    struct kvi_index *ix[N_IX];
    struct kvi_index_stats prev[N_IX];
    struct reg reg[N_TGT];
    uint64_t runs;
} g;

/* ---- setup and teardown ------------------------------------------------------------ */

static void build_state(void)
{
    for (int i = 0; i < N_IX; i++) {
        struct kvi_index_config cfg = {.block_size = ix_bs[i], .n_parts = N_WRITERS,
                                       .key_seed = 0x5eed0000u + (uint64_t)i};
        g.ix[i] = kvi_index_create(&cfg);
        FZ_CHECK(g.ix[i] != NULL);
        FZ_LSAN_ROOT(g.ix[i]);
        kvi_index_stats(g.ix[i], &g.prev[i]);
    }
    for (int i = 0; i < N_TGT; i++) {
        struct reg *r = &g.reg[i];
        memset(r, 0, sizeof(*r));
        struct kvi_index *ix = g.ix[tdefs[i].ix];
        int64_t inst = kvi_index_intern_instance(ix, tdefs[i].id, tdefs[i].name, false);
        FZ_CHECK(inst >= 0);
        r->t.ix = ix;
        r->t.instance = (uint32_t)inst;
        r->t.block_size = (i & 1) ? ix_bs[tdefs[i].ix] : 0; /* 0: the index's */
        r->t.name = tdefs[i].name ? tdefs[i].name : "fuzz";
        r->t.ctr = &r->ctr;
        r->t.sink = &r->sink;
        FZ_CHECK(kvi_ingest_target_init(&r->t) == 0);
    }
}

static void drop_state(void)
{
    kvi_producer_flush(g.p);
    for (int i = 0; i < N_TGT; i++)
        kvi_ingest_target_fini(&g.reg[i].t);
    for (int i = 0; i < N_IX; i++) {
        kvi_producer_forget_index(g.p, g.ix[i]);
        FZ_LSAN_UNROOT(g.ix[i]);
        kvi_index_destroy(g.ix[i]);
        g.ix[i] = NULL;
    }
}

static void teardown(void)
{
    if (!g.ready)
        return;
    drop_state();
    kvi_producer_destroy(g.p);
    kvi_writer_pool_destroy(g.pool);
    kvi_decoder_destroy(g.dec);
    kvi_rcu_unregister_thread();
    g.ready = false;
}

static void setup(void)
{
    kvi_log_set_level(KVI_LOG_ERROR); /* ingest warnings are expected here */
    kvi_rcu_register_thread();
    g.pool = kvi_writer_pool_create(N_WRITERS, 0);
    FZ_CHECK(g.pool != NULL);
    g.p = kvi_producer_create(g.pool);
    FZ_CHECK(g.p != NULL);
    g.dec = kvi_decoder_create();
    FZ_CHECK(g.dec != NULL);
    build_state();
    g.ready = true;
    atexit(teardown);
}

/* ---- queries ------------------------------------------------------------------------ */

static uint64_t rd(const _Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

/* Sanity of every query kind over one chain of n hashes (content or seq).
 * Returns the gpu depth of (instance, rank) (0 when absent). */
static uint32_t check_queries(const struct kvi_index *ix, const uint64_t *h, size_t n, bool have_seq,
                              uint32_t want_inst, uint32_t want_rank)
{
    static struct kvi_match m[MAXM];
    static struct kvi_tier_match tm[MAXM];
    static uint64_t seq[MAXQ];
    FZ_CHECK(n <= MAXQ);
    uint32_t found = 0;
    kvi_rcu_read_lock();
    size_t k = kvi_index_find_matches(ix, h, n, m, MAXM);
    size_t km = k < MAXM ? k : MAXM;
    for (size_t i = 0; i < km; i++) {
        FZ_CHECK(m[i].depth >= 1 && m[i].depth <= n);
        FZ_CHECK(m[i].tree_size >= m[i].depth);
        struct kvi_slot_info si;
        FZ_CHECK(kvi_index_slot_info(ix, m[i].slot, &si) == 0);
        FZ_CHECK(si.instance == m[i].instance && si.dp_rank == m[i].dp_rank && si.tier == KVI_TIER_GPU);
        FZ_CHECK(kvi_index_tree_size(ix, m[i].instance, m[i].dp_rank) == m[i].tree_size);
        for (size_t j = 0; j < i; j++)
            FZ_CHECK(m[j].slot != m[i].slot);
        if (m[i].instance == want_inst && m[i].dp_rank == want_rank)
            found = m[i].depth;
    }
    size_t kt = kvi_index_find_tiered(ix, h, NULL, n, tm, MAXM);
    size_t ktm = kt < MAXM ? kt : MAXM;
    for (size_t i = 0; i < ktm; i++) {
        FZ_CHECK(tm[i].gpu <= tm[i].cpu && tm[i].cpu <= tm[i].disk && tm[i].disk <= n);
        FZ_CHECK(tm[i].disk >= 1);
        FZ_CHECK(tm[i].gpu <= tm[i].tree_size);
        for (size_t j = 0; j < i; j++)
            FZ_CHECK(tm[j].instance != tm[i].instance || tm[j].dp_rank != tm[i].dp_rank);
        /* the gpu prefix agrees with find_matches for the same (instance, rank) */
        if (k <= MAXM) {
            uint32_t d = 0;
            for (size_t j = 0; j < km; j++)
                if (m[j].instance == tm[i].instance && m[j].dp_rank == tm[i].dp_rank)
                    d = m[j].depth;
            FZ_CHECK(d == tm[i].gpu);
        }
    }
    uint32_t pc = 0, pd = 0;
    kvi_index_pool_depths(ix, h, NULL, n, &pc, &pd);
    FZ_CHECK(pc <= pd && pd <= n);
    if (have_seq) {
        kvi_seq_hashes(h, n, seq);
        size_t ks = kvi_index_find_matches_by_seq(ix, seq, n, m, MAXM);
        for (size_t i = 0; i < ks && i < MAXM; i++)
            FZ_CHECK(m[i].depth >= 1 && m[i].depth <= n && m[i].tree_size >= m[i].depth);
        kt = kvi_index_find_tiered(ix, NULL, seq, n, tm, MAXM);
        for (size_t i = 0; i < kt && i < MAXM; i++)
            FZ_CHECK(tm[i].gpu <= tm[i].cpu && tm[i].cpu <= tm[i].disk && tm[i].disk <= n);
    }
    /* the chain itself taken as seq hashes (RFC 1527 events' hashes are) */
    size_t ks = kvi_index_find_matches_by_seq(ix, h, n, m, MAXM);
    for (size_t i = 0; i < ks && i < MAXM; i++)
        FZ_CHECK(m[i].depth >= 1 && m[i].depth <= n && m[i].tree_size >= m[i].depth);
    kvi_rcu_read_unlock();
    return found;
}

/* Content hashes of a stored event's usable blocks, as net/ingest.h defines
 * them. @return the number of blocks (0: no usable tokens). */
static uint32_t event_content(const struct kvi_ev *e, uint32_t bs, uint64_t *out, uint32_t cap)
{
    if (e->tokens_form != KVI_TOK_FLAT && e->tokens_form != KVI_TOK_PAIRS)
        return 0;
    if (e->n_tokens == 0 || (e->has_block_size && e->block_size != bs))
        return 0;
    bool eagle = e->tokens_form == KVI_TOK_PAIRS;
    size_t win = (size_t)bs + (eagle ? 1 : 0);
    size_t avail = e->n_tokens >= win ? (e->n_tokens - (eagle ? 1 : 0)) / bs : 0;
    uint32_t k = avail < e->n_hashes ? (uint32_t)avail : e->n_hashes;
    if (k > cap)
        k = cap;
    uint32_t ll = e->lora_name != NULL ? e->lora_len : 0;
    uint32_t sl = e->cache_salt != NULL ? e->salt_len : 0;
    uint64_t seed = ll == 0 && sl == 0 ? KVI_HASH_SEED : kvi_hash_seed(e->lora_name, ll, e->cache_salt, sl);
    for (uint32_t i = 0; i < k; i++) {
        const uint32_t *bt = e->tokens + (size_t)i * bs;
        if (e->mm_off != NULL && e->mm_off[i + 1] > e->mm_off[i])
            out[i] = kvi_hash_block_mm(bt, win, e->mm + e->mm_off[i], e->mm_off[i + 1] - e->mm_off[i], seed);
        else
            out[i] = kvi_hash_block(bt, win, seed);
    }
    return k;
}

/* ---- the dump check ----------------------------------------------------------------- */

#define DUMP_MAX 4096
struct dump_acc {
    uint64_t n;
    uint32_t n_keys;
    struct {
        uint32_t instance, dp_rank, gpu;
    } k[DUMP_MAX];
};
static struct dump_acc g_dump;

static void dump_emit(void *ctx, const struct kvi_dump_block *b)
{
    struct dump_acc *a = ctx;
    a->n++;
    FZ_CHECK((unsigned)b->tier < KVI_TIER_COUNT);
    uint32_t i = 0;
    while (i < a->n_keys && (a->k[i].instance != b->instance || a->k[i].dp_rank != b->dp_rank))
        i++;
    if (i == a->n_keys) {
        FZ_CHECK(a->n_keys < DUMP_MAX);
        a->k[i].instance = b->instance;
        a->k[i].dp_rank = b->dp_rank;
        a->k[i].gpu = 0;
        a->n_keys++;
    }
    if (b->tier == KVI_TIER_GPU)
        a->k[i].gpu++;
}

/* kvi_index_check_tables needs quiescent writers, but an idle writer still
 * reclaims, and then builds a seq table that a by-seq query asked for
 * (kvi_index_reclaim_begin). So writer 1 is parked in a CALL op while
 * writer 0 runs the check in another. */
struct tables_call {
    const struct kvi_index *ix;
    _Atomic int state; /* 0, 1: writer 1 parked, 2: released */
    int rc;
    char why[256];
};

static void park_fn(void *arg, uint32_t writer)
{
    struct tables_call *c = arg;
    atomic_store(&c->state, 1);
    while (atomic_load(&c->state) != 2)
        sched_yield();
}

static void tables_fn(void *arg, uint32_t writer)
{
    struct tables_call *c = arg;
    while (atomic_load(&c->state) != 1)
        sched_yield();
    c->rc = kvi_index_check_tables(c->ix, c->why, sizeof(c->why));
    atomic_store(&c->state, 2);
}

static void check_tables(const struct kvi_index *ix)
{
    /* KVI_FUZZ_INGEST_SKIP_TABLES=1: leave this check out (to fuzz past a
     * known table finding while it is being fixed) */
    static int skip = -1;
    if (skip < 0) {
        const char *e = getenv("KVI_FUZZ_INGEST_SKIP_TABLES");
        skip = e != NULL && *e != '\0' && *e != '0';
    }
    if (skip)
        return;
    static struct tables_call c;
    c.ix = ix;
    atomic_store(&c.state, 0);
    c.rc = 0;
    c.why[0] = '\0';
    /* as kvi_producer_call, without waiting: a CALL op's instance names its writer */
    struct kvi_op *op = kvi_op_alloc(0, false);
    op->type = KVI_OP_CALL;
    op->instance = 1;
    op->fn = park_fn;
    op->arg = &c;
    kvi_producer_submit(g.p, op);
    kvi_producer_call(g.p, 0, tables_fn, &c);
    kvi_producer_flush(g.p);
    if (c.rc != 0) {
        fprintf(stderr, "kvi_index_check_tables: %s\n", c.why);
        FZ_CHECK(c.rc == 0);
    }
}

static void check_index(struct kvi_index *ix)
{
    struct kvi_index_stats st;
    kvi_index_stats(ix, &st);
    if (st.slots > DUMP_MAX / 2 || st.holdings > 200000)
        return;
    memset(&g_dump, 0, sizeof(g_dump));
    kvi_producer_dump(g.p, ix, dump_emit, &g_dump);
    FZ_CHECK(g_dump.n == st.holdings);
    kvi_rcu_read_lock();
    for (uint32_t i = 0; i < g_dump.n_keys; i++)
        FZ_CHECK(kvi_index_tree_size(ix, g_dump.k[i].instance, g_dump.k[i].dp_rank) == g_dump.k[i].gpu);
    kvi_rcu_read_unlock();
    check_tables(ix);
}

/* Debugging a finding that needs the inputs before it: with
 * KVI_FUZZ_INGEST_TRACE=DIR set, the inputs since the last rebuild are kept
 * as DIR/000001.bin, ... (emptied at each rebuild); run them in order with
 * `fuzz_ingest DIR/0*.bin` (or fuzz_ingest_regress DIR). */
static void trace_input(bool reset, const uint8_t *data, size_t size)
{
    static int on = -1;
    static unsigned n;
    static char dir[200];
    if (on < 0) {
        const char *d = getenv("KVI_FUZZ_INGEST_TRACE");
        on = d != NULL && *d != '\0' && strlen(d) < 100;
        if (on)
            snprintf(dir, sizeof(dir), "%s", d);
    }
    if (!on)
        return;
    char path[300];
    if (reset) {
        for (unsigned i = 1; i <= n; i++) {
            snprintf(path, sizeof(path), "%s/%06u.bin", dir, i);
            remove(path);
        }
        n = 0;
    }
    snprintf(path, sizeof(path), "%s/%06u.bin", dir, ++n);
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(data, 1, size, f);
        fclose(f);
    }
}

/* ---- entry point ---------------------------------------------------------------------- */

#define CTR_FIELDS(X)                                                                              \
    X(batches) X(events_stored) X(events_removed) X(events_cleared) X(events_rfc1527)              \
    X(events_unknown) X(events_invalid) X(placeholders) X(seq_only) X(block_size_mismatch)         \
    X(tokens_short) X(blocks_dropped) X(blocks_submitted) X(hashes_remove_submitted)               \
    X(unknown_medium) X(group_skipped) X(tier_skipped) X(ops_submitted)

struct ctr_snap {
#define X(f) uint64_t f;
    CTR_FIELDS(X)
#undef X
};

static void ctr_snap(const struct kvi_ingest_counters *c, struct ctr_snap *s)
{
#define X(f) s->f = rd(&c->f);
    CTR_FIELDS(X)
#undef X
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g.ready)
        setup();
    if (size < 2)
        return 0;
    uint8_t s0 = data[0], s1 = data[1];
    data += 2;
    size -= 2;

    bool need_reset = (s0 & 0x80) || ++g.runs % RESET_EVERY == 0;
    for (int i = 0; i < N_IX && !need_reset; i++) {
        struct kvi_index_stats st;
        kvi_index_stats(g.ix[i], &st);
        need_reset = st.entries > MAX_ENTRIES || st.slots > MAX_SLOTS;
    }
    if (need_reset) {
        drop_state();
        build_state();
    }
    trace_input(need_reset, data - 2, size + 2);

    struct kvi_batch b;
    if (kvi_decode_batch(g.dec, data, size, &b) != 0)
        return 0;

    int ti = s0 & 7;
    struct reg *r = &g.reg[ti];
    struct kvi_index *ix = r->t.ix;
    int xi = tdefs[ti].ix;
    uint32_t bs = ix_bs[xi];
    static const uint32_t skips[4] = {
        0, 1u << KVI_TIER_CPU | 1u << KVI_TIER_DISK | 1u << KVI_TIER_EXTERNAL, 1u << KVI_TIER_GPU,
        1u << KVI_TIER_EXTERNAL};
    r->t.dp_rank = (s0 >> 3) & 3;
    r->t.skip_tiers = skips[(s0 >> 5) & 3];
    r->t.group = s1 & 3;
    r->t.pub_applied = (s1 & 4) != 0;
    r->t.applied1 = r->seq + 1;
    r->t.applied1_end = r->seq + 2;
    r->seq++;

    struct ctr_snap c0, c1;
    ctr_snap(&r->ctr, &c0);
    struct kvi_op_sink k0, k1;
    kvi_op_sink_read(&r->sink, &k0);
    uint64_t ap0 = kvi_op_sink_applied(&r->sink);

    size_t ops = kvi_ingest_batch(&r->t, &b, g.p);
    kvi_producer_flush(g.p);

    ctr_snap(&r->ctr, &c1);
    kvi_op_sink_read(&r->sink, &k1);
    uint64_t ap1 = kvi_op_sink_applied(&r->sink);

    /* ---- the writers' outcomes ---- */
    FZ_CHECK(c1.ops_submitted - c0.ops_submitted == ops);
    uint64_t d_app = k1.outcomes[KVI_OUT_APPLIED] - k0.outcomes[KVI_OUT_APPLIED];
    uint64_t d_pnf = k1.outcomes[KVI_OUT_PARENT_NOT_FOUND] - k0.outcomes[KVI_OUT_PARENT_NOT_FOUND];
    uint64_t d_inv = k1.outcomes[KVI_OUT_INVALID] - k0.outcomes[KVI_OUT_INVALID];
    uint64_t d_unk = k1.outcomes[KVI_OUT_UNKNOWN_BLOCK] - k0.outcomes[KVI_OUT_UNKNOWN_BLOCK];
    FZ_CHECK(d_app + d_pnf + d_inv == ops);
    uint64_t d_sub = c1.blocks_submitted - c0.blocks_submitted;
    FZ_CHECK(k1.blocks_stored - k0.blocks_stored <= d_sub);
    FZ_CHECK(d_unk <= d_sub);
    FZ_CHECK(k1.hashes_removed - k0.hashes_removed <= c1.hashes_remove_submitted - c0.hashes_remove_submitted);
    FZ_CHECK(ap1 == ap0 || (r->t.pub_applied && (ap1 == r->t.applied1 || ap1 == r->t.applied1_end)));

    /* ---- the decode-side counters ---- */
    uint64_t n_st = 0, n_rm = 0, n_cl = 0, n_rfc = 0, h_st = 0, h_rm = 0;
    for (uint32_t i = 0; i < b.n_events; i++) {
        const struct kvi_ev *e = &b.events[i];
        n_rfc += e->family == KVI_EVF_RFC1527;
        if (e->type == KVI_EV_STORED)
            n_st++, h_st += e->n_hashes;
        else if (e->type == KVI_EV_REMOVED)
            n_rm++, h_rm += e->n_hashes;
        else
            n_cl++;
    }
    FZ_CHECK(c1.batches - c0.batches == 1);
    FZ_CHECK(c1.events_stored - c0.events_stored == n_st);
    FZ_CHECK(c1.events_removed - c0.events_removed == n_rm);
    FZ_CHECK(c1.events_cleared - c0.events_cleared == n_cl);
    FZ_CHECK(c1.events_rfc1527 - c0.events_rfc1527 == n_rfc);
    FZ_CHECK(c1.events_unknown - c0.events_unknown == b.n_unknown);
    uint64_t d_einv = c1.events_invalid - c0.events_invalid;
    FZ_CHECK(d_einv >= b.n_invalid && d_einv <= (uint64_t)b.n_invalid + b.n_events);
    FZ_CHECK((c1.group_skipped - c0.group_skipped) + (c1.tier_skipped - c0.tier_skipped) <= n_st + n_rm);
    FZ_CHECK(c1.unknown_medium - c0.unknown_medium <= n_st + n_rm);
    FZ_CHECK((c1.block_size_mismatch - c0.block_size_mismatch) + (c1.tokens_short - c0.tokens_short) +
                 (c1.placeholders - c0.placeholders) + (c1.seq_only - c0.seq_only) <=
             n_st);
    FZ_CHECK((c1.blocks_dropped - c0.blocks_dropped) + d_sub <= h_st);
    FZ_CHECK(c1.hashes_remove_submitted - c0.hashes_remove_submitted <= h_rm);
    /* at most one op per stored or removed event (a cleared event is one op
     * per rank cleared: the target's and its pools') */
    if (n_cl == 0)
        FZ_CHECK(ops <= n_st + n_rm);

    /* ---- the index's counters ---- */
    struct kvi_index_stats st, *pv = &g.prev[xi];
    kvi_index_stats(ix, &st);
    FZ_CHECK(st.stored_blocks >= pv->stored_blocks && st.removed_blocks >= pv->removed_blocks);
    FZ_CHECK(st.unknown_removes >= pv->unknown_removes && st.parent_elsewhere >= pv->parent_elsewhere);
    FZ_CHECK(st.table_rebuilds >= pv->table_rebuilds);
    FZ_CHECK(st.parent_not_found - pv->parent_not_found == d_pnf);
    FZ_CHECK(st.invalid_events - pv->invalid_events == d_inv);
    FZ_CHECK(st.unknown_blocks - pv->unknown_blocks == d_unk);
    FZ_CHECK(st.holdings == 0 || st.entries > 0);
    *pv = st;

    /* ---- queries ---- */
    static uint64_t content[MAXQ];
    uint32_t dp_rank = b.has_dp_rank ? b.dp_rank : r->t.dp_rank;
    int nq = 0;
    for (uint32_t i = 0; i < b.n_events && nq < MAX_EV_QUERIES; i++) {
        const struct kvi_ev *e = &b.events[i];
        if (e->type == KVI_EV_CLEARED || e->n_hashes == 0)
            continue;
        nq++;
        uint32_t nh = e->n_hashes < MAXQ ? e->n_hashes : MAXQ;
        check_queries(ix, e->hashes, nh, false, UINT32_MAX, 0);
        uint32_t k = e->type == KVI_EV_STORED ? event_content(e, bs, content, MAXQ) : 0;
        if (k == 0)
            continue;
        uint32_t d = check_queries(ix, content, k, true, r->t.instance, dp_rank);
        /* one plain gpu store from position 0, applied: matched in full */
        bool plain = b.n_events == 1 && e->tier == KVI_TIER_GPU && !e->has_parent && e->group_idx < 0 &&
                     (r->t.skip_tiers & 1u << KVI_TIER_GPU) == 0 && k == e->n_hashes &&
                     (e->family != KVI_EVF_RFC1527 ||
                      (e->backend_len == 0 && (!e->has_base_idx || e->base_block_idx == 0)));
        if (plain && ops == 1 && d_app == 1)
            FZ_CHECK(d == k);
    }
    /* random chains from the input's bytes */
    uint64_t rng = 0x1234567u ^ size;
    for (size_t i = 0; i < size && i < 64; i++)
        rng = rng * 131 + data[i];
    uint32_t nr = 1 + (uint32_t)(fz_rng(&rng) % 8);
    for (uint32_t i = 0; i < nr; i++)
        content[i] = fz_rng(&rng) % 4 == 0 ? (uint64_t)(fz_rng(&rng) % 16) : fz_rng(&rng);
    check_queries(ix, content, nr, true, UINT32_MAX, 0);

    /* ---- the whole index ---- */
    check_index(ix);
    return 0;
}
