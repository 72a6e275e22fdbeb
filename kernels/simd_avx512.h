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

/* acc + vpdpbusd(u, the 4 bytes at p in every lane) with the broadcast
 * folded into the instruction's memory operand ({1to16}). NOTE: GCC 12-14
 * do not fold kv_bcast4_512 into vpdpbusd: they emit a separate
 * vpbroadcastd per group, and on Zen 4 the folded form runs the batched
 * q8_0 panel kernel 4-6% faster (bench-kernels --panels, n = 32). The same
 * instruction either way, so the same bits. */
typedef int32_t kv_i32_any __attribute__((may_alias, aligned(1))); /* 4 bytes of any type, any alignment */
static inline __attribute__((always_inline)) __m512i kv_dpbusd_bcast512(__m512i acc, __m512i u, const void *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const kv_i32_any *)p));
    return acc;
}

/* kv_dpbusd_bcast512 where fold (a compile-time constant in the callers:
 * their register block has more than one activation row), else the
 * intrinsics' separate broadcast. The compute-bound batched kernels gain
 * from the fold; one row (decode) is memory-bound and keeps the code it
 * had: with the fold there too, tools/decode_ab.sh gave 110M q8_0 0.95x
 * and SmolLM2 0.92-0.99x, inside this machine's noise (the same binary
 * against itself: 0.97x) but no gain either. */
static inline __attribute__((always_inline)) __m512i kv_dpbusd_b512(__m512i acc, __m512i u, const void *p,
                                                                    const int fold) {
    return fold ? kv_dpbusd_bcast512(acc, u, p) : _mm512_dpbusd_epi32(acc, u, kv_bcast4_512(p));
}

#endif
