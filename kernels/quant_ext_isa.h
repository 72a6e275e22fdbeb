/* quant_ext_isa.h - internal: the per-ISA dot kernels of quant_ext (defined
 * in quant_ext_avx2.c and quant_ext_avx512.c, each compiled for its target
 * with a file-wide pragma so one binary runs anywhere; quant_ext.c holds
 * the scalar references and the run-time choice) and the q8_0 activation
 * block they read. Only quant_ext*.c include this. */
#ifndef KV_QUANT_EXT_ISA_H
#define KV_QUANT_EXT_ISA_H

#include <stdint.h>

#include "quant_ext.h"

/* GGUF's q8_0 block: the activation type of the q5_0 and q8_1 dots. */
typedef struct qx_block_q8_0 {
    uint16_t d;     /* fp16 scale */
    int8_t qs[32];  /* value = qs[j] * d */
} qx_block_q8_0;
_Static_assert(sizeof(qx_block_q8_0) == 34, "q8_0 block is 34 bytes");

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_QEXT_HAVE_X86 1
/* One kernel per weight type and level; same contract as kv_qext_dot_fn. */
float kv_qext_dot_q5_0_avx2(int64_t n, const void *w, const void *a);
float kv_qext_dot_q5_1_avx2(int64_t n, const void *w, const void *a);
float kv_qext_dot_q8_1_avx2(int64_t n, const void *w, const void *a);
float kv_qext_dot_q4_K_avx2(int64_t n, const void *w, const void *a);
float kv_qext_dot_q5_K_avx2(int64_t n, const void *w, const void *a);
float kv_qext_dot_q6_K_avx2(int64_t n, const void *w, const void *a);
float kv_qext_dot_q8_K_avx2(int64_t n, const void *w, const void *a);
float kv_qext_dot_q5_0_avx512(int64_t n, const void *w, const void *a);
float kv_qext_dot_q5_1_avx512(int64_t n, const void *w, const void *a);
float kv_qext_dot_q8_1_avx512(int64_t n, const void *w, const void *a);
float kv_qext_dot_q4_K_avx512(int64_t n, const void *w, const void *a);
float kv_qext_dot_q5_K_avx512(int64_t n, const void *w, const void *a);
float kv_qext_dot_q6_K_avx512(int64_t n, const void *w, const void *a);
float kv_qext_dot_q8_K_avx512(int64_t n, const void *w, const void *a);
/* q8_K activations, quant_q8_K's bits (kv_qext_from_f32_fn). */
void kv_qext_quant_q8_K_avx512(const float *x, void *dst, int64_t n);
/* quant_ext_k512.c's and quant_ext_q5_512.c's tiles (kv_qext_rows_fn),
 * the same sums as the dots above. */
void kv_qext_rows_q5_0_avx512(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na, float *y,
                              size_t ys);
void kv_qext_rows_q4_K_avx512(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na, float *y,
                              size_t ys);
void kv_qext_rows_q6_K_avx512(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na, float *y,
                              size_t ys);
/* quant_ext_k512.c's kernel over pre-packed q4_K panels (kv_qext_panels_fn). */
void kv_qext_panels_q4_K_avx512(int64_t K, const uint8_t *pp, int nr, const void *a, size_t as, int na, float *y,
                                size_t ys);
#endif

#endif
