/* gen_seeds_gguf.c - writes the seed corpus for fuzz_gguf with the GGUF
 * writer (small files, each under 8 KiB). Not part of any build; run by hand
 * after changing the format code:
 *   cc -std=c11 -D_GNU_SOURCE -I. -o /tmp/gen tests/fuzz/gen_seeds_gguf.c \
 *      engine/gguf.c engine/common.c kernels/types.c -lm
 *   /tmp/gen tests/fuzz/seeds/fuzz_gguf */
#include <stdio.h>
#include <string.h>

#include "../../engine/gguf.h"

static int put(kv_gguf_writer *w, const char *dir, const char *name) {
    char path[1024];
    kv_err err;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = kv_gguf_writer_write(w, path, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    kv_gguf_writer_free(w);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds_gguf DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    int rc = 0;
    float f[64];
    for (int i = 0; i < 64; i++) f[i] = (float)i * 0.25f - 4.0f;
    unsigned char q[4 * 34];
    for (size_t i = 0; i < sizeof q; i++) q[i] = (unsigned char)(i * 37 + 11);

    /* a tiny llama: metadata of several types, a vocabulary, tensors */
    kv_gguf_writer *w = kv_gguf_writer_new();
    const char *toks[] = {"<unk>", "<s>", "</s>", "<0x00>", "\xe2\x96\x81", "a", ("\xe2\x96\x81" "ab")};
    float scores[] = {0, 0, 0, 0, -1, -2, -3};
    int32_t types[] = {2, 3, 3, 6, 1, 1, 1};
    kv_gguf_writer_add_str(w, "general.architecture", "llama");
    kv_gguf_writer_add_u32(w, "llama.embedding_length", 8);
    kv_gguf_writer_add_u32(w, "llama.block_count", 1);
    kv_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 7);
    kv_gguf_writer_add_arr(w, "tokenizer.ggml.scores", KV_GGUF_FLOAT32, scores, 7);
    kv_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", KV_GGUF_INT32, types, 7);
    kv_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1);
    int64_t ne_e[] = {8, 7}, ne_n[] = {8}, ne_q[] = {32, 4};
    kv_gguf_writer_add_tensor(w, "token_embd.weight", KV_TYPE_F32, 2, ne_e, f, 8 * 7 * 4);
    kv_gguf_writer_add_tensor(w, "output_norm.weight", KV_TYPE_F32, 1, ne_n, f, 32);
    kv_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", KV_TYPE_Q8_0, 2, ne_q, q, sizeof q);
    rc |= put(w, dir, "tiny_llama.gguf");
    /* the same as GGUF v2 (same layout, version field 2) */
    char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s/tiny_llama.gguf", dir);
    snprintf(dst, sizeof dst, "%s/tiny_llama_v2.gguf", dir);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (in && out) {
        unsigned char buf[8192];
        size_t n = fread(buf, 1, sizeof buf, in);
        buf[4] = 2;
        if (fwrite(buf, 1, n, out) != n) rc = 1;
    } else {
        rc = 1;
    }
    if (in) fclose(in);
    if (out && fclose(out)) rc = 1;

    /* every scalar type and nested arrays */
    w = kv_gguf_writer_new();
    uint8_t u8 = 200;
    int8_t i8 = -3;
    uint16_t u16 = 60000;
    int16_t i16 = -2;
    int64_t i64 = -5;
    double f64 = 0.125;
    kv_gguf_writer_add_scalar(w, "u8", KV_GGUF_UINT8, &u8);
    kv_gguf_writer_add_scalar(w, "i8", KV_GGUF_INT8, &i8);
    kv_gguf_writer_add_scalar(w, "u16", KV_GGUF_UINT16, &u16);
    kv_gguf_writer_add_scalar(w, "i16", KV_GGUF_INT16, &i16);
    kv_gguf_writer_add_u32(w, "u32", 7);
    kv_gguf_writer_add_i32(w, "i32", -7);
    kv_gguf_writer_add_f32(w, "f32", 1.5f);
    kv_gguf_writer_add_bool(w, "bool", 0);
    kv_gguf_writer_add_str(w, "str", "text");
    kv_gguf_writer_add_u64(w, "u64", 1ull << 40);
    kv_gguf_writer_add_scalar(w, "i64", KV_GGUF_INT64, &i64);
    kv_gguf_writer_add_scalar(w, "f64", KV_GGUF_FLOAT64, &f64);
    unsigned char nest[] = {9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,                  /* 2 arrays */
                            4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0,     /* [5] */
                            8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,                  /* ["xy"] */
                            2, 0, 0, 0, 0, 0, 0, 0, 'x', 'y'};
    kv_gguf_writer_add_raw(w, "nested", KV_GGUF_ARRAY, nest, sizeof nest);
    uint16_t a16[] = {1, 2, 3};
    kv_gguf_writer_add_arr(w, "a16", KV_GGUF_UINT16, a16, 3);
    rc |= put(w, dir, "all_types.gguf");

    /* alignment 64 and several tensor types and ranks */
    w = kv_gguf_writer_new();
    kv_gguf_writer_set_alignment(w, 64);
    int64_t ne4[] = {2, 2, 2, 2}, ne3[] = {4, 2, 2}, neq4[] = {32, 1};
    uint16_t h[16];
    for (int i = 0; i < 16; i++) h[i] = kv_fp32_to_fp16((float)i);
    kv_gguf_writer_add_tensor(w, "f16_4d", KV_TYPE_F16, 4, ne4, h, sizeof h);
    kv_gguf_writer_add_tensor(w, "bf16_3d", KV_TYPE_BF16, 3, ne3, h, sizeof h);
    kv_gguf_writer_add_tensor(w, "q4_0", KV_TYPE_Q4_0, 2, neq4, q, 18);
    kv_gguf_writer_add_tensor(w, "q4_1", KV_TYPE_Q4_1, 2, neq4, q, 20);
    rc |= put(w, dir, "align64.gguf");

    /* metadata only (vocab-only style) */
    w = kv_gguf_writer_new();
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    const char *merges[] = {"a b", "ab c", "\xc4\xa0 t"};
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 3);
    rc |= put(w, dir, "vocab_only.gguf");
    return rc ? 1 : 0;
}
