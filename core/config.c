/* The table of environment variables and their parsers. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config.h"
#include "core/error.h"

typedef enum field_type {
    FIELD_INT,      /* int64_t within [min, max]; "" default means unset (-1) */
    FIELD_BOOL,     /* bool */
    FIELD_ENUM,     /* int64_t index into values "a|b|c" */
    FIELD_STRING,   /* char[size] */
    FIELD_DURATION, /* int64_t nanoseconds */
    FIELD_SIZE,     /* uint64_t bytes; with values "auto", also "auto" (TERN__SIZE_AUTO) */
} field_type_t;

typedef struct field {
    const char *name;
    const char *group; /* who sets it: tern, or the launcher it comes from */
    field_type_t type;
    const char *dflt;  /* as the user would write it; "" = unset */
    const char *doc;
    size_t offset;
    size_t size;       /* FIELD_STRING: buffer size */
    int64_t min, max;  /* FIELD_INT */
    const char *values; /* FIELD_ENUM; FIELD_SIZE: "auto" if that is accepted */
} field_t;

#define OFF(member) offsetof(tern__config_t, member)
#define LAUNCH(l, member) (OFF(launch) + (l) * sizeof(tern__launch_ids_t) + offsetof(tern__launch_ids_t, member))
#define RANK_MAX ((int64_t)INT32_MAX - 1)
#define INT_FIELD(n, g, l, member, lo, d)                                                 \
    {.name = n, .group = g, .type = FIELD_INT, .dflt = "", .doc = d,                      \
     .offset = LAUNCH(l, member), .min = lo, .max = RANK_MAX}

static const field_t fields[] = {
    {.name = "TERN_LOG", .group = "tern", .type = FIELD_ENUM, .dflt = "warn",
     .values = "error|warn|info|debug|trace", .offset = OFF(log_level),
     .doc = "log level; messages go to stderr prefixed with rank and level"},
    INT_FIELD("TERN_RANK", "tern", TERN__LAUNCHER_TERN, rank, 0,
              "rank of this process; overrides every launcher's variables"),
    INT_FIELD("TERN_WORLD_SIZE", "tern", TERN__LAUNCHER_TERN, world_size, 1,
              "number of ranks in the job"),
    INT_FIELD("TERN_LOCAL_RANK", "tern", TERN__LAUNCHER_TERN, local_rank, 0,
              "rank among the processes on this machine"),
    INT_FIELD("TERN_LOCAL_WORLD_SIZE", "tern", TERN__LAUNCHER_TERN, local_world_size, 1,
              "number of ranks on this machine"),
    {.name = "TERN_THREADS", .group = "tern", .type = FIELD_INT, .dflt = "0",
     .offset = OFF(threads), .min = 0, .max = 1024,
     .doc = "worker threads in the pool; 0 sizes it from the hwloc topology"},
    {.name = "TERN_AFFINITY_DEVICE", .group = "tern", .type = FIELD_STRING, .dflt = "",
     .offset = OFF(affinity_device), .size = sizeof(((tern__config_t *)0)->affinity_device),
     .doc = "PCI bus id (0000:3b:00.0), OS device name (mlx5_0, eth0) or cuda:N whose "
            "NUMA node the pool runs on; empty: all cores"},
    {.name = "TERN_BIND", .group = "tern", .type = FIELD_BOOL, .dflt = "yes", .offset = OFF(bind),
     .doc = "bind each pool thread to one core of its set"},
    {.name = "TERN_CONNECT_TIMEOUT", .group = "tern", .type = FIELD_DURATION, .dflt = "30s",
     .offset = OFF(connect_timeout_ns), .min = 1,
     .doc = "how long to keep trying to reach the store on MASTER_ADDR:MASTER_PORT"},
    {.name = "TERN_TIMEOUT", .group = "tern", .type = FIELD_DURATION, .dflt = "300s",
     .offset = OFF(timeout_ns), .min = 1,
     .doc = "default timeout of blocking store calls (get, wait, barrier), of finalize, and of a "
            "collective that makes no progress"},
    {.name = "TERN_TRANSPORT", .group = "tern", .type = FIELD_ENUM, .dflt = "auto",
     .values = "auto|verbs|ucx|tcp", .offset = OFF(transport),
     .doc = "transport provider; auto takes verbs, then ucx, then tcp, and logs why; a named "
            "one that cannot start is an error"},
    {.name = "TERN_POLL", .group = "tern", .type = FIELD_ENUM, .dflt = "blocking",
     .values = "blocking|busy", .offset = OFF(poll),
     .doc = "progress: sleep on the transport's fd, or spin for the lowest latency"},
    {.name = "TERN_POLL_SPIN", .group = "tern", .type = FIELD_DURATION, .dflt = "10ms",
     .offset = OFF(poll_spin_ns),
     .doc = "with TERN_POLL=blocking, how long a waiting call polls without progress before "
            "it sleeps on the transport's fd"},
    {.name = "TERN_PROGRESS_NAP", .group = "tern", .type = FIELD_DURATION, .dflt = "8ms",
     .offset = OFF(progress_nap_ns),
     .doc = "the longest nap of the progress thread while waiting calls drive progress (naps "
            "start at 1ms, or this if shorter, and double); shorter hands background work over "
            "sooner after a run of waits, longer disturbs ranks that fill the cores less"},
    {.name = "TERN_TCP_SOCKBUF", .group = "tern", .type = FIELD_SIZE, .dflt = "4M",
     .offset = OFF(tcp_sockbuf),
     .doc = "tcp provider: SO_SNDBUF/SO_RCVBUF of each connection; 0 leaves the kernel's "
            "autotuning"},
    {.name = "TERN_TCP_ZCOPY", .group = "tern", .type = FIELD_SIZE, .dflt = "64k",
     .offset = OFF(tcp_zcopy),
     .doc = "tcp provider: put payloads and get replies at least this large may go to the "
            "socket by vmsplice/splice, without a copy (TERN_TCP_ZCOPY_MODE says when); 0 "
            "copies them all"},
    {.name = "TERN_TCP_ZCOPY_MODE", .group = "tern", .type = FIELD_ENUM, .dflt = "auto",
     .values = "auto|always", .offset = OFF(tcp_zcopy_mode),
     .doc = "tcp provider, payloads of TERN_TCP_ZCOPY and up: auto splices or copies each, "
            "whichever the transport measured to cost less CPU per byte, trying the other "
            "now and then; always splices them all"},
    {.name = "TERN_TCP_WRITE_MAX", .group = "tern", .type = FIELD_SIZE, .dflt = "64k",
     .offset = OFF(tcp_write_max),
     .doc = "tcp provider: the most one write or splice hands a socket, rounded down to whole "
            "TCP segments (at least one; a frame's last write also takes a tail under 8 KiB): "
            "smaller writes stream, where a large one is pushed out in bursts; 0: no limit"},
    {.name = "TERN_UCX_CMA", .group = "tern", .type = FIELD_SIZE, .dflt = "256k",
     .offset = OFF(ucx_cma),
     .doc = "ucx provider: host-memory puts and gets at least this large to a peer process on "
            "this host (those with a notice channel: UCX_TLS=sm) copy once, by "
            "process_vm_readv/writev, as Open MPI's vader does, instead of twice through the "
            "shared-memory FIFO; smaller ones, and all with 0, are served by the target's tern "
            "through the FIFO (faster on some hosts: docs/transport-ucx.md)"},
    {.name = "TERN_EAGER_LIMIT", .group = "tern", .type = FIELD_SIZE, .dflt = "auto",
     .values = "auto", .offset = OFF(eager_limit),
     .doc = "p2p messages up to this size go eagerly (one copy at the receiver); larger ones "
            "by zero-copy rendezvous; auto: the transport's (tcp 48k, ucx 16k)"},
    {.name = "TERN_UNEXPECTED_MAX", .group = "tern", .type = FIELD_SIZE, .dflt = "64M",
     .offset = OFF(unexpected_max),
     .doc = "memory for eager messages that arrive before their receive (past it senders "
            "switch to rendezvous), and again for rendezvous headers (past it sends are "
            "refused)"},
    {.name = "TERN_COLL_ALGO_ALLREDUCE", .group = "tern", .type = FIELD_ENUM, .dflt = "auto",
     .values = "auto|ring|rd|rabenseifner", .offset = OFF(coll_algo_allreduce),
     .doc = "all_reduce algorithm: auto picks by size (docs/collectives.md); ring (reduce-scatter + "
            "all-gather, pipelined), rd (recursive doubling) or rabenseifner (recursive halving + "
            "doubling)"},
    {.name = "TERN_COLL_ALGO_BROADCAST", .group = "tern", .type = FIELD_ENUM, .dflt = "auto",
     .values = "auto|binomial|chain", .offset = OFF(coll_algo_broadcast),
     .doc = "broadcast algorithm: binomial tree or pipelined chain"},
    {.name = "TERN_COLL_ALGO_REDUCE", .group = "tern", .type = FIELD_ENUM, .dflt = "auto",
     .values = "auto|binomial|chain", .offset = OFF(coll_algo_reduce),
     .doc = "reduce algorithm: binomial tree or pipelined chain"},
    {.name = "TERN_COLL_ALGO_ALLGATHER", .group = "tern", .type = FIELD_ENUM, .dflt = "auto",
     .values = "auto|ring|bruck", .offset = OFF(coll_algo_allgather),
     .doc = "all_gather algorithm: ring or Bruck"},
    {.name = "TERN_COLL_ALGO_ALLTOALL", .group = "tern", .type = FIELD_ENUM, .dflt = "auto",
     .values = "auto|pairwise|linear", .offset = OFF(coll_algo_alltoall),
     .doc = "all_to_all algorithm: pairwise exchange (one peer per step) or linear (all at once)"},
    {.name = "TERN_COLL_SEGMENT", .group = "tern", .type = FIELD_SIZE, .dflt = "512k",
     .offset = OFF(coll_segment),
     .doc = "pipelined collectives (ring, chain) move data in segments of this many bytes"},
    {.name = "TERN_COLL_EAGER_LIMIT", .group = "tern", .type = FIELD_SIZE, .dflt = "64k",
     .offset = OFF(coll_eager_limit),
     .doc = "collectives' messages up to this size go eagerly (a copy at each end), as "
            "TERN_EAGER_LIMIT does for p2p: below it a rendezvous's round trips cost more "
            "than the copies"},
    {.name = "TERN_COLL_RTR", .group = "tern", .type = FIELD_BOOL, .dflt = "yes",
     .offset = OFF(coll_rtr),
     .doc = "a collective's receive above TERN_COLL_EAGER_LIMIT offers its buffer to the sender "
            "as it is posted, and the sender writes into it (where the transport refuses "
            "writes to revoked keys: tcp, verbs); no: the sender offers, the receiver reads. "
            "Set it alike on every rank"},
    {.name = "TERN_RPC_TIMEOUT", .group = "tern", .type = FIELD_DURATION, .dflt = "60s",
     .offset = OFF(rpc_timeout_ns),
     .doc = "an RPC's timeout when the call names none (tern_rpc_options_t overrides it); "
            "its future then fails with TERN_ERR_TIMEOUT"},
    {.name = "TERN_RPC_WINDOW", .group = "tern", .type = FIELD_INT, .dflt = "256",
     .offset = OFF(rpc_window), .min = 1, .max = 65536,
     .doc = "RPCs in flight from one worker to another; a call beyond it waits for one to "
            "finish"},
    {.name = "TERN_PROF_CLOCK_REFRESH", .group = "tern", .type = FIELD_DURATION, .dflt = "10s",
     .offset = OFF(prof_clock_refresh_ns),
     .doc = "while the profiler runs, re-estimate each peer's clock offset this often (0: only "
            "at first contact and at stop)"},
    {.name = "TERN_PROF_CLOCK_SAMPLES", .group = "tern", .type = FIELD_INT, .dflt = "100",
     .offset = OFF(prof_clock_samples), .min = 1, .max = 100000,
     .doc = "ping-pong round trips per clock offset estimate; the shortest one is kept"},
    {.name = "TERN_CLOCK_SKEW_NS", .group = "tern", .type = FIELD_INT, .dflt = "0",
     .offset = OFF(clock_skew_ns), .min = -1000000000000000LL, .max = 1000000000000000LL,
     .doc = "for tests: add this many nanoseconds to this process's profiler clock; the "
            "ping-pong estimate must find it"},
    {.name = "TERN_JOB_ID", .group = "tern", .type = FIELD_STRING, .dflt = "",
     .offset = OFF(job_id), .size = sizeof(((tern__config_t *)0)->job_id),
     .doc = "the job's token, the same on every rank (tern-run sets one per job; else "
            "TORCHELASTIC_RUN_ID, PMIX_NAMESPACE or SLURM_JOB_ID.SLURM_STEP_ID): the store "
            "refuses a rank of another job that reaches it on a shared port"},
    {.name = "TERN_MASTER_ADDR", .group = "tern", .type = FIELD_STRING, .dflt = "",
     .offset = OFF(tern_master_addr), .size = sizeof(((tern__config_t *)0)->tern_master_addr),
     .doc = "host of tern's store, when it must differ from MASTER_ADDR"},
    {.name = "TERN_MASTER_PORT", .group = "tern", .type = FIELD_INT, .dflt = "",
     .offset = OFF(tern_master_port), .min = 1, .max = 65535,
     .doc = "port of tern's store, when it must differ from MASTER_PORT"},
    {.name = "MASTER_ADDR", .group = "rendezvous", .type = FIELD_STRING, .dflt = "127.0.0.1",
     .offset = OFF(master_addr), .size = sizeof(((tern__config_t *)0)->master_addr),
     .doc = "host of rank 0, which serves the key-value store"},
    {.name = "MASTER_PORT", .group = "rendezvous", .type = FIELD_INT, .dflt = "29500",
     .offset = OFF(master_port), .min = 1, .max = 65535, .doc = "port of the key-value store"},
    INT_FIELD("RANK", "torchrun", TERN__LAUNCHER_TORCHRUN, rank, 0, "rank"),
    INT_FIELD("WORLD_SIZE", "torchrun", TERN__LAUNCHER_TORCHRUN, world_size, 1, "world size"),
    INT_FIELD("LOCAL_RANK", "torchrun", TERN__LAUNCHER_TORCHRUN, local_rank, 0, "local rank"),
    INT_FIELD("LOCAL_WORLD_SIZE", "torchrun", TERN__LAUNCHER_TORCHRUN, local_world_size, 1,
              "local world size"),
    {.name = "TORCHELASTIC_USE_AGENT_STORE", .group = "torchrun", .type = FIELD_BOOL,
     .dflt = "no", .offset = OFF(torch_agent_store),
     .doc = "torchrun's agent serves its own store on MASTER_PORT: tern's store then "
            "uses MASTER_PORT+1 unless TERN_MASTER_PORT is set"},
    INT_FIELD("OMPI_COMM_WORLD_RANK", "Open MPI", TERN__LAUNCHER_OMPI, rank, 0, "rank"),
    INT_FIELD("OMPI_COMM_WORLD_SIZE", "Open MPI", TERN__LAUNCHER_OMPI, world_size, 1, "world size"),
    INT_FIELD("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI", TERN__LAUNCHER_OMPI, local_rank, 0,
              "local rank"),
    INT_FIELD("OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI", TERN__LAUNCHER_OMPI, local_world_size, 1,
              "local world size"),
    INT_FIELD("PMI_RANK", "PMI (MPICH)", TERN__LAUNCHER_PMI, rank, 0, "rank"),
    INT_FIELD("PMI_SIZE", "PMI (MPICH)", TERN__LAUNCHER_PMI, world_size, 1, "world size"),
    INT_FIELD("MPI_LOCALRANKID", "PMI (MPICH)", TERN__LAUNCHER_PMI, local_rank, 0, "local rank"),
    INT_FIELD("MPI_LOCALNRANKS", "PMI (MPICH)", TERN__LAUNCHER_PMI, local_world_size, 1,
              "local world size"),
    INT_FIELD("SLURM_PROCID", "Slurm", TERN__LAUNCHER_SLURM, rank, 0, "rank"),
    INT_FIELD("SLURM_NTASKS", "Slurm", TERN__LAUNCHER_SLURM, world_size, 1, "world size"),
    INT_FIELD("SLURM_LOCALID", "Slurm", TERN__LAUNCHER_SLURM, local_rank, 0, "local rank"),
};

#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static const char *const launcher_names[TERN__LAUNCHER_COUNT] = {
    [TERN__LAUNCHER_TERN] = "TERN_*",
    [TERN__LAUNCHER_TORCHRUN] = "torchrun",
    [TERN__LAUNCHER_OMPI] = "Open MPI",
    [TERN__LAUNCHER_PMI] = "PMI",
    [TERN__LAUNCHER_SLURM] = "Slurm",
};

const char *tern__launcher_name(tern__launcher_t launcher)
{
    return (unsigned)launcher < TERN__LAUNCHER_COUNT ? launcher_names[launcher] : "?";
}

/* ---- typed parsers ---- */

static const char *skip_space(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return s;
}

tern_status_t tern__parse_int(const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    long long v;

    if (s == NULL || *skip_space(s) == '\0')
        return tern__error(TERN_ERR_CONFIG, "empty value, expected an integer");
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno == ERANGE || *skip_space(end) != '\0')
        return tern__error(TERN_ERR_CONFIG, "'%s' is not an integer", s);
    if (v < min || v > max)
        return tern__error(TERN_ERR_CONFIG, "%lld is out of range [%" PRId64 ", %" PRId64 "]", v,
                           min, max);
    *out = v;
    return TERN_OK;
}

tern_status_t tern__parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"1", "y", "yes", "true", "on"};
    static const char *const no[] = {"0", "n", "no", "false", "off"};

    for (size_t i = 0; s != NULL && i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return TERN_OK;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return TERN_OK;
        }
    }
    return tern__error(TERN_ERR_CONFIG, "'%s' is not a boolean (yes|no|1|0|true|false|on|off)",
                       s ? s : "");
}

/* A non-negative decimal number with an optional unit from units[]; the result
 * is number * unit factor, checked for overflow. */
typedef struct unit {
    const char *suffix;
    uint64_t factor;
} unit_t;

static tern_status_t parse_scaled(const char *s, const unit_t *units, size_t nunits,
                                  uint64_t dflt_factor, const char *what, uint64_t *out)
{
    char *end;
    unsigned long long v;
    const char *p;

    if (s == NULL || *skip_space(s) == '\0')
        return tern__error(TERN_ERR_CONFIG, "empty value, expected a %s", what);
    p = skip_space(s);
    if (!isdigit((unsigned char)*p))
        return tern__error(TERN_ERR_CONFIG, "'%s' is not a %s", s, what);
    errno = 0;
    v = strtoull(p, &end, 10);
    if (errno == ERANGE)
        return tern__error(TERN_ERR_CONFIG, "'%s' is too large", s);
    end = (char *)skip_space(end);
    uint64_t factor = dflt_factor;
    if (*end != '\0') {
        size_t len = strlen(end);
        while (len > 0 && isspace((unsigned char)end[len - 1]))
            len--;
        factor = 0;
        for (size_t i = 0; i < nunits; i++) {
            if (strlen(units[i].suffix) == len && strncasecmp(end, units[i].suffix, len) == 0) {
                factor = units[i].factor;
                break;
            }
        }
        if (factor == 0)
            return tern__error(TERN_ERR_CONFIG, "'%s': unknown unit '%.*s' for a %s", s, (int)len,
                               end, what);
    }
    if (v != 0 && factor > UINT64_MAX / v)
        return tern__error(TERN_ERR_CONFIG, "'%s' is too large", s);
    *out = v * factor;
    return TERN_OK;
}

tern_status_t tern__parse_duration(const char *s, int64_t *ns)
{
    static const unit_t units[] = {
        {"ns", 1},           {"us", 1000},         {"ms", 1000000},
        {"s", 1000000000ull}, {"m", 60000000000ull}, {"h", 3600000000000ull},
    };
    uint64_t v = 0; /* gcc -O3 cannot see that parse_scaled sets it whenever it returns TERN_OK */
    tern_status_t st = parse_scaled(s, units, sizeof(units) / sizeof(units[0]), 1000000000ull,
                                    "duration (e.g. 500ms, 30s, 5m)", &v);
    if (st != TERN_OK)
        return st;
    if (v > INT64_MAX)
        return tern__error(TERN_ERR_CONFIG, "'%s' is too long a duration", s);
    *ns = (int64_t)v;
    return TERN_OK;
}

tern_status_t tern__parse_size(const char *s, uint64_t *out)
{
    static const unit_t units[] = {
        {"b", 1},          {"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
        {"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20}, {"g", 1ull << 30},
        {"gb", 1ull << 30}, {"gib", 1ull << 30},
    };
    return parse_scaled(s, units, sizeof(units) / sizeof(units[0]), 1, "size (e.g. 8k, 16M)", out);
}

static tern_status_t parse_enum(const char *s, const char *values, int64_t *out)
{
    int64_t idx = 0;
    const char *p = values;

    while (*p != '\0') {
        size_t len = strcspn(p, "|");
        if (strlen(s) == len && strncasecmp(s, p, len) == 0) {
            *out = idx;
            return TERN_OK;
        }
        p += len;
        if (*p == '|')
            p++;
        idx++;
    }
    return tern__error(TERN_ERR_CONFIG, "'%s' is not one of %s", s, values);
}

/* ---- the table ---- */

static tern_status_t set_field(const field_t *f, const char *s, tern__config_t *cfg)
{
    char *base = (char *)cfg + f->offset;

    switch (f->type) {
    case FIELD_INT:
        if (*s == '\0') { /* an empty default means "not given" */
            *(int64_t *)base = TERN__UNSET;
            return TERN_OK;
        }
        return tern__parse_int(s, f->min, f->max, (int64_t *)base);
    case FIELD_BOOL:
        return tern__parse_bool(s, (bool *)base);
    case FIELD_ENUM:
        return parse_enum(s, f->values, (int64_t *)base);
    case FIELD_DURATION: {
        tern_status_t st = tern__parse_duration(s, (int64_t *)base);
        /* A timeout of 0 would end every call it bounds at once (tern_init
         * failed with "waiting for a reply timed out"). */
        if (st == TERN_OK && f->min > 0 && *(int64_t *)base < f->min)
            return tern__error(TERN_ERR_CONFIG, "must be above 0");
        return st;
    }
    case FIELD_SIZE:
        if (f->values != NULL && strcmp(s, f->values) == 0) {
            *(uint64_t *)base = TERN__SIZE_AUTO;
            return TERN_OK;
        }
        return tern__parse_size(s, (uint64_t *)base);
    case FIELD_STRING:
        if (strlen(s) >= f->size)
            return tern__error(TERN_ERR_CONFIG, "value is longer than %zu bytes", f->size - 1);
        memcpy(base, s, strlen(s) + 1);
        return TERN_OK;
    }
    return tern__error(TERN_ERR_INTERNAL, "bad field type");
}

tern_status_t tern__config_load_from(tern__config_t *cfg, tern__env_lookup_fn lookup, void *arg)
{
    memset(cfg, 0, sizeof(*cfg));
    /* Not every launcher has every variable (Slurm has no local size). */
    for (int l = 0; l < TERN__LAUNCHER_COUNT; l++)
        cfg->launch[l] = (tern__launch_ids_t){TERN__UNSET, TERN__UNSET, TERN__UNSET, TERN__UNSET};
    for (size_t i = 0; i < NFIELDS; i++) {
        const field_t *f = &fields[i];
        const char *v = lookup(f->name, arg);
        tern_status_t st;

        if (set_field(f, f->dflt, cfg) != TERN_OK)
            return tern__error(TERN_ERR_INTERNAL, "bad default '%s' for %s", f->dflt, f->name);
        /* An empty value counts as unset, as shells often export VAR= to clear. */
        if (v == NULL || *v == '\0')
            continue;
        st = set_field(f, v, cfg);
        if (st != TERN_OK) {
            /* Prefix the parser's detail with the variable's name. */
            char detail[TERN__ERROR_MAX];
            snprintf(detail, sizeof(detail), "%s", tern_last_error());
            return tern__error(st, "environment variable %s=%s: %s", f->name, v, detail);
        }
    }
    return TERN_OK;
}

static const char *lookup_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

tern_status_t tern__config_load(tern__config_t *cfg)
{
    return tern__config_load_from(cfg, lookup_getenv, NULL);
}

tern_status_t tern_env_check(void)
{
    tern__config_t cfg;
    return tern__config_load(&cfg);
}

const char *tern__config_enum_value(const char *name, int64_t idx, size_t *len)
{
    for (size_t i = 0; i < NFIELDS; i++) {
        const char *p = fields[i].values;
        if (fields[i].type != FIELD_ENUM || strcmp(fields[i].name, name) != 0)
            continue;
        for (int64_t k = 0; *p != '\0'; k++) {
            size_t n = strcspn(p, "|");
            if (k == idx) {
                *len = n;
                return p;
            }
            p += n + (p[n] == '|');
        }
    }
    *len = 1;
    return "?";
}

static const char *type_name(const field_t *f)
{
    switch (f->type) {
    case FIELD_INT:
        return "integer";
    case FIELD_BOOL:
        return "boolean";
    case FIELD_ENUM:
        return f->values;
    case FIELD_STRING:
        return "string";
    case FIELD_DURATION:
        return "duration";
    case FIELD_SIZE:
        return f->values != NULL ? "size/auto" : "size";
    }
    return "?";
}

tern_status_t tern_env_print(FILE *out, tern_env_format_t format)
{
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_env_print: out is NULL");
    if (format == TERN_ENV_FORMAT_MARKDOWN) {
        fprintf(out, "| variable | set by | type | default | description |\n");
        fprintf(out, "| --- | --- | --- | --- | --- |\n");
    }
    for (size_t i = 0; i < NFIELDS; i++) {
        const field_t *f = &fields[i];
        const char *dflt = *f->dflt ? f->dflt : "(unset)";

        if (format == TERN_ENV_FORMAT_MARKDOWN) {
            char type[64];
            /* '|' would split a markdown cell. */
            snprintf(type, sizeof(type), "%s", type_name(f));
            for (char *p = type; *p; p++)
                if (*p == '|')
                    *p = '/';
            fprintf(out, "| `%s` | %s | %s | `%s` | %s |\n", f->name, f->group, type, dflt, f->doc);
        } else {
            fprintf(out, "%-28s %-12s %-28s %-10s %s\n", f->name, f->group, type_name(f), dflt,
                    f->doc);
        }
    }
    if (fflush(out) != 0 || ferror(out))
        return tern__error_errno(TERN_ERR_IO, errno, "tern_env_print: write failed");
    return TERN_OK;
}
