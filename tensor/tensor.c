/* Element types, devices, descriptor checks and the strided gather. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "tensor/host.h"
#include "tensor/priv.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[TERN_DTYPE_COUNT] = {
    [TERN_DTYPE_F16] = {"f16", 2},   [TERN_DTYPE_BF16] = {"bf16", 2}, [TERN_DTYPE_F32] = {"f32", 4},
    [TERN_DTYPE_F64] = {"f64", 8},   [TERN_DTYPE_I8] = {"i8", 1},     [TERN_DTYPE_I16] = {"i16", 2},
    [TERN_DTYPE_I32] = {"i32", 4},   [TERN_DTYPE_I64] = {"i64", 8},   [TERN_DTYPE_U8] = {"u8", 1},
    [TERN_DTYPE_BOOL] = {"bool", 1},
};

/* PyTorch's names (torch.<name>) for the same types. */
static const struct {
    const char *name;
    tern_dtype_t dtype;
} torch_names[] = {
    {"float16", TERN_DTYPE_F16}, {"half", TERN_DTYPE_F16},  {"bfloat16", TERN_DTYPE_BF16},
    {"float32", TERN_DTYPE_F32}, {"float", TERN_DTYPE_F32}, {"float64", TERN_DTYPE_F64},
    {"double", TERN_DTYPE_F64},  {"int8", TERN_DTYPE_I8},   {"int16", TERN_DTYPE_I16},
    {"short", TERN_DTYPE_I16},   {"int32", TERN_DTYPE_I32}, {"int", TERN_DTYPE_I32},
    {"int64", TERN_DTYPE_I64},   {"long", TERN_DTYPE_I64},  {"uint8", TERN_DTYPE_U8},
};

/* Compared as unsigned: the enum's type may be signed or not. */
static bool dtype_known(tern_dtype_t dtype)
{
    return (unsigned)dtype < TERN_DTYPE_COUNT;
}

size_t tern_dtype_size(tern_dtype_t dtype)
{
    return dtype_known(dtype) ? dtypes[dtype].size : 0;
}

const char *tern_dtype_name(tern_dtype_t dtype)
{
    return dtype_known(dtype) ? dtypes[dtype].name : "unknown";
}

tern_status_t tern_dtype_parse(const char *name, tern_dtype_t *out)
{
    if (name == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "dtype parse: NULL %s",
                           name == NULL ? "name" : "output");
    for (int d = 0; d < TERN_DTYPE_COUNT; d++) {
        if (strcmp(name, dtypes[d].name) == 0) {
            *out = (tern_dtype_t)d;
            return TERN_OK;
        }
    }
    for (size_t i = 0; i < sizeof(torch_names) / sizeof(torch_names[0]); i++) {
        if (strcmp(name, torch_names[i].name) == 0) {
            *out = torch_names[i].dtype;
            return TERN_OK;
        }
    }
    return tern__error(TERN_ERR_INVALID_PARAM, "unknown dtype name '%.64s'", name);
}

tern_device_t tern_device_cpu(void)
{
    tern_device_t d = {TERN_DEVICE_CPU, 0};
    return d;
}

tern_device_t tern_device_cuda(int32_t index)
{
    tern_device_t d = {TERN_DEVICE_CUDA, index};
    return d;
}

/* Records why device is invalid; TERN_OK when it is valid. */
static tern_status_t check_device(tern_device_t device)
{
    switch (device.type) {
    case TERN_DEVICE_CPU:
        if (device.index != 0)
            return tern__error(TERN_ERR_INVALID_PARAM,
                               "cpu device with index %" PRId32 " (must be 0)", device.index);
        return TERN_OK;
    case TERN_DEVICE_CUDA:
        if (device.index < 0)
            return tern__error(TERN_ERR_INVALID_PARAM, "cuda device index %" PRId32 " is negative",
                               device.index);
        return TERN_OK;
    }
    return tern__error(TERN_ERR_INVALID_PARAM, "unknown device type %d", (int)device.type);
}

tern_status_t tern_device_parse(const char *str, tern_device_t *out)
{
    if (str == NULL || out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "device parse: NULL %s",
                           str == NULL ? "string" : "output");
    if (strcmp(str, "cpu") == 0) {
        *out = tern_device_cpu();
        return TERN_OK;
    }
    if (strcmp(str, "cuda") == 0)
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "device 'cuda' needs an index: say which, as 'cuda:N'");
    if (strncmp(str, "cuda:", 5) != 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "device '%.64s' is not 'cpu' or 'cuda:N'", str);
    const char *p = str + 5;
    int64_t v = 0;
    size_t n = 0;
    for (; p[n] >= '0' && p[n] <= '9'; n++) {
        v = v * 10 + (p[n] - '0');
        if (v > INT32_MAX)
            return tern__error(TERN_ERR_INVALID_PARAM, "device '%.64s': index is over %d", str,
                               INT32_MAX);
    }
    if (n == 0 || p[n] != '\0' || (n > 1 && p[0] == '0'))
        return tern__error(TERN_ERR_INVALID_PARAM,
                           "device '%.64s': index after 'cuda:' must be a decimal number "
                           "without sign or leading zeros",
                           str);
    *out = tern_device_cuda((int32_t)v);
    return TERN_OK;
}

tern_status_t tern_device_format(tern_device_t device, char *buf, size_t cap)
{
    tern_status_t st = check_device(device);
    if (st != TERN_OK)
        return st;
    if (buf == NULL && cap > 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "device format: NULL buffer of %zu bytes", cap);
    char tmp[TERN_DEVICE_STR_MAX];
    int n = device.type == TERN_DEVICE_CPU
                ? snprintf(tmp, sizeof(tmp), "cpu")
                : snprintf(tmp, sizeof(tmp), "cuda:%" PRId32, device.index);
    if (n < 0 || (size_t)n >= cap) {
        if (cap > 0)
            buf[0] = '\0';
        return tern__error(TERN_ERR_TRUNCATED, "device '%s' needs %d bytes, buffer has %zu", tmp,
                           n + 1, cap);
    }
    memcpy(buf, tmp, (size_t)n + 1);
    return TERN_OK;
}

int tern__tensor_shape_product(int32_t ndim, const int64_t *shape, int64_t *prod, bool *has_zero)
{
    int64_t p = 1;
    bool zero = false;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return i;
        if (shape[i] == 0) {
            zero = true;
            continue;
        }
        if (__builtin_mul_overflow(p, shape[i], &p))
            return i;
    }
    *prod = p;
    *has_zero = zero;
    return -1;
}

void tern__tensor_contiguous_strides(int32_t ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int32_t i = TERN_TENSOR_MAX_DIMS - 1; i >= 0; i--) {
        if (i >= ndim) {
            strides[i] = 0;
            continue;
        }
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

/* Records why the shape is invalid; on success *numel is the element count. */
static tern_status_t check_shape(const tern_tensor_t *t, int64_t *numel)
{
    if (t == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor is NULL");
    if (t->ndim < 0 || t->ndim > TERN_TENSOR_MAX_DIMS)
        return tern__error(TERN_ERR_INVALID_PARAM, "ndim %" PRId32 " is out of range [0, %d]",
                           t->ndim, TERN_TENSOR_MAX_DIMS);
    int64_t prod = 0;
    bool zero = false;
    int bad = tern__tensor_shape_product(t->ndim, t->shape, &prod, &zero);
    if (bad >= 0 && t->shape[bad] < 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "dimension %d has negative size %" PRId64, bad,
                           t->shape[bad]);
    if (bad >= 0)
        return tern__error(TERN_ERR_OUT_OF_RANGE,
                           "shape overflows int64 at dimension %d (size %" PRId64 ")", bad,
                           t->shape[bad]);
    *numel = zero ? 0 : prod;
    return TERN_OK;
}

/* Element count times element size, checked; the dtype is known. */
static tern_status_t check_nbytes(const tern_tensor_t *t, int64_t numel, size_t *nbytes)
{
    int64_t n = 0;
    if (__builtin_mul_overflow(numel, (int64_t)dtypes[t->dtype].size, &n) || (uint64_t)n > SIZE_MAX)
        return tern__error(TERN_ERR_OUT_OF_RANGE,
                           "byte count overflows: %" PRId64 " elements of %zu bytes", numel,
                           dtypes[t->dtype].size);
    *nbytes = (size_t)n;
    return TERN_OK;
}

/* The bytes the strides span, checked; shape and dtype are valid. */
static tern_status_t check_extent(const tern_tensor_t *t, int64_t numel, size_t *extent)
{
    int64_t last = 0; /* offset of the last element, in elements */
    for (int32_t i = 0; i < t->ndim; i++) {
        if (t->strides[i] < 0)
            return tern__error(TERN_ERR_UNSUPPORTED,
                               "dimension %" PRId32 " has negative stride %" PRId64
                               " (negative strides are not supported)",
                               i, t->strides[i]);
    }
    if (numel == 0) {
        *extent = 0;
        return TERN_OK;
    }
    int64_t size = (int64_t)dtypes[t->dtype].size;
    for (int32_t i = 0; i < t->ndim; i++) {
        int64_t span = 0;
        if (__builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &span) ||
            __builtin_add_overflow(last, span, &last))
            return tern__error(TERN_ERR_OUT_OF_RANGE,
                               "strides span more than int64 elements at dimension %" PRId32
                               " (size %" PRId64 ", stride %" PRId64 ")",
                               i, t->shape[i], t->strides[i]);
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(last, size, &bytes) || __builtin_add_overflow(bytes, size, &bytes) ||
        (uint64_t)bytes > SIZE_MAX)
        return tern__error(TERN_ERR_OUT_OF_RANGE,
                           "strides span more than int64 bytes (last element at %" PRId64 ")",
                           last);
    *extent = (size_t)bytes;
    return TERN_OK;
}

tern_status_t tern__tensor_check(const tern_tensor_t *t, bool need_data, int64_t *numel_out,
                                 size_t *nbytes_out, size_t *extent_out)
{
    int64_t numel = 0;
    size_t nbytes = 0, extent = 0;
    tern_status_t st = check_shape(t, &numel);
    if (st != TERN_OK)
        return st;
    if (!dtype_known(t->dtype))
        return tern__error(TERN_ERR_INVALID_PARAM, "unknown dtype %d", (int)t->dtype);
    st = check_device(t->device);
    if (st != TERN_OK)
        return st;
    st = check_nbytes(t, numel, &nbytes);
    if (st != TERN_OK)
        return st;
    st = check_extent(t, numel, &extent);
    if (st != TERN_OK)
        return st;
    if (need_data && numel > 0) {
        if (t->data == NULL)
            return tern__error(TERN_ERR_INVALID_PARAM,
                               "tensor data is NULL with %" PRId64 " elements", numel);
        if ((uintptr_t)t->data > UINTPTR_MAX - extent)
            return tern__error(TERN_ERR_OUT_OF_RANGE,
                               "tensor at %p spanning %zu bytes wraps the address space", t->data,
                               extent);
    }
    if (numel_out != NULL)
        *numel_out = numel;
    if (nbytes_out != NULL)
        *nbytes_out = nbytes;
    if (extent_out != NULL)
        *extent_out = extent;
    return TERN_OK;
}

tern_status_t tern_tensor_init(tern_tensor_t *t, void *data, tern_dtype_t dtype, int32_t ndim,
                               const int64_t *shape, tern_device_t device)
{
    if (t == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor init: NULL tensor");
    if (ndim < 0 || ndim > TERN_TENSOR_MAX_DIMS)
        return tern__error(TERN_ERR_INVALID_PARAM, "ndim %" PRId32 " is out of range [0, %d]", ndim,
                           TERN_TENSOR_MAX_DIMS);
    if (shape == NULL && ndim > 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor init: NULL shape with ndim %" PRId32,
                           ndim);
    tern_tensor_t tmp;
    memset(&tmp, 0, sizeof(tmp));
    tmp.data = data;
    tmp.dtype = dtype;
    tmp.ndim = ndim;
    tmp.device = device;
    if (ndim > 0)
        memcpy(tmp.shape, shape, (size_t)ndim * sizeof(shape[0]));
    int64_t numel = 0;
    tern_status_t st = check_shape(&tmp, &numel);
    if (st != TERN_OK)
        return st;
    tern__tensor_contiguous_strides(ndim, tmp.shape, tmp.strides);
    st = tern__tensor_check(&tmp, false, NULL, NULL, NULL);
    if (st != TERN_OK)
        return st;
    *t = tmp;
    return TERN_OK;
}

tern_status_t tern_tensor_numel(const tern_tensor_t *t, int64_t *out)
{
    int64_t numel = 0;
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor numel: NULL output");
    tern_status_t st = check_shape(t, &numel);
    if (st == TERN_OK)
        *out = numel;
    return st;
}

tern_status_t tern_tensor_nbytes(const tern_tensor_t *t, size_t *out)
{
    int64_t numel = 0;
    size_t nbytes = 0;
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor nbytes: NULL output");
    tern_status_t st = check_shape(t, &numel);
    if (st != TERN_OK)
        return st;
    if (!dtype_known(t->dtype))
        return tern__error(TERN_ERR_INVALID_PARAM, "unknown dtype %d", (int)t->dtype);
    st = check_nbytes(t, numel, &nbytes);
    if (st == TERN_OK)
        *out = nbytes;
    return st;
}

tern_status_t tern_tensor_extent(const tern_tensor_t *t, size_t *out)
{
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor extent: NULL output");
    return tern__tensor_check(t, false, NULL, NULL, out);
}

bool tern_tensor_is_contiguous(const tern_tensor_t *t)
{
    if (t == NULL || t->ndim < 0 || t->ndim > TERN_TENSOR_MAX_DIMS)
        return false;
    for (int32_t i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return false;
    }
    for (int32_t i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0)
            return true;
    }
    int64_t expected = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 1)
            continue;
        if (t->strides[i] != expected)
            return false;
        if (__builtin_mul_overflow(expected, t->shape[i], &expected))
            return false;
    }
    return true;
}

tern_status_t tern_tensor_validate(const tern_tensor_t *t)
{
    return tern__tensor_check(t, true, NULL, NULL, NULL);
}

/* Copy n elements of size bytes, src stepping by step bytes (0: repeat one). */
static void copy_strided(unsigned char *dst, const unsigned char *src, int64_t n, int64_t step,
                         size_t size)
{
    switch (size) {
    case 1:
        for (int64_t j = 0; j < n; j++)
            dst[j] = src[j * step];
        break;
    case 2:
        for (int64_t j = 0; j < n; j++)
            memcpy(dst + j * 2, src + j * step, 2);
        break;
    case 4:
        for (int64_t j = 0; j < n; j++)
            memcpy(dst + j * 4, src + j * step, 4);
        break;
    case 8:
        for (int64_t j = 0; j < n; j++)
            memcpy(dst + j * 8, src + j * step, 8);
        break;
    default:
        for (int64_t j = 0; j < n; j++)
            memcpy(dst + (size_t)j * size, src + j * step, size);
        break;
    }
}

void tern__tensor_gather(const tern_tensor_t *t, void *dst_v)
{
    size_t size = dtypes[t->dtype].size;
    unsigned char *dst = dst_v;
    const unsigned char *src = t->data;
    /* Dimensions innermost first, in bytes, with size-1 dimensions dropped and
     * a dimension merged into the inner one when together they are one run.
     * Every product here is bounded by the checked extent or element count. */
    int64_t sh[TERN_TENSOR_MAX_DIMS], st[TERN_TENSOR_MAX_DIMS], idx[TERN_TENSOR_MAX_DIMS];
    int n = 0;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 1)
            continue;
        int64_t bstride = t->strides[i] * (int64_t)size, run;
        if (n > 0 && !__builtin_mul_overflow(sh[n - 1], st[n - 1], &run) && run == bstride) {
            sh[n - 1] *= t->shape[i];
            continue;
        }
        sh[n] = t->shape[i];
        st[n] = bstride;
        idx[n] = 0;
        n++;
    }
    if (n == 0) {
        memcpy(dst, src, size);
        return;
    }
    int64_t off = 0;
    size_t inner = (size_t)sh[0] * size;
    for (;;) {
        if (st[0] == (int64_t)size)
            memcpy(dst, src + off, inner);
        else
            copy_strided(dst, src + off, sh[0], st[0], size);
        dst += inner;
        int k = 1;
        for (; k < n; k++) {
            if (idx[k] + 1 < sh[k]) {
                idx[k]++;
                off += st[k];
                break;
            }
            off -= st[k] * (sh[k] - 1);
            idx[k] = 0;
        }
        if (k >= n)
            return;
    }
}

tern_status_t tern_tensor_gather(const tern_tensor_t *t, void *dst, size_t cap)
{
    int64_t numel = 0;
    size_t nbytes = 0, extent = 0;
    tern_status_t st = tern__tensor_check(t, true, &numel, &nbytes, &extent);
    if (st != TERN_OK)
        return st;
    if (t->device.type != TERN_DEVICE_CPU)
        return tern__error(TERN_ERR_UNSUPPORTED,
                           "gather reads elements on the host; tensor is on cuda:%" PRId32,
                           t->device.index);
    if (cap < nbytes)
        return tern__error(TERN_ERR_TRUNCATED, "gather needs %zu bytes, buffer has %zu", nbytes,
                           cap);
    if (numel == 0)
        return TERN_OK;
    if (dst == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "gather: NULL destination");
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)t->data;
    if (d < s + extent && s < d + nbytes)
        return tern__error(TERN_ERR_INVALID_PARAM, "gather: destination overlaps the tensor");
    tern__tensor_gather(t, dst);
    return TERN_OK;
}

tern_status_t tern__tensor_host(const char *name, const char *what, const tern_tensor_t *t,
                                void **data, size_t *numel)
{
    int64_t n;
    tern_status_t st;
    if (t == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "%s: %s is NULL", name, what);
    if ((st = tern_tensor_validate(t)) != TERN_OK)
        return tern__error(st, "%s: %s: %s", name, what, tern_last_error());
    if (t->device.type != TERN_DEVICE_CPU)
        return tern__error(TERN_ERR_UNSUPPORTED, "%s: %s is not on the CPU (CUDA tensors need "
                           "the GPU transport)", name, what);
    if (!tern_tensor_is_contiguous(t))
        return tern__error(TERN_ERR_UNSUPPORTED, "%s: %s is not contiguous", name, what);
    if ((st = tern_tensor_numel(t, &n)) != TERN_OK)
        return st;
    *data = t->data;
    *numel = (size_t)n;
    return TERN_OK;
}
