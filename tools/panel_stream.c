/* panel_stream.c - how fast one thread streams q8_0 panels from DRAM, in
 * stop 25's layout (a panel's 24 block headers, then its 24 blocks' quants)
 * and in stop 28's (block pairs: two headers, then two blocks' quants),
 * with and without a software prefetch 4 KiB ahead into L2, next to a
 * plain sequential sum of the same bytes and a sum that skips the header
 * lines the way the old kernel's quant stream did. The kernel is the
 * panel kernel's inner step at n = 1 (8 loads, 8 vpdpbusd, the fp16
 * scales, one fma per block); the README's stop 28 paragraph quotes it.
 *
 *   build/tools/panel_stream [MiB (256)] [reps (5)]
 *
 * Single thread, median of the reps; x86-64 with AVX-512 VNNI only (it
 * says so and exits 0 elsewhere). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "../kernels/simd_x86.h"

#define NB 24                     /* blocks of 32 per row: K = 768 */
#define PANEL (NB * (32 + 512))   /* bytes of a 16-row q8_0 panel, either layout */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

KV_SIMD_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

static uint64_t sum_range(const uint8_t *p, size_t n) { /* n a multiple of 256 */
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        a = _mm512_add_epi64(a, _mm512_load_si512((const void *)(p + i)));
        b = _mm512_add_epi64(b, _mm512_load_si512((const void *)(p + i + 64)));
        c = _mm512_add_epi64(c, _mm512_load_si512((const void *)(p + i + 128)));
        d = _mm512_add_epi64(d, _mm512_load_si512((const void *)(p + i + 192)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
}

/* One panel at n = 1: layout 0 = headers then quants, 1 = block pairs. */
static float panel(const uint8_t *pp, const int8_t *aq, const float *ad, int layout, int prefetch) {
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < NB; b++) {
        const uint8_t *hd, *pb;
        if (layout == 0) {
            hd = pp + 32 * b;
            pb = pp + 32 * NB + 512 * b;
        } else {
            const uint8_t *base = pp + (size_t)(b >> 1) * 1088;
            hd = base + 32 * (b & 1);
            pb = base + 64 + 512 * (b & 1);
        }
        if (prefetch) {
            for (int l = 0; l < 512; l += 64) _mm_prefetch((const char *)(pb + 4096 + l), _MM_HINT_T1);
            if ((b & 1) == 0) _mm_prefetch((const char *)(hd + (layout == 0 ? 256 : 4096)), _MM_HINT_T1);
        }
        __m512i s0 = _mm512_setzero_si512(), s1 = s0;
        for (int g = 0; g < 8; g += 2) {
            int32_t v0, v1;
            memcpy(&v0, aq + 32 * b + 4 * g, 4);
            memcpy(&v1, aq + 32 * b + 4 * g + 4, 4);
            s0 = _mm512_dpbusd_epi32(s0, _mm512_load_si512((const void *)(pb + 64 * g)), _mm512_set1_epi32(v0));
            s1 = _mm512_dpbusd_epi32(s1, _mm512_load_si512((const void *)(pb + 64 * g + 64)), _mm512_set1_epi32(v1));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)hd));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(dw, _mm512_set1_ps(ad[b])), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

KV_SIMD_TARGET_END

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni") ||
        !__builtin_cpu_supports("avx512bw")) {
        printf("panel_stream: needs AVX-512 VNNI; nothing measured\n");
        return 0;
    }
    long mib = argc > 1 ? atol(argv[1]) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (mib < 8 || mib > 4096 || reps < 1 || reps > 51) {
        fprintf(stderr, "usage: panel_stream [MiB 8..4096 (256)] [reps 1..51 (5)]\n");
        return 2;
    }
    const size_t np = ((size_t)mib << 20) / PANEL, bytes = np * PANEL;
    uint8_t *buf = aligned_alloc(64, (bytes + 8192 + 63) & ~(size_t)63);
    if (!buf) {
        fprintf(stderr, "panel_stream: cannot allocate %zu bytes\n", bytes);
        return 1;
    }
    memset(buf, 0x11, bytes + 8192); /* fp16 0x1111 scales, small quants: finite sums */
    int8_t aq[NB * 32];
    float ad[NB];
    for (int i = 0; i < NB * 32; i++) aq[i] = (int8_t)(i % 7 - 3);
    for (int i = 0; i < NB; i++) ad[i] = 1.0f / (float)(i + 1);
    static const char *names[] = {"plain sum of the bytes", "sum of the old layout's quant runs only",
                                  "old layout, no prefetch", "old layout, prefetch 4 KiB ahead (stop 25)",
                                  "pairs, no prefetch (stop 28, n = 1)", "pairs, prefetch 4 KiB ahead"};
    double gbs[6][51];
    volatile double sink = 0;
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 6; v++) {
            double t0 = now_s(), s = 0;
            if (v == 0)
                s = (double)sum_range(buf, bytes & ~(size_t)255);
            else if (v == 1)
                for (size_t p = 0; p < np; p++) s += (double)sum_range(buf + p * PANEL + 32 * NB, 512 * NB);
            else
                for (size_t p = 0; p < np; p++) s += panel(buf + p * PANEL, aq, ad, v >= 4, v == 3 || v == 5);
            sink += s;
            gbs[v][r] = (double)bytes / (now_s() - t0) / 1e9;
        }
    printf("panel_stream: 1 thread, %zu MiB of 16-row q8_0 panels (K = 768), median of %d\n", bytes >> 20, reps);
    for (int v = 0; v < 6; v++) {
        qsort(gbs[v], (size_t)reps, sizeof(double), cmp_d);
        printf("  %-44s %6.1f GB/s\n", names[v], gbs[v][reps / 2]);
    }
    free(buf);
    return sink == 12345.0; /* keeps the sums live */
}

#else
int main(void) {
    printf("panel_stream: x86-64 only; nothing measured\n");
    return 0;
}
#endif
