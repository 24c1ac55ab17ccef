/*
 * kvidx-bench ingest: the whole event path on the Mooncake trace's event mix.
 *
 *   publisher threads (C publisher library, net/include/kvidx/publisher.h)
 *     -> ZMQ (loopback tcp by default; ipc or inproc on request)
 *     -> listener threads (net/listener.h: framing, §6.3 watermarks, decode,
 *        ingest) -> writer threads -> index
 *
 * WORKLOAD. Requests of the Mooncake conversation trace (or a synthetic trace
 * with similar statistics when the file is missing) are dealt round-robin to
 * W engines. Each engine keeps an LRU cache of `cache_ids` trace ids (one id
 * = 512 tokens = 512 / B engine blocks) with vLLM's release order (a
 * request's blocks are freed leaf first, so eviction only ever takes leaves).
 * A request whose id chain is cached up to position k publishes one
 * BlockStored for the blocks of ids k.. (tokens, block size B, parent = the
 * last cached block; optionally split into events of at most --event-blocks
 * blocks) and, when ids had to be evicted, one BlockRemoved listing their
 * blocks: the stored/removed mix and block counts per event of a prefix-
 * caching engine replaying that trace. Token ids are synthesised per
 * (id, block); engine hashes are opaque per engine.
 *
 * Payloads are msgpack batches [ts, [events], 0] in vLLM's map form (or the
 * array form), encoded before the clock starts with msgpack-c, and sent with
 * kvidx_pub_publish_payload (one sequence number each, exactly as a flushed
 * batch), so publishing costs a copy and a ZMQ send, not an encode.
 * Publishers run with an unlimited send HWM: none is dropped, and the run
 * checks that no gap or loss was seen.
 *
 * MEASURED. From the first send until every listener has applied its last
 * batch and the writers have applied every op: batches/s and stored
 * blocks/s, per listener thread too; the split of listener time into decode
 * (kvi_decode_batch) and ingest (kvi_ingest_batch: hashing, op building and
 * ring submits, stalls included), the writers' busy time (kvi_writer_stats),
 * the CPU time of each thread group (listeners: kvi_listener_thread_stats, to
 * the nanosecond; others: /proc/self/task, to 10 ms) and ring stalls. A benchmark: it prints
 * figures and never asserts; the last line is one JSON object.
 *
 * TRANSPORTS. --transport takes a comma list (all = tcp,nats,jetstream): the
 * workload is built once and each transport runs on it in turn, with its own
 * index and writers; a summary table closes a run of several. The NATS ones
 * (nats, jetstream, jetstream-mem) are bench/ingest_nats.c; bench/ingest.h
 * holds what the two files share.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/ingest.h"
#include "engine/common.h"

#include <kvidx/publisher.h>
#include <msgpack.h>
#include <sched.h>
#include <zmq.h>

#include "engine/hash.h"
#include "engine/index.h"
#include "engine/rcu.h"
#include "engine/writer.h"
#include "net/listener.h"

#define ID_TOKENS 512
#define MAX_CHAIN 1024 /* ids of one request used (the trace's longest has 247) */
#define VOCAB 151000u
#define DEFAULT_TRACE "/work/shared/data/mooncake-traces/conversation_trace.jsonl"

/* ---- trace ---------------------------------------------------------------- */

struct ingest_trace {
    uint64_t *ids;  /* all hash ids, request after request */
    size_t *off;    /* n_req + 1 offsets into ids */
    size_t n_req, n_ids;
    bool synthetic;
};

static void trace_push(struct ingest_trace *t, size_t *cap_ids, size_t *cap_req, uint64_t id)
{
    if (t->n_ids == *cap_ids) {
        *cap_ids = *cap_ids ? *cap_ids * 2 : 1 << 16;
        t->ids = kvi_xrealloc(t->ids, *cap_ids * sizeof *t->ids);
    }
    t->ids[t->n_ids++] = id;
    (void)cap_req;
}

static void trace_end_request(struct ingest_trace *t, size_t *cap_req)
{
    if (t->n_req + 2 > *cap_req) {
        *cap_req = *cap_req ? *cap_req * 2 : 1 << 12;
        t->off = kvi_xrealloc(t->off, *cap_req * sizeof *t->off);
    }
    t->n_req++;
    t->off[t->n_req] = t->n_ids;
}

/* Read the hash_ids arrays of a Mooncake JSONL trace. @return false when the file cannot be read. */
static bool trace_load(struct ingest_trace *t, const char *path, uint32_t max_req)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    size_t cap_ids = 0, cap_req = 0;
    trace_end_request(t, &cap_req); /* off[0..1] */
    t->n_req = 0;
    t->off[0] = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0 && (max_req == 0 || t->n_req < max_req)) {
        char *p = strstr(line, "\"hash_ids\"");
        if (p == NULL || (p = strchr(p, '[')) == NULL)
            continue;
        p++;
        for (;;) {
            while (*p == ' ' || *p == ',')
                p++;
            if (*p < '0' || *p > '9')
                break;
            char *end;
            uint64_t v = strtoull(p, &end, 10);
            trace_push(t, &cap_ids, &cap_req, v);
            p = end;
        }
        trace_end_request(t, &cap_req);
    }
    free(line);
    fclose(f);
    return t->n_req > 0;
}

/*
 * Synthetic stand-in with the conversation trace's statistics (README of the
 * trace directory: 24 ids per request on average, 37 % of ids reuse a
 * prefix): 4 in 10 requests continue an earlier request's chain.
 */
static void trace_synth(struct ingest_trace *t, uint32_t n_req, uint64_t seed)
{
    size_t cap_ids = 0, cap_req = 0;
    trace_end_request(t, &cap_req);
    t->n_req = 0;
    t->off[0] = 0;
    t->synthetic = true;
    uint64_t rng = seed, next_id = 0;
    for (uint32_t r = 0; r < n_req; r++) {
        uint32_t len = 1 + (uint32_t)(kvi_bench_rand(&rng) % 47);
        if (r > 0 && kvi_bench_rand(&rng) % 10 < 4) {
            size_t q = kvi_bench_rand(&rng) % t->n_req;
            size_t qn = t->off[q + 1] - t->off[q];
            size_t keep = qn * 9 / 10;
            for (size_t i = 0; i < keep; i++)
                trace_push(t, &cap_ids, &cap_req, t->ids[t->off[q] + i]);
            len = len > keep ? len - (uint32_t)keep : 1;
        }
        for (uint32_t i = 0; i < len; i++)
            trace_push(t, &cap_ids, &cap_req, next_id++);
        trace_end_request(t, &cap_req);
    }
}

/* ---- engines: LRU prefix cache over trace ids ------------------------------ */

/* Open-addressing map id -> LRU node index. */
struct lru {
    uint64_t *keys; /* id + 1, 0 = empty */
    uint32_t *vals;
    size_t mask;
    /* nodes: doubly linked list, head = least recently used */
    uint64_t *node_id;
    uint32_t *prev, *next;
    uint32_t head, tail, n, cap, free_head;
    uint32_t limit; /* cached ids kept after a request (cap leaves room for one request's chain) */
};

#define NIL UINT32_MAX

static void lru_init(struct lru *l, uint32_t limit)
{
    memset(l, 0, sizeof *l);
    uint32_t cap = limit + MAX_CHAIN;
    l->limit = limit;
    size_t sz = 16;
    while (sz < (size_t)cap * 4)
        sz <<= 1;
    l->mask = sz - 1;
    l->keys = kvi_xcalloc(sz, sizeof *l->keys);
    l->vals = kvi_xcalloc(sz, sizeof *l->vals);
    l->cap = cap;
    l->node_id = kvi_xcalloc(cap + 1, sizeof *l->node_id);
    l->prev = kvi_xcalloc(cap + 1, sizeof *l->prev);
    l->next = kvi_xcalloc(cap + 1, sizeof *l->next);
    l->head = l->tail = NIL;
    for (uint32_t i = 0; i <= cap; i++)
        l->next[i] = i < cap ? i + 1 : NIL;
    l->free_head = 0;
}

static void lru_free(struct lru *l)
{
    free(l->keys);
    free(l->vals);
    free(l->node_id);
    free(l->prev);
    free(l->next);
}

static size_t lru_slot(const struct lru *l, uint64_t id)
{
    size_t i = (size_t)(id * 0x9e3779b97f4a7c15ull >> 20) & l->mask;
    while (l->keys[i] != 0 && l->keys[i] != id + 1)
        i = (i + 1) & l->mask;
    return i;
}

static bool lru_has(const struct lru *l, uint64_t id)
{
    return l->keys[lru_slot(l, id)] == id + 1;
}

static void lru_unlink(struct lru *l, uint32_t x)
{
    if (l->prev[x] != NIL)
        l->next[l->prev[x]] = l->next[x];
    else
        l->head = l->next[x];
    if (l->next[x] != NIL)
        l->prev[l->next[x]] = l->prev[x];
    else
        l->tail = l->prev[x];
}

static void lru_append(struct lru *l, uint32_t x)
{
    l->prev[x] = l->tail;
    l->next[x] = NIL;
    if (l->tail != NIL)
        l->next[l->tail] = x;
    else
        l->head = x;
    l->tail = x;
}

/* Mark id most recently used, inserting it. */
static void lru_touch(struct lru *l, uint64_t id)
{
    size_t s = lru_slot(l, id);
    if (l->keys[s] == id + 1) {
        uint32_t x = l->vals[s];
        lru_unlink(l, x);
        lru_append(l, x);
        return;
    }
    uint32_t x = l->free_head;
    KVI_ASSERT(x != NIL);
    l->free_head = l->next[x];
    l->keys[s] = id + 1;
    l->vals[s] = x;
    l->node_id[x] = id;
    l->n++;
    lru_append(l, x);
}

/* Remove and return the least recently used id. */
static uint64_t lru_pop(struct lru *l)
{
    uint32_t x = l->head;
    uint64_t id = l->node_id[x];
    lru_unlink(l, x);
    l->next[x] = l->free_head;
    l->free_head = x;
    l->n--;
    /* delete from the map with backward shift */
    size_t i = lru_slot(l, id);
    l->keys[i] = 0;
    for (size_t j = (i + 1) & l->mask; l->keys[j] != 0; j = (j + 1) & l->mask) {
        size_t home = (size_t)((l->keys[j] - 1) * 0x9e3779b97f4a7c15ull >> 20) & l->mask;
        if (((j - home) & l->mask) >= ((j - i) & l->mask)) {
            l->keys[i] = l->keys[j];
            l->vals[i] = l->vals[j];
            l->keys[j] = 0;
            i = j;
        }
    }
    return id;
}

/* ---- payloads ------------------------------------------------------------- */


struct evref;

struct gen {
    const struct ingest_cfg *c;
    uint32_t sub;  /* blocks per trace id */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    uint64_t *hashes; /* stored blocks of the current request */
    uint32_t *tokens;
    size_t cap_blocks;
    uint64_t *rm;     /* evicted hashes of the current request */
    size_t cap_rm;
    struct evref *ev;
    size_t n_ev, cap_ev;
};

static uint64_t engine_hash(const struct ingest_engine *e, uint64_t id, uint32_t j)
{
    uint64_t s = e->seed ^ (id * 0x100000001b3ull + j);
    return kvi_bench_rand(&s);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_stored(struct gen *g, const uint64_t *hashes, const uint32_t *tokens, size_t n, const uint64_t *parent)
{
    msgpack_packer *pk = &g->pk;
    uint32_t B = g->c->block_size;
    if (g->c->array_form) {
        msgpack_pack_array(pk, 8);
        pack_str(pk, "BlockStored");
    } else {
        msgpack_pack_map(pk, 8);
        pack_str(pk, "type");
        pack_str(pk, "BlockStored");
        pack_str(pk, "block_hashes");
    }
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, hashes[i]);
    if (!g->c->array_form)
        pack_str(pk, "parent_block_hash");
    if (parent)
        msgpack_pack_uint64(pk, *parent);
    else
        msgpack_pack_nil(pk);
    if (!g->c->array_form)
        pack_str(pk, "token_ids");
    msgpack_pack_array(pk, n * B);
    for (size_t i = 0; i < n * B; i++)
        msgpack_pack_uint32(pk, tokens[i]);
    if (!g->c->array_form)
        pack_str(pk, "block_size");
    msgpack_pack_uint32(pk, B);
    if (!g->c->array_form)
        pack_str(pk, "lora_id");
    msgpack_pack_nil(pk);
    if (!g->c->array_form)
        pack_str(pk, "medium");
    pack_str(pk, "GPU");
    if (!g->c->array_form)
        pack_str(pk, "lora_name");
    msgpack_pack_nil(pk);
}

static void pack_removed(struct gen *g, const uint64_t *h, size_t n)
{
    msgpack_packer *pk = &g->pk;
    if (g->c->array_form) {
        msgpack_pack_array(pk, 3);
        pack_str(pk, "BlockRemoved");
    } else {
        msgpack_pack_map(pk, 3);
        pack_str(pk, "type");
        pack_str(pk, "BlockRemoved");
        pack_str(pk, "block_hashes");
    }
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, h[i]);
    if (!g->c->array_form)
        pack_str(pk, "medium");
    pack_str(pk, "GPU");
}

static void engine_add_batch(struct ingest_engine *e, const msgpack_sbuffer *sb)
{
    if (e->len + sb->size > e->cap) {
        e->cap = KVI_MAX(e->cap * 2, e->len + sb->size + (1 << 20));
        e->buf = kvi_xrealloc(e->buf, e->cap);
    }
    if (e->n_batches + 2 > e->cap_batches) {
        e->cap_batches = e->cap_batches ? e->cap_batches * 2 : 1024;
        e->boff = kvi_xrealloc(e->boff, e->cap_batches * sizeof *e->boff);
    }
    memcpy(e->buf + e->len, sb->data, sb->size);
    e->boff[e->n_batches] = e->len;
    e->len += sb->size;
    e->n_batches++;
    e->boff[e->n_batches] = e->len;
}

static void gen_reserve(struct gen *g, size_t blocks)
{
    if (blocks <= g->cap_blocks)
        return;
    g->cap_blocks = blocks * 2;
    g->hashes = kvi_xrealloc(g->hashes, g->cap_blocks * sizeof *g->hashes);
    g->tokens = kvi_xrealloc(g->tokens, g->cap_blocks * g->c->block_size * sizeof *g->tokens);
}

/* One event of a request, before packing: a run of g->hashes (stored) or g->rm (removed). */
struct evref {
    bool removed;
    size_t from, m;
};

static void gen_event(struct gen *g, bool removed, size_t from, size_t m)
{
    if (g->n_ev == g->cap_ev) {
        g->cap_ev = g->cap_ev ? g->cap_ev * 2 : 256;
        g->ev = kvi_xrealloc(g->ev, g->cap_ev * sizeof *g->ev);
    }
    g->ev[g->n_ev++] = (struct evref){removed, from, m};
}

/* The parent of stored event v of a request whose first k ids were cached. @return false: none. */
static bool event_parent(const struct gen *g, const struct ingest_engine *e, const uint64_t *ids, size_t k,
                         const struct evref *v, uint64_t *parent)
{
    if (v->from > 0)
        *parent = g->hashes[v->from - 1];
    else if (k > 0)
        *parent = engine_hash(e, ids[k - 1], g->sub - 1);
    return v->from > 0 || k > 0;
}

#define GROW(arr, n, cap, need)                                                                                       \
    do {                                                                                                             \
        if ((n) + (need) > (cap)) {                                                                                  \
            (cap) = KVI_MAX((cap) * 2, (n) + (need) + 4096);                                                         \
            (arr) = kvi_xrealloc((arr), (cap) * sizeof *(arr));                                                      \
        }                                                                                                            \
    } while (0)

/* Keep the request's events g->ev raw (NATS transports publish them one message each). */
static void engine_keep_events(const struct gen *g, struct ingest_engine *e, const uint64_t *ids, size_t k)
{
    uint32_t B = g->c->block_size;
    GROW(e->rq, e->n_rq, e->cap_rq, 2);
    if (e->n_rq == 0)
        e->rq[0] = 0;
    GROW(e->ev, e->n_ev, e->cap_ev, g->n_ev);
    for (size_t i = 0; i < g->n_ev; i++) {
        const struct evref *v = &g->ev[i];
        struct ingest_ev *x = &e->ev[e->n_ev++];
        *x = (struct ingest_ev){.h = e->n_h, .t = e->n_t, .n = (uint32_t)v->m, .removed = v->removed};
        GROW(e->ev_h, e->n_h, e->cap_h, v->m);
        memcpy(e->ev_h + e->n_h, (v->removed ? g->rm : g->hashes) + v->from, v->m * sizeof *e->ev_h);
        e->n_h += v->m;
        if (v->removed)
            continue;
        x->has_parent = event_parent(g, e, ids, k, v, &x->parent);
        GROW(e->ev_t, e->n_t, e->cap_t, v->m * B);
        memcpy(e->ev_t + e->n_t, g->tokens + v->from * B, v->m * B * sizeof *e->ev_t);
        e->n_t += v->m * B;
    }
    e->rq[++e->n_rq] = e->n_ev;
}

/*
 * One request on engine e: stored events for the blocks of its uncached ids,
 * removed events for the ids evicted to make room, packed into batches of at
 * most --batch-events events (default: one batch per request).
 */
static void engine_request(struct gen *g, struct ingest_engine *e, struct lru *cache, const uint64_t *ids, size_t n)
{
    uint32_t sub = g->sub, B = g->c->block_size;
    n = KVI_MIN(n, (size_t)MAX_CHAIN);
    size_t k = 0;
    while (k < n && lru_has(cache, ids[k]))
        k++;
    g->n_ev = 0;
    size_t nb = (n - k) * sub;
    gen_reserve(g, nb);
    for (size_t i = k; i < n; i++)
        for (uint32_t j = 0; j < sub; j++) {
            size_t b = (i - k) * sub + j;
            g->hashes[b] = engine_hash(e, ids[i], j);
            uint64_t s = ids[i] * 1000003ull + j;
            for (uint32_t t = 0; t < B; t++)
                g->tokens[b * B + t] = (uint32_t)(kvi_bench_rand(&s) % VOCAB);
        }
    size_t per = g->c->event_blocks ? g->c->event_blocks : SIZE_MAX;
    for (size_t from = 0; from < nb; from += per)
        gen_event(g, false, from, KVI_MIN(per, nb - from));
    e->stored_blocks += nb;

    /* vLLM frees a request's blocks last first: the leaf gets the oldest LRU stamp */
    for (size_t i = n; i-- > 0;)
        lru_touch(cache, ids[i]);
    /* Evict least recently used ids: leaves of other chains (a parent's stamp is always newer
     * than its children's, and this request's chain was just touched). */
    size_t nr = 0;
    if (cache->n > cache->limit) {
        size_t need = (size_t)(cache->n - cache->limit) * sub;
        if (need > g->cap_rm) {
            g->cap_rm = need * 2;
            g->rm = kvi_xrealloc(g->rm, g->cap_rm * sizeof *g->rm);
        }
        while (cache->n > cache->limit) {
            uint64_t id = lru_pop(cache);
            for (uint32_t j = sub; j-- > 0;)
                g->rm[nr++] = engine_hash(e, id, j);
        }
        for (size_t from = 0; from < nr; from += per)
            gen_event(g, true, from, KVI_MIN(per, nr - from));
        e->removed_hashes += nr;
    }

    for (size_t i = 0; i < g->n_ev; i++) {
        if (g->ev[i].removed)
            e->events_removed++;
        else
            e->events_stored++;
    }
    if (g->c->want_events)
        engine_keep_events(g, e, ids, k);
    if (!g->c->want_batches)
        return;
    size_t k_per = g->c->batch_events ? g->c->batch_events : SIZE_MAX;
    for (size_t first = 0; first < g->n_ev; first += k_per) {
        size_t cnt = KVI_MIN(k_per, g->n_ev - first);
        msgpack_sbuffer_clear(&g->sb);
        msgpack_pack_array(&g->pk, 3);
        msgpack_pack_double(&g->pk, 1795250797.88);
        msgpack_pack_array(&g->pk, cnt);
        for (size_t i = first; i < first + cnt; i++) {
            const struct evref *v = &g->ev[i];
            if (v->removed) {
                pack_removed(g, g->rm + v->from, v->m);
                continue;
            }
            uint64_t parent;
            bool has_parent = event_parent(g, e, ids, k, v, &parent);
            pack_stored(g, g->hashes + v->from, g->tokens + v->from * g->c->block_size, v->m,
                        has_parent ? &parent : NULL);
        }
        msgpack_pack_int(&g->pk, 0);
        engine_add_batch(e, &g->sb);
    }
}

/* ---- publishers ------------------------------------------------------------ */

struct pub_thread {
    pthread_t tid;
    struct ingest_engine *eng;
    uint32_t n_eng;
    _Atomic int *go;
    uint64_t cpu_ns;
    int err;
};

uint64_t ingest_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Send every engine's batches, interleaving engines one batch at a time. */
static void *pub_main(void *arg)
{
    struct pub_thread *pt = arg;
    pthread_setname_np(pthread_self(), "kvi-bench-pub");
    while (!atomic_load_explicit(pt->go, memory_order_acquire))
        sched_yield();
    uint64_t c0 = ingest_thread_cpu_ns();
    size_t *next = kvi_xcalloc(pt->n_eng, sizeof *next);
    for (bool more = true; more;) {
        more = false;
        for (uint32_t i = 0; i < pt->n_eng; i++) {
            struct ingest_engine *e = &pt->eng[i];
            size_t b = next[i];
            if (b == e->n_batches)
                continue;
            int rc = kvidx_pub_publish_payload(e->pub, e->buf + e->boff[b], e->boff[b + 1] - e->boff[b], NULL);
            if (rc != 0 && pt->err == 0)
                pt->err = rc;
            next[i] = b + 1;
            more = true;
        }
    }
    free(next);
    pt->cpu_ns = ingest_thread_cpu_ns() - c0;
    return NULL;
}

/* ---- CPU time by thread group (/proc/self/task/<tid>/stat) ----------------- */

enum { CPU_LISTEN, CPU_WRITER, CPU_ZMQ, CPU_PUB, CPU_OTHER, CPU_GROUPS };
static const char *const cpu_group_name[CPU_GROUPS] = {"listener threads", "writer threads",
                                                       "ZMQ I/O threads", "publisher threads", "other"};

/* The group of a thread, by its name. */
static size_t cpu_group(pid_t tid, const char *comm, void *arg)
{
    (void)tid, (void)arg;
    return !strncmp(comm, "kvi-listen", 10)      ? CPU_LISTEN
           : !strncmp(comm, "kvi-writer", 10)    ? CPU_WRITER
           : !strncmp(comm, "ZMQbg", 5)          ? CPU_ZMQ
           : !strncmp(comm, "kvi-bench-pub", 13) ? CPU_PUB
                                                 : CPU_OTHER;
}

/* ---- the run --------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: kvidx-bench ingest [--workers W] [--publishers P] [--listeners L] [--writers N]\n"
           "                          [--block-size B] [--cache-ids C] [--event-blocks E] [--batch-events K]\n"
           "                          [--requests R] [--transport T[,T...]|all] [--form map|array]\n"
           "                          [--trace PATH] [--seed X]\n"
           "  W engines (publishers, registrations): 8     P publisher threads: 1\n"
           "  L listener threads: 1                        N writer threads: 1\n"
           "  B tokens per block, divides 512: 16          C trace ids cached per engine: 4096\n"
           "  E max blocks per stored / removed event: 0 = one event per request and kind\n"
           "  K max events per batch: 0 = one batch per request\n"
           "  R requests of the trace: 0 = all           form: map\n"
           "  T: tcp (loopback, the default), ipc, inproc (ZMQ, vLLM batches); nats (Core NATS), jetstream\n"
           "     (Dynamo RouterEvents, one message per event, through a private nats-server: $KVI_NATS_SERVER,\n"
           "     else nats-server on PATH), jetstream-mem (the stream in memory); several run one after\n"
           "     another on the same workload; all = tcp,nats,jetstream\n"
           "  trace: %s (a synthetic one when missing)\n",
           DEFAULT_TRACE);
}

static bool is_nats(const char *t) { return !strcmp(t, "nats") || !strncmp(t, "jetstream", 9); }

/*
 * Split c->transport ("tcp", "nats,jetstream", "all" = tcp,nats,jetstream) into c->transports.
 * @return false on an unknown name or too many.
 */
static bool parse_transports(struct ingest_cfg *c)
{
    static const char *const known[] = {"tcp", "ipc", "inproc", "nats", "jetstream", "jetstream-mem"};
    static char list[256];
    snprintf(list, sizeof list, "%s", !strcmp(c->transport, "all") ? "tcp,nats,jetstream" : c->transport);
    c->n_transports = 0;
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        const char *k = NULL;
        for (size_t i = 0; i < sizeof known / sizeof *known && k == NULL; i++)
            k = !strcmp(t, known[i]) ? known[i] : NULL;
        if (k == NULL || c->n_transports == INGEST_MAX_TRANSPORTS)
            return false;
        c->transports[c->n_transports++] = k;
        if (is_nats(k))
            c->want_events = true;
        else
            c->want_batches = true;
    }
    return c->n_transports > 0;
}

static int parse_args(struct ingest_cfg *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"workers", required_argument, NULL, 'w'},      {"publishers", required_argument, NULL, 'p'},
        {"listeners", required_argument, NULL, 'l'},    {"writers", required_argument, NULL, 'n'},
        {"block-size", required_argument, NULL, 'b'},   {"cache-ids", required_argument, NULL, 'c'},
        {"event-blocks", required_argument, NULL, 'e'}, {"requests", required_argument, NULL, 'r'},
        {"transport", required_argument, NULL, 't'},    {"form", required_argument, NULL, 'f'},
        {"trace", required_argument, NULL, 'T'},        {"seed", required_argument, NULL, 'x'},
        {"batch-events", required_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},               {NULL, 0, NULL, 0},
    };
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'w': c->workers = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'p': c->publishers = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'l': c->listeners = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'n': c->writers = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'b': c->block_size = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'c': c->cache_ids = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'e': c->event_blocks = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'r': c->requests = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'k': c->batch_events = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 't': c->transport = optarg; break;
        case 'f': c->array_form = !strcmp(optarg, "array"); break;
        case 'T': c->trace = optarg; break;
        case 'x': c->seed = strtoull(optarg, NULL, 10); break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    bool ok = c->workers > 0 && c->publishers > 0 && c->publishers <= c->workers && c->listeners > 0 &&
              c->listeners <= KVI_LISTEN_MAX_THREADS && c->writers > 0 && c->writers <= KVI_WRITER_MAX &&
              c->block_size > 0 && ID_TOKENS % c->block_size == 0 && c->cache_ids >= 512 &&
              parse_transports(c);
    if (!ok) {
        fprintf(stderr, "ingest: invalid options (block size must divide 512, cache-ids >= 512, transports "
                        "tcp, ipc, inproc, nats, jetstream, jetstream-mem or all)\n");
        return 2;
    }
    return -1;
}

/* Batches the listeners are done with, and whether the writers applied every op submitted. */
static uint64_t handled(struct kvi_listeners *lp, struct kvi_listener_totals *tot, bool *ops_done)
{
    kvi_listeners_totals(lp, tot);
    const struct kvi_listener_counters *c = &tot->ctr;
    *ops_done = c->ops_applied + c->ops_parent_not_found + c->ops_invalid >= c->ops_submitted;
    return c->batches + c->decode_errors + c->stale + c->replay_undecodable + c->lost;
}

static void nap_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}


static void workload_build(struct ingest_workload *wl, const struct ingest_cfg *c)
{
    memset(wl, 0, sizeof *wl);
    wl->tr = kvi_xcalloc(1, sizeof *wl->tr);
    if (!trace_load(wl->tr, c->trace, c->requests)) {
        fprintf(stderr, "ingest: %s not readable; using a synthetic trace\n", c->trace);
        trace_synth(wl->tr, c->requests ? c->requests : 12000, c->seed);
    }
    wl->g = kvi_xcalloc(1, sizeof *wl->g);
    *wl->g = (struct gen){.c = c, .sub = ID_TOKENS / c->block_size};
    msgpack_sbuffer_init(&wl->g->sb);
    msgpack_packer_init(&wl->g->pk, &wl->g->sb, msgpack_sbuffer_write);
    wl->eng = kvi_xcalloc(c->workers, sizeof *wl->eng);
    struct lru *cache = kvi_xcalloc(c->workers, sizeof *cache);
    uint64_t seed = c->seed;
    for (uint32_t w = 0; w < c->workers; w++) {
        wl->eng[w].idx = w;
        wl->eng[w].seed = kvi_bench_rand(&seed);
        lru_init(&cache[w], c->cache_ids);
    }
    uint64_t t0 = kvi_now_ns();
    for (size_t r = 0; r < wl->tr->n_req; r++)
        engine_request(wl->g, &wl->eng[r % c->workers], &cache[r % c->workers], wl->tr->ids + wl->tr->off[r],
                       wl->tr->off[r + 1] - wl->tr->off[r]);
    wl->gen_ns = kvi_now_ns() - t0;
    wl->synthetic = wl->tr->synthetic;
    for (uint32_t w = 0; w < c->workers; w++) {
        struct ingest_engine *e = &wl->eng[w];
        wl->batches += e->n_batches;
        wl->payload += e->len;
        wl->blocks += e->stored_blocks;
        wl->removed += e->removed_hashes;
        wl->ev_st += e->events_stored;
        wl->ev_rm += e->events_removed;
        lru_free(&cache[w]);
    }
    free(cache);
    printf("kvidx ingest: %zu requests (%s%s), %u engines, block size %u (%u blocks per trace id)\n",
           wl->tr->n_req, wl->tr->synthetic ? "synthetic" : "trace ", wl->tr->synthetic ? "" : c->trace, c->workers,
           c->block_size, wl->g->sub);
    printf("  workload: %llu stored events (%.1f blocks each), %llu removed events (%.1f hashes each), "
           "generated in %.2f s\n",
           (unsigned long long)wl->ev_st, wl->ev_st ? (double)wl->blocks / (double)wl->ev_st : 0,
           (unsigned long long)wl->ev_rm, wl->ev_rm ? (double)wl->removed / (double)wl->ev_rm : 0,
           (double)wl->gen_ns / 1e9);
    if (c->want_batches)
        printf("  ZMQ: %llu batches, %.1f MB of vLLM msgpack (%.0f B per batch)\n", (unsigned long long)wl->batches,
               (double)wl->payload / 1e6, wl->batches ? (double)wl->payload / (double)wl->batches : 0);
    if (c->want_events)
        printf("  NATS: one message per event (a RouterEvent holds one event): %llu messages\n",
               (unsigned long long)(wl->ev_st + wl->ev_rm));
}

static void workload_free(struct ingest_workload *wl, const struct ingest_cfg *c)
{
    for (uint32_t w = 0; w < c->workers; w++) {
        struct ingest_engine *e = &wl->eng[w];
        free(e->buf);
        free(e->boff);
        free(e->ev);
        free(e->ev_h);
        free(e->ev_t);
        free(e->rq);
    }
    free(wl->eng);
    free(wl->g->hashes);
    free(wl->g->tokens);
    free(wl->g->rm);
    free(wl->g->ev);
    msgpack_sbuffer_destroy(&wl->g->sb);
    free(wl->g);
    free(wl->tr->ids);
    free(wl->tr->off);
    free(wl->tr);
}

/* Writers, index, listener pool, one publisher and one registration per engine. */
struct pipeline {
    struct kvi_writer_pool *pool;
    struct kvi_index *ix;
    struct kvi_listeners *lp;
    void *zctx; /* the publishers' context (the listeners' too with inproc) */
};

static int pipeline_setup(struct pipeline *pl, const struct ingest_cfg *c, struct ingest_engine *eng)
{
    pl->pool = kvi_writer_pool_create(c->writers, 0);
    struct kvi_index_config icfg = {.block_size = c->block_size, .n_parts = c->writers};
    pl->ix = kvi_index_create(&icfg);
    /* One ZMQ context (one I/O thread) for all the publishers: real engines run one each in their own
     * processes, but here they share the same cores anyway. inproc needs the listeners in it too. */
    pl->zctx = zmq_ctx_new();
    bool inproc = !strcmp(c->transport, "inproc");
    struct kvi_listeners_config lcfg = {.threads = c->listeners, .timing = true, .quiet = true,
                                        .zmq_ctx = inproc ? pl->zctx : NULL};
    pl->lp = pl->pool ? kvi_listeners_create(pl->pool, &lcfg) : NULL;
    if (pl->pool == NULL || pl->ix == NULL || pl->lp == NULL || pl->zctx == NULL) {
        fprintf(stderr, "ingest: set-up failed: %s\n", strerror(errno));
        return -1;
    }
    for (uint32_t w = 0; w < c->workers; w++) {
        struct ingest_engine *e = &eng[w];
        struct kvidx_pub_config pc;
        kvidx_pub_config_init(&pc);
        char ep[128];
        if (!strcmp(c->transport, "tcp"))
            snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
        else if (!strcmp(c->transport, "ipc"))
            snprintf(ep, sizeof ep, "ipc:///tmp/kvidx-ingest-bench-%d-%u.sock", (int)getpid(), w);
        else
            snprintf(ep, sizeof ep, "inproc://kvidx-ingest-bench-%u", w);
        pc.endpoint = ep;
        pc.hwm = 0; /* never drop: the run measures draining, not loss */
        pc.zmq_ctx = pl->zctx;
        e->pub = kvidx_pub_create(&pc);
        if (e->pub == NULL) {
            fprintf(stderr, "ingest: publisher %u: %s\n", w, strerror(errno));
            return -1;
        }
        snprintf(e->endpoint, sizeof e->endpoint, "%s", kvidx_pub_endpoint(e->pub));
        struct kvi_listener_spec s = {.ix = pl->ix, .instance_id = 1 + w, .endpoint = e->endpoint};
        int rc = kvi_listeners_register(pl->lp, &s);
        if (rc != 0) {
            fprintf(stderr, "ingest: register %u: %s\n", w, strerror(-rc));
            return -1;
        }
    }
    return 0;
}

/* PUB/SUB slow joiner: probe (no sequence number consumed) until every listener got one. */
static int pipeline_sync(struct pipeline *pl, const struct ingest_cfg *c, struct ingest_engine *eng)
{
    const void *probe[1] = {"probe"};
    size_t probe_len[1] = {5};
    for (int tries = 0; tries < 5000; tries++) {
        uint32_t synced = 0;
        for (uint32_t w = 0; w < c->workers; w++) {
            struct kvi_listener_key k = {.ix = pl->ix, .instance_id = 1 + w};
            struct kvi_listener_info in;
            if (kvi_listeners_get(pl->lp, &k, &in) == 0 && in.ctr.malformed > 0)
                synced++;
            else
                kvidx_pub_send_raw(eng[w].pub, probe, probe_len, 1);
        }
        if (synced == c->workers)
            return 0;
        nap_us(2000);
    }
    fprintf(stderr, "ingest: listeners never connected\n");
    return -1;
}

static void pipeline_free(struct pipeline *pl, const struct ingest_cfg *c, struct ingest_engine *eng)
{
    if (pl->lp)
        kvi_listeners_destroy(pl->lp);
    for (uint32_t w = 0; w < c->workers; w++) {
        kvidx_pub_destroy(eng[w].pub);
        eng[w].pub = NULL;
        if (!strncmp(eng[w].endpoint, "ipc://", 6))
            unlink(eng[w].endpoint + 6); /* libzmq leaves the socket file behind */
    }
    if (pl->zctx)
        zmq_ctx_term(pl->zctx);
    if (pl->pool && pl->ix) {
        struct kvi_producer *p = kvi_producer_create(pl->pool);
        kvi_producer_forget_index(p, pl->ix);
        kvi_producer_destroy(p);
    }
    if (pl->ix)
        kvi_index_destroy(pl->ix);
    if (pl->pool)
        kvi_writer_pool_destroy(pl->pool);
}

/* What one timed run measured. */
struct run {
    uint64_t elapsed_ns, sent_ns, pub_cpu_ns;
    int pub_err;
    struct kvi_listener_totals tot;
    struct kvi_writer_stats ws0[KVI_WRITER_MAX], ws1[KVI_WRITER_MAX];
    struct kvi_listener_thread_stats ls0[KVI_LISTEN_MAX_THREADS], ls1[KVI_LISTEN_MAX_THREADS];
    double cpu0[CPU_GROUPS], cpu1[CPU_GROUPS];
};

static void snapshot(struct pipeline *pl, const struct ingest_cfg *c, struct kvi_writer_stats *ws,
                     struct kvi_listener_thread_stats *ls, double *cpu)
{
    for (uint32_t w = 0; w < c->writers; w++)
        kvi_writer_stats(pl->pool, w, &ws[w]);
    for (uint32_t t = 0; t < c->listeners; t++)
        kvi_listener_thread_stats(pl->lp, t, &ls[t]);
    kvi_bench_thread_cpu_s(cpu, CPU_GROUPS, cpu_group, NULL);
}

/* Send everything, then wait until it is applied (or nothing moved for 10 s). */
static void run_timed(struct run *r, struct pipeline *pl, const struct ingest_cfg *c, struct ingest_workload *wl)
{
    snapshot(pl, c, r->ws0, r->ls0, r->cpu0);
    _Atomic int go = 0;
    struct pub_thread *pt = kvi_xcalloc(c->publishers, sizeof *pt);
    for (uint32_t i = 0, first = 0; i < c->publishers; i++) {
        uint32_t n = c->workers / c->publishers + (i < c->workers % c->publishers);
        pt[i] = (struct pub_thread){.eng = wl->eng + first, .n_eng = n, .go = &go};
        first += n;
        pthread_create(&pt[i].tid, NULL, pub_main, &pt[i]);
    }
    uint64_t t0 = kvi_now_ns();
    atomic_store_explicit(&go, 1, memory_order_release);
    for (uint32_t i = 0; i < c->publishers; i++) {
        pthread_join(pt[i].tid, NULL);
        r->pub_cpu_ns += pt[i].cpu_ns;
        r->pub_err = r->pub_err ? r->pub_err : pt[i].err;
    }
    r->sent_ns = kvi_now_ns() - t0;
    free(pt);
    uint64_t last_h = 0, last_change = kvi_now_ns();
    for (;;) {
        bool ops_done;
        uint64_t h = handled(pl->lp, &r->tot, &ops_done);
        if (h >= wl->batches && ops_done)
            break;
        uint64_t now = kvi_now_ns();
        if (h != last_h) {
            last_h = h;
            last_change = now;
        } else if (now - last_change > 10000000000ull) {
            printf("  WARNING: no progress for 10 s: %llu of %llu batches handled\n", (unsigned long long)h,
                   (unsigned long long)wl->batches);
            break;
        }
        nap_us(1000);
    }
    r->elapsed_ns = kvi_now_ns() - t0;
    snapshot(pl, c, r->ws1, r->ls1, r->cpu1);
    r->cpu1[CPU_PUB] = r->cpu0[CPU_PUB] + (double)r->pub_cpu_ns / 1e9; /* those threads have exited */
}

void ingest_row(const char *name, double v)
{
    printf(v >= 100 || v == 0 ? "  %-46s %14.0f\n" : "  %-46s %14.2f\n", name, v);
}

static void report(const struct run *r, const struct ingest_cfg *c, const struct ingest_workload *wl,
                   struct ingest_summary *out)
{
    double secs = (double)r->elapsed_ns / 1e9, nb = (double)wl->batches;
    const struct kvi_listener_counters *ctr = &r->tot.ctr;
    double bps = nb / secs, blkps = (double)ctr->blocks_stored / secs;
    uint64_t dec = 0, ing = 0, busy = 0;
    for (uint32_t t = 0; t < c->listeners; t++) {
        dec += r->ls1[t].decode_ns - r->ls0[t].decode_ns;
        ing += r->ls1[t].ingest_ns - r->ls0[t].ingest_ns;
        busy += r->ls1[t].busy_ns - r->ls0[t].busy_ns;
    }
    uint64_t wbusy = 0, wstall = 0;
    for (uint32_t w = 0; w < c->writers; w++) {
        wbusy += r->ws1[w].busy_ns - r->ws0[w].busy_ns;
        wstall += r->ws1[w].stalls - r->ws0[w].stalls;
    }
    uint64_t lcpu_ns = 0;
    for (uint32_t t = 0; t < c->listeners; t++)
        lcpu_ns += r->ls1[t].cpu_ns - r->ls0[t].cpu_ns;
    double lcpu = (double)lcpu_ns / 1e9, wcpu = r->cpu1[CPU_WRITER] - r->cpu0[CPU_WRITER];
    double per_lb = lcpu > 0 ? nb / lcpu : 0, per_lk = lcpu > 0 ? (double)ctr->blocks_stored / lcpu : 0;

    printf("\n  %-46s %14s\n", "metric", "value");
    ingest_row("elapsed s (first send -> last op applied)", secs);
    ingest_row("publishers done sending, s", (double)r->sent_ns / 1e9);
    ingest_row("batches/s", bps);
    ingest_row("events/s", (double)(wl->ev_st + wl->ev_rm) / secs);
    ingest_row("stored blocks/s", blkps);
    ingest_row("batches per listener CPU-second", per_lb);
    ingest_row("stored blocks per listener CPU-second", per_lk);
    ingest_row("stored blocks per writer CPU-second", wcpu > 0 ? (double)ctr->blocks_stored / wcpu : 0);
    ingest_row("payload MB/s", (double)wl->payload / 1e6 / secs);
    ingest_row("listener decode ns per batch", (double)dec / nb);
    ingest_row("listener ingest + submit ns per batch", (double)ing / nb);
    ingest_row("listener other ns per batch (recv, framing)", (double)(busy - KVI_MIN(busy, dec + ing)) / nb);
    ingest_row("listener busy % of elapsed (per thread)", 100.0 * (double)busy / c->listeners / (double)r->elapsed_ns);
    ingest_row("writer busy % of elapsed (per writer)", 100.0 * (double)wbusy / c->writers / (double)r->elapsed_ns);
    ingest_row("writer ring stalls", (double)wstall);
    ingest_row("stored blocks applied", (double)ctr->blocks_stored);
    ingest_row("removed hashes known to the index", (double)ctr->hashes_removed);
    ingest_row("stores rejected (parent unknown)", (double)ctr->ops_parent_not_found);
    ingest_row("gaps", (double)ctr->gaps);
    ingest_row("lost batches", (double)ctr->lost);
    ingest_row("decode errors", (double)ctr->decode_errors);
    if (r->pub_err != 0)
        printf("  publisher error: %s\n", strerror(-r->pub_err));
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("\n  CPU seconds used during the run (%.2f s wall x %ld CPUs = %.2f CPU-s):\n", secs, ncpu,
           (double)ncpu * secs);
    for (int i = 0; i < CPU_GROUPS; i++)
        printf("    %-44s %14.2f\n", cpu_group_name[i], i == CPU_LISTEN ? lcpu : r->cpu1[i] - r->cpu0[i]);
    /* the consumer's side: listeners, writers and every ZMQ I/O thread (the publishers' context's too) */
    double daemon = lcpu + wcpu + (r->cpu1[CPU_ZMQ] - r->cpu0[CPU_ZMQ]);
    double blocks = (double)ctr->blocks_stored;
    printf("    %-44s %14.0f\n", "daemon side ns per stored block", blocks > 0 ? daemon * 1e9 / blocks : 0);
    *out = (struct ingest_summary){
        .ok = ctr->gaps == 0 && ctr->lost == 0 && ctr->decode_errors == 0 && ctr->batches == wl->batches,
        .secs = secs,
        .blocks = blocks,
        .events = (double)(wl->ev_st + wl->ev_rm),
        .messages = nb,
        .daemon_cpu_s = daemon,
        .pub_cpu_s = r->cpu1[CPU_PUB] - r->cpu0[CPU_PUB],
        .lost = ctr->gaps + ctr->lost,
    };
    snprintf(out->transport, sizeof out->transport, "%s", c->transport);

    printf("{\"bench\":\"ingest\",\"batches_per_s\":%.0f,\"blocks_per_s\":%.0f,\"listener_threads\":%u,"
           "\"writer_threads\":%u,\"batches_per_listener_cpu_s\":%.0f,\"blocks_per_listener_cpu_s\":%.0f,"
           "\"workers\":%u,\"block_size\":%u,\"transport\":\"%s\",\"batches\":%llu,\"stored_blocks\":%llu,"
           "\"removed_hashes\":%llu,\"payload_mb\":%.1f,\"decode_ns_per_batch\":%.0f,\"ingest_ns_per_batch\":%.0f,"
           "\"writer_busy_pct\":%.1f,\"gaps\":%llu,\"lost\":%llu,\"trace\":\"%s\",\"events_per_s\":%.0f,"
           "\"daemon_cpu_ns_per_block\":%.0f}\n",
           bps, blkps, c->listeners, c->writers, per_lb, per_lk, c->workers, c->block_size, c->transport,
           (unsigned long long)wl->batches, (unsigned long long)ctr->blocks_stored,
           (unsigned long long)ctr->hashes_removed, (double)wl->payload / 1e6, (double)dec / nb, (double)ing / nb,
           100.0 * (double)wbusy / c->writers / (double)r->elapsed_ns, (unsigned long long)ctr->gaps,
           (unsigned long long)ctr->lost, wl->tr->synthetic ? "synthetic" : "conversation",
           (double)(wl->ev_st + wl->ev_rm) / secs, blocks > 0 ? daemon * 1e9 / blocks : 0);
}

/* One ZMQ transport's run (c->transport tcp, ipc or inproc). @return 0, or 1 when set-up failed. */
static int zmq_run(const struct ingest_cfg *c, struct ingest_workload *wl, struct ingest_summary *out)
{
    printf("\n== transport %s: ZMQ, vLLM msgpack batches ==\n", c->transport);
    struct pipeline pl = {0};
    int rc = pipeline_setup(&pl, c, wl->eng) == 0 && pipeline_sync(&pl, c, wl->eng) == 0 ? 0 : 1;
    if (rc == 0) {
        struct run *r = kvi_xcalloc(1, sizeof *r);
        run_timed(r, &pl, c, wl);
        report(r, c, wl, out);
        free(r);
    }
    pipeline_free(&pl, c, wl->eng);
    return rc;
}

/* The closing table of an invocation that ran several transports. */
static void summary(const struct ingest_summary *s, uint32_t n)
{
    printf("\n== summary: one workload, every transport ==\n");
    printf("  %-14s %8s %12s %10s %10s %12s %12s %12s %6s\n", "transport", "s", "blocks/s", "events/s", "msgs/s",
           "daemon ns/b", "server ns/b", "pub ns/b", "ok");
    for (uint32_t i = 0; i < n; i++) {
        const struct ingest_summary *x = &s[i];
        if (x->secs <= 0) {
            printf("  %-14s (set-up failed: not run)\n", x->transport);
            continue;
        }
        double b = x->blocks > 0 ? x->blocks : 1;
        printf("  %-14s %8.2f %12.0f %10.0f %10.0f %12.0f %12.0f %12.0f %6s\n", x->transport, x->secs,
               x->blocks / x->secs, x->events / x->secs, x->messages / x->secs, x->daemon_cpu_s * 1e9 / b,
               x->server_cpu_s * 1e9 / b, x->pub_cpu_s * 1e9 / b, x->ok ? "yes" : "NO");
    }
    printf("  (ns/b: CPU ns per stored block; daemon = listeners or NATS source + its libnats threads, writers,\n"
           "   and for ZMQ every ZMQ I/O thread; server = nats-server; pub = publisher threads + their libnats)\n");
}

int kvi_bench_ingest(int argc, char **argv)
{
    struct ingest_cfg c = {.workers = 8, .publishers = 1, .listeners = 1, .writers = 1, .block_size = 16,
                           .cache_ids = 4096, .trace = DEFAULT_TRACE, .transport = "tcp", .seed = 42};
    int rc = parse_args(&c, argc, argv);
    if (rc >= 0)
        return rc;
    struct ingest_workload wl;
    workload_build(&wl, &c);
    kvi_rcu_register_thread();
    struct ingest_summary sum[INGEST_MAX_TRANSPORTS] = {0};
    rc = 0;
    for (uint32_t i = 0; i < c.n_transports; i++) {
        struct ingest_cfg one = c;
        one.transport = c.transports[i];
        int r = is_nats(one.transport) ? ingest_nats_run(&one, &wl, &sum[i]) : zmq_run(&one, &wl, &sum[i]);
        snprintf(sum[i].transport, sizeof sum[i].transport, "%s", one.transport);
        rc = rc ? rc : r;
    }
    if (c.want_events)
        ingest_nats_costs(&c, &wl);
    if (c.n_transports > 1)
        summary(sum, c.n_transports);
    kvi_rcu_unregister_thread();
    workload_free(&wl, &c);
    return rc;
}
