/* tokenizer_wpm.c - WordPiece, GGUF tokenizer.ggml.model "bert": BERT's
 * normaliser and pre-tokenizer (drop control characters, decompose and
 * drop accents, lowercase; split at whitespace, and make each punctuation
 * mark, ASCII symbol and CJK ideograph a word of its own), then each word,
 * with "▁" in front (the GGUF spelling of a word start; BERT's "##" pieces
 * are stored bare), cut greedily into the longest vocab entries. A word
 * that cannot be cut, or is longer than BERT's 100 characters, is [UNK].
 * Lossy by design: decoding gives the normalised text back, not the input. */
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"
#include "tokenizer_internal.h"
#include "unicode.h"

/* BERT's max_input_chars_per_word: a longer word is one [UNK]. */
#define WPM_MAX_WORD_CHARS 100

/* BERT's CJK ideograph blocks (as its reference tokenizer lists them). */
static int wpm_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* One word being collected: "▁" then its normalised UTF-8. */
typedef struct wpm_word {
    char *buf;
    size_t cap, n; /* bytes */
    size_t chars;  /* code points after the "▁" */
} wpm_word;

/* Cuts the word into the longest vocab entries from the left; [UNK] when
 * some position matches nothing or the word is too long. */
static void wpm_flush(const kv_tokenizer *t, wpm_word *w, emitter *e) {
    if (w->chars == 0) return;
    int64_t start = e->n;
    size_t n = w->n;
    if (w->chars <= WPM_MAX_WORD_CHARS) {
        for (size_t i = 0; i < n;) {
            size_t j = i + (size_t)t->max_len < n ? i + (size_t)t->max_len : n;
            int32_t id = -1;
            for (; j > i && (id = tok_find_text(t, w->buf + i, j - i)) < 0; j--) {
            }
            if (id < 0) {
                e->n = start; /* the whole word is unknown */
                break;
            }
            emit(e, id);
            i = j;
        }
    }
    if (e->n == start && t->unk >= 0) emit(e, t->unk);
    w->n = 3;
    w->chars = 0;
}

static int wpm_put(wpm_word *w, uint32_t cp) {
    if (w->n + 4 > w->cap && kv_grow_size((void **)&w->buf, &w->cap, w->n + 4, 1)) return KV_ERR_NOMEM;
    w->n += kv_utf8_encode(cp, w->buf + w->n);
    w->chars++;
    return 0;
}

int wpm_encode(const kv_tokenizer *t, const char *s, size_t n, emitter *e) {
    wpm_word w = {NULL, 0, 3, 0};
    int rc = 0;
    if (kv_grow_size((void **)&w.buf, &w.cap, 64, 1)) return KV_ERR_NOMEM;
    memcpy(w.buf, SPM_SPACE, 3);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n && !passed(e);) {
        uint32_t cp;
        i += kv_utf8_decode(u + i, n - i, &cp);
        if (cp == KV_UTF8_INVALID || cp == 0 || cp == 0xFFFD) continue;
        if (t->wpm_strip) cp = kv_unicode_nfd_first(cp);
        unsigned fl = kv_unicode_flags(cp);
        if (fl & KV_UCAT_WHITESPACE) {
            wpm_flush(t, &w, e);
            continue;
        }
        if ((fl & KV_UCAT_CONTROL) || (t->wpm_strip && (fl & KV_UCAT_MARK))) continue;
        int alone = (fl & KV_UCAT_PUNCT) || (cp < 0x7F && (fl & KV_UCAT_SYMBOL)) || wpm_cjk(cp);
        if (alone) wpm_flush(t, &w, e);
        if ((rc = wpm_put(&w, t->wpm_lower ? kv_unicode_tolower(cp) : cp))) break;
        if (alone) wpm_flush(t, &w, e);
    }
    if (!rc && !passed(e)) wpm_flush(t, &w, e);
    free(w.buf);
    return rc;
}
