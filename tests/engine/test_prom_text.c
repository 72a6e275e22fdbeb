/* test_prom_text.c - the Prometheus text reader and the histogram
 * percentiles (engine/prom_text.c): the real llama-server scrape in the
 * shared fixtures, the vLLM and SGLang fixtures assembled from their metric
 * definitions, malformed lines counted and skipped with the good ones kept,
 * label escapes, and histogram_quantile's interpolation checked against
 * percentiles worked out by hand from known bucket counts, over deltas and a
 * sliding window. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../../engine/prom_text.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (1 + fabs(b)); }

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    return buf;
}

static void test_llama_server_scrape(void) {
    size_t len;
    char *t = slurp(harness_shared_path("fixtures/llama-server/metrics.txt"), &len);
    REQUIRE(t);
    kv_prom p = {0};
    kv_err err;
    REQUIRE(kv_prom_parse(t, len, &p, &err) == 0);
    CHECKF(p.rejected == 0, "%s", p.first_bad);
    int found;
    CHECK(kv_prom_sum(&p, "llamacpp:requests_processing", &found) == 16 && found);
    CHECK(kv_prom_sum(&p, "llamacpp:requests_deferred", &found) == 0 && found);
    CHECK(kv_prom_sum(&p, "llamacpp:tokens_predicted_total", NULL) == 1028);
    CHECK(near(kv_prom_sum(&p, "llamacpp:predicted_tokens_seconds", NULL), 17.9713));
    CHECK(p.samples[0].type == KV_PROM_COUNTER);
    CHECK(kv_prom_has_prefix(&p, "llamacpp:") && !kv_prom_has_prefix(&p, "vllm:"));
    kv_prom_sum(&p, "llamacpp:kv_cache_usage_ratio", &found);
    CHECK(!found); /* removed from llama.cpp: attach shows it as N/A */
    kv_prom_free(&p);
    free(t);
}

static void test_engine_fixtures(void) {
    static const char *const files[] = {"tests/fixtures/attach/vllm_metrics.txt",
                                        "tests/fixtures/attach/sglang_metrics.txt"};
    for (int i = 0; i < 2; i++) {
        size_t len;
        char *t = slurp(files[i], &len);
        REQUIRE(t);
        kv_prom p = {0};
        kv_err err;
        REQUIRE(kv_prom_parse(t, len, &p, &err) == 0);
        CHECKF(p.rejected == 0, "%s: %s", files[i], p.first_bad);
        kv_hist h;
        const char *ttft = i == 0 ? "vllm:time_to_first_token_seconds" : "sglang:time_to_first_token_seconds";
        CHECK(kv_prom_histogram(&p, ttft, &h) == 0 && h.count > 0 && isinf(h.le[h.n - 1]));
        double p50 = kv_hist_quantile(&h, 0.5), p99 = kv_hist_quantile(&h, 0.99);
        CHECK(p50 > 0 && p99 >= p50);
        kv_prom_free(&p);
        free(t);
    }
}

static void test_malformed_lines(void) {
    const char *t = "# TYPE a counter\n"
                    "a_total 3\n"
                    "bad line without value\n"
                    "b{x=\"1\",y=\"q\\\"uote\\\\ \\n\"} 2.5 1700000000000\n"
                    "c{x=\"unterminated} 1\n"
                    "d{1x=\"v\"} 1\n"
                    "e 0x10\n"
                    "f NaN\n"
                    "g +Inf\n"
                    "# TYPE h wobbly\n"
                    "h{x=\"1\"} 1 not-a-timestamp\n"
                    "\n"
                    "  # a comment\r\n"
                    "i{x=\"1\",} 7\r\n"
                    "j{} -2e-3";
    kv_prom p = {0};
    kv_err err;
    REQUIRE(kv_prom_parse(t, strlen(t), &p, &err) == 0);
    CHECKF(p.rejected == 6, "rejected %llu (%s)", (unsigned long long)p.rejected, p.first_bad);
    CHECK(p.first_bad_line == 3 && strstr(p.first_bad, "line 3"));
    CHECK(p.n == 6);
    int found;
    CHECK(kv_prom_sum(&p, "a_total", &found) == 3 && found && p.samples[0].type == KV_PROM_COUNTER);
    const char *y = p.n > 1 ? kv_prom_label_of(&p.samples[1], "y") : NULL;
    CHECK(y && !strcmp(y, "q\"uote\\ \n"));
    CHECK(isnan(p.samples[2].value) && isinf(p.samples[3].value));
    CHECK(kv_prom_sum(&p, "i", NULL) == 7 && near(kv_prom_sum(&p, "j", NULL), -2e-3));
    /* reused: emptied first */
    REQUIRE(kv_prom_parse("z 1\n", 4, &p, &err) == 0);
    CHECK(p.n == 1 && p.rejected == 0);
    kv_prom_free(&p);
}

/* Buckets le = 0.1, 0.5, 1, +Inf with cumulative counts cum. */
static kv_hist hist(const double *cum) {
    kv_hist h;
    memset(&h, 0, sizeof h);
    const double le[] = {0.1, 0.5, 1.0, INFINITY};
    h.n = 4;
    for (int i = 0; i < 4; i++) {
        h.le[i] = le[i];
        h.cum[i] = cum[i];
    }
    h.count = cum[3];
    return h;
}

static void test_quantiles(void) {
    /* 10 in (0, 0.1], 20 in (0.1, 0.5], 10 in (0.5, 1]: by hand,
     * p50 = 0.1 + 0.4 * (20 - 10) / 20 = 0.3, p90 = 0.5 + 0.5 * (36 - 30) / 10 = 0.8,
     * p99 = 0.5 + 0.5 * (39.6 - 30) / 10 = 0.98, p10 = 0.1 * 4 / 10 = 0.04 */
    const double c1[] = {10, 30, 40, 40};
    kv_hist h = hist(c1);
    CHECK(near(kv_hist_quantile(&h, 0.5), 0.3));
    CHECK(near(kv_hist_quantile(&h, 0.9), 0.8));
    CHECK(near(kv_hist_quantile(&h, 0.99), 0.98));
    CHECK(near(kv_hist_quantile(&h, 0.1), 0.04));
    /* a rank in +Inf: the largest finite bound */
    const double c2[] = {10, 10, 10, 20};
    kv_hist h2 = hist(c2);
    CHECK(near(kv_hist_quantile(&h2, 0.9), 1.0));
    const double c0[] = {0, 0, 0, 0};
    kv_hist h0 = hist(c0);
    CHECK(isnan(kv_hist_quantile(&h0, 0.5)));
    /* deltas: (10,30,40,40) -> (10,30,60,70): 20 new in (0.5, 1], 10 in +Inf */
    const double c3[] = {10, 30, 60, 70};
    kv_hist h3 = hist(c3), d;
    kv_hist_delta(&h3, &h, &d);
    CHECK(d.cum[0] == 0 && d.cum[1] == 0 && d.cum[2] == 20 && d.cum[3] == 30 && d.count == 30);
    CHECK(near(kv_hist_quantile(&d, 0.5), 0.5 + 0.5 * 15 / 20));
    /* a restart (counts fell): the new scrape itself */
    kv_hist_delta(&h, &h3, &d);
    CHECK(d.cum[3] == 40);
}

static void test_histogram_from_text(void) {
    const char *t = "# TYPE lat histogram\n"
                    "lat_bucket{engine=\"0\",le=\"0.1\"} 4\n"
                    "lat_bucket{engine=\"0\",le=\"0.5\"} 12\n"
                    "lat_bucket{engine=\"0\",le=\"1.0\"} 16\n"
                    "lat_bucket{engine=\"0\",le=\"+Inf\"} 16\n"
                    "lat_bucket{engine=\"1\",le=\"0.1\"} 6\n"
                    "lat_bucket{engine=\"1\",le=\"0.5\"} 18\n"
                    "lat_bucket{engine=\"1\",le=\"1.0\"} 24\n"
                    "lat_bucket{engine=\"1\",le=\"+Inf\"} 24\n"
                    "lat_count{engine=\"0\"} 16\nlat_count{engine=\"1\"} 24\n"
                    "lat_sum{engine=\"0\"} 5\nlat_sum{engine=\"1\"} 7\n"
                    "bad_bucket{le=\"0.1\"} 5\nbad_bucket{le=\"0.5\"} 3\nbad_bucket{le=\"+Inf\"} 9\n"
                    "noinf_bucket{le=\"0.1\"} 5\n";
    kv_prom p = {0};
    kv_err err;
    REQUIRE(kv_prom_parse(t, strlen(t), &p, &err) == 0 && p.rejected == 0);
    kv_hist h;
    REQUIRE(kv_prom_histogram(&p, "lat", &h) == 0);
    CHECK(h.n == 4 && h.cum[0] == 10 && h.cum[1] == 30 && h.cum[2] == 40 && h.count == 40 && h.sum == 12);
    CHECK(near(kv_hist_quantile(&h, 0.5), 0.3)); /* the same counts as test_quantiles, over two engines */
    CHECK(kv_prom_histogram(&p, "bad", &h) == KV_ERR_FORMAT);   /* counts fall */
    CHECK(kv_prom_histogram(&p, "noinf", &h) == KV_ERR_FORMAT); /* no +Inf */
    CHECK(kv_prom_histogram(&p, "absent", &h) == KV_ERR_FORMAT);
    kv_prom_free(&p);
}

static void test_window(void) {
    kv_hist_window *w = malloc(sizeof *w);
    REQUIRE(w);
    kv_hist_window_init(w, 60);
    const double c[4][4] = {{0, 0, 0, 0}, {10, 30, 40, 40}, {10, 30, 60, 70}, {20, 50, 90, 100}};
    const double t[4] = {0, 30, 70, 100};
    kv_hist d;
    kv_hist h0 = hist(c[0]);
    kv_hist_window_push(w, &h0, t[0]);
    kv_hist_window_delta(w, &d);
    CHECK(isnan(kv_hist_quantile(&d, 0.5))); /* one scrape: nothing observed yet */
    for (int i = 1; i < 4; i++) {
        kv_hist h = hist(c[i]);
        kv_hist_window_push(w, &h, t[i]);
    }
    /* at t=100 the window starts at 40: the baseline is the scrape at 30 */
    kv_hist_window_delta(w, &d);
    CHECK(d.cum[0] == 10 && d.cum[1] == 20 && d.cum[2] == 50 && d.cum[3] == 60);
    /* rank 30: (0.5, 1] holds ranks 20..50: 0.5 + 0.5 * 10 / 30 */
    CHECK(near(kv_hist_quantile(&d, 0.5), 0.5 + 0.5 * 10.0 / 30.0));
    free(w);
}

TEST_MAIN(T(test_llama_server_scrape), T(test_engine_fixtures), T(test_malformed_lines), T(test_quantiles),
          T(test_histogram_from_text), T(test_window))
