/* forward.c - the forward pass for a batch of tokens from many sequences:
 * embeddings (scaled for gemma3), then per layer RMSNorm, Q/K/V projections
 * (+ biases), per-head Q/K norms, RoPE (Llama 3 frequencies, per-layer
 * bases), paged K/V store and attention (windowed on local layers), output
 * projection (+ post norm), SwiGLU or GeGLU feed-forward (+ post norm), and
 * finally the output head for the requested rows only. What an
 * architecture has is read from the model's hparams and layer fields. Every buffer is sized
 * at creation, the backend's scratch too (ops.reserve); a run allocates
 * nothing. A run asks the backend once, at its end, whether an op failed
 * (ops.status) and fails with the op's name when one did. */
#include "forward.h"
#include "forward_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kv_forward {
    const kv_model *m;
    kv_backend *b;
    int max_tokens;
    int max_logits;
    int prune_last; /* 1: the last layer past its attention runs on the logit rows only (see kv_forward_run) */
    float *x;       /* (max_tokens, dim) residual stream */
    float *xb;      /* (max_tokens, dim) normed input / projection output */
    float *q;       /* (max_tokens, n_heads * head_dim) */
    float *k;       /* (max_tokens, n_kv_heads * head_dim) */
    float *v;       /* (max_tokens, n_kv_heads * head_dim) */
    float *att;     /* (max_tokens, n_heads * head_dim) attention output */
    float *gate;    /* (max_tokens, ffn_dim) */
    float *up;      /* (max_tokens, ffn_dim) */
    float *xl;      /* (max_logits, dim) rows that produce logits */
    float *logits;  /* (max_logits, n_vocab) backend buffer */
    int32_t *ids;   /* (max_tokens) backend copy of the token ids */
    int32_t *rows;  /* (max_logits) backend copy of the logit row indices */
    uint64_t bytes; /* total of the above */
    kv_moe *moe;    /* the experts' scratch (forward_moe.c), NULL for a dense model */
};

static void *balloc(kv_forward *f, size_t bytes) {
    f->bytes += bytes;
    return f->b->ops->alloc(f->b, bytes);
}

void kv_forward_free(kv_forward *f) {
    if (!f) return;
    kv_moe_free(f->moe);
    void *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->gate, f->up, f->xl, f->logits, f->ids, f->rows};
    for (size_t i = 0; i < KV_ARRAY_LEN(bufs); i++)
        if (bufs[i]) f->b->ops->free(f->b, bufs[i]);
    free(f);
}

/* What the ops of a forward over this model ask of the backend: rows of
 * up to max_tokens, matmul rows as long as the longest weight row, and the
 * weight types present. */
static kv_backend_limits forward_limits(const kv_model *m, int max_tokens) {
    const kv_hparams *hp = &m->hp;
    kv_backend_limits lim = {.max_rows = max_tokens, .max_k = hp->dim, .weight_types = 0,
                             .rope_dim = hp->rot_dim, .rope_base = hp->rope_base};
    const kv_tensor *w = &m->output;
    lim.max_k = KV_MAX(lim.max_k, w->ne0);
    lim.weight_types |= (uint64_t)1 << ((unsigned)w->type & 63);
    for (int l = 0; l < hp->n_layers; l++) {
        const kv_layer *L = &m->layers[l];
        const kv_tensor *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < KV_ARRAY_LEN(ws); i++) {
            lim.max_k = KV_MAX(lim.max_k, ws[i]->ne0);
            lim.weight_types |= (uint64_t)1 << ((unsigned)ws[i]->type & 63);
        }
    }
    kv_moe_limits(m, &lim);
    return lim;
}

/* The ops past llama's that m's architecture needs must be in b's table. */
static int check_ops(const kv_model *m, const kv_backend *b, kv_err *err) {
    const kv_hparams *hp = &m->hp;
    const kv_backend_ops *o = b->ops;
    const char *missing = NULL;
    if (hp->act == KV_ACT_GELU_TANH && !o->gelu_mul) missing = "gelu_mul";
    if (hp->embd_scale != 1.0f && !o->scale) missing = "scale";
    if (hp->qkv_bias && !o->add_rows) missing = "add_rows";
    if ((m->rope_freqs || hp->rope_freq_scale != 1.0f) && !o->rope_ext) missing = "rope_ext";
    if (hp->n_swa > 0 && !o->attention_window) missing = "attention_window";
    if (hp->n_expert > 0 && !missing) missing = kv_moe_missing_op(b);
    if (!missing) return 0;
    return kv_err_set(err, KV_ERR_UNSUPPORTED, "forward: the %s backend has no %s op, which %s models need", o->name,
                      missing, hp->arch);
}

kv_forward *kv_forward_new(const kv_model *m, kv_backend *b, int max_tokens, int max_logits, kv_err *err) {
    if (!m || !b || max_tokens <= 0 || max_logits <= 0 || max_logits > max_tokens) {
        kv_err_set(err, KV_ERR_INVAL, "forward: bad sizes (max_tokens %d, max_logits %d)", max_tokens, max_logits);
        return NULL;
    }
    kv_forward *f = calloc(1, sizeof *f);
    if (!f) {
        kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        return NULL;
    }
    f->m = m;
    f->b = b;
    f->max_tokens = max_tokens;
    f->max_logits = max_logits;
    /* NOTE: not on the sim backend: its step times are the ops it is
     * given, and the synthetic models' analytic step time (synth_step.c),
     * which tests hold equal to it, charges the whole last layer for every
     * token; the simulated engine keeps doing so until that model prices
     * the pruning too. */
    f->prune_last = !b->ops->name || strcmp(b->ops->name, "sim") != 0;
    const kv_hparams *hp = &m->hp;
    size_t T = (size_t)max_tokens, qd = (size_t)hp->n_heads * hp->head_dim;
    size_t kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    f->x = balloc(f, T * hp->dim * sizeof(float));
    f->xb = balloc(f, T * hp->dim * sizeof(float));
    f->q = balloc(f, T * qd * sizeof(float));
    f->k = balloc(f, T * kvd * sizeof(float));
    f->v = balloc(f, T * kvd * sizeof(float));
    f->att = balloc(f, T * qd * sizeof(float));
    f->gate = balloc(f, T * hp->ffn_dim * sizeof(float));
    f->up = balloc(f, T * hp->ffn_dim * sizeof(float));
    f->xl = balloc(f, (size_t)max_logits * hp->dim * sizeof(float));
    /* host-buffer backends write the caller's logits themselves (kv_forward_run) */
    f->logits = b->ops->host_buffers ? NULL : balloc(f, (size_t)max_logits * hp->n_vocab * sizeof(float));
    f->ids = balloc(f, T * sizeof(int32_t));
    f->rows = balloc(f, (size_t)max_logits * sizeof(int32_t));
    if (!f->rows || !f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->gate || !f->up || !f->xl ||
        (!f->logits && !b->ops->host_buffers) || !f->ids) {
        kv_err_set(err, KV_ERR_NOMEM, "forward: cannot allocate %.1f MiB of activations for %d tokens",
                   (double)f->bytes / (1 << 20), max_tokens);
        kv_forward_free(f);
        return NULL;
    }
    if (check_ops(m, b, err) != 0 || (hp->n_expert && !(f->moe = kv_moe_new(m, b, max_tokens, &f->bytes, err)))) {
        kv_forward_free(f);
        return NULL;
    }
    kv_backend_limits lim = forward_limits(m, max_tokens);
    if (kv_backend_reserve(b, &lim, err) != 0) {
        kv_forward_free(f);
        return NULL;
    }
    return f;
}

uint64_t kv_forward_activation_bytes(const kv_forward *f) { return f ? f->bytes : 0; }

int kv_forward_expert_tokens(kv_forward *f, uint32_t *out, int cap) {
    return f && f->moe ? kv_moe_take_counts(f->moe, out, cap) : 0;
}

/* Validates the batch against the model, the cache and the scratch sizes. */
static int check_batch(const kv_forward *f, const kv_pages *kv, const kv_batch *bt, kv_err *err) {
    const kv_hparams *hp = &f->m->hp;
    if (bt->n_tokens <= 0 || bt->n_tokens > f->max_tokens)
        return kv_err_set(err, KV_ERR_INVAL, "forward: %d tokens in batch (1..%d allowed)", bt->n_tokens,
                          f->max_tokens);
    if (bt->n_logits < 0 || bt->n_logits > f->max_logits)
        return kv_err_set(err, KV_ERR_INVAL, "forward: %d logit rows (0..%d allowed)", bt->n_logits, f->max_logits);
    if (bt->n_layers < 0 || bt->n_layers > hp->n_layers)
        return kv_err_set(err, KV_ERR_INVAL, "forward: n_layers %d out of range", bt->n_layers);
    const kv_pages *lk = bt->kv_local;
    if (!kv || kv->n_layers + (lk ? lk->n_layers : 0) != hp->n_layers || kv->n_kv_heads != hp->n_kv_heads ||
        kv->head_dim != hp->head_dim || (lk && (lk->n_kv_heads != hp->n_kv_heads || lk->head_dim != hp->head_dim)))
        return kv_err_set(err, KV_ERR_INVAL, "forward: KV cache shape does not match the model");
    int64_t n_slots = (int64_t)kv->n_blocks * kv->block_size;
    for (int i = 0; lk && i < bt->n_tokens; i++)
        if (!bt->ab_local.slot || bt->ab_local.slot[i] < 0 ||
            bt->ab_local.slot[i] >= (int64_t)lk->n_blocks * lk->block_size)
            return kv_err_set(err, KV_ERR_RANGE, "forward: token %d has no local-layer slot", i);
    for (int i = 0; i < bt->n_tokens; i++) {
        if (bt->tokens[i] < 0 || bt->tokens[i] >= hp->n_vocab)
            return kv_err_set(err, KV_ERR_RANGE, "forward: token id %d out of range [0, %d)", bt->tokens[i],
                              hp->n_vocab);
        if (bt->ab.pos[i] < 0 || bt->ab.slot[i] < 0 || bt->ab.slot[i] >= n_slots || bt->ab.seq[i] < 0 ||
            bt->ab.seq[i] >= bt->ab.n_seqs)
            return kv_err_set(err, KV_ERR_RANGE, "forward: token %d has bad position/slot/sequence", i);
    }
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_rows[i] < 0 || bt->logit_rows[i] >= bt->n_tokens)
            return kv_err_set(err, KV_ERR_RANGE, "forward: logit row %d out of range", bt->logit_rows[i]);
    return 0;
}

/* Whether every op of the batch worked (once per batch: an asynchronous
 * backend waits here for its queue). KV_ERR_BACKEND names the backend and
 * the op that failed first. */
static int backend_status(const kv_forward *f, kv_err *err) {
    kv_err be;
    kv_err_clear(&be);
    if (kv_backend_status(f->b, &be) == 0) return 0;
    return kv_err_set(err, KV_ERR_BACKEND, "forward: %s backend: %s", f->b->ops->name, be.msg);
}

/* RoPE of x (n, heads, head_dim) for layer L: the table's plain op unless
 * the model scales its frequencies (Llama 3's rope_freqs, linear). */
static void rope_layer(const kv_forward *f, const kv_layer *L, float *x, const int32_t *pos, int n, int heads) {
    const kv_model *m = f->m;
    const kv_hparams *hp = &m->hp;
    kv_backend *b = f->b;
    if (m->rope_freqs || hp->rope_freq_scale != 1.0f)
        b->ops->rope_ext(b, x, pos, n, heads, hp->head_dim, hp->rot_dim, L->rope_base, hp->rope_neox,
                         hp->rope_freq_scale, m->rope_freqs);
    else
        b->ops->rope(b, x, pos, n, heads, hp->head_dim, hp->rot_dim, L->rope_base, hp->rope_neox);
}

/* Layer l's attention: norm, Q/K/V (+ biases), per-head Q/K norms, RoPE,
 * K/V into the cache, attention (windowed on local layers), output
 * projection (+ post norm), residual. last_rows: from the output
 * projection on, only bt's logit rows, gathered into f->xl (the residual
 * the rest of the pass then works on); every token's K/V is still stored. */
static void attention_block(kv_forward *f, kv_pages *kv, int l, const kv_batch *bt, int last_rows) {
    const kv_model *m = f->m;
    const kv_hparams *hp = &m->hp;
    const kv_layer *L = &m->layers[l];
    kv_backend *b = f->b;
    const kv_backend_ops *o = b->ops;
    const int n = bt->n_tokens, dim = hp->dim;
    o->rmsnorm(b, f->x, L->attn_norm, f->xb, n, dim, hp->rms_eps);
    const kv_tensor *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
    float *qkv_y[3] = {f->q, f->k, f->v};
    kv_backend_matmul_same_x(b, qkv_w, 3, f->xb, qkv_y, n);
    if (L->bq) {
        o->add_rows(b, f->q, L->bq, n, hp->n_heads * hp->head_dim);
        o->add_rows(b, f->k, L->bk, n, hp->n_kv_heads * hp->head_dim);
        o->add_rows(b, f->v, L->bv, n, hp->n_kv_heads * hp->head_dim);
    }
    if (L->q_norm) { /* one row per head */
        o->rmsnorm(b, f->q, L->q_norm, f->q, n * hp->n_heads, hp->head_dim, hp->rms_eps);
        o->rmsnorm(b, f->k, L->k_norm, f->k, n * hp->n_kv_heads, hp->head_dim, hp->rms_eps);
    }
    rope_layer(f, L, f->q, bt->ab.pos, n, hp->n_heads);
    rope_layer(f, L, f->k, bt->ab.pos, n, hp->n_kv_heads);
    /* with the local layers' K/V apart (sliding-window release), each set
     * is indexed in model order within its own pages */
    const int apart = bt->kv_local != NULL, local = apart && L->swa;
    kv_pages *pk = local ? bt->kv_local : kv;
    const kv_attn_batch *ab = local ? &bt->ab_local : &bt->ab;
    int li = l;
    if (apart) {
        li = 0;
        for (int j = 0; j < l; j++) li += (m->layers[j].swa != 0) == (L->swa != 0);
    }
    o->kv_store(b, pk, li, ab, f->k, f->v);
    if (L->swa)
        o->attention_window(b, pk, li, ab, f->q, f->att, hp->n_heads, hp->attn_scale, hp->n_swa);
    else
        o->attention(b, pk, li, ab, f->q, f->att, hp->n_heads, hp->attn_scale);
    const float *att = f->att;
    float *res = f->x;
    int nr = n;
    if (last_rows) {
        /* the last layer: past its attention only the rows that produce
         * logits matter. Their attention outputs go to f->q (free now) and
         * their residual rows to f->xl, where the head reads them. */
        const int qd = hp->n_heads * hp->head_dim;
        const kv_tensor as = kv_tensor_f32(f->att, qd, n), xs = kv_tensor_f32(f->x, dim, n);
        nr = bt->n_logits;
        o->upload(b, f->rows, bt->logit_rows, (size_t)nr * sizeof(int32_t));
        o->get_rows(b, &as, f->rows, f->q, nr);
        o->get_rows(b, &xs, f->rows, f->xl, nr);
        att = f->q;
        res = f->xl;
    }
    o->matmul(b, &L->wo, att, f->xb, nr);
    if (L->post_attn_norm) o->rmsnorm(b, f->xb, L->post_attn_norm, f->xb, nr, dim, hp->rms_eps);
    o->add(b, res, f->xb, (int64_t)nr * dim);
}

/* Layer l's gated feed-forward (SwiGLU or GeGLU, + post norm) on the n
 * rows of the residual x. */
static void ffn_block(kv_forward *f, int l, float *x, int n) {
    const kv_hparams *hp = &f->m->hp;
    const kv_layer *L = &f->m->layers[l];
    kv_backend *b = f->b;
    const kv_backend_ops *o = b->ops;
    const int dim = hp->dim;
    o->rmsnorm(b, x, L->ffn_norm, f->xb, n, dim, hp->rms_eps);
    if (f->moe) { /* mixture of experts: adds into the residual itself */
        kv_moe_ffn(f->moe, L, f->xb, x, n);
        return;
    }
    const kv_tensor *gu_w[2] = {&L->w_gate, &L->w_up};
    float *gu_y[2] = {f->gate, f->up};
    kv_backend_matmul_same_x(b, gu_w, 2, f->xb, gu_y, n);
    if (hp->act == KV_ACT_GELU_TANH)
        o->gelu_mul(b, f->gate, f->up, (int64_t)n * hp->ffn_dim);
    else
        o->silu_mul(b, f->gate, f->up, (int64_t)n * hp->ffn_dim);
    o->matmul(b, &L->w_down, f->gate, f->xb, n);
    if (L->post_ffn_norm) o->rmsnorm(b, f->xb, L->post_ffn_norm, f->xb, n, dim, hp->rms_eps);
    o->add(b, x, f->xb, (int64_t)n * dim);
}

int kv_forward_run(kv_forward *f, kv_pages *kv, const kv_batch *bt, float *logits, kv_err *err) {
    int rc = check_batch(f, kv, bt, err);
    if (rc) return rc;
    const kv_model *m = f->m;
    const kv_hparams *hp = &m->hp;
    kv_backend *b = f->b;
    const kv_backend_ops *o = b->ops;
    const int n = bt->n_tokens, dim = hp->dim;
    const int n_layers = bt->n_layers ? bt->n_layers : hp->n_layers;

    o->upload(b, f->ids, bt->tokens, (size_t)n * sizeof(int32_t));
    o->get_rows(b, &m->tok_embd, f->ids, f->x, n);
    if (hp->embd_scale != 1.0f) o->scale(b, f->x, hp->embd_scale, (int64_t)n * dim);
    /* Only the rows that sample go through the last layer's output
     * projection and FFN and the (large) output head: with fewer of them
     * than tokens (a prompt chunk) they are gathered with get_rows after
     * the last attention. Every op is row-wise and the kernels batch
     * invariant, so their bits do not change. Not on MoE models, whose
     * per-expert token counts count every token of every layer, nor on the
     * sim backend (f->prune_last). */
    const int prune = f->prune_last && bt->n_logits > 0 && bt->n_logits < n && !f->moe;
    for (int l = 0; l < n_layers; l++) {
        const int last = prune && l == n_layers - 1;
        attention_block(f, kv, l, bt, last);
        ffn_block(f, l, last ? f->xl : f->x, last ? bt->n_logits : n);
    }
    if (bt->n_logits == 0) return backend_status(f, err);
    if (!prune) { /* the logit rows of the residual stream, viewed as an f32 matrix */
        const kv_tensor xs = kv_tensor_f32(f->x, dim, n);
        o->upload(b, f->rows, bt->logit_rows, (size_t)bt->n_logits * sizeof(int32_t));
        o->get_rows(b, &xs, f->rows, f->xl, bt->n_logits);
    }
    o->rmsnorm(b, f->xl, m->output_norm, f->xl, bt->n_logits, dim, hp->rms_eps);
    /* host-buffer backends: the head writes the caller's rows itself, no copy of n_logits x vocab floats */
    o->matmul(b, &m->output, f->xl, o->host_buffers ? logits : f->logits, bt->n_logits);
    if (!o->host_buffers) o->download(b, logits, f->logits, (size_t)bt->n_logits * hp->n_vocab * sizeof(float));
    return backend_status(f, err);
}
