/* The puts' way by the wall clock (collectives/way.c): the schedule every
 * member derives from the call number, the choices the group's rank 0 makes
 * on timed calls, and members taking them at the same call. */
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

/* Call i picked by the group's rank 0; returns its way. */
static tern_op_way_t pick(tern__way_t *w, uint64_t i)
{
    bool chose;
    return tern__way_pick(w, i, true, &chose);
}

/* Call i picked by rank 0 and timed at the costs given; returns its way. */
static tern_op_way_t call(tern__way_t *w, uint64_t i, costs_t c)
{
    tern_op_way_t way = pick(w, i);
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
        assert_int_equal(pick(&w, i), want);
        /* the first call is left out, however long it took */
        tern__way_took(&w, i, want, i == 0 ? 1000000000ull : (want == TERN_WAY_COPY ? 100 : 200));
    }
    assert_int_equal(w.now.best, TERN_WAY_AUTO);
    assert_true(tern__way_median(&w, TERN_WAY_COPY) == 100.0);
    assert_true(tern__way_median(&w, TERN_WAY_REF) == 200.0);
    bool chose;
    assert_int_equal(tern__way_pick(&w, 4 * TERN__WAY_BLOCK, true, &chose), TERN_WAY_COPY);
    assert_true(chose);
    assert_int_equal(w.plan.best, TERN_WAY_COPY);
    assert_int_equal(w.plan.from, 4 * TERN__WAY_BLOCK + TERN__WAY_LAG);
    /* a member does not choose: it copies until rank 0's plan comes */
    tern__way_t m = {.shape = 1};
    for (uint64_t i = 0; i < 4 * TERN__WAY_BLOCK; i++)
        tern__way_pick(&m, i, false, &chose);
    assert_int_equal(tern__way_pick(&m, 4 * TERN__WAY_BLOCK, false, &chose), TERN_WAY_COPY);
    assert_false(chose);
    assert_false(m.planned);
}

static void test_follows_the_clock(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    const uint64_t seed = 4 * TERN__WAY_BLOCK;
    /* by reference faster: chosen after the seed */
    run(&w, 0, seed, (costs_t){{300, 200}});
    /* chosen at the seed's end, taken TERN__WAY_LAG calls on */
    assert_int_equal(run(&w, seed, seed + TERN__WAY_LAG, (costs_t){{300, 200}}), 0);
    assert_int_equal(call(&w, seed + TERN__WAY_LAG, (costs_t){{300, 200}}), TERN_WAY_REF);
    /* the first try of copying comes TERN__WAY_GAP_MIN calls after the choice, one block long */
    assert_int_equal(w.now.try_at, seed + TERN__WAY_GAP_MIN);
    unsigned ref = run(&w, seed + TERN__WAY_LAG + 1, w.now.try_at + TERN__WAY_BLOCK,
                       (costs_t){{300, 200}});
    assert_int_equal(ref, TERN__WAY_GAP_MIN - TERN__WAY_LAG - 1);
    /* the choice held: the next try twice as far */
    uint64_t i = seed + TERN__WAY_GAP_MIN + TERN__WAY_BLOCK;
    assert_int_equal(call(&w, i, (costs_t){{300, 200}}), TERN_WAY_REF);
    assert_int_equal(w.plan.try_at, i + 2 * TERN__WAY_GAP_MIN);
    run(&w, i + 1, i + TERN__WAY_LAG + 1, (costs_t){{300, 200}});
    assert_int_equal(w.now.try_at, i + 2 * TERN__WAY_GAP_MIN);
    /* the hour changes: copying is now twice as fast; the next try finds it */
    uint64_t end = w.now.try_at + TERN__WAY_BLOCK;
    run(&w, i + TERN__WAY_LAG + 1, end, (costs_t){{100, 200}});
    assert_int_equal(pick(&w, end), TERN_WAY_REF);
    assert_int_equal(w.plan.best, TERN_WAY_COPY);
    run(&w, end + 1, end + TERN__WAY_LAG, (costs_t){{100, 200}});
    assert_int_equal(pick(&w, end + TERN__WAY_LAG), TERN_WAY_COPY);
    assert_int_equal(w.now.best, TERN_WAY_COPY);
    assert_int_equal(w.now.try_at, end + TERN__WAY_GAP_MIN);
}

static void test_holds_within_a_sixteenth(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    run(&w, 0, 4 * TERN__WAY_BLOCK + TERN__WAY_LAG, (costs_t){{100, 120}});
    assert_int_equal(call(&w, 4 * TERN__WAY_BLOCK + TERN__WAY_LAG, (costs_t){{100, 120}}),
                     TERN_WAY_COPY);
    assert_int_equal(w.now.best, TERN_WAY_COPY);
    /* by reference 4 % faster from here: not enough to swap */
    run(&w, 4 * TERN__WAY_BLOCK + TERN__WAY_LAG + 1, 5000, (costs_t){{100, 96}});
    assert_int_equal(w.now.best, TERN_WAY_COPY);
    /* 10 % faster is */
    run(&w, 5000, 20000, (costs_t){{100, 90}});
    assert_int_equal(w.now.best, TERN_WAY_REF);
}

/* An even seed leaves every member copying; one slow call in a block does
 * not decide it. */
static void test_even_and_outliers(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    const uint64_t seed = 4 * TERN__WAY_BLOCK;
    run(&w, 0, seed, (costs_t){{100, 97}});
    assert_int_equal(pick(&w, seed), TERN_WAY_COPY);
    assert_int_equal(w.plan.best, TERN_WAY_COPY);
    /* copying 100 us but for one call of 2 ms (call 9, in the second copied
     * block); by reference 150 us */
    tern__way_t v = {.shape = 2};
    run(&v, 0, 9, (costs_t){{100, 150}});
    assert_int_equal(call(&v, 9, (costs_t){{2000, 150}}), TERN_WAY_COPY);
    run(&v, 10, seed, (costs_t){{100, 150}});
    assert_true(tern__way_median(&v, TERN_WAY_COPY) == 100.0);
    assert_int_equal(pick(&v, seed), TERN_WAY_COPY);
    assert_int_equal(v.plan.best, TERN_WAY_COPY);
}

static void test_tries_grow_sparse(void **state)
{
    (void)state;
    tern__way_t w = {.shape = 1};
    const uint64_t n = 200000;
    unsigned ref = run(&w, 0, n, (costs_t){{100, 200}});
    assert_int_equal(w.now.best, TERN_WAY_COPY);
    assert_int_equal(w.now.gap, TERN__WAY_GAP_MAX);
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

/* Rank 0's costs: by reference faster until call 3000, copying faster
 * until 9000, then by reference again. */
static costs_t lead_costs(uint64_t i)
{
    return i < 3000 || i >= 9000 ? (costs_t){{300, 200}} : (costs_t){{100, 200}};
}

/* A member whose own calls would say the opposite throughout takes every
 * choice of rank 0 at the same call, its plans arriving up to
 * TERN__WAY_LAG - 1 calls after they were made. */
static void test_members_take_the_same_calls(void **state)
{
    (void)state;
    for (uint64_t delay = 0; delay < TERN__WAY_LAG; delay++) {
        tern__way_t w = {.shape = 7}, m = {.shape = 7};
        tern__way_plan_t sent[64];
        uint64_t sent_at[64];
        unsigned nsent = 0, ndelivered = 0, swaps = 0;
        tern_op_way_t last = TERN_WAY_AUTO;
        for (uint64_t i = 0; i < 20000; i++) {
            while (ndelivered < nsent && sent_at[ndelivered] + delay <= i)
                assert_true(tern__way_follow(&m, &sent[ndelivered++]));
            bool chose, mchose;
            tern_op_way_t a = tern__way_pick(&w, i, true, &chose);
            tern_op_way_t b = tern__way_pick(&m, i, false, &mchose);
            assert_false(mchose);
            if (a != b)
                fail_msg("call %llu (plans %llu calls late): rank 0 %d, member %d",
                         (unsigned long long)i, (unsigned long long)delay, a, b);
            if (chose) {
                assert_true(nsent < 64);
                sent_at[nsent] = i;
                sent[nsent++] = w.plan;
            }
            costs_t c = lead_costs(i);
            tern__way_took(&w, i, a, c.ns[a == TERN_WAY_REF]);
            tern__way_took(&m, i, b, c.ns[a != TERN_WAY_REF]); /* the opposite */
            if (i >= 4 * TERN__WAY_BLOCK && w.now.best != last) {
                swaps++;
                last = w.now.best;
            }
        }
        /* by reference, copying, by reference: the leader's clock, not the member's */
        assert_int_equal(swaps, 3);
        assert_int_equal(m.now.best, TERN_WAY_REF);
    }
}

/* A plan that comes after its call takes effect at the next; an older one
 * changes nothing; one that cannot be rank 0's is refused and changes
 * nothing. */
static void test_late_stale_and_bad_plans(void **state)
{
    (void)state;
    tern__way_t m = {.shape = 3};
    bool chose;
    for (uint64_t i = 0; i < 40; i++)
        assert_int_equal(tern__way_pick(&m, i, false, &chose),
                         i < 4 * TERN__WAY_BLOCK && (i / TERN__WAY_BLOCK) % 2 == 1 ? TERN_WAY_REF
                                                                                    : TERN_WAY_COPY);
    const uint64_t made = 4 * TERN__WAY_BLOCK; /* chosen at 16, for 20 on; now at call 40 */
    tern__way_plan_t p = {.from = made + TERN__WAY_LAG,
                          .try_at = made + TERN__WAY_GAP_MIN,
                          .gap = TERN__WAY_GAP_MIN,
                          .best = TERN_WAY_REF};
    tern__way_plan_t bad[] = {p, p, p, p, p, p, p};
    bad[0].best = TERN_WAY_AUTO;
    bad[1].best = (tern_op_way_t)7;
    bad[2].gap = TERN__WAY_GAP_MIN / 2, bad[2].try_at = made + bad[2].gap;
    bad[3].gap = TERN__WAY_GAP_MAX * 2, bad[3].try_at = made + bad[3].gap;
    bad[4].try_at++;
    bad[5].from = bad[5].try_at = 0;
    bad[6].from = UINT64_MAX - 1, bad[6].try_at = bad[6].from - TERN__WAY_LAG + bad[6].gap; /* wraps */
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        assert_false(tern__way_follow(&m, &bad[k]));
        assert_false(m.planned);
    }
    assert_true(tern__way_follow(&m, &p));
    assert_int_equal(tern__way_pick(&m, 40, false, &chose), TERN_WAY_REF);
    assert_int_equal(m.now.try_at, made + TERN__WAY_GAP_MIN);
    assert_int_equal(tern__way_pick(&m, 41, false, &chose), TERN_WAY_REF);
    /* the same plan again, or an older one: nothing changes */
    tern__way_plan_t older = p;
    older.best = TERN_WAY_COPY;
    assert_true(tern__way_follow(&m, &p));
    assert_true(tern__way_follow(&m, &older));
    assert_false(m.planned);
    for (uint64_t i = 42; i < 60; i++)
        assert_int_equal(tern__way_pick(&m, i, false, &chose),
                         i >= made + TERN__WAY_GAP_MIN && i < made + TERN__WAY_GAP_MIN + TERN__WAY_BLOCK
                             ? TERN_WAY_COPY
                             : TERN_WAY_REF);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_in_blocks),
        cmocka_unit_test(test_follows_the_clock),
        cmocka_unit_test(test_holds_within_a_sixteenth),
        cmocka_unit_test(test_even_and_outliers),
        cmocka_unit_test(test_tries_grow_sparse),
        cmocka_unit_test(test_members_take_the_same_calls),
        cmocka_unit_test(test_late_stale_and_bad_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
