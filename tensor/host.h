/*
 * A tensor as one flat run of host memory, for the layers that move its
 * bytes (p2p, collectives): they take it as a buffer of numel elements.
 */
#ifndef TERN_TENSOR_HOST_H
#define TERN_TENSOR_HOST_H

#include <stddef.h>

#include <tern/tensor.h>

/*
 * t's data and element count when t is valid, contiguous and on the CPU.
 * Errors, recorded with "<name>: <what> ..." (name: the call, what: which of
 * its tensors): TERN_ERR_INVALID_PARAM for NULL or a bad descriptor (as
 * tern_tensor_validate()), TERN_ERR_UNSUPPORTED for a CUDA tensor (that
 * comes with the GPU transport) or a strided one.
 */
tern_status_t tern__tensor_host(const char *name, const char *what, const tern_tensor_t *t,
                                void **data, size_t *numel);

#endif
