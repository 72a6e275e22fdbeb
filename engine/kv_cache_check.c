/* kv_cache_check.c - what the block manager shows of itself: statistics,
 * the per-block map the panels draw, and the invariant check the tests
 * and the engine's debug mode run after every step. */
#include "kv_cache.h"
#include "kv_cache_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (c->swa) {
        out->n_local_blocks = c->lpages.n_blocks;
        out->n_local_free = c->n_lfree;
        out->n_local_cached = c->n_cached_l;
        for (int b = 0; b < c->p.n_blocks; b++) out->n_windowed += c->ref[b] > 0 && c->lpart[b] < 0;
        out->local_released = c->local_released;
        out->local_reclaimed = c->local_reclaimed;
    }
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
        o->windowed = c->swa && c->state[i] != KV_BLOCK_FREE && c->lpart[i] < 0;
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

/* Sliding-window release: lneed counts the references at or past their
 * sequence's floor, each of which has its local part; a referenced block
 * nobody needs holds none; a free block none; every part is free or held by
 * exactly one block, and the counts agree. */
static int check_window(const kv_cache *c, kv_seq *const *seqs, int n_seqs, char *msg, size_t cap) {
    const int nb = c->p.n_blocks, nl = c->lpages.n_blocks;
    int rc = 0;
    int32_t *need = calloc((size_t)nb, sizeof *need);
    uint8_t *held = calloc((size_t)nl, 1);
    if (!need || !held) FAIL("check: out of memory");
    for (int q = 0; q < n_seqs; q++) {
        const kv_seq *s = seqs[q];
        if (!s) continue;
        if (s->lfloor < 0 || s->lfloor > s->n_blocks)
            FAIL("seq %d: window floor %d outside its %d blocks", s->id, s->lfloor, s->n_blocks);
        if (s->lfloor < KV_MIN(kvw_floor(c, s->n_tokens), s->n_blocks) && !s->swapped)
            FAIL("seq %d: window floor %d behind its %d committed tokens", s->id, s->lfloor, s->n_tokens);
        if (s->lfloor > kvw_floor(c, s->n_tokens))
            FAIL("seq %d: window floor %d past what %d committed tokens allow (released blocks its window needs)",
                 s->id, s->lfloor, s->n_tokens);
        if (s->swapped) continue;
        for (int i = s->lfloor; i < s->n_blocks; i++) {
            const int b = s->blocks[i];
            need[b]++;
            if (c->lpart[b] < 0) FAIL("seq %d: block[%d] = %d lies in its window but has no local part", s->id, i, b);
        }
    }
    int n_cached_l = 0;
    for (int b = 0; b < nb; b++) {
        if (c->lneed[b] != need[b]) FAIL("block %d: lneed %d but %d window references", b, c->lneed[b], need[b]);
        const int part = c->lpart[b];
        if (part >= nl) FAIL("block %d: local part %d out of range", b, part);
        if (part < 0) continue;
        if (held[part]) FAIL("local part %d held twice", part);
        held[part] = 1;
        if (c->state[b] == KV_BLOCK_FREE) FAIL("block %d: free but holds local part %d", b, part);
        if (c->state[b] == KV_BLOCK_USED && !need[b]) FAIL("block %d: nobody's window covers it, but it holds part %d", b, part);
        if (c->state[b] == KV_BLOCK_CACHED) n_cached_l++;
    }
    if (n_cached_l != c->n_cached_l) FAIL("local: %d cached blocks hold parts, counted %d", n_cached_l, c->n_cached_l);
    if (c->n_lfree < 0 || c->n_lfree > nl) FAIL("local: n_free %d", c->n_lfree);
    for (int i = 0; i < c->n_lfree; i++) {
        const int part = c->lfree[i];
        if (part < 0 || part >= nl || held[part]) FAIL("local: free part %d out of range, held or listed twice", part);
        held[part] = 1;
    }
    for (int i = 0; i < nl; i++)
        if (!held[i]) FAIL("local: part %d neither free nor held", i);
done:
    free(need);
    free(held);
    return rc;
}

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
                if (c->parent[b] != par || c->parent_gen[b] != kvc_gen_of(c, par))
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
            if (kvc_chain_hash(c, c->parent_hash[b], c->tokens + (size_t)b * bs, bs) != c->hash[b])
                FAIL("index: block %d hash does not match its tokens", b);
            int par = c->parent[b];
            if (par >= nb) FAIL("index: block %d parent %d out of range", b, par);
            if (par < 0 && c->parent_hash[b] != KV_HASH_ROOT) FAIL("index: first block %d has a parent hash", b);
            if (par >= 0 && c->parent_gen[b] == c->gen[par] &&
                (!c->registered[par] || c->hash[par] != c->parent_hash[b]))
                FAIL("index: block %d parent %d hash mismatch", b, par);
            if (kvc_index_find(c, c->hash[b], par, c->parent_gen[b], c->tokens + (size_t)b * bs) != b)
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
    if (c->swa) rc = check_window(c, seqs, n_seqs, msg, cap);
done:
    free(refs);
    free(seen);
    free(swap_seen);
    return rc;
}
