/* Logging: level filter, rank prefix, replaceable sink. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/log.h"

typedef struct seen {
    int count;
    tern_log_level_t level;
    int rank;
    char msg[256];
} seen_t;

static void sink(tern_log_level_t level, int rank, const char *msg, void *arg)
{
    seen_t *s = arg;
    s->count++;
    s->level = level;
    s->rank = rank;
    snprintf(s->msg, sizeof(s->msg), "%s", msg);
}

static void test_level_filter_and_sink(void **state)
{
    seen_t s = {0};
    (void)state;
    tern_log_set_sink(sink, &s);
    tern_log_set_level(TERN_LOG_WARN);
    tern_info("hidden %d", 1);
    tern_debug("hidden %d", 2);
    assert_int_equal(s.count, 0);
    tern_warn("shown %d", 3);
    assert_int_equal(s.count, 1);
    assert_int_equal(s.level, TERN_LOG_WARN);
    assert_string_equal(s.msg, "shown 3");
    assert_int_equal(s.rank, -1);
    tern__log_set_rank(7);
    tern_error("with rank");
    assert_int_equal(s.rank, 7);
    tern_log_set_level(TERN_LOG_DEBUG);
    tern_debug("now shown");
    assert_int_equal(s.count, 3);
    /* Out-of-range levels are clamped, not trusted. */
    tern_log_set_level((tern_log_level_t)99);
    assert_int_equal(tern_log_get_level(), TERN_LOG_TRACE);
    tern_log_set_level((tern_log_level_t)-5);
    assert_int_equal(tern_log_get_level(), TERN_LOG_ERROR);
    assert_string_equal(tern_log_level_name(TERN_LOG_INFO), "info");
    assert_string_equal(tern_log_level_name((tern_log_level_t)42), "?");
    tern_log_set_sink(NULL, NULL);
    tern__log_set_rank(-1);
}

/* The default sink writes one prefixed line per message to stderr. */
static void test_stderr_prefix(void **state)
{
    char path[] = "/tmp/tern-log-XXXXXX", buf[512] = {0};
    int fd = mkstemp(path), saved = dup(2);
    (void)state;
    assert_true(fd >= 0 && saved >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    tern_log_set_level(TERN_LOG_INFO);
    tern_warn("no rank here");
    tern__log_set_rank(3);
    tern_info("store: serving %u ranks", 4u);
    tern__log_set_rank(-1);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_true(pread(fd, buf, sizeof(buf) - 1, 0) > 0);
    close(fd);
    unlink(path);
    assert_string_equal(buf, "[tern warn] no rank here\n[tern 3 info] store: serving 4 ranks\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_level_filter_and_sink),
        cmocka_unit_test(test_stderr_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
