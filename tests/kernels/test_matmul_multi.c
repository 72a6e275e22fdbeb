/* test_matmul_multi.c - ops.matmul_multi (up to three weights of one input:
 * Q/K/V, gate/up) against the separate matmul calls it replaces, bit for
 * bit: every weight type, mixed types (one, two and three activation
 * formats), row views of one fused matrix (phi3), every ISA, 1 and 2
 * threads, n = 1 and n > 1 rows, on fresh random data each run (the seed
 * is printed). The sim backend charges exactly the separate matmuls'
 * cost; bad calls fail loudly (NaN out, a status naming the op). */
#include <math.h>
#include <string.h>
#include <time.h>

#include "../../kernels/backend.h"
#include "../../kernels/cpu.h"
#include "../backend_helpers.h"
#include "../harness.h"

enum { K = 256, MAXN = 17 };

static kv_backend *make(const char *name, int threads) { return test_backend_for_rows(name, threads, MAXN, K); }


/* Runs w[0..nw) on x both ways with isa on b; 0 when every output's bits
 * agree, else prints the first difference. */
static int same_bits(kv_backend *b, kv_cpu_isa isa, const kv_tensor *const *w, int nw, const float *x, int n,
                     const char *what) {
    float *sep[KV_MATMUL_MULTI_MAX] = {0}, *mul[KV_MATMUL_MULTI_MAX] = {0};
    int bad = 0;
    for (int i = 0; i < nw; i++) {
        size_t cnt = (size_t)n * (size_t)w[i]->ne1;
        sep[i] = malloc(cnt * sizeof(float));
        mul[i] = malloc(cnt * sizeof(float));
        if (!sep[i] || !mul[i]) {
            CHECKF(0, "%s: out of memory", what);
            for (int j = 0; j <= i; j++) FREE_ALL(sep[j], mul[j]);
            return 1;
        }
        for (size_t e = 0; e < cnt; e++) sep[i][e] = mul[i][e] = NAN;
        kv_cpu_matmul_isa(b, isa, w[i], x, sep[i], n);
    }
    kv_cpu_matmul_multi_isa(b, isa, w, nw, x, mul, n);
    kv_err err = {0};
    CHECKF(kv_backend_status(b, &err) == 0, "%s: %s", what, err.msg);
    for (int i = 0; i < nw && !bad; i++)
        for (size_t e = 0; e < (size_t)n * (size_t)w[i]->ne1; e++)
            if (memcmp(&sep[i][e], &mul[i][e], sizeof(float)) != 0 || isnan(mul[i][e])) {
                CHECKF(0, "%s isa=%s threads=%d n=%d: weight %d (%s) output %zu: multi %.9g, alone %.9g", what,
                       kv_cpu_isa_name(isa), b->n_threads, n, i, kv_type_name(w[i]->type), e, mul[i][e], sep[i][e]);
                bad = 1;
                break;
            }
    for (int i = 0; i < nw; i++) FREE_ALL(sep[i], mul[i]);
    return bad;
}

/* Sets of weight types, one set per call: Q, K, V (or gate, up). */
typedef struct type_set {
    int nw;
    kv_type t[KV_MATMUL_MULTI_MAX];
} type_set;

static void check_sets(const type_set *sets, int nsets) {
    kv_backend *bs[2] = {make("cpu", 1), make("cpu", 2)};
    REQUIRE(bs[0] && bs[1]);
    /* a large Q and smaller K/V (GQA); 300 = 18 full 16-row panels and a
     * partial one; above the size at which n = 1 uses the threads */
    const int rows[KV_MATMUL_MULTI_MAX] = {300, 80, 37};
    const int ns[] = {1, 2, 3, 5, MAXN};
    float *x = malloc((size_t)MAXN * K * sizeof(float));
    REQUIRE(x);
    for (int si = 0; si < nsets; si++) {
        void *owned[KV_MATMUL_MULTI_MAX] = {0};
        kv_tensor wt[KV_MATMUL_MULTI_MAX];
        const kv_tensor *w[KV_MATMUL_MULTI_MAX];
        char what[96];
        int off = snprintf(what, sizeof what, "set");
        for (int i = 0; i < sets[si].nw; i++) {
            wt[i] = test_make_weight(sets[si].t[i], rows[i], K, &owned[i]);
            REQUIRE(owned[i]);
            w[i] = &wt[i];
            off += snprintf(what + off, sizeof what - (size_t)off, " %s", kv_type_name(sets[si].t[i]));
        }
        int bad = 0;
        for (size_t ni = 0; ni < KV_ARRAY_LEN(ns) && !bad; ni++) {
            harness_fill_rand(x, (size_t)ns[ni] * K, 2.0f);
            for (int isa = 0; isa < KV_CPU_ISA_COUNT && !bad; isa++) {
                if (!kv_cpu_isa_supported((kv_cpu_isa)isa)) continue;
                for (int th = 0; th < 2 && !bad; th++)
                    bad = same_bits(bs[th], (kv_cpu_isa)isa, w, sets[si].nw, x, ns[ni], what);
            }
        }
        for (int i = 0; i < sets[si].nw; i++) free(owned[i]);
    }
    free(x);
    kv_backend_free(bs[0]);
    kv_backend_free(bs[1]);
}

/* Three weights of each type the cpu matmul takes, and two (gate/up). */
static void test_multi_every_type(void) {
    harness_seed_fresh();
    const kv_type types[] = {KV_TYPE_F32,  KV_TYPE_F16,  KV_TYPE_BF16, KV_TYPE_Q8_0, KV_TYPE_Q4_0,
                             KV_TYPE_Q4_1, KV_TYPE_Q5_0, KV_TYPE_Q5_1, KV_TYPE_Q4_K, KV_TYPE_Q6_K};
    type_set sets[2 * KV_ARRAY_LEN(types)];
    for (size_t i = 0; i < KV_ARRAY_LEN(types); i++) {
        sets[2 * i] = (type_set){3, {types[i], types[i], types[i]}};
        sets[2 * i + 1] = (type_set){2, {types[i], types[i]}};
    }
    check_sets(sets, (int)KV_ARRAY_LEN(sets));
}

/* Mixed types: a Q4_K_M layer (V in q6_k, the same activation blocks),
 * three different q8a zero points (three activation formats side by side
 * in the reserved buffer), float beside quantized, one weight alone. */
static void test_multi_mixed_types(void) {
    harness_seed_fresh();
    const type_set sets[] = {
        {3, {KV_TYPE_Q4_K, KV_TYPE_Q4_K, KV_TYPE_Q6_K}}, {3, {KV_TYPE_Q8_0, KV_TYPE_Q4_0, KV_TYPE_Q4_1}},
        {3, {KV_TYPE_F16, KV_TYPE_Q5_0, KV_TYPE_Q8_0}},  {3, {KV_TYPE_Q4_K, KV_TYPE_F32, KV_TYPE_Q5_1}},
        {2, {KV_TYPE_Q6_K, KV_TYPE_Q4_K}},              {1, {KV_TYPE_Q4_1}},
        {1, {KV_TYPE_F32}},
    };
    check_sets(sets, (int)KV_ARRAY_LEN(sets));
}

/* Phi-3's fused QKV: three row views of one matrix (data offset, the
 * fused matrix's row stride). */
static void test_multi_row_views(void) {
    harness_seed_fresh();
    const kv_type types[] = {KV_TYPE_Q8_0, KV_TYPE_Q4_1, KV_TYPE_Q4_K, KV_TYPE_F16};
    kv_backend *b = make("cpu", 2);
    REQUIRE(b);
    float *x = malloc((size_t)MAXN * K * sizeof(float));
    REQUIRE(x);
    for (size_t ti = 0; ti < KV_ARRAY_LEN(types); ti++) {
        void *owned = NULL;
        kv_tensor fused = test_make_weight(types[ti], 96 + 32 + 32, K, &owned);
        REQUIRE(owned);
        kv_tensor v[3] = {fused, fused, fused};
        const int r0[3] = {0, 96, 128}, m[3] = {96, 32, 32};
        const kv_tensor *w[3];
        for (int i = 0; i < 3; i++) {
            v[i].ne1 = m[i];
            v[i].data = (const uint8_t *)fused.data + (size_t)r0[i] * fused.nb1;
            w[i] = &v[i];
        }
        for (int n = 1; n <= 4; n += 3) {
            harness_fill_rand(x, (size_t)n * K, 1.0f);
            for (int isa = 0; isa < KV_CPU_ISA_COUNT; isa++)
                if (kv_cpu_isa_supported((kv_cpu_isa)isa)) same_bits(b, (kv_cpu_isa)isa, w, 3, x, n, "row views");
        }
        free(owned);
    }
    free(x);
    kv_backend_free(b);
}

/* The sim backend: the cpu's bits, and the clock charged what the
 * separate matmuls charge. */
static void test_multi_sim_cost(void) {
    harness_seed_fresh();
    kv_backend *s1 = make("sim", 2), *s2 = make("sim", 2);
    REQUIRE(s1 && s2 && s1->ops->matmul_multi);
    void *owned[3];
    kv_tensor wt[3] = {test_make_weight(KV_TYPE_Q8_0, 300, K, &owned[0]),
                       test_make_weight(KV_TYPE_Q8_0, 80, K, &owned[1]),
                       test_make_weight(KV_TYPE_Q4_K, 37, K, &owned[2])};
    const kv_tensor *w[3] = {&wt[0], &wt[1], &wt[2]};
    for (int i = 0; i < 3; i++) {
        REQUIRE(owned[i]);
        CHECK(s1->ops->upload_weight(s1, &wt[i], NULL) == 0 && s2->ops->upload_weight(s2, &wt[i], NULL) == 0);
    }
    const int n = 5;
    float x[n * K], ya[3][n * 300], yb[3][n * 300];
    harness_fill_rand(x, (size_t)n * K, 1.0f);
    kv_backend_clock c1, c2;
    REQUIRE(kv_backend_clock_get(s1, &c1) && kv_backend_clock_get(s2, &c2));
    CHECK(c1.elapsed_s == c2.elapsed_s);
    float *ym[3] = {ya[0], ya[1], ya[2]};
    s1->ops->matmul_multi(s1, w, 3, x, ym, n);
    for (int i = 0; i < 3; i++) s2->ops->matmul(s2, w[i], x, yb[i], n);
    kv_backend_clock_get(s1, &c1);
    kv_backend_clock_get(s2, &c2);
    CHECKF(c1.elapsed_s == c2.elapsed_s && c1.elapsed_s > 0, "sim clock: multi %.12g s, separate %.12g s",
           c1.elapsed_s, c2.elapsed_s);
    for (int i = 0; i < 3; i++) CHECK(memcmp(ya[i], yb[i], (size_t)n * (size_t)wt[i].ne1 * sizeof(float)) == 0);
    CHECK(kv_backend_status(s1, NULL) == 0 && kv_backend_status(s2, NULL) == 0);
    for (int i = 0; i < 3; i++) free(owned[i]);
    kv_backend_free(s1);
    kv_backend_free(s2);
}

/* Weights of different row lengths, or too many: NaN out and a failure
 * naming the op, no crash. */
static void test_multi_rejects(void) {
    harness_seed_fresh();
    kv_backend *b = make("cpu", 2);
    REQUIRE(b);
    void *o1 = NULL, *o2 = NULL;
    kv_tensor a = test_make_weight(KV_TYPE_Q8_0, 8, K, &o1), c = test_make_weight(KV_TYPE_Q8_0, 8, K / 2, &o2);
    REQUIRE(o1 && o2);
    float x[K], y0[8], y1[8];
    harness_fill_rand(x, K, 1.0f);
    const kv_tensor *w[4] = {&a, &c, &a, &a};
    float *y[4] = {y0, y1, y0, y1};
    b->ops->matmul_multi(b, w, 2, x, y, 1);
    kv_err err = {0};
    CHECK(kv_backend_status(b, &err) == KV_ERR_BACKEND && strstr(err.msg, "matmul_multi"));
    CHECK(isnan(y0[0]) && isnan(y1[7]));
    b->ops->matmul_multi(b, w, 4, x, y, 1);
    CHECK(kv_backend_status(b, NULL) == KV_ERR_BACKEND);
    w[1] = &a;
    b->ops->matmul_multi(b, w, 2, x, y, 1); /* and a good call after them works */
    CHECK(kv_backend_status(b, NULL) == 0 && !isnan(y0[0]) && memcmp(y0, y1, sizeof y0) == 0);
    FREE_ALL(o1, o2);
    kv_backend_free(b);
}

TEST_MAIN(T(test_multi_every_type), T(test_multi_mixed_types), T(test_multi_row_views), T(test_multi_sim_cost),
          T(test_multi_rejects))
