#include "engine/arena.h"

#include <errno.h>
#include <malloc.h>
#include <string.h>

#ifdef KVI_WITH_JEMALLOC
#include <jemalloc/jemalloc.h>

int kvi_arena_create(unsigned *arena)
{
    size_t sz = sizeof *arena;
    int r = mallctl("arenas.create", arena, &sz, NULL, 0);
    return r ? -r : 0;
}

int kvi_arena_bind_thread(unsigned arena)
{
    int r = mallctl("thread.arena", NULL, NULL, &arena, sizeof arena);
    return r ? -r : 0;
}

uint64_t kvi_arena_allocated(unsigned arena)
{
    uint64_t e = 1;
    size_t esz = sizeof e;
    mallctl("epoch", &e, &esz, &e, esz);
    char name[96];
    size_t v = 0, total = 0, vsz = sizeof v;
    snprintf(name, sizeof name, "stats.arenas.%u.small.allocated", arena);
    if (mallctl(name, &v, &vsz, NULL, 0) == 0)
        total += v;
    snprintf(name, sizeof name, "stats.arenas.%u.large.allocated", arena);
    vsz = sizeof v;
    if (mallctl(name, &v, &vsz, NULL, 0) == 0)
        total += v;
    return total;
}

void kvi_mem_stats(struct kvi_mem_stats *st)
{
    memset(st, 0, sizeof *st);
    uint64_t e = 1;
    size_t esz = sizeof e, v, vsz = sizeof v;
    mallctl("epoch", &e, &esz, &e, esz);
    if (mallctl("stats.allocated", &v, &vsz, NULL, 0) == 0)
        st->allocated = v;
    vsz = sizeof v;
    if (mallctl("stats.active", &v, &vsz, NULL, 0) == 0)
        st->active = v;
    vsz = sizeof v;
    if (mallctl("stats.resident", &v, &vsz, NULL, 0) == 0)
        st->resident = v;
    vsz = sizeof v;
    if (mallctl("stats.mapped", &v, &vsz, NULL, 0) == 0)
        st->mapped = v;
    st->jemalloc = 1;
}

#else

int kvi_arena_create(unsigned *arena)
{
    *arena = 0;
    return 0;
}

int kvi_arena_bind_thread(unsigned arena)
{
    (void)arena;
    return 0;
}

uint64_t kvi_arena_allocated(unsigned arena)
{
    (void)arena;
    return 0;
}

void kvi_mem_stats(struct kvi_mem_stats *st)
{
    memset(st, 0, sizeof *st);
    struct mallinfo2 mi = mallinfo2();
    st->allocated = mi.uordblks + mi.hblkhd;
    st->active = mi.arena + mi.hblkhd;
    st->mapped = mi.hblkhd;
}
#endif
