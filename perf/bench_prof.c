/*
 * The profiler's benchmarks (perf/bench_prof.h has what each measures). Rank 0
 * times everything on tern_clock_ns(), which no TERN_CLOCK_SKEW_NS moves; the
 * profiler's clock is only what clock estimates. Off and on batches alternate
 * (off, on, then on, off, ...) so that a machine that gets busier or quieter
 * during the run moves both sides alike.
 */
#include <stdlib.h>
#include <string.h>

#include <tern/prof.h>

#include "core/error.h"
#include "perf/bench_prof.h"
#include "perf/bench_rpc.h"
#include "perf/stats.h"

#define CLOCK_DONE_KEY "tern-perf/clock/done"

/* Timed chunks of the sub-100 ns operations: one clock read per 1000. */
#define CHUNK 1000u
/* Range pairs per session: 250 chunks, far below a thread's 4M events. */
#define RANGE_SESSION_CHUNKS 250u
#define RANGE_NAME "tern_perf_range"

/* Rank 0 says it is done; the others wait for that, however long it takes. */
static tern_status_t serve_until_done(tern_ctx_t *ctx, const char *key)
{
    tern_store_t *store = tern_ctx_store(ctx);
    tern_status_t st;
    if (tern_ctx_rank(ctx) == 0)
        return tern_store_set(store, key, "1", 1);
    const char *keys[1] = {key};
    while ((st = tern_store_wait(store, keys, 1, 1000000000ll)) == TERN_ERR_TIMEOUT)
        ;
    return st;
}

/* ---- clock ---- */

tern_status_t tern_bench_clock(tern_ctx_t *ctx, const tern_bench_prof_opts_t *o,
                               tern_prof_clock_t *out)
{
    unsigned world = tern_ctx_world_size(ctx);
    unsigned reps = o->reps ? o->reps : 10;
    tern_status_t st = TERN_OK, st2;
    if (world < 2)
        return tern__error(TERN_ERR_INVALID_PARAM, "clock: needs 2 or more ranks");
    /* The others answer from their progress threads, a first contact too,
     * while their main threads wait in the store below. */
    for (unsigned r = 0; tern_ctx_rank(ctx) == 0 && out != NULL && r < reps && st == TERN_OK; r++)
        for (unsigned p = 1; p < world && st == TERN_OK; p++)
            st = tern_prof_clock_estimate(ctx, (int)p, o->samples,
                                          &out[(size_t)r * (world - 1) + p - 1]);
    /* Said even after a failure, or the others wait until the launcher stops them. */
    st2 = serve_until_done(ctx, CLOCK_DONE_KEY);
    return st != TERN_OK ? st : st2;
}

/* ---- prof ---- */

/* p50, average and p99 of n samples of per operations each (sorts v). */
static void fill(tern_bench_prof_row_t *row, const char *test, size_t size, uint64_t *v, size_t n,
                 unsigned per)
{
    double sum = 0;
    memset(row, 0, sizeof(*row));
    row->test = test;
    row->size = size;
    row->iters = (uint64_t)n * per;
    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    tern_bench_sort_u64(v, n);
    row->ns_avg = sum / (double)n / per;
    row->ns_p50 = (double)v[tern_bench_pct_index(n, 50)] / per;
    row->ns_p99 = (double)v[tern_bench_pct_index(n, 99)] / per;
}

static void ratio(tern_bench_prof_row_t *on, const tern_bench_prof_row_t *off)
{
    on->ratio_p50 = off->ns_p50 > 0 ? on->ns_p50 / off->ns_p50 : 0;
    on->ratio_avg = off->ns_avg > 0 ? on->ns_avg / off->ns_avg : 0;
}

/* Events of kind in the last session. */
static size_t count_kind(unsigned kind)
{
    const tern_prof_event_t *ev;
    size_t n = 0, c = 0;
    if (tern_prof_events(&ev, &n) != TERN_OK)
        return 0;
    for (size_t i = 0; i < n; i++)
        c += ev[i].kind == kind;
    return c;
}

static tern_status_t clock_reads(uint64_t *v, size_t chunks)
{
    for (size_t c = 0; c < chunks; c++) {
        uint64_t t0 = tern_clock_ns();
        for (unsigned j = 0; j < CHUNK; j++) {
            volatile int64_t t = tern_prof_clock_ns();
            (void)t;
        }
        v[c] = tern_clock_ns() - t0;
    }
    return TERN_OK;
}

/* chunks chunks of range pairs each way, sessions of RANGE_SESSION_CHUNKS. */
static tern_status_t ranges(tern_ctx_t *ctx, uint64_t *off, uint64_t *on, size_t chunks)
{
    size_t n[2] = {0, 0};
    uint64_t *dst[2] = {off, on};
    tern_status_t st;
    for (unsigned round = 0; n[0] < chunks || n[1] < chunks; round++) {
        for (unsigned k = 0; k < 2; k++) {
            unsigned prof = (round + k) % 2; /* off, on; on, off; ... */
            size_t m = chunks - n[prof];
            if (m > RANGE_SESSION_CHUNKS)
                m = RANGE_SESSION_CHUNKS;
            if (m == 0)
                continue;
            if (prof && (st = tern_prof_start(ctx, NULL)) != TERN_OK)
                return st;
            for (size_t c = 0; c < m; c++) {
                uint64_t t0 = tern_clock_ns();
                for (unsigned j = 0; j < CHUNK; j++)
                    tern_prof_range_end(tern_prof_range_begin(RANGE_NAME));
                dst[prof][n[prof]++] = tern_clock_ns() - t0;
            }
            if (!prof)
                continue;
            if ((st = tern_prof_stop()) != TERN_OK)
                return st;
            size_t got = count_kind(TERN_PROF_KIND_RANGE);
            if (got != m * CHUNK)
                return tern__error(TERN_ERR_INTERNAL,
                                   "prof: a session recorded %zu of its %zu ranges", got,
                                   m * CHUNK);
        }
    }
    return TERN_OK;
}

typedef struct rpc_bench {
    tern_ctx_t *ctx;
    char to[TERN_RPC_NAME_MAX + 1];
    tern_rpc_args_t args;
    const uint8_t *buf;
    size_t size;
} rpc_bench_t;

/* One timed echo; check: the answer must be what was sent. */
static tern_status_t echo_call(rpc_bench_t *b, uint64_t *dt, int check)
{
    tern_future_t *f;
    uint64_t t0 = tern_clock_ns();
    tern_status_t st =
        tern_rpc_sync(b->ctx, b->to, TERN_BENCH_RPC_ECHO, &b->args, TERN_RPC_TIMEOUT_DEFAULT, &f);
    *dt = tern_clock_ns() - t0;
    if (st != TERN_OK)
        return st;
    if (check) {
        const tern_rpc_value_t *v = tern_future_value(f);
        size_t nbytes = 0;
        int ok = v != NULL && v->ntensors == (b->size > 0 ? 1u : 0u);
        if (ok && b->size > 0)
            ok = tern_tensor_nbytes(&v->tensors[0], &nbytes) == TERN_OK && nbytes == b->size &&
                 memcmp(v->tensors[0].data, b->buf, b->size) == 0;
        if (!ok)
            st = tern__error(TERN_ERR_INTERNAL,
                             "prof: %s on %s answered something other than "
                             "its %zu-byte argument",
                             TERN_BENCH_RPC_ECHO, b->to, b->size);
    }
    tern_future_free(f);
    return st;
}

/* Samples of one rpc measurement. */
typedef struct rpc_samples {
    uint64_t *off, *on, *first, *start, *stop;
    size_t noff, non, nsessions;
} rpc_samples_t;

/*
 * One batch of iters calls, profiled or not (dst: where each call's time
 * goes, NULL: nowhere). A profiled batch is one session: its start, its first
 * call and its stop are timed on their own; the session must hold every call.
 */
static tern_status_t rpc_batch(rpc_bench_t *b, int prof, unsigned iters, rpc_samples_t *s,
                               uint64_t *dst)
{
    tern_status_t st;
    uint64_t t0, dt, first;
    if (prof) {
        t0 = tern_clock_ns();
        if ((st = tern_prof_start(b->ctx, NULL)) != TERN_OK)
            return st;
        uint64_t started = tern_clock_ns() - t0;
        if ((st = echo_call(b, &first, 0)) != TERN_OK) {
            tern_prof_stop();
            return st;
        }
        if (dst != NULL) {
            s->start[s->nsessions] = started;
            s->first[s->nsessions] = first;
        }
    }
    for (unsigned i = 0; i < iters; i++) {
        if ((st = echo_call(b, &dt, i + 1 == iters)) != TERN_OK) {
            if (prof)
                tern_prof_stop();
            return st;
        }
        if (dst != NULL)
            dst[i] = dt;
    }
    if (!prof)
        return TERN_OK;
    t0 = tern_clock_ns();
    if ((st = tern_prof_stop()) != TERN_OK)
        return st;
    if (dst != NULL)
        s->stop[s->nsessions++] = tern_clock_ns() - t0;
    size_t got = count_kind(TERN_PROF_KIND_RPC), remote = count_kind(TERN_PROF_KIND_HANDLER);
    if (got != iters + 1u || remote != iters + 1u)
        return tern__error(TERN_ERR_INTERNAL,
                           "prof: a session of %u calls recorded %zu calls and %zu handlers",
                           iters + 1, got, remote);
    return TERN_OK;
}

static tern_status_t rpc_rounds(rpc_bench_t *b, const tern_bench_prof_opts_t *o, unsigned iters,
                                unsigned batches, rpc_samples_t *s)
{
    tern_status_t st;
    unsigned warmup = o->warmup_given ? o->warmup : tern_bench_warmup_default(iters);
    /* Untimed: the first calls, and the first session (allocations, endpoints). */
    if ((st = rpc_batch(b, 0, warmup, s, NULL)) != TERN_OK ||
        (st = rpc_batch(b, 1, warmup, s, NULL)) != TERN_OK)
        return st;
    for (unsigned round = 0; round < batches; round++) {
        for (unsigned k = 0; k < 2; k++) {
            int prof = (int)((round + k) % 2); /* off, on; on, off; ... */
            uint64_t *dst = prof ? s->on + s->non : s->off + s->noff;
            if ((st = rpc_batch(b, prof, iters, s, dst)) != TERN_OK)
                return st;
            *(prof ? &s->non : &s->noff) += iters;
        }
    }
    return TERN_OK;
}

tern_status_t tern_bench_prof(tern_ctx_t *ctx, const tern_bench_prof_opts_t *o,
                              tern_bench_prof_row_t *rows)
{
    unsigned iters = o->iters ? o->iters : 2000, batches = o->batches ? o->batches : 10;
    uint64_t pairs = o->ranges ? o->ranges : 1000000;
    size_t chunks = (size_t)((pairs + CHUNK - 1) / CHUNK), clock_chunks = 1000;
    tern_bench_opts_t ro = {.test = TERN_BENCH_RPC};
    rpc_bench_t b = {.ctx = ctx, .size = o->size};
    rpc_samples_t s = {0};
    uint64_t *off = NULL, *on = NULL, *reads = NULL;
    uint8_t *buf = NULL;
    tern_tensor_t t;
    int64_t shape[1] = {(int64_t)o->size};
    tern_status_t st, st2;

    memset(rows, 0, TERN_BENCH_PROF_ROWS * sizeof(*rows));
    if (tern_ctx_world_size(ctx) < 2)
        return tern__error(TERN_ERR_INVALID_PARAM, "prof: needs 2 or more ranks");
    if (tern_prof_enabled())
        return tern__error(TERN_ERR_NO_RESOURCE, "prof: a profiler session is already running");
    /* Every rank a worker; from here every rank reaches tern_bench_rpc_fini. */
    if ((st = tern_bench_rpc_init(ctx, &ro)) != TERN_OK)
        return st;
    if (tern_ctx_rank(ctx) != 0)
        goto fini;

    off = calloc(chunks, sizeof(*off));
    on = calloc(chunks, sizeof(*on));
    reads = calloc(clock_chunks, sizeof(*reads));
    buf = malloc(o->size ? o->size : 1);
    s.off = calloc((size_t)iters * batches, sizeof(*s.off));
    s.on = calloc((size_t)iters * batches, sizeof(*s.on));
    s.first = calloc(batches, sizeof(*s.first));
    s.start = calloc(batches, sizeof(*s.start));
    s.stop = calloc(batches, sizeof(*s.stop));
    if (off == NULL || on == NULL || reads == NULL || buf == NULL || s.off == NULL ||
        s.on == NULL || s.first == NULL || s.start == NULL || s.stop == NULL) {
        st = tern__error(TERN_ERR_NO_MEMORY, "prof: sample buffers");
        goto fini;
    }

    /* Local costs first: rank 1 idles meanwhile. */
    if ((st = clock_reads(reads, clock_chunks)) != TERN_OK ||
        (st = ranges(ctx, off, on, chunks)) != TERN_OK)
        goto fini;
    fill(&rows[TERN_BENCH_PROF_CLOCK_READ], "clock_read", 0, reads, clock_chunks, CHUNK);
    fill(&rows[TERN_BENCH_PROF_RANGE_OFF], "range_off", 0, off, chunks, CHUNK);
    fill(&rows[TERN_BENCH_PROF_RANGE_ON], "range_on", 0, on, chunks, CHUNK);
    ratio(&rows[TERN_BENCH_PROF_RANGE_ON], &rows[TERN_BENCH_PROF_RANGE_OFF]);

    for (size_t i = 0; i < o->size; i++) /* touched before the clock starts */
        buf[i] = (uint8_t)(i * 31 + 7);
    if ((st = tern_tensor_init(&t, buf, TERN_DTYPE_U8, 1, shape, tern_device_cpu())) != TERN_OK ||
        (st = tern_rpc_worker_name(ctx, 1, b.to, sizeof(b.to))) != TERN_OK)
        goto fini;
    b.buf = buf;
    b.args = (tern_rpc_args_t){.tensors = &t, .ntensors = o->size > 0};
    if ((st = rpc_rounds(&b, o, iters, batches, &s)) != TERN_OK)
        goto fini;
    fill(&rows[TERN_BENCH_PROF_RPC_OFF], "rpc_sync_off", o->size, s.off, s.noff, 1);
    fill(&rows[TERN_BENCH_PROF_RPC_ON], "rpc_sync_on", o->size, s.on, s.non, 1);
    ratio(&rows[TERN_BENCH_PROF_RPC_ON], &rows[TERN_BENCH_PROF_RPC_OFF]);
    fill(&rows[TERN_BENCH_PROF_RPC_ON_FIRST], "rpc_sync_on_first", o->size, s.first, s.nsessions,
         1);
    fill(&rows[TERN_BENCH_PROF_START], "prof_start", 0, s.start, s.nsessions, 1);
    fill(&rows[TERN_BENCH_PROF_STOP], "prof_stop", 0, s.stop, s.nsessions, 1);
fini:
    /* Rank 0 says it is done (failed or not); the others serve until then. */
    st2 = tern_bench_rpc_fini(ctx);
    free(off);
    free(on);
    free(reads);
    free(buf);
    free(s.off);
    free(s.on);
    free(s.first);
    free(s.start);
    free(s.stop);
    return st != TERN_OK ? st : st2;
}
