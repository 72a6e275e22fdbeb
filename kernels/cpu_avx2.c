/* cpu_avx2.c - AVX2 + FMA paths of the cpu backend's element-wise ops
 * (rmsnorm's sum of squares, silu_mul), compiled for that target with a
 * file-wide pragma as matmul_avx2.c is; cpu.c calls them only when the CPU
 * has the features and keeps the scalar reference. */
#include "cpu_internal.h"

#ifdef KV_HAVE_X86_KERNELS

#include "simd_x86.h"

KV_SIMD_TARGET_BEGIN("avx2,fma")

float kv_cpu_sumsq_avx2(const float *x, int dim) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= dim; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    a0 = _mm256_add_ps(a0, a1);
    float s = kv_hsum256(a0);
    for (; i < dim; i++) s += x[i] * x[i];
    return s;
}

/* exp(x) for x in [-87.3, 88.7] (clamped), Cody-Waite reduction and a
 * degree-6 polynomial: within 2 ulp of expf. */
static inline __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

int64_t kv_cpu_silu_mul_avx2(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    return i;
}

static inline __m256 gelu_mul8(__m256 x, __m256 u) {
    const __m256 c2 = _mm256_set1_ps(2.0f * 0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
    /* kv_gelu_mul_ref's order: x / (1 + exp(-c2 * x * (1 + k x x))) * u */
    const __m256 inner = _mm256_mul_ps(_mm256_mul_ps(c2, x), _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(_mm256_mul_ps(k, x), x)));
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), inner));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void kv_cpu_gelu_mul_avx2(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, gelu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(g + i, m, gelu_mul8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m)));
    }
}

int32_t kv_cpu_logits_scan_row_avx2(const float *x, int n, uint8_t *finite) {
    const __m256i expm = _mm256_set1_epi32(0x7f800000), step = _mm256_set1_epi32(8);
    __m256 bv = _mm256_set1_ps(x[0]);
    __m256i bi = _mm256_setzero_si256(), idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), bad = _mm256_setzero_si256();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 gt = _mm256_cmp_ps(v, bv, _CMP_GT_OQ); /* false against NaN, either side */
        bv = _mm256_blendv_ps(bv, v, gt);
        bi = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(idx), gt));
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), expm), expm));
        idx = _mm256_add_epi32(idx, step);
    }
    float vals[8];
    int32_t ids[8];
    _mm256_storeu_ps(vals, bv);
    _mm256_storeu_si256((__m256i *)(void *)ids, bi);
    /* each lane's value is x[0] or above it: the largest, the first index
     * among the lanes holding it (a NaN x[0] compares false: 0 stays) */
    float best = x[0];
    int32_t at = 0;
    for (int l = 0; l < 8; l++)
        if (vals[l] > best || (vals[l] == best && ids[l] < at)) {
            best = vals[l];
            at = ids[l];
        }
    const uint32_t tail = kv_logits_scan_steps(x, i, n, &best, &at);
    *finite = (uint8_t)(_mm256_testz_si256(bad, bad) && !tail);
    return at;
}

KV_SIMD_TARGET_END

#endif
