/*
 * The configuration of one context, parsed from the environment in one place
 * (config.c holds the only table of variables and the only getenv in tern).
 */
#ifndef TERN_CORE_CONFIG_H
#define TERN_CORE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include <tern/env.h>
#include <tern/log.h>

#define TERN__UNSET (-1)
/* A size field set to "auto": whoever reads it decides (TERN_EAGER_LIMIT). */
#define TERN__SIZE_AUTO UINT64_MAX

/* What one launcher told us; TERN__UNSET where it said nothing. */
typedef struct tern__launch_ids {
    int64_t rank;
    int64_t world_size;
    int64_t local_rank;
    int64_t local_world_size;
} tern__launch_ids_t;

typedef enum tern__launcher {
    TERN__LAUNCHER_TERN,
    TERN__LAUNCHER_TORCHRUN,
    TERN__LAUNCHER_OMPI,
    TERN__LAUNCHER_PMI,
    TERN__LAUNCHER_SLURM,
    TERN__LAUNCHER_COUNT
} tern__launcher_t;

typedef struct tern__config {
    int64_t log_level; /* tern_log_level_t */
    tern__launch_ids_t launch[TERN__LAUNCHER_COUNT];
    char master_addr[256];
    int64_t master_port;
    char tern_master_addr[256]; /* "" unless TERN_MASTER_ADDR overrides MASTER_ADDR */
    char job_id[128]; /* TERN_JOB_ID: the store refuses ranks of other jobs (core/store.c) */
    int64_t tern_master_port;   /* TERN__UNSET unless TERN_MASTER_PORT overrides */
    bool torch_agent_store;     /* torchrun's agent already serves MASTER_PORT */
    int64_t connect_timeout_ns;
    int64_t timeout_ns;
    int64_t threads; /* 0: from the topology */
    char affinity_device[128];
    bool bind;
    int64_t transport; /* 0 auto, 1 verbs, 2 ucx, 3 tcp (the TERN_TRANSPORT enum order) */
    int64_t poll;      /* 0 blocking, 1 busy */
    int64_t poll_spin_ns;
    int64_t progress_nap_ns; /* the progress thread's longest nap (runtime.c) */
    uint64_t tcp_sockbuf;
    uint64_t tcp_zcopy;
    int64_t tcp_zcopy_mode; /* 0 auto, 1 always */
    uint64_t tcp_write_max;
    uint64_t ucx_cma;
    uint64_t eager_limit; /* TERN__SIZE_AUTO: the transport's attr.eager_size */
    uint64_t unexpected_max;
    /* collectives: algorithm overrides (0 = auto; then each enum's order) */
    int64_t coll_algo_allreduce; /* auto|ring|rd|rabenseifner */
    int64_t coll_algo_broadcast; /* auto|binomial|chain */
    int64_t coll_algo_reduce;    /* auto|binomial|chain */
    int64_t coll_algo_allgather; /* auto|ring|bruck */
    int64_t coll_algo_alltoall;  /* auto|pairwise|linear */
    uint64_t coll_segment;
    uint64_t coll_eager_limit;
    bool coll_rtr;
    /* rpc */
    int64_t rpc_timeout_ns;
    int64_t rpc_window;
    int64_t prof_clock_refresh_ns;
    int64_t prof_clock_samples;
    int64_t clock_skew_ns;
} tern__config_t;

/* Name of a launcher for messages ("torchrun"). */
const char *tern__launcher_name(tern__launcher_t launcher);

/* Returns the value of variable name, or NULL if unset. */
typedef const char *(*tern__env_lookup_fn)(const char *name, void *arg);

/*
 * Fill cfg with every variable's default, then parse each one set in the
 * environment. On a bad value returns TERN_ERR_CONFIG with a detail naming the
 * variable, the value and what was expected; cfg is then unspecified.
 */
tern_status_t tern__config_load(tern__config_t *cfg);
tern_status_t tern__config_load_from(tern__config_t *cfg, tern__env_lookup_fn lookup, void *arg);

/*
 * The text of value idx of an enumerated variable, as its table row spells it
 * ("tcp" for TERN_TRANSPORT's 3); "?" for an unknown variable or index.
 * The returned string is not NUL-terminated at the value's end: *len says how
 * long it is.
 */
const char *tern__config_enum_value(const char *name, int64_t idx, size_t *len);

/* Typed parsers (exposed for tests). Each rejects empty input and trailing junk. */
tern_status_t tern__parse_int(const char *s, int64_t min, int64_t max, int64_t *out);
tern_status_t tern__parse_bool(const char *s, bool *out);
/* "250ms", "30s", "5m", "1h", "100us", "10ns"; a bare number is seconds. */
tern_status_t tern__parse_duration(const char *s, int64_t *ns);
/* "4096", "8k", "8KiB", "16M", "1g" (powers of 1024). */
tern_status_t tern__parse_size(const char *s, uint64_t *out);

#endif
