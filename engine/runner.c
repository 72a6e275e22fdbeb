/* runner.c - a single sequence on the paged forward pass: its KV pages are a
 * private pool whose block table is the identity. */
#include "runner.h"

#include <stdlib.h>
#include <string.h>

struct kv_runner {
    const kv_model *m;
    kv_backend *b;
    kv_forward *fw;
    kv_pages pages;
    int32_t *table;   /* (n_blocks) identity block table */
    int32_t *pos;     /* (chunk) scratch: positions */
    int32_t *slot;    /* (chunk) scratch: slots */
    int32_t *seq;     /* (chunk) scratch: all zero */
    int32_t *rows;    /* (chunk) logit rows */
    int max_ctx;
    int chunk;
    int n_past;       /* tokens in the cache */
    uint64_t bytes;
};

void kv_runner_free(kv_runner *r) {
    if (!r) return;
    kv_forward_free(r->fw);
    if (r->pages.k) r->b->ops->free(r->b, r->pages.k);
    if (r->pages.v) r->b->ops->free(r->b, r->pages.v);
    free(r->table);
    free(r->pos);
    free(r->slot);
    free(r->seq);
    free(r->rows);
    free(r);
}

kv_runner *kv_runner_new(const kv_model *m, kv_backend *b, int max_ctx, int chunk, kv_cache_dtype dtype,
                         kv_err *err) {
    if (max_ctx <= 0 || max_ctx > m->hp.ctx_len) max_ctx = m->hp.ctx_len;
    if (chunk <= 0) chunk = 256;
    if (chunk > max_ctx) chunk = max_ctx;
    kv_runner *r = calloc(1, sizeof *r);
    if (!r) {
        kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        return NULL;
    }
    r->m = m;
    r->b = b;
    r->max_ctx = max_ctx;
    r->chunk = chunk;
    const int bs = 16;
    kv_pages *p = &r->pages;
    p->dtype = dtype;
    p->n_layers = m->hp.n_layers;
    p->n_kv_heads = m->hp.n_kv_heads;
    p->head_dim = m->hp.head_dim;
    p->block_size = bs;
    p->n_blocks = (max_ctx + bs - 1) / bs;
    p->row_bytes = kv_cache_row_bytes(dtype, p->head_dim);
    p->slot_bytes = (size_t)p->n_kv_heads * p->row_bytes;
    p->layer_bytes = (size_t)p->n_blocks * bs * p->slot_bytes;
    size_t kv_bytes = p->layer_bytes * (size_t)p->n_layers;
    p->k = b->ops->alloc(b, kv_bytes);
    p->v = b->ops->alloc(b, kv_bytes);
    r->table = malloc((size_t)p->n_blocks * sizeof(int32_t));
    r->pos = malloc((size_t)chunk * sizeof(int32_t));
    r->slot = malloc((size_t)chunk * sizeof(int32_t));
    r->seq = calloc((size_t)chunk, sizeof(int32_t));
    r->rows = malloc((size_t)chunk * sizeof(int32_t));
    if (!p->k || !p->v || !r->table || !r->pos || !r->slot || !r->seq || !r->rows) {
        kv_err_set(err, KV_ERR_NOMEM, "runner: cannot allocate a %d-token KV cache", max_ctx);
        kv_runner_free(r);
        return NULL;
    }
    for (int i = 0; i < p->n_blocks; i++) r->table[i] = i;
    r->fw = kv_forward_new(m, b, chunk, chunk, err);
    if (!r->fw) {
        kv_runner_free(r);
        return NULL;
    }
    r->bytes = 2 * kv_bytes + kv_forward_activation_bytes(r->fw);
    return r;
}

void kv_runner_reset(kv_runner *r) { r->n_past = 0; }
void kv_runner_truncate(kv_runner *r, int n) {
    if (n >= 0 && n < r->n_past) r->n_past = n;
}
int kv_runner_pos(const kv_runner *r) { return r->n_past; }
int kv_runner_max_ctx(const kv_runner *r) { return r->max_ctx; }
uint64_t kv_runner_bytes(const kv_runner *r) { return r->bytes; }

int kv_runner_eval(kv_runner *r, const int32_t *tokens, int n, float *logits, float *all_logits, kv_err *err) {
    if (n <= 0) return kv_err_set(err, KV_ERR_INVAL, "runner: nothing to evaluate");
    if (n > r->max_ctx - r->n_past)
        return kv_err_set(err, KV_ERR_RANGE, "context full: %d tokens in the cache + %d new > %d", r->n_past, n,
                          r->max_ctx);
    const int n_vocab = r->m->hp.n_vocab;
    for (int i = 0; i < n; i++) /* validate all chunks first: a failure changes nothing */
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return kv_err_set(err, KV_ERR_RANGE, "token id %d out of range [0, %d)", tokens[i], n_vocab);
    const int32_t *tables[1] = {r->table};
    for (int done = 0; done < n;) {
        int c = KV_MIN(r->chunk, n - done);
        for (int i = 0; i < c; i++) {
            r->pos[i] = r->n_past + i;
            r->slot[i] = r->n_past + i; /* identity table: slot == position */
        }
        int last = done + c == n;
        int n_logits = all_logits ? c : last ? 1 : 0;
        for (int i = 0; i < n_logits; i++) r->rows[i] = all_logits ? i : c - 1;
        kv_batch bt = {
            .n_tokens = c,
            .tokens = tokens + done,
            .ab = {.n_tokens = c, .pos = r->pos, .seq = r->seq, .slot = r->slot, .n_seqs = 1, .tables = tables},
            .n_logits = n_logits,
            .logit_rows = r->rows,
        };
        float *out = all_logits ? all_logits + (size_t)done * n_vocab : logits;
        int rc = kv_forward_run(r->fw, &r->pages, &bt, out, err);
        if (rc) return rc;
        r->n_past += c;
        done += c;
    }
    return 0;
}
