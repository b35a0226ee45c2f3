/* The slow halves of tern__lock_t (lock.h): sleeping on it and waking. */
#include "lock.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static long futex(atomic_int *addr, int op, int val)
{
    return syscall(SYS_futex, (int *)addr, op, val, NULL, NULL, 0);
}

/* Mark the lock contended (2) whenever we take part in it, so the holder's
 * give wakes someone; sleep while it stays held. A spurious or interrupted
 * wake (EINTR, EAGAIN when the value moved) just loops. */
void tern__lock_sleep(tern__lock_t *l)
{
    while (atomic_exchange_explicit(&l->v, 2, memory_order_acquire) != 0)
        (void)futex(&l->v, FUTEX_WAIT_PRIVATE, 2);
}

void tern__lock_wake(tern__lock_t *l)
{
    (void)futex(&l->v, FUTEX_WAKE_PRIVATE, 1);
}
