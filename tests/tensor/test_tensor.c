/* dtypes, devices, descriptor rules (numel, nbytes, extent, contiguity, validation), gather. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <tern/tensor.h>

#include "tensor_test_util.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_dtype_size_and_name(void **state)
{
    static const struct {
        tern_dtype_t dtype;
        size_t size;
        const char *name;
    } want[] = {
        {TERN_DTYPE_F16, 2, "f16"},   {TERN_DTYPE_BF16, 2, "bf16"}, {TERN_DTYPE_F32, 4, "f32"},
        {TERN_DTYPE_F64, 8, "f64"},   {TERN_DTYPE_I8, 1, "i8"},     {TERN_DTYPE_I16, 2, "i16"},
        {TERN_DTYPE_I32, 4, "i32"},   {TERN_DTYPE_I64, 8, "i64"},   {TERN_DTYPE_U8, 1, "u8"},
        {TERN_DTYPE_BOOL, 1, "bool"},
    };
    (void)state;
    assert_int_equal(ARRAY_LEN(want), TERN_DTYPE_COUNT);
    for (size_t i = 0; i < ARRAY_LEN(want); i++) {
        tern_dtype_t parsed = (tern_dtype_t)-1;
        assert_int_equal((int)want[i].dtype, (int)i); /* wire codes are fixed */
        assert_int_equal(tern_dtype_size(want[i].dtype), want[i].size);
        assert_string_equal(tern_dtype_name(want[i].dtype), want[i].name);
        assert_int_equal(tern_dtype_parse(want[i].name, &parsed), TERN_OK);
        assert_int_equal(parsed, want[i].dtype);
    }
    assert_int_equal(tern_dtype_size((tern_dtype_t)TERN_DTYPE_COUNT), 0);
    assert_int_equal(tern_dtype_size((tern_dtype_t)-1), 0);
    assert_string_equal(tern_dtype_name((tern_dtype_t)TERN_DTYPE_COUNT), "unknown");
    assert_string_equal(tern_dtype_name((tern_dtype_t)-1), "unknown");
}

static void test_dtype_parse(void **state)
{
    static const struct {
        const char *name;
        tern_dtype_t dtype;
    } torch[] = {
        {"float16", TERN_DTYPE_F16}, {"half", TERN_DTYPE_F16},  {"bfloat16", TERN_DTYPE_BF16},
        {"float32", TERN_DTYPE_F32}, {"float", TERN_DTYPE_F32}, {"float64", TERN_DTYPE_F64},
        {"double", TERN_DTYPE_F64},  {"int8", TERN_DTYPE_I8},   {"int16", TERN_DTYPE_I16},
        {"short", TERN_DTYPE_I16},   {"int32", TERN_DTYPE_I32}, {"int", TERN_DTYPE_I32},
        {"int64", TERN_DTYPE_I64},   {"long", TERN_DTYPE_I64},  {"uint8", TERN_DTYPE_U8},
        {"bool", TERN_DTYPE_BOOL},
    };
    static const char *bad[] = {"", "F32", "f32 ", "torch.float32", "complex64", "uint16", "f"};
    tern_dtype_t d;
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(torch); i++) {
        assert_int_equal(tern_dtype_parse(torch[i].name, &d), TERN_OK);
        assert_int_equal(d, torch[i].dtype);
    }
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        d = TERN_DTYPE_U8;
        assert_int_equal(tern_dtype_parse(bad[i], &d), TERN_ERR_INVALID_PARAM);
        assert_int_equal(d, TERN_DTYPE_U8);
    }
    assert_string_equal(tern_last_error(), "unknown dtype name 'f'");
    assert_int_equal(tern_dtype_parse(NULL, &d), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_dtype_parse("f32", NULL), TERN_ERR_INVALID_PARAM);
}

static void test_device_parse(void **state)
{
    tern_device_t d;
    (void)state;
    assert_int_equal(tern_device_parse("cpu", &d), TERN_OK);
    assert_int_equal(d.type, TERN_DEVICE_CPU);
    assert_int_equal(d.index, 0);
    assert_int_equal(tern_device_parse("cuda:0", &d), TERN_OK);
    assert_int_equal(d.type, TERN_DEVICE_CUDA);
    assert_int_equal(d.index, 0);
    assert_int_equal(tern_device_parse("cuda:7", &d), TERN_OK);
    assert_int_equal(d.index, 7);
    assert_int_equal(tern_device_parse("cuda:10", &d), TERN_OK);
    assert_int_equal(d.index, 10);
    assert_int_equal(tern_device_parse("cuda:2147483647", &d), TERN_OK);
    assert_int_equal(d.index, INT32_MAX);

    static const char *bad[] = {
        "",
        "CPU",
        "cpu ",
        " cpu",
        "cpu:0",
        "cuda",
        "cuda:",
        "cuda:-1",
        "cuda:+1",
        "cuda:01",
        "cuda:00",
        "cuda:1x",
        "cuda: 1",
        "cuda:1 ",
        "cuda:2147483648",
        "cuda:99999999999999999999999",
        "gpu:0",
        "CUDA:0",
        "cuda0",
        "cuda:0:0",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        d = tern_device_cuda(42);
        assert_int_equal(tern_device_parse(bad[i], &d), TERN_ERR_INVALID_PARAM);
        assert_int_equal(d.type, TERN_DEVICE_CUDA); /* untouched */
        assert_int_equal(d.index, 42);
        assert_true(strlen(tern_last_error()) > 0);
    }
    assert_int_equal(tern_device_parse("cuda", &d), TERN_ERR_INVALID_PARAM);
    assert_non_null(strstr(tern_last_error(), "cuda:N"));
    assert_int_equal(tern_device_parse("gpu:0", &d), TERN_ERR_INVALID_PARAM);
    assert_non_null(strstr(tern_last_error(), "'gpu:0'"));
    assert_int_equal(tern_device_parse(NULL, &d), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_device_parse("cpu", NULL), TERN_ERR_INVALID_PARAM);
}

static void test_device_format(void **state)
{
    char buf[TERN_DEVICE_STR_MAX];
    (void)state;
    assert_int_equal(tern_device_format(tern_device_cpu(), buf, sizeof(buf)), TERN_OK);
    assert_string_equal(buf, "cpu");
    assert_int_equal(tern_device_format(tern_device_cuda(12), buf, sizeof(buf)), TERN_OK);
    assert_string_equal(buf, "cuda:12");
    assert_int_equal(tern_device_format(tern_device_cuda(INT32_MAX), buf, sizeof(buf)), TERN_OK);
    assert_string_equal(buf, "cuda:2147483647");
    assert_int_equal(strlen(buf) + 1, TERN_DEVICE_STR_MAX);

    /* Exactly enough, one short, none. */
    assert_int_equal(tern_device_format(tern_device_cuda(12), buf, 8), TERN_OK);
    assert_string_equal(buf, "cuda:12");
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(tern_device_format(tern_device_cuda(12), buf, 7), TERN_ERR_TRUNCATED);
    assert_string_equal(buf, "");
    assert_int_equal(tern_device_format(tern_device_cpu(), buf, 3), TERN_ERR_TRUNCATED);
    assert_int_equal(tern_device_format(tern_device_cpu(), NULL, 0), TERN_ERR_TRUNCATED);
    assert_int_equal(tern_device_format(tern_device_cpu(), NULL, 4), TERN_ERR_INVALID_PARAM);

    /* Invalid devices. */
    tern_device_t cpu1 = {TERN_DEVICE_CPU, 1}, other = {(tern_device_type_t)7, 0};
    assert_int_equal(tern_device_format(cpu1, buf, sizeof(buf)), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_device_format(tern_device_cuda(-1), buf, sizeof(buf)),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_device_format(other, buf, sizeof(buf)), TERN_ERR_INVALID_PARAM);

    /* parse(format(d)) == d */
    static const int32_t idx[] = {0, 1, 9, 10, 99, 100, 65535, 1000000, INT32_MAX - 1, INT32_MAX};
    for (size_t i = 0; i < ARRAY_LEN(idx); i++) {
        tern_device_t d;
        assert_int_equal(tern_device_format(tern_device_cuda(idx[i]), buf, sizeof(buf)), TERN_OK);
        assert_int_equal(tern_device_parse(buf, &d), TERN_OK);
        assert_int_equal(d.type, TERN_DEVICE_CUDA);
        assert_int_equal(d.index, idx[i]);
    }
}

static void test_init(void **state)
{
    float data[24];
    int64_t shape[] = {2, 3, 4};
    tern_tensor_t t;
    (void)state;
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, 3, shape, tern_device_cpu()),
                     TERN_OK);
    assert_ptr_equal(t.data, data);
    assert_int_equal(t.ndim, 3);
    assert_int_equal(t.strides[0], 12);
    assert_int_equal(t.strides[1], 4);
    assert_int_equal(t.strides[2], 1);
    for (int i = 3; i < TERN_TENSOR_MAX_DIMS; i++) {
        assert_int_equal(t.shape[i], 0);
        assert_int_equal(t.strides[i], 0);
    }
    assert_true(tern_tensor_is_contiguous(&t));
    assert_int_equal(tern_tensor_validate(&t), TERN_OK);

    /* Scalar, NULL shape allowed. */
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F64, 0, NULL, tern_device_cpu()),
                     TERN_OK);
    int64_t n;
    size_t b;
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_OK);
    assert_int_equal(b, 8);

    /* Zero dimension: strides as PyTorch (0 counted as 1). */
    int64_t zshape[] = {3, 0, 5};
    assert_int_equal(tern_tensor_init(&t, NULL, TERN_DTYPE_I16, 3, zshape, tern_device_cuda(2)),
                     TERN_OK);
    assert_int_equal(t.strides[0], 5);
    assert_int_equal(t.strides[1], 5);
    assert_int_equal(t.strides[2], 1);
    assert_int_equal(tern_tensor_validate(&t), TERN_OK); /* NULL data is fine with no element */

    /* Errors leave *t untouched. */
    tern_tensor_t before;
    memset(&t, 0xab, sizeof(t));
    before = t;
    int64_t neg[] = {2, -1};
    int64_t big[TERN_TENSOR_MAX_DIMS + 1] = {0};
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, 2, neg, tern_device_cpu()),
                     TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "dimension 1 has negative size -1");
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, TERN_TENSOR_MAX_DIMS + 1, big,
                                      tern_device_cpu()),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, -1, shape, tern_device_cpu()),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_init(&t, data, (tern_dtype_t)10, 3, shape, tern_device_cpu()),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, 3, NULL, tern_device_cpu()),
                     TERN_ERR_INVALID_PARAM);
    tern_device_t cpu1 = {TERN_DEVICE_CPU, 1};
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, 3, shape, cpu1),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, 3, shape, tern_device_cuda(-3)),
                     TERN_ERR_INVALID_PARAM);
    int64_t huge[] = {INT64_C(1) << 40, INT64_C(1) << 40};
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F32, 2, huge, tern_device_cpu()),
                     TERN_ERR_OUT_OF_RANGE);
    assert_memory_equal(&t, &before, sizeof(t));
    assert_int_equal(tern_tensor_init(NULL, data, TERN_DTYPE_F32, 3, shape, tern_device_cpu()),
                     TERN_ERR_INVALID_PARAM);

    /* All 16 dimensions. */
    int64_t ones[TERN_TENSOR_MAX_DIMS];
    for (int i = 0; i < TERN_TENSOR_MAX_DIMS; i++)
        ones[i] = i % 4 == 0 ? 2 : 1;
    assert_int_equal(
        tern_tensor_init(&t, data, TERN_DTYPE_U8, TERN_TENSOR_MAX_DIMS, ones, tern_device_cpu()),
        TERN_OK);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_OK);
    assert_int_equal(n, 16);
}

/* A descriptor with the given shape (strides contiguous), for numel/nbytes. */
static tern_tensor_t shaped(tern_dtype_t dtype, int32_t ndim, const int64_t *shape)
{
    tern_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.dtype = dtype;
    t.ndim = ndim;
    t.device = tern_device_cpu();
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    return t;
}

static void test_numel_nbytes_overflow(void **state)
{
    int64_t n = -7;
    size_t b = 7;
    (void)state;
    const int64_t p31 = INT64_C(1) << 31, p32 = INT64_C(1) << 32, p40 = INT64_C(1) << 40;

    int64_t s1[] = {p31, p31}; /* 2^62: fits */
    tern_tensor_t t = shaped(TERN_DTYPE_I8, 2, s1);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_OK);
    assert_int_equal(n, INT64_C(1) << 62);
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_OK);
    assert_int_equal(b, (size_t)1 << 62);
    t.dtype = TERN_DTYPE_I16; /* 2^63 bytes: does not fit */
    b = 7;
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_ERR_OUT_OF_RANGE);
    assert_int_equal(b, 7);
    assert_non_null(strstr(tern_last_error(), "byte count overflows"));
    t.dtype = TERN_DTYPE_F64;
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_ERR_OUT_OF_RANGE);

    int64_t s2[] = {p32, p32}; /* 2^64 elements */
    t = shaped(TERN_DTYPE_U8, 2, s2);
    n = -7;
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_ERR_OUT_OF_RANGE);
    assert_int_equal(n, -7);
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_ERR_OUT_OF_RANGE);

    int64_t s3[] = {p31, p31, 2}; /* exactly 2^63 */
    t = shaped(TERN_DTYPE_U8, 3, s3);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_ERR_OUT_OF_RANGE);
    assert_string_equal(tern_last_error(), "shape overflows int64 at dimension 2 (size 2)");

    int64_t s4[] = {INT64_MAX}; /* the largest element count, 1-byte elements */
    t = shaped(TERN_DTYPE_BOOL, 1, s4);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_OK);
    assert_int_equal(n, INT64_MAX);
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_OK);
    assert_int_equal(b, (size_t)INT64_MAX);
    t.dtype = TERN_DTYPE_F16;
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_ERR_OUT_OF_RANGE);

    /* Zero dimension: 0 elements, but the other dimensions must still multiply. */
    int64_t s5[] = {p31, 0, p31};
    t = shaped(TERN_DTYPE_F64, 3, s5);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_OK);
    assert_int_equal(b, 0);
    int64_t s6[] = {0, p40, p40};
    t = shaped(TERN_DTYPE_F64, 3, s6);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_ERR_OUT_OF_RANGE);

    /* Bad descriptors. */
    int64_t s7[] = {3, -2};
    t = shaped(TERN_DTYPE_F32, 2, s7);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_ERR_INVALID_PARAM);
    t = shaped(TERN_DTYPE_F32, 0, NULL);
    t.ndim = TERN_TENSOR_MAX_DIMS + 1;
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_ERR_INVALID_PARAM);
    t.ndim = -1;
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_ERR_INVALID_PARAM);
    t = shaped((tern_dtype_t)99, 0, NULL);
    assert_int_equal(tern_tensor_numel(&t, &n), TERN_OK); /* numel does not need the dtype */
    assert_int_equal(tern_tensor_nbytes(&t, &b), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_numel(NULL, &n), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_numel(&t, NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_nbytes(&t, NULL), TERN_ERR_INVALID_PARAM);
}

/* A CPU tensor view with explicit shape and strides. */
static tern_tensor_t view(void *data, tern_dtype_t dtype, int32_t ndim, const int64_t *shape,
                          const int64_t *strides)
{
    tern_tensor_t t = shaped(dtype, ndim, shape);
    t.data = data;
    for (int i = 0; i < ndim; i++)
        t.strides[i] = strides[i];
    return t;
}

static void test_contiguity(void **state)
{
    char buf[1024];
    (void)state;
    struct {
        int32_t ndim;
        int64_t shape[4], strides[4];
        bool contiguous;
    } cases[] = {
        {0, {0}, {0}, true}, /* scalar */
        {1, {5}, {1}, true},
        {1, {5}, {2}, false}, /* every other element */
        {2, {3, 4}, {4, 1}, true},
        {2, {3, 4}, {1, 3}, false},        /* transposed */
        {2, {3, 4}, {8, 1}, false},        /* rows with gaps */
        {2, {3, 4}, {0, 1}, false},        /* broadcast rows */
        {3, {2, 1, 4}, {4, 999, 1}, true}, /* size-1 stride ignored */
        {3, {1, 1, 1}, {7, 0, 5}, true},
        {3, {2, 1, 4}, {4, 0, 1}, true},
        {4, {2, 3, 1, 5}, {15, 5, 1, 1}, true},
        {4, {2, 3, 1, 5}, {15, 5, 1, 2}, false},
        {2, {0, 4}, {123, 7}, true}, /* no element */
        {2, {3, 0}, {0, 0}, true},
        {2, {4, 3}, {3, 1}, true},
        {2, {4, 1}, {1, 1}, true},
        {2, {1, 4}, {1, 1}, true},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        tern_tensor_t t = view(buf, TERN_DTYPE_U8, cases[i].ndim, cases[i].shape, cases[i].strides);
        if (tern_tensor_is_contiguous(&t) != cases[i].contiguous)
            fail_msg("case %zu: expected contiguous=%d", i, cases[i].contiguous);
    }
    tern_tensor_t t = shaped(TERN_DTYPE_U8, 0, NULL);
    t.ndim = 17;
    assert_false(tern_tensor_is_contiguous(&t));
    int64_t neg[] = {-1}, st[] = {1};
    t = view(buf, TERN_DTYPE_U8, 1, neg, st);
    assert_false(tern_tensor_is_contiguous(&t));
    assert_false(tern_tensor_is_contiguous(NULL));
}

static void test_validate_and_extent(void **state)
{
    char buf[1024];
    size_t e = 99;
    (void)state;

    int64_t sh[] = {3, 4};
    int64_t contig[] = {4, 1}, transp[] = {1, 3}, bcast[] = {0, 1}, gap[] = {10, 2};
    tern_tensor_t t = view(buf, TERN_DTYPE_F32, 2, sh, contig);
    assert_int_equal(tern_tensor_validate(&t), TERN_OK);
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
    assert_int_equal(e, 48);
    t = view(buf, TERN_DTYPE_F32, 2, sh, transp);
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
    assert_int_equal(e, 48);
    t = view(buf, TERN_DTYPE_F32, 2, sh, bcast);
    assert_int_equal(tern_tensor_validate(&t), TERN_OK);
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
    assert_int_equal(e, 16);
    t = view(buf, TERN_DTYPE_F32, 2, sh, gap);
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
    assert_int_equal(e, (2 * 10 + 3 * 2 + 1) * 4);

    /* Negative strides: rejected explicitly. */
    int64_t negst[] = {4, -1};
    t = view(buf, TERN_DTYPE_F32, 2, sh, negst);
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_UNSUPPORTED);
    assert_string_equal(tern_last_error(),
                        "dimension 1 has negative stride -1 (negative strides are not supported)");
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_ERR_UNSUPPORTED);
    /* ... even where they would not matter. */
    int64_t one[] = {1}, negone[] = {-5};
    t = view(buf, TERN_DTYPE_F32, 1, one, negone);
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_UNSUPPORTED);

    /* Strides whose span overflows, in elements and in bytes. */
    int64_t sh2[] = {3, 2}, huge[] = {INT64_MAX / 2, 1};
    t = view(buf, TERN_DTYPE_U8, 2, sh2, huge);
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_OUT_OF_RANGE);
    int64_t sh3[] = {2}, st3[] = {INT64_MAX / 4};
    t = view(buf, TERN_DTYPE_F64, 1, sh3, st3);
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_ERR_OUT_OF_RANGE);
    t.dtype = TERN_DTYPE_U8;
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
    assert_int_equal(e, (size_t)(INT64_MAX / 4) + 1);
    /* Huge strides on a size-1 dimension, or with no element, span nothing. */
    int64_t sh4[] = {1, 4}, st4[] = {INT64_MAX, 1};
    t = view(buf, TERN_DTYPE_F64, 2, sh4, st4);
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
    assert_int_equal(e, 32);
    int64_t sh5[] = {0, 4}, st5[] = {INT64_MAX, INT64_MAX};
    t = view(NULL, TERN_DTYPE_F64, 2, sh5, st5);
    assert_int_equal(tern_tensor_validate(&t), TERN_OK);
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
    assert_int_equal(e, 0);

    /* Data. */
    t = view(NULL, TERN_DTYPE_F32, 2, sh, contig);
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "tensor data is NULL with 12 elements");
    assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK); /* extent does not need data */
    t = view((void *)(UINTPTR_MAX - 16), TERN_DTYPE_F32, 2, sh, contig);
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_OUT_OF_RANGE);

    /* Devices and dtypes. */
    t = view(buf, TERN_DTYPE_F32, 2, sh, contig);
    t.device.index = 1;
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_INVALID_PARAM);
    t.device = tern_device_cuda(1);
    assert_int_equal(tern_tensor_validate(&t), TERN_OK);
    t.device.type = (tern_device_type_t)5;
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_INVALID_PARAM);
    t = view(buf, (tern_dtype_t)TERN_DTYPE_COUNT, 2, sh, contig);
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_INVALID_PARAM);
    assert_string_equal(tern_last_error(), "unknown dtype 10");
    t = view(buf, (tern_dtype_t)-1, 2, sh, contig);
    assert_int_equal(tern_tensor_validate(&t), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_validate(NULL), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_extent(&t, NULL), TERN_ERR_INVALID_PARAM);
}

static void check_gather(const tern_tensor_t *t)
{
    size_t nbytes;
    assert_int_equal(tern_tensor_nbytes(t, &nbytes), TERN_OK);
    unsigned char *got = malloc(nbytes + 1), *want = malloc(nbytes + 1);
    assert_non_null(got);
    assert_non_null(want);
    memset(got, 0xee, nbytes + 1);
    tt_ref_gather(t, want);
    assert_int_equal(tern_tensor_gather(t, got, nbytes), TERN_OK);
    assert_memory_equal(got, want, nbytes);
    assert_int_equal(got[nbytes], 0xee); /* nothing past nbytes */
    free(got);
    free(want);
}

static void test_gather_cases(void **state)
{
    static int64_t src[4096];
    (void)state;
    tt_fill(src, sizeof(src), 1);
    struct {
        int32_t ndim;
        int64_t shape[4], strides[4];
    } cases[] = {
        {0, {0}, {0}},
        {1, {7}, {1}},
        {1, {7}, {3}},
        {1, {7}, {0}},                   /* one element repeated */
        {2, {5, 6}, {1, 5}},             /* transposed */
        {2, {5, 6}, {12, 2}},            /* every other column, rows with gaps */
        {2, {5, 6}, {0, 1}},             /* broadcast rows */
        {2, {5, 6}, {1, 0}},             /* broadcast columns */
        {3, {2, 3, 4}, {12, 4, 1}},      /* contiguous */
        {3, {2, 3, 4}, {1, 2, 6}},       /* reversed order */
        {3, {2, 3, 4}, {24, 4, 1}},      /* outer gap, inner runs merge */
        {3, {4, 1, 3}, {3, 1000, 1}},    /* size-1 with odd stride */
        {4, {2, 2, 2, 2}, {0, 0, 0, 1}}, /* merged zero strides */
        {4, {3, 1, 2, 5}, {20, 1, 10, 1}},
        {2, {3, 4}, {4, 1}},
    };
    static const tern_dtype_t dts[] = {TERN_DTYPE_U8, TERN_DTYPE_F16, TERN_DTYPE_F32,
                                       TERN_DTYPE_F64};
    for (size_t d = 0; d < ARRAY_LEN(dts); d++) {
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            tern_tensor_t t = view(src, dts[d], cases[i].ndim, cases[i].shape, cases[i].strides);
            size_t e;
            assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
            assert_true(e <= sizeof(src));
            check_gather(&t);
        }
    }
}

/* Random shapes (ndim 0..6, dims 0..5) and strides (0..9), every dtype. */
static void test_gather_random(void **state)
{
    static unsigned char src[1 << 20];
    uint32_t rng = 12345;
    (void)state;
    tt_fill(src, sizeof(src), 2);
    for (int iter = 0; iter < 3000; iter++) {
        tern_tensor_t t;
        memset(&t, 0, sizeof(t));
        t.data = src;
        t.dtype = (tern_dtype_t)(tt_rand(&rng) % TERN_DTYPE_COUNT);
        t.ndim = (int32_t)(tt_rand(&rng) % 7);
        for (int i = 0; i < t.ndim; i++) {
            t.shape[i] = tt_rand(&rng) % 6;
            if (tt_rand(&rng) % 8 != 0 && t.shape[i] == 0)
                t.shape[i] = 1 + tt_rand(&rng) % 5;
            t.strides[i] = tt_rand(&rng) % 10;
        }
        if (tt_rand(&rng) % 4 == 0) /* some plain contiguous ones */
            assert_int_equal(tern_tensor_init(&t, src, t.dtype, t.ndim, t.shape, tern_device_cpu()),
                             TERN_OK);
        size_t e;
        assert_int_equal(tern_tensor_extent(&t, &e), TERN_OK);
        if (e > sizeof(src))
            continue;
        check_gather(&t);
    }
}

static void test_gather_errors(void **state)
{
    int32_t src[12], dst[12];
    int64_t sh[] = {3, 4};
    tern_tensor_t t;
    (void)state;
    assert_int_equal(tern_tensor_init(&t, src, TERN_DTYPE_I32, 2, sh, tern_device_cpu()), TERN_OK);
    assert_int_equal(tern_tensor_gather(&t, dst, sizeof(dst) - 1), TERN_ERR_TRUNCATED);
    assert_string_equal(tern_last_error(), "gather needs 48 bytes, buffer has 47");
    assert_int_equal(tern_tensor_gather(&t, NULL, sizeof(dst)), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_gather(&t, src + 4, sizeof(dst)), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_gather(&t, src, sizeof(dst)), TERN_ERR_INVALID_PARAM);
    t.device = tern_device_cuda(0);
    assert_int_equal(tern_tensor_gather(&t, dst, sizeof(dst)), TERN_ERR_UNSUPPORTED);
    t.device = tern_device_cpu();
    t.data = NULL;
    assert_int_equal(tern_tensor_gather(&t, dst, sizeof(dst)), TERN_ERR_INVALID_PARAM);
    /* No element: nothing to write, any buffer. */
    int64_t z[] = {0, 4};
    assert_int_equal(tern_tensor_init(&t, NULL, TERN_DTYPE_I32, 2, z, tern_device_cpu()), TERN_OK);
    assert_int_equal(tern_tensor_gather(&t, NULL, 0), TERN_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_size_and_name),
        cmocka_unit_test(test_dtype_parse),
        cmocka_unit_test(test_device_parse),
        cmocka_unit_test(test_device_format),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_numel_nbytes_overflow),
        cmocka_unit_test(test_contiguity),
        cmocka_unit_test(test_validate_and_extent),
        cmocka_unit_test(test_gather_cases),
        cmocka_unit_test(test_gather_random),
        cmocka_unit_test(test_gather_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
