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
    /* Collectives over every rank (perf/bench_coll.c), timed as nccl-tests. */
    TERN_BENCH_ALLREDUCE = 4,
    TERN_BENCH_BROADCAST = 5,
    TERN_BENCH_REDUCE = 6,
    TERN_BENCH_ALLGATHER = 7,
    TERN_BENCH_REDUCE_SCATTER = 8,
    TERN_BENCH_ALLTOALL = 9,
    TERN_BENCH_GATHER = 10,
    TERN_BENCH_SCATTER = 11,
    TERN_BENCH_BARRIER = 12,
    /* RPC round trips and call rate (perf/bench_rpc.c): rows rpc_lat, rpc_rate. */
    TERN_BENCH_RPC = 13,
    /* The profiler (perf/bench_prof.c): clock offsets, and what profiling costs. */
    TERN_BENCH_CLOCK = 14,
    TERN_BENCH_PROF = 15,
} tern_bench_test_t;

#define TERN_BENCH_TEST_COUNT 16

typedef struct tern_bench_opts {
    tern_bench_test_t test;
    unsigned iters;  /* 0: chosen by size */
    unsigned warmup; /* with warmup_given; otherwise iters/10, at least 2 */
    int warmup_given; /* warmup was set (0 allowed: no warmup) */
    unsigned window; /* messages in flight for bw/bibw/rate */
    /* Collectives only. A zeroed dtype is f16, not tern-perf's default f32:
     * callers set it. */
    tern_dtype_t dtype;
    tern_reduce_op_t op; /* all_reduce, reduce, reduce_scatter */
    int root;            /* broadcast, reduce, gather, scatter */
    int check;           /* verify the last timed iteration's results */
    int inplace;         /* all_reduce: one buffer, input and output (torch's all_reduce) */
    size_t traffic;      /* bytes a size's default iterations move (0: 64 MiB) */
} tern_bench_opts_t;

typedef struct tern_bench_result {
    size_t size;
    unsigned iters;
    double lat_us_p50, lat_us_avg, lat_us_p99; /* lat and the collectives */
    double bw_GBps;    /* bw, bibw (bibw: both directions summed); collectives: algbw */
    double busbw_GBps; /* collectives: algbw times nccl-tests' factor for the operation */
    double msg_rate;   /* messages per second */
    /* Collectives with check set: ranks whose results were wrong (every rank
     * gets the same count), and on a rank that was wrong, its first mismatch. */
    unsigned check_failures;
    char check_detail[256];
} tern_bench_result_t;

/* Run one point-to-point test (lat, bw, bibw, rate) at one size; collective
 * over every rank of ctx (pairs 0-1, 2-3, ... run at once; an odd last rank
 * idles). The result is rank 0's. buffers are allocated inside. The
 * collective tests run through tern_bench_coll_run() (perf/bench_coll.h), rpc
 * through perf/bench_rpc.h, clock and prof through perf/bench_prof.h. */
tern_status_t tern_bench_run(tern_ctx_t *ctx, const tern_bench_opts_t *opts, size_t size,
                             tern_bench_result_t *result);

/* The untimed iterations before iters timed ones: opts->warmup when given,
 * else tern_bench_warmup_default(iters). */
unsigned tern_bench_warmup(const tern_bench_opts_t *opts, unsigned iters);

/* A tenth of the timed iterations, at least 2. */
static inline unsigned tern_bench_warmup_default(unsigned iters)
{
    return iters / 10 > 2 ? iters / 10 : 2;
}

/* Whether every rank of ctx's world has ok set, agreed before any timing so
 * that a rank that could not allocate its buffers does not leave the others
 * waiting for it until TERN_TIMEOUT. TERN_ERR_NO_MEMORY (recorded, naming
 * what and whether it was this rank) when one has not. */
tern_status_t tern_bench_agree(tern_ctx_t *ctx, int ok, const char *what, size_t size);

/* Names of every test, point-to-point, collective, rpc and profiler ("lat", "allreduce"...). */
const char *tern_bench_name(tern_bench_test_t test);
int tern_bench_parse(const char *name, tern_bench_test_t *test);
int tern_bench_is_coll(tern_bench_test_t test);

/* The CSV header tern-perf prints with --format csv (scripts rely on it); clock
 * and prof have their own (perf/bench_prof.h). */
#define TERN_BENCH_CSV_HEADER \
    "test,transport,mem,ranks,size,iters,lat_us_p50,lat_us_avg,lat_us_p99,bw_GBps,busbw_GBps,msg_rate"

#endif
