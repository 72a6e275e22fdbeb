/* kv_cache_window.c - sliding-window release in the paged cache. The local
 * (sliding-window) layers' K/V live in a pool of their own: a block owns a
 * "local part" (one block's rows for every local layer) only while some
 * sequence holding it may still attend to it there. Block ids, reference
 * counts, prefix sharing and copy-on-write stay with the blocks; a second
 * count per block, lneed, says how many of its references lie at or past
 * their sequence's window floor (s->lfloor: blocks wholly before the
 * window of the sequence's next query). A referenced block whose lneed
 * drops to 0 loses its part at once; an unreferenced (cached) block keeps
 * its part until the local pool needs it, so a later prompt with the same
 * prefix can reuse its window's tail.
 *
 * The floor moves only at commit, from the committed token count: a
 * reserved or drafted slot (speculation) never moves it, so a rejected
 * draft rolled back by truncate cannot have released a part the window
 * still needs. Invariants (kv_cache_check): lneed[b] counts exactly those
 * references; every such reference's block has a part; a referenced block
 * with lneed 0 has none; free + cached-held + needed parts = the pool. */
#include "kv_cache.h"
#include "kv_cache_internal.h"

#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"

/* ---- sizes ---- */

int kv_cache_params_windowed(const kv_cache_params *p) {
    if (!p || p->window <= 0 || !p->local_layers) return 0;
    for (int l = 0; l < p->n_layers; l++)
        if (p->local_layers[l]) return 1;
    return 0;
}

static int n_local_layers(const kv_cache_params *p) {
    int n = 0;
    for (int l = 0; kv_cache_params_windowed(p) && l < p->n_layers; l++) n += p->local_layers[l] != 0;
    return n;
}

uint64_t kv_cache_local_part_bytes(const kv_cache_params *p) {
    const int nl = n_local_layers(p);
    if (!nl) return 0;
    return kv_cache_block_bytes(p) / (uint64_t)p->n_layers * (uint64_t)nl;
}

uint64_t kv_cache_global_part_bytes(const kv_cache_params *p) {
    return kv_cache_block_bytes(p) - kv_cache_local_part_bytes(p);
}

static int local_blocks_of(const kv_cache_params *p) {
    return p->n_local_blocks > 0 && p->n_local_blocks < p->n_blocks ? p->n_local_blocks : p->n_blocks;
}

uint64_t kv_cache_pool_bytes(const kv_cache_params *p) {
    if (!p || p->n_blocks <= 0) return 0;
    if (!kv_cache_params_windowed(p)) return kv_cache_block_bytes(p) * (uint64_t)p->n_blocks;
    return kv_cache_global_part_bytes(p) * (uint64_t)p->n_blocks +
           kv_cache_local_part_bytes(p) * (uint64_t)local_blocks_of(p);
}

int kv_cache_plan_local_blocks(const kv_cache_params *p, int n_seqs, int max_len) {
    if (!kv_cache_params_windowed(p) || p->block_size < 1) return 0;
    const int64_t bs = p->block_size;
    /* a window spans at most window / bs + 1 blocks; one more is being filled */
    const int64_t per_seq = p->window / bs + 2;
    int64_t n = (max_len + bs - 1) / bs + 1 + (int64_t)KV_MAX(0, n_seqs - 1) * per_seq;
    if (p->n_blocks > 0 && n > p->n_blocks) n = p->n_blocks;
    return (int)KV_MIN(n, (int64_t)INT32_MAX / bs);
}

/* ---- the local pool ---- */

int kvw_floor(const kv_cache *c, int n_tokens) {
    const int lo = n_tokens + 1 - c->p.window; /* the next query, at position n_tokens, sees > n_tokens - window */
    return lo > 0 ? lo / c->p.block_size : 0;
}

int kvw_available(const kv_cache *c) { return c->n_lfree + c->n_cached_l; }

static void part_free(kv_cache *c, int b) {
    c->lfree[c->n_lfree++] = c->lpart[b];
    c->lpart[b] = -1;
}

void kvw_attach_part(kv_cache *c, int b) {
    if (!c->swa || c->lpart[b] >= 0) return;
    if (c->n_lfree > 0) {
        c->lpart[b] = c->lfree[--c->n_lfree];
        return;
    }
    /* the least recently used cached block that holds one */
    for (int v = c->lru_head; v >= 0; v = c->lru_next[v])
        if (c->lpart[v] >= 0) {
            c->lpart[b] = c->lpart[v];
            c->lpart[v] = -1;
            c->n_cached_l--;
            c->local_reclaimed++;
            return;
        }
}

void kvw_need(kv_cache *c, int b) {
    if (!c->swa) return;
    kvw_attach_part(c, b);
    c->lneed[b]++;
}

void kvw_unneed(kv_cache *c, int b) {
    if (!c->swa) return;
    if (--c->lneed[b] == 0 && c->ref[b] > 0 && c->lpart[b] >= 0) {
        part_free(c, b);
        c->local_released++;
    }
}

void kvw_settle(kv_cache *c, int b, int was_cached) {
    if (!c->swa || c->lpart[b] < 0) return;
    const int cached = c->state[b] == KV_BLOCK_CACHED;
    if (was_cached && !cached) c->n_cached_l--;
    if (!was_cached && cached) c->n_cached_l++;
    if (c->state[b] == KV_BLOCK_FREE) part_free(c, b);
}

void kvw_trim(kv_cache *c, int b) {
    if (c->swa && c->state[b] == KV_BLOCK_USED && c->lneed[b] == 0 && c->lpart[b] >= 0) {
        part_free(c, b);
        c->local_released++;
    }
}

void kvw_advance(kv_cache *c, kv_seq *s) {
    if (!c->swa || s->swapped) return;
    const int f = KV_MIN(kvw_floor(c, s->n_tokens), s->n_blocks);
    for (int i = s->lfloor; i < f; i++) kvw_unneed(c, s->blocks[i]);
    if (f > s->lfloor) s->lfloor = f;
}

int kvw_match_tokens(const kv_cache *c, const int32_t *blocks, int k, int n) {
    const int bs = c->p.block_size;
    for (; k > 0; k--) {
        int64_t t = (int64_t)k * bs;
        if (t > n - 1) t = n - 1;
        const int n_tok = (int)t, kk = (n_tok + bs - 1) / bs;
        if (!c->swa) return n_tok;
        int ok = 1;
        for (int i = kvw_floor(c, n_tok); ok && i < kk; i++) ok = c->lpart[blocks[i]] >= 0;
        if (ok) return n_tok;
    }
    return 0;
}

void kvw_copy(kv_cache *c, int dst, int src) {
    if (!c->swa || c->lpart[dst] < 0 || c->lpart[src] < 0) return;
    c->b->ops->copy_block(c->b, &c->lpages, c->lpart[dst], c->lpart[src]);
}

/* ---- what the forward pass reads ---- */

kv_pages *kv_cache_local_pages(kv_cache *c) { return c && c->swa ? &c->lpages : NULL; }

int32_t kv_cache_local_slot(const kv_cache *c, const kv_seq *s, int pos) {
    if (!c || !c->swa || !s || s->swapped || pos < 0) return -1;
    const int bs = c->p.block_size;
    if (pos / bs >= s->n_blocks) return -1;
    const int32_t part = c->lpart[s->blocks[pos / bs]];
    return part < 0 ? -1 : part * bs + pos % bs;
}

void kv_cache_local_table(const kv_cache *c, const kv_seq *s, int32_t *out) {
    if (!c || !s || !out || s->swapped) return;
    for (int i = 0; i < s->n_blocks; i++)
        out[i] = c->swa && i >= s->lfloor ? c->lpart[s->blocks[i]] : -1;
}

/* ---- lifetime (kv_cache_new) ---- */

int kv_window_setup(kv_cache *c, kv_err *err) {
    const kv_cache_params *p = &c->p;
    if (p->window < 0) return kv_err_set(err, KV_ERR_INVAL, "kv cache: window %d is negative", p->window);
    if (p->n_local_blocks < 0 || p->n_local_blocks > p->n_blocks)
        return kv_err_set(err, KV_ERR_INVAL, "kv cache: n_local_blocks %d out of range [0, %d]", p->n_local_blocks,
                          p->n_blocks);
    c->swa = kv_cache_params_windowed(p);
    c->is_local = calloc((size_t)p->n_layers, 1);
    c->lidx = malloc((size_t)p->n_layers * sizeof *c->lidx);
    if (!c->is_local || !c->lidx) return kv_err_set(err, KV_ERR_NOMEM, "kv cache: out of memory");
    for (int l = 0; l < p->n_layers; l++) {
        c->is_local[l] = c->swa && p->local_layers[l];
        c->lidx[l] = (int16_t)(c->is_local[l] ? c->n_local++ : c->n_global++);
    }
    /* the copy the cache keeps: the caller's array is borrowed */
    c->p.local_layers = c->swa ? c->is_local : NULL;
    if (!c->swa) c->p.window = 0;
    return 0;
}

int kv_window_alloc(kv_cache *c, kv_err *err) {
    if (!c->swa) return 0;
    const kv_cache_params *p = &c->p;
    const int nb = p->n_blocks, nl = local_blocks_of(p);
    c->lpages = c->pages;
    c->lpages.n_layers = c->n_local;
    c->lpages.n_blocks = nl;
    c->lpages.k = c->lpages.v = NULL;
    kv_pages_set_sizes(&c->lpages);
    const uint64_t total = (uint64_t)c->lpages.layer_bytes * (uint64_t)c->n_local;
    if (total > (uint64_t)SIZE_MAX / 2) return kv_err_set(err, KV_ERR_INVAL, "kv cache: local pool overflows");
    if (!p->no_storage) {
        c->lpages.k = c->b->ops->alloc(c->b, (size_t)total);
        c->lpages.v = c->lpages.k ? c->b->ops->alloc(c->b, (size_t)total) : NULL;
        if (!c->lpages.k || !c->lpages.v)
            return kv_err_set(err, KV_ERR_NOMEM, "kv cache: backend cannot allocate 2 x %.1f MiB for %d local parts",
                              (double)total / 1048576.0, nl);
    }
    c->lpart = malloc((size_t)nb * sizeof *c->lpart);
    c->lneed = calloc((size_t)nb, sizeof *c->lneed);
    c->lfree = malloc((size_t)nl * sizeof *c->lfree);
    if (!c->lpart || !c->lneed || !c->lfree) return kv_err_set(err, KV_ERR_NOMEM, "kv cache: out of memory");
    for (int i = 0; i < nb; i++) c->lpart[i] = -1;
    for (int i = 0; i < nl; i++) c->lfree[i] = nl - 1 - i;
    c->n_lfree = nl;
    return 0;
}

int kv_cache_size_pools(kv_cache_params *p, uint64_t bytes, int n_blocks, int n_seqs, int max_len) {
    p->n_local_blocks = 0;
    if (!kv_cache_params_windowed(p)) {
        p->n_blocks = n_blocks > 0 ? n_blocks : kv_cache_blocks_for_bytes(p, bytes);
        return p->n_blocks;
    }
    const int64_t cap = INT32_MAX / KV_MAX(1, p->block_size);
    if (n_blocks > 0) {
        p->n_blocks = n_blocks;
        p->n_local_blocks = kv_cache_plan_local_blocks(p, n_seqs, max_len);
        return p->n_blocks;
    }
    const uint64_t G = kv_cache_global_part_bytes(p), L = kv_cache_local_part_bytes(p);
    if (!L) return p->n_blocks = 0;
    p->n_blocks = (int)cap; /* the plan uncapped */
    const uint64_t nl = (uint64_t)kv_cache_plan_local_blocks(p, n_seqs, max_len);
    uint64_t nb;
    if (G == 0) { /* every layer local: blocks are bookkeeping, sized for every sequence's context */
        uint64_t parts = bytes / L;
        p->n_local_blocks = (int)KV_MIN(parts, (uint64_t)cap);
        nb = (uint64_t)p->n_local_blocks + (uint64_t)KV_MAX(1, n_seqs) * (uint64_t)((max_len + p->block_size - 1) / p->block_size);
        p->n_blocks = (int)KV_MIN(nb, (uint64_t)cap);
        return p->n_local_blocks > 0 ? p->n_blocks : (p->n_blocks = 0);
    }
    if (nl * L < bytes && (nb = (bytes - nl * L) / G) >= nl) {
        p->n_blocks = (int)KV_MIN(nb, (uint64_t)cap);
        p->n_local_blocks = (int)KV_MIN(nl, (uint64_t)p->n_blocks);
    } else { /* too little for the plan: every block keeps its part */
        nb = bytes / (G + L);
        p->n_blocks = (int)KV_MIN(nb, (uint64_t)cap);
        p->n_local_blocks = p->n_blocks;
    }
    return p->n_blocks;
}

/* ---- what fits (a plan run through the block manager itself) ---- */

int kv_cache_fit_sequences(const kv_cache_params *p, kv_backend *b, int n_tokens, int chunk, int max_seqs,
                           uint64_t *seq_bytes) {
    if (seq_bytes) *seq_bytes = 0;
    if (!p || !b || n_tokens < 1 || chunk < 1 || max_seqs < 1) return KV_ERR_INVAL;
    kv_cache_params q = *p;
    q.no_storage = 1; /* bookkeeping only */
    q.prefix_sharing = 0;
    q.n_swap_blocks = 0;
    kv_cache *c = kv_cache_new(&q, b, NULL);
    kv_seq *s = calloc((size_t)max_seqs, sizeof *s);
    int n = 0;
    while (c && s && n < max_seqs) {
        kv_seq *r = &s[n];
        kv_seq_init(r, n + 1, 0);
        /* the scheduler reserves a prompt whole on admission, then prefills it in chunks */
        if (kv_cache_seq_reserve(c, r, n_tokens + 1) != 0) {
            kv_cache_seq_release(c, r);
            break;
        }
        for (int t = KV_MIN(chunk, n_tokens); r->n_tokens < n_tokens; t = KV_MIN(r->n_tokens + chunk, n_tokens))
            kv_cache_seq_commit(c, r, NULL, t);
        if (n == 0 && seq_bytes) {
            const uint64_t G = c->swa ? kv_cache_global_part_bytes(&c->p) : kv_cache_block_bytes(&c->p);
            const uint64_t parts = c->swa ? (uint64_t)(r->n_blocks - r->lfloor) : 0;
            *seq_bytes = G * (uint64_t)r->n_blocks + parts * kv_cache_local_part_bytes(&c->p);
        }
        n++;
    }
    for (int i = 0; s && i < n; i++) kv_cache_seq_release(c, &s[i]);
    free(s);
    kv_cache_free(c);
    return n;
}
