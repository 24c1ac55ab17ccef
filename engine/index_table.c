/*
 * A partition's structures and the writer's primitives on them (see the
 * DESIGN notes in engine/index.c): open-addressing tables (insert, delete,
 * rehash, huge-page arrays), seq tables built on demand, member sets,
 * entries (chunks, child lists, release) and slot maps with the holdings
 * they name. Lookups, member reads and entry creation are static inline in
 * engine/index_impl.h; the operations made of these primitives are in
 * engine/index_write.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "engine/hash_impl.h"
#include "engine/index_impl.h"

/* ---- tables ----------------------------------------------------------------- */

#define HUGE_PAGE (2u << 20)

/* len bytes (a multiple of HUGE_PAGE) of zeroed memory on a HUGE_PAGE
 * boundary, advised to use transparent huge pages. */
static void *huge_map(size_t len)
{
    size_t span = len + HUGE_PAGE;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        kvi_die("out of memory (mmap of %zu bytes)", span);
    uintptr_t a = ((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    size_t head = a - (uintptr_t)m, tail = span - head - len;
    if (head != 0)
        munmap(m, head);
    if (tail != 0)
        munmap((char *)a + len, tail);
    (void)madvise((void *)a, len, MADV_HUGEPAGE); /* advice only */
    return (void *)a;
}

/*
 * A table of 2 MiB or more is mapped on its own, on 2 MiB boundaries, and
 * asks for transparent huge pages: its random probes then miss the TLB far
 * less (a page walk costs twice under virtualisation), growing it faults 512
 * times fewer pages.
 * measured (kvidx-bench micro, thread cpu ns per block, 3 interleaved runs
 * each, shared 2-cpu VM), huge pages with malloc + memset: store 193.1 /
 * 193.2 / 196.2 -> 169.7 / 172.7 / 213.5, remove 130.5 / 134.9 / 138.1 ->
 * 123.1 / 125.3 / 126.3.
 *
 * Every new table is written (zeroed) before anything reads it. A fresh page
 * read first is mapped to the shared zero page; the write that follows
 * replaces it and must flush that address from every cpu running a thread
 * of the process: an IPI to each query thread per 4 KiB page (per 2 MiB
 * page for huge ones) of every table the writer grows, since inserts probe
 * (read) a slot before they fill it. measured (quiet 2-cpu VM, interleaved
 * runs): kvidx-bench trace --window-ms 300, IPIs taken by the query lane
 * 1,208 -> 230 per run, find p99 12.3-13.2 -> 5.3-5.7 us (250 ms: 13.6-14.8
 * -> 5.6-6.1 us); kvidx-bench micro cold store 167.4 / 211.6 -> 143.7 /
 * 137.0 ns per block.
 */
/* Fault every page of mem in writable (its content unchanged: zeroed table
 * memory, or entry chunks that are written whole before use), so that no
 * page is first read (see tab_new) and the faults are taken in one system
 * call rather than one trap per 4 KiB page: MADV_POPULATE_WRITE (Linux
 * 5.14) for the whole pages, a write to the partial ones. Where the kernel
 * refuses it, writes a zero into every page (volatile: a compiler turns
 * malloc + memset into calloc, and calloc leaves fresh pages untouched).
 * measured (the cold-store harness, 4 interleaved runs each): cold store
 * 133.9-138.2 -> 121.7-123.6 ns per block (131.6-131.8 for tables alone);
 * kvidx-bench micro cold store, 5 interleaved runs, median 138.9 -> 125.6. */
static void write_pages(void *mem, size_t bytes)
{
    uintptr_t a = ((uintptr_t)mem + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)mem + bytes) & ~(uintptr_t)4095;
    if (e > a && madvise((void *)a, e - a, MADV_POPULATE_WRITE) == 0) {
        if (a != (uintptr_t)mem)
            ((volatile char *)mem)[0] = 0;
        if (e != (uintptr_t)mem + bytes)
            ((volatile char *)mem)[bytes - 1] = 0;
        return;
    }
    for (size_t o = 0; o < bytes; o += 4096)
        ((volatile char *)mem)[o] = 0;
}

static struct kvi_tab *tab_new(uint32_t cap)
{
    size_t bytes = sizeof(struct kvi_tab) + (size_t)cap * sizeof(uint32_t);
    struct kvi_tab *t;
    if (bytes >= HUGE_PAGE) {
        size_t len = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        t = huge_map(len);
        t->mapped = len;
    } else {
        t = kvi_xcalloc(1, bytes);
    }
    write_pages(t, bytes);
    t->mask = cap - 1;
    t->shift = 64 - (uint32_t)__builtin_ctz(cap);
    t->grow_at = cap / TAB_MAX_LOAD_DEN * TAB_MAX_LOAD_NUM; /* cap >= 16: exact */
    return t;
}

void kvi_ix__tab_free_mem(struct kvi_tab *t)
{
    if (t != NULL && t->mapped != 0)
        munmap(t, t->mapped);
    else
        free(t);
}

static size_t tab_bytes(const struct kvi_tab *t)
{
    return sizeof *t + ((size_t)t->mask + 1) * sizeof(uint32_t);
}

/* Where the key of entry idx in a table of kind c->kind is kept (to prefetch). */
static const void *tab_key_addr(const struct tab_ctx *c, uint32_t idx)
{
    if (c->kind == TAB_SEQ)
        return kvi__seqp(c->p, idx);
    return kvi__entry(c->p, idx);
}

/* The table tag of the key under which entry idx is in a table of kind
 * c->kind: what a slot does not keep. */
static uint32_t tab_tag_at(const struct tab_ctx *c, uint32_t idx)
{
    bool ok;
    uint64_t key = tab_key_of(c, idx, &ok);
    KVI_DEBUG_ASSERT(ok); /* a slot map names only entries its slot holds */
    return kind_tag(c->ix, c->kind, key);
}

/* (tab_insert_raw is in engine/index_impl.h: the store's fresh-tail loop inlines it.) */

/* Rebuild with capacity `cap`, publish, retire the old array (query tables)
 * or free it at once (slot maps, never read by queries). A rebuild of an
 * existing array is counted, with its moved slots and its time (two clock
 * reads, beside the allocation and the pass over the old array that every
 * rebuild makes). */
void kvi_ix__tab_rehash(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint32_t cap)
{
    const bool readers = c->kind != TAB_MAP;
    struct kvi_tab *old = atomic_load_explicit(&tb->t, memory_order_relaxed);
    const uint64_t t0 = old != NULL ? kvi_now_ns() : 0;
    struct kvi_tab *nt = tab_new(cap);
    part_account(p, (int64_t)tab_bytes(nt));
    if (old != NULL) {
        /* Live slots are first gathered without a branch, a block of old
         * slots at a time: a shrinking table mixes live slots, tombstones
         * and empty ones at random, and testing each slot mispredicted
         * about every other one. A slot does not keep its key's tag, so
         * the block's keys are read from their entries (or the seq column,
         * or a member array) in a pass of their own after a pass of
         * prefetches, their cache misses overlapping; then each slot is
         * placed as tab_insert_raw would (no tombstones in nt), with the
         * sizes in registers and the counts kept once.
         * measured (a harness storing the micro shape, then removing every
         * sequence tail first, 8-byte slots that kept the tag): the scan of
         * the 2 M-slot prefix-key table when it shrinks to 512 k took 12.2
         * ms of the rehash's 14.7 ms (5.8 ns per slot); that rehash now
         * takes 5.2-5.3 ms, the growth to 2 M slots 8.9-9.1 -> 7.5-8.2 ms;
         * removal 99-104 -> 85-90 ns per block, cold store 145-176 ->
         * 133-140 ns per block. Reading the keys from the entries costs
         * little for the key table and most for slot maps, whose entries
         * lie anywhere (kvidx-bench micro --replay, rdtsc around the
         * rehash, cycles per moved slot: key table 57 -> 58, slot maps 37
         * -> 83; the reads pipelined 8 or 16 slots ahead measured the
         * same as these passes). */
        const uint32_t omask = old->mask, nmask = nt->mask, nshift = nt->shift;
        uint32_t moved = 0;
        uint32_t live[256], tag[256];
        const uint64_t n_old = (uint64_t)omask + 1;
        for (uint64_t base = 0; base < n_old; base += KVI_ARRAY_LEN(live)) {
            uint64_t end = base + KVI_ARRAY_LEN(live) < n_old ? base + KVI_ARRAY_LEN(live) : n_old;
            uint32_t n = 0;
            for (uint64_t i = base; i < end; i++) {
                uint32_t s = atomic_load_explicit(&old->s[i], memory_order_relaxed);
                live[n] = s & KVI_TAB_IDX;
                n += (s != 0) & ((s & KVI_TAB_IDX) != KVI_TOMB);
            }
            /* the block's keys are read in passes, so that their cache
             * misses overlap: entries (or seq hashes), then the member
             * arrays of shared entries (slot maps), then the tags */
            for (uint32_t k = 0; k < n; k++)
                __builtin_prefetch(tab_key_addr(c, live[k]));
            if (c->kind == TAB_MAP)
                for (uint32_t k = 0; k < n; k++) {
                    const struct kvi_entry *e = kvi__entry(p, live[k]);
                    if (atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed) == KVI_MANY_BIT)
                        __builtin_prefetch(kvi__mset(e, memory_order_relaxed));
                }
            for (uint32_t k = 0; k < n; k++)
                tag[k] = tab_tag_at(c, live[k]);
            for (uint32_t k = 0; k < n; k++) {
                uint32_t j = tab_home_of(nshift, nmask, tag[k]);
                while (atomic_load_explicit(&nt->s[j], memory_order_relaxed) != 0)
                    j = (j + 1) & nmask;
                atomic_store_explicit(&nt->s[j], tab_slot(tag[k], live[k]), memory_order_relaxed); /* published below (W3) */
            }
            moved += n;
        }
        nt->used = nt->live = moved;
        kvi_relaxed_add(&p->table_rebuild_slots, moved);
    }
    atomic_store_explicit(&tb->t, nt, memory_order_release); /* W3 */
    if (old != NULL) {
        if (readers) {
            kvi_ix__retire(p, old, tab_bytes(old));
            p->retired[p->n_retired - 1].unmap = old->mapped;
        } else {
            part_account(p, -(int64_t)tab_bytes(old));
            kvi_ix__tab_free_mem(old);
        }
        kvi_relaxed_add(&p->table_rebuilds, 1);
        kvi_relaxed_add(&p->table_rebuild_ns, kvi_now_ns() - t0);
    }
}

/* Insert entry idx under a key whose tag is `tag` (W1). Writer. */
void kvi_ix__tab_insert_t(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint32_t tag, uint32_t idx)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t == NULL) {
        uint32_t fcap = *tab_floor(c);
        kvi_ix__tab_rehash(p, c, tb, fcap > 16 ? fcap : 16);
        t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    } else if (t->used >= t->grow_at) { /* (used + 1) / cap > 3/4 */
        uint32_t cap = t->mask + 1;
        if ((uint64_t)(t->live + 1) * 2 > cap)
            cap *= 2; /* else: same size, purge tombstones */
        kvi_ix__tab_rehash(p, c, tb, cap);
        t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    }
    tab_insert_raw(t, tag, idx);
}

/* Make room for `m` inserts into tb that then need no growth check: grow
 * (or purge tombstones) once, to the capacity the inserts one by one would
 * have grown it to. Writer. */
void kvi_ix__tab_room(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint64_t m)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t != NULL && (uint64_t)t->used + m <= t->grow_at)
        return;
    uint32_t fcap = *tab_floor(c);
    uint64_t live = t != NULL ? t->live : 0, cap = t != NULL ? (uint64_t)t->mask + 1 : fcap > 16 ? fcap : 16;
    if (t != NULL && (live + 1) * 2 > cap)
        cap *= 2; /* as kvi_ix__tab_insert_t: grow, or else purge at the same size */
    while (live + m > cap / TAB_MAX_LOAD_DEN * TAB_MAX_LOAD_NUM)
        cap *= 2;
    if (cap > (1ull << 31))
        kvi_die("table too large (%llu keys)", (unsigned long long)(live + m));
    kvi_ix__tab_rehash(p, c, tb, (uint32_t)cap);
}

/* Tombstone the slot holding (a key with tag `tag`, idx). A slot followed by
 * a free one ends its probe run: it is freed rather than tombstoned, and so
 * are the tombstones before it (no lookup needs to pass them: the writer
 * alone inserts, and a lookup that stops there would have stopped at the
 * free slot after). Shrinks when mostly empty, never below the table's
 * reserved floor. Writer. */
static void tab_delete_t(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint32_t tag, uint32_t idx)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t == NULL)
        return;
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint32_t s = atomic_load_explicit(&t->s[i], memory_order_relaxed);
        if (s == 0)
            return;
        if ((s & KVI_TAB_IDX) != idx)
            continue;
        t->live--;
        if (atomic_load_explicit(&t->s[(i + 1) & t->mask], memory_order_relaxed) != 0) {
            atomic_store_explicit(&t->s[i], KVI_TOMB, memory_order_release);
            break;
        }
        for (uint32_t n = 0; n <= t->mask; n++, i = (i - 1) & t->mask) {
            s = atomic_load_explicit(&t->s[i], memory_order_relaxed);
            if (n > 0 && s != KVI_TOMB)
                break;
            atomic_store_explicit(&t->s[i], 0, memory_order_release);
            t->used--;
        }
        break;
    }
    uint32_t cap = t->mask + 1;
    if (cap > 64 && (uint64_t)t->live * 8 < cap) {
        uint32_t to = cap / 4 > 16 ? cap / 4 : 16;
        if (to < *tab_floor(c))
            to = *tab_floor(c);
        if (to < cap)
            kvi_ix__tab_rehash(p, c, tb, to);
    }
}

void kvi_ix__tab_free_now(struct kvi_part *p, struct kvi_table *tb)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t != NULL) {
        part_account(p, -(int64_t)tab_bytes(t));
        kvi_ix__tab_free_mem(t);
        atomic_store_explicit(&tb->t, NULL, memory_order_relaxed);
    }
}

/* ---- seq tables, built on demand -------------------------------------------- */

static bool entry_empty(const struct kvi_entry *e);
static void stack_push(struct kvi_part *p, uint32_t *n, uint32_t v);

/* Every live entry has members or children; freed ones have neither. */
static bool entry_live(const struct kvi_entry *e)
{
    return !entry_empty(e) ||
           atomic_load_explicit(&((struct kvi_entry *)e)->first_child, memory_order_relaxed) != KVI_NONE;
}

/* The seq column of entry chunk c (published before any entry of the chunk
 * is inserted in the seq table). Writer. */
static void seqcol_alloc(struct kvi_part *p, uint32_t c)
{
    size_t bytes = (size_t)KVI_ENTRY_CHUNK * sizeof(uint64_t);
    uint64_t *col = kvi_xmalloc(bytes);
    part_account(p, (int64_t)bytes);
    atomic_store_explicit(&p->seqcol[c], col, memory_order_release);
}

/* Parents first: an entry's seq hash follows from its parent's (RFC 1527),
 * and a root's (position 0) is its content hash. Each entry is derived once:
 * the climb from an entry stops at the first ancestor already done. */
void kvi_ix__seqs_derive(const struct kvi_index *ix, struct kvi_part *p, uint64_t *seqs)
{
    uint32_t nf = p->next_fresh;
    uint8_t *done = kvi_xcalloc(nf > 0 ? nf : 1, 1);
    for (uint32_t idx = 1; idx < nf; idx++) {
        if (done[idx] || !entry_live(kvi__entry(p, idx)))
            continue;
        uint32_t m = 0, x = idx;
        while (x != KVI_NONE && !done[x]) {
            stack_push(p, &m, x);
            x = entry_parent(kvi__entry(p, x));
        }
        uint64_t sq = x != KVI_NONE ? seqs[x] : 0;
        while (m > 0) {
            uint32_t y = p->stack[--m];
            const struct kvi_entry *e = kvi__entry(p, y);
            uint64_t c = entry_content(ix, p, e, y);
            sq = e->pos == 0 ? c : kvi__seq_step(sq, c);
            seqs[y] = sq;
            done[y] = 1;
        }
    }
    free(done);
}

/*
 * A partition keeps a seq table (standard seq hash -> entry) only once
 * something needs one: a store given seq hashes (kvi_index_store_seq,
 * kvi_index_store_seq_only) or a query by seq hashes that reached a partition
 * without one (such a query walks child links instead, see seq_walk, and sets
 * ix->seq_wanted). Until then a store finds existing prefixes by prefix key,
 * which is exact while no prefix is placed by seq alone, and saves a random
 * table access per stored and removed block. Writer.
 * measured (kvidx-bench micro, thread cpu ns per block, 4 interleaved runs
 * each): store 259.8 / 270.8 / 273.2 / 288.8 -> 188.9 / 190.1 / 192.9 / 198.6,
 * remove 181.6 / 182.4 / 186.3 / 186.8 -> 130.8 / 137.5 / 140.1 / 142.1,
 * bytes per (block, worker) 112.3 -> 96.3; queries unchanged.
 */
void kvi_ix__stab_build(const struct kvi_index *ix, struct kvi_part *p)
{
    uint64_t live = atomic_load_explicit(&p->entries, memory_order_relaxed);
    uint32_t cap = 16;
    while ((uint64_t)cap * TAB_MAX_LOAD_NUM <= (live + 1) * TAB_MAX_LOAD_DEN)
        cap *= 2;
    struct kvi_tab *t = tab_new(cap);
    part_account(p, (int64_t)tab_bytes(t));
    /* the seq column, from the content chains (nothing is placed by seq
     * alone before the partition has a seq table) */
    for (uint32_t c = 0; c < p->n_chunks; c++)
        if (atomic_load_explicit(&p->chunks[c], memory_order_relaxed) != NULL &&
            atomic_load_explicit(&p->seqcol[c], memory_order_relaxed) == NULL)
            seqcol_alloc(p, c);
    uint64_t *seqs = kvi_xmalloc((p->next_fresh > 0 ? p->next_fresh : 1) * sizeof(uint64_t));
    kvi_ix__seqs_derive(ix, p, seqs);
    for (uint32_t idx = 1; idx < p->next_fresh; idx++) {
        if (entry_live(kvi__entry(p, idx))) {
            *kvi__seqp(p, idx) = seqs[idx];
            tab_insert_raw(t, tab_tag(ix, seqs[idx]), idx);
        }
    }
    free(seqs);
    atomic_store_explicit(&p->stab.t, t, memory_order_release); /* W3 */
}

/* ---- members ---------------------------------------------------------------- */

static size_t mset_bytes(uint32_t cap)
{
    return sizeof(struct kvi_mset) + (size_t)cap * sizeof(struct kvi_member);
}

/* Was the slot's holding of e stored without a parent link (a positional
 * root at position > 0)? Writer only. */
bool kvi_ix__member_is_root(const struct kvi_entry *e, uint32_t slot)
{
    struct kvi_mset *ms = entry_mset(e);
    if (ms == NULL)
        return (atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed) & KVI_ROOT_BIT) != 0;
    int32_t k = mset_find(ms, slot);
    return k >= 0 && (kvi__member_tier(atomic_load_explicit(&ms->m[k].w, memory_order_relaxed)) & KVI_MEMBER_ROOT);
}

/* A new member array of capacity cap holding the live members of ms (or, when
 * ms is NULL, e's single member), compacted. Not yet published. Writer. */
static struct kvi_mset *mset_copy(const struct kvi_index *ix, struct kvi_part *p, const struct kvi_entry *e,
                                  const struct kvi_mset *ms, uint32_t cap)
{
    struct kvi_mset *nm = kvi_xmalloc(mset_bytes(cap));
    part_account(p, (int64_t)mset_bytes(cap));
    nm->cap = cap;
    uint32_t j = 0, gpu = 0;
    if (ms == NULL) {
        uint32_t one = atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed);
        uint32_t os = one & KVI_SLOT_MASK;
        uint8_t tier = kvi__slot(ix, os)->tier;
        gpu = tier == KVI_TIER_GPU;
        tier = (uint8_t)(tier | ((one & KVI_ROOT_BIT) ? KVI_MEMBER_ROOT : 0));
        atomic_store_explicit(&nm->m[0].w, kvi__member_w(os, tier), memory_order_relaxed);
        nm->m[0].eh = atomic_load_explicit(&((struct kvi_entry *)e)->mv, memory_order_relaxed);
        j = 1;
    } else {
        uint32_t n = atomic_load_explicit(&((struct kvi_mset *)ms)->n, memory_order_relaxed);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t w = atomic_load_explicit(&((struct kvi_mset *)ms)->m[i].w, memory_order_relaxed);
            if (w == 0)
                continue;
            gpu += (kvi__member_tier(w) & KVI_MEMBER_TIER) == KVI_TIER_GPU;
            atomic_store_explicit(&nm->m[j].w, w, memory_order_relaxed);
            nm->m[j++].eh = ms->m[i].eh;
        }
    }
    nm->live = j;
    atomic_store_explicit(&nm->gpu_n, gpu, memory_order_relaxed);
    atomic_store_explicit(&nm->n, j, memory_order_relaxed);
    return nm;
}

static void member_add(const struct kvi_index *ix, struct kvi_part *p, struct kvi_entry *e, uint32_t slot,
                       uint8_t tier, uint64_t eh, bool root)
{
    /* G1: bumped before any release store below, so a reader that observes
     * this change also observes the bump (pairs with G2 in find_core) */
    kvi_relaxed_add(&p->wgen, 1);
    struct kvi_mset *ms = entry_mset(e);
    uint64_t w = kvi__member_w(slot, (uint8_t)(tier | (root ? KVI_MEMBER_ROOT : 0)));
    if (ms == NULL && atomic_load_explicit(&e->one, memory_order_relaxed) == KVI_NONE) {
        atomic_store_explicit(&e->mv, eh, memory_order_relaxed);
        atomic_store_explicit(&e->one, slot | (root ? KVI_ROOT_BIT : 0), memory_order_release); /* W2 */
    } else if (ms != NULL && ms->live < atomic_load_explicit(&ms->n, memory_order_relaxed)) {
        /* into a free position: no live member moves */
        uint32_t i = 0;
        while (atomic_load_explicit(&ms->m[i].w, memory_order_relaxed) != 0)
            i++;
        ms->m[i].eh = eh;
        atomic_store_explicit(&ms->m[i].w, w, memory_order_release); /* W2 */
        ms->live++;
    } else if (ms != NULL && ms->live < ms->cap) {
        uint32_t n = atomic_load_explicit(&ms->n, memory_order_relaxed);
        ms->m[n].eh = eh;
        atomic_store_explicit(&ms->m[n].w, w, memory_order_release);
        atomic_store_explicit(&ms->n, n + 1, memory_order_release); /* W2 */
        ms->live++;
    } else {
        struct kvi_mset *nm = mset_copy(ix, p, e, ms, ms ? ms->cap * 2 : 4);
        uint32_t n = nm->live;
        atomic_store_explicit(&nm->m[n].w, w, memory_order_relaxed);
        nm->m[n].eh = eh;
        nm->live = n + 1;
        atomic_store_explicit(&nm->n, n + 1, memory_order_relaxed);
        if (tier == KVI_TIER_GPU)
            atomic_store_explicit(&nm->gpu_n, atomic_load_explicit(&nm->gpu_n, memory_order_relaxed) + 1,
                                  memory_order_relaxed); /* published with nm */
        atomic_store_explicit(&e->mv, (uint64_t)(uintptr_t)nm, memory_order_release); /* W2 */
        if (ms != NULL)
            kvi_ix__retire(p, ms, mset_bytes(ms->cap));
        else /* from now on the members are in mv; a reader that loaded the
              * single slot before keeps that (consistent) snapshot */
            atomic_store_explicit(&e->one, KVI_MANY_BIT, memory_order_release); /* W2 */
        return;
    }
    if (ms != NULL && tier == KVI_TIER_GPU) /* after the member: a reader never counts more than exist */
        atomic_store_explicit(&ms->gpu_n, atomic_load_explicit(&ms->gpu_n, memory_order_relaxed) + 1,
                              memory_order_release); /* W2 */
}

/*
 * Remove slot's member of e. In an array the member's position is freed in
 * place (no live member moves: see struct kvi_mset), and the array is
 * replaced only when a quarter or less of it is live.
 * Before, every removal copied the whole array and retired the old one
 * (malloc, free and a grace period per removal); about half of the
 * conversation trace's removals hit an entry with an array. measured
 * (kvidx-bench micro --replay, callgrind, the replay's stores and removes):
 * 1,600.8 M -> 1,560.1 M instructions.
 */
static void member_del(const struct kvi_index *ix, struct kvi_part *p, struct kvi_entry *e, uint32_t slot,
                       uint8_t tier)
{
    kvi_relaxed_add(&p->wgen, 1); /* G1, as in member_add */
    struct kvi_mset *ms = entry_mset(e);
    if (ms == NULL) {
        atomic_store_explicit(&e->one, KVI_NONE, memory_order_release);
        atomic_store_explicit(&e->mv, 0, memory_order_relaxed);
        return;
    }
    int32_t k = mset_find(ms, slot);
    if (k < 0)
        return;
    if (tier == KVI_TIER_GPU) /* count first: readers never see more gpu members than exist */
        atomic_store_explicit(&ms->gpu_n, atomic_load_explicit(&ms->gpu_n, memory_order_relaxed) - 1,
                              memory_order_release);
    atomic_store_explicit(&ms->m[k].w, 0, memory_order_release); /* W2 */
    ms->m[k].eh = 0;
    ms->live--;
    /* an empty array stays (the entry is released next, or refilled) */
    if (ms->live > 0 && ms->live <= ms->cap / 4 && ms->cap > 4) {
        struct kvi_mset *nm = mset_copy(ix, p, e, ms, ms->cap / 2);
        atomic_store_explicit(&e->mv, (uint64_t)(uintptr_t)nm, memory_order_release); /* W2 */
        kvi_ix__retire(p, ms, mset_bytes(ms->cap));
    }
}

static bool entry_empty(const struct kvi_entry *e)
{
    struct kvi_mset *ms = entry_mset(e);
    if (ms != NULL)
        return ms->live == 0;
    return atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed) == KVI_NONE;
}

/* ---- content hashes kept aside ---------------------------------------------- */

/* Deleting by shifting back (the aside map): may the key at j,
 * whose home is h, move back to the free position i? Not if h lies in
 * (i, j] cyclically (it would move before its home). */
static inline bool shift_stays(uint32_t i, uint32_t j, uint32_t h)
{
    return i <= j ? (h > i && h <= j) : (h > i || h <= j);
}

/* Entries whose key is a stand-in (placed by seq hash alone) and whose
 * content hash is known: few, so an open-addressing map (load <= 1/2,
 * deletion by shifting back) beside the entries rather than 8 bytes in
 * every entry. Writer only. */
static uint32_t aside_home(uint32_t idx, uint32_t cap)
{
    return (uint32_t)kvi_fmix64(idx) & (cap - 1);
}

static void aside_grow(struct kvi_part *p)
{
    uint32_t ocap = p->aside_cap, ncap = ocap ? ocap * 2 : 16;
    uint32_t *ni = kvi_xcalloc(ncap, sizeof *ni);
    uint64_t *nv = kvi_xmalloc(ncap * sizeof *nv);
    for (uint32_t i = 0; i < ocap; i++) {
        if (p->aside_idx[i] == KVI_NONE)
            continue;
        uint32_t j = aside_home(p->aside_idx[i], ncap);
        while (ni[j] != KVI_NONE)
            j = (j + 1) & (ncap - 1);
        ni[j] = p->aside_idx[i];
        nv[j] = p->aside_val[i];
    }
    free(p->aside_idx);
    free(p->aside_val);
    p->aside_idx = ni;
    p->aside_val = nv;
    p->aside_cap = ncap;
    part_account(p, (int64_t)(ncap - ocap) * (int64_t)(sizeof *ni + sizeof *nv));
}

/* Position of idx in the map, or of the free position where it would go. */
static uint32_t aside_pos(const struct kvi_part *p, uint32_t idx)
{
    uint32_t j = aside_home(idx, p->aside_cap);
    while (p->aside_idx[j] != KVI_NONE && p->aside_idx[j] != idx)
        j = (j + 1) & (p->aside_cap - 1);
    return j;
}

void kvi_ix__aside_put(struct kvi_part *p, uint32_t idx, uint64_t content)
{
    if ((p->aside_n + 1) * 2 > p->aside_cap)
        aside_grow(p);
    uint32_t j = aside_pos(p, idx);
    if (p->aside_idx[j] == KVI_NONE) {
        p->aside_idx[j] = idx;
        p->aside_n++;
    }
    p->aside_val[j] = content;
}

uint64_t kvi_ix__aside_get(const struct kvi_part *p, uint32_t idx)
{
    if (p->aside_cap == 0)
        return 0;
    uint32_t j = aside_pos(p, idx);
    return p->aside_idx[j] == idx ? p->aside_val[j] : 0;
}

void kvi_ix__aside_del(struct kvi_part *p, uint32_t idx)
{
    if (p->aside_cap == 0)
        return;
    uint32_t mask = p->aside_cap - 1, i = aside_pos(p, idx);
    if (p->aside_idx[i] != idx)
        return;
    for (uint32_t j = (i + 1) & mask; p->aside_idx[j] != KVI_NONE; j = (j + 1) & mask) {
        if (!shift_stays(i, j, aside_home(p->aside_idx[j], p->aside_cap))) {
            p->aside_idx[i] = p->aside_idx[j];
            p->aside_val[i] = p->aside_val[j];
            i = j;
        }
    }
    p->aside_idx[i] = KVI_NONE;
    p->aside_n--;
}

/* ---- entries ---------------------------------------------------------------- */

/* (entry_alloc, child_link and entry_new are in engine/index_impl.h: do_store
 * inlines them.) */

/* Allocate entry chunk c, its pages faulted in (write_pages) and not zeroed:
 * entry_new and the store's fresh-tail loop write every entry whole before
 * it is published, and only entries below next_fresh are ever looked at.
 * Writer. */
void kvi_ix__chunk_alloc(struct kvi_part *p, uint32_t c)
{
    size_t bytes = (size_t)KVI_ENTRY_CHUNK * sizeof(struct kvi_entry);
    struct kvi_entry *chunk = aligned_alloc(KVI_CACHE_LINE, bytes);
    if (chunk == NULL)
        kvi_die("out of memory for an entry chunk");
    write_pages(chunk, bytes); /* entries are written whole before they are published */
    part_account(p, (int64_t)bytes);
    if (stab_on(p))
        seqcol_alloc(p, c);
    atomic_store_explicit(&p->chunks[c], chunk, memory_order_release);
    if (c + 1 > p->n_chunks)
        p->n_chunks = c + 1;
}

/* Unlink idx from parent's child list in O(1) (RCU list: a seq walk standing
 * on idx still follows idx's own next_sibling, which stays as it is until idx
 * is recycled after a grace period). Writer.
 * Finding the predecessor by walking a singly linked list cost a cache miss
 * per sibling. measured (kvidx-bench micro --replay, thread cpu ns per removed
 * block, 3 interleaved runs each): conversation trace 251.7 / 250.8 / 245.8
 * -> 105.8 / 104.2 / 105.0; synthetic trace 621.9 / 632.6 -> 91.3 / 100.4. */
static void child_unlink(struct kvi_part *p, uint32_t parent, uint32_t idx)
{
    struct kvi_entry *e = kvi__entry(p, idx);
    uint32_t next = atomic_load_explicit(&e->next_sibling, memory_order_relaxed), prev = e->prev_sibling;
    if (prev == KVI_NONE)
        atomic_store_explicit(&kvi__entry(p, parent)->first_child, next, memory_order_release);
    else
        atomic_store_explicit(&kvi__entry(p, prev)->next_sibling, next, memory_order_release);
    if (next != KVI_NONE)
        kvi__entry(p, next)->prev_sibling = prev;
}

/* Free an entry that has no members and no children, then its parent if that
 * became empty and childless too. */
static void entry_release(struct kvi_index *ix, struct kvi_part *p, uint32_t idx)
{
    while (idx != KVI_NONE) {
        struct kvi_entry *e = kvi__entry(p, idx);
        if (entry_live(e))
            return;
        uint32_t parent = entry_parent(e);
        if (parent != KVI_NONE)
            child_unlink(p, parent, idx);
        if (e->up & KVI_UP_ASIDE)
            kvi_ix__aside_del(p, idx);
        struct tab_ctx kc = {ix, p, TAB_KEY, 0}, sc = {ix, p, TAB_SEQ, 0};
        tab_delete_t(p, &kc, &p->ktab, key_tag(e->key), idx);
        if (stab_on(p))
            tab_delete_t(p, &sc, &p->stab, tab_tag(ix, *kvi__seqp(p, idx)), idx);
        struct kvi_mset *ms = entry_mset(e);
        if (ms != NULL) {
            /* Readers still probing e (found before the tombstones above)
             * that load `one` from now on see no member (W4); those that
             * loaded KVI_MANY_BIT before read the empty array, which mv keeps
             * naming (retired: freed after a grace period). `one` never
             * names a slot again while the array exists, so no reader can
             * credit a slot that was forgotten and recycled since (the TSan
             * report in writer_stress_test, with the old layout). */
            atomic_store_explicit(&e->one, KVI_NONE, memory_order_release); /* W4 */
            kvi_ix__retire(p, ms, mset_bytes(ms->cap));
        }
        if (p->n_pending == p->cap_pending) {
            p->cap_pending = p->cap_pending ? p->cap_pending * 2 : 256;
            p->pending_idx = kvi_xrealloc(p->pending_idx, p->cap_pending * sizeof(uint32_t));
        }
        p->pending_idx[p->n_pending++] = idx;
        kvi_relaxed_add(&p->entries, (uint64_t)-1);
        idx = parent;
    }
}

/* ---- slot maps (engine hash -> entry), writer only -------------------------- */

static void map_insert_t(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t tag,
                         uint32_t idx)
{
    struct tab_ctx c = {ix, p, TAB_MAP, s->id};
    kvi_ix__tab_insert_t(p, &c, &s->map, tag, idx);
}

static void map_delete_t(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t tag,
                         uint32_t idx)
{
    struct tab_ctx c = {ix, p, TAB_MAP, s->id};
    tab_delete_t(p, &c, &s->map, tag, idx);
}

static void stack_push(struct kvi_part *p, uint32_t *n, uint32_t v)
{
    if (*n == p->cap_stack) {
        p->cap_stack = p->cap_stack ? p->cap_stack * 2 : 1024;
        p->stack = kvi_xrealloc(p->stack, p->cap_stack * sizeof(uint32_t));
    }
    p->stack[(*n)++] = v;
}

/* Drop one holding of slot s without touching s's map (the caller does). */
void kvi_ix__holding_drop(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx)
{
    struct kvi_entry *e = kvi__entry(p, idx);
    member_del(ix, p, e, s->id, s->tier);
    atomic_store_explicit(&s->n_blocks, atomic_load_explicit(&s->n_blocks, memory_order_relaxed) - 1,
                          memory_order_relaxed);
    kvi_relaxed_add(&p->holdings, (uint64_t)-1);
    kvi_relaxed_add(&p->removed_blocks, 1);
    entry_release(ix, p, idx);
}

/* Remove slot s's holding of entry idx (named by an engine hash with map tag
 * `tag`) and every descendant s holds, children before parents so that
 * concurrent readers see nested sets. */
void kvi_ix__holding_remove_cascade_t(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx,
                                      uint32_t tag)
{
    uint32_t n = 0;
    if (atomic_load_explicit(&kvi__entry(p, idx)->first_child, memory_order_relaxed) != KVI_NONE) {
        stack_push(p, &n, idx);
        for (uint32_t k = 0; k < n; k++) {
            for (uint32_t c = atomic_load_explicit(&kvi__entry(p, p->stack[k])->first_child, memory_order_relaxed);
                 c != KVI_NONE; c = atomic_load_explicit(&kvi__entry(p, c)->next_sibling, memory_order_relaxed))
                if (has_member(kvi__entry(p, c), s->id) && !kvi_ix__member_is_root(kvi__entry(p, c), s->id))
                    stack_push(p, &n, c); /* a block placed by position is a root of its slot */
        }
        while (n > 1) {
            uint32_t e_idx = p->stack[--n];
            bool f;
            uint64_t eh = member_eh(kvi__entry(p, e_idx), s->id, &f);
            map_delete_t(ix, p, s, tab_tag(ix, eh), e_idx);
            kvi_ix__holding_drop(ix, p, s, e_idx);
        }
    }
    map_delete_t(ix, p, s, tag, idx);
    kvi_ix__holding_drop(ix, p, s, idx);
}

/* Slot s holds entry idx under old_eh: name it eh (map tag `tag`) instead. */
void kvi_ix__holding_rename(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx,
                            uint64_t old_eh, uint64_t eh, uint32_t tag)
{
    struct kvi_entry *e = kvi__entry(p, idx);
    map_delete_t(ix, p, s, tab_tag(ix, old_eh), idx);
    struct kvi_mset *ms = entry_mset(e);
    if (ms == NULL) {
        atomic_store_explicit(&e->mv, eh, memory_order_relaxed);
    } else {
        int32_t j = mset_find(ms, s->id);
        if (j >= 0)
            ms->m[j].eh = eh;
    }
    map_insert_t(ix, p, s, tag, idx);
}

/* Slot s starts holding entry idx under eh (map tag `tag`; root: placed
 * without a parent link in the slot). On the gpu tier the slot must hold the
 * parent already. */
void kvi_ix__holding_add(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx, uint64_t eh,
                         uint32_t tag, bool root)
{
    member_add(ix, p, kvi__entry(p, idx), s->id, s->tier, eh, root);
    map_insert_t(ix, p, s, tag, idx);
    atomic_store_explicit(&s->n_blocks, atomic_load_explicit(&s->n_blocks, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    kvi_relaxed_add(&p->holdings, 1);
    kvi_relaxed_add(&p->stored_blocks, 1);
}

/* ---- checking (tests) ------------------------------------------------------ */

/* Check one table (see kvi_index_check_tables): its slots' fingerprints,
 * homes, counts, and that each key finds its slot. *live_out: live slots. */
static int tab_check(const struct tab_ctx *c, const struct kvi_table *tb, const char *name, uint32_t *live_out,
                     char *why, size_t len)
{
    const struct kvi_tab *t = atomic_load_explicit(&((struct kvi_table *)tb)->t, memory_order_relaxed);
    *live_out = 0;
    if (t == NULL)
        return 0;
    uint32_t used = 0, live = 0;
    for (uint32_t j = 0; j <= t->mask; j++) {
        uint32_t s = atomic_load_explicit(&((struct kvi_tab *)t)->s[j], memory_order_relaxed);
        if (s == 0)
            continue;
        used++;
        uint32_t idx = s & KVI_TAB_IDX;
        if (idx == KVI_TOMB)
            continue;
        live++;
        bool ok;
        uint64_t key = tab_key_of(c, idx, &ok);
        uint32_t tag = kind_tag(c->ix, c->kind, key);
        if (!ok || idx >= c->p->next_fresh || !entry_live(kvi__entry(c->p, idx))) {
            snprintf(why, len, "%s slot %u names entry %u, not live or not held", name, j, idx);
            return -1;
        }
        if (!tab_slot_may_be(s, tag)) {
            snprintf(why, len, "%s slot %u (entry %u): fingerprint %u, key's %u", name, j, idx,
                     s >> KVI_ENTRY_IDX_BITS, tag & ((1u << (32 - KVI_ENTRY_IDX_BITS)) - 1));
            return -1;
        }
        for (uint32_t h = tab_home(t, tag); h != j; h = (h + 1) & t->mask)
            if (atomic_load_explicit(&((struct kvi_tab *)t)->s[h], memory_order_relaxed) == 0) {
                snprintf(why, len, "%s slot %u (entry %u): free slot %u between it and its home", name, j, idx, h);
                return -1;
            }
        uint32_t found = c->kind == TAB_MAP ? tab_find_t(c, tb, key, tag)
                                            : tab_find_at_t(c, tb, key, tag, kvi__entry(c->p, idx)->pos);
        if (found != idx) {
            snprintf(why, len, "%s slot %u: its key finds entry %u, not %u", name, j, found, idx);
            return -1;
        }
    }
    if (used != t->used || live != t->live) {
        snprintf(why, len, "%s counts used %u live %u, slots say %u and %u", name, t->used, t->live, used, live);
        return -1;
    }
    *live_out = live;
    return 0;
}

int kvi_index_check_tables(const struct kvi_index *ix, char *why, size_t len)
{
    uint32_t n_slots = atomic_load_explicit(&((struct kvi_index *)ix)->n_slot_ids, memory_order_relaxed);
    for (uint32_t pi = 0; pi < ix->n_parts; pi++) {
        const struct kvi_part *p = &ix->parts[pi];
        struct tab_ctx kc = {ix, p, TAB_KEY, 0}, sc = {ix, p, TAB_SEQ, 0};
        uint32_t live, entries = (uint32_t)atomic_load_explicit(&((struct kvi_part *)p)->entries, memory_order_relaxed);
        if (tab_check(&kc, &p->ktab, "key table", &live, why, len) != 0)
            return -1;
        if (live != entries) {
            snprintf(why, len, "partition %u: key table names %u entries of %u", pi, live, entries);
            return -1;
        }
        if (tab_check(&sc, &p->stab, "seq table", &live, why, len) != 0)
            return -1;
        if (stab_on(p) && live != entries) {
            snprintf(why, len, "partition %u: seq table names %u entries of %u", pi, live, entries);
            return -1;
        }
        for (uint32_t id = 1; id < n_slots; id++) {
            const struct kvi_slot *s = kvi__slot(ix, id);
            if (s == NULL || inst_get(ix, s->instance)->part != pi)
                continue;
            struct tab_ctx mc = {ix, p, TAB_MAP, id};
            if (tab_check(&mc, &s->map, "slot map", &live, why, len) != 0)
                return -1;
            uint32_t held = atomic_load_explicit(&((struct kvi_slot *)s)->n_blocks, memory_order_relaxed);
            if (live != held) {
                snprintf(why, len, "slot %u: map names %u entries, slot holds %u blocks", id, live, held);
                return -1;
            }
        }
    }
    return 0;
}
