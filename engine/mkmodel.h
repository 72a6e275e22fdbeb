/* mkmodel.h - writes a deterministic random-weight model (llama, qwen2,
 * qwen3, gemma3, phi3, qwen3moe) of any shape and weight type as a GGUF file, with
 * the tensor names, shapes and metadata llama.cpp uses, and a
 * SentencePiece-style vocabulary (or one copied from another GGUF). For benchmarks and tests that need a model of a given size;
 * and the first layers of a GGUF model as a same-vocabulary draft. */
#ifndef KV_MKMODEL_H
#define KV_MKMODEL_H

#include <stdint.h>

#include "../base/common.h"
#include "../kernels/types.h"

typedef struct kv_mkmodel_params {
    int dim;                /* embedding length */
    int n_layers;           /* transformer blocks */
    int n_heads;            /* query heads; divides dim, head size dim/n_heads is even */
    int n_kv_heads;         /* key/value heads; divides n_heads */
    int ffn_dim;            /* feed-forward hidden size */
    int n_vocab;            /* tokens (>= 259: 3 specials + 256 bytes); ignored with vocab_from */
    int ctx_len;            /* llama.context_length */
    kv_type type;           /* type of the 2-D weights (norms are always F32) */
    int untied;             /* 1: separate output.weight; 0: output shares token_embd */
    uint64_t seed;          /* same seed, same parameters -> identical bytes */
    float rope_base;        /* llama.rope.freq_base */
    float rms_eps;          /* llama.attention.layer_norm_rms_epsilon */
    const char *vocab_from; /* borrowed; a GGUF whose tokenizer.* keys are copied, or NULL */
    const char *name;       /* borrowed; general.name, NULL for "kvtop-random" */
    /* architectures past llama (appended; zero/NULL keeps the llama file) */
    const char *arch;       /* borrowed; "llama" (NULL), "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe" */
    int head_dim;           /* attention.key_length; 0: dim / n_heads */
    int n_swa;              /* attention.sliding_window (gemma3: local layers, pattern 6;
                               llama: every layer, as Mistral); 0: none */
    int rope_freqs;         /* 1: a Llama 3 rope_freqs.weight table (factor 8, low 1, high 4,
                               original context 8192) */
    int n_experts;          /* expert_count: a mixture of experts with ffn_dim per expert
                               (qwen3moe: 0 means 8; llama: Mixtral-style when > 0) */
    int n_experts_used;     /* expert_used_count (0 means 2, at most n_experts) */
} kv_mkmodel_params;

/* A small model: dim 128, 4 layers, 4 heads (2 kv), ffn 384, vocab 512,
 * ctx 2048, f32, tied, seed 42, rope base 10000, eps 1e-5. */
kv_mkmodel_params kv_mkmodel_default_params(void);

/* Checks p (the architecture one mkmodel writes, sizes > 0 and within sane bounds, heads divide dim, kv heads
 * divide heads, head size even, type quantizable with dim and ffn multiples
 * of its block size). Returns 0 or KV_ERR_INVAL with err naming the bad
 * parameter. Does not look at vocab_from. */
int kv_mkmodel_validate(const kv_mkmodel_params *p, kv_err *err);

/* Number of weights the model has (n_vocab as given; the real count with
 * vocab_from depends on that file). 0 when p is invalid. */
uint64_t kv_mkmodel_n_params(const kv_mkmodel_params *p);

/* GGUF general.file_type (llama_ftype) for a weight type, or -1. */
int kv_mkmodel_file_type(kv_type t);

/* Validates p and writes the model to path (via path.tmp, renamed at the
 * end), streaming row by row so memory stays small. Returns 0 or an error
 * (KV_ERR_INVAL bad parameters, KV_ERR_IO, KV_ERR_FORMAT bad vocab_from
 * file) with err filled; on error no file is left at path. */
int kv_mkmodel_write(const kv_mkmodel_params *p, const char *path, kv_err *err);

/* Writes the first n_layers blocks of the GGUF model at src, with all its
 * metadata (block_count changed), embeddings, final norm and head, to dst:
 * a smaller model with the same vocabulary, e.g. a draft for speculative
 * decoding. Tensors are copied as stored. Returns 0, or KV_ERR_INVAL
 * (n_layers not in 1..the model's block count), KV_ERR_IO / KV_ERR_FORMAT
 * (src unreadable or not a model, dst not writable) with err filled; on
 * error no file is left at dst. */
int kv_mkmodel_truncate(const char *src, const char *dst, int n_layers, kv_err *err);

#endif
