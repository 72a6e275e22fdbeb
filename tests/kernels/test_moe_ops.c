/* test_moe_ops.c - the mixture-of-experts ops (moe_route, scatter_add) on
 * fresh random data: the scalar references against double-precision ones
 * written here independently (a full sort for the top-k), and the cpu
 * backend (1 and 2 threads) and the sim backend, which must give the
 * scalar references' bits. */
#include <math.h>
#include <stdlib.h>

#include "../../kernels/backend.h"
#include "../../kernels/cpu_moe.h"
#include "../harness.h"

static kv_backend *backend(const char *name, int threads) {
    kv_err err;
    kv_backend *b = kv_backend_create(name, threads, &err);
    if (!b) fprintf(stderr, "  %s backend: %s\n", name, err.msg);
    return b;
}

typedef struct ranked {
    double z, p;
    int e;
} ranked;

/* logit down (the probability's order, without its underflow), expert up */
static int by_logit_then_index(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->z != y->z) return x->z > y->z ? -1 : 1;
    return x->e - y->e;
}

/* The routing of one row in double: softmax, a full sort (logit, that is
 * probability, down; expert index up), the first k, renormalised when norm. */
static void route_double(const float *lg, int E, int k, int norm, int *ids, double *w) {
    ranked r[512];
    double mx = lg[0], sum = 0.0;
    for (int e = 1; e < E; e++) mx = fmax(mx, lg[e]);
    for (int e = 0; e < E; e++) sum += exp((double)lg[e] - mx);
    for (int e = 0; e < E; e++) r[e] = (ranked){lg[e], exp((double)lg[e] - mx) / sum, e};
    qsort(r, (size_t)E, sizeof *r, by_logit_then_index);
    double s = 0.0;
    for (int j = 0; j < k; j++) {
        ids[j] = r[j].e;
        w[j] = r[j].p;
        s += r[j].p;
    }
    for (int j = 0; norm && j < k; j++) w[j] /= fmax(s, 6.103515625e-5);
}

/* Rows of random logits (some with repeated values: ties go to the lower
 * expert), several expert counts and k, with and without renormalising. */
static void test_moe_route(void) {
    static const int shapes[][2] = {{1, 1}, {8, 2}, {8, 8}, {60, 4}, {128, 8}, {256, 1}};
    enum { N = 97 };
    static const char *names[] = {"cpu", "cpu", "sim"};
    for (size_t s = 0; s < KV_ARRAY_LEN(shapes); s++) {
        const int E = shapes[s][0], k = shapes[s][1];
        float *lg = malloc((size_t)N * E * sizeof(float)), *w = malloc((size_t)N * k * sizeof(float));
        float *w2 = malloc((size_t)N * k * sizeof(float));
        int32_t *ids = malloc((size_t)N * k * sizeof(int32_t)), *ids2 = malloc((size_t)N * k * sizeof(int32_t));
        REQUIRE(lg && w && w2 && ids && ids2);
        harness_fill_rand(lg, (size_t)N * E, 6.0f);
        for (int i = 0; i < N; i += 5) /* ties: a row of few distinct values */
            for (int e = 0; e < E; e++) lg[(size_t)i * E + e] = (float)((e * 7) % 3);
        for (int i = 3; i < N; i += 11) /* large logits: the softmax must not overflow */
            for (int e = 0; e < E; e++) lg[(size_t)i * E + e] *= 4000.0f;
        for (int norm = 0; norm < 2; norm++) {
            double worst = 0.0;
            int ids_ok = 1;
            for (int i = 0; i < N; i++) {
                int rid[256];
                double rw[256];
                route_double(lg + (size_t)i * E, E, k, norm, rid, rw);
                kv_moe_route_row_ref(lg + (size_t)i * E, E, k, norm, ids + (size_t)i * k, w + (size_t)i * k);
                for (int j = 0; j < k; j++) {
                    if (ids_ok && ids[(size_t)i * k + j] != rid[j])
                        fprintf(stderr, "  row %d slot %d: expert %d (logit %g), sorted order %d (logit %g)\n", i, j,
                                ids[(size_t)i * k + j], lg[(size_t)i * E + ids[(size_t)i * k + j]], rid[j],
                                lg[(size_t)i * E + rid[j]]);
                    ids_ok = ids_ok && ids[(size_t)i * k + j] == rid[j];
                    double e = fabs(w[(size_t)i * k + j] - rw[j]) / fmax(rw[j], 1e-6); /* below 1e-6: underflow */
                    if (!(e <= worst)) worst = e;
                }
            }
            CHECKF(ids_ok, "E %d k %d norm %d: scalar reference picks other experts than the sorted order", E, k,
                   norm);
            CHECKF(worst < 1e-5, "E %d k %d norm %d: weights off by %.3g (relative)", E, k, norm, worst);
            for (int bk = 0; bk < 3; bk++) {
                kv_backend *b = backend(names[bk], 1 + (bk == 1));
                if (!b) continue;
                REQUIRE(b->ops->moe_route);
                b->ops->moe_route(b, lg, N, E, k, norm, ids2, w2);
                CHECKF(!memcmp(ids, ids2, (size_t)N * k * sizeof(int32_t)) &&
                           !memcmp(w, w2, (size_t)N * k * sizeof(float)),
                       "%s, %d threads, E %d k %d: differs from the scalar reference", names[bk], b->n_threads, E, k);
                CHECK(kv_backend_status(b, NULL) == 0);
                kv_backend_free(b);
            }
        }
        FREE_ALL(lg, w, w2, ids, ids2);
    }
}

/* scatter_add of an expert's rows into a random subset of the tokens, by
 * normalised error against double, and bit-equal to the reference on
 * every backend. */
static void test_scatter_add(void) {
    enum { T = 300, N = 120, D = 200 };
    float *x = malloc((size_t)T * D * sizeof(float)), *y = malloc((size_t)N * D * sizeof(float));
    float *xr = malloc((size_t)T * D * sizeof(float)), *xb = malloc((size_t)T * D * sizeof(float)), w[N];
    double *ref = malloc((size_t)T * D * sizeof(double));
    int32_t rows[N], perm[T];
    REQUIRE(x && y && xr && xb && ref);
    harness_fill_rand(x, (size_t)T * D, 2.0f);
    harness_fill_rand(y, (size_t)N * D, 3.0f);
    harness_fill_rand(w, N, 1.0f);
    for (int i = 0; i < T; i++) perm[i] = i;
    for (int i = T - 1; i > 0; i--) { /* distinct rows in random order */
        int j = (int)(harness_rand64() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(rows, perm, sizeof rows);
    for (size_t i = 0; i < (size_t)T * D; i++) ref[i] = x[i];
    for (int i = 0; i < N; i++)
        for (int d = 0; d < D; d++) ref[(size_t)rows[i] * D + d] += (double)w[i] * y[(size_t)i * D + d];
    memcpy(xr, x, (size_t)T * D * sizeof(float));
    kv_scatter_add_ref(xr, y, rows, w, N, D);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < (size_t)T * D; i++) {
        num += (xr[i] - ref[i]) * (xr[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    CHECKF(sqrt(num / den) < 1e-6, "scalar reference: normalised error %.3g", sqrt(num / den));
    static const char *names[] = {"cpu", "cpu", "sim"};
    for (int bk = 0; bk < 3; bk++) {
        kv_backend *b = backend(names[bk], 1 + (bk == 1));
        if (!b) continue;
        REQUIRE(b->ops->scatter_add);
        memcpy(xb, x, (size_t)T * D * sizeof(float));
        b->ops->scatter_add(b, xb, y, rows, w, N, D);
        CHECKF(!memcmp(xb, xr, (size_t)T * D * sizeof(float)), "%s: differs from the scalar reference", names[bk]);
        kv_backend_free(b);
    }
    FREE_ALL(x, y, xr, xb, ref);
}

TEST_MAIN(T(test_moe_route), T(test_scatter_add))
