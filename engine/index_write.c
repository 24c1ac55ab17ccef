/*
 * The positional index's write side: the operations a partition's writer
 * applies (see the DESIGN notes in engine/index.c). Stores (do_store and
 * its run helpers, store_known), reservations, removals, clears and the
 * partition dump. Built from the primitives of engine/index_table.c and
 * engine/index_impl.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/hash_impl.h"
#include "engine/index_impl.h"

#define PF_DIST 8 /* prefetch distance, blocks */

static int kvi__cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The entry slot s holds under engine hash eh, or KVI_NONE (the slot maps are in
 * engine/index_table.c; map_find_t in engine/index_impl.h). Writer. */
static uint32_t map_find(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint64_t eh)
{
    return map_find_t(ix, p, s, eh, tab_tag(ix, eh));
}

/* ---- store ------------------------------------------------------------------ */

/* A run of blocks to store: engine hashes with content hashes, or engine
 * hashes alone (a token-less run: contents unknown), and standard seq hashes
 * (NULL: derived from the content chain). */
struct run {
    const struct kvi_block *b; /* engine and content hashes, or NULL */
    const uint64_t *eh;        /* when b == NULL: engine hashes */
    const uint64_t *seq;       /* standard seq hashes, or NULL (then b != NULL) */
    size_t n;
};

static inline uint64_t run_eh(const struct run *r, size_t i)
{
    return r->b != NULL ? r->b[i].engine_hash : r->eh[i];
}

/* The run's engine hashes as a strided array, for the store loops: block i's
 * is base[i * stride] (no per-access branch on the run's form). */
struct eh_view {
    const uint64_t *base;
    size_t stride;
};

static inline struct eh_view run_eh_view(const struct run *r)
{
    _Static_assert(sizeof(struct kvi_block) == 2 * sizeof(uint64_t), "kvi_block is two u64");
    if (r->b != NULL)
        return (struct eh_view){&r->b[0].engine_hash, 2};
    return (struct eh_view){r->eh, 1};
}

static inline uint64_t eh_at(struct eh_view v, size_t i)
{
    return v.base[i * v.stride];
}

/* Stand-in prefix key of an entry placed by its seq hash alone. Its content
 * chain is unknown, so content queries of an index holding such entries go
 * through the seq table (has_seq_only) and never compute this key. */
static inline uint64_t seq_stand_in_key(const struct kvi_index *ix, uint64_t seq)
{
    return kvi_fmix64(seq ^ ix->kxor) ^ 0x8000000000000001ull;
}

/* Prefix key of block i of a run at position pos (seq hash sq), continuing
 * from k: chained through the content hash where known. A token-less block
 * at position 0 knows its content: it equals its seq hash (RFC 1527). */
static inline uint64_t run_key(const struct kvi_index *ix, const struct run *r, uint64_t k, size_t i, uint32_t pos,
                               uint64_t sq)
{
    if (r->b != NULL)
        return key_step(ix, k, r->b[i].content_hash, pos);
    return pos == 0 ? key_step(ix, k, sq, 0) : seq_stand_in_key(ix, sq);
}

/* Block i of the run is an entry whose key is k, not rk[i] (a stand-in: the
 * entry was placed by seq hash alone): the keys of the blocks after it
 * continue from k, so that every entry's key is its parent's stepped by its
 * content (entry_content derives the content from that). */
static void run_rekey(const struct kvi_index *ix, const struct run *r, uint64_t *rk, uint32_t *kt, const uint64_t *rs,
                      size_t i, uint32_t pos0, uint64_t k)
{
    for (size_t j = i + 1; j < r->n; j++) {
        rk[j] = k = run_key(ix, r, k, j, pos0 + (uint32_t)j, rs[j]);
        kt[j] = key_tag(k);
    }
}

/* Add v (a run hash, table position from h) to the scratch set; true if it
 * was there. 0 marks a free position (the set holds no 0: see the caller). */
static inline bool dup_add(uint64_t *set, size_t mask, uint32_t h, uint64_t v)
{
    for (size_t j = h & mask;; j = (j + 1) & mask) {
        uint64_t x = set[j];
        if (x == 0) {
            set[j] = v;
            return false;
        }
        if (x == v)
            return true;
    }
}

/* Does the run repeat an engine hash, or contain its parent? O(n) with a
 * scratch open-addressing set keyed by the hashes' map tags (mt[i] is block
 * i's), at most a quarter full, cleared per call (0 is kept apart).
 * Before, the set was half full and its positions carried a per-call
 * generation mark in a second array, to skip the clearing: every insert read
 * two arrays, and a probe in two met a taken position (branch misses).
 * measured (kvidx-bench micro, pre-sized store): rdtsc around the tags and
 * the check, TSC ticks per block (3 runs) 18.7-19.2 -> 10.2-10.5; thread cpu
 * ns per block (median of 7 interleaved runs) 56.4 -> 52.0, cold 159.9 ->
 * 153.6; --replay store (median of 5) 120.9 -> 119.5. (callgrind counts the
 * memset's rep stosb by the byte: 297 -> 323 instructions per block, 291
 * without it.) */
static bool run_has_duplicates(struct kvi_part *p, bool has_parent, uint64_t parent_eh, const struct run *r,
                               const uint32_t *mt)
{
    size_t n = r->n, m = n + (has_parent ? 1 : 0);
    if (m < 2)
        return false;
    if (m <= 8) {
        for (size_t i = 0; i < n; i++) {
            if (has_parent && run_eh(r, i) == parent_eh)
                return true;
            for (size_t j = i + 1; j < n; j++)
                if (run_eh(r, i) == run_eh(r, j))
                    return true;
        }
        return false;
    }
    size_t cap = 16;
    while (cap < m * 4)
        cap *= 2;
    if (cap > p->cap_dup) {
        free(p->dup_val);
        p->cap_dup = cap;
        p->dup_val = kvi_xmalloc(cap * sizeof(uint64_t));
    }
    uint64_t *set = p->dup_val;
    memset(set, 0, cap * sizeof(uint64_t));
    bool zero = has_parent && parent_eh == 0;
    if (has_parent && !zero)
        (void)dup_add(set, cap - 1, (uint32_t)kvi_fmix64(parent_eh), parent_eh);
    const struct eh_view ehv = run_eh_view(r);
    for (size_t i = 0; i < n; i++) {
        uint64_t v = eh_at(ehv, i);
        if (KVI_UNLIKELY(v == 0)) {
            if (zero)
                return true;
            zero = true;
        } else if (dup_add(set, cap - 1, mt[i], v)) {
            return true;
        }
    }
    return false;
}

/*
 * The fresh tail of a run: blocks from .. n-1, each new to the partition and
 * to slot s, below entry `prev`, which this store has just created (so it
 * has no children yet). The caller checked what makes every one of them new:
 * no seq table (no prefix placed by seq alone; a new parent's children are
 * the ones this store adds) and no holding of s under their engine hashes
 * (pass 1). Content is known (a run without a seq table has content hashes).
 *
 * What entry_new and kvi_ix__holding_add do per block, once per run where
 * they can: the key table and the slot map get room for the whole tail up
 * front (then no per-insert growth check), and the stats counters are added
 * once. Each entry is written whole, with its single member, before it is
 * published (W1 by the key table, W5 by its parent's child list), so readers
 * see it appear with its member at once; wgen is bumped per
 * block before the stores that publish it (G1), as member_add does.
 * measured (kvidx-bench micro, 1 M new blocks, thread cpu ns per block,
 * median of 7 interleaved runs): pre-sized 74.8 -> 57.8, cold 179.0 ->
 * 160.2; callgrind (--seqs 256, pre-sized): 514 -> 312 instructions per
 * block; --replay conversation trace, store ns per block (median of 5):
 * 138.4 -> 124.7.
 */
static void store_fresh_tail(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, const struct run *r,
                             const uint64_t *rk, const uint32_t *kt, const uint32_t *mt,
                             size_t from, uint32_t pos0, uint32_t prev)
{
    size_t n = r->n;
    uint64_t m = n - from;
    const struct tab_ctx kc = {ix, p, TAB_KEY, 0}, mc = {ix, p, TAB_MAP, s->id};
    kvi_ix__tab_room(p, &kc, &p->ktab, m);
    kvi_ix__tab_room(p, &mc, &s->map, m);
    struct kvi_tab *ktab = atomic_load_explicit(&p->ktab.t, memory_order_relaxed);
    struct kvi_tab *map = atomic_load_explicit(&s->map.t, memory_order_relaxed);
    const uint32_t one = s->id;
    uint64_t wgen = atomic_load_explicit(&p->wgen, memory_order_relaxed);
    /* entries as entry_alloc takes them: recycled ones first (prefetched
     * PF_DIST ahead: they lie anywhere), then fresh ones, whose chunks are
     * allocated here once. measured (micro, callgrind --seqs 256, pre-sized):
     * 303 -> 297 instructions per block; thread time within noise (pre-sized
     * 57.6 -> 57.9, --replay store 125.9 -> 123.8 ns per block). */
    if (m > p->n_free) {
        if (p->next_fresh == 0)
            p->next_fresh = 1; /* index 0 is KVI_NONE */
        uint64_t last = (uint64_t)p->next_fresh + (m - p->n_free) - 1;
        if (last >= KVI_ENTRY_IDX_END)
            kvi_die("partition entry space exhausted (%llu entries)", (unsigned long long)last);
        for (uint32_t c = p->next_fresh >> KVI_ENTRY_CHUNK_SHIFT; c <= (uint32_t)(last >> KVI_ENTRY_CHUNK_SHIFT); c++)
            if (KVI_UNLIKELY(atomic_load_explicit(&p->chunks[c], memory_order_relaxed) == NULL))
                kvi_ix__chunk_alloc(p, c);
    }
    struct kvi_entry *pe = kvi__entry(p, prev);
    for (size_t i = from; i < n; i++) {
        if (i + PF_DIST < n) {
            __builtin_prefetch(&ktab->s[tab_home(ktab, kt[i + PF_DIST])]);
            __builtin_prefetch(&map->s[tab_home(map, mt[i + PF_DIST])]);
            if (p->n_free > PF_DIST) /* a recycled entry: anywhere */
                __builtin_prefetch(kvi__entry(p, p->free_idx[p->n_free - 1 - PF_DIST]), 1);
        }
        uint32_t idx = p->n_free > 0 ? p->free_idx[--p->n_free] : p->next_fresh++;
        struct kvi_entry *e = kvi__entry(p, idx);
        entry_fill(e, rk[i], pos0 + (uint32_t)i, prev, one, r->b[i].engine_hash);
        atomic_store_explicit(&p->wgen, ++wgen, memory_order_relaxed); /* G1 */
        atomic_store_explicit(&pe->first_child, idx, memory_order_release); /* W5: pe has no other child */
        tab_insert_raw(ktab, kt[i], idx);                                 /* W1 */
        tab_insert_raw(map, mt[i], idx);
        prev = idx;
        pe = e;
    }
    kvi_relaxed_add(&p->entries, m);
    atomic_store_explicit(&s->n_blocks, atomic_load_explicit(&s->n_blocks, memory_order_relaxed) + (uint32_t)m,
                          memory_order_relaxed);
    kvi_relaxed_add(&p->holdings, m);
    kvi_relaxed_add(&p->stored_blocks, m);
}

/* Is block i of a run (at pos) found by its prefix key too, not by its seq
 * hash alone? Its key is the content chain's unless it has a stand-in key:
 * the first block of a run placed by seq alone, and a token-less block past
 * position 0 (run_key). */
static inline bool run_key_is_content(const struct run *r, bool seq_only, size_t i, uint32_t pos)
{
    return (r->b != NULL || pos == 0) && !(seq_only && i == 0);
}

/*
 * The prefix a block of a store names, KVI_NONE if none yet (then it gets a
 * new entry): its key is k (table tag kt), its seq hash sq (tag st), at
 * depth pos. Writer.
 * With a seq table the seq hash is a prefix's identity. When it names no
 * prefix at pos and by_key (run_key_is_content), the prefix whose key is k
 * at pos is the block's (*joined set): a publisher whose seq hashes are not
 * the standard ones of its tokens stored one content chain under two seq
 * hashes. The key table holds one entry per (key, depth), and content is
 * what token queries match, so the block joins that prefix, which keeps its
 * first seq hash. A second entry under the key left content queries
 * reaching only one of the two (fuzz_ingest, finding 9).
 * Without a seq table the prefix key names the prefix (by_key always holds:
 * nothing is placed by seq alone).
 * prev_new (the block's parent was created by this store) skips the key
 * lookup: k is its parent's key stepped by its content, an entry keeps its
 * parent while it lives, and the one entry with that parent key at pos - 1
 * is the new parent, which has no children yet.
 */
static inline uint32_t prefix_find(const struct kvi_index *ix, const struct kvi_part *p, bool son, bool by_key,
                                   bool prev_new, uint64_t k, uint32_t kt, uint64_t sq, uint32_t st, uint32_t pos,
                                   bool *joined)
{
    uint32_t idx = KVI_NONE;
    *joined = false;
    if (son) {
        struct tab_ctx sc = {ix, p, TAB_SEQ, 0};
        /* (a key shared across depths names one entry per depth) */
        idx = tab_find_at_t(&sc, &p->stab, sq, st, pos);
    }
    if (idx == KVI_NONE && by_key && !prev_new) {
        struct tab_ctx kc = {ix, p, TAB_KEY, 0};
        idx = tab_find_at_t(&kc, &p->ktab, k, kt, pos);
        *joined = son && idx != KVI_NONE;
    }
    return idx;
}

/*
 * Is entry idx the prefix a block of a store names (prefix_find), for a
 * slot that holds idx under the block's engine hash? Its key is k, its seq
 * hash sq (table tag st), its depth pos, by_key as for prefix_find. Writer.
 * With a seq table by seq hash (a prefix placed by seq alone has a stand-in
 * key), or, where the seq hash names no prefix at pos, by key at pos: the
 * prefix the block joined. Without that second case a re-store of a block
 * that joined a prefix by its content dropped the slot's holding of it and
 * its descendants and placed it again (a duplicate store is idempotent).
 * Without a seq table by key (then every key is real, and no seq hash is
 * kept). The seq table is looked up only when the seq hashes differ.
 */
static inline bool same_prefix(const struct kvi_index *ix, const struct kvi_part *p, bool son, bool by_key,
                               uint32_t idx, uint64_t k, uint64_t sq, uint32_t st, uint32_t pos)
{
    const struct kvi_entry *e = kvi__entry(p, idx);
    if (!son)
        return e->key == k;
    if (*kvi__seqp(p, idx) == sq)
        return true;
    struct tab_ctx sc = {ix, p, TAB_SEQ, 0};
    return by_key && e->key == k && e->pos == pos && tab_find_at_t(&sc, &p->stab, sq, st, pos) == KVI_NONE;
}

/* Does slot `sid` hold entry e under engine hash eh? member_eh's test, its
 * single-member case inline (the re-store walk's common case). Writer. */
static inline bool holds_as(const struct kvi_entry *e, uint32_t sid, uint64_t eh)
{
    uint32_t one = atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed);
    if (one != KVI_MANY_BIT)
        return (one & KVI_SLOT_MASK) == sid &&
               atomic_load_explicit(&((struct kvi_entry *)e)->mv, memory_order_relaxed) == eh;
    bool f;
    uint64_t m = member_eh(e, sid, &f);
    return f && m == eh;
}

/*
 * The idempotent re-store, read only: does slot s already hold every block
 * of run r under its engine hash, as the prefix the block names, below
 * `prev` (the entry s holds under the run's parent; KVI_NONE for a run from
 * position 0)? Then do_store would change nothing: pass 1 would find each
 * block held (have[i]), same_prefix would hold, and pass 2 would only step
 * prev. Its duplicate check would pass too: a slot's map names one entry
 * per engine hash, so blocks held as distinct entries (one per depth),
 * below a parent held as another, have distinct engine hashes.
 * same_prefix's test: without a seq table the entry's key is the block's
 * (the content chain's, from prev's key); with one, its seq hash is the
 * block's (given, or the standard chain from prev's), and keys are not
 * looked at (a re-store rekeys from a held entry's key). same_prefix's other
 * case, a block that joined a prefix by its content under another seq hash,
 * is left to the general loops (false).
 * Block i > 0 is looked for as prev's first child (a run stored at once is
 * a chain of only children, allocated in order), then, when that child is
 * not it (a branch point, a prefix placed by seq alone), in the slot map;
 * block 0 in the map, so that a run of new blocks (the usual store) gives
 * up after one probe.
 * measured: see do_store.
 */
static bool run_held(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t prev, bool son,
                     const struct run *r)
{
    const uint32_t sid = s->id;
    const struct kvi_entry *pe = prev != KVI_NONE ? kvi__entry(p, prev) : NULL;
    uint64_t k = pe != NULL ? pe->key : ix->kseed;
    uint64_t sq = son && pe != NULL ? *kvi__seqp(p, prev) : 0;
    uint32_t pos = pe != NULL ? pe->pos + 1 : 0;
    for (size_t i = 0; i < r->n; i++, pos++) {
        uint64_t eh = run_eh(r, i);
        if (!son) /* (then r->b != NULL: a run without content has seq hashes) */
            k = key_step(ix, k, r->b[i].content_hash, pos);
        else if (r->seq != NULL)
            sq = r->seq[i];
        else
            sq = pos == 0 ? r->b[i].content_hash : kvi__seq_step(sq, r->b[i].content_hash);
        uint32_t idx = KVI_NONE;
        const struct kvi_entry *e = NULL;
        if (i > 0) {
            idx = atomic_load_explicit(&((struct kvi_entry *)pe)->first_child, memory_order_relaxed);
            if (idx != KVI_NONE && !holds_as(e = kvi__entry(p, idx), sid, eh))
                e = NULL;
        }
        if (e == NULL) {
            if ((idx = map_find(ix, p, s, eh)) == KVI_NONE)
                return false;
            e = kvi__entry(p, idx);
        }
        if (e->pos != pos || (son ? *kvi__seqp(p, idx) != sq : e->key != k))
            return false;
        pe = e;
    }
    return true;
}

static int do_store(struct kvi_index *ix, uint32_t instance, uint32_t rank, enum kvi_tier tier, bool has_parent,
                    uint64_t parent_eh, uint32_t position, const struct run *r)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire) || (unsigned)tier >= KVI_TIER_COUNT)
        return -EINVAL;
    struct kvi_instance *in = inst_get(ix, instance);
    struct kvi_part *p = &ix->parts[in->part];
    size_t n = r->n;
    const uint64_t *seq = r->seq;
    if (n == 0)
        return 0;
    if (seq != NULL) /* the seq hash is the prefix's identity: find prefixes by it */
        stab_need(ix, p);
    else
        stab_maybe_build(ix, p);
    bool son = stab_on(p);
    uint32_t sid = kvi_ix__slot_find(ix, instance, rank, (uint8_t)tier);
    struct kvi_slot *s = sid ? kvi__slot(ix, sid) : NULL;
    uint32_t prev_s = has_parent && s != NULL ? map_find(ix, p, s, parent_eh) : KVI_NONE;
    /* the idempotent re-store, read only (run_held), before the scratch
     * tags, the duplicate check and the two passes: a walk down the chain
     * instead of a map probe, an entry read, a ktab prefetch and a scratch
     * set insert per block. measured (kvidx-bench micro, 3 runs each
     * interleaved with a build of cc48b42, medians, 2-vCPU VM, load 1.3-3.2):
     * store_again_ns_per_block 38.8 -> 5.9; with --seq-tables (the base
     * built with this micro.c) 45.4 -> 6.7. callgrind --toggle-collect=
     * store_again --seqs 256: 352 -> 75 instructions per block (--seq-tables
     * 412 -> 88). A run of new blocks gives up after one map probe:
     * store_presized 289.5 -> 290.6 instructions per block (--seq-tables
     * 695.3 -> 697.4); micro --replay store 116.6 -> 115.9 cpu ns per block;
     * the other micro rows within noise (find_hit 558 / 559 ns, one binary
     * with this walk switched off and on, 5 runs each). */
    if (s != NULL && (has_parent ? prev_s != KVI_NONE : position == 0) && run_held(ix, p, s, prev_s, son, r)) {
        maybe_reclaim(ix, in->part);
        return 0;
    }
    /* run scratch: keys, seq hashes, then the table tags of keys, engine
     * hashes and seq hashes (each hash is mixed once per store) */
    if (4 * n > p->cap_runbuf) {
        p->cap_runbuf = 4 * n;
        p->runbuf = kvi_xrealloc(p->runbuf, p->cap_runbuf * sizeof(uint64_t));
    }
    uint64_t *rk = p->runbuf, *rs = p->runbuf + n;
    uint32_t *kt = (uint32_t *)(rs + n), *mt = kt + n, *st = mt + n;
    const struct eh_view ehv = run_eh_view(r);
    for (size_t i = 0; i < n; i++)
        mt[i] = tab_tag(ix, eh_at(ehv, i));
    if (run_has_duplicates(p, has_parent, parent_eh, r, mt)) {
        kvi_relaxed_add(&p->invalid_events, 1);
        return -EINVAL;
    }

    uint32_t prev = KVI_NONE, pos0 = 0;
    uint64_t k = ix->kseed, sq = 0;
    bool seq_only = false;
    if (has_parent) {
        prev = prev_s;
        if (prev == KVI_NONE && tier != KVI_TIER_GPU) {
            struct kvi_slotlist *sl = atomic_load_explicit(&in->slots, memory_order_relaxed);
            for (uint32_t i = 0; sl != NULL && i < sl->n && prev == KVI_NONE; i++) {
                struct kvi_slot *o = kvi__slot(ix, sl->id[i]);
                if (o != s && o->dp_rank == rank)
                    prev = map_find(ix, p, o, parent_eh);
            }
        }
        if (prev == KVI_NONE && (seq == NULL || tier == KVI_TIER_GPU || position == 0)) {
            kvi_relaxed_add(&p->parent_not_found, 1);
            return -ENOENT;
        }
        if (prev == KVI_NONE) {
            /* RFC 1527: the seq hash names the whole prefix, so a lower-tier
             * run whose parent no slot of the rank holds (another backend's,
             * or nobody's) is placed at its given position, a root of its
             * slot, like a run placed without a parent */
            kvi_relaxed_add(&p->parent_elsewhere, 1);
            pos0 = position;
            seq_only = true;
        } else {
            struct kvi_entry *pe = kvi__entry(p, prev);
            pos0 = pe->pos + 1;
            k = pe->key;
            if (son)
                sq = *kvi__seqp(p, prev);
        }
    } else if (position > 0) {
        if (seq == NULL || tier == KVI_TIER_GPU) {
            kvi_relaxed_add(&p->invalid_events, 1);
            return -EINVAL;
        }
        /* a lower-tier run placed by standard seq hashes alone: reachable by
         * seq queries and tier walks through seq keys only */
        pos0 = position;
        seq_only = true;
    }
    if (s == NULL) {
        sid = kvi_ix__slot_create(ix, instance, rank, (uint8_t)tier);
        s = kvi__slot(ix, sid);
    }
    bool parent_in_slot = prev != KVI_NONE && has_member(kvi__entry(p, prev), sid);

    /* keys, seq hashes and tags of the whole run first, then a prefetch
     * pipeline PF_DIST blocks ahead over the three tables the loop touches */
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = pos0 + (uint32_t)i;
        if (seq != NULL)
            sq = seq[i];
        else if (son) /* (without a seq table no seq hash is kept) */
            /* the seq step inlined (engine/hash_impl.h): the 16-byte XXH3 with
             * its constant seed folds to a dozen instructions, without a call
             * and a stack buffer per block. measured (micro, callgrind --seqs
             * 256, pre-sized store): 312 -> 303 instructions per block */
            sq = pos == 0 ? r->b[i].content_hash : kvi__seq_step(sq, r->b[i].content_hash);
        rs[i] = sq;
        k = seq_only && i == 0 ? seq_stand_in_key(ix, sq) : run_key(ix, r, k, i, pos, sq);
        rk[i] = k;
        kt[i] = key_tag(k);
        if (son)
            st[i] = tab_tag(ix, sq);
    }
    /* pass 1: what the slot holds under the run's engine hashes, pipelined
     * (map slot PF_DIST ahead, its entry PF_DIST/2 ahead by tag alone).
     * An engine hash renamed to another prefix drops its old holding with
     * its descendants; when that would drop the run's own parent chain the
     * run is rejected before anything changes.
     * Before, the check ran its own unpipelined lookup loop and pass 2
     * looked every hash up again. measured (kvidx-bench micro --replay,
     * callgrind, stores and removes): 1,248.9 M -> 1,242.8 M instructions;
     * thread cpu ns per stored block 140.3 / 134.8 -> 133.1 / 131.7. */
    uint32_t *have = st + n;
    size_t have_end = 0; /* have[i] == KVI_NONE for every i >= have_end */
    for (size_t i = 0; i < n && i < PF_DIST; i++)
        tab_prefetch_t(&s->map, mt[i]);
    for (size_t i = 0; i < n; i++) {
        if (i + PF_DIST < n)
            tab_prefetch_t(&s->map, mt[i + PF_DIST]);
        /* (entries of hashes the slot holds: re-stores, which come in runs;
         * skipped while the run's blocks are new to the slot) */
        if (i + PF_DIST / 2 < n && (i == 0 || have[i - 1] != KVI_NONE)) {
            uint32_t a = tab_peek_t(&s->map, mt[i + PF_DIST / 2]);
            if (a != KVI_NONE)
                __builtin_prefetch(kvi__entry(p, a));
        }
        have[i] = map_find_t(ix, p, s, eh_at(ehv, i), mt[i]);
        if (have[i] != KVI_NONE)
            have_end = i + 1;
        if (prev != KVI_NONE && have[i] != KVI_NONE &&
            !same_prefix(ix, p, son, run_key_is_content(r, seq_only, i, pos0 + (uint32_t)i), have[i], rk[i], rs[i],
                         son ? st[i] : 0, pos0 + (uint32_t)i)) {
            uint32_t hv = have[i];
            /* would the cascade from `have` reach the run's parent? it follows
             * links between blocks this slot holds (not positional roots) */
            uint32_t x = prev;
            while (x != KVI_NONE && x != hv && has_member(kvi__entry(p, x), sid) &&
                   !kvi_ix__member_is_root(kvi__entry(p, x), sid))
                x = entry_parent(kvi__entry(p, x));
            if (x == hv) {
                kvi_relaxed_add(&p->invalid_events, 1);
                return -EINVAL;
            }
        }
    }
    for (size_t i = 0; i < n && i < PF_DIST; i++) {
        tab_prefetch_t(&p->ktab, kt[i]);
        if (son)
            tab_prefetch_t(&p->stab, st[i]);
    }

    /* pass 2. have[] stays exact until a cascade drops holdings or a rename
     * drops a name: from then on a hit is re-checked (an entry freed meanwhile
     * is not recycled before the next reclaim, and names no member) */
    bool stale = false;
    /* prev was created by this store: no entry has a key chained from its
     * key yet, so the key lookup of the next block would miss (prefix_find;
     * with a seq table a prefix placed by seq alone may still be its child,
     * found by seq hash) */
    bool prev_new = false;
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = pos0 + (uint32_t)i;
        uint64_t eh = eh_at(ehv, i);
        k = rk[i];
        sq = rs[i];
        if (i + PF_DIST < n) {
            tab_prefetch_t(&p->ktab, kt[i + PF_DIST]);
            if (son)
                tab_prefetch_t(&p->stab, st[i + PF_DIST]);
        }

        bool by_key = run_key_is_content(r, seq_only, i, pos);
        uint32_t hv = have[i];
        if (hv != KVI_NONE && stale) {
            bool f;
            if (member_eh(kvi__entry(p, hv), sid, &f) != eh || !f)
                hv = KVI_NONE;
        }
        if (hv != KVI_NONE) {
            struct kvi_entry *he = kvi__entry(p, hv);
            if (same_prefix(ix, p, son, by_key, hv, k, sq, son ? st[i] : 0, pos) && he->pos == pos) {
                prev = hv; /* idempotent re-store */
                parent_in_slot = true;
                prev_new = false;
                if (he->key != k)
                    run_rekey(ix, r, rk, kt, rs, i, pos0, he->key);
                continue;
            }
            /* the engine renamed a different block: drop the old one */
            kvi_ix__holding_remove_cascade_t(ix, p, s, hv, mt[i]);
            stale = true;
            if (parent_in_slot && !has_member(kvi__entry(p, prev), sid)) {
                kvi_relaxed_add(&p->invalid_events, 1);
                maybe_reclaim(ix, in->part);
                return -EINVAL;
            }
        }
        /* the standard seq hash is the canonical identity of a prefix: a
         * prefix placed by seq alone and the same prefix stored with its
         * content chain are one entry. Without a seq table no prefix is
         * placed by seq alone, and the prefix key identifies it as well. */
        bool known = r->b != NULL || pos == 0; /* content known */
        uint64_t content = r->b != NULL ? r->b[i].content_hash : pos == 0 ? sq : 0;
        bool joined;
        uint32_t idx = prefix_find(ix, p, son, by_key, prev_new, k, kt[i], sq, son ? st[i] : 0, pos, &joined);
        if (joined)
            kvi_relaxed_add(&p->seq_conflicts, 1);
        if (idx == KVI_NONE) {
            bool stand_in = (seq_only && i == 0) || !known;
            idx = entry_new(ix, p, k, kt[i], sq, son ? st[i] : 0, content,
                            !known ? KVI_UP_NO_CONTENT : stand_in ? KVI_UP_ASIDE : 0, pos, prev);
            if (stand_in)
                atomic_store_explicit(&ix->has_seq_only, true, memory_order_release);
            /* a new entry has no member yet */
            kvi_ix__holding_add(ix, p, s, idx, eh, mt[i], seq_only && i == 0);
            prev = idx;
            parent_in_slot = true;
            prev_new = true;
            if (!son && r->b != NULL && i + 1 < n && i + 1 >= have_end) {
                /* every block left is new to the partition and to the slot */
                store_fresh_tail(ix, p, s, r, rk, kt, mt, i + 1, pos0, prev);
                break;
            }
            continue;
        } else {
            struct kvi_entry *fe = kvi__entry(p, idx);
            if (entry_parent(fe) == KVI_NONE && prev != KVI_NONE) {
                /* placed by seq alone before: now its parent is known */
                fe->up |= prev;
                child_link(p, prev, idx); /* W5 */
            }
            if (entry_no_content(fe) && known) { /* placed without tokens before: a stand-in key */
                kvi_ix__aside_put(p, idx, content);
                fe->up = (fe->up & ~KVI_UP_NO_CONTENT) | KVI_UP_ASIDE;
            }
            prev_new = false;
            if (fe->key != rk[i])
                run_rekey(ix, r, rk, kt, rs, i, pos0, fe->key);
        }
        struct kvi_entry *e = kvi__entry(p, idx);
        bool f;
        uint64_t old_eh = member_eh(e, sid, &f);
        if (f) { /* the slot holds this prefix under another engine hash: rename */
            kvi_ix__holding_rename(ix, p, s, idx, old_eh, eh, mt[i]);
            stale = true;
        } else
            kvi_ix__holding_add(ix, p, s, idx, eh, mt[i], seq_only && i == 0);
        prev = idx;
        parent_in_slot = true;
    }
    maybe_reclaim(ix, in->part);
    return 0;
}

/* ---- reservations ----------------------------------------------------------- */

/* Smallest table capacity that holds `live` keys without growing
 * (UINT64_MAX when no table can). */
static uint64_t tab_cap_for(uint64_t live)
{
    if (live >= 1ull << 32)
        return UINT64_MAX;
    uint64_t cap = 16;
    while (cap * TAB_MAX_LOAD_NUM < (live + 1) * TAB_MAX_LOAD_DEN)
        cap *= 2;
    return cap;
}

/* Resize tb (of kind c->kind) to hold `live` keys, pages touched, and keep
 * it at least that large from now on (its floor; `live` 0 drops the floor,
 * and a lower one lets later removals shrink the table to it). */
static void tab_reserve(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint64_t live)
{
    uint64_t cap = tab_cap_for(live);
    *tab_floor(c) = live == 0 ? 0 : (uint32_t)cap;
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (live > 0 && (t == NULL || cap > (uint64_t)t->mask + 1))
        kvi_ix__tab_rehash(p, c, tb, (uint32_t)cap);
}

/*
 * Growing from empty spends its extra time rehashing the key table and the
 * slot maps and faulting in fresh table and entry pages. measured
 * (kvidx-bench micro, 1 M new blocks, thread cpu ns per block, 3 runs): cold
 * 149.8 / 185.2 / 161.4, pre-sized 62.4 / 61.0 / 58.6; callgrind (--seqs 256):
 * 666 -> 517 instructions per block. (Carving entry chunks from 2 MiB
 * huge-page slabs instead made the cold store slower here: 167-178 ->
 * 191-313. Not kept.)
 */
int kvi_index_reserve(struct kvi_index *ix, uint32_t part, uint64_t entries)
{
    if (part >= ix->n_parts || entries >= KVI_ENTRY_IDX_END || tab_cap_for(entries) > (1ull << 31))
        return -EINVAL;
    struct kvi_part *p = &ix->parts[part];
    stab_maybe_build(ix, p);
    struct tab_ctx kc = {ix, p, TAB_KEY, 0}, sc = {ix, p, TAB_SEQ, 0};
    tab_reserve(p, &kc, &p->ktab, entries);
    if (stab_on(p))
        tab_reserve(p, &sc, &p->stab, entries);
    /* entry chunks through index `entries` (index 0 is never an entry) */
    uint32_t last = entries == 0 ? 0 : (uint32_t)((entries + KVI_ENTRY_CHUNK) >> KVI_ENTRY_CHUNK_SHIFT);
    for (uint32_t c = 0; c < last; c++)
        if (atomic_load_explicit(&p->chunks[c], memory_order_relaxed) == NULL)
            kvi_ix__chunk_alloc(p, c);
    return 0;
}

int kvi_index_reserve_slot(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                           uint64_t blocks)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire) ||
        (unsigned)tier >= KVI_TIER_COUNT || tab_cap_for(blocks) > (1ull << 31))
        return -EINVAL;
    struct kvi_instance *in = inst_get(ix, instance);
    struct kvi_part *p = &ix->parts[in->part];
    uint32_t sid = kvi_ix__slot_find(ix, instance, dp_rank, (uint8_t)tier);
    if (sid == KVI_NONE)
        sid = kvi_ix__slot_create(ix, instance, dp_rank, (uint8_t)tier);
    struct tab_ctx mc = {ix, p, TAB_MAP, sid};
    tab_reserve(p, &mc, &kvi__slot(ix, sid)->map, blocks);
    return 0;
}

int kvi_index_store(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier, bool has_parent,
                    uint64_t parent_engine_hash, const struct kvi_block *blocks, size_t n)
{
    struct run r = {.b = blocks, .n = n};
    return do_store(ix, instance, dp_rank, tier, has_parent, parent_engine_hash, 0, &r);
}

int kvi_index_store_seq(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                        bool has_parent, uint64_t parent_engine_hash, uint32_t position,
                        const struct kvi_block *blocks, const uint64_t *seq, size_t n)
{
    struct run r = {.b = blocks, .seq = seq, .n = n};
    return do_store(ix, instance, dp_rank, tier, has_parent, parent_engine_hash, position, &r);
}

int kvi_index_store_seq_only(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                             bool has_parent, uint64_t parent_engine_hash, uint32_t position,
                             const uint64_t *engine_hashes, const uint64_t *seq, size_t n)
{
    if (n > 0 && (engine_hashes == NULL || seq == NULL))
        return -EINVAL;
    struct run r = {.eh = engine_hashes, .seq = seq, .n = n};
    return do_store(ix, instance, dp_rank, tier, has_parent, parent_engine_hash, position, &r);
}

/* ---- store by engine hash, remove ------------------------------------------- */

/* The slots of (instance, rank), by tier (NULL where it has none). Writer. */
static void rank_slots(const struct kvi_index *ix, const struct kvi_instance *in, uint32_t rank,
                       struct kvi_slot *by_tier[KVI_TIER_COUNT])
{
    for (int t = 0; t < KVI_TIER_COUNT; t++)
        by_tier[t] = NULL;
    struct kvi_slotlist *sl = atomic_load_explicit(&((struct kvi_instance *)in)->slots, memory_order_relaxed);
    for (uint32_t i = 0; sl != NULL && i < sl->n; i++) {
        struct kvi_slot *s = kvi__slot(ix, sl->id[i]);
        if (s->dp_rank == rank)
            by_tier[s->tier] = s;
    }
}

/* The entry (instance, rank) names eh, looked up gpu first, then cpu, disk,
 * external; KVI_NONE if none. Writer. */
static uint32_t rank_resolve(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *const *by_tier,
                             uint64_t eh)
{
    for (int t = 0; t < KVI_TIER_COUNT; t++)
        if (by_tier[t] != NULL) {
            uint32_t idx = map_find(ix, p, by_tier[t], eh);
            if (idx != KVI_NONE)
                return idx;
        }
    return KVI_NONE;
}

/* Does any slot of (instance, rank) hold entry idx? Writer. */
static bool rank_holds(struct kvi_part *p, struct kvi_slot *const *by_tier, uint32_t idx)
{
    const struct kvi_entry *e = kvi__entry(p, idx);
    for (int t = 0; t < KVI_TIER_COUNT; t++)
        if (by_tier[t] != NULL && has_member(e, by_tier[t]->id))
            return true;
    return false;
}

size_t kvi_index_store_known(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                             const uint64_t *engine_hashes, size_t n, size_t *n_unresolved)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire) ||
        (unsigned)tier >= KVI_TIER_COUNT) {
        if (n_unresolved != NULL)
            *n_unresolved = n;
        return 0;
    }
    struct kvi_instance *in = inst_get(ix, instance);
    struct kvi_part *p = &ix->parts[in->part];
    stab_maybe_build(ix, p);
    struct kvi_slot *by_tier[KVI_TIER_COUNT];
    rank_slots(ix, in, dp_rank, by_tier);
    /* parents before children: apply the run in position order (the order
     * it came in unless that differs) */
    if (n > p->cap_runbuf) {
        p->cap_runbuf = n;
        p->runbuf = kvi_xrealloc(p->runbuf, p->cap_runbuf * sizeof(uint64_t));
    }
    uint64_t *order = p->runbuf;
    bool sorted = true;
    for (size_t i = 0; i < n; i++) {
        uint32_t idx = rank_resolve(ix, p, by_tier, engine_hashes[i]);
        uint64_t pos = idx != KVI_NONE ? kvi__entry(p, idx)->pos : 0;
        order[i] = (pos << 32) | i;
        if (i > 0 && order[i] < order[i - 1])
            sorted = false;
    }
    if (!sorted)
        qsort(order, n, sizeof(uint64_t), kvi__cmp_u64);
    size_t held = 0, unresolved = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t eh = engine_hashes[(uint32_t)order[k]];
        struct kvi_slot *s = by_tier[tier];
        uint32_t idx = rank_resolve(ix, p, by_tier, eh);
        if (idx == KVI_NONE) {
            unresolved++;
            continue;
        }
        if (s != NULL) {
            uint32_t have = map_find(ix, p, s, eh);
            if (have == idx) { /* already held on this tier under this name */
                held++;
                continue;
            }
            if (have != KVI_NONE) /* the name meant another prefix on this tier: drop it */
                holding_remove_cascade(ix, p, s, have);
        }
        struct kvi_entry *e = kvi__entry(p, idx);
        bool root = false;
        if (e->pos > 0) {
            /* linked below its parent when the slot (gpu) or the rank (lower
             * tiers, as for a named parent) holds it; else a positional root,
             * which the gpu tier cannot hold (its holdings are ancestor-closed) */
            uint32_t par = entry_parent(e);
            bool linked = par != KVI_NONE && (tier == KVI_TIER_GPU ? s != NULL && has_member(kvi__entry(p, par), s->id)
                                                                   : rank_holds(p, by_tier, par));
            if (!linked && tier == KVI_TIER_GPU) {
                unresolved++;
                continue;
            }
            root = !linked;
        }
        if (s == NULL) {
            s = kvi__slot(ix, kvi_ix__slot_create(ix, instance, dp_rank, (uint8_t)tier));
            by_tier[tier] = s;
        }
        bool f;
        uint64_t old_eh = member_eh(e, s->id, &f);
        if (f)
            kvi_ix__holding_rename(ix, p, s, idx, old_eh, eh, tab_tag(ix, eh));
        else
            kvi_ix__holding_add(ix, p, s, idx, eh, tab_tag(ix, eh), root);
        held++;
    }
    if (unresolved > 0)
        kvi_relaxed_add(&p->unknown_blocks, unresolved);
    if (n_unresolved != NULL)
        *n_unresolved = unresolved;
    maybe_reclaim(ix, in->part);
    return held;
}

size_t kvi_index_remove(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                        const uint64_t *engine_hashes, size_t n)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire) || (unsigned)tier >= KVI_TIER_COUNT)
        return 0;
    struct kvi_instance *in = inst_get(ix, instance);
    struct kvi_part *p = &ix->parts[in->part];
    stab_maybe_build(ix, p);
    bool son = stab_on(p);
    uint32_t sid = kvi_ix__slot_find(ix, instance, dp_rank, (uint8_t)tier);
    if (sid == KVI_NONE) {
        kvi_relaxed_add(&p->unknown_removes, n);
        return 0;
    }
    struct kvi_slot *s = kvi__slot(ix, sid);
    size_t known = 0;
    /* the hashes' map tags, once each */
    if (n > p->cap_runbuf) {
        p->cap_runbuf = n;
        p->runbuf = kvi_xrealloc(p->runbuf, p->cap_runbuf * sizeof(uint64_t));
    }
    uint32_t *mt = (uint32_t *)p->runbuf;
    for (size_t i = 0; i < n; i++)
        mt[i] = tab_tag(ix, engine_hashes[i]);
    /* pipeline: map slot PF_DIST ahead, its entry PF_DIST/2 ahead, that
     * entry's query-table homes and parent 2 ahead; by tag alone (verifying
     * would wait for the entry; a wrong guess only wastes a prefetch).
     * measured (micro, thread cpu ns per removed block, 3 interleaved runs
     * each, with huge-page tables): verified lookup 127.7 / 131.9 / 138.0 ->
     * tag peek 114.6 / 119.6 / 122.1.
     * (Carrying the entries found down the pipeline instead of looking them
     * up again measured within noise: 107.2-117.7 -> 107.6-115.9. Not kept.) */
    for (size_t i = 0; i < n; i++) {
        if (i + PF_DIST < n)
            tab_prefetch_t(&s->map, mt[i + PF_DIST]);
        if (i + PF_DIST / 2 < n) {
            uint32_t a = tab_peek_t(&s->map, mt[i + PF_DIST / 2]);
            if (a != KVI_NONE)
                __builtin_prefetch(kvi__entry(p, a));
        }
        if (i + 2 < n) {
            uint32_t a = tab_peek_t(&s->map, mt[i + 2]);
            if (a != KVI_NONE) {
                const struct kvi_entry *ae = kvi__entry(p, a);
                tab_prefetch_t(&p->ktab, key_tag(ae->key));
                if (son)
                    tab_prefetch_t(&p->stab, tab_tag(ix, *kvi__seqp(p, a)));
                if (entry_parent(ae) != KVI_NONE)
                    __builtin_prefetch(kvi__entry(p, entry_parent(ae)));
            }
        }
        uint32_t idx = map_find_t(ix, p, s, engine_hashes[i], mt[i]);
        if (idx == KVI_NONE)
            continue;
        known++;
        kvi_ix__holding_remove_cascade_t(ix, p, s, idx, mt[i]);
    }
    if (known < n)
        kvi_relaxed_add(&p->unknown_removes, n - known);
    maybe_reclaim(ix, in->part);
    return known;
}

/* ---- clear ------------------------------------------------------------------ */

static int cmp_desc_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* Collect slot s's holdings as (pos << 32 | entry) in p->sortbuf. */
static size_t slot_collect(struct kvi_part *p, struct kvi_slot *s)
{
    struct kvi_tab *t = atomic_load_explicit(&s->map.t, memory_order_relaxed);
    size_t m = 0;
    if (t == NULL)
        return 0;
    if (t->live > p->cap_sortbuf) {
        p->cap_sortbuf = (size_t)t->live * 2;
        p->sortbuf = kvi_xrealloc(p->sortbuf, p->cap_sortbuf * sizeof(uint64_t));
    }
    for (uint32_t i = 0; i <= t->mask; i++) {
        uint32_t idx = atomic_load_explicit(&t->s[i], memory_order_relaxed) & KVI_TAB_IDX;
        if (idx == KVI_NONE || idx == KVI_TOMB)
            continue;
        p->sortbuf[m++] = ((uint64_t)kvi__entry(p, idx)->pos << 32) | idx;
    }
    return m;
}

/* Drop all of slot s's holdings (deepest first) and its map. */
static void slot_clear(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s)
{
    size_t m = slot_collect(p, s);
    if (m > 1)
        qsort(p->sortbuf, m, sizeof(uint64_t), cmp_desc_u64);
    for (size_t i = 0; i < m; i++)
        kvi_ix__holding_drop(ix, p, s, (uint32_t)p->sortbuf[i]);
    kvi_ix__tab_free_now(p, &s->map);
}

/* Forget the slots of `in` marked in `gone` (indexes into its current list):
 * one new list without them, the old one retired, their ids recycled after
 * a grace period. Linear in the instance's slots. */
static void slots_forget(struct kvi_index *ix, struct kvi_part *p, struct kvi_instance *in, const bool *gone)
{
    struct kvi_slotlist *old = atomic_load_explicit(&in->slots, memory_order_relaxed);
    uint32_t n = old->n;
    struct kvi_slotlist *nl = kvi_xmalloc(sizeof *nl + n * sizeof(uint32_t));
    part_account(p, (int64_t)(sizeof *nl + n * sizeof(uint32_t)));
    nl->n = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t sid = old->id[i];
        if (!gone[i]) {
            nl->id[nl->n++] = sid;
            continue;
        }
        atomic_store_explicit(&kvi__slot(ix, sid)->live, false, memory_order_release);
        if (p->n_pending_slots == p->cap_pending_slots) {
            p->cap_pending_slots = p->cap_pending_slots ? p->cap_pending_slots * 2 : 16;
            p->pending_slots = kvi_xrealloc(p->pending_slots, p->cap_pending_slots * sizeof(uint32_t));
        }
        p->pending_slots[p->n_pending_slots++] = sid;
    }
    atomic_store_explicit(&in->slots, nl, memory_order_release);
    kvi_ix__retire(p, old, sizeof *old + n * sizeof(uint32_t));
}

/* Clear (and optionally forget) the slots of an instance matching rank
 * (UINT32_MAX = every rank): lower tiers first, since their entries may hang
 * below gpu entries. One pass per tier over the slot list, and one new list
 * when forgetting: linear in the instance's slots and holdings, however many
 * ranks it has. */
static void instance_drop(struct kvi_index *ix, uint32_t instance, uint32_t rank, bool forget)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire))
        return;
    struct kvi_instance *in = inst_get(ix, instance);
    struct kvi_part *p = &ix->parts[in->part];
    stab_maybe_build(ix, p);
    struct kvi_slotlist *sl = atomic_load_explicit(&in->slots, memory_order_relaxed);
    if (sl == NULL || sl->n == 0)
        return;
    bool *gone = kvi_xcalloc(sl->n, sizeof(bool));
    bool any = false;
    for (int tier = KVI_TIER_COUNT - 1; tier >= 0; tier--)
        for (uint32_t i = 0; i < sl->n; i++) {
            struct kvi_slot *s = kvi__slot(ix, sl->id[i]);
            if (s->tier != tier || (rank != UINT32_MAX && s->dp_rank != rank))
                continue;
            slot_clear(ix, p, s);
            gone[i] = true;
            any = true;
        }
    if (forget && any)
        slots_forget(ix, p, in, gone);
    free(gone);
    maybe_reclaim(ix, in->part);
}

void kvi_index_clear(struct kvi_index *ix, uint32_t instance)
{
    instance_drop(ix, instance, UINT32_MAX, false);
}

void kvi_index_clear_dp_rank(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank)
{
    instance_drop(ix, instance, dp_rank, false);
}

void kvi_index_remove_dp_rank(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank)
{
    instance_drop(ix, instance, dp_rank, true);
}

void kvi_index_remove_instance(struct kvi_index *ix, uint32_t instance)
{
    instance_drop(ix, instance, UINT32_MAX, true);
}

/* ---- dump ------------------------------------------------------------------- */

static int cmp_asc_u64(const void *a, const void *b)
{
    return kvi__cmp_u64(a, b);
}

void kvi_index_dump_partition(struct kvi_index *ix, uint32_t part, kvi_dump_fn emit, void *ctx)
{
    struct kvi_part *p = &ix->parts[part];
    uint32_t ni = atomic_load_explicit(&ix->n_instances, memory_order_acquire);
    uint64_t *seqs = NULL; /* seq hashes, derived once when the partition keeps none */
    if (!stab_on(p) && p->next_fresh > 0) {
        seqs = kvi_xmalloc(p->next_fresh * sizeof(uint64_t));
        kvi_ix__seqs_derive(ix, p, seqs);
    }
    for (uint32_t ii = part; ii < ni; ii += ix->n_parts) {
        struct kvi_instance *in = inst_get(ix, ii);
        struct kvi_slotlist *sl = atomic_load_explicit(&in->slots, memory_order_relaxed);
        if (sl == NULL || sl->n == 0)
            continue;
        /* one (instance, dp_rank) at a time: its holdings on every tier,
         * ordered by position (a parent is one position up) then tier */
        bool *done = kvi_xcalloc(sl->n, sizeof(bool));
        for (uint32_t a = 0; a < sl->n; a++) {
            if (done[a])
                continue;
            uint32_t rank = kvi__slot(ix, sl->id[a])->dp_rank;
            uint32_t rs[KVI_TIER_COUNT + 8];
            uint32_t nrs = 0;
            size_t total = 0;
            for (uint32_t b = a; b < sl->n; b++) {
                struct kvi_slot *sb = kvi__slot(ix, sl->id[b]);
                if (sb->dp_rank != rank || nrs == KVI_ARRAY_LEN(rs))
                    continue;
                done[b] = true;
                rs[nrs++] = sb->id;
                struct kvi_tab *t = atomic_load_explicit(&sb->map.t, memory_order_relaxed);
                total += t ? t->live : 0;
            }
            if (total == 0)
                continue;
            /* tier order, so that a parent held on several tiers is always
             * named by the same (lowest-tier) slot, whatever the slot history */
            for (uint32_t x = 1; x < nrs; x++)
                for (uint32_t y = x; y > 0 && kvi__slot(ix, rs[y - 1])->tier > kvi__slot(ix, rs[y])->tier; y--) {
                    uint32_t t2 = rs[y];
                    rs[y] = rs[y - 1];
                    rs[y - 1] = t2;
                }
            /* (pos << 34 | tier << 32 | entry) */
            uint64_t *hold = kvi_xmalloc(total * sizeof(uint64_t));
            size_t m = 0;
            for (uint32_t r = 0; r < nrs; r++) {
                struct kvi_slot *sr = kvi__slot(ix, rs[r]);
                size_t k = slot_collect(p, sr);
                for (size_t j = 0; j < k && m < total; j++) {
                    uint32_t idx = (uint32_t)p->sortbuf[j];
                    hold[m++] = ((uint64_t)kvi__entry(p, idx)->pos << 34) | ((uint64_t)sr->tier << 32) | idx;
                }
            }
            if (m > 1)
                qsort(hold, m, sizeof(uint64_t), cmp_asc_u64);
            for (size_t j = 0; j < m; j++) {
                uint32_t idx = (uint32_t)hold[j];
                uint8_t tier = (uint8_t)((hold[j] >> 32) & 3);
                struct kvi_slot *s = NULL;
                for (uint32_t r = 0; r < nrs; r++)
                    if (kvi__slot(ix, rs[r])->tier == tier)
                        s = kvi__slot(ix, rs[r]);
                struct kvi_entry *e = kvi__entry(p, idx);
                bool f;
                struct kvi_dump_block d = {
                    .instance = ii,
                    .dp_rank = rank,
                    .tier = (enum kvi_tier)tier,
                    .position = e->pos,
                    .engine_hash = member_eh(e, s->id, &f),
                    .content_hash = entry_content(ix, p, e, idx),
                    .no_content = entry_no_content(e),
                    .seq_hash = seqs != NULL ? seqs[idx] : *kvi__seqp(p, idx),
                };
                if (entry_parent(e) != KVI_NONE && !kvi_ix__member_is_root(e, s->id)) {
                    struct kvi_entry *pe = kvi__entry(p, entry_parent(e));
                    uint64_t peh = member_eh(pe, s->id, &f); /* same slot first */
                    for (uint32_t r = 0; !f && r < nrs; r++)
                        if (rs[r] != s->id)
                            peh = member_eh(pe, rs[r], &f);
                    d.has_parent = f;
                    d.parent_engine_hash = f ? peh : 0;
                }
                emit(ctx, &d);
            }
            free(hold);
        }
        free(done);
    }
    free(seqs);
}
