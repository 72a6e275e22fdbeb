/* scheduler.c - continuous batching: each step grows the running requests
 * (preempting the lowest-priority, newest one when blocks run out), swaps
 * requests back in, admits waiting ones in priority order under the step's
 * budgets, and lays every scheduled token out in one batch. Every decision
 * is written down as a kv_decision so the TUI can show why. */
#include "scheduler.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"
#include "sched_internal.h"

/* ---- requests ---- */

int kv_sreq_init(kv_sreq *r, int64_t id, const int32_t *prompt, int n, int max_tokens, int spec_k) {
    memset(r, 0, sizeof *r);
    if (n <= 0 || max_tokens <= 0 || spec_k < 0 || (int64_t)n + max_tokens + spec_k + 1 > INT32_MAX)
        return KV_ERR_INVAL;
    int cap = n + max_tokens + spec_k + 1;
    r->tokens = malloc((size_t)cap * sizeof(int32_t));
    r->draft = malloc((size_t)(spec_k > 0 ? spec_k : 1) * sizeof(int32_t));
    if (!r->tokens || !r->draft) {
        free(r->tokens);
        free(r->draft);
        memset(r, 0, sizeof *r);
        return KV_ERR_NOMEM;
    }
    memcpy(r->tokens, prompt, (size_t)n * sizeof(int32_t));
    r->id = id;
    r->cap_tokens = cap;
    r->cap_draft = spec_k;
    r->n_prompt = n;
    r->n_tokens = n;
    r->max_tokens = max_tokens;
    r->state = KV_REQ_WAITING;
    kv_seq_init(&r->seq, (int)id, 0);
    return 0;
}

void kv_sreq_free(kv_sreq *r) {
    if (!r) return;
    free(r->tokens);
    free(r->draft);
    r->tokens = r->draft = NULL;
}

/* ---- small helpers ---- */

static int push(kv_sreq ***q, int *n, int *cap, kv_sreq *r) {
    if (kv_grow((void **)q, cap, *n + 1, sizeof **q)) return KV_ERR_NOMEM;
    (*q)[(*n)++] = r;
    return 0;
}

int sched_remove_from(kv_sreq **q, int *n, const kv_sreq *r) {
    for (int i = 0; i < *n; i++)
        if (q[i] == r) {
            memmove(q + i, q + i + 1, (size_t)(*n - i - 1) * sizeof *q);
            (*n)--;
            return 1;
        }
    return 0;
}


/* Records a decision of this step. The list only grows when it must; a
 * failed growth drops the decision rather than the step. */
void sched_decide(kv_sched *s, kv_decision_kind kind, int64_t req, const char *fmt, ...) {
    if (kv_grow((void **)&s->dec, &s->cap_dec, s->n_dec + 1, sizeof *s->dec)) return;
    kv_decision *d = &s->dec[s->n_dec++];
    memset(d, 0, sizeof *d); /* no stale bytes after the text: traces store the struct as it is */
    d->step = s->step;
    d->kind = kind;
    d->req = req;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->text, sizeof d->text, fmt, ap);
    va_end(ap);
}

/* Cache operations that may evict cached blocks or copy a shared one: the
 * counters' difference becomes EVICT / COW decisions naming the request. */
void sched_note_cache_delta(kv_sched *s, const kv_sreq *r, const kv_cache_stats *before) {
    kv_cache_stats after;
    kv_cache_get_stats(s->c, &after);
    uint64_t ev = after.evictions - before->evictions, cow = after.cow_copies - before->cow_copies;
    if (ev) {
        s->rec.n_evicted += (int)ev;
        sched_decide(s, KV_DEC_EVICT, r->id, "evict %llu cached block%s (LRU) for #%lld", (unsigned long long)ev,
                     ev == 1 ? "" : "s", (long long)r->id);
    }
    if (cow) {
        s->rec.n_cow += (int)cow;
        sched_decide(s, KV_DEC_COW, r->id, "copy-on-write: #%lld copies %llu shared block%s", (long long)r->id,
                     (unsigned long long)cow, cow == 1 ? "" : "s");
    }
}

int sched_reserve_tracked(kv_sched *s, kv_sreq *r, int n_new) {
    if (r->seq.n_reserved >= r->seq.n_tokens + n_new) return 0;
    kv_cache_stats before;
    kv_cache_get_stats(s->c, &before);
    int rc = kv_cache_seq_reserve(s->c, &r->seq, n_new);
    sched_note_cache_delta(s, r, &before);
    return rc;
}

/* ---- lifecycle ---- */

void kv_sched_params_from_config(kv_sched_params *p, const kv_config *cfg, int ctx_len, int n_blocks) {
    memset(p, 0, sizeof *p);
    p->policy = cfg->scheduler.policy;
    p->layout = cfg->kv.layout;
    p->preemption = cfg->scheduler.preemption;
    p->max_seqs = kv_config_max_seqs(cfg);
    p->max_batched_tokens = cfg->scheduler.max_batched_tokens;
    p->prefill_chunk = cfg->scheduler.prefill_chunk;
    p->max_wait_ms = cfg->scheduler.max_wait_ms;
    p->max_seq_len = cfg->scheduler.max_seq_len > 0 ? KV_MIN(cfg->scheduler.max_seq_len, ctx_len) : ctx_len;
    p->prefix_sharing = cfg->kv.prefix_sharing && cfg->kv.layout == KV_LAYOUT_PAGED;
    /* the epsilon keeps 0.01 * 2900 at 29, as n_blocks / 100 gave before the key existed */
    p->watermark_blocks = (int)floor(cfg->scheduler.watermark * n_blocks + 1e-9);
    p->admission = cfg->scheduler.admission;
    p->admission_quantile = cfg->scheduler.admission_quantile;
    p->preempt_victim = cfg->scheduler.preempt_victim;
    p->order = cfg->scheduler.order;
    p->target_tpot_ms = cfg->scheduler.target_tpot_ms;
    /* max_seqs auto: the given target, else the SLA's, else the controller's own (sched_batch.h) */
    p->batch_auto = cfg->scheduler.max_seqs == KV_KEY_AUTO_VALUE;
    if (p->batch_auto && !(p->target_tpot_ms > 0) && cfg->sla.tpot_ms > 0) p->target_tpot_ms = cfg->sla.tpot_ms;
}

kv_sched *kv_sched_new(const kv_sched_params *p, kv_cache *c, kv_err *err) {
    if (!p || !c) {
        kv_err_set(err, KV_ERR_INVAL, "scheduler: NULL params or cache");
        return NULL;
    }
    if (p->max_seqs < 1 || p->max_batched_tokens < 1 || p->prefill_chunk < 1 || p->max_seq_len < 1 ||
        p->watermark_blocks < 0 || p->max_wait_ms < 0 || p->target_tpot_ms < 0 ||
        (p->admission == KV_ADMIT_QUANTILE && !(p->admission_quantile > 0 && p->admission_quantile <= 1))) {
        kv_err_set(err, KV_ERR_INVAL,
                   "scheduler: max_seqs %d, max_batched_tokens %d, prefill_chunk %d, max_seq_len %d must be >= 1",
                   p->max_seqs, p->max_batched_tokens, p->prefill_chunk, p->max_seq_len);
        return NULL;
    }
    kv_sched *s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->p = *p;
    if (s->p.layout == KV_LAYOUT_CONTIGUOUS) s->p.prefix_sharing = 0;
    s->c = c;
    const kv_cache_params *cp = kv_cache_params_of(c);
    s->block_size = cp->block_size;
    s->n_blocks = cp->n_blocks;
    int T = p->max_batched_tokens, S = p->max_seqs;
    s->out.tokens = malloc((size_t)T * sizeof(int32_t));
    s->out.pos = malloc((size_t)T * sizeof(int32_t));
    s->out.seq = malloc((size_t)T * sizeof(int32_t));
    s->out.slot = malloc((size_t)T * sizeof(int32_t));
    s->out.logit_rows = malloc((size_t)T * sizeof(int32_t));
    s->out.reqs = malloc((size_t)S * sizeof(kv_sreq *));
    s->out.tables = malloc((size_t)S * sizeof(int32_t *));
    s->sched = malloc((size_t)S * sizeof(kv_sreq *));
    if (!s->out.tokens || !s->out.pos || !s->out.seq || !s->out.slot || !s->out.logit_rows || !s->out.reqs ||
        !s->out.tables || !s->sched)
        goto nomem;
    if (kv_cache_local_pages(c)) {
        s->out.lslot = malloc((size_t)T * sizeof(int32_t));
        s->out.ltables = malloc((size_t)S * sizeof(int32_t *));
        if (!s->out.lslot || !s->out.ltables) goto nomem;
    }
    if (kv_grow((void **)&s->dec, &s->cap_dec, 64, sizeof *s->dec)) goto nomem;
    kv_wq_init(&s->waiting, s->p.max_wait_ms);
    if (kv_vq_reserve(&s->victims, S + 1)) goto nomem;
    if (sched_guard_init(s)) goto nomem;
    return s;
nomem:
    kv_sched_free(s);
    kv_err_set(err, KV_ERR_NOMEM, "scheduler: out of memory for %d tokens x %d sequences", p->max_batched_tokens,
               p->max_seqs);
    return NULL;
}

void kv_sched_free(kv_sched *s) {
    if (!s) return;
    free(s->running);
    kv_vq_free(&s->victims);
    kv_wq_free(&s->waiting);
    free(s->swapped);
    free(s->out.tokens);
    free(s->out.pos);
    free(s->out.seq);
    free(s->out.slot);
    free(s->out.logit_rows);
    free(s->out.reqs);
    free(s->out.tables);
    free(s->out.lslot);
    free(s->out.ltables);
    free(s->ltab);
    free(s->sched);
    free(s->order);
    free(s->dec);
    sched_guard_free(s);
    free(s);
}

const kv_sched_params *kv_sched_params_of(const kv_sched *s) { return &s->p; }
kv_cache *kv_sched_cache(kv_sched *s) { return s->c; }

void kv_sched_begin_step(kv_sched *s, uint64_t step, double now_ms) {
    s->step = step;
    s->now_ms = now_ms;
    s->n_dec = 0;
    memset(&s->rec, 0, sizeof s->rec);
    s->rec.step = step;
    s->rec.t_ms = now_ms;
    s->out.n_reqs = 0; /* counts only; the arrays stay */
    s->out.n_tokens = s->out.n_logits = 0;
    s->out.n_prefill_tokens = s->out.n_decode_tokens = s->out.n_spec_tokens = 0;
    s->n_sched = 0;
}

int kv_sched_add(kv_sched *s, kv_sreq *r) {
    if (!r || r->state != KV_REQ_WAITING || r->admitted || r->n_prompt <= 0 || r->n_tokens != r->n_prompt ||
        r->seq.n_blocks != 0)
        return KV_ERR_INVAL;
    /* Every queue gets room for every live request now, so moving requests
     * between queues later (preemption, swap, admission) cannot fail. */
    int live = s->waiting.n + s->n_running + s->n_swapped + 1;
    if (kv_wq_reserve(&s->waiting, live) ||
        kv_grow((void **)&s->running, &s->cap_running, live, sizeof *s->running) ||
        kv_grow((void **)&s->swapped, &s->cap_swapped, live, sizeof *s->swapped) ||
        kv_grow((void **)&s->order, &s->cap_order, live, sizeof *s->order))
        return KV_ERR_NOMEM;
    sched_fold_order(s, r);
    kv_wq_push(&s->waiting, r);
    r->seq.id = (int)r->id;
    r->seq.tag = r->session;
    r->wait_reason[0] = 0;
    r->wait_kind = W_NONE, r->wait_a = 0, r->wait_b = 0;
    r->wait_seq = s->n_calls;
    return 0;
}

/* ---- ordering ---- */

int sched_starving(const kv_sched *s, const kv_sreq *r) { return kv_sq_starving(s->p.max_wait_ms, s->now_ms, r); }

/* Scheduling order (sched_queue.h): requests past the starvation guard
 * first (oldest first), then priority (higher first), then arrival. The
 * guard applies to waiting queues only. */
static int before(const kv_sched *s, const kv_sreq *a, const kv_sreq *b, int guard) {
    return kv_sq_before(s->p.max_wait_ms, s->now_ms, a, b, guard);
}

/* Insertion sort for the short queues (running, swapped): nearly sorted
 * from step to step, and the comparison needs the scheduler. */
void sched_sort_queue(const kv_sched *s, kv_sreq **q, int n, int guard) {
    for (int i = 1; i < n; i++) {
        kv_sreq *x = q[i];
        int j = i - 1;
        while (j >= 0 && before(s, x, q[j], guard)) {
            q[j + 1] = q[j];
            j--;
        }
        q[j + 1] = x;
    }
}

/* The victim when blocks run out: lowest priority, then most recent arrival
 * (or the least computed work: scheduler.preempt_victim, sched_guard.c). */
static kv_sreq *pick_victim(const kv_sched *s) { return sched_pick_victim(s); }

/* The victim for a waiting request of priority prio: the lowest-priority,
 * newest running request strictly below prio, or NULL. */
kv_sreq *sched_victim_below(const kv_sched *s, int prio) {
    kv_sreq *v = pick_victim(s);
    return v && v->priority < prio ? v : NULL;
}

/* Blocks held by running requests below priority prio (an upper bound of
 * what preempting them all frees: shared blocks stay). */
int sched_blocks_below(const kv_sched *s, int prio) { return kv_vq_blocks_below(&s->victims, prio); }

void sched_running_add(kv_sched *s, kv_sreq *r) {
    push(&s->running, &s->n_running, &s->cap_running, r); /* capacity ensured by kv_sched_add */
    kv_vq_insert(&s->victims, r);
}

static int running_remove(kv_sched *s, const kv_sreq *r) {
    if (!sched_remove_from(s->running, &s->n_running, r)) return 0;
    kv_vq_remove(&s->victims, r);
    return 1;
}

/* ---- scheduling ---- */

static void unschedule(kv_sched *s, kv_sreq *r) {
    if (r->n_sched > 0 && sched_remove_from(s->sched, &s->n_sched, r)) s->budget += r->n_sched;
    r->n_sched = r->n_sched_draft = 0;
}

void sched_preempt(kv_sched *s, kv_sreq *v, const kv_sreq *for_req) {
    char chain[40];
    sched_chain_preempt(s, v, for_req, chain, sizeof chain);
    unschedule(s, v);
    running_remove(s, v);
    v->preemptions++;
    v->n_draft = 0;
    s->cnt.preemptions++;
    int held = v->seq.n_blocks;
    char cause[48];
    if (for_req == v)
        snprintf(cause, sizeof cause, "to grow itself");
    else
        snprintf(cause, sizeof cause, "for #%lld", (long long)for_req->id);
    if (s->p.preemption == KV_PREEMPT_SWAP) {
        if (kv_cache_seq_swap_out(s->c, &v->seq) == 0) {
            v->state = KV_REQ_SWAPPED;
            push(&s->swapped, &s->n_swapped, &s->cap_swapped, v); /* capacity ensured by kv_sched_add */
            s->cnt.swaps_out++;
            s->rec.n_swapped_out++;
            sched_decide(s, KV_DEC_SWAP_OUT, v->id, "swap out #%lld %s: %d blocks to host, %d tokens kept%s",
                         (long long)v->id, cause, held, v->n_computed, chain);
            sched_put_reason(s, v, (why){W_SWAPPED_OUT, 0, 0});
            return;
        }
        kv_cache_stats cs;
        kv_cache_get_stats(s->c, &cs);
        if (held <= cs.n_swap_blocks) {
            sched_decide(s, KV_DEC_PREEMPT, v->id, "swap pool full: #%lld falls back to recompute", (long long)v->id);
        } else if (!s->said_swap_small) {
            /* an empty pool would not hold it either: said once, not at
             * every preemption of a long sequence */
            s->said_swap_small = 1;
            sched_decide(s, KV_DEC_PREEMPT, v->id,
                         "swap pool of %d blocks is smaller than #%lld's %d: sequences longer than kv.swap_memory "
                         "holds are recomputed instead",
                         cs.n_swap_blocks, (long long)v->id, held);
        }
    }
    sched_chain_lost(s, v, v->n_computed);
    kv_cache_seq_release(s->c, &v->seq);
    kv_seq_init(&v->seq, (int)v->id, v->session);
    int lost = v->n_computed;
    v->n_computed = 0;
    v->state = KV_REQ_PREEMPTED;
    s->cnt.recomputes++;
    s->rec.n_preempted++;
    kv_wq_push(&s->waiting, v); /* capacity ensured by kv_sched_add */
    if (s->p.policy == KV_POLICY_STATIC && s->cur_batch && v->batch == s->cur_batch) s->batch_waiting++;
    sched_decide(s, KV_DEC_PREEMPT, v->id, "preempt #%lld %s (recompute): %d blocks freed, %d tokens to redo%s",
                 (long long)v->id, cause, held, lost, chain);
    sched_put_reason(s, v, (why){W_PREEMPTED, 0, 0});
    /* preempted before the waiting loop, it is ordered into this step's
     * queue and looked at (or left in its tail) like the others */
    if (!s->in_waiting_loop) v->wait_seq = s->n_calls - 1;
}

void sched_put_scheduled(kv_sched *s, kv_sreq *r, int n_new, int n_draft) {
    r->n_sched = n_new;
    r->n_sched_draft = n_draft;
    r->is_prefill = !(r->n_tokens - r->n_computed == 1 && kv_sreq_n_generated(r) > 0);
    sched_chain_scheduled(s, r, n_new - n_draft);
    s->sched[s->n_sched++] = r;
    s->budget -= n_new;
}

/* Tokens r would run this step within the budget, and its drafts. */
int sched_plan_tokens(const kv_sched *s, const kv_sreq *r, int *n_draft) {
    int remaining = r->n_tokens - r->n_computed;
    *n_draft = 0;
    if (remaining <= 0 || s->budget <= 0) return 0;
    if (remaining == 1) {
        int d = r->n_draft;
        int room = r->max_tokens - kv_sreq_n_generated(r) - 1; /* drafts never overshoot max_tokens */
        d = KV_MIN(d, room);
        d = KV_MIN(d, s->budget - 1);
        d = KV_MIN(d, r->cap_draft);
        *n_draft = d > 0 ? d : 0;
        return 1 + *n_draft;
    }
    return KV_MIN(KV_MIN(remaining, s->p.prefill_chunk), s->budget);
}

/* Schedules running request r, preempting others (or r) when its next
 * tokens need blocks the pool does not have. */
static void schedule_running(kv_sched *s, kv_sreq *r) {
    int n_draft;
    int n_new = sched_plan_tokens(s, r, &n_draft);
    if (n_new == 0) return;
    for (;;) {
        int rc = sched_reserve_tracked(s, r, n_new);
        if (rc == 0) break;
        if (rc < 0) { /* internal error from the cache: leave r out of this step */
            sched_decide(s, KV_DEC_WAIT, r->id, "#%lld: cache refused to grow (%d)", (long long)r->id, rc);
            return;
        }
        if (n_draft > 0) { /* drafts are optional: drop them before hurting anyone */
            n_new -= n_draft;
            n_draft = 0;
            continue;
        }
        kv_sreq *v = pick_victim(s);
        if (!v) return;
        sched_preempt(s, v, r);
        if (v == r) return;
    }
    sched_put_scheduled(s, r, n_new, n_draft);
}

/* Sliding-window release: the scheduled sequences' tables into the local
 * layers' pages, back to back in one buffer. */
static int build_local_tables(kv_sched *s) {
    kv_sched_out *o = &s->out;
    int total = 0;
    for (int i = 0; i < s->n_sched; i++) total += s->sched[i]->seq.n_blocks;
    if (kv_grow((void **)&s->ltab, &s->ltab_cap, total > 0 ? total : 1, sizeof *s->ltab)) return KV_ERR_NOMEM;
    for (int i = 0, off = 0; i < s->n_sched; i++) {
        kv_cache_local_table(s->c, &s->sched[i]->seq, s->ltab + off);
        o->ltables[i] = s->ltab + off;
        off += s->sched[i]->seq.n_blocks;
    }
    return 0;
}

/* Lays the scheduled requests out as batch rows. */
static int build_batch(kv_sched *s) {
    kv_sched_out *o = &s->out;
    if (o->ltables && build_local_tables(s)) return KV_ERR_NOMEM;
    o->n_reqs = 0;
    o->n_tokens = o->n_logits = 0;
    o->n_prefill_tokens = o->n_decode_tokens = o->n_spec_tokens = o->n_pad_tokens = 0;
    int pad_src = -1; /* a decode row that padding rows can repeat */
    for (int i = 0; i < s->n_sched; i++) {
        kv_sreq *r = s->sched[i];
        int si = o->n_reqs++;
        o->reqs[si] = r;
        o->tables[si] = r->seq.blocks;
        r->sched_row = o->n_tokens;
        r->logit_row = -1;
        r->n_logits = 0;
        for (int j = 0; j < r->n_sched; j++) {
            int p = r->n_computed + j;
            int row = o->n_tokens++;
            if (row >= s->p.max_batched_tokens) return KV_ERR_RANGE;
            o->tokens[row] = p < r->n_tokens ? r->tokens[p] : r->draft[p - r->n_tokens];
            o->pos[row] = p;
            o->seq[row] = si;
            o->slot[row] = kv_cache_slot(s->c, &r->seq, p);
            if (o->slot[row] < 0) return KV_ERR_RANGE;
            if (o->lslot && (o->lslot[row] = kv_cache_local_slot(s->c, &r->seq, p)) < 0) return KV_ERR_RANGE;
        }
        if (r->n_computed + r->n_sched - r->n_sched_draft == r->n_tokens) {
            /* the step reaches the last known token: it samples, and each
             * draft is scored by the row before it */
            r->logit_row = o->n_logits;
            r->n_logits = 1 + r->n_sched_draft;
            for (int j = 0; j < r->n_logits; j++)
                o->logit_rows[o->n_logits++] = r->sched_row + (r->n_tokens - 1 - r->n_computed) + j;
        }
        int n_plain = r->n_sched - r->n_sched_draft;
        if (r->is_prefill) {
            o->n_prefill_tokens += n_plain;
            if (r->n_sched > 0)
                sched_decide(s, KV_DEC_CHUNK, r->id, "chunk #%lld: tokens %d..%d of %d%s", (long long)r->id,
                             r->n_computed, r->n_computed + n_plain - 1, r->n_tokens,
                             r->n_logits ? ", then samples" : "");
        } else {
            o->n_decode_tokens += n_plain;
            if (pad_src < 0 && n_plain == 1 && r->n_sched_draft == 0) pad_src = r->sched_row;
        }
        /* the engine records a KV_DEC_SPEC decision once it knows what was accepted */
        o->n_spec_tokens += r->n_sched_draft;
    }
    /* NOTE: static batching as frameworks without iteration-level
     * scheduling run it: a finished member's slot stays in the batch and is
     * computed (padding) until the whole batch is done. Each padding row
     * repeats a live decode row (same token, position and slot, so the K/V
     * it stores are the very bytes that row stores, and no logits are read):
     * the cost is real, the results are untouched. */
    if (s->p.policy == KV_POLICY_STATIC && s->cur_batch && s->batch_live > 0 && pad_src >= 0) {
        int n_pad = s->batch_size - s->batch_live;
        while (n_pad-- > 0 && o->n_tokens < s->p.max_batched_tokens) {
            int row = o->n_tokens++;
            o->tokens[row] = o->tokens[pad_src];
            o->pos[row] = o->pos[pad_src];
            o->seq[row] = o->seq[pad_src];
            o->slot[row] = o->slot[pad_src];
            if (o->lslot) o->lslot[row] = o->lslot[pad_src];
            o->n_pad_tokens++;
        }
    }
    return 0;
}

int kv_sched_schedule(kv_sched *s, double now_ms, const kv_sched_out **out) {
    s->n_calls++;
    s->now_ms = now_ms;
    s->budget = s->p.max_batched_tokens;
    s->n_sched = 0;
    for (int i = 0; i < s->n_running; i++) {
        s->running[i]->n_sched = s->running[i]->n_sched_draft = 0;
        s->running[i]->n_logits = 0;
    }
    /* 1. running requests: decodes first so a long prefill never stalls
     * them, then prefill chunks; each group by priority and arrival. */
    if (s->n_running > 0) {
        int n = s->n_running;
        memcpy(s->order, s->running, (size_t)n * sizeof *s->order);
        sched_sort_queue(s, s->order, n, 0);
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < n; i++) {
                kv_sreq *r = s->order[i];
                if (r->state != KV_REQ_RUNNING || r->n_sched > 0) continue;
                if (r->hold_until_ms > now_ms) continue; /* its KV is not here yet (disaggregated pools) */
                int decoding = r->n_tokens - r->n_computed == 1;
                if (decoding != (pass == 0)) continue;
                schedule_running(s, r);
            }
    }
    /* 2. swapped requests come back before anyone new is admitted. */
    sched_schedule_swapped(s);
    /* 3. admission. */
    sched_schedule_waiting(s);
    if (s->n_running > s->cnt.max_running) s->cnt.max_running = s->n_running;
    int rc = build_batch(s);
    *out = &s->out;
    if (rc) return rc;
    s->cnt.prefill_tokens += (uint64_t)s->out.n_prefill_tokens;
    s->cnt.decode_tokens += (uint64_t)s->out.n_decode_tokens;
    s->cnt.spec_tokens += (uint64_t)s->out.n_spec_tokens;
    return s->out.n_tokens;
}

void kv_sched_set_drafts(kv_sched *s, const kv_sreq *r) {
    if (!s || !r || r->n_sched_draft <= 0 || r->n_sched < r->n_sched_draft) return;
    int first = r->sched_row + r->n_sched - r->n_sched_draft;
    if (first < 0 || first + r->n_sched_draft > s->out.n_tokens) return;
    memcpy(s->out.tokens + first, r->draft, (size_t)r->n_sched_draft * sizeof(int32_t));
}

int kv_sched_update(kv_sched *s, kv_sreq *r, const int32_t *new_tokens, int n_new) {
    if (!r || r->state != KV_REQ_RUNNING || r->n_sched <= 0) return KV_ERR_INVAL;
    int accepted = 0;
    if (r->n_logits == 0) {
        if (n_new != 0) return KV_ERR_INVAL;
    } else {
        if (n_new < 1 || n_new > 1 + r->n_sched_draft || !new_tokens) return KV_ERR_INVAL;
        accepted = n_new - 1;
        /* accepted drafts must be the drafts whose K/V the forward wrote */
        for (int j = 0; j < accepted; j++)
            if (new_tokens[j] != r->draft[j]) return KV_ERR_INVAL;
        if (r->n_tokens + n_new > r->cap_tokens) return KV_ERR_INVAL;
    }
    int n_valid = r->n_sched - r->n_sched_draft + accepted;
    if (n_new > 0) memcpy(r->tokens + r->n_tokens, new_tokens, (size_t)n_new * sizeof(int32_t));
    r->n_tokens += n_new;
    kv_cache_seq_commit(s->c, &r->seq, r->tokens, r->n_computed + n_valid);
    r->n_computed += n_valid;
    if (accepted < r->n_sched_draft) kv_cache_seq_truncate(s->c, &r->seq, r->n_computed);
    r->n_draft = 0;
    r->n_sched = 0; /* one update per scheduled step */
    return 0;
}

void kv_sched_finish(kv_sched *s, kv_sreq *r, kv_finish why) {
    if (!r || r->state == KV_REQ_FINISHED) return;
    int was_running = r->state == KV_REQ_RUNNING;
    /* each queue is searched for what its state says it is in, then the
     * others (the waiting queue's search costs a binary search) */
    int gone = 0;
    if (r->state == KV_REQ_WAITING || r->state == KV_REQ_PREEMPTED) {
        gone = kv_wq_remove(&s->waiting, r);
        if (gone && s->p.policy == KV_POLICY_STATIC && s->cur_batch && r->batch == s->cur_batch &&
            s->batch_waiting > 0)
            s->batch_waiting--;
    }
    if (!gone && !running_remove(s, r) && !sched_remove_from(s->swapped, &s->n_swapped, r) &&
        r->state != KV_REQ_WAITING && r->state != KV_REQ_PREEMPTED)
        kv_wq_remove(&s->waiting, r);
    if (r->n_sched > 0) sched_remove_from(s->sched, &s->n_sched, r);
    kv_cache_seq_release(s->c, &r->seq);
    kv_seq_init(&r->seq, (int)r->id, r->session);
    if (s->p.policy == KV_POLICY_STATIC && r->batch != 0 && r->batch == s->cur_batch && s->batch_live > 0)
        s->batch_live--;
    r->state = KV_REQ_FINISHED;
    r->n_draft = 0;
    sched_note_output(s, r, why);
    static const char *names[] = {"none", "eos", "length", "stop string", "cancelled", "rejected", "error"};
    const char *name = (unsigned)why < KV_ARRAY_LEN(names) ? names[why] : "?";
    if (why == KV_FINISH_CANCELLED) {
        sched_decide(s, KV_DEC_CANCEL, r->id, "cancel #%lld (%s): %d tokens generated", (long long)r->id,
                     was_running ? "running" : "not running", kv_sreq_n_generated(r));
    } else {
        sched_decide(s, KV_DEC_FINISH, r->id, "finish #%lld (%s): %d prompt + %d generated tokens", (long long)r->id,
                     name, r->n_prompt, kv_sreq_n_generated(r));
    }
    s->cnt.finished++;
    s->rec.n_finished++;
}

void kv_sched_end_step(kv_sched *s, kv_step_record *rec, const kv_decision **decisions, int *n_decisions) {
    kv_cache_stats st;
    kv_cache_get_stats(s->c, &st);
    s->rec.n_seqs = s->out.n_reqs;
    s->rec.n_prefill_tokens = s->out.n_prefill_tokens;
    s->rec.n_decode_tokens = s->out.n_decode_tokens;
    s->rec.n_pad_tokens = s->out.n_pad_tokens;
    s->rec.n_spec_tokens = s->out.n_spec_tokens;
    s->rec.n_blocks_used = st.n_used;
    s->rec.n_waiting = s->waiting.n + s->n_swapped;
    if (rec) *rec = s->rec;
    if (decisions) *decisions = s->dec;
    if (n_decisions) *n_decisions = s->n_dec;
}

/* ---- public extras ---- */

void kv_sched_decide(kv_sched *s, kv_decision_kind kind, int64_t req, const char *text) {
    sched_decide(s, kind, req, "%s", text);
}

int kv_sched_running(const kv_sched *s, kv_sreq *const **out) {
    *out = s->running;
    return s->n_running;
}
int kv_sched_waiting(const kv_sched *s, kv_sreq *const **out) {
    *out = s->waiting.v ? s->waiting.v + s->waiting.off : NULL;
    return s->waiting.n;
}

int kv_sched_swapped(const kv_sched *s, kv_sreq *const **out) {
    *out = s->swapped;
    return s->n_swapped;
}
int kv_sched_idle(const kv_sched *s) { return s->n_running == 0 && s->waiting.n == 0 && s->n_swapped == 0; }

void kv_sched_get_counters(const kv_sched *s, kv_sched_counters *out) { *out = s->cnt; }
