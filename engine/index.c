/*
 * Positional index (see engine/index.h for the contract).
 *
 * DESIGN
 *   Threads: one writer per partition mutates that partition's tables,
 *   entries and slot maps; any number of reader threads query concurrently
 *   inside RCU read-side sections. Interning instances and allocating slot
 *   ids take a mutex (control plane, never on the query path).
 *
 *   Publication: an entry is fully initialised before its index is stored
 *   into a table slot with release (W1); readers load slots with acquire (R1).
 *   Member counts and member arrays are published with release after the
 *   members they describe (W2/R2). An entry's `one` says whether its members
 *   are one slot or a member array at `mv`; the array pointer is stored
 *   before `one` turns to KVI_MANY_BIT, and readers load `one` first (W2/R2).
 *   Releasing an entry sets `one` to KVI_NONE and retires the array, which
 *   `mv` keeps naming until the entry is recycled (W4, pairs with R2).
 *   Tables are replaced copy-on-write on resize
 *   (W3/R3); a partition's seq table appears the same way, built whole by
 *   the writer once anything asks for seq tables (ix->seq_wanted). Children
 *   are linked into their parent's child list after they are initialised
 *   (W5) and unlinked in place in O(1) through a writer-only back link (RCU
 *   list), for the seq walks of partitions without a seq table (R5).
 *   Entries, member arrays and old tables are recycled only after a grace
 *   period (kvi_index_reclaim).
 *
 *   Nesting: stores add members parent-first; removals and clears remove
 *   them child-first. Hence at every instant a gpu slot holding entry E also
 *   holds E's parent, and along any query chain the gpu member sets are
 *   nested. Queries compare counts only.
 */
#include "engine/index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "engine/hash.h"
#include "engine/index_internal.h"
#include "engine/rcu.h"

#define PHI 0x9e3779b97f4a7c15ull
#define RETIRE_BYTES_LIMIT (4u << 20) /* reclaim once 4 MiB or 64 k entries wait */
#define RETIRE_ENTRIES_LIMIT 65536u
#define PF_DIST 8 /* prefetch distance, blocks */

static int kvi__cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

const char *kvi_tier_name(enum kvi_tier t)
{
    switch (t) {
    case KVI_TIER_GPU: return "gpu";
    case KVI_TIER_CPU: return "cpu";
    case KVI_TIER_DISK: return "disk";
    case KVI_TIER_EXTERNAL: return "external";
    }
    return "unknown";
}

static inline uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static inline uint64_t key_step(const struct kvi_index *ix, uint64_t prev, uint64_t content, uint32_t pos)
{
    return prev + fmix64((content ^ ix->kxor) + (uint64_t)(pos + 1) * PHI);
}

void kvi_index_prefix_keys(const struct kvi_index *ix, const uint64_t *content, size_t n, uint64_t *keys)
{
    uint64_t k = ix->kseed;
    for (size_t i = 0; i < n; i++) {
        k = key_step(ix, k, content[i], (uint32_t)i);
        keys[i] = k;
    }
}

/* ---- memory accounting and retirement ------------------------------------ */

static void part_account(struct kvi_part *p, int64_t bytes)
{
    atomic_store_explicit(&p->bytes, atomic_load_explicit(&p->bytes, memory_order_relaxed) + (uint64_t)bytes,
                          memory_order_relaxed);
}


/* Does partition p keep a seq table? Writer (readers load stab.t with acquire). */
static inline bool stab_on(const struct kvi_part *p)
{
    return atomic_load_explicit(&((struct kvi_part *)p)->stab.t, memory_order_relaxed) != NULL;
}

static void stab_maybe_build(struct kvi_index *ix, struct kvi_part *p);

static void retire(struct kvi_part *p, void *ptr, size_t bytes)
{
    if (p->n_retired == p->cap_retired) {
        p->cap_retired = p->cap_retired ? p->cap_retired * 2 : 64;
        p->retired = kvi_xrealloc(p->retired, p->cap_retired * sizeof *p->retired);
    }
    p->retired[p->n_retired++] = (struct kvi_retired){ptr, bytes, 0};
    p->retired_bytes += bytes;
}

static void maybe_reclaim(struct kvi_index *ix, uint32_t part)
{
    struct kvi_part *p = &ix->parts[part];
    if (p->retired_bytes >= RETIRE_BYTES_LIMIT || p->n_pending >= RETIRE_ENTRIES_LIMIT)
        kvi_index_reclaim(ix, part);
}

/* Scratch sized for one huge op (a remove of millions of hashes, a clear
 * of a big slot) is given back when the writer goes idle, so that one such
 * op does not pin its memory for the partition's lifetime. Writer. */
#define SCRATCH_KEEP (64u << 10) /* elements kept across ops (512 KiB of u64) */
static void scratch_trim(struct kvi_part *p)
{
    if (p->cap_runbuf > SCRATCH_KEEP) {
        free(p->runbuf);
        p->runbuf = NULL;
        p->cap_runbuf = 0;
    }
    if (p->cap_sortbuf > SCRATCH_KEEP) {
        free(p->sortbuf);
        p->sortbuf = NULL;
        p->cap_sortbuf = 0;
    }
    if (p->cap_stack > 2 * SCRATCH_KEEP) {
        free(p->stack);
        p->stack = NULL;
        p->cap_stack = 0;
    }
    if (p->cap_dup > SCRATCH_KEEP) {
        free(p->dup_val);
        free(p->dup_mark);
        p->dup_val = NULL;
        p->dup_mark = NULL;
        p->cap_dup = 0;
        p->dup_gen = 0;
    }
}

void kvi_index_reclaim(struct kvi_index *ix, uint32_t part)
{
    struct kvi_part *p = &ix->parts[part];
    scratch_trim(p);
    stab_maybe_build(ix, p); /* writers reclaim when idle: a wanted seq table comes soon */
    if (p->n_retired == 0 && p->n_pending == 0 && p->n_pending_slots == 0)
        return;
    kvi_rcu_synchronize();
    for (uint32_t i = 0; i < p->n_retired; i++) {
        if (p->retired[i].unmap != 0)
            munmap(p->retired[i].p, p->retired[i].unmap);
        else
            free(p->retired[i].p);
        part_account(p, -(int64_t)p->retired[i].bytes);
    }
    p->n_retired = 0;
    p->retired_bytes = 0;
    if (p->n_free + p->n_pending > p->cap_free) {
        p->cap_free = KVI_MAX(p->cap_free * 2, p->n_free + p->n_pending);
        p->free_idx = kvi_xrealloc(p->free_idx, p->cap_free * sizeof(uint32_t));
    }
    if (p->n_pending > 0) {
        memcpy(p->free_idx + p->n_free, p->pending_idx, p->n_pending * sizeof(uint32_t));
        p->n_free += p->n_pending;
        p->n_pending = 0;
    }
    if (p->n_pending_slots > 0) {
        pthread_mutex_lock(&ix->slot_lock);
        uint32_t need = ix->n_free_slot_ids + p->n_pending_slots;
        if (need > ix->cap_free_slot_ids) {
            ix->cap_free_slot_ids = KVI_MAX(need, ix->cap_free_slot_ids * 2);
            ix->free_slot_ids = kvi_xrealloc(ix->free_slot_ids, ix->cap_free_slot_ids * sizeof(uint32_t));
        }
        memcpy(ix->free_slot_ids + ix->n_free_slot_ids, p->pending_slots, p->n_pending_slots * sizeof(uint32_t));
        ix->n_free_slot_ids = need;
        pthread_mutex_unlock(&ix->slot_lock);
        p->n_pending_slots = 0;
    }
}

/* ---- tables ---------------------------------------------------------------- */

/* Which key a table maps, to verify candidates. */
enum tab_kind { TAB_KEY, TAB_SEQ, TAB_MAP };

/* Table tag of a hash that others choose (engine hashes, standard seq
 * hashes): mixed with the index's secret table seed. */
static inline uint32_t tab_tag(const struct kvi_index *ix, uint64_t key)
{
    return (uint32_t)(fmix64(key ^ ix->tseed) >> 32);
}

/* Table tag of a prefix key: its top half. K is already a mix under the
 * index's secrets (key_step sums fmix64 outputs; stand-in keys are fmix64 of
 * a secret xor), so mixing it again adds nothing.
 * measured (kvidx-bench micro --replay, callgrind, stores and removes):
 * 1,263.5 M -> 1,248.9 M instructions; queries save one fmix64 per probe. */
static inline uint32_t key_tag(uint64_t key)
{
    return (uint32_t)(key >> 32);
}

static inline uint32_t kind_tag(const struct kvi_index *ix, enum tab_kind kind, uint64_t key)
{
    return kind == TAB_KEY ? key_tag(key) : tab_tag(ix, key);
}

/* A key's home slot is the top bits of its 32-bit tag: a rehash places every
 * slot from its tag alone, without touching the entry the slot points to. */
static inline uint32_t tab_home(const struct kvi_tab *t, uint32_t tag)
{
    return (uint32_t)(((uint64_t)tag << 32) >> t->shift) & t->mask;
}

#define TAB_MAX_LOAD_NUM 3 /* grow past 3/4 used (live + tombstones) */
#define TAB_MAX_LOAD_DEN 4

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
 * times fewer pages, and fresh mappings need no zeroing beyond the kernel's.
 * measured (kvidx-bench micro, thread cpu ns per block, 3 interleaved runs
 * each, shared 2-cpu VM), huge pages with malloc + memset: store 193.1 /
 * 193.2 / 196.2 -> 169.7 / 172.7 / 213.5, remove 130.5 / 134.9 / 138.1 ->
 * 123.1 / 125.3 / 126.3.
 */
static struct kvi_tab *tab_new(uint32_t cap)
{
    size_t bytes = sizeof(struct kvi_tab) + (size_t)cap * sizeof(uint64_t);
    struct kvi_tab *t;
    if (bytes >= HUGE_PAGE) {
        size_t len = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        t = huge_map(len);
        t->mapped = len;
    } else {
        t = kvi_xcalloc(1, bytes);
    }
    t->mask = cap - 1;
    t->shift = 64 - (uint32_t)__builtin_ctz(cap);
    t->grow_at = cap / TAB_MAX_LOAD_DEN * TAB_MAX_LOAD_NUM; /* cap >= 16: exact */
    return t;
}

static void tab_free_mem(struct kvi_tab *t)
{
    if (t != NULL && t->mapped != 0)
        munmap(t, t->mapped);
    else
        free(t);
}

static size_t tab_bytes(const struct kvi_tab *t)
{
    return sizeof *t + ((size_t)t->mask + 1) * sizeof(uint64_t);
}


struct tab_ctx {
    const struct kvi_index *ix;
    const struct kvi_part *p;
    enum tab_kind kind;
    uint32_t slot; /* TAB_MAP */
};

static uint64_t member_eh(const struct kvi_entry *e, uint32_t slot, bool *found);

static inline uint64_t tab_key_of(const struct tab_ctx *c, uint32_t idx, bool *ok)
{
    const struct kvi_entry *e = kvi__entry(c->p, idx);
    *ok = true;
    switch (c->kind) {
    case TAB_KEY: return e->key;
    case TAB_SEQ: return e->seq;
    case TAB_MAP: return member_eh(e, c->slot, ok);
    }
    return 0;
}

/* Reader lookup (also used by the writer) of key, whose tag is `tag`.
 * Returns the entry index or NONE. */
static inline uint32_t tab_find_t(const struct tab_ctx *c, const struct kvi_table *tb, uint64_t key, uint32_t tag)
{
    const struct kvi_tab *t = atomic_load_explicit(&((struct kvi_table *)tb)->t, memory_order_acquire); /* R3 */
    if (t == NULL)
        return KVI_NONE;
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint64_t s = atomic_load_explicit(&((struct kvi_tab *)t)->s[i], memory_order_acquire); /* R1 */
        if (s == 0)
            return KVI_NONE;
        uint32_t idx = (uint32_t)s;
        if ((uint32_t)(s >> 32) == tag && idx != KVI_TOMB) {
            bool ok;
            if (tab_key_of(c, idx, &ok) == key && ok)
                return idx;
        }
    }
}

static inline uint32_t tab_find(const struct tab_ctx *c, const struct kvi_table *tb, uint64_t key)
{
    return tab_find_t(c, tb, key, kind_tag(c->ix, c->kind, key));
}

/* The entry of the first slot whose tag matches key's (unverified: for
 * prefetching the entry a lookup is about to verify), or KVI_NONE. Writer. */
static inline uint32_t tab_peek_t(const struct kvi_table *tb, uint32_t tag)
{
    const struct kvi_tab *t = atomic_load_explicit(&((struct kvi_table *)tb)->t, memory_order_relaxed);
    if (t == NULL)
        return KVI_NONE;
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint64_t s = atomic_load_explicit(&((struct kvi_tab *)t)->s[i], memory_order_relaxed);
        if (s == 0)
            return KVI_NONE;
        if ((uint32_t)(s >> 32) == tag && (uint32_t)s != KVI_TOMB)
            return (uint32_t)s;
    }
}

static inline void tab_prefetch_t(const struct kvi_table *tb, uint32_t tag)
{
    const struct kvi_tab *t = atomic_load_explicit(&((struct kvi_table *)tb)->t, memory_order_relaxed);
    if (t != NULL)
        __builtin_prefetch(&t->s[tab_home(t, tag)]);
}

static void tab_insert_raw(struct kvi_tab *t, uint32_t tag, uint32_t idx)
{
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint64_t s = atomic_load_explicit(&t->s[i], memory_order_relaxed);
        if (s == 0 || (uint32_t)s == KVI_TOMB) {
            if (s == 0)
                t->used++;
            t->live++;
            atomic_store_explicit(&t->s[i], ((uint64_t)tag << 32) | idx, memory_order_release); /* W1 */
            return;
        }
    }
}

/* Rebuild with capacity `cap`, publish, retire the old array (query tables)
 * or free it at once (slot maps, never read by queries). */
static void tab_rehash_ex(struct kvi_part *p, struct kvi_table *tb, uint32_t cap, bool readers, bool touch)
{
    struct kvi_tab *old = atomic_load_explicit(&tb->t, memory_order_relaxed);
    struct kvi_tab *nt = tab_new(cap);
    part_account(p, (int64_t)tab_bytes(nt));
    if (touch) /* fault every page in now (kvi_index_reserve) */
        memset((void *)nt->s, 0, (size_t)cap * sizeof(uint64_t));
    if (old != NULL) {
        for (uint32_t i = 0; i <= old->mask; i++) {
            uint64_t s = atomic_load_explicit(&old->s[i], memory_order_relaxed);
            if (s != 0 && (uint32_t)s != KVI_TOMB)
                tab_insert_raw(nt, (uint32_t)(s >> 32), (uint32_t)s);
        }
    }
    atomic_store_explicit(&tb->t, nt, memory_order_release); /* W3 */
    if (old != NULL) {
        if (readers) {
            retire(p, old, tab_bytes(old));
            p->retired[p->n_retired - 1].unmap = old->mapped;
        } else {
            part_account(p, -(int64_t)tab_bytes(old));
            tab_free_mem(old);
        }
    }
}

static void tab_rehash(struct kvi_part *p, struct kvi_table *tb, uint32_t cap, bool readers)
{
    tab_rehash_ex(p, tb, cap, readers, false);
}

/* Insert entry idx under a key whose tag is `tag` (W1). Writer. */
static void tab_insert_t(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint32_t tag, uint32_t idx)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t == NULL) {
        tab_rehash(p, tb, 16, c->kind != TAB_MAP);
        t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    } else if (t->used >= t->grow_at) { /* (used + 1) / cap > 3/4 */
        uint32_t cap = t->mask + 1;
        if ((uint64_t)(t->live + 1) * 2 > cap)
            cap *= 2; /* else: same size, purge tombstones */
        tab_rehash(p, tb, cap, c->kind != TAB_MAP);
        t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    }
    tab_insert_raw(t, tag, idx);
}

/* Writer-only tables (slot maps): delete by shifting the rest of the probe run
 * back, so they never hold tombstones and never need a purge. Not safe for
 * tables that queries read (a reader could miss a key while it moves). */
static void tab_delete_shift(struct kvi_part *p, struct kvi_table *tb, uint32_t at)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    uint32_t i = at, j = at;
    for (;;) {
        j = (j + 1) & t->mask;
        uint64_t v = atomic_load_explicit(&t->s[j], memory_order_relaxed);
        if (v == 0)
            break;
        uint32_t h = tab_home(t, (uint32_t)(v >> 32));
        /* v may move back to i only if its home is not in (i, j] cyclically */
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            atomic_store_explicit(&t->s[i], v, memory_order_relaxed);
            i = j;
        }
    }
    atomic_store_explicit(&t->s[i], 0, memory_order_relaxed);
    t->used--;
    t->live--;
    uint32_t cap = t->mask + 1;
    if (cap > 64 && (uint64_t)t->live * 8 < cap)
        tab_rehash(p, tb, cap / 4 > 16 ? cap / 4 : 16, false);
}

/* Tombstone the slot holding (a key with tag `tag`, idx); slot maps shift
 * instead. Shrinks when mostly empty. Writer. */
static void tab_delete_t(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint32_t tag, uint32_t idx)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t == NULL)
        return;
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint64_t s = atomic_load_explicit(&t->s[i], memory_order_relaxed);
        if (s == 0)
            return;
        if ((uint32_t)s == idx) {
            if (c->kind == TAB_MAP) {
                tab_delete_shift(p, tb, i);
                return;
            }
            atomic_store_explicit(&t->s[i], (s & 0xffffffff00000000ull) | KVI_TOMB, memory_order_release);
            t->live--;
            break;
        }
    }
    uint32_t cap = t->mask + 1;
    if (cap > 64 && (uint64_t)t->live * 8 < cap)
        tab_rehash(p, tb, cap / 4 > 16 ? cap / 4 : 16, c->kind != TAB_MAP);
}

static void tab_free_now(struct kvi_part *p, struct kvi_table *tb)
{
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t != NULL) {
        part_account(p, -(int64_t)tab_bytes(t));
        tab_free_mem(t);
        atomic_store_explicit(&tb->t, NULL, memory_order_relaxed);
    }
}

/* ---- seq tables, built on demand ------------------------------------------------ */

static bool entry_empty(const struct kvi_entry *e);

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
static void stab_build(const struct kvi_index *ix, struct kvi_part *p)
{
    uint64_t live = atomic_load_explicit(&p->entries, memory_order_relaxed);
    uint32_t cap = 16;
    while ((uint64_t)cap * TAB_MAX_LOAD_NUM <= (live + 1) * TAB_MAX_LOAD_DEN)
        cap *= 2;
    struct kvi_tab *t = tab_new(cap);
    part_account(p, (int64_t)tab_bytes(t));
    /* every live entry has members or children; freed ones have neither */
    for (uint32_t idx = 1; idx < p->next_fresh; idx++) {
        const struct kvi_entry *e = kvi__entry(p, idx);
        if (!entry_empty(e) || atomic_load_explicit(&((struct kvi_entry *)e)->first_child, memory_order_relaxed) != KVI_NONE)
            tab_insert_raw(t, tab_tag(ix, e->seq), idx);
    }
    atomic_store_explicit(&p->stab.t, t, memory_order_release); /* W3 */
}

/* Build p's seq table if seq tables were asked for since. Writer. */
static void stab_maybe_build(struct kvi_index *ix, struct kvi_part *p)
{
    if (KVI_UNLIKELY(!stab_on(p) && atomic_load_explicit(&ix->seq_wanted, memory_order_relaxed)))
        stab_build(ix, p);
}

/* Seq tables are needed from now on (this partition's at once). Writer. */
static void stab_need(struct kvi_index *ix, struct kvi_part *p)
{
    if (!atomic_load_explicit(&ix->seq_wanted, memory_order_relaxed))
        atomic_store_explicit(&ix->seq_wanted, true, memory_order_relaxed);
    if (!stab_on(p))
        stab_build(ix, p);
}

/* ---- members ---------------------------------------------------------------- */

/* The member array of e, or NULL while e has at most one member. Writer. */
static inline struct kvi_mset *entry_mset(const struct kvi_entry *e)
{
    if (atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed) != KVI_MANY_BIT)
        return NULL;
    return kvi__mset(e, memory_order_relaxed);
}

/* The member array of e for a reader, or NULL with *one = the single member
 * slot (KVI_NONE if none). Reader (acquire: R2). */
static inline struct kvi_mset *entry_members(const struct kvi_entry *e, uint32_t *one)
{
    uint32_t o = atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_acquire); /* R2 */
    *one = o & KVI_SLOT_MASK;
    return o == KVI_MANY_BIT ? kvi__mset(e, memory_order_acquire) : NULL;
}

/* Position of slot's member in ms, or -1. Writer. */
static inline int32_t mset_find(const struct kvi_mset *ms, uint32_t slot)
{
    uint32_t n = atomic_load_explicit(&((struct kvi_mset *)ms)->n, memory_order_relaxed);
    for (uint32_t i = 0; i < n; i++)
        if (kvi__member_slot(atomic_load_explicit(&((struct kvi_mset *)ms)->m[i].w, memory_order_relaxed)) == slot)
            return (int32_t)i;
    return -1;
}

static uint64_t member_eh(const struct kvi_entry *e, uint32_t slot, bool *found)
{
    uint32_t one = atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed);
    if (one != KVI_MANY_BIT) {
        *found = (one & KVI_SLOT_MASK) == slot && slot != KVI_NONE;
        return atomic_load_explicit(&((struct kvi_entry *)e)->mv, memory_order_relaxed);
    }
    struct kvi_mset *ms = kvi__mset(e, memory_order_relaxed);
    int32_t k = mset_find(ms, slot);
    *found = k >= 0;
    return k >= 0 ? ms->m[k].eh : 0;
}

static bool has_member(const struct kvi_entry *e, uint32_t slot)
{
    bool f;
    (void)member_eh(e, slot, &f);
    return f;
}

static size_t mset_bytes(uint32_t cap)
{
    return sizeof(struct kvi_mset) + (size_t)cap * sizeof(struct kvi_member);
}

/* Was the slot's holding of e stored without a parent link (a positional
 * root at position > 0)? Writer only. */
static bool member_is_root(const struct kvi_entry *e, uint32_t slot)
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
    nm->_pad = 0;
    uint32_t j = 0;
    if (ms == NULL) {
        uint32_t one = atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed);
        uint32_t os = one & KVI_SLOT_MASK;
        uint8_t tier = (uint8_t)(kvi__slot(ix, os)->tier | ((one & KVI_ROOT_BIT) ? KVI_MEMBER_ROOT : 0));
        atomic_store_explicit(&nm->m[0].w, kvi__member_w(os, tier), memory_order_relaxed);
        nm->m[0].eh = atomic_load_explicit(&((struct kvi_entry *)e)->mv, memory_order_relaxed);
        j = 1;
    } else {
        uint32_t n = atomic_load_explicit(&((struct kvi_mset *)ms)->n, memory_order_relaxed);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t w = atomic_load_explicit(&((struct kvi_mset *)ms)->m[i].w, memory_order_relaxed);
            if (w == 0)
                continue;
            atomic_store_explicit(&nm->m[j].w, w, memory_order_relaxed);
            nm->m[j++].eh = ms->m[i].eh;
        }
    }
    nm->live = j;
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
        atomic_store_explicit(&e->mv, (uint64_t)(uintptr_t)nm, memory_order_release); /* W2 */
        if (ms != NULL)
            retire(p, ms, mset_bytes(ms->cap));
        else /* from now on the members are in mv; a reader that loaded the
              * single slot before keeps that (consistent) snapshot */
            atomic_store_explicit(&e->one, KVI_MANY_BIT, memory_order_release); /* W2 */
    }
    if (tier == KVI_TIER_GPU)
        atomic_store_explicit(&e->gpu_n, atomic_load_explicit(&e->gpu_n, memory_order_relaxed) + 1,
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
    if (tier == KVI_TIER_GPU) /* count first: readers never see more gpu members than exist */
        atomic_store_explicit(&e->gpu_n, atomic_load_explicit(&e->gpu_n, memory_order_relaxed) - 1,
                              memory_order_release);
    struct kvi_mset *ms = entry_mset(e);
    if (ms == NULL) {
        atomic_store_explicit(&e->one, KVI_NONE, memory_order_release);
        atomic_store_explicit(&e->mv, 0, memory_order_relaxed);
        return;
    }
    int32_t k = mset_find(ms, slot);
    if (k < 0)
        return;
    atomic_store_explicit(&ms->m[k].w, 0, memory_order_release); /* W2 */
    ms->m[k].eh = 0;
    ms->live--;
    /* an empty array stays (the entry is released next, or refilled) */
    if (ms->live > 0 && ms->live <= ms->cap / 4 && ms->cap > 4) {
        struct kvi_mset *nm = mset_copy(ix, p, e, ms, ms->cap / 2);
        atomic_store_explicit(&e->mv, (uint64_t)(uintptr_t)nm, memory_order_release); /* W2 */
        retire(p, ms, mset_bytes(ms->cap));
    }
}

static bool entry_empty(const struct kvi_entry *e)
{
    struct kvi_mset *ms = entry_mset(e);
    if (ms != NULL)
        return ms->live == 0;
    return atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed) == KVI_NONE;
}

/* ---- entries ---------------------------------------------------------------- */

static inline uint32_t entry_parent(const struct kvi_entry *e)
{
    return e->up & KVI_UP_PARENT;
}

static inline bool entry_no_content(const struct kvi_entry *e)
{
    return (e->up & KVI_UP_NO_CONTENT) != 0;
}

/* Allocate entry chunk c. Not zeroed unless `touch` (kvi_index_reserve: fault
 * its pages in now): entry_new initialises every entry before it is
 * published, and only entries below next_fresh are ever looked at. Writer. */
static void chunk_alloc(struct kvi_part *p, uint32_t c, bool touch)
{
    size_t bytes = (size_t)KVI_ENTRY_CHUNK * sizeof(struct kvi_entry);
    struct kvi_entry *chunk = aligned_alloc(KVI_CACHE_LINE, bytes);
    if (chunk == NULL)
        kvi_die("out of memory for an entry chunk");
    if (touch)
        memset(chunk, 0, bytes);
    part_account(p, (int64_t)bytes);
    atomic_store_explicit(&p->chunks[c], chunk, memory_order_release);
    if (c + 1 > p->n_chunks)
        p->n_chunks = c + 1;
}

static uint32_t entry_alloc(struct kvi_part *p)
{
    if (p->n_free > 0)
        return p->free_idx[--p->n_free];
    if (p->next_fresh == 0)
        p->next_fresh = 1; /* index 0 is KVI_NONE */
    uint32_t idx = p->next_fresh;
    uint32_t c = idx >> KVI_ENTRY_CHUNK_SHIFT;
    if (c >= KVI_ENTRY_CHUNKS_MAX)
        kvi_die("partition entry space exhausted (%u chunks)", c);
    if (KVI_UNLIKELY(atomic_load_explicit(&p->chunks[c], memory_order_relaxed) == NULL))
        chunk_alloc(p, c, false);
    p->next_fresh++;
    return idx;
}

/* Link initialised entry idx first in parent's child list (W5: a seq walk
 * that reaches idx sees it whole). Writer. */
static inline void child_link(struct kvi_part *p, uint32_t parent, uint32_t idx)
{
    struct kvi_entry *pe = kvi__entry(p, parent), *e = kvi__entry(p, idx);
    uint32_t head = atomic_load_explicit(&pe->first_child, memory_order_relaxed);
    atomic_store_explicit(&e->next_sibling, head, memory_order_relaxed);
    e->prev_sibling = KVI_NONE;
    if (head != KVI_NONE)
        kvi__entry(p, head)->prev_sibling = idx;
    atomic_store_explicit(&pe->first_child, idx, memory_order_release); /* W5: pairs with R5 (seq_walk) */
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

/* A new entry for prefix key `key` (table tag ktag) and seq hash `seq`
 * (table tag stag, used when the partition keeps a seq table), published in
 * the query tables. Writer. */
static uint32_t entry_new(struct kvi_index *ix, struct kvi_part *p, uint64_t key, uint32_t ktag, uint64_t seq,
                          uint32_t stag, uint64_t content, bool no_content, uint32_t pos, uint32_t parent)
{
    uint32_t idx = entry_alloc(p);
    struct kvi_entry *e = kvi__entry(p, idx);
    e->key = key;
    e->pos = pos;
    atomic_store_explicit(&e->gpu_n, 0, memory_order_relaxed);
    atomic_store_explicit(&e->one, KVI_NONE, memory_order_relaxed);
    atomic_store_explicit(&e->mv, 0, memory_order_relaxed);
    e->up = parent | (no_content ? KVI_UP_NO_CONTENT : 0);
    e->seq = seq;
    e->content = content;
    atomic_store_explicit(&e->first_child, KVI_NONE, memory_order_relaxed);
    atomic_store_explicit(&e->next_sibling, KVI_NONE, memory_order_relaxed);
    e->prev_sibling = KVI_NONE;
    e->ktag = ktag;
    if (parent != KVI_NONE)
        child_link(p, parent, idx);
    struct tab_ctx kc = {ix, p, TAB_KEY, 0}, sc = {ix, p, TAB_SEQ, 0};
    tab_insert_t(p, &kc, &p->ktab, ktag, idx); /* W1 */
    if (stab_on(p))
        tab_insert_t(p, &sc, &p->stab, stag, idx);
    kvi_relaxed_add(&p->entries, 1);
    return idx;
}

/* Free an entry that has no members and no children, then its parent if that
 * became empty and childless too. */
static void entry_release(struct kvi_index *ix, struct kvi_part *p, uint32_t idx)
{
    while (idx != KVI_NONE) {
        struct kvi_entry *e = kvi__entry(p, idx);
        if (!entry_empty(e) || atomic_load_explicit(&e->first_child, memory_order_relaxed) != KVI_NONE)
            return;
        uint32_t parent = entry_parent(e);
        if (parent != KVI_NONE)
            child_unlink(p, parent, idx);
        struct tab_ctx kc = {ix, p, TAB_KEY, 0}, sc = {ix, p, TAB_SEQ, 0};
        tab_delete_t(p, &kc, &p->ktab, e->ktag, idx);
        if (stab_on(p))
            tab_delete_t(p, &sc, &p->stab, tab_tag(ix, e->seq), idx);
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
            retire(p, ms, mset_bytes(ms->cap));
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

/* ---- instances and slots ---------------------------------------------------- */

static uint64_t inst_hash(uint64_t id, const char *name)
{
    if (name == NULL)
        return fmix64(id ^ 0x5bd1e9955bd1e995ull) | 1;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        h = (h ^ *s) * 0x100000001b3ull;
    return fmix64(h) & ~1ull; /* string and numeric spaces never meet */
}

static struct kvi_instance *inst_get(const struct kvi_index *ix, uint32_t id)
{
    struct kvi_instance *c = atomic_load_explicit(&((struct kvi_index *)ix)->inst_chunks[id >> KVI_INST_CHUNK_SHIFT],
                                                  memory_order_acquire);
    return &c[id & (KVI_INST_CHUNK - 1)];
}

static bool inst_matches(const struct kvi_instance *in, uint64_t id, const char *name)
{
    if (name == NULL)
        return in->name == NULL && in->id == id;
    return in->name != NULL && strcmp(in->name, name) == 0;
}

/* Under inst_lock. Returns dense id or -1. */
static int64_t inst_lookup_locked(struct kvi_index *ix, uint64_t id, const char *name, uint32_t *slot_out)
{
    uint64_t h = inst_hash(id, name);
    uint32_t i = (uint32_t)h & ix->inst_map_mask;
    for (;; i = (i + 1) & ix->inst_map_mask) {
        uint64_t v = ix->inst_map[i];
        if (v == 0) {
            if (slot_out)
                *slot_out = i;
            return -1;
        }
        uint32_t dense = (uint32_t)v - 1;
        if ((v >> 32) == (h >> 32) && inst_matches(inst_get(ix, dense), id, name))
            return dense;
    }
}

int64_t kvi_index_find_instance(struct kvi_index *ix, uint64_t id, const char *name)
{
    pthread_mutex_lock(&ix->inst_lock);
    int64_t r = inst_lookup_locked(ix, id, name, NULL);
    pthread_mutex_unlock(&ix->inst_lock);
    return r < 0 ? -ENOENT : r;
}

int64_t kvi_index_intern_instance(struct kvi_index *ix, uint64_t id, const char *name, bool shared)
{
    pthread_mutex_lock(&ix->inst_lock);
    uint32_t at;
    int64_t r = inst_lookup_locked(ix, id, name, &at);
    if (r >= 0) {
        pthread_mutex_unlock(&ix->inst_lock);
        return r;
    }
    uint32_t dense = atomic_load_explicit(&ix->n_instances, memory_order_relaxed);
    uint32_t c = dense >> KVI_INST_CHUNK_SHIFT;
    if (c >= KVI_INST_CHUNKS_MAX) {
        pthread_mutex_unlock(&ix->inst_lock);
        return -ENOMEM;
    }
    if (atomic_load_explicit(&ix->inst_chunks[c], memory_order_relaxed) == NULL)
        atomic_store_explicit(&ix->inst_chunks[c], kvi_xcalloc(KVI_INST_CHUNK, sizeof(struct kvi_instance)),
                              memory_order_release);
    struct kvi_instance *in = inst_get(ix, dense);
    in->id = name ? 0 : id;
    in->name = name ? strdup(name) : NULL;
    if (name != NULL && in->name == NULL)
        kvi_die("out of memory");
    in->shared = shared;
    in->part = dense % ix->n_parts;
    atomic_store_explicit(&in->slots, NULL, memory_order_relaxed);
    uint64_t h = inst_hash(id, name);
    ix->inst_map[at] = (h & 0xffffffff00000000ull) | (dense + 1);
    atomic_store_explicit(&ix->n_instances, dense + 1, memory_order_release);
    /* keep the map at most half full */
    if ((uint64_t)(dense + 1) * 2 > ix->inst_map_mask) {
        uint32_t ncap = (ix->inst_map_mask + 1) * 2;
        uint64_t *nm = kvi_xcalloc(ncap, sizeof(uint64_t));
        for (uint32_t i = 0; i <= ix->inst_map_mask; i++) {
            uint64_t v = ix->inst_map[i];
            if (v == 0)
                continue;
            uint32_t j = (uint32_t)(v >> 32) & (ncap - 1);
            /* position by the tag's low bits of the hash: recompute from the instance */
            struct kvi_instance *x = inst_get(ix, (uint32_t)v - 1);
            j = (uint32_t)inst_hash(x->id, x->name) & (ncap - 1);
            while (nm[j] != 0)
                j = (j + 1) & (ncap - 1);
            nm[j] = v;
        }
        free(ix->inst_map);
        ix->inst_map = nm;
        ix->inst_map_mask = ncap - 1;
    }
    pthread_mutex_unlock(&ix->inst_lock);
    return dense;
}

int kvi_index_instance_info(struct kvi_index *ix, uint32_t instance, uint64_t *id, const char **name, bool *shared)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire))
        return -ENOENT;
    struct kvi_instance *in = inst_get(ix, instance);
    if (id)
        *id = in->id;
    if (name)
        *name = in->name;
    if (shared)
        *shared = in->shared;
    return 0;
}

uint32_t kvi_index_partition_of(const struct kvi_index *ix, uint32_t instance)
{
    return instance % ix->n_parts;
}

/* Writer of the instance's partition: find the slot (instance, rank, tier). */
static uint32_t slot_find(const struct kvi_index *ix, uint32_t instance, uint32_t rank, uint8_t tier)
{
    struct kvi_slotlist *sl = atomic_load_explicit(&inst_get(ix, instance)->slots, memory_order_acquire);
    if (sl == NULL)
        return KVI_NONE;
    for (uint32_t i = 0; i < sl->n; i++) {
        struct kvi_slot *s = kvi__slot(ix, sl->id[i]);
        if (s->dp_rank == rank && s->tier == tier)
            return s->id;
    }
    return KVI_NONE;
}

static uint32_t slot_create(struct kvi_index *ix, uint32_t instance, uint32_t rank, uint8_t tier)
{
    struct kvi_instance *in = inst_get(ix, instance);
    pthread_mutex_lock(&ix->slot_lock);
    uint32_t id;
    if (ix->n_free_slot_ids > 0) {
        id = ix->free_slot_ids[--ix->n_free_slot_ids];
    } else {
        id = atomic_load_explicit(&ix->n_slot_ids, memory_order_relaxed);
        uint32_t c = id >> KVI_SLOT_CHUNK_SHIFT;
        if (c >= KVI_SLOT_CHUNKS_MAX)
            kvi_die("slot space exhausted");
        if (atomic_load_explicit(&ix->slot_chunks[c], memory_order_relaxed) == NULL)
            atomic_store_explicit(&ix->slot_chunks[c], kvi_xcalloc(KVI_SLOT_CHUNK, sizeof(struct kvi_slot)),
                                  memory_order_release);
        atomic_store_explicit(&ix->n_slot_ids, id + 1, memory_order_release);
    }
    /* initialise under the lock: a recycled id may have been used by
     * another writer, and the lock orders its accesses before ours */
    struct kvi_slot *s = kvi__slot(ix, id);
    s->id = id;
    s->instance = instance;
    s->dp_rank = rank;
    s->tier = tier;
    s->shared = in->shared;
    atomic_store_explicit(&s->n_blocks, 0, memory_order_relaxed);
    atomic_store_explicit(&s->map.t, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->live, true, memory_order_release);
    pthread_mutex_unlock(&ix->slot_lock);
    if (tier != KVI_TIER_GPU)
        atomic_store_explicit(&ix->has_lower_tiers, true, memory_order_release);
    if (in->shared)
        atomic_store_explicit(&ix->has_shared, true, memory_order_release);

    struct kvi_part *p = &ix->parts[in->part];
    struct kvi_slotlist *old = atomic_load_explicit(&in->slots, memory_order_relaxed);
    uint32_t n = old ? old->n : 0;
    struct kvi_slotlist *nl = kvi_xmalloc(sizeof *nl + (n + 1) * sizeof(uint32_t));
    part_account(p, (int64_t)(sizeof *nl + (n + 1) * sizeof(uint32_t)));
    nl->n = n + 1;
    if (n)
        memcpy(nl->id, old->id, n * sizeof(uint32_t));
    nl->id[n] = id;
    atomic_store_explicit(&in->slots, nl, memory_order_release);
    if (old)
        retire(p, old, sizeof *old + n * sizeof(uint32_t));
    return id;
}

/* ---- creation ---------------------------------------------------------------- */

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = kvi_now_ns() ^ (uint64_t)(uintptr_t)&v;
    return v;
}

struct kvi_index *kvi_index_create(const struct kvi_index_config *cfg)
{
    if (cfg == NULL || cfg->block_size == 0 || cfg->n_parts == 0 || cfg->n_parts > 1024) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_index *ix = calloc(1, sizeof *ix);
    if (ix == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    ix->block_size = cfg->block_size;
    ix->n_parts = cfg->n_parts;
    atomic_store(&ix->jump, cfg->jump ? cfg->jump : KVI_DEFAULT_JUMP);
    uint64_t seed = cfg->key_seed ? cfg->key_seed : random_u64();
    ix->kseed = fmix64(seed ^ 0x243f6a8885a308d3ull);
    ix->kxor = fmix64(seed + 0x13198a2e03707344ull);
    ix->tseed = fmix64(seed ^ 0xa4093822299f31d0ull);
    pthread_mutex_init(&ix->inst_lock, NULL);
    pthread_mutex_init(&ix->slot_lock, NULL);
    atomic_store(&ix->n_slot_ids, 1); /* slot id 0 is KVI_NONE */
    ix->inst_map_mask = 63;
    ix->inst_map = kvi_xcalloc(64, sizeof(uint64_t));
    ix->parts = aligned_alloc(KVI_CACHE_LINE, sizeof(struct kvi_part) * cfg->n_parts);
    if (ix->parts == NULL) {
        free(ix->inst_map);
        free(ix);
        errno = ENOMEM;
        return NULL;
    }
    memset(ix->parts, 0, sizeof(struct kvi_part) * cfg->n_parts);
    return ix;
}

void kvi_index_destroy(struct kvi_index *ix)
{
    if (ix == NULL)
        return;
    for (uint32_t i = 0; i < ix->n_parts; i++) {
        struct kvi_part *p = &ix->parts[i];
        for (uint32_t c = 0; c < p->n_chunks; c++) {
            struct kvi_entry *chunk = atomic_load_explicit(&p->chunks[c], memory_order_relaxed);
            if (chunk == NULL)
                continue;
            for (uint32_t j = 0; j < KVI_ENTRY_CHUNK && (c << KVI_ENTRY_CHUNK_SHIFT) + j < p->next_fresh; j++) {
                if ((c << KVI_ENTRY_CHUNK_SHIFT) + j == KVI_NONE)
                    continue; /* index 0 is never an entry */
                free(entry_mset(&chunk[j])); /* released entries' arrays are in the retired list */
            }
            free(chunk);
        }
        tab_free_mem(atomic_load_explicit(&p->ktab.t, memory_order_relaxed));
        tab_free_mem(atomic_load_explicit(&p->stab.t, memory_order_relaxed));
        for (uint32_t r = 0; r < p->n_retired; r++) {
            if (p->retired[r].unmap != 0)
                munmap(p->retired[r].p, p->retired[r].unmap);
            else
                free(p->retired[r].p);
        }
        free(p->retired);
        free(p->free_idx);
        free(p->pending_idx);
        free(p->stack);
        free(p->sortbuf);
        free(p->pending_slots);
        free(p->runbuf);
        free(p->dup_val);
        free(p->dup_mark);
    }
    uint32_t ns = atomic_load(&ix->n_slot_ids);
    for (uint32_t c = 0; c <= (ns >> KVI_SLOT_CHUNK_SHIFT); c++) {
        struct kvi_slot *chunk = atomic_load_explicit(&ix->slot_chunks[c], memory_order_relaxed);
        if (chunk == NULL)
            continue;
        for (uint32_t j = 0; j < KVI_SLOT_CHUNK; j++)
            tab_free_mem(atomic_load_explicit(&chunk[j].map.t, memory_order_relaxed));
        free(chunk);
    }
    uint32_t ni = atomic_load(&ix->n_instances);
    for (uint32_t i = 0; i < ni; i++) {
        struct kvi_instance *in = inst_get(ix, i);
        free(in->name);
        free(atomic_load_explicit(&in->slots, memory_order_relaxed));
    }
    for (uint32_t c = 0; c < KVI_INST_CHUNKS_MAX; c++)
        free(atomic_load_explicit(&ix->inst_chunks[c], memory_order_relaxed));
    free(ix->inst_map);
    free(ix->free_slot_ids);
    pthread_mutex_destroy(&ix->inst_lock);
    pthread_mutex_destroy(&ix->slot_lock);
    free(ix->parts);
    free(ix);
}

uint32_t kvi_index_block_size(const struct kvi_index *ix) { return ix->block_size; }
uint32_t kvi_index_n_parts(const struct kvi_index *ix) { return ix->n_parts; }
void kvi_index_set_jump(struct kvi_index *ix, uint32_t jump) { atomic_store(&ix->jump, jump); }

/* ---- slot maps (engine hash -> entry), writer only --------------------------- */

/* The map functions take the engine hash's table tag (tab_tag), computed
 * once per hash by callers that use it more than once. */
static inline uint32_t map_find_t(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint64_t eh,
                                  uint32_t tag)
{
    struct tab_ctx c = {ix, p, TAB_MAP, s->id};
    return tab_find_t(&c, &s->map, eh, tag);
}

static uint32_t map_find(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint64_t eh)
{
    return map_find_t(ix, p, s, eh, tab_tag(ix, eh));
}

static void map_insert_t(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t tag,
                         uint32_t idx)
{
    struct tab_ctx c = {ix, p, TAB_MAP, s->id};
    tab_insert_t(p, &c, &s->map, tag, idx);
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
static void holding_drop(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx)
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
static void holding_remove_cascade_t(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx,
                                     uint32_t tag)
{
    uint32_t n = 0;
    if (atomic_load_explicit(&kvi__entry(p, idx)->first_child, memory_order_relaxed) != KVI_NONE) {
        stack_push(p, &n, idx);
        for (uint32_t k = 0; k < n; k++) {
            for (uint32_t c = atomic_load_explicit(&kvi__entry(p, p->stack[k])->first_child, memory_order_relaxed);
                 c != KVI_NONE; c = atomic_load_explicit(&kvi__entry(p, c)->next_sibling, memory_order_relaxed))
                if (has_member(kvi__entry(p, c), s->id) && !member_is_root(kvi__entry(p, c), s->id))
                    stack_push(p, &n, c); /* a block placed by position is a root of its slot */
        }
        while (n > 1) {
            uint32_t e_idx = p->stack[--n];
            bool f;
            uint64_t eh = member_eh(kvi__entry(p, e_idx), s->id, &f);
            map_delete_t(ix, p, s, tab_tag(ix, eh), e_idx);
            holding_drop(ix, p, s, e_idx);
        }
    }
    map_delete_t(ix, p, s, tag, idx);
    holding_drop(ix, p, s, idx);
}

static void holding_remove_cascade(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx)
{
    bool f;
    uint64_t eh = member_eh(kvi__entry(p, idx), s->id, &f);
    holding_remove_cascade_t(ix, p, s, idx, tab_tag(ix, eh));
}

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
    return fmix64(seq ^ ix->kxor) ^ 0x8000000000000001ull;
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

/* Does the run repeat an engine hash, or contain its parent? O(n) with a
 * scratch open-addressing set keyed by the hashes' map tags (mt[i] is block
 * i's), whose positions are marked with a per-call generation instead of being
 * cleared. */
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
    while (cap < m * 2)
        cap *= 2;
    if (cap > p->cap_dup) {
        free(p->dup_val);
        free(p->dup_mark);
        p->cap_dup = cap;
        p->dup_val = kvi_xmalloc(cap * sizeof(uint64_t));
        p->dup_mark = kvi_xcalloc(cap, sizeof(uint32_t));
        p->dup_gen = 0;
    }
    if (++p->dup_gen == 0) {
        memset(p->dup_mark, 0, p->cap_dup * sizeof(uint32_t));
        p->dup_gen = 1;
    }
    uint32_t gen = p->dup_gen;
    for (size_t i = 0; i < m; i++) {
        uint64_t v = i < n ? run_eh(r, i) : parent_eh;
        uint32_t h = i < n ? mt[i] : (uint32_t)fmix64(v);
        for (size_t j = h & (cap - 1);; j = (j + 1) & (cap - 1)) {
            if (p->dup_mark[j] != gen) {
                p->dup_mark[j] = gen;
                p->dup_val[j] = v;
                break;
            }
            if (p->dup_val[j] == v)
                return true;
        }
    }
    return false;
}

/* Slot s holds entry idx under old_eh: name it eh (map tag `tag`) instead. */
static void holding_rename(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx,
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
static void holding_add(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx, uint64_t eh,
                        uint32_t tag, bool root)
{
    member_add(ix, p, kvi__entry(p, idx), s->id, s->tier, eh, root);
    map_insert_t(ix, p, s, tag, idx);
    atomic_store_explicit(&s->n_blocks, atomic_load_explicit(&s->n_blocks, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    kvi_relaxed_add(&p->holdings, 1);
    kvi_relaxed_add(&p->stored_blocks, 1);
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
    uint32_t sid = slot_find(ix, instance, rank, (uint8_t)tier);
    struct kvi_slot *s = sid ? kvi__slot(ix, sid) : NULL;

    uint32_t prev = KVI_NONE, pos0 = 0;
    uint64_t k = ix->kseed, sq = 0;
    bool seq_only = false;
    if (has_parent) {
        if (s != NULL)
            prev = map_find(ix, p, s, parent_eh);
        if (prev == KVI_NONE && tier != KVI_TIER_GPU) {
            struct kvi_slotlist *sl = atomic_load_explicit(&in->slots, memory_order_relaxed);
            for (uint32_t i = 0; sl != NULL && i < sl->n && prev == KVI_NONE; i++) {
                struct kvi_slot *o = kvi__slot(ix, sl->id[i]);
                if (o != s && o->dp_rank == rank)
                    prev = map_find(ix, p, o, parent_eh);
            }
        }
        if (prev == KVI_NONE) {
            kvi_relaxed_add(&p->parent_not_found, 1);
            return -ENOENT;
        }
        struct kvi_entry *pe = kvi__entry(p, prev);
        pos0 = pe->pos + 1;
        k = pe->key;
        sq = pe->seq;
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
        sid = slot_create(ix, instance, rank, (uint8_t)tier);
        s = kvi__slot(ix, sid);
    }
    bool parent_in_slot = prev != KVI_NONE && has_member(kvi__entry(p, prev), sid);

    /* keys, seq hashes and tags of the whole run first, then a prefetch
     * pipeline PF_DIST blocks ahead over the three tables the loop touches */
    for (size_t i = 0; i < n; i++) {
        uint32_t pos = pos0 + (uint32_t)i;
        if (seq != NULL)
            sq = seq[i];
        else
            sq = pos == 0 ? r->b[i].content_hash : kvi_seq_hash_next(sq, r->b[i].content_hash);
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
        if (prev != KVI_NONE && have[i] != KVI_NONE && kvi__entry(p, have[i])->seq != rs[i]) {
            uint32_t hv = have[i];
            /* would the cascade from `have` reach the run's parent? it follows
             * links between blocks this slot holds (not positional roots) */
            uint32_t x = prev;
            while (x != KVI_NONE && x != hv && has_member(kvi__entry(p, x), sid) &&
                   !member_is_root(kvi__entry(p, x), sid))
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
    /* prev was created by this store: without a seq table (so no prefix
     * placed by seq alone), its children can only be the ones this store
     * adds, and the key lookup of the next block would miss */
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

        uint32_t hv = have[i];
        if (hv != KVI_NONE && stale) {
            bool f;
            if (member_eh(kvi__entry(p, hv), sid, &f) != eh || !f)
                hv = KVI_NONE;
        }
        if (hv != KVI_NONE) {
            struct kvi_entry *he = kvi__entry(p, hv);
            if (he->seq == sq && he->pos == pos) {
                prev = hv; /* idempotent re-store */
                parent_in_slot = true;
                prev_new = false;
                continue;
            }
            /* the engine renamed a different block: drop the old one */
            holding_remove_cascade_t(ix, p, s, hv, mt[i]);
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
        struct tab_ctx fc = {ix, p, son ? TAB_SEQ : TAB_KEY, 0};
        uint32_t idx = son ? tab_find_t(&fc, &p->stab, sq, st[i])
                       : prev_new ? KVI_NONE
                                  : tab_find_t(&fc, &p->ktab, k, kt[i]);
        if (idx != KVI_NONE && kvi__entry(p, idx)->pos != pos)
            idx = KVI_NONE; /* 2^-64 collision across depths: keep them apart */
        if (idx == KVI_NONE) {
            idx = entry_new(ix, p, k, kt[i], sq, son ? st[i] : 0, content, !known, pos, prev);
            if ((seq_only && i == 0) || !known) /* a stand-in key */
                atomic_store_explicit(&ix->has_seq_only, true, memory_order_release);
            /* a new entry has no member yet */
            holding_add(ix, p, s, idx, eh, mt[i], seq_only && i == 0);
            prev = idx;
            parent_in_slot = true;
            prev_new = true;
            continue;
        } else {
            struct kvi_entry *fe = kvi__entry(p, idx);
            if (entry_parent(fe) == KVI_NONE && prev != KVI_NONE) {
                /* placed by seq alone before: now its parent is known */
                fe->up |= prev;
                child_link(p, prev, idx); /* W5 */
            }
            if (entry_no_content(fe) && known) { /* placed without tokens before */
                fe->content = content;
                fe->up &= ~KVI_UP_NO_CONTENT;
            }
            prev_new = false;
            k = fe->key; /* continue the chain from the entry's own key */
            if (k != rk[i])
                for (size_t j = i + 1; j < n; j++) { /* re-derive the rest of the run's keys */
                    rk[j] = k = run_key(ix, r, k, j, pos0 + (uint32_t)j, rs[j]);
                    kt[j] = key_tag(k);
                }
        }
        struct kvi_entry *e = kvi__entry(p, idx);
        bool f;
        uint64_t old_eh = member_eh(e, sid, &f);
        if (f) { /* the slot holds this prefix under another engine hash: rename */
            holding_rename(ix, p, s, idx, old_eh, eh, mt[i]);
            stale = true;
        } else
            holding_add(ix, p, s, idx, eh, mt[i], seq_only && i == 0);
        prev = idx;
        parent_in_slot = true;
    }
    maybe_reclaim(ix, in->part);
    return 0;
}

/* ---- reservations ------------------------------------------------------------ */

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

/* Resize tb (a query table when `readers`) to hold `live` keys, pages touched. */
static void tab_reserve(struct kvi_part *p, struct kvi_table *tb, uint64_t live, bool readers)
{
    uint64_t cap = tab_cap_for(live);
    struct kvi_tab *t = atomic_load_explicit(&tb->t, memory_order_relaxed);
    if (t == NULL || cap > (uint64_t)t->mask + 1)
        tab_rehash_ex(p, tb, (uint32_t)cap, readers, true);
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
    if (part >= ix->n_parts || entries >= (1ull << KVI_ENTRY_IDX_BITS) - 1 ||
        tab_cap_for(entries) > (1ull << 31))
        return -EINVAL;
    struct kvi_part *p = &ix->parts[part];
    stab_maybe_build(ix, p);
    tab_reserve(p, &p->ktab, entries, true);
    if (stab_on(p))
        tab_reserve(p, &p->stab, entries, true);
    /* entry chunks through index `entries` (index 0 is never an entry) */
    uint32_t last = (uint32_t)((entries + KVI_ENTRY_CHUNK) >> KVI_ENTRY_CHUNK_SHIFT); /* chunks needed */
    for (uint32_t c = 0; c < last; c++)
        if (atomic_load_explicit(&p->chunks[c], memory_order_relaxed) == NULL)
            chunk_alloc(p, c, true);
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
    uint32_t sid = slot_find(ix, instance, dp_rank, (uint8_t)tier);
    if (sid == KVI_NONE)
        sid = slot_create(ix, instance, dp_rank, (uint8_t)tier);
    tab_reserve(p, &kvi__slot(ix, sid)->map, blocks, false);
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
    return do_store(ix, instance, dp_rank, tier, has_parent, parent_engine_hash, has_parent ? 0 : position, &r);
}

int kvi_index_store_seq_only(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                             bool has_parent, uint64_t parent_engine_hash, uint32_t position,
                             const uint64_t *engine_hashes, const uint64_t *seq, size_t n)
{
    if (n > 0 && (engine_hashes == NULL || seq == NULL))
        return -EINVAL;
    struct run r = {.eh = engine_hashes, .seq = seq, .n = n};
    return do_store(ix, instance, dp_rank, tier, has_parent, parent_engine_hash, has_parent ? 0 : position, &r);
}

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
            s = kvi__slot(ix, slot_create(ix, instance, dp_rank, (uint8_t)tier));
            by_tier[tier] = s;
        }
        bool f;
        uint64_t old_eh = member_eh(e, s->id, &f);
        if (f)
            holding_rename(ix, p, s, idx, old_eh, eh, tab_tag(ix, eh));
        else
            holding_add(ix, p, s, idx, eh, tab_tag(ix, eh), root);
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
    uint32_t sid = slot_find(ix, instance, dp_rank, (uint8_t)tier);
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
                tab_prefetch_t(&p->ktab, ae->ktag);
                if (son)
                    tab_prefetch_t(&p->stab, tab_tag(ix, ae->seq));
                if (entry_parent(ae) != KVI_NONE)
                    __builtin_prefetch(kvi__entry(p, entry_parent(ae)));
            }
        }
        uint32_t idx = map_find_t(ix, p, s, engine_hashes[i], mt[i]);
        if (idx == KVI_NONE)
            continue;
        known++;
        holding_remove_cascade_t(ix, p, s, idx, mt[i]);
    }
    if (known < n)
        kvi_relaxed_add(&p->unknown_removes, n - known);
    maybe_reclaim(ix, in->part);
    return known;
}

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
        uint64_t v = atomic_load_explicit(&t->s[i], memory_order_relaxed);
        uint32_t idx = (uint32_t)v;
        if (v == 0 || idx == KVI_TOMB)
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
        holding_drop(ix, p, s, (uint32_t)p->sortbuf[i]);
    tab_free_now(p, &s->map);
}

static void slot_forget(struct kvi_index *ix, struct kvi_part *p, struct kvi_instance *in, uint32_t sid)
{
    struct kvi_slot *s = kvi__slot(ix, sid);
    atomic_store_explicit(&s->live, false, memory_order_release);
    struct kvi_slotlist *old = atomic_load_explicit(&in->slots, memory_order_relaxed);
    uint32_t n = old->n;
    struct kvi_slotlist *nl = kvi_xmalloc(sizeof *nl + n * sizeof(uint32_t));
    part_account(p, (int64_t)(sizeof *nl + n * sizeof(uint32_t)));
    nl->n = 0;
    for (uint32_t i = 0; i < n; i++)
        if (old->id[i] != sid)
            nl->id[nl->n++] = old->id[i];
    atomic_store_explicit(&in->slots, nl, memory_order_release);
    retire(p, old, sizeof *old + n * sizeof(uint32_t));
    if (p->n_pending_slots == p->cap_pending_slots) {
        p->cap_pending_slots = p->cap_pending_slots ? p->cap_pending_slots * 2 : 16;
        p->pending_slots = kvi_xrealloc(p->pending_slots, p->cap_pending_slots * sizeof(uint32_t));
    }
    p->pending_slots[p->n_pending_slots++] = sid;
}

/* Clear (and optionally forget) the slots of an instance matching rank
 * (UINT32_MAX = every rank). */
static void instance_drop(struct kvi_index *ix, uint32_t instance, uint32_t rank, bool forget)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire))
        return;
    struct kvi_instance *in = inst_get(ix, instance);
    struct kvi_part *p = &ix->parts[in->part];
    stab_maybe_build(ix, p);
    struct kvi_slotlist *sl = atomic_load_explicit(&in->slots, memory_order_relaxed);
    if (sl == NULL)
        return;
    /* lower tiers first: their entries may hang below gpu entries */
    for (int tier = KVI_TIER_COUNT - 1; tier >= 0; tier--) {
        sl = atomic_load_explicit(&in->slots, memory_order_relaxed);
        for (uint32_t i = 0; i < sl->n; i++) {
            struct kvi_slot *s = kvi__slot(ix, sl->id[i]);
            if (s->tier != tier || (rank != UINT32_MAX && s->dp_rank != rank))
                continue;
            slot_clear(ix, p, s);
            if (forget) {
                slot_forget(ix, p, in, s->id);
                sl = atomic_load_explicit(&in->slots, memory_order_relaxed);
                i = (uint32_t)-1; /* restart: the list changed */
            }
        }
    }
    maybe_reclaim(ix, in->part);
}

void kvi_index_clear(struct kvi_index *ix, uint32_t instance)
{
    instance_drop(ix, instance, UINT32_MAX, false);
}

void kvi_index_remove_dp_rank(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank)
{
    instance_drop(ix, instance, dp_rank, true);
}

void kvi_index_remove_instance(struct kvi_index *ix, uint32_t instance)
{
    instance_drop(ix, instance, UINT32_MAX, true);
}

/* ---- dump -------------------------------------------------------------------- */

static int cmp_asc_u64(const void *a, const void *b)
{
    return kvi__cmp_u64(a, b);
}

void kvi_index_dump_partition(struct kvi_index *ix, uint32_t part, kvi_dump_fn emit, void *ctx)
{
    struct kvi_part *p = &ix->parts[part];
    uint32_t ni = atomic_load_explicit(&ix->n_instances, memory_order_acquire);
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
                    .content_hash = e->content,
                    .no_content = entry_no_content(e),
                    .seq_hash = e->seq,
                };
                if (entry_parent(e) != KVI_NONE && !member_is_root(e, s->id)) {
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
}

/* ---- queries ----------------------------------------------------------------- */

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

/* The query's entry at position t in partition p, or NULL. Reader. */
static inline const struct kvi_entry *entry_at(const struct kvi_index *ix, const struct kvi_part *p,
                                               enum tab_kind kind, uint64_t key, uint32_t t)
{
    struct tab_ctx c = {ix, p, kind, 0};
    uint32_t idx = tab_find(&c, kind == TAB_KEY ? &p->ktab : &p->stab, key);
    if (idx == KVI_NONE)
        return NULL;
    const struct kvi_entry *e = kvi__entry(p, idx);
    return e->pos == t ? e : NULL;
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
    const struct kvi_entry *e = entry_at(ix, p, TAB_KEY, k0, 0);
    if (e == NULL || e->seq != seq[0])
        return 0;
    keys[0] = k0;
    for (size_t t = 1; t < n; t++) {
        uint32_t c = atomic_load_explicit(&((struct kvi_entry *)e)->first_child, memory_order_acquire); /* R5 */
        const struct kvi_entry *next = NULL;
        while (c != KVI_NONE) {
            const struct kvi_entry *x = kvi__entry(p, c);
            if (x->seq == seq[t]) {
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

struct finder {
    const struct kvi_index *ix;
    const struct kvi_part *p;
    enum tab_kind kind;
    const uint64_t *keys;
    struct qscratch *q;
    uint32_t n_slots;
};

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

static inline const struct kvi_entry *probe(const struct finder *f, uint32_t t, uint32_t *cnt)
{
    const struct kvi_entry *e = entry_at(f->ix, f->p, f->kind, f->keys[t], t);
    *cnt = e ? atomic_load_explicit(&((struct kvi_entry *)e)->gpu_n, memory_order_acquire) : 0; /* R2 */
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

/* Slow path after concurrent writes: extend each gpu member of e0 from its
 * assigned depth while it still holds the next position. */
static void verify_members(const struct finder *f, const struct kvi_entry *e0, uint32_t n)
{
    struct qscratch *q = f->q;
    uint32_t one, m = 1;
    struct kvi_mset *ms = entry_members(e0, &one);
    if (ms != NULL)
        m = atomic_load_explicit(&ms->n, memory_order_acquire);
    for (uint32_t i = 0; i < m; i++) {
        uint32_t s = ms ? kvi__member_slot(atomic_load_explicit(&ms->m[i].w, memory_order_acquire)) : one;
        if (s == KVI_NONE || s >= f->n_slots || kvi__slot(f->ix, s)->tier != KVI_TIER_GPU)
            continue;
        uint32_t d = q->gen[s] == q->cur_gen ? q->depth[s] : 0;
        while (d < n) {
            uint32_t cnt;
            const struct kvi_entry *e = probe(f, d, &cnt);
            if (e == NULL || member_tier(f->ix, e, s) != KVI_TIER_GPU)
                break;
            d++;
        }
        if (d > 0) {
            q->depth[s] = d;
            q->gen[s] = q->cur_gen;
        }
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
        if (s == KVI_NONE || s >= f->n_slots || q->gen[s] != q->cur_gen)
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
    if (content == NULL)
        return qk;
    uint64_t *k = qs_keys(q, n);
    if (atomic_load_explicit(&((struct kvi_index *)ix)->has_seq_only, memory_order_acquire)) {
        kvi_seq_hashes(content, n, k);
    } else {
        kvi_index_prefix_keys(ix, content, n, k);
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

int kvi_index_slot_info(const struct kvi_index *ix, uint32_t slot, struct kvi_slot_info *info)
{
    if (slot == KVI_NONE || slot >= atomic_load_explicit(&((struct kvi_index *)ix)->n_slot_ids, memory_order_acquire))
        return -ENOENT;
    const struct kvi_slot *s = kvi__slot(ix, slot);
    if (s == NULL || !atomic_load_explicit(&((struct kvi_slot *)s)->live, memory_order_acquire))
        return -ENOENT;
    info->instance = s->instance;
    info->dp_rank = s->dp_rank;
    info->tier = (enum kvi_tier)s->tier;
    info->shared = s->shared;
    return 0;
}

uint32_t kvi_index_tree_size(const struct kvi_index *ix, uint32_t instance, uint32_t dp_rank)
{
    if (instance >= atomic_load_explicit(&((struct kvi_index *)ix)->n_instances, memory_order_acquire))
        return 0;
    kvi_rcu_read_lock();
    uint32_t sid = slot_find(ix, instance, dp_rank, KVI_TIER_GPU);
    uint32_t n = sid ? atomic_load_explicit(&kvi__slot(ix, sid)->n_blocks, memory_order_relaxed) : 0;
    kvi_rcu_read_unlock();
    return n;
}

void kvi_index_stats(const struct kvi_index *ix, struct kvi_index_stats *st)
{
    memset(st, 0, sizeof *st);
    for (uint32_t i = 0; i < ix->n_parts; i++) {
        const struct kvi_part *p = &ix->parts[i];
#define SUM(f) st->f += atomic_load_explicit(&((struct kvi_part *)p)->f, memory_order_relaxed)
        SUM(entries);
        SUM(holdings);
        SUM(bytes);
        SUM(stored_blocks);
        SUM(removed_blocks);
        SUM(parent_not_found);
        SUM(unknown_removes);
        SUM(unknown_blocks);
        SUM(invalid_events);
#undef SUM
    }
    uint32_t n_ids = atomic_load_explicit(&((struct kvi_index *)ix)->n_slot_ids, memory_order_acquire);
    for (uint32_t id = 1; id < n_ids; id++) {
        const struct kvi_slot *s = kvi__slot(ix, id);
        if (s != NULL && atomic_load_explicit(&((struct kvi_slot *)s)->live, memory_order_acquire))
            st->slots++;
    }
}
