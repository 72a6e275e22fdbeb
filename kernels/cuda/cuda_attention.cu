/* cuda_attention.cu - the CUDA paged-KV kernels and their launchers: K/V
 * rows encoded into their slots in any kv_dtype.h format (f32, f16, int8,
 * int8_asym, fp8 e4m3/e5m2; bit-exact ports of the CPU encoders), and
 * attention over block tables with an online softmax. One thread block per
 * (token, query head); its warps take every ATT_WARPS-th context position,
 * lanes split head_dim, and the warps' partial softmax states are merged at
 * the end. Correctness first: positions are visited one at a time per warp. */
#include <math.h>

#include "../fp_bits.h"
#include "cuda_internal.cuh"

#define ATT_WARPS 4

/* ---- element formats (kv_dtype.h) ---------------------------------------------- */

/* (The f16 and fp8 conversions are the host's, fp_bits.h, bit for bit.) */

/* Element d of a row; sc / mn are the row's scale and min (quantized formats). */
__device__ __forceinline__ float kv_elem(int dt, const uint8_t *row, int d, float sc, float mn) {
    switch (dt) {
    case KV_CACHE_F32: return ((const float *)row)[d];
    case KV_CACHE_F16: return kvc_h2f(((const uint16_t *)row)[d]);
    case KV_CACHE_INT8: return __fmul_rn((float)(int8_t)row[d], sc);
    case KV_CACHE_INT8_ASYM: return __fadd_rn(mn, __fmul_rn((float)row[d], sc));
    case KV_CACHE_FP8_E4M3: return __fmul_rn(kv_fp8_bits_to_f32(row[d], 3, 7, 0), sc);
    default: return __fmul_rn(kv_fp8_bits_to_f32(row[d], 2, 15, 1), sc);
    }
}

/* ---- block reductions (all threads of the block call them) ---------------------- */

enum { RED_MAX, RED_MIN };

template <int OP> __device__ __forceinline__ float block_reduce(float v, float *red) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    v = OP == RED_MAX ? kvc_warp_max(v) : kvc_warp_min(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < nw; w++) r = OP == RED_MAX ? fmaxf(r, red[w]) : fminf(r, red[w]);
    __syncthreads(); /* red is reused by the next reduction */
    return r;
}

/* Encodes src(hd) into the row at dst, as kv_dtype_encode_row does. */
__device__ void encode_row(int dt, const float *src, uint8_t *dst, int hd, float *red) {
    switch (dt) {
    case KV_CACHE_F32:
        for (int k = threadIdx.x; k < hd; k += blockDim.x) ((float *)dst)[k] = src[k];
        return;
    case KV_CACHE_F16:
        for (int k = threadIdx.x; k < hd; k += blockDim.x) ((uint16_t *)dst)[k] = kv_f32_to_f16_bits(src[k]);
        return;
    case KV_CACHE_INT8_ASYM: {
        float mn = __int_as_float(0x7f800000), mx = -mn;
        for (int k = threadIdx.x; k < hd; k += blockDim.x) {
            mn = fminf(mn, src[k]);
            mx = fmaxf(mx, src[k]);
        }
        mn = block_reduce<RED_MIN>(mn, red);
        mx = block_reduce<RED_MAX>(mx, red);
        const float scale = (mx - mn) / 255.0f;
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int k = threadIdx.x; k < hd; k += blockDim.x) {
            const float q = rintf(__fmul_rn(src[k] - mn, inv));
            dst[k] = (uint8_t)fminf(fmaxf(q, 0.0f), 255.0f);
        }
        if (threadIdx.x == 0) {
            kvc_stf_a1(dst + hd, scale);
            kvc_stf_a1(dst + hd + 4, mn);
        }
        return;
    }
    default: { /* int8, fp8: a symmetric scale from the absolute maximum */
        float amax = 0.0f;
        for (int k = threadIdx.x; k < hd; k += blockDim.x) amax = fmaxf(amax, fabsf(src[k]));
        amax = block_reduce<RED_MAX>(amax, red);
        const float div = dt == KV_CACHE_INT8 ? 127.0f : dt == KV_CACHE_FP8_E4M3 ? 448.0f : 57344.0f;
        const float scale = amax / div;
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int k = threadIdx.x; k < hd; k += blockDim.x) {
            const float x = __fmul_rn(src[k], inv);
            if (dt == KV_CACHE_INT8) {
                const float q = fminf(fmaxf(rintf(x), -127.0f), 127.0f);
                dst[k] = (uint8_t)(int8_t)q;
            } else if (dt == KV_CACHE_FP8_E4M3) {
                dst[k] = kv_f32_to_fp8_bits(x, 3, 7, 0x7e, 0x7f);
            } else {
                dst[k] = kv_f32_to_fp8_bits(x, 2, 15, 0x7b, 0x7e);
            }
        }
        if (threadIdx.x == 0) kvc_stf_a1(dst + hd, scale);
        return;
    }
    }
}

/* ---- kv_store: one block per (token, kv head) ------------------------------------ */

__global__ void k_kv_store(kv_pages kv, int layer, const int32_t *meta, int n, const float *k, const float *v) {
    __shared__ float red[32];
    const int i = blockIdx.x, g = blockIdx.y;
    const int slot = meta[KVC_META_SLOT(n) + i];
    if (slot < 0) return; /* (uniform across the block) */
    const int hd = kv.head_dim;
    const size_t off = kvc_row_offset(kv, layer, slot, g);
    const size_t src = ((size_t)i * kv.n_kv_heads + g) * hd;
    encode_row(kv.dtype, k + src, kv.k + off, hd, red);
    encode_row(kv.dtype, v + src, kv.v + off, hd, red);
}

/* ---- attention: one block per (token, query head) --------------------------------- */

template <int EPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(kv_pages kv, int layer, const int32_t *meta, int n, const float *q, float *out, int n_heads,
                float scale, int window) {
    extern __shared__ float sacc[]; /* (ATT_WARPS, head_dim) partial outputs */
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ int sbad;
    const int i = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int hd = kv.head_dim, bs = kv.block_size, dt = kv.dtype;
    const int g = h / (n_heads / kv.n_kv_heads);
    const int pos = meta[KVC_META_POS(n) + i], toff = meta[KVC_META_TAB(n) + i];
    float *o = out + ((size_t)i * n_heads + h) * hd;
    if (toff < 0) { /* a table the host found bad: loud, not a wild read */
        for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = __int_as_float(0x7fc00000);
        return;
    }
    const int32_t *table = meta + KVC_META_TABLES(n) + toff;
    const float *qh = q + ((size_t)i * n_heads + h) * hd;
    const int quant = dt >= KV_CACHE_INT8, asym = dt == KV_CACHE_INT8_ASYM;
    float qr[EPL], acc[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        qr[e] = d < hd ? qh[d] : 0.0f;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    if (threadIdx.x == 0) sbad = 0;
    __syncthreads();
    /* a sliding window starts at pos + 1 - window: blocks wholly before it
     * may be released (-1 in the table) and are never read */
    const int lo = window > 0 && pos + 1 - window > 0 ? pos + 1 - window : 0;
    for (int t = lo + warp; t <= pos; t += ATT_WARPS) {
        const int32_t blk = table[t / bs];
        if (blk < 0) { /* released inside the window: an engine bug, made loud */
            sbad = 1;
            continue;
        }
        const int64_t slot = (int64_t)blk * bs + t % bs;
        const size_t off = kvc_row_offset(kv, layer, slot, g);
        const uint8_t *kr = kv.k + off, *vr = kv.v + off;
        const float ks = quant ? kvc_ldf_a1(kr + hd) : 0.0f, kmn = asym ? kvc_ldf_a1(kr + hd + 4) : 0.0f;
        float part = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            const int d = lane + 32 * e;
            if (d < hd) part += qr[e] * kv_elem(dt, kr, d, ks, kmn);
        }
        const float s = kvc_warp_sum(part) * scale;
        if (s > m) { /* the running max grows: rescale what was summed */
            const float corr = expf(m - s);
            l *= corr;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[e] *= corr;
            m = s;
        }
        const float p = expf(s - m);
        l += p;
        const float vs = quant ? kvc_ldf_a1(vr + hd) : 0.0f, vmn = asym ? kvc_ldf_a1(vr + hd + 4) : 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            const int d = lane + 32 * e;
            if (d < hd) acc[e] += p * kv_elem(dt, vr, d, vs, vmn);
        }
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        if (d < hd) sacc[warp * hd + d] = acc[e];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float f[ATT_WARPS], L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M); /* a warp that saw no position adds nothing */
        L += sl[w] * f[w];
    }
    const float inv = sbad ? __int_as_float(0x7fc00000) : L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) v += sacc[w * hd + d] * f[w];
        o[d] = v * inv;
    }
}

/* ---- launchers ------------------------------------------------------------------- */

cudaError_t kvc_launch_kv_store(cudaStream_t s, kv_pages kv, int layer, const int32_t *meta, int n, const float *k,
                                const float *v) {
    if (n <= 0 || kv.n_kv_heads <= 0) return cudaSuccess;
    const int threads = kv.head_dim >= 512 ? 256 : kv.head_dim > 64 ? 128 : 32;
    k_kv_store<<<dim3((unsigned)n, (unsigned)kv.n_kv_heads), threads, 0, s>>>(kv, layer, meta, n, k, v);
    return cudaGetLastError();
}

cudaError_t kvc_launch_attention(cudaStream_t s, kv_pages kv, int layer, const int32_t *meta, int n, const float *q,
                                 float *out, int n_heads, float scale, int window) {
    if (n <= 0 || n_heads <= 0) return cudaSuccess;
    const int hd = kv.head_dim;
    const dim3 grid((unsigned)n, (unsigned)n_heads);
    const size_t smem = (size_t)ATT_WARPS * hd * sizeof(float);
    const int threads = ATT_WARPS * 32;
    if (hd <= 32)
        k_attention<1><<<grid, threads, smem, s>>>(kv, layer, meta, n, q, out, n_heads, scale, window);
    else if (hd <= 64)
        k_attention<2><<<grid, threads, smem, s>>>(kv, layer, meta, n, q, out, n_heads, scale, window);
    else if (hd <= 128)
        k_attention<4><<<grid, threads, smem, s>>>(kv, layer, meta, n, q, out, n_heads, scale, window);
    else if (hd <= 256)
        k_attention<8><<<grid, threads, smem, s>>>(kv, layer, meta, n, q, out, n_heads, scale, window);
    else if (hd <= KVC_MAX_HEAD_DIM)
        k_attention<16><<<grid, threads, smem, s>>>(kv, layer, meta, n, q, out, n_heads, scale, window);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}
