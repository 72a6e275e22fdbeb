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
cudaError_t kvc_launch_attention(cudaStream_t s, kv_pages kv, int layer, const int32_t *meta, int n, const float *q,
                                 float *out, int n_heads, float scale);
/* Fills count floats at p with NaN (the output of an op that failed). */
cudaError_t kvc_launch_fill_nan(cudaStream_t s, float *p, int64_t count);

#endif
