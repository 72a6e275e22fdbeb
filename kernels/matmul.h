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
                      8 for q4_0 nibbles, 16 for q5_0's 5-bit values, 0
                      otherwise) */
    float *ds;     /* (nb, n) d * sum(q): q4_1's min term */
} kv_q8a;

/* Bytes of a q8_0 / q4_0 / q4_1 / q5_0 block, and of its header before the
 * nibbles or quants (d; q4_1: d and m; q5_0: d and the 32 fifth bits qh). */
static inline size_t kv_mm_qblk_bytes(kv_type t) {
    return t == KV_TYPE_Q8_0 ? 34 : t == KV_TYPE_Q4_0 ? 18 : t == KV_TYPE_Q5_0 ? 22 : 20;
}
static inline size_t kv_mm_qblk_qoff(kv_type t) { return t == KV_TYPE_Q4_1 ? 4 : t == KV_TYPE_Q5_0 ? 6 : 2; }
/* q5_0's fifth bits: bit i of the little-endian u32 at byte 2 is element i's. */
static inline uint32_t kv_mm_q5_qh(const uint8_t *blk) {
    uint32_t v;
    __builtin_memcpy(&v, blk + 2, 4);
    return v;
}

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
    const float *xp;  /* x packed (float types, n >= KV_MM_PACK_MIN_N, ISAs
                         with a packer: AVX2; the AVX-512 float kernels read
                         x in place): (ceil(n / 16), K, 16), rows past n zero;
                         else NULL */
    const uint8_t *wp; /* w as pre-packed panels (kv_mm_panels_pack), or NULL */
} kv_mm_args;

/* Pre-packed panels (q8_0, q5_0, q4_0, q4_1), the layout the AVX-512
 * kernels read without repacking, made once per weight (the cpu backend's
 * prepare_weight). A panel of 16 rows is one sequential stream of block
 * pairs: blocks 2i and 2i+1 are their two headers, then their two quants
 * (an odd nb's last pair has a zero second block).
 *  - header of block b: the 16 rows' fp16 d (32 bytes); q5_0 then 8 masks
 *    of 64 bits, mask G bit 4r + i = the fifth bit of element 4G + i of
 *    row r (64 bytes); q4_1 then the 16 rows' fp16 m (32 bytes)
 *  - quants of block b: q8_0: 8 groups of 16 rows x 4 bytes made unsigned
 *    (w ^ 0x80): group g holds elements 4g..4g+3 of every row, the zmm the
 *    kernels broadcast 4 activation bytes against (512 bytes); q4 / q5_0: 4 zmm
 *    of 16 rows x 4 nibble bytes, zmm g = bytes 4g..4g+3 of each row's 16,
 *    so its low nibbles are group g and its high ones group g + 4 (256)
 * A pair is 1088 bytes (q8_0), 704 (q5_0), 576 (q4_0) or 640 (q4_1), whole
 * cache lines (and no more than the rows' own bytes but q5_0's), and every
 * quant group stays 64-byte aligned. NOTE: the earlier layout put a
 * panel's headers before all its quants, so a reader jumped between two
 * streams and skipped the headers' lines as it went: on Zen 4 the
 * hardware prefetcher then streamed one thread at ~18 GB/s where a plain
 * sequential read reaches ~27, and a software prefetch 4 KiB ahead only
 * got it to ~19; read in order, the pairs stream at ~30 with no software
 * prefetch at all (a batch's kernel still prefetches: KV_PP_AHEAD).
 * Panels follow each other (kv_mm_panel_stride); the rows past M of the
 * last one are zero. */
/* Bytes ahead of the block (pair) being read that the pre-packed panel
 * kernels (matmul_avx512.c's qpp_kernel, quant_ext_k512.c's k4pp_kernel)
 * prefetch into L2 when they serve more than one activation row.
 * NOTE: measured on Zen 4, `bench-kernels -t 2 --types q8_0 --n 32
 * --panels`, the 32000 x 768 head: with n > 12 a panel is read once per
 * register block of rows (Q_J_SPLIT), and that back-and-forth loses the
 * hardware prefetcher: 2.73-3.40 ms a call without this, 2.41-2.54 with it
 * (the old split layout's 2.46-2.60), 2.56-2.66 at 2 KiB. At n = 1 the
 * sequential stream is best left to the hardware (one thread, 256 MiB of
 * panels: ~30 GB/s without, ~22 with 4 KiB into L2, ~29.6 with 2 KiB). */
#define KV_PP_AHEAD 4096
static inline size_t kv_mm_panel_hblock(kv_type t) { return t == KV_TYPE_Q5_0 ? 96 : t == KV_TYPE_Q4_1 ? 64 : 32; }
static inline size_t kv_mm_panel_qblock(kv_type t) { return t == KV_TYPE_Q8_0 ? 512 : 256; }
static inline size_t kv_mm_panel_pair(kv_type t) { return 2 * (kv_mm_panel_hblock(t) + kv_mm_panel_qblock(t)); }
/* Offsets of block b's header and quants from its panel's start. */
static inline size_t kv_mm_panel_hoff(kv_type t, int64_t b) {
    return (size_t)(b >> 1) * kv_mm_panel_pair(t) + (size_t)(b & 1) * kv_mm_panel_hblock(t);
}
static inline size_t kv_mm_panel_qoff(kv_type t, int64_t b) {
    return (size_t)(b >> 1) * kv_mm_panel_pair(t) + 2 * kv_mm_panel_hblock(t) + (size_t)(b & 1) * kv_mm_panel_qblock(t);
}
static inline size_t kv_mm_panel_stride(kv_type t, int64_t nb) {
    return (size_t)((nb + 1) >> 1) * kv_mm_panel_pair(t);
}
/* Bytes of w's panels, or 0 when w's type has no panel layout for isa. */
size_t kv_mm_panels_bytes(const kv_tensor *w, kv_cpu_isa isa);
/* Packs w into dst (kv_mm_panels_bytes bytes, 64-byte aligned) on pool
 * (NULL: this thread). */
void kv_mm_panels_pack(const kv_tensor *w, uint8_t *dst, kv_threadpool *pool);

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

/* The last step of every ISA's quantizer: block o's scale db and quant sum
 * into the q8a arrays. A block that held inf or NaN (nonfinite) gets
 * d = NaN, which poisons its dots, and sum 0. */
static inline void kv_q8a_put(float *d, int32_t *ioff, float *ds, size_t o, float db, int sum, int nonfinite, int zp) {
    if (nonfinite) {
        db = __builtin_nanf("");
        sum = 0;
    }
    d[o] = db;
    ioff[o] = -zp * sum;
    ds[o] = db * (float)sum;
}
/* Packs one group of kv_mm_args.xp: `rows` (<= KV_MM_XGROUP) activation
 * rows of K floats at src into dst (K, 16), rows past `rows` zero. The
 * driver walks the groups. */
typedef void (*kv_mm_xpack_fn)(const float *src, int rows, int64_t K, float *dst);

/* Per-ISA entry points; NULL when not compiled for this target. */
typedef struct kv_mm_isa_kernels {
    kv_mm_rows_fn rows;      /* any supported type, any n */
    kv_q8a_row_fn quantize;  /* activation quantizer */
    kv_mm_xpack_fn xpack;    /* float activation packer; NULL: kernels read x as is */
} kv_mm_isa_kernels;

void kv_mm_rows_ref(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_ref(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                    int zp);

/* k-chunk of the packed float kernels: the panel's slice (KV_MM_KC x 16
 * floats) stays in L1 while every activation group passes over it. */
#define KV_MM_KC 256

/* One group of `left` packed activation rows, the first activation row g0
 * (packed at xg), against a packed weight panel pf of `rows` rows from r0,
 * over k in [k0, k1); adds to y when k0 > 0. */
typedef void (*kv_mm_group_fn)(const kv_mm_args *a, const float *pf, const float *xg, int64_t k0, int64_t k1,
                               int64_t r0, int rows, int g0, int left);

/* The loop of the packed float kernels over one panel: k chunk by chunk,
 * every activation group of kv_mm_args.xp (the ISA's group kernel). */
static inline void kv_mm_panel_groups(const kv_mm_args *a, const float *pf, int64_t r0, int rows, kv_mm_group_fn group) {
    for (int64_t k0 = 0; k0 < a->K; k0 += KV_MM_KC) {
        int64_t k1 = KV_MIN(a->K, k0 + KV_MM_KC);
        for (int g0 = 0; g0 < a->n; g0 += KV_MM_XGROUP)
            group(a, pf, a->xp + (size_t)(g0 / KV_MM_XGROUP) * (size_t)a->K * KV_MM_XGROUP, k0, k1, r0, rows, g0,
                  KV_MIN(a->n - g0, KV_MM_XGROUP));
    }
}

/* The row-function table of an ISA file: each defines rows_<type> for the
 * seven weight types the SIMD kernels cover (see kv_mm_rows_typed). */
#define KV_MM_ROWS_TABLE                                                                                             \
    {                                                                                                                \
        [KV_TYPE_Q8_0] = rows_KV_TYPE_Q8_0, [KV_TYPE_Q4_0] = rows_KV_TYPE_Q4_0, [KV_TYPE_Q4_1] = rows_KV_TYPE_Q4_1, \
        [KV_TYPE_Q5_0] = rows_KV_TYPE_Q5_0, [KV_TYPE_F32] = rows_KV_TYPE_F32, [KV_TYPE_F16] = rows_KV_TYPE_F16,     \
        [KV_TYPE_BF16] = rows_KV_TYPE_BF16,                                                                          \
    }

/* The partial last tile of a direct kernel: weight rows r..r+rows copied
 * to tw, rb bytes each, back to back; the rows up to `tile` repeat row r
 * (the kernels never store their lanes). */
static inline void kv_mm_copy_tile(const kv_mm_args *a, int64_t r, int rows, int tile, size_t rb, uint8_t *tw) {
    for (int i = 0; i < tile; i++)
        __builtin_memcpy(tw + (size_t)i * rb, a->w + (size_t)(r + (i < rows ? i : 0)) * a->nb1, rb);
}

/* Runs table[a->type], an ISA's row function per weight type, or the
 * scalar reference for a type the ISA has none for (entry NULL). */
static inline void kv_mm_rows_typed(const kv_mm_rows_fn table[KV_TYPE_COUNT], const kv_mm_args *a, int64_t r0,
                                    int64_t r1, void *scratch) {
    kv_mm_rows_fn f = (unsigned)a->type < KV_TYPE_COUNT ? table[a->type] : NULL;
    (f ? f : kv_mm_rows_ref)(a, r0, r1, scratch);
}

#ifdef KV_HAVE_X86_KERNELS
void kv_mm_rows_avx2(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_avx2(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                     int zp);
void kv_mm_xpack_avx2(const float *src, int rows, int64_t K, float *dst);
void kv_mm_rows_avx512(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
void kv_q8a_row_avx512(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                       int zp);
void kv_mm_frows_avx512(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch); /* float weights */
/* AMX-INT8 (matmul_amx.c): q8_0 / q4_0 / q4_1 rows [r0, r1) for every
 * activation row on the tiles (any n; worth it from ~8 rows), bit-identical
 * to the AVX-512 kernels; scratch: kv_mm_scratch_bytes(K). The tile
 * configuration is loaded and released on the calling thread
 * (kv_mm_amx_begin / kv_mm_amx_end). */
void kv_mm_amx_begin(void);
void kv_mm_amx_end(void);
void kv_mm_amx_rows(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch);
#endif
/* 1 when the AVX-512 batched quantized kernels use AMX tiles: the CPU
 * supports them (kv_cpu_amx_supported) and KVTOP_CPU_AMX is not "0". */
int kv_mm_amx_on(void);
/* Turns the AMX path on (when supported) or off, process-wide; returns the
 * previous state. For tests and A/B runs: results do not change. */
int kv_mm_amx_set(int on);

/* ---- the driver --------------------------------------------------------- */

/* What one matmul may use, lent by its caller (the cpu backend owns these
 * and sizes them once, see kv_mm_scratch_bytes / kv_mm_act_bytes). */
typedef struct kv_mm_env {
    kv_threadpool *pool;   /* NULL: the calling thread only */
    void *const *scratch;  /* (pool size) per-thread buffers of scratch_bytes, 64-byte aligned */
    size_t scratch_bytes;
    void *act;             /* shared activation buffer: act_regions regions of act_bytes
                              (a multiple of 64) side by side, 64-byte aligned */
    size_t act_bytes;
    int act_regions;       /* one per activation format of a kv_mm_run_multi call; <= 1: one.
                              One x in one format takes at most one region; a
                              kv_mm_run_groups pass packs many small ones into them */
    /* the pre-packed panels of a weight (kv_mm_panels_pack), or NULL: the
     * kernels read w as it is; panels NULL: none are kept */
    const uint8_t *(*panels)(const void *owner, const kv_tensor *w);
    const void *owner;
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

/* The nw (1..KV_MATMUL_MULTI_MAX) matmuls y[i] = x . w[i]^T of one x, the
 * weights with the same ne0: x is prepared once per activation format
 * (in its own region of env->act: a call with more formats than
 * env->act_regions fails with KV_ERR_NOMEM), then one pass splits the
 * rows of all weights over the threads. Every y[i] is bit-identical to
 * kv_mm_run's for w[i]. Errors as kv_mm_run's (every y filled with NaN). */
int kv_mm_run_multi(const kv_mm_env *env, kv_cpu_isa isa, const kv_tensor *const *w, int nw, const float *x,
                    float *const *y, int n, kv_err *err);

/* The ng groups' kv_mm_run_multi calls (each group its own x, n rows):
 * every group's x prepared side by side in env->act, then the rows of all
 * the groups' weights split over the threads in one dispatch; groups that
 * do not fit one pass (more than its weights, or activations past env->act)
 * run in several. Every y bit-identical to kv_mm_run's. Errors as
 * kv_mm_run_multi's (every y filled with NaN). */
int kv_mm_run_groups(const kv_mm_env *env, kv_cpu_isa isa, const kv_matmul_group *g, int ng, kv_err *err);

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
