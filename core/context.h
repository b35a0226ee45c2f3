/*
 * The context's internals, for the layers above core. tern_init() and
 * tern_finalize() live above the transport (p2p/runtime.c) because they open
 * it; core provides the bootstrap they start from and the teardown they end
 * with.
 */
#ifndef TERN_CORE_CONTEXT_H
#define TERN_CORE_CONTEXT_H

#include <stdbool.h>

#include <tern/context.h>

#include "core/config.h"
#include "core/store.h"

/*
 * Configuration, rank and world size, the store (rank 0 serves it), local
 * ranks, the pool: everything of tern_init() below the transport, without the
 * final barrier. On error nothing survives and the detail is recorded.
 */
tern_status_t tern__ctx_bootstrap(const tern_init_params_t *params, tern_ctx_t **ctx_out);

/*
 * Drain the pool, leave the store and free ctx. With collective, rank 0 waits
 * (up to the timeout) for every other rank to disconnect before it stops the
 * store; the caller has already met the others at a barrier.
 */
tern_status_t tern__ctx_teardown(tern_ctx_t *ctx, bool collective);

const tern__config_t *tern__ctx_config(const tern_ctx_t *ctx);
int64_t tern__ctx_timeout(const tern_ctx_t *ctx);

/*
 * Rank 0: end the store server's own thread and return the server, which the
 * caller's loop serves from then on (tern__store_server_serve when *fd_out is
 * readable, and at least every 100 ms); the context's own store calls serve it
 * too while they wait. NULL where this rank serves no store.
 */
tern_store_server_t *tern__ctx_take_store_server(tern_ctx_t *ctx, int *fd_out);

/* One slot for the communication layer's per-context state. */
void tern__ctx_set_comm(tern_ctx_t *ctx, void *comm);
void *tern__ctx_comm(const tern_ctx_t *ctx);

#endif
