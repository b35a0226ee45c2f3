/* Store internals shared with the context. */
#ifndef TERN_CORE_STORE_H
#define TERN_CORE_STORE_H

#include <tern/store.h>

/*
 * Register rank in an in-process memory store (TERN_ERR_MISMATCH on duplicate
 * rank or world-size disagreement); a no-op for a TCP store, whose server checks
 * at connect time.
 */
/* "job:" and this process's job token: TERN_JOB_ID (tern-run sets one per
 * job), else the launcher's own (TORCHELASTIC_RUN_ID, PMIX_NAMESPACE,
 * SLURM_JOB_ID.SLURM_STEP_ID), else none ("job:"). Read once. */
const char *tern__store_job(void);

tern_status_t tern__store_join(tern_store_t *store, unsigned rank, unsigned world_size);
void tern__store_leave(tern_store_t *store, unsigned rank);

/*
 * A further connection to the server of TCP client store, as the same rank,
 * for a caller whose requests must not queue behind the ones of store's other
 * users (a handle serves one request at a time, and a get or wait may last
 * long): the endpoint lookups of the communication layer. The server does
 * not count it as a member (no duplicate-rank refusal; shutdown does not wait
 * for it). Close it with tern_store_close before store's server stops.
 * *aux_out is NULL, and TERN_OK returned, for a memory store, whose calls
 * never hold its lock while they wait: store itself serves such a caller.
 * Blocks for a connect and a round trip; on the rank that serves the store,
 * call it while the server still has a thread of its own (before
 * tern__store_server_adopt), then tern__store_assist the new handle.
 */
tern_status_t tern__store_connect_aux(tern_store_t *store, tern_store_t **aux_out);

/*
 * Take serving away from the server's own thread (which exits): from now on
 * tern__store_server_serve serves it, called whenever *fd_out (its epoll fd)
 * is readable and at least every 100 ms (parked requests' deadlines). Until
 * tern_store_server_stop, which then serves by itself while it waits.
 */
tern_status_t tern__store_server_adopt(tern_store_server_t *server, int *fd_out);

/* Serve what is ready without blocking. Any thread; while one serves, the
 * others return at once. A no-op for a server that was not adopted. */
void tern__store_server_serve(tern_store_server_t *server);

/*
 * Make store's requests serve server while they wait for their replies: the
 * client of a store this process serves may be called from the very thread
 * that serves it.
 */
void tern__store_assist(tern_store_t *store, tern_store_server_t *server);

#endif
