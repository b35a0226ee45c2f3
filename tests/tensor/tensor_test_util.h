/* Helpers shared by the tensor tests: a reference gather and byte patterns. */
#ifndef TERN_TENSOR_TEST_UTIL_H
#define TERN_TENSOR_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tensor.h>

/* Fill n bytes with a pattern that differs for every byte position (seeded). */
static inline void tt_fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (unsigned char)(x >> 24);
    }
}

/*
 * The obvious gather: element k of the row-major order is at the multi-index
 * k decomposes into, dotted with the strides. Slow and independent of the
 * library's (which coalesces dimensions and copies runs).
 */
static inline void tt_ref_gather(const tern_tensor_t *t, void *dst)
{
    size_t size = tern_dtype_size(t->dtype);
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++)
        numel *= t->shape[i];
    for (int64_t k = 0; k < numel; k++) {
        int64_t rem = k, off = 0;
        for (int i = t->ndim - 1; i >= 0; i--) {
            off += (rem % t->shape[i]) * t->strides[i];
            rem /= t->shape[i];
        }
        memcpy((unsigned char *)dst + (size_t)k * size,
               (const unsigned char *)t->data + (size_t)off * size, size);
    }
}

/* Tiny deterministic generator for property tests. */
static inline uint32_t tt_rand(uint32_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    return *state;
}

#endif
