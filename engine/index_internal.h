/*
 * Internal layout of the positional index (engine/index*.c). Exposed to the
 * engine's tests and benchmarks only.
 */
#ifndef KVI_ENGINE_INDEX_INTERNAL_H
#define KVI_ENGINE_INDEX_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/common.h"
#include "engine/index.h"

#define KVI_NONE 0u              /* invalid entry / slot index */
#define KVI_ROOT_BIT 0x80000000u /* in entry.one: the holding was placed without a parent */
#define KVI_MANY_BIT 0x40000000u /* entry.one == KVI_MANY_BIT: the members are the kvi_mset at entry.mv */
#define KVI_SLOT_MASK 0x3fffffffu /* slot ids are < KVI_SLOT_CHUNKS_MAX * KVI_SLOT_CHUNK (2^22) */
#define KVI_MEMBER_ROOT 0x80     /* in kvi_member.tier: same, for member arrays */
#define KVI_MEMBER_TIER 0x7f

#define KVI_ENTRY_CHUNK_SHIFT 12 /* 4096 entries (256 KiB) per chunk */
#define KVI_ENTRY_CHUNK (1u << KVI_ENTRY_CHUNK_SHIFT)
#define KVI_ENTRY_CHUNKS_MAX (1u << 16)
#define KVI_ENTRY_IDX_BITS 28    /* entry indices < KVI_ENTRY_CHUNKS_MAX * KVI_ENTRY_CHUNK */
_Static_assert((1ull << KVI_ENTRY_IDX_BITS) == (unsigned long long)KVI_ENTRY_CHUNKS_MAX * KVI_ENTRY_CHUNK,
               "entry index bits");
#define KVI_TAB_IDX ((1u << KVI_ENTRY_IDX_BITS) - 1) /* in a table slot: the entry index */
#define KVI_TOMB KVI_TAB_IDX     /* in a table slot's index bits: a tombstone (never an entry) */
#define KVI_ENTRY_IDX_END KVI_TOMB /* entry indices are < this */

#define KVI_SLOT_CHUNK_SHIFT 10
#define KVI_SLOT_CHUNK (1u << KVI_SLOT_CHUNK_SHIFT)
#define KVI_SLOT_CHUNKS_MAX 4096u /* 4 M slots */

#define KVI_INST_CHUNK_SHIFT 10
#define KVI_INST_CHUNK (1u << KVI_INST_CHUNK_SHIFT)
#define KVI_INST_CHUNKS_MAX 4096u

/* A member of an entry: a slot holding it, under the slot's engine hash.
 * w packs the slot id and its tier byte (tier | KVI_MEMBER_ROOT), so that a
 * reader never pairs one member's slot with another's tier; w == 0 marks a
 * free position (KVI_NONE is never a slot). */
struct kvi_member {
    _Atomic uint64_t w; /* R: slot | (uint64_t)tier << 32; 0 = free */
    uint64_t eh;        /* the slot's engine hash of the entry (writer only) */
};

static inline uint64_t kvi__member_w(uint32_t slot, uint8_t tier)
{
    return slot | (uint64_t)tier << 32;
}
static inline uint32_t kvi__member_slot(uint64_t w) { return (uint32_t)w; }
static inline uint8_t kvi__member_tier(uint64_t w) { return (uint8_t)(w >> 32); }

/* Members of an entry that has ever had more than one. Readers see the
 * positions m[0 .. n) (n loaded with acquire, each w with acquire) and skip
 * free ones. A live member never moves while the array is published: the
 * writer removes one by freeing its position (release) and adds one into a
 * free position or at m[n] (store w with release, then release n), so a
 * reader racing with both sees every member that stayed. Arrays are replaced
 * copy-on-write only to grow or to shrink. */
struct kvi_mset {
    _Atomic uint32_t n;     /* R: positions in use (live and free) */
    uint32_t cap;
    uint32_t live;          /* live members (writer only) */
    _Atomic uint32_t gpu_n; /* R: live members on the gpu tier: raised (release) after a member is
                             * added, lowered before one is removed, so that a reader never counts
                             * more gpu members than the array holds */
    struct kvi_member m[];
};

#define KVI_UP_PARENT ((1u << KVI_ENTRY_IDX_BITS) - 1) /* in entry.up: the parent entry */
#define KVI_UP_ASIDE 0x40000000u                       /* in entry.up: content known, key a stand-in:
                                                        * the content hash is kept in kvi_part.aside */
#define KVI_UP_NO_CONTENT 0x80000000u                  /* in entry.up: placed by seq hash without
                                                        * tokens: content and prefix key unknown
                                                        * (key is a seq-derived stand-in) */

/*
 * One distinct prefix. 40 bytes; the fields queries read come first. Fields
 * marked R are read by queries; the others are private to the partition's
 * writer. Two hashes of the prefix are not here:
 * - the content hash follows from the key: K = K(parent) + T(content, pos)
 *   with T a bijection in the content (entry_content); where the key is a
 *   stand-in (placed by seq hash alone) and the content became known, the
 *   partition keeps it aside (KVI_UP_ASIDE);
 * - the standard seq hash is kept beside the entries only while the
 *   partition has a seq table (kvi_part.seqcol).
 *
 * Members: while the entry has had at most one member, `one` is that
 * member's slot (| KVI_ROOT_BIT) or KVI_NONE, and `mv` is its engine hash
 * (writer only). Once a second member arrives `one` becomes KVI_MANY_BIT for
 * the rest of the entry's life and `mv` holds the struct kvi_mset pointer,
 * published before `one` says so (readers load `one` first, with acquire).
 * Sharing the word saves the 8 bytes the sibling list's back link uses.
 * The number of gpu members (the jump search's cardinality) is not stored:
 * a single member's slot tier says it, an array keeps it (kvi_mset.gpu_n).
 * The key's table tag is not stored either: it is the key's top half.
 *
 * Children form a doubly linked list: readers (seq walks) follow first_child
 * and next_sibling only; prev_sibling lets the writer unlink a child in O(1)
 * (an entry shared by every request, such as a system prompt's first block,
 * has thousands of children).
 */
struct kvi_entry {
    uint64_t key;                  /* R: prefix key K, immutable while published */
    _Atomic uint64_t mv;           /* R: struct kvi_mset * when one == KVI_MANY_BIT; else the
                                    * single member's engine hash (writer only) */
    _Atomic uint32_t one;          /* R: the single member's slot | KVI_ROOT_BIT, KVI_NONE, or
                                    * KVI_MANY_BIT (members in mv) */
    uint32_t pos;                  /* R: depth, immutable */
    _Atomic uint32_t first_child;  /* R (seq walks): children, linked with release */
    _Atomic uint32_t next_sibling; /* R (seq walks) */
    uint32_t up;                   /* parent entry (KVI_NONE at a root) | KVI_UP_NO_CONTENT | KVI_UP_ASIDE */
    uint32_t prev_sibling;         /* previous child of the parent (KVI_NONE: first) */
};
#define KVI_ENTRY_BYTES 40
_Static_assert(sizeof(struct kvi_entry) == KVI_ENTRY_BYTES, "entry layout");
_Static_assert(((KVI_SLOT_CHUNKS_MAX << KVI_SLOT_CHUNK_SHIFT) - 1) <= KVI_SLOT_MASK, "slot ids fit KVI_SLOT_MASK");

/* The member array of an entry whose `one` reads KVI_MANY_BIT. */
static inline struct kvi_mset *kvi__mset(const struct kvi_entry *e, memory_order mo)
{
    return (struct kvi_mset *)(uintptr_t)atomic_load_explicit(&((struct kvi_entry *)e)->mv, mo);
}

/*
 * Open-addressing table: u64 key -> u32 entry index, linear probing. A slot
 * is 4 bytes: the entry index (KVI_TAB_IDX bits) under 4 fingerprint bits,
 * the low bits of the key's 32-bit table tag (tab_slot); 0 is a free slot.
 * The key and its tag are not in the slot: the key lives in the entry (or
 * its member array, or the seq column), and the home slot is the top bits
 * of the tag, so a lookup that meets a slot whose fingerprint matches reads
 * the entry to compare keys (a hit reads that entry anyway), and a rehash
 * reads each live slot's key from its entry to place it.
 * measured (kvidx-bench micro, 2^20 blocks): 8-byte slots (a 32-bit tag
 * beside the index) cost 16 bytes per block in each of the key table and
 * the slot maps at load 1/2; 4-byte slots cost 8 (72.2 -> 56.2 bytes per
 * (block, worker) for the two). The price is the writer's under churn
 * (kvidx-bench micro --replay, cpu ns per block-op, 3 interleaved runs:
 * 99.1-100.4 -> 121.6-123.6): slot maps resize by reading entries, purge
 * tombstones, and verify 1 in 16 passed slots. 8-byte Robin Hood slot maps
 * sized to the load were slower (137).
 */
struct kvi_tab {
    uint32_t mask;
    uint32_t used; /* live + tombstones */
    uint32_t live;
    uint32_t shift;   /* 64 - log2(capacity): home slot = top bits of the tag */
    uint32_t grow_at; /* an insert finding `used` this high first grows or purges */
    uint32_t _pad;
    size_t mapped;    /* bytes mapped with mmap (huge-page tables); 0: malloc'd */
    _Atomic uint32_t s[];
};

struct kvi_table {
    _Atomic(struct kvi_tab *) t; /* R: published with release */
};

/* A table's floor (W, its owner's field: kvi_slot.map_floor,
 * kvi_part.ktab_floor and .stab_floor; tab_floor in index_impl.h): the
 * capacity a reservation (kvi_index_reserve, _reserve_slot) asked for, 0 if
 * none. The table's first array has it, and removals never shrink the table
 * below it, so that a pool that fills, drains and fills again rebuilds
 * nothing up to its reserved size. */

/* A worker slot: (instance, dp_rank, tier). */
struct kvi_slot {
    uint32_t id;
    uint32_t instance;
    uint32_t dp_rank;
    uint8_t tier;
    bool shared;
    _Atomic bool live;
    _Atomic uint32_t n_blocks; /* R: tree size */
    uint32_t map_floor;        /* writer: the map's reserved floor (in the hole before map) */
    struct kvi_table map;      /* writer: engine hash -> entry (never read by queries) */
};
/* queries read id .. n_blocks of the slots they answer (emit_part): two
 * slots per cache line */
_Static_assert(sizeof(struct kvi_slot) == 32, "slot layout");

struct kvi_instance {
    uint64_t id;
    char *name;
    bool shared;
    uint32_t part;
    _Atomic(struct kvi_slotlist *) slots; /* R: slots of this instance, copy-on-write */
};

struct kvi_slotlist {
    uint32_t n;
    uint32_t id[];
};

struct kvi_retired {
    void *p;
    size_t bytes;
    size_t unmap; /* != 0: munmap(p, unmap) rather than free(p) */
};

/* Per-partition state, written by one writer thread. Separate cache lines
 * keep the writers' counters from sharing lines. */
struct kvi_part {
    struct kvi_table ktab; /* prefix key K -> entry */
    struct kvi_table stab; /* standard seq hash S -> entry; NULL until something needs it
                            * (seq stores, seq queries): built then, maintained after */
    uint32_t ktab_floor, stab_floor; /* W: their reserved floors (struct kvi_table) */
    struct kvi_entry *_Atomic chunks[KVI_ENTRY_CHUNKS_MAX];
    /* R (by seq): standard seq hashes of entry chunk c's entries, allocated
     * with the seq table (kvi_ix__stab_build) and with every chunk after it;
     * NULL while the partition has no seq table */
    uint64_t *_Atomic seqcol[KVI_ENTRY_CHUNKS_MAX];
    uint32_t n_chunks;
    uint32_t next_fresh; /* next never-used entry index */
    uint32_t *free_idx;  /* recycled entry indices, usable now */
    uint32_t n_free, cap_free;
    uint32_t *pending_idx; /* freed entries waiting for a grace period */
    uint32_t n_pending, cap_pending;
    struct kvi_retired *retired; /* memory waiting for a grace period */
    uint32_t n_retired, cap_retired;
    size_t retired_bytes;
    uint32_t *stack; /* scratch for cascades */
    uint32_t cap_stack;
    uint64_t *sortbuf;
    size_t cap_sortbuf;
    uint64_t *runbuf; /* keys, seq hashes and table tags of the run being stored */
    size_t cap_runbuf;
    uint64_t *dup_val; /* duplicate check of a run: open-addressing set (0: free) */
    size_t cap_dup;
    uint32_t *aside_idx; /* content hashes of KVI_UP_ASIDE entries: open addressing, */
    uint64_t *aside_val; /* entry index (0: free) -> content hash */
    uint32_t aside_cap, aside_n;
    uint32_t *pending_slots; /* slot ids freed, waiting for a grace period */
    uint32_t n_pending_slots, cap_pending_slots;

    KVI_CACHE_ALIGNED _Atomic uint64_t entries;
    _Atomic uint64_t holdings;
    _Atomic uint64_t bytes;
    _Atomic uint64_t stored_blocks;
    _Atomic uint64_t removed_blocks;
    _Atomic uint64_t parent_not_found;
    _Atomic uint64_t parent_elsewhere; /* kvi_index_stats.parent_elsewhere */
    _Atomic uint64_t seq_conflicts;    /* kvi_index_stats.seq_conflicts */
    _Atomic uint64_t unknown_removes;
    _Atomic uint64_t unknown_blocks;
    _Atomic uint64_t invalid_events;
    _Atomic uint64_t table_rebuilds; /* kvi_index_stats.table_rebuild* */
    _Atomic uint64_t table_rebuild_slots;
    _Atomic uint64_t table_rebuild_ns;
    _Atomic uint64_t wgen; /* R: bumped on every membership change */
} KVI_CACHE_ALIGNED;

struct kvi_index {
    uint32_t block_size;
    uint32_t n_parts;
    _Atomic uint32_t jump;
    uint64_t kseed;  /* K[-1] */
    uint64_t kxor;   /* content mixing secret */
    uint64_t kmul;   /* position mixing secret */
    uint64_t tseed;  /* table position seed */

    /* slots: chunked, never move; readers index them by id */
    struct kvi_slot *_Atomic slot_chunks[KVI_SLOT_CHUNKS_MAX];
    _Atomic uint32_t n_slot_ids; /* ids ever handed out + 1 */
    _Atomic bool has_lower_tiers;
    _Atomic bool has_shared;
    _Atomic bool has_seq_only; /* some prefix was placed by seq hash alone: content
                                * queries then go through the seq table */
    _Atomic bool seq_wanted;   /* seq tables are needed: each writer builds its
                                * partition's at its next mutation or reclaim */

    /* instances: chunked; interning under inst_lock */
    pthread_mutex_t inst_lock;
    struct kvi_instance *_Atomic inst_chunks[KVI_INST_CHUNKS_MAX];
    _Atomic uint32_t n_instances;
    uint64_t *inst_map; /* open addressing: (hash of key) -> dense id + 1 */
    uint32_t inst_map_mask;

    /* slot id allocation (any writer may create slots): under slot_lock */
    pthread_mutex_t slot_lock;
    uint32_t *free_slot_ids;
    uint32_t n_free_slot_ids, cap_free_slot_ids;

    struct kvi_part *parts;   /* n_parts, mapped anonymously (kvi_index_create) */
    size_t parts_bytes;       /* the mapping's length */
};

static inline struct kvi_entry *kvi__entry(const struct kvi_part *p, uint32_t idx)
{
    struct kvi_entry *c = atomic_load_explicit(&((struct kvi_part *)p)->chunks[idx >> KVI_ENTRY_CHUNK_SHIFT],
                                               memory_order_acquire);
    return &c[idx & (KVI_ENTRY_CHUNK - 1)];
}

/* Where the standard seq hash of entry idx is kept. Only while the
 * partition has a seq table: writers check stab_on(p); readers reach entries
 * by seq only through that table (published after the column, R3). */
static inline uint64_t *kvi__seqp(const struct kvi_part *p, uint32_t idx)
{
    uint64_t *c = atomic_load_explicit(&((struct kvi_part *)p)->seqcol[idx >> KVI_ENTRY_CHUNK_SHIFT],
                                       memory_order_acquire);
    return &c[idx & (KVI_ENTRY_CHUNK - 1)];
}

static inline struct kvi_slot *kvi__slot(const struct kvi_index *ix, uint32_t id)
{
    struct kvi_slot *c = atomic_load_explicit(&((struct kvi_index *)ix)->slot_chunks[id >> KVI_SLOT_CHUNK_SHIFT],
                                              memory_order_acquire);
    return c == NULL ? NULL : &c[id & (KVI_SLOT_CHUNK - 1)];
}

/*
 * Check the index's tables against its entries: in every table (key table,
 * seq table, each slot's map), every slot naming an entry carries its key's
 * fingerprint, lies in an unbroken probe run from its key's home, and its
 * key leads back to it; the used and live counts match the slots; a key
 * table names every live entry and a slot map as many entries as its slot
 * holds blocks. Returns 0, or -1 with the first fault described in why
 * (len bytes). For tests: the writers must be quiescent.
 */
int kvi_index_check_tables(const struct kvi_index *ix, char *why, size_t len);

#endif
