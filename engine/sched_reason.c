/* sched_reason.c - why a waiting request is not running: the reasons as
 * data and text, the WAIT decisions when they change, and the tail of a
 * long waiting queue that shares one reason (worked out when asked), so a
 * step costs what it touches, not the queue's length. */
#include <stdio.h>
#include <string.h>

#include "../base/common.h"
#include "sched_internal.h"

/* The text of a reason (the texts the TUI's queue panel shows). */
void sched_reason_text(const kv_sched *s, why w, char *buf, size_t cap) {
    switch (w.kind) {
    case W_SWAPPED_OUT: snprintf(buf, cap, "swapped out"); break;
    case W_PREEMPTED: snprintf(buf, cap, "preempted (recompute)"); break;
    case W_SW_MAXSEQS: snprintf(buf, cap, "swapped out; max_seqs (%d) running", sched_max_seqs(s)); break;
    case W_SW_BUDGET: snprintf(buf, cap, "swapped out; token budget spent"); break;
    case W_SW_BLOCKS: snprintf(buf, cap, "swapped out; %d free blocks, needs %d", (int)w.a, w.b); break;
    case W_SWAPPED_FIRST: snprintf(buf, cap, "swapped requests first"); break;
    case W_STATIC: snprintf(buf, cap, "static batch running"); break;
    case W_MAX_SEQS: snprintf(buf, cap, "max_seqs (%d) running", sched_max_seqs(s)); break;
    case W_BUDGET: snprintf(buf, cap, "token budget (%d per step) spent", s->p.max_batched_tokens); break;
    case W_STARVE: snprintf(buf, cap, "starvation guard: #%lld goes first", (long long)w.a); break;
    case W_PRIO: snprintf(buf, cap, "priority: #%lld (priority %d) first", (long long)w.a, w.b); break;
    case W_BLOCKS: snprintf(buf, cap, "%d free blocks, needs %d", (int)w.a, w.b); break;
    default: if (cap) buf[0] = 0; break;
    }
}

/* Sets r's reason without a decision (preemption, admission). */
void sched_put_reason(kv_sched *s, kv_sreq *r, why w) {
    if (!why_eq(w, why_of(r))) sched_reason_text(s, w, r->wait_reason, sizeof r->wait_reason);
    r->wait_kind = w.kind, r->wait_a = w.a, r->wait_b = w.b;
    r->wait_seq = s->n_calls;
}

/* Sets the reason a request is not running, with a WAIT decision only when
 * it differs from `was` (the reason it had at the last schedule; a queue of
 * 50 requests would otherwise log 50 lines per step). The text is made
 * only when the reason changes. */
void sched_wait_reason(kv_sched *s, kv_sreq *r, why was, int kind, int64_t a, int b) {
    why w = {kind, a, b};
    sched_put_reason(s, r, w);
    if (!why_eq(w, was)) sched_decide(s, KV_DEC_WAIT, r->id, "wait #%lld: %s", (long long)r->id, r->wait_reason);
}

/* The reason the waiting loop's checks give r under the tail state t: the
 * checks of schedule_waiting in its order, none of which can admit, preempt
 * or touch the cache for a request of the tail (cut_ok). The blocks r
 * needs are counted now. */
why sched_replay(const kv_sched *s, const wait_tail *t, const kv_sreq *r) {
    if (t->any_swapped && r->priority <= t->swapped_prio) return (why){W_SWAPPED_FIRST, 0, 0};
    if (t->static_mode && !t->starting_batch && r->batch != t->cur_batch) return (why){W_STATIC, 0, 0};
    if (t->full) return (why){W_MAX_SEQS, 0, 0};
    if (t->budget_spent) return (why){W_BUDGET, 0, 0};
    if (t->has_blocked) {
        if (t->blocked_starving) return (why){W_STARVE, t->blocked_id, 0};
        if (r->priority < t->blocked_prio) return (why){W_PRIO, t->blocked_id, t->blocked_prio};
    }
    return (why){W_BLOCKS, t->free_blocks < 0 ? 0 : t->free_blocks, sched_admission_estimate(s, r)};
}

/* The loop's state now, as a tail would keep it. */
wait_tail sched_tail_now(const kv_sched *s, int swapped_prio, int static_mode, int starting_batch,
                          const kv_sreq *blocked) {
    wait_tail t = {.seq = s->n_calls, .any_swapped = s->n_swapped > 0, .swapped_prio = swapped_prio,
                   .static_mode = static_mode, .starting_batch = starting_batch, .cur_batch = s->cur_batch,
                   .full = s->n_running >= sched_max_seqs(s), .budget_spent = !static_mode && s->budget <= 0,
                   .free_blocks = kv_cache_n_available(s->c) - s->p.watermark_blocks, .has_blocked = blocked != NULL};
    if (blocked) {
        t.blocked_starving = sched_starving(s, blocked);
        t.blocked_prio = blocked->priority;
        t.blocked_id = blocked->id;
    }
    return t;
}

/* Whether, in state t, no waiting request from position i on (r first) can
 * be admitted, preempt anyone or touch the cache this step, so the loop may
 * stop looking at them one by one. `bound` is the highest priority among
 * them: r's when it is not starving (the rest then come by priority), else
 * the queue's highest. */
int sched_cut_ok(const kv_sched *s, const wait_tail *t, const kv_sreq *r) {
    int bound = sched_starving(s, r) ? kv_wq_max_prio(&s->waiting) : r->priority;
    /* max_seqs running: only a victim below their priority could let one in */
    if (t->full && !t->static_mode && sched_victim_below(s, bound)) return 0;
    if (t->full || t->budget_spent) return 1;
    if (t->any_swapped && bound <= t->swapped_prio) return 1;
    if (t->static_mode && !t->starting_batch && s->batch_waiting == 0) return 1;
    if (!t->has_blocked) return 0; /* the first to fail on blocks would become the one the others skip */
    if (t->blocked_starving || bound < t->blocked_prio) return 1;
    /* admission tries: each needs a block at least, and none is to be had
     * even by preempting what runs below them */
    return t->free_blocks + (t->static_mode ? 0 : sched_blocks_below(s, bound)) < 1;
}

/* The tail starts at position i: one WAIT decision for all of it when the
 * reason of its first request differs from the one the last tail named. */
void sched_start_tail(kv_sched *s, const wait_tail *t, int i) {
    s->tail = *t;
    const kv_sreq *first = kv_wq_at(&s->waiting, i);
    why w = sched_replay(s, t, first);
    if (s->tail_kind == w.kind && s->tail_a == w.a && s->tail_b == w.b) return;
    s->tail_kind = w.kind, s->tail_a = w.a, s->tail_b = w.b;
    char text[96];
    sched_reason_text(s, w, text, sizeof text);
    sched_decide(s, KV_DEC_WAIT, first->id, "wait #%lld and %d more: %s", (long long)first->id,
                 s->waiting.n_sorted - i - 1, text);
}

const char *kv_sched_wait_reason(const kv_sched *s, const kv_sreq *r, char *buf, size_t cap) {
    if (!s || !r) return "";
    int waiting = r->state == KV_REQ_WAITING || r->state == KV_REQ_PREEMPTED;
    if (!waiting || !s->tail.seq || s->tail.seq != s->n_calls || r->wait_seq >= s->tail.seq || !buf || !cap)
        return r->wait_reason;
    sched_reason_text(s, sched_replay(s, &s->tail, r), buf, cap);
    return buf;
}
