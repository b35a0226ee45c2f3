/*
 * The RPC benchmarks (perf/bench_rpc.h has what each measures). Rank 0 times
 * its own calls on its own clock; rank 1 runs the handlers on its pool, as any
 * RPC worker does; the other ranks are workers that nobody calls. Rank 0 tells
 * the others it is done through the store, so that a long run does not depend
 * on the graceful shutdown's barrier timeout (TERN_TIMEOUT).
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "perf/bench_rpc.h"
#include "perf/stats.h"

#define DONE_KEY "tern-perf/rpc/done"

/* rpc_lat as bench.c's lat: 64 MiB of payload per size, 10 to 10000 calls. */
static unsigned lat_iters(size_t size)
{
    uint64_t n = (64ull << 20) / (size ? size : 1);
    return n < 10 ? 10 : n > 10000 ? 10000 : (unsigned)n;
}

/* The echo: every argument tensor back, a pulled one without a copy
 * (tern_rpc_call_return_arg), as an application passing tensors on would. */
static tern_status_t echo(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *a = tern_rpc_call_args(call);
    for (size_t i = 0; i < a->ntensors; i++) {
        tern_status_t st = tern_rpc_call_return_arg(call, i);
        if (st != TERN_OK)
            return st;
    }
    return TERN_OK;
}

static tern_status_t noop(tern_rpc_call_t *call)
{
    (void)call;
    return TERN_OK;
}

/* The worker rank 0 calls: rank 1's name. */
static tern_status_t callee(tern_ctx_t *ctx, char *to, size_t cap)
{
    if (tern_ctx_rank(ctx) != 0 || tern_ctx_world_size(ctx) < 2)
        return tern__error(TERN_ERR_INVALID_PARAM, "rpc: rank 0 of 2 or more calls, the others "
                                                   "serve");
    return tern_rpc_worker_name(ctx, 1, to, cap);
}

tern_status_t tern_bench_rpc_init(tern_ctx_t *ctx, const tern_bench_opts_t *o)
{
    tern_status_t st;
    if ((st = tern_rpc_register(TERN_BENCH_RPC_ECHO, echo)) != TERN_OK ||
        (st = tern_rpc_register(TERN_BENCH_RPC_NOOP, noop)) != TERN_OK)
        return st;
    tern_rpc_options_t opt = {.field_mask = TERN_RPC_OPT_WINDOW,
                              .window = o->window ? o->window : 64};
    return tern_rpc_init(ctx, NULL, &opt);
}

tern_status_t tern_bench_rpc_lat(tern_ctx_t *ctx, const tern_bench_opts_t *o, size_t size,
                                 tern_bench_result_t *res)
{
    char to[TERN_RPC_NAME_MAX + 1];
    tern_status_t st;
    memset(res, 0, sizeof(*res));
    if ((st = callee(ctx, to, sizeof(to))) != TERN_OK)
        return st;
    unsigned iters = o->iters ? o->iters : lat_iters(size);
    unsigned warmup = tern_bench_warmup(o, iters);
    res->size = size;
    res->iters = iters;

    uint8_t *buf = malloc(size ? size : 1);
    uint64_t *samples = calloc(iters, sizeof(*samples));
    tern_tensor_t t;
    int64_t shape[1] = {(int64_t)size};
    if (buf == NULL || samples == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "rpc_lat: buffers for %zu bytes", size);
        goto out;
    }
    for (size_t i = 0; i < size; i++) /* touched before the clock starts */
        buf[i] = (uint8_t)(i * 31 + 7);
    if ((st = tern_tensor_init(&t, buf, TERN_DTYPE_U8, 1, shape, tern_device_cpu())) != TERN_OK)
        goto out;
    tern_rpc_args_t args = {.tensors = &t, .ntensors = size > 0};

    for (unsigned i = 0; i < warmup + iters; i++) {
        tern_future_t *f;
        uint64_t t0 = tern_clock_ns();
        if ((st = tern_rpc_sync(ctx, to, TERN_BENCH_RPC_ECHO, &args, TERN_RPC_TIMEOUT_DEFAULT,
                                &f)) != TERN_OK)
            goto out;
        uint64_t dt = tern_clock_ns() - t0;
        if (i >= warmup)
            samples[i - warmup] = dt;
        if (i + 1 == warmup + iters) {
            /* The last answer must be what was sent. */
            const tern_rpc_value_t *v = tern_future_value(f);
            size_t nbytes = 0;
            int ok = v != NULL && v->ntensors == (size > 0 ? 1u : 0u);
            if (ok && size > 0)
                ok = v->tensors[0].dtype == TERN_DTYPE_U8 &&
                     tern_tensor_nbytes(&v->tensors[0], &nbytes) == TERN_OK && nbytes == size &&
                     memcmp(v->tensors[0].data, buf, size) == 0;
            if (!ok)
                st = tern__error(TERN_ERR_INTERNAL,
                                 "rpc_lat: %s on %s answered something other "
                                 "than its %zu-byte argument",
                                 TERN_BENCH_RPC_ECHO, to, size);
        }
        tern_future_free(f);
        if (st != TERN_OK)
            goto out;
    }

    double sum = 0;
    for (unsigned i = 0; i < iters; i++)
        sum += (double)samples[i];
    tern_bench_sort_u64(samples, iters);
    res->lat_us_avg = sum / iters / 1000.0;
    res->lat_us_p50 = (double)samples[tern_bench_pct_index(iters, 50)] / 1000.0;
    res->lat_us_p99 = (double)samples[tern_bench_pct_index(iters, 99)] / 1000.0;
    if (size > 0 && res->lat_us_avg > 0)
        res->bw_GBps = 2.0 * (double)size / (res->lat_us_avg * 1e3);
out:
    free(buf);
    free(samples);
    return st;
}

/*
 * calls no-op calls with up to window in flight (futs[window], all NULL on
 * entry and on return): each slot's call is waited for, in the order issued,
 * before the slot takes the next one, so the window stays full while calls
 * remain.
 */
static tern_status_t run_window(tern_ctx_t *ctx, const char *to, tern_future_t **futs,
                                unsigned window, uint64_t calls)
{
    tern_status_t st = TERN_OK;
    for (uint64_t i = 0; i < calls + window && st == TERN_OK; i++) {
        tern_future_t **slot = &futs[i % window];
        if (*slot != NULL) {
            /* The oldest call in flight (later ones may be done already). */
            st = tern_future_wait(*slot, -1);
            tern_future_free(*slot);
            *slot = NULL;
        }
        if (st == TERN_OK && i < calls)
            st = tern_rpc_async(ctx, to, TERN_BENCH_RPC_NOOP, NULL, TERN_RPC_TIMEOUT_DEFAULT, slot);
    }
    for (unsigned w = 0; w < window; w++) { /* after an error: drop the rest */
        tern_future_free(futs[w]);
        futs[w] = NULL;
    }
    return st;
}

tern_status_t tern_bench_rpc_rate(tern_ctx_t *ctx, const tern_bench_opts_t *o,
                                  tern_bench_result_t *res)
{
    char to[TERN_RPC_NAME_MAX + 1];
    tern_status_t st;
    memset(res, 0, sizeof(*res));
    if ((st = callee(ctx, to, sizeof(to))) != TERN_OK)
        return st;
    unsigned window = o->window ? o->window : 64;
    /* 16384 calls by default at the usual window of 64: a second or so. */
    unsigned iters = o->iters ? o->iters : (16384 + window - 1) / window;
    unsigned warmup = tern_bench_warmup(o, iters);
    res->size = 0;
    res->iters = iters;
    tern_future_t **futs = calloc(window, sizeof(*futs));
    if (futs == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "rpc_rate: a window of %u", window);
    if ((st = run_window(ctx, to, futs, window, (uint64_t)warmup * window)) == TERN_OK) {
        uint64_t calls = (uint64_t)iters * window, t0 = tern_clock_ns();
        st = run_window(ctx, to, futs, window, calls);
        double secs = (double)(tern_clock_ns() - t0) / 1e9;
        if (st == TERN_OK && secs > 0)
            res->msg_rate = (double)calls / secs;
    }
    free(futs);
    return st;
}

tern_status_t tern_bench_rpc_fini(tern_ctx_t *ctx)
{
    tern_store_t *store = tern_ctx_store(ctx);
    tern_status_t st = TERN_OK;
    if (tern_ctx_rank(ctx) == 0) {
        st = tern_store_set(store, DONE_KEY, "1", 1);
    } else {
        /* Serve (the handlers run on the pool) until rank 0 is done. */
        const char *keys[1] = {DONE_KEY};
        while ((st = tern_store_wait(store, keys, 1, 1000000000ll)) == TERN_ERR_TIMEOUT)
            ;
    }
    tern_status_t st2 = tern_rpc_shutdown(ctx, 1);
    return st != TERN_OK ? st : st2;
}
