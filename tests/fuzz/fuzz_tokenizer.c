/* fuzz_tokenizer.c - libFuzzer target for the tokenizers and chat templates.
 * The first input byte picks a mode; the rest is the data:
 *   0: encode with the stories260K SPM vocab, 1: with a BPE vocab: bits 3-6
 *      of the mode byte pick GPT-2's real one or a tiny one (tests/tok_tiny.h)
 *      for each pre-tokenizer, Gemma 4's raw-UTF-8 BPE or WordPiece (bit 2
 *      turns parse_special on): every id must be in range, valid UTF-8 must
 *      decode (whole and streamed) back to itself (not for lossy WordPiece),
 *      and max_tokens must hold;
 *   2: the data as a chat template text and as message contents;
 *   3: the data as a GGUF file given to kv_tokenizer_from_gguf.
 * The vocabularies come from $KVTOP_SHARED (default ../shared), loaded once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/chat_template.h"
#include "../../engine/gguf.h"
#include "../../engine/tokenizer.h"
#include "../../engine/unicode.h"
#include "../tok_tiny.h"

static kv_tokenizer *load(const char *rel) {
    const char *dir = getenv("KVTOP_SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", (dir && *dir) ? dir : "../shared", rel);
    kv_err err = {0};
    kv_gguf *g = kv_gguf_open(path, &err);
    kv_tokenizer *t = g ? kv_tokenizer_from_gguf(g, &err) : NULL;
    kv_gguf_close(g);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", path, err.msg);
        abort();
    }
    return t;
}

/* strict: the vocab is a real one, so text must round-trip. */
static void check_encode(const kv_tokenizer *t, const char *s, size_t n, int special, int strict) {
    static int32_t ids[1 << 17];
    static char dec[1 << 18], chunk[4096];
    kv_err err = {0};
    int m = kv_tokenizer_encode(t, s, n, 0, special, ids, (int)(sizeof ids / sizeof ids[0]), &err);
    if (m < 0 || m > (int)(sizeof ids / sizeof ids[0])) abort();
    for (int i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= kv_tokenizer_n_vocab(t)) abort();
    int d = kv_tokenizer_decode(t, ids, m, special, dec, sizeof dec);
    if (d < 0) abort();
    /* Round trip for valid UTF-8. SPM cannot carry U+2581 (its space
     * symbol), and with parse_special it adds a dummy-prefix space after
     * each special token; BPE special texts decode as written. */
    int valid = kv_utf8_valid(s, n);
    int spm = kv_tokenizer_type(t) == KV_TOK_SPM, raw = !strcmp(kv_tokenizer_model(t), "gemma4");
    int wpm = kv_tokenizer_type(t) == KV_TOK_WPM;
    int roundtrip = strict && valid && !wpm && !((spm || raw) && memmem(s, n, "\xE2\x96\x81", 3)) &&
                    !(spm && special);
    /* A limit below the count fails with KV_ERR_RANGE; at the count it holds. */
    kv_encode_opts lo = {.parse_special = special, .max_tokens = m > 1 ? m - 1 : 0};
    if (m > 1 && kv_tokenizer_encode_ex(t, s, n, &lo, NULL, 0, &err) != KV_ERR_RANGE) abort();
    lo.max_tokens = m;
    if (m > 0 && kv_tokenizer_encode_ex(t, s, n, &lo, NULL, 0, &err) != m) abort();
    if (roundtrip && ((size_t)d != n || memcmp(dec, s, n))) abort();
    /* Streaming gives the same bytes, in whole characters for valid text. */
    kv_detok dt;
    kv_detok_init(&dt, t, KV_DETOK_AT_BOS | (special ? KV_DETOK_SPECIAL : 0));
    size_t off = 0;
    for (int i = 0; i < m; i++) {
        int c = kv_detok_push(t, &dt, ids[i], chunk, sizeof chunk);
        if (c < 0) abort();
        if (roundtrip && !kv_utf8_valid(chunk, (size_t)c)) abort();
        if (off + (size_t)c > sizeof dec || memcmp(dec + off, chunk, (size_t)c)) abort();
        off += (size_t)c;
    }
    int c = kv_detok_flush(t, &dt, chunk, sizeof chunk);
    if (c < 0 || off + (size_t)c != (size_t)d || memcmp(dec + off, chunk, (size_t)c)) abort();
}

static void check_chat(const char *s, size_t n) {
    /* NUL-terminated copy: the template text and, split in three, contents. */
    char *text = malloc(n + 1);
    if (!text) return;
    memcpy(text, s, n);
    text[n] = 0;
    kv_chat_tmpl k = kv_chat_detect_n(s, n);
    if (kv_chat_detect(text) != k && !memchr(s, 0, n)) abort();
    const char *parts[3] = {text, text + n / 3, text + 2 * n / 3};
    kv_chat_msg msgs[3] = {{"system", parts[2]}, {"user", parts[1]}, {"assistant", parts[0]}};
    char sys[64];
    kv_chat_default_system(text, sys, sizeof sys);
    for (int kind = KV_CHAT_PLAIN; kind <= KV_CHAT_COMMAND_R; kind++) {
        int need = kv_chat_format((kv_chat_tmpl)kind, text, msgs, 3, 1, NULL, 0);
        if (need < 0) abort();
        char *out = malloc((size_t)need + 1);
        if (!out) break;
        if (kv_chat_format((kv_chat_tmpl)kind, text, msgs, 3, 1, out, (size_t)need + 1) != need ||
            strlen(out) > (size_t)need)
            abort();
        free(out);
    }
    free(text);
}

/* Every pre-tokenizer pipeline on a tiny byte-level vocab, then the raw
 * BPE and WordPiece ones. */
static const char *const tiny_pres[] = {"default", "gpt-2", "starcoder", "llama-bpe", "qwen2", "falcon",
                                        "qwen35", "deepseek-llm", "deepseek-coder", "gemma4"};
enum { N_TINY = sizeof tiny_pres / sizeof tiny_pres[0] + 2 };

static kv_tokenizer *tiny_or_die(const char *model, const char *pre) {
    kv_err err = {0};
    kv_tokenizer *t = tiny_tokenizer(model, pre, &err);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: tiny %s/%s: %s\n", model, pre ? pre : "", err.msg);
        abort();
    }
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kv_tokenizer *spm, *bpe, *tiny[N_TINY];
    if (!spm) {
        spm = load("models/stories260K.gguf");
        bpe = load("vocab/ggml-vocab-gpt-2.gguf");
        for (int i = 0; i < N_TINY - 2; i++) tiny[i] = tiny_or_die("gpt2", tiny_pres[i]);
        tiny[N_TINY - 2] = tiny_or_die("gemma4", NULL);
        tiny[N_TINY - 1] = tiny_or_die("bert", NULL);
    }
    if (size < 1) return 0;
    int mode = data[0] & 3, special = (data[0] >> 2) & 1;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    switch (mode) {
    case 0: check_encode(spm, s, n, special, 1); break;
    case 1: {
        int pick = (data[0] >> 3) & 15; /* 0: GPT-2's vocab, then the tiny ones */
        check_encode(pick == 0 || pick > N_TINY ? bpe : tiny[pick - 1], s, n, special, 1);
        break;
    }
    case 2: check_chat(s, n); break;
    default: {
        kv_err err = {0};
        kv_gguf *g = kv_gguf_open_mem(s, n, &err);
        if (g) {
            kv_tokenizer *t = kv_tokenizer_from_gguf(g, &err);
            kv_gguf_close(g);
            if (t) check_encode(t, "Hello world, 123 \xC3\xA9\xE6\x97\xA5!", 20, special, 0);
            kv_tokenizer_free(t);
        }
        break;
    }
    }
    return 0;
}
