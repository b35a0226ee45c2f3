/* A small mutex for the hot path: one compare-and-swap to take it, one
 * exchange to let it go, the kernel (a futex) only when a thread must sleep.
 *
 * Why not pthread_mutex_t: glibc's trylock and unlock are calls of 25-35
 * instructions each (type dispatch, owner and user counts). A shared-memory
 * message takes and lets go of its communicator's lock twice on each side,
 * and at that rate the four calls were about 120 of the roughly 1,400
 * instructions a rank spends per message (docs/perf.md). This lock inlines to
 * a few instructions each way and does the same locked operations.
 *
 * Not recursive, no owner checks, no condition variables: the communicator's
 * lock needs none of them. The acquire and release orders are what
 * ThreadSanitizer follows, so it still sees the data the lock guards as
 * guarded. */
#ifndef TERN_CORE_LOCK_H
#define TERN_CORE_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>

/* 0 free, 1 held, 2 held and maybe a thread asleep on it: the three-state
 * mutex of Drepper's "Futexes Are Tricky", given back by an exchange. */
typedef struct tern__lock {
    atomic_int v;
} tern__lock_t;

void tern__lock_sleep(tern__lock_t *l); /* the contended take (lock.c) */
void tern__lock_wake(tern__lock_t *l);  /* wake one sleeper (lock.c) */

static inline bool tern__lock_try(tern__lock_t *l)
{
    int free = 0;
    return atomic_compare_exchange_strong_explicit(&l->v, &free, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

static inline void tern__lock_take(tern__lock_t *l)
{
    if (!tern__lock_try(l))
        tern__lock_sleep(l);
}

static inline void tern__lock_give(tern__lock_t *l)
{
    if (atomic_exchange_explicit(&l->v, 0, memory_order_release) == 2)
        tern__lock_wake(l);
}

#endif
