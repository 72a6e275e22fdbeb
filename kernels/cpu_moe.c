/* cpu_moe.c - the mixture-of-experts ops of the cpu backend: routing
 * (softmax over the experts, top-k, renormalisation) and the weighted
 * scatter-add that puts each expert's output rows back on the tokens that
 * were routed to it. Both are small next to the experts' matmuls (n x
 * n_expert and n x dim per expert), so they run on the calling thread. */
#include "cpu_moe.h"

#include <math.h>
#include <string.h>

void kv_moe_route_row_ref(const float *logits, int n_expert, int k, int norm, int32_t *ids, float *weights) {
    float mx = logits[0];
    for (int e = 1; e < n_expert; e++) mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < n_expert; e++) sum += exp((double)(logits[e] - mx));
    /* selection by insertion into the k kept (k and n_expert are small),
     * ranked by logit: the softmax keeps the order, and the logits still
     * tell apart experts whose probabilities round to the same float */
    int kept = 0;
    for (int e = 0; e < n_expert; e++) {
        const float z = logits[e];
        int at = kept;
        while (at > 0 && logits[ids[at - 1]] < z) at--; /* ties keep the lower expert ahead */
        if (at >= k) continue;
        for (int j = kept < k ? kept : k - 1; j > at; j--) ids[j] = ids[j - 1];
        ids[at] = e;
        if (kept < k) kept++;
    }
    for (int j = 0; j < k; j++) weights[j] = (float)(exp((double)(logits[ids[j]] - mx)) / sum);
    if (!norm) return;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += weights[j];
    if (s < 6.103515625e-5f) s = 6.103515625e-5f;
    for (int j = 0; j < k; j++) weights[j] /= s;
}

void kv_scatter_add_ref(float *x, const float *y, const int32_t *rows, const float *w, int n, int dim) {
    for (int i = 0; i < n; i++) {
        float *xr = x + (size_t)rows[i] * (size_t)dim;
        const float *yr = y + (size_t)i * (size_t)dim;
        const float wi = w[i];
        for (int d = 0; d < dim; d++) xr[d] += wi * yr[d];
    }
}

void kv_cpu_moe_route(kv_backend *b, const float *logits, int n, int n_expert, int k, int norm, int32_t *ids,
                      float *weights) {
    (void)b;
    if (!logits || !ids || !weights || n <= 0 || n_expert <= 0 || k <= 0 || k > n_expert) return;
    for (int i = 0; i < n; i++)
        kv_moe_route_row_ref(logits + (size_t)i * n_expert, n_expert, k, norm, ids + (size_t)i * k,
                             weights + (size_t)i * k);
}

void kv_cpu_scatter_add(kv_backend *b, float *x, const float *y, const int32_t *rows, const float *w, int n,
                        int dim) {
    (void)b;
    if (!x || !y || !rows || !w || n <= 0 || dim <= 0) return;
    kv_scatter_add_ref(x, y, rows, w, n, dim);
}
