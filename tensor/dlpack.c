/* DLPack <-> tern tensor descriptors: no element is copied either way. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <tern/dlpack.h>

#include "core/error.h"
#include "tensor/priv.h"

static const struct {
    uint8_t code;
    uint8_t bits;
    tern_dtype_t dtype;
} dl_dtypes[] = {
    {kDLFloat, 16, TERN_DTYPE_F16}, {kDLBfloat, 16, TERN_DTYPE_BF16},
    {kDLFloat, 32, TERN_DTYPE_F32}, {kDLFloat, 64, TERN_DTYPE_F64},
    {kDLInt, 8, TERN_DTYPE_I8},     {kDLInt, 16, TERN_DTYPE_I16},
    {kDLInt, 32, TERN_DTYPE_I32},   {kDLInt, 64, TERN_DTYPE_I64},
    {kDLUInt, 8, TERN_DTYPE_U8},    {TERN_DLPACK_CODE_BOOL, 8, TERN_DTYPE_BOOL},
};

static const char *dl_code_name(unsigned code)
{
    switch (code) {
    case kDLInt:
        return "int";
    case kDLUInt:
        return "uint";
    case kDLFloat:
        return "float";
    case kDLOpaqueHandle:
        return "opaque handle";
    case kDLBfloat:
        return "bfloat";
    case kDLComplex:
        return "complex";
    case TERN_DLPACK_CODE_BOOL:
        return "bool";
    }
    return "unknown";
}

static const char *dl_device_name(int type)
{
    switch (type) {
    case kDLCPU:
        return "kDLCPU";
    case kDLCUDA:
        return "kDLCUDA";
    case kDLCUDAHost:
        return "kDLCUDAHost";
    case kDLOpenCL:
        return "kDLOpenCL";
    case kDLVulkan:
        return "kDLVulkan";
    case kDLMetal:
        return "kDLMetal";
    case kDLVPI:
        return "kDLVPI";
    case kDLROCM:
        return "kDLROCM";
    case kDLROCMHost:
        return "kDLROCMHost";
    case kDLExtDev:
        return "kDLExtDev";
    case kDLCUDAManaged:
        return "kDLCUDAManaged";
    }
    return "unknown";
}

static tern_status_t map_dtype(DLDataType dt, tern_dtype_t *out)
{
    if (dt.lanes != 1)
        return tern__error(TERN_ERR_UNSUPPORTED,
                           "dlpack dtype with %u lanes (vector types are not supported)",
                           (unsigned)dt.lanes);
    for (size_t i = 0; i < sizeof(dl_dtypes) / sizeof(dl_dtypes[0]); i++) {
        if (dl_dtypes[i].code == dt.code && dl_dtypes[i].bits == dt.bits) {
            *out = dl_dtypes[i].dtype;
            return TERN_OK;
        }
    }
    return tern__error(TERN_ERR_UNSUPPORTED,
                       "dlpack dtype code %u (%s) with %u bits is not supported", (unsigned)dt.code,
                       dl_code_name(dt.code), (unsigned)dt.bits);
}

static tern_status_t map_device(DLDevice dev, tern_device_t *out)
{
    switch ((int)dev.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
        /* Host memory, pinned or not; device_id carries nothing for it. */
        *out = tern_device_cpu();
        return TERN_OK;
    case kDLCUDA:
        if (dev.device_id < 0)
            return tern__error(TERN_ERR_INVALID_PARAM, "dlpack kDLCUDA device id %d is negative",
                               dev.device_id);
        *out = tern_device_cuda(dev.device_id);
        return TERN_OK;
    }
    return tern__error(TERN_ERR_UNSUPPORTED, "dlpack device type %d (%s) is not supported",
                       (int)dev.device_type, dl_device_name((int)dev.device_type));
}

tern_status_t tern_tensor_from_dlpack(const DLTensor *src, tern_tensor_t *out)
{
    if (src == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "from dlpack: NULL %s",
                           src == NULL ? "DLTensor" : "output");
    if (src->ndim < 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "dlpack ndim %d is negative", src->ndim);
    if (src->ndim > TERN_TENSOR_MAX_DIMS)
        return tern__error(TERN_ERR_UNSUPPORTED, "dlpack ndim %d exceeds tern's maximum %d",
                           src->ndim, TERN_TENSOR_MAX_DIMS);
    if (src->shape == NULL && src->ndim > 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "dlpack shape is NULL with ndim %d", src->ndim);
    tern_tensor_t t;
    memset(&t, 0, sizeof(t));
    tern_status_t st = map_dtype(src->dtype, &t.dtype);
    if (st != TERN_OK)
        return st;
    st = map_device(src->device, &t.device);
    if (st != TERN_OK)
        return st;
    t.ndim = src->ndim;
    if (t.ndim > 0)
        memcpy(t.shape, src->shape, (size_t)t.ndim * sizeof(t.shape[0]));
    if (src->strides != NULL) {
        if (t.ndim > 0)
            memcpy(t.strides, src->strides, (size_t)t.ndim * sizeof(t.strides[0]));
    } else {
        int64_t prod = 0;
        bool zero = false;
        int bad = tern__tensor_shape_product(t.ndim, t.shape, &prod, &zero);
        if (bad >= 0)
            return tern__tensor_check(&t, false, NULL, NULL, NULL); /* records which */
        tern__tensor_contiguous_strides(t.ndim, t.shape, t.strides);
    }
    uintptr_t base = (uintptr_t)src->data;
    if (src->byte_offset > UINTPTR_MAX - base)
        return tern__error(TERN_ERR_OUT_OF_RANGE,
                           "dlpack data %p + byte_offset %" PRIu64 " wraps the address space",
                           src->data, src->byte_offset);
    t.data = src->byte_offset == 0 ? src->data : (void *)(base + (uintptr_t)src->byte_offset);
    st = tern__tensor_check(&t, true, NULL, NULL, NULL);
    if (st != TERN_OK)
        return st;
    *out = t;
    return TERN_OK;
}

/* DLPack's (code, bits) for a known dtype. */
static DLDataType dl_dtype(tern_dtype_t dtype)
{
    DLDataType dt = {0, 0, 1};
    for (size_t i = 0; i < sizeof(dl_dtypes) / sizeof(dl_dtypes[0]); i++) {
        if (dl_dtypes[i].dtype == dtype) {
            dt.code = dl_dtypes[i].code;
            dt.bits = dl_dtypes[i].bits;
        }
    }
    return dt;
}

/* Fill out from a checked t; shape and strides point where the caller says. */
static void fill_dl(const tern_tensor_t *t, DLTensor *out, int64_t *shape, int64_t *strides)
{
    memset(out, 0, sizeof(*out));
    out->data = t->data;
    if (t->device.type == TERN_DEVICE_CUDA) {
        out->device.device_type = kDLCUDA;
        out->device.device_id = t->device.index;
    } else {
        out->device.device_type = kDLCPU;
        out->device.device_id = 0;
    }
    out->ndim = t->ndim;
    out->dtype = dl_dtype(t->dtype);
    if (t->ndim > 0) {
        memcpy(shape, t->shape, (size_t)t->ndim * sizeof(shape[0]));
        memcpy(strides, t->strides, (size_t)t->ndim * sizeof(strides[0]));
        out->shape = shape;
        out->strides = strides;
    }
    out->byte_offset = 0;
}

tern_status_t tern_tensor_to_dlpack(const tern_tensor_t *t, DLTensor *out, int64_t *shape_storage,
                                    int64_t *stride_storage)
{
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "to dlpack: NULL output");
    tern_status_t st = tern__tensor_check(t, true, NULL, NULL, NULL);
    if (st != TERN_OK)
        return st;
    if (t->ndim > 0 && (shape_storage == NULL || stride_storage == NULL))
        return tern__error(TERN_ERR_INVALID_PARAM, "to dlpack: NULL %s storage with ndim %" PRId32,
                           shape_storage == NULL ? "shape" : "stride", t->ndim);
    fill_dl(t, out, shape_storage, stride_storage);
    return TERN_OK;
}

/* One allocation: the managed tensor first (so the deleter's pointer is the
 * block), then its shape and strides. */
typedef struct managed {
    DLManagedTensor dl;
    tern_dlpack_release_fn release;
    void *release_arg;
    int64_t shape[TERN_TENSOR_MAX_DIMS];
    int64_t strides[TERN_TENSOR_MAX_DIMS];
} managed_t;

static void managed_delete(DLManagedTensor *self)
{
    if (self == NULL)
        return;
    managed_t *m = self->manager_ctx;
    if (m->release != NULL)
        m->release(m->release_arg);
    free(m);
}

tern_status_t tern_tensor_to_dlpack_managed(const tern_tensor_t *t, tern_dlpack_release_fn release,
                                            void *release_arg, DLManagedTensor **out)
{
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "to dlpack managed: NULL output");
    tern_status_t st = tern__tensor_check(t, true, NULL, NULL, NULL);
    if (st != TERN_OK)
        return st;
    managed_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return tern__error(TERN_ERR_NO_MEMORY, "to dlpack managed: %zu bytes", sizeof(*m));
    fill_dl(t, &m->dl.dl_tensor, m->shape, m->strides);
    m->dl.manager_ctx = m;
    m->dl.deleter = managed_delete;
    m->release = release;
    m->release_arg = release_arg;
    *out = &m->dl;
    return TERN_OK;
}
