/* panels_sched.c - the scheduler's panels (see panels.h): speculative
 * decoding, the TPOT/ITL metrics with their sparklines, the scheduler's
 * queues and batch, and the step log of its decisions. */
#include "panels_internal.h"

#include <stdio.h>

#include "blockmap.h"

/* ---- speculative decoding ---- */

static const char *spec_name(kv_spec_method m) {
    switch (m) {
    case KV_SPEC_DRAFT_MODEL: return "draft model";
    case KV_SPEC_SELF: return "self-speculative";
    case KV_SPEC_NGRAM: return "n-gram lookup";
    default: return "off";
    }
}

void kv_panel_spec(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    int ih, iw;
    if (!panel_open(w, v, s, "Spec decoding", s ? spec_name(s->spec_method) : "", NULL, &ih, &iw)) return;
    if (s->spec_method == KV_SPEC_OFF) {
        panel_text(w, 1, 1, iw, A_BOLD, "off", -1);
        if (ih >= 2) panel_text(w, 2, 1, iw, A_DIM, "spec.method: ngram | self | draft_model", -1);
        return;
    }
    const kv_metrics_summary *m = &s->metrics;
    char acc[16];
    kv_format_pct(acc, sizeof acc, m->spec_acceptance_rate, m->spec_drafted > 0);
    panel_textf(w, 1, 1, iw, A_NORMAL, "accept %s  mean len %.2f  drafts %llu", acc, m->spec_mean_accepted_len,
          (unsigned long long)m->spec_drafts);
    if (ih >= 2) {
        /* Per draft position: acceptance falls with depth. */
        char line[512];
        int n = snprintf(line, sizeof line, "pos ");
        for (int i = 0; i < 16 && n < (int)sizeof line - 16; i++) {
            if (!m->spec_pos_drafted[i]) break;
            n += snprintf(line + n, sizeof line - (size_t)n, "%d:%.0f%% ", i + 1,
                          100.0 * (double)m->spec_pos_accepted[i] / (double)m->spec_pos_drafted[i]);
        }
        panel_text(w, 2, 1, iw, A_NORMAL, line, -1);
    }
    if (ih >= 3) {
        /* Per session: sum over the requests in the snapshot. */
        char line[512];
        int n = snprintf(line, sizeof line, "sess ");
        int tags[16], nt = 0;
        uint64_t dr[16] = {0}, ac[16] = {0};
        for (int i = 0; i < s->n_requests; i++) {
            const kv_snap_request *q = &s->requests[i];
            if (!q->spec_drafted) continue;
            int tag = q->session >= KV_SESSION_LOAD_BASE ? KV_SESSION_LOAD_BASE : q->session;
            int k = 0;
            while (k < nt && tags[k] != tag) k++;
            if (k == nt) {
                if (nt == 16) continue;
                tags[nt++] = tag;
            }
            dr[k] += q->spec_drafted;
            ac[k] += q->spec_accepted;
        }
        for (int k = 0; k < nt && n < (int)sizeof line - 16; k++)
            n += snprintf(line + n, sizeof line - (size_t)n, "%c:%.0f%% ", kv_blockmap_glyph(tags[k], 0),
                          100.0 * (double)ac[k] / (double)dr[k]);
        if (nt == 0) snprintf(line + n, sizeof line - (size_t)n, "(no drafts yet)");
        panel_text(w, 3, 1, iw, A_NORMAL, line, -1);
    }
    if (ih >= 4) {
        char d[16], ve[16];
        kv_format_ms(d, sizeof d, m->spec_draft_ms, 1);
        kv_format_ms(ve, sizeof ve, m->spec_verify_ms, 1);
        panel_textf(w, 4, 1, iw, A_DIM, "drafted %llu accepted %llu  draft %s verify %s",
                    (unsigned long long)m->spec_drafted, (unsigned long long)m->spec_accepted, d, ve);
    }
}

/* ---- TPOT ---- */

static void spark_row(WINDOW *w, const kv_view_state *v, int y, int iw, attr_t la, const char *label,
                      const kv_series *ser, double hi) {
    char lb[16];
    snprintf(lb, sizeof lb, "%-6.6s", label);
    int x = 1 + panel_text(w, y, 1, 7, la, lb, -1);
    int valid;
    double p50 = kv_series_percentile(ser, 64, 50, &valid);
    char last[16];
    kv_format_ms(last, sizeof last, p50, valid);
    int vw = 8;
    int sw = iw - (x - 1) - vw;
    if (sw < 1) sw = 1;
    double vals[512];
    int n = kv_series_last(ser, vals, sw < 512 ? sw : 512);
    char spark[2048];
    kv_format_sparkline(spark, sizeof spark, vals, n, sw, 0, hi, v->utf8);
    panel_text(w, y, x, sw, la, spark, -1);
    panel_textf(w, y, 1 + iw - vw, vw, A_NORMAL, "%7s", last);
}

void kv_panel_tpot(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[48] = "";
    if (s && s->sla_tpot_ms > 0) snprintf(extra, sizeof extra, "SLA %.0fms", s->sla_tpot_ms);
    panel_frame(w, v, "TPOT per token", extra);
    int ih, iw;
    panel_inner(w, &ih, &iw);
    if (ih <= 0) return;
    char p50[16], p99[16], ttft[16];
    int valid;
    double a50 = kv_series_percentile(v->itl_all, 0, 50, &valid);
    kv_format_ms(p50, sizeof p50, a50, valid);
    double a99 = kv_series_percentile(v->itl_all, 0, 99, &valid);
    kv_format_ms(p99, sizeof p99, a99, valid);
    /* TTFT of the newest request that has one. */
    const kv_snap_request *latest = NULL;
    for (int i = 0; s && i < s->n_requests; i++)
        if (s->requests[i].ttft_ms >= 0 && (!latest || s->requests[i].id > latest->id)) latest = &s->requests[i];
    kv_format_ms(ttft, sizeof ttft, latest ? latest->ttft_ms : 0, latest != NULL);
    panel_textf(w, 1, 1, iw, A_NORMAL, "P50 %s  P99 %s  TTFT %s%s", p50, p99, ttft,
          latest ? (latest->session >= KV_SESSION_LOAD_BASE ? " (load)" : "") : "");
    /* A common scale so rows compare: the overall P99 (spikes clip). */
    double hi = valid && a99 > 0 ? a99 : 0;
    int y = 2;
    if (y <= ih && v->itl_all) spark_row(w, v, y++, iw, A_BOLD, "all", v->itl_all, hi);
    for (int i = 0; i < v->n_sessions && y <= ih; i++) {
        const kv_session *ss = v->sessions[i];
        if (!ss->itl.n && i != v->selected) continue;
        char lb[40];
        snprintf(lb, sizeof lb, "%c %.14s", kv_blockmap_glyph(ss->tag, 0), ss->name);
        spark_row(w, v, y++, iw, kv_panel_session_attr(v, ss->tag) | (i == v->selected ? A_BOLD : 0), lb, &ss->itl, hi);
    }
    if (y <= ih && v->itl_load && v->itl_load->n)
        spark_row(w, v, y++, iw, kv_panel_session_attr(v, KV_SESSION_LOAD_BASE), "w load", v->itl_load, hi);
    if (y <= ih && s) {
        char m50[16], m99[16];
        kv_format_ms(m50, sizeof m50, s->metrics.tpot_ms.p50, s->metrics.tpot_ms.valid);
        kv_format_ms(m99, sizeof m99, s->metrics.tpot_ms.p99, s->metrics.tpot_ms.valid);
        panel_textf(w, y, 1, iw, A_DIM, "finished reqs: TPOT P50 %s P99 %s (n=%llu)", m50, m99,
              (unsigned long long)s->metrics.tpot_ms.n);
    }
}


/* ---- scheduler ---- */

static const char *state_name(kv_req_state st) {
    switch (st) {
    case KV_REQ_WAITING: return "wait";
    case KV_REQ_RUNNING: return "run";
    case KV_REQ_PREEMPTED: return "preempted";
    case KV_REQ_SWAPPED: return "swapped";
    default: return "done";
    }
}

/* TTFT of the finished requests the snapshot keeps, split at the widest
 * jump in job size (prompt + max_tokens): "TTFT by job size: short (<= N
 * tok) mean .. max .. | long ..". Shown when that jump is at least 4x (a
 * workload with two request classes, demo-starvation.yaml), so that a
 * starved short class shows as a short-job TTFT close to the long jobs'.
 * Returns 0 when there is nothing to show. */
static int class_ttft_line(const kv_snapshot *s, char *line, size_t cap) {
    enum { MAXN = 256 };
    int size[MAXN];
    double ttft[MAXN];
    int n = 0;
    for (int i = 0; i < s->n_requests && n < MAXN; i++) {
        const kv_snap_request *q = &s->requests[i];
        if (q->state != KV_REQ_FINISHED || q->ttft_ms < 0) continue;
        size[n] = q->n_prompt + q->max_tokens;
        ttft[n++] = q->ttft_ms;
    }
    if (n < 4) return 0;
    /* insertion sort by job size (n <= 256) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && size[j] < size[j - 1]; j--) {
            int t = size[j];
            size[j] = size[j - 1], size[j - 1] = t;
            double d = ttft[j];
            ttft[j] = ttft[j - 1], ttft[j - 1] = d;
        }
    /* split at the widest jump in size; two classes when it is >= 4x */
    int h = 0;
    for (int i = 1; i < n; i++)
        if (!h || (double)size[i] / size[i - 1] > (double)size[h] / size[h - 1]) h = i;
    if (size[h] < 4 * size[h - 1]) return 0;
    int k = snprintf(line, cap, "TTFT by job size:");
    for (int part = 0; part < 2 && k < (int)cap; part++) {
        int lo = part ? h : 0, hi = part ? n : h;
        double sum = 0, mx = 0;
        for (int i = lo; i < hi; i++) sum += ttft[i], mx = ttft[i] > mx ? ttft[i] : mx;
        char mean[16], top[16];
        kv_format_ms(mean, sizeof mean, sum / (hi - lo), 1);
        kv_format_ms(top, sizeof top, mx, 1);
        k += snprintf(line + k, cap - (size_t)k, "%s %s (<= %d tok) mean %s max %s", part ? "  |" : "",
                      part ? "long" : "short", size[hi - 1], mean, top);
    }
    return 1;
}

/* A mixture-of-experts model's routing in the last step: tokens routed
 * (summed over layers), the busiest expert against the mean, how many
 * experts got any, and a sparkline of tokens per expert (adjacent experts
 * share a cell, showing their busiest, when there are more than fit).
 * Returns 0 for a dense model or before the first step. */
static int experts_line(const kv_view_state *v, const kv_snapshot *s, int width, char *line, size_t cap) {
    const kv_step_record *last = s->n_steps ? &s->steps[s->n_steps - 1] : NULL;
    if (!s->n_experts || !last || !last->n_experts) return 0;
    const int E = s->n_experts;
    const double mean = (double)last->expert_routed / E;
    int k = snprintf(line, cap, "experts: %d routed, busiest %d (%.1fx mean), %d of %d used ", last->expert_routed,
                     last->expert_max, mean > 0 ? last->expert_max / mean : 0.0, last->expert_active, E);
    int room = width - k;
    if (room < 4 || k < 0 || (size_t)k >= cap) return 1;
    double cells[KV_MOE_MAX_EXPERTS];
    int n = E < room ? E : room;
    for (int c = 0; c < n; c++) {
        cells[c] = 0;
        for (int e = c * E / n; e < (c + 1) * E / n; e++)
            if (s->expert_tokens[e] > cells[c]) cells[c] = s->expert_tokens[e];
    }
    kv_format_sparkline(line + k, cap - (size_t)k, cells, n, n, 0, last->expert_max > 0 ? last->expert_max : 1,
                        v->utf8);
    return 1;
}

void kv_panel_sched(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[96] = "";
    if (s) {
        const char *mode = s->policy == KV_POLICY_STATIC ? "static batching" : "continuous";
        if (v->paused) snprintf(extra, sizeof extra, "%s  PAUSED", mode);
        else if (v->step_delay_ms) snprintf(extra, sizeof extra, "%s  slow %dms/step", mode, v->step_delay_ms);
        else snprintf(extra, sizeof extra, "%s", mode);
    }
    int ih, iw;
    if (!panel_open(w, v, s, "Sched", extra, v->phase == KV_PHASE_LOADING ? v->load_msg : NULL, &ih, &iw)) return;
    const kv_metrics_summary *m = &s->metrics;
    const kv_step_record *last = s->n_steps ? &s->steps[s->n_steps - 1] : NULL;
    char dur[16];
    kv_format_ms(dur, sizeof dur, last ? last->dur_ms : 0, last != NULL);
    panel_textf(w, 1, 1, iw, A_NORMAL, "running %d  waiting %d  swapped %d  step %llu (%s)", s->n_running, s->n_waiting,
          s->n_swapped, (unsigned long long)s->step, dur);
    int y = 2;
    if (y <= ih) {
        char out[24], in[24], good[24], sla[16];
        kv_format_rate(out, sizeof out, m->output_tokens_per_s, "tok/s");
        kv_format_rate(in, sizeof in, m->input_tokens_per_s, "tok/s");
        kv_format_rate(good, sizeof good, m->goodput_requests_per_s, "req/s");
        kv_format_pct(sla, sizeof sla, m->sla_attainment, m->requests_completed > 0);
        panel_textf(w, y++, 1, iw, A_NORMAL, "out %s  in %s  goodput %s  SLA met %s", out, in, good, sla);
    }
    /* Sim backend: what the modelled GPU would take for the same steps. */
    if (y <= ih && m->sim_device_s > 0) {
        char rate[24], sd[16];
        kv_format_rate(rate, sizeof rate, m->sim_output_tokens_per_s, "tok/s");
        kv_format_ms(sd, sizeof sd, last ? last->sim_ms : 0, last != NULL);
        char cost[48] = ""; /* a synthetic model's devices: what the output costs at this rate */
        if (s->gpu.valid && s->gpu.usd_per_hour > 0 && m->sim_output_tokens_per_s > 0)
            snprintf(cost, sizeof cost, ", $%.3f/M tok at $%.2f/h", s->gpu.usd_per_hour / 3600.0 /
                     m->sim_output_tokens_per_s * 1e6, s->gpu.usd_per_hour);
        panel_textf(w, y++, 1, iw, panel_pair(v, KV_PAIR_TITLE, A_NORMAL), "sim %s: last step %s on device, out %s%s",
              s->sim_device[0] ? s->sim_device : "gpu", sd, rate, cost);
    }
    char moe[1200]; /* a mixture of experts: the last step's tokens per expert */
    if (y <= ih && experts_line(v, s, iw, moe, sizeof moe))
        panel_text(w, y++, 1, iw, panel_pair(v, KV_PAIR_TITLE, A_NORMAL), moe, -1);
    /* Preemption chains (the KV cascade demo) and the dynamic batch size. */
    if (y <= ih && (m->preemptions > 0 || m->batch_cap > 0)) {
        char line[160];
        int n = 0;
        if (m->preemptions > 0)
            n = snprintf(line, sizeof line, "preempt %llu: %llu cascades (longest %d), %llu tokens recomputed",
                         (unsigned long long)m->preemptions, (unsigned long long)m->preemption_chains,
                         m->longest_preemption_chain, (unsigned long long)m->tokens_recomputed);
        if (m->batch_cap > 0 && n < (int)sizeof line)
            n += snprintf(line + n, sizeof line - (size_t)n, "%sbatch cap %d", n ? "  " : "", m->batch_cap);
        if (m->batch_cap > 0 && m->batch_goal_ms > 0 && n > 0 && n < (int)sizeof line)
            snprintf(line + n, sizeof line - (size_t)n, " (holds %.2f ms)", m->batch_goal_ms);
        panel_text(w, y++, 1, iw, panel_pair(v, m->preemption_chains ? KV_PAIR_PREFILL : KV_PAIR_TITLE, A_NORMAL),
                   line, -1);
    }
    /* Short vs long jobs' TTFT (the starvation demo). */
    if (y <= ih) {
        char line[192];
        if (class_ttft_line(s, line, sizeof line)) panel_text(w, y++, 1, iw, A_NORMAL, line, -1);
    }
    /* Queues: running requests in one line, then each waiting one with its reason. */
    if (y <= ih) {
        char line[1024];
        int n = snprintf(line, sizeof line, "run:");
        for (int i = 0; i < s->n_running && n < (int)sizeof line - 48; i++) {
            const kv_snap_request *q = panel_find_req(s, s->running[i]);
            if (!q) continue;
            if (q->n_computed < q->n_prompt)
                n += snprintf(line + n, sizeof line - (size_t)n, " #%lld%c prefill %d/%d", (long long)q->id,
                              kv_blockmap_glyph(q->session, 0), q->n_computed, q->n_prompt);
            else
                n += snprintf(line + n, sizeof line - (size_t)n, " #%lld%c %d/%d", (long long)q->id,
                              kv_blockmap_glyph(q->session, 0), q->n_generated, q->max_tokens);
        }
        if (!s->n_running) snprintf(line + n, sizeof line - (size_t)n, " (idle)");
        panel_text(w, y++, 1, iw, panel_pair(v, KV_PAIR_DECODE, A_NORMAL), line, -1);
    }
    int steps_rows = ih - y + 1;
    int queue_rows = s->n_waiting + s->n_swapped;
    /* Waiting/preempted/swapped get up to half of what is left. */
    int qmax = steps_rows / 2;
    if (queue_rows > qmax) queue_rows = qmax;
    int shown = 0;
    for (int i = 0; i < s->n_waiting && shown < queue_rows; i++, shown++) {
        const kv_snap_request *q = panel_find_req(s, s->waiting[i]);
        if (!q) continue;
        panel_textf(w, y++, 1, iw, panel_pair(v, KV_PAIR_PREFILL, A_NORMAL), "%s #%lld%c: %s", state_name(q->state),
              (long long)q->id, kv_blockmap_glyph(q->session, 0), q->wait_reason[0] ? q->wait_reason : "queued");
    }
    for (int i = 0; i < s->n_swapped && shown < queue_rows; i++, shown++) {
        const kv_snap_request *q = panel_find_req(s, s->swapped[i]);
        if (!q) continue;
        panel_textf(w, y++, 1, iw, panel_pair(v, KV_PAIR_SPEC, A_NORMAL), "swapped #%lld%c: %s", (long long)q->id,
              kv_blockmap_glyph(q->session, 0), q->wait_reason[0] ? q->wait_reason : "in the host pool");
    }
    if (shown < s->n_waiting + s->n_swapped && y <= ih && queue_rows > 0) {
        mvwhline(w, y - 1, 1, ' ', iw); /* over the last queue row: none of its text may show through */
        panel_textf(w, y - 1, 1, iw, A_DIM, "... %d more waiting", s->n_waiting + s->n_swapped - shown + 1);
    }
    /* The last steps, newest at the bottom: P prefill, d decode, s spec. */
    int rows = ih - y + 1;
    if (rows <= 0 || !s->n_steps) return;
    int first = s->n_steps - rows;
    if (first < 0) first = 0;
    int maxtok = v->config_max_batched > 0 ? v->config_max_batched : 1;
    int mx = 1;
    for (int i = first; i < s->n_steps; i++) {
        const kv_step_record *r = &s->steps[i];
        int t = r->n_prefill_tokens + r->n_decode_tokens + r->n_spec_tokens;
        if (t > mx) mx = t;
    }
    /* Scale to the batch budget unless every step is far below it. */
    if (mx * 4 < maxtok) maxtok = mx;
    for (int i = first; i < s->n_steps; i++, y++) {
        const kv_step_record *r = &s->steps[i];
        char head[48];
        int hn = snprintf(head, sizeof head, "%6llu %2dseq ", (unsigned long long)(r->step % 1000000), r->n_seqs);
        char tail[48];
        char d[16];
        /* sim backend: the modelled device's time of the step, not the host's */
        kv_format_ms(d, sizeof d, r->sim_ms > 0 ? r->sim_ms : r->dur_ms, 1);
        int tn = snprintf(tail, sizeof tail, " %dp %dd%s%.0d %s%s", r->n_prefill_tokens, r->n_decode_tokens,
                          r->n_spec_tokens ? " s" : "", r->n_spec_tokens, r->sim_ms > 0 ? "sim " : "", d);
        int bw = iw - hn - tn;
        panel_text(w, y, 1, iw, A_DIM, head, -1);
        if (bw > 0) {
            double parts[3] = {(double)r->n_prefill_tokens / maxtok, (double)r->n_decode_tokens / maxtok,
                               (double)r->n_spec_tokens / maxtok};
            char bar[512];
            kv_format_stacked_bar(bar, sizeof bar, bw, parts, "Pds", 3, ' ');
            /* Color each run of the bar by its kind. */
            for (int c = 0; c < bw && bar[c]; c++) {
                attr_t a = bar[c] == 'P' ? panel_pair(v, KV_PAIR_PREFILL, A_BOLD)
                           : bar[c] == 'd' ? panel_pair(v, KV_PAIR_DECODE, A_NORMAL)
                           : bar[c] == 's' ? panel_pair(v, KV_PAIR_SPEC, A_UNDERLINE)
                                           : A_NORMAL;
                if (v->color && bar[c] != ' ') a |= A_REVERSE;
                wattrset(w, a);
                mvwaddch(w, y, 1 + hn + c, (chtype)(unsigned char)bar[c]);
            }
            wattrset(w, A_NORMAL);
        }
        panel_text(w, y, 1 + hn + (bw > 0 ? bw : 0), tn, A_NORMAL, tail, -1);
    }
}

/* ---- step log ---- */

static attr_t decision_attr(const kv_view_state *v, kv_decision_kind k) {
    switch (k) {
    case KV_DEC_ADMIT:
    case KV_DEC_FINISH: return panel_pair(v, KV_PAIR_DECODE, A_NORMAL);
    case KV_DEC_CHUNK:
    case KV_DEC_SHARE: return panel_pair(v, KV_PAIR_TITLE, A_NORMAL);
    case KV_DEC_PREEMPT:
    case KV_DEC_SWAP_OUT:
    case KV_DEC_EVICT:
    case KV_DEC_REJECT: return panel_pair(v, KV_PAIR_ERROR, A_BOLD);
    case KV_DEC_SPEC: return panel_pair(v, KV_PAIR_SPEC, A_NORMAL);
    default: return A_NORMAL;
    }
}

void kv_panel_log(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    (void)s;
    char extra[48] = "";
    if (v->log_scroll > 0) snprintf(extra, sizeof extra, "-%d rows", v->log_scroll);
    else snprintf(extra, sizeof extra, "%d decisions", v->log_n);
    panel_frame(w, v, "Step log", extra);
    int ih, iw;
    panel_inner(w, &ih, &iw);
    if (ih <= 0) return;
    if (!v->log || v->log_n == 0) {
        panel_text(w, 1, 1, iw, A_DIM, "scheduler decisions appear here (admit, chunk, preempt, swap, evict, share)",
                   -1);
        return;
    }
    int scroll = v->log_scroll;
    if (scroll > v->log_n - ih) scroll = v->log_n - ih > 0 ? v->log_n - ih : 0;
    int newest = v->log_n - 1 - scroll;
    int oldest = newest - ih + 1;
    if (oldest < 0) oldest = 0;
    for (int i = oldest, y = 1; i <= newest; i++, y++) {
        int idx = (v->log_head - v->log_n + i + 2 * KV_LOG_CAP) % KV_LOG_CAP;
        const kv_decision *d = &v->log[idx];
        char head[24];
        int hn = snprintf(head, sizeof head, "%6llu ", (unsigned long long)(d->step % 1000000));
        panel_text(w, y, 1, iw, A_DIM, head, hn);
        panel_text(w, y, 1 + hn, iw - hn, decision_attr(v, d->kind), d->text, -1);
    }
}

