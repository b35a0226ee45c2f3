/*
 * The bootstrap under tern_init() (which lives in p2p/runtime.c, above the
 * transport it opens): configuration, rank and world size (params, then each
 * launcher's variables), the store (rank 0 serves it), local rank discovery
 * and the worker pool; and the teardown under tern_finalize().
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tern/context.h>

#include "core/config.h"
#include "core/context.h"
#include "core/error.h"
#include "core/log.h"
#include "core/store.h"

struct tern_ctx {
    unsigned rank, world_size, local_rank, local_world_size;
    void *comm; /* the communication layer's state (p2p/runtime.c) */
    const char *launcher;
    tern__config_t cfg;
    int64_t timeout_ns;
    tern_pool_t *pool;
    tern_store_t *store;
    bool owns_store;
    bool joined; /* registered in a memory store */
    tern_store_server_t *server;
};

typedef struct ids {
    int64_t rank, world_size, local_rank, local_world_size;
} ids_t;

/* Variable names, per launcher, for error messages. */
static const char *const rank_var[TERN__LAUNCHER_COUNT] = {
    "TERN_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
static const char *const size_var[TERN__LAUNCHER_COUNT] = {
    "TERN_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};

/*
 * Rank and world size: from params when given, else from the first launcher that
 * set a rank. Local rank and size come from the same source, else TERN_LOCAL_*,
 * else stay unset for discovery through the store.
 */
static tern_status_t resolve_ids(const tern_init_params_t *p, const tern__config_t *cfg, ids_t *ids,
                                 const char **source)
{
    const uint64_t m = p ? p->field_mask : 0;
    ids->rank = ids->world_size = ids->local_rank = ids->local_world_size = TERN__UNSET;
    *source = "default";

    if ((m & TERN_INIT_PARAM_RANK) || (m & TERN_INIT_PARAM_WORLD_SIZE)) {
        if (!(m & TERN_INIT_PARAM_RANK) || !(m & TERN_INIT_PARAM_WORLD_SIZE))
            return tern__error(TERN_ERR_INVALID_PARAM,
                               "tern_init: params set one of rank and world_size without the other");
        ids->rank = p->rank;
        ids->world_size = p->world_size;
        *source = "params";
    } else {
        for (int l = 0; l < TERN__LAUNCHER_COUNT; l++) {
            const tern__launch_ids_t *li = &cfg->launch[l];
            if (li->rank == TERN__UNSET && li->world_size == TERN__UNSET)
                continue;
            if (li->rank == TERN__UNSET || li->world_size == TERN__UNSET)
                return tern__error(TERN_ERR_CONFIG, "%s is set but %s is not",
                                   li->rank == TERN__UNSET ? size_var[l] : rank_var[l],
                                   li->rank == TERN__UNSET ? rank_var[l] : size_var[l]);
            ids->rank = li->rank;
            ids->world_size = li->world_size;
            ids->local_rank = li->local_rank;
            ids->local_world_size = li->local_world_size;
            *source = tern__launcher_name((tern__launcher_t)l);
            if (ids->rank >= ids->world_size)
                return tern__error(TERN_ERR_CONFIG, "%s=%" PRId64 " is not below %s=%" PRId64,
                                   rank_var[l], ids->rank, size_var[l], ids->world_size);
            /* Another launcher's variables that disagree (left over from an
             * outer job, say) are not silently passed over. */
            for (int o = l + 1; o < TERN__LAUNCHER_COUNT; o++) {
                const tern__launch_ids_t *lo = &cfg->launch[o];
                if (lo->rank != TERN__UNSET && lo->world_size != TERN__UNSET &&
                    (lo->rank != ids->rank || lo->world_size != ids->world_size))
                    tern_warn("rank %" PRId64 " of %" PRId64
                              " from %s (%s, %s); %s says rank %" PRId64 " of %" PRId64
                              " (%s, %s), ignored",
                              ids->rank, ids->world_size, *source, rank_var[l], size_var[l],
                              tern__launcher_name((tern__launcher_t)o), lo->rank, lo->world_size,
                              rank_var[o], size_var[o]);
            }
            break;
        }
        if (ids->rank == TERN__UNSET) {
            ids->rank = 0;
            ids->world_size = 1;
        }
    }
    if (ids->world_size == 0 || ids->rank >= ids->world_size)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_init: rank %" PRId64 " of world size %" PRId64,
                           ids->rank, ids->world_size);

    const tern__launch_ids_t *t = &cfg->launch[TERN__LAUNCHER_TERN];
    if (ids->local_rank == TERN__UNSET)
        ids->local_rank = t->local_rank;
    if (ids->local_world_size == TERN__UNSET)
        ids->local_world_size = t->local_world_size;
    if (m & TERN_INIT_PARAM_LOCAL_RANK)
        ids->local_rank = p->local_rank;
    if (m & TERN_INIT_PARAM_LOCAL_WORLD_SIZE)
        ids->local_world_size = p->local_world_size;
    if (ids->world_size == 1) {
        ids->local_rank = 0;
        ids->local_world_size = 1;
    }
    if (ids->local_rank != TERN__UNSET && ids->local_world_size != TERN__UNSET &&
        ids->local_rank >= ids->local_world_size)
        return tern__error(TERN_ERR_CONFIG, "local rank %" PRId64 " is not below local world size %" PRId64,
                           ids->local_rank, ids->local_world_size);
    return TERN_OK;
}

/* Rank 0: serve the store on MASTER_ADDR when that is an address of this host,
 * else on every interface (MASTER_ADDR may name a NAT or a load-balanced name). */
static tern_status_t serve_store(tern_ctx_t *ctx, const char *addr, unsigned port)
{
    tern_status_t st = tern_store_server_start(addr, port, ctx->world_size, &ctx->server);
    if (st == TERN_ERR_ADDR_IN_USE || st == TERN_OK)
        return st;
    tern_info("store: cannot listen on %s (%s); listening on every interface", addr,
              tern_last_error());
    return tern_store_server_start(NULL, port, ctx->world_size, &ctx->server);
}

/* The host name, read at the first call of an init (host[0] == '\0'): both
 * counts below key on it, and must key on the same one. */
#define HOST_MAX 256

static tern_status_t host_name(char *host)
{
    if (host[0] != '\0')
        return TERN_OK;
    if (gethostname(host, HOST_MAX) != 0) {
        host[0] = '\0';
        return tern__error_errno(TERN_ERR_IO, errno, "gethostname");
    }
    host[HOST_MAX - 1] = '\0';
    return TERN_OK;
}

/*
 * Fill in local rank and local world size where no launcher gave them: ranks
 * count themselves per host name in the store.
 */
static tern_status_t discover_local(tern_ctx_t *ctx, ids_t *ids, char *host)
{
    char key[HOST_MAX + 32];
    int64_t n;
    tern_status_t st;

    if (ids->local_rank != TERN__UNSET && ids->local_world_size != TERN__UNSET)
        return TERN_OK;
    if ((st = host_name(host)) != TERN_OK)
        return st;
    snprintf(key, sizeof(key), "tern/local/%s", host);
    if ((st = tern_store_add(ctx->store, key, 1, &n)) != TERN_OK)
        return st;
    if (ids->local_rank == TERN__UNSET)
        ids->local_rank = n - 1; /* arrival order: unique, not rank order */
    if ((st = tern_store_barrier(ctx->store, "tern/local", ctx->world_size, ctx->timeout_ns)) !=
        TERN_OK)
        return st;
    if ((st = tern_store_add(ctx->store, key, 0, &n)) != TERN_OK)
        return st;
    if (ids->local_world_size == TERN__UNSET)
        ids->local_world_size = n;
    return TERN_OK;
}

/* A digest of this thread's CPU affinity (FNV-1a over the mask), or false
 * when it cannot be read. Processes of one host read masks of one size, since
 * the loop's sizes depend only on the kernel's CPU count. */
static bool affinity_digest(uint64_t *digest)
{
    for (size_t ncpu = 1024; ncpu <= (1u << 20); ncpu *= 2) {
        cpu_set_t *set = CPU_ALLOC(ncpu);
        size_t size = CPU_ALLOC_SIZE(ncpu);
        uint64_t h = 1469598103934665603ull;
        int err;

        if (set == NULL)
            return false;
        if (sched_getaffinity(0, size, set) == 0) {
            for (size_t i = 0; i < size; i++)
                h = (h ^ ((const unsigned char *)set)[i]) * 1099511628211ull;
            CPU_FREE(set);
            *digest = h;
            return true;
        }
        err = errno;
        CPU_FREE(set);
        if (err != EINVAL) /* EINVAL: the kernel has more CPUs than the mask holds */
            return false;
    }
    return false;
}

/*
 * How many ranks on this host run on exactly this process's cores, and which
 * of them this one is, for the pool (see tern__placement_init: ranks bound to
 * one socket would each bind a full pool to the same cores). Counted per host
 * and affinity in the store, then read after a barrier of the whole world:
 * every rank takes part, so none waits on a count another rank skipped.
 * Ranks that all share one set keep their local rank as their index, as
 * before anything was counted; a smaller group numbers itself by arrival.
 * *size 0: unknown (the affinity could not be read).
 */
static tern_status_t count_sharers(tern_ctx_t *ctx, char *host, unsigned *index, unsigned *size)
{
    char key[HOST_MAX + 48];
    uint64_t digest = 0;
    bool known = affinity_digest(&digest);
    int64_t n, total;
    tern_status_t st;

    *index = *size = 0;
    if (ctx->world_size == 1)
        return TERN_OK;
    if ((st = host_name(host)) != TERN_OK)
        return st;
    if (known)
        snprintf(key, sizeof(key), "tern/affinity/%s/%016" PRIx64, host, digest);
    else
        snprintf(key, sizeof(key), "tern/affinity/%s/unknown", host);
    if ((st = tern_store_add(ctx->store, key, 1, &n)) != TERN_OK)
        return st;
    if ((st = tern_store_barrier(ctx->store, "tern/affinity", ctx->world_size, ctx->timeout_ns)) !=
        TERN_OK)
        return st;
    if ((st = tern_store_add(ctx->store, key, 0, &total)) != TERN_OK)
        return st;
    if (!known || n < 1 || n > total)
        return TERN_OK;
    *size = (unsigned)total;
    *index = total == ctx->local_world_size && ctx->local_rank < total ? ctx->local_rank
                                                                      : (unsigned)(n - 1);
    return TERN_OK;
}

static tern_status_t setup_store(tern_ctx_t *ctx, const tern_init_params_t *p)
{
    const uint64_t m = p ? p->field_mask : 0;
    const char *addr = ctx->cfg.tern_master_addr[0] ? ctx->cfg.tern_master_addr
                                                    : ctx->cfg.master_addr;
    unsigned port = (unsigned)ctx->cfg.master_port;
    if (ctx->cfg.tern_master_port != TERN__UNSET) {
        port = (unsigned)ctx->cfg.tern_master_port;
    } else if (ctx->cfg.torch_agent_store) {
        /* torchrun's agent already serves PyTorch's TCPStore on MASTER_PORT.
         * Every rank sees the same MASTER_PORT, so the next port is agreed on
         * without any more configuration. */
        port = (unsigned)ctx->cfg.master_port + 1;
        tern_info("torchrun's agent serves MASTER_PORT %u; tern's store uses %u "
                  "(set TERN_MASTER_PORT to choose)", port - 1, port);
    }
    if ((m & TERN_INIT_PARAM_MASTER_ADDR) && p->master_addr != NULL)
        addr = p->master_addr;
    if (m & TERN_INIT_PARAM_MASTER_PORT)
        port = p->master_port;
    int64_t connect_timeout = (m & TERN_INIT_PARAM_CONNECT_TIMEOUT) ? p->connect_timeout_ns
                                                                     : ctx->cfg.connect_timeout_ns;
    tern_status_t st;

    if ((m & TERN_INIT_PARAM_STORE) && p->store != NULL) {
        ctx->store = p->store;
        st = tern__store_join(ctx->store, ctx->rank, ctx->world_size);
        ctx->joined = st == TERN_OK;
        return st;
    }
    ctx->owns_store = true;
    if (ctx->world_size == 1) /* nobody to meet: no socket, no port to collide on */
        return tern_store_memory_create(1, ctx->timeout_ns, &ctx->store);
    if (port == 0 || port > 65535)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_init: master port %u is out of range", port);
    if (ctx->rank == 0 && (st = serve_store(ctx, addr, port)) != TERN_OK)
        return st;
    st = tern_store_connect(addr, port, ctx->rank, ctx->world_size, connect_timeout,
                            ctx->timeout_ns, &ctx->store);
    if (st == TERN_ERR_UNREACHABLE)
        tern_error("cannot reach the store of rank 0: %s (check MASTER_ADDR/MASTER_PORT, and that "
                   "rank 0 is running; TERN_CONNECT_TIMEOUT extends the wait)",
                   tern_last_error());
    return st;
}

static tern_status_t start_pool(tern_ctx_t *ctx, const tern_init_params_t *p, char *host)
{
    const uint64_t m = p ? p->field_mask : 0;
    unsigned share_rank, share_size;
    tern_status_t st = count_sharers(ctx, host, &share_rank, &share_size);
    if (st != TERN_OK)
        return st;
    tern_pool_params_t pp = {
        .field_mask = TERN_POOL_PARAM_THREADS | TERN_POOL_PARAM_BIND | TERN_POOL_PARAM_LOCAL |
                      TERN_POOL_PARAM_LOG_RANK | TERN_POOL_PARAM_DEVICE,
        .threads = (m & TERN_INIT_PARAM_THREADS) ? p->threads : (unsigned)ctx->cfg.threads,
        .device = (m & TERN_INIT_PARAM_DEVICE) ? p->device
                  : ctx->cfg.affinity_device[0] ? ctx->cfg.affinity_device
                                                : NULL,
        .bind = ctx->cfg.bind,
        .local_rank = ctx->local_rank,
        .local_world_size = ctx->local_world_size,
        .log_rank = (int)ctx->rank,
        .share_rank = share_rank,
        .share_size = share_size,
    };
    if (share_size > 0)
        pp.field_mask |= TERN_POOL_PARAM_SHARE;
    return tern_pool_create(&pp, &ctx->pool); /* which logs where it went */
}

tern_status_t tern__ctx_teardown(tern_ctx_t *ctx, bool collective)
{
    tern_status_t st = TERN_OK, st2;

    if (ctx == NULL)
        return TERN_OK;
    st2 = tern_pool_destroy(ctx->pool);
    if (st == TERN_OK)
        st = st2;
    if (ctx->joined)
        tern__store_leave(ctx->store, ctx->rank);
    if (ctx->owns_store)
        tern_store_close(ctx->store);
    /* Rank 0 keeps serving until every other rank has disconnected, so none of
     * them loses the store in the middle of its own finalize. */
    st2 = tern_store_server_stop(ctx->server, collective ? ctx->timeout_ns : 0);
    if (st == TERN_OK && collective)
        st = st2;
    free(ctx);
    return st;
}

tern_status_t tern__ctx_bootstrap(const tern_init_params_t *params, tern_ctx_t **ctx_out)
{
    tern_ctx_t *ctx;
    ids_t ids;
    char host[HOST_MAX] = "";
    tern_status_t st;
    char detail[TERN__ERROR_MAX];

    if (ctx_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tern_init: ctx_out is NULL");
    *ctx_out = NULL;
    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "tern_init: no memory");
    if ((st = tern__config_load(&ctx->cfg)) != TERN_OK)
        goto fail;
    tern_log_set_level((tern_log_level_t)ctx->cfg.log_level);
    ctx->timeout_ns = (params && (params->field_mask & TERN_INIT_PARAM_TIMEOUT))
                          ? params->timeout_ns
                          : ctx->cfg.timeout_ns;
    if (ctx->timeout_ns < 0) {
        st = tern__error(TERN_ERR_INVALID_PARAM, "tern_init: negative timeout");
        goto fail;
    }
    if ((st = resolve_ids(params, &ctx->cfg, &ids, &ctx->launcher)) != TERN_OK)
        goto fail;
    ctx->rank = (unsigned)ids.rank;
    ctx->world_size = (unsigned)ids.world_size;
    tern__log_set_rank((int)ctx->rank);
    tern_info("rank %u of %u (from %s)", ctx->rank, ctx->world_size, ctx->launcher);

    if ((st = setup_store(ctx, params)) != TERN_OK)
        goto fail;
    if ((st = discover_local(ctx, &ids, host)) != TERN_OK)
        goto fail;
    ctx->local_rank = (unsigned)ids.local_rank;
    ctx->local_world_size = (unsigned)ids.local_world_size;
    if ((st = start_pool(ctx, params, host)) != TERN_OK)
        goto fail;
    *ctx_out = ctx;
    return TERN_OK;
fail:
    /* Teardown may record errors of its own; keep the one that made init fail. */
    snprintf(detail, sizeof(detail), "%s", tern_last_error());
    tern__ctx_teardown(ctx, false);
    tern__error(st, "%s", detail);
    return st;
}

const tern__config_t *tern__ctx_config(const tern_ctx_t *ctx)
{
    return &ctx->cfg;
}

void tern_ctx_set_timeout(tern_ctx_t *ctx, int64_t timeout_ns)
{
    if (ctx != NULL && timeout_ns >= 0)
        ctx->timeout_ns = timeout_ns;
}

int64_t tern__ctx_timeout(const tern_ctx_t *ctx)
{
    return ctx->timeout_ns;
}

void tern__ctx_set_comm(tern_ctx_t *ctx, void *comm)
{
    ctx->comm = comm;
}

void *tern__ctx_comm(const tern_ctx_t *ctx)
{
    return ctx->comm;
}

unsigned tern_ctx_rank(const tern_ctx_t *ctx)
{
    return ctx->rank;
}

unsigned tern_ctx_world_size(const tern_ctx_t *ctx)
{
    return ctx->world_size;
}

unsigned tern_ctx_local_rank(const tern_ctx_t *ctx)
{
    return ctx->local_rank;
}

unsigned tern_ctx_local_world_size(const tern_ctx_t *ctx)
{
    return ctx->local_world_size;
}

const char *tern_ctx_launcher(const tern_ctx_t *ctx)
{
    return ctx->launcher;
}

tern_pool_t *tern_ctx_pool(tern_ctx_t *ctx)
{
    return ctx->pool;
}

tern_store_server_t *tern__ctx_take_store_server(tern_ctx_t *ctx, int *fd_out)
{
    if (ctx->server == NULL || tern__store_server_adopt(ctx->server, fd_out) != TERN_OK)
        return NULL;
    tern__store_assist(ctx->store, ctx->server);
    return ctx->server;
}

tern_store_t *tern_ctx_store(tern_ctx_t *ctx)
{
    return ctx->store;
}
