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
 * Batches (more than 2 activation rows) run on panels of 16 weight rows,
 * one row per lane, repacked once per call as matmul_avx512.c's q8_0
 * panels are: each 4-byte group of quants of the 16 rows in one zmm, so
 * vpdpbusd broadcasts 4 activation bytes and every weight byte loaded feeds
 * 8 activation rows; the sub-block sums are scaled with vpmulld.
 *
 * Every output (weight row r, activation row j) is the same chain of fp32
 * operations whichever kernel computes it: per super-block, the exact
 * integer total isum = sum_j sc_j * (q . a over sub-block j) (q6_K: minus
 * 32 sum_k sc_k bsum_k) and then acc = fma(float(isum), d * d_a, acc), and
 * for q4_K acc = fnma(float(msum), dmin * d_a, acc) with msum = sum_j m_j *
 * (a's sum over sub-block j). The row tiles reduce their lanes to isum in
 * integers each super-block; the panels hold one output per lane. So a
 * row's result does not depend on how many rows the call had: batch
 * invariance, checked bit for bit by tests/kernels/test_quant_ext.c. */
#include "matmul.h" /* KV_PP_AHEAD */
#include "quant_ext_simd.h"

#ifdef KV_QEXT_HAVE_X86

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include "simd_avx512.h"

#define KV_AI static inline __attribute__((always_inline))
#define TILE_R 4 /* weight rows per pass */
#define TILE_J 2 /* activation rows per pass */
/* The decode tiles prefetch the tile KPF_AHEAD tiles ahead, into L2.
 * NOTE: measured on Zen 4, 2 threads, generate: the next tile into L1
 * (the old plan) read the 1B q4_k_m file at 49-50% of the ceiling (25
 * tok/s), two tiles ahead into L2 at 77-82% (40-43 tok/s), four ahead no
 * better; the q8_0 tiles found the same (matmul_avx512.c). */
#define KPF_AHEAD 2
#define KPF_HINT _MM_HINT_T1

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

/* q6_K's quants + 32 (0..63) of elements 64k..64k+63, element order. */
KV_AI __m512i q6_reg(const kv_block_q6_K *x, const int k) {
    const int h = k >> 1;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i ql = _mm512_loadu_si512((const void *)(x->ql + 64 * h));
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(x->qh + 32 * h)));
    /* per 16-bit lane: bytes 0-31 of a register take qh bits 0-1 (low
     * nibbles) or 4-5 (high), bytes 32-63 bits 2-3 or 6-7, moved to 4-5 */
    if (!(k & 1)) {
        const __m512i sl = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
        return _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m30));
    }
    const __m512i sr = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m30));
}

/* All four registers of q6_reg. */
KV_AI void q6_quants(const kv_block_q6_K *x, __m512i q[4]) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) q[k] = q6_reg(x, k);
}

KV_AI void q6_wt(const kv_block_q6_K *x, const __m512i idx[4], k_wt *o) {
    q6_quants(x, o->q);
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

/* Lane sums of 4 rows' int32 vectors, exact: row r in lane r. */
KV_AI __m128i hsum4x16(const __m512i v[4]) {
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    const __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    const __m256i d = _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
}
KV_AI __m128i hsum4x8(const __m256i v[4]) {
    const __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
    const __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2], v[3]), _mm256_unpackhi_epi32(v[2], v[3]));
    const __m256i c = _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* R weight rows (R <= TILE_R) x J activation rows (J <= TILE_J) over nb
 * super-blocks: y[j * ys + r]. Per super-block the 4 rows' lanes reduce to
 * their exact totals (row r in lane r; rows past R are zero) and then take
 * the panels' float steps, lane for lane. Q6 = 0 (q4_K) subtracts the min
 * term in float; Q6 = 1 takes 32 * sum_k sc_k * bsum_k off the integer sum
 * (its quants were used unsigned, q + 32). A later tile's rows (KPF_AHEAD
 * tiles on) are prefetched a super-block at a time (pf: their first byte,
 * NULL near the end). */
KV_AI void k_tile(int64_t nb, const uint8_t *w, size_t ws, const uint8_t *a, size_t as, float *y, size_t ys,
                  const uint8_t *pf, const int R, const int J, const int Q6) {
    const size_t bs = Q6 ? sizeof(kv_block_q6_K) : sizeof(kv_block_q4_K);
    __m512i idx[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) idx[k] = _mm512_loadu_si512((const void *)(Q6 ? q6_idx[k] : k4_scale_idx[k]));
    __m128 acc[TILE_J];
    #pragma GCC unroll 2
    for (int j = 0; j < J; j++) acc[j] = _mm_setzero_ps();
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
        __m512i s[TILE_J][TILE_R];
        __m256i mb[TILE_J][TILE_R];
        float dw[TILE_R] = {0}, dm[TILE_R] = {0};
        #pragma GCC unroll 4
        for (int r = 0; r < TILE_R; r++) {
            if (r >= R) {
                #pragma GCC unroll 2
                for (int j = 0; j < J; j++) s[j][r] = _mm512_setzero_si512(), mb[j][r] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *blk = w + (size_t)r * ws + (size_t)i * bs;
            if (pf)
                for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)(pf + (size_t)r * ws + (size_t)i * bs + o), KPF_HINT);
            k_wt wt;
            if (Q6)
                q6_wt((const kv_block_q6_K *)(const void *)blk, idx, &wt);
            else
                k4_wt((const kv_block_q4_K *)(const void *)blk, idx, &wt);
            dw[r] = wt.d;
            dm[r] = wt.dmin;
            #pragma GCC unroll 2
            for (int j = 0; j < J; j++) {
                s[j][r] = k_isum(&wt, &act[j]);
                mb[j][r] = _mm256_madd_epi16(wt.m, act[j].bsums);
            }
        }
        const __m128 d4 = _mm_loadu_ps(dw), dm4 = _mm_loadu_ps(dm);
        #pragma GCC unroll 2
        for (int j = 0; j < J; j++) {
            __m128i is = hsum4x16(s[j]);
            const __m128i ms = hsum4x8(mb[j]);
            const __m128 da = _mm_set1_ps(act[j].d);
            if (Q6) is = _mm_sub_epi32(is, _mm_slli_epi32(ms, 5));
            acc[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(is), _mm_mul_ps(d4, da), acc[j]);
            if (!Q6) acc[j] = _mm_fnmadd_ps(_mm_cvtepi32_ps(ms), _mm_mul_ps(dm4, da), acc[j]);
        }
    }
    #pragma GCC unroll 2
    for (int j = 0; j < J; j++) {
        float o[4];
        _mm_storeu_ps(o, acc[j]);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[(size_t)j * ys + (size_t)r] = o[r];
    }
}

/* ---- batched: panels of 16 weight rows, one row per lane ---------------- */

#define KP_SB 8 /* super-blocks a panel holds at once (32 KB of quants) */
#define KP_J 8  /* activation rows per kernel pass */

/* KP_SB super-blocks of 16 weight rows (missing rows repeat row 0). */
typedef struct kp_panel {
    uint8_t q[KP_SB][64][64]; /* group G: elements 4G..4G+3 of the 16 rows, unsigned */
    int32_t sc[KP_SB][16][16]; /* sub-block scales [sb][sub][row]: q4_K 8 of 32 elements, q6_K 16 of 16 */
    int32_t mn[KP_SB][8][16];  /* int16 pairs against q8_K's bsum pairs: q4_K (m_j, m_j), q6_K (sc_2k, sc_2k+1) */
    float d[KP_SB][16], dmin[KP_SB][16];
} kp_panel;

/* r[i] = 16 dwords of row i -> r[G] = dword G of rows 0..15. */
KV_AI void tr16x16(__m512i r[16]) {
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    /* u[4k + m], lane L: dword 4L + m of rows 4k..4k+3 */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        const __m512i x01 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), x23 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
        const __m512i y01 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE), y23 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
        r[m] = _mm512_shuffle_i32x4(x01, x23, 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(x01, x23, 0xDD);
        r[8 + m] = _mm512_shuffle_i32x4(y01, y23, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(y01, y23, 0xDD);
    }
}

/* Super-blocks i0..i0+nc of rows w (rows of them, stride ws) into P:
 * each 64-quant register of the 16 rows and the rows' scales widened to
 * int32 go through one 16 x 16 dword transpose. */
static void kp_pack(const uint8_t *w, size_t ws, int rows, int64_t i0, int nc, kp_panel *P, const int Q6) {
    const size_t bs = Q6 ? sizeof(kv_block_q6_K) : sizeof(kv_block_q4_K);
    const uint8_t *base[16];
    for (int rr = 0; rr < 16; rr++) base[rr] = w + (size_t)(rr < rows ? rr : 0) * ws;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < nc; c++) {
        const size_t bo = (size_t)(i0 + c) * bs;
        __m512i r[16];
        for (int h = 0; h < 4; h++) { /* elements 64h..64h+63 of every row */
#pragma GCC unroll 16
            for (int rr = 0; rr < 16; rr++) {
                if (Q6) {
                    r[rr] = q6_reg((const kv_block_q6_K *)(const void *)(base[rr] + bo), h);
                } else {
                    const kv_block_q4_K *x = (const kv_block_q4_K *)(const void *)(base[rr] + bo);
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(x->qs + 32 * h));
                    r[rr] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                                               _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
                }
            }
            tr16x16(r);
#pragma GCC unroll 16
            for (int g = 0; g < 16; g++) _mm512_store_si512((void *)P->q[c][16 * h + g], r[g]);
        }
        /* scales: row rr's 16 as int32 (q4_K: sc0..7 m0..7; q6_K: sc0..15) */
#pragma GCC unroll 16
        for (int rr = 0; rr < 16; rr++) {
            const uint8_t *blk = base[rr] + bo;
            if (Q6) {
                const kv_block_q6_K *x = (const kv_block_q6_K *)(const void *)blk;
                r[rr] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)x->scales));
                P->d[c][rr] = h2f(&x->d);
                P->dmin[c][rr] = 0.0f;
            } else {
                const kv_block_q4_K *x = (const kv_block_q4_K *)(const void *)blk;
                r[rr] = _mm512_cvtepu8_epi32(k4_scales(x->scales));
                P->d[c][rr] = h2f(&x->d);
                P->dmin[c][rr] = h2f(&x->dmin);
            }
        }
        tr16x16(r);
        const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
        if (Q6) {
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++) _mm512_store_si512((void *)P->sc[c][k], r[k]);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                _mm512_store_si512((void *)P->mn[c][k],
                                   _mm512_or_si512(_mm512_and_si512(r[2 * k], lo16), _mm512_slli_epi32(r[2 * k + 1], 16)));
        } else {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                _mm512_store_si512((void *)P->sc[c][j], r[j]);
                _mm512_store_si512((void *)P->mn[c][j], _mm512_or_si512(r[8 + j], _mm512_slli_epi32(r[8 + j], 16)));
            }
        }
    }
}


/* y[j][0..16) (j < J, stride ys; lanes outside mask untouched) from the
 * panel's nc super-blocks, activation rows a (stride as) at super-block
 * i0; first: the chain starts at zero, else it goes on from y. */
KV_AI void kp_kernel(const kp_panel *P, int nc, const uint8_t *a, size_t as, int64_t i0, float *y, size_t ys,
                     __mmask16 mask, int first, const int J, const int Q6) {
    __m512 acc[KP_J];
#pragma GCC unroll 8
    for (int jj = 0; jj < J; jj++) acc[jj] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + (size_t)jj * ys);
    for (int c = 0; c < nc; c++) {
        const kv_block_q8_K *ab[KP_J];
        __m512i is[KP_J], ms[KP_J];
#pragma GCC unroll 8
        for (int jj = 0; jj < J; jj++) {
            ab[jj] = (const kv_block_q8_K *)(const void *)(a + (size_t)jj * as) + i0 + c;
            is[jj] = ms[jj] = _mm512_setzero_si512();
        }
        const int SUBS = Q6 ? 16 : 8, GPS = Q6 ? 4 : 8; /* sub-blocks, 4-element groups a sub-block */
#pragma GCC unroll 1
        for (int j = 0; j < SUBS; j++) {
            __m512i wg[8];
#pragma GCC unroll 8
            for (int g = 0; g < GPS; g++) wg[g] = _mm512_load_si512((const void *)P->q[c][GPS * j + g]);
            const __m512i sc = _mm512_load_si512((const void *)P->sc[c][j]);
#pragma GCC unroll 8
            for (int jj = 0; jj < J; jj++) {
                const int8_t *aq = ab[jj]->qs + 4 * GPS * j;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int g = 0; g < GPS; g += 2) {
                    s0 = kv_dpbusd_b512(s0, wg[g], aq + 4 * g, J > 1);
                    s1 = kv_dpbusd_b512(s1, wg[g + 1], aq + 4 * g + 4, J > 1);
                }
                is[jj] = _mm512_add_epi32(is[jj], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i mn = _mm512_load_si512((const void *)P->mn[c][k]);
#pragma GCC unroll 8
            for (int jj = 0; jj < J; jj++) ms[jj] = _mm512_dpwssd_epi32(ms[jj], mn, kv_bcast4_512(ab[jj]->bsums + 2 * k));
        }
        const __m512 dw = _mm512_load_ps(P->d[c]), dm = _mm512_load_ps(P->dmin[c]);
#pragma GCC unroll 8
        for (int jj = 0; jj < J; jj++) {
            const __m512 da = _mm512_set1_ps(q8k_d(ab[jj]));
            if (Q6) is[jj] = _mm512_sub_epi32(is[jj], _mm512_slli_epi32(ms[jj], 5));
            acc[jj] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[jj]), _mm512_mul_ps(dw, da), acc[jj]);
            if (!Q6) acc[jj] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms[jj]), _mm512_mul_ps(dm, da), acc[jj]);
        }
    }
#pragma GCC unroll 8
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(y + (size_t)jj * ys, mask, acc[jj]);
}

typedef void (*kp_fn)(const kp_panel *P, int nc, const uint8_t *a, size_t as, int64_t i0, float *y, size_t ys,
                      __mmask16 mask, int first);
#define KP_FN(name, J, Q6)                                                                                             \
    static void name(const kp_panel *P, int nc, const uint8_t *a, size_t as, int64_t i0, float *y, size_t ys,        \
                     __mmask16 mask, int first) {                                                                      \
        kp_kernel(P, nc, a, as, i0, y, ys, mask, first, J, Q6);                                                        \
    }
#define KP_SET(p, Q6)                                                                                                  \
    KP_FN(p##_1, 1, Q6) KP_FN(p##_2, 2, Q6) KP_FN(p##_3, 3, Q6) KP_FN(p##_4, 4, Q6)                                  \
    KP_FN(p##_5, 5, Q6) KP_FN(p##_6, 6, Q6) KP_FN(p##_7, 7, Q6) KP_FN(p##_8, 8, Q6)                                  \
    static const kp_fn p##_tab[KP_J] = {p##_1, p##_2, p##_3, p##_4, p##_5, p##_6, p##_7, p##_8};
KP_SET(k4p, 0)
KP_SET(q6p, 1)

/* nr weight rows x na activation rows in panels of 16 rows, KP_SB
 * super-blocks packed at a time (the panel lives on the stack). */
static void kp_rows(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *a, size_t as, int na, float *y,
                    size_t ys, const int Q6) {
    _Alignas(64) kp_panel P;
    const kp_fn *tab = Q6 ? q6p_tab : k4p_tab;
    for (int r = 0; r < nr; r += 16) {
        const int rows = nr - r < 16 ? nr - r : 16;
        const __mmask16 mask = (__mmask16)((1u << rows) - 1);
        for (int64_t i0 = 0; i0 < nb; i0 += KP_SB) {
            const int nc = nb - i0 < KP_SB ? (int)(nb - i0) : KP_SB;
            kp_pack(w + (size_t)r * ws, ws, rows, i0, nc, &P, Q6);
            for (int j = 0; j < na; j += KP_J) {
                const int J = na - j < KP_J ? na - j : KP_J;
                tab[J - 1](&P, nc, a + (size_t)j * as, as, i0, y + (size_t)j * ys + (size_t)r, ys, mask, i0 == 0);
            }
        }
    }
}

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

/* All nr x na outputs: up to TILE_J activation rows stream through k_tile
 * in tiles of 4 weight rows (then the leftover rows; each full tile
 * prefetching the next), more go to the panels (kp_rows). */
static void k_rows(const tile_fn tab[TILE_J][TILE_R], int64_t K, const void *vw, size_t ws, int nr, const void *va,
                   size_t as, int na, float *y, size_t ys, const int Q6) {
    const uint8_t *w = vw, *a = va;
    const int64_t nb = K / KV_QK_K;
    if (na > TILE_J) {
        kp_rows(nb, w, ws, nr, a, as, na, y, ys, Q6);
        return;
    }
    for (int r = 0; r < nr; r += TILE_R) {
        const int R = nr - r < TILE_R ? nr - r : TILE_R;
        const uint8_t *wr = w + (size_t)r * ws;
        const uint8_t *pf = nr - r >= (KPF_AHEAD + 1) * TILE_R ? wr + (size_t)(KPF_AHEAD * TILE_R) * ws : NULL;
        tab[na - 1][R - 1](nb, wr, ws, a, as, y + (size_t)r, ys, pf);
    }
}

void kv_qext_rows_q4_K_avx512(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na, float *y,
                              size_t ys) {
    k_rows(k4t_tab, K, w, ws, nr, a, as, na, y, ys, 0);
}
void kv_qext_rows_q6_K_avx512(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na, float *y,
                              size_t ys) {
    k_rows(q6t_tab, K, w, ws, nr, a, as, na, y, ys, 1);
}

/* ---- pre-packed q4_K panels (kv_qext_panel_pack), any n ----------------- */

/* y[j][0..16) for J activation rows from one panel's nb super-blocks,
 * read in the order they are stored; kp_kernel's chain (the exact integer
 * isum and msum, then the two float steps), so the same bits. */
KV_AI void k4pp_kernel(const uint8_t *pp, int64_t nb, const uint8_t *a, size_t as, float *y, size_t ys, __mmask16 mask,
                       const int J, int pf) {
    __m512 acc[KP_J];
#pragma GCC unroll 8
    for (int jj = 0; jj < J; jj++) acc[jj] = _mm512_setzero_ps();
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int64_t c = 0; c < nb; c++) {
        const uint8_t *sb = pp + (size_t)c * KV_QK4_PANEL_SB;
        if (pf) /* see KV_PP_AHEAD; a prefetch never faults */
            for (int l = 0; l < KV_QK4_PANEL_SB; l += 64) _mm_prefetch((const char *)(sb + KV_PP_AHEAD + l), KPF_HINT);
        const kv_block_q8_K *ab[KP_J];
        __m512i is[KP_J], ms[KP_J];
#pragma GCC unroll 8
        for (int jj = 0; jj < J; jj++) {
            ab[jj] = (const kv_block_q8_K *)(const void *)(a + (size_t)jj * as) + c;
            is[jj] = ms[jj] = _mm512_setzero_si512();
        }
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {
            __m512i wg[8];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i v = _mm512_load_si512((const void *)(sb + 320 + 256 * j + 64 * g));
                wg[g] = _mm512_and_si512(v, nib);
                wg[g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(const void *)(sb + 64 + 16 * j)));
#pragma GCC unroll 8
            for (int jj = 0; jj < J; jj++) {
                const int8_t *aq = ab[jj]->qs + 32 * j;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int g = 0; g < 8; g += 2) {
                    s0 = kv_dpbusd_b512(s0, wg[g], aq + 4 * g, J > 1);
                    s1 = kv_dpbusd_b512(s1, wg[g + 1], aq + 4 * g + 4, J > 1);
                }
                is[jj] = _mm512_add_epi32(is[jj], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) { /* (m_k, m_k) int16 pairs against bsums 2k, 2k+1 */
            const __m512i m = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(const void *)(sb + 192 + 16 * k)));
            const __m512i mn = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
#pragma GCC unroll 8
            for (int jj = 0; jj < J; jj++) ms[jj] = _mm512_dpwssd_epi32(ms[jj], mn, kv_bcast4_512(ab[jj]->bsums + 2 * k));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)sb));
        const __m512 dm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)(sb + 32)));
#pragma GCC unroll 8
        for (int jj = 0; jj < J; jj++) {
            const __m512 da = _mm512_set1_ps(q8k_d(ab[jj]));
            acc[jj] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[jj]), _mm512_mul_ps(dw, da), acc[jj]);
            acc[jj] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms[jj]), _mm512_mul_ps(dm, da), acc[jj]);
        }
    }
#pragma GCC unroll 8
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(y + (size_t)jj * ys, mask, acc[jj]);
}

typedef void (*k4pp_fn)(const uint8_t *pp, int64_t nb, const uint8_t *a, size_t as, float *y, size_t ys, __mmask16 mask,
                        int pf);
#define K4PP_FN(J)                                                                                                     \
    static void k4pp_##J(const uint8_t *pp, int64_t nb, const uint8_t *a, size_t as, float *y, size_t ys,            \
                         __mmask16 mask, int pf) {                                                                     \
        k4pp_kernel(pp, nb, a, as, y, ys, mask, J, pf);                                                                \
    }
K4PP_FN(1) K4PP_FN(2) K4PP_FN(3) K4PP_FN(4) K4PP_FN(5) K4PP_FN(6) K4PP_FN(7) K4PP_FN(8)
static const k4pp_fn k4pp_tab[KP_J] = {k4pp_1, k4pp_2, k4pp_3, k4pp_4, k4pp_5, k4pp_6, k4pp_7, k4pp_8};

void kv_qext_panels_q4_K_avx512(int64_t K, const uint8_t *pp, int nr, const void *a, size_t as, int na, float *y,
                                size_t ys) {
    const int64_t nb = K / KV_QK_K;
    for (int r = 0; r < nr; r += 16, pp += (size_t)nb * KV_QK4_PANEL_SB) {
        const int rows = nr - r < 16 ? nr - r : 16;
        const __mmask16 mask = (__mmask16)((1u << rows) - 1);
        for (int j = 0; j < na; j += KP_J) {
            const int J = na - j < KP_J ? na - j : KP_J;
            k4pp_tab[J - 1](pp, nb, (const uint8_t *)a + (size_t)j * as, as, y + (size_t)j * ys + (size_t)r, ys, mask,
                            na > 1);
        }
    }
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
