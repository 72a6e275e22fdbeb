/* test_chat_jinja.c - kvtop's hand-written chat formats against the real
 * Jinja templates, rendered by jinja2 as Hugging Face's apply_chat_template
 * does (tools/render_chat_template.py): the templates in
 * ../shared/vocab/templates, the ones that llama.cpp's vocab test files
 * carry (Qwen 2, Qwen 3.5, Gemma 4, Command-R, Phi-3; tools/vocab_fetch.sh,
 * under build/llama-vocab) and SmolLM2's in models/ (Gemma 3 270M, a
 * base model, has none).
 * For every template: the detected format, then five conversations whose
 * kv_chat_format text must equal the Jinja text (less a leading BOS, which
 * kvtop leaves to the tokenizer). A conversation the template refuses
 * (Gemma 2's has no system role) is skipped. Without python3 + jinja2, or
 * without a template's file, that part says so and is skipped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine_helpers.h"
#include "../harness.h"
#include "../../engine/chat_template.h"
#include "../../engine/gguf.h"
#include "../../engine/json.h"
#include "../../engine/tokenizer.h"

typedef struct conv {
    const char *name;
    kv_chat_msg m[4];
    int n, gen;
} conv;

static const conv convs[] = {
    {"system+user+assistant", {{"system", "You are terse."}, {"user", "Hi there"}, {"assistant", "Hello!"}}, 3, 0},
    {"user, generation prompt", {{"user", "Hi there"}}, 1, 1},
    {"system+user+assistant+user",
     {{"system", "You are terse."}, {"user", "Hi there"}, {"assistant", "Hello! How can I help?"},
      {"user", "What is 2+2?"}},
     4, 1},
    {"user+assistant+user", {{"user", "Name a colour."}, {"assistant", "Blue."}, {"user", "Another."}}, 3, 1},
    {"padded contents", {{"user", "  Tell me\n"}, {"assistant", " Sure. "}, {"user", "Why?\n\n"}}, 3, 1},
};

/* A template source: a .jinja file (with the family's BOS/EOS texts) or a
 * GGUF file (template and BOS/EOS from its tokenizer). */
typedef struct source {
    const char *label;
    const char *path; /* filled in at run time */
    int is_gguf;
    const char *bos, *eos;
    kv_chat_tmpl want;
} source;

static int have_jinja(void) {
    return system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0;
}

/* The Jinja rendering of c in tmpl, less one leading bos, into a malloc'd
 * string; NULL when the template refuses the conversation (*refused = 1)
 * or the renderer fails. */
static char *jinja_render(const char *tmpl, const conv *c, const char *bos, const char *eos, int *refused) {
    *refused = 0;
    const char *req = harness_tmp_path("chat_jinja", "req", ".json");
    FILE *f = fopen(req, "w");
    if (!f) return NULL;
    kv_json_writer w;
    kv_json_writer_init(&w, f, 0);
    kv_json_write_begin_object(&w);
    kv_json_write_key(&w, "template");
    kv_json_write_string(&w, tmpl);
    kv_json_write_key(&w, "messages");
    kv_json_write_begin_array(&w);
    for (int i = 0; i < c->n; i++) {
        kv_json_write_begin_object(&w);
        kv_json_write_key(&w, "role");
        kv_json_write_string(&w, c->m[i].role);
        kv_json_write_key(&w, "content");
        kv_json_write_string(&w, c->m[i].content);
        kv_json_write_end_object(&w);
    }
    kv_json_write_end_array(&w);
    kv_json_write_key(&w, "add_generation_prompt");
    kv_json_write_bool(&w, c->gen);
    kv_json_write_key(&w, "bos_token");
    kv_json_write_string(&w, bos);
    kv_json_write_key(&w, "eos_token");
    kv_json_write_string(&w, eos);
    kv_json_write_end_object(&w);
    int bad = kv_json_writer_finish(&w);
    if (fclose(f) != 0 || bad) return NULL;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 tools/render_chat_template.py '%s' 2>/dev/null", req);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    while (out && n + 1 < cap) {
        size_t k = fread(out + n, 1, cap - 1 - n, p);
        if (k == 0) break;
        n += k;
    }
    int st = pclose(p);
    unlink(req);
    if (!out) return NULL;
    out[n] = 0;
    if (st != 0) {
        *refused = WIFEXITED(st) && WEXITSTATUS(st) == 2;
        free(out);
        return NULL;
    }
    size_t bl = strlen(bos);
    if (bl && strstr(tmpl, "bos_token") && n >= bl && !memcmp(out, bos, bl)) memmove(out, out + bl, n - bl + 1);
    return out;
}

/* Text of a tokenizer's id, or "" (for a BOS/EOS the vocab lacks). */
static const char *tok_or_empty(const kv_tokenizer *t, int32_t id) {
    const char *s = id >= 0 ? kv_tokenizer_token_text(t, id) : NULL;
    return s ? s : "";
}

/* The ids the engine gets for c (kv_chat_tokenize: markers special,
 * contents plain) are those of the Jinja text encoded with special tokens
 * parsed, as llama.cpp would (these contents hold no special text). */
static void check_ids(const kv_tokenizer *t, kv_chat_tmpl kind, const char *tmpl, const conv *c, const char *jinja,
                      const char *label) {
    kv_chat_tok_params p;
    kv_chat_tok_defaults(&p);
    p.default_system = 1;
    p.add_generation_prompt = c->gen;
    static int32_t a[2048], b[2048];
    kv_err err = {0};
    int na = kv_chat_tokenize(kind, tmpl, t, c->m, c->n, &p, a, 2048, &err);
    int add_bos = kv_tokenizer_add_bos(t) && kv_tokenizer_bos(t) >= 0;
    int nb = kv_tokenizer_encode(t, jinja, strlen(jinja), add_bos, 1, b, 2048, &err);
    CHECKF(na > 0 && na == nb && na <= 2048 && !memcmp(a, b, (size_t)na * sizeof *a),
           "%s, %s: kv_chat_tokenize gives %d ids, the Jinja text %d", label, c->name, na, nb);
}

static void check_source(const source *s) {
    char *file_text = NULL;
    kv_tokenizer *t = NULL;
    const char *tmpl, *bos = s->bos, *eos = s->eos;
    if (s->is_gguf) {
        kv_err err = {0};
        t = test_gguf_tokenizer(s->path, &err);
        CHECKF(t != NULL, "%s: %s", s->path, err.msg);
        if (!t) return;
        tmpl = kv_tokenizer_chat_template(t);
        bos = tok_or_empty(t, kv_tokenizer_bos(t));
        eos = tok_or_empty(t, kv_tokenizer_eos(t));
    } else {
        tmpl = file_text = harness_read_file(s->path, NULL);
    }
    CHECKF(tmpl != NULL, "%s: no chat template", s->label);
    if (!tmpl) goto done;
    kv_chat_tmpl kind = kv_chat_detect(tmpl);
    CHECKF(kind == s->want, "%s: detected %s, want %s", s->label, kv_chat_tmpl_name(kind), kv_chat_tmpl_name(s->want));
    int same = 0, refused = 0;
    for (size_t i = 0; i < KV_ARRAY_LEN(convs); i++) {
        const conv *c = &convs[i];
        int no;
        char *want = jinja_render(tmpl, c, bos, eos, &no);
        if (!want) {
            CHECKF(no, "%s, %s: the Jinja renderer failed", s->label, c->name);
            refused += no;
            continue;
        }
        char got[4096];
        int n = kv_chat_format_ex(kind, tmpl, 1, c->m, c->n, c->gen, got, sizeof got);
        CHECKF(n >= 0 && !strcmp(got, want), "%s, %s:\n    kvtop [%s]\n    jinja [%s]", s->label, c->name,
               n >= 0 ? got : "(error)", want);
        same += n >= 0 && !strcmp(got, want);
        if (t) check_ids(t, kind, tmpl, c, want, s->label);
        free(want);
    }
    printf("  %s (%s): %d/%zu conversations as the Jinja template renders them%s\n", s->label,
           kv_chat_tmpl_name(kind), same, KV_ARRAY_LEN(convs) - (size_t)refused,
           refused ? " (the rest refused by the template)" : "");
done:
    free(file_text);
    kv_tokenizer_free(t);
}

static void test_templates_match_jinja(void) {
    if (!have_jinja()) {
        printf("  skipped: python3 with jinja2 not available (pip install jinja2)\n");
        return;
    }
    const char *vd = getenv("KVTOP_VOCAB_DIR");
    if (!vd || !*vd) vd = "build/llama-vocab";
    static char paths[16][4096 + 64];
    source srcs[] = {
        {"Qwen 2.5", "vocab/templates/Qwen-Qwen2.5-7B-Instruct.jinja", 0, "", "<|im_end|>", KV_CHAT_CHATML},
        {"Llama 3.1", "vocab/templates/meta-llama-Llama-3.1-8B-Instruct.jinja", 0, "<|begin_of_text|>", "<|eot_id|>",
         KV_CHAT_LLAMA3},
        {"Gemma 2", "vocab/templates/google-gemma-2-2b-it.jinja", 0, "<bos>", "<eos>", KV_CHAT_GEMMA},
        {"Phi-3.5", "vocab/templates/microsoft-Phi-3.5-mini-instruct.jinja", 0, "<s>", "<|endoftext|>",
         KV_CHAT_PHI3},
        {"DeepSeek-R1 (Llama)", "vocab/templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", 0,
         "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", KV_CHAT_DEEPSEEK_R1},
        {"Phi-3 (GGUF)", "vocab/ggml-vocab-phi-3.gguf", 1, NULL, NULL, KV_CHAT_PHI3},
        {"Qwen 2 (GGUF)", "@ggml-vocab-qwen2.gguf", 1, NULL, NULL, KV_CHAT_CHATML},
        {"Qwen 3.5 (GGUF)", "@ggml-vocab-qwen35.gguf", 1, NULL, NULL, KV_CHAT_CHATML},
        {"Gemma 4 (GGUF)", "@ggml-vocab-gemma-4.gguf", 1, NULL, NULL, KV_CHAT_GEMMA4},
        {"Command-R (GGUF)", "@ggml-vocab-command-r.gguf", 1, NULL, NULL, KV_CHAT_COMMAND_R},
        {"SmolLM2", "=models/SmolLM2-135M-Instruct.Q4_1.gguf", 1, NULL, NULL, KV_CHAT_CHATML},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(srcs); i++) {
        source *s = &srcs[i];
        const char *rel = s->path;
        if (rel[0] == '@') snprintf(paths[i], sizeof paths[i], "%s/%s", vd, rel + 1);
        else if (rel[0] == '=') snprintf(paths[i], sizeof paths[i], "%s", rel + 1);
        else snprintf(paths[i], sizeof paths[i], "%s", harness_shared_path(rel));
        s->path = paths[i];
        if (!harness_present(s->path, rel[0] == '@' ? "tools/vocab_fetch.sh" : "make models")) continue;
        check_source(s);
    }
}

/* Generation stops at the end of a turn: the format's end-of-turn text is
 * one token of the vocab, and that token ends generation. */
static void test_end_of_turn_is_eog(void) {
    const char *vd = getenv("KVTOP_VOCAB_DIR");
    if (!vd || !*vd) vd = "build/llama-vocab";
    const struct {
        const char *file; /* "@" under the vocab dir, "=" as is, else under ../shared */
        kv_chat_tmpl kind;
    } cases[] = {
        {"@ggml-vocab-qwen2.gguf", KV_CHAT_CHATML},     {"@ggml-vocab-qwen35.gguf", KV_CHAT_CHATML},
        {"@ggml-vocab-llama-bpe.gguf", KV_CHAT_LLAMA3}, {"vocab/ggml-vocab-phi-3.gguf", KV_CHAT_PHI3},
        {"@ggml-vocab-gemma-4.gguf", KV_CHAT_GEMMA4},   {"@ggml-vocab-command-r.gguf", KV_CHAT_COMMAND_R},
        {"=models/gemma-3-270m-Q4_K_M.gguf", KV_CHAT_GEMMA},
        {"=models/SmolLM2-135M-Instruct.Q4_1.gguf", KV_CHAT_CHATML},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        char path[4096 + 64];
        const char *f = cases[i].file;
        if (f[0] == '@') snprintf(path, sizeof path, "%s/%s", vd, f + 1);
        else if (f[0] == '=') snprintf(path, sizeof path, "%s", f + 1);
        else snprintf(path, sizeof path, "%s", harness_shared_path(f));
        if (!harness_present(path, f[0] == '@' ? "tools/vocab_fetch.sh" : "make models")) continue;
        kv_err err = {0};
        kv_tokenizer *t = test_gguf_tokenizer(path, &err);
        CHECKF(t != NULL, "%s: %s", path, err.msg);
        if (!t) continue;
        const char *eot = kv_chat_end_of_turn(cases[i].kind);
        int32_t ids[8];
        int n = kv_tokenizer_encode(t, eot, strlen(eot), 0, 1, ids, 8, &err);
        CHECKF(n == 1 && kv_tokenizer_is_eog(t, ids[0]), "%s: %s is %d tokens%s", path, eot, n,
               n == 1 ? ", not an end-of-generation one" : "");
        kv_tokenizer_free(t);
    }
}

TEST_MAIN(T(test_templates_match_jinja), T(test_end_of_turn_is_eog))
