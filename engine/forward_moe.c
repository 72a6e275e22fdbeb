/* forward_moe.c - the mixture-of-experts feed-forward. Per layer: router
 * logits (one matmul of ffn_gate_inp), the backend's moe_route (softmax,
 * top-k, renormalisation), then on the host a counting sort of the
 * (token, expert) pairs by expert. Then, over runs of consecutive experts
 * whose pairs fit the pair buffers (every expert of a decode step: one
 * run): one get_rows gathers the pairs' normed rows in expert order, one
 * matmul_groups runs every routed expert's gate and up matmuls on its own
 * rows, one silu_mul, one matmul_groups the down matmuls, and one
 * scatter_add puts each output row times its routing weight back into the
 * residual stream. Each expert's matmuls see exactly its rows, as they
 * would one expert at a time, so the bits are those of a per-expert loop;
 * the backend just dispatches once for all of them (a decode step's
 * experts get a few rows each: one dispatch per expert cost more than its
 * arithmetic). An expert's weights are read once per layer for all the
 * rows routed to it, whatever sequence they come from; an expert no token
 * chose is not read at all. */
#include "forward_moe.h"

#include <stdlib.h>
#include <string.h>

struct kv_moe {
    const kv_model *m;
    kv_backend *b;
    int max_tokens;
    int max_pairs; /* rows of xe, gate, up, ye: >= max_tokens (an expert's most) */
    /* backend buffers */
    float *logits;   /* (max_tokens, n_expert) router output */
    int32_t *ids;    /* (max_tokens, k) chosen experts */
    float *wts;      /* (max_tokens, k) their weights */
    int32_t *rows;   /* (max_tokens * k) token rows, grouped by expert */
    float *rw;       /* (max_tokens * k) the routing weight of each of rows */
    float *xe;       /* (max_pairs, dim) gathered input rows, grouped by expert */
    float *gate;     /* (max_pairs, expert_ffn_dim) */
    float *up;       /* (max_pairs, expert_ffn_dim) */
    float *ye;       /* (max_pairs, dim) the experts' output rows */
    /* host: one allocation (host) carved into these */
    void *host;
    int32_t *h_ids;  /* (max_tokens * k) */
    float *h_wts;    /* (max_tokens * k) */
    int32_t *h_rows; /* (max_tokens * k) */
    float *h_rw;     /* (max_tokens * k) */
    kv_matmul_group *g_gu, *g_down; /* (n_expert) one run's groups */
    int off[KV_MOE_MAX_EXPERTS + 1];
    uint32_t counts[KV_MOE_MAX_EXPERTS]; /* tokens per expert since the last take */
};

void kv_moe_free(kv_moe *mo) {
    if (!mo) return;
    void *bufs[] = {mo->logits, mo->ids, mo->wts, mo->rows, mo->rw, mo->xe, mo->gate, mo->up, mo->ye};
    for (size_t i = 0; i < KV_ARRAY_LEN(bufs); i++)
        if (bufs[i]) mo->b->ops->free(mo->b, bufs[i]);
    free(mo->host);
    free(mo);
}

kv_moe *kv_moe_new(const kv_model *m, kv_backend *b, int max_tokens, uint64_t *bytes, kv_err *err) {
    const kv_hparams *hp = &m->hp;
    kv_moe *mo = calloc(1, sizeof *mo);
    if (!mo) {
        kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        return NULL;
    }
    mo->m = m;
    mo->b = b;
    mo->max_tokens = max_tokens;
    const size_t T = (size_t)max_tokens, E = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    /* every pair of a batch of up to 2048 tokens' worth in one run; a
     * larger batch (a long prefill chunk) runs its experts in several */
    const size_t P = KV_MIN(T * K, KV_MAX(T, (size_t)2048)); /* >= T: k >= 1 */
    mo->max_pairs = (int)P;
    const size_t sizes[] = {T * E * 4, T * K * 4, T * K * 4, T * K * 4, T * K * 4, P * hp->dim * 4,
                            P * hp->expert_ffn_dim * 4, P * hp->expert_ffn_dim * 4, P * hp->dim * 4};
    void **bufs[] = {(void **)&mo->logits, (void **)&mo->ids, (void **)&mo->wts, (void **)&mo->rows,
                     (void **)&mo->rw, (void **)&mo->xe, (void **)&mo->gate, (void **)&mo->up, (void **)&mo->ye};
    int ok = 1;
    for (size_t i = 0; i < KV_ARRAY_LEN(bufs); i++) {
        *bufs[i] = b->ops->alloc(b, sizes[i]);
        *bytes += sizes[i];
        ok = ok && *bufs[i];
    }
    /* the four (T * k) id / weight arrays, then the two runs' groups (the
     * arrays' 16 * T * k bytes keep the groups' pointers aligned) */
    const size_t hk = T * K * 4;
    uint8_t *h = mo->host = malloc(4 * hk + 2 * E * sizeof(kv_matmul_group));
    if (h) {
        mo->h_ids = (int32_t *)(void *)h;
        mo->h_wts = (float *)(void *)(h + hk);
        mo->h_rows = (int32_t *)(void *)(h + 2 * hk);
        mo->h_rw = (float *)(void *)(h + 3 * hk);
        mo->g_gu = (kv_matmul_group *)(void *)(h + 4 * hk);
        mo->g_down = mo->g_gu + E;
    }
    if (!ok || !h) {
        kv_err_set(err, KV_ERR_NOMEM, "forward: cannot allocate the expert buffers for %d tokens", max_tokens);
        kv_moe_free(mo);
        return NULL;
    }
    return mo;
}

const char *kv_moe_missing_op(const kv_backend *b) {
    if (!b->ops->moe_route) return "moe_route";
    if (!b->ops->scatter_add) return "scatter_add";
    return NULL;
}

void kv_moe_limits(const kv_model *m, kv_backend_limits *lim) {
    const kv_hparams *hp = &m->hp;
    for (int l = 0; l < hp->n_layers && hp->n_expert; l++) {
        const kv_layer *L = &m->layers[l];
        /* every expert of a layer shares its tensor's type: expert 0 speaks for them */
        const kv_tensor *ws[] = {&L->router, &L->exp_gate[0], &L->exp_up[0], &L->exp_down[0]};
        for (size_t i = 0; i < KV_ARRAY_LEN(ws); i++) {
            lim->max_k = KV_MAX(lim->max_k, ws[i]->ne0);
            lim->weight_types |= (uint64_t)1 << ((unsigned)ws[i]->type & 63);
        }
    }
}

/* Groups the n * k (token, expert) pairs of h_ids / h_wts by expert (a
 * counting sort; tokens ascending within an expert) into h_rows / h_rw,
 * with expert e's pairs at [off[e], off[e + 1]). */
static void group_by_expert(kv_moe *mo, int n) {
    const int E = mo->m->hp.n_expert, k = mo->m->hp.n_expert_used;
    int *off = mo->off;
    memset(off, 0, sizeof(int) * (size_t)(E + 1));
    for (int i = 0; i < n * k; i++) off[mo->h_ids[i] + 1]++;
    for (int e = 0; e < E; e++) {
        mo->counts[e] += (uint32_t)off[e + 1];
        off[e + 1] += off[e];
    }
    int fill[KV_MOE_MAX_EXPERTS];
    memcpy(fill, off, sizeof(int) * (size_t)E);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const int e = mo->h_ids[t * k + j], at = fill[e]++;
            mo->h_rows[at] = t;
            mo->h_rw[at] = mo->h_wts[t * k + j];
        }
}

void kv_moe_ffn(kv_moe *mo, const kv_layer *L, const float *xb, float *x, int n) {
    const kv_hparams *hp = &mo->m->hp;
    kv_backend *b = mo->b;
    const kv_backend_ops *o = b->ops;
    const int E = hp->n_expert, k = hp->n_expert_used, dim = hp->dim, ff = hp->expert_ffn_dim;
    const size_t pairs = (size_t)n * k;
    o->matmul(b, &L->router, xb, mo->logits, n);
    o->moe_route(b, mo->logits, n, E, k, hp->expert_norm, mo->ids, mo->wts);
    o->download(b, mo->h_ids, mo->ids, pairs * sizeof(int32_t));
    o->download(b, mo->h_wts, mo->wts, pairs * sizeof(float));
    /* a failed op upstream leaves the ids unset: keep them in range so the
     * grouping stays in bounds (the batch fails at its status check) */
    for (size_t i = 0; i < pairs; i++)
        if (mo->h_ids[i] < 0 || mo->h_ids[i] >= E) mo->h_ids[i] = 0;
    group_by_expert(mo, n);
    o->upload(b, mo->rows, mo->h_rows, pairs * sizeof(int32_t));
    o->upload(b, mo->rw, mo->h_rw, pairs * sizeof(float));
    const kv_tensor xs = kv_tensor_f32(xb, dim, n);
    for (int e0 = 0; e0 < E;) {
        /* a run of experts [e0, e1) whose pairs fit the buffers (an expert
         * alone always does: it has at most n <= max_tokens pairs) */
        int e1 = e0 + 1;
        while (e1 < E && mo->off[e1 + 1] - mo->off[e0] <= mo->max_pairs) e1++;
        const int p0 = mo->off[e0], np = mo->off[e1] - p0;
        int ng = 0;
        for (int e = e0; e < e1; e++) {
            const int r = mo->off[e] - p0, c = mo->off[e + 1] - mo->off[e];
            if (c == 0) continue;
            mo->g_gu[ng] = (kv_matmul_group){.w = {&L->exp_gate[e], &L->exp_up[e]},
                                             .y = {mo->gate + (size_t)r * ff, mo->up + (size_t)r * ff},
                                             .nw = 2, .x = mo->xe + (size_t)r * dim, .n = c};
            mo->g_down[ng++] = (kv_matmul_group){.w = {&L->exp_down[e]}, .y = {mo->ye + (size_t)r * dim}, .nw = 1,
                                                 .x = mo->gate + (size_t)r * ff, .n = c};
        }
        if (np > 0) {
            o->get_rows(b, &xs, mo->rows + p0, mo->xe, np);
            kv_backend_matmul_groups(b, mo->g_gu, ng);
            o->silu_mul(b, mo->gate, mo->up, (int64_t)np * ff);
            kv_backend_matmul_groups(b, mo->g_down, ng);
            o->scatter_add(b, x, mo->ye, mo->rows + p0, mo->rw + p0, np, dim);
        }
        e0 = e1;
    }
}

int kv_moe_take_counts(kv_moe *mo, uint32_t *out, int cap) {
    const int E = mo->m->hp.n_expert;
    if (out)
        for (int e = 0; e < E && e < cap; e++) out[e] = mo->counts[e];
    memset(mo->counts, 0, sizeof mo->counts);
    return E;
}
