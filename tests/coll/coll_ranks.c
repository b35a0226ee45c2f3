/*
 * Collectives across real ranks (tern-run -n N, N = 1..8, over each
 * transport). Every operation x dtype x op is checked against a reference
 * each rank computes on its own from the inputs every rank derives from
 * (rank, index); values are small integers so sums and products are exact in
 * every dtype and the reference does not depend on the order of combination.
 * Also: results bit-identical on every rank (checked by gathering them),
 * in-place forms, blocking and non-blocking, sub-groups (overlapping, back to
 * back), concurrent collectives on two groups, non-members, bad arguments,
 * mismatched counts; every operation started non-blocking with all of them
 * in flight at once on one group (the world and a sub-group), polled with
 * tern_request_test and waited out of order; every tensor form with its
 * refusals; and sums whose bits depend on the order of addition (f32, bf16,
 * f16 values of widely different magnitudes) at sizes that take each
 * all_reduce algorithm, bit-identical across ranks and calls and equal to
 * the sum in the order docs/collectives.md gives.
 *
 * Modes (argv[1]):
 *   (none)   the suite above;
 *   --big    also a 64 MiB all_reduce, reduce_scatter, all_gather and
 *            broadcast, and an 8 MiB all_reduce in place (the ring) in order;
 *   --die    the last rank exits in the middle of a run of all_reduces: the
 *            others must fail within TERN_TIMEOUT with an error naming the
 *            operation, its sequence number and that rank, and no other;
 *   --hang   the last rank stops calling (alive): the others must time out,
 *            each naming the ranks it waits on (its partners: the victim)
 *            or passing on another's report of its own;
 *   --hang-strict  as --hang, and some rank's error must name the victim and
 *            none its own rank: fails about 1 run in 6 (test_failure says
 *            why), so no CTest job runs it;
 *   --die-big as --die with 1 MiB all_reduces, whose messages go into
 *            offered buffers (docs/p2p.md) or by rendezvous.
 *   --mismatch-window  counts that differ on a pair whose ring segments wait
 *            for the read window (run with the ring forced, sender's offers
 *            and a small TERN_TCP_SOCKBUF): both fail, and the pair works
 *            afterwards.
 *   --terms  run with settings that differ across ranks (TERN_COLL_EAGER_LIMIT,
 *            TERN_COLL_RTR, TERN_UNEXPECTED_MAX: CMakeLists.txt): the suite,
 *            then a flood of eager sends to the rank with the least credit;
 *            no message is dropped, and sends wait for an offer that never
 *            comes only as a late receiver can make them (a few at most).
 *   --way    over tcp: the group's rank 0 chooses how the puts go and every
 *            member takes its choice at the same call, though their own
 *            clocks say the opposite (test_way).
 */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tern/tern.h>

#include "rank_check.h"

static int rank, world;
static tern_ctx_t *ctx;
static tern_group_t *W;
static atomic_ulong checks;

static const tern_dtype_t DTYPES[] = {TERN_DTYPE_F16, TERN_DTYPE_BF16, TERN_DTYPE_F32,
                                      TERN_DTYPE_F64, TERN_DTYPE_I8,   TERN_DTYPE_I32,
                                      TERN_DTYPE_I64, TERN_DTYPE_U8,   TERN_DTYPE_I16,
                                      TERN_DTYPE_BOOL};
#define NDTYPES (sizeof(DTYPES) / sizeof(DTYPES[0]))
static const size_t COUNTS[] = {0, 1, 7, 1003, 4097, 65537};
#define NCOUNTS (sizeof(COUNTS) / sizeof(COUNTS[0]))

static bool is_float(tern_dtype_t dt)
{
    return dt == TERN_DTYPE_F16 || dt == TERN_DTYPE_BF16 || dt == TERN_DTYPE_F32 ||
           dt == TERN_DTYPE_F64;
}

/* ---- values as doubles, stored in any dtype ---- */

static uint16_t to_f16(double v) /* exact for the small integers used here */
{
    if (v == 0)
        return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    v = fabs(v);
    int e;
    double m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    uint16_t exp = (uint16_t)(e - 1 + 15), man = (uint16_t)((m * 2 - 1) * 1024 + 0.5);
    return sign | (uint16_t)(exp << 10) | man;
}

static double from_f16(uint16_t h)
{
    int exp = h >> 10 & 0x1f, man = h & 0x3ff;
    double v = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
    return h & 0x8000 ? -v : v;
}

static void put(tern_dtype_t dt, void *p, size_t i, double v)
{
    float f = (float)v;
    uint32_t b;
    int64_t iv = (int64_t)v;
    switch (dt) {
    case TERN_DTYPE_F16: ((uint16_t *)p)[i] = to_f16(v); break;
    case TERN_DTYPE_BF16:
        memcpy(&b, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(b >> 16); /* exact for small integers */
        break;
    case TERN_DTYPE_F32: ((float *)p)[i] = f; break;
    case TERN_DTYPE_F64: ((double *)p)[i] = v; break;
    case TERN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)(uint8_t)(uint64_t)iv; break;
    case TERN_DTYPE_I16: ((int16_t *)p)[i] = (int16_t)(uint16_t)(uint64_t)iv; break;
    case TERN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)iv; break;
    case TERN_DTYPE_I64: ((int64_t *)p)[i] = iv; break;
    case TERN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)iv; break;
    case TERN_DTYPE_BOOL: ((uint8_t *)p)[i] = iv != 0; break;
    }
}

static double get(tern_dtype_t dt, const void *p, size_t i)
{
    uint32_t b;
    float f;
    switch (dt) {
    case TERN_DTYPE_F16: return from_f16(((const uint16_t *)p)[i]);
    case TERN_DTYPE_BF16:
        b = (uint32_t)((const uint16_t *)p)[i] << 16;
        memcpy(&f, &b, 4);
        return f;
    case TERN_DTYPE_F32: return ((const float *)p)[i];
    case TERN_DTYPE_F64: return ((const double *)p)[i];
    case TERN_DTYPE_I8: return ((const int8_t *)p)[i];
    case TERN_DTYPE_I16: return ((const int16_t *)p)[i];
    case TERN_DTYPE_I32: return ((const int32_t *)p)[i];
    case TERN_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case TERN_DTYPE_U8: return ((const uint8_t *)p)[i];
    case TERN_DTYPE_BOOL: return ((const uint8_t *)p)[i];
    }
    return NAN;
}

/* Input of world rank w at index i for op: products stay small and exact. */
static double input(int w, size_t i, tern_reduce_op_t op, tern_dtype_t dt)
{
    if (dt == TERN_DTYPE_BOOL)
        return (double)((w + i) % 3 == 0);
    if (op == TERN_PROD)
        return (double)(1 + (w + i) % 2);
    double v = (double)((w * 7 + i * 3) % 5);
    return is_float(dt) && op != TERN_AVG ? v - 2 : v; /* negatives where they are exact */
}

static double combine(tern_reduce_op_t op, tern_dtype_t dt, double acc, double x)
{
    if (dt == TERN_DTYPE_BOOL)
        return op == TERN_SUM || op == TERN_MAX ? (acc || x) : (acc && x);
    switch (op) {
    case TERN_SUM:
    case TERN_AVG: return acc + x;
    case TERN_PROD: return acc * x;
    case TERN_MAX: return x > acc ? x : acc;
    case TERN_MIN: return x < acc ? x : acc;
    }
    return NAN;
}

/* The reduced value at i over the group's members, stored and read back in
 * dt so integer wraparound matches. */
static double expect(const tern_group_t *g, size_t i, tern_reduce_op_t op, tern_dtype_t dt)
{
    int n = tern_group_size(g);
    double acc = input(tern_group_world_rank(g, 0), i, op, dt);
    for (int r = 1; r < n; r++)
        acc = combine(op, dt, acc, input(tern_group_world_rank(g, r), i, op, dt));
    if (op == TERN_AVG)
        acc /= n;
    uint8_t cell[8];
    put(dt, cell, 0, acc);
    return op == TERN_AVG ? acc : get(dt, cell, 0);
}

static bool close_to(tern_dtype_t dt, double got, double want, tern_reduce_op_t op)
{
    if (op != TERN_AVG)
        return got == want;
    double tol = dt == TERN_DTYPE_F16 || dt == TERN_DTYPE_BF16 ? 1e-2 : dt == TERN_DTYPE_F32 ? 1e-6 : 1e-12;
    return fabs(got - want) <= tol * (fabs(want) + 1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL, "malloc %zu", n);
    return p;
}

/* Wait for *req when the call was non-blocking (req was passed), else the
 * call's own status. Takes the address: the call sets *req. */
static tern_status_t finish(tern_status_t st, tern_request_t **req)
{
    if (st != TERN_OK || *req == NULL)
        return st;
    tern_request_t *r = *req;
    *req = NULL;
    return tern_request_wait(r, -1, NULL);
}

/* Every member got the same bytes: gather them onto each rank and compare. */
static void same_everywhere(tern_group_t *g, const void *buf, size_t bytes, const char *what)
{
    int n = tern_group_size(g);
    if (n == 1 || bytes == 0)
        return;
    uint8_t *all = xmalloc(bytes * (size_t)n);
    OK(tern_all_gather(g, buf, all, bytes, TERN_DTYPE_U8, NULL));
    for (int r = 1; r < n; r++)
        CHECK(memcmp(all, all + (size_t)r * bytes, bytes) == 0, "%s: rank %d's result differs "
              "from rank 0's", what, tern_group_world_rank(g, r));
    free(all);
}

/* ---- the operations ---- */

static void check_all_reduce(tern_group_t *g, tern_dtype_t dt, tern_reduce_op_t op, size_t count,
                             int variant)
{
    size_t es = tern_dtype_size(dt), bytes = count * es;
    uint8_t *in = xmalloc(bytes), *out = xmalloc(bytes);
    for (size_t i = 0; i < count; i++)
        put(dt, in, i, input(rank, i, op, dt));
    bool inplace = variant & 1, async = variant & 2;
    tern_request_t *req = NULL;
    void *dst = inplace ? in : out;
    OK(finish(tern_all_reduce(g, in, dst, count, dt, op, async ? &req : NULL), &req));
    for (size_t i = 0; i < count; i++) {
        double got = get(dt, dst, i), want = expect(g, i, op, dt);
        CHECK(close_to(dt, got, want, op), "all_reduce %s %s count %zu [%zu]: got %g want %g",
              tern_dtype_name(dt), tern_reduce_op_name(op), count, i, got, want);
    }
    if (is_float(dt) && count > 0 && count < 5000)
        same_everywhere(g, dst, bytes, "all_reduce");
    free(in);
    free(out);
}

static void check_reduce(tern_group_t *g, tern_dtype_t dt, tern_reduce_op_t op, size_t count,
                         int root)
{
    size_t es = tern_dtype_size(dt), bytes = count * es;
    uint8_t *in = xmalloc(bytes), *out = xmalloc(bytes);
    bool me = tern_group_rank(g) == root, inplace = count % 2 == 1;
    for (size_t i = 0; i < count; i++)
        put(dt, in, i, input(rank, i, op, dt));
    void *dst = inplace ? in : out;
    OK(tern_reduce(g, in, me ? dst : NULL, count, dt, op, root, NULL));
    for (size_t i = 0; me && i < count; i++) {
        double got = get(dt, dst, i), want = expect(g, i, op, dt);
        CHECK(close_to(dt, got, want, op), "reduce %s %s count %zu root %d [%zu]: got %g want %g",
              tern_dtype_name(dt), tern_reduce_op_name(op), count, root, i, got, want);
    }
    free(in);
    free(out);
}

static void check_reduce_scatter(tern_group_t *g, tern_dtype_t dt, tern_reduce_op_t op,
                                 size_t count)
{
    int n = tern_group_size(g), me = tern_group_rank(g);
    size_t es = tern_dtype_size(dt);
    uint8_t *in = xmalloc(count * es * (size_t)n), *out = xmalloc(count * es);
    for (size_t i = 0; i < count * (size_t)n; i++)
        put(dt, in, i, input(rank, i, op, dt));
    bool inplace = count % 2 == 1;
    void *dst = inplace ? in + (size_t)me * count * es : out;
    OK(tern_reduce_scatter(g, in, dst, count, dt, op, NULL));
    for (size_t i = 0; i < count; i++) {
        double got = get(dt, dst, i), want = expect(g, (size_t)me * count + i, op, dt);
        CHECK(close_to(dt, got, want, op), "reduce_scatter %s %s count %zu [%zu]: got %g want %g",
              tern_dtype_name(dt), tern_reduce_op_name(op), count, i, got, want);
    }
    free(in);
    free(out);
}

static uint8_t pat(int w, size_t i)
{
    return (uint8_t)(w * 31 + i * 7 + (i >> 8));
}

/* Byte-moving operations: the dtype only scales the counts. */
static void check_movers(tern_group_t *g, tern_dtype_t dt, size_t count)
{
    int n = tern_group_size(g), me = tern_group_rank(g);
    size_t es = tern_dtype_size(dt), B = count * es, N = (size_t)n;
    uint8_t *buf = xmalloc(B * N), *all = xmalloc(B * N), *one = xmalloc(B);
    tern_request_t *req = NULL;

    /* broadcast from each root in turn */
    for (int root = 0; root < n; root++) {
        int rw = tern_group_world_rank(g, root);
        for (size_t i = 0; i < B; i++)
            one[i] = rank == rw ? pat(rw, i) : 0xee;
        OK(finish(tern_broadcast(g, one, count, dt, root, root % 2 ? &req : NULL), &req));
        for (size_t i = 0; i < B; i++)
            CHECK(one[i] == pat(rw, i), "broadcast %zu B from %d: byte %zu", B, root, i);
    }
    /* all_gather, out of place then in place */
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < B; i++)
            one[i] = pat(rank, i);
        memset(all, 0xee, B * N);
        const void *src = one;
        if (inplace) {
            memcpy(all + (size_t)me * B, one, B);
            src = all + (size_t)me * B;
        }
        OK(tern_all_gather(g, src, all, count, dt, NULL));
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < B; i++)
                CHECK(all[(size_t)r * B + i] == pat(tern_group_world_rank(g, r), i),
                      "all_gather %zu B: block %d byte %zu", B, r, i);
    }
    /* gather and scatter to/from the last rank */
    int root = n - 1, rw = tern_group_world_rank(g, root);
    for (size_t i = 0; i < B; i++)
        one[i] = pat(rank, i);
    memset(all, 0xee, B * N);
    OK(tern_gather(g, one, me == root ? all : NULL, count, dt, root, NULL));
    for (int r = 0; me == root && r < n; r++)
        for (size_t i = 0; i < B; i++)
            CHECK(all[(size_t)r * B + i] == pat(tern_group_world_rank(g, r), i),
                  "gather %zu B: block %d byte %zu", B, r, i);
    for (size_t i = 0; i < B * N; i++)
        buf[i] = me == root ? pat(rw + (int)(i / (B ? B : 1)), i % (B ? B : 1)) : 0;
    memset(one, 0xee, B);
    OK(finish(tern_scatter(g, me == root ? buf : NULL, one, count, dt, root, &req), &req));
    for (size_t i = 0; i < B; i++)
        CHECK(one[i] == pat(rw + me, i), "scatter %zu B: byte %zu", B, i);
    /* all_to_all: block for rank d from rank s is pat(s * 64 + d) */
    for (int d = 0; d < n; d++)
        for (size_t i = 0; i < B; i++)
            buf[(size_t)d * B + i] = pat(rank * 64 + tern_group_world_rank(g, d), i);
    memset(all, 0xee, B * N);
    OK(tern_all_to_all(g, buf, all, count, dt, NULL));
    for (int s = 0; s < n; s++)
        for (size_t i = 0; i < B; i++)
            CHECK(all[(size_t)s * B + i] == pat(tern_group_world_rank(g, s) * 64 + rank, i),
                  "all_to_all %zu B: block from %d byte %zu", B, s, i);
    free(buf);
    free(all);
    free(one);
}

/* The v-variants: rank r contributes (r + 1) * k elements, blocks packed
 * back to back with a gap of one element. */
static void check_v(tern_group_t *g, size_t k)
{
    int n = tern_group_size(g), me = tern_group_rank(g);
    tern_dtype_t dt = TERN_DTYPE_I32;
    size_t *counts = xmalloc(sizeof(size_t) * (size_t)n), *displs = xmalloc(sizeof(size_t) * (size_t)n);
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = (size_t)(r + 1) * k;
        displs[r] = total;
        total += counts[r] + 1;
    }
    int32_t *mine = xmalloc(counts[me] * 4 + 4), *all = xmalloc(total * 4 + 4);
    for (size_t i = 0; i < counts[me]; i++)
        mine[i] = rank * 100000 + (int32_t)i;
    /* all_gatherv */
    memset(all, 0, total * 4);
    OK(tern_all_gatherv(g, mine, counts[me], all, counts, displs, dt, NULL));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++)
            CHECK(all[displs[r] + i] == tern_group_world_rank(g, r) * 100000 + (int32_t)i,
                  "all_gatherv block %d [%zu]", r, i);
    /* gatherv to rank 0 */
    memset(all, 0, total * 4);
    OK(tern_gatherv(g, mine, counts[me], me == 0 ? all : NULL, counts, displs, dt, 0, NULL));
    for (int r = 0; me == 0 && r < n; r++)
        for (size_t i = 0; i < counts[r]; i++)
            CHECK(all[displs[r] + i] == tern_group_world_rank(g, r) * 100000 + (int32_t)i,
                  "gatherv block %d [%zu]", r, i);
    /* scatterv from rank 0: block r holds r * 1000 + i */
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++)
            all[displs[r] + i] = r * 1000 + (int32_t)i;
    memset(mine, 0, counts[me] * 4);
    OK(tern_scatterv(g, all, counts, displs, mine, counts[me], dt, 0, NULL));
    for (size_t i = 0; i < counts[me]; i++)
        CHECK(mine[i] == me * 1000 + (int32_t)i, "scatterv [%zu] = %d", i, mine[i]);
    /* all_to_allv: rank s sends (s + d) % 3 * k + 1 elements to d */
    size_t *sc = xmalloc(sizeof(size_t) * (size_t)n), *sd = xmalloc(sizeof(size_t) * (size_t)n);
    size_t *rc = xmalloc(sizeof(size_t) * (size_t)n), *rd = xmalloc(sizeof(size_t) * (size_t)n);
    size_t st = 0, rt = 0;
    for (int r = 0; r < n; r++) {
        sc[r] = (size_t)((me + r) % 3) * k + 1;
        rc[r] = (size_t)((r + me) % 3) * k + 1;
        sd[r] = st;
        rd[r] = rt;
        st += sc[r];
        rt += rc[r];
    }
    int32_t *sb = xmalloc(st * 4), *rb = xmalloc(rt * 4);
    for (int d = 0; d < n; d++)
        for (size_t i = 0; i < sc[d]; i++)
            sb[sd[d] + i] = me * 10000 + d * 100 + (int32_t)(i % 100);
    OK(tern_all_to_allv(g, sb, sc, sd, rb, rc, rd, dt, NULL));
    for (int s = 0; s < n; s++)
        for (size_t i = 0; i < rc[s]; i++)
            CHECK(rb[rd[s] + i] == s * 10000 + me * 100 + (int32_t)(i % 100),
                  "all_to_allv from %d [%zu] = %d", s, i, rb[rd[s] + i]);
    free(sc), free(sd), free(rc), free(rd), free(sb), free(rb);
    free(counts), free(displs), free(mine), free(all);
}

static void run_suite(tern_group_t *g, bool full)
{
    int n = tern_group_size(g);
    for (size_t d = 0; d < NDTYPES; d++) {
        tern_dtype_t dt = DTYPES[d];
        for (int op = TERN_SUM; op <= TERN_AVG; op++) {
            if (op == TERN_AVG && !is_float(dt))
                continue;
            for (size_t c = 0; c < NCOUNTS; c++) {
                size_t count = COUNTS[c];
                if (!full && count > 1003)
                    continue;
                check_all_reduce(g, dt, (tern_reduce_op_t)op, count, (int)(c + d));
                check_reduce(g, dt, (tern_reduce_op_t)op, count, (int)(c % (size_t)n));
                check_reduce_scatter(g, dt, (tern_reduce_op_t)op, count / 4);
            }
        }
    }
    const tern_dtype_t movers[] = {TERN_DTYPE_U8, TERN_DTYPE_F32, TERN_DTYPE_F64};
    for (size_t d = 0; d < 3; d++)
        for (size_t c = 0; c < NCOUNTS; c++)
            if (full || COUNTS[c] <= 1003)
                check_movers(g, movers[d], COUNTS[c]);
    check_v(g, 1);
    check_v(g, full ? 3001 : 5);
    for (int i = 0; i < 3; i++)
        OK(tern_barrier(g, NULL));
}

/* ---- non-blocking: every collective in flight at once ---- */

/* A value that moves (not reduced) from a source key a at index i: within
 * [-99, 99], exact in every dtype used with it. */
static double mv(int a, size_t i)
{
    return (double)(((size_t)a * 37 + i * 5) % 199) - 99;
}

#define SENTINEL (-777.0)
#define NB_MAX 48
#define NB_BUFS 96

typedef struct nb {
    const char *what;
    tern_request_t *req;
} nb_t;

typedef struct nb_set {
    nb_t q[NB_MAX];
    int n;
    void *bufs[NB_BUFS];
    int nbufs;
} nb_set_t;

/* The request slot of the next call started (its name kept for messages). */
static tern_request_t **nb_slot(nb_set_t *s, const char *what)
{
    CHECK(s->n < NB_MAX, "too many requests");
    s->q[s->n] = (nb_t){.what = what, .req = NULL};
    return &s->q[s->n++].req;
}

/* A buffer of count elements of dt, every element SENTINEL (freed at the end). */
static void *nb_buf(nb_set_t *s, tern_dtype_t dt, size_t count)
{
    CHECK(s->nbufs < NB_BUFS, "too many buffers");
    void *p = xmalloc(count * tern_dtype_size(dt));
    for (size_t i = 0; i < count; i++)
        put(dt, p, i, SENTINEL);
    return s->bufs[s->nbufs++] = p;
}

/* v-blocks: counts[r] elements for rank r, packed with a gap of one. */
static size_t v_layout(int n, size_t base, size_t *counts, size_t *displs)
{
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = base + (size_t)r * 3;
        displs[r] = total;
        total += counts[r] + 1;
    }
    return total;
}

/* all_to_allv: elements rank s sends rank d (group ranks), base to base + 6. */
static size_t a2av_count(int s, int d, size_t base)
{
    return (size_t)((s * 3 + d * 5) % 7) + base;
}

/*
 * Every operation started non-blocking on g, twice (f32 with 1003 elements
 * and i32 with 7; roots differ from call to call), all 27 in flight
 * together; one is polled with tern_request_test until done, the rest
 * waited in an order other than the one they were started in; then every
 * result, and the gaps between v-blocks, is checked against what each rank
 * computes itself.
 */
static void test_nb_all(tern_group_t *g)
{
    int n = tern_group_size(g), me = tern_group_rank(g);
    size_t N = (size_t)n;
    nb_set_t *s = xmalloc(sizeof(*s));
    memset(s, 0, sizeof(*s));
    struct {
        tern_dtype_t dt;
        size_t c;
        void *ar_in, *ar_out, *ar_ip, *bc, *red_in, *red_out, *rs_in, *rs_out, *ag_in, *ag_out;
        void *ga_in, *ga_out, *sc_in, *sc_out, *a2a_in, *a2a_out;
        void *agv_in, *agv_out, *gv_in, *gv_out, *scv_in, *scv_out, *a2av_in, *a2av_out;
        int rb, rr, rg, rs, rgv, rsv;
        size_t *vc, *vd, vtotal, *sc, *sd, *rc, *rd;
    } V[2];
    size_t *idx = xmalloc(sizeof(size_t) * N * 12);
    for (int v = 0; v < 2; v++) {
        tern_dtype_t dt = v == 0 ? TERN_DTYPE_F32 : TERN_DTYPE_I32;
        size_t c = v == 0 ? 1003 : 7;
        V[v].dt = dt;
        V[v].c = c;
        V[v].rb = (1 + v) % n;
        V[v].rr = (n - 1 + v) % n;
        V[v].rg = v % n;
        V[v].rs = (n - 1) % n;
        V[v].rgv = (n - 1 - v + n) % n;
        V[v].rsv = (2 + v) % n;
        V[v].vc = idx + (size_t)v * 6 * N;
        V[v].vd = V[v].vc + N;
        V[v].sc = V[v].vd + N;
        V[v].sd = V[v].sc + N;
        V[v].rc = V[v].sd + N;
        V[v].rd = V[v].rc + N;
        V[v].vtotal = v_layout(n, c, V[v].vc, V[v].vd);
        size_t st = 0, rt = 0;
        for (int r = 0; r < n; r++) {
            V[v].sc[r] = a2av_count(me, r, c);
            V[v].rc[r] = a2av_count(r, me, c);
            V[v].sd[r] = st;
            V[v].rd[r] = rt;
            st += V[v].sc[r] + 1;
            rt += V[v].rc[r] + 1;
        }
        /* Inputs. */
        V[v].ar_in = nb_buf(s, dt, c);
        V[v].ar_out = nb_buf(s, dt, c);
        V[v].ar_ip = nb_buf(s, dt, c);
        V[v].bc = nb_buf(s, dt, c);
        V[v].red_in = nb_buf(s, dt, c);
        V[v].red_out = nb_buf(s, dt, c);
        V[v].rs_in = nb_buf(s, dt, c * N);
        V[v].rs_out = nb_buf(s, dt, c);
        V[v].ag_in = nb_buf(s, dt, c);
        V[v].ag_out = nb_buf(s, dt, c * N);
        V[v].ga_in = nb_buf(s, dt, c);
        V[v].ga_out = nb_buf(s, dt, c * N);
        V[v].sc_in = nb_buf(s, dt, c * N);
        V[v].sc_out = nb_buf(s, dt, c);
        V[v].a2a_in = nb_buf(s, dt, c * N);
        V[v].a2a_out = nb_buf(s, dt, c * N);
        V[v].agv_in = nb_buf(s, dt, V[v].vc[me]);
        V[v].agv_out = nb_buf(s, dt, V[v].vtotal);
        V[v].gv_in = nb_buf(s, dt, V[v].vc[me]);
        V[v].gv_out = nb_buf(s, dt, V[v].vtotal);
        V[v].scv_in = nb_buf(s, dt, V[v].vtotal);
        V[v].scv_out = nb_buf(s, dt, V[v].vc[me]);
        V[v].a2av_in = nb_buf(s, dt, st);
        V[v].a2av_out = nb_buf(s, dt, rt);
        for (size_t i = 0; i < c; i++) {
            put(dt, V[v].ar_in, i, input(rank, i, TERN_SUM, dt));
            put(dt, V[v].ar_ip, i, input(rank, i, TERN_MAX, dt));
            put(dt, V[v].red_in, i, input(rank, i, TERN_SUM, dt));
            if (me == V[v].rb)
                put(dt, V[v].bc, i, mv(300 + rank * 2 + v, i));
            put(dt, V[v].ag_in, i, mv(rank, i));
            put(dt, V[v].ga_in, i, mv(50 + rank, i));
        }
        for (size_t i = 0; i < c * N; i++)
            put(dt, V[v].rs_in, i, input(rank, i, TERN_SUM, dt));
        for (int d = 0; d < n; d++)
            for (size_t i = 0; i < c; i++) {
                if (me == V[v].rs)
                    put(dt, V[v].sc_in, (size_t)d * c + i, mv(100 + d, i));
                put(dt, V[v].a2a_in, (size_t)d * c + i,
                    mv(200 + rank * 9 + tern_group_world_rank(g, d), i));
            }
        for (size_t i = 0; i < V[v].vc[me]; i++) {
            put(dt, V[v].agv_in, i, mv(400 + rank, i));
            put(dt, V[v].gv_in, i, mv(500 + rank, i));
        }
        for (int d = 0; me == V[v].rsv && d < n; d++)
            for (size_t i = 0; i < V[v].vc[d]; i++)
                put(dt, V[v].scv_in, V[v].vd[d] + i, mv(600 + d, i));
        for (int d = 0; d < n; d++)
            for (size_t i = 0; i < V[v].sc[d]; i++)
                put(dt, V[v].a2av_in, V[v].sd[d] + i, mv(700 + me * 9 + d, i));
    }
    /* Start everything, both variants interleaved op by op. */
    for (int v = 0; v < 2; v++) {
        tern_dtype_t dt = V[v].dt;
        size_t c = V[v].c;
        OK(tern_all_reduce(g, V[v].ar_in, V[v].ar_out, c, dt, TERN_SUM, nb_slot(s, "all_reduce")));
        OK(tern_reduce(g, V[v].red_in, me == V[v].rr ? V[v].red_out : NULL, c, dt, TERN_SUM,
                       V[v].rr, nb_slot(s, "reduce")));
        OK(tern_reduce_scatter(g, V[v].rs_in, V[v].rs_out, c, dt, TERN_SUM,
                               nb_slot(s, "reduce_scatter")));
    }
    for (int v = 0; v < 2; v++) {
        tern_dtype_t dt = V[v].dt;
        size_t c = V[v].c;
        OK(tern_all_gather(g, V[v].ag_in, V[v].ag_out, c, dt, nb_slot(s, "all_gather")));
        OK(tern_gather(g, V[v].ga_in, me == V[v].rg ? V[v].ga_out : NULL, c, dt, V[v].rg,
                       nb_slot(s, "gather")));
        OK(tern_scatter(g, me == V[v].rs ? V[v].sc_in : NULL, V[v].sc_out, c, dt, V[v].rs,
                        nb_slot(s, "scatter")));
        OK(tern_all_to_all(g, V[v].a2a_in, V[v].a2a_out, c, dt, nb_slot(s, "all_to_all")));
        OK(tern_broadcast(g, V[v].bc, c, dt, V[v].rb, nb_slot(s, "broadcast")));
    }
    int poll = s->n - 2; /* variant 1's all_to_all */
    for (int v = 0; v < 2; v++) {
        tern_dtype_t dt = V[v].dt;
        size_t *vc = V[v].vc, *vd = V[v].vd;
        OK(tern_all_gatherv(g, V[v].agv_in, vc[me], V[v].agv_out, vc, vd, dt,
                            nb_slot(s, "all_gatherv")));
        OK(tern_gatherv(g, V[v].gv_in, vc[me], me == V[v].rgv ? V[v].gv_out : NULL, vc, vd, dt,
                        V[v].rgv, nb_slot(s, "gatherv")));
        OK(tern_scatterv(g, me == V[v].rsv ? V[v].scv_in : NULL, vc, vd, V[v].scv_out, vc[me], dt,
                         V[v].rsv, nb_slot(s, "scatterv")));
        OK(tern_all_to_allv(g, V[v].a2av_in, V[v].sc, V[v].sd, V[v].a2av_out, V[v].rc, V[v].rd, dt,
                            nb_slot(s, "all_to_allv")));
        OK(tern_all_reduce(g, V[v].ar_ip, V[v].ar_ip, V[v].c, dt, TERN_MAX,
                           nb_slot(s, "all_reduce in place")));
    }
    OK(tern_barrier(g, nb_slot(s, "barrier")));
    for (int i = 0; i < s->n; i++)
        CHECK(s->q[i].req != NULL, "%s #%d: no request", s->q[i].what, i);
    /* One polled until done... */
    uint64_t t0 = tern_clock_ns();
    int done = 0;
    unsigned long polls = 0;
    while (!done) {
        tern_status_t st = tern_request_test(s->q[poll].req, &done, NULL);
        CHECK(st == TERN_OK, "polling %s: %s", s->q[poll].what, tern_status_name(st));
        polls++;
        CHECK(done || tern_clock_ns() - t0 < 60ull * 1000000000ull, "%s not done after 60 s of "
              "polling", s->q[poll].what);
        if (!done && polls % 64 == 0)
            usleep(100);
    }
    s->q[poll].req = NULL;
    /* ...the others waited last to first among the odd ones, then first to
     * last among the even ones. */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < s->n; k++) {
            int i = pass == 0 ? s->n - 1 - k : k;
            if (i % 2 != (pass == 0 ? 1 : 0) || s->q[i].req == NULL)
                continue;
            tern_status_t st = tern_request_wait(s->q[i].req, -1, NULL);
            s->q[i].req = NULL;
            CHECK(st == TERN_OK, "waiting for %s (#%d of %d in flight): %s", s->q[i].what, i, s->n,
                  tern_status_name(st));
        }
    for (int i = 0; i < s->n; i++)
        CHECK(s->q[i].req == NULL, "%s #%d never waited for", s->q[i].what, i);
    /* The results. */
    for (int v = 0; v < 2; v++) {
        tern_dtype_t dt = V[v].dt;
        size_t c = V[v].c;
        const char *dn = tern_dtype_name(dt);
        double got, want;
        for (size_t i = 0; i < c; i++) {
            got = get(dt, V[v].ar_out, i), want = expect(g, i, TERN_SUM, dt);
            CHECK(got == want, "nb all_reduce %s %zu [%zu]: %g want %g", dn, c, i, got, want);
            got = get(dt, V[v].ar_ip, i), want = expect(g, i, TERN_MAX, dt);
            CHECK(got == want, "nb all_reduce in place %s %zu [%zu]: %g want %g", dn, c, i, got,
                  want);
            if (me == V[v].rr) {
                got = get(dt, V[v].red_out, i), want = expect(g, i, TERN_SUM, dt);
                CHECK(got == want, "nb reduce %s %zu [%zu]: %g want %g", dn, c, i, got, want);
            }
            got = get(dt, V[v].rs_out, i), want = expect(g, (size_t)me * c + i, TERN_SUM, dt);
            CHECK(got == want, "nb reduce_scatter %s %zu [%zu]: %g want %g", dn, c, i, got, want);
            got = get(dt, V[v].bc, i);
            want = mv(300 + tern_group_world_rank(g, V[v].rb) * 2 + v, i);
            CHECK(got == want, "nb broadcast %s %zu [%zu]: %g want %g", dn, c, i, got, want);
            got = get(dt, V[v].sc_out, i), want = mv(100 + me, i);
            CHECK(got == want, "nb scatter %s %zu [%zu]: %g want %g", dn, c, i, got, want);
            for (int r = 0; r < n; r++) {
                int w = tern_group_world_rank(g, r);
                size_t j = (size_t)r * c + i;
                got = get(dt, V[v].ag_out, j), want = mv(w, i);
                CHECK(got == want, "nb all_gather %s %zu block %d [%zu]: %g want %g", dn, c, r, i,
                      got, want);
                if (me == V[v].rg) {
                    got = get(dt, V[v].ga_out, j), want = mv(50 + w, i);
                    CHECK(got == want, "nb gather %s %zu block %d [%zu]: %g want %g", dn, c, r, i,
                          got, want);
                }
                got = get(dt, V[v].a2a_out, j), want = mv(200 + w * 9 + rank, i);
                CHECK(got == want, "nb all_to_all %s %zu from %d [%zu]: %g want %g", dn, c, r, i,
                      got, want);
            }
        }
        size_t *vc = V[v].vc, *vd = V[v].vd;
        for (int r = 0; r < n; r++) {
            int w = tern_group_world_rank(g, r);
            for (size_t i = 0; i < vc[r]; i++) {
                got = get(dt, V[v].agv_out, vd[r] + i), want = mv(400 + w, i);
                CHECK(got == want, "nb all_gatherv %s block %d [%zu]: %g want %g", dn, r, i, got,
                      want);
                if (me == V[v].rgv) {
                    got = get(dt, V[v].gv_out, vd[r] + i), want = mv(500 + w, i);
                    CHECK(got == want, "nb gatherv %s block %d [%zu]: %g want %g", dn, r, i, got,
                          want);
                }
            }
            /* The gaps between blocks stay untouched. */
            got = get(dt, V[v].agv_out, vd[r] + vc[r]);
            CHECK(got == SENTINEL, "nb all_gatherv %s: gap after block %d written (%g)", dn, r,
                  got);
            for (size_t i = 0; i < V[v].rc[r]; i++) {
                got = get(dt, V[v].a2av_out, V[v].rd[r] + i), want = mv(700 + r * 9 + me, i);
                CHECK(got == want, "nb all_to_allv %s from %d [%zu]: %g want %g", dn, r, i, got,
                      want);
            }
            got = get(dt, V[v].a2av_out, V[v].rd[r] + V[v].rc[r]);
            CHECK(got == SENTINEL, "nb all_to_allv %s: gap after block %d written (%g)", dn, r,
                  got);
        }
        for (size_t i = 0; i < vc[me]; i++) {
            got = get(dt, V[v].scv_out, i), want = mv(600 + me, i);
            CHECK(got == want, "nb scatterv %s [%zu]: %g want %g", dn, i, got, want);
        }
    }
    for (int i = 0; i < s->nbufs; i++)
        free(s->bufs[i]);
    free(idx);
    free(s);
}

/* tern_request_test on a collective that cannot be done yet: the other
 * ranks call it only once rank 0 has tested it (they wait for its word),
 * so the first test must say not done; rank 0 then polls it to the end. */
static void test_request_test(void)
{
    enum { GO_TAG = 91 };
    int32_t x[7], go = 1;
    for (int i = 0; i < 7; i++)
        x[i] = rank * 10 + i;
    if (rank != 0) {
        OK(tern_recv(ctx, &go, sizeof(go), 0, GO_TAG, NULL));
        OK(tern_all_reduce(W, x, x, 7, TERN_DTYPE_I32, TERN_SUM, NULL));
    } else {
        tern_request_t *req;
        int done = -1;
        OK(tern_all_reduce(W, x, x, 7, TERN_DTYPE_I32, TERN_SUM, &req));
        OK(tern_request_test(req, &done, NULL));
        CHECK(world == 1 || done == 0, "tern_request_test said done=%d before the other ranks "
              "called", done);
        for (int r = 1; r < world; r++)
            OK(tern_send(ctx, &go, sizeof(go), r, GO_TAG));
        uint64_t t0 = tern_clock_ns();
        while (!done) {
            OK(tern_request_test(req, &done, NULL));
            CHECK(done || tern_clock_ns() - t0 < 60ull * 1000000000ull, "not done after 60 s");
        }
    }
    for (int i = 0; i < 7; i++)
        CHECK(x[i] == 10 * world * (world - 1) / 2 + world * i, "polled all_reduce [%d] = %d", i,
              x[i]);
}

/* ---- tensor forms ---- */

static tern_tensor_t tensor(void *data, tern_dtype_t dt, int ndim, const int64_t *shape)
{
    tern_tensor_t t;
    OK(tern_tensor_init(&t, data, dt, ndim, shape, tern_device_cpu()));
    return t;
}

/* A refused call: status want, and the error names the call. */
#define REFUSED(call, want, name)                                                              \
    do {                                                                                       \
        tern_status_t st_ = (call);                                                            \
        CHECK(st_ == (want) && strstr(tern_last_error(), name) != NULL, "%s gave %s, want %s", \
              #call, tern_status_name(st_), tern_status_name(want));                           \
    } while (0)

static void test_tensor_colls(tern_group_t *g)
{
    int n = tern_group_size(g), me = tern_group_rank(g), last = n - 1;
    size_t N = (size_t)n;
    tern_request_t *req = NULL;
    float f4[4] = {0};
    int64_t s22[2] = {2, 2};
    tern_tensor_t cuda, strided;
    OK(tern_tensor_init(&cuda, f4, TERN_DTYPE_F32, 2, s22, tern_device_cuda(0)));
    strided = tensor(f4, TERN_DTYPE_F32, 2, s22);
    strided.strides[0] = 1;
    strided.strides[1] = 2;

    /* Refusals first: each fails on the rank that calls it before anything
     * is sent, and takes no sequence number (the calls below would then not
     * match across ranks). */
    REFUSED(tern_broadcast_tensor(g, &cuda, 0, NULL), TERN_ERR_UNSUPPORTED, "broadcast");
    REFUSED(tern_broadcast_tensor(g, &strided, 0, &req), TERN_ERR_UNSUPPORTED, "broadcast");
    REFUSED(tern_reduce_tensor(g, &cuda, TERN_SUM, 0, NULL), TERN_ERR_UNSUPPORTED, "reduce");
    REFUSED(tern_reduce_tensor(g, &strided, TERN_MAX, 0, &req), TERN_ERR_UNSUPPORTED, "reduce");
    float *fa = xmalloc(sizeof(float) * (3 * N + 1)), *fb = xmalloc(sizeof(float) * (3 * N + 1));
    int32_t *ia = xmalloc(sizeof(int32_t) * (3 * N + 1));
    int64_t sN3[2] = {n, 3}, s3N1[1] = {3 * n + 1};
    tern_tensor_t a = tensor(fa, TERN_DTYPE_F32, 2, sN3), b = tensor(fb, TERN_DTYPE_F32, 2, sN3);
    tern_tensor_t ai = tensor(ia, TERN_DTYPE_I32, 2, sN3);
    tern_tensor_t a1 = tensor(fa, TERN_DTYPE_F32, 1, s3N1);
    tern_tensor_t b1 = tensor(fb, TERN_DTYPE_F32, 1, s3N1);
    REFUSED(tern_all_to_all_tensor(g, &ai, &a, NULL), TERN_ERR_INVALID_PARAM, "all_to_all");
    REFUSED(tern_all_to_all_tensor(g, &b1, &a, NULL), TERN_ERR_INVALID_PARAM, "all_to_all");
    REFUSED(tern_all_to_all_tensor(g, &b, &cuda, NULL), TERN_ERR_UNSUPPORTED, "all_to_all");
    if (n > 1) /* 3n + 1 elements do not split over n ranks */
        REFUSED(tern_all_to_all_tensor(g, &b1, &a1, &req), TERN_ERR_INVALID_PARAM, "split");
    /* gather: out is read on the root only, where it must hold n * numel(in)
     * of in's dtype; in is checked everywhere. */
    float g9[9];
    int64_t s33[2] = {3, 3}, sN33[3] = {n, 3, 3}, bad_gather[1] = {9 * n + 1};
    float *gout = xmalloc(sizeof(float) * (9 * N + 1));
    int32_t *giout = xmalloc(sizeof(int32_t) * 9 * N);
    tern_tensor_t gin = tensor(g9, TERN_DTYPE_F32, 2, s33);
    tern_tensor_t gbad = tensor(gout, TERN_DTYPE_F32, 1, bad_gather);
    tern_tensor_t gi = tensor(giout, TERN_DTYPE_I32, 3, sN33);
    if (me == last) {
        REFUSED(tern_gather_tensor(g, &gbad, &gin, last, NULL), TERN_ERR_INVALID_PARAM, "gather");
        REFUSED(tern_gather_tensor(g, &gi, &gin, last, &req), TERN_ERR_INVALID_PARAM, "gather");
        REFUSED(tern_gather_tensor(g, NULL, &gin, last, NULL), TERN_ERR_INVALID_PARAM, "gather");
    }
    int64_t s4N[1] = {4 * n};
    tern_tensor_t g4 = tensor(gout, TERN_DTYPE_F32, 1, s4N); /* right for strided's 4 */
    REFUSED(tern_gather_tensor(g, me == last ? &g4 : NULL, &strided, last, NULL),
            TERN_ERR_UNSUPPORTED, "gather");
    /* scatter: in is read on the root only, n * numel(out) of out's dtype. */
    if (me == 0) {
        REFUSED(tern_scatter_tensor(g, &gin, &gbad, 0, NULL), TERN_ERR_INVALID_PARAM, "scatter");
        REFUSED(tern_scatter_tensor(g, &gin, &gi, 0, NULL), TERN_ERR_INVALID_PARAM, "scatter");
        REFUSED(tern_scatter_tensor(g, &gin, NULL, 0, &req), TERN_ERR_INVALID_PARAM, "scatter");
    }
    REFUSED(tern_scatter_tensor(g, &cuda, NULL, 0, NULL), TERN_ERR_UNSUPPORTED, "scatter");
    CHECK(req == NULL, "a refused call set its request");

    /* broadcast_tensor: a [3, 5] f32 from the last rank, a scalar f64 from
     * the middle one non-blocking. */
    float bt[15];
    int64_t s35[2] = {3, 5};
    for (int i = 0; i < 15; i++)
        bt[i] = me == last ? (float)(1000 * rank + i) - 7.5f : -1;
    tern_tensor_t t = tensor(bt, TERN_DTYPE_F32, 2, s35);
    OK(tern_broadcast_tensor(g, &t, last, NULL));
    for (int i = 0; i < 15; i++)
        CHECK(bt[i] == (float)(1000 * tern_group_world_rank(g, last) + i) - 7.5f,
              "broadcast_tensor [%d] = %g", i, bt[i]);
    double scalar = me == n / 2 ? 0.1 * (rank + 1) : -1;
    t = tensor(&scalar, TERN_DTYPE_F64, 0, NULL);
    OK(finish(tern_broadcast_tensor(g, &t, n / 2, &req), &req));
    CHECK(scalar == 0.1 * (tern_group_world_rank(g, n / 2) + 1), "broadcast_tensor scalar %g",
          scalar);

    /* reduce_tensor: i32 [7] SUM to the last rank, f32 [4, 251] MAX to rank
     * 0 non-blocking; the result in place on the root. */
    int32_t r7[7];
    int64_t s7[1] = {7}, s4x251[2] = {4, 251};
    for (size_t i = 0; i < 7; i++)
        r7[i] = (int32_t)input(rank, i, TERN_SUM, TERN_DTYPE_I32);
    t = tensor(r7, TERN_DTYPE_I32, 1, s7);
    OK(tern_reduce_tensor(g, &t, TERN_SUM, last, NULL));
    for (size_t i = 0; me == last && i < 7; i++)
        CHECK(r7[i] == expect(g, i, TERN_SUM, TERN_DTYPE_I32), "reduce_tensor [%zu] = %d", i,
              r7[i]);
    float *rm = xmalloc(sizeof(float) * 1004);
    for (size_t i = 0; i < 1004; i++)
        rm[i] = (float)input(rank, i, TERN_MAX, TERN_DTYPE_F32);
    t = tensor(rm, TERN_DTYPE_F32, 2, s4x251);
    OK(finish(tern_reduce_tensor(g, &t, TERN_MAX, 0, &req), &req));
    for (size_t i = 0; me == 0 && i < 1004; i++)
        CHECK(rm[i] == expect(g, i, TERN_MAX, TERN_DTYPE_F32), "reduce_tensor max [%zu] = %g", i,
              rm[i]);
    free(rm);

    /* all_to_all_tensor: i64 [n, 3] into [3, n] (flattened, equal splits),
     * then u8 [2n] non-blocking, and an empty one. */
    int64_t *xi = xmalloc(sizeof(int64_t) * 3 * N), *xo = xmalloc(sizeof(int64_t) * 3 * N);
    int64_t s3N[2] = {3, n};
    for (size_t j = 0; j < 3 * N; j++) {
        xi[j] = rank * 1000 + tern_group_world_rank(g, (int)(j / 3)) * 10 + (int64_t)(j % 3);
        xo[j] = -1;
    }
    tern_tensor_t ti = tensor(xi, TERN_DTYPE_I64, 2, sN3), to = tensor(xo, TERN_DTYPE_I64, 2, s3N);
    OK(tern_all_to_all_tensor(g, &to, &ti, NULL));
    for (size_t j = 0; j < 3 * N; j++)
        CHECK(xo[j] == tern_group_world_rank(g, (int)(j / 3)) * 1000 + rank * 10 + (int64_t)(j % 3),
              "all_to_all_tensor [%zu] = %" PRId64, j, xo[j]);
    uint8_t *ui = xmalloc(2 * N), *uo = xmalloc(2 * N);
    int64_t s2N[1] = {2 * n};
    for (size_t j = 0; j < 2 * N; j++) {
        ui[j] = (uint8_t)(me * 16 + (int)j);
        uo[j] = 0xee;
    }
    ti = tensor(ui, TERN_DTYPE_U8, 1, s2N);
    to = tensor(uo, TERN_DTYPE_U8, 1, s2N);
    OK(finish(tern_all_to_all_tensor(g, &to, &ti, &req), &req));
    for (size_t j = 0; j < 2 * N; j++)
        CHECK(uo[j] == (uint8_t)((int)(j / 2) * 16 + me * 2 + (int)(j % 2)),
              "all_to_all_tensor u8 [%zu] = %u", j, uo[j]);
    int64_t s0[1] = {0};
    ti = tensor(NULL, TERN_DTYPE_F32, 1, s0);
    to = tensor(NULL, TERN_DTYPE_F32, 1, s0);
    OK(tern_all_to_all_tensor(g, &to, &ti, NULL));

    /* gather_tensor: f32 [3, 3] into [n, 3, 3] on the last rank (out NULL
     * elsewhere), then i16 [5] to rank 0 non-blocking. */
    for (int i = 0; i < 9; i++)
        g9[i] = (float)(rank * 100 + i);
    for (size_t j = 0; j < 9 * N; j++)
        gout[j] = -1;
    tern_tensor_t go = tensor(gout, TERN_DTYPE_F32, 3, sN33);
    OK(tern_gather_tensor(g, me == last ? &go : NULL, &gin, last, NULL));
    for (size_t j = 0; me == last && j < 9 * N; j++)
        CHECK(gout[j] == (float)(tern_group_world_rank(g, (int)(j / 9)) * 100 + (int)(j % 9)),
              "gather_tensor [%zu] = %g", j, gout[j]);
    int16_t h5[5], *hN = xmalloc(sizeof(int16_t) * 5 * N);
    int64_t s5[1] = {5}, s5N[2] = {n, 5};
    for (int i = 0; i < 5; i++)
        h5[i] = (int16_t)(-rank * 100 - i);
    for (size_t j = 0; j < 5 * N; j++)
        hN[j] = 1;
    ti = tensor(h5, TERN_DTYPE_I16, 1, s5);
    to = tensor(hN, TERN_DTYPE_I16, 2, s5N);
    OK(finish(tern_gather_tensor(g, me == 0 ? &to : NULL, &ti, 0, &req), &req));
    for (size_t j = 0; me == 0 && j < 5 * N; j++)
        CHECK(hN[j] == (int16_t)(-tern_group_world_rank(g, (int)(j / 5)) * 100 - (int)(j % 5)),
              "gather_tensor i16 [%zu] = %d", j, hN[j]);

    /* scatter_tensor: i16 [n, 5] from rank 0 into [5] (in NULL elsewhere),
     * then f32 [n * 7] from the last rank non-blocking. */
    for (size_t j = 0; j < 5 * N; j++)
        hN[j] = me == 0 ? (int16_t)(j * 3 + 1) : 0;
    for (int i = 0; i < 5; i++)
        h5[i] = -1;
    ti = tensor(hN, TERN_DTYPE_I16, 2, s5N);
    to = tensor(h5, TERN_DTYPE_I16, 1, s5);
    OK(tern_scatter_tensor(g, &to, me == 0 ? &ti : NULL, 0, NULL));
    for (int i = 0; i < 5; i++)
        CHECK(h5[i] == (int16_t)((me * 5 + i) * 3 + 1), "scatter_tensor [%d] = %d", i, h5[i]);
    float *sf = xmalloc(sizeof(float) * 7 * N), s7o[7];
    int64_t s7N[1] = {7 * n};
    for (size_t j = 0; j < 7 * N; j++)
        sf[j] = me == last ? (float)j * 0.25f : 0;
    for (int i = 0; i < 7; i++)
        s7o[i] = -1;
    ti = tensor(sf, TERN_DTYPE_F32, 1, s7N);
    to = tensor(s7o, TERN_DTYPE_F32, 1, s7);
    OK(finish(tern_scatter_tensor(g, &to, me == last ? &ti : NULL, last, &req), &req));
    for (int i = 0; i < 7; i++)
        CHECK(s7o[i] == (float)(me * 7 + i) * 0.25f, "scatter_tensor f32 [%d] = %g", i, s7o[i]);
    free(sf), free(hN), free(xi), free(xo), free(ui), free(uo);
    free(fa), free(fb), free(ia), free(gout), free(giout);
}

/* ---- determinism: sums whose bits depend on the order ---- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Significant bits and exponent range of a floating dtype's test values:
 * wide enough that adding in another order rounds differently, narrow
 * enough that no sum of 8 overflows (f16). */
static void wild_shape(tern_dtype_t dt, int *bits, int *emin, int *espan)
{
    *bits = dt == TERN_DTYPE_F32 ? 24 : dt == TERN_DTYPE_BF16 ? 8 : 11;
    *emin = dt == TERN_DTYPE_F32 ? -30 : dt == TERN_DTYPE_BF16 ? -20 : -10;
    *espan = dt == TERN_DTYPE_F32 ? 58 : dt == TERN_DTYPE_BF16 ? 40 : 20;
}

/* World rank w's value at i: a random significand, exponent and sign (from
 * a hash of dt, w, i), exactly representable in dt; a quarter of them a
 * large power of two whose sign alternates with the rank (the 1e8, -1e8
 * pattern: large terms cancel, and the small ones survive only in some
 * orders). */
static double wild(tern_dtype_t dt, int w, size_t i)
{
    int bits, emin, espan;
    wild_shape(dt, &bits, &emin, &espan);
    uint64_t h = splitmix64(((uint64_t)dt << 56) ^ ((uint64_t)w << 40) ^ (uint64_t)i);
    if ((h & 3) == 0)
        return ldexp((w + (int)(i >> 2)) % 2 ? -1.0 : 1.0, emin + espan - 1);
    double m = 1 + ldexp((double)((h >> 8) & ((1ull << (bits - 1)) - 1)), 1 - bits);
    int e = emin + (int)((h >> 32) % (uint64_t)espan);
    return ldexp(h >> 63 ? -m : m, e);
}

/* v (exactly representable in dt) stored in dt; for f16, any value, its
 * subnormals included. */
static void put_exact(tern_dtype_t dt, void *p, size_t i, double v)
{
    float f = (float)v;
    uint32_t b;
    if (dt == TERN_DTYPE_F32) {
        ((float *)p)[i] = f;
    } else if (dt == TERN_DTYPE_BF16) {
        memcpy(&b, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(b >> 16);
    } else if (dt == TERN_DTYPE_F16) {
        uint16_t sign = signbit(v) ? 0x8000 : 0, h;
        double a = fabs(v);
        if (a < ldexp(1, -14)) {
            h = (uint16_t)ldexp(a, 24); /* subnormal: a multiple of 2^-24 */
        } else {
            int e;
            double m = frexp(a, &e); /* [0.5, 1) */
            h = (uint16_t)((e - 1 + 15) << 10 | (int)ldexp(m * 2 - 1, 10));
        }
        ((uint16_t *)p)[i] = sign | h;
    } else {
        put(dt, p, i, v);
    }
}

/* f, a float, rounded to dt (nearest, ties to even), as the kernels round
 * f16 and bf16 sums computed in f32. No overflow in these tests. */
static double round_to(tern_dtype_t dt, float f)
{
    if (dt == TERN_DTYPE_F32 || f == 0)
        return f;
    int e;
    frexp(f, &e); /* |f| in [2^(e-1), 2^e) */
    int bits = dt == TERN_DTYPE_BF16 ? 8 : 11, emin = dt == TERN_DTYPE_BF16 ? -126 : -14;
    int q = (e - 1 < emin ? emin : e - 1) - (bits - 1); /* the ulp's exponent */
    return ldexp(nearbyint(ldexp(f, -q)), q);
}

/* a + b in dt as a reduction step makes it: in f32, rounded back. */
static double add_in(tern_dtype_t dt, double a, double b)
{
    float s = (float)a + (float)b;
    return round_to(dt, s);
}

/* all_reduce's algorithm for a call (api.c's choice, or the forced one). */
static bool host_shm_job(void)
{
    char prov[16], dev[128];
    if (tern_ctx_transport(ctx, prov, sizeof(prov), dev, sizeof(dev)) != TERN_OK ||
        strcmp(prov, "ucx") != 0 || (int)tern_ctx_local_world_size(ctx) != world)
        return false;
    static const char *shm[] = {"posix/", "sysv/", "cma/", "xpmem/", "knem/"};
    for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++)
        if (strstr(dev, shm[i]) != NULL)
            return true;
    return false;
}

static size_t ar_rab_max(int n, bool in_place)
{
    bool shm = host_shm_job();
    if (n == 2)
        return shm && !in_place ? SIZE_MAX : 8u << 20;
    if ((n & (n - 1)) != 0)
        return 1u << 20;
    return shm ? 32u << 20 : 8u << 20;
}

/* What TERN_COLL_ALGO_<OP> forces, or auto's choice (docs/collectives.md). */
static const char *algo_want(const char *var, const char *auto_choice)
{
    const char *e = getenv(var);
    return e != NULL && e[0] != '\0' && strcmp(e, "auto") != 0 ? e : auto_choice;
}

static const char *ar_algo(int n, size_t count, size_t es, bool in_place)
{
    size_t bytes = count * es;
    const char *auto_choice =
        bytes <= 16u * 1024 || count < (size_t)n || (n == 2 && bytes <= 1u << 20) ? "rd"
        : bytes <= ar_rab_max(n, in_place)                                        ? "rabenseifner"
                                                                                  : "ring";
    return algo_want("TERN_COLL_ALGO_ALLREDUCE", auto_choice);
}

#define ORDERS 4
static const char *const ORDER_NAMES[ORDERS] = {"rd", "rabenseifner", "ring", "reversed"};

/* Element i of the sum of x[0..n) (group ranks) as docs/collectives.md
 * "Determinism" says each algorithm forms it; "reversed" is (x[n-1] + ...)
 * + x[0], an order none uses, to show the inputs tell orders apart. */
static double ordered_sum(tern_dtype_t dt, const double *x, int n, size_t count, size_t i,
                          int order)
{
    double v[8];
    if (n == 1)
        return x[0];
    if (order == 2) { /* ring: chunk j starts at rank j+1, ends with x[j] */
        size_t q = count / (size_t)n, rem = count % (size_t)n, j = 0;
        while (j + 1 < (size_t)n && i >= (j + 1) * q + (j + 1 < rem ? j + 1 : rem))
            j++;
        double acc = x[(j + 1) % (size_t)n];
        for (int k = 2; k <= n; k++)
            acc = add_in(dt, acc, x[(j + (size_t)k) % (size_t)n]);
        return acc;
    }
    if (order == 3) {
        double acc = x[n - 1];
        for (int k = n - 2; k >= 0; k--)
            acc = add_in(dt, acc, x[k]);
        return acc;
    }
    /* rd and Rabenseifner: the extra ranks of a non-power of two folded in
     * pairwise (x[2j] + x[2j+1]), then a binary tree, lower rank's operand
     * first: partners at distance 1, 2, 4... (rd) or ..., 4, 2, 1 (rab). */
    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    int rem = n - p2;
    for (int j = 0; j < p2; j++)
        v[j] = j < rem ? add_in(dt, x[2 * j], x[2 * j + 1]) : x[j + rem];
    for (int k = 0, mask = order == 0 ? 1 : p2 / 2; k < 8 && mask > 0 && mask < p2; k++) {
        for (int j = 0; j < p2; j++)
            if (!(j & mask))
                v[j] = v[j | mask] = add_in(dt, v[j], v[j | mask]);
        mask = order == 0 ? mask * 2 : mask / 2;
    }
    return v[0];
}

static uint64_t fnv64(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/*
 * An all_reduce SUM of values whose sum depends on the order of addition:
 * (a) bit-identical on every rank (a 64-bit hash of the result, gathered);
 * (b) the same bits when called again; (c) exactly the sum in the order
 * docs/collectives.md gives for the algorithm this call takes; (d) f32 within
 * rounding of the exact sum.
 */
static void check_order(tern_group_t *g, tern_dtype_t dt, size_t count, bool in_place)
{
    int n = tern_group_size(g);
    size_t es = tern_dtype_size(dt), bytes = count * es;
    uint8_t *in = xmalloc(bytes), *out = xmalloc(bytes), *again = xmalloc(bytes),
            *cell = xmalloc(8);
    for (size_t i = 0; i < count; i++)
        put_exact(dt, in, i, wild(dt, rank, i));
    const char *algo = ar_algo(n, count, es, in_place);
    for (int round = 0; round < 2; round++) {
        uint8_t *dst = round == 0 ? out : again;
        if (in_place)
            memcpy(dst, in, bytes);
        OK(tern_all_reduce(g, in_place ? dst : in, dst, count, dt, TERN_SUM, NULL));
    }
    const char *dn = tern_dtype_name(dt);
    CHECK(memcmp(out, again, bytes) == 0, "all_reduce %s %zu (%s): a second call gave other bits",
          dn, count, algo);
    uint64_t h = fnv64(out, bytes), *hs = xmalloc(sizeof(uint64_t) * (size_t)n);
    OK(tern_all_gather(g, &h, hs, 1, TERN_DTYPE_I64, NULL));
    for (int r = 0; r < n; r++)
        CHECK(hs[r] == h, "all_reduce %s %zu (%s): rank %d's result differs from this rank's", dn,
              count, algo, tern_group_world_rank(g, r));
    int order = -1;
    for (int o = 0; o < ORDERS; o++)
        if (strcmp(algo, ORDER_NAMES[o]) == 0)
            order = o;
    CHECK(order >= 0, "unknown algorithm '%s'", algo);
    double x[8];
    size_t differs = 0;
    for (size_t i = 0; i < count; i++) {
        double exact = 0, mag = 0;
        for (int r = 0; r < n; r++) {
            x[r] = wild(dt, tern_group_world_rank(g, r), i);
            exact += x[r];
            mag += fabs(x[r]);
        }
        double want = ordered_sum(dt, x, n, count, i, order);
        put_exact(dt, cell, 0, want);
        if (memcmp(cell, out + i * es, es) != 0) {
            const char *matches = "none of them";
            double got = get(dt, out, i);
            for (int o = 0; o < ORDERS; o++) {
                put_exact(dt, cell, 0, ordered_sum(dt, x, n, count, i, o));
                if (memcmp(cell, out + i * es, es) == 0)
                    matches = ORDER_NAMES[o];
            }
            CHECK(false, "all_reduce %s %zu [%zu]: got %a, the %s order gives %a (orders that "
                  "give what came: %s)", dn, count, i, got, algo, want, matches);
        }
        for (int o = 0; o < ORDERS && !differs; o++)
            differs += ordered_sum(dt, x, n, count, i, o) != want;
        if (dt == TERN_DTYPE_F32) {
            double got = get(dt, out, i);
            CHECK(fabs(got - exact) <= ldexp(mag, -23) * n, "all_reduce f32 %zu [%zu]: %a, the "
                  "exact sum is %a", count, i, got, exact);
        }
    }
    /* The inputs must tell the orders apart, or (c) proves nothing. */
    CHECK(n < 3 || count < 1000 || differs > 0, "all_reduce %s %zu: every order gives the same "
          "sums", dn, count);
    free(in), free(out), free(again), free(cell), free(hs);
}

/* Sizes that take each algorithm by the automatic choice: rd up to 16 KiB,
 * Rabenseifner above, the ring above 1 MiB on sizes not a power of two (8
 * MiB for powers of two and pairs, 32 MiB over shared memory: with --big
 * only, 8 MiB and in place). The forced jobs (_alt: ring, _rd, _rab) run
 * every size with one algorithm. */
static void test_determinism(tern_group_t *g, bool big)
{
    int n = tern_group_size(g);
    if (n > 8)
        return;
    static const tern_dtype_t dts[] = {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16};
    for (size_t d = 0; d < 3; d++) {
        tern_dtype_t dt = dts[d];
        size_t es = tern_dtype_size(dt);
        check_order(g, dt, 1003, false);
        check_order(g, dt, 1003, true);
        check_order(g, dt, (256u << 10) / es + 1, false);
        if (ar_rab_max(n, false) <= 1u << 20 && d == 0)
            check_order(g, dt, (1u << 20) / es + 3, false);
    }
    if (big && ar_rab_max(n, true) <= 8u << 20)
        check_order(g, TERN_DTYPE_F32, (8u << 20) / 4 + 3, true);
}

/* ---- groups ---- */

/* The algorithm the last call named in its debug line ("<op> #N on group G:
 * ..., by <algo>"), written by the calling thread; other threads' lines
 * (warnings and up) go on to stderr. */
static char algo_seen[32];

static void algo_sink(tern_log_level_t level, int r, const char *msg, void *arg)
{
    (void)arg;
    const char *by = strstr(msg, ", by ");
    if (level == TERN_LOG_DEBUG && strstr(msg, " on group ") != NULL && by != NULL)
        snprintf(algo_seen, sizeof(algo_seen), "%s", by + 5);
    if (level <= TERN_LOG_WARN)
        fprintf(stderr, "[tern %d %s] %s\n", r, tern_log_level_name(level), msg);
}

/*
 * Every call names its algorithm at debug level, and it is the one the
 * override forces (the jobs that set TERN_COLL_ALGO_*) or the one the size
 * and the group pick (docs/collectives.md, "Algorithms"): so an override
 * that were ignored, or a threshold that moved, fails here rather than
 * passing unseen.
 */
static void test_algorithms(tern_group_t *g)
{
    int n = tern_group_size(g), me = tern_group_rank(g);
    size_t small = 256, large = 1u << 19; /* elements of f32: 1 KiB and 2 MiB */
    float *a = xmalloc(large * (size_t)n * sizeof(float)), *b = xmalloc(large * (size_t)n * sizeof(float));
    memset(a, 0, large * (size_t)n * sizeof(float));
    tern_log_level_t was = tern_log_get_level();
    tern_log_set_sink(algo_sink, NULL);
    tern_log_set_level(TERN_LOG_DEBUG);
#define SAW(call, want)                                                                        \
    do {                                                                                       \
        algo_seen[0] = '\0';                                                                   \
        OK(call);                                                                              \
        CHECK(strcmp(algo_seen, (want)) == 0, "%s took '%s', want '%s'", #call, algo_seen,    \
              (want));                                                                         \
    } while (0)
    SAW(tern_all_reduce(g, a, b, small, TERN_DTYPE_F32, TERN_SUM, NULL),
        ar_algo(n, small, sizeof(float), false));
    SAW(tern_broadcast(g, a, small, TERN_DTYPE_F32, 0, NULL),
        algo_want("TERN_COLL_ALGO_BROADCAST", "binomial"));
    SAW(tern_broadcast(g, a, large, TERN_DTYPE_F32, n - 1, NULL),
        algo_want("TERN_COLL_ALGO_BROADCAST", n <= 2 ? "binomial" : "chain"));
    SAW(tern_reduce(g, a, b, small, TERN_DTYPE_F32, TERN_SUM, 0, NULL),
        algo_want("TERN_COLL_ALGO_REDUCE", "binomial"));
    SAW(tern_reduce(g, a, b, large, TERN_DTYPE_F32, TERN_SUM, 0, NULL),
        algo_want("TERN_COLL_ALGO_REDUCE", "chain"));
    /* all_gather: by the total; Bruck up to 64 KiB. */
    SAW(tern_all_gather(g, a, b, 16, TERN_DTYPE_F32, NULL),
        algo_want("TERN_COLL_ALGO_ALLGATHER", "bruck"));
    SAW(tern_all_gather(g, a, b, large / 4, TERN_DTYPE_F32, NULL),
        algo_want("TERN_COLL_ALGO_ALLGATHER", "ring"));
    /* all_to_all: by the bytes per pair; all at once up to 256 KiB. */
    SAW(tern_all_to_all(g, a, b, small, TERN_DTYPE_F32, NULL),
        algo_want("TERN_COLL_ALGO_ALLTOALL", "linear"));
    SAW(tern_all_to_all(g, a, b, large / 2, TERN_DTYPE_F32, NULL),
        algo_want("TERN_COLL_ALGO_ALLTOALL", "pairwise"));
    SAW(tern_reduce_scatter(g, a, b, small, TERN_DTYPE_F32, TERN_SUM, NULL), "ring");
    SAW(tern_gather(g, a, me == 0 ? b : NULL, small, TERN_DTYPE_F32, 0, NULL), "linear");
    SAW(tern_scatter(g, me == 0 ? a : NULL, b, small, TERN_DTYPE_F32, 0, NULL), "linear");
    SAW(tern_barrier(g, NULL), "dissemination");
#undef SAW
    tern_log_set_level(was);
    tern_log_set_sink(NULL, NULL);
    free(a);
    free(b);
}

static void test_groups(void)
{
    int evens[8], odds[8], ne = 0, no = 0;
    for (int w = 0; w < world; w++) {
        if (w % 2 == 0)
            evens[ne++] = w;
        else
            odds[no++] = w;
    }
    /* Every rank creates every group, in the same order. */
    tern_group_t *E, *O = NULL, *C = NULL, *S;
    OK(tern_group_create(ctx, evens, (size_t)ne, &E));
    if (no > 0)
        OK(tern_group_create(ctx, odds, (size_t)no, &O));
    int last3[3] = {world - 1, 0, 1};
    if (world >= 3)
        OK(tern_group_create(ctx, last3, 3, &C)); /* overlaps both, listed out of order */
    int self[1] = {rank};
    (void)self;
    CHECK(tern_group_rank(E) == (rank % 2 == 0 ? rank / 2 : -1), "rank in evens %d",
          tern_group_rank(E));
    CHECK(tern_group_rank_of(E, 2) == (world > 2 ? 1 : -1), "rank_of");
    CHECK(tern_group_world_rank(E, 0) == 0 && tern_group_world_rank(E, ne) == -1, "world_rank");

    /* A non-member's call fails at once, naming the group. */
    tern_group_t *mine = rank % 2 == 0 ? E : O, *other = rank % 2 == 0 ? O : E;
    int x = 1;
    if (other != NULL) {
        CHECK(tern_all_reduce(other, &x, &x, 1, TERN_DTYPE_I32, TERN_SUM, NULL) ==
                  TERN_ERR_INVALID_PARAM && strstr(tern_last_error(), "not a member"),
              "non-member call");
    }
    /* Back to back on overlapping groups. */
    for (int round = 0; round < 3; round++) {
        check_all_reduce(mine, TERN_DTYPE_I64, TERN_SUM, 1003, round);
        if (C != NULL && tern_group_rank(C) >= 0)
            check_all_reduce(C, TERN_DTYPE_F32, TERN_MAX, 4097, round);
        check_all_reduce(W, TERN_DTYPE_I32, TERN_SUM, 7, round);
    }
    if (C != NULL && tern_group_rank(C) >= 0)
        run_suite(C, false);
    /* Concurrent non-blocking collectives on the world and a sub-group, both
     * in flight before either is waited on. */
    size_t cnt = 70000;
    float *a = xmalloc(cnt * 4), *b = xmalloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) {
        a[i] = (float)((rank + i) % 7);
        b[i] = (float)((rank * 3 + i) % 5);
    }
    tern_request_t *ra, *rb;
    OK(tern_all_reduce(W, a, a, cnt, TERN_DTYPE_F32, TERN_SUM, &ra));
    OK(tern_all_reduce(mine, b, b, cnt, TERN_DTYPE_F32, TERN_MAX, &rb));
    OK(tern_request_wait(rb, -1, NULL));
    OK(tern_request_wait(ra, -1, NULL));
    for (size_t i = 0; i < cnt; i++) {
        float wa = 0, wb = -1;
        for (int w = 0; w < world; w++) {
            wa += (float)((w + i) % 7);
            if (w % 2 == rank % 2 && (float)((w * 3 + i) % 5) > wb)
                wb = (float)((w * 3 + i) % 5);
        }
        CHECK(a[i] == wa && b[i] == wb, "concurrent [%zu]: %g/%g want %g/%g", i, a[i], b[i], wa, wb);
    }
    free(a);
    free(b);
    /* A world call behind 40 newer calls on a sub-group that cannot end
     * before it (the group's other members post theirs only after the world
     * call): each progress pass must still reach the older one (it reached
     * the 16 newest only, and the world call ran out TERN_TIMEOUT). */
    if (world >= 3) {
        enum { NEWER = 40 };
        tern_request_t *rw, *rs[NEWER];
        int v = rank, sum = -1;
        bool first = tern_group_rank(mine) == 0;
        OK(tern_all_reduce(W, &v, &sum, 1, TERN_DTYPE_I32, TERN_SUM, &rw));
        for (int i = 0; first && i < NEWER; i++)
            OK(tern_barrier(mine, &rs[i]));
        OK(tern_request_wait(rw, -1, NULL));
        CHECK(sum == world * (world - 1) / 2, "the world call behind %d newer: %d", NEWER, sum);
        for (int i = 0; !first && i < NEWER; i++)
            OK(tern_barrier(mine, &rs[i]));
        for (int i = 0; i < NEWER; i++)
            OK(tern_request_wait(rs[i], -1, NULL));
    }
    /* Every collective non-blocking at once on a sub-group, and sums whose
     * bits depend on the order on a group listed out of order. */
    test_nb_all(mine);
    if (C != NULL && tern_group_rank(C) >= 0)
        test_determinism(C, false);
    /* A group of one, and tern_group_create's argument checks. */
    OK(tern_group_create(ctx, self, 1, &S));
    run_suite(S, false);
    int dup[2] = {0, 0}, bad[1] = {world};
    tern_group_t *X;
    CHECK(tern_group_create(ctx, dup, world > 1 ? 2 : 1, &X) == (world > 1 ? TERN_ERR_INVALID_PARAM : TERN_OK),
          "duplicate ranks");
    if (world == 1)
        tern_group_destroy(X);
    CHECK(tern_group_create(ctx, bad, 1, &X) == TERN_ERR_INVALID_PARAM, "rank out of range");
    CHECK(tern_group_create(ctx, bad, 0, &X) == TERN_ERR_INVALID_PARAM, "empty group");
    tern_group_destroy(S);
    tern_group_destroy(C);
    tern_group_destroy(O);
    tern_group_destroy(E);
}

static void test_bad_args(void)
{
    float f[4] = {0};
    CHECK(tern_all_reduce(NULL, f, f, 1, TERN_DTYPE_F32, TERN_SUM, NULL) == TERN_ERR_INVALID_PARAM,
          "NULL group");
    CHECK(tern_all_reduce(W, f, f, 1, TERN_DTYPE_I32, TERN_AVG, NULL) == TERN_ERR_INVALID_PARAM,
          "avg of ints");
    CHECK(tern_all_reduce(W, f, f, 1, (tern_dtype_t)77, TERN_SUM, NULL) == TERN_ERR_INVALID_PARAM,
          "bad dtype");
    CHECK(tern_all_reduce(W, f, f + 1, 2, TERN_DTYPE_F32, TERN_SUM, NULL) == TERN_ERR_INVALID_PARAM,
          "partial overlap");
    CHECK(tern_all_reduce(W, (char *)f + 1, f + 2, 1, TERN_DTYPE_F32, TERN_SUM, NULL) ==
              TERN_ERR_INVALID_PARAM, "misaligned");
    CHECK(tern_all_reduce(W, NULL, f, 1, TERN_DTYPE_F32, TERN_SUM, NULL) == TERN_ERR_INVALID_PARAM,
          "NULL buffer");
    CHECK(tern_broadcast(W, f, 1, TERN_DTYPE_F32, world, NULL) == TERN_ERR_INVALID_PARAM,
          "root out of range");
    CHECK(tern_all_reduce(W, f, f, SIZE_MAX / 2, TERN_DTYPE_F32, TERN_SUM, NULL) ==
              TERN_ERR_OUT_OF_RANGE, "count overflow");
    /* Tensors: CUDA and strided tensors are refused; a good one works. */
    tern_tensor_t t, o;
    int64_t shape[2] = {2, 2};
    OK(tern_tensor_init(&t, f, TERN_DTYPE_F32, 2, shape, tern_device_cuda(0)));
    CHECK(tern_all_reduce_tensor(W, &t, TERN_SUM, NULL) == TERN_ERR_UNSUPPORTED, "cuda tensor");
    OK(tern_tensor_init(&t, f, TERN_DTYPE_F32, 2, shape, tern_device_cpu()));
    t.strides[0] = 1;
    t.strides[1] = 2;
    CHECK(tern_all_reduce_tensor(W, &t, TERN_SUM, NULL) == TERN_ERR_UNSUPPORTED, "strided tensor");
    for (int i = 0; i < 4; i++)
        f[i] = (float)(rank + i);
    OK(tern_tensor_init(&t, f, TERN_DTYPE_F32, 2, shape, tern_device_cpu()));
    OK(tern_all_reduce_tensor(W, &t, TERN_SUM, NULL));
    for (int i = 0; i < 4; i++)
        CHECK(f[i] == (float)(world * (world - 1) / 2 + world * i), "tensor all_reduce [%d]", i);
    /* all_gather_tensor: out must have world * numel(in) elements. */
    float *big = xmalloc(sizeof(float) * 4 * (size_t)world);
    int64_t oshape[1] = {4 * world}, bad_shape[1] = {4 * world + 1};
    OK(tern_tensor_init(&o, big, TERN_DTYPE_F32, 1, bad_shape, tern_device_cpu()));
    CHECK(tern_all_gather_tensor(W, &o, &t, NULL) == TERN_ERR_INVALID_PARAM, "all_gather shapes");
    OK(tern_tensor_init(&o, big, TERN_DTYPE_F32, 1, oshape, tern_device_cpu()));
    OK(tern_all_gather_tensor(W, &o, &t, NULL));
    CHECK(big[4 * world - 1] == f[3], "all_gather_tensor");
    /* reduce_scatter_tensor back: each rank gets world * f. */
    float back[4];
    int64_t bshape[1] = {4};
    tern_tensor_t bt;
    OK(tern_tensor_init(&bt, back, TERN_DTYPE_F32, 1, bshape, tern_device_cpu()));
    OK(tern_reduce_scatter_tensor(W, &bt, &o, TERN_SUM, NULL));
    for (int i = 0; i < 4; i++)
        CHECK(back[i] == world * big[rank * 4 + i], "reduce_scatter_tensor [%d]", i);
    free(big);
}

/* Log lines saying a destroyed group's leftovers were dropped. */
static atomic_int drops;

static void count_drops(tern_log_level_t level, int r, const char *msg, void *arg)
{
    (void)level;
    (void)r;
    (void)arg;
    if (strstr(msg, "is gone: dropped") != NULL)
        atomic_fetch_add(&drops, 1);
}

/* Mismatched counts between two ranks are reported as such, on both. */
static void test_mismatch(void)
{
    if (world < 2)
        return;
    int pair[2] = {0, 1};
    tern_group_t *P;
    OK(tern_group_create(ctx, pair, 2, &P));
    if (rank < 2) {
        float buf[16] = {0};
        tern_status_t st = tern_all_reduce(P, buf, buf, rank == 0 ? 8 : 9, TERN_DTYPE_F32, TERN_SUM,
                                           NULL);
        CHECK(st == TERN_ERR_MISMATCH, "mismatched counts gave %s", tern_status_name(st));
        CHECK(strstr(tern_last_error(), "all_reduce #0") != NULL, "error names the call");
        /* The group is unusable from now on, and says why. */
        st = tern_barrier(P, NULL);
        CHECK(st == TERN_ERR_MISMATCH && strstr(tern_last_error(), "earlier failure"),
              "broken group gave %s", tern_status_name(st));
    }
    tern_group_destroy(P);
    /* Calls whose messages have the same bytes and go eagerly: dtypes of one
     * size (f32 on rank 0, i32 on rank 1), and counts that a forced ring cuts
     * into segments of one size. Only the signature in each eager message
     * tells; without it the first returned OK with a sum of floats and ints. */
    struct {
        size_t count[2];
        tern_dtype_t dtype[2];
    } same_bytes[] = {{{4, 4}, {TERN_DTYPE_F32, TERN_DTYPE_I32}},
                      {{4, 4}, {TERN_DTYPE_I32, TERN_DTYPE_F32}}};
    for (size_t i = 0; i < sizeof(same_bytes) / sizeof(same_bytes[0]); i++) {
        OK(tern_group_create(ctx, pair, 2, &P));
        if (rank < 2) {
            int32_t buf[4] = {1, 2, 3, 4};
            tern_status_t st = tern_all_reduce(P, buf, buf, same_bytes[i].count[rank],
                                               same_bytes[i].dtype[rank], TERN_SUM, NULL);
            CHECK(st == TERN_ERR_MISMATCH, "%s on rank 0, %s on rank 1 gave %s",
                  tern_dtype_name(same_bytes[i].dtype[0]), tern_dtype_name(same_bytes[i].dtype[1]),
                  tern_status_name(st));
        }
        tern_group_destroy(P);
    }
}

/* Counts that differ across ranks with messages above the collectives' eager
 * limit (64 KiB by default), where a receive offers its buffer to the sender
 * (TERN_COLL_RTR, tcp): a sender larger than the offer (refused with
 * RTR_FAIL), and messages on both sides of the limit (the larger side waits
 * for an offer the smaller never makes, then offers its own buffer; the
 * smaller side's message withdraws the offer it met). Both ranks report
 * TERN_ERR_MISMATCH every time, and nothing hangs. */
static void test_mismatch_big(void)
{
    /* Forced algorithms and small segments cut these messages differently;
     * every message carries the call's signature, so each way is caught. */
    if (world < 2)
        return;
    /* f32 elements on ranks 0 and 1; a pair's Rabenseifner sends half. */
    static const size_t pairs[][2] = {{60000, 70000}, {70000, 60000}, {20000, 60000},
                                      {60000, 20000}};
    int pair[2] = {0, 1};
    float *buf = xmalloc(70000 * sizeof(float));
    memset(buf, 0, 70000 * sizeof(float));
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        tern_group_t *P;
        OK(tern_group_create(ctx, pair, 2, &P));
        if (rank < 2) {
            size_t count = pairs[i][rank];
            tern_status_t st = tern_all_reduce(P, buf, buf, count, TERN_DTYPE_F32, TERN_SUM, NULL);
            CHECK(st == TERN_ERR_MISMATCH, "counts %zu/%zu gave %s", pairs[i][0], pairs[i][1],
                  tern_status_name(st));
        }
        tern_group_destroy(P);
    }
    /* Counts whose ring chunks are both whole numbers of 512 KiB segments (16
     * and 17 MiB over a pair: 16 and 17 segments of equal size). Sizes cannot
     * tell; the call's signature in each rendezvous offer does. Without it
     * the rank with fewer returned OK and the other waited for TERN_TIMEOUT. */
    static const size_t ring_pairs[][2] = {{4u << 20, 17u << 18}, {17u << 18, 4u << 20}};
    float *big = xmalloc((17u << 18) * sizeof(float));
    memset(big, 0, (17u << 18) * sizeof(float));
    for (size_t i = 0; i < 2; i++) {
        tern_group_t *P;
        OK(tern_group_create(ctx, pair, 2, &P));
        if (rank < 2) {
            size_t count = ring_pairs[i][rank];
            tern_status_t st = tern_all_reduce(P, big, big, count, TERN_DTYPE_F32, TERN_SUM, NULL);
            CHECK(st == TERN_ERR_MISMATCH, "counts %zu/%zu gave %s", ring_pairs[i][0],
                  ring_pairs[i][1], tern_status_name(st));
        }
        tern_group_destroy(P);
    }
    /* Over shared memory a pair's all_reduce above 8 MiB takes the ring in
     * place and Rabenseifner out of place (api.c, rab_max): a pair mixing
     * the two forms runs different schedules, and the signature says so. */
    char prov[16];
    if (tern_ctx_transport(ctx, prov, sizeof(prov), NULL, 0) == TERN_OK &&
        strcmp(prov, "ucx") == 0 && getenv("UCX_TLS") != NULL &&
        strcmp(getenv("UCX_TLS"), "sm") == 0) {
        size_t n = 4u << 20;
        float *out = xmalloc(n * sizeof(float));
        tern_group_t *P;
        OK(tern_group_create(ctx, pair, 2, &P));
        if (rank < 2) {
            tern_status_t st = tern_all_reduce(P, big, rank == 0 ? big : out, n, TERN_DTYPE_F32,
                                               TERN_SUM, NULL);
            CHECK(st == TERN_ERR_MISMATCH, "16 MiB all_reduce, %s on rank %d: %s",
                  rank == 0 ? "in place" : "out of place", rank, tern_status_name(st));
        }
        tern_group_destroy(P);
        free(out);
    }
    free(big);
    /* A broadcast root sending more than a receiver expecting a message under
     * the limit: the root's send waits for an offer that never comes, then
     * offers its buffer after 50 ms, and the receiver reports the truncation
     * (the root's send hears it too). Nobody else has anything to report, so
     * without that fallback this would run into TERN_TIMEOUT. With small
     * segments (TERN_COLL_SEGMENT) the root's sends all go eagerly and are
     * complete as they are posted, so the root returns OK before the
     * receiver's ABORT comes, as an MPI root would: only the receiver can
     * report then. */
    tern_group_t *P;
    OK(tern_group_create(ctx, pair, 2, &P));
    if (rank < 2) {
        bool root_may_finish = rank == 0 && getenv("TERN_COLL_SEGMENT") != NULL;
        tern_status_t st = tern_broadcast(P, buf, rank == 0 ? 30000 : 10000, TERN_DTYPE_F32, 0,
                                          NULL);
        CHECK(st == TERN_ERR_MISMATCH || (root_may_finish && st == TERN_OK),
              "broadcast of 120000 bytes into 40000 gave %s", tern_status_name(st));
        /* A root that finished sent all 30 segments; the receiver failed at
         * the first, so the rest wait in its queue, and go with the group.
         * The root's word comes on the same stream, after them. */
        int32_t root_ok = st == TERN_OK;
        if (rank == 0)
            OK(tern_send(ctx, &root_ok, sizeof(root_ok), 1, 77));
        else
            OK(tern_recv(ctx, &root_ok, sizeof(root_ok), 0, 77, NULL));
        if (rank == 1) {
            tern_log_level_t was = tern_log_get_level();
            drops = 0;
            tern_log_set_sink(count_drops, NULL);
            tern_log_set_level(TERN_LOG_DEBUG);
            tern_group_destroy(P);
            tern_log_set_level(was);
            tern_log_set_sink(NULL, NULL);
            P = NULL;
            CHECK(!root_ok || drops == 1, "destroying the group dropped what its root sent after "
                  "the failure: %d log lines say so", drops);
        }
    }
    tern_group_destroy(P);
    free(buf);
    /* The world group still works after all that. */
    OK(tern_barrier(W, NULL));
}

/* A ring's receives from one peer that wait for the read window when the
 * first one shows the counts differ: the waiting ones are withdrawn
 * (tern__p2p_cancel), their senders told, and nothing of the failed call
 * reaches the next one. */
static void test_mismatch_window(void)
{
    int pair[2] = {0, 1};
    size_t big = 1100000;
    float *a = xmalloc(big * sizeof(float)), *b = xmalloc(big * sizeof(float));
    for (size_t i = 0; i < big; i++)
        a[i] = (float)((rank + i) % 7);
    tern_group_t *P;
    OK(tern_group_create(ctx, pair, 2, &P));
    for (int round = 0; round < 4 && rank < 2; round++) {
        size_t count = (size_t)(rank == round % 2 ? 1000000 : 1100000);
        tern_status_t st = tern_all_reduce(P, a, b, count, TERN_DTYPE_F32, TERN_SUM, NULL);
        CHECK(st == TERN_ERR_MISMATCH, "round %d: count %zu gave %s", round, count,
              tern_status_name(st));
    }
    tern_group_destroy(P);
    OK(tern_group_create(ctx, pair, 2, &P));
    if (rank < 2) {
        OK(tern_all_reduce(P, a, b, big, TERN_DTYPE_F32, TERN_SUM, NULL));
        for (size_t i = 0; i < big; i++) {
            float want = (float)(i % 7) + (float)((1 + i) % 7);
            CHECK(b[i] == want, "all_reduce after the mismatches [%zu]: %g want %g", i, b[i], want);
        }
    }
    tern_group_destroy(P);
    free(a);
    free(b);
    OK(tern_barrier(W, NULL));
}

static void test_big(void)
{
    size_t count = (64u << 20) / 4;
    float *a = xmalloc(count * 4), *b = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        a[i] = (float)((rank + i) % 9);
    OK(tern_all_reduce(W, a, b, count, TERN_DTYPE_F32, TERN_SUM, NULL));
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int w = 0; w < world; w++)
            want += (float)((w + i) % 9);
        CHECK(b[i] == want, "64 MiB all_reduce [%zu]: %g want %g", i, b[i], want);
    }
    size_t per = count / (size_t)world;
    OK(tern_reduce_scatter(W, a, b, per, TERN_DTYPE_F32, TERN_MAX, NULL));
    for (size_t i = 0; i < per; i++) {
        float want = 0;
        for (int w = 0; w < world; w++)
            want = fmaxf(want, (float)((w + (size_t)rank * per + i) % 9));
        CHECK(b[i] == want, "64 MiB reduce_scatter [%zu]", i);
    }
    /* The gathered blocks, sampled: every 4099th element and the first and
     * last of each block. */
    memset(a, 0xff, count * 4); /* NaN: nothing stale can pass */
    OK(tern_all_gather(W, b, a, per, TERN_DTYPE_F32, NULL));
    for (int r = 0; r < world; r++) {
        for (size_t i = 0; i < per; i = i + 4099 < per || i == per - 1 ? i + 4099 : per - 1) {
            float want = 0;
            for (int w = 0; w < world; w++)
                want = fmaxf(want, (float)((w + (size_t)r * per + i) % 9));
            CHECK(a[(size_t)r * per + i] == want, "64 MiB all_gather block %d [%zu]: %g want %g",
                  r, i, a[(size_t)r * per + i], want);
        }
    }
    /* A broadcast of what only the root holds (the all_gather left the same
     * bytes everywhere), sampled likewise, with the edges of each 512 KiB
     * segment of the chain. */
    int root = world - 1;
    if (rank == root)
        for (size_t i = 0; i < count; i++)
            a[i] = (float)((i * 7 + 3) % 1000) - 500;
    else
        memset(a, 0xff, count * 4);
    OK(tern_broadcast(W, a, count, TERN_DTYPE_F32, root, NULL));
    for (size_t i = 0; i < count; i = i + 4099 < count || i == count - 1 ? i + 4099 : count - 1)
        CHECK(a[i] == (float)((i * 7 + 3) % 1000) - 500, "64 MiB broadcast [%zu]: %g", i, a[i]);
    for (size_t s = 0; s < count; s += (512u << 10) / 4) {
        CHECK(a[s] == (float)((s * 7 + 3) % 1000) - 500, "64 MiB broadcast [%zu]: %g", s, a[s]);
        size_t e = s + (512u << 10) / 4 - 1 < count ? s + (512u << 10) / 4 - 1 : count - 1;
        CHECK(a[e] == (float)((e * 7 + 3) % 1000) - 500, "64 MiB broadcast [%zu]: %g", e, a[e]);
    }
    free(a);
    free(b);
}

/* The ranks an error names as the cause, as a mask of world ranks. The
 * error must read "<op> #<seq> on group <g> failed: <cause>", or, relayed,
 * "<op> #<seq> on group <g> failed: rank <x> reported: <op> #<seq> on group
 * <g> failed: <cause>" (*reporter = x, else -1), naming call #seq of one
 * group; the cause names ranks as "rank R" or "rank(s) R, S". 0 when the
 * error is not of that form or names no rank. */
static unsigned blamed_ranks(const char *p);

static unsigned blamed(const char *why, const char *op, int seq, int *reporter)
{
    char pre[64];
    size_t len = (size_t)snprintf(pre, sizeof(pre), "%s #%d on group ", op, seq);
    const char *p = why;
    long group = -1;
    *reporter = -1;
    for (int level = 0; level < 2; level++) {
        char *end;
        if (strncmp(p, pre, len) != 0)
            return 0;
        long gid = strtol(p + len, &end, 10);
        if (end == p + len || (group >= 0 && gid != group) || strncmp(end, " failed: ", 9) != 0)
            return 0;
        group = gid;
        p = end + 9;
        int x = -1, used = 0;
        if (level > 0 || sscanf(p, "rank %d reported: %n", &x, &used) != 1 || used == 0)
            break;
        *reporter = x;
        p += used;
    }
    return blamed_ranks(p);
}

/* The ranks text names as "rank R" or "rank(s) R, S", as a mask. */
static unsigned blamed_ranks(const char *p)
{
    unsigned mask = 0;
    for (size_t at = 0; (p = strstr(p + at, "rank")) != NULL; at = 4) {
        size_t i = 4;
        bool list = strncmp(p + i, "(s)", 3) == 0;
        i += list ? 3 : 0;
        while (p[i] == ' ' && isdigit((unsigned char)p[i + 1])) {
            long v = strtol(p + i + 1, NULL, 10);
            mask |= v >= 0 && v < 32 ? 1u << v : 1u << 31;
            for (i++; isdigit((unsigned char)p[i]); i++)
                ;
            if (!list || p[i] != ',')
                break;
            i++; /* ", " then the next number */
        }
    }
    return mask;
}

/* The last rank leaves (dies, or stops calling) after its third call; the
 * others must get an error naming the call, its number, and the rank that
 * left, within the timeout. A rank that dies can take its last sends with it
 * (a send completes once its buffer is reusable, not once it is delivered),
 * so the survivors may fail in the victim's last call (#2) rather than the
 * next one: both are right, and the error must name whichever failed. #0 and
 * #1 cannot fail: the victim finishing #2 proves its partners finished #1.
 * The survivors then compare notes over p2p, and none leaves before all have
 * their error: one that left would be a lost rank the others could rightly
 * name. */
static int test_failure(bool die, size_t count, bool strict)
{
    enum { NOTE_TAG = 93 };
    int victim = world - 1;
    int *x = xmalloc(count * sizeof(int));
    memset(x, 0, count * sizeof(int));
    if (rank == victim) {
        for (int i = 0; i < 3; i++)
            OK(tern_all_reduce(W, x, x, count, TERN_DTYPE_I32, TERN_SUM, NULL));
        if (die)
            _exit(0); /* no finalize: the connections just close */
        sleep(9);
        _exit(0);
    }
    uint64_t t0 = 0;
    tern_status_t st = TERN_OK;
    int failed = -1;
    for (int i = 0; i < 6; i++) {
        if (i == 2)
            t0 = tern_clock_ns();
        st = tern_all_reduce(W, x, x, count, TERN_DTYPE_I32, TERN_SUM, NULL);
        if (st != TERN_OK) {
            failed = i;
            break;
        }
    }
    double secs = (double)(tern_clock_ns() - t0) / 1e9;
    char why[512];
    snprintf(why, sizeof(why), "%s", tern_last_error());
    printf("rank %d: call #%d: %s after %.2f s: %s\n", rank, failed, tern_status_name(st), secs,
           why);
    CHECK(failed == 2 || failed == 3, "failed in call #%d, want #2 or #3", failed);
    CHECK(st == TERN_ERR_PEER_LOST || st == TERN_ERR_TIMEOUT, "status %s", tern_status_name(st));
    /* A relayed timeout ends with the ranks this one waits on itself. */
    int reporter;
    uint32_t own = 0;
    char *mine = strstr(why, "; this rank waits on rank(s) ");
    if (mine != NULL) {
        own = blamed_ranks(mine + 2);
        *mine = '\0';
    }
    uint32_t mask = blamed(why, "all_reduce", failed, &reporter);
    CHECK(own == 0 || (reporter >= 0 && !die), "own waits in an error not a relayed timeout: %s",
          why);
    CHECK(mask != 0, "the error names call all_reduce #%d and a rank: %s", failed, why);
    CHECK(reporter < 0 || (reporter != rank && reporter < victim), "relayed from rank %d: %s",
          reporter, why);
    CHECK(secs < 12, "failed only after %.1f s (TERN_TIMEOUT is 5s in this test)", secs);
    /* Compare notes: what each error blames, and whose report it was. */
    int32_t note[3] = {(int32_t)mask, reporter, (int32_t)own}, notes[32][3], bye = 1, byes[32];
    tern_request_t *q[32];
    for (int r = 0; r < victim; r++)
        if (r != rank)
            OK(tern_isend(ctx, note, sizeof(note), r, NOTE_TAG, &q[r]));
    for (int r = 0; r < victim; r++)
        if (r != rank)
            OK(tern_recv(ctx, notes[r], sizeof(notes[r]), r, NOTE_TAG, NULL));
    for (int r = 0; r < victim; r++)
        if (r != rank)
            OK(tern_request_wait(q[r], -1, NULL));
    /* Everyone has every note once a rank has every other's word that it
     * has them; that word may be lost as its sender leaves (a send is done
     * once its buffer is free, not once it is delivered), which is fine. */
    for (int r = 0; r < victim; r++)
        if (r != rank)
            OK(tern_isend(ctx, &bye, sizeof(bye), r, NOTE_TAG + 1, &q[r]));
    for (int r = 0; r < victim; r++)
        if (r != rank)
            (void)tern_recv(ctx, &byes[r], sizeof(byes[r]), r, NOTE_TAG + 1, NULL);
    for (int r = 0; r < victim; r++)
        if (r != rank)
            (void)tern_request_wait(q[r], -1, NULL);
    notes[rank][0] = (int32_t)mask;
    notes[rank][1] = reporter;
    notes[rank][2] = (int32_t)own;
    uint32_t v = 1u << victim, others = (v - 1) & ~(1u << rank);
    if (die) {
        /* A lost connection is seen at once by the victim's partners, whose
         * reports reach the rest long before any timer runs out. */
        CHECK(mask == v, "the error blames rank mask 0x%x, want only rank %d, which died: %s",
              mask, victim, why);
    } else if (reporter < 0) {
        /* Timers alone notice a rank that stopped calling, and they run
         * alike everywhere: the victim's partners in this 4-element call
         * (recursive doubling: rank ^ 1, rank ^ 2...) name it; a rank that
         * waits on one of them may time out on its own first and name that
         * one, never itself or the victim. */
        unsigned d = (unsigned)(rank ^ victim);
        bool partner = (world & (world - 1)) == 0 && (d & (d - 1)) == 0;
        CHECK(partner ? mask == v : (mask & ~others) == 0, "the error blames rank mask 0x%x, want "
              "%s: %s", mask, partner ? "only the rank that hung, its partner" :
              "only ranks it waits on", why);
    } else {
        /* A relayed report is the reporter's own error (never relayed again). */
        CHECK(notes[reporter][1] < 0 && (uint32_t)notes[reporter][0] == mask, "relayed rank %d's "
              "report blaming 0x%x, but its own error blames 0x%x (reporter %d): %s", reporter,
              mask, (unsigned)notes[reporter][0], notes[reporter][1], why);
        /* The ranks it waits on itself: the victim or ranks waiting on it. */
        CHECK((own & ~(others | v)) == 0, "waits on rank mask 0x%x, itself or beyond the others: %s",
              own, why);
    }
    /* Some rank names the victim, whether it died or hung: when the first
     * rank to time out waits on a partner of the victim, its report reaches
     * the partners before their own timers run out, and they pass it on,
     * adding the ranks they wait on themselves (the victim). With
     * --hang-strict, no rank's own cause names itself either. */
    int naming = 0;
    for (int r = 0; r < victim; r++)
        naming += (uint32_t)notes[r][0] == v || ((uint32_t)notes[r][2] & v) != 0;
    CHECK(naming > 0, "no rank's error names rank %d, which %s", victim, die ? "died" : "hung");
    CHECK(!strict || !((reporter < 0 ? mask : own) & 1u << rank), "this rank's error blames itself: %s",
          why);
    fflush(stdout);
    _exit(0); /* finalize would wait for the victim */
}

/* Log lines of a send that waited in vain for its receiver's offer, and of
 * eager messages dropped for exceeding their credit; warnings and errors
 * still go to stderr. */
static atomic_int offer_waits, credit_drops;

static void count_terms(tern_log_level_t level, int r, const char *msg, void *arg)
{
    (void)arg;
    if (strstr(msg, "offered no buffer") != NULL)
        atomic_fetch_add(&offer_waits, 1);
    if (strstr(msg, "beyond its credit") != NULL)
        atomic_fetch_add(&credit_drops, 1);
    if (level <= TERN_LOG_WARN)
        fprintf(stderr, "[tern %d %s] %s\n", r, tern_log_level_name(level), msg);
}

static void test_terms(void)
{
    enum { N = 200, S = 8192, FLOOD_TAG = 77 };
    tern_log_level_t level = tern_log_get_level();
    tern_log_set_sink(count_terms, NULL);
    tern_log_set_level(TERN_LOG_DEBUG);
    run_suite(W, true);
    /* Rank 0 floods rank 1, whose credit is the smallest, before it receives:
     * every send that does not fit rank 1's credit must go by rendezvous. */
    uint8_t *buf = xmalloc((size_t)N * S);
    if (rank == 0) {
        tern_request_t *q[N];
        for (int i = 0; i < N; i++) {
            memset(buf + (size_t)i * S, i, S);
            OK(tern_isend(ctx, buf + (size_t)i * S, S, 1, FLOOD_TAG, &q[i]));
        }
        for (int i = 0; i < N; i++)
            OK(tern_request_wait(q[i], -1, NULL));
    } else if (rank == 1) {
        usleep(300 * 1000); /* the sends are all posted by now */
        for (int i = 0; i < N; i++) {
            uint8_t *m = buf + (size_t)i * S;
            OK(tern_recv(ctx, m, S, 0, FLOOD_TAG, NULL));
            for (size_t j = 0; j < S; j++)
                CHECK(m[j] == (uint8_t)i, "flood message %d byte %zu: %u", i, j, m[j]);
        }
    }
    free(buf);
    OK(tern_barrier(W, NULL));
    tern_log_set_sink(NULL, NULL);
    tern_log_set_level(level);
    int waits = atomic_load(&offer_waits), drops = atomic_load(&credit_drops);
    CHECK(drops == 0, "%d eager messages dropped for exceeding their credit", drops);
    /* A pair whose ends disagree waits 50 ms on every such message: hundreds
     * in this suite. A receiver late by 50 ms on a loaded host is rare. */
    CHECK(waits <= 5, "%d sends waited in vain for their receiver's offer", waits);
    if (waits > 0)
        printf("rank %d: %d sends waited for an offer (a late receiver)\n", rank, waits);
}

/* The choices of way the calling thread's calls logged ("calls of signature
 * S now put W from call N"), as "W@N;" in order. */
static char ways_seen[512];

static void way_sink(tern_log_level_t level, int r, const char *msg, void *arg)
{
    (void)arg;
    const char *at = strstr(msg, " now put ");
    if (level == TERN_LOG_DEBUG && strncmp(msg, "coll: calls of signature ", 25) == 0 && at != NULL) {
        const char *from = strstr(at, " from call ");
        size_t used = strlen(ways_seen);
        if (from != NULL)
            snprintf(ways_seen + used, sizeof(ways_seen) - used, "%.*s@%s;",
                     (int)(from - at - 9), at + 9, from + 11);
    }
    if (level <= TERN_LOG_WARN)
        fprintf(stderr, "[tern %d %s] %s\n", r, tern_log_level_name(level), msg);
}

/*
 * The puts' way over tcp (docs/collectives.md, "How the puts go"): the seed
 * blocks (calls 0-3 and 8-11 copied, 4-7 and 12-15 by reference) are made to
 * look opposite to rank 0 and to the others. The others sleep before
 * starting each copied call, so rank 0's copied calls wait for them; rank 0
 * sleeps before each by reference, so theirs wait for it. Rank 0 then
 * chooses by reference, and every other member would choose copying on its
 * own clock; each must take rank 0's choice, from call 16 + TERN__WAY_LAG
 * (4), and any later one at the same call as rank 0. Run on the world and on
 * the world reversed, whose rank 0 is the last world rank.
 */
static void test_way_on(tern_group_t *g)
{
    const int me = tern_group_rank(g), n = tern_group_size(g);
    const size_t count = 64u << 10; /* 256 KiB of f32: puts, and above put_way_min */
    float *in = xmalloc(count * sizeof(float)), *out = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        in[i] = (float)(tern_group_world_rank(g, me) + 1) * (float)(i % 7);
    const float ranks_sum = (float)(n * (n + 1) / 2);
    ways_seen[0] = '\0';
    tern_log_level_t was = tern_log_get_level();
    tern_log_set_sink(way_sink, NULL);
    tern_log_set_level(TERN_LOG_DEBUG);
    for (int i = 0; i < 64; i++) {
        bool by_ref = i < 16 && (i / 4) % 2 == 1;
        /* 20 ms: a 3 ms sleep lost to the scheduler (3 ranks, a core kept
         * busy beside them) in one run of 40 */
        if (i < 16 && by_ref == (me == 0))
            usleep(20000);
        OK(tern_all_reduce(g, in, out, count, TERN_DTYPE_F32, TERN_SUM, NULL));
        for (size_t k = 0; k < count; k += 4099)
            CHECK(out[k] == ranks_sum * (float)(k % 7), "call %d: element %zu is %g", i, k,
                  (double)out[k]);
    }
    tern_log_set_level(was);
    tern_log_set_sink(NULL, NULL);
    CHECK(strncmp(ways_seen, "by reference@20;", 16) == 0,
          "group rank %d took '%s', want by reference from call 20 first", me, ways_seen);
    char mine[sizeof(ways_seen)] = {0};
    memcpy(mine, ways_seen, strlen(ways_seen));
    same_everywhere(g, mine, sizeof(mine), "the ways taken");
    if (me == 0)
        printf("group of %d led by world rank %d: %s\n", n, tern_group_world_rank(g, 0), mine);
    free(in);
    free(out);
}

static void test_way(void)
{
    test_way_on(W);
    int rev[64];
    CHECK(world <= 64, "at most 64 ranks");
    for (int r = 0; r < world; r++)
        rev[r] = world - 1 - r;
    tern_group_t *g;
    OK(tern_group_create(ctx, rev, (size_t)world, &g));
    test_way_on(g);
    tern_group_destroy(g);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern_init: %s\n", tern_last_error());
        return 1;
    }
    rank = (int)tern_ctx_rank(ctx);
    world = (int)tern_ctx_world_size(ctx);
    W = tern_group_world(ctx);
    CHECK(W != NULL && tern_group_size(W) == world && tern_group_rank(W) == rank, "world group");
    char prov[16], dev[128];
    OK(tern_ctx_transport(ctx, prov, sizeof(prov), dev, sizeof(dev)));
    if (rank == 0)
        printf("collectives over %s (%s), %d ranks, mode '%s'\n", prov, dev, world, mode);

    if (strcmp(mode, "--die") == 0 || strcmp(mode, "--hang") == 0)
        return test_failure(strcmp(mode, "--die") == 0, 4, false);
    if (strcmp(mode, "--hang-strict") == 0)
        return test_failure(false, 4, true);
    if (strcmp(mode, "--die-big") == 0)
        return test_failure(true, 1u << 18, false); /* 1 MiB: messages above the eager limit */
    if (strcmp(mode, "--terms") == 0) {
        test_terms();
        printf("rank %d ok (%lu checks)\n", rank, atomic_load(&checks));
        return tern_finalize(ctx) == TERN_OK ? 0 : 1;
    }
    if (strcmp(mode, "--way") == 0) {
        test_way();
        printf("rank %d ok (%lu checks)\n", rank, atomic_load(&checks));
        return tern_finalize(ctx) == TERN_OK ? 0 : 1;
    }
    if (strcmp(mode, "--mismatch-window") == 0) {
        test_mismatch_window();
        printf("rank %d ok (%lu checks)\n", rank, atomic_load(&checks));
        return tern_finalize(ctx) == TERN_OK ? 0 : 1;
    }
    run_suite(W, true);
    test_bad_args();
    test_nb_all(W);
    test_request_test();
    test_tensor_colls(W);
    test_determinism(W, strcmp(mode, "--big") == 0);
    test_algorithms(W);
    test_groups();
    test_mismatch();
    test_mismatch_big();
    if (strcmp(mode, "--big") == 0)
        test_big();
    OK(tern_barrier(W, NULL));
    /* A group kept past tern_finalize may still be destroyed; calls on it
     * fail (the sanitizer jobs would catch a touch of the freed context). */
    int all[1] = {0};
    tern_group_t *late;
    OK(tern_group_create(ctx, all, 1, &late));
    if (tern_finalize(ctx) != TERN_OK) {
        fprintf(stderr, "rank %d: finalize: %s\n", rank, tern_last_error());
        return 1;
    }
    int one = 1;
    CHECK(tern_all_reduce(late, &one, &one, 1, TERN_DTYPE_I32, TERN_SUM, NULL) ==
              TERN_ERR_INVALID_PARAM,
          "a call on a group after finalize: %s", tern_last_error());
    CHECK(strstr(tern_last_error(), "finalized") != NULL, "the error says why");
    tern_group_destroy(late);
    printf("rank %d ok (%lu checks)\n", rank, atomic_load(&checks));
    return 0;
}
