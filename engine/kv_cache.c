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

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/hash.h"
#include "../base/vec.h"

/* Root of every hash chain (the "parent hash" of a sequence's first block). */
#define KV_HASH_ROOT 0x6b76746f702d6b76ull

struct kv_cache {
    kv_cache_params p;
    kv_backend *b;            /* borrowed */
    kv_pages pages;           /* k, v from b->ops->alloc */
    size_t blk_bytes;         /* bytes of one block in one layer of K (or V): one contiguous range
                               * whatever the row order inside (backend.h), so copy-on-write and
                               * swap move whole blocks */

    /* per physical block, (n_blocks) each */
    int32_t *ref;             /* references from sequence tables */
    uint8_t *state;           /* kv_block_state */
    uint16_t *fill;           /* tokens written (block_size for registered blocks) */
    int32_t *owner, *owner_tag;
    uint64_t *last_use;       /* LRU clock value of the latest ref/unref */

    int32_t *free_stack;      /* (n_blocks) free block ids, top at n_free - 1 */
    int n_free;

    int32_t *lru_prev, *lru_next; /* doubly linked LRU list of CACHED blocks, -1 ends */
    int lru_head, lru_tail;       /* head = least recently used = next to evict */
    int n_cached;

    /* prefix index: registered (full, committed, immutable) blocks */
    uint8_t *registered;
    uint64_t *hash;           /* chain hash = H(parent hash, tokens) */
    uint64_t *parent_hash;    /* hash of the previous block of the chain (root for the first) */
    int32_t *parent;          /* previous block's physical id when registered, -1 for the first */
    uint32_t *parent_gen;     /* gen[parent] at registration: a re-used parent id never matches */
    uint32_t *gen;            /* bumped every time the block is evicted */
    int32_t *tokens;          /* (n_blocks, block_size) token ids of registered blocks */
    int32_t *hnext;           /* next block in the same bucket, -1 ends */
    int32_t *buckets;         /* (n_buckets) first block of each bucket, -1 if empty */
    uint64_t bucket_mask;     /* n_buckets - 1 (power of two) */
    uint64_t hash_mask;       /* bits of chain hashes kept (all but in collision tests) */
    int n_registered;

    int n_shared;             /* blocks with ref >= 2 */
    uint64_t clock;           /* LRU clock, ticks on every ref/unref */

    /* host swap pool */
    uint8_t *swap;            /* (n_swap_blocks, n_layers, 2 (K, V), blk_bytes) */
    int32_t *swap_free;       /* (n_swap_blocks) free swap ids */
    int n_swap_free;
    int32_t *swap_tokens;     /* (n_swap_blocks, block_size) token ids of swapped registered blocks */

    uint64_t lookups, hit_blocks, hit_tokens, evictions, cow_copies, swapped_out, swapped_in;
};

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
static uint64_t chain_hash(const kv_cache *c, uint64_t parent, const int32_t *t, int n) {
    uint64_t h = kv_hash_mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull + (h >> 29);
    return kv_hash_mix64(h ^ (uint64_t)n) & c->hash_mask;
}

/* Finds the registered block holding tokens t under parent block `par`
 * (-1: first block) whose generation is pg. -1 if none. */
static int index_find(const kv_cache *c, uint64_t h, int par, uint32_t pg, const int32_t *t) {
    const int bs = c->p.block_size;
    for (int b = c->buckets[h & c->bucket_mask]; b >= 0; b = c->hnext[b]) {
        if (c->hash[b] == h && c->parent[b] == par && c->parent_gen[b] == pg &&
            memcmp(c->tokens + (size_t)b * bs, t, (size_t)bs * sizeof(int32_t)) == 0)
            return b;
    }
    return -1;
}

static uint32_t gen_of(const kv_cache *c, int blk) { return blk >= 0 ? c->gen[blk] : 0; }

static void index_insert(kv_cache *c, int blk, uint64_t h, uint64_t ph, int par, const int32_t *t) {
    const int bs = c->p.block_size;
    c->registered[blk] = 1;
    c->hash[blk] = h;
    c->parent_hash[blk] = ph;
    c->parent[blk] = par;
    c->parent_gen[blk] = gen_of(c, par);
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
static void block_ref(kv_cache *c, int b, const kv_seq *s) {
    if (c->ref[b] == 0 && c->state[b] == KV_BLOCK_CACHED) lru_remove(c, b);
    c->state[b] = KV_BLOCK_USED;
    if (++c->ref[b] == 2) c->n_shared++;
    c->owner[b] = s->id;
    c->owner_tag[b] = s->tag;
    c->last_use[b] = ++c->clock;
}

/* Drops one reference; an unreferenced block becomes CACHED when it is
 * registered (kept for reuse), FREE otherwise. */
static void block_unref(kv_cache *c, int b) {
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
}

/* A block for s with one reference: from the free stack, else by evicting
 * the least recently used cached block. Callers check capacity first. */
static int block_alloc(kv_cache *c, const kv_seq *s) {
    int b;
    if (c->n_free > 0) {
        b = c->free_stack[--c->n_free];
    } else {
        b = c->lru_head;
        if (b < 0) return -1;
        lru_remove(c, b);
        index_remove(c, b);
        c->evictions++;
    }
    c->state[b] = KV_BLOCK_USED;
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
    }
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
    pg->dtype = p->dtype;
    pg->n_layers = p->n_layers;
    pg->n_kv_heads = p->n_kv_heads;
    pg->head_dim = p->head_dim;
    pg->block_size = bs;
    pg->n_blocks = nb;
    pg->row_bytes = kv_cache_row_bytes(p->dtype, p->head_dim);
    pg->slot_bytes = (size_t)p->n_kv_heads * pg->row_bytes;
    c->blk_bytes = (size_t)bs * pg->slot_bytes;
    uint64_t layer_bytes, total, swap_bytes;
    if (kv_mul_overflow((uint64_t)c->blk_bytes, (uint64_t)nb, &layer_bytes) ||
        kv_mul_overflow(layer_bytes, (uint64_t)p->n_layers, &total) || total > (uint64_t)SIZE_MAX ||
        kv_mul_overflow(kv_cache_block_bytes(p), (uint64_t)p->n_swap_blocks, &swap_bytes) ||
        swap_bytes > (uint64_t)SIZE_MAX) {
        kv_err_set(err, KV_ERR_INVAL, "kv cache: %d blocks of %zu bytes overflow the address space", nb,
                   c->blk_bytes);
        goto fail_nomsg;
    }
    pg->layer_bytes = (size_t)layer_bytes;
    pg->k = p->no_storage ? NULL : b->ops->alloc(b, (size_t)total);
    pg->v = pg->k ? b->ops->alloc(b, (size_t)total) : NULL;
    if (!p->no_storage && (!pg->k || !pg->v)) {
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
static void seq_update_reserved(const kv_cache *c, kv_seq *s) {
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
            for (int i = s->n_blocks - 1; i >= 0; i--) block_unref(c, s->blocks[i]);
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
        uint64_t h = chain_hash(c, ph, t, bs);
        int b = index_find(c, h, par, gen_of(c, par), t);
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

int kv_cache_match_prefix(const kv_cache *c, const int32_t *tokens, int n) {
    if (!c || !tokens || n <= 1 || !c->p.prefix_sharing) return 0;
    return reusable_tokens(match_blocks(c, tokens, n, INT_MAX, NULL, NULL), c->p.block_size, n);
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
    int n_tok = n > 1 ? reusable_tokens(match_blocks(c, tokens, n, INT_MAX, NULL, NULL), bs, n) : 0;
    int k = (n_tok + bs - 1) / bs;
    if (k > 0 && seq_grow(s, k)) return KV_ERR_NOMEM;
    c->lookups++;
    if (k == 0) return 0;
    match_blocks(c, tokens, n, k, s->blocks, s->hashes);
    for (int i = 0; i < k; i++) block_ref(c, s->blocks[i], s);
    s->n_blocks = k;
    s->n_tokens = n_tok;
    s->n_hashed = n_tok / bs;
    seq_update_reserved(c, s);
    c->hit_blocks += (uint64_t)k;
    c->hit_tokens += (uint64_t)n_tok;
    return n_tok;
}

/* ---- capacity ---- */

int kv_cache_n_available(const kv_cache *c) { return c ? c->n_free + c->n_cached : 0; }

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
    if (new_blocks + cow > c->n_free + c->n_cached) return KV_AGAIN;
    if (seq_grow(s, (int)nb_target)) return KV_ERR_NOMEM;
    /* From here on nothing can fail. */
    if (cow) {
        int idx = s->n_tokens / bs, src = s->blocks[idx];
        int dst = block_alloc(c, s);
        c->b->ops->copy_block(c->b, &c->pages, dst, src);
        c->fill[dst] = (uint16_t)(s->n_tokens % bs);
        s->blocks[idx] = dst;
        block_unref(c, src);
        c->cow_copies++;
    }
    for (int i = 0; i < new_blocks; i++) s->blocks[s->n_blocks++] = block_alloc(c, s);
    s->n_reserved = s->n_blocks * bs;
    return 0;
}

int kv_cache_blocks_to_admit(const kv_cache *c, const int32_t *tokens, int n, int n_slots, int *n_reused) {
    if (n_reused) *n_reused = 0;
    if (!c || n_slots <= 0) return 0;
    const int bs = c->p.block_size;
    int n_tok = 0, k = 0, taken = 0;
    if (c->p.prefix_sharing && tokens && n > 1) {
        n_tok = reusable_tokens(match_blocks(c, tokens, n, INT_MAX, NULL, NULL), bs, n);
        k = (n_tok + bs - 1) / bs;
        /* walk again to see which of the k blocks sit in the evictable pool */
        uint64_t ph = KV_HASH_ROOT;
        int par = -1;
        for (int i = 0; i < k; i++) {
            const int32_t *t = tokens + (size_t)i * bs;
            uint64_t h = chain_hash(c, ph, t, bs);
            int b = index_find(c, h, par, gen_of(c, par), t);
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
    if (!c->p.prefix_sharing || !tokens) return;
    const int full = n_total / bs;
    while (s->n_hashed < full) {
        int i = s->n_hashed;
        uint64_t ph = i ? s->hashes[i - 1] : KV_HASH_ROOT;
        int par = i ? s->blocks[i - 1] : -1;
        const int32_t *t = tokens + (size_t)i * bs;
        uint64_t h = chain_hash(c, ph, t, bs);
        int b = s->blocks[i];
        if (c->registered[b]) {
            /* already in the index (attached, or kept by a truncate): it must be
             * exactly this content, else stop registering this sequence */
            if (index_find(c, h, par, gen_of(c, par), t) != b) break;
        } else {
            int r = index_find(c, h, par, gen_of(c, par), t);
            if (r >= 0) {
                /* Same content computed twice (two sequences prefilling one prefix
                 * at once, or a recomputed last block): keep the registered copy,
                 * free ours. */
                block_ref(c, r, s);
                s->blocks[i] = r;
                block_unref(c, b);
            } else {
                index_insert(c, b, h, ph, par, t);
            }
        }
        s->hashes[i] = h;
        s->n_hashed = i + 1;
    }
    seq_update_reserved(c, s);
}

void kv_cache_seq_truncate(kv_cache *c, kv_seq *s, int n_tokens) {
    if (!c || !s || s->swapped) return;
    const int bs = c->p.block_size;
    int n = n_tokens < 0 ? 0 : n_tokens;
    if (n > s->n_blocks * bs) n = s->n_blocks * bs;
    int keep = (n + bs - 1) / bs;
    for (int i = s->n_blocks - 1; i >= keep; i--) block_unref(c, s->blocks[i]);
    s->n_blocks = keep;
    if (s->n_tokens > n) s->n_tokens = n;
    if (s->n_hashed > s->n_tokens / bs) s->n_hashed = s->n_tokens / bs;
    /* committed tokens per private block, for the block map */
    for (int i = s->n_tokens / bs; i < keep; i++) {
        int b = s->blocks[i];
        if (!c->registered[b] && c->ref[b] == 1) c->fill[b] = (uint16_t)KV_MAX(0, s->n_tokens - i * bs);
    }
    seq_update_reserved(c, s);
}

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
        block_unref(c, blk);
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
            int b = index_find(c, s->hashes[k], par, gen_of(c, par), t);
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
        int b = index_find(c, s->hashes[i], par, gen_of(c, par), c->swap_tokens + (size_t)sid * bs);
        block_ref(c, b, s);
        s->blocks[i] = b;
        c->swap_free[c->n_swap_free++] = sid;
        par = b;
    }
    for (int i = k; i < s->n_blocks; i++) {
        int sid = s->blocks[i];
        int b = block_alloc(c, s);
        copy_to_device(c, b, sid);
        if (i < s->n_hashed && c->p.prefix_sharing)
            index_insert(c, b, s->hashes[i], i ? s->hashes[i - 1] : KV_HASH_ROOT, i ? s->blocks[i - 1] : -1,
                         c->swap_tokens + (size_t)sid * bs);
        else
            c->fill[b] = (uint16_t)KV_MAX(0, KV_MIN(bs, s->n_tokens - i * bs));
        s->blocks[i] = b;
        c->swap_free[c->n_swap_free++] = sid;
    }
    c->swapped_in += (uint64_t)need;
    s->swapped = 0;
    seq_update_reserved(c, s);
    return 0;
}

int kv_cache_set_hash_bits(kv_cache *c, int bits) {
    if (!c || bits < 1 || bits > 64 || c->n_registered) return KV_ERR_INVAL;
    c->hash_mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    return 0;
}

/* ---- introspection ---- */

void kv_cache_get_stats(const kv_cache *c, kv_cache_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!c) return;
    out->n_blocks = c->p.n_blocks;
    out->n_free = c->n_free;
    out->n_cached = c->n_cached;
    out->n_used = c->p.n_blocks - c->n_free - c->n_cached;
    out->n_shared = c->n_shared;
    out->n_swap_blocks = c->p.n_swap_blocks;
    out->n_swap_used = c->p.n_swap_blocks - c->n_swap_free;
    out->lookups = c->lookups;
    out->hit_blocks = c->hit_blocks;
    out->hit_tokens = c->hit_tokens;
    out->evictions = c->evictions;
    out->cow_copies = c->cow_copies;
    out->swapped_out = c->swapped_out;
    out->swapped_in = c->swapped_in;
}

void kv_cache_block_map(const kv_cache *c, kv_block_info *out) {
    if (!c || !out) return;
    for (int i = 0; i < c->p.n_blocks; i++) {
        kv_block_info *o = &out[i];
        o->state = c->state[i];
        o->refcount = (uint16_t)KV_MIN(c->ref[i], 65535);
        o->fill = c->fill[i];
        o->owner = c->owner[i];
        o->owner_tag = c->owner_tag[i];
        o->last_use = c->last_use[i];
    }
}

static int check_fail(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int check_fail(char *msg, size_t cap, const char *fmt, ...) {
    if (msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return KV_ERR_INVAL;
}

#define FAIL(...)                                  \
    do {                                           \
        rc = check_fail(msg, cap, __VA_ARGS__);    \
        goto done;                                 \
    } while (0)

int kv_cache_check(const kv_cache *c, kv_seq *const *seqs, int n_seqs, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    if (!c) return check_fail(msg, cap, "no cache");
    const int nb = c->p.n_blocks, bs = c->p.block_size, nsw = c->p.n_swap_blocks;
    int rc = 0;
    int32_t *refs = calloc((size_t)nb, sizeof *refs);
    uint8_t *seen = calloc((size_t)nb, 1);
    uint8_t *swap_seen = calloc((size_t)(nsw > 0 ? nsw : 1), 1);
    if (!refs || !seen || !swap_seen) FAIL("check: out of memory");

    /* sequence tables */
    for (int q = 0; q < n_seqs; q++) {
        const kv_seq *s = seqs[q];
        if (!s) continue;
        if (s->n_blocks < 0 || s->n_blocks > s->cap) FAIL("seq %d: n_blocks %d, cap %d", s->id, s->n_blocks, s->cap);
        if (s->n_tokens < 0 || s->n_tokens > s->n_reserved || s->n_reserved > s->n_blocks * bs)
            FAIL("seq %d: n_tokens %d, n_reserved %d, %d blocks of %d", s->id, s->n_tokens, s->n_reserved,
                 s->n_blocks, bs);
        if (s->n_hashed < 0 || s->n_hashed > s->n_tokens / bs)
            FAIL("seq %d: %d hashed blocks but %d committed tokens", s->id, s->n_hashed, s->n_tokens);
        for (int i = 0; i < s->n_blocks; i++) {
            int b = s->blocks[i];
            if (s->swapped) {
                if (b < 0 || b >= nsw) FAIL("seq %d: swap block %d out of range", s->id, b);
                if (swap_seen[b]) FAIL("seq %d: swap block %d held twice", s->id, b);
                swap_seen[b] = 1;
                continue;
            }
            if (b < 0 || b >= nb) FAIL("seq %d: block[%d] = %d out of range", s->id, i, b);
            refs[b]++;
            if (i < s->n_hashed) {
                if (!c->registered[b] || c->hash[b] != s->hashes[i])
                    FAIL("seq %d: hashed block[%d] = %d is not registered with its hash", s->id, i, b);
                int par = i ? s->blocks[i - 1] : -1;
                if (c->parent[b] != par || c->parent_gen[b] != gen_of(c, par))
                    FAIL("seq %d: block[%d] = %d is not chained to block[%d]", s->id, i, b, i - 1);
            }
        }
        /* writable slots past n_tokens must be private */
        if (!s->swapped && s->n_reserved > s->n_tokens && s->n_tokens % bs) {
            int b = s->blocks[s->n_tokens / bs];
            if (c->registered[b] || refs[b] > 1 || c->ref[b] > 1)
                FAIL("seq %d: writable slots in shared or registered block %d", s->id, b);
        }
    }

    /* reference counts and states */
    int n_used = 0, n_shared = 0, n_reg = 0;
    for (int b = 0; b < nb; b++) {
        if (c->ref[b] != refs[b]) FAIL("block %d: refcount %d but %d table references", b, c->ref[b], refs[b]);
        if (c->ref[b] > 0) {
            if (c->state[b] != KV_BLOCK_USED) FAIL("block %d: referenced but state %d", b, c->state[b]);
            n_used++;
            if (c->ref[b] > 1) n_shared++;
        } else if (c->state[b] == KV_BLOCK_USED) {
            FAIL("block %d: state used with no reference", b);
        }
        if (c->registered[b]) n_reg++;
        if (c->state[b] == KV_BLOCK_CACHED && !c->registered[b]) FAIL("block %d: cached but not registered", b);
        if (c->state[b] == KV_BLOCK_FREE && c->registered[b]) FAIL("block %d: free but registered", b);
    }
    if (n_shared != c->n_shared) FAIL("n_shared %d, counted %d", c->n_shared, n_shared);
    if (n_reg != c->n_registered) FAIL("n_registered %d, counted %d", c->n_registered, n_reg);

    /* free stack */
    if (c->n_free < 0 || c->n_free > nb) FAIL("n_free %d", c->n_free);
    for (int i = 0; i < c->n_free; i++) {
        int b = c->free_stack[i];
        if (b < 0 || b >= nb) FAIL("free list: block %d out of range", b);
        if (seen[b]) FAIL("free list: block %d twice", b);
        seen[b] = 1;
        if (c->state[b] != KV_BLOCK_FREE || c->ref[b] != 0) FAIL("free list: block %d state %d ref %d", b,
                                                                  c->state[b], c->ref[b]);
    }
    /* LRU list: cached blocks in last-use order */
    int n_lru = 0, prev = -1;
    for (int b = c->lru_head; b >= 0; b = c->lru_next[b]) {
        if (b >= nb) FAIL("lru: block %d out of range", b);
        if (seen[b]) FAIL("lru: block %d also free or listed twice", b);
        seen[b] = 1;
        if (c->state[b] != KV_BLOCK_CACHED || c->ref[b] != 0) FAIL("lru: block %d state %d ref %d", b,
                                                                    c->state[b], c->ref[b]);
        if (c->lru_prev[b] != prev) FAIL("lru: block %d has a broken back link", b);
        if (prev >= 0 && c->last_use[prev] > c->last_use[b]) FAIL("lru: block %d out of LRU order", b);
        prev = b;
        if (++n_lru > nb) FAIL("lru: cycle");
    }
    if (prev != c->lru_tail) FAIL("lru: tail %d, walked to %d", c->lru_tail, prev);
    if (n_lru != c->n_cached) FAIL("lru: %d listed, n_cached %d", n_lru, c->n_cached);
    for (int b = 0; b < nb; b++) {
        if (c->state[b] == KV_BLOCK_USED) {
            if (seen[b]) FAIL("block %d: used and on a list", b);
        } else if (!seen[b]) {
            FAIL("block %d: state %d but on no list", b, c->state[b]);
        }
    }
    if (c->n_free + c->n_cached + n_used != nb)
        FAIL("free %d + cached %d + used %d != %d blocks", c->n_free, c->n_cached, n_used, nb);

    /* prefix index */
    int n_indexed = 0;
    for (uint64_t k = 0; k <= c->bucket_mask; k++) {
        for (int b = c->buckets[k]; b >= 0; b = c->hnext[b]) {
            if (b >= nb) FAIL("index: block %d out of range", b);
            if (++n_indexed > nb) FAIL("index: cycle");
            if (!c->registered[b]) FAIL("index: block %d not registered", b);
            if ((c->hash[b] & c->bucket_mask) != k) FAIL("index: block %d in the wrong bucket", b);
            if (c->fill[b] != bs) FAIL("index: block %d not full (%d)", b, c->fill[b]);
            if (chain_hash(c, c->parent_hash[b], c->tokens + (size_t)b * bs, bs) != c->hash[b])
                FAIL("index: block %d hash does not match its tokens", b);
            int par = c->parent[b];
            if (par >= nb) FAIL("index: block %d parent %d out of range", b, par);
            if (par < 0 && c->parent_hash[b] != KV_HASH_ROOT) FAIL("index: first block %d has a parent hash", b);
            if (par >= 0 && c->parent_gen[b] == c->gen[par] &&
                (!c->registered[par] || c->hash[par] != c->parent_hash[b]))
                FAIL("index: block %d parent %d hash mismatch", b, par);
            if (index_find(c, c->hash[b], par, c->parent_gen[b], c->tokens + (size_t)b * bs) != b)
                FAIL("index: block %d content registered twice", b);
        }
    }
    if (n_indexed != c->n_registered) FAIL("index: %d entries, %d registered", n_indexed, c->n_registered);

    /* swap pool */
    if (nsw > 0) {
        if (c->n_swap_free < 0 || c->n_swap_free > nsw) FAIL("swap: n_free %d", c->n_swap_free);
        for (int i = 0; i < c->n_swap_free; i++) {
            int sid = c->swap_free[i];
            if (sid < 0 || sid >= nsw) FAIL("swap: free id %d out of range", sid);
            if (swap_seen[sid]) FAIL("swap: block %d both free and held (or free twice)", sid);
            swap_seen[sid] = 1;
        }
        for (int i = 0; i < nsw; i++)
            if (!swap_seen[i]) FAIL("swap: block %d neither free nor held by a live sequence", i);
    }
done:
    free(refs);
    free(seen);
    free(swap_seen);
    return rc;
}
