/* fuzz_model.c - libFuzzer target for the model loader on GGUF input: the
 * architecture table and each architecture's keys and tensors (arch.c:
 * sliding window and its pattern, RoPE scaling and rope_freqs, Q/K norms,
 * biases, fused QKV and gate/up views; arch_moe.c: expert counts and the
 * per-expert views of the 3-D expert tensors), on top of the common keys
 * (model.c). Any input must be rejected with a message or load into a
 * model whose every bound tensor lies inside the input and whose shapes
 * are consistent; nothing may crash. The input goes through a file (the
 * loader maps a path). Seeds: tests/fuzz/seeds/fuzz_model, small files of
 * every architecture from `kvtop mkmodel --arch`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tensor(const kv_tensor *t, const kv_model *m) {
    if (!t->data || t->ne0 <= 0 || t->ne1 <= 0) __builtin_trap();
    volatile uint8_t sink = ((const uint8_t *)t->data)[0];
    sink ^= ((const uint8_t *)t->data)[(size_t)t->ne1 * t->nb1 - 1];
    (void)sink;
    (void)m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/kvtop_fuzz_model_%d.gguf", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    kv_err err = {0};
    kv_model *m = kv_model_load(path, NULL, &err);
    if (!m) {
        if (err.code == 0 || err.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    const kv_hparams *hp = &m->hp;
    if (hp->n_heads % hp->n_kv_heads || hp->rot_dim > hp->head_dim || hp->n_swa > hp->ctx_len) __builtin_trap();
    check_tensor(&m->tok_embd, m);
    check_tensor(&m->output, m);
    for (int l = 0; l < hp->n_layers; l++) {
        const kv_layer *L = &m->layers[l];
        const kv_tensor *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        const size_t nw = hp->n_expert ? 4 : sizeof ws / sizeof ws[0]; /* MoE: no dense feed-forward */
        for (size_t i = 0; i < nw; i++) check_tensor(ws[i], m);
        if (hp->n_expert) {
            if (hp->n_expert > KV_MOE_MAX_EXPERTS || hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert ||
                L->router.ne1 != hp->n_expert || L->router.ne0 != hp->dim)
                __builtin_trap();
            check_tensor(&L->router, m);
            for (int e = 0; e < hp->n_expert; e++) {
                if (L->exp_down[e].ne0 != hp->expert_ffn_dim || L->exp_gate[e].ne1 != hp->expert_ffn_dim)
                    __builtin_trap();
                check_tensor(&L->exp_gate[e], m);
                check_tensor(&L->exp_up[e], m);
                check_tensor(&L->exp_down[e], m);
            }
        }
        volatile float s = L->attn_norm[hp->dim - 1] + L->ffn_norm[hp->dim - 1];
        if (L->q_norm) s += L->q_norm[hp->head_dim - 1] + L->k_norm[hp->head_dim - 1];
        if (L->post_attn_norm) s += L->post_attn_norm[hp->dim - 1] + L->post_ffn_norm[hp->dim - 1];
        if (L->bq) s += L->bq[hp->n_heads * hp->head_dim - 1] + L->bv[hp->n_kv_heads * hp->head_dim - 1];
        (void)s;
    }
    if (m->rope_freqs && !(m->rope_freqs[hp->rot_dim / 2 - 1] > 0)) __builtin_trap();
    kv_model_free(m);
    return 0;
}
