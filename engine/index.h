/*
 * kvidx positional index: one instance per (model, tenant) namespace.
 *
 * WHAT IT STORES
 *   Blocks are identified by their *prefix*: an entry exists per distinct
 *   (position, chain of content hashes from position 0). Each entry records
 *   which worker slots hold it. A slot is one (instance, dp_rank, tier).
 *   Engine hashes are opaque per-slot names: every slot keeps its own map
 *   engine hash -> entry, used to resolve parents and removals. Two workers
 *   holding the same tokens under different engine hashes share one entry.
 *
 *   Entries are found by two keys, both computed by kvidx:
 *     - the prefix key K (internal, keyed and secret per index):
 *           K[-1] = seed, K[t] = K[t-1] + fmix64((c[t] ^ s1) + ((t+1) * phi ^ s2))
 *       about 1.25 ns per block to compute on the query path. The step is a
 *       bijection in c[t], so an entry does not keep its content hash: it
 *       follows from its key and its parent's. Two different prefixes of one
 *       depth share a key with probability about 2^-64 (two children of one
 *       parent never do); prefixes of different depths that do are kept
 *       apart (the entry records its depth);
 *     - the standard RFC 1527 rolling sequence hash S (engine/hash.h), used by
 *       kvi_index_find_matches_by_seq and by publishers that follow the
 *       standard. A partition builds its S table only once something needs
 *       it (a store given seq hashes, or a query by seq hashes); until then
 *       a query by seq hashes follows the chain from the root through child
 *       links (exact, one dependent access per position) and asks the
 *       partition's writer to build the table at its next mutation or
 *       kvi_index_reclaim.
 *
 * SEMANTICS (../shared/reference/index-semantics.md)
 *   - A slot's score is the length of the contiguous prefix it holds along the
 *     query's exact chain. Chunk-hash collisions cannot produce false matches:
 *     identity is the whole prefix.
 *   - Removing a block removes the slot's descendants of that block too —
 *     those reached through blocks the slot itself holds (they are orphaned:
 *     an engine cannot serve a hit past a hole) — so a slot's gpu holdings
 *     are always ancestor-closed. A lower-tier block hanging below another
 *     tier's block is not a descendant of the lower tier's other blocks, and
 *     a block placed by position (kvi_index_store_seq without a parent) is a
 *     root of its slot: removals above it never take it along (its parent
 *     cannot be known from its seq hash, so this is the rule that does not
 *     depend on what other slots stored).
 *     Re-storing the removed block does not resurrect its descendants.
 *   - A store whose parent engine hash the slot does not know is rejected
 *     (-ENOENT). Lower-tier (cpu/disk/external) stores may name a parent held
 *     on another tier of the same (instance, dp_rank); lower-tier stores
 *     given standard seq hashes whose parent the rank does not hold at all
 *     are placed by position (kvi_index_store_seq).
 *   - Duplicate stores are idempotent; unknown removes are no-ops.
 *   - clear(instance) drops every block of the instance on every dp rank and
 *     tier; clear_dp_rank(instance, rank) drops one rank's (every tier). The
 *     slots stay known with size 0.
 *
 * QUERIES
 *   Because gpu holdings are ancestor-closed, the set of gpu slots holding the
 *   query's entry at position t shrinks monotonically with t, and its size
 *   alone tells whether any slot dropped out between two positions. Queries
 *   jump ahead `jump` positions and compare member counts; a failed jump is
 *   bisected to find exact drain points (jump search plus the binary-search
 *   refinement). A full-depth hit costs one probe per partition.
 *
 * CONCURRENCY
 *   The index is split into `n_parts` partitions, one per writer thread.
 *   Every instance belongs to one partition (kvi_index_partition_of), and all
 *   mutations of a partition must come from a single thread at a time: the
 *   "writer of that partition" (single writer only). Queries (find_*, stats
 *   readers marked so) may run on any number of threads concurrently with the
 *   writers: the caller must be a registered RCU reader and call inside an
 *   RCU read-side section (engine/rcu.h). Queries take no locks, never wait
 *   for writers and allocate nothing per block (per-thread scratch grows only
 *   when a larger query than ever before arrives). Results are weakly
 *   consistent with concurrent writes: each probe sees a state that existed,
 *   and when the partition changed during a query every matched slot's depth
 *   is re-checked position by position (so a slot nobody touched is never
 *   under-scored).
 *   Freed memory is recycled only after an RCU grace period
 *   (kvi_index_reclaim, called by the partition's writer).
 *
 *   | operation                      | who may call                         |
 *   |--------------------------------|--------------------------------------|
 *   | create / destroy               | control plane; destroy with no other |
 *   |                                | users left                           |
 *   | store/remove/clear/remove_*    | the partition's writer               |
 *   | reserve, reserve_slot          | the partition's writer               |
 *   | dump_partition, reclaim        | the partition's writer               |
 *   | find_*, slot_info, tree_size   | any registered RCU reader, in a read |
 *   |                                | section                              |
 *   | intern_instance, instance_info | any thread (internally locked; not   |
 *   |                                | on the query path)                   |
 *   | stats                          | any thread (approximate)             |
 */
#ifndef KVI_ENGINE_INDEX_H
#define KVI_ENGINE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"

/** Storage tiers. External folds into disk for cumulative tier walks. */
enum kvi_tier {
    KVI_TIER_GPU = 0,
    KVI_TIER_CPU = 1,
    KVI_TIER_DISK = 2,
    KVI_TIER_EXTERNAL = 3,
};
#define KVI_TIER_COUNT 4

/** Printable name of a tier ("gpu", "cpu", "disk", "external"). */
const char *kvi_tier_name(enum kvi_tier t);

struct kvi_index;

struct kvi_index_config {
    uint32_t block_size; /* tokens per block, fixed for the namespace */
    uint32_t n_parts;    /* partitions = writer threads (>= 1) */
    uint32_t jump;       /* query jump size; 0 = default (KVI_DEFAULT_JUMP) */
    uint64_t key_seed;   /* prefix-key secret; 0 = random per index */
};

/** Default jump size (see engine/README.md, "Jump size", for the measurement). */
#define KVI_DEFAULT_JUMP 256

/** A block of a stored event. */
struct kvi_block {
    uint64_t engine_hash;  /* the engine's opaque name of the block */
    uint64_t content_hash; /* kvidx content hash of the block's tokens */
};

/** One slot's result of a gpu match. */
struct kvi_match {
    uint32_t slot;      /* slot id (kvi_index_slot_info) */
    uint32_t instance;  /* dense instance id */
    uint32_t dp_rank;
    uint32_t depth;     /* matched blocks, >= 1 */
    uint32_t tree_size; /* blocks the slot currently holds */
};

/** Cumulative tier result of one (instance, dp_rank). */
struct kvi_tier_match {
    uint32_t instance;
    uint32_t dp_rank;
    uint32_t gpu;       /* g: gpu prefix */
    uint32_t cpu;       /* c >= g: extended while the next block is on a usable cpu tier */
    uint32_t disk;      /* d >= c: extended while on a usable disk/external tier */
    uint32_t tree_size; /* gpu blocks held by (instance, dp_rank) */
};

/** Read-only facts about a slot. */
struct kvi_slot_info {
    uint32_t instance;
    uint32_t dp_rank;
    enum kvi_tier tier;
    bool shared; /* a shared storage pool usable by every instance */
};

/** One block of a dump, as handed to the emit callback. */
struct kvi_dump_block {
    uint32_t instance;
    uint32_t dp_rank;
    enum kvi_tier tier;
    uint32_t position;
    uint64_t engine_hash;
    uint64_t content_hash;
    uint64_t seq_hash; /* standard rolling hash of the prefix */
    bool has_parent;
    uint64_t parent_engine_hash; /* the same (instance, dp_rank)'s name of the parent */
    bool no_content; /* placed by seq hash without tokens (kvi_index_store_seq_only): content_hash is
                      * unknown and 0; replay the block with kvi_index_store_seq_only */
};
typedef void (*kvi_dump_fn)(void *ctx, const struct kvi_dump_block *b);

/** Counters and sizes (approximate while writers run). */
struct kvi_index_stats {
    uint64_t entries;        /* distinct prefixes (summed over partitions) */
    uint64_t holdings;       /* (block, slot) pairs */
    uint64_t slots;          /* live slots */
    uint64_t bytes;          /* bytes allocated by the index */
    uint64_t stored_blocks;  /* blocks newly stored */
    uint64_t removed_blocks; /* blocks removed, cascades included */
    uint64_t parent_not_found; /* stores rejected: parent unknown (-ENOENT) */
    uint64_t parent_elsewhere; /* lower-tier seq-hash stores whose parent no slot of the
                                * rank holds, placed by position instead */
    uint64_t seq_conflicts;  /* stored blocks whose seq hash named no prefix while their content
                              * chain named one at that depth: they join it, which keeps its seq hash */
    uint64_t unknown_removes;
    uint64_t unknown_blocks; /* token-less stores that resolved to nothing */
    uint64_t invalid_events;
    /* table rebuilds: an existing key table, seq table or slot map rebuilt
     * into a new array, to grow, to shrink or to purge tombstones (a
     * table's first array is not one). Their time is the writer's, spent
     * inside the write (or reserve) call that needed the rebuild. */
    uint64_t table_rebuilds;
    uint64_t table_rebuild_slots; /* live slots moved by them */
    uint64_t table_rebuild_ns;    /* monotonic time spent in them */
};

/** Destroy an index and everything it holds. No reader or writer may use it. */
void kvi_index_destroy(struct kvi_index *ix);

/**
 * Create an index.
 * @return the index, or NULL with errno = EINVAL (block_size 0, n_parts 0 or
 *         > 1024) or ENOMEM.
 */
KVI_DEALLOC(kvi_index_destroy, 1) KVI_WARN_UNUSED
struct kvi_index *kvi_index_create(const struct kvi_index_config *cfg);

/** The namespace's block size. */
uint32_t kvi_index_block_size(const struct kvi_index *ix);
/** Number of partitions. */
uint32_t kvi_index_n_parts(const struct kvi_index *ix);
/** Set the jump size used by queries (0 = jump to the end). Control plane. */
void kvi_index_set_jump(struct kvi_index *ix, uint32_t jump);

/**
 * Intern an instance id and get its dense id (stable until the index dies).
 * Dynamo instances are u64s, Mooncake ones strings; the two spaces are
 * distinct. @p name may be NULL for numeric ids. Internally locked.
 * @param shared  marks a shared storage pool (Mooncake backend): its cpu/disk
 *                blocks are usable by every instance. Fixed at first intern.
 * @return dense id >= 0, or -ENOMEM.
 */
int64_t kvi_index_intern_instance(struct kvi_index *ix, uint64_t id, const char *name, bool shared);

/** Look up an interned instance without creating it. @return id or -ENOENT. */
int64_t kvi_index_find_instance(struct kvi_index *ix, uint64_t id, const char *name);

/**
 * The public id of a dense instance id: numeric id, and the string name or
 * NULL. @return 0 or -ENOENT. The name stays valid for the index's life.
 */
int kvi_index_instance_info(struct kvi_index *ix, uint32_t instance, uint64_t *id, const char **name,
                            bool *shared);

/** Partition (= writer) that owns a dense instance id. */
uint32_t kvi_index_partition_of(const struct kvi_index *ix, uint32_t instance);

/* ---- mutations: single writer per partition ------------------------------ */

/**
 * Store a run of blocks for (instance, dp_rank, tier) (writer of the
 * instance's partition only).
 * @param has_parent  whether @p parent_engine_hash names the run's parent;
 *                    otherwise the run starts at position 0.
 * @return 0 (also for an idempotent re-store), -ENOENT when the parent is
 *         unknown for this slot, -EINVAL when the run repeats an engine hash
 *         (or contains its parent) — the index is then unchanged.
 */
int kvi_index_store(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                    bool has_parent, uint64_t parent_engine_hash, const struct kvi_block *blocks,
                    size_t n);

/**
 * Store a run whose prefix identity is given by standard sequence hashes
 * (RFC 1527 publishers): block i sits at @p position + i with seq hash
 * @p seq[i]. Content hashes must be known (tokens sent) for the blocks to be
 * reachable by content-hash queries; see kvi_index_find_matches_by_seq.
 * With has_parent the run is attached to the parent when some slot of
 * (instance, dp_rank) holds it (the slot itself, or on a lower tier another
 * tier of the rank). On a lower tier a run whose parent the rank does not
 * hold (another backend's, or nobody's) is placed by position instead, a
 * root of its slot, since the seq hash names the whole prefix: at @p position
 * (> 0; the publisher's base_block_idx), as a run placed without a parent,
 * and counted in kvi_index_stats.parent_elsewhere. Without a parent, or with
 * one the rank holds, a run needs no position.
 * A block with content whose seq hash names no prefix at its position while
 * its content chain names one there (seq hashes that are not the standard
 * ones of the tokens: one chain stored under two) joins that prefix, which
 * keeps its first seq hash (one entry per position and content chain),
 * counted in kvi_index_stats.seq_conflicts; a duplicate of that store is
 * idempotent, as any other.
 * Single writer only.
 * @return 0, -ENOENT (unknown parent on the gpu tier, or on a lower tier with
 *         @p position 0), -EINVAL (position > 0 with no parent on the gpu tier,
 *         or repeated engine hashes).
 */
int kvi_index_store_seq(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank,
                        enum kvi_tier tier, bool has_parent, uint64_t parent_engine_hash,
                        uint32_t position, const struct kvi_block *blocks, const uint64_t *seq,
                        size_t n);

/**
 * Store token-less blocks named only by engine hashes (offload placeholders,
 * connector stores: wire-protocol.md §5): block i is the prefix that
 * (instance, dp_rank) already holds under @p engine_hashes[i] on another tier
 * (looked up gpu first, then cpu, disk, external); it is added to @p tier
 * under the same engine hash, at that prefix. Hashes that resolve to nothing
 * are skipped (counted in kvi_index_stats.unknown_blocks). Single writer only.
 *
 * Details: blocks are added parents first (in position order, whatever the
 * run's order). A block already held on @p tier under that hash counts as
 * held (idempotent); one held on @p tier under another hash is renamed; a
 * hash that names another prefix on @p tier drops that block (and its
 * descendants in the slot) first. On a lower tier the block hangs below its
 * parent when some tier of (instance, dp_rank) holds the parent, else it is
 * a positional root (as kvi_index_store_seq without a parent). On the gpu
 * tier a block whose parent the gpu slot does not hold is skipped and counted
 * as unresolved (gpu holdings stay ancestor-closed). An invalid instance or
 * tier resolves nothing (returns 0, *n_unresolved = n, no counter moves).
 * @param n_unresolved  receives the number of skipped hashes (may be NULL)
 * @return the number of blocks now held on @p tier from this run (0..n).
 */
size_t kvi_index_store_known(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                             const uint64_t *engine_hashes, size_t n, size_t *n_unresolved);

/**
 * Store a run known only by standard seq hashes, without tokens (RFC 1527
 * publishers such as the Mooncake master): block i is the existing prefix
 * whose seq hash is @p seq[i] when the index has it (content known, so
 * content queries match too; entries are per partition, so "has" means the
 * instance's partition has it); otherwise it is placed by seq alone
 * (reachable by seq queries and tier walks only), as kvi_index_store_seq
 * does. Block i is named @p engine_hashes[i] in the slot (RFC 1527 streams
 * use the seq hash itself). Parent and position rules as kvi_index_store_seq.
 * A block placed without tokens has an unknown content hash (dumped with
 * no_content) until a store with tokens reaches the same seq hash. Placing
 * one makes every later content query go through seq hashes, so a content
 * query whose standard seq hashes equal @p seq matches it too. At position 0
 * the content hash is known: it equals the seq hash (RFC 1527).
 * Single writer only.
 * @return 0, -ENOENT (unknown parent), -EINVAL (position > 0 with no parent on
 *         the gpu tier, repeated engine hashes, an invalid instance or tier,
 *         or NULL arrays with n > 0).
 */
int kvi_index_store_seq_only(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                             bool has_parent, uint64_t parent_engine_hash, uint32_t position,
                             const uint64_t *engine_hashes, const uint64_t *seq, size_t n);

/**
 * Remove blocks by engine hash from (instance, dp_rank, tier), with their
 * descendants held by that slot. Unknown hashes are skipped.
 * Single writer only. @return the number of engine hashes that were known.
 */
size_t kvi_index_remove(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank,
                        enum kvi_tier tier, const uint64_t *engine_hashes, size_t n);

/** Drop every block of @p instance on every dp rank and tier; slots stay. */
void kvi_index_clear(struct kvi_index *ix, uint32_t instance);

/**
 * Drop every block of (@p instance, @p dp_rank) on every tier; its slots stay
 * known with size 0, and the instance's other ranks keep theirs (an engine's
 * AllBlocksCleared comes from one data-parallel rank's scheduler). Unknown
 * instances and ranks are no-ops. Single writer only.
 */
void kvi_index_clear_dp_rank(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank);

/** Drop one dp rank of @p instance (all tiers) and forget its slots. */
void kvi_index_remove_dp_rank(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank);

/** Drop every slot of @p instance and forget them. */
void kvi_index_remove_instance(struct kvi_index *ix, uint32_t instance);

/**
 * Pre-size partition @p part for @p entries distinct prefixes in all (single
 * writer only: the partition's writer): its prefix-key table, and its seq
 * table when it keeps one, are resized now, and entry storage for that many
 * entries is allocated with its pages touched, so that stores up to that
 * size neither rehash those tables nor fault in fresh pages. A capacity
 * hint, and a floor: the index still grows past it, and removals never
 * shrink those tables below it (they rebuild nothing while a pool fills,
 * drains and fills again). A later call sets a new floor, which may be lower
 * (removals then shrink the tables to it); @p entries 0 drops the floor and
 * allocates nothing. Entry storage once allocated is kept.
 * @return 0, or -EINVAL (no such partition, or more entries than a partition
 *         can hold).
 */
int kvi_index_reserve(struct kvi_index *ix, uint32_t part, uint64_t entries);

/**
 * Pre-size the engine-hash map of slot (@p instance, @p dp_rank, @p tier) for
 * @p blocks holdings, creating the slot (holding nothing) when it does not
 * exist yet (single writer only: the writer of the instance's partition).
 * A capacity hint and a floor, as kvi_index_reserve (an AllBlocksCleared
 * keeps it: the map's next array has the reserved size); it ends with the
 * slot (kvi_index_remove_dp_rank, kvi_index_remove_instance).
 * @return 0, or -EINVAL (unknown instance, invalid tier, or too many blocks).
 */
int kvi_index_reserve_slot(struct kvi_index *ix, uint32_t instance, uint32_t dp_rank, enum kvi_tier tier,
                           uint64_t blocks);

/**
 * Free memory retired by partition @p part after waiting for an RCU grace
 * period. Called by the partition's writer (never inside a read section);
 * cheap when nothing is pending. Mutations call it themselves once enough
 * memory is pending.
 */
void kvi_index_reclaim(struct kvi_index *ix, uint32_t part);

/**
 * kvi_index_reclaim in two halves, so that a writer reclaiming several
 * indexes waits for one grace period for all of them: begin trims scratch
 * and returns true when memory waits for a grace period; after one
 * kvi_rcu_synchronize() (no mutation of the partition in between), end
 * frees it. Writer of the partition only, outside read sections.
 */
bool kvi_index_reclaim_begin(struct kvi_index *ix, uint32_t part);
void kvi_index_reclaim_end(struct kvi_index *ix, uint32_t part);

/**
 * Emit every block held in partition @p part, per (instance, dp_rank) in
 * position order (parents before children, across tiers), so that replaying the
 * blocks as single-block stores rebuilds an identical index.
 * Writer of the partition only (a consistent snapshot of the partition).
 */
void kvi_index_dump_partition(struct kvi_index *ix, uint32_t part, kvi_dump_fn emit, void *ctx);

/* ---- queries: RCU readers ------------------------------------------------ */

/**
 * Gpu prefix matches for a query of content hashes.
 * Call inside an RCU read-side section (registered reader thread).
 * @param out  receives at most @p cap matches, in no particular order
 * @return number of slots with depth >= 1 (may exceed @p cap).
 */
size_t kvi_index_find_matches(const struct kvi_index *ix, const uint64_t *content, size_t n,
                              struct kvi_match *out, size_t cap);

/**
 * Same for a query given as standard rolling sequence hashes.
 * Call inside an RCU read-side section.
 */
size_t kvi_index_find_matches_by_seq(const struct kvi_index *ix, const uint64_t *seq, size_t n,
                                     struct kvi_match *out, size_t cap);

/**
 * Cumulative tier matches (gpu <= cpu <= disk) for every (instance, dp_rank)
 * that holds blocks of its own and has a hit on any tier, shared pools
 * included (see kvi_index_pool_depths for instances without blocks). Call inside an RCU read-side
 * section. @p seq may be NULL (then computed) — pass content OR seq:
 * @param content  content hashes, or NULL to query by @p seq
 * @return number of (instance, dp_rank) results (may exceed @p cap).
 */
size_t kvi_index_find_tiered(const struct kvi_index *ix, const uint64_t *content,
                             const uint64_t *seq, size_t n, struct kvi_tier_match *out, size_t cap);

/**
 * Depths an (instance, dp_rank) holding no blocks of its own reaches through
 * shared pools alone (Conductor lists every registered instance; rows absent
 * from kvi_index_find_tiered get gpu 0, cpu @p cpu, disk @p disk).
 * Call inside an RCU read-side section. Pass content OR seq as for find_tiered.
 */
void kvi_index_pool_depths(const struct kvi_index *ix, const uint64_t *content, const uint64_t *seq, size_t n,
                           uint32_t *cpu, uint32_t *disk);

/** Facts about a slot. Call inside an RCU read-side section. @return 0/-ENOENT */
int kvi_index_slot_info(const struct kvi_index *ix, uint32_t slot, struct kvi_slot_info *info);

/** Gpu blocks held by (instance, dp_rank); 0 if unknown. Registered RCU reader threads. */
uint32_t kvi_index_tree_size(const struct kvi_index *ix, uint32_t instance, uint32_t dp_rank);

/** Counters and sizes, summed over partitions. Any thread (approximate). */
void kvi_index_stats(const struct kvi_index *ix, struct kvi_index_stats *st);

/**
 * Prefix keys of a content-hash query (exposed for tests and benchmarks).
 * @param keys  receives n keys
 */
void kvi_index_prefix_keys(const struct kvi_index *ix, const uint64_t *content, size_t n,
                           uint64_t *keys);

#endif
