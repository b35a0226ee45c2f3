/*
 * Reduction kernels: dst[i] = a[i] op b[i] for every dtype x op, the AVG
 * division, and a parallel form over the worker pool. The collectives call
 * these on host buffers. Nothing here logs; the only state is the kernel
 * choice (a CPU probe, tern__reduce_force_portable()); only
 * tern__reduce_par() allocates (its small shared job) or blocks.
 *
 * Semantics. Every code path (the x86-64 AVX2/F16C kernels, the portable
 * ones, the vector loops and their scalar tails, any chunking) gives the same
 * bits for the same inputs, NaNs included; the tests check it:
 *   - the operand order is kept literally: a is the left operand, b the right.
 *     Callers fix the order so that every rank computes the same bits;
 *   - f32 and f64 compute in their own type, f16 and bf16 in f32: both
 *     operands widened exactly, the op in f32, rounded back to nearest, ties to
 *     even (subnormals kept, overflow to inf). f32 has more than twice the
 *     precision plus two bits, so this is the correctly rounded f16/bf16
 *     result for SUM, PROD and the AVG division, not a double rounding;
 *   - MAX(a, b) = a if a is NaN, else b if b is NaN, else (a >= b ? a : b);
 *     MIN(a, b) = a if a is NaN, else b if b is NaN, else (a <= b ? a : b).
 *     NaN propagates, as torch.maximum. Between equal values a wins, so
 *     MAX(+0, -0) is +0 and MAX(-0, +0) is -0. f32/f64 return a's or b's bits
 *     unchanged; f16/bf16 return them with the quiet bit set (0x0200, 0x0040);
 *   - SUM and PROD with a NaN operand give a's NaN if a is one, else b's,
 *     with the quiet bit set (the hardware alone would pick between two NaNs
 *     by instruction operand order, which the compiler chooses). A NaN the op
 *     makes from non-NaN operands (inf - inf, 0 * inf) is the CPU's default
 *     NaN (x86: 0xffc00000 in f32);
 *   - integers: SUM and PROD wrap modulo 2^bits (computed unsigned: no
 *     undefined behaviour); MAX and MIN compare as the signed or unsigned type;
 *   - bool: SUM and MAX are logical or, PROD and MIN logical and; any nonzero
 *     input byte is true and the output byte is always 0 or 1;
 *   - AVG reduces as SUM; tern__reduce_scale() divides once at the end.
 *     AVG is for f16, bf16, f32 and f64 only.
 * The floating kernels assume the default floating-point environment
 * (round to nearest; no flush-to-zero or denormals-are-zero in MXCSR/FPCR).
 *
 * Buffers are host memory aligned to their element size (as any C array of
 * the type); a misaligned one is TERN_ERR_INVALID_PARAM. dst may be exactly a
 * or exactly b (in place); any other overlap is undefined.
 *
 * Every function is reentrant. Errors are recorded with tern__error().
 */
#ifndef TERN_TENSOR_REDUCE_H
#define TERN_TENSOR_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tern/pool.h>
#include <tern/tensor.h>

/*
 * Below this many bytes of one operand, tern__reduce_par() runs on the calling
 * thread: handing chunks to the pool costs a few microseconds, and a buffer
 * that fits in the cache reduces faster on one core than the wake-ups take.
 * Measured with tern-reduce-bench (docs/tensor.md).
 */
#ifndef TERN__REDUCE_PAR_MIN_BYTES /* -D for measuring another threshold */
#define TERN__REDUCE_PAR_MIN_BYTES (4u << 20)
#endif

/* tern__reduce_par() cuts a range into chunks of about this many bytes (at
 * least two per thread, at most TERN__REDUCE_PAR_MAX_CHUNKS), which the
 * threads claim one at a time. */
#define TERN__REDUCE_PAR_CHUNK_BYTES (512u << 10)
#define TERN__REDUCE_PAR_MAX_CHUNKS 256

/* TERN_OK when op is defined for dtype; otherwise TERN_ERR_INVALID_PARAM with
 * the reason (unknown op, unknown dtype, AVG of a non-floating type). */
tern_status_t tern__reduce_check(tern_reduce_op_t op, tern_dtype_t dtype);

/*
 * dst[i] = a[i] op b[i] for i < count, with the semantics above. count 0 does
 * nothing (pointers may then be NULL). Errors (nothing written):
 * TERN_ERR_INVALID_PARAM for an op/dtype tern__reduce_check() rejects, a NULL
 * pointer with count > 0, a pointer not aligned to the element size, or a
 * count whose byte size overflows size_t.
 */
tern_status_t tern__reduce(tern_reduce_op_t op, tern_dtype_t dtype, void *dst, const void *a,
                           const void *b, size_t count);

/* dst[i] = a[i] op b[i] for i < n, unchecked: what tern__reduce() runs. */
typedef void (*tern__reduce_fn)(void *dst, const void *a, const void *b, size_t n);

/*
 * The kernel tern__reduce() would run for op on dtype now (the portable one
 * while tern__reduce_force_portable() is on), or NULL where
 * tern__reduce_check() rejects the pair. For a caller that has checked its
 * buffers once and reduces many small pieces of them (the collectives'
 * steps): the per-call checks cost more than the reduction of a few
 * elements. Same bits as tern__reduce().
 */
tern__reduce_fn tern__reduce_kernel(tern_reduce_op_t op, tern_dtype_t dtype);

/*
 * buf[i] = buf[i] / divisor for the floating types (f16 and bf16 in f32): the
 * AVG step after the SUM. The divisor is converted to the computing type first
 * (exact up to 2^24 for f32 and 2^53 for f64). Errors (nothing written):
 * TERN_ERR_INVALID_PARAM for a non-floating dtype, divisor 0, NULL buf with
 * count > 0, or a misaligned buf.
 */
tern_status_t tern__reduce_scale(tern_dtype_t dtype, void *buf, size_t count, uint64_t divisor);

/*
 * As tern__reduce(), same result bit for bit, split over the pool when it is
 * worth it: pool non-NULL with more than one thread, the caller not one of
 * its workers (it would wait on its own pool), and one operand at least
 * TERN__REDUCE_PAR_MIN_BYTES. The range is cut into chunks (see
 * TERN__REDUCE_PAR_CHUNK_BYTES) whose inner boundaries fall on 64-byte
 * addresses of dst, so no cache line is written by two threads; the caller
 * and one task per pool thread claim chunks until none is left, and the
 * caller blocks (on a condition variable) until every chunk is done, not
 * until every task has run: a task that starts late finds nothing to do. A
 * refused submit (queue_limit) only means fewer helpers; no error comes from
 * the pool. Allocates the shared job (freed by its last user); if that or its
 * mutex fails, the caller reduces alone. Otherwise runs tern__reduce().
 */
tern_status_t tern__reduce_par(tern_pool_t *pool, tern_reduce_op_t op, tern_dtype_t dtype,
                               void *dst, const void *a, const void *b, size_t count);

/*
 * Force the portable kernels (true) or let the x86-64 AVX2/F16C ones be
 * chosen when the CPU has them (false, the default): for the tests, which
 * check that both give the same bits, and the benchmark. Process-wide; takes
 * effect on the next call; safe from any thread.
 */
void tern__reduce_force_portable(bool on);

/* "avx2+f16c" when the accelerated kernels are in use, else "portable". */
const char *tern__reduce_isa(void);

#endif
