/* chat_template.c - recognises a model's chat format from its Jinja
 * template by marker strings (as llama.cpp does) and renders conversations
 * in that format by hand. The rendering of each format follows the Jinja
 * templates in ../shared/vocab/templates for the cases a chat front end
 * produces (optional system message, alternating user/assistant turns). */
#include "chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* output with snprintf-like counting */

typedef struct out_buf {
    char *buf;
    size_t cap;          /* bytes available for text (excluding the NUL slot) */
    size_t n;            /* bytes produced, may exceed cap */
    kv_tok_span *spans;  /* (span_cap) where the template's own text is, or NULL */
    int span_cap;
    int n_spans;         /* ranges produced, may exceed span_cap */
} out_buf;

/* Message text: plain. */
static void put_n(out_buf *o, const char *s, size_t n) {
    if (o->n < o->cap) memcpy(o->buf + o->n, s, KV_MIN(n, o->cap - o->n));
    o->n += n;
}

static void put_s(out_buf *o, const char *s) { put_n(o, s, strlen(s)); }

/* The template's own text (markers, role names, separators, its default
 * system message): recorded as a range where special-token texts are
 * special tokens, merged with a range it continues. */
static void put_t(out_buf *o, const char *s) {
    size_t n = strlen(s);
    if (n == 0) return;
    int last = o->n_spans - 1;
    if (last >= 0 && last < o->span_cap && o->spans[last].off + o->spans[last].len == o->n) {
        o->spans[last].len += n;
    } else {
        if (o->n_spans < o->span_cap) o->spans[o->n_spans] = (kv_tok_span){o->n, n};
        o->n_spans++;
    }
    put_n(o, s, n);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Jinja's |trim and Python's str.strip() (ASCII whitespace). */
static void put_trim(out_buf *o, const char *s) {
    size_t a = 0, b = strlen(s);
    while (a < b && is_space(s[a])) a++;
    while (b > a && is_space(s[b - 1])) b--;
    put_n(o, s + a, b - a);
}

/* What a template adds on its own, read from its text. */
typedef struct chat_opts {
    int think;                 /* DeepSeek-R1: the generation prompt opens <think> */
    int eos_without_gen;       /* Phi-3.5: a conversation rendered without a generation prompt ends in EOS */
    int no_system;             /* Phi-3's first template: no system turn at all (system messages are dropped) */
    char default_system[1024]; /* system message used when there is none ("" = none) */
    char system_prefix[256];   /* Llama 3.1: text at the top of an always-present system block */
} chat_opts;

/* ------------------------------------------------------------------ */
/* detection */

static const char *find_n(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m == 0 || m > n) return NULL;
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, m)) return s + i;
    return NULL;
}

/* Copies the Jinja string literal whose opening quote is at q (inside
 * [s, end)) to out, undoing \n, \t, \', \", \\ escapes; returns a pointer
 * past the closing quote, or NULL when the literal does not close. */
static const char *read_literal(const char *q, const char *end, char *out, size_t cap) {
    char quote = *q;
    size_t k = 0;
    for (const char *p = q + 1; p < end; p++) {
        char c = *p;
        if (c == quote) {
            if (cap) out[KV_MIN(k, cap - 1)] = 0;
            return p + 1;
        }
        if (c == '\\' && p + 1 < end) {
            c = *++p;
            if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
            else if (c == 'r') c = '\r';
        }
        if (k + 1 < cap) out[k] = c;
        k++;
    }
    return NULL;
}

/* ChatML default system prompt: a string literal that holds a whole
 * system turn, '<|im_start|>system\n' + text + '<|im_end|>', with no
 * template expression in it (so not '... system\n' + messages[0]...). */
static size_t chatml_default_system(const char *s, size_t n, char *out, size_t cap) {
    const char *end = s + n, *p = s;
    const char *mark = "<|im_start|>system";
    while ((p = find_n(p, (size_t)(end - p), mark)) != NULL) {
        if (p > s && (p[-1] == '\'' || p[-1] == '"')) {
            char lit[2048];
            if (read_literal(p - 1, end, lit, sizeof lit) && strlen(lit) < sizeof lit - 1) {
                const char *body = lit + strlen(mark);
                const char *stop = strstr(body, "<|im_end|>");
                if (*body == '\n' && stop && stop > body + 1) {
                    size_t l = (size_t)(stop - body - 1);
                    if (cap) {
                        size_t c = KV_MIN(l, cap - 1);
                        memcpy(out, body + 1, c);
                        out[c] = 0;
                    }
                    return l;
                }
            }
        }
        p += strlen(mark);
    }
    if (cap) out[0] = 0;
    return 0;
}

size_t kv_chat_default_system(const char *template_text, char *out, size_t cap) {
    if (!out) cap = 0;
    if (!template_text) {
        if (cap) out[0] = 0;
        return 0;
    }
    return chatml_default_system(template_text, strlen(template_text), out, cap);
}

/* Llama 3.1 puts "Cutting Knowledge Date: ...\nToday Date: <date_string>\n\n"
 * at the top of every system block. */
static void llama3_system_prefix(const char *s, size_t n, chat_opts *t) {
    const char *end = s + n;
    const char *c = find_n(s, n, "Cutting Knowledge Date:");
    if (!c || c == s || (c[-1] != '"' && c[-1] != '\'')) return;
    char knowledge[128];
    if (!read_literal(c - 1, end, knowledge, sizeof knowledge)) return;
    char date[64] = "";
    const char *d = find_n(s, n, "date_string = ");
    if (d) {
        d += strlen("date_string = ");
        if (d < end && (*d == '"' || *d == '\'') && !read_literal(d, end, date, sizeof date)) date[0] = 0;
    }
    if (find_n(s, n, "Today Date: ") && date[0])
        snprintf(t->system_prefix, sizeof t->system_prefix, "%sToday Date: %s\n\n", knowledge, date);
    else
        snprintf(t->system_prefix, sizeof t->system_prefix, "%s", knowledge);
}

static const struct {
    const char *name;
    kv_chat_tmpl kind;
} kind_names[] = {
    {"plain", KV_CHAT_PLAIN},     {"chatml", KV_CHAT_CHATML},   {"llama2", KV_CHAT_LLAMA2},
    {"mistral", KV_CHAT_MISTRAL}, {"llama3", KV_CHAT_LLAMA3},   {"zephyr", KV_CHAT_ZEPHYR},
    {"gemma", KV_CHAT_GEMMA},     {"phi3", KV_CHAT_PHI3},       {"deepseek-r1", KV_CHAT_DEEPSEEK_R1},
    {"llama-2", KV_CHAT_LLAMA2},  {"llama-3", KV_CHAT_LLAMA3},  {"phi-3", KV_CHAT_PHI3},
    {"deepseek", KV_CHAT_DEEPSEEK_R1}, {"gemma4", KV_CHAT_GEMMA4}, {"command-r", KV_CHAT_COMMAND_R},
};

const char *kv_chat_tmpl_name(kv_chat_tmpl kind) {
    for (size_t i = 0; i < KV_ARRAY_LEN(kind_names); i++)
        if (kind_names[i].kind == kind) return kind_names[i].name;
    return "plain";
}

#define HAS(x) (find_n(s, n, (x)) != NULL)

kv_chat_tmpl kv_chat_detect_n(const char *s, size_t n) {
    if (!s || n == 0) return KV_CHAT_PLAIN;
    for (size_t i = 0; i < KV_ARRAY_LEN(kind_names); i++)
        if (strlen(kind_names[i].name) == n && !strncmp(kind_names[i].name, s, n)) return kind_names[i].kind;
    /* Marker strings, most specific first (llama.cpp checks the same ones). */
    if (HAS("<|im_start|>")) return KV_CHAT_CHATML;
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) return KV_CHAT_LLAMA3;
    if (HAS("<｜User｜>") && HAS("<｜Assistant｜>")) return KV_CHAT_DEEPSEEK_R1;
    if (HAS("<|turn>") && HAS("<turn|>")) return KV_CHAT_GEMMA4;
    if (HAS("<start_of_turn>")) return KV_CHAT_GEMMA;
    if (HAS("<|START_OF_TURN_TOKEN|>")) return KV_CHAT_COMMAND_R;
    if (HAS("<|user|>") && HAS("<|end|>")) return KV_CHAT_PHI3;
    if (HAS("<|user|>")) return KV_CHAT_ZEPHYR;
    /* "[INST] " with a space and <<SYS>> are Llama 2's; Mistral's v3 /
     * tekken templates glue [INST] to the text. */
    if (HAS("[INST]")) return (HAS("<<SYS>>") || HAS("[INST] ")) ? KV_CHAT_LLAMA2 : KV_CHAT_MISTRAL;
    return KV_CHAT_PLAIN;
}

static void read_opts(kv_chat_tmpl kind, const char *s, chat_opts *o) {
    memset(o, 0, sizeof *o);
    size_t n = s ? strlen(s) : 0;
    if (kind == KV_CHAT_DEEPSEEK_R1) o->think = !s || HAS("<think>");
    if (!s) return;
    if (kind == KV_CHAT_CHATML) chatml_default_system(s, n, o->default_system, sizeof o->default_system);
    if (kind == KV_CHAT_LLAMA3) llama3_system_prefix(s, n, o);
    if (kind == KV_CHAT_PHI3) o->eos_without_gen = HAS("{% else %}{{ eos_token }}");
    if (kind == KV_CHAT_PHI3) o->no_system = !HAS("system");
}

#undef HAS

kv_chat_tmpl kv_chat_detect(const char *text) { return kv_chat_detect_n(text, text ? strlen(text) : 0); }

const char *kv_chat_end_of_turn(kv_chat_tmpl kind) {
    switch (kind) {
    case KV_CHAT_CHATML: return "<|im_end|>";
    case KV_CHAT_LLAMA2:
    case KV_CHAT_MISTRAL:
    case KV_CHAT_ZEPHYR: return "</s>";
    case KV_CHAT_LLAMA3: return "<|eot_id|>";
    case KV_CHAT_GEMMA: return "<end_of_turn>";
    case KV_CHAT_PHI3: return "<|end|>";
    case KV_CHAT_DEEPSEEK_R1: return "<｜end▁of▁sentence｜>";
    case KV_CHAT_GEMMA4: return "<turn|>";
    case KV_CHAT_COMMAND_R: return "<|END_OF_TURN_TOKEN|>";
    default: return "\n";
    }
}

/* ------------------------------------------------------------------ */
/* rendering */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static int role_of(const char *r) {
    if (!r) return -1;
    if (!strcmp(r, "system")) return ROLE_SYSTEM;
    if (!strcmp(r, "user")) return ROLE_USER;
    if (!strcmp(r, "assistant")) return ROLE_ASSISTANT;
    return -1;
}

/* The leading system message, if any, and where the rest starts. */
static const char *leading_system(const kv_chat_msg *m, int n, int *first) {
    if (n > 0 && role_of(m[0].role) == ROLE_SYSTEM) {
        *first = 1;
        return m[0].content;
    }
    *first = 0;
    return NULL;
}

static void fmt_chatml(const chat_opts *t, const kv_chat_msg *m, int n, out_buf *o) {
    if (t->default_system[0] && (n == 0 || role_of(m[0].role) != ROLE_SYSTEM)) {
        put_t(o, "<|im_start|>system\n");
        put_t(o, t->default_system);
        put_t(o, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        put_t(o, "<|im_start|>");
        put_t(o, m[i].role);
        put_t(o, "\n");
        put_s(o, m[i].content);
        put_t(o, "<|im_end|>\n");
    }
}

/* Meta's Llama 2 template: the system message is folded into the first
 * turn, every turn but the first opens with BOS, assistant turns end with
 * EOS; contents are stripped. */
static void fmt_llama2(const kv_chat_msg *m, int n, out_buf *o) {
    int first;
    const char *sys = leading_system(m, n, &first);
    for (int i = first; i < n; i++) {
        int r = role_of(m[i].role);
        if (r == ROLE_USER) {
            put_t(o, i == first ? "[INST] " : "<s>[INST] ");
            if (i == first && sys) {
                /* content.strip() of "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + user */
                put_t(o, "<<SYS>>\n");
                put_s(o, sys);
                put_t(o, "\n<</SYS>>\n\n");
                const char *u = m[i].content;
                size_t b = strlen(u);
                while (b > 0 && is_space(u[b - 1])) b--;
                put_n(o, u, b);
            } else {
                put_trim(o, m[i].content);
            }
            put_t(o, " [/INST]");
        } else if (r == ROLE_ASSISTANT) {
            put_t(o, " ");
            put_trim(o, m[i].content);
            put_t(o, " </s>");
        } else {
            /* A later system message: Llama 2 has no place for it; keep it
             * as an instruction of its own. */
            put_t(o, "[INST] ");
            put_trim(o, m[i].content);
            put_t(o, " [/INST]");
        }
    }
}

/* Mistral v3-tekken (Nemo): the system message goes in front of the last
 * user message, as the Jinja template does. */
static void fmt_mistral(const kv_chat_msg *m, int n, out_buf *o) {
    int first;
    const char *sys = leading_system(m, n, &first);
    for (int i = first; i < n; i++) {
        int r = role_of(m[i].role);
        if (r == ROLE_ASSISTANT) {
            put_s(o, m[i].content);
            put_t(o, "</s>");
            continue;
        }
        put_t(o, "[INST]");
        if (sys && i == n - 1) {
            put_s(o, sys);
            put_t(o, "\n\n");
        }
        put_s(o, m[i].content);
        put_t(o, "[/INST]");
    }
}

static void fmt_llama3(const chat_opts *t, const kv_chat_msg *m, int n, out_buf *o) {
    int first;
    const char *sys = leading_system(m, n, &first);
    if (!sys && t->default_system[0]) sys = t->default_system;
    if (t->system_prefix[0]) {
        /* Llama 3.1: the system block is always there. */
        put_t(o, "<|start_header_id|>system<|end_header_id|>\n\n");
        put_t(o, t->system_prefix);
        if (sys) put_trim(o, sys);
        put_t(o, "<|eot_id|>");
    } else if (sys) {
        put_t(o, "<|start_header_id|>system<|end_header_id|>\n\n");
        put_trim(o, sys);
        put_t(o, "<|eot_id|>");
    }
    for (int i = first; i < n; i++) {
        put_t(o, "<|start_header_id|>");
        put_t(o, m[i].role);
        put_t(o, "<|end_header_id|>\n\n");
        put_trim(o, m[i].content);
        put_t(o, "<|eot_id|>");
    }
}

/* <|role|>\n...END turns. skip_system: 1 drops empty system messages
 * (Phi-3.5), 2 drops all of them (Phi-3's first template has no system
 * turn). */
static void fmt_tagged(const kv_chat_msg *m, int n, const char *end, int skip_system, out_buf *o) {
    for (int i = 0; i < n; i++) {
        if (skip_system && role_of(m[i].role) == ROLE_SYSTEM && (skip_system == 2 || !m[i].content[0])) continue;
        put_t(o, "<|");
        put_t(o, m[i].role);
        put_t(o, "|>\n");
        put_s(o, m[i].content);
        put_t(o, end);
    }
}

/* Gemma has no system role: the system text opens the first user turn
 * (llama.cpp's convention; the Jinja template would refuse). */
static void fmt_gemma(const kv_chat_msg *m, int n, out_buf *o) {
    const char *sys = NULL;
    for (int i = 0; i < n; i++) {
        int r = role_of(m[i].role);
        if (r == ROLE_SYSTEM) {
            sys = m[i].content;
            continue;
        }
        put_t(o, r == ROLE_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (sys && r == ROLE_USER) {
            put_trim(o, sys);
            put_t(o, "\n\n");
            sys = NULL;
        }
        put_trim(o, m[i].content);
        put_t(o, "<end_of_turn>\n");
    }
}

/* Gemma 4's strip_thinking: drops every "<|channel>...<channel|>" block
 * (and an unclosed "<|channel>..." before a later "<channel|>"), then
 * trims. */
static void put_strip_thinking(out_buf *o, const char *s) {
    size_t n = strlen(s);
    char *keep = malloc(n + 1);
    if (!keep) { /* cannot happen for sane sizes; keep the text rather than fail */
        put_trim(o, s);
        return;
    }
    size_t k = 0;
    const char *close = "<channel|>", *open = "<|channel>";
    for (const char *part = s;;) {
        const char *end = strstr(part, close);
        size_t plen = end ? (size_t)(end - part) : strlen(part);
        const char *op = find_n(part, plen, open);
        size_t take = op ? (size_t)(op - part) : plen;
        memcpy(keep + k, part, take);
        k += take;
        if (!end) break;
        part = end + strlen(close);
    }
    keep[k] = 0;
    put_trim(o, keep);
    free(keep);
}

/* Gemma 4: system turns of their own, "model" for the assistant, contents trimmed, earlier answers
 * without their thinking. */
static void fmt_gemma4(const kv_chat_msg *m, int n, out_buf *o) {
    for (int i = 0; i < n; i++) {
        int r = role_of(m[i].role);
        put_t(o, r == ROLE_SYSTEM ? "<|turn>system\n" : r == ROLE_USER ? "<|turn>user\n" : "<|turn>model\n");
        if (r == ROLE_ASSISTANT) put_strip_thinking(o, m[i].content);
        else put_trim(o, m[i].content);
        put_t(o, "<turn|>\n");
    }
}

/* Cohere's Command-R: the system message as given, turns stripped. */
static void fmt_command_r(const kv_chat_msg *m, int n, out_buf *o) {
    for (int i = 0; i < n; i++) {
        int r = role_of(m[i].role);
        if (r == ROLE_SYSTEM && i > 0) continue;
        put_t(o, r == ROLE_SYSTEM   ? "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>"
                 : r == ROLE_USER ? "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
                                  : "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        if (r == ROLE_SYSTEM) put_s(o, m[i].content);
        else put_trim(o, m[i].content);
        put_t(o, "<|END_OF_TURN_TOKEN|>");
    }
}

static void fmt_deepseek(const kv_chat_msg *m, int n, out_buf *o) {
    const char *sys = NULL;
    for (int i = 0; i < n; i++)
        if (role_of(m[i].role) == ROLE_SYSTEM) sys = m[i].content; /* the last one wins */
    if (sys) put_s(o, sys);
    for (int i = 0; i < n; i++) {
        int r = role_of(m[i].role);
        if (r == ROLE_USER) {
            put_t(o, "<｜User｜>");
            put_s(o, m[i].content);
        } else if (r == ROLE_ASSISTANT) {
            /* Earlier answers keep only what follows their reasoning. */
            const char *c = m[i].content, *p;
            while ((p = strstr(c, "</think>")) != NULL) c = p + strlen("</think>");
            put_t(o, "<｜Assistant｜>");
            put_s(o, c);
            put_t(o, "<｜end▁of▁sentence｜>");
        }
    }
}

static void fmt_plain(const kv_chat_msg *m, int n, out_buf *o) {
    for (int i = 0; i < n; i++) {
        int r = role_of(m[i].role);
        if (r == ROLE_SYSTEM) {
            put_s(o, m[i].content);
            put_t(o, "\n\n");
        } else {
            put_t(o, r == ROLE_USER ? "User: " : "Assistant: ");
            put_s(o, m[i].content);
            put_t(o, "\n");
        }
    }
}

/* Renders into o (text and, when o->spans is set, the template's ranges).
 * Returns 0, or KV_ERR_INVAL / KV_ERR_RANGE. */
static int render(kv_chat_tmpl t, const char *template_text, int default_system, const kv_chat_msg *msgs, int n,
                  int add_generation_prompt, out_buf *o) {
    if (n < 0 || (!msgs && n > 0)) return KV_ERR_INVAL;
    for (int i = 0; i < n; i++)
        if (role_of(msgs[i].role) < 0 || !msgs[i].content) return KV_ERR_INVAL;
    chat_opts opts;
    read_opts(t, template_text, &opts);
    if (!default_system) opts.default_system[0] = '\0';
    const char *gen = "";
    switch (t) {
    case KV_CHAT_CHATML:
        fmt_chatml(&opts, msgs, n, o);
        gen = "<|im_start|>assistant\n";
        break;
    case KV_CHAT_LLAMA2: fmt_llama2(msgs, n, o); break;
    case KV_CHAT_MISTRAL: fmt_mistral(msgs, n, o); break;
    case KV_CHAT_LLAMA3:
        fmt_llama3(&opts, msgs, n, o);
        gen = "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
    case KV_CHAT_ZEPHYR:
        fmt_tagged(msgs, n, "</s>\n", 0, o);
        gen = "<|assistant|>\n";
        break;
    case KV_CHAT_PHI3:
        fmt_tagged(msgs, n, "<|end|>\n", opts.no_system ? 2 : 1, o);
        gen = "<|assistant|>\n";
        break;
    case KV_CHAT_GEMMA:
        fmt_gemma(msgs, n, o);
        gen = "<start_of_turn>model\n";
        break;
    case KV_CHAT_GEMMA4:
        fmt_gemma4(msgs, n, o);
        gen = "<|turn>model\n<|channel>thought\n<channel|>"; /* thinking off, as the template's default */
        break;
    case KV_CHAT_COMMAND_R:
        fmt_command_r(msgs, n, o);
        gen = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
        break;
    case KV_CHAT_DEEPSEEK_R1:
        fmt_deepseek(msgs, n, o);
        gen = opts.think ? "<｜Assistant｜><think>\n" : "<｜Assistant｜>";
        break;
    default:
        fmt_plain(msgs, n, o);
        gen = "Assistant:";
        break;
    }
    if (add_generation_prompt) put_t(o, gen);
    else if (opts.eos_without_gen) put_t(o, "<|endoftext|>");
    return o->n > (size_t)INT32_MAX ? KV_ERR_RANGE : 0;
}

int kv_chat_format(kv_chat_tmpl t, const char *template_text, const kv_chat_msg *msgs, int n,
                   int add_generation_prompt, char *out, size_t cap) {
    return kv_chat_format_ex(t, template_text, 1, msgs, n, add_generation_prompt, out, cap);
}

int kv_chat_format_ex(kv_chat_tmpl t, const char *template_text, int default_system, const kv_chat_msg *msgs,
                      int n, int add_generation_prompt, char *out, size_t cap) {
    if (!out && cap > 0) return KV_ERR_INVAL;
    out_buf o = {out, cap ? cap - 1 : 0, 0, NULL, 0, 0};
    int rc = render(t, template_text, default_system, msgs, n, add_generation_prompt, &o);
    if (rc) return rc;
    if (cap > 0) out[KV_MIN(o.n, cap - 1)] = 0;
    return (int)o.n;
}

void kv_chat_tok_defaults(kv_chat_tok_params *p) {
    memset(p, 0, sizeof *p);
    p->add_generation_prompt = 1;
    p->add_bos = 1;
}

int kv_chat_tokenize(kv_chat_tmpl t, const char *template_text, const kv_tokenizer *tok, const kv_chat_msg *msgs,
                     int n, const kv_chat_tok_params *p, int32_t *out, int cap, kv_err *err) {
    if (!tok || !p || cap < 0 || (!out && cap > 0))
        return kv_err_set(err, KV_ERR_INVAL, "chat: bad tokenize arguments");
    /* Measure, then render the text and its template ranges for real. */
    out_buf o = {NULL, 0, 0, NULL, 0, 0};
    int rc = render(t, template_text, p->default_system, msgs, n, p->add_generation_prompt, &o);
    if (rc) return kv_err_set(err, rc, "chat: cannot render the conversation in the %s template (%s)",
                              kv_chat_tmpl_name(t), rc == KV_ERR_INVAL ? "a message has no role or no text" : "too long");
    char *text = malloc(o.n + 1);
    kv_tok_span *spans = malloc((size_t)(o.n_spans > 0 ? o.n_spans : 1) * sizeof *spans);
    if (!text || !spans) {
        free(text);
        free(spans);
        return kv_err_set(err, KV_ERR_NOMEM, "chat: out of memory rendering %zu bytes", o.n);
    }
    out_buf f = {text, o.n, 0, spans, o.n_spans, 0};
    render(t, template_text, p->default_system, msgs, n, p->add_generation_prompt, &f);
    text[f.n] = 0;
    kv_encode_opts eo = {
        .add_bos = p->add_bos && kv_tokenizer_add_bos(tok) && kv_tokenizer_bos(tok) >= 0,
        .parse_special = p->parse_special,
        .special = spans,
        .n_special = f.n_spans,
        .max_tokens = p->max_tokens,
    };
    rc = kv_tokenizer_encode_ex(tok, text, f.n, &eo, out, cap, err);
    free(text);
    free(spans);
    return rc;
}
