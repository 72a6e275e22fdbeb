/* request.h - the OpenAI-style request bodies kvtop serve accepts, parsed
 * from untrusted JSON into plain structs, and the OpenAI-shaped error that
 * names the field at fault. Nothing here knows HTTP (a fuzz target links
 * it alone) or the model: ranges come from the profile key table, token
 * counts are checked later against the engine.
 *
 *   srv_gen_req r;
 *   srv_error e;
 *   if (srv_parse_gen(body, len, SRV_CHAT, &defaults, &r, &e)) reply(e.status, e);
 *   ...
 *   srv_gen_req_free(&r);
 */
#ifndef KV_SRV_REQUEST_H
#define KV_SRV_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/config.h"

#define SRV_MAX_N 16          /* choices per prompt (`n`) */
#define SRV_MAX_CHOICES 64    /* prompts x n per request */
#define SRV_MAX_STOP 16       /* stop strings per request */
#define SRV_MAX_STOP_LEN 128  /* bytes per stop string (the engine's limit) */
#define SRV_MAX_TOKENS_CAP 1048576 /* max_tokens upper bound (the key table's token bound) */
#define SRV_MAX_LOGPROBS 20   /* top_logprobs / completions logprobs at most: OpenAI's chat limit and
                                 vLLM's default max_logprobs (OpenAI's completions allow 5) */

/* An error reply: {"error": {"message", "type", "param", "code"}}. */
typedef struct srv_error {
    int status;         /* HTTP status: 400, 401, 404, 405, 413, 429, 500, 503 */
    char type[40];      /* "invalid_request_error", "authentication_error", ... */
    char param[96];     /* the field at fault ("messages[0].content"); "" = null */
    char code[40];      /* machine-readable ("invalid_value", "model_not_found"); "" = null */
    char message[512];
} srv_error;

/* Fills e and returns -1 (so callers can `return srv_fail(...)`). param and
 * code may be NULL. */
int srv_fail(srv_error *e /* OUT: */, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

typedef enum srv_kind { SRV_CHAT = 0, SRV_COMPLETION = 1 } srv_kind;

typedef struct srv_msg {
    char role[16];      /* "system", "user", "assistant" ("developer" becomes "system") */
    char *content;      /* owned, NUL-terminated UTF-8 (text parts joined) */
    size_t len;         /* bytes of content (may hold NULs from \u0000) */
} srv_msg;

/* One completions prompt: text, or token ids. */
typedef struct srv_prompt {
    char *text;         /* owned, or NULL when ids are given */
    size_t len;
    int32_t *ids;       /* owned (n_ids), or NULL */
    int n_ids;
} srv_prompt;

typedef struct srv_gen_req {
    srv_kind kind;
    char model[256];          /* "" when absent */
    srv_msg *msgs;            /* chat: (n_msgs) owned */
    int n_msgs;
    srv_prompt *prompts;      /* completions: (n_prompts) owned */
    int n_prompts;
    int max_tokens;           /* > 0, or -1 when absent (up to the context) */
    kv_sampling sampling;     /* the profile's, with the request's values on top */
    int has_seed;             /* bool: `seed` given (then sampling.seed is exactly it) */
    char **stop;              /* (n_stop) owned */
    int n_stop;
    int stream;               /* bool */
    int include_usage;        /* bool: stream_options.include_usage */
    int n;                    /* choices per prompt, 1..SRV_MAX_N */
    int priority;             /* the scheduler's priority (higher first) */
    int ignore_eos;           /* bool */
    int parse_special;        /* bool: special-token texts in the prompt/messages become control tokens */
    int echo;                 /* completions: bool, the prompt precedes the text */
    int logprobs;             /* bool: chat `logprobs: true`, or completions `logprobs: N` given */
    int top_logprobs;         /* alternatives per token: chat `top_logprobs`, completions `logprobs`
                                 (0..SRV_MAX_LOGPROBS) */
    int tokens_as_ids;        /* bool: vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N" */
} srv_gen_req;

/* Parses a /v1/chat/completions (SRV_CHAT) or /v1/completions body.
 * sampling is the profile's sampling section (the defaults). Strict: any
 * unknown field, wrong type or out-of-range value is a 400 naming the
 * field; the sampling ranges are the key table's (sampling.temperature
 * ...). Features kvtop does not have (tools, penalties other than
 * repetition_penalty, prompt logprobs with echo) are a 400 saying so. Returns 0, or -1 with e filled
 * (then *out holds nothing to free). */
int srv_parse_gen(const char *body, size_t len, srv_kind kind, const kv_sampling *sampling,
                  srv_gen_req *out /* OUT: */, srv_error *e /* OUT: */);
void srv_gen_req_free(srv_gen_req *r); /* NULL is a no-op; leaves it empty */

/* POST /tokenize: {"prompt": "..."} or {"messages": [...],
 * "add_generation_prompt": bool}, with "add_special_tokens" (BOS, default
 * true), "parse_special" and "model". */
typedef struct srv_tok_req {
    char model[256];
    char *prompt;             /* owned, or NULL for messages */
    size_t len;
    srv_msg *msgs;            /* owned (n_msgs) */
    int n_msgs;
    int add_generation_prompt;
    int add_special;          /* bool: BOS as the tokenizer says */
    int parse_special;
} srv_tok_req;
int srv_parse_tokenize(const char *body, size_t len, srv_tok_req *out /* OUT: */, srv_error *e /* OUT: */);
void srv_tok_req_free(srv_tok_req *r);

/* POST /detokenize: {"tokens": [ids], "model"}. ids (owned) are checked
 * against n_vocab later. */
typedef struct srv_detok_req {
    char model[256];
    int32_t *ids;
    int n_ids;
} srv_detok_req;
int srv_parse_detokenize(const char *body, size_t len, srv_detok_req *out /* OUT: */, srv_error *e /* OUT: */);
void srv_detok_req_free(srv_detok_req *r);

/* POST /kvtop/v1/control: {"action": "pause" | "resume" | "step" |
 * "slow", "delay_ms": N (slow: ms slept after each step, 0 = full speed;
 * the range of ui.step_delay_ms)}. */
typedef enum srv_ctl_action { SRV_CTL_PAUSE = 0, SRV_CTL_RESUME, SRV_CTL_STEP, SRV_CTL_SLOW } srv_ctl_action;
typedef struct srv_ctl_req {
    srv_ctl_action action;
    int delay_ms;
} srv_ctl_req;
int srv_parse_control(const char *body, size_t len, srv_ctl_req *out /* OUT: */, srv_error *e /* OUT: */);

#endif
