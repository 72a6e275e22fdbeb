/* matmul_amx.c - the batched q8_0 / q4_0 / q4_1 matmul on AMX-INT8 tiles,
 * which matmul_avx512.c's row functions call from KV_AMX_MIN_N rows on
 * where the CPU and OS give the tiles (kv_mm_amx_on).
 *
 * The arithmetic is the AVX-512 kernels', bit for bit, so a row's output
 * does not depend on the batch (or on whether this CPU has AMX): per
 * 32-element block b in order,
 *     acc = fma(float(isum_b + ioff_b), dw_b * da_b, acc)
 *     q4_1 then: acc = fma(mw_b, ds_b, acc)
 * Only isum_b, the exact integer dot of a block, comes from the tiles: one
 * tdpbssd per block multiplies 16 weight rows (tile A, 16 x 32 signed
 * bytes) by 16 activation rows (tile B, 8 rows of 16 x 4 bytes) into 16 x
 * 16 int32 sums, exact in any order. The sums go through L1 (a tile has no
 * path to the vector registers) and the float chain runs on them; four C
 * tiles rotate so later blocks' tile products are under way while a block's
 * floats run. */
#include "matmul.h"

#if defined(__x86_64__) && defined(__linux__)

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "simd_x86.h"

KV_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

/* The process-wide switch: -1 until first asked. */
static _Atomic int amx_state = -1;

int kv_mm_amx_on(void) {
    int s = atomic_load_explicit(&amx_state, memory_order_relaxed);
    if (s < 0) {
        const char *env = getenv("KVTOP_CPU_AMX");
        s = kv_cpu_amx_supported() && !(env && !strcmp(env, "0"));
        atomic_store_explicit(&amx_state, s, memory_order_relaxed);
    }
    return s;
}

int kv_mm_amx_set(int on) {
    int was = kv_mm_amx_on();
    atomic_store_explicit(&amx_state, on && kv_cpu_amx_supported(), memory_order_relaxed);
    return was;
}

/* palette 1: tiles 0, 1, 4, 5 C (16 x 64 bytes), 2 A (16 x 32), 3 B (8 x 64) */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

void kv_mm_amx_begin(void) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = c.rows[1] = c.rows[4] = c.rows[5] = 16;
    c.colsb[0] = c.colsb[1] = c.colsb[4] = c.colsb[5] = 64;
    c.rows[2] = 16;
    c.colsb[2] = KV_QK;
    c.rows[3] = KV_QK / 4;
    c.colsb[3] = 64;
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

void kv_mm_amx_end(void) { __asm__ volatile("tilerelease" ::: "memory"); }

/* C tile `c` = A (16 rows of 32 bytes at a, `as` bytes apart) x B (8 rows
 * of 64 bytes at b), stored to buf (rows 64 bytes apart). */
#define AMX_BLOCK(op, c, a, as, b, buf)                                                                           \
    __asm__ volatile("tilezero %%tmm" #c "\n\t"                                                                     \
                     "tileloadd (%0,%1,1), %%tmm2\n\t"                                                              \
                     "tileloadd (%2,%3,1), %%tmm3\n\t"                                                              \
                     #op " %%tmm3, %%tmm2, %%tmm" #c "\n\t"                                                          \
                     "tilestored %%tmm" #c ", (%4,%3,1)"                                                           \
                     :                                                                                              \
                     : "r"(a), "r"((long)(as)), "r"(b), "r"(64L), "r"(buf)                                          \
                     : "memory")

#define AI static inline __attribute__((always_inline))
#define AMX_DEPTH 4 /* C tiles (0, 1, 4, 5) in flight */
#define AMX_Q8_GROUPS 8 /* activation groups of 16 rows packed at once */

/* ---- the tiles' rows function -------------------------------------------- */

/* The tiles take q8_0 weights straight from the file: tile A is 16 weight
 * rows' block b (32 signed bytes each, a row stride apart), so nothing is
 * repacked per panel (q4: the panel's nibbles are unpacked to bytes once);
 * tile B is 16 activation rows' block b in the tiles' 4-byte-interleaved
 * order, made once per group of 16 rows (act_group_pack). C is then (weight row, activation row)
 * and the float step runs along activation rows: per weight row m,
 *     acc[m] = fma(float(isum), dw[m] * da, acc[m])
 * the same products and the same chain as the other kernels (a product of
 * two floats does not depend on their order), so the bits do not change;
 * acc is transposed once per panel and group to store y's rows. A tail
 * group (n % 16 rows) runs on the tiles with its missing rows zero. */

/* Index vectors of the 16 x 8 -> 8 x 16 dword transpose (three levels of
 * vpermt2d; see act_group_pack). */
typedef struct amx_tr_idx {
    __m512i l1[2], l2[2], l3[2];
} amx_tr_idx;

static amx_tr_idx amx_tr_index(void) {
    int32_t v[6][16];
    for (int l = 0; l < 16; l++) {
        const int c = l / 4, r = l % 4, c2 = l / 8, r8 = l % 8;
        for (int h = 0; h < 2; h++) v[h][l] = r * 8 + 4 * h + c;                          /* level 1 */
        for (int e = 0; e < 2; e++)                                                        /* level 2 */
            v[2 + e][l] = r8 < 4 ? (2 * e + c2) * 4 + r8 : 16 + (2 * e + c2) * 4 + (r8 - 4);
        for (int c1 = 0; c1 < 2; c1++) v[4 + c1][l] = l < 8 ? c1 * 8 + l : 16 + c1 * 8 + (l - 8); /* level 3 */
    }
    amx_tr_idx t;
    for (int i = 0; i < 2; i++) {
        t.l1[i] = _mm512_loadu_si512((const void *)v[i]);
        t.l2[i] = _mm512_loadu_si512((const void *)v[2 + i]);
        t.l3[i] = _mm512_loadu_si512((const void *)v[4 + i]);
    }
    return t;
}

/* The activation rows j0.. (at most 16; the rest zero) of every block into
 * dst (nb x 512 bytes): dst[b][k][jj] = dword k (elements 4k..4k+3) of row
 * j0 + jj's block b. R[jj][k] is the group's 16 x 8 dword block; level 1
 * makes A[p][h] (rows 4p..4p+3, columns 4h..4h+3, lane 4c + r), level 2
 * B[s][h][e] (rows 8s..8s+7, columns 4h+2e, 4h+2e+1, lane 8c + r), level 3
 * the columns. */
static void act_group_pack(const kv_mm_args *a, int j0, const amx_tr_idx *ix, uint8_t *dst) {
    const int64_t nb = a->K / KV_QK;
    const size_t n = (size_t)a->n;
    const int rows = (int)KV_MIN((int64_t)16, (int64_t)a->n - j0);
    __mmask16 mk[8];
    for (int i = 0; i < 8; i++)
        mk[i] = (__mmask16)((2 * i < rows ? 0x00FF : 0) | (2 * i + 1 < rows ? 0xFF00 : 0));
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *src = a->a.qs + ((size_t)b * n + (size_t)j0) * KV_QK;
        __m512i z[8], A[4][2], B[2][2][2];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) z[i] = _mm512_maskz_loadu_epi32(mk[i], src + 64 * i);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            for (int h = 0; h < 2; h++) A[p][h] = _mm512_permutex2var_epi32(z[2 * p], ix->l1[h], z[2 * p + 1]);
#pragma GCC unroll 2
        for (int sh = 0; sh < 2; sh++)
            for (int h = 0; h < 2; h++)
                for (int e = 0; e < 2; e++)
                    B[sh][h][e] = _mm512_permutex2var_epi32(A[2 * sh][h], ix->l2[e], A[2 * sh + 1][h]);
        uint8_t *o = dst + (size_t)b * 512;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++)
                for (int c = 0; c < 2; c++)
                    _mm512_store_si512((void *)(o + 64 * (4 * h + 2 * e + c)),
                                       _mm512_permutex2var_epi32(B[0][h][e], ix->l3[c], B[1][h][e]));
    }
}

/* r[i] = column i of the 16 x 16 matrix whose rows r held: four rounds of
 * the perfect shuffle (row 2i takes rows i and i + 8 zipped, first halves;
 * row 2i + 1 the second halves), which transpose 2^4 rows. */
AI void tr16x16(__m512 r[16]) {
    const __m512i zip_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i zip_hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
#pragma GCC unroll 4
    for (int round = 0; round < 4; round++) {
        __m512 z[16];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            z[2 * i] = _mm512_permutex2var_ps(r[i], zip_lo, r[i + 8]);
            z[2 * i + 1] = _mm512_permutex2var_ps(r[i], zip_hi, r[i + 8]);
        }
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) r[i] = z[i];
    }
}

/* The weight types on the tiles: q8_0's signed quants straight from the
 * file; q4's nibbles (0-15, valid signed bytes too) unpacked per panel, then
 * q4_0 adds ioff = -8 sum(q_act), q4_1 its min term. */
enum { AMX_Q8_0, AMX_Q4_0, AMX_Q4_1 };

/* A panel's weights as the tiles read them: block b of row m at
 * q + m * qs + b * qb (32 signed bytes); its scales (nb, 16) and q4_1's
 * minimums. */
typedef struct amx_panel {
    const uint8_t *q;
    size_t qs, qb;
    const float *pd, *pm;
} amx_panel;

/* Block b of the panel x the packed activations av into C tile
 * (b % AMX_DEPTH). */
AI void amx_issue(const amx_panel *p, const uint8_t *av, int64_t b, int32_t (*cbuf)[256]) {
    const uint8_t *ab = p->q + (size_t)b * p->qb;
    const uint8_t *bb = av + (size_t)b * 512;
    switch (b & 3) {
    case 0: AMX_BLOCK(tdpbssd, 0, ab, p->qs, bb, cbuf[0]); break;
    case 1: AMX_BLOCK(tdpbssd, 1, ab, p->qs, bb, cbuf[1]); break;
    case 2: AMX_BLOCK(tdpbssd, 4, ab, p->qs, bb, cbuf[2]); break;
    default: AMX_BLOCK(tdpbssd, 5, ab, p->qs, bb, cbuf[3]); break;
    }
}

/* y[j0..j0+16)[r0..r0+16) (rows past n and the panel's `rmask` not stored)
 * from the panel and group j0's packed activations av. pf: the next
 * panel's bytes to prefetch, or NULL. */
AI void amx_panel_group(const kv_mm_args *a, const amx_panel *p, const uint8_t *av, int64_t r0, __mmask16 rmask,
                        int j0, const uint8_t *pf, const int KIND) {
    const int64_t nb = a->K / KV_QK;
    const size_t n = (size_t)a->n;
    const __mmask16 jm = kv_tail16((int64_t)a->n - j0);
    const size_t pstep = pf ? (16 * a->nb1 + (size_t)nb - 1) / (size_t)nb : 0;
    int32_t cbuf[AMX_DEPTH][256] __attribute__((aligned(64)));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    /* tile sums travel through L1: blocks are issued AMX_DEPTH - 1 ahead
     * of the floats that read them */
    for (int64_t b = 0; b < nb && b < AMX_DEPTH - 1; b++) amx_issue(p, av, b, cbuf);
    for (int64_t b = 0; b < nb; b++) {
        if (b + AMX_DEPTH - 1 < nb) amx_issue(p, av, b + AMX_DEPTH - 1, cbuf);
        if (pf)
            for (size_t o = 0; o < pstep; o += 64) _mm_prefetch((const char *)pf + (size_t)b * pstep + o, _MM_HINT_T1);
        const size_t o = (size_t)b * n + (size_t)j0;
        const __m512 da = _mm512_maskz_loadu_ps(jm, a->a.d + o);
        const __m512i io = KIND == AMX_Q4_0 ? _mm512_maskz_loadu_epi32(jm, a->a.ioff + o) : _mm512_setzero_si512();
        const __m512 ds = KIND == AMX_Q4_1 ? _mm512_maskz_loadu_ps(jm, a->a.ds + o) : _mm512_setzero_ps();
        const int32_t *cs = cbuf[b & (AMX_DEPTH - 1)];
        const float *dw = p->pd + b * 16, *mw = p->pm + b * 16;
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) {
            __m512i isum = _mm512_load_si512((const void *)(cs + 16 * m));
            if (KIND == AMX_Q4_0) isum = _mm512_add_epi32(isum, io);
            const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(dw[m]), da);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[m]);
            if (KIND == AMX_Q4_1) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(mw[m]), ds, acc[m]);
        }
    }
    tr16x16(acc);
    const int left = (int)KV_MIN((int64_t)16, (int64_t)a->n - j0);
    for (int jj = 0; jj < left; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, rmask, acc[jj]);
}

/* The panel's 16 rows' block scales (f16 at wp + b * bs, rows `ws` apart)
 * as floats into pd, and q4_1's minimums (the next f16) into pm. */
static void amx_panel_scales(const uint8_t *wp, size_t ws, int64_t nb, size_t bs, float *pd, float *pm) {
    int32_t offs[16];
    for (int m = 0; m < 16; m++) offs[m] = (int32_t)((size_t)m * ws);
    const __m512i vofs = _mm512_loadu_si512((const void *)offs);
    for (int64_t b = 0; b < nb; b++) {
        const __m512i g = _mm512_i32gather_epi32(vofs, (const void *)(wp + (size_t)b * bs), 1);
        _mm512_store_ps(pd + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
        if (pm) _mm512_store_ps(pm + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
    }
}

/* q4 rows at wp (`ws` apart) as signed bytes: element i of block b of row
 * m at dst + m * K + b * 32 + i (a block's low nibbles are elements 0-15,
 * its high ones 16-31). */
static void amx_unpack_q4(const uint8_t *wp, size_t ws, int64_t nb, size_t bs, size_t qoff, uint8_t *dst) {
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    const size_t K = (size_t)nb * KV_QK;
    for (int m = 0; m < 16; m++)
        for (int64_t b = 0; b < nb; b++) {
            const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(wp + (size_t)m * ws + (size_t)b * bs + qoff));
            const __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), lo4), _mm_and_si128(x, lo4));
            _mm256_storeu_si256((__m256i *)(void *)(dst + (size_t)m * K + (size_t)b * KV_QK), v);
        }
}

/* Scratch: a panel's rows (a partial panel's copy; q4: unpacked, 16 x K
 * bytes, which is no more than a q8_0 copy), the scales and minimums, then
 * packed activation groups, as many as kv_mm_scratch_bytes(K) holds (at
 * most AMX_Q8_GROUPS). */
typedef struct amx_scratch {
    size_t tq, pd, av; /* byte offsets of the unpacked panel, the scales (then minimums), the groups */
} amx_scratch;

static amx_scratch amx_scratch_of(int64_t K) {
    const size_t nb = (size_t)(K / KV_QK);
    amx_scratch l;
    l.tq = (16 * nb * 34 + 63) & ~(size_t)63;
    l.pd = l.tq + ((16 * (size_t)K + 63) & ~(size_t)63);
    l.av = l.pd + nb * 128;
    return l;
}

static int amx_groups_fit(int64_t K) {
    const size_t nb = (size_t)(K / KV_QK), fixed = amx_scratch_of(K).av, have = kv_mm_scratch_bytes(K);
    const size_t g = have > fixed ? (have - fixed) / (nb * 512) : 0;
    return (int)KV_MAX((size_t)1, KV_MIN(g, (size_t)AMX_Q8_GROUPS));
}

AI void amx_rows(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch, const int KIND) {
    const kv_type t = a->type;
    const int64_t nb = a->K / KV_QK;
    const size_t bs = kv_mm_qblk_bytes(t), rb = (size_t)nb * bs;
    const amx_scratch l = amx_scratch_of(a->K);
    uint8_t *tw = scratch;  /* a partial panel's rows */
    uint8_t *tq = tw + l.tq; /* q4: the unpacked panel */
    float *pd = (float *)(void *)(tw + l.pd), *pm = pd + nb * 16;
    uint8_t *av = tw + l.av;
    const int groups = (a->n + 15) / 16, G = amx_groups_fit(a->K);
    const amx_tr_idx ix = amx_tr_index();
    kv_mm_amx_begin();
    for (int g0 = 0; g0 < groups; g0 += G) {
        const int g1 = KV_MIN(groups, g0 + G);
        for (int g = g0; g < g1; g++) act_group_pack(a, 16 * g, &ix, av + (size_t)(g - g0) * (size_t)nb * 512);
        for (int64_t r = r0; r < r1; r += 16) {
            const int rows = (int)KV_MIN(r1 - r, (int64_t)16);
            const uint8_t *wp = a->w + (size_t)r * a->nb1;
            size_t ws = a->nb1;
            if (rows < 16) { /* missing rows repeat row r; their lanes are not stored */
                kv_mm_copy_tile(a, r, rows, 16, rb, tw);
                wp = tw;
                ws = rb;
            }
            amx_panel_scales(wp, ws, nb, bs, pd, KIND == AMX_Q4_1 ? pm : NULL);
            amx_panel p = {wp + kv_mm_qblk_qoff(t), ws, bs, pd, pm};
            if (KIND != AMX_Q8_0) {
                amx_unpack_q4(wp, ws, nb, bs, kv_mm_qblk_qoff(t), tq);
                p = (amx_panel){tq, (size_t)a->K, KV_QK, pd, pm};
            }
            const uint8_t *pf = r + 32 <= r1 ? a->w + (size_t)(r + 16) * a->nb1 : NULL;
            for (int g = g0; g < g1; g++)
                amx_panel_group(a, &p, av + (size_t)(g - g0) * (size_t)nb * 512, r, kv_tail16(rows), 16 * g,
                                g == g0 ? pf : NULL, KIND);
        }
    }
    kv_mm_amx_end();
}

void kv_mm_amx_rows(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {
    if (a->type == KV_TYPE_Q8_0)
        amx_rows(a, r0, r1, scratch, AMX_Q8_0);
    else if (a->type == KV_TYPE_Q4_0)
        amx_rows(a, r0, r1, scratch, AMX_Q4_0);
    else
        amx_rows(a, r0, r1, scratch, AMX_Q4_1);
}

KV_SIMD_TARGET_END

#else

int kv_mm_amx_on(void) { return 0; }
int kv_mm_amx_set(int on) {
    (void)on;
    return 0;
}

#endif
