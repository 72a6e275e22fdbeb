/* test_backend_ext.c - the ops of the architectures past llama (gelu_mul,
 * scale, add_rows, rope_ext, attention_window) on every compiled-in backend
 * against the CPU backend's scalar expressions, by normalised error on
 * fresh random data, the mixture-of-experts ops (moe_route, scatter_add),
 * then whole forward passes of random gemma3 (sliding window), qwen2
 * (biases), Llama 3 rope-scaled and qwen3moe files. The sim backend
 * computes with the CPU kernels, so it must match exactly; cuda within the
 * tolerances below. A backend that cannot be created here (no GPU) is
 * skipped with a note. Built and run by `make test-gpu`. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/mkmodel.h"
#include "../../engine/model.h"
#include "../../engine/runner.h"
#include "../../kernels/backend.h"
#include "../../kernels/kv_dtype.h"
#include "../backend_helpers.h"
#include "../engine_helpers.h"
#include "../harness.h"

enum { OP_GELU, OP_SCALE, OP_ADD_ROWS, OP_ROPE_EXT, OP_ATTN_WIN, OP_MOE_ROUTE, OP_SCATTER_ADD, OP_FORWARD, OP_N };
static const char *const op_names[OP_N] = {"gelu_mul", "scale",       "add_rows", "rope_ext", "attention_window",
                                           "moe_route", "scatter_add", "forward"};
/* scale and add_rows are one rounding each: exact. gelu_mul and rope_ext
 * differ where expf / cosf round differently; attention by summation order;
 * moe_route's weights where exp rounds differently (its chosen experts
 * must be the same ones); scatter_add where the CPU fuses the multiply-add;
 * a whole forward as in test_backend_ops. */
static const double op_tol[OP_N] = {1e-5, 0.0, 0.0, 1e-5, 1e-4, 1e-6, 1e-6, 1e-2};

#include "gpu_compare.h"

/* ---- element-wise ops ------------------------------------------------------------ */

static void test_gelu_scale_add_rows(void) {
    init_targets();
    REQUIRE(cpu);
    const int n = 37, dim = 1152; /* Gemma 3 270M's ffn is 2048, its width 640 */
    const int64_t count = (int64_t)n * dim;
    const size_t bytes = (size_t)count * sizeof(float);
    for (int ti = 0; ti < n_targets; ti++) {
        target *t = &targets[ti];
        kv_backend *b = t->b;
        float *g = malloc(bytes), *u = malloc(bytes), *ref = malloc(bytes), *got = malloc(bytes);
        float *bias = malloc((size_t)dim * sizeof(float));
        REQUIRE(g && u && ref && got && bias);
        harness_fill_rand(g, (size_t)count, 6.0f);
        harness_fill_rand(u, (size_t)count, 2.0f);
        harness_fill_rand(bias, (size_t)dim, 1.0f);
        float *dg = test_put(b, g, bytes), *du = test_put(b, u, bytes);
        REQUIRE(dg && du);
        /* gelu_mul against the scalar reference itself */
        memcpy(ref, g, bytes);
        kv_gelu_mul_ref(ref, u, count);
        b->ops->gelu_mul(b, dg, du, count);
        get(b, got, dg, bytes);
        judge(t, OP_GELU, harness_nerr(got, ref, (size_t)count), "");
        /* scale, then add_rows with a host bias (as the model passes it) */
        b->ops->upload(b, dg, g, bytes);
        memcpy(ref, g, bytes);
        cpu->ops->scale(cpu, ref, 0.0625f * 3.0f, count);
        b->ops->scale(b, dg, 0.0625f * 3.0f, count);
        get(b, got, dg, bytes);
        judge(t, OP_SCALE, harness_nerr(got, ref, (size_t)count), "");
        cpu->ops->add_rows(cpu, ref, bias, n, dim);
        b->ops->add_rows(b, dg, bias, n, dim);
        get(b, got, dg, bytes);
        judge(t, OP_ADD_ROWS, harness_nerr(got, ref, (size_t)count), "");
        check_status(t, "gelu_mul/scale/add_rows");
        forget_host(t);
        TEST_DEV_FREE(b, dg, du);
        FREE_ALL(g, u, ref, got, bias);
    }
    report(OP_GELU);
    report(OP_SCALE);
    report(OP_ADD_ROWS);
}

/* rope_ext at base 500000: variant 0 with Llama 3's frequency factors,
 * 1 with linear scaling (0.25), 2 plain */
static float rope_factors[32];

static void apply_rope_ext(kv_backend *b, float *x, const int32_t *pos, int n, int H, int hd, int rot, int neox,
                           int v) {
    b->ops->rope_ext(b, x, pos, n, H, hd, rot, 500000.0f, neox, v == 1 ? 0.25f : 1.0f, v == 0 ? rope_factors : NULL);
}

static void test_rope_ext(void) {
    for (int i = 0; i < 32; i++) rope_factors[i] = 1.0f + (float)(harness_rand64() % 800) / 100.0f;
    rope_battery(OP_ROPE_EXT, 9000, 3, apply_rope_ext);
}

/* ---- attention_window -------------------------------------------------------------- */

/* Two sequences over a shuffled pool, K/V stored by the CPU and copied to
 * the target; each table's blocks wholly below its first token's window
 * are -1 (released), as the paged cache leaves them. */
static void one_window(target *t, kv_cache_dtype dt, int bs, int window) {
    kv_backend *b = t->b;
    enum { NB = 24, PER = 12, NH = 8, NKV = 2, HD = 64, MAXT = 48 };
    kv_pages pc = {.dtype = dt, .n_layers = 1, .n_kv_heads = NKV, .head_dim = HD, .block_size = bs, .n_blocks = NB};
    kv_pages_set_sizes(&pc);
    const size_t total = pc.layer_bytes;
    kv_pages pt = pc;
    pc.k = calloc(1, total);
    pc.v = calloc(1, total);
    int32_t perm[NB];
    for (int i = 0; i < NB; i++) perm[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        int j = (int)(harness_rand64() % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    int32_t tab[2][PER];
    memcpy(tab[0], perm, sizeof tab[0]);
    memcpy(tab[1], perm + PER, sizeof tab[1]);
    const int len[2] = {PER * bs - 5, PER * bs / 2 + 3}; /* context of each sequence after the batch */
    const int ntok[2] = {3, 17};                         /* tokens of each in the batch (decode-ish, a chunk) */
    int32_t pos[MAXT], seq[MAXT], slot[MAXT];
    float *kv = malloc((size_t)PER * bs * NKV * HD * sizeof(float) * 2);
    float *q = malloc((size_t)MAXT * NH * HD * sizeof(float));
    float *oc = malloc((size_t)MAXT * NH * HD * sizeof(float)), *ot = malloc((size_t)MAXT * NH * HD * sizeof(float));
    REQUIRE(pc.k && pc.v && kv && q && oc && ot);
    /* every position of both sequences stored, through the CPU */
    for (int s = 0; s < 2; s++) {
        const int np = len[s];
        for (int p0 = 0; p0 < np; p0 += MAXT) {
            const int m = KV_MIN(MAXT, np - p0);
            for (int i = 0; i < m; i++) {
                pos[i] = p0 + i;
                seq[i] = 0;
                slot[i] = tab[s][pos[i] / bs] * bs + pos[i] % bs;
            }
            const int32_t *tp[1] = {tab[s]};
            kv_attn_batch ab = {.n_tokens = m, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1, .tables = tp};
            harness_fill_rand(kv, (size_t)m * NKV * HD * 2, 2.0f);
            cpu->ops->kv_store(cpu, &pc, 0, &ab, kv, kv + (size_t)m * NKV * HD);
        }
    }
    pt.k = test_put(b, pc.k, total);
    pt.v = test_put(b, pc.v, total);
    REQUIRE(pt.k && pt.v);
    /* the batch: the last ntok[s] positions of each sequence */
    int n = 0;
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < ntok[s]; j++, n++) {
            pos[n] = len[s] - ntok[s] + j;
            seq[n] = s;
            slot[n] = tab[s][pos[n] / bs] * bs + pos[n] % bs;
        }
    for (int s = 0; s < 2; s++) { /* release what the first token's window leaves behind */
        const int lo = KV_MAX(0, len[s] - ntok[s] + 1 - window);
        for (int k = 0; k < lo / bs; k++) tab[s][k] = -1;
    }
    const int32_t *tp[2] = {tab[0], tab[1]};
    kv_attn_batch ab = {.n_tokens = n, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 2, .tables = tp};
    const size_t qb = (size_t)n * NH * HD * sizeof(float);
    harness_fill_rand(q, (size_t)n * NH * HD, 2.0f);
    float *dq = test_put(b, q, qb), *dout = test_put(b, NULL, qb);
    REQUIRE(dq && dout);
    const float scale = 1.0f / sqrtf((float)HD);
    cpu->ops->attention_window(cpu, &pc, 0, &ab, q, oc, NH, scale, window);
    b->ops->attention_window(b, &pt, 0, &ab, dq, dout, NH, scale, window);
    get(b, ot, dout, qb);
    char what[96];
    snprintf(what, sizeof what, "%s bs=%d window=%d", kv_cache_dtype_name(dt), bs, window);
    judge_tol(t, OP_ATTN_WIN, harness_nerr(ot, oc, (size_t)n * NH * HD), test_attn_tol(cpu, dt, op_tol[OP_ATTN_WIN]), what);
    check_status(t, what);
    TEST_DEV_FREE(b, pt.k, pt.v, dq, dout);
    FREE_ALL(pc.k, pc.v, kv, q, oc, ot);
}

static void test_attention_window(void) {
    init_targets();
    REQUIRE(cpu);
    static const int windows[] = {1, 5, 16, 37, 100000};
    static const kv_cache_dtype dts[] = {KV_CACHE_F32, KV_CACHE_F16, KV_CACHE_INT8};
    for (int ti = 0; ti < n_targets; ti++)
        for (size_t d = 0; d < KV_ARRAY_LEN(dts); d++)
            for (int bs = 4; bs <= 16; bs *= 4)
                for (size_t w = 0; w < KV_ARRAY_LEN(windows); w++) one_window(&targets[ti], dts[d], bs, windows[w]);
    report(OP_ATTN_WIN);
}

/* ---- the mixture-of-experts ops ------------------------------------------------------ */

/* moe_route on fresh logits (ties planted: equal logits rank the lower
 * expert first), with and without renormalisation; then scatter_add of an
 * expert's rows onto distinct token rows. */
static void test_moe_ops(void) {
    init_targets();
    REQUIRE(cpu);
    enum { N = 37, E = 64, K = 6, DIM = 640, ROWS = 23 };
    float *lg = malloc(sizeof(float) * N * E), *wc = malloc(sizeof(float) * N * K), *wt = malloc(sizeof(float) * N * K);
    int32_t *ic = malloc(sizeof(int32_t) * N * K), *it = malloc(sizeof(int32_t) * N * K);
    float *x = malloc(sizeof(float) * N * DIM), *xc = malloc(sizeof(float) * N * DIM), *xt = malloc(sizeof(float) * N * DIM);
    float *y = malloc(sizeof(float) * ROWS * DIM), *w = malloc(sizeof(float) * ROWS);
    int32_t rows[ROWS];
    REQUIRE(lg && wc && wt && ic && it && x && xc && xt && y && w);
    harness_fill_rand(lg, (size_t)N * E, 4.0f);
    for (int r = 0; r < N; r += 5) lg[r * E + 7] = lg[r * E + 3]; /* ties */
    harness_fill_rand(x, (size_t)N * DIM, 1.0f);
    harness_fill_rand(y, (size_t)ROWS * DIM, 1.0f);
    harness_fill_rand(w, ROWS, 1.0f);
    for (int i = 0; i < ROWS; i++) rows[i] = (i * 7 + 3) % N; /* distinct: 7 is prime to 37 */
    for (int ti = 0; ti < n_targets; ti++) {
        target *t = &targets[ti];
        kv_backend *b = t->b;
        float *dl = test_put(b, lg, sizeof(float) * N * E), *dw = test_put(b, wt, sizeof(float) * N * K);
        int32_t *di = test_put(b, it, sizeof(int32_t) * N * K);
        REQUIRE(dl && dw && di);
        for (int norm = 0; norm < 2; norm++) {
            cpu->ops->moe_route(cpu, lg, N, E, K, norm, ic, wc);
            b->ops->moe_route(b, dl, N, E, K, norm, di, dw);
            get(b, it, di, sizeof(int32_t) * N * K);
            get(b, wt, dw, sizeof(float) * N * K);
            CHECKF(!memcmp(ic, it, sizeof(int32_t) * N * K), "%s moe_route (norm %d): other experts chosen", t->name,
                   norm);
            judge(t, OP_MOE_ROUTE, harness_nerr(wt, wc, (size_t)N * K), norm ? "renormalised" : "softmax");
        }
        float *dx = test_put(b, x, sizeof(float) * N * DIM), *dy = test_put(b, y, sizeof(float) * ROWS * DIM);
        float *dwr = test_put(b, w, sizeof(float) * ROWS);
        int32_t *dr = test_put(b, rows, sizeof rows);
        REQUIRE(dx && dy && dwr && dr);
        memcpy(xc, x, sizeof(float) * N * DIM);
        cpu->ops->scatter_add(cpu, xc, y, rows, w, ROWS, DIM);
        b->ops->scatter_add(b, dx, dy, dr, dwr, ROWS, DIM);
        get(b, xt, dx, sizeof(float) * N * DIM);
        judge(t, OP_SCATTER_ADD, harness_nerr(xt, xc, (size_t)N * DIM), "");
        check_status(t, "moe_route/scatter_add");
        TEST_DEV_FREE(b, dl, dw, di, dx, dy, dwr, dr);
    }
    FREE_ALL(lg, wc, wt, ic, it, x, xc, xt, y, w);
    report(OP_MOE_ROUTE);
    report(OP_SCATTER_ADD);
}

/* ---- whole forward passes of the new architectures --------------------------------- */

static void test_forward_archs(void) {
    init_targets();
    REQUIRE(cpu);
    char dir[] = "/tmp/kvtop-backend-ext-XXXXXX";
    REQUIRE(mkdtemp(dir));
    static const char *const archs[] = {"gemma3", "qwen2", "llama", "qwen3moe"};
    for (size_t a = 0; a < KV_ARRAY_LEN(archs); a++) {
        kv_mkmodel_params p = forward_params();
        p.arch = archs[a];
        p.n_layers = 6; /* gemma3: five local layers of window 16, one global */
        p.type = KV_TYPE_Q8_0;
        p.seed = 11 + (uint64_t)a;
        p.n_swa = !strcmp(archs[a], "gemma3") ? 16 : 0;
        p.rope_freqs = !strcmp(archs[a], "llama");
        if (!strcmp(archs[a], "qwen3moe")) { /* 8 experts of 64, top 2: each step routes to some, not all */
            p.n_experts = 8;
            p.n_experts_used = 2;
            p.ffn_dim = 64;
            p.head_dim = 32;
        }
        char path[256];
        snprintf(path, sizeof path, "%s/m-%s.gguf", dir, archs[a]);
        kv_err err = {0};
        CHECKF(kv_mkmodel_write(&p, path, &err) == 0, "mkmodel %s: %s", archs[a], err.msg);
        kv_model *m = kv_model_load(path, NULL, &err);
        CHECKF(m != NULL, "load %s: %s", path, err.msg);
        if (!m) {
            unlink(path);
            continue;
        }
        enum { NP = 45, STEPS = 4 }; /* a prompt past the window */
        const int nv = m->hp.n_vocab;
        int32_t prompt[NP], follow[STEPS], picked[STEPS];
        for (int i = 0; i < NP; i++) prompt[i] = 3 + (int32_t)(harness_rand64() % (uint64_t)(nv - 3));
        float *lc = malloc((size_t)(STEPS + 1) * nv * sizeof(float)), *lt = malloc((size_t)(STEPS + 1) * nv * sizeof(float));
        REQUIRE(lc && lt);
        CHECK(run_model(m, cpu, KV_CACHE_F16, prompt, NP, STEPS, NULL, lc, follow) == 0);
        for (int ti = 0; ti < n_targets; ti++) {
            target *t = &targets[ti];
            int rc = run_model(m, t->b, KV_CACHE_F16, prompt, NP, STEPS, follow, lt, picked);
            CHECKF(rc == 0, "%s forward %s", t->name, archs[a]);
            if (rc == 0) judge(t, OP_FORWARD, harness_nerr(lt, lc, (size_t)(STEPS + 1) * nv), archs[a]);
            check_status(t, archs[a]);
            forget_host(t);
        }
        FREE_ALL(lc, lt);
        kv_model_free(m);
        unlink(path);
    }
    rmdir(dir);
    report(OP_FORWARD);
}

TEST_MAIN(T(test_gelu_scale_add_rows), T(test_rope_ext), T(test_attention_window), T(test_moe_ops), T(test_forward_archs),
          T(test_zz_release))
