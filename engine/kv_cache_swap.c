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

/* Where layer l of block blk lives on the device: its pages, the block
 * (or local part) id and the byte offset; NULL when the block has no local
 * part for a local layer (released: nothing to move). */
static uint8_t *device_rows(kv_cache *c, int l, int blk, int v) {
    const kv_pages *pg = kvw_local(c, l) ? &c->lpages : &c->pages;
    const int id = kvw_local(c, l) ? c->lpart[blk] : blk;
    if (id < 0) return NULL;
    return (v ? pg->v : pg->k) + (size_t)c->lidx[l] * pg->layer_bytes + (size_t)id * c->blk_bytes;
}

/* Moves block blk's rows to swap block sid (to_host) or back. */
static void move_block(kv_cache *c, int sid, int blk, int to_host) {
    kv_backend *b = c->b;
    for (int l = 0; l < c->p.n_layers; l++) {
        if (kvw_local(c, l) && c->lpart[blk] < 0) continue;
        for (int v = 0; v < 2; v++) {
            if (c->p.no_storage) { /* charged, not copied */
                if (to_host && b->ops->download) b->ops->download(b, NULL, NULL, c->blk_bytes);
                if (!to_host && b->ops->upload) b->ops->upload(b, NULL, NULL, c->blk_bytes);
                continue;
            }
            uint8_t *dev = device_rows(c, l, blk, v), *host = swap_block(c, sid, l, v);
            if (to_host && b->ops->download)
                b->ops->download(b, host, dev, c->blk_bytes);
            else if (!to_host && b->ops->upload)
                b->ops->upload(b, dev, host, c->blk_bytes);
            else /* NOTE: a backend without download/upload keeps its buffers in host memory */
                memcpy(to_host ? host : dev, to_host ? dev : host, c->blk_bytes);
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
        /* (below the window floor a block's local part may be gone, or
         * someone else's: only its global layers travel) */
        if (c->swa && i < s->lfloor) {
            const int32_t part = c->lpart[blk];
            c->lpart[blk] = -1;
            move_block(c, sid, blk, 1);
            c->lpart[blk] = part;
        } else {
            move_block(c, sid, blk, 1);
        }
        if (i < s->n_hashed) /* the ids let swap_in find the block again if it survives */
            memcpy(c->swap_tokens + (size_t)sid * bs, c->tokens + (size_t)blk * bs, (size_t)bs * sizeof(int32_t));
        kvc_block_unref(c, blk);
        if (i >= s->lfloor) kvw_unneed(c, blk);
        s->blocks[i] = sid;
    }
    c->swapped_out += (uint64_t)s->n_blocks;
    s->swapped = 1;
    return 0;
}

/* Leading hashed blocks of a swapped sequence that are still registered on
 * the device (shared with others or cached). With out != NULL records ids;
 * *n_cached counts how many of them are CACHED (taking them shrinks the
 * evictable pool), *n_local how many of those hold a local part the
 * sequence needs (under sliding-window release; a block past the floor
 * that lost its part ends the match). */
static int swap_in_matches(const kv_cache *c, const kv_seq *s, int32_t *out, int *n_cached, int *n_local) {
    const int bs = c->p.block_size;
    int par = -1, k = 0, nc = 0, nl = 0;
    if (c->p.prefix_sharing) {
        for (; k < s->n_hashed; k++) {
            const int32_t *t = c->swap_tokens + (size_t)s->blocks[k] * bs;
            int b = kvc_index_find(c, s->hashes[k], par, kvc_gen_of(c, par), t);
            if (b < 0 || (c->swa && k >= s->lfloor && c->lpart[b] < 0)) break;
            if (c->ref[b] == 0) nc++;
            if (c->ref[b] == 0 && c->swa && k >= s->lfloor) nl++;
            if (out) out[k] = b;
            par = b;
        }
    }
    if (n_cached) *n_cached = nc;
    if (n_local) *n_local = nl;
    return k;
}

int kv_cache_seq_swap_in(kv_cache *c, kv_seq *s) {
    if (!c || !s || !s->swapped) return KV_ERR_INVAL;
    const int bs = c->p.block_size;
    int nc = 0, nl = 0;
    int k = swap_in_matches(c, s, NULL, &nc, &nl);
    int need = s->n_blocks - k;
    if (need > c->n_free + c->n_cached - nc) return KV_AGAIN;
    if (c->swa && s->n_blocks - KV_MAX(k, s->lfloor) + nl > kvw_available(c)) return KV_AGAIN;
    /* Blocks still on the device: reference them first so the allocations
     * below cannot evict them; no copy needed. */
    int par = -1;
    /* under sliding-window release the match can stop at a block that is
     * still registered but lost its local part: the copy brought back must
     * not be registered beside it (nor anything chained after it) */
    int cut = s->n_hashed;
    for (int i = 0; i < k; i++) {
        int sid = s->blocks[i];
        int b = kvc_index_find(c, s->hashes[i], par, kvc_gen_of(c, par), c->swap_tokens + (size_t)sid * bs);
        kvc_block_ref(c, b, s);
        if (i >= s->lfloor) kvw_need(c, b);
        else kvw_trim(c, b);
        s->blocks[i] = b;
        c->swap_free[c->n_swap_free++] = sid;
        par = b;
    }
    if (c->swa && k < cut && kvc_index_find(c, s->hashes[k], par, kvc_gen_of(c, par),
                                            c->swap_tokens + (size_t)s->blocks[k] * bs) >= 0)
        cut = k;
    for (int i = k; i < s->n_blocks; i++) {
        int sid = s->blocks[i];
        int b = kvc_block_alloc(c, s);
        if (i >= s->lfloor) kvw_need(c, b);
        else kvw_trim(c, b);
        move_block(c, sid, b, 0);
        if (i < cut && c->p.prefix_sharing)
            kvc_index_insert(c, b, s->hashes[i], i ? s->hashes[i - 1] : KV_HASH_ROOT, i ? s->blocks[i - 1] : -1,
                         c->swap_tokens + (size_t)sid * bs);
        else
            c->fill[b] = (uint16_t)KV_MAX(0, KV_MIN(bs, s->n_tokens - i * bs));
        s->blocks[i] = b;
        c->swap_free[c->n_swap_free++] = sid;
    }
    c->swapped_in += (uint64_t)need;
    s->n_hashed = cut;
    s->swapped = 0;
    kvc_seq_update_reserved(c, s);
    return 0;
}
