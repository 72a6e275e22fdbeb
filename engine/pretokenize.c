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
    STEP_DIGITS3,     /* [0-9][0-9][0-9] */
    STEP_QWEN35,      /* Qwen 2 with [\p{L}\p{M}]+ letter runs */
    STEP_EACH_CRLF,   /* [\r\n] */
    STEP_WS_LETTERS,  /* \s?\p{L}+ */
    STEP_WS_PUNCT,    /* \s?\p{P}+ */
    STEP_WS_DS_LETTERS, /* \s?[DeepSeek LLM's letter ranges]+ */
    STEP_WS_DS_PUNCT, /* \s?[!-/:-~！-／：-～‘-‟　-。]+ */
    STEP_TRAILING_WS, /* \s+$ */
    STEP_CJK_RUNS,    /* [一-龥ࠀ-一가-퟿]+ */
    STEP_NEWLINE_RUNS /* [^\n]+|[\n]+ */
} split_step;

static const split_step pre_steps[][8] = {
    [KV_PRE_DEFAULT] = {STEP_PUNCT_RUNS, STEP_GPT2, STEP_NUMBER_RUNS, STEP_DIGITS3, STEP_END},
    [KV_PRE_GPT2] = {STEP_GPT2, STEP_END},
    [KV_PRE_STARCODER] = {STEP_EACH_NUMBER, STEP_GPT2, STEP_END},
    [KV_PRE_LLAMA3] = {STEP_LLAMA3, STEP_END},
    [KV_PRE_QWEN2] = {STEP_QWEN2, STEP_END},
    [KV_PRE_FALCON] = {STEP_PUNCT_RUNS_BT, STEP_GPT2, STEP_DIGITS3, STEP_END},
    [KV_PRE_QWEN35] = {STEP_QWEN35, STEP_END},
    [KV_PRE_DEEPSEEK_LLM] = {STEP_EACH_CRLF, STEP_WS_DS_LETTERS, STEP_WS_DS_PUNCT, STEP_TRAILING_WS,
                             STEP_CJK_RUNS, STEP_NUMBER_RUNS, STEP_END},
    [KV_PRE_DEEPSEEK_CODER] = {STEP_EACH_CRLF, STEP_WS_LETTERS, STEP_WS_PUNCT, STEP_CJK_RUNS, STEP_EACH_NUMBER,
                               STEP_END},
    [KV_PRE_GEMMA4] = {STEP_NEWLINE_RUNS, STEP_END},
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
    {"falcon", KV_PRE_FALCON},         {"qwen35", KV_PRE_QWEN35},       {"deepseek-llm", KV_PRE_DEEPSEEK_LLM},
    {"deepseek-coder", KV_PRE_DEEPSEEK_CODER},                          {"gemma4", KV_PRE_GEMMA4},
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

/* The Llama 3 / Qwen 2 pattern; letters is KV_UCAT_LETTER, or with
 * KV_UCAT_MARK added for Qwen 3.5's [\p{L}\p{M}]+ (marks then also leave
 * the [^\s\p{L}\p{M}\p{N}] class). */
static size_t split_llama3(const pre_text *w, size_t s, size_t e, size_t *out, size_t max_digits, unsigned letters) {
#define IS_LM(i) (CL(i) & letters)
#define IS_OTHER_LM(i) ((i) < e && !(w->fl[i] & (letters | KV_UCAT_NUMBER | KV_UCAT_WHITESPACE)))
    size_t k = 0;
    for (size_t p = s; p < e;) {
        uint32_t c = w->cp[p];
        size_t q = contraction(w, p, e, 1);
        if (q) {
        } else if (IS_LM(p)) { /* [^\r\n\p{L}\p{N}]?\p{L}+ */
            for (q = p; IS_LM(q);) q++;
        } else if (c != '\r' && c != '\n' && !IS_N(p) && IS_LM(p + 1)) {
            for (q = p + 1; IS_LM(q);) q++;
        } else if (IS_N(p)) { /* \p{N}{1,max_digits} */
            for (q = p; IS_N(q) && q - p < max_digits;) q++;
        } else if (IS_OTHER_LM(p) || (c == ' ' && IS_OTHER_LM(p + 1))) { /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
            for (q = (c == ' ') ? p + 1 : p; IS_OTHER_LM(q);) q++;
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
#undef IS_LM
#undef IS_OTHER_LM
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

/* ---- the DeepSeek and Gemma 4 steps: a pattern searched left to right ---- *
 * Those patterns are written in tokenizer.json with explicit code point
 * ranges rather than classes. NOTE: a range here matches a non-ASCII
 * White_Space character it contains (U+3000 in DeepSeek's punctuation,
 * U+2000..U+200A in [ࠀ-一]), as the model's own regex does; llama.cpp reads
 * those as \s only, so its ids differ on such text. */

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

/* DeepSeek LLM's letter class, from its tokenizer.json (sorted). */
static const cp_range ds_letters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
/* DeepSeek LLM's punctuation class [!-/:-~！-／：-～‘-‟　-。] (sorted). */
static const cp_range ds_punct[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};
/* [一-龥ࠀ-一가-퟿], both DeepSeek vocabularies: U+0800..U+9FA5 and U+AC00..U+D7FF. */
static const cp_range cjk_hangul[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

static int in_ranges(const pre_text *w, size_t i, const cp_range *r, size_t n) {
    uint32_t c = w->cp[i];
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r[mid].hi < c) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && r[lo].lo <= c;
}

/* Whether code point i is in step st's repeated class. */
static int step_class(const pre_text *w, size_t i, split_step st) {
    switch (st) {
    case STEP_WS_LETTERS: return (w->fl[i] & KV_UCAT_LETTER) != 0;
    case STEP_WS_PUNCT: return (w->fl[i] & KV_UCAT_PUNCT) != 0;
    case STEP_WS_DS_LETTERS: return in_ranges(w, i, ds_letters, KV_ARRAY_LEN(ds_letters));
    case STEP_WS_DS_PUNCT: return in_ranges(w, i, ds_punct, KV_ARRAY_LEN(ds_punct));
    case STEP_CJK_RUNS: return in_ranges(w, i, cjk_hangul, KV_ARRAY_LEN(cjk_hangul));
    default: return 0;
    }
}

/* End of step st's match at p, or p when it does not match there. */
static size_t step_match(const pre_text *w, size_t p, size_t e, split_step st) {
    size_t q = p;
    switch (st) {
    case STEP_EACH_CRLF: return (w->cp[p] == '\r' || w->cp[p] == '\n') ? p + 1 : p;
    case STEP_NEWLINE_RUNS: { /* always matches: a run of newlines or of anything else */
        int nl = w->cp[p] == '\n';
        while (q < e && (w->cp[q] == '\n') == nl) q++;
        return q;
    }
    case STEP_CJK_RUNS: break;
    default: /* \s?CLASS+ */
        if ((w->fl[p] & KV_UCAT_WHITESPACE) && p + 1 < e && step_class(w, p + 1, st)) q = p + 1;
        break;
    }
    while (q < e && step_class(w, q, st)) q++;
    return q; /* past p only when at least one code point of the class matched */
}

/* Splits [s, e) into the leftmost-first matches of step st and the text
 * between them, as a regex search does. */
static size_t split_search(const pre_text *w, size_t s, size_t e, size_t *out, split_step st) {
    size_t k = 0, gap = s;
    for (size_t p = s; p < e;) {
        size_t q = step_match(w, p, e, st);
        if (q == p) {
            p++;
            continue;
        }
        if (p > gap) out[k++] = p - gap;
        out[k++] = q - p;
        p = gap = q;
    }
    if (e > gap) out[k++] = e - gap;
    return k;
}

/* \s+$: the piece's trailing whitespace run, its only possible match. */
static size_t split_trailing_ws(const pre_text *w, size_t s, size_t e, size_t *out) {
    size_t r = e;
    while (r > s && (w->fl[r - 1] & KV_UCAT_WHITESPACE)) r--;
    size_t k = 0;
    if (r > s) out[k++] = r - s;
    if (e > r) out[k++] = e - r;
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
            case STEP_LLAMA3: nout += split_llama3(w, s, e, out + nout, 3, KV_UCAT_LETTER); break;
            case STEP_QWEN2: nout += split_llama3(w, s, e, out + nout, 1, KV_UCAT_LETTER); break;
            case STEP_QWEN35: nout += split_llama3(w, s, e, out + nout, 1, KV_UCAT_LETTER | KV_UCAT_MARK); break;
            case STEP_DIGITS3: nout += split_digits3(w, s, e, out + nout); break;
            case STEP_TRAILING_WS: nout += split_trailing_ws(w, s, e, out + nout); break;
            case STEP_EACH_CRLF:
            case STEP_WS_LETTERS:
            case STEP_WS_PUNCT:
            case STEP_WS_DS_LETTERS:
            case STEP_WS_DS_PUNCT:
            case STEP_CJK_RUNS:
            case STEP_NEWLINE_RUNS: nout += split_search(w, s, e, out + nout, *st); break;
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
