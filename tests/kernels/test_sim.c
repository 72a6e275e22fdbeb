/* test_sim.c - the simulated GPU backend: every op gives exactly the CPU
 * backend's bytes, the clock advances by the roofline formula (memory- and
 * compute-bound cases, transfers, paged attention), memory is accounted
 * against the device's capacity, bad device names fail clearly, and the
 * failure contract (status, reserve) and the clock reach callers through
 * the backend table. (The engine on the sim clock: tests/engine/test_sim.c.) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/backend.h"
#include "../../kernels/kv_dtype.h"
#include "../../kernels/sim.h"
#include "../../kernels/types.h"
#include "../backend_helpers.h"
#include "../harness.h"

/* Every op of these tests fits (ops.reserve): 64 rows of 1024, any type. */
static kv_backend *reserved(kv_backend *b, kv_err *err) {
    const kv_backend_limits lim = {.max_rows = 64, .max_k = 1024, .weight_types = 0};
    const char *name = b ? b->ops->name : NULL;
    kv_backend *r = test_reserve(b, &lim, err);
    if (name && !r) fprintf(stderr, "  %s backend: %s\n", name, err->msg);
    return r;
}

static kv_backend *make(const char *name) {
    kv_err err = {0};
    kv_backend *b = kv_backend_create(name, 2, &err);
    if (!b) fprintf(stderr, "  %s backend: %s\n", name, err.msg);
    return reserved(b, &err);
}

/* Relative closeness for the clock checks (the model is plain arithmetic). */
static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b)) + 1e-18; }

/* ---- device table ---------------------------------------------------------- */

static void test_sim_devices(void) {
    int n = 0;
    const kv_sim_device *d = kv_sim_devices(&n);
    CHECK(n == 10);
    const char *want[] = {"h100-sxm", "a100-80g", "l4",       "rtx4090",  "h200",
                          "a100-40g", "l40s",     "mi300x",   "phone-8g", "apple-m3-max"};
    for (int i = 0; i < 10 && i < n; i++) {
        CHECK(!strcmp(d[i].name, want[i]));
        CHECK(kv_sim_device_find(want[i]) == &d[i]);
        CHECK(d[i].mem_bw > 5e10 && d[i].tensor_flops > 1e12 && d[i].vector_flops > 1e12 && d[i].link_bw > 1e9);
        /* every figure has its source; fractions are fractions; only owned devices have no price */
        CHECK(d[i].source && strlen(d[i].source) > 20 && d[i].label);
        CHECK(d[i].bw_frac > 0.5 && d[i].bw_frac <= 1 && d[i].flops_frac > 0.3 && d[i].flops_frac <= 1);
        CHECK(d[i].usd_per_hour > 0 || strstr(d[i].name, "phone") || strstr(d[i].name, "apple"));
        CHECK(d[i].fp8_flops == 0 || d[i].fp8_flops >= d[i].tensor_flops);
    }
    CHECK(kv_sim_device_find("mi300x")->mem_bytes == 192ull << 30 && kv_sim_device_find("h200")->mem_bw == 4.8e12);
    CHECK(kv_sim_peak_flops(kv_sim_device_find("a100-80g"), KV_SIM_PEAK_FP8) == 312e12); /* no FP8: BF16 peak */
    CHECK(kv_sim_peak_flops(kv_sim_device_find("h100"), KV_SIM_PEAK_FP8) == 1979e12);
    const kv_sim_device *h = kv_sim_device_find("H100-SXM");
    REQUIRE(h);
    CHECK(h->mem_bw == 3.35e12 && h->tensor_flops == 989e12 && h->mem_bytes == 80ull << 30);
    CHECK(kv_sim_device_find("h100") == h); /* the profile default's spelling */
    CHECK(kv_sim_device_find("a100") == kv_sim_device_find("a100-80g"));
    CHECK(kv_sim_device_find("l4")->mem_bytes == 23034ull << 20); /* what nvidia-smi reports with ECC on */
    CHECK(kv_sim_device_find("rtx4090")->tensor_flops == 165.2e12);
    CHECK(kv_sim_device_find("tpu") == NULL && kv_sim_device_find(NULL) == NULL);
}

static void test_sim_unknown_device(void) {
    kv_err err = {0};
    CHECK(kv_sim_backend_create_device("tpu-v9", 1, &err) == NULL);
    CHECK(err.code == KV_ERR_INVAL);
    CHECKF(strstr(err.msg, "tpu-v9") && strstr(err.msg, "h100-sxm") && strstr(err.msg, "rtx4090"), "%s", err.msg);
    kv_backend *b = kv_sim_backend_create_device("L4", 1, &err);
    REQUIRE(b);
    kv_sim_stats st;
    kv_sim_stats_get(b, &st);
    CHECK(st.valid && st.device == kv_sim_device_find("l4") && st.elapsed_s == 0.0);
    kv_backend_free(b);
}

static void test_sim_registry(void) {
    int found = 0;
    for (const char *const *n = kv_backend_names(); *n; n++) found |= !strcmp(*n, "sim");
    CHECK(found);
    kv_backend *b = make("sim"), *c = make("cpu");
    REQUIRE(b && c);
    CHECK(!strcmp(b->ops->name, "sim") && kv_sim_is(b) && !kv_sim_is(c) && !kv_sim_is(NULL));
    CHECK(b->n_threads == 2 && kv_sim_inner(b) && kv_sim_inner(c) == NULL);
    kv_sim_stats st;
    kv_sim_stats_get(b, &st);
    CHECK(st.valid && !strcmp(st.device->name, "h100-sxm")); /* the default */
    kv_sim_stats_get(c, &st);
    CHECK(!st.valid);
    CHECK(kv_sim_elapsed_s(c) == 0.0);
    kv_sim_reset(c); /* no-op */
    CHECK(!strcmp(kv_sim_kind_name(KV_SIM_MATMUL), "matmul") && !strcmp(kv_sim_kind_name(KV_SIM_KIND_COUNT), "unknown"));
    kv_backend_free(b);
    kv_backend_free(c);
}

/* ---- exactness --------------------------------------------------------------- */

/* Runs matmul and get_rows for w on both backends; outputs must match byte for byte. */
static void exact_matmul(kv_backend *s, kv_backend *c, kv_type t, int rows, int cols, int n) {
    void *owned;
    kv_tensor w = test_make_weight(t, rows, cols, &owned);
    REQUIRE(owned);
    kv_err err = {0};
    kv_tensor ws = w, wc = w;
    CHECKF(s->ops->upload_weight(s, &ws, &err) == 0, "%s: %s", kv_type_name(t), err.msg);
    CHECK(c->ops->upload_weight(c, &wc, &err) == 0);
    float *x = malloc((size_t)n * cols * sizeof(float));
    float *ys = malloc((size_t)n * rows * sizeof(float)), *yc = malloc((size_t)n * rows * sizeof(float));
    int32_t ids[5] = {0, rows - 1, 3 % rows, 0, rows / 2};
    float *gs = malloc(5 * (size_t)cols * sizeof(float)), *gc = malloc(5 * (size_t)cols * sizeof(float));
    REQUIRE(x && ys && yc && gs && gc);
    harness_fill_rand(x, (size_t)n * cols, 2.0f);
    float *xs = test_put(s, x, (size_t)n * cols * sizeof(float));
    float *dys = s->ops->alloc(s, (size_t)n * rows * sizeof(float));
    int32_t *dids = test_put(s, ids, sizeof ids);
    float *dgs = s->ops->alloc(s, 5 * (size_t)cols * sizeof(float));
    REQUIRE(xs && dys && dids && dgs);
    s->ops->matmul(s, &ws, xs, dys, n);
    s->ops->download(s, ys, dys, (size_t)n * rows * sizeof(float));
    c->ops->matmul(c, &wc, x, yc, n);
    CHECKF(!memcmp(ys, yc, (size_t)n * rows * sizeof(float)), "matmul %s n=%d differs", kv_type_name(t), n);
    s->ops->get_rows(s, &ws, dids, dgs, 5);
    s->ops->download(s, gs, dgs, 5 * (size_t)cols * sizeof(float));
    c->ops->get_rows(c, &wc, ids, gc, 5);
    CHECKF(!memcmp(gs, gc, 5 * (size_t)cols * sizeof(float)), "get_rows %s differs", kv_type_name(t));
    TEST_DEV_FREE(s, xs, dys, dids, dgs);
    FREE_ALL(x, ys, yc, gs, gc, owned);
}

static void test_sim_matmul_exact(void) {
    kv_backend *s = make("sim"), *c = make("cpu");
    REQUIRE(s && c);
    const kv_type types[] = {KV_TYPE_F32, KV_TYPE_F16, KV_TYPE_BF16, KV_TYPE_Q8_0, KV_TYPE_Q4_0, KV_TYPE_Q4_1};
    for (size_t i = 0; i < KV_ARRAY_LEN(types); i++) {
        exact_matmul(s, c, types[i], 48, 64, 1);
        exact_matmul(s, c, types[i], 70, 128, 7);
    }
    exact_matmul(s, c, KV_TYPE_Q4_K, 16, 256, 3); /* a type only the cpu kernels know: delegated too */
    kv_backend_free(s);
    kv_backend_free(c);
}

static void test_sim_elementwise_exact(void) {
    kv_backend *s = make("sim"), *c = make("cpu");
    REQUIRE(s && c);
    const int n = 5, H = 4, hd = 16, dim = H * hd;
    const size_t N = (size_t)n * dim, bytes = N * sizeof(float);
    float *x = malloc(bytes), *y = malloc(bytes), *w = malloc(dim * sizeof(float));
    float *rc = malloc(bytes), *rs = malloc(bytes);
    REQUIRE(x && y && w && rc && rs);
    harness_fill_rand(x, N, 3.0f);
    harness_fill_rand(y, N, 3.0f);
    harness_fill_rand(w, dim, 1.0f);
    int32_t pos[5] = {0, 1, 17, 300, 4095};
    float *dx = test_put(s, x, bytes), *dy = test_put(s, y, bytes);
    REQUIRE(dx && dy);

    /* rmsnorm with a host weight vector, in place (as the forward pass calls it) */
    memcpy(rc, x, bytes);
    c->ops->rmsnorm(c, rc, w, rc, n, dim, 1e-5f);
    s->ops->rmsnorm(s, dx, w, dx, n, dim, 1e-5f);
    s->ops->download(s, rs, dx, bytes);
    CHECK(!memcmp(rs, rc, bytes));
    for (int neox = 0; neox < 2; neox++) {
        c->ops->rope(c, rc, pos, n, H, hd, 12, 10000.0f, neox);
        s->ops->rope(s, dx, pos, n, H, hd, 12, 10000.0f, neox);
        s->ops->download(s, rs, dx, bytes);
        CHECKF(!memcmp(rs, rc, bytes), "rope neox=%d", neox);
    }
    c->ops->silu_mul(c, rc, y, (int64_t)N);
    s->ops->silu_mul(s, dx, dy, (int64_t)N);
    s->ops->download(s, rs, dx, bytes);
    CHECK(!memcmp(rs, rc, bytes));
    c->ops->add(c, rc, y, (int64_t)N);
    s->ops->add(s, dx, dy, (int64_t)N);
    s->ops->download(s, rs, dx, bytes);
    CHECK(!memcmp(rs, rc, bytes));
    /* get_rows over an activation buffer viewed as an f32 matrix */
    kv_tensor view = {.type = KV_TYPE_F32, .ne0 = dim, .ne1 = n, .nb1 = dim * sizeof(float), .data = dx, .dev = dx};
    kv_tensor cview = view;
    cview.data = rc;
    cview.dev = rc;
    int32_t ids[2] = {4, 1};
    int32_t *dids = test_put(s, ids, sizeof ids);
    float *dout = s->ops->alloc(s, 2 * dim * sizeof(float));
    float oc[2 * 64], os[2 * 64];
    REQUIRE(dids && dout);
    c->ops->get_rows(c, &cview, ids, oc, 2);
    s->ops->get_rows(s, &view, dids, dout, 2);
    s->ops->download(s, os, dout, sizeof os);
    CHECK(!memcmp(os, oc, sizeof os));
    TEST_DEV_FREE(s, dx, dy, dids, dout);
    FREE_ALL(x, y, w, rc, rs);
    kv_backend_free(s);
    kv_backend_free(c);
}

/* Paged KV on both backends: stores, attention (GQA, shuffled block
 * tables, two sequences), copy_block; pages and outputs byte-equal. */
static void exact_attention(kv_cache_dtype dt) {
    kv_backend *s = make("sim"), *c = make("cpu");
    REQUIRE(s && c);
    kv_pages pc = {.dtype = dt, .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_size = 4, .n_blocks = 12};
    kv_pages_set_sizes(&pc);
    size_t total = pc.layer_bytes * pc.n_layers;
    kv_pages ps = pc;
    uint8_t *zero = calloc(1, total), *hk = malloc(total);
    pc.k = calloc(1, total);
    pc.v = calloc(1, total);
    ps.k = test_put(s, zero, total);
    ps.v = test_put(s, zero, total);
    REQUIRE(zero && hk && pc.k && pc.v && ps.k && ps.v);
    const int n_heads = 4, hd = pc.head_dim, kvd = pc.n_kv_heads * hd;
    int32_t t0[4] = {7, 2, 9, 0}, t1[3] = {5, 11, 3};
    const int32_t *tables[2] = {t0, t1};
    /* sequence 0: positions 0..12, sequence 1: positions 0..9, interleaved */
    enum { NT = 23 };
    int32_t pos[NT], seq[NT], slot[NT];
    for (int i = 0; i < NT; i++) {
        seq[i] = i % 2 && i < 21 ? 1 : 0;
        int p = 0;
        for (int j = 0; j < i; j++) p += seq[j] == seq[i];
        pos[i] = p;
        slot[i] = tables[seq[i]][p / 4] * 4 + p % 4;
    }
    kv_attn_batch ab = {.n_tokens = NT, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 2, .tables = tables};
    float *k = malloc(NT * kvd * sizeof(float)), *v = malloc(NT * kvd * sizeof(float));
    float *q = malloc(NT * n_heads * hd * sizeof(float));
    float *oc = malloc(NT * n_heads * hd * sizeof(float)), *os = malloc(NT * n_heads * hd * sizeof(float));
    REQUIRE(k && v && q && oc && os);
    harness_fill_rand(k, NT * kvd, 2.0f);
    harness_fill_rand(v, NT * kvd, 2.0f);
    harness_fill_rand(q, NT * n_heads * hd, 2.0f);
    float *dk = test_put(s, k, NT * kvd * sizeof(float)), *dv = test_put(s, v, NT * kvd * sizeof(float));
    float *dq = test_put(s, q, NT * n_heads * hd * sizeof(float));
    float *dout = s->ops->alloc(s, NT * n_heads * hd * sizeof(float));
    REQUIRE(dk && dv && dq && dout);
    for (int l = 0; l < 2; l++) {
        c->ops->kv_store(c, &pc, l, &ab, k, v);
        s->ops->kv_store(s, &ps, l, &ab, dk, dv);
        c->ops->attention(c, &pc, l, &ab, q, oc, n_heads, 0.25f);
        s->ops->attention(s, &ps, l, &ab, dq, dout, n_heads, 0.25f);
        s->ops->download(s, os, dout, NT * n_heads * hd * sizeof(float));
        CHECKF(!memcmp(os, oc, NT * n_heads * hd * sizeof(float)), "attention %s layer %d", kv_cache_dtype_name(dt), l);
    }
    c->ops->copy_block(c, &pc, 1, 9);
    s->ops->copy_block(s, &ps, 1, 9);
    s->ops->download(s, hk, ps.k, total);
    CHECKF(!memcmp(hk, pc.k, total), "K pages %s", kv_cache_dtype_name(dt));
    s->ops->download(s, hk, ps.v, total);
    CHECKF(!memcmp(hk, pc.v, total), "V pages %s", kv_cache_dtype_name(dt));
    TEST_DEV_FREE(s, ps.k, ps.v, dk, dv, dq, dout);
    FREE_ALL(pc.k, pc.v, zero, hk, k, v, q, oc, os);
    kv_backend_free(s);
    kv_backend_free(c);
}

static void test_sim_attention_exact(void) {
    exact_attention(KV_CACHE_F32);
    exact_attention(KV_CACHE_F16);
    exact_attention(KV_CACHE_INT8);
    exact_attention(KV_CACHE_FP8_E4M3);
}

/* ---- the clock --------------------------------------------------------------- */

static void test_sim_clock_matmul(void) {
    kv_err err = {0};
    kv_backend *b = reserved(kv_sim_backend_create_device("h100-sxm", 2, &err), &err);
    REQUIRE(b);
    const kv_sim_device *d = kv_sim_device_find("h100-sxm");
    const int M = 512, K = 256, n = 4;
    void *owned;
    kv_tensor w = test_make_weight(KV_TYPE_Q8_0, M, K, &owned);
    REQUIRE(owned);
    float *x = test_put(b, NULL, (size_t)n * K * 4), *y = test_put(b, NULL, (size_t)n * M * 4);
    REQUIRE(x && y);
    float *hx = malloc((size_t)n * K * 4);
    REQUIRE(hx);
    harness_fill_rand(hx, (size_t)n * K, 1.0f);
    b->ops->upload(b, x, hx, (size_t)n * K * 4);
    kv_sim_reset(b);
    CHECK(kv_sim_elapsed_s(b) == 0.0);

    b->ops->matmul(b, &w, x, y, n);
    /* q8_0: 34 bytes per 32 weights, read once; x read and y written in f32 */
    double bytes = (double)M * (K / 32) * 34 + (double)n * K * 4 + (double)n * M * 4;
    double flops = 2.0 * n * K * M;
    double bw = 3.35e12 * d->bw_frac, peak = 989e12 * d->flops_frac; /* achievable */
    double want = fmax(bytes / bw, flops / peak) + d->launch_s;
    CHECK(bytes / bw > flops / peak); /* this one is memory bound */
    double got = kv_sim_elapsed_s(b);
    CHECKF(near(got, want), "matmul: %.6g s, want %.6g s", got, want);
    kv_sim_stats st;
    kv_sim_stats_get(b, &st);
    CHECK(near(st.kind_s[KV_SIM_MATMUL], want) && st.kind_ops[KV_SIM_MATMUL] == 1 && st.kind_s[KV_SIM_OTHER] == 0.0);
    CHECK(near(st.bytes, bytes) && near(st.flops, flops));
    /* a second call adds the same again */
    b->ops->matmul(b, &w, x, y, n);
    CHECK(near(kv_sim_elapsed_s(b), 2 * want));

    /* transfers: bytes over the host link */
    kv_sim_reset(b);
    b->ops->upload(b, x, hx, (size_t)n * K * 4);
    double tw = (double)n * K * 4 / d->link_bw + d->launch_s;
    kv_sim_stats_get(b, &st);
    CHECK(near(st.elapsed_s, tw) && near(st.kind_s[KV_SIM_TRANSFER], tw) && st.kind_ops[KV_SIM_TRANSFER] == 1);
    CHECK(st.bytes == 0.0); /* transfers do not count as device-memory traffic */

    /* element-wise ops use the vector peak */
    kv_sim_reset(b);
    b->ops->add(b, y, y, (int64_t)n * M);
    double ta = kv_sim_roofline_s(d, 12.0 * n * M, (double)n * M, 0);
    CHECK(near(kv_sim_elapsed_s(b), ta));
    kv_sim_stats_get(b, &st);
    CHECK(near(st.kind_s[KV_SIM_OTHER], ta));
    TEST_DEV_FREE(b, x, y);
    FREE_ALL(hx, owned);
    kv_backend_free(b);
}

static void test_sim_roofline(void) {
    const kv_sim_device *h = kv_sim_device_find("h100-sxm"), *l4 = kv_sim_device_find("l4");
    REQUIRE(h && l4);
    /* compute bound: 1 GFLOP on 1 MB */
    CHECK(near(kv_sim_roofline_s(h, 1e6, 1e9, 1), 1e9 / (989e12 * h->flops_frac) + h->launch_s));
    CHECK(near(kv_sim_roofline_s(h, 1e6, 1e9, 0), 1e9 / 67e12 + h->launch_s)); /* vector ops: their peak */
    /* memory bound: 1 GB with few flops */
    CHECK(near(kv_sim_roofline_s(l4, 1e9, 1e6, 1), 1e9 / (300e9 * l4->bw_frac) + l4->launch_s));
    /* peaks per dtype, and no launch cost inside a graph */
    CHECK(near(kv_sim_roofline_peak_s(h, 1e6, 1e9, KV_SIM_PEAK_FP8, 0), 1e9 / (1979e12 * h->flops_frac)));
    CHECK(near(kv_sim_roofline_peak_s(h, 1e6, 1e9, KV_SIM_PEAK_BF16, 1), kv_sim_roofline_s(h, 1e6, 1e9, 1)));
    /* the same decode-sized matmul: the L4 is slower by about the bandwidth ratio */
    double th = kv_sim_roofline_s(h, 1e8, 2e8, 1), tl = kv_sim_roofline_s(l4, 1e8, 2e8, 1);
    CHECK(tl / th > 9.5 && tl / th < 11.2);
    CHECK(kv_sim_roofline_s(NULL, 1, 1, 1) == 0.0);
}

/* Two tokens at positions p - 1, p over f16 pages: K and V rows of p + 1
 * positions read once for both, q read, out written. */
static void test_sim_clock_attention(void) {
    kv_backend *b = make("sim");
    REQUIRE(b);
    const kv_sim_device *d = kv_sim_device_find("h100-sxm");
    kv_pages pg = {.dtype = KV_CACHE_F16, .n_layers = 1, .n_kv_heads = 2, .head_dim = 64, .block_size = 16,
                   .n_blocks = 8};
    kv_pages_set_sizes(&pg);
    pg.k = test_put(b, NULL, pg.layer_bytes);
    pg.v = test_put(b, NULL, pg.layer_bytes);
    REQUIRE(pg.k && pg.v);
    uint8_t *zero = calloc(1, pg.layer_bytes);
    REQUIRE(zero);
    b->ops->upload(b, pg.k, zero, pg.layer_bytes);
    b->ops->upload(b, pg.v, zero, pg.layer_bytes);
    const int n_heads = 8, p = 99;
    int32_t table[8] = {3, 1, 0, 7, 2, 5, 6, 4};
    const int32_t *tables[2] = {table, table};
    /* two tokens of the same sequence (the last two of a prefill chunk) */
    int32_t pos[2] = {p - 1, p}, seq[2] = {0, 0}, slot[2];
    for (int i = 0; i < 2; i++) slot[i] = table[pos[i] / 16] * 16 + pos[i] % 16;
    kv_attn_batch ab = {.n_tokens = 2, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 2, .tables = tables};
    float *q = test_put(b, NULL, 2 * n_heads * 64 * 4), *out = test_put(b, NULL, 2 * n_heads * 64 * 4);
    REQUIRE(q && out);
    kv_sim_reset(b);
    b->ops->attention(b, &pg, 0, &ab, q, out, n_heads, 0.125f);
    double ctx_rows = p + 1; /* the sequence's K/V read once for both tokens */
    double bytes = 2.0 * ctx_rows * pg.slot_bytes + 2.0 * 2 * n_heads * 64 * 4 + ctx_rows / 16 * 4;
    double flops = ((double)p + (p + 1)) * n_heads * (4.0 * 64 + 5);
    double want = kv_sim_roofline_s(d, bytes, flops, 1);
    kv_sim_stats st;
    kv_sim_stats_get(b, &st);
    CHECKF(near(st.kind_s[KV_SIM_ATTENTION], want), "%.6g vs %.6g", st.kind_s[KV_SIM_ATTENTION], want);
    CHECK(st.kind_ops[KV_SIM_ATTENTION] == 1 && near(st.elapsed_s, want));
    /* the same token as two sequences: K/V read twice */
    seq[1] = 1;
    kv_sim_reset(b);
    b->ops->attention(b, &pg, 0, &ab, q, out, n_heads, 0.125f);
    CHECK(kv_sim_elapsed_s(b) > want);
    TEST_DEV_FREE(b, pg.k, pg.v, q, out);
    free(zero);
    kv_backend_free(b);
}

/* ---- memory ------------------------------------------------------------------- */

static void test_sim_memory(void) {
    kv_err err = {0};
    kv_backend *b = reserved(kv_sim_backend_create_device("l4", 1, &err), &err);
    REQUIRE(b);
    kv_backend_mem m;
    b->ops->mem_info(b, &m);
    CHECK(m.valid == 1 && m.total_bytes == 23034ull << 20 && m.used_bytes == 0);
    void *p = b->ops->alloc(b, 1 << 20);
    REQUIRE(p);
    memset(p, 0x5a, 1 << 20); /* real host memory behind it */
    b->ops->mem_info(b, &m);
    CHECK(m.used_bytes == 1 << 20);
    /* more than the device has: refused, nothing changes */
    CHECK(b->ops->alloc(b, (size_t)25 << 30) == NULL);
    CHECK(b->ops->alloc(b, SIZE_MAX) == NULL);
    b->ops->mem_info(b, &m);
    CHECK(m.used_bytes == 1 << 20);
    b->ops->free(b, p);
    b->ops->free(b, NULL);
    b->ops->mem_info(b, &m);
    CHECK(m.used_bytes == 0);

    /* weights: counted once per data pointer (tied embeddings) */
    void *owned;
    kv_tensor w = test_make_weight(KV_TYPE_F16, 64, 128, &owned);
    REQUIRE(owned);
    kv_tensor w2 = w;
    CHECK(b->ops->upload_weight(b, &w, &err) == 0);
    CHECK(b->ops->upload_weight(b, &w2, &err) == 0);
    b->ops->mem_info(b, &m);
    CHECK(m.used_bytes == 64 * 128 * 2);
    /* a weight used without upload_weight counts when first used */
    void *owned2;
    kv_tensor w3 = test_make_weight(KV_TYPE_Q4_0, 32, 64, &owned2);
    float *x = test_put(b, NULL, 64 * 4), *y = test_put(b, NULL, 32 * 4);
    REQUIRE(owned2 && x && y);
    float hx[64];
    harness_fill_rand(hx, 64, 1.0f);
    b->ops->upload(b, x, hx, sizeof hx);
    b->ops->matmul(b, &w3, x, y, 1);
    b->ops->matmul(b, &w3, x, y, 1);
    b->ops->mem_info(b, &m);
    CHECK(m.used_bytes == 64 * 128 * 2 + 32 * 2 * 18 + 64 * 4 + 32 * 4);
    /* a model that does not fit: a clear error naming the device, no change */
    kv_tensor big = {.type = KV_TYPE_F32, .ne0 = 4096, .ne1 = 2000000, .nb1 = 4096 * 4, .data = hx}; /* (not read) */
    kv_err e2 = {0};
    int brc = b->ops->upload_weight(b, &big, &e2);
    CHECKF(brc == KV_ERR_NOMEM, "rc %d: %s", brc, e2.msg);
    CHECKF(strstr(e2.msg, "l4") != NULL, "%s", e2.msg);
    kv_backend_mem m2;
    b->ops->mem_info(b, &m2);
    CHECK(m2.used_bytes == m.used_bytes);
    /* a bad weight is rejected by the inner backend's check */
    kv_tensor bad = w;
    bad.nb1 = 3;
    CHECK(b->ops->upload_weight(b, &bad, &e2) != 0);
    TEST_DEV_FREE(b, x, y);
    FREE_ALL(owned, owned2);
    kv_backend_free(b);
}

/* ---- the table: status, reserve, clock --------------------------------------- */

/* The sim forwards its inner cpu backend's failures with the op's name,
 * adds its own (a batch with more sequences than the clock was reserved
 * for), and shows its clock through ops.clock, which the cpu lacks. */
static void test_sim_table(void) {
    kv_err err = {0};
    kv_backend *b = kv_sim_backend_create_device("a100", 1, &err);
    REQUIRE(b);
    kv_backend *c = make("cpu");
    REQUIRE(c);
    kv_backend_clock clk;
    CHECK(kv_backend_clock_get(c, &clk) == 0 && clk.device == NULL && clk.elapsed_s == 0.0);
    CHECK(kv_backend_clock_get(b, &clk) == 1 && !strcmp(clk.device, "a100-80g") && clk.elapsed_s == 0.0);
    CHECK(kv_backend_status(b, &err) == 0);
    /* not reserved: the inner matmul fails; the sim reports it, once */
    void *owned;
    kv_tensor w = test_make_weight(KV_TYPE_Q8_0, 64, 256, &owned);
    REQUIRE(owned);
    float *x = test_put(b, NULL, 2 * 256 * 4), *y = test_put(b, NULL, 2 * 64 * 4);
    REQUIRE(x && y);
    b->ops->matmul(b, &w, x, y, 2);
    CHECK(kv_backend_clock_get(b, &clk) == 1 && clk.elapsed_s > 0.0 && clk.elapsed_s == kv_sim_elapsed_s(b));
    kv_err_clear(&err);
    CHECK(b->ops->status(b, &err) == KV_ERR_BACKEND);
    CHECKF(strncmp(err.msg, "matmul: ", 8) == 0, "message: %s", err.msg);
    CHECK(b->ops->status(b, &err) == 0);
    kv_backend_limits lim = {.max_rows = 2, .max_k = 256, .weight_types = (uint64_t)1 << KV_TYPE_Q8_0};
    CHECK(kv_backend_reserve(b, &lim, &err) == 0);
    b->ops->matmul(b, &w, x, y, 2);
    CHECK(b->ops->status(b, &err) == 0);
    /* the attention model's per-sequence table holds max_rows sequences */
    kv_pages pg = {.dtype = KV_CACHE_F32, .n_layers = 1, .n_kv_heads = 1, .head_dim = 16, .block_size = 4,
                   .n_blocks = 4};
    kv_pages_set_sizes(&pg);
    pg.k = test_put(b, NULL, pg.layer_bytes);
    pg.v = test_put(b, NULL, pg.layer_bytes);
    float *q = test_put(b, NULL, 3 * 16 * 4), *out = test_put(b, NULL, 3 * 16 * 4);
    REQUIRE(pg.k && pg.v && q && out);
    memset(pg.k, 0, pg.layer_bytes);
    memset(pg.v, 0, pg.layer_bytes);
    memset(q, 0, 3 * 16 * 4);
    int32_t pos[3] = {0, 0, 0}, seq[3] = {0, 1, 2}, slot[3] = {0, 4, 8}, t0[1] = {0}, t1[1] = {1}, t2[1] = {2};
    const int32_t *tabs[3] = {t0, t1, t2};
    kv_attn_batch ab = {.n_tokens = 3, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 3, .tables = tabs};
    b->ops->attention(b, &pg, 0, &ab, q, out, 1, 0.25f);
    CHECK(kv_backend_status(b, &err) == KV_ERR_BACKEND && strstr(err.msg, "attention") && strstr(err.msg, "3 sequences"));
    lim.max_rows = 3;
    CHECK(kv_backend_reserve(b, &lim, &err) == 0);
    b->ops->attention(b, &pg, 0, &ab, q, out, 1, 0.25f);
    CHECK(kv_backend_status(b, &err) == 0);
    TEST_DEV_FREE(b, pg.k, pg.v, q, out, x, y);
    free(owned);
    kv_backend_free(c);
    kv_backend_free(b);
}

TEST_MAIN(T(test_sim_devices), T(test_sim_unknown_device), T(test_sim_registry), T(test_sim_matmul_exact),
          T(test_sim_elementwise_exact), T(test_sim_attention_exact), T(test_sim_clock_matmul), T(test_sim_roofline),
          T(test_sim_clock_attention), T(test_sim_memory), T(test_sim_table))
