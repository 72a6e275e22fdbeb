/* sched_internal.h - what the scheduler's files share and nothing else
 * includes: the scheduler struct, the reasons a waiting request is given
 * (as data, and the tail of a long queue that shares one), and the helpers
 * one file calls in another. The scheduler is
 *   scheduler.c     requests, lifecycle, the step's decisions and batch
 *   sched_reason.c  why a request waits: reason texts, a long queue's tail
 *   sched_check.c   the consistency check (tests)
 *   sched_queue.c   the ordered queues (sched_queue.h)
 *   sched_guard.c   failure-mode guards: preemption chains, victim choice,
 *                   admission by projected length, short-first order
 *   sched_batch.c   the dynamic batch size controller (sched_batch.h) */
#ifndef KV_SCHED_INTERNAL_H
#define KV_SCHED_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "sched_batch.h"
#include "sched_queue.h"
#include "scheduler.h"

/* Why a request is not running, as data: kv_sreq.wait_kind and its two
 * numbers; reason_text makes the text. */
enum {
    W_NONE,          /* "" (new, or running) */
    W_SWAPPED_OUT,   /* just swapped out */
    W_PREEMPTED,     /* just preempted for recompute */
    W_SW_MAXSEQS,    /* swapped; max_seqs running */
    W_SW_BUDGET,     /* swapped; token budget spent */
    W_SW_BLOCKS,     /* swapped; a = free blocks, b = needed */
    W_SWAPPED_FIRST, /* swapped requests come back first */
    W_STATIC,        /* another static batch runs */
    W_MAX_SEQS,      /* max_seqs running */
    W_BUDGET,        /* the step's token budget is spent */
    W_STARVE,        /* a = the starving request that goes first */
    W_PRIO,          /* a = the blocked request of higher priority, b = its priority */
    W_BLOCKS         /* a = free blocks, b = needed */
};

/* The state a schedule left its waiting loop in when it stopped looking at
 * requests one by one: every request after that point gets the reason the
 * loop's checks give under this state (none of them could run, preempt or
 * touch the cache: cut_ok), worked out when someone asks (replay). */
typedef struct wait_tail {
    uint64_t seq;          /* the schedule call (kv_sched.n_calls); 0 = no tail */
    int any_swapped, swapped_prio;
    int static_mode, starting_batch;
    uint64_t cur_batch;
    int full;              /* max_seqs running */
    int budget_spent;
    int free_blocks;       /* available minus the watermark */
    int has_blocked, blocked_starving, blocked_prio;
    int64_t blocked_id;
} wait_tail;

struct kv_sched {
    kv_sched_params p;
    kv_cache *c;
    int32_t *ltab;          /* the local block tables of a step, back to back (window release) */
    int ltab_cap;
    int block_size;
    int n_blocks;

    /* queues of borrowed requests */
    kv_sreq **running;   /* (cap_running) admission order */
    int n_running, cap_running;
    kv_vqueue victims;   /* the running ones again, in victim order */
    kv_wqueue waiting;   /* in scheduling order as of the last schedule, then those added since */
    kv_sreq **swapped;   /* (cap_swapped) */
    int n_swapped, cap_swapped;
    int batch_waiting;   /* static policy: waiting members of cur_batch (preempted ones) */
    int said_swap_small; /* bool: the swap pool was found smaller than a sequence (said once) */

    /* the plan of the current step (arrays sized at creation) */
    kv_sched_out out;
    kv_sreq **sched;     /* (max_seqs) scheduled requests in decision order */
    int n_sched;
    kv_sreq **order;     /* (cap_order) scratch copy of a queue */
    int cap_order;
    int budget;          /* tokens left in this step */

    /* static policy */
    uint64_t batch_seq;  /* last batch id handed out */
    uint64_t cur_batch;  /* the batch now running, 0 = none */
    int batch_live;      /* unfinished members of cur_batch */
    int batch_size;      /* members admitted into cur_batch */

    /* the reasons of a long waiting queue's tail (see wait_tail) */
    uint64_t n_calls;    /* kv_sched_schedule calls so far */
    int in_waiting_loop; /* bool: schedule_waiting is looking at the queue (a request preempted now
                            waits for the next step's) */
    wait_tail tail;      /* the last schedule's tail; seq 0 when it had none */
    int tail_kind;       /* the reason its WAIT decision last named (W_NONE: no tail then) */
    int64_t tail_a;
    int tail_b;

    /* the step record */
    uint64_t step;
    double now_ms;
    kv_step_record rec;
    kv_decision *dec;    /* (cap_dec) this step's decisions */
    int n_dec, cap_dec;
    kv_sched_counters cnt;

    /* failure-mode guards (sched_guard.c) */
    int n_chain_ids;     /* chains started so far */
    int *chain_len;      /* (cap_chain) links per chain id (index 0 unused) */
    int cap_chain;
    int *out_hist;       /* (OUT_HIST) output lengths of the last finished requests, a ring */
    int n_out_hist, out_hist_pos;
    kv_batch_ctl bctl;   /* target_tpot_ms: the batch size controller */
};

/* Finished output lengths the quantile admission remembers. */
#define OUT_HIST 256

/* A reason as data. */
typedef struct why {
    int kind; /* W_* */
    int64_t a;
    int b;
} why;

static inline why why_of(const kv_sreq *r) { return (why){r->wait_kind, r->wait_a, r->wait_b}; }
static inline int why_eq(why x, why y) { return x.kind == y.kind && x.a == y.a && x.b == y.b; }

/* ---- scheduler.c ---- */

/* Records a decision of this step (a failed growth drops the decision). */
void sched_decide(kv_sched *s, kv_decision_kind kind, int64_t req, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Whether r is past the starvation guard now. */
int sched_starving(const kv_sched *s, const kv_sreq *r);
/* The lowest-priority, newest running request strictly below prio, or NULL. */
kv_sreq *sched_victim_below(const kv_sched *s, int prio);
/* Blocks held by running requests below priority prio. */
int sched_blocks_below(const kv_sched *s, int prio);
/* Blocks r would take on admission, before looking at its prefix hit. */
int sched_admission_estimate(const kv_sched *s, const kv_sreq *r);

/* ---- sched_guard.c ---- */

/* Allocates the guards' state. Returns 0 or KV_ERR_NOMEM. */
int sched_guard_init(kv_sched *s);
void sched_guard_free(kv_sched *s);
/* The running request preemption takes (NULL when none runs): the victim
 * queue's lowest priority, then by scheduler.preempt_victim. */
kv_sreq *sched_pick_victim(const kv_sched *s);
/* Records the preemption of v (still running) made for for_req in the
 * chains: writes " [cascade N, link K]" (or "") to note. */
void sched_chain_preempt(kv_sched *s, kv_sreq *v, const kv_sreq *for_req, char *note /* OUT: (cap) */, size_t cap);
/* A recompute preemption throws away v's lost computed tokens. */
void sched_chain_lost(kv_sched *s, kv_sreq *v, int lost);
/* n tokens of r scheduled from position r->n_computed: counts those below
 * r->redo_until as recomputed. */
void sched_chain_scheduled(kv_sched *s, kv_sreq *r, int n);
/* Tokens r must find blocks for at admission under scheduler.admission. */
int sched_admission_tokens(const kv_sched *s, const kv_sreq *r);
/* Folds scheduler.order into r->priority at kv_sched_add (keeps the owner's
 * in r->owner_priority). */
void sched_fold_order(const kv_sched *s, kv_sreq *r);
/* A finished request's output length, for the quantile admission. */
void sched_note_output(kv_sched *s, const kv_sreq *r, kv_finish why);
/* Requests running at most now: max_seqs, or the controller's cap. */
int sched_max_seqs(const kv_sched *s);

/* ---- sched_reason.c ---- */

/* The text of a reason (what the TUI's queue panel shows). */
void sched_reason_text(const kv_sched *s, why w, char *buf /* OUT: (cap) */, size_t cap);
/* Sets r's reason without a decision (preemption, admission). */
void sched_put_reason(kv_sched *s, kv_sreq *r, why w);
/* Sets r's reason, with a WAIT decision when it differs from `was`. */
void sched_wait_reason(kv_sched *s, kv_sreq *r, why was, int kind, int64_t a, int b);
/* The reason the waiting loop's checks give r under tail state t. */
why sched_replay(const kv_sched *s, const wait_tail *t, const kv_sreq *r);
/* The waiting loop's state now, as a tail keeps it. */
wait_tail sched_tail_now(const kv_sched *s, int swapped_prio, int static_mode, int starting_batch,
                         const kv_sreq *blocked);
/* Whether the waiting loop may stop at r: nobody from r on can run,
 * preempt or touch the cache this step in state t. */
int sched_cut_ok(const kv_sched *s, const wait_tail *t, const kv_sreq *r);
/* Makes the queue from position i on the tail (one WAIT decision). */
void sched_start_tail(kv_sched *s, const wait_tail *t, int i);

/* ---- scheduler.c: what sched_admit.c uses ---- */

/* Removes r from q[0..*n); 1 when it was there. */
int sched_remove_from(kv_sreq **q, int *n, const kv_sreq *r);
/* Adds the cache's hit and copy counts since `before` to r's and s's. */
void sched_note_cache_delta(kv_sched *s, const kv_sreq *r, const kv_cache_stats *before);
/* Reserves room for n_new more tokens of r, counting what it copied. */
int sched_reserve_tracked(kv_sched *s, kv_sreq *r, int n_new);
/* Sorts q[0..n) into scheduling order (guard: with the starvation guard). */
void sched_sort_queue(const kv_sched *s, kv_sreq **q, int n, int guard);
void sched_running_add(kv_sched *s, kv_sreq *r);
/* Preempts v (recompute or swap) to make room for for_req. */
void sched_preempt(kv_sched *s, kv_sreq *v, const kv_sreq *for_req);
/* Puts r in this step's batch with n_new tokens, n_draft of them drafts. */
void sched_put_scheduled(kv_sched *s, kv_sreq *r, int n_new, int n_draft);
/* Tokens r gets this step; *n_draft (OUT) how many of them are drafts. */
int sched_plan_tokens(const kv_sched *s, const kv_sreq *r, int *n_draft);
static inline int sched_ceil_div(int a, int b) { return (a + b - 1) / b; }
/* The batch size follows the controller (target_tpot_ms, max_seqs auto). */
static inline int sched_batch_dynamic(const kv_sched *s) { return s->p.target_tpot_ms > 0 || s->p.batch_auto; }
/* A static batch is running (no admission until it drains). */
static inline int sched_batch_active(const kv_sched *s) {
    return s->p.policy == KV_POLICY_STATIC && s->batch_live > 0;
}

/* ---- sched_admit.c ---- */

/* Brings swapped requests back in while blocks allow. */
void sched_schedule_swapped(kv_sched *s);
/* Admits waiting requests in order under the step's budgets. */
void sched_schedule_waiting(kv_sched *s);

#endif
