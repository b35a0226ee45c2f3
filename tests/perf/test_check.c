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

/* Element j of the sum over ranks [lo, hi) of the inputs, reduced by the
 * kernels as a collective would: a left fold, or (tree) halves summed apart
 * and then together. */
static void sum_ranks(const pattern_t *p, uint8_t *const *in, unsigned lo, unsigned hi, size_t c,
                      int tree, uint8_t *out)
{
    if (tree && hi - lo > 1) {
        const unsigned mid = lo + (hi - lo) / 2;
        uint8_t *right = malloc(c * p->es);
        assert_non_null(right);
        sum_ranks(p, in, lo, mid, c, 1, out);
        sum_ranks(p, in, mid, hi, c, 1, right);
        assert_int_equal(tern__reduce(TERN_SUM, p->dtype, out, out, right, c), TERN_OK);
        free(right);
        return;
    }
    memcpy(out, in[lo], c * p->es);
    for (unsigned r = lo + 1; r < hi; r++)
        assert_int_equal(tern__reduce(TERN_SUM, p->dtype, out, out, in[r], c), TERN_OK);
}

/* An all_reduce SUM of f16 or bf16 over more ranks than the dtype has exact
 * integers (256 for bf16, 2048 for f16) still gives the reference's bits in
 * any order of summation. Before the inputs kept every sum within those,
 * --check failed bf16 from 257 ranks on (the sums of ones rounded as they
 * went, differently in each order). */
static void test_large_world_sums_exact(void **state)
{
    static const struct {
        tern_dtype_t dtype;
        unsigned n;
    } cases[] = {{TERN_DTYPE_BF16, 256},  {TERN_DTYPE_BF16, 300}, {TERN_DTYPE_BF16, 513},
                 {TERN_DTYPE_BF16, 1000}, {TERN_DTYPE_F16, 2100}, {TERN_DTYPE_F16, 4500}};
    const size_t c = 64;
    (void)state;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        pattern_t p;
        const unsigned n = cases[k].n;
        pattern_init(&p, cases[k].dtype, TERN_SUM, 1, n);
        uint8_t **in = calloc(n, sizeof(*in));
        uint8_t *want = malloc(c * p.es), *got = malloc(c * p.es);
        assert_true(in != NULL && want != NULL && got != NULL);
        unsigned nonzero = 0;
        for (unsigned r = 0; r < n; r++) {
            in[r] = malloc(c * p.es);
            assert_non_null(in[r]);
            for (size_t j = 0; j < c; j++) {
                put_val(&p, in[r] + j * p.es, r, j);
                nonzero += pval(&p, r, j) != 0;
            }
        }
        /* Every rank still puts something in: a sum is not all zeros. */
        assert_true(nonzero > c);
        for (size_t j = 0; j < c; j++)
            put_reduced(&p, want + j * p.es, j);
        for (int order = 0; order < 3; order++) {
            if (order == 2) { /* the ranks the other way round */
                for (unsigned r = 0; r < n / 2; r++) {
                    uint8_t *t = in[r];
                    in[r] = in[n - 1 - r];
                    in[n - 1 - r] = t;
                }
            }
            sum_ranks(&p, in, 0, n, c, order == 1, got);
            if (memcmp(got, want, c * p.es) != 0)
                fail_msg("%s sum over %u ranks, %s: not the reference's bits",
                         tern_dtype_name(p.dtype), n,
                         order == 0   ? "left fold"
                         : order == 1 ? "tree"
                                      : "reversed left fold");
        }
        for (unsigned r = 0; r < n; r++)
            free(in[r]);
        free(in);
        free(want);
        free(got);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_world_sums_exact),
        cmocka_unit_test(test_wrong_rank_block),
        cmocka_unit_test(test_swapped_blocks),
        cmocka_unit_test(test_right_output_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
