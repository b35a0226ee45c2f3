/* Store internals shared with the context. */
#ifndef TERN_CORE_STORE_H
#define TERN_CORE_STORE_H

#include <tern/store.h>

/*
 * Register rank in an in-process memory store (TERN_ERR_MISMATCH on duplicate
 * rank or world-size disagreement); a no-op for a TCP store, whose server checks
 * at connect time.
 */
tern_status_t tern__store_join(tern_store_t *store, unsigned rank, unsigned world_size);
void tern__store_leave(tern_store_t *store, unsigned rank);

#endif
