/* synthetic.h - models by their published shapes, with no weights, for the
 * sim backend: a table of shapes (layers, width, heads, KV heads, FFN,
 * experts, vocabulary, context), each with its source; a weight format
 * (model.dtype); a tokenizer made up on the spot (byte tokens and filler
 * words) so that workloads, prefix sharing and detokenization work; and
 * deterministic token ids in place of sampling.
 *
 * The engine runs its real scheduler, block manager and prefix index over
 * such a model; the forward pass is replaced by the step-time model of
 * synth_step.c (kv_synth_step), which charges the simulated clock op by op
 * with the sim backend's own cost functions. */
#ifndef KV_SYNTHETIC_H
#define KV_SYNTHETIC_H

#include <stdint.h>

#include "../base/common.h"
#include "config.h"
#include "model.h"

/* A published shape. */
typedef struct kv_synth_shape {
    const char *name;   /* "llama-3-70b": what model.synthetic names */
    const char *label;  /* "Meta Llama 3 70B" */
    int n_layers;
    int dim;            /* hidden size */
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int ffn_dim;        /* intermediate size (per expert for MoE) */
    int n_vocab;
    int ctx_len;
    int n_experts;      /* 1: dense */
    int n_experts_used; /* experts per token (top-k); 1 for dense */
    int tied;           /* bool: the output head is the embedding */
    const char *source; /* where the figures come from */
} kv_synth_shape;

/* Weight formats of a synthetic model. */
typedef enum kv_synth_dtype {
    KV_SYNTH_FP16 = 0,
    KV_SYNTH_BF16,
    KV_SYNTH_FP8,   /* W8A8 FP8 (H100-class): matmuls at the FP8 peak */
    KV_SYNTH_INT8,  /* W8A8 INT8 (SmoothQuant-style): matmuls at the INT8 peak */
    KV_SYNTH_INT4,  /* W4A16 (AWQ/GPTQ-style, group 128 with f16 scales): BF16 peak */
    KV_SYNTH_F32,   /* as GGUF stores them: the bytes of kv_type rows */
    KV_SYNTH_Q8_0,
    KV_SYNTH_Q4_0,
    KV_SYNTH_DTYPE_COUNT
} kv_synth_dtype;

/* The shape table: *count entries (count may be NULL). */
const kv_synth_shape *kv_synth_shapes(int *count);
/* A shape by name (case-insensitive), NULL when unknown. */
const kv_synth_shape *kv_synth_shape_find(const char *name);
/* Parses a model.dtype name ("fp16", "bf16", "fp8", "int8", "int4", "f32",
 * "q8_0", "q4_0"; "f16" = fp16). 0 or KV_ERR_INVAL. */
int kv_synth_dtype_from_name(const char *s, kv_synth_dtype *out /* OUT */);
const char *kv_synth_dtype_name(kv_synth_dtype d);
/* Bytes of one weight row of n elements in d. */
double kv_synth_row_bytes(kv_synth_dtype d, int64_t n);

/* The shape cfg asks for: cfg->sim.synthetic's table entry (or "custom")
 * with the model.<shape> keys applied. Checks that it is a shape (heads
 * divide, experts_used <= experts, ...). 0 or KV_ERR_INVAL with err naming
 * the key and listing the known shapes. */
int kv_synth_shape_resolve(const kv_config *cfg, kv_synth_shape *out /* OUT */, kv_err *err);

/* Creates the synthetic model cfg names: hyper-parameters from the shape,
 * weight_bytes and n_params counted from it, m->synthetic set, no layers
 * and no weights, and a made-up SentencePiece-style tokenizer of n_vocab
 * ids (<unk>, <s>, </s>, 256 byte tokens, then filler words). NULL with err
 * on a bad shape or dtype. Freed by kv_model_free. */
kv_model *kv_synth_model_new(const kv_config *cfg, kv_err *err);

/* The id a synthetic model "generates" at position pos of request id
 * (never an end-of-generation id, never a byte token): the same for the
 * same seed, request and position, whatever the batch. */
int32_t kv_synth_token(const kv_model *m, uint64_t seed, int64_t request, int pos);

#endif
