/* cmd_tokenize.c - `kvtop tokenize`: prints the token ids (or id/piece
 * pairs) of a text. Builds only the tokenizer, so vocab-only GGUF files
 * work, as do llama2.c tokenizer.bin files. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/gguf.h"
#include "../engine/model.h"
#include "../engine/tokenizer.h"
#include "../engine/unicode.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvtop tokenize -m MODEL [--tokenizer FILE] [options] (-p TEXT | -f FILE)\n"
            "  -m MODEL          GGUF file (a vocab-only file is enough) or llama2.c checkpoint\n"
            "  --tokenizer FILE  tokenizer to use instead of the model's: llama2.c tokenizer.bin or GGUF\n"
            "  -p TEXT           text to encode\n"
            "  -f FILE           encode the file's exact bytes (text: a NUL byte is refused, as by generate)\n"
            "  --no-bos          do not add BOS (default: as the vocabulary says)\n"
            "  --special         match special-token texts such as <|im_start|> (parse_special)\n"
            "  --pieces          print one \"id<TAB>piece\" line per token instead of one line of ids\n"
            "  --split SEP       the input is several texts separated by SEP (\\n, \\t and \\\\ are escapes):\n"
            "                    one line of ids per text (with --pieces, an empty line after each text)\n");
}

/* SEP with the escapes \n, \t and \\ replaced, written to out (at least
 * strlen(sep) + 1 bytes). Returns its length, or -1 for an empty SEP or an
 * unknown escape. */
static long unescape_sep(const char *sep, char *out) {
    size_t n = 0;
    for (const char *p = sep; *p; p++) {
        if (*p != '\\') {
            out[n++] = *p;
            continue;
        }
        p++;
        if (*p == 'n') out[n++] = '\n';
        else if (*p == 't') out[n++] = '\t';
        else if (*p == '\\') out[n++] = '\\';
        else return -1;
    }
    out[n] = 0;
    return n ? (long)n : -1;
}

/* vocab_size from a llama2.c checkpoint header (7 int32: dim, hidden_dim,
 * n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size
 * marks an unshared classifier). 0 when the header is not readable. */
static int llama2c_vocab(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t h[7];
    size_t n = fread(h, sizeof h[0], 7, f);
    fclose(f);
    if (n != 7 || h[5] == INT32_MIN) return 0;
    int v = h[5] < 0 ? -h[5] : h[5];
    return v <= (1 << 24) ? v : 0;
}

static kv_tokenizer *open_tokenizer(const char *model, const char *tok_path, kv_err *err) {
    const char *src = tok_path ? tok_path : model;
    int src_gguf = 0, model_gguf = 0;
    if (kv_model_probe_file(src, &src_gguf, err)) return NULL;
    if (model && src != model && kv_model_probe_file(model, &model_gguf, err)) return NULL;
    if (src_gguf) {
        kv_gguf *g = kv_gguf_open(src, err);
        if (!g) return NULL;
        kv_tokenizer *t = kv_tokenizer_from_gguf(g, err);
        kv_gguf_close(g);
        return t;
    }
    if (!tok_path) {
        kv_err_set(err, KV_ERR_INVAL, "%s is not a GGUF file; a llama2.c checkpoint needs --tokenizer FILE", src);
        return NULL;
    }
    /* The checkpoint's header says how many tokens to read; without a
     * readable one, read the tokenizer file to its end. */
    int vocab = (model && src != model && !model_gguf) ? llama2c_vocab(model) : 0;
    return kv_tokenizer_from_llama2c(tok_path, vocab, err);
}

/* Writes a piece so that it stays on one line and shows every byte:
 * control characters, backslash and bytes of invalid UTF-8 are escaped. */
static void print_piece(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = kv_utf8_decode(u + i, n - i, &cp);
        if (cp == KV_UTF8_INVALID) printf("\\x%02x", u[i]);
        else if (cp == '\n') fputs("\\n", stdout);
        else if (cp == '\t') fputs("\\t", stdout);
        else if (cp == '\r') fputs("\\r", stdout);
        else if (cp == '\\') fputs("\\\\", stdout);
        else if (cp < 0x20 || cp == 0x7F) printf("\\x%02x", u[i]);
        else fwrite(s + i, 1, k, stdout);
        i += k;
    }
}

/* Encodes one text and prints its ids (one line) or its id/piece lines.
 * 0, or a negative KV_ERR_* with err filled. */
static int print_text(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int special, int pieces,
                      kv_err *err) {
    int rc = 0;
    int32_t *ids = NULL;
    char *piece = NULL;
    int n = kv_tokenizer_encode(t, text, len, add_bos, special, NULL, 0, err);
    if (n < 0) return n;
    ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory for %d ids", n);
        goto done;
    }
    if ((rc = kv_tokenizer_encode(t, text, len, add_bos, special, ids, n, err)) != n) {
        if (rc >= 0) rc = kv_err_set(err, KV_ERR_INVAL, "the text encoded to %d ids, then to %d", n, rc);
        goto done;
    }
    rc = 0;
    if (pieces) {
        size_t cap = (size_t)kv_tokenizer_max_piece(t) + 1;
        piece = malloc(cap);
        if (!piece) {
            rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < n; i++) {
            int m = kv_tokenizer_piece(t, ids[i], 1, piece, cap);
            printf("%d\t", ids[i]);
            print_piece(piece, m > 0 ? (size_t)KV_MIN((size_t)m, cap) : 0);
            putchar('\n');
        }
    } else {
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    }
done:
    free(piece);
    free(ids);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *tok_path = NULL, *text = NULL, *file = NULL, *split = NULL;
    int no_bos = 0, special = 0, pieces = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) bad = cli_str(argc, argv, &i, &model);
        else if (!strcmp(a, "--tokenizer")) bad = cli_str(argc, argv, &i, &tok_path);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) bad = cli_str(argc, argv, &i, &text);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) bad = cli_str(argc, argv, &i, &file);
        else if (!strcmp(a, "--split")) bad = cli_str(argc, argv, &i, &split);
        else if (!strcmp(a, "--no-bos")) no_bos = 1;
        else if (!strcmp(a, "--special")) special = 1;
        else if (!strcmp(a, "--pieces")) pieces = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvtop tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if ((!model && !tok_path) || (!text == !file)) {
        fprintf(stderr, "kvtop tokenize: need -m MODEL (or --tokenizer FILE) and exactly one of -p, -f\n");
        usage(stderr);
        return 2;
    }
    char *sep = split ? malloc(strlen(split) + 1) : NULL;
    long sep_len = 0;
    if (split && (!sep || (sep_len = unescape_sep(split, sep)) < 0)) {
        fprintf(stderr, "kvtop tokenize: --split needs a non-empty separator (escapes: \\n \\t \\\\)\n");
        free(sep);
        return 2;
    }

    int rc = 1;
    kv_err err = {0};
    char *buf = NULL;
    size_t len;
    kv_tokenizer *t = open_tokenizer(model, tok_path, &err);
    if (!t) goto fail;
    if (kv_tokenizer_warning(t)[0]) fprintf(stderr, "kvtop tokenize: note: %s\n", kv_tokenizer_warning(t));
    if (file) {
        buf = cli_read_prompt(file, &len, &err); /* refuses a NUL byte, as generate -f does */
        if (!buf) goto fail;
        text = buf;
    } else {
        len = strlen(text);
    }
    int add_bos = !no_bos && kv_tokenizer_add_bos(t);
    for (size_t at = 0;;) {
        const char *end = sep ? memmem(text + at, len - at, sep, (size_t)sep_len) : NULL;
        size_t n = end ? (size_t)(end - (text + at)) : len - at;
        if (print_text(t, text + at, n, add_bos, special, pieces, &err)) goto fail;
        if (sep && pieces) putchar('\n');
        if (!end) break;
        at += n + (size_t)sep_len;
    }
    if (fflush(stdout) != 0) {
        kv_err_set(&err, KV_ERR_IO, "writing the output failed");
        goto fail;
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "kvtop tokenize: %s\n", err.msg[0] ? err.msg : kv_err_str(err.code));
    free(sep);
    free(buf);
    kv_tokenizer_free(t);
    return rc;
}
