/* perf/host.c: steal time read from /proc/stat, the figure tern-perf puts
 * beside rows a busy hypervisor spoiled. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "perf/host.h"

static void test_parse_full_line(void **state)
{
    /* proc(5): user nice system idle iowait irq softirq steal guest guest_nice;
     * guest time is already counted in user and nice, so not in the total. */
    const char *text = "cpu  100 2 30 400 5 6 7 50 900 900\n"
                       "cpu0 50 1 15 200 2 3 3 25 450 450\n"
                       "intr 12345\n";
    tern_bench_cpu_t c;
    (void)state;
    assert_int_equal(tern_bench_cpu_parse(text, &c), 0);
    assert_true(c.ok);
    assert_int_equal(c.steal, 50);
    assert_int_equal(c.total, 100 + 2 + 30 + 400 + 5 + 6 + 7 + 50);
}

static void test_parse_eight_fields_and_later_line(void **state)
{
    tern_bench_cpu_t c;
    (void)state;
    assert_int_equal(tern_bench_cpu_parse("cpu  1 2 3 4 5 6 7 8", &c), 0);
    assert_int_equal(c.steal, 8);
    assert_int_equal(c.total, 36);
    /* Not relying on the cpu line coming first. */
    assert_int_equal(tern_bench_cpu_parse("btime 1\ncpu 1 1 1 1 1 1 1 3\n", &c), 0);
    assert_int_equal(c.steal, 3);
    assert_int_equal(c.total, 10);
}

static void test_parse_rejects(void **state)
{
    static const char *const bad[] = {
        "",
        "cpu  1 2 3 4 5 6 7\n",          /* no steal field: kernels before 2.6.11 */
        "cpu  1 2 3 4 5 6 7\n8 9\n",     /* the line ends before steal */
        "cpu0 1 2 3 4 5 6 7 8\n",        /* a single CPU's line is not the machine's */
        "cpux 1 2 3 4 5 6 7 8\n",
        "cpu  1 2 3 4 -5 6 7 8\n",       /* a sign */
        "cpu  1 2 3 4 5x 6 7 8\n",       /* trailing garbage in a field */
        "cpu  1 2 3 4 5 6 7 99999999999999999999999\n", /* beyond 64 bits */
        "cpu  18446744073709551615 1 0 0 0 0 0 0\n",    /* the total overflows */
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tern_bench_cpu_t c = {.ok = 1};
        if (tern_bench_cpu_parse(bad[i], &c) != -1 || c.ok)
            fail_msg("accepted: \"%s\"", bad[i]);
    }
}

static void test_steal_pct(void **state)
{
    tern_bench_cpu_t a = {.steal = 100, .total = 1000, .ok = 1};
    tern_bench_cpu_t b = {.steal = 150, .total = 1200, .ok = 1};
    (void)state;
    assert_float_equal(tern_bench_steal_pct(&a, &b), 25.0, 1e-9);
    b.steal = 100;
    assert_float_equal(tern_bench_steal_pct(&a, &b), 0.0, 1e-9);
    /* Unknown: no tick passed, a counter went back, a reading failed. */
    assert_true(tern_bench_steal_pct(&a, &a) < 0);
    b.steal = 99;
    assert_true(tern_bench_steal_pct(&a, &b) < 0);
    b = (tern_bench_cpu_t){.steal = 150, .total = 900, .ok = 1};
    assert_true(tern_bench_steal_pct(&a, &b) < 0);
    b = (tern_bench_cpu_t){.steal = 150, .total = 1200, .ok = 0};
    assert_true(tern_bench_steal_pct(&a, &b) < 0);
    assert_true(tern_bench_steal_pct(&b, &a) < 0);
}

static void test_reads_this_machine(void **state)
{
    tern_bench_cpu_t a, b;
    (void)state;
    /* Every Linux since 2.6.11 has the field; this test runs on Linux only. */
    assert_int_equal(tern_bench_cpu_read(&a), 0);
    assert_true(a.ok);
    assert_true(a.total > 0 && a.steal <= a.total);
    assert_int_equal(tern_bench_cpu_read(&b), 0);
    assert_true(b.total >= a.total && b.steal >= a.steal);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_full_line),
        cmocka_unit_test(test_parse_eight_fields_and_later_line),
        cmocka_unit_test(test_parse_rejects),
        cmocka_unit_test(test_steal_pct),
        cmocka_unit_test(test_reads_this_machine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
