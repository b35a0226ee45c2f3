/* The environment table: defaults, good values, bad values, missing values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/config.h"
#include "core/error.h"

/* A fake environment: pairs of name, value, terminated by NULL. */
static const char *lookup(const char *name, void *arg)
{
    const char *const *kv = arg;
    for (; kv[0] != NULL; kv += 2)
        if (strcmp(kv[0], name) == 0)
            return kv[1];
    return NULL;
}

static tern_status_t load(tern__config_t *cfg, const char *const *env)
{
    return tern__config_load_from(cfg, lookup, (void *)env);
}

static void test_defaults(void **state)
{
    const char *env[] = {NULL};
    tern__config_t cfg;
    (void)state;
    assert_int_equal(load(&cfg, env), TERN_OK);
    assert_int_equal(cfg.log_level, TERN_LOG_WARN);
    assert_string_equal(cfg.master_addr, "127.0.0.1");
    assert_int_equal(cfg.master_port, 29500);
    assert_int_equal(cfg.connect_timeout_ns, 30000000000LL);
    assert_int_equal(cfg.timeout_ns, 300000000000LL);
    assert_int_equal(cfg.threads, 0);
    assert_true(cfg.bind);
    assert_string_equal(cfg.affinity_device, "");
    assert_true(cfg.eager_limit == TERN__SIZE_AUTO); /* the transport's, in tern__p2p_init */
    assert_true(cfg.coll_eager_limit == 64 * 1024);
    for (int l = 0; l < TERN__LAUNCHER_COUNT; l++) {
        assert_int_equal(cfg.launch[l].rank, TERN__UNSET);
        assert_int_equal(cfg.launch[l].world_size, TERN__UNSET);
    }
}

static void test_good_values(void **state)
{
    const char *env[] = {"TERN_LOG", "DEBUG", "TERN_RANK", "3", "TERN_WORLD_SIZE", "8",
                         "RANK", "1", "OMPI_COMM_WORLD_LOCAL_RANK", "2", "SLURM_NTASKS", "16",
                         "MASTER_ADDR", "node17", "MASTER_PORT", "1234",
                         "TERN_CONNECT_TIMEOUT", "250ms", "TERN_TIMEOUT", "2m",
                         "TERN_THREADS", "6", "TERN_BIND", "off", "TERN_AFFINITY_DEVICE", "mlx5_0",
                         "PMI_SIZE", " 4 ", "TERN_EAGER_LIMIT", "32k", NULL};
    tern__config_t cfg;
    (void)state;
    assert_int_equal(load(&cfg, env), TERN_OK);
    assert_int_equal(cfg.log_level, TERN_LOG_DEBUG);
    assert_int_equal(cfg.launch[TERN__LAUNCHER_TERN].rank, 3);
    assert_int_equal(cfg.launch[TERN__LAUNCHER_TERN].world_size, 8);
    assert_int_equal(cfg.launch[TERN__LAUNCHER_TORCHRUN].rank, 1);
    assert_int_equal(cfg.launch[TERN__LAUNCHER_OMPI].local_rank, 2);
    assert_int_equal(cfg.launch[TERN__LAUNCHER_SLURM].world_size, 16);
    assert_int_equal(cfg.launch[TERN__LAUNCHER_PMI].world_size, 4);
    assert_string_equal(cfg.master_addr, "node17");
    assert_int_equal(cfg.master_port, 1234);
    assert_int_equal(cfg.connect_timeout_ns, 250000000LL);
    assert_int_equal(cfg.timeout_ns, 120000000000LL);
    assert_int_equal(cfg.threads, 6);
    assert_false(cfg.bind);
    assert_string_equal(cfg.affinity_device, "mlx5_0");
    assert_true(cfg.eager_limit == 32 * 1024);
}

/* Each bad value must fail, and the detail must name the variable. */
static void test_bad_values(void **state)
{
    static const char *const bad[][2] = {
        {"TERN_LOG", "verbose"},         {"TERN_RANK", "-1"},
        {"TERN_RANK", "two"},            {"TERN_WORLD_SIZE", "0"},
        {"TERN_WORLD_SIZE", "4x"},       {"MASTER_PORT", "70000"},
        {"MASTER_PORT", "0"},            {"TERN_CONNECT_TIMEOUT", "5 parsecs"},
        {"TERN_CONNECT_TIMEOUT", "-5s"}, {"TERN_TIMEOUT", "ms"},
        {"TERN_THREADS", "100000"},      {"TERN_BIND", "maybe"},
        {"RANK", "99999999999999999999"}, {"SLURM_PROCID", "1.5"},
        /* "auto" is a size only where the variable says so. */
        {"TERN_EAGER_LIMIT", "automatic"}, {"TERN_COLL_EAGER_LIMIT", "auto"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *env[] = {bad[i][0], bad[i][1], NULL};
        tern__config_t cfg;
        assert_int_equal(load(&cfg, env), TERN_ERR_CONFIG);
        if (strstr(tern_last_error(), bad[i][0]) == NULL)
            fail_msg("detail for %s=%s does not name it: %s", bad[i][0], bad[i][1],
                     tern_last_error());
    }
    /* Too long for its buffer: an error, not a truncation. */
    char longval[400];
    memset(longval, 'a', sizeof(longval) - 1);
    longval[sizeof(longval) - 1] = '\0';
    const char *env[] = {"MASTER_ADDR", longval, NULL};
    tern__config_t cfg;
    assert_int_equal(load(&cfg, env), TERN_ERR_CONFIG);
    assert_non_null(strstr(tern_last_error(), "MASTER_ADDR"));
}

static void test_empty_is_unset(void **state)
{
    const char *env[] = {"TERN_RANK", "", "MASTER_PORT", "", NULL};
    tern__config_t cfg;
    (void)state;
    assert_int_equal(load(&cfg, env), TERN_OK);
    assert_int_equal(cfg.launch[TERN__LAUNCHER_TERN].rank, TERN__UNSET);
    assert_int_equal(cfg.master_port, 29500);
}

static void test_parsers(void **state)
{
    int64_t ns, i;
    uint64_t sz;
    bool b;
    (void)state;
    assert_int_equal(tern__parse_duration("10", &ns), TERN_OK);
    assert_int_equal(ns, 10000000000LL);
    assert_int_equal(tern__parse_duration("1h", &ns), TERN_OK);
    assert_int_equal(ns, 3600000000000LL);
    assert_int_equal(tern__parse_duration("15 us", &ns), TERN_OK);
    assert_int_equal(ns, 15000);
    assert_int_equal(tern__parse_duration("99999999999h", &ns), TERN_ERR_CONFIG);
    assert_int_equal(tern__parse_duration("", &ns), TERN_ERR_CONFIG);
    assert_int_equal(tern__parse_size("8k", &sz), TERN_OK);
    assert_int_equal(sz, 8192);
    assert_int_equal(tern__parse_size("16MiB", &sz), TERN_OK);
    assert_int_equal(sz, 16u << 20);
    assert_int_equal(tern__parse_size("3", &sz), TERN_OK);
    assert_int_equal(sz, 3);
    assert_int_equal(tern__parse_size("3q", &sz), TERN_ERR_CONFIG);
    assert_int_equal(tern__parse_size("99999999999999999999", &sz), TERN_ERR_CONFIG);
    assert_int_equal(tern__parse_size("20000000000g", &sz), TERN_ERR_CONFIG);
    assert_int_equal(tern__parse_int("42", 0, 100, &i), TERN_OK);
    assert_int_equal(i, 42);
    assert_int_equal(tern__parse_int("101", 0, 100, &i), TERN_ERR_CONFIG);
    assert_int_equal(tern__parse_int(NULL, 0, 100, &i), TERN_ERR_CONFIG);
    assert_int_equal(tern__parse_bool("TRUE", &b), TERN_OK);
    assert_true(b);
    assert_int_equal(tern__parse_bool("0", &b), TERN_OK);
    assert_false(b);
    assert_int_equal(tern__parse_bool("", &b), TERN_ERR_CONFIG);
}

/* The real environment path goes through getenv. */
static void test_real_environment(void **state)
{
    (void)state;
    setenv("TERN_THREADS", "lots", 1);
    assert_int_equal(tern_env_check(), TERN_ERR_CONFIG);
    assert_non_null(strstr(tern_last_error(), "TERN_THREADS=lots"));
    setenv("TERN_THREADS", "2", 1);
    assert_int_equal(tern_env_check(), TERN_OK);
    unsetenv("TERN_THREADS");
}

static void test_print_table(void **state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    (void)state;
    assert_non_null(f);
    assert_int_equal(tern_env_print(f, TERN_ENV_FORMAT_MARKDOWN), TERN_OK);
    fclose(f);
    assert_non_null(strstr(buf, "| `TERN_LOG` | tern | error/warn/info/debug/trace | `warn` |"));
    assert_non_null(strstr(buf, "`MASTER_PORT`"));
    assert_non_null(strstr(buf, "`SLURM_PROCID`"));
    free(buf);
    assert_int_equal(tern_env_print(NULL, TERN_ENV_FORMAT_TEXT), TERN_ERR_INVALID_PARAM);
}

static void test_enum_value_names(void **state)
{
    size_t n;
    const char *v;
    (void)state;
    v = tern__config_enum_value("TERN_TRANSPORT", 3, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(v, "tcp", 3);
    v = tern__config_enum_value("TERN_TRANSPORT", 0, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(v, "auto", 4);
    v = tern__config_enum_value("TERN_LOG", 4, &n);
    assert_int_equal(n, 5);
    assert_memory_equal(v, "trace", 5);
    assert_string_equal(tern__config_enum_value("TERN_LOG", 5, &n), "?");
    assert_string_equal(tern__config_enum_value("TERN_THREADS", 0, &n), "?"); /* not an enum */
    assert_string_equal(tern__config_enum_value("NO_SUCH", 0, &n), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),     cmocka_unit_test(test_good_values),
        cmocka_unit_test(test_bad_values),   cmocka_unit_test(test_empty_is_unset),
        cmocka_unit_test(test_parsers),      cmocka_unit_test(test_real_environment),
        cmocka_unit_test(test_print_table),
        cmocka_unit_test(test_enum_value_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
