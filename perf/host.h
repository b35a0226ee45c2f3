/*
 * What the host did to a run: steal time, the CPU time a hypervisor gave to
 * someone else while this VM's vCPUs wanted to run. Inside the guest it is
 * otherwise invisible, and on a shared VM it is the largest error in a
 * benchmark (docs/perf.md measured 16-63 % of it while jobs ran), so
 * tern-perf reports it beside the figures it spoiled.
 */
#ifndef TERN_PERF_HOST_H
#define TERN_PERF_HOST_H

#include <stdint.h>

/* One reading of the machine's CPU time counters (/proc/stat's "cpu" line),
 * in clock ticks summed over every CPU. */
typedef struct tern_bench_cpu {
    uint64_t steal; /* taken by the hypervisor */
    uint64_t total; /* user..steal (guest time is already inside user and nice) */
    int ok;         /* the reading succeeded */
} tern_bench_cpu_t;

/* Above this share of CPU time stolen, tern-perf flags a row and the run. */
#define TERN_BENCH_STEAL_WARN_PCT 5.0

/* Parse the text of /proc/stat: 0, or -1 (and out->ok 0) when it has no
 * "cpu" line with the eight fields up to steal (kernels before 2.6.11). */
int tern_bench_cpu_parse(const char *text, tern_bench_cpu_t *out);

/* Read /proc/stat: 0, or -1 (and out->ok 0) when it cannot be read or parsed
 * (not Linux, or no /proc). */
int tern_bench_cpu_read(tern_bench_cpu_t *out);

/* Steal between two readings in % of all CPU time, or -1 when unknown (a
 * reading failed, no tick passed, or a counter went back). A tick is 10 ms
 * per CPU (USER_HZ 100), so a reading over less than a few dozen ticks is
 * coarse. */
double tern_bench_steal_pct(const tern_bench_cpu_t *before, const tern_bench_cpu_t *after);

#endif
