/*
 * The benchmarks. Methods follow perftest and the OSU micro-benchmarks so the
 * numbers compare with theirs:
 *   lat   ping-pong of one message; each round trip timed; one-way = RTT / 2;
 *         p50 / avg / p99 over the timed iterations.
 *   bw    rank 0 posts a window of sends, rank 1 a window of receives; after
 *         each window rank 1 answers with a 1-byte ack. bytes / time.
 *   bibw  both ranks do bw at once; bytes in both directions / time.
 *   rate  as bw, reporting messages / time.
 * Every rank pair (0-1, 2-3, ...) runs at once; rank 0 reports its pair.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "perf/bench.h"
#include "perf/stats.h"

#define TAG_DATA 1
#define TAG_ACK 2

static const char *const names[TERN_BENCH_TEST_COUNT] = {
    "lat",       "bw",      "bibw",      "rate",           "allreduce",
    "broadcast", "reduce",  "allgather", "reduce_scatter", "alltoall",
    "gather",    "scatter", "barrier",   "rpc",            "clock",
    "prof"};

const char *tern_bench_name(tern_bench_test_t test)
{
    return (unsigned)test < TERN_BENCH_TEST_COUNT ? names[test] : "?";
}

int tern_bench_is_coll(tern_bench_test_t test)
{
    return test >= TERN_BENCH_ALLREDUCE && test <= TERN_BENCH_BARRIER;
}

int tern_bench_parse(const char *name, tern_bench_test_t *test)
{
    for (unsigned i = 0; i < TERN_BENCH_TEST_COUNT; i++) {
        if (strcmp(name, names[i]) == 0) {
            *test = (tern_bench_test_t)i;
            return 0;
        }
    }
    return -1;
}

unsigned tern_bench_warmup(const tern_bench_opts_t *opts, unsigned iters)
{
    return opts->warmup_given ? opts->warmup : tern_bench_warmup_default(iters);
}

tern_status_t tern_bench_agree(tern_ctx_t *ctx, int ok, const char *what, size_t size)
{
    int32_t mine = ok ? 1 : 0, all = 0;
    tern_status_t st = tern_all_reduce(tern_group_world(ctx), &mine, &all, 1, TERN_DTYPE_I32,
                                       TERN_MIN, NULL);
    if (st != TERN_OK)
        return st;
    if (all)
        return TERN_OK;
    return tern__error(TERN_ERR_NO_MEMORY, "%s: buffers for %zu bytes: out of memory on %s", what,
                       size, mine ? "another rank" : "this rank");
}

/* Iterations by size: enough to be stable, few enough to finish quickly. */
static unsigned default_iters(tern_bench_test_t test, size_t size, unsigned window)
{
    uint64_t bytes = test == TERN_BENCH_LAT ? 64ull << 20 : 1ull << 30;
    uint64_t per = (uint64_t)(size ? size : 1) * (test == TERN_BENCH_LAT ? 1 : window);
    uint64_t n = bytes / per;
    unsigned max = test == TERN_BENCH_LAT ? 10000 : 1000;
    return n < 10 ? 10 : n > max ? max : (unsigned)n;
}

static tern_status_t lat(tern_ctx_t *ctx, int peer, int leader, uint8_t *buf, size_t size,
                         unsigned warmup, unsigned iters, uint64_t *samples)
{
    tern_status_t st;
    /* One clock read per round trip, right after this rank's send: a sample
     * runs from one send to the next, a whole round trip, and the read (40-50
     * ns on a VM, a tenth of a shared-memory round trip) overlaps the
     * message's flight instead of delaying the next send, as a read after
     * the receive did. ucx_perftest reads the TSC once per iteration too.
     * One round trip more than timed: the last sample ends at its send. */
    const unsigned n = warmup + iters + 1;
    uint64_t t0 = 0;
    for (unsigned i = 0; i < n; i++) {
        if (!leader && (st = tern_recv(ctx, buf, size, peer, TAG_DATA, NULL)) != TERN_OK)
            return st;
        if ((st = tern_send(ctx, buf, size, peer, TAG_DATA)) != TERN_OK)
            return st;
        uint64_t t1 = tern_clock_ns();
        if (i > warmup && samples != NULL)
            samples[i - warmup - 1] = t1 - t0;
        t0 = t1;
        if (leader && (st = tern_recv(ctx, buf, size, peer, TAG_DATA, NULL)) != TERN_OK)
            return st;
    }
    return TERN_OK;
}

/* One window: the sender posts window sends, the receiver window receives,
 * then the receiver acks. With both set, this rank does both (bibw). Every
 * message of the window uses the same buffer (OSU's method). */
static tern_status_t window_round(tern_ctx_t *ctx, int peer, int send, int recv, uint8_t *sbuf,
                                  uint8_t *rbuf, size_t size, unsigned window,
                                  tern_request_t **reqs)
{
    tern_status_t st = TERN_OK;
    unsigned n = 0;
    uint8_t ack = 0;
    for (unsigned w = 0; w < window && st == TERN_OK; w++) {
        if (recv)
            st = tern_irecv(ctx, rbuf, size, peer, TAG_DATA, &reqs[n++]);
        if (st == TERN_OK && send)
            st = tern_isend(ctx, sbuf, size, peer, TAG_DATA, &reqs[n++]);
        if (st != TERN_OK)
            n--;
    }
    for (unsigned i = 0; i < n; i++) {
        tern_status_t s2 = tern_request_wait(reqs[i], -1, NULL);
        if (st == TERN_OK)
            st = s2;
    }
    if (st != TERN_OK)
        return st;
    /* The ack closes the window, so the sender's clock covers delivery. */
    if (recv)
        st = tern_send(ctx, &ack, 1, peer, TAG_ACK);
    if (st == TERN_OK && send)
        st = tern_recv(ctx, &ack, 1, peer, TAG_ACK, NULL);
    return st;
}

tern_status_t tern_bench_run(tern_ctx_t *ctx, const tern_bench_opts_t *opts, size_t size,
                             tern_bench_result_t *res)
{
    unsigned rank = tern_ctx_rank(ctx), world = tern_ctx_world_size(ctx);
    unsigned window = opts->window ? opts->window : 64;
    unsigned iters = opts->iters ? opts->iters : default_iters(opts->test, size, window);
    unsigned warmup = tern_bench_warmup(opts, iters);
    int peer = (int)(rank ^ 1u);
    int active = (unsigned)peer < world;
    int leader = (rank & 1u) == 0;
    /* One buffer for every message of a window, as OSU's osu_bw and
     * ucx_perftest do, so the numbers compare with theirs. */
    size_t nbuf = 1;
    tern_status_t st = TERN_OK;
    uint8_t *sbuf = NULL, *rbuf = NULL;
    uint64_t *samples = NULL;
    tern_request_t **reqs = NULL;

    if (world < 2 || tern_bench_is_coll(opts->test) || opts->test >= TERN_BENCH_RPC)
        return TERN_ERR_INVALID_PARAM;
    memset(res, 0, sizeof(*res));
    res->size = size;
    res->iters = iters;
    if (active && size < SIZE_MAX / nbuf) {
        sbuf = malloc(size * nbuf + 1);
        rbuf = malloc(size * nbuf + 1);
        samples = calloc(iters, sizeof(*samples));
        reqs = calloc(2 * (size_t)window, sizeof(*reqs));
    }
    int ok = !active || (sbuf != NULL && rbuf != NULL && samples != NULL && reqs != NULL);
    if (ok && active) {
        memset(sbuf, (int)rank + 1, size * nbuf + 1);
        memset(rbuf, 0, size * nbuf + 1);
    }
    /* Every rank, the idle one of an odd world too, agrees before the clock. */
    st = tern_bench_agree(ctx, ok, tern_bench_name(opts->test), size);
    if (st != TERN_OK || !active)
        goto out;

    if (opts->test == TERN_BENCH_LAT) {
        if ((st = lat(ctx, peer, leader, sbuf, size, warmup, iters, samples)) != TERN_OK)
            goto out;
        double sum = 0;
        for (unsigned i = 0; i < iters; i++)
            sum += (double)samples[i];
        tern_bench_sort_u64(samples, iters);
        res->lat_us_avg = sum / iters / 2 / 1000.0;
        res->lat_us_p50 = (double)samples[tern_bench_pct_index(iters, 50)] / 2 / 1000.0;
        res->lat_us_p99 = (double)samples[tern_bench_pct_index(iters, 99)] / 2 / 1000.0;
        goto out;
    }
    int bi = opts->test == TERN_BENCH_BIBW;
    int send = leader || bi, recv = !leader || bi;
    for (unsigned i = 0; i < warmup && st == TERN_OK; i++)
        st = window_round(ctx, peer, send, recv, sbuf, rbuf, size, window, reqs);
    uint64_t t0 = tern_clock_ns();
    for (unsigned i = 0; i < iters && st == TERN_OK; i++)
        st = window_round(ctx, peer, send, recv, sbuf, rbuf, size, window, reqs);
    double secs = (double)(tern_clock_ns() - t0) / 1e9;
    if (st != TERN_OK)
        goto out;
    double msgs = (double)iters * window * (bi ? 2 : 1);
    res->msg_rate = msgs / secs;
    res->bw_GBps = msgs * (double)size / secs / 1e9;
out:
    free(sbuf);
    free(rbuf);
    free(samples);
    free(reqs);
    return st;
}
