/* workload.h - synthetic request streams for benchmarks, demos and the
 * TUI's load injection, built from kv_config.workload: when each request
 * arrives, how long its prompt and output are, whether it starts with the
 * shared system prompt, and its prompt text (English-looking synthetic
 * words, or lines of a JSONL prompts file).
 *
 * Determinism: the same workload settings give the same items and the same
 * token ids (for the same tokenizer) on every run. The generator is our own
 * (xoshiro256** seeded through splitmix64; rand() is never used) and each
 * aspect draws from its own stream, so changing one setting leaves the
 * others' draws alone: a different output_len keeps the arrival times and
 * prompt lengths, and request i's text depends only on (seed, i). Lognormal
 * and poisson draws go through libm's exp/log/cos, which glibc computes
 * identically across machines. */
#ifndef KV_WORKLOAD_H
#define KV_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"
#include "config.h"

typedef struct kv_workload kv_workload;

typedef struct kv_workload_item {
    double arrival_s;  /* seconds after the start: poisson = cumulative exponential gaps
                          (the first at 0), burst = 0, closed loop = 0 (see after_slot) */
    int after_slot;    /* closed loop: submit when one of the in-flight requests
                          finishes (the first `concurrency` items have 0: they start at once) */
    int prompt_tokens; /* the request's own prompt tokens, after the system prompt;
                          0 for a prompts_file item (its text, as the tokenizer cuts it) */
    int output_tokens; /* tokens to generate (exactly, with workload.ignore_eos) */
    int uses_system;   /* bool: starts with the shared system prompt */
    int system_tokens; /* tokens of that system prompt: workload.system_prompt_len or 0 */
    const char *text;  /* prompts_file item: its prompt (borrowed; lives as long as the
                          workload); NULL for synthetic prompts */
    int cls;           /* request class: KV_WORKLOAD_LONG, or KV_WORKLOAD_SHORT (workload.short_fraction
                          of them, drawn from their own stream, with the short_* lengths) */
    int priority;      /* the class's request priority (short: workload.short_priority; long: 0) */
} kv_workload_item;

/* Request classes (the starvation demo's short interactive requests among
 * long ones). */
enum { KV_WORKLOAD_LONG = 0, KV_WORKLOAD_SHORT = 1, KV_WORKLOAD_CLASSES = 2 };
/* "long", "short". */
const char *kv_workload_class_name(int cls);

/* Tokenizes text into out[0..cap); returns the number of ids written (at
 * most cap; ids past cap are dropped) or a negative error. It must not add
 * BOS or other special tokens: the caller puts BOS in front of the prompt
 * ids itself, so the shared system prompt ids are the same in every request. */
typedef int (*kv_tokenize_fn)(void *ctx, const char *text, int32_t *out, int cap);

/* Builds the request list from c->workload (checked first: the same range
 * checks as kv_config_validate). Reads workload.prompts_file when set (a
 * bad line is an error naming file:line:column). Returns NULL with err
 * filled on failure. */
kv_workload *kv_workload_build(const kv_config *c, kv_err *err);
void kv_workload_free(kv_workload *w); /* NULL is a no-op */

int kv_workload_count(const kv_workload *w);
/* Item i (borrowed, valid until kv_workload_free), or NULL when out of range. */
const kv_workload_item *kv_workload_get(const kv_workload *w, int i);
/* Closed loop: the number of requests kept in flight; 0 for open-loop arrivals. */
int kv_workload_concurrency(const kv_workload *w);

/* The exact prompt ids of item i: the system prompt's system_tokens ids
 * (identical for every request that uses it, so prefix sharing finds them),
 * then prompt_tokens ids of the request's own text (synthetic text is
 * generated, tokenized, extended until long enough and cut to the drawn
 * count; a prompts_file text is tokenized whole). Writes them to out[0..cap)
 * and returns their number, or a negative error (KV_ERR_RANGE when they do
 * not fit in cap). Tokenizes the system prompt again on every call. */
int kv_workload_tokens(const kv_workload *w, int i, kv_tokenize_fn tok, void *ctx, int32_t *out, int cap,
                       kv_err *err);

/* Exactly n token ids of synthetic English-looking text drawn from
 * text_seed: the text is generated, tokenized, and lengthened until it
 * gives at least n ids, then the ids are cut to n. Same seed and tokenizer,
 * same ids. Returns n, or a negative error (cap < n, a tokenizer error, or
 * a tokenizer that makes too few ids out of text). */
int kv_workload_exact_tokens(uint64_t text_seed, int n, kv_tokenize_fn tok, void *ctx, int32_t *out, int cap,
                             kv_err *err);

/* Writes item i's own prompt text (synthetic: about prompt_tokens tokens'
 * worth of words, the start of what kv_workload_tokens tokenizes; file: the
 * line's prompt) NUL-terminated into buf[0..cap), cut to fit. Returns the
 * full length (snprintf-style) or a negative error. For showing requests. */
int kv_workload_text(const kv_workload *w, int i, char *buf, size_t cap);
/* The shared system prompt's text: a fixed text, the same for every seed,
 * about system_prompt_len tokens' worth of words (the start of what
 * kv_workload_tokens tokenizes and cuts); "" when workload.system_prompt_len
 * is 0. Borrowed. */
const char *kv_workload_system_text(const kv_workload *w);

/* Parses a JSONL prompts file held in memory: one {"prompt": "..."} object
 * per line (other members are ignored; blank lines skipped; a UTF-8 BOM at
 * the start is skipped). `name` names the input in messages ("f.jsonl:3:9:
 * ..."). On success *out gets n malloc'ed strings (free with
 * kv_workload_free_prompts) and *n their number (0 when there are none).
 * On error nothing is allocated and *out, *n are unchanged. */
int kv_workload_parse_prompts(const char *buf, size_t len, const char *name, char ***out, int *n, kv_err *err);
void kv_workload_free_prompts(char **prompts, int n);

#endif
