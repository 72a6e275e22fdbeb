/* ring.c - the record ring behind ring.h. */
#include "ring.h"

#include <stdlib.h>
#include <string.h>

#include "../base/common.h"

void kv_ring_init(kv_ring *r, size_t elem, int limit) {
    memset(r, 0, sizeof *r);
    r->elem = elem;
    r->limit = limit;
}

void kv_ring_free(kv_ring *r) {
    if (!r) return;
    free(r->v);
    r->v = NULL;
    r->cap = r->head = r->n = 0;
}

void *kv_ring_at(const kv_ring *r, int i) {
    return (char *)r->v + (size_t)((r->head + i) % r->cap) * r->elem;
}

/* Re-lays the ring out from index 0 with capacity nc (>= n). */
static int ring_realloc(kv_ring *r, int nc) {
    void *p = malloc((size_t)nc * r->elem);
    if (!p) return KV_ERR_NOMEM;
    for (int i = 0; i < r->n; i++) memcpy((char *)p + (size_t)i * r->elem, kv_ring_at(r, i), r->elem);
    free(r->v);
    r->v = p;
    r->cap = nc;
    r->head = 0;
    return 0;
}

int kv_ring_push(kv_ring *r, const void *x) {
    if (r->n == r->cap) {
        if (r->limit > 0 && r->n >= r->limit) { /* overwrite the oldest */
            memcpy(kv_ring_at(r, 0), x, r->elem);
            r->head = (r->head + 1) % r->cap;
            return 0;
        }
        int nc = r->cap ? r->cap * 2 : 64;
        if (r->limit > 0 && nc > r->limit) nc = r->limit;
        if (ring_realloc(r, nc)) return KV_ERR_NOMEM;
    }
    memcpy(kv_ring_at(r, r->n), x, r->elem);
    r->n++;
    return 0;
}

int kv_ring_pop(kv_ring *r, void *out, int max) {
    int n = max > 0 ? KV_MIN(max, r->n) : 0;
    for (int i = 0; i < n; i++) memcpy((char *)out + (size_t)i * r->elem, kv_ring_at(r, i), r->elem);
    if (n > 0) {
        r->head = (r->head + n) % r->cap;
        r->n -= n;
    }
    return n;
}

void kv_ring_set_limit(kv_ring *r, int limit) {
    r->limit = limit;
    if (limit > 0 && r->n > limit) {
        r->head = (r->head + (r->n - limit)) % r->cap;
        r->n = limit;
        ring_realloc(r, limit); /* out of memory: keeps the larger array, same records */
    }
}
