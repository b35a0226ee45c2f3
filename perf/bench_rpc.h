/*
 * The RPC benchmarks behind `tern-perf rpc` (include/tern/rpc.h). Every rank
 * is a worker; rank 0 calls rank 1's worker and every other rank only serves:
 *
 *   rpc_lat   round trip of tern_rpc_sync() of "tern_perf_echo", which returns
 *             its argument (one u8 tensor of size bytes; no tensor at size 0):
 *             each call timed on its own, p50 / avg / p99 of the round trip in
 *             us (not halved, unlike lat); bw = 2 * size / avg (the payload
 *             goes both ways), none at size 0. The last call's answer is
 *             compared with what was sent.
 *   rpc_rate  tern_rpc_async() of "tern_perf_noop" (no arguments, returns
 *             nothing) with window calls in flight, the window kept full (a new
 *             call as soon as the oldest completes): completed calls per
 *             second over iters x window timed calls.
 */
#ifndef TERN_PERF_BENCH_RPC_H
#define TERN_PERF_BENCH_RPC_H

#include "perf/bench.h"

/* The functions the benchmarks call, registered by tern_bench_rpc_init(). */
#define TERN_BENCH_RPC_ECHO "tern_perf_echo"
#define TERN_BENCH_RPC_NOOP "tern_perf_noop"

/*
 * Every rank: register the functions and make this rank a worker
 * ("worker<rank>") whose window to another worker holds opts->window calls
 * (default 64), so the rate test is not capped by TERN_RPC_WINDOW. Collective.
 */
tern_status_t tern_bench_rpc_init(tern_ctx_t *ctx, const tern_bench_opts_t *opts);

/* Rank 0 only (the others serve meanwhile): one rpc_lat row at size. */
tern_status_t tern_bench_rpc_lat(tern_ctx_t *ctx, const tern_bench_opts_t *opts, size_t size,
                                 tern_bench_result_t *res);

/* Rank 0 only: the rpc_rate row (size 0; res->iters counts windows). */
tern_status_t tern_bench_rpc_rate(tern_ctx_t *ctx, const tern_bench_opts_t *opts,
                                  tern_bench_result_t *res);

/*
 * Every rank, after tern_bench_rpc_init() succeeded: rank 0 says it is done
 * (through the store); the others serve until it has, however long that
 * takes; then all shut RPC down gracefully. Call it on rank 0 even after a
 * failed test, or the others wait until the launcher stops them.
 */
tern_status_t tern_bench_rpc_fini(tern_ctx_t *ctx);

#endif
