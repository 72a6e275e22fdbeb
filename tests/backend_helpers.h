/* backend_helpers.h - what the backend tests (tests/kernels, tests/gpu)
 * share: backends reserved for the ops a test runs, device buffers made
 * from host data, random weights in host memory, and freeing a list of
 * device buffers. Header-only, after harness.h (its random numbers). */
#ifndef KV_TEST_BACKEND_HELPERS_H
#define KV_TEST_BACKEND_HELPERS_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

#include "../kernels/backend.h"
#include "../kernels/cpu.h"
#include "../kernels/cpu_attention.h"
#include "../kernels/types.h"
#include "harness.h"

/* The tolerance of an attention result of dtype dt against the cpu backend
 * cpu's (tol otherwise): where the cpu scores int8 keys in integers
 * (kv_attn_int8_integer), its queries are rounded to int8 and the other
 * backends' are not, ~2e-3 apart (normalised error). */
static inline double test_attn_tol(kv_backend *cpu, kv_cache_dtype dt, double tol) {
    return dt == KV_CACHE_INT8 && kv_attn_int8_integer(kv_cpu_get_isa(cpu)) ? 5e-3 : tol;
}

/* b reserved for lim (ops.reserve); NULL, with b freed and the reason in
 * err, when that fails or b is NULL. */
static inline kv_backend *test_reserve(kv_backend *b, const kv_backend_limits *lim, kv_err *err) {
    if (b && kv_backend_reserve(b, lim, err) != 0) {
        kv_backend_free(b);
        return NULL;
    }
    return b;
}

/* Backend `name` with `threads` threads reserved for matmuls of up to
 * max_rows rows of max_k; NULL (the reason on stderr) when that fails. */
static inline kv_backend *test_backend_for_rows(const char *name, int threads, int max_rows, int64_t max_k) {
    kv_err err = {0};
    kv_backend_limits lim = {.max_rows = max_rows, .max_k = max_k};
    kv_backend *b = test_reserve(kv_backend_create(name, threads, &err), &lim, &err);
    if (!b) fprintf(stderr, "  %s backend: %s\n", name, err.msg);
    return b;
}

/* A buffer of `bytes` on b holding src (left as allocated when src is
 * NULL); NULL when the allocation fails. */
static inline void *test_put(kv_backend *b, const void *src, size_t bytes) {
    void *p = b->ops->alloc(b, bytes);
    if (p && src) b->ops->upload(b, p, src, bytes);
    return p;
}

/* A weight of type t, rows x cols, quantized from random floats in
 * [-1, 1) into host memory. *owned receives the bytes (free() them; NULL
 * when out of memory). */
static inline kv_tensor test_make_weight(kv_type t, int rows, int cols, void **owned) {
    size_t rs = kv_type_row_size(t, cols);
    uint8_t *data = malloc(rs * (size_t)rows);
    float *tmp = malloc((size_t)cols * sizeof(float));
    for (int r = 0; data && tmp && r < rows; r++) {
        harness_fill_rand(tmp, (size_t)cols, 1.0f);
        kv_quantize_row(t, tmp, data + (size_t)r * rs, cols);
    }
    free(tmp);
    *owned = data;
    kv_tensor w = {.type = t, .ne0 = cols, .ne1 = rows, .nb1 = rs, .data = data, .dev = NULL};
    return w;
}

static inline void test_dev_free_list(kv_backend *b, void *const *bufs, size_t n) {
    for (size_t i = 0; i < n; i++) b->ops->free(b, bufs[i]);
}

/* ops->free of each device buffer argument: TEST_DEV_FREE(b, dx, dy). */
#define TEST_DEV_FREE(b, ...) \
    test_dev_free_list((b), (void *[]){__VA_ARGS__}, sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))

#endif
