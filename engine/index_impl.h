/*
 * What the positional index's files (engine/index.c, index_table.c,
 * index_write.c, index_query.c) share, beyond the layout in
 * engine/index_internal.h: hashing, table lookups, member reads and entry
 * creation as static inline functions (the store and query loops inline
 * them, as they did when the index was one file), and prototypes of the
 * kvi_ix__ functions one file defines for the others. Included by those
 * files only.
 */
#ifndef KVI_ENGINE_INDEX_IMPL_H
#define KVI_ENGINE_INDEX_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/hash.h"
#include "engine/index_internal.h"

#define PHI 0x9e3779b97f4a7c15ull
#define RETIRE_BYTES_LIMIT (4u << 20) /* reclaim once 4 MiB or 64 k entries wait */
#define RETIRE_ENTRIES_LIMIT 65536u

/* ---- hashing ---------------------------------------------------------------- */


/* The term K[pos] - K[pos-1] (engine/index.h, WHAT IT STORES) of content
 * hash `content` at the position whose Weyl value is w = (pos + 1) * phi,
 * under the index's secrets sx (kxor) and sm (kmul): fmix64 of the content
 * under one secret plus the position under the other. A bijection in the
 * content for each position, so that entries need not keep their content
 * hash (key_unterm gives it back from the key and the parent's key): 8
 * bytes per entry. Callers that walk positions in order keep w as a running
 * sum (kvi_index_prefix_keys).
 * measured (1,024-key chains, one thread, best of 2,000): 1.25-1.28 ns per
 * key, against 0.82 ns for the folded 64x64 -> 128-bit product of the two
 * (not a bijection) used before; bijections with one multiply
 * ((c ^ sx) * odd(w), then xor-shift, with or without a second constant
 * multiply) gave thousands of equal keys among the 4.1 M chains of
 * test_prefix_keys_structured_contents. */
static inline uint64_t key_term(uint64_t content, uint64_t sx, uint64_t w, uint64_t sm)
{
    return kvi_fmix64((content ^ sx) + (w ^ sm));
}

/* The content hash whose term at Weyl value w is `term`: key_term's inverse. */
static inline uint64_t key_unterm(uint64_t term, uint64_t sx, uint64_t w, uint64_t sm)
{
    return (kvi_fmix64_inv(term) - (w ^ sm)) ^ sx;
}

/* The content hash of the prefix whose key is `key` at depth pos, below a
 * prefix whose key is prev (K[-1] = kseed at a root). Valid for entries with
 * real keys (not KVI_UP_NO_CONTENT nor KVI_UP_ASIDE). */
static inline uint64_t content_of_key(const struct kvi_index *ix, uint64_t key, uint64_t prev, uint32_t pos)
{
    return key_unterm(key - prev, ix->kxor, (uint64_t)(pos + 1) * PHI, ix->kmul);
}

/* K[pos] from K[pos-1] = prev. */
static inline uint64_t key_step(const struct kvi_index *ix, uint64_t prev, uint64_t content, uint32_t pos)
{
    return prev + key_term(content, ix->kxor, (uint64_t)(pos + 1) * PHI, ix->kmul);
}

/*
 * keys[from..to) of the prefix-key chain of content[] (engine/index_keys.c):
 * K[i] = K[i-1] + key_term(content[i], kxor, w_i, kmul), resuming from
 * *kp = K[from-1] (kseed at from = 0) and *wp = w_{from-1} (0 at from = 0),
 * both advanced past `to` on return. kvi_ix__keys_run uses AVX-512 where the
 * CPU has it (kvi_ix__keys_simd), the same keys bit for bit as
 * kvi_ix__keys_run_scalar. Pure: any thread.
 */
void kvi_ix__keys_run(const struct kvi_index *ix, const uint64_t *content, size_t from, size_t to, uint64_t *keys,
                      uint64_t *kp, uint64_t *wp);
void kvi_ix__keys_run_scalar(const struct kvi_index *ix, const uint64_t *content, size_t from, size_t to,
                             uint64_t *keys, uint64_t *kp, uint64_t *wp);
/* Whether kvi_ix__keys_run takes the AVX-512 path on this CPU. */
bool kvi_ix__keys_simd(void);

/* ---- memory accounting and retirement (engine/index.c) ---------------------- */

static inline void part_account(struct kvi_part *p, int64_t bytes)
{
    atomic_store_explicit(&p->bytes, atomic_load_explicit(&p->bytes, memory_order_relaxed) + (uint64_t)bytes,
                          memory_order_relaxed);
}

/* Retire ptr (bytes counted in the partition): freed after a grace period,
 * at the next kvi_index_reclaim. Writer. */
void kvi_ix__retire(struct kvi_part *p, void *ptr, size_t bytes);

static inline void maybe_reclaim(struct kvi_index *ix, uint32_t part)
{
    struct kvi_part *p = &ix->parts[part];
    if (p->retired_bytes >= RETIRE_BYTES_LIMIT || p->n_pending >= RETIRE_ENTRIES_LIMIT)
        kvi_index_reclaim(ix, part);
}

/* ---- instances and slots (engine/index.c) ----------------------------------- */

static inline struct kvi_instance *inst_get(const struct kvi_index *ix, uint32_t id)
{
    struct kvi_instance *c = atomic_load_explicit(&((struct kvi_index *)ix)->inst_chunks[id >> KVI_INST_CHUNK_SHIFT],
                                                  memory_order_acquire);
    return &c[id & (KVI_INST_CHUNK - 1)];
}

/* Writer of the instance's partition: the slot (instance, rank, tier), or KVI_NONE. */
uint32_t kvi_ix__slot_find(const struct kvi_index *ix, uint32_t instance, uint32_t rank, uint8_t tier);
/* A new slot (instance, rank, tier), published in the instance's slot list. Writer. */
uint32_t kvi_ix__slot_create(struct kvi_index *ix, uint32_t instance, uint32_t rank, uint8_t tier);

/* ---- tables (engine/index_table.c) ------------------------------------------ */

/* Which key a table maps, to verify candidates. */
enum tab_kind { TAB_KEY, TAB_SEQ, TAB_MAP };

/* Table tag of a hash that others choose (engine hashes, standard seq
 * hashes): mixed with the index's secret table seed. */
static inline uint32_t tab_tag(const struct kvi_index *ix, uint64_t key)
{
    return (uint32_t)(kvi_fmix64(key ^ ix->tseed) >> 32);
}

/* Table tag of a prefix key: its top half. K is already a mix under the
 * index's secrets (key_step sums fmix64 terms; stand-in keys are fmix64 of
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

/* A key's home slot is the top bits of its 32-bit tag (a slot keeps only the
 * tag's low bits: a rehash reads each key again to place its slot). */
static inline uint32_t tab_home_of(uint32_t shift, uint32_t mask, uint32_t tag)
{
    return (uint32_t)(((uint64_t)tag << 32) >> shift) & mask;
}

static inline uint32_t tab_home(const struct kvi_tab *t, uint32_t tag)
{
    return tab_home_of(t->shift, t->mask, tag);
}

#define TAB_MAX_LOAD_NUM 3 /* grow past 3/4 used (live + tombstones) */
#define TAB_MAX_LOAD_DEN 4

struct tab_ctx {
    const struct kvi_index *ix;
    const struct kvi_part *p;
    enum tab_kind kind;
    uint32_t slot; /* TAB_MAP */
};

/* The reserved floor of the table c names (struct kvi_table). Writer. */
static inline uint32_t *tab_floor(const struct tab_ctx *c)
{
    struct kvi_part *p = (struct kvi_part *)c->p;
    return c->kind == TAB_MAP ? &kvi__slot(c->ix, c->slot)->map_floor
           : c->kind == TAB_KEY ? &p->ktab_floor
                                : &p->stab_floor;
}

static uint64_t member_eh(const struct kvi_entry *e, uint32_t slot, bool *found);

static inline uint64_t tab_key_of(const struct tab_ctx *c, uint32_t idx, bool *ok)
{
    const struct kvi_entry *e = kvi__entry(c->p, idx);
    *ok = true;
    switch (c->kind) {
    case TAB_KEY: return e->key;
    case TAB_SEQ: return *kvi__seqp(c->p, idx);
    case TAB_MAP: return member_eh(e, c->slot, ok);
    }
    return 0;
}

/* The slot naming entry idx under a key whose table tag is `tag`: the tag's
 * low bits (the home slot comes from its top bits) over the index. */
static inline uint32_t tab_slot(uint32_t tag, uint32_t idx)
{
    return tag << KVI_ENTRY_IDX_BITS | idx;
}

/* Does slot s name an entry (not free, not a tombstone) under a key whose
 * tag may be `tag`? */
static inline bool tab_slot_may_be(uint32_t s, uint32_t tag)
{
    return ((s ^ (tag << KVI_ENTRY_IDX_BITS)) >> KVI_ENTRY_IDX_BITS) == 0 && (s & KVI_TAB_IDX) != KVI_TOMB;
}

/* Any depth, for tab_find_at_t: the slot maps' entries sit at any position. */
#define TAB_ANY_POS UINT32_MAX

/* Reader lookup (also used by the writer) of key, whose tag is `tag`, at
 * position pos (TAB_ANY_POS: any): the entry index or NONE. The prefix-key
 * and seq tables are looked up at a depth: prefixes of different depths may
 * share a key (2^-64 for prefix keys; for seq hashes whenever a publisher
 * sends one at two depths: they are the publisher's), and each is then
 * found at its own. */
static inline uint32_t tab_find_at_t(const struct tab_ctx *c, const struct kvi_table *tb, uint64_t key, uint32_t tag,
                                     uint32_t pos)
{
    const struct kvi_tab *t = atomic_load_explicit(&((struct kvi_table *)tb)->t, memory_order_acquire); /* R3 */
    if (t == NULL)
        return KVI_NONE;
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint32_t s = atomic_load_explicit(&((struct kvi_tab *)t)->s[i], memory_order_acquire); /* R1 */
        if (s == 0)
            return KVI_NONE;
        if (tab_slot_may_be(s, tag)) {
            bool ok;
            uint32_t idx = s & KVI_TAB_IDX;
            if (tab_key_of(c, idx, &ok) == key && ok && (pos == TAB_ANY_POS || kvi__entry(c->p, idx)->pos == pos))
                return idx;
        }
    }
}

static inline uint32_t tab_find_t(const struct tab_ctx *c, const struct kvi_table *tb, uint64_t key, uint32_t tag)
{
    return tab_find_at_t(c, tb, key, tag, TAB_ANY_POS);
}

static inline uint32_t tab_find(const struct tab_ctx *c, const struct kvi_table *tb, uint64_t key)
{
    return tab_find_t(c, tb, key, kind_tag(c->ix, c->kind, key));
}

/* The entry of the first slot whose fingerprint matches key's tag
 * (unverified: for prefetching the entry a lookup is about to verify), or
 * KVI_NONE. Writer. */
static inline uint32_t tab_peek_t(const struct kvi_table *tb, uint32_t tag)
{
    const struct kvi_tab *t = atomic_load_explicit(&((struct kvi_table *)tb)->t, memory_order_relaxed);
    if (t == NULL)
        return KVI_NONE;
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint32_t s = atomic_load_explicit(&((struct kvi_tab *)t)->s[i], memory_order_relaxed);
        if (s == 0)
            return KVI_NONE;
        if (tab_slot_may_be(s, tag))
            return s & KVI_TAB_IDX;
    }
}

static inline void tab_prefetch_t(const struct kvi_table *tb, uint32_t tag)
{
    const struct kvi_tab *t = atomic_load_explicit(&((struct kvi_table *)tb)->t, memory_order_relaxed);
    if (t != NULL)
        __builtin_prefetch(&t->s[tab_home(t, tag)]);
}

/* Insert (tag, idx) into t, which has room (W1). Writer. */
static inline void tab_insert_raw(struct kvi_tab *t, uint32_t tag, uint32_t idx)
{
    for (uint32_t i = tab_home(t, tag);; i = (i + 1) & t->mask) {
        uint32_t s = atomic_load_explicit(&t->s[i], memory_order_relaxed);
        if (s == 0 || (s & KVI_TAB_IDX) == KVI_TOMB) {
            if (s == 0)
                t->used++;
            t->live++;
            atomic_store_explicit(&t->s[i], tab_slot(tag, idx), memory_order_release); /* W1 */
            return;
        }
    }
}

/* Rebuild tb, a table of kind c->kind, with capacity cap, publish it, and
 * retire the old array (a query table) or free it at once (a slot map).
 * Reads every live slot's key (tab_key_of). Writer. */
void kvi_ix__tab_rehash(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint32_t cap);
/* Insert entry idx under a key whose tag is `tag` (W1). Writer. */
void kvi_ix__tab_insert_t(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint32_t tag,
                          uint32_t idx);
/* Make room for m inserts into tb (of kind c->kind) that then need no growth
 * check (tab_insert_raw). Writer. */
void kvi_ix__tab_room(struct kvi_part *p, const struct tab_ctx *c, struct kvi_table *tb, uint64_t m);
/* Free tb's array now (a slot map: never read by queries). Writer. */
void kvi_ix__tab_free_now(struct kvi_part *p, struct kvi_table *tb);
/* Free a table array (NULL: nothing), however it was allocated. */
void kvi_ix__tab_free_mem(struct kvi_tab *t);

/* ---- seq tables, built on demand (engine/index_table.c) --------------------- */

/* Does partition p keep a seq table? Writer (readers load stab.t with acquire). */
static inline bool stab_on(const struct kvi_part *p)
{
    return atomic_load_explicit(&((struct kvi_part *)p)->stab.t, memory_order_relaxed) != NULL;
}

/* seqs[idx] = the standard seq hash of every live entry idx of p (others
 * untouched), derived along the content chains: for a partition without a
 * seq table (so with no prefix placed by seq alone). seqs has p->next_fresh
 * elements. Writer (or with the writer stopped). */
void kvi_ix__seqs_derive(const struct kvi_index *ix, struct kvi_part *p, uint64_t *seqs);

/* Build p's seq table from its live entries and publish it (W3). Writer. */
void kvi_ix__stab_build(const struct kvi_index *ix, struct kvi_part *p);

/* Build p's seq table if seq tables were asked for since. Writer. */
static inline void stab_maybe_build(struct kvi_index *ix, struct kvi_part *p)
{
    if (KVI_UNLIKELY(!stab_on(p) && atomic_load_explicit(&ix->seq_wanted, memory_order_relaxed)))
        kvi_ix__stab_build(ix, p);
}

/* Seq tables are needed from now on (this partition's at once). Writer. */
static inline void stab_need(struct kvi_index *ix, struct kvi_part *p)
{
    if (!atomic_load_explicit(&ix->seq_wanted, memory_order_relaxed))
        atomic_store_explicit(&ix->seq_wanted, true, memory_order_relaxed);
    if (!stab_on(p))
        kvi_ix__stab_build(ix, p);
}

/* ---- members (engine/index_table.c) ----------------------------------------- */

/* The member array of e, or NULL while e has at most one member. Writer. */
static inline struct kvi_mset *entry_mset(const struct kvi_entry *e)
{
    if (atomic_load_explicit(&((struct kvi_entry *)e)->one, memory_order_relaxed) != KVI_MANY_BIT)
        return NULL;
    return kvi__mset(e, memory_order_relaxed);
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

/* The engine hash under which `slot` holds e; *found says whether it does.
 * Writer. Out of line, as GCC kept it when the index was one file (noinline:
 * a file with one call site would inline it, and the query loop's lookups
 * would then stay out of line). Static: each file's copy is local, so that
 * GCC knows which registers it clobbers (-fipa-ra) around the calls in the
 * store and remove loops (unused: not every file calls it).
 * measured (kvidx-bench micro --replay synthetic, callgrind, stores and
 * removes): 575.2 M instructions before the split; one extern copy 580.8 M,
 * a local copy per file 574.7 M. */
static __attribute__((noinline, unused)) uint64_t member_eh(const struct kvi_entry *e, uint32_t slot, bool *found)
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

static inline bool has_member(const struct kvi_entry *e, uint32_t slot)
{
    bool f;
    (void)member_eh(e, slot, &f);
    return f;
}

/* Was the slot's holding of e stored without a parent link? Writer. */
bool kvi_ix__member_is_root(const struct kvi_entry *e, uint32_t slot);

/* ---- entries (engine/index_table.c; created here, inline in do_store) ------- */

static inline uint32_t entry_parent(const struct kvi_entry *e)
{
    return e->up & KVI_UP_PARENT;
}

static inline bool entry_no_content(const struct kvi_entry *e)
{
    return (e->up & KVI_UP_NO_CONTENT) != 0;
}

/* Content hashes kept aside (engine/index_table.c): of entries whose key is
 * a stand-in. Writer. */
void kvi_ix__aside_put(struct kvi_part *p, uint32_t idx, uint64_t content);
uint64_t kvi_ix__aside_get(const struct kvi_part *p, uint32_t idx);
void kvi_ix__aside_del(struct kvi_part *p, uint32_t idx);

/* The content hash of entry idx (e): from its key, kept aside, or 0 when
 * unknown (KVI_UP_NO_CONTENT). Writer. */
static inline uint64_t entry_content(const struct kvi_index *ix, const struct kvi_part *p, const struct kvi_entry *e,
                                     uint32_t idx)
{
    if (e->up & KVI_UP_NO_CONTENT)
        return 0;
    if (e->up & KVI_UP_ASIDE)
        return kvi_ix__aside_get(p, idx);
    uint32_t par = entry_parent(e);
    return content_of_key(ix, e->key, par != KVI_NONE ? kvi__entry(p, par)->key : ix->kseed, e->pos);
}

/* Allocate entry chunk c, its pages faulted in (not zeroed). Writer. */
void kvi_ix__chunk_alloc(struct kvi_part *p, uint32_t c);

static inline uint32_t entry_alloc(struct kvi_part *p)
{
    if (p->n_free > 0)
        return p->free_idx[--p->n_free];
    if (p->next_fresh == 0)
        p->next_fresh = 1; /* index 0 is KVI_NONE */
    uint32_t idx = p->next_fresh;
    uint32_t c = idx >> KVI_ENTRY_CHUNK_SHIFT;
    if (idx >= KVI_ENTRY_IDX_END)
        kvi_die("partition entry space exhausted (%u entries)", idx);
    if (KVI_UNLIKELY(atomic_load_explicit(&p->chunks[c], memory_order_relaxed) == NULL))
        kvi_ix__chunk_alloc(p, c);
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

/* Write every field of entry e, not yet published: prefix key `key`,
 * depth, `up` word, no children, and the single member `one` (KVI_NONE:
 * none yet) with its engine hash mv. Writer. */
static inline void entry_fill(struct kvi_entry *e, uint64_t key, uint32_t pos, uint32_t up, uint32_t one,
                              uint64_t mv)
{
    e->key = key;
    atomic_store_explicit(&e->mv, mv, memory_order_relaxed);
    atomic_store_explicit(&e->one, one, memory_order_relaxed);
    e->pos = pos;
    atomic_store_explicit(&e->first_child, KVI_NONE, memory_order_relaxed);
    atomic_store_explicit(&e->next_sibling, KVI_NONE, memory_order_relaxed);
    e->up = up;
    e->prev_sibling = KVI_NONE;
}

/* A new entry for prefix key `key` (table tag ktag) and seq hash `seq`
 * (kept, with table tag stag, when the partition keeps a seq table),
 * published in the query tables. cflag: 0 (the content follows from the
 * key), KVI_UP_NO_CONTENT, or KVI_UP_ASIDE (a stand-in key: `content` is
 * kept aside). Writer. */
static inline uint32_t entry_new(struct kvi_index *ix, struct kvi_part *p, uint64_t key, uint32_t ktag, uint64_t seq,
                                 uint32_t stag, uint64_t content, uint32_t cflag, uint32_t pos, uint32_t parent)
{
    uint32_t idx = entry_alloc(p);
    struct kvi_entry *e = kvi__entry(p, idx);
    entry_fill(e, key, pos, parent | cflag, KVI_NONE, 0);
    if (cflag == KVI_UP_ASIDE)
        kvi_ix__aside_put(p, idx, content);
    bool son = stab_on(p);
    if (son)
        *kvi__seqp(p, idx) = seq; /* published with the entry (W1, W5) */
    if (parent != KVI_NONE)
        child_link(p, parent, idx);
    struct tab_ctx kc = {ix, p, TAB_KEY, 0}, sc = {ix, p, TAB_SEQ, 0};
    kvi_ix__tab_insert_t(p, &kc, &p->ktab, ktag, idx); /* W1 */
    if (son)
        kvi_ix__tab_insert_t(p, &sc, &p->stab, stag, idx);
    kvi_relaxed_add(&p->entries, 1);
    return idx;
}

/* ---- slot maps and holdings (engine/index_table.c) -------------------------- */

/* The map functions take the engine hash's table tag (tab_tag), computed
 * once per hash by callers that use it more than once. */
static inline uint32_t map_find_t(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint64_t eh,
                                  uint32_t tag)
{
    struct tab_ctx c = {ix, p, TAB_MAP, s->id};
    return tab_find_t(&c, &s->map, eh, tag);
}

/* Slot s starts holding entry idx under eh (map tag `tag`). Writer. */
void kvi_ix__holding_add(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx,
                         uint64_t eh, uint32_t tag, bool root);
/* Slot s holds entry idx under old_eh: name it eh (map tag `tag`) instead. Writer. */
void kvi_ix__holding_rename(const struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx,
                            uint64_t old_eh, uint64_t eh, uint32_t tag);
/* Drop one holding of slot s, leaving s's map to the caller. Writer. */
void kvi_ix__holding_drop(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx);
/* Remove slot s's holding of idx (map tag `tag`) and every descendant s holds. Writer. */
void kvi_ix__holding_remove_cascade_t(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx,
                                      uint32_t tag);

static inline void holding_remove_cascade(struct kvi_index *ix, struct kvi_part *p, struct kvi_slot *s, uint32_t idx)
{
    bool f;
    uint64_t eh = member_eh(kvi__entry(p, idx), s->id, &f);
    kvi_ix__holding_remove_cascade_t(ix, p, s, idx, tab_tag(ix, eh));
}

#endif
