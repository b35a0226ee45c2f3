/*
 * Tensor descriptors and their wire form.
 *
 * A tern_tensor_t describes memory the caller owns: a data pointer, an element
 * type, a shape and strides in elements (as PyTorch and DLPack), and the device
 * the memory is on. tern never allocates or frees the data a descriptor points
 * to, and a descriptor holds its shape and strides inline, so it can be copied
 * by value.
 *
 * Descriptor rules (checked by tern_tensor_validate(), and by every call that
 * takes a tensor):
 *   - dtype is one of TERN_DTYPE_*; ndim is 0 (a scalar, one element) to
 *     TERN_TENSOR_MAX_DIMS; every shape[i] >= 0;
 *   - strides are >= 0: zero strides (broadcast views, PyTorch's expand()) are
 *     accepted; negative strides are rejected with TERN_ERR_UNSUPPORTED;
 *   - the product of the dimensions (with 0 counted as 1, so that contiguous
 *     strides exist), the byte count and the byte extent the strides span fit
 *     in int64_t (and size_t), or the call fails with TERN_ERR_OUT_OF_RANGE;
 *     nothing wraps;
 *   - a CPU device has index 0; a CUDA device has an index >= 0.
 * Entries of shape[] and strides[] at or beyond ndim are ignored. Strides of
 * dimensions of size 1, and all strides when a dimension is 0, do not change
 * which bytes the tensor covers.
 *
 * Wire form (docs/tensor.md has it byte by byte): a versioned little-endian
 * descriptor of 16 + 8 * ndim bytes (dtype, device, ndim, shape; no strides),
 * followed in the full form by the payload, always contiguous row-major.
 *
 * Thread safety: every function here is reentrant; none keeps state.
 */
#ifndef TERN_TENSOR_H
#define TERN_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tern/defs.h>
#include <tern/status.h>

TERN_BEGIN_DECLS

/* Element types. The values are the wire codes: they never change. */
typedef enum tern_dtype {
    TERN_DTYPE_F16 = 0,  /* IEEE 754 binary16 */
    TERN_DTYPE_BF16 = 1, /* bfloat16 */
    TERN_DTYPE_F32 = 2,
    TERN_DTYPE_F64 = 3,
    TERN_DTYPE_I8 = 4,
    TERN_DTYPE_I16 = 5,
    TERN_DTYPE_I32 = 6,
    TERN_DTYPE_I64 = 7,
    TERN_DTYPE_U8 = 8,
    TERN_DTYPE_BOOL = 9, /* one byte, 0 or 1 (as PyTorch's torch.bool) */
} tern_dtype_t;

#define TERN_DTYPE_COUNT 10

/* Bytes per element; 0 for a value that is not a TERN_DTYPE_*. */
TERN_API size_t tern_dtype_size(tern_dtype_t dtype);

/* Short name: "f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8",
 * "bool"; "unknown" for a value that is not a TERN_DTYPE_*. Never NULL. */
TERN_API const char *tern_dtype_name(tern_dtype_t dtype);

/* The dtype named by its short name or by PyTorch's name without "torch."
 * ("float16", "half", "bfloat16", "float32", "float", "float64", "double",
 * "int8", "int16", "short", "int32", "int", "int64", "long", "uint8", "bool").
 * TERN_ERR_INVALID_PARAM for anything else (NULL included); *out is untouched. */
TERN_API tern_status_t tern_dtype_parse(const char *name, tern_dtype_t *out);

/* Reduction operations, as torch.distributed.ReduceOp. AVG is the sum divided
 * by the number of contributions, for the floating types only. The values are
 * wire codes: they never change. */
typedef enum tern_reduce_op {
    TERN_SUM = 0,
    TERN_PROD = 1,
    TERN_MAX = 2,
    TERN_MIN = 3,
    TERN_AVG = 4,
} tern_reduce_op_t;

#define TERN_REDUCE_OP_COUNT 5

/* "sum", "prod", "max", "min", "avg"; "unknown" for anything else. Never NULL. */
TERN_API const char *tern_reduce_op_name(tern_reduce_op_t op);

/* The op named by its short name, case-insensitive ("product" is accepted for
 * "prod"). TERN_ERR_INVALID_PARAM for anything else; *out is untouched. */
TERN_API tern_status_t tern_reduce_op_parse(const char *name, tern_reduce_op_t *out);

/* Where a tensor's memory is. The values are the wire codes. */
typedef enum tern_device_type {
    TERN_DEVICE_CPU = 0,  /* host memory (pinned or not) */
    TERN_DEVICE_CUDA = 1, /* memory of one CUDA device */
} tern_device_type_t;

typedef struct tern_device {
    tern_device_type_t type;
    int32_t index; /* 0 for the CPU; the CUDA device ordinal (>= 0) */
} tern_device_t;

/* The CPU device, and CUDA device index, as values (not checked here). */
TERN_API tern_device_t tern_device_cpu(void);
TERN_API tern_device_t tern_device_cuda(int32_t index);

/* Longest formatted device, NUL included: "cuda:2147483647". */
#define TERN_DEVICE_STR_MAX 16

/*
 * Parse "cpu" or "cuda:N" (N decimal, 0..2147483647, no sign, no leading zeros,
 * nothing else around it). A bare "cuda" is rejected: which device it means
 * depends on the process, so say it. TERN_ERR_INVALID_PARAM (detail quotes the
 * string) on anything else; *out is untouched on error.
 */
TERN_API tern_status_t tern_device_parse(const char *str, tern_device_t *out);

/*
 * Write "cpu" or "cuda:N" and a NUL into buf[0..cap). TERN_ERR_INVALID_PARAM for
 * an invalid device, TERN_ERR_TRUNCATED if cap is too small (TERN_DEVICE_STR_MAX
 * always suffices; buf then holds "" when cap > 0).
 */
TERN_API tern_status_t tern_device_format(tern_device_t device, char *buf, size_t cap);

#define TERN_TENSOR_MAX_DIMS 16

typedef struct tern_tensor {
    void *data; /* first element (not owned); may be NULL when numel is 0 */
    tern_dtype_t dtype;
    int32_t ndim; /* 0 (scalar) .. TERN_TENSOR_MAX_DIMS */
    tern_device_t device;
    int64_t shape[TERN_TENSOR_MAX_DIMS];   /* elements per dimension, >= 0 */
    int64_t strides[TERN_TENSOR_MAX_DIMS]; /* in elements, not bytes, >= 0 */
} tern_tensor_t;

/*
 * Describe a contiguous row-major tensor over data: copies shape[0..ndim),
 * computes the strides, zeroes the unused entries. data may be NULL (a
 * descriptor to be given memory later); set t->data before passing t to a call
 * that reads or writes elements. shape may be NULL when ndim is 0.
 * Errors: TERN_ERR_INVALID_PARAM (NULL t, unknown dtype, ndim out of range,
 * negative dimension, invalid device), TERN_ERR_OUT_OF_RANGE (byte count
 * overflows). *t is only written on success.
 */
TERN_API tern_status_t tern_tensor_init(tern_tensor_t *t, void *data, tern_dtype_t dtype,
                                        int32_t ndim, const int64_t *shape, tern_device_t device);

/*
 * Number of elements (1 for a scalar, 0 when any dimension is 0). Errors:
 * TERN_ERR_INVALID_PARAM (ndim out of range, negative dimension),
 * TERN_ERR_OUT_OF_RANGE (the product, zero dimensions counted as 1, overflows
 * int64_t: shape {0, 2^40, 2^40} is rejected, not 0). *out only on success.
 */
TERN_API tern_status_t tern_tensor_numel(const tern_tensor_t *t, int64_t *out);

/* numel * element size, as tern_tensor_numel(); TERN_ERR_OUT_OF_RANGE when it
 * does not fit in int64_t or size_t; TERN_ERR_INVALID_PARAM for an unknown dtype. */
TERN_API tern_status_t tern_tensor_nbytes(const tern_tensor_t *t, size_t *out);

/*
 * Bytes from t->data to one past the last byte any element occupies, following
 * the strides: what a memory registration of the tensor must cover. 0 when
 * numel is 0; nbytes for a contiguous tensor; less than nbytes when strides are
 * 0. Validates t as tern_tensor_validate() does, except that data may be NULL.
 */
TERN_API tern_status_t tern_tensor_extent(const tern_tensor_t *t, size_t *out);

/*
 * true when the elements are laid out row-major with no gaps: strides[i] equals
 * the product of shape[i+1..ndim) for every dimension of size other than 1.
 * Tensors with no element and scalars are contiguous. false for a descriptor
 * with ndim out of range or a negative dimension.
 */
TERN_API bool tern_tensor_is_contiguous(const tern_tensor_t *t);

/*
 * Check every rule in the comment at the top of this header, and that data is
 * not NULL when the tensor has elements, and that data + extent does not wrap
 * the address space. TERN_OK or TERN_ERR_INVALID_PARAM / TERN_ERR_UNSUPPORTED /
 * TERN_ERR_OUT_OF_RANGE with a detail naming the field.
 */
TERN_API tern_status_t tern_tensor_validate(const tern_tensor_t *t);

/*
 * Copy the elements of a CPU tensor, in row-major order, into dst[0..cap): the
 * contiguous form that goes on the wire. Any strides (zero strides repeat
 * elements). dst must not overlap the tensor. Errors: as tern_tensor_validate(),
 * TERN_ERR_UNSUPPORTED for a non-CPU tensor, TERN_ERR_TRUNCATED when cap is
 * less than nbytes (nothing written).
 */
TERN_API tern_status_t tern_tensor_gather(const tern_tensor_t *t, void *dst, size_t cap);

/* Wire form version this tern writes and the only one it reads. */
#define TERN_TENSOR_WIRE_VERSION 1
/* Bytes of the encoded descriptor with ndim dimensions (ndim 0..MAX). */
#define TERN_TENSOR_WIRE_DESC_SIZE(ndim) (16u + 8u * (size_t)(ndim))
#define TERN_TENSOR_WIRE_DESC_MAX TERN_TENSOR_WIRE_DESC_SIZE(TERN_TENSOR_MAX_DIMS)

/* TERN_TENSOR_WIRE_DESC_SIZE(ndim), or 0 when ndim is out of range. */
TERN_API size_t tern_tensor_wire_desc_size(int32_t ndim);

/* Descriptor size + nbytes: the size of tern_tensor_encode()'s output. Errors
 * as tern_tensor_nbytes(), TERN_ERR_OUT_OF_RANGE if the sum exceeds INT64_MAX. */
TERN_API tern_status_t tern_tensor_wire_size(const tern_tensor_t *t, size_t *out);

/*
 * Encode t's descriptor into buf[0..cap) and set *len to its size. t->data is
 * not read (it may be NULL) and the device can be any: this is the form sent
 * ahead of a payload that travels separately (rendezvous). buf may be NULL when
 * cap is 0. Errors: as tern_tensor_extent() for the descriptor;
 * TERN_ERR_TRUNCATED when cap is too small, with *len set to the size needed
 * and nothing written.
 */
TERN_API tern_status_t tern_tensor_encode_desc(const tern_tensor_t *t, void *buf, size_t cap,
                                               size_t *len);

/*
 * Encode t's descriptor followed by its elements, contiguous row-major (a
 * strided source is gathered: the one copy). t must be a CPU tensor: its
 * elements are read here. buf must not overlap the tensor. Errors: as
 * tern_tensor_validate(); TERN_ERR_UNSUPPORTED for a non-CPU tensor;
 * TERN_ERR_TRUNCATED when cap is too small, with *len set to the size needed
 * (tern_tensor_wire_size()) and nothing written; TERN_ERR_INVALID_PARAM when
 * buf[0..size needed) overlaps the tensor's extent.
 */
TERN_API tern_status_t tern_tensor_encode(const tern_tensor_t *t, void *buf, size_t cap,
                                          size_t *len);

/*
 * Decode a descriptor from buf[0..len), checking every field against len before
 * it is used. On success *out describes the tensor with data NULL and
 * contiguous strides (set data to where the payload lands before using it),
 * and *consumed is the descriptor's size. Trailing bytes: when consumed is
 * non-NULL, bytes after the descriptor are allowed and left to the caller;
 * when consumed is NULL, len must be exactly the descriptor's size.
 * The declared payload size (tern_tensor_nbytes(out)) is guaranteed to fit in
 * int64_t but is not otherwise bounded: a receiver bounds it before allocating.
 * Errors: TERN_ERR_TRUNCATED (len shorter than the header or than ndim says),
 * TERN_ERR_UNSUPPORTED (other version, unknown dtype or device type),
 * TERN_ERR_PROTOCOL (bad magic, reserved bytes not zero, ndim over the maximum,
 * negative dimension, invalid device index, element or byte count overflow,
 * trailing bytes when consumed is NULL). *out and *consumed are only written
 * on success.
 */
TERN_API tern_status_t tern_tensor_decode_desc(const void *buf, size_t len, tern_tensor_t *out,
                                               size_t *consumed);

/*
 * Decode a full encoding (descriptor then payload) from buf[0..len), validated
 * as tern_tensor_decode_desc(), and check the payload is all there. On success
 * *out is a zero-copy view: out->data points into buf (at offset
 * descriptor size, a multiple of 8, so an 8-byte-aligned buf gives aligned
 * elements); it is valid only as long as buf is, and buf stays owned by the
 * caller. buf is taken as const: write through out->data only if the caller's
 * buffer is writable. *consumed is descriptor + payload size; trailing bytes as in
 * tern_tensor_decode_desc(). The payload is host memory, so a full encoding
 * must declare the CPU device (TERN_ERR_PROTOCOL otherwise). Errors: as
 * tern_tensor_decode_desc(); TERN_ERR_TRUNCATED when the payload is shorter
 * than the descriptor declares.
 */
TERN_API tern_status_t tern_tensor_decode(const void *buf, size_t len, tern_tensor_t *out,
                                          size_t *consumed);

TERN_END_DECLS

#endif
