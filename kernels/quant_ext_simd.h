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

/* The 12 packed scale bytes of a q4_K/q5_K super-block (read as 16: the 4
 * after them are still inside the block) -> bytes sc0..sc7, m0..m7, with
 * 32-bit lane shifts and masks (lanes u0, u2, u1, u2 >> 4, then the top 2
 * bits of u0 and u1): k4_unpack in vector registers. */
static inline T_AVX2 __m128i k4_scales(const uint8_t *scales) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)scales);
    const __m128i p = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    const __m128i q = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* .. u0 .. u1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(p, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(q, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* The mins of k4_scales' bytes as int16 m0 m0 m1 m1 ... m7 m7: a
 * vpmaddwd with q8_K's 16 bsums then gives m_j * (the sum over sub-block j). */
static inline T_AVX2 __m256i k4_mins_dup(__m128i sm) {
    const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
}

/* Unpacks a q4_K/q5_K super-block's scales and mins into sm (k4_scales)
 * and adds its min term, dmin * d_y * sum_j m_j * (y's sum over sub-block
 * j), to accm's lanes (the dot subtracts their sum). */
static inline T_AVX2 __m256 k4_min_acc(__m256 accm, const uint8_t *scales, const uint16_t *dmin, const kv_block_q8_K *y,
                                       uint8_t sm[16]) {
    const __m128i sv = k4_scales(scales);
    _mm_storeu_si128((__m128i *)(void *)sm, sv);
    const __m256i mb = _mm256_madd_epi16(k4_mins_dup(sv), _mm256_loadu_si256((const __m256i *)(const void *)y->bsums));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(mb), _mm256_set1_ps(h2f(dmin) * q8k_d(y)), accm);
}

/* 8 int32 whose sum is sum_j scales[j] * bsums[j]: q6_K's offset of 32
 * comes off as 32 times this. */
static inline T_AVX2 __m256i q6_bias8(const int8_t *scales, const int16_t *bsums) {
    return _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)scales)),
                             _mm256_loadu_si256((const __m256i *)(const void *)bsums));
}

#undef T_AVX2

#endif /* KV_QEXT_HAVE_X86 */

#endif
