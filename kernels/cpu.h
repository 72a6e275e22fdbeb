/* cpu.h - the "cpu" backend: host memory, a thread pool, and kernels with a
 * scalar reference plus AVX2 and AVX-512 paths picked at run time (one
 * binary runs on any x86-64; other CPUs use the portable C path).
 *
 * A backend handles one caller at a time: ops are not reentrant (they share
 * the pool and the scratch buffers). */
#ifndef KV_CPU_H
#define KV_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "matmul.h" /* kv_cpu_isa */
#include "threadpool.h"

#define KV_CPU_MAX_THREADS 256

/* Creates the CPU backend with n_threads threads (<= 0: one per online core;
 * KVTOP_CPU_ISA=scalar|avx2|avx512 in the environment caps the kernel ISA).
 * Returns NULL with err filled on failure. Freed by kv_backend_free. */
kv_backend *kv_cpu_backend_create(int n_threads, kv_err *err);

/* The backend's pool (borrowed; valid until kv_backend_free). Kernels in
 * other files (attention) dispatch their work on it. */
kv_threadpool *kv_cpu_pool(kv_backend *b);

/* Per-thread scratch for thread ith (0 <= ith < pool size) of at least
 * `bytes` bytes, 64-byte aligned, or NULL when memory runs out (ith out of
 * range too). The buffer grows only when a call asks for more than ever
 * before (the first call of each size, normally the first forward pass), so
 * steady-state calls do not allocate. Contents are not kept between ops: the
 * matmul uses the same buffers. Safe to call from thread ith inside a task. */
void *kv_cpu_scratch(kv_backend *b, int ith, size_t bytes);
/* One shared buffer (the quantized activations of a matmul), same growth
 * rule; call it only from the thread that called the op. */
void *kv_cpu_act_scratch(kv_backend *b, size_t bytes);

/* ---- instruction sets ---- */
/* 1 when this build and this CPU can run isa. */
int kv_cpu_isa_supported(kv_cpu_isa isa);
/* The fastest supported ISA. */
kv_cpu_isa kv_cpu_isa_best(void);
const char *kv_cpu_isa_name(kv_cpu_isa isa); /* "scalar", "avx2", "avx512" */
int kv_cpu_isa_from_name(const char *name, kv_cpu_isa *out); /* 0 or -1 */
/* Forces the kernels this backend runs (tests compare every path). Returns 0,
 * or KV_ERR_UNSUPPORTED (and changes nothing) when the CPU lacks isa. */
int kv_cpu_set_isa(kv_backend *b, kv_cpu_isa isa);
kv_cpu_isa kv_cpu_get_isa(const kv_backend *b);

/* ---- ops (the table's entries, also callable directly) ---- */
void kv_cpu_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n);
/* kv_cpu_matmul with an explicit ISA (ignores the backend's choice). */
void kv_cpu_matmul_isa(kv_backend *b, kv_cpu_isa isa, const kv_tensor *w, const float *x, float *y, int n);
/* The scalar oracle: same activation quantization and block arithmetic as
 * the kernels, accumulated in double, one thread. Allocates its own
 * buffers. Returns 0, KV_ERR_INVAL/UNSUPPORTED for a bad tensor, or
 * KV_ERR_NOMEM. */
int kv_cpu_matmul_ref(const kv_tensor *w, const float *x, float *y, int n);
/* Validates a weight for the CPU kernels: 0, or an error naming the type or
 * the shape (err may be NULL). */
int kv_mm_check(const kv_tensor *w, kv_err *err);

/* The KV-cache ops live in cpu_attention.c. */
void kv_cpu_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                     const float *v);
void kv_cpu_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                      float *out, int n_heads, float scale);
void kv_cpu_copy_block(kv_backend *b, kv_pages *kv, int dst, int src);

#endif
