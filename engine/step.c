/* step.c - one step of the engine: move submitted requests and
 * cancellations in, plan speculative drafts, schedule, run one batched
 * forward pass, sample, feed the detokenizer and the stop strings, stream
 * events, finish requests, record the step; and the step hook around it.
 * The engine's shared state is in engine_internal.h. */
#include <stdlib.h>
#include <string.h>

#include "../base/common.h"
#include "../base/utf8.h"
#include "../base/vec.h"
#include "engine_internal.h"
#include "synthetic.h"

/* ---- events ---- */

/* Queues an event of this step (published at the end of the step). */
static kv_event *local_event(kv_engine *e, kv_event_type type, const ereq *r) {
    if (kv_grow((void **)&e->lev, &e->cap_lev, e->n_lev + 1, sizeof *e->lev)) return NULL;
    kv_event *ev = &e->lev[e->n_lev++];
    memset(ev, 0, sizeof *ev);
    ev->type = type;
    ev->req = r->s.id;
    ev->session = r->s.session;
    ev->token = -1;
    ev->t_ms = e->ev_at_ms > 0 ? e->ev_at_ms : engine_now_ms(e);
    return ev;
}

/* Emits text as one or more events: the first is `first` (already queued),
 * the rest are TOKEN events with token -1 carrying the overflow. Cuts only
 * between UTF-8 characters. */
static void emit_text(kv_engine *e, ereq *r, kv_event *first, const char *text, size_t len) {
    kv_event *ev = first;
    kv_token_source src = first ? first->source : KV_TOKSRC_DECODE;
    while (len > 0) {
        if (!ev) {
            ev = local_event(e, KV_EVENT_TOKEN, r);
            if (!ev) return;
            ev->source = src;
        }
        size_t n = kv_utf8_boundary(text, len, KV_MIN(len, sizeof ev->text - 1)); /* not inside a character */
        if (n == 0) n = KV_MIN(len, sizeof ev->text - 1);
        memcpy(ev->text, text, n);
        ev->text[n] = 0;
        ev->text_len = (int)n;
        text += n;
        len -= n;
        ev = NULL;
    }
}

/* ---- requests ---- */

void kv_engine_queue_lengths(kv_engine *e, int *waiting, int *running) {
    *waiting = *running = 0;
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    *waiting = e->n_inbox + atomic_load(&e->sched_waiting);
    *running = atomic_load(&e->sched_running);
    pthread_mutex_unlock(&e->mu);
}

static int live_find(const kv_engine *e, int64_t id) {
    int lo = e->live_front, hi = e->n_live - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int64_t x = e->live[mid]->s.id;
        if (x == id) return mid;
        if (x < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

void engine_live_compact(kv_engine *e) {
    if (e->live_front == 0) return;
    int n = e->n_live - e->live_front;
    memmove(e->live, e->live + e->live_front, (size_t)n * sizeof *e->live);
    e->n_live = n;
    e->live_front = 0;
}

/* Takes entry li out of the live table, moving the shorter side: requests
 * finish mostly near the front (the oldest), so a long queue behind them
 * is not moved at each finish. */
static void live_remove(kv_engine *e, int li) {
    if (li - e->live_front < e->n_live - 1 - li) {
        memmove(e->live + e->live_front + 1, e->live + e->live_front, (size_t)(li - e->live_front) * sizeof *e->live);
        e->live[e->live_front++] = NULL;
    } else {
        memmove(e->live + li, e->live + li + 1, (size_t)(e->n_live - li - 1) * sizeof *e->live);
        e->n_live--;
    }
    if (e->live_front == e->n_live) e->live_front = e->n_live = 0;
    /* the holes at the front are given back once they are the larger part */
    else if (e->live_front >= 1024 && e->live_front >= e->n_live - e->live_front) engine_live_compact(e);
}

/* The list of requests that may hold draft-cache blocks. */
static void spec_hold(kv_engine *e, ereq *r) {
    if (r->held) return;
    r->held = 1;
    r->held_prev = NULL;
    r->held_next = e->spec_held;
    if (e->spec_held) e->spec_held->held_prev = r;
    e->spec_held = r;
}

static void spec_unhold(kv_engine *e, ereq *r) {
    if (!r->held) return;
    if (r->held_prev) r->held_prev->held_next = r->held_next;
    else e->spec_held = r->held_next;
    if (r->held_next) r->held_next->held_prev = r->held_prev;
    r->held = 0;
    r->held_prev = r->held_next = NULL;
}

static int text_append(ereq *r, const char *s, size_t n) {
    if (kv_grow_size((void **)&r->text, &r->text_cap, r->text_len + n + 1, 1)) return KV_ERR_NOMEM;
    memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = 0;
    return 0;
}

/* Bytes at the end of the text that could begin a stop string: held back
 * until the next token decides. */
static size_t stop_holdback(const ereq *r) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = KV_MIN(sl - 1, r->text_len); k > hold; k--)
            if (memcmp(r->text + r->text_len - k, r->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Looks for a stop string in the text added since `from`; cuts the text at
 * the earliest match and returns 1. */
static int stop_match(ereq *r, size_t from) {
    if (r->n_stop == 0) return 0;
    size_t start = from > (size_t)r->max_stop ? from - (size_t)r->max_stop : 0;
    size_t best = (size_t)-1;
    for (int i = 0; i < r->n_stop; i++) {
        const char *p = memmem(r->text + start, r->text_len - start, r->stop[i], strlen(r->stop[i]));
        if (p && (size_t)(p - r->text) < best) best = (size_t)(p - r->text);
    }
    if (best == (size_t)-1) return 0;
    r->text_len = best;
    r->text[best] = 0;
    return 1;
}

/* Ends r: metrics, scheduler, the finished-row ring, the reply text into
 * the id table, and the DONE event carrying any held-back text. */
void engine_finish_req(kv_engine *e, ereq *r, kv_finish why, const char *reason) {
    double t = e->ev_at_ms > 0 ? e->ev_at_ms : engine_now_ms(e);
    if (why != KV_FINISH_STOP) {
        int n = kv_detok_flush(e->model->tok, &r->detok, e->piece, e->piece_cap);
        if (n > 0) text_append(r, e->piece, (size_t)n);
    }
    kv_metrics_finished(e->metrics, &r->rm, why, t);
    kv_sched_finish(e->sched, &r->s, why);
    kv_spec_release(e->spec, &r->ss);
    spec_unhold(e, r);
    r->finish = why;
    /* Text held back for a possible stop string goes out now: in the DONE
     * event, or before it as TOKEN(-1) events when it does not fit. */
    size_t tail = r->text_len > r->emitted ? r->text_len - r->emitted : 0;
    if (tail >= sizeof ((kv_event *)0)->text) {
        emit_text(e, r, NULL, r->text + r->emitted, tail);
        tail = 0;
    }
    kv_snap_request row;
    engine_snap_row(e, r, &row);
    kv_event *ev = local_event(e, KV_EVENT_DONE, r);
    if (ev) {
        ev->finish = why;
        kv_copy_str(ev->reason, sizeof ev->reason, reason ? reason : "");
        ev->queue_ms = row.queue_ms;
        ev->e2e_ms = row.e2e_ms;
        ev->n_prefix_hit = row.n_prefix_hit;
        ev->preemptions = row.preemptions;
        if (tail > 0) emit_text(e, r, ev, r->text + r->emitted, tail);
    }
    r->emitted = r->text_len;
    kv_ring_push(&e->finished, &row);
    int li = live_find(e, r->s.id);
    if (li >= 0) live_remove(e, li);
    pthread_mutex_lock(&e->mu);
    id_rec *rec = &e->ids[r->s.id];
    rec->state = ID_FINISHED;
    rec->text = r->text;
    rec->len = (int)r->text_len;
    r->text = NULL;
    e->n_active--;
    pthread_mutex_unlock(&e->mu);
    engine_ereq_free(r);
}

/* ---- the step ---- */

/* Moves submitted requests into the scheduler and pending rejections into
 * the records (state_mu held). */
void engine_drain_inbox(kv_engine *e, int in_step) {
    pthread_mutex_lock(&e->mu);
    int n = e->n_inbox;
    for (int i = 0; i < n; i++) {
        ereq *r = e->inbox[i];
        /* live stays sorted by id: inbox ids increase */
        if (e->n_live == e->cap_live) engine_live_compact(e); /* the holes first, then more room */
        if (kv_grow((void **)&e->live, &e->cap_live, e->n_live + 1, sizeof *e->live) ||
            kv_sched_add(e->sched, &r->s)) {
            /* cannot queue it: keep it in the inbox for the next step */
            memmove(e->inbox, e->inbox + i, (size_t)(n - i) * sizeof *e->inbox);
            e->n_inbox = n - i;
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->live[e->n_live++] = r;
        atomic_fetch_add(&e->sched_waiting, 1);
        kv_metrics_submitted(e->metrics, r->s.arrival_ms);
    }
    e->n_inbox = 0;
    for (int i = 0; i < e->n_pend; i++) {
        kv_metrics_submitted(e->metrics, e->pend_rej_ms[i]);
        kv_metrics_rejected(e->metrics, e->pend_rej_ms[i]);
        if (in_step) {
            kv_sched_decide(e->sched, KV_DEC_REJECT, e->pend_dec[i].req, e->pend_dec[i].text);
        } else { /* outside a step: straight into the record */
            e->pend_dec[i].step = e->step;
            kv_ring_push(&e->decisions, &e->pend_dec[i]);
        }
    }
    e->n_pend = 0;
    pthread_mutex_unlock(&e->mu);
}

static void process_cancels(kv_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->n_cancels;
    if (kv_grow((void **)&e->cancel_scratch, &e->cap_cancel_scratch, n, sizeof(int64_t))) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (n) memcpy(e->cancel_scratch, e->cancels, (size_t)n * sizeof(int64_t));
    e->n_cancels = 0;
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++) {
        int li = live_find(e, e->cancel_scratch[i]);
        if (li >= 0) engine_finish_req(e, e->live[li], KV_FINISH_CANCELLED, "cancelled");
    }
}

/* Speculative decoding, before scheduling: every running request whose
 * next step is a decode gets a draft length (and ngram drafts their
 * tokens); requests that left the device give their draft-cache blocks
 * back. Returns how many items it planned (e->items).
 * NOTE: only requests that were drafted for can hold draft-cache blocks,
 * and they are kept on a list (spec_hold), so giving blocks back costs
 * those, not the whole waiting queue. */
/* A synthetic model's drafts (spec.method on a synthetic model): every
 * decoding request proposes spec.k ids (kv_synth_draft_token) before the
 * schedule; the scheduler keeps what fits. */
static void synth_plan_drafts(kv_engine *e) {
    kv_sreq *const *run;
    int nrun = kv_sched_running(e->sched, &run);
    for (int i = 0; i < nrun; i++) {
        kv_sreq *r = run[i];
        r->n_draft = 0;
        if (r->state != KV_REQ_RUNNING || r->n_tokens - r->n_computed != 1 || kv_sreq_n_generated(r) == 0) continue;
        int k = KV_MIN(e->spec_k, r->cap_draft);
        for (int j = 0; j < k; j++) r->draft[j] = kv_synth_draft_token(e->synth, e->cfg.workload.seed, r->id, r->n_tokens + j);
        r->n_draft = k;
    }
}

/* Charges drafting for what the scheduler kept of the synthetic drafts. */
static void synth_draft_cost(kv_engine *e, const kv_sched_out *o) {
    int n = 0, k = 0;
    double ctx = 0;
    for (int i = 0; i < o->n_reqs; i++)
        if (o->reqs[i]->n_sched_draft > 0) {
            n++;
            k = KV_MAX(k, o->reqs[i]->n_sched_draft);
            ctx += o->reqs[i]->n_computed + 1;
        }
    kv_synth_draft_cost(e->synth, n, ctx, k);
}

/* Greedy verification of a synthetic model's drafts: the target's id at
 * each drafted position is known (kv_synth_token), so drafts are accepted
 * while they match; the first mismatch gives the target's id instead, and
 * all matching gives a bonus id after them. Returns the ids written. */
static int synth_verify(kv_engine *e, const kv_sreq *s, int32_t *out) {
    int j = 0;
    for (; j < s->n_sched_draft; j++) {
        out[j] = kv_synth_token(e->model, e->cfg.workload.seed, s->id, s->n_tokens + j);
        if (s->draft[j] != out[j]) return j + 1;
    }
    out[j] = kv_synth_token(e->model, e->cfg.workload.seed, s->id, s->n_tokens + j);
    return j + 1;
}

static int spec_plan(kv_engine *e) {
    if (e->synth && e->spec_k > 0) synth_plan_drafts(e);
    if (!e->spec) return 0;
    for (ereq *r = e->spec_held, *next; r; r = next) {
        next = r->held_next;
        if (r->s.state == KV_REQ_RUNNING) continue;
        kv_spec_release(e->spec, &r->ss); /* waiting (preempted) or swapped */
        spec_unhold(e, r);
    }
    kv_sreq *const *run;
    int nrun = kv_sched_running(e->sched, &run), n = 0;
    int cap = kv_config_max_seqs(&e->cfg);
    for (int i = 0; i < nrun && n < cap; i++) {
        ereq *r = (ereq *)run[i]; /* kv_sreq is ereq's first member */
        if (r->s.state != KV_REQ_RUNNING || r->s.n_tokens - r->s.n_computed != 1 || kv_sreq_n_generated(&r->s) == 0)
            continue;
        e->items[n++] = (kv_spec_item){.r = &r->s, .ss = &r->ss, .sampling = &r->sampling, .rng = &r->rng};
        spec_hold(e, r);
    }
    kv_spec_plan(e->spec, e->items, n);
    return n;
}

/* Whether r's logit rows of this step are all finite. NaN or Inf there
 * (non-finite weights, a backend fault) would sample garbage: the request
 * ends with an error instead, and the others go on. Costs a pass over rows
 * the sampler reads anyway. */
static int logits_finite(const kv_engine *e, const kv_sreq *s) {
    if (e->scanned) { /* the backend's scan of the rows */
        for (int i = 0; i < s->n_logits; i++)
            if (!e->scan_finite[s->logit_row + i]) return 0;
        return 1;
    }
    const float *lg = e->logits + (size_t)s->logit_row * (size_t)e->n_vocab;
    size_t n = (size_t)s->n_logits * (size_t)e->n_vocab;
    /* all exponent bits set: NaN or Inf. An integer test in blocks of a
     * fixed 64, which compilers vectorise at -O2 (a loop of unknown length
     * stayed scalar: ~3 ms of a 64-concurrent step) */
    uint32_t bad = 0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        uint32_t m = 0;
        for (int j = 0; j < 64; j++) {
            uint32_t u;
            memcpy(&u, lg + i + (size_t)j, sizeof u);
            m |= (u & 0x7f800000u) == 0x7f800000u;
        }
        bad |= m;
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, lg + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

/* Samples the tokens of request r from its logit rows: one token for a
 * plain step; after drafts, the verified ones and the target's next token
 * (kv_spec_verify). Writes the new tokens to out and returns how many. */
static int sample_request(kv_engine *e, ereq *r, int32_t *out) {
    kv_sreq *s = &r->s;
    if (e->synth) { /* a synthetic model: the id follows from the seed, the request and the position */
        if (s->n_sched_draft > 0) return synth_verify(e, s, out);
        out[0] = kv_synth_token(e->model, e->cfg.workload.seed, s->id, s->n_tokens);
        return 1;
    }
    const float *lg = e->logits + (size_t)s->logit_row * (size_t)e->n_vocab;
    if (s->n_sched_draft > 0 && e->spec) {
        kv_spec_item it = {.r = s, .ss = &r->ss, .sampling = &r->sampling, .rng = &r->rng};
        return kv_spec_verify(e->spec, &it, e->sampler, lg, e->n_vocab, e->probs, out);
    }
    if (e->scanned && kv_sampling_plain_greedy(&r->sampling)) {
        out[0] = e->scan_ids[s->logit_row]; /* what kv_sampler_sample would take: the scan's argmax */
        return 1;
    }
    out[0] = kv_sampler_sample(e->sampler, &r->sampling, lg, s->tokens, s->n_tokens, &r->rng);
    return 1;
}

/* Feeds r's new tokens to the detokenizer, the stop strings and the event
 * stream. verified: the tokens come from a verify step, whose first
 * n_accepted are accepted drafts and whose last is the target's own token
 * (the bonus after all drafts, or the correction after a rejected one).
 * rows: r's logit rows of the step when it asked for logprobs, else NULL.
 * Returns the finish reason, or KV_FINISH_NONE. */
static kv_finish emit_tokens(kv_engine *e, ereq *r, const int32_t *toks, int n, int verified, int n_accepted,
                             const float *rows) {
    kv_finish fin = KV_FINISH_NONE;
    for (int i = 0; i < n && fin == KV_FINISH_NONE; i++) {
        int32_t t = toks[i];
        kv_event *ev = local_event(e, KV_EVENT_TOKEN, r);
        if (ev) {
            ev->token = t;
            ev->source = verified ? (i < n_accepted ? KV_TOKSRC_DRAFT : KV_TOKSRC_BONUS) : KV_TOKSRC_DECODE;
            if (rows) { /* token i was chosen from logit row i (a verify step's rows follow the drafts) */
                ev->logprob = kv_sampler_logprobs(rows + (size_t)i * (size_t)e->n_vocab, e->n_vocab, t,
                                                  r->top_logprobs, ev->top_token, ev->top_logprob);
                ev->n_top = r->top_logprobs;
                ev->has_logprob = 1;
            }
        }
        int eog = kv_tokenizer_is_eog(e->model->tok, t);
        if (eog && !r->ignore_eos) {
            fin = KV_FINISH_EOS;
            continue;
        }
        size_t before = r->text_len;
        int nb = kv_detok_push(e->model->tok, &r->detok, t, e->piece, e->piece_cap);
        if (nb > 0) text_append(r, e->piece, (size_t)nb);
        if (stop_match(r, before)) fin = KV_FINISH_STOP;
        size_t safe = fin == KV_FINISH_STOP ? r->text_len : r->text_len - stop_holdback(r);
        if (safe > r->emitted) {
            emit_text(e, r, ev, r->text + r->emitted, safe - r->emitted);
            r->emitted = safe;
        }
    }
    if (fin == KV_FINISH_NONE && kv_sreq_n_generated(&r->s) >= r->s.max_tokens) fin = KV_FINISH_LENGTH;
    return fin;
}

/* Hands the step's events to readers, all at once, after the step has
 * released state_mu (only the stepping thread touches e->lev and writes
 * e->step): a reader woken by an event then finds no step running unless
 * the next one has begun, and builds a snapshot at least as new as the
 * step that made the event; one that finds the next step running takes the
 * published copy, at most max(a step, KV_PUBLISH_MS) old (engine_publish).
 * Flushing while state_mu was held made a single-stepping reader take a
 * copy a step behind the events it had seen. */
static void flush_events(kv_engine *e) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_lev; i++) kv_ring_push(&e->ev, &e->lev[i]);
    e->n_lev = 0;
    e->steps_done = e->step;
    pthread_cond_broadcast(&e->ev_cond);
    pthread_mutex_unlock(&e->mu);
}

/* Disaggregated pools: the step's queue lengths. A running request whose
 * KV is not on the decode pool yet is on the prefill pool (chunks queued
 * or running there: no first token yet at the pool's clock) or in its
 * hand-over (first token out, held until the KV arrives). */
static void synth_observe(kv_engine *e, double now_ms) {
    kv_sreq *const *run;
    int n = kv_sched_running(e->sched, &run), in_pre = 0, in_xfer = 0;
    double kv_tokens = 0.0;
    for (int i = 0; i < n; i++) {
        const ereq *r = (const ereq *)run[i]; /* kv_sreq is ereq's first member */
        int gen = kv_sreq_n_generated(&r->s) > 0;
        if (gen && !(r->s.hold_until_ms > now_ms)) continue; /* decoding */
        if (gen && r->rm.first_token_ms <= now_ms) in_xfer++;
        else in_pre++;
        kv_tokens += r->s.n_computed;
    }
    kv_synth_observe(e->synth, in_pre, in_xfer, kv_tokens);
}

double engine_next_hold_ms(kv_engine *e) {
    if (!kv_synth_pools_of(e->synth)) return 0.0;
    kv_sreq *const *run;
    int n = kv_sched_running(e->sched, &run);
    double now = engine_now_ms(e), best = 0.0;
    for (int i = 0; i < n; i++) {
        double h = run[i]->hold_until_ms;
        if (h > now && (best == 0.0 || h < best)) best = h;
    }
    return best;
}

int engine_skip_to_hold(kv_engine *e, double max_ms) {
    if (!e->virt) return 0;
    double h = engine_next_hold_ms(e);
    if (!(h > 0)) return 0;
    double wait = h - engine_now_ms(e);
    if (max_ms > 0 && wait > max_ms) wait = max_ms;
    return wait > 0 && kv_engine_advance_clock(e, wait) == 0;
}

/* A synthetic model's forward: its step-time model from the step's start. */
static int synth_forward(kv_engine *e, const kv_batch *b, double now_ms, kv_err *err) {
    kv_synth_begin(e->synth, now_ms);
    return kv_synth_step(e->synth, b, err);
}

/* After a synthetic step, for r (batch sequence i): its hold until its KV
 * is on the decode pool, and the time of its tokens (a disaggregated
 * prefill pool's batch end, later than f1_ms), which the step's events and
 * a finish of r carry when it has nt > 0 tokens. */
static double synth_hand_over(kv_engine *e, ereq *r, int i, double f1_ms, int nt) {
    r->s.hold_until_ms = kv_synth_hold_ms(e->synth, i);
    double t = kv_synth_token_ms(e->synth, i);
    if (!(t > f1_ms)) return f1_ms;
    if (nt > 0) e->ev_at_ms = t;
    return t;
}

/* One iteration (state_mu held). Returns 1 when it did something. */
static int step_locked(kv_engine *e) {
    double t0 = engine_now_ms(e);
    const double sim0 = engine_device_s(e); /* 0 unless the backend models a device clock (sim) */
    int emitted = 0;
    uint64_t step = e->step + 1;
    kv_sched_begin_step(e->sched, step, t0);
    engine_drain_inbox(e, 1);
    process_cancels(e);
    double d0 = engine_now_ms(e);
    int n_items = spec_plan(e);
    double d_plan = engine_now_ms(e) - d0;
    const kv_sched_out *o;
    int n = kv_sched_schedule(e->sched, t0, &o);
    int rc = 0;
    if (n < 0) {
        rc = n;
        n = 0;
    }
    if (e->synth && e->spec_k > 0) synth_draft_cost(e, o);
    if (n_items > 0) {
        /* model drafts for exactly what the scheduler kept, batched over
         * every speculating sequence */
        double d1 = engine_now_ms(e);
        kv_err derr;
        kv_err_clear(&derr);
        if (kv_spec_draft(e->spec, e->sched, e->items, n_items, e->sampler, &derr) != 0)
            kv_sched_decide(e->sched, KV_DEC_SPEC, 0, derr.msg); /* verified as placeholders */
        d_plan += engine_now_ms(e) - d1;
    }
    double f0 = engine_now_ms(e), f1 = f0;
    /* queue time and prefix hits are measured at the first admission */
    for (int i = 0; i < o->n_reqs; i++) {
        ereq *r = (ereq *)o->reqs[i];
        if (r->rm.admit_ms < 0 && r->s.admitted)
            kv_metrics_admitted(e->metrics, &r->rm, r->s.first_admit_ms, r->s.n_prefix_hit);
    }
    if (n > 0) {
        kv_batch b = {.n_tokens = o->n_tokens, .tokens = o->tokens,
                      .ab = {.n_tokens = o->n_tokens, .pos = o->pos, .seq = o->seq, .slot = o->slot,
                             .n_seqs = o->n_reqs, .tables = o->tables},
                      .n_logits = o->n_logits, .logit_rows = o->logit_rows, .n_layers = 0,
                      .kv_local = kv_cache_local_pages(e->cache),
                      .ab_local = {.n_tokens = o->n_tokens, .pos = o->pos, .seq = o->seq, .slot = o->lslot,
                                   .n_seqs = o->n_reqs, .tables = o->ltables}};
        kv_err ferr;
        kv_err_clear(&ferr);
        int frc = e->synth ? synth_forward(e, &b, f0, &ferr)
                           : kv_forward_run(e->fwd, kv_cache_pages(e->cache), &b, e->logits, &ferr);
        /* every logit row's argmax and finiteness in one pass on the backend's threads */
        e->scanned = !frc && e->scan_ids && o->n_logits > 0;
        if (e->scanned) e->be->ops->logits_scan(e->be, e->logits, o->n_logits, e->n_vocab, e->scan_ids, e->scan_finite);
        f1 = engine_now_ms(e);
        if (n_items > 0) {
            /* verification's share of the forward: the rows of sequences
             * with drafts (their last token and the drafts) */
            int spec_rows = 0;
            for (int i = 0; i < o->n_reqs; i++)
                if (o->reqs[i]->n_sched_draft > 0) spec_rows += o->reqs[i]->n_sched;
            kv_metrics_spec_time(e->metrics, d_plan, (f1 - f0) * spec_rows / (double)o->n_tokens);
        }
        /* o->reqs changes as requests finish: walk a copy */
        int nr = o->n_reqs;
        for (int i = 0; i < nr; i++) e->sreqs[i] = (ereq *)o->reqs[i]; /* kv_sreq is ereq's first member */
        for (int i = 0; i < nr; i++) {
            ereq *r = e->sreqs[i];
            if (frc) {
                engine_finish_req(e, r, KV_FINISH_ERROR, ferr.msg);
                continue;
            }
            int32_t toks[40]; /* spec.k <= 32 (config.c) */
            int nt = 0;
            int drafted = r->s.n_logits > 0 ? r->s.n_sched_draft : 0;
            if (r->s.n_logits > 0 && !e->synth && !logits_finite(e, &r->s)) {
                engine_finish_req(e, r, KV_FINISH_ERROR,
                                  "the model's logits are not finite (NaN or Inf): check its weights");
                continue;
            }
            if (r->s.n_logits > 0) {
                nt = sample_request(e, r, toks);
                int room = r->s.max_tokens - kv_sreq_n_generated(&r->s);
                if (nt > room) nt = room;
                /* nothing after an end-of-generation token is kept */
                if (!r->ignore_eos)
                    for (int j = 0; j < nt; j++)
                        if (kv_tokenizer_is_eog(e->model->tok, toks[j])) {
                            nt = j + 1;
                            break;
                        }
            }
            int accepted = drafted > 0 ? nt - 1 : 0;
            const float *rows = r->logprobs && nt > 0 ? e->logits + (size_t)r->s.logit_row * (size_t)e->n_vocab : NULL;
            if (kv_sched_update(e->sched, &r->s, toks, nt) != 0) {
                engine_finish_req(e, r, KV_FINISH_ERROR, "internal: scheduler update refused");
                continue;
            }
            if (drafted > 0) {
                char note[sizeof ((kv_decision *)0)->text];
                kv_spec_item it = {.r = &r->s, .ss = &r->ss, .sampling = &r->sampling, .rng = &r->rng};
                kv_spec_feedback(e->spec, &it, drafted, accepted, note, sizeof note);
                kv_metrics_spec(e->metrics, drafted, accepted);
                kv_sched_decide(e->sched, KV_DEC_SPEC, r->s.id, note);
            }
            double t_tok = e->synth ? synth_hand_over(e, r, i, f1, nt) : f1;
            if (nt == 0) continue;
            kv_metrics_tokens(e->metrics, &r->rm, t_tok, nt);
            emitted += nt;
            kv_finish fin = emit_tokens(e, r, r->s.tokens + r->s.n_tokens - nt, nt, drafted > 0, accepted, rows);
            if (fin != KV_FINISH_NONE) engine_finish_req(e, r, fin, NULL);
            e->ev_at_ms = 0;
        }
        /* NOTE: a failed forward (a backend op, ops.status) is contained:
         * the requests of its batch ended above with KV_FINISH_ERROR and
         * the reason, their blocks are released, and the step counts as
         * work, so callers (run_until_idle, the thread) keep serving the
         * others instead of stopping at an error code. */
    }
    kv_step_record rec;
    const kv_decision *dec;
    int n_dec;
    kv_sched_end_step(e->sched, &rec, &dec, &n_dec);
    {
        kv_sreq *const *run_now;
        int n_run = kv_sched_running(e->sched, &run_now);
        pthread_mutex_lock(&e->mu);
        atomic_store(&e->sched_waiting, rec.n_waiting);
        atomic_store(&e->sched_running, n_run);
        pthread_mutex_unlock(&e->mu);
    }
    int did = n > 0 || n_dec > 0 || e->n_lev > 0;
    if (did) {
        e->step = step;
        double t1 = engine_now_ms(e);
        rec.dur_ms = t1 - t0;
        rec.forward_ms = f1 - f0;
        rec.sim_ms = (engine_device_s(e) - sim0) * 1000.0;
        engine_moe_step(e, &rec);
        kv_sched_observe_step(e->sched, rec.n_seqs, rec.dur_ms); /* scheduler.target_tpot_ms */
        kv_ring_push(&e->steps, &rec);
        for (int i = 0; i < n_dec; i++) kv_ring_push(&e->decisions, &dec[i]);
        /* KV utilisation: committed tokens over the slots their blocks hold */
        kv_sreq *const *run;
        int nrun = kv_sched_running(e->sched, &run);
        uint64_t held = 0, reserved = 0;
        for (int i = 0; i < nrun; i++) {
            held += (uint64_t)run[i]->n_computed;
            reserved += (uint64_t)run[i]->seq.n_blocks * (uint64_t)e->cache_params.block_size;
        }
        kv_metrics_step(e->metrics, rec.dur_ms, held, reserved, nrun, rec.n_prefill_tokens);
        if (rec.n_prefill_tokens == 0) kv_metrics_decode_step(e->metrics, rec.dur_ms, emitted);
        kv_metrics_sim_step(e->metrics, rec.sim_ms, emitted);
        if (kv_synth_pools_of(e->synth)) synth_observe(e, t1);
        for (int i = 0; i < rec.n_preempted; i++) kv_metrics_preempted(e->metrics, 0);
        for (int i = 0; i < rec.n_swapped_out; i++) kv_metrics_preempted(e->metrics, 1);
        for (int i = 0; i < rec.n_swapped_in; i++) kv_metrics_swapped_in(e->metrics);
    }
    if (rc < 0) return rc;
    return did ? 1 : 0;
}

/* The step hook, in two halves around the release of state_mu so the hook
 * runs while front ends can take snapshots. hook_prepare (state_mu held,
 * after a step): when the step counter moved and a hook is set, builds its
 * snapshot and returns 1 with hook_mu held; hook_call then calls the hook
 * and releases hook_mu. NOTE: a step whose snapshot cannot be built (out of
 * memory) is not reported; its records reach the hook with the next one. */
static int hook_prepare(kv_engine *e, uint64_t step_before) {
    if (e->step == step_before) return 0;
    pthread_mutex_lock(&e->hook_mu);
    if (e->hook && engine_build_snapshot(e, e->hook_snap) == 0) return 1;
    pthread_mutex_unlock(&e->hook_mu);
    return 0;
}

static void hook_call(kv_engine *e) {
    e->hook(e->hook_user, e->hook_snap);
    pthread_mutex_unlock(&e->hook_mu);
}

int engine_step_cycle(kv_engine *e, int publish_copy) {
    pthread_mutex_lock(&e->state_mu);
    uint64_t before = e->step;
    int rc = step_locked(e);
    if (publish_copy) engine_publish(e);
    int hooked = hook_prepare(e, before);
    pthread_mutex_unlock(&e->state_mu);
    flush_events(e);
    if (hooked) hook_call(e);
    return rc;
}

int kv_engine_step(kv_engine *e) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->mu);
    int started = e->thread_started;
    pthread_mutex_unlock(&e->mu);
    if (started) return KV_ERR_INVAL;
    return engine_step_cycle(e, 0);
}

int kv_engine_run_until_idle(kv_engine *e) {
    if (!e) return KV_ERR_INVAL;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int active = e->n_active, started = e->thread_started, pending = e->n_cancels + e->n_pend;
        if (started && active > 0) {
            struct timespec ts;
            engine_deadline_after(&ts, 50);
            pthread_cond_timedwait(&e->ev_cond, &e->mu, &ts);
        }
        pthread_mutex_unlock(&e->mu);
        if (active == 0 && pending == 0) return 0;
        if (started) continue;
        int rc = kv_engine_step(e);
        if (rc < 0) return rc;
        if (rc == 0 && active > 0 && engine_skip_to_hold(e, 0)) continue; /* held: KV on its way */
        if (rc == 0 && active > 0) return KV_AGAIN; /* nothing can run: should not happen */
    }
}
