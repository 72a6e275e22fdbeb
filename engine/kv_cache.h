/* kv_cache.h - the paged KV cache's block manager: a pool of fixed-size
 * blocks for K and V of every layer, a block table per sequence (logical
 * block -> physical block, like a page table), reference counts, a free
 * list, prefix sharing through a hash chain over full blocks, copy-on-write,
 * LRU eviction of unreferenced cached blocks, and a host swap pool.
 *
 * Contract: every call that allocates checks capacity first and, when it
 * cannot complete, returns KV_AGAIN with nothing changed. Not thread-safe:
 * the engine thread owns it. */
#ifndef KV_KV_CACHE_H
#define KV_KV_CACHE_H

#include <stdint.h>

#include "../base/common.h"
#include "../kernels/backend.h"

typedef struct kv_cache kv_cache;

typedef struct kv_cache_params {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    kv_cache_dtype dtype;
    int block_size;      /* tokens per block */
    int n_blocks;        /* physical blocks on the device */
    int prefix_sharing;  /* bool: index full blocks by content and reuse them */
    int n_swap_blocks;   /* blocks in the host swap pool (0 = no swap) */
    int no_storage;      /* bool: blocks are bookkeeping only (a synthetic model): no K/V pages or
                            swap pool are allocated; copies and swaps still go through the
                            backend's copy_block / download / upload with NULL buffers, so a sim
                            backend charges them */
    /* Sliding-window release (kv_cache_window.c). With window > 0 and some
     * layer marked local, the local (sliding-window) layers' K/V live in a
     * pool of their own, "local parts" attached to blocks: a block has one
     * while a sequence holding it may still attend to it on a local layer,
     * and loses it once it lies wholly before the window of every sequence
     * that holds it (cached blocks keep theirs until the local pool needs
     * it). The global layers' K/V stay in the block pool. */
    int window;                  /* tokens a local-layer query sees (p sees positions > p - window) */
    const uint8_t *local_layers; /* (n_layers) 1: a local layer; borrowed (copied by kv_cache_new); NULL: none */
    int n_local_blocks;          /* local parts in the local pool, 1..n_blocks; 0: n_blocks */
} kv_cache_params;

/* Bytes one block takes (K and V, all layers). */
uint64_t kv_cache_block_bytes(const kv_cache_params *p);
/* With sliding-window release: the bytes of a block's global-layer part
 * and of one local part (K and V); both pools' bytes; and the local parts
 * a plan gives n_seqs sequences of up to max_len tokens (one whole
 * sequence's blocks, as admission reserves a prompt at once, plus each
 * other sequence's window and the block being filled), at most n_blocks.
 * Without release: global = kv_cache_block_bytes, local = 0, pool =
 * n_blocks blocks. */
uint64_t kv_cache_global_part_bytes(const kv_cache_params *p);
uint64_t kv_cache_local_part_bytes(const kv_cache_params *p);
uint64_t kv_cache_pool_bytes(const kv_cache_params *p);
int kv_cache_plan_local_blocks(const kv_cache_params *p, int n_seqs, int max_len);
/* Sizes p's pools: n_blocks > 0 fixes the block count (the local pool then
 * gets the plan's parts), else both come from `bytes`: the local pool the
 * plan's parts, the block pool what that leaves in global parts (when the
 * plan does not fit, every block keeps its part, as without release).
 * Sets p->n_blocks and p->n_local_blocks and returns n_blocks (0: not one
 * block fits). */
int kv_cache_size_pools(kv_cache_params *p, uint64_t bytes, int n_blocks, int n_seqs, int max_len);
/* What fits, run through the block manager itself (bookkeeping only, on
 * backend b, which allocates nothing here): sequences of n_tokens tokens
 * admitted one after another as the scheduler does (the prompt reserved
 * whole, then committed in chunks of `chunk`), all resident at once, until
 * one no longer fits or max_seqs did. Returns how many fit (or
 * KV_ERR_INVAL); *seq_bytes (may be NULL) gets what the first one holds. */
int kv_cache_fit_sequences(const kv_cache_params *p, kv_backend *b, int n_tokens, int chunk, int max_seqs,
                           uint64_t *seq_bytes);
/* 1 when p releases local-layer storage (window > 0 and a local layer). */
int kv_cache_params_windowed(const kv_cache_params *p);
/* Blocks that fit in `bytes` (0 if not even one). */
int kv_cache_blocks_for_bytes(const kv_cache_params *p, uint64_t bytes);

/* A sequence's block table. Plain data owned by the caller (the scheduler's
 * request); its blocks are references into the cache and must be released
 * with kv_cache_seq_release (or swapped out) before the table is dropped. */
typedef struct kv_seq {
    int32_t *blocks;     /* (cap) logical block i -> physical block id (or swap block id when swapped) */
    int n_blocks;        /* blocks in the table */
    int cap;             /* allocated entries of blocks/hashes */
    int n_tokens;        /* tokens whose K/V are committed (computed and verified) */
    int n_reserved;      /* positions < n_reserved have a slot that may be written:
                            n_blocks * block_size, or n_tokens while the block holding
                            position n_tokens is shared or registered (reserve copies it) */
    uint64_t *hashes;    /* (cap) hash chain value of each full committed block */
    int n_hashed;        /* leading blocks whose hashes are registered */
    int swapped;         /* bool: blocks[] hold swap-pool ids */
    int lfloor;          /* sliding-window release: blocks [0, lfloor) lie wholly before the window
                            of this sequence's next query; it no longer needs their local parts */
    int id;              /* owner id shown in the block map (request id) */
    int tag;             /* owner tag (TUI session) */
} kv_seq;

kv_cache *kv_cache_new(const kv_cache_params *p, kv_backend *b, kv_err *err);
void kv_cache_free(kv_cache *c); /* NULL is a no-op */
const kv_cache_params *kv_cache_params_of(const kv_cache *c);
kv_pages *kv_cache_pages(kv_cache *c); /* borrowed; for the forward pass */

/* Sequences. init sets an empty table; release drops every reference
 * (full hashed blocks stay cached for reuse until evicted) and frees the
 * table's arrays. */
void kv_seq_init(kv_seq *s, int id, int tag);
void kv_cache_seq_release(kv_cache *c, kv_seq *s);

/* Prefix sharing. match: how many leading tokens of tokens[0..n) are held
 * by cached full blocks (a query: no side effects, counts nothing). At most
 * n - 1 tokens are reported so at least one token is computed. attach:
 * takes references on those blocks for an empty sequence and sets its
 * n_tokens; returns the tokens reused (counted in the hit statistics), or
 * KV_ERR_INVAL (sequence not empty) / KV_ERR_NOMEM with nothing changed.
 * When all n tokens sit in cached blocks, every block is attached and
 * n_tokens = n - 1: the reserve for the last token copies the last block
 * (copy-on-write) and the commit that fills it swaps back to the cached
 * original. Blocks match by hash AND by their exact token ids and parent
 * block, so a hash collision can never share the wrong K/V. */
int kv_cache_match_prefix(const kv_cache *c, const int32_t *tokens, int n);
/* Like match_prefix, but every registered block counts, also one whose
 * local part sliding-window release took (for checks: what the index
 * holds, not what attach may reuse). */
int kv_cache_match_registered(const kv_cache *c, const int32_t *tokens, int n);
int kv_cache_seq_attach_prefix(kv_cache *c, kv_seq *s, const int32_t *tokens, int n);

/* Capacity. blocks_needed: blocks that reserve(s, n_new) would take from the
 * pool (new blocks plus a copy-on-write of a shared partial last block; for
 * a swapped sequence, the blocks it would hold after swap-in and reserve).
 * n_available: free blocks plus evictable cached blocks (under sliding-window
 * release at most the local parts free or held by cached blocks: a new
 * block takes one of each). reserve: makes
 * room for n_new more tokens after s->n_tokens (allocating, evicting LRU
 * cached blocks, copying a shared last block first); KV_AGAIN and no change
 * when the pool cannot supply it now, KV_ERR_RANGE (no change) when the
 * sequence would need more blocks than the whole pool, KV_ERR_INVAL for a
 * swapped sequence or n_new < 0. */
int kv_cache_blocks_needed(const kv_cache *c, const kv_seq *s, int n_new);
int kv_cache_n_available(const kv_cache *c);
int kv_cache_seq_reserve(kv_cache *c, kv_seq *s, int n_new);

/* Admission planning for a new sequence with prompt tokens[0..n) (a query,
 * no side effects): the blocks that attach_prefix followed by reserving
 * slots for positions [0, n_slots) would take out of kv_cache_n_available()
 * -- new blocks, the copy of a fully cached last block, and the cached
 * blocks attaching removes from the evictable pool. Both succeed exactly
 * when the result is <= kv_cache_n_available() (under sliding-window
 * release: they succeed when it is; the local pool may allow more).
 * *n_reused (may be NULL) gets what attach would return. */
int kv_cache_blocks_to_admit(const kv_cache *c, const int32_t *tokens, int n, int n_slots,
                             int *n_reused /* OUT: may be NULL */);

/* Physical slot (block * block_size + offset) of position pos of s. */
int32_t kv_cache_slot(const kv_cache *c, const kv_seq *s, int pos);
/* Sliding-window release: the local pool's pages (NULL without release),
 * the slot of position pos in them (-1 when its block has no local part),
 * and s's table into them: out[i] = local part of block i, -1 below the
 * window (n = s->n_blocks entries). */
kv_pages *kv_cache_local_pages(kv_cache *c);
int32_t kv_cache_local_slot(const kv_cache *c, const kv_seq *s, int pos);
void kv_cache_local_table(const kv_cache *c, const kv_seq *s, int32_t *out /* OUT: (s->n_blocks) */);

/* After the forward wrote K/V for positions [s->n_tokens, n_total): marks
 * them committed and, with prefix sharing on, registers every newly full
 * block in the hash index (tokens holds the sequence's first n_total ids). */
void kv_cache_seq_commit(kv_cache *c, kv_seq *s, const int32_t *tokens, int n_total);
/* Drops uncommitted or rejected positions: keeps n_tokens tokens, frees the
 * blocks past them (speculative rollback, preemption by recompute uses
 * release instead). Never modifies registered (hashed) blocks: dropped ones
 * stay cached, and one cut in the middle is copied before it is written. */
void kv_cache_seq_truncate(kv_cache *c, kv_seq *s, int n_tokens);

/* Swap to / from the host pool. swap_out moves every block of s to the host
 * pool and frees the device blocks (KV_AGAIN if the pool lacks room);
 * swap_in does the reverse (KV_AGAIN if the device lacks blocks). Leading
 * prefix blocks still registered on the device (shared, or cached and not
 * yet evicted) are referenced again instead of copied back. Both return
 * KV_ERR_INVAL for a sequence in the wrong state. */
int kv_cache_seq_swap_out(kv_cache *c, kv_seq *s);
int kv_cache_seq_swap_in(kv_cache *c, kv_seq *s);

typedef struct kv_cache_stats {
    int n_blocks;           /* physical blocks */
    int n_free;             /* on the free list */
    int n_cached;           /* unreferenced, kept for prefix reuse (evictable) */
    int n_used;             /* referenced by at least one sequence */
    int n_shared;           /* referenced by two or more sequences */
    int n_swap_blocks;      /* host pool size */
    int n_swap_used;
    uint64_t lookups;       /* attach calls */
    uint64_t hit_blocks;    /* blocks reused by attach */
    uint64_t hit_tokens;    /* tokens reused by attach */
    uint64_t evictions;     /* cached blocks reclaimed */
    uint64_t cow_copies;    /* copy-on-write block copies */
    uint64_t swapped_out;   /* blocks moved to host */
    uint64_t swapped_in;    /* blocks moved back */
    /* sliding-window release (0 without it) */
    int n_local_blocks;     /* local parts in the local pool */
    int n_local_free;
    int n_local_cached;     /* held by unreferenced cached blocks (reclaimable) */
    int n_windowed;         /* referenced blocks without a local part (released: below every holder's window) */
    uint64_t local_released;  /* local parts released because windows moved past them */
    uint64_t local_reclaimed; /* local parts taken from cached blocks */
} kv_cache_stats;

void kv_cache_get_stats(const kv_cache *c, kv_cache_stats *out /* OUT: */);

typedef enum kv_block_state {
    KV_BLOCK_FREE = 0,
    KV_BLOCK_USED = 1,   /* referenced */
    KV_BLOCK_CACHED = 2  /* unreferenced, holds a registered prefix block */
} kv_block_state;

typedef struct kv_block_info {
    uint8_t state;       /* kv_block_state */
    uint16_t refcount;
    uint16_t fill;       /* tokens written in the block (block_size when full) */
    int32_t owner;       /* id of the most recent sequence that referenced it, -1 if none */
    int32_t owner_tag;   /* tag of that sequence */
    uint64_t last_use;   /* LRU clock */
    uint8_t windowed;    /* sliding-window release: used or cached, but its local-layer part released */
} kv_block_info;

/* Per-block state for the block map (n = n_blocks entries). */
void kv_cache_block_map(const kv_cache *c, kv_block_info *out /* OUT: (n_blocks) */);

/* Testing aid: keep only the low `bits` (1..64) bits of every chain hash,
 * so that collisions are frequent and the exact token/parent comparison is
 * exercised. Only while nothing is registered: returns 0, or KV_ERR_INVAL. */
int kv_cache_set_hash_bits(kv_cache *c, int bits);

/* Consistency checker: reference counts equal table references over the
 * given live sequences; no block both free and referenced; the free list,
 * cached set and used set partition the pool; the hash index points only at
 * full blocks whose hash matches. Returns 0, or KV_ERR_INVAL with msg
 * describing the first violation. */
int kv_cache_check(const kv_cache *c, kv_seq *const *seqs, int n_seqs, char *msg /* OUT: (cap) */, size_t cap);

#endif
