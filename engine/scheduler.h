/* scheduler.h - iteration-level (continuous) batching over the paged KV
 * cache: which requests run in the next forward, how many tokens each, who
 * is admitted, preempted (recompute or swap) or left waiting and why. It
 * knows tokens and blocks, not text: the engine samples and decides EOS.
 *
 * One rule, as in vLLM, covers prefill, chunked prefill, prefix caching,
 * decode, recompute after preemption and speculative tokens: a request
 * knows n_tokens (prompt + generated) and n_computed (tokens whose K/V are
 * in the cache); each step it gets up to n_tokens + n_draft - n_computed new
 * tokens, capped by the chunk size and the step's token budget, and it
 * samples when the step brings it to the end of what is known.
 *
 * A step, driven by the engine (or a test that plays the forward):
 *   kv_sched_begin_step -> kv_sched_add / kv_sched_finish (cancellations)
 *   -> kv_sched_schedule (decisions + the batch arrays) -> forward + sampling
 *   -> kv_sched_update per scheduled request -> kv_sched_finish for those
 *   that ended -> kv_sched_end_step (the step record).
 * Not thread-safe: the engine thread owns it. */
#ifndef KV_SCHEDULER_H
#define KV_SCHEDULER_H

#include <stdint.h>

#include "../base/common.h"
#include "config.h"
#include "engine.h"
#include "kv_cache.h"

/* The scheduler's view of one request. The owner (the engine) allocates it,
 * fills the identity fields and the tokens with kv_sreq_init, and keeps it
 * alive until kv_sched_finish returned; the scheduler only holds pointers. */
typedef struct kv_sreq {
    /* public: identity, set by the owner before kv_sched_add */
    int64_t id;            /* > 0, increasing with arrival */
    int session;           /* owner tag shown in the block map */
    int priority;          /* higher runs first; preemption picks the lowest */
    int max_tokens;        /* tokens to generate at most */
    double arrival_ms;     /* engine clock */
    double hold_until_ms;  /* owner: a running request is not scheduled before this engine time (its
                              KV is still on its way from a disaggregated prefill pool); 0 = none */

    /* tokens: prompt then generated; n_prompt + max_tokens + spec slack fit */
    int32_t *tokens;       /* (cap_tokens) owned, see kv_sreq_init */
    int cap_tokens;
    int n_prompt;          /* original prompt tokens */
    int n_tokens;          /* known tokens = n_prompt + generated */

    /* speculative decoding hook: tokens proposed after tokens[n_tokens-1].
     * The drafter sets n_draft (and the tokens, or placeholders that it
     * replaces through kv_sched_set_drafts once the plan is known) before
     * kv_sched_schedule; the scheduler keeps n_sched_draft of them within
     * the step's budget and blocks, scores them in the same forward (logits
     * for 1 + n_sched_draft rows) and the verifier passes the accepted ones
     * to kv_sched_update. Cleared every step. */
    int32_t *draft;        /* (cap_draft) owned */
    int cap_draft;
    int n_draft;

    /* private to the scheduler (read-only for the owner) */
    kv_req_state state;
    kv_seq seq;            /* block table; seq.n_tokens == n_computed while on device */
    int n_computed;        /* tokens whose K/V are committed */
    int n_prefix_hit;      /* prompt tokens reused from the prefix cache at the last admission */
    int n_prefix_hit_total;/* over every admission (recompute re-admissions included) */
    int preemptions;       /* times preempted (recompute or swap) */
    int admitted;          /* bool: admitted at least once */
    double first_admit_ms; /* engine clock of the first admission */
    uint64_t batch;        /* static policy: the batch it belongs to (0 = none yet) */
    char wait_reason[96];  /* why it is not running ("3 free blocks, needs 9"), "" when running;
                              see kv_sched_wait_reason: far down a long queue it can be stale */
    int wait_kind;         /* the reason as data (wait_reason is its text), kept to compare */
    int64_t wait_a;
    int wait_b;
    uint64_t wait_seq;     /* the schedule call that set it */

    /* this step, filled by kv_sched_schedule */
    int n_sched;           /* tokens in the batch (drafts included), 0 when not scheduled */
    int n_sched_draft;     /* of which drafts */
    int sched_row;         /* first batch row */
    int n_logits;          /* logit rows: 0 (mid-prefill), 1, or 1 + n_sched_draft */
    int logit_row;         /* first row in the logits matrix */
    int is_prefill;        /* bool: the scheduled tokens are prompt (or recompute) tokens */

    /* private: preemption chains (sched_guard.c) */
    int chain;             /* the chain its last preemption belongs to; 0 = never preempted */
    int chain_link;        /* that preemption's place in the chain (1 = the one that started it) */
    int redo_until;        /* tokens it had computed when last preempted: computing below this is redone */
    int chain_until;       /* while back and below this many tokens (its length when preempted + one
                              block), a preemption is blamed on its return and continues its chain */
    int owner_priority;    /* the owner's priority before kv_sched_add folded the order into it */
} kv_sreq;

/* Allocates the token arrays for a prompt of n tokens that may generate up
 * to max_tokens more plus spec_k drafted ones, copies the prompt and clears
 * the state. Returns 0 or KV_ERR_NOMEM. */
int kv_sreq_init(kv_sreq *r /* OUT: */, int64_t id, const int32_t *prompt, int n, int max_tokens, int spec_k);
/* Frees the arrays (the KV blocks must be released: kv_sched_finish). */
void kv_sreq_free(kv_sreq *r);
/* Generated tokens so far. */
static inline int kv_sreq_n_generated(const kv_sreq *r) { return r->n_tokens - r->n_prompt; }

typedef struct kv_sched_params {
    kv_policy policy;
    kv_layout layout;
    kv_preempt preemption;
    int max_seqs;           /* running requests at most */
    int max_batched_tokens; /* tokens per forward (drafts included) */
    int prefill_chunk;      /* prompt tokens per request per step at most */
    double max_wait_ms;     /* starvation guard; 0 = off */
    int max_seq_len;        /* tokens per request (> 0); contiguous layout reserves this many */
    int prefix_sharing;     /* bool (forced off in the contiguous layout) */
    int watermark_blocks;   /* blocks admission leaves free for running requests to grow */
    int eager_waiting;      /* waiting requests a schedule looks at one by one before it may give
                               the rest one shared reason; 0: KV_SCHED_EAGER_WAITING (tests set
                               INT_MAX to check the shared reasons against a walk of every one) */
    /* failure-mode guards (sched_guard.c, sched_batch.c) */
    kv_admission admission;    /* blocks a request must find free to be admitted */
    double admission_quantile; /* KV_ADMIT_QUANTILE: the output-length quantile reserved */
    kv_victim preempt_victim;  /* which running request preemption takes */
    kv_order order;            /* waiting queue order (short_first folds job length into priority) */
    double target_tpot_ms;     /* > 0: the running batch is capped to hold this step time */
    int batch_auto;            /* bool: max_seqs auto (a ceiling); the controller runs even without
                                  a target (it then holds twice the fitted step of one sequence) */
} kv_sched_params;

/* Fills p from a config; max_seq_len is resolved against the model context
 * (ctx_len), the watermark is scheduler.watermark (1% by default) of n_blocks. */
void kv_sched_params_from_config(kv_sched_params *p /* OUT: */, const kv_config *cfg, int ctx_len, int n_blocks);

typedef struct kv_sched kv_sched;

/* The cache is borrowed and must outlive the scheduler. Batch arrays are
 * sized here once (max_batched_tokens tokens, max_seqs sequences). */
kv_sched *kv_sched_new(const kv_sched_params *p, kv_cache *c, kv_err *err);
void kv_sched_free(kv_sched *s); /* NULL is a no-op; requests are not freed */
const kv_sched_params *kv_sched_params_of(const kv_sched *s);
kv_cache *kv_sched_cache(kv_sched *s);

/* Starts a step: clears the step's decisions and counters. */
void kv_sched_begin_step(kv_sched *s, uint64_t step, double now_ms);

/* Queues a new request (state WAITING). r is borrowed until kv_sched_finish.
 * Returns 0, or KV_ERR_INVAL when r is not a fresh request or the queue
 * cannot grow (KV_ERR_NOMEM). */
int kv_sched_add(kv_sched *s, kv_sreq *r);

/* The plan of one step; owned by the scheduler, valid until the next
 * kv_sched_schedule. Row i of the batch is token tokens[i] at position
 * pos[i] of sequence seq[i] (an index into tables and reqs), K/V to slot[i]. */
typedef struct kv_sched_out {
    int n_reqs;
    kv_sreq **reqs;         /* (n_reqs) scheduled requests in batch order */
    int n_tokens;
    int32_t *tokens;        /* (n_tokens) */
    int32_t *pos;           /* (n_tokens) */
    int32_t *seq;           /* (n_tokens) */
    int32_t *slot;          /* (n_tokens) */
    const int32_t **tables; /* (n_reqs) block tables */
    int n_logits;
    int32_t *logit_rows;    /* (n_logits) batch rows whose logits are needed */
    int n_prefill_tokens, n_decode_tokens, n_spec_tokens;
    int n_pad_tokens;       /* static policy: rows computed for finished batch members */
    /* sliding-window release (kv_cache_local_pages non-NULL): each row's
     * slot in the local layers' pages and each sequence's table into them;
     * NULL otherwise */
    int32_t *lslot;          /* (n_tokens) */
    const int32_t **ltables; /* (n_reqs) */
} kv_sched_out;

/* Decides the step: grows running requests (preempting when blocks run
 * out), swaps requests back in, admits waiting ones, and builds the batch.
 * Returns the number of scheduled tokens (0: nothing to run), or a negative
 * KV_ERR_* on an internal inconsistency. *out is set in both cases. */
int kv_sched_schedule(kv_sched *s, double now_ms, const kv_sched_out **out /* OUT: borrowed */);

/* Speculative decoding with a model draft: the drafter learns how many
 * drafts the scheduler kept (r->n_sched_draft) only from the plan, so it
 * drafts after kv_sched_schedule, writes r->draft[0..n_sched_draft) and
 * calls this to copy them into r's batch rows (before the forward). */
void kv_sched_set_drafts(kv_sched *s, const kv_sreq *r);

/* After the forward for scheduled request r: new tokens are appended to
 * r->tokens (the accepted drafts, then the token sampled after them; none
 * when r->n_logits == 0), the K/V of the scheduled tokens that stay valid
 * are committed (rejected drafts are truncated) and n_computed advances.
 * Returns 0 or KV_ERR_INVAL (n_new out of range; nothing changed). */
int kv_sched_update(kv_sched *s, kv_sreq *r, const int32_t *new_tokens, int n_new);

/* Ends r (any state): releases its blocks (device or swap pool), removes it
 * from every queue and records the decision. r may then be freed. */
void kv_sched_finish(kv_sched *s, kv_sreq *r, kv_finish why);

/* Ends the step: fills the counters of rec (the caller adds times) and
 * returns the step's decisions (owned by the scheduler, valid until the
 * next kv_sched_begin_step). */
void kv_sched_end_step(kv_sched *s, kv_step_record *rec /* OUT: */, const kv_decision **decisions /* OUT: borrowed */,
                       int *n_decisions /* OUT: */);

/* Adds a decision of the owner's (reject, spec) to this step's list. */
void kv_sched_decide(kv_sched *s, kv_decision_kind kind, int64_t req, const char *text);

/* Why r (waiting, preempted or swapped) is not running, as text: r's own
 * wait_reason, or for a request of a long waiting queue that the last
 * schedule did not look at one by one (past the first eager_waiting,
 * once nothing after them could run that step),
 * the reason that part of the queue shares, worked out now. Returns
 * r->wait_reason or buf (cap bytes). */
const char *kv_sched_wait_reason(const kv_sched *s, const kv_sreq *r, char *buf /* OUT: (cap) */, size_t cap);
/* Waiting requests a schedule always looks at one by one (each gets its
 * reason and a WAIT decision when that changes); the rest of a longer
 * queue share one reason and one WAIT decision, so a step costs what it
 * touches, not the queue's length. */
#define KV_SCHED_EAGER_WAITING 32

/* Queues, in scheduling order (borrowed, valid until the next call that
 * changes them). */
int kv_sched_running(const kv_sched *s, kv_sreq *const **out /* OUT: borrowed */);
int kv_sched_waiting(const kv_sched *s, kv_sreq *const **out /* OUT: borrowed */);
int kv_sched_swapped(const kv_sched *s, kv_sreq *const **out /* OUT: borrowed */);
/* True when nothing is waiting, running or swapped. */
int kv_sched_idle(const kv_sched *s);

/* Running totals since creation. */
typedef struct kv_sched_counters {
    uint64_t admitted, preemptions, recomputes, swaps_out, swaps_in, finished;
    uint64_t prefill_tokens;    /* prompt and recompute tokens scheduled */
    uint64_t decode_tokens, spec_tokens;
    uint64_t prefix_lookups, prefix_hit_tokens, prefix_hit_blocks;
    int max_running;            /* most requests running at once */
    /* preemption chains (sched_guard.c): a preemption made while a request
     * that was preempted is back and has not grown a block past its old
     * length (the blocks it took back are what ran out) continues that
     * request's chain; a chain of two or more links is a cascade */
    uint64_t chains;            /* cascades: chains of >= 2 preemptions */
    uint64_t chained_preemptions; /* preemptions that belong to a cascade */
    int longest_chain;          /* links in the longest chain */
    uint64_t tokens_discarded;  /* computed tokens thrown away by recompute preemptions */
    uint64_t tokens_recomputed; /* of those, tokens computed again after readmission (prefix hits excluded) */
    int batch_cap;              /* target_tpot_ms, max_seqs auto: the batch size the controller allows
                                   now; 0 when off */
    double batch_goal_ms;       /* the step time it holds (0: off, or not yet fitted) */
} kv_sched_counters;
void kv_sched_get_counters(const kv_sched *s, kv_sched_counters *out /* OUT: */);

/* After a step: its batch size and duration (engine clock, ms) feed the
 * dynamic batch size (scheduler.target_tpot_ms > 0; otherwise a no-op). */
void kv_sched_observe_step(kv_sched *s, int n_seqs, double dur_ms);

/* Consistency check for tests: the cache's checker over every live
 * sequence, plus the scheduler's own invariants (queues partition the
 * requests, n_computed == seq.n_tokens on device, budgets respected by the
 * last plan). Returns 0, or KV_ERR_INVAL with msg naming the first
 * violation (KV_ERR_NOMEM: could not check). */
int kv_sched_check(const kv_sched *s, char *msg /* OUT: (cap) */, size_t cap);

#endif
