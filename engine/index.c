/*
 * Positional index (see engine/index.h for the contract). This file holds the
 * index as a whole: creation and destruction, instances and worker slots,
 * memory accounting, retirement and reclaim, slot info and stats.
 *
 * FILES
 *   engine/index_internal.h  the shared layout (entries, tables, slots, partitions)
 *   engine/index_impl.h      what the index's files share: hashing, table lookups,
 *                            member reads, entry creation (static inline: hot
 *                            paths) and the kvi_ix__ functions
 *   engine/index.c           the index as a whole (this file)
 *   engine/index_table.c     a partition's structures: open-addressing tables, seq
 *                            tables, member sets, entries, slot maps and holdings
 *   engine/index_write.c     the writer's operations: store, reserve, store_known,
 *                            remove, clear, dump
 *   engine/index_query.c     the read side: prefix keys, find_matches, find_tiered,
 *                            pool depths
 *
 * DESIGN
 *   Threads: one writer per partition mutates that partition's tables,
 *   entries and slot maps; any number of reader threads query concurrently
 *   inside RCU read-side sections. Interning instances and allocating slot
 *   ids take a mutex (control plane, never on the query path).
 *
 *   Publication: an entry is fully initialised before its index is stored
 *   into a table slot with release (W1); readers load slots with acquire (R1).
 *   Member counts and member arrays are published with release after the
 *   members they describe (W2/R2). An entry's `one` says whether its members
 *   are one slot or a member array at `mv`; the array pointer is stored
 *   before `one` turns to KVI_MANY_BIT, and readers load `one` first (W2/R2).
 *   Releasing an entry sets `one` to KVI_NONE and retires the array, which
 *   `mv` keeps naming until the entry is recycled (W4, pairs with R2).
 *   Tables are replaced copy-on-write on resize
 *   (W3/R3); a partition's seq table appears the same way, built whole by
 *   the writer once anything asks for seq tables (ix->seq_wanted). Children
 *   are linked into their parent's child list after they are initialised
 *   (W5) and unlinked in place in O(1) through a writer-only back link (RCU
 *   list), for the seq walks of partitions without a seq table (R5).
 *   Entries, member arrays and old tables are recycled only after a grace
 *   period (kvi_index_reclaim).
 *
 *   Nesting: stores add members parent-first; removals and clears remove
 *   them child-first. Hence at every instant a gpu slot holding entry E also
 *   holds E's parent, and along any query chain the gpu member sets are
 *   nested. Queries compare counts only.
 */
#include "engine/index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "engine/index_impl.h"
#include "engine/rcu.h"

const char *kvi_tier_name(enum kvi_tier t)
{
    switch (t) {
    case KVI_TIER_GPU: return "gpu";
    case KVI_TIER_CPU: return "cpu";
    case KVI_TIER_DISK: return "disk";
    case KVI_TIER_EXTERNAL: return "external";
    }
    return "unknown";
}

/* ---- memory accounting and retirement --------------------------------------- */

void kvi_ix__retire(struct kvi_part *p, void *ptr, size_t bytes)
{
    if (p->n_retired == p->cap_retired) {
        p->cap_retired = p->cap_retired ? p->cap_retired * 2 : 64;
        p->retired = kvi_xrealloc(p->retired, p->cap_retired * sizeof *p->retired);
    }
    p->retired[p->n_retired++] = (struct kvi_retired){ptr, bytes, 0};
    p->retired_bytes += bytes;
}

/* Scratch sized for one huge op (a remove of millions of hashes, a clear
 * of a big slot) is given back when the writer goes idle, so that one such
 * op does not pin its memory for the partition's lifetime. Writer. */
#define SCRATCH_KEEP (64u << 10) /* elements kept across ops (512 KiB of u64) */
static void scratch_trim(struct kvi_part *p)
{
    if (p->cap_runbuf > SCRATCH_KEEP) {
        free(p->runbuf);
        p->runbuf = NULL;
        p->cap_runbuf = 0;
    }
    if (p->cap_sortbuf > SCRATCH_KEEP) {
        free(p->sortbuf);
        p->sortbuf = NULL;
        p->cap_sortbuf = 0;
    }
    if (p->cap_stack > 2 * SCRATCH_KEEP) {
        free(p->stack);
        p->stack = NULL;
        p->cap_stack = 0;
    }
    if (p->cap_dup > SCRATCH_KEEP) {
        free(p->dup_val);
        p->dup_val = NULL;
        p->cap_dup = 0;
    }
}

bool kvi_index_reclaim_begin(struct kvi_index *ix, uint32_t part)
{
    struct kvi_part *p = &ix->parts[part];
    scratch_trim(p);
    stab_maybe_build(ix, p); /* writers reclaim when idle: a wanted seq table comes soon */
    return p->n_retired != 0 || p->n_pending != 0 || p->n_pending_slots != 0;
}

void kvi_index_reclaim(struct kvi_index *ix, uint32_t part)
{
    if (!kvi_index_reclaim_begin(ix, part))
        return;
    kvi_rcu_synchronize();
    kvi_index_reclaim_end(ix, part);
}

void kvi_index_reclaim_end(struct kvi_index *ix, uint32_t part)
{
    struct kvi_part *p = &ix->parts[part];
    for (uint32_t i = 0; i < p->n_retired; i++) {
        if (p->retired[i].unmap != 0)
            munmap(p->retired[i].p, p->retired[i].unmap);
        else
            free(p->retired[i].p);
        part_account(p, -(int64_t)p->retired[i].bytes);
    }
    p->n_retired = 0;
    p->retired_bytes = 0;
    if (p->n_free + p->n_pending > p->cap_free) {
        p->cap_free = KVI_MAX(p->cap_free * 2, p->n_free + p->n_pending);
        p->free_idx = kvi_xrealloc(p->free_idx, p->cap_free * sizeof(uint32_t));
    }
    if (p->n_pending > 0) {
        memcpy(p->free_idx + p->n_free, p->pending_idx, p->n_pending * sizeof(uint32_t));
        p->n_free += p->n_pending;
        p->n_pending = 0;
    }
    if (p->n_pending_slots > 0) {
        pthread_mutex_lock(&ix->slot_lock);
        uint32_t need = ix->n_free_slot_ids + p->n_pending_slots;
        if (need > ix->cap_free_slot_ids) {
            ix->cap_free_slot_ids = KVI_MAX(need, ix->cap_free_slot_ids * 2);
            ix->free_slot_ids = kvi_xrealloc(ix->free_slot_ids, ix->cap_free_slot_ids * sizeof(uint32_t));
        }
        memcpy(ix->free_slot_ids + ix->n_free_slot_ids, p->pending_slots, p->n_pending_slots * sizeof(uint32_t));
        ix->n_free_slot_ids = need;
        pthread_mutex_unlock(&ix->slot_lock);
        p->n_pending_slots = 0;
    }
}

/* ---- instances and slots ---------------------------------------------------- */

static uint64_t inst_hash(uint64_t id, const char *name)
{
    if (name == NULL)
        return kvi_fmix64(id ^ 0x5bd1e9955bd1e995ull) | 1;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        h = (h ^ *s) * 0x100000001b3ull;
    return kvi_fmix64(h) & ~1ull; /* string and numeric spaces never meet */
}

static bool inst_matches(const struct kvi_instance *in, uint64_t id, const char *name)
{
    if (name == NULL)
        return in->name == NULL && in->id == id;
    return in->name != NULL && strcmp(in->name, name) == 0;
}

/* Under inst_lock. Returns dense id or -1. */
static int64_t inst_lookup_locked(struct kvi_index *ix, uint64_t id, const char *name, uint32_t *slot_out)
{
    uint64_t h = inst_hash(id, name);
    uint32_t i = (uint32_t)h & ix->inst_map_mask;
    for (;; i = (i + 1) & ix->inst_map_mask) {
        uint64_t v = ix->inst_map[i];
        if (v == 0) {
            if (slot_out)
                *slot_out = i;
            return -1;
        }
        uint32_t dense = (uint32_t)v - 1;
        if ((v >> 32) == (h >> 32) && inst_matches(inst_get(ix, dense), id, name))
            return dense;
    }
}

int64_t kvi_index_find_instance(struct kvi_index *ix, uint64_t id, const char *name)
{
    pthread_mutex_lock(&ix->inst_lock);
    int64_t r = inst_lookup_locked(ix, id, name, NULL);
    pthread_mutex_unlock(&ix->inst_lock);
    return r < 0 ? -ENOENT : r;
}

int64_t kvi_index_intern_instance(struct kvi_index *ix, uint64_t id, const char *name, bool shared)
{
    pthread_mutex_lock(&ix->inst_lock);
    uint32_t at;
    int64_t r = inst_lookup_locked(ix, id, name, &at);
    if (r >= 0) {
        pthread_mutex_unlock(&ix->inst_lock);
        return r;
    }
    uint32_t dense = atomic_load_explicit(&ix->n_instances, memory_order_relaxed);
    uint32_t c = dense >> KVI_INST_CHUNK_SHIFT;
    if (c >= KVI_INST_CHUNKS_MAX) {
        pthread_mutex_unlock(&ix->inst_lock);
        return -ENOMEM;
    }
    if (atomic_load_explicit(&ix->inst_chunks[c], memory_order_relaxed) == NULL)
        atomic_store_explicit(&ix->inst_chunks[c], kvi_xcalloc(KVI_INST_CHUNK, sizeof(struct kvi_instance)),
                              memory_order_release);
    struct kvi_instance *in = inst_get(ix, dense);
    in->id = name ? 0 : id;
    in->name = name ? strdup(name) : NULL;
    if (name != NULL && in->name == NULL)
        kvi_die("out of memory");
    in->shared = shared;
    in->part = dense % ix->n_parts;
    atomic_store_explicit(&in->slots, NULL, memory_order_relaxed);
    uint64_t h = inst_hash(id, name);
    ix->inst_map[at] = (h & 0xffffffff00000000ull) | (dense + 1);
    atomic_store_explicit(&ix->n_instances, dense + 1, memory_order_release);
    /* keep the map at most half full */
    if ((uint64_t)(dense + 1) * 2 > ix->inst_map_mask) {
        uint32_t ncap = (ix->inst_map_mask + 1) * 2;
        uint64_t *nm = kvi_xcalloc(ncap, sizeof(uint64_t));
        for (uint32_t i = 0; i <= ix->inst_map_mask; i++) {
            uint64_t v = ix->inst_map[i];
            if (v == 0)
                continue;
            uint32_t j = (uint32_t)(v >> 32) & (ncap - 1);
            /* position by the tag's low bits of the hash: recompute from the instance */
            struct kvi_instance *x = inst_get(ix, (uint32_t)v - 1);
            j = (uint32_t)inst_hash(x->id, x->name) & (ncap - 1);
            while (nm[j] != 0)
                j = (j + 1) & (ncap - 1);
            nm[j] = v;
        }
        free(ix->inst_map);
        ix->inst_map = nm;
        ix->inst_map_mask = ncap - 1;
    }
    pthread_mutex_unlock(&ix->inst_lock);
    return dense;
}

int kvi_index_instance_info(struct kvi_index *ix, uint32_t instance, uint64_t *id, const char **name, bool *shared)
{
    if (instance >= atomic_load_explicit(&ix->n_instances, memory_order_acquire))
        return -ENOENT;
    struct kvi_instance *in = inst_get(ix, instance);
    if (id)
        *id = in->id;
    if (name)
        *name = in->name;
    if (shared)
        *shared = in->shared;
    return 0;
}

uint32_t kvi_index_partition_of(const struct kvi_index *ix, uint32_t instance)
{
    return instance % ix->n_parts;
}

/* Writer of the instance's partition: find the slot (instance, rank, tier). */
uint32_t kvi_ix__slot_find(const struct kvi_index *ix, uint32_t instance, uint32_t rank, uint8_t tier)
{
    struct kvi_slotlist *sl = atomic_load_explicit(&inst_get(ix, instance)->slots, memory_order_acquire);
    if (sl == NULL)
        return KVI_NONE;
    for (uint32_t i = 0; i < sl->n; i++) {
        struct kvi_slot *s = kvi__slot(ix, sl->id[i]);
        if (s->dp_rank == rank && s->tier == tier)
            return s->id;
    }
    return KVI_NONE;
}

uint32_t kvi_ix__slot_create(struct kvi_index *ix, uint32_t instance, uint32_t rank, uint8_t tier)
{
    struct kvi_instance *in = inst_get(ix, instance);
    pthread_mutex_lock(&ix->slot_lock);
    uint32_t id;
    if (ix->n_free_slot_ids > 0) {
        id = ix->free_slot_ids[--ix->n_free_slot_ids];
    } else {
        id = atomic_load_explicit(&ix->n_slot_ids, memory_order_relaxed);
        uint32_t c = id >> KVI_SLOT_CHUNK_SHIFT;
        if (c >= KVI_SLOT_CHUNKS_MAX)
            kvi_die("slot space exhausted");
        if (atomic_load_explicit(&ix->slot_chunks[c], memory_order_relaxed) == NULL)
            atomic_store_explicit(&ix->slot_chunks[c], kvi_xcalloc(KVI_SLOT_CHUNK, sizeof(struct kvi_slot)),
                                  memory_order_release);
        atomic_store_explicit(&ix->n_slot_ids, id + 1, memory_order_release);
    }
    /* initialise under the lock: a recycled id may have been used by
     * another writer, and the lock orders its accesses before ours */
    struct kvi_slot *s = kvi__slot(ix, id);
    s->id = id;
    s->instance = instance;
    s->dp_rank = rank;
    s->tier = tier;
    s->shared = in->shared;
    atomic_store_explicit(&s->n_blocks, 0, memory_order_relaxed);
    atomic_store_explicit(&s->map.t, NULL, memory_order_relaxed);
    s->map_floor = 0; /* a recycled id does not keep its last owner's reservation */
    atomic_store_explicit(&s->live, true, memory_order_release);
    pthread_mutex_unlock(&ix->slot_lock);
    if (tier != KVI_TIER_GPU)
        atomic_store_explicit(&ix->has_lower_tiers, true, memory_order_release);
    if (in->shared)
        atomic_store_explicit(&ix->has_shared, true, memory_order_release);

    struct kvi_part *p = &ix->parts[in->part];
    struct kvi_slotlist *old = atomic_load_explicit(&in->slots, memory_order_relaxed);
    uint32_t n = old ? old->n : 0;
    struct kvi_slotlist *nl = kvi_xmalloc(sizeof *nl + (n + 1) * sizeof(uint32_t));
    part_account(p, (int64_t)(sizeof *nl + (n + 1) * sizeof(uint32_t)));
    nl->n = n + 1;
    if (n)
        memcpy(nl->id, old->id, n * sizeof(uint32_t));
    nl->id[n] = id;
    atomic_store_explicit(&in->slots, nl, memory_order_release);
    if (old)
        kvi_ix__retire(p, old, sizeof *old + n * sizeof(uint32_t));
    return id;
}

/* ---- creation --------------------------------------------------------------- */

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = kvi_now_ns() ^ (uint64_t)(uintptr_t)&v;
    return v;
}

struct kvi_index *kvi_index_create(const struct kvi_index_config *cfg)
{
    if (cfg == NULL || cfg->block_size == 0 || cfg->n_parts == 0 || cfg->n_parts > 1024) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_index *ix = calloc(1, sizeof *ix);
    if (ix == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    ix->block_size = cfg->block_size;
    ix->n_parts = cfg->n_parts;
    atomic_store(&ix->jump, cfg->jump ? cfg->jump : KVI_DEFAULT_JUMP);
    uint64_t seed = cfg->key_seed ? cfg->key_seed : random_u64();
    ix->kseed = kvi_fmix64(seed ^ 0x243f6a8885a308d3ull);
    ix->kxor = kvi_fmix64(seed + 0x13198a2e03707344ull);
    ix->kmul = kvi_fmix64(seed ^ 0x082efa98ec4e6c89ull);
    ix->tseed = kvi_fmix64(seed ^ 0xa4093822299f31d0ull);
    pthread_mutex_init(&ix->inst_lock, NULL);
    pthread_mutex_init(&ix->slot_lock, NULL);
    atomic_store(&ix->n_slot_ids, 1); /* slot id 0 is KVI_NONE */
    ix->inst_map_mask = 63;
    ix->inst_map = kvi_xcalloc(64, sizeof(uint64_t));
    /* A partition is 1 MiB, almost all of it the entry-chunk and seq-column
     * pointer arrays, sized for the largest partition. Fresh anonymous pages
     * are zero and cost no memory until written, so a namespace holds only
     * the pages of the chunks it uses (an allocator's memset would commit
     * all of it: 4.1 MB per new model with 4 writers). */
    ix->parts_bytes = sizeof(struct kvi_part) * cfg->n_parts;
    void *parts = mmap(NULL, ix->parts_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (parts == MAP_FAILED) {
        free(ix->inst_map);
        free(ix);
        errno = ENOMEM;
        return NULL;
    }
    ix->parts = parts;
    return ix;
}

void kvi_index_destroy(struct kvi_index *ix)
{
    if (ix == NULL)
        return;
    for (uint32_t i = 0; i < ix->n_parts; i++) {
        struct kvi_part *p = &ix->parts[i];
        for (uint32_t c = 0; c < p->n_chunks; c++) {
            struct kvi_entry *chunk = atomic_load_explicit(&p->chunks[c], memory_order_relaxed);
            if (chunk == NULL)
                continue;
            for (uint32_t j = 0; j < KVI_ENTRY_CHUNK && (c << KVI_ENTRY_CHUNK_SHIFT) + j < p->next_fresh; j++) {
                if ((c << KVI_ENTRY_CHUNK_SHIFT) + j == KVI_NONE)
                    continue; /* index 0 is never an entry */
                free(entry_mset(&chunk[j])); /* released entries' arrays are in the retired list */
            }
            free(chunk);
            free(atomic_load_explicit(&p->seqcol[c], memory_order_relaxed));
        }
        kvi_ix__tab_free_mem(atomic_load_explicit(&p->ktab.t, memory_order_relaxed));
        kvi_ix__tab_free_mem(atomic_load_explicit(&p->stab.t, memory_order_relaxed));
        for (uint32_t r = 0; r < p->n_retired; r++) {
            if (p->retired[r].unmap != 0)
                munmap(p->retired[r].p, p->retired[r].unmap);
            else
                free(p->retired[r].p);
        }
        free(p->retired);
        free(p->aside_idx);
        free(p->aside_val);
        free(p->free_idx);
        free(p->pending_idx);
        free(p->stack);
        free(p->sortbuf);
        free(p->pending_slots);
        free(p->runbuf);
        free(p->dup_val);
    }
    uint32_t ns = atomic_load(&ix->n_slot_ids);
    for (uint32_t c = 0; c <= (ns >> KVI_SLOT_CHUNK_SHIFT); c++) {
        struct kvi_slot *chunk = atomic_load_explicit(&ix->slot_chunks[c], memory_order_relaxed);
        if (chunk == NULL)
            continue;
        for (uint32_t j = 0; j < KVI_SLOT_CHUNK; j++)
            kvi_ix__tab_free_mem(atomic_load_explicit(&chunk[j].map.t, memory_order_relaxed));
        free(chunk);
    }
    uint32_t ni = atomic_load(&ix->n_instances);
    for (uint32_t i = 0; i < ni; i++) {
        struct kvi_instance *in = inst_get(ix, i);
        free(in->name);
        free(atomic_load_explicit(&in->slots, memory_order_relaxed));
    }
    for (uint32_t c = 0; c < KVI_INST_CHUNKS_MAX; c++)
        free(atomic_load_explicit(&ix->inst_chunks[c], memory_order_relaxed));
    free(ix->inst_map);
    free(ix->free_slot_ids);
    pthread_mutex_destroy(&ix->inst_lock);
    pthread_mutex_destroy(&ix->slot_lock);
    munmap(ix->parts, ix->parts_bytes);
    free(ix);
}

uint32_t kvi_index_block_size(const struct kvi_index *ix) { return ix->block_size; }
uint32_t kvi_index_n_parts(const struct kvi_index *ix) { return ix->n_parts; }
void kvi_index_set_jump(struct kvi_index *ix, uint32_t jump) { atomic_store(&ix->jump, jump); }

/* ---- slot info and stats ---------------------------------------------------- */

int kvi_index_slot_info(const struct kvi_index *ix, uint32_t slot, struct kvi_slot_info *info)
{
    if (slot == KVI_NONE || slot >= atomic_load_explicit(&((struct kvi_index *)ix)->n_slot_ids, memory_order_acquire))
        return -ENOENT;
    const struct kvi_slot *s = kvi__slot(ix, slot);
    if (s == NULL || !atomic_load_explicit(&((struct kvi_slot *)s)->live, memory_order_acquire))
        return -ENOENT;
    info->instance = s->instance;
    info->dp_rank = s->dp_rank;
    info->tier = (enum kvi_tier)s->tier;
    info->shared = s->shared;
    return 0;
}

uint32_t kvi_index_tree_size(const struct kvi_index *ix, uint32_t instance, uint32_t dp_rank)
{
    if (instance >= atomic_load_explicit(&((struct kvi_index *)ix)->n_instances, memory_order_acquire))
        return 0;
    kvi_rcu_read_lock();
    uint32_t sid = kvi_ix__slot_find(ix, instance, dp_rank, KVI_TIER_GPU);
    uint32_t n = sid ? atomic_load_explicit(&kvi__slot(ix, sid)->n_blocks, memory_order_relaxed) : 0;
    kvi_rcu_read_unlock();
    return n;
}

void kvi_index_stats(const struct kvi_index *ix, struct kvi_index_stats *st)
{
    memset(st, 0, sizeof *st);
    for (uint32_t i = 0; i < ix->n_parts; i++) {
        const struct kvi_part *p = &ix->parts[i];
#define SUM(f) st->f += atomic_load_explicit(&((struct kvi_part *)p)->f, memory_order_relaxed)
        SUM(entries);
        SUM(holdings);
        SUM(bytes);
        SUM(stored_blocks);
        SUM(removed_blocks);
        SUM(parent_not_found);
        SUM(parent_elsewhere);
        SUM(seq_conflicts);
        SUM(unknown_removes);
        SUM(unknown_blocks);
        SUM(invalid_events);
        SUM(table_rebuilds);
        SUM(table_rebuild_slots);
        SUM(table_rebuild_ns);
#undef SUM
    }
    uint32_t n_ids = atomic_load_explicit(&((struct kvi_index *)ix)->n_slot_ids, memory_order_acquire);
    for (uint32_t id = 1; id < n_ids; id++) {
        const struct kvi_slot *s = kvi__slot(ix, id);
        if (s != NULL && atomic_load_explicit(&((struct kvi_slot *)s)->live, memory_order_acquire))
            st->slots++;
    }
}
