/* The monotonic clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include <tern/clock.h>

static void test_never_goes_back(void **state)
{
    uint64_t prev = tern_clock_ns();
    (void)state;
    for (int i = 0; i < 1000000; i++) {
        uint64_t now = tern_clock_ns();
        assert_true(now >= prev);
        prev = now;
    }
}

static void test_counts_nanoseconds(void **state)
{
    /* A 20 ms sleep must read as at least 20 ms; the upper bound only guards
     * against a wrong unit (us or s), not against a slow machine. */
    struct timespec ts = {0, 20 * 1000 * 1000};
    uint64_t t0, dt;
    (void)state;
    t0 = tern_clock_ns();
    nanosleep(&ts, NULL);
    dt = tern_clock_ns() - t0;
    assert_true(dt >= 20u * 1000 * 1000);
    assert_true(dt < 20ull * 1000 * 1000 * 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_goes_back),
        cmocka_unit_test(test_counts_nanoseconds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
