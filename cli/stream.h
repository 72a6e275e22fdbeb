/* stream.h - one request through the engine, stepped on the caller's
 * thread, its text streamed to a FILE as the events arrive: what `kvtop
 * generate` and every turn of `kvtop chat` do. Sampling, the end-of-
 * generation check, stop strings and detokenizing are the engine's (one
 * decode loop for every front end); this only submits, steps and prints. */
#ifndef KV_CLI_STREAM_H
#define KV_CLI_STREAM_H

#include <stdio.h>

#include "../engine/chat_template.h"
#include "../engine/engine.h"
#include "../engine/tokenizer.h"

enum { CLI_DEFAULT_CTX = 4096 }; /* tokens of context when --ctx is not given (the model's when shorter) */

/* Sizes cfg for one conversation of ctx tokens (<= 0: CLI_DEFAULT_CTX):
 * scheduler.max_seq_len (the engine cuts it to the model's context) and a
 * KV cache of just enough blocks for it, whatever the model's bytes per
 * token; the workload keys (unused by one conversation) shrunk to fit.
 * NOTE: sized for the asked context, so a --ctx beyond the model's
 * reserves blocks nothing can use. */
void cli_size_for_context(kv_config *cfg, int ctx);
/* Tokens one request may span on e: scheduler.max_seq_len cut to the model's context. */
int cli_context(const kv_engine *e);
/* Prints to f, once, what the user should know about e before it runs:
 * the tokenizer's warning (an unknown pre-tokenizer and its fallback) and,
 * when asked_ctx (--ctx) is more than the model's context, that the
 * context was cut to it. "kvtop CMD: note: ..." lines. */
void cli_engine_notes(const char *cmd, const kv_engine *e, int asked_ctx, FILE *f);

/* Encodes a raw prompt with the model's BOS rule (a BOS when add_bos is
 * set, the vocabulary asks for one and has one); special-token texts such
 * as <|im_start|> become control tokens only with parse_special (the
 * --special opt-in), else they stay text. At most max_tokens ids (> 0): a
 * longer prompt fails fast, without encoding all of it, with KV_ERR_RANGE
 * and err "the prompt is longer than the context (more than N tokens)".
 * *ids is malloc'ed (free it). Returns 0, or a negative KV_ERR_*
 * (KV_ERR_INVAL when the text encodes to no tokens). */
int cli_encode(const kv_tokenizer *tok, const char *text, int add_bos, int parse_special, int max_tokens,
               int32_t **ids /* OUT: */, int *n /* OUT: */, kv_err *err);
/* The same for a conversation in the model's chat template
 * (kv_chat_tokenize: the template's markers special, the messages' text
 * plain unless parse_special; the template's default system message left
 * out, as llama.cpp's chat formatting does). */
int cli_encode_chat(const kv_model *m, const kv_chat_msg *msgs, int n_msgs, int add_bos, int parse_special,
                    int max_tokens, int32_t **ids /* OUT: */, int *n /* OUT: */, kv_err *err);

/* What one streamed request did. */
typedef struct cli_stream_result {
    kv_finish finish;      /* how it ended */
    char reason[128];      /* the engine's reason for an error; "" otherwise */
    int n_tokens;          /* tokens generated (an end-of-generation token included) */
    double prefill_s;      /* host seconds of the steps up to the first token (the prompt's forward passes) */
    double ttft_s;         /* engine clock: submission to the first token */
    double decode_s;       /* engine clock: the first token to the last */
    char *text;            /* the reply (malloc'ed, NUL-terminated) when asked for; NULL otherwise */
} cli_stream_result;

/* Submits p to e (whose background thread must not run), steps the engine
 * until the request is done and writes its text to out (NULL: nowhere) as
 * it comes, flushing after every event. With want_text the whole reply
 * also goes to r->text (free it). Returns 0 with *r filled, or a negative
 * KV_ERR_* with err naming the problem: the engine's reason when it refused
 * the request, failed it (KV_FINISH_ERROR) or a step failed; r->text is
 * then NULL. */
int cli_stream_run(kv_engine *e, const kv_request_params *p, FILE *out, int want_text,
                   cli_stream_result *r /* OUT: */, kv_err *err);

#endif
