/*
 * The worker pool: a small set of threads, sized and bound from the hwloc
 * topology, that runs tern's background work (RPC handlers, reductions). tern
 * never starts a thread per peer or per request; everything that is not the
 * progress thread runs here.
 *
 * Threading: every function may be called from any thread, including from a
 * task running on the pool, except tern_pool_destroy(), which must not be
 * called from the pool's own threads.
 */
#ifndef TERN_POOL_H
#define TERN_POOL_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include <tern/defs.h>
#include <tern/status.h>

TERN_BEGIN_DECLS

typedef struct tern_pool tern_pool_t;

/* A task. It owns nothing of the pool's and must not block forever: the pool
 * has a fixed number of threads. */
typedef void (*tern_task_fn)(void *arg);

enum tern_pool_param_field {
    TERN_POOL_PARAM_THREADS = 1u << 0,
    TERN_POOL_PARAM_DEVICE = 1u << 1,
    TERN_POOL_PARAM_BIND = 1u << 2,
    TERN_POOL_PARAM_LOCAL = 1u << 3,
    TERN_POOL_PARAM_QUEUE_LIMIT = 1u << 4,
    TERN_POOL_PARAM_LOG_RANK = 1u << 5,
    TERN_POOL_PARAM_SHARE = 1u << 6,
};

/* Fields are read only where their bit is set in field_mask; unset fields take
 * the defaults in brackets. */
typedef struct tern_pool_params {
    uint64_t field_mask;
    unsigned threads;         /* [0] 0: one per core of the chosen set */
    const char *device;       /* [NULL: all cores] PCI bus id "0000:3b:00.0", OS device
                                 name "mlx5_0"/"eth0", or "cuda:N": use the cores of
                                 the NUMA node closest to it */
    int bind;                 /* [1] bind each thread to one core of the set */
    unsigned local_rank;      /* [0, 1] ranks on this machine share the set: each */
    unsigned local_world_size; /*  takes a disjoint slice when there are enough cores */
    size_t queue_limit;       /* [0: unbounded] submit beyond it: TERN_ERR_NO_RESOURCE */
    int log_rank;             /* [-1] rank shown in the pool threads' log lines */
    unsigned share_rank;      /* [unknown] how many ranks on this machine run on exactly */
    unsigned share_size;      /*  this process's cores, and which of them this one is:
                                  with it, a process its launcher pinned slices its cores
                                  among those ranks (tern_init finds it out) */
} tern_pool_params_t;

/* What the pool chose; filled by tern_pool_binding(). */
typedef struct tern_pool_binding {
    unsigned threads;   /* worker threads */
    unsigned cores;     /* cores in the set */
    int bound;          /* 1 if each thread was bound to a core */
    char cpus[256];     /* the set as a PU list, "0-3,8-11" */
    char numa[64];      /* NUMA nodes of the set, "0" or "0-1"; "" if unknown */
    char device[128];   /* the device it was placed near; "" for none */
    char summary[512];  /* one line for people, e.g.
                           "4 threads bound to cores 0-3 (NUMA 0, near mlx5_0)" */
} tern_pool_binding_t;

/*
 * Create a pool (params may be NULL). Errors: TERN_ERR_NO_DEVICE (device named
 * but not found; detail names it), TERN_ERR_INVALID_PARAM, TERN_ERR_NO_MEMORY,
 * TERN_ERR_IO (hwloc failed). A failure to bind is not an error: it is logged
 * at warn and reported as bound = 0.
 */
TERN_API tern_status_t tern_pool_create(const tern_pool_params_t *params, tern_pool_t **pool_out);

/*
 * Queue fn(arg) to run on one of the pool's threads. Returns TERN_OK, or
 * TERN_ERR_NO_RESOURCE when queue_limit tasks are already waiting, or
 * TERN_ERR_CLOSED once tern_pool_destroy() has begun (except for submits from
 * the pool's own tasks, which are still accepted so a draining task can finish
 * its work). On error fn never runs.
 */
TERN_API tern_status_t tern_pool_submit(tern_pool_t *pool, tern_task_fn fn, void *arg);

/* Threads in the pool. */
TERN_API unsigned tern_pool_size(const tern_pool_t *pool);

/* Non-zero when the calling thread is one of this pool's workers. */
TERN_API int tern_pool_in_worker(const tern_pool_t *pool);

/* Copy out the binding the pool chose. */
TERN_API void tern_pool_binding(const tern_pool_t *pool, tern_pool_binding_t *binding);

/*
 * Drain and destroy: runs every task already queued and every task those tasks
 * submit, then joins the threads and frees the pool. NULL is a no-op. Returns
 * TERN_ERR_INVALID_PARAM (and destroys nothing) when called from one of the
 * pool's own threads.
 */
TERN_API tern_status_t tern_pool_destroy(tern_pool_t *pool);

/*
 * Print the machine as hwloc sees it (NUMA nodes, cores, the network and GPU
 * devices and their NUMA locality) and, for each of local_world_size ranks, the
 * binding a pool created with params (NULL: defaults) would get.
 */
TERN_API tern_status_t tern_topology_print(FILE *out, const tern_pool_params_t *params,
                                           unsigned local_world_size);

TERN_END_DECLS

#endif
