/* matmul_f_avx512.c - AVX-512 kernels for float weights (f32, f16, bf16),
 * every n: decode GEMV and batched GEMM in one register-tiled form that
 * reads weights and activations in place (no transposes, no packing).
 *
 * Arithmetic (the same for every tile shape, so a row's result does not
 * depend on the batch it came in: batch invariance): an output y[j][r] is
 * a 16-lane accumulator where lane l sums w[r][k] * x[j][k] over
 * k = l, l + 16, l + 32, ... in order with one fma each (a last partial
 * step loads zeros past K in both operands), then one fixed tree adds the
 * lanes: l + 8 onto l, then l + 4, l + 2, l + 1 (red16).
 *
 * Tiles: R weight rows x J activation rows, R * J accumulators in
 * registers; a k step loads R weight vectors and J activation vectors for
 * R * J fmas.
 *  - n <= 2 (decode): 16 x 1 or 8 x 2, memory-bound: 16 independent fma
 *    chains hide the fma latency, and a later tile is prefetched a slice
 *    per k step (the rows are one contiguous stream).
 *  - n > 2 (batched): 4 x 4; a block of KV_FB_ROWS weight rows (in L2)
 *    meets every group of 4 activation rows (in L1) before the next block,
 *    so weights come from DRAM once and activations from L1. */
#include "matmul.h"

#if defined(__x86_64__) || defined(__i386__)

#include <string.h>

#include "simd_x86.h"

KV_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#define KV_AI static inline __attribute__((always_inline))

/* Weight rows per L2 block of the batched tiles (x K elements). */
#define KV_FB_BYTES ((size_t)384 << 10)

/* Elements k..k+15 of a float row as f32, lanes outside m zero. */
KV_AI __m512 fw_load(kv_type t, const uint8_t *row, int64_t k, __mmask16 m) {
    if (t == KV_TYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)(const void *)row + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const void *)(row + 2 * k));
    if (t == KV_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The lane tree of 16 accumulators at once: out[i] = the sum of a[i]'s
 * lanes, each output by the same adds as every other (l + 8 onto l, then
 * + 4, + 2, + 1). Accumulators past `count` are taken as zero. */
KV_AI void red16(const __m512 *a, int count, float out[16]) {
    __m512 v[16], t[8], u[4], p[2];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) v[i] = i < count ? a[i] : _mm512_setzero_ps();
    /* [a.c0 + a.c2, a.c1 + a.c3, b.c0 + b.c2, b.c1 + b.c3] (c: 128-bit chunks) */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    /* chunk q of u[i]: accumulator 4i + q, lanes l + 4 added */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    /* chunk q of p[i]: lanes 0-1 accumulator 8i + q, lanes 2-3 8i + 4 + q */
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        p[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44), _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    /* lane 4q + e: accumulator 4e + q */
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], 0x88), _mm512_shuffle_ps(p[0], p[1], 0xDD));
    const __m512i back = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(back, s));
}

/* A later tile's bytes, a slice per k step (NULL base: nothing). */
typedef struct fpf {
    const char *base;
    int lines; /* cache lines per step */
} fpf;

/* One tile's k range and where its partial sums live between ranges. */
typedef struct fspan {
    int64_t k0, k1; /* [k0, k1) of K; k0, k1 multiples of 16 unless k1 = K */
    float *part;    /* (R * J, 16) partial accumulators: read when k0 > 0,
                       written when k1 < K */
} fspan;

/* R weight rows (row i at w + i * ws) x J activation rows (row j at
 * x + j * K) over sp's k range: when it ends at K, the sums into
 * out[i * J + j]. Storing and reloading the 16 partial lanes is exact, so a
 * split k range gives the bits of an unsplit one. */
KV_AI void ftile(kv_type t, const uint8_t *w, size_t ws, const float *x, int64_t K, const int R, const int J,
                 fspan sp, float *out, fpf pf) {
    __m512 acc[24];
#pragma GCC unroll 24
    for (int i = 0; i < R * J; i++) acc[i] = sp.k0 > 0 ? _mm512_load_ps(sp.part + 16 * i) : _mm512_setzero_ps();
    int64_t k = sp.k0;
    const int64_t kend = sp.k1 < K ? sp.k1 : K / 16 * 16;
    for (; k < kend; k += 16) {
        if (pf.base) {
            for (int l = 0; l < pf.lines; l++) _mm_prefetch(pf.base + 64 * l, _MM_HINT_T1);
            pf.base += 64 * pf.lines;
        }
        __m512 wv[16];
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) wv[i] = fw_load(t, w + (size_t)i * ws, k, 0xFFFF);
#pragma GCC unroll 6
        for (int j = 0; j < J; j++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)j * (size_t)K + k);
#pragma GCC unroll 16
            for (int i = 0; i < R; i++) acc[i * J + j] = _mm512_fmadd_ps(wv[i], xv, acc[i * J + j]);
        }
    }
    if (sp.k1 < K) {
#pragma GCC unroll 24
        for (int i = 0; i < R * J; i++) _mm512_store_ps(sp.part + 16 * i, acc[i]);
        return;
    }
    if (k < K) {
        __mmask16 m = kv_tail16(K - k);
        __m512 wv[16];
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) wv[i] = fw_load(t, w + (size_t)i * ws, k, m);
#pragma GCC unroll 6
        for (int j = 0; j < J; j++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)j * (size_t)K + k);
#pragma GCC unroll 16
            for (int i = 0; i < R; i++) acc[i * J + j] = _mm512_fmadd_ps(wv[i], xv, acc[i * J + j]);
        }
    }
    red16(acc, KV_MIN(R * J, 16), out);
    if (R * J > 16) red16(acc + 16, R * J - 16, out + 16);
}

/* y[j0..j0+J) x rows [r, r + R) from one tile (stored once sp reaches K). */
KV_AI void ftile_store(const kv_mm_args *a, kv_type t, int64_t r, int j0, const int R, const int J, fspan sp,
                       fpf pf) {
    float out[32];
    ftile(t, a->w + (size_t)r * a->nb1, a->nb1, a->x + (size_t)j0 * (size_t)a->K, a->K, R, J, sp, out, pf);
    if (sp.k1 < a->K) return;
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
#pragma GCC unroll 6
        for (int j = 0; j < J; j++) a->y[(size_t)(j0 + j) * (size_t)a->M + (size_t)(r + i)] = out[i * J + j];
}

static const fpf no_pf = {NULL, 0};

/* Floats of one tile's partial sums (4 x 6 accumulators). */
#define KV_F_SLOT (24 * 16)

/* Decode (n <= 2): tiles of R rows x n over all of K, a later tile
 * prefetched. */
KV_AI void f_gemv(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, const int R, const int J, float *scratch) {
    const int64_t steps = (a->K + 15) / 16;
    const size_t tile_bytes = (size_t)R * a->nb1;
    const int lines = (int)((tile_bytes + (size_t)steps * 64 - 1) / ((size_t)steps * 64));
    const fspan all = {0, a->K, scratch}; /* one range: no partials */
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        fpf pf = {NULL, lines};
        if (r + 2 * R <= a->M) pf.base = (const char *)a->w + (size_t)(r + R) * a->nb1;
        ftile_store(a, t, r, 0, R, J, all, pf);
    }
    for (; r < r1; r++) ftile_store(a, t, r, 0, 1, J, all, no_pf);
}

/* Activation rows [j0, j0 + J) against rows [r0, r1) over [k0, k1):
 * tiles of 4 rows, then single rows, each with its own partial slot. */
KV_AI void f_group(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, int j0, const int J, int64_t k0,
                   int64_t k1, float *part) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4, part += KV_F_SLOT) ftile_store(a, t, r, j0, 4, J, (fspan){k0, k1, part}, no_pf);
    for (; r < r1; r++, part += KV_F_SLOT) ftile_store(a, t, r, j0, 1, J, (fspan){k0, k1, part}, no_pf);
}

/* Batched (n > 2): L2 blocks of rows; per block every group of 6
 * activation rows, K in chunks small enough that the group's slice stays
 * in L1 while the block's rows pass it. scratch: the partial slots (the
 * driver lends at least 128 * K bytes, kv_mm_scratch_bytes). */
KV_AI void f_gemm(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, float *scratch) {
    const int64_t K = a->K;
    const int64_t kc = K <= 1024 ? K : 512;
    int64_t blk = (int64_t)(KV_FB_BYTES / a->nb1);
    if (kc < K) /* slots of the block's tiles and its last 3 single rows */
        blk = KV_MIN(blk, (int64_t)((size_t)128 * (size_t)K / (KV_F_SLOT * sizeof(float))) - 3);
    blk = KV_MAX(blk / 4 * 4, (int64_t)4);
    for (int64_t b0 = r0; b0 < r1; b0 += blk) {
        int64_t b1 = KV_MIN(r1, b0 + blk);
        for (int j = 0; j < a->n; j += 6)
            for (int64_t k0 = 0; k0 < K; k0 += kc) {
                int64_t k1 = KV_MIN(K, k0 + kc);
                switch (KV_MIN(a->n - j, 6)) {
                case 6: f_group(a, t, b0, b1, j, 6, k0, k1, scratch); break;
                case 5: f_group(a, t, b0, b1, j, 5, k0, k1, scratch); break;
                case 4: f_group(a, t, b0, b1, j, 4, k0, k1, scratch); break;
                case 3: f_group(a, t, b0, b1, j, 3, k0, k1, scratch); break;
                case 2: f_group(a, t, b0, b1, j, 2, k0, k1, scratch); break;
                default: f_group(a, t, b0, b1, j, 1, k0, k1, scratch); break;
                }
            }
    }
}

KV_AI void f_rows(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, void *scratch) {
    if (a->n == 1)
        f_gemv(a, t, r0, r1, 16, 1, scratch);
    else if (a->n == 2)
        f_gemv(a, t, r0, r1, 8, 2, scratch);
    else
        f_gemm(a, t, r0, r1, scratch);
}

void kv_mm_frows_avx512(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {
    switch (a->type) {
    case KV_TYPE_F32: f_rows(a, KV_TYPE_F32, r0, r1, scratch); break;
    case KV_TYPE_F16: f_rows(a, KV_TYPE_F16, r0, r1, scratch); break;
    case KV_TYPE_BF16: f_rows(a, KV_TYPE_BF16, r0, r1, scratch); break;
    default: kv_mm_rows_ref(a, r0, r1, scratch); break;
    }
}

KV_SIMD_TARGET_END

#endif
