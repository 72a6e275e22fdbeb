/* cpu_attention.c - the CPU backend's paged KV ops: store K/V rows into
 * their slots (encoding to the cache dtype), copy blocks, and attention over
 * block tables with an online (flash-attention style) softmax. A work item
 * is a run of tokens of one sequence (part of a prefill chunk, or one
 * decode token) and a range of query heads; it reads each K/V tile of a kv
 * head once for all of its rows (tokens x the query heads of the GQA group).
 * Threads take items from a shared counter. Scalar reference kernels plus
 * AVX2 and AVX-512 ones picked at run time; the SIMD kernels read every
 * dtype in place (int8 and fp8 expanded in registers), the scalar path
 * decodes the quantized dtypes a tile at a time with the reference decoder.
 * No allocation.
 *
 * Batch invariance: a row's result is the same sequence of float operations
 * whatever else shares its item, its thread or its kernel call (tiles are
 * fixed by absolute position, each row keeps its own softmax state and
 * context length, and the kernels treat every row and every key alike), so
 * a token's output does not depend on the batch or on the thread count. */
#include "cpu_attention.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu.h"
#include "kv_dtype.h"
#include "types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTN_X86 1
#endif

#define ATTN_TILE 32    /* context tokens scored per step of the online softmax (at most) */
#define ATTN_HC 4       /* rows one kernel call takes (their accumulators fit the registers) */
#define ATTN_ROWS 64    /* rows (token x query head) of one work item */
#define ATTN_RUN 16     /* tokens of one sequence in one work item (at most) */
#define ATTN_QBUF 8192  /* floats of decoded K or V rows (the scalar reference path) */
#define ATTN_ITEMS 1024 /* work items per dispatch; larger batches take several */

/* Per-ISA kernels over a tile of nt rows of one kv head at rows + t * stride,
 * each head_dim (hd) elements of dtype d (the ones the ISA reads in place).
 * Query rows q[r] and accumulator rows acc[r] are separate pointers: the
 * rows of an item come from several tokens and heads. */
typedef struct attn_kernels {
    /* s[r * ss + t] = scale * dot(q_r, row_t), r < nr, t < nt */
    void (*scores)(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                   kv_cache_dtype d, float scale, float *s, int ss);
    /* acc_r += sum_t p[r * ps + t] * row_t */
    void (*accum)(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt, kv_cache_dtype d,
                  const float *p, int ps);
    /* s[i] = exp(s[i] - m) for i < n; returns their sum */
    float (*expsum)(float *s, int n, float m);
    /* max of s[0..n), n >= 1 */
    float (*maxf)(const float *s, int n);
    /* a[i] *= f for i < n (the rescale of an accumulator row) */
    void (*scalev)(float *a, int n, float f);
    unsigned direct; /* bit d set: dtype d is read in place; others are decoded to f32 first */
} attn_kernels;

#define DT_BIT(d) (1u << (d))
#define DT_ALL (DT_BIT(KV_CACHE_DTYPE_COUNT) - 1u)

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

static void scores_scalar(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                          kv_cache_dtype d, float scale, float *s, int ss) {
    const int f16 = d == KV_CACHE_F16;
    for (int t = 0; t < nt; t++) {
        const uint8_t *r = rows + (size_t)t * stride;
        for (int h = 0; h < nr; h++) {
            float acc = 0.0f;
            for (int i = 0; i < hd; i++) acc += q[h][i] * ld_scalar(r, f16, i);
            s[h * ss + t] = acc * scale;
        }
    }
}

static void accum_scalar(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                         kv_cache_dtype d, const float *p, int ps) {
    const int f16 = d == KV_CACHE_F16;
    for (int t = 0; t < nt; t++) {
        const uint8_t *r = rows + (size_t)t * stride;
        for (int h = 0; h < nr; h++) {
            float w = p[h * ps + t];
            float *a = acc[h];
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

static float maxf_scalar(const float *s, int n) {
    float mx = s[0];
    for (int i = 1; i < n; i++) mx = s[i] > mx ? s[i] : mx; /* (fmaxf is a libm call) */
    return mx;
}

static void scalev_scalar(float *a, int n, float f) {
    for (int i = 0; i < n; i++) a[i] *= f;
}

static const attn_kernels k_scalar = {scores_scalar, accum_scalar, expsum_scalar, maxf_scalar, scalev_scalar,
                                      DT_BIT(KV_CACHE_F32) | DT_BIT(KV_CACHE_F16)};

/* The scalar path's decoder: the reference row decoder, tile rows into dst(nt, hd). */
static void decode_rows(kv_cache_dtype d, const uint8_t *src, size_t stride, int nt, int hd, float *dst) {
    for (int t = 0; t < nt; t++) kv_dtype_decode_row(d, src + (size_t)t * stride, dst + (size_t)t * hd, hd);
}

/* The quantized rows' per-row factors as the SIMD kernels use them: they
 * expand the codes without the scale (e4m3 to value / 256, see fp8_to_half)
 * and apply it per key (K) or per weight (V); int8_asym is expanded to
 * min + q * scale in registers instead, because folding the min out of a
 * dot product cancels badly. */
static inline float row_scale(const uint8_t *row, int hd, kv_cache_dtype d) {
    float sc;
    memcpy(&sc, row + hd, 4);
    return d == KV_CACHE_FP8_E4M3 ? sc * 256.0f : sc;
}

static inline float row_min(const uint8_t *row, int hd) {
    float mn;
    memcpy(&mn, row + hd + 4, 4);
    return mn;
}

/* One element of a quantized row, expanded as the SIMD loads do (the tails
 * of rows whose head_dim is not a multiple of the vector width). */
static inline float raw_scalar(const uint8_t *row, int i, kv_cache_dtype d, float sc, float mn) {
    switch (d) {
    case KV_CACHE_INT8: return (float)(int8_t)row[i];
    case KV_CACHE_INT8_ASYM: return mn + (float)row[i] * sc;
    case KV_CACHE_FP8_E4M3: return kv_fp8_e4m3_to_fp32(row[i]) * 0.00390625f; /* exact: a power of 2 */
    case KV_CACHE_FP8_E5M2: return kv_fp8_e5m2_to_fp32(row[i]);
    case KV_CACHE_F16: return ld_scalar(row, 1, i);
    default: return ld_scalar(row, 0, i);
    }
}

/* 1 when the SIMD kernels multiply a key's score or a value's weight by its
 * row scale (the symmetric quantized dtypes). */
#define DT_FOLDS(DT) ((DT) == KV_CACHE_INT8 || (DT) == KV_CACHE_FP8_E4M3 || (DT) == KV_CACHE_FP8_E5M2)

#ifdef ATTN_X86
/* ---- AVX2 + FMA + F16C ---- */
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))
/* The per-head / per-vector loops have compile-time bounds: unrolled, their
 * accumulators live in registers. */
#define UNROLL _Pragma("GCC unroll 16")

/* fp8 codes -> IEEE half bits: e5m2 is the top byte of a half; e4m3 shifted
 * into a half's fields is the value / 256 (both normal and subnormal). */
INL T_AVX2 __m128i fp8_to_half(__m128i b8, int e4) {
    __m128i w = _mm_cvtepu8_epi16(b8);
    if (!e4) return _mm_slli_epi16(w, 8);
    return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                        _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
}

/* Eight elements c.. of a row, expanded (quantized: without their scale;
 * int8_asym: with scale sc and min mn). */
INL T_AVX2 __m256 ld8(const uint8_t *row, const int DT, int c, __m256 sc, __m256 mn) {
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

INL T_AVX2 float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* The four sums of a0..a3 in one vector (each reduced in the same order). */
INL T_AVX2 __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Four context tokens at a time: every query vector load serves four rows,
 * NH * 4 independent accumulator chains, and one 4-way horizontal sum per
 * head instead of four. Keys past nt repeat the last one (not stored). */
INL T_AVX2 void scores_avx2_nh(const float *const *q, int hd, const uint8_t *rows, size_t stride, int nt,
                               float scale, float *s, int ss, const int NH, const int DT) {
    const int hd8 = hd & ~7;
    for (int t = 0; t < nt; t += 4) {
        const uint8_t *r[4];
        float sk[4] = {1.0f, 1.0f, 1.0f, 1.0f}, mk[4] = {0};
        UNROLL for (int k = 0; k < 4; k++) {
            r[k] = rows + (size_t)KV_MIN(t + k, nt - 1) * stride;
            if (DT_FOLDS(DT) || DT == KV_CACHE_INT8_ASYM) sk[k] = row_scale(r[k], hd, (kv_cache_dtype)DT);
            if (DT == KV_CACHE_INT8_ASYM) mk[k] = row_min(r[k], hd);
        }
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
                s[h * ss + t + k] = (out[k] + tail) * (DT_FOLDS(DT) ? scale * sk[k] : scale);
            }
        }
    }
}

static T_AVX2 void scores_avx2(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                               kv_cache_dtype d, float scale, float *s, int ss) {
#define S2(NH, DT) \
    case NH * KV_CACHE_DTYPE_COUNT + DT: scores_avx2_nh(q, hd, rows, stride, nt, scale, s, ss, NH, DT); break;
#define S2D(NH) S2(NH, 0) S2(NH, 1) S2(NH, 2) S2(NH, 3) S2(NH, 4) S2(NH, 5)
    switch (nr * KV_CACHE_DTYPE_COUNT + (int)d) { S2D(1) S2D(2) S2D(3) S2D(4) default: break; }
#undef S2D
#undef S2
}

/* Column groups of CV vectors keep NH * CV independent accumulator chains
 * in registers (16 ymm: CV = 4 up to 2 heads, 2 beyond). */
INL T_AVX2 void accum_avx2_nh(float *const *acc, int hd, const uint8_t *rows, size_t stride, int nt,
                              const float *p, int ps, const int NH, const int DT) {
    const int CV = NH <= 2 ? 4 : 2;
    const int hd8 = hd & ~7;
    for (int c0 = 0; c0 < hd8; c0 += 8 * CV) {
        const int nv = KV_MIN(CV, (hd8 - c0) / 8);
        __m256 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < CV; v++) a[h][v] = v < nv ? _mm256_loadu_ps(acc[h] + c0 + 8 * v) : _mm256_setzero_ps();
        for (int t = 0; t < nt; t++) {
            const uint8_t *r = rows + (size_t)t * stride;
            float sc = 1.0f, mn = 0.0f;
            if (DT_FOLDS(DT) || DT == KV_CACHE_INT8_ASYM) sc = row_scale(r, hd, (kv_cache_dtype)DT);
            if (DT == KV_CACHE_INT8_ASYM) mn = row_min(r, hd);
            __m256 x[4];
            UNROLL for (int v = 0; v < CV; v++)
                x[v] = v < nv ? ld8(r, DT, c0 + 8 * v, _mm256_set1_ps(sc), _mm256_set1_ps(mn)) : _mm256_setzero_ps();
            UNROLL for (int h = 0; h < NH; h++) {
                __m256 w = _mm256_set1_ps(DT_FOLDS(DT) ? p[h * ps + t] * sc : p[h * ps + t]);
                UNROLL for (int v = 0; v < CV; v++) a[h][v] = _mm256_fmadd_ps(w, x[v], a[h][v]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < CV; v++) if (v < nv) _mm256_storeu_ps(acc[h] + c0 + 8 * v, a[h][v]);
    }
    for (int c = hd8; c < hd; c++)
        for (int t = 0; t < nt; t++) {
            const uint8_t *r = rows + (size_t)t * stride;
            float sc = 1.0f, mn = 0.0f;
            if (DT_FOLDS(DT) || DT == KV_CACHE_INT8_ASYM) sc = row_scale(r, hd, (kv_cache_dtype)DT);
            if (DT == KV_CACHE_INT8_ASYM) mn = row_min(r, hd);
            float x = raw_scalar(r, c, (kv_cache_dtype)DT, sc, mn);
            UNROLL for (int h = 0; h < NH; h++)
                acc[h][c] += (DT_FOLDS(DT) ? p[h * ps + t] * sc : p[h * ps + t]) * x;
        }
}

static T_AVX2 void accum_avx2(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                              kv_cache_dtype d, const float *p, int ps) {
#define A2(NH, DT) \
    case NH * KV_CACHE_DTYPE_COUNT + DT: accum_avx2_nh(acc, hd, rows, stride, nt, p, ps, NH, DT); break;
#define A2D(NH) A2(NH, 0) A2(NH, 1) A2(NH, 2) A2(NH, 3) A2(NH, 4) A2(NH, 5)
    switch (nr * KV_CACHE_DTYPE_COUNT + (int)d) { A2D(1) A2D(2) A2D(3) A2D(4) default: break; }
#undef A2D
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

static T_AVX2 float maxf_avx2(const float *s, int n) {
    int i = 0;
    float mx = s[0];
    if (n >= 8) {
        __m256 v = _mm256_loadu_ps(s);
        for (i = 8; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(s + i));
        __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        x = _mm_max_ps(x, _mm_movehl_ps(x, x));
        x = _mm_max_ss(x, _mm_movehdup_ps(x));
        mx = _mm_cvtss_f32(x);
    }
    for (; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    return mx;
}

static T_AVX2 void scalev_avx2(float *a, int n, float f) {
    const __m256 vf = _mm256_set1_ps(f);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), vf));
    for (; i < n; i++) a[i] *= f;
}

static const attn_kernels k_avx2 = {scores_avx2, accum_avx2, expsum_avx2, maxf_avx2, scalev_avx2, DT_ALL};

/* ---- AVX-512 (F + BW + VL) ---- */
#define T_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* Sixteen elements c.. of a row (lanes outside m are zero, no memory past
 * them is touched), expanded as ld8 does. */
INL T_512 __m512 ld16(const uint8_t *row, const int DT, int c, __mmask16 m, __m512 sc, __m512 mn) {
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

INL T_512 __m128 hsum4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define FOLD(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    return hsum4x8(FOLD(a0), FOLD(a1), FOLD(a2), FOLD(a3));
#undef FOLD
}

/* As scores_avx2_nh, 16 lanes; the last vector of a row is masked. */
INL T_512 void scores_512_nh(const float *const *q, int hd, const uint8_t *rows, size_t stride, int nt,
                             float scale, float *s, int ss, const int NH, const int DT) {
    for (int t = 0; t < nt; t += 4) {
        const uint8_t *r[4];
        float sk[4] = {1.0f, 1.0f, 1.0f, 1.0f}, mk[4] = {0};
        UNROLL for (int k = 0; k < 4; k++) {
            r[k] = rows + (size_t)KV_MIN(t + k, nt - 1) * stride;
            if (DT_FOLDS(DT) || DT == KV_CACHE_INT8_ASYM) sk[k] = row_scale(r[k], hd, (kv_cache_dtype)DT);
            if (DT == KV_CACHE_INT8_ASYM) mk[k] = row_min(r[k], hd);
        }
        __m512 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_setzero_ps();
        for (int c = 0; c < hd; c += 16) {
            const __mmask16 m = hd - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - c)) - 1);
            __m512 x[4];
            UNROLL for (int k = 0; k < 4; k++)
                x[k] = ld16(r[k], DT, c, m, _mm512_set1_ps(sk[k]), _mm512_set1_ps(mk[k]));
            UNROLL for (int h = 0; h < NH; h++) {
                __m512 qv = _mm512_maskz_loadu_ps(m, q[h] + c); /* zero lanes cancel int8_asym's min */
                UNROLL for (int k = 0; k < 4; k++) a[h][k] = _mm512_fmadd_ps(qv, x[k], a[h][k]);
            }
        }
        __m128 vs = _mm_set1_ps(scale);
        if (DT_FOLDS(DT)) vs = _mm_mul_ps(vs, _mm_loadu_ps(sk));
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

static T_512 void scores_512(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                             kv_cache_dtype d, float scale, float *s, int ss) {
#define S5(NH, DT) \
    case NH * KV_CACHE_DTYPE_COUNT + DT: scores_512_nh(q, hd, rows, stride, nt, scale, s, ss, NH, DT); break;
#define S5D(NH) S5(NH, 0) S5(NH, 1) S5(NH, 2) S5(NH, 3) S5(NH, 4) S5(NH, 5)
    switch (nr * KV_CACHE_DTYPE_COUNT + (int)d) { S5D(1) S5D(2) S5D(3) S5D(4) default: break; }
#undef S5D
#undef S5
}

/* Column groups of 4 vectors (64 floats): NH * 4 independent accumulator
 * chains; lanes past head_dim are masked off (no memory is touched). */
INL T_512 void accum_512_nh(float *const *acc, int hd, const uint8_t *rows, size_t stride, int nt, const float *p,
                            int ps, const int NH, const int DT) {
    for (int c0 = 0; c0 < hd; c0 += 64) {
        __mmask16 m[4];
        UNROLL for (int v = 0; v < 4; v++) {
            int rem = hd - c0 - 16 * v;
            m[v] = rem >= 16 ? (__mmask16)0xffff : rem > 0 ? (__mmask16)((1u << rem) - 1) : (__mmask16)0;
        }
        __m512 a[ATTN_HC][4];
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < 4; v++) a[h][v] = _mm512_maskz_loadu_ps(m[v], acc[h] + c0 + 16 * v);
        for (int t = 0; t < nt; t++) {
            const uint8_t *r = rows + (size_t)t * stride;
            float sc = 1.0f, mn = 0.0f;
            if (DT_FOLDS(DT) || DT == KV_CACHE_INT8_ASYM) sc = row_scale(r, hd, (kv_cache_dtype)DT);
            if (DT == KV_CACHE_INT8_ASYM) mn = row_min(r, hd);
            __m512 x[4];
            UNROLL for (int v = 0; v < 4; v++) x[v] = ld16(r, DT, c0 + 16 * v, m[v], _mm512_set1_ps(sc), _mm512_set1_ps(mn));
            UNROLL for (int h = 0; h < NH; h++) {
                __m512 w = _mm512_set1_ps(DT_FOLDS(DT) ? p[h * ps + t] * sc : p[h * ps + t]);
                UNROLL for (int v = 0; v < 4; v++) a[h][v] = _mm512_fmadd_ps(w, x[v], a[h][v]);
            }
        }
        UNROLL for (int h = 0; h < NH; h++)
            UNROLL for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(acc[h] + c0 + 16 * v, m[v], a[h][v]);
    }
}

static T_512 void accum_512(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                            kv_cache_dtype d, const float *p, int ps) {
#define A5(NH, DT) \
    case NH * KV_CACHE_DTYPE_COUNT + DT: accum_512_nh(acc, hd, rows, stride, nt, p, ps, NH, DT); break;
#define A5D(NH) A5(NH, 0) A5(NH, 1) A5(NH, 2) A5(NH, 3) A5(NH, 4) A5(NH, 5)
    switch (nr * KV_CACHE_DTYPE_COUNT + (int)d) { A5D(1) A5D(2) A5D(3) A5D(4) default: break; }
#undef A5D
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

static T_512 float maxf_512(const float *s, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + i));
    }
    return _mm512_reduce_max_ps(mx);
}

static T_512 void scalev_512(float *a, int n, float f) {
    const __m512 vf = _mm512_set1_ps(f);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(a + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, a + i), vf));
    }
}

static const attn_kernels k_avx512 = {scores_512, accum_512, expsum_512, maxf_512, scalev_512, DT_ALL};
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

/* One work item: batch tokens [tok, tok + ntok), all of one sequence with
 * non-decreasing positions, and query heads [h0, h1); at most ATTN_ROWS rows. */
typedef struct attn_item {
    int32_t tok, ntok;
    int32_t h0, h1;
} attn_item;

typedef struct attn_job {
    const attn_kernels *kern;
    const kv_pages *kv;
    int layer;
    const kv_attn_batch *ab;
    const float *q;   /* (n_tokens, n_heads, head_dim) */
    float *out;       /* (n_tokens, n_heads, head_dim) */
    int n_heads;
    float scale;
    int tile;         /* context tokens per softmax step: min(ATTN_TILE, ATTN_QBUF / head_dim) */
    const attn_item *items; /* (n_items) */
    int n_items;
    _Alignas(64) atomic_int next; /* the next item not yet taken (own cache line: every thread bumps it) */
} attn_job;

/* The nt rows of kv head g at block position t0 of block `phys`, readable
 * by the kernels: in place when they read the dtype, else decoded into buf
 * (*d becomes f32). */
static const uint8_t *tile_rows(const attn_job *j, const uint8_t *pool, int phys, int t0, int nt, int g,
                                float *buf, size_t *stride, kv_cache_dtype *d) {
    const kv_pages *kv = j->kv;
    const uint8_t *base = pool + kv_pages_row_offset(kv, j->layer, (int64_t)phys * kv->block_size + t0, g);
    if (j->kern->direct & DT_BIT(kv->dtype)) {
        *stride = kv->row_bytes;
        *d = kv->dtype;
        return base;
    }
    decode_rows(kv->dtype, base, kv->row_bytes, nt, kv->head_dim, buf);
    *stride = (size_t)kv->head_dim * sizeof(float);
    *d = KV_CACHE_F32;
    return (const uint8_t *)buf;
}

/* Asks for the nt rows of kv head g at block position t0 of block phys:
 * one contiguous range (the block layout groups rows by head). The rows of
 * the next tile are requested while this tile is computed, since a
 * sequence's blocks lie anywhere in the pool. */
static void prefetch_rows(const attn_job *j, const uint8_t *pool, int phys, int t0, int nt, int g) {
    const kv_pages *kv = j->kv;
    const uint8_t *p = pool + kv_pages_row_offset(kv, j->layer, (int64_t)phys * kv->block_size + t0, g);
    const size_t n = (size_t)nt * kv->row_bytes;
    for (size_t b = 0; b < n; b += 64) __builtin_prefetch(p + b, 0, 3);
}

/* accum over a tile for rows [r0, r1) whose valid tile lengths nt[] do not
 * decrease: rows past their length take no more terms, so each row sees
 * exactly the additions it would see alone. */
static void accum_rows(const attn_job *j, float *const *acc, const int *nt, int r0, int r1, const uint8_t *rows,
                       size_t stride, kv_cache_dtype d, const float *s) {
    const int hd = j->kv->head_dim;
    for (int c = r0; c < r1; c += ATTN_HC) {
        const int ce = KV_MIN(r1, c + ATTN_HC);
        int done = 0;
        for (int k = c; k < ce; k++) {
            if (nt[k] <= done) continue;
            j->kern->accum(acc + k, ce - k, hd, rows + (size_t)done * stride, stride, nt[k] - done, d,
                           s + (size_t)k * ATTN_TILE + done, ATTN_TILE);
            done = nt[k];
        }
    }
}

/* One item: one pass over the context with a running max m and sum l per
 * row; the output rows are the accumulators (rescaled when the max grows,
 * divided by l at the end). Rows are grouped by kv head, then token, then
 * query head, so a kv head's rows have non-decreasing context lengths. Each
 * tile of context positions is read for every kv head of the item before
 * the next (a block holds the heads' rows one after the other). */
static void attend(const attn_job *j, const attn_item *it, float *buf) {
    const kv_pages *kv = j->kv;
    const int hd = kv->head_dim, bs = kv->block_size, G = j->n_heads / kv->n_kv_heads, tile = j->tile;
    const int g0 = it->h0 / G, g1 = (it->h1 - 1) / G + 1;
    const int32_t *table = j->ab->tables[j->ab->seq[it->tok]];
    const float *qr[ATTN_ROWS];
    float *ar[ATTN_ROWS];
    float m[ATTN_ROWS], l[ATTN_ROWS], s[ATTN_ROWS * ATTN_TILE];
    int ctx[ATTN_ROWS], ntr[ATTN_ROWS], rb[ATTN_ROWS + 1], ra[ATTN_ROWS];
    int nr = 0;
    for (int g = g0; g < g1; g++) {
        const int ha = KV_MAX(it->h0, g * G), hb = KV_MIN(it->h1, (g + 1) * G);
        rb[g - g0] = ra[g - g0] = nr;
        for (int t = it->tok; t < it->tok + it->ntok; t++)
            for (int h = ha; h < hb; h++) {
                const size_t o = ((size_t)t * j->n_heads + h) * hd;
                qr[nr] = j->q + o;
                ar[nr] = j->out + o;
                ctx[nr] = j->ab->pos[t] + 1;
                m[nr] = -INFINITY;
                l[nr] = 0.0f;
                memset(ar[nr], 0, (size_t)hd * sizeof(float));
                nr++;
            }
    }
    rb[g1 - g0] = nr;
    const int ctx_max = j->ab->pos[it->tok + it->ntok - 1] + 1;
    for (int blk = 0; blk * bs < ctx_max; blk++) {
        const int phys = table[blk];
        const int nblk = KV_MIN(bs, ctx_max - blk * bs);
        for (int t0 = 0; t0 < nblk; t0 += tile) {
            const int nt = KV_MIN(tile, nblk - t0), P = blk * bs + t0; /* P: position of the tile's first row */
            /* the next tile, for prefetching */
            int pphys = phys, pt0 = t0 + nt, pnt = KV_MIN(tile, nblk - t0 - nt);
            if (pnt <= 0) {
                pphys = (blk + 1) * bs < ctx_max ? table[blk + 1] : -1;
                pt0 = 0;
                pnt = pphys >= 0 ? KV_MIN(tile, KV_MIN(bs, ctx_max - (blk + 1) * bs)) : 0;
            }
            for (int g = g0; g < g1; g++) {
                const int e = rb[g - g0 + 1];
                int a = ra[g - g0];
                while (a < e && ctx[a] <= P) a++; /* rows whose context ended */
                ra[g - g0] = a;
                if (a == e) continue;
                for (int r = a; r < e; r++) ntr[r] = KV_MIN(nt, ctx[r] - P);
                if (pnt) prefetch_rows(j, kv->k, pphys, pt0, pnt, g);
                size_t stride;
                kv_cache_dtype d;
                const uint8_t *rk = tile_rows(j, kv->k, phys, t0, ntr[e - 1], g, buf, &stride, &d);
                for (int r = a; r < e; r += ATTN_HC) {
                    const int re = KV_MIN(e, r + ATTN_HC);
                    j->kern->scores(qr + r, re - r, hd, rk, stride, ntr[re - 1], d, j->scale, s + (size_t)r * ATTN_TILE,
                                    ATTN_TILE);
                }
                for (int r = a; r < e; r++) {
                    float *sr = s + (size_t)r * ATTN_TILE;
                    const float mx = j->kern->maxf(sr, ntr[r]);
                    if (mx > m[r]) {
                        if (l[r] > 0.0f) {
                            const float corr = expf(m[r] - mx);
                            l[r] *= corr;
                            j->kern->scalev(ar[r], hd, corr);
                        }
                        m[r] = mx;
                    }
                    l[r] += j->kern->expsum(sr, ntr[r], m[r]);
                }
                if (pnt) prefetch_rows(j, kv->v, pphys, pt0, pnt, g);
                const uint8_t *rv = tile_rows(j, kv->v, phys, t0, ntr[e - 1], g, buf, &stride, &d);
                accum_rows(j, ar, ntr, a, e, rv, stride, d, s);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        j->kern->scalev(ar[r], hd, l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
    }
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    attn_job *j = ctx;
    float buf[ATTN_QBUF];
    for (;;) {
        const int k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (k >= j->n_items) break;
        attend(j, &j->items[k], buf);
    }
}

/* Tokens from i on that one item may take, at most tmax: the following
 * tokens of the same sequence (one block table) whose positions do not
 * decrease, so the item's rows of a kv head have non-decreasing contexts. */
static int run_length(const kv_attn_batch *ab, int i, int tmax) {
    int n = 1;
    while (n < tmax && i + n < ab->n_tokens && ab->seq[i + n] == ab->seq[i] && ab->pos[i + n] >= ab->pos[i + n - 1])
        n++;
    return n;
}

/* How an item's token count and head range are chosen: at most ATTN_RUN
 * tokens and ATTN_ROWS rows; heads per item `hpi` (whole GQA groups when
 * it reaches one), fewer when the batch has few token groups, so that every
 * thread gets several items to take. */
typedef struct attn_plan {
    int tmax; /* tokens per item (at most) */
    int hpi;  /* query heads per item (at most; fewer when its tokens would exceed ATTN_ROWS rows) */
    int G;    /* query heads per kv head */
} attn_plan;

/* Heads per item for an item of nt tokens. */
static int plan_heads(const attn_plan *pl, int nt) {
    int h = KV_MIN(pl->hpi, ATTN_ROWS / nt);
    if (h >= pl->G) h = h / pl->G * pl->G;
    return KV_MAX(h, 1);
}

/* Fills items from the cursor (*tok, *head) on, at most cap; returns the count. */
static int plan_items(const kv_attn_batch *ab, int n_heads, const attn_plan *pl, attn_item *it, int cap, int *tok,
                      int *head) {
    int n = 0;
    while (n < cap && *tok < ab->n_tokens) {
        const int nt = run_length(ab, *tok, pl->tmax), hpi = plan_heads(pl, nt);
        it[n++] = (attn_item){*tok, nt, *head, KV_MIN(n_heads, *head + hpi)};
        *head += hpi;
        if (*head >= n_heads) {
            *head = 0;
            *tok += nt;
        }
    }
    return n;
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
        .tile = KV_MAX(1, KV_MIN(ATTN_TILE, ATTN_QBUF / kv->head_dim)),
    };
    int64_t total = 0; /* context length x heads */
    for (int i = 0; i < ab->n_tokens; i++) total += ((int64_t)ab->pos[i] + 1) * n_heads;
    /* A small job is not worth waking the pool for: little arithmetic and
     * little K/V to stream (a single decode token of a 100M model streams
     * hundreds of KiB per layer, which two threads read faster). */
    const int64_t kv_bytes = total / (n_heads / kv->n_kv_heads) * 2 * (int64_t)kv->row_bytes;
    if (total < 4096 && kv_bytes < 65536) pool = NULL;
    const int nth = kv_threadpool_size(pool);
    attn_plan pl = {.G = n_heads / kv->n_kv_heads};
    pl.tmax = KV_MAX(1, KV_MIN(ATTN_RUN, ATTN_ROWS / pl.G));
    int groups = 0; /* token groups (items if each took every head) */
    for (int i = 0; i < ab->n_tokens; i += run_length(ab, i, pl.tmax)) groups++;
    /* NOTE: 8 items per thread balance well with items taken from a
     * counter; a larger head range per item reads longer contiguous runs. */
    pl.hpi = (int)KV_MAX(1, KV_MIN((int64_t)n_heads, (int64_t)n_heads * groups / (8 * nth)));
    attn_item items[ATTN_ITEMS];
    j.items = items;
    int tok = 0, head = 0;
    while (tok < ab->n_tokens) {
        j.n_items = plan_items(ab, n_heads, &pl, items, ATTN_ITEMS, &tok, &head);
        atomic_store_explicit(&j.next, 0, memory_order_relaxed);
        kv_threadpool_run(pool, attn_task, &j);
    }
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

/* The reference's fp8 rounding (kv_dtype.c fp8_encode) on 8 lanes, in the
 * same integer steps: NaN, infinity and f32 zero/subnormal first, then the
 * normal or subnormal code with round-half-even on the dropped bits and the
 * clamp to the largest finite code. */
static T_AVX2 __m256i fp8_encode8(__m256 f, int mbits, int bias, int max_code, int nan_code) {
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
static T_AVX2 float absmax_avx2(const float *src, int n) {
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

static T_AVX2 void fp8_encode_avx2(const float *src, uint8_t *dst, int n, int e4) {
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
static T_AVX2 void int8_encode_avx2(const float *src, uint8_t *dst, int n) {
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

#endif

static void encode_row(kv_cpu_isa isa, kv_cache_dtype d, const float *src, uint8_t *dst, int hd) {
#ifdef ATTN_X86
    if (d == KV_CACHE_F16 && isa >= KV_CPU_ISA_AVX2) {
        f16_encode_avx2(src, dst, hd);
        return;
    }
    if (d == KV_CACHE_INT8 && isa >= KV_CPU_ISA_AVX2) {
        int8_encode_avx2(src, dst, hd);
        return;
    }
    if ((d == KV_CACHE_FP8_E4M3 || d == KV_CACHE_FP8_E5M2) && isa >= KV_CPU_ISA_AVX2) {
        fp8_encode_avx2(src, dst, hd, d == KV_CACHE_FP8_E4M3);
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
        for (int g = 0; g < nkv; g++) {
            size_t src = ((size_t)i * nkv + g) * hd, off = kv_pages_row_offset(kv, j->layer, slot, g);
            encode_row(j->isa, kv->dtype, j->k + src, kv->k + off, hd);
            encode_row(j->isa, kv->dtype, j->v + src, kv->v + off, hd);
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
