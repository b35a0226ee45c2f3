/*
 * Percentiles of timed samples, one definition for tern-perf and the peers it
 * is compared with (perf/mpi_coll.c), so their p50 and p99 mean the same;
 * and the sort of nanosecond samples they are read from.
 * Nearest rank: the q-th percentile of n sorted samples is the one at index
 * ceil(q*n/100) - 1 (p50 of an even count is the lower middle; p99 of fewer
 * than 100 samples is the largest). Integer arithmetic: 0.99 * 100 in
 * floating point can round to just above 99 and take the maximum.
 */
#ifndef TERN_PERF_STATS_H
#define TERN_PERF_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static inline int tern_bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sort n nanosecond samples in place, ascending. */
static inline void tern_bench_sort_u64(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof(*v), tern_bench_cmp_u64);
}

static inline size_t tern_bench_pct_index(size_t n, unsigned pct)
{
    size_t k;

    if (n == 0)
        return 0;
    k = (n / 100) * pct + ((n % 100) * pct + 99) / 100; /* ceil(n*pct/100), no overflow */
    return k == 0 ? 0 : k > n ? n - 1 : k - 1;
}

#endif
