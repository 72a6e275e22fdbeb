/* arch.c - what each architecture adds to the llama layout: its GGUF keys
 * (sliding window, RoPE scaling and bases, query scale) and its tensors
 * (biases, per-head Q/K norms, post norms, fused QKV and gate/up), with the
 * names and shapes llama.cpp's converters write (src/llama-arch.cpp), each
 * checked before anything is used. model.c reads the common keys and calls
 * in here; forward.c reads the resulting hparams and layer fields. */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct arch_info {
    const char *name;
    int rope_neox;  /* 0: adjacent pairs (llama), 1: halves (neox) */
    kv_ffn_act act;
    int qk_norm;
    int qkv_bias;
    int post_norms;
    int fused_qkv;
} arch_info;

static const arch_info archs[KV_ARCH_COUNT] = {
    [KV_ARCH_LLAMA] = {"llama", 0, KV_ACT_SILU, 0, 0, 0, 0},
    [KV_ARCH_QWEN2] = {"qwen2", 1, KV_ACT_SILU, 0, 1, 0, 0},
    [KV_ARCH_QWEN3] = {"qwen3", 1, KV_ACT_SILU, 1, 0, 0, 0},
    [KV_ARCH_GEMMA3] = {"gemma3", 1, KV_ACT_GELU_TANH, 1, 0, 1, 0},
    [KV_ARCH_PHI3] = {"phi3", 1, KV_ACT_SILU, 0, 0, 0, 1},
    [KV_ARCH_QWEN3MOE] = {"qwen3moe", 1, KV_ACT_SILU, 1, 0, 0, 0},
};

const char *kv_arch_name(kv_arch a) { return (int)a >= 0 && a < KV_ARCH_COUNT ? archs[a].name : "?"; }

const char *kv_arch_list(void) { return "llama, qwen2, qwen3, gemma3, phi3, qwen3moe"; }

int kv_arch_find(kv_gguf_str s) {
    for (int i = 0; i < KV_ARCH_COUNT; i++)
        if (kv_gguf_str_eq(s, archs[i].name)) return i;
    return -1;
}

void kv_arch_defaults(kv_hparams *hp) {
    const arch_info *ai = &archs[(int)hp->arch_id >= 0 && hp->arch_id < KV_ARCH_COUNT ? hp->arch_id : 0];
    hp->rope_neox = ai->rope_neox;
    hp->act = ai->act;
    hp->qk_norm = ai->qk_norm;
    hp->qkv_bias = ai->qkv_bias;
    hp->post_norms = ai->post_norms;
    hp->fused_qkv = ai->fused_qkv;
    hp->embd_scale = 1.0f;
    hp->rope_freq_scale = 1.0f;
    hp->rope_base_swa = 10000.0f;
    hp->n_swa = 0;
    hp->n_swa_layers = 0;
}

/* RoPE scaling: "none" and "linear" (positions times 1 / factor) are what
 * these architectures' files use; Llama 3's frequency table comes as the
 * rope_freqs tensor. Anything else (yarn, longrope) is refused, naming the
 * key, rather than run with the wrong angles. */
static int load_rope_scaling(kv_model *m, kv_err *err) {
    kv_hparams *hp = &m->hp;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    kv_gguf_str s;
    int rc = kv_gguf_get_str(m->gguf, key, &s, err);
    if (rc < 0) return rc;
    if (rc == 1 || kv_gguf_str_eq(s, "none")) return 0;
    if (!kv_gguf_str_eq(s, "linear"))
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: '%s' = '%.*s' is not supported (none, linear)", m->path, key,
                          (int)KV_MIN(s.len, 32), s.data);
    float factor = 1.0f;
    if ((rc = kv_model_hp_f32(m->gguf, hp->arch, "rope.scaling.factor", &factor, err))) return rc;
    if (!(factor >= 1.0f) || !(factor <= 1024.0f))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: '%s.rope.scaling.factor' = %g must be in [1, 1024]", m->path,
                          hp->arch, (double)factor);
    hp->rope_freq_scale = 1.0f / factor;
    return 0;
}

/* Which layers are local: gemma3 makes every layer local but each
 * pattern-th (llama.cpp's default pattern 6, or the file's
 * attention.sliding_window_pattern); llama (Mistral) makes all local. */
static int load_window(kv_model *m, kv_err *err) {
    kv_hparams *hp = &m->hp;
    int rc, pattern = hp->arch_id == KV_ARCH_GEMMA3 ? 6 : 1;
    if (hp->arch_id != KV_ARCH_GEMMA3 && hp->arch_id != KV_ARCH_LLAMA) return 0; /* NOTE: llama.cpp ignores
                                                                                    phi3's and qwen2's windows too */
    if ((rc = kv_model_hp_u32(m->gguf, hp->arch, "attention.sliding_window", 0, 0, &hp->n_swa, m->path, err)))
        return rc;
    if (hp->n_swa == 0) return 0;
    if (hp->n_swa > hp->ctx_len)
        return kv_err_set(err, KV_ERR_FORMAT,
                          "%s: '%s.attention.sliding_window' = %d is larger than the context length %d", m->path,
                          hp->arch, hp->n_swa, hp->ctx_len);
    if (hp->arch_id == KV_ARCH_GEMMA3) {
        if ((rc = kv_model_hp_u32(m->gguf, hp->arch, "attention.sliding_window_pattern", 0, 6, &pattern, m->path,
                                  err)))
            return rc;
        if (pattern <= 0)
            return kv_err_set(err, KV_ERR_FORMAT, "%s: '%s.attention.sliding_window_pattern' must be positive",
                              m->path, hp->arch);
        if ((rc = kv_model_hp_f32(m->gguf, hp->arch, "rope.freq_base_swa", &hp->rope_base_swa, err))) return rc;
        if (!(hp->rope_base_swa > 0))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: '%s.rope.freq_base_swa' must be positive", m->path, hp->arch);
    } else {
        hp->rope_base_swa = hp->rope_base;
    }
    for (int l = 0; l < hp->n_layers; l++) {
        kv_layer *L = &m->layers[l];
        L->swa = pattern == 1 || l % pattern < pattern - 1;
        hp->n_swa_layers += L->swa;
    }
    return 0;
}

int kv_arch_load_hparams(kv_model *m, kv_err *err) {
    kv_hparams *hp = &m->hp;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    if (!m->layers) return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    int rc;
    if ((rc = load_rope_scaling(m, err)) || (rc = load_window(m, err)) || (rc = kv_arch_moe_load_hparams(m, err)))
        return rc;
    if (hp->arch_id == KV_ARCH_GEMMA3) {
        hp->embd_scale = sqrtf((float)hp->dim);
        /* NOTE: gemma3's query_pre_attn_scalar is head_dim for every size
         * but 27B (dim / n_heads); GGUF has no key for it, so llama.cpp
         * tells by the layer count (62), and so do we. */
        int qpas = hp->n_layers == 62 ? hp->dim / hp->n_heads : hp->head_dim;
        hp->attn_scale = 1.0f / sqrtf((float)qpas);
        float cap = 0.0f;
        if ((rc = kv_model_hp_f32(m->gguf, hp->arch, "final_logit_softcapping", &cap, err))) return rc;
        if (cap != 0.0f)
            return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: '%s.final_logit_softcapping' = %g is not supported",
                              m->path, hp->arch, (double)cap);
    }
    for (int l = 0; l < hp->n_layers; l++) m->layers[l].rope_base = m->layers[l].swa ? hp->rope_base_swa : hp->rope_base;
    return 0;
}

/* A view of rows [r0, r0 + rows) of the fused matrix f (phi3's attn_qkv and
 * ffn_up): quantized rows are independent, so a view needs no copy. */
static kv_tensor row_view(const kv_tensor *f, int64_t r0, int64_t rows) {
    kv_tensor t = *f;
    t.ne1 = rows;
    t.data = (const uint8_t *)f->data + (size_t)r0 * f->nb1;
    return t;
}

/* Q/K/V of layer l: separate tensors (with biases for qwen2), or phi3's
 * fused attn_qkv split into row views. */
static int bind_qkv(kv_model *m, int l, kv_layer *L, kv_err *err) {
    const kv_hparams *hp = &m->hp;
    const int64_t dim = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    char n[96];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
    if (hp->fused_qkv) {
        kv_tensor f;
        rc = kv_model_bind_matrix(m, NAME("attn_qkv.weight"), dim, qd + 2 * kvd, 1, &f, err);
        if (rc < 0) return rc;
        if (rc == 0) {
            L->wq = row_view(&f, 0, qd);
            L->wk = row_view(&f, qd, kvd);
            L->wv = row_view(&f, qd + kvd, kvd);
            return 0;
        }
        if (!kv_gguf_find_tensor(m->gguf, NAME("attn_q.weight")))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: missing tensor 'blk.%d.attn_qkv.weight' (nor attn_q, attn_k, "
                              "attn_v)", m->path, l);
    }
    if ((rc = kv_model_bind_matrix(m, NAME("attn_q.weight"), dim, qd, 0, &L->wq, err)) ||
        (rc = kv_model_bind_matrix(m, NAME("attn_k.weight"), dim, kvd, 0, &L->wk, err)) ||
        (rc = kv_model_bind_matrix(m, NAME("attn_v.weight"), dim, kvd, 0, &L->wv, err)))
        return rc;
    if (hp->qkv_bias &&
        ((rc = kv_model_bind_vector(m, NAME("attn_q.bias"), qd, 0, &L->bq, err)) ||
         (rc = kv_model_bind_vector(m, NAME("attn_k.bias"), kvd, 0, &L->bk, err)) ||
         (rc = kv_model_bind_vector(m, NAME("attn_v.bias"), kvd, 0, &L->bv, err))))
        return rc;
#undef NAME
    return 0;
}

/* The feed-forward of layer l: gate, up, down, or phi3's ffn_up holding
 * gate and up (gate the first ffn_dim rows, as llama.cpp's fused swiglu
 * splits it). */
static int bind_ffn(kv_model *m, int l, kv_layer *L, kv_err *err) {
    const kv_hparams *hp = &m->hp;
    const int64_t dim = hp->dim, ffn = hp->ffn_dim;
    char n[96];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
    if ((rc = kv_model_bind_matrix(m, NAME("ffn_down.weight"), ffn, dim, 0, &L->w_down, err))) return rc;
    if (hp->fused_qkv && !kv_gguf_find_tensor(m->gguf, NAME("ffn_gate.weight"))) {
        kv_tensor f;
        if ((rc = kv_model_bind_matrix(m, NAME("ffn_up.weight"), dim, 2 * ffn, 0, &f, err))) return rc;
        L->w_gate = row_view(&f, 0, ffn);
        L->w_up = row_view(&f, ffn, ffn);
        return 0;
    }
    if ((rc = kv_model_bind_matrix(m, NAME("ffn_gate.weight"), dim, ffn, 0, &L->w_gate, err)) ||
        (rc = kv_model_bind_matrix(m, NAME("ffn_up.weight"), dim, ffn, 0, &L->w_up, err)))
        return rc;
#undef NAME
    return 0;
}

int kv_arch_bind_tensors(kv_model *m, kv_err *err) {
    kv_hparams *hp = &m->hp;
    const int64_t dim = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim;
    int rc;
    for (int l = 0; l < hp->n_layers; l++) {
        kv_layer *L = &m->layers[l];
        char n[96];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
        if ((rc = kv_model_bind_vector(m, NAME("attn_norm.weight"), dim, 0, &L->attn_norm, err)) ||
            (rc = bind_qkv(m, l, L, err)) ||
            (rc = kv_model_bind_matrix(m, NAME("attn_output.weight"), qd, dim, 0, &L->wo, err)) ||
            (rc = kv_model_bind_vector(m, NAME("ffn_norm.weight"), dim, 0, &L->ffn_norm, err)) ||
            (rc = hp->n_expert ? kv_arch_moe_bind(m, l, L, err) : bind_ffn(m, l, L, err)))
            return rc;
        if (hp->qk_norm &&
            ((rc = kv_model_bind_vector(m, NAME("attn_q_norm.weight"), hp->head_dim, 0, &L->q_norm, err)) ||
             (rc = kv_model_bind_vector(m, NAME("attn_k_norm.weight"), hp->head_dim, 0, &L->k_norm, err))))
            return rc;
        if (hp->post_norms &&
            ((rc = kv_model_bind_vector(m, NAME("post_attention_norm.weight"), dim, 0, &L->post_attn_norm, err)) ||
             (rc = kv_model_bind_vector(m, NAME("post_ffw_norm.weight"), dim, 0, &L->post_ffn_norm, err))))
            return rc;
#undef NAME
    }
    /* Llama 3: one frequency-divisor table for every layer */
    rc = kv_model_bind_vector(m, "rope_freqs.weight", hp->rot_dim / 2, 1, &m->rope_freqs, err);
    if (rc < 0) return rc;
    for (int i = 0; m->rope_freqs && i < hp->rot_dim / 2; i++)
        if (!(m->rope_freqs[i] > 0.0f) || !isfinite(m->rope_freqs[i]))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor 'rope_freqs.weight'[%d] = %g must be positive", m->path,
                              i, (double)m->rope_freqs[i]);
    if (kv_gguf_find_tensor(m->gguf, "rope_factors_long.weight"))
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: tensor 'rope_factors_long.weight' (LongRoPE) is not supported",
                          m->path);
    if ((rc = kv_model_bind_vector(m, "output_norm.weight", dim, 0, &m->output_norm, err))) return rc;
    rc = kv_model_bind_matrix(m, "output.weight", dim, hp->n_vocab, 1, &m->output, err);
    if (rc < 0) return rc;
    hp->tied_output = (rc == 1);
    if (hp->tied_output) m->output = m->tok_embd;
    return 0;
}

void kv_arch_describe(const kv_model *m, char *buf, size_t cap) {
    const kv_hparams *hp = &m->hp;
    size_t n = 0;
    buf[0] = '\0';
#define PUT(...) (n += (size_t)snprintf(buf + KV_MIN(n, cap - 1), cap - KV_MIN(n, cap - 1), __VA_ARGS__))
    if (hp->n_swa)
        PUT("%ssliding window %d on %d of %d layers (local RoPE base %g)", n ? ", " : "", hp->n_swa,
            hp->n_swa_layers, hp->n_layers, (double)hp->rope_base_swa);
    if (hp->qkv_bias) PUT("%sQ/K/V biases", n ? ", " : "");
    if (hp->qk_norm) PUT("%sper-head Q/K RMSNorm", n ? ", " : "");
    if (hp->post_norms) PUT("%spost-attention and post-FFN norms", n ? ", " : "");
    if (hp->fused_qkv) PUT("%sfused QKV and gate/up", n ? ", " : "");
    if (hp->act == KV_ACT_GELU_TANH) PUT("%sGeGLU (tanh GELU)", n ? ", " : "");
    if (hp->embd_scale != 1.0f) PUT("%sembeddings x %.4g", n ? ", " : "", (double)hp->embd_scale);
    if (fabsf(hp->attn_scale * sqrtf((float)hp->head_dim) - 1.0f) > 1e-6f)
        PUT("%squery scale %.4g", n ? ", " : "", (double)hp->attn_scale);
    if (m->rope_freqs) PUT("%sLlama 3 RoPE frequencies (rope_freqs)", n ? ", " : "");
    if (hp->rope_freq_scale != 1.0f) PUT("%slinear RoPE scaling x%g", n ? ", " : "", 1.0 / hp->rope_freq_scale);
    if (hp->n_expert) {
        PUT("%s", n ? ", " : "");
        n += kv_arch_moe_describe(m, buf + KV_MIN(n, cap - 1), cap - KV_MIN(n, cap - 1));
    }
#undef PUT
}
