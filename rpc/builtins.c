/*
 * The built-in RPC functions. Each checks the tensor count, dtypes, ndim and
 * shapes before it touches an element, then writes its result straight into
 * a tensor from tern_rpc_call_alloc_tensor(). Errors are
 * TERN_ERR_INVALID_PARAM with a message naming the function, except
 * TERN_ERR_INTERNAL for an argument the core should never hand over (not a
 * contiguous CPU tensor with aligned data). Nothing here keeps state.
 *
 * Arithmetic:
 *   - f32 and f64 compute in their own type; f16 and bf16 widen exactly to
 *     f32, compute there and round back to nearest, ties to even (the
 *     correctly rounded result for + - * /: f32 holds more than 2p+2 bits).
 *     NaNs are whatever the hardware makes;
 *   - integers wrap modulo 2^bits, computed unsigned (no undefined
 *     behaviour). div truncates toward zero as C does, MIN / -1 wraps to MIN,
 *     and a zero divisor fails the call naming the first such element;
 *   - bool (any nonzero byte is true, results are 0 or 1): add is or, sub is
 *     xor, mul is and, sum is or; div, relu and matmul refuse it.
 * add, sub, mul, div: two tensors of one dtype and one shape (no
 * broadcasting). matmul: [m, k] x [k, n] of one dtype, loops i-k-j. Floats
 * accumulate in f32 (f16, bf16, f32) or f64; integers are supported and wrap
 * as mul and add do (the same answer as torch.mm on integer tensors).
 * relu: max(x, 0), NaN kept, -0 gives +0. sum: a 0-d tensor of the same
 * dtype; f16, bf16 add up in f32 and f32 in f64, rounded once at the end.
 * sleep_ms: no tensors; the blob is 1 to 10 ASCII digits (one trailing NUL
 * allowed), at most 3600000; blocks its pool thread that long.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <tern/rpc.h>

#include "rpc/builtins.h"
#include "tensor/half.h"

#define SAME(v) (v)

/* Table entries [dtype] = p_f16 .. p_u8, for every dtype but bool. */
#define BY_DTYPE(p)                                                                                \
    [TERN_DTYPE_F16] = p##_f16, [TERN_DTYPE_BF16] = p##_bf16, [TERN_DTYPE_F32] = p##_f32,          \
    [TERN_DTYPE_F64] = p##_f64, [TERN_DTYPE_I8] = p##_i8, [TERN_DTYPE_I16] = p##_i16,              \
    [TERN_DTYPE_I32] = p##_i32, [TERN_DTYPE_I64] = p##_i64, [TERN_DTYPE_U8] = p##_u8

/* ---- argument checks ---- */

/* "[3, 4]": at most 16 entries of ", " and 20 characters, brackets, NUL. */
#define SHAPE_STR_MAX (TERN_TENSOR_MAX_DIMS * 22 + 3)

/* t's shape into buf[SHAPE_STR_MAX]; t->ndim already checked. */
static const char *shape_str(const tern_tensor_t *t, char *buf)
{
    size_t len = 1;
    buf[0] = '[';
    for (int32_t i = 0; i < t->ndim; i++)
        len += (size_t)snprintf(buf + len, SHAPE_STR_MAX - len, "%s%" PRId64, i ? ", " : "",
                                t->shape[i]);
    snprintf(buf + len, SHAPE_STR_MAX - len, "]");
    return buf;
}

/* Exactly want tensors, each a CPU tensor with a known dtype, a valid shape,
 * contiguous, with aligned data for its elements: *t is the array and
 * numel[i] the elements of the i-th. Fails the call otherwise. */
static tern_status_t get_tensors(tern_rpc_call_t *call, const char *fn, size_t want,
                                 const tern_tensor_t **t, size_t *numel)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    size_t got = v != NULL ? v->ntensors : 0;
    if (got != want)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM,
                                  "%s: expected %zu tensor%s, got %zu", fn, want,
                                  want == 1 ? "" : "s", got);
    *t = want > 0 ? v->tensors : NULL;
    for (size_t i = 0; i < want; i++) {
        const tern_tensor_t *x = &v->tensors[i];
        size_t size = tern_dtype_size(x->dtype), bytes;
        if (size == 0 || tern_tensor_nbytes(x, &bytes) != TERN_OK ||
            x->device.type != TERN_DEVICE_CPU || !tern_tensor_is_contiguous(x) ||
            (bytes > 0 && (x->data == NULL || (uintptr_t)x->data % size != 0)))
            return tern_rpc_call_fail(
                call, TERN_ERR_INTERNAL,
                "%s: tensor %zu is not a contiguous CPU tensor with aligned data", fn, i);
        numel[i] = bytes / size;
    }
    return TERN_OK;
}

static tern_status_t dtype_mismatch(tern_rpc_call_t *call, const char *fn, const tern_tensor_t *t)
{
    return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "%s: dtype mismatch: %s and %s", fn,
                              tern_dtype_name(t[0].dtype), tern_dtype_name(t[1].dtype));
}

static tern_status_t refuse_bool(tern_rpc_call_t *call, const char *fn)
{
    return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "%s: not defined for bool", fn);
}

static tern_status_t alloc_out(tern_rpc_call_t *call, const char *fn, tern_dtype_t dtype,
                               int32_t ndim, const int64_t *shape, tern_tensor_t **out)
{
    tern_status_t st = tern_rpc_call_alloc_tensor(call, dtype, ndim, shape, out);
    if (st != TERN_OK)
        return tern_rpc_call_fail(call, st, "%s: cannot allocate the result: %s", fn,
                                  tern_strerror(st));
    return TERN_OK;
}

/* ---- add, sub, mul, div ---- */

enum binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_COUNT };

/* d[i] = x[i] op y[i] for i < n; the caller rejected what op cannot do. */
typedef void (*binop_fn)(void *dst, const void *a, const void *b, size_t n);

/* One loop: d[i] = EXPR, EXPR reading x[i] and y[i]. */
#define BINOP(name, T, EXPR)                                                                       \
    static void name(void *dst, const void *a, const void *b, size_t n)                            \
    {                                                                                              \
        T *d = dst;                                                                                \
        const T *x = a, *y = b;                                                                    \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = (EXPR);                                                                         \
    }

/* Floating: LOAD widens to the computing type, STORE rounds back. */
#define FLOAT_OPS(name, T, LOAD, STORE)                                                            \
    BINOP(add_##name, T, STORE(LOAD(x[i]) + LOAD(y[i])))                                           \
    BINOP(sub_##name, T, STORE(LOAD(x[i]) - LOAD(y[i])))                                           \
    BINOP(mul_##name, T, STORE(LOAD(x[i]) * LOAD(y[i])))                                           \
    BINOP(div_##name, T, STORE(LOAD(x[i]) / LOAD(y[i])))

/* Integers: computed in U (unsigned, at least as wide as int), truncated
 * back. No divisor is 0 here; a signed x / -1 is the negation, wrapped. */
#define INT_OPS(name, T, U, SIGNED)                                                                \
    BINOP(add_##name, T, (T)((U)x[i] + (U)y[i]))                                                   \
    BINOP(sub_##name, T, (T)((U)x[i] - (U)y[i]))                                                   \
    BINOP(mul_##name, T, (T)((U)x[i] * (U)y[i]))                                                   \
    BINOP(div_##name, T, y[i] == (T)-1 && SIGNED ? (T)(0u - (U)x[i]) : (T)(x[i] / y[i]))

FLOAT_OPS(f16, uint16_t, f16_to_f32, f32_to_f16)
FLOAT_OPS(bf16, uint16_t, bf16_to_f32, f32_to_bf16)
FLOAT_OPS(f32, float, SAME, SAME)
FLOAT_OPS(f64, double, SAME, SAME)
INT_OPS(i8, int8_t, unsigned, 1)
INT_OPS(i16, int16_t, unsigned, 1)
INT_OPS(i32, int32_t, uint32_t, 1)
INT_OPS(i64, int64_t, uint64_t, 1)
INT_OPS(u8, uint8_t, unsigned, 0)
BINOP(add_bool, uint8_t, (x[i] != 0) | (y[i] != 0))
BINOP(sub_bool, uint8_t, (x[i] != 0) ^ (y[i] != 0))
BINOP(mul_bool, uint8_t, (x[i] != 0) & (y[i] != 0))

static const binop_fn binops[OP_COUNT][TERN_DTYPE_COUNT] = {
    [OP_ADD] = {BY_DTYPE(add), [TERN_DTYPE_BOOL] = add_bool},
    [OP_SUB] = {BY_DTYPE(sub), [TERN_DTYPE_BOOL] = sub_bool},
    [OP_MUL] = {BY_DTYPE(mul), [TERN_DTYPE_BOOL] = mul_bool},
    [OP_DIV] = {BY_DTYPE(div)}, /* not bool */
};

/* The index of the first element of p[0..n) (size bytes each) that is all
 * zero bytes, an integer 0; n if none. */
static size_t first_zero(const unsigned char *p, size_t size, size_t n)
{
    static const unsigned char zero[8];
    for (size_t i = 0; i < n; i++)
        if (memcmp(p + i * size, zero, size) == 0)
            return i;
    return n;
}

static tern_status_t elementwise(tern_rpc_call_t *call, const char *fn, enum binop op)
{
    const tern_tensor_t *t;
    tern_tensor_t *out;
    size_t n[2], at;
    char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
    tern_status_t st = get_tensors(call, fn, 2, &t, n);
    if (st != TERN_OK)
        return st;
    if (t[0].dtype != t[1].dtype)
        return dtype_mismatch(call, fn, t);
    if (t[0].ndim != t[1].ndim ||
        memcmp(t[0].shape, t[1].shape, (size_t)t[0].ndim * sizeof(t[0].shape[0])) != 0)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM, "%s: shape mismatch: %s and %s", fn,
                                  shape_str(&t[0], sa), shape_str(&t[1], sb));
    if (op == OP_DIV && t[0].dtype == TERN_DTYPE_BOOL)
        return refuse_bool(call, fn);
    if (op == OP_DIV && t[0].dtype >= TERN_DTYPE_I8 && t[0].dtype <= TERN_DTYPE_U8 &&
        (at = first_zero(t[1].data, tern_dtype_size(t[1].dtype), n[1])) < n[1])
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM,
                                  "%s: integer division by zero at element %zu", fn, at);
    st = alloc_out(call, fn, t[0].dtype, t[0].ndim, t[0].shape, &out);
    if (st == TERN_OK && n[0] > 0)
        binops[op][t[0].dtype](out->data, t[0].data, t[1].data, n[0]);
    return st;
}

#define ELEMENTWISE(name, op)                                                                      \
    static tern_status_t rpc_##name(tern_rpc_call_t *call)                                         \
    {                                                                                              \
        return elementwise(call, #name, op);                                                       \
    }
ELEMENTWISE(add, OP_ADD)
ELEMENTWISE(sub, OP_SUB)
ELEMENTWISE(mul, OP_MUL)
ELEMENTWISE(div, OP_DIV)

/* ---- matmul ---- */

/* c[m x n] = a[m x k] b[k x n], all row-major. */
typedef void (*matmul_fn)(void *c, const void *a, const void *b, size_t m, size_t k, size_t n);

/* Loops i-k-j, the inner one along rows of b and c, over blocks of a row of
 * c summed in ACC on the stack (no allocation; the block stays in L1), then
 * converted once: f16/bf16 round from f32, integers truncate from unsigned
 * (wrapping), f32/f64 sum in their own type. */
#define MATMUL_BLOCK 256
#define MATMUL(name, T, ACC, LOAD, STORE)                                                          \
    static void name(void *c_, const void *a_, const void *b_, size_t m, size_t k, size_t n)       \
    {                                                                                              \
        T *c = c_;                                                                                 \
        const T *a = a_, *b = b_;                                                                  \
        ACC acc[MATMUL_BLOCK];                                                                     \
        for (size_t i = 0; i < m; i++)                                                             \
            for (size_t j0 = 0; j0 < n; j0 += MATMUL_BLOCK) {                                      \
                size_t w = n - j0 < MATMUL_BLOCK ? n - j0 : MATMUL_BLOCK;                          \
                for (size_t j = 0; j < w; j++)                                                     \
                    acc[j] = 0;                                                                    \
                for (size_t p = 0; p < k; p++) {                                                   \
                    ACC aip = (ACC)LOAD(a[i * k + p]);                                             \
                    const T *bp = b + p * n + j0;                                                  \
                    for (size_t j = 0; j < w; j++)                                                 \
                        acc[j] += aip * (ACC)LOAD(bp[j]);                                          \
                }                                                                                  \
                for (size_t j = 0; j < w; j++)                                                     \
                    c[i * n + j0 + j] = (T)STORE(acc[j]);                                          \
            }                                                                                      \
    }

MATMUL(matmul_f16, uint16_t, float, f16_to_f32, f32_to_f16)
MATMUL(matmul_bf16, uint16_t, float, bf16_to_f32, f32_to_bf16)
MATMUL(matmul_f32, float, float, SAME, SAME)
MATMUL(matmul_f64, double, double, SAME, SAME)
MATMUL(matmul_i8, int8_t, unsigned, SAME, SAME)
MATMUL(matmul_i16, int16_t, unsigned, SAME, SAME)
MATMUL(matmul_i32, int32_t, uint32_t, SAME, SAME)
MATMUL(matmul_i64, int64_t, uint64_t, SAME, SAME)
MATMUL(matmul_u8, uint8_t, unsigned, SAME, SAME)

static const matmul_fn matmuls[TERN_DTYPE_COUNT] = {BY_DTYPE(matmul)};

static tern_status_t rpc_matmul(tern_rpc_call_t *call)
{
    const tern_tensor_t *t;
    tern_tensor_t *out;
    size_t n[2];
    char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
    tern_status_t st = get_tensors(call, "matmul", 2, &t, n);
    if (st != TERN_OK)
        return st;
    if (t[0].ndim != 2 || t[1].ndim != 2)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM,
                                  "matmul: expected 2-d tensors, got %s x %s", shape_str(&t[0], sa),
                                  shape_str(&t[1], sb));
    if (t[0].dtype != t[1].dtype)
        return dtype_mismatch(call, "matmul", t);
    if (t[0].dtype == TERN_DTYPE_BOOL)
        return refuse_bool(call, "matmul");
    if (t[0].shape[1] != t[1].shape[0])
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM,
                                  "matmul: inner dimensions differ: %s x %s", shape_str(&t[0], sa),
                                  shape_str(&t[1], sb));
    int64_t shape[2] = {t[0].shape[0], t[1].shape[1]};
    st = alloc_out(call, "matmul", t[0].dtype, 2, shape, &out);
    if (st == TERN_OK && shape[0] > 0 && shape[1] > 0)
        matmuls[t[0].dtype](out->data, t[0].data, t[1].data, (size_t)shape[0],
                            (size_t)t[0].shape[1], (size_t)shape[1]);
    return st;
}

/* ---- relu ---- */

typedef void (*unary_fn)(void *dst, const void *src, size_t n);

/* d[i] = KEEP(x[i]) ? x[i] : 0. For f16 and bf16 the bits decide: zero for
 * sign set and not NaN. */
#define RELU(name, T, KEEP)                                                                        \
    static void name(void *dst, const void *src, size_t n)                                         \
    {                                                                                              \
        T *d = dst;                                                                                \
        const T *x = src;                                                                          \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = KEEP(x[i]) ? x[i] : 0;                                                          \
    }
#define KEEP_F16(v) ((v) < 0x8000u || (v) > 0xfc00u) /* sign clear, or a NaN */
#define KEEP_BF16(v) ((v) < 0x8000u || (v) > 0xff80u)
#define KEEP_FLOAT(v) (!((v) <= 0)) /* NaN kept, -0 dropped */
#define KEEP_INT(v) ((v) > 0)
#define KEEP_ALL(v) 1

RELU(relu_f16, uint16_t, KEEP_F16)
RELU(relu_bf16, uint16_t, KEEP_BF16)
RELU(relu_f32, float, KEEP_FLOAT)
RELU(relu_f64, double, KEEP_FLOAT)
RELU(relu_i8, int8_t, KEEP_INT)
RELU(relu_i16, int16_t, KEEP_INT)
RELU(relu_i32, int32_t, KEEP_INT)
RELU(relu_i64, int64_t, KEEP_INT)
RELU(relu_u8, uint8_t, KEEP_ALL)

static const unary_fn relus[TERN_DTYPE_COUNT] = {BY_DTYPE(relu)};

static tern_status_t rpc_relu(tern_rpc_call_t *call)
{
    const tern_tensor_t *t;
    tern_tensor_t *out;
    size_t n;
    tern_status_t st = get_tensors(call, "relu", 1, &t, &n);
    if (st != TERN_OK)
        return st;
    if (t->dtype == TERN_DTYPE_BOOL)
        return refuse_bool(call, "relu");
    st = alloc_out(call, "relu", t->dtype, t->ndim, t->shape, &out);
    if (st == TERN_OK && n > 0)
        relus[t->dtype](out->data, t->data, n);
    return st;
}

/* ---- sum ---- */

/* *dst = the sum of x[0..n), added up in ACC, then rounded or truncated
 * (integers: modulo 2^bits) to T. */
#define SUM(name, T, ACC, LOAD, STORE)                                                             \
    static void name(void *dst, const void *src, size_t n)                                         \
    {                                                                                              \
        const T *x = src;                                                                          \
        ACC s = 0;                                                                                 \
        for (size_t i = 0; i < n; i++)                                                             \
            s += LOAD(x[i]);                                                                       \
        *(T *)dst = (T)STORE(s);                                                                   \
    }
#define TO_U64(v) ((uint64_t)(v))

SUM(sum_f16, uint16_t, float, f16_to_f32, f32_to_f16)
SUM(sum_bf16, uint16_t, float, bf16_to_f32, f32_to_bf16)
SUM(sum_f32, float, double, SAME, SAME)
SUM(sum_f64, double, double, SAME, SAME)
SUM(sum_i8, int8_t, uint64_t, TO_U64, SAME)
SUM(sum_i16, int16_t, uint64_t, TO_U64, SAME)
SUM(sum_i32, int32_t, uint64_t, TO_U64, SAME)
SUM(sum_i64, int64_t, uint64_t, TO_U64, SAME)
SUM(sum_u8, uint8_t, uint64_t, TO_U64, SAME)

static void sum_bool(void *dst, const void *src, size_t n)
{
    const uint8_t *x = src;
    uint8_t any = 0;
    for (size_t i = 0; i < n; i++)
        any |= x[i] != 0;
    *(uint8_t *)dst = any;
}

static const unary_fn sums[TERN_DTYPE_COUNT] = {BY_DTYPE(sum), [TERN_DTYPE_BOOL] = sum_bool};

static tern_status_t rpc_sum(tern_rpc_call_t *call)
{
    const tern_tensor_t *t;
    tern_tensor_t *out;
    size_t n;
    tern_status_t st = get_tensors(call, "sum", 1, &t, &n);
    if (st != TERN_OK)
        return st;
    st = alloc_out(call, "sum", t->dtype, 0, t->shape, &out); /* shape unread for ndim 0 */
    if (st == TERN_OK)
        sums[t->dtype](out->data, t->data, n);
    return st;
}

/* ---- sleep_ms ---- */

#define SLEEP_MS_MAX 3600000u

static tern_status_t rpc_sleep_ms(tern_rpc_call_t *call)
{
    const tern_rpc_value_t *v = tern_rpc_call_args(call);
    const char *s = v != NULL ? v->blob : NULL;
    size_t len = s != NULL ? v->blob_len : 0;
    const tern_tensor_t *t;
    uint64_t ms = 0;
    tern_status_t st = get_tensors(call, "sleep_ms", 0, &t, NULL);
    if (st != TERN_OK)
        return st;
    if (len > 0 && s[len - 1] == '\0')
        len--;
    int ok = len >= 1 && len <= 10;
    for (size_t i = 0; ok && i < len; i++) {
        ok = s[i] >= '0' && s[i] <= '9';
        ms = ms * 10 + (uint64_t)(s[i] - '0');
    }
    if (!ok || ms > SLEEP_MS_MAX)
        return tern_rpc_call_fail(call, TERN_ERR_INVALID_PARAM,
                                  "sleep_ms: blob must be a decimal count of milliseconds "
                                  "(0..3600000)");
    struct timespec req = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    struct timespec rem;
    while (nanosleep(&req, &rem) != 0 && errno == EINTR)
        req = rem;
    return TERN_OK;
}

/* ---- registration ---- */

static const struct builtin {
    const char *name;
    tern_rpc_fn fn;
} builtins[] = {
    {"add", rpc_add},       {"sub", rpc_sub},   {"mul", rpc_mul}, {"div", rpc_div},
    {"matmul", rpc_matmul}, {"relu", rpc_relu}, {"sum", rpc_sum}, {"sleep_ms", rpc_sleep_ms},
};

tern_status_t tern__rpc_register_builtins(void)
{
    tern_status_t first = TERN_OK;
    for (size_t i = 0; i < sizeof(builtins) / sizeof(builtins[0]); i++) {
        tern_status_t st = tern_rpc_register(builtins[i].name, builtins[i].fn);
        first = first != TERN_OK ? first : st;
    }
    return first;
}
