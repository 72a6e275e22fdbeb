/* pretokenize.c - byte-level BPE's pre-tokenizers (see pretokenize.h): each
 * pipeline is a list of split steps applied in turn, every step refining
 * the pieces of the previous one, the way llama.cpp applies its list of
 * regexes. The matchers follow llama.cpp's so ids match its outputs. */
#include "pretokenize.h"

#include <string.h>

#include "../base/common.h"
#include "unicode.h"

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
    [KV_PRE_DEFAULT] = {STEP_PUNCT_RUNS, STEP_GPT2, STEP_NUMBER_RUNS, STEP_DIGITS3, STEP_END},
    [KV_PRE_GPT2] = {STEP_GPT2, STEP_END},
    [KV_PRE_STARCODER] = {STEP_EACH_NUMBER, STEP_GPT2, STEP_END},
    [KV_PRE_LLAMA3] = {STEP_LLAMA3, STEP_END},
    [KV_PRE_QWEN2] = {STEP_QWEN2, STEP_END},
    [KV_PRE_FALCON] = {STEP_PUNCT_RUNS_BT, STEP_GPT2, STEP_DIGITS3, STEP_END},
};

/* tokenizer.ggml.pre names, as llama.cpp maps them. */
static const struct {
    const char *name;
    kv_pre_kind kind;
} pre_names[] = {
    {"default", KV_PRE_DEFAULT},       {"gpt-2", KV_PRE_GPT2},          {"phi-2", KV_PRE_GPT2},
    {"mpt", KV_PRE_GPT2},              {"olmo", KV_PRE_GPT2},           {"jais", KV_PRE_GPT2},
    {"trillion", KV_PRE_GPT2},         {"roberta-bpe", KV_PRE_GPT2},    {"jina-es", KV_PRE_GPT2},
    {"jina-de", KV_PRE_GPT2},          {"jina-v1-en", KV_PRE_GPT2},     {"jina-v2-es", KV_PRE_GPT2},
    {"jina-v2-de", KV_PRE_GPT2},       {"jina-v2-code", KV_PRE_GPT2},   {"gigachat", KV_PRE_GPT2},
    {"granite-docling", KV_PRE_GPT2},  {"starcoder", KV_PRE_STARCODER}, {"smollm", KV_PRE_STARCODER},
    {"refact", KV_PRE_STARCODER},      {"command-r", KV_PRE_STARCODER}, {"codeshell", KV_PRE_STARCODER},
    {"exaone", KV_PRE_STARCODER},      {"minerva-7b", KV_PRE_STARCODER}, {"llama3", KV_PRE_LLAMA3},
    {"llama-v3", KV_PRE_LLAMA3},       {"llama-bpe", KV_PRE_LLAMA3},    {"falcon3", KV_PRE_LLAMA3},
    {"falcon-h1", KV_PRE_LLAMA3},      {"pixtral", KV_PRE_LLAMA3},      {"midm-2.0", KV_PRE_LLAMA3},
    {"lfm2", KV_PRE_LLAMA3},           {"dbrx", KV_PRE_LLAMA3},         {"smaug-bpe", KV_PRE_LLAMA3},
    {"chatglm-bpe", KV_PRE_LLAMA3},    {"qwen2", KV_PRE_QWEN2},         {"deepseek-r1-qwen", KV_PRE_QWEN2},
    {"megrez", KV_PRE_QWEN2},          {"stablelm2", KV_PRE_QWEN2},     {"hunyuan", KV_PRE_QWEN2},
    {"falcon", KV_PRE_FALCON},
};

int kv_pre_name_known(const char *name) {
    for (size_t i = 0; i < KV_ARRAY_LEN(pre_names); i++)
        if (!strcmp(name, pre_names[i].name)) return 1;
    return 0;
}

kv_pre_kind kv_pre_kind_from_name(const char *name) {
    kv_pre_kind k = KV_PRE_DEFAULT;
    for (size_t i = 0; i < KV_ARRAY_LEN(pre_names); i++)
        if (!strcmp(name, pre_names[i].name)) k = pre_names[i].kind;
    return k;
}

/* The text being split: code points and their class flags. */
typedef struct pre_text {
    const uint32_t *cp; /* (n) code points */
    const uint16_t *fl; /* (n) KV_UCAT_* flags */
} pre_text;

/* ---- split steps ---- *
 * Each takes the code points [s, e) of one piece and appends the lengths of
 * the sub-pieces it splits it into (covering all of it) to out. */

#define CL(i) ((i) < e ? w->fl[i] : 0u)
#define IS_L(i) (CL(i) & KV_UCAT_LETTER)
#define IS_N(i) (CL(i) & KV_UCAT_NUMBER)
#define IS_WS(i) (CL(i) & KV_UCAT_WHITESPACE)
#define IS_OTHER(i) ((i) < e && !(w->fl[i] & (KV_UCAT_LETTER | KV_UCAT_NUMBER | KV_UCAT_WHITESPACE)))

static uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at p: returns the end, or 0. */
static size_t contraction(const pre_text *w, size_t p, size_t e, int fold) {
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

static size_t split_gpt2(const pre_text *w, size_t s, size_t e, size_t *out) {
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

static size_t split_llama3(const pre_text *w, size_t s, size_t e, size_t *out, size_t max_digits) {
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
static int in_punct(const pre_text *w, size_t i, int backtick) {
    uint32_t c = w->cp[i];
    return (w->fl[i] & KV_UCAT_PUNCT) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' ||
           c == '^' || c == '~' || c == '|' || (backtick && c == '`');
}

static size_t split_class(const pre_text *w, size_t s, size_t e, size_t *out, split_step st) {
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

static size_t split_digits3(const pre_text *w, size_t s, size_t e, size_t *out) {
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

size_t kv_pretokenize(kv_pre_kind kind, const uint32_t *cp, const uint16_t *fl, size_t n, size_t *pa, size_t *pb,
                      size_t **pieces) {
    const pre_text text = {cp, fl}, *w = &text;
    size_t *in = pa, *out = pb;
    size_t nin = 1;
    in[0] = n;
    for (const split_step *st = pre_steps[kind]; *st != STEP_END; st++) {
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
