/* test_arch_ops.c - the backend ops the architectures past llama use
 * (gelu_mul, scale, add_rows, rope_ext), on fresh random data: the cpu
 * backend against double-precision references and its scalar reference,
 * on 1 and 2 threads (sizes that split across the pool), and the sim
 * backend, which must give the cpu's bits. attention_window is tested
 * with the other attention kernels (test_attention.c). */
#include <math.h>
#include <string.h>

#include "../../kernels/backend.h"
#include "../../kernels/cpu.h"
#include "../backend_helpers.h"
#include "../harness.h"

enum { N_BIG = 300000 }; /* above the cpu's parallel threshold */

static double max_rel(const float *a, const double *ref, size_t n, double floor_) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / fmax(fabs(ref[i]), floor_);
        if (!(e <= worst)) worst = e; /* NaN counts as worst */
    }
    return worst;
}

static kv_backend *backend(const char *name, int threads) {
    kv_err err;
    kv_backend *b = kv_backend_create(name, threads, &err);
    if (!b) fprintf(stderr, "  %s backend: %s\n", name, err.msg);
    return b;
}

/* gelu_mul against 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) * u in
 * double, inputs over [-12, 12] (both tails): the scalar reference and
 * the cpu backend at every ISA within 2e-6 (relative, floor 1e-3); at the
 * scalar ISA the op is the reference bit for bit; every thread count and
 * the sim backend give the cpu's bits; and an element's bits do not depend
 * on where it sits in the range (offsets 1..7 move it across the SIMD
 * width and into the tail). */
static void test_gelu_mul(void) {
    float *g = malloc(N_BIG * sizeof(float)), *u = malloc(N_BIG * sizeof(float)), *o = malloc(N_BIG * sizeof(float));
    float *r = malloc(N_BIG * sizeof(float)), *best = malloc(N_BIG * sizeof(float));
    double *ref = malloc(N_BIG * sizeof(double));
    REQUIRE(g && u && o && r && best && ref);
    harness_fill_rand(g, N_BIG, 12.0f);
    harness_fill_rand(u, N_BIG, 2.0f);
    for (size_t i = 0; i < N_BIG; i++) {
        double x = g[i];
        ref[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    }
    memcpy(r, g, N_BIG * sizeof(float));
    kv_gelu_mul_ref(r, u, N_BIG);
    double e = max_rel(r, ref, N_BIG, 1e-3);
    CHECKF(e < 2e-6, "scalar reference: max relative error %.3g", e);
    kv_backend *b1 = backend("cpu", 1);
    REQUIRE(b1);
    for (int isa = 0; isa < KV_CPU_ISA_COUNT; isa++) {
        if (kv_cpu_set_isa(b1, (kv_cpu_isa)isa) != 0) continue;
        memcpy(o, g, N_BIG * sizeof(float));
        b1->ops->gelu_mul(b1, o, u, N_BIG);
        e = max_rel(o, ref, N_BIG, 1e-3);
        CHECKF(e < 2e-6, "cpu isa %s: max relative error %.3g", kv_cpu_isa_name((kv_cpu_isa)isa), e);
        if (isa == KV_CPU_ISA_SCALAR)
            CHECKF(memcmp(o, r, N_BIG * sizeof(float)) == 0, "scalar ISA differs from kv_gelu_mul_ref");
        for (int off = 1; off < 8; off++) { /* the first 37 + off elements, shifted by off */
            float gs[64], us[64];
            memcpy(gs + off, g, 37 * sizeof(float));
            memcpy(us + off, u, 37 * sizeof(float));
            b1->ops->gelu_mul(b1, gs, us, 37 + off);
            CHECKF(memcmp(gs + off, o, 37 * sizeof(float)) == 0, "isa %s: offset %d changes the bits",
                   kv_cpu_isa_name((kv_cpu_isa)isa), off);
        }
    }
    kv_backend_free(b1);
    b1 = backend("cpu", 1);
    REQUIRE(b1);
    memcpy(best, g, N_BIG * sizeof(float));
    b1->ops->gelu_mul(b1, best, u, N_BIG); /* the best ISA here */
    kv_backend_free(b1);
    static const char *names[] = {"cpu", "sim"};
    for (int k = 0; k < 2; k++) {
        kv_backend *b = backend(names[k], 2);
        if (!b) continue;
        REQUIRE(b->ops->gelu_mul);
        memcpy(o, g, N_BIG * sizeof(float));
        b->ops->gelu_mul(b, o, u, N_BIG);
        CHECKF(memcmp(o, best, N_BIG * sizeof(float)) == 0, "%s, %d threads: differs from the cpu on 1 thread",
               names[k], b->n_threads);
        CHECK(kv_backend_status(b, NULL) == 0);
        kv_backend_free(b);
    }
    FREE_ALL(g, u, o, r, best, ref);
}

/* scale and add_rows: exact float arithmetic, so bit-equal to the loop. */
static void test_scale_add_rows(void) {
    const int n = 1200, dim = 320; /* 384000 elements: parallel */
    float *x = malloc((size_t)n * dim * sizeof(float)), *y = malloc((size_t)n * dim * sizeof(float));
    float *ref = malloc((size_t)n * dim * sizeof(float)), bias[320];
    REQUIRE(x && y && ref);
    harness_fill_rand(x, (size_t)n * dim, 3.0f);
    harness_fill_rand(bias, (size_t)dim, 1.0f);
    static const char *names[] = {"cpu", "cpu", "sim"};
    for (int k = 0; k < 3; k++) {
        kv_backend *b = backend(names[k], 1 + (k == 1));
        if (!b) continue;
        memcpy(y, x, (size_t)n * dim * sizeof(float));
        b->ops->scale(b, y, 25.298221f, (int64_t)n * dim);
        for (size_t i = 0; i < (size_t)n * dim; i++) ref[i] = x[i] * 25.298221f;
        CHECKF(memcmp(y, ref, (size_t)n * dim * sizeof(float)) == 0, "%s scale", names[k]);
        memcpy(y, x, (size_t)n * dim * sizeof(float));
        b->ops->add_rows(b, y, bias, n, dim);
        for (int i = 0; i < n; i++)
            for (int c = 0; c < dim; c++) ref[(size_t)i * dim + c] = x[(size_t)i * dim + c] + bias[c];
        CHECKF(memcmp(y, ref, (size_t)n * dim * sizeof(float)) == 0, "%s add_rows", names[k]);
        CHECK(kv_backend_status(b, NULL) == 0);
        kv_backend_free(b);
    }
    FREE_ALL(x, y, ref);
}

/* rope_ext against the rotation in double with angle p * freq_scale *
 * base^(-2i/rot) / ff[i], both layouts, a partial rotation (rot < head);
 * without factors and scale 1 it is the plain rope op bit for bit. */
static void test_rope_ext(void) {
    enum { T = 40, H = 3, HD = 64, ROT = 48 };
    float x[T * H * HD], y[T * H * HD], z[T * H * HD], ff[ROT / 2];
    double ref[T * H * HD];
    int32_t pos[T];
    for (int t = 0; t < T; t++) pos[t] = (int32_t)(harness_rand64() % 9000);
    for (int i = 0; i < ROT / 2; i++) ff[i] = 1.0f + 7.0f * (float)i / (ROT / 2); /* 1 .. 8 */
    static const char *names[] = {"cpu", "sim"};
    for (int k = 0; k < 2; k++)
        for (int neox = 0; neox <= 1; neox++) {
            kv_backend *b = backend(names[k], 2);
            if (!b) continue;
            harness_fill_rand(x, T * H * HD, 1.0f);
            const float base = 500000.0f, fs = 0.25f;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    const float *v = x + ((size_t)t * H + h) * HD;
                    double *o = ref + ((size_t)t * H + h) * HD;
                    for (int e = 0; e < HD; e++) o[e] = v[e];
                    for (int i = 0; i < ROT / 2; i++) {
                        double th = pos[t] * (double)fs * pow(base, -2.0 * i / ROT) / ff[i];
                        int a = neox ? i : 2 * i, c = neox ? i + ROT / 2 : 2 * i + 1;
                        o[a] = v[a] * cos(th) - v[c] * sin(th);
                        o[c] = v[a] * sin(th) + v[c] * cos(th);
                    }
                }
            memcpy(y, x, sizeof x);
            b->ops->rope_ext(b, y, pos, T, H, HD, ROT, base, neox, fs, ff);
            double worst = 0.0;
            for (size_t i = 0; i < T * H * HD; i++) worst = fmax(worst, fabs(y[i] - ref[i]));
            /* float angles of positions up to 9000: a few ulps of 9000 rad */
            CHECKF(worst < 5e-3, "%s neox %d: max abs error %.3g", names[k], neox, worst);
            memcpy(y, x, sizeof x);
            memcpy(z, x, sizeof x);
            b->ops->rope_ext(b, y, pos, T, H, HD, ROT, 10000.0f, neox, 1.0f, NULL);
            b->ops->rope(b, z, pos, T, H, HD, ROT, 10000.0f, neox);
            CHECKF(memcmp(y, z, sizeof y) == 0, "%s neox %d: rope_ext without scaling differs from rope", names[k],
                   neox);
            /* a bad scale is refused, x untouched */
            memcpy(y, x, sizeof x);
            b->ops->rope_ext(b, y, pos, T, H, HD, ROT, 10000.0f, neox, 0.0f, NULL);
            CHECK(memcmp(y, x, sizeof y) == 0);
            CHECK(kv_backend_status(b, NULL) == KV_ERR_BACKEND);
            kv_backend_free(b);
        }
}

TEST_MAIN(T(test_gelu_mul), T(test_scale_add_rows), T(test_rope_ext))
