/*
 * uthash, configured for tern: by default uthash exits the process when an
 * insertion cannot allocate. Here a failed HASH_ADD leaves the table as it
 * was and sets tern__hash_oom, which the caller clears before and checks after:
 *     tern__hash_oom = false;
 *     HASH_ADD(...);
 *     if (tern__hash_oom) return tern__error(TERN_ERR_NO_MEMORY, ...);
 * Include this instead of <uthash.h>.
 */
#ifndef TERN_CORE_HASH_H
#define TERN_CORE_HASH_H

#include <stdbool.h>

/* One per file that includes this, and per thread: nothing to share. */
static _Thread_local bool tern__hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (tern__hash_oom = true)
#include <uthash.h>

#endif
