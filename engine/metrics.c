/* metrics.c - latency samples per kind in growable arrays, counters, and
 * the summary: percentiles are exact (the samples are sorted on a scratch
 * copy), throughput runs from the first arrival of the window to now (or the
 * last finish once nothing is in flight). */
#include "metrics.h"

#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"

typedef struct samples {
    double *v; /* (cap) */
    size_t n, cap;
} samples;

enum { S_QUEUE, S_TTFT, S_TPOT, S_ITL, S_E2E, S_COUNT };

struct kv_metrics {
    double sla_ttft_ms, sla_tpot_ms;
    samples s[S_COUNT];
    double *scratch; /* (cap_scratch) sorted copy for percentiles */
    size_t cap_scratch;
    int oom;         /* a sample could not be stored */

    double first_arrival_ms; /* < 0: none in this window */
    double last_finish_ms;
    uint64_t submitted, completed, cancelled, rejected, errors, good;
    uint64_t good_tokens; /* output tokens of the requests meeting the SLA */
    uint64_t input_tokens, output_tokens, prefill_tokens;
    uint64_t prompt_tokens_admitted, prefix_hit_tokens;
    uint64_t preemptions, swaps_out, swaps_in;
    int max_concurrent;
    double util_held, util_reserved; /* slot-ms */
    uint64_t spec_drafts, spec_drafted, spec_accepted;
    uint64_t spec_pos_drafted[16], spec_pos_accepted[16];
    double spec_draft_ms, spec_verify_ms;
    double decode_ms;        /* wall time of the steps that ran no prompt tokens */
    uint64_t decode_tokens;  /* tokens they emitted */
    double sim_ms;           /* simulated device time of the steps (sim backend) */
    uint64_t sim_tokens_out;
};

/* ---- per request ---- */

void kv_req_metrics_init(kv_req_metrics *rm, double arrival_ms, int n_in) {
    rm->arrival_ms = arrival_ms;
    rm->admit_ms = rm->first_token_ms = rm->last_token_ms = rm->finish_ms = -1;
    rm->last_itl_ms = -1;
    rm->n_in = n_in;
    rm->n_out = 0;
    rm->n_prefix_hit = 0;
}

double kv_req_queue_ms(const kv_req_metrics *rm) { return rm->admit_ms < 0 ? -1 : rm->admit_ms - rm->arrival_ms; }
double kv_req_ttft_ms(const kv_req_metrics *rm) {
    return rm->first_token_ms < 0 ? -1 : rm->first_token_ms - rm->arrival_ms;
}
double kv_req_tpot_ms(const kv_req_metrics *rm) {
    if (rm->n_out < 2 || rm->first_token_ms < 0) return -1;
    return (rm->last_token_ms - rm->first_token_ms) / (rm->n_out - 1);
}
double kv_req_e2e_ms(const kv_req_metrics *rm) { return rm->finish_ms < 0 ? -1 : rm->finish_ms - rm->arrival_ms; }

/* ---- lifecycle ---- */

kv_metrics *kv_metrics_new(double sla_ttft_ms, double sla_tpot_ms) {
    kv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->sla_ttft_ms = sla_ttft_ms;
    m->sla_tpot_ms = sla_tpot_ms;
    kv_metrics_reset(m);
    return m;
}

void kv_metrics_free(kv_metrics *m) {
    if (!m) return;
    for (int i = 0; i < S_COUNT; i++) free(m->s[i].v);
    free(m->scratch);
    free(m);
}

void kv_metrics_reset(kv_metrics *m) {
    samples keep[S_COUNT];
    memcpy(keep, m->s, sizeof keep);
    double *scratch = m->scratch;
    size_t cap_scratch = m->cap_scratch;
    double ttft = m->sla_ttft_ms, tpot = m->sla_tpot_ms;
    memset(m, 0, sizeof *m);
    for (int i = 0; i < S_COUNT; i++) { /* keep the buffers, drop the samples */
        m->s[i] = keep[i];
        m->s[i].n = 0;
    }
    m->scratch = scratch;
    m->cap_scratch = cap_scratch;
    m->sla_ttft_ms = ttft;
    m->sla_tpot_ms = tpot;
    m->first_arrival_ms = -1;
    m->last_finish_ms = -1;
}

static void add(kv_metrics *m, int kind, double v) {
    samples *s = &m->s[kind];
    if (kv_grow_size((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) {
        m->oom = 1;
        return;
    }
    s->v[s->n++] = v;
}

/* ---- events ---- */

static void arrival(kv_metrics *m, double t) {
    if (m->first_arrival_ms < 0 || t < m->first_arrival_ms) m->first_arrival_ms = t;
}

void kv_metrics_submitted(kv_metrics *m, double now_ms) {
    m->submitted++;
    arrival(m, now_ms);
}

void kv_metrics_rejected(kv_metrics *m, double now_ms) {
    m->rejected++;
    arrival(m, now_ms);
}

void kv_metrics_admitted(kv_metrics *m, kv_req_metrics *rm, double now_ms, int n_prefix_hit) {
    if (rm->admit_ms >= 0) return; /* re-admission after preemption */
    rm->admit_ms = now_ms;
    rm->n_prefix_hit = n_prefix_hit;
    add(m, S_QUEUE, now_ms - rm->arrival_ms);
    m->input_tokens += (uint64_t)rm->n_in;
    m->prompt_tokens_admitted += (uint64_t)rm->n_in;
    m->prefix_hit_tokens += (uint64_t)(n_prefix_hit > 0 ? n_prefix_hit : 0);
}

void kv_metrics_tokens(kv_metrics *m, kv_req_metrics *rm, double now_ms, int n) {
    for (int i = 0; i < n; i++) {
        if (rm->n_out == 0) {
            rm->first_token_ms = now_ms;
            add(m, S_TTFT, now_ms - rm->arrival_ms);
        } else {
            rm->last_itl_ms = now_ms - rm->last_token_ms;
            add(m, S_ITL, rm->last_itl_ms);
        }
        rm->last_token_ms = now_ms;
        rm->n_out++;
        m->output_tokens++;
    }
}

void kv_metrics_finished(kv_metrics *m, kv_req_metrics *rm, kv_finish why, double now_ms) {
    rm->finish_ms = now_ms;
    m->last_finish_ms = now_ms;
    switch (why) {
    case KV_FINISH_EOS:
    case KV_FINISH_LENGTH:
    case KV_FINISH_STOP: {
        m->completed++;
        double e2e = now_ms - rm->arrival_ms, ttft = kv_req_ttft_ms(rm), tpot = kv_req_tpot_ms(rm);
        add(m, S_E2E, e2e);
        if (tpot >= 0) add(m, S_TPOT, tpot);
        /* A request with one token has no TPOT: only its TTFT is judged. */
        int ok = 1;
        if (m->sla_ttft_ms > 0 && !(ttft >= 0 && ttft <= m->sla_ttft_ms)) ok = 0;
        if (m->sla_tpot_ms > 0 && tpot > m->sla_tpot_ms) ok = 0;
        if (ok) m->good++;
        if (ok) m->good_tokens += (uint64_t)rm->n_out;
        break;
    }
    case KV_FINISH_CANCELLED: m->cancelled++; break;
    case KV_FINISH_REJECTED: m->rejected++; break;
    default: m->errors++; break;
    }
}

void kv_metrics_step(kv_metrics *m, double dur_ms, uint64_t slots_held, uint64_t slots_reserved, int n_running,
                     int prefill_tokens) {
    if (dur_ms < 0) dur_ms = 0;
    m->util_held += (double)slots_held * dur_ms;
    m->util_reserved += (double)slots_reserved * dur_ms;
    if (n_running > m->max_concurrent) m->max_concurrent = n_running;
    m->prefill_tokens += (uint64_t)(prefill_tokens > 0 ? prefill_tokens : 0);
}

void kv_metrics_decode_step(kv_metrics *m, double dur_ms, int tokens_out) {
    if (tokens_out <= 0) return;
    if (dur_ms > 0) m->decode_ms += dur_ms;
    m->decode_tokens += (uint64_t)tokens_out;
}

void kv_metrics_sim_step(kv_metrics *m, double sim_ms, int tokens_out) {
    if (sim_ms > 0) m->sim_ms += sim_ms;
    if (tokens_out > 0) m->sim_tokens_out += (uint64_t)tokens_out;
}

void kv_metrics_preempted(kv_metrics *m, int swapped) {
    m->preemptions++;
    if (swapped) m->swaps_out++;
}
void kv_metrics_swapped_in(kv_metrics *m) { m->swaps_in++; }

void kv_metrics_spec(kv_metrics *m, int drafted, int accepted) {
    if (drafted <= 0) return;
    if (accepted < 0) accepted = 0;
    if (accepted > drafted) accepted = drafted;
    m->spec_drafts++;
    m->spec_drafted += (uint64_t)drafted;
    m->spec_accepted += (uint64_t)accepted;
    for (int j = 0; j < drafted && j < 16; j++) {
        m->spec_pos_drafted[j]++;
        if (j < accepted) m->spec_pos_accepted[j]++;
    }
}

void kv_metrics_spec_time(kv_metrics *m, double draft_ms, double verify_ms) {
    m->spec_draft_ms += draft_ms;
    m->spec_verify_ms += verify_ms;
}

/* ---- summary ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(const double *sorted, uint64_t n, double q) {
    double pos = q * (double)(n - 1);
    uint64_t lo = (uint64_t)pos;
    if (lo + 1 >= n) return sorted[n - 1];
    double frac = pos - (double)lo;
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

void kv_stat_compute(kv_stat *st, double *v, uint64_t n) {
    memset(st, 0, sizeof *st);
    st->n = n;
    if (n == 0) return;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (uint64_t i = 0; i < n; i++) sum += v[i];
    st->valid = 1;
    st->mean = sum / (double)n;
    st->max = v[n - 1];
    st->p50 = quantile(v, n, 0.50);
    st->p90 = quantile(v, n, 0.90);
    st->p99 = quantile(v, n, 0.99);
}

int kv_metrics_summarize(kv_metrics *m, double now_ms, int in_flight, kv_metrics_summary *out) {
    memset(out, 0, sizeof *out);
    double end = in_flight || m->last_finish_ms < 0 ? now_ms : m->last_finish_ms;
    double el = m->first_arrival_ms >= 0 ? (end - m->first_arrival_ms) / 1000.0 : 0;
    if (el < 0) el = 0;
    out->elapsed_s = el;
    out->requests_submitted = m->submitted;
    out->requests_completed = m->completed;
    out->requests_cancelled = m->cancelled;
    out->requests_rejected = m->rejected;
    out->requests_errored = m->errors;
    out->input_tokens = m->input_tokens;
    out->output_tokens = m->output_tokens;
    out->prefill_tokens_computed = m->prefill_tokens;
    if (el > 0) {
        out->input_tokens_per_s = (double)m->input_tokens / el;
        out->output_tokens_per_s = (double)m->output_tokens / el;
        out->requests_per_s = (double)m->completed / el;
        out->goodput_requests_per_s = (double)m->good / el;
    }
    out->sla_attainment = m->completed ? (double)m->good / (double)m->completed : 0;
    out->good_output_tokens = m->good_tokens;
    out->kv_utilization = m->util_reserved > 0 ? m->util_held / m->util_reserved : 0;
    out->prefix_hit_tokens = m->prefix_hit_tokens;
    out->prefix_hit_rate =
        m->prompt_tokens_admitted ? (double)m->prefix_hit_tokens / (double)m->prompt_tokens_admitted : 0;
    out->preemptions = m->preemptions;
    out->swaps_out = m->swaps_out;
    out->swaps_in = m->swaps_in;
    out->max_concurrent = m->max_concurrent;
    out->spec_drafts = m->spec_drafts;
    out->spec_drafted = m->spec_drafted;
    out->spec_accepted = m->spec_accepted;
    out->spec_acceptance_rate = m->spec_drafted ? (double)m->spec_accepted / (double)m->spec_drafted : 0;
    out->spec_mean_accepted_len =
        m->spec_drafts ? (double)(m->spec_accepted + m->spec_drafts) / (double)m->spec_drafts : 0;
    memcpy(out->spec_pos_drafted, m->spec_pos_drafted, sizeof out->spec_pos_drafted);
    memcpy(out->spec_pos_accepted, m->spec_pos_accepted, sizeof out->spec_pos_accepted);
    out->spec_draft_ms = m->spec_draft_ms;
    out->decode_step_tokens_per_s = m->decode_ms > 0 ? (double)m->decode_tokens / (m->decode_ms / 1000.0) : 0;
    out->sim_device_s = m->sim_ms / 1000.0;
    out->sim_tokens_out = m->sim_ms > 0 ? m->sim_tokens_out : 0;
    out->sim_output_tokens_per_s = m->sim_ms > 0 ? (double)m->sim_tokens_out / (m->sim_ms / 1000.0) : 0;
    out->spec_verify_ms = m->spec_verify_ms;

    size_t need = 0;
    for (int i = 0; i < S_COUNT; i++) need = m->s[i].n > need ? m->s[i].n : need;
    if (kv_grow_size((void **)&m->scratch, &m->cap_scratch, need, sizeof *m->scratch)) return KV_ERR_NOMEM;
    kv_stat *stats[S_COUNT] = {&out->queue_ms, &out->ttft_ms, &out->tpot_ms, &out->itl_ms, &out->e2e_ms};
    for (int i = 0; i < S_COUNT; i++) {
        if (m->s[i].n) memcpy(m->scratch, m->s[i].v, m->s[i].n * sizeof(double));
        kv_stat_compute(stats[i], m->scratch, m->s[i].n);
    }
    return m->oom ? KV_ERR_NOMEM : 0;
}

uint64_t kv_metrics_bytes(const kv_metrics *m) {
    if (!m) return 0;
    uint64_t b = sizeof *m + m->cap_scratch * sizeof(double);
    for (int i = 0; i < S_COUNT; i++) b += m->s[i].cap * sizeof(double);
    return b;
}
