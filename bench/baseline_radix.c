/*
 * Baseline compressed radix tree behind one rwlock (see bench/baseline_radix.h).
 *
 * DESIGN
 *   Blocks are records {content, node, offset} that never move, so the
 *   per-worker lookup tables (engine hash -> block record) stay valid when a
 *   node is split or merged: only the records of the moved blocks are
 *   rewritten. A block record is freed with its node, which happens only
 *   when the node has no holders and no children, so no lookup entry can
 *   point at it (a worker's lookup entries name blocks it holds).
 *   Queries walk from the root, comparing the query with each edge, and
 *   intersect the active worker set with each child's set; a worker that
 *   drops out scores the depth reached so far.
 */
#include "bench/baseline_radix.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "bench/trace_map.h"
#include "engine/common.h"

struct rnode;

struct rblock {
    uint64_t content;
    struct rnode *node;
    uint32_t off;
};

struct rnode {
    struct rnode *parent;
    uint64_t *content;    /* the edge */
    struct rblock **blk;  /* its block records */
    uint32_t len, cap;
    uint32_t *wk;         /* sorted holders of the whole edge */
    uint32_t n_wk, cap_wk;
    struct kvi_u64map children; /* first content hash -> struct rnode * */
};

struct kvi_bl_radix {
    pthread_rwlock_t lock;
    struct rnode root;
    uint32_t n_workers;
    struct kvi_u64map *lookup; /* per worker: engine hash -> struct rblock * */
    uint64_t holdings, nodes;
};

/* ---- nodes ------------------------------------------------------------------- */

static struct rnode *node_new(struct rnode *parent)
{
    struct rnode *x = kvi_xcalloc(1, sizeof *x);
    x->parent = parent;
    kvi_u64map_init(&x->children);
    return x;
}

static void edge_reserve(struct rnode *x, uint32_t n)
{
    if (n <= x->cap)
        return;
    uint32_t cap = x->cap ? x->cap : 4;
    while (cap < n)
        cap *= 2;
    x->content = kvi_xrealloc(x->content, cap * sizeof *x->content);
    x->blk = kvi_xrealloc(x->blk, cap * sizeof *x->blk);
    x->cap = cap;
}

static void wk_reserve(struct rnode *x, uint32_t n)
{
    if (n <= x->cap_wk)
        return;
    uint32_t cap = x->cap_wk ? 2 * x->cap_wk : 4;
    while (cap < n)
        cap *= 2;
    x->wk = kvi_xrealloc(x->wk, cap * sizeof *x->wk);
    x->cap_wk = cap;
}

/* Index of the first holder >= w. */
static uint32_t wk_lower(const struct rnode *x, uint32_t w)
{
    uint32_t lo = 0, hi = x->n_wk;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (x->wk[mid] < w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool wk_has(const struct rnode *x, uint32_t w)
{
    uint32_t i = wk_lower(x, w);
    return i < x->n_wk && x->wk[i] == w;
}

static void wk_add(struct kvi_bl_radix *t, struct rnode *x, uint32_t w)
{
    uint32_t i = wk_lower(x, w);
    if (i < x->n_wk && x->wk[i] == w)
        return;
    wk_reserve(x, x->n_wk + 1);
    memmove(x->wk + i + 1, x->wk + i, (x->n_wk - i) * sizeof *x->wk);
    x->wk[i] = w;
    x->n_wk++;
    t->holdings += x->len;
}

static void wk_del(struct kvi_bl_radix *t, struct rnode *x, uint32_t w)
{
    uint32_t i = wk_lower(x, w);
    if (i >= x->n_wk || x->wk[i] != w)
        return;
    memmove(x->wk + i, x->wk + i + 1, (x->n_wk - i - 1) * sizeof *x->wk);
    x->n_wk--;
    t->holdings -= x->len;
}

static void node_free(struct rnode *x, bool with_blocks)
{
    if (with_blocks)
        for (uint32_t i = 0; i < x->len; i++)
            free(x->blk[i]);
    free(x->content);
    free(x->blk);
    free(x->wk);
    kvi_u64map_free(&x->children);
    free(x);
}

/* Move the children map of @p from to @p to (which has none), re-parenting. */
static void adopt_children(struct rnode *to, struct rnode *from)
{
    to->children = from->children;
    kvi_u64map_init(&from->children);
    size_t pos = 0;
    uint64_t k, v;
    while (kvi_u64map_next(&to->children, &pos, &k, &v))
        ((struct rnode *)(uintptr_t)v)->parent = to;
}

/* Split @p x before edge offset @p k (0 < k < len): x keeps [0, k), a new
 * only child takes the rest with the same holders and x's children. */
static struct rnode *split(struct kvi_bl_radix *t, struct rnode *x, uint32_t k)
{
    KVI_ASSERT(k > 0 && k < x->len);
    struct rnode *tail = node_new(x);
    uint32_t n = x->len - k;
    edge_reserve(tail, n);
    memcpy(tail->content, x->content + k, n * sizeof *tail->content);
    memcpy(tail->blk, x->blk + k, n * sizeof *tail->blk);
    tail->len = n;
    for (uint32_t i = 0; i < n; i++) {
        tail->blk[i]->node = tail;
        tail->blk[i]->off = i;
    }
    wk_reserve(tail, x->n_wk);
    memcpy(tail->wk, x->wk, x->n_wk * sizeof *tail->wk);
    tail->n_wk = x->n_wk;
    adopt_children(tail, x);
    x->len = k;
    kvi_u64map_put(&x->children, tail->content[0], (uint64_t)(uintptr_t)tail);
    t->nodes++;
    return tail;
}

static bool same_holders(const struct rnode *a, const struct rnode *b)
{
    return a->n_wk == b->n_wk && !memcmp(a->wk, b->wk, a->n_wk * sizeof *a->wk);
}

/* Absorb x's only child when both have the same holders. */
static void merge_child(struct kvi_bl_radix *t, struct rnode *x)
{
    if (x == &t->root || kvi_u64map_size(&x->children) != 1)
        return;
    size_t pos = 0;
    uint64_t k, v;
    kvi_u64map_next(&x->children, &pos, &k, &v);
    struct rnode *c = (struct rnode *)(uintptr_t)v;
    if (!same_holders(x, c))
        return;
    edge_reserve(x, x->len + c->len);
    for (uint32_t i = 0; i < c->len; i++) {
        x->content[x->len + i] = c->content[i];
        x->blk[x->len + i] = c->blk[i];
        c->blk[i]->node = x;
        c->blk[i]->off = x->len + i;
    }
    /* holdings: c's holders held c's blocks and now hold them as x's */
    x->len += c->len;
    kvi_u64map_free(&x->children);
    adopt_children(x, c);
    node_free(c, false);
    t->nodes--;
}

/* After holders left @p x: drop it (and emptied ancestors) when it has no
 * holders and no children, and re-compress around it. */
static void tidy(struct kvi_bl_radix *t, struct rnode *x)
{
    while (x != &t->root && x->n_wk == 0 && kvi_u64map_size(&x->children) == 0) {
        struct rnode *p = x->parent;
        kvi_u64map_del(&p->children, x->content[0], NULL);
        node_free(x, true);
        t->nodes--;
        x = p;
    }
    if (x == &t->root)
        return;
    merge_child(t, x);
    if (x->parent != &t->root)
        merge_child(t, x->parent);
}

/* ---- API ---------------------------------------------------------------------- */

struct kvi_bl_radix *kvi_bl_radix_create(uint32_t n_workers)
{
    struct kvi_bl_radix *t = kvi_xcalloc(1, sizeof *t);
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    if (pthread_rwlock_init(&t->lock, &a) != 0)
        kvi_die("rwlock init");
    pthread_rwlockattr_destroy(&a);
    kvi_u64map_init(&t->root.children);
    t->n_workers = n_workers;
    t->lookup = kvi_xcalloc(n_workers ? n_workers : 1, sizeof *t->lookup);
    for (uint32_t i = 0; i < n_workers; i++)
        kvi_u64map_init(&t->lookup[i]);
    return t;
}

static void free_subtree(struct rnode *x)
{
    size_t pos = 0;
    uint64_t k, v;
    while (kvi_u64map_next(&x->children, &pos, &k, &v))
        free_subtree((struct rnode *)(uintptr_t)v);
    node_free(x, true);
}

void kvi_bl_radix_destroy(struct kvi_bl_radix *t)
{
    if (t == NULL)
        return;
    /* iterative over the root's children; depth of the recursion below is
     * the number of branching nodes on a path, bounded by the query depth */
    size_t pos = 0;
    uint64_t k, v;
    while (kvi_u64map_next(&t->root.children, &pos, &k, &v))
        free_subtree((struct rnode *)(uintptr_t)v);
    kvi_u64map_free(&t->root.children);
    for (uint32_t i = 0; i < t->n_workers; i++)
        kvi_u64map_free(&t->lookup[i]);
    free(t->lookup);
    pthread_rwlock_destroy(&t->lock);
    free(t);
}

/* New leaf under @p p with blocks [0, n) held by @p w. */
static void add_leaf(struct kvi_bl_radix *t, struct rnode *p, uint32_t w, const uint64_t *eh, const uint64_t *c,
                     size_t n)
{
    struct rnode *x = node_new(p);
    edge_reserve(x, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        struct rblock *b = kvi_xmalloc(sizeof *b);
        *b = (struct rblock){c[i], x, (uint32_t)i};
        x->content[i] = c[i];
        x->blk[i] = b;
        kvi_u64map_put(&t->lookup[w], eh[i], (uint64_t)(uintptr_t)b);
    }
    x->len = (uint32_t)n;
    wk_add(t, x, w);
    kvi_u64map_put(&p->children, c[0], (uint64_t)(uintptr_t)x);
    t->nodes++;
}

static int store_locked(struct kvi_bl_radix *t, uint32_t w, bool has_parent, uint64_t parent, const uint64_t *eh,
                        const uint64_t *c, size_t n)
{
    struct kvi_u64map *lk = &t->lookup[w];
    struct rnode *x = &t->root;
    uint32_t next = 0; /* edge offset of the next block */
    if (has_parent) {
        uint64_t v;
        if (!kvi_u64map_get(lk, parent, &v))
            return -ENOENT;
        struct rblock *pb = (struct rblock *)(uintptr_t)v;
        if (!wk_has(pb->node, w))
            return -ENOENT;
        x = pb->node;
        next = pb->off + 1;
    }
    size_t i = 0;
    while (i < n) {
        if (next < x->len) {
            if (x->content[next] == c[i]) { /* w holds all of x */
                kvi_u64map_put(lk, eh[i], (uint64_t)(uintptr_t)x->blk[next]);
                next++;
                i++;
                continue;
            }
            split(t, x, next);
        }
        uint64_t v;
        if (!kvi_u64map_get(&x->children, c[i], &v)) {
            add_leaf(t, x, w, eh + i, c + i, n - i);
            return 0;
        }
        struct rnode *ch = (struct rnode *)(uintptr_t)v;
        uint32_t m = 0;
        while (m < ch->len && i + m < n && ch->content[m] == c[i + m])
            m++;
        if (!wk_has(ch, w)) {
            if (m < ch->len)
                split(t, ch, m);
            wk_add(t, ch, w);
        }
        for (uint32_t j = 0; j < m; j++)
            kvi_u64map_put(lk, eh[i + j], (uint64_t)(uintptr_t)ch->blk[j]);
        i += m;
        x = ch;
        next = m;
    }
    return 0;
}

int kvi_bl_radix_store(struct kvi_bl_radix *t, uint32_t worker, bool has_parent, uint64_t parent,
                       const uint64_t *engine_hash, const uint64_t *content, size_t n)
{
    if (worker >= t->n_workers)
        return -EINVAL;
    if (n == 0)
        return 0;
    pthread_rwlock_wrlock(&t->lock);
    int r = store_locked(t, worker, has_parent, parent, engine_hash, content, n);
    pthread_rwlock_unlock(&t->lock);
    return r;
}

size_t kvi_bl_radix_remove(struct kvi_bl_radix *t, uint32_t worker, const uint64_t *engine_hash, size_t n)
{
    if (worker >= t->n_workers)
        return 0;
    size_t known = 0;
    pthread_rwlock_wrlock(&t->lock);
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        if (!kvi_u64map_del(&t->lookup[worker], engine_hash[i], &v))
            continue;
        known++;
        struct rblock *b = (struct rblock *)(uintptr_t)v;
        struct rnode *x = b->node;
        if (!wk_has(x, worker))
            continue;
        uint32_t off = b->off;
        if (x->n_wk == 1 && off + 1 == x->len && off > 0 && kvi_u64map_size(&x->children) == 0) {
            /* the sole holder drops the last block of a leaf (eviction takes
             * leaves first): shorten the edge instead of splitting it off */
            free(x->blk[off]);
            x->len--;
            t->holdings--;
            continue;
        }
        if (off + 1 < x->len)
            split(t, x, off + 1);
        if (off > 0)
            x = split(t, x, off);
        wk_del(t, x, worker);
        tidy(t, x);
    }
    pthread_rwlock_unlock(&t->lock);
    return known;
}

static void scratch_reserve(struct kvi_bl_scratch *s, size_t n)
{
    if (n <= s->cap_ab)
        return;
    size_t cap = s->cap_ab ? 2 * s->cap_ab : 64;
    while (cap < n)
        cap *= 2;
    s->a = kvi_xrealloc(s->a, cap * sizeof *s->a);
    s->b = kvi_xrealloc(s->b, cap * sizeof *s->b);
    s->cap_ab = cap;
}

size_t kvi_bl_radix_find(struct kvi_bl_radix *t, struct kvi_bl_scratch *s, const uint64_t *content, size_t n,
                         struct kvi_bl_score *out, size_t cap)
{
    if (n == 0)
        return 0;
    size_t k = 0;
    scratch_reserve(s, t->n_workers);
    pthread_rwlock_rdlock(&t->lock);
    uint64_t v;
    if (!kvi_u64map_get(&t->root.children, content[0], &v)) {
        pthread_rwlock_unlock(&t->lock);
        return 0;
    }
    struct rnode *x = (struct rnode *)(uintptr_t)v;
    uint32_t *act = s->a, *nxt = s->b;
    uint32_t n_act = x->n_wk;
    memcpy(act, x->wk, n_act * sizeof *act);
    size_t pos = 0;
    while (n_act > 0) {
        uint32_t m = 0;
        while (m < x->len && pos < n && x->content[m] == content[pos]) {
            m++;
            pos++;
        }
        if (m < x->len || pos == n || !kvi_u64map_get(&x->children, content[pos], &v))
            break;
        x = (struct rnode *)(uintptr_t)v;
        /* active ∩ holders of the child; the rest score pos */
        uint32_t n_nxt = 0, j = 0;
        for (uint32_t i = 0; i < n_act; i++) {
            while (j < x->n_wk && x->wk[j] < act[i])
                j++;
            if (j < x->n_wk && x->wk[j] == act[i]) {
                nxt[n_nxt++] = act[i];
            } else {
                if (k < cap)
                    out[k] = (struct kvi_bl_score){act[i], (uint32_t)pos};
                k++;
            }
        }
        uint32_t *tmp = act;
        act = nxt;
        nxt = tmp;
        n_act = n_nxt;
    }
    for (uint32_t i = 0; i < n_act; i++) {
        if (k < cap)
            out[k] = (struct kvi_bl_score){act[i], (uint32_t)pos};
        k++;
    }
    pthread_rwlock_unlock(&t->lock);
    return k;
}

uint64_t kvi_bl_radix_holdings(struct kvi_bl_radix *t)
{
    pthread_rwlock_rdlock(&t->lock);
    uint64_t h = t->holdings;
    pthread_rwlock_unlock(&t->lock);
    return h;
}

uint64_t kvi_bl_radix_nodes(struct kvi_bl_radix *t)
{
    pthread_rwlock_rdlock(&t->lock);
    uint64_t h = t->nodes;
    pthread_rwlock_unlock(&t->lock);
    return h;
}
