/*
 * The collective benchmarks behind tern-perf (allreduce, broadcast, reduce,
 * allgather, reduce_scatter, alltoall, gather, scatter, barrier), measured and
 * reported as nccl-tests does (its doc/PERFORMANCE.md), so that the numbers
 * line up with NCCL's, MPI's (perf/mpi_coll.c) and each other's:
 *
 *   size     bytes of the operation's buffer: count * element size for
 *            all_reduce, broadcast and reduce; the gathered output for
 *            all_gather; the input for reduce_scatter; what each rank sends
 *            in all for alltoall; the root's whole buffer for gather and
 *            scatter. A requested size is rounded down to a multiple of the
 *            element size, times the number of ranks where the buffer holds
 *            one piece per rank (allgather, reduce_scatter, alltoall, gather,
 *            scatter). barrier has size 0.
 *   time     of one blocking call: p50 and p99 of rank 0's per-call samples,
 *            and avg = the largest of the ranks' averages (the slowest rank
 *            sets the pace of a collective).
 *   algbw    size / avg time (10^9 bytes/s): bw_GBps.
 *   busbw    algbw * 2(n-1)/n for all_reduce; * (n-1)/n for reduce_scatter,
 *            all_gather, alltoall, gather and scatter; * 1 for broadcast and
 *            reduce. It is the bandwidth each rank's link would need with an
 *            optimal algorithm, so it compares across rank counts.
 */
#ifndef TERN_PERF_BENCH_COLL_H
#define TERN_PERF_BENCH_COLL_H

#include "perf/bench.h"

/*
 * Run one collective test at one requested size over tern_group_world(ctx):
 * a barrier, opts->warmup untimed calls, then opts->iters timed blocking calls
 * (0: chosen by size). Every rank of ctx calls it with the same arguments; the
 * result (res->size is the rounded size) is the same on every rank except
 * lat_us_p50/p99, which are rank 0's. With opts->check, inputs hold small
 * integers that every reduction order gives exactly, the outputs are poisoned
 * before the last timed call and compared with a locally computed reference
 * after it: res->check_failures counts the ranks that differ (a status of
 * TERN_OK with failures is a wrong result, not a failed call).
 */
tern_status_t tern_bench_coll_run(tern_ctx_t *ctx, const tern_bench_opts_t *opts, size_t size,
                                  tern_bench_result_t *res);

/* nccl-tests' bus bandwidth factor for test over n ranks (0 for barrier). */
double tern_bench_busbw_factor(tern_bench_test_t test, unsigned n);

/* The bytes tern_bench_coll_run() measures when asked for size over n ranks
 * with elements of elsize bytes; *count gets the count passed to the call. */
size_t tern_bench_coll_size(tern_bench_test_t test, size_t size, size_t elsize, unsigned n,
                            size_t *count);

#endif
