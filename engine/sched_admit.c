/* sched_admit.c - the scheduler's intake each step: swapped requests
 * brought back first (oldest, highest priority first), then waiting ones
 * admitted in priority order under the step's token, sequence and block
 * budgets, prefix hits attached, with a wait reason for every request that
 * stays (and the queue's tail cut once nobody behind can run). */
#include "scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"
#include "sched_internal.h"

/* Tries to bring swapped requests back, oldest/highest first. */
void sched_schedule_swapped(kv_sched *s) {
    if (s->n_swapped == 0) return;
    sched_sort_queue(s, s->swapped, s->n_swapped, 1);
    for (int i = 0; i < s->n_swapped;) {
        kv_sreq *r = s->swapped[i];
        if (s->n_running >= sched_max_seqs(s)) {
            sched_wait_reason(s, r, why_of(r), W_SW_MAXSEQS, 0, 0);
            i++;
            continue;
        }
        if (s->budget <= 0) {
            sched_wait_reason(s, r, why_of(r), W_SW_BUDGET, 0, 0);
            i++;
            continue;
        }
        /* its blocks, one more for the next token, and the watermark */
        int need = r->seq.n_blocks + 1, avail = kv_cache_n_available(s->c);
        if (need > avail || kv_cache_seq_swap_in(s->c, &r->seq) != 0) {
            sched_wait_reason(s, r, why_of(r), W_SW_BLOCKS, avail, need);
            i++;
            continue;
        }
        sched_remove_from(s->swapped, &s->n_swapped, r);
        r->state = KV_REQ_RUNNING;
        sched_put_reason(s, r, (why){W_NONE, 0, 0});
        sched_running_add(s, r);
        s->cnt.swaps_in++;
        s->rec.n_swapped_in++;
        sched_decide(s, KV_DEC_SWAP_IN, r->id, "swap in #%lld: %d blocks back from host", (long long)r->id,
                     r->seq.n_blocks);
        int n_draft;
        int n_new = sched_plan_tokens(s, r, &n_draft);
        if (n_new > 0 && sched_reserve_tracked(s, r, n_new) == 0) sched_put_scheduled(s, r, n_new, n_draft);
    }
}

/* Blocks r still needs on admission: the prompt (minus a prefix hit) in the
 * paged layout, or more by scheduler.admission (sched_guard.c); max_seq_len
 * slots in the contiguous one. */
static int admission_tokens(const kv_sched *s, const kv_sreq *r) { return sched_admission_tokens(s, r); }

/* Tries to admit waiting request r. Returns 1 when admitted; otherwise 0
 * with *free_blocks / *need set when it failed on blocks. */
static int try_admit(kv_sched *s, kv_sreq *r, int *free_blocks, int *need) {
    const int bs = s->block_size;
    int total = admission_tokens(s, r);
    int avail = kv_cache_n_available(s->c);
    int hit = s->p.prefix_sharing ? kv_cache_match_prefix(s->c, r->tokens, r->n_tokens) : 0;
    /* Without attaching: blocks for positions [hit, total) plus a copy of a
     * shared partial block. Attaching can only take blocks out of the
     * evictable pool, so too little here is final. */
    int est = sched_ceil_div(total, bs) - hit / bs;
    *free_blocks = avail - s->p.watermark_blocks;
    *need = est;
    if (est + s->p.watermark_blocks > avail) return 0;
    kv_cache_stats before;
    kv_cache_get_stats(s->c, &before);
    int reused = 0;
    if (hit > 0) {
        reused = kv_cache_seq_attach_prefix(s->c, &r->seq, r->tokens, r->n_tokens);
        int exact = kv_cache_blocks_needed(s->c, &r->seq, total - r->seq.n_tokens);
        int avail2 = kv_cache_n_available(s->c);
        if (exact + s->p.watermark_blocks > avail2) {
            /* the matched blocks were evictable ones we were counting on */
            kv_cache_seq_release(s->c, &r->seq);
            kv_seq_init(&r->seq, (int)r->id, r->session);
            *free_blocks = avail2 - s->p.watermark_blocks;
            *need = exact;
            return 0;
        }
    }
    if (kv_cache_seq_reserve(s->c, &r->seq, total - r->seq.n_tokens) != 0) {
        kv_cache_seq_release(s->c, &r->seq);
        kv_seq_init(&r->seq, (int)r->id, r->session);
        *free_blocks = kv_cache_n_available(s->c) - s->p.watermark_blocks;
        *need = est;
        return 0;
    }
    sched_note_cache_delta(s, r, &before);
    r->n_computed = r->seq.n_tokens;
    r->n_prefix_hit = reused;
    r->n_prefix_hit_total += reused;
    if (s->p.prefix_sharing) {
        s->cnt.prefix_lookups++;
        s->cnt.prefix_hit_tokens += (uint64_t)reused;
        s->cnt.prefix_hit_blocks += (uint64_t)sched_ceil_div(reused, bs);
    }
    return 1;
}

/* Blocks r would take on admission, before looking at its prefix hit. */
int sched_admission_estimate(const kv_sched *s, const kv_sreq *r) {
    int hit = s->p.prefix_sharing ? kv_cache_match_prefix(s->c, r->tokens, r->n_tokens) : 0;
    return sched_ceil_div(admission_tokens(s, r), s->block_size) - hit / s->block_size;
}

void sched_schedule_waiting(kv_sched *s) {
    wait_tail prev = s->tail; /* the reasons of the last tail, for the requests that leave it */
    s->tail.seq = 0;
    if (s->waiting.n == 0) {
        s->tail_kind = W_NONE;
        return;
    }
    int swapped_prio = INT32_MIN; /* swapped requests come back before these */
    for (int i = 0; i < s->n_swapped; i++) swapped_prio = KV_MAX(swapped_prio, s->swapped[i]->priority);
    kv_wq_order(&s->waiting, s->now_ms);
    const kv_sreq *blocked = NULL; /* first request that did not fit in the blocks */
    int static_mode = s->p.policy == KV_POLICY_STATIC;
    int starting_batch = static_mode && !sched_batch_active(s);
    int cut = 0;
    s->in_waiting_loop = 1;
    /* The queue in order, as it was ordered: admission removes from it
     * (the next one moves up), preemption adds after it. */
    for (int i = 0, seen = 0; i < s->waiting.n_sorted; seen++) {
        kv_sreq *r = kv_wq_at(&s->waiting, i);
        if (seen >= (s->p.eager_waiting > 0 ? s->p.eager_waiting : KV_SCHED_EAGER_WAITING)) {
            wait_tail t = sched_tail_now(s, swapped_prio, static_mode, starting_batch, blocked);
            if (sched_cut_ok(s, &t, r)) {
                sched_start_tail(s, &t, i);
                cut = 1;
                break;
            }
        }
        /* what it was told at the last schedule */
        why was = prev.seq && r->wait_seq < prev.seq ? sched_replay(s, &prev, r) : why_of(r);
        if (s->n_swapped > 0 && r->priority <= swapped_prio) {
            sched_wait_reason(s, r, was, W_SWAPPED_FIRST, 0, 0);
            i++;
            continue;
        }
        if (static_mode && !starting_batch && r->batch != s->cur_batch) {
            sched_wait_reason(s, r, was, W_STATIC, 0, 0);
            i++;
            continue;
        }
        if (s->n_running >= sched_max_seqs(s)) {
            /* A higher-priority request takes the place of a lower one,
             * when the blocks they would free let it in. */
            kv_sreq *v = static_mode ? NULL : sched_victim_below(s, r->priority);
            if (!v || kv_cache_n_available(s->c) - s->p.watermark_blocks + sched_blocks_below(s, r->priority) <
                          sched_admission_estimate(s, r)) {
                sched_wait_reason(s, r, was, W_MAX_SEQS, 0, 0);
                i++;
                continue;
            }
            sched_preempt(s, v, r);
        }
        /* continuous batching admits only what can start computing now;
         * a static batch starts together and prefills over the next steps */
        if (!static_mode && s->budget <= 0) {
            sched_wait_reason(s, r, was, W_BUDGET, 0, 0);
            i++;
            continue;
        }
        if (blocked) {
            /* Skip-ahead: a smaller request may use blocks the head cannot,
             * unless the head starves or outranks it. */
            if (sched_starving(s, blocked)) {
                sched_wait_reason(s, r, was, W_STARVE, blocked->id, 0);
                i++;
                continue;
            }
            if (r->priority < blocked->priority) {
                sched_wait_reason(s, r, was, W_PRIO, blocked->id, blocked->priority);
                i++;
                continue;
            }
        }
        int free_blocks, need;
        int ok = try_admit(s, r, &free_blocks, &need);
        /* priority preemption: lower-priority running requests give way
         * when what they hold would be enough */
        while (!ok && !static_mode && free_blocks + sched_blocks_below(s, r->priority) >= need) {
            kv_sreq *v = sched_victim_below(s, r->priority);
            if (!v) break;
            sched_preempt(s, v, r);
            ok = try_admit(s, r, &free_blocks, &need);
        }
        if (!ok) {
            sched_wait_reason(s, r, was, W_BLOCKS, free_blocks < 0 ? 0 : free_blocks, need);
            if (!blocked) blocked = r;
            i++;
            continue;
        }
        /* admitted */
        int member = static_mode && s->cur_batch && r->batch == s->cur_batch;
        kv_wq_remove_at(&s->waiting, i);
        if (member && s->batch_waiting > 0) s->batch_waiting--;
        sched_running_add(s, r);
        int first = !r->admitted;
        if (first) {
            r->admitted = 1;
            /* the step's clock was read at its start; a request that came
             * in during the step is admitted no earlier than it arrived
             * (else its queue time is negative and drops out of the
             * server's histogram: test_hub saw it under the sanitizer) */
            r->first_admit_ms = s->now_ms > r->arrival_ms ? s->now_ms : r->arrival_ms;
        }
        r->state = KV_REQ_RUNNING;
        sched_put_reason(s, r, (why){W_NONE, 0, 0});
        s->cnt.admitted++;
        s->rec.n_admitted++;
        if (static_mode) {
            if (starting_batch && s->batch_live == 0) {
                s->cur_batch = ++s->batch_seq;
                s->batch_size = 0;
                s->batch_waiting = 0; /* the last batch is over: none of its members waits */
            }
            if (r->batch != s->cur_batch) {
                r->batch = s->cur_batch;
                s->batch_live++;
                s->batch_size++;
            }
        }
        if (first)
            sched_decide(s, KV_DEC_ADMIT, r->id, "admit #%lld: %d prompt tokens, %d from prefix cache",
                         (long long)r->id, r->n_prompt, r->n_prefix_hit);
        else
            sched_decide(s, KV_DEC_ADMIT, r->id, "readmit #%lld: %d tokens to recompute, %d from prefix cache",
                         (long long)r->id, r->n_tokens, r->n_prefix_hit);
        if (r->n_prefix_hit > 0)
            sched_decide(s, KV_DEC_SHARE, r->id, "share: #%lld reuses %d cached tokens (%d blocks)", (long long)r->id,
                         r->n_prefix_hit, sched_ceil_div(r->n_prefix_hit, s->block_size));
        int n_draft;
        int n_new = sched_plan_tokens(s, r, &n_draft);
        if (n_new > 0 && sched_reserve_tracked(s, r, n_new) == 0) sched_put_scheduled(s, r, n_new, n_draft);
    }
    s->in_waiting_loop = 0;
    if (!cut) s->tail_kind = W_NONE;
}
