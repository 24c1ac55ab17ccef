#include "engine/common.h"

#include <time.h>

struct timespec kvi_timespec_after(clockid_t clk, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec += (long)(ns % 1000000000u);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

uint64_t kvi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#ifdef KVI_TSAN
_Atomic uint32_t kvi__tsan_fence_word;
#endif
