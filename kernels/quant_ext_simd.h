/* quant_ext_simd.h - internal: the x86 helpers quant_ext_avx2.c and
 * quant_ext_avx512.c share (half loads, nibble and bit expansion, the
 * K-quant scale unpacking and min term; horizontal sums come from
 * simd_x86.h). The vector ones carry the AVX2 target attribute, so they
 * inline into either file's kernels. Only those two files include this. */
#ifndef KV_QUANT_EXT_SIMD_H
#define KV_QUANT_EXT_SIMD_H

#include "quant_ext_isa.h"

#ifdef KV_QEXT_HAVE_X86

#include <string.h>

#include "simd_x86.h"

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))

static inline T_AVX2 float h2f(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles then high nibbles
 * (element j of a 32-block at byte j). */
static inline T_AVX2 __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* 32-bit mask -> 32 bytes, byte i = 0xFF when bit i is set. */
static inline T_AVX2 __m256i bits32(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* Sums of 4 products of unsigned ux and signed sy bytes -> 8 int32. No
 * overflow for ux <= 128, |sy| <= 127 (maddubs saturates only past 2*128*127). */
static inline T_AVX2 __m256i mul_sum_us8(__m256i ux, __m256i sy) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ux, sy), _mm256_set1_epi16(1));
}
/* Same for signed x signed: |x| times y with x's sign moved onto y. */
static inline T_AVX2 __m256i mul_sum_i8(__m256i x, __m256i y) {
    return mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float q8k_d(const kv_block_q8_K *b) {
    float d;
    memcpy(&d, &b->d, 4);
    return d;
}

/* The 12 packed bytes of q4_K/q5_K -> out[0..7] scales, out[8..15] mins
 * (four 32-bit mask/shift steps instead of eight scalar unpacks). */
static inline void k4_unpack(const uint8_t *scales, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, scales, 12);
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = uaux;
    u[0] &= kmask1;
    memcpy(out, u, 16);
}

/* sum over sub-blocks j of m[j] * (bsums[2j] + bsums[2j+1]) */
static inline int k4_min_sum(const uint8_t sm[16], const int16_t *bsums) {
    int s = 0;
    for (int j = 0; j < 8; j++) s += sm[8 + j] * (bsums[2 * j] + bsums[2 * j + 1]);
    return s;
}

/* Unpacks a q4_K/q5_K super-block's scales into sm (k4_unpack) and returns
 * its min term, dmin * d_y * sum_j m_j * (y's sum over sub-block j), which
 * the dot subtracts. */
static inline T_AVX2 float k4_min_term(const uint8_t *scales, const uint16_t *dmin, const kv_block_q8_K *y, uint8_t sm[16]) {
    k4_unpack(scales, sm);
    return h2f(dmin) * q8k_d(y) * (float)k4_min_sum(sm, y->bsums);
}

/* sum_j scales[j] * bsums[j]: the correction for q6_K's offset of 32 */
static inline int q6_bias(const int8_t *scales, const int16_t *bsums) {
    int s = 0;
    for (int j = 0; j < 16; j++) s += scales[j] * bsums[j];
    return s;
}

#undef T_AVX2

#endif /* KV_QEXT_HAVE_X86 */

#endif
