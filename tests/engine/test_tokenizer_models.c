/* test_tokenizer_models.c - the tokenizer families beyond SentencePiece and
 * byte-level BPE, on tiny vocabularies whose every id is known
 * (tests/tok_tiny.h): Gemma 4's BPE over raw UTF-8 ("▁" spaces, newline
 * runs, <0xNN> byte fallback) and WordPiece (BERT's normaliser, greedy
 * longest match, [UNK] words); the Unicode maps WordPiece needs; and, on
 * llama.cpp's real vocab files when tools/vocab_fetch.sh has put them
 * under build/llama-vocab, round trips and bounded encoding. The ids of
 * every real set against its reference are tests/e2e/vocab_sets.sh's. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../harness.h"
#include "../tok_tiny.h"
#include "../../engine/tokenizer.h"
#include "../../engine/unicode.h"

/* Encodes text and compares with want[0..n). */
static int ids_are(const kv_tokenizer *t, const char *text, int special, const int32_t *want, int n) {
    int32_t got[512];
    kv_err err = {0};
    int m = kv_tokenizer_encode(t, text, strlen(text), 0, special, got, 512, &err);
    int ok = m == n && !memcmp(got, want, (size_t)n * sizeof *got);
    if (!ok) {
        printf("    [%s]: got", text);
        for (int i = 0; i < m && i < 64; i++) printf(" %d", got[i]);
        printf(" (%d ids%s)\n", m, m < 0 ? err.msg : "");
    }
    return ok;
}

#define IDS(t, text, special, ...)                                                                  \
    do {                                                                                            \
        const int32_t want_[] = {__VA_ARGS__};                                                      \
        CHECKF(ids_are(t, text, special, want_, (int)(sizeof want_ / sizeof want_[0])), "%s", text); \
    } while (0)

static void test_unicode_maps(void) {
    CHECK(kv_unicode_tolower('A') == 'a' && kv_unicode_tolower('z') == 'z' && kv_unicode_tolower('1') == '1');
    CHECK(kv_unicode_tolower(0xC4) == 0xE4);     /* Ä -> ä */
    CHECK(kv_unicode_tolower(0x3A3) == 0x3C3);   /* Σ -> σ */
    CHECK(kv_unicode_tolower(0x130) == 'i');     /* İ: the simple mapping, not "i̇" */
    CHECK(kv_unicode_tolower(0x212A) == 'k');    /* KELVIN SIGN */
    CHECK(kv_unicode_tolower(0x416) == 0x436);   /* Ж -> ж */
    CHECK(kv_unicode_tolower(0x4E2D) == 0x4E2D); /* 中 has no case */
    CHECK(kv_unicode_nfd_first(0xE9) == 'e');    /* é */
    CHECK(kv_unicode_nfd_first(0x1EC7) == 'e');  /* ệ: two marks */
    CHECK(kv_unicode_nfd_first(0xD55C) == 0x1112); /* 한: leading jamo */
    CHECK(kv_unicode_nfd_first(0xAC00) == 0x1100 && kv_unicode_nfd_first(0xD7A3) == 0x1112);
    CHECK(kv_unicode_nfd_first('e') == 'e' && kv_unicode_nfd_first(0x4E2D) == 0x4E2D);
    CHECK(kv_unicode_nfd_first(0x110000) == 0x110000 && kv_unicode_tolower(0x110000) == 0x110000);
}

static void test_raw_bpe(void) {
    kv_err err = {0};
    kv_tokenizer *t = tiny_tokenizer("gemma4", NULL, &err);
    REQUIRE(t);
    CHECK(kv_tokenizer_type(t) == KV_TOK_BPE && !strcmp(kv_tokenizer_pre(t), "gemma4"));
    CHECK(kv_tokenizer_add_bos(t) && kv_tokenizer_bos(t) == 1); /* Gemma 4 always starts with BOS */
    /* " ab c" merges to ▁ab ▁ c; "\n\n" is a token of its own; x and é
     * are not in the vocab: <0x78>, <0xC3><0xA9>. */
    IDS(t, " ab c\n\nx", 0, 265, 259, 262, 267, 3 + 0x78);
    IDS(t, "\xC3\xA9", 0, 3 + 0xC3, 3 + 0xA9);
    IDS(t, "\n\n\n", 0, 266, 266, 266); /* a newline run that is no token: per character */
    IDS(t, "a\nab", 0, 260, 266, 264);
    IDS(t, "<|turn>ab", 1, 268, 264);
    IDS(t, "<|turn>", 0, 3 + '<', 3 + '|', 3 + 't', 3 + 'u', 3 + 'r', 3 + 'n', 3 + '>');
    /* Decoding gives the text back: ▁ is a space, byte tokens their bytes. */
    const char *texts[] = {" ab c\n\nx", "caf\xC3\xA9  ab\n", "\xF0\x9F\x98\x80 a", "\xFF\xFE raw bytes"};
    for (size_t i = 0; i < KV_ARRAY_LEN(texts); i++) {
        int32_t ids[256];
        char dec[512];
        int n = kv_tokenizer_encode(t, texts[i], strlen(texts[i]), 0, 0, ids, 256, &err);
        int d = kv_tokenizer_decode(t, ids, n, 0, dec, sizeof dec);
        CHECKF(n > 0 && d == (int)strlen(texts[i]) && !strcmp(dec, texts[i]), "round trip of [%s]: [%s]", texts[i],
               d >= 0 ? dec : "");
    }
    /* Splits cover the input bytes (not the ▁-spelled ones). */
    int32_t lens[8];
    CHECK(kv_tokenizer_split(t, " a b\n\nc", 7, 0, lens, 8, &err) == 3 && lens[0] == 4 && lens[1] == 2 && lens[2] == 1);
    kv_tokenizer_free(t);
}

static void test_wordpiece(void) {
    kv_err err = {0};
    kv_tokenizer *t = tiny_tokenizer("bert", NULL, &err);
    REQUIRE(t);
    CHECK(kv_tokenizer_type(t) == KV_TOK_WPM && kv_tokenizer_unk(t) == 1 && kv_tokenizer_bos(t) == 2);
    CHECK(strstr(kv_tokenizer_kind(t), "WordPiece") && strstr(kv_tokenizer_kind(t), "lowercase"));
    IDS(t, "Hello, WORLD!", 0, 5, 10, 6, 11);
    IDS(t, "H\xC3\xA9llo", 0, 5);                 /* é -> e */
    IDS(t, "e\xCC\x81", 0, 12);                   /* e + COMBINING ACUTE: the mark goes */
    IDS(t, "unaffable", 0, 7, 8, 9);              /* ▁un aff able, longest first */
    IDS(t, "hexyz world", 0, 1, 6);               /* no way to cut "xyz": the word is [UNK] */
    IDS(t, "\xE4\xB8\xAD\xE6\x96\x87", 0, 13, 14); /* each CJK ideograph is a word */
    IDS(t, "\tHELLO\x01\xC2\xA0 world\r\n", 0, 5, 6); /* control dropped, Unicode spaces split */
    IDS(t, "[CLS] hello", 1, 2, 5);
    IDS(t, "[CLS] hello", 0, 1, 1, 1, 5);         /* "[", "cls", "]" as text: no such pieces */
    /* BERT's 100-character word limit. */
    char w100[128] = "he", w102[128] = "he";
    for (int i = 0; i < 49; i++) strcat(w100, "ll");
    for (int i = 0; i < 50; i++) strcat(w102, "ll");
    int32_t ids[128];
    CHECK(kv_tokenizer_encode(t, w100, strlen(w100), 0, 0, ids, 128, &err) == 50 && ids[0] == 16 && ids[49] == 15);
    CHECK(kv_tokenizer_encode(t, w102, strlen(w102), 0, 0, ids, 128, &err) == 1 && ids[0] == 1);
    /* BOS is [CLS]; max_tokens stops the encoding. */
    CHECK(kv_tokenizer_encode(t, "hello", 5, 1, 0, ids, 128, &err) == 2 && ids[0] == 2 && ids[1] == 5);
    kv_encode_opts o = {.max_tokens = 2};
    CHECK(kv_tokenizer_encode_ex(t, "hello hello hello", 17, &o, ids, 128, &err) == KV_ERR_RANGE);
    CHECK(kv_tokenizer_encode(t, "", 0, 0, 0, ids, 128, &err) == 0);
    CHECK(kv_tokenizer_encode(t, " \t\n", 3, 0, 0, ids, 128, &err) == 0);
    char dec[64];
    int32_t hw[] = {5, 10, 6};
    CHECK(kv_tokenizer_decode(t, hw, 3, 0, dec, sizeof dec) == 14 && !strcmp(dec, " hello , world"));
    kv_tokenizer_free(t);
}

/* Real vocab files (tools/vocab_fetch.sh): every test string of the BPE
 * sets decodes back to itself, and a huge text is refused by max_tokens. */
static void test_real_vocabs(void) {
    const char *vd = getenv("KVTOP_VOCAB_DIR");
    if (!vd || !*vd) vd = "build/llama-vocab";
    const char *sets[] = {"gemma-4", "qwen35", "deepseek-llm", "deepseek-coder", "bert-bge"};
    size_t big_n = 4 << 20;
    char *big = malloc(big_n);
    REQUIRE(big);
    for (size_t i = 0; i < big_n; i++) big[i] = "hello world, it's 2024!\n"[i % 24];
    for (size_t s = 0; s < KV_ARRAY_LEN(sets); s++) {
        char path[4096 + 64];
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vd, sets[s]);
        if (!harness_present(path, "tools/vocab_fetch.sh")) continue;
        kv_err err = {0};
        kv_gguf *g = kv_gguf_open(path, &err);
        kv_tokenizer *t = g ? kv_tokenizer_from_gguf(g, &err) : NULL;
        kv_gguf_close(g);
        CHECKF(t != NULL, "%s: %s", path, err.msg);
        if (!t) continue;
        CHECKF(!kv_tokenizer_warning(t)[0], "%s: %s", sets[s], kv_tokenizer_warning(t));
        char inp[4096 + 128];
        snprintf(inp, sizeof inp, "%s.inp", path);
        size_t n;
        char *text = harness_read_file(inp, &n);
        int trips = 0, total = 0;
        int lossy = kv_tokenizer_type(t) == KV_TOK_WPM;
        for (char *p = text; p && !lossy;) {
            char *end = strstr(p, "\n__ggml_vocab_test__\n");
            size_t len = end ? (size_t)(end - p) : strlen(p);
            static int32_t ids[1 << 14];
            static char dec[1 << 16];
            int m = kv_tokenizer_encode(t, p, len, 0, 0, ids, 1 << 14, &err);
            int d = m >= 0 ? kv_tokenizer_decode(t, ids, m, 0, dec, sizeof dec) : -1;
            trips += d == (int)len && !memcmp(dec, p, len);
            total++;
            if (!end) break;
            p = end + strlen("\n__ggml_vocab_test__\n");
        }
        if (!lossy) {
            CHECKF(trips == total && total > 0, "%s: %d/%d strings decode back", sets[s], trips, total);
            printf("  %s: %d/%d test strings decode back to themselves\n", sets[s], trips, total);
        }
        free(text);
        kv_encode_opts o = {.max_tokens = 1000};
        int32_t ids[1001];
        struct timespec t0, t1, t2;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECKF(kv_tokenizer_encode_ex(t, big, big_n, &o, ids, 1001, &err) == KV_ERR_RANGE, "%s: 4 MB text vs 1000",
               sets[s]);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        /* Speed on 1 MB of that text (a figure, not a check). */
        int n1 = kv_tokenizer_encode(t, big, 1 << 20, 0, 0, NULL, 0, &err);
        clock_gettime(CLOCK_MONOTONIC, &t2);
        double ms_lim = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        double ms = (t2.tv_sec - t1.tv_sec) * 1e3 + (t2.tv_nsec - t1.tv_nsec) / 1e6;
        CHECK(n1 > 0);
        printf("  %s: 4 MB text refused at 1000 tokens in %.2f ms; 1 MB -> %d tokens in %.1f ms (%.1f MB/s)\n",
               sets[s], ms_lim, n1, ms, ms > 0 ? 1e3 / ms : 0.0);
        kv_tokenizer_free(t);
    }
    free(big);
}

TEST_MAIN(T(test_unicode_maps), T(test_raw_bpe), T(test_wordpiece), T(test_real_vocabs))
