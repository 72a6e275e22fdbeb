/* membw.c - threaded read-bandwidth probe: each thread sums 64-bit words of
 * its slice of a buffer larger than the caches, so the loads stream from
 * DRAM; the median of several reps filters out a noisy neighbour. */
#include "membw.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_MEMBW_X86 1
#endif

typedef struct bw_task {
    const uint64_t *buf;
    size_t words;             /* total 64-bit words */
    volatile uint64_t sink[64]; /* per-thread results, so the loads are not dead */
} bw_task;

static uint64_t sum_scalar(const uint64_t *p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    for (; i < n; i++) s0 += p[i];
    return s0 + s1 + s2 + s3;
}

#ifdef KV_MEMBW_X86
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(const void *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 4)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 8)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 12)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, s0);
    return t[0] + t[1] + t[2] + t[3] + sum_scalar(p + i, n - i);
}
#endif

static void bw_run(void *ctx, int ith, int nth) {
    bw_task *t = ctx;
    size_t w0 = t->words * (size_t)ith / (size_t)nth, w1 = t->words * (size_t)(ith + 1) / (size_t)nth;
    uint64_t s;
#ifdef KV_MEMBW_X86
    __builtin_cpu_init();
    s = __builtin_cpu_supports("avx2") ? sum_avx2(t->buf + w0, w1 - w0) : sum_scalar(t->buf + w0, w1 - w0);
#else
    s = sum_scalar(t->buf + w0, w1 - w0);
#endif
    t->sink[ith & 63] = s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kv_membw_measure_gbs(kv_threadpool *p, size_t bytes, int reps) {
    if (bytes == 0) bytes = (size_t)256 << 20;
    if (reps <= 0) reps = 5;
    if (reps > 101) reps = 101;
    bytes &= ~(size_t)63;
    if (bytes < 4096) bytes = 4096;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) return -1.0;
    memset(buf, 1, bytes); /* fault the pages in before timing */
    bw_task t;
    memset(&t, 0, sizeof t);
    t.buf = buf;
    t.words = bytes / sizeof(uint64_t);
    double gbs[101];
    kv_threadpool_run(p, bw_run, &t); /* warm-up: threads awake, TLB primed */
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = kv_now_ns();
        kv_threadpool_run(p, bw_run, &t);
        uint64_t dt = kv_now_ns() - t0;
        gbs[r] = dt ? (double)bytes / (double)dt : 0.0; /* bytes per ns = GB/s */
    }
    free(buf);
    qsort(gbs, (size_t)reps, sizeof gbs[0], cmp_double);
    return gbs[reps / 2];
}
