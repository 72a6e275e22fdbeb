/* test_attention_q8.c - the integer int8 path of the attention scores
 * (int8 keys against query rows quantized to int8, kv_attn_scores_q8): on
 * fresh random data, head_dims 1..130 (64 and 128 often: the 16-key AVX-512
 * kernel) and the largest, 1..9 query rows, 1..37
 * keys at a stride with gaps, every ISA that has the path (AVX2: vpmaddubsw
 * with the sign trick; AVX-512: vpdpbusd) gives the scalar
 * reference's bits (the dot is exact in integers, the score one shared
 * formula), and the reference is within the query's rounding of the double
 * dot of the float query with the decoded keys (normalised error). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../../kernels/cpu_attention.h"
#include "../../kernels/kv_dtype.h"

static int rnd(int n) { return (int)(harness_rand64() % (uint64_t)n); }

static void test_q8_scores_match(void) {
    double worst = 0.0;
    int simd_runs = 0;
    for (int rep = 0; rep < 300; rep++) {
        const int hd = rep == 0 ? KV_ATTN_MAX_HEAD_DIM : rep % 3 == 0 ? 64 : rep % 5 == 0 ? 128 : 1 + rnd(130);
        const int nr = 1 + rnd(9), nt = 1 + rnd(37);
        const size_t rb = kv_cache_row_bytes(KV_CACHE_INT8, hd), stride = rb + (size_t)rnd(3) * 8;
        float *q = malloc(sizeof(float) * (size_t)nr * hd), *kf = malloc(sizeof(float) * (size_t)hd);
        float *kd = malloc(sizeof(float) * (size_t)nt * hd);
        uint8_t *rows = malloc(stride * (size_t)nt);
        float *s_ref = malloc(sizeof(float) * (size_t)nr * nt), *s = malloc(sizeof(float) * (size_t)nr * nt);
        double *exact = malloc(sizeof(double) * (size_t)nr * nt);
        float *ex = malloc(sizeof(float) * (size_t)nr * nt);
        /* query rows with a few large entries (the absmax sets their scale) */
        harness_fill_rand(q, (size_t)nr * hd, 1.0f);
        for (int r = 0; r < nr; r++) q[(size_t)r * hd + rnd(hd)] *= 4.0f;
        memset(rows, 0xa5, stride * (size_t)nt); /* gaps hold noise */
        for (int t = 0; t < nt; t++) {
            harness_fill_rand(kf, (size_t)hd, 2.0f);
            kv_dtype_encode_row(KV_CACHE_INT8, kf, rows + (size_t)t * stride, hd);
            kv_dtype_decode_row(KV_CACHE_INT8, rows + (size_t)t * stride, kd + (size_t)t * hd, hd);
        }
        const float scale = 0.125f;
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) {
                double d = 0.0;
                for (int i = 0; i < hd; i++) d += (double)q[(size_t)r * hd + i] * kd[(size_t)t * hd + i];
                exact[(size_t)r * nt + t] = d * scale;
                ex[(size_t)r * nt + t] = (float)(d * scale);
            }
        REQUIRE(kv_attn_scores_q8(KV_CPU_ISA_SCALAR, q, nr, hd, rows, stride, nt, scale, s_ref) == 0);
        const double e = harness_nerr(s_ref, ex, (size_t)nr * nt);
        worst = fmax(worst, e);
        /* int8 queries: a step of absmax / 127 per element, and the
         * outlier above makes it coarse; the attention output's error
         * from it is ~2e-3 (test_attention) */
        CHECKF(e < 3e-2, "hd %d rows %d keys %d: reference err %.3g vs the double dot", hd, nr, nt, e);
        for (int isa = KV_CPU_ISA_AVX2; isa < KV_CPU_ISA_COUNT; isa++) {
            if (!kv_cpu_isa_supported((kv_cpu_isa)isa) || !kv_attn_int8_integer((kv_cpu_isa)isa)) continue;
            for (int i = 0; i < nr * nt; i++) s[i] = NAN;
            CHECK(kv_attn_scores_q8((kv_cpu_isa)isa, q, nr, hd, rows, stride, nt, scale, s) == 0);
            CHECKF(!memcmp(s, s_ref, sizeof(float) * (size_t)nr * nt), "%s hd %d rows %d keys %d differs from the reference",
                   kv_cpu_isa_name((kv_cpu_isa)isa), hd, nr, nt);
            simd_runs++;
        }
        FREE_ALL(q, kf, kd, rows, s_ref, s, exact, ex);
    }
    printf("    worst normalised error of int8-query scores vs the double dot: %.2e; %d SIMD runs\n", worst,
           simd_runs);
    /* the path is the AVX2 and AVX-512 levels': a CPU with them must have run it */
    int levels = 0;
    for (int isa = KV_CPU_ISA_AVX2; isa < KV_CPU_ISA_COUNT; isa++) levels += kv_cpu_isa_supported((kv_cpu_isa)isa);
    CHECKF(simd_runs == 300 * levels, "%d SIMD runs for %d ISA levels", simd_runs, levels);
    CHECK(!kv_cpu_isa_supported(KV_CPU_ISA_AVX2) || kv_attn_int8_integer(KV_CPU_ISA_AVX2));
    CHECK(!kv_attn_int8_integer(KV_CPU_ISA_SCALAR));
}

static void test_q8_bad_args(void) {
    float q[4] = {1, 2, 3, 4}, s[4];
    uint8_t row[16] = {0};
    CHECK(kv_attn_scores_q8(KV_CPU_ISA_SCALAR, q, 1, 0, row, 8, 1, 1.0f, s) == -1);
    CHECK(kv_attn_scores_q8(KV_CPU_ISA_SCALAR, q, 1, KV_ATTN_MAX_HEAD_DIM + 1, row, 8, 1, 1.0f, s) == -1);
    CHECK(kv_attn_scores_q8(KV_CPU_ISA_SCALAR, q, -1, 4, row, 8, 1, 1.0f, s) == -1);
    /* zero keys: nothing written */
    s[0] = 7.0f;
    CHECK(kv_attn_scores_q8(KV_CPU_ISA_SCALAR, q, 1, 4, row, 8, 0, 1.0f, s) == 0 && s[0] == 7.0f);
}

TEST_MAIN(T(test_q8_scores_match), T(test_q8_bad_args))
