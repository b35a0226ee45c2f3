/*
 * Reduction kernels. One plain loop per dtype x op, written so that GCC
 * vectorizes it (this file is built with -O3: at -O2 GCC 12 vectorizes only
 * loops that need no alias check and no scalar tail, which rules out ours, as
 * dst may be a or b). The loop body is an inline element function; the table
 * picks the loop once per call, never per element.
 *
 * On x86-64 each loop also exists built for AVX2, and f16 there goes through
 * F16C (vcvtph2ps/vcvtps2ph), both picked at run time; elsewhere f16 goes
 * through branch-free bit manipulation. The two give the same bits for every
 * input (the conversions were compared exhaustively when this was written;
 * the tests compare the two paths on every pair class), so ranks on different
 * x86 machines agree.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "tensor/half.h"
#include "tensor/reduce.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define TERN__REDUCE_X86 1
#else
#define TERN__REDUCE_X86 0
#endif

/* ---- names ---- */

static const char *const op_names[TERN_REDUCE_OP_COUNT] = {
    [TERN_SUM] = "sum", [TERN_PROD] = "prod", [TERN_MAX] = "max",
    [TERN_MIN] = "min", [TERN_AVG] = "avg",
};

/* Compared as unsigned: the enum's type may be signed or not. */
static bool op_known(tern_reduce_op_t op)
{
    return (unsigned)op < TERN_REDUCE_OP_COUNT;
}

static bool dtype_floating(tern_dtype_t dtype)
{
    return dtype == TERN_DTYPE_F16 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F32 ||
           dtype == TERN_DTYPE_F64;
}

const char *tern_reduce_op_name(tern_reduce_op_t op)
{
    return op_known(op) ? op_names[op] : "unknown";
}

tern_status_t tern_reduce_op_parse(const char *name, tern_reduce_op_t *out)
{
    if (name == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce op parse: NULL %s",
                           name == NULL ? "name" : "output");
    for (int op = 0; op < TERN_REDUCE_OP_COUNT; op++) {
        if (strcasecmp(name, op_names[op]) == 0) {
            *out = (tern_reduce_op_t)op;
            return TERN_OK;
        }
    }
    if (strcasecmp(name, "product") == 0) {
        *out = TERN_PROD;
        return TERN_OK;
    }
    return tern__error(TERN_ERR_INVALID_PARAM, "unknown reduce op name '%.64s'", name);
}

tern_status_t tern__reduce_check(tern_reduce_op_t op, tern_dtype_t dtype)
{
    if (!op_known(op))
        return tern__error(TERN_ERR_INVALID_PARAM, "unknown reduce op %d", (int)op);
    if (tern_dtype_size(dtype) == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce: unknown dtype %d", (int)dtype);
    if (op == TERN_AVG && !dtype_floating(dtype))
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "avg is defined for floating types only, not %s",
                           tern_dtype_name(dtype));
    return TERN_OK;
}

/* ---- element functions ---- */

/* Integer SUM and PROD run on the unsigned type of the same width: two's
 * complement wraps the same way and unsigned overflow is defined. Operands
 * narrower than int are widened to unsigned before a product, as a product of
 * two promoted uint16_t can overflow int. */
static inline uint8_t add_u8(uint8_t x, uint8_t y)
{
    return (uint8_t)(x + y);
}
static inline uint8_t mul_u8(uint8_t x, uint8_t y)
{
    return (uint8_t)((unsigned)x * y);
}
static inline uint16_t add_u16(uint16_t x, uint16_t y)
{
    return (uint16_t)(x + y);
}
static inline uint16_t mul_u16(uint16_t x, uint16_t y)
{
    return (uint16_t)((unsigned)x * y);
}
static inline uint32_t add_u32(uint32_t x, uint32_t y)
{
    return x + y;
}
static inline uint32_t mul_u32(uint32_t x, uint32_t y)
{
    return x * y;
}
static inline uint64_t add_u64(uint64_t x, uint64_t y)
{
    return x + y;
}
static inline uint64_t mul_u64(uint64_t x, uint64_t y)
{
    return x * y;
}

/* Integers have no NaN and equal values are identical, so the plain
 * comparison already meets the order rule. */
#define TERN__MINMAX(T, sfx)                                                                       \
    static inline T max_##sfx(T x, T y)                                                            \
    {                                                                                              \
        return x >= y ? x : y;                                                                     \
    }                                                                                              \
    static inline T min_##sfx(T x, T y)                                                            \
    {                                                                                              \
        return x <= y ? x : y;                                                                     \
    }
TERN__MINMAX(int8_t, i8)
TERN__MINMAX(uint8_t, u8)
TERN__MINMAX(int16_t, i16)
TERN__MINMAX(int32_t, i32)
TERN__MINMAX(int64_t, i64)

/* bool: inputs are bytes where nonzero means true (a peer's or an
 * application's bool may hold any value); outputs are exactly 0 or 1. */
static inline uint8_t or_bool(uint8_t x, uint8_t y)
{
    return (uint8_t)((x | y) != 0);
}
static inline uint8_t and_bool(uint8_t x, uint8_t y)
{
    return (uint8_t)((x != 0) & (y != 0));
}

/*
 * SUM and PROD of a NaN give x's NaN if x is one, else y's, quieted. The
 * hardware already returns the one NaN operand when there is one; with two,
 * it returns the one in the instruction's first source, and GCC may order
 * the operands differently in the vector loop and its scalar tail, so the
 * same inputs would give different bits depending on where a buffer (or a
 * pool chunk) starts. Putting x in y's place when x is NaN leaves one NaN
 * operand, in either order: one compare and one blend. A NaN the op itself
 * makes (inf - inf, 0 * inf) is the hardware's default NaN.
 */
static inline float nan_x_or_y_f32(float x, float y)
{
    return isnan(x) ? x : y;
}
static inline float add_f32(float x, float y)
{
    return x + nan_x_or_y_f32(x, y);
}
static inline float mul_f32(float x, float y)
{
    return x * nan_x_or_y_f32(x, y);
}
/* reduce.h's rule, isnan(x) ? x : isnan(y) ? y : x >= y ? x : y, in one
 * test: x >= y is false when y is NaN, so x is kept exactly when it is NaN or
 * not below y. Two compares and a blend per vector instead of three and three
 * (the ALU ports are what limits the f16 loops). `|`, not `||`: no branch. */
static inline float max_f32(float x, float y)
{
    return (isnan(x) | (x >= y)) ? x : y;
}
static inline float min_f32(float x, float y)
{
    return (isnan(x) | (x <= y)) ? x : y;
}
static inline double nan_x_or_y_f64(double x, double y)
{
    return isnan(x) ? x : y;
}
static inline double add_f64(double x, double y)
{
    return x + nan_x_or_y_f64(x, y);
}
static inline double mul_f64(double x, double y)
{
    return x * nan_x_or_y_f64(x, y);
}
static inline double max_f64(double x, double y)
{
    return (isnan(x) | (x >= y)) ? x : y;
}
static inline double min_f64(double x, double y)
{
    return (isnan(x) | (x <= y)) ? x : y;
}

/* f16 and bf16 <-> f32: tensor/half.h */

/* ---- the loops ---- */

typedef tern__reduce_fn kernel_fn;
typedef void (*scale_fn)(void *buf, size_t n, uint64_t divisor);

/*
 * On x86-64 every loop is compiled twice: for the baseline (SSE2, which every
 * x86-64 has) and for AVX2, picked at run time. AVX2 doubles the width and
 * adds what SSE2 lacks (64-bit compares and products, blends, unsigned
 * packs), which matters for buffers that sit in the cache, as the chunks of a
 * pipelined collective do. Same source, same element functions: the two give
 * the same bits.
 */
#if TERN__REDUCE_X86
#define TERN__AVX2 __attribute__((target("avx2,f16c")))
#define TERN__TWICE(def, name, ...) def(name, , __VA_ARGS__) def(name##_avx2, TERN__AVX2, __VA_ARGS__)
#else
#define TERN__TWICE(def, name, ...) def(name, , __VA_ARGS__)
#endif

/* No restrict: dst may be a or b. GCC's runtime alias check lets the vector
 * loop run when they are equal (same index read before written). */
#define TERN__LOOP_DEF(name, attr, T, fn)                                                          \
    attr static void name(void *dst_, const void *a_, const void *b_, size_t n)                    \
    {                                                                                              \
        T *dst = dst_;                                                                             \
        const T *a = a_, *b = b_;                                                                  \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = fn(a[i], b[i]);                                                               \
    }

/* A 16-bit float op: widen both operands, op in f32, round back. */
#define TERN__HALF_LOOP_DEF(name, attr, to32, from32, fn)                                          \
    attr static void name(void *dst_, const void *a_, const void *b_, size_t n)                    \
    {                                                                                              \
        uint16_t *dst = dst_;                                                                      \
        const uint16_t *a = a_, *b = b_;                                                           \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = from32(fn(to32(a[i]), to32(b[i])));                                           \
    }

/* AVG's division: a real one, not a multiply by the reciprocal, which would
 * differ in the last bit from torch's x / n. CT is the computing type. */
#define TERN__SCALE_DEF(name, attr, T, CT, to, from)                                               \
    attr static void name(void *buf_, size_t n, uint64_t divisor)                                  \
    {                                                                                              \
        T *buf = buf_;                                                                             \
        CT d = (CT)divisor;                                                                        \
        for (size_t i = 0; i < n; i++)                                                             \
            buf[i] = from(to(buf[i]) / d);                                                         \
    }

#define TERN__LOOP(name, T, fn) TERN__TWICE(TERN__LOOP_DEF, name, T, fn)
#define TERN__HALF_LOOP(name, to32, from32, fn)                                                    \
    TERN__TWICE(TERN__HALF_LOOP_DEF, name, to32, from32, fn)
#define TERN__SCALE(name, T, CT, to, from) TERN__TWICE(TERN__SCALE_DEF, name, T, CT, to, from)

static inline float same_f32(float x)
{
    return x;
}
static inline double same_f64(double x)
{
    return x;
}

TERN__LOOP(sum_u8, uint8_t, add_u8)
TERN__LOOP(prod_u8, uint8_t, mul_u8)
TERN__LOOP(sum_u16, uint16_t, add_u16)
TERN__LOOP(prod_u16, uint16_t, mul_u16)
TERN__LOOP(sum_u32, uint32_t, add_u32)
TERN__LOOP(prod_u32, uint32_t, mul_u32)
TERN__LOOP(sum_u64, uint64_t, add_u64)
TERN__LOOP(prod_u64, uint64_t, mul_u64)

TERN__LOOP(max_i8_loop, int8_t, max_i8)
TERN__LOOP(min_i8_loop, int8_t, min_i8)
TERN__LOOP(max_u8_loop, uint8_t, max_u8)
TERN__LOOP(min_u8_loop, uint8_t, min_u8)
TERN__LOOP(max_i16_loop, int16_t, max_i16)
TERN__LOOP(min_i16_loop, int16_t, min_i16)
TERN__LOOP(max_i32_loop, int32_t, max_i32)
TERN__LOOP(min_i32_loop, int32_t, min_i32)
TERN__LOOP(max_i64_loop, int64_t, max_i64)
TERN__LOOP(min_i64_loop, int64_t, min_i64)

TERN__LOOP(or_bool_loop, uint8_t, or_bool)
TERN__LOOP(and_bool_loop, uint8_t, and_bool)

TERN__LOOP(sum_f32, float, add_f32)
TERN__LOOP(prod_f32, float, mul_f32)
TERN__LOOP(max_f32_loop, float, max_f32)
TERN__LOOP(min_f32_loop, float, min_f32)
TERN__LOOP(sum_f64, double, add_f64)
TERN__LOOP(prod_f64, double, mul_f64)
TERN__LOOP(max_f64_loop, double, max_f64)
TERN__LOOP(min_f64_loop, double, min_f64)

TERN__HALF_LOOP(sum_f16, f16_to_f32, f32_to_f16, add_f32)
TERN__HALF_LOOP(prod_f16, f16_to_f32, f32_to_f16, mul_f32)
TERN__HALF_LOOP(max_f16, f16_to_f32, f32_to_f16, max_f32)
TERN__HALF_LOOP(min_f16, f16_to_f32, f32_to_f16, min_f32)
TERN__HALF_LOOP(sum_bf16, bf16_to_f32, f32_to_bf16, add_f32)
TERN__HALF_LOOP(prod_bf16, bf16_to_f32, f32_to_bf16, mul_f32)
TERN__HALF_LOOP(max_bf16, bf16_to_f32, f32_to_bf16, max_f32)
TERN__HALF_LOOP(min_bf16, bf16_to_f32, f32_to_bf16, min_f32)

TERN__SCALE(scale_f32, float, float, same_f32, same_f32)
TERN__SCALE(scale_f64, double, double, same_f64, same_f64)
TERN__SCALE(scale_f16, uint16_t, float, f16_to_f32, f32_to_f16)
TERN__SCALE(scale_bf16, uint16_t, float, bf16_to_f32, f32_to_bf16)

/* AVG reduces as SUM. Integer AVG never reaches the tables (rejected first). */
static const kernel_fn portable_kernels[TERN_DTYPE_COUNT][TERN_REDUCE_OP_COUNT] = {
    [TERN_DTYPE_F16] = {sum_f16, prod_f16, max_f16, min_f16, sum_f16},
    [TERN_DTYPE_BF16] = {sum_bf16, prod_bf16, max_bf16, min_bf16, sum_bf16},
    [TERN_DTYPE_F32] = {sum_f32, prod_f32, max_f32_loop, min_f32_loop, sum_f32},
    [TERN_DTYPE_F64] = {sum_f64, prod_f64, max_f64_loop, min_f64_loop, sum_f64},
    [TERN_DTYPE_I8] = {sum_u8, prod_u8, max_i8_loop, min_i8_loop, NULL},
    [TERN_DTYPE_I16] = {sum_u16, prod_u16, max_i16_loop, min_i16_loop, NULL},
    [TERN_DTYPE_I32] = {sum_u32, prod_u32, max_i32_loop, min_i32_loop, NULL},
    [TERN_DTYPE_I64] = {sum_u64, prod_u64, max_i64_loop, min_i64_loop, NULL},
    [TERN_DTYPE_U8] = {sum_u8, prod_u8, max_u8_loop, min_u8_loop, NULL},
    [TERN_DTYPE_BOOL] = {or_bool_loop, and_bool_loop, or_bool_loop, and_bool_loop, NULL},
};

static const scale_fn portable_scales[TERN_DTYPE_COUNT] = {
    [TERN_DTYPE_F16] = scale_f16,
    [TERN_DTYPE_BF16] = scale_bf16,
    [TERN_DTYPE_F32] = scale_f32,
    [TERN_DTYPE_F64] = scale_f64,
};

/* ---- f16 with F16C and AVX2 ---- */

#if TERN__REDUCE_X86
/* vcvtps2ph's immediate: nearest even, whatever MXCSR says, no exception
 * flags (the portable path does not raise them either). */
#define TERN__F16C_ROUND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

TERN__AVX2 static inline __m256 f16c_load(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

TERN__AVX2 static inline void f16c_store(uint16_t *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, TERN__F16C_ROUND));
}

/* add_f32 and mul_f32 on eight lanes. */
TERN__AVX2 static inline __m256 v8_nan_x_or_y(__m256 x, __m256 y)
{
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

TERN__AVX2 static inline __m256 v8_add(__m256 x, __m256 y)
{
    return _mm256_add_ps(x, v8_nan_x_or_y(x, y));
}

TERN__AVX2 static inline __m256 v8_mul(__m256 x, __m256 y)
{
    return _mm256_mul_ps(x, v8_nan_x_or_y(x, y));
}

/* max_f32 and min_f32 on eight lanes: x where x is NaN or the ordered
 * compare (false on NaN) holds, else y. */
TERN__AVX2 static inline __m256 v8_max(__m256 x, __m256 y)
{
    __m256 keep = _mm256_or_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), _mm256_cmp_ps(x, y, _CMP_GE_OQ));
    return _mm256_blendv_ps(y, x, keep);
}

TERN__AVX2 static inline __m256 v8_min(__m256 x, __m256 y)
{
    __m256 keep = _mm256_or_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), _mm256_cmp_ps(x, y, _CMP_LE_OQ));
    return _mm256_blendv_ps(y, x, keep);
}

/* Eight elements at a time; the tail goes to the bit-manipulation loop, which
 * gives the same bits. Unaligned loads and stores: any 2-byte-aligned buffer. */
#define TERN__F16C_LOOP(name, vop, tail)                                                           \
    TERN__AVX2 static void name(void *dst_, const void *a_, const void *b_, size_t n)              \
    {                                                                                              \
        uint16_t *dst = dst_;                                                                      \
        const uint16_t *a = a_, *b = b_;                                                           \
        size_t i = 0;                                                                              \
        for (; i + 8 <= n; i += 8)                                                                 \
            f16c_store(dst + i, vop(f16c_load(a + i), f16c_load(b + i)));                          \
        tail(dst + i, a + i, b + i, n - i);                                                        \
    }

TERN__F16C_LOOP(sum_f16c, v8_add, sum_f16_avx2)
TERN__F16C_LOOP(prod_f16c, v8_mul, prod_f16_avx2)
TERN__F16C_LOOP(max_f16c, v8_max, max_f16_avx2)
TERN__F16C_LOOP(min_f16c, v8_min, min_f16_avx2)

TERN__AVX2 static void scale_f16c(void *buf_, size_t n, uint64_t divisor)
{
    uint16_t *buf = buf_;
    __m256 d = _mm256_set1_ps((float)divisor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        f16c_store(buf + i, _mm256_div_ps(f16c_load(buf + i), d));
    scale_f16_avx2(buf + i, n - i, divisor);
}

/* ---- bf16 with AVX2 ---- */

/*
 * GCC's own vectorization of the bf16 loops spends its time widening and
 * narrowing in order; these keep sixteen elements in one register and let the
 * order go: unpacking against zero puts elements 0-3 and 8-11 in the top
 * halves of one vector's 32-bit lanes (exactly their f32 bits) and 4-7, 12-15
 * in the other's, and packus within the 128-bit lanes puts them back where
 * they came from. One instruction each way, no permute.
 */
TERN__AVX2 static inline __m256i bf16x16_load(const uint16_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

TERN__AVX2 static inline __m256 bf16x16_lo(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
}

TERN__AVX2 static inline __m256 bf16x16_hi(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
}

/* f32_to_bf16 on eight lanes, the result in the low half of each 32-bit lane:
 * NaN lanes get no rounding increment (it could carry into the sign) and the
 * quiet bit instead. */
TERN__AVX2 static inline __m256i bf16x8_round(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i inc = _mm256_andnot_si256(nan, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, inc), 16);
    return _mm256_or_si256(r, _mm256_and_si256(nan, _mm256_set1_epi32(0x0040)));
}

/* Inverse of bf16x16_lo/hi. No lane exceeds 0xffff: packus never saturates. */
TERN__AVX2 static inline void bf16x16_store(uint16_t *p, __m256 lo, __m256 hi)
{
    __m256i packed = _mm256_packus_epi32(bf16x8_round(lo), bf16x8_round(hi));
    _mm256_storeu_si256((__m256i *)(void *)p, packed);
}

/* Sixteen elements per step; the tail goes to the generic loop, same bits. */
#define TERN__BF16_LOOP(name, vop, tail)                                                           \
    TERN__AVX2 static void name(void *dst_, const void *a_, const void *b_, size_t n)              \
    {                                                                                              \
        uint16_t *dst = dst_;                                                                      \
        const uint16_t *a = a_, *b = b_;                                                           \
        size_t i = 0;                                                                              \
        for (; i + 16 <= n; i += 16) {                                                             \
            __m256i x = bf16x16_load(a + i), y = bf16x16_load(b + i);                              \
            bf16x16_store(dst + i, vop(bf16x16_lo(x), bf16x16_lo(y)),                              \
                          vop(bf16x16_hi(x), bf16x16_hi(y)));                                      \
        }                                                                                          \
        tail(dst + i, a + i, b + i, n - i);                                                        \
    }

TERN__BF16_LOOP(sum_bf16v, v8_add, sum_bf16_avx2)
TERN__BF16_LOOP(prod_bf16v, v8_mul, prod_bf16_avx2)
TERN__BF16_LOOP(max_bf16v, v8_max, max_bf16_avx2)
TERN__BF16_LOOP(min_bf16v, v8_min, min_bf16_avx2)

TERN__AVX2 static void scale_bf16v(void *buf_, size_t n, uint64_t divisor)
{
    uint16_t *buf = buf_;
    __m256 d = _mm256_set1_ps((float)divisor);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i x = bf16x16_load(buf + i);
        bf16x16_store(buf + i, _mm256_div_ps(bf16x16_lo(x), d), _mm256_div_ps(bf16x16_hi(x), d));
    }
    scale_bf16_avx2(buf + i, n - i, divisor);
}

static const kernel_fn avx2_kernels[TERN_DTYPE_COUNT][TERN_REDUCE_OP_COUNT] = {
    [TERN_DTYPE_F16] = {sum_f16c, prod_f16c, max_f16c, min_f16c, sum_f16c},
    [TERN_DTYPE_BF16] = {sum_bf16v, prod_bf16v, max_bf16v, min_bf16v, sum_bf16v},
    [TERN_DTYPE_F32] = {sum_f32_avx2, prod_f32_avx2, max_f32_loop_avx2, min_f32_loop_avx2,
                        sum_f32_avx2},
    [TERN_DTYPE_F64] = {sum_f64_avx2, prod_f64_avx2, max_f64_loop_avx2, min_f64_loop_avx2,
                        sum_f64_avx2},
    [TERN_DTYPE_I8] = {sum_u8_avx2, prod_u8_avx2, max_i8_loop_avx2, min_i8_loop_avx2, NULL},
    [TERN_DTYPE_I16] = {sum_u16_avx2, prod_u16_avx2, max_i16_loop_avx2, min_i16_loop_avx2, NULL},
    [TERN_DTYPE_I32] = {sum_u32_avx2, prod_u32_avx2, max_i32_loop_avx2, min_i32_loop_avx2, NULL},
    [TERN_DTYPE_I64] = {sum_u64_avx2, prod_u64_avx2, max_i64_loop_avx2, min_i64_loop_avx2, NULL},
    [TERN_DTYPE_U8] = {sum_u8_avx2, prod_u8_avx2, max_u8_loop_avx2, min_u8_loop_avx2, NULL},
    [TERN_DTYPE_BOOL] = {or_bool_loop_avx2, and_bool_loop_avx2, or_bool_loop_avx2,
                         and_bool_loop_avx2, NULL},
};

static const scale_fn avx2_scales[TERN_DTYPE_COUNT] = {
    [TERN_DTYPE_F16] = scale_f16c,
    [TERN_DTYPE_BF16] = scale_bf16v,
    [TERN_DTYPE_F32] = scale_f32_avx2,
    [TERN_DTYPE_F64] = scale_f64_avx2,
};
#endif

/* ---- dispatch ---- */

static atomic_bool force_portable;

void tern__reduce_force_portable(bool on)
{
    atomic_store_explicit(&force_portable, on, memory_order_relaxed);
}

#if TERN__REDUCE_X86
/* 1 when the CPU has AVX2 and F16C and the OS saves the AVX state. GCC's and
 * clang's __builtin_cpu_supports both know "avx2" (and check the OS part);
 * not every clang knows "f16c", so that bit comes from CPUID leaf 1. */
static int probe_avx2_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__builtin_cpu_supports("avx2") || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return 0;
    return (ecx & bit_F16C) != 0;
}

/* Probed once (-1: not yet); a race only probes twice, to the same answer. */
static atomic_int have_avx2 = -1;
#endif

static bool use_avx2(void)
{
#if TERN__REDUCE_X86
    int have = atomic_load_explicit(&have_avx2, memory_order_relaxed);
    if (have < 0) {
        have = probe_avx2_f16c();
        atomic_store_explicit(&have_avx2, have, memory_order_relaxed);
    }
    return have && !atomic_load_explicit(&force_portable, memory_order_relaxed);
#else
    return false;
#endif
}

const char *tern__reduce_isa(void)
{
    return use_avx2() ? "avx2+f16c" : "portable";
}

static kernel_fn kernel_for(tern_reduce_op_t op, tern_dtype_t dtype)
{
#if TERN__REDUCE_X86
    if (use_avx2())
        return avx2_kernels[dtype][op];
#endif
    return portable_kernels[dtype][op];
}

tern__reduce_fn tern__reduce_kernel(tern_reduce_op_t op, tern_dtype_t dtype)
{
    /* tern__reduce_check's conditions, without recording an error */
    bool ok = op_known(op) && tern_dtype_size(dtype) != 0 && (op != TERN_AVG || dtype_floating(dtype));
    return ok ? kernel_for(op, dtype) : NULL;
}

/* NULL for a dtype that has no division (the integers, bool). */
static scale_fn scale_for(tern_dtype_t dtype)
{
    if (tern_dtype_size(dtype) == 0)
        return NULL;
#if TERN__REDUCE_X86
    if (use_avx2())
        return avx2_scales[dtype];
#endif
    return portable_scales[dtype];
}

/* ---- argument checks ---- */

static bool misaligned(const void *p, size_t size)
{
    return ((uintptr_t)p & (size - 1)) != 0;
}

/* The checks tern__reduce and tern__reduce_par share, after the op/dtype
 * check: pointers set and aligned, byte size representable. */
static tern_status_t check_buffers(tern_dtype_t dtype, const void *dst, const void *a,
                                   const void *b, size_t count)
{
    size_t size = tern_dtype_size(dtype);
    if (dst == NULL || a == NULL || b == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce: NULL %s with %zu elements",
                           dst == NULL ? "dst" : a == NULL ? "a" : "b", count);
    if (count > SIZE_MAX / size)
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce: %zu %s elements overflow size_t",
                           count, tern_dtype_name(dtype));
    if (misaligned(dst, size) || misaligned(a, size) || misaligned(b, size))
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "reduce: %s buffer %s not aligned to %zu bytes",
                           tern_dtype_name(dtype),
                           misaligned(dst, size) ? "dst" : misaligned(a, size) ? "a" : "b", size);
    return TERN_OK;
}

/* TERN_OK and *run set when there is work to do; TERN_OK and *run false for
 * count 0; an error otherwise. */
static tern_status_t check_reduce(tern_reduce_op_t op, tern_dtype_t dtype, const void *dst,
                                  const void *a, const void *b, size_t count, bool *run)
{
    tern_status_t st = tern__reduce_check(op, dtype);
    *run = false;
    if (st != TERN_OK || count == 0)
        return st;
    st = check_buffers(dtype, dst, a, b, count);
    *run = st == TERN_OK;
    return st;
}

tern_status_t tern__reduce(tern_reduce_op_t op, tern_dtype_t dtype, void *dst, const void *a,
                           const void *b, size_t count)
{
    bool run;
    tern_status_t st = check_reduce(op, dtype, dst, a, b, count, &run);
    if (run)
        kernel_for(op, dtype)(dst, a, b, count);
    return st;
}

tern_status_t tern__reduce_scale(tern_dtype_t dtype, void *buf, size_t count, uint64_t divisor)
{
    scale_fn fn = scale_for(dtype);
    if (fn == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "reduce scale: defined for floating types only, not %s",
                           tern_dtype_name(dtype));
    if (divisor == 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce scale: divisor 0");
    if (count == 0)
        return TERN_OK;
    if (buf == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce scale: NULL buf with %zu elements",
                           count);
    if (misaligned(buf, tern_dtype_size(dtype)))
        return tern__error(TERN_ERR_INVALID_PARAM, "reduce scale: %s buffer not aligned to %zu bytes",
                           tern_dtype_name(dtype), tern_dtype_size(dtype));
    fn(buf, count, divisor);
    return TERN_OK;
}

/* ---- over the pool ---- */

/*
 * One parallel reduction. The range is cut into more chunks than there are
 * threads, and the caller and every task claim chunks from a shared counter
 * until none is left, rather than each doing a fixed share: pool threads are
 * bound to cores while the caller is not, so a static split puts the caller's
 * share and some worker's share on one core about every time, and the call
 * lasts twice as long as it should. With claiming, a thread that shares its
 * core simply does fewer chunks.
 *
 * The job lives on the heap, counted: the caller returns as soon as every
 * chunk is done, without waiting for tasks that start late (a worker busy
 * elsewhere) and find nothing left to claim; the last holder frees it.
 */
typedef struct par_job {
    kernel_fn fn;
    char *dst;
    const char *a, *b;
    size_t size, count;
    unsigned chunks;
    atomic_uint next; /* next chunk to claim; >= chunks: none left */
    atomic_uint refs; /* the caller and each task that was queued */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned done; /* chunks finished, under mu */
} par_job_t;

/* Chunk k starts at boundary k: 0 for the first, count past the last, and
 * between them k * count / chunks moved up to the next element at a 64-byte
 * address of dst, so that no two threads write one cache line. Boundaries
 * never decrease and never pass count. */
static size_t par_boundary(const par_job_t *j, unsigned k)
{
    size_t raw, pad;
    if (k == 0)
        return 0;
    if (k >= j->chunks)
        return j->count;
    raw = j->count / j->chunks * k + j->count % j->chunks * k / j->chunks;
    pad = (size_t)((64 - (((uintptr_t)j->dst + raw * j->size) & 63)) & 63) / j->size;
    return raw + pad < j->count ? raw + pad : j->count;
}

/* Claim and reduce chunks until none is left; count them in. */
static void par_work(par_job_t *j)
{
    unsigned k, did = 0;
    while ((k = atomic_fetch_add(&j->next, 1)) < j->chunks) {
        size_t lo = par_boundary(j, k), hi = par_boundary(j, k + 1);
        if (hi > lo)
            j->fn(j->dst + lo * j->size, j->a + lo * j->size, j->b + lo * j->size, hi - lo);
        did++;
    }
    if (did == 0)
        return;
    pthread_mutex_lock(&j->mu);
    j->done += did;
    if (j->done == j->chunks)
        pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void par_release(par_job_t *j)
{
    if (atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void par_task(void *arg)
{
    par_job_t *j = arg;
    par_work(j);
    par_release(j);
}

/* NULL when the job cannot be set up (the caller then reduces alone). */
static par_job_t *par_job_new(kernel_fn fn, size_t size, void *dst, const void *a,
                              const void *b, size_t count, unsigned chunks)
{
    par_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->fn = fn;
    j->dst = dst;
    j->a = a;
    j->b = b;
    j->size = size;
    j->count = count;
    j->chunks = chunks;
    atomic_init(&j->next, 0);
    atomic_init(&j->refs, 1);
    if (pthread_mutex_init(&j->mu, NULL) != 0) {
        free(j);
        return NULL;
    }
    if (pthread_cond_init(&j->cv, NULL) != 0) {
        pthread_mutex_destroy(&j->mu);
        free(j);
        return NULL;
    }
    return j;
}

/* Chunks of about TERN__REDUCE_PAR_CHUNK_BYTES, at least two per thread
 * (caller included) for the claiming to even out, at most the table's
 * limit. 1 means: not worth splitting. */
static unsigned par_chunks(tern_pool_t *pool, size_t bytes)
{
    size_t threads, n;
    if (pool == NULL || bytes < TERN__REDUCE_PAR_MIN_BYTES || tern_pool_size(pool) < 2 ||
        tern_pool_in_worker(pool))
        return 1;
    threads = (size_t)tern_pool_size(pool) + 1;
    n = bytes / TERN__REDUCE_PAR_CHUNK_BYTES;
    n = n < 2 * threads ? 2 * threads : n;
    return n > TERN__REDUCE_PAR_MAX_CHUNKS ? TERN__REDUCE_PAR_MAX_CHUNKS : (unsigned)n;
}

static void par_run(tern_pool_t *pool, kernel_fn fn, size_t size, void *dst, const void *a,
                    const void *b, size_t count, unsigned chunks)
{
    unsigned tasks = tern_pool_size(pool);
    par_job_t *j = par_job_new(fn, size, dst, a, b, count, chunks);
    if (j == NULL) {
        fn(dst, a, b, count);
        return;
    }
    tasks = tasks < chunks - 1 ? tasks : chunks - 1;
    /* A refused submit costs nothing: its chunks are claimed by the others,
     * the caller at least. Stop at the first, the queue is full. */
    for (unsigned t = 0; t < tasks; t++) {
        atomic_fetch_add(&j->refs, 1);
        if (tern_pool_submit(pool, par_task, j) != TERN_OK) {
            atomic_fetch_sub(&j->refs, 1);
            break;
        }
    }
    par_work(j);
    pthread_mutex_lock(&j->mu);
    while (j->done < j->chunks)
        pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    par_release(j);
}

tern_status_t tern__reduce_par(tern_pool_t *pool, tern_reduce_op_t op, tern_dtype_t dtype,
                               void *dst, const void *a, const void *b, size_t count)
{
    bool run;
    unsigned chunks;
    tern_status_t st = check_reduce(op, dtype, dst, a, b, count, &run);
    if (!run)
        return st;
    chunks = par_chunks(pool, count * tern_dtype_size(dtype));
    if (chunks <= 1)
        kernel_for(op, dtype)(dst, a, b, count);
    else
        par_run(pool, kernel_for(op, dtype), tern_dtype_size(dtype), dst, a, b, count, chunks);
    return TERN_OK;
}
