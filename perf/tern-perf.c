/*
 * tern-perf: latency, bandwidth and message-rate benchmarks between ranks, the
 * collectives timed as nccl-tests times them, and RPC round trips and call
 * rate, and the profiler's clock estimates and costs, run under tern-run,
 * mpirun or srun. Only rank 0 prints, so the CSV stays parseable under any
 * launcher.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <tern/tern.h>

#include "core/config.h"
#include "perf/bench.h"
#include "perf/bench_coll.h"
#include "perf/bench_prof.h"
#include "perf/bench_rpc.h"
#include "perf/host.h"
#include "tensor/reduce.h"

enum format { FMT_TABLE, FMT_CSV, FMT_JSON };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tern-perf TEST [options]\n"
            "  TEST                 point to point (2 or more ranks): lat | bw | bibw | rate\n"
            "                       collectives (any number of ranks): allreduce | broadcast |\n"
            "                       reduce | allgather | reduce_scatter | alltoall | gather |\n"
            "                       scatter | barrier\n"
            "                       rpc (2 or more ranks): rank 0 calls rank 1's RPC worker;\n"
            "                       rows rpc_lat (round trip of rpc_sync, an echo of one u8\n"
            "                       tensor of each size, default size 8) and rpc_rate\n"
            "                       (no-op rpc_async calls/s, --window calls in flight)\n"
            "                       profiler (2 or more ranks; docs/perf.md, Profiler):\n"
            "                       clock: rank 0 estimates every other rank's profiler clock\n"
            "                       offset (tern_prof_clock_estimate), --iters times; rows\n"
            "                       peer, offset_ns, error_bound_ns, min_rtt_ns, samples\n"
            "                       prof: what profiling costs, off and on in the same run:\n"
            "                       rows clock_read, range_off, range_on (a range's begin +\n"
            "                       end), rpc_sync_off, rpc_sync_on (8 B echo round trip, on\n"
            "                       with the ratio on/off), rpc_sync_on_first (a session's\n"
            "                       first call: clock estimate), prof_start, prof_stop; in ns\n"
            "  --transport NAME     tcp | ucx | verbs | auto (default: TERN_TRANSPORT, auto)\n"
            "  --mem host|cuda      where the buffers live (default host)\n"
            "  --sizes LIST         comma-separated sizes, e.g. 8,64,4k,1M\n"
            "  --min-size N         with --max-size: N, 2N, 4N, ... up to M (powers of two\n"
            "                       from 1 by default)\n"
            "  --max-size M         (default 1 to 4M)\n"
            "  --iters N            timed iterations per size (default: by size); clock:\n"
            "                       estimates of each peer (default 10); prof: rpc calls\n"
            "                       per batch (default 2000)\n"
            "  --warmup N           untimed iterations first (default: iters/10, at least 2;\n"
            "                       0: none)\n"
            "  --window W           messages in flight for bw, bibw, rate; calls for rpc\n"
            "                       (default 64)\n"
            "  --format table|csv|json   (default table)\n"
            "  --rss                report each rank's resident memory before and after\n"
            "collectives only:\n"
            "  --dtype NAME         f32 (default), f64, f16, bf16, i8, i16, i32, i64, u8, bool\n"
            "  --op NAME            sum (default) | prod | max | min | avg, for allreduce,\n"
            "                       reduce and reduce_scatter\n"
            "  --root N             root rank of broadcast, reduce, gather, scatter (default 0)\n"
            "  --check              verify every size's last timed call against a reference\n"
            "                       computed here; exit 1 on a wrong element\n"
            "  --inplace            allreduce: one buffer for input and output, as\n"
            "                       torch.distributed's all_reduce (nccl-tests' in-place)\n"
            "  --traffic BYTES      payload per size that sets the default iterations:\n"
            "                       BYTES / size calls, 10 to 10000 (default 64M)\n"
            "clock only:\n"
            "  --samples N          ping-pongs per estimate (default 0: TERN_PROF_CLOCK_SAMPLES)\n"
            "  --skew-rank R        with --skew-ns: rank R alone sets TERN_CLOCK_SKEW_NS=N\n"
            "  --skew-ns N          before tern_init (tern-run gives every rank the same\n"
            "                       environment); the table then shows offset - true offset\n"
            "prof only:\n"
            "  --batches N          rpc batches profiled and not, alternating (default 10)\n"
            "  --ranges N           range pairs timed off and on each (default 1M)\n"
            "  --sizes N            the echo's payload (one size; default 8)\n"
            "Sizes are the operation's buffer as nccl-tests counts them (allgather: the\n"
            "gathered output; reduce_scatter: the input; alltoall: what each rank sends;\n"
            "gather, scatter: the root's buffer), rounded down to a multiple of the element\n"
            "size, times the number of ranks for those five. barrier measures size 0 once.\n"
            "rpc_lat latencies are whole round trips (lat's are half of one); its bw_GBps\n"
            "counts the payload both ways. rpc_rate has size 0 and iters x window calls.\n"
            "Host steal (CPU time a hypervisor took, /proc/stat) is measured around each\n"
            "row of the p2p, collective and rpc tests: JSON host_steal_pct per row and\n"
            "run; the table flags rows and the run at 5%% or more; CSV warns on stderr.\n"
            "Example: tern-run -n 2 tern-perf lat; tern-run -n 4 tern-perf allreduce --check;\n"
            "         tern-run -n 2 tern-perf rpc --sizes 0,8,64k,1M;\n"
            "         tern-run -n 2 tern-perf clock --skew-rank 1 --skew-ns 123456789;\n"
            "         tern-run -n 2 tern-perf prof --format csv\n");
}

/* Options that take a value, so that one given last says it needs one and
 * a misspelt one says it is unknown. */
static int takes_value(const char *a)
{
    static const char *const names[] = {
        "--transport", "--mem",   "--sizes", "--min-size", "--max-size", "--iters",
        "--warmup",    "--window", "--dtype", "--op",       "--root",     "--format",
        "--samples",   "--skew-rank", "--skew-ns", "--batches", "--ranges", "--traffic"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(a, names[i]) == 0)
            return 1;
    return 0;
}

/* A message size: at most a quarter of the address space, so that the
 * buffers' sizes (a size plus one, ranks times the element count) cannot
 * wrap. */
static int parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (tern__parse_size(s, &v) != TERN_OK || v > SIZE_MAX / 4)
        return -1;
    *out = (size_t)v;
    return 0;
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static void cell(double v, int applies)
{
    if (applies)
        printf("%.3f", v);
}

/* The cells a point-to-point or rpc row has. */
#define HAS_LAT 1u
#define HAS_BW 2u
#define HAS_RATE 4u

/* The end of a row: the host's steal while it ran (perf/host.h) where the
 * format has room for it (JSON: always, null when unknown; the table: a
 * comment when it passes TERN_BENCH_STEAL_WARN_PCT; the CSV's columns are
 * fixed, so the run's figure goes to stderr instead, at the end). */
static void row_end(enum format fmt, double steal)
{
    if (fmt == FMT_CSV) {
        putchar('\n');
    } else if (fmt == FMT_JSON) {
        if (steal >= 0)
            printf(",\"host_steal_pct\":%.1f}", steal);
        else
            printf(",\"host_steal_pct\":null}");
    } else {
        if (steal >= TERN_BENCH_STEAL_WARN_PCT)
            printf("   # host steal %.0f%%", steal);
        putchar('\n');
    }
}

/* One point-to-point or rpc row. named: the row says its test (a JSON key, the
 * table's first column), as rpc prints two kinds of rows under one test. */
static void print_p2p(enum format fmt, const char *test, const char *prov, const char *mem,
                      unsigned world, const tern_bench_result_t *r, unsigned has, int named,
                      unsigned i, double steal)
{
    if (fmt == FMT_CSV) {
        printf("%s,%s,%s,%u,%zu,%u,", test, prov, mem, world, r->size, r->iters);
        cell(r->lat_us_p50, has & HAS_LAT), putchar(',');
        cell(r->lat_us_avg, has & HAS_LAT), putchar(',');
        cell(r->lat_us_p99, has & HAS_LAT), putchar(',');
        cell(r->bw_GBps, has & HAS_BW), putchar(',');
        putchar(','); /* busbw: collectives only */
        if (has & HAS_RATE)
            printf("%.0f", r->msg_rate);
    } else if (fmt == FMT_JSON) {
        printf("%s{", i ? "," : "");
        if (named)
            printf("\"test\":\"%s\",", test);
        printf("\"size\":%zu,\"iters\":%u", r->size, r->iters);
        if (has & HAS_LAT)
            printf(",\"lat_us_p50\":%.3f,\"lat_us_avg\":%.3f,\"lat_us_p99\":%.3f", r->lat_us_p50,
                   r->lat_us_avg, r->lat_us_p99);
        if (has & HAS_BW)
            printf(",\"bw_GBps\":%.3f", r->bw_GBps);
        if (has & HAS_RATE)
            printf(",\"msg_rate\":%.0f", r->msg_rate);
    } else {
        char p50[32] = "", avg[32] = "", p99[32] = "", bw[32] = "", rate[32] = "";
        if (has & HAS_LAT) {
            snprintf(p50, sizeof(p50), "%.2f", r->lat_us_p50);
            snprintf(avg, sizeof(avg), "%.2f", r->lat_us_avg);
            snprintf(p99, sizeof(p99), "%.2f", r->lat_us_p99);
        }
        if (has & HAS_BW)
            snprintf(bw, sizeof(bw), "%.3f", r->bw_GBps);
        if (has & HAS_RATE)
            snprintf(rate, sizeof(rate), "%.0f", r->msg_rate);
        if (named)
            printf("%-9s ", test);
        printf("%12zu %8u %10s %10s %10s %12s %14s", r->size, r->iters, p50, avg, p99, bw, rate);
    }
    row_end(fmt, steal);
}

/* One collective row; has_bw is 0 for barrier, which moves no payload. */
static void print_coll(enum format fmt, const char *test, const char *prov, const char *mem,
                       unsigned world, const tern_bench_result_t *r, int has_bw, unsigned i,
                       double steal)
{
    if (fmt == FMT_CSV) {
        printf("%s,%s,%s,%u,%zu,%u,%.3f,%.3f,%.3f,", test, prov, mem, world, r->size, r->iters,
               r->lat_us_p50, r->lat_us_avg, r->lat_us_p99);
        cell(r->bw_GBps, has_bw), putchar(',');
        cell(r->busbw_GBps, has_bw), putchar(','); /* msg_rate: point to point only */
    } else if (fmt == FMT_JSON) {
        printf("%s{\"size\":%zu,\"iters\":%u,\"lat_us_p50\":%.3f,\"lat_us_avg\":%.3f,"
               "\"lat_us_p99\":%.3f",
               i ? "," : "", r->size, r->iters, r->lat_us_p50, r->lat_us_avg, r->lat_us_p99);
        if (has_bw)
            printf(",\"bw_GBps\":%.3f,\"busbw_GBps\":%.3f", r->bw_GBps, r->busbw_GBps);
    } else if (has_bw) {
        printf("%12zu %8u %10.2f %10.2f %10.2f %12.3f %12.3f", r->size, r->iters, r->lat_us_p50,
               r->lat_us_avg, r->lat_us_p99, r->bw_GBps, r->busbw_GBps);
    } else {
        printf("%12zu %8u %10.2f %10.2f %10.2f %12s %12s", r->size, r->iters, r->lat_us_p50,
               r->lat_us_avg, r->lat_us_p99, "", "");
    }
    row_end(fmt, steal);
}

/* The most any rank's host stole (ranks under srun or mpirun sit on several
 * hosts), -1 when none could tell. Every rank calls it: an 8-byte all_reduce
 * between rows, outside every timed loop. */
static double steal_max(tern_ctx_t *ctx, double mine)
{
    double all;
    if (tern_all_reduce(tern_group_world(ctx), &mine, &all, 1, TERN_DTYPE_F64, TERN_MAX, NULL) !=
        TERN_OK)
        return mine;
    return all;
}

/* The run's steal, after its rows: a line for the table, stderr for the CSV
 * (whose stdout scripts parse), a key closing the JSON object. */
static void print_run_steal(enum format fmt, double steal)
{
    if (fmt == FMT_JSON) {
        if (steal >= 0)
            printf("],\"host_steal_pct\":%.1f}\n", steal);
        else
            printf("],\"host_steal_pct\":null}\n");
        return;
    }
    if (steal < TERN_BENCH_STEAL_WARN_PCT)
        return;
    fprintf(fmt == FMT_TABLE ? stdout : stderr,
            "# host steal: the hypervisor took %.0f%% of this machine's CPU time while the rows "
            "ran (/proc/stat, the most of any rank's host): these figures measure the host as "
            "much as tern\n",
            steal);
}

/* A decimal count in [lo, hi]. */
static int parse_count(const char *s, unsigned long long lo, unsigned long long hi,
                       unsigned long long *out)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
        return -1;
    unsigned long long n = strtoull(s, &end, 10);
    if (*end || errno || n < lo || n > hi)
        return -1;
    *out = n;
    return 0;
}

/*
 * This process's rank as tern_init will take it (from the first launcher that
 * set one, as tern_init looks), and the TERN_CLOCK_SKEW_NS every rank got from
 * it; -1 if the environment does not parse (tern_init then says why).
 */
static long long launch_rank(long long *env_skew)
{
    tern__config_t cfg;
    *env_skew = 0;
    if (tern__config_load(&cfg) != TERN_OK)
        return -1;
    *env_skew = cfg.clock_skew_ns;
    for (int l = 0; l < TERN__LAUNCHER_COUNT; l++)
        if (cfg.launch[l].rank != TERN__UNSET)
            return cfg.launch[l].rank;
    return 0;
}

/* What --skew-rank and --skew-ns set up (rank -1: nothing). */
typedef struct skew {
    long long rank, ns;
    long long env_ns;    /* the other ranks' TERN_CLOCK_SKEW_NS */
    long long predicted; /* this rank, as launch_rank saw it */
} skew_t;

static long long skew_of(const skew_t *sk, unsigned rank)
{
    return (long long)rank == sk->rank ? sk->ns : sk->env_ns;
}

static int run_clock(tern_ctx_t *ctx, enum format fmt, const tern_bench_prof_opts_t *po,
                     const char *prov, const char *dev, const char *mem, const skew_t *sk)
{
    unsigned rank = tern_ctx_rank(ctx), world = tern_ctx_world_size(ctx);
    unsigned reps = po->reps ? po->reps : 10;
    size_t n = (size_t)reps * (world - 1);
    tern_prof_clock_t *est = NULL;
    int rc = 0;
    if (sk->rank >= 0 && (unsigned long long)sk->rank >= world) {
        if (rank == 0)
            fprintf(stderr, "tern-perf: --skew-rank %lld is not a rank (0..%u)\n", sk->rank,
                    world - 1);
        return 1;
    }
    if (sk->rank >= 0 && sk->predicted != (long long)rank) {
        /* launch_rank read the launchers otherwise than tern_init did. */
        fprintf(stderr,
                "tern-perf: rank %u took itself for rank %lld before tern_init; "
                "--skew-rank is unreliable here\n",
                rank, sk->predicted);
        rc = 1;
    }
    if ((long long)rank == sk->rank) {
        /* The profiler reads TERN_CLOCK_SKEW_NS when its clock is first used. */
        long long d = (long long)(tern_prof_clock_ns() - (int64_t)tern_clock_ns());
        if (llabs(d - sk->ns) > 1000000) {
            fprintf(stderr,
                    "tern-perf: rank %u: TERN_CLOCK_SKEW_NS=%lld was set before "
                    "tern_init, yet the profiler's clock is %lld ns from tern_clock_ns\n",
                    rank, sk->ns, d);
            rc = 1;
        }
    }
    if (rank == 0 && (est = calloc(n, sizeof(*est))) == NULL) {
        fprintf(stderr, "tern-perf: clock: no memory for %zu estimates\n", n);
        tern_bench_clock(ctx, po, NULL); /* the others still wait for rank 0's word */
        return 1;
    }
    if (tern_bench_clock(ctx, po, est) != TERN_OK) {
        fprintf(stderr, "tern-perf: rank %u: clock: %s\n", rank, tern_last_error());
        free(est);
        return 1;
    }
    if (rank != 0)
        return rc;
    unsigned within = 0;
    int64_t bmin = INT64_MAX, bmax = 0;
    long long worst = 0;
    if (fmt == FMT_CSV) {
        printf("%s\n", TERN_BENCH_CLOCK_CSV_HEADER);
    } else if (fmt == FMT_JSON) {
        printf("{\"test\":\"clock\",\"transport\":\"%s\",\"device\":\"%s\",\"mem\":\"%s\","
               "\"ranks\":%u,\"results\":[",
               prov, dev, mem, world);
    } else {
        printf("# tern-perf clock: transport %s on %s, %u ranks; each rank's profiler clock minus\n"
               "# rank 0's, estimated by rank 0 (%u ping-pongs; bound = smallest round trip / 2)\n",
               prov, dev, world, est[0].samples);
        if (sk->rank >= 0)
            printf("# TERN_CLOCK_SKEW_NS: %lld on rank %lld, %lld on the others (--skew-rank);\n"
                   "# true offset of rank p = its skew - rank 0's (one host, one clock)\n",
                   sk->ns, sk->rank, sk->env_ns);
        printf("%5s %5s %16s %15s %12s %8s", "rep", "peer", "offset_ns", "error_bound_ns",
               "min_rtt_ns", "samples");
        if (sk->rank >= 0)
            printf(" %16s %7s", "minus_true_ns", "within");
        putchar('\n');
    }
    for (size_t i = 0; i < n; i++) {
        const tern_prof_clock_t *c = &est[i];
        long long truth = skew_of(sk, (unsigned)c->peer) - skew_of(sk, 0);
        long long miss = (long long)c->offset_ns - truth;
        int ok = llabs(miss) <= c->error_bound_ns;
        within += ok;
        worst = llabs(miss) > worst ? llabs(miss) : worst;
        bmin = c->error_bound_ns < bmin ? c->error_bound_ns : bmin;
        bmax = c->error_bound_ns > bmax ? c->error_bound_ns : bmax;
        if (fmt == FMT_CSV) {
            printf("clock,%s,%s,%u,%d,%lld,%lld,%lld,%u\n", prov, mem, world, c->peer,
                   (long long)c->offset_ns, (long long)c->error_bound_ns, (long long)c->min_rtt_ns,
                   c->samples);
        } else if (fmt == FMT_JSON) {
            printf("%s{\"rep\":%zu,\"peer\":%d,\"offset_ns\":%lld,\"error_bound_ns\":%lld,"
                   "\"min_rtt_ns\":%lld,\"samples\":%u}",
                   i ? "," : "", i / (world - 1), c->peer, (long long)c->offset_ns,
                   (long long)c->error_bound_ns, (long long)c->min_rtt_ns, c->samples);
        } else {
            printf("%5zu %5d %16lld %15lld %12lld %8u", i / (world - 1), c->peer,
                   (long long)c->offset_ns, (long long)c->error_bound_ns, (long long)c->min_rtt_ns,
                   c->samples);
            if (sk->rank >= 0)
                printf(" %16lld %7s", miss, ok ? "yes" : "NO");
            putchar('\n');
        }
    }
    if (fmt == FMT_JSON)
        printf("]}\n");
    else if (fmt == FMT_TABLE)
        printf("# error bound %lld-%lld ns%s", (long long)bmin, (long long)bmax,
               sk->rank >= 0 ? "" : "\n");
    if (fmt == FMT_TABLE && sk->rank >= 0)
        printf("; |offset - true| <= bound in %u of %zu estimates (largest miss %lld ns)\n", within,
               n, worst);
    free(est);
    return rc;
}

static void prof_cell(double v)
{
    if (v > 0)
        printf("%.3f", v);
}

static int run_prof(tern_ctx_t *ctx, enum format fmt, const tern_bench_prof_opts_t *po,
                    const char *prov, const char *dev, const char *mem)
{
    unsigned rank = tern_ctx_rank(ctx), world = tern_ctx_world_size(ctx);
    tern_bench_prof_row_t rows[TERN_BENCH_PROF_ROWS];
    if (tern_bench_prof(ctx, po, rows) != TERN_OK) {
        fprintf(stderr, "tern-perf: rank %u: prof: %s\n", rank, tern_last_error());
        return 1;
    }
    if (rank != 0)
        return 0;
    if (fmt == FMT_CSV)
        printf("%s\n", TERN_BENCH_PROF_CSV_HEADER);
    else if (fmt == FMT_JSON)
        printf("{\"test\":\"prof\",\"transport\":\"%s\",\"device\":\"%s\",\"mem\":\"%s\","
               "\"ranks\":%u,\"results\":[",
               prov, dev, mem, world);
    else
        printf("# tern-perf prof: transport %s on %s, %u ranks; ns per operation (range and\n"
               "# clock rows: p50 and p99 over chunks of 1000); ratio = profiler on / off,\n"
               "# batches alternating in this run\n"
               "%-18s %6s %9s %12s %12s %12s %9s %9s\n",
               prov, dev, world, "test", "size", "iters", "ns_p50", "ns_avg", "ns_p99", "ratio_p50",
               "ratio_avg");
    for (unsigned i = 0; i < TERN_BENCH_PROF_ROWS; i++) {
        const tern_bench_prof_row_t *r = &rows[i];
        if (fmt == FMT_CSV) {
            printf("%s,%s,%s,%u,%zu,%llu,%.1f,%.1f,%.1f,", r->test, prov, mem, world, r->size,
                   (unsigned long long)r->iters, r->ns_p50, r->ns_avg, r->ns_p99);
            prof_cell(r->ratio_p50), putchar(',');
            prof_cell(r->ratio_avg), putchar('\n');
        } else if (fmt == FMT_JSON) {
            printf("%s{\"test\":\"%s\",\"size\":%zu,\"iters\":%llu,\"ns_p50\":%.1f,"
                   "\"ns_avg\":%.1f,\"ns_p99\":%.1f",
                   i ? "," : "", r->test, r->size, (unsigned long long)r->iters, r->ns_p50,
                   r->ns_avg, r->ns_p99);
            if (r->ratio_avg > 0)
                printf(",\"ratio_p50\":%.3f,\"ratio_avg\":%.3f", r->ratio_p50, r->ratio_avg);
            printf("}");
        } else {
            char rp[32] = "", ra[32] = "";
            if (r->ratio_avg > 0) {
                snprintf(rp, sizeof(rp), "%.3f", r->ratio_p50);
                snprintf(ra, sizeof(ra), "%.3f", r->ratio_avg);
            }
            printf("%-18s %6zu %9llu %12.1f %12.1f %12.1f %9s %9s\n", r->test, r->size,
                   (unsigned long long)r->iters, r->ns_p50, r->ns_avg, r->ns_p99, rp, ra);
        }
    }
    if (fmt == FMT_JSON)
        printf("]}\n");
    return 0;
}

int main(int argc, char **argv)
{
    tern_bench_opts_t opts = {0};
    enum format fmt = FMT_TABLE;
    size_t sizes[64];
    unsigned nsizes = 0;
    size_t min_size = 1, max_size = 4u << 20;
    int want_rss = 0, coll_opt = 0, range_given = 0;
    const char *mem = "host", *coll_arg = NULL, *clock_arg = NULL, *prof_arg = NULL;
    tern_bench_prof_opts_t popts = {0};
    skew_t skew = {.rank = -1, .predicted = -1};
    int skew_ns_given = 0;
    tern_ctx_t *ctx;
    int rc = 1;

    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (tern_bench_parse(argv[1], &opts.test) != 0) {
        fprintf(stderr, "tern-perf: unknown test '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    int is_coll = tern_bench_is_coll(opts.test), is_rpc = opts.test == TERN_BENCH_RPC;
    opts.dtype = TERN_DTYPE_F32;
    opts.op = TERN_SUM;
    opts.root = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (strcmp(a, "--rss") == 0) {
            want_rss = 1;
            continue;
        }
        if (strcmp(a, "--check") == 0) {
            opts.check = 1;
            coll_opt = 1, coll_arg = a;
            continue;
        }
        if (strcmp(a, "--inplace") == 0) {
            opts.inplace = 1;
            coll_opt = 1, coll_arg = a;
            continue;
        }
        if (v == NULL && takes_value(a)) {
            fprintf(stderr, "tern-perf: %s needs a value\n", a);
            return 2;
        }
        if (v == NULL) {
            fprintf(stderr, "tern-perf: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (strcmp(a, "--transport") == 0) {
            setenv("TERN_TRANSPORT", v, 1); /* read by tern_init, validated there */
        } else if (strcmp(a, "--mem") == 0) {
            mem = v;
        } else if (strcmp(a, "--sizes") == 0) {
            char *copy = strdup(v), *save = NULL;
            if (copy == NULL) {
                fprintf(stderr, "tern-perf: out of memory\n");
                return 1;
            }
            if (v[strspn(v, ", ")] == '\0') {
                fprintf(stderr, "tern-perf: --sizes '%s' names no size\n", v);
                free(copy);
                return 2;
            }
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (nsizes == 64 || parse_size(t, &sizes[nsizes]) != 0) {
                    fprintf(stderr, "tern-perf: bad size '%s' (a count of bytes with an optional k, M or G, below 2^62; at most 64 sizes)\n", t);
                    free(copy);
                    return 2;
                }
                nsizes++;
            }
            free(copy);
        } else if (strcmp(a, "--min-size") == 0 || strcmp(a, "--max-size") == 0) {
            if (parse_size(v, a[2] == 'm' && a[3] == 'i' ? &min_size : &max_size) != 0) {
                fprintf(stderr, "tern-perf: bad size '%s'\n", v);
                return 2;
            }
            range_given = 1;
        } else if (strcmp(a, "--iters") == 0 || strcmp(a, "--warmup") == 0 ||
                   strcmp(a, "--window") == 0) {
            char *end;
            errno = 0;
            unsigned long n = strtoul(v, &end, 10);
            if (end == v || *end || errno || v[0] == '-' || n > 100000000ul ||
                (n == 0 && strcmp(a, "--warmup") != 0)) {
                fprintf(stderr, "tern-perf: bad count '%s' for %s\n", v, a);
                return 2;
            }
            if (a[2] == 'i')
                opts.iters = (unsigned)n;
            else if (a[3] == 'a')
                opts.warmup = (unsigned)n, opts.warmup_given = 1;
            else
                opts.window = (unsigned)n;
        } else if (strcmp(a, "--traffic") == 0) {
            if (parse_size(v, &opts.traffic) != 0 || opts.traffic == 0) {
                fprintf(stderr, "tern-perf: bad traffic '%s' (bytes, more than 0)\n", v);
                return 2;
            }
            coll_opt = 1, coll_arg = a;
        } else if (strcmp(a, "--dtype") == 0) {
            if (tern_dtype_parse(v, &opts.dtype) != TERN_OK) {
                fprintf(stderr, "tern-perf: unknown dtype '%s'\n", v);
                return 2;
            }
            coll_opt = 1, coll_arg = a;
        } else if (strcmp(a, "--op") == 0) {
            if (tern_reduce_op_parse(v, &opts.op) != TERN_OK) {
                fprintf(stderr, "tern-perf: unknown op '%s' (sum, prod, max, min, avg)\n", v);
                return 2;
            }
            coll_opt = 1, coll_arg = a;
        } else if (strcmp(a, "--root") == 0) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (*v == '\0' || *end || errno || n < 0 || n > 1000000) {
                fprintf(stderr, "tern-perf: bad root '%s'\n", v);
                return 2;
            }
            opts.root = (int)n;
            coll_opt = 1, coll_arg = a;
        } else if (strcmp(a, "--samples") == 0 || strcmp(a, "--skew-rank") == 0 ||
                   strcmp(a, "--batches") == 0 || strcmp(a, "--ranges") == 0) {
            int samples = strcmp(a, "--samples") == 0, srank = strcmp(a, "--skew-rank") == 0,
                batches = strcmp(a, "--batches") == 0;
            unsigned long long n, hi = samples   ? 100000
                                       : srank   ? 2147483646ull
                                       : batches ? 100000
                                                 : 1000000000ull;
            if (parse_count(v, samples || srank ? 0 : 1, hi, &n) != 0) {
                fprintf(stderr, "tern-perf: bad count '%s' for %s (%s to %llu)\n", v, a,
                        samples || srank ? "0" : "1", hi);
                return 2;
            }
            if (samples)
                popts.samples = (unsigned)n;
            else if (srank)
                skew.rank = (long long)n;
            else if (batches)
                popts.batches = (unsigned)n;
            else
                popts.ranges = n;
            if (samples || srank)
                clock_arg = a;
            else
                prof_arg = a;
        } else if (strcmp(a, "--skew-ns") == 0) {
            char *end;
            errno = 0;
            long long n = strtoll(v, &end, 10);
            /* TERN_CLOCK_SKEW_NS's own bounds (core/config.c) */
            if (*v == '\0' || *end || errno || n < -1000000000000000ll || n > 1000000000000000ll) {
                fprintf(stderr,
                        "tern-perf: bad --skew-ns '%s' (nanoseconds, at most 1e15 "
                        "either way)\n",
                        v);
                return 2;
            }
            skew.ns = n;
            skew_ns_given = 1;
            clock_arg = a;
        } else if (strcmp(a, "--format") == 0) {
            if (strcmp(v, "table") == 0)
                fmt = FMT_TABLE;
            else if (strcmp(v, "csv") == 0)
                fmt = FMT_CSV;
            else if (strcmp(v, "json") == 0)
                fmt = FMT_JSON;
            else {
                fprintf(stderr, "tern-perf: unknown format '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "tern-perf: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        i += takes;
    }
    if (coll_opt && !is_coll) {
        fprintf(stderr, "tern-perf: %s applies to the collective tests only, not %s\n", coll_arg,
                argv[1]);
        return 2;
    }
    int is_clock = opts.test == TERN_BENCH_CLOCK, is_prof = opts.test == TERN_BENCH_PROF;
    if ((clock_arg && !is_clock) || (prof_arg && !is_prof)) {
        fprintf(stderr, "tern-perf: %s applies to %s only, not %s\n",
                clock_arg ? clock_arg : prof_arg, clock_arg ? "clock" : "prof", argv[1]);
        return 2;
    }
    if (want_rss && (is_clock || is_prof)) {
        fprintf(stderr, "tern-perf: --rss does not apply to %s\n", argv[1]);
        return 2;
    }
    if ((skew.rank >= 0) != skew_ns_given) {
        fprintf(stderr, "tern-perf: --skew-rank and --skew-ns go together\n");
        return 2;
    }
    if (is_clock)
        popts.reps = opts.iters;
    if (is_prof) {
        if (nsizes > 1 || range_given) {
            fprintf(stderr, "tern-perf: prof measures one size (--sizes N)\n");
            return 2;
        }
        /* Each profiled batch is one session: 2 events a call on one thread's
         * buffer, which holds 4M. */
        if (opts.iters > 1000000) {
            fprintf(stderr, "tern-perf: prof: at most 1000000 calls per batch (--iters)\n");
            return 2;
        }
        popts.iters = opts.iters;
        popts.warmup = opts.warmup;
        popts.warmup_given = opts.warmup_given;
        popts.size = nsizes ? sizes[0] : 8;
    }
    int is_reduction = opts.test == TERN_BENCH_ALLREDUCE || opts.test == TERN_BENCH_REDUCE ||
                       opts.test == TERN_BENCH_REDUCE_SCATTER;
    int is_rooted = opts.test == TERN_BENCH_BROADCAST || opts.test == TERN_BENCH_REDUCE ||
                    opts.test == TERN_BENCH_GATHER || opts.test == TERN_BENCH_SCATTER;
    if (is_reduction && tern__reduce_check(opts.op, opts.dtype) != TERN_OK) {
        fprintf(stderr, "tern-perf: --op %s --dtype %s: %s\n", tern_reduce_op_name(opts.op),
                tern_dtype_name(opts.dtype), tern_last_error());
        return 2;
    }
    if (opts.inplace && opts.test != TERN_BENCH_ALLREDUCE) {
        fprintf(stderr, "tern-perf: --inplace is for allreduce, not %s\n", argv[1]);
        return 2;
    }
    if (strcmp(mem, "host") != 0) {
        /* Never measure something other than what was asked for. */
        fprintf(stderr, "tern-perf: --mem %s: this build's point-to-point layer moves host "
                        "memory only (CUDA buffers come with the GPU milestone)\n",
                mem);
        return 2;
    }
    if (nsizes > 0 && range_given) {
        fprintf(stderr, "tern-perf: --sizes and --min-size/--max-size are two ways to say the sizes; give one\n");
        return 2;
    }
    if (opts.test == TERN_BENCH_BARRIER) {
        /* No payload: one row, whatever the sizes say. */
        nsizes = 1;
        sizes[0] = 0;
    } else if (is_rpc && nsizes == 0 && !range_given) {
        nsizes = 1; /* an RPC's round trip is about its overhead: one small size */
        sizes[0] = 8;
    } else if (nsizes == 0) {
        if (min_size > max_size) {
            fprintf(stderr, "tern-perf: the size range is empty: --min-size %zu is above --max-size %zu (defaults 1 and 4M)\n",
                    min_size, max_size);
            return 2;
        }
        for (size_t s = min_size; s <= max_size && nsizes < 64; s = s ? s * 2 : 1)
            sizes[nsizes++] = s;
    }

    if (skew.rank >= 0) {
        /* tern-run gives every rank the same environment: rank R sets the
         * skew itself, before anything can read the profiler's clock. */
        skew.predicted = launch_rank(&skew.env_ns);
        if (skew.predicted == skew.rank) {
            char val[32];
            snprintf(val, sizeof(val), "%lld", skew.ns);
            setenv("TERN_CLOCK_SKEW_NS", val, 1);
        }
    }
    if (tern_init(NULL, &ctx) != TERN_OK) {
        fprintf(stderr, "tern-perf: tern_init: %s\n", tern_last_error());
        return 1;
    }
    unsigned rank = tern_ctx_rank(ctx), world = tern_ctx_world_size(ctx);
    char prov[16], dev[128];
    tern_ctx_transport(ctx, prov, sizeof(prov), dev, sizeof(dev));
    if (world < 2 && !is_coll) {
        if (rank == 0)
            fprintf(stderr, "tern-perf: needs 2 or more ranks (tern-run -n 2 tern-perf %s)\n",
                    argv[1]);
        goto out;
    }
    if (is_rooted && (unsigned)opts.root >= world) {
        if (rank == 0)
            fprintf(stderr, "tern-perf: --root %d is not a rank (0..%u)\n", opts.root, world - 1);
        goto out;
    }
    if (is_clock || is_prof) {
        /* Rank 0 prints once everything is measured. */
        rc = is_clock ? run_clock(ctx, fmt, &popts, prov, dev, mem, &skew)
                      : run_prof(ctx, fmt, &popts, prov, dev, mem);
        goto out;
    }
    /* Every rank a worker before anything prints, so a failure here is the
     * only output. */
    if (is_rpc && tern_bench_rpc_init(ctx, &opts) != TERN_OK) {
        fprintf(stderr, "tern-perf: rank %u: rpc: %s\n", rank, tern_last_error());
        goto out;
    }
    long rss0 = rss_kb();
    const char *test = tern_bench_name(opts.test);
    /* What a collective row was measured with, for the table and JSON (the
     * CSV's columns are fixed; its callers know what they asked for). */
    char what[64] = "";
    if (is_coll && opts.test != TERN_BENCH_BARRIER)
        snprintf(what, sizeof(what), ", %s%s%s", tern_dtype_name(opts.dtype),
                 is_reduction ? " " : "", is_reduction ? tern_reduce_op_name(opts.op) : "");
    if (is_rooted) {
        size_t l = strlen(what);
        snprintf(what + l, sizeof(what) - l, ", root %d", opts.root);
    }
    if (opts.inplace) {
        size_t l = strlen(what);
        snprintf(what + l, sizeof(what) - l, ", in place");
    }
    if (rank == 0) {
        if (fmt == FMT_CSV) {
            /* The header is fixed for scripts, so the provider's device, which
             * no column holds, goes to stderr (as the steal warning does). */
            fprintf(stderr, "# tern-perf %s: transport %s on %s, mem %s, %u ranks\n", test, prov,
                    dev, mem, world);
            printf("%s\n", TERN_BENCH_CSV_HEADER);
        } else if (fmt == FMT_JSON) {
            printf("{\"test\":\"%s\",\"transport\":\"%s\",\"device\":\"%s\",\"mem\":\"%s\","
                   "\"ranks\":%u,",
                   test, prov, dev, mem, world);
            if (is_coll && opts.test != TERN_BENCH_BARRIER)
                printf("\"dtype\":\"%s\",", tern_dtype_name(opts.dtype));
            if (is_reduction)
                printf("\"op\":\"%s\",", tern_reduce_op_name(opts.op));
            if (is_rooted)
                printf("\"root\":%d,", opts.root);
            if (opts.inplace)
                printf("\"inplace\":true,");
            if (is_rpc)
                printf("\"window\":%u,", opts.window ? opts.window : 64);
            printf("\"results\":[");
        } else if (is_coll) {
            printf("# tern-perf %s: transport %s on %s, mem %s, %u ranks%s\n"
                   "%12s %8s %10s %10s %10s %12s %12s\n",
                   test, prov, dev, mem, world, what, "size", "iters", "lat_p50_us", "lat_avg_us",
                   "lat_p99_us", "algbw_GBps", "busbw_GBps");
        } else if (is_rpc) {
            printf("# tern-perf rpc: transport %s on %s, mem %s, %u ranks, window %u; rpc_lat\n"
                   "# is the round trip of rpc_sync (us), rpc_rate rpc_async calls per second\n"
                   "%-9s %12s %8s %10s %10s %10s %12s %14s\n",
                   prov, dev, mem, world, opts.window ? opts.window : 64, "test", "size", "iters",
                   "lat_p50_us", "lat_avg_us", "lat_p99_us", "bw_GBps", "calls/s");
        } else {
            printf("# tern-perf %s: transport %s on %s, mem %s, %u ranks\n"
                   "%12s %8s %10s %10s %10s %12s %14s\n",
                   test, prov, dev, mem, world, "size", "iters", "lat_p50_us", "lat_avg_us",
                   "lat_p99_us", "bw_GBps", "msg/s");
        }
        fflush(stdout);
    }
    tern_bench_cpu_t run0, run1;
    tern_bench_cpu_read(&run0);
    if (is_rpc) {
        /* Rank 0 calls, the others serve until it is done; every rank then
         * shuts RPC down, failed or not. Only rank 0 loops, so the steal is
         * its host's. */
        int failed = 0;
        unsigned row = 0;
        tern_bench_result_t r;
        tern_bench_cpu_t c0, c1;
        for (unsigned i = 0; rank == 0 && i < nsizes && !failed; i++) {
            tern_bench_cpu_read(&c0);
            if (tern_bench_rpc_lat(ctx, &opts, sizes[i], &r) != TERN_OK) {
                fprintf(stderr, "tern-perf: rpc_lat at %zu bytes: %s\n", sizes[i],
                        tern_last_error());
                failed = 1;
                break;
            }
            tern_bench_cpu_read(&c1);
            print_p2p(fmt, "rpc_lat", prov, mem, world, &r, HAS_LAT | (r.size ? HAS_BW : 0), 1,
                      row++, tern_bench_steal_pct(&c0, &c1));
            fflush(stdout);
        }
        if (rank == 0 && !failed) {
            tern_bench_cpu_read(&c0);
            if (tern_bench_rpc_rate(ctx, &opts, &r) != TERN_OK) {
                fprintf(stderr, "tern-perf: rpc_rate: %s\n", tern_last_error());
                failed = 1;
            } else {
                tern_bench_cpu_read(&c1);
                print_p2p(fmt, "rpc_rate", prov, mem, world, &r, HAS_RATE, 1, row++,
                          tern_bench_steal_pct(&c0, &c1));
                fflush(stdout);
            }
        }
        if (tern_bench_rpc_fini(ctx) != TERN_OK) {
            fprintf(stderr, "tern-perf: rank %u: rpc shutdown: %s\n", rank, tern_last_error());
            failed = 1;
        }
        if (failed)
            goto out;
        nsizes = 0; /* the rows are out */
    }
    for (unsigned i = 0; i < nsizes; i++) {
        tern_bench_result_t r;
        tern_bench_cpu_t c0, c1;
        tern_bench_cpu_read(&c0);
        tern_status_t st = is_coll ? tern_bench_coll_run(ctx, &opts, sizes[i], &r)
                                   : tern_bench_run(ctx, &opts, sizes[i], &r);
        tern_bench_cpu_read(&c1);
        if (st != TERN_OK) {
            fprintf(stderr, "tern-perf: rank %u: %s at %zu bytes: %s\n", rank, test, sizes[i],
                    tern_last_error());
            goto out;
        }
        if (r.check_failures > 0) {
            /* Every rank knows the count; each wrong one says where it was. */
            if (r.check_detail[0] != '\0')
                fprintf(stderr, "tern-perf: --check failed: %s\n", r.check_detail);
            if (rank == 0)
                fprintf(stderr, "tern-perf: --check: %u of %u ranks got wrong results\n",
                        r.check_failures, world);
            goto out;
        }
        double steal = steal_max(ctx, tern_bench_steal_pct(&c0, &c1));
        if (rank != 0)
            continue;
        if (is_coll)
            print_coll(fmt, test, prov, mem, world, &r, opts.test != TERN_BENCH_BARRIER, i, steal);
        else
            print_p2p(fmt, test, prov, mem, world, &r,
                      opts.test == TERN_BENCH_LAT ? HAS_LAT : HAS_BW | HAS_RATE, 0, i, steal);
        fflush(stdout);
    }
    tern_bench_cpu_read(&run1);
    /* rpc printed its rows above (nsizes is 0 by now); its steal is rank 0's. */
    double run_steal = tern_bench_steal_pct(&run0, &run1);
    if (!is_rpc)
        run_steal = steal_max(ctx, run_steal);
    if (rank == 0)
        print_run_steal(fmt, run_steal);
    if (rank == 0 && fmt == FMT_TABLE && opts.check)
        printf("# --check: every rank's results matched the reference at every size\n");
    if (want_rss) {
        char key[32], val[64];
        snprintf(key, sizeof(key), "rss/%u", rank);
        snprintf(val, sizeof(val), "%ld %ld", rss0, rss_kb());
        tern_store_set(tern_ctx_store(ctx), key, val, strlen(val));
        if (rank == 0) {
            for (unsigned r = 0; r < world; r++) {
                void *v;
                long a = -1, b = -1;
                snprintf(key, sizeof(key), "rss/%u", r);
                if (tern_store_get(tern_ctx_store(ctx), key, &v, NULL, TERN_TIMEOUT_DEFAULT) == TERN_OK) {
                    sscanf(v, "%ld %ld", &a, &b);
                    free(v);
                }
                fprintf(fmt == FMT_TABLE ? stdout : stderr,
                        "# rss rank %u: %ld kB before, %ld kB after\n", r, a, b);
            }
        }
    }
    rc = 0;
out:
    if (tern_finalize(ctx) != TERN_OK) {
        fprintf(stderr, "tern-perf: rank %u: finalize: %s\n", rank, tern_last_error());
        rc = 1;
    }
    return rc;
}
