/* ring.h - a growable ring of fixed-size records that keeps the newest
 * `limit` of them (or all when limit is 0): the engine's step, decision and
 * finished-request histories. Private to engine/; not thread-safe (the
 * engine holds state_mu). */
#ifndef KV_RING_H
#define KV_RING_H

#include <stddef.h>

typedef struct kv_ring {
    void *v;       /* (cap, elem) records, owned */
    size_t elem;   /* bytes per record */
    int cap;       /* records v holds */
    int head;      /* index of the oldest */
    int n;         /* records held */
    int limit;     /* records kept at most; 0: no limit */
} kv_ring;

/* Sets up an empty ring of `elem`-byte records keeping at most `limit`
 * (0: all). Allocates nothing. */
void kv_ring_init(kv_ring *r /* OUT: an empty ring */, size_t elem, int limit);
/* Frees the records; the ring is empty afterwards. NULL is a no-op. */
void kv_ring_free(kv_ring *r);
/* The i-th record, oldest first (0 <= i < r->n); borrowed until the next
 * push or limit change. */
void *kv_ring_at(const kv_ring *r, int i);
/* Appends a copy of *x: grows the ring, or at the limit overwrites the
 * oldest. Returns 0, or KV_ERR_NOMEM when it could not grow: the record is
 * dropped and the ring is unchanged. */
int kv_ring_push(kv_ring *r, const void *x);
/* Moves up to `max` of the oldest records into out (oldest first) and
 * removes them from the ring. Returns how many it moved. */
int kv_ring_pop(kv_ring *r, void *out /* OUT: (max, elem) */, int max);
/* Changes the limit; a lower one drops the oldest records at once. */
void kv_ring_set_limit(kv_ring *r, int limit);

#endif
