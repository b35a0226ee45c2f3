/*
 * DLPack interchange for tern tensors (DLPack 0.6 and later; Debian's
 * libdlpack-dev). A separate header because DLPack's DLTensor is an anonymous
 * struct that cannot be forward-declared: <tern/tensor.h> (and <tern/tern.h>)
 * stay usable without DLPack installed; include this one only where DLPack is.
 *
 * Mapping (docs/tensor.md): dtypes (code, bits, lanes) kDLFloat 16/32/64 ->
 * F16/F32/F64, kDLBfloat 16 -> BF16, kDLInt 8/16/32/64 -> I8..I64, kDLUInt 8 ->
 * U8, kDLBool (code 6, DLPack 0.8) 8 -> BOOL, lanes always 1; devices kDLCPU and
 * kDLCUDAHost (pinned host memory) -> CPU, kDLCUDA n -> CUDA n. Everything else
 * is TERN_ERR_UNSUPPORTED with a detail naming it.
 *
 * Neither direction copies elements or takes ownership of them.
 */
#ifndef TERN_DLPACK_H
#define TERN_DLPACK_H

#include <dlpack/dlpack.h>

#include <tern/defs.h>
#include <tern/status.h>
#include <tern/tensor.h>

TERN_BEGIN_DECLS

/* DLPack's code for bool (kDLBool), which DLPack 0.6's header lacks. */
#define TERN_DLPACK_CODE_BOOL 6

/*
 * Describe src's memory as a tern tensor: out->data = src->data + byte_offset,
 * shape and strides copied (NULL strides: contiguous row-major). No element is
 * copied; out is valid as long as src's memory is (src itself, shape and strides
 * arrays included, may go away once this returns). The result is checked as
 * tern_tensor_validate() does (negative strides are TERN_ERR_UNSUPPORTED).
 * Errors: TERN_ERR_INVALID_PARAM (NULL, negative ndim, NULL shape with ndim > 0,
 * negative device id), TERN_ERR_UNSUPPORTED (dtype, lanes, device type, ndim
 * over TERN_TENSOR_MAX_DIMS), TERN_ERR_OUT_OF_RANGE. *out only on success.
 */
TERN_API tern_status_t tern_tensor_from_dlpack(const DLTensor *src, tern_tensor_t *out);

/*
 * Fill *out to describe t (checked as tern_tensor_validate()), with no
 * allocation: out->shape and out->strides point to the caller's
 * shape_storage[0..ndim) and stride_storage[0..ndim), which must outlive *out
 * (they may be NULL when t->ndim is 0; out->shape and out->strides are then
 * NULL too). byte_offset is 0. out->data is t->data, still owned by t's owner.
 * Errors: as tern_tensor_validate(); TERN_ERR_INVALID_PARAM for NULL storage
 * with ndim > 0. *out and the storage are only written on success.
 */
TERN_API tern_status_t tern_tensor_to_dlpack(const tern_tensor_t *t, DLTensor *out,
                                             int64_t *shape_storage, int64_t *stride_storage);

/* Called once by the managed tensor's deleter, with the argument given. */
typedef void (*tern_dlpack_release_fn)(void *arg);

/*
 * A DLManagedTensor describing t, in one allocation that holds its own shape
 * and strides: what a framework's from_dlpack consumes (wrap it in a
 * "dltensor" capsule for Python). The consumer calls (*out)->deleter(*out)
 * exactly once when done; the deleter calls release(release_arg) if release is
 * not NULL (to free or unpin the data t points to, which the managed tensor
 * does not own) and then frees the allocation. On success the duty to run
 * release passes to the deleter; on error release is never called and nothing
 * changes hands. Errors: as tern_tensor_to_dlpack(); TERN_ERR_NO_MEMORY.
 */
TERN_API tern_status_t tern_tensor_to_dlpack_managed(const tern_tensor_t *t,
                                                     tern_dlpack_release_fn release,
                                                     void *release_arg, DLManagedTensor **out);

TERN_END_DECLS

#endif
