/* matmul_avx512.c - AVX-512 matmul kernels for the quantized weights
 * (F/BW/VL/DQ + VNNI; float weights: matmul_f_avx512.c), compiled for that
 * target with function attributes so the same binary still runs on older
 * x86-64 (the driver calls them only when the CPU has the features).
 *
 * Two shapes of kernel, one arithmetic. Every output y[j][r] is the same
 * chain of fp32 operations whichever kernel runs, so a row's result does not
 * depend on the batch it came in (batch invariance): per 32-element block b
 * in order,
 *     acc = fma(float(isum_b + ioff_b), dw_b * da_b, acc)
 *     q4_1 then: acc = fma(mw_b, ds_b, acc)
 *   (isum_b is the exact integer dot; the order of integer adds is free).
 *  - direct (n < KV_MM_PACK_MIN_N, decode): tiles of 16 weight rows, one row
 *    per lane, read straight from the file mapping while a later tile is
 *    prefetched; per block, the 16 rows' dots come from 256/512-bit
 *    vpdpbusd plus an integer reduction tree. Memory-bound by design.
 *  - packed (batched n): a panel of 16 weight rows is repacked once per call
 *    into per-thread scratch (one zmm holds the same 4 elements of all 16
 *    rows) while the next panel is prefetched. The inner loop broadcasts 4
 *    activation bytes per vpdpbusd and keeps 12 activation rows'
 *    accumulators in registers: every weight byte loaded feeds 12
 *    activation rows, compute-bound. Where the CPU has AMX-INT8 tiles,
 *    n >= KV_AMX_MIN_N(type) goes to matmul_amx.c instead (same arithmetic).
 * Quantized weights are made unsigned for vpdpbusd (q8_0: w ^ 0x80, q4:
 * the raw nibble, q5_0: nibble + 16 * fifth bit) and the zero point comes
 * back through the per-block correction -zp * sum(q_act) (kv_q8a.ioff),
 * exact in integers. q5_0 runs q4_0's kernels with the fifth bits added to
 * the unpacked nibbles; it has no AMX path (the VNNI panels serve it). */
#include "matmul.h"

#if defined(__x86_64__) || defined(__i386__)

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd_x86.h"

KV_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include "simd_avx512.h"

#define KV_AI static inline __attribute__((always_inline))

/* n at which the AMX tiles take over (matmul_amx.c, the same arithmetic;
 * tools/amx_ab): q8_0 from 8 rows (a group of 16 with its missing rows
 * zero beats the VNNI panel kernel at 6-8), q4 from 32 (its panel's
 * nibbles are unpacked first: 0.7x at 8 rows, ~1.0x at 16); and at which
 * the packed kernels take over from the direct ones. */
#define KV_AMX_MIN_N(t) ((t) == KV_TYPE_Q8_0 ? 8 : (t) == KV_TYPE_Q5_0 ? INT32_MAX : 32)
#define KV_PACK_MIN_Q KV_MM_PACK_MIN_N
/* Direct tiles prefetch the tile this many tiles ahead (quantized, float),
 * into L2. NOTE: measured single-thread on cold weights (Zen 4): quantized
 * tiles (4-13 KB) gain 10-30% from 2 ahead over 1, 4 or 8 gain nothing
 * more; float tiles (16 rows x K floats) run at streaming speed with 1
 * ahead and lose a little with 2; prefetching into L1 instead loses 40%. */
#define KV_PF_AHEAD_Q 2
#define KV_PF_AHEAD_F 1
#define KV_PF_HINT _MM_HINT_T1

/* ---- activation quantizer ------------------------------------------------ */

void kv_q8a_row_avx512(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                       int zp) {
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < K / KV_QK; b++) {
        size_t o = (size_t)b * bstride;
        __m512 v0 = _mm512_loadu_ps(x + b * KV_QK), v1 = _mm512_loadu_ps(x + b * KV_QK + 16);
        /* max_ps returns its second operand when one is NaN: NaN lanes are
         * skipped, as in the scalar reference */
        __m512 m = _mm512_max_ps(_mm512_and_ps(v1, absmask), _mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_setzero_ps()));
        float amax = _mm512_reduce_max_ps(m);
        __mmask16 bad = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)(void *)(qs + o * KV_QK), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(void *)(qs + o * KV_QK + 16), _mm512_cvtsepi32_epi8(q1));
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        kv_q8a_put(d, ioff, ds, o, db, sum, bad || isinf(amax), zp);
    }
}

/* ---- helpers ------------------------------------------------------------- */



/* Transposes the 4x4 blocks of 32-bit elements that v[4g..4g+3] hold in
 * each 128-bit lane, g < G: the first steps of pack_q's regrouping. */
KV_AI void tr4x4_lanes(__m512 *v, const int G) {
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        __m512 *r = v + 4 * g;
        const __m512 t0 = _mm512_unpacklo_ps(r[0], r[1]), t1 = _mm512_unpackhi_ps(r[0], r[1]);
        const __m512 t2 = _mm512_unpacklo_ps(r[2], r[3]), t3 = _mm512_unpackhi_ps(r[2], r[3]);
        r[0] = _mm512_shuffle_ps(t0, t2, 0x44);
        r[1] = _mm512_shuffle_ps(t0, t2, 0xEE);
        r[2] = _mm512_shuffle_ps(t1, t3, 0x44);
        r[3] = _mm512_shuffle_ps(t1, t3, 0xEE);
    }
}

/* ---- packed quantized panels (batched n) -------------------------------- */

/* Prefetches the next panel's bytes [lo, hi) a slice per packing step:
 * the 16 short row streams a panel read makes are too short for the
 * hardware prefetcher to lock on, so DRAM latency would stall the packer. */
typedef struct pf_cursor {
    const char *p, *end; /* next line to prefetch, end of the next panel */
    size_t step;         /* bytes per packing step */
} pf_cursor;

KV_AI void pf_init(pf_cursor *c, const kv_mm_args *a, int64_t next_r, int64_t steps) {
    int64_t rows = KV_MIN(a->M - next_r, (int64_t)KV_MM_PANEL);
    c->p = (const char *)a->w + (size_t)next_r * a->nb1;
    c->end = rows > 0 ? c->p + (size_t)rows * a->nb1 : c->p;
    c->step = rows > 0 ? ((size_t)rows * a->nb1 + (size_t)steps - 1) / (size_t)steps : 0;
}

KV_AI void pf_step(pf_cursor *c) {
    const char *stop = c->p + c->step;
    if (stop > c->end) stop = c->end;
    for (; c->p < stop; c->p += 64) _mm_prefetch(c->p, KV_PF_HINT);
}

/* The prefetch plan of a direct tile: the rows of a later tile, a slice
 * per step of this one (no cursor in memory: the decode loops are short). */
typedef struct pf_plan {
    const char *base; /* the later tile's first byte; NULL: nothing to fetch */
    size_t step;      /* bytes per step */
    int lines;        /* cache lines per step */
} pf_plan;

KV_AI pf_plan pf_plan_for(const kv_mm_args *a, int64_t next_r, int64_t steps) {
    pf_plan p = {NULL, 0, 0};
    int64_t rows = KV_MIN(a->M - next_r, (int64_t)KV_MM_PANEL);
    if (rows <= 0 || steps <= 0) return p;
    p.base = (const char *)a->w + (size_t)next_r * a->nb1;
    p.step = ((size_t)rows * a->nb1 + (size_t)steps - 1) / (size_t)steps;
    p.lines = (int)((p.step + 63) / 64);
    return p;
}

KV_AI void pf_slice(const pf_plan *p, int64_t s) {
    if (!p->base) return;
    const char *q = p->base + (size_t)s * p->step;
    for (int i = 0; i < p->lines; i++) _mm_prefetch(q + 64 * i, KV_PF_HINT);
}

/* Rows i and i+8 of a panel as one zmm of unsigned quants: 256-bit half 0
 * = row i's 32 elements, half 1 = row i+8's. */
KV_AI __m512i q_pair(kv_type t, const uint8_t *lo, const uint8_t *hi) {
    if (t == KV_TYPE_Q8_0) {
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(lo + 2))),
                                       _mm256_loadu_si256((const __m256i *)(const void *)(hi + 2)), 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    size_t qo = kv_mm_qblk_qoff(t);
    __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(lo + qo)))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(hi + qo))), 1);
    /* 128-bit lanes 1 and 3 take the high nibbles */
    v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    v = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
    if (t == KV_TYPE_Q5_0) /* byte k < 32: element k of row lo; the rest: row hi's */
        v = _mm512_mask_add_epi8(v, _cvtu64_mask64((uint64_t)kv_mm_q5_qh(lo) | (uint64_t)kv_mm_q5_qh(hi) << 32), v,
                                 _mm512_set1_epi8(0x10));
    return v;
}

/* Packs rows r0..r0+rows (rows <= 16) into pq (nb, 8 groups, 16 rows, 4
 * bytes: zmm g holds elements 4g..4g+3 of every row), pd (nb, 16) scales and
 * pm (nb, 16) minimums (q4_1). Missing rows repeat row r0: their lanes are
 * masked off when y is stored. */
static void pack_q(const kv_mm_args *a, kv_type t, int64_t r0, int rows, uint8_t *pq, float *pd, float *pm) {
    const int64_t nb = a->K / KV_QK;
    const size_t bs = kv_mm_qblk_bytes(t);
    const uint8_t *base[16];
    for (int rr = 0; rr < 16; rr++) base[rr] = a->w + (size_t)(r0 + (rr < rows ? rr : 0)) * a->nb1;
    /* byte offsets of the 16 rows from row r0, for the scale gather */
    int32_t offs[16];
    for (int rr = 0; rr < 16; rr++) offs[rr] = (int32_t)(base[rr] - base[0]);
    const __m512i vofs = _mm512_loadu_si512((const void *)offs);
    const __m512i lo_idx = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    const __m512i hi_idx = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    pf_cursor pc;
    pf_init(&pc, a, r0 + KV_MM_PANEL, nb);
    for (int64_t b = 0; b < nb; b++) {
        size_t bo = (size_t)b * bs;
        pf_step(&pc);
        __m512 z[8];
        __m512i u[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) z[i] = _mm512_castsi512_ps(q_pair(t, base[i] + bo, base[i + 8] + bo));
        /* 8x8 dword transpose inside each 256-bit half: 4x4 inside lanes, then
         * the permutes below */
        tr4x4_lanes(z, 2);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) u[i] = _mm512_castps_si512(z[i]);
        /* u[c] (rows 0-3 | 8-11) and u[4+c] (rows 4-7 | 12-15) hold columns
         * c (128-bit lanes 0, 2) and c+4 (lanes 1, 3) */
        uint8_t *pb = pq + (size_t)b * 512;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            _mm512_store_si512((void *)(pb + c * 64), _mm512_permutex2var_epi64(u[c], lo_idx, u[4 + c]));
            _mm512_store_si512((void *)(pb + (c + 4) * 64), _mm512_permutex2var_epi64(u[c], hi_idx, u[4 + c]));
        }
        __m512i g = _mm512_i32gather_epi32(vofs, (const void *)(base[0] + bo), 1);
        _mm512_store_ps(pd + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
        if (t == KV_TYPE_Q4_1)
            _mm512_store_ps(pm + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
    }
}

/* One block of one activation row against 16 weight rows, wg[g] = their
 * elements 4g..4g+3 (unsigned): acc = fma(float(isum + ioff), dw * da,
 * acc), the step every panel kernel takes (the integer part's order is
 * free; q4_1 adds its min term after). */
KV_AI __m512 q_block_acc(__m512 acc, const __m512i wg[8], __m512 dw, const int8_t *ap, float da, int32_t ioff,
                         const int fold) {
    /* two chains: even groups onto the zero-point correction, odd ones onto 0 */
    __m512i s[2] = {_mm512_set1_epi32(ioff), _mm512_setzero_si512()};
    /* fold: the register block has several activation rows (kv_dpbusd_b512) */
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) s[g & 1] = kv_dpbusd_b512(s[g & 1], wg[g], ap + 4 * g, fold);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s[0], s[1])), _mm512_mul_ps(dw, _mm512_set1_ps(da)), acc);
}

/* The activation rows j0.. of a panel kernel at its current block. */
typedef struct q8a_cur {
    const int8_t *aq;
    const float *ad, *ads;
    const int32_t *io;
} q8a_cur;

KV_AI q8a_cur q8a_at(const kv_mm_args *a, int j0) {
    return (q8a_cur){a->a.qs + (size_t)j0 * KV_QK, a->a.d + j0, a->a.ds + j0, a->a.ioff + j0};
}

KV_AI void q8a_next(q8a_cur *c, size_t n) {
    c->aq += n * KV_QK;
    c->ad += n;
    c->ads += n;
    c->io += n;
}

/* One block of J activation rows into acc, the step every panel kernel
 * takes: q_block_acc with the zero point, or for q4_1 without it and then
 * the min term fma(m, sum(a), acc). */
KV_AI void q_rows_step(__m512 *acc, const int J, kv_type t, const __m512i wg[8], __m512 dw, __m512 mw,
                       const q8a_cur *c) {
#pragma GCC unroll 12
    for (int jj = 0; jj < J; jj++) {
        acc[jj] = q_block_acc(acc[jj], wg, dw, c->aq + jj * KV_QK, c->ad[jj], t == KV_TYPE_Q4_1 ? 0 : c->io[jj],
                              J > 1);
        if (t == KV_TYPE_Q4_1) acc[jj] = _mm512_fmadd_ps(mw, _mm512_set1_ps(c->ads[jj]), acc[jj]);
    }
}

/* y[j0..j0+J][r0..r0+16) from a packed panel. */
KV_AI void qp_kernel(const kv_mm_args *a, kv_type t, const uint8_t *pq, const float *pd, const float *pm, int64_t r0,
                     __mmask16 mask, int j0, const int J) {
    const int64_t nb = a->K / KV_QK;
    const size_t n = (size_t)a->n;
    __m512 acc[12];
#pragma GCC unroll 12
    for (int jj = 0; jj < J; jj++) acc[jj] = _mm512_setzero_ps();
    q8a_cur c = q8a_at(a, j0);
    for (int64_t b = 0; b < nb; b++, q8a_next(&c, n)) {
        const uint8_t *pb = pq + (size_t)b * 512;
        __m512i wg[8]; /* group g: elements 4g..4g+3 of the 16 rows */
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) wg[g] = _mm512_load_si512((const void *)(pb + g * 64));
        __m512 dw = _mm512_load_ps(pd + b * 16);
        __m512 mw = t == KV_TYPE_Q4_1 ? _mm512_load_ps(pm + b * 16) : _mm512_setzero_ps();
        q_rows_step(acc, J, t, wg, dw, mw, &c);
    }
#pragma GCC unroll 12
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, mask, acc[jj]);
}

/* Runs K(j0, J) over n activation rows in register blocks of 12, then 8,
 * 4 and the rest (J a constant in each call): the panel kernels' split. */
#define Q_J_SPLIT(n, K)                                                                                                \
    do {                                                                                                               \
        int j0_ = 0;                                                                                                   \
        for (; j0_ + 12 <= (n); j0_ += 12) K(j0_, 12);                                                                 \
        int left_ = (n) - j0_;                                                                                         \
        if (left_ >= 8) {                                                                                              \
            K(j0_, 8);                                                                                                 \
            j0_ += 8;                                                                                                  \
            left_ -= 8;                                                                                                \
        }                                                                                                              \
        if (left_ >= 4) {                                                                                              \
            K(j0_, 4);                                                                                                 \
            j0_ += 4;                                                                                                  \
            left_ -= 4;                                                                                                \
        }                                                                                                              \
        switch (left_) {                                                                                               \
        case 3: K(j0_, 3); break;                                                                                      \
        case 2: K(j0_, 2); break;                                                                                      \
        case 1: K(j0_, 1); break;                                                                                      \
        default: break;                                                                                                \
        }                                                                                                              \
    } while (0)

#define QP_CALL(j0, J) qp_kernel(a, ty_, pq, pd, pm, r0, mask, j0, J)
#define QP_FN(t)                                                                                                       \
    static void qp_##t(const kv_mm_args *a, const uint8_t *pq, const float *pd, const float *pm, int64_t r0,           \
                       __mmask16 mask) {                                                                               \
        const kv_type ty_ = t;                                                                                         \
        Q_J_SPLIT(a->n, QP_CALL);                                                                                      \
    }
QP_FN(KV_TYPE_Q8_0)
QP_FN(KV_TYPE_Q4_0)
QP_FN(KV_TYPE_Q4_1)
QP_FN(KV_TYPE_Q5_0)
#undef QP_CALL

typedef void (*qp_fn)(const kv_mm_args *a, const uint8_t *pq, const float *pd, const float *pm, int64_t r0, __mmask16 mask);

static void q_packed(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, void *scratch, qp_fn f) {
    const int64_t nb = a->K / KV_QK;
    uint8_t *pq = scratch;                                   /* nb * 512 bytes */
    float *pd = (float *)(void *)(pq + (size_t)nb * 512);    /* nb * 16 */
    float *pm = pd + nb * 16;                                /* nb * 16 */
    for (int64_t r = r0; r < r1; r += KV_MM_PANEL) {
        int rows = (int)KV_MIN(r1 - r, KV_MM_PANEL);
        pack_q(a, t, r, rows, pq, pd, pm);
        f(a, pq, pd, pm, r, kv_tail16(rows));
    }
}

/* ---- pre-packed panels (kv_mm_panels_pack), any n ------------------------ */

/* y[j0..j0+J][r0..r0+16) from panel pp: qp_kernel's loop and arithmetic
 * (the same chain per output, so the same bits), the quants, fp16 scales
 * and q5_0's fifth-bit masks read in place, in the order they are stored
 * (one sequential stream: at n = 1 the hardware prefetcher keeps up with
 * it, see kv_mm_panel_pair; with more rows see KV_PP_AHEAD). */
KV_AI void qpp_kernel(const kv_mm_args *a, kv_type t, const uint8_t *pp, int64_t r0, __mmask16 mask, int j0,
                      const int J) {
    const int64_t nb = a->K / KV_QK;
    const size_t n = (size_t)a->n, hb = kv_mm_panel_hblock(t), qb = kv_mm_panel_qblock(t), pair = 2 * (hb + qb);
    __m512 acc[12];
#pragma GCC unroll 12
    for (int jj = 0; jj < J; jj++) acc[jj] = _mm512_setzero_ps();
    q8a_cur c = q8a_at(a, j0);
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++, q8a_next(&c, n)) {
        /* kv_mm_panel_hoff / _qoff, with the pair's base kept in step */
        const uint8_t *base = pp + (size_t)(b >> 1) * pair;
        const uint8_t *hd = base + (size_t)(b & 1) * hb, *pb = base + 2 * hb + (size_t)(b & 1) * qb;
        if (n > 1 && (b & 1) == 0) /* see KV_PP_AHEAD; a prefetch never faults */
            for (size_t l = 0; l < pair; l += 64) _mm_prefetch((const char *)(base + KV_PP_AHEAD + l), KV_PF_HINT);
        __m512i wg[8];
        if (t == KV_TYPE_Q8_0) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) wg[g] = _mm512_load_si512((const void *)(pb + g * 64));
        } else {
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i v = _mm512_load_si512((const void *)(pb + g * 64));
                wg[g] = _mm512_and_si512(v, nib);
                wg[g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            }
            if (t == KV_TYPE_Q5_0) {
#pragma GCC unroll 8
                for (int g = 0; g < 8; g++) {
                    uint64_t m;
                    __builtin_memcpy(&m, hd + 32 + 8 * g, 8);
                    wg[g] = _mm512_mask_add_epi8(wg[g], _cvtu64_mask64(m), wg[g], _mm512_set1_epi8(0x10));
                }
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)hd));
        const __m512 mw = t == KV_TYPE_Q4_1 ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)(hd + 32)))
                                            : _mm512_setzero_ps();
        q_rows_step(acc, J, t, wg, dw, mw, &c);
    }
#pragma GCC unroll 12
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, mask, acc[jj]);
}

KV_AI void q_prepacked(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1) {
    const size_t pstride = kv_mm_panel_stride(t, a->K / KV_QK);
    for (int64_t r = r0; r < r1; r += KV_MM_PANEL) { /* r0 is a multiple of 16 (the driver's chunks) */
        const uint8_t *pp = a->wp + (size_t)(r / KV_MM_PANEL) * pstride;
        const __mmask16 mask = kv_tail16((int)KV_MIN(r1 - r, KV_MM_PANEL));
#define QPP_CALL(j0, J) qpp_kernel(a, t, pp, r, mask, j0, J)
        Q_J_SPLIT(a->n, QPP_CALL);
#undef QPP_CALL
    }
}

/* ---- direct quantized tiles (small n) ------------------------------------ */

/* Decode reads every weight byte once for one or two activation rows, so
 * nothing is repacked: a tile of 16 weight rows is read in place, block by
 * block, and each block's 16 row dots are formed with 256/512-bit vpdpbusd
 * and reduced exactly (integer adds) to one lane per row. From there the
 * float arithmetic is qp_kernel's, lane for lane: per block
 *   acc = fma(float(isum + ioff), dw * da, acc)  [q4_1: acc = fma(mw, ds, acc)]
 * so a row's output does not depend on whether this kernel or the packed
 * one ran, i.e. on how many rows were in the batch (batch invariance). */

/* q8_0: s[i] holds one block of two rows in its 256-bit halves, 8 dword
 * partial sums each: rows (i, i+4) for i < 4, (i+4, i+8) for i >= 4. An
 * unpack/add tree adds them up and its last step leaves row r in lane r. */
KV_AI __m512i q8_reduce(const __m512i s[8]) {
    __m512i b[4], c[2];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        b[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2 * k], s[2 * k + 1]), _mm512_unpackhi_epi32(s[2 * k], s[2 * k + 1]));
#pragma GCC unroll 2
    for (int m = 0; m < 2; m++)
        c[m] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[2 * m], b[2 * m + 1]), _mm512_unpackhi_epi64(b[2 * m], b[2 * m + 1]));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* q4: s[i] holds rows (i, i+4, i+8, i+12) in its 128-bit lanes, 4 dword
 * partial sums each; the tree leaves row r in lane r. */
KV_AI __m512i q4_reduce(const __m512i s[4]) {
    __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
    __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/* Word permutes that gather fields of 16 rows: level 1 merges two rows'
 * 64-byte loads, each later level two outputs of the one before, until
 * every field item (block k, field f) holds its 16 rows in row order.
 * G: blocks per load, F: fields per block (1: d; 2: d and m), s: words per
 * block. Returns the index vector of level lv (1-4), output half h (levels
 * 3-4 with G * F = 8 items). */
static __m512i qs_index(int lv, int h, int G, int F, int s) {
    uint16_t ix[32];
    for (int j = 0; j < 32; j++) {
        int v = 0;
        if (lv == 1) { /* (item, row of 2): item k*F+f at word k*s+f */
            int item = j / 2, src = j % 2;
            if (item < G * F) v = (item / F) * s + item % F + 32 * src;
        } else if (lv == 2) { /* (item, row of 4) */
            int item = j / 4, rr = j % 4;
            if (item < G * F) v = item * 2 + rr % 2 + 32 * (rr / 2);
        } else if (lv == 3) { /* (item, row of 8); F = 2 splits items 0-3 | 4-7 */
            int item = j / 8 + 4 * h, rr = j % 8;
            v = item * 4 + rr % 4 + 32 * (rr / 4);
        } else { /* (item, row of 16), two items per output */
            int item = j / 16 + 2 * h, rr = j % 16;
            v = item * 8 + rr % 8 + 32 * (rr / 8);
        }
        ix[j] = (uint16_t)v;
    }
    return _mm512_loadu_si512((const void *)ix);
}

/* The index vectors of qd_scales' permute tree, built once per call. */
typedef struct qs_perm {
    __m512i i1, i2, i30, i31, i40, i41;
} qs_perm;

static qs_perm qs_perm_for(kv_type t) {
    const int G = t == KV_TYPE_Q8_0 || t == KV_TYPE_Q5_0 ? 2 : 4, F = t == KV_TYPE_Q4_1 ? 2 : 1, s = (int)kv_mm_qblk_bytes(t) / 2;
    qs_perm p = {qs_index(1, 0, G, F, s), qs_index(2, 0, G, F, s), qs_index(3, 0, G, F, s),
                 qs_index(3, 1, G, F, s), qs_index(4, 0, G, F, s), qs_index(4, 1, G, F, s)};
    return p;
}

/* The fp16 scale words of a 16-row tile, block-major: sc[b * SW + i] = d of
 * block b, row i; q4_1 adds m at sc[b * SW + 16 + i] (SW = 16, q4_1 32).
 * One 64-byte load per row covers the headers of 4 blocks (q4) or 2 (q8_0,
 * 34-byte blocks), and a tree of word permutes regroups them: 16 per 4
 * blocks (q4_1: 20), 15 per 2 blocks (q8_0). NOTE: a 16-lane gather per
 * block cost about 30% of the decode tile on Zen 4, scalar loads and stores
 * (2 memory operations per row and block) about 25%. */
/* Levels 1 and 2 of the tree: the 64-byte loads (lanes outside m zero) at
 * byte off of the 16 rows into q[4], items of 4 rows each. */
KV_AI void qs_gather(const uint8_t *w, size_t ws, size_t off, __mmask64 m, const qs_perm *ix, __m512i q[4]) {
    __m512i p[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        p[i] = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(m, w + (size_t)(2 * i) * ws + off), ix->i1,
                                         _mm512_maskz_loadu_epi8(m, w + (size_t)(2 * i + 1) * ws + off));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) q[i] = _mm512_permutex2var_epi16(p[2 * i], ix->i2, p[2 * i + 1]);
}

KV_AI void qd_scales(kv_type t, const uint8_t *w, size_t ws, int64_t nb, const qs_perm *ix, uint16_t *sc) {
    const size_t bs = kv_mm_qblk_bytes(t);
    const __m512i i30 = ix->i30, i31 = ix->i31, i40 = ix->i40, i41 = ix->i41;
    if (t == KV_TYPE_Q8_0 || t == KV_TYPE_Q5_0) { /* 2 blocks' d per 64-byte load; 15 permutes */
        for (int64_t b = 0; b < nb; b += 2) {
            /* load only the row's bytes (q5_0's 2 blocks are 44) */
            const size_t left = (size_t)(nb - b) * bs;
            __mmask64 m = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
            __m512i q[4];
            qs_gather(w, ws, (size_t)b * bs, m, ix, q);
            __m512i r0 = _mm512_permutex2var_epi16(q[0], i30, q[1]), r1 = _mm512_permutex2var_epi16(q[2], i30, q[3]);
            _mm512_storeu_si512((void *)(sc + (size_t)b * 16), _mm512_permutex2var_epi16(r0, i40, r1));
        }
        return;
    }
    const int F = t == KV_TYPE_Q4_1 ? 2 : 1;
    for (int64_t b = 0; b < nb; b += 4) {
        /* the last group may hold fewer than 4 blocks: load only its bytes */
        __mmask64 m = nb - b >= 4 ? ~(__mmask64)0 : (((__mmask64)1 << ((size_t)(nb - b) * bs)) - 1);
        __m512i q[4];
        qs_gather(w, ws, (size_t)b * bs, m, ix, q);
        uint16_t *o = sc + (size_t)b * (size_t)(16 * F);
        if (F == 1) {
            __m512i r0 = _mm512_permutex2var_epi16(q[0], i30, q[1]), r1 = _mm512_permutex2var_epi16(q[2], i30, q[3]);
            _mm512_storeu_si512((void *)o, _mm512_permutex2var_epi16(r0, i40, r1));
            _mm512_storeu_si512((void *)(o + 32), _mm512_permutex2var_epi16(r0, i41, r1));
        } else {
            __m512i r00 = _mm512_permutex2var_epi16(q[0], i30, q[1]), r01 = _mm512_permutex2var_epi16(q[0], i31, q[1]);
            __m512i r10 = _mm512_permutex2var_epi16(q[2], i30, q[3]), r11 = _mm512_permutex2var_epi16(q[2], i31, q[3]);
            _mm512_storeu_si512((void *)o, _mm512_permutex2var_epi16(r00, i40, r10));
            _mm512_storeu_si512((void *)(o + 32), _mm512_permutex2var_epi16(r00, i41, r10));
            _mm512_storeu_si512((void *)(o + 64), _mm512_permutex2var_epi16(r01, i40, r11));
            _mm512_storeu_si512((void *)(o + 96), _mm512_permutex2var_epi16(r01, i41, r11));
        }
    }
}

/* 16 rows (row i at w + i * ws) against activation rows j0..j0+J (J <= 2),
 * stored to y rows r0.. under mask; sc: the tile's scales (qd_scales). */
KV_AI void qd16(const kv_mm_args *a, kv_type t, const uint8_t *w, size_t ws, const uint16_t *sc, int64_t r0,
                __mmask16 mask, int j0, const int J, const pf_plan *pf) {
    const int64_t nb = a->K / KV_QK;
    const size_t bs = kv_mm_qblk_bytes(t), n = (size_t)a->n;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const int8_t *aq = a->a.qs + (size_t)j0 * KV_QK;
    const float *ad = a->a.d + j0, *ads = a->a.ds + j0;
    const int32_t *io = a->a.ioff + j0;
    /* rows 0, 4, 8 and 12 of the tile at the current block's quants */
    const uint8_t *q0 = w + kv_mm_qblk_qoff(t), *q4 = q0 + 4 * ws, *q8 = q0 + 8 * ws, *q12 = q0 + 12 * ws;
    const int sw = t == KV_TYPE_Q4_1 ? 32 : 16; /* scale words per block */
    for (int64_t b = 0; b < nb; b++, aq += n * KV_QK, ad += n, ads += n, io += n, sc += sw) {
        pf_slice(pf, b);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)sc));
        __m512i isum[2];
        if (t == KV_TYPE_Q8_0) {
            __m512i v[8];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m256i l = _mm256_loadu_si256((const __m256i *)(const void *)(q0 + i * ws));
                __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(q4 + i * ws));
                v[i] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1), _mm512_set1_epi8((char)0x80));
                l = _mm256_loadu_si256((const __m256i *)(const void *)(q8 + i * ws));
                h = _mm256_loadu_si256((const __m256i *)(const void *)(q12 + i * ws));
                v[4 + i] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1), _mm512_set1_epi8((char)0x80));
            }
#pragma GCC unroll 2
            for (int jj = 0; jj < J; jj++) {
                __m512i av = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(aq + jj * KV_QK)));
                __m512i s[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) s[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[i], av);
                isum[jj] = _mm512_add_epi32(q8_reduce(s), _mm512_set1_epi32(io[jj]));
            }
        } else {
            __m512i lo[4], hi[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(q0 + i * ws)));
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(q4 + i * ws)), 1);
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(q8 + i * ws)), 2);
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(q12 + i * ws)), 3);
                lo[i] = _mm512_and_si512(v, nib);
                hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                if (t == KV_TYPE_Q5_0) {
                    /* qh of rows i, i+4, i+8, i+12 (4 bytes before their
                     * nibbles); their low halves mark lo[i]'s bytes, one
                     * 16-bit word a 128-bit lane, the high halves hi[i]'s */
                    __m128i h = _mm_cvtsi32_si128((int)kv_mm_q5_qh(q0 + i * ws - 6));
                    h = _mm_insert_epi32(h, (int)kv_mm_q5_qh(q4 + i * ws - 6), 1);
                    h = _mm_insert_epi32(h, (int)kv_mm_q5_qh(q8 + i * ws - 6), 2);
                    h = _mm_insert_epi32(h, (int)kv_mm_q5_qh(q12 + i * ws - 6), 3);
                    h = _mm_shuffle_epi8(h, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
                    const __m512i b5 = _mm512_set1_epi8(0x10);
                    lo[i] = _mm512_mask_add_epi8(lo[i], _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(h)), lo[i], b5);
                    hi[i] = _mm512_mask_add_epi8(hi[i], _cvtu64_mask64((uint64_t)_mm_extract_epi64(h, 1)), hi[i], b5);
                }
            }
#pragma GCC unroll 2
            for (int jj = 0; jj < J; jj++) {
                __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(aq + jj * KV_QK)));
                __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(aq + jj * KV_QK + 16)));
                __m512i s[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    s[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], alo), hi[i], ahi);
                isum[jj] = q4_reduce(s);
                if (t == KV_TYPE_Q4_0 || t == KV_TYPE_Q5_0) isum[jj] = _mm512_add_epi32(isum[jj], _mm512_set1_epi32(io[jj]));
            }
        }
        q0 += bs;
        q4 += bs;
        q8 += bs;
        q12 += bs;
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) {
            acc[jj] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[jj]), _mm512_mul_ps(dw, _mm512_set1_ps(ad[jj])), acc[jj]);
            if (t == KV_TYPE_Q4_1)
                acc[jj] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(sc + 16))),
                                          _mm512_set1_ps(ads[jj]), acc[jj]);
        }
    }
#pragma GCC unroll 2
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, mask, acc[jj]);
}

typedef void (*qd_fn)(const kv_mm_args *a, const uint8_t *w, size_t ws, const qs_perm *ix, uint16_t *sc, int64_t r0,
                      __mmask16 mask, const pf_plan *pf);

static void q_direct(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, void *scratch, qd_fn f) {
    const int64_t nb = a->K / KV_QK;
    const size_t rb = (size_t)nb * kv_mm_qblk_bytes(t); /* bytes of a row's blocks */
    uint8_t *tw = scratch;                                                    /* (16, rb) a partial tile */
    uint16_t *sc = (uint16_t *)(void *)(tw + (((size_t)KV_MM_PANEL * rb + 63) & ~(size_t)63)); /* (nb + 3, 32) */
    const qs_perm ix = qs_perm_for(t);
    int64_t r = r0;
    for (; r + KV_MM_PANEL <= r1; r += KV_MM_PANEL) {
        /* a later tile streams in (to L2) while this one is computed */
        pf_plan pf = pf_plan_for(a, r + KV_PF_AHEAD_Q * KV_MM_PANEL, nb);
        f(a, a->w + (size_t)r * a->nb1, a->nb1, &ix, sc, r, 0xFFFF, &pf);
    }
    if (r < r1) {
        /* a partial tile: its rows copied to scratch, missing rows repeat
         * the first (their lanes are masked off when y is stored) */
        int rows = (int)(r1 - r);
        kv_mm_copy_tile(a, r, rows, KV_MM_PANEL, rb, tw);
        pf_plan pf = pf_plan_for(a, a->M, nb); /* nothing left to prefetch */
        f(a, tw, rb, &ix, sc, r, kv_tail16(rows), &pf);
    }
}

#define QD_FN(t)                                                                                                       \
    static void qd_##t(const kv_mm_args *a, const uint8_t *w, size_t ws, const qs_perm *ix, uint16_t *sc,            \
                       int64_t r0, __mmask16 mask, const pf_plan *pf) {                                                \
        qd_scales(t, w, ws, a->K / KV_QK, ix, sc);                                                                     \
        int j0 = 0;                                                                                                    \
        for (; j0 + 2 <= a->n; j0 += 2) qd16(a, t, w, ws, sc, r0, mask, j0, 2, pf);                                   \
        if (j0 < a->n) qd16(a, t, w, ws, sc, r0, mask, j0, 1, pf);                                                     \
    }                                                                                                                  \
    static void rows_##t(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {                                 \
        if (a->n >= KV_AMX_MIN_N(t) && kv_mm_amx_on())                                                                 \
            kv_mm_amx_rows(a, r0, r1, scratch);                                                                        \
        else if (a->wp && (r0 % KV_MM_PANEL) == 0)                                                                     \
            q_prepacked(a, t, r0, r1);                                                                                 \
        else if (a->n >= KV_PACK_MIN_Q)                                                                                \
            q_packed(a, t, r0, r1, scratch, qp_##t);                                                                   \
        else                                                                                                           \
            q_direct(a, t, r0, r1, scratch, qd_##t);                                                                   \
    }
QD_FN(KV_TYPE_Q8_0)
QD_FN(KV_TYPE_Q4_0)
QD_FN(KV_TYPE_Q4_1)
QD_FN(KV_TYPE_Q5_0)

/* ---- float weights: matmul_f_avx512.c -------------------------------------- */

#define F_FN(t)                                                                                                        \
    static void rows_##t(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {                                 \
        kv_mm_frows_avx512(a, r0, r1, scratch);                                                                        \
    }
F_FN(KV_TYPE_F32)
F_FN(KV_TYPE_F16)
F_FN(KV_TYPE_BF16)

/* ---- entry --------------------------------------------------------------- */

void kv_mm_rows_avx512(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {
    if (a->nb1 > (size_t)INT32_MAX / 16) { /* pack_q's gather offsets are int32 */
        kv_mm_rows_ref(a, r0, r1, scratch);
        return;
    }
    static const kv_mm_rows_fn rows[KV_TYPE_COUNT] = KV_MM_ROWS_TABLE;
    kv_mm_rows_typed(rows, a, r0, r1, scratch);
}

KV_SIMD_TARGET_END

#endif
