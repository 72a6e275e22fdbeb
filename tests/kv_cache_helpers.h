/* kv_cache_helpers.h - what the block-manager tests share: the invariant
 * check with its message, a seeded generator, and the K/V row values a
 * position holds (a function of its whole prefix, so a wrong block shows).
 * Header-only, included by tests/engine/test_kv_cache.c and test_kv_window.c. */
#ifndef KV_TESTS_KV_CACHE_HELPERS_H
#define KV_TESTS_KV_CACHE_HELPERS_H

#include <stdint.h>
#include <stdio.h>

#include "../engine/kv_cache.h"

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

#endif
