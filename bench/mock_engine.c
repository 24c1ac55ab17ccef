/*
 * Mock inference engine (see bench/mock_engine.h for the model).
 *
 * DESIGN
 *   A discrete-event simulation: a binary min-heap of steps (prefill end,
 *   output block filled, request finished) ordered by (time, sequence
 *   number), so steps due at the same time run in the order they were
 *   scheduled. Blocks live in one array; the LRU list of cached free blocks is
 *   doubly linked through it (sentinel at index num_blocks, head = least
 *   recently used) and the free list of uncached blocks is a stack linked
 *   through `next`. The prefix cache maps engine hash -> block index.
 */
#include "bench/mock_engine.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace_map.h"
#include "engine/common.h"

#define NIL UINT32_MAX

struct mblock {
    uint64_t eh;      /* valid when cached */
    uint32_t ref;
    uint32_t prev;    /* LRU link */
    uint32_t next;    /* LRU link, or free-list link */
    bool cached;
};

struct mreq {
    uint64_t tag;
    uint32_t input, output;
    uint32_t n_prompt; /* full prompt blocks */
    uint32_t n_full;   /* full blocks of prompt + output */
    uint32_t n_alloc;  /* n_full + a partial tail block when there is one */
    uint32_t n_hit;
    uint64_t *content; /* n_full */
    uint64_t *eh;      /* n_full, the chain */
    uint32_t *blk;     /* n_alloc */
};

enum step_kind { STEP_PREFILL_END, STEP_FILL, STEP_FINISH };

struct step {
    double t;
    uint64_t seq;
    uint32_t kind;
    uint32_t pos; /* STEP_FILL: block position */
    struct mreq *q;
};

struct kvi_mock_engine {
    struct kvi_mock_cfg cfg;
    kvi_mock_emit_fn emit;
    void *ctx;
    double now;

    struct mblock *b; /* num_blocks + 1 (LRU sentinel) */
    uint32_t free_head, n_free, n_lru, in_use;
    struct kvi_u64map cache; /* engine hash -> block */

    struct step *heap;
    size_t n_heap, cap_heap;
    uint64_t seq;

    struct mreq **wait; /* FIFO ring of waiting requests */
    size_t wait_head, n_wait, cap_wait;

    uint64_t *scratch; /* evicted hashes of one admission */
    size_t cap_scratch;

    struct kvi_mock_stats st;
};

uint64_t kvi_mock_hash(uint64_t parent, uint64_t content)
{
    /* two rounds of a 64-bit finaliser over (parent, content): opaque and
     * unrelated to kvidx's XXH3-based hashes */
    uint64_t x = kvi_fmix64(parent ^ 0x243f6a8885a308d3ull);
    x ^= content + 0x9e3779b97f4a7c15ull + (x << 6) + (x >> 2);
    return kvi_fmix64(x);
}

/* ---- block lists ---------------------------------------------------------- */

static void lru_unlink(struct kvi_mock_engine *e, uint32_t i)
{
    struct mblock *b = &e->b[i];
    e->b[b->prev].next = b->next;
    e->b[b->next].prev = b->prev;
    b->prev = b->next = NIL;
    e->n_lru--;
}

static void lru_push_tail(struct kvi_mock_engine *e, uint32_t i)
{
    uint32_t s = e->cfg.num_blocks;
    struct mblock *b = &e->b[i];
    b->prev = e->b[s].prev;
    b->next = s;
    e->b[b->prev].next = i;
    e->b[s].prev = i;
    e->n_lru++;
}

static void free_push(struct kvi_mock_engine *e, uint32_t i)
{
    e->b[i].next = e->free_head;
    e->free_head = i;
    e->n_free++;
}

static void scratch_reserve(struct kvi_mock_engine *e, size_t n)
{
    if (n <= e->cap_scratch)
        return;
    e->cap_scratch = n > 2 * e->cap_scratch ? n : 2 * e->cap_scratch;
    e->scratch = kvi_xrealloc(e->scratch, e->cap_scratch * sizeof *e->scratch);
}

/* Take one block: from the free list, else evict the LRU cached free block
 * (its hash is appended to scratch[*n_evicted]). */
static uint32_t take_block(struct kvi_mock_engine *e, size_t *n_evicted)
{
    uint32_t i;
    if (e->free_head != NIL) {
        i = e->free_head;
        e->free_head = e->b[i].next;
        e->n_free--;
    } else {
        i = e->b[e->cfg.num_blocks].next; /* LRU head */
        KVI_ASSERT(i != e->cfg.num_blocks);
        lru_unlink(e, i);
        kvi_u64map_del(&e->cache, e->b[i].eh, NULL);
        e->b[i].cached = false;
        scratch_reserve(e, *n_evicted + 1);
        e->scratch[(*n_evicted)++] = e->b[i].eh;
    }
    e->b[i].ref = 1;
    e->in_use++;
    return i;
}

/* Add a reference to a cached block (taking it off the LRU list if free). */
static void ref_cached(struct kvi_mock_engine *e, uint32_t i)
{
    if (e->b[i].ref == 0) {
        lru_unlink(e, i);
        e->in_use++;
    }
    e->b[i].ref++;
}

static void unref(struct kvi_mock_engine *e, uint32_t i)
{
    struct mblock *b = &e->b[i];
    KVI_ASSERT(b->ref > 0);
    if (--b->ref > 0)
        return;
    e->in_use--;
    if (b->cached)
        lru_push_tail(e, i);
    else
        free_push(e, i);
}

/* ---- the step heap -------------------------------------------------------- */

static bool step_before(const struct step *a, const struct step *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void heap_push(struct kvi_mock_engine *e, double t, uint32_t kind, struct mreq *q, uint32_t pos)
{
    if (e->n_heap == e->cap_heap) {
        e->cap_heap = e->cap_heap ? 2 * e->cap_heap : 64;
        e->heap = kvi_xrealloc(e->heap, e->cap_heap * sizeof *e->heap);
    }
    struct step s = {t, e->seq++, kind, pos, q};
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!step_before(&s, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = s;
}

static struct step heap_pop(struct kvi_mock_engine *e)
{
    struct step top = e->heap[0];
    struct step last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && step_before(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!step_before(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n > 0)
        e->heap[i] = last;
    return top;
}

/* ---- requests ------------------------------------------------------------- */

static void req_free(struct mreq *q)
{
    free(q->content);
    free(q->eh);
    free(q->blk);
    free(q);
}

static void emit_stored(struct kvi_mock_engine *e, const struct mreq *q, uint32_t from, uint32_t to)
{
    if (from == to)
        return;
    struct kvi_mock_event ev = {
        .t_ms = e->now,
        .kind = KVI_MOCK_STORED,
        .has_parent = from > 0,
        .parent = from > 0 ? q->eh[from - 1] : 0,
        .n = to - from,
        .engine_hash = q->eh + from,
        .content = q->content + from,
        .tag = q->tag,
        .pos = from,
    };
    e->st.stored_events++;
    e->st.stored_blocks += ev.n;
    e->emit(e->ctx, &ev);
}

/* Blocks [from, to) of q have been computed: cache them, one STORED event per
 * contiguous run of newly cached blocks. */
static void cache_computed(struct kvi_mock_engine *e, struct mreq *q, uint32_t from, uint32_t to)
{
    uint32_t run = from;
    for (uint32_t j = from; j < to; j++) {
        uint64_t other;
        if (kvi_u64map_get(&e->cache, q->eh[j], &other)) {
            /* another request cached the same prefix block meanwhile */
            emit_stored(e, q, run, j);
            run = j + 1;
            unref(e, q->blk[j]);
            ref_cached(e, (uint32_t)other);
            q->blk[j] = (uint32_t)other;
            e->st.late_hits++;
            continue;
        }
        struct mblock *b = &e->b[q->blk[j]];
        b->cached = true;
        b->eh = q->eh[j];
        kvi_u64map_put(&e->cache, q->eh[j], q->blk[j]);
    }
    emit_stored(e, q, run, to);
}

/* Admit q now if its blocks fit. */
static bool try_admit_one(struct kvi_mock_engine *e, struct mreq *q)
{
    uint32_t hit = 0, hit_lru = 0;
    uint64_t bi;
    while (hit < q->n_prompt && kvi_u64map_get(&e->cache, q->eh[hit], &bi)) {
        if (e->b[bi].ref == 0)
            hit_lru++;
        hit++;
    }
    uint64_t need = q->n_alloc - hit;
    if (need > (uint64_t)e->n_free + e->n_lru - hit_lru)
        return false;
    for (uint32_t j = 0; j < hit; j++) {
        kvi_u64map_get(&e->cache, q->eh[j], &bi);
        ref_cached(e, (uint32_t)bi);
        q->blk[j] = (uint32_t)bi;
    }
    size_t n_evicted = 0;
    for (uint32_t j = hit; j < q->n_alloc; j++)
        q->blk[j] = take_block(e, &n_evicted);
    if (e->in_use > e->st.peak_in_use)
        e->st.peak_in_use = e->in_use;
    if (n_evicted > 0) {
        struct kvi_mock_event ev = {
            .t_ms = e->now, .kind = KVI_MOCK_REMOVED, .n = (uint32_t)n_evicted, .engine_hash = e->scratch};
        e->st.removed_events++;
        e->st.removed_blocks += n_evicted;
        e->emit(e->ctx, &ev);
    }
    q->n_hit = hit;
    e->st.hit_blocks += hit;
    e->st.computed_blocks += q->n_prompt - hit;
    uint64_t new_tokens = q->input - (uint64_t)hit * e->cfg.block_size;
    heap_push(e, e->now + (double)new_tokens / e->cfg.prefill_tokens_per_ms, STEP_PREFILL_END, q, 0);
    return true;
}

static void admit_waiting(struct kvi_mock_engine *e)
{
    while (e->n_wait > 0 && try_admit_one(e, e->wait[e->wait_head])) {
        e->wait_head = (e->wait_head + 1) % e->cap_wait;
        e->n_wait--;
    }
}

static void wait_push(struct kvi_mock_engine *e, struct mreq *q)
{
    if (e->n_wait == e->cap_wait) {
        size_t cap = e->cap_wait ? 2 * e->cap_wait : 16;
        struct mreq **w = kvi_xmalloc(cap * sizeof *w);
        for (size_t i = 0; i < e->n_wait; i++)
            w[i] = e->wait[(e->wait_head + i) % e->cap_wait];
        free(e->wait);
        e->wait = w;
        e->wait_head = 0;
        e->cap_wait = cap;
    }
    e->wait[(e->wait_head + e->n_wait) % e->cap_wait] = q;
    e->n_wait++;
}

static void run_step(struct kvi_mock_engine *e, const struct step *s)
{
    struct mreq *q = s->q;
    switch (s->kind) {
    case STEP_PREFILL_END:
        cache_computed(e, q, q->n_hit, q->n_prompt);
        for (uint32_t j = q->n_prompt; j < q->n_full; j++) {
            uint64_t k = (uint64_t)(j + 1) * e->cfg.block_size - q->input; /* output tokens to fill block j */
            heap_push(e, e->now + (double)k * e->cfg.decode_ms_per_token, STEP_FILL, q, j);
        }
        heap_push(e, e->now + (double)q->output * e->cfg.decode_ms_per_token, STEP_FINISH, q, 0);
        break;
    case STEP_FILL:
        cache_computed(e, q, s->pos, s->pos + 1);
        break;
    case STEP_FINISH:
        for (uint32_t j = q->n_alloc; j-- > 0;)
            unref(e, q->blk[j]);
        e->st.completed++;
        req_free(q);
        admit_waiting(e);
        break;
    }
}

void kvi_mock_advance(struct kvi_mock_engine *e, double t_ms)
{
    while (e->n_heap > 0 && e->heap[0].t <= t_ms) {
        struct step s = heap_pop(e);
        if (s.t > e->now)
            e->now = s.t;
        run_step(e, &s);
    }
    if (t_ms > e->now && !isinf(t_ms))
        e->now = t_ms;
}

int kvi_mock_submit(struct kvi_mock_engine *e, const struct kvi_mock_request *r)
{
    kvi_mock_advance(e, r->arrival_ms);
    e->st.requests++;
    uint32_t bs = e->cfg.block_size;
    uint64_t total = (uint64_t)r->input_tokens + r->output_tokens;
    uint64_t n_full = total / bs, n_alloc = n_full + (total % bs ? 1 : 0);
    if (n_alloc > e->cfg.num_blocks) {
        e->st.dropped++;
        return -E2BIG;
    }
    struct mreq *q = kvi_xcalloc(1, sizeof *q);
    q->tag = r->tag;
    q->input = r->input_tokens;
    q->output = r->output_tokens;
    q->n_prompt = r->input_tokens / bs;
    q->n_full = (uint32_t)n_full;
    q->n_alloc = (uint32_t)n_alloc;
    q->content = kvi_xmalloc(n_full * sizeof *q->content);
    q->eh = kvi_xmalloc(n_full * sizeof *q->eh);
    q->blk = kvi_xmalloc(n_alloc * sizeof *q->blk);
    memcpy(q->content, r->content, n_full * sizeof *q->content);
    uint64_t h = e->cfg.hash_seed;
    for (uint32_t j = 0; j < n_full; j++)
        q->eh[j] = h = kvi_mock_hash(h, q->content[j]);
    if (e->n_wait == 0 && try_admit_one(e, q))
        return 0;
    e->st.waited++;
    wait_push(e, q);
    return 0;
}

void kvi_mock_drain(struct kvi_mock_engine *e)
{
    kvi_mock_advance(e, INFINITY);
    KVI_ASSERT(e->n_wait == 0);
}

struct kvi_mock_engine *kvi_mock_create(const struct kvi_mock_cfg *cfg, kvi_mock_emit_fn emit, void *ctx)
{
    if (cfg->num_blocks == 0 || cfg->num_blocks >= NIL || cfg->block_size == 0 ||
        !(cfg->prefill_tokens_per_ms > 0) || !(cfg->decode_ms_per_token >= 0) || emit == NULL) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_mock_engine *e = kvi_xcalloc(1, sizeof *e);
    e->cfg = *cfg;
    e->emit = emit;
    e->ctx = ctx;
    e->b = kvi_xcalloc((size_t)cfg->num_blocks + 1, sizeof *e->b);
    uint32_t s = cfg->num_blocks;
    e->b[s].prev = e->b[s].next = s;
    e->free_head = NIL;
    for (uint32_t i = cfg->num_blocks; i-- > 0;)
        free_push(e, i);
    kvi_u64map_init(&e->cache);
    return e;
}

void kvi_mock_destroy(struct kvi_mock_engine *e)
{
    if (e == NULL)
        return;
    /* free every request once: a waiting one is only in the wait queue; a
     * running one has exactly one pending STEP_PREFILL_END or STEP_FINISH */
    for (size_t i = 0; i < e->n_heap; i++)
        if (e->heap[i].kind == STEP_FINISH || e->heap[i].kind == STEP_PREFILL_END)
            req_free(e->heap[i].q);
    for (size_t i = 0; i < e->n_wait; i++)
        req_free(e->wait[(e->wait_head + i) % e->cap_wait]);
    free(e->heap);
    free(e->wait);
    free(e->scratch);
    kvi_u64map_free(&e->cache);
    free(e->b);
    free(e);
}

void kvi_mock_stats(const struct kvi_mock_engine *e, struct kvi_mock_stats *st)
{
    *st = e->st;
}

uint32_t kvi_mock_cached_blocks(const struct kvi_mock_engine *e)
{
    return (uint32_t)kvi_u64map_size(&e->cache);
}

bool kvi_mock_is_cached(const struct kvi_mock_engine *e, uint64_t engine_hash)
{
    return kvi_u64map_get(&e->cache, engine_hash, NULL);
}
