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
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include "../base/file.h"

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

/* Copies src into dst (cap bytes, truncated, NUL-terminated): a path into
 * a kv_config field. */
static inline void harness_copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* Copies "<shared>/<rel>" into dst as harness_copy_str does. */
static inline void harness_shared_copy(char *dst, size_t cap, const char *rel) {
    harness_copy_str(dst, cap, harness_shared_path(rel));
}

/* ---- scratch files ---- */

/* A scratch file path of this test process,
 * "<TMPDIR, else /tmp>/kvtop_test_<prog>_<pid>_<tag><ext>", in one of four
 * static buffers used in turn (a result lasts for three more calls). */
static inline const char *harness_tmp_path(const char *prog, const char *tag, const char *ext) {
    static char buf[4][512];
    static int k;
    const char *dir = getenv("TMPDIR");
    char *b = buf[k++ & 3];
    snprintf(b, 512, "%s/kvtop_test_%s_%d_%s%s", dir && *dir ? dir : "/tmp", prog, (int)getpid(), tag, ext);
    return b;
}

/* The bytes of the file at path plus a NUL (kv_read_file), or NULL when it
 * cannot be read; *n (may be NULL) is their count. The caller frees them. */
static inline void *harness_read_file(const char *path, size_t *n) {
    char *buf;
    return kv_read_file(path, 0, &buf, n, NULL) == 0 ? buf : NULL;
}

/* 1 when the file at path can be read; else 0, after printing the note of
 * a test that skips ("  (skipped: PATH not present; HINT)"). */
static inline int harness_present(const char *path, const char *hint) {
    if (access(path, R_OK) == 0) return 1;
    printf("  (skipped: %s not present; %s)\n", path, hint);
    return 0;
}

/* Writes n bytes of p to path (created or truncated). Returns 0, or -1. */
static inline int harness_write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* ---- random data for kernel tests: xorshift64 ----
 * One generator per test program (each includes this header once); a
 * program may seed it (*harness_rng() = seed) for fresh data per run. */
static inline uint64_t *harness_rng(void) {
    static uint64_t state = 0x9E3779B97F4A7C15ull;
    return &state;
}

/* Seeds the generator from the clock once per program and prints the seed
 * (a failure can then be repeated by setting it): fresh data every run. */
static inline void harness_seed_fresh(void) {
    static int done;
    if (done) return;
    done = 1;
    uint64_t s = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
    if (!s) s = 1;
    *harness_rng() = s;
    printf("  seed %llu\n", (unsigned long long)s);
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

static inline void harness_free_list(void *const *p, size_t n) {
    for (size_t i = 0; i < n; i++) free(p[i]);
}

/* free() of each pointer argument: a test's host buffers in one line. */
#define FREE_ALL(...) harness_free_list((void *[]){__VA_ARGS__}, sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))

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
