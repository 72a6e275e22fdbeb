/* quant_ext_k512.c - AVX-512 VNNI Q4_K and Q6_K matmul tiles: up to 4
 * weight rows against up to 2 activation rows (q8_K) per pass, so each
 * activation super-block is loaded once for 4 rows (decode) and each
 * weight super-block is unpacked once for 2 activation rows (batches).
 *
 * Per super-block of a weight row: the 6-bit (q4_K) or int8 (q6_K)
 * sub-block scales widen to int16 lanes with vector shifts and masks (no
 * scalar unpacking) and a word permute spreads them over the lanes of each
 * 64-quant register; maddubs makes the u8 x s8 pair sums and vpdpwssd
 * multiplies them by the scales and accumulates, exact in int32. The
 * q4_K min term (dmin * sum_j m_j * the activations' sum over sub-block j)
 * and q6_K's offset of 32 come from one vpmaddwd with q8_K's bsums.
 *
 * Every output (weight row r, activation row j) is the same chain of fp32
 * operations whichever tile computes it (per super-block one fma of the
 * integer sum, q4_K one more for the min term, then one horizontal sum), so
 * a row's result does not depend on how many rows the call had: batch
 * invariance, checked bit for bit by tests/kernels/test_quant_ext.c. */
#include "quant_ext_simd.h"

#ifdef KV_QEXT_HAVE_X86

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

#define KV_AI static inline __attribute__((always_inline))
#define TILE_R 4 /* weight rows per pass */
#define TILE_J 2 /* activation rows per pass */

/* Word-permute indices that spread sub-block scales over a register's 32
 * int16 lanes (maddubs output lane m covers quants 2m, 2m+1). q4_K:
 * register k (2h + hi) holds sub-blocks 4h + hi (lanes 0-15) and 4h + 2 +
 * hi (16-31); q6_K: register k holds sub-blocks 4k + m / 8. */
static const int16_t k4_scale_idx[4][32] = {
#define H16(a, b) a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b
    {H16(0, 2)}, {H16(1, 3)}, {H16(4, 6)}, {H16(5, 7)},
#undef H16
};
static const int16_t q6_idx[4][32] = {
#define R8(b) b, b, b, b, b, b, b, b
    {R8(0), R8(1), R8(2), R8(3)},
    {R8(4), R8(5), R8(6), R8(7)},
    {R8(8), R8(9), R8(10), R8(11)},
    {R8(12), R8(13), R8(14), R8(15)},
#undef R8
};

/* One activation super-block in the order a tile reads it. */
typedef struct k_act {
    __m512i q[4];  /* quants in the weight registers' order */
    __m256i bsums; /* the 16 sums of 16 */
    float d;
} k_act;

/* q4_K order: register 2h + hi holds sub-blocks 4h + hi and 4h + 2 + hi. */
KV_AI void k4_act(const kv_block_q8_K *y, k_act *o) {
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const int8_t *a = y->qs + 128 * h;
        o->q[2 * h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a)),
                                         _mm256_loadu_si256((const __m256i *)(const void *)(a + 64)), 1);
        o->q[2 * h + 1] =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(a + 32))),
                               _mm256_loadu_si256((const __m256i *)(const void *)(a + 96)), 1);
    }
    o->bsums = _mm256_loadu_si256((const __m256i *)(const void *)y->bsums);
    o->d = q8k_d(y);
}

/* q6_K order: element order, 64 per register. */
KV_AI void q6_act(const kv_block_q8_K *y, k_act *o) {
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) o->q[k] = _mm512_loadu_si512((const void *)(y->qs + 64 * k));
    o->bsums = _mm256_loadu_si256((const __m256i *)(const void *)y->bsums);
    o->d = q8k_d(y);
}

/* One weight super-block unpacked: unsigned quants per register, their
 * int16 scales per lane, the 16 int16 the bsums multiply, d and dmin. */
typedef struct k_wt {
    __m512i q[4], s[4];
    __m256i m;
    float d, dmin;
} k_wt;

KV_AI void k4_wt(const kv_block_q4_K *x, const __m512i idx[4], k_wt *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m128i sm = k4_scales(x->scales);
    const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i v = _mm512_loadu_si512((const void *)(x->qs + 64 * h));
        o->q[2 * h] = _mm512_and_si512(v, m4);
        o->q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) o->s[k] = _mm512_permutexvar_epi16(idx[k], s16);
    o->m = k4_mins_dup(sm);
    o->d = h2f(&x->d);
    o->dmin = h2f(&x->dmin);
}

KV_AI void q6_wt(const kv_block_q6_K *x, const __m512i idx[4], k_wt *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* per 16-bit lane: bytes 0-31 of a register take qh bits 0-1 (low
     * nibbles) or 4-5 (high), bytes 32-63 bits 2-3 or 6-7, moved to 4-5 */
    const __m512i sl = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    const __m512i sr = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512((const void *)(x->ql + 64 * h));
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(x->qh + 32 * h)));
        const __m512i hl = _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m30);
        const __m512i hh = _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m30);
        o->q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), hl);
        o->q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), hh);
    }
    o->m = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x->scales));
    const __m512i s16 = _mm512_castsi256_si512(o->m);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) o->s[k] = _mm512_permutexvar_epi16(idx[k], s16);
    o->d = h2f(&x->d);
    o->dmin = 0;
}

/* sum over the super-block of scale * (q . a), exact in int32 */
KV_AI __m512i k_isum(const k_wt *w, const k_act *a) {
    __m512i s = _mm512_setzero_si512();
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(w->q[k], a->q[k]), w->s[k]);
    return s;
}

/* One (row, activation) super-block into acc: Q6 = 0 (q4_K) subtracts the
 * min term in float; Q6 = 1 takes 32 * sum_j sc_j * bsum_j off the
 * integer sum (its quants were used unsigned, q + 32). */
KV_AI __m512 k_step(__m512 acc, const k_wt *w, const k_act *a, const int Q6) {
    __m512i s = k_isum(w, a);
    const __m256i mb = _mm256_madd_epi16(w->m, a->bsums);
    if (Q6) s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(_mm256_slli_epi32(mb, 5)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(w->d * a->d), acc);
    if (!Q6) acc = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(mb)), _mm512_set1_ps(w->dmin * a->d), acc);
    return acc;
}

/* R weight rows (R <= TILE_R) x J activation rows (J <= TILE_J) over nb
 * super-blocks: y[j * ys + r]. The next tile's rows are prefetched a
 * super-block at a time (pf: their first byte, NULL at the end). */
KV_AI void k_tile(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, float *y, size_t ys,
                  const uint8_t *pf, const int R, const int J, const int Q6) {
    const size_t bs = Q6 ? sizeof(kv_block_q6_K) : sizeof(kv_block_q4_K);
    __m512i idx[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) idx[k] = _mm512_loadu_si512((const void *)(Q6 ? q6_idx[k] : k4_scale_idx[k]));
    __m512 acc[TILE_R][TILE_J];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 2
        for (int j = 0; j < J; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        k_act act[TILE_J];
        #pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            const kv_block_q8_K *yb = (const kv_block_q8_K *)(const void *)(a + (size_t)j * as) + i;
            if (Q6)
                q6_act(yb, &act[j]);
            else
                k4_act(yb, &act[j]);
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)i * bs;
            if (pf)
                for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)(pf + (size_t)r * ws + (size_t)i * bs + o), _MM_HINT_T0);
            k_wt wt;
            if (Q6)
                q6_wt((const kv_block_q6_K *)(const void *)blk, idx, &wt);
            else
                k4_wt((const kv_block_q4_K *)(const void *)blk, idx, &wt);
            #pragma GCC unroll 2
            for (int j = 0; j < J; j++) acc[r][j] = k_step(acc[r][j], &wt, &act[j], Q6);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 2
        for (int j = 0; j < J; j++) y[(size_t)j * ys + (size_t)r] = _mm512_reduce_add_ps(acc[r][j]);
}

/* The batched tiles (more than TILE_J activation rows) unpack the weight
 * rows' super-blocks CHUNK_SB at a time and run blocks of ACT_BLOCK
 * activation rows over them, a pair at a time, the accumulators kept in
 * memory between chunks: each weight super-block is unpacked once per 16
 * activation rows instead of once per pair. Same chain per output. */
#define CHUNK_SB 8
#define ACT_BLOCK 16

/* Activation rows j, j + 1 (J of them) of an ACT_BLOCK over the nc
 * unpacked super-blocks from i0 (first: the accumulators start at zero). */
KV_AI void k_apply(__m512 accb[TILE_R][ACT_BLOCK], int j, const k_wt wt[TILE_R][CHUNK_SB], int nc, const uint8_t *a,
                   size_t as, int64_t i0, const int R, const int J, const int Q6) {
    __m512 acc[TILE_R][TILE_J];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) acc[r][jj] = i0 ? accb[r][j + jj] : _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) {
        k_act act[TILE_J];
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) {
            const kv_block_q8_K *yb = (const kv_block_q8_K *)(const void *)(a + (size_t)(j + jj) * as) + i0 + c;
            if (Q6)
                q6_act(yb, &act[jj]);
            else
                k4_act(yb, &act[jj]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
            for (int jj = 0; jj < J; jj++) acc[r][jj] = k_step(acc[r][jj], &wt[r][c], &act[jj], Q6);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) accb[r][j + jj] = acc[r][jj];
}

KV_AI void k_tile_many(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int na, float *y,
                       size_t ys, const int R, const int Q6) {
    const size_t bs = Q6 ? sizeof(kv_block_q6_K) : sizeof(kv_block_q4_K);
    __m512i idx[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) idx[k] = _mm512_loadu_si512((const void *)(Q6 ? q6_idx[k] : k4_scale_idx[k]));
    k_wt wt[TILE_R][CHUNK_SB];
    __m512 accb[TILE_R][ACT_BLOCK];
    for (int jb = 0; jb < na; jb += ACT_BLOCK) {
        const int nj = na - jb < ACT_BLOCK ? na - jb : ACT_BLOCK;
        const uint8_t *ab = a + (size_t)jb * as;
        for (int64_t i0 = 0; i0 < nb; i0 += CHUNK_SB) {
            const int nc = nb - i0 < CHUNK_SB ? (int)(nb - i0) : CHUNK_SB;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                for (int c = 0; c < nc; c++) {
                    const uint8_t *blk = w + (size_t)r * ws + (size_t)(i0 + c) * bs;
                    if (Q6)
                        q6_wt((const kv_block_q6_K *)(const void *)blk, idx, &wt[r][c]);
                    else
                        k4_wt((const kv_block_q4_K *)(const void *)blk, idx, &wt[r][c]);
                }
            int j = 0;
            for (; j + 2 <= nj; j += 2) k_apply(accb, j, wt, nc, ab, as, i0, R, 2, Q6);
            if (j < nj) k_apply(accb, j, wt, nc, ab, as, i0, R, 1, Q6);
        }
        for (int r = 0; r < R; r++)
            for (int j = 0; j < nj; j++) y[(size_t)(jb + j) * ys + (size_t)r] = _mm512_reduce_add_ps(accb[r][j]);
    }
}

typedef void (*many_fn)(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int na, float *y,
                        size_t ys);
#define MANY_FN(name, R, Q6)                                                                                           \
    static void name(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int na, float *y,         \
                     size_t ys) {                                                                                      \
        k_tile_many(nb, w, ws, a, as, na, y, ys, R, Q6);                                                               \
    }
MANY_FN(k4m_1, 1, 0)
MANY_FN(k4m_2, 2, 0)
MANY_FN(k4m_3, 3, 0)
MANY_FN(k4m_4, 4, 0)
MANY_FN(q6m_1, 1, 1)
MANY_FN(q6m_2, 2, 1)
MANY_FN(q6m_3, 3, 1)
MANY_FN(q6m_4, 4, 1)
static const many_fn k4m_tab[TILE_R] = {k4m_1, k4m_2, k4m_3, k4m_4};
static const many_fn q6m_tab[TILE_R] = {q6m_1, q6m_2, q6m_3, q6m_4};

/* The tile shapes, compiled apart (R, J constant inside each). */
typedef void (*tile_fn)(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, float *y, size_t ys,
                        const uint8_t *pf);
#define TILE_FN(name, R, J, Q6)                                                                                        \
    static void name(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, float *y, size_t ys,      \
                     const uint8_t *pf) {                                                                              \
        k_tile(nb, w, ws, a, as, y, ys, pf, R, J, Q6);                                                                 \
    }
#define TILE_SET(p, Q6)                                                                                                \
    TILE_FN(p##_1_1, 1, 1, Q6)                                                                                         \
    TILE_FN(p##_2_1, 2, 1, Q6)                                                                                         \
    TILE_FN(p##_3_1, 3, 1, Q6)                                                                                         \
    TILE_FN(p##_4_1, 4, 1, Q6)                                                                                         \
    TILE_FN(p##_1_2, 1, 2, Q6)                                                                                         \
    TILE_FN(p##_2_2, 2, 2, Q6)                                                                                         \
    TILE_FN(p##_3_2, 3, 2, Q6)                                                                                         \
    TILE_FN(p##_4_2, 4, 2, Q6)                                                                                         \
    static const tile_fn p##_tab[TILE_J][TILE_R] = {{p##_1_1, p##_2_1, p##_3_1, p##_4_1},                              \
                                                    {p##_1_2, p##_2_2, p##_3_2, p##_4_2}};
TILE_SET(k4t, 0)
TILE_SET(q6t, 1)

/* All nr x na outputs in tiles of 4 weight rows (then the leftover rows):
 * up to TILE_J activation rows stream through k_tile (each full tile
 * prefetching the next), more go to the batched k_tile_many. */
static void k_rows(const tile_fn tab[TILE_J][TILE_R], const many_fn many[TILE_R], int64_t K, const void *vw, size_t ws,
                   int nr, const void *va, size_t as, int na, float *y, size_t ys) {
    const uint8_t *w = vw, *a = va;
    const int64_t nb = K / KV_QK_K;
    for (int r = 0; r < nr; r += TILE_R) {
        const int R = nr - r < TILE_R ? nr - r : TILE_R;
        const uint8_t *wr = w + (size_t)r * ws;
        if (na > TILE_J) {
            many[R - 1](nb, wr, ws, a, as, na, y + (size_t)r, ys);
            continue;
        }
        const uint8_t *pf = nr - r >= 2 * TILE_R ? wr + (size_t)TILE_R * ws : NULL;
        tab[na - 1][R - 1](nb, wr, ws, a, as, y + (size_t)r, ys, pf);
    }
}

void kv_qext_rows_q4_K_avx512(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na, float *y,
                              size_t ys) {
    k_rows(k4t_tab, k4m_tab, K, w, ws, nr, a, as, na, y, ys);
}
void kv_qext_rows_q6_K_avx512(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na, float *y,
                              size_t ys) {
    k_rows(q6t_tab, q6m_tab, K, w, ws, nr, a, as, na, y, ys);
}

float kv_qext_dot_q4_K_avx512(int64_t n, const void *w, const void *a) {
    float y;
    k4t_1_1(n / KV_QK_K, w, 0, a, 0, &y, 0, NULL);
    return y;
}
float kv_qext_dot_q6_K_avx512(int64_t n, const void *w, const void *a) {
    float y;
    q6t_1_1(n / KV_QK_K, w, 0, a, 0, &y, 0, NULL);
    return y;
}

KV_SIMD_TARGET_END

#endif
