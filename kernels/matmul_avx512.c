/* matmul_avx512.c - AVX-512 matmul kernels (F/BW/VL/DQ + VNNI), compiled
 * for that target with function attributes so the same binary still runs on
 * older x86-64 (the driver calls them only when the CPU has the features).
 *
 * Two shapes of kernel, one arithmetic. Every output y[j][r] is the same
 * chain of fp32 operations whichever kernel runs, so a row's result does not
 * depend on the batch it came in (batch invariance):
 *   quantized: per 32-element block b in order,
 *     acc = fma(float(isum_b + ioff_b), dw_b * da_b, acc)
 *     q4_1 then: acc = fma(mw_b, ds_b, acc)
 *   (isum_b is the exact integer dot; the order of integer adds is free);
 *   float: acc = fma(w[k], x[k], acc) for k = 0, 1, ..., K-1.
 *  - direct (n < KV_MM_PACK_MIN_N, decode): tiles of 16 weight rows, one row
 *    per lane, read straight from the file mapping while a later tile is
 *    prefetched. Quantized: per block, the 16 rows' dots come from 256/512-
 *    bit vpdpbusd plus an integer reduction tree; float: 16x16 in-register
 *    transposes. Memory-bound by design.
 *  - packed (batched n): a panel of 16 weight rows is repacked once per call
 *    into per-thread scratch (quantized: one zmm holds the same 4 elements of
 *    all 16 rows; float: k-major f32) while the next panel is prefetched.
 *    Quantized, the inner loop broadcasts 4 activation bytes per vpdpbusd and
 *    keeps 12 activation rows' accumulators in registers; float, it
 *    broadcasts one activation (x packed in groups of 16 rows by the
 *    driver) per fma into 16 accumulators. Every weight byte loaded feeds
 *    12-16 activation rows: compute-bound.
 * Quantized weights are made unsigned for vpdpbusd (q8_0: w ^ 0x80, q4:
 * the raw nibble) and the zero point comes back through the per-block
 * correction -zp * sum(q_act) (kv_q8a.ioff), exact in integers. */
#include "matmul.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

KV_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

#define KV_AI static inline __attribute__((always_inline))

/* n at which the packed kernels take over from the direct ones. */
#define KV_PACK_MIN_Q KV_MM_PACK_MIN_N
/* Direct tiles prefetch the tile this many tiles ahead (quantized, float),
 * into L2. NOTE: measured single-thread on cold weights (Zen 4): quantized
 * tiles (4-13 KB) gain 10-30% from 2 ahead over 1, 4 or 8 gain nothing
 * more; float tiles (16 rows x K floats) run at streaming speed with 1
 * ahead and lose a little with 2; prefetching into L1 instead loses 40%. */
#define KV_PF_AHEAD_Q 2
#define KV_PF_AHEAD_F 1
#define KV_PF_HINT _MM_HINT_T1
#define KV_FKC 256 /* k-chunk of the packed float kernel (L1-sized slices) */

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
        if (bad || isinf(amax)) { /* non-finite block: d = NaN poisons its dots; sum is moot */
            db = NAN;
            sum = 0;
        }
        d[o] = db;
        ioff[o] = -zp * sum;
        ds[o] = db * (float)sum;
    }
}

/* ---- helpers ------------------------------------------------------------- */

KV_AI size_t qblk_bytes(kv_type t) { return t == KV_TYPE_Q8_0 ? 34 : t == KV_TYPE_Q4_0 ? 18 : 20; }
KV_AI size_t qblk_qoff(kv_type t) { return t == KV_TYPE_Q4_1 ? 4 : 2; }

KV_AI __m512i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

KV_AI __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

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
    size_t qo = t == KV_TYPE_Q4_1 ? 4 : 2;
    __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(lo + qo)))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(hi + qo))), 1);
    /* 128-bit lanes 1 and 3 take the high nibbles */
    v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

/* Packs rows r0..r0+rows (rows <= 16) into pq (nb, 8 groups, 16 rows, 4
 * bytes: zmm g holds elements 4g..4g+3 of every row), pd (nb, 16) scales and
 * pm (nb, 16) minimums (q4_1). Missing rows repeat row r0: their lanes are
 * masked off when y is stored. */
static void pack_q(const kv_mm_args *a, kv_type t, int64_t r0, int rows, uint8_t *pq, float *pd, float *pm) {
    const int64_t nb = a->K / KV_QK;
    const size_t bs = qblk_bytes(t);
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
        __m512i z[8], u[8], tt[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) z[i] = q_pair(t, base[i] + bo, base[i + 8] + bo);
        /* 8x8 dword transpose inside each 256-bit half */
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            tt[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
            tt[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
        }
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) {
            u[4 * i + 0] = _mm512_unpacklo_epi64(tt[4 * i], tt[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(tt[4 * i], tt[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(tt[4 * i + 1], tt[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(tt[4 * i + 1], tt[4 * i + 3]);
        }
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

/* y[j0..j0+J][r0..r0+16) from a packed panel. */
KV_AI void qp_kernel(const kv_mm_args *a, kv_type t, const uint8_t *pq, const float *pd, const float *pm, int64_t r0,
                     __mmask16 mask, int j0, const int J) {
    const int64_t nb = a->K / KV_QK;
    const size_t n = (size_t)a->n;
    __m512 acc[12];
#pragma GCC unroll 12
    for (int jj = 0; jj < J; jj++) acc[jj] = _mm512_setzero_ps();
    const int8_t *aq = a->a.qs + (size_t)j0 * KV_QK;
    const float *ad = a->a.d + j0, *ads = a->a.ds + j0;
    const int32_t *io = a->a.ioff + j0;
    for (int64_t b = 0; b < nb; b++, aq += n * KV_QK, ad += n, ads += n, io += n) {
        const uint8_t *pb = pq + (size_t)b * 512;
        __m512i w0 = _mm512_load_si512((const void *)(pb + 0 * 64)), w1 = _mm512_load_si512((const void *)(pb + 1 * 64));
        __m512i w2 = _mm512_load_si512((const void *)(pb + 2 * 64)), w3 = _mm512_load_si512((const void *)(pb + 3 * 64));
        __m512i w4 = _mm512_load_si512((const void *)(pb + 4 * 64)), w5 = _mm512_load_si512((const void *)(pb + 5 * 64));
        __m512i w6 = _mm512_load_si512((const void *)(pb + 6 * 64)), w7 = _mm512_load_si512((const void *)(pb + 7 * 64));
        __m512 dw = _mm512_load_ps(pd + b * 16);
        __m512 mw = t == KV_TYPE_Q4_1 ? _mm512_load_ps(pm + b * 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
        for (int jj = 0; jj < J; jj++) {
            const int8_t *ap = aq + jj * KV_QK;
            __m512i s0 = t == KV_TYPE_Q4_1 ? _mm512_setzero_si512() : _mm512_set1_epi32(io[jj]);
            __m512i s1 = _mm512_setzero_si512();
            s0 = _mm512_dpbusd_epi32(s0, w0, bcast32(ap + 0));
            s1 = _mm512_dpbusd_epi32(s1, w1, bcast32(ap + 4));
            s0 = _mm512_dpbusd_epi32(s0, w2, bcast32(ap + 8));
            s1 = _mm512_dpbusd_epi32(s1, w3, bcast32(ap + 12));
            s0 = _mm512_dpbusd_epi32(s0, w4, bcast32(ap + 16));
            s1 = _mm512_dpbusd_epi32(s1, w5, bcast32(ap + 20));
            s0 = _mm512_dpbusd_epi32(s0, w6, bcast32(ap + 24));
            s1 = _mm512_dpbusd_epi32(s1, w7, bcast32(ap + 28));
            __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(ad[jj]));
            acc[jj] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), sc, acc[jj]);
            if (t == KV_TYPE_Q4_1) acc[jj] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ads[jj]), acc[jj]);
        }
    }
#pragma GCC unroll 12
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, mask, acc[jj]);
}

#define QP_FN(t)                                                                                                       \
    static void qp_##t(const kv_mm_args *a, const uint8_t *pq, const float *pd, const float *pm, int64_t r0,           \
                       __mmask16 mask) {                                                                               \
        int j0 = 0;                                                                                                    \
        for (; j0 + 12 <= a->n; j0 += 12) qp_kernel(a, t, pq, pd, pm, r0, mask, j0, 12);                               \
        int left = a->n - j0;                                                                                          \
        if (left >= 8) {                                                                                               \
            qp_kernel(a, t, pq, pd, pm, r0, mask, j0, 8);                                                              \
            j0 += 8;                                                                                                   \
            left -= 8;                                                                                                 \
        }                                                                                                              \
        if (left >= 4) {                                                                                               \
            qp_kernel(a, t, pq, pd, pm, r0, mask, j0, 4);                                                              \
            j0 += 4;                                                                                                   \
            left -= 4;                                                                                                 \
        }                                                                                                              \
        switch (left) {                                                                                                \
        case 3: qp_kernel(a, t, pq, pd, pm, r0, mask, j0, 3); break;                                                   \
        case 2: qp_kernel(a, t, pq, pd, pm, r0, mask, j0, 2); break;                                                   \
        case 1: qp_kernel(a, t, pq, pd, pm, r0, mask, j0, 1); break;                                                   \
        default: break;                                                                                                \
        }                                                                                                              \
    }
QP_FN(KV_TYPE_Q8_0)
QP_FN(KV_TYPE_Q4_0)
QP_FN(KV_TYPE_Q4_1)

typedef void (*qp_fn)(const kv_mm_args *a, const uint8_t *pq, const float *pd, const float *pm, int64_t r0, __mmask16 mask);

static void q_packed(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, void *scratch, qp_fn f) {
    const int64_t nb = a->K / KV_QK;
    uint8_t *pq = scratch;                                   /* nb * 512 bytes */
    float *pd = (float *)(void *)(pq + (size_t)nb * 512);    /* nb * 16 */
    float *pm = pd + nb * 16;                                /* nb * 16 */
    for (int64_t r = r0; r < r1; r += KV_MM_PANEL) {
        int rows = (int)KV_MIN(r1 - r, KV_MM_PANEL);
        pack_q(a, t, r, rows, pq, pd, pm);
        f(a, pq, pd, pm, r, tail_mask(rows));
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
    const int G = t == KV_TYPE_Q8_0 ? 2 : 4, F = t == KV_TYPE_Q4_1 ? 2 : 1, s = (int)qblk_bytes(t) / 2;
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
KV_AI void qd_scales(kv_type t, const uint8_t *w, size_t ws, int64_t nb, const qs_perm *ix, uint16_t *sc) {
    const size_t bs = qblk_bytes(t);
    const __m512i i1 = ix->i1, i2 = ix->i2, i30 = ix->i30, i31 = ix->i31, i40 = ix->i40, i41 = ix->i41;
    if (t == KV_TYPE_Q8_0) { /* 2 blocks' headers per 64-byte load; 15 permutes */
        for (int64_t b = 0; b < nb; b += 2) {
            __mmask64 m = nb - b >= 2 ? ~(__mmask64)0 : (((__mmask64)1 << bs) - 1);
            __m512i p[8], q[4];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                p[i] = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(m, w + (size_t)(2 * i) * ws + (size_t)b * bs), i1,
                                                 _mm512_maskz_loadu_epi8(m, w + (size_t)(2 * i + 1) * ws + (size_t)b * bs));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) q[i] = _mm512_permutex2var_epi16(p[2 * i], i2, p[2 * i + 1]);
            __m512i r0 = _mm512_permutex2var_epi16(q[0], i30, q[1]), r1 = _mm512_permutex2var_epi16(q[2], i30, q[3]);
            _mm512_storeu_si512((void *)(sc + (size_t)b * 16), _mm512_permutex2var_epi16(r0, i40, r1));
        }
        return;
    }
    const int F = t == KV_TYPE_Q4_1 ? 2 : 1;
    for (int64_t b = 0; b < nb; b += 4) {
        /* the last group may hold fewer than 4 blocks: load only its bytes */
        __mmask64 m = nb - b >= 4 ? ~(__mmask64)0 : (((__mmask64)1 << ((size_t)(nb - b) * bs)) - 1);
        __m512i p[8], q[4];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            p[i] = _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(m, w + (size_t)(2 * i) * ws + (size_t)b * bs), i1,
                                             _mm512_maskz_loadu_epi8(m, w + (size_t)(2 * i + 1) * ws + (size_t)b * bs));
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) q[i] = _mm512_permutex2var_epi16(p[2 * i], i2, p[2 * i + 1]);
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
    const size_t bs = qblk_bytes(t), n = (size_t)a->n;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const int8_t *aq = a->a.qs + (size_t)j0 * KV_QK;
    const float *ad = a->a.d + j0, *ads = a->a.ds + j0;
    const int32_t *io = a->a.ioff + j0;
    /* rows 0, 4, 8 and 12 of the tile at the current block's quants */
    const uint8_t *q0 = w + qblk_qoff(t), *q4 = q0 + 4 * ws, *q8 = q0 + 8 * ws, *q12 = q0 + 12 * ws;
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
                if (t == KV_TYPE_Q4_0) isum[jj] = _mm512_add_epi32(isum[jj], _mm512_set1_epi32(io[jj]));
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

#define QD_FN(t)                                                                                                       \
    static void qd_##t(const kv_mm_args *a, const uint8_t *w, size_t ws, const qs_perm *ix, uint16_t *sc,            \
                       int64_t r0, __mmask16 mask, const pf_plan *pf) {                                                \
        qd_scales(t, w, ws, a->K / KV_QK, ix, sc);                                                                     \
        int j0 = 0;                                                                                                    \
        for (; j0 + 2 <= a->n; j0 += 2) qd16(a, t, w, ws, sc, r0, mask, j0, 2, pf);                                   \
        if (j0 < a->n) qd16(a, t, w, ws, sc, r0, mask, j0, 1, pf);                                                     \
    }
QD_FN(KV_TYPE_Q8_0)
QD_FN(KV_TYPE_Q4_0)
QD_FN(KV_TYPE_Q4_1)

typedef void (*qd_fn)(const kv_mm_args *a, const uint8_t *w, size_t ws, const qs_perm *ix, uint16_t *sc, int64_t r0,
                      __mmask16 mask, const pf_plan *pf);

static void q_direct(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, void *scratch, qd_fn f) {
    const int64_t nb = a->K / KV_QK;
    const size_t rb = (size_t)nb * qblk_bytes(t); /* bytes of a row's blocks */
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
        for (int i = 0; i < KV_MM_PANEL; i++) memcpy(tw + (size_t)i * rb, a->w + (size_t)(r + (i < rows ? i : 0)) * a->nb1, rb);
        pf_plan pf = pf_plan_for(a, a->M, nb); /* nothing left to prefetch */
        f(a, tw, rb, &ix, sc, r, tail_mask(rows), &pf);
    }
}

/* ---- float weights -------------------------------------------------------- */

KV_AI __m512 ldw(kv_type t, const uint8_t *row, int64_t k) {
    if (t == KV_TYPE_F32) return _mm512_loadu_ps((const float *)(const void *)row + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * k));
    if (t == KV_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

KV_AI __m512 ldw_mask(kv_type t, const uint8_t *row, int64_t k, __mmask16 m) {
    if (t == KV_TYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)(const void *)row + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const void *)(row + 2 * k));
    if (t == KV_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* ---- packed float panels (batched n) ------------------------------------- */

/* In-register transpose of a 16x16 float tile. */
KV_AI void tr16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512 t0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        __m512 t1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        __m512 t2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        __m512 t3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        t[c] = _mm512_shuffle_f32x4(t0, t2, 0x88);
        t[8 + c] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
        t[4 + c] = _mm512_shuffle_f32x4(t1, t3, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Packs rows r0..r0+rows as pf[k][16] (f32). */
KV_AI void pack_f(const kv_mm_args *a, kv_type t, int64_t r0, int rows, float *pf) {
    const int64_t K = a->K;
    const uint8_t *base[16]; /* missing rows repeat row r0; their lanes are never stored */
    for (int rr = 0; rr < 16; rr++) base[rr] = a->w + (size_t)(r0 + (rr < rows ? rr : 0)) * a->nb1;
    pf_cursor pc;
    pf_init(&pc, a, r0 + KV_MM_PANEL, (K + 15) / 16);
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 m = tail_mask(K - k);
        pf_step(&pc);
        __m512 v[16];
#pragma GCC unroll 16
        for (int rr = 0; rr < 16; rr++) v[rr] = ldw_mask(t, base[rr], k, m);
        tr16(v);
        if (K - k >= 16) {
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) _mm512_store_ps(pf + (k + i) * 16, v[i]);
        } else {
            for (int i = 0; i < K - k; i++) _mm512_store_ps(pf + (k + i) * 16, v[i]);
        }
    }
}

/* y rows j0..j0+J (xg: their packed activations, row stride 16 floats per
 * k) x panel rows r0..r0+16, over k in [k0, k1); adds to y when k0 > 0. */
KV_AI void fp_kernel(const kv_mm_args *a, const float *pf, const float *xg, int64_t k0, int64_t k1, int64_t r0,
                     __mmask16 mask, int j0, const int J) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int jj = 0; jj < J; jj++)
        acc[jj] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, a->y + (size_t)(j0 + jj) * a->M + r0);
    const float *xk = xg + k0 * KV_MM_XGROUP;
    const float *wk = pf + k0 * 16;
    for (int64_t k = k0; k < k1; k++, xk += KV_MM_XGROUP, wk += 16) {
        __m512 wv = _mm512_load_ps(wk);
#pragma GCC unroll 16
        for (int jj = 0; jj < J; jj++) acc[jj] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xk[jj]), acc[jj]);
    }
#pragma GCC unroll 16
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, mask, acc[jj]);
}

static void fp_panel(const kv_mm_args *a, const float *pf, int64_t r0, __mmask16 mask) {
    for (int64_t k0 = 0; k0 < a->K; k0 += KV_FKC) {
        int64_t k1 = KV_MIN(a->K, k0 + KV_FKC);
        for (int g0 = 0; g0 < a->n; g0 += KV_MM_XGROUP) {
            const float *xg = a->xp + (size_t)(g0 / KV_MM_XGROUP) * (size_t)a->K * KV_MM_XGROUP;
            int left = KV_MIN(a->n - g0, KV_MM_XGROUP), jo = 0;
            if (left == 16) {
                fp_kernel(a, pf, xg, k0, k1, r0, mask, g0, 16);
                continue;
            }
            if (left - jo >= 8) {
                fp_kernel(a, pf, xg + jo, k0, k1, r0, mask, g0 + jo, 8);
                jo += 8;
            }
            if (left - jo >= 4) {
                fp_kernel(a, pf, xg + jo, k0, k1, r0, mask, g0 + jo, 4);
                jo += 4;
            }
            switch (left - jo) {
            case 3: fp_kernel(a, pf, xg + jo, k0, k1, r0, mask, g0 + jo, 3); break;
            case 2: fp_kernel(a, pf, xg + jo, k0, k1, r0, mask, g0 + jo, 2); break;
            case 1: fp_kernel(a, pf, xg + jo, k0, k1, r0, mask, g0 + jo, 1); break;
            default: break;
            }
        }
    }
}

void kv_mm_xpack_avx512(const float *x, int n, int64_t K, float *xp, int g0, int g1) {
    for (int g = g0; g < g1; g++) {
        float *dst = xp + (size_t)g * (size_t)K * KV_MM_XGROUP;
        int rows = KV_MIN(n - g * KV_MM_XGROUP, KV_MM_XGROUP);
        const float *src = x + (size_t)g * KV_MM_XGROUP * (size_t)K;
        for (int64_t k = 0; k < K; k += 16) {
            __mmask16 m = tail_mask(K - k);
            __m512 v[16];
#pragma GCC unroll 16
            for (int rr = 0; rr < 16; rr++)
                v[rr] = rr < rows ? _mm512_maskz_loadu_ps(m, src + (size_t)rr * K + k) : _mm512_setzero_ps();
            tr16(v);
            if (K - k >= 16) {
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (k + i) * KV_MM_XGROUP, v[i]);
            } else {
                for (int i = 0; i < K - k; i++) _mm512_storeu_ps(dst + (k + i) * KV_MM_XGROUP, v[i]);
            }
        }
    }
}

static void pack_f32(const kv_mm_args *a, int64_t r0, int rows, float *pf) { pack_f(a, KV_TYPE_F32, r0, rows, pf); }
static void pack_f16(const kv_mm_args *a, int64_t r0, int rows, float *pf) { pack_f(a, KV_TYPE_F16, r0, rows, pf); }
static void pack_bf16(const kv_mm_args *a, int64_t r0, int rows, float *pf) { pack_f(a, KV_TYPE_BF16, r0, rows, pf); }

static void f_packed(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch,
                     void (*pack)(const kv_mm_args *, int64_t, int, float *)) {
    float *pf = scratch; /* K * 16 floats */
    for (int64_t r = r0; r < r1; r += KV_MM_PANEL) {
        int rows = (int)KV_MIN(r1 - r, KV_MM_PANEL);
        pack(a, r, rows, pf);
        fp_panel(a, pf, r, tail_mask(rows));
    }
}

/* ---- direct float tiles (small n) ---------------------------------------- */

/* Decode-sized n: 16 weight rows are transposed in registers, 16 k at a
 * time, instead of being packed to scratch, then fed to the same fma chain
 * as fp_kernel: per row (one lane) and activation row,
 *   acc = fma(w[k], x[k], acc) for k = 0, 1, ..., K-1,
 * so the result is the packed path's to the bit (batch invariance). */
KV_AI void fd16(const kv_mm_args *a, kv_type t, const uint8_t *w, size_t ws, int64_t r0, __mmask16 mask, int j0,
                const int J, const pf_plan *pf) {
    const int64_t K = a->K;
    const float *xs[2];
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 2
    for (int jj = 0; jj < J; jj++) xs[jj] = a->x + (size_t)(j0 + jj) * K;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        pf_slice(pf, k / 16);
        __m512 v[16];
#pragma GCC unroll 16
        for (int rr = 0; rr < 16; rr++) v[rr] = ldw(t, w + (size_t)rr * ws, k);
        tr16(v);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
#pragma GCC unroll 2
            for (int jj = 0; jj < J; jj++) acc[jj] = _mm512_fmadd_ps(v[i], _mm512_set1_ps(xs[jj][k + i]), acc[jj]);
    }
    if (k < K) {
        __mmask16 m = tail_mask(K - k);
        __m512 v[16];
#pragma GCC unroll 16
        for (int rr = 0; rr < 16; rr++) v[rr] = ldw_mask(t, w + (size_t)rr * ws, k, m);
        tr16(v);
        for (int i = 0; i < K - k; i++)
#pragma GCC unroll 2
            for (int jj = 0; jj < J; jj++) acc[jj] = _mm512_fmadd_ps(v[i], _mm512_set1_ps(xs[jj][k + i]), acc[jj]);
    }
#pragma GCC unroll 2
    for (int jj = 0; jj < J; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, mask, acc[jj]);
}

#define FD_FN(t)                                                                                                       \
    static void fd_##t(const kv_mm_args *a, const uint8_t *w, size_t ws, int64_t r0, __mmask16 mask,                 \
                       const pf_plan *pf) {                                                                            \
        int j0 = 0;                                                                                                    \
        for (; j0 + 2 <= a->n; j0 += 2) fd16(a, t, w, ws, r0, mask, j0, 2, pf);                                       \
        if (j0 < a->n) fd16(a, t, w, ws, r0, mask, j0, 1, pf);                                                         \
    }
FD_FN(KV_TYPE_F32)
FD_FN(KV_TYPE_F16)
FD_FN(KV_TYPE_BF16)

typedef void (*fd_fn)(const kv_mm_args *a, const uint8_t *w, size_t ws, int64_t r0, __mmask16 mask,
                      const pf_plan *pf);

static void f_direct(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch, fd_fn f) {
    const size_t rb = (size_t)a->K * kv_type_get(a->type)->type_size; /* bytes of a row's elements */
    int64_t r = r0;
    for (; r + KV_MM_PANEL <= r1; r += KV_MM_PANEL) {
        pf_plan pf = pf_plan_for(a, r + KV_PF_AHEAD_F * KV_MM_PANEL, a->K / 16);
        f(a, a->w + (size_t)r * a->nb1, a->nb1, r, 0xFFFF, &pf);
    }
    if (r < r1) { /* partial tile: copied, missing rows repeat the first (masked off at the store) */
        int rows = (int)(r1 - r);
        uint8_t *tw = scratch;
        for (int i = 0; i < KV_MM_PANEL; i++) memcpy(tw + (size_t)i * rb, a->w + (size_t)(r + (i < rows ? i : 0)) * a->nb1, rb);
        pf_plan pf = pf_plan_for(a, a->M, 1); /* nothing left to prefetch */
        f(a, tw, rb, r, tail_mask(rows), &pf);
    }
}

/* ---- entry --------------------------------------------------------------- */

void kv_mm_rows_avx512(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {
    if (a->nb1 > (size_t)INT32_MAX / 16) { /* pack_q's gather offsets are int32 */
        kv_mm_rows_ref(a, r0, r1, scratch);
        return;
    }
    switch (a->type) {
    case KV_TYPE_Q8_0:
        if (a->n >= KV_PACK_MIN_Q)
            q_packed(a, KV_TYPE_Q8_0, r0, r1, scratch, qp_KV_TYPE_Q8_0);
        else
            q_direct(a, KV_TYPE_Q8_0, r0, r1, scratch, qd_KV_TYPE_Q8_0);
        break;
    case KV_TYPE_Q4_0:
        if (a->n >= KV_PACK_MIN_Q)
            q_packed(a, KV_TYPE_Q4_0, r0, r1, scratch, qp_KV_TYPE_Q4_0);
        else
            q_direct(a, KV_TYPE_Q4_0, r0, r1, scratch, qd_KV_TYPE_Q4_0);
        break;
    case KV_TYPE_Q4_1:
        if (a->n >= KV_PACK_MIN_Q)
            q_packed(a, KV_TYPE_Q4_1, r0, r1, scratch, qp_KV_TYPE_Q4_1);
        else
            q_direct(a, KV_TYPE_Q4_1, r0, r1, scratch, qd_KV_TYPE_Q4_1);
        break;
    case KV_TYPE_F32:
        if (a->xp)
            f_packed(a, r0, r1, scratch, pack_f32);
        else
            f_direct(a, r0, r1, scratch, fd_KV_TYPE_F32);
        break;
    case KV_TYPE_F16:
        if (a->xp)
            f_packed(a, r0, r1, scratch, pack_f16);
        else
            f_direct(a, r0, r1, scratch, fd_KV_TYPE_F16);
        break;
    case KV_TYPE_BF16:
        if (a->xp)
            f_packed(a, r0, r1, scratch, pack_bf16);
        else
            f_direct(a, r0, r1, scratch, fd_KV_TYPE_BF16);
        break;
    default:
        kv_mm_rows_ref(a, r0, r1, scratch);
        break;
    }
}

KV_SIMD_TARGET_END

#else  /* not x86 */
typedef int kv_matmul_avx512_unused; /* ISO C wants a declaration */
#endif
