/* cuda_ops.cu - the CUDA element-wise kernels (rmsnorm, rope, silu_mul, add,
 * a NaN fill for failed ops) and their launchers. Arithmetic follows the
 * CPU backend's expressions, with explicit round-to-nearest intrinsics where
 * nvcc would otherwise fuse a multiply and an add, so the two backends
 * differ only where a math function (cosf, expf) rounds differently. */
#include "cuda_internal.cuh"


/* ---- rmsnorm: one block per row ---------------------------------------------- */

__global__ void k_rmsnorm(const float *x, const float *w, float *out, int dim, float eps) {
    __shared__ float part[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) ss += xr[k] * xr[k];
    ss = kvc_warp_sum(ss);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    if (lane == 0) part[warp] = ss;
    __syncthreads(); /* every read of x for the sum is done: out may alias x */
    if (warp == 0) {
        float v = lane < nw ? part[lane] : 0.0f;
        v = kvc_warp_sum(v);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(part[0] / (float)dim + eps);
    for (int k = threadIdx.x; k < dim; k += blockDim.x) o[k] = __fmul_rn(__fmul_rn(xr[k], scale), w[k]);
}

cudaError_t kvc_launch_rmsnorm(cudaStream_t s, const float *x, const float *w, float *out, int n, int dim,
                               float eps) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    const int threads = dim >= 1024 ? 256 : dim >= 128 ? 128 : 32;
    k_rmsnorm<<<n, threads, 0, s>>>(x, w, out, dim, eps);
    return cudaGetLastError();
}

/* ---- rope: one thread per rotated pair ---------------------------------------- */

__global__ void k_rope(float *x, const int32_t *pos, const float *inv_freq, int n, int n_heads, int head_dim,
                       int half, int neox) {
    const int64_t total = (int64_t)n * n_heads * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const int64_t th = idx / half; /* token * n_heads + head */
        const int64_t t = th / n_heads;
        const float theta = (float)pos[t] * inv_freq[i];
        const float c = cosf(theta), sn = sinf(theta);
        float *v = x + th * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        v[b] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
    }
}

cudaError_t kvc_launch_rope(cudaStream_t s, float *x, const int32_t *pos, const float *inv_freq, int n, int n_heads,
                            int head_dim, int rot_dim, int neox) {
    const int half = rot_dim / 2;
    const int64_t total = (int64_t)n * n_heads * half;
    if (total <= 0) return cudaSuccess;
    k_rope<<<kvc_grid_for(total, 256), 256, 0, s>>>(x, pos, inv_freq, n, n_heads, head_dim, half, neox);
    return cudaGetLastError();
}

/* ---- silu_mul, add, NaN fill --------------------------------------------------- */

__global__ void k_silu_mul(float *g, const float *u, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        g[i] = __fmul_rn(g[i] / (1.0f + expf(-g[i])), u[i]);
}

__global__ void k_add(float *x, const float *y, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

__global__ void k_fill_nan(float *p, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = __int_as_float(0x7fc00000);
}

cudaError_t kvc_launch_silu_mul(cudaStream_t s, float *gate, const float *up, int64_t count) {
    if (count <= 0) return cudaSuccess;
    k_silu_mul<<<kvc_grid_for(count, 256), 256, 0, s>>>(gate, up, count);
    return cudaGetLastError();
}

cudaError_t kvc_launch_add(cudaStream_t s, float *x, const float *y, int64_t count) {
    if (count <= 0) return cudaSuccess;
    k_add<<<kvc_grid_for(count, 256), 256, 0, s>>>(x, y, count);
    return cudaGetLastError();
}

cudaError_t kvc_launch_fill_nan(cudaStream_t s, float *p, int64_t count) {
    if (!p || count <= 0) return cudaSuccess;
    k_fill_nan<<<kvc_grid_for(count, 256), 256, 0, s>>>(p, count);
    return cudaGetLastError();
}
