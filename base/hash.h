/* hash.h - the two hashes the project's indexes use, written once: FNV-1a
 * over bytes (vocab texts, GGUF keys, tensor names) and a 64-bit finaliser
 * that spreads any key over all bits (merge pairs, block chains). Not for
 * anything adversarial. Header-only; nothing of the project below it. */
#ifndef KV_HASH_H
#define KV_HASH_H

#include <stddef.h>
#include <stdint.h>

/* 64-bit FNV-1a of p[0..n). */
static inline uint64_t kv_hash_fnv1a(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* MurmurHash3's fmix64: a bijection on 64-bit values whose every output
 * bit depends on every input bit. */
static inline uint64_t kv_hash_mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

#endif
