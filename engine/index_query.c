/*
 * The positional index's read side (see the DESIGN notes in engine/index.c):
 * prefix keys, per-thread query scratch, the jump search over gpu member
 * counts (probe, refine, assign, find_core), kvi_index_find_matches*, and
 * the tiered and shared-pool depths. Queries run inside RCU read-side
 * sections, concurrently with the writers.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/hash.h"
#include "engine/hash_impl.h"
#include "engine/index_impl.h"

/* ---- prefix keys ------------------------------------------------------------ */

/* The whole chain at once (engine/index_keys.c; queries compute theirs
 * lazily, keys_upto). test_prefix_keys_match_definition pins it to the
 * definition. */
void kvi_index_prefix_keys(const struct kvi_index *ix, const uint64_t *content, size_t n, uint64_t *keys)
{
    uint64_t k = ix->kseed, w = 0;
    kvi_ix__keys_run(ix, content, 0, n, keys, &k, &w);
}

/* ---- queries ---------------------------------------------------------------- */

/* Per-partition prefix keys of a seq query, found by seq_walk (partitions
 * without a seq table), valid for the query with generation gen. */
struct pview {
    uint32_t gen;
    uint32_t n;
    uint64_t *keys;
    size_t cap;
};

struct qscratch {
    uint64_t *keys;
    size_t cap_keys;
    /* A content query's prefix keys are computed lazily, a chunk at a time
     * as the search reaches them (keys_upto): keys[0..kready) are valid, and
     * (kk, kw) resume the chain after them. kready == kn once all are (and
     * for every other kind of query from its start). */
    const uint64_t *kcontent;
    size_t kready, kn;
    uint64_t kk, kw;
    struct pview *pv; /* by partition, allocated on the first seq walk */
    uint32_t n_pv;
    uint32_t pv_gen;
    uint32_t *depth;
    uint32_t *gen;
    size_t cap_slots;
    uint32_t cur_gen;
    struct kvi_match *gm;
    size_t cap_gm;
};

static pthread_key_t qs_key;
static pthread_once_t qs_once = PTHREAD_ONCE_INIT;

static void qs_free(void *v)
{
    struct qscratch *q = v;
    for (uint32_t i = 0; i < q->n_pv; i++)
        free(q->pv[i].keys);
    free(q->pv);
    free(q->keys);
    free(q->depth);
    free(q->gen);
    free(q->gm);
    free(q);
}

static void qs_init(void)
{
    if (pthread_key_create(&qs_key, qs_free) != 0)
        kvi_die("pthread_key_create");
}

static struct qscratch *qs_get(void)
{
    pthread_once(&qs_once, qs_init);
    struct qscratch *q = pthread_getspecific(qs_key);
    if (KVI_UNLIKELY(q == NULL)) {
        q = kvi_xcalloc(1, sizeof *q);
        pthread_setspecific(qs_key, q);
    }
    return q;
}

static uint64_t *qs_keys(struct qscratch *q, size_t n)
{
    if (KVI_UNLIKELY(n > q->cap_keys)) {
        q->cap_keys = KVI_MAX(n, 1024);
        free(q->keys);
        q->keys = kvi_xmalloc(q->cap_keys * sizeof(uint64_t));
    }
    return q->keys;
}

static void qs_slots(struct qscratch *q, size_t n_slots)
{
    if (KVI_UNLIKELY(n_slots > q->cap_slots)) {
        size_t cap = KVI_MAX(n_slots * 2, 256);
        q->depth = kvi_xrealloc(q->depth, cap * sizeof(uint32_t));
        q->gen = kvi_xrealloc(q->gen, cap * sizeof(uint32_t));
        memset(q->gen + q->cap_slots, 0, (cap - q->cap_slots) * sizeof(uint32_t));
        q->cap_slots = cap;
    }
    if (KVI_UNLIKELY(++q->cur_gen == 0)) {
        memset(q->gen, 0, q->cap_slots * sizeof(uint32_t));
        q->cur_gen = 1;
    }
}

/* A query's keys: prefix keys K (content, no seq placements in the index)
 * or standard seq hashes. */
struct qkeys {
    enum tab_kind kind; /* TAB_KEY or TAB_SEQ */
    const uint64_t *keys;
    size_t n;
};

/* The query's entry at position t in partition p, or NULL. Reader.
 * always_inline (and probe's): GCC inlined both into find_core and refine on
 * its own while the index was one file, but not in this smaller one. */
static inline const struct kvi_entry *entry_at(const struct kvi_index *ix, const struct kvi_part *p,
                                               enum tab_kind kind, uint64_t key, uint32_t t)
    __attribute__((always_inline));
static inline const struct kvi_entry *entry_at(const struct kvi_index *ix, const struct kvi_part *p,
                                               enum tab_kind kind, uint64_t key, uint32_t t)
{
    struct tab_ctx c = {ix, p, kind, 0};
    uint32_t idx = tab_find_at_t(&c, kind == TAB_KEY ? &p->ktab : &p->stab, key, kind_tag(ix, kind, key), t);
    return idx == KVI_NONE ? NULL : kvi__entry(p, idx);
}

/*
 * Prefix keys of a seq query in partition p, which has no seq table: the
 * root's key follows from seq[0] (at position 0 the seq hash is the content
 * hash), and each next entry is the child whose seq hash is seq[t]. Every
 * entry of such a partition has its real prefix key (nothing is placed by
 * seq alone there). @return positions resolved (keys[0..ret)). Reader.
 */
static size_t seq_walk(const struct kvi_index *ix, const struct kvi_part *p, const uint64_t *seq, size_t n,
                       uint64_t *keys)
{
    if (n == 0)
        return 0;
    uint64_t k0 = key_step(ix, ix->kseed, seq[0], 0);
    const struct kvi_entry *e = entry_at(ix, p, TAB_KEY, k0, 0); /* its content is seq[0] */
    if (e == NULL)
        return 0;
    keys[0] = k0;
    for (size_t t = 1; t < n; t++) {
        uint32_t c = atomic_load_explicit(&((struct kvi_entry *)e)->first_child, memory_order_acquire); /* R5 */
        const struct kvi_entry *next = NULL;
        while (c != KVI_NONE) {
            const struct kvi_entry *x = kvi__entry(p, c);
            /* no seq hash is kept here: derive the child's from its content,
             * which follows from its key and e's (all keys are real here) */
            if (kvi__seq_step(seq[t - 1], content_of_key(ix, x->key, e->key, x->pos)) == seq[t]) {
                next = x;
                break;
            }
            c = atomic_load_explicit(&((struct kvi_entry *)x)->next_sibling, memory_order_acquire); /* R5 */
        }
        if (next == NULL)
            return t;
        keys[t] = next->key;
        e = next;
    }
    return n;
}

/*
 * Keys for querying partition pi: the query's own, or for a seq query in a
 * partition without a seq table, the prefix keys a seq walk finds (once per
 * query and partition), and the writers are asked for seq tables. Reader.
 */
static const uint64_t *part_keys(const struct kvi_index *ix, struct qscratch *q, const struct qkeys *qk, uint32_t pi,
                                 enum tab_kind *kind, size_t *n)
{
    *kind = qk->kind;
    *n = qk->n;
    const struct kvi_part *p = &ix->parts[pi];
    if (qk->kind == TAB_KEY ||
        atomic_load_explicit(&((struct kvi_part *)p)->stab.t, memory_order_acquire) != NULL) /* R3 */
        return qk->keys;
    if (KVI_UNLIKELY(q->n_pv < ix->n_parts)) {
        q->pv = kvi_xrealloc(q->pv, ix->n_parts * sizeof *q->pv);
        memset(q->pv + q->n_pv, 0, (ix->n_parts - q->n_pv) * sizeof *q->pv);
        q->n_pv = ix->n_parts;
    }
    struct pview *v = &q->pv[pi];
    if (v->gen != q->pv_gen) {
        if (v->cap < qk->n) {
            v->cap = KVI_MAX(qk->n, 256);
            free(v->keys);
            v->keys = kvi_xmalloc(v->cap * sizeof(uint64_t));
        }
        v->n = (uint32_t)seq_walk(ix, p, qk->keys, qk->n, v->keys);
        v->gen = q->pv_gen;
        if (!atomic_load_explicit(&((struct kvi_index *)ix)->seq_wanted, memory_order_relaxed))
            atomic_store_explicit(&((struct kvi_index *)ix)->seq_wanted, true, memory_order_relaxed);
    }
    *kind = TAB_KEY;
    *n = v->n;
    return v->keys;
}

/* Start a query: part_keys results of earlier queries are stale. */
static void qs_begin(struct qscratch *q)
{
    if (KVI_UNLIKELY(++q->pv_gen == 0)) {
        for (uint32_t i = 0; i < q->n_pv; i++)
            q->pv[i].gen = 0;
        q->pv_gen = 1;
    }
}

/* Prefix keys computed per lazy step: a query that misses early computes at
 * most this many keys past the last position it probed. */
#define QKEY_CHUNK 64u

/*
 * Make the current query's keys[0..t] valid (t < kn): compute them up to
 * the end of t's chunk of QKEY_CHUNK positions. A query that diverges stops
 * computing at the first chunk past its divergence, where the search stops
 * probing; a full hit computes every key, as before, a chunk at a time.
 * measured (kvidx-bench micro, 3 interleaved runs each against the
 * computation of all keys up front): see bench/README.md#micro.
 */
static void keys_upto(const struct kvi_index *ix, struct qscratch *q, size_t t)
{
    size_t to = (t / QKEY_CHUNK + 1) * QKEY_CHUNK;
    if (to > q->kn)
        to = q->kn;
    kvi_ix__keys_run(ix, q->kcontent, q->kready, to, q->keys, &q->kk, &q->kw);
    q->kready = to;
}

/* All of the current query's keys (the paths that read keys[] directly). */
static void keys_all(const struct kvi_index *ix, struct qscratch *q)
{
    if (q->kready < q->kn)
        keys_upto(ix, q, q->kn - 1);
}

struct finder {
    const struct kvi_index *ix;
    const struct kvi_part *p;
    enum tab_kind kind;
    const uint64_t *keys;
    struct qscratch *q;
    uint32_t n_slots;
};

/* The member array of e for a reader, or NULL with *one = the single member
 * slot (KVI_NONE if none). Reader (acquire: R2). */
static inline struct kvi_mset *entry_members(const struct kvi_entry *e, uint32_t *one)
{
    uint32_t o = atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_acquire); /* R2 */
    *one = o & KVI_SLOT_MASK;
    return o == KVI_MANY_BIT ? kvi__mset(e, memory_order_acquire) : NULL;
}

/* How many gpu members e has (the jump search's cardinality): an array's
 * count, or whether the single member's slot is on the gpu tier. Reader
 * (acquire: R2). */
static inline uint32_t gpu_count(const struct kvi_index *ix, const struct kvi_entry *e)
{
    uint32_t one;
    struct kvi_mset *ms = entry_members(e, &one);
    if (ms != NULL)
        return atomic_load_explicit(&ms->gpu_n, memory_order_acquire); /* R2 */
    return one != KVI_NONE && kvi__slot(ix, one)->tier == KVI_TIER_GPU;
}

/* Tier under which slot s holds e, or -1. Reader (acquire loads). */
static int member_tier(const struct kvi_index *ix, const struct kvi_entry *e, uint32_t s)
{
    uint32_t one;
    struct kvi_mset *ms = entry_members(e, &one);
    if (ms == NULL)
        return one == s && s != KVI_NONE ? kvi__slot(ix, s)->tier : -1;
    uint32_t n = atomic_load_explicit(&ms->n, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t w = atomic_load_explicit(&ms->m[i].w, memory_order_acquire); /* R2 */
        if (kvi__member_slot(w) == s)
            return kvi__member_tier(w) & KVI_MEMBER_TIER;
    }
    return -1;
}

#ifdef KVI_TEST_PROBE_HOOK
/* Test builds only (tests/engine/index_query_race_test.c compiles this file
 * with KVI_TEST_PROBE_HOOK): called before every probe of position t, so a
 * test can change the index at a chosen point of a query, the interleaving
 * of a concurrent writer made deterministic. Defined by the test. */
void kvi_ix__test_probe_hook(const struct kvi_index *ix, uint32_t t);
#define KVI_PROBE_HOOK(ix, t) kvi_ix__test_probe_hook((ix), (t))
#else
#define KVI_PROBE_HOOK(ix, t) ((void)0)
#endif

static inline const struct kvi_entry *probe(const struct finder *f, uint32_t t, uint32_t *cnt)
    __attribute__((always_inline));
static inline const struct kvi_entry *probe(const struct finder *f, uint32_t t, uint32_t *cnt)
{
    KVI_PROBE_HOOK(f->ix, t);
    if (KVI_UNLIKELY(t >= f->q->kready))
        keys_upto(f->ix, f->q, t);
    const struct kvi_entry *e = entry_at(f->ix, f->p, f->kind, f->keys[t], t);
    *cnt = e ? gpu_count(f->ix, e) : 0;
    return e;
}

/* Every gpu member of e has matched at least `depth` blocks. */
static void assign(const struct finder *f, const struct kvi_entry *e, uint32_t depth)
{
    if (e == NULL)
        return;
    struct qscratch *q = f->q;
    uint32_t s;
    struct kvi_mset *ms = entry_members(e, &s); /* R2 */
    if (ms == NULL) {
        if (s != KVI_NONE && s < f->n_slots && kvi__slot(f->ix, s)->tier == KVI_TIER_GPU) {
            q->depth[s] = depth;
            q->gen[s] = q->cur_gen;
        }
        return;
    }
    uint32_t n = atomic_load_explicit(&ms->n, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t w = atomic_load_explicit(&ms->m[i].w, memory_order_acquire); /* R2 */
        uint32_t ms_slot = kvi__member_slot(w);
        if (ms_slot != KVI_NONE && (kvi__member_tier(w) & KVI_MEMBER_TIER) == KVI_TIER_GPU && ms_slot < f->n_slots) {
            q->depth[ms_slot] = depth;
            q->gen[ms_slot] = q->cur_gen;
        }
    }
}

/* Counts differ between lo and hi: find the drain points in (lo, hi]. */
static void refine(const struct finder *f, uint32_t lo, const struct kvi_entry *elo, uint32_t clo, uint32_t hi,
                   const struct kvi_entry *ehi, uint32_t chi)
{
    if (hi == lo + 1) {
        assign(f, elo, hi);
        return;
    }
    uint32_t mid = lo + (hi - lo) / 2, cmid;
    const struct kvi_entry *emid = probe(f, mid, &cmid);
    if (cmid != clo)
        refine(f, lo, elo, clo, mid, emid, cmid);
    if (cmid != chi)
        refine(f, mid, emid, cmid, hi, ehi, chi);
}

/* Extend, from position t on, every slot whose depth is t and that holds
 * position t on the gpu tier (and so on while any does). Walks the members
 * of the entries it probes, not the slots it extends. */
static void extend_from(const struct finder *f, uint32_t t, uint32_t n)
{
    struct qscratch *q = f->q;
    for (; t < n; t++) {
        uint32_t cnt, one;
        const struct kvi_entry *e = probe(f, t, &cnt);
        if (e == NULL)
            return;
        bool any = false;
        struct kvi_mset *ms = entry_members(e, &one); /* R2 */
        if (ms == NULL) {
            if (one != KVI_NONE && one < f->n_slots && q->gen[one] == q->cur_gen && q->depth[one] == t &&
                kvi__slot(f->ix, one)->tier == KVI_TIER_GPU) {
                q->depth[one] = t + 1;
                any = true;
            }
        } else {
            uint32_t m = atomic_load_explicit(&ms->n, memory_order_acquire);
            for (uint32_t i = 0; i < m; i++) {
                uint64_t w = atomic_load_explicit(&ms->m[i].w, memory_order_acquire); /* R2 */
                uint32_t s = kvi__member_slot(w);
                if (s != KVI_NONE && s < f->n_slots && (kvi__member_tier(w) & KVI_MEMBER_TIER) == KVI_TIER_GPU &&
                    q->gen[s] == q->cur_gen && q->depth[s] == t) {
                    q->depth[s] = t + 1;
                    any = true;
                }
            }
        }
        if (!any)
            return;
    }
}

/*
 * Slow path after concurrent writes (G2): extend each gpu member of e0 from
 * its assigned depth while it still holds the next position. Members are
 * grouped by depth: one walk per distinct depth (extend_from), which checks
 * the members of the entries it probes. A shared first block (a system
 * prompt every worker holds) gives e0 many members, most at one depth.
 * Before, each member probed its next position and searched that entry's
 * members for itself; under a busy writer nearly every query took this path.
 * measured (kvidx-bench trace, conversation trace, 128 workers, 3
 * interleaved runs each, quiet 2-cpu VM), find p50 / p99 us: --window-ms
 * 1000: 1.94-1.97 / 9.9-11.2 -> 1.62-1.64 / 5.7-6.2; --window-ms 300:
 * 2.04-2.16 / 12.9-13.4 -> 1.68-1.73 / 12.8-13.1. (With the replay pinned to
 * one cpu, so that the writer never ran during a query: 1.46-1.63 / 4.4-5.2.)
 * Every member the search did not reach is marked at depth 0 before any
 * walk: a walk extends only the members marked when it runs, so a member
 * marked after the walk from depth 0 was skipped as walked and reported
 * nothing (index_stress_test: a stable slot missing, 1 query in ~10^6 under
 * churn; index_query_race_test reproduces it).
 */
static void verify_members(const struct finder *f, const struct kvi_entry *e0, uint32_t n)
{
    struct qscratch *q = f->q;
    uint32_t one, m = 1;
    struct kvi_mset *ms = entry_members(e0, &one);
    if (ms != NULL)
        m = atomic_load_explicit(&ms->n, memory_order_acquire);
    /* pass 1: the gpu members, unreached ones marked at depth 0 (emit_part
     * skips them unless a walk extends them) */
    for (uint32_t i = 0; i < m; i++) {
        uint64_t w = ms ? atomic_load_explicit(&ms->m[i].w, memory_order_acquire) : 0; /* R2 */
        uint32_t s = ms ? kvi__member_slot(w) : one;
        if (s == KVI_NONE || s >= f->n_slots)
            continue;
        uint8_t tier = ms ? (kvi__member_tier(w) & KVI_MEMBER_TIER) : kvi__slot(f->ix, s)->tier;
        if (tier == KVI_TIER_GPU && q->gen[s] != q->cur_gen) {
            q->depth[s] = 0;
            q->gen[s] = q->cur_gen;
        }
    }
    /* pass 2: one walk per distinct depth. A member read here that pass 1
     * did not see (added meanwhile) has no depth of this query: skipped. */
    uint32_t walked[32]; /* depths walked from, direct-mapped (a collision walks again) */
    memset(walked, 0xff, sizeof walked);
    for (uint32_t i = 0; i < m; i++) {
        uint64_t w = ms ? atomic_load_explicit(&ms->m[i].w, memory_order_acquire) : 0; /* R2 */
        uint32_t s = ms ? kvi__member_slot(w) : one;
        if (s == KVI_NONE || s >= f->n_slots || q->gen[s] != q->cur_gen)
            continue;
        uint32_t d = q->depth[s];
        if (walked[d & 31] == d)
            continue;
        walked[d & 31] = d;
        extend_from(f, d, n);
    }
}

static size_t emit_part(const struct finder *f, const struct kvi_entry *e0, struct kvi_match *out, size_t cap,
                        size_t count)
{
    struct qscratch *q = f->q;
    uint32_t one, n = 1;
    struct kvi_mset *ms = entry_members(e0, &one);
    if (ms != NULL)
        n = atomic_load_explicit(&ms->n, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = ms ? kvi__member_slot(atomic_load_explicit(&ms->m[i].w, memory_order_acquire)) : one;
        /* (depth 0: marked by verify_members, holding nothing after all; the
         * members read here may differ from the ones it read) */
        if (s == KVI_NONE || s >= f->n_slots || q->gen[s] != q->cur_gen || q->depth[s] == 0)
            continue;
        q->gen[s] = 0; /* emit once */
        if (count < cap) {
            const struct kvi_slot *sl = kvi__slot(f->ix, s);
            out[count] = (struct kvi_match){
                .slot = s,
                .instance = sl->instance,
                .dp_rank = sl->dp_rank,
                .depth = q->depth[s],
                .tree_size = atomic_load_explicit(&((struct kvi_slot *)sl)->n_blocks, memory_order_relaxed),
            };
        }
        count++;
    }
    return count;
}

static size_t find_core(const struct kvi_index *ix, const struct qkeys *qk, struct qscratch *q, struct kvi_match *out,
                        size_t cap)
{
    size_t count = 0;
    if (qk->n == 0)
        return 0;
    uint32_t jump0 = atomic_load_explicit(&((struct kvi_index *)ix)->jump, memory_order_relaxed);
    for (uint32_t pi = 0; pi < ix->n_parts; pi++) {
        enum tab_kind kind;
        size_t n;
        const uint64_t *keys = part_keys(ix, q, qk, pi, &kind, &n);
        if (n == 0)
            continue;
        uint32_t last = (uint32_t)n - 1, jump = jump0;
        if (jump == 0 || jump > last)
            jump = last ? last : 1;
        struct finder f = {
            .ix = ix,
            .p = &ix->parts[pi],
            .kind = kind,
            .keys = keys,
            .q = q,
        };
        f.n_slots = atomic_load_explicit(&((struct kvi_index *)ix)->n_slot_ids, memory_order_acquire);
        qs_slots(q, f.n_slots);
        uint64_t g0 = atomic_load_explicit(&((struct kvi_part *)f.p)->wgen, memory_order_acquire);
        uint32_t c0;
        const struct kvi_entry *e0 = probe(&f, 0, &c0);
        if (c0 == 0)
            continue;
        uint32_t cur = 0, ccur = c0;
        const struct kvi_entry *ecur = e0;
        while (cur < last) {
            uint32_t nxt = cur + jump < last ? cur + jump : last, cn;
            const struct kvi_entry *en = probe(&f, nxt, &cn);
            if (cn != ccur)
                refine(&f, cur, ecur, ccur, nxt, en, cn);
            cur = nxt;
            ccur = cn;
            ecur = en;
            if (ccur == 0)
                break;
        }
        if (ccur > 0)
            assign(&f, ecur, cur + 1);
        /* G2: counts compared at different moments can hide a drain point
         * when the partition changed meanwhile; then check every member */
        if (atomic_load_explicit(&((struct kvi_part *)f.p)->wgen, memory_order_acquire) != g0)
            verify_members(&f, e0, (uint32_t)n);
        count = emit_part(&f, e0, out, cap, count);
    }
    return count;
}

/* Keys of a query given by content (prefix keys, or seq hashes once the index
 * holds seq-only placements) or by seq hashes. Starts the query (qs_begin). */
static struct qkeys query_keys(const struct kvi_index *ix, struct qscratch *q, const uint64_t *content,
                               const uint64_t *seq, size_t n)
{
    qs_begin(q);
    struct qkeys qk = {TAB_SEQ, seq, n};
    q->kready = q->kn = n;
    if (content == NULL)
        return qk;
    uint64_t *k = qs_keys(q, n);
    if (atomic_load_explicit(&((struct kvi_index *)ix)->has_seq_only, memory_order_acquire)) {
        kvi_seq_hashes(content, n, k);
    } else {
        /* computed as the search reaches them (keys_upto) */
        q->kcontent = content;
        q->kready = 0;
        q->kk = ix->kseed;
        q->kw = 0;
        qk.kind = TAB_KEY;
    }
    qk.keys = k;
    return qk;
}

size_t kvi_index_find_matches(const struct kvi_index *ix, const uint64_t *content, size_t n, struct kvi_match *out,
                              size_t cap)
{
    struct qscratch *q = qs_get();
    struct qkeys qk = query_keys(ix, q, content, NULL, n);
    return find_core(ix, &qk, q, out, cap);
}

size_t kvi_index_find_matches_by_seq(const struct kvi_index *ix, const uint64_t *seq, size_t n, struct kvi_match *out,
                                     size_t cap)
{
    struct qscratch *q = qs_get();
    struct qkeys qk = query_keys(ix, q, NULL, seq, n);
    return find_core(ix, &qk, q, out, cap);
}

/* Does slot s hold the query's entry at position t? */
static bool slot_holds(const struct kvi_index *ix, struct qscratch *q, const struct qkeys *qk,
                       const struct kvi_slot *s, uint32_t t)
{
    uint32_t pi = inst_get(ix, s->instance)->part;
    enum tab_kind kind;
    size_t n;
    const uint64_t *keys = part_keys(ix, q, qk, pi, &kind, &n);
    if (t >= n)
        return false;
    const struct kvi_entry *e = entry_at(ix, &ix->parts[pi], kind, keys[t], t);
    return e != NULL && member_tier(ix, e, s->id) >= 0;
}

static bool tier_usable(const struct kvi_index *ix, struct qscratch *q, const struct qkeys *qk,
                        const struct kvi_slot *const *own, size_t n_own, const struct kvi_slot *const *shared,
                        size_t n_shared, bool disk, uint32_t t)
{
    for (size_t i = 0; i < n_own; i++) {
        bool is_disk = own[i]->tier == KVI_TIER_DISK || own[i]->tier == KVI_TIER_EXTERNAL;
        if ((disk ? is_disk : own[i]->tier == KVI_TIER_CPU) && slot_holds(ix, q, qk, own[i], t))
            return true;
    }
    for (size_t i = 0; i < n_shared; i++) {
        bool is_disk = shared[i]->tier == KVI_TIER_DISK || shared[i]->tier == KVI_TIER_EXTERNAL;
        if ((disk ? is_disk : shared[i]->tier == KVI_TIER_CPU) && slot_holds(ix, q, qk, shared[i], t))
            return true;
    }
    return false;
}

/* Live lower-tier slots of shared pools (at most cap). */
static size_t collect_shared(const struct kvi_index *ix, const struct kvi_slot **out, size_t cap)
{
    uint32_t n_ids = atomic_load_explicit(&((struct kvi_index *)ix)->n_slot_ids, memory_order_acquire);
    size_t n = 0;
    for (uint32_t id = 1; id < n_ids && n < cap; id++) {
        const struct kvi_slot *s = kvi__slot(ix, id);
        if (s != NULL && atomic_load_explicit(&((struct kvi_slot *)s)->live, memory_order_acquire) && s->shared &&
            s->tier != KVI_TIER_GPU)
            out[n++] = s;
    }
    return n;
}

size_t kvi_index_find_tiered(const struct kvi_index *ix, const uint64_t *content, const uint64_t *seq, size_t n,
                             struct kvi_tier_match *out, size_t cap)
{
    struct qscratch *q = qs_get();
    struct qkeys qk = query_keys(ix, q, content, seq, n);
    if (n == 0)
        return 0;
    /* gpu matches into the scratch buffer */
    size_t ng;
    for (;;) {
        ng = find_core(ix, &qk, q, q->gm, q->cap_gm);
        if (ng <= q->cap_gm)
            break;
        q->cap_gm = ng * 2;
        free(q->gm);
        q->gm = kvi_xmalloc(q->cap_gm * sizeof *q->gm);
    }
    bool lower = atomic_load_explicit(&((struct kvi_index *)ix)->has_lower_tiers, memory_order_acquire);
    size_t count = 0;
    if (!lower) {
        for (size_t i = 0; i < ng; i++) {
            const struct kvi_match *m = &q->gm[i];
            if (count < cap)
                out[count] = (struct kvi_tier_match){m->instance, m->dp_rank, m->depth, m->depth, m->depth,
                                                     m->tree_size};
            count++;
        }
        return count;
    }
    /* lower tiers: walk every non-shared (instance, dp_rank) that has slots */
    keys_all(ix, q); /* slot_holds reads keys[] directly */
    const struct kvi_slot *shared[64];
    size_t n_shared = collect_shared(ix, shared, KVI_ARRAY_LEN(shared));
    uint32_t ni = atomic_load_explicit(&((struct kvi_index *)ix)->n_instances, memory_order_acquire);
    for (uint32_t ii = 0; ii < ni; ii++) {
        const struct kvi_instance *in = inst_get(ix, ii);
        if (in->shared)
            continue;
        struct kvi_slotlist *sl = atomic_load_explicit(&((struct kvi_instance *)in)->slots, memory_order_acquire);
        if (sl == NULL)
            continue;
        for (uint32_t a = 0; a < sl->n; a++) {
            const struct kvi_slot *sa = kvi__slot(ix, sl->id[a]);
            /* visit each dp rank once: at its first slot in the list */
            bool first = true;
            for (uint32_t b2 = 0; b2 < a; b2++)
                if (kvi__slot(ix, sl->id[b2])->dp_rank == sa->dp_rank)
                    first = false;
            if (!first)
                continue;
            const struct kvi_slot *own[KVI_TIER_COUNT];
            size_t n_own = 0;
            uint32_t g = 0, tree = 0;
            uint64_t held = 0;
            for (uint32_t b2 = 0; b2 < sl->n; b2++) {
                const struct kvi_slot *sb = kvi__slot(ix, sl->id[b2]);
                if (sb->dp_rank != sa->dp_rank)
                    continue;
                held += atomic_load_explicit(&((struct kvi_slot *)sb)->n_blocks, memory_order_relaxed);
                if (sb->tier == KVI_TIER_GPU) {
                    tree = atomic_load_explicit(&((struct kvi_slot *)sb)->n_blocks, memory_order_relaxed);
                    for (size_t gi = 0; gi < ng; gi++)
                        if (q->gm[gi].slot == sb->id)
                            g = q->gm[gi].depth;
                } else if (n_own < KVI_TIER_COUNT) {
                    own[n_own++] = sb;
                }
            }
            if (held == 0)
                continue; /* pool-only rows: kvi_index_pool_depths */
            uint32_t t = g;
            while (t < n && tier_usable(ix, q, &qk, own, n_own, shared, n_shared, false, t))
                t++;
            uint32_t c = t;
            while (t < n && tier_usable(ix, q, &qk, own, n_own, shared, n_shared, true, t))
                t++;
            uint32_t d = t;
            if (d == 0)
                continue;
            if (count < cap)
                out[count] = (struct kvi_tier_match){ii, sa->dp_rank, g, c, d, tree};
            count++;
        }
    }
    return count;
}

void kvi_index_pool_depths(const struct kvi_index *ix, const uint64_t *content, const uint64_t *seq, size_t n,
                           uint32_t *cpu, uint32_t *disk)
{
    *cpu = *disk = 0;
    if (n == 0 || !atomic_load_explicit(&((struct kvi_index *)ix)->has_shared, memory_order_acquire))
        return;
    struct qscratch *q = qs_get();
    struct qkeys qk = query_keys(ix, q, content, seq, n);
    keys_all(ix, q); /* slot_holds reads keys[] directly */
    const struct kvi_slot *shared[64];
    size_t n_shared = collect_shared(ix, shared, KVI_ARRAY_LEN(shared));
    uint32_t t = 0;
    while (t < n && tier_usable(ix, q, &qk, NULL, 0, shared, n_shared, false, (uint32_t)t))
        t++;
    *cpu = t;
    while (t < n && tier_usable(ix, q, &qk, NULL, 0, shared, n_shared, true, (uint32_t)t))
        t++;
    *disk = t;
}
