/* test_model.c - model loading (GGUF and llama2.c), the forward pass on the
 * real stories260K weights against its published greedy output, batch and
 * chunk consistency of the forward, and clean errors on bad model files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/model.h"
#include "../../engine/runner.h"
#include "../../engine/sampler.h"
#include "../harness.h"

/* The published greedy continuation of "Once upon a time" (ids after the
 * 5 prompt ids [1, 403, 407, 261, 378]; shared/models/README.md). */
static const int32_t prompt_ids[] = {1, 403, 407, 261, 378};
static const int32_t golden[] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
                                 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282,
                                 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352};

static kv_model *load_gguf(void) {
    kv_err err = {0};
    kv_model *m = kv_model_load(harness_shared_path("models/stories260K.gguf"), NULL, &err);
    if (!m) fprintf(stderr, "  load: %s\n", err.msg);
    return m;
}

static kv_model *load_bin(void) {
    kv_err err = {0};
    char bin[4096], tok[4096];
    snprintf(bin, sizeof bin, "%s", harness_shared_path("models/stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", harness_shared_path("models/tok512.bin"));
    kv_model *m = kv_model_load(bin, tok, &err);
    if (!m) fprintf(stderr, "  load: %s\n", err.msg);
    return m;
}

static void test_hparams(void) {
    kv_model *m = load_gguf();
    REQUIRE(m);
    CHECK(m->hp.dim == 64 && m->hp.n_layers == 5 && m->hp.n_heads == 8 && m->hp.n_kv_heads == 4);
    CHECK(m->hp.ffn_dim == 172 && m->hp.head_dim == 8 && m->hp.n_vocab == 512 && m->hp.rot_dim == 8);
    CHECK(m->hp.rope_base == 10000.0f && m->hp.rope_neox == 0);
    CHECK(!m->hp.tied_output); /* the GGUF carries output.weight as a separate copy */
    CHECK(m->type_counts[KV_TYPE_F32] == 48);
    kv_model *b = load_bin();
    REQUIRE(b);
    CHECK(b->hp.dim == 64 && b->hp.n_layers == 5 && b->hp.n_kv_heads == 4 && b->hp.n_vocab == 512);
    CHECK(b->hp.tied_output);
    /* the same weights: embedding rows and a deep layer match byte for byte */
    CHECK(memcmp(m->tok_embd.data, b->tok_embd.data, 512 * 64 * 4) == 0);
    CHECK(memcmp(m->layers[4].w_down.data, b->layers[4].w_down.data, 64 * 172 * 4) == 0);
    kv_model_free(m);
    kv_model_free(b);
}

/* Greedy decode of the golden prompt; returns the number of matching ids. */
static int run_golden(kv_model *m, int threads, int chunk, kv_cache_dtype dtype) {
    kv_err err = {0};
    kv_backend *be = kv_backend_create("cpu", threads, &err);
    if (!be) return -1;
    kv_runner *r = kv_runner_new(m, be, 128, chunk, dtype, &err);
    if (!r) {
        kv_backend_free(be);
        return -1;
    }
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    int ok = 0;
    if (kv_runner_eval(r, prompt_ids, 5, logits, NULL, &err) == 0) {
        for (size_t i = 0; i < KV_ARRAY_LEN(golden); i++) {
            int32_t t = kv_argmax(logits, m->hp.n_vocab);
            if (t != golden[i]) break;
            ok++;
            if (kv_runner_eval(r, &t, 1, logits, NULL, &err)) break;
        }
    }
    free(logits);
    kv_runner_free(r);
    kv_backend_free(be);
    return ok;
}

static void test_golden_gguf(void) {
    kv_model *m = load_gguf();
    REQUIRE(m);
    int n = (int)KV_ARRAY_LEN(golden);
    CHECKF(run_golden(m, 1, 512, KV_CACHE_F32) == n, "1 thread");
    CHECKF(run_golden(m, 2, 512, KV_CACHE_F32) == n, "2 threads");
    CHECKF(run_golden(m, 2, 1, KV_CACHE_F32) == n, "prefill one token at a time");
    CHECKF(run_golden(m, 2, 2, KV_CACHE_F16) == n, "f16 KV cache");
    kv_model_free(m);
}

static void test_golden_llama2c(void) {
    kv_model *m = load_bin();
    REQUIRE(m);
    CHECK(run_golden(m, 2, 512, KV_CACHE_F32) == (int)KV_ARRAY_LEN(golden));
    kv_model_free(m);
}

/* Logits of every prompt position computed in one chunk equal those
 * computed token by token (the forward is per-row; attention reads the same
 * cache), within float reassociation noise. */
static void test_chunk_consistency(void) {
    kv_model *m = load_gguf();
    REQUIRE(m);
    kv_err err = {0};
    kv_backend *be = kv_backend_create("cpu", 2, &err);
    REQUIRE(be);
    const int n = 24, V = m->hp.n_vocab;
    int32_t toks[24];
    for (int i = 0; i < n; i++) toks[i] = i == 0 ? 1 : 259 + (i * 37) % 250;
    float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
    kv_runner *r = kv_runner_new(m, be, 64, 64, KV_CACHE_F32, &err);
    REQUIRE(r && a && b);
    CHECK(kv_runner_eval(r, toks, n, NULL, a, &err) == 0);
    kv_runner_reset(r);
    for (int i = 0; i < n; i++) CHECK(kv_runner_eval(r, toks + i, 1, b + (size_t)i * V, NULL, &err) == 0);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        num += (a[i] - b[i]) * (double)(a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    CHECKF(num <= 1e-10 * den, "normalised error %g", num / den);
    /* the context limit is enforced and leaves the runner unchanged */
    int pos = kv_runner_pos(r);
    int32_t many[64] = {0};
    CHECK(kv_runner_eval(r, many, 64, b, NULL, &err) == KV_ERR_RANGE);
    CHECK(kv_runner_pos(r) == pos);
    int32_t bad = 512;
    CHECK(kv_runner_eval(r, &bad, 1, b, NULL, &err) == KV_ERR_RANGE);
    CHECK(kv_runner_pos(r) == pos);
    kv_runner_free(r);
    free(a);
    free(b);
    kv_backend_free(be);
    kv_model_free(m);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static void test_bad_files(void) {
    kv_err err = {0};
    CHECK(kv_model_load("/nonexistent/model.gguf", NULL, &err) == NULL);
    CHECK(err.code == KV_ERR_IO && strstr(err.msg, "/nonexistent/model.gguf"));
    char path[] = "/tmp/kvtop-test-model-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    /* a truncated llama2.c checkpoint */
    int32_t hdr[7] = {64, 172, 5, 8, 4, 512, 512};
    write_file(path, hdr, sizeof hdr);
    kv_err_clear(&err);
    char tok[4096];
    snprintf(tok, sizeof tok, "%s", harness_shared_path("models/tok512.bin"));
    CHECK(kv_model_load(path, tok, &err) == NULL);
    CHECKF(err.code == KV_ERR_FORMAT && strstr(err.msg, "truncated"), "%s", err.msg);
    /* an absurd header */
    int32_t bad[7] = {64, 172, -5, 8, 4, 512, 512};
    write_file(path, bad, sizeof bad);
    kv_err_clear(&err);
    CHECK(kv_model_load(path, tok, &err) == NULL && err.code == KV_ERR_FORMAT);
    /* heads that do not divide */
    int32_t nodiv[7] = {64, 172, 5, 7, 4, 512, 512};
    write_file(path, nodiv, sizeof nodiv);
    kv_err_clear(&err);
    CHECK(kv_model_load(path, tok, &err) == NULL && err.code == KV_ERR_FORMAT);
    /* a GGUF of an unsupported architecture names what is supported */
    kv_gguf_writer *w = kv_gguf_writer_new();
    REQUIRE(w);
    kv_gguf_writer_add_str(w, "general.architecture", "mamba");
    float z[32] = {0};
    int64_t ne[2] = {32, 1};
    kv_gguf_writer_add_tensor(w, "token_embd.weight", KV_TYPE_F32, 2, ne, z, sizeof z);
    CHECK(kv_gguf_writer_write(w, path, &err) == 0);
    kv_gguf_writer_free(w);
    kv_err_clear(&err);
    CHECK(kv_model_load(path, NULL, &err) == NULL);
    CHECKF(err.code == KV_ERR_UNSUPPORTED && strstr(err.msg, "mamba") && strstr(err.msg, "llama"), "%s", err.msg);
    /* a llama2.c checkpoint without its tokenizer is refused clearly */
    char bin[4096];
    snprintf(bin, sizeof bin, "%s", harness_shared_path("models/stories260K.bin"));
    kv_err_clear(&err);
    CHECK(kv_model_load(bin, NULL, &err) == NULL && strstr(err.msg, "tokenizer"));
    unlink(path);
}

TEST_MAIN(T(test_hparams), T(test_golden_gguf), T(test_golden_llama2c), T(test_chunk_consistency),
          T(test_bad_files))
