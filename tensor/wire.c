/*
 * The tensor wire form (docs/tensor.md): a 16-byte header, ndim little-endian
 * 64-bit dimensions, then (full form) the contiguous payload. Every integer is
 * written and read a byte at a time, so host byte order and alignment never
 * matter and no struct is copied onto the wire.
 */
#include <inttypes.h>
#include <string.h>

#include "core/bytes.h"
#include "core/error.h"
#include "tensor/priv.h"

/* "TNSR" */
static const unsigned char wire_magic[4] = {0x54, 0x4e, 0x53, 0x52};

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_DTYPE = 5,
    OFF_NDIM = 6,
    OFF_DEVTYPE = 7,
    OFF_DEVINDEX = 8,
    OFF_RESERVED = 12,
    OFF_SHAPE = 16,
    HEADER_SIZE = 16,
};

size_t tern_tensor_wire_desc_size(int32_t ndim)
{
    if (ndim < 0 || ndim > TERN_TENSOR_MAX_DIMS)
        return 0;
    return TERN_TENSOR_WIRE_DESC_SIZE(ndim);
}

tern_status_t tern_tensor_wire_size(const tern_tensor_t *t, size_t *out)
{
    size_t nbytes = 0, total = 0;
    if (out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor wire size: NULL output");
    tern_status_t st = tern_tensor_nbytes(t, &nbytes);
    if (st != TERN_OK)
        return st;
    if (__builtin_add_overflow(nbytes, TERN_TENSOR_WIRE_DESC_SIZE(t->ndim), &total) ||
        total > (size_t)INT64_MAX)
        return tern__error(TERN_ERR_OUT_OF_RANGE,
                           "tensor wire size overflows: payload of %zu bytes", nbytes);
    *out = total;
    return TERN_OK;
}

/* Write t's descriptor (checked) to p, which has its size. */
static void write_desc(const tern_tensor_t *t, unsigned char *p)
{
    memcpy(p + OFF_MAGIC, wire_magic, sizeof(wire_magic));
    p[OFF_VERSION] = TERN_TENSOR_WIRE_VERSION;
    p[OFF_DTYPE] = (unsigned char)t->dtype;
    p[OFF_NDIM] = (unsigned char)t->ndim;
    p[OFF_DEVTYPE] = (unsigned char)t->device.type;
    tern__put_le32(p + OFF_DEVINDEX, (uint32_t)t->device.index);
    tern__put_le32(p + OFF_RESERVED, 0);
    for (int32_t i = 0; i < t->ndim; i++)
        tern__put_le64(p + OFF_SHAPE + 8 * (size_t)i, (uint64_t)t->shape[i]);
}

static tern_status_t check_out(const void *buf, size_t cap, const size_t *len)
{
    if (len == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor encode: NULL length output");
    if (buf == NULL && cap > 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor encode: NULL buffer of %zu bytes", cap);
    return TERN_OK;
}

tern_status_t tern_tensor_encode_desc(const tern_tensor_t *t, void *buf, size_t cap, size_t *len)
{
    tern_status_t st = check_out(buf, cap, len);
    if (st != TERN_OK)
        return st;
    st = tern__tensor_check(t, false, NULL, NULL, NULL);
    if (st != TERN_OK)
        return st;
    size_t need = TERN_TENSOR_WIRE_DESC_SIZE(t->ndim);
    if (cap < need) {
        *len = need;
        return tern__error(TERN_ERR_TRUNCATED, "tensor descriptor needs %zu bytes, buffer has %zu",
                           need, cap);
    }
    write_desc(t, buf);
    *len = need;
    return TERN_OK;
}

tern_status_t tern_tensor_encode(const tern_tensor_t *t, void *buf, size_t cap, size_t *len)
{
    int64_t numel = 0;
    size_t nbytes = 0, extent = 0, need = 0;
    tern_status_t st = check_out(buf, cap, len);
    if (st != TERN_OK)
        return st;
    st = tern__tensor_check(t, true, &numel, &nbytes, &extent);
    if (st != TERN_OK)
        return st;
    if (t->device.type != TERN_DEVICE_CPU)
        return tern__error(TERN_ERR_UNSUPPORTED,
                           "tensor encode reads the payload on the host; tensor is on cuda:%" PRId32
                           " (send the descriptor with tern_tensor_encode_desc and the payload "
                           "separately)",
                           t->device.index);
    size_t desc = TERN_TENSOR_WIRE_DESC_SIZE(t->ndim);
    if (__builtin_add_overflow(desc, nbytes, &need) || need > (size_t)INT64_MAX)
        return tern__error(TERN_ERR_OUT_OF_RANGE,
                           "tensor wire size overflows: payload of %zu bytes", nbytes);
    if (cap < need) {
        *len = need;
        return tern__error(TERN_ERR_TRUNCATED, "tensor encoding needs %zu bytes, buffer has %zu",
                           need, cap);
    }
    uintptr_t b = (uintptr_t)buf, d = (uintptr_t)t->data;
    if (numel > 0 && b < d + extent && d < b + need)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor encode: buffer overlaps the tensor");
    unsigned char *p = buf;
    write_desc(t, p);
    if (numel > 0)
        tern__tensor_gather(t, p + desc);
    *len = need;
    return TERN_OK;
}

/*
 * Parse and check the descriptor at buf[0..len) into *out (data NULL,
 * contiguous strides), its size into *desc_size and the payload size into
 * *nbytes. Bytes after the descriptor are not looked at. Every read is
 * preceded by a check that len covers it. user_out is the caller's output,
 * only checked for NULL (the result goes to *out, copied out on success).
 */
static tern_status_t read_desc(const unsigned char *p, size_t len, const tern_tensor_t *user_out,
                               tern_tensor_t *out, size_t *desc_size, size_t *nbytes_out)
{
    if (p == NULL && len > 0)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor decode: NULL buffer of %zu bytes", len);
    if (user_out == NULL)
        return tern__error(TERN_ERR_INVALID_PARAM, "tensor decode: NULL output");
    if (len < HEADER_SIZE)
        return tern__error(TERN_ERR_TRUNCATED,
                           "tensor descriptor truncated: %zu of %d header bytes", len, HEADER_SIZE);
    if (memcmp(p + OFF_MAGIC, wire_magic, sizeof(wire_magic)) != 0)
        return tern__error(TERN_ERR_PROTOCOL,
                           "bad tensor descriptor magic 0x%08" PRIx32 " (not a tern tensor?)",
                           tern__get_le32(p + OFF_MAGIC));
    if (p[OFF_VERSION] != TERN_TENSOR_WIRE_VERSION)
        return tern__error(TERN_ERR_UNSUPPORTED,
                           "tensor wire version %u (this tern reads version %d)", p[OFF_VERSION],
                           TERN_TENSOR_WIRE_VERSION);
    unsigned dtype = p[OFF_DTYPE], ndim = p[OFF_NDIM], devtype = p[OFF_DEVTYPE];
    uint32_t devindex = tern__get_le32(p + OFF_DEVINDEX), reserved = tern__get_le32(p + OFF_RESERVED);
    if (dtype >= TERN_DTYPE_COUNT)
        return tern__error(TERN_ERR_UNSUPPORTED, "unknown dtype code %u in tensor descriptor",
                           dtype);
    if (ndim > TERN_TENSOR_MAX_DIMS)
        return tern__error(TERN_ERR_PROTOCOL, "tensor descriptor ndim %u exceeds the maximum %d",
                           ndim, TERN_TENSOR_MAX_DIMS);
    if (devtype != TERN_DEVICE_CPU && devtype != TERN_DEVICE_CUDA)
        return tern__error(TERN_ERR_UNSUPPORTED, "unknown device type code %u in tensor descriptor",
                           devtype);
    if (devindex > INT32_MAX || (devtype == TERN_DEVICE_CPU && devindex != 0))
        return tern__error(TERN_ERR_PROTOCOL,
                           "invalid %s device index %" PRIu32 " in tensor descriptor",
                           devtype == TERN_DEVICE_CPU ? "cpu" : "cuda", devindex);
    if (reserved != 0)
        return tern__error(TERN_ERR_PROTOCOL,
                           "tensor descriptor reserved bytes are 0x%08" PRIx32 " (must be 0)",
                           reserved);
    size_t size = TERN_TENSOR_WIRE_DESC_SIZE(ndim);
    if (len < size)
        return tern__error(TERN_ERR_TRUNCATED,
                           "tensor descriptor truncated: %zu of %zu bytes (ndim %u)", len, size,
                           ndim);

    tern_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.dtype = (tern_dtype_t)dtype;
    t.ndim = (int32_t)ndim;
    t.device.type = (tern_device_type_t)devtype;
    t.device.index = (int32_t)devindex;
    for (unsigned i = 0; i < ndim; i++) {
        uint64_t d = tern__get_le64(p + OFF_SHAPE + 8 * (size_t)i);
        if (d > INT64_MAX)
            return tern__error(TERN_ERR_PROTOCOL,
                               "tensor descriptor dimension %u is negative (0x%016" PRIx64 ")", i,
                               d);
        t.shape[i] = (int64_t)d;
    }
    int64_t prod = 0, nbytes = 0;
    bool zero = false;
    int bad = tern__tensor_shape_product(t.ndim, t.shape, &prod, &zero);
    if (bad >= 0)
        return tern__error(TERN_ERR_PROTOCOL,
                           "tensor descriptor shape overflows int64 at dimension %d (size %" PRId64
                           ")",
                           bad, t.shape[bad]);
    int64_t numel = zero ? 0 : prod;
    if (__builtin_mul_overflow(numel, (int64_t)tern_dtype_size(t.dtype), &nbytes) ||
        (uint64_t)nbytes > SIZE_MAX)
        return tern__error(TERN_ERR_PROTOCOL,
                           "tensor descriptor byte count overflows: %" PRId64 " elements of %s",
                           numel, tern_dtype_name(t.dtype));
    tern__tensor_contiguous_strides(t.ndim, t.shape, t.strides);
    *out = t;
    *desc_size = size;
    *nbytes_out = (size_t)nbytes;
    return TERN_OK;
}

tern_status_t tern_tensor_decode_desc(const void *buf, size_t len, tern_tensor_t *out,
                                      size_t *consumed)
{
    /* Zeroed: read_desc fills it on success only, which -O3 cannot see. */
    tern_tensor_t t = {0};
    size_t size = 0, nbytes = 0;
    tern_status_t st = read_desc(buf, len, out, &t, &size, &nbytes);
    if (st != TERN_OK)
        return st;
    if (consumed == NULL && len != size)
        return tern__error(TERN_ERR_PROTOCOL,
                           "%zu trailing bytes after a %zu-byte tensor descriptor", len - size,
                           size);
    *out = t;
    if (consumed != NULL)
        *consumed = size;
    return TERN_OK;
}

tern_status_t tern_tensor_decode(const void *buf, size_t len, tern_tensor_t *out, size_t *consumed)
{
    /* Zeroed: read_desc fills it on success only, which -O3 cannot see. */
    tern_tensor_t t = {0};
    size_t size = 0, nbytes = 0;
    tern_status_t st = read_desc(buf, len, out, &t, &size, &nbytes);
    if (st != TERN_OK)
        return st;
    if (t.device.type != TERN_DEVICE_CPU)
        return tern__error(TERN_ERR_PROTOCOL,
                           "full tensor encoding declares device cuda:%" PRId32
                           " but its payload is inline host memory",
                           t.device.index);
    if (len - size < nbytes)
        return tern__error(TERN_ERR_TRUNCATED, "tensor payload truncated: %zu of %zu bytes",
                           len - size, nbytes);
    size_t total = size + nbytes;
    if (consumed == NULL && len != total)
        return tern__error(TERN_ERR_PROTOCOL, "%zu trailing bytes after a %zu-byte tensor encoding",
                           len - total, total);
    /* The view points into the caller's buffer (const: see tensor.h). */
    t.data = (void *)((const unsigned char *)buf + size);
    *out = t;
    if (consumed != NULL)
        *consumed = total;
    return TERN_OK;
}
