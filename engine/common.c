#include "engine/common.h"

#include <time.h>

uint64_t kvi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#ifdef KVI_TSAN
_Atomic uint32_t kvi__tsan_fence_word;
#endif
