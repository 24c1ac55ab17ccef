/*
 * Pre-sizing the index from the block pool an engine reports: the optional
 * `capacity_blocks` of a Dynamo POST /register (a kvidx extension; vLLM knows
 * num_gpu_blocks, SGLang its token pool over the page size).
 *
 * DESIGN (the whole service: api/service.h)
 *   The rule. A rank holds at most its pool, so its GPU slot map is
 *   reserved for min(capacity_blocks, max) blocks. A partition's distinct
 *   prefixes are at most the pools of the ranks it holds added up (every
 *   entry is held by at least one of them), so its prefix-key table and
 *   entry storage are reserved for min(sum, max) entries, max being
 *   --capacity-max-blocks (default KVI_SVC_DEFAULT_CAPACITY_MAX_BLOCKS).
 *   The sum is exact for ranks serving disjoint prompts and an over-estimate
 *   where they share prefixes; max bounds the memory either way (measured:
 *   about 56 bytes per reserved entry and slot-map block together, entry
 *   storage's pages touched). Reservations are floors
 *   (engine/index.h kvi_index_reserve): stores up to them rebuild no table,
 *   a pool that drains and fills again rebuilds nothing, and an
 *   unregistration lowers the partition's floor to what is left.
 *
 *   Threads. The control thread applies a reservation on the partition's
 *   writer (kvi_producer_call, synchronous: the writer allocates and touches
 *   the memory, measured 61 ms for a rank of 1 M blocks and 316 ms for 4 M
 *   (kvidxd --threads 2, this VM), between two of its ops, so
 *   the partition's events wait that long once). It reads the workers table
 *   without a lock (it alone writes it); the counters are read by any
 *   thread, the gauges under `mu` (kvi_service_capacity_counters).
 */
#include "api/service_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common.h"
#include "engine/writer.h"
#include "net/log.h"

static uint64_t cap_max(const struct kvi_service *svc)
{
    return svc->cfg.capacity_max_blocks ? svc->cfg.capacity_max_blocks : KVI_SVC_DEFAULT_CAPACITY_MAX_BLOCKS;
}

/* The partition's entries to reserve: its registered ranks' capacities added up, at most max.
 * Control thread, or any thread under mu. */
static uint64_t part_entries(const struct kvi_service *svc, const struct kvi_ns *ns, uint32_t part)
{
    uint64_t sum = 0, max = cap_max(svc);
    for (size_t i = 0; i < svc->n_w && sum < max; i++) {
        const struct svc_worker *w = &svc->w[i];
        if (w->ns != ns || kvi_index_partition_of(ns->ix, w->dense) != part)
            continue;
        for (size_t j = 0; j < w->n_ranks; j++)
            sum += w->ranks[j].capacity < max ? w->ranks[j].capacity : max;
    }
    return sum < max ? sum : max;
}

struct cap_call {
    struct kvi_index *ix;
    uint32_t part, dense, rank;
    uint64_t slot_blocks; /* 0: no slot map to reserve */
    uint64_t entries;
    int slot_rc, part_rc;
};

/* On the partition's writer. */
static void cap_on_writer(void *arg, uint32_t writer)
{
    (void)writer;
    struct cap_call *c = arg;
    if (c->slot_blocks > 0)
        c->slot_rc = kvi_index_reserve_slot(c->ix, c->dense, c->rank, KVI_TIER_GPU, c->slot_blocks);
    c->part_rc = kvi_index_reserve(c->ix, c->part, c->entries);
}

/* @return the milliseconds it took. */
static uint64_t cap_apply(struct kvi_service *svc, struct cap_call *c)
{
    uint64_t t0 = kvi_now_ns();
    kvi_producer_call(svc->prod, c->part, cap_on_writer, c); /* the partition's writer (api/service.c) */
    uint64_t ms = (kvi_now_ns() - t0) / 1000000u;
    if (c->slot_rc != 0 || c->part_rc != 0) /* the caps keep both within the engine's limits */
        kvi_log_error("capacity: reserving partition %" PRIu32 " for %" PRIu64 " entries failed (%d, slot %d)",
                      c->part, c->entries, c->part_rc, c->slot_rc);
    return ms;
}

/* Contract: api/service_internal.h. */
void kvi_svc__capacity_register(struct kvi_service *svc, struct svc_worker *w, struct svc_rank *rk, uint64_t capacity)
{
    if (capacity == 0 || svc->cfg.capacity_max_blocks == KVI_SVC_CAPACITY_OFF)
        return;
    uint64_t max = cap_max(svc);
    pthread_mutex_lock(&svc->mu);
    rk->capacity = capacity;
    pthread_mutex_unlock(&svc->mu);
    struct cap_call c = {
        .ix = w->ns->ix,
        .part = kvi_index_partition_of(w->ns->ix, w->dense),
        .dense = w->dense,
        .rank = rk->dp_rank,
        .slot_blocks = capacity < max ? capacity : max,
    };
    c.entries = part_entries(svc, w->ns, c.part);
    uint64_t ms = cap_apply(svc, &c);
    kvi_relaxed_add(&svc->cap_reservations, 1);
    if (capacity > max)
        kvi_relaxed_add(&svc->cap_capped, 1);
    kvi_log_info("instance %" PRIu64 " dp_rank %" PRIu32 " of %s:%s reports capacity_blocks %" PRIu64
                 ": its slot map pre-sized for %" PRIu64 " blocks%s, partition %" PRIu32 " for %" PRIu64
                 " entries (%" PRIu64 " ms)",
                 w->id, rk->dp_rank, w->ns->model, w->ns->tenant, capacity, c.slot_blocks,
                 capacity > max ? " (cut to --capacity-max-blocks)" : "", c.part, c.entries, ms);
}

/* Contract: api/service_internal.h. */
void kvi_svc__capacity_forget(struct kvi_service *svc, struct kvi_ns *ns, uint32_t dense)
{
    if (svc->cfg.capacity_max_blocks == KVI_SVC_CAPACITY_OFF)
        return;
    struct cap_call c = {.ix = ns->ix, .part = kvi_index_partition_of(ns->ix, dense)};
    c.entries = part_entries(svc, ns, c.part);
    cap_apply(svc, &c);
    kvi_log_info("capacity: partition %" PRIu32 " of %s:%s now pre-sized for %" PRIu64 " entries", c.part,
                 ns->model, ns->tenant, c.entries);
}

struct part_ref {
    const struct kvi_ns *ns;
    uint32_t part;
};

static int part_ref_cmp(const void *a, const void *b)
{
    const struct part_ref *x = a, *y = b;
    if (x->ns != y->ns)
        return (uintptr_t)x->ns < (uintptr_t)y->ns ? -1 : 1;
    return x->part < y->part ? -1 : x->part > y->part;
}

void kvi_service_capacity_counters(struct kvi_service *svc, struct kvi_capacity_counters *out)
{
    memset(out, 0, sizeof *out);
    out->reservations = atomic_load_explicit(&svc->cap_reservations, memory_order_relaxed);
    out->capped = atomic_load_explicit(&svc->cap_capped, memory_order_relaxed);
    uint64_t max = cap_max(svc);
    pthread_mutex_lock(&svc->mu);
    struct part_ref *pr = kvi_xmalloc((svc->n_w + 1) * sizeof *pr);
    size_t n = 0;
    for (size_t i = 0; i < svc->n_w; i++) {
        const struct svc_worker *w = &svc->w[i];
        bool any = false;
        for (size_t j = 0; j < w->n_ranks; j++) {
            out->reserved_blocks += w->ranks[j].capacity < max ? w->ranks[j].capacity : max;
            any |= w->ranks[j].capacity > 0;
        }
        if (any)
            pr[n++] = (struct part_ref){w->ns, kvi_index_partition_of(w->ns->ix, w->dense)};
    }
    qsort(pr, n, sizeof *pr, part_ref_cmp);
    for (size_t i = 0; i < n; i++)
        if (i == 0 || part_ref_cmp(&pr[i], &pr[i - 1]) != 0)
            out->reserved_entries += part_entries(svc, pr[i].ns, pr[i].part);
    pthread_mutex_unlock(&svc->mu);
    free(pr);
}
