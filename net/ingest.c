/*
 * Event ingest: decoded batches -> engine ops (rules in net/ingest.h).
 *
 * The hot path is ingest_store_tokens: one kvi_op_alloc per event, the
 * content hash of each block written straight into the op (no intermediate
 * array), the op pointer parked in the target's burst array and submitted
 * with one kvi_producer_submit_burst per KVI_INGEST_BURST ops or per batch.
 * Nothing else allocates on the path: the seed of the last (adapter, salt)
 * pair and the dense ids of shared pools are cached in the target's scratch.
 */
#include "net/ingest.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/common.h"
#include "engine/hash.h"
#include "net/log.h"

/* LoRA name + salt bytes up to this length are cached with their seed. */
#define SEED_CACHE_MAX 256

struct pool_ent {
    char *name;        /* NUL-terminated copy of backend_id */
    uint32_t len;
    uint32_t instance; /* dense id, interned shared */
};

struct kvi_ingest_scratch {
    struct kvi_op *ops[KVI_INGEST_BURST]; /* ops waiting for the next burst */
    size_t n_ops;
    uint64_t n_pushed;   /* ops ever pushed (kvi_ingest_batch's return) */
    uint32_t mirror_idx; /* mirrored ops of the current batch */
    uint32_t block_size; /* resolved registered block size */
    /* seed of the last (lora_name, cache_salt) pair seen */
    bool seed_valid;
    uint32_t seed_lora_len, seed_salt_len;
    uint64_t seed;
    char seed_key[SEED_CACHE_MAX]; /* lora bytes then salt bytes */
    int32_t fa_group; /* group of the first full_attention event, or -1 */
    /* shared pools this target stored into, in first-seen order */
    struct pool_ent *pools;
    size_t n_pools, cap_pools;
    size_t last_pool; /* index of the last pool hit (most streams name one) */
};

#define CTR_ADD(t, field, v)                                                   \
    do {                                                                       \
        if ((t)->ctr != NULL)                                                  \
            kvi_relaxed_add(&(t)->ctr->field, (uint64_t)(v));                  \
    } while (0)

__attribute__((format(printf, 2, 3))) static void ingest_warn(struct kvi_ingest_target *t, const char *fmt, ...);

/* A warning through net/log.h ("ingest instance 7 rank 0: ..."), within the target's budget. */
static void ingest_warn(struct kvi_ingest_target *t, const char *fmt, ...)
{
    if (t->warn_budget == 0 || !kvi_log_enabled(KVI_LOG_WARN))
        return;
    t->warn_budget--;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvi_log_warn("ingest %s: %s%s", t->name ? t->name : "(unnamed)", msg,
                 t->warn_budget == 0 ? " (further warnings suppressed)" : "");
}

/* ---- target life cycle ---------------------------------------------------- */

int kvi_ingest_target_init(struct kvi_ingest_target *t)
{
    t->_s = NULL;
    if (t->ix == NULL)
        return -EINVAL;
    uint32_t ixb = kvi_index_block_size(t->ix);
    if (t->block_size != 0 && t->block_size != ixb)
        return -EINVAL;
    struct kvi_ingest_scratch *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->block_size = ixb;
    s->fa_group = -1;
    if (t->warn_budget == 0)
        t->warn_budget = KVI_INGEST_WARN_BUDGET;
    t->_s = s;
    return 0;
}

void kvi_ingest_target_fini(struct kvi_ingest_target *t)
{
    struct kvi_ingest_scratch *s = t->_s;
    if (s == NULL)
        return;
    /* Ops still parked were never submitted (only possible if a caller broke
     * the one-thread rule mid-batch); free them rather than leak. */
    for (size_t i = 0; i < s->n_ops; i++)
        kvi_op_free(s->ops[i]);
    for (size_t i = 0; i < s->n_pools; i++)
        free(s->pools[i].name);
    free(s->pools);
    free(s);
    t->_s = NULL;
}

/* ---- helpers -------------------------------------------------------------- */

static void ops_flush(struct kvi_ingest_target *t, struct kvi_producer *p)
{
    struct kvi_ingest_scratch *s = t->_s;
    if (s->n_ops == 0)
        return;
    kvi_producer_submit_burst(p, s->ops, s->n_ops);
    CTR_ADD(t, ops_submitted, s->n_ops);
    s->n_ops = 0;
}

static void ops_push(struct kvi_ingest_target *t, struct kvi_producer *p, struct kvi_op *op)
{
    struct kvi_ingest_scratch *s = t->_s;
    op->ix = t->ix;
    op->sink = t->sink;
    if (t->pub_applied && op->instance == t->instance) {
        op->pub_applied = true;
        op->applied1 = t->applied1;
    }
    if (t->mirror != NULL && op->instance == t->instance) {
        struct kvi_ingest_mirror_pos pos = t->mirror_pos;
        if (!pos.reset)
            pos.idx = s->mirror_idx++;
        t->mirror(t->mirror_ctx, op, &pos);
    }
    s->ops[s->n_ops++] = op;
    s->n_pushed++;
    if (s->n_ops == KVI_INGEST_BURST)
        ops_flush(t, p);
}

static struct kvi_op *op_new(uint8_t type, uint32_t instance, uint32_t dp_rank, uint32_t n, bool with_seq)
{
    struct kvi_op *op = kvi_op_alloc(n, with_seq);
    op->type = type;
    op->instance = instance;
    op->dp_rank = dp_rank;
    op->n = n;
    return op;
}

/* Content-hash seed of an event's adapter and salt; cached for the last pair. */
static uint64_t event_seed(struct kvi_ingest_scratch *s, const struct kvi_ev *ev)
{
    uint32_t ll = ev->lora_name != NULL ? ev->lora_len : 0;
    uint32_t sl = ev->cache_salt != NULL ? ev->salt_len : 0;
    if (ll == 0 && sl == 0)
        return KVI_HASH_SEED;
    if (s->seed_valid && s->seed_lora_len == ll && s->seed_salt_len == sl &&
        (ll == 0 || memcmp(s->seed_key, ev->lora_name, ll) == 0) &&
        (sl == 0 || memcmp(s->seed_key + ll, ev->cache_salt, sl) == 0))
        return s->seed;
    uint64_t seed = kvi_hash_seed(ev->lora_name, ll, ev->cache_salt, sl);
    if ((size_t)ll + sl <= SEED_CACHE_MAX) {
        if (ll)
            memcpy(s->seed_key, ev->lora_name, ll);
        if (sl)
            memcpy(s->seed_key + ll, ev->cache_salt, sl);
        s->seed_lora_len = ll;
        s->seed_salt_len = sl;
        s->seed = seed;
        s->seed_valid = true;
    }
    return seed;
}

/*
 * Dense id of the shared pool named by an RFC 1527 backend_id, interned on
 * first sight and cached. @return the id, or -EINVAL (embedded NUL) /
 * -ENOMEM.
 */
static int64_t pool_instance(struct kvi_ingest_target *t, const char *name, uint32_t len)
{
    struct kvi_ingest_scratch *s = t->_s;
    if (s->last_pool < s->n_pools) {
        const struct pool_ent *e = &s->pools[s->last_pool];
        if (e->len == len && memcmp(e->name, name, len) == 0)
            return e->instance;
    }
    for (size_t i = 0; i < s->n_pools; i++) {
        const struct pool_ent *e = &s->pools[i];
        if (e->len == len && memcmp(e->name, name, len) == 0) {
            s->last_pool = i;
            return e->instance;
        }
    }
    if (memchr(name, '\0', len) != NULL)
        return -EINVAL;
    if (s->n_pools == s->cap_pools) {
        size_t cap = s->cap_pools ? 2 * s->cap_pools : 4;
        struct pool_ent *np = realloc(s->pools, cap * sizeof *np);
        if (np == NULL)
            return -ENOMEM;
        s->pools = np;
        s->cap_pools = cap;
    }
    char *copy = malloc((size_t)len + 1);
    if (copy == NULL)
        return -ENOMEM;
    memcpy(copy, name, len);
    copy[len] = '\0';
    int64_t id = kvi_index_intern_instance(t->ix, 0, copy, true);
    if (id < 0) {
        free(copy);
        return id;
    }
    s->pools[s->n_pools] = (struct pool_ent){.name = copy, .len = len, .instance = (uint32_t)id};
    s->last_pool = s->n_pools++;
    return id;
}

/* The instance an event's blocks belong to: its pool for RFC 1527 events
 * naming a backend, else the target's. @return id or negative errno. */
static int64_t event_instance(struct kvi_ingest_target *t, const struct kvi_ev *ev)
{
    if (ev->family == KVI_EVF_RFC1527 && ev->backend_id != NULL && ev->backend_len > 0)
        return pool_instance(t, ev->backend_id, ev->backend_len);
    return t->instance;
}

static bool tokens_usable(const struct kvi_ev *ev)
{
    if (ev->tokens_form != KVI_TOK_FLAT && ev->tokens_form != KVI_TOK_PAIRS)
        return false;
    if (ev->n_tokens == 0 || ev->tokens == NULL)
        return false;
    return !(ev->has_block_size && ev->block_size == 0);
}

/* ---- per-event conversion -------------------------------------------------- */

/* Stored event with tokens: content hashes from the registered block size. */
static void ingest_store_tokens(struct kvi_ingest_target *t, struct kvi_producer *p, const struct kvi_ev *ev,
                                uint32_t instance, uint32_t dp_rank)
{
    struct kvi_ingest_scratch *s = t->_s;
    uint32_t bs = s->block_size;
    uint32_t n = ev->n_hashes;
    if (ev->has_block_size && ev->block_size != bs) {
        CTR_ADD(t, block_size_mismatch, 1);
        CTR_ADD(t, blocks_dropped, n);
        ingest_warn(t, "stored event block_size %u differs from the registered %u: %u blocks not stored",
                    ev->block_size, bs, n);
        return;
    }
    bool eagle = ev->tokens_form == KVI_TOK_PAIRS;
    size_t win = (size_t)bs + (eagle ? 1 : 0);
    size_t avail = ev->n_tokens >= win ? (ev->n_tokens - (eagle ? 1 : 0)) / bs : 0;
    uint32_t k = avail < n ? (uint32_t)avail : n;
    if (k < n) {
        CTR_ADD(t, tokens_short, 1);
        CTR_ADD(t, blocks_dropped, n - k);
        ingest_warn(t, "stored event has %u tokens for %u blocks of %u%s: %u blocks not stored", ev->n_tokens, n,
                    bs, eagle ? " (eagle)" : "", n - k);
    }
    if (k == 0)
        return;

    /* RFC 1527 runs that need the event's seq hashes as prefix identity (see
     * net/ingest.h): placed by depth, or on a lower tier below a parent that
     * the rank may not hold (another backend's) */
    bool rfc = ev->family == KVI_EVF_RFC1527;
    bool placed = rfc && ((!ev->has_parent && ev->has_base_idx && ev->base_block_idx > 0) ||
                          (ev->has_parent && ev->tier != KVI_TIER_GPU));
    uint64_t seed = event_seed(s, ev);
    struct kvi_op *op = op_new(KVI_OP_STORE, instance, dp_rank, k, placed);
    op->tier = ev->tier;
    op->has_parent = ev->has_parent;
    op->parent_engine_hash = ev->has_parent ? ev->parent_hash : 0;
    const uint32_t *tok = ev->tokens;
    const uint64_t *h = ev->hashes;
    struct kvi_block *blk = op->blocks;
    if (ev->mm_off == NULL) {
        for (uint32_t i = 0; i < k; i++) {
            blk[i].engine_hash = h[i];
            blk[i].content_hash = kvi_hash_block(tok + (size_t)i * bs, win, seed);
        }
    } else {
        const uint32_t *off = ev->mm_off;
        for (uint32_t i = 0; i < k; i++) {
            blk[i].engine_hash = h[i];
            const uint32_t *bt = tok + (size_t)i * bs;
            if (off[i + 1] > off[i])
                blk[i].content_hash = kvi_hash_block_mm(bt, win, ev->mm + off[i], off[i + 1] - off[i], seed);
            else
                blk[i].content_hash = kvi_hash_block(bt, win, seed);
        }
    }
    if (placed) {
        memcpy(op->seq, h, (size_t)k * sizeof *h);
        op->position = ev->has_base_idx ? ev->base_block_idx : 0;
    }
    CTR_ADD(t, blocks_submitted, k);
    ops_push(t, p, op);
}

/* A store whose content hashes the publisher gave (Dynamo RouterEvent
 * tokens_hash): no tokens to cut. A run without a parent starts at position
 * 0; one that says it starts deeper (start_position > 0) cannot be placed
 * without seq hashes and is counted invalid. */
static void ingest_store_content(struct kvi_ingest_target *t, struct kvi_producer *p, const struct kvi_ev *ev,
                                 uint32_t instance, uint32_t dp_rank)
{
    if (!ev->has_parent && ev->has_base_idx && ev->base_block_idx > 0) {
        CTR_ADD(t, events_invalid, 1);
        ingest_warn(t, "stored event at start_position %u without a parent: %u blocks not stored",
                    ev->base_block_idx, ev->n_hashes);
        return;
    }
    uint32_t n = ev->n_hashes;
    struct kvi_op *op = op_new(KVI_OP_STORE, instance, dp_rank, n, false);
    op->tier = ev->tier;
    op->has_parent = ev->has_parent;
    op->parent_engine_hash = ev->has_parent ? ev->parent_hash : 0;
    for (uint32_t i = 0; i < n; i++) {
        op->blocks[i].engine_hash = ev->hashes[i];
        op->blocks[i].content_hash = ev->content[i];
    }
    CTR_ADD(t, blocks_submitted, n);
    ops_push(t, p, op);
}

/* Token-less engine store (offload placeholder): resolve by engine hash. */
static void ingest_store_known(struct kvi_ingest_target *t, struct kvi_producer *p, const struct kvi_ev *ev,
                               uint32_t instance, uint32_t dp_rank)
{
    struct kvi_op *op = op_new(KVI_OP_STORE_KNOWN, instance, dp_rank, ev->n_hashes, false);
    op->tier = ev->tier;
    memcpy(op->hashes, ev->hashes, (size_t)ev->n_hashes * sizeof *ev->hashes);
    CTR_ADD(t, placeholders, 1);
    CTR_ADD(t, blocks_submitted, ev->n_hashes);
    ops_push(t, p, op);
}

/* Token-less RFC 1527 store: the seq hashes are the engine hashes too. */
static void ingest_store_seq_only(struct kvi_ingest_target *t, struct kvi_producer *p, const struct kvi_ev *ev,
                                  uint32_t instance, uint32_t dp_rank)
{
    uint32_t n = ev->n_hashes;
    struct kvi_op *op = op_new(KVI_OP_STORE_SEQ_ONLY, instance, dp_rank, n, true);
    op->tier = ev->tier;
    op->has_parent = ev->has_parent;
    op->parent_engine_hash = ev->has_parent ? ev->parent_hash : 0;
    op->position = ev->has_base_idx ? ev->base_block_idx : 0;
    for (uint32_t i = 0; i < n; i++) {
        op->blocks[i].engine_hash = ev->hashes[i];
        op->blocks[i].content_hash = 0;
    }
    memcpy(op->seq, ev->hashes, (size_t)n * sizeof *ev->hashes);
    CTR_ADD(t, seq_only, 1);
    CTR_ADD(t, blocks_submitted, n);
    ops_push(t, p, op);
}

static void ingest_clear_instance(struct kvi_ingest_target *t, struct kvi_producer *p, uint32_t instance)
{
    ops_push(t, p, op_new(KVI_OP_CLEAR, instance, 0, 0, false));
}

/* An engine's AllBlocksCleared: one rank's scheduler dropped its cache. */
static void ingest_clear_rank(struct kvi_ingest_target *t, struct kvi_producer *p, uint32_t instance,
                              uint32_t dp_rank)
{
    ops_push(t, p, op_new(KVI_OP_CLEAR_DP_RANK, instance, dp_rank, 0, false));
}

static bool is_full_attention(const struct kvi_ev *ev)
{
    static const char fa[] = "full_attention";
    return ev->spec_kind != NULL && ev->spec_kind_len == sizeof fa - 1 &&
           strncasecmp(ev->spec_kind, fa, sizeof fa - 1) == 0;
}

/* Group and tier filters shared by stores and removes. @return keep? */
static bool event_selected(struct kvi_ingest_target *t, const struct kvi_ev *ev)
{
    if (ev->group_idx >= 0) {
        struct kvi_ingest_scratch *s = t->_s;
        if (s->fa_group < 0 && is_full_attention(ev))
            s->fa_group = ev->group_idx;
        if (ev->group_idx != (s->fa_group >= 0 ? s->fa_group : t->group)) {
            CTR_ADD(t, group_skipped, 1);
            return false;
        }
    }
    if (KVI_UNLIKELY(ev->tier >= KVI_TIER_COUNT)) { /* not from the decoder */
        CTR_ADD(t, events_invalid, 1);
        return false;
    }
    if (ev->medium_unknown)
        CTR_ADD(t, unknown_medium, 1);
    if ((t->skip_tiers & (1u << ev->tier)) != 0) {
        CTR_ADD(t, tier_skipped, 1);
        return false;
    }
    return true;
}

static void ingest_event(struct kvi_ingest_target *t, struct kvi_producer *p, const struct kvi_ev *ev,
                         uint32_t dp_rank)
{
    bool rfc = ev->family == KVI_EVF_RFC1527;
    if (rfc)
        CTR_ADD(t, events_rfc1527, 1);
    switch ((enum kvi_ev_type)ev->type) {
    case KVI_EV_STORED: {
        CTR_ADD(t, events_stored, 1);
        if (!event_selected(t, ev) || ev->n_hashes == 0)
            return;
        int64_t inst = event_instance(t, ev);
        if (inst < 0) {
            CTR_ADD(t, events_invalid, 1);
            ingest_warn(t, "cannot intern backend_id (error %d): event skipped", (int)-inst);
            return;
        }
        if (ev->content != NULL)
            ingest_store_content(t, p, ev, (uint32_t)inst, dp_rank);
        else if (tokens_usable(ev))
            ingest_store_tokens(t, p, ev, (uint32_t)inst, dp_rank);
        else if (rfc)
            ingest_store_seq_only(t, p, ev, (uint32_t)inst, dp_rank);
        else
            ingest_store_known(t, p, ev, (uint32_t)inst, dp_rank);
        return;
    }
    case KVI_EV_REMOVED: {
        CTR_ADD(t, events_removed, 1);
        if (!event_selected(t, ev) || ev->n_hashes == 0)
            return;
        int64_t inst = event_instance(t, ev);
        if (inst < 0) {
            CTR_ADD(t, events_invalid, 1);
            return;
        }
        struct kvi_op *op = op_new(KVI_OP_REMOVE, (uint32_t)inst, dp_rank, ev->n_hashes, false);
        op->tier = ev->tier;
        memcpy(op->hashes, ev->hashes, (size_t)ev->n_hashes * sizeof *ev->hashes);
        CTR_ADD(t, hashes_remove_submitted, ev->n_hashes);
        ops_push(t, p, op);
        return;
    }
    case KVI_EV_CLEARED: {
        CTR_ADD(t, events_cleared, 1);
        if (rfc && ev->backend_id != NULL && ev->backend_len > 0) {
            int64_t inst = pool_instance(t, ev->backend_id, ev->backend_len);
            if (inst < 0)
                CTR_ADD(t, events_invalid, 1);
            else
                ingest_clear_instance(t, p, (uint32_t)inst);
            return;
        }
        ingest_clear_rank(t, p, t->instance, dp_rank);
        if (rfc) {
            const struct kvi_ingest_scratch *s = t->_s;
            for (size_t i = 0; i < s->n_pools; i++)
                ingest_clear_rank(t, p, s->pools[i].instance, dp_rank);
        }
        return;
    }
    }
    CTR_ADD(t, events_invalid, 1);
}

/* ---- public API ------------------------------------------------------------ */

size_t kvi_ingest_batch(struct kvi_ingest_target *t, const struct kvi_batch *b, struct kvi_producer *p)
{
    KVI_ASSERT(t->_s != NULL);
    struct kvi_ingest_scratch *s = t->_s;
    uint64_t before = s->n_pushed;
    uint32_t dp_rank = b->has_dp_rank ? b->dp_rank : t->dp_rank;
    s->mirror_idx = 0;
    t->mirror_pos.reset = false;
    CTR_ADD(t, batches, 1);
    if (b->n_unknown)
        CTR_ADD(t, events_unknown, b->n_unknown);
    if (b->n_invalid)
        CTR_ADD(t, events_invalid, b->n_invalid);
    for (uint32_t i = 0; i < b->n_events; i++)
        ingest_event(t, p, &b->events[i], dp_rank);
    if (t->pub_applied) /* the batch is whole once its last own op is applied */
        for (size_t i = s->n_ops; i-- > 0;)
            if (s->ops[i]->pub_applied) {
                s->ops[i]->applied1 = t->applied1_end;
                break;
            }
    ops_flush(t, p);
    if (t->mirror != NULL && s->mirror_idx > 0) /* MIRROR: the batch is complete */
        t->mirror(t->mirror_ctx, NULL, &t->mirror_pos);
    return (size_t)(s->n_pushed - before);
}

void kvi_ingest_reset_rank(struct kvi_ingest_target *t, uint32_t dp_rank, struct kvi_producer *p)
{
    KVI_ASSERT(t->_s != NULL);
    const struct kvi_ingest_scratch *s = t->_s;
    t->mirror_pos.reset = true;
    ops_push(t, p, op_new(KVI_OP_REMOVE_DP_RANK, t->instance, dp_rank, 0, false));
    t->mirror_pos.reset = false;
    for (size_t i = 0; i < s->n_pools; i++)
        ops_push(t, p, op_new(KVI_OP_REMOVE_DP_RANK, s->pools[i].instance, dp_rank, 0, false));
    ops_flush(t, p);
}

void kvi_ingest_clear(struct kvi_ingest_target *t, struct kvi_producer *p)
{
    KVI_ASSERT(t->_s != NULL);
    const struct kvi_ingest_scratch *s = t->_s;
    ingest_clear_instance(t, p, t->instance);
    for (size_t i = 0; i < s->n_pools; i++)
        ingest_clear_instance(t, p, s->pools[i].instance);
    ops_flush(t, p);
}
