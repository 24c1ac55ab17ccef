/*
 * Slot tracker state (engine/slots.h).
 *
 * DESIGN
 *   Threads: none of its own. Any number of writer threads, serialised by
 *   s->mu (one lock per lifecycle write; the HTTP rate of a router). Any
 *   number of RCU readers, which never take the lock.
 *
 *   Published to readers through RCU:
 *     s->trackers   immutable array of tracker pointers sorted by (model,
 *                   tenant); replaced when a tracker is created or deleted.
 *     t->ranks      immutable rank table: workers sorted by id, their ranks
 *                   contiguous and sorted, and a slot -> position index;
 *                   replaced on every (un)registration.
 *     t->nodes      the prompt trie's node table: open addressing on a
 *                   rolling prefix key of the block hashes (prefix_step),
 *                   exact through (parent, hash). The writer fills empty
 *                   slots and tombstones (or clears) removed ones in place,
 *                   and rebuilds into a fresh table when it fills up.
 *     node->hs      immutable holder set: the slot ids of the ranks holding
 *                   the node, ascending; replaced when one joins or leaves.
 *     rank counters relaxed atomics (blocks, prefill tokens, requests), one
 *                   cache line per rank, written by the writer only.
 *   Writer only: the request map and age list, and per-(node, rank)
 *   reference counts, stored after the holder ids in the holder set's
 *   allocation (readers never read them).
 *
 *   Ordering: a request's path is acquired root first and released leaf
 *   first, so what a rank holds stays prefix-closed for a reader walking
 *   from the root. t->version is a sequence counter, odd while the writer
 *   changes the trie: the overlap walk trusts its set-size shortcut only
 *   when the counter did not move (otherwise it re-walks conservatively).
 *
 *   Reclamation: replaced or unlinked objects are retired to s->retired and
 *   freed after kvi_rcu_synchronize(), in batches (RETIRE_OBJS or
 *   RETIRE_BYTES, checked at the end of each write) and on every
 *   kvi_slots_expire(). A node is freed only after a grace period, so a
 *   reader comparing parent pointers never meets a recycled node; rank slot
 *   ids are never reused within a tracker.
 *
 *   Shutdown: kvi_slots_destroy() frees everything at once (no users left).
 */
#include "engine/slots.h"

#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/common.h"
#include "engine/hash.h"
#include "engine/rcu.h"

#define RETIRE_OBJS 4096u
#define RETIRE_BYTES (4u << 20)
#define NTAB_MIN 64u
#define REQ_BUCKETS_MIN 64u

/* ---- structures ------------------------------------------------------------------ */

/* Holder set: id[0..n) slot ids ascending (readers), id[n..2n) the matching
 * reference counts (writer only). */
struct shs {
    uint32_t n;
    uint32_t id[];
};

/* A trie node: one block prefix (h0 .. ht) of some active prompt, i.e. the
 * block `hash` below `parent`. The table finds it by its prefix key; the
 * (parent, hash) pair identifies it exactly. Immutable after publication but
 * for hs. */
struct snode {
    uint64_t key;         /* prefix_step(parent's key, hash); the root's key is the seed */
    uint64_t hash;
    struct snode *parent; /* NULL for a first block */
    _Atomic(struct shs *) hs;
};

/* Node table (power-of-two capacity, linear probing). */
struct ntab {
    uint64_t mask;
    _Atomic(struct snode *) slot[];
};

/* A rank. The three counters share one line that only the writer stores to
 * (readers of other ranks never see it move). */
struct srank {
    alignas(KVI_CACHE_LINE) _Atomic uint64_t blocks;
    _Atomic uint64_t prefill;  /* prefill_exact saturated to 64 bits */
    _Atomic uint64_t requests;
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t slot;                   /* holder-set id, unique per tracker */
    unsigned __int128 prefill_exact; /* writer only */
};
_Static_assert(sizeof(struct srank) == KVI_CACHE_LINE, "one cache line per rank");

struct sworker {
    uint64_t worker_id;
    uint32_t dp_start;
    uint32_t dp_size;
    uint32_t first; /* position of its first rank in ranks[] */
};

struct sbyslot {
    uint32_t slot;
    uint32_t pos;
};

/* Rank table: one allocation (header, workers, ranks, by_slot). */
struct rtab {
    uint32_t n_workers;
    uint32_t n_ranks;
    struct sworker *workers;  /* by worker_id */
    struct srank **ranks;     /* by (worker_id, dp_rank) */
    struct sbyslot *by_slot;  /* by slot */
};

/* An active request (writer only). */
struct sreq {
    struct sreq *chain; /* bucket chain */
    struct sreq *older, *newer;
    uint64_t h;
    struct srank *rank;
    struct snode *leaf; /* NULL for an empty prompt */
    uint64_t prefill;   /* tokens still counted as prefill, 0 = none */
    uint64_t added_ns;
    size_t id_len;
    char id[];
};

struct strk {
    char *model; /* NUL-terminated copies (readers see them) */
    char *tenant;
    size_t model_len;
    size_t tenant_len;
    uint32_t block_size;
    _Atomic(struct rtab *) ranks;
    _Atomic(struct ntab *) nodes;
    _Atomic uint64_t version;
    /* writer only */
    uint64_t n_live, n_tomb;
    uint32_t next_slot;
    struct sreq **buckets;
    size_t n_buckets, n_reqs;
    struct sreq *oldest, *newest;
};

struct ttab {
    uint32_t n;
    struct strk *t[];
};

struct retired {
    void *p;
};

struct kvi_slots {
    _Atomic(struct ttab *) trackers;
    pthread_mutex_t mu;
    struct kvi_slots_config cfg;
    uint64_t seed;
    struct retired *retired;
    size_t n_retired, cap_retired, retired_bytes;
    struct {
        _Atomic uint64_t trackers, workers, ranks, requests, nodes;
        _Atomic uint64_t adds, frees, prefill_completes, expired;
        _Atomic uint64_t replica_applied, drop_tracker, drop_block_size, drop_worker,
            drop_duplicate, drop_request, events;
        _Atomic uint64_t refused_trackers, refused_ranks;
    } st;
};

static struct snode tomb_sentinel;
#define TOMB (&tomb_sentinel)

/* ---- small helpers -------------------------------------------------------------- */

/*
 * Prefix keys: key(h0..ht) = prefix_step(key(h0..h(t-1)), ht), the empty
 * prefix's key being the registry's random seed. For a fixed parent the step
 * is a bijection of the hash (an odd multiplier, an addition and a bijective
 * mix), so two children of one node never share a key. A query computes its
 * keys from its hashes alone, so a walk can prefetch the slots of positions
 * it has not reached yet instead of chasing one miss after another. Two
 * different prefixes may still collide on 64 bits: lookups compare the
 * parent pointer and the hash too, so a collision costs a probe, never a
 * wrong answer.
 */
static inline uint64_t prefix_step(uint64_t parent_key, uint64_t hash)
{
    return kvi_fmix64(parent_key + hash * 0x9e3779b97f4a7c15ull);
}

static int bytes_cmp(const char *a, size_t al, const char *b, size_t bl)
{
    size_t m = al < bl ? al : bl;
    int c = m > 0 ? memcmp(a, b, m) : 0;
    if (c != 0)
        return c;
    return al < bl ? -1 : al > bl;
}

static bool bytes_eq(const char *a, size_t al, const char *b, size_t bl)
{
    return al == bl && (al == 0 || memcmp(a, b, al) == 0);
}

static int trk_cmp_key(const struct strk *t, const struct kvi_slots_key *k)
{
    int c = bytes_cmp(t->model, t->model_len, k->model, k->model_len);
    return c != 0 ? c : bytes_cmp(t->tenant, t->tenant_len, k->tenant, k->tenant_len);
}

static bool trk_matches(const struct strk *t, const struct kvi_slots_key *f)
{
    if (f == NULL)
        return true;
    if (f->model != NULL && !bytes_eq(t->model, t->model_len, f->model, f->model_len))
        return false;
    if (f->tenant != NULL && !bytes_eq(t->tenant, t->tenant_len, f->tenant, f->tenant_len))
        return false;
    return true;
}

static char *dup_bytes(const char *p, size_t n)
{
    char *d = kvi_xmalloc(n + 1);
    if (n > 0)
        memcpy(d, p, n);
    d[n] = '\0';
    return d;
}

static uint64_t sat64(unsigned __int128 v)
{
    return v > UINT64_MAX ? UINT64_MAX : (uint64_t)v;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void set_why(struct kvi_slots_err *why, enum kvi_slots_why w)
{
    if (why != NULL) {
        memset(why, 0, sizeof(*why));
        why->why = w;
    }
}

static uint64_t now_ns(const struct kvi_slots *s)
{
    return s->cfg.now_ns != NULL ? s->cfg.now_ns(s->cfg.clock_ctx) : kvi_now_ns();
}

/* Add to a value only the writer (lock held) stores; readers load it relaxed. */
static void gauge_add(_Atomic uint64_t *g, int64_t d)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) + (uint64_t)d,
                          memory_order_relaxed);
}

/* ---- reclamation ---------------------------------------------------------------- */

static void retire(struct kvi_slots *s, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (s->n_retired == s->cap_retired) {
        s->cap_retired = s->cap_retired ? s->cap_retired * 2 : 256;
        s->retired = kvi_xrealloc(s->retired, s->cap_retired * sizeof(*s->retired));
    }
    s->retired[s->n_retired++] = (struct retired){p};
    s->retired_bytes += bytes;
}

/* Free everything retired, after a grace period. Writer lock held; the
 * caller is not inside a read-side section. */
static void reclaim(struct kvi_slots *s)
{
    if (s->n_retired == 0)
        return;
    kvi_rcu_synchronize();
    for (size_t i = 0; i < s->n_retired; i++)
        free(s->retired[i].p);
    s->n_retired = 0;
    s->retired_bytes = 0;
}

static void maybe_reclaim(struct kvi_slots *s)
{
    if (s->n_retired >= RETIRE_OBJS || s->retired_bytes >= RETIRE_BYTES)
        reclaim(s);
}

/* ---- sequence counter (seqcount) ------------------------------------------------ */

static void ver_begin(struct strk *t)
{
    uint64_t v = atomic_load_explicit(&t->version, memory_order_relaxed);
    atomic_store_explicit(&t->version, v + 1, memory_order_relaxed);
    /* W1: orders the odd count before the trie stores that follow; pairs
     * with the reader's acquire fence F1 in walk_fast's caller. */
    atomic_thread_fence(memory_order_release);
}

static void ver_end(struct strk *t)
{
    uint64_t v = atomic_load_explicit(&t->version, memory_order_relaxed);
    /* W2: publishes the trie stores before the even count; pairs with the
     * reader's acquire load V0. */
    atomic_store_explicit(&t->version, v + 1, memory_order_release);
}

/* ---- holder sets ---------------------------------------------------------------- */

static size_t hs_bytes(uint32_t n)
{
    return sizeof(struct shs) + 2u * (size_t)n * sizeof(uint32_t);
}

static uint32_t *hs_refs(struct shs *h)
{
    return h->id + h->n;
}

/* Position of @p slot in @p h, or -1. */
static int64_t hs_find(const struct shs *h, uint32_t slot)
{
    uint32_t lo = kvi_lower_bound_u32(h->id, h->n, slot);
    return lo < h->n && h->id[lo] == slot ? (int64_t)lo : -1;
}

/* A copy of @p h with @p slot added (reference count 1). */
static struct shs *hs_with(const struct shs *h, uint32_t slot)
{
    uint32_t n = h->n;
    struct shs *d = kvi_xmalloc(hs_bytes(n + 1));
    d->n = n + 1;
    const uint32_t *refs = h->id + n;
    uint32_t *drefs = d->id + n + 1;
    uint32_t k = 0, j = 0;
    for (; k < n && h->id[k] < slot; k++, j++) {
        d->id[j] = h->id[k];
        drefs[j] = refs[k];
    }
    d->id[j] = slot;
    drefs[j++] = 1;
    for (; k < n; k++, j++) {
        d->id[j] = h->id[k];
        drefs[j] = refs[k];
    }
    return d;
}

/* A copy of @p h without position @p pos (h->n >= 2). */
static struct shs *hs_without(const struct shs *h, uint32_t pos)
{
    uint32_t n = h->n;
    struct shs *d = kvi_xmalloc(hs_bytes(n - 1));
    d->n = n - 1;
    const uint32_t *refs = h->id + n;
    uint32_t *drefs = d->id + n - 1;
    for (uint32_t k = 0, j = 0; k < n; k++) {
        if (k == pos)
            continue;
        d->id[j] = h->id[k];
        drefs[j++] = refs[k];
    }
    return d;
}

/* ---- node table ------------------------------------------------------------------- */

static size_t ntab_bytes(uint64_t cap)
{
    return sizeof(struct ntab) + cap * sizeof(_Atomic(struct snode *));
}

static struct ntab *ntab_new(uint64_t cap)
{
    struct ntab *nt = kvi_xcalloc(1, ntab_bytes(cap));
    nt->mask = cap - 1;
    return nt;
}

/* Find the node (parent, hash) whose prefix key is @p key. Readers call it
 * inside a read-side section; the writer calls it under the lock. */
static struct snode *nt_find(const struct ntab *nt, uint64_t key, uint64_t hash,
                             const struct snode *parent)
{
    uint64_t i = key & nt->mask;
    for (;;) {
        /* A1: pairs with R1 in nt_put / nt_rebuild: the node's fields are
         * visible once its pointer is. */
        struct snode *p = atomic_load_explicit(&nt->slot[i], memory_order_acquire);
        if (p == NULL)
            return NULL;
        if (p != TOMB && p->key == key && p->hash == hash && p->parent == parent)
            return p;
        i = (i + 1) & nt->mask;
    }
}

/* Rebuild the node table with room for @p want live nodes (load <= 1/2). */
static struct ntab *nt_rebuild(struct kvi_slots *s, struct strk *t, uint64_t want)
{
    struct ntab *old = atomic_load_explicit(&t->nodes, memory_order_relaxed);
    uint64_t cap = NTAB_MIN;
    while (cap < 2 * want)
        cap <<= 1;
    struct ntab *nt = ntab_new(cap);
    for (uint64_t i = 0; i <= old->mask; i++) {
        struct snode *p = atomic_load_explicit(&old->slot[i], memory_order_relaxed);
        if (p == NULL || p == TOMB)
            continue;
        uint64_t j = p->key & nt->mask;
        while (atomic_load_explicit(&nt->slot[j], memory_order_relaxed) != NULL)
            j = (j + 1) & nt->mask;
        atomic_store_explicit(&nt->slot[j], p, memory_order_relaxed);
    }
    /* R1 (table): every slot store above is visible to a reader that loads
     * the new table pointer with kvi_rcu_deref. */
    kvi_rcu_assign(t->nodes, nt);
    retire(s, old, ntab_bytes(old->mask + 1));
    t->n_tomb = 0;
    return nt;
}

static void nt_put(struct kvi_slots *s, struct strk *t, struct snode *n)
{
    struct ntab *nt = atomic_load_explicit(&t->nodes, memory_order_relaxed);
    if ((t->n_live + t->n_tomb + 1) * 4 > (nt->mask + 1) * 3)
        nt = nt_rebuild(s, t, t->n_live + 1);
    uint64_t i = n->key & nt->mask;
    struct snode *p;
    while ((p = atomic_load_explicit(&nt->slot[i], memory_order_relaxed)) != NULL && p != TOMB)
        i = (i + 1) & nt->mask;
    if (p == TOMB)
        t->n_tomb--;
    /* R1: publish the initialised node; pairs with A1 in nt_find. */
    atomic_store_explicit(&nt->slot[i], n, memory_order_release);
    t->n_live++;
}

static void nt_remove(struct kvi_slots *s, struct strk *t, struct snode *n)
{
    struct ntab *nt = atomic_load_explicit(&t->nodes, memory_order_relaxed);
    uint64_t i = n->key & nt->mask;
    while (atomic_load_explicit(&nt->slot[i], memory_order_relaxed) != n)
        i = (i + 1) & nt->mask;
    /* A probe chain only runs on through non-empty slots: when the next slot
     * is empty no chain passes this one, and it can become empty too. */
    uint64_t next = (i + 1) & nt->mask;
    if (atomic_load_explicit(&nt->slot[next], memory_order_relaxed) == NULL) {
        atomic_store_explicit(&nt->slot[i], NULL, memory_order_release);
    } else {
        atomic_store_explicit(&nt->slot[i], TOMB, memory_order_release);
        t->n_tomb++;
    }
    t->n_live--;
}

/* ---- the prompt trie ------------------------------------------------------------ */

/* Acquire the path of @p hashes for rank @p r. @return the leaf (NULL for
 * an empty prompt). Inside ver_begin / ver_end. */
static struct snode *path_acquire(struct kvi_slots *s, struct strk *t, struct srank *r,
                                  const uint64_t *hashes, size_t n)
{
    struct snode *parent = NULL;
    uint64_t key = s->seed, added = 0;
    for (size_t i = 0; i < n; i++) {
        struct ntab *nt = atomic_load_explicit(&t->nodes, memory_order_relaxed);
        key = prefix_step(key, hashes[i]);
        struct snode *nd = nt_find(nt, key, hashes[i], parent);
        if (nd == NULL) {
            nd = kvi_xmalloc(sizeof(*nd));
            nd->key = key;
            nd->hash = hashes[i];
            nd->parent = parent;
            struct shs *h = kvi_xmalloc(hs_bytes(1));
            h->n = 1;
            h->id[0] = r->slot;
            hs_refs(h)[0] = 1;
            atomic_init(&nd->hs, h);
            nt_put(s, t, nd);
            gauge_add(&s->st.nodes, 1);
            added++;
        } else {
            struct shs *h = atomic_load_explicit(&nd->hs, memory_order_relaxed);
            int64_t k = hs_find(h, r->slot);
            if (k >= 0) {
                KVI_ASSERT(hs_refs(h)[k] < UINT32_MAX);
                hs_refs(h)[k]++;
            } else {
                /* R2: publish the grown set; pairs with kvi_rcu_deref of hs. */
                kvi_rcu_assign(nd->hs, hs_with(h, r->slot));
                retire(s, h, hs_bytes(h->n));
                added++;
            }
        }
        parent = nd;
    }
    if (added > 0)
        gauge_add(&r->blocks, (int64_t)added);
    return parent;
}

/* Release rank @p r's hold on the path ending at @p leaf, leaf first.
 * Inside ver_begin / ver_end. */
static void path_release(struct kvi_slots *s, struct strk *t, struct srank *r,
                         struct snode *leaf)
{
    uint64_t gone = 0;
    for (struct snode *nd = leaf; nd != NULL;) {
        struct snode *up = nd->parent;
        struct shs *h = atomic_load_explicit(&nd->hs, memory_order_relaxed);
        int64_t k = hs_find(h, r->slot);
        KVI_ASSERT(k >= 0);
        if (--hs_refs(h)[k] == 0) {
            gone++;
            if (h->n == 1) {
                /* nobody holds the prefix any more, hence no descendant */
                nt_remove(s, t, nd);
                retire(s, nd, sizeof(*nd));
                retire(s, h, hs_bytes(1));
                gauge_add(&s->st.nodes, -1);
            } else {
                kvi_rcu_assign(nd->hs, hs_without(h, (uint32_t)k)); /* R2 */
                retire(s, h, hs_bytes(h->n));
            }
        }
        nd = up;
    }
    if (gone > 0)
        gauge_add(&r->blocks, -(int64_t)gone);
}

/* ---- rank counters ---------------------------------------------------------------- */

static void prefill_open(struct srank *r, uint64_t tokens)
{
    r->prefill_exact += tokens;
    atomic_store_explicit(&r->prefill, sat64(r->prefill_exact), memory_order_relaxed);
}

static void prefill_close(struct srank *r, struct sreq *q)
{
    if (q->prefill == 0)
        return;
    r->prefill_exact -= q->prefill;
    q->prefill = 0;
    atomic_store_explicit(&r->prefill, sat64(r->prefill_exact), memory_order_relaxed);
}

/* ---- requests (writer only) ------------------------------------------------------- */

static uint64_t id_hash(const char *p, size_t n)
{
    return XXH3_64bits(n > 0 ? p : "", n);
}

static struct sreq *req_find(const struct strk *t, const char *id, size_t n)
{
    if (t->n_buckets == 0)
        return NULL;
    uint64_t h = id_hash(id, n);
    for (struct sreq *q = t->buckets[h & (t->n_buckets - 1)]; q != NULL; q = q->chain)
        if (q->h == h && bytes_eq(q->id, q->id_len, id, n))
            return q;
    return NULL;
}

static void req_link(struct strk *t, struct sreq *q)
{
    if (t->n_reqs + 1 > t->n_buckets) {
        size_t nb = t->n_buckets ? t->n_buckets * 2 : REQ_BUCKETS_MIN;
        struct sreq **b = kvi_xcalloc(nb, sizeof(*b));
        for (size_t i = 0; i < t->n_buckets; i++) {
            for (struct sreq *x = t->buckets[i], *nx; x != NULL; x = nx) {
                nx = x->chain;
                x->chain = b[x->h & (nb - 1)];
                b[x->h & (nb - 1)] = x;
            }
        }
        free(t->buckets);
        t->buckets = b;
        t->n_buckets = nb;
    }
    struct sreq **head = &t->buckets[q->h & (t->n_buckets - 1)];
    q->chain = *head;
    *head = q;
    q->newer = NULL;
    q->older = t->newest;
    if (t->newest != NULL)
        t->newest->newer = q;
    else
        t->oldest = q;
    t->newest = q;
    t->n_reqs++;
}

static void req_unlink(struct strk *t, struct sreq *q)
{
    struct sreq **pp = &t->buckets[q->h & (t->n_buckets - 1)];
    while (*pp != q)
        pp = &(*pp)->chain;
    *pp = q->chain;
    if (q->older != NULL)
        q->older->newer = q->newer;
    else
        t->oldest = q->newer;
    if (q->newer != NULL)
        q->newer->older = q->older;
    else
        t->newest = q->older;
    t->n_reqs--;
}

/* Remove an active request: its blocks, its prefill, its entry. */
static void req_remove(struct kvi_slots *s, struct strk *t, struct sreq *q)
{
    struct srank *r = q->rank;
    if (q->leaf != NULL) {
        ver_begin(t);
        path_release(s, t, r, q->leaf);
        ver_end(t);
    }
    prefill_close(r, q);
    gauge_add(&r->requests, -1);
    req_unlink(t, q);
    gauge_add(&s->st.requests, -1);
    free(q);
}

static size_t expire_tracker(struct kvi_slots *s, struct strk *t, uint64_t now)
{
    uint64_t stale = s->cfg.stale_after_ns;
    size_t n = 0;
    while (t->oldest != NULL && now > t->oldest->added_ns && now - t->oldest->added_ns > stale) {
        req_remove(s, t, t->oldest);
        n++;
    }
    if (n > 0)
        kvi_relaxed_add(&s->st.expired, n);
    return n;
}

/* ---- rank tables --------------------------------------------------------------------- */

static size_t rtab_bytes(uint32_t nw, uint32_t nr)
{
    return sizeof(struct rtab) + nw * sizeof(struct sworker) + nr * sizeof(struct srank *) +
           nr * sizeof(struct sbyslot);
}

static struct rtab *rtab_alloc(uint32_t nw, uint32_t nr)
{
    struct rtab *rt = kvi_xmalloc(rtab_bytes(nw, nr));
    rt->n_workers = nw;
    rt->n_ranks = nr;
    rt->workers = (struct sworker *)(rt + 1);
    rt->ranks = (struct srank **)(rt->workers + nw);
    rt->by_slot = (struct sbyslot *)(rt->ranks + nr);
    return rt;
}

static int byslot_cmp(const void *a, const void *b)
{
    const struct sbyslot *x = a, *y = b;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Fill workers[].first and by_slot from ranks. */
static void rtab_index(struct rtab *rt)
{
    uint32_t pos = 0;
    for (uint32_t w = 0; w < rt->n_workers; w++) {
        rt->workers[w].first = pos;
        pos += rt->workers[w].dp_size;
    }
    for (uint32_t i = 0; i < rt->n_ranks; i++)
        rt->by_slot[i] = (struct sbyslot){rt->ranks[i]->slot, i};
    if (rt->n_ranks > 1)
        qsort(rt->by_slot, rt->n_ranks, sizeof(*rt->by_slot), byslot_cmp);
}

/* Position of the worker, or of where it would go (*found says which). */
static uint32_t rtab_worker_pos(const struct rtab *rt, uint64_t worker_id, bool *found)
{
    uint32_t lo = 0, hi = rt->n_workers;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (rt->workers[mid].worker_id < worker_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < rt->n_workers && rt->workers[lo].worker_id == worker_id;
    return lo;
}

static struct srank *rtab_rank(const struct rtab *rt, uint64_t worker_id, uint32_t dp_rank)
{
    bool found;
    uint32_t w = rtab_worker_pos(rt, worker_id, &found);
    if (!found)
        return NULL;
    const struct sworker *wk = &rt->workers[w];
    if (dp_rank < wk->dp_start || dp_rank - wk->dp_start >= wk->dp_size)
        return NULL;
    return rt->ranks[wk->first + (dp_rank - wk->dp_start)];
}

/* Position of the rank with holder-set id @p slot, or -1. */
static int64_t rtab_slot_pos(const struct rtab *rt, uint32_t slot)
{
    uint32_t lo = 0, hi = rt->n_ranks;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (rt->by_slot[mid].slot < slot)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < rt->n_ranks && rt->by_slot[lo].slot == slot ? (int64_t)rt->by_slot[lo].pos : -1;
}

/* ---- tracker tables ----------------------------------------------------------------- */

static size_t ttab_bytes(uint32_t n)
{
    return sizeof(struct ttab) + n * sizeof(struct strk *);
}

static uint32_t ttab_pos(const struct ttab *tt, const struct kvi_slots_key *k, bool *found)
{
    uint32_t lo = 0, hi = tt->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (trk_cmp_key(tt->t[mid], k) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < tt->n && trk_cmp_key(tt->t[lo], k) == 0;
    return lo;
}

static struct strk *ttab_find(const struct ttab *tt, const struct kvi_slots_key *k)
{
    bool found;
    uint32_t i = ttab_pos(tt, k, &found);
    return found ? tt->t[i] : NULL;
}

/* Writer-side lookup (lock held). */
static struct strk *trk_get(const struct kvi_slots *s, const struct kvi_slots_key *k)
{
    return ttab_find(atomic_load_explicit(&s->trackers, memory_order_relaxed), k);
}

static void ttab_replace(struct kvi_slots *s, struct ttab *nt)
{
    struct ttab *old = atomic_load_explicit(&s->trackers, memory_order_relaxed);
    kvi_rcu_assign(s->trackers, nt);
    retire(s, old, ttab_bytes(old->n));
}

static struct strk *trk_create(struct kvi_slots *s, const struct kvi_slots_key *k,
                               uint32_t block_size)
{
    struct strk *t = kvi_xcalloc(1, sizeof(*t));
    t->model = dup_bytes(k->model, k->model_len);
    t->tenant = dup_bytes(k->tenant, k->tenant_len);
    t->model_len = k->model_len;
    t->tenant_len = k->tenant_len;
    t->block_size = block_size;
    atomic_init(&t->ranks, rtab_alloc(0, 0));
    atomic_init(&t->nodes, ntab_new(NTAB_MIN));
    atomic_init(&t->version, 0);

    struct ttab *old = atomic_load_explicit(&s->trackers, memory_order_relaxed);
    bool found;
    uint32_t at = ttab_pos(old, k, &found);
    struct ttab *nt = kvi_xmalloc(ttab_bytes(old->n + 1));
    nt->n = old->n + 1;
    memcpy(nt->t, old->t, at * sizeof(nt->t[0]));
    nt->t[at] = t;
    memcpy(nt->t + at + 1, old->t + at, (old->n - at) * sizeof(nt->t[0]));
    ttab_replace(s, nt);
    gauge_add(&s->st.trackers, 1);
    return t;
}

/* Unlink an empty tracker (no workers, no requests) and retire it. */
static void trk_delete(struct kvi_slots *s, struct strk *t)
{
    struct ttab *old = atomic_load_explicit(&s->trackers, memory_order_relaxed);
    struct ttab *nt = kvi_xmalloc(ttab_bytes(old->n - 1));
    nt->n = 0;
    for (uint32_t i = 0; i < old->n; i++)
        if (old->t[i] != t)
            nt->t[nt->n++] = old->t[i];
    ttab_replace(s, nt);
    struct rtab *rt = atomic_load_explicit(&t->ranks, memory_order_relaxed);
    struct ntab *ntb = atomic_load_explicit(&t->nodes, memory_order_relaxed);
    retire(s, rt, rtab_bytes(rt->n_workers, rt->n_ranks));
    retire(s, ntb, ntab_bytes(ntb->mask + 1));
    retire(s, t->model, t->model_len + 1);
    retire(s, t->tenant, t->tenant_len + 1);
    free(t->buckets); /* writer only */
    t->buckets = NULL;
    retire(s, t, sizeof(*t));
    gauge_add(&s->st.trackers, -1);
}

/* ---- lifetime ---------------------------------------------------------------------- */

struct kvi_slots *kvi_slots_create(const struct kvi_slots_config *cfg)
{
    struct kvi_slots *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    if (cfg != NULL)
        s->cfg = *cfg;
    if (s->cfg.stale_after_ns == 0)
        s->cfg.stale_after_ns = KVI_SLOTS_STALE_NS;
    if (s->cfg.max_ranks == 0)
        s->cfg.max_ranks = KVI_SLOTS_MAX_RANKS;
    if (s->cfg.max_trackers == 0)
        s->cfg.max_trackers = KVI_SLOTS_MAX_TRACKERS;
    if (s->cfg.max_dp_size == 0)
        s->cfg.max_dp_size = KVI_SLOTS_MAX_DP_SIZE;
    s->seed = kvi_fmix64(kvi_now_ns() ^ (uint64_t)(uintptr_t)s);
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        errno = ENOMEM;
        return NULL;
    }
    struct ttab *tt = kvi_xcalloc(1, ttab_bytes(0));
    atomic_init(&s->trackers, tt);
    return s;
}

static void trk_free_all(struct strk *t)
{
    for (struct sreq *q = t->oldest, *nx; q != NULL; q = nx) {
        nx = q->newer;
        free(q);
    }
    free(t->buckets);
    struct ntab *nt = atomic_load_explicit(&t->nodes, memory_order_relaxed);
    for (uint64_t i = 0; i <= nt->mask; i++) {
        struct snode *p = atomic_load_explicit(&nt->slot[i], memory_order_relaxed);
        if (p == NULL || p == TOMB)
            continue;
        free(atomic_load_explicit(&p->hs, memory_order_relaxed));
        free(p);
    }
    free(nt);
    struct rtab *rt = atomic_load_explicit(&t->ranks, memory_order_relaxed);
    for (uint32_t i = 0; i < rt->n_ranks; i++)
        free(rt->ranks[i]);
    free(rt);
    free(t->model);
    free(t->tenant);
    free(t);
}

void kvi_slots_destroy(struct kvi_slots *s)
{
    if (s == NULL)
        return;
    struct ttab *tt = atomic_load_explicit(&s->trackers, memory_order_relaxed);
    for (uint32_t i = 0; i < tt->n; i++)
        trk_free_all(tt->t[i]);
    free(tt);
    for (size_t i = 0; i < s->n_retired; i++)
        free(s->retired[i].p);
    free(s->retired);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- topology ------------------------------------------------------------------------ */

int kvi_slots_register(struct kvi_slots *s, const struct kvi_slots_key *key, uint64_t worker_id,
                       uint32_t block_size, uint32_t dp_start, uint32_t dp_size,
                       struct kvi_slots_err *why)
{
    if (block_size == 0) {
        set_why(why, KVI_SLOTS_E_BLOCK_SIZE);
        return -EINVAL;
    }
    if (dp_size == 0 || (uint64_t)dp_start + dp_size > UINT32_MAX) {
        set_why(why, dp_size == 0 ? KVI_SLOTS_E_DP_SIZE : KVI_SLOTS_E_DP_RANGE);
        if (why != NULL) {
            why->worker_id = worker_id;
            why->dp_start = dp_start;
            why->dp_size = dp_size;
        }
        return -EINVAL;
    }
    if (dp_size > s->cfg.max_dp_size) {
        set_why(why, KVI_SLOTS_E_DP_SIZE_LIMIT);
        if (why != NULL) {
            why->worker_id = worker_id;
            why->dp_start = dp_start;
            why->dp_size = dp_size;
            why->max_dp_size = s->cfg.max_dp_size;
        }
        kvi_relaxed_add(&s->st.refused_ranks, 1);
        return -EINVAL;
    }
    pthread_mutex_lock(&s->mu);
    struct strk *t = trk_get(s, key);
    uint32_t have = 0;
    if (t != NULL) {
        have = atomic_load_explicit(&t->ranks, memory_order_relaxed)->n_ranks;
        if (t->block_size != block_size) {
            set_why(why, KVI_SLOTS_E_BLOCK_SIZE_MISMATCH);
            if (why != NULL) {
                why->existing_block_size = t->block_size;
                why->requested_block_size = block_size;
            }
            pthread_mutex_unlock(&s->mu);
            return -EEXIST;
        }
        bool found;
        (void)rtab_worker_pos(atomic_load_explicit(&t->ranks, memory_order_relaxed), worker_id,
                              &found);
        if (found) {
            set_why(why, KVI_SLOTS_E_DUP_WORKER);
            if (why != NULL)
                why->worker_id = worker_id;
            pthread_mutex_unlock(&s->mu);
            return -EEXIST;
        }
    }
    if ((uint64_t)have + dp_size > s->cfg.max_ranks) {
        set_why(why, KVI_SLOTS_E_TOO_MANY_RANKS);
        if (why != NULL) {
            why->worker_id = worker_id;
            why->dp_start = dp_start;
            why->dp_size = dp_size;
            why->ranks = have;
            why->max_ranks = s->cfg.max_ranks;
        }
        kvi_relaxed_add(&s->st.refused_ranks, 1);
        pthread_mutex_unlock(&s->mu);
        return -EINVAL;
    }
    if (t == NULL) {
        uint32_t n_trk = atomic_load_explicit(&s->trackers, memory_order_relaxed)->n;
        if (n_trk >= s->cfg.max_trackers) {
            set_why(why, KVI_SLOTS_E_TOO_MANY_TRACKERS);
            if (why != NULL) {
                why->worker_id = worker_id;
                why->trackers = n_trk;
                why->max_trackers = s->cfg.max_trackers;
            }
            kvi_relaxed_add(&s->st.refused_trackers, 1);
            pthread_mutex_unlock(&s->mu);
            return -ENOSPC;
        }
        t = trk_create(s, key, block_size);
    }

    struct rtab *old = atomic_load_explicit(&t->ranks, memory_order_relaxed);
    bool found;
    uint32_t at = rtab_worker_pos(old, worker_id, &found);
    struct rtab *rt = rtab_alloc(old->n_workers + 1, old->n_ranks + dp_size);
    memcpy(rt->workers, old->workers, at * sizeof(*rt->workers));
    rt->workers[at] = (struct sworker){worker_id, dp_start, dp_size, 0};
    memcpy(rt->workers + at + 1, old->workers + at,
           (old->n_workers - at) * sizeof(*rt->workers));
    /* ranks: those of the workers before `at`, the new ones, then the rest */
    uint32_t split = at < old->n_workers ? old->workers[at].first : old->n_ranks;
    memcpy(rt->ranks, old->ranks, split * sizeof(*rt->ranks));
    for (uint32_t i = 0; i < dp_size; i++) {
        struct srank *r = aligned_alloc(KVI_CACHE_LINE, sizeof(struct srank));
        if (r == NULL)
            kvi_die("out of memory (%zu bytes)", sizeof(struct srank));
        memset(r, 0, sizeof(*r));
        atomic_init(&r->blocks, 0);
        atomic_init(&r->prefill, 0);
        atomic_init(&r->requests, 0);
        r->worker_id = worker_id;
        r->dp_rank = dp_start + i;
        r->slot = t->next_slot++;
        KVI_ASSERT(t->next_slot != 0); /* 2^32 rank registrations in one tracker */
        rt->ranks[split + i] = r;
    }
    memcpy(rt->ranks + split + dp_size, old->ranks + split,
           (old->n_ranks - split) * sizeof(*rt->ranks));
    rtab_index(rt);
    kvi_rcu_assign(t->ranks, rt);
    retire(s, old, rtab_bytes(old->n_workers, old->n_ranks));
    gauge_add(&s->st.workers, 1);
    gauge_add(&s->st.ranks, dp_size);
    maybe_reclaim(s);
    pthread_mutex_unlock(&s->mu);
    set_why(why, KVI_SLOTS_OK);
    return 0;
}

int kvi_slots_unregister(struct kvi_slots *s, const struct kvi_slots_key *key, uint64_t worker_id,
                         struct kvi_slots_err *why)
{
    pthread_mutex_lock(&s->mu);
    struct strk *t = trk_get(s, key);
    struct rtab *old = t != NULL ? atomic_load_explicit(&t->ranks, memory_order_relaxed) : NULL;
    bool found = false;
    uint32_t at = old != NULL ? rtab_worker_pos(old, worker_id, &found) : 0;
    if (!found) {
        pthread_mutex_unlock(&s->mu);
        set_why(why, KVI_SLOTS_E_NO_WORKER);
        if (why != NULL)
            why->worker_id = worker_id;
        return -ENOENT;
    }
    /* its requests first (the trie forgets the ranks' slots), then the ranks */
    for (struct sreq *q = t->oldest, *nx; q != NULL; q = nx) {
        nx = q->newer;
        if (q->rank->worker_id == worker_id)
            req_remove(s, t, q);
    }
    const struct sworker *wk = &old->workers[at];
    uint32_t first = wk->first, size = wk->dp_size;
    for (uint32_t i = 0; i < size; i++)
        retire(s, old->ranks[first + i], sizeof(struct srank));
    gauge_add(&s->st.workers, -1);
    gauge_add(&s->st.ranks, -(int64_t)size);
    if (old->n_workers == 1) {
        trk_delete(s, t); /* retires old too */
    } else {
        struct rtab *rt = rtab_alloc(old->n_workers - 1, old->n_ranks - size);
        memcpy(rt->workers, old->workers, at * sizeof(*rt->workers));
        memcpy(rt->workers + at, old->workers + at + 1,
               (old->n_workers - at - 1) * sizeof(*rt->workers));
        memcpy(rt->ranks, old->ranks, first * sizeof(*rt->ranks));
        memcpy(rt->ranks + first, old->ranks + first + size,
               (old->n_ranks - first - size) * sizeof(*rt->ranks));
        rtab_index(rt);
        kvi_rcu_assign(t->ranks, rt);
        retire(s, old, rtab_bytes(old->n_workers, old->n_ranks));
    }
    maybe_reclaim(s);
    pthread_mutex_unlock(&s->mu);
    set_why(why, KVI_SLOTS_OK);
    return 0;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static void emit(struct kvi_slots *s, const struct strk *t, enum kvi_slots_event_type type,
                 const struct kvi_slots_request *src, const struct sreq *q)
{
    if (s->cfg.on_event == NULL)
        return;
    struct kvi_slots_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.block_size = t->block_size;
    if (src != NULL)
        ev.req = *src;
    ev.req.key = (struct kvi_slots_key){t->model, t->model_len, t->tenant, t->tenant_len};
    if (q != NULL) {
        ev.req.request_id = q->id;
        ev.req.request_id_len = q->id_len;
        ev.req.worker_id = q->rank->worker_id;
        ev.req.dp_rank = q->rank->dp_rank;
    }
    s->cfg.on_event(s->cfg.event_ctx, &ev);
    kvi_relaxed_add(&s->st.events, 1);
}

/* Add after the checks passed (lock held). */
static void do_add(struct kvi_slots *s, struct strk *t, struct srank *r,
                   const struct kvi_slots_request *req)
{
    uint64_t now = now_ns(s);
    expire_tracker(s, t, now);
    struct sreq *q = kvi_xmalloc(sizeof(*q) + req->request_id_len + 1);
    memset(q, 0, sizeof(*q));
    q->id_len = req->request_id_len;
    if (q->id_len > 0)
        memcpy(q->id, req->request_id, q->id_len);
    q->id[q->id_len] = '\0';
    q->h = id_hash(req->request_id, req->request_id_len);
    q->rank = r;
    q->added_ns = now;
    if (req->n_hashes > 0) {
        ver_begin(t);
        q->leaf = path_acquire(s, t, r, req->hashes, req->n_hashes);
        ver_end(t);
    }
    if (req->new_isl_tokens > 0) {
        q->prefill = req->new_isl_tokens;
        prefill_open(r, q->prefill);
    }
    gauge_add(&r->requests, 1);
    req_link(t, q);
    gauge_add(&s->st.requests, 1);
}

int kvi_slots_add(struct kvi_slots *s, const struct kvi_slots_request *req,
                  struct kvi_slots_err *why)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    struct strk *t = trk_get(s, &req->key);
    struct srank *r = NULL;
    struct sreq *dup = NULL;
    if (t == NULL) {
        set_why(why, KVI_SLOTS_E_NO_TRACKER);
        rc = -ENOENT;
    } else if ((r = rtab_rank(atomic_load_explicit(&t->ranks, memory_order_relaxed),
                              req->worker_id, req->dp_rank)) == NULL) {
        set_why(why, KVI_SLOTS_E_NO_RANK);
        if (why != NULL) {
            why->worker_id = req->worker_id;
            why->dp_rank = req->dp_rank;
        }
        rc = -ENOENT;
    } else if ((dup = req_find(t, req->request_id, req->request_id_len)) != NULL) {
        set_why(why, KVI_SLOTS_E_DUP_REQUEST);
        if (why != NULL) {
            why->worker_id = dup->rank->worker_id;
            why->dp_rank = dup->rank->dp_rank;
        }
        rc = -EEXIST;
    } else {
        do_add(s, t, r, req);
        kvi_relaxed_add(&s->st.adds, 1);
        emit(s, t, KVI_SLOTS_EV_ADD, req, NULL);
        maybe_reclaim(s);
        set_why(why, KVI_SLOTS_OK);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvi_slots_prefill_complete(struct kvi_slots *s, const struct kvi_slots_request *req,
                               struct kvi_slots_err *why)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    struct strk *t = trk_get(s, &req->key);
    struct sreq *q = t != NULL ? req_find(t, req->request_id, req->request_id_len) : NULL;
    if (t == NULL || q == NULL) {
        set_why(why, t == NULL ? KVI_SLOTS_E_NO_TRACKER : KVI_SLOTS_E_NO_REQUEST);
        rc = -ENOENT;
    } else {
        prefill_close(q->rank, q);
        kvi_relaxed_add(&s->st.prefill_completes, 1);
        emit(s, t, KVI_SLOTS_EV_PREFILL_COMPLETE, NULL, q);
        set_why(why, KVI_SLOTS_OK);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvi_slots_free(struct kvi_slots *s, const struct kvi_slots_request *req,
                   struct kvi_slots_err *why)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    struct strk *t = trk_get(s, &req->key);
    if (t == NULL) {
        set_why(why, KVI_SLOTS_E_NO_TRACKER);
        rc = -ENOENT;
    } else {
        struct sreq *q = req_find(t, req->request_id, req->request_id_len);
        if (q != NULL) {
            emit(s, t, KVI_SLOTS_EV_FREE, NULL, q);
            req_remove(s, t, q);
            kvi_relaxed_add(&s->st.frees, 1);
            maybe_reclaim(s);
        }
        set_why(why, KVI_SLOTS_OK);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

size_t kvi_slots_expire(struct kvi_slots *s, uint64_t now)
{
    pthread_mutex_lock(&s->mu);
    size_t n = 0;
    struct ttab *tt = atomic_load_explicit(&s->trackers, memory_order_relaxed);
    for (uint32_t i = 0; i < tt->n; i++)
        n += expire_tracker(s, tt->t[i], now);
    reclaim(s);
    pthread_mutex_unlock(&s->mu);
    return n;
}

int kvi_slots_apply_replica(struct kvi_slots *s, const struct kvi_slots_event *ev)
{
    const struct kvi_slots_request *req = &ev->req;
    pthread_mutex_lock(&s->mu);
    int rc = -ENOENT;
    _Atomic uint64_t *drop = NULL;
    struct strk *t = trk_get(s, &req->key);
    struct srank *r = NULL;
    struct sreq *q = NULL;
    if (t == NULL) {
        drop = &s->st.drop_tracker;
    } else if (t->block_size != ev->block_size) {
        drop = &s->st.drop_block_size;
    } else if ((r = rtab_rank(atomic_load_explicit(&t->ranks, memory_order_relaxed),
                              req->worker_id, req->dp_rank)) == NULL) {
        drop = &s->st.drop_worker;
    } else {
        q = req_find(t, req->request_id, req->request_id_len);
        switch (ev->type) {
        case KVI_SLOTS_EV_ADD:
            if (q != NULL) {
                drop = &s->st.drop_duplicate;
                rc = -EEXIST;
            } else {
                do_add(s, t, r, req);
            }
            break;
        case KVI_SLOTS_EV_PREFILL_COMPLETE:
        case KVI_SLOTS_EV_FREE:
            if (q == NULL || q->rank != r) {
                drop = &s->st.drop_request;
            } else if (ev->type == KVI_SLOTS_EV_FREE) {
                req_remove(s, t, q);
            } else {
                prefill_close(r, q);
            }
            break;
        default:
            drop = &s->st.drop_request;
            break;
        }
    }
    if (drop != NULL) {
        kvi_relaxed_add(drop, 1);
    } else {
        kvi_relaxed_add(&s->st.replica_applied, 1);
        rc = 0;
        maybe_reclaim(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- reads ---------------------------------------------------------------------------- */

/*
 * The listings (GET /workers, GET /loads) and their pages share one walk:
 * the trackers in key order from @p after's (model, tenant) on (all of them
 * without a position), the filter applied per tracker, and inside the
 * position's own tracker only the rows after it. A listing says how many rows
 * a tracker has, where a position resumes inside one, and how a row is
 * written. Reader (inside an RCU read-side section).
 */
struct listing {
    uint32_t (*rows)(const struct rtab *rt);
    /* The first row that sorts after @p after (its tracker being @p after's). */
    uint32_t (*resume)(const struct rtab *rt, const struct kvi_slots_pos *after);
    /* Write row @p row of tracker @p t as entry @p k of @p out. */
    void (*row)(const struct strk *t, const struct rtab *rt, uint32_t row, void *out, size_t k);
};

/*
 * Write the rows of @p l after @p after (NULL: from the first) into @p out,
 * at most @p cap of them. @p count_all: go on counting the rows past @p cap
 * (the unpaged listings' "full count"; a whole tracker at a time); otherwise
 * stop at @p cap. @return the rows counted.
 */
static size_t list_walk(const struct kvi_slots *s, const struct listing *l,
                        const struct kvi_slots_key *filter, const struct kvi_slots_pos *after,
                        void *out, size_t cap, bool count_all)
{
    const struct ttab *tt = kvi_rcu_deref(((struct kvi_slots *)s)->trackers);
    size_t k = 0;
    bool found = false; /* tt->t[from] is the position's own tracker */
    uint32_t from = after != NULL ? ttab_pos(tt, &after->key, &found) : 0;
    for (uint32_t i = from; i < tt->n && (count_all || k < cap); i++) {
        struct strk *t = tt->t[i];
        if (!trk_matches(t, filter))
            continue;
        const struct rtab *rt = kvi_rcu_deref(t->ranks);
        uint32_t n = l->rows(rt);
        uint32_t j = found && i == from ? l->resume(rt, after) : 0;
        for (; j < n && k < cap; j++, k++)
            l->row(t, rt, j, out, k);
        if (count_all && j < n)
            k += n - j;
    }
    return k;
}

static uint32_t workers_rows(const struct rtab *rt)
{
    return rt->n_workers;
}

/* The first worker whose id is above after->worker_id. */
static uint32_t workers_resume(const struct rtab *rt, const struct kvi_slots_pos *after)
{
    bool found;
    uint32_t w = rtab_worker_pos(rt, after->worker_id, &found);
    return w + (found ? 1u : 0u);
}

static void workers_row(const struct strk *t, const struct rtab *rt, uint32_t w, void *out, size_t k)
{
    const struct sworker *x = &rt->workers[w];
    ((struct kvi_slots_worker *)out)[k] = (struct kvi_slots_worker){
        t->model, t->model_len, t->tenant, t->tenant_len, x->worker_id, t->block_size, x->dp_start,
        x->dp_size};
}

static const struct listing workers_listing = {workers_rows, workers_resume, workers_row};

size_t kvi_slots_workers(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                         struct kvi_slots_worker *out, size_t cap)
{
    return list_walk(s, &workers_listing, filter, NULL, out, cap, true);
}

size_t kvi_slots_workers_page(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                              const struct kvi_slots_pos *after, struct kvi_slots_worker *out,
                              size_t cap)
{
    return list_walk(s, &workers_listing, filter, after, out, cap, false);
}

static void read_rank(const struct srank *r, uint64_t *blocks, uint64_t *prefill,
                      uint64_t *requests)
{
    *blocks = atomic_load_explicit(&r->blocks, memory_order_relaxed);
    *prefill = atomic_load_explicit(&r->prefill, memory_order_relaxed);
    *requests = atomic_load_explicit(&r->requests, memory_order_relaxed);
}

static uint32_t loads_rows(const struct rtab *rt)
{
    return rt->n_ranks;
}

/* The first rank that sorts after (after->worker_id, after->dp_rank). */
static uint32_t loads_resume(const struct rtab *rt, const struct kvi_slots_pos *after)
{
    uint32_t lo = 0, hi = rt->n_ranks;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const struct srank *r = rt->ranks[mid];
        if (r->worker_id < after->worker_id ||
            (r->worker_id == after->worker_id && r->dp_rank <= after->dp_rank))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One /loads row: rank @p j of tracker t (relaxed loads, as read_rank). */
static void loads_row(const struct strk *t, const struct rtab *rt, uint32_t j, void *out, size_t k)
{
    const struct srank *r = rt->ranks[j];
    struct kvi_slots_load *o = &((struct kvi_slots_load *)out)[k];
    o->model = t->model;
    o->model_len = t->model_len;
    o->tenant = t->tenant;
    o->tenant_len = t->tenant_len;
    o->worker_id = r->worker_id;
    o->dp_rank = r->dp_rank;
    read_rank(r, &o->active_decode_blocks, &o->active_prefill_tokens, &o->active_requests);
}

static const struct listing loads_listing = {loads_rows, loads_resume, loads_row};

size_t kvi_slots_loads(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                       struct kvi_slots_load *out, size_t cap)
{
    return list_walk(s, &loads_listing, filter, NULL, out, cap, true);
}

size_t kvi_slots_loads_page(const struct kvi_slots *s, const struct kvi_slots_key *filter,
                            const struct kvi_slots_pos *after, struct kvi_slots_load *out,
                            size_t cap)
{
    return list_walk(s, &loads_listing, filter, after, out, cap, false);
}

static struct strk *find_reader(const struct kvi_slots *s, const struct kvi_slots_key *key)
{
    const struct ttab *tt = kvi_rcu_deref(((struct kvi_slots *)s)->trackers);
    return ttab_find(tt, key);
}

/*
 * A query's prefix keys, LOOK positions ahead of the walk: their home slots
 * are prefetched when computed, and the node in the home slot of the
 * position LOOK/2 ahead is prefetched too, so the walk's probes mostly hit
 * the cache instead of waiting for one miss after another.
 */
#define LOOK 8u

struct qcur {
    const struct ntab *nt;
    const uint64_t *q;
    size_t n;
    size_t ahead; /* keys computed: positions [0, ahead) */
    uint64_t last;
    uint64_t ring[LOOK];
};

static void qcur_push(struct qcur *c)
{
    c->last = prefix_step(c->last, c->q[c->ahead]);
    c->ring[c->ahead % LOOK] = c->last;
    __builtin_prefetch(&c->nt->slot[c->last & c->nt->mask]);
    c->ahead++;
}

static void qcur_init(struct qcur *c, const struct ntab *nt, uint64_t seed, const uint64_t *q,
                      size_t n)
{
    c->nt = nt;
    c->q = q;
    c->n = n;
    c->ahead = 0;
    c->last = seed;
    while (c->ahead < n && c->ahead < LOOK)
        qcur_push(c);
}

/* The key of position @p t (taken in order, 0, 1, ...). */
static uint64_t qcur_take(struct qcur *c, size_t t)
{
    uint64_t k = c->ring[t % LOOK];
    if (c->ahead < c->n)
        qcur_push(c); /* position t + LOOK takes t's place in the ring */
    size_t u = t + LOOK / 2;
    if (u < c->ahead) {
        const struct snode *p = atomic_load_explicit(
            &c->nt->slot[c->ring[u % LOOK] & c->nt->mask], memory_order_relaxed);
        if (p != NULL && p != TOMB)
            __builtin_prefetch(p);
    }
    return k;
}

/*
 * Overlap walk, fast path: valid when no trie change overlapped it (the
 * caller checks the sequence counter). In a quiet trie the holder sets along
 * the query shrink monotonically (what a rank holds is prefix-closed), so a
 * set of the same size as its parent's is the same set, and ranks drop out
 * only where the size falls. out[pos].overlap_blocks must be 0 on entry.
 */
static void walk_fast(const struct kvi_slots *s, struct strk *t, const struct rtab *rt,
                      const uint64_t *q, size_t n, struct kvi_slots_potential *out)
{
    const struct ntab *nt = kvi_rcu_deref(t->nodes);
    const struct shs *prev = NULL;
    const struct snode *parent = NULL;
    struct qcur c;
    qcur_init(&c, nt, s->seed, q, n);
    size_t depth = 0;
    for (; depth < n; depth++) {
        const struct snode *nd = nt_find(nt, qcur_take(&c, depth), q[depth], parent);
        if (nd == NULL)
            break;
        const struct shs *h = kvi_rcu_deref(((struct snode *)nd)->hs);
        if (prev != NULL && h->n != prev->n) {
            /* the ranks of prev missing from h matched exactly `depth` blocks */
            uint32_t a = 0, b = 0;
            while (a < prev->n) {
                if (b < h->n && h->id[b] < prev->id[a]) {
                    b++;
                } else if (b < h->n && h->id[b] == prev->id[a]) {
                    a++;
                    b++;
                } else {
                    int64_t pos = rtab_slot_pos(rt, prev->id[a++]);
                    if (pos >= 0)
                        out[pos].overlap_blocks = depth;
                }
            }
        }
        prev = h;
        parent = nd;
    }
    if (prev != NULL)
        for (uint32_t a = 0; a < prev->n; a++) {
            int64_t pos = rtab_slot_pos(rt, prev->id[a]);
            if (pos >= 0)
                out[pos].overlap_blocks = depth;
        }
}

/*
 * Overlap walk, conservative: a rank is credited with position d only when
 * it was seen holding every position before d as well, whatever the writer
 * did meanwhile. O(n x holders x log ranks). out[pos].overlap_blocks must
 * be 0 on entry.
 */
static void walk_slow(const struct kvi_slots *s, struct strk *t, const struct rtab *rt,
                      const uint64_t *q, size_t n, struct kvi_slots_potential *out)
{
    const struct ntab *nt = kvi_rcu_deref(t->nodes);
    const struct snode *parent = NULL;
    struct qcur c;
    qcur_init(&c, nt, s->seed, q, n);
    for (size_t depth = 0; depth < n; depth++) {
        const struct snode *nd = nt_find(nt, qcur_take(&c, depth), q[depth], parent);
        if (nd == NULL)
            return;
        const struct shs *h = kvi_rcu_deref(((struct snode *)nd)->hs);
        uint32_t alive = 0;
        for (uint32_t a = 0; a < h->n; a++) {
            int64_t pos = rtab_slot_pos(rt, h->id[a]);
            if (pos >= 0 && out[pos].overlap_blocks == depth) {
                out[pos].overlap_blocks = depth + 1;
                alive++;
            }
        }
        if (alive == 0)
            return;
        parent = nd;
    }
}

int kvi_slots_potential_loads(const struct kvi_slots *s, const struct kvi_slots_key *key,
                              const uint64_t *hashes, size_t n_hashes, uint64_t new_isl_tokens,
                              struct kvi_slots_potential *out, size_t cap, size_t *n_out)
{
    struct strk *t = find_reader(s, key);
    if (t == NULL) {
        *n_out = 0;
        return -ENOENT;
    }
    const struct rtab *rt = kvi_rcu_deref(t->ranks);
    *n_out = rt->n_ranks;
    if (rt->n_ranks > cap)
        return -ENOSPC;
    for (uint32_t i = 0; i < rt->n_ranks; i++) {
        out[i].worker_id = rt->ranks[i]->worker_id;
        out[i].dp_rank = rt->ranks[i]->dp_rank;
        out[i].overlap_blocks = 0;
    }
    if (n_hashes > 0) {
        /* V0: pairs with W2 (ver_end) */
        uint64_t v0 = atomic_load_explicit(&t->version, memory_order_acquire);
        bool ok = false;
        if ((v0 & 1) == 0) {
            walk_fast(s, t, rt, hashes, n_hashes, out);
            /* F1: orders the walk's loads before the re-check; pairs with W1 */
            atomic_thread_fence(memory_order_acquire);
            ok = atomic_load_explicit(&t->version, memory_order_relaxed) == v0;
        }
        if (!ok) {
            for (uint32_t i = 0; i < rt->n_ranks; i++)
                out[i].overlap_blocks = 0;
            walk_slow(s, t, rt, hashes, n_hashes, out);
        }
    }
    for (uint32_t i = 0; i < rt->n_ranks; i++) {
        struct kvi_slots_potential *o = &out[i];
        read_rank(rt->ranks[i], &o->active_decode_blocks, &o->active_prefill_tokens,
                  &o->active_requests);
        o->potential_prefill_tokens = sat_add(o->active_prefill_tokens, new_isl_tokens);
        o->potential_decode_blocks = sat_add(o->active_decode_blocks, n_hashes - o->overlap_blocks);
    }
    return 0;
}

int kvi_slots_tracker_info(const struct kvi_slots *s, const struct kvi_slots_key *key,
                           struct kvi_slots_info *info)
{
    struct strk *t = find_reader(s, key);
    if (t == NULL)
        return -ENOENT;
    const struct rtab *rt = kvi_rcu_deref(t->ranks);
    info->block_size = t->block_size;
    info->n_workers = rt->n_workers;
    info->n_ranks = rt->n_ranks;
    return 0;
}

void kvi_slots_stats(const struct kvi_slots *s, struct kvi_slots_stats *out)
{
#define LD(f) atomic_load_explicit(&((struct kvi_slots *)s)->st.f, memory_order_relaxed)
    out->trackers = LD(trackers);
    out->workers = LD(workers);
    out->ranks = LD(ranks);
    out->requests = LD(requests);
    out->nodes = LD(nodes);
    out->adds = LD(adds);
    out->frees = LD(frees);
    out->prefill_completes = LD(prefill_completes);
    out->expired = LD(expired);
    out->replica_applied = LD(replica_applied);
    out->replica_dropped_tracker = LD(drop_tracker);
    out->replica_dropped_block_size = LD(drop_block_size);
    out->replica_dropped_worker = LD(drop_worker);
    out->replica_dropped_duplicate = LD(drop_duplicate);
    out->replica_dropped_request = LD(drop_request);
    out->events_emitted = LD(events);
    out->refused_trackers = LD(refused_trackers);
    out->refused_ranks = LD(refused_ranks);
#undef LD
}
