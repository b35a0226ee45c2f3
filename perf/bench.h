/*
 * The benchmark library behind tern-perf (and its CTest smoke test): each test
 * runs between the ranks of a context and fills one result per message size.
 * Only the numbers are here; formatting is the caller's.
 */
#ifndef TERN_PERF_BENCH_H
#define TERN_PERF_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <tern/tern.h>

typedef enum tern_bench_test {
    TERN_BENCH_LAT = 0,  /* ping-pong; one-way latency = half the round trip */
    TERN_BENCH_BW = 1,   /* rank 0 streams a window of messages to rank 1 */
    TERN_BENCH_BIBW = 2, /* both stream at once */
    TERN_BENCH_RATE = 3, /* messages per second with a window in flight */
} tern_bench_test_t;

typedef struct tern_bench_opts {
    tern_bench_test_t test;
    unsigned iters;  /* 0: chosen by size */
    unsigned warmup; /* 0: chosen by size */
    unsigned window; /* messages in flight for bw/bibw/rate */
} tern_bench_opts_t;

typedef struct tern_bench_result {
    size_t size;
    unsigned iters;
    double lat_us_p50, lat_us_avg, lat_us_p99; /* lat only */
    double bw_GBps;                           /* bw, bibw (bibw: both directions summed) */
    double msg_rate;                          /* messages per second */
} tern_bench_result_t;

/* Run one test at one size; collective over every rank of ctx (pairs 0-1,
 * 2-3, ... run at once; an odd last rank idles). The result is rank 0's.
 * buffers are allocated inside. */
tern_status_t tern_bench_run(tern_ctx_t *ctx, const tern_bench_opts_t *opts, size_t size,
                             tern_bench_result_t *result);

const char *tern_bench_name(tern_bench_test_t test);
int tern_bench_parse(const char *name, tern_bench_test_t *test);

/* The CSV header tern-perf prints with --format csv (scripts rely on it). */
#define TERN_BENCH_CSV_HEADER \
    "test,transport,mem,ranks,size,iters,lat_us_p50,lat_us_avg,lat_us_p99,bw_GBps,busbw_GBps,msg_rate"

#endif
