/* sched_guard.c - the scheduler's guards against the failure modes of
 * issue 17, and the bookkeeping that makes the first of them visible:
 *   - preemption chains: preempting a request throws its blocks back; when
 *     it is readmitted it takes them again, and if running requests then run
 *     out of blocks before it has grown a block past its old length, the
 *     next preemption is blamed on its return and continues its chain. A
 *     chain of two or more links is a cascade. Tokens thrown away and tokens
 *     computed again are counted.
 *   - victim choice (scheduler.preempt_victim): the newest request, or the
 *     one with the fewest computed tokens, so a preemption loses least work.
 *   - admission by projected length (scheduler.admission): the prompt only,
 *     prompt + max_tokens, or prompt + a quantile of recent output lengths.
 *   - short-first order (scheduler.order): job length folded into priority.
 *   - the dynamic batch size (scheduler.target_tpot_ms, scheduler.max_seqs:
 *     auto; sched_batch.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"
#include "sched_internal.h"

int sched_guard_init(kv_sched *s) {
    s->out_hist = malloc(OUT_HIST * sizeof *s->out_hist);
    if (!s->out_hist) return KV_ERR_NOMEM;
    if (kv_grow((void **)&s->chain_len, &s->cap_chain, 64, sizeof *s->chain_len)) return KV_ERR_NOMEM;
    kv_batch_ctl_init(&s->bctl, s->p.target_tpot_ms, s->p.max_seqs);
    s->cnt.batch_cap = sched_batch_dynamic(s) ? s->bctl.cap : 0;
    s->cnt.batch_goal_ms = sched_batch_dynamic(s) ? s->bctl.goal_ms : 0;
    return 0;
}

void sched_guard_free(kv_sched *s) {
    free(s->out_hist);
    free(s->chain_len);
    s->out_hist = NULL;
    s->chain_len = NULL;
}

/* ---- victim choice ---- */

kv_sreq *sched_pick_victim(const kv_sched *s) {
    const kv_vqueue *q = &s->victims;
    if (q->n == 0) return NULL;
    kv_sreq *v = q->v[0];
    if (s->p.preempt_victim != KV_VICTIM_LEAST_WORK) return v;
    /* among the lowest priority (the queue's first run), the fewest
     * computed tokens; ties keep the victim order (the newest) */
    for (int i = 1; i < q->n && q->v[i]->priority == v->priority; i++)
        if (q->v[i]->n_computed < v->n_computed) v = q->v[i];
    return v;
}

/* ---- chains ---- */

void sched_chain_preempt(kv_sched *s, kv_sreq *v, const kv_sreq *for_req, char *note, size_t cap) {
    note[0] = 0;
    int chain = 0, link = 1;
    /* a returned victim still inside its window (the requester, another
     * running request, or v itself): the latest link wins */
    const kv_sreq *back = for_req->state == KV_REQ_RUNNING && for_req->chain > 0 &&
                                  for_req->n_tokens < for_req->chain_until ? for_req : NULL;
    for (int i = 0; i < s->n_running; i++) {
        const kv_sreq *x = s->running[i];
        if (x->chain > 0 && x->n_tokens < x->chain_until && (!back || x->chain_link > back->chain_link)) back = x;
    }
    if (v->chain > 0 && v->n_tokens < v->chain_until && (!back || v->chain_link > back->chain_link)) back = v;
    if (back) {
        chain = back->chain;
        link = s->chain_len[chain] + 1;
    } else if (kv_grow((void **)&s->chain_len, &s->cap_chain, s->n_chain_ids + 2, sizeof *s->chain_len) == 0) {
        chain = ++s->n_chain_ids;
        s->chain_len[chain] = 0;
    }
    if (chain > 0) {
        int len = ++s->chain_len[chain];
        if (len == 2) {
            s->cnt.chains++;
            s->cnt.chained_preemptions += 2; /* the first link counts now that it is a cascade */
        } else if (len > 2) {
            s->cnt.chained_preemptions++;
        }
        if (len > s->cnt.longest_chain) s->cnt.longest_chain = len;
        if (len >= 2) snprintf(note, cap, " [cascade %d, link %d]", chain, link);
    }
    v->chain = chain;
    v->chain_link = link;
    v->chain_until = v->n_tokens + s->block_size;
}

void sched_chain_lost(kv_sched *s, kv_sreq *v, int lost) {
    if (lost <= 0) return;
    s->cnt.tokens_discarded += (uint64_t)lost;
    if (lost > v->redo_until) v->redo_until = lost;
}

void sched_chain_scheduled(kv_sched *s, kv_sreq *r, int n) {
    if (r->redo_until <= r->n_computed || n <= 0) return;
    int redo = KV_MIN(n, r->redo_until - r->n_computed);
    s->cnt.tokens_recomputed += (uint64_t)redo;
    if (r->n_computed + n >= r->redo_until) r->redo_until = 0;
}

/* ---- admission ---- */

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of the remembered output lengths, or -1 when none. */
static int output_quantile(const kv_sched *s, double q) {
    int n = s->n_out_hist;
    if (n == 0) return -1;
    int tmp[OUT_HIST];
    memcpy(tmp, s->out_hist, (size_t)n * sizeof *tmp);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_int);
    int i = (int)ceil(q * n) - 1;
    return tmp[KV_MAX(0, KV_MIN(n - 1, i))];
}

int sched_admission_tokens(const kv_sched *s, const kv_sreq *r) {
    if (s->p.layout == KV_LAYOUT_CONTIGUOUS) return s->p.max_seq_len;
    int left = r->max_tokens - kv_sreq_n_generated(r); /* output still to come */
    int want = r->n_tokens;
    if (s->p.admission == KV_ADMIT_MAX_TOKENS) {
        want = r->n_tokens + left;
    } else if (s->p.admission == KV_ADMIT_QUANTILE) {
        /* before any request finished, nothing is known: reserve max_tokens */
        int qlen = output_quantile(s, s->p.admission_quantile);
        int more = qlen < 0 ? left : KV_MIN(left, KV_MAX(0, qlen - kv_sreq_n_generated(r)));
        want = r->n_tokens + more;
    }
    return KV_MIN(want, KV_MAX(r->n_tokens, s->p.max_seq_len));
}

void sched_note_output(kv_sched *s, const kv_sreq *r, kv_finish why) {
    if (why != KV_FINISH_EOS && why != KV_FINISH_LENGTH && why != KV_FINISH_STOP) return;
    s->out_hist[s->out_hist_pos] = kv_sreq_n_generated(r);
    s->out_hist_pos = (s->out_hist_pos + 1) % OUT_HIST;
    if (s->n_out_hist < OUT_HIST) s->n_out_hist++;
}

/* ---- order ---- */

void sched_fold_order(const kv_sched *s, kv_sreq *r) {
    r->owner_priority = r->priority;
    if (s->p.order != KV_ORDER_SHORT_FIRST) return;
    /* priority * 64 + (31 - log2(job length)): the owner's priority still
     * ranks first, then shorter jobs (by powers of two), then arrival */
    int p = KV_MAX(-1000000, KV_MIN(1000000, r->priority));
    unsigned len = (unsigned)r->n_prompt + (unsigned)r->max_tokens, bucket = 0;
    while (len > 1 && bucket < 31) len >>= 1, bucket++;
    r->priority = p * 64 + (31 - (int)bucket);
}

/* ---- batch size ---- */

int sched_max_seqs(const kv_sched *s) { return sched_batch_dynamic(s) ? s->bctl.cap : s->p.max_seqs; }

void kv_sched_observe_step(kv_sched *s, int n_seqs, double dur_ms) {
    if (!s || !sched_batch_dynamic(s)) return;
    kv_batch_ctl_observe(&s->bctl, n_seqs, dur_ms);
    s->cnt.batch_cap = s->bctl.cap;
    s->cnt.batch_goal_ms = s->bctl.goal_ms;
}
