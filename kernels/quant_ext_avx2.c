/* quant_ext_avx2.c - AVX2 dot products for quant_ext's types, compiled
 * for that target with a file-wide pragma (no -march flag needed), as
 * matmul_avx2.c is, and chosen at run time by quant_ext.c. Each computes
 * exactly the integer sums of its scalar reference; only the float
 * accumulation order differs. 32 quants per step, signed x signed via the
 * abs/sign trick into maddubs, 16-bit scale multiply with madd. */
#include "quant_ext_simd.h"

#ifdef KV_QEXT_HAVE_X86

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c")

#define KV_AI static inline __attribute__((always_inline))

/* acc + d * (dot of one 32-block: quants qx with the int8 activations at a),
 * qx signed (us = 0) or unsigned in [0, 31] (us = 1). */
KV_AI __m256 fma_block32(__m256 acc, float d, __m256i qx, const int8_t *a, const int us) {
    const __m256i qy = _mm256_loadu_si256((const __m256i *)a);
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(us ? mul_sum_us8(qx, qy) : mul_sum_i8(qx, qy)), acc);
}

float kv_qext_dot_q5_0_avx2(int64_t n, const void *vw, const void *va) {
    const kv_block_q5_0 *x = vw;
    const qx_block_q8_0 *y = va;
    const __m256i f0 = _mm256_set1_epi8((char)0xF0);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        /* value - 16: a clear 5th bit turns nibble q into q - 16 = q | 0xF0 */
        const __m256i qx = _mm256_or_si256(nibbles32(x[i].qs), _mm256_andnot_si256(bits32(rd32(x[i].qh)), f0));
        acc = fma_block32(acc, h2f(&x[i].d) * h2f(&y[i].d), qx, y[i].qs, 0);
    }
    return kv_hsum256(acc);
}

float kv_qext_dot_q5_1_avx2(int64_t n, const void *vw, const void *va) {
    const kv_block_q5_1 *x = vw;
    const kv_block_q8_1 *y = va;
    const __m256i b4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i qx = _mm256_or_si256(nibbles32(x[i].qs), _mm256_and_si256(bits32(rd32(x[i].qh)), b4));
        acc = fma_block32(acc, h2f(&x[i].d) * h2f(&y[i].d), qx, y[i].qs, 1);
        summs += h2f(&x[i].m) * h2f(&y[i].s);
    }
    return kv_hsum256(acc) + summs;
}

float kv_qext_dot_q8_1_avx2(int64_t n, const void *vw, const void *va) {
    const kv_block_q8_1 *x = vw;
    const qx_block_q8_0 *y = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++)
        acc = fma_block32(acc, h2f(&x[i].d) * h2f(&y[i].d), _mm256_loadu_si256((const __m256i *)x[i].qs), y[i].qs, 0);
    return kv_hsum256(acc);
}

float kv_qext_dot_q8_K_avx2(int64_t n, const void *vw, const void *va) {
    const kv_block_q8_K *x = vw;
    const kv_block_q8_K *y = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KV_QK_K; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
            const __m256i qx = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * k));
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * k));
            sumi = _mm256_add_epi32(sumi, mul_sum_i8(qx, qy));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q8k_d(&x[i]) * q8k_d(&y[i])), _mm256_cvtepi32_ps(sumi), acc);
    }
    return kv_hsum256(acc);
}

/* q4_K (Q5 = 0) and q5_K (Q5 = 1, the 5th bit from qh): the same blocks
 * but for qh (d, dmin and scales lead both layouts). */
KV_AI float dot_k4(int64_t n, const void *vw, const kv_block_q8_K *y, const int Q5) {
    const kv_block_q4_K *x4 = vw;
    const kv_block_q5_K *x5 = vw;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KV_QK_K; i++) {
        const uint8_t *qs = Q5 ? x5[i].qs : x4[i].qs;
        uint8_t sm[16];
        accm = Q5 ? k4_min_acc(accm, x5[i].scales, &x5[i].dmin, &y[i], sm) : k4_min_acc(accm, x4[i].scales, &x4[i].dmin, &y[i], sm);
        const __m256i hbits = Q5 ? _mm256_loadu_si256((const __m256i *)x5[i].qh) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i ql = _mm256_and_si256(q4, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            if (Q5) { /* bit 2g (low nibbles) and 2g+1 (high nibbles) of each qh byte, moved to bit 4 */
                ql = _mm256_or_si256(ql, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * g), m1), 4));
                qh = _mm256_or_si256(qh, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * g + 1), m1), 4));
            }
            const __m256i yl = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * g));
            const __m256i yh = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * g + 32));
            const __m256i pl = _mm256_madd_epi16(_mm256_set1_epi16(sm[2 * g]), _mm256_maddubs_epi16(ql, yl));
            const __m256i ph = _mm256_madd_epi16(_mm256_set1_epi16(sm[2 * g + 1]), _mm256_maddubs_epi16(qh, yh));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        const float d = h2f(Q5 ? &x5[i].d : &x4[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * q8k_d(&y[i])), _mm256_cvtepi32_ps(sumi), acc);
    }
    return kv_hsum256(acc) - kv_hsum256(accm);
}

float kv_qext_dot_q4_K_avx2(int64_t n, const void *vw, const void *va) { return dot_k4(n, vw, va, 0); }
float kv_qext_dot_q5_K_avx2(int64_t n, const void *vw, const void *va) { return dot_k4(n, vw, va, 1); }

float kv_qext_dot_q6_K_avx2(int64_t n, const void *vw, const void *va) {
    const kv_block_q6_K *x = vw;
    const kv_block_q8_K *y = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KV_QK_K; i++) {
        const int8_t *sc = x[i].scales;
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * k));
                /* lanes 0-7 cover 16 elements with scale 8h+2k, lanes 8-15 the next 16 */
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[8 * h + 2 * k + 1]), _mm_set1_epi16(sc[8 * h + 2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, _mm256_maddubs_epi16(q[k], qy)));
            }
        }
        /* the quants were used unsigned (q in [0, 63]); take off 32 * sum(a) per sub-block */
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(q6_bias8(sc, y[i].bsums), 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(&x[i].d) * q8k_d(&y[i])), _mm256_cvtepi32_ps(sumi), acc);
    }
    return kv_hsum256(acc);
}

KV_SIMD_TARGET_END

#endif
