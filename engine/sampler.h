/* sampler.h - turns logits into the next token: greedy, temperature, top-k,
 * top-p, min-p and repetition penalty, driven by a per-request seeded RNG so
 * a run is deterministic for a given seed. The distribution step is exposed
 * on its own for speculative decoding's rejection sampling. */
#ifndef KV_SAMPLER_H
#define KV_SAMPLER_H

#include <stdint.h>

#include "../base/common.h"
#include "config.h"

/* xoshiro256** state; seeded through splitmix64. */
typedef struct kv_rng {
    uint64_t s[4];
} kv_rng;

/* splitmix64: advances *state and returns a well-mixed 64-bit value. */
uint64_t kv_splitmix64(uint64_t *state);
void kv_rng_seed(kv_rng *r, uint64_t seed); /* state from splitmix64(seed) */
uint64_t kv_rng_next(kv_rng *r);
double kv_rng_uniform(kv_rng *r); /* [0, 1) */

/* Checks a kv_sampling's ranges; KV_ERR_INVAL with err naming the field. */
int kv_sampling_validate(const kv_sampling *p, kv_err *err);

/* Index of the largest logit (lowest index on ties). */
int32_t kv_argmax(const float *logits, int n);
/* 1 when p samples the plain argmax of the logits: greedy, with no
 * repetition penalty to change them (kv_sampler_sample then returns
 * kv_argmax of the row). */
int kv_sampling_plain_greedy(const kv_sampling *p);

/* Scratch for sampling over a vocabulary (sized once). */
typedef struct kv_sampler kv_sampler;
kv_sampler *kv_sampler_new(int n_vocab);
void kv_sampler_free(kv_sampler *s);

/* The distribution the sampler draws from: probs(n_vocab) after repetition
 * penalty over history, temperature, top-k, top-p and min-p (zeros outside
 * the kept set, sums to 1). Greedy (temperature 0) gives a one-hot vector. */
void kv_sampler_dist(kv_sampler *s, const kv_sampling *p, const float *logits,
                     const int32_t *history, int n_history, float *probs);
/* Draws a token for logits (not modified). Greedy is argmax after the
 * repetition penalty. */
int32_t kv_sampler_sample(kv_sampler *s, const kv_sampling *p, const float *logits,
                          const int32_t *history, int n_history, kv_rng *rng);
/* Log-probabilities of the raw model distribution: log-softmax of logits
 * (n_vocab, not modified; no penalty, temperature or truncation), computed
 * in double. Returns log p(token) (<= 0), and writes the n_top (0..n_vocab)
 * most likely tokens, most likely first, lower id first on ties (the order
 * kv_argmax picks), to top_token / top_logprob (OUT: (n_top) each; may be
 * NULL when n_top is 0). token must be in [0, n_vocab). One pass over the
 * vocabulary plus an insertion into the n_top best; allocates nothing. */
float kv_sampler_logprobs(const float *logits, int n_vocab, int32_t token, int n_top, int32_t *top_token /* OUT: */,
                          float *top_logprob /* OUT: */);
/* Draws an index from a normalised distribution. */
int32_t kv_sample_from(const float *probs, int n, kv_rng *rng);

#endif
