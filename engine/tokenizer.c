/* tokenizer.c - SentencePiece-style and BPE encoding (byte-level, or over
 * raw UTF-8 for Gemma 4; BPE's words come from pretokenize.c; WordPiece is
 * tokenizer_wpm.c), special-token splitting, decoding and the streaming
 * detokenizer. The algorithms follow llama.cpp's so ids match
 * its reference outputs; see tokenizer.h for the contract. Loading is in
 * tokenizer_load.c, the struct in tokenizer_internal.h. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

/* ---- lookups ---- */

int32_t tok_find_text(const kv_tokenizer *t, const char *s, size_t n) {
    if (n == 0 || n > (size_t)t->max_len) return -1;
    uint32_t i = (uint32_t)hash_bytes(s, n) & t->hash_mask;
    for (;;) {
        int32_t id = t->hash[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return id;
        i = (i + 1) & t->hash_mask;
    }
}

/* Looks up merge (l, r): returns its rank and writes the merged id, or -1. */
static int32_t find_merge(const kv_tokenizer *t, int32_t l, int32_t r, int32_t *merged) {
    if (!t->mkey) return -1;
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint32_t i = (uint32_t)kv_hash_mix64(key) & t->merge_mask;
    for (;;) {
        uint64_t k = t->mkey[i];
        if (k == UINT64_MAX) return -1;
        if (k == key) {
            *merged = t->mid[i];
            return t->mrank[i];
        }
        i = (i + 1) & t->merge_mask;
    }
}

/* ------------------------------------------------------------------ */
/* Accessors. */

kv_tok_type kv_tokenizer_type(const kv_tokenizer *t) { return t ? t->type : (kv_tok_type)0; }
const char *kv_tokenizer_kind(const kv_tokenizer *t) { return t ? t->kind : ""; }
int kv_tokenizer_n_vocab(const kv_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t kv_tokenizer_bos(const kv_tokenizer *t) { return t ? t->bos : -1; }
int32_t kv_tokenizer_eos(const kv_tokenizer *t) { return t ? t->eos : -1; }
int32_t kv_tokenizer_unk(const kv_tokenizer *t) { return t ? t->unk : -1; }
int kv_tokenizer_add_bos(const kv_tokenizer *t) { return t ? t->add_bos : 0; }
int kv_tokenizer_add_space_prefix(const kv_tokenizer *t) { return t ? t->add_space_prefix : 0; }
const char *kv_tokenizer_pre(const kv_tokenizer *t) { return t ? t->pre_name : ""; }
const char *kv_tokenizer_model(const kv_tokenizer *t) { return t ? t->model_name : ""; }
const char *kv_tokenizer_chat_template(const kv_tokenizer *t) { return t ? t->chat_template : NULL; }
const char *kv_tokenizer_warning(const kv_tokenizer *t) { return t ? t->warning : ""; }
int kv_tokenizer_max_piece(const kv_tokenizer *t) { return t ? t->max_len : 0; }

int kv_tokenizer_is_eog(const kv_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}

const char *kv_tokenizer_token_text(const kv_tokenizer *t, int32_t id) {
    return (t && id >= 0 && id < t->n_vocab) ? tok_text(t, id) : NULL;
}

int kv_tokenizer_token_type(const kv_tokenizer *t, int32_t id) {
    return (t && id >= 0 && id < t->n_vocab) ? t->ttype[id] : 0;
}

float kv_tokenizer_score(const kv_tokenizer *t, int32_t id) {
    return (t && id >= 0 && id < t->n_vocab) ? t->scores[id] : 0.0f;
}

int32_t kv_tokenizer_find(const kv_tokenizer *t, const char *text) {
    if (!t || !text) return -1;
    return tok_find_text(t, text, strlen(text));
}

/* ------------------------------------------------------------------ */
/* Encoding. One workspace per call, sized from the input, holds every
 * scratch array, so the per-fragment and per-word loops never allocate. */

/* Whether the n bytes at s are sure to take e past its limit (and then
 * sets e->over): each id covers at most max_len bytes, so n bytes that are
 * never dropped need at least ceil(n / max_len) more ids. This is what
 * bounds the work on a huge text by the limit, not by its length. Only a
 * vocab that drops some bytes (no byte token, no <unk>) pays a scan for
 * the bytes it keeps. */
static int would_pass(const kv_tokenizer *t, emitter *e, const char *s, size_t n) {
    if (e->max <= 0 || e->over) return e->over;
    if (!t->no_drop) {
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) kept += t->byte_tok[(unsigned char)s[i]] >= 0;
        n = kept;
    }
    uint64_t least = ((uint64_t)n + (uint64_t)t->max_len - 1) / (uint64_t)t->max_len;
    if ((uint64_t)e->n + least > (uint64_t)e->max) e->over = 1;
    return e->over;
}


typedef struct spm_sym {
    int prev, next; /* neighbours in the current segmentation, -1 at the ends */
    uint32_t start; /* byte offset in the escaped text */
    uint32_t n;     /* bytes; 0 once merged into its left neighbour */
} spm_sym;

typedef struct spm_bigram {
    float score;
    int left, right;
    uint32_t size; /* bytes of the merged text, to detect stale entries */
} spm_bigram;

typedef struct bpe_sym {
    int prev, next;
    int32_t id; /* token of the current text, -1 if the vocab lacks it */
    uint32_t n; /* bytes of the raw word; 0 once merged */
} bpe_sym;

typedef struct bpe_bigram {
    int32_t rank;
    int left, right;
    int32_t lid, rid, merged; /* ids at push time, to detect stale entries */
} bpe_bigram;

typedef struct workspace {
    /* SPM */
    char *esc;           /* (3 * len + 3) text with spaces as "▁" */
    spm_sym *ssym;       /* (esc bytes) */
    spm_bigram *sheap;   /* (3 * esc bytes) */
    /* BPE */
    uint32_t *cp;        /* (len) code points; KV_UTF8_INVALID for a stray byte */
    uint16_t *fl;        /* (len) KV_UCAT_* flags */
    uint32_t *boff;      /* (len + 1) byte offset of each code point */
    size_t *pa, *pb;     /* (len + 1) piece lengths in code points, ping-pong between steps */
    bpe_sym *bsym;       /* (word_cap) */
    bpe_bigram *bheap;   /* (3 * word_cap) */
    char *word;          /* (2 * word_cap) byte-level form of one word */
    char *raw;           /* (word_cap) raw BPE: one word with its spaces as "▁" */
    size_t word_cap;     /* bytes of the longest word the three above hold */
} workspace;

static void ws_free(workspace *w) {
    free(w->esc);
    free(w->ssym);
    free(w->sheap);
    free(w->cp);
    free(w->fl);
    free(w->boff);
    free(w->pa);
    free(w->pb);
    free(w->bsym);
    free(w->bheap);
    free(w->word);
    free(w->raw);
}

static int ws_alloc(workspace *w, const kv_tokenizer *t, size_t len) {
    memset(w, 0, sizeof *w);
    size_t n = len + 1;
    if (t->type == KV_TOK_SPM) {
        size_t e = 3 * len + 4;
        w->esc = malloc(e);
        w->ssym = malloc(e * sizeof *w->ssym);
        w->sheap = malloc(3 * e * sizeof *w->sheap);
        if (!w->esc || !w->ssym || !w->sheap) return -1;
    } else if (t->type == KV_TOK_BPE) {
        w->cp = malloc(n * sizeof *w->cp);
        w->fl = malloc(n * sizeof *w->fl);
        w->boff = malloc((n + 1) * sizeof *w->boff);
        w->pa = malloc((n + 1) * sizeof *w->pa);
        w->pb = malloc((n + 1) * sizeof *w->pb);
        if (!w->cp || !w->fl || !w->boff || !w->pa || !w->pb) return -1;
    }
    return 0;
}

/* Makes the per-word arrays hold a word of n bytes. NOTE: sized by the
 * longest word seen rather than the whole text, so a long text of short
 * words does not pay 100 bytes of scratch per byte. 0 or -1. */
static int ws_word_reserve(workspace *w, size_t n) {
    if (n <= w->word_cap) return 0;
    free(w->bsym);
    free(w->bheap);
    free(w->word);
    free(w->raw);
    w->bsym = malloc(n * sizeof *w->bsym);
    w->bheap = malloc(3 * n * sizeof *w->bheap);
    w->word = malloc(2 * n);
    w->raw = malloc(n);
    w->word_cap = (w->bsym && w->bheap && w->word && w->raw) ? n : 0;
    return w->word_cap ? 0 : -1;
}

/* ---- the merge queue ---- */

/* The merge queue of both algorithms: a binary heap of bigrams whose top
 * is the pair BEFORE orders first, written once for the two element types
 * (a macro so the comparison inlines). PUSH(h, &n, v) adds v; POP(h, &n)
 * removes and returns the top (n > 0). */
#define BIGRAM_HEAP(T, BEFORE, PUSH, POP)                                   \
    static void PUSH(T *h, int *n, T v) {                                   \
        int i = (*n)++;                                                     \
        while (i > 0) {                                                     \
            int p = (i - 1) / 2;                                            \
            if (!BEFORE(&v, &h[p])) break;                                  \
            h[i] = h[p];                                                    \
            i = p;                                                          \
        }                                                                   \
        h[i] = v;                                                           \
    }                                                                       \
    static T POP(T *h, int *n) {                                            \
        T top = h[0], last = h[--(*n)];                                     \
        int i = 0;                                                          \
        for (;;) {                                                          \
            int c = 2 * i + 1;                                              \
            if (c >= *n) break;                                             \
            if (c + 1 < *n && BEFORE(&h[c + 1], &h[c])) c++;                \
            if (!BEFORE(&h[c], &last)) break;                               \
            h[i] = h[c];                                                    \
            i = c;                                                          \
        }                                                                   \
        if (*n > 0) h[i] = last;                                            \
        return top;                                                         \
    }

/* --- SentencePiece --- */

/* Max-heap on score; equal scores pop the leftmost pair first. */
static int spm_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

BIGRAM_HEAP(spm_bigram, spm_before, spm_push, spm_pop)

static void spm_try_bigram(const kv_tokenizer *t, workspace *w, int *nh, int left, int right) {
    if (left < 0 || right < 0) return;
    const spm_sym *l = &w->ssym[left], *r = &w->ssym[right];
    uint32_t size = l->n + r->n;
    int32_t id = tok_find_text(t, w->esc + l->start, size);
    if (id < 0) return;
    spm_bigram b = {t->scores[id], left, right, size};
    spm_push(w->sheap, nh, b);
}

/* Bytes of the character at s[0..n): a valid UTF-8 sequence, else 1.
 * NOTE: llama.cpp trusts the lead byte (so "\xF3" swallows the next three
 * bytes, even a following "▁"); a validated length gives the same symbols for
 * valid text and lets invalid bytes round-trip through byte fallback. */
static uint32_t spm_char_len(const char *s, size_t n) {
    uint32_t cp;
    return (uint32_t)kv_utf8_decode((const unsigned char *)s, n, &cp);
}

static void spm_encode(const kv_tokenizer *t, workspace *w, const char *text, size_t len, int prefix,
                       emitter *e) {
    size_t m = 0;
    if (prefix) {
        memcpy(w->esc, SPM_SPACE, 3);
        m = 3;
    }
    m += tok_spm_escape(w->esc + m, text, len);
    if (m == 0) return;
    int ns = 0;
    for (size_t off = 0; off < m;) {
        uint32_t n = spm_char_len(w->esc + off, m - off);
        spm_sym *s = &w->ssym[ns];
        s->start = (uint32_t)off;
        s->n = n;
        s->prev = ns - 1;
        off += n;
        s->next = off == m ? -1 : ns + 1;
        ns++;
    }
    int nh = 0;
    for (int i = 1; i < ns; i++) spm_try_bigram(t, w, &nh, i - 1, i);
    while (nh > 0) {
        spm_bigram b = spm_pop(w->sheap, &nh);
        spm_sym *l = &w->ssym[b.left], *r = &w->ssym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->ssym[r->next].prev = b.left;
        spm_try_bigram(t, w, &nh, l->prev, b.left);
        spm_try_bigram(t, w, &nh, b.left, l->next);
    }
    for (int i = 0; i != -1; i = w->ssym[i].next) {
        const spm_sym *s = &w->ssym[i];
        int32_t id = tok_find_text(t, w->esc + s->start, s->n);
        if (id >= 0) {
            emit(e, id);
            continue;
        }
        /* Not in the vocab (merged texts always are, so this is one
         * character): spell it as byte tokens. */
        for (uint32_t k = 0; k < s->n; k++) {
            int32_t bt = t->byte_tok[(unsigned char)w->esc[s->start + k]];
            if (bt < 0) bt = t->unk;
            if (bt >= 0) emit(e, bt);
        }
    }
}

/* --- byte-level BPE --- */

/* Min-heap on rank; equal ranks pop the leftmost pair first. */
static int bpe_before(const bpe_bigram *a, const bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

BIGRAM_HEAP(bpe_bigram, bpe_before, bpe_push, bpe_pop)

static void bpe_try_bigram(const kv_tokenizer *t, workspace *w, int *nh, int left, int right) {
    if (left < 0 || right < 0) return;
    int32_t l = w->bsym[left].id, r = w->bsym[right].id, m;
    if (l < 0 || r < 0) return;
    int32_t rank = find_merge(t, l, r, &m);
    if (rank < 0) return;
    bpe_bigram b = {rank, left, right, l, r, m};
    bpe_push(w->bheap, nh, b);
}

/* The initial symbols of a raw-UTF-8 word (Gemma 4): one per character,
 * with its token or -1. A word of newlines that is itself a token is one
 * symbol. Returns the symbol count. */
static size_t raw_symbols(const kv_tokenizer *t, workspace *w, const unsigned char *s, size_t n) {
    size_t nl = 0;
    while (nl < n && s[nl] == '\n') nl++;
    int32_t whole = nl == n ? tok_find_text(t, (const char *)s, n) : -1;
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = whole >= 0 ? n : kv_utf8_decode(s + i, n - i, &c);
        bpe_sym *y = &w->bsym[ns];
        y->prev = (int)ns - 1;
        y->id = whole >= 0 ? whole : tok_find_text(t, (const char *)s + i, k);
        y->n = (uint32_t)k;
        i += k;
        y->next = i == n ? -1 : (int)ns + 1;
        ns++;
    }
    return ns;
}

static void bpe_word(const kv_tokenizer *t, workspace *w, const unsigned char *s, size_t n, emitter *e) {
    if (n == 0) return;
    if (t->ignore_merges) {
        const bytelevel_tab *bt = &t->bl;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->word + m, bt->utf8[s[i]], bt->n[s[i]]);
            m += bt->n[s[i]];
        }
        int32_t id = tok_find_text(t, w->word, m);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    /* Byte-level: every byte is one byte-level character, so the initial
     * symbols are the bytes and their ids come from a table. */
    size_t ns = n;
    if (t->raw_bpe) {
        ns = raw_symbols(t, w, s, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            bpe_sym *y = &w->bsym[i];
            y->prev = (int)i - 1;
            y->next = i + 1 == n ? -1 : (int)i + 1;
            y->id = t->byte_tok[s[i]];
            y->n = 1;
        }
    }
    int nh = 0;
    for (size_t i = 1; i < ns; i++) bpe_try_bigram(t, w, &nh, (int)i - 1, (int)i);
    while (nh > 0) {
        bpe_bigram b = bpe_pop(w->bheap, &nh);
        bpe_sym *l = &w->bsym[b.left], *r = &w->bsym[b.right];
        if (l->n == 0 || r->n == 0 || l->id != b.lid || r->id != b.rid) continue; /* stale */
        l->n += r->n;
        l->id = b.merged;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->bsym[r->next].prev = b.left;
        bpe_try_bigram(t, w, &nh, l->prev, b.left);
        bpe_try_bigram(t, w, &nh, b.left, l->next);
    }
    size_t at = 0; /* byte offset of symbol i in s */
    for (size_t i = 0; i < ns; i++) {
        const bpe_sym *y = &w->bsym[i];
        size_t len = y->n;
        /* merged symbols have n 0; their bytes belong to the left one */
        if (len && y->id >= 0) {
            emit(e, y->id);
        } else if (len) {
            /* A raw character missing from the vocab goes out as <0xNN>
             * byte tokens. NOTE: a byte with no token (a byte-level
             * character or <0xNN> the vocab lacks) is dropped, as llama.cpp
             * does; no real vocab lacks one. */
            for (size_t k = 0; k < len; k++)
                if (t->byte_tok[s[at + k]] >= 0) emit(e, t->byte_tok[s[at + k]]);
        }
        at += len;
    }
}

/* Encodes one fragment; with splits set, records each word's byte length
 * there instead (kv_tokenizer_split). Stops once e passes its limit.
 * Returns 0 or -1 (out of memory). */
static int bpe_encode(const kv_tokenizer *t, workspace *w, const char *text, size_t len, emitter *e,
                      emitter *splits) {
    const unsigned char *u = (const unsigned char *)text;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t k = kv_utf8_decode(u + i, len - i, &c);
        w->cp[n] = c;
        w->fl[n] = (uint16_t)kv_unicode_flags(c);
        w->boff[n] = (uint32_t)i;
        n++;
        i += k;
    }
    if (n == 0) return 0;
    w->boff[n] = (uint32_t)len;
    size_t *pieces;
    size_t np = kv_pretokenize(t->pre, w->cp, w->fl, n, w->pa, w->pb, &pieces);
    size_t c0 = 0;
    for (size_t i = 0; i < np; i++) {
        size_t c1 = c0 + pieces[i], wl = w->boff[c1] - w->boff[c0];
        if (splits) {
            emit(splits, (int32_t)wl);
        } else {
            const unsigned char *word = u + w->boff[c0];
            if (would_pass(t, e, (const char *)word, wl)) return 0;
            if (ws_word_reserve(w, t->raw_bpe ? 3 * wl : wl)) return -1;
            if (t->raw_bpe) { /* spaces become "▁" before the merges (Gemma 4's normaliser) */
                wl = tok_spm_escape(w->raw, (const char *)word, wl);
                word = (const unsigned char *)w->raw;
            }
            bpe_word(t, w, word, wl, e);
            if (passed(e)) return 0;
        }
        c0 = c1;
    }
    return 0;
}

/* --- special tokens and the public entry --- */

/* The ranges of a text where control-token texts are matched without
 * parse_special, walked forward as the scan goes. */
typedef struct span_set {
    const kv_tok_span *v; /* (n) ascending, disjoint */
    int n;
    int i;                /* first range that does not end before the scan position */
} span_set;

/* Whether [p, p + n) lies inside the union of s's ranges. p never goes
 * back between calls. */
static int spans_cover(span_set *s, size_t p, size_t n) {
    while (s->i < s->n && s->v[s->i].off + s->v[s->i].len <= p) s->i++;
    size_t at = p, end = p + n;
    for (int j = s->i; at < end; j++) {
        if (j >= s->n || s->v[j].off > at) return 0;
        at = s->v[j].off + s->v[j].len;
    }
    return 1;
}

/* Longest special token text at text[p] that may match there, or -1:
 * user-defined tokens always, control and unknown ones with parse_special
 * or inside one of the spans. */
static int32_t match_special(const kv_tokenizer *t, const char *text, size_t len, size_t p, int parse_special,
                             span_set *spans) {
    unsigned char b = (unsigned char)text[p];
    for (uint32_t j = t->spec_start[b]; j < t->spec_start[b + 1]; j++) {
        int32_t id = t->spec[j];
        int always = parse_special || t->ttype[id] == KV_TOKEN_USER_DEFINED;
        if (!always && spans->n == 0) continue;
        uint32_t n = t->len[id];
        if (n > len - p || memcmp(text + p, tok_text(t, id), n) != 0) continue;
        if (always || spans_cover(spans, p, n)) return id;
    }
    return -1;
}

static int encode_fragment(const kv_tokenizer *t, workspace *w, const char *s, size_t n, int prev_special,
                           emitter *e, emitter *splits) {
    if (!splits && would_pass(t, e, s, n)) return 0;
    if (t->type == KV_TOK_BPE) return bpe_encode(t, w, s, n, e, splits);
    int rc = 0;
    if (splits) emit(splits, (int32_t)n);
    else if (t->type == KV_TOK_WPM) rc = wpm_encode(t, s, n, e);
    else spm_encode(t, w, s, n, t->add_space_prefix && prev_special, e);
    passed(e);
    return rc ? -1 : 0;
}

static int check_spans(const kv_encode_opts *o, size_t len, kv_err *err) {
    if (o->n_special < 0 || (o->n_special > 0 && !o->special))
        return kv_err_set(err, KV_ERR_INVAL, "tokenizer: %d special ranges but no array", o->n_special);
    size_t prev_end = 0;
    for (int i = 0; i < o->n_special; i++) {
        const kv_tok_span *r = &o->special[i];
        if (r->off < prev_end || r->off > len || r->len > len - r->off)
            return kv_err_set(err, KV_ERR_INVAL,
                              "tokenizer: special range %d (%zu + %zu) is out of order or past the text's %zu bytes", i,
                              r->off, r->len, len);
        prev_end = r->off + r->len;
    }
    return 0;
}

static int encode_impl(const kv_tokenizer *t, const char *text, size_t len, const kv_encode_opts *o, int32_t *out,
                       int cap, emitter *splits, kv_err *err) {
    if (!t) return kv_err_set(err, KV_ERR_INVAL, "tokenizer: NULL handle");
    if ((!text && len) || cap < 0 || (!out && cap > 0) || o->max_tokens < 0)
        return kv_err_set(err, KV_ERR_INVAL,
                          "tokenizer: bad encode arguments (text %p, len %zu, out %p, cap %d, max_tokens %d)",
                          (const void *)text, len, (void *)out, cap, o->max_tokens);
    int rc = check_spans(o, len, err);
    if (rc) return rc;
    if (o->add_bos && t->bos < 0)
        return kv_err_set(err, KV_ERR_INVAL, "tokenizer: add_bos requested but the vocab has no BOS");
    emitter e = {out, cap, 0, o->max_tokens, 0};
    if (o->add_bos) emit(&e, t->bos);
    if (passed(&e) || would_pass(t, &e, text, len))
        return kv_err_set(err, KV_ERR_RANGE, "tokenizer: the text is longer than %d tokens", o->max_tokens);
    if (len > (size_t)INT32_MAX / 4)
        return kv_err_set(err, KV_ERR_RANGE, "tokenizer: text of %zu bytes is too long to encode", len);
    if (len == 0) return (int)e.n;

    workspace w;
    if (ws_alloc(&w, t, len)) goto nomem;
    span_set spans = {o->special, o->n_special, 0};
    int prev_special = 1; /* SPM: the first fragment gets the dummy prefix */
    size_t frag = 0;
    for (size_t p = 0; p < len && !e.over;) {
        int32_t id = t->n_spec ? match_special(t, text, len, p, o->parse_special, &spans) : -1;
        if (id < 0) {
            p++;
            continue;
        }
        if (p > frag) {
            if (encode_fragment(t, &w, text + frag, p - frag, prev_special, &e, splits)) goto nomem;
            if (e.over) break;
        }
        if (splits) emit(splits, (int32_t)t->len[id]);
        else emit(&e, id);
        passed(&e);
        prev_special = 1;
        p += t->len[id];
        frag = p;
    }
    if (!e.over && len > frag && encode_fragment(t, &w, text + frag, len - frag, prev_special, &e, splits))
        goto nomem;
    ws_free(&w);
    if (e.over) return kv_err_set(err, KV_ERR_RANGE, "tokenizer: the text is longer than %d tokens", o->max_tokens);
    int64_t total = splits ? splits->n : e.n;
    if (total > INT_MAX) return kv_err_set(err, KV_ERR_RANGE, "tokenizer: too many tokens (%lld)", (long long)total);
    return (int)total;
nomem:
    ws_free(&w);
    return kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
}

int kv_tokenizer_encode_ex(const kv_tokenizer *t, const char *text, size_t len, const kv_encode_opts *o,
                           int32_t *out, int cap, kv_err *err) {
    if (!o) return kv_err_set(err, KV_ERR_INVAL, "tokenizer: NULL encode options");
    return encode_impl(t, text, len, o, out, cap, NULL, err);
}

int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                        int32_t *out, int cap, kv_err *err) {
    kv_encode_opts o = {.add_bos = add_bos, .parse_special = parse_special};
    return encode_impl(t, text, len, &o, out, cap, NULL, err);
}

int kv_tokenizer_split(const kv_tokenizer *t, const char *text, size_t len, int parse_special, int32_t *lens,
                       int cap, kv_err *err) {
    if (cap < 0 || (!lens && cap > 0)) return kv_err_set(err, KV_ERR_INVAL, "tokenizer: bad split arguments");
    emitter splits = {lens, cap, 0, 0, 0};
    kv_encode_opts o = {.parse_special = parse_special};
    return encode_impl(t, text, len, &o, NULL, 0, &splits, err);
}

/* ------------------------------------------------------------------ */
/* Decoding. */

typedef struct sink {
    char *buf;
    size_t cap;
    size_t n;    /* bytes produced (may exceed cap) */
    size_t skip; /* leading bytes still to drop (the SPM dummy-prefix space) */
} sink;

static void put(sink *k, const char *s, size_t n) {
    if (k->skip) {
        size_t d = KV_MIN(k->skip, n);
        s += d;
        n -= d;
        k->skip -= d;
    }
    if (k->n < k->cap) memcpy(k->buf + k->n, s, KV_MIN(n, k->cap - k->n));
    k->n += n;
}

static void put_piece(const kv_tokenizer *t, int32_t id, int include_special, sink *k) {
    const char *s = tok_text(t, id);
    size_t n = t->len[id];
    switch (t->ttype[id]) {
    case KV_TOKEN_CONTROL:
    case KV_TOKEN_UNKNOWN:
        if (include_special) put(k, s, n);
        return;
    case KV_TOKEN_USER_DEFINED: put(k, s, n); return;
    case KV_TOKEN_UNUSED: return;
    case KV_TOKEN_BYTE: {
        char b = (char)t->byteval[id];
        put(k, &b, 1);
        return;
    }
    default: break;
    }
    if (t->type != KV_TOK_BPE || t->raw_bpe) { /* "▁" spaces: SPM, WordPiece, Gemma 4 */
        size_t run = 0;
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, SPM_SPACE, 3) == 0) {
                put(k, s + run, i - run);
                put(k, " ", 1);
                i += 3;
                run = i;
            } else {
                i++;
            }
        }
        put(k, s + run, n - run);
        return;
    }
    const bytelevel_tab *bt = &t->bl;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t m = kv_utf8_decode(u + i, n - i, &c);
        int b = c < 324 ? bt->back[c] : -1;
        if (b >= 0) {
            char ch = (char)b;
            put(k, &ch, 1);
        } else {
            put(k, s + i, m); /* not a byte-level character: keep it as written */
        }
        i += m;
    }
}

int kv_tokenizer_piece(const kv_tokenizer *t, int32_t id, int include_special, char *buf, size_t cap) {
    if (!t || id < 0 || id >= t->n_vocab) return KV_ERR_RANGE;
    if (!buf) cap = 0;
    sink k = {buf, cap, 0, 0};
    put_piece(t, id, include_special, &k);
    return (int)k.n;
}

/* The SPM dummy-prefix rule: when *strip is set and id's piece is not empty,
 * clear *strip and make the sink drop the piece's first byte if it is a
 * space. */
static void strip_leading_space(const kv_tokenizer *t, int32_t id, int include_special, int *strip, sink *k) {
    char first = 0;
    sink probe = {&first, 1, 0, 0};
    put_piece(t, id, include_special, &probe);
    if (probe.n == 0) return;
    *strip = 0;
    if (first == ' ') k->skip = 1;
}

int kv_tokenizer_decode(const kv_tokenizer *t, const int32_t *ids, int n, int include_special, char *buf,
                        size_t cap) {
    if (!t || n < 0 || (!ids && n > 0)) return KV_ERR_INVAL;
    if (!buf) cap = 0;
    sink k = {buf, cap ? cap - 1 : 0, 0, 0}; /* the last byte is kept for the NUL */
    int rule = t->type == KV_TOK_SPM && t->add_space_prefix;
    int strip = rule;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) return KV_ERR_RANGE;
        if (id == t->bos) strip = rule;
        else if (strip) strip_leading_space(t, id, include_special, &strip, &k);
        put_piece(t, id, include_special, &k);
    }
    if (k.n > INT_MAX) return KV_ERR_RANGE;
    if (buf && cap > 0) buf[KV_MIN(k.n, cap - 1)] = 0;
    return (int)k.n;
}

/* --- streaming detokenizer --- */

void kv_detok_init(kv_detok *d, const kv_tokenizer *t, int flags) {
    memset(d, 0, sizeof *d);
    d->include_special = (flags & KV_DETOK_SPECIAL) != 0;
    d->strip_bos_space = t && t->type == KV_TOK_SPM && t->add_space_prefix;
    d->after_bos = d->strip_bos_space && (flags & KV_DETOK_AT_BOS);
}

/* Bytes at the end of s[0..n) that start a UTF-8 sequence the rest of the
 * stream may still complete (0 when the tail is complete or hopeless). */
static size_t incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        int want = kv_utf8_seq_len(c);
        return (want >= 2 && (size_t)want > back) ? back : 0;
    }
    return 0;
}

int kv_detok_push(const kv_tokenizer *t, kv_detok *d, int32_t id, char *out, size_t cap) {
    if (!t || !d || !out || id < 0 || id >= t->n_vocab) return KV_ERR_RANGE;
    if (cap < (size_t)t->max_len + 8 || d->n_pending < 0 || d->n_pending > 3) return KV_ERR_RANGE;
    size_t np = (size_t)d->n_pending;
    memcpy(out, d->pending, np);
    sink k = {out + np, cap - np, 0, 0};
    if (id == t->bos) d->after_bos = d->strip_bos_space;
    else if (d->after_bos) strip_leading_space(t, id, d->include_special, &d->after_bos, &k);
    put_piece(t, id, d->include_special, &k);
    size_t n = np + k.n;
    size_t hold = incomplete_tail((const unsigned char *)out, n);
    memcpy(d->pending, out + n - hold, hold);
    d->n_pending = (int)hold;
    return (int)(n - hold);
}

int kv_detok_flush(const kv_tokenizer *t, kv_detok *d, char *out, size_t cap) {
    (void)t;
    if (!d || !out || d->n_pending < 0 || d->n_pending > 3 || cap < (size_t)d->n_pending) return KV_ERR_RANGE;
    int n = d->n_pending;
    memcpy(out, d->pending, (size_t)n);
    d->n_pending = 0;
    return n;
}
