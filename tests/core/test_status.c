/* Status names, descriptions and the per-thread error detail. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"
#include <tern/status.h>

static void test_every_status_has_a_name(void **state)
{
    (void)state;
#define CHECK(name, value, desc)                                   \
    assert_string_equal(tern_strerror(name), desc);                \
    assert_string_equal(tern_status_name(name), #name);            \
    assert_int_equal((int)name, value);
    TERN_STATUS_MAP(CHECK)
#undef CHECK
    assert_string_equal(tern_strerror(TERN_ERR_TIMEOUT), "timed out");
    assert_string_equal(tern_strerror((tern_status_t)-999), "unknown status");
    assert_string_equal(tern_status_name((tern_status_t)12345), "TERN_UNKNOWN");
}

static void test_codes_are_unique(void **state)
{
    static const int codes[] = {
#define CODE(name, value, desc) value,
        TERN_STATUS_MAP(CODE)
#undef CODE
    };
    size_t n = sizeof(codes) / sizeof(codes[0]);
    (void)state;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            assert_int_not_equal(codes[i], codes[j]);
}

/* Statuses read from the network: only TERN_OK and the error codes pass. */
static void test_status_from_wire(void **state)
{
    (void)state;
#define WIRE(name, value, desc)                                                   \
    assert_int_equal(tern__status_is_error(value), value < 0);                    \
    assert_int_equal(tern__status_from_wire(value),                               \
                     value == TERN_INPROGRESS ? TERN_ERR_PROTOCOL : (int)name);
    TERN_STATUS_MAP(WIRE)
#undef WIRE
    static const int32_t bad[] = {2, 5, 12345, INT32_MAX, -11, -19, -24, -64, -1000, INT32_MIN};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_false(tern__status_is_error(bad[i]));
        assert_int_equal(tern__status_from_wire(bad[i]), TERN_ERR_PROTOCOL);
    }
}

static void test_error_detail(void **state)
{
    (void)state;
    assert_int_equal(tern__error(TERN_ERR_NOT_FOUND, "key '%s' of %d", "abc", 3), TERN_ERR_NOT_FOUND);
    assert_string_equal(tern_last_error(), "key 'abc' of 3");
    assert_int_equal(tern__error_errno(TERN_ERR_IO, ECONNREFUSED, "connect to %s", "h:1"),
                     TERN_ERR_IO);
    assert_string_equal(tern_last_error(), "connect to h:1: Connection refused");
}

/* Callers wrap the error before theirs in their own: the detail is read
 * whole before it is overwritten, and a wrap past the limit is cut, not
 * overrun. */
static void test_error_wraps_the_last(void **state)
{
    (void)state;
    tern__error(TERN_ERR_PROTOCOL, "RRef argument names rank %d", 7);
    tern__error(TERN_ERR_PROTOCOL, "RRef %u: %s", 0u, tern_last_error());
    tern__error(TERN_ERR_PROTOCOL, "arguments: %s", tern_last_error());
    assert_string_equal(tern_last_error(), "arguments: RRef 0: RRef argument names rank 7");
    tern__error_errno(TERN_ERR_IO, EPIPE, "send: %s", tern_last_error());
    assert_string_equal(tern_last_error(),
                        "send: arguments: RRef 0: RRef argument names rank 7: Broken pipe");
    char longer[TERN__ERROR_MAX + 64];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    tern__error(TERN_ERR_IO, "%s", longer);
    for (int i = 0; i < 3; i++)
        tern__error(TERN_ERR_IO, "wrap %d: %s", i, tern_last_error());
    assert_int_equal(strlen(tern_last_error()), TERN__ERROR_MAX - 1);
    assert_memory_equal(tern_last_error(), "wrap 2: wrap 1: wrap 0: xxx", 27);
}

static void test_errno_mapping(void **state)
{
    (void)state;
    assert_int_equal(tern__status_from_errno(ECONNREFUSED), TERN_ERR_CONN_REFUSED);
    assert_int_equal(tern__status_from_errno(EADDRINUSE), TERN_ERR_ADDR_IN_USE);
    assert_int_equal(tern__status_from_errno(ETIMEDOUT), TERN_ERR_TIMEOUT);
    assert_int_equal(tern__status_from_errno(ENOMEM), TERN_ERR_NO_MEMORY);
    assert_int_equal(tern__status_from_errno(EIO), TERN_ERR_IO);
}

static void *other_thread(void *arg)
{
    /* A fresh thread has no detail, and its errors do not leak to others. */
    int *ok = arg;
    *ok = tern_last_error()[0] == '\0';
    tern__error(TERN_ERR_TIMEOUT, "from the other thread");
    *ok = *ok && strcmp(tern_last_error(), "from the other thread") == 0;
    return NULL;
}

static void test_detail_is_per_thread(void **state)
{
    pthread_t t;
    int ok = 0;
    (void)state;
    tern__error(TERN_ERR_ACCESS, "main thread");
    assert_int_equal(pthread_create(&t, NULL, other_thread, &ok), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(ok);
    assert_string_equal(tern_last_error(), "main thread");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_status_has_a_name),
        cmocka_unit_test(test_codes_are_unique),
        cmocka_unit_test(test_status_from_wire),
        cmocka_unit_test(test_error_detail),
        cmocka_unit_test(test_error_wraps_the_last),
        cmocka_unit_test(test_errno_mapping),
        cmocka_unit_test(test_detail_is_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
