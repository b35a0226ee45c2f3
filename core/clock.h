/* Clocks for tern's own bookkeeping (the public one is tern/clock.h). */
#ifndef TERN_CORE_CLOCK_H
#define TERN_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic ns at the kernel tick's resolution (a few ms), at a fraction of
 * tern_clock_ns()'s cost: for "is it time yet" checks on hot paths, where a
 * precise read would cost more than the work it guards. */
uint64_t tern__clock_coarse_ns(void);

/* CLOCK_REALTIME ns from now, as pthread_cond_timedwait wants its deadline. */
struct timespec tern__clock_realtime_after(uint64_t ns);

#endif
