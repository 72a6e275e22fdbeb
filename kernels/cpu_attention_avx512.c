/* cpu_attention_avx512.c - AVX-512 (F + BW + VL + VNNI) kernels of the CPU
 * paged attention: cpu_attention_avx2.c's kernels on 16 lanes, the last
 * vector of a row masked instead of a scalar tail, and int8 keys scored in
 * integers (vpdpbusd, 64 codes an instruction) against int8 queries. Compiled for that target with a
 * file-wide pragma, as matmul_avx512.c is; cpu_attention.c calls them only
 * when the CPU has the features. */
#include "cpu_attention_isa.h"

#ifdef KV_HAVE_X86_KERNELS

#include <math.h>

#include "simd_x86.h"

KV_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "simd_avx512.h"

#define INL static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* Sixteen elements c.. of a row (lanes outside m are zero, no memory past
 * them is touched), expanded as ld8 does. */
INL __m512 ld16(const uint8_t *row, const int DT, int c, __mmask16 m, __m512 sc, __m512 mn) {
    switch (DT) {
    case KV_CACHE_F32: return _mm512_maskz_loadu_ps(m, row + 4 * (size_t)c);
    case KV_CACHE_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * (size_t)c));
    default: break;
    }
    __m128i b = _mm_maskz_loadu_epi8(m, row + c);
    switch (DT) {
    case KV_CACHE_INT8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    case KV_CACHE_INT8_ASYM: return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), sc, mn);
    case KV_CACHE_FP8_E5M2: return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
    default: {
        __m256i w = _mm256_cvtepu8_epi16(b);
        __m256i lo = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(lo, 7));
        __m512 x = _mm512_cvtph_ps(h);
        /* e4m3's only NaN codes are S.1111.111 */
        return _mm512_mask_mov_ps(x, _mm256_cmpeq_epi16_mask(lo, _mm256_set1_epi16(0x7f)), _mm512_set1_ps(NAN));
    }
    }
}

/* The four sums of a0..a3 in one vector: each folded to 8 lanes, then
 * reduced as cpu_attention_avx2.c's hsum4x8 does (the same order). */
INL __m128 hsum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define FOLD(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(FOLD(a0), FOLD(a1)), _mm256_hadd_ps(FOLD(a2), FOLD(a3)));
#undef FOLD
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* As scores_avx2_nh, 16 lanes; the last vector of a row is masked. */
INL void scores_512_nh(const float *const *q, int hd, const uint8_t *rows, size_t stride, int nt,
                             float scale, float *s, int ss, attn_pf *pf, const int NH, const int DT) {
    for (int t = 0; t < nt; t += 4) {
        attn_pf_step(pf, t);
        const uint8_t *r[4];
        float sk[4], mk[4];
        key_quad(rows, stride, t, nt, hd, DT, r, sk, mk);
        __m512 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_setzero_ps();
        for (int c = 0; c < hd; c += 16) {
            const __mmask16 m = kv_tail16(hd - c);
            __m512 x[4];
            UNROLL for (int k = 0; k < 4; k++)
                x[k] = ld16(r[k], DT, c, m, _mm512_set1_ps(sk[k]), _mm512_set1_ps(mk[k]));
            UNROLL for (int h = 0; h < NH; h++) {
                __m512 qv = _mm512_maskz_loadu_ps(m, q[h] + c); /* zero lanes cancel int8_asym's min */
                UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_fmadd_ps(qv, x[k], a[h][k]);
            }
        }
        __m128 vs = _mm_set1_ps(scale);
        if (ATTN_DT_FOLDS(DT)) vs = _mm_mul_ps(vs, _mm_loadu_ps(sk));
        UNROLL for (int h = 0; h < NH; h++) {
            __m128 v = _mm_mul_ps(hsum4x16(a[h][0], a[h][1], a[h][2], a[h][3]), vs);
            if (t + 4 <= nt) {
                _mm_storeu_ps(s + h * ss + t, v);
            } else {
                float out[4];
                _mm_storeu_ps(out, v);
                for (int k = 0; t + k < nt; k++) s[h * ss + t + k] = out[k];
            }
        }
    }
}

static void scores_512(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                             kv_cache_dtype d, float scale, float *s, int ss, attn_pf *pf) {
#define CALL(NH, DT) scores_512_nh(q, hd, rows, stride, nt, scale, s, ss, pf, NH, DT)
#define CALL64(NH, DT) scores_512_nh(q, 64, rows, stride, nt, scale, s, ss, pf, NH, DT)
    if (hd == 64) {
        ATTN_SWITCH(nr, d, CALL64)
    } else {
        ATTN_SWITCH(nr, d, CALL)
    }
#undef CALL64
#undef CALL
}

/* Column groups of VN (<= 4) vectors (16 * VN floats): NH * VN independent
 * accumulator chains; lanes past head_dim are masked off (no memory is
 * touched). VN = 1 for head_dim <= 16 (stories260K's 8), where the other
 * three vectors of a 64-column group would be all masked and only cost
 * their loads and fmas; the active lanes see the same operations. */
INL void accum_512_nh(float *const *acc, int hd, const uint8_t *rows, size_t stride, int nt, const float *p,
                            int ps, attn_pf *pf, const int NH, const int DT, const int VN) {
    for (int c0 = 0; c0 < hd; c0 += 16 * VN) {
        __mmask16 m[4];
        UNROLL for (int v = 0; v < VN; v++) {
            int rem = hd - c0 - 16 * v;
            m[v] = rem > 0 ? kv_tail16(rem) : (__mmask16)0;
        }
        __m512 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < VN; v++) a[h][v] = _mm512_maskz_loadu_ps(m[v], acc[h] + c0 + 16 * v);
        for (int t = 0; t < nt; t++) {
            if (c0 == 0 && !(t & 3)) attn_pf_step(pf, t);
            const uint8_t *r = rows + (size_t)t * stride;
            float sc, mn;
            row_factors(r, hd, DT, &sc, &mn);
            __m512 x[4];
            UNROLL for (int v = 0; v < VN; v++) x[v] = ld16(r, DT, c0 + 16 * v, m[v], _mm512_set1_ps(sc), _mm512_set1_ps(mn));
            UNROLL for (int h = 0; h < NH; h++) {
                __m512 w = _mm512_set1_ps(ATTN_DT_FOLDS(DT) ? p[h * ps + t] * sc : p[h * ps + t]);
                UNROLL for (int v = 0; v < VN; v++) a[h][v] = _mm512_fmadd_ps(w, x[v], a[h][v]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < VN; v++) _mm512_mask_storeu_ps(acc[h] + c0 + 16 * v, m[v], a[h][v]);
    }
}

static void accum_512(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                            kv_cache_dtype d, const float *p, int ps, attn_pf *pf) {
#define CALL(NH, DT) accum_512_nh(acc, hd, rows, stride, nt, p, ps, pf, NH, DT, 4)
#define CALL64(NH, DT) accum_512_nh(acc, 64, rows, stride, nt, p, ps, pf, NH, DT, 4)
#define CALL16(NH, DT) accum_512_nh(acc, hd, rows, stride, nt, p, ps, pf, NH, DT, 1)
    if (hd == 64) {
        ATTN_SWITCH(nr, d, CALL64)
    } else if (hd <= 16) {
        ATTN_SWITCH(nr, d, CALL16)
    } else {
        ATTN_SWITCH(nr, d, CALL)
    }
#undef CALL16
#undef CALL64
#undef CALL
}

/* exp(x), x <= 0, as exp8; scalef gives exact 2^n scaling and flushes to 0
 * on underflow, so no clamp is needed. */
INL __m512 exp16(__m512 x) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(ATTN_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ATTN_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ATTN_EXP_LN2_LO), r);
    __m512 y = _mm512_set1_ps(attn_exp_poly[0]);
    UNROLL for (int i = 1; i < 7; i++) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(attn_exp_poly[i]));
    return _mm512_scalef_ps(y, n);
}

static float expsum_512(float *s, int n, float m) {
    __m512 vm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = kv_tail16(n - i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), vm));
        _mm512_mask_storeu_ps(s + i, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

static float maxf_512(const float *s, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = kv_tail16(n - i);
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + i));
    }
    return _mm512_reduce_max_ps(mx);
}

static void scalev_512(float *a, int n, float f) {
    const __m512 vf = _mm512_set1_ps(f);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = kv_tail16(n - i);
        _mm512_mask_storeu_ps(a + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, a + i), vf));
    }
}

/* The four int32 sums of a0..a3 in one vector (exact in any order). */
INL __m128i hsum4x16i(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
#define FOLD(a) _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1))
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(FOLD(a0), FOLD(a1)), _mm256_hadd_epi32(FOLD(a2), FOLD(a3)));
#undef FOLD
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* int8 keys against int8 queries, four keys at a time: a key's 64 codes
 * become unsigned (x ^ 0x80 = x + 128) and vpdpbusd takes their products
 * with the signed query codes in four-code groups per int32 lane, so the
 * sum is the dot plus 128 * qsum. Codes past hd are zero in the query (no
 * memory past the row is touched). */
INL void scores_q8_512_nh(const int8_t *const *qq, const float *qd, const int32_t *qsum, int hd,
                          const uint8_t *rows, size_t stride, int nt, float scale, float *s, int ss, attn_pf *pf,
                          const int NH) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int t = 0; t < nt; t += 4) {
        attn_pf_step(pf, t);
        const uint8_t *r[4];
        float sk[4], mk[4];
        key_quad(rows, stride, t, nt, hd, KV_CACHE_INT8, r, sk, mk);
        __m512i a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_setzero_si512();
        for (int c = 0; c < hd; c += 64) {
            const __mmask64 m = hd - c >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (hd - c)) - 1;
            __m512i x[4];
            UNROLL for (int k = 0; k < 4; k++) x[k] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, r[k] + c), bias);
            UNROLL for (int h = 0; h < NH; h++) {
                const __m512i qv = _mm512_maskz_loadu_epi8(m, qq[h] + c);
                UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_dpbusd_epi32(a[h][k], x[k], qv);
            }
        }
        /* attn_q8_score on four keys at once: (float)dot * (scale * qd * ks),
         * the same two roundings per key */
        const __m128 ks = _mm_loadu_ps(sk);
        const __mmask8 keep = t + 4 <= nt ? (__mmask8)0xF : (__mmask8)((1u << (nt - t)) - 1u);
        UNROLL for (int h = 0; h < NH; h++) {
            const __m128i d = _mm_sub_epi32(hsum4x16i(a[h][0], a[h][1], a[h][2], a[h][3]), _mm_set1_epi32(128 * qsum[h]));
            const __m128 f = _mm_mul_ps(_mm_set1_ps(scale * qd[h]), ks);
            _mm_mask_storeu_ps(s + h * ss + t, keep, _mm_mul_ps(_mm_cvtepi32_ps(d), f));
        }
    }
}

/* x[g] lane k = x[k] lane g on entry: a 16 x 16 transpose of dwords
 * (32-bit and 64-bit unpacks inside 128-bit lanes, then a 4 x 4 transpose
 * of the lanes), 64 shuffles. */
INL void tr16x16_epi32(__m512i x[16]) {
    __m512i t[16];
    UNROLL for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
    }
    /* u[4i + d], 128-bit lane L: dword 4L + d of rows 4i..4i+3 */
    UNROLL for (int i = 0; i < 16; i += 4) {
        x[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        x[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        x[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        x[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    UNROLL for (int d = 0; d < 4; d++) {
        const __m512i v0 = _mm512_shuffle_i32x4(x[d], x[4 + d], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i v1 = _mm512_shuffle_i32x4(x[d], x[4 + d], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i v2 = _mm512_shuffle_i32x4(x[8 + d], x[12 + d], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i v3 = _mm512_shuffle_i32x4(x[8 + d], x[12 + d], _MM_SHUFFLE(3, 2, 3, 2));
        t[d] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + d] = _mm512_shuffle_i32x4(v0, v2, _MM_SHUFFLE(3, 1, 3, 1));
        t[8 + d] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + d] = _mm512_shuffle_i32x4(v1, v3, _MM_SHUFFLE(3, 1, 3, 1));
    }
    UNROLL for (int g = 0; g < 16; g++) x[g] = t[g];
}

/* scores_q8_512_nh on sixteen keys at a time, for head_dim a multiple of
 * 64: each 64-code slice of the 16 keys is transposed (keys into lanes,
 * 4-code groups into vectors), so vpdpbusd against the query's 4-code
 * group broadcast yields the 16 keys' partial dots in their own lanes and
 * no horizontal sum is left. The transpose is paid once per slice for all
 * NH rows (the query heads of a kv head) where the sums were paid per row.
 * The integer dots are exact in any order and the float steps are the
 * four-key kernel's, key for key, so the scores' bits are the same. */
INL void scores_q8_512_k16(const int8_t *const *qq, const float *qd, const int32_t *qsum, int hd,
                           const uint8_t *rows, size_t stride, int nt, float scale, float *s, int ss, attn_pf *pf,
                           const int NH) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int t = 0; t < nt; t += 16) {
        const uint8_t *r[16];
        float sk[16];
        UNROLL for (int k = 0; k < 16; k++) {
            r[k] = rows + (size_t)KV_MIN(t + k, nt - 1) * stride;
            sk[k] = row_scale(r[k], hd, KV_CACHE_INT8);
        }
        /* two chains per row (even and odd groups): one chain of 16
         * dependent vpdpbusd per 64 codes waited on its latency */
        __m512i a[ATTN_HC][2];
        UNROLL for (int h = 0; h < NH; h++) a[h][0] = a[h][1] = _mm512_setzero_si512();
        for (int c = 0; c < hd; c += 64) {
            __m512i x[16];
            UNROLL for (int k = 0; k < 16; k++) {
                if (c == 0 && !(k & 3)) attn_pf_step(pf, t + k);
                x[k] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(r[k] + c)), bias);
            }
            tr16x16_epi32(x);
            UNROLL for (int h = 0; h < NH; h++) {
                const int8_t *q = qq[h] + c;
                UNROLL for (int g = 0; g < 16; g++) a[h][g & 1] = kv_dpbusd_bcast512(a[h][g & 1], x[g], q + 4 * g);
            }
        }
        const __m512 ks = _mm512_loadu_ps(sk);
        const __mmask16 keep = kv_tail16(nt - t);
        UNROLL for (int h = 0; h < NH; h++) {
            const __m512i d = _mm512_sub_epi32(_mm512_add_epi32(a[h][0], a[h][1]), _mm512_set1_epi32(128 * qsum[h]));
            const __m512 f = _mm512_mul_ps(_mm512_set1_ps(scale * qd[h]), ks);
            _mm512_mask_storeu_ps(s + h * ss + t, keep, _mm512_mul_ps(_mm512_cvtepi32_ps(d), f));
        }
    }
}

static void scores_q8_512(const int8_t *const *qq, const float *qd, const int32_t *qsum, int nr, int hd,
                          const uint8_t *rows, size_t stride, int nt, float scale, float *s, int ss, attn_pf *pf) {
    const int k16 = hd % 64 == 0 && nt > 4;
#define Q8_ROWS(NH)                                                                                                    \
    (k16 ? scores_q8_512_k16(qq, qd, qsum, hd, rows, stride, nt, scale, s, ss, pf, NH)                              \
         : scores_q8_512_nh(qq, qd, qsum, hd, rows, stride, nt, scale, s, ss, pf, NH))
    switch (nr) {
    case 1: Q8_ROWS(1); break;
    case 2: Q8_ROWS(2); break;
    case 3: Q8_ROWS(3); break;
    case 4: Q8_ROWS(4); break;
    default: break;
    }
#undef Q8_ROWS
}

const kv_attn_kernels kv_attn_kernels_avx512 = {scores_512, accum_512,   expsum_512,   maxf_512,
                                                scalev_512, ATTN_DT_ALL, scores_q8_512};

KV_SIMD_TARGET_END

#endif
