/*
 * tern-reduce-bench: how fast the reduction kernels run, next to memcpy of the
 * same bytes in the same run, on the calling thread and split over a pool.
 *
 * Each measurement is dst = dst op src (the in-place form the collectives
 * use) over one buffer size; GB/s is the bytes of one input buffer divided by
 * the median time of --reps runs, after one untimed run that faults the pages
 * in. memcpy copies the same number of bytes from src to dst. The buffers hold
 * ones, so sums grow slowly, products stay 1 and nothing reaches a subnormal
 * or an inf (which would measure the FPU's slow paths, not the kernels).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/clock.h>
#include <tern/pool.h>
#include <tern/tensor.h>

#include "core/config.h"
#include "perf/stats.h"
#include "tensor/reduce.h"

#define MAX_SIZES 16

typedef struct opts {
    size_t sizes[MAX_SIZES];
    unsigned nsizes;
    bool dtype_on[TERN_DTYPE_COUNT];
    bool op_on[TERN_REDUCE_OP_COUNT];
    unsigned reps;
    unsigned threads;
    bool portable;
} opts_t;

/* The buffers of one size, shared by every dtype x op. */
typedef struct bufs {
    void *dst, *src;
    size_t bytes;
} bufs_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: tern-reduce-bench [options]\n"
               "  --size LIST      bytes of one buffer, multiples of 8, comma-separated\n"
               "                   (default 4M,64M)\n"
               "  --dtype LIST     dtypes to run, e.g. f32,bf16 (default all)\n"
               "  --op LIST        sum,prod,max,min,avg (default all but avg, which is sum)\n"
               "  --reps N         timed runs per cell, the median is shown (default 11)\n"
               "  --threads N      pool threads for the parallel column; 0 or 1: none "
               "(default 2)\n"
               "  --portable       use the portable kernels even where F16C/AVX2 exist\n");
}

/* Apply fn to each item of a comma-separated list; false at the first item fn
 * rejects (fn has printed why). */
static bool each_item(const char *list, bool (*fn)(const char *item, opts_t *o), opts_t *o)
{
    char buf[256];
    char *save = NULL;
    if (strlen(list) >= sizeof(buf)) {
        fprintf(stderr, "tern-reduce-bench: list too long: %s\n", list);
        return false;
    }
    strcpy(buf, list);
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save))
        if (!fn(item, o))
            return false;
    return true;
}

static bool add_size(const char *item, opts_t *o)
{
    uint64_t v;
    if (tern__parse_size(item, &v) != TERN_OK || v == 0 || v % 8 != 0 || v > SIZE_MAX / 2) {
        fprintf(stderr, "tern-reduce-bench: bad size '%s' (a multiple of 8 bytes, so every "
                        "dtype fills it)\n", item);
        return false;
    }
    if (o->nsizes == MAX_SIZES) {
        fprintf(stderr, "tern-reduce-bench: at most %d sizes\n", MAX_SIZES);
        return false;
    }
    o->sizes[o->nsizes++] = (size_t)v;
    return true;
}

static bool add_dtype(const char *item, opts_t *o)
{
    tern_dtype_t d;
    if (tern_dtype_parse(item, &d) != TERN_OK) {
        fprintf(stderr, "tern-reduce-bench: %s\n", tern_last_error());
        return false;
    }
    o->dtype_on[d] = true;
    return true;
}

static bool add_op(const char *item, opts_t *o)
{
    tern_reduce_op_t op;
    if (tern_reduce_op_parse(item, &op) != TERN_OK) {
        fprintf(stderr, "tern-reduce-bench: %s\n", tern_last_error());
        return false;
    }
    o->op_on[op] = true;
    return true;
}

static bool parse_uint(const char *s, unsigned max, unsigned *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v > max) {
        fprintf(stderr, "tern-reduce-bench: bad number '%s'\n", s);
        return false;
    }
    *out = (unsigned)v;
    return true;
}

static bool any(const bool *on, int n)
{
    for (int i = 0; i < n; i++)
        if (on[i])
            return true;
    return false;
}

/* Defaults for what the command line left out. */
static void fill_defaults(opts_t *o)
{
    if (o->nsizes == 0) {
        o->sizes[o->nsizes++] = 4u << 20;
        o->sizes[o->nsizes++] = 64u << 20;
    }
    if (!any(o->dtype_on, TERN_DTYPE_COUNT))
        for (int d = 0; d < TERN_DTYPE_COUNT; d++)
            o->dtype_on[d] = true;
    if (!any(o->op_on, TERN_REDUCE_OP_COUNT))
        for (int op = 0; op < TERN_REDUCE_OP_COUNT; op++)
            o->op_on[op] = op != TERN_AVG;
}

/* 0 to go on, 1 for an error, 2 for --help (exit 0). */
static int parse_args(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->reps = 11;
    o->threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
            return 2;
        if (strcmp(arg, "--portable") == 0) {
            o->portable = true;
            continue;
        }
        if (val == NULL) {
            fprintf(stderr, "tern-reduce-bench: %s needs a value\n", arg);
            return 1;
        }
        i++;
        if (strcmp(arg, "--size") == 0)
            ok = each_item(val, add_size, o);
        else if (strcmp(arg, "--dtype") == 0)
            ok = each_item(val, add_dtype, o);
        else if (strcmp(arg, "--op") == 0)
            ok = each_item(val, add_op, o);
        else if (strcmp(arg, "--reps") == 0)
            ok = parse_uint(val, 100000, &o->reps) && o->reps > 0;
        else if (strcmp(arg, "--threads") == 0)
            ok = parse_uint(val, 1024, &o->threads);
        else {
            fprintf(stderr, "tern-reduce-bench: unknown option %s\n", arg);
            ok = false;
        }
        if (!ok)
            return 1;
    }
    fill_defaults(o);
    return 0;
}

static uint64_t median(uint64_t *v, unsigned n)
{
    tern_bench_sort_u64(v, n);
    return v[n / 2];
}

static double gbps(size_t bytes, uint64_t ns)
{
    return ns == 0 ? 0.0 : (double)bytes / (double)ns;
}

/* One in the dtype's representation, in every element. */
static void fill_ones(tern_dtype_t dtype, void *buf, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        switch (dtype) {
        case TERN_DTYPE_F16:
            ((uint16_t *)buf)[i] = 0x3c00;
            break;
        case TERN_DTYPE_BF16:
            ((uint16_t *)buf)[i] = 0x3f80;
            break;
        case TERN_DTYPE_F32:
            ((float *)buf)[i] = 1.0f;
            break;
        case TERN_DTYPE_F64:
            ((double *)buf)[i] = 1.0;
            break;
        case TERN_DTYPE_I16:
            ((int16_t *)buf)[i] = 1;
            break;
        case TERN_DTYPE_I32:
            ((int32_t *)buf)[i] = 1;
            break;
        case TERN_DTYPE_I64:
            ((int64_t *)buf)[i] = 1;
            break;
        default: /* the one-byte types */
            ((uint8_t *)buf)[i] = 1;
            break;
        }
    }
}

typedef struct cell {
    tern_reduce_op_t op;
    tern_dtype_t dtype;
    size_t count;
} cell_t;

/* Median ns of dst = dst op src, on this thread (pool NULL) or over pool.
 * 0 when the call fails (it has printed why). */
static uint64_t time_reduce(const bufs_t *b, const cell_t *c, tern_pool_t *pool, unsigned reps,
                            uint64_t *samples)
{
    for (unsigned r = 0; r <= reps; r++) {
        uint64_t t0 = tern_clock_ns();
        tern_status_t st = pool ? tern__reduce_par(pool, c->op, c->dtype, b->dst, b->dst, b->src,
                                                   c->count)
                                : tern__reduce(c->op, c->dtype, b->dst, b->dst, b->src, c->count);
        if (st != TERN_OK) {
            fprintf(stderr, "tern-reduce-bench: %s\n", tern_last_error());
            return 0;
        }
        if (r > 0)
            samples[r - 1] = tern_clock_ns() - t0;
    }
    return median(samples, reps);
}

static uint64_t time_memcpy(const bufs_t *b, unsigned reps, uint64_t *samples)
{
    for (unsigned r = 0; r <= reps; r++) {
        uint64_t t0 = tern_clock_ns();
        memcpy(b->dst, b->src, b->bytes);
        if (r > 0)
            samples[r - 1] = tern_clock_ns() - t0;
    }
    return median(samples, reps);
}

static void size_label(size_t bytes, char *buf, size_t cap)
{
    if (bytes % (1u << 20) == 0)
        snprintf(buf, cap, "%zuM", bytes >> 20);
    else if (bytes % 1024 == 0)
        snprintf(buf, cap, "%zuk", bytes >> 10);
    else
        snprintf(buf, cap, "%zu", bytes);
}

/* One row: the reduce, memcpy right after it (same cache state), then the
 * pool. Returns false when a reduce call failed. */
static bool run_cell(const opts_t *o, const bufs_t *b, const cell_t *c, tern_pool_t *pool,
                     uint64_t *samples)
{
    char label[32];
    uint64_t red, cpy, par = 0;
    fill_ones(c->dtype, b->dst, c->count);
    fill_ones(c->dtype, b->src, c->count);
    red = time_reduce(b, c, NULL, o->reps, samples);
    cpy = time_memcpy(b, o->reps, samples);
    fill_ones(c->dtype, b->dst, c->count);
    if (pool)
        par = time_reduce(b, c, pool, o->reps, samples);
    if (red == 0 || (pool && par == 0))
        return false;
    size_label(b->bytes, label, sizeof(label));
    printf("%-6s %-5s %-5s %9.2f %9.2f %7.2f", label, tern_dtype_name(c->dtype),
           tern_reduce_op_name(c->op), gbps(b->bytes, red), gbps(b->bytes, cpy),
           (double)cpy / (double)red);
    if (pool)
        printf(" %9.2f %7.2f", gbps(b->bytes, par), (double)red / (double)par);
    printf("\n");
    return true;
}

static bool run_size(const opts_t *o, size_t bytes, tern_pool_t *pool, uint64_t *samples)
{
    bufs_t b = {aligned_alloc(64, (bytes + 63) & ~(size_t)63),
                aligned_alloc(64, (bytes + 63) & ~(size_t)63), bytes};
    bool ok = b.dst != NULL && b.src != NULL;
    if (!ok)
        fprintf(stderr, "tern-reduce-bench: cannot allocate 2 x %zu bytes\n", bytes);
    for (int d = 0; ok && d < TERN_DTYPE_COUNT; d++) {
        for (int op = 0; ok && op < TERN_REDUCE_OP_COUNT; op++) {
            cell_t c = {(tern_reduce_op_t)op, (tern_dtype_t)d, bytes / tern_dtype_size(d)};
            if (!o->dtype_on[d] || !o->op_on[op] ||
                tern__reduce_check(c.op, c.dtype) != TERN_OK)
                continue;
            ok = run_cell(o, &b, &c, pool, samples);
        }
    }
    free(b.dst);
    free(b.src);
    return ok;
}

static tern_pool_t *make_pool(unsigned threads)
{
    tern_pool_params_t params = {.field_mask = TERN_POOL_PARAM_THREADS, .threads = threads};
    tern_pool_binding_t binding;
    tern_pool_t *pool = NULL;
    if (threads < 2)
        return NULL;
    if (tern_pool_create(&params, &pool) != TERN_OK) {
        fprintf(stderr, "tern-reduce-bench: pool: %s\n", tern_last_error());
        return NULL;
    }
    tern_pool_binding(pool, &binding);
    printf("# pool for the par columns: %s\n", binding.summary);
    return pool;
}

static void header(const opts_t *o, bool par)
{
    printf("# kernels: %s; median of %u runs; GB/s = bytes of one input / time\n",
           tern__reduce_isa(), o->reps);
    printf("# reduce: dst = dst op src on this thread; ratio = reduce GB/s / memcpy GB/s");
    if (par)
        printf(";\n# par: tern__reduce_par over the pool; speedup = par GB/s / reduce GB/s (min %u "
               "bytes to split)",
               (unsigned)TERN__REDUCE_PAR_MIN_BYTES);
    printf("\n%-6s %-5s %-5s %9s %9s %7s", "size", "dtype", "op", "reduce", "memcpy", "ratio");
    if (par)
        printf(" %9s %7s", "par", "speedup");
    printf("\n");
}

int main(int argc, char **argv)
{
    opts_t o;
    tern_pool_t *pool;
    uint64_t *samples;
    bool ok = true;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        usage(rc == 2 ? stdout : stderr);
        return rc == 2 ? 0 : 2;
    }
    tern__reduce_force_portable(o.portable);
    samples = calloc(o.reps, sizeof(*samples));
    if (samples == NULL) {
        fprintf(stderr, "tern-reduce-bench: out of memory\n");
        return 1;
    }
    pool = make_pool(o.threads);
    if (o.threads >= 2 && pool == NULL) {
        free(samples);
        return 1;
    }
    header(&o, pool != NULL);
    for (unsigned s = 0; ok && s < o.nsizes; s++)
        ok = run_size(&o, o.sizes[s], pool, samples);
    tern_pool_destroy(pool);
    free(samples);
    return ok ? 0 : 1;
}
