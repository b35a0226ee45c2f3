/*
 * Internals shared by the tensor files (tensor.c, wire.c, dlpack.c). None of
 * these keeps state; all are reentrant.
 */
#ifndef TERN_TENSOR_PRIV_H
#define TERN_TENSOR_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tern/tensor.h>

/*
 * The product of shape[0..ndim) with every 0 counted as 1 into *prod, and
 * whether some dimension is 0 into *has_zero. Returns the index of the first
 * negative dimension or of the dimension at which the product overflows
 * int64_t, or -1 when all is well (then *prod and *has_zero are set). Records
 * no error: callers pick the status (a caller's bad input or a peer's).
 */
int tern__tensor_shape_product(int32_t ndim, const int64_t *shape, int64_t *prod, bool *has_zero);

/*
 * Row-major contiguous strides for shape[0..ndim) into strides[0..MAX), zero
 * past ndim (a dimension of 0 counts as 1, as PyTorch does). The caller has
 * checked with tern__tensor_shape_product() that they fit.
 */
void tern__tensor_contiguous_strides(int32_t ndim, const int64_t *shape, int64_t *strides);

/*
 * Check t against every descriptor rule (tensor.h), and when need_data also
 * that data is set for a tensor with elements and that its extent does not
 * wrap. Records the error. On success sets the outputs that are not NULL.
 */
tern_status_t tern__tensor_check(const tern_tensor_t *t, bool need_data, int64_t *numel,
                                 size_t *nbytes, size_t *extent);

/*
 * Copy t's elements, row-major, to dst (nbytes of room, no overlap). t has been
 * checked with need_data and has elements; its data is host memory.
 */
void tern__tensor_gather(const tern_tensor_t *t, void *dst);

#endif
