/* cpu_attention_avx2.c - AVX2 + FMA + F16C kernels of the CPU paged
 * attention (scores, weighted sums, softmax pieces over a tile, reading
 * every KV dtype in place: int8 and fp8 expanded in registers) and of
 * kv_store's row encoders. Compiled for that target with a file-wide
 * pragma, as matmul_avx2.c is; cpu_attention.c calls them only when the
 * CPU has the features. Same batch-invariance contract as the reference
 * (cpu_attention.c's header). */
#include "cpu_attention_isa.h"

#ifdef KV_HAVE_X86_KERNELS

#include <math.h>

#include "simd_x86.h"

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c")

#define INL static inline __attribute__((always_inline))
/* The per-head / per-vector loops have compile-time bounds: unrolled, their
 * accumulators live in registers. */
#define UNROLL _Pragma("GCC unroll 16")

/* fp8 codes -> IEEE half bits: e5m2 is the top byte of a half; e4m3 shifted
 * into a half's fields is the value / 256 (both normal and subnormal). */
INL __m128i fp8_to_half(__m128i b8, int e4) {
    __m128i w = _mm_cvtepu8_epi16(b8);
    if (!e4) return _mm_slli_epi16(w, 8);
    return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                        _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
}

/* Eight elements c.. of a row, expanded (quantized: without their scale;
 * int8_asym: with scale sc and min mn). */
INL __m256 ld8(const uint8_t *row, const int DT, int c, __m256 sc, __m256 mn) {
    switch (DT) {
    case KV_CACHE_F32: return _mm256_loadu_ps((const float *)(row + 4 * (size_t)c));
    case KV_CACHE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)c)));
    default: break;
    }
    __m128i b = _mm_loadl_epi64((const __m128i *)(row + c));
    switch (DT) {
    case KV_CACHE_INT8: return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    case KV_CACHE_INT8_ASYM: return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), sc, mn);
    case KV_CACHE_FP8_E5M2: return _mm256_cvtph_ps(fp8_to_half(b, 0));
    default: {
        __m256 x = _mm256_cvtph_ps(fp8_to_half(b, 1));
        /* e4m3's only NaN codes are S.1111.111 */
        __m128i lo = _mm_and_si128(_mm_cvtepu8_epi16(b), _mm_set1_epi16(0x7f));
        __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(lo, _mm_set1_epi16(0x7f)));
        return _mm256_blendv_ps(x, _mm256_set1_ps(NAN), _mm256_castsi256_ps(nan));
    }
    }
}

/* The four sums of a0..a3 in one vector (each reduced in the same order). */
INL __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Four context tokens at a time: every query vector load serves four rows,
 * NH * 4 independent accumulator chains, and one 4-way horizontal sum per
 * head instead of four. Keys past nt repeat the last one (not stored). */
INL void scores_avx2_nh(const float *const *q, int hd, const uint8_t *rows, size_t stride, int nt,
                               float scale, float *s, int ss, attn_pf *pf, const int NH, const int DT) {
    const int hd8 = hd & ~7;
    for (int t = 0; t < nt; t += 4) {
        attn_pf_step(pf, t);
        const uint8_t *r[4];
        float sk[4], mk[4];
        key_quad(rows, stride, t, nt, hd, DT, r, sk, mk);
        __m256 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm256_setzero_ps();
        for (int c = 0; c < hd8; c += 8) {
            __m256 x[4];
            UNROLL for (int k = 0; k < 4; k++)
                x[k] = ld8(r[k], DT, c, _mm256_set1_ps(sk[k]), _mm256_set1_ps(mk[k]));
            UNROLL for (int h = 0; h < NH; h++) {
                __m256 qv = _mm256_loadu_ps(q[h] + c);
                UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm256_fmadd_ps(qv, x[k], a[h][k]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++) {
            float out[4];
            _mm_storeu_ps(out, hsum4x8(a[h][0], a[h][1], a[h][2], a[h][3]));
            for (int k = 0; k < 4 && t + k < nt; k++) {
                float tail = 0.0f;
                for (int c = hd8; c < hd; c++)
                    tail += q[h][c] * raw_scalar(r[k], c, (kv_cache_dtype)DT, sk[k], mk[k]);
                s[h * ss + t + k] = (out[k] + tail) * (ATTN_DT_FOLDS(DT) ? scale * sk[k] : scale);
            }
        }
    }
}

static void scores_avx2(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                               kv_cache_dtype d, float scale, float *s, int ss, attn_pf *pf) {
#define CALL(NH, DT) scores_avx2_nh(q, hd, rows, stride, nt, scale, s, ss, pf, NH, DT)
    ATTN_SWITCH(nr, d, CALL)
#undef CALL
}

/* Column groups of CV vectors keep NH * CV independent accumulator chains
 * in registers (16 ymm: CV = 4 up to 2 heads, 2 beyond). */
INL void accum_avx2_nh(float *const *acc, int hd, const uint8_t *rows, size_t stride, int nt,
                              const float *p, int ps, attn_pf *pf, const int NH, const int DT) {
    const int CV = NH <= 2 ? 4 : 2;
    const int hd8 = hd & ~7;
    for (int c0 = 0; c0 < hd8; c0 += 8 * CV) {
        const int nv = KV_MIN(CV, (hd8 - c0) / 8);
        __m256 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < CV; v++) a[h][v] = v < nv ? _mm256_loadu_ps(acc[h] + c0 + 8 * v) : _mm256_setzero_ps();
        for (int t = 0; t < nt; t++) {
            if (c0 == 0 && !(t & 3)) attn_pf_step(pf, t);
            const uint8_t *r = rows + (size_t)t * stride;
            float sc, mn;
            row_factors(r, hd, DT, &sc, &mn);
            __m256 x[4];
            UNROLL for (int v = 0; v < CV; v++)
                x[v] = v < nv ? ld8(r, DT, c0 + 8 * v, _mm256_set1_ps(sc), _mm256_set1_ps(mn)) : _mm256_setzero_ps();
            UNROLL for (int h = 0; h < NH; h++) {
                __m256 w = _mm256_set1_ps(ATTN_DT_FOLDS(DT) ? p[h * ps + t] * sc : p[h * ps + t]);
                UNROLL for (int v = 0; v < CV; v++) a[h][v] = _mm256_fmadd_ps(w, x[v], a[h][v]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < CV; v++) if (v < nv) _mm256_storeu_ps(acc[h] + c0 + 8 * v, a[h][v]);
    }
    for (int c = hd8; c < hd; c++)
        for (int t = 0; t < nt; t++) {
            const uint8_t *r = rows + (size_t)t * stride;
            float sc, mn;
            row_factors(r, hd, DT, &sc, &mn);
            float x = raw_scalar(r, c, (kv_cache_dtype)DT, sc, mn);
            UNROLL for (int h = 0; h < NH; h++)
                acc[h][c] += (ATTN_DT_FOLDS(DT) ? p[h * ps + t] * sc : p[h * ps + t]) * x;
        }
}

static void accum_avx2(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                              kv_cache_dtype d, const float *p, int ps, attn_pf *pf) {
#define CALL(NH, DT) accum_avx2_nh(acc, hd, rows, stride, nt, p, ps, pf, NH, DT)
    ATTN_SWITCH(nr, d, CALL)
#undef CALL
}

/* exp(x) for x <= 0 (cpu_attention_isa.h's ATTN_EXP_*); inputs below -87.3
 * are clamped (exp ~1e-38, nothing next to the 1.0 of the running maximum). */
INL __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ATTN_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ATTN_EXP_LN2_LO), r);
    __m256 y = _mm256_set1_ps(attn_exp_poly[0]);
    UNROLL for (int i = 1; i < 7; i++) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(attn_exp_poly[i]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static float expsum_avx2(float *s, int n, float m) {
    __m256 vm = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = kv_hsum256(sum);
    if (i < n) {
        float tmp[8] = {0};
        for (int j = i; j < n; j++) tmp[j - i] = s[j] - m;
        _mm256_storeu_ps(tmp, exp8(_mm256_loadu_ps(tmp)));
        for (int j = i; j < n; j++) {
            s[j] = tmp[j - i];
            t += s[j];
        }
    }
    return t;
}

static float maxf_avx2(const float *s, int n) {
    int i = 0;
    float mx = s[0];
    if (n >= 8) {
        __m256 v = _mm256_loadu_ps(s);
        for (i = 8; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(s + i));
        mx = kv_hmax256(v);
    }
    for (; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    return mx;
}

static void scalev_avx2(float *a, int n, float f) {
    const __m256 vf = _mm256_set1_ps(f);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), vf));
    for (; i < n; i++) a[i] *= f;
}

/* int8 keys against int8 queries in integers without VNNI: per 32 codes,
 * the key's magnitudes |k| (unsigned) times the query codes carrying the
 * key's sign (vpsignb), summed in pairs by vpmaddubsw (|pair| <= 2 * 127 *
 * 127: no saturation, the symmetric codes lie in -127..127) and to int32 by
 * vpmaddwd with ones: the exact dot, as the reference's. Four keys and two
 * query rows a pass (their 8 accumulators, the two query vectors and the
 * temporaries fit the 16 registers); codes past the last whole 32 are
 * added in scalar integers. */
INL void scores_q8_avx2_nh(const int8_t *const *qq, const float *qd, int hd, const uint8_t *rows, size_t stride,
                           int nt, float scale, float *s, int ss, attn_pf *pf, const int NH) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int hd32 = hd & ~31;
    const uint8_t *r[4];
    float sk[4], mk[4];
    for (int t = 0; t < nt; t += 4) {
        key_quad(rows, stride, t, nt, hd, KV_CACHE_INT8, r, sk, mk);
        attn_pf_step(pf, t);
        const __m128 vsk = _mm_loadu_ps(sk);
        UNROLL for (int h0 = 0; h0 < NH; h0 += 2) {
            const int nh = NH - h0 >= 2 ? 2 : 1;
            __m256i a[2][4];
            UNROLL for (int h = 0; h < 2; h++)
                UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm256_setzero_si256();
            for (int c = 0; c < hd32; c += 32) {
                __m256i qv[2];
                UNROLL for (int h = 0; h < 2; h++)
                    if (h < nh) qv[h] = _mm256_loadu_si256((const __m256i *)(const void *)(qq[h0 + h] + c));
                UNROLL for (int k = 0; k < 4; k++) {
                    const __m256i kx = _mm256_loadu_si256((const __m256i *)(const void *)(r[k] + c));
                    const __m256i ka = _mm256_abs_epi8(kx);
                    UNROLL for (int h = 0; h < 2; h++)
                        if (h < nh)
                            a[h][k] = _mm256_add_epi32(
                                a[h][k], _mm256_madd_epi16(_mm256_maddubs_epi16(ka, _mm256_sign_epi8(qv[h], kx)), ones));
                }
            }
            UNROLL for (int h = 0; h < 2; h++) {
                if (h >= nh) continue;
                const int8_t *q = qq[h0 + h];
                __m256i h01 = _mm256_hadd_epi32(a[h][0], a[h][1]), h23 = _mm256_hadd_epi32(a[h][2], a[h][3]);
                __m256i hh = _mm256_hadd_epi32(h01, h23);
                __m128i d = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
                if (hd32 < hd) {
                    int32_t tl[4];
                    UNROLL for (int k = 0; k < 4; k++) {
                        tl[k] = 0;
                        for (int c = hd32; c < hd; c++) tl[k] += (int32_t)q[c] * (int8_t)r[k][c];
                    }
                    d = _mm_add_epi32(d, _mm_loadu_si128((const __m128i *)(const void *)tl));
                }
                /* attn_q8_score lane by lane: idot * (scale * qd * ks) */
                const __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(d), _mm_mul_ps(_mm_set1_ps(scale * qd[h0 + h]), vsk));
                float out[4];
                _mm_storeu_ps(out, v);
                for (int k = 0; k < 4 && t + k < nt; k++) s[(h0 + h) * ss + t + k] = out[k];
            }
        }
    }
}

static void scores_q8_avx2(const int8_t *const *qq, const float *qd, const int32_t *qsum, int nr, int hd,
                           const uint8_t *rows, size_t stride, int nt, float scale, float *s, int ss, attn_pf *pf) {
    (void)qsum;
#define CALLQ(NH) \
    (hd == 64 ? scores_q8_avx2_nh(qq, qd, 64, rows, stride, nt, scale, s, ss, pf, NH) \
              : scores_q8_avx2_nh(qq, qd, hd, rows, stride, nt, scale, s, ss, pf, NH))
    switch (nr) {
    case 1: CALLQ(1); break;
    case 2: CALLQ(2); break;
    case 3: CALLQ(3); break;
    case 4: CALLQ(4); break;
    default: break;
    }
#undef CALLQ
}

const kv_attn_kernels kv_attn_kernels_avx2 = {scores_avx2, accum_avx2,  expsum_avx2, maxf_avx2,
                                              scalev_avx2, ATTN_DT_ALL, scores_q8_avx2};

/* ---- kv_store row encoders ---- */

void kv_attn_f16_encode_avx2(const float *src, uint8_t *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + 2 * (size_t)i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        uint16_t h = kv_fp32_to_fp16(src[i]);
        memcpy(dst + 2 * (size_t)i, &h, 2);
    }
}

/* The reference's fp8 rounding (kv_dtype.c fp8_encode) on 8 lanes, in the
 * same integer steps: NaN, infinity and f32 zero/subnormal first, then the
 * normal or subnormal code with round-half-even on the dropped bits and the
 * clamp to the largest finite code. */
static __m256i fp8_encode8(__m256 f, int mbits, int bias, int max_code, int nan_code) {
    const __m256i x = _mm256_castps_si256(f), one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80));
    const __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(ax, 23), _mm256_set1_epi32(127 - bias));
    const __m256i m = _mm256_and_si256(ax, _mm256_set1_epi32(0x7fffff));
    const __m256i normal = _mm256_cmpgt_epi32(e, zero); /* e >= 1 */
    /* normal: shift 23 - mbits, the exponent above the kept bits; subnormal:
     * the implicit bit joins and the shift grows by 1 - e */
    const __m256i mm = _mm256_blendv_epi8(_mm256_or_si256(m, _mm256_set1_epi32(0x800000)), m, normal);
    const __m256i sh = _mm256_blendv_epi8(_mm256_sub_epi32(_mm256_set1_epi32(24 - mbits), e),
                                          _mm256_set1_epi32(23 - mbits), normal);
    const __m256i too_small = _mm256_cmpgt_epi32(sh, _mm256_set1_epi32(24)); /* shift >= 25 */
    const __m256i shc = _mm256_min_epi32(sh, _mm256_set1_epi32(24));       /* keeps the shifts below defined */
    __m256i code = _mm256_srlv_epi32(mm, shc);
    code = _mm256_or_si256(code, _mm256_and_si256(normal, _mm256_slli_epi32(e, mbits)));
    const __m256i half = _mm256_sllv_epi32(one, _mm256_sub_epi32(shc, one));
    const __m256i rem = _mm256_and_si256(mm, _mm256_sub_epi32(_mm256_sllv_epi32(one, shc), one));
    const __m256i up = _mm256_or_si256(_mm256_cmpgt_epi32(rem, half),
                                       _mm256_and_si256(_mm256_cmpeq_epi32(rem, half),
                                                        _mm256_cmpeq_epi32(_mm256_and_si256(code, one), one)));
    code = _mm256_sub_epi32(code, up); /* up is -1 where rounding up */
    code = _mm256_min_epi32(code, _mm256_set1_epi32(max_code));
    code = _mm256_andnot_si256(too_small, code);
    /* f32 zero or subnormal (biased exponent 0): the sign alone */
    code = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_srli_epi32(ax, 23), zero), code);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(max_code), _mm256_cmpeq_epi32(ax, inf));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(nan_code), _mm256_cmpgt_epi32(ax, inf));
    return _mm256_or_si256(sign, code);
}

/* absmax of a row as the reference computes it (NaN ignored). */
static float absmax_avx2(const float *src, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)), mx);
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, mx);
    for (int k = 0; k < 8; k++)
        if (lanes[k] > amax) amax = lanes[k];
    for (; i < n; i++)
        if (fabsf(src[i]) > amax) amax = fabsf(src[i]);
    return amax;
}

void kv_attn_fp8_encode_avx2(const float *src, uint8_t *dst, int n, int e4) {
    const int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15, max_code = e4 ? 0x7e : 0x7b, nan_code = e4 ? 0x7f : 0x7e;
    const float scale = absmax_avx2(src, n) / (e4 ? KV_FP8_E4M3_MAX : KV_FP8_E5M2_MAX);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    const __m256 vi = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i c = fp8_encode8(_mm256_mul_ps(_mm256_loadu_ps(src + i), vi), mbits, bias, max_code, nan_code);
        __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64((__m128i *)(dst + i), _mm_packus_epi16(w16, w16));
    }
    for (; i < n; i++) dst[i] = e4 ? kv_fp8_e4m3_from_fp32(src[i] * inv) : kv_fp8_e5m2_from_fp32(src[i] * inv);
    memcpy(dst + n, &scale, 4);
}
/* Symmetric int8 with the reference's exact arithmetic (kv_dtype_encode_row):
 * the same absmax (NaN ignored: max_ps returns its second operand when one
 * is NaN), the same scale and inverse, the same product rounded to nearest
 * even, the same clamp (a NaN product clamps to -127 as fmaxf does); the
 * reference's rintf/fminf/fmaxf are libm calls at -O2 and made the int8
 * cache's writes cost ~8% of a 32-request decode step. */
void kv_attn_int8_encode_avx2(const float *src, uint8_t *dst, int n) {
    const float scale = absmax_avx2(src, n) / 127.0f, inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
        __m256i w = _mm256_cvtps_epi32(q);
        __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storel_epi64((__m128i *)(dst + i), _mm_packs_epi16(w16, w16));
    }
    for (; i < n; i++) {
        float q = fminf(fmaxf(rintf(src[i] * inv), -127.0f), 127.0f);
        dst[i] = (uint8_t)(int8_t)q;
    }
    memcpy(dst + n, &scale, 4);
}

KV_SIMD_TARGET_END

#endif
