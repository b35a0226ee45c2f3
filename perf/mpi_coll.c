/*
 * The Open MPI peer of tern-perf's collective tests, for compare.sh: the same
 * collectives, sizes, iteration counts and timing (perf/bench_coll.h), and
 * the same CSV with "mpi" as the transport:
 *   mpi-coll TEST [--sizes LIST | --min-size N --max-size M] [--iters N]
 *            [--warmup N] [--dtype f32|f64|i8|i16|i32|i64|u8] [--op sum|prod|max|min]
 *            [--root N] [--inplace] [--format csv]
 * TEST is allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall,
 * gather, scatter or barrier. Run with mpirun; rank 0 prints. MPI has no avg
 * (or f16/bf16), so this peer has none either. It links nothing of tern's.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "stats.h"

#define CSV_HEADER                                                                                 \
    "test,transport,mem,ranks,size,iters,lat_us_p50,lat_us_avg,lat_us_p99,bw_GBps,busbw_GBps,"     \
    "msg_rate"

enum test {
    ALLREDUCE,
    BROADCAST,
    REDUCE,
    ALLGATHER,
    REDUCE_SCATTER,
    ALLTOALL,
    GATHER,
    SCATTER,
    BARRIER
};
static const char *const tests[] = {"allreduce", "broadcast",      "reduce",
                                    "allgather", "reduce_scatter", "alltoall",
                                    "gather",    "scatter",        "barrier"};

static const struct {
    const char *name;
    MPI_Datatype type;
    size_t size;
} dtypes[] = {
    {"f32", MPI_FLOAT, 4},   {"f64", MPI_DOUBLE, 8},  {"i8", MPI_INT8_T, 1},
    {"i16", MPI_INT16_T, 2}, {"i32", MPI_INT32_T, 4}, {"i64", MPI_INT64_T, 8},
    {"u8", MPI_UINT8_T, 1},
};

static const struct {
    const char *name;
    MPI_Op op;
} ops[] = {{"sum", MPI_SUM}, {"prod", MPI_PROD}, {"max", MPI_MAX}, {"min", MPI_MIN}};

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* tern's size syntax: a number and an optional b, k, kb, kib, m, ..., gib. */
static int parse_size(const char *s, size_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {{"", 0},    {"b", 0},    {"k", 10}, {"kb", 10}, {"kib", 10}, {"m", 20},
                 {"mb", 20}, {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}};
    char *end;
    errno = 0;
    if (!isdigit((unsigned char)*s))
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            if (v > (SIZE_MAX >> units[i].shift))
                return -1;
            *out = (size_t)(v << units[i].shift);
            return 0;
        }
    }
    return -1;
}

static int parse_count(const char *s, unsigned *out, int zero_ok)
{
    char *end;
    errno = 0;
    unsigned long n = strtoul(s, &end, 10);
    if (!isdigit((unsigned char)*s) || *end || errno || n > 100000000ul || (n == 0 && !zero_ok))
        return -1;
    *out = (unsigned)n;
    return 0;
}

/* As tern-perf's collective tests: 64 MiB of traffic per size (--traffic),
 * 10 to 10000. */
static unsigned default_iters(size_t size, size_t traffic)
{
    uint64_t n = (uint64_t)traffic / (size ? size : 1);
    return n < 10 ? 10 : n > 10000 ? 10000 : (unsigned)n;
}

static double busbw_factor(enum test t, int n)
{
    double f = (double)(n - 1) / n;
    switch (t) {
    case ALLREDUCE:
        return 2 * f;
    case BROADCAST:
    case REDUCE:
        return 1;
    case BARRIER:
        return 0;
    default:
        return f;
    }
}

/* Small integers, as tern-perf puts in, so both run their kernels on the
 * same kind of data. */
static void fill(void *buf, size_t n, size_t es, MPI_Datatype type, int rank)
{
    for (size_t i = 0; i < n; i++) {
        int v = (int)((i * 3 + (size_t)rank * 5 + 1) % 7);
        char *p = (char *)buf + i * es;
        if (type == MPI_FLOAT) {
            float f = (float)v;
            memcpy(p, &f, 4);
        } else if (type == MPI_DOUBLE) {
            double d = v;
            memcpy(p, &d, 8);
        } else {
            int64_t x = v; /* little-endian: the low es bytes are v */
            memcpy(p, &x, es);
        }
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: mpi-coll TEST [--sizes LIST | --min-size N --max-size M] [--iters N]\n"
                    "                [--warmup N] [--dtype f32|f64|i8|i16|i32|i64|u8]\n"
                    "                [--op sum|prod|max|min] [--root N] [--format csv]\n"
                    "                [--inplace (allreduce)] [--traffic BYTES (default 64M)]\n"
                    "TEST: allreduce broadcast reduce allgather reduce_scatter alltoall gather\n"
                    "      scatter barrier\n");
}

int main(int argc, char **argv)
{
    int rank, n, rc = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);

    /* Every rank parses the same arguments, so every rank agrees to stop. */
    enum test t = BARRIER;
    int found = 0, dt = 0, op = 0, inplace = 0;
    unsigned iters = 0, warmup = 0, root = 0, nsizes = 0;
    size_t sizes[64], min_size = 1, max_size = 4u << 20, traffic = 64u << 20;
    const char *bad = NULL;
    for (unsigned i = 0; argc > 1 && i < sizeof(tests) / sizeof(tests[0]); i++)
        if (strcmp(argv[1], tests[i]) == 0)
            t = (enum test)i, found = 1;
    if (!found)
        bad = argc > 1 ? argv[1] : "(no test)";
    for (int i = 2; i < argc && bad == NULL; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--inplace") == 0) {
            /* allreduce with MPI_IN_PLACE: tern-perf's --inplace */
            inplace = 1;
            if (t != ALLREDUCE)
                bad = a;
            i--; /* takes no value */
            continue;
        }
        if (v == NULL) {
            bad = a;
        } else if (strcmp(a, "--sizes") == 0) {
            char *copy = strdup(v), *save = NULL;
            if (copy == NULL) {
                bad = a;
                break;
            }
            for (char *s = strtok_r(copy, ",", &save); s && !bad; s = strtok_r(NULL, ",", &save))
                if (nsizes == 64 || parse_size(s, &sizes[nsizes++]) != 0)
                    bad = v;
            free(copy);
        } else if (strcmp(a, "--min-size") == 0 || strcmp(a, "--max-size") == 0) {
            if (parse_size(v, a[3] == 'i' ? &min_size : &max_size) != 0)
                bad = v;
        } else if (strcmp(a, "--iters") == 0) {
            if (parse_count(v, &iters, 0) != 0)
                bad = v;
        } else if (strcmp(a, "--traffic") == 0) {
            if (parse_size(v, &traffic) != 0 || traffic == 0)
                bad = v;
        } else if (strcmp(a, "--warmup") == 0) {
            if (parse_count(v, &warmup, 1) != 0)
                bad = v;
        } else if (strcmp(a, "--root") == 0) {
            if (parse_count(v, &root, 1) != 0 || root >= (unsigned)n)
                bad = v;
        } else if (strcmp(a, "--dtype") == 0) {
            dt = -1;
            for (int d = 0; d < (int)(sizeof(dtypes) / sizeof(dtypes[0])); d++)
                if (strcmp(v, dtypes[d].name) == 0)
                    dt = d;
            if (dt < 0)
                bad = v;
        } else if (strcmp(a, "--op") == 0) {
            op = -1;
            for (int o = 0; o < (int)(sizeof(ops) / sizeof(ops[0])); o++)
                if (strcasecmp(v, ops[o].name) == 0)
                    op = o;
            if (op < 0)
                bad = v;
        } else if (strcmp(a, "--format") == 0) {
            if (strcmp(v, "csv") != 0)
                bad = v;
        } else {
            bad = a;
        }
    }
    if (bad == NULL && nsizes == 0) {
        if (min_size > max_size)
            bad = "--min-size above --max-size";
        for (size_t s = min_size; s <= max_size && nsizes < 64 && !bad; s = s ? s * 2 : 1)
            sizes[nsizes++] = s;
    }
    if (bad != NULL) {
        if (rank == 0) {
            fprintf(stderr, "mpi-coll: bad argument: %s\n", bad);
            usage();
        }
        MPI_Finalize();
        return 2;
    }
    if (t == BARRIER) {
        nsizes = 1;
        sizes[0] = 0;
    }

    MPI_Datatype type = dtypes[dt].type;
    MPI_Op mop = ops[op].op;
    size_t es = dtypes[dt].size;
    int per_rank =
        t == ALLGATHER || t == REDUCE_SCATTER || t == ALLTOALL || t == GATHER || t == SCATTER;
    int is_root = rank == (int)root;
    if (rank == 0) {
        printf("%s\n", CSV_HEADER);
        fflush(stdout);
    }
    for (unsigned s = 0; s < nsizes; s++) {
        size_t unit = es * (per_rank ? (size_t)n : 1);
        size_t c = t == BARRIER ? 0 : sizes[s] / unit, size = c * unit, pieces = (size_t)n * c;
        if (c > INT_MAX) {
            if (rank == 0)
                fprintf(stderr, "mpi-coll: %zu bytes: count above INT_MAX\n", sizes[s]);
            rc = 2;
            break;
        }
        unsigned it = iters ? iters : default_iters(size, traffic);
        unsigned warm =
            warmup ? warmup : (it / 10 > 2 ? it / 10 : 2); /* 0: by size, as tern-perf */
        size_t sn = c, rn = c; /* elements of each buffer on this rank */
        switch (t) {
        case ALLGATHER:
            rn = pieces;
            break;
        case REDUCE_SCATTER:
            sn = pieces;
            break;
        case ALLTOALL:
            sn = rn = pieces;
            break;
        case GATHER:
            rn = is_root ? pieces : 0;
            break;
        case SCATTER:
            sn = is_root ? pieces : 0;
            break;
        case BROADCAST:
            rn = 0;
            break;
        case REDUCE:
            rn = is_root ? c : 0;
            break;
        default:
            break;
        }
        char *sbuf = malloc(sn * es + 1), *rbuf = malloc(rn * es + 1);
        double *samples = calloc(it, sizeof(double));
        if (sbuf == NULL || rbuf == NULL || samples == NULL) {
            fprintf(stderr, "mpi-coll: rank %d: out of memory at %zu bytes\n", rank, size);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fill(sbuf, sn, es, type, rank);
        memset(rbuf, 0, rn * es + 1);
        int ic = (int)c;
        MPI_Barrier(MPI_COMM_WORLD);
        for (unsigned i = 0; i < warm + it; i++) {
            double t0 = MPI_Wtime();
            switch (t) {
            case ALLREDUCE:
                if (inplace)
                    MPI_Allreduce(MPI_IN_PLACE, sbuf, ic, type, mop, MPI_COMM_WORLD);
                else
                    MPI_Allreduce(sbuf, rbuf, ic, type, mop, MPI_COMM_WORLD);
                break;
            case BROADCAST:
                MPI_Bcast(sbuf, ic, type, (int)root, MPI_COMM_WORLD);
                break;
            case REDUCE:
                MPI_Reduce(sbuf, rbuf, ic, type, mop, (int)root, MPI_COMM_WORLD);
                break;
            case ALLGATHER:
                MPI_Allgather(sbuf, ic, type, rbuf, ic, type, MPI_COMM_WORLD);
                break;
            case REDUCE_SCATTER:
                MPI_Reduce_scatter_block(sbuf, rbuf, ic, type, mop, MPI_COMM_WORLD);
                break;
            case ALLTOALL:
                MPI_Alltoall(sbuf, ic, type, rbuf, ic, type, MPI_COMM_WORLD);
                break;
            case GATHER:
                MPI_Gather(sbuf, ic, type, rbuf, ic, type, (int)root, MPI_COMM_WORLD);
                break;
            case SCATTER:
                MPI_Scatter(sbuf, ic, type, rbuf, ic, type, (int)root, MPI_COMM_WORLD);
                break;
            case BARRIER:
                MPI_Barrier(MPI_COMM_WORLD);
                break;
            }
            if (i >= warm)
                samples[i - warm] = MPI_Wtime() - t0;
        }
        /* Each iteration's time is its slowest rank's, as in tern-perf. */
        MPI_Allreduce(MPI_IN_PLACE, samples, (int)it, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double sum = 0, max_avg;
        for (unsigned i = 0; i < it; i++)
            sum += samples[i];
        max_avg = sum / it * 1e6;
        if (rank == 0) {
            qsort(samples, it, sizeof(double), cmp);
            printf("%s,mpi,host,%d,%zu,%u,%.3f,%.3f,%.3f,", tests[t], n, size, it,
                   samples[tern_bench_pct_index(it, 50)] * 1e6, max_avg,
                   samples[tern_bench_pct_index(it, 99)] * 1e6);
            if (t != BARRIER) {
                double bw = max_avg > 0 ? (double)size / (max_avg * 1e3) : 0;
                printf("%.3f,%.3f", bw, bw * busbw_factor(t, n));
            } else {
                putchar(',');
            }
            printf(",\n");
            fflush(stdout);
        }
        free(sbuf);
        free(rbuf);
        free(samples);
    }
    MPI_Finalize();
    return rc;
}
