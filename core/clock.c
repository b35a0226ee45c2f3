#include <time.h>

#include <tern/clock.h>

#include "core/clock.h"

uint64_t tern_clock_ns(void)
{
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail with a valid clock id and pointer. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t tern__clock_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
