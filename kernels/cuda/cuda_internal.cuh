/* cuda_internal.cuh - what the CUDA backend's files share: the launchers
 * (middle layer: device pointers in, kernels queued on a stream, the launch
 * status out) and small device helpers (unaligned loads of GGUF block
 * fields, warp reductions, the paged-KV row address). Not a public header. */
#ifndef KV_CUDA_INTERNAL_CUH
#define KV_CUDA_INTERNAL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../backend.h"
#include "../types.h"
}

#define KVC_QK 32 /* elements per block of q8_0 / q4_0 / q4_1 and of the q8 activations */

/* ---- the host-copy table (cuda_copies.cu) ------------------------------------ */

/* A device copy of host bytes, keyed by the host address. */
typedef struct kvc_copy {
    const void *host; /* key; NULL: empty slot */
    void *dev;
    size_t bytes;     /* bytes copied (the allocation's size) */
} kvc_copy;
/* Open addressing, power-of-two capacity, at most half full. */
typedef struct kvc_copies {
    kvc_copy *t;
    size_t cap, count;
} kvc_copies;
/* The entry for host, NULL when there is none. */
kvc_copy *kvc_copy_find(kvc_copies *c, const void *host);
/* The entry for host, inserted empty when new; NULL when memory ran out. */
kvc_copy *kvc_copy_slot(kvc_copies *c, const void *host);
/* Frees every device copy and the table. */
void kvc_copies_drop(kvc_copies *c);

/* ---- device helpers -------------------------------------------------------- */

/* GGUF blocks are packed (q8_0 is 34 bytes, q4_0 18), so their fields are
 * only 2-byte aligned: every read goes through 16-bit loads. */
__device__ __forceinline__ uint32_t kvc_ld16(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ uint32_t kvc_ld32_a2(const uint8_t *p) {
    return kvc_ld16(p) | (kvc_ld16(p + 2) << 16);
}
/* 4 bytes at any alignment (the f32 scales behind quantized KV rows). */
__device__ __forceinline__ float kvc_ldf_a1(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    return __uint_as_float(u);
}
__device__ __forceinline__ void kvc_stf_a1(uint8_t *p, float f) {
    uint32_t u = __float_as_uint(f);
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

/* IEEE binary16 bits -> float (exact; the hardware conversion). */
__device__ __forceinline__ float kvc_h2f(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }
__device__ __forceinline__ float kvc_bf2f(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ float kvc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ int kvc_warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float kvc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float kvc_warp_min(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Grid size for a grid-stride loop over count elements. */
static inline unsigned kvc_grid_for(int64_t count, int threads) {
    int64_t g = (count + threads - 1) / threads;
    return (unsigned)(g > 65535 ? 65535 : g < 1 ? 1 : g);
}

/* Byte offset of the row of kv head g at physical slot `slot` in `layer`:
 * backend.h's kv_pages_row_offset(), whose layout inside a block is
 * (n_kv_heads, block_size, row_bytes), made callable on the device. The
 * only place the kernels know that layout. */
__host__ __device__ __forceinline__ size_t kvc_row_offset(const kv_pages &kv, int layer, int64_t slot, int g) {
    const int64_t blk = slot / kv.block_size, off = slot % kv.block_size;
    return (size_t)layer * kv.layer_bytes +
           (((size_t)blk * (size_t)kv.n_kv_heads + (size_t)g) * (size_t)kv.block_size + (size_t)off) * kv.row_bytes;
}

/* ---- launchers (cuda_matmul.cu) -------------------------------------------- */

/* x(n, K) -> q8 activation blocks: xq(n, K) int8, xd(n, K/32) = amax/127
 * (NaN for a block holding inf/NaN), xs(n, K/32) = xd * sum(q); the CPU
 * backend's arithmetic exactly (kv_q8a_row_ref). K % 32 == 0. */
cudaError_t kvc_launch_quantize_q8a(cudaStream_t s, const float *x, int n, int64_t K, int8_t *xq, float *xd,
                                    float *xs);
/* y(n, M) = W(M rows of nb1 bytes, type t in q8_0/q4_0/q4_1) . q8 x. */
cudaError_t kvc_launch_matmul_q(cudaStream_t s, kv_type t, const uint8_t *w, size_t nb1, int64_t M, int64_t K,
                                const int8_t *xq, const float *xd, const float *xs, float *y, int n);
/* y(n, M) = W(M rows of nb1 bytes, f32/f16/bf16) . x(n, K). */
cudaError_t kvc_launch_matmul_f(cudaStream_t s, kv_type t, const uint8_t *w, size_t nb1, int64_t M, int64_t K,
                                const float *x, float *y, int n);
/* out(n, ne0) = rows ids[0..n) of W, dequantized; ids outside [0, ne1)
 * give rows of NaN. */
cudaError_t kvc_launch_get_rows(cudaStream_t s, kv_type t, const uint8_t *w, size_t nb1, int64_t ne0, int64_t ne1,
                                const int32_t *ids, float *out, int n);

/* ---- launchers (cuda_ops.cu) ------------------------------------------------ */

cudaError_t kvc_launch_rmsnorm(cudaStream_t s, const float *x, const float *w, float *out, int n, int dim,
                               float eps);
/* inv_freq(rot_dim / 2): base^(-2i / rot_dim), computed on the host with the
 * CPU backend's expression so both rotate by the same angles. */
cudaError_t kvc_launch_rope(cudaStream_t s, float *x, const int32_t *pos, const float *inv_freq, int n, int n_heads,
                            int head_dim, int rot_dim, int neox);
cudaError_t kvc_launch_silu_mul(cudaStream_t s, float *gate, const float *up, int64_t count);
cudaError_t kvc_launch_add(cudaStream_t s, float *x, const float *y, int64_t count);
/* gate = gelu_tanh(gate) * up (kv_gelu_mul_ref's expression); x *= sc;
 * x(n, dim) += bias(dim) on every row. */
cudaError_t kvc_launch_gelu_mul(cudaStream_t s, float *gate, const float *up, int64_t count);
cudaError_t kvc_launch_scale(cudaStream_t s, float *x, float sc, int64_t count);
cudaError_t kvc_launch_add_rows(cudaStream_t s, float *x, const float *bias, int n, int dim);

/* ---- launchers (cuda_attention.cu) ------------------------------------------ */

/* The batch as the kernels read it, one int32 array on the device:
 *   [0, n)       pos of token i
 *   [n, 2n)      slot of token i (-1: out of the pool, not stored)
 *   [2n, 3n)     offset of token i's block table in the tables part
 *                (-1: a bad table; its attention output is NaN)
 *   [3n, ...)    the block tables of the batch's sequences, back to back */
#define KVC_META_POS(n) 0
#define KVC_META_SLOT(n) (n)
#define KVC_META_TAB(n) (2 * (n))
#define KVC_META_TABLES(n) (3 * (n))

/* Largest head_dim the attention kernel takes. */
#define KVC_MAX_HEAD_DIM 512

cudaError_t kvc_launch_kv_store(cudaStream_t s, kv_pages kv, int layer, const int32_t *meta, int n, const float *k,
                                const float *v);
/* window > 0: a token at position p reads positions > p - window only
 * (its table's entries below may be -1; an entry it reads that is negative
 * makes its output NaN). */
cudaError_t kvc_launch_attention(cudaStream_t s, kv_pages kv, int layer, const int32_t *meta, int n, const float *q,
                                 float *out, int n_heads, float scale, int window);
/* Fills count floats at p with NaN (the output of an op that failed). */
cudaError_t kvc_launch_fill_nan(cudaStream_t s, float *p, int64_t count);

/* ---- the backend's host side, for its files past cuda_backend.cu ------------ */

struct cuda_ctx;
/* Host inputs staged to the device, one buffer per use. */
enum { STAGE_IDS, STAGE_POS, STAGE_META, STAGE_FREQ, STAGE_COUNT };

/* Makes the backend's device current and names the running op. */
cuda_ctx *kvc_enter(kv_backend *b, const char *op);
/* Records a failure of the running op (the first since the last status). */
__attribute__((format(printf, 3, 4))) void kvc_fail(cuda_ctx *c, int code, const char *fmt, ...);
/* After a launch: records a failure under `what`; 0 or -1. */
int kvc_done(cuda_ctx *c, cudaError_t e, const char *what);
/* Fills count floats with NaN (the output of an op that failed). */
void kvc_nan_out(cuda_ctx *c, float *p, int64_t count);
/* bytes host bytes at p on the device (p itself when it is a device
 * pointer); NULL on failure (recorded). */
const void *kvc_stage_in(cuda_ctx *c, int slot, const void *p, size_t bytes);
/* A model vector (a norm weight, a bias) on the device: cached by host
 * address, or p when it is a device pointer. NULL on failure (recorded). */
const float *kvc_host_vec(cuda_ctx *c, const float *p, size_t bytes);
/* inv_freq(rot_dim / 2) = base^(-2i / rot_dim) on the device, cached. */
const float *kvc_rope_freqs(cuda_ctx *c, int rot_dim, float base);
/* The attention batch meta (KVC_META layout) on the device; tables: 0 slots
 * only, 1 checked block tables, 2 tables that may hold -1 below a window. */
const int32_t *kvc_batch_meta(cuda_ctx *c, const kv_pages *kv, const kv_attn_batch *ab, int tables);
cudaStream_t kvc_stream(cuda_ctx *c);

/* The ops of cuda_ext.cu (backend.h's entries). */
void kvc_gelu_mul(kv_backend *b, float *gate, const float *up, int64_t count);
void kvc_scale(kv_backend *b, float *x, float s, int64_t count);
void kvc_add_rows(kv_backend *b, float *x, const float *bias, int n, int dim);
void kvc_rope_ext(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                  float base, int neox, float freq_scale, const float *freq_factors);
void kvc_attention_window(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                          float *out, int n_heads, float scale, int window);
/* The ops of cuda_moe.cu. */
void kvc_moe_route(kv_backend *b, const float *logits, int n, int n_expert, int k, int norm, int32_t *ids,
                   float *weights);
void kvc_scatter_add(kv_backend *b, float *x, const float *y, const int32_t *rows, const float *w, int n, int dim);

#endif
