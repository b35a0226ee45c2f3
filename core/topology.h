/*
 * Placement of the worker pool, shared by core/pool.c and core/topology.c:
 * the pool's parameters with their defaults applied, the hwloc topology, and
 * the set of cores (and the core of each thread) that those parameters choose.
 * Computing a placement starts no thread, so tern_topology_print() can show
 * what every local rank would get.
 */
#ifndef TERN_CORE_TOPOLOGY_H
#define TERN_CORE_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <hwloc.h>

#include <tern/pool.h>

/* TERN_THREADS accepts the same range; more threads than this is a typo. */
#define TERN__POOL_MAX_THREADS 1024u

/* tern_pool_params_t with every default applied and every value checked. */
typedef struct tern__pool_config {
    unsigned threads;   /* 0: one per core of the set */
    const char *device; /* borrowed from the caller's params; NULL: none */
    bool bind;
    unsigned local_rank;
    unsigned local_world_size; /* >= 1, > local_rank */
    unsigned share_rank;       /* < share_size */
    unsigned share_size;       /* ranks on exactly this process's cores; 0: unknown */
    size_t queue_limit;        /* 0: unbounded */
    int log_rank;
} tern__pool_config_t;

/*
 * Apply the defaults of include/tern/pool.h to params (NULL: all defaults).
 * TERN_ERR_INVALID_PARAM for an unknown field_mask bit, threads above
 * TERN__POOL_MAX_THREADS, local_world_size 0 or local_rank >= local_world_size.
 * An empty device string means no device, as TERN_AFFINITY_DEVICE="" does.
 */
tern_status_t tern__pool_config_resolve(const tern_pool_params_t *params, tern__pool_config_t *cfg);

/* Load this machine's topology with the important I/O devices (NICs, GPUs,
 * OpenFabrics) kept. TERN_ERR_IO when hwloc fails. The caller owns *topo and
 * frees it with hwloc_topology_destroy(). */
tern_status_t tern__topology_load(hwloc_topology_t *topo);

/* Where a pool's threads go. Built by tern__placement_init(); immutable after,
 * so any thread may read it without a lock. */
typedef struct tern__placement {
    hwloc_topology_t topo;     /* borrowed; must outlive the placement */
    hwloc_bitmap_t cpuset;     /* PUs of the chosen (sliced) set */
    hwloc_bitmap_t *core_sets; /* ncores entries: one core's PUs within cpuset */
    unsigned ncores;
    unsigned threads; /* worker threads to start, >= 1 */
    unsigned first;   /* core of worker 0: ranks sharing a set start apart */
    bool bind;
    /* Filled except bound and summary, which tern__placement_summarize() writes. */
    tern_pool_binding_t binding;
    char core_list[256]; /* logical indexes of the cores, "0-3" */
    char where[160];     /* "all cores", "near mlx5_0", ... for the summary */
    char local[96];      /* "local rank 0 of 2", "shared by 4 local ranks" or "" */
} tern__placement_t;

/*
 * Choose the set of cores for cfg on topo (see docs/threads.md): all allowed
 * cores, or those of the NUMA node(s) closest to cfg->device, then this local
 * rank's slice of them. Errors: TERN_ERR_NO_DEVICE (device not found; detail
 * names it), TERN_ERR_UNSUPPORTED (cuda:N without CUDA), TERN_ERR_INVALID_PARAM
 * (malformed cuda:N), TERN_ERR_NO_MEMORY. On error pl is left safe for
 * tern__placement_fini(). Does not block; calls into the CUDA runtime for cuda:N.
 */
tern_status_t tern__placement_init(tern__placement_t *pl, hwloc_topology_t topo,
                                   const tern__pool_config_t *cfg);

/* Free what tern__placement_init() allocated; safe on a zeroed or half-built
 * placement. Leaves the borrowed topology alone. */
void tern__placement_fini(tern__placement_t *pl);

/* The PUs worker thread i binds to: one core of the set, round-robin. */
hwloc_const_cpuset_t tern__placement_thread_set(const tern__placement_t *pl, unsigned i);

/* Set binding.bound and write binding.summary, the one line people read. */
void tern__placement_summarize(tern__placement_t *pl, int bound);

/*
 * The body of tern_topology_print() on a given topology (tests hand it one read
 * from XML): the machine, then the placement of local ranks 0..local_world_size-1
 * with cfg's other fields. Stops at, and returns, the first placement error,
 * after printing its detail on that rank's line. Writes only to out.
 */
tern_status_t tern__topology_report(FILE *out, hwloc_topology_t topo,
                                    const tern__pool_config_t *cfg, unsigned local_world_size);

/*
 * For tests only: non-zero once tern_pool_destroy() has begun on pool, so a
 * test can wait for that moment instead of sleeping. Takes the pool's lock.
 */
int tern__pool_closing(tern_pool_t *pool);

/* Called from one of pool's own workers: run one queued task on this thread,
 * if there is one (returns 1), else return 0 at once. A worker that must wait
 * for work queued behind it (an RPC handler waiting on a nested call) helps
 * with it instead of holding its thread idle. */
int tern__pool_run_one(tern_pool_t *pool);

#endif
