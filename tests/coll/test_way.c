/* The puts' way by the wall clock (collectives/way.c): the schedule every
 * member derives from the call number, and the choices it makes on timed
 * calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "collectives/way.h"

/* ns a call takes each way: [0] copied, [1] by reference */
typedef struct {
    uint64_t ns[2];
} costs_t;

/* Call i picked and timed at the costs given; returns its way. */
static tern_op_way_t call(tern__way_t *w, uint64_t i, costs_t c)
{
    tern_op_way_t way = tern__way_pick(w, i);
    assert_true(way == TERN_WAY_COPY || way == TERN_WAY_REF);
    tern__way_took(w, i, way, c.ns[way == TERN_WAY_REF]);
    return way;
}

/* Calls from..to-1 picked and timed at the costs given; counts how many
 * went by reference. */
static unsigned run(tern__way_t *w, uint64_t from, uint64_t to, costs_t c)
{
    unsigned ref = 0;
    for (uint64_t i = from; i < to; i++)
        ref += call(w, i, c) == TERN_WAY_REF;
    return ref;
}

static void test_seed_in_blocks(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    for (uint64_t i = 0; i < 4 * TERN__WAY_BLOCK; i++) {
        tern_op_way_t want = (i / TERN__WAY_BLOCK) % 2 == 0 ? TERN_WAY_COPY : TERN_WAY_REF;
        assert_int_equal(tern__way_pick(&w, i), want);
        /* the first call is left out, however long it took */
        tern__way_took(&w, i, want, i == 0 ? 1000000000ull : (want == TERN_WAY_COPY ? 100 : 200));
    }
    assert_int_equal(w.best, TERN_WAY_AUTO);
    assert_true(tern__way_median(&w, TERN_WAY_COPY) == 100.0);
    assert_true(tern__way_median(&w, TERN_WAY_REF) == 200.0);
    assert_int_equal(tern__way_pick(&w, 4 * TERN__WAY_BLOCK), TERN_WAY_COPY);
    assert_int_equal(w.best, TERN_WAY_COPY);
}

static void test_follows_the_clock(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    const uint64_t seed = 4 * TERN__WAY_BLOCK;
    /* by reference faster: chosen after the seed */
    run(&w, 0, seed, (costs_t){{300, 200}});
    assert_int_equal(call(&w, seed, (costs_t){{300, 200}}), TERN_WAY_REF);
    /* the first try of copying comes TERN__WAY_GAP_MIN calls on, one block long */
    assert_int_equal(w.try_at, seed + TERN__WAY_GAP_MIN);
    unsigned ref = run(&w, seed + 1, w.try_at + TERN__WAY_BLOCK, (costs_t){{300, 200}});
    assert_int_equal(ref, TERN__WAY_GAP_MIN - 1);
    /* the choice held: the next try twice as far */
    uint64_t i = seed + TERN__WAY_GAP_MIN + TERN__WAY_BLOCK;
    assert_int_equal(call(&w, i, (costs_t){{300, 200}}), TERN_WAY_REF);
    assert_int_equal(w.try_at, i + 2 * TERN__WAY_GAP_MIN);
    /* the hour changes: copying is now twice as fast; the next try finds it */
    uint64_t end = w.try_at + TERN__WAY_BLOCK;
    run(&w, i + 1, end, (costs_t){{100, 200}});
    assert_int_equal(tern__way_pick(&w, end), TERN_WAY_COPY);
    assert_int_equal(w.best, TERN_WAY_COPY);
    assert_int_equal(w.try_at, end + TERN__WAY_GAP_MIN);
}

static void test_holds_within_a_sixteenth(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    run(&w, 0, 4 * TERN__WAY_BLOCK, (costs_t){{100, 120}});
    assert_int_equal(call(&w, 4 * TERN__WAY_BLOCK, (costs_t){{100, 120}}), TERN_WAY_COPY);
    /* by reference 4 % faster from here: not enough to swap */
    run(&w, 4 * TERN__WAY_BLOCK + 1, 5000, (costs_t){{100, 96}});
    assert_int_equal(w.best, TERN_WAY_COPY);
    /* 10 % faster is */
    run(&w, 5000, 20000, (costs_t){{100, 90}});
    assert_int_equal(w.best, TERN_WAY_REF);
}

/* An even seed leaves every member copying; one slow call in a block does
 * not decide it. */
static void test_even_and_outliers(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    const uint64_t seed = 4 * TERN__WAY_BLOCK;
    run(&w, 0, seed, (costs_t){{100, 97}});
    assert_int_equal(tern__way_pick(&w, seed), TERN_WAY_COPY);
    /* copying 100 us but for one call of 2 ms (call 9, in the second copied
     * block); by reference 150 us */
    tern__way_t v = {.shape = 2};
    run(&v, 0, 9, (costs_t){{100, 150}});
    assert_int_equal(call(&v, 9, (costs_t){{2000, 150}}), TERN_WAY_COPY);
    run(&v, 10, seed, (costs_t){{100, 150}});
    assert_true(tern__way_median(&v, TERN_WAY_COPY) == 100.0);
    assert_int_equal(tern__way_pick(&v, seed), TERN_WAY_COPY);
}

static void test_tries_grow_sparse(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    const uint64_t n = 200000;
    unsigned ref = run(&w, 0, n, (costs_t){{100, 200}});
    assert_int_equal(w.best, TERN_WAY_COPY);
    assert_int_equal(w.gap, TERN__WAY_GAP_MAX);
    /* the seed's two blocks, then one block per try: tries at gaps 32, 64,
     * ... 4096, then every 4096 */
    unsigned tries = 0;
    for (uint64_t at = 4 * TERN__WAY_BLOCK, gap = TERN__WAY_GAP_MIN; at + gap < n;) {
        at += gap;
        if (at < n)
            tries++;
        at += TERN__WAY_BLOCK;
        if (gap < TERN__WAY_GAP_MAX)
            gap *= 2;
    }
    assert_int_equal(ref, 2 * TERN__WAY_BLOCK + tries * TERN__WAY_BLOCK);
    assert_true(ref < n / 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_in_blocks),
        cmocka_unit_test(test_follows_the_clock),
        cmocka_unit_test(test_holds_within_a_sixteenth),
        cmocka_unit_test(test_even_and_outliers),
        cmocka_unit_test(test_tries_grow_sparse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
