/* test_sampler.c - the sampler's distribution pipeline and determinism:
 * greedy, temperature, top-k, top-p, min-p, repetition penalty, seeds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/sampler.h"
#include "../../kernels/backend.h"
#include "../../kernels/cpu.h"
#include "../harness.h"

static kv_sampling base(void) {
    return (kv_sampling){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.0f,
                         .repeat_last_n = 64, .seed = 1};
}

static void test_greedy(void) {
    float l[6] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    CHECK(kv_argmax(l, 6) == 1); /* lowest index on ties */
    kv_sampler *s = kv_sampler_new(6);
    REQUIRE(s);
    kv_sampling p = base();
    p.temperature = 0;
    kv_rng r;
    kv_rng_seed(&r, 3);
    CHECK(kv_sampler_sample(s, &p, l, NULL, 0, &r) == 1);
    float probs[6];
    kv_sampler_dist(s, &p, l, NULL, 0, probs);
    CHECK(probs[1] == 1.0f && probs[3] == 0.0f);
    /* the repetition penalty moves greedy away from a repeated token */
    p.repeat_penalty = 2.0f;
    int32_t hist[] = {1};
    CHECK(kv_sampler_sample(s, &p, l, hist, 1, &r) == 3);
    kv_sampler_free(s);
}

/* kv_argmax against the plain first-index scan: random rows of lengths
 * around its 64-blocks, ties, NaNs (never taken, except at index 0), -inf. */
static int32_t argmax_plain(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_argmax_blocks(void) {
    const int lens[] = {1, 2, 63, 64, 65, 127, 128, 129, 1000, 32000};
    float *x = malloc(32000 * sizeof *x);
    REQUIRE(x);
    int bad = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int trial = 0; trial < 40 && !bad; trial++) {
            const int n = lens[li];
            for (int i = 0; i < n; i++) x[i] = (float)(rand() % 50) - 25.0f; /* many ties */
            if (trial % 4 == 1) x[rand() % n] = NAN;
            if (trial % 4 == 2) x[0] = NAN;
            if (trial % 4 == 3)
                for (int i = 0; i < n; i++) x[i] = -INFINITY;
            int32_t want = isnan(x[0]) ? 0 : argmax_plain(x, n), got = kv_argmax(x, n);
            if (got != want) {
                CHECKF(0, "n %d trial %d: kv_argmax %d, the plain scan %d", n, trial, got, want);
                bad = 1;
            }
        }
    free(x);
}

/* The cpu backend's logits_scan (several rows at once, on its threads, its
 * SIMD lanes and their tail) and its scalar reference give kv_argmax's
 * index and the finiteness of every row: ties, NaN (never taken; at 0 it
 * stays the answer), Inf, -inf rows, signed zeros, lengths around the
 * 8-lane vectors and 64-blocks. */
static void test_logits_scan(void) {
    kv_err err;
    kv_backend *b = kv_backend_create("cpu", 2, &err);
    REQUIRE(b && b->ops->logits_scan && b->ops->host_buffers);
    const int lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 32000};
    enum { ROWS = 5 };
    float *x = malloc((size_t)ROWS * 32000 * sizeof *x);
    int32_t ids[ROWS];
    uint8_t fin[ROWS];
    REQUIRE(x);
    int bad = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0] && !bad; li++)
        for (int trial = 0; trial < 24 && !bad; trial++) {
            const int n = lens[li];
            for (int r = 0; r < ROWS; r++) {
                float *row = x + (size_t)r * n;
                const int kind = (trial + r) % 6;
                for (int i = 0; i < n; i++) row[i] = kind == 5 ? (rand() % 2 ? 0.0f : -0.0f) : (float)(rand() % 50) - 25.0f;
                if (kind == 1) row[rand() % n] = NAN;
                if (kind == 2) row[0] = NAN;
                if (kind == 3)
                    for (int i = 0; i < n; i++) row[i] = -INFINITY;
                if (kind == 4) row[rand() % n] = rand() % 2 ? INFINITY : -INFINITY;
            }
            b->ops->logits_scan(b, x, ROWS, n, ids, fin);
            for (int r = 0; r < ROWS && !bad; r++) {
                const float *row = x + (size_t)r * n;
                int finite = 1;
                for (int i = 0; i < n; i++) finite &= isfinite(row[i]) != 0;
                uint8_t ref_fin;
                const int32_t want = kv_argmax(row, n), ref = kv_logits_scan_row_ref(row, n, &ref_fin);
                if (ids[r] != want || fin[r] != finite || ref != want || ref_fin != finite) {
                    CHECKF(0, "n %d trial %d row %d: scan %d (finite %d), reference %d (%d), kv_argmax %d (%d)", n,
                           trial, r, ids[r], fin[r], ref, ref_fin, want, finite);
                    bad = 1;
                }
            }
        }
    free(x);
    kv_backend_free(b);
}

static void test_dist_filters(void) {
    enum { N = 8 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)(N - i); /* token 0 most likely */
    kv_sampler *s = kv_sampler_new(N);
    REQUIRE(s);
    float p[N];
    kv_sampling sp = base();
    kv_sampler_dist(s, &sp, l, NULL, 0, p);
    double sum = 0;
    for (int i = 0; i < N; i++) sum += p[i];
    CHECK(fabs(sum - 1) < 1e-5);
    /* softmax ratios: p0/p1 = e */
    CHECK(fabs(p[0] / p[1] - exp(1.0)) < 1e-3);
    sp.top_k = 3;
    kv_sampler_dist(s, &sp, l, NULL, 0, p);
    CHECK(p[2] > 0 && p[3] == 0);
    sum = p[0] + p[1] + p[2];
    CHECK(fabs(sum - 1) < 1e-5);
    sp.top_k = 0;
    sp.top_p = 0.7f; /* p0 = 0.632, p0 + p1 = 0.865 -> keep 2 */
    kv_sampler_dist(s, &sp, l, NULL, 0, p);
    CHECK(p[1] > 0 && p[2] == 0);
    sp.top_p = 1.0f;
    sp.min_p = 0.2f; /* keep tokens with p >= 0.2 * p0: e^-1 = 0.37, e^-2 = 0.135 -> keep 2 */
    kv_sampler_dist(s, &sp, l, NULL, 0, p);
    CHECK(p[1] > 0 && p[2] == 0);
    /* temperature sharpens: lower temperature, larger top probability */
    sp.min_p = 0;
    sp.temperature = 0.5f;
    kv_sampler_dist(s, &sp, l, NULL, 0, p);
    CHECK(fabs(p[0] / p[1] - exp(2.0)) < 1e-2);
    kv_sampler_free(s);
}

/* Empirical frequencies follow the distribution and a seed replays. */
static void test_sampling_frequencies(void) {
    enum { N = 5, DRAWS = 200000 };
    float l[N] = {1.0f, 0.5f, 0.0f, -0.5f, -3.0f};
    kv_sampler *s = kv_sampler_new(N);
    REQUIRE(s);
    kv_sampling sp = base();
    float p[N];
    kv_sampler_dist(s, &sp, l, NULL, 0, p);
    int count[N] = {0};
    kv_rng r;
    kv_rng_seed(&r, 12345);
    for (int i = 0; i < DRAWS; i++) count[kv_sampler_sample(s, &sp, l, NULL, 0, &r)]++;
    for (int i = 0; i < N; i++) {
        double f = (double)count[i] / DRAWS, sd = sqrt(p[i] * (1 - p[i]) / DRAWS);
        CHECKF(fabs(f - p[i]) < 5 * sd + 1e-4, "token %d: freq %g vs p %g", i, f, p[i]);
    }
    kv_rng a, b;
    kv_rng_seed(&a, 99);
    kv_rng_seed(&b, 99);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= kv_sampler_sample(s, &sp, l, NULL, 0, &a) == kv_sampler_sample(s, &sp, l, NULL, 0, &b);
    CHECK(same);
    kv_rng_seed(&b, 100);
    int differ = 0;
    kv_rng_seed(&a, 99);
    for (int i = 0; i < 1000; i++) differ |= kv_rng_next(&a) != kv_rng_next(&b);
    CHECK(differ);
    kv_sampler_free(s);
}

static void test_validate(void) {
    kv_err err = {0};
    kv_sampling p = base();
    CHECK(kv_sampling_validate(&p, &err) == 0);
    p.top_p = 0;
    CHECK(kv_sampling_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "top_p"));
    p = base();
    p.temperature = -1;
    CHECK(kv_sampling_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "temperature"));
    p = base();
    p.min_p = 1;
    CHECK(kv_sampling_validate(&p, &err) == KV_ERR_INVAL);
    p = base();
    p.temperature = NAN;
    CHECK(kv_sampling_validate(&p, &err) == KV_ERR_INVAL);
}

/* top-k by selection (a heap of the k best) against a full sort: on fresh
 * random logits with many ties (a few levels), every k, the kept tokens
 * are the k best by (value desc, id asc) and their probabilities are the
 * bits of the same formula over the sorted prefix. */
typedef struct ref_cand {
    float v;
    int i;
} ref_cand;
static int ref_cmp(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static void test_top_k_selection(void) {
    harness_seed_fresh();
    for (int rep = 0; rep < 60; rep++) {
        const int n = 50 + (int)(harness_rand64() % 5000), levels = 2 + (int)(harness_rand64() % 40);
        const int k = 1 + (int)(harness_rand64() % (uint64_t)(rep % 3 ? 64 : n));
        float *l = malloc(sizeof(float) * (size_t)n), *probs = malloc(sizeof(float) * (size_t)n);
        ref_cand *c = malloc(sizeof *c * (size_t)n);
        for (int i = 0; i < n; i++) l[i] = (float)(harness_rand64() % (uint64_t)levels) * 0.25f;
        kv_sampler *s = kv_sampler_new(n);
        REQUIRE(s);
        kv_sampling p = base();
        p.top_k = k;
        kv_sampler_dist(s, &p, l, NULL, 0, probs);
        float mx = l[0];
        for (int i = 0; i < n; i++) {
            c[i] = (ref_cand){l[i], i};
            mx = l[i] > mx ? l[i] : mx;
        }
        qsort(c, (size_t)n, sizeof *c, ref_cmp);
        const int m = KV_MIN(k, n);
        double z = 0;
        for (int i = 0; i < m; i++) z += exp((double)(c[i].v - mx));
        int bad = 0, kept = 0;
        for (int i = 0; i < n; i++) kept += probs[i] > 0;
        for (int i = 0; i < m; i++) bad += probs[c[i].i] != (float)(exp((double)(c[i].v - mx)) / z);
        CHECKF(kept == m && !bad, "n %d levels %d k %d: %d kept, %d probabilities differ", n, levels, k, kept, bad);
        kv_sampler_free(s);
        FREE_ALL(l, probs, c);
    }
}

TEST_MAIN(T(test_greedy), T(test_top_k_selection), T(test_argmax_blocks), T(test_logits_scan), T(test_dist_filters), T(test_sampling_frequencies), T(test_validate))
