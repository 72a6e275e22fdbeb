/* tok_tiny.h - tiny vocabularies built in memory (through a scratch GGUF
 * file) for the tokenizer tests and the tokenizer fuzz target: one per
 * tokenizer family whose real vocabularies are too big to carry, so each
 * path has a vocab whose every id is known. Header-only; include once. */
#ifndef KV_TEST_TOK_TINY_H
#define KV_TEST_TOK_TINY_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/utf8.h"
#include "../engine/gguf.h"
#include "../engine/tokenizer.h"

enum { TINY_MAX_TOKENS = 300 };

typedef struct tiny_vocab {
    const char *strs[TINY_MAX_TOKENS];
    int32_t types[TINY_MAX_TOKENS];
    int n;
    char bytes[256][8]; /* storage for generated texts */
} tiny_vocab;

static inline void tiny_add(tiny_vocab *v, const char *s, int32_t type) {
    v->strs[v->n] = s;
    v->types[v->n++] = type;
}

/* Writes w to the scratch file at path, builds the tokenizer of that file
 * (opened, read and closed again) and removes the file: the tokenizer, or
 * NULL with err set. w stays the caller's. */
static inline kv_tokenizer *tiny_writer_tokenizer(kv_gguf_writer *w, const char *path, kv_err *err) {
    kv_tokenizer *t = NULL;
    if (kv_gguf_writer_write(w, path, err) == 0) {
        kv_gguf *g = kv_gguf_open(path, err);
        if (g) t = kv_tokenizer_from_gguf(g, err);
        kv_gguf_close(g);
    }
    remove(path);
    return t;
}

/* A tokenizer of model "gpt2" (the 256 byte-level characters, then "ab"
 * and "abc" with their merges; ids 0..255 are the bytes' characters in
 * byte order), "gemma4" (ids: 0 <unk>, 1 <bos>, 2 <eos>, 3..258 <0x00>..
 * <0xFF>, then ▁ a b c ▁a ab ▁ab \n \n\n <|turn> <turn|>) or "bert" ([PAD]
 * [UNK] [CLS] [SEP] [MASK], then ▁hello ▁world ▁un aff able ▁, ▁! ▁e ▁中 ▁文
 * ll ▁he). pre names the gpt2 pre-tokenizer. NULL with err on failure. */
static inline kv_tokenizer *tiny_tokenizer(const char *model, const char *pre, kv_err *err) {
    static tiny_vocab v;
    memset(&v, 0, sizeof v);
    const char *merges[4];
    int n_merges = 0;
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_add_str(w, "general.architecture", "llama");
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", model);
    if (!strcmp(model, "gpt2")) {
        for (int b = 0, k = 0; b < 256; b++) {
            int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)k++;
            size_t m = kv_utf8_encode(cp, v.bytes[b]);
            v.bytes[b][m] = 0;
            tiny_add(&v, v.bytes[b], KV_TOKEN_NORMAL);
        }
        tiny_add(&v, "ab", KV_TOKEN_NORMAL);
        tiny_add(&v, "abc", KV_TOKEN_NORMAL);
        merges[n_merges++] = "a b";
        merges[n_merges++] = "ab c";
        kv_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre ? pre : "default");
    } else if (!strcmp(model, "gemma4")) {
        tiny_add(&v, "<unk>", KV_TOKEN_UNKNOWN);
        tiny_add(&v, "<bos>", KV_TOKEN_CONTROL);
        tiny_add(&v, "<eos>", KV_TOKEN_CONTROL);
        for (int b = 0; b < 256; b++) {
            snprintf(v.bytes[b], sizeof v.bytes[b], "<0x%02X>", b);
            tiny_add(&v, v.bytes[b], KV_TOKEN_BYTE);
        }
        const char *rest[] = {"\xE2\x96\x81", "a", "b", "c", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab", "\n", "\n\n"};
        for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) tiny_add(&v, rest[i], KV_TOKEN_NORMAL);
        tiny_add(&v, "<|turn>", KV_TOKEN_CONTROL);
        tiny_add(&v, "<turn|>", KV_TOKEN_CONTROL);
        merges[n_merges++] = "\xE2\x96\x81 a";
        merges[n_merges++] = "a b";
        merges[n_merges++] = "\xE2\x96\x81" "a b";
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    } else {
        const char *ctl[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
        for (int i = 0; i < 5; i++) tiny_add(&v, ctl[i], i == 1 ? KV_TOKEN_UNKNOWN : KV_TOKEN_CONTROL);
        const char *words[] = {"\xE2\x96\x81hello", "\xE2\x96\x81world", "\xE2\x96\x81un", "aff", "able",
                               "\xE2\x96\x81,", "\xE2\x96\x81!", "\xE2\x96\x81" "e", "\xE2\x96\x81\xE4\xB8\xAD",
                               "\xE2\x96\x81\xE6\x96\x87", "ll", "\xE2\x96\x81he"};
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) tiny_add(&v, words[i], KV_TOKEN_NORMAL);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 1);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.cls_token_id", 2);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.seperator_token_id", 3);
    }
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v.strs, NULL, (uint64_t)v.n);
    kv_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", KV_GGUF_INT32, v.types, (uint64_t)v.n);
    if (n_merges) kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, (uint64_t)n_merges);
    char path[256];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvtop_tiny_tok_%d.gguf", dir && *dir ? dir : "/tmp", (int)getpid());
    kv_tokenizer *t = tiny_writer_tokenizer(w, path, err);
    kv_gguf_writer_free(w);
    return t;
}

#endif
