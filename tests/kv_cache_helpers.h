/* kv_cache_helpers.h - what the block-manager tests share: the invariant
 * check with its message, a seeded generator, and the K/V row values a
 * position holds (a function of its whole prefix, so a wrong block shows).
 * Header-only, included by tests/engine/test_kv_cache.c and test_kv_window.c. */
#ifndef KV_TESTS_KV_CACHE_HELPERS_H
#define KV_TESTS_KV_CACHE_HELPERS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../engine/kv_cache.h"
#include "../kernels/cpu_attention.h"

static inline int check_ok(kv_cache *c, kv_seq *const *seqs, int n) {
    char msg[256];
    int rc = kv_cache_check(c, seqs, n, msg, sizeof msg);
    if (rc) fprintf(stderr, "  kv_cache_check: %s\n", msg);
    return rc == 0;
}

static inline uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline int rnd(uint64_t *s, int n) { return (int)(splitmix(s) % (uint64_t)n); }

/* Row element e of (layer, head, K or V) at a position with prefix hash
 * ph. Values stay below 2^24 so f32 holds them exactly. */
static inline float kv_value(uint64_t ph, int layer, int head, int is_v, int e) {
    uint64_t z = ph ^ ((uint64_t)(layer * 8 + head * 2 + is_v) << 56) ^ ((uint64_t)e << 48);
    z ^= z >> 31;
    z *= 0x9e3779b97f4a7c15ull;
    return (float)((z >> 40) & 0xffffff);
}

/* The rows of every KV head of one slot (layer li of the pages pg) hold
 * kv_value(ph, l, ...); else says which element differs and returns 0
 * (id, p: the sequence and position, for the message). */
static inline int kv_slot_rows_ok(const kv_pages *pg, int li, int l, int64_t slot, uint64_t ph, int id, int p) {
    for (int g = 0; g < pg->n_kv_heads; g++)
        for (int isv = 0; isv < 2; isv++) {
            const uint8_t *row = (isv ? pg->v : pg->k) + kv_pages_row_offset(pg, li, slot, g);
            for (int e = 0; e < pg->head_dim; e++) {
                float f;
                memcpy(&f, row + 4 * e, 4);
                if (f != kv_value(ph, l, g, isv, e)) {
                    fprintf(stderr, "  seq %d pos %d layer %d head %d %s[%d]: %g != %g\n", id, p, l, g,
                            isv ? "v" : "k", e, f, kv_value(ph, l, g, isv, e));
                    return 0;
                }
            }
        }
    return 1;
}

/* The prefix hash after token tok, from the hash ph of what precedes it;
 * prefix_hashes fills ph[i] for every position of toks. */
static inline uint64_t prefix_step(uint64_t ph, int32_t tok) {
    uint64_t z = ph * 0x100000001b3ull ^ (uint64_t)(uint32_t)tok;
    return z ^ (z >> 29);
}

static inline void prefix_hashes(const int32_t *toks, int n, uint64_t *ph) {
    uint64_t h = 0x1234;
    for (int i = 0; i < n; i++) ph[i] = h = prefix_step(h, toks[i]);
}

/* A sequence of the randomised workloads: its tokens and their prefix
 * hashes (a workload caps the length at KV_WSEQ_CAP or below). */
enum { KV_WSEQ_CAP = 80 };
typedef struct wseq {
    kv_seq s;
    int live;
    int len; /* tokens known (prompt + generated) */
    int32_t t[KV_WSEQ_CAP];
    uint64_t ph[KV_WSEQ_CAP];
} wseq;

/* The live sequences of w[0..n) into out; how many. */
static inline int live_list(wseq *w, int n, kv_seq **out) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (w[i].live) out[k++] = &w[i].s;
    return k;
}

/* Stores the rows of one slot (layer li of pg) for position p of model
 * layer l: kv_value(ph, l, ...) in every KV head, or noise from garbage
 * != 0 (a rejected draft token's rows), through the CPU kv_store op. */
static inline void kv_store_slot_rows(kv_pages *pg, int li, int l, int32_t slot, int p, uint64_t ph, uint32_t garbage) {
    const int nkv = pg->n_kv_heads, hd = pg->head_dim;
    float k[64], v[64];
    for (int g = 0; g < nkv; g++)
        for (int e = 0; e < hd; e++) {
            k[g * hd + e] = garbage ? (float)(garbage + e) : kv_value(ph, l, g, 0, e);
            v[g * hd + e] = garbage ? (float)(garbage * 3 + e) : kv_value(ph, l, g, 1, e);
        }
    int32_t pos = p, seq = 0;
    kv_attn_batch ab = {.n_tokens = 1, .pos = &pos, .seq = &seq, .slot = &slot, .n_seqs = 0};
    kv_attn_store(NULL, KV_CPU_ISA_SCALAR, pg, li, &ab, k, v);
}

/* A test's writer of positions [p0, p1) of a sequence (garbage as above). */
typedef void (*kv_rows_writer)(kv_cache *c, const kv_seq *s, const uint64_t *ph, int p0, int p1, uint32_t garbage);

/* Computes (writes) and commits tokens [s->n_tokens, n) of a sequence. */
static inline int kv_prefill_rows(kv_cache *c, kv_seq *s, const int32_t *toks, const uint64_t *ph, int n,
                                  kv_rows_writer write_rows) {
    int rc = kv_cache_seq_reserve(c, s, n - s->n_tokens);
    if (rc) return rc;
    write_rows(c, s, ph, s->n_tokens, n, 0);
    kv_cache_seq_commit(c, s, toks, n);
    return 0;
}

#endif
