/* cpu_internal.h - internal to the cpu backend: the per-ISA element-wise
 * kernels of cpu.c (rmsnorm's sum of squares, silu_mul), which live in
 * cpu_avx2.c and are called only when the CPU has AVX2.
 *
 * NOTE: who depends on whom. cpu.c owns the backend's state (pool, ISA,
 * scratch, the failure record) and is the only file that reads it; the
 * kernel files (matmul*.c, cpu_attention*.c, cpu_avx2.c) are given what they
 * use as arguments (kv_mm_env, a pool and an ISA) and include nothing of
 * cpu.c, so the dependency runs one way: cpu.c -> kernels -> cpu_isa.c,
 * threadpool.c. */
#ifndef KV_CPU_INTERNAL_H
#define KV_CPU_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "cpu_isa.h"

/* logits_scan's scalar steps over x[i..n) from the running best value and
 * its index: a strictly larger value takes over (the first index of the
 * largest; a NaN is never taken, and a NaN best keeps its place). Returns
 * nonzero when one of them is NaN or Inf (all exponent bits set). */
static inline uint32_t kv_logits_scan_steps(const float *x, int i, int n, float *best, int32_t *at) {
    uint32_t bad = 0;
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
        if (x[i] > *best) {
            *best = x[i];
            *at = i;
        }
    }
    return bad;
}

#ifdef KV_HAVE_X86_KERNELS
/* sum of x[i]^2 for i < dim, 16 lanes of fp32 then a scalar tail. */
float kv_cpu_sumsq_avx2(const float *x, int dim);
/* g[i] = silu(g[i]) * u[i] for the first n / 8 * 8 elements; returns how
 * many it did (the caller finishes the tail with the scalar reference). */
int64_t kv_cpu_silu_mul_avx2(float *g, const float *u, int64_t n);
/* g[i] = gelu_tanh(g[i]) * u[i] for every i < n, as kv_gelu_mul_ref's
 * formula with exp_avx2 (within 2 ulp of expf): the last n % 8 elements
 * through masked loads and stores, so each element's result does not
 * depend on where it sits in the range (batch invariance). */
void kv_cpu_gelu_mul_avx2(float *g, const float *u, int64_t n);
/* kv_logits_scan_row_ref's results for x[0..n), n >= 1: 8 lanes each keep
 * their first strictly larger value and its index (starting from x[0]),
 * then the lanes' largest value with the smallest index, then the tail. */
int32_t kv_cpu_logits_scan_row_avx2(const float *x, int n, uint8_t *finite);
#endif

#endif
