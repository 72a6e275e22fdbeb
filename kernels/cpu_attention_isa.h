/* cpu_attention_isa.h - internal to the CPU attention kernels: the table
 * of per-ISA kernels that cpu_attention.c (scalar reference, dispatch, the
 * driver) picks from, the entry points of cpu_attention_avx2.c and
 * cpu_attention_avx512.c, and the small row helpers all of them share. Only
 * cpu_attention*.c include it. */
#ifndef KV_CPU_ATTENTION_ISA_H
#define KV_CPU_ATTENTION_ISA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "cpu_isa.h"
#include "kv_dtype.h"
#include "types.h"

#define ATTN_TILE 32    /* context tokens scored per step of the online softmax (at most) */
#define ATTN_HC 4       /* rows one kernel call takes (their accumulators fit the registers) */

/* Prefetching the next tile while this one is computed: a range of bytes
 * (the next tile's rows of a kv head: a sequence's blocks lie anywhere in
 * the pool, which the hardware prefetcher cannot guess) asked for a few
 * lines at a time as a kernel goes through its keys, so the prefetches
 * overlap the arithmetic. Issued as one burst (32 lines a tile for f16
 * head_dim 64) they stalled the core on its fill buffers and the tile's
 * arithmetic waited behind them (out of cache, the attention took the
 * sum of its in-cache time and a plain read of its K/V); spread out, the
 * 64-sequence decode step's attention takes 0.73-0.78 of the time, the
 * same bits (tools/attn_ab.sh, README "Where decode time goes"). A
 * kernel's call covers keys [t0, t0 + nt) of a tile of ntot keys; after key
 * t of the call the first n * (t0 + t) / ntot bytes are due (in fixed
 * point: no division per step). Into L1 (T0): with K/V in cache an L2-only
 * hint cost ~10% of the time. */
typedef struct attn_pf {
    const uint8_t *p; /* the range's first line */
    size_t n, done;   /* bytes from p to the range's end; bytes asked for so far */
    size_t per_key;   /* bytes due per key of the tile, x 65536 (n * 65536 / the tile's keys) */
    int t0;           /* the call's first key in the tile */
} attn_pf;

/* The span of `bytes` bytes at p (any alignment) for a tile of ntot keys. */
static inline attn_pf attn_pf_init(const uint8_t *p, size_t bytes, int ntot) {
    attn_pf pf;
    pf.p = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)63);
    pf.n = (size_t)(p - pf.p) + bytes;
    pf.done = 0;
    pf.per_key = (pf.n << 16) / (size_t)(ntot > 1 ? ntot : 1);
    pf.t0 = 0;
    return pf;
}

static inline void attn_pf_upto(attn_pf *pf, size_t upto) {
    if (upto > pf->n) upto = pf->n;
    for (; pf->done < upto; pf->done += 64) __builtin_prefetch(pf->p + pf->done, 0, 3);
}

/* After key t of the call (pf may be NULL: nothing to prefetch). */
static inline __attribute__((always_inline)) void attn_pf_step(attn_pf *pf, int t) {
    if (pf) attn_pf_upto(pf, (pf->per_key * (size_t)(pf->t0 + t)) >> 16);
}

/* Per-ISA kernels over a tile of nt rows of one kv head at rows + t * stride,
 * each head_dim (hd) elements of dtype d (the ones the ISA reads in place).
 * Query rows q[r] and accumulator rows acc[r] are separate pointers: the
 * rows of an item come from several tokens and heads. */
typedef struct kv_attn_kernels {
    /* s[r * ss + t] = scale * dot(q_r, row_t), r < nr, t < nt */
    void (*scores)(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                   kv_cache_dtype d, float scale, float *s, int ss, attn_pf *pf);
    /* acc_r += sum_t p[r * ps + t] * row_t */
    void (*accum)(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt, kv_cache_dtype d,
                  const float *p, int ps, attn_pf *pf);
    /* s[i] = exp(s[i] - m) for i < n; returns their sum */
    float (*expsum)(float *s, int n, float m);
    /* max of s[0..n), n >= 1 */
    float (*maxf)(const float *s, int n);
    /* a[i] *= f for i < n (the rescale of an accumulator row) */
    void (*scalev)(float *a, int n, float f);
    unsigned direct; /* bit d set: dtype d is read in place; others are decoded to f32 first */
    /* int8 keys against query rows quantized to int8 (attn_q8_query), the
     * dot in integers: s[r * ss + t] = (float)idot(qq_r, key_t) * (scale *
     * qd_r * key scale), r < nr, t < nt. NULL: the ISA scores int8 keys in
     * float (scores). */
    void (*scores_q8)(const int8_t *const *qq, const float *qd, const int32_t *qsum, int nr, int hd,
                      const uint8_t *rows, size_t stride, int nt, float scale, float *s, int ss, attn_pf *pf);
} kv_attn_kernels;

/* A query row quantized for scores_q8: the int8 cache's own row encoding
 * (kv_dtype_encode_row: hd codes, then the f32 scale qd), and the sum of
 * its codes (the VNNI kernels take keys as unsigned k + 128 and subtract
 * 128 * qsum). Deterministic per row: batch invariance holds. */
static inline void attn_q8_query(const float *q, int hd, int8_t *qq, float *qd, int32_t *qsum, int simd);

#ifdef KV_HAVE_X86_KERNELS
void kv_attn_int8_encode_avx2(const float *src, uint8_t *dst, int n);
#endif

/* simd: the AVX2 encoder (the reference's bits without its libm calls);
 * only where the CPU has AVX2. */
static inline void attn_q8_query(const float *q, int hd, int8_t *qq, float *qd, int32_t *qsum, int simd) {
#ifdef KV_HAVE_X86_KERNELS
    if (simd)
        kv_attn_int8_encode_avx2(q, (uint8_t *)qq, hd);
    else
#endif
        kv_dtype_encode_row(KV_CACHE_INT8, q, qq, hd);
    (void)simd;
    memcpy(qd, qq + hd, 4);
    int32_t sum = 0;
    for (int i = 0; i < hd; i++) sum += qq[i];
    *qsum = sum;
}

/* The score of one int8 key from its integer dot: the one float formula
 * the scalar reference and the SIMD kernels share. */
static inline float attn_q8_score(int32_t idot, float scale_qd, float ks) { return (float)idot * (scale_qd * ks); }

#define ATTN_DT_BIT(d) (1u << (d))
#define ATTN_DT_ALL (ATTN_DT_BIT(KV_CACHE_DTYPE_COUNT) - 1u)

/* One element of a row of f32 (f16 = 0) or f16 (f16 = 1). */
static inline float ld_scalar(const uint8_t *row, int f16, int i) {
    if (f16) {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)i, 2);
        return kv_fp16_to_fp32(h);
    }
    float f;
    memcpy(&f, row + 4 * (size_t)i, 4);
    return f;
}

/* The quantized rows' per-row factors as the SIMD kernels use them: they
 * expand the codes without the scale (e4m3 to value / 256, see fp8_to_half)
 * and apply it per key (K) or per weight (V); int8_asym is expanded to
 * min + q * scale in registers instead, because folding the min out of a
 * dot product cancels badly. */
static inline float row_scale(const uint8_t *row, int hd, kv_cache_dtype d) {
    float sc;
    memcpy(&sc, row + hd, 4);
    return d == KV_CACHE_FP8_E4M3 ? sc * 256.0f : sc;
}

static inline float row_min(const uint8_t *row, int hd) {
    float mn;
    memcpy(&mn, row + hd + 4, 4);
    return mn;
}

/* One element of a quantized row, expanded as the SIMD loads do (the tails
 * of rows whose head_dim is not a multiple of the vector width). */
static inline float raw_scalar(const uint8_t *row, int i, kv_cache_dtype d, float sc, float mn) {
    switch (d) {
    case KV_CACHE_INT8: return (float)(int8_t)row[i];
    case KV_CACHE_INT8_ASYM: return mn + (float)row[i] * sc;
    case KV_CACHE_FP8_E4M3: return kv_fp8_e4m3_to_fp32(row[i]) * 0.00390625f; /* exact: a power of 2 */
    case KV_CACHE_FP8_E5M2: return kv_fp8_e5m2_to_fp32(row[i]);
    case KV_CACHE_F16: return ld_scalar(row, 1, i);
    default: return ld_scalar(row, 0, i);
    }
}

/* 1 when the SIMD kernels multiply a key's score or a value's weight by its
 * row scale (the symmetric quantized dtypes). */
#define ATTN_DT_FOLDS(DT) ((DT) == KV_CACHE_INT8 || (DT) == KV_CACHE_FP8_E4M3 || (DT) == KV_CACHE_FP8_E5M2)

/* A row's factors for the SIMD loads: *sc its row_scale (1 for the float
 * dtypes), *mn its row_min (0 but for int8_asym). */
static inline __attribute__((always_inline)) void row_factors(const uint8_t *row, int hd, int DT, float *sc, float *mn) {
    *sc = ATTN_DT_FOLDS(DT) || DT == KV_CACHE_INT8_ASYM ? row_scale(row, hd, (kv_cache_dtype)DT) : 1.0f;
    *mn = DT == KV_CACHE_INT8_ASYM ? row_min(row, hd) : 0.0f;
}

/* The four keys t..t+3 a scores step reads (keys past nt repeat the last
 * one; their scores are not stored) and their factors. */
static inline __attribute__((always_inline)) void key_quad(const uint8_t *rows, size_t stride, int t, int nt, int hd,
                                                          int DT, const uint8_t *r[4], float sk[4], float mk[4]) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        r[k] = rows + (size_t)KV_MIN(t + k, nt - 1) * stride;
        row_factors(r[k], hd, DT, &sk[k], &mk[k]);
    }
}

/* The switch that turns a call's run-time (nr, d), nr = 1..ATTN_HC, into
 * the compile-time (NH, DT) of an ISA's kernel body: CALL(NH, DT) is a
 * macro the kernel file defines around its *_nh function. */
_Static_assert(KV_CACHE_DTYPE_COUNT == 6 && ATTN_HC == 4, "ATTN_SWITCH lists 4 row counts x 6 dtypes");
#define ATTN_CASE(CALL, NH, DT) \
    case NH * KV_CACHE_DTYPE_COUNT + DT: CALL(NH, DT); break;
#define ATTN_CASES(CALL, NH) \
    ATTN_CASE(CALL, NH, 0) ATTN_CASE(CALL, NH, 1) ATTN_CASE(CALL, NH, 2) \
    ATTN_CASE(CALL, NH, 3) ATTN_CASE(CALL, NH, 4) ATTN_CASE(CALL, NH, 5)
#define ATTN_SWITCH(nr, d, CALL)                                                                              \
    switch ((nr) * KV_CACHE_DTYPE_COUNT + (int)(d)) {                                                          \
        ATTN_CASES(CALL, 1) ATTN_CASES(CALL, 2) ATTN_CASES(CALL, 3) ATTN_CASES(CALL, 4) default: break;        \
    }

/* exp(x) for x <= 0 in the softmax kernels (cpu_attention_avx2.c exp8,
 * cpu_attention_avx512.c exp16): x = n ln2 + r with ln2 split in two
 * (Cody-Waite), then 2^n times the degree-6 Taylor polynomial of e^r,
 * |r| <= ln2/2, relative error ~2e-7. The polynomial's coefficients from
 * the highest degree down (Horner). */
#define ATTN_EXP_LOG2E 1.44269504f
#define ATTN_EXP_LN2_HI 0.693145752f
#define ATTN_EXP_LN2_LO 1.42860677e-6f
static const float attn_exp_poly[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};

#ifdef KV_HAVE_X86_KERNELS
extern const kv_attn_kernels kv_attn_kernels_avx2;   /* cpu_attention_avx2.c */
extern const kv_attn_kernels kv_attn_kernels_avx512; /* cpu_attention_avx512.c */

/* Row encoders of kv_store for AVX2 (cpu_attention_avx2.c), bit for bit
 * the reference's (kv_dtype_encode_row) for hd elements of src. */
void kv_attn_f16_encode_avx2(const float *src, uint8_t *dst, int n);
void kv_attn_fp8_encode_avx2(const float *src, uint8_t *dst, int n, int e4);
#endif

#endif
