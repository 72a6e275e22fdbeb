/* kv_cache_internal.h - the block manager's state, shared by its files:
 * kv_cache.c (blocks, sequences, prefix sharing, capacity, commit),
 * kv_cache_swap.c (the host swap pool) and kv_cache_check.c (statistics,
 * the block map and the invariant check). Not part of the interface. */
#ifndef KV_CACHE_INTERNAL_H
#define KV_CACHE_INTERNAL_H

#include "kv_cache.h"

#include <stdint.h>

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

    /* sliding-window release (kv_cache_window.c); swa 0: off, pages holds every layer */
    int swa;
    int n_global, n_local;    /* layers in pages / in lpages */
    uint8_t *is_local;        /* (n_layers) */
    int16_t *lidx;            /* (n_layers) a layer's index in its pages */
    kv_pages lpages;          /* (n_local layers, n_local_blocks parts) */
    int32_t *lpart;           /* (n_blocks) local part of each block, -1 none */
    int32_t *lneed;           /* (n_blocks) references at or past their sequence's lfloor */
    int32_t *lfree;           /* (n_local_blocks) free local parts */
    int n_lfree;
    int n_cached_l;           /* CACHED blocks holding a local part */
    uint64_t local_released, local_reclaimed;
};

/* ---- sliding-window release (kv_cache_window.c) ---- */

/* kv_cache_new's steps: the layer split (before the block pages are
 * sized) and the local pool (after). 0, or an error in err. */
int kv_window_setup(kv_cache *c, kv_err *err);
int kv_window_alloc(kv_cache *c, kv_err *err);
/* First block a sequence with n committed tokens still needs on local layers. */
int kvw_floor(const kv_cache *c, int n_tokens);
/* Gives block b a local part (the free pool, else one taken from the least
 * recently used cached block). Callers checked kvw_available. */
void kvw_attach_part(kv_cache *c, int b);
/* One more / one fewer reference that needs b's local part (unneed after
 * the reference's unref, so a last reference leaves the part cached); a
 * referenced block nobody needs any more loses its part. */
void kvw_need(kv_cache *c, int b);
void kvw_unneed(kv_cache *c, int b);
/* After b's state changed (ref / unref / alloc): keeps the count of
 * cached blocks holding a part and frees the part of a block that became
 * FREE. was_cached: b was CACHED before the change. */
void kvw_settle(kv_cache *c, int b, int was_cached);
/* Releases the part of a referenced block that no reference needs. */
void kvw_trim(kv_cache *c, int b);
/* Local parts available (free + held by cached blocks). */
int kvw_available(const kv_cache *c);
/* Moves s's floor to kvw_floor(n_tokens), releasing what it passes. */
void kvw_advance(kv_cache *c, kv_seq *s);
/* Tokens of a prefix match of k full blocks that attach may reuse when
 * every block the new sequence's window covers must have its local part. */
int kvw_match_tokens(const kv_cache *c, const int32_t *blocks, int k, int n);
/* Copies block src's local part into dst's (copy-on-write). */
void kvw_copy(kv_cache *c, int dst, int src);
/* Layers: 1 when layer l is local, and its index in its pages. */
static inline int kvw_local(const kv_cache *c, int l) { return c->swa && c->is_local[l]; }

/* Chain hash of one block of n tokens t under the parent chain hash. */
uint64_t kvc_chain_hash(const kv_cache *c, uint64_t parent, const int32_t *t, int n);
/* The registered block holding tokens t under parent block par (generation
 * pg) with chain hash h, or -1. */
int kvc_index_find(const kv_cache *c, uint64_t h, int par, uint32_t pg, const int32_t *t);
/* Registers full block blk (chain hash h, parent hash ph, parent block par)
 * holding tokens t in the prefix index. */
void kvc_index_insert(kv_cache *c, int blk, uint64_t h, uint64_t ph, int par, const int32_t *t);
/* Takes one reference on a USED or CACHED block for s. */
void kvc_block_ref(kv_cache *c, int b, const kv_seq *s);
/* Drops one reference; an unreferenced block becomes CACHED when it is
 * registered, else FREE. */
void kvc_block_unref(kv_cache *c, int b);
/* A block for s with one reference (free stack, else the LRU cached block
 * evicted), or -1 when none is left. */
int kvc_block_alloc(kv_cache *c, const kv_seq *s);
/* Recomputes s->n_reserved: slots writable without a copy. */
void kvc_seq_update_reserved(const kv_cache *c, kv_seq *s);

/* Generation of block blk (bumped on every eviction); 0 for -1. */
static inline uint32_t kvc_gen_of(const kv_cache *c, int blk) { return blk >= 0 ? c->gen[blk] : 0; }

#endif
