/* quant_ext_avx512.c - AVX-512 dot products for quant_ext's types, compiled
 * for that target with a file-wide pragma, as matmul_avx512.c is, and
 * chosen at run time by quant_ext.c. Two 32-element blocks (or two K
 * sub-blocks) per 512-bit register; VNNI dpbusd for the types with one
 * scale per 32, maddubs + madd with per-lane scales for the K-quants (their
 * 6/8-bit sub-block scales must multiply before the sum). Same integer sums
 * as the scalar reference. Q5_0, Q4_K and Q6_K are not here: their dots
 * are the 1 x 1 case of the tiles in quant_ext_q5_512.c / quant_ext_k512.c. */
#include "quant_ext_simd.h"

#ifdef KV_QEXT_HAVE_X86

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

/* Signed bytes x signed bytes -> 16 int32 sums of 4, via |x| and y with
 * x's sign (negated where x < 0), then VNNI. */
static inline __m512i dp_i8_512(__m512i acc, __m512i x, __m512i y) {
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(x), sy);
}

/* Two 32-byte halves into one 512-bit register. */
static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
static inline __m512i load2x256(const void *lo, const void *hi) {
    return join256(_mm256_loadu_si256((const __m256i *)lo), _mm256_loadu_si256((const __m256i *)hi));
}
/* The nibbles of two 32-blocks -> 64 bytes: block b's low nibbles, its high
 * nibbles, then block b+1's (one shift and one lane shuffle for both). */
static inline __m512i nibbles64(const uint8_t *qs0, const uint8_t *qs1) {
    const __m256i t = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)qs1), _mm_loadu_si128((const __m128i *)qs0));
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
    /* z's 128-bit lanes: qs0, qs1, qs0 >> 4, qs1 >> 4 -> qs0, qs0 >> 4, qs1, qs1 >> 4 */
    return _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
}
/* 16 floats: lanes 0-7 = a, lanes 8-15 = b */
static inline __m512 split_ps(float a, float b) {
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}
/* 32 int16: lanes 0-15 = a, lanes 16-31 = b */
static inline __m512i split_epi16(int a, int b) {
    return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)a), _mm512_set1_epi16((short)b));
}

#define KV_AI static inline __attribute__((always_inline))

/* acc + (d0 in lanes 0-7, d1 in 8-15) * (signed dot of the quants of two
 * 32-blocks, qx, with their activations a0 and a1). */
KV_AI __m512 fma_pair_i8(__m512 acc, __m512i qx, const int8_t *a0, const int8_t *a1, float d0, float d1) {
    const __m512i dp = dp_i8_512(_mm512_setzero_si512(), qx, load2x256(a0, a1));
    return _mm512_fmadd_ps(split_ps(d0, d1), _mm512_cvtepi32_ps(dp), acc);
}

/* d * (dot of one 32-block's quants qx with the activations at a): qx
 * signed (us = 0) or unsigned (us = 1); the odd block at the end of a row. */
KV_AI float dot_block32(__m256i qx, const int8_t *a, float d, const int us) {
    const __m256i qy = _mm256_loadu_si256((const __m256i *)a);
    const __m256i dp = us ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, qy)
                          : _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(qx), _mm256_sign_epi8(qy, qx));
    return d * kv_hsum256(_mm256_cvtepi32_ps(dp));
}

/* q5_0: quant_ext_q5_512.c's tiles. */

float kv_qext_dot_q5_1_avx512(int64_t n, const void *vw, const void *va) {
    const kv_block_q5_1 *x = vw;
    const kv_block_q8_1 *y = va;
    const int64_t nb = n / 32;
    const __m512i b4 = _mm512_set1_epi8(0x10);
    __m512 acc = _mm512_setzero_ps();
    float summs = 0;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __mmask64 hm = (__mmask64)rd32(x[i].qh) | ((__mmask64)rd32(x[i + 1].qh) << 32);
        __m512i qx = nibbles64(x[i].qs, x[i + 1].qs);
        qx = _mm512_mask_add_epi8(qx, hm, qx, b4);
        const __m512i qy = load2x256(y[i].qs, y[i + 1].qs);
        const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy); /* qx unsigned in [0, 31] */
        const __m512 d = split_ps(h2f(&x[i].d) * h2f(&y[i].d), h2f(&x[i + 1].d) * h2f(&y[i + 1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dp), acc);
        summs += h2f(&x[i].m) * h2f(&y[i].s) + h2f(&x[i + 1].m) * h2f(&y[i + 1].s);
    }
    float sum = _mm512_reduce_add_ps(acc) + summs;
    if (i < nb) {
        __m256i qx = nibbles32(x[i].qs);
        qx = _mm256_mask_add_epi8(qx, rd32(x[i].qh), qx, _mm256_set1_epi8(0x10));
        sum += dot_block32(qx, y[i].qs, h2f(&x[i].d) * h2f(&y[i].d), 1) + h2f(&x[i].m) * h2f(&y[i].s);
    }
    return sum;
}

float kv_qext_dot_q8_1_avx512(int64_t n, const void *vw, const void *va) {
    const kv_block_q8_1 *x = vw;
    const qx_block_q8_0 *y = va;
    const int64_t nb = n / 32;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2)
        acc = fma_pair_i8(acc, load2x256(x[i].qs, x[i + 1].qs), y[i].qs, y[i + 1].qs, h2f(&x[i].d) * h2f(&y[i].d),
                          h2f(&x[i + 1].d) * h2f(&y[i + 1].d));
    float sum = _mm512_reduce_add_ps(acc);
    if (i < nb) sum += dot_block32(_mm256_loadu_si256((const __m256i *)x[i].qs), y[i].qs, h2f(&x[i].d) * h2f(&y[i].d), 0);
    return sum;
}

float kv_qext_dot_q8_K_avx512(int64_t n, const void *vw, const void *va) {
    const kv_block_q8_K *x = vw;
    const kv_block_q8_K *y = va;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / KV_QK_K; i++) {
        __m512i sumi = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            const __m512i qx = _mm512_loadu_si512((const void *)(x[i].qs + 64 * k));
            const __m512i qy = _mm512_loadu_si512((const void *)(y[i].qs + 64 * k));
            sumi = dp_i8_512(sumi, qx, qy);
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(q8k_d(&x[i]) * q8k_d(&y[i])), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* q5_K (Q5 = 1: the 5th bit from qh; Q5 = 0 would be q4_K, which
 * quant_ext_k512.c's tiles compute). 64 quant bytes
 * hold groups 2h and 2h+1; low nibbles are sub-blocks 4h and 4h+2 (elements
 * 128h + 0..31 and 128h + 64..95), high nibbles 4h+1 and 4h+3 (128h +
 * 32..63 and 128h + 96..127). d, dmin and scales lead both layouts. */
KV_AI float dot_k4(int64_t n, const void *vw, const kv_block_q8_K *y, const int Q5) {
    const kv_block_q4_K *x4 = vw;
    const kv_block_q5_K *x5 = vw;
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    /* which qh bit each byte lane needs: register 2h holds the low nibbles of
     * groups 2h and 2h+1 (bits 4h, 4h+2), register 2h+1 their high nibbles
     * (bits 4h+1, 4h+3) */
    __m512i hbit[4];
    for (int r = 0; Q5 && r < 4; r++) {
        const int bit = 4 * (r / 2) + (r & 1);
        hbit[r] = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, _mm512_set1_epi8((char)(1 << bit)),
                                         _mm512_set1_epi8((char)(1 << (bit + 2))));
    }
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KV_QK_K; i++) {
        const uint8_t *qs = Q5 ? x5[i].qs : x4[i].qs;
        uint8_t sm[16];
        accm = Q5 ? k4_min_acc(accm, x5[i].scales, &x5[i].dmin, &y[i], sm) : k4_min_acc(accm, x4[i].scales, &x4[i].dmin, &y[i], sm);
        /* qh[l] serves element l of every group: the same 32 bytes in both halves */
        const __m512i qh =
            Q5 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x5[i].qh)) : _mm512_setzero_si512();
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const int8_t *a = y[i].qs + 128 * h;
            const __m512i q4 = _mm512_loadu_si512((const void *)(qs + 64 * h));
            __m512i ql = _mm512_and_si512(q4, m4), qhi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), m4);
            if (Q5) { /* the 5th bit as a byte mask: a set bit adds 16 */
                ql = _mm512_mask_add_epi8(ql, _mm512_test_epi8_mask(qh, hbit[2 * h]), ql, b4);
                qhi = _mm512_mask_add_epi8(qhi, _mm512_test_epi8_mask(qh, hbit[2 * h + 1]), qhi, b4);
            }
            const __m512i yl = load2x256(a, a + 64);
            const __m512i yh = load2x256(a + 32, a + 96);
            const __m512i pl = _mm512_madd_epi16(split_epi16(sm[4 * h], sm[4 * h + 2]), _mm512_maddubs_epi16(ql, yl));
            const __m512i ph = _mm512_madd_epi16(split_epi16(sm[4 * h + 1], sm[4 * h + 3]), _mm512_maddubs_epi16(qhi, yh));
            sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(pl, ph));
        }
        const float d = h2f(Q5 ? &x5[i].d : &x4[i].d);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d * q8k_d(&y[i])), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc) - kv_hsum256(accm);
}

float kv_qext_dot_q5_K_avx512(int64_t n, const void *vw, const void *va) { return dot_k4(n, vw, va, 1); }

/* q8_K activations (the K-quants' vec_type): quant_q8_K's arithmetic in
 * 16 lanes, bit for bit. The largest magnitude is the first element that
 * reaches it (NaNs never do: vmaxps returns its second operand when either
 * is NaN), nearest_int is the same float add of 1.5 * 2^23 and mantissa
 * extraction, so NaN, inf and ties come out as the scalar ones do. */
void kv_qext_quant_q8_K_avx512(const float *x, void *dst, int64_t n) {
    uint8_t *out = dst;
    const __m512 magic = _mm512_set1_ps(12582912.f);
    const __m512i mant = _mm512_set1_epi32(0x007fffff), half = _mm512_set1_epi32(0x00400000);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t i = 0; i < n / KV_QK_K; i++, x += KV_QK_K, out += sizeof(kv_block_q8_K)) {
        __m512 m = _mm512_setzero_ps();
        for (int g = 0; g < 16; g++) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * g)), m);
        const float amax = _mm512_reduce_max_ps(m);
        if (!(amax > 0)) {
            memset(out, 0, sizeof(kv_block_q8_K));
            continue;
        }
        float max = amax;
        for (int g = 0; g < 16; g++) {
            const __mmask16 k =
                _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * g)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (k) {
                max = x[16 * g + __builtin_ctz(k)];
                break;
            }
        }
        const float iscale = -127.f / max, d = 1 / iscale;
        const __m512 vs = _mm512_set1_ps(iscale);
        int16_t bsums[16];
        for (int g = 0; g < 16; g++) {
            const __m512 v = _mm512_add_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * g)), magic);
            __m512i q = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(v), mant), half);
            q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
            _mm_storeu_si128((__m128i *)(void *)(out + offsetof(kv_block_q8_K, qs) + 16 * g), _mm512_cvtepi32_epi8(q));
            bsums[g] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        memcpy(out + offsetof(kv_block_q8_K, d), &d, sizeof d);
        memcpy(out + offsetof(kv_block_q8_K, bsums), bsums, sizeof bsums);
    }
}

/* q4_K and q6_K: quant_ext_k512.c's tiles. */

KV_SIMD_TARGET_END

#endif
