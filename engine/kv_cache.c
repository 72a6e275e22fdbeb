/* kv_cache.c - the paged KV cache's block manager: physical blocks with
 * reference counts, a free stack, an LRU list of unreferenced cached prefix
 * blocks, a content index over full blocks (hash chain + exact token and
 * parent check), copy-on-write, and a host swap pool. Host-side bookkeeping
 * only: K/V bytes live in backend memory and move through the backend ops.
 *
 * Block states: FREE (on the free stack), USED (referenced by at least one
 * sequence table), CACHED (unreferenced but registered in the prefix index,
 * on the LRU list, evictable). A block is registered when it is full and
 * committed; its content then never changes until it is evicted. */
#include "kv_cache.h"
#include "kv_cache_internal.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/hash.h"
#include "../base/vec.h"


/* ---- sizes ---- */

static int params_valid(const kv_cache_params *p, kv_err *err) {
    if (!p) return kv_err_set(err, KV_ERR_INVAL, "kv cache: no parameters");
    if (p->n_layers < 1 || p->n_layers > 4096)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: n_layers %d out of range [1, 4096]", p->n_layers);
    if (p->n_kv_heads < 1 || p->n_kv_heads > 4096)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: n_kv_heads %d out of range [1, 4096]", p->n_kv_heads);
    if (p->head_dim < 1 || p->head_dim > 4096)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: head_dim %d out of range [1, 4096]", p->head_dim);
    if ((int)p->dtype < 0 || p->dtype >= KV_CACHE_DTYPE_COUNT)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: unknown dtype %d", (int)p->dtype);
    if (p->block_size < 1 || p->block_size > 4096)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: block_size %d out of range [1, 4096]", p->block_size);
    if (p->n_blocks < 1 || p->n_blocks > INT32_MAX / p->block_size)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: n_blocks %d out of range [1, %d]", p->n_blocks,
                          INT32_MAX / p->block_size);
    if (p->n_swap_blocks < 0 || p->n_swap_blocks > INT32_MAX / p->block_size)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: n_swap_blocks %d out of range", p->n_swap_blocks);
    return 0;
}

uint64_t kv_cache_block_bytes(const kv_cache_params *p) {
    if (!p || p->n_layers < 1 || p->n_kv_heads < 1 || p->block_size < 1) return 0;
    uint64_t row = kv_cache_row_bytes(p->dtype, p->head_dim), r;
    if (!row) return 0;
    if (kv_mul_overflow(row, (uint64_t)p->n_kv_heads, &r) || kv_mul_overflow(r, (uint64_t)p->block_size, &r) ||
        kv_mul_overflow(r, (uint64_t)p->n_layers, &r) || kv_mul_overflow(r, 2, &r))
        return 0;
    return r;
}

int kv_cache_blocks_for_bytes(const kv_cache_params *p, uint64_t bytes) {
    uint64_t bb = kv_cache_block_bytes(p);
    if (!bb) return 0;
    uint64_t n = bytes / bb;
    uint64_t cap = (uint64_t)(INT32_MAX / p->block_size);
    return (int)(n > cap ? cap : n);
}

/* ---- hashing ---- */

/* Chain hash of one block: depends on every token of the prefix through
 * the parent hash. Collisions are harmless (lookups compare tokens and the
 * parent block), they only cost a comparison. */
uint64_t kvc_chain_hash(const kv_cache *c, uint64_t parent, const int32_t *t, int n) {
    uint64_t h = kv_hash_mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull + (h >> 29);
    return kv_hash_mix64(h ^ (uint64_t)n) & c->hash_mask;
}

/* Finds the registered block holding tokens t under parent block `par`
 * (-1: first block) whose generation is pg. -1 if none. */
int kvc_index_find(const kv_cache *c, uint64_t h, int par, uint32_t pg, const int32_t *t) {
    const int bs = c->p.block_size;
    for (int b = c->buckets[h & c->bucket_mask]; b >= 0; b = c->hnext[b]) {
        if (c->hash[b] == h && c->parent[b] == par && c->parent_gen[b] == pg &&
            memcmp(c->tokens + (size_t)b * bs, t, (size_t)bs * sizeof(int32_t)) == 0)
            return b;
    }
    return -1;
}


void kvc_index_insert(kv_cache *c, int blk, uint64_t h, uint64_t ph, int par, const int32_t *t) {
    const int bs = c->p.block_size;
    c->registered[blk] = 1;
    c->hash[blk] = h;
    c->parent_hash[blk] = ph;
    c->parent[blk] = par;
    c->parent_gen[blk] = kvc_gen_of(c, par);
    memcpy(c->tokens + (size_t)blk * bs, t, (size_t)bs * sizeof(int32_t));
    uint64_t bk = h & c->bucket_mask;
    c->hnext[blk] = c->buckets[bk];
    c->buckets[bk] = blk;
    c->fill[blk] = (uint16_t)bs;
    c->n_registered++;
}

static void index_remove(kv_cache *c, int blk) {
    int32_t *pp = &c->buckets[c->hash[blk] & c->bucket_mask];
    while (*pp >= 0 && *pp != blk) pp = &c->hnext[*pp];
    if (*pp == blk) *pp = c->hnext[blk];
    c->hnext[blk] = -1;
    c->registered[blk] = 0;
    c->gen[blk]++; /* children registered under this id can never match again */
    c->n_registered--;
}

/* ---- block lists ---- */

static void lru_append(kv_cache *c, int b) {
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0)
        c->lru_next[c->lru_tail] = b;
    else
        c->lru_head = b;
    c->lru_tail = b;
    c->n_cached++;
}

static void lru_remove(kv_cache *c, int b) {
    int pv = c->lru_prev[b], nx = c->lru_next[b];
    if (pv >= 0)
        c->lru_next[pv] = nx;
    else
        c->lru_head = nx;
    if (nx >= 0)
        c->lru_prev[nx] = pv;
    else
        c->lru_tail = pv;
    c->lru_prev[b] = c->lru_next[b] = -1;
    c->n_cached--;
}

/* Takes one reference on a USED or CACHED block for s. */
void kvc_block_ref(kv_cache *c, int b, const kv_seq *s) {
    const int was_cached = c->ref[b] == 0 && c->state[b] == KV_BLOCK_CACHED;
    if (was_cached) lru_remove(c, b);
    c->state[b] = KV_BLOCK_USED;
    kvw_settle(c, b, was_cached);
    if (++c->ref[b] == 2) c->n_shared++;
    c->owner[b] = s->id;
    c->owner_tag[b] = s->tag;
    c->last_use[b] = ++c->clock;
}

/* Drops one reference; an unreferenced block becomes CACHED when it is
 * registered (kept for reuse), FREE otherwise. */
void kvc_block_unref(kv_cache *c, int b) {
    if (--c->ref[b] == 1) c->n_shared--;
    c->last_use[b] = ++c->clock;
    if (c->ref[b] > 0) return;
    if (c->registered[b]) {
        c->state[b] = KV_BLOCK_CACHED;
        lru_append(c, b);
    } else {
        c->state[b] = KV_BLOCK_FREE;
        c->fill[b] = 0;
        c->owner[b] = -1;
        c->owner_tag[b] = -1;
        c->free_stack[c->n_free++] = b;
    }
    kvw_settle(c, b, 0);
}

/* A block for s with one reference: from the free stack, else by evicting
 * the least recently used cached block. Callers check capacity first. */
int kvc_block_alloc(kv_cache *c, const kv_seq *s) {
    int b, evicted = 0;
    if (c->n_free > 0) {
        b = c->free_stack[--c->n_free];
    } else {
        b = c->lru_head;
        if (b < 0) return -1;
        lru_remove(c, b);
        index_remove(c, b);
        c->evictions++;
        evicted = 1;
    }
    c->state[b] = KV_BLOCK_USED;
    kvw_settle(c, b, evicted); /* an evicted block's local part comes along (the caller needs or trims it) */
    c->ref[b] = 1;
    c->fill[b] = 0;
    c->owner[b] = s->id;
    c->owner_tag[b] = s->tag;
    c->last_use[b] = ++c->clock;
    return b;
}

/* ---- lifetime ---- */

void kv_cache_free(kv_cache *c) {
    if (!c) return;
    if (c->b && c->b->ops) {
        if (c->pages.k) c->b->ops->free(c->b, c->pages.k);
        if (c->pages.v) c->b->ops->free(c->b, c->pages.v);
        if (c->lpages.k) c->b->ops->free(c->b, c->lpages.k);
        if (c->lpages.v) c->b->ops->free(c->b, c->lpages.v);
    }
    free(c->is_local);
    free(c->lidx);
    free(c->lpart);
    free(c->lneed);
    free(c->lfree);
    free(c->ref);
    free(c->state);
    free(c->fill);
    free(c->owner);
    free(c->owner_tag);
    free(c->last_use);
    free(c->free_stack);
    free(c->lru_prev);
    free(c->lru_next);
    free(c->registered);
    free(c->hash);
    free(c->parent_hash);
    free(c->parent);
    free(c->parent_gen);
    free(c->gen);
    free(c->tokens);
    free(c->hnext);
    free(c->buckets);
    free(c->swap);
    free(c->swap_free);
    free(c->swap_tokens);
    free(c);
}

kv_cache *kv_cache_new(const kv_cache_params *p, kv_backend *b, kv_err *err) {
    if (params_valid(p, err)) return NULL;
    if (!b || !b->ops || !b->ops->alloc || !b->ops->free || !b->ops->copy_block) {
        kv_err_set(err, KV_ERR_INVAL, "kv cache: backend lacks alloc/free/copy_block");
        return NULL;
    }
    kv_cache *c = calloc(1, sizeof *c);
    if (!c) {
        kv_err_set(err, KV_ERR_NOMEM, "kv cache: out of memory");
        return NULL;
    }
    c->p = *p;
    c->b = b;
    const int nb = p->n_blocks, bs = p->block_size;
    kv_pages *pg = &c->pages;
    if (kv_window_setup(c, err)) goto fail_nomsg;
    pg->dtype = p->dtype;
    pg->n_layers = c->n_global;
    pg->n_kv_heads = p->n_kv_heads;
    pg->head_dim = p->head_dim;
    pg->block_size = bs;
    pg->n_blocks = nb;
    pg->row_bytes = kv_cache_row_bytes(p->dtype, p->head_dim);
    pg->slot_bytes = (size_t)p->n_kv_heads * pg->row_bytes;
    c->blk_bytes = (size_t)bs * pg->slot_bytes;
    uint64_t layer_bytes, total, swap_bytes;
    if (kv_mul_overflow((uint64_t)c->blk_bytes, (uint64_t)nb, &layer_bytes) ||
        kv_mul_overflow(layer_bytes, (uint64_t)c->n_global, &total) || total > (uint64_t)SIZE_MAX ||
        kv_mul_overflow(kv_cache_block_bytes(p), (uint64_t)p->n_swap_blocks, &swap_bytes) ||
        swap_bytes > (uint64_t)SIZE_MAX) {
        kv_err_set(err, KV_ERR_INVAL, "kv cache: %d blocks of %zu bytes overflow the address space", nb,
                   c->blk_bytes);
        goto fail_nomsg;
    }
    pg->layer_bytes = (size_t)layer_bytes;
    pg->k = p->no_storage || !total ? NULL : b->ops->alloc(b, (size_t)total);
    pg->v = pg->k ? b->ops->alloc(b, (size_t)total) : NULL;
    if (!p->no_storage && total && (!pg->k || !pg->v)) {
        kv_err_set(err, KV_ERR_NOMEM, "kv cache: backend '%s' cannot allocate 2 x %.1f MiB for %d blocks",
                   b->ops->name ? b->ops->name : "?", (double)total / (1024.0 * 1024.0), nb);
        goto fail_nomsg;
    }

    uint64_t nbk = 1;
    while (nbk < 2 * (uint64_t)nb) nbk <<= 1;
    c->bucket_mask = nbk - 1;
    c->ref = calloc((size_t)nb, sizeof *c->ref);
    c->state = calloc((size_t)nb, sizeof *c->state);
    c->fill = calloc((size_t)nb, sizeof *c->fill);
    c->owner = malloc((size_t)nb * sizeof *c->owner);
    c->owner_tag = malloc((size_t)nb * sizeof *c->owner_tag);
    c->last_use = calloc((size_t)nb, sizeof *c->last_use);
    c->free_stack = malloc((size_t)nb * sizeof *c->free_stack);
    c->lru_prev = malloc((size_t)nb * sizeof *c->lru_prev);
    c->lru_next = malloc((size_t)nb * sizeof *c->lru_next);
    c->registered = calloc((size_t)nb, sizeof *c->registered);
    c->hash = calloc((size_t)nb, sizeof *c->hash);
    c->parent_hash = calloc((size_t)nb, sizeof *c->parent_hash);
    c->parent = malloc((size_t)nb * sizeof *c->parent);
    c->parent_gen = calloc((size_t)nb, sizeof *c->parent_gen);
    c->gen = calloc((size_t)nb, sizeof *c->gen);
    c->tokens = calloc((size_t)nb * bs, sizeof *c->tokens);
    c->hnext = malloc((size_t)nb * sizeof *c->hnext);
    c->buckets = malloc((size_t)nbk * sizeof *c->buckets);
    if (!c->ref || !c->state || !c->fill || !c->owner || !c->owner_tag || !c->last_use || !c->free_stack ||
        !c->lru_prev || !c->lru_next || !c->registered || !c->hash || !c->parent_hash || !c->parent ||
        !c->parent_gen || !c->gen || !c->tokens || !c->hnext || !c->buckets)
        goto fail;
    if (p->n_swap_blocks > 0) {
        c->swap = p->no_storage ? NULL : malloc((size_t)swap_bytes);
        c->swap_free = malloc((size_t)p->n_swap_blocks * sizeof *c->swap_free);
        c->swap_tokens = calloc((size_t)p->n_swap_blocks * bs, sizeof *c->swap_tokens);
        if ((!c->swap && !p->no_storage) || !c->swap_free || !c->swap_tokens) {
            kv_err_set(err, KV_ERR_NOMEM, "kv cache: cannot allocate a host swap pool of %d blocks (%.1f MiB)",
                       p->n_swap_blocks, (double)swap_bytes / (1024.0 * 1024.0));
            goto fail_nomsg;
        }
        /* lowest ids on top so the pool fills from the front */
        for (int i = 0; i < p->n_swap_blocks; i++) c->swap_free[i] = p->n_swap_blocks - 1 - i;
        c->n_swap_free = p->n_swap_blocks;
    }
    for (int i = 0; i < nb; i++) {
        c->owner[i] = c->owner_tag[i] = -1;
        c->free_stack[i] = nb - 1 - i; /* block 0 is handed out first */
        c->lru_prev[i] = c->lru_next[i] = -1;
        c->parent[i] = -1;
        c->hnext[i] = -1;
    }
    for (uint64_t i = 0; i < nbk; i++) c->buckets[i] = -1;
    c->n_free = nb;
    c->lru_head = c->lru_tail = -1;
    c->hash_mask = ~0ull;
    if (kv_window_alloc(c, err)) goto fail_nomsg;
    return c;

fail:
    kv_err_set(err, KV_ERR_NOMEM, "kv cache: out of memory for the metadata of %d blocks", nb);
fail_nomsg:
    kv_cache_free(c);
    return NULL;
}

const kv_cache_params *kv_cache_params_of(const kv_cache *c) { return c ? &c->p : NULL; }
kv_pages *kv_cache_pages(kv_cache *c) { return c ? &c->pages : NULL; }

/* ---- sequences ---- */

void kv_seq_init(kv_seq *s, int id, int tag) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->id = id;
    s->tag = tag;
}

/* Grows s's arrays to hold `need` blocks. 0, or KV_ERR_NOMEM with s
 * unchanged in meaning (a grown blocks array is kept; cap only moves when
 * both grew). */
static int seq_grow(kv_seq *s, int need) {
    int cap_blocks = s->cap, cap_hashes = s->cap;
    if (kv_grow((void **)&s->blocks, &cap_blocks, need, sizeof *s->blocks) ||
        kv_grow((void **)&s->hashes, &cap_hashes, need, sizeof *s->hashes))
        return KV_ERR_NOMEM;
    s->cap = cap_blocks; /* == cap_hashes: both grew from the same capacity */
    return 0;
}

/* 1 when the block holding position s->n_tokens is full of someone else's
 * (or registered, hence immutable) data, so writing there needs a copy. */
static int seq_needs_cow(const kv_cache *c, const kv_seq *s) {
    const int bs = c->p.block_size;
    if (s->n_tokens % bs == 0 || s->n_tokens / bs >= s->n_blocks) return 0;
    int b = s->blocks[s->n_tokens / bs];
    return c->ref[b] > 1 || c->registered[b];
}

/* n_reserved: slots writable without a copy. When the partial last block is
 * shared or registered nothing past n_tokens is writable until reserve()
 * copied it. */
void kvc_seq_update_reserved(const kv_cache *c, kv_seq *s) {
    s->n_reserved = seq_needs_cow(c, s) ? s->n_tokens : s->n_blocks * c->p.block_size;
}

void kv_cache_seq_release(kv_cache *c, kv_seq *s) {
    if (!s) return;
    if (c) {
        if (s->swapped) {
            for (int i = 0; i < s->n_blocks; i++) c->swap_free[c->n_swap_free++] = s->blocks[i];
        } else {
            /* Tail first, so the head of a prefix is the most recently used and a
             * chain is evicted from its end (a child before its parent). */
            for (int i = s->n_blocks - 1; i >= 0; i--) {
                kvc_block_unref(c, s->blocks[i]);
                if (i >= s->lfloor) kvw_unneed(c, s->blocks[i]);
            }
        }
    }
    free(s->blocks);
    free(s->hashes);
    int id = s->id, tag = s->tag;
    kv_seq_init(s, id, tag);
}

/* ---- prefix sharing ---- */

/* Walks the index along tokens[0..n) and returns how many leading full
 * blocks are registered (at most max_blocks). With out != NULL records
 * their ids and hashes. */
static int match_blocks(const kv_cache *c, const int32_t *tokens, int n, int max_blocks, int32_t *out_blocks,
                        uint64_t *out_hashes) {
    const int bs = c->p.block_size;
    int nfull = n / bs;
    if (nfull > max_blocks) nfull = max_blocks;
    uint64_t ph = KV_HASH_ROOT;
    int par = -1, k = 0;
    for (; k < nfull; k++) {
        const int32_t *t = tokens + (size_t)k * bs;
        uint64_t h = kvc_chain_hash(c, ph, t, bs);
        int b = kvc_index_find(c, h, par, kvc_gen_of(c, par), t);
        if (b < 0) break;
        if (out_blocks) out_blocks[k] = b;
        if (out_hashes) out_hashes[k] = h;
        ph = h;
        par = b;
    }
    return k;
}

/* Tokens attach would reuse: every matching full block, but at most n - 1
 * tokens so the last prompt token is computed (its logits are needed). */
static int reusable_tokens(int k_blocks, int bs, int n) {
    int64_t t = (int64_t)k_blocks * bs;
    if (t > n - 1) t = n - 1;
    return t > 0 ? (int)t : 0;
}

/* The tokens attach reuses: reusable_tokens of the match, shortened under
 * sliding-window release until every block the new sequence's window
 * covers still has its local part. */
static int match_tokens(const kv_cache *c, const int32_t *tokens, int n) {
    if (!c->swa) return reusable_tokens(match_blocks(c, tokens, n, INT_MAX, NULL, NULL), c->p.block_size, n);
    int32_t *blocks = malloc(((size_t)n / (size_t)c->p.block_size + 1) * sizeof *blocks);
    if (!blocks) return 0; /* (no reuse: always safe) */
    int k = match_blocks(c, tokens, n, INT_MAX, blocks, NULL);
    int t = kvw_match_tokens(c, blocks, k, n);
    free(blocks);
    return t;
}

int kv_cache_match_registered(const kv_cache *c, const int32_t *tokens, int n) {
    if (!c || !tokens || n <= 1 || !c->p.prefix_sharing) return 0;
    return reusable_tokens(match_blocks(c, tokens, n, INT_MAX, NULL, NULL), c->p.block_size, n);
}

int kv_cache_match_prefix(const kv_cache *c, const int32_t *tokens, int n) {
    if (!c || !tokens || n <= 1 || !c->p.prefix_sharing) return 0;
    return match_tokens(c, tokens, n);
}

/* NOTE: when the whole prompt sits in cached full blocks, the last block is
 * attached too and n_tokens = n - 1: recomputing the last token then copies
 * that block on write (one block copy instead of recomputing block_size - 1
 * tokens), and the commit that fills it finds the cached original again and
 * swaps back to it, dropping the copy. */
int kv_cache_seq_attach_prefix(kv_cache *c, kv_seq *s, const int32_t *tokens, int n) {
    if (!c || !s || n < 0 || (n > 0 && !tokens)) return KV_ERR_INVAL;
    if (s->n_blocks || s->n_tokens || s->swapped) return KV_ERR_INVAL;
    if (!c->p.prefix_sharing) return 0;
    const int bs = c->p.block_size;
    int n_tok = n > 1 ? match_tokens(c, tokens, n) : 0;
    int k = (n_tok + bs - 1) / bs;
    if (k > 0 && seq_grow(s, k)) return KV_ERR_NOMEM;
    c->lookups++;
    if (k == 0) return 0;
    match_blocks(c, tokens, n, k, s->blocks, s->hashes);
    const int floor = c->swa ? KV_MIN(kvw_floor(c, n_tok), k) : 0;
    for (int i = 0; i < k; i++) {
        kvc_block_ref(c, s->blocks[i], s);
        if (i >= floor) kvw_need(c, s->blocks[i]); /* (match_tokens made sure it has its part) */
        else kvw_trim(c, s->blocks[i]);
    }
    s->lfloor = floor;
    s->n_blocks = k;
    s->n_tokens = n_tok;
    s->n_hashed = n_tok / bs;
    kvc_seq_update_reserved(c, s);
    c->hit_blocks += (uint64_t)k;
    c->hit_tokens += (uint64_t)n_tok;
    return n_tok;
}

/* ---- capacity ---- */

int kv_cache_n_available(const kv_cache *c) {
    if (!c) return 0;
    /* every new block takes one of each pool */
    return c->swa ? KV_MIN(c->n_free + c->n_cached, kvw_available(c)) : c->n_free + c->n_cached;
}

int kv_cache_blocks_needed(const kv_cache *c, const kv_seq *s, int n_new) {
    if (!c || !s || n_new <= 0) return 0;
    const int bs = c->p.block_size;
    if (s->swapped) {
        int64_t t = (int64_t)s->n_tokens + n_new;
        int64_t nb = (t + bs - 1) / bs;
        return (int)KV_MIN(nb > s->n_blocks ? nb : s->n_blocks, (int64_t)INT_MAX);
    }
    int64_t target = (int64_t)s->n_tokens + n_new;
    if (target <= s->n_reserved) return 0;
    int64_t need = (target + bs - 1) / bs - s->n_blocks;
    if (need < 0) need = 0;
    need += seq_needs_cow(c, s);
    return (int)KV_MIN(need, (int64_t)INT_MAX);
}

int kv_cache_seq_reserve(kv_cache *c, kv_seq *s, int n_new) {
    if (!c || !s || n_new < 0 || s->swapped) return KV_ERR_INVAL;
    const int bs = c->p.block_size;
    int64_t target = (int64_t)s->n_tokens + n_new;
    if (target <= s->n_reserved) return 0;
    int64_t nb_target = (target + bs - 1) / bs;
    if (nb_target > c->p.n_blocks) return KV_ERR_RANGE; /* can never fit: no waiting helps */
    int cow = seq_needs_cow(c, s);
    int new_blocks = nb_target > s->n_blocks ? (int)nb_target - s->n_blocks : 0;
    if (new_blocks + cow > kv_cache_n_available(c)) return KV_AGAIN;
    if (seq_grow(s, (int)nb_target)) return KV_ERR_NOMEM;
    /* From here on nothing can fail. */
    if (cow) {
        int idx = s->n_tokens / bs, src = s->blocks[idx];
        int dst = kvc_block_alloc(c, s);
        if (c->n_global || !c->swa) c->b->ops->copy_block(c->b, &c->pages, dst, src);
        if (idx >= s->lfloor) {
            kvw_need(c, dst);
            kvw_copy(c, dst, src);
        } else {
            kvw_trim(c, dst);
        }
        c->fill[dst] = (uint16_t)(s->n_tokens % bs);
        s->blocks[idx] = dst;
        kvc_block_unref(c, src);
        if (idx >= s->lfloor) kvw_unneed(c, src);
        c->cow_copies++;
    }
    for (int i = 0; i < new_blocks; i++) {
        int b = kvc_block_alloc(c, s);
        kvw_need(c, b); /* new blocks lie past the floor */
        s->blocks[s->n_blocks++] = b;
    }
    s->n_reserved = s->n_blocks * bs;
    return 0;
}

int kv_cache_blocks_to_admit(const kv_cache *c, const int32_t *tokens, int n, int n_slots, int *n_reused) {
    if (n_reused) *n_reused = 0;
    if (!c || n_slots <= 0) return 0;
    const int bs = c->p.block_size;
    int n_tok = 0, k = 0, taken = 0;
    if (c->p.prefix_sharing && tokens && n > 1) {
        n_tok = match_tokens(c, tokens, n);
        k = (n_tok + bs - 1) / bs;
        /* walk again to see which of the k blocks sit in the evictable pool */
        uint64_t ph = KV_HASH_ROOT;
        int par = -1;
        for (int i = 0; i < k; i++) {
            const int32_t *t = tokens + (size_t)i * bs;
            uint64_t h = kvc_chain_hash(c, ph, t, bs);
            int b = kvc_index_find(c, h, par, kvc_gen_of(c, par), t);
            if (c->ref[b] == 0) taken++;
            ph = h;
            par = b;
        }
    }
    if (n_reused) *n_reused = n_tok;
    int64_t need = ((int64_t)n_slots + bs - 1) / bs - k;
    if (need < 0) need = 0;
    if (n_tok % bs && n_slots > n_tok) need++; /* the fully cached last block is copied on write */
    need += taken;
    return (int)KV_MIN(need, (int64_t)INT_MAX);
}

int32_t kv_cache_slot(const kv_cache *c, const kv_seq *s, int pos) {
    if (!c || !s || s->swapped || pos < 0) return -1;
    const int bs = c->p.block_size;
    if (pos / bs >= s->n_blocks) return -1;
    return s->blocks[pos / bs] * bs + pos % bs;
}

/* ---- commit / truncate ---- */

void kv_cache_seq_commit(kv_cache *c, kv_seq *s, const int32_t *tokens, int n_total) {
    if (!c || !s || s->swapped || n_total < s->n_tokens || n_total > s->n_reserved) return;
    const int bs = c->p.block_size;
    for (int i = s->n_tokens / bs; i < s->n_blocks && (int64_t)i * bs < n_total; i++) {
        int b = s->blocks[i];
        if (!c->registered[b]) c->fill[b] = (uint16_t)KV_MIN(bs, n_total - i * bs);
    }
    s->n_tokens = n_total;
    if (!c->p.prefix_sharing || !tokens) {
        kvw_advance(c, s);
        return;
    }
    const int full = n_total / bs;
    while (s->n_hashed < full) {
        int i = s->n_hashed;
        uint64_t ph = i ? s->hashes[i - 1] : KV_HASH_ROOT;
        int par = i ? s->blocks[i - 1] : -1;
        const int32_t *t = tokens + (size_t)i * bs;
        uint64_t h = kvc_chain_hash(c, ph, t, bs);
        int b = s->blocks[i];
        if (c->registered[b]) {
            /* already in the index (attached, or kept by a truncate): it must be
             * exactly this content, else stop registering this sequence */
            if (kvc_index_find(c, h, par, kvc_gen_of(c, par), t) != b) break;
        } else {
            int r = kvc_index_find(c, h, par, kvc_gen_of(c, par), t);
            const int need_l = c->swa && i >= s->lfloor;
            if (r >= 0 && need_l && c->lpart[r] < 0) break; /* the copy lost its local part: keep ours, unregistered */
            if (r >= 0) {
                /* Same content computed twice (two sequences prefilling one prefix
                 * at once, or a recomputed last block): keep the registered copy,
                 * free ours. */
                kvc_block_ref(c, r, s);
                if (need_l) kvw_need(c, r);
                else kvw_trim(c, r);
                s->blocks[i] = r;
                kvc_block_unref(c, b);
                if (need_l) kvw_unneed(c, b);
            } else {
                kvc_index_insert(c, b, h, ph, par, t);
            }
        }
        s->hashes[i] = h;
        s->n_hashed = i + 1;
    }
    kvw_advance(c, s);
    kvc_seq_update_reserved(c, s);
}

void kv_cache_seq_truncate(kv_cache *c, kv_seq *s, int n_tokens) {
    if (!c || !s || s->swapped) return;
    const int bs = c->p.block_size;
    int n = n_tokens < 0 ? 0 : n_tokens;
    if (n > s->n_blocks * bs) n = s->n_blocks * bs;
    int keep = (n + bs - 1) / bs;
    for (int i = s->n_blocks - 1; i >= keep; i--) {
        kvc_block_unref(c, s->blocks[i]);
        if (i >= s->lfloor) kvw_unneed(c, s->blocks[i]);
    }
    s->n_blocks = keep;
    /* NOTE: the floor never moves back. The engine truncates only
     * uncommitted slots (rejected drafts), which never moved it; cutting
     * committed tokens below the floor would leave the window reading
     * released parts (kv_cache_check reports it). */
    if (s->lfloor > keep) s->lfloor = keep;
    if (s->n_tokens > n) s->n_tokens = n;
    if (s->n_hashed > s->n_tokens / bs) s->n_hashed = s->n_tokens / bs;
    /* committed tokens per private block, for the block map */
    for (int i = s->n_tokens / bs; i < keep; i++) {
        int b = s->blocks[i];
        if (!c->registered[b] && c->ref[b] == 1) c->fill[b] = (uint16_t)KV_MAX(0, s->n_tokens - i * bs);
    }
    kvc_seq_update_reserved(c, s);
}

int kv_cache_set_hash_bits(kv_cache *c, int bits) {
    if (!c || bits < 1 || bits > 64 || c->n_registered) return KV_ERR_INVAL;
    c->hash_mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    return 0;
}
