/* test_matmul_multi.c - ops.matmul_multi (up to three weights of one input:
 * Q/K/V, gate/up) against the separate matmul calls it replaces, bit for
 * bit: every weight type, mixed types (one, two and three activation
 * formats), row views of one fused matrix (phi3), every ISA, 1 and 2
 * threads, n = 1 and n > 1 rows, on fresh random data each run (the seed
 * is printed). ops.matmul_groups (many such groups, each its own x: a
 * mixture of experts' experts) the same way, in one pass and in several
 * (more weights than a pass takes, activations past the reserved buffer).
 * The sim backend charges exactly the separate matmuls' cost; bad calls
 * fail loudly (NaN out, a status naming the op). */
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

/* Runs the ng groups through matmul_groups (isa) and each weight alone;
 * 0 when every output's bits agree. */
static int groups_same_bits(kv_backend *b, kv_cpu_isa isa, kv_matmul_group *g, int ng, const char *what) {
    int bad = 0;
    for (int k = 0; k < ng; k++)
        for (int i = 0; i < g[k].nw; i++)
            for (size_t e = 0; e < (size_t)g[k].n * (size_t)g[k].w[i]->ne1; e++) g[k].y[i][e] = NAN;
    kv_cpu_matmul_groups_isa(b, isa, g, ng);
    kv_err err = {0};
    CHECKF(kv_backend_status(b, &err) == 0, "%s: %s", what, err.msg);
    for (int k = 0; k < ng && !bad; k++)
        for (int i = 0; i < g[k].nw && !bad; i++) {
            const size_t cnt = (size_t)g[k].n * (size_t)g[k].w[i]->ne1;
            float *alone = malloc(cnt * sizeof(float));
            if (!alone) {
                CHECKF(0, "%s: out of memory", what);
                return 1;
            }
            kv_cpu_matmul_isa(b, isa, g[k].w[i], g[k].x, alone, g[k].n);
            for (size_t e = 0; e < cnt; e++)
                if (memcmp(&alone[e], &g[k].y[i][e], sizeof(float)) != 0 || isnan(alone[e])) {
                    CHECKF(0, "%s isa=%s threads=%d: group %d of %d (n=%d) weight %d (%s) output %zu: groups %.9g, alone %.9g",
                           what, kv_cpu_isa_name(isa), b->n_threads, k, ng, g[k].n, i, kv_type_name(g[k].w[i]->type), e,
                           g[k].y[i][e], alone[e]);
                    bad = 1;
                    break;
                }
            free(alone);
        }
    return bad;
}

/* Experts of a mixture: each group an expert's gate and up (two weights,
 * its own rows of x, 1..9 of them), or its down matmul (one), row views
 * of one stacked tensor per kind, as a GGUF's ffn_*_exps; 6 experts (one
 * pass), 30 (60 weights: more than a pass takes) and 12 with up to 9 rows
 * each (more activation rows than the buffer reserved for 17 holds). */
static void test_groups_experts(void) {
    harness_seed_fresh();
    kv_backend *bs[2] = {make("cpu", 1), make("cpu", 2)};
    REQUIRE(bs[0] && bs[1]);
    const kv_type types[] = {KV_TYPE_Q8_0, KV_TYPE_Q4_K, KV_TYPE_F16, KV_TYPE_Q5_0};
    enum { E = 30, FF = 48, MAXR = 9 };
    const int counts[] = {6, 30, 12};
    float *x = malloc((size_t)E * MAXR * K * sizeof(float));
    float *y = malloc((size_t)E * MAXR * 2 * FF * sizeof(float));
    REQUIRE(x && y);
    for (size_t ti = 0; ti < KV_ARRAY_LEN(types); ti++) {
        void *owned = NULL;
        kv_tensor stack = test_make_weight(types[ti], E * 2 * FF, K, &owned);
        REQUIRE(owned);
        kv_tensor v[E * 2];
        for (int r = 0; r < E * 2; r++) {
            v[r] = stack;
            v[r].ne1 = FF;
            v[r].data = (const uint8_t *)stack.data + (size_t)r * FF * stack.nb1;
        }
        for (size_t ci = 0; ci < KV_ARRAY_LEN(counts); ci++) {
            const int ng = counts[ci];
            kv_matmul_group g[E];
            size_t xo = 0, yo = 0;
            for (int k = 0; k < ng; k++) {
                const int n = ci == 2 ? MAXR - (int)(harness_rand64() % 3) : 1 + (int)(harness_rand64() % MAXR);
                const int two = ci == 0 || k % 3 != 2;
                g[k] = (kv_matmul_group){.w = {&v[2 * k], &v[2 * k + 1]}, .nw = two ? 2 : 1, .x = x + xo, .n = n};
                for (int i = 0; i < g[k].nw; i++, yo += (size_t)n * FF) g[k].y[i] = y + yo;
                harness_fill_rand(x + xo, (size_t)n * K, 2.0f);
                xo += (size_t)n * K;
            }
            char what[64];
            snprintf(what, sizeof what, "%s, %d experts", kv_type_name(types[ti]), ng);
            int bad = 0;
            for (int isa = 0; isa < KV_CPU_ISA_COUNT && !bad; isa++)
                if (kv_cpu_isa_supported((kv_cpu_isa)isa))
                    for (int th = 0; th < 2 && !bad; th++) bad = groups_same_bits(bs[th], (kv_cpu_isa)isa, g, ng, what);
        }
        free(owned);
    }
    FREE_ALL(x, y);
    kv_backend_free(bs[0]);
    kv_backend_free(bs[1]);
}

/* The sim backend's matmul_groups: the cpu's bits, charged as the separate
 * matmuls; a group too large for the scratch, or a misshapen one, fails
 * loudly (NaN, a status naming the op) and a good call after it works. */
static void test_groups_sim_and_rejects(void) {
    harness_seed_fresh();
    kv_backend *s1 = make("sim", 2), *s2 = make("sim", 2), *b = make("cpu", 2);
    REQUIRE(s1 && s2 && b && s1->ops->matmul_groups && b->ops->matmul_groups);
    void *o1 = NULL, *o2 = NULL;
    kv_tensor a = test_make_weight(KV_TYPE_Q8_0, 40, K, &o1), c = test_make_weight(KV_TYPE_Q4_K, 24, K, &o2);
    REQUIRE(o1 && o2);
    CHECK(s1->ops->upload_weight(s1, &a, NULL) == 0 && s2->ops->upload_weight(s2, &a, NULL) == 0);
    CHECK(s1->ops->upload_weight(s1, &c, NULL) == 0 && s2->ops->upload_weight(s2, &c, NULL) == 0);
    enum { BIG = 1000 };
    float *x = malloc((size_t)BIG * K * sizeof(float)), *y0 = malloc((size_t)BIG * 40 * sizeof(float)),
          *y1 = malloc((size_t)BIG * 40 * sizeof(float)), *z0 = malloc(3 * 40 * sizeof(float)),
          *z1 = malloc(3 * 40 * sizeof(float));
    REQUIRE(x && y0 && y1 && z0 && z1);
    harness_fill_rand(x, (size_t)BIG * K, 1.0f);
    kv_matmul_group g[2] = {{.w = {&a, &c}, .y = {y0, y1}, .nw = 2, .x = x, .n = 3},
                            {.w = {&c}, .y = {z0}, .nw = 1, .x = x + 3 * K, .n = 2}};
    s1->ops->matmul_groups(s1, g, 2);
    s2->ops->matmul(s2, &a, x, z1, 3);
    CHECK(memcmp(y0, z1, 3 * 40 * sizeof(float)) == 0);
    s2->ops->matmul(s2, &c, x, z1, 3);
    CHECK(memcmp(y1, z1, 3 * 24 * sizeof(float)) == 0);
    s2->ops->matmul(s2, &c, x + 3 * K, z1, 2);
    CHECK(memcmp(z0, z1, 2 * 24 * sizeof(float)) == 0);
    kv_backend_clock c1, c2;
    kv_backend_clock_get(s1, &c1);
    kv_backend_clock_get(s2, &c2);
    CHECKF(c1.elapsed_s == c2.elapsed_s && c1.elapsed_s > 0, "sim clock: groups %.12g s, separate %.12g s",
           c1.elapsed_s, c2.elapsed_s);
    /* 1000 rows: past the activation buffer reserved for 17 (its three regions) */
    kv_matmul_group big = {.w = {&a}, .y = {y0}, .nw = 1, .x = x, .n = BIG};
    b->ops->matmul_groups(b, &big, 1);
    kv_err err = {0};
    CHECK(kv_backend_status(b, &err) == KV_ERR_BACKEND && strstr(err.msg, "matmul_groups"));
    CHECK(isnan(y0[0]) && isnan(y0[(size_t)BIG * 40 - 1]));
    /* weights of different row lengths in one group */
    void *o3 = NULL;
    kv_tensor h = test_make_weight(KV_TYPE_Q8_0, 8, K / 2, &o3);
    REQUIRE(o3);
    kv_matmul_group mixed = {.w = {&a, &h}, .y = {y0, y1}, .nw = 2, .x = x, .n = 1};
    b->ops->matmul_groups(b, &mixed, 1);
    CHECK(kv_backend_status(b, NULL) == KV_ERR_BACKEND && isnan(y0[0]) && isnan(y1[7]));
    b->ops->matmul_groups(b, g, 2); /* and a good call after them works */
    CHECK(kv_backend_status(b, NULL) == 0 && !isnan(y0[0]) && !isnan(z0[0]));
    FREE_ALL(x, y0, y1, z0, z1);
    FREE_ALL(o1, o2, o3);
    kv_backend_free(s1);
    kv_backend_free(s2);
    kv_backend_free(b);
}

TEST_MAIN(T(test_multi_every_type), T(test_multi_mixed_types), T(test_multi_row_views), T(test_multi_sim_cost),
          T(test_multi_rejects), T(test_groups_experts), T(test_groups_sim_and_rejects))
