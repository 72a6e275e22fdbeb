/* quant_ext.c - Q5_0, Q5_1, Q8_1 and the K-quants (Q4_K, Q5_K, Q6_K, Q8_K):
 * exact dequantizers, ggml's reference quantizers (including the iterative
 * scale/min search of the K-quants), the activation quantizers, the scalar
 * dot products that are the oracle for the SIMD ones (quant_ext_avx2.c,
 * quant_ext_avx512.c), and the run-time choice between them. */
#include "quant_ext.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "quant_ext_isa.h"


/* ------------------------------------------------------------------ */
/* helpers                                                            */

static inline float h2f(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return kv_fp16_to_fp32(v);
}
static inline void f2h(void *p, float f) {
    uint16_t v = kv_fp32_to_fp16(f);
    memcpy(p, &v, 2);
}

/* Round to nearest, ties to even, as ggml's nearest_int: exact for
 * |f| <= 2^22, which every caller guarantees for finite input. The bit
 * trick (not a float->int cast) keeps NaN/inf from being undefined
 * behaviour; callers clamp the result. */
static inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* trunc(v) clamped to [0, hi]; NaN gives 0. For finite input it equals
 * ggml's MIN(hi, (int8_t)v) on the ranges its quantizers produce. */
static inline unsigned trunc_clamp(float v, unsigned hi) {
    if (!(v > 0.0f)) return 0;
    return v >= (float)hi ? hi : (unsigned)v;
}

/* roundf clamped to [-127, 127] (NaN gives 0), for the 8-bit quantizers. */
static inline int8_t round_i8(float v) {
    if (!(v == v)) return 0;
    float r = roundf(v);
    if (r > 127.f) r = 127.f;
    if (r < -127.f) r = -127.f;
    return (int8_t)r;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* 6-bit scale and min of sub-block j of a q4_K/q5_K super-block. */
static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Packs eight 6-bit scales and mins into the 12-byte q4_K/q5_K layout. */
static void k4_pack_scales(const uint8_t ls[8], const uint8_t lm[8], uint8_t out[12]) {
    memset(out, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            out[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            out[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* The quants of a q5_0 / q5_1 block in element order, minus `zero` (16 for
 * q5_0's signed values, 0 for q5_1): nibble of qs plus the 5th bit from qh. */
static inline void q5_values(const uint8_t qs[16], const uint8_t qh4[4], int zero, int8_t v[32]) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int j = 0; j < 16; j++) {
        v[j] = (int8_t)((int)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - zero);
        v[j + 16] = (int8_t)((int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - zero);
    }
}

/* The quants of a q4_K (qh NULL) or q5_K super-block in element order:
 * element 64g + l (l < 32) is the low nibble of qs[32g + l], 64g + 32 + l
 * its high nibble; q5_K adds bit 2g (resp. 2g + 1) of qh[l] as 16. */
static inline void k4_values(const uint8_t qs[128], const uint8_t *qh, int8_t v[256]) {
    for (int g = 0; g < 4; g++, qs += 32, v += 64) {
        for (int l = 0; l < 32; l++) {
            v[l] = (int8_t)((qs[l] & 0xF) | (qh ? ((qh[l] >> (2 * g)) & 1) << 4 : 0));
            v[l + 32] = (int8_t)((qs[l] >> 4) | (qh ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0));
        }
    }
}

/* The quants of a q6_K super-block in element order, in [-32, 31]: per
 * half h, ql's low nibbles are elements 0..63, its high nibbles 64..127,
 * each with two bits of qh[32h + l] at shifts 0/2 (low) and 4/6 (high). */
static inline void q6_values(const kv_block_q6_K *x, int8_t q[256]) {
    const uint8_t *ql = x->ql, *qh = x->qh;
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, q += 128) {
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

/* sum of q[j] * a[j] for j < n (exact in int for n <= 256). */
static inline int isum_i8(const int8_t *q, const int8_t *a, int n) {
    int s = 0;
    for (int j = 0; j < n; j++) s += q[j] * a[j];
    return s;
}

/* ggml's 8-bit block scale: d = amax / 127 of the 32 values; *id = 1 / d
 * (0 for an all-zero block). Stores d as fp16 at dh. */
static float q8_block_scale(const float *x, void *dh, float *id) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127;
    *id = d ? 1.0f / d : 0.0f;
    f2h(dh, d);
    return d;
}

#define GROUP_MAX_EPS 1e-15f

/* ggml's make_qx_quants (rmse_type 1, no importance weights): symmetric
 * quants L in [0, 2*nmax) for n values, trying 19 scales around nmax/max and
 * keeping the one with the best weighted (x^2) least-squares fit. Returns
 * the scale (value = scale * (L - nmax)). */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (!(amax >= GROUP_MAX_EPS)) { /* all (near) zero, or NaN */
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* ggml's make_qkx2_quants: asymmetric quants L in [0, nmax] with value =
 * scale * L - min. Starts from the min/max fit, then tries nstep+1 scales
 * (nmax + rmin + rdelta*is)/(max - min) and, for each, the weighted
 * least-squares scale and min for those L; keeps the lowest weighted squared
 * error. *the_min receives min >= 0 (stored negated, as ggml does). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (!(max > min)) { /* constant block (or NaN): everything is the min */
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_mad = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)clampi(l, 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best_mad += weights[i] * (diff * diff); /* ggml's association: same rounding, same choices */
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float mad = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                mad += weights[i] * (diff * diff);
            }
            if (mad < best_mad) {
                memcpy(L, Laux, (size_t)n);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ------------------------------------------------------------------ */
/* 32-element types                                                   */

static void deq_q5_0(const void *src, float *y, int64_t n) {
    const kv_block_q5_0 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = h2f(&x[i].d);
        int8_t v[32];
        q5_values(x[i].qs, x[i].qh, 16, v);
        for (int j = 0; j < 32; j++) y[j] = v[j] * d;
    }
}

static void deq_q5_1(const void *src, float *y, int64_t n) {
    const kv_block_q5_1 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = h2f(&x[i].d), m = h2f(&x[i].m);
        int8_t v[32];
        q5_values(x[i].qs, x[i].qh, 0, v);
        for (int j = 0; j < 32; j++) y[j] = v[j] * d + m;
    }
}

static void deq_q8_1(const void *src, float *y, int64_t n) {
    const kv_block_q8_1 *x = src;
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = h2f(&x[i].d);
        for (int j = 0; j < 32; j++) y[j] = x[i].qs[j] * d;
    }
}

/* Packs 32 quants in [0, 31] into q5 nibbles + high-bit word. */
static void pack_q5(const uint8_t L[32], uint8_t qs[16], uint8_t qh_out[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
        qh |= ((L[j] & 0x10u) >> 4) << j;
        qh |= ((L[j + 16] & 0x10u) >> 4) << (j + 16);
    }
    memcpy(qh_out, &qh, 4);
}

/* ggml's quantize_row_q5_0_ref: d = max / -16 where max is the value of
 * largest magnitude, q = trunc(x/d + 16.5) clamped to 31. */
static void quant_q5_0(const float *x, void *dst, int64_t n) {
    kv_block_q5_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(&y[i].d, d);
        uint8_t L[32];
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)trunc_clamp(x[j] * id + 16.5f, 31);
        pack_q5(L, y[i].qs, y[i].qh);
    }
}

/* ggml's quantize_row_q5_1_ref: d = (max - min) / 31, m = min,
 * q = trunc((x - min)/d + 0.5). */
static void quant_q5_1(const float *x, void *dst, int64_t n) {
    kv_block_q5_1 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        f2h(&y[i].d, d);
        f2h(&y[i].m, min);
        uint8_t L[32];
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)trunc_clamp((x[j] - min) * id + 0.5f, 31);
        pack_q5(L, y[i].qs, y[i].qh);
    }
}

/* ggml's quantize_row_q8_1_ref: d = amax / 127, q = roundf(x / d),
 * s = d * sum(q). */
static void quant_q8_1(const float *x, void *dst, int64_t n) {
    kv_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float id;
        const float d = q8_block_scale(x, &y[i].d, &id);
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[i].qs[j] = round_i8(x[j] * id);
            sum += y[i].qs[j];
        }
        f2h(&y[i].s, (float)sum * d);
    }
}

/* ggml's quantize_row_q8_0_ref (the activation side of the q5_0 dot). */
static void quant_q8_0(const float *x, void *dst, int64_t n) {
    qx_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float id;
        q8_block_scale(x, &y[i].d, &id);
        for (int j = 0; j < 32; j++) y[i].qs[j] = round_i8(x[j] * id);
    }
}

/* ------------------------------------------------------------------ */
/* K-quants                                                           */

/* One q4_K / q5_K super-block (quants v, as k4_values gives them) to
 * floats: sub-block j is d * scale_j * q - dmin * min_j. */
static void deq_k4_block(const uint16_t *dh, const uint16_t *dminh, const uint8_t *scales, const int8_t v[256],
                         float *y) {
    const float d = h2f(dh), min = h2f(dminh);
    for (int j = 0; j < 8; j++, v += 32, y += 32) {
        uint8_t sc, m;
        k4_scale_min(j, scales, &sc, &m);
        const float dj = d * sc, mj = min * m;
        for (int l = 0; l < 32; l++) y[l] = dj * v[l] - mj;
    }
}

static void deq_q4_K(const void *src, float *y, int64_t n) {
    const kv_block_q4_K *x = src;
    int8_t v[256];
    for (int64_t i = 0; i < n / KV_QK_K; i++, y += KV_QK_K) {
        k4_values(x[i].qs, NULL, v);
        deq_k4_block(&x[i].d, &x[i].dmin, x[i].scales, v, y);
    }
}

static void deq_q5_K(const void *src, float *y, int64_t n) {
    const kv_block_q5_K *x = src;
    int8_t v[256];
    for (int64_t i = 0; i < n / KV_QK_K; i++, y += KV_QK_K) {
        k4_values(x[i].qs, x[i].qh, v);
        deq_k4_block(&x[i].d, &x[i].dmin, x[i].scales, v, y);
    }
}

static void deq_q6_K(const void *src, float *y, int64_t n) {
    const kv_block_q6_K *x = src;
    int8_t q[256];
    for (int64_t i = 0; i < n / KV_QK_K; i++, y += KV_QK_K) {
        const float d = h2f(&x[i].d);
        q6_values(&x[i], q);
        /* element e is in sub-block e / 16 */
        for (int e = 0; e < KV_QK_K; e++) y[e] = d * x[i].scales[e / 16] * q[e];
    }
}

static void deq_q8_K(const void *src, float *y, int64_t n) {
    const kv_block_q8_K *x = src;
    for (int64_t i = 0; i < n / KV_QK_K; i++, y += KV_QK_K) {
        float d;
        memcpy(&d, &x[i].d, 4);
        for (int j = 0; j < KV_QK_K; j++) y[j] = d * x[i].qs[j];
    }
}

/* q4_K and q5_K share everything but the quant range and search knobs:
 * per sub-block of 32 a make_qkx2 fit weighted by av_x + |x| (ggml's
 * no-imatrix weights), the 8 scales and mins quantized to 6 bits against
 * the super-block's largest, then every element re-quantized with the
 * final (rounded) scales. L receives quants in [0, nmax]. */
static void quant_k4_common(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out,
                            uint16_t *dmin_out, uint8_t scales_out[12], uint8_t L[256]) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                     nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        /* NOTE: ggml stores nearest_int into a uint8_t before MIN(63, .), so a
         * negative fitted scale (possible for a sub-block of only negative
         * values) wraps to 63, not 0; kept for byte-identical output. */
        const uint8_t s = (uint8_t)nearest_int(inv_scale * scales[j]), m = (uint8_t)nearest_int(inv_min * mins[j]);
        ls[j] = s < 63 ? s : 63;
        lm[j] = m < 63 ? m : 63;
    }
    k4_pack_scales(ls, lm, scales_out);
    uint16_t hd = kv_fp32_to_fp16(max_scale / 63.f), hm = kv_fp32_to_fp16(max_min / 63.f);
    memcpy(d_out, &hd, 2);
    memcpy(dmin_out, &hm, 2);
    const float fd = kv_fp16_to_fp32(hd), fm = kv_fp16_to_fp32(hm);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        k4_scale_min(j, scales_out, &sc, &m);
        const float d = fd * sc;
        if (!d) continue;
        const float dm = fm * m;
        for (int ii = 0; ii < 32; ii++) L[32 * j + ii] = (uint8_t)clampi(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

static void quant_q4_K(const float *x, void *dst, int64_t n) {
    kv_block_q4_K *y = dst;
    uint8_t L[256];
    for (int64_t i = 0; i < n / KV_QK_K; i++, x += KV_QK_K) {
        quant_k4_common(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < KV_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void quant_q5_K(const float *x, void *dst, int64_t n) {
    kv_block_q5_K *y = dst;
    uint8_t L[256];
    for (int64_t i = 0; i < n / KV_QK_K; i++, x += KV_QK_K) {
        quant_k4_common(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int g = 0; g < KV_QK_K; g += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[g + j], l2 = L[g + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

/* ggml's quantize_row_q6_K_ref: a make_qx_quants fit per sub-block of 16,
 * the 16 scales quantized to int8 against the largest (d = max / -128),
 * then the elements re-quantized with the final scales. */
static void quant_q6_K(const float *x, void *dst, int64_t n) {
    kv_block_q6_K *y = dst;
    int8_t L[256];
    float scales[16];
    for (int64_t i = 0; i < n / KV_QK_K; i++, x += KV_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (!(max_abs_scale >= GROUP_MAX_EPS)) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.f / max_scale;
        f2h(&y[i].d, 1 / iscale);
        for (int ib = 0; ib < 16; ib++) y[i].scales[ib] = (int8_t)clampi(nearest_int(iscale * scales[ib]), -128, 127);
        const float fd = h2f(&y[i].d);
        for (int j = 0; j < 16; j++) {
            const float d = fd * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < KV_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

/* ggml's quantize_row_q8_K_ref: d = max / -127 (max = value of largest
 * magnitude), q = nearest(x / d), bsums = sums over groups of 16. */
static void quant_q8_K(const float *x, void *dst, int64_t n) {
    kv_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / KV_QK_K; i++, x += KV_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < KV_QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        kv_block_q8_K b;
        memset(&b, 0, sizeof b);
        if (amax > 0) {
            const float iscale = -127.f / max;
            for (int j = 0; j < KV_QK_K; j++) b.qs[j] = (int8_t)clampi(nearest_int(iscale * x[j]), -127, 127);
            for (int g = 0; g < 16; g++) {
                int sum = 0;
                for (int l = 0; l < 16; l++) sum += b.qs[16 * g + l];
                b.bsums[g] = (int16_t)sum;
            }
            b.d = 1 / iscale;
        }
        memcpy(&y[i], &b, sizeof b);
    }
}

/* ------------------------------------------------------------------ */
/* scalar dot products (the oracle)                                   */

/* Each reference dot is a per-block function summed over the blocks in
 * order (dot_blocks): the integer part exact, one float step per block. */
typedef float (*blk_dot_fn)(const void *w, const void *a);

static inline float dot_blocks(int64_t nb, const void *w, size_t wsize, const void *a, size_t asize, blk_dot_fn f) {
    const uint8_t *pw = w, *pa = a;
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) sum += f(pw + (size_t)i * wsize, pa + (size_t)i * asize);
    return sum;
}

static inline float q8k_d(const kv_block_q8_K *b) {
    float d;
    memcpy(&d, &b->d, 4);
    return d;
}

static float blk_q5_0(const void *w, const void *a) {
    const kv_block_q5_0 *x = w;
    const qx_block_q8_0 *y = a;
    int8_t v[32];
    q5_values(x->qs, x->qh, 16, v);
    return h2f(&x->d) * h2f(&y->d) * (float)isum_i8(v, y->qs, 32);
}

/* sum_j (q_j d + m) a_j d_a = d d_a sum(q a) + m * (d_a sum(a)) = ... + m * s */
static float blk_q5_1(const void *w, const void *a) {
    const kv_block_q5_1 *x = w;
    const kv_block_q8_1 *y = a;
    int8_t v[32];
    q5_values(x->qs, x->qh, 0, v);
    return h2f(&x->d) * h2f(&y->d) * (float)isum_i8(v, y->qs, 32) + h2f(&x->m) * h2f(&y->s);
}

/* q8_1 weights (d, s, qs) against q8_0 activations: s is not needed. */
static float blk_q8_1(const void *w, const void *a) {
    const kv_block_q8_1 *x = w;
    const qx_block_q8_0 *y = a;
    return h2f(&x->d) * h2f(&y->d) * (float)isum_i8(x->qs, y->qs, 32);
}

/* q4_K / q5_K (quants v from k4_values): d * sum_j sc_j (q . a)_j minus
 * dmin * sum_j m_j * (the activations' sum over sub-block j). */
static float k4_block_dot(const uint16_t *dh, const uint16_t *dminh, const uint8_t *scales, const int8_t v[256],
                          const kv_block_q8_K *y) {
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        k4_scale_min(j, scales, &sc, &m);
        sumi += sc * isum_i8(v + 32 * j, y->qs + 32 * j, 32);
        summ += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    const float dy = q8k_d(y);
    return h2f(dh) * dy * (float)sumi - h2f(dminh) * dy * (float)summ;
}

static float blk_q4_K(const void *w, const void *a) {
    const kv_block_q4_K *x = w;
    int8_t v[256];
    k4_values(x->qs, NULL, v);
    return k4_block_dot(&x->d, &x->dmin, x->scales, v, a);
}

static float blk_q5_K(const void *w, const void *a) {
    const kv_block_q5_K *x = w;
    int8_t v[256];
    k4_values(x->qs, x->qh, v);
    return k4_block_dot(&x->d, &x->dmin, x->scales, v, a);
}

static float blk_q6_K(const void *w, const void *a) {
    const kv_block_q6_K *x = w;
    const kv_block_q8_K *y = a;
    int8_t q[256];
    q6_values(x, q);
    int sumi = 0;
    for (int j = 0; j < 16; j++) sumi += x->scales[j] * isum_i8(q + 16 * j, y->qs + 16 * j, 16);
    return h2f(&x->d) * q8k_d(y) * (float)sumi;
}

static float blk_q8_K(const void *w, const void *a) {
    const kv_block_q8_K *x = w, *y = a;
    return q8k_d(x) * q8k_d(y) * (float)isum_i8(x->qs, y->qs, KV_QK_K);
}

/* The kv_qext_dot_fn of each type: n elements of blocks of qk. */
#define DOT_REF(name, wblock, ablock, qk)                                                                              \
    static float dot_##name##_ref(int64_t n, const void *w, const void *a) {                                           \
        return dot_blocks(n / (qk), w, sizeof(wblock), a, sizeof(ablock), blk_##name);                                 \
    }
DOT_REF(q5_0, kv_block_q5_0, qx_block_q8_0, 32)
DOT_REF(q5_1, kv_block_q5_1, kv_block_q8_1, 32)
DOT_REF(q8_1, kv_block_q8_1, qx_block_q8_0, 32)
DOT_REF(q4_K, kv_block_q4_K, kv_block_q8_K, KV_QK_K)
DOT_REF(q5_K, kv_block_q5_K, kv_block_q8_K, KV_QK_K)
DOT_REF(q6_K, kv_block_q6_K, kv_block_q8_K, KV_QK_K)
DOT_REF(q8_K, kv_block_q8_K, kv_block_q8_K, KV_QK_K)
#undef DOT_REF

/* ------------------------------------------------------------------ */
/* the table and the run-time choice                                  */

enum { OPS_Q5_0, OPS_Q5_1, OPS_Q8_1, OPS_Q4_K, OPS_Q5_K, OPS_Q6_K, OPS_Q8_K, OPS_COUNT };

static kv_qext_ops ops_tab[OPS_COUNT] = {
    [OPS_Q5_0] = {KV_TYPE_Q5_0, KV_TYPE_Q8_0, 32, deq_q5_0, quant_q5_0, quant_q8_0, dot_q5_0_ref, dot_q5_0_ref},
    [OPS_Q5_1] = {KV_TYPE_Q5_1, KV_TYPE_Q8_1, 32, deq_q5_1, quant_q5_1, quant_q8_1, dot_q5_1_ref, dot_q5_1_ref},
    [OPS_Q8_1] = {KV_TYPE_Q8_1, KV_TYPE_Q8_0, 32, deq_q8_1, quant_q8_1, quant_q8_0, dot_q8_1_ref, dot_q8_1_ref},
    [OPS_Q4_K] = {KV_TYPE_Q4_K, KV_TYPE_Q8_K, 256, deq_q4_K, quant_q4_K, quant_q8_K, dot_q4_K_ref, dot_q4_K_ref},
    [OPS_Q5_K] = {KV_TYPE_Q5_K, KV_TYPE_Q8_K, 256, deq_q5_K, quant_q5_K, quant_q8_K, dot_q5_K_ref, dot_q5_K_ref},
    [OPS_Q6_K] = {KV_TYPE_Q6_K, KV_TYPE_Q8_K, 256, deq_q6_K, quant_q6_K, quant_q8_K, dot_q6_K_ref, dot_q6_K_ref},
    [OPS_Q8_K] = {KV_TYPE_Q8_K, KV_TYPE_Q8_K, 256, deq_q8_K, quant_q8_K, quant_q8_K, dot_q8_K_ref, dot_q8_K_ref},
};

/* SIMD dots per level (index = kv_qext_isa; level 0 is ops_tab's ref). */
static const kv_qext_dot_fn simd_tab[3][OPS_COUNT] = {
#ifdef KV_QEXT_HAVE_X86
    [KV_QEXT_ISA_AVX2] = {kv_qext_dot_q5_0_avx2, kv_qext_dot_q5_1_avx2, kv_qext_dot_q8_1_avx2,
                          kv_qext_dot_q4_K_avx2, kv_qext_dot_q5_K_avx2, kv_qext_dot_q6_K_avx2,
                          kv_qext_dot_q8_K_avx2},
    [KV_QEXT_ISA_AVX512] = {kv_qext_dot_q5_0_avx512, kv_qext_dot_q5_1_avx512, kv_qext_dot_q8_1_avx512,
                            kv_qext_dot_q4_K_avx512, kv_qext_dot_q5_K_avx512, kv_qext_dot_q6_K_avx512,
                            kv_qext_dot_q8_K_avx512},
#else
    {0},
#endif
};

/* Tiled dots per level (NULL: none; the driver loops over vec_dot). */
static const kv_qext_rows_fn rows_tab[3][OPS_COUNT] = {
#ifdef KV_QEXT_HAVE_X86
    [KV_QEXT_ISA_AVX512] = {[OPS_Q5_0] = kv_qext_rows_q5_0_avx512, [OPS_Q4_K] = kv_qext_rows_q4_K_avx512,
                            [OPS_Q6_K] = kv_qext_rows_q6_K_avx512},
#else
    {0},
#endif
};

/* ops_tab's row of weight type t, or -1. */
static int ops_index(kv_type t) {
    for (int i = 0; i < OPS_COUNT; i++)
        if (ops_tab[i].type == t) return i;
    return -1;
}

static pthread_once_t pick_once = PTHREAD_ONCE_INIT;

static void pick_best(void) {
    kv_qext_isa isa = kv_qext_isa_best();
    if (isa == KV_QEXT_ISA_SCALAR) return;
    for (int i = 0; i < OPS_COUNT; i++) {
        if (simd_tab[isa][i]) ops_tab[i].vec_dot = simd_tab[isa][i];
        ops_tab[i].rows = rows_tab[isa][i];
        const kv_qext_from_f32_fn q = kv_qext_quant_act_isa(ops_tab[i].vec_type, isa);
        if (q) ops_tab[i].quantize_act_row = q;
    }
}

const kv_qext_ops *kv_qext_get(kv_type t) {
    int i = ops_index(t);
    if (i < 0) return NULL;
    pthread_once(&pick_once, pick_best);
    return &ops_tab[i];
}

kv_qext_dot_fn kv_qext_vec_dot_isa(kv_type t, kv_qext_isa isa) {
    int i = ops_index(t);
    if (i < 0 || !kv_qext_isa_available(isa)) return NULL;
    if (isa == KV_QEXT_ISA_SCALAR) return ops_tab[i].vec_dot_ref;
    return simd_tab[isa][i];
}

kv_qext_from_f32_fn kv_qext_quant_act_isa(kv_type vec_type, kv_qext_isa isa) {
    if (!kv_qext_isa_available(isa)) return NULL;
    if (isa == KV_QEXT_ISA_SCALAR)
        return vec_type == KV_TYPE_Q8_K ? quant_q8_K : vec_type == KV_TYPE_Q8_0 ? quant_q8_0
                                                     : vec_type == KV_TYPE_Q8_1 ? quant_q8_1 : NULL;
#ifdef KV_QEXT_HAVE_X86
    if (vec_type == KV_TYPE_Q8_K && isa == KV_QEXT_ISA_AVX512) return kv_qext_quant_q8_K_avx512;
#endif
    return NULL;
}

kv_qext_rows_fn kv_qext_rows_isa(kv_type t, kv_qext_isa isa) {
    int i = ops_index(t);
    if (i < 0 || !kv_qext_isa_available(isa)) return NULL;
    return rows_tab[isa][i];
}

size_t kv_qext_panel_bytes(kv_type t, int64_t K, int64_t M) {
    return M > 0 ? (size_t)((M + 15) / 16) * kv_qext_panel_stride(t, K) : 0;
}

/* A plain byte shuffle, once per weight: portable C. */
void kv_qext_panel_pack(kv_type t, const void *w, size_t ws, int64_t M, int64_t K, int64_t p0, int64_t p1,
                        uint8_t *dst) {
    if (!kv_qext_panel_bytes(t, K, M)) return;
    const int64_t nb = K / KV_QK_K;
    for (int64_t p = p0; p < p1; p++) {
        uint8_t *pp = dst + (size_t)p * kv_qext_panel_stride(t, K);
        memset(pp, 0, kv_qext_panel_stride(t, K)); /* rows past M */
        for (int rr = 0; rr < 16; rr++) {
            const int64_t r = p * 16 + rr;
            if (r >= M) break;
            const kv_block_q4_K *row = (const kv_block_q4_K *)(const void *)((const uint8_t *)w + (size_t)r * ws);
            for (int64_t c = 0; c < nb; c++) {
                const kv_block_q4_K *x = &row[c];
                uint8_t *sb = pp + (size_t)c * KV_QK4_PANEL_SB;
                memcpy(sb + 2 * rr, &x->d, 2);
                memcpy(sb + 32 + 2 * rr, &x->dmin, 2);
                for (int j = 0; j < 8; j++) {
                    uint8_t sc, m;
                    k4_scale_min(j, x->scales, &sc, &m);
                    sb[64 + 16 * j + rr] = sc;
                    sb[192 + 16 * j + rr] = m;
                    /* element 32j + l: sub-block j's nibble of qs[32 (j / 2) + l] */
                    const uint8_t *q = x->qs + 32 * (j / 2);
                    const int sh = 4 * (j & 1);
                    for (int g = 0; g < 4; g++)
                        for (int i = 0; i < 4; i++) {
                            const uint8_t lo = (q[4 * g + i] >> sh) & 15, hi = (q[16 + 4 * g + i] >> sh) & 15;
                            sb[320 + 256 * j + 64 * g + 4 * rr + i] = (uint8_t)(lo | hi << 4);
                        }
                }
            }
        }
    }
}

kv_qext_panels_fn kv_qext_panels_isa(kv_type t, kv_qext_isa isa) {
#ifdef KV_QEXT_HAVE_X86
    if (t == KV_TYPE_Q4_K && isa == KV_QEXT_ISA_AVX512 && kv_qext_isa_available(isa)) return kv_qext_panels_q4_K_avx512;
#else
    (void)t;
    (void)isa;
#endif
    return NULL;
}

void kv_qext_init(void) {
    pthread_once(&pick_once, pick_best);
}

int kv_qext_quantize_act(kv_type vec_type, const float *src, void *dst, int64_t n) {
    /* the activation quantizer of vec_type is the one of any weight type
     * whose dots read vec_type (ops_tab pairs them) */
    for (int i = 0; i < OPS_COUNT; i++) {
        if (ops_tab[i].vec_type != vec_type) continue;
        if (n < 0 || n % kv_type_get(vec_type)->blck_size) return -1;
        ops_tab[i].quantize_act_row(src, dst, n);
        return 0;
    }
    return -1;
}
