/* quant_ext_q5_512.c - AVX-512 VNNI Q5_0 matmul tiles (q8_0 activations):
 * up to 4 weight rows x 2 activation rows per pass over pairs of 32-blocks
 * (one zmm: lanes 0-7 the first block, 8-15 the second), and, for more
 * activation rows, 4 rows' pairs unpacked a chunk at a time for blocks of
 * 16 activation rows, as quant_ext_k512.c does for the K-quants.
 *
 * The quants are used unsigned (q + 16 in [0, 31]) in vpdpbusd against the
 * activations, and 16 * (the activations' sums of 4) come off per lane;
 * the fp32 step per pair and output is one fma of those int32 lanes with
 * d_w * d_a spread over the lanes, then one horizontal sum at the end: the
 * same chain in every tile shape, so every output equals the 1 x 1 tile
 * (this level's vec_dot) bit for bit. */
#include "quant_ext_simd.h"

#ifdef KV_QEXT_HAVE_X86

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

#define KV_AI static inline __attribute__((always_inline))
#define Q5_R 4      /* weight rows per pass */
#define Q5_CHUNK 16 /* block pairs unpacked at once by the batched tiles */
#define Q5_ACTS 16  /* activation rows per block of the batched tiles */

/* One pair of blocks of a weight row: unsigned quants, d per lane. */
typedef struct q5_wt {
    __m512i q;
    __m512 d;
} q5_wt;

/* Of an activation row: quants, 16 * sums of 4, d per lane. */
typedef struct q5_act {
    __m512i q, corr;
    __m512 d;
} q5_act;

/* Blocks p, p + 1 (two = 0: block p alone, the upper half zero). */
KV_AI void q5w_load(const kv_block_q5_0 *x, q5_wt *o, const int two) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)x[0].qs);
    const __m128i hi = two ? _mm_loadu_si128((const __m128i *)(const void *)x[1].qs) : _mm_setzero_si128();
    const __m256i t = _mm256_set_m128i(hi, lo);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
    /* lanes lo, hi, lo >> 4, hi >> 4 -> lo, lo >> 4, hi, hi >> 4: element order */
    __m512i q = _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
    const __mmask64 hm = (__mmask64)rd32(x[0].qh) | (two ? (__mmask64)rd32(x[1].qh) << 32 : 0);
    o->q = _mm512_mask_add_epi8(q, hm, q, _mm512_set1_epi8(0x10));
    o->d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(h2f(&x[0].d)), _mm512_set1_ps(two ? h2f(&x[1].d) : 0.f));
}

KV_AI void q5a_load(const qx_block_q8_0 *y, q5_act *o, const int two) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)y[0].qs);
    o->q = two ? _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256((const __m256i *)(const void *)y[1].qs), 1)
               : _mm512_zextsi256_si512(lo);
    o->corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(16), o->q);
    o->d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(h2f(&y[0].d)), _mm512_set1_ps(two ? h2f(&y[1].d) : 0.f));
}

KV_AI __m512 q5_step(__m512 acc, const q5_wt *w, const q5_act *a) {
    const __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w->q, a->q), a->corr);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w->d, a->d), acc);
}

/* R rows x J (<= 2) activation rows streamed over the nb blocks; the
 * next tile's rows (pf, NULL at the end) are prefetched as this one goes:
 * 4 interleaved row streams are more than the hardware prefetcher follows. */
KV_AI void q5_tile(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, float *y, size_t ys,
                   const uint8_t *pf, const int R, const int J) {
    __m512 acc[Q5_R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        q5_act act[2];
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) q5a_load((const qx_block_q8_0 *)(const void *)(a + (size_t)j * as) + b, &act[j], two);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (pf) _mm_prefetch((const char *)(pf + (size_t)r * ws + (size_t)b * sizeof(kv_block_q5_0)), _MM_HINT_T0);
            q5_wt wt;
            q5w_load((const kv_block_q5_0 *)(const void *)(w + (size_t)r * ws) + b, &wt, two);
#pragma GCC unroll 2
            for (int j = 0; j < J; j++) acc[r][j] = q5_step(acc[r][j], &wt, &act[j]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int j = 0; j < J; j++) y[(size_t)j * ys + (size_t)r] = _mm512_reduce_add_ps(acc[r][j]);
}

/* Activation rows j (J of them, <= 2) of a block over nc unpacked pairs from block b0. */
KV_AI void q5_apply(__m512 accb[Q5_R][Q5_ACTS], int j, const q5_wt wt[Q5_R][Q5_CHUNK], int nc, int64_t nb,
                    const uint8_t *a, size_t as, int64_t b0, const int R, const int J) {
    __m512 acc[Q5_R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) acc[r][jj] = b0 ? accb[r][j + jj] : _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) {
        const int64_t b = b0 + 2 * c;
        const int two = b + 1 < nb;
        q5_act act[2];
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++)
            q5a_load((const qx_block_q8_0 *)(const void *)(a + (size_t)(j + jj) * as) + b, &act[jj], two);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
            for (int jj = 0; jj < J; jj++) acc[r][jj] = q5_step(acc[r][jj], &wt[r][c], &act[jj]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) accb[r][j + jj] = acc[r][jj];
}

KV_AI void q5_tile_many(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int na, float *y,
                        size_t ys, const int R) {
    q5_wt wt[Q5_R][Q5_CHUNK];
    __m512 accb[Q5_R][Q5_ACTS];
    const int64_t npairs = (nb + 1) / 2;
    for (int jb = 0; jb < na; jb += Q5_ACTS) {
        const int nj = na - jb < Q5_ACTS ? na - jb : Q5_ACTS;
        const uint8_t *ab = a + (size_t)jb * as;
        for (int64_t p0 = 0; p0 < npairs; p0 += Q5_CHUNK) {
            const int nc = npairs - p0 < Q5_CHUNK ? (int)(npairs - p0) : Q5_CHUNK;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                for (int c = 0; c < nc; c++) {
                    const int64_t b = 2 * (p0 + c);
                    q5w_load((const kv_block_q5_0 *)(const void *)(w + (size_t)r * ws) + b, &wt[r][c], b + 1 < nb);
                }
            int j = 0;
            for (; j + 2 <= nj; j += 2) q5_apply(accb, j, wt, nc, nb, ab, as, 2 * p0, R, 2);
            if (j < nj) q5_apply(accb, j, wt, nc, nb, ab, as, 2 * p0, R, 1);
        }
        for (int r = 0; r < R; r++)
            for (int j = 0; j < nj; j++) y[(size_t)(jb + j) * ys + (size_t)r] = _mm512_reduce_add_ps(accb[r][j]);
    }
}

#define Q5_TILE(R)                                                                                                     \
    static void q5t_##R(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int na, float *y,      \
                        size_t ys, const uint8_t *pf) {                                                                \
        if (na == 1)                                                                                                   \
            q5_tile(nb, w, ws, a, as, y, ys, pf, R, 1);                                                                \
        else if (na == 2)                                                                                              \
            q5_tile(nb, w, ws, a, as, y, ys, pf, R, 2);                                                                \
        else                                                                                                           \
            q5_tile_many(nb, w, ws, a, as, na, y, ys, R);                                                              \
    }
Q5_TILE(1)
Q5_TILE(2)
Q5_TILE(3)
Q5_TILE(4)

void kv_qext_rows_q5_0_avx512(int64_t K, const void *vw, size_t ws, int nr, const void *va, size_t as, int na, float *y,
                              size_t ys) {
    static void (*const tab[Q5_R])(int64_t, const uint8_t *, size_t, const uint8_t *, size_t, int, float *, size_t,
                                   const uint8_t *) = {q5t_1, q5t_2, q5t_3, q5t_4};
    const uint8_t *w = vw;
    for (int r = 0; r < nr; r += Q5_R) {
        const int R = nr - r < Q5_R ? nr - r : Q5_R;
        const uint8_t *wr = w + (size_t)r * ws;
        tab[R - 1](K / 32, wr, ws, va, as, na, y + (size_t)r, ys, nr - r >= 2 * Q5_R ? wr + (size_t)Q5_R * ws : NULL);
    }
}

float kv_qext_dot_q5_0_avx512(int64_t n, const void *w, const void *a) {
    float y;
    q5t_1(n / 32, w, 0, a, 0, 1, &y, 0, NULL);
    return y;
}

KV_SIMD_TARGET_END

#endif
