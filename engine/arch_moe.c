/* arch_moe.c - the mixture-of-experts feed-forward of qwen3moe (and of
 * Mixtral-style llama files, which carry expert tensors): its GGUF keys
 * (expert_count, expert_used_count, expert_feed_forward_length) and its
 * tensors (the router ffn_gate_inp and the 3-D ffn_{gate,up,down}_exps,
 * llama.cpp's names and shapes), checked before anything is used. Each
 * expert's matrix is bound as a view of rows of the 3-D tensor: experts
 * are stored one after the other, so a view needs no copy. The routing
 * these files ask for: softmax over every expert's logit, the top
 * expert_used_count, their weights renormalised to sum 1. */
#include "model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_arch_moe_load_hparams(kv_model *m, kv_err *err) {
    kv_hparams *hp = &m->hp;
    const int required = hp->arch_id == KV_ARCH_QWEN3MOE;
    int rc;
    if (hp->arch_id != KV_ARCH_QWEN3MOE && hp->arch_id != KV_ARCH_LLAMA) return 0;
    if ((rc = kv_model_hp_u32(m->gguf, hp->arch, "expert_count", required, 0, &hp->n_expert, m->path, err)))
        return rc;
    if (!required && hp->n_expert == 0) return 0; /* a dense llama */
    if (hp->n_expert <= 0 || hp->n_expert > KV_MOE_MAX_EXPERTS)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: '%s.expert_count' = %d must be in [1, %d]", m->path, hp->arch,
                          hp->n_expert, KV_MOE_MAX_EXPERTS);
    if ((rc = kv_model_hp_u32(m->gguf, hp->arch, "expert_used_count", 1, 0, &hp->n_expert_used, m->path, err)))
        return rc;
    if (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: '%s.expert_used_count' = %d must be in [1, expert_count %d]",
                          m->path, hp->arch, hp->n_expert_used, hp->n_expert);
    /* qwen3moe's expert width has its own key (llama.cpp falls back to
     * feed_forward_length / expert_used_count); Mixtral's is the dense one */
    int fallback = required ? hp->ffn_dim / hp->n_expert_used : hp->ffn_dim;
    if ((rc = kv_model_hp_u32(m->gguf, hp->arch, "expert_feed_forward_length", 0, (uint32_t)fallback,
                              &hp->expert_ffn_dim, m->path, err)))
        return rc;
    if (hp->expert_ffn_dim <= 0)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: '%s.expert_feed_forward_length' = %d must be positive", m->path,
                          hp->arch, hp->expert_ffn_dim);
    float scale = 0.0f;
    if (!required && (rc = kv_model_hp_f32(m->gguf, hp->arch, "expert_weights_scale", &scale, err))) return rc;
    if (scale != 0.0f && scale != 1.0f)
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: '%s.expert_weights_scale' = %g is not supported", m->path,
                          hp->arch, (double)scale);
    hp->expert_norm = 1;
    return 0;
}

/* Binds the 3-D expert tensor `name` of exactly (ne0, ne1, n_expert) and
 * writes one (ne0, ne1) row view per expert into views (OUT: n_expert). */
static int bind_experts(kv_model *m, const char *name, int64_t ne0, int64_t ne1, kv_tensor *views, kv_err *err) {
    const int E = m->hp.n_expert;
    const kv_gguf_tensor *t = kv_gguf_find_tensor(m->gguf, name);
    if (!t) return kv_err_set(err, KV_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    if (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != E || t->ne[3] != 1)
        return kv_err_set(err, KV_ERR_FORMAT,
                          "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %d] "
                          "(input, output, expert_count)",
                          m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                          (long long)t->ne[3], (long long)ne0, (long long)ne1, E);
    /* the 2-D checks (type, counting) on the view of expert 0's rows */
    int rc = kv_model_bind_tensor_rows(m, t, ne0, ne1 * E, &views[0], err);
    if (rc) return rc;
    const kv_tensor all = views[0];
    for (int e = 0; e < E; e++) {
        views[e] = all;
        views[e].ne1 = ne1;
        views[e].data = (const uint8_t *)all.data + (size_t)e * (size_t)ne1 * all.nb1;
    }
    return 0;
}

int kv_arch_moe_bind(kv_model *m, int l, kv_layer *L, kv_err *err) {
    const kv_hparams *hp = &m->hp;
    const int64_t dim = hp->dim, ff = hp->expert_ffn_dim, E = hp->n_expert;
    if (!m->expert_views) {
        m->expert_views = calloc((size_t)hp->n_layers * 3 * (size_t)E, sizeof *m->expert_views);
        if (!m->expert_views) return kv_err_set(err, KV_ERR_NOMEM, "out of memory for the expert views");
    }
    kv_tensor *v = m->expert_views + (size_t)l * 3 * (size_t)E;
    char n[96];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
    if ((rc = kv_model_bind_matrix(m, NAME("ffn_gate_inp.weight"), dim, E, 0, &L->router, err)) ||
        (rc = bind_experts(m, NAME("ffn_gate_exps.weight"), dim, ff, v, err)) ||
        (rc = bind_experts(m, NAME("ffn_up_exps.weight"), dim, ff, v + E, err)) ||
        (rc = bind_experts(m, NAME("ffn_down_exps.weight"), ff, dim, v + 2 * E, err)))
        return rc;
    if (kv_gguf_find_tensor(m->gguf, NAME("ffn_gate_inp_shexp.weight")) ||
        kv_gguf_find_tensor(m->gguf, NAME("ffn_up_shexp.weight")))
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: shared experts (tensor '%s') are not supported", m->path, n);
#undef NAME
    L->exp_gate = v;
    L->exp_up = v + E;
    L->exp_down = v + 2 * E;
    return 0;
}

size_t kv_arch_moe_describe(const kv_model *m, char *buf, size_t cap) {
    const kv_hparams *hp = &m->hp;
    if (!hp->n_expert || cap == 0) return 0;
    int n = snprintf(buf, cap, "mixture of experts: %d experts, %d used per token, expert FFN %d (softmax top-%d%s)",
                     hp->n_expert, hp->n_expert_used, hp->expert_ffn_dim, hp->n_expert_used,
                     hp->expert_norm ? ", renormalised" : "");
    return n < 0 ? 0 : (size_t)n;
}
