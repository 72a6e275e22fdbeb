/* cpu.h - the "cpu" backend: host memory, a thread pool, and kernels with a
 * scalar reference plus AVX2 and AVX-512 paths picked at run time (one
 * binary runs on any x86-64; other CPUs use the portable C path).
 *
 * A backend handles one caller at a time: ops are not reentrant (they share
 * the pool and the scratch buffers). Ops that cannot do their work record
 * the failure for ops.status (backend.h) and leave NaN where an output was
 * due; nothing inside an op allocates (ops.reserve sizes the scratch). */
#ifndef KV_CPU_H
#define KV_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cpu_isa.h"
#include "matmul.h" /* kv_cpu_matmul_ref, kv_mm_check */
#include "threadpool.h"

#define KV_CPU_MAX_THREADS 256

/* Creates the CPU backend with n_threads threads (<= 0: one per online core;
 * KVTOP_CPU_ISA=scalar|avx2|avx512 in the environment caps the kernel ISA).
 * Returns NULL with err filled on failure. Freed by kv_backend_free. */
kv_backend *kv_cpu_backend_create(int n_threads, kv_err *err);

/* The backend's pool (borrowed; valid until kv_backend_free). */
kv_threadpool *kv_cpu_pool(kv_backend *b);

/* Per-thread scratch of thread ith (0 <= ith < pool size): the buffer
 * ops.reserve sized, 64-byte aligned, or NULL when `bytes` is more than was
 * reserved (ith out of range too). Never allocates. Contents are not kept
 * between ops: the matmul uses the same buffers. */
void *kv_cpu_scratch(kv_backend *b, int ith, size_t bytes);
/* The one shared buffer (the quantized activations of a matmul), same rule. */
void *kv_cpu_act_scratch(kv_backend *b, size_t bytes);

/* Forces the kernels this backend runs (tests compare every path). Returns 0,
 * or KV_ERR_UNSUPPORTED (and changes nothing) when the CPU lacks isa. */
int kv_cpu_set_isa(kv_backend *b, kv_cpu_isa isa);
kv_cpu_isa kv_cpu_get_isa(const kv_backend *b);
/* 1 when b's batched q8_0/q4_0/q4_1 matmuls run on AMX-INT8 tiles (its
 * ISA is avx512, the CPU has them, KVTOP_CPU_AMX is not "0"). */
int kv_cpu_uses_amx(const kv_backend *b);

/* ---- ops (the table's entries, also callable directly) ---- */
void kv_cpu_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n);
/* kv_cpu_matmul with an explicit ISA (ignores the backend's choice). */
void kv_cpu_matmul_isa(kv_backend *b, kv_cpu_isa isa, const kv_tensor *w, const float *x, float *y, int n);
/* ops.matmul_multi with the kernels of isa (the tests compare every ISA). */
void kv_cpu_matmul_multi_isa(kv_backend *b, kv_cpu_isa isa, const kv_tensor *const *w, int nw, const float *x,
                             float *const *y, int n);
/* ops.matmul_groups with the kernels of isa. */
void kv_cpu_matmul_groups_isa(kv_backend *b, kv_cpu_isa isa, const kv_matmul_group *g, int ng);

/* The KV-cache ops; the kernels live in cpu_attention.c. copy_block does
 * not use b (NULL is fine). */
void kv_cpu_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                     const float *v);
void kv_cpu_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                      float *out, int n_heads, float scale);
/* g[i] = gelu(g[i]) * u[i] with GELU's tanh form, 0.5 x (1 + tanh(sqrt(2/pi)
 * (x + 0.044715 x^3))): the scalar reference of the cpu gelu_mul op. */
void kv_gelu_mul_ref(float *g, const float *u, int64_t n);
/* logits_scan's reference for one row of n >= 1 floats: the first index of
 * its largest value (NaN never taken; a NaN at 0 stays the answer), and
 * *finite = 1 when no value is NaN or Inf. */
int32_t kv_logits_scan_row_ref(const float *x, int n, uint8_t *finite);
void kv_cpu_copy_block(kv_backend *b, kv_pages *kv, int dst, int src);

#endif
