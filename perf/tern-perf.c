/*
 * tern-perf: latency, bandwidth and message-rate benchmarks between ranks,
 * run under tern-run, mpirun or srun. Only rank 0 prints, so the CSV stays
 * parseable under any launcher.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <tern/tern.h>

#include "core/config.h"
#include "perf/bench.h"

enum format { FMT_TABLE, FMT_CSV, FMT_JSON };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tern-perf TEST [options]\n"
            "  TEST                 lat | bw | bibw | rate\n"
            "  --transport NAME     tcp | ucx | verbs | auto (default: TERN_TRANSPORT, auto)\n"
            "  --mem host|cuda      where the buffers live (default host)\n"
            "  --sizes LIST         comma-separated sizes, e.g. 8,64,4k,1M\n"
            "  --min-size N         with --max-size: powers of two from N to M\n"
            "  --max-size M         (default 1 to 4M)\n"
            "  --iters N            timed iterations per size (default: by size)\n"
            "  --warmup N           untimed iterations first (default: iters/10)\n"
            "  --window W           messages in flight for bw, bibw, rate (default 64)\n"
            "  --format table|csv|json   (default table)\n"
            "  --rss                report each rank's resident memory before and after\n"
            "Run it with 2 or more ranks: tern-run -n 2 tern-perf lat\n");
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

int main(int argc, char **argv)
{
    tern_bench_opts_t opts = {0};
    enum format fmt = FMT_TABLE;
    size_t sizes[64];
    unsigned nsizes = 0;
    size_t min_size = 1, max_size = 4u << 20;
    int want_rss = 0;
    const char *mem = "host";
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
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (strcmp(a, "--rss") == 0) {
            want_rss = 1;
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
    if (strcmp(mem, "host") != 0) {
        /* Never measure something other than what was asked for. */
        fprintf(stderr, "tern-perf: --mem %s: this build's point-to-point layer moves host "
                        "memory only (CUDA buffers come with the GPU milestone)\n",
                mem);
        return 2;
    }
    if (nsizes == 0) {
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
    if (world < 2) {
        if (rank == 0)
            fprintf(stderr, "tern-perf: needs 2 or more ranks (tern-run -n 2 tern-perf %s)\n",
                    argv[1]);
        goto out;
    }
    long rss0 = rss_kb();
    const char *test = tern_bench_name(opts.test);
    if (rank == 0) {
        if (fmt == FMT_CSV)
            printf("%s\n", TERN_BENCH_CSV_HEADER);
        else if (fmt == FMT_JSON)
            printf("{\"test\":\"%s\",\"transport\":\"%s\",\"device\":\"%s\",\"mem\":\"%s\","
                   "\"ranks\":%u,\"results\":[",
                   test, prov, dev, mem, world);
        else
            printf("# tern-perf %s: transport %s on %s, mem %s, %u ranks\n"
                   "%12s %8s %10s %10s %10s %12s %14s\n",
                   test, prov, dev, mem, world, "size", "iters", "lat_p50_us", "lat_avg_us",
                   "lat_p99_us", "bw_GBps", "msg/s");
        fflush(stdout);
    }
    for (unsigned i = 0; i < nsizes; i++) {
        tern_bench_result_t r;
        if (tern_bench_run(ctx, &opts, sizes[i], &r) != TERN_OK) {
            fprintf(stderr, "tern-perf: rank %u: %s at %zu bytes: %s\n", rank, test, sizes[i],
                    tern_last_error());
            goto out;
        }
        if (rank != 0)
            continue;
        int is_lat = opts.test == TERN_BENCH_LAT;
        if (fmt == FMT_CSV) {
            printf("%s,%s,%s,%u,%zu,%u,", test, prov, mem, world, r.size, r.iters);
            cell(r.lat_us_p50, is_lat), putchar(',');
            cell(r.lat_us_avg, is_lat), putchar(',');
            cell(r.lat_us_p99, is_lat), putchar(',');
            cell(r.bw_GBps, !is_lat), putchar(',');
            putchar(','); /* busbw: collectives only */
            if (!is_lat)
                printf("%.0f", r.msg_rate);
            putchar('\n');
        } else if (fmt == FMT_JSON) {
            printf("%s{\"size\":%zu,\"iters\":%u", i ? "," : "", r.size, r.iters);
            if (is_lat)
                printf(",\"lat_us_p50\":%.3f,\"lat_us_avg\":%.3f,\"lat_us_p99\":%.3f",
                       r.lat_us_p50, r.lat_us_avg, r.lat_us_p99);
            else
                printf(",\"bw_GBps\":%.3f,\"msg_rate\":%.0f", r.bw_GBps, r.msg_rate);
            printf("}");
        } else if (is_lat) {
            printf("%12zu %8u %10.2f %10.2f %10.2f %12s %14s\n", r.size, r.iters, r.lat_us_p50,
                   r.lat_us_avg, r.lat_us_p99, "", "");
        } else {
            printf("%12zu %8u %10s %10s %10s %12.3f %14.0f\n", r.size, r.iters, "", "", "",
                   r.bw_GBps, r.msg_rate);
        }
        fflush(stdout);
    }
    if (rank == 0 && fmt == FMT_JSON)
        printf("]}\n");
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
