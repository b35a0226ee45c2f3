/* Time. */
#ifndef TERN_CLOCK_H
#define TERN_CLOCK_H

#include <stdint.h>
#include <tern/defs.h>

TERN_BEGIN_DECLS

/* Nanoseconds of CLOCK_MONOTONIC: never goes back, not affected by wall-clock
 * changes, comparable only within one machine. */
TERN_API uint64_t tern_clock_ns(void);

TERN_END_DECLS

#endif
