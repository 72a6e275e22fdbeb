/* matmul.h - the CPU matmul: the driver (matmul.c: scalar reference,
 * activation quantization, threading) that the cpu backend calls with the
 * resources it owns, and the internal interface to the per-ISA kernels
 * (matmul_avx2.c, matmul_avx512.c). Not for engine/ use: the engine calls
 * the backend table (backend.h).
 *
 * NOTE: matmul*.c depend on nothing of cpu.c: the pool and the scratch
 * buffers come in a kv_mm_env the backend lends for one call, so the
 * dependency runs one way (cpu.c -> matmul.c -> cpu_isa.c, threadpool.c). */
#ifndef KV_MATMUL_H
#define KV_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"
#include "backend.h" /* kv_tensor */
#include "cpu_isa.h"
#include "threadpool.h"
#include "types.h"

#define KV_QK 32       /* elements per block of q8_0 / q4_0 / q4_1 and of the activation blocks */
#define KV_MM_PANEL 16 /* weight rows per packed panel of the batched kernels */

/* Activations quantized to 8 bits per 32-element block ("q8a"): like GGUF's
 * q8_0/q8_1 activation blocks but with an f32 scale, split into arrays so
 * the kernels can broadcast a scale or a sum with one load. Block-major:
 * block b of activation row j sits at index b * n + j, so the rows a kernel
 * works on are found at constant offsets from one pointer per block. */
typedef struct kv_q8a {
    int8_t *qs;    /* (nb, n, 32) q = round-half-even(x / d), |q| <= 127 */
    float *d;      /* (nb, n) d = amax / 127; NaN when the block held inf/NaN */
    int32_t *ioff; /* (nb, n) -zp * sum(q): the correction for weights stored
                      with a zero point zp (128 for q8_0 shifted to unsigned,
                      8 for q4_0 nibbles, 0 otherwise) */
    float *ds;     /* (nb, n) d * sum(q): q4_1's min term */
} kv_q8a;

/* Activation rows per group of the packed float layout. */
#define KV_MM_XGROUP 16
/* n at and above which the SIMD kernels use packed panels (and, for float
 * weights, the driver packs x); below it they read weights and x directly.
 * Speed only: both kernel families compute each output with the same fp32
 * operations in the same order, so results do not depend on n. */
#define KV_MM_PACK_MIN_N 3

/* One matmul y(n, M) = x(n, K) . W^T, as the kernels see it. */
typedef struct kv_mm_args {
    kv_type type;     /* weight type */
    int64_t K;        /* row length (ne0) */
    int64_t M;        /* rows (ne1) = output features; y's row stride */
    size_t nb1;       /* bytes per weight row */
    const uint8_t *w; /* (M, nb1) */
    int n;            /* activation rows */
    const float *x;   /* (n, K) */
    float *y;         /* (n, M) */
    kv_q8a a;         /* x quantized (quantized weight types only) */
    const float *xp;  /* x packed (float types, n >= KV_MM_PACK_MIN_N, SIMD
                         ISAs): (ceil(n / 16), K, 16), rows past n zero; else NULL */
} kv_mm_args;

/* Weight zero point the activation corrections (ioff) are made for. */
int kv_mm_zero_point(kv_type t);

/* Bytes of per-thread scratch a rows function may use for a K-long row. */
size_t kv_mm_scratch_bytes(int64_t K);

/* Computes y[j][r] for every j < n and r0 <= r < r1. scratch: per-thread,
 * kv_mm_scratch_bytes(K) bytes, 64-byte aligned. Contract of every ISA's
 * implementation: y[j][r] depends only on weight row r and activation row
 * j (their values, not n, j's position, r0/r1 or the thread), bit for bit
 * (batch invariance: tests/kernels/test_kernels.c checks it). */
typedef void (*kv_mm_rows_fn)(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);

/* Quantizes one activation row of K floats (K % 32 == 0) into q8a arrays:
 * the pointers address the row's block 0, block b is bstride blocks further
 * (qs + b * bstride * 32, d + b * bstride, ...). zp: see kv_q8a.ioff. Every
 * ISA produces bit-identical results (round-half-even, same arithmetic). */
typedef void (*kv_q8a_row_fn)(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff,
                              float *ds, int zp);
/* Packs activation groups g0..g1 of x (n, K) into xp (see kv_mm_args.xp). */
typedef void (*kv_mm_xpack_fn)(const float *x, int n, int64_t K, float *xp, int g0, int g1);

/* Per-ISA entry points; NULL when not compiled for this target. */
typedef struct kv_mm_isa_kernels {
    kv_mm_rows_fn rows;      /* any supported type, any n */
    kv_q8a_row_fn quantize;  /* activation quantizer */
    kv_mm_xpack_fn xpack;    /* float activation packer; NULL: kernels read x as is */
} kv_mm_isa_kernels;

void kv_mm_rows_ref(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_ref(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                    int zp);

#ifdef KV_HAVE_X86_KERNELS
void kv_mm_rows_avx2(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_avx2(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                     int zp);
void kv_mm_xpack_avx2(const float *x, int n, int64_t K, float *xp, int g0, int g1);
void kv_mm_rows_avx512(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_avx512(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                       int zp);
void kv_mm_xpack_avx512(const float *x, int n, int64_t K, float *xp, int g0, int g1);
#endif

/* ---- the driver --------------------------------------------------------- */

/* What one matmul may use, lent by its caller (the cpu backend owns these
 * and sizes them once, see kv_mm_scratch_bytes / kv_mm_act_bytes). */
typedef struct kv_mm_env {
    kv_threadpool *pool;   /* NULL: the calling thread only */
    void *const *scratch;  /* (pool size) per-thread buffers of scratch_bytes, 64-byte aligned */
    size_t scratch_bytes;
    void *act;             /* shared activation buffer of act_bytes, 64-byte aligned */
    size_t act_bytes;
} kv_mm_env;

/* Bytes of the shared activation buffer a matmul of n rows of K takes for
 * weights of type t with isa's kernels (0: none). */
size_t kv_mm_act_bytes(kv_type t, int n, int64_t K, kv_cpu_isa isa);

/* y(n, w.ne1) = x(n, w.ne0) . w^T with the kernels of isa (an ISA this CPU
 * lacks falls back to scalar), on env's pool and buffers. Returns 0;
 * KV_ERR_INVAL / KV_ERR_UNSUPPORTED for a weight kv_mm_check rejects or
 * bad arguments; KV_ERR_NOMEM when env's buffers are smaller than the call
 * needs. On failure err (may be NULL) says what, and y is filled with NaN
 * (when its size is known) so that an unchecked result is loud. */
int kv_mm_run(const kv_mm_env *env, kv_cpu_isa isa, const kv_tensor *w, const float *x, float *y, int n,
              kv_err *err);

/* Validates a weight for the CPU kernels: 0, or an error naming the type or
 * the shape (err may be NULL). */
int kv_mm_check(const kv_tensor *w, kv_err *err);

/* The scalar oracle: same activation quantization and block arithmetic as
 * the kernels, accumulated in double, one thread. Allocates its own
 * buffers. Returns 0, KV_ERR_INVAL/UNSUPPORTED for a bad tensor, or
 * KV_ERR_NOMEM. */
int kv_cpu_matmul_ref(const kv_tensor *w, const float *x, float *y, int n);

/* Half-precision helpers shared by the kernel files. */
static inline uint16_t kv_mm_rd16(const uint8_t *p) {
    uint16_t v;
    __builtin_memcpy(&v, p, 2);
    return v;
}

#endif
