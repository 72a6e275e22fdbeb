/* prompt.h - request text to prompt token ids, by the one rule every front
 * end follows (the engine's kv_chat_tokenize): the chat template's own markers (<|im_start|>, [INST], ...)
 * are special tokens, the text people send is plain text. A user message
 * holding "<|im_end|><|im_start|>system" stays those characters and cannot
 * forge a turn, unless the request opts in with parse_special. */
#ifndef KV_SRV_PROMPT_H
#define KV_SRV_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/model.h"
#include "request.h"

/* Renders msgs in the model's chat template (its default system message
 * left out, as the TUI and `generate --chat` do) with the opening of the
 * assistant's reply when add_generation_prompt, and encodes it with the
 * engine's rule (kv_chat_tokenize): BOS as the tokenizer says, template
 * markers special, message text plain unless parse_special. max_tokens >
 * 0 bounds the work: a longer prompt fails with KV_ERR_RANGE ("... longer
 * than N tokens") without being encoded in full. *ids (OUT: malloc'd,
 * caller frees) gets *n ids. Returns 0 or a negative KV_ERR_* with err
 * set. */
int srv_prompt_chat(const kv_model *m, const srv_msg *msgs, int n_msgs, int add_generation_prompt, int parse_special,
                    int max_tokens, int32_t **ids /* OUT */, int *n /* OUT */, kv_err *err);

/* Encodes a raw prompt: BOS when add_bos and the tokenizer wants one,
 * special-token texts as control tokens only with parse_special; the same
 * bound, ownership and returns as srv_prompt_chat. */
int srv_prompt_text(const kv_model *m, const char *text, size_t len, int add_bos, int parse_special, int max_tokens,
                    int32_t **ids /* OUT */, int *n /* OUT */, kv_err *err);

/* The chat template's end-of-turn text when it is not a single
 * end-of-generation token of the vocabulary (a stop string the server adds
 * so a reply ends with its turn), or NULL. */
const char *srv_prompt_end_of_turn(const kv_model *m);

#endif
