/* tern_init / tern_finalize: ranks as threads, bootstrap from the environment,
 * and the failures init must report. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include <tern/tern.h>

#include "test_util.h"

#define WORLD 4
#define SEC (1000 * NS_PER_MS)

typedef struct rank_arg {
    unsigned rank;
    tern_store_t *store; /* NULL: TCP on port */
    unsigned port; /* 0 with store NULL: the port comes from the environment */
    unsigned local_rank, local_world;
    int ok;
    char why[256];
} rank_arg_t;

static void *rank_main(void *arg)
{
    rank_arg_t *a = arg;
    tern_ctx_t *ctx = NULL;
    tern_init_params_t p = {
        .field_mask = TERN_INIT_PARAM_RANK | TERN_INIT_PARAM_WORLD_SIZE | TERN_INIT_PARAM_THREADS |
                      TERN_INIT_PARAM_TIMEOUT,
        .rank = a->rank,
        .world_size = WORLD,
        .threads = 1,
        .timeout_ns = 30 * SEC,
    };
    if (a->store != NULL) {
        p.field_mask |= TERN_INIT_PARAM_STORE;
        p.store = a->store;
    } else {
        p.field_mask |= TERN_INIT_PARAM_MASTER_ADDR | TERN_INIT_PARAM_CONNECT_TIMEOUT;
        p.master_addr = "127.0.0.1";
        p.connect_timeout_ns = 10 * SEC;
        if (a->port != 0) {
            p.field_mask |= TERN_INIT_PARAM_MASTER_PORT;
            p.master_port = a->port;
        }
    }
    if (tern_init(&p, &ctx) != TERN_OK) {
        snprintf(a->why, sizeof(a->why), "init: %s", tern_last_error());
        return NULL;
    }
    a->local_rank = tern_ctx_local_rank(ctx);
    a->local_world = tern_ctx_local_world_size(ctx);
    if (tern_ctx_rank(ctx) != a->rank || tern_ctx_world_size(ctx) != WORLD ||
        strcmp(tern_ctx_launcher(ctx), "params") != 0 || tern_ctx_pool(ctx) == NULL ||
        tern_pool_size(tern_ctx_pool(ctx)) != 1 || tern_ctx_store(ctx) == NULL) {
        snprintf(a->why, sizeof(a->why), "context reports the wrong identity");
        tern_finalize(ctx);
        return NULL;
    }
    /* The context's store is usable for the job's own exchange. */
    char key[32];
    snprintf(key, sizeof(key), "hello/%u", a->rank);
    if (tern_store_set(tern_ctx_store(ctx), key, "x", 1) != TERN_OK ||
        tern_store_barrier(tern_ctx_store(ctx), "test", WORLD, 10 * SEC) != TERN_OK) {
        snprintf(a->why, sizeof(a->why), "store: %s", tern_last_error());
        tern_finalize(ctx);
        return NULL;
    }
    if (tern_finalize(ctx) != TERN_OK) {
        snprintf(a->why, sizeof(a->why), "finalize: %s", tern_last_error());
        return NULL;
    }
    a->ok = 1;
    return NULL;
}

static void run_world(tern_store_t *store, unsigned port)
{
    pthread_t t[WORLD];
    rank_arg_t args[WORLD];
    unsigned seen = 0;
    for (unsigned r = 0; r < WORLD; r++) {
        args[r] = (rank_arg_t){.rank = r, .store = store, .port = port};
        assert_int_equal(pthread_create(&t[r], NULL, rank_main, &args[r]), 0);
    }
    for (unsigned r = 0; r < WORLD; r++) {
        pthread_join(t[r], NULL);
        if (!args[r].ok)
            fail_msg("rank %u: %s", r, args[r].why);
        /* All on one host: discovery finds 4 local ranks, each numbered once. */
        assert_int_equal(args[r].local_world, WORLD);
        assert_true(args[r].local_rank < WORLD);
        seen |= 1u << args[r].local_rank;
    }
    assert_int_equal(seen, (1u << WORLD) - 1);
}

static void test_threads_memory_store(void **state)
{
    tern_store_t *store;
    (void)state;
    assert_int_equal(tern_store_memory_create(WORLD, 30 * SEC, &store), TERN_OK);
    run_world(store, 0);
    tern_store_close(store);
}

static void test_threads_tcp_store(void **state)
{
    (void)state;
    run_world(NULL, test_free_port());
}

/* ---- bootstrap from the environment (world of 1, so no peers needed) ---- */

static const char *const launcher_vars[] = {"TERN_RANK",
                                            "TERN_WORLD_SIZE",
                                            "TERN_LOCAL_RANK",
                                            "TERN_LOCAL_WORLD_SIZE",
                                            "RANK",
                                            "WORLD_SIZE",
                                            "LOCAL_RANK",
                                            "LOCAL_WORLD_SIZE",
                                            "OMPI_COMM_WORLD_RANK",
                                            "OMPI_COMM_WORLD_SIZE",
                                            "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "OMPI_COMM_WORLD_LOCAL_SIZE",
                                            "PMI_RANK",
                                            "PMI_SIZE",
                                            "MPI_LOCALRANKID",
                                            "MPI_LOCALNRANKS",
                                            "SLURM_PROCID",
                                            "SLURM_NTASKS",
                                            "SLURM_LOCALID",
                                            "TERN_LOG",
                                            "MASTER_PORT",
                                            "TERN_MASTER_PORT",
                                            "TORCHELASTIC_USE_AGENT_STORE",
                                            "TERN_PROGRESS_NAP",
                                            "TERN_TIMEOUT",
                                            "TERN_CONNECT_TIMEOUT",
                                            NULL};

static int clear_env(void **state)
{
    (void)state;
    for (int i = 0; launcher_vars[i]; i++)
        unsetenv(launcher_vars[i]);
    return 0;
}

/* Init a world of one from the environment set as pairs; return the launcher. */
static void expect_launcher(const char *want, ...)
{
    va_list ap;
    const char *k;
    tern_ctx_t *ctx = NULL;
    tern_init_params_t p = {.field_mask = TERN_INIT_PARAM_THREADS, .threads = 1};

    clear_env(NULL);
    va_start(ap, want);
    while ((k = va_arg(ap, const char *)) != NULL)
        setenv(k, va_arg(ap, const char *), 1);
    va_end(ap);
    if (tern_init(&p, &ctx) != TERN_OK)
        fail_msg("init for %s: %s", want, tern_last_error());
    assert_string_equal(tern_ctx_launcher(ctx), want);
    assert_int_equal(tern_ctx_rank(ctx), 0);
    assert_int_equal(tern_ctx_world_size(ctx), 1);
    assert_int_equal(tern_finalize(ctx), TERN_OK);
}

static void test_launcher_order(void **state)
{
    (void)state;
    expect_launcher("default", NULL);
    expect_launcher("torchrun", "RANK", "0", "WORLD_SIZE", "1", "LOCAL_RANK", "0", NULL);
    expect_launcher("Open MPI", "OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "1",
                    "SLURM_PROCID", "3", "SLURM_NTASKS", "4", NULL);
    expect_launcher("PMI", "PMI_RANK", "0", "PMI_SIZE", "1", "SLURM_PROCID", "3", "SLURM_NTASKS",
                    "4", NULL);
    expect_launcher("Slurm", "SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_LOCALID", "0", NULL);
    expect_launcher("TERN_*", "TERN_RANK", "0", "TERN_WORLD_SIZE", "1", "RANK", "5", "WORLD_SIZE",
                    "8", NULL);
}

/* Warnings logged during a test (tern_log_set_sink). */
static char warned[2048];

static void keep_warnings(tern_log_level_t level, int rank, const char *msg, void *arg)
{
    (void)rank, (void)arg;
    if (level == TERN_LOG_WARN && strlen(warned) + strlen(msg) + 2 < sizeof(warned)) {
        strcat(warned, msg);
        strcat(warned, "\n");
    }
}

/* A launcher's variables that disagree with the one taken are named in a
 * warning, not passed over in silence; ones that agree say nothing. */
static void test_launcher_conflict(void **state)
{
    (void)state;
    warned[0] = '\0';
    tern_log_set_sink(keep_warnings, NULL);
    expect_launcher("torchrun", "RANK", "0", "WORLD_SIZE", "1", "OMPI_COMM_WORLD_RANK", "1",
                    "OMPI_COMM_WORLD_SIZE", "2", NULL);
    tern_log_set_sink(NULL, NULL);
    if (strstr(warned, "rank 0 of 1 from torchrun") == NULL ||
        strstr(warned, "Open MPI says rank 1 of 2") == NULL)
        fail_msg("no warning of the conflict: '%s'", warned);
    warned[0] = '\0';
    tern_log_set_sink(keep_warnings, NULL);
    expect_launcher("torchrun", "RANK", "0", "WORLD_SIZE", "1", "SLURM_PROCID", "0", "SLURM_NTASKS",
                    "1", NULL);
    tern_log_set_sink(NULL, NULL);
    if (strstr(warned, "ignored") != NULL)
        fail_msg("a warning where the launchers agree: '%s'", warned);
}

static void expect_init_error(tern_status_t want, const char *needle)
{
    tern_ctx_t *ctx = NULL;
    tern_init_params_t p = {.field_mask = TERN_INIT_PARAM_THREADS, .threads = 1};
    assert_int_equal(tern_init(&p, &ctx), want);
    assert_null(ctx);
    if (strstr(tern_last_error(), needle) == NULL)
        fail_msg("detail '%s' lacks '%s'", tern_last_error(), needle);
}

static void test_bad_environment(void **state)
{
    (void)state;
    clear_env(NULL);
    setenv("TERN_RANK", "3", 1);
    setenv("TERN_WORLD_SIZE", "2", 1);
    expect_init_error(TERN_ERR_CONFIG, "TERN_RANK=3");
    clear_env(NULL);
    setenv("SLURM_PROCID", "0", 1);
    expect_init_error(TERN_ERR_CONFIG, "SLURM_NTASKS");
    clear_env(NULL);
    setenv("TERN_LOG", "loud", 1);
    expect_init_error(TERN_ERR_CONFIG, "TERN_LOG");
    clear_env(NULL);
    setenv("MASTER_PORT", "http", 1);
    expect_init_error(TERN_ERR_CONFIG, "MASTER_PORT");
    clear_env(NULL);
    setenv("TERN_PROGRESS_NAP", "0", 1);
    expect_init_error(TERN_ERR_CONFIG, "TERN_PROGRESS_NAP must be above 0");
    clear_env(NULL);
    /* A timeout of 0 ended every store call at once ("waiting for a reply
     * timed out" from tern_init): refused, naming it. */
    setenv("TERN_TIMEOUT", "0", 1);
    expect_init_error(TERN_ERR_CONFIG, "TERN_TIMEOUT=0: must be above 0");
    clear_env(NULL);
    setenv("TERN_CONNECT_TIMEOUT", "0ms", 1);
    expect_init_error(TERN_ERR_CONFIG, "TERN_CONNECT_TIMEOUT=0ms: must be above 0");
    clear_env(NULL);
}

static void test_unreachable_master(void **state)
{
    tern_ctx_t *ctx = NULL;
    tern_init_params_t p = {
        .field_mask = TERN_INIT_PARAM_RANK | TERN_INIT_PARAM_WORLD_SIZE |
                      TERN_INIT_PARAM_MASTER_PORT | TERN_INIT_PARAM_CONNECT_TIMEOUT,
        .rank = 1, .world_size = 2, .master_port = test_free_port(),
        .connect_timeout_ns = 300 * NS_PER_MS,
    };
    (void)state;
    uint64_t t0 = tern_clock_ns();
    assert_int_equal(tern_init(&p, &ctx), TERN_ERR_UNREACHABLE);
    assert_true(tern_clock_ns() - t0 < 5 * SEC);
    assert_null(ctx);
    assert_non_null(strstr(tern_last_error(), "unreachable"));
}

static void test_master_port_in_use(void **state)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    tern_ctx_t *ctx = NULL;
    (void)state;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    tern_init_params_t p = {
        .field_mask = TERN_INIT_PARAM_RANK | TERN_INIT_PARAM_WORLD_SIZE |
                      TERN_INIT_PARAM_MASTER_ADDR | TERN_INIT_PARAM_MASTER_PORT,
        .rank = 0, .world_size = 2, .master_addr = "127.0.0.1",
        .master_port = ntohs(a.sin_port),
    };
    assert_int_equal(tern_init(&p, &ctx), TERN_ERR_ADDR_IN_USE);
    assert_null(ctx);
    assert_non_null(strstr(tern_last_error(), "in use"));
    close(fd);
}

/* A rank that never reaches finalize makes the others' finalize time out, and
 * they are freed all the same. */
typedef struct fin_arg {
    tern_store_t *store;
    unsigned rank;
    tern_ctx_t *ctx;
    tern_status_t init_st;
} fin_arg_t;

static void *fin_init(void *arg)
{
    fin_arg_t *f = arg;
    tern_init_params_t p = {
        .field_mask = TERN_INIT_PARAM_RANK | TERN_INIT_PARAM_WORLD_SIZE | TERN_INIT_PARAM_STORE |
                      TERN_INIT_PARAM_THREADS | TERN_INIT_PARAM_TIMEOUT,
        .rank = f->rank, .world_size = 2, .store = f->store, .threads = 1,
        .timeout_ns = 30 * SEC, /* init may be slow on a loaded machine */
    };
    f->init_st = tern_init(&p, &f->ctx);
    if (f->init_st == TERN_OK)
        tern_ctx_set_timeout(f->ctx, 300 * NS_PER_MS); /* finalize is what times out */
    return NULL;
}

static void test_finalize_timeout(void **state)
{
    tern_store_t *store;
    fin_arg_t f[2];
    pthread_t t[2];
    (void)state;
    assert_int_equal(tern_store_memory_create(2, 10 * SEC, &store), TERN_OK);
    for (unsigned r = 0; r < 2; r++) {
        f[r] = (fin_arg_t){.store = store, .rank = r};
        assert_int_equal(pthread_create(&t[r], NULL, fin_init, &f[r]), 0);
    }
    for (unsigned r = 0; r < 2; r++) {
        pthread_join(t[r], NULL);
        assert_int_equal(f[r].init_st, TERN_OK);
    }
    assert_int_equal(tern_finalize(f[1].ctx), TERN_ERR_TIMEOUT);
    assert_non_null(strstr(tern_last_error(), "tern/finalize"));
    /* Rank 1's late partner finds it already arrived. */
    assert_int_equal(tern_finalize(f[0].ctx), TERN_OK);
    assert_int_equal(tern_finalize(NULL), TERN_OK);
    tern_store_close(store);
}

/* A listening socket on a port whose successor is free: stands in for the
 * store torchrun's agent serves on MASTER_PORT. */
static int occupy_port_before_free_one(unsigned *port)
{
    for (int tries = 0; tries < 100; tries++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(a);
        int fd = socket(AF_INET, SOCK_STREAM, 0), probe;
        if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 1) != 0 ||
            getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
            close(fd);
            continue;
        }
        *port = ntohs(a.sin_port);
        a.sin_port = htons((uint16_t)(*port + 1));
        probe = socket(AF_INET, SOCK_STREAM, 0);
        int next_free = *port < 65535 && bind(probe, (struct sockaddr *)&a, sizeof(a)) == 0;
        close(probe);
        if (next_free)
            return fd;
        close(fd);
    }
    fail_msg("found no port whose successor is free");
    return -1;
}

static void test_torchrun_agent_store(void **state)
{
    unsigned port = 0;
    char buf[16];
    int fd = occupy_port_before_free_one(&port);
    (void)state;
    snprintf(buf, sizeof(buf), "%u", port);
    setenv("MASTER_PORT", buf, 1);
    /* torchrun says its agent serves MASTER_PORT: tern takes the next port. */
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    run_world(NULL, 0);
    /* TERN_MASTER_PORT names tern's own port outright. */
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    snprintf(buf, sizeof(buf), "%u", test_free_port());
    setenv("TERN_MASTER_PORT", buf, 1);
    run_world(NULL, 0);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_memory_store),
        cmocka_unit_test(test_threads_tcp_store),
        cmocka_unit_test_setup(test_launcher_order, clear_env),
        cmocka_unit_test_setup(test_launcher_conflict, clear_env),
        cmocka_unit_test_setup(test_bad_environment, clear_env),
        cmocka_unit_test_setup(test_unreachable_master, clear_env),
        cmocka_unit_test_setup(test_master_port_in_use, clear_env),
        cmocka_unit_test_setup(test_finalize_timeout, clear_env),
        cmocka_unit_test_setup_teardown(test_torchrun_agent_store, clear_env, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
