/*
 * tern-perf: latency, bandwidth and message-rate benchmarks between ranks, the
 * collectives timed as nccl-tests times them, and RPC round trips and call
 * rate, run under tern-run, mpirun or srun. Only rank 0 prints, so the CSV
 * stays parseable under any launcher.
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
#include "perf/bench_rpc.h"
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
            "  --transport NAME     tcp | ucx | verbs | auto (default: TERN_TRANSPORT, auto)\n"
            "  --mem host|cuda      where the buffers live (default host)\n"
            "  --sizes LIST         comma-separated sizes, e.g. 8,64,4k,1M\n"
            "  --min-size N         with --max-size: powers of two from N to M\n"
            "  --max-size M         (default 1 to 4M)\n"
            "  --iters N            timed iterations per size (default: by size)\n"
            "  --warmup N           untimed iterations first (default: iters/10)\n"
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
            "Sizes are the operation's buffer as nccl-tests counts them (allgather: the\n"
            "gathered output; reduce_scatter: the input; alltoall: what each rank sends;\n"
            "gather, scatter: the root's buffer), rounded down to a multiple of the element\n"
            "size, times the number of ranks for those five. barrier measures size 0 once.\n"
            "rpc_lat latencies are whole round trips (lat's are half of one); its bw_GBps\n"
            "counts the payload both ways. rpc_rate has size 0 and iters x window calls.\n"
            "Example: tern-run -n 2 tern-perf lat; tern-run -n 4 tern-perf allreduce --check;\n"
            "         tern-run -n 2 tern-perf rpc --sizes 0,8,64k,1M\n");
}

static int parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (tern__parse_size(s, &v) != TERN_OK)
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

/* One point-to-point or rpc row. named: the row says its test (a JSON key, the
 * table's first column), as rpc prints two kinds of rows under one test. */
static void print_p2p(enum format fmt, const char *test, const char *prov, const char *mem,
                      unsigned world, const tern_bench_result_t *r, unsigned has, int named,
                      unsigned i)
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
        putchar('\n');
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
        printf("}");
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
        printf("%12zu %8u %10s %10s %10s %12s %14s\n", r->size, r->iters, p50, avg, p99, bw, rate);
    }
}

/* One collective row; has_bw is 0 for barrier, which moves no payload. */
static void print_coll(enum format fmt, const char *test, const char *prov, const char *mem,
                       unsigned world, const tern_bench_result_t *r, int has_bw, unsigned i)
{
    if (fmt == FMT_CSV) {
        printf("%s,%s,%s,%u,%zu,%u,%.3f,%.3f,%.3f,", test, prov, mem, world, r->size, r->iters,
               r->lat_us_p50, r->lat_us_avg, r->lat_us_p99);
        cell(r->bw_GBps, has_bw), putchar(',');
        cell(r->busbw_GBps, has_bw), putchar(',');
        putchar('\n'); /* msg_rate: point to point only */
    } else if (fmt == FMT_JSON) {
        printf("%s{\"size\":%zu,\"iters\":%u,\"lat_us_p50\":%.3f,\"lat_us_avg\":%.3f,"
               "\"lat_us_p99\":%.3f",
               i ? "," : "", r->size, r->iters, r->lat_us_p50, r->lat_us_avg, r->lat_us_p99);
        if (has_bw)
            printf(",\"bw_GBps\":%.3f,\"busbw_GBps\":%.3f", r->bw_GBps, r->busbw_GBps);
        printf("}");
    } else if (has_bw) {
        printf("%12zu %8u %10.2f %10.2f %10.2f %12.3f %12.3f\n", r->size, r->iters, r->lat_us_p50,
               r->lat_us_avg, r->lat_us_p99, r->bw_GBps, r->busbw_GBps);
    } else {
        printf("%12zu %8u %10.2f %10.2f %10.2f %12s %12s\n", r->size, r->iters, r->lat_us_p50,
               r->lat_us_avg, r->lat_us_p99, "", "");
    }
}

int main(int argc, char **argv)
{
    tern_bench_opts_t opts = {0};
    enum format fmt = FMT_TABLE;
    size_t sizes[64];
    unsigned nsizes = 0;
    size_t min_size = 1, max_size = 4u << 20;
    int want_rss = 0, coll_opt = 0, range_given = 0;
    const char *mem = "host", *coll_arg = NULL;
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
        if (v == NULL) {
            fprintf(stderr, "tern-perf: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--transport") == 0) {
            setenv("TERN_TRANSPORT", v, 1); /* read by tern_init, validated there */
        } else if (strcmp(a, "--mem") == 0) {
            mem = v;
        } else if (strcmp(a, "--sizes") == 0) {
            char *copy = strdup(v), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (nsizes == 64 || parse_size(t, &sizes[nsizes]) != 0) {
                    fprintf(stderr, "tern-perf: bad size '%s' (at most 64 sizes)\n", t);
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
            if (*end || errno || n > 100000000ul || (n == 0 && strcmp(a, "--warmup") != 0)) {
                fprintf(stderr, "tern-perf: bad count '%s' for %s\n", v, a);
                return 2;
            }
            if (a[2] == 'i')
                opts.iters = (unsigned)n;
            else if (a[3] == 'a')
                opts.warmup = (unsigned)n;
            else
                opts.window = (unsigned)n;
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
    int is_reduction = opts.test == TERN_BENCH_ALLREDUCE || opts.test == TERN_BENCH_REDUCE ||
                       opts.test == TERN_BENCH_REDUCE_SCATTER;
    int is_rooted = opts.test == TERN_BENCH_BROADCAST || opts.test == TERN_BENCH_REDUCE ||
                    opts.test == TERN_BENCH_GATHER || opts.test == TERN_BENCH_SCATTER;
    if (is_reduction && tern__reduce_check(opts.op, opts.dtype) != TERN_OK) {
        fprintf(stderr, "tern-perf: --op %s --dtype %s: %s\n", tern_reduce_op_name(opts.op),
                tern_dtype_name(opts.dtype), tern_last_error());
        return 2;
    }
    if (strcmp(mem, "host") != 0) {
        /* Never measure something other than what was asked for. */
        fprintf(stderr, "tern-perf: --mem %s: this build's point-to-point layer moves host "
                        "memory only (CUDA buffers come with the GPU milestone)\n",
                mem);
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
            fprintf(stderr, "tern-perf: --min-size is above --max-size\n");
            return 2;
        }
        for (size_t s = min_size; s <= max_size && nsizes < 64; s = s ? s * 2 : 1)
            sizes[nsizes++] = s;
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
    if (rank == 0) {
        if (fmt == FMT_CSV) {
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
    if (is_rpc) {
        /* Rank 0 calls, the others serve until it is done; every rank then
         * shuts RPC down, failed or not. */
        int failed = 0;
        unsigned row = 0;
        tern_bench_result_t r;
        for (unsigned i = 0; rank == 0 && i < nsizes && !failed; i++) {
            if (tern_bench_rpc_lat(ctx, &opts, sizes[i], &r) != TERN_OK) {
                fprintf(stderr, "tern-perf: rpc_lat at %zu bytes: %s\n", sizes[i],
                        tern_last_error());
                failed = 1;
                break;
            }
            print_p2p(fmt, "rpc_lat", prov, mem, world, &r, HAS_LAT | (r.size ? HAS_BW : 0), 1,
                      row++);
            fflush(stdout);
        }
        if (rank == 0 && !failed) {
            if (tern_bench_rpc_rate(ctx, &opts, &r) != TERN_OK) {
                fprintf(stderr, "tern-perf: rpc_rate: %s\n", tern_last_error());
                failed = 1;
            } else {
                print_p2p(fmt, "rpc_rate", prov, mem, world, &r, HAS_RATE, 1, row++);
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
        tern_status_t st = is_coll ? tern_bench_coll_run(ctx, &opts, sizes[i], &r)
                                   : tern_bench_run(ctx, &opts, sizes[i], &r);
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
        if (rank != 0)
            continue;
        if (is_coll) {
            print_coll(fmt, test, prov, mem, world, &r, opts.test != TERN_BENCH_BARRIER, i);
            continue;
        }
        print_p2p(fmt, test, prov, mem, world, &r,
                  opts.test == TERN_BENCH_LAT ? HAS_LAT : HAS_BW | HAS_RATE, 0, i);
        fflush(stdout);
    }
    if (rank == 0 && fmt == FMT_JSON)
        printf("]}\n");
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
