/* cpu_moe.h - the mixture-of-experts ops of the cpu backend (routing and
 * the weighted scatter-add of the experts' outputs) and their scalar
 * references; the table entries are in cpu.c, the contract in backend.h. */
#ifndef KV_CPU_MOE_H
#define KV_CPU_MOE_H

#include <stdint.h>

#include "backend.h"

/* The routing of one row: p = softmax(logits[0..n_expert)), the k largest
 * p (ranked by logit; ties: the lower expert first) into ids[0..k) in decreasing order,
 * their p into weights, divided by their sum (clamped below at
 * 6.103515625e-5, as llama.cpp does) when norm. The scalar reference. */
void kv_moe_route_row_ref(const float *logits, int n_expert, int k, int norm, int32_t *ids, float *weights);
/* x[rows[i]] (dim) += w[i] * y[i] (dim) for i in [0, n): the scalar
 * reference of scatter_add. */
void kv_scatter_add_ref(float *x, const float *y, const int32_t *rows, const float *w, int n, int dim);

/* The table's entries (backend.h's moe_route and scatter_add). */
void kv_cpu_moe_route(kv_backend *b, const float *logits, int n, int n_expert, int k, int norm, int32_t *ids,
                      float *weights);
void kv_cpu_scatter_add(kv_backend *b, float *x, const float *y, const int32_t *rows, const float *w, int n,
                        int dim);

#endif
