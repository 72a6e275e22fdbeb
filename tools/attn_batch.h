/* attn_batch.h - the decode batch that tools/attn_bench.c (--batch) and
 * tools/attn_ab/attn_ab.c time: one decode token of each of n_seqs
 * sequences whose contexts are spread evenly over ctx_lo..ctx_hi, the
 * blocks of the pool scattered over it (or, shared, every sequence reading
 * the same blocks: K/V in cache), random K/V rows and queries. Header-only
 * (static functions): the two programs are built apart. */
#ifndef KV_TOOLS_ATTN_BATCH_H
#define KV_TOOLS_ATTN_BATCH_H

#include <stdlib.h>

#include "../kernels/backend.h"
#include "../kernels/kv_dtype.h"

typedef struct attn_batch_shape {
    int n_seqs, ctx_lo, ctx_hi, n_heads, n_kv_heads, head_dim, block_size, layers, shared;
    kv_cache_dtype dtype;
} attn_batch_shape;

typedef struct attn_batch_data {
    kv_pages pg;
    int32_t *tab, *pos; /* block tables (n_seqs x max blocks); pos, seq, slot (3 x n_seqs) */
    const int32_t **tabs;
    float *q;  /* (n_seqs, n_heads, head_dim) */
    size_t qn; /* floats of q (and of an output) */
    double keys; /* context positions summed over the sequences */
    kv_attn_batch ab;
} attn_batch_data;

static void attn_batch_free(attn_batch_data *o) {
    void *owned[] = {o->pg.k, o->pg.v, o->tab, o->pos, o->tabs, o->q};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
}

/* 0, or -1 when memory cannot be had (nothing left allocated). */
static int attn_batch_make(const attn_batch_shape *b, attn_batch_data *o) {
    const int ns = b->n_seqs, bs = b->block_size, hd = b->head_dim, mb = (b->ctx_hi + bs - 1) / bs;
    const long nblk = (long)ns * mb;
    *o = (attn_batch_data){.pg = {.dtype = b->dtype, .n_layers = b->layers, .n_kv_heads = b->n_kv_heads,
                                  .head_dim = hd, .block_size = bs, .n_blocks = (int)nblk}};
    kv_pages_set_sizes(&o->pg);
    o->pg.k = malloc(o->pg.layer_bytes * b->layers);
    o->pg.v = malloc(o->pg.layer_bytes * b->layers);
    o->tab = malloc(sizeof(int32_t) * (size_t)nblk);
    o->pos = malloc(sizeof(int32_t) * 3 * (size_t)ns);
    o->tabs = malloc(sizeof(*o->tabs) * (size_t)ns);
    o->qn = (size_t)ns * b->n_heads * hd;
    o->q = malloc(sizeof(float) * o->qn);
    float *row = malloc(sizeof(float) * (size_t)hd);
    if (!o->pg.k || !o->pg.v || !o->tab || !o->pos || !o->tabs || !o->q || !row) {
        free(row);
        attn_batch_free(o);
        return -1;
    }
    int32_t *seq = o->pos + ns, *slot = o->pos + 2 * ns;
    for (long i = 0; i < nblk; i++) o->tab[i] = b->shared ? (int32_t)(i % mb) : (int32_t)((i * 7919L) % nblk);
    srand(1);
    for (size_t r = 0; r < (size_t)nblk * bs * b->n_kv_heads * b->layers; r++) {
        for (int e = 0; e < hd; e++) row[e] = (float)rand() / RAND_MAX - 0.5f;
        kv_dtype_encode_row(b->dtype, row, o->pg.k + r * o->pg.row_bytes, hd);
        kv_dtype_encode_row(b->dtype, row, o->pg.v + r * o->pg.row_bytes, hd);
    }
    free(row);
    for (size_t e = 0; e < o->qn; e++) o->q[e] = 4.0f * ((float)rand() / RAND_MAX - 0.5f);
    for (int s = 0; s < ns; s++) {
        const int ctx = ns > 1 ? b->ctx_lo + (int)((long)(b->ctx_hi - b->ctx_lo) * s / (ns - 1)) : b->ctx_hi;
        o->tabs[s] = o->tab + (size_t)s * mb;
        o->pos[s] = ctx - 1;
        seq[s] = s;
        slot[s] = o->tabs[s][o->pos[s] / bs] * bs + o->pos[s] % bs;
        o->keys += ctx;
    }
    o->ab = (kv_attn_batch){.n_tokens = ns, .pos = o->pos, .seq = seq, .slot = slot, .n_seqs = ns, .tables = o->tabs};
    return 0;
}

#endif
