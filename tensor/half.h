/*
 * f16 and bf16 <-> f32 conversions, exact where exact is possible and
 * round-to-nearest-even otherwise, branch-free so that loops over them
 * vectorize. Shared by the reduction kernels (tensor/reduce.c) and the RPC
 * built-ins (rpc/builtins.c), which must give the same bits.
 */
#ifndef TERN_TENSOR_HALF_H
#define TERN_TENSOR_HALF_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/*
 * cond ? x : y on bit patterns, as masks. A ternary would do in plain code,
 * but when its arms come from float arithmetic GCC moves that arithmetic into
 * the arms and then will not if-convert it (a float op may trap), so the loop
 * stays scalar.
 */
static inline uint32_t select_u32(bool cond, uint32_t x, uint32_t y)
{
    uint32_t mask = 0u - (uint32_t)cond;
    return (x & mask) | (y & ~mask);
}

/*
 * binary16 -> binary32, exact (M. Dukhan's FP16 library method). A normal or
 * inf/NaN half moves to f32 by shifting its exponent and mantissa into place
 * with the exponent rebiased by 224, then a multiply by 2^-112 fixes the bias
 * (and leaves inf and NaN as they are, NaN quieted). A subnormal half (two_w
 * below 2^27) is built as 0.5 + m * 2^-24 by placing m under the exponent of
 * 0.5, then subtracting 0.5: exact. Needs IEEE arithmetic without
 * flush-to-zero on the subtraction, which holds unless the application turns
 * on FTZ/DAZ.
 */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w;
    float normal = f32_from_bits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
    float subnormal = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    uint32_t mag = select_u32(two_w < (1u << 27), f32_bits(subnormal), f32_bits(normal));
    return f32_from_bits(sign | mag);
}

/*
 * binary32 -> binary16, round to nearest, ties to even, as vcvtps2ph with
 * imm 0 (the FP16 library method). Scaling |f| by 2^112 then 2^-110 turns
 * what overflows the half range into inf. Adding a power of two chosen from
 * f's exponent (never below 2^-14, the half subnormal scale) makes the FPU
 * round away exactly the bits a half cannot hold; the result's exponent and
 * mantissa fields then read off the half directly. NaN is handled apart to
 * give the hardware's answer: quiet bit set, payload truncated.
 */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t w = f32_bits(f);
    float base = (f32_from_bits(w & 0x7fffffffu) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t shl1_w = w + w;
    uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xff000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f32_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    uint32_t nan = 0x7e00u | ((w >> 13) & 0x03ffu);
    return (uint16_t)((sign >> 16) | select_u32(shl1_w > 0xff000000u, nan, nonsign));
}

/* bfloat16 is the top half of a binary32: widening is a shift. */
static inline float bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even by adding 0x7fff plus the lowest kept bit; the carry
 * rounds up into the exponent, to inf past the largest bf16. A NaN would
 * carry into the sign or lose its payload, so it is kept by truncation with
 * the quiet bit set instead. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#endif
