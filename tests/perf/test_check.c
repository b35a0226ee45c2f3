/* tern-perf --check must catch a collective that delivers the right data to
 * the wrong place: a rank given another rank's block (reduce_scatter, scatter,
 * alltoall) or two blocks swapped in a gathered output (allgather, gather).
 * The inputs used to repeat every 7 elements and every 7 ranks, so at counts
 * that were multiples of 7 (5 for prod and bool) every block looked alike and
 * such a mistake passed. verify() is static: the file is compiled in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "perf/bench_coll.c"

typedef struct {
    tern_dtype_t dtype;
    tern_reduce_op_t op;
    size_t cmin, cmax; /* counts per block: enough that blocks cannot match by chance */
} kind_t;

static const kind_t kinds[] = {
    {TERN_DTYPE_F32, TERN_SUM, 14, 42},  {TERN_DTYPE_I8, TERN_SUM, 14, 42},
    {TERN_DTYPE_BF16, TERN_MAX, 14, 42}, {TERN_DTYPE_F32, TERN_PROD, 60, 80},
    {TERN_DTYPE_BOOL, TERN_MAX, 60, 80},
};

/* Whether verify() rejects, as rank k's output, what is expected of rank k2. */
static int rejects_other_rank(tern_bench_test_t t, const kind_t *kd, unsigned n, size_t c,
                              unsigned k, unsigned k2)
{
    pattern_t p;
    char detail[256];
    pattern_init(&p, kd->dtype, kd->op, is_reduction(t), n);
    size_t out = t == TERN_BENCH_ALLTOALL ? (size_t)n * c : c;
    uint8_t *buf = malloc(out * p.es);
    assert_non_null(buf);
    for (size_t j = 0; j < out; j++)
        put_expected(&p, t, k2, 0, c, j, buf + j * p.es);
    int bad = verify(&p, t, k, 0, c, buf, out, out * p.es, detail, sizeof(detail));
    free(buf);
    return bad;
}

/* Whether verify() rejects a gathered output with blocks a and b swapped. */
static int rejects_swap(tern_bench_test_t t, const kind_t *kd, unsigned n, size_t c, unsigned a,
                        unsigned b)
{
    pattern_t p;
    char detail[256];
    pattern_init(&p, kd->dtype, kd->op, 0, n);
    size_t out = (size_t)n * c;
    uint8_t *buf = malloc(out * p.es);
    assert_non_null(buf);
    for (size_t j = 0; j < out; j++) {
        size_t blk = j / c, at = j % c;
        size_t from = blk == a ? b : blk == b ? a : blk;
        put_expected(&p, t, 0, 0, c, from * c + at, buf + j * p.es);
    }
    int bad = verify(&p, t, 0, 0, c, buf, out, out * p.es, detail, sizeof(detail));
    free(buf);
    return bad;
}

static void test_wrong_rank_block(void **state)
{
    static const tern_bench_test_t tests[] = {TERN_BENCH_REDUCE_SCATTER, TERN_BENCH_SCATTER,
                                              TERN_BENCH_ALLTOALL};
    unsigned tried = 0;
    (void)state;
    for (size_t ti = 0; ti < sizeof(tests) / sizeof(tests[0]); ti++) {
        for (size_t ki = 0; ki < sizeof(kinds) / sizeof(kinds[0]); ki++) {
            const kind_t *kd = &kinds[ki];
            if (!is_reduction(tests[ti]) && kd->op == TERN_PROD)
                continue;
            /* The maximum of many ranks' small values (an OR of bools) is
             * nearly always the top value, whichever block: no input can
             * tell blocks of such a result apart. */
            if (is_reduction(tests[ti]) && kd->op == TERN_MAX)
                continue;
            for (unsigned n = 2; n <= 9; n++)
                for (size_t c = kd->cmin; c <= kd->cmax; c++, tried++)
                    if (!rejects_other_rank(tests[ti], kd, n, c, 0, n - 1))
                        fail_msg("%s %s %s, %u ranks, %zu per block: rank %u's block passed "
                                 "as rank 0's",
                                 tern_bench_name(tests[ti]), tern_dtype_name(kd->dtype),
                                 tern_reduce_op_name(kd->op), n, c, n - 1);
        }
    }
    print_message("%u cases\n", tried);
}

static void test_swapped_blocks(void **state)
{
    static const tern_bench_test_t tests[] = {TERN_BENCH_ALLGATHER, TERN_BENCH_GATHER};
    (void)state;
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t ki = 0; ki < sizeof(kinds) / sizeof(kinds[0]); ki++) {
            const kind_t *kd = &kinds[ki];
            if (kd->op == TERN_PROD)
                continue;
            for (unsigned n = 2; n <= 9; n++)
                for (size_t c = kd->cmin; c <= kd->cmax; c++)
                    if (!rejects_swap(tests[ti], kd, n, c, 0, n - 1))
                        fail_msg("%s %s, %u ranks, %zu per block: blocks 0 and %u swapped "
                                 "passed",
                                 tern_bench_name(tests[ti]), tern_dtype_name(kd->dtype), n, c,
                                 n - 1);
        }
}

/* And the right output passes: the check is not merely always failing. */
static void test_right_output_passes(void **state)
{
    (void)state;
    for (unsigned n = 2; n <= 9; n++) {
        assert_false(rejects_other_rank(TERN_BENCH_REDUCE_SCATTER, &kinds[0], n, 21, 1, 1));
        assert_false(rejects_other_rank(TERN_BENCH_ALLTOALL, &kinds[4], n, 70, 1, 1));
        assert_false(rejects_swap(TERN_BENCH_ALLGATHER, &kinds[1], n, 21, 0, 0));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrong_rank_block),
        cmocka_unit_test(test_swapped_blocks),
        cmocka_unit_test(test_right_output_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
