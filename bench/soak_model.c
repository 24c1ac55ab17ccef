/*
 * The soak's pure parts (see bench/soak.h): the expected state and its /dump
 * comparator, the RSS verdict, the defaults and the JSON line. soak.c runs
 * the soak itself.
 *
 * DESIGN
 *   One table per worker (engine hash -> slot in a block array with a free
 *   list), so each worker's part is touched by one thread only. A block keeps
 *   its parent's engine hash, its content hash, its depth (the parent's + 1,
 *   0 for a root: what /dump prints as start_position) and how many held
 *   blocks name it as parent (only to count removals that would orphan them).
 *   The comparator marks each block it meets in the dump (`seen`) and counts
 *   the unmarked ones as missing at the end.
 */
#include "bench/soak.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace.h"
#include "bench/trace_map.h"
#include "engine/common.h"

/* ---- the model ---------------------------------------------------------------------- */

#define SM_NONE UINT32_MAX

struct sm_block {
    uint64_t eh, parent, content;
    uint32_t depth;
    uint32_t children; /* held blocks whose parent this is */
    bool has_parent;
    bool seen;         /* listed by the dump under comparison */
};

struct sm_worker {
    struct kvi_u64map map; /* engine hash -> index in b */
    struct sm_block *b;
    uint32_t n, cap;       /* slots in use (held or on the free list) */
    uint32_t *free_slots;
    uint32_t n_free, cap_free;
    uint64_t orphaning;
};

struct kvi_soak_model {
    uint32_t n_workers;
    struct sm_worker *w;
};

struct kvi_soak_model *kvi_soak_model_create(uint32_t n_workers)
{
    struct kvi_soak_model *m = kvi_xcalloc(1, sizeof *m);
    m->n_workers = n_workers;
    m->w = kvi_xcalloc(n_workers ? n_workers : 1, sizeof *m->w);
    for (uint32_t i = 0; i < n_workers; i++)
        kvi_u64map_init(&m->w[i].map);
    return m;
}

void kvi_soak_model_destroy(struct kvi_soak_model *m)
{
    if (m == NULL)
        return;
    for (uint32_t i = 0; i < m->n_workers; i++) {
        kvi_u64map_free(&m->w[i].map);
        free(m->w[i].b);
        free(m->w[i].free_slots);
    }
    free(m->w);
    free(m);
}

static uint32_t sm_alloc(struct sm_worker *s)
{
    if (s->n_free > 0)
        return s->free_slots[--s->n_free];
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->b = kvi_xrealloc(s->b, (size_t)s->cap * sizeof *s->b);
    }
    return s->n++;
}

static void sm_release(struct sm_worker *s, uint32_t slot)
{
    if (s->n_free == s->cap_free) {
        s->cap_free = s->cap_free ? 2 * s->cap_free : 256;
        s->free_slots = kvi_xrealloc(s->free_slots, (size_t)s->cap_free * sizeof *s->free_slots);
    }
    s->free_slots[s->n_free++] = slot;
}

int kvi_soak_model_store(struct kvi_soak_model *m, uint32_t w, bool has_parent, uint64_t parent,
                         const uint64_t *eh, const uint64_t *content, uint32_t n)
{
    if (w >= m->n_workers || n == 0 || eh == NULL || content == NULL)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        if (has_parent && eh[i] == parent)
            return -EINVAL;
        for (uint32_t j = 0; j < i; j++)
            if (eh[j] == eh[i])
                return -EINVAL;
    }
    struct sm_worker *s = &m->w[w];
    uint64_t prev = SM_NONE;
    uint32_t depth = 0;
    if (has_parent) {
        if (!kvi_u64map_get(&s->map, parent, &prev))
            return -ENOENT;
        depth = s->b[prev].depth + 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t slot;
        if (kvi_u64map_get(&s->map, eh[i], &slot)) { /* idempotent: the held block stays as it is */
            prev = slot;
            depth = s->b[slot].depth + 1;
            continue;
        }
        slot = sm_alloc(s);
        bool hp = i > 0 || has_parent;
        s->b[slot] = (struct sm_block){
            .eh = eh[i],
            .parent = i > 0 ? eh[i - 1] : (has_parent ? parent : 0),
            .content = content[i],
            .depth = depth,
            .has_parent = hp,
        };
        if (prev != SM_NONE)
            s->b[prev].children++;
        kvi_u64map_put(&s->map, eh[i], slot);
        prev = slot;
        depth++;
    }
    return 0;
}

uint32_t kvi_soak_model_remove(struct kvi_soak_model *m, uint32_t w, const uint64_t *eh, uint32_t n)
{
    if (w >= m->n_workers)
        return 0;
    struct sm_worker *s = &m->w[w];
    uint32_t known = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t slot, ps;
        if (!kvi_u64map_del(&s->map, eh[i], &slot))
            continue;
        known++;
        struct sm_block *b = &s->b[slot];
        if (b->children > 0)
            s->orphaning++;
        if (b->has_parent && kvi_u64map_get(&s->map, b->parent, &ps) && s->b[ps].children > 0)
            s->b[ps].children--;
        sm_release(s, (uint32_t)slot);
    }
    return known;
}

size_t kvi_soak_model_blocks(const struct kvi_soak_model *m, uint32_t w)
{
    return w < m->n_workers ? kvi_u64map_size(&m->w[w].map) : 0;
}

size_t kvi_soak_model_total(const struct kvi_soak_model *m)
{
    size_t t = 0;
    for (uint32_t w = 0; w < m->n_workers; w++)
        t += kvi_u64map_size(&m->w[w].map);
    return t;
}

bool kvi_soak_model_holds(const struct kvi_soak_model *m, uint32_t w, uint64_t eh)
{
    return w < m->n_workers && kvi_u64map_get(&m->w[w].map, eh, NULL);
}

bool kvi_soak_model_next(const struct kvi_soak_model *m, uint32_t w, size_t *pos, uint64_t *eh)
{
    uint64_t slot;
    return w < m->n_workers && kvi_u64map_next(&m->w[w].map, pos, eh, &slot);
}

uint64_t kvi_soak_model_orphaning_removes(const struct kvi_soak_model *m)
{
    uint64_t t = 0;
    for (uint32_t w = 0; w < m->n_workers; w++)
        t += m->w[w].orphaning;
    return t;
}

/* ---- the /dump comparator ------------------------------------------------------------ */

#include "api/codec_dump.h"

struct kvi_soak_cmp {
    struct kvi_soak_model *m;
    struct kvi_soak_diff *d;
    char model[128];
    uint64_t id0;
    struct kvi_dump_dec *dec;
    int rc;
};

static void show(struct kvi_soak_diff *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void show(struct kvi_soak_diff *d, const char *fmt, ...)
{
    if (d->n_shown >= KVI_SOAK_DIFF_SHOW)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->shown[d->n_shown++], sizeof d->shown[0], fmt, ap);
    va_end(ap);
}

static void fmt_parent(char *out, size_t cap, bool has, uint64_t parent)
{
    if (has)
        snprintf(out, cap, "%#llx", (unsigned long long)parent);
    else
        snprintf(out, cap, "root");
}

static int cmp_rec(void *ctx, const struct kvi_dump_rec *r)
{
    struct kvi_soak_cmp *c = ctx;
    struct kvi_soak_diff *d = c->d;
    if (r->op != KVI_DUMP_STORED) {
        d->extra++;
        show(d, "extra: a %s record in /dump (only stored blocks expected)",
             r->op == KVI_DUMP_REMOVED ? "removed" : "cleared");
        return 0;
    }
    d->dump_blocks++;
    size_t ml = strlen(c->model);
    bool ns = r->model.len == ml && memcmp(r->model.p, c->model, ml) == 0 && r->tenant.len == 7 &&
              memcmp(r->tenant.p, "default", 7) == 0;
    uint64_t w = r->worker_id - c->id0;
    if (!ns || r->worker_named || r->worker_id < c->id0 || w >= c->m->n_workers || r->dp_rank != 0 ||
        r->tier != KVI_TIER_GPU || r->no_content) {
        d->extra++;
        show(d, "extra: block %#llx of %.*s:%.*s worker %llu rank %u tier %s%s is no soak worker's",
             (unsigned long long)r->engine_hash, (int)KVI_MIN(r->model.len, 64), r->model.p,
             (int)KVI_MIN(r->tenant.len, 32), r->tenant.p, (unsigned long long)r->worker_id, r->dp_rank,
             kvi_dump_tier_name(r->tier), r->no_content ? " (no content)" : "");
        return 0;
    }
    struct sm_worker *s = &c->m->w[w];
    uint64_t slot;
    char pd[24], pm[24];
    fmt_parent(pd, sizeof pd, r->has_parent, r->parent_hash);
    if (!kvi_u64map_get(&s->map, r->engine_hash, &slot)) {
        d->extra++;
        show(d, "extra: worker %llu block %#llx (parent %s, depth %u) is in /dump, not in the model",
             (unsigned long long)w, (unsigned long long)r->engine_hash, pd, r->position);
        return 0;
    }
    struct sm_block *b = &s->b[slot];
    if (b->seen) {
        d->duplicates++;
        show(d, "duplicate: worker %llu block %#llx listed twice", (unsigned long long)w,
             (unsigned long long)r->engine_hash);
        return 0;
    }
    b->seen = true;
    bool same = r->has_parent == b->has_parent && (!b->has_parent || r->parent_hash == b->parent) &&
                r->content_hash == b->content && r->has_position && r->position == b->depth;
    if (same) {
        d->matched++;
        return 0;
    }
    d->wrong++;
    fmt_parent(pm, sizeof pm, b->has_parent, b->parent);
    show(d, "wrong: worker %llu block %#llx: /dump parent %s content %#llx depth %d, model parent %s content %#llx "
         "depth %u",
         (unsigned long long)w, (unsigned long long)r->engine_hash, pd, (unsigned long long)r->content_hash,
         r->has_position ? (int)r->position : -1, pm, (unsigned long long)b->content, b->depth);
    return 0;
}

struct kvi_soak_cmp *kvi_soak_cmp_begin(struct kvi_soak_model *m, const char *model_name, uint64_t id0,
                                        struct kvi_soak_diff *d)
{
    memset(d, 0, sizeof *d);
    struct kvi_soak_cmp *c = kvi_xcalloc(1, sizeof *c);
    c->m = m;
    c->d = d;
    c->id0 = id0;
    snprintf(c->model, sizeof c->model, "%s", model_name);
    for (uint32_t w = 0; w < m->n_workers; w++)
        for (uint32_t i = 0; i < m->w[w].n; i++)
            m->w[w].b[i].seen = false;
    struct kvi_dump_dec_cb cb = {.rec = cmp_rec, .ctx = c};
    c->dec = kvi_dump_dec_create(&cb);
    if (c->dec == NULL)
        kvi_die("out of memory");
    return c;
}

int kvi_soak_cmp_feed(struct kvi_soak_cmp *c, const void *data, size_t len)
{
    if (c->rc == 0 && (c->rc = kvi_dump_dec_feed(c->dec, data, len)) != 0)
        snprintf(c->d->error, sizeof c->d->error, "%s", kvi_dump_dec_error(c->dec));
    return c->rc ? -EBADMSG : 0;
}

int kvi_soak_cmp_end(struct kvi_soak_cmp *c)
{
    struct kvi_soak_diff *d = c->d;
    if (c->rc == 0 && (c->rc = kvi_dump_dec_finish(c->dec)) != 0)
        snprintf(d->error, sizeof d->error, "%s", kvi_dump_dec_error(c->dec));
    d->decoded = c->rc == 0;
    for (uint32_t w = 0; d->decoded && w < c->m->n_workers; w++) {
        struct sm_worker *s = &c->m->w[w];
        size_t pos = 0;
        uint64_t eh, slot;
        while (kvi_u64map_next(&s->map, &pos, &eh, &slot)) {
            const struct sm_block *b = &s->b[slot];
            if (b->seen)
                continue;
            d->missing++;
            char pm[24];
            fmt_parent(pm, sizeof pm, b->has_parent, b->parent);
            show(d, "missing: worker %u block %#llx (parent %s, depth %u) is in the model, not in /dump", w,
                 (unsigned long long)eh, pm, b->depth);
        }
    }
    d->equal = d->decoded && d->missing == 0 && d->extra == 0 && d->wrong == 0 && d->duplicates == 0;
    kvi_dump_dec_destroy(c->dec);
    int rc = d->decoded ? 0 : -EBADMSG;
    free(c);
    return rc;
}

/* ---- the RSS verdict ------------------------------------------------------------------ */

static uint64_t median3(uint64_t a, uint64_t b, uint64_t c)
{
    return KVI_MAX(KVI_MIN(a, b), KVI_MIN(KVI_MAX(a, b), c));
}

void kvi_soak_rss_judge(const double *t_s, const uint64_t *kb, size_t n, double warm_s, double bound,
                        struct kvi_soak_rss *out)
{
    memset(out, 0, sizeof *out);
    size_t first = n;
    for (size_t i = 0; i < n; i++) {
        out->max_kb = KVI_MAX(out->max_kb, kb[i]);
        if (first == n && t_s[i] >= warm_s)
            first = i;
    }
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = first; i < n; i++) {
        uint64_t m = median3(kb[i > first ? i - 1 : i], kb[i], kb[i + 1 < n ? i + 1 : i]);
        if (out->after == 0)
            out->level_kb = out->min_after_kb = m;
        out->max_after_kb = KVI_MAX(out->max_after_kb, m);
        out->min_after_kb = KVI_MIN(out->min_after_kb, m);
        out->raw_max_after_kb = KVI_MAX(out->raw_max_after_kb, kb[i]);
        double x = t_s[i] / 60.0, y = (double)kb[i];
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
        out->after++;
    }
    double k = (double)out->after, den = k * sxx - sx * sx;
    out->slope_kb_per_min = out->after >= 2 && den > 0 ? (k * sxy - sx * sy) / den : 0;
    out->ok = out->after >= 3 && out->level_kb > 0 &&
              (double)out->max_after_kb <= (double)out->level_kb * (1.0 + bound);
}

/* ---- defaults and the JSON line ---------------------------------------------------------- */

void kvi_soak_defaults(struct kvi_soak_cfg *c)
{
    struct kvi_trace_workload_cfg wl;
    kvi_trace_workload_defaults(&wl);
    *c = (struct kvi_soak_cfg){
        .seconds = 60,
        .synth_requests = 12000,
        .workers = wl.n_workers,
        .block_size = wl.block_size,
        .gpu_blocks = wl.gpu_blocks,
        .lanes = 2,
        .writers = 1,
        .replay_batches = 64,
        .loop_s = 30,
        .sim_ms = wl.sim_ms,
        .warmup_frac = 0.2,
        .rss_bound = 0.10,
        .rss_interval_s = 5,
        .report_s = 30,
        .seed = wl.seed,
    };
}

void kvi_soak_print_json(FILE *f, double minutes, const struct kvi_soak_result *r)
{
    fprintf(f,
            "{\"bench\":\"soak\",\"minutes\":%.2f,\"queries\":%llu,\"events_published\":%llu,\"events_applied\":%llu,"
            "\"events_rejected\":%llu,\"rss_start_kb\":%llu,\"rss_max_kb\":%llu,\"rss_end_kb\":%llu,"
            "\"dump_equal\":%s,\"ok\":%s}\n",
            minutes, (unsigned long long)r->queries, (unsigned long long)(r->ev_stored + r->ev_removed),
            (unsigned long long)r->k_ops_applied, (unsigned long long)r->k_ops_rejected,
            (unsigned long long)r->rss_start_kb, (unsigned long long)r->rss_max_kb,
            (unsigned long long)r->rss_end_kb, r->diff.equal ? "true" : "false", r->ok ? "true" : "false");
    fflush(f);
}
