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
};

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
