/* test_mkmodel.c - random-weight llama GGUFs: tensor names, shapes and types
 * as llama.cpp writes them, llama.* metadata, the synthetic vocabulary,
 * weight statistics, byte-identical output for a seed, quantized types that
 * dequantize back to the same underlying weights, argument validation, and
 * truncated copies (drafts). */
#include "../engine_helpers.h"
#include "../harness.h"

#include <unistd.h>

#include "../../engine/gguf.h"
#include "../../engine/mkmodel.h"

static const char *tmp_path(const char *tag) { return harness_tmp_path("mkmodel", tag, ".gguf"); }

static kv_mkmodel_params small_params(void) {
    kv_mkmodel_params p = test_tiny_model(64, 96);
    p.n_vocab = 300;
    p.ctx_len = 512;
    p.untied = 1;
    p.seed = 7;
    p.rope_base = 500000.0f;
    p.rms_eps = 1e-6f;
    return p;
}

static uint32_t get_u32(const kv_gguf *g, const char *key) {
    uint32_t v = 0xdeadbeef;
    kv_gguf_get_u32(g, key, &v, NULL);
    return v;
}

static int has_shape(const kv_gguf *g, const char *name, kv_type type, int64_t ne0, int64_t ne1) {
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "  missing tensor %s\n", name);
        return 0;
    }
    int nd = ne1 ? 2 : 1;
    if (t->type != type || t->n_dims != nd || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1)) {
        fprintf(stderr, "  %s: type %d dims %d ne %lld x %lld\n", name, t->type, t->n_dims, (long long)t->ne[0],
                (long long)t->ne[1]);
        return 0;
    }
    return 1;
}

/* Dequantized contents of a tensor (malloc'd). */
static float *deq(const kv_gguf_tensor *t) {
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *x = malloc((size_t)n * sizeof *x);
    size_t rb = kv_type_row_size(t->type, t->ne[0]);
    for (int64_t r = 0; r < n / t->ne[0]; r++)
        if (kv_dequantize_row(t->type, (const char *)t->data + r * rb, x + r * t->ne[0], t->ne[0])) {
            free(x);
            return NULL;
        }
    return x;
}

static void stats(const float *x, int64_t n, double *mean, double *sd, double *amax) {
    double s = 0, s2 = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        if (fabs(x[i]) > m) m = fabs(x[i]);
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
    *amax = m;
}

static void test_f32_model(void) {
    kv_mkmodel_params p = small_params();
    kv_err err;
    const char *path = tmp_path("f32");
    CHECKF(kv_mkmodel_write(&p, path, &err) == 0, "%s", err.msg);
    kv_gguf *g = kv_gguf_open(path, &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (!g) return;
    /* metadata */
    kv_gguf_str s;
    CHECK(kv_gguf_get_str(g, "general.architecture", &s, &err) == 0 && kv_gguf_str_eq(s, "llama"));
    CHECK(get_u32(g, "llama.context_length") == 512);
    CHECK(get_u32(g, "llama.embedding_length") == 64);
    CHECK(get_u32(g, "llama.block_count") == 2);
    CHECK(get_u32(g, "llama.feed_forward_length") == 96);
    CHECK(get_u32(g, "llama.attention.head_count") == 4);
    CHECK(get_u32(g, "llama.attention.head_count_kv") == 2);
    CHECK(get_u32(g, "llama.rope.dimension_count") == 16);
    CHECK(get_u32(g, "llama.vocab_size") == 300);
    CHECK(get_u32(g, "general.file_type") == 0);
    float f = 0;
    CHECK(kv_gguf_get_f32(g, "llama.rope.freq_base", &f, &err) == 0 && f == 500000.0f);
    CHECK(kv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f, &err) == 0 && f == 1e-6f);
    /* tokenizer */
    CHECK(kv_gguf_get_str(g, "tokenizer.ggml.model", &s, &err) == 0 && kv_gguf_str_eq(s, "llama"));
    kv_gguf_vtype et;
    uint64_t n = 0;
    CHECK(kv_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &err) == 0 && et == KV_GGUF_STRING && n == 300);
    CHECK(kv_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &err) == 0 && et == KV_GGUF_FLOAT32 && n == 300);
    CHECK(kv_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &err) == 0 && et == KV_GGUF_INT32 && n == 300);
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 0), "<unk>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 1), "<s>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 2), "</s>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 3), "<0x00>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 3 + 0x0A), "<0x0A>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 258), "<0xFF>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 259), "\xe2\x96\x81"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 260), "a"));
    CHECK(kv_gguf_arr_i64(g, "tokenizer.ggml.token_type", 0) == 2);
    CHECK(kv_gguf_arr_i64(g, "tokenizer.ggml.token_type", 1) == 3);
    CHECK(kv_gguf_arr_i64(g, "tokenizer.ggml.token_type", 100) == 6);
    CHECK(kv_gguf_arr_i64(g, "tokenizer.ggml.token_type", 299) == 1);
    CHECK(kv_gguf_arr_f64(g, "tokenizer.ggml.scores", 260) > kv_gguf_arr_f64(g, "tokenizer.ggml.scores", 299));
    CHECK(get_u32(g, "tokenizer.ggml.bos_token_id") == 1 && get_u32(g, "tokenizer.ggml.eos_token_id") == 2);
    CHECK(get_u32(g, "tokenizer.ggml.unknown_token_id") == 0);

    /* tensors: llama.cpp names and [in, out] shapes */
    CHECK(kv_gguf_n_tensors(g) == 3 + 2 * 9);
    CHECK(has_shape(g, "token_embd.weight", KV_TYPE_F32, 64, 300));
    CHECK(has_shape(g, "output.weight", KV_TYPE_F32, 64, 300));
    CHECK(has_shape(g, "output_norm.weight", KV_TYPE_F32, 64, 0));
    for (int l = 0; l < 2; l++) {
        char nm[64];
#define NM(x) (snprintf(nm, sizeof nm, "blk.%d." x, l), nm)
        CHECK(has_shape(g, NM("attn_norm.weight"), KV_TYPE_F32, 64, 0));
        CHECK(has_shape(g, NM("attn_q.weight"), KV_TYPE_F32, 64, 64));
        CHECK(has_shape(g, NM("attn_k.weight"), KV_TYPE_F32, 64, 32));
        CHECK(has_shape(g, NM("attn_v.weight"), KV_TYPE_F32, 64, 32));
        CHECK(has_shape(g, NM("attn_output.weight"), KV_TYPE_F32, 64, 64));
        CHECK(has_shape(g, NM("ffn_norm.weight"), KV_TYPE_F32, 64, 0));
        CHECK(has_shape(g, NM("ffn_gate.weight"), KV_TYPE_F32, 64, 96));
        CHECK(has_shape(g, NM("ffn_up.weight"), KV_TYPE_F32, 64, 96));
        CHECK(has_shape(g, NM("ffn_down.weight"), KV_TYPE_F32, 96, 64));
#undef NM
    }
    /* parameter count = elements in the file */
    uint64_t total = 0;
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        total += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    CHECK(total == kv_mkmodel_n_params(&p));

    /* weights: uniform, mean ~0, std ~0.02 (0.01 for the residual projections), norms 1 */
    double mean, sd, amax;
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, "token_embd.weight");
    REQUIRE(t);
    stats(t->data, 64 * 300, &mean, &sd, &amax);
    CHECKF(fabs(mean) < 0.001 && fabs(sd - 0.02) < 0.001 && amax <= 0.02 * sqrt(3.0) + 1e-6 && amax > 0.033,
           "embd mean %g sd %g max %g", mean, sd, amax);
    t = kv_gguf_find_tensor(g, "blk.1.ffn_down.weight");
    REQUIRE(t);
    stats(t->data, 96 * 64, &mean, &sd, &amax);
    CHECKF(fabs(sd - 0.01) < 0.0007, "ffn_down sd %g", sd);
    t = kv_gguf_find_tensor(g, "blk.0.attn_norm.weight");
    REQUIRE(t);
    stats(t->data, 64, &mean, &sd, &amax);
    CHECK(mean == 1.0 && amax == 1.0);
    /* different tensors get different numbers */
    const kv_gguf_tensor *a = kv_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
    const kv_gguf_tensor *b = kv_gguf_find_tensor(g, "blk.0.ffn_up.weight");
    REQUIRE(a && b);
    CHECK(memcmp(a->data, b->data, a->size) != 0);
    kv_gguf_close(g);
    unlink(path);
}

static void test_deterministic(void) {
    kv_mkmodel_params p = small_params();
    kv_err err;
    const char *p1 = tmp_path("det1"), *p2 = tmp_path("det2"), *p3 = tmp_path("det3");
    REQUIRE(kv_mkmodel_write(&p, p1, &err) == 0);
    REQUIRE(kv_mkmodel_write(&p, p2, &err) == 0);
    p.seed = 8;
    REQUIRE(kv_mkmodel_write(&p, p3, &err) == 0);
    size_t n1, n2, n3;
    unsigned char *b1 = harness_read_file(p1, &n1), *b2 = harness_read_file(p2, &n2), *b3 = harness_read_file(p3, &n3);
    REQUIRE(b1 && b2 && b3);
    CHECK(n1 == n2 && !memcmp(b1, b2, n1));
    CHECK(n1 == n3 && memcmp(b1, b3, n1) != 0);
    free(b1), free(b2), free(b3);
    unlink(p1), unlink(p2), unlink(p3);
}

/* Every weight type: the rows come from the same seeded streams, so each
 * dequantized tensor must match the F32 model's within the type's error. */
static void test_types(void) {
    kv_mkmodel_params p = small_params();
    kv_err err;
    char pf[512]; /* tmp_path's buffers rotate: keep a copy across the loop */
    snprintf(pf, sizeof pf, "%s", tmp_path("ref"));
    REQUIRE(kv_mkmodel_write(&p, pf, &err) == 0);
    kv_gguf *ref = kv_gguf_open(pf, &err);
    REQUIRE(ref);
    struct {
        kv_type t;
        int ftype;
        double tol; /* normalised RMS error */
    } types[] = {{KV_TYPE_F16, 1, 1e-3}, {KV_TYPE_BF16, 32, 8e-3}, {KV_TYPE_Q8_0, 7, 0.01},
                 {KV_TYPE_Q4_0, 2, 0.15}, {KV_TYPE_Q4_1, 3, 0.15}};
    for (size_t k = 0; k < KV_ARRAY_LEN(types); k++) {
        p.type = types[k].t;
        const char *pq = tmp_path("q");
        int rc = kv_mkmodel_write(&p, pq, &err);
        CHECKF(rc == 0, "%s: %s", kv_type_name(types[k].t), err.msg);
        if (rc) continue;
        kv_gguf *g = kv_gguf_open(pq, &err);
        REQUIRE(g);
        CHECK(get_u32(g, "general.file_type") == (uint32_t)types[k].ftype);
        CHECK(kv_gguf_n_tensors(g) == kv_gguf_n_tensors(ref));
        for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
            const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
            const kv_gguf_tensor *r = kv_gguf_find_tensor(ref, name);
            REQUIRE(r);
            CHECKF(t->type == (t->n_dims == 1 ? KV_TYPE_F32 : types[k].t), "%s %s", kv_type_name(types[k].t), name);
            CHECK(!memcmp(t->ne, r->ne, sizeof t->ne));
            float *x = deq(t);
            REQUIRE(x);
            int64_t n = t->ne[0] * t->ne[1];
            const float *y = r->data;
            double e = 0, s = 0;
            for (int64_t j = 0; j < n; j++) {
                e += (double)(x[j] - y[j]) * (x[j] - y[j]);
                s += (double)y[j] * y[j];
            }
            double nerr = sqrt(e / s);
            CHECKF(nerr <= types[k].tol, "%s %s: normalised error %g", kv_type_name(types[k].t), name, nerr);
            free(x);
        }
        kv_gguf_close(g);
        unlink(pq);
    }
    kv_gguf_close(ref);
    unlink(pf);
}

static void test_tied_and_vocab(void) {
    kv_mkmodel_params p = small_params();
    p.untied = 0;
    p.n_vocab = 2000;
    kv_err err;
    const char *path = tmp_path("tied");
    REQUIRE(kv_mkmodel_write(&p, path, &err) == 0);
    kv_gguf *g = kv_gguf_open(path, &err);
    REQUIRE(g);
    CHECK(kv_gguf_find_tensor(g, "output.weight") == NULL);
    CHECK(kv_gguf_n_tensors(g) == 2 + 2 * 9);
    CHECK(has_shape(g, "token_embd.weight", KV_TYPE_F32, 64, 2000));
    /* the vocabulary: unique pieces, and every multi-character normal piece
     * is some shorter piece plus one character (reachable by merging) */
    uint64_t n = 0;
    CHECK(kv_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &n, &err) == 0 && n == 2000);
    int dups = 0, unreachable = 0;
    for (uint64_t i = 0; i < n; i++) {
        kv_gguf_str a = kv_gguf_arr_str(g, "tokenizer.ggml.tokens", i);
        for (uint64_t j = i + 1; j < n; j++) {
            kv_gguf_str b = kv_gguf_arr_str(g, "tokenizer.ggml.tokens", j);
            if (a.len == b.len && !memcmp(a.data, b.data, a.len)) dups++;
        }
        if (i < 259 || a.len <= 1 || (a.len == 3 && !memcmp(a.data, "\xe2\x96\x81", 3))) continue;
        int found = 0;
        for (uint64_t j = 259; j < i && !found; j++) {
            kv_gguf_str b = kv_gguf_arr_str(g, "tokenizer.ggml.tokens", j);
            found = b.len == a.len - 1 && !memcmp(a.data, b.data, b.len);
        }
        unreachable += !found;
    }
    CHECK(dups == 0);
    CHECK(unreachable == 0);
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 259 + 74), "\xe2\x96\x81" "a"));
    kv_gguf_close(g);
    unlink(path);
}

static void test_vocab_from(void) {
    kv_mkmodel_params p = small_params();
    p.vocab_from = harness_shared_path("models/stories260K.gguf");
    p.n_vocab = 1; /* ignored */
    kv_err err;
    const char *path = tmp_path("vfrom");
    CHECKF(kv_mkmodel_write(&p, path, &err) == 0, "%s", err.msg);
    kv_gguf *g = kv_gguf_open(path, &err);
    kv_gguf *src = kv_gguf_open(harness_shared_path("models/stories260K.gguf"), &err);
    REQUIRE(g && src);
    CHECK(get_u32(g, "llama.vocab_size") == 512);
    CHECK(has_shape(g, "token_embd.weight", KV_TYPE_F32, 64, 512));
    for (uint64_t i = 0; i < 512; i++) {
        kv_gguf_str a = kv_gguf_arr_str(g, "tokenizer.ggml.tokens", i);
        kv_gguf_str b = kv_gguf_arr_str(src, "tokenizer.ggml.tokens", i);
        if (a.len != b.len || memcmp(a.data, b.data, a.len)) {
            CHECKF(0, "token %llu differs", (unsigned long long)i);
            break;
        }
    }
    CHECK(kv_gguf_arr_f64(g, "tokenizer.ggml.scores", 300) == kv_gguf_arr_f64(src, "tokenizer.ggml.scores", 300));
    CHECK(get_u32(g, "tokenizer.ggml.bos_token_id") == 1);
    kv_gguf_str s;
    CHECK(kv_gguf_get_str(g, "general.name", &s, &err) == 0 && kv_gguf_str_eq(s, "kvtop-random"));
    CHECK(kv_gguf_get_str(g, "general.architecture", &s, &err) == 0 && kv_gguf_str_eq(s, "llama"));
    kv_gguf_close(g);
    kv_gguf_close(src);
    unlink(path);
    /* a source without a vocabulary, and a missing source */
    kv_mkmodel_params q = small_params();
    const char *novocab = tmp_path("novocab");
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_add_str(w, "general.architecture", "llama");
    REQUIRE(kv_gguf_writer_write(w, novocab, &err) == 0);
    kv_gguf_writer_free(w);
    q.vocab_from = novocab;
    CHECK(kv_mkmodel_write(&q, path, &err) == KV_ERR_FORMAT && strstr(err.msg, "tokenizer.ggml.tokens"));
    CHECK(access(path, F_OK) != 0);
    unlink(novocab);
    q.vocab_from = novocab;
    CHECK(kv_mkmodel_write(&q, path, &err) == KV_ERR_IO && strstr(err.msg, novocab));
}

static void test_validation(void) {
    kv_err err;
    kv_mkmodel_params p = small_params();
    CHECK(kv_mkmodel_validate(&p, &err) == 0);
    p.n_heads = 5;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "heads 5 does not divide dim 64"));
    p = small_params(), p.n_kv_heads = 3;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "kv-heads 3"));
    p = small_params(), p.n_kv_heads = 8;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "kv-heads"));
    p = small_params(), p.n_heads = 64, p.n_kv_heads = 1;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "even"));
    p = small_params(), p.n_vocab = 100;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "vocab 100"));
    p = small_params(), p.dim = 0;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "dim 0"));
    p = small_params(), p.n_layers = 100000;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "layers"));
    p = small_params(), p.ffn_dim = -1;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "ffn"));
    p = small_params(), p.ctx_len = 0;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "ctx"));
    p = small_params(), p.rope_base = 0;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "rope"));
    p = small_params(), p.rms_eps = 0;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "epsilon"));
    p = small_params(), p.type = KV_TYPE_Q4_0, p.ffn_dim = 80;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "multiples of 32"));
    p = small_params(), p.type = KV_TYPE_Q8_1; /* no file type for it */
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "q8_1"));
    p = small_params(), p.type = (kv_type)99;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL);
    CHECK(kv_mkmodel_validate(NULL, &err) == KV_ERR_INVAL);
    p = small_params(), p.n_heads = 5;
    CHECK(kv_mkmodel_n_params(&p) == 0);
    const char *path = tmp_path("bad");
    CHECK(kv_mkmodel_write(&p, path, &err) == KV_ERR_INVAL && access(path, F_OK) != 0);
    p = small_params();
    CHECK(kv_mkmodel_write(&p, "/nonexistent-dir-kvtop/m.gguf", &err) == KV_ERR_IO);
    CHECK(kv_mkmodel_file_type(KV_TYPE_Q4_1) == 3 && kv_mkmodel_file_type(KV_TYPE_I8) == -1);
    kv_mkmodel_params d = kv_mkmodel_default_params();
    CHECK(kv_mkmodel_validate(&d, &err) == 0);
}

/* kv_mkmodel_truncate: the first layers, every other tensor and key as they
 * were (block_count changed), bad layer counts and sources refused with no
 * file left behind. */
static void test_truncate(void) {
    kv_err err;
    kv_mkmodel_params p = small_params();
    p.n_layers = 3;
    const char *src = tmp_path("tsrc"), *dst = tmp_path("tdst");
    REQUIRE(kv_mkmodel_write(&p, src, &err) == 0);
    CHECKF(kv_mkmodel_truncate(src, dst, 1, &err) == 0, "%s", err.msg);
    kv_gguf *a = kv_gguf_open(src, &err), *b = kv_gguf_open(dst, &err);
    REQUIRE(a && b);
    CHECK(get_u32(b, "llama.block_count") == 1 && get_u32(b, "llama.embedding_length") == 64);
    CHECK(kv_gguf_n_kv(b) == kv_gguf_n_kv(a));
    CHECK(kv_gguf_n_tensors(b) == kv_gguf_n_tensors(a) - 2 * 9);
    CHECK(!kv_gguf_find_tensor(b, "blk.1.attn_q.weight") && !kv_gguf_find_tensor(b, "blk.2.ffn_down.weight"));
    static const char *const kept[] = {"token_embd.weight", "output_norm.weight", "output.weight",
                                       "blk.0.attn_q.weight", "blk.0.ffn_down.weight"};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        const kv_gguf_tensor *x = kv_gguf_find_tensor(a, kept[i]), *y = kv_gguf_find_tensor(b, kept[i]);
        CHECKF(x && y && x->size == y->size && !memcmp(x->data, y->data, x->size), "%s", kept[i]);
    }
    kv_gguf_close(a);
    kv_gguf_close(b);
    unlink(dst);
    CHECK(kv_mkmodel_truncate(src, dst, 0, &err) == KV_ERR_INVAL && strstr(err.msg, "has 3"));
    CHECK(kv_mkmodel_truncate(src, dst, 4, &err) == KV_ERR_INVAL && access(dst, F_OK) != 0);
    CHECK(kv_mkmodel_truncate(src, dst, 3, &err) == 0); /* all layers: a copy */
    unlink(dst);
    unlink(src);
    CHECK(kv_mkmodel_truncate(src, dst, 1, &err) == KV_ERR_IO && strstr(err.msg, src) && access(dst, F_OK) != 0);
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_add_u32(w, "llama.block_count", 2);
    REQUIRE(kv_gguf_writer_write(w, src, &err) == 0);
    kv_gguf_writer_free(w);
    CHECK(kv_mkmodel_truncate(src, dst, 1, &err) == KV_ERR_FORMAT && strstr(err.msg, "general.architecture"));
    CHECK(access(dst, F_OK) != 0);
    unlink(src);
}

TEST_MAIN(T(test_f32_model), T(test_deterministic), T(test_types), T(test_tied_and_vocab), T(test_vocab_from),
          T(test_validation), T(test_truncate))
