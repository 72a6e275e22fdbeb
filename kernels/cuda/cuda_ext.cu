/* cuda_ext.cu - the CUDA ops of the architectures past llama (backend.h):
 * gelu_mul (GeGLU), scale, add_rows (projection biases), rope_ext (Llama 3
 * frequency factors, linear scaling) and attention_window (sliding-window
 * layers), kernels and host sides. Arithmetic follows the CPU backend's
 * expressions with explicit round-to-nearest intrinsics, as cuda_ops.cu. */
#include <math.h>
#include <stdlib.h>

#include "cuda_internal.cuh"

/* ---- kernels ------------------------------------------------------------------ */

/* kv_gelu_mul_ref: x / (1 + exp(-2 sqrt(2/pi) x (1 + 0.044715 x^2))) * u */
__global__ void k_gelu_mul(float *g, const float *u, int64_t count) {
    const float c2 = 2.0f * 0.7978845608028654f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        const float in = __fmul_rn(__fmul_rn(-c2, x), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, x), x)));
        g[i] = __fmul_rn(x / __fadd_rn(1.0f, expf(in)), u[i]);
    }
}

__global__ void k_scale(float *x, float sc, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], sc);
}

__global__ void k_add_rows(float *x, const float *bias, int64_t count, int dim) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], bias[i % dim]);
}

cudaError_t kvc_launch_gelu_mul(cudaStream_t s, float *gate, const float *up, int64_t count) {
    if (count <= 0) return cudaSuccess;
    k_gelu_mul<<<kvc_grid_for(count, 256), 256, 0, s>>>(gate, up, count);
    return cudaGetLastError();
}

cudaError_t kvc_launch_scale(cudaStream_t s, float *x, float sc, int64_t count) {
    if (count <= 0) return cudaSuccess;
    k_scale<<<kvc_grid_for(count, 256), 256, 0, s>>>(x, sc, count);
    return cudaGetLastError();
}

cudaError_t kvc_launch_add_rows(cudaStream_t s, float *x, const float *bias, int n, int dim) {
    const int64_t count = (int64_t)n * dim;
    if (count <= 0) return cudaSuccess;
    k_add_rows<<<kvc_grid_for(count, 256), 256, 0, s>>>(x, bias, count, dim);
    return cudaGetLastError();
}

/* ---- host sides ---------------------------------------------------------------- */

void kvc_gelu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    if (!gate || !up || count <= 0) return;
    cuda_ctx *c = kvc_enter(b, "gelu_mul");
    kvc_done(c, kvc_launch_gelu_mul(kvc_stream(c), gate, up, count), "gelu_mul");
}

void kvc_scale(kv_backend *b, float *x, float s, int64_t count) {
    if (!x || count <= 0) return;
    cuda_ctx *c = kvc_enter(b, "scale");
    kvc_done(c, kvc_launch_scale(kvc_stream(c), x, s, count), "scale");
}

void kvc_add_rows(kv_backend *b, float *x, const float *bias, int n, int dim) {
    if (!x || !bias || n <= 0 || dim <= 0) return;
    cuda_ctx *c = kvc_enter(b, "add_rows");
    /* biases arrive as host pointers into the model, like norm weights */
    const float *bd = kvc_host_vec(c, bias, (size_t)dim * sizeof(float));
    if (!bd) {
        kvc_nan_out(c, x, (int64_t)n * dim);
        return;
    }
    kvc_done(c, kvc_launch_add_rows(kvc_stream(c), x, bd, n, dim), "add_rows");
}

/* Pairs a frequency table holds at most (the CPU backend's KV_ROPE_MAX_PAIRS
 * is the tighter bound for a model both run). */
enum { EXT_MAX_PAIRS = 1024 };

void kvc_rope_ext(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                  float base, int neox, float freq_scale, const float *freq_factors) {
    /* Bad shapes are caller bugs; leave x unchanged (as the CPU does). */
    if (!x || !pos || n <= 0 || n_heads <= 0 || head_dim <= 0 || rot_dim <= 0 || rot_dim > head_dim || rot_dim % 2 ||
        rot_dim / 2 > EXT_MAX_PAIRS || !(base > 0.0f) || !(freq_scale > 0.0f))
        return;
    cuda_ctx *c = kvc_enter(b, "rope_ext");
    const float *inv = NULL;
    if (!freq_factors && freq_scale == 1.0f) {
        inv = kvc_rope_freqs(c, rot_dim, base); /* plain rope: the cached table */
    } else {
        /* the CPU backend's expression, in the same order, by the same libm */
        const int half = rot_dim / 2;
        float h[EXT_MAX_PAIRS], ff[EXT_MAX_PAIRS];
        if (freq_factors && cudaMemcpy(ff, freq_factors, (size_t)half * sizeof(float), cudaMemcpyDefault) !=
                                cudaSuccess) {
            kvc_done(c, cudaGetLastError(), "rope_ext frequency factors");
            return;
        }
        for (int i = 0; i < half; i++) {
            h[i] = powf(base, -(float)(2 * i) / (float)rot_dim);
            if (freq_factors) h[i] /= ff[i];
            if (freq_scale != 1.0f) h[i] *= freq_scale;
        }
        inv = (const float *)kvc_stage_in(c, STAGE_FREQ, h, (size_t)half * sizeof(float));
    }
    if (!inv) return;
    const int32_t *dpos = (const int32_t *)kvc_stage_in(c, STAGE_POS, pos, (size_t)n * sizeof(int32_t));
    if (!dpos) return;
    kvc_done(c, kvc_launch_rope(kvc_stream(c), x, dpos, inv, n, n_heads, head_dim, rot_dim, neox != 0), "rope_ext");
}

void kvc_attention_window(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                          float *out, int n_heads, float scale, int window) {
    if (!kv || !ab || ab->n_tokens <= 0 || !ab->pos || !ab->seq || !ab->slot || !q || !out || n_heads <= 0 ||
        kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads || kv->head_dim <= 0 || layer < 0 || layer >= kv->n_layers)
        return;
    cuda_ctx *c = kvc_enter(b, window > 0 ? "attention_window" : "attention");
    const int64_t count = (int64_t)ab->n_tokens * n_heads * kv->head_dim;
    if (kv->head_dim > KVC_MAX_HEAD_DIM) {
        kvc_fail(c, KV_ERR_UNSUPPORTED, "attention: head_dim %d is above the %d the kernel takes", kv->head_dim,
                 KVC_MAX_HEAD_DIM);
        kvc_nan_out(c, out, count);
        return;
    }
    const int32_t *meta = kvc_batch_meta(c, kv, ab, window > 0 ? 2 : 1);
    if (!meta) {
        kvc_nan_out(c, out, count);
        return;
    }
    kvc_done(c, kvc_launch_attention(kvc_stream(c), *kv, layer, meta, ab->n_tokens, q, out, n_heads, scale, window),
             "attention");
}
