/*
 * Trace -> timeline (see bench/trace.h).
 *
 * DESIGN
 *   1. Content hashes: request r's tokens are its hash ids' synthesised
 *      tokens (512 per id, truncated to its input length), then its output
 *      tokens (synthesised per request). Every full block of block_size
 *      tokens is hashed as kvidx's router would (kvi_hash_block, seed 1337).
 *      Prompt blocks lie inside one id (block_size divides 512), so they are
 *      hashed once per (id, sub-block) and cached.
 *   2. Partition: each session (each request when the trace has none) goes
 *      to a worker drawn uniformly with a seeded generator.
 *   3. Simulation: the trace's arrival span is squeezed into sim_ms of
 *      engine time; each worker's requests run through its own mock engine
 *      (finite pool, prefix caching, LRU eviction, opaque engine hashes),
 *      which yields its STORE and REMOVE events; a QUERY entry marks each
 *      arrival, before the engine admits the request.
 *   4. Merge: all entries sorted by (time, worker, generation order), so a
 *      worker's entries keep the order its engine produced them. Replicas
 *      (worker_dup) repeat every worker's timeline under worker ids
 *      w + r * n_workers, sharing the hash arrays.
 *   Single-threaded; the replay (trace_replay.c) only reads the result.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/mock_engine.h"
#include "bench/trace.h"
#include "bench/trace_map.h"
#include "engine/common.h"
#include "engine/hash.h"

#define CHUNK_WORDS (1u << 20)

struct kvi_trace_chunk {
    struct kvi_trace_chunk *next;
    size_t used, cap;
    uint64_t data[];
};

void kvi_trace_workload_defaults(struct kvi_trace_workload_cfg *c)
{
    *c = (struct kvi_trace_workload_cfg){
        .n_workers = 128,
        .worker_dup = 1,
        .block_size = 128,
        .gpu_blocks = 2048,
        .sim_ms = 30000.0,
        .speedup = 10.0,
        .prefill_tok_per_s = 20000.0,
        .decode_ms_per_tok = 20.0,
        .distinct_tokens = false,
        .seed = 42,
    };
}

uint64_t *kvi_trace__alloc_hashes(struct kvi_trace_workload *w, size_t n)
{
    struct kvi_trace_chunk *c = w->chunks;
    if (c == NULL || c->cap - c->used < n) {
        size_t cap = n > CHUNK_WORDS ? n : CHUNK_WORDS;
        c = kvi_xmalloc(sizeof *c + cap * sizeof(uint64_t));
        c->cap = cap;
        c->used = 0;
        c->next = w->chunks;
        w->chunks = c;
    }
    uint64_t *p = c->data + c->used;
    c->used += n;
    return p;
}

/* ---- tokens ----------------------------------------------------------------- */

static inline uint32_t prompt_token(bool distinct, uint64_t id, uint32_t j)
{
    return distinct ? (uint32_t)(kvi_fmix64(id * KVI_TRACE_ID_TOKENS + j + 1) & 0x7fffffffu) : (uint32_t)id;
}

static inline uint32_t output_token(uint32_t req, uint64_t k)
{
    return (uint32_t)(kvi_fmix64(((uint64_t)req << 32 | k) ^ 0x6f75747075747321ull) & 0x7fffffffu);
}

/* Prompt tokens available from the ids (a trace may claim more than its ids cover). */
static uint64_t eff_input(const struct kvi_trace_request *r)
{
    return KVI_MIN((uint64_t)r->input_len, (uint64_t)r->n_ids * KVI_TRACE_ID_TOKENS);
}

static uint32_t token_at(const struct kvi_trace *t, bool distinct, uint32_t req, uint64_t k)
{
    const struct kvi_trace_request *r = &t->req[req];
    uint64_t in = eff_input(r);
    if (k < in)
        return prompt_token(distinct, t->ids[r->ids_off + k / KVI_TRACE_ID_TOKENS], (uint32_t)(k % KVI_TRACE_ID_TOKENS));
    return output_token(req, k - in);
}

void kvi_trace_block_tokens(const struct kvi_trace_workload *w, uint32_t req, uint32_t pos, uint32_t *tokens)
{
    uint32_t bs = w->cfg.block_size;
    for (uint32_t i = 0; i < bs; i++)
        tokens[i] = token_at(w->trace, w->cfg.distinct_tokens, req, (uint64_t)pos * bs + i);
}

/* Content hashes of one id's sub-blocks, cached per id. */
struct id_cache {
    struct kvi_u64map map; /* id -> offset in h */
    uint64_t *h;
    size_t n, cap;
    uint32_t per_id, bs;
    bool distinct;
    uint32_t *tok;
};

static const uint64_t *id_hashes(struct id_cache *c, uint64_t id)
{
    uint64_t off;
    if (kvi_u64map_get(&c->map, id, &off))
        return c->h + off;
    if (c->n + c->per_id > c->cap) {
        c->cap = c->cap ? 2 * c->cap : 65536;
        c->h = kvi_xrealloc(c->h, c->cap * sizeof *c->h);
    }
    off = c->n;
    for (uint32_t s = 0; s < c->per_id; s++) {
        for (uint32_t i = 0; i < c->bs; i++)
            c->tok[i] = prompt_token(c->distinct, id, s * c->bs + i);
        c->h[off + s] = kvi_hash_block(c->tok, c->bs, KVI_HASH_SEED);
    }
    c->n += c->per_id;
    kvi_u64map_put(&c->map, id, off);
    return c->h + off;
}

/* Content hashes of request r's full blocks (prompt, then output). */
static void request_content(struct kvi_trace_workload *w, struct id_cache *ic, uint32_t r, uint32_t *tok)
{
    const struct kvi_trace *t = w->trace;
    const struct kvi_trace_request *q = &t->req[r];
    uint32_t bs = w->cfg.block_size;
    uint64_t in = eff_input(q);
    uint32_t n_prompt = (uint32_t)(in / bs);
    uint32_t n_full = (uint32_t)((in + q->output_len) / bs);
    uint64_t *c = kvi_trace__alloc_hashes(w, n_full ? n_full : 1);
    for (uint32_t j = 0; j < n_prompt; j++) {
        uint64_t id = t->ids[q->ids_off + (uint64_t)j / ic->per_id];
        c[j] = id_hashes(ic, id)[j % ic->per_id];
    }
    for (uint32_t j = n_prompt; j < n_full; j++) {
        for (uint32_t i = 0; i < bs; i++)
            tok[i] = token_at(t, w->cfg.distinct_tokens, r, (uint64_t)j * bs + i);
        c[j] = kvi_hash_block(tok, bs, KVI_HASH_SEED);
    }
    w->req_content[r] = c;
    w->req_blocks[r] = n_prompt;
}

/* ---- simulation -------------------------------------------------------------- */

struct entry_vec {
    struct kvi_trace_entry *e;
    size_t n, cap;
};

static struct kvi_trace_entry *entry_push(struct entry_vec *v)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 65536;
        v->e = kvi_xrealloc(v->e, v->cap * sizeof *v->e);
    }
    struct kvi_trace_entry *e = &v->e[v->n++];
    memset(e, 0, sizeof *e);
    return e;
}

struct sim_ctx {
    struct kvi_trace_workload *w;
    struct entry_vec *v;
    uint32_t worker;
};

static uint64_t ms_to_ns(double ms)
{
    return ms <= 0 ? 0 : (uint64_t)llround(ms * 1e6);
}

static void on_event(void *ctx, const struct kvi_mock_event *ev)
{
    struct sim_ctx *s = ctx;
    struct kvi_trace_entry *e = entry_push(s->v);
    e->t_ns = ms_to_ns(ev->t_ms);
    e->worker = s->worker;
    e->n = ev->n;
    uint64_t *eh = kvi_trace__alloc_hashes(s->w, ev->n);
    memcpy(eh, ev->engine_hash, ev->n * sizeof *eh);
    e->engine_hash = eh;
    if (ev->kind == KVI_MOCK_STORED) {
        e->kind = KVI_TRACE_STORE;
        e->has_parent = ev->has_parent;
        e->parent = ev->parent;
        e->req = (uint32_t)ev->tag;
        e->pos = ev->pos;
        e->content = s->w->req_content[ev->tag] + ev->pos;
        s->w->st.stores++;
        s->w->st.stored_blocks += ev->n;
    } else {
        e->kind = KVI_TRACE_REMOVE;
        s->w->st.removes++;
        s->w->st.removed_blocks += ev->n;
    }
}

static int cmp_entry(const void *a, const void *b)
{
    const struct kvi_trace_entry *x = a, *y = b;
    if (x->t_ns != y->t_ns)
        return x->t_ns < y->t_ns ? -1 : 1;
    return (x->worker > y->worker) - (x->worker < y->worker);
}

/* An entry with its generation order (its index before sorting), so entries
 * of one worker at one time keep the order their engine produced them. */
struct keyed {
    struct kvi_trace_entry e;
    uint64_t gen;
};

static int cmp_keyed(const void *a, const void *b)
{
    const struct keyed *x = a, *y = b;
    int c = cmp_entry(&x->e, &y->e);
    if (c)
        return c;
    return (x->gen > y->gen) - (x->gen < y->gen);
}

static void sort_entries(struct kvi_trace_entry *e, size_t n)
{
    struct keyed *k = kvi_xmalloc((n ? n : 1) * sizeof *k);
    for (size_t i = 0; i < n; i++)
        k[i] = (struct keyed){e[i], i};
    qsort(k, n, sizeof *k, cmp_keyed);
    for (size_t i = 0; i < n; i++)
        e[i] = k[i].e;
    free(k);
}

int kvi_trace_workload_build(struct kvi_trace_workload *w, const struct kvi_trace *t,
                             const struct kvi_trace_workload_cfg *cfg, kvi_trace_progress_fn progress, void *pctx)
{
    memset(w, 0, sizeof *w);
    if (cfg->n_workers == 0 || cfg->worker_dup == 0 || cfg->block_size == 0 ||
        KVI_TRACE_ID_TOKENS % cfg->block_size != 0 || cfg->gpu_blocks == 0 || t->n_req == 0 ||
        t->n_req > UINT32_MAX || (uint64_t)cfg->n_workers * cfg->worker_dup > UINT32_MAX ||
        !(cfg->speedup > 0) || !(cfg->prefill_tok_per_s > 0) || !(cfg->decode_ms_per_tok >= 0))
        return -EINVAL;
    w->cfg = *cfg;
    w->trace = t;
    w->n_workers_total = cfg->n_workers * cfg->worker_dup;
    size_t nr = t->n_req;
    w->req_content = kvi_xcalloc(nr, sizeof *w->req_content);
    w->req_blocks = kvi_xcalloc(nr, sizeof *w->req_blocks);
    w->worker_of_req = kvi_xcalloc(nr, sizeof *w->worker_of_req);

    /* 1. content hashes */
    struct id_cache ic = {.per_id = KVI_TRACE_ID_TOKENS / cfg->block_size, .bs = cfg->block_size,
                          .distinct = cfg->distinct_tokens};
    kvi_u64map_init(&ic.map);
    ic.tok = kvi_xmalloc(cfg->block_size * sizeof *ic.tok);
    uint32_t *tok = kvi_xmalloc(cfg->block_size * sizeof *tok);
    for (uint32_t r = 0; r < nr; r++)
        request_content(w, &ic, r, tok);
    kvi_u64map_free(&ic.map);
    free(ic.h);
    free(ic.tok);

    /* 2. partition sessions */
    uint64_t rng = cfg->seed;
    struct kvi_u64map sess;
    kvi_u64map_init(&sess);
    uint32_t *count = kvi_xcalloc(cfg->n_workers + 1, sizeof *count);
    for (uint32_t r = 0; r < nr; r++) {
        uint64_t wk;
        if (!kvi_u64map_get(&sess, t->req[r].session, &wk)) {
            wk = kvi_bench_rand(&rng) % cfg->n_workers;
            kvi_u64map_put(&sess, t->req[r].session, wk);
        }
        w->worker_of_req[r] = (uint32_t)wk;
        count[wk + 1]++;
    }
    kvi_u64map_free(&sess);
    for (uint32_t i = 0; i < cfg->n_workers; i++)
        count[i + 1] += count[i];
    uint32_t *order = kvi_xmalloc(nr * sizeof *order); /* requests grouped by worker, in time order */
    uint32_t *fill = kvi_xmalloc(cfg->n_workers * sizeof *fill);
    memcpy(fill, count, cfg->n_workers * sizeof *fill);
    for (uint32_t r = 0; r < nr; r++)
        order[fill[w->worker_of_req[r]]++] = r;
    free(fill);

    /* 3. simulate every worker */
    double t0 = (double)t->req[0].t_ms;
    double span = (double)(t->req[nr - 1].t_ms - t->req[0].t_ms);
    double scale = cfg->sim_ms > 0 && span > 0 ? cfg->sim_ms / span : 1.0;
    struct kvi_mock_cfg mc = {
        .num_blocks = cfg->gpu_blocks,
        .block_size = cfg->block_size,
        .prefill_tokens_per_ms = cfg->prefill_tok_per_s / 1000.0 * cfg->speedup,
        .decode_ms_per_token = cfg->decode_ms_per_tok / cfg->speedup,
    };
    struct entry_vec v = {0};
    for (uint32_t wk = 0; wk < cfg->n_workers; wk++) {
        mc.hash_seed = kvi_fmix64(cfg->seed * 0x100000001b3ull + wk + 1);
        struct sim_ctx sc = {w, &v, wk};
        struct kvi_mock_engine *eng = kvi_mock_create(&mc, on_event, &sc);
        if (eng == NULL)
            kvi_die("mock engine: invalid configuration");
        for (uint32_t i = count[wk]; i < count[wk + 1]; i++) {
            uint32_t r = order[i];
            double at = ((double)t->req[r].t_ms - t0) * scale;
            kvi_mock_advance(eng, at);
            if (w->req_blocks[r] > 0) {
                struct kvi_trace_entry *e = entry_push(&v);
                e->t_ns = ms_to_ns(at);
                e->worker = wk;
                e->kind = KVI_TRACE_QUERY;
                e->n = w->req_blocks[r];
                e->req = r;
                e->content = w->req_content[r];
                w->st.queries++;
                w->st.query_blocks += e->n;
            }
            struct kvi_mock_request mr = {
                .tag = r,
                .arrival_ms = at,
                .input_tokens = (uint32_t)eff_input(&t->req[r]),
                .output_tokens = t->req[r].output_len,
                .content = w->req_content[r],
            };
            kvi_mock_submit(eng, &mr);
        }
        kvi_mock_drain(eng);
        struct kvi_mock_stats ms;
        kvi_mock_stats(eng, &ms);
        w->st.dropped += ms.dropped;
        w->st.waited += ms.waited;
        w->st.hit_blocks += ms.hit_blocks;
        w->st.computed_blocks += ms.computed_blocks;
        kvi_mock_destroy(eng);
        if (progress)
            progress(pctx, wk + 1, cfg->n_workers);
    }
    free(order);
    free(count);
    free(tok);

    /* 4. replicas, then the merge */
    size_t base = v.n, n = base * cfg->worker_dup;
    w->e = kvi_xrealloc(v.e, (n ? n : 1) * sizeof *w->e);
    for (uint32_t r = 1; r < cfg->worker_dup; r++)
        for (size_t i = 0; i < base; i++) {
            w->e[r * base + i] = w->e[i];
            w->e[r * base + i].worker += r * cfg->n_workers;
        }
    w->n = n;
    uint64_t d = cfg->worker_dup; /* the engines ran once; replicas repeat their output */
    w->st.queries *= d;
    w->st.query_blocks *= d;
    w->st.stores *= d;
    w->st.stored_blocks *= d;
    w->st.removes *= d;
    w->st.removed_blocks *= d;
    sort_entries(w->e, w->n);
    w->span_ns = w->n ? w->e[w->n - 1].t_ns : 0;
    return 0;
}

void kvi_trace_workload_free(struct kvi_trace_workload *w)
{
    struct kvi_trace_chunk *c = w->chunks;
    while (c != NULL) {
        struct kvi_trace_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(w->e);
    free(w->req_content);
    free(w->req_blocks);
    free(w->worker_of_req);
    memset(w, 0, sizeof *w);
}
