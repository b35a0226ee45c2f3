/*
 * Reduction kernels: every dtype x op against a scalar reference written here
 * (with its own f16/bf16 conversions, checked against known bit patterns), in
 * place and not, at counts around the vector widths, on both the accelerated
 * and the portable path; the NaN, signed-zero, bool and wraparound rules; AVG
 * as reduce then scale; errors; the pool-parallel form against the serial one.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <tern/pool.h>
#include <tern/tensor.h>

#include "core/error.h"
#include "tensor/reduce.h"
#include "tensor_test_util.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Counts that hit an empty call, a lone element, less than one vector, a few
 * vectors plus a tail, and many vectors plus a tail. */
static const size_t counts[] = {0, 1, 7, 33, 1003};

static const tern_dtype_t all_dtypes[] = {
    TERN_DTYPE_F16, TERN_DTYPE_BF16, TERN_DTYPE_F32, TERN_DTYPE_F64, TERN_DTYPE_I8,
    TERN_DTYPE_I16, TERN_DTYPE_I32,  TERN_DTYPE_I64, TERN_DTYPE_U8,  TERN_DTYPE_BOOL,
};

/* ---- reference conversions, written apart from the library's ---- */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t f32_u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static double bits_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static uint64_t f64_u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

/* By the definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m when e is 0.
 * NaN comes out quiet with its payload, as any IEEE widening gives it. */
static float ref_f16_to_f32(uint16_t h)
{
    unsigned e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float mag;
    if (e == 31 && m != 0)
        return bits_f32(((uint32_t)(h & 0x8000) << 16) | 0x7fc00000u | ((uint32_t)m << 13));
    if (e == 31)
        mag = INFINITY;
    else if (e == 0)
        mag = ldexpf((float)m, -24);
    else
        mag = ldexpf((float)(m + 1024), (int)e - 25);
    return (h & 0x8000) ? -mag : mag;
}

/* Round to nearest even by scaling to an integer significand and letting
 * rintf (nearest-even in the default mode) round it. */
static uint16_t ref_f32_to_f16(float f)
{
    uint32_t u = f32_u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    float a = fabsf(f);
    int ex;
    if (isnan(f))
        return (uint16_t)(sign | 0x7e00 | ((u >> 13) & 0x3ff));
    if (a >= 65520.0f) /* halfway between 65504 and 2^16, and beyond */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x1.0p-14f) /* subnormal: units of 2^-24; 1024 is the first normal */
        return (uint16_t)(sign | (uint16_t)rintf(a * 0x1.0p24f));
    frexpf(a, &ex); /* a = [0.5, 1) * 2^ex */
    {
        int e = ex - 1;
        float m = rintf(ldexpf(a, 10 - e)); /* [1024, 2048] */
        if (m == 2048.0f) {
            m = 1024.0f;
            e++;
        }
        if (e + 15 >= 31)
            return (uint16_t)(sign | 0x7c00);
        return (uint16_t)(sign | ((e + 15) << 10) | ((uint16_t)m - 1024));
    }
}

static float ref_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

/* The nearer of the two bf16 neighbours, compared in double; the even one on
 * a tie. Past the largest bf16 the upper neighbour is 2^128, which is inf. */
static uint16_t ref_f32_to_bf16(float f)
{
    uint32_t u = f32_u(f);
    uint32_t lo = u & 0xffff0000u, sign = u & 0x80000000u;
    double a = fabs((double)f), below, above;
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    if (isinf(f))
        return (uint16_t)(u >> 16);
    below = fabs((double)bits_f32(lo));
    above = (lo & 0x7fffffffu) == 0x7f7f0000u ? ldexp(1.0, 128)
                                              : fabs((double)bits_f32(lo + 0x10000u));
    if (a - below < above - a || (a - below == above - a && (lo & 0x10000u) == 0))
        return (uint16_t)(lo >> 16);
    return (uint16_t)((sign | ((lo & 0x7fffffffu) + 0x10000u)) >> 16);
}

static bool f16_isnan(uint16_t h)
{
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

static bool bf16_isnan(uint16_t h)
{
    return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

static void test_reference_conversions(void **state)
{
    static const struct {
        float f;
        uint16_t h;
    } f16[] = {
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},
        {65519.99f, 0x7bff},
        {65520.0f, 0x7c00}, /* the tie above the largest half goes to inf (even) */
        {1e6f, 0x7c00},
        {0x1.0p-24f, 0x0001}, /* smallest subnormal */
        {0x1.0p-25f, 0x0000}, /* tie between 0 and it: even, 0 */
        {0x1.8p-24f, 0x0002}, /* tie between 1 and 2 units: even, 2 */
        {0x1.0p-14f, 0x0400}, /* smallest normal */
        {0x1.ffcp-15f, 0x0400}, /* 1023.5 units: the tie rounds up into it */
        {0x1.ff8p-15f, 0x03ff}, /* largest subnormal */
        {1.0f + 0x1.0p-11f, 0x3c00}, /* tie: even */
        {1.0f + 0x1.8p-10f, 0x3c02}, /* tie: even, up */
        {0.1f, 0x2e66},
        {-0.0f, 0x8000},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    static const struct {
        uint32_t f;
        uint16_t h;
    } bf16[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 */
        {0x3f808000u, 0x3f80}, /* tie, even below */
        {0x3f818000u, 0x3f82}, /* tie, even above */
        {0x3f808001u, 0x3f81},
        {0x7f7fffffu, 0x7f80}, /* largest f32: inf */
        {0x7f7f7fffu, 0x7f7f},
        {0x00008000u, 0x0000}, /* subnormal tie */
        {0x00018000u, 0x0002},
        {0x80000000u, 0x8000},
        {0x7f800001u, 0x7fc0}, /* signalling NaN: quieted, payload truncated */
        {0xffc12345u, 0xffc1},
    };
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(f16); i++) {
        assert_int_equal(ref_f32_to_f16(f16[i].f), f16[i].h);
        if (fabsf(f16[i].f) <= 65504.0f && ref_f16_to_f32(f16[i].h) == f16[i].f)
            assert_int_equal(f32_u(ref_f16_to_f32(f16[i].h)), f32_u(f16[i].f));
    }
    assert_true(ref_f16_to_f32(0x0001) == 0x1.0p-24f);
    assert_true(ref_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(ref_f16_to_f32(0x3c00) == 1.0f);
    for (size_t i = 0; i < ARRAY_LEN(bf16); i++)
        assert_int_equal(ref_f32_to_bf16(bits_f32(bf16[i].f)), bf16[i].h);
    assert_true(ref_bf16_to_f32(0x3f80) == 1.0f);
    /* Every half survives the round trip; NaNs come back quiet. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint16_t want = f16_isnan((uint16_t)h) ? (uint16_t)(h | 0x200) : (uint16_t)h;
        assert_int_equal(ref_f32_to_f16(ref_f16_to_f32((uint16_t)h)), want);
        want = bf16_isnan((uint16_t)h) ? (uint16_t)(h | 0x40) : (uint16_t)h;
        assert_int_equal(ref_f32_to_bf16(ref_bf16_to_f32((uint16_t)h)), want);
    }
}

/* ---- the reference reduction ---- */

static bool minmax(tern_reduce_op_t op)
{
    return op == TERN_MAX || op == TERN_MIN;
}

/* reduce.h's rule, written as stated there. */
static float ref_max_f32(float x, float y)
{
    return isnan(x) ? x : isnan(y) ? y : x >= y ? x : y;
}
static float ref_min_f32(float x, float y)
{
    return isnan(x) ? x : isnan(y) ? y : x <= y ? x : y;
}
static double ref_max_f64(double x, double y)
{
    return isnan(x) ? x : isnan(y) ? y : x >= y ? x : y;
}
static double ref_min_f64(double x, double y)
{
    return isnan(x) ? x : isnan(y) ? y : x <= y ? x : y;
}

/* SUM and PROD: a NaN operand comes out quieted, a's first. */
static float quiet_f32(float x)
{
    return bits_f32(f32_u(x) | 0x00400000u);
}

static double quiet_f64(double x)
{
    return bits_f64(f64_u(x) | 0x0008000000000000ull);
}

static float ref_f32(tern_reduce_op_t op, float x, float y)
{
    if (!minmax(op) && (isnan(x) || isnan(y)))
        return quiet_f32(isnan(x) ? x : y);
    switch (op) {
    case TERN_PROD:
        return x * y;
    case TERN_MAX:
        return ref_max_f32(x, y);
    case TERN_MIN:
        return ref_min_f32(x, y);
    default: /* SUM, AVG */
        return x + y;
    }
}

static double ref_f64(tern_reduce_op_t op, double x, double y)
{
    if (!minmax(op) && (isnan(x) || isnan(y)))
        return quiet_f64(isnan(x) ? x : y);
    switch (op) {
    case TERN_PROD:
        return x * y;
    case TERN_MAX:
        return ref_max_f64(x, y);
    case TERN_MIN:
        return ref_min_f64(x, y);
    default:
        return x + y;
    }
}

/* Integers in 64 bits, then truncated: the low bits of a sum or product do not
 * depend on the high ones, so this is the wrapped result. */
static uint64_t ref_uint(tern_reduce_op_t op, uint64_t x, uint64_t y)
{
    return op == TERN_PROD ? x * y : x + y;
}

static int64_t ref_sint_minmax(tern_reduce_op_t op, int64_t x, int64_t y)
{
    return op == TERN_MAX ? (x > y ? x : y) : (x < y ? x : y);
}

static uint64_t ref_uint_minmax(tern_reduce_op_t op, uint64_t x, uint64_t y)
{
    return op == TERN_MAX ? (x > y ? x : y) : (x < y ? x : y);
}

static uint8_t ref_bool(tern_reduce_op_t op, uint8_t x, uint8_t y)
{
    bool or = op == TERN_SUM || op == TERN_MAX;
    return or ? (x != 0 || y != 0) : (x != 0 && y != 0);
}

/* Element i of a op b into out (element size of dtype). */
static void ref_elem(tern_reduce_op_t op, tern_dtype_t dt, const void *a, const void *b,
                     size_t i, void *out)
{
    switch (dt) {
    case TERN_DTYPE_F16: {
        uint16_t x = ((const uint16_t *)a)[i], y = ((const uint16_t *)b)[i];
        ((uint16_t *)out)[0] = ref_f32_to_f16(ref_f32(op, ref_f16_to_f32(x), ref_f16_to_f32(y)));
        break;
    }
    case TERN_DTYPE_BF16: {
        uint16_t x = ((const uint16_t *)a)[i], y = ((const uint16_t *)b)[i];
        ((uint16_t *)out)[0] =
            ref_f32_to_bf16(ref_f32(op, ref_bf16_to_f32(x), ref_bf16_to_f32(y)));
        break;
    }
    case TERN_DTYPE_F32:
        ((float *)out)[0] = ref_f32(op, ((const float *)a)[i], ((const float *)b)[i]);
        break;
    case TERN_DTYPE_F64:
        ((double *)out)[0] = ref_f64(op, ((const double *)a)[i], ((const double *)b)[i]);
        break;
    case TERN_DTYPE_I8: {
        int8_t x = ((const int8_t *)a)[i], y = ((const int8_t *)b)[i];
        ((uint8_t *)out)[0] = minmax(op) ? (uint8_t)ref_sint_minmax(op, x, y)
                                         : (uint8_t)ref_uint(op, (uint8_t)x, (uint8_t)y);
        break;
    }
    case TERN_DTYPE_I16: {
        int16_t x = ((const int16_t *)a)[i], y = ((const int16_t *)b)[i];
        ((uint16_t *)out)[0] = minmax(op) ? (uint16_t)ref_sint_minmax(op, x, y)
                                          : (uint16_t)ref_uint(op, (uint16_t)x, (uint16_t)y);
        break;
    }
    case TERN_DTYPE_I32: {
        int32_t x = ((const int32_t *)a)[i], y = ((const int32_t *)b)[i];
        ((uint32_t *)out)[0] = minmax(op) ? (uint32_t)ref_sint_minmax(op, x, y)
                                          : (uint32_t)ref_uint(op, (uint32_t)x, (uint32_t)y);
        break;
    }
    case TERN_DTYPE_I64: {
        int64_t x = ((const int64_t *)a)[i], y = ((const int64_t *)b)[i];
        ((uint64_t *)out)[0] = minmax(op) ? (uint64_t)ref_sint_minmax(op, x, y)
                                          : ref_uint(op, (uint64_t)x, (uint64_t)y);
        break;
    }
    case TERN_DTYPE_U8: {
        uint8_t x = ((const uint8_t *)a)[i], y = ((const uint8_t *)b)[i];
        ((uint8_t *)out)[0] =
            (uint8_t)(minmax(op) ? ref_uint_minmax(op, x, y) : ref_uint(op, x, y));
        break;
    }
    case TERN_DTYPE_BOOL:
        ((uint8_t *)out)[0] = ref_bool(op, ((const uint8_t *)a)[i], ((const uint8_t *)b)[i]);
        break;
    }
}

/* The element's bits, zero-extended. */
static uint64_t elem_bits(tern_dtype_t dt, const void *p)
{
    uint64_t v = 0;
    memcpy(&v, p, tern_dtype_size(dt)); /* little-endian x86-64 / aarch64 */
    return v;
}

/* Bits equal: every op promises which NaN comes out, too. */
static bool elem_matches(tern_dtype_t dt, const void *want, const void *got)
{
    return elem_bits(dt, want) == elem_bits(dt, got);
}

/* ---- test data ---- */

static const uint32_t f32_specials[] = {
    0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
    0x7f800001u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u,
    0x33800000u, 0x38800000u, 0x477fe000u, 0x477ff000u, 0x3f808000u, 0x3f818000u,
};

static const uint64_t f64_specials[] = {
    0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
    0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000123ull,
    0x7ff0000000000001ull, 0x0000000000000001ull, 0x7fefffffffffffffull,
    0x3ff0000000000000ull,
};

/* Random bits, with floats drawn half from ordinary values (so sums and
 * products are mostly finite and exercise rounding) and with the special
 * values sprinkled in. Small types get raw random bits: every class appears. */
static void fill_random(tern_dtype_t dt, void *buf, size_t count, uint32_t *rng)
{
    for (size_t i = 0; i < count; i++) {
        uint32_t r = tt_rand(rng);
        switch (dt) {
        case TERN_DTYPE_F32: {
            float f = (r & 1) ? bits_f32(tt_rand(rng))
                              : ((float)(int32_t)tt_rand(rng) / 65536.0f);
            if ((r & 0xf0) == 0)
                f = bits_f32(f32_specials[(r >> 8) % ARRAY_LEN(f32_specials)]);
            ((float *)buf)[i] = f;
            break;
        }
        case TERN_DTYPE_F64: {
            uint64_t bits = ((uint64_t)tt_rand(rng) << 32) | tt_rand(rng);
            double d = (r & 1) ? bits_f64(bits) : ((double)(int64_t)bits / 4294967296.0);
            if ((r & 0xf0) == 0)
                d = bits_f64(f64_specials[(r >> 8) % ARRAY_LEN(f64_specials)]);
            ((double *)buf)[i] = d;
            break;
        }
        case TERN_DTYPE_I64:
            ((uint64_t *)buf)[i] = ((uint64_t)r << 32) | tt_rand(rng);
            break;
        default:
            memcpy((char *)buf + i * tern_dtype_size(dt), &r, tern_dtype_size(dt));
            break;
        }
    }
}

/* ---- every dtype x op x count x aliasing x path ---- */

enum alias { SEPARATE, DST_IS_A, DST_IS_B };
static const char *const alias_names[] = {"dst separate", "dst == a", "dst == b"};

typedef struct bufs {
    void *a, *b, *dst, *want;
} bufs_t;

static void bufs_alloc(bufs_t *bf, size_t bytes)
{
    /* malloc aligns for any element type; + 1 keeps a 0-byte request non-NULL. */
    bf->a = malloc(bytes + 1);
    bf->b = malloc(bytes + 1);
    bf->dst = malloc(bytes + 1);
    bf->want = malloc(bytes + 1);
    assert_non_null(bf->a);
    assert_non_null(bf->b);
    assert_non_null(bf->dst);
    assert_non_null(bf->want);
}

static void bufs_free(bufs_t *bf)
{
    free(bf->a);
    free(bf->b);
    free(bf->dst);
    free(bf->want);
}

/* check_case reduces through tern__reduce_kernel's function rather than
 * tern__reduce (test_kernel_accessor). */
static bool via_kernel;

static void check_case(tern_reduce_op_t op, tern_dtype_t dt, size_t count, enum alias alias,
                       uint32_t *rng)
{
    size_t size = tern_dtype_size(dt);
    bufs_t bf;
    void *dst;
    unsigned char got[8];
    bufs_alloc(&bf, count * size);
    fill_random(dt, bf.a, count, rng);
    fill_random(dt, bf.b, count, rng);
    for (size_t i = 0; i < count; i++)
        ref_elem(op, dt, bf.a, bf.b, i, (char *)bf.want + i * size);
    dst = alias == DST_IS_A ? bf.a : alias == DST_IS_B ? bf.b : bf.dst;
    if (via_kernel) {
        tern__reduce_fn fn = tern__reduce_kernel(op, dt);
        assert_non_null(fn);
        fn(dst, bf.a, bf.b, count);
    } else {
        assert_int_equal(tern__reduce(op, dt, dst, bf.a, bf.b, count), TERN_OK);
    }
    for (size_t i = 0; i < count; i++) {
        const void *want = (char *)bf.want + i * size;
        memcpy(got, (char *)dst + i * size, size);
        if (!elem_matches(dt, want, got)) {
            uint64_t w = elem_bits(dt, want), g = elem_bits(dt, got);
            bufs_free(&bf);
            fail_msg("%s %s, count %zu, %s, %s kernels: element %zu is 0x%llx, want 0x%llx",
                     tern_dtype_name(dt), tern_reduce_op_name(op), count, alias_names[alias],
                     tern__reduce_isa(), i, (unsigned long long)g, (unsigned long long)w);
        }
    }
    bufs_free(&bf);
}

static void check_all(uint32_t seed)
{
    uint32_t rng = seed;
    for (size_t d = 0; d < ARRAY_LEN(all_dtypes); d++)
        for (int op = 0; op < TERN_REDUCE_OP_COUNT; op++) {
            if (tern__reduce_check((tern_reduce_op_t)op, all_dtypes[d]) != TERN_OK)
                continue;
            for (size_t c = 0; c < ARRAY_LEN(counts); c++)
                for (int alias = SEPARATE; alias <= DST_IS_B; alias++)
                    check_case((tern_reduce_op_t)op, all_dtypes[d], counts[c],
                               (enum alias)alias, &rng);
        }
}

static void test_all_accelerated(void **state)
{
    (void)state;
    tern__reduce_force_portable(false);
    check_all(1);
}

static void test_all_portable(void **state)
{
    (void)state;
    tern__reduce_force_portable(true);
    assert_string_equal(tern__reduce_isa(), "portable");
    check_all(2);
    tern__reduce_force_portable(false);
}

/* The unchecked kernel the collectives' small steps call: the same bits as
 * tern__reduce on both paths, and none for a pair tern__reduce_check
 * refuses (without touching the last error). */
static void test_kernel_accessor(void **state)
{
    (void)state;
    for (size_t d = 0; d < ARRAY_LEN(all_dtypes); d++)
        for (int op = 0; op < TERN_REDUCE_OP_COUNT; op++) {
            bool ok = tern__reduce_check((tern_reduce_op_t)op, all_dtypes[d]) == TERN_OK;
            tern__error(TERN_ERR_TIMEOUT, "marker");
            tern__reduce_fn fn = tern__reduce_kernel((tern_reduce_op_t)op, all_dtypes[d]);
            assert_int_equal(fn != NULL, ok);
            assert_string_equal(tern_last_error(), "marker");
        }
    assert_null(tern__reduce_kernel((tern_reduce_op_t)TERN_REDUCE_OP_COUNT, TERN_DTYPE_F32));
    assert_null(tern__reduce_kernel((tern_reduce_op_t)-1, TERN_DTYPE_F32));
    assert_null(tern__reduce_kernel(TERN_SUM, (tern_dtype_t)TERN_DTYPE_COUNT));
    assert_null(tern__reduce_kernel(TERN_AVG, TERN_DTYPE_I64));
    via_kernel = true;
    tern__reduce_force_portable(false);
    check_all(3);
    tern__reduce_force_portable(true);
    check_all(4);
    tern__reduce_force_portable(false);
    via_kernel = false;
}

/* ---- f16 and bf16: every value against a set of partners, both paths ---- */

static const uint16_t f16_partners[] = {
    0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3c01, 0x7bff,
    0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7d00, 0xfe01, 0x1400, 0x5640, 0x0200, 0x4900,
};

static const uint16_t bf16_partners[] = {
    0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x3f81, 0x7f7f,
    0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1, 0x3400, 0x4b00, 0x0040, 0x4049,
};

/* a = all 65536 patterns, b = one partner: both paths against the
 * reference, bit for bit, NaNs included. */
static void half_sweep(tern_dtype_t dt, tern_reduce_op_t op, uint16_t partner, uint16_t *a,
                       uint16_t *b, uint16_t *fast, uint16_t *slow)
{
    for (uint32_t i = 0; i < 0x10000; i++) {
        a[i] = (uint16_t)i;
        b[i] = partner;
    }
    tern__reduce_force_portable(false);
    assert_int_equal(tern__reduce(op, dt, fast, a, b, 0x10000), TERN_OK);
    tern__reduce_force_portable(true);
    assert_int_equal(tern__reduce(op, dt, slow, a, b, 0x10000), TERN_OK);
    tern__reduce_force_portable(false);
    for (uint32_t i = 0; i < 0x10000; i++) {
        uint16_t want;
        ref_elem(op, dt, a, b, i, &want);
        if (fast[i] != want || slow[i] != want)
            fail_msg("%s %s 0x%04x, 0x%04x: accelerated 0x%04x, portable 0x%04x, want 0x%04x",
                     tern_dtype_name(dt), tern_reduce_op_name(op), a[i], partner, fast[i],
                     slow[i], want);
    }
}

static void test_half_exhaustive(void **state)
{
    uint16_t *a = malloc(4 * 0x10000 * sizeof(uint16_t));
    (void)state;
    assert_non_null(a);
    for (int op = TERN_SUM; op <= TERN_MIN; op++) {
        for (size_t p = 0; p < ARRAY_LEN(f16_partners); p++)
            half_sweep(TERN_DTYPE_F16, (tern_reduce_op_t)op, f16_partners[p], a, a + 0x10000,
                       a + 0x20000, a + 0x30000);
        for (size_t p = 0; p < ARRAY_LEN(bf16_partners); p++)
            half_sweep(TERN_DTYPE_BF16, (tern_reduce_op_t)op, bf16_partners[p], a, a + 0x10000,
                       a + 0x20000, a + 0x30000);
    }
    free(a);
}

/* ---- the rules, value by value ---- */

static void test_integer_wraparound(void **state)
{
    int8_t i8a[] = {127, -128, -1, 100}, i8b[] = {1, -1, -128, 100}, i8d[4];
    uint8_t u8a[] = {255, 16, 0}, u8b[] = {1, 16, 255}, u8d[3];
    int16_t i16a[] = {32767, 300}, i16b[] = {1, 300}, i16d[2];
    uint16_t u16a[] = {65535}, u16b[] = {65535}, u16d[1];
    int32_t i32a[] = {INT32_MAX, INT32_MIN}, i32b[] = {1, -1}, i32d[2];
    int64_t i64a[] = {INT64_MAX, INT64_MIN, INT64_MIN}, i64b[] = {1, -1, 2}, i64d[3];
    (void)state;

    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_I8, i8d, i8a, i8b, 4), TERN_OK);
    assert_int_equal(i8d[0], -128);
    assert_int_equal(i8d[1], 127);
    assert_int_equal(i8d[2], 127);
    assert_int_equal(i8d[3], -56);
    assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_I8, i8d, i8a, i8b, 4), TERN_OK);
    assert_int_equal(i8d[0], 127);
    assert_int_equal(i8d[1], -128); /* -128 * -1 wraps back to -128 */
    assert_int_equal(i8d[3], 16);   /* 10000 mod 256 */
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_U8, u8d, u8a, u8b, 3), TERN_OK);
    assert_int_equal(u8d[0], 0);
    assert_int_equal(u8d[2], 255);
    assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_U8, u8d, u8a, u8b, 3), TERN_OK);
    assert_int_equal(u8d[1], 0); /* 256 */
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_I16, i16d, i16a, i16b, 2), TERN_OK);
    assert_int_equal(i16d[0], -32768);
    assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_I16, i16d, i16a, i16b, 2), TERN_OK);
    assert_int_equal(i16d[1], 90000 - 65536);
    /* 65535 * 65535 overflows int if computed in the promoted type: UBSan
     * would stop here. */
    assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_I16, u16d, u16a, u16b, 1), TERN_OK);
    assert_int_equal(u16d[0], 1);
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_I32, i32d, i32a, i32b, 2), TERN_OK);
    assert_int_equal(i32d[0], INT32_MIN);
    assert_int_equal(i32d[1], INT32_MAX);
    assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_I32, i32d, i32a, i32b, 2), TERN_OK);
    assert_int_equal(i32d[1], INT32_MIN);
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_I64, i64d, i64a, i64b, 3), TERN_OK);
    assert_true(i64d[0] == INT64_MIN);
    assert_true(i64d[1] == INT64_MAX);
    assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_I64, i64d, i64a, i64b, 3), TERN_OK);
    assert_true(i64d[0] == INT64_MAX);
    assert_true(i64d[2] == 0);
    /* MAX/MIN compare signed as signed, unsigned as unsigned. */
    assert_int_equal(tern__reduce(TERN_MAX, TERN_DTYPE_I8, i8d, i8a, i8b, 4), TERN_OK);
    assert_int_equal(i8d[2], -1);
    assert_int_equal(tern__reduce(TERN_MAX, TERN_DTYPE_U8, u8d, u8a, u8b, 3), TERN_OK);
    assert_int_equal(u8d[2], 255);
    assert_int_equal(tern__reduce(TERN_MIN, TERN_DTYPE_I64, i64d, i64a, i64b, 3), TERN_OK);
    assert_true(i64d[0] == 1 && i64d[1] == INT64_MIN);
}

/* Run MAX and MIN on (x, y) pairs given as bits, on both paths. */
static void f32_minmax(const uint32_t *x, const uint32_t *y, uint32_t *max, uint32_t *min,
                       size_t n)
{
    assert_int_equal(tern__reduce(TERN_MAX, TERN_DTYPE_F32, max, x, y, n), TERN_OK);
    assert_int_equal(tern__reduce(TERN_MIN, TERN_DTYPE_F32, min, x, y, n), TERN_OK);
}

static void test_nan_and_zero_rule(void **state)
{
    /* a NaN with payload 1, another with payload 2, +0, -0, 1, inf */
    const uint32_t n1 = 0x7fc00001u, n2 = 0xffc00002u, pz = 0, nz = 0x80000000u, one = 0x3f800000u;
    const uint32_t x[] = {n1, one, n1, pz, nz, one, 0xff800000u, 0x7f800001u};
    const uint32_t y[] = {one, n2, n2, nz, pz, one, n1, one};
    /* a's NaN, b's NaN, a's of two NaNs, a on ties of zeros (both orders),
     * a NaN beats -inf, a signalling NaN passes unchanged: the same for MIN. */
    const uint32_t want[] = {n1, n2, n1, pz, nz, one, n1, 0x7f800001u};
    uint32_t max[8], min[8];
    uint16_t h[3], hx[] = {0x7d00, 0x3c00, 0x8000}, hy[] = {0x3c00, 0xfd01, 0x0000};
    uint16_t bx[] = {0x7f81, 0x3f80, 0x8000}, by[] = {0x3f80, 0xff82, 0x0000};
    (void)state;
    for (int path = 0; path < 2; path++) {
        tern__reduce_force_portable(path == 1);
        f32_minmax(x, y, max, min, ARRAY_LEN(x));
        for (size_t i = 0; i < ARRAY_LEN(x); i++) {
            assert_int_equal(max[i], want[i]);
            assert_int_equal(min[i], want[i]);
        }
        /* f16/bf16: a signalling NaN comes back quiet; the tie keeps a. */
        assert_int_equal(tern__reduce(TERN_MAX, TERN_DTYPE_F16, h, hx, hy, 3), TERN_OK);
        assert_int_equal(h[0], 0x7f00);
        assert_int_equal(h[1], 0xff01);
        assert_int_equal(h[2], 0x8000);
        assert_int_equal(tern__reduce(TERN_MIN, TERN_DTYPE_BF16, h, bx, by, 3), TERN_OK);
        assert_int_equal(h[0], 0x7fc1);
        assert_int_equal(h[1], 0xffc2);
        assert_int_equal(h[2], 0x8000);
        /* SUM and PROD: a's NaN if a is one, else b's, quieted. */
        assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F16, h, hx, hy, 2), TERN_OK);
        assert_int_equal(h[0], 0x7f00);
        assert_int_equal(h[1], 0xff01);
        assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_F32, max, x, y, ARRAY_LEN(x)),
                         TERN_OK);
        assert_int_equal(max[0], n1);
        assert_int_equal(max[1], n2);
        assert_int_equal(max[2], n1);          /* two NaNs: a's */
        assert_int_equal(max[6], n1);          /* -inf * NaN */
        assert_int_equal(max[7], 0x7fc00001u); /* signalling: quieted */
        {
            const float inf[] = {INFINITY, 0.0f}, zero[] = {-INFINITY, INFINITY};
            float r[2];
            assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F32, r, inf, zero, 1), TERN_OK);
            assert_true(isnan(r[0])); /* made by the op: the hardware's default NaN */
            assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_F32, r, inf + 1, zero + 1, 1),
                             TERN_OK);
            assert_true(isnan(r[0]));
        }
    }
    tern__reduce_force_portable(false);
}

static void test_bool(void **state)
{
    const uint8_t a[] = {0, 0, 1, 1, 2, 0x80, 0xff, 0};
    const uint8_t b[] = {0, 1, 0, 1, 0, 0x40, 0xff, 7};
    const uint8_t or[] = {0, 1, 1, 1, 1, 1, 1, 1};
    const uint8_t and[] = {0, 0, 0, 1, 0, 1, 1, 0};
    uint8_t d[8];
    (void)state;
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_BOOL, d, a, b, 8), TERN_OK);
    assert_memory_equal(d, or, 8);
    assert_int_equal(tern__reduce(TERN_MAX, TERN_DTYPE_BOOL, d, a, b, 8), TERN_OK);
    assert_memory_equal(d, or, 8);
    assert_int_equal(tern__reduce(TERN_PROD, TERN_DTYPE_BOOL, d, a, b, 8), TERN_OK);
    assert_memory_equal(d, and, 8);
    assert_int_equal(tern__reduce(TERN_MIN, TERN_DTYPE_BOOL, d, a, b, 8), TERN_OK);
    assert_memory_equal(d, and, 8);
}

/* ---- AVG: reduce as SUM, then divide once ---- */

static void test_avg(void **state)
{
    float f[3][4] = {{1, 2, 3, 0.1f}, {2, 2, 3, 0.2f}, {4, 2, -3, 0.3f}};
    double g[3][2] = {{1, 1e300}, {2, 1e300}, {4, -1e300}};
    uint16_t h[3][3] = {{0x3c00, 0x7bff, 0x0001}, {0x4000, 0x7bff, 0x0001},
                        {0x4400, 0x7bff, 0x0001}}; /* 1 2 4; 65504 x3 (overflows); 2^-24 x3 */
    uint16_t bf[3][2] = {{0x3f80, 0x4049}, {0x4000, 0x4049}, {0x4080, 0x4049}};
    (void)state;
    for (int r = 1; r < 3; r++) {
        assert_int_equal(tern__reduce(TERN_AVG, TERN_DTYPE_F32, f[0], f[0], f[r], 4), TERN_OK);
        assert_int_equal(tern__reduce(TERN_AVG, TERN_DTYPE_F64, g[0], g[0], g[r], 2), TERN_OK);
        assert_int_equal(tern__reduce(TERN_AVG, TERN_DTYPE_F16, h[0], h[0], h[r], 3), TERN_OK);
        assert_int_equal(tern__reduce(TERN_AVG, TERN_DTYPE_BF16, bf[0], bf[0], bf[r], 2),
                         TERN_OK);
    }
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F32, f[0], 4, 3), TERN_OK);
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F64, g[0], 2, 3), TERN_OK);
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F16, h[0], 3, 3), TERN_OK);
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_BF16, bf[0], 2, 3), TERN_OK);
    assert_true(f[0][0] == 7.0f / 3.0f);
    assert_true(f[0][1] == 2.0f);
    assert_true(f[0][2] == 1.0f);
    assert_true(f[0][3] == ((0.1f + 0.2f) + 0.3f) / 3.0f);
    assert_true(g[0][0] == 7.0 / 3.0);
    assert_true(g[0][1] == 1e300 / 3.0); /* (1e300 + 1e300) - 1e300: no overflow in f64 */
    assert_int_equal(h[0][0], ref_f32_to_f16(7.0f / 3.0f));
    assert_int_equal(h[0][0], 0x40ab); /* 2.3333 -> 2.334 */
    assert_int_equal(h[0][1], 0x7c00); /* the sum overflowed f16 before the division */
    assert_int_equal(h[0][2], 0x0001); /* 3 * 2^-24 / 3 */
    assert_int_equal(bf[0][0], ref_f32_to_bf16(7.0f / 3.0f));
    /* pi's bf16 summed three times rounds at each step, then divides */
    {
        float x = ref_bf16_to_f32(0x4049);
        uint16_t s = ref_f32_to_bf16(x + x);
        s = ref_f32_to_bf16(ref_bf16_to_f32(s) + x);
        assert_int_equal(bf[0][1], ref_f32_to_bf16(ref_bf16_to_f32(s) / 3.0f));
    }
}

/* Scale every f16/bf16 pattern by a few divisors, both paths, vs reference. */
static void test_scale_exhaustive(void **state)
{
    static const uint64_t divisors[] = {1, 2, 3, 7, 1000, 16777217, UINT64_MAX};
    static const tern_dtype_t dts[] = {TERN_DTYPE_F16, TERN_DTYPE_BF16};
    uint16_t *buf = malloc(0x10000 * sizeof(uint16_t));
    (void)state;
    assert_non_null(buf);
    for (int path = 0; path < 2; path++) {
        tern__reduce_force_portable(path == 1);
        for (size_t t = 0; t < ARRAY_LEN(dts); t++)
            for (size_t d = 0; d < ARRAY_LEN(divisors); d++) {
                float div = (float)divisors[d];
                for (uint32_t i = 0; i < 0x10000; i++)
                    buf[i] = (uint16_t)i;
                assert_int_equal(tern__reduce_scale(dts[t], buf, 0x10000, divisors[d]), TERN_OK);
                for (uint32_t i = 0; i < 0x10000; i++) {
                    uint16_t want = dts[t] == TERN_DTYPE_F16
                                        ? ref_f32_to_f16(ref_f16_to_f32((uint16_t)i) / div)
                                        : ref_f32_to_bf16(ref_bf16_to_f32((uint16_t)i) / div);
                    if (buf[i] != want)
                        fail_msg("%s 0x%04x / %llu = 0x%04x, want 0x%04x (%s)",
                                 tern_dtype_name(dts[t]), i, (unsigned long long)divisors[d],
                                 buf[i], want, tern__reduce_isa());
                }
            }
    }
    tern__reduce_force_portable(false);
    free(buf);
}

static void test_scale_f32_f64(void **state)
{
    float f[5] = {3, -6, INFINITY, 0x1.0p-149f, 1};
    double g[3] = {3, 1e-320, -0.0}, half_tiny = g[1] / 2.0;
    uint32_t rng = 9;
    float r[1003], want[1003];
    (void)state;
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F32, f, 5, 3), TERN_OK);
    assert_true(f[0] == 1.0f && f[1] == -2.0f && isinf(f[2]) && f[3] == 0.0f);
    assert_true(f[4] == 1.0f / 3.0f);
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F64, g, 3, 2), TERN_OK);
    assert_true(g[0] == 1.5 && g[1] == half_tiny && signbit(g[2])); /* subnormal */
    fill_random(TERN_DTYPE_F32, r, 1003, &rng);
    for (size_t i = 0; i < 1003; i++)
        want[i] = r[i] / 7.0f;
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F32, r, 1003, 7), TERN_OK);
    for (size_t i = 0; i < 1003; i++)
        assert_true(elem_matches(TERN_DTYPE_F32, &want[i], &r[i]));
}

/* ---- errors ---- */

static void test_check_and_errors(void **state)
{
    float f[4] = {0}, g[4] = {0};
    int32_t i[2] = {0};
    char raw[16] __attribute__((aligned(8))) = {0};
    (void)state;
    for (size_t d = 0; d < ARRAY_LEN(all_dtypes); d++)
        for (int op = 0; op < TERN_REDUCE_OP_COUNT; op++) {
            bool floating = all_dtypes[d] <= TERN_DTYPE_F64;
            tern_status_t want = op == TERN_AVG && !floating ? TERN_ERR_INVALID_PARAM : TERN_OK;
            assert_int_equal(tern__reduce_check((tern_reduce_op_t)op, all_dtypes[d]), want);
        }
    assert_int_equal(tern__reduce_check(TERN_AVG, TERN_DTYPE_I32), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "avg is defined for floating types only, not i32");
    assert_int_equal(tern__reduce_check((tern_reduce_op_t)5, TERN_DTYPE_F32),
                     TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "unknown reduce op 5");
    assert_int_equal(tern__reduce_check(TERN_SUM, (tern_dtype_t)10), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce_check((tern_reduce_op_t)-1, TERN_DTYPE_F32),
                     TERN_ERR_INVALID_PARAM);

    /* The op/dtype check comes first, even with nothing to do. */
    assert_int_equal(tern__reduce(TERN_AVG, TERN_DTYPE_BOOL, NULL, NULL, NULL, 0),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F32, NULL, NULL, NULL, 0), TERN_OK);
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F32, NULL, f, g, 4), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "reduce: NULL dst with 4 elements");
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F32, f, NULL, g, 4), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F32, f, f, NULL, 4), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F64, raw + 4, raw + 8, raw + 8, 1),
                     TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "reduce: f64 buffer dst not aligned to 8 bytes");
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_I64, f, f, f, SIZE_MAX / 4),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce(TERN_AVG, TERN_DTYPE_I32, i, i, i, 2), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce_par(NULL, TERN_AVG, TERN_DTYPE_U8, i, i, i, 2),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce_par(NULL, TERN_SUM, TERN_DTYPE_U8, NULL, i, i, 2),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce_par(NULL, TERN_SUM, TERN_DTYPE_U8, NULL, NULL, NULL, 0),
                     TERN_OK);
    assert_int_equal(tern__reduce_par(NULL, TERN_SUM, TERN_DTYPE_F32, f, f, g, 4), TERN_OK);

    assert_int_equal(tern__reduce_scale(TERN_DTYPE_I32, i, 2, 2), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(),
                        "reduce scale: defined for floating types only, not i32");
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_BOOL, i, 2, 2), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce_scale((tern_dtype_t)-1, i, 2, 2), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F32, f, 4, 0), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "reduce scale: divisor 0");
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F32, NULL, 4, 2), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F32, NULL, 0, 2), TERN_OK);
    assert_int_equal(tern__reduce_scale(TERN_DTYPE_F32, raw + 2, 1, 2), TERN_ERR_INVALID_PARAM);
}

static void test_op_names(void **state)
{
    static const struct {
        tern_reduce_op_t op;
        const char *name;
    } want[] = {
        {TERN_SUM, "sum"}, {TERN_PROD, "prod"}, {TERN_MAX, "max"},
        {TERN_MIN, "min"}, {TERN_AVG, "avg"},
    };
    static const struct {
        const char *name;
        tern_reduce_op_t op;
    } also[] = {{"SUM", TERN_SUM},       {"Prod", TERN_PROD},    {"product", TERN_PROD},
                {"PRODUCT", TERN_PROD},  {"Max", TERN_MAX},      {"mIn", TERN_MIN},
                {"AVG", TERN_AVG}};
    static const char *bad[] = {"", "mean", "sum ", " sum", "prod_", "band", "premul_sum"};
    tern_reduce_op_t op;
    (void)state;
    assert_int_equal(ARRAY_LEN(want), TERN_REDUCE_OP_COUNT);
    for (size_t i = 0; i < ARRAY_LEN(want); i++) {
        assert_int_equal((int)want[i].op, (int)i); /* wire codes are fixed */
        assert_string_equal(tern_reduce_op_name(want[i].op), want[i].name);
        op = (tern_reduce_op_t)-1;
        assert_int_equal(tern_reduce_op_parse(tern_reduce_op_name(want[i].op), &op), TERN_OK);
        assert_int_equal(op, want[i].op);
    }
    for (size_t i = 0; i < ARRAY_LEN(also); i++) {
        assert_int_equal(tern_reduce_op_parse(also[i].name, &op), TERN_OK);
        assert_int_equal(op, also[i].op);
    }
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        op = TERN_MIN;
        assert_int_equal(tern_reduce_op_parse(bad[i], &op), TERN_ERR_INVALID_PARAM);
        assert_int_equal(op, TERN_MIN);
    }
    assert_string_equal(tern_last_error(), "unknown reduce op name 'premul_sum'");
    assert_int_equal(tern_reduce_op_parse(NULL, &op), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_reduce_op_parse("sum", NULL), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_reduce_op_name((tern_reduce_op_t)TERN_REDUCE_OP_COUNT), "unknown");
    assert_string_equal(tern_reduce_op_name((tern_reduce_op_t)-1), "unknown");
}

/* ---- over a pool ---- */

static tern_pool_t *make_pool(unsigned threads, size_t queue_limit)
{
    tern_pool_params_t params = {
        .field_mask = TERN_POOL_PARAM_THREADS | TERN_POOL_PARAM_BIND |
                      (queue_limit ? TERN_POOL_PARAM_QUEUE_LIMIT : 0),
        .threads = threads,
        .bind = 0,
        .queue_limit = queue_limit,
    };
    tern_pool_t *pool = NULL;
    tern_status_t st = tern_pool_create(&params, &pool);
    if (st != TERN_OK)
        fail_msg("tern_pool_create: %s: %s", tern_strerror(st), tern_last_error());
    return pool;
}

/* One large case: par and serial from the same inputs, bit for bit. offset
 * (in elements) moves the start off a 64-byte boundary, so that the chunk
 * boundaries must be moved to dst's cache lines. */
static void par_case(tern_pool_t *pool, tern_reduce_op_t op, tern_dtype_t dt, size_t count,
                     size_t offset, enum alias alias, uint32_t *rng)
{
    size_t size = tern_dtype_size(dt), bytes = (count + offset) * size;
    bufs_t bf;
    char *a, *b, *serial, *par, *pa, *pb;
    bufs_alloc(&bf, bytes);
    a = (char *)bf.a + offset * size;
    b = (char *)bf.b + offset * size;
    serial = (char *)bf.want + offset * size;
    par = (char *)bf.dst + offset * size;
    fill_random(dt, a, count, rng);
    fill_random(dt, b, count, rng);
    assert_int_equal(tern__reduce(op, dt, serial, a, b, count), TERN_OK);
    /* In place: par's inputs are copies, so a and b stay for the next use. */
    pa = alias == DST_IS_A ? par : a;
    pb = alias == DST_IS_B ? par : b;
    if (alias != SEPARATE)
        memcpy(par, alias == DST_IS_A ? a : b, count * size);
    assert_int_equal(tern__reduce_par(pool, op, dt, par, pa, pb, count), TERN_OK);
    if (memcmp(serial, par, count * size) != 0) {
        size_t i = 0;
        while (memcmp(serial + i * size, par + i * size, size) == 0)
            i++;
        print_error("first difference at element %zu: 0x%llx vs 0x%llx\n", i,
                    (unsigned long long)elem_bits(dt, serial + i * size),
                    (unsigned long long)elem_bits(dt, par + i * size));
        bufs_free(&bf);
        fail_msg("par differs from serial: %s %s, %zu elements at offset %zu, %s",
                 tern_dtype_name(dt), tern_reduce_op_name(op), count, offset, alias_names[alias]);
    }
    bufs_free(&bf);
}

static void test_par_matches_serial(void **state)
{
    tern_pool_t *pool2 = make_pool(2, 0), *pool3 = make_pool(3, 0);
    uint32_t rng = 77;
    size_t big = TERN__REDUCE_PAR_MIN_BYTES + 4099; /* bytes, odd on purpose */
    (void)state;
    par_case(pool2, TERN_SUM, TERN_DTYPE_F32, big / 4, 0, SEPARATE, &rng);
    par_case(pool2, TERN_SUM, TERN_DTYPE_F32, big / 4, 1, DST_IS_A, &rng);
    par_case(pool2, TERN_MAX, TERN_DTYPE_F16, big / 2, 3, DST_IS_B, &rng);
    par_case(pool2, TERN_PROD, TERN_DTYPE_I8, big, 5, SEPARATE, &rng);
    par_case(pool2, TERN_MIN, TERN_DTYPE_F64, big / 8, 1, DST_IS_A, &rng);
    par_case(pool3, TERN_SUM, TERN_DTYPE_BF16, 2 * big / 2 + 1, 7, DST_IS_A, &rng);
    par_case(pool3, TERN_MAX, TERN_DTYPE_BOOL, big, 1, SEPARATE, &rng);
    /* Below the threshold, with no pool: the serial path under the same name. */
    par_case(pool2, TERN_SUM, TERN_DTYPE_I32, 1003, 1, SEPARATE, &rng);
    par_case(NULL, TERN_SUM, TERN_DTYPE_I64, big / 8, 0, DST_IS_B, &rng);
    assert_int_equal(tern_pool_destroy(pool2), TERN_OK);
    assert_int_equal(tern_pool_destroy(pool3), TERN_OK);
}

/* Called from a task on the pool, tern__reduce_par must not wait on its own
 * pool's workers: it runs the whole range there. */
typedef struct in_worker {
    tern_pool_t *pool;
    float *a, *b, *dst;
    size_t count;
    atomic_int status, ran;
} in_worker_t;

static void in_worker_task(void *arg)
{
    in_worker_t *w = arg;
    atomic_store(&w->status, tern__reduce_par(w->pool, TERN_SUM, TERN_DTYPE_F32, w->dst, w->a,
                                              w->b, w->count));
    atomic_store(&w->ran, 1);
}

static void test_par_from_worker(void **state)
{
    in_worker_t w = {.count = TERN__REDUCE_PAR_MIN_BYTES / 4 * 2};
    uint32_t rng = 5;
    float *want;
    (void)state;
    w.pool = make_pool(2, 0);
    w.a = malloc(w.count * 4);
    w.b = malloc(w.count * 4);
    w.dst = malloc(w.count * 4);
    want = malloc(w.count * 4);
    assert_true(w.a && w.b && w.dst && want);
    fill_random(TERN_DTYPE_F32, w.a, w.count, &rng);
    fill_random(TERN_DTYPE_F32, w.b, w.count, &rng);
    assert_int_equal(tern__reduce(TERN_SUM, TERN_DTYPE_F32, want, w.a, w.b, w.count), TERN_OK);
    atomic_store(&w.status, -1000);
    assert_int_equal(tern_pool_submit(w.pool, in_worker_task, &w), TERN_OK);
    assert_int_equal(tern_pool_destroy(w.pool), TERN_OK); /* drains */
    assert_int_equal(atomic_load(&w.ran), 1);
    assert_int_equal(atomic_load(&w.status), TERN_OK);
    assert_memory_equal(want, w.dst, w.count * 4);
    free(w.a);
    free(w.b);
    free(w.dst);
    free(want);
}

/* Every worker busy and the queue full: the submits fail, and the caller
 * reduces every chunk itself, with nothing lost and no wait. */
typedef struct gate {
    atomic_int started, release, filler_ran;
} gate_t;

static void gate_task(void *arg)
{
    gate_t *g = arg;
    struct timespec ts = {0, 1000000};
    atomic_fetch_add(&g->started, 1);
    while (!atomic_load(&g->release))
        nanosleep(&ts, NULL);
}

static void filler_task(void *arg)
{
    gate_t *g = arg;
    atomic_fetch_add(&g->filler_ran, 1);
}

static void test_par_submit_fails(void **state)
{
    tern_pool_t *pool = make_pool(3, 1);
    gate_t g = {0};
    struct timespec ts = {0, 1000000};
    uint32_t rng = 11;
    (void)state;
    /* One at a time: with a queue of one, each must be running before the
     * next is queued. */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tern_pool_submit(pool, gate_task, &g), TERN_OK);
        while (atomic_load(&g.started) <= i)
            nanosleep(&ts, NULL);
    }
    assert_int_equal(tern_pool_submit(pool, filler_task, &g), TERN_OK);
    assert_int_equal(tern_pool_submit(pool, filler_task, &g), TERN_ERR_NO_RESOURCE);
    par_case(pool, TERN_SUM, TERN_DTYPE_F32, TERN__REDUCE_PAR_MIN_BYTES / 4 + 33, 1, SEPARATE,
             &rng);
    par_case(pool, TERN_MAX, TERN_DTYPE_I16, TERN__REDUCE_PAR_MIN_BYTES / 2 + 7, 0, DST_IS_A,
             &rng);
    atomic_store(&g.release, 1);
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);
    assert_int_equal(atomic_load(&g.filler_ran), 1);
}

/* Every worker busy, the queue unbounded: the tasks wait in the queue, the
 * caller claims every chunk and returns without waiting for them; they run
 * after, find nothing to do, and the last one frees the job (ASan checks). */
static void test_par_late_tasks(void **state)
{
    tern_pool_t *pool = make_pool(2, 0);
    gate_t g = {0};
    struct timespec ts = {0, 1000000};
    uint32_t rng = 13;
    (void)state;
    for (int i = 0; i < 2; i++)
        assert_int_equal(tern_pool_submit(pool, gate_task, &g), TERN_OK);
    while (atomic_load(&g.started) < 2)
        nanosleep(&ts, NULL);
    for (int i = 0; i < 3; i++)
        par_case(pool, TERN_SUM, TERN_DTYPE_F32, TERN__REDUCE_PAR_MIN_BYTES / 4 + 33, 0,
                 DST_IS_A, &rng);
    atomic_store(&g.release, 1);
    /* Many calls back to back, the tasks of one still running as the next
     * begins. */
    for (int i = 0; i < 20; i++)
        par_case(pool, TERN_MAX, TERN_DTYPE_BF16, TERN__REDUCE_PAR_MIN_BYTES / 2 + 5, 1,
                 SEPARATE, &rng);
    assert_int_equal(tern_pool_destroy(pool), TERN_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_conversions),
        cmocka_unit_test(test_op_names),
        cmocka_unit_test(test_check_and_errors),
        cmocka_unit_test(test_all_accelerated),
        cmocka_unit_test(test_all_portable),
        cmocka_unit_test(test_kernel_accessor),
        cmocka_unit_test(test_half_exhaustive),
        cmocka_unit_test(test_integer_wraparound),
        cmocka_unit_test(test_nan_and_zero_rule),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_avg),
        cmocka_unit_test(test_scale_exhaustive),
        cmocka_unit_test(test_scale_f32_f64),
        cmocka_unit_test(test_par_matches_serial),
        cmocka_unit_test(test_par_from_worker),
        cmocka_unit_test(test_par_submit_fails),
        cmocka_unit_test(test_par_late_tasks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
