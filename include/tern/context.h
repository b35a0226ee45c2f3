/*
 * A tern context: one rank of a job. It holds the rank and world size, the
 * worker pool, the store client and (in later layers) the transport. There are
 * no hidden globals: several contexts can live in one process, one per thread,
 * each a rank of the same or different jobs.
 */
#ifndef TERN_CONTEXT_H
#define TERN_CONTEXT_H

#include <stdint.h>

#include <tern/defs.h>
#include <tern/pool.h>
#include <tern/status.h>
#include <tern/store.h>

TERN_BEGIN_DECLS

typedef struct tern_ctx tern_ctx_t;

enum tern_init_param_field {
    TERN_INIT_PARAM_RANK = 1u << 0,
    TERN_INIT_PARAM_WORLD_SIZE = 1u << 1,
    TERN_INIT_PARAM_LOCAL_RANK = 1u << 2,
    TERN_INIT_PARAM_LOCAL_WORLD_SIZE = 1u << 3,
    TERN_INIT_PARAM_MASTER_ADDR = 1u << 4,
    TERN_INIT_PARAM_MASTER_PORT = 1u << 5,
    TERN_INIT_PARAM_STORE = 1u << 6,
    TERN_INIT_PARAM_THREADS = 1u << 7,
    TERN_INIT_PARAM_DEVICE = 1u << 8,
    TERN_INIT_PARAM_TIMEOUT = 1u << 9,
    TERN_INIT_PARAM_CONNECT_TIMEOUT = 1u << 10,
};

/*
 * What a field left out of field_mask falls back to: the environment (see
 * tern-run --help-env), then the defaults there. Rank and world size come from
 * TERN_RANK/TERN_WORLD_SIZE, then torchrun, Open MPI, PMI and Slurm variables;
 * with none of them the process is rank 0 of 1.
 */
typedef struct tern_init_params {
    uint64_t field_mask;
    unsigned rank;
    unsigned world_size;
    unsigned local_rank;
    unsigned local_world_size;
    const char *master_addr;
    unsigned master_port;
    tern_store_t *store;       /* use this store instead of MASTER_ADDR:PORT; not owned */
    unsigned threads;          /* pool threads; 0: from the topology */
    const char *device;        /* the pool's affinity device (see tern_pool_params_t) */
    int64_t timeout_ns;        /* blocking store calls and finalize */
    int64_t connect_timeout_ns;
} tern_init_params_t;

/*
 * Join the job: read the configuration, start the store server (rank 0) and
 * connect to it, check that every rank agrees on the world size, start the
 * pool. Blocks until the store is reachable. params may be NULL.
 * Errors: TERN_ERR_CONFIG (bad environment variable, named in the detail),
 * TERN_ERR_UNREACHABLE (store not reachable within TERN_CONNECT_TIMEOUT),
 * TERN_ERR_MISMATCH (world size disagreement, duplicate rank),
 * TERN_ERR_ADDR_IN_USE (rank 0 could not listen on MASTER_PORT), and those of
 * tern_pool_create().
 */
TERN_API tern_status_t tern_init(const tern_init_params_t *params, tern_ctx_t **ctx_out);

/*
 * Leave the job: collective. Waits for every rank to reach finalize (up to the
 * timeout), drains the pool, disconnects, and on rank 0 stops the store once
 * every rank has gone. Frees ctx whatever happens; NULL is a no-op. Returns the
 * first error met (TERN_ERR_TIMEOUT when a rank never arrived).
 * As with MPI_Finalize, complete (wait or test) every request first: requests
 * still pending are canceled, and every request handle, pending or not,
 * is invalid afterwards (waiting on one reads freed memory).
 */
TERN_API tern_status_t tern_finalize(tern_ctx_t *ctx);

TERN_API unsigned tern_ctx_rank(const tern_ctx_t *ctx);
TERN_API unsigned tern_ctx_world_size(const tern_ctx_t *ctx);
TERN_API unsigned tern_ctx_local_rank(const tern_ctx_t *ctx);
TERN_API unsigned tern_ctx_local_world_size(const tern_ctx_t *ctx);
/* Where rank and world size came from: "params", "TERN_*", "torchrun", "Open MPI",
 * "PMI", "Slurm" or "default". */
TERN_API const char *tern_ctx_launcher(const tern_ctx_t *ctx);
TERN_API tern_pool_t *tern_ctx_pool(tern_ctx_t *ctx);

/* Change the timeout of the context's blocking store calls and of finalize
 * (as torch's store.set_timeout). Negative values are ignored. */
TERN_API void tern_ctx_set_timeout(tern_ctx_t *ctx, int64_t timeout_ns);
TERN_API tern_store_t *tern_ctx_store(tern_ctx_t *ctx);

TERN_END_DECLS

#endif
