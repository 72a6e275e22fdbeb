/* vec.h - the one growable-array helper: an array of any element type kept
 * as a pointer plus a capacity, grown by doubling from 16. Two spellings of
 * the same helper, for int and size_t capacities. Needs nothing of the
 * project but common.h's error codes. */
#ifndef KV_VEC_H
#define KV_VEC_H

#include <stddef.h>

/* Makes *p hold at least `need` elements of `elem` bytes: when *cap is
 * smaller, reallocates to 16 * 2^k elements (the first that fits) and
 * updates *p and *cap; the first *cap elements are kept, the new ones are
 * uninitialised. need <= *cap is a no-op. Returns 0, or KV_ERR_NOMEM (also
 * when the size overflows) with *p and *cap unchanged. */
int kv_grow(void **p /* IN/OUT: the array */, int *cap /* IN/OUT: its capacity */, int need, size_t elem);
/* The same for a size_t capacity. */
int kv_grow_size(void **p /* IN/OUT: the array */, size_t *cap /* IN/OUT: its capacity */, size_t need,
                 size_t elem);

#endif
