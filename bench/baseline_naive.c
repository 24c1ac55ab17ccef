/* Baseline naive nested map behind one rwlock (see bench/baseline_naive.h). */
#include "bench/baseline_naive.h"

#include <errno.h>
#include <pthread.h>

#include "bench/trace_map.h"
#include "engine/common.h"
#include "engine/hash.h"

struct nworker {
    struct kvi_u64map held;  /* sequence hash -> number of engine hashes naming it */
    struct kvi_u64map names; /* engine hash -> sequence hash */
};

struct kvi_bl_naive {
    pthread_rwlock_t lock;
    uint32_t n_workers;
    struct nworker *w;
    uint64_t holdings;
};

struct kvi_bl_naive *kvi_bl_naive_create(uint32_t n_workers)
{
    struct kvi_bl_naive *m = kvi_xcalloc(1, sizeof *m);
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    if (pthread_rwlock_init(&m->lock, &a) != 0)
        kvi_die("rwlock init");
    pthread_rwlockattr_destroy(&a);
    m->n_workers = n_workers;
    m->w = kvi_xcalloc(n_workers ? n_workers : 1, sizeof *m->w);
    for (uint32_t i = 0; i < n_workers; i++) {
        kvi_u64map_init(&m->w[i].held);
        kvi_u64map_init(&m->w[i].names);
    }
    return m;
}

void kvi_bl_naive_destroy(struct kvi_bl_naive *m)
{
    if (m == NULL)
        return;
    for (uint32_t i = 0; i < m->n_workers; i++) {
        kvi_u64map_free(&m->w[i].held);
        kvi_u64map_free(&m->w[i].names);
    }
    free(m->w);
    pthread_rwlock_destroy(&m->lock);
    free(m);
}

static void held_add(struct kvi_bl_naive *m, struct nworker *w, uint64_t seq)
{
    uint64_t c = 0;
    kvi_u64map_get(&w->held, seq, &c);
    kvi_u64map_put(&w->held, seq, c + 1);
    if (c == 0)
        m->holdings++;
}

static void held_drop(struct kvi_bl_naive *m, struct nworker *w, uint64_t seq)
{
    uint64_t c = 0;
    if (!kvi_u64map_get(&w->held, seq, &c))
        return;
    if (c > 1) {
        kvi_u64map_put(&w->held, seq, c - 1);
        return;
    }
    kvi_u64map_del(&w->held, seq, NULL);
    m->holdings--;
}

int kvi_bl_naive_store(struct kvi_bl_naive *m, uint32_t worker, bool has_parent, uint64_t parent,
                       const uint64_t *engine_hash, const uint64_t *content, size_t n)
{
    if (worker >= m->n_workers)
        return -EINVAL;
    if (n == 0)
        return 0;
    int r = 0;
    pthread_rwlock_wrlock(&m->lock);
    struct nworker *w = &m->w[worker];
    uint64_t seq = 0;
    if (has_parent && !kvi_u64map_get(&w->names, parent, &seq)) {
        r = -ENOENT;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        seq = (i == 0 && !has_parent) ? content[0] : kvi_seq_hash_next(seq, content[i]);
        uint64_t old;
        if (kvi_u64map_get(&w->names, engine_hash[i], &old)) {
            if (old == seq)
                continue;
            held_drop(m, w, old);
        }
        kvi_u64map_put(&w->names, engine_hash[i], seq);
        held_add(m, w, seq);
    }
out:
    pthread_rwlock_unlock(&m->lock);
    return r;
}

size_t kvi_bl_naive_remove(struct kvi_bl_naive *m, uint32_t worker, const uint64_t *engine_hash, size_t n)
{
    if (worker >= m->n_workers)
        return 0;
    size_t known = 0;
    pthread_rwlock_wrlock(&m->lock);
    struct nworker *w = &m->w[worker];
    for (size_t i = 0; i < n; i++) {
        uint64_t seq;
        if (!kvi_u64map_del(&w->names, engine_hash[i], &seq))
            continue;
        known++;
        held_drop(m, w, seq);
    }
    pthread_rwlock_unlock(&m->lock);
    return known;
}

size_t kvi_bl_naive_find(struct kvi_bl_naive *m, struct kvi_bl_scratch *s, const uint64_t *content, size_t n,
                         struct kvi_bl_score *out, size_t cap)
{
    if (n == 0)
        return 0;
    if (n > s->cap_seq) {
        s->cap_seq = n > 2 * s->cap_seq ? n : 2 * s->cap_seq;
        s->seq = kvi_xrealloc(s->seq, s->cap_seq * sizeof *s->seq);
    }
    kvi_seq_hashes(content, n, s->seq);
    size_t k = 0;
    pthread_rwlock_rdlock(&m->lock);
    for (uint32_t i = 0; i < m->n_workers; i++) {
        const struct kvi_u64map *held = &m->w[i].held;
        size_t d = 0;
        while (d < n && kvi_u64map_get(held, s->seq[d], NULL))
            d++;
        if (d == 0)
            continue;
        if (k < cap)
            out[k] = (struct kvi_bl_score){i, (uint32_t)d};
        k++;
    }
    pthread_rwlock_unlock(&m->lock);
    return k;
}

uint64_t kvi_bl_naive_holdings(struct kvi_bl_naive *m)
{
    pthread_rwlock_rdlock(&m->lock);
    uint64_t h = m->holdings;
    pthread_rwlock_unlock(&m->lock);
    return h;
}
