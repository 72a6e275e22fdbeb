/* matmul_amx.c - the batched quantized matmul's inner product on AMX-INT8
 * tiles (q8_0, q4_0, q4_1 weights), called by matmul_avx512.c's packed
 * kernel for every full group of 16 activation rows.
 *
 * The arithmetic is the AVX-512 kernels', bit for bit, so a row's output
 * does not depend on the batch (or on whether this CPU has AMX): per
 * 32-element block b in order,
 *     acc = fma(float(isum_b + ioff_b), dw_b * da_b, acc)
 *     q4_1 then: acc = fma(mw_b, ds_b, acc)
 * Only isum_b, the exact integer dot of a block, comes from the tiles: one
 * tdpbsud per block multiplies 16 activation rows (signed int8, tile A: 16
 * rows x 32 bytes, read in place from the block-major q8a arrays) by the
 * panel of 16 weight rows pack_q made (unsigned: q8_0 as w ^ 0x80, q4 the
 * raw nibble; tile B: 8 rows of 16 x 4 bytes, which is already the layout
 * tdpbsud wants) into 16 x 16 int32 sums, exact in any order. The sums go
 * through L1 (a tile has no path to the vector registers) and the float
 * chain above runs on them as it does in qp_kernel, one zmm of 16 weight
 * rows per activation row. Two C tiles alternate so the next block's tile
 * product overlaps this block's float work. */
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

/* C tile `c` = A (activations at a, rows 32 bytes apart) x B (the panel's
 * block at b, rows 64 bytes apart), stored to buf. */
#define AMX_BLOCK(op, c, a, b, buf)                                                                               \
    __asm__ volatile("tilezero %%tmm" #c "\n\t"                                                                     \
                     "tileloadd (%0,%1,1), %%tmm2\n\t"                                                              \
                     "tileloadd (%2,%3,1), %%tmm3\n\t"                                                              \
                     #op " %%tmm3, %%tmm2, %%tmm" #c "\n\t"                                                          \
                     "tilestored %%tmm" #c ", (%4,%3,1)"                                                           \
                     :                                                                                              \
                     : "r"(a), "r"((long)KV_QK), "r"(b), "r"(64L), "r"(buf)                                         \
                     : "memory")

#define AI static inline __attribute__((always_inline))
#define AMX_DEPTH 4 /* C tiles (0, 1, 4, 5) in flight */

/* The weight kinds: q8_0's panel is packed signed (tdpbssd: the sum is the
 * dot itself, no zero-point correction); q4's nibbles are unsigned
 * (tdpbsud), q4_0 then adds ioff = -8 sum(q_act), q4_1 its min term. */
enum { AMX_Q8_0, AMX_Q4_0, AMX_Q4_1 };

/* Block b's float step for the 16 activation rows: acc[jj] (16 weight rows
 * each) from the integer sums at cs (row jj at cs + 16 jj), as qp_kernel. */
AI void amx_float_step(__m512 acc[16], const int32_t *cs, __m512 dw, __m512 mw, const float *ad, const int32_t *io,
                       const float *ads, const int KIND) {
#pragma GCC unroll 16
    for (int jj = 0; jj < 16; jj++) {
        __m512i s = _mm512_load_si512((const void *)(cs + 16 * jj));
        if (KIND == AMX_Q4_0) s = _mm512_add_epi32(s, _mm512_set1_epi32(io[jj]));
        const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(ad[jj]));
        acc[jj] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc[jj]);
        if (KIND == AMX_Q4_1) acc[jj] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ads[jj]), acc[jj]);
    }
}

/* Block b of the 16 activation rows at aq into C tile (b % AMX_DEPTH) and
 * its buffer. */
AI void amx_issue(const int8_t *aq, const uint8_t *pq, size_t n, int64_t b, int32_t (*cbuf)[256], const int KIND) {
    const int8_t *ab = aq + (size_t)b * n * KV_QK;
    const uint8_t *bb = pq + (size_t)b * 512;
#define AMX_CASES(op)                                                                                                  \
    switch (b & 3) {                                                                                                   \
    case 0: AMX_BLOCK(op, 0, ab, bb, cbuf[0]); break;                                                                  \
    case 1: AMX_BLOCK(op, 1, ab, bb, cbuf[1]); break;                                                                  \
    case 2: AMX_BLOCK(op, 4, ab, bb, cbuf[2]); break;                                                                  \
    default: AMX_BLOCK(op, 5, ab, bb, cbuf[3]); break;                                                                 \
    }
    if (KIND == AMX_Q8_0) {
        AMX_CASES(tdpbssd)
    } else {
        AMX_CASES(tdpbsud)
    }
#undef AMX_CASES
}

/* y[j0..j0+16)[r0..r0+16) from the packed panel (pq, pd, pm). */
AI void amx_rows16(const kv_mm_args *a, const uint8_t *pq, const float *pd, const float *pm, int64_t r0,
                   __mmask16 mask, int j0, const int KIND) {
    const int64_t nb = a->K / KV_QK;
    const size_t n = (size_t)a->n;
    int32_t cbuf[AMX_DEPTH][256] __attribute__((aligned(64)));
    __m512 acc[16];
#pragma GCC unroll 16
    for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_setzero_ps();
    const int8_t *aq = a->a.qs + (size_t)j0 * KV_QK;
    /* tile sums travel through L1, and a load cannot take a tile store's
     * data before it reaches the cache: blocks are issued AMX_DEPTH - 1
     * ahead of the floats that read them */
    for (int64_t b = 0; b < nb && b < AMX_DEPTH - 1; b++) amx_issue(aq, pq, n, b, cbuf, KIND);
    for (int64_t b = 0; b < nb; b++) {
        if (b + AMX_DEPTH - 1 < nb) amx_issue(aq, pq, n, b + AMX_DEPTH - 1, cbuf, KIND);
        const size_t o = (size_t)b * n + (size_t)j0;
        amx_float_step(acc, cbuf[b & (AMX_DEPTH - 1)], _mm512_load_ps(pd + b * 16),
                       KIND == AMX_Q4_1 ? _mm512_load_ps(pm + b * 16) : _mm512_setzero_ps(), a->a.d + o,
                       a->a.ioff + o, a->a.ds + o, KIND);
    }
#pragma GCC unroll 16
    for (int jj = 0; jj < 16; jj++) _mm512_mask_storeu_ps(a->y + (size_t)(j0 + jj) * a->M + r0, mask, acc[jj]);
}

void kv_mm_amx_panel(const kv_mm_args *a, kv_type t, const uint8_t *pq, const float *pd, const float *pm, int64_t r0,
                     uint16_t mask, int j1) {
    for (int j0 = 0; j0 + 16 <= j1; j0 += 16) {
        if (t == KV_TYPE_Q8_0)
            amx_rows16(a, pq, pd, pm, r0, mask, j0, AMX_Q8_0);
        else if (t == KV_TYPE_Q4_0)
            amx_rows16(a, pq, pd, pm, r0, mask, j0, AMX_Q4_0);
        else
            amx_rows16(a, pq, pd, pm, r0, mask, j0, AMX_Q4_1);
    }
}

KV_SIMD_TARGET_END

#else

int kv_mm_amx_on(void) { return 0; }
int kv_mm_amx_set(int on) {
    (void)on;
    return 0;
}

#endif
