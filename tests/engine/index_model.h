/*
 * Brute-force reference model of the positional index (engine/index.h), and
 * a seeded random workload generator driving both the model and the index.
 * Shared by index_diff_test.c (single-threaded differential test),
 * index_stress_test.c (concurrent stress test, final quiescent comparison)
 * and index_write_test.c. The functions are defined in index_model.c, built
 * once into kvi_test_engine (tests/CMakeLists.txt); only small helpers stay
 * inline here. The compile-time knobs below (KM_CASCADE_THROUGH_HOLES,
 * KM_CASCADE_INTO_ROOTS, KW_PLACED_PERMILLE) are therefore fixed when that
 * library is built: set them for it, not in a test.
 *
 * THE MODEL (km_*)
 *   Deliberately naive, written from the documented semantics
 *   (../shared/reference/index-semantics.md §2, §4, §5 and engine/index.h),
 *   not from engine/index.c:
 *     - A prefix (a chain of content hashes from position 0) is interned as a
 *       dense id: id = intern(parent id, content), id 0 = the empty prefix.
 *       Interning is exact (parent id and content compared), so two blocks
 *       have the same prefix iff they have the same id.
 *     - A slot is (instance, dp_rank, tier); slots are kept in creation order
 *       and hold a set of blocks: prefix id <-> engine hash (both ways).
 *     - Store: a run attaches under the block the slot names by the parent
 *       engine hash (lower tiers may use another tier of the same (instance,
 *       dp_rank)). Re-storing an engine hash with the same prefix is a no-op;
 *       the same prefix under another engine hash renames it; an engine hash
 *       re-used for another prefix removes the old block first (with its
 *       descendants). A lower-tier run may also be placed by position and
 *       the standard seq hash of its first block (store_seq without parent):
 *       the seq hash names the whole prefix, and the block is a "positional
 *       root" (dumped without parent).
 *     - Remove: the block and its descendants the slot reaches through blocks
 *       it holds itself (every held block whose prefix extends the removed
 *       one with all prefixes in between held by the slot; on the gpu tier,
 *       ancestor-closed, that is every descendant), never entering a block
 *       placed by position (see KM_CASCADE_INTO_ROOTS). A store that would
 *       remove its own parent chain that way is rejected whole (-EINVAL,
 *       unchanged).
 *     - gpu score of a slot for q = the largest k such that the slot holds
 *       the prefixes q[0..i] for every i < k; tree size = blocks of the gpu slot.
 *   Counters mirror struct kvi_index_stats (exact in a quiescent state).
 *
 * THE WORKLOAD (kw_*)
 *   A corpus of documents (token chains over a tiny alphabet, three LoRA
 *   seeds, branching from each other) gives chunk-hash collisions at equal
 *   positions under different prefixes and repeats within a chain. The
 *   generator picks operations from the model's current state: chain
 *   extensions (with overlap), lower-tier offloads, mid-chain removals,
 *   duplicate stores, renames, unknown parents and removes, invalid runs,
 *   clears, remove_dp_rank, remove_instance, and store_seq runs (with a
 *   parent, or placed by position). Engine hashes are arbitrary u64s
 *   derived from (instance, rank, prefix) in three styles (mixed, standard
 *   rolling hash, high bit set) or fresh random values.
 *
 *   One restriction keeps lower-tier parent resolution well defined: within
 *   one (instance, dp_rank) an engine hash never names two different prefixes
 *   on two different tiers (the generator swaps in a fresh hash, or drops the
 *   op).
 */
#ifndef KVI_TESTS_ENGINE_INDEX_MODEL_H
#define KVI_TESTS_ENGINE_INDEX_MODEL_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/hash.h"
#include "engine/index.h"

/* ---- deterministic rng ------------------------------------------------------ */

struct kr_rng {
    uint64_t s;
};

static inline uint64_t kr_next(struct kr_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); 0 when n == 0. */
static inline uint32_t kr_below(struct kr_rng *r, uint32_t n)
{
    return n ? (uint32_t)(kr_next(r) % n) : 0;
}

/* True with probability permille / 1000. */
static inline bool kr_chance(struct kr_rng *r, uint32_t permille)
{
    return kr_below(r, 1000) < permille;
}

static inline void *km_alloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (p == NULL)
        abort();
    return p;
}

/* Grow array @p p of @p elem-byte elements to hold @p need (capacity *cap, doubled from 16); aborts when out of
 * memory. */
void *km_grow(void *p, size_t elem, uint32_t *cap, uint32_t need);

/* ---- a plain dictionary u64 -> u64 (linear probing, backward-shift delete) - */

struct km_map {
    uint64_t *k, *v;
    uint8_t *used;
    uint32_t cap, n; /* cap: power of two or 0 */
};

static inline void km_map_free(struct km_map *mp)
{
    free(mp->k);
    free(mp->v);
    free(mp->used);
    memset(mp, 0, sizeof *mp);
}

static inline uint32_t km_map_home(const struct km_map *mp, uint64_t key)
{
    return (uint32_t)kvi_fmix64(key ^ 0x5851f42d4c957f2dull) & (mp->cap - 1);
}

/* Whether @p key is in the map; *at receives its slot. */
bool km_map_find(const struct km_map *mp, uint64_t key, uint32_t *at);

static inline bool km_map_get(const struct km_map *mp, uint64_t key, uint64_t *val)
{
    uint32_t i;
    if (!km_map_find(mp, key, &i))
        return false;
    if (val)
        *val = mp->v[i];
    return true;
}

/* Insert or overwrite @p key -> @p val (grows the table past half full). */
void km_map_put(struct km_map *mp, uint64_t key, uint64_t val);

/* Rebuild the map with @p cap slots (a power of two). */
void km_map_rehash(struct km_map *mp, uint32_t cap);

/* Remove @p key; @return whether it was there. */
bool km_map_del(struct km_map *mp, uint64_t key);

/* *dst becomes an independent copy of *src (free both). */
void km_map_clone(struct km_map *dst, const struct km_map *src);

/* ---- the model ---------------------------------------------------------------- */

#define KM_ROOT 0u

struct km_pfx {
    uint32_t parent; /* prefix id of the parent, KM_ROOT at position 0 */
    uint32_t pos;    /* position of the last block */
    uint64_t content;
    uint64_t seq; /* standard rolling hash of the prefix */
    bool placed;  /* ever the first block of a run placed by position: the index's
                   * entry may then not know its parent (see km_store_known) */
};

struct km_slot {
    uint32_t instance, rank;
    enum kvi_tier tier;
    struct km_map by_pid; /* prefix id -> engine hash */
    struct km_map by_eh;  /* engine hash -> prefix id */
    struct km_map roots;  /* prefix ids placed by position and seq hash alone (no parent named) */
};

struct km_model {
    struct km_pfx *pf; /* pf[0] = the empty prefix */
    uint32_t n_pf, cap_pf;
    uint32_t *pf_tab; /* open addressing over prefix ids, 0 = empty */
    uint32_t pf_tab_cap;
    struct km_map pf_by_seq; /* standard seq hash -> prefix id */
    struct km_slot *slots; /* live slots in creation order */
    uint32_t n_slots, cap_slots;
    uint32_t n_instances; /* valid dense instance ids: [0, n_instances) */
    struct kvi_index_stats st;
    uint64_t cycles; /* stores rejected for dropping their own parent chain */
};

/* An empty model over dense instance ids [0, @p n_instances). */
void km_init(struct km_model *m, uint32_t n_instances);

/* Free everything the model holds; *m is zeroed. */
void km_free(struct km_model *m);

static inline uint32_t km_pf_home(const struct km_model *m, uint32_t parent, uint64_t content)
{
    return (uint32_t)kvi_fmix64(content ^ kvi_fmix64(parent + 0x9e3779b97f4a7c15ull)) & (m->pf_tab_cap - 1);
}

/* The id of prefix parent + [content], or KM_ROOT if never interned. */
uint32_t km_lookup(const struct km_model *m, uint32_t parent, uint64_t content);

/* The id of prefix parent + [content], interned if new. */
uint32_t km_intern(struct km_model *m, uint32_t parent, uint64_t content);

/* The interned prefix whose standard seq hash is seq, at position pos (a seq
 * hash names a whole prefix); KM_ROOT if none. */
static inline uint32_t km_seq_pid(const struct km_model *m, uint64_t seq, uint32_t pos)
{
    uint64_t id;
    if (!km_map_get(&m->pf_by_seq, seq, &id) || m->pf[id].pos != pos)
        return KM_ROOT;
    return (uint32_t)id;
}

/* Is `anc` a proper ancestor of `id`? */
bool km_is_ancestor(const struct km_model *m, uint32_t anc, uint32_t id);

/* Content hashes of a prefix (out must hold pos + 1 values). @return length */
static inline uint32_t km_prefix_content(const struct km_model *m, uint32_t id, uint64_t *out)
{
    if (id == KM_ROOT)
        return 0;
    uint32_t len = m->pf[id].pos + 1;
    for (uint32_t i = len; i-- > 0; id = m->pf[id].parent)
        out[i] = m->pf[id].content;
    return len;
}

static inline struct km_slot *km_slot_find(const struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier)
{
    for (uint32_t i = 0; i < m->n_slots; i++)
        if (m->slots[i].instance == inst && m->slots[i].rank == rank && m->slots[i].tier == tier)
            return &m->slots[i];
    return NULL;
}

/* A new empty slot (inst, rank, tier), appended in creation order (counted in st.slots). */
struct km_slot *km_slot_create(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier);

static inline bool km_holds(const struct km_slot *s, uint32_t pid)
{
    return s != NULL && km_map_get(&s->by_pid, pid, NULL);
}

static inline void km_block_add(struct km_model *m, struct km_slot *s, uint32_t pid, uint64_t eh)
{
    km_map_put(&s->by_pid, pid, eh);
    km_map_put(&s->by_eh, eh, pid);
    m->st.holdings++;
    m->st.stored_blocks++;
}

/* Drop prefix @p pid from slot @p s (it must hold it), without its descendants; counted as removed. */
void km_block_drop(struct km_model *m, struct km_slot *s, uint32_t pid);

/*
 * Which blocks a removal takes along. 0 (engine/index.h): those reached through
 * blocks the slot itself holds. 1: every block of the slot whose prefix extends
 * the removed one (differs on lower tiers only, whose holdings need not be
 * ancestor-closed: a lower-tier block hanging below another tier's block).
 */
#ifndef KM_CASCADE_THROUGH_HOLES
#define KM_CASCADE_THROUGH_HOLES 0
#endif
/*
 * Blocks placed by position (store_seq without parent: "positional roots").
 * 0: a cascade from above never enters one: a positional root, and what hangs
 *    below it, goes only when it is removed itself (or cleared). This is the
 *    rule the index can implement whatever happened before: it cannot tell
 *    which held block a placed block sits under (a seq hash does not give its
 *    parent's), unless some other store linked the two.
 * 1: a positional root is a descendant like any other block (its identity is
 *    its whole prefix), so a cascade enters it when the slot holds the block
 *    above it.
 */
#ifndef KM_CASCADE_INTO_ROOTS
#define KM_CASCADE_INTO_ROOTS 0
#endif

static inline bool km_is_root_in_slot(const struct km_slot *s, uint32_t pid)
{
    return !KM_CASCADE_INTO_ROOTS && km_map_get(&s->roots, pid, NULL);
}

/* Is block id of slot s taken along when the slot's block anc is removed? */
static inline bool km_is_descendant_in_slot(const struct km_model *m, const struct km_slot *s, uint32_t anc,
                                            uint32_t id)
{
    if (!km_is_ancestor(m, anc, id) || km_is_root_in_slot(s, id))
        return false;
    for (uint32_t p = m->pf[id].parent; p != anc; p = m->pf[p].parent)
        if ((!KM_CASCADE_THROUGH_HOLES && !km_holds(s, p)) || km_is_root_in_slot(s, p))
            return false;
    return true;
}

/* Remove the slot's block `pid` and its descendants held by the slot. */
void km_remove_cascade(struct km_model *m, struct km_slot *s, uint32_t pid);

/* Resolve a parent engine hash for a store into (inst, rank, tier): the slot's
 * own block, else (lower tiers only) a block of another tier of the same
 * (instance, rank), first slot in creation order. @return prefix id or ROOT. */
uint32_t km_resolve_parent(const struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                           uint64_t peh);

/* Whether a run names its own parent or repeats an engine hash (the index rejects it whole). */
bool km_run_invalid(bool has_parent, uint64_t peh, const struct kvi_block *b, size_t n);

/*
 * Store a run (kvi_index_store, or kvi_index_store_seq when seq != NULL: then
 * without a parent, or on a lower tier below a parent the rank does not hold,
 * at position > 0 the run is placed by the seq hash of its first block, a
 * "positional root"; otherwise the seq hashes are assumed to be the standard
 * ones of the content chain).
 * @return 0, -ENOENT (unknown parent), -EINVAL (bad instance or tier,
 * repeated engine hash, run containing its parent, a gpu run placed by
 * position, or a rename that would drop the run's own parent chain: the model
 * is then left unchanged).
 */
int km_store_any(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier, bool has_parent,
                 uint64_t peh, uint32_t position, const struct kvi_block *b, const uint64_t *seq,
                 size_t n);

static inline int km_store(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier, bool has_parent,
                           uint64_t peh, const struct kvi_block *b, size_t n)
{
    return km_store_any(m, inst, rank, tier, has_parent, peh, 0, b, NULL, n);
}

/* The prefix (inst, rank) names eh, looked up gpu, cpu, disk, external. */
uint32_t km_resolve_known(const struct km_model *m, uint32_t inst, uint32_t rank, uint64_t eh);

static inline bool km_rank_holds(const struct km_model *m, uint32_t inst, uint32_t rank, uint32_t pid)
{
    for (uint32_t i = 0; i < m->n_slots; i++)
        if (m->slots[i].instance == inst && m->slots[i].rank == rank && km_holds(&m->slots[i], pid))
            return true;
    return false;
}

/*
 * kvi_index_store_known, from its documentation: each hash is resolved to the
 * prefix (inst, rank) names by it (gpu first), applied in position order; a
 * block already held under the hash counts; the target slot's other meaning
 * of the hash is removed first (with descendants); a held prefix under
 * another name is renamed; a new block hangs below its parent when the slot
 * (gpu) or some tier of the rank (lower tiers) holds the parent, else it is a
 * positional root (lower tiers) or skipped (gpu). The parent is the true
 * parent prefix: the index knows it unless the prefix's entry was placed by
 * position and never linked, which the workload avoids (km_pfx.placed).
 * @return blocks held on the tier from the run; *unres skipped hashes.
 */
size_t km_store_known(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                      const uint64_t *ehs, size_t n, size_t *unres);

/* @return the number of engine hashes that were known when reached */
size_t km_remove(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                 const uint64_t *ehs, size_t n);

static inline void km_slot_empty(struct km_model *m, struct km_slot *s)
{
    m->st.holdings -= s->by_pid.n;
    m->st.removed_blocks += s->by_pid.n;
    km_map_free(&s->by_pid);
    km_map_free(&s->by_eh);
    km_map_free(&s->roots);
}

/* rank == UINT32_MAX: every rank. forget: also drop the slots. */
void km_drop(struct km_model *m, uint32_t inst, uint32_t rank, bool forget);

static inline void km_clear(struct km_model *m, uint32_t inst) { km_drop(m, inst, UINT32_MAX, false); }
static inline void km_clear_dp_rank(struct km_model *m, uint32_t inst, uint32_t rank) { km_drop(m, inst, rank, false); }
static inline void km_remove_dp_rank(struct km_model *m, uint32_t inst, uint32_t rank) { km_drop(m, inst, rank, true); }
static inline void km_remove_instance(struct km_model *m, uint32_t inst) { km_drop(m, inst, UINT32_MAX, true); }

static inline uint32_t km_tree_size(const struct km_model *m, uint32_t inst, uint32_t rank)
{
    const struct km_slot *s = km_slot_find(m, inst, rank, KVI_TIER_GPU);
    return s ? s->by_pid.n : 0;
}

/* Prefix ids of q[0..i] for each i while interned. @return how many. */
size_t km_query_ids(const struct km_model *m, const uint64_t *q, size_t n, uint32_t *ids);

/* Matches by (instance, dp_rank, depth). */
static inline int km_cmp_match(const void *a, const void *b)
{
    const struct kvi_match *x = a, *y = b;
    if (x->instance != y->instance)
        return x->instance < y->instance ? -1 : 1;
    if (x->dp_rank != y->dp_rank)
        return x->dp_rank < y->dp_rank ? -1 : 1;
    return (x->depth > y->depth) - (x->depth < y->depth);
}

/*
 * Gpu matches of content query @p q (n hashes): every gpu slot with a score
 * >= 1 (slot field 0), sorted by (instance, dp_rank). @return count (all
 * written: out holds n_slots).
 */
size_t km_match(const struct km_model *m, const uint64_t *q, size_t n, struct kvi_match *out);

/* ---- dumps / canonical snapshots ------------------------------------------------ */

struct kd_set {
    struct kvi_dump_block *r;
    uint32_t n, cap;
};

static inline void kd_push(struct kd_set *d, const struct kvi_dump_block *b)
{
    d->r = km_grow(d->r, sizeof *d->r, &d->cap, d->n + 1);
    d->r[d->n++] = *b;
}

static inline void kd_free(struct kd_set *d)
{
    free(d->r);
    memset(d, 0, sizeof *d);
}

/* Canonical order: (instance, rank, tier, engine hash, ...) — full records. */
int kd_cmp(const void *a, const void *b);

static inline void kd_sort(struct kd_set *d)
{
    if (d->n > 1)
        qsort(d->r, d->n, sizeof *d->r, kd_cmp);
}

/* Print one dump record on @p f, labelled @p tag. */
void kd_print_rec(FILE *f, const char *tag, const struct kvi_dump_block *r);

/*
 * The model's dump: every held block; the parent named by the slot itself,
 * else by the lowest-numbered tier of the same (instance, rank) that holds
 * the parent (gpu, cpu, disk, external), else no parent (the block is then
 * placed by position and seq hash). Positional roots keep no parent.
 */
void km_dump(const struct km_model *m, struct kd_set *out);

/* ---- corpus ------------------------------------------------------------------ */

#define KW_LORAS 3

struct kw_doc {
    uint32_t len;
    uint32_t lora;
    uint32_t *tok;
    uint64_t *content;
};

struct kw_corpus {
    uint32_t n;
    struct kw_doc *d;
    uint64_t lora_seed[KW_LORAS];
    uint32_t max_len;
};

static inline uint64_t kw_content(const struct kw_corpus *c, uint32_t tok, uint32_t lora)
{
    return kvi_hash_block(&tok, 1, c->lora_seed[lora]);
}

/* Tiny alphabet: mostly tokens 0..2, sometimes 3..9. */
static inline uint32_t kw_token(struct kr_rng *r)
{
    return kr_chance(r, 900) ? kr_below(r, 3) : 3 + kr_below(r, 7);
}

/*
 * n docs: most branch off an earlier doc at a random cut and continue with
 * random tokens; n_long of them are long (long_len .. long_len + 40 blocks).
 */
void kw_corpus_build(struct kw_corpus *c, uint64_t seed, uint32_t n, uint32_t max_len, uint32_t n_long,
                     uint32_t long_len);

static inline void kw_corpus_free(struct kw_corpus *c)
{
    for (uint32_t i = 0; i < c->n; i++) {
        free(c->d[i].tok);
        free(c->d[i].content);
    }
    free(c->d);
    memset(c, 0, sizeof *c);
}

/* ---- operations ------------------------------------------------------------------ */

enum kw_kind { KW_STORE, KW_REMOVE, KW_CLEAR, KW_REMOVE_RANK, KW_REMOVE_INSTANCE, KW_STORE_KNOWN, KW_CLEAR_RANK };

struct kw_op {
    enum kw_kind kind;
    const char *why; /* generator label */
    uint32_t inst, rank;
    enum kvi_tier tier;
    bool has_parent;
    uint64_t peh;
    uint32_t n;
    struct kvi_block *b; /* store: the run; remove: engine_hash only */
    uint64_t *seq;       /* non-NULL: kvi_index_store_seq with these seq hashes */
    bool tokenless;      /* with seq: kvi_index_store_seq_only (content hashes for the model only) */
    uint32_t position;   /* store_seq: position of a run without parent */
    uint64_t *above;     /* store_seq placed at position: content of positions 0 .. position-1 (for
                          * the model only: what prefix the seq hash names) */
    long rc;             /* index result: store rc, remove known count */
};

/* The op kind's name ("store", "remove", ...). */
const char *kw_kind_name(enum kw_kind k);

/* Print @p op (kind, instance, rank, tier, blocks) on @p f. */
void kw_op_print(FILE *f, const struct kw_op *op);

/* *dst becomes a deep copy of *src (its blocks, seq hashes and content above); free it with kw_op_free. */
void kw_op_copy(struct kw_op *dst, const struct kw_op *src);

/* Free what kw_op_copy allocated. */
static inline void kw_op_free(struct kw_op *op)
{
    free(op->b);
    free(op->seq);
    free(op->above);
    op->b = NULL;
    op->seq = NULL;
    op->above = NULL;
}

/* Apply @p op to the model: a store's 0 / -ENOENT / -EINVAL, a remove's or store_known's count, 0 for the others. */
long kw_apply_model(struct km_model *m, const struct kw_op *op);

/* Single writer of the instance's partition only. */
long kw_apply_index(struct kvi_index *ix, const struct kw_op *op);

/* ---- generator ---------------------------------------------------------------- */

#define KW_MAX_RUN 200
#define KW_HISTORY 128

struct kw_gen {
    struct kr_rng rng;
    const struct kw_corpus *corp;
    const uint32_t *inst; /* instances this generator mutates */
    uint32_t n_inst;
    uint32_t n_hot;   /* the first n_hot of inst[] get most of the ops */
    uint32_t n_ranks; /* dp ranks 0 .. n_ranks-1 */
    uint32_t n_valid; /* interned instances (ids >= n_valid are unknown) */
    bool wild;        /* also unknown instances and invalid tiers */
    bool corners;     /* engine hashes re-used for other blocks, blocks placed below held ones */
    bool placements;  /* lower-tier runs placed by position (store_seq without parent) */
    bool known_ops;   /* token-less stores by engine hash (kvi_index_store_known) */
    bool tokenless;   /* some store_seq runs without tokens (kvi_index_store_seq_only) */
    uint32_t w_clear, w_remove_rank, w_remove_instance; /* weights, per mille */
    struct kw_op hist[KW_HISTORY]; /* recent stores, for duplicates */
    uint32_t n_hist, hist_at;
    struct kvi_block buf[KW_MAX_RUN + 4];
    uint64_t seqbuf[KW_MAX_RUN + 4];
    uint64_t *above; /* content above a placed run */
    uint32_t cap_above;
};

/*
 * A generator seeded with @p seed over corpus @p corp, mutating instances
 * inst[0 .. n_inst) on dp ranks [0, n_ranks); ids >= @p n_valid are unknown.
 * Corner cases and placements on, no wild ops, default weights (struct kw_gen).
 */
void kw_gen_init(struct kw_gen *g, uint64_t seed, const struct kw_corpus *corp, const uint32_t *inst,
                 uint32_t n_inst, uint32_t n_ranks, uint32_t n_valid);

static inline void kw_gen_free(struct kw_gen *g)
{
    for (uint32_t i = 0; i < g->n_hist; i++)
        kw_op_free(&g->hist[i]);
    g->n_hist = 0;
    free(g->above);
    g->above = NULL;
}

/* Record what a run placed at `position` sits below: prefix id `pid` (at
 * position - 1), for models that replay the op. */
static inline void kw_set_above(struct kw_gen *g, const struct km_model *m, struct kw_op *op, uint32_t pid)
{
    g->above = km_grow(g->above, sizeof *g->above, &g->cap_above, op->position + 1);
    (void)km_prefix_content(m, pid, g->above);
    op->above = g->above;
}

/* Keep a copy of @p op in the history ring (duplicates of recent stores draw from it). */
void kw_gen_remember(struct kw_gen *g, const struct kw_op *op);

/* Engine hash naming style of an instance: arbitrary mix, the standard rolling
 * hash of the prefix (RFC 1527 publishers), or a mix with the top bit set. */
static inline uint64_t kw_name(const struct km_model *m, uint32_t inst, uint32_t rank, uint32_t pid)
{
    uint64_t seq = m->pf[pid].seq;
    switch (kvi_fmix64(inst * 0x2545f4914f6cdd1dull + 7) % 3) {
    case 0: return kvi_fmix64(seq ^ kvi_fmix64(((uint64_t)inst << 20) + rank + 1));
    case 1: return seq;
    default: return kvi_fmix64(seq + inst * 0x9e3779b97f4a7c15ull + rank) | (1ull << 63);
    }
}

static inline uint32_t kw_pick_inst(struct kw_gen *g)
{
    if (kr_chance(&g->rng, 700))
        return g->inst[kr_below(&g->rng, g->n_hot)];
    return g->inst[kr_below(&g->rng, g->n_inst)];
}

static inline uint32_t kw_pick_rank(struct kw_gen *g)
{
    return kr_chance(&g->rng, 500) ? 0 : kr_below(&g->rng, g->n_ranks);
}

static inline enum kvi_tier kw_pick_lower_tier(struct kw_gen *g)
{
    uint32_t x = kr_below(&g->rng, 10);
    return x < 6 ? KVI_TIER_CPU : x < 9 ? KVI_TIER_DISK : KVI_TIER_EXTERNAL;
}

/* How many leading blocks of the doc the slot holds (contiguously). Interns
 * the doc's prefixes into pids[] (all len of them). */
uint32_t kw_doc_held(struct km_model *m, const struct km_slot *s, const struct kw_doc *d, uint32_t *pids);

/* The engine hash a store should use for block pid of slot s: the slot's
 * current name if it holds it (mostly), else the instance's naming. */
static inline uint64_t kw_eh_for(struct kw_gen *g, const struct km_model *m, const struct km_slot *s, uint32_t inst,
                                 uint32_t rank, uint32_t pid)
{
    uint64_t eh;
    if (s != NULL && km_map_get(&s->by_pid, pid, &eh) && kr_chance(&g->rng, 800))
        return eh;
    return kw_name(m, inst, rank, pid);
}

/*
 * The cross-tier naming rule (see the file comment): would storing eh as
 * prefix pid into slot (inst, rank, tier) make eh name two prefixes on two
 * tiers of (inst, rank)?
 */
bool kw_conflict(const struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier, uint64_t eh,
                 uint32_t pid);

/*
 * Apply the naming rule to a store op: replace conflicting engine hashes by
 * fresh random ones (fix = true) or report failure (fix = false).
 */
bool kw_guard(struct kw_gen *g, struct km_model *m, struct kw_op *op, bool fix);

/*
 * A store_seq run with a parent (or at the root) gets the standard seq hashes
 * of the chain it really extends: its parent engine hash may name another
 * block by now (renames, duplicates of old ops). Placed runs are left alone.
 */
void kw_fix_seqs(struct km_model *m, struct kw_op *op);

/* A random non-empty slot (gpu only if @p gpu_only) of a picked instance; NULL after 8 misses. */
const struct km_slot *kw_random_slot(struct kw_gen *g, const struct km_model *m, bool gpu_only);

/* A random held block of a slot: its prefix id and engine hash. */
uint32_t kw_random_block(struct kw_gen *g, const struct km_slot *s, uint64_t *eh);

/* Name of prefix pid as some slot of (inst, rank) holds it (own tier first). */
bool kw_holder_eh(const struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                  uint32_t pid, uint64_t *eh);

#ifndef KW_PLACED_PERMILLE
#define KW_PLACED_PERMILLE 400
#endif

/* Extend (gpu) or offload (lower tier) a chain of a random doc. */
void kw_gen_chain(struct kw_gen *g, struct km_model *m, struct kw_op *op, bool lower);

/* An engine hash no slot of (inst, rank) holds. */
uint64_t kw_unknown_eh(struct kw_gen *g, const struct km_model *m, uint32_t inst, uint32_t rank);

/*
 * Produce the next op (op->b points into the generator's buffer: copy it to
 * keep it).
 */
void kw_gen_next(struct kw_gen *g, struct km_model *m, struct kw_op *op);

#endif
