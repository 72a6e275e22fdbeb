/* runner.h - one sequence through the forward pass with its own small paged
 * cache (identity block table): the shortest path from a prompt to logits.
 * Perplexity evaluation (it needs every position's raw logits) and
 * kernel-level tests use it; generation, in every front end, goes through
 * the engine (engine.h), where sampling and stop rules live once. */
#ifndef KV_RUNNER_H
#define KV_RUNNER_H

#include "../base/common.h"
#include "forward.h"
#include "model.h"

typedef struct kv_runner kv_runner;

/* Creates a runner for sequences of up to max_ctx tokens (<= model context),
 * prefilling at most chunk tokens per forward. The model and backend are
 * borrowed. */
kv_runner *kv_runner_new(const kv_model *m, kv_backend *b, int max_ctx, int chunk, kv_cache_dtype dtype,
                         kv_err *err);
void kv_runner_free(kv_runner *r);
/* Forgets the sequence (position back to 0). */
void kv_runner_reset(kv_runner *r);
/* Keeps the first n tokens (n <= position): later evals overwrite the rest,
 * so a chat can re-use the cached part of a conversation. */
void kv_runner_truncate(kv_runner *r, int n);
int kv_runner_pos(const kv_runner *r);
int kv_runner_max_ctx(const kv_runner *r);
/* Appends n tokens. When all_logits is NULL the logits of the last token go
 * to logits (n_vocab floats); otherwise the logits of every token go to
 * all_logits (n * n_vocab floats) and logits may be NULL. Fails with
 * KV_ERR_RANGE (nothing changed) when the context would overflow, and with
 * KV_ERR_BACKEND (err naming the backend's failed op, see kv_forward_run)
 * when a backend op failed: the position then stays after the last chunk
 * that worked, so the failed tokens can be evaluated again. */
int kv_runner_eval(kv_runner *r, const int32_t *tokens, int n, float *logits, float *all_logits, kv_err *err);
/* Bytes of the runner's KV cache and activations. */
uint64_t kv_runner_bytes(const kv_runner *r);

#endif
