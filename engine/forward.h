/* forward.h - the forward pass (llama and the architectures of arch.c:
 * qwen2, qwen3, gemma3, phi3, and qwen3moe's experts in forward_moe.c) over a batch of tokens from many
 * sequences at once (prefill chunks and decode tokens together), reading and
 * writing K/V through the paged cache. It calls only the backend table. */
#ifndef KV_FORWARD_H
#define KV_FORWARD_H

#include "../base/common.h"
#include "model.h"
#include "../kernels/backend.h"

/* One batched forward. Token i is tokens[i] at ab.pos[i] of sequence
 * ab.seq[i], its K/V go to slot ab.slot[i]. Logits are produced only for the
 * rows listed in logit_rows (e.g. the last token of each sequence). */
typedef struct kv_batch {
    int n_tokens;
    const int32_t *tokens;     /* (n_tokens) */
    kv_attn_batch ab;          /* positions, sequences, slots, block tables */
    int n_logits;
    const int32_t *logit_rows; /* (n_logits) indices into tokens */
    int n_layers;              /* 0: all layers; L > 0: only the first L, then the
                                  final norm and head (self-speculative draft) */
    /* Sliding-window release (kv_cache_window.c): the local layers' K/V in
     * pages of their own, with slots and block tables into them (entries
     * below a sequence's window may be -1). NULL: every layer is in the
     * pages kv_forward_run gets. Each set's layers are indexed in model
     * order within their own pages. */
    kv_pages *kv_local;
    kv_attn_batch ab_local;    /* same tokens, positions and sequences as ab */
} kv_batch;

typedef struct kv_forward kv_forward; /* buffers sized once at creation */

/* Creates the scratch for batches of up to max_tokens tokens and max_logits
 * logit rows, and reserves the backend's op scratch for them (ops.reserve:
 * the model's longest weight row and its weight types). The model and
 * backend are borrowed and must outlive it. NULL with err filled on failure. */
kv_forward *kv_forward_new(const kv_model *m, kv_backend *b, int max_tokens, int max_logits,
                           kv_err *err);
void kv_forward_free(kv_forward *f);
/* Bytes of activation buffers this forward holds (memory breakdown). */
uint64_t kv_forward_activation_bytes(const kv_forward *f);
/* Mixture of experts: the tokens routed to each expert, summed over the
 * layers, of the runs since the last call, into out[0..min(n_expert, cap))
 * (OUT), and restarts the counts. Returns n_expert (0: a dense model, out
 * untouched). */
int kv_forward_expert_tokens(kv_forward *f, uint32_t *out, int cap);

/* Runs the batch. logits: (n_logits, n_vocab) floats, host memory. Checks
 * token ids, positions and sizes first; on bad input returns KV_ERR_INVAL or
 * KV_ERR_RANGE with err filled and touches nothing. After the batch it asks
 * the backend whether an op failed (ops.status, also a failure left by an
 * op called between batches, such as copy_block): then it returns
 * KV_ERR_BACKEND with err saying "forward: <backend> backend: <op>:
 * <message>", and the logits and the K/V rows written for the batch's
 * tokens are not to be used. */
int kv_forward_run(kv_forward *f, kv_pages *kv, const kv_batch *batch, float *logits, kv_err *err);

#endif
