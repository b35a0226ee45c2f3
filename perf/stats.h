/*
 * Percentiles of timed samples, one definition for tern-perf and the peers it
 * is compared with (perf/mpi_coll.c), so their p50 and p99 mean the same.
 * Nearest rank: the q-th percentile of n sorted samples is the one at index
 * ceil(q*n/100) - 1 (p50 of an even count is the lower middle; p99 of fewer
 * than 100 samples is the largest). Integer arithmetic: 0.99 * 100 in
 * floating point can round to just above 99 and take the maximum.
 */
#ifndef TERN_PERF_STATS_H
#define TERN_PERF_STATS_H

#include <stddef.h>

static inline size_t tern_bench_pct_index(size_t n, unsigned pct)
{
    size_t k;

    if (n == 0)
        return 0;
    k = (n / 100) * pct + ((n % 100) * pct + 99) / 100; /* ceil(n*pct/100), no overflow */
    return k == 0 ? 0 : k > n ? n - 1 : k - 1;
}

#endif
