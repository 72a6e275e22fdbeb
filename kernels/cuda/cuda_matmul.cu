/* cuda_matmul.cu - the CUDA matmul and get_rows kernels and their launchers.
 * Quantized weights (q8_0, q4_0, q4_1) are decoded in registers from their
 * GGUF blocks and multiplied with activations quantized to 8 bits per
 * 32-block exactly as the CPU backend does it, using dp4a integer dot
 * products, so both backends agree to float rounding of the block sums.
 * Float weights (f32, f16, bf16) are converted on load. Small batches
 * (n <= KVC_MMV_MAX_N) take one warp per output row; larger ones a 64 x 64
 * tile per thread block through shared memory. Correctness first: no tensor
 * cores yet. */
#include "cuda_internal.cuh"

#define KVC_MMV_MAX_N 8 /* activation rows one mat-vec warp handles at once */
#define KVC_MMV_WARPS 4 /* warps (= weight rows) per mat-vec thread block */
#define KVC_TILE 64     /* tile edge of the batched kernels (weight rows x activation rows) */

/* ---- weight blocks ---------------------------------------------------------- */

template <int T> struct blk_traits { static constexpr int bytes = 0; }; /* float types: no blocks */
template <> struct blk_traits<KV_TYPE_Q8_0> { static constexpr int bytes = 34; };
template <> struct blk_traits<KV_TYPE_Q4_0> { static constexpr int bytes = 18; };
template <> struct blk_traits<KV_TYPE_Q4_1> { static constexpr int bytes = 20; };

/* Word ww (0..7) of a block's 32 quantized values as 4 signed bytes, in
 * element order (word w holds elements 4w..4w+3): q8_0 as stored, q4_0 as
 * nibble - 8, q4_1 as the unsigned nibble (its min is added separately). */
template <int T> __device__ __forceinline__ int32_t wword(const uint8_t *blk, int ww) {
    if (T == KV_TYPE_Q8_0) return (int32_t)kvc_ld32_a2(blk + 2 + 4 * ww);
    const int off = T == KV_TYPE_Q4_1 ? 4 : 2;
    const uint32_t raw = kvc_ld32_a2(blk + off + 4 * (ww & 3));
    const uint32_t nib = ww < 4 ? raw & 0x0F0F0F0Fu : (raw >> 4) & 0x0F0F0F0Fu;
    if (T == KV_TYPE_Q4_0) return (int32_t)__vsub4(nib, 0x08080808u);
    return (int32_t)nib;
}

/* One block of a weight row against one q8 activation block (8 words). */
template <int T>
__device__ __forceinline__ float block_dot(const int32_t (&wq)[8], float d, float m, const int8_t *aq, float da,
                                           float ds) {
    const int4 a0 = *(const int4 *)aq, a1 = *(const int4 *)(aq + 16);
    int isum = __dp4a(wq[0], a0.x, 0);
    isum = __dp4a(wq[1], a0.y, isum);
    isum = __dp4a(wq[2], a0.z, isum);
    isum = __dp4a(wq[3], a0.w, isum);
    isum = __dp4a(wq[4], a1.x, isum);
    isum = __dp4a(wq[5], a1.y, isum);
    isum = __dp4a(wq[6], a1.z, isum);
    isum = __dp4a(wq[7], a1.w, isum);
    float r = (float)isum * (d * da);
    if (T == KV_TYPE_Q4_1) r += m * ds;
    return r;
}

/* Element k of a float-typed row. */
template <int T> __device__ __forceinline__ float ldw(const uint8_t *row, int64_t k) {
    if (T == KV_TYPE_F32) return ((const float *)row)[k];
    const uint32_t h = ((const uint16_t *)row)[k];
    return T == KV_TYPE_F16 ? kvc_h2f(h) : kvc_bf2f(h);
}

/* Element k of a row of any supported type (get_rows). */
template <int T> __device__ __forceinline__ float deq(const uint8_t *row, int64_t k) {
    if constexpr (T == KV_TYPE_F32 || T == KV_TYPE_F16 || T == KV_TYPE_BF16) return ldw<T>(row, k);
    const uint8_t *blk = row + (k / KVC_QK) * blk_traits<T>::bytes;
    const int i = (int)(k % KVC_QK);
    const float d = kvc_h2f(kvc_ld16(blk));
    if (T == KV_TYPE_Q8_0) return (float)(int8_t)blk[2 + i] * d;
    const int off = T == KV_TYPE_Q4_1 ? 4 : 2;
    const uint8_t byte = blk[off + (i & 15)];
    const int q = i < 16 ? byte & 15 : byte >> 4;
    if (T == KV_TYPE_Q4_0) return (float)(q - 8) * d;
    /* q * d + m, rounded twice as the CPU does (no fused multiply-add) */
    return __fadd_rn(__fmul_rn((float)q, d), kvc_h2f(kvc_ld16(blk + 2)));
}

/* ---- activation quantization ------------------------------------------------ */

/* One warp per 32-element block; lane i holds element i. */
__global__ void k_quantize_q8a(const float *x, int n, int64_t K, int8_t *xq, float *xd, float *xs) {
    const int64_t nb = K / KVC_QK;
    const int64_t gb = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (gb >= (int64_t)n * nb) return; /* whole warps leave together */
    const int lane = threadIdx.x & 31;
    const float v = x[gb * KVC_QK + lane]; /* row j, block b sit at (j * nb + b) * 32 */
    /* the CPU ignores NaN in the max (v > amax is false) and so does fmaxf */
    const float amax = kvc_warp_max(fabsf(v));
    const int bad = __any_sync(0xffffffffu, v != v);
    float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float vv = v * id;
    const int q = (vv >= -127.5f && vv <= 127.5f) ? __float2int_rn(vv) : 0;
    int sum = kvc_warp_sum_i(q);
    if (bad || isinf(amax)) { /* a non-finite block poisons its dots, as on the CPU */
        d = __int_as_float(0x7fc00000);
        sum = 0;
    }
    xq[gb * KVC_QK + lane] = (int8_t)q;
    if (lane == 0) {
        xd[gb] = d;
        xs[gb] = d * (float)sum;
    }
}

/* ---- mat-vec: one warp per weight row, up to KVC_MMV_MAX_N activation rows -- */

/* The output rows of one mat-vec warp: weight row r (its bytes at row),
 * activation rows j0 .. j0 + nc of this block; lane: the thread's lane. */
typedef struct mmv_warp {
    int lane, j0, nc;
    int64_t r;
    const uint8_t *row;
} mmv_warp;

/* This thread's warp over weights w (rows nb1 bytes apart); false when its
 * weight row is past M (nothing to do). */
__device__ __forceinline__ bool mmv_warp_of(const uint8_t *w, size_t nb1, int64_t M, int n, mmv_warp *wp) {
    wp->lane = threadIdx.x & 31;
    wp->r = (int64_t)blockIdx.x * KVC_MMV_WARPS + threadIdx.x / 32;
    wp->j0 = blockIdx.y * KVC_MMV_MAX_N;
    wp->nc = min(KVC_MMV_MAX_N, n - wp->j0);
    wp->row = w + (size_t)wp->r * nb1;
    return wp->r < M;
}

/* Each lane's partial dots summed over the warp; lane 0 stores them. */
__device__ __forceinline__ void mmv_store(const float (&acc)[KVC_MMV_MAX_N], const mmv_warp &wp, int64_t M, float *y) {
#pragma unroll
    for (int c = 0; c < KVC_MMV_MAX_N; c++) {
        const float s = kvc_warp_sum(acc[c]);
        if (wp.lane == 0 && c < wp.nc) y[(size_t)(wp.j0 + c) * M + wp.r] = s;
    }
}

template <int T>
__global__ void __launch_bounds__(KVC_MMV_WARPS * 32)
    k_mmv_q(const uint8_t *w, size_t nb1, int64_t M, int64_t nb, const int8_t *xq, const float *xd, const float *xs,
            float *y, int n) {
    mmv_warp wp;
    if (!mmv_warp_of(w, nb1, M, n, &wp)) return;
    float acc[KVC_MMV_MAX_N] = {};
    for (int64_t b = wp.lane; b < nb; b += 32) {
        const uint8_t *blk = wp.row + (size_t)b * blk_traits<T>::bytes;
        int32_t wq[8];
#pragma unroll
        for (int ww = 0; ww < 8; ww++) wq[ww] = wword<T>(blk, ww);
        const float d = kvc_h2f(kvc_ld16(blk));
        const float m = T == KV_TYPE_Q4_1 ? kvc_h2f(kvc_ld16(blk + 2)) : 0.0f;
#pragma unroll
        for (int c = 0; c < KVC_MMV_MAX_N; c++) {
            if (c < wp.nc) {
                const int64_t ab = (int64_t)(wp.j0 + c) * nb + b;
                acc[c] += block_dot<T>(wq, d, m, xq + ab * KVC_QK, xd[ab], xs[ab]);
            }
        }
    }
    mmv_store(acc, wp, M, y);
}

template <int T>
__global__ void __launch_bounds__(KVC_MMV_WARPS * 32)
    k_mmv_f(const uint8_t *w, size_t nb1, int64_t M, int64_t K, const float *x, float *y, int n) {
    mmv_warp wp;
    if (!mmv_warp_of(w, nb1, M, n, &wp)) return;
    float acc[KVC_MMV_MAX_N] = {};
    for (int64_t k = wp.lane; k < K; k += 32) {
        const float wv = ldw<T>(wp.row, k);
#pragma unroll
        for (int c = 0; c < KVC_MMV_MAX_N; c++)
            if (c < wp.nc) acc[c] += wv * x[(size_t)(wp.j0 + c) * K + k];
    }
    mmv_store(acc, wp, M, y);
}

/* ---- batched: a KVC_TILE x KVC_TILE output tile per block, 4 x 4 per thread --
 * Thread (tx, ty) of 16 x 16 owns weight rows tx + 16 i and activation rows
 * ty + 16 c, so the stores y[j * M + r] are coalesced along tx. */

/* The thread's 4 x 4 outputs of the tile at (r0, j0), those inside (M, n). */
__device__ __forceinline__ void tile_store(const float (&acc)[4][4], int64_t r0, int j0, int tx, int ty, int64_t M,
                                           int n, float *y) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int64_t r = r0 + tx + 16 * i;
            const int j = j0 + ty + 16 * c;
            if (r < M && j < n) y[(size_t)j * M + r] = acc[i][c];
        }
}

template <int T>
__global__ void __launch_bounds__(256)
    k_mm_q_tiled(const uint8_t *w, size_t nb1, int64_t M, int64_t nb, const int8_t *xq, const float *xd,
                 const float *xs, float *y, int n) {
    __shared__ int32_t sw[KVC_TILE][9]; /* (+1 word: no bank conflicts along rows) */
    __shared__ int32_t sa[KVC_TILE][9];
    __shared__ float swd[KVC_TILE], swm[KVC_TILE], sad[KVC_TILE], sas[KVC_TILE];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t r0 = (int64_t)blockIdx.x * KVC_TILE;
    const int j0 = blockIdx.y * KVC_TILE;
    float acc[4][4] = {};
    for (int64_t b = 0; b < nb; b++) {
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int wi = tid + 256 * s, rr = wi / 8, ww = wi % 8;
            const int64_t r = r0 + rr;
            sw[rr][ww] = r < M ? wword<T>(w + (size_t)r * nb1 + (size_t)b * blk_traits<T>::bytes, ww) : 0;
            const int j = j0 + rr;
            sa[rr][ww] = j < n ? *(const int32_t *)(xq + ((int64_t)j * nb + b) * KVC_QK + 4 * ww) : 0;
        }
        if (tid < KVC_TILE) {
            const int64_t r = r0 + tid;
            float d = 0.0f, m = 0.0f; /* padding rows: zeros, never NaN */
            if (r < M) {
                const uint8_t *blk = w + (size_t)r * nb1 + (size_t)b * blk_traits<T>::bytes;
                d = kvc_h2f(kvc_ld16(blk));
                if (T == KV_TYPE_Q4_1) m = kvc_h2f(kvc_ld16(blk + 2));
            }
            swd[tid] = d;
            swm[tid] = m;
        } else if (tid < 2 * KVC_TILE) {
            const int jj = tid - KVC_TILE, j = j0 + jj;
            sad[jj] = j < n ? xd[(int64_t)j * nb + b] : 0.0f;
            sas[jj] = j < n ? xs[(int64_t)j * nb + b] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int rr = tx + 16 * i;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int jj = ty + 16 * c;
                int isum = 0;
#pragma unroll
                for (int ww = 0; ww < 8; ww++) isum = __dp4a(sw[rr][ww], sa[jj][ww], isum);
                float v = (float)isum * (swd[rr] * sad[jj]);
                if (T == KV_TYPE_Q4_1) v += swm[rr] * sas[jj];
                acc[i][c] += v;
            }
        }
        __syncthreads();
    }
    tile_store(acc, r0, j0, tx, ty, M, n, y);
}

template <int T>
__global__ void __launch_bounds__(256)
    k_mm_f_tiled(const uint8_t *w, size_t nb1, int64_t M, int64_t K, const float *x, float *y, int n) {
    __shared__ float sw[KVC_TILE][33], sx[KVC_TILE][33];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t r0 = (int64_t)blockIdx.x * KVC_TILE;
    const int j0 = blockIdx.y * KVC_TILE;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
#pragma unroll
        for (int s = 0; s < 8; s++) {
            const int e = tid + 256 * s, rr = e / 32, kk = e % 32;
            const int64_t r = r0 + rr, k = k0 + kk;
            const int j = j0 + rr;
            sw[rr][kk] = r < M && k < K ? ldw<T>(w + (size_t)r * nb1, k) : 0.0f;
            sx[rr][kk] = j < n && k < K ? x[(size_t)j * K + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < 32; kk++) {
            float wv[4], xv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) wv[i] = sw[tx + 16 * i][kk];
#pragma unroll
            for (int c = 0; c < 4; c++) xv[c] = sx[ty + 16 * c][kk];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[i][c] += wv[i] * xv[c];
        }
        __syncthreads();
    }
    tile_store(acc, r0, j0, tx, ty, M, n, y);
}

/* ---- get_rows: one block per output row ------------------------------------- */

template <int T>
__global__ void k_get_rows(const uint8_t *w, size_t nb1, int64_t ne0, int64_t ne1, const int32_t *ids, float *out) {
    const int i = blockIdx.x;
    const int32_t id = ids[i];
    float *o = out + (size_t)i * ne0;
    /* NOTE: as on the CPU, an out-of-range id (a caller bug) gives NaN, not
     * a read outside the weight. */
    const int ok = id >= 0 && id < ne1;
    const uint8_t *row = w + (size_t)(ok ? id : 0) * nb1;
    for (int64_t k = threadIdx.x; k < ne0; k += blockDim.x) o[k] = ok ? deq<T>(row, k) : __int_as_float(0x7fc00000);
}

/* ---- launchers --------------------------------------------------------------- */

cudaError_t kvc_launch_quantize_q8a(cudaStream_t s, const float *x, int n, int64_t K, int8_t *xq, float *xd,
                                    float *xs) {
    const int64_t blocks = (int64_t)n * (K / KVC_QK);
    if (blocks <= 0) return cudaSuccess;
    k_quantize_q8a<<<(unsigned)((blocks + 7) / 8), 256, 0, s>>>(x, n, K, xq, xd, xs);
    return cudaGetLastError();
}

template <int T>
static void launch_q(cudaStream_t s, const uint8_t *w, size_t nb1, int64_t M, int64_t nb, const int8_t *xq,
                     const float *xd, const float *xs, float *y, int n) {
    if (n <= KVC_MMV_MAX_N) {
        dim3 grid((unsigned)((M + KVC_MMV_WARPS - 1) / KVC_MMV_WARPS), 1);
        k_mmv_q<T><<<grid, KVC_MMV_WARPS * 32, 0, s>>>(w, nb1, M, nb, xq, xd, xs, y, n);
    } else {
        dim3 grid((unsigned)((M + KVC_TILE - 1) / KVC_TILE), (unsigned)((n + KVC_TILE - 1) / KVC_TILE));
        k_mm_q_tiled<T><<<grid, 256, 0, s>>>(w, nb1, M, nb, xq, xd, xs, y, n);
    }
}

cudaError_t kvc_launch_matmul_q(cudaStream_t s, kv_type t, const uint8_t *w, size_t nb1, int64_t M, int64_t K,
                                const int8_t *xq, const float *xd, const float *xs, float *y, int n) {
    if (M <= 0 || n <= 0) return cudaSuccess;
    const int64_t nb = K / KVC_QK;
    switch (t) {
    case KV_TYPE_Q8_0: launch_q<KV_TYPE_Q8_0>(s, w, nb1, M, nb, xq, xd, xs, y, n); break;
    case KV_TYPE_Q4_0: launch_q<KV_TYPE_Q4_0>(s, w, nb1, M, nb, xq, xd, xs, y, n); break;
    case KV_TYPE_Q4_1: launch_q<KV_TYPE_Q4_1>(s, w, nb1, M, nb, xq, xd, xs, y, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <int T>
static void launch_f(cudaStream_t s, const uint8_t *w, size_t nb1, int64_t M, int64_t K, const float *x, float *y,
                     int n) {
    if (n <= KVC_MMV_MAX_N) {
        dim3 grid((unsigned)((M + KVC_MMV_WARPS - 1) / KVC_MMV_WARPS), 1);
        k_mmv_f<T><<<grid, KVC_MMV_WARPS * 32, 0, s>>>(w, nb1, M, K, x, y, n);
    } else {
        dim3 grid((unsigned)((M + KVC_TILE - 1) / KVC_TILE), (unsigned)((n + KVC_TILE - 1) / KVC_TILE));
        k_mm_f_tiled<T><<<grid, 256, 0, s>>>(w, nb1, M, K, x, y, n);
    }
}

cudaError_t kvc_launch_matmul_f(cudaStream_t s, kv_type t, const uint8_t *w, size_t nb1, int64_t M, int64_t K,
                                const float *x, float *y, int n) {
    if (M <= 0 || n <= 0) return cudaSuccess;
    switch (t) {
    case KV_TYPE_F32: launch_f<KV_TYPE_F32>(s, w, nb1, M, K, x, y, n); break;
    case KV_TYPE_F16: launch_f<KV_TYPE_F16>(s, w, nb1, M, K, x, y, n); break;
    case KV_TYPE_BF16: launch_f<KV_TYPE_BF16>(s, w, nb1, M, K, x, y, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t kvc_launch_get_rows(cudaStream_t s, kv_type t, const uint8_t *w, size_t nb1, int64_t ne0, int64_t ne1,
                                const int32_t *ids, float *out, int n) {
    if (n <= 0 || ne0 <= 0) return cudaSuccess;
    const int threads = ne0 >= 256 ? 256 : 64;
    switch (t) {
    case KV_TYPE_F32: k_get_rows<KV_TYPE_F32><<<n, threads, 0, s>>>(w, nb1, ne0, ne1, ids, out); break;
    case KV_TYPE_F16: k_get_rows<KV_TYPE_F16><<<n, threads, 0, s>>>(w, nb1, ne0, ne1, ids, out); break;
    case KV_TYPE_BF16: k_get_rows<KV_TYPE_BF16><<<n, threads, 0, s>>>(w, nb1, ne0, ne1, ids, out); break;
    case KV_TYPE_Q8_0: k_get_rows<KV_TYPE_Q8_0><<<n, threads, 0, s>>>(w, nb1, ne0, ne1, ids, out); break;
    case KV_TYPE_Q4_0: k_get_rows<KV_TYPE_Q4_0><<<n, threads, 0, s>>>(w, nb1, ne0, ne1, ids, out); break;
    case KV_TYPE_Q4_1: k_get_rows<KV_TYPE_Q4_1><<<n, threads, 0, s>>>(w, nb1, ne0, ne1, ids, out); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
