/* The clock every part of infergate reads (gateway, routing and runtime
 * alike): monotonic time for intervals, timeouts and rates, wall-clock
 * epoch milliseconds for what crosses processes or machines (deadlines in
 * x-infergate-deadline-ms, region records' updated_ms, log stamps).
 * Header-only: each is one clock_gettime, cheap enough for a hot path
 * (vDSO); the _coarse one is the tick-resolution clock for per-frame
 * bookkeeping where a few milliseconds do not matter. */
#ifndef GW_CLOCK_H
#define GW_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t gw_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline double gw_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int64_t gw_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t gw_mono_coarse_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t gw_epoch_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
