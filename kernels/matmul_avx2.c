/* matmul_avx2.c - AVX2 + FMA + F16C matmul kernels, for x86-64 CPUs without
 * AVX-512 VNNI. Compiled for that target with function attributes; the
 * driver calls them only when the CPU has the features.
 *
 *  - quantized weights: tiles of 4 weight rows x up to 2 activation rows,
 *    weights read straight from the mapping and reused from L1 for every
 *    activation pair; int8 products with vpmaddubsw (u8 x s8) + vpmaddwd.
 *    q8_0 uses |w| x sign(a, w) so the 16-bit pair sums cannot saturate;
 *    the q4 nibbles (and q5_0's 5-bit values) are unsigned already (zero
 *    point via kv_q8a.ioff). One
 *    kernel for every n, so each output's arithmetic is the same whatever
 *    the batch (batch invariance).
 *  - float weights: for n >= 3 a panel of 16 rows is repacked (k-major, f32)
 *    and a 16-row x 6-activation register tile runs over it; for small n the
 *    rows are transposed in registers instead. Both run the same fma chain
 *    per output (acc = fma(w[k], x[k], acc), k = 0 .. K-1, one row per
 *    lane), so they agree to the bit (batch invariance). */
#include "matmul.h"

#if defined(__x86_64__) || defined(__i386__)

#include <math.h>
#include <string.h>

#include "simd_x86.h"

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c")

#define KV_AI static inline __attribute__((always_inline))

/* ---- activation quantizer ------------------------------------------------ */

void kv_q8a_row_avx2(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                     int zp) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    /* packs_epi32 / packs_epi16 interleave 128-bit lanes; this restores order */
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < K / KV_QK; b++) {
        const float *xb = x + b * KV_QK;
        size_t o = (size_t)b * bstride;
        __m256 v[4], m = _mm256_setzero_ps(), nanv = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(_mm256_and_ps(v[i], absmask), m); /* NaN lanes keep m */
            nanv = _mm256_or_ps(nanv, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
        }
        float amax = kv_hmax256(m);
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        int sum = kv_hsum256i(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        _mm256_storeu_si256((__m256i *)(void *)(qs + o * KV_QK), p);
        kv_q8a_put(d, ioff, ds, o, db, sum, _mm256_movemask_ps(nanv) || isinf(amax), zp);
    }
}

/* ---- helpers ------------------------------------------------------------- */


/* q8_0: the raw signed quants; q4: nibbles 0..15 in element order; q5_0:
 * the nibbles with each element's fifth bit, 0..31 (zero point 16). */
KV_AI __m256i q_load(kv_type t, const uint8_t *blk) {
    if (t == KV_TYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(blk + kv_mm_qblk_qoff(t)));
    __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F));
    __m256i v = _mm256_set_m128i(hi, lo);
    if (t == KV_TYPE_Q5_0) {
        /* byte k takes byte k / 8 of qh, then tests its bit k % 8 */
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)kv_mm_q5_qh(blk)),
                                        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                           0x0303030303030303LL));
        h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
    }
    return v;
}

static void extract_f16(const uint8_t *row, size_t bs, size_t off, int64_t nb, int64_t nbp, uint16_t *tmp, float *out) {
    int64_t b = 0;
    for (; b < nb; b++) tmp[b] = kv_mm_rd16(row + (size_t)b * bs + off);
    for (; b < nbp; b++) tmp[b] = 0;
    for (b = 0; b < nbp; b += 8)
        _mm256_storeu_ps(out + b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(tmp + b))));
}

/* ---- quantized tiles ----------------------------------------------------- */

/* Activations per pass of q_rows: their quants (QJB x K bytes, 24 KiB at
 * K = 768) stay in L1/L2 while every row tile of the thread's share passes
 * over them, and their scales are gathered once per pass. */
#define QJB 32

/* Scratch of q_rows: (4, nbp) weight scales, (4, nbp) q4_1 minimums,
 * (4, 2, nbp) scale products for the current activation pair, (QJB, nbp)
 * the pass's activation d and (QJB, nbp) its d * sum (activation-major,
 * gathered once per pass out of the block-major kv_q8a), u16 staging.
 * (16 + 2 * QJB) * nbp floats and nbp u16, under 12 KiB at K = 768:
 * kv_mm_scratch_bytes(K) holds it (its float panel term alone, 128 K bytes,
 * does for every K). */
typedef struct qtile_scr {
    float *dwf, *mwf, *scl;
    float *adt, *dst; /* (QJB, nbp) the pass's activation scales; row 0 is activation j0 */
    uint16_t *tmp;
    int64_t nbp;
    int j0;           /* the pass's first activation row */
} qtile_scr;

static qtile_scr qtile_layout(void *scratch, int64_t nb) {
    qtile_scr q;
    q.nbp = (nb + 15) & ~(int64_t)15;
    q.dwf = scratch;
    q.mwf = q.dwf + 4 * q.nbp;
    q.scl = q.mwf + 4 * q.nbp;
    q.adt = q.scl + 8 * q.nbp;
    q.dst = q.adt + QJB * q.nbp;
    q.tmp = (uint16_t *)(q.dst + QJB * q.nbp);
    q.j0 = 0;
    return q;
}

/* Gathers activations j0 .. j0+J-1's block scales (and q4_1's d * sum)
 * into sc->adt / sc->dst, zero past nb. */
static void qtile_gather(const kv_mm_args *a, kv_type t, int j0, int J, qtile_scr *sc) {
    const int64_t nb = a->K / KV_QK, nbp = sc->nbp;
    const size_t n = (size_t)a->n;
    sc->j0 = j0;
    for (int jj = 0; jj < J; jj++) {
        float *ad = sc->adt + jj * nbp, *ads = sc->dst + jj * nbp;
        const float *d = a->a.d + j0 + jj, *ds = a->a.ds + j0 + jj;
        for (int64_t b = 0; b < nb; b++) ad[b] = d[(size_t)b * n];
        if (t == KV_TYPE_Q4_1)
            for (int64_t b = 0; b < nb; b++) ads[b] = ds[(size_t)b * n];
        for (int64_t b = nb; b < nbp; b++) ad[b] = ads[b] = 0.0f;
    }
}

/* Rows r..r+R against activation rows j0..j0+J (J <= 2, inside the pass
 * sc->adt holds); the row tile's scales are already in sc->dwf / sc->mwf. */
KV_AI void qd_tile(const kv_mm_args *a, kv_type t, int64_t r, const int R, int j0, const int J, const qtile_scr *sc) {
    const int64_t nb = a->K / KV_QK, nbp = sc->nbp;
    const size_t bs = kv_mm_qblk_bytes(t), n = (size_t)a->n;
    const uint8_t *rows[4];
    float mterm[4][2];
    const float *adt = sc->adt + (j0 - sc->j0) * nbp, *dst = sc->dst + (j0 - sc->j0) * nbp;
    for (int rr = 0; rr < R; rr++) {
        rows[rr] = a->w + (size_t)(r + rr) * a->nb1;
        for (int jj = 0; jj < J; jj++) {
            float *s = sc->scl + (rr * 2 + jj) * nbp;
            const float *dw = sc->dwf + rr * nbp, *mw = sc->mwf + rr * nbp;
            const float *ad = adt + jj * nbp, *ads = dst + jj * nbp;
            __m256 mt = _mm256_setzero_ps();
            for (int64_t b = 0; b < nbp; b += 8) {
                _mm256_storeu_ps(s + b, _mm256_mul_ps(_mm256_loadu_ps(dw + b), _mm256_loadu_ps(ad + b)));
                if (t == KV_TYPE_Q4_1) mt = _mm256_fmadd_ps(_mm256_loadu_ps(mw + b), _mm256_loadu_ps(ads + b), mt);
            }
            mterm[rr][jj] = t == KV_TYPE_Q4_1 ? kv_hsum256(mt) : 0.0f;
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) acc[rr][jj] = _mm256_setzero_ps();
    const int8_t *aq = a->a.qs + (size_t)j0 * KV_QK;
    const int32_t *io = a->a.ioff + j0;
    if (t == KV_TYPE_Q8_0) {
        /* Each weight block is loaded once into a register (with its |w|)
         * and met by both activations of the pair: 8 accumulators, the
         * pair, the weight and its |w| and 2 temporaries fit the 16
         * registers (the activation-outer order spilled accumulators). */
        for (int64_t b = 0; b < nb; b++, aq += n * KV_QK) {
            __m256i av[2];
#pragma GCC unroll 2
            for (int jj = 0; jj < J; jj++) av[jj] = _mm256_loadu_si256((const __m256i *)(const void *)(aq + jj * KV_QK));
#pragma GCC unroll 4
            for (int rr = 0; rr < R; rr++) {
                __m256i wv = q_load(t, rows[rr] + (size_t)b * bs), wabs = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 2
                for (int jj = 0; jj < J; jj++) {
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av[jj], wv)), ones);
                    acc[rr][jj] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sc->scl[(rr * 2 + jj) * nbp + b]),
                                                  acc[rr][jj]);
                }
            }
        }
    } else
    for (int64_t b = 0; b < nb; b++, aq += n * KV_QK, io += n) {
        __m256i wv[4], wabs[4];
#pragma GCC unroll 4
        for (int rr = 0; rr < R; rr++) {
            wv[rr] = q_load(t, rows[rr] + (size_t)b * bs);
            wabs[rr] = t == KV_TYPE_Q8_0 ? _mm256_sign_epi8(wv[rr], wv[rr]) : wv[rr];
        }
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) {
            __m256i av = _mm256_loadu_si256((const __m256i *)(const void *)(aq + jj * KV_QK));
#pragma GCC unroll 4
            for (int rr = 0; rr < R; rr++) {
                __m256i p;
                if (t == KV_TYPE_Q8_0) {
                    p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[rr], _mm256_sign_epi8(av, wv[rr])), ones);
                } else {
                    p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[rr], av), ones);
                    if (t == KV_TYPE_Q4_0 || t == KV_TYPE_Q5_0)
                        p = _mm256_add_epi32(p, _mm256_zextsi128_si256(_mm_cvtsi32_si128(io[jj])));
                }
                acc[rr][jj] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sc->scl[(rr * 2 + jj) * nbp + b]), acc[rr][jj]);
            }
        }
    }
#pragma GCC unroll 4
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) a->y[(size_t)(j0 + jj) * a->M + r + rr] = kv_hsum256(acc[rr][jj]) + mterm[rr][jj];
}

/* ---- one activation row (decode) ------------------------------------------ */

/* Bytes ahead of the block being read that a row's stream prefetches. */
#define QV_PF_BYTES 512

/* Row r against the one activation row: qd_tile's arithmetic for J = 1,
 * bit for bit (each block's scale product dw * da, the same int32 lanes,
 * one fma per block and lane, q4_1's min term in 8 lanes of block b % 8
 * with zeros past the last block, the same horizontal sums), but one row at
 * a time, each block's scales converted where the block is read, and the
 * row's bytes prefetched QV_PF_BYTES ahead. On an AVX2-only core (a 2-core
 * AMD EPYC guest) the 4-row tile's pass over its scales and then its four
 * interleaved streams read the weights at 5-7 GB/s a thread; one
 * sequential stream with the prefetch reads them at 7-9 (q8_0; q4_0 a
 * little less), and the rows are contiguous, so a thread's whole range is
 * one stream. */
KV_AI void qv_row(const kv_mm_args *a, kv_type t, int64_t r) {
    const int64_t nb = a->K / KV_QK;
    const size_t bs = kv_mm_qblk_bytes(t);
    const uint8_t *row = a->w + (size_t)r * a->nb1;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps(), mt = _mm256_setzero_ps();
    _Alignas(32) float mw8[8], ds8[8];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * bs;
        __builtin_prefetch(blk + QV_PF_BYTES, 0, 3);
        const __m256i wv = q_load(t, blk);
        const __m256i av = _mm256_loadu_si256((const __m256i *)(const void *)(a->a.qs + (size_t)b * KV_QK));
        __m256i p;
        if (t == KV_TYPE_Q8_0) {
            p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv)), ones);
        } else {
            p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), ones);
            if (t == KV_TYPE_Q4_0 || t == KV_TYPE_Q5_0)
                p = _mm256_add_epi32(p, _mm256_zextsi128_si256(_mm_cvtsi32_si128(a->a.ioff[b])));
        }
        const float dw = _cvtsh_ss(kv_mm_rd16(blk));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a->a.d[b]), acc);
        if (t == KV_TYPE_Q4_1) {
            mw8[b & 7] = _cvtsh_ss(kv_mm_rd16(blk + 2));
            ds8[b & 7] = a->a.ds[b];
            if ((b & 7) == 7 || b == nb - 1) {
                for (int64_t z = (b & 7) + 1; z < 8; z++) mw8[z] = ds8[z] = 0.0f;
                mt = _mm256_fmadd_ps(_mm256_load_ps(mw8), _mm256_load_ps(ds8), mt);
            }
        }
    }
    a->y[r] = kv_hsum256(acc) + (t == KV_TYPE_Q4_1 ? kv_hsum256(mt) : 0.0f);
}

typedef void (*qd_fn)(const kv_mm_args *a, int64_t r, int j0, int J, const qtile_scr *sc);

/* Passes of QJB activation rows outside, row tiles inside, activation
 * pairs innermost: a 4-row tile (a few KB) stays in L1 while the pass's
 * pairs go over it, and the pass's quants stay in L1/L2 for every tile.
 * The tiling does not touch any output's arithmetic. */
static void q_rows(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, void *scratch, qd_fn f4, qd_fn f1) {
    if (a->n == 1) {
        for (int64_t r = r0; r < r1; r++) {
            if (t == KV_TYPE_Q8_0) qv_row(a, KV_TYPE_Q8_0, r);
            else if (t == KV_TYPE_Q4_0) qv_row(a, KV_TYPE_Q4_0, r);
            else if (t == KV_TYPE_Q5_0) qv_row(a, KV_TYPE_Q5_0, r);
            else qv_row(a, KV_TYPE_Q4_1, r);
        }
        return;
    }
    const int64_t nb = a->K / KV_QK;
    const size_t bs = kv_mm_qblk_bytes(t);
    qtile_scr sc = qtile_layout(scratch, nb);
    for (int p0 = 0; p0 < a->n; p0 += QJB) {
        const int p1 = KV_MIN(a->n, p0 + QJB);
        qtile_gather(a, t, p0, p1 - p0, &sc);
        for (int64_t r = r0; r < r1;) {
            int R = r + 4 <= r1 ? 4 : 1;
            /* the next tile's rows (contiguous) on their way to L1 while
             * this one computes: with few activation rows the weights come
             * from memory, and without this the first touch (the scale
             * extraction) waited (one row takes qv_row instead) */
            const uint8_t *nx = a->w + (size_t)(r + R) * a->nb1;
            const size_t nxb = (size_t)(KV_MIN(r1, r + R + 4) - (r + R)) * a->nb1;
            for (size_t o = 0; o < nxb; o += 64) _mm_prefetch((const char *)(nx + o), _MM_HINT_T0);
            for (int rr = 0; rr < R; rr++) {
                const uint8_t *row = a->w + (size_t)(r + rr) * a->nb1;
                extract_f16(row, bs, 0, nb, sc.nbp, sc.tmp, sc.dwf + rr * sc.nbp);
                if (t == KV_TYPE_Q4_1) extract_f16(row, bs, 2, nb, sc.nbp, sc.tmp, sc.mwf + rr * sc.nbp);
            }
            for (int j0 = p0; j0 < p1; j0 += 2) (R == 4 ? f4 : f1)(a, r, j0, KV_MIN(p1 - j0, 2), &sc);
            r += R;
        }
    }
}

/* Per quantized type t: the R-row tile (R = 4, 1) for 1 or 2 activation
 * rows, and the type's row function (t a constant in each). */
#define QD_R(t, R)                                                                                                     \
    static void qd_##R##_##t(const kv_mm_args *a, int64_t r, int j0, int J, const qtile_scr *sc) {                     \
        if (J == 2)                                                                                                    \
            qd_tile(a, t, r, R, j0, 2, sc);                                                                            \
        else                                                                                                           \
            qd_tile(a, t, r, R, j0, 1, sc);                                                                            \
    }
#define QD(t)                                                                                                          \
    QD_R(t, 4)                                                                                                         \
    QD_R(t, 1)                                                                                                         \
    static void rows_##t(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {                                 \
        q_rows(a, t, r0, r1, scratch, qd_4_##t, qd_1_##t);                                                             \
    }
QD(KV_TYPE_Q8_0)
QD(KV_TYPE_Q4_0)
QD(KV_TYPE_Q4_1)
QD(KV_TYPE_Q5_0)

/* ---- float tiles --------------------------------------------------------- */

KV_AI __m256 ldw(kv_type t, const uint8_t *row, int64_t k) {
    if (t == KV_TYPE_F32) return _mm256_loadu_ps((const float *)(const void *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k));
    if (t == KV_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Scalar element k of a row, as f32. */
KV_AI float ldw1(kv_type t, const uint8_t *row, int64_t k) {
    if (t == KV_TYPE_F32) {
        float v;
        memcpy(&v, row + 4 * k, 4);
        return v;
    }
    uint16_t h = kv_mm_rd16(row + 2 * k);
    if (t == KV_TYPE_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* In-register transpose of an 8x8 float tile. */
KV_AI void tr8(__m256 r[8]) {
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* Packs `rows` (<= 16) rows of K elements of type t, row i at base + i *
 * stride bytes, k-major as dst[k][16] in f32: the weight panels and the
 * activation groups (kv_mm_args.xp) alike. Missing rows and the k tail
 * beyond K are zero-filled through a small staging copy. */
KV_AI void pack16(const uint8_t *base, size_t stride, kv_type t, int rows, int64_t K, float *dst) {
    for (int64_t k = 0; k < K; k += 8) {
        int nk = (int)KV_MIN((int64_t)8, K - k);
        for (int half = 0; half < 2; half++) {
            __m256 v[8];
            for (int i = 0; i < 8; i++) {
                int rr = half * 8 + i;
                if (rr >= rows) {
                    v[i] = _mm256_setzero_ps();
                } else if (nk == 8) {
                    v[i] = ldw(t, base + (size_t)rr * stride, k);
                } else {
                    float tmp[8] = {0};
                    for (int kk = 0; kk < nk; kk++) tmp[kk] = ldw1(t, base + (size_t)rr * stride, k + kk);
                    v[i] = _mm256_loadu_ps(tmp);
                }
            }
            tr8(v);
            for (int i = 0; i < nk; i++) _mm256_storeu_ps(dst + (k + i) * 16 + half * 8, v[i]);
        }
    }
}

_Static_assert(KV_MM_XGROUP == 16, "pack16 writes the activation groups");

void kv_mm_xpack_avx2(const float *src, int rows, int64_t K, float *dst) {
    pack16((const uint8_t *)src, (size_t)K * sizeof(float), KV_TYPE_F32, rows, K, dst);
}

/* y rows j0..j0+J (xg: their packed activations, 16 floats per k) x panel
 * rows r0..r0+rows, over k in [k0, k1); adds to y when k0 > 0. */
KV_AI void fp_kernel(const kv_mm_args *a, const float *pf, const float *xg, int64_t k0, int64_t k1, int64_t r0,
                     int rows, int j0, const int J) {
    __m256 acc[6][2];
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), idx);
    __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows - 8), idx);
#pragma GCC unroll 6
    for (int jj = 0; jj < J; jj++) {
        float *yj = a->y + (size_t)(j0 + jj) * a->M + r0;
        if (k0 == 0) {
            acc[jj][0] = acc[jj][1] = _mm256_setzero_ps();
        } else {
            acc[jj][0] = _mm256_maskload_ps(yj, m0);
            acc[jj][1] = _mm256_maskload_ps(yj + 8, m1);
        }
    }
    const float *xk = xg + k0 * KV_MM_XGROUP;
    const float *wk = pf + k0 * 16;
    for (int64_t k = k0; k < k1; k++, xk += KV_MM_XGROUP, wk += 16) {
        __m256 w0 = _mm256_load_ps(wk), w1 = _mm256_load_ps(wk + 8);
#pragma GCC unroll 6
        for (int jj = 0; jj < J; jj++) {
            __m256 xb = _mm256_broadcast_ss(xk + jj);
            acc[jj][0] = _mm256_fmadd_ps(w0, xb, acc[jj][0]);
            acc[jj][1] = _mm256_fmadd_ps(w1, xb, acc[jj][1]);
        }
    }
    if (rows == 16) {
#pragma GCC unroll 6
        for (int jj = 0; jj < J; jj++) {
            float *yj = a->y + (size_t)(j0 + jj) * a->M + r0;
            _mm256_storeu_ps(yj, acc[jj][0]);
            _mm256_storeu_ps(yj + 8, acc[jj][1]);
        }
    } else {
        /* partial panel: lanes past `rows` (m0, m1) are not ours */
#pragma GCC unroll 6
        for (int jj = 0; jj < J; jj++) {
            float *yj = a->y + (size_t)(j0 + jj) * a->M + r0;
            _mm256_maskstore_ps(yj, m0, acc[jj][0]);
            _mm256_maskstore_ps(yj + 8, m1, acc[jj][1]);
        }
    }
}

/* A group of `left` activation rows: fp_kernel 6 at a time, then the rest. */
static void fp_group(const kv_mm_args *a, const float *pf, const float *xg, int64_t k0, int64_t k1, int64_t r0, int rows,
                     int g0, int left) {
    int jo = 0;
    for (; left - jo >= 6; jo += 6) fp_kernel(a, pf, xg + jo, k0, k1, r0, rows, g0 + jo, 6);
    switch (left - jo) {
    case 5: fp_kernel(a, pf, xg + jo, k0, k1, r0, rows, g0 + jo, 5); break;
    case 4: fp_kernel(a, pf, xg + jo, k0, k1, r0, rows, g0 + jo, 4); break;
    case 3: fp_kernel(a, pf, xg + jo, k0, k1, r0, rows, g0 + jo, 3); break;
    case 2: fp_kernel(a, pf, xg + jo, k0, k1, r0, rows, g0 + jo, 2); break;
    case 1: fp_kernel(a, pf, xg + jo, k0, k1, r0, rows, g0 + jo, 1); break;
    default: break;
    }
}

/* Rows r0..r1 of float weights of type t, a panel of 16 at a time packed
 * to scratch, against the packed activations. */
KV_AI void f_packed(const kv_mm_args *a, kv_type t, int64_t r0, int64_t r1, void *scratch) {
    float *pf = scratch;
    for (int64_t r = r0; r < r1; r += KV_MM_PANEL) {
        int rows = (int)KV_MIN(r1 - r, (int64_t)KV_MM_PANEL);
        pack16(a->w + (size_t)r * a->nb1, a->nb1, t, rows, a->K, pf);
        kv_mm_panel_groups(a, pf, r, rows, fp_group);
    }
}

/* ---- direct float tiles (small n) ---------------------------------------- */

/* Decode-sized n: weight rows transposed in registers, 8 rows x 8 k at a
 * time, into fp_kernel's fma chain (per row lane and activation row:
 * acc = fma(w[k], x[k], acc) for k = 0 .. K-1), so a row's result is the
 * packed path's to the bit whatever the batch size (batch invariance). The
 * chain is serial, so T groups of 8 rows (T = 2: a 16-row tile) run side by
 * side. Rows past `rows` are never stored. */
KV_AI void fd8(const kv_mm_args *a, kv_type t, const uint8_t *w, size_t ws, int64_t r0, int rows, int j0, const int J,
               const int T) {
    const int64_t K = a->K;
    const float *xs[2];
    __m256 acc[2][2];
#pragma GCC unroll 2
    for (int jj = 0; jj < J; jj++) xs[jj] = a->x + (size_t)(j0 + jj) * K;
#pragma GCC unroll 2
    for (int ti = 0; ti < T; ti++)
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) acc[ti][jj] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
#pragma GCC unroll 2
        for (int ti = 0; ti < T; ti++) {
            __m256 v[8];
#pragma GCC unroll 8
            for (int rr = 0; rr < 8; rr++) v[rr] = ldw(t, w + (size_t)(8 * ti + rr) * ws, k);
            tr8(v);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
#pragma GCC unroll 2
                for (int jj = 0; jj < J; jj++)
                    acc[ti][jj] = _mm256_fmadd_ps(v[i], _mm256_set1_ps(xs[jj][k + i]), acc[ti][jj]);
        }
    }
    if (k < K) {
        const int nk = (int)(K - k);
        for (int ti = 0; ti < T; ti++) {
            __m256 v[8];
            for (int rr = 0; rr < 8; rr++) {
                float tmp[8] = {0};
                for (int kk = 0; kk < nk; kk++) tmp[kk] = ldw1(t, w + (size_t)(8 * ti + rr) * ws, k + kk);
                v[rr] = _mm256_loadu_ps(tmp);
            }
            tr8(v);
            for (int i = 0; i < nk; i++)
#pragma GCC unroll 2
                for (int jj = 0; jj < J; jj++)
                    acc[ti][jj] = _mm256_fmadd_ps(v[i], _mm256_set1_ps(xs[jj][k + i]), acc[ti][jj]);
        }
    }
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 2
    for (int ti = 0; ti < T; ti++) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows - 8 * ti), idx);
#pragma GCC unroll 2
        for (int jj = 0; jj < J; jj++) {
            float *yp = a->y + (size_t)(j0 + jj) * a->M + r0 + 8 * ti;
            if (rows - 8 * ti >= 8)
                _mm256_storeu_ps(yp, acc[ti][jj]);
            else if (rows - 8 * ti > 0)
                _mm256_maskstore_ps(yp, m, acc[ti][jj]);
        }
    }
}

typedef void (*fd_fn)(const kv_mm_args *a, const uint8_t *w, size_t ws, int64_t r0, int rows, int T);

static void f_direct(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch, fd_fn f) {
    const size_t rb = (size_t)a->K * kv_type_get(a->type)->type_size; /* bytes of a row's elements */
    int64_t r = r0;
    for (; r + 16 <= r1; r += 16) f(a, a->w + (size_t)r * a->nb1, a->nb1, r, 16, 2);
    if (r < r1) { /* partial tile: copied, missing rows repeat the first (not stored) */
        int rows = (int)(r1 - r), T = rows > 8 ? 2 : 1;
        uint8_t *tw = scratch;
        kv_mm_copy_tile(a, r, rows, 8 * T, rb, tw);
        f(a, tw, rb, r, rows, T);
    }
}

/* Per float type t: one 16-row tile (T = 2) or 8-row group (T = 1) against
 * every activation row, and the type's row function (packed x or direct). */
#define FD_FN(t)                                                                                                       \
    static void fd_##t(const kv_mm_args *a, const uint8_t *w, size_t ws, int64_t r0, int rows, int T) {              \
        int j0 = 0;                                                                                                    \
        if (T == 2) {                                                                                                  \
            for (; j0 + 2 <= a->n; j0 += 2) fd8(a, t, w, ws, r0, rows, j0, 2, 2);                                     \
            if (j0 < a->n) fd8(a, t, w, ws, r0, rows, j0, 1, 2);                                                       \
        } else {                                                                                                       \
            for (; j0 + 2 <= a->n; j0 += 2) fd8(a, t, w, ws, r0, rows, j0, 2, 1);                                     \
            if (j0 < a->n) fd8(a, t, w, ws, r0, rows, j0, 1, 1);                                                       \
        }                                                                                                              \
    }                                                                                                                  \
    static void rows_##t(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {                                 \
        if (a->xp)                                                                                                     \
            f_packed(a, t, r0, r1, scratch);                                                                           \
        else                                                                                                           \
            f_direct(a, r0, r1, scratch, fd_##t);                                                                      \
    }
FD_FN(KV_TYPE_F32)
FD_FN(KV_TYPE_F16)
FD_FN(KV_TYPE_BF16)

/* ---- entry --------------------------------------------------------------- */

void kv_mm_rows_avx2(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {
    static const kv_mm_rows_fn rows[KV_TYPE_COUNT] = KV_MM_ROWS_TABLE;
    kv_mm_rows_typed(rows, a, r0, r1, scratch);
}

KV_SIMD_TARGET_END

#endif
