/*
 * The profiler's benchmarks behind `tern-perf clock` and `tern-perf prof`
 * (include/tern/prof.h). Rank 0 measures; the other ranks serve until it says
 * it is done (through the store).
 *
 *   clock  rank 0 estimates the profiler clock offset of every other rank,
 *          reps times (tern_prof_clock_estimate, samples ping-pongs each): one
 *          tern_prof_clock_t per peer per repetition. The other ranks make no
 *          call: their progress threads answer the pings while their main
 *          threads wait in the store.
 *   prof   what the profiler costs, each figure with the profiler off and on
 *          in the same run, batches alternating (off, on, then on, off, ...):
 *
 *     clock_read         tern_prof_clock_ns(), timed in chunks of 1000 reads
 *     range_off          tern_prof_range_begin + tern_prof_range_end with no
 *                        session, timed in chunks of 1000 pairs
 *     range_on           the same pair with a session running; a new session
 *                        every 250,000 pairs (a thread's buffer holds 4M
 *                        events per session), each checked to hold them all
 *     rpc_sync_off       round trip of tern_rpc_sync of tern_perf_echo (one u8
 *                        tensor of size bytes, answered with itself; rank 1's
 *                        pool runs it), each call timed, no session
 *     rpc_sync_on        the same with a session running (rank 1 profiles the
 *                        handler and returns its events with the reply); one
 *                        session per batch, its first call left out
 *     rpc_sync_on_first  that first call of each session: it estimates rank
 *                        1's clock (TERN_PROF_CLOCK_SAMPLES ping-pongs) first
 *     prof_start         tern_prof_start, once per rpc session
 *     prof_stop          tern_prof_stop of an rpc session: a last clock
 *                        estimate and the results of its calls
 *
 *   The on rows carry the ratio on / off of their p50 and average.
 */
#ifndef TERN_PERF_BENCH_PROF_H
#define TERN_PERF_BENCH_PROF_H

#include <tern/prof.h>

#include "perf/bench.h"

/* The CSV headers of the two tests (their rows are not the other tests'). */
#define TERN_BENCH_CLOCK_CSV_HEADER                                                                \
    "test,transport,mem,ranks,peer,offset_ns,error_bound_ns,min_rtt_ns,samples"
#define TERN_BENCH_PROF_CSV_HEADER                                                                 \
    "test,transport,mem,ranks,size,iters,ns_p50,ns_avg,ns_p99,ratio_p50,ratio_avg"

typedef struct tern_bench_prof_opts {
    unsigned samples; /* clock: ping-pongs per estimate; 0: TERN_PROF_CLOCK_SAMPLES */
    unsigned reps;    /* clock: estimates of each peer [10] */
    unsigned iters;   /* prof: rpc calls per batch [2000] */
    unsigned warmup;  /* prof: untimed calls, once off and once on, with warmup_given
                         [iters / 10, at least 2] */
    int warmup_given;
    unsigned batches; /* prof: rpc batches of each kind [10] */
    uint64_t ranges;  /* prof: range pairs, off and on each [1,000,000] */
    size_t size;      /* prof: the echo's tensor in bytes [8] */
} tern_bench_prof_opts_t;

/* The rows tern_bench_prof fills, in this order. */
enum {
    TERN_BENCH_PROF_CLOCK_READ,
    TERN_BENCH_PROF_RANGE_OFF,
    TERN_BENCH_PROF_RANGE_ON,
    TERN_BENCH_PROF_RPC_OFF,
    TERN_BENCH_PROF_RPC_ON,
    TERN_BENCH_PROF_RPC_ON_FIRST,
    TERN_BENCH_PROF_START,
    TERN_BENCH_PROF_STOP,
    TERN_BENCH_PROF_ROWS
};

typedef struct tern_bench_prof_row {
    const char *test;              /* "range_on", ... */
    size_t size;                   /* the rpc's payload; 0 for the others */
    uint64_t iters;                /* operations measured */
    double ns_p50, ns_avg, ns_p99; /* per operation (chunked rows: p50, p99 of the chunks' means) */
    double ratio_p50, ratio_avg;   /* on / off; 0 where it does not apply */
} tern_bench_prof_row_t;

/*
 * Every rank (collective): clock. Rank 0 fills out[rep * (world - 1) + peer - 1]
 * (reps * (world - 1) entries; NULL: it measures nothing, only releases the
 * others); the others serve until rank 0 is done, and return TERN_OK. Needs 2
 * or more ranks.
 */
tern_status_t tern_bench_clock(tern_ctx_t *ctx, const tern_bench_prof_opts_t *opts,
                               tern_prof_clock_t *out);

/*
 * Every rank (collective): prof. Makes every rank an RPC worker
 * (tern_bench_rpc_init), rank 0 measures and fills rows[TERN_BENCH_PROF_ROWS],
 * rank 1 serves its calls, and every rank shuts RPC down before returning.
 * Needs 2 or more ranks and no session running.
 */
tern_status_t tern_bench_prof(tern_ctx_t *ctx, const tern_bench_prof_opts_t *opts,
                              tern_bench_prof_row_t *rows);

#endif
