/* test_chat_template.c - chat format detection on the real Jinja templates
 * in ../shared/vocab/templates (and SmolLM2's, Phi-3's, Zephyr's, Llama 2's),
 * and rendering of the same conversations in every format against
 * hand-written expected strings (read off the Jinja templates). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine_helpers.h"
#include "../harness.h"
#include "../../engine/chat_template.h"
#include "../../engine/gguf.h"
#include "../../engine/tokenizer.h"

static char *read_template(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "vocab/templates/%s", name);
    FILE *f = fopen(harness_shared_path(rel), "rb");
    if (!f) return NULL;
    static char buf[8][16384];
    static int slot;
    char *b = buf[slot++ % 8];
    size_t n = fread(b, 1, sizeof buf[0] - 1, f);
    fclose(f);
    b[n] = 0;
    return b;
}

/* Templates as published with the models (HF tokenizer_config.json). */
static const char *const smollm2_tmpl =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
static const char *const zephyr_tmpl =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";
static const char *const llama2_tmpl =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
    "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}";

typedef struct tmpl_case {
    const char *file;    /* under vocab/templates, or NULL with text */
    const char *text;
    kv_chat_tmpl want;
} tmpl_case;

static void test_detect_real_templates(void) {
    const tmpl_case cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", NULL, KV_CHAT_CHATML},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", NULL, KV_CHAT_DEEPSEEK_R1},
        {"google-gemma-2-2b-it.jinja", NULL, KV_CHAT_GEMMA},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", NULL, KV_CHAT_LLAMA3},
        {"microsoft-Phi-3.5-mini-instruct.jinja", NULL, KV_CHAT_PHI3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", NULL, KV_CHAT_MISTRAL},
        {NULL, smollm2_tmpl, KV_CHAT_CHATML},
        {NULL, zephyr_tmpl, KV_CHAT_ZEPHYR},
        {NULL, llama2_tmpl, KV_CHAT_LLAMA2},
        {NULL, "chatml", KV_CHAT_CHATML},
        {NULL, "llama3", KV_CHAT_LLAMA3},
        {NULL, "{{ messages }}", KV_CHAT_PLAIN},
        {NULL, "", KV_CHAT_PLAIN},
        {NULL, NULL, KV_CHAT_PLAIN},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        const char *text = cases[i].file ? read_template(cases[i].file) : cases[i].text;
        if (cases[i].file) CHECKF(text != NULL, "cannot read %s", cases[i].file);
        kv_chat_tmpl got = kv_chat_detect(text);
        CHECKF(got == cases[i].want, "case %zu (%s): detected %s, want %s", i, cases[i].file ? cases[i].file : "",
               kv_chat_tmpl_name(got), kv_chat_tmpl_name(cases[i].want));
    }
    /* Phi-3's own GGUF template (an older form without system support). */
    kv_err err = {0};
    kv_tokenizer *t = test_gguf_tokenizer(harness_shared_path("vocab/ggml-vocab-phi-3.gguf"), &err);
    REQUIRE(t);
    CHECK(kv_chat_detect(kv_tokenizer_chat_template(t)) == KV_CHAT_PHI3);
    kv_tokenizer_free(t);
    CHECK(!strcmp(kv_chat_tmpl_name(KV_CHAT_CHATML), "chatml"));
    CHECK(!strcmp(kv_chat_end_of_turn(KV_CHAT_LLAMA3), "<|eot_id|>"));
}

static void test_default_system_prompt(void) {
    char buf[256];
    size_t n = kv_chat_default_system(smollm2_tmpl, buf, sizeof buf);
    CHECKF(n > 0 && !strcmp(buf, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"), "[%s]", buf);
    n = kv_chat_default_system(read_template("Qwen-Qwen2.5-7B-Instruct.jinja"), buf, sizeof buf);
    CHECKF(n > 0 && !strcmp(buf, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."), "[%s]", buf);
    CHECK(kv_chat_default_system(zephyr_tmpl, buf, sizeof buf) == 0 && buf[0] == 0);
    CHECK(kv_chat_default_system(NULL, buf, sizeof buf) == 0);
    /* Cut to the buffer, full length returned. */
    char small[8];
    CHECK(kv_chat_default_system(smollm2_tmpl, small, sizeof small) == 68 && !strcmp(small, "You are"));
}

/* Conversations: A = system, user, assistant (no generation prompt);
 * B = one user message + generation prompt (template defaults apply);
 * C = system, user, assistant, user + generation prompt. */
static const kv_chat_msg conv_c[] = {
    {"system", "You are terse."},
    {"user", "Hi there"},
    {"assistant", "Hello! How can I help?"},
    {"user", "What is 2+2?"},
};
static const kv_chat_msg conv_b[] = {{"user", "Hi there"}};

typedef struct fmt_case {
    const char *name;
    kv_chat_tmpl kind;
    const char *tmpl; /* template text (for defaults), or NULL */
    const char *a, *b, *c;
} fmt_case;

static void check_fmt(const fmt_case *fc, const kv_chat_msg *m, int n, int agp, const char *want, const char *which) {
    char out[2048];
    int len = kv_chat_format(fc->kind, fc->tmpl, m, n, agp, out, sizeof out);
    CHECKF(len == (int)strlen(want) && !strcmp(out, want), "%s conversation %s:\n    got  [%s]\n    want [%s]",
           fc->name, which, len >= 0 ? out : "(error)", want);
    /* Measuring call agrees, and a short buffer is cut and terminated. */
    CHECK(kv_chat_format(fc->kind, fc->tmpl, m, n, agp, NULL, 0) == len);
    char small[5];
    CHECK(kv_chat_format(fc->kind, fc->tmpl, m, n, agp, small, sizeof small) == len && strlen(small) == 4 &&
          !strncmp(small, want, 4));
}

static void test_format_conversations(void) {
    const char *qwen = read_template("Qwen-Qwen2.5-7B-Instruct.jinja");
    const char *l31 = read_template("meta-llama-Llama-3.1-8B-Instruct.jinja");
    const char *phi = read_template("microsoft-Phi-3.5-mini-instruct.jinja");
    const char *ds = read_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja");
    REQUIRE(qwen && l31 && phi && ds);
    const fmt_case cases[] = {
        {"chatml (Qwen 2.5)", KV_CHAT_CHATML, qwen,
         "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
         "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n",
         "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
         "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
         "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
         "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
         "<|im_start|>assistant\n"},
        {"chatml (SmolLM2)", KV_CHAT_CHATML, smollm2_tmpl,
         "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
         "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n",
         "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
         "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
         NULL},
        {"chatml (no template text)", KV_CHAT_CHATML, NULL, NULL,
         "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", NULL},
        {"llama3 (3.1)", KV_CHAT_LLAMA3, l31,
         "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul "
         "2024\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>",
         "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul "
         "2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\n",
         NULL},
        {"llama3 (3.0 style)", KV_CHAT_LLAMA3, NULL,
         "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user"
         "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I "
         "help?<|eot_id|>",
         "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant"
         "<|end_header_id|>\n\n",
         NULL},
        {"llama2", KV_CHAT_LLAMA2, llama2_tmpl,
         "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! How can I help? </s>",
         "[INST] Hi there [/INST]",
         "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! How can I help? </s>"
         "<s>[INST] What is 2+2? [/INST]"},
        {"mistral (Nemo)", KV_CHAT_MISTRAL, NULL,
         /* Nemo's template puts the system message before the last user
          * message only; with an assistant turn last it does not appear. */
         "[INST]Hi there[/INST]Hello! How can I help?</s>", "[INST]Hi there[/INST]",
         "[INST]Hi there[/INST]Hello! How can I help?</s>[INST]You are terse.\n\nWhat is 2+2?[/INST]"},
        {"zephyr", KV_CHAT_ZEPHYR, zephyr_tmpl,
         "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n<|assistant|>\nHello! How can I help?</s>\n",
         "<|user|>\nHi there</s>\n<|assistant|>\n",
         "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n<|assistant|>\nHello! How can I help?</s>\n"
         "<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n"},
        {"gemma", KV_CHAT_GEMMA, NULL,
         /* No system role in Gemma: it opens the first user turn. */
         "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello! How can I "
         "help?<end_of_turn>\n",
         "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
         "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello! How can I "
         "help?<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"},
        {"phi3 (3.5)", KV_CHAT_PHI3, phi,
         "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello! How can I help?<|end|>\n"
         "<|endoftext|>",
         "<|user|>\nHi there<|end|>\n<|assistant|>\n",
         "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello! How can I help?<|end|>\n"
         "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"},
        {"deepseek-r1", KV_CHAT_DEEPSEEK_R1, ds,
         "You are terse.<｜User｜>Hi there<｜Assistant｜>Hello! How can I help?<｜end▁of▁sentence｜>",
         "<｜User｜>Hi there<｜Assistant｜><think>\n",
         "You are terse.<｜User｜>Hi there<｜Assistant｜>Hello! How can I help?<｜end▁of▁sentence｜><｜User｜>What "
         "is 2+2?<｜Assistant｜><think>\n"},
        {"plain", KV_CHAT_PLAIN, NULL, "You are terse.\n\nUser: Hi there\nAssistant: Hello! How can I help?\n",
         "User: Hi there\nAssistant:",
         "You are terse.\n\nUser: Hi there\nAssistant: Hello! How can I help?\nUser: What is 2+2?\nAssistant:"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        const fmt_case *fc = &cases[i];
        if (fc->a) check_fmt(fc, conv_c, 3, 0, fc->a, "A");
        if (fc->b) check_fmt(fc, conv_b, 1, 1, fc->b, "B");
        if (fc->c) check_fmt(fc, conv_c, 4, 1, fc->c, "C");
    }
}

static void test_format_details(void) {
    char out[512];
    /* Gemma and Llama 3 trim contents (Jinja |trim); ChatML keeps them. */
    const kv_chat_msg m[] = {{"user", "  padded \n"}};
    kv_chat_format(KV_CHAT_GEMMA, NULL, m, 1, 1, out, sizeof out);
    CHECK(!strcmp(out, "<start_of_turn>user\npadded<end_of_turn>\n<start_of_turn>model\n"));
    kv_chat_format(KV_CHAT_CHATML, NULL, m, 1, 0, out, sizeof out);
    CHECK(!strcmp(out, "<|im_start|>user\n  padded \n<|im_end|>\n"));
    /* DeepSeek-R1 drops the reasoning of earlier answers. */
    const kv_chat_msg r[] = {{"user", "q"}, {"assistant", "<think>\nhmm\n</think>\n\nA."}};
    kv_chat_format(KV_CHAT_DEEPSEEK_R1, NULL, r, 2, 0, out, sizeof out);
    CHECKF(!strcmp(out, "<｜User｜>q<｜Assistant｜>\n\nA.<｜end▁of▁sentence｜>"), "[%s]", out);
    /* Bad input: unknown role, NULL content, bad arguments. */
    const kv_chat_msg bad_role[] = {{"tool", "x"}};
    const kv_chat_msg bad_content[] = {{"user", NULL}};
    strcpy(out, "unchanged");
    CHECK(kv_chat_format(KV_CHAT_CHATML, NULL, bad_role, 1, 1, out, sizeof out) == KV_ERR_INVAL);
    CHECK(kv_chat_format(KV_CHAT_CHATML, NULL, bad_content, 1, 1, out, sizeof out) == KV_ERR_INVAL);
    CHECK(kv_chat_format(KV_CHAT_CHATML, NULL, NULL, 1, 1, out, sizeof out) == KV_ERR_INVAL);
    CHECK(kv_chat_format(KV_CHAT_CHATML, NULL, m, -1, 1, out, sizeof out) == KV_ERR_INVAL);
    CHECK(!strcmp(out, "unchanged"));
    /* No messages: just the generation prompt (plus a default system). */
    CHECK(kv_chat_format(KV_CHAT_CHATML, NULL, NULL, 0, 1, out, sizeof out) == 22 &&
          !strcmp(out, "<|im_start|>assistant\n"));
}

/* The SmolLM2 GGUF's own template, when `make models` has fetched it: ChatML
 * with the SmolLM default system prompt, and the rendered prompt encodes to
 * single special tokens. */
static void test_smollm2_gguf(void) {
    if (!harness_present(TEST_SMOLLM2, "run make models")) return;
    kv_err err = {0};
    kv_tokenizer *t = test_gguf_tokenizer(TEST_SMOLLM2, &err);
    REQUIRE(t);
    const char *tmpl = kv_tokenizer_chat_template(t);
    CHECK(kv_chat_detect(tmpl) == KV_CHAT_CHATML);
    char out[1024];
    int n = kv_chat_format(KV_CHAT_CHATML, tmpl, conv_b, 1, 1, out, sizeof out);
    CHECKF(n > 0 && !strcmp(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                                 "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
           "[%s]", out);
    int32_t ids[128];
    int m = kv_tokenizer_encode(t, out, (size_t)n, kv_tokenizer_add_bos(t), 1, ids, 128, &err);
    int32_t ims = kv_tokenizer_find(t, "<|im_start|>"), ime = kv_tokenizer_find(t, "<|im_end|>");
    int n_start = 0, n_end = 0;
    for (int i = 0; i < m; i++) {
        n_start += ids[i] == ims;
        n_end += ids[i] == ime;
    }
    CHECK(m > 0 && ids[0] == ims && n_start == 3 && n_end == 2);
    kv_tokenizer_free(t);
}

TEST_MAIN(T(test_detect_real_templates), T(test_default_system_prompt), T(test_format_conversations),
          T(test_format_details), T(test_smollm2_gguf))
