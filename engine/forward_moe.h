/* forward_moe.h - the mixture-of-experts feed-forward of the forward pass
 * (forward.c calls it for a model with hp.n_expert > 0): router, top-k,
 * and each expert run once per step on the rows of the tokens routed to it
 * (gathered from every sequence of the batch), its output scatter-added
 * back with the routing weight. Also counts tokens per expert. */
#ifndef KV_FORWARD_MOE_H
#define KV_FORWARD_MOE_H

#include "model.h"

typedef struct kv_moe kv_moe; /* buffers sized once for max_tokens */

/* The scratch for batches of up to max_tokens tokens of m's experts;
 * *bytes (IN/OUT) grows by the backend bytes it holds. NULL with err. */
kv_moe *kv_moe_new(const kv_model *m, kv_backend *b, int max_tokens, uint64_t *bytes, kv_err *err);
void kv_moe_free(kv_moe *mo); /* NULL is a no-op */
/* The MoE op b's table lacks ("moe_route", ...), or NULL when it has them. */
const char *kv_moe_missing_op(const kv_backend *b);
/* Widens lim with what the experts' matmuls need (their row lengths and
 * weight types). */
void kv_moe_limits(const kv_model *m, kv_backend_limits *lim);
/* x(n, dim) += MoE(xb(n, dim)) for layer L: routes every row, then per
 * expert with rows routed to it gathers them, runs gate/up/SiLU/down on
 * them only, and adds each output row times its routing weight. */
void kv_moe_ffn(kv_moe *mo, const kv_layer *L, const float *xb, float *x, int n);
/* Copies the tokens routed to each expert, summed over layers, since the
 * last call into out[0..min(n_expert, cap)) and restarts the counts.
 * Returns n_expert. */
int kv_moe_take_counts(kv_moe *mo, uint32_t *out, int cap);

#endif
