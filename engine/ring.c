/*
 * kvidx ring: slow path only (create, free). The data path is inline in
 * engine/ring.h.
 */
#include "engine/ring.h"

#include <errno.h>
#include <stdlib.h>

/* Smallest power of two >= @p n, for 2 <= n <= 2^30 (rounds 1 up to 2). */
static uint32_t ring_pow2_ceil(uint32_t n)
{
    if (n <= 2)
        return 2;
    return UINT32_C(1) << (32 - __builtin_clz(n - 1));
}

struct kvi_ring *kvi_ring_create(uint32_t capacity)
{
    if (capacity == 0 || capacity > KVI_RING_MAX_CAPACITY) {
        errno = EINVAL;
        return NULL;
    }
    uint32_t cap = ring_pow2_ceil(capacity);
#if SIZE_MAX <= UINT32_MAX
    /* 32-bit size_t: 2^30 pointers do not fit the address space. */
    if (cap > (SIZE_MAX - sizeof(struct kvi_ring) - KVI_CACHE_LINE) / sizeof(void *)) {
        errno = ENOMEM;
        return NULL;
    }
#endif
    /* Whole cache lines, so the last slot line is not shared with a neighbour. */
    size_t bytes = sizeof(struct kvi_ring) + (size_t)cap * sizeof(void *);
    bytes = (bytes + KVI_CACHE_LINE - 1) & ~(size_t)(KVI_CACHE_LINE - 1);

    void *mem = NULL;
    int rc = posix_memalign(&mem, KVI_CACHE_LINE, bytes);
    if (rc != 0) {
        errno = rc; /* ENOMEM */
        return NULL;
    }
    struct kvi_ring *r = mem;
    atomic_init(&r->_head, 0);
    r->_tail_cache = 0;
    r->_zc_reserved = 0;
    atomic_init(&r->_tail, 0);
    r->_head_cache = 0;
    r->_mask = cap - 1;
    r->_capacity = cap;
    return r;
}

void kvi_ring_free(struct kvi_ring *r)
{
    free(r);
}
