/* spec.h - speculative decoding inside the continuous-batching engine:
 * where drafts come from (a second model with the same vocabulary and its
 * own paged KV cache, the target's own first layers, or n-gram lookup in the
 * sequence's context), how the target's verification accepts them (longest
 * matching prefix for greedy, rejection sampling for sampled requests, so
 * the output distribution stays exactly the target's), and how each
 * sequence's draft length follows its recent acceptance.
 *
 * The engine drives it once per step:
 *   kv_spec_plan (before kv_sched_schedule: sets each decoding request's
 *   n_draft, ngram drafts their tokens) -> schedule -> kv_spec_draft (model
 *   drafts, batched over every speculating sequence, for exactly the drafts
 *   the scheduler kept) -> the target's batched forward -> kv_spec_verify per
 *   request -> kv_sched_update -> kv_spec_feedback.
 * Not thread-safe: the engine thread owns it. */
#ifndef KV_SPEC_H
#define KV_SPEC_H

#include <stdint.h>

#include "../base/common.h"
#include "config.h"
#include "kv_cache.h"
#include "model.h"
#include "sampler.h"
#include "scheduler.h"

/* Per-request speculative state, embedded in the engine's request. Plain
 * data; kv_spec_seq_init before use, kv_spec_seq_free at the end. */
typedef struct kv_spec_seq {
    /* adaptive control */
    int k;              /* draft length for the next verify, 1..spec.k */
    float ewma;         /* recent per-position acceptance: accepted / positions tried */
    float last_ewma;    /* ewma after the latest verify (before a fallback resets it) */
    int cooldown;       /* decode steps left without speculation (fallback) */
    int backoff;        /* length of the next fallback, steps (doubles while acceptance stays low) */
    int probing;        /* bool: speculating again after a fallback, on probation */
    int n_fallbacks;    /* times it fell back to plain decoding */
    /* this step (set by kv_spec_plan / kv_spec_draft) */
    int planned;        /* drafts asked of the scheduler */
    int catchup;        /* draft_model: known tokens the draft model runs this step */
    int drafted;        /* drafts actually produced for the scheduled ones */
    int q_used;         /* bool: q holds the distributions of this step's drafts */
    int probe_ok;       /* verifies at or above min_acceptance since the last fallback */
    /* draft_model: the sequence in the draft model's cache */
    kv_seq dseq;
    /* draft distributions q of this step's drafts, (spec.k, n_vocab) floats;
     * only for sampled requests with a model draft (NULL otherwise: q is
     * one-hot on the draft token) */
    float *q;
    /* counters */
    uint64_t drafts;    /* verify steps with drafts */
    uint64_t n_drafted; /* drafted tokens verified */
    uint64_t n_accepted;/* of which accepted */
} kv_spec_seq;

/* A request as the speculative decoder sees it in one step (borrowed). */
typedef struct kv_spec_item {
    kv_sreq *r;
    kv_spec_seq *ss;
    const kv_sampling *sampling;
    kv_rng *rng;
} kv_spec_item;

typedef struct kv_spec kv_spec;

/* Creates the drafter for cfg->spec (method != off): for draft_model it
 * loads spec.draft_model, checks that its vocabulary is the target's (same
 * n_vocab and the same text for every token; KV_ERR_INVAL naming the first
 * difference otherwise) and creates its paged KV cache (prefix sharing as
 * the target's) and forward scratch; for self it checks spec.draft_layers <
 * the target's layers. target, be and target_cache are borrowed and must
 * outlive it. max_seqs / max_tokens: the scheduler's limits. NULL with err
 * filled on failure. */
kv_spec *kv_spec_new(const kv_config *cfg, const kv_model *target, kv_backend *be, kv_cache *target_cache,
                     int max_seqs, int max_tokens, kv_err *err);
void kv_spec_free(kv_spec *sp); /* NULL is a no-op */

kv_spec_method kv_spec_method_of(const kv_spec *sp);
/* The draft model (draft_model method) or NULL. Borrowed. */
const kv_model *kv_spec_draft_model(const kv_spec *sp);
/* Bytes held: the draft model's weights and the draft KV cache (0 when none). */
uint64_t kv_spec_weight_bytes(const kv_spec *sp);
uint64_t kv_spec_kv_bytes(const kv_spec *sp);
/* Whether requests sampled with s need room for draft distributions (a
 * model draft and temperature > 0), and how many floats. */
int64_t kv_spec_q_floats(const kv_spec *sp, const kv_sampling *s);

void kv_spec_seq_init(kv_spec_seq *ss, const kv_spec *sp, int64_t id, int tag);
/* Releases the draft-cache blocks and q (NULL sp: only q). */
void kv_spec_seq_free(kv_spec *sp, kv_spec_seq *ss);
/* The request left the device (preempted, swapped, finished): its
 * draft-cache blocks are released; the draft model catches up again when it
 * runs. */
void kv_spec_release(kv_spec *sp, kv_spec_seq *ss);

/* Before scheduling: for each item (a running request whose next step is a
 * decode) decides whether it drafts and how many tokens (adaptive k,
 * fallback), and sets r->n_draft (and r->draft for ngram; model drafts get
 * placeholders filled by kv_spec_draft). draft_model: reserves draft-cache
 * slots for the catch-up and the drafts (a sequence whose catch-up does not
 * fit this step's budget catches up in chunks without drafting). */
void kv_spec_plan(kv_spec *sp, kv_spec_item *items, int n);

/* After scheduling: runs the draft for every planned item the scheduler
 * kept drafts for (r->n_sched_draft of them), batched across sequences,
 * writes r->draft and copies the drafts into the batch (kv_sched_set_drafts),
 * and commits draft_model catch-up. Returns 0 or a negative error from the
 * draft forward (err filled); on error no item drafts (their drafts are the
 * placeholders, which verification handles like any wrong draft). */
int kv_spec_draft(kv_spec *sp, kv_sched *s, kv_spec_item *items, int n, kv_sampler *smp, kv_err *err);

/* Verifies request it->r after the target's forward: logits points at its
 * 1 + n_sched_draft rows (n_vocab floats each). Greedy: accepts the longest
 * prefix equal to the target's argmax, then the target's token. Sampled:
 * rejection sampling (accept draft x with probability min(1, p(x)/q(x)), on
 * rejection draw from norm(max(0, p - q)), after all accepted draw the bonus
 * from p). Accepted drafts are also written after r->tokens[n_tokens] for
 * the penalty history. Writes the new tokens to out (1 + n_sched_draft
 * capacity) and returns how many (accepted drafts + 1). probs: scratch of
 * n_vocab floats. */
int kv_spec_verify(kv_spec *sp, const kv_spec_item *it, kv_sampler *smp, const float *logits, int n_vocab,
                   float *probs, int32_t *out);

/* After kv_sched_update: the draft cache keeps the verified positions and
 * drops the rest; the adaptive controller sees `accepted` of `drafted`.
 * Writes a one-line account for the decision record to note (may be NULL). */
void kv_spec_feedback(kv_spec *sp, const kv_spec_item *it, int drafted, int accepted, char *note, size_t cap);

/* Consistency check for tests: the draft cache's checker over the given
 * sequences' draft-cache tables (all live ones), and each one's committed
 * draft positions within its known tokens (n_known[i]). 0 when there is no
 * draft cache; else 0 or -1 with msg. */
int kv_spec_check(const kv_spec *sp, kv_spec_seq *const *seqs, const int *n_known, int n, char *msg, size_t cap);

/* ---- building blocks (exposed for tests) ---- */

/* Prompt lookup: the most recent earlier occurrence of the last n tokens of
 * tokens[0..len) (n = ngram_n, then shorter down to 1) and up to k of the
 * tokens that followed it, written to out. Returns the count (0: no match). */
int kv_spec_ngram(const int32_t *tokens, int len, int ngram_n, int k, int32_t *out);

/* One step of rejection sampling. p: the target's distribution (n floats,
 * used as scratch: changed on rejection); q: the draft's distribution, or
 * NULL when the proposal was deterministic (q one-hot on d). Returns 1 when
 * d is accepted, else 0 with *out drawn from norm(max(0, p - q)) (from p when
 * that is empty). */
int kv_spec_accept(float *p, const float *q, int n, int32_t d, kv_rng *rng, int32_t *out);

/* The adaptive controller. Each sequence keeps an EWMA of its per-position
 * acceptance (accepted / positions tried, where a verify tries positions up
 * to the first rejection). k moves one step per verify toward the largest k
 * whose all-accepted probability ewma^k is still >= 1/4; below
 * min_acceptance the sequence decodes plainly for `backoff` steps (8,
 * doubling to 256 while retries keep failing) and retries at k = 1. With
 * adaptive off, k stays k_max and nothing falls back. */
typedef struct kv_spec_ctl_params {
    int k_max;            /* spec.k */
    int adaptive;         /* spec.adaptive */
    float min_acceptance; /* spec.min_acceptance */
} kv_spec_ctl_params;
void kv_spec_ctl_init(kv_spec_seq *ss, const kv_spec_ctl_params *cp);
/* After a verify of `drafted` tokens with `accepted` accepted. Returns 1
 * when the sequence falls back to plain decoding. */
int kv_spec_ctl_update(kv_spec_seq *ss, const kv_spec_ctl_params *cp, int drafted, int accepted);
/* Drafts for the next decode step (0: plain this step, counting down a
 * fallback). */
int kv_spec_ctl_next(kv_spec_seq *ss, const kv_spec_ctl_params *cp);

/* Expected tokens per verify step when each draft is accepted independently
 * with probability p: (1 - p^(k+1)) / (1 - p). */
double kv_spec_expected_tokens(double p, int k);

/* Checks that draft can draft for target: same n_vocab, same token texts.
 * 0, or KV_ERR_INVAL with err naming the first difference. */
int kv_spec_check_vocab(const kv_model *target, const kv_model *draft, kv_err *err);

#endif
