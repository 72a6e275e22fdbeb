/* model.h - a model in memory (llama, qwen2, qwen3, gemma3, phi3, qwen3moe):
 * hyper-parameters from GGUF metadata (or a llama2.c header), weight views
 * into the file mapping, and the tokenizer and chat template that came with
 * it. What each architecture adds is read by arch.c. */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stdint.h>

#include "../base/common.h"
#include "gguf.h"
#include "tokenizer.h"
#include "../kernels/backend.h"

/* The architectures the loader and the forward pass know (arch.c's table
 * holds their names and what is particular to each). */
typedef enum kv_arch {
    KV_ARCH_LLAMA = 0, /* also Llama 3 (rope_freqs) and Mistral (sliding window) */
    KV_ARCH_QWEN2,     /* Q/K/V biases */
    KV_ARCH_QWEN3,     /* per-head Q/K RMSNorm */
    KV_ARCH_GEMMA3,    /* scaled embeddings, post norms, Q/K norms, GeGLU, local/global layers */
    KV_ARCH_PHI3,      /* fused QKV and gate/up */
    KV_ARCH_QWEN3MOE,  /* qwen3 attention, mixture-of-experts feed-forward (arch_moe.c) */
    KV_ARCH_COUNT
} kv_arch;

/* The gated feed-forward's activation. */
typedef enum kv_ffn_act {
    KV_ACT_SILU = 0,      /* SwiGLU */
    KV_ACT_GELU_TANH = 1  /* GeGLU with GELU's tanh form */
} kv_ffn_act;

typedef struct kv_hparams {
    char arch[32];     /* "llama", "gemma3", ... */
    int n_vocab;
    int dim;           /* embedding length */
    int n_layers;
    int n_heads;
    int n_kv_heads;    /* < n_heads: grouped-query attention */
    int head_dim;      /* dim / n_heads unless the file says otherwise */
    int ffn_dim;       /* feed-forward hidden size */
    int ctx_len;       /* context length the model was trained/converted for */
    int rot_dim;       /* rope.dimension_count (<= head_dim) */
    float rope_base;   /* rope.freq_base, 10000 when absent */
    int rope_neox;     /* 0: adjacent pairs (llama), 1: halves (neox) */
    float rms_eps;
    int tied_output;   /* 1: the output head is the token embedding */
    /* architecture specifics (arch.c); llama's values are the neutral ones */
    kv_arch arch_id;
    kv_ffn_act act;
    float embd_scale;      /* token embeddings are multiplied by it: 1, gemma3 sqrt(dim) */
    float attn_scale;      /* q.k multiplier: 1/sqrt(head_dim), gemma3 1/sqrt(query_pre_attn_scalar) */
    int n_swa;             /* sliding window of the local layers (a token sees itself and the
                              n_swa - 1 positions before it); 0: every layer is global */
    int n_swa_layers;      /* how many layers are local */
    float rope_base_swa;   /* RoPE base of the local layers (gemma3 rope.freq_base_swa, 10000) */
    float rope_freq_scale; /* linear RoPE scaling of positions (1 / rope.scaling.factor), 1: none */
    int qk_norm;           /* 1: per-head RMSNorm of Q and K before RoPE (qwen3, gemma3) */
    int qkv_bias;          /* 1: Q/K/V projections have biases (qwen2) */
    int post_norms;        /* 1: RMSNorm after attention and after the feed-forward (gemma3) */
    int fused_qkv;         /* 1: the file holds attn_qkv / fused ffn_up (phi3); views bound */
    /* mixture of experts (arch_moe.c); n_expert 0: a dense feed-forward */
    int n_expert;          /* expert_count: experts per layer (<= KV_MOE_MAX_EXPERTS) */
    int n_expert_used;     /* expert_used_count: experts each token is routed to (top-k) */
    int expert_ffn_dim;    /* expert_feed_forward_length: one expert's hidden size */
    int expert_norm;       /* 1: the top-k routing weights are renormalised to sum 1 */
} kv_hparams;

/* The most experts a layer may have (DeepSeek V3 and Qwen 3.5 use 256;
 * the step record keeps a count per expert). */
#define KV_MOE_MAX_EXPERTS 256

typedef struct kv_layer {
    const float *attn_norm; /* (dim) */
    kv_tensor wq;           /* (n_heads*head_dim rows, dim) */
    kv_tensor wk;           /* (n_kv_heads*head_dim rows, dim) */
    kv_tensor wv;           /* (n_kv_heads*head_dim rows, dim) */
    kv_tensor wo;           /* (dim rows, n_heads*head_dim) */
    const float *ffn_norm;  /* (dim) */
    kv_tensor w_gate;       /* (ffn_dim rows, dim) */
    kv_tensor w_up;         /* (ffn_dim rows, dim) */
    kv_tensor w_down;       /* (dim rows, ffn_dim) */
    /* architecture specifics; NULL / 0 where the architecture has none */
    const float *q_norm;        /* (head_dim) per-head RMSNorm weight of Q */
    const float *k_norm;        /* (head_dim) */
    const float *post_attn_norm; /* (dim) applied to the attention output before the residual */
    const float *post_ffn_norm;  /* (dim) */
    const float *bq;            /* (n_heads*head_dim) bias of wq */
    const float *bk;            /* (n_kv_heads*head_dim) */
    const float *bv;            /* (n_kv_heads*head_dim) */
    int swa;                    /* 1: a local (sliding-window) layer */
    float rope_base;            /* this layer's RoPE base */
    /* mixture of experts (hp.n_expert > 0; then w_gate/w_up/w_down are unset) */
    kv_tensor router;           /* ffn_gate_inp: (n_expert rows, dim) */
    const kv_tensor *exp_gate;  /* (n_expert) views of ffn_gate_exps: each (expert_ffn_dim rows, dim) */
    const kv_tensor *exp_up;    /* (n_expert) views of ffn_up_exps */
    const kv_tensor *exp_down;  /* (n_expert) views of ffn_down_exps: each (dim rows, expert_ffn_dim) */
} kv_layer;

typedef struct kv_model {
    kv_hparams hp;
    kv_tensor tok_embd;       /* (n_vocab rows, dim) */
    kv_layer *layers;         /* (n_layers) */
    const float *output_norm; /* (dim) */
    kv_tensor output;         /* (n_vocab rows, dim); a copy of tok_embd's view when tied */
    kv_tokenizer *tok;        /* owned */
    char *chat_template;      /* owned; NULL when the file has none */
    char name[128];           /* general.name or the file name */
    char path[1024];
    char format[16];          /* "gguf" or "llama2c" */
    uint32_t gguf_version;    /* 0 for llama2.c */
    uint64_t weight_bytes;    /* bytes of all weight tensors as stored */
    uint64_t n_params;        /* elements of all weight tensors */
    int type_counts[KV_TYPE_COUNT]; /* tensors per storage type */
    char warning[256];        /* what is wrong but loads, for front ends to print ("" when
                                 nothing): non-finite norm weights (kv_model_warning) */

    /* private: what keeps the weights alive */
    kv_gguf *gguf;            /* GGUF mapping, or NULL */
    void *map;                /* llama2.c mapping, or NULL */
    size_t map_size;
    float **owned;            /* converted norm vectors etc. */
    int n_owned;

    /* public: a synthetic model (synthetic.h) has shapes only: no weights,
     * layers NULL, tok made up; the engine times it with synth_step.c */
    int synthetic;            /* bool */
    int n_experts;            /* MoE experts per layer; 1 = dense (synthetic only) */
    int n_experts_used;       /* experts per token (synthetic only) */
    int weight_dtype;         /* kv_synth_dtype of every matmul weight (synthetic only) */
    /* architecture specifics, at the end to keep the struct's prefix */
    const float *rope_freqs;    /* (rot_dim / 2) Llama 3 RoPE frequency divisors, or NULL */
    kv_tensor *expert_views;    /* owned: (n_layers, 3, n_expert) per-expert row views into the
                                   file's 3-D expert tensors (the layers' exp_* point here), or NULL */
} kv_model;

/* Looks at the file at path before anything reads it: refuses a missing
 * file, a directory ("is a directory"), anything not a regular file (a FIFO
 * with no writer would block open() forever) and an empty file, with err
 * naming the path. Returns 0 and sets *gguf (OUT: may be NULL) to 1 when the
 * file starts with the GGUF magic, or KV_ERR_IO / KV_ERR_FORMAT. */
int kv_model_probe_file(const char *path, int *gguf /* OUT */, kv_err *err);

/* Loads a GGUF (path ends in anything) or a llama2.c checkpoint (then
 * tokenizer_path names its tokenizer file; NULL/"" for GGUF). On error
 * returns NULL and err names the file, key or tensor at fault. */
kv_model *kv_model_load(const char *path, const char *tokenizer_path, kv_err *err);
/* m->warning: "" when nothing, else e.g. "PATH: 3 non-finite values (NaN
 * or Inf) in the norm weights, first blk.0.attn_norm.weight[5]: outputs
 * will not be finite; generation stops with an error". Borrowed. */
const char *kv_model_warning(const kv_model *m);
void kv_model_free(kv_model *m); /* NULL is a no-op */
/* Hands every matrix of m to be's prepare_weight (where it has one), so
 * the backend can keep a faster layout of it (cpu: q8_0 panels); m must
 * stay loaded while be may run ops on it (the backend finds its layouts
 * by data address). A failure only means the backend reads that weight as it
 * is: returns how many weights it could not prepare (0: all). */
int kv_model_prepare_weights(const kv_model *m, kv_backend *be);

/* Name of an architecture ("gemma3"); "?" out of range. */
const char *kv_arch_name(kv_arch a);
/* The architectures kvtop runs, ", "-separated ("llama, qwen2, ..."). */
const char *kv_arch_list(void);
/* One line of what is particular to m's architecture for `kvtop info`
 * ("sliding window 512 on 15 of 18 layers (local RoPE base 10000), ..."),
 * "" for plain llama. Writes at most cap bytes into buf (OUT). */
void kv_arch_describe(const kv_model *m, char *buf /* OUT: (cap) */, size_t cap);

/* KV cache bytes one token takes over all layers (K and V) in dtype. */
uint64_t kv_model_kv_bytes_per_token(const kv_model *m, kv_cache_dtype dtype);

#endif
