/* test_backend_ops.c - every op of every compiled-in backend against the CPU
 * backend (ggml's test-backend-ops idea): fresh random inputs, outputs
 * compared by normalised error ||y - y_cpu|| / ||y_cpu||, then whole forward
 * passes (random models of each weight type, and stories260K's golden greedy
 * ids). The "sim" backend computes with the CPU kernels, so it must match
 * exactly; others (cuda) within per-op tolerances. After every group of
 * ops each backend's ops.status must report no failure, and an op asked for
 * more than was reserved must fail there, naming the op. A backend that
 * cannot be created here (no GPU) is skipped with a note. Built by
 * `make test-gpu`. */
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
#include "../../kernels/types.h"
#include "../backend_helpers.h"
#include "../engine_helpers.h"
#include "../harness.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Per-op tolerances of the non-exact backends (normalised error). The
 * arithmetic is the CPU's; what differs is summation order, fused
 * multiply-adds and the math library's cosf/expf. get_rows and add are
 * exact. A whole forward is looser: a last-bit difference can move an
 * activation across a q8 rounding boundary, and layers pass it on (the
 * golden greedy ids are the strict end-to-end check). */
enum { OP_MATMUL, OP_GET_ROWS, OP_RMSNORM, OP_ROPE, OP_SILU, OP_ADD, OP_KV_STORE, OP_ATTENTION, OP_FORWARD, OP_N };
static const char *const op_names[OP_N] = {"matmul", "get_rows", "rmsnorm", "rope", "silu_mul",
                                           "add", "kv_store", "attention", "forward"};
static const double op_tol[OP_N] = {2e-5, 0.0, 1e-5, 1e-5, 1e-5, 0.0, 1e-6, 1e-4, 1e-2};

#include "gpu_compare.h"

static const kv_type wtypes[] = {KV_TYPE_F32, KV_TYPE_F16, KV_TYPE_BF16, KV_TYPE_Q8_0, KV_TYPE_Q4_0, KV_TYPE_Q4_1};

/* ---- matmul --------------------------------------------------------------------- */

static void one_matmul(target *t, kv_type ty, int M, int K, int n, int lazy) {
    kv_backend *b = t->b;
    void *owned;
    kv_tensor w = test_make_weight(ty, M, K, &owned);
    float *x = malloc((size_t)n * K * sizeof(float));
    float *yc = malloc((size_t)n * M * sizeof(float)), *yt = malloc((size_t)n * M * sizeof(float));
    REQUIRE(owned && x && yc && yt);
    harness_fill_rand(x, (size_t)n * K, 2.0f);
    kv_err err = {0};
    kv_tensor wc = w, wt = w;
    REQUIRE(cpu->ops->upload_weight(cpu, &wc, &err) == 0);
    cpu->ops->matmul(cpu, &wc, x, yc, n);
    /* lazy: the forward pass's way, a host weight the backend has not seen */
    if (!lazy) CHECKF(b->ops->upload_weight(b, &wt, &err) == 0, "%s upload_weight %s: %s", t->name, kv_type_name(ty), err.msg);
    float *dx = test_put(b, x, (size_t)n * K * sizeof(float)), *dy = test_put(b, NULL, (size_t)n * M * sizeof(float));
    REQUIRE(dx && dy);
    b->ops->matmul(b, &wt, dx, dy, n);
    get(b, yt, dy, (size_t)n * M * sizeof(float));
    char what[96];
    snprintf(what, sizeof what, "%s M=%d K=%d n=%d%s", kv_type_name(ty), M, K, n, lazy ? " (lazy weight)" : "");
    judge(t, OP_MATMUL, harness_nerr(yt, yc, (size_t)n * M), what);
    check_status(t, what);
    TEST_DEV_FREE(b, dx, dy);
    forget_host(t);
    FREE_ALL(owned, x, yc, yt);
}

static void test_matmul(void) {
    init_targets();
    REQUIRE(cpu);
    static const int shapes[][2] = {{48, 64}, {130, 256}, {96, 1024}};
    static const int ns[] = {1, 2, 7, 8, 9, 31, 70};
    for (int ti = 0; ti < n_targets; ti++) {
        int k = 0;
        for (size_t ty = 0; ty < KV_ARRAY_LEN(wtypes); ty++)
            for (size_t s = 0; s < KV_ARRAY_LEN(shapes); s++)
                for (size_t j = 0; j < KV_ARRAY_LEN(ns); j++)
                    one_matmul(&targets[ti], wtypes[ty], shapes[s][0], shapes[s][1], ns[j], (k++ % 3) == 2);
        /* float rows that are no multiple of 32 (stories260K's ffn is 172) */
        for (int ty = 0; ty < 3; ty++) {
            one_matmul(&targets[ti], wtypes[ty], 64, 172, 1, 0);
            one_matmul(&targets[ti], wtypes[ty], 70, 172, 13, 0);
        }
    }
    report(OP_MATMUL);
}

/* ---- get_rows ------------------------------------------------------------------- */

static void test_get_rows(void) {
    init_targets();
    REQUIRE(cpu);
    const int M = 50, K = 128, n = 9;
    int32_t ids[9] = {0, 49, 7, 7, 3, 0, 25, 48, 1};
    for (int ti = 0; ti < n_targets; ti++) {
        target *t = &targets[ti];
        kv_backend *b = t->b;
        int32_t *dids = test_put(b, ids, sizeof ids);
        float *dout = test_put(b, NULL, (size_t)n * K * sizeof(float));
        float *oc = malloc((size_t)n * K * sizeof(float)), *ot = malloc((size_t)n * K * sizeof(float));
        REQUIRE(dids && dout && oc && ot);
        for (size_t ty = 0; ty < KV_ARRAY_LEN(wtypes); ty++) {
            void *owned;
            kv_tensor w = test_make_weight(wtypes[ty], M, K, &owned);
            REQUIRE(owned);
            kv_tensor wt = w;
            cpu->ops->get_rows(cpu, &w, ids, oc, n);
            b->ops->get_rows(b, &wt, dids, dout, n); /* lazy weight copy */
            get(b, ot, dout, (size_t)n * K * sizeof(float));
            judge(t, OP_GET_ROWS, harness_nerr(ot, oc, (size_t)n * K), kv_type_name(wtypes[ty]));
            forget_host(t);
            free(owned);
        }
        /* rows of an activation buffer viewed as an f32 matrix (the forward's logit rows) */
        float *act = malloc((size_t)M * K * sizeof(float));
        REQUIRE(act);
        harness_fill_rand(act, (size_t)M * K, 3.0f);
        float *dact = test_put(b, act, (size_t)M * K * sizeof(float));
        REQUIRE(dact);
        kv_tensor vc = {.type = KV_TYPE_F32, .ne0 = K, .ne1 = M, .nb1 = K * sizeof(float), .data = act, .dev = act};
        kv_tensor vt = vc;
        vt.data = dact;
        vt.dev = dact;
        cpu->ops->get_rows(cpu, &vc, ids, oc, n);
        b->ops->get_rows(b, &vt, dids, dout, n);
        get(b, ot, dout, (size_t)n * K * sizeof(float));
        judge(t, OP_GET_ROWS, harness_nerr(ot, oc, (size_t)n * K), "activation view");
        check_status(t, "get_rows");
        TEST_DEV_FREE(b, dact, dids, dout);
        FREE_ALL(act, oc, ot);
    }
    report(OP_GET_ROWS);
}

/* ---- element-wise ----------------------------------------------------------------- */

static void test_rmsnorm(void) {
    init_targets();
    REQUIRE(cpu);
    static const int dims[] = {64, 576, 2048}, ns[] = {1, 5, 33};
    for (int ti = 0; ti < n_targets; ti++) {
        target *t = &targets[ti];
        kv_backend *b = t->b;
        for (size_t di = 0; di < 3; di++)
            for (size_t ni = 0; ni < 3; ni++) {
                const int dim = dims[di], n = ns[ni];
                const size_t N = (size_t)n * dim, bytes = N * sizeof(float);
                float *x = malloc(bytes), *w = malloc(dim * sizeof(float)), *oc = malloc(bytes), *ot = malloc(bytes);
                REQUIRE(x && w && oc && ot);
                harness_fill_rand(x, N, 4.0f);
                harness_fill_rand(w, (size_t)dim, 1.5f);
                float *dx = test_put(b, x, bytes), *dout = test_put(b, NULL, bytes), *dw = test_put(b, w, dim * sizeof(float));
                REQUIRE(dx && dout && dw);
                cpu->ops->rmsnorm(cpu, x, w, oc, n, dim, 1e-5f);
                b->ops->rmsnorm(b, dx, w, dout, n, dim, 1e-5f); /* host weight, as the forward passes it */
                get(b, ot, dout, bytes);
                char what[64];
                snprintf(what, sizeof what, "n=%d dim=%d", n, dim);
                judge(t, OP_RMSNORM, harness_nerr(ot, oc, N), what);
                b->ops->rmsnorm(b, dx, dw, dx, n, dim, 1e-5f); /* device weight, in place */
                get(b, ot, dx, bytes);
                judge(t, OP_RMSNORM, harness_nerr(ot, oc, N), "in place");
                check_status(t, "rmsnorm");
                TEST_DEV_FREE(b, dx, dout, dw);
                forget_host(t);
                FREE_ALL(x, w, oc, ot);
            }
    }
    report(OP_RMSNORM);
}

/* plain rope, base 10000 (variant 0) or 100000 (1) */
static void apply_rope(kv_backend *b, float *x, const int32_t *pos, int n, int H, int hd, int rot, int neox, int v) {
    b->ops->rope(b, x, pos, n, H, hd, rot, v ? 100000.0f : 10000.0f, neox);
}

static void test_rope(void) { rope_battery(OP_ROPE, 5000, 2, apply_rope); }

static void test_silu_mul_add(void) {
    init_targets();
    REQUIRE(cpu);
    const int64_t count = 100003;
    const size_t bytes = (size_t)count * sizeof(float);
    for (int ti = 0; ti < n_targets; ti++) {
        target *t = &targets[ti];
        kv_backend *b = t->b;
        float *g = malloc(bytes), *u = malloc(bytes), *gt = malloc(bytes);
        REQUIRE(g && u && gt);
        harness_fill_rand(g, (size_t)count, 8.0f);
        harness_fill_rand(u, (size_t)count, 2.0f);
        float *dg = test_put(b, g, bytes), *du = test_put(b, u, bytes);
        REQUIRE(dg && du);
        cpu->ops->silu_mul(cpu, g, u, count);
        b->ops->silu_mul(b, dg, du, count);
        get(b, gt, dg, bytes);
        judge(t, OP_SILU, harness_nerr(gt, g, (size_t)count), "");
        b->ops->upload(b, dg, g, bytes); /* same start for add */
        cpu->ops->add(cpu, g, u, count);
        b->ops->add(b, dg, du, count);
        get(b, gt, dg, bytes);
        judge(t, OP_ADD, harness_nerr(gt, g, (size_t)count), "");
        check_status(t, "silu_mul/add");
        TEST_DEV_FREE(b, dg, du);
        FREE_ALL(g, u, gt);
    }
    report(OP_SILU);
    report(OP_ADD);
}

/* ---- paged KV: kv_store, attention, copy_block ------------------------------------ */

typedef struct kv_case {
    int head_dim, n_kv_heads, n_heads, block_size;
} kv_case;

/* Decoded rows of every slot a batch wrote, both backends. */
static double pages_err(const kv_pages *pc, const kv_pages *pt_host, const kv_attn_batch *ab, int layer,
                        int *bytes_differ) {
    const int hd = pc->head_dim;
    float *a = malloc(hd * sizeof(float)), *bb = malloc(hd * sizeof(float));
    double num = 0, den = 0;
    for (int i = 0; a && bb && i < ab->n_tokens; i++)
        for (int g = 0; g < pc->n_kv_heads; g++)
            for (int kv = 0; kv < 2; kv++) {
                size_t off = kv_pages_row_offset(pc, layer, ab->slot[i], g);
                const uint8_t *rc = (kv ? pc->v : pc->k) + off, *rt = (kv ? pt_host->v : pt_host->k) + off;
                *bytes_differ += memcmp(rc, rt, pc->row_bytes) != 0;
                kv_dtype_decode_row(pc->dtype, rc, a, hd);
                kv_dtype_decode_row(pc->dtype, rt, bb, hd);
                for (int k = 0; k < hd; k++) {
                    double d = (double)bb[k] - a[k];
                    num += d * d;
                    den += (double)a[k] * a[k];
                }
            }
    free(a);
    free(bb);
    if (!(num == num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void one_kv(target *t, kv_cache_dtype dt, kv_case kc) {
    kv_backend *b = t->b;
    kv_pages pc = {.dtype = dt, .n_layers = 2, .n_kv_heads = kc.n_kv_heads, .head_dim = kc.head_dim,
                   .block_size = kc.block_size, .n_blocks = 24};
    kv_pages_set_sizes(&pc);
    const size_t total = pc.layer_bytes * pc.n_layers;
    kv_pages pt = pc, ph = pc; /* target pages, and a host copy of them */
    pc.k = calloc(1, total);
    pc.v = calloc(1, total);
    ph.k = malloc(total);
    ph.v = malloc(total);
    pt.k = test_put(b, pc.k, total);
    pt.v = test_put(b, pc.v, total);
    REQUIRE(pc.k && pc.v && ph.k && ph.v && pt.k && pt.v);
    /* three sequences with shuffled block tables over the pool */
    int32_t perm[24];
    for (int i = 0; i < 24; i++) perm[i] = i;
    for (int i = 23; i > 0; i--) {
        int j = (int)(harness_rand64() % (uint64_t)(i + 1));
        int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    const int per_seq = 6; /* blocks per sequence's table */
    const int32_t *tables[3] = {perm, perm + per_seq, perm + 2 * per_seq};
    const int cap = per_seq * kc.block_size;
    int len[3] = {0, 0, 0};
    /* batch 1: a prefill chunk of seq 0 and of seq 1; batch 2: decode tokens
     * of 0 and 1 and a first chunk of seq 2; batch 3: one decode token each */
    const int plan[3][3] = {{KV_MIN(20, cap - 3), KV_MIN(7, cap - 3), 0}, {1, 1, 5}, {1, 1, 1}};
    const int nh = kc.n_heads, hd = kc.head_dim, kvd = kc.n_kv_heads * hd;
    enum { MAXT = 64 };
    int32_t pos[MAXT], seq[MAXT], slot[MAXT];
    float *k = malloc(MAXT * (size_t)kvd * sizeof(float)), *v = malloc(MAXT * (size_t)kvd * sizeof(float));
    float *q = malloc(MAXT * (size_t)nh * hd * sizeof(float));
    float *oc = malloc(MAXT * (size_t)nh * hd * sizeof(float)), *ot = malloc(MAXT * (size_t)nh * hd * sizeof(float));
    float *dk = test_put(b, NULL, MAXT * (size_t)kvd * sizeof(float)), *dv = test_put(b, NULL, MAXT * (size_t)kvd * sizeof(float));
    float *dq = test_put(b, NULL, MAXT * (size_t)nh * hd * sizeof(float));
    float *dout = test_put(b, NULL, MAXT * (size_t)nh * hd * sizeof(float));
    REQUIRE(k && v && q && oc && ot && dk && dv && dq && dout);
    for (int step = 0; step < 3; step++) {
        int n = 0;
        for (int s = 0; s < 3; s++)
            for (int j = 0; j < plan[step][s] && n < MAXT; j++, n++) {
                pos[n] = len[s] + j;
                seq[n] = s;
                slot[n] = tables[s][pos[n] / kc.block_size] * kc.block_size + pos[n] % kc.block_size;
            }
        for (int s = 0; s < 3; s++) len[s] += plan[step][s];
        kv_attn_batch ab = {.n_tokens = n, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 3, .tables = tables};
        harness_fill_rand(k, (size_t)n * kvd, 2.0f);
        harness_fill_rand(v, (size_t)n * kvd, 2.0f);
        harness_fill_rand(q, (size_t)n * nh * hd, 2.0f);
        b->ops->upload(b, dk, k, (size_t)n * kvd * sizeof(float));
        b->ops->upload(b, dv, v, (size_t)n * kvd * sizeof(float));
        b->ops->upload(b, dq, q, (size_t)n * nh * hd * sizeof(float));
        for (int l = 0; l < 2; l++) {
            const float scale = 1.0f / sqrtf((float)hd);
            cpu->ops->kv_store(cpu, &pc, l, &ab, k, v);
            cpu->ops->attention(cpu, &pc, l, &ab, q, oc, nh, scale);
            b->ops->kv_store(b, &pt, l, &ab, dk, dv);
            b->ops->attention(b, &pt, l, &ab, dq, dout, nh, scale);
            get(b, ot, dout, (size_t)n * nh * hd * sizeof(float));
            get(b, ph.k, pt.k, total);
            get(b, ph.v, pt.v, total);
            char what[128];
            snprintf(what, sizeof what, "%s hd=%d kv=%d/%d bs=%d batch %d layer %d", kv_cache_dtype_name(dt), hd,
                     kc.n_kv_heads, nh, kc.block_size, step, l);
            int differ = 0;
            judge(t, OP_KV_STORE, pages_err(&pc, &ph, &ab, l, &differ), what);
            if (differ && !t->exact) printf("  note: %s kv_store %s: %d rows not byte-equal\n", t->name, what, differ);
            judge_tol(t, OP_ATTENTION, harness_nerr(ot, oc, (size_t)n * nh * hd), test_attn_tol(cpu, dt, op_tol[OP_ATTENTION]), what);
        }
    }
    /* copy-on-write of a used block into a free one, then compare whole pools */
    const int src = tables[0][0], dst = perm[23];
    cpu->ops->copy_block(cpu, &pc, dst, src);
    b->ops->copy_block(b, &pt, dst, src);
    get(b, ph.k, pt.k, total);
    get(b, ph.v, pt.v, total);
    const size_t bb = (size_t)pc.block_size * pc.slot_bytes;
    int same = 1;
    for (int l = 0; l < 2; l++) {
        size_t o = (size_t)l * pc.layer_bytes + (size_t)dst * bb;
        same &= !memcmp(ph.k + o, pc.k + o, bb) || !t->exact;
        /* the copy equals the target's own source block */
        same &= !memcmp(ph.k + o, ph.k + (size_t)l * pc.layer_bytes + (size_t)src * bb, bb);
        same &= !memcmp(ph.v + o, ph.v + (size_t)l * pc.layer_bytes + (size_t)src * bb, bb);
    }
    CHECKF(same, "%s copy_block %s", t->name, kv_cache_dtype_name(dt));
    check_status(t, "kv ops");
    void *bufs[] = {pt.k, pt.v, dk, dv, dq, dout};
    for (size_t i = 0; i < KV_ARRAY_LEN(bufs); i++) b->ops->free(b, bufs[i]);
    FREE_ALL(pc.k, pc.v, ph.k, ph.v, k, v, q, oc, ot);
}

static void test_kv_attention(void) {
    init_targets();
    REQUIRE(cpu);
    static const kv_case cases[] = {{64, 2, 8, 16}, {8, 4, 8, 16}, {128, 1, 4, 4}, {96, 3, 9, 8}};
    for (int ti = 0; ti < n_targets; ti++)
        for (int dt = 0; dt < KV_CACHE_DTYPE_COUNT; dt++)
            for (size_t c = 0; c < KV_ARRAY_LEN(cases); c++) one_kv(&targets[ti], (kv_cache_dtype)dt, cases[c]);
    report(OP_KV_STORE);
    report(OP_ATTENTION);
}

/* ---- memory, copies, weights ------------------------------------------------------- */

static void test_memory_and_copies(void) {
    init_targets();
    REQUIRE(cpu);
    for (int ti = 0; ti < n_targets; ti++) {
        target *t = &targets[ti];
        kv_backend *b = t->b;
        kv_backend_mem m0, m1;
        b->ops->mem_info(b, &m0);
        CHECKF(m0.valid == 1 && m0.total_bytes > 0 && m0.used_bytes <= m0.total_bytes, "%s mem_info", t->name);
        const size_t big = (size_t)64 << 20;
        void *p = b->ops->alloc(b, big);
        REQUIRE(p);
        b->ops->mem_info(b, &m1);
        CHECKF(m1.used_bytes >= m0.used_bytes + big / 2, "%s: 64 MiB allocated, used %llu -> %llu", t->name,
               (unsigned long long)m0.used_bytes, (unsigned long long)m1.used_bytes);
        /* round trip of odd-sized random bytes, at an offset */
        const size_t nb = 1000003;
        uint8_t *src = malloc(nb), *back = malloc(nb);
        REQUIRE(src && back);
        for (size_t i = 0; i < nb; i++) src[i] = (uint8_t)harness_rand64();
        b->ops->upload(b, (uint8_t *)p + 13, src, nb);
        memset(back, 0, nb);
        b->ops->download(b, back, (uint8_t *)p + 13, nb);
        CHECKF(!memcmp(src, back, nb), "%s upload/download round trip", t->name);
        b->ops->free(b, p);
        b->ops->free(b, NULL); /* a no-op */
        free(src);
        free(back);

        /* weights: bad ones are refused with a message; accepted ones compute as the CPU does */
        void *owned;
        kv_tensor w = test_make_weight(KV_TYPE_Q8_0, 8, 64, &owned);
        REQUIRE(owned);
        kv_tensor bad = w;
        bad.nb1 = 10; /* below the row size */
        kv_err err = {0};
        CHECKF(b->ops->upload_weight(b, &bad, &err) < 0 && err.msg[0], "%s accepted a short row stride", t->name);
        kv_tensor odd = w;
        odd.type = (kv_type)99;
        kv_err e2 = {0};
        CHECKF(b->ops->upload_weight(b, &odd, &e2) < 0 && e2.msg[0], "%s accepted type 99", t->name);
        void *qk;
        kv_tensor wk = test_make_weight(KV_TYPE_Q4_K, 16, 256, &qk);
        REQUIRE(qk);
        kv_err e3 = {0};
        int rc = b->ops->upload_weight(b, &wk, &e3);
        if (rc != 0) {
            CHECKF(rc < 0 && strstr(e3.msg, "q4_k"), "%s: q4_k refused without naming it: %s", t->name, e3.msg);
        } else {
            float x[256], yc[16], yt[16];
            harness_fill_rand(x, 256, 1.0f);
            float *dx = test_put(b, x, sizeof x), *dy = test_put(b, NULL, sizeof yt);
            REQUIRE(dx && dy);
            cpu->ops->matmul(cpu, &wk, x, yc, 1);
            b->ops->matmul(b, &wk, dx, dy, 1);
            get(b, yt, dy, sizeof yt);
            judge(t, OP_MATMUL, harness_nerr(yt, yc, 16), "q4_k");
            TEST_DEV_FREE(b, dx, dy);
        }
        check_status(t, "memory tests");
        forget_host(t);
        free(owned);
        free(qk);
    }
}

/* ---- whole forward passes ----------------------------------------------------------- */

static void test_forward_random_models(void) {
    init_targets();
    REQUIRE(cpu);
    char dir[] = "/tmp/kvtop-backend-ops-XXXXXX";
    REQUIRE(mkdtemp(dir));
    static const kv_type types[] = {KV_TYPE_F16, KV_TYPE_BF16, KV_TYPE_Q8_0, KV_TYPE_Q4_0, KV_TYPE_Q4_1};
    for (size_t ty = 0; ty < KV_ARRAY_LEN(types); ty++) {
        kv_mkmodel_params p = forward_params();
        p.type = types[ty];
        p.seed = 7 + ty;
        char path[256];
        snprintf(path, sizeof path, "%s/m-%s.gguf", dir, kv_type_name(types[ty]));
        kv_err err = {0};
        CHECKF(kv_mkmodel_write(&p, path, &err) == 0, "mkmodel %s: %s", kv_type_name(types[ty]), err.msg);
        kv_model *m = kv_model_load(path, NULL, &err);
        CHECKF(m != NULL, "load %s: %s", path, err.msg);
        if (!m) {
            unlink(path);
            continue;
        }
        const int np = 21, steps = 3, nv = m->hp.n_vocab;
        int32_t prompt[21], picked[3], tpicked[3];
        for (int i = 0; i < np; i++) prompt[i] = 3 + (int32_t)(harness_rand64() % (uint64_t)(nv - 3));
        float *lc = malloc((size_t)(steps + 1) * nv * sizeof(float)), *lt = malloc((size_t)(steps + 1) * nv * sizeof(float));
        REQUIRE(lc && lt);
        const kv_cache_dtype dts[] = {KV_CACHE_F32, KV_CACHE_F16, KV_CACHE_INT8};
        for (size_t d = 0; d < KV_ARRAY_LEN(dts); d++) {
            if (run_model(m, cpu, dts[d], prompt, np, steps, NULL, lc, picked) != 0) {
                CHECK(0);
                continue;
            }
            for (int ti = 0; ti < n_targets; ti++) {
                target *t = &targets[ti];
                int rc = run_model(m, t->b, dts[d], prompt, np, steps, picked, lt, tpicked);
                CHECKF(rc == 0, "%s forward %s", t->name, kv_type_name(types[ty]));
                char what[64];
                snprintf(what, sizeof what, "%s model, kv %s", kv_type_name(types[ty]), kv_cache_dtype_name(dts[d]));
                if (rc == 0) judge(t, OP_FORWARD, harness_nerr(lt, lc, (size_t)(steps + 1) * nv), what);
                check_status(t, what);
                forget_host(t); /* the model is freed below */
            }
        }
        free(lc);
        free(lt);
        kv_model_free(m);
        unlink(path);
    }
    rmdir(dir);
    report(OP_FORWARD);
}

/* stories260K greedy from "Once upon a time" (../shared/models/README.md). */
static void test_forward_golden(void) {
    init_targets();
    REQUIRE(cpu);
    const char *path = harness_shared_path("models/stories260K.gguf");
    if (access(path, R_OK) != 0) {
        printf("  note: %s not found (set KVTOP_SHARED); golden check skipped\n", path);
        return;
    }
    kv_err err = {0};
    kv_model *m = kv_model_load(path, NULL, &err);
    REQUIRE(m);
    static const int32_t prompt[5] = {1, 403, 407, 261, 378};
    static const int32_t want[36] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
                                     401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282,
                                     295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352};
    const int steps = 36, nv = m->hp.n_vocab;
    float *lg = malloc((size_t)(steps + 1) * nv * sizeof(float));
    int32_t got[36];
    REQUIRE(lg);
    kv_backend *all[9] = {cpu};
    const char *names[9] = {"cpu"};
    for (int i = 0; i < n_targets; i++) {
        all[i + 1] = targets[i].b;
        names[i + 1] = targets[i].name;
    }
    for (int i = 0; i <= n_targets; i++) {
        for (int f16 = 0; f16 < 2; f16++) {
            memset(got, 0, sizeof got);
            int rc = run_model(m, all[i], f16 ? KV_CACHE_F16 : KV_CACHE_F32, prompt, 5, steps, NULL, lg, got);
            int same = rc == 0 && !memcmp(got, want, sizeof want);
            CHECKF(same, "%s (kv %s): greedy ids differ from the reference", names[i], f16 ? "f16" : "f32");
            if (f16 == 0) printf("  %-5s stories260K golden greedy: %s\n", names[i], same ? "ok" : "DIFFERS");
        }
        if (i > 0) forget_host(&targets[i - 1]);
    }
    free(lg);
    kv_model_free(m);
}

/* The failure path on every backend: a quantized matmul of more and longer
 * rows than were reserved fails at ops.status with KV_ERR_BACKEND naming
 * the op, the record is then clear, and the next op within the limits
 * works. */
static void test_status(void) {
    init_targets();
    REQUIRE(cpu);
    target all[9];
    int n = 0;
    all[n++] = (target){.name = "cpu", .b = cpu};
    for (int i = 0; i < n_targets; i++) all[n++] = targets[i];
    const int M = 32, K = 2 * (int)op_limits.max_k, rows = op_limits.max_rows + 1;
    void *owned, *owned_ok;
    kv_tensor w = test_make_weight(KV_TYPE_Q8_0, M, K, &owned);
    kv_tensor w_ok = test_make_weight(KV_TYPE_Q8_0, M, K / 2, &owned_ok);
    REQUIRE(owned && owned_ok);
    float *hx = malloc((size_t)rows * K * sizeof(float));
    REQUIRE(hx);
    harness_fill_rand(hx, (size_t)rows * K, 1.0f);
    for (int i = 0; i < n; i++) {
        kv_backend *b = all[i].b;
        kv_err err = {0};
        CHECKF(b->ops->status(b, &err) == 0, "%s: %s", all[i].name, err.msg);
        float *dx = test_put(b, hx, (size_t)rows * K * sizeof(float)), *dy = test_put(b, NULL, (size_t)rows * M * sizeof(float));
        REQUIRE(dx && dy);
        b->ops->matmul(b, &w, dx, dy, rows);
        kv_err_clear(&err);
        int rc = b->ops->status(b, &err);
        CHECKF(rc == KV_ERR_BACKEND && strncmp(err.msg, "matmul: ", 8) == 0, "%s: rc %d, '%s'", all[i].name, rc,
               err.msg);
        CHECKF(b->ops->status(b, &err) == 0, "%s: not cleared: %s", all[i].name, err.msg);
        b->ops->matmul(b, &w_ok, dx, dy, rows - 1);
        CHECKF(b->ops->status(b, &err) == 0, "%s within the limits: %s", all[i].name, err.msg);
        TEST_DEV_FREE(b, dx, dy);
        if (i > 0) forget_host(&targets[i - 1]);
    }
    FREE_ALL(hx, owned, owned_ok);
}

/* A backend whose attention batch was reserved (max_seqs 2, 2 blocks a
 * table: what kv_engine_new asks) runs batches within that, and refuses
 * one past it with a failure naming the reservation instead of
 * allocating; the next batch within works again. The CPU backend has no
 * such bound (it allocates nothing for the meta), so only the others are
 * held to it. */
static void test_reserved_batch_meta(void) {
    init_targets();
    REQUIRE(cpu);
    int checked = 0;
    for (int ti = 0; ti < n_targets; ti++) {
        if (targets[ti].exact) continue; /* sim: the cpu underneath */
        checked++;
        kv_err err = {0};
        kv_backend *b = kv_backend_create(targets[ti].name, 2, &err);
        REQUIRE(b);
        kv_backend_limits lim = op_limits;
        lim.max_seqs = 2;
        lim.max_blocks_per_seq = 2;
        lim.rope_dim = 16;
        lim.rope_base = 10000.0f;
        CHECKF(kv_backend_reserve(b, &lim, &err) == 0, "%s: %s", targets[ti].name, err.msg);
        kv_pages pt = {.dtype = KV_CACHE_F32, .n_layers = 1, .n_kv_heads = 1, .head_dim = 16, .block_size = 4,
                       .n_blocks = 8};
        kv_pages_set_sizes(&pt);
        const size_t total = pt.layer_bytes * pt.n_layers;
        pt.k = test_put(b, NULL, total);
        pt.v = test_put(b, NULL, total);
        float *dk = test_put(b, NULL, 4 * 16 * sizeof(float)), *dv = test_put(b, NULL, 4 * 16 * sizeof(float));
        float *dq = test_put(b, NULL, 4 * 16 * sizeof(float)), *dout = test_put(b, NULL, 4 * 16 * sizeof(float));
        REQUIRE(pt.k && pt.v && dk && dv && dq && dout);
        const int32_t t0[] = {0, 1}, t1[] = {2, 3}, t2[] = {4, 5};
        const int32_t *tables[3] = {t0, t1, t2};
        int32_t pos[3] = {5, 6, 1}, seq[3] = {0, 1, 2}, slot[3] = {1 * 4 + 1, 3 * 4 + 2, 4 * 4 + 1};
        for (int round = 0; round < 3; round++) {
            int n_seqs = round == 1 ? 3 : 2; /* round 1: one sequence past the reservation */
            kv_attn_batch ab = {.n_tokens = n_seqs, .pos = pos, .seq = seq, .slot = slot, .n_seqs = n_seqs,
                                .tables = tables};
            b->ops->kv_store(b, &pt, 0, &ab, dk, dv);
            b->ops->attention(b, &pt, 0, &ab, dq, dout, 1, 0.25f);
            kv_err_clear(&err);
            int rc = b->ops->status(b, &err);
            if (round == 1)
                CHECKF(rc == KV_ERR_BACKEND && strstr(err.msg, "reserved"), "%s: 3 sequences of 2 reserved: rc %d '%s'",
                       targets[ti].name, rc, err.msg);
            else
                CHECKF(rc == 0, "%s round %d: %s", targets[ti].name, round, err.msg);
        }
        void *bufs[] = {pt.k, pt.v, dk, dv, dq, dout};
        for (size_t i = 0; i < KV_ARRAY_LEN(bufs); i++) b->ops->free(b, bufs[i]);
        kv_backend_free(b);
    }
    if (!checked) printf("  note: no backend with a reserved batch bound here (no GPU): skipped\n");
}

TEST_MAIN(T(test_matmul), T(test_get_rows), T(test_rmsnorm), T(test_rope), T(test_silu_mul_add), T(test_kv_attention),
          T(test_memory_and_copies), T(test_forward_random_models), T(test_forward_golden), T(test_status), T(test_reserved_batch_meta),
          T(test_zz_release))
