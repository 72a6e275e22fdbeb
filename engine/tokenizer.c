/* tokenizer.c - SentencePiece-style and byte-level BPE tokenizers, the
 * GPT-2 family of pre-tokenizers (hand-written matchers over generated
 * Unicode classes, no regex library), special-token splitting, decoding and
 * the streaming detokenizer. The algorithms follow llama.cpp's so ids match
 * its reference outputs; see tokenizer.h for the contract. */
#include "tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

/* Pre-tokenizer pipelines (BPE). Each is a list of split steps applied in
 * turn, every step refining the pieces of the previous one, the way
 * llama.cpp applies its list of regexes. */
typedef enum pre_kind {
    PRE_DEFAULT,   /* llama.cpp's default: [\p{P}$+<=>^~|]+, GPT-2, \p{N}+, [0-9]{3} */
    PRE_GPT2,      /* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PRE_STARCODER, /* \p{N} (each digit alone), then GPT-2 (starcoder, smollm, ...) */
    PRE_LLAMA3,    /* Llama 3: (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    PRE_QWEN2,     /* as Llama 3 with \p{N} instead of \p{N}{1,3} */
    PRE_FALCON     /* [\p{P}$+<=>^~|`]+, GPT-2, [0-9]{3} */
} pre_kind;

typedef enum split_step {
    STEP_END = 0,
    STEP_GPT2,
    STEP_LLAMA3,      /* numbers in groups of up to 3 */
    STEP_QWEN2,       /* numbers one by one */
    STEP_EACH_NUMBER, /* \p{N} */
    STEP_NUMBER_RUNS, /* \p{N}+ */
    STEP_PUNCT_RUNS,  /* [\p{P}$+<=>^~|]+ */
    STEP_PUNCT_RUNS_BT, /* [\p{P}$+<=>^~|`]+ */
    STEP_DIGITS3      /* [0-9][0-9][0-9] */
} split_step;

static const split_step pre_steps[][5] = {
    [PRE_DEFAULT] = {STEP_PUNCT_RUNS, STEP_GPT2, STEP_NUMBER_RUNS, STEP_DIGITS3, STEP_END},
    [PRE_GPT2] = {STEP_GPT2, STEP_END},
    [PRE_STARCODER] = {STEP_EACH_NUMBER, STEP_GPT2, STEP_END},
    [PRE_LLAMA3] = {STEP_LLAMA3, STEP_END},
    [PRE_QWEN2] = {STEP_QWEN2, STEP_END},
    [PRE_FALCON] = {STEP_PUNCT_RUNS_BT, STEP_GPT2, STEP_DIGITS3, STEP_END},
};

/* tokenizer.ggml.pre names, as llama.cpp maps them. */
static const struct {
    const char *name;
    pre_kind kind;
} pre_names[] = {
    {"default", PRE_DEFAULT},       {"gpt-2", PRE_GPT2},          {"phi-2", PRE_GPT2},
    {"mpt", PRE_GPT2},              {"olmo", PRE_GPT2},           {"jais", PRE_GPT2},
    {"trillion", PRE_GPT2},         {"roberta-bpe", PRE_GPT2},    {"jina-es", PRE_GPT2},
    {"jina-de", PRE_GPT2},          {"jina-v1-en", PRE_GPT2},     {"jina-v2-es", PRE_GPT2},
    {"jina-v2-de", PRE_GPT2},       {"jina-v2-code", PRE_GPT2},   {"gigachat", PRE_GPT2},
    {"granite-docling", PRE_GPT2},  {"starcoder", PRE_STARCODER}, {"smollm", PRE_STARCODER},
    {"refact", PRE_STARCODER},      {"command-r", PRE_STARCODER}, {"codeshell", PRE_STARCODER},
    {"exaone", PRE_STARCODER},      {"minerva-7b", PRE_STARCODER}, {"llama3", PRE_LLAMA3},
    {"llama-v3", PRE_LLAMA3},       {"llama-bpe", PRE_LLAMA3},    {"falcon3", PRE_LLAMA3},
    {"falcon-h1", PRE_LLAMA3},      {"pixtral", PRE_LLAMA3},      {"midm-2.0", PRE_LLAMA3},
    {"lfm2", PRE_LLAMA3},           {"dbrx", PRE_LLAMA3},         {"smaug-bpe", PRE_LLAMA3},
    {"chatglm-bpe", PRE_LLAMA3},    {"qwen2", PRE_QWEN2},         {"deepseek-r1-qwen", PRE_QWEN2},
    {"megrez", PRE_QWEN2},          {"stablelm2", PRE_QWEN2},     {"hunyuan", PRE_QWEN2},
    {"falcon", PRE_FALCON},
};

/* Texts of tokens that end a turn in common chat formats (llama.cpp's EOG
 * list). */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
};

#define KV_TOK_MAX_VOCAB (1 << 24)
#define SPM_SPACE "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space */

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

/* Byte-level tables, part of each tokenizer so nothing global is built
 * lazily. */
typedef struct bytelevel_tab {
    char utf8[256][2];  /* UTF-8 of byte b's character (1 or 2 bytes) */
    uint8_t n[256];     /* its length */
    int16_t back[324];  /* code point -> byte, for cp < 324; -1 = none */
} bytelevel_tab;

static void bytelevel_build(bytelevel_tab *bt) {
    for (int b = 0; b < 256; b++) {
        char tmp[4];
        size_t n = kv_utf8_encode(byte_to_cp(b), tmp);
        bt->n[b] = (uint8_t)n;
        memcpy(bt->utf8[b], tmp, n);
    }
    for (uint32_t cp = 0; cp < 324; cp++) bt->back[cp] = (int16_t)cp_to_byte(cp);
}

struct kv_tokenizer {
    kv_tok_type type;
    int n_vocab;
    char *pool;         /* every token text, NUL-terminated, back to back */
    uint32_t *off;      /* (n_vocab) offset of token i's text in pool */
    uint32_t *len;      /* (n_vocab) bytes of token i's text */
    float *scores;      /* (n_vocab) SPM merge priority; zeros for BPE */
    uint8_t *ttype;     /* (n_vocab) KV_TOKEN_* */
    uint8_t *eog;       /* (n_vocab) 1 = ends generation */
    uint8_t *byteval;   /* (n_vocab) the byte an SPM <0xNN> token stands for */
    int max_len;        /* longest token text, bytes */

    int32_t *hash;      /* (hash_mask + 1) token ids by text, -1 = empty; open addressing */
    uint32_t hash_mask;

    /* BPE merges, keyed by (left id << 32 | right id). */
    uint64_t *mkey;     /* (merge_mask + 1) key, UINT64_MAX = empty */
    int32_t *mrank;     /* (merge_mask + 1) position in tokenizer.ggml.merges: lower merges first */
    int32_t *mid;       /* (merge_mask + 1) id of the merged token */
    uint32_t merge_mask;
    int n_merges;

    /* SPM: token used when byte b has to go through byte fallback.
     * BPE: token of byte b's byte-level character. -1 when the vocab has none. */
    int32_t byte_tok[256];

    /* Texts matched before BPE/SPM (control, user-defined, unknown types),
     * grouped by first byte, longest first within a group. */
    int32_t *spec;       /* (n_spec) token ids */
    int n_spec;
    uint32_t spec_start[257]; /* spec[spec_start[b] .. spec_start[b+1]) start with byte b */

    bytelevel_tab bl;    /* byte-level character map (used by BPE) */

    int32_t bos, eos, unk, eot, eom;
    int add_bos;
    int add_space_prefix;
    int ignore_merges;   /* Llama 3: a word that is itself a token skips the merges */
    pre_kind pre;
    char pre_name[64];
    char model_name[32];
    char kind[128];      /* kv_tokenizer_kind's text */
    char *chat_template; /* NULL when none */
};

/* ------------------------------------------------------------------ */
/* Hashing. */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static const char *tok_text(const kv_tokenizer *t, int32_t id) { return t->pool + t->off[id]; }

static int32_t find_text(const kv_tokenizer *t, const char *s, size_t n) {
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
    uint32_t i = (uint32_t)hash_u64(key) & t->merge_mask;
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
        if (t->type == KV_TOK_SPM) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            int32_t id = find_text(t, hex, 6);
            if (id < 0) {
                char one = (char)b;
                id = find_text(t, &one, 1);
            }
            t->byte_tok[b] = id;
        } else {
            t->byte_tok[b] = find_text(t, bt->utf8[b], bt->n[b]);
        }
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
        int32_t id = find_text(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && t->ttype[id] != KV_TOKEN_NORMAL && id != t->bos) t->eog[id] = 1;
    }
    return 0;
}

static int32_t valid_id(const kv_tokenizer *t, int64_t v) {
    return (v >= 0 && v < t->n_vocab) ? (int32_t)v : -1;
}

/* Reads an optional token id key; absent or out of range keeps *dst. */
static int get_id(const kv_gguf *g, kv_tokenizer *t, const char *key, int32_t *dst, kv_err *err) {
    int64_t v;
    int rc = kv_gguf_get_i64(g, key, &v, err);
    if (rc < 0) {
        uint64_t u;
        /* uint32 -1 ("none") does not fit some getters' signed range. */
        if (kv_gguf_get_u64(g, key, &u, NULL) == 0) {
            kv_err_clear(err);
            *dst = -1;
            return 0;
        }
        return rc;
    }
    if (rc == 0) *dst = valid_id(t, v);
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
        int32_t l = find_text(t, s.data, nl), rr = find_text(t, sp + 1, nr);
        if (l < 0 || rr < 0 || nl + nr > (size_t)t->max_len) continue; /* can never apply */
        memcpy(tmp, s.data, nl);
        memcpy(tmp + nl, sp + 1, nr);
        int32_t m = find_text(t, tmp, nl + nr);
        if (m < 0) continue;
        uint64_t k = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rr;
        uint32_t i = (uint32_t)hash_u64(k) & t->merge_mask;
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
    if (kv_gguf_str_eq(model, "llama")) type = KV_TOK_SPM;
    else if (kv_gguf_str_eq(model, "gpt2")) type = KV_TOK_BPE;
    else {
        kv_err_set(err, KV_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.model '%.*s' is not supported (want llama or gpt2)",
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

    /* Special ids: SPM defaults follow SentencePiece's layout. */
    if (type == KV_TOK_SPM) {
        t->unk = valid_id(t, 0);
        t->bos = valid_id(t, 1);
        t->eos = valid_id(t, 2);
    }
    if (get_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos, err) ||
        get_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos, err) ||
        get_id(g, t, "tokenizer.ggml.unknown_token_id", &t->unk, err) ||
        get_id(g, t, "tokenizer.ggml.eot_token_id", &t->eot, err) ||
        get_id(g, t, "tokenizer.ggml.eom_token_id", &t->eom, err))
        goto fail;

    kv_gguf_str pre = {0, NULL};
    rc = kv_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (rc < 0) goto fail;
    snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)KV_MIN(pre.len, 63), pre.data ? pre.data : "");
    t->pre = PRE_DEFAULT;
    for (size_t i = 0; i < KV_ARRAY_LEN(pre_names); i++)
        if (!strcmp(t->pre_name, pre_names[i].name)) t->pre = pre_names[i].kind;
    /* NOTE: an unknown pre name falls back to llama.cpp's default pipeline
     * rather than failing: the ids may then differ slightly from the
     * model's own tokenizer, but the text still round-trips. */

    t->add_bos = (type == KV_TOK_SPM) || t->pre == PRE_LLAMA3;
    t->add_space_prefix = type == KV_TOK_SPM;
    t->ignore_merges = type == KV_TOK_BPE && t->pre == PRE_LLAMA3 && strcmp(t->pre_name, "dbrx") &&
                       strcmp(t->pre_name, "smaug-bpe") && strcmp(t->pre_name, "chatglm-bpe");
    int bv;
    rc = kv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv, err);
    if (rc < 0) goto fail;
    if (rc == 0) t->add_bos = bv;
    rc = kv_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &bv, err);
    if (rc < 0) goto fail;
    if (rc == 0 && type == KV_TOK_SPM) t->add_space_prefix = bv;
    if (t->add_bos && t->bos < 0) t->add_bos = 0;

    kv_gguf_str ct;
    rc = kv_gguf_get_str(g, "tokenizer.chat_template", &ct, err);
    if (rc < 0) goto fail;
    if (rc == 0) {
        t->chat_template = malloc(ct.len + 1);
        if (!t->chat_template) {
            kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory for the chat template");
            goto fail;
        }
        memcpy(t->chat_template, ct.data, ct.len);
        t->chat_template[ct.len] = 0;
    }

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
    FILE *f = NULL;
    if (!path) {
        kv_err_set(err, KV_ERR_INVAL, "tokenizer: no path");
        return NULL;
    }
    if (vocab_size > KV_TOK_MAX_VOCAB) {
        kv_err_set(err, KV_ERR_INVAL, "tokenizer: vocab_size %d is too large", vocab_size);
        return NULL;
    }
    f = fopen(path, "rb");
    if (!f) {
        kv_err_set(err, KV_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        kv_err_set(err, KV_ERR_IO, "%s: cannot determine the file size", path);
        goto fail;
    }
    if (size > (long)INT32_MAX) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: %ld bytes is too large for a tokenizer", path, size);
        goto fail;
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        kv_err_set(err, KV_ERR_IO, "%s: read failed", path);
        goto fail;
    }
    fclose(f);
    f = NULL;

    /* Pass 1: validate and count. */
    size_t fsz = (size_t)size, p = 4;
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
            for (int32_t k = 0; k < l; k++) {
                if (s[k] == ' ') {
                    memcpy(t->pool + o, SPM_SPACE, 3);
                    o += 3;
                } else {
                    t->pool[o++] = s[k];
                }
            }
        }
        t->len[i] = o - t->off[i];
        t->pool[o++] = 0;
    }
    free(buf);
    buf = NULL;
    if (tok_finish(t, err)) goto fail;
    return t;
fail:
    if (f) fclose(f);
    free(buf);
    kv_tokenizer_free(t);
    return NULL;
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
    return find_text(t, text, strlen(text));
}

/* ------------------------------------------------------------------ */
/* Encoding. One workspace per call, sized from the input, holds every
 * scratch array, so the per-fragment and per-word loops never allocate. */

typedef struct emitter {
    int32_t *out;
    int64_t cap;
    int64_t n; /* ids produced so far (may exceed cap) */
} emitter;

static inline void emit(emitter *e, int32_t id) {
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
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
    bpe_sym *bsym;       /* (len) */
    bpe_bigram *bheap;   /* (3 * len) */
    char *word;          /* (2 * len) byte-level form of one word */
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
    } else {
        w->cp = malloc(n * sizeof *w->cp);
        w->fl = malloc(n * sizeof *w->fl);
        w->boff = malloc((n + 1) * sizeof *w->boff);
        w->pa = malloc((n + 1) * sizeof *w->pa);
        w->pb = malloc((n + 1) * sizeof *w->pb);
        w->bsym = malloc(n * sizeof *w->bsym);
        w->bheap = malloc(3 * n * sizeof *w->bheap);
        w->word = malloc(2 * n);
        if (!w->cp || !w->fl || !w->boff || !w->pa || !w->pb || !w->bsym || !w->bheap || !w->word) return -1;
    }
    return 0;
}

/* --- SentencePiece --- */

/* Max-heap on score; equal scores pop the leftmost pair first. */
static int spm_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void spm_push(spm_bigram *h, int *n, spm_bigram v) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!spm_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static spm_bigram spm_pop(spm_bigram *h, int *n) {
    spm_bigram top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && spm_before(&h[c + 1], &h[c])) c++;
        if (!spm_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void spm_try_bigram(const kv_tokenizer *t, workspace *w, int *nh, int left, int right) {
    if (left < 0 || right < 0) return;
    const spm_sym *l = &w->ssym[left], *r = &w->ssym[right];
    uint32_t size = l->n + r->n;
    int32_t id = find_text(t, w->esc + l->start, size);
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
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->esc + m, SPM_SPACE, 3);
            m += 3;
        } else {
            w->esc[m++] = text[i];
        }
    }
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
        int32_t id = find_text(t, w->esc + s->start, s->n);
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

/* --- pre-tokenizer split steps --- *
 * Each takes the code points [s, e) of one piece and appends the lengths of
 * the sub-pieces it splits it into (covering all of it) to out. */

#define CL(i) ((i) < e ? w->fl[i] : 0u)
#define IS_L(i) (CL(i) & KV_UCAT_LETTER)
#define IS_N(i) (CL(i) & KV_UCAT_NUMBER)
#define IS_WS(i) (CL(i) & KV_UCAT_WHITESPACE)
#define IS_OTHER(i) ((i) < e && !(w->fl[i] & (KV_UCAT_LETTER | KV_UCAT_NUMBER | KV_UCAT_WHITESPACE)))

static uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at p: returns the end, or 0. */
static size_t contraction(const workspace *w, size_t p, size_t e, int fold) {
    if (w->cp[p] != '\'' || p + 1 >= e) return 0;
    uint32_t a = fold ? ascii_lower(w->cp[p + 1]) : w->cp[p + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if (p + 2 >= e) return 0;
    uint32_t b = fold ? ascii_lower(w->cp[p + 2]) : w->cp[p + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
    return 0;
}

/* \s+(?!\S)|\s+ at p (a whitespace run of n): a run followed by more text
 * leaves its last character to prefix the next word. */
static size_t ws_run_end(size_t p, size_t n, size_t e) {
    if (n > 1 && p + n < e) return p + n - 1;
    return p + (n ? n : 1);
}

static size_t split_gpt2(const workspace *w, size_t s, size_t e, size_t *out) {
    size_t k = 0;
    for (size_t p = s; p < e;) {
        size_t q = contraction(w, p, e, 0);
        if (!q) {
            size_t a = (w->cp[p] == ' ' && p + 1 < e) ? p + 1 : p; /* the optional leading space */
            if (IS_L(a)) {
                for (q = a; IS_L(q);) q++;
            } else if (IS_N(a)) {
                for (q = a; IS_N(q);) q++;
            } else if (IS_OTHER(a)) {
                for (q = a; IS_OTHER(q);) q++;
            } else {
                size_t n = 0;
                while (IS_WS(p + n)) n++;
                q = ws_run_end(p, n, e);
            }
        }
        out[k++] = q - p;
        p = q;
    }
    return k;
}

static size_t split_llama3(const workspace *w, size_t s, size_t e, size_t *out, size_t max_digits) {
    size_t k = 0;
    for (size_t p = s; p < e;) {
        uint32_t c = w->cp[p];
        size_t q = contraction(w, p, e, 1);
        if (q) {
        } else if (IS_L(p)) { /* [^\r\n\p{L}\p{N}]?\p{L}+ */
            for (q = p; IS_L(q);) q++;
        } else if (c != '\r' && c != '\n' && !IS_N(p) && IS_L(p + 1)) {
            for (q = p + 1; IS_L(q);) q++;
        } else if (IS_N(p)) { /* \p{N}{1,max_digits} */
            for (q = p; IS_N(q) && q - p < max_digits;) q++;
        } else if (IS_OTHER(p) || (c == ' ' && IS_OTHER(p + 1))) { /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
            for (q = (c == ' ') ? p + 1 : p; IS_OTHER(q);) q++;
            while (q < e && (w->cp[q] == '\r' || w->cp[q] == '\n')) q++;
        } else {
            size_t n = 0, last_nl = 0;
            while (IS_WS(p + n)) {
                if (w->cp[p + n] == '\r' || w->cp[p + n] == '\n') last_nl = p + n + 1;
                n++;
            }
            q = last_nl ? last_nl : ws_run_end(p, n, e); /* \s*[\r\n]+ first */
        }
        out[k++] = q - p;
        p = q;
    }
    return k;
}

/* Splits [s, e) into maximal runs of code points for which in(i) holds
 * (each run one piece, or one piece per code point when each) and the gaps
 * between them. */
static int in_punct(const workspace *w, size_t i, int backtick) {
    uint32_t c = w->cp[i];
    return (w->fl[i] & KV_UCAT_PUNCT) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' ||
           c == '^' || c == '~' || c == '|' || (backtick && c == '`');
}

static size_t split_class(const workspace *w, size_t s, size_t e, size_t *out, split_step st) {
    size_t k = 0, gap = s;
    for (size_t p = s; p < e;) {
        int hit;
        switch (st) {
        case STEP_EACH_NUMBER:
        case STEP_NUMBER_RUNS: hit = (w->fl[p] & KV_UCAT_NUMBER) != 0; break;
        default: hit = in_punct(w, p, st == STEP_PUNCT_RUNS_BT); break;
        }
        if (!hit) {
            p++;
            continue;
        }
        if (p > gap) out[k++] = p - gap;
        size_t q = p + 1;
        if (st != STEP_EACH_NUMBER)
            while (q < e && (st == STEP_NUMBER_RUNS ? (w->fl[q] & KV_UCAT_NUMBER) != 0
                                                    : in_punct(w, q, st == STEP_PUNCT_RUNS_BT)))
                q++;
        out[k++] = q - p;
        p = gap = q;
    }
    if (e > gap) out[k++] = e - gap;
    return k;
}

static size_t split_digits3(const workspace *w, size_t s, size_t e, size_t *out) {
    size_t k = 0, gap = s;
#define DIG(i) (w->cp[i] >= '0' && w->cp[i] <= '9')
    for (size_t p = s; p + 3 <= e;) {
        if (DIG(p) && DIG(p + 1) && DIG(p + 2)) {
            if (p > gap) out[k++] = p - gap;
            out[k++] = 3;
            p = gap = p + 3;
        } else {
            p++;
        }
    }
#undef DIG
    if (e > gap) out[k++] = e - gap;
    return k;
}

/* Runs the pipeline over code points [0, n); returns the piece count, the
 * lengths left in *pieces (w->pa or w->pb). */
static size_t pretokenize(const kv_tokenizer *t, workspace *w, size_t n, size_t **pieces) {
    size_t *in = w->pa, *out = w->pb;
    size_t nin = 1;
    in[0] = n;
    for (const split_step *st = pre_steps[t->pre]; *st != STEP_END; st++) {
        size_t nout = 0, s = 0;
        for (size_t i = 0; i < nin; i++) {
            size_t e = s + in[i];
            switch (*st) {
            case STEP_GPT2: nout += split_gpt2(w, s, e, out + nout); break;
            case STEP_LLAMA3: nout += split_llama3(w, s, e, out + nout, 3); break;
            case STEP_QWEN2: nout += split_llama3(w, s, e, out + nout, 1); break;
            case STEP_DIGITS3: nout += split_digits3(w, s, e, out + nout); break;
            default: nout += split_class(w, s, e, out + nout, *st); break;
            }
            s = e;
        }
        size_t *tmp = in;
        in = out;
        out = tmp;
        nin = nout;
    }
    *pieces = in;
    return nin;
}

#undef CL
#undef IS_L
#undef IS_N
#undef IS_WS
#undef IS_OTHER

/* --- byte-level BPE --- */

/* Min-heap on rank; equal ranks pop the leftmost pair first. */
static int bpe_before(const bpe_bigram *a, const bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void bpe_push(bpe_bigram *h, int *n, bpe_bigram v) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!bpe_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static bpe_bigram bpe_pop(bpe_bigram *h, int *n) {
    bpe_bigram top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && bpe_before(&h[c + 1], &h[c])) c++;
        if (!bpe_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void bpe_try_bigram(const kv_tokenizer *t, workspace *w, int *nh, int left, int right) {
    if (left < 0 || right < 0) return;
    int32_t l = w->bsym[left].id, r = w->bsym[right].id, m;
    if (l < 0 || r < 0) return;
    int32_t rank = find_merge(t, l, r, &m);
    if (rank < 0) return;
    bpe_bigram b = {rank, left, right, l, r, m};
    bpe_push(w->bheap, nh, b);
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
        int32_t id = find_text(t, w->word, m);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    /* Every byte is one byte-level character, so the initial symbols are
     * the bytes and their ids come from a table. */
    for (size_t i = 0; i < n; i++) {
        bpe_sym *y = &w->bsym[i];
        y->prev = (int)i - 1;
        y->next = i + 1 == n ? -1 : (int)i + 1;
        y->id = t->byte_tok[s[i]];
        y->n = 1;
    }
    int nh = 0;
    for (size_t i = 1; i < n; i++) bpe_try_bigram(t, w, &nh, (int)i - 1, (int)i);
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
    for (size_t i = 0; i < n; i++) {
        /* NOTE: a byte whose byte-level character is missing from the vocab
         * is dropped, as llama.cpp does; no real BPE vocab lacks one. */
        if (w->bsym[i].n && w->bsym[i].id >= 0) emit(e, w->bsym[i].id);
    }
}

/* Encodes one fragment; with splits set, records each word's byte length
 * there instead (kv_tokenizer_split). */
static void bpe_encode(const kv_tokenizer *t, workspace *w, const char *text, size_t len, emitter *e,
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
    if (n == 0) return;
    w->boff[n] = (uint32_t)len;
    size_t *pieces;
    size_t np = pretokenize(t, w, n, &pieces);
    size_t c0 = 0;
    for (size_t i = 0; i < np; i++) {
        size_t c1 = c0 + pieces[i];
        if (splits) emit(splits, (int32_t)(w->boff[c1] - w->boff[c0]));
        else bpe_word(t, w, u + w->boff[c0], w->boff[c1] - w->boff[c0], e);
        c0 = c1;
    }
}

/* --- special tokens and the public entry --- */

/* Longest special token text at text[p], or -1. */
static int32_t match_special(const kv_tokenizer *t, const char *text, size_t len, size_t p, int parse_special) {
    unsigned char b = (unsigned char)text[p];
    for (uint32_t j = t->spec_start[b]; j < t->spec_start[b + 1]; j++) {
        int32_t id = t->spec[j];
        if (!parse_special && t->ttype[id] != KV_TOKEN_USER_DEFINED) continue;
        uint32_t n = t->len[id];
        if (n <= len - p && memcmp(text + p, tok_text(t, id), n) == 0) return id;
    }
    return -1;
}

static void encode_fragment(const kv_tokenizer *t, workspace *w, const char *s, size_t n, int prev_special,
                            emitter *e, emitter *splits) {
    if (t->type == KV_TOK_BPE) bpe_encode(t, w, s, n, e, splits);
    else if (splits) emit(splits, (int32_t)n);
    else spm_encode(t, w, s, n, t->add_space_prefix && prev_special, e);
}

static int encode_impl(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                       int32_t *out, int cap, emitter *splits, kv_err *err) {
    if (!t) return kv_err_set(err, KV_ERR_INVAL, "tokenizer: NULL handle");
    if ((!text && len) || cap < 0 || (!out && cap > 0))
        return kv_err_set(err, KV_ERR_INVAL, "tokenizer: bad encode arguments (text %p, len %zu, out %p, cap %d)",
                          (const void *)text, len, (void *)out, cap);
    if (len > (size_t)INT32_MAX / 4)
        return kv_err_set(err, KV_ERR_RANGE, "tokenizer: text of %zu bytes is too long to encode", len);
    if (add_bos && t->bos < 0) return kv_err_set(err, KV_ERR_INVAL, "tokenizer: add_bos requested but the vocab has no BOS");
    emitter e = {out, cap, 0};
    if (add_bos) emit(&e, t->bos);
    if (len == 0) return (int)e.n;

    workspace w;
    if (ws_alloc(&w, t, len)) {
        ws_free(&w);
        return kv_err_set(err, KV_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
    }
    int prev_special = 1; /* SPM: the first fragment gets the dummy prefix */
    size_t frag = 0;
    for (size_t p = 0; p < len;) {
        int32_t id = t->n_spec ? match_special(t, text, len, p, parse_special) : -1;
        if (id < 0) {
            p++;
            continue;
        }
        if (p > frag) {
            encode_fragment(t, &w, text + frag, p - frag, prev_special, &e, splits);
            prev_special = 0;
        }
        if (splits) emit(splits, (int32_t)t->len[id]);
        else emit(&e, id);
        prev_special = 1;
        p += t->len[id];
        frag = p;
    }
    if (len > frag) encode_fragment(t, &w, text + frag, len - frag, prev_special, &e, splits);
    ws_free(&w);
    int64_t total = splits ? splits->n : e.n;
    if (total > INT_MAX) return kv_err_set(err, KV_ERR_RANGE, "tokenizer: too many tokens (%lld)", (long long)total);
    return (int)total;
}

int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                        int32_t *out, int cap, kv_err *err) {
    return encode_impl(t, text, len, add_bos, parse_special, out, cap, NULL, err);
}

int kv_tokenizer_split(const kv_tokenizer *t, const char *text, size_t len, int parse_special, int32_t *lens,
                       int cap, kv_err *err) {
    if (cap < 0 || (!lens && cap > 0)) return kv_err_set(err, KV_ERR_INVAL, "tokenizer: bad split arguments");
    emitter splits = {lens, cap, 0};
    return encode_impl(t, text, len, 0, parse_special, NULL, 0, &splits, err);
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
    if (t->type == KV_TOK_SPM) {
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
