/* test_eval.c - the accuracy measures of `kvtop eval`: perplexity, KL
 * divergence, top-1 agreement and logit error on known distributions, the
 * token windows, and the driver end to end on stories260K (reference equal
 * to itself, q8_0 close, errors, temp files removed). */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/eval.h"
#include "../harness.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* KL by the textbook formula in long double from explicit probabilities:
 * an oracle independent of the log-sum-exp path. */
static double kl_oracle(const float *ref, const float *cfg, int n) {
    long double zr = 0, zc = 0, kl = 0;
    for (int i = 0; i < n; i++) zr += expl((long double)ref[i]), zc += expl((long double)cfg[i]);
    for (int i = 0; i < n; i++) {
        long double p = expl((long double)ref[i]) / zr, q = expl((long double)cfg[i]) / zc;
        kl += p * logl(p / q);
    }
    return (double)kl;
}

static void test_logsumexp(void) {
    float z[4] = {0, 0, 0, 0};
    CHECK(fabs(kv_eval_logsumexp(z, 4) - log(4.0)) < 1e-12);
    float big[2] = {1000.0f, 1000.0f}; /* exp(1000) overflows without the max shift */
    CHECK(fabs(kv_eval_logsumexp(big, 2) - (1000.0 + log(2.0))) < 1e-9);
    float neg[3] = {-1000.0f, -1001.0f, -1002.0f};
    double want = -1000.0 + log(1.0 + exp(-1.0) + exp(-2.0));
    CHECK(fabs(kv_eval_logsumexp(neg, 3) - want) < 1e-9);
}

static void test_perplexity_known(void) {
    /* Uniform over V: every token costs log V nats, perplexity V. */
    enum { V = 50 };
    float u[3 * V];
    for (int i = 0; i < 3 * V; i++) u[i] = 0.25f;
    int32_t tg[3] = {0, 17, 49};
    kv_eval_acc a = {0};
    kv_eval_acc_add(&a, NULL, NULL, u, 3, V, tg);
    CHECK(a.n == 3);
    CHECKF(fabs(kv_eval_acc_ppl(&a) - V) < 1e-9, "ppl %.12f", kv_eval_acc_ppl(&a));
    /* p = (1/2, 1/4, 1/8, 1/8) given as log-probabilities plus a constant;
     * one of each target: mean NLL = (1 + 2 + 3 + 3)/4 * ln 2. */
    float row[4] = {logf(0.5f) + 3, logf(0.25f) + 3, logf(0.125f) + 3, logf(0.125f) + 3};
    float rows[16];
    for (int r = 0; r < 4; r++) memcpy(rows + 4 * r, row, sizeof row);
    int32_t t4[4] = {0, 1, 2, 3};
    kv_eval_acc b = {0};
    kv_eval_acc_add(&b, NULL, NULL, rows, 4, 4, t4);
    CHECKF(fabs(kv_eval_acc_ppl(&b) - pow(2.0, 2.25)) < 1e-6, "ppl %.9f", kv_eval_acc_ppl(&b));
    CHECK(fabs(kv_eval_nll(row, 4, 2) - 3 * log(2.0)) < 1e-6);
    CHECK(isnan(kv_eval_nll(row, 4, 4)) && isnan(kv_eval_nll(row, 4, -1)));
    kv_eval_acc e = {0};
    CHECK(isnan(kv_eval_acc_ppl(&e)) && isnan(kv_eval_acc_kl(&e)) && isnan(kv_eval_acc_top1(&e)));
}

static void test_kl_identical_and_shift(void) {
    enum { V = 1000 };
    static float x[V], y[V];
    for (int i = 0; i < V; i++) x[i] = 8 * frand();
    double lse = kv_eval_logsumexp(x, V);
    CHECK(kv_eval_kl(x, lse, x, V) == 0.0); /* exactly: every term is p * 0 */
    /* Softmax ignores a constant shift: same distribution, KL ~ 0. */
    for (int i = 0; i < V; i++) y[i] = x[i] + 5.0f;
    CHECKF(kv_eval_kl(x, lse, y, V) < 1e-9, "%g", kv_eval_kl(x, lse, y, V));
}

static void test_kl_known_pair(void) {
    /* p = (1/2, 1/2), q = (9/10, 1/10): KL(p||q) = ln(5/3); KL(q||p) differs. */
    float p[2] = {0, 0}, q[2] = {logf(0.9f), logf(0.1f)};
    double kpq = kv_eval_kl(p, kv_eval_logsumexp(p, 2), q, 2);
    double kqp = kv_eval_kl(q, kv_eval_logsumexp(q, 2), p, 2);
    CHECKF(fabs(kpq - log(5.0 / 3.0)) < 1e-7, "KL(p||q) = %.9f", kpq);
    double want_qp = 0.9 * log(0.9 / 0.5) + 0.1 * log(0.1 / 0.5);
    CHECKF(fabs(kqp - want_qp) < 1e-7, "KL(q||p) = %.9f want %.9f", kqp, want_qp);
    /* Random rows against the long-double oracle, wide logit ranges included. */
    enum { V = 300 };
    static float a[V], b[V];
    for (int trial = 0; trial < 20; trial++) {
        float scale = 1.0f + (float)trial;
        for (int i = 0; i < V; i++) {
            a[i] = scale * frand();
            b[i] = a[i] + 0.3f * frand() * (float)(trial % 3);
        }
        double got = kv_eval_kl(a, kv_eval_logsumexp(a, V), b, V), want = kl_oracle(a, b, V);
        CHECKF(fabs(got - want) <= 1e-9 + 1e-7 * want, "trial %d: %.12g vs %.12g", trial, got, want);
        CHECK(got >= 0);
    }
}

static void test_argmax_and_agreement(void) {
    float t[5] = {1, 3, 3, -2, 0};
    CHECK(kv_eval_argmax(t, 5) == 1); /* first of equal maxima */
    /* 4 rows of 3: argmax ref = 0,1,2,0; cfg = 0,1,0,2 -> 2 of 4 agree. */
    float ref[12] = {5, 1, 1, 1, 5, 1, 1, 1, 5, 5, 1, 1};
    float cfg[12] = {5, 1, 1, 1, 5, 1, 5, 1, 1, 1, 1, 5};
    int32_t tg[4] = {0, 1, 2, 0};
    double lse[4];
    for (int r = 0; r < 4; r++) lse[r] = kv_eval_logsumexp(ref + 3 * r, 3);
    kv_eval_acc a = {0};
    kv_eval_acc_add(&a, ref, lse, cfg, 4, 3, tg);
    CHECK(a.n == 4 && a.n_agree == 2);
    CHECK(fabs(kv_eval_acc_top1(&a) - 0.5) < 1e-12);
    CHECK(fabs(a.max_abs - 4.0) < 1e-12);
    CHECK(kv_eval_acc_kl(&a) > 0);
    /* Passing lse NULL computes it: same sums. */
    kv_eval_acc b = {0};
    kv_eval_acc_add(&b, ref, NULL, cfg, 4, 3, tg);
    CHECK(b.sum_kl == a.sum_kl && b.sum_nll == a.sum_nll);
}

static void test_nan_is_not_hidden(void) {
    float ref[4] = {1, 2, 3, 4}, cfg[4] = {1, NAN, 3, 4};
    int32_t tg[1] = {0};
    kv_eval_acc a = {0};
    kv_eval_acc_add(&a, ref, NULL, cfg, 1, 4, tg);
    CHECK(isnan(a.sum_kl));
    CHECK(isnan(a.max_abs));
    CHECK(isnan(kv_eval_acc_ppl(&a)));
}

static void test_windows_cover_every_token_once(void) {
    int32_t t[300], win[64], seen[300];
    for (int i = 0; i < 300; i++) t[i] = 1000 + i;
    for (int bos = -1; bos <= 7; bos += 8) {
        for (int n = 1; n <= 300; n += 13) {
            for (int ctx = 2; ctx <= 64; ctx += 9) {
                memset(seen, 0, sizeof seen);
                int nw = kv_eval_n_windows(n, bos, ctx), predicted = 0, ok = 1;
                for (int k = 0; k < nw; k++) {
                    int len = kv_eval_window(t, n, bos, ctx, k, win);
                    ok &= len >= 2 && len <= ctx;
                    if (bos >= 0) ok &= win[0] == bos;
                    for (int i = 1; i < len; i++) { /* row i-1 predicts win[i] */
                        int idx = win[i] - 1000;
                        ok &= idx >= 0 && idx < n;
                        if (idx >= 0 && idx < n) seen[idx]++;
                        predicted++;
                    }
                }
                CHECK(kv_eval_window(t, n, bos, ctx, nw, win) == 0);
                int first = bos >= 0 ? 0 : 1; /* without BOS nothing predicts t[0] */
                for (int i = 0; i < n; i++) ok &= seen[i] == (i >= first);
                CHECKF(ok && predicted == n - first, "bos %d n %d ctx %d: %d windows, %d predictions", bos, n,
                       ctx, nw, predicted);
            }
        }
    }
    CHECK(kv_eval_n_windows(1, -1, 8) == 0); /* one token, no BOS: nothing to predict */
    CHECK(kv_eval_n_windows(1, 1, 8) == 1);
    CHECK(kv_eval_n_windows(10, 1, 1) == 0);
}

/* ---- the driver on stories260K ---- */

static const char *story =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball under a tree. She ran to the ball and kicked it high in the sky. "
    "Her friend Tom came to play too. They laughed and played until the sun went down, and then they went home.";

static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n == 0;
}

static void test_driver_stories(void) {
    const char *model = harness_shared_path("models/stories260K.gguf");
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "  skipped: %s missing\n", model);
        return;
    }
    char tmp[] = "/tmp/kvtop-test-eval-XXXXXX";
    REQUIRE(mkdtemp(tmp));
    const char *w[] = {"f32", "q8_0", "q4_0"};
    kv_cache_dtype kv[] = {KV_CACHE_F32, KV_CACHE_F16};
    /* Several windows, each run by the configurations in 7-token pieces: a
     * misaligned piece comparison would show as KL > 0 in the f32/f32 row. */
    kv_eval_params p = {.model_path = model, .n_threads = 1, .ctx = 40, .chunk = 7, .bos = -1, .weights = w,
                        .n_weights = 3, .kv = kv, .n_kv = 2, .tmp_dir = tmp};
    kv_eval_report rep;
    kv_err err = {0};
    int rc = kv_eval_run(&p, story, strlen(story), &rep, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(dir_is_empty(tmp)); /* variants removed */
    if (rc == 0) {
        CHECK(!strcmp(rep.native, "f32"));
        CHECK(rep.bos == 1 && rep.n_scored == rep.n_text_tokens && rep.n_windows > 1);
        /* ref, f32/f16, q8_0/f16, q4_0/f16, f32/f32 (f32/f16 asked twice: once) */
        CHECKF(rep.n_rows == 5, "%d rows", rep.n_rows);
        const kv_eval_row *ref = &rep.rows[0], *f16 = NULL, *q8 = NULL, *q4 = NULL, *same = NULL;
        for (int i = 1; i < rep.n_rows; i++) {
            const kv_eval_row *r = &rep.rows[i];
            if (!strcmp(r->weights, "f32") && r->kv == KV_CACHE_F16) f16 = r;
            if (!strcmp(r->weights, "q8_0")) q8 = r;
            if (!strcmp(r->weights, "q4_0")) q4 = r;
            if (!strcmp(r->weights, "f32") && r->kv == KV_CACHE_F32) same = r;
        }
        REQUIRE(f16 && q8 && q4 && same);
        CHECK(ref->is_ref && ref->kv == KV_CACHE_F32 && ref->from_file);
        CHECK(isfinite(ref->ppl) && ref->ppl > 1 && ref->ppl < 512);
        /* The same configuration run again agrees exactly. */
        CHECKF(same->mean_kl == 0 && same->top1 == 1 && same->max_abs_err == 0, "KL %g top1 %g max %g",
               same->mean_kl, same->top1, same->max_abs_err);
        CHECK(same->ppl == ref->ppl);
        CHECKF(f16->mean_kl < 1e-3 && f16->top1 > 0.95, "f16 KV: KL %g top1 %g", f16->mean_kl, f16->top1);
        CHECKF(q8->mean_kl > 0 && q8->mean_kl < 0.01 && q8->top1 > 0.9, "q8_0: KL %g top1 %g", q8->mean_kl,
               q8->top1);
        CHECKF(q4->mean_kl > q8->mean_kl && q4->max_abs_err > q8->max_abs_err, "q4_0 KL %g vs q8_0 %g",
               q4->mean_kl, q8->mean_kl);
        CHECK(q8->weight_bytes < ref->weight_bytes && q4->weight_bytes < q8->weight_bytes);
        CHECK(f16->kv_bytes_per_token * 2 == ref->kv_bytes_per_token);
        kv_eval_report_free(&rep);
    }

    /* One window holding the whole text, default pieces. */
    p.weights = (const char *[]){"f32"};
    p.n_weights = 1;
    p.kv = (kv_cache_dtype[]){KV_CACHE_F32};
    p.n_kv = 1;
    p.ctx = 1000;
    p.chunk = 0;
    rc = kv_eval_run(&p, story, strlen(story), &rep, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(rep.n_windows == 1 && rep.n_scored == rep.n_text_tokens && rep.ctx == 1000);
        CHECKF(rep.n_rows == 3, "%d rows", rep.n_rows); /* ref, f32/f16, f32/f32 */
        for (int i = 1; i < rep.n_rows; i++)
            if (rep.rows[i].kv == KV_CACHE_F32) CHECK(rep.rows[i].mean_kl == 0 && rep.rows[i].top1 == 1);
        kv_eval_report_free(&rep);
    }

    /* --grid: every weight type with every KV dtype, each pair once; the
     * f32/f32 pair is a fresh run equal to the reference. */
    p.weights = (const char *[]){"f32", "q8_0"};
    p.n_weights = 2;
    p.kv = (kv_cache_dtype[]){KV_CACHE_F32, KV_CACHE_INT8, KV_CACHE_FP8_E4M3};
    p.n_kv = 3;
    p.ctx = 64;
    p.grid = 1;
    rc = kv_eval_run(&p, story, strlen(story), &rep, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(dir_is_empty(tmp));
    if (rc == 0) {
        CHECKF(rep.n_rows == 7, "%d rows", rep.n_rows);
        int seen[2][3] = {{0}};
        for (int i = 1; i < rep.n_rows; i++) {
            const kv_eval_row *r = &rep.rows[i];
            int wi = !strcmp(r->weights, "q8_0");
            int ki = r->kv == KV_CACHE_F32 ? 0 : r->kv == KV_CACHE_INT8 ? 1 : 2;
            seen[wi][ki]++;
            if (!wi && !ki) CHECK(r->mean_kl == 0 && r->ppl == rep.rows[0].ppl);
            else CHECKF(r->mean_kl > 0, "%s/%d KL %g", r->weights, (int)r->kv, r->mean_kl);
        }
        for (int w = 0; w < 2; w++)
            for (int k = 0; k < 3; k++) CHECKF(seen[w][k] == 1, "pair %d/%d seen %d times", w, k, seen[w][k]);
        kv_eval_report_free(&rep);
    }
    rmdir(tmp);
}

static void test_driver_errors(void) {
    const char *model = harness_shared_path("models/stories260K.gguf");
    if (access(model, R_OK) != 0) return;
    kv_eval_report rep = {0};
    kv_err err = {0};
    kv_eval_params p = {.model_path = model, .n_threads = 1, .bos = -1};
    CHECK(kv_eval_run(&p, "", 0, &rep, &err) == KV_ERR_INVAL && strstr(err.msg, "empty"));
    /* One token and no BOS: nothing to predict. */
    p.bos = 0;
    p.weights = (const char *[]){"f32"};
    p.n_weights = 1;
    p.n_kv = 0;
    p.kv = (kv_cache_dtype[]){KV_CACHE_F32};
    CHECK(kv_eval_run(&p, "a", 1, &rep, &err) == KV_ERR_INVAL && strstr(err.msg, "at least 2"));
    p.bos = -1;
    p.weights = (const char *[]){"q3_zz"};
    CHECK(kv_eval_run(&p, story, strlen(story), &rep, &err) == KV_ERR_INVAL && strstr(err.msg, "q3_zz"));
    kv_eval_params bad = p;
    bad.model_path = "/nonexistent/model.gguf";
    bad.weights = (const char *[]){"f32"};
    CHECK(kv_eval_run(&bad, story, strlen(story), &rep, &err) < 0 && strstr(err.msg, "/nonexistent/model.gguf"));
    /* A llama2.c checkpoint cannot be re-encoded: the message says so. */
    const char *bin = harness_shared_path("models/stories260K.bin");
    char bin_path[4096];
    snprintf(bin_path, sizeof bin_path, "%s", bin);
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s", harness_shared_path("models/tok512.bin"));
    if (access(bin_path, R_OK) == 0) {
        kv_eval_params l = p;
        l.model_path = bin_path;
        l.tokenizer_path = tok_path;
        l.weights = (const char *[]){"q8_0"};
        int rc = kv_eval_run(&l, story, strlen(story), &rep, &err);
        CHECKF(rc == KV_ERR_INVAL && strstr(err.msg, "GGUF"), "rc %d: %s", rc, err.msg);
        /* Its own weights work (defaults: the file's own type only). */
        l.weights = NULL;
        l.kv = (kv_cache_dtype[]){KV_CACHE_F16};
        l.n_kv = 1;
        l.ctx = 64;
        rc = kv_eval_run(&l, story, strlen(story), &rep, &err);
        CHECKF(rc == 0, "%s", err.msg);
        if (rc == 0) {
            CHECK(rep.n_rows == 2 && rep.rows[1].kv == KV_CACHE_F16 && rep.rows[1].mean_kl < 1e-3);
            kv_eval_report_free(&rep);
        }
    }
    kv_eval_report_free(NULL);
}

TEST_MAIN(T(test_logsumexp), T(test_perplexity_known), T(test_kl_identical_and_shift), T(test_kl_known_pair),
          T(test_argmax_and_agreement), T(test_nan_is_not_hidden), T(test_windows_cover_every_token_once),
          T(test_driver_stories), T(test_driver_errors))
