/* simd_x86.h - internal to the x86 kernel files (matmul_avx2/avx512.c,
 * cpu_attention_avx2/avx512.c, cpu_avx2.c, quant_ext_avx2/avx512.c): the
 * file-wide target pragma each of them opens and closes, spelled once for
 * GCC and clang, and the small vector steps more than one of them takes
 * (horizontal sums and maxima of 8 lanes, the mask of a 16-lane tail).
 *
 * Include it before KV_SIMD_TARGET_BEGIN: its vector helpers carry their
 * own target attribute (AVX2, the lowest level any of those files is built
 * for), so they inline into every file's kernels, AVX-512 ones included,
 * with the same instructions. */
#ifndef KV_SIMD_X86_H
#define KV_SIMD_X86_H

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <stdint.h>

#define KV_SIMD_PRAGMA(x) _Pragma(#x)

/* KV_SIMD_TARGET_BEGIN("avx2,fma") ... KV_SIMD_TARGET_END: every function
 * defined between them is compiled for those features (GCC's target pragma,
 * clang's attribute push), so one binary still runs on CPUs without them
 * as long as the dispatcher calls these functions only where cpuid says
 * the features exist. */
#if defined(__clang__)
#define KV_SIMD_TARGET_BEGIN(features) \
    KV_SIMD_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define KV_SIMD_TARGET_END KV_SIMD_PRAGMA(clang attribute pop)
#else
#define KV_SIMD_TARGET_BEGIN(features) KV_SIMD_PRAGMA(GCC push_options) KV_SIMD_PRAGMA(GCC target(features))
#define KV_SIMD_TARGET_END KV_SIMD_PRAGMA(GCC pop_options)
#endif

#define KV_SIMD_AVX2 static inline __attribute__((always_inline, target("avx2")))

/* Sum of the 8 lanes: the high half onto the low, then pairs, then the
 * last two (the order every caller's reference comparison was made with). */
KV_SIMD_AVX2 float kv_hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Maximum of the 8 lanes, folded in the same order as kv_hsum256. */
KV_SIMD_AVX2 float kv_hmax256(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Sum of the 8 int32 lanes (wrapping). */
KV_SIMD_AVX2 int kv_hsum256i(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return _mm_cvtsi128_si32(h);
}

#undef KV_SIMD_AVX2

/* The lanes of a 16-lane vector that hold data when `left` elements remain
 * (all 16 when left >= 16; left > 0). */
static inline __mmask16 kv_tail16(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

#endif /* x86 with GCC or clang */

#endif
