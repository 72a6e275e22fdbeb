/* test_tokenizer.c - tokenizers against reference ids: the four vocabularies
 * in ../shared/vocab (every string of every .inp must give its .out ids),
 * stories260K from GGUF and from llama2.c tok512.bin, the llama2.c 32k vocab
 * against the same vocab in GGUF, SmolLM2 specials (when models/ has it),
 * pre-tokenizer splits against Python `regex` outputs, round trips, the
 * streaming detokenizer, bad input and speed. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine_helpers.h"
#include "../harness.h"
#include "../../engine/gguf.h"
#include "../../engine/tokenizer.h"
#include "../../base/file.h"
#include "../../engine/unicode.h"

/* ------------------------------------------------------------------ */
/* helpers */

/* The tokenizer of the shared test data's GGUF file rel, or NULL with the
 * reason printed. */
static kv_tokenizer *load_gguf_tok(const char *rel) {
    kv_err err = {0};
    kv_tokenizer *t = test_gguf_tokenizer(harness_shared_path(rel), &err);
    if (!t) fprintf(stderr, "  tokenizer from %s: %s\n", rel, err.msg);
    return t;
}

/* Test strings of a vocab: the .inp split on "\n__ggml_vocab_test__\n" and
 * the .out lines. */
typedef struct vocab_cases {
    char *inp, *out;      /* file contents (strings point into them) */
    int n;
    const char *text[128];
    size_t text_len[128];
    int32_t ids[128][512];
    int n_ids[128];
} vocab_cases;

static int load_cases(const char *vocab, vocab_cases *vc) {
    char rel[256];
    size_t li, lo;
    memset(vc, 0, sizeof *vc);
    snprintf(rel, sizeof rel, "vocab/%s.inp", vocab);
    vc->inp = harness_read_file(harness_shared_path(rel), &li);
    snprintf(rel, sizeof rel, "vocab/%s.out", vocab);
    vc->out = harness_read_file(harness_shared_path(rel), &lo);
    if (!vc->inp || !vc->out) return -1;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = vc->inp, *end = vc->inp + li;
    while (p < end && vc->n < 128) {
        char *q = strstr(p, sep);
        if (!q) break; /* the file ends with a separator */
        vc->text[vc->n] = p;
        vc->text_len[vc->n] = (size_t)(q - p);
        vc->n++;
        p = q + strlen(sep);
    }
    char *line = vc->out;
    for (int i = 0; i < vc->n; i++) {
        char *nl = strchr(line, '\n');
        if (!nl) return -1;
        *nl = 0;
        char *s = line, *e2;
        int k = 0;
        for (;;) {
            long v = strtol(s, &e2, 10);
            if (e2 == s) break;
            if (k < 512) vc->ids[i][k++] = (int32_t)v;
            s = e2;
        }
        vc->n_ids[i] = k;
        line = nl + 1;
    }
    return 0;
}

static void free_cases(vocab_cases *vc) {
    free(vc->inp);
    free(vc->out);
}

static int contains(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(s + i, needle, m)) return 1;
    return 0;
}

/* Encodes every string of a vocab and compares with the reference ids;
 * also checks decode(encode(s)) == s. Returns the number that match. */
static int check_vocab(const char *vocab) {
    char rel[256];
    snprintf(rel, sizeof rel, "vocab/%s", vocab);
    kv_tokenizer *t = load_gguf_tok(rel);
    vocab_cases *vc = malloc(sizeof *vc);
    if (!t || !vc || load_cases(vocab, vc)) {
        CHECKF(0, "cannot load %s", vocab);
        kv_tokenizer_free(t);
        if (vc) free_cases(vc);
        free(vc);
        return -1;
    }
    CHECKF(vc->n >= 40, "%s: only %d test strings", vocab, vc->n);
    int pass = 0;
    int32_t ids[1024];
    char dec[4096];
    for (int i = 0; i < vc->n; i++) {
        kv_err err = {0};
        int n = kv_tokenizer_encode(t, vc->text[i], vc->text_len[i], 0, 0, ids, 1024, &err);
        int ok = n == vc->n_ids[i] && !memcmp(ids, vc->ids[i], (size_t)n * sizeof *ids);
        if (ok) {
            pass++;
        } else {
            fprintf(stderr, "  %s case %d [%.*s]: got", vocab, i, (int)KV_MIN(vc->text_len[i], 60), vc->text[i]);
            for (int k = 0; k < n && k < 40; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n     want");
            for (int k = 0; k < vc->n_ids[i] && k < 40; k++) fprintf(stderr, " %d", vc->ids[i][k]);
            fprintf(stderr, "\n");
        }
        CHECK(ok);
        /* Round trip. U+2581 is SentencePiece's space, so SPM cannot carry it. */
        if (n >= 0 && !(kv_tokenizer_type(t) == KV_TOK_SPM && contains(vc->text[i], vc->text_len[i], "\xE2\x96\x81"))) {
            int m = kv_tokenizer_decode(t, ids, n, 0, dec, sizeof dec);
            CHECKF(m == (int)vc->text_len[i] && !memcmp(dec, vc->text[i], vc->text_len[i]),
                   "%s case %d: round trip gave [%.*s]", vocab, i, KV_MAX(m, 0), dec);
        }
    }
    printf("  %s: %d/%d strings match the reference ids\n", vocab, pass, vc->n);
    free_cases(vc);
    free(vc);
    kv_tokenizer_free(t);
    return pass;
}

/* ------------------------------------------------------------------ */
/* the reference vocabularies */

static void test_vocab_llama_spm(void) { check_vocab("ggml-vocab-llama-spm.gguf"); }
static void test_vocab_phi3(void) { check_vocab("ggml-vocab-phi-3.gguf"); }
static void test_vocab_gpt2(void) { check_vocab("ggml-vocab-gpt-2.gguf"); }
static void test_vocab_starcoder(void) { check_vocab("ggml-vocab-starcoder.gguf"); }

/* ------------------------------------------------------------------ */
/* stories260K: the same 512-token vocab from GGUF and llama2.c */

static const int32_t once_ids[] = {1, 403, 407, 261, 378};

static void check_once(kv_tokenizer *t) {
    int32_t ids[16];
    kv_err err = {0};
    const char *s = "Once upon a time";
    int n = kv_tokenizer_encode(t, s, strlen(s), 1, 0, ids, 16, &err);
    CHECKF(n == 5 && !memcmp(ids, once_ids, sizeof once_ids), "n=%d ids %d %d %d %d %d", n, ids[0], ids[1], ids[2],
           ids[3], ids[4]);
    char buf[64];
    int m = kv_tokenizer_decode(t, ids, n, 0, buf, sizeof buf);
    CHECKF(m == (int)strlen(s) && !strcmp(buf, s), "decode gave [%s]", buf);
    /* With specials rendered, BOS shows and the first word still loses its
     * dummy space (llama.cpp/llama2.c display rule). */
    m = kv_tokenizer_decode(t, ids, n, 1, buf, sizeof buf);
    CHECKF(!strcmp(buf, "<s>Once upon a time"), "decode+special gave [%s]", buf);
    CHECK(kv_tokenizer_bos(t) == 1 && kv_tokenizer_eos(t) == 2 && kv_tokenizer_add_bos(t) == 1);
    /* a generated BOS ends generation as well (it would open a new story) */
    CHECK(kv_tokenizer_is_eog(t, 2) && kv_tokenizer_is_eog(t, 1) && !kv_tokenizer_is_eog(t, 403));
    CHECK(kv_tokenizer_n_vocab(t) == 512);
    CHECK(kv_tokenizer_find(t, "\xE2\x96\x81" "Once") == 403);
    CHECK(kv_tokenizer_find(t, "<0x0A>") == 13);
    /* The generation continuation decodes to the README's text. */
    static const int32_t cont[] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
                                   410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394,
                                   261, 370, 432, 352};
    char out[512];
    m = kv_tokenizer_decode(t, cont, (int)KV_ARRAY_LEN(cont), 0, out, sizeof out);
    (void)m;
    CHECKF(strstr(out, "there was a little girl named Lily. She loved to play outside in the park.") != NULL,
           "continuation decoded to [%s]", out);
}

static void test_stories_gguf(void) {
    kv_tokenizer *t = load_gguf_tok("models/stories260K.gguf");
    REQUIRE(t);
    CHECK(kv_tokenizer_type(t) == KV_TOK_SPM);
    check_once(t);
    kv_tokenizer_free(t);
}

static void test_stories_llama2c(void) {
    kv_err err = {0};
    kv_tokenizer *t = kv_tokenizer_from_llama2c(harness_shared_path("models/tok512.bin"), 512, &err);
    CHECKF(t, "%s", err.msg);
    REQUIRE(t);
    check_once(t);
    /* Same vocab as the GGUF: texts, scores and types agree token by token. */
    kv_tokenizer *g = load_gguf_tok("models/stories260K.gguf");
    REQUIRE(g);
    int bad = 0;
    for (int32_t i = 0; i < 512; i++) {
        if (strcmp(kv_tokenizer_token_text(t, i), kv_tokenizer_token_text(g, i)) ||
            kv_tokenizer_score(t, i) != kv_tokenizer_score(g, i) ||
            kv_tokenizer_token_type(t, i) != kv_tokenizer_token_type(g, i))
            bad++;
    }
    CHECKF(bad == 0, "%d tokens differ between tok512.bin and stories260K.gguf", bad);
    /* vocab_size <= 0 reads to the end of the file. */
    kv_tokenizer *t2 = kv_tokenizer_from_llama2c(harness_shared_path("models/tok512.bin"), 0, &err);
    CHECK(t2 && kv_tokenizer_n_vocab(t2) == 512);
    kv_tokenizer_free(t2);
    kv_tokenizer_free(g);
    kv_tokenizer_free(t);
}

/* The llama2.c export of Llama 2's vocab must tokenize exactly like the
 * GGUF export of it: a check of the llama2.c loader on 32k tokens. */
static void test_llama2c_32k_matches_gguf(void) {
    kv_err err = {0};
    kv_tokenizer *b = kv_tokenizer_from_llama2c(harness_shared_path("models/tokenizer_llama2_32k.bin"), 32000, &err);
    CHECKF(b, "%s", err.msg);
    kv_tokenizer *g = load_gguf_tok("vocab/ggml-vocab-llama-spm.gguf");
    vocab_cases *vc = malloc(sizeof *vc);
    if (!b || !g || !vc || load_cases("ggml-vocab-llama-spm.gguf", vc)) {
        CHECK(0);
        goto done;
    }
    int same_text = 0;
    for (int32_t i = 0; i < 32000; i++)
        same_text += !strcmp(kv_tokenizer_token_text(b, i), kv_tokenizer_token_text(g, i)) &&
                     kv_tokenizer_score(b, i) == kv_tokenizer_score(g, i);
    CHECKF(same_text == 32000, "%d/32000 tokens agree", same_text);
    int agree = 0;
    static int32_t x[1024], y[1024];
    for (int i = 0; i < vc->n; i++) {
        int nx = kv_tokenizer_encode(b, vc->text[i], vc->text_len[i], 1, 0, x, 1024, &err);
        int ny = kv_tokenizer_encode(g, vc->text[i], vc->text_len[i], 1, 0, y, 1024, &err);
        int ok = nx == ny && nx > 0 && !memcmp(x, y, (size_t)nx * sizeof *x) &&
                 nx - 1 == vc->n_ids[i] && !memcmp(x + 1, vc->ids[i], (size_t)(nx - 1) * sizeof *x);
        agree += ok;
        CHECKF(ok, "case %d differs (%d vs %d ids)", i, nx, ny);
    }
    printf("  tokenizer_llama2_32k.bin: %d/%d strings match the GGUF vocab and the reference\n", agree, vc->n);
    free_cases(vc);
done:
    free(vc);
    kv_tokenizer_free(b);
    kv_tokenizer_free(g);
}

/* ------------------------------------------------------------------ */
/* special tokens */

static void test_special_tokens(void) {
    kv_err err = {0};
    int32_t ids[64];
    kv_tokenizer *t = load_gguf_tok("vocab/ggml-vocab-gpt-2.gguf");
    REQUIRE(t);
    const char *s = "Hi<|endoftext|>there";
    int n = kv_tokenizer_encode(t, s, strlen(s), 0, 1, ids, 64, &err);
    CHECKF(n == 3 && ids[1] == 50256, "parse_special: n=%d", n);
    int n2 = kv_tokenizer_encode(t, s, strlen(s), 0, 0, ids, 64, &err);
    CHECK(n2 > 3);
    for (int i = 0; i < n2; i++) CHECK(ids[i] != 50256);
    CHECK(kv_tokenizer_is_eog(t, 50256));
    CHECK(kv_tokenizer_add_bos(t) == 0);
    /* Control tokens decode to nothing unless asked. */
    char buf[64];
    CHECK(kv_tokenizer_piece(t, 50256, 0, buf, sizeof buf) == 0);
    CHECK(kv_tokenizer_piece(t, 50256, 1, buf, sizeof buf) == 13 && !memcmp(buf, "<|endoftext|>", 13));
    kv_tokenizer_free(t);

    t = load_gguf_tok("vocab/ggml-vocab-llama-spm.gguf");
    REQUIRE(t);
    /* "<s>" parsed is BOS; the text after a special gets the dummy prefix. */
    s = "<s>Hello</s>";
    n = kv_tokenizer_encode(t, s, strlen(s), 0, 1, ids, 64, &err);
    CHECKF(n == 3 && ids[0] == 1 && ids[1] == kv_tokenizer_find(t, "\xE2\x96\x81Hello") && ids[2] == 2, "n=%d", n);
    n = kv_tokenizer_encode(t, s, strlen(s), 0, 0, ids, 64, &err);
    CHECK(n > 3 && ids[0] != 1);
    kv_tokenizer_free(t);

    t = load_gguf_tok("vocab/ggml-vocab-starcoder.gguf");
    REQUIRE(t);
    s = "<fim_prefix>def f():<fim_suffix>";
    n = kv_tokenizer_encode(t, s, strlen(s), 0, 1, ids, 64, &err);
    CHECK(n >= 3 && ids[0] == 1 && ids[n - 1] == 3);
    kv_tokenizer_free(t);

    /* Phi-3's </s> is user-defined: matched even without parse_special. */
    t = load_gguf_tok("vocab/ggml-vocab-phi-3.gguf");
    REQUIRE(t);
    s = "a</s>";
    n = kv_tokenizer_encode(t, s, strlen(s), 0, 0, ids, 64, &err);
    CHECK(n == 2 && ids[1] == 2);
    CHECK(kv_tokenizer_is_eog(t, kv_tokenizer_find(t, "<|end|>")));
    CHECK(kv_tokenizer_is_eog(t, 32000));
    kv_tokenizer_free(t);
}

/* SmolLM2 (fetched by `make models`; skipped when absent). */
static void test_smollm2(void) {
    if (!harness_present(TEST_SMOLLM2, "run make models")) return;
    kv_err err = {0};
    kv_tokenizer *t = test_gguf_tokenizer(TEST_SMOLLM2, &err);
    CHECKF(t, "%s", err.msg);
    REQUIRE(t);
    CHECK(kv_tokenizer_n_vocab(t) == 49152);
    CHECK(!strcmp(kv_tokenizer_pre(t), "smollm"));
    int32_t ims = kv_tokenizer_find(t, "<|im_start|>"), ime = kv_tokenizer_find(t, "<|im_end|>");
    CHECK(ims >= 0 && ime >= 0 && kv_tokenizer_is_eog(t, ime));
    const char *s = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n";
    int32_t ids[64];
    int n = kv_tokenizer_encode(t, s, strlen(s), 0, 1, ids, 64, &err);
    /* <|im_start|> user \n What _is _the _capital _of _France ? <|im_end|> \n */
    static const char *const want[] = {"<|im_start|>", "user", "\xC4\x8A", "What", "\xC4\xA0is", "\xC4\xA0the",
                                       "\xC4\xA0" "capital", "\xC4\xA0of", "\xC4\xA0" "France", "?", "<|im_end|>",
                                       "\xC4\x8A"};
    CHECKF(n == (int)KV_ARRAY_LEN(want), "n=%d", n);
    for (int i = 0; i < n && i < (int)KV_ARRAY_LEN(want); i++)
        CHECKF(!strcmp(kv_tokenizer_token_text(t, ids[i]), want[i]), "token %d is [%s], want [%s]", i,
               kv_tokenizer_token_text(t, ids[i]), want[i]);
    CHECK(ids[0] == ims && ids[10] == ime);
    /* Without parse_special the markers are plain text. */
    n = kv_tokenizer_encode(t, s, strlen(s), 0, 0, ids, 64, &err);
    for (int i = 0; i < n; i++) CHECK(ids[i] != ims && ids[i] != ime);
    CHECK(kv_tokenizer_chat_template(t) != NULL);
    kv_tokenizer_free(t);
}

/* ------------------------------------------------------------------ */
/* pre-tokenizer splits. The expected pieces were produced with Python's
 * `regex` module from the pattern strings each pipeline implements. */

/* One line of tests/fixtures/tokenizer_splits.tsv (GENERATED by
 * tools/gen_split_cases.py): pipeline, text and the expected pieces joined
 * by \x01, tab-separated, with every byte outside printable ASCII (and the
 * backslash) written \xNN. Unescaped in place; 0 on a malformed line. */
typedef struct split_case {
    char *pre, *text, *pieces;
} split_case;

static int unescape(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        if (p[1] != 'x' || !isxdigit((unsigned char)p[2]) || !isxdigit((unsigned char)p[3])) return 0;
        char hex[3] = {p[2], p[3], 0};
        *o++ = (char)strtol(hex, NULL, 16);
        p += 3;
    }
    *o = 0;
    return 1;
}

static int split_case_parse(char *line, split_case *c) {
    line[strcspn(line, "\n")] = 0;
    char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
    if (!t2 || strchr(t2 + 1, '\t')) return 0;
    *t1 = *t2 = 0;
    *c = (split_case){line, t1 + 1, t2 + 1};
    return unescape(c->pre) && unescape(c->text) && unescape(c->pieces);
}

/* Builds a tiny byte-level BPE vocab (the 256 byte characters, no merges)
 * with the given pre-tokenizer, in memory. */
static kv_tokenizer *tiny_bpe(const char *pre) {
    static char texts[256][3];
    const char *strs[256];
    for (int b = 0, n = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)n++;
        char u[4];
        size_t k = kv_utf8_encode(cp, u);
        memcpy(texts[b], u, k);
        texts[b][k] = 0;
        strs[b] = texts[b];
    }
    const char *merges[] = {"a b"}; /* references tokens that exist; merged "ab" does not: skipped */
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_add_str(w, "general.architecture", "llama");
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    kv_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre);
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", strs, NULL, 256);
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 1);
    char path[128];
    snprintf(path, sizeof path, "/tmp/kvtop_test_tok_%d.gguf", (int)getpid());
    kv_err err = {0};
    kv_tokenizer *t = NULL;
    if (kv_gguf_writer_write(w, path, &err) == 0) {
        kv_gguf *g = kv_gguf_open(path, &err);
        if (g) t = kv_tokenizer_from_gguf(g, &err);
        kv_gguf_close(g);
    }
    if (!t) fprintf(stderr, "  tiny_bpe(%s): %s\n", pre, err.msg);
    remove(path);
    kv_gguf_writer_free(w);
    return t;
}

static void test_pretokenizer_splits(void) {
    FILE *f = fopen("tests/fixtures/tokenizer_splits.tsv", "r");
    REQUIRE(f);
    char cur[64] = "";
    kv_tokenizer *t = NULL;
    int pass = 0, total = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        split_case cs, *c = &cs;
        REQUIRE(split_case_parse(line, c));
        if (!t || strcmp(cur, c->pre)) {
            kv_tokenizer_free(t);
            t = tiny_bpe(c->pre);
            snprintf(cur, sizeof cur, "%.63s", c->pre);
        }
        REQUIRE(t);
        int32_t lens[256];
        kv_err err = {0};
        size_t n = strlen(c->text);
        int k = kv_tokenizer_split(t, c->text, n, 0, lens, 256, &err);
        char got[2048];
        size_t g = 0, off = 0;
        for (int j = 0; j < k && g + (size_t)lens[j] + 2 < sizeof got; j++) {
            if (j) got[g++] = '\x01';
            memcpy(got + g, c->text + off, (size_t)lens[j]);
            g += (size_t)lens[j];
            off += (size_t)lens[j];
        }
        got[g] = 0;
        total++;
        int ok = !strcmp(got, c->pieces);
        pass += ok;
        CHECKF(ok, "pre %s: [%s]\n    got  [%s]\n    want [%s]", c->pre, c->text, got, c->pieces);
        /* With no merges every byte is its own token and decodes back. */
        int32_t ids[1024];
        char dec[1024];
        int m = kv_tokenizer_encode(t, c->text, n, 0, 0, ids, 1024, &err);
        CHECK(m == (int)n);
        int d = kv_tokenizer_decode(t, ids, m, 0, dec, sizeof dec);
        CHECK(d == (int)n && !memcmp(dec, c->text, n));
    }
    fclose(f);
    printf("  %d/%d pre-tokenizer splits match\n", pass, total);
    CHECKF(total >= 300, "only %d split cases read", total); /* the table has 360 */
    kv_tokenizer_free(t);
}

/* ------------------------------------------------------------------ */
/* round trips of arbitrary bytes, the streaming detokenizer */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void random_text(char *s, size_t n, int valid_utf8) {
    static const char *const bits[] = {"a", "the", " ", "  ", "\n", "\t", "é", "日本", "😀", "'s", "123", "!?",
                                       "\xE2\x80\x8D", "Ω", "ß", "\r\n", "<", "|>"};
    size_t i = 0;
    while (i < n) {
        if (!valid_utf8 && rnd() % 4 == 0) {
            s[i++] = (char)(rnd() & 0xFF);
            continue;
        }
        const char *b = bits[rnd() % KV_ARRAY_LEN(bits)];
        size_t l = strlen(b);
        if (i + l > n) break;
        memcpy(s + i, b, l);
        i += l;
    }
    while (i < n) s[i++] = 'x';
}

/* 1 when every byte of text can be represented: a BPE vocab may lack the
 * byte-level characters of bytes that never occur in UTF-8 (StarCoder has
 * no 0xC0, 0xC1, 0xF5..0xFF), and such bytes are dropped. */
static int representable(const kv_tokenizer *t, const char *text, size_t n) {
    if (kv_tokenizer_type(t) != KV_TOK_BPE) return 1;
    for (size_t i = 0; i < n; i++) {
        int b = (unsigned char)text[i], printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (!printable) continue; /* the remapped ones (U+0100..) are in every vocab here */
        char u[4] = {0};
        u[kv_utf8_encode((uint32_t)b, u)] = 0;
        if (kv_tokenizer_find(t, u) < 0) return 0;
    }
    return 1;
}

static void check_roundtrip(kv_tokenizer *t, const char *name, int valid_utf8) {
    int32_t *ids = malloc(4096 * sizeof *ids);
    char text[1024], dec[4096], stream[4096];
    REQUIRE(ids);
    int bad = 0, bad_stream = 0, bad_range = 0;
    for (int it = 0; it < 300; it++) {
        size_t n = 1 + rnd() % 200;
        random_text(text, n, valid_utf8);
        if (kv_tokenizer_type(t) == KV_TOK_SPM && contains(text, n, "\xE2\x96\x81")) continue;
        if (!representable(t, text, n)) continue;
        kv_err err = {0};
        int m = kv_tokenizer_encode(t, text, n, 0, 0, ids, 4096, &err);
        if (m < 0 || m > 4096) {
            bad++;
            continue;
        }
        for (int i = 0; i < m; i++) bad_range += ids[i] < 0 || ids[i] >= kv_tokenizer_n_vocab(t);
        int d = kv_tokenizer_decode(t, ids, m, 0, dec, sizeof dec);
        if (d != (int)n || memcmp(dec, text, n)) {
            if (!bad++) {
                fprintf(stderr, "  %s: first failing text (%zu bytes):", name, n);
                for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)text[i]);
                fprintf(stderr, "\n  decoded (%d bytes):", d);
                for (int i = 0; i < d && i < (int)sizeof dec; i++) fprintf(stderr, " %02x", (unsigned char)dec[i]);
                fprintf(stderr, "\n");
            }
        }
        /* Streaming: every chunk is whole characters (for valid input), and
         * the chunks add up to the text. */
        kv_detok dt;
        kv_detok_init(&dt, t, KV_DETOK_AT_BOS);
        size_t s = 0;
        char chunk[1024];
        for (int i = 0; i < m; i++) {
            int c = kv_detok_push(t, &dt, ids[i], chunk, sizeof chunk);
            if (c < 0) {
                bad_stream++;
                break;
            }
            if (valid_utf8 && !kv_utf8_valid(chunk, (size_t)c)) bad_stream++;
            memcpy(stream + s, chunk, (size_t)c);
            s += (size_t)c;
        }
        s += (size_t)kv_detok_flush(t, &dt, stream + s, 8);
        if (s != n || memcmp(stream, text, n)) bad_stream++;
    }
    CHECKF(bad == 0, "%s: %d round trips failed", name, bad);
    CHECKF(bad_stream == 0, "%s: %d streamed decodes failed", name, bad_stream);
    CHECKF(bad_range == 0, "%s: %d ids out of range", name, bad_range);
    free(ids);
}

static void test_roundtrip_random(void) {
    const char *files[] = {"models/stories260K.gguf", "vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                           "vocab/ggml-vocab-starcoder.gguf"};
    for (size_t i = 0; i < KV_ARRAY_LEN(files); i++) {
        kv_tokenizer *t = load_gguf_tok(files[i]);
        REQUIRE(t);
        check_roundtrip(t, files[i], 1);
        check_roundtrip(t, files[i], 0);
        kv_tokenizer_free(t);
    }
}

static void test_detok_stream(void) {
    kv_tokenizer *t = load_gguf_tok("models/stories260K.gguf");
    REQUIRE(t);
    kv_err err = {0};
    /* "日" is not in the 512 vocab: byte fallback <0xE6> <0x97> <0xA5>. */
    const char *s = "Once 日";
    int32_t ids[32];
    int n = kv_tokenizer_encode(t, s, strlen(s), 1, 0, ids, 32, &err);
    REQUIRE(n >= 5);
    CHECK(ids[n - 3] == 3 + 0xE6 && ids[n - 2] == 3 + 0x97 && ids[n - 1] == 3 + 0xA5);
    kv_detok d;
    kv_detok_init(&d, t, 0);
    char out[64], all[64];
    size_t a = 0;
    int outs[32];
    for (int i = 0; i < n; i++) {
        outs[i] = kv_detok_push(t, &d, ids[i], out, sizeof out);
        REQUIRE(outs[i] >= 0);
        memcpy(all + a, out, (size_t)outs[i]);
        a += (size_t)outs[i];
    }
    all[a] = 0;
    CHECK(outs[0] == 0);                      /* BOS shows nothing */
    CHECK(outs[n - 3] == 0 && outs[n - 2] == 0); /* the start of "日" is held back */
    CHECK(outs[n - 1] == 3);                  /* and released whole */
    CHECKF(!strcmp(all, "Once 日"), "[%s]", all);
    CHECK(kv_detok_flush(t, &d, out, sizeof out) == 0);
    /* A stream that does not start at BOS keeps the dummy space. */
    kv_detok_init(&d, t, 0);
    int c = kv_detok_push(t, &d, 403, out, sizeof out);
    CHECK(c == 5 && !memcmp(out, " Once", 5));
    /* A sequence cut off at the end comes out on flush. */
    kv_detok_init(&d, t, 0);
    c = kv_detok_push(t, &d, 3 + 0xE6, out, sizeof out);
    CHECK(c == 0 && d.n_pending == 1);
    CHECK(kv_detok_flush(t, &d, out, sizeof out) == 1 && (unsigned char)out[0] == 0xE6);
    /* A buffer smaller than max_piece + 8 is refused without state change. */
    kv_detok_init(&d, t, 0);
    CHECK(kv_detok_push(t, &d, 403, out, 4) == KV_ERR_RANGE);
    CHECK(kv_detok_push(t, &d, 99999, out, sizeof out) == KV_ERR_RANGE);
    kv_tokenizer_free(t);
}

/* ------------------------------------------------------------------ */
/* bad input, buffer contract, speed */

static void test_bad_input(void) {
    kv_err err = {0};
    int32_t ids[4];
    CHECK(kv_tokenizer_encode(NULL, "a", 1, 0, 0, ids, 4, &err) == KV_ERR_INVAL);
    CHECK(kv_tokenizer_from_gguf(NULL, &err) == NULL && err.code == KV_ERR_INVAL);
    CHECK(kv_tokenizer_from_llama2c("/nonexistent/tok.bin", 512, &err) == NULL && err.code == KV_ERR_IO);
    kv_tokenizer_free(NULL);

    kv_tokenizer *t = load_gguf_tok("models/stories260K.gguf");
    REQUIRE(t);
    CHECK(kv_tokenizer_encode(t, NULL, 3, 0, 0, ids, 4, &err) == KV_ERR_INVAL);
    CHECK(kv_tokenizer_encode(t, "abc", 3, 0, 0, NULL, 4, &err) == KV_ERR_INVAL);
    CHECK(kv_tokenizer_encode(t, "abc", 3, 0, 0, ids, -1, &err) == KV_ERR_INVAL);
    CHECK(kv_tokenizer_encode(t, "", 0, 0, 0, ids, 4, &err) == 0);
    CHECK(kv_tokenizer_encode(t, "", 0, 1, 0, ids, 4, &err) == 1 && ids[0] == 1);
    /* Too small an output: the full count comes back, the prefix is right. */
    const char *s = "Once upon a time";
    int32_t few[2];
    CHECK(kv_tokenizer_encode(t, s, strlen(s), 1, 0, few, 2, &err) == 5 && few[0] == 1 && few[1] == 403);
    CHECK(kv_tokenizer_encode(t, s, strlen(s), 1, 0, NULL, 0, &err) == 5);
    char buf[8];
    CHECK(kv_tokenizer_piece(t, -1, 0, buf, sizeof buf) == KV_ERR_RANGE);
    CHECK(kv_tokenizer_piece(t, 512, 0, buf, sizeof buf) == KV_ERR_RANGE);
    CHECK(kv_tokenizer_piece(t, 403, 0, buf, 2) == 5 && buf[0] == ' ' && buf[1] == 'O');
    CHECK(kv_tokenizer_token_text(t, 512) == NULL);
    const int32_t bad_ids[] = {403, 600};
    CHECK(kv_tokenizer_decode(t, bad_ids, 2, 0, buf, sizeof buf) == KV_ERR_RANGE);
    /* decode reports the full length and NUL-terminates what fits. */
    CHECK(kv_tokenizer_decode(t, once_ids, 5, 0, buf, sizeof buf) == 16 && strlen(buf) == 7);
    kv_tokenizer_free(t);

    /* Truncated / corrupt llama2.c files are rejected with a message. */
    size_t n;
    char *bin = harness_read_file(harness_shared_path("models/tok512.bin"), &n);
    REQUIRE(bin);
    char path[128];
    snprintf(path, sizeof path, "/tmp/kvtop_test_tok_%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fwrite(bin, 1, n - 3, f);
    fclose(f);
    t = kv_tokenizer_from_llama2c(path, 512, &err);
    CHECKF(!t && err.code == KV_ERR_FORMAT && strstr(err.msg, "token 511"), "%s", err.msg);
    int32_t huge = 1 << 30;
    memcpy(bin + 4 + 4, &huge, 4); /* token 0's length */
    f = fopen(path, "wb");
    fwrite(bin, 1, n, f);
    fclose(f);
    t = kv_tokenizer_from_llama2c(path, 512, &err);
    CHECKF(!t && err.code == KV_ERR_FORMAT && strstr(err.msg, "token 0"), "%s", err.msg);
    remove(path);
    free(bin);

    /* GGUF without tokenizer keys, or with an unsupported model. */
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_add_str(w, "general.architecture", "llama");
    snprintf(path, sizeof path, "/tmp/kvtop_test_tok_%d.gguf", (int)getpid());
    REQUIRE(kv_gguf_writer_write(w, path, &err) == 0);
    kv_gguf *g = kv_gguf_open(path, &err);
    REQUIRE(g);
    CHECK(kv_tokenizer_from_gguf(g, &err) == NULL && err.code == KV_ERR_FORMAT &&
          strstr(err.msg, "tokenizer.ggml.model"));
    kv_gguf_close(g);
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "t5");
    REQUIRE(kv_gguf_writer_write(w, path, &err) == 0);
    g = kv_gguf_open(path, &err);
    REQUIRE(g);
    CHECK(kv_tokenizer_from_gguf(g, &err) == NULL && err.code == KV_ERR_UNSUPPORTED);
    kv_gguf_close(g);
    kv_gguf_writer_free(w);
    /* gpt2 without merges */
    w = kv_gguf_writer_new();
    const char *toks[] = {"a", "b"};
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 2);
    REQUIRE(kv_gguf_writer_write(w, path, &err) == 0);
    g = kv_gguf_open(path, &err);
    REQUIRE(g);
    CHECK(kv_tokenizer_from_gguf(g, &err) == NULL && err.code == KV_ERR_FORMAT && strstr(err.msg, "merges"));
    kv_gguf_close(g);
    kv_gguf_writer_free(w);
    /* scores of the wrong length */
    w = kv_gguf_writer_new();
    float sc[1] = {0};
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 2);
    kv_gguf_writer_add_arr(w, "tokenizer.ggml.scores", KV_GGUF_FLOAT32, sc, 1);
    REQUIRE(kv_gguf_writer_write(w, path, &err) == 0);
    g = kv_gguf_open(path, &err);
    REQUIRE(g);
    CHECK(kv_tokenizer_from_gguf(g, &err) == NULL && err.code == KV_ERR_FORMAT && strstr(err.msg, "scores"));
    kv_gguf_close(g);
    kv_gguf_writer_free(w);
    remove(path);
}

static void test_speed_10kb(void) {
    const char *files[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                           "vocab/ggml-vocab-starcoder.gguf", "models/stories260K.gguf"};
    size_t n = 10240;
    char *text = malloc(n);
    int32_t *ids = malloc(n * sizeof *ids);
    REQUIRE(text && ids);
    /* English-like text: words and punctuation. */
    static const char *const words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dog. ",
                                        "Once ", "upon ", "a ", "time, ", "there ", "was ", "1234 ", "naïve\n"};
    size_t i = 0;
    while (i < n) {
        const char *w = words[rnd() % KV_ARRAY_LEN(words)];
        size_t l = strlen(w);
        if (i + l > n) l = n - i;
        memcpy(text + i, w, l);
        i += l;
    }
    /* and one 10 KB run with no spaces (worst case for a single word). */
    char *run = malloc(n);
    REQUIRE(run);
    for (i = 0; i < n; i++) run[i] = "abcdefgh"[rnd() % 8];
    for (size_t f = 0; f < KV_ARRAY_LEN(files); f++) {
        kv_tokenizer *t = load_gguf_tok(files[f]);
        REQUIRE(t);
        kv_err err = {0};
        double t0 = kv_now_s();
        int m = kv_tokenizer_encode(t, text, n, 0, 0, ids, (int)n, &err);
        double t1 = kv_now_s();
        int m2 = kv_tokenizer_encode(t, run, n, 0, 0, ids, (int)n, &err);
        double t2 = kv_now_s();
        printf("  %s: 10 KB text -> %d tokens in %.2f ms; 10 KB single word -> %d tokens in %.2f ms\n", files[f], m,
               (t1 - t0) * 1e3, m2, (t2 - t1) * 1e3);
        CHECK(m > 0 && m2 > 0);
        /* Milliseconds, not seconds (generous for sanitizer builds). */
        CHECK(t1 - t0 < 0.25 && t2 - t1 < 0.25);
        kv_tokenizer_free(t);
    }
    FREE_ALL(run, text, ids);
}

static void test_unicode_classes(void) {
    CHECK(kv_unicode_flags('a') & KV_UCAT_LETTER);
    CHECK(kv_unicode_flags('7') & KV_UCAT_NUMBER);
    CHECK(kv_unicode_flags(' ') & KV_UCAT_WHITESPACE);
    CHECK(kv_unicode_flags(0x3000) & KV_UCAT_WHITESPACE);  /* ideographic space */
    CHECK(!(kv_unicode_flags(0x1C) & KV_UCAT_WHITESPACE)); /* not White_Space (isspace() says yes) */
    CHECK(kv_unicode_flags(0x65E5) & KV_UCAT_LETTER);      /* 日 */
    CHECK(kv_unicode_flags(0x0663) & KV_UCAT_NUMBER);      /* Arabic-Indic 3 */
    CHECK(kv_unicode_flags(0x2167) & KV_UCAT_NUMBER);      /* Roman numeral (Nl) */
    CHECK(kv_unicode_flags(0x1F600) & KV_UCAT_SYMBOL);     /* emoji */
    CHECK(kv_unicode_flags(0x0301) & KV_UCAT_MARK);
    CHECK(kv_unicode_flags(0x00BF) & KV_UCAT_PUNCT);
    CHECK(kv_unicode_flags(0x10FFFF) & KV_UCAT_UNDEFINED);
    uint32_t cp;
    const unsigned char overlong[] = {0xC0, 0xAF}, sur[] = {0xED, 0xA0, 0x80}, ok[] = {0xF0, 0x9F, 0x98, 0x80};
    CHECK(kv_utf8_decode(overlong, 2, &cp) == 1 && cp == KV_UTF8_INVALID);
    CHECK(kv_utf8_decode(sur, 3, &cp) == 1 && cp == KV_UTF8_INVALID);
    CHECK(kv_utf8_decode(ok, 4, &cp) == 4 && cp == 0x1F600);
    CHECK(kv_utf8_decode(ok, 3, &cp) == 1 && cp == KV_UTF8_INVALID);
    char u[4];
    CHECK(kv_utf8_encode(0x20AC, u) == 3 && (unsigned char)u[0] == 0xE2);
    CHECK(kv_utf8_encode(0xD800, u) == 0 && kv_utf8_encode(0x110000, u) == 0);
}

TEST_MAIN(T(test_unicode_classes), T(test_vocab_llama_spm), T(test_vocab_phi3), T(test_vocab_gpt2),
          T(test_vocab_starcoder), T(test_stories_gguf), T(test_stories_llama2c), T(test_llama2c_32k_matches_gguf),
          T(test_special_tokens), T(test_smollm2), T(test_pretokenizer_splits), T(test_roundtrip_random),
          T(test_detok_stream), T(test_bad_input), T(test_speed_10kb))
