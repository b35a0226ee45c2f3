/* DLPack interchange: dtype and device mapping, round trips, rejections, managed tensors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <tern/dlpack.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const struct {
    uint8_t code, bits;
    tern_dtype_t dtype;
} mapping[] = {
    {kDLFloat, 16, TERN_DTYPE_F16}, {kDLBfloat, 16, TERN_DTYPE_BF16},
    {kDLFloat, 32, TERN_DTYPE_F32}, {kDLFloat, 64, TERN_DTYPE_F64},
    {kDLInt, 8, TERN_DTYPE_I8},     {kDLInt, 16, TERN_DTYPE_I16},
    {kDLInt, 32, TERN_DTYPE_I32},   {kDLInt, 64, TERN_DTYPE_I64},
    {kDLUInt, 8, TERN_DTYPE_U8},    {6 /* kDLBool */, 8, TERN_DTYPE_BOOL},
};

/* A CPU DLTensor over data with the given shape, strides NULL. */
static DLTensor dl_cpu(void *data, int ndim, int64_t *shape, uint8_t code, uint8_t bits)
{
    DLTensor d;
    memset(&d, 0, sizeof(d));
    d.data = data;
    d.device.device_type = kDLCPU;
    d.device.device_id = 0;
    d.ndim = ndim;
    d.dtype.code = code;
    d.dtype.bits = bits;
    d.dtype.lanes = 1;
    d.shape = shape;
    return d;
}

static void test_dtype_mapping(void **state)
{
    static char data[64];
    int64_t shape[] = {2, 3};
    (void)state;
    assert_int_equal(ARRAY_LEN(mapping), TERN_DTYPE_COUNT);
    for (size_t i = 0; i < ARRAY_LEN(mapping); i++) {
        DLTensor d = dl_cpu(data, 2, shape, mapping[i].code, mapping[i].bits);
        tern_tensor_t t;
        assert_int_equal(tern_tensor_from_dlpack(&d, &t), TERN_OK);
        assert_int_equal(t.dtype, mapping[i].dtype);
        assert_int_equal(tern_dtype_size(t.dtype) * 8, mapping[i].bits);
        /* and back */
        DLTensor back;
        int64_t sh[2], st[2];
        assert_int_equal(tern_tensor_to_dlpack(&t, &back, sh, st), TERN_OK);
        assert_int_equal(back.dtype.code, mapping[i].code);
        assert_int_equal(back.dtype.bits, mapping[i].bits);
        assert_int_equal(back.dtype.lanes, 1);
    }
}

static void test_from_dlpack(void **state)
{
    static float data[64];
    int64_t shape[] = {4, 5};
    tern_tensor_t t;
    (void)state;

    /* NULL strides: contiguous. */
    DLTensor d = dl_cpu(data, 2, shape, kDLFloat, 32);
    assert_int_equal(tern_tensor_from_dlpack(&d, &t), TERN_OK);
    assert_ptr_equal(t.data, data);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 4);
    assert_int_equal(t.shape[1], 5);
    assert_int_equal(t.strides[0], 5);
    assert_int_equal(t.strides[1], 1);
    assert_int_equal(t.device.type, TERN_DEVICE_CPU);
    assert_true(tern_tensor_is_contiguous(&t));

    /* Explicit strides (a transpose) and byte_offset. */
    int64_t strides[] = {1, 4};
    d.strides = strides;
    d.byte_offset = 3 * sizeof(float);
    assert_int_equal(tern_tensor_from_dlpack(&d, &t), TERN_OK);
    assert_ptr_equal(t.data, data + 3);
    assert_int_equal(t.strides[0], 1);
    assert_int_equal(t.strides[1], 4);
    assert_false(tern_tensor_is_contiguous(&t));

    /* Devices: pinned host memory is CPU; CUDA keeps its id. */
    d.device.device_type = kDLCUDAHost;
    assert_int_equal(tern_tensor_from_dlpack(&d, &t), TERN_OK);
    assert_int_equal(t.device.type, TERN_DEVICE_CPU);
    assert_int_equal(t.device.index, 0);
    d.device.device_type = kDLCUDA;
    d.device.device_id = 3;
    assert_int_equal(tern_tensor_from_dlpack(&d, &t), TERN_OK);
    assert_int_equal(t.device.type, TERN_DEVICE_CUDA);
    assert_int_equal(t.device.index, 3);

    /* Scalar with NULL shape; empty tensor with NULL data. */
    DLTensor s = dl_cpu(data, 0, NULL, kDLFloat, 64);
    assert_int_equal(tern_tensor_from_dlpack(&s, &t), TERN_OK);
    assert_int_equal(t.ndim, 0);
    assert_int_equal(t.dtype, TERN_DTYPE_F64);
    int64_t zshape[] = {0, 7};
    DLTensor z = dl_cpu(NULL, 2, zshape, kDLInt, 64);
    assert_int_equal(tern_tensor_from_dlpack(&z, &t), TERN_OK);
    assert_null(t.data);

    /* 16 dimensions is the most. */
    int64_t many[TERN_TENSOR_MAX_DIMS + 1];
    for (int i = 0; i <= TERN_TENSOR_MAX_DIMS; i++)
        many[i] = 1;
    DLTensor m = dl_cpu(data, TERN_TENSOR_MAX_DIMS, many, kDLUInt, 8);
    assert_int_equal(tern_tensor_from_dlpack(&m, &t), TERN_OK);
    assert_int_equal(t.ndim, TERN_TENSOR_MAX_DIMS);
}

/* from_dlpack must fail with status and leave *out alone. */
static void expect_reject(const DLTensor *d, tern_status_t status, const char *detail_part)
{
    tern_tensor_t t, before;
    memset(&t, 0x3c, sizeof(t));
    before = t;
    assert_int_equal(tern_tensor_from_dlpack(d, &t), status);
    assert_memory_equal(&t, &before, sizeof(t));
    if (detail_part != NULL && strstr(tern_last_error(), detail_part) == NULL)
        fail_msg("detail '%s' does not mention '%s'", tern_last_error(), detail_part);
}

static void test_from_dlpack_rejects(void **state)
{
    static float data[64];
    int64_t shape[] = {4, 5};
    (void)state;

    DLTensor d = dl_cpu(data, 2, shape, kDLFloat, 32);
    d.dtype.lanes = 4;
    expect_reject(&d, TERN_ERR_UNSUPPORTED, "4 lanes");
    d.dtype.lanes = 0;
    expect_reject(&d, TERN_ERR_UNSUPPORTED, "lanes");

    static const struct {
        uint8_t code, bits;
        const char *name;
    } bad_types[] = {
        {kDLComplex, 64, "complex"}, {kDLComplex, 128, "complex"}, {kDLOpaqueHandle, 64, "opaque"},
        {kDLUInt, 16, "uint"},       {kDLUInt, 32, "uint"},        {kDLUInt, 64, "uint"},
        {kDLFloat, 8, "float"},      {kDLFloat, 128, "float"},     {kDLBfloat, 32, "bfloat"},
        {kDLInt, 1, "int"},          {kDLInt, 4, "int"},           {6, 1, "bool"},
        {42, 32, "unknown"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad_types); i++) {
        d = dl_cpu(data, 2, shape, bad_types[i].code, bad_types[i].bits);
        expect_reject(&d, TERN_ERR_UNSUPPORTED, bad_types[i].name);
    }
    d = dl_cpu(data, 2, shape, kDLComplex, 64);
    expect_reject(&d, TERN_ERR_UNSUPPORTED,
                  "dlpack dtype code 5 (complex) with 64 bits is not supported");

    static const struct {
        int type;
        const char *name;
    } bad_devices[] = {
        {kDLOpenCL, "kDLOpenCL"}, {kDLVulkan, "kDLVulkan"},
        {kDLMetal, "kDLMetal"},   {kDLVPI, "kDLVPI"},
        {kDLROCM, "kDLROCM"},     {kDLROCMHost, "kDLROCMHost"},
        {kDLExtDev, "kDLExtDev"}, {kDLCUDAManaged, "kDLCUDAManaged"},
        {0, "unknown"},           {99, "unknown"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad_devices); i++) {
        d = dl_cpu(data, 2, shape, kDLFloat, 32);
        d.device.device_type = (DLDeviceType)bad_devices[i].type;
        expect_reject(&d, TERN_ERR_UNSUPPORTED, bad_devices[i].name);
    }
    d = dl_cpu(data, 2, shape, kDLFloat, 32);
    d.device.device_type = kDLCUDA;
    d.device.device_id = -1;
    expect_reject(&d, TERN_ERR_INVALID_PARAM, "-1");

    /* Shape, strides, ndim. */
    int64_t many[TERN_TENSOR_MAX_DIMS + 1];
    for (int i = 0; i <= TERN_TENSOR_MAX_DIMS; i++)
        many[i] = 1;
    d = dl_cpu(data, TERN_TENSOR_MAX_DIMS + 1, many, kDLFloat, 32);
    expect_reject(&d, TERN_ERR_UNSUPPORTED, "ndim 17");
    d = dl_cpu(data, -1, shape, kDLFloat, 32);
    expect_reject(&d, TERN_ERR_INVALID_PARAM, "ndim -1");
    d = dl_cpu(data, 2, NULL, kDLFloat, 32);
    expect_reject(&d, TERN_ERR_INVALID_PARAM, "shape is NULL");
    int64_t neg_shape[] = {4, -5};
    d = dl_cpu(data, 2, neg_shape, kDLFloat, 32);
    expect_reject(&d, TERN_ERR_INVALID_PARAM, "negative size");
    int64_t neg_strides[] = {-5, 1};
    d = dl_cpu(data, 2, shape, kDLFloat, 32);
    d.strides = neg_strides;
    expect_reject(&d, TERN_ERR_UNSUPPORTED, "negative stride");
    int64_t huge_shape[] = {INT64_C(1) << 40, INT64_C(1) << 40};
    d = dl_cpu(data, 2, huge_shape, kDLFloat, 32);
    expect_reject(&d, TERN_ERR_OUT_OF_RANGE, "overflows");
    int64_t huge_strides[] = {INT64_MAX / 2, 1};
    d = dl_cpu(data, 2, shape, kDLFloat, 32);
    d.strides = huge_strides;
    expect_reject(&d, TERN_ERR_OUT_OF_RANGE, NULL);

    /* Data and offset. */
    d = dl_cpu(NULL, 2, shape, kDLFloat, 32);
    expect_reject(&d, TERN_ERR_INVALID_PARAM, "NULL");
    d = dl_cpu(data, 2, shape, kDLFloat, 32);
    d.byte_offset = UINT64_MAX - 8;
    expect_reject(&d, TERN_ERR_OUT_OF_RANGE, "byte_offset");
    expect_reject(NULL, TERN_ERR_INVALID_PARAM, NULL);
    d = dl_cpu(data, 2, shape, kDLFloat, 32);
    assert_int_equal(tern_tensor_from_dlpack(&d, NULL), TERN_ERR_INVALID_PARAM);
}

static void test_to_dlpack(void **state)
{
    static int32_t data[60];
    int64_t shape[] = {3, 4, 5};
    tern_tensor_t t;
    (void)state;
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_I32, 3, shape, tern_device_cuda(2)),
                     TERN_OK);
    t.strides[0] = 1; /* some strided view: dimension 0 interleaved */
    t.strides[1] = 15;
    t.strides[2] = 3;
    DLTensor d;
    int64_t sh[3], st[3];
    assert_int_equal(tern_tensor_to_dlpack(&t, &d, sh, st), TERN_OK);
    assert_ptr_equal(d.data, data);
    assert_int_equal(d.device.device_type, kDLCUDA);
    assert_int_equal(d.device.device_id, 2);
    assert_int_equal(d.ndim, 3);
    assert_int_equal(d.dtype.code, kDLInt);
    assert_int_equal(d.dtype.bits, 32);
    assert_int_equal(d.dtype.lanes, 1);
    assert_ptr_equal(d.shape, sh);
    assert_ptr_equal(d.strides, st);
    assert_int_equal(d.byte_offset, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sh[i], t.shape[i]);
        assert_int_equal(st[i], t.strides[i]);
    }
    /* And back: the same descriptor. */
    tern_tensor_t back;
    assert_int_equal(tern_tensor_from_dlpack(&d, &back), TERN_OK);
    assert_memory_equal(&back, &t, sizeof(t));

    /* CPU; scalar needs no storage. */
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_BOOL, 0, NULL, tern_device_cpu()),
                     TERN_OK);
    assert_int_equal(tern_tensor_to_dlpack(&t, &d, NULL, NULL), TERN_OK);
    assert_int_equal(d.device.device_type, kDLCPU);
    assert_int_equal(d.dtype.code, TERN_DLPACK_CODE_BOOL);
    assert_int_equal(d.dtype.bits, 8);
    assert_null(d.shape);
    assert_null(d.strides);

    /* Errors: nothing written. */
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_I32, 3, shape, tern_device_cpu()),
                     TERN_OK);
    DLTensor before;
    memset(&d, 0x11, sizeof(d));
    before = d;
    assert_int_equal(tern_tensor_to_dlpack(&t, &d, NULL, st), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_to_dlpack(&t, &d, sh, NULL), TERN_ERR_INVALID_PARAM);
    t.strides[0] = -1;
    assert_int_equal(tern_tensor_to_dlpack(&t, &d, sh, st), TERN_ERR_UNSUPPORTED);
    t.strides[0] = 20;
    t.data = NULL;
    assert_int_equal(tern_tensor_to_dlpack(&t, &d, sh, st), TERN_ERR_INVALID_PARAM);
    assert_memory_equal(&d, &before, sizeof(d));
    assert_int_equal(tern_tensor_to_dlpack(NULL, &d, sh, st), TERN_ERR_INVALID_PARAM);
    assert_int_equal(tern_tensor_to_dlpack(&t, NULL, sh, st), TERN_ERR_INVALID_PARAM);
}

/* Every dtype, several ranks and devices: tern -> DLPack -> tern is the identity. */
static void test_round_trips(void **state)
{
    static char data[4096];
    (void)state;
    for (int dt = 0; dt < TERN_DTYPE_COUNT; dt++) {
        for (int ndim = 0; ndim <= TERN_TENSOR_MAX_DIMS; ndim++) {
            int64_t shape[TERN_TENSOR_MAX_DIMS];
            for (int i = 0; i < ndim; i++)
                shape[i] = i % 5 == 0 ? 2 : 1;
            tern_tensor_t t, back;
            tern_device_t dev = ndim % 2 ? tern_device_cuda(ndim) : tern_device_cpu();
            assert_int_equal(tern_tensor_init(&t, data, (tern_dtype_t)dt, ndim, shape, dev),
                             TERN_OK);
            DLTensor d;
            int64_t sh[TERN_TENSOR_MAX_DIMS], st[TERN_TENSOR_MAX_DIMS];
            assert_int_equal(tern_tensor_to_dlpack(&t, &d, sh, st), TERN_OK);
            assert_int_equal(tern_tensor_from_dlpack(&d, &back), TERN_OK);
            assert_memory_equal(&back, &t, sizeof(t));
        }
    }
}

static int releases;
static void *released_arg;

static void count_release(void *arg)
{
    releases++;
    released_arg = arg;
}

static void test_managed(void **state)
{
    int64_t shape[] = {2, 8};
    tern_tensor_t t;
    (void)state;
    double *data = malloc(16 * sizeof(double));
    assert_non_null(data);
    assert_int_equal(tern_tensor_init(&t, data, TERN_DTYPE_F64, 2, shape, tern_device_cpu()),
                     TERN_OK);
    DLManagedTensor *m = NULL;
    releases = 0;
    assert_int_equal(tern_tensor_to_dlpack_managed(&t, count_release, data, &m), TERN_OK);
    assert_non_null(m);
    assert_non_null(m->deleter);
    assert_ptr_equal(m->dl_tensor.data, data);
    assert_int_equal(m->dl_tensor.ndim, 2);
    assert_int_equal(m->dl_tensor.shape[0], 2);
    assert_int_equal(m->dl_tensor.shape[1], 8);
    assert_int_equal(m->dl_tensor.strides[0], 8);
    assert_int_equal(m->dl_tensor.strides[1], 1);
    /* The descriptor is independent of t once made. */
    memset(&t, 0, sizeof(t));
    tern_tensor_t back;
    assert_int_equal(tern_tensor_from_dlpack(&m->dl_tensor, &back), TERN_OK);
    assert_int_equal(back.shape[1], 8);
    assert_int_equal(releases, 0);
    m->deleter(m); /* frees the block (ASan checks) and releases once */
    assert_int_equal(releases, 1);
    assert_ptr_equal(released_arg, data);
    free(data);

    /* No release function. */
    int64_t one[] = {1};
    static float f;
    assert_int_equal(tern_tensor_init(&t, &f, TERN_DTYPE_F32, 1, one, tern_device_cpu()), TERN_OK);
    assert_int_equal(tern_tensor_to_dlpack_managed(&t, NULL, NULL, &m), TERN_OK);
    m->deleter(m);

    /* Errors: release never called, nothing allocated. */
    releases = 0;
    t.strides[0] = -1;
    m = NULL;
    assert_int_equal(tern_tensor_to_dlpack_managed(&t, count_release, NULL, &m),
                     TERN_ERR_UNSUPPORTED);
    assert_null(m);
    assert_int_equal(tern_tensor_to_dlpack_managed(&t, count_release, NULL, NULL),
                     TERN_ERR_INVALID_PARAM);
    assert_int_equal(releases, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_mapping),       cmocka_unit_test(test_from_dlpack),
        cmocka_unit_test(test_from_dlpack_rejects), cmocka_unit_test(test_to_dlpack),
        cmocka_unit_test(test_round_trips),         cmocka_unit_test(test_managed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
