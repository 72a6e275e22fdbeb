/* cuda_moe.cu - the mixture-of-experts ops on CUDA (backend.h's moe_route
 * and scatter_add): the routing of each token's row (softmax over the
 * experts, the k largest ranked by logit with ties to the lower expert,
 * renormalised when asked), one thread per row as the CPU computes it
 * (n_expert is at most KV_MOE_MAX_EXPERTS, a few hundred at most), and the
 * weighted scatter-add of the experts' output rows onto the tokens routed
 * to them. One scatter_add call may name a token's row once per expert it
 * was routed to, and the additions must happen in call order (the CPU's
 * bits): one thread per column walks the rows in order, so no two threads
 * add to one element. */
#include <math.h>

#include "cuda_internal.cuh"

/* kv_moe_route_row_ref, per row: the softmax's max and sum in double as the
 * CPU's, the top k by insertion, their probabilities, the renormalisation
 * with the same lower clamp. */
__global__ void k_moe_route(const float *logits, int n, int n_expert, int k, int norm, int32_t *ids, float *weights) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const float *lg = logits + (size_t)r * n_expert;
    int32_t *id = ids + (size_t)r * k;
    float *w = weights + (size_t)r * k;
    float mx = lg[0];
    for (int e = 1; e < n_expert; e++) mx = lg[e] > mx ? lg[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < n_expert; e++) sum += exp((double)__fsub_rn(lg[e], mx));
    int kept = 0;
    for (int e = 0; e < n_expert; e++) {
        const float z = lg[e];
        int at = kept;
        while (at > 0 && lg[id[at - 1]] < z) at--;
        if (at >= k) continue;
        for (int j = kept < k ? kept : k - 1; j > at; j--) id[j] = id[j - 1];
        id[at] = e;
        if (kept < k) kept++;
    }
    for (int j = 0; j < k; j++) w[j] = (float)(exp((double)__fsub_rn(lg[id[j]], mx)) / sum);
    if (!norm) return;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s = __fadd_rn(s, w[j]);
    if (s < 6.103515625e-5f) s = 6.103515625e-5f;
    for (int j = 0; j < k; j++) w[j] = __fdiv_rn(w[j], s);
}

/* x[rows[i]] (dim) += w[i] * y[i] (dim). */
__global__ void k_scatter_add(float *x, const float *y, const int32_t *rows, const float *w, int n, int dim) {
    for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < dim; d += gridDim.x * blockDim.x)
        for (int i = 0; i < n; i++) {
            float *xr = x + (size_t)rows[i] * (size_t)dim;
            xr[d] = __fadd_rn(xr[d], __fmul_rn(w[i], y[(size_t)i * dim + d]));
        }
}

void kvc_moe_route(kv_backend *b, const float *logits, int n, int n_expert, int k, int norm, int32_t *ids,
                   float *weights) {
    /* bad shapes are caller bugs: the outputs stay as they were (as the CPU's) */
    if (!logits || !ids || !weights || n <= 0 || n_expert <= 0 || k <= 0 || k > n_expert) return;
    cuda_ctx *c = kvc_enter(b, "moe_route");
    k_moe_route<<<(unsigned)((n + 63) / 64), 64, 0, kvc_stream(c)>>>(logits, n, n_expert, k, norm, ids, weights);
    kvc_done(c, cudaGetLastError(), "moe_route");
}

void kvc_scatter_add(kv_backend *b, float *x, const float *y, const int32_t *rows, const float *w, int n, int dim) {
    if (!x || !y || !rows || !w || n <= 0 || dim <= 0) return;
    cuda_ctx *c = kvc_enter(b, "scatter_add");
    k_scatter_add<<<kvc_grid_for(dim, 128), 128, 0, kvc_stream(c)>>>(x, y, rows, w, n, dim);
    kvc_done(c, cudaGetLastError(), "scatter_add");
}
