/* tokenizer_load.c - building a tokenizer: from a GGUF file's tokenizer.*
 * metadata (SentencePiece "llama", BPE "gpt2" or "gemma4" with merges,
 * WordPiece "bert") or
 * from a llama2.c tokenizer.bin, then the indexes every lookup uses (text
 * hash, merges, special tokens grouped by first byte, byte tokens, the
 * end-of-generation set). A load leaves a complete tokenizer or frees
 * everything. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/file.h"
#include "tokenizer_internal.h"
#include "unicode.h"

/* Texts of tokens that end a turn in common chat formats (llama.cpp's EOG
 * list). */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>",
    "<end_of_utterance>", "<|end_of_text|>", "<turn|>", "<eos>", "<|tool_response>", "<|END_OF_TURN_TOKEN|>",
};

/* ------------------------------------------------------------------ */
/* Byte-level BPE's byte <-> character map (GPT-2's bytes_to_unicode):
 * printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in
 * byte order, so every byte has a visible, non-space character. */

static int bytelevel_printable(int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static uint32_t byte_to_cp(int b) {
    if (bytelevel_printable(b)) return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!bytelevel_printable(i)) n++;
    return 256u + (uint32_t)n;
}

/* Inverse map: the byte for code point cp, or -1 when cp is not one of the
 * 256 byte-level characters. */
static int cp_to_byte(uint32_t cp) {
    if (cp < 256) return bytelevel_printable((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    int n = (int)(cp - 256);
    for (int b = 0; b < 256; b++)
        if (!bytelevel_printable(b) && n-- == 0) return b;
    return -1;
}
static void bytelevel_build(bytelevel_tab *bt) {
    for (int b = 0; b < 256; b++) {
        char tmp[4];
        size_t n = kv_utf8_encode(byte_to_cp(b), tmp);
        bt->n[b] = (uint8_t)n;
        memcpy(bt->utf8[b], tmp, n);
    }
    for (uint32_t cp = 0; cp < 324; cp++) bt->back[cp] = (int16_t)cp_to_byte(cp);
}

/* ------------------------------------------------------------------ */
/* Construction. A builder collects texts, scores and types; finish() builds
 * every index and leaves a complete tokenizer or frees everything. */

static kv_tokenizer *tok_alloc(int n_vocab, size_t pool_bytes, kv_err *err) {
    kv_tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto fail;
    t->n_vocab = n_vocab;
    t->pool = malloc(pool_bytes ? pool_bytes : 1);
    t->off = malloc((size_t)n_vocab * sizeof *t->off);
    t->len = malloc((size_t)n_vocab * sizeof *t->len);
    t->scores = calloc((size_t)n_vocab, sizeof *t->scores);
    t->ttype = malloc((size_t)n_vocab);
    t->eog = calloc((size_t)n_vocab, 1);
    t->byteval = calloc((size_t)n_vocab, 1);
    if (!t->pool || !t->off || !t->len || !t->scores || !t->ttype || !t->eog || !t->byteval) goto fail;
    memset(t->ttype, KV_TOKEN_NORMAL, (size_t)n_vocab);
    t->bos = t->eos = t->unk = t->eot = t->eom = -1;
    return t;
fail:
    kv_tokenizer_free(t);
    kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory for %d tokens", n_vocab);
    return NULL;
}

void kv_tokenizer_free(kv_tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->scores);
    free(t->ttype);
    free(t->eog);
    free(t->byteval);
    free(t->hash);
    free(t->mkey);
    free(t->mrank);
    free(t->mid);
    free(t->spec);
    free(t->chat_template);
    free(t);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* 1 and the byte when text is exactly "<0xNN>". */
static int parse_byte_token(const char *s, size_t n, int *b) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return 0;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    if (hi < 0 || lo < 0) return 0;
    *b = hi * 16 + lo;
    return 1;
}

static int build_hash(kv_tokenizer *t, kv_err *err) {
    uint32_t cap = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->hash = malloc((size_t)cap * sizeof *t->hash);
    if (!t->hash) return kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory for the vocab index");
    memset(t->hash, 0xFF, (size_t)cap * sizeof *t->hash);
    t->hash_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n = t->len[id];
        if (n == 0) continue; /* an empty text can never be matched */
        const char *s = tok_text(t, id);
        uint32_t i = (uint32_t)hash_bytes(s, n) & t->hash_mask;
        for (;;) {
            int32_t o = t->hash[i];
            if (o < 0) {
                t->hash[i] = id;
                break;
            }
            if (t->len[o] == n && memcmp(tok_text(t, o), s, n) == 0) {
                t->hash[i] = id; /* duplicate text: the later id wins, as in llama.cpp */
                break;
            }
            i = (i + 1) & t->hash_mask;
        }
    }
    return 0;
}

static int cmp_spec(const void *a, const void *b, void *ctx) {
    const kv_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    unsigned char fx = (unsigned char)tok_text(t, x)[0], fy = (unsigned char)tok_text(t, y)[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (t->len[x] != t->len[y]) return t->len[x] > t->len[y] ? -1 : 1;
    return x < y ? -1 : (x > y);
}

static int build_specials(kv_tokenizer *t, kv_err *err) {
    int n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->ttype[id];
        if ((ty == KV_TOKEN_CONTROL || ty == KV_TOKEN_USER_DEFINED || ty == KV_TOKEN_UNKNOWN) && t->len[id] > 0)
            n++;
    }
    t->spec = malloc((size_t)(n ? n : 1) * sizeof *t->spec);
    if (!t->spec) return kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory for special tokens");
    n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t ty = t->ttype[id];
        if ((ty == KV_TOKEN_CONTROL || ty == KV_TOKEN_USER_DEFINED || ty == KV_TOKEN_UNKNOWN) && t->len[id] > 0)
            t->spec[n++] = id;
    }
    t->n_spec = n;
    qsort_r(t->spec, (size_t)n, sizeof *t->spec, cmp_spec, t);
    int j = 0;
    for (int b = 0; b < 256; b++) {
        t->spec_start[b] = (uint32_t)j;
        while (j < n && (unsigned char)tok_text(t, t->spec[j])[0] == b) j++;
    }
    t->spec_start[256] = (uint32_t)n;
    return 0;
}

/* Builds every index; on error the caller frees t. */
static int tok_finish(kv_tokenizer *t, kv_err *err) {
    int rc;
    if (t->type == KV_TOK_SPM) snprintf(t->kind, sizeof t->kind, "SentencePiece (%s)", t->model_name);
    else if (t->type == KV_TOK_WPM)
        snprintf(t->kind, sizeof t->kind, "WordPiece (%s%s%s)", t->model_name, t->wpm_lower ? ", lowercase" : "",
                 t->wpm_strip ? ", strip accents" : "");
    else if (t->raw_bpe)
        snprintf(t->kind, sizeof t->kind, "UTF-8 BPE, spaces as U+2581 (%s, pre gemma4)", t->model_name);
    else
        snprintf(t->kind, sizeof t->kind, "byte-level BPE (%s, pre %s)", t->model_name,
                 t->pre_name[0] ? t->pre_name : "default");
    t->max_len = 1;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((int)t->len[id] > t->max_len) t->max_len = (int)t->len[id];
    if ((rc = build_hash(t, err))) return rc;
    if ((rc = build_specials(t, err))) return rc;

    bytelevel_build(&t->bl);
    const bytelevel_tab *bt = &t->bl;
    for (int b = 0; b < 256; b++) {
        if (t->type == KV_TOK_WPM) {
            t->byte_tok[b] = -1; /* WordPiece drops whitespace and control bytes: no per-byte bound */
        } else if (t->type == KV_TOK_SPM || t->raw_bpe) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            int32_t id = tok_find_text(t, hex, 6);
            if (id < 0) {
                char one = (char)b;
                id = tok_find_text(t, &one, 1);
            }
            t->byte_tok[b] = id;
        } else {
            t->byte_tok[b] = tok_find_text(t, bt->utf8[b], bt->n[b]);
        }
    }
    t->no_drop = t->type == KV_TOK_SPM && t->unk >= 0;
    if (!t->no_drop) {
        t->no_drop = 1;
        for (int b = 0; b < 256; b++)
            if (t->byte_tok[b] < 0) t->no_drop = 0;
    }
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int b;
        if (t->ttype[id] == KV_TOKEN_BYTE && parse_byte_token(tok_text(t, id), t->len[id], &b))
            t->byteval[id] = (uint8_t)b;
        else if (t->ttype[id] == KV_TOKEN_BYTE)
            t->ttype[id] = KV_TOKEN_NORMAL; /* a "byte" token that names no byte decodes as text */
    }

    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    /* NOTE: a generated BOS ends generation too, as llama2.c's run.c does:
     * it opens a new document (SentencePiece <s>) or a new turn (ChatML's
     * <|im_start|> doubles as BOS), never a continuation of this one. */
    if (t->bos >= 0) t->eog[t->bos] = 1;
    for (size_t i = 0; i < KV_ARRAY_LEN(eog_texts); i++) {
        int32_t id = tok_find_text(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && t->ttype[id] != KV_TOKEN_NORMAL && id != t->bos) t->eog[id] = 1;
    }
    return 0;
}

static int32_t valid_id(const kv_tokenizer *t, int64_t v) {
    return (v >= 0 && v < t->n_vocab) ? (int32_t)v : -1;
}

/* Reads an optional token id key into *dst (absent: *dst kept). -1 and
 * uint32 / uint64 -1 mean "none" (*dst = -1); any other id outside the
 * vocabulary is refused, naming the key and the value, rather than the
 * token silently disappearing (a BOS that is never added, an EOS that
 * never ends generation). */
static int get_id(const kv_gguf *g, kv_tokenizer *t, const char *key, int32_t *dst, kv_err *err) {
    int64_t v;
    int rc = kv_gguf_get_i64(g, key, &v, err);
    if (rc == 1) return 0;
    if (rc < 0) {
        uint64_t u;
        if (kv_gguf_get_u64(g, key, &u, NULL) != 0) return rc; /* not an integer */
        kv_err_clear(err);
        if (u == UINT64_MAX) {
            *dst = -1;
            return 0;
        }
        return kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s = %llu is outside the vocabulary (ids 0..%d)", key,
                          (unsigned long long)u, t->n_vocab - 1);
    }
    if (v == -1 || v == (int64_t)UINT32_MAX) {
        *dst = -1;
        return 0;
    }
    if (v < 0 || v >= t->n_vocab)
        return kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s = %lld is outside the vocabulary (ids 0..%d)", key,
                          (long long)v, t->n_vocab - 1);
    *dst = (int32_t)v;
    return 0;
}

static int add_merges(kv_tokenizer *t, const kv_gguf *g, uint64_t n, kv_err *err) {
    const char *key = "tokenizer.ggml.merges";
    if (n > (uint64_t)INT32_MAX / 4)
        return kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s has too many entries (%llu)", key,
                          (unsigned long long)n);
    uint32_t cap = pow2_at_least(n * 2 + 1);
    char *tmp = malloc((size_t)t->max_len * 2 + 2);
    t->mkey = malloc((size_t)cap * sizeof *t->mkey);
    t->mrank = malloc((size_t)cap * sizeof *t->mrank);
    t->mid = malloc((size_t)cap * sizeof *t->mid);
    if (!tmp || !t->mkey || !t->mrank || !t->mid) {
        free(tmp);
        return kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory for %llu merges", (unsigned long long)n);
    }
    memset(t->mkey, 0xFF, (size_t)cap * sizeof *t->mkey);
    t->merge_mask = cap - 1;
    for (uint64_t r = 0; r < n; r++) {
        kv_gguf_str s = kv_gguf_arr_str(g, key, r);
        /* "left right": the separator is the first space after position 0. */
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            free(tmp);
            return kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s[%llu] is not \"left right\"", key,
                              (unsigned long long)r);
        }
        size_t nl = (size_t)(sp - s.data), nr = s.len - nl - 1;
        int32_t l = tok_find_text(t, s.data, nl), rr = tok_find_text(t, sp + 1, nr);
        if (l < 0 || rr < 0 || nl + nr > (size_t)t->max_len) continue; /* can never apply */
        memcpy(tmp, s.data, nl);
        memcpy(tmp + nl, sp + 1, nr);
        int32_t m = tok_find_text(t, tmp, nl + nr);
        if (m < 0) continue;
        uint64_t k = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rr;
        uint32_t i = (uint32_t)kv_hash_mix64(k) & t->merge_mask;
        while (t->mkey[i] != UINT64_MAX && t->mkey[i] != k) i = (i + 1) & t->merge_mask;
        if (t->mkey[i] == k) continue; /* a repeated pair keeps its first (best) rank */
        t->mkey[i] = k;
        t->mrank[i] = (int32_t)r;
        t->mid[i] = m;
        t->n_merges++;
    }
    free(tmp);
    return 0;
}

/* The special ids, the pre-tokenizer, the BOS and space-prefix flags and
 * the chat template from g's metadata (t->type set). 0 or an error. */
static int gguf_settings(kv_tokenizer *t, const kv_gguf *g, kv_err *err) {
    int rc;
    /* Special ids: SPM defaults follow SentencePiece's layout. */
    if (t->type == KV_TOK_SPM) {
        t->unk = valid_id(t, 0);
        t->bos = valid_id(t, 1);
        t->eos = valid_id(t, 2);
    } else if (t->type == KV_TOK_WPM) { /* BERT's layout: [UNK] 100, [CLS] 101 (the BOS) */
        t->unk = valid_id(t, 100);
        t->bos = valid_id(t, 101);
        if ((rc = get_id(g, t, "tokenizer.ggml.cls_token_id", &t->bos, err))) return rc;
    }
    if ((rc = get_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos, err)) ||
        (rc = get_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos, err)) ||
        (rc = get_id(g, t, "tokenizer.ggml.unknown_token_id", &t->unk, err)) ||
        (rc = get_id(g, t, "tokenizer.ggml.eot_token_id", &t->eot, err)) ||
        (rc = get_id(g, t, "tokenizer.ggml.eom_token_id", &t->eom, err)))
        return rc;

    kv_gguf_str pre = {0, NULL};
    rc = kv_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (rc < 0) return rc;
    snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)KV_MIN(pre.len, 63), pre.data ? pre.data : "");
    if (t->raw_bpe) snprintf(t->pre_name, sizeof t->pre_name, "gemma4"); /* the model fixes its splitting */
    t->pre = kv_pre_kind_from_name(t->pre_name);
    /* NOTE: an unknown pre name falls back to llama.cpp's default pipeline
     * rather than failing: the ids may then differ slightly from the
     * model's own tokenizer, but the text still round-trips. The front ends
     * say so (kv_tokenizer_warning); SentencePiece has no pre-tokenizer. */
    if (t->type == KV_TOK_BPE && !kv_pre_name_known(t->pre_name)) {
        if (t->pre_name[0])
            snprintf(t->warning, sizeof t->warning,
                     "tokenizer.ggml.pre '%s' is not a pre-tokenizer kvtop knows; using 'default' (token ids may "
                     "differ from the model's own tokenizer)",
                     t->pre_name);
        else
            snprintf(t->warning, sizeof t->warning,
                     "the GGUF has no tokenizer.ggml.pre; using the 'default' pre-tokenizer (token ids may differ "
                     "from the model's own tokenizer)");
    }

    t->add_bos = (t->type == KV_TOK_SPM) || t->pre == KV_PRE_LLAMA3 || t->raw_bpe;
    t->add_space_prefix = t->type == KV_TOK_SPM;
    t->ignore_merges = t->type == KV_TOK_BPE && t->pre == KV_PRE_LLAMA3 && strcmp(t->pre_name, "dbrx") &&
                       strcmp(t->pre_name, "smaug-bpe") && strcmp(t->pre_name, "chatglm-bpe");
    int bv;
    rc = kv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv, err);
    if (rc < 0) return rc;
    if (rc == 0) t->add_bos = bv || t->raw_bpe; /* Gemma 4 always starts with BOS, as llama.cpp does */
    rc = kv_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &bv, err);
    if (rc < 0) return rc;
    if (rc == 0 && t->type == KV_TOK_SPM) t->add_space_prefix = bv;
    if (t->type == KV_TOK_WPM) {
        t->add_bos = t->bos >= 0;
        t->wpm_lower = 1;
        rc = kv_gguf_get_bool(g, "tokenizer.ggml.normalizer.lowercase", &t->wpm_lower, err);
        if (rc < 0) return rc;
        t->wpm_strip = t->wpm_lower;
        rc = kv_gguf_get_bool(g, "tokenizer.ggml.normalizer.strip_accents", &t->wpm_strip, err);
        if (rc < 0) return rc;
    }
    if (t->add_bos && t->bos < 0) t->add_bos = 0;

    kv_gguf_str ct;
    rc = kv_gguf_get_str(g, "tokenizer.chat_template", &ct, err);
    if (rc < 0) return rc;
    if (rc == 0) {
        t->chat_template = malloc(ct.len + 1);
        if (!t->chat_template) return kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory for the chat template");
        memcpy(t->chat_template, ct.data, ct.len);
        t->chat_template[ct.len] = 0;
    }
    return 0;
}

kv_tokenizer *kv_tokenizer_from_gguf(const kv_gguf *g, kv_err *err) {
    kv_tokenizer *t = NULL;
    if (!g) {
        kv_err_set(err, KV_ERR_INVAL, "tokenizer: no GGUF handle");
        return NULL;
    }
    kv_gguf_str model;
    int rc = kv_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc == 1) {
        kv_err_set(err, KV_ERR_FORMAT, "tokenizer: GGUF has no tokenizer.ggml.model key");
        return NULL;
    }
    if (rc < 0) return NULL;
    kv_tok_type type;
    int raw_bpe = kv_gguf_str_eq(model, "gemma4");
    if (kv_gguf_str_eq(model, "llama")) type = KV_TOK_SPM;
    else if (kv_gguf_str_eq(model, "bert")) type = KV_TOK_WPM;
    else if (kv_gguf_str_eq(model, "gpt2") || raw_bpe) type = KV_TOK_BPE;
    else {
        kv_err_set(err, KV_ERR_UNSUPPORTED,
                   "tokenizer: tokenizer.ggml.model '%.*s' is not supported (want llama, gpt2, gemma4 or bert)",
                   (int)KV_MIN(model.len, 64), model.data);
        return NULL;
    }

    const char *kt = "tokenizer.ggml.tokens";
    kv_gguf_vtype et;
    uint64_t n;
    rc = kv_gguf_get_arr(g, kt, &et, &n, err);
    if (rc == 1) {
        kv_err_set(err, KV_ERR_FORMAT, "tokenizer: GGUF has no %s key", kt);
        return NULL;
    }
    if (rc < 0) return NULL;
    if (et != KV_GGUF_STRING || n == 0 || n > KV_TOK_MAX_VOCAB) {
        kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s must be a non-empty string array of at most %d entries (has %llu)",
                   kt, KV_TOK_MAX_VOCAB, (unsigned long long)n);
        return NULL;
    }
    uint64_t pool = 0;
    for (uint64_t i = 0; i < n; i++) pool += kv_gguf_arr_str(g, kt, i).len + 1;
    if (pool > UINT32_MAX) {
        kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s texts total %llu bytes (too many)", kt, (unsigned long long)pool);
        return NULL;
    }
    t = tok_alloc((int)n, (size_t)pool, err);
    if (!t) return NULL;
    t->type = type;
    t->raw_bpe = raw_bpe;
    snprintf(t->model_name, sizeof t->model_name, "%.*s", (int)KV_MIN(model.len, 31), model.data);
    uint32_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        kv_gguf_str s = kv_gguf_arr_str(g, kt, i);
        t->off[i] = o;
        t->len[i] = (uint32_t)s.len;
        if (s.len) memcpy(t->pool + o, s.data, s.len);
        o += (uint32_t)s.len;
        t->pool[o++] = 0;
    }

    uint64_t m;
    const char *ks = "tokenizer.ggml.scores";
    rc = kv_gguf_get_arr(g, ks, &et, &m, err);
    if (rc < 0) goto fail;
    if (rc == 0) {
        if ((et != KV_GGUF_FLOAT32 && et != KV_GGUF_FLOAT64) || m != n) {
            kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s must be %llu floats (has %llu of type %d)", ks,
                       (unsigned long long)n, (unsigned long long)m, (int)et);
            goto fail;
        }
        for (uint64_t i = 0; i < n; i++) t->scores[i] = (float)kv_gguf_arr_f64(g, ks, i);
    }
    const char *ky = "tokenizer.ggml.token_type";
    rc = kv_gguf_get_arr(g, ky, &et, &m, err);
    if (rc < 0) goto fail;
    if (rc == 0) {
        if (et == KV_GGUF_STRING || et == KV_GGUF_ARRAY || et == KV_GGUF_FLOAT32 || et == KV_GGUF_FLOAT64 || m != n) {
            kv_err_set(err, KV_ERR_FORMAT, "tokenizer: %s must be %llu integers (has %llu of type %d)", ky,
                       (unsigned long long)n, (unsigned long long)m, (int)et);
            goto fail;
        }
        for (uint64_t i = 0; i < n; i++) {
            int64_t v = kv_gguf_arr_i64(g, ky, i);
            t->ttype[i] = (uint8_t)((v >= KV_TOKEN_NORMAL && v <= KV_TOKEN_BYTE) ? v : KV_TOKEN_NORMAL);
        }
    }

    if (gguf_settings(t, g, err)) goto fail;
    if (tok_finish(t, err)) goto fail;
    if (type == KV_TOK_BPE) {
        const char *km = "tokenizer.ggml.merges";
        rc = kv_gguf_get_arr(g, km, &et, &m, err);
        if (rc < 0) goto fail;
        if (rc == 1 || et != KV_GGUF_STRING) {
            kv_err_set(err, KV_ERR_FORMAT, "tokenizer: a gpt2 tokenizer needs %s (a string array)", km);
            goto fail;
        }
        if (add_merges(t, g, m, err)) goto fail;
    }
    return t;
fail:
    kv_tokenizer_free(t);
    return NULL;
}

kv_tokenizer *kv_tokenizer_from_llama2c(const char *path, int vocab_size, kv_err *err) {
    kv_tokenizer *t = NULL;
    unsigned char *buf = NULL;
    if (!path) {
        kv_err_set(err, KV_ERR_INVAL, "tokenizer: no path");
        return NULL;
    }
    if (vocab_size > KV_TOK_MAX_VOCAB) {
        kv_err_set(err, KV_ERR_INVAL, "tokenizer: vocab_size %d is too large", vocab_size);
        return NULL;
    }
    char *raw;
    size_t fsz;
    int rc = kv_read_file(path, INT32_MAX, &raw, &fsz, err);
    if (rc == KV_ERR_FORMAT) kv_err_set(err, rc, "%s: more than %d bytes is too large for a tokenizer", path, INT32_MAX);
    if (rc) return NULL;
    buf = (unsigned char *)raw;

    /* Pass 1: validate and count. */
    size_t p = 4;
    int32_t max_len;
    if (fsz < 4) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: too short for a llama2.c tokenizer (%zu bytes)", path, fsz);
        goto fail;
    }
    memcpy(&max_len, buf, 4);
    if (max_len <= 0 || max_len > (1 << 20)) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: max_token_length %d is not plausible", path, (int)max_len);
        goto fail;
    }
    int count = 0;
    uint64_t pool = 0;
    while ((vocab_size > 0) ? count < vocab_size : p < fsz) {
        int32_t l;
        if (fsz - p < 8) {
            kv_err_set(err, KV_ERR_FORMAT, "%s: token %d: truncated header at byte %zu", path, count, p);
            goto fail;
        }
        memcpy(&l, buf + p + 4, 4);
        if (l < 0 || l > max_len * 4 + 16 || (size_t)l > fsz - p - 8) {
            kv_err_set(err, KV_ERR_FORMAT, "%s: token %d: bad length %d at byte %zu", path, count, (int)l, p + 4);
            goto fail;
        }
        p += 8 + (size_t)l;
        pool += (uint64_t)l * 3 + 8; /* a space becomes 3 bytes ("▁"); ids 0-2 get fixed texts */
        if (++count > KV_TOK_MAX_VOCAB) {
            kv_err_set(err, KV_ERR_FORMAT, "%s: more than %d tokens", path, KV_TOK_MAX_VOCAB);
            goto fail;
        }
    }
    if (count < 3) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: %d tokens; a llama2.c vocab has at least <unk>, <s>, </s>", path, count);
        goto fail;
    }
    t = tok_alloc(count, (size_t)pool, err);
    if (!t) goto fail;
    t->type = KV_TOK_SPM;
    snprintf(t->model_name, sizeof t->model_name, "llama2.c");
    t->unk = 0;
    t->bos = 1;
    t->eos = 2;
    t->add_bos = 1;
    t->add_space_prefix = 1;

    /* Pass 2: copy, undoing the export's edits (▁ -> space, BOS/EOS texts). */
    p = 4;
    uint32_t o = 0;
    for (int i = 0; i < count; i++) {
        float score;
        int32_t l;
        memcpy(&score, buf + p, 4);
        memcpy(&l, buf + p + 4, 4);
        const char *s = (const char *)buf + p + 8;
        p += 8 + (size_t)l;
        t->scores[i] = score;
        t->off[i] = o;
        int b;
        if (i == 0) {
            memcpy(t->pool + o, "<unk>", 5);
            o += 5;
            t->ttype[i] = KV_TOKEN_UNKNOWN;
        } else if (i == 1 || i == 2) {
            const char *c = i == 1 ? "<s>" : "</s>";
            memcpy(t->pool + o, c, strlen(c));
            o += (uint32_t)strlen(c);
            t->ttype[i] = KV_TOKEN_CONTROL;
        } else if (parse_byte_token(s, (size_t)l, &b)) {
            memcpy(t->pool + o, s, (size_t)l);
            o += (uint32_t)l;
            t->ttype[i] = KV_TOKEN_BYTE;
        } else {
            o += (uint32_t)tok_spm_escape(t->pool + o, s, (size_t)l);
        }
        t->len[i] = o - t->off[i];
        t->pool[o++] = 0;
    }
    free(buf);
    buf = NULL;
    if (tok_finish(t, err)) goto fail;
    return t;
fail:
    free(buf);
    kv_tokenizer_free(t);
    return NULL;
}
