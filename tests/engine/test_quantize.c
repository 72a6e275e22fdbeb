/* test_quantize.c - `kvtop quantize` in the library: the per-tensor type
 * rules (llama.cpp's mixes and fallbacks), and round trips of a small
 * random f32 model through every target type: reopen, check types and
 * metadata, compare each converted tensor's bytes with a direct row
 * quantization and its dequantized values with the original within the
 * type's error bound; requantization, copies and bad input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/gguf.h"
#include "../../engine/quantize.h"
#include "../../kernels/quant_ext.h"
#include "../harness.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float rndf(void) { /* roughly Gaussian, fixed stream: the model is the same each run */
    float s = 0;
    for (int k = 0; k < 4; k++) {
        rs ^= rs << 13;
        rs ^= rs >> 7;
        rs ^= rs << 17;
        s += (float)((rs >> 40) * (1.0 / 16777216.0)) - 0.5f;
    }
    return s * 0.05f;
}

static char dir[256];
static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvtop_test_quantize_%d", (int)getpid());
        mkdir(dir, 0700);
    }
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* The test model: 8 layers so the _m mixes have both kinds of layers. */
#define N_LAYER 8
typedef struct tdesc {
    char name[64];
    int n_dims;
    int64_t ne[4];
    float *data;
} tdesc;
static tdesc model_t[64];
static int model_n;

static void add_t(const char *name, int n_dims, int64_t ne0, int64_t ne1) {
    tdesc *t = &model_t[model_n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = t->ne[3] = 1;
    int64_t n = t->ne[0] * t->ne[1];
    t->data = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) t->data[i] = n_dims == 1 ? 1.0f + rndf() : rndf();
}

static void build_model(void) {
    if (model_n) return;
    add_t("token_embd.weight", 2, 256, 64);
    add_t("output_norm.weight", 1, 256, 1);
    add_t("output.weight", 2, 256, 64);
    char nm[64];
    for (int l = 0; l < N_LAYER; l++) {
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        add_t(nm, 1, 256, 1);
        snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
        add_t(nm, 2, 256, 16);
        snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
        add_t(nm, 2, 256, 8);
        snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
        add_t(nm, 2, 512, 8);
    }
    add_t("blk.0.ffn_up.weight", 2, 96, 8);   /* fits 32-blocks, not 256 */
    add_t("blk.0.ffn_gate.weight", 2, 72, 4); /* fits nothing quantized */
}

static int write_model(const char *path, int tied) {
    build_model();
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_add_str(w, "general.architecture", "llama");
    kv_gguf_writer_add_str(w, "general.name", "quantize-test");
    kv_gguf_writer_add_u32(w, "llama.block_count", N_LAYER);
    kv_gguf_writer_add_u32(w, "general.file_type", 0);
    kv_gguf_writer_add_f32(w, "test.value", 1.25f);
    for (int i = 0; i < model_n; i++) {
        const tdesc *t = &model_t[i];
        if (tied && !strcmp(t->name, "output.weight")) continue;
        kv_gguf_writer_add_tensor_ref(w, t->name, KV_TYPE_F32, t->n_dims, t->ne, t->data,
                                      (uint64_t)(t->ne[0] * t->ne[1]) * 4);
    }
    kv_err err = {0};
    int rc = kv_gguf_writer_write(w, path, &err);
    if (rc) fprintf(stderr, "  write_model: %s\n", err.msg);
    kv_gguf_writer_free(w);
    return rc;
}

static const tdesc *find_t(const char *name) {
    for (int i = 0; i < model_n; i++)
        if (!strcmp(model_t[i].name, name)) return &model_t[i];
    return NULL;
}

static int to_f32(kv_type t, const void *src, float *dst, int64_t n) {
    const kv_qext_ops *o = kv_qext_get(t);
    if (o) {
        o->dequantize_row(src, dst, n);
        return 0;
    }
    return kv_dequantize_row(t, src, dst, n);
}
static int from_f32(kv_type t, const float *src, void *dst, int64_t n) {
    const kv_qext_ops *o = kv_qext_get(t);
    if (o) {
        o->quantize_row(src, dst, n);
        return 0;
    }
    return kv_quantize_row(t, src, dst, n);
}

/* Relative RMS error a type may show on this data. */
static double bound_of(kv_type t) {
    switch (t) {
    case KV_TYPE_F32: return 0;
    case KV_TYPE_F16: return 1e-3;
    case KV_TYPE_BF16: return 5e-3;
    case KV_TYPE_Q8_0: return 0.01;
    case KV_TYPE_Q6_K: return 0.025;
    case KV_TYPE_Q5_0:
    case KV_TYPE_Q5_1:
    case KV_TYPE_Q5_K: return 0.05;
    default: return 0.10; /* q4_* */
    }
}

static const char *targets[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0",
                                "q5_1", "q4_k", "q4_k_m", "q5_k", "q5_k_m", "q6_k"};

/* Type of tensor `name` in the file at path, or -1. */
static int type_in(const kv_gguf *g, const char *name) {
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
    return t ? (int)t->type : -1;
}

/* Every tensor of the output against the original: bytes equal to a direct
 * quantization of the original rows, values within the type's bound. */
static void check_tensors(const kv_gguf *g, const char *target) {
    for (int i = 0; i < model_n; i++) {
        const tdesc *o = &model_t[i];
        const kv_gguf_tensor *t = kv_gguf_find_tensor(g, o->name);
        if (!t) continue; /* tied model without output.weight */
        const int64_t n = o->ne[0] * o->ne[1];
        CHECKF(t->ne[0] == o->ne[0] && t->ne[1] == o->ne[1] && t->n_dims == o->n_dims, "%s %s shape", target, o->name);
        float *y = malloc((size_t)n * sizeof *y);
        size_t rb = kv_type_row_size(t->type, o->ne[0]);
        uint8_t *want = malloc(rb ? rb : 1);
        double se = 0, ss = 0;
        int bytes_ok = 1, conv_ok = 1;
        for (int64_t r = 0; r < o->ne[1]; r++) {
            const uint8_t *row = (const uint8_t *)t->data + r * rb;
            conv_ok &= to_f32(t->type, row, y + r * o->ne[0], o->ne[0]) == 0;
            conv_ok &= from_f32(t->type, o->data + r * o->ne[0], want, o->ne[0]) == 0;
            bytes_ok &= memcmp(want, row, rb) == 0;
        }
        for (int64_t k = 0; k < n; k++) {
            se += (double)(y[k] - o->data[k]) * (y[k] - o->data[k]);
            ss += (double)o->data[k] * o->data[k];
        }
        double e = sqrt(se / ss);
        CHECKF(conv_ok, "%s %s: %s rows do not convert", target, o->name, kv_type_name(t->type));
        CHECKF(bytes_ok, "%s %s: %s bytes differ from a direct row quantization", target, o->name,
               kv_type_name(t->type));
        CHECKF(e <= bound_of(t->type), "%s %s: %s error %.4f > %.4f", target, o->name, kv_type_name(t->type), e,
               bound_of(t->type));
        if (o->n_dims == 1) CHECKF(t->type == KV_TYPE_F32 && e == 0, "%s %s: 1-D tensors stay f32", target, o->name);
        free(y);
        free(want);
    }
}

static void test_target_names(void) {
    kv_quant_target t;
    kv_err err = {0};
    CHECK(kv_quant_target_from_name("Q4_K_M", &t, &err) == 0 && t.base == KV_TYPE_Q4_K && t.file_type == 15);
    CHECK(kv_quant_target_from_name("q4_k", &t, &err) == 0 && t.file_type == 14 && !strcmp(t.name, "q4_k_s"));
    CHECK(kv_quant_target_from_name("q5_k_m", &t, &err) == 0 && t.base == KV_TYPE_Q5_K && t.file_type == 17);
    CHECK(kv_quant_target_from_name("Q6_K", &t, &err) == 0 && t.base == KV_TYPE_Q6_K && t.file_type == 18);
    CHECK(kv_quant_target_from_name("q8_0", &t, &err) == 0 && t.file_type == 7);
    CHECK(kv_quant_target_from_name("q5_0", &t, &err) == 0 && t.file_type == 8);
    CHECK(kv_quant_target_from_name("BF16", &t, &err) == 0 && t.base == KV_TYPE_BF16 && t.file_type == 32);
    CHECK(kv_quant_target_from_name("f32", &t, &err) == 0 && t.file_type == 0);
    CHECK(kv_quant_target_from_name("q3_k", &t, &err) == KV_ERR_INVAL && strstr(err.msg, "q3_k"));
    CHECK(kv_quant_target_from_name("", &t, &err) == KV_ERR_INVAL);
    CHECK(kv_quant_target_from_name("q4_k_mmmmmmmmmmmmmmmmm", &t, &err) == KV_ERR_INVAL);
    CHECK(kv_quant_target_from_name(NULL, &t, &err) == KV_ERR_INVAL);
}

static void test_type_rules(void) {
    kv_quant_target q4km, q5km, q4ks, q80, q40, f16;
    kv_quant_target_from_name("q4_k_m", &q4km, NULL);
    kv_quant_target_from_name("q5_k_m", &q5km, NULL);
    kv_quant_target_from_name("q4_k", &q4ks, NULL);
    kv_quant_target_from_name("q8_0", &q80, NULL);
    kv_quant_target_from_name("q4_0", &q40, NULL);
    kv_quant_target_from_name("f16", &f16, NULL);
    kv_quant_model_info mi = {1, 8, 8};
    const int64_t w256[4] = {256, 256, 1, 1}, w576[4] = {576, 576, 1, 1}, w172[4] = {172, 64, 1, 1};
    const int64_t v1[4] = {256, 1, 1, 1};
    int fb;
    /* use_more_bits for 8 layers: 0, 3, 6, 7 */
    static const int more[8] = {1, 0, 0, 1, 0, 0, 1, 1};
    for (int i = 0; i < 8; i++) {
        kv_type want = more[i] ? KV_TYPE_Q6_K : KV_TYPE_Q4_K;
        CHECKF(kv_quant_tensor_type(&q4km, &mi, "blk.x.attn_v.weight", 2, w256, KV_TYPE_F32, i, 0, &fb) == want, "v %d", i);
        CHECKF(kv_quant_tensor_type(&q4km, &mi, "blk.x.ffn_down.weight", 2, w256, KV_TYPE_F32, 0, i, &fb) == want, "d %d", i);
        CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.x.attn_q.weight", 2, w256, KV_TYPE_F32, i, i, &fb) == KV_TYPE_Q4_K);
        kv_type want5 = more[i] ? KV_TYPE_Q6_K : KV_TYPE_Q5_K;
        CHECK(kv_quant_tensor_type(&q5km, &mi, "blk.x.ffn_down.weight", 2, w256, KV_TYPE_F32, 0, i, &fb) == want5);
        /* q4_k (= Q4_K_S): attn_v of the first 4 layers, ffn_down of the first n/8 get Q5_K */
        CHECK(kv_quant_tensor_type(&q4ks, &mi, "blk.x.attn_v.weight", 2, w256, KV_TYPE_F32, i, 0, &fb) ==
              (i < 4 ? KV_TYPE_Q5_K : KV_TYPE_Q4_K));
        CHECK(kv_quant_tensor_type(&q4ks, &mi, "blk.x.ffn_down.weight", 2, w256, KV_TYPE_F32, 0, i, &fb) ==
              (i < 1 ? KV_TYPE_Q5_K : KV_TYPE_Q4_K));
    }
    CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.0.attn_qkv.weight", 2, w256, KV_TYPE_F32, 1, 0, &fb) == KV_TYPE_Q5_K);
    CHECK(kv_quant_tensor_type(&q5km, &mi, "blk.0.attn_qkv.weight", 2, w256, KV_TYPE_F32, 1, 0, &fb) == KV_TYPE_Q6_K);
    /* output: Q6_K for quantized targets, Q8_0 for q8_0 or when the row does not fit */
    CHECK(kv_quant_tensor_type(&q4km, &mi, "output.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q6_K && !fb);
    CHECK(kv_quant_tensor_type(&q40, &mi, "output.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q6_K);
    CHECK(kv_quant_tensor_type(&q80, &mi, "output.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q8_0);
    CHECK(kv_quant_tensor_type(&q4km, &mi, "output.weight", 2, w576, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q8_0);
    /* token_embd follows the output rule only when the output is tied to it */
    CHECK(kv_quant_tensor_type(&q4km, &mi, "token_embd.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q4_K);
    kv_quant_model_info tied = {0, 8, 8};
    CHECK(kv_quant_tensor_type(&q4km, &tied, "token_embd.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q6_K);
    CHECK(kv_quant_tensor_type(&q4km, &tied, "token_embd.weight", 2, w576, KV_TYPE_Q4_1, 0, 0, &fb) == KV_TYPE_Q8_0);
    /* SmolLM2's 576-wide rows: llama.cpp's fallback table */
    CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.1.attn_q.weight", 2, w576, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q5_0 && fb);
    CHECK(kv_quant_tensor_type(&q5km, &mi, "blk.1.attn_q.weight", 2, w576, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q5_1 && fb);
    CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.0.attn_v.weight", 2, w576, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_Q8_0 && fb);
    CHECK(kv_quant_tensor_type(&q80, &mi, "blk.0.ffn_down.weight", 2, w172, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F16 && fb);
    CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.0.ffn_down.weight", 2, w172, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F16 && fb);
    /* not converted: 1-D, norms, names not ending in weight, a 2-D shape with ne1 = 1 */
    CHECK(kv_quant_tensor_type(&q4km, &mi, "output_norm.weight", 1, v1, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F32 && !fb);
    CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.0.attn_norm.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F32);
    CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.0.attn_q.bias", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F32);
    CHECK(kv_quant_tensor_type(&q4km, &mi, "rope_freqs.weight", 2, v1, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F32);
    CHECK(kv_quant_tensor_type(&q4km, &mi, "blk.0.ffn_gate_inp.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F32);
    /* float targets: every matrix, no mixes */
    CHECK(kv_quant_tensor_type(&f16, &mi, "output.weight", 2, w256, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F16);
    CHECK(kv_quant_tensor_type(&f16, &mi, "blk.0.attn_v.weight", 2, w172, KV_TYPE_Q8_0, 0, 0, &fb) == KV_TYPE_F16);
    CHECK(kv_quant_tensor_type(&f16, &mi, "blk.0.attn_norm.weight", 1, v1, KV_TYPE_F32, 0, 0, &fb) == KV_TYPE_F32);
}

static int n_progress;
static uint64_t last_done, last_total;
static void progress(void *ctx, int64_t tensor, int64_t n_tensors, const char *name, uint64_t done, uint64_t total) {
    (void)ctx;
    (void)name;
    n_progress++;
    CHECK(tensor >= 0 && tensor < n_tensors);
    CHECK(done >= last_done && done <= total);
    last_done = done;
    last_total = total;
}

static void test_roundtrip_every_type(void) {
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", tmp_path("model-f32.gguf"));
    snprintf(out, sizeof out, "%s", tmp_path("out.gguf"));
    REQUIRE(write_model(in, 0) == 0);
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        kv_quantize_params p;
        memset(&p, 0, sizeof p);
        REQUIRE(kv_quant_target_from_name(targets[k], &p.target, NULL) == 0);
        p.n_threads = 2;
        p.progress = progress;
        n_progress = 0;
        last_done = 0;
        kv_quantize_stats st;
        kv_err err = {0};
        int rc = kv_quantize_file(in, out, &p, &st, &err);
        CHECKF(rc == 0, "%s: %s", targets[k], err.msg);
        if (rc) continue;
        kv_gguf *g = kv_gguf_open(out, &err);
        REQUIRE(g);
        uint32_t ft = 99, qv = 0;
        CHECK(kv_gguf_get_u32(g, "general.file_type", &ft, NULL) == 0 && ft == p.target.file_type);
        CHECK(kv_gguf_get_u32(g, "general.quantization_version", &qv, NULL) == 0 && qv == 2);
        kv_gguf_str s;
        float f = 0;
        CHECK(kv_gguf_get_str(g, "general.name", &s, NULL) == 0 && kv_gguf_str_eq(s, "quantize-test"));
        CHECK(kv_gguf_get_f32(g, "test.value", &f, NULL) == 0 && f == 1.25f);
        CHECK(kv_gguf_n_tensors(g) == model_n);
        CHECK(st.n_tensors == model_n && st.n_converted + st.n_copied == model_n);
        if (strcmp(targets[k], "f32") != 0) {
            CHECKF(n_progress > 0 && last_done == last_total && last_total > 0, "%s progress", targets[k]);
        } else {
            CHECK(st.n_converted == 0);
        }
        check_tensors(g, targets[k]);
        /* the rules, as seen in the file */
        const kv_type base = p.target.base;
        if (base != KV_TYPE_F32 && base != KV_TYPE_F16 && base != KV_TYPE_BF16) {
            CHECKF(type_in(g, "output.weight") == (base == KV_TYPE_Q8_0 ? KV_TYPE_Q8_0 : KV_TYPE_Q6_K), "%s", targets[k]);
            CHECK(type_in(g, "token_embd.weight") == (int)base);
            CHECK(type_in(g, "blk.0.ffn_gate.weight") == KV_TYPE_F16); /* 72 wide */
            kv_type up = base == KV_TYPE_Q4_K ? KV_TYPE_Q5_0 : base == KV_TYPE_Q5_K ? KV_TYPE_Q5_1
                         : base == KV_TYPE_Q6_K ? KV_TYPE_Q8_0 : base;
            CHECKF(type_in(g, "blk.0.ffn_up.weight") == (int)up, "%s ffn_up %s", targets[k],
                   kv_type_name(type_in(g, "blk.0.ffn_up.weight")));
            CHECK(st.n_fallback == (up != base ? 2 : 1));
        } else {
            CHECK(type_in(g, "output.weight") == (int)base && type_in(g, "blk.0.ffn_gate.weight") == (int)base);
        }
        if (!strcmp(targets[k], "q4_k_m") || !strcmp(targets[k], "q5_k_m")) {
            kv_type other = base;
            static const int more[N_LAYER] = {1, 0, 0, 1, 0, 0, 1, 1};
            char nm[64];
            for (int l = 0; l < N_LAYER; l++) {
                snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
                CHECKF(type_in(g, nm) == (int)(more[l] ? KV_TYPE_Q6_K : other), "%s %s", targets[k], nm);
                snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
                CHECKF(type_in(g, nm) == (int)(more[l] ? KV_TYPE_Q6_K : other), "%s %s", targets[k], nm);
                snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
                CHECK(type_in(g, nm) == (int)base);
            }
        }
        kv_gguf_close(g);
    }
    unlink(in);
    unlink(out);
}

static void test_tied_and_requantize(void) {
    char in[512], mid[512], out[512], same[512];
    snprintf(in, sizeof in, "%s", tmp_path("tied-f32.gguf"));
    snprintf(mid, sizeof mid, "%s", tmp_path("tied-q8.gguf"));
    snprintf(out, sizeof out, "%s", tmp_path("tied-q4km.gguf"));
    snprintf(same, sizeof same, "%s", tmp_path("tied-q8-again.gguf"));
    REQUIRE(write_model(in, 1) == 0);
    kv_quantize_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 1;
    kv_err err = {0};
    kv_quantize_stats st;
    REQUIRE(kv_quant_target_from_name("q8_0", &p.target, NULL) == 0);
    REQUIRE(kv_quantize_file(in, mid, &p, &st, &err) == 0);
    /* q8_0 again: every tensor is already in its target type and is copied */
    REQUIRE(kv_quantize_file(mid, same, &p, &st, &err) == 0);
    CHECK(st.n_converted == 0 && st.n_copied == st.n_tensors);
    /* from q8_0 (dequantized first) to q4_k_m: the tied token_embd takes the output rule */
    REQUIRE(kv_quant_target_from_name("q4_k_m", &p.target, NULL) == 0);
    p.n_threads = 3;
    REQUIRE(kv_quantize_file(mid, out, &p, &st, &err) == 0);
    kv_gguf *g = kv_gguf_open(out, &err);
    REQUIRE(g);
    CHECK(kv_gguf_find_tensor(g, "output.weight") == NULL);
    CHECK(type_in(g, "token_embd.weight") == KV_TYPE_Q6_K);
    /* error against the f32 original: q8_0 then q6_k/q4_k stays within the looser bound */
    const tdesc *o = find_t("blk.2.attn_q.weight");
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, o->name);
    REQUIRE(t && t->type == KV_TYPE_Q4_K);
    float y[256];
    double se = 0, ss = 0;
    for (int64_t r = 0; r < o->ne[1]; r++) {
        to_f32(t->type, (const uint8_t *)t->data + r * kv_type_row_size(t->type, 256), y, 256);
        for (int i = 0; i < 256; i++) {
            double d = y[i] - o->data[r * 256 + i];
            se += d * d;
            ss += (double)o->data[r * 256 + i] * o->data[r * 256 + i];
        }
    }
    CHECKF(sqrt(se / ss) < 0.1, "requantized error %.4f", sqrt(se / ss));
    kv_gguf_close(g);
    unlink(in);
    unlink(mid);
    unlink(same);
    unlink(out);
}

static void test_bad_input(void) {
    kv_quantize_params p;
    memset(&p, 0, sizeof p);
    kv_quant_target_from_name("q8_0", &p.target, NULL);
    kv_err err = {0};
    char out[512], junk[512], in[512];
    snprintf(out, sizeof out, "%s", tmp_path("never.gguf"));
    snprintf(junk, sizeof junk, "%s", tmp_path("junk.gguf"));
    snprintf(in, sizeof in, "%s", tmp_path("inplace.gguf"));
    CHECK(kv_quantize_file(tmp_path("missing.gguf"), out, &p, NULL, &err) == KV_ERR_IO);
    CHECK(strstr(err.msg, "missing.gguf") != NULL);
    CHECK(access(out, F_OK) != 0);
    /* not a GGUF */
    FILE *f = fopen(junk, "wb");
    REQUIRE(f);
    fputs("this is not a model", f);
    fclose(f);
    CHECK(kv_quantize_file(junk, out, &p, NULL, &err) == KV_ERR_FORMAT);
    CHECK(access(out, F_OK) != 0);
    /* in place */
    REQUIRE(write_model(in, 0) == 0);
    struct stat s0, s1;
    stat(in, &s0);
    CHECK(kv_quantize_file(in, in, &p, NULL, &err) == KV_ERR_INVAL);
    stat(in, &s1);
    CHECK(s0.st_size == s1.st_size && s0.st_mtime == s1.st_mtime);
    /* an output directory that does not exist: error, nothing left behind */
    CHECK(kv_quantize_file(in, "/nonexistent-dir-kvtop/out.gguf", &p, NULL, &err) < 0);
    /* a target that cannot be written */
    kv_quantize_params bad = p;
    bad.target.base = KV_TYPE_Q2_K;
    CHECK(kv_quantize_file(in, out, &bad, NULL, &err) == KV_ERR_INVAL);
    CHECK(kv_quantize_file(NULL, out, &p, NULL, &err) == KV_ERR_INVAL);
    CHECK(access(out, F_OK) != 0);
    unlink(junk);
    unlink(in);
}

/* A source tensor kvtop cannot decode fails cleanly when it must be converted. */
static void test_undecodable_source(void) {
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", tmp_path("q2k.gguf"));
    snprintf(out, sizeof out, "%s", tmp_path("q2k-out.gguf"));
    kv_gguf_writer *w = kv_gguf_writer_new();
    static uint8_t blocks[84 * 4];
    memset(blocks, 0, sizeof blocks);
    const int64_t ne[4] = {256, 4, 1, 1};
    kv_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", KV_TYPE_Q2_K, 2, ne, blocks, sizeof blocks);
    kv_err err = {0};
    if (kv_gguf_writer_write(w, in, &err) != 0) { /* the writer may refuse the type: nothing to test */
        printf("  (skipped: the writer refuses q2_k: %s)\n", err.msg);
        kv_gguf_writer_free(w);
        return;
    }
    kv_gguf_writer_free(w);
    kv_quantize_params p;
    memset(&p, 0, sizeof p);
    kv_quant_target_from_name("q8_0", &p.target, NULL);
    CHECK(kv_quantize_file(in, out, &p, NULL, &err) == KV_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "blk.0.attn_q.weight") && strstr(err.msg, "q2_k"));
    CHECK(access(out, F_OK) != 0);
    unlink(in);
}

/* The real stories260K (64-wide rows): everything falls back, and the file
 * still round-trips. */
static void test_stories260k(void) {
    const char *in = harness_shared_path("models/stories260K.gguf");
    if (access(in, R_OK) != 0) {
        printf("  (skipped: %s not found)\n", in);
        return;
    }
    char inbuf[4096];
    snprintf(inbuf, sizeof inbuf, "%s", in);
    kv_quantize_params p;
    memset(&p, 0, sizeof p);
    kv_quant_target_from_name("q4_k_m", &p.target, NULL);
    kv_err err = {0};
    kv_quantize_stats st;
    char out[512];
    snprintf(out, sizeof out, "%s", tmp_path("stories-q4km.gguf"));
    REQUIRE(kv_quantize_file(inbuf, out, &p, &st, &err) == 0);
    CHECK(st.n_fallback > 0 && st.n_converted > 0);
    CHECK(st.bytes_out < st.bytes_in);
    kv_gguf *src = kv_gguf_open(inbuf, &err), *g = kv_gguf_open(out, &err);
    REQUIRE(src && g);
    CHECK(kv_gguf_n_kv(g) == kv_gguf_n_kv(src) + 2); /* + quantization_version and file_type (both absent) */
    CHECK(kv_gguf_find_key(g, "general.file_type") >= 0 && kv_gguf_find_key(g, "tokenizer.ggml.tokens") >= 0);
    CHECK(type_in(g, "blk.0.attn_q.weight") == KV_TYPE_Q5_0);   /* Q4_K -> Q5_0 */
    CHECK(type_in(g, "blk.0.ffn_down.weight") == KV_TYPE_F16);  /* 172 wide */
    CHECK(type_in(g, "output.weight") == KV_TYPE_Q8_0);         /* 64 % 256 */
    CHECK(type_in(g, "blk.0.attn_norm.weight") == KV_TYPE_F32);
    float *a = malloc(512 * sizeof(float)), *b = malloc(512 * sizeof(float));
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i), *s = kv_gguf_find_tensor(src, "");
        char nm[96];
        snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.data);
        s = kv_gguf_find_tensor(src, nm);
        REQUIRE(s && s->ne[0] <= 512);
        double se = 0, ss = 0;
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        for (int64_t r = 0; r < rows; r++) {
            to_f32(t->type, (const uint8_t *)t->data + r * kv_type_row_size(t->type, t->ne[0]), a, t->ne[0]);
            memcpy(b, (const float *)s->data + r * s->ne[0], (size_t)s->ne[0] * sizeof(float));
            for (int64_t k = 0; k < t->ne[0]; k++) {
                se += (double)(a[k] - b[k]) * (a[k] - b[k]);
                ss += (double)b[k] * b[k];
            }
        }
        CHECKF(sqrt(se / ss) <= bound_of(t->type), "%s (%s) error %.4f", nm, kv_type_name(t->type), sqrt(se / ss));
    }
    free(a);
    free(b);
    kv_gguf_close(src);
    kv_gguf_close(g);
    unlink(out);
}

static void test_cleanup(void) {
    for (int i = 0; i < model_n; i++) free(model_t[i].data);
    model_n = 0;
    if (dir[0]) CHECK(rmdir(dir) == 0);
}

TEST_MAIN(T(test_target_names), T(test_type_rules), T(test_roundtrip_every_type), T(test_tied_and_requantize),
          T(test_bad_input), T(test_undecodable_source), T(test_stories260k), T(test_cleanup))
