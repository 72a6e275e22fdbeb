/* harness.h - the test helper: CHECK(cond) records a failure with file:line,
 * tests are listed in a table, the runner prints one line per test and then
 * "N passed, N failed", and exits non-zero when anything failed.
 *
 *   static void test_foo(void) { CHECK(1 + 1 == 2); }
 *   TEST_MAIN(T(test_foo), T(test_bar))
 *
 * A test binary takes an optional substring filter as argv[1]. */
#ifndef KV_TEST_HARNESS_H
#define KV_TEST_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static int harness_cur_failures;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);  \
            harness_cur_failures++;                                                     \
        }                                                                               \
    } while (0)

/* CHECK with a printf-style explanation printed on failure. */
#define CHECKF(cond, ...)                                                               \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            harness_cur_failures++;                                                     \
        }                                                                               \
    } while (0)

/* Fails the current test and returns from it (for preconditions). */
#define REQUIRE(cond)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "  %s:%d: REQUIRE(%s) failed\n", __FILE__, __LINE__, #cond);\
            harness_cur_failures++;                                                     \
            return;                                                                     \
        }                                                                               \
    } while (0)

typedef struct harness_case {
    const char *name;
    void (*fn)(void);
} harness_case;

#define T(fn) { #fn, fn }

/* Directory of the shared test data (models, vocabularies). */
static inline const char *harness_shared(void) {
    const char *s = getenv("KVTOP_SHARED");
    return (s && *s) ? s : "../shared";
}

/* Builds "<shared>/<rel>" into a static buffer (one at a time). */
static inline const char *harness_shared_path(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", harness_shared(), rel);
    return buf;
}

/* Copies "<shared>/<rel>" into dst (cap bytes, truncated, NUL-terminated):
 * a model path into a kv_config. */
static inline void harness_shared_copy(char *dst, size_t cap, const char *rel) {
    const char *path = harness_shared_path(rel);
    size_t n = strlen(path);
    if (n >= cap) n = cap - 1;
    memcpy(dst, path, n);
    dst[n] = 0;
}

/* ---- random data for kernel tests: xorshift64 ----
 * One generator per test program (each includes this header once); a
 * program may seed it (*harness_rng() = seed) for fresh data per run. */
static inline uint64_t *harness_rng(void) {
    static uint64_t state = 0x9E3779B97F4A7C15ull;
    return &state;
}

static inline uint64_t harness_rand64(void) {
    uint64_t x = *harness_rng();
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *harness_rng() = x;
}

/* uniform in [-1, 1) */
static inline float harness_frand(void) {
    return (float)((double)(harness_rand64() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static inline void harness_fill_rand(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = harness_frand() * scale;
}

/* Normalised error ||y - ref|| / ||ref|| (the plain norm when ref is 0;
 * infinity when y has a NaN), the measure test-backend-ops uses. */
static inline double harness_nerr(const float *y, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (!(num == num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline int harness_run(const harness_case *cases, int n, int argc, char **argv) {
    int passed = 0, failed = 0;
    const char *filter = argc > 1 ? argv[1] : NULL;
    for (int i = 0; i < n; i++) {
        if (filter && !strstr(cases[i].name, filter)) continue;
        harness_cur_failures = 0;
        cases[i].fn();
        if (harness_cur_failures) {
            failed++;
            printf("FAIL %s\n", cases[i].name);
        } else {
            passed++;
            printf("  ok %s\n", cases[i].name);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define TEST_MAIN(...)                                                                  \
    int main(int argc, char **argv) {                                                   \
        static const harness_case cases[] = {__VA_ARGS__};                              \
        return harness_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);   \
    }

#endif
