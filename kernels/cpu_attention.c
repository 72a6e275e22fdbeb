/* cpu_attention.c - the CPU backend's paged KV ops: store K/V rows into
 * their slots (encoding to the cache dtype), copy blocks, and attention over
 * block tables with an online (flash-attention style) softmax: one pass
 * over the context per work item (a token and a range of its query heads),
 * items spread over the pool's threads balanced by context length. Scalar
 * reference kernels plus AVX2 and AVX-512 ones picked at run time; f32/f16
 * rows are read in place, the quantized dtypes are decoded a tile at a
 * time into a stack buffer. No allocation. */
#include "cpu_attention.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cpu.h"
#include "kv_dtype.h"
#include "types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTN_X86 1
#endif

#define ATTN_TILE 32      /* context tokens scored per step of the online softmax */
#define ATTN_HC 4         /* query heads of one GQA group processed together */
#define ATTN_HMAX 64      /* query heads of one work item */
#define ATTN_QBUF 8192    /* floats of decoded K or V rows for the quantized dtypes */

/* Per-ISA kernels over a tile of nt rows at rows + t * stride, each hd
 * elements of f32 (f16 = 0) or f16 (f16 = 1). Query and accumulator rows of
 * the nh heads are hd floats apart. */
typedef struct attn_kernels {
    /* s[h * ss + t] = scale * dot(q_h, row_t) */
    void (*scores)(const float *q, int nh, int hd, const uint8_t *rows, size_t stride, int nt, int f16,
                   float scale, float *s, int ss);
    /* acc_h += sum_t p[h * ps + t] * row_t */
    void (*accum)(float *acc, int nh, int hd, const uint8_t *rows, size_t stride, int nt, int f16,
                  const float *p, int ps);
    /* s[i] = exp(s[i] - m) for i < n; returns their sum */
    float (*expsum)(float *s, int n, float m);
    /* dst(nt, hd) = the nt quantized rows at src + t * stride, decoded */
    void (*decode)(kv_cache_dtype d, const uint8_t *src, size_t stride, int nt, int hd, float *dst);
} attn_kernels;

/* ---- scalar reference ---- */

static float ld_scalar(const uint8_t *row, int f16, int i) {
    if (f16) {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)i, 2);
        return kv_fp16_to_fp32(h);
    }
    float f;
    memcpy(&f, row + 4 * (size_t)i, 4);
    return f;
}

static void scores_scalar(const float *q, int nh, int hd, const uint8_t *rows, size_t stride, int nt, int f16,
                          float scale, float *s, int ss) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *r = rows + (size_t)t * stride;
        for (int h = 0; h < nh; h++) {
            const float *qh = q + (size_t)h * hd;
            float acc = 0.0f;
            for (int i = 0; i < hd; i++) acc += qh[i] * ld_scalar(r, f16, i);
            s[h * ss + t] = acc * scale;
        }
    }
}

static void accum_scalar(float *acc, int nh, int hd, const uint8_t *rows, size_t stride, int nt, int f16,
                         const float *p, int ps) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *r = rows + (size_t)t * stride;
        for (int h = 0; h < nh; h++) {
            float w = p[h * ps + t];
            float *a = acc + (size_t)h * hd;
            for (int i = 0; i < hd; i++) a[i] += w * ld_scalar(r, f16, i);
        }
    }
}

static float expsum_scalar(float *s, int n, float m) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

static void decode_scalar(kv_cache_dtype d, const uint8_t *src, size_t stride, int nt, int hd, float *dst) {
    for (int t = 0; t < nt; t++) kv_dtype_decode_row(d, src + (size_t)t * stride, dst + (size_t)t * hd, hd);
}

static const attn_kernels k_scalar = {scores_scalar, accum_scalar, expsum_scalar, decode_scalar};

#ifdef ATTN_X86
/* ---- AVX2 + FMA + F16C ---- */
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))
/* The per-head / per-vector loops have compile-time bounds: unrolled, their
 * accumulators live in registers. */
#define UNROLL _Pragma("GCC unroll 16")

INL T_AVX2 __m256 ld8(const uint8_t *row, int f16, int c) {
    if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)c)));
    return _mm256_loadu_ps((const float *)(row + 4 * (size_t)c));
}

INL T_AVX2 float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* The four sums of a0..a3 in one vector. */
INL T_AVX2 __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Four context tokens at a time: every query vector load serves four rows,
 * NH * 4 independent accumulator chains, and one 4-way horizontal sum per
 * head instead of four. Rows past nt repeat the last one (not stored). */
INL T_AVX2 void scores_avx2_nh(const float *q, int hd, const uint8_t *rows, size_t stride, int nt, float scale,
                               float *s, int ss, const int NH, const int F16) {
    const int hd8 = hd & ~7;
    const __m128 vs = _mm_set1_ps(scale);
    for (int t = 0; t < nt; t += 4) {
        const uint8_t *r[4];
        UNROLL for (int k = 0; k < 4; k++) r[k] = rows + (size_t)KV_MIN(t + k, nt - 1) * stride;
        __m256 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm256_setzero_ps();
        for (int c = 0; c < hd8; c += 8) {
            __m256 x[4];
            UNROLL for (int k = 0; k < 4; k++) x[k] = ld8(r[k], F16, c);
            UNROLL for (int h = 0; h < NH; h++) {
                __m256 qv = _mm256_loadu_ps(q + (size_t)h * hd + c);
                UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm256_fmadd_ps(qv, x[k], a[h][k]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++) {
            float out[4];
            _mm_storeu_ps(out, _mm_mul_ps(hsum4x8(a[h][0], a[h][1], a[h][2], a[h][3]), vs));
            for (int k = 0; k < 4 && t + k < nt; k++) {
                float tail = 0.0f;
                for (int c = hd8; c < hd; c++) tail += q[(size_t)h * hd + c] * ld_scalar(r[k], F16, c);
                s[h * ss + t + k] = out[k] + tail * scale;
            }
        }
    }
}

static T_AVX2 void scores_avx2(const float *q, int nh, int hd, const uint8_t *rows, size_t stride, int nt,
                               int f16, float scale, float *s, int ss) {
#define S2(NH)                                                                                 \
    case NH:                                                                                   \
        if (f16)                                                                               \
            scores_avx2_nh(q, hd, rows, stride, nt, scale, s, ss, NH, 1);                      \
        else                                                                                   \
            scores_avx2_nh(q, hd, rows, stride, nt, scale, s, ss, NH, 0);                      \
        break;
    switch (nh) { S2(1) S2(2) S2(3) S2(4) default: break; }
#undef S2
}

/* Column groups of CV vectors keep NH * CV independent accumulator chains
 * in registers (16 ymm: CV = 4 up to 2 heads, 2 beyond). */
INL T_AVX2 void accum_avx2_nh(float *acc, int hd, const uint8_t *rows, size_t stride, int nt, const float *p,
                              int ps, const int NH, const int F16) {
    const int CV = NH <= 2 ? 4 : 2;
    int c0 = 0;
    for (; c0 + 8 * CV <= hd; c0 += 8 * CV) {
        __m256 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < CV; v++) a[h][v] = _mm256_loadu_ps(acc + (size_t)h * hd + c0 + 8 * v);
        for (int t = 0; t < nt; t++) {
            const uint8_t *r = rows + (size_t)t * stride;
            __m256 x[4];
            UNROLL for (int v = 0; v < CV; v++) x[v] = ld8(r, F16, c0 + 8 * v);
            UNROLL for (int h = 0; h < NH; h++) {
                __m256 w = _mm256_broadcast_ss(p + h * ps + t);
                UNROLL for (int v = 0; v < CV; v++) a[h][v] = _mm256_fmadd_ps(w, x[v], a[h][v]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < CV; v++) _mm256_storeu_ps(acc + (size_t)h * hd + c0 + 8 * v, a[h][v]);
    }
    for (; c0 + 8 <= hd; c0 += 8) {
        __m256 a[ATTN_HC];
        UNROLL for (int h = 0; h < NH; h++) a[h] = _mm256_loadu_ps(acc + (size_t)h * hd + c0);
        for (int t = 0; t < nt; t++) {
            __m256 x = ld8(rows + (size_t)t * stride, F16, c0);
            UNROLL for (int h = 0; h < NH; h++) a[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + h * ps + t), x, a[h]);
        }
        UNROLL for (int h = 0; h < NH; h++) _mm256_storeu_ps(acc + (size_t)h * hd + c0, a[h]);
    }
    for (int c = c0; c < hd; c++)
        for (int t = 0; t < nt; t++) {
            float x = ld_scalar(rows + (size_t)t * stride, F16, c);
            UNROLL for (int h = 0; h < NH; h++) acc[(size_t)h * hd + c] += p[h * ps + t] * x;
        }
}

static T_AVX2 void accum_avx2(float *acc, int nh, int hd, const uint8_t *rows, size_t stride, int nt, int f16,
                              const float *p, int ps) {
#define A2(NH)                                                                                 \
    case NH:                                                                                   \
        if (f16)                                                                               \
            accum_avx2_nh(acc, hd, rows, stride, nt, p, ps, NH, 1);                            \
        else                                                                                   \
            accum_avx2_nh(acc, hd, rows, stride, nt, p, ps, NH, 0);                            \
        break;
    switch (nh) { A2(1) A2(2) A2(3) A2(4) default: break; }
#undef A2
}

/* exp(x) for x <= 0: 2^n * poly(r), |r| <= ln2/2, degree-6 Taylor (rel. err
 * ~2e-7); inputs below -87.3 are clamped (exp ~1e-38, nothing next to the
 * 1.0 of the running maximum). */
INL T_AVX2 __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 y = _mm256_set1_ps(1.0f / 720.0f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 120.0f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 24.0f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 6.0f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static T_AVX2 float expsum_avx2(float *s, int n, float m) {
    __m256 vm = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = hsum8(sum);
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

/* fp8 codes -> IEEE half bits: e5m2 is the top byte of a half; e4m3 shifted
 * into a half's fields is the value / 256 (both normal and subnormal), so
 * the caller multiplies by 256. */
INL T_AVX2 __m128i fp8_to_half(__m128i b8, int e4) {
    __m128i w = _mm_cvtepu8_epi16(b8);
    if (!e4) return _mm_slli_epi16(w, 8);
    return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                        _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
}

static T_AVX2 void decode_avx2(kv_cache_dtype d, const uint8_t *src, size_t stride, int nt, int hd, float *dst) {
    const int hd8 = hd & ~7;
    for (int t = 0; t < nt; t++) {
        const uint8_t *p = src + (size_t)t * stride;
        float *o = dst + (size_t)t * hd;
        float scale, mn = 0.0f;
        memcpy(&scale, p + hd, 4);
        if (d == KV_CACHE_INT8_ASYM) memcpy(&mn, p + hd + 4, 4);
        const int e4 = d == KV_CACHE_FP8_E4M3;
        const __m256 vs = _mm256_set1_ps(e4 ? scale * 256.0f : scale), vm = _mm256_set1_ps(mn);
        for (int c = 0; c < hd8; c += 8) {
            __m128i b = _mm_loadl_epi64((const __m128i *)(p + c));
            __m256 x;
            switch (d) {
            case KV_CACHE_INT8: x = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vs); break;
            case KV_CACHE_INT8_ASYM: x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), vs, vm); break;
            default:
                x = _mm256_mul_ps(_mm256_cvtph_ps(fp8_to_half(b, e4)), vs);
                if (e4) { /* e4m3's only NaN codes are S.1111.111 */
                    __m128i lo = _mm_and_si128(_mm_cvtepu8_epi16(b), _mm_set1_epi16(0x7f));
                    __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(lo, _mm_set1_epi16(0x7f)));
                    x = _mm256_blendv_ps(x, _mm256_set1_ps(NAN), _mm256_castsi256_ps(nan));
                }
                break;
            }
            _mm256_storeu_ps(o + c, x);
        }
        for (int c = hd8; c < hd; c++) /* the tail, as the reference does it */
            switch (d) {
            case KV_CACHE_INT8: o[c] = (float)(int8_t)p[c] * scale; break;
            case KV_CACHE_INT8_ASYM: o[c] = mn + (float)p[c] * scale; break;
            case KV_CACHE_FP8_E4M3: o[c] = kv_fp8_e4m3_to_fp32(p[c]) * scale; break;
            default: o[c] = kv_fp8_e5m2_to_fp32(p[c]) * scale; break;
            }
    }
}

static const attn_kernels k_avx2 = {scores_avx2, accum_avx2, expsum_avx2, decode_avx2};

/* ---- AVX-512 (F + BW + VL) ---- */
#define T_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

INL T_512 __m512 ld16(const uint8_t *row, int f16, int c, __mmask16 m) {
    if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * (size_t)c));
    return _mm512_maskz_loadu_ps(m, row + 4 * (size_t)c);
}

INL T_512 __m128 hsum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define FOLD(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    return hsum4x8(FOLD(a0), FOLD(a1), FOLD(a2), FOLD(a3));
#undef FOLD
}

/* As scores_avx2_nh, 16 lanes; the last vector of a row is masked. */
INL T_512 void scores_512_nh(const float *q, int hd, const uint8_t *rows, size_t stride, int nt, float scale,
                             float *s, int ss, const int NH, const int F16) {
    const __m128 vs = _mm_set1_ps(scale);
    for (int t = 0; t < nt; t += 4) {
        const uint8_t *r[4];
        UNROLL for (int k = 0; k < 4; k++) r[k] = rows + (size_t)KV_MIN(t + k, nt - 1) * stride;
        __m512 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_setzero_ps();
        for (int c = 0; c < hd; c += 16) {
            const __mmask16 m = hd - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - c)) - 1);
            __m512 x[4];
            UNROLL for (int k = 0; k < 4; k++) x[k] = ld16(r[k], F16, c, m);
            UNROLL for (int h = 0; h < NH; h++) {
                __m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)h * hd + c);
                UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_fmadd_ps(qv, x[k], a[h][k]);
            }
        }
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

static T_512 void scores_512(const float *q, int nh, int hd, const uint8_t *rows, size_t stride, int nt, int f16,
                             float scale, float *s, int ss) {
#define S5(NH)                                                                                 \
    case NH:                                                                                   \
        if (f16)                                                                               \
            scores_512_nh(q, hd, rows, stride, nt, scale, s, ss, NH, 1);                       \
        else                                                                                   \
            scores_512_nh(q, hd, rows, stride, nt, scale, s, ss, NH, 0);                       \
        break;
    switch (nh) { S5(1) S5(2) S5(3) S5(4) default: break; }
#undef S5
}

/* Column groups of 4 vectors (64 floats): NH * 4 independent accumulator
 * chains; lanes past head_dim are masked off (no memory is touched). */
INL T_512 void accum_512_nh(float *acc, int hd, const uint8_t *rows, size_t stride, int nt, const float *p,
                            int ps, const int NH, const int F16) {
    for (int c0 = 0; c0 < hd; c0 += 64) {
        __mmask16 m[4];
        UNROLL for (int v = 0; v < 4; v++) {
            int rem = hd - c0 - 16 * v;
            m[v] = rem >= 16 ? (__mmask16)0xffff : rem > 0 ? (__mmask16)((1u << rem) - 1) : (__mmask16)0;
        }
        __m512 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < 4; v++) a[h][v] = _mm512_maskz_loadu_ps(m[v], acc + (size_t)h * hd + c0 + 16 * v);
        for (int t = 0; t < nt; t++) {
            const uint8_t *r = rows + (size_t)t * stride;
            __m512 x[4];
            UNROLL for (int v = 0; v < 4; v++) x[v] = ld16(r, F16, c0 + 16 * v, m[v]);
            UNROLL for (int h = 0; h < NH; h++) {
                __m512 w = _mm512_set1_ps(p[h * ps + t]);
                UNROLL for (int v = 0; v < 4; v++) a[h][v] = _mm512_fmadd_ps(w, x[v], a[h][v]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(acc + (size_t)h * hd + c0 + 16 * v, m[v], a[h][v]);
    }
}

static T_512 void accum_512(float *acc, int nh, int hd, const uint8_t *rows, size_t stride, int nt, int f16,
                            const float *p, int ps) {
#define A5(NH)                                                                                 \
    case NH:                                                                                   \
        if (f16)                                                                               \
            accum_512_nh(acc, hd, rows, stride, nt, p, ps, NH, 1);                             \
        else                                                                                   \
            accum_512_nh(acc, hd, rows, stride, nt, p, ps, NH, 0);                             \
        break;
    switch (nh) { A5(1) A5(2) A5(3) A5(4) default: break; }
#undef A5
}

/* exp(x), x <= 0, as exp8; scalef gives exact 2^n scaling and flushes to 0
 * on underflow, so no clamp is needed. */
INL T_512 __m512 exp16(__m512 x) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 y = _mm512_set1_ps(1.0f / 720.0f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

static T_512 float expsum_512(float *s, int n, float m) {
    __m512 vm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), vm));
        _mm512_mask_storeu_ps(s + i, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

static T_512 void decode_512(kv_cache_dtype d, const uint8_t *src, size_t stride, int nt, int hd, float *dst) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *p = src + (size_t)t * stride;
        float *o = dst + (size_t)t * hd;
        float scale, mn = 0.0f;
        memcpy(&scale, p + hd, 4);
        if (d == KV_CACHE_INT8_ASYM) memcpy(&mn, p + hd + 4, 4);
        const int e4 = d == KV_CACHE_FP8_E4M3;
        const __m512 vs = _mm512_set1_ps(e4 ? scale * 256.0f : scale), vm = _mm512_set1_ps(mn);
        for (int c = 0; c < hd; c += 16) {
            const __mmask16 m = hd - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - c)) - 1);
            __m128i b = _mm_maskz_loadu_epi8(m, p + c);
            __m512 x;
            switch (d) {
            case KV_CACHE_INT8: x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), vs); break;
            case KV_CACHE_INT8_ASYM: x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), vs, vm); break;
            case KV_CACHE_FP8_E5M2:
                x = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8)), vs);
                break;
            default: {
                __m256i w = _mm256_cvtepu8_epi16(b);
                __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                            _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7));
                x = _mm512_mul_ps(_mm512_cvtph_ps(h), vs);
                /* e4m3's only NaN codes are S.1111.111 */
                __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)),
                                                        _mm256_set1_epi16(0x7f));
                x = _mm512_mask_mov_ps(x, nan, _mm512_set1_ps(NAN));
                break;
            }
            }
            _mm512_mask_storeu_ps(o + c, m, x);
        }
    }
}

static const attn_kernels k_avx512 = {scores_512, accum_512, expsum_512, decode_512};
#endif /* ATTN_X86 */

/* What the CPU supports, asked once: CPUID traps to the hypervisor in a
 * VM, far too slow for every call. */
static int isa_ok[KV_CPU_ISA_COUNT];
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void isa_init(void) {
    for (int i = 0; i < KV_CPU_ISA_COUNT; i++) isa_ok[i] = kv_cpu_isa_supported((kv_cpu_isa)i);
}

/* isa, or the best level below it this CPU has. */
static kv_cpu_isa isa_usable(kv_cpu_isa isa) {
    pthread_once(&isa_once, isa_init);
    int i = (int)isa < 0 ? 0 : isa >= KV_CPU_ISA_COUNT ? KV_CPU_ISA_COUNT - 1 : (int)isa;
    while (i > 0 && !isa_ok[i]) i--;
    return (kv_cpu_isa)i;
}

static const attn_kernels *kernels_for(kv_cpu_isa isa) {
#ifdef ATTN_X86
    switch (isa_usable(isa)) {
    case KV_CPU_ISA_AVX512: return &k_avx512;
    case KV_CPU_ISA_AVX2: return &k_avx2;
    default: break;
    }
#endif
    (void)isa;
    return &k_scalar;
}

/* ---- attention ---- */

typedef struct attn_job {
    const attn_kernels *kern;
    const kv_pages *kv;
    int layer;
    const kv_attn_batch *ab;
    const float *q;   /* (n_tokens, n_heads, head_dim) */
    float *out;       /* (n_tokens, n_heads, head_dim) */
    int n_heads;
    float scale;
    int scalar;       /* 1: decode every row to f32 first (the reference path) */
    int heads_per_item; /* query heads of one work item (<= ATTN_HMAX) */
    int64_t total;    /* sum over items of context length x heads */
} attn_job;

/* Rows of block `phys`, tokens t0.., kv head g, as readable f32/f16 rows:
 * in place when the kernels read the dtype, else decoded into buf. */
static const uint8_t *tile_rows(const attn_job *j, const uint8_t *pool, int phys, int t0, int nt, int g,
                                float *buf, size_t *stride, int *f16) {
    const kv_pages *kv = j->kv;
    const uint8_t *base = pool + (size_t)j->layer * kv->layer_bytes +
                          ((size_t)phys * kv->block_size + (size_t)t0) * kv->slot_bytes + (size_t)g * kv->row_bytes;
    if (!j->scalar && (kv->dtype == KV_CACHE_F32 || kv->dtype == KV_CACHE_F16)) {
        *stride = kv->slot_bytes;
        *f16 = kv->dtype == KV_CACHE_F16;
        return base;
    }
    j->kern->decode(kv->dtype, base, kv->slot_bytes, nt, kv->head_dim, buf);
    *stride = (size_t)kv->head_dim * sizeof(float);
    *f16 = 0;
    return (const uint8_t *)buf;
}

/* Asks for the rows of kv head g of tokens [t0, t0 + nt) of block phys in
 * one pool. A tile is read head by head, a strided pattern the hardware
 * prefetchers follow poorly, so each head's rows of the next tile are
 * requested while this tile's rows of the same head are computed (spread
 * out, so the requests do not overrun the miss buffers). */
static void prefetch_rows(const attn_job *j, const uint8_t *pool, int phys, int t0, int nt, int g) {
    const kv_pages *kv = j->kv;
    const uint8_t *p = pool + (size_t)j->layer * kv->layer_bytes +
                       ((size_t)phys * kv->block_size + (size_t)t0) * kv->slot_bytes + (size_t)g * kv->row_bytes;
    for (int t = 0; t < nt; t++, p += kv->slot_bytes)
        for (size_t b = 0; b < kv->row_bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
}

/* Token i, query heads [h0, h1): one pass over the context with a running
 * max m and sum l per head; the output rows are the accumulators (rescaled
 * when the max grows, divided by l at the end). Each tile of context
 * positions is read for all the kv heads the range uses before moving on,
 * so K and V stream through memory in address order (a slot holds every kv
 * head's row side by side). */
static void attend(const attn_job *j, int i, int h0, int h1, float *buf, int tile) {
    const kv_pages *kv = j->kv;
    const int hd = kv->head_dim, bs = kv->block_size, G = j->n_heads / kv->n_kv_heads;
    const int ctx = j->ab->pos[i] + 1, nh = h1 - h0;
    const int g0 = h0 / G, g1 = (h1 - 1) / G + 1;
    const int32_t *table = j->ab->tables[j->ab->seq[i]];
    const float *q = j->q + ((size_t)i * j->n_heads + h0) * hd;
    float *acc = j->out + ((size_t)i * j->n_heads + h0) * hd;
    float m[ATTN_HMAX], l[ATTN_HMAX], s[ATTN_HMAX * ATTN_TILE];
    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(acc, 0, (size_t)nh * hd * sizeof(float));
    for (int blk = 0; blk * bs < ctx; blk++) {
        const int phys = table[blk];
        const int nblk = KV_MIN(bs, ctx - blk * bs);
        for (int t0 = 0; t0 < nblk; t0 += tile) {
            const int nt = KV_MIN(tile, nblk - t0);
            size_t stride;
            int f16;
            /* the next tile, for prefetching */
            int pphys = phys, pt0 = t0 + nt, pnt = KV_MIN(tile, nblk - t0 - nt);
            if (pnt <= 0) {
                pphys = (blk + 1) * bs < ctx ? table[blk + 1] : -1;
                pt0 = 0;
                pnt = pphys >= 0 ? KV_MIN(tile, KV_MIN(bs, ctx - (blk + 1) * bs)) : 0;
            }
            for (int g = g0; g < g1; g++) {
                const int ha = KV_MAX(h0, g * G), hb = KV_MIN(h1, (g + 1) * G);
                if (pnt) prefetch_rows(j, kv->k, pphys, pt0, pnt, g);
                const uint8_t *rk = tile_rows(j, kv->k, phys, t0, nt, g, buf, &stride, &f16);
                for (int h = ha; h < hb; h += ATTN_HC)
                    j->kern->scores(q + (size_t)(h - h0) * hd, KV_MIN(ATTN_HC, hb - h), hd, rk, stride, nt, f16,
                                    j->scale, s + (h - h0) * ATTN_TILE, ATTN_TILE);
            }
            for (int h = 0; h < nh; h++) {
                float *sh = s + h * ATTN_TILE;
                float mx = sh[0];
                for (int t = 1; t < nt; t++) mx = sh[t] > mx ? sh[t] : mx; /* (fmaxf is a libm call) */
                if (mx > m[h]) {
                    if (l[h] > 0.0f) {
                        float corr = expf(m[h] - mx);
                        l[h] *= corr;
                        float *ah = acc + (size_t)h * hd;
                        for (int c = 0; c < hd; c++) ah[c] *= corr;
                    }
                    m[h] = mx;
                }
                l[h] += j->kern->expsum(sh, nt, m[h]);
            }
            for (int g = g0; g < g1; g++) {
                const int ha = KV_MAX(h0, g * G), hb = KV_MIN(h1, (g + 1) * G);
                if (pnt) prefetch_rows(j, kv->v, pphys, pt0, pnt, g);
                const uint8_t *rv = tile_rows(j, kv->v, phys, t0, nt, g, buf, &stride, &f16);
                for (int h = ha; h < hb; h += ATTN_HC)
                    j->kern->accum(acc + (size_t)(h - h0) * hd, KV_MIN(ATTN_HC, hb - h), hd, rv, stride, nt, f16,
                                   s + (h - h0) * ATTN_TILE, ATTN_TILE);
            }
        }
    }
    for (int h = 0; h < nh; h++) {
        float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        float *ah = acc + (size_t)h * hd;
        for (int c = 0; c < hd; c++) ah[c] *= inv;
    }
}

/* Items (token i, query head range r) in token-major order; item cost =
 * context length x heads. Thread ith takes the items whose cumulative cost
 * starts in its share [total * ith / nth, total * (ith + 1) / nth). */
static void attn_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const int hd = j->kv->head_dim, R = j->heads_per_item;
    const int64_t lo = j->total * ith / nth, hi = j->total * (ith + 1) / nth;
    float buf[ATTN_QBUF];
    int tile = ATTN_QBUF / hd;
    if (tile > ATTN_TILE) tile = ATTN_TILE;
    if (tile < 1) tile = 1; /* (head_dim <= KV_ATTN_MAX_HEAD_DIM < ATTN_QBUF) */
    int64_t cum = 0;
    for (int i = 0; i < j->ab->n_tokens && cum < hi; i++) {
        const int64_t ctxl = (int64_t)j->ab->pos[i] + 1;
        if (cum + ctxl * j->n_heads <= lo) {
            cum += ctxl * j->n_heads;
            continue;
        }
        for (int h0 = 0; h0 < j->n_heads; h0 += R) {
            const int h1 = KV_MIN(j->n_heads, h0 + R);
            if (cum >= lo && cum < hi) attend(j, i, h0, h1, buf, tile);
            cum += ctxl * (h1 - h0);
        }
    }
}

void kv_attn_run(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                 const float *q, float *out, int n_heads, float scale) {
    if (!kv || !ab || ab->n_tokens <= 0 || n_heads <= 0 || kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads ||
        kv->head_dim <= 0 || kv->head_dim > KV_ATTN_MAX_HEAD_DIM || layer < 0 || layer >= kv->n_layers)
        return;
    attn_job j = {
        .kern = kernels_for(isa),
        .kv = kv,
        .layer = layer,
        .ab = ab,
        .q = q,
        .out = out,
        .n_heads = n_heads,
        .scale = scale,
        .scalar = isa == KV_CPU_ISA_SCALAR,
    };
    for (int i = 0; i < ab->n_tokens; i++) j.total += ((int64_t)ab->pos[i] + 1) * n_heads;
    /* A small job is not worth waking the pool for. */
    if (j.total < 4096) pool = NULL;
    const int nth = kv_threadpool_size(pool);
    /* Split each token's heads into ranges when there are few tokens, so
     * every thread gets several items (a single decode token included);
     * ranges cover whole GQA groups when they can. */
    const int G = n_heads / kv->n_kv_heads;
    int per_token = (4 * nth + ab->n_tokens - 1) / ab->n_tokens;
    if (per_token > kv->n_kv_heads) per_token = kv->n_kv_heads;
    if (per_token < 1) per_token = 1;
    int R = (n_heads + per_token - 1) / per_token;
    if (R >= G) R = (R + G - 1) / G * G;
    j.heads_per_item = KV_MIN(R, ATTN_HMAX);
    kv_threadpool_run(pool, attn_task, &j);
}

void kv_cpu_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                      float *out, int n_heads, float scale) {
    kv_attn_run(kv_cpu_pool(b), kv_cpu_get_isa(b), kv, layer, ab, q, out, n_heads, scale);
}

/* ---- store ---- */

typedef struct store_job {
    kv_cpu_isa isa;
    kv_pages *kv;
    int layer;
    const kv_attn_batch *ab;
    const float *k, *v; /* (n_tokens, n_kv_heads, head_dim) */
} store_job;

#ifdef ATTN_X86
static T_AVX2 void f16_encode_avx2(const float *src, uint8_t *dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + 2 * (size_t)i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        uint16_t h = kv_fp32_to_fp16(src[i]);
        memcpy(dst + 2 * (size_t)i, &h, 2);
    }
}
#endif

static void encode_row(kv_cpu_isa isa, kv_cache_dtype d, const float *src, uint8_t *dst, int hd) {
#ifdef ATTN_X86
    if (d == KV_CACHE_F16 && isa >= KV_CPU_ISA_AVX2) {
        f16_encode_avx2(src, dst, hd);
        return;
    }
#endif
    (void)isa;
    kv_dtype_encode_row(d, src, dst, hd);
}

static void store_task(void *ctx, int ith, int nth) {
    const store_job *j = ctx;
    kv_pages *kv = j->kv;
    const int n = j->ab->n_tokens, nkv = kv->n_kv_heads, hd = kv->head_dim;
    const int64_t n_slots = (int64_t)kv->n_blocks * kv->block_size;
    const int i0 = (int)((int64_t)n * ith / nth), i1 = (int)((int64_t)n * (ith + 1) / nth);
    for (int i = i0; i < i1; i++) {
        const int32_t slot = j->ab->slot[i];
        if (slot < 0 || slot >= n_slots) continue; /* the forward rejects these; never write out of the pool */
        size_t off = (size_t)j->layer * kv->layer_bytes + (size_t)slot * kv->slot_bytes;
        for (int g = 0; g < nkv; g++) {
            size_t src = ((size_t)i * nkv + g) * hd;
            encode_row(j->isa, kv->dtype, j->k + src, kv->k + off + (size_t)g * kv->row_bytes, hd);
            encode_row(j->isa, kv->dtype, j->v + src, kv->v + off + (size_t)g * kv->row_bytes, hd);
        }
    }
}

void kv_attn_store(kv_threadpool *pool, kv_cpu_isa isa, kv_pages *kv, int layer, const kv_attn_batch *ab,
                   const float *k, const float *v) {
    if (!kv || !ab || ab->n_tokens <= 0 || layer < 0 || layer >= kv->n_layers) return;
    isa = isa_usable(isa);
    store_job j = {isa, kv, layer, ab, k, v};
    /* Encoding is cheap next to the matmuls; only big prefill chunks of
     * quantized rows are worth the pool. */
    if ((int64_t)ab->n_tokens * kv->n_kv_heads * kv->head_dim < 65536) pool = NULL;
    kv_threadpool_run(pool, store_task, &j);
}

void kv_cpu_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                     const float *v) {
    kv_attn_store(kv_cpu_pool(b), kv_cpu_get_isa(b), kv, layer, ab, k, v);
}

/* ---- blocks ---- */

void kv_cpu_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) {
    (void)b;
    if (!kv || dst == src || dst < 0 || src < 0 || dst >= kv->n_blocks || src >= kv->n_blocks) return;
    const size_t bb = (size_t)kv->block_size * kv->slot_bytes;
    for (int l = 0; l < kv->n_layers; l++) {
        size_t base = (size_t)l * kv->layer_bytes;
        memcpy(kv->k + base + (size_t)dst * bb, kv->k + base + (size_t)src * bb, bb);
        memcpy(kv->v + base + (size_t)dst * bb, kv->v + base + (size_t)src * bb, bb);
    }
}

/* ---- validation ---- */

int kv_attn_batch_check(const kv_pages *kv, const kv_attn_batch *ab, int n_heads, kv_err *err) {
    if (!kv || !ab) return kv_err_set(err, KV_ERR_INVAL, "attention: no pages or batch");
    if (kv->head_dim <= 0 || kv->head_dim > KV_ATTN_MAX_HEAD_DIM)
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "attention: head_dim %d out of range [1, %d]", kv->head_dim,
                          KV_ATTN_MAX_HEAD_DIM);
    if (kv->n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv->n_kv_heads)
        return kv_err_set(err, KV_ERR_INVAL, "attention: %d query heads is not a multiple of %d kv heads", n_heads,
                          kv->n_kv_heads);
    if (ab->n_tokens < 0 || ab->n_seqs < 0 || (ab->n_tokens > 0 && (!ab->pos || !ab->seq || !ab->slot)))
        return kv_err_set(err, KV_ERR_INVAL, "attention: malformed batch (%d tokens, %d sequences)", ab->n_tokens,
                          ab->n_seqs);
    const int bs = kv->block_size;
    for (int i = 0; i < ab->n_tokens; i++) {
        const int s = ab->seq[i], p = ab->pos[i];
        if (s < 0 || s >= ab->n_seqs || !ab->tables || !ab->tables[s])
            return kv_err_set(err, KV_ERR_RANGE, "attention: token %d has sequence %d of %d", i, s, ab->n_seqs);
        if (p < 0 || p > INT32_MAX - bs)
            return kv_err_set(err, KV_ERR_RANGE, "attention: token %d has position %d", i, p);
        const int32_t *t = ab->tables[s];
        for (int blk = 0; blk <= p / bs; blk++)
            if (t[blk] < 0 || t[blk] >= kv->n_blocks)
                return kv_err_set(err, KV_ERR_RANGE, "attention: sequence %d block %d maps to %d (pool of %d)", s,
                                  blk, t[blk], kv->n_blocks);
        const int64_t want = (int64_t)t[p / bs] * bs + p % bs;
        if (ab->slot[i] != want)
            return kv_err_set(err, KV_ERR_RANGE, "attention: token %d slot %d, its table says %lld", i, ab->slot[i],
                              (long long)want);
    }
    return 0;
}
