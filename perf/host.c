/*
 * Steal time from /proc/stat (perf/host.h). The "cpu" line is
 *   cpu  user nice system idle iowait irq softirq steal [guest guest_nice]
 * in USER_HZ ticks summed over every CPU (proc(5)).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf/host.h"

#define CPU_FIELDS 8 /* user .. steal */

int tern_bench_cpu_parse(const char *text, tern_bench_cpu_t *out)
{
    const char *p = text;
    uint64_t v[CPU_FIELDS];

    out->ok = 0;
    /* The aggregate line is the first one, but do not rely on it. */
    while (p != NULL && strncmp(p, "cpu ", 4) != 0) {
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    if (p == NULL)
        return -1;
    p += 4;
    for (int i = 0; i < CPU_FIELDS; i++) {
        char *end;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p < '0' || *p > '9') /* strtoull would take a sign or skip a newline */
            return -1;
        errno = 0;
        unsigned long long x = strtoull(p, &end, 10);
        if (errno != 0 || (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\0'))
            return -1;
        v[i] = x;
        p = end;
    }
    uint64_t total = 0;
    for (int i = 0; i < CPU_FIELDS; i++) {
        if (total + v[i] < total)
            return -1;
        total += v[i];
    }
    out->steal = v[CPU_FIELDS - 1];
    out->total = total;
    out->ok = 1;
    return 0;
}

int tern_bench_cpu_read(tern_bench_cpu_t *out)
{
    /* The cpu line comes first; one read of a page holds it. */
    char buf[4096];
    FILE *f = fopen("/proc/stat", "r");
    out->ok = 0;
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return tern_bench_cpu_parse(buf, out);
}

double tern_bench_steal_pct(const tern_bench_cpu_t *before, const tern_bench_cpu_t *after)
{
    if (!before->ok || !after->ok || after->total <= before->total || after->steal < before->steal)
        return -1;
    uint64_t steal = after->steal - before->steal, total = after->total - before->total;
    if (steal > total)
        return -1;
    return 100.0 * (double)steal / (double)total;
}
