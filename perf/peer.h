/*
 * What the standalone peers (tcp-pingpong, ucp-am-pingpong) share: they link
 * nothing of tern's, so these are header-only.
 */
#ifndef TERN_PERF_PEER_H
#define TERN_PERF_PEER_H

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t peer_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Read (out == 0) or write all n bytes of buf on fd; -1 on error or EOF. */
static inline int peer_xfer(int fd, void *buf, size_t n, int out)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = out ? write(fd, p, n) : read(fd, p, n);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* With PEER_BIND=1 (perf/compare.sh BIND=core), put this side on one CPU:
 * the parent on CPU 0 and the forked child on CPU 1, as tern-run --bind-to
 * core places ranks 0 and 1, so both sides of a comparison sit alike. */
static inline void peer_bind(int child)
{
    const char *e = getenv("PEER_BIND");
    if (e == NULL || e[0] != '1')
        return;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(n > 1 ? child != 0 : 0, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        perror("peer: sched_setaffinity");
}

static inline int peer_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* "NAME,SIZE,AVG,P50" in us, from samples in ns (sorted in place) divided
 * by div: 2 for one way of a round trip. */
static inline void peer_print_us(const char *name, size_t size, uint64_t *ns, unsigned iters,
                                 double div)
{
    double sum = 0;
    for (unsigned i = 0; i < iters; i++)
        sum += (double)ns[i];
    qsort(ns, iters, sizeof(*ns), peer_cmp_u64);
    printf("%s,%zu,%.3f,%.3f\n", name, size, sum / iters / 1000.0 / div,
           (double)ns[iters / 2] / 1000.0 / div);
    fflush(stdout);
}

/* "lat,SIZE,AVG,P50": one-way (half the round trip) in us, from round-trip
 * samples in ns (sorted in place). */
static inline void peer_print_lat(size_t size, uint64_t *rtt_ns, unsigned iters)
{
    peer_print_us("lat", size, rtt_ns, iters, 2.0);
}

#endif
