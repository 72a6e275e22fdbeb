/* fp_bits.h - internal: the float format conversions that the host code
 * (types.c, kv_dtype.c) and the CUDA kernels (cuda/cuda_attention.cu) must
 * agree on to the bit, written once: f32 -> f16 and f32 -> fp8 (round to
 * nearest even, on the float's bits, so no double rounding), and fp8 ->
 * f32. C and CUDA compile it alike; under nvcc the functions are host and
 * device functions. */
#ifndef KV_FP_BITS_H
#define KV_FP_BITS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KV_FP_FN static __host__ __device__ __forceinline__
#else
#define KV_FP_FN static inline
#endif

KV_FP_FN uint32_t kv_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
#endif
}

/* IEEE binary16 bits of f: round to nearest even, overflow to infinity,
 * NaN kept quiet with its sign. */
KV_FP_FN uint16_t kv_f32_to_f16_bits(float f) {
    const uint32_t x = kv_f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        const uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e; /* value in units of the half subnormal step 2^-24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    const uint32_t e = (absx >> 23) - 127 + 15, m = absx & 0x7fffffu;
    uint32_t r = (e << 10) | (m >> 13);
    const uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++; /* may carry into the exponent: correct */
    return (uint16_t)(sign | r);
}

/* The fp8 code of f with mbits mantissa bits and exponent bias `bias`:
 * nearest, ties to even, saturating at max_code (infinity too); NaN gives
 * nan_code. e4m3: (3, 7, 0x7e, 0x7f); e5m2: (2, 15, 0x7b, 0x7e). */
KV_FP_FN uint8_t kv_f32_to_fp8_bits(float f, int mbits, int bias, uint32_t max_code, uint32_t nan_code) {
    const uint32_t x = kv_f32_bits(f);
    const uint32_t sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | nan_code);
    if (ax == 0x7f800000u) return (uint8_t)(sign | max_code);
    if ((ax >> 23) == 0) return (uint8_t)sign; /* f32 zero or subnormal: far below fp8's range */
    const int e = (int)(ax >> 23) - 127 + bias; /* biased fp8 exponent */
    uint32_t m = ax & 0x7fffffu, code;
    int shift;
    if (e >= 1) {
        shift = 23 - mbits;
        code = ((uint32_t)e << mbits) | (m >> shift);
    } else {
        /* fp8 subnormal: value in units of 2^(1 - bias - mbits) */
        m |= 0x800000u;
        shift = 23 - mbits + 1 - e;
        if (shift >= 25) return (uint8_t)sign; /* below half the smallest subnormal */
        code = m >> shift;
    }
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1))) code++; /* carry into the exponent is correct */
    if (code > max_code) code = max_code;
    return (uint8_t)(sign | code);
}

/* The value of fp8 code v (mbits, bias as above; ieee: e5m2's infinities
 * and NaNs at the top exponent, else e4m3's single NaN S.1111.111). */
KV_FP_FN float kv_fp8_bits_to_f32(uint32_t v, int mbits, int bias, int ieee) {
    const int ebits = 7 - mbits;
    const int e = (int)(v >> mbits) & ((1 << ebits) - 1), m = (int)v & ((1 << mbits) - 1);
    float r;
    if (ieee && e == (1 << ebits) - 1)
        r = m ? NAN : INFINITY;
    else if (!ieee && (v & 0x7f) == 0x7f)
        r = NAN;
    else if (e == 0)
        r = ldexpf((float)m, 1 - bias - mbits);
    else
        r = ldexpf(1.0f + (float)m / (float)(1 << mbits), e - bias);
    return (v & 0x80) ? -r : r;
}

#undef KV_FP_FN

#endif
