/*
 * Memory arenas and allocator statistics.
 *
 * With jemalloc (KVI_WITH_JEMALLOC), every writer thread gets its own arena
 * and binds itself to it (thread.arena), so the per-worker lookup maps,
 * entries and member sets a writer allocates with plain malloc live in that
 * writer's arena. Sanitizer builds link libc malloc: the functions then do
 * nothing and statistics come from mallinfo2().
 */
#ifndef KVI_ENGINE_ARENA_H
#define KVI_ENGINE_ARENA_H

#include <stdint.h>

struct kvi_mem_stats {
    uint64_t allocated; /* bytes in live allocations */
    uint64_t active;    /* bytes in active pages */
    uint64_t resident;  /* bytes resident (jemalloc's view; 0 without jemalloc) */
    uint64_t mapped;
    int jemalloc;       /* 1 when jemalloc provides the figures */
};

/**
 * Create a new arena.
 * @param[out] arena  the arena index (0 when jemalloc is not linked)
 * @return 0, or -errno from mallctl.
 */
int kvi_arena_create(unsigned *arena);

/**
 * Bind the calling thread to @p arena: its plain malloc() calls then allocate
 * there. @return 0 or -errno. A no-op without jemalloc.
 */
int kvi_arena_bind_thread(unsigned arena);

/** Bytes allocated (small + large) in @p arena; 0 without jemalloc. */
uint64_t kvi_arena_allocated(unsigned arena);

/** Process-wide allocator statistics (refreshes jemalloc's epoch). */
void kvi_mem_stats(struct kvi_mem_stats *st);

#endif
