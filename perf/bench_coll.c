/*
 * The collective benchmarks (perf/bench_coll.h has the definitions of size,
 * time, algbw and busbw). Every rank times each blocking call on its own
 * clock; after the timed loop, outside the measurement, an all_reduce(MAX)
 * of the samples makes each iteration's time its slowest rank's, and p50,
 * avg and p99 all come from those (rank 0's own samples said little: in a
 * reduce to another root it is a leaf that returns once it has sent).
 *
 * --check: rank r's input element i holds a small integer pval(r, i), chosen
 * per dtype and op so that every partial result is exact in the dtype (sums
 * stay within 256, bf16's last exact integer: beyond 256 ranks only some
 * ranks put a 1 into each element, f16 likewise beyond 2048; products are
 * powers of two). Any
 * reduction order then gives the same bits, so a reference computed here in
 * plain C must match the collective's output bit for bit. The values come
 * from a hash of (rank, index), not a short period, so a block delivered to
 * the wrong rank or the wrong place does not match by coincidence.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "perf/bench_coll.h"
#include "perf/stats.h"
#include "tensor/half.h"
#include "tensor/reduce.h"

/* Outputs are filled with this byte before the checked call, so a call that
 * leaves them alone fails the check (0xA5 is no value the inputs hold, in any
 * dtype: not 0/1 for bool, not a small integer for the others). */
#define POISON 0xA5

/* As bench.c's latency iterations: 64 MiB of traffic per size (--traffic),
 * 10 to 10000. */
static unsigned default_iters(size_t size, size_t traffic)
{
    uint64_t n = (uint64_t)(traffic ? traffic : 64u << 20) / (size ? size : 1);
    return n < 10 ? 10 : n > 10000 ? 10000 : (unsigned)n;
}

/* Buffers that hold one piece per rank: their size is a multiple of n pieces. */
static int per_rank_pieces(tern_bench_test_t t)
{
    return t == TERN_BENCH_ALLGATHER || t == TERN_BENCH_REDUCE_SCATTER ||
           t == TERN_BENCH_ALLTOALL || t == TERN_BENCH_GATHER || t == TERN_BENCH_SCATTER;
}

static int is_rooted(tern_bench_test_t t)
{
    return t == TERN_BENCH_BROADCAST || t == TERN_BENCH_REDUCE || t == TERN_BENCH_GATHER ||
           t == TERN_BENCH_SCATTER;
}

static int is_reduction(tern_bench_test_t t)
{
    return t == TERN_BENCH_ALLREDUCE || t == TERN_BENCH_REDUCE || t == TERN_BENCH_REDUCE_SCATTER;
}

double tern_bench_busbw_factor(tern_bench_test_t t, unsigned n)
{
    double f = n ? (double)(n - 1) / n : 0;
    switch (t) {
    case TERN_BENCH_ALLREDUCE:
        return 2 * f;
    case TERN_BENCH_BROADCAST:
    case TERN_BENCH_REDUCE:
        return 1;
    case TERN_BENCH_ALLGATHER:
    case TERN_BENCH_REDUCE_SCATTER:
    case TERN_BENCH_ALLTOALL:
    case TERN_BENCH_GATHER:
    case TERN_BENCH_SCATTER:
        return f;
    default:
        return 0;
    }
}

size_t tern_bench_coll_size(tern_bench_test_t t, size_t size, size_t elsize, unsigned n,
                            size_t *count)
{
    size_t unit = elsize * (per_rank_pieces(t) ? n : 1);
    *count = t == TERN_BENCH_BARRIER || unit == 0 ? 0 : size / unit;
    return *count * unit;
}

/* ---- the values --check puts in and expects back ---- */

typedef struct pattern {
    tern_dtype_t dtype;
    size_t es;
    tern_reduce_op_t op;
    unsigned n;
    int is_float, is_signed, is_bool;
    int prod;     /* the inputs of a product: 1 and 2 */
    int64_t vmax; /* otherwise 0..vmax, shifted to be centred on 0 where signed */
    int64_t shift;
    unsigned stride; /* a sum's element i takes values from ranks r = -i mod stride only */
} pattern_t;

static void pattern_init(pattern_t *p, tern_dtype_t dtype, tern_reduce_op_t op, int reduction,
                         unsigned n)
{
    memset(p, 0, sizeof(*p));
    p->dtype = dtype;
    p->es = tern_dtype_size(dtype);
    p->op = op;
    p->n = n;
    p->is_float = dtype == TERN_DTYPE_F16 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F32 ||
                  dtype == TERN_DTYPE_F64;
    p->is_bool = dtype == TERN_DTYPE_BOOL;
    p->is_signed = p->is_float || dtype == TERN_DTYPE_I8 || dtype == TERN_DTYPE_I16 ||
                   dtype == TERN_DTYPE_I32 || dtype == TERN_DTYPE_I64;
    p->prod = reduction && op == TERN_PROD;
    /* n values of magnitude vmax sum to at most 256, exact even in bf16. */
    p->vmax = 256 / (n ? n : 1);
    if (p->vmax > 6)
        p->vmax = 6;
    if (p->vmax < 1)
        p->vmax = 1;
    p->shift = p->is_signed ? p->vmax / 2 : 0;
    /* More ranks than the dtype has exact integers: n terms of 0 or 1 could
     * sum past them, and a sum rounded on the way would depend on the order.
     * Each element then takes nonzero values from at most exact ranks, a
     * different set for each element (so every rank's input still counts). */
    p->stride = 1;
    const unsigned exact = dtype == TERN_DTYPE_BF16 ? 256 : dtype == TERN_DTYPE_F16 ? 2048 : 0;
    if (reduction && (op == TERN_SUM || op == TERN_AVG) && exact > 0 && n > exact)
        p->stride = (n + exact - 1) / exact;
}

/* splitmix64's finalizer: every bit of (rank, index) reaches every bit out. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int64_t pval(const pattern_t *p, unsigned r, size_t i)
{
    uint64_t h = mix(((uint64_t)r << 40) ^ (uint64_t)i ^ 0x9e3779b97f4a7c15ull);
    if (p->is_bool)
        return h % 5 != 0;
    if (p->prod) /* powers of two: exact products in every float type */
        return h % 5 == 0 ? 2 : 1;
    if (p->stride > 1 && (r + i) % p->stride != 0)
        return 0;
    return (int64_t)(h % (uint64_t)(p->vmax + 1)) - p->shift;
}

/* Store v into one element. Floats: v is exact in the dtype or is a float
 * already rounded as the kernels round (AVG); integers wrap as the kernels
 * wrap (modulo 2^bits). */
static void put(const pattern_t *p, void *dst, double fv, uint64_t iv)
{
    switch (p->dtype) {
    case TERN_DTYPE_F64:
        memcpy(dst, &fv, 8);
        return;
    case TERN_DTYPE_F32: {
        float f = (float)fv;
        memcpy(dst, &f, 4);
        return;
    }
    case TERN_DTYPE_F16: {
        uint16_t h = f32_to_f16((float)fv);
        memcpy(dst, &h, 2);
        return;
    }
    case TERN_DTYPE_BF16: {
        uint16_t h = f32_to_bf16((float)fv);
        memcpy(dst, &h, 2);
        return;
    }
    case TERN_DTYPE_BOOL:
        *(uint8_t *)dst = iv != 0;
        return;
    default:
        break;
    }
    switch (p->es) {
    case 1: {
        uint8_t v = (uint8_t)iv;
        memcpy(dst, &v, 1);
        return;
    }
    case 2: {
        uint16_t v = (uint16_t)iv;
        memcpy(dst, &v, 2);
        return;
    }
    case 4: {
        uint32_t v = (uint32_t)iv;
        memcpy(dst, &v, 4);
        return;
    }
    default:
        memcpy(dst, &iv, 8);
        return;
    }
}

static void put_val(const pattern_t *p, void *dst, unsigned r, size_t i)
{
    int64_t v = pval(p, r, i);
    put(p, dst, (double)v, (uint64_t)v);
}

/* One element for printing a mismatch. */
static double load(const pattern_t *p, const void *src)
{
    switch (p->dtype) {
    case TERN_DTYPE_F64: {
        double d;
        memcpy(&d, src, 8);
        return d;
    }
    case TERN_DTYPE_F32: {
        float f;
        memcpy(&f, src, 4);
        return f;
    }
    case TERN_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, src, 2);
        return f16_to_f32(h);
    }
    case TERN_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, src, 2);
        return bf16_to_f32(h);
    }
    case TERN_DTYPE_I8:
        return *(const int8_t *)src;
    case TERN_DTYPE_I16: {
        int16_t v;
        memcpy(&v, src, 2);
        return v;
    }
    case TERN_DTYPE_I32: {
        int32_t v;
        memcpy(&v, src, 4);
        return v;
    }
    case TERN_DTYPE_I64: {
        int64_t v;
        memcpy(&v, src, 8);
        return (double)v;
    }
    default:
        return *(const uint8_t *)src;
    }
}

/* op over the ranks of element i, with the kernels' semantics
 * (tensor/reduce.h): integers wrap, bool sum/max are or and prod/min and, AVG
 * divides the sum once, f16/bf16/f32 in f32. */
static void put_reduced(const pattern_t *p, void *dst, size_t i)
{
    if (p->is_float) {
        double acc = (double)pval(p, 0, i);
        for (unsigned r = 1; r < p->n; r++) {
            double v = (double)pval(p, r, i);
            switch (p->op) {
            case TERN_PROD:
                acc *= v;
                break;
            case TERN_MAX:
                acc = v > acc ? v : acc;
                break;
            case TERN_MIN:
                acc = v < acc ? v : acc;
                break;
            default: /* sum, avg */
                acc += v;
                break;
            }
        }
        if (p->op == TERN_AVG)
            acc = p->dtype == TERN_DTYPE_F64 ? acc / p->n : (double)((float)acc / (float)p->n);
        put(p, dst, acc, 0);
        return;
    }
    int64_t acc = pval(p, 0, i);
    for (unsigned r = 1; r < p->n; r++) {
        int64_t v = pval(p, r, i);
        switch (p->op) {
        case TERN_PROD:
            acc = p->is_bool ? (acc && v) : (int64_t)((uint64_t)acc * (uint64_t)v);
            break;
        case TERN_MAX:
            acc = v > acc ? v : acc;
            break;
        case TERN_MIN:
            acc = v < acc ? v : acc;
            break;
        default:
            acc = p->is_bool ? (acc || v) : (int64_t)((uint64_t)acc + (uint64_t)v);
            break;
        }
    }
    put(p, dst, 0, (uint64_t)acc);
}

/* What element j of this rank's checked buffer must hold. */
static void put_expected(const pattern_t *p, tern_bench_test_t t, unsigned k, int root, size_t c,
                         size_t j, void *dst)
{
    switch (t) {
    case TERN_BENCH_ALLREDUCE:
    case TERN_BENCH_REDUCE:
        put_reduced(p, dst, j);
        return;
    case TERN_BENCH_REDUCE_SCATTER:
        put_reduced(p, dst, (size_t)k * c + j);
        return;
    case TERN_BENCH_BROADCAST:
        put_val(p, dst, (unsigned)root, j);
        return;
    case TERN_BENCH_SCATTER:
        put_val(p, dst, (unsigned)root, (size_t)k * c + j);
        return;
    case TERN_BENCH_ALLGATHER:
    case TERN_BENCH_GATHER:
        put_val(p, dst, (unsigned)(j / c), j % c);
        return;
    case TERN_BENCH_ALLTOALL:
        put_val(p, dst, (unsigned)(j / c), (size_t)k * c + j % c);
        return;
    default:
        return;
    }
}

/* 1 and a description of the first difference when buf is not what t must
 * leave in it. */
static int verify(const pattern_t *p, tern_bench_test_t t, unsigned k, int root, size_t c,
                  const uint8_t *buf, size_t nelem, size_t size, char *detail, size_t dlen)
{
    uint8_t want[8];
    size_t wrong = 0, first = 0;
    double got_v = 0, want_v = 0;
    for (size_t j = 0; j < nelem; j++) {
        put_expected(p, t, k, root, c, j, want);
        if (memcmp(buf + j * p->es, want, p->es) != 0) {
            if (wrong++ == 0) {
                first = j;
                got_v = load(p, buf + j * p->es);
                want_v = load(p, want);
            }
        }
    }
    if (wrong == 0)
        return 0;
    char rooted[24] = "";
    if (is_rooted(t))
        snprintf(rooted, sizeof(rooted), ", root %d", root);
    snprintf(detail, dlen,
             "%s (%s%s%s, %u ranks%s) at %zu bytes: rank %u, output element %zu: got %.9g, "
             "expected %.9g (%zu of %zu elements wrong)",
             tern_bench_name(t), tern_dtype_name(p->dtype), is_reduction(t) ? " " : "",
             is_reduction(t) ? tern_reduce_op_name(p->op) : "", p->n, rooted, size, k, first, got_v,
             want_v, wrong, nelem);
    return 1;
}

/* ---- the run ---- */

typedef struct call {
    tern_group_t *g;
    tern_bench_test_t test;
    void *sbuf, *rbuf;
    size_t count;
    tern_dtype_t dtype;
    tern_reduce_op_t op;
    int root;
} call_t;

static tern_status_t call_once(const call_t *c)
{
    switch (c->test) {
    case TERN_BENCH_ALLREDUCE:
        return tern_all_reduce(c->g, c->sbuf, c->rbuf, c->count, c->dtype, c->op, NULL);
    case TERN_BENCH_BROADCAST:
        return tern_broadcast(c->g, c->sbuf, c->count, c->dtype, c->root, NULL);
    case TERN_BENCH_REDUCE:
        return tern_reduce(c->g, c->sbuf, c->rbuf, c->count, c->dtype, c->op, c->root, NULL);
    case TERN_BENCH_ALLGATHER:
        return tern_all_gather(c->g, c->sbuf, c->rbuf, c->count, c->dtype, NULL);
    case TERN_BENCH_REDUCE_SCATTER:
        return tern_reduce_scatter(c->g, c->sbuf, c->rbuf, c->count, c->dtype, c->op, NULL);
    case TERN_BENCH_ALLTOALL:
        return tern_all_to_all(c->g, c->sbuf, c->rbuf, c->count, c->dtype, NULL);
    case TERN_BENCH_GATHER:
        return tern_gather(c->g, c->sbuf, c->rbuf, c->count, c->dtype, c->root, NULL);
    case TERN_BENCH_SCATTER:
        return tern_scatter(c->g, c->sbuf, c->rbuf, c->count, c->dtype, c->root, NULL);
    case TERN_BENCH_BARRIER:
        return tern_barrier(c->g, NULL);
    default:
        return tern__error(TERN_ERR_INVALID_PARAM, "%s is not a collective test",
                           tern_bench_name(c->test));
    }
}

tern_status_t tern_bench_coll_run(tern_ctx_t *ctx, const tern_bench_opts_t *o, size_t size,
                                  tern_bench_result_t *res)
{
    tern_group_t *g = tern_group_world(ctx);
    tern_bench_test_t t = o->test;
    tern_status_t st;

    memset(res, 0, sizeof(*res));
    if (g == NULL)
        return TERN_ERR_NO_MEMORY; /* tern_group_world() recorded why */
    unsigned n = (unsigned)tern_group_size(g), k = (unsigned)tern_group_rank(g);
    size_t es = tern_dtype_size(o->dtype);
    if (!tern_bench_is_coll(t))
        return tern__error(TERN_ERR_INVALID_PARAM, "%s is not a collective test",
                           tern_bench_name(t));
    if (es == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "unknown dtype %d", (int)o->dtype);
    if (is_rooted(t) && (o->root < 0 || (unsigned)o->root >= n))
        return tern__error(TERN_ERR_INVALID_PARAM, "root %d is not a rank (0..%u)", o->root, n - 1);
    if (is_reduction(t) && (st = tern__reduce_check(o->op, o->dtype)) != TERN_OK)
        return st;
    if (o->inplace && t != TERN_BENCH_ALLREDUCE)
        return tern__error(TERN_ERR_INVALID_PARAM, "--inplace is for allreduce, not %s",
                           tern_bench_name(t));

    size_t c;
    res->size = tern_bench_coll_size(t, size, es, n, &c);
    unsigned iters = o->iters ? o->iters : default_iters(res->size, o->traffic);
    unsigned warmup = tern_bench_warmup(o, iters);
    res->iters = iters;
    int root = is_rooted(t) ? o->root : 0, is_root = (int)k == root;
    size_t scount = 0, rcount = 0; /* elements of each buffer on this rank */
    switch (t) {
    case TERN_BENCH_ALLREDUCE:
        scount = rcount = c;
        break;
    case TERN_BENCH_BROADCAST:
        scount = c; /* in place: the one buffer */
        break;
    case TERN_BENCH_REDUCE:
        scount = c;
        rcount = is_root ? c : 0;
        break;
    case TERN_BENCH_ALLGATHER:
        scount = c;
        rcount = (size_t)n * c;
        break;
    case TERN_BENCH_REDUCE_SCATTER:
        scount = (size_t)n * c;
        rcount = c;
        break;
    case TERN_BENCH_ALLTOALL:
        scount = rcount = (size_t)n * c;
        break;
    case TERN_BENCH_GATHER:
        scount = c;
        rcount = is_root ? (size_t)n * c : 0;
        break;
    case TERN_BENCH_SCATTER:
        scount = is_root ? (size_t)n * c : 0;
        rcount = c;
        break;
    default:
        break;
    }

    pattern_t pat;
    pattern_init(&pat, o->dtype, o->op, is_reduction(t), n);
    call_t call = {g, t, NULL, NULL, c, o->dtype, o->op, root};
    uint64_t *samples = calloc(iters, sizeof(*samples));
    /* Buffers of their exact size (malloc's alignment suits every dtype);
     * never NULL, so a count of 0 goes through the call's normal path. */
    call.sbuf = malloc(scount ? scount * es : 1);
    call.rbuf = o->inplace ? call.sbuf : malloc(rcount ? rcount * es : 1);
    /* Agreed by every rank: gather, scatter and reduce allocate more on the
     * root, and a root that left alone kept the others waiting for it. */
    st = tern_bench_agree(ctx, samples != NULL && call.sbuf != NULL && call.rbuf != NULL,
                          tern_bench_name(t), res->size);
    if (st != TERN_OK)
        goto out;
    /* Always the check's values: the kernels run on the same data, checked or
     * not, and every page is touched before the clock starts. */
    if (t == TERN_BENCH_BROADCAST && !is_root)
        memset(call.sbuf, 0, scount * es);
    else
        for (size_t j = 0; j < scount; j++)
            put_val(&pat, (uint8_t *)call.sbuf + j * es, k, j);
    if (!o->inplace)
        memset(call.rbuf, 0, rcount * es);
    /* Where the result lands on this rank, for the poison and the check. */
    uint8_t *dst =
        t == TERN_BENCH_BROADCAST ? (is_root ? NULL : call.sbuf) : (rcount ? call.rbuf : NULL);
    size_t out_elems = t == TERN_BENCH_BROADCAST ? scount : rcount;

    if ((st = tern_barrier(g, NULL)) != TERN_OK)
        goto out;
    for (unsigned i = 0; i < warmup + iters; i++) {
        if (o->check && i == warmup + iters - 1 && dst != NULL) {
            /* In place the earlier calls have summed into the input: the
             * checked call starts again from the pattern. */
            if (o->inplace)
                for (size_t j = 0; j < scount; j++)
                    put_val(&pat, (uint8_t *)call.sbuf + j * es, k, j);
            else
                memset(dst, POISON, out_elems * es);
        }
        uint64_t t0 = tern_clock_ns();
        if ((st = call_once(&call)) != TERN_OK)
            goto out;
        if (i >= warmup)
            samples[i - warmup] = tern_clock_ns() - t0;
    }

    /* Each iteration takes as long as its slowest rank (nccl-tests takes the
     * slowest rank's average; the maximum per iteration is at least that). */
    if ((st = tern_all_reduce(g, samples, samples, iters, TERN_DTYPE_I64, TERN_MAX, NULL)) !=
        TERN_OK)
        goto out;
    double sum = 0, max_us;
    for (unsigned i = 0; i < iters; i++)
        sum += (double)samples[i];
    max_us = sum / iters / 1000.0;
    tern_bench_sort_u64(samples, iters);
    res->lat_us_p50 = (double)samples[tern_bench_pct_index(iters, 50)] / 1000.0;
    res->lat_us_p99 = (double)samples[tern_bench_pct_index(iters, 99)] / 1000.0;
    res->lat_us_avg = max_us;
    if (t != TERN_BENCH_BARRIER && max_us > 0) {
        res->bw_GBps = (double)res->size / (max_us * 1e3);
        res->busbw_GBps = res->bw_GBps * tern_bench_busbw_factor(t, n);
    }

    if (o->check) {
        int32_t bad = 0, nbad = 0;
        if (dst != NULL)
            bad = verify(&pat, t, k, root, c, dst, out_elems, res->size, res->check_detail,
                         sizeof(res->check_detail));
        if ((st = tern_all_reduce(g, &bad, &nbad, 1, TERN_DTYPE_I32, TERN_SUM, NULL)) != TERN_OK)
            goto out;
        res->check_failures = (unsigned)nbad;
    }
out:
    free(samples);
    if (call.rbuf != call.sbuf)
        free(call.rbuf);
    free(call.sbuf);
    return st;
}
