/* matmul_avx512.c - AVX-512 matmul kernels (F/BW/VL/DQ + VNNI), compiled
 * for that target with function attributes so the same binary still runs on
 * older x86-64 (the driver calls them only when the CPU has the features).
 *
 * Two shapes of kernel:
 *  - direct (n < KV_MM_PACK_MIN_N, decode): tiles of 4 weight rows x up to 4
 *    activation rows read the weights straight from the file mapping; one
 *    256-bit vpdpbusd per 32-element block and row, scales pre-multiplied
 *    per tile. Memory-bound by design.
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

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif

#define KV_AI static inline __attribute__((always_inline))

/* n at which the packed kernels take over from the direct ones. */
#define KV_PACK_MIN_Q KV_MM_PACK_MIN_N
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

/* The 32 quants of a block as unsigned bytes in element order. */
KV_AI __m256i q_unsigned(kv_type t, const uint8_t *blk) {
    if (t == KV_TYPE_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 2)), _mm256_set1_epi8((char)0x80));
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + qblk_qoff(t))));
    v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0)); /* high half: upper nibbles */
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

KV_AI float hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

KV_AI __m512i bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

KV_AI __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* fp16 fields at `off` in each of nb blocks of bs bytes -> floats; out holds
 * nbp = nb rounded up to 16 entries (tail zero). One gather per 16 blocks
 * (a 4-byte read at the field stays inside its block). NOTE: measured
 * against scalar u16 stores + a vector reload (stalls store forwarding) and
 * against 64-byte loads + word permutes (more instructions for q8_0's
 * 34-byte blocks): the gather is the fastest of the three here. */
static void extract_f16(const uint8_t *row, size_t bs, size_t off, int64_t nb, int64_t nbp, float *out) {
    const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)bs));
    for (int64_t b = 0; b < nbp; b += 16) {
        __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), tail_mask(nb - b), step,
                                                (const void *)(row + (size_t)b * bs + off), 1);
        _mm512_storeu_ps(out + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    }
}

/* q4_1: d (bytes 0-1) and m (bytes 2-3) of each block with one gather per
 * 16 blocks (gathers are the expensive part of a decode tile). */
static void extract_dm(const uint8_t *row, size_t bs, int64_t nb, int64_t nbp, float *outd, float *outm) {
    const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)bs));
    for (int64_t b = 0; b < nbp; b += 16) {
        __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), tail_mask(nb - b), step,
                                                (const void *)(row + (size_t)b * bs), 1);
        _mm512_storeu_ps(outd + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
        _mm512_storeu_ps(outm + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
    }
}

/* ---- direct quantized tiles (small n) ------------------------------------ */

/* Scratch of the direct path, in floats from its start (nbp = nb rounded up
 * to 16):
 *   dwf (4, nbp)     the row tile's weight scales
 *   mwf (4, nbp)     q4_1 minimums
 *   adt (4, nbp)     the activation chunk's scales (row-major copy)
 *   dst (4, nbp)     its d * sum (q4_1)
 *   scl (4, 4, nbp)  dw * da per (row, activation row, block) */
typedef struct qd_scr {
    float *dwf, *mwf, *adt, *dst, *scl;
    int64_t nbp;
} qd_scr;

static qd_scr qd_layout(void *scratch, int64_t nb) {
    qd_scr q;
    q.nbp = (nb + 15) & ~(int64_t)15;
    q.dwf = scratch;
    q.mwf = q.dwf + 4 * q.nbp;
    q.adt = q.mwf + 4 * q.nbp;
    q.dst = q.adt + 4 * q.nbp;
    q.scl = q.dst + 4 * q.nbp;
    return q;
}

/* Rows r..r+R of the weights against activation rows j0..j0+J; q_direct has
 * filled adt and dst for this chunk. Per block and row: one vpdpbusd (its
 * accumulator starts at the block's zero-point correction), one convert,
 * one fma with the block's scale product broadcast from memory. */
KV_AI void qd_tile(const kv_mm_args *a, kv_type t, int64_t r, const int R, int j0, const int J, const qd_scr *q) {
    const int64_t nb = a->K / KV_QK, nbp = q->nbp;
    const size_t bs = qblk_bytes(t), n = (size_t)a->n;
    const uint8_t *rows[4];
    float mterm[4][4];
    for (int rr = 0; rr < R; rr++) {
        rows[rr] = a->w + (size_t)(r + rr) * a->nb1;
        if (t == KV_TYPE_Q4_1)
            extract_dm(rows[rr], bs, nb, nbp, q->dwf + rr * nbp, q->mwf + rr * nbp);
        else
            extract_f16(rows[rr], bs, 0, nb, nbp, q->dwf + rr * nbp);
        for (int jj = 0; jj < J; jj++) {
            __m512 macc = _mm512_setzero_ps();
            for (int64_t b = 0; b < nbp; b += 16) {
                _mm512_storeu_ps(q->scl + (rr * 4 + jj) * nbp + b,
                                 _mm512_mul_ps(_mm512_loadu_ps(q->dwf + rr * nbp + b), _mm512_loadu_ps(q->adt + jj * nbp + b)));
                if (t == KV_TYPE_Q4_1)
                    macc = _mm512_fmadd_ps(_mm512_loadu_ps(q->mwf + rr * nbp + b), _mm512_loadu_ps(q->dst + jj * nbp + b), macc);
            }
            mterm[rr][jj] = t == KV_TYPE_Q4_1 ? _mm512_reduce_add_ps(macc) : 0.0f;
        }
    }
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) acc[rr][jj] = _mm256_setzero_ps();
    const int8_t *aq = a->a.qs + (size_t)j0 * KV_QK;
    const int32_t *io = a->a.ioff + j0;
    for (int64_t b = 0; b < nb; b++, aq += n * KV_QK, io += n) {
        __m256i wv[4];
#pragma GCC unroll 4
        for (int rr = 0; rr < R; rr++) wv[rr] = q_unsigned(t, rows[rr] + (size_t)b * bs);
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) {
            __m256i av = _mm256_loadu_si256((const __m256i *)(const void *)(aq + jj * KV_QK));
            __m256i init = t == KV_TYPE_Q4_1 ? _mm256_setzero_si256() : _mm256_zextsi128_si256(_mm_cvtsi32_si128(io[jj]));
#pragma GCC unroll 4
            for (int rr = 0; rr < R; rr++) {
                __m256i s = _mm256_dpbusd_epi32(init, wv[rr], av);
                acc[rr][jj] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(q->scl[(rr * 4 + jj) * nbp + b]), acc[rr][jj]);
            }
        }
    }
#pragma GCC unroll 4
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) a->y[(size_t)(j0 + jj) * a->M + r + rr] = hsum256(acc[rr][jj]) + mterm[rr][jj];
}

#define QD_J(R, t)                                                                                                     \
    static void qd_##R##_##t(const kv_mm_args *a, int64_t r, int j0, int J, const qd_scr *q) {                         \
        switch (J) {                                                                                                   \
        case 4: qd_tile(a, t, r, R, j0, 4, q); break;                                                                  \
        case 3: qd_tile(a, t, r, R, j0, 3, q); break;                                                                  \
        case 2: qd_tile(a, t, r, R, j0, 2, q); break;                                                                  \
        default: qd_tile(a, t, r, R, j0, 1, q); break;                                                                 \
        }                                                                                                              \
    }
QD_J(4, KV_TYPE_Q8_0)
QD_J(1, KV_TYPE_Q8_0)
QD_J(4, KV_TYPE_Q4_0)
QD_J(1, KV_TYPE_Q4_0)
QD_J(4, KV_TYPE_Q4_1)
QD_J(1, KV_TYPE_Q4_1)

typedef void (*qd_fn)(const kv_mm_args *a, int64_t r, int j0, int J, const qd_scr *q);

static void q_direct(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch, qd_fn f4, qd_fn f1) {
    const int64_t nb = a->K / KV_QK;
    const size_t n = (size_t)a->n;
    qd_scr q = qd_layout(scratch, nb);
    for (int j0 = 0; j0 < a->n; j0 += 4) {
        int J = KV_MIN(a->n - j0, 4);
        /* this chunk's activation scales and corrections, once for all row tiles */
        for (int jj = 0; jj < J; jj++) {
            for (int64_t b = 0; b < q.nbp; b++) {
                size_t o = (size_t)b * n + (size_t)(j0 + jj);
                q.adt[jj * q.nbp + b] = b < nb ? a->a.d[o] : 0.0f;
                q.dst[jj * q.nbp + b] = b < nb ? a->a.ds[o] : 0.0f;
            }
        }
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) {
            /* the tile two ahead (rows are contiguous): first touches would
             * otherwise wait on one cache miss after another */
            if (r + 12 <= r1) {
                const char *p = (const char *)a->w + (size_t)(r + 8) * a->nb1, *e = p + 4 * a->nb1;
                for (; p < e; p += 64) _mm_prefetch(p, _MM_HINT_T0);
            }
            f4(a, r, j0, J, &q);
        }
        for (; r < r1; r++) f1(a, r, j0, J, &q);
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
    for (; c->p < stop; c->p += 64) _mm_prefetch(c->p, _MM_HINT_T1);
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

/* ---- direct float tiles (small n) ---------------------------------------- */

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

KV_AI void fd_tile(const kv_mm_args *a, kv_type t, int64_t r, const int R, int j0, const int J) {
    const uint8_t *rows[4];
    const float *xs[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int rr = 0; rr < R; rr++) rows[rr] = a->w + (size_t)(r + rr) * a->nb1;
#pragma GCC unroll 4
    for (int jj = 0; jj < J; jj++) xs[jj] = a->x + (size_t)(j0 + jj) * a->K;
#pragma GCC unroll 4
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) acc[rr][jj] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= a->K; k += 16) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int rr = 0; rr < R; rr++) wv[rr] = ldw(t, rows[rr], k);
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) {
            __m512 xv = _mm512_loadu_ps(xs[jj] + k);
#pragma GCC unroll 4
            for (int rr = 0; rr < R; rr++) acc[rr][jj] = _mm512_fmadd_ps(wv[rr], xv, acc[rr][jj]);
        }
    }
    if (k < a->K) {
        __mmask16 m = tail_mask(a->K - k);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int rr = 0; rr < R; rr++) wv[rr] = ldw_mask(t, rows[rr], k, m);
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, xs[jj] + k);
#pragma GCC unroll 4
            for (int rr = 0; rr < R; rr++) acc[rr][jj] = _mm512_fmadd_ps(wv[rr], xv, acc[rr][jj]);
        }
    }
#pragma GCC unroll 4
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 4
        for (int jj = 0; jj < J; jj++) a->y[(size_t)(j0 + jj) * a->M + r + rr] = _mm512_reduce_add_ps(acc[rr][jj]);
}

#define FD_J(R, t)                                                                                                     \
    static void fd_##R##_##t(const kv_mm_args *a, int64_t r, int j0, int J) {                                          \
        switch (J) {                                                                                                   \
        case 4: fd_tile(a, t, r, R, j0, 4); break;                                                                     \
        case 3: fd_tile(a, t, r, R, j0, 3); break;                                                                     \
        case 2: fd_tile(a, t, r, R, j0, 2); break;                                                                     \
        default: fd_tile(a, t, r, R, j0, 1); break;                                                                    \
        }                                                                                                              \
    }
FD_J(4, KV_TYPE_F32)
FD_J(1, KV_TYPE_F32)
FD_J(4, KV_TYPE_F16)
FD_J(1, KV_TYPE_F16)
FD_J(4, KV_TYPE_BF16)
FD_J(1, KV_TYPE_BF16)

typedef void (*fd_fn)(const kv_mm_args *a, int64_t r, int j0, int J);

static void f_direct(const kv_mm_args *a, int64_t r0, int64_t r1, fd_fn f4, fd_fn f1) {
    for (int j0 = 0; j0 < a->n; j0 += 4) {
        int J = KV_MIN(a->n - j0, 4);
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) f4(a, r, j0, J);
        for (; r < r1; r++) f1(a, r, j0, J);
    }
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
            q_direct(a, r0, r1, scratch, qd_4_KV_TYPE_Q8_0, qd_1_KV_TYPE_Q8_0);
        break;
    case KV_TYPE_Q4_0:
        if (a->n >= KV_PACK_MIN_Q)
            q_packed(a, KV_TYPE_Q4_0, r0, r1, scratch, qp_KV_TYPE_Q4_0);
        else
            q_direct(a, r0, r1, scratch, qd_4_KV_TYPE_Q4_0, qd_1_KV_TYPE_Q4_0);
        break;
    case KV_TYPE_Q4_1:
        if (a->n >= KV_PACK_MIN_Q)
            q_packed(a, KV_TYPE_Q4_1, r0, r1, scratch, qp_KV_TYPE_Q4_1);
        else
            q_direct(a, r0, r1, scratch, qd_4_KV_TYPE_Q4_1, qd_1_KV_TYPE_Q4_1);
        break;
    case KV_TYPE_F32:
        if (a->xp)
            f_packed(a, r0, r1, scratch, pack_f32);
        else
            f_direct(a, r0, r1, fd_4_KV_TYPE_F32, fd_1_KV_TYPE_F32);
        break;
    case KV_TYPE_F16:
        if (a->xp)
            f_packed(a, r0, r1, scratch, pack_f16);
        else
            f_direct(a, r0, r1, fd_4_KV_TYPE_F16, fd_1_KV_TYPE_F16);
        break;
    case KV_TYPE_BF16:
        if (a->xp)
            f_packed(a, r0, r1, scratch, pack_bf16);
        else
            f_direct(a, r0, r1, fd_4_KV_TYPE_BF16, fd_1_KV_TYPE_BF16);
        break;
    default:
        kv_mm_rows_ref(a, r0, r1, scratch);
        break;
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#else  /* not x86 */
typedef int kv_matmul_avx512_unused; /* ISO C wants a declaration */
#endif
