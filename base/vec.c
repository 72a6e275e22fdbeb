/* vec.c - the growable-array helper behind vec.h. */
#include "vec.h"

#include <stdint.h>
#include <stdlib.h>

#include "common.h"

int kv_grow_size(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap > 0 ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return KV_ERR_NOMEM;
        nc *= 2;
    }
    if (elem == 0 || nc > SIZE_MAX / elem) return KV_ERR_NOMEM;
    void *q = realloc(*p, nc * elem);
    if (!q) return KV_ERR_NOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

int kv_grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap > 0 ? (size_t)*cap : 0;
    if (kv_grow_size(p, &c, (size_t)need, elem)) return KV_ERR_NOMEM;
    if (c > INT32_MAX) c = (size_t)need; /* never reports more than an int holds (need fits) */
    *cap = (int)c;
    return 0;
}
