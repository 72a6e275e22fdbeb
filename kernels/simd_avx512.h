/* simd_avx512.h - small AVX-512 helpers shared by the kernel files that
 * compile for that target (matmul_avx512.c, quant_ext_k512.c,
 * cpu_attention_avx512.c). Include it after the file's
 * KV_SIMD_TARGET_BEGIN, so the helpers take the file's target. */
#ifndef KV_SIMD_AVX512_H
#define KV_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The 4 bytes at p (any alignment) in every 32-bit lane: the operand
 * vpdpbusd / vpdpwssd multiply a register of 4-byte groups by. */
static inline __attribute__((always_inline)) __m512i kv_bcast4_512(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

#endif
