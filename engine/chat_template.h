/* chat_template.h - turns a conversation into the prompt text an instruct
 * model was trained on. The format is recognised from the model's Jinja
 * tokenizer.chat_template (ChatML, Llama 2, Mistral, Llama 3, Zephyr, Gemma,
 * Gemma 4, Phi-3, DeepSeek-R1, Command-R) and rendered by hand-written C, not by a Jinja
 * interpreter; a plain "User: ...\nAssistant:" format covers the rest.
 *
 * A prompt goes to the model as kv_chat_tokenize's ids: the template's own
 * markers ("<|im_start|>", "[INST]", "<|eot_id|>", ...) become special
 * tokens and every message's text stays plain text, so a user typing
 * "<|im_end|><|im_start|>system" gets those characters, not a forged turn.
 * kv_chat_format gives the same prompt as text, for display and tests;
 * encoding that text with parse_special on would parse the messages too.
 * A BOS the template would emit first is left to the tokenizer. */
#ifndef KV_CHAT_TEMPLATE_H
#define KV_CHAT_TEMPLATE_H

#include <stddef.h>

#include "../base/common.h"
#include "tokenizer.h"

typedef enum kv_chat_tmpl {
    KV_CHAT_PLAIN = 0,  /* system text, "User: ...\n", "Assistant: ...\n", generation prompt "Assistant:" */
    KV_CHAT_CHATML,     /* <|im_start|>role\n...<|im_end|>\n (Qwen, SmolLM, ...) */
    KV_CHAT_LLAMA2,     /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s><s>[INST] ... */
    KV_CHAT_MISTRAL,    /* [INST]...[/INST]...</s> (Mistral v3-tekken / Nemo, no spaces) */
    KV_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    KV_CHAT_ZEPHYR,     /* <|user|>\n...</s>\n */
    KV_CHAT_GEMMA,      /* <start_of_turn>user\n...<end_of_turn>\n, "model" for the assistant */
    KV_CHAT_PHI3,       /* <|user|>\n...<|end|>\n */
    KV_CHAT_DEEPSEEK_R1, /* <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜> */
    KV_CHAT_GEMMA4,     /* <|turn>role\n...<turn|>\n, "model" for the assistant, thinking off */
    KV_CHAT_COMMAND_R   /* <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|> (Cohere) */
} kv_chat_tmpl;

typedef struct kv_chat_msg {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content; /* NUL-terminated UTF-8 */
} kv_chat_msg;

/* Recognises a format from a Jinja template text (tokenizer.chat_template),
 * or from a format name ("chatml", "llama2", "mistral", "llama3", "zephyr",
 * "gemma", "gemma4", "phi3", "deepseek-r1", "command-r", "plain"). NULL, "" or anything
 * unrecognised gives KV_CHAT_PLAIN. */
kv_chat_tmpl kv_chat_detect(const char *template_text);
/* Same for text that is not NUL-terminated (a GGUF string). */
kv_chat_tmpl kv_chat_detect_n(const char *template_text, size_t len);

/* Format name ("chatml", ...). */
const char *kv_chat_tmpl_name(kv_chat_tmpl t);
/* Text that ends an assistant turn ("<|im_end|>", "<|eot_id|>", ...; "\n"
 * for plain): a stop string for models whose end marker is not a single
 * end-of-generation token. */
const char *kv_chat_end_of_turn(kv_chat_tmpl t);

/* The system message template_text injects when a conversation has none
 * (SmolLM2's "You are a helpful AI assistant named SmolLM, ...", Qwen
 * 2.5's), read from the string literal that holds a whole ChatML system
 * turn. Writes it NUL-terminated (cut to cap) and returns its length, or 0
 * when the template has none. */
size_t kv_chat_default_system(const char *template_text, char *out /* OUT: (cap) */, size_t cap);

/* Renders n messages (roles system/user/assistant) in format t and, with
 * add_generation_prompt, the opening of the assistant's reply.
 * template_text (may be NULL) supplies what the template adds on its own:
 * a default system message (ChatML), Llama 3.1's "Cutting Knowledge Date"
 * system header, DeepSeek-R1's "<think>" opening. Writes at most cap bytes
 * including a terminating NUL (when cap > 0) and returns the full length
 * excluding the NUL, like snprintf: a result >= cap means the output was
 * cut; out may be NULL with cap 0 to measure. Returns KV_ERR_INVAL for an
 * unknown role, a NULL content or bad arguments. */
int kv_chat_format(kv_chat_tmpl t, const char *template_text, const kv_chat_msg *msgs, int n,
                   int add_generation_prompt, char *out /* OUT: (cap), may be NULL */, size_t cap);
/* Same, choosing whether the template's default system message is used
 * when the conversation has none (default_system = 0 leaves it out, as
 * llama.cpp's chat formatting does; the front ends do this so a session's
 * system prompt is only ever what the user set). */
int kv_chat_format_ex(kv_chat_tmpl t, const char *template_text, int default_system, const kv_chat_msg *msgs,
                      int n, int add_generation_prompt, char *out /* OUT: (cap), may be NULL */, size_t cap);

/* How kv_chat_tokenize encodes; kv_chat_tok_defaults gives the usual. */
typedef struct kv_chat_tok_params {
    int default_system;        /* bool: the template's default system message when there is none
                                  (kv_chat_format_ex); default 0 */
    int add_generation_prompt; /* bool: end with the opening of the assistant's reply; default 1 */
    int add_bos;               /* bool: BOS first when the tokenizer asks for one (kv_tokenizer_add_bos)
                                  and has one; default 1 */
    int parse_special;         /* bool: the opt-in for trusted input: special-token texts inside the
                                  messages become control tokens too; default 0 (plain text) */
    int max_tokens;            /* > 0: the most ids wanted; a longer prompt fails with KV_ERR_RANGE after
                                  work bounded by this (kv_encode_opts.max_tokens); default 0: no limit */
} kv_chat_tok_params;

void kv_chat_tok_defaults(kv_chat_tok_params *p /* OUT: */);

/* The prompt ids of n messages in format t (template_text as for
 * kv_chat_format_ex): what kv_chat_format_ex renders, encoded by tok with
 * the template's own text (markers, role names, separators, its default
 * system message) matched for special tokens and the messages' content
 * (system, user and assistant alike) as plain text, unless
 * p->parse_special. For a conversation whose messages hold no special-token
 * text the ids are those of encoding the rendered text with parse_special
 * on. Writes up to cap ids to out and returns the total count (> cap: call
 * again with a bigger buffer; a caller with max_tokens set can size out by
 * it and call once), or a negative KV_ERR_* with err filled: KV_ERR_INVAL
 * for an unknown role or a NULL content, KV_ERR_RANGE when over
 * max_tokens. */
int kv_chat_tokenize(kv_chat_tmpl t, const char *template_text, const kv_tokenizer *tok, const kv_chat_msg *msgs,
                     int n, const kv_chat_tok_params *p, int32_t *out /* OUT: (cap) ids */, int cap, kv_err *err);

#endif
