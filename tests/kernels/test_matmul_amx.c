/* test_matmul_amx.c - the AMX-INT8 path of the batched quantized matmul
 * (kernels/matmul_amx.c) against the AVX-512 kernels it stands in for, bit
 * for bit, and against the scalar reference by normalised error: q8_0,
 * q4_0 and q4_1 weights, full and partial 16-row panels, K from one block
 * to many, batches with and without a tail past the last full group of 16
 * rows (a group of the tiles with its missing rows zero; the tiles take
 * q8_0 from 8 rows, q4 from 32),
 * 1 and 2 threads, fresh random data each run (the seed is printed), with
 * activation rows of very different magnitudes. Skipped where the CPU or
 * the OS gives no AMX tiles. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "../../kernels/backend.h"
#include "../../kernels/cpu.h"
#include "../../kernels/matmul.h"
#include "../backend_helpers.h"
#include "../harness.h"

enum { MAXN = 80, MAXK = 800 };

static kv_backend *make(int threads) { return test_backend_for_rows("cpu", threads, MAXN, MAXK); }

static int amx_here(void) {
    if (kv_cpu_amx_supported()) return 1;
    printf("  (skipped: this CPU or OS has no AMX-INT8 tiles)\n");
    return 0;
}


/* x: n rows of K, row j scaled by 10^(j % 7 - 3) so blocks differ widely. */
static void fill_x(float *x, int n, int64_t K) {
    harness_fill_rand(x, (size_t)n * (size_t)K, 1.0f);
    for (int j = 0; j < n; j++) {
        float s = powf(10.0f, (float)(j % 7 - 3));
        for (int64_t k = 0; k < K; k++) x[(size_t)j * K + k] *= s;
    }
}


static void test_amx_same_bits(void) {
    if (!amx_here()) return;
    harness_seed_fresh();
    kv_backend *bs[2] = {make(1), make(2)};
    REQUIRE(bs[0] && bs[1]);
    const kv_type types[] = {KV_TYPE_Q8_0, KV_TYPE_Q4_0, KV_TYPE_Q4_1};
    const int64_t Ks[] = {32, 256, 800};
    const int Ms[] = {16, 37, 300};
    const int ns[] = {8, 9, 13, 16, 17, 31, 32, 33, 48, 65, 80};
    float *x = malloc((size_t)MAXN * MAXK * sizeof(float));
    float *y0 = malloc((size_t)MAXN * 300 * sizeof(float)), *y1 = malloc((size_t)MAXN * 300 * sizeof(float));
    float *yr = malloc((size_t)MAXN * 300 * sizeof(float));
    REQUIRE(x && y0 && y1 && yr);
    const int was = kv_mm_amx_on();
    int cases = 0;
    for (size_t ti = 0; ti < KV_ARRAY_LEN(types); ti++)
        for (size_t ki = 0; ki < KV_ARRAY_LEN(Ks); ki++)
            for (size_t mi = 0; mi < KV_ARRAY_LEN(Ms); mi++) {
                const int64_t K = Ks[ki];
                const int M = Ms[mi];
                void *owned = NULL;
                kv_tensor w = test_make_weight(types[ti], M, (int)K, &owned);
                REQUIRE(owned);
                for (size_t ni = 0; ni < KV_ARRAY_LEN(ns); ni++) {
                    const int n = ns[ni];
                    fill_x(x, n, K);
                    kv_backend *b = bs[(ni + mi) % 2];
                    kv_mm_amx_set(0);
                    kv_cpu_matmul_isa(b, KV_CPU_ISA_AVX512, &w, x, y0, n);
                    kv_mm_amx_set(1);
                    kv_cpu_matmul_isa(b, KV_CPU_ISA_AVX512, &w, x, y1, n);
                    kv_cpu_matmul_isa(b, KV_CPU_ISA_SCALAR, &w, x, yr, n);
                    const size_t cnt = (size_t)n * (size_t)M;
                    size_t bad = 0;
                    while (bad < cnt && !memcmp(&y0[bad], &y1[bad], sizeof(float))) bad++;
                    CHECKF(bad == cnt, "%s K=%lld M=%d n=%d: output %zu (row %zu, col %zu) amx %.9g, avx512 %.9g",
                           kv_type_name((int)types[ti]), (long long)K, M, n, bad, bad / (size_t)M, bad % (size_t)M,
                           bad < cnt ? y1[bad] : 0.0, bad < cnt ? y0[bad] : 0.0);
                    /* the scalar reference sums blocks in the same order; the
                     * SIMD kernels' fma differs from its separate rounding */
                    for (int j = 0; j < n; j++) {
                        double e = harness_nerr(y1 + (size_t)j * M, yr + (size_t)j * M, (size_t)M);
                        CHECKF(e < 1e-5, "%s K=%lld M=%d n=%d row %d: normalised error %.3g vs the scalar reference",
                               kv_type_name((int)types[ti]), (long long)K, M, n, j, e);
                        if (e >= 1e-5) break;
                    }
                    cases++;
                }
                free(owned);
            }
    kv_mm_amx_set(was);
    printf("  %d cases, AMX and AVX-512 bit-identical\n", cases);
    FREE_ALL(x, y0, y1, yr);
    kv_backend_free(bs[0]);
    kv_backend_free(bs[1]);
}

/* The switch: off makes kv_mm_amx_on 0, on restores it (where supported),
 * and a batch's result is the same either way with NaN blocks in x. */
static void test_amx_switch_and_nan(void) {
    if (!amx_here()) return;
    harness_seed_fresh();
    kv_backend *b = make(2);
    REQUIRE(b);
    const int was = kv_mm_amx_set(0);
    CHECK(kv_mm_amx_on() == 0);
    kv_mm_amx_set(1);
    CHECK(kv_mm_amx_on() == 1);
    enum { M = 48, KK = 256, N = 32 };
    void *owned = NULL;
    kv_tensor w = test_make_weight(KV_TYPE_Q8_0, M, KK, &owned);
    float *x = malloc((size_t)N * KK * sizeof(float)), *y0 = malloc((size_t)N * M * sizeof(float)),
          *y1 = malloc((size_t)N * M * sizeof(float));
    REQUIRE(owned && x && y0 && y1);
    fill_x(x, N, KK);
    x[5 * KK + 40] = NAN; /* row 5, block 1 */
    x[20 * KK + 3] = INFINITY;
    kv_mm_amx_set(0);
    kv_cpu_matmul(b, &w, x, y0, N);
    kv_mm_amx_set(1);
    kv_cpu_matmul(b, &w, x, y1, N);
    int agree = 1;
    for (int i = 0; i < N * M && agree; i++)
        agree = isnan(y0[i]) ? isnan(y1[i]) : !memcmp(&y0[i], &y1[i], sizeof(float));
    CHECK(agree);
    CHECK(isnan(y1[5 * M]) && isnan(y1[20 * M + 7]) && !isnan(y1[6 * M]));
    kv_mm_amx_set(was);
    FREE_ALL(owned, x, y0, y1);
    kv_backend_free(b);
}

TEST_MAIN(T(test_amx_same_bits), T(test_amx_switch_and_nan))
