/* test_matmul_f.c - the AVX-512 float-weight kernels (matmul_f_avx512.c:
 * decode tiles 16 x 1 and 8 x 2, batched 4 x 6 tiles with K split in
 * chunks past 1024) against a scalar emulation of the arithmetic they
 * document, bit for bit: lane l of a 16-lane fp32 accumulator sums
 * w[k] * x[k] over k = l, l + 16, ... with one fma each, then the lanes
 * are added l + 8, + 4, + 2, + 1. Also against the double-precision
 * reference by normalised error. f32, f16 and bf16 weights; odd shapes
 * (K below 16, tails past the last 16-step, K past the chunk size, partial
 * row tiles); n = 1, 2 and batched; 1 and 2 threads; fresh random data
 * each run (the seed is printed). The reference check bounds each output's
 * error by the fp32 sum's own bound, (K / 16 + 5) eps sum |w x|, not by a
 * normalised error: a single output of a short row can cancel. Skips the
 * bit checks on CPUs without AVX-512 (the ISA is then never picked). */
#include <math.h>
#include <string.h>
#include <time.h>

#include "../../kernels/backend.h"
#include "../../kernels/cpu.h"
#include "../../kernels/types.h"
#include "../backend_helpers.h"
#include "../harness.h"

enum { MAXN = 13, MAXK = 2100 };

static kv_backend *make(int threads) { return test_backend_for_rows("cpu", threads, MAXN, MAXK); }

/* The documented arithmetic of one output, in scalar C (fmaf is fused). */
static float lane_dot(const float *w, const float *x, int64_t K) {
    float acc[16] = {0};
    for (int64_t k = 0; k < K; k++) acc[k % 16] = fmaf(w[k], x[k], acc[k % 16]);
    for (int h = 8; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) acc[l] = acc[l] + acc[l + h];
    return acc[0];
}

/* The largest |y - ref| / ((K / 16 + 5) eps sum_k |w x|) over n x M. */
static double bound_ratio(const float *y, const float *ref, const float *wf, const float *x, int64_t K, int64_t M,
                          int n) {
    double worst = 0;
    for (int j = 0; j < n; j++)
        for (int64_t r = 0; r < M; r++) {
            double mag = 0;
            for (int64_t k = 0; k < K; k++) mag += fabs((double)wf[r * K + k] * x[(size_t)j * K + k]);
            double lim = ((double)K / 16 + 5) * 1.2e-7 * mag + 1e-30;
            double e = fabs((double)y[(size_t)j * M + r] - ref[(size_t)j * M + r]) / lim;
            if (!(e <= worst)) worst = e; /* NaN counts as the worst */
        }
    return worst;
}

/* Weights of type t from random floats; wf gets the values the kernel
 * sees (after rounding to t). Returns the row bytes (NULL: no memory). */
static uint8_t *make_w(kv_type t, int64_t M, int64_t K, float *wf, kv_tensor *w) {
    size_t es = t == KV_TYPE_F32 ? 4 : 2;
    uint8_t *d = malloc((size_t)M * (size_t)K * es + 64);
    if (!d) return NULL;
    harness_fill_rand(wf, (size_t)(M * K), 1.0f);
    for (int64_t i = 0; i < M * K; i++) {
        if (t == KV_TYPE_F32) {
            memcpy(d + 4 * i, &wf[i], 4);
            continue;
        }
        uint16_t h = t == KV_TYPE_F16 ? kv_fp32_to_fp16(wf[i]) : kv_fp32_to_bf16(wf[i]);
        memcpy(d + 2 * i, &h, 2);
        wf[i] = t == KV_TYPE_F16 ? kv_fp16_to_fp32(h) : kv_bf16_to_fp32(h);
    }
    *w = (kv_tensor){.type = t, .ne0 = K, .ne1 = M, .nb1 = (size_t)K * es, .data = d};
    return d;
}

static void test_float_lane_order(void) {
    uint64_t s = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
    *harness_rng() = s ? s : 1;
    printf("  seed %llu\n", (unsigned long long)*harness_rng());
    kv_backend *bs[2] = {make(1), make(2)};
    REQUIRE(bs[0] && bs[1]);
    const kv_type types[] = {KV_TYPE_F32, KV_TYPE_F16, KV_TYPE_BF16};
    const int64_t Ks[] = {1, 7, 16, 33, 300, 1040, 2061};
    const int64_t Ms[] = {1, 5, 19, 70};
    const int ns[] = {1, 2, 3, 6, 7, 13};
    int have512 = kv_cpu_isa_supported(KV_CPU_ISA_AVX512);
    if (!have512) printf("  no AVX-512 here: bit checks skipped, reference checks only\n");
    for (size_t ti = 0; ti < KV_ARRAY_LEN(types); ti++)
        for (size_t ki = 0; ki < KV_ARRAY_LEN(Ks); ki++)
            for (size_t mi = 0; mi < KV_ARRAY_LEN(Ms); mi++) {
                kv_type t = types[ti];
                int64_t K = Ks[ki], M = Ms[mi];
                float *wf = malloc((size_t)(M * K) * 4), *x = malloc((size_t)MAXN * K * 4);
                float *y = malloc((size_t)MAXN * M * 4), *ref = malloc((size_t)MAXN * M * 4);
                kv_tensor w;
                uint8_t *d = wf ? make_w(t, M, K, wf, &w) : NULL;
                REQUIRE(d && x && y && ref);
                harness_fill_rand(x, (size_t)MAXN * K, 2.0f);
                for (size_t ni = 0; ni < KV_ARRAY_LEN(ns); ni++) {
                    int n = ns[ni];
                    REQUIRE(kv_cpu_matmul_ref(&w, x, ref, n) == 0);
                    for (int th = 0; th < 2; th++)
                        for (int isa = 0; isa < KV_CPU_ISA_COUNT; isa++) {
                            if (!kv_cpu_isa_supported((kv_cpu_isa)isa)) continue;
                            for (size_t i = 0; i < (size_t)n * M; i++) y[i] = NAN;
                            kv_cpu_matmul_isa(bs[th], (kv_cpu_isa)isa, &w, x, y, n);
                            double e = bound_ratio(y, ref, wf, x, K, M, n);
                            CHECKF(e <= 1, "%s isa=%s K=%lld M=%lld n=%d threads=%d: error %.3g x the bound", kv_type_name(t),
                                   kv_cpu_isa_name((kv_cpu_isa)isa), (long long)K, (long long)M, n, th + 1, e);
                            if (isa != KV_CPU_ISA_AVX512) continue;
                            int bad = 0;
                            for (int j = 0; j < n && !bad; j++)
                                for (int64_t r = 0; r < M && !bad; r++) {
                                    float want = lane_dot(wf + r * K, x + (size_t)j * K, K);
                                    float got = y[(size_t)j * M + r];
                                    if (memcmp(&want, &got, 4) != 0) {
                                        CHECKF(0, "%s K=%lld M=%lld n=%d threads=%d: y[%d][%lld] = %.9g, lane order %.9g",
                                               kv_type_name(t), (long long)K, (long long)M, n, th + 1, j, (long long)r,
                                               got, want);
                                        bad = 1;
                                    }
                                }
                        }
                }
                FREE_ALL(wf, x, y, ref, d);
            }
    kv_backend_free(bs[0]);
    kv_backend_free(bs[1]);
}

TEST_MAIN(T(test_float_lane_order))
