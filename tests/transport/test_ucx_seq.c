/*
 * The ucx provider's 24-bit sequence numbers widened at the receiver
 * (transport/ucx/seq.h): in order, stale, ahead, across the 24-bit and the
 * 32-bit wrap, and at the edge of the 2^23 window either way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "transport/ucx/seq.h"

static void check(uint32_t next, uint32_t truth)
{
    assert_int_equal(tern__ucx_seq_near(next, truth & 0xffffffu), truth);
}

static void test_in_order(void **state)
{
    (void)state;
    check(0, 0);
    check(1, 1);
    check(0xfffffe, 0xfffffe);
    check(0x1000000, 0x1000000);      /* the first 24-bit wrap */
    check(0xffffffff, 0xffffffff);    /* the last before the 32-bit wrap */
    check(0, 0);                      /* and after it */
}

static void test_behind_and_ahead(void **state)
{
    (void)state;
    check(5, 3);                      /* stale: the receiver drops it */
    check(5, 9);                      /* ahead: it waits its turn */
    check(0x1000002, 0xfffffe);       /* stale, across the 24-bit wrap */
    check(0xfffffe, 0x1000003);       /* ahead, across it */
    check(0x12fffff0, 0x13000005);
    check(2, 0xfffffff0);             /* stale, across the 32-bit wrap */
    check(0xfffffff0, 2);             /* ahead, across it */
}

static void test_window_edges(void **state)
{
    (void)state;
    const uint32_t next = 0x5000000;
    check(next, next + 0x7fffff);     /* the farthest ahead it can tell */
    check(next, next - 0x800000);     /* the farthest behind */
    /* One further ahead reads as that far behind: the limit docs/transport-ucx.md states. */
    assert_int_equal(tern__ucx_seq_near(next, (next + 0x800000) & 0xffffffu), next - 0x800000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order),
        cmocka_unit_test(test_behind_and_ahead),
        cmocka_unit_test(test_window_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
