/*
 * Test fixture for the positional index (engine/index.h): index
 * configurations, chain helpers following the conventions of
 * index-semantics.md section 6 ("store [1,2,3] for W0": content hashes 1,2,3
 * in one event, engine hashes = standard rolling hashes of the ids, parent =
 * the previous block's engine hash), exact-match expectations that cross-check
 * every query path, canonical dump snapshots (section 5) and dump replay.
 *
 * Include after <cmocka.h>. Checks are "soft": a failed check prints the
 * configuration, the caller's line and the details, and the scenario goes on
 * (so one run shows every configuration that fails); fx_run() fails the
 * cmocka test at the end if any check failed. The calling thread must be a
 * registered RCU reader (the test group's setup registers it).
 *
 * Declared here with their contracts, defined in index_fixture.c (built once
 * into kvi_test_engine, tests/CMakeLists.txt); small helpers, the macros and
 * the configuration table stay here.
 */
#ifndef KVI_TESTS_ENGINE_INDEX_FIXTURE_H
#define KVI_TESTS_ENGINE_INDEX_FIXTURE_H

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/hash.h"
#include "engine/index.h"
#include "engine/rcu.h"

#define FX_ANY UINT32_MAX      /* tree size not checked */
#define FX_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FX_MAX_OUT 4096u       /* result buffer for queries */
#define FX_PROBE_ID 0xfff0000000000001ull /* public id of the lower-tier probe instance */
#define FX_PROBE_CONTENT 0xdeadbeefcafef00dull

/* ---- configurations ------------------------------------------------------- */

struct fx_cfg {
    uint32_t n_parts;
    uint32_t jump;     /* passed to kvi_index_set_jump (0 = jump to the end) */
    bool set_jump;     /* false: leave the create-time default (KVI_DEFAULT_JUMP) */
    bool probe;        /* add an unrelated lower-tier instance, so that
                          find_tiered takes its tier-walk path everywhere */
    uint64_t key_seed; /* 0 = random per index */
};

/*
 * Every scenario runs against each of these: one and three partitions, jump
 * sizes 1, 2, 7, 32, 64 and 0 (jump to the end), the create-time default with
 * a random key secret, and two configurations whose index also holds a
 * lower-tier slot (find_tiered then walks tiers instead of copying the gpu
 * matches).
 */
static const struct fx_cfg fx_cfgs[] = {
    {1, 1, true, false, 0x0101},  {1, 2, true, false, 0x0102},  {1, 7, true, false, 0x0107},
    {1, 32, true, false, 0x0132}, {1, 64, true, false, 0x0164}, {1, 0, true, false, 0x0100},
    {3, 1, true, false, 0x0301},  {3, 2, true, false, 0x0302},  {3, 7, true, false, 0x0307},
    {3, 32, true, false, 0x0332}, {3, 64, true, false, 0x0364}, {3, 0, true, false, 0x0300},
    {2, 0, false, false, 0},      {3, 7, true, true, 0x7307},   {1, 0, true, true, 0x7100},
};
#define FX_N_CFGS (sizeof fx_cfgs / sizeof fx_cfgs[0])

struct fx {
    struct kvi_index *ix;
    const struct fx_cfg *cfg;
    uint32_t bs;
    uint32_t probe;    /* dense id of the probe instance, or FX_ANY */
    bool tiered_same;  /* no worker holds lower-tier blocks on the query paths:
                          find_tiered must equal find_matches with g = c = d */
};

/* ---- soft checks ------------------------------------------------------------ */

/* The running scenario's soft-check state (fx_run resets it): failed checks,
 * failures printed so far, the test's name and the configuration under test. */
extern int fx_failures;
extern int fx_printed;
extern const char *fx_test_name;
extern const struct fx_cfg *fx_cur_cfg;

/* The configuration's name (parts, jump, ...) in buf, "-" for NULL. */
void fx_cfg_name(const struct fx_cfg *c, char *buf, size_t n);

/* Record one failed soft check at @p line: counted in fx_failures, printed with the configuration (the first 60). */
void fx_fail(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define FX_CHECK(line, cond, ...)                                                                  \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fx_fail((line), __VA_ARGS__);                                                          \
    } while (0)

/* CHECK_EQ(a, b): soft equality of two integers, at the current line. */
#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                           \
        if (a_ != b_)                                                                              \
            fx_fail(__LINE__, "%s = %" PRIu64 " (0x%" PRIx64 "), expected %s = %" PRIu64, #a, a_,  \
                    a_, #b, b_);                                                                   \
    } while (0)
#define CHECK(cond) FX_CHECK(__LINE__, cond, "check failed: %s", #cond)

/* ---- index lifetime ------------------------------------------------------- */

/* A fresh index of configuration @p c and block size @p bs in *f (with the lower-tier probe instance when c->probe). */
void fx_open(struct fx *f, const struct fx_cfg *c, uint32_t bs);

static inline void fx_close(struct fx *f)
{
    kvi_index_destroy(f->ix);
    f->ix = NULL;
}

/* Drop the index and start again with the same configuration. */
static inline void fx_reset(struct fx *f)
{
    const struct fx_cfg *c = f->cfg;
    uint32_t bs = f->bs;
    bool same = f->tiered_same;
    fx_close(f);
    fx_open(f, c, bs);
    f->tiered_same = same;
}

typedef void (*fx_scenario)(struct fx *f);

/* Run scenario @p sc on a fresh index of every configuration (fx_cfgs); fails the cmocka test @p name at the end
 * if any soft check failed. */
void fx_run(fx_scenario sc, const char *name, uint32_t bs);

/* ---- instances, chains, stores, removes -------------------------------------- */

/* Dense instance id of worker @p id (interned on first use; @p shared: a shared pool). */
uint32_t fx_inst(struct fx *f, uint64_t id, bool shared);
/* Worker id -> dense instance id (interned on first use). */
static inline uint32_t fx_w(struct fx *f, uint64_t id) { return fx_inst(f, id, false); }

/* A worker in the partition of instance `other`: interns ids from `id` on
 * until one lands there (entries are shared within a partition only). */
static inline uint32_t fx_w_near(struct fx *f, uint64_t id, uint32_t other)
{
    for (;; id++) {
        uint32_t w = fx_w(f, id);
        if (kvi_index_partition_of(f->ix, w) == kvi_index_partition_of(f->ix, other))
            return w;
    }
}

/* c[i] = first + i */
static inline void fx_range(uint64_t *c, size_t n, uint64_t first)
{
    for (size_t i = 0; i < n; i++)
        c[i] = first + i;
}

/* The standard seq hashes of chain[0 .. n) (malloc'ed: free it). */
uint64_t *fx_seqs(const uint64_t *chain, size_t n);

/* Standard engine hash of chain[i] (rolling hash of chain[0..i]). */
static inline uint64_t fx_eh(const uint64_t *chain, size_t i)
{
    uint64_t *s = fx_seqs(chain, i + 1);
    uint64_t v = s[i];
    free(s);
    return v;
}

/* Store chain[from..to) on (w, rank, tier) in one event: engine hashes are the
 * rolling hashes of the chain, parent = engine hash of chain[from-1]. */
int fx_store_tier(struct fx *f, uint32_t w, uint32_t rank, enum kvi_tier tier, const uint64_t *chain,
                  size_t from, size_t to);

/* Store with explicit engine hashes eh[from..to) (parent eh[from-1]). */
int fx_store_eh(struct fx *f, uint32_t w, uint32_t rank, enum kvi_tier tier, const uint64_t *chain,
                const uint64_t *eh, size_t from, size_t to);

#define STORE(f, w, chain, from, to)                                                               \
    FX_CHECK(__LINE__, fx_store_tier((f), (w), 0, KVI_TIER_GPU, (chain), (from), (to)) == 0,       \
             "store [%zu,%zu) failed", (size_t)(from), (size_t)(to))
#define STORE_AT(f, w, rank, tier, chain, from, to)                                                \
    FX_CHECK(__LINE__, fx_store_tier((f), (w), (rank), (tier), (chain), (from), (to)) == 0,        \
             "store [%zu,%zu) rank %u tier %d failed", (size_t)(from), (size_t)(to), (unsigned)(rank), \
             (int)(tier))

/* Remove the standard engine hashes of chain[from..to), in that order (or
 * reversed). @return the number the index reported as known. */
size_t fx_remove_tier(struct fx *f, uint32_t w, uint32_t rank, enum kvi_tier tier, const uint64_t *chain,
                      size_t from, size_t to, bool reverse);
#define REMOVE(f, w, chain, from, to) fx_remove_tier((f), (w), 0, KVI_TIER_GPU, (chain), (from), (to), false)
#define REMOVE_REV(f, w, chain, from, to) fx_remove_tier((f), (w), 0, KVI_TIER_GPU, (chain), (from), (to), true)

static inline uint32_t fx_tree(struct fx *f, uint32_t w, uint32_t rank) { return kvi_index_tree_size(f->ix, w, rank); }

static inline void fx_reclaim_all(struct fx *f)
{
    for (uint32_t p = 0; p < kvi_index_n_parts(f->ix); p++)
        kvi_index_reclaim(f->ix, p);
}

/* ---- queries ---------------------------------------------------------------- */

/* Result buffers the scenarios and the expectations share (main thread only). */
extern struct kvi_match fx_out[FX_MAX_OUT], fx_out2[FX_MAX_OUT];
extern struct kvi_tier_match fx_tout[FX_MAX_OUT];

static inline size_t fx_find(const struct kvi_index *ix, const uint64_t *q, size_t n, struct kvi_match *out,
                             size_t cap)
{
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches(ix, q, n, out, cap);
    kvi_rcu_read_unlock();
    return r;
}

static inline size_t fx_find_seq(const struct kvi_index *ix, const uint64_t *seq, size_t n, struct kvi_match *out,
                                 size_t cap)
{
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_matches_by_seq(ix, seq, n, out, cap);
    kvi_rcu_read_unlock();
    return r;
}

static inline size_t fx_tiered(const struct kvi_index *ix, const uint64_t *content, const uint64_t *seq, size_t n,
                               struct kvi_tier_match *out, size_t cap)
{
    kvi_rcu_read_lock();
    size_t r = kvi_index_find_tiered(ix, content, seq, n, out, cap);
    kvi_rcu_read_unlock();
    return r;
}

/* Matches by slot. */
int fx_cmp_match(const void *a, const void *b);

static inline void fx_print_matches(const char *what, const struct kvi_match *m, size_t n)
{
    for (size_t i = 0; i < n && i < 40; i++)
        print_error("    %s: slot %u instance %u rank %u depth %u tree %u\n", what, m[i].slot, m[i].instance,
                     m[i].dp_rank, m[i].depth, m[i].tree_size);
}

static inline void fx_print_tmatches(const char *what, const struct kvi_tier_match *m, size_t n)
{
    for (size_t i = 0; i < n && i < 40; i++)
        print_error("    %s: instance %u rank %u gpu %u cpu %u disk %u tree %u\n", what, m[i].instance, m[i].dp_rank,
                     m[i].gpu, m[i].cpu, m[i].disk, m[i].tree_size);
}

/* One expected gpu match. tree = FX_ANY skips the tree-size check. */
struct fx_exp {
    uint32_t inst, rank, depth, tree;
};

/*
 * The gpu matches of query q[0..n) are exactly e[0..ne): same (instance,
 * rank) set, exact depths and tree sizes (also against kvi_index_tree_size),
 * gpu slots per kvi_index_slot_info. Cross-checks: find_matches_by_seq on the
 * standard seq hashes of q gives the same result, and (when f->tiered_same)
 * find_tiered by content and by seq gives gpu = cpu = disk = depth.
 */
void fx_expect(struct fx *f, int line, const uint64_t *q, size_t n, const struct fx_exp *e, size_t ne);

#define FX_EXP_LIST(...) ((const struct fx_exp[]){__VA_ARGS__})
#define FX_EXP_N(...) (sizeof(FX_EXP_LIST(__VA_ARGS__)) / sizeof(struct fx_exp))
/* EXPECT(f, q, n, {inst, rank, depth, tree}, ...): exact gpu match set. */
#define EXPECT(f, q, n, ...) fx_expect((f), __LINE__, (q), (n), FX_EXP_LIST(__VA_ARGS__), FX_EXP_N(__VA_ARGS__))
#define EXPECT_NONE(f, q, n) fx_expect((f), __LINE__, (q), (n), NULL, 0)

/* One expected tier result. */
struct fx_texp {
    uint32_t inst, rank, gpu, cpu, disk, tree;
};

/* find_tiered by content (when content != NULL) and by seq gives exactly e. */
void fx_expect_tiered_mode(struct fx *f, int line, const uint64_t *content, const uint64_t *seq, size_t n,
                           const struct fx_texp *e, size_t ne);

static inline void fx_expect_tiered(struct fx *f, int line, const uint64_t *q, size_t n, const struct fx_texp *e,
                                    size_t ne)
{
    uint64_t *s = fx_seqs(q, n);
    fx_expect_tiered_mode(f, line, q, NULL, n, e, ne);
    fx_expect_tiered_mode(f, line, NULL, s, n, e, ne);
    free(s);
}

#define FX_TEXP_LIST(...) ((const struct fx_texp[]){__VA_ARGS__})
#define FX_TEXP_N(...) (sizeof(FX_TEXP_LIST(__VA_ARGS__)) / sizeof(struct fx_texp))
/* TIERED(f, q, n, {inst, rank, gpu, cpu, disk, tree}, ...): by content and by seq. */
#define TIERED(f, q, n, ...)                                                                       \
    fx_expect_tiered((f), __LINE__, (q), (n), FX_TEXP_LIST(__VA_ARGS__), FX_TEXP_N(__VA_ARGS__))
#define TIERED_CONTENT(f, q, n, ...)                                                               \
    fx_expect_tiered_mode((f), __LINE__, (q), NULL, (n), FX_TEXP_LIST(__VA_ARGS__), FX_TEXP_N(__VA_ARGS__))
#define TIERED_SEQ(f, s, n, ...)                                                                   \
    fx_expect_tiered_mode((f), __LINE__, NULL, (s), (n), FX_TEXP_LIST(__VA_ARGS__), FX_TEXP_N(__VA_ARGS__))

/* ---- canonical snapshots (index-semantics.md section 5) ------------------- */

/* (worker id, dp rank, tier, engine hash, content hash, parent engine hash),
 * plus position and seq hash (which must survive a round trip as well). */
struct fx_tuple {
    uint64_t id;
    uint32_t shared;
    uint32_t rank;
    uint32_t tier;
    uint32_t has_parent;
    uint64_t eh, ch, peh;
    uint32_t pos;
    uint64_t seq;
    uint32_t no_content; /* content unknown (placed by seq hash without tokens) */
};

struct fx_snap {
    const struct kvi_index *ix;
    struct fx_tuple *t;         /* sorted after fx_snapshot */
    struct kvi_dump_block *raw; /* emit order */
    size_t n, cap;
    int order_errors;
    int line;
};

/* The public (numeric) id of dense instance @p inst; *shared (may be NULL) whether it is a shared pool. */
uint64_t fx_pub(const struct kvi_index *ix, uint32_t inst, bool *shared);

/* Dump tuples by every field: a total order for snapshots. */
int fx_cmp_tuple(const void *a, const void *b);

/* kvi_index_dump callback: append the block to the fx_snap in @p ctx, soft-checking that its parent came
 * earlier, one position up. */
void fx_dump_emit(void *ctx, const struct kvi_dump_block *b);

/* Dump every partition of ix into s (tuples sorted; raw kept in emit order). */
void fx_snapshot(struct kvi_index *ix, int line, struct fx_snap *s);

static inline void fx_snap_free(struct fx_snap *s)
{
    free(s->t);
    free(s->raw);
    memset(s, 0, sizeof *s);
}

static inline void fx_print_tuple(const char *what, const struct fx_tuple *t)
{
    print_error("    %s: worker %" PRIu64 "%s rank %u tier %u eh %" PRIx64 " content %" PRIx64 " parent %s%" PRIx64
                " pos %u seq %" PRIx64 "%s\n",
                what, t->id, t->shared ? " (shared)" : "", t->rank, t->tier, t->eh, t->ch,
                t->has_parent ? "" : "none/", t->peh, t->pos, t->seq, t->no_content ? " (no content)" : "");
}

/* Whether two sorted snapshots are equal; on a difference, a soft failure at @p line naming @p what and the
 * first differing tuples. */
bool fx_snap_equal(int line, const struct fx_snap *a, const struct fx_snap *b, const char *what);

/* Snapshot of f's index equals `want` (taken earlier). */
static inline void fx_expect_snap(struct fx *f, int line, const struct fx_snap *want, const char *what)
{
    struct fx_snap now;
    fx_snapshot(f->ix, line, &now);
    fx_snap_equal(line, want, &now, what);
    fx_snap_free(&now);
}

/*
 * Replay a dump (raw blocks in emit order) into dst: each block becomes a
 * single-block store; a block without a parent at position > 0 is placed by
 * its position and seq hash (kvi_index_store_seq); a block without content
 * goes through kvi_index_store_seq_only (parent or position the same way).
 */
void fx_replay(const struct fx_snap *s, struct kvi_index *dst, int line);

/* Results normalised to public ids, for comparing two indexes. */
struct fx_norm {
    uint64_t id;
    uint32_t rank, a, b, c, tree;
};

/* Normalised answers by (public id, rank). */
int fx_cmp_norm(const void *x, const void *y);

/*
 * One query's answers by public id, sorted (fx_cmp_norm): @p kind 0
 * find_matches on content, 1 find_matches by seq hashes, 2 find_tiered on
 * content, otherwise find_tiered by seq hashes. @return how many.
 */
size_t fx_norm_query(const struct kvi_index *ix, int kind, const uint64_t *q, size_t n,
                     struct fx_norm *out);

/* Both indexes answer q the same way (find_matches, by_seq, find_tiered by
 * content and by seq), comparing public worker ids. */
bool fx_same_answers(int line, const struct kvi_index *a, const struct kvi_index *b, const uint64_t *q,
                     size_t n);

/* A query chain for fx_round_trip. */
struct fx_q {
    const uint64_t *q;
    size_t n;
};

/*
 * Dump f's index, check parents-before-children, replay into a fresh index of
 * the same configuration, and compare canonical snapshots and the answers to
 * every prefix length of each query in qs.
 */
void fx_round_trip(struct fx *f, int line, const struct fx_q *qs, size_t nq);

#endif
