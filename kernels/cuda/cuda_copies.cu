/* cuda_copies.cu - the cuda backend's table of device copies of host bytes
 * (weights from the model mapping, RMSNorm vectors), keyed by the host
 * address: open addressing, linear probing, a power-of-two capacity kept
 * at most half full. */
#include <stdlib.h>

#include "cuda_internal.cuh"

static size_t cslot(size_t cap, const void *key) {
    uint64_t h = (uint64_t)(uintptr_t)key;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return (size_t)h & (cap - 1);
}

kvc_copy *kvc_copy_find(kvc_copies *c, const void *host) {
    if (!c->cap) return NULL;
    for (size_t i = cslot(c->cap, host); c->t[i].host; i = (i + 1) & (c->cap - 1))
        if (c->t[i].host == host) return &c->t[i];
    return NULL;
}

kvc_copy *kvc_copy_slot(kvc_copies *c, const void *host) {
    kvc_copy *e = kvc_copy_find(c, host);
    if (e) return e;
    if ((c->count + 1) * 2 > c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 256;
        kvc_copy *nt = (kvc_copy *)calloc(ncap, sizeof *nt);
        if (!nt) return NULL;
        for (size_t i = 0; i < c->cap; i++) {
            if (!c->t[i].host) continue;
            size_t j = cslot(ncap, c->t[i].host);
            while (nt[j].host) j = (j + 1) & (ncap - 1);
            nt[j] = c->t[i];
        }
        free(c->t);
        c->t = nt;
        c->cap = ncap;
    }
    size_t i = cslot(c->cap, host);
    while (c->t[i].host) i = (i + 1) & (c->cap - 1);
    c->t[i].host = host;
    c->t[i].dev = NULL;
    c->t[i].bytes = 0;
    c->count++;
    return &c->t[i];
}

void kvc_copies_drop(kvc_copies *c) {
    for (size_t i = 0; i < c->cap; i++)
        if (c->t[i].dev) cudaFree(c->t[i].dev);
    free(c->t);
    c->t = NULL;
    c->cap = c->count = 0;
}
