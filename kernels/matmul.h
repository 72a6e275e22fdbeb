/* matmul.h - internal interface between the matmul driver (matmul.c: scalar
 * reference, activation quantization, threading) and the per-ISA kernels
 * (matmul_avx2.c, matmul_avx512.c). Not for engine/ use: the engine calls
 * the backend table (backend.h). */
#ifndef KV_MATMUL_H
#define KV_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"
#include "types.h"

#define KV_QK 32       /* elements per block of q8_0 / q4_0 / q4_1 and of the activation blocks */
#define KV_MM_PANEL 16 /* weight rows per packed panel of the batched kernels */

/* Instruction-set levels of the CPU kernels. */
typedef enum kv_cpu_isa {
    KV_CPU_ISA_SCALAR = 0, /* portable C, the reference */
    KV_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KV_CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ + VNNI (+ AVX2/FMA/F16C) */
    KV_CPU_ISA_COUNT
} kv_cpu_isa;

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
 * (batch invariance: tests/engine/test_kernels.c checks it). */
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

#if defined(__x86_64__) || defined(__i386__)
#define KV_HAVE_X86_KERNELS 1
void kv_mm_rows_avx2(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_avx2(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                     int zp);
void kv_mm_xpack_avx2(const float *x, int n, int64_t K, float *xp, int g0, int g1);
void kv_mm_rows_avx512(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_avx512(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                       int zp);
void kv_mm_xpack_avx512(const float *x, int n, int64_t K, float *xp, int g0, int g1);
#endif

/* Half-precision helpers shared by the kernel files. */
static inline uint16_t kv_mm_rd16(const uint8_t *p) {
    uint16_t v;
    __builtin_memcpy(&v, p, 2);
    return v;
}

#endif
