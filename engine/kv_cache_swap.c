/* kv_cache_swap.c - the block manager's host swap pool: a preempted
 * sequence's blocks copied to host memory through the backend and back,
 * registered blocks matched again on the way in. */
#include "kv_cache.h"
#include "kv_cache_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- swap ---- */

static uint8_t *swap_block(kv_cache *c, int sid, int layer, int v) {
    return c->swap + (((size_t)sid * c->p.n_layers + layer) * 2 + v) * c->blk_bytes;
}

static void copy_to_host(kv_cache *c, int sid, int blk) {
    kv_backend *b = c->b;
    for (int l = 0; c->p.no_storage && b->ops->download && l < c->p.n_layers; l++) { /* charged, not copied */
        b->ops->download(b, NULL, NULL, c->blk_bytes);
        b->ops->download(b, NULL, NULL, c->blk_bytes);
    }
    for (int l = 0; !c->p.no_storage && l < c->p.n_layers; l++) {
        size_t off = (size_t)l * c->pages.layer_bytes + (size_t)blk * c->blk_bytes;
        if (b->ops->download) {
            b->ops->download(b, swap_block(c, sid, l, 0), c->pages.k + off, c->blk_bytes);
            b->ops->download(b, swap_block(c, sid, l, 1), c->pages.v + off, c->blk_bytes);
        } else { /* NOTE: a backend without download keeps its buffers in host memory */
            memcpy(swap_block(c, sid, l, 0), c->pages.k + off, c->blk_bytes);
            memcpy(swap_block(c, sid, l, 1), c->pages.v + off, c->blk_bytes);
        }
    }
}

static void copy_to_device(kv_cache *c, int blk, int sid) {
    kv_backend *b = c->b;
    for (int l = 0; c->p.no_storage && b->ops->upload && l < c->p.n_layers; l++) {
        b->ops->upload(b, NULL, NULL, c->blk_bytes);
        b->ops->upload(b, NULL, NULL, c->blk_bytes);
    }
    for (int l = 0; !c->p.no_storage && l < c->p.n_layers; l++) {
        size_t off = (size_t)l * c->pages.layer_bytes + (size_t)blk * c->blk_bytes;
        if (b->ops->upload) {
            b->ops->upload(b, c->pages.k + off, swap_block(c, sid, l, 0), c->blk_bytes);
            b->ops->upload(b, c->pages.v + off, swap_block(c, sid, l, 1), c->blk_bytes);
        } else {
            memcpy(c->pages.k + off, swap_block(c, sid, l, 0), c->blk_bytes);
            memcpy(c->pages.v + off, swap_block(c, sid, l, 1), c->blk_bytes);
        }
    }
}

int kv_cache_seq_swap_out(kv_cache *c, kv_seq *s) {
    if (!c || !s || s->swapped) return KV_ERR_INVAL;
    if (s->n_blocks > c->n_swap_free) return KV_AGAIN;
    const int bs = c->p.block_size;
    for (int i = s->n_blocks - 1; i >= 0; i--) {
        int blk = s->blocks[i];
        int sid = c->swap_free[--c->n_swap_free];
        copy_to_host(c, sid, blk);
        if (i < s->n_hashed) /* the ids let swap_in find the block again if it survives */
            memcpy(c->swap_tokens + (size_t)sid * bs, c->tokens + (size_t)blk * bs, (size_t)bs * sizeof(int32_t));
        kvc_block_unref(c, blk);
        s->blocks[i] = sid;
    }
    c->swapped_out += (uint64_t)s->n_blocks;
    s->swapped = 1;
    return 0;
}

/* Leading hashed blocks of a swapped sequence that are still registered on
 * the device (shared with others or cached). With out != NULL records ids;
 * *n_cached counts how many of them are CACHED (taking them shrinks the
 * evictable pool). */
static int swap_in_matches(const kv_cache *c, const kv_seq *s, int32_t *out, int *n_cached) {
    const int bs = c->p.block_size;
    int par = -1, k = 0, nc = 0;
    if (c->p.prefix_sharing) {
        for (; k < s->n_hashed; k++) {
            const int32_t *t = c->swap_tokens + (size_t)s->blocks[k] * bs;
            int b = kvc_index_find(c, s->hashes[k], par, kvc_gen_of(c, par), t);
            if (b < 0) break;
            if (c->ref[b] == 0) nc++;
            if (out) out[k] = b;
            par = b;
        }
    }
    if (n_cached) *n_cached = nc;
    return k;
}

int kv_cache_seq_swap_in(kv_cache *c, kv_seq *s) {
    if (!c || !s || !s->swapped) return KV_ERR_INVAL;
    const int bs = c->p.block_size;
    int nc = 0;
    int k = swap_in_matches(c, s, NULL, &nc);
    int need = s->n_blocks - k;
    if (need > c->n_free + c->n_cached - nc) return KV_AGAIN;
    /* Blocks still on the device: reference them first so the allocations
     * below cannot evict them; no copy needed. */
    int par = -1;
    for (int i = 0; i < k; i++) {
        int sid = s->blocks[i];
        int b = kvc_index_find(c, s->hashes[i], par, kvc_gen_of(c, par), c->swap_tokens + (size_t)sid * bs);
        kvc_block_ref(c, b, s);
        s->blocks[i] = b;
        c->swap_free[c->n_swap_free++] = sid;
        par = b;
    }
    for (int i = k; i < s->n_blocks; i++) {
        int sid = s->blocks[i];
        int b = kvc_block_alloc(c, s);
        copy_to_device(c, b, sid);
        if (i < s->n_hashed && c->p.prefix_sharing)
            kvc_index_insert(c, b, s->hashes[i], i ? s->hashes[i - 1] : KV_HASH_ROOT, i ? s->blocks[i - 1] : -1,
                         c->swap_tokens + (size_t)sid * bs);
        else
            c->fill[b] = (uint16_t)KV_MAX(0, KV_MIN(bs, s->n_tokens - i * bs));
        s->blocks[i] = b;
        c->swap_free[c->n_swap_free++] = sid;
    }
    c->swapped_in += (uint64_t)need;
    s->swapped = 0;
    kvc_seq_update_reserved(c, s);
    return 0;
}
