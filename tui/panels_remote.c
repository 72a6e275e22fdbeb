/* panels_remote.c - the panels of `kvtop attach` on a metrics source (vLLM,
 * SGLang, llama-server, TGI): the same windows as a local run, drawn from
 * what the adapter read (kv_source_status.m, its slots) and saying N/A with
 * the kind's one-line reason for what the server does not export, never a
 * zero in its place. A kvtop source draws with the ordinary panels. */
#include "panels_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "panels_remote.h"

static const kv_source_status *st_of(const kv_view_state *v) { return v->remote_status; }

/* "N/A: reason" in dim on row y. */
static void na(WINDOW *w, int y, int iw, const kv_source_status *st, kv_source_field f) {
    const char *why = kv_source_na_reason(st->kind, f);
    panel_textf(w, y, 1, iw, A_DIM, "N/A: %s", why ? why : "nothing in the window yet (needs two scrapes)");
}

static void ms3(char *out, size_t cap, const char *what, const double *v, int valid) {
    char a[24], b[24], c[24];
    kv_format_ms(a, sizeof a, v[0], valid);
    kv_format_ms(b, sizeof b, v[1], valid);
    kv_format_ms(c, sizeof c, v[2], valid);
    snprintf(out, cap, "%s P50 %s  P90 %s  P99 %s", what, a, b, c);
}

static void remote_blocks(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_source_status *st = st_of(v);
    const kv_remote_metrics *m = &st->m;
    char extra[96] = "";
    if (m->have & KV_RM_CACHE_CFG)
        snprintf(extra, sizeof extra, "%d blocks x %d tok, %s", m->num_blocks, m->block_size, m->cache_dtype);
    int ih, iw;
    if (!panel_open_room(w, v, "KV blocks", extra, &ih, &iw)) return;
    int y = 1;
    char bar[256];
    if (m->have & KV_RM_KV_USAGE) {
        kv_format_bar(bar, sizeof bar, KV_MAX(iw - 24, 4), m->kv_usage, v->utf8);
        panel_textf(w, y++, 1, iw, A_NORMAL, "KV used %5.1f%% %s", 100 * m->kv_usage, bar);
        if (m->have & KV_RM_CACHE_CFG)
            panel_textf(w, y++, 1, iw, A_NORMAL, "used %.0f  free %.0f blocks (from the usage fraction)",
                        m->kv_usage * m->num_blocks, (1 - m->kv_usage) * m->num_blocks);
    } else {
        na(w, y++, iw, st, KV_SF_KV_USAGE);
    }
    if (m->have & KV_RM_KV_TOKENS)
        panel_textf(w, y++, 1, iw, A_NORMAL, "tokens in KV %.0f of %.0f", m->kv_used_tokens, m->kv_total_tokens);
    if (st->kind == KV_SOURCE_LLAMACPP && st->n_slots) {
        int busy = 0;
        long ctx = 0;
        for (int i = 0; i < st->n_slots; i++) {
            busy += st->slots[i].busy;
            ctx += st->slots[i].n_ctx;
        }
        panel_textf(w, y++, 1, iw, A_NORMAL, "slots %d busy of %d, %ld context tokens reserved in all", busy,
                    st->n_slots, ctx);
    }
    if (y <= ih) na(w, y++, iw, st, KV_SF_BLOCKS);
    (void)s;
}

static void remote_prefix(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_source_status *st = st_of(v);
    int ih, iw;
    if (!panel_open_room(w, v, "Prefix sharing", kv_source_kind_name(st->kind), &ih, &iw)) return;
    if (st->m.have & KV_RM_PREFIX)
        panel_textf(w, 1, 1, iw, A_NORMAL, "hit %.1f%% of prompt tokens (last %.0fs)", 100 * st->m.prefix_hit_rate,
                    st->m.window_s);
    else na(w, 1, iw, st, KV_SF_PREFIX);
    if (ih >= 2) panel_text(w, 2, 1, iw, A_DIM, "the tabs' own replies note cache_n where the server says it", -1);
    (void)s;
}

static void remote_spec(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_source_status *st = st_of(v);
    const kv_remote_metrics *m = &st->m;
    int ih, iw;
    if (!panel_open_room(w, v, "Spec decoding", "", &ih, &iw)) return;
    if (!(m->have & (KV_RM_SPEC | KV_RM_SPEC_LEN))) {
        panel_text(w, 1, 1, iw, A_DIM, "no drafts in the window (off, or idle)", -1);
        return;
    }
    int y = 1;
    if (m->have & KV_RM_SPEC) panel_textf(w, y++, 1, iw, A_NORMAL, "accepted %.1f%% of drafted tokens", 100 * m->spec_accept);
    if ((m->have & KV_RM_SPEC_LEN) && y <= ih)
        panel_textf(w, y++, 1, iw, A_NORMAL, "%.2f tokens per verify step", m->spec_accept_len);
    if ((m->have & KV_RM_SPEC_POS) && y <= ih) {
        char line[160];
        int n = snprintf(line, sizeof line, "per position:");
        for (int i = 0; i < m->n_spec_pos && n < (int)sizeof line - 8; i++)
            n += snprintf(line + n, sizeof line - (size_t)n, " %.0f%%", 100 * m->spec_pos[i]);
        panel_text(w, y++, 1, iw, A_NORMAL, line, -1);
    }
    (void)s;
}

static void remote_mem(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_source_status *st = st_of(v);
    int ih, iw;
    if (!panel_open_room(w, v, "Mem", kv_source_kind_name(st->kind), &ih, &iw)) return;
    na(w, 1, iw, st, KV_SF_MEMORY);
    (void)s;
}

static void remote_sched(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_source_status *st = st_of(v);
    const kv_remote_metrics *m = &st->m;
    int ih, iw;
    if (!panel_open_room(w, v, "Sched", kv_source_kind_name(st->kind), &ih, &iw)) return;
    int y = 1;
    if ((m->have & KV_RM_QUEUE) && (m->have & KV_RM_WAIT_REASON))
        panel_textf(w, y++, 1, iw, A_NORMAL, "running %.0f  waiting %.0f (%.0f for KV capacity, %.0f deferred)", m->running,
                    m->waiting, m->wait_capacity, m->wait_deferred);
    else if (m->have & KV_RM_QUEUE) panel_textf(w, y++, 1, iw, A_NORMAL, "running %.0f  waiting %.0f", m->running, m->waiting);
    else na(w, y++, iw, st, KV_SF_QUEUES);
    char line[200], a[32], b[32];
    if (y <= ih) {
        kv_format_rate(a, sizeof a, m->gen_tok_s, "tok/s");
        kv_format_rate(b, sizeof b, m->prompt_tok_s, "tok/s");
        if (m->have & KV_RM_TOKS) panel_textf(w, y++, 1, iw, A_NORMAL, "out %s  in %s  preempt %.2f/s", a, b, m->preempt_per_s);
        else panel_text(w, y++, 1, iw, A_DIM, "tokens per second: one more scrape needed", -1);
    }
    if (y <= ih && (m->have & KV_RM_TTFT)) {
        ms3(line, sizeof line, "TTFT", m->ttft_ms, 1);
        panel_text(w, y++, 1, iw, A_NORMAL, line, -1);
    }
    if (y <= ih && (m->have & KV_RM_E2E)) {
        ms3(line, sizeof line, "E2E ", m->e2e_ms, 1);
        panel_text(w, y++, 1, iw, A_NORMAL, line, -1);
    }
    if (y <= ih && (m->have & KV_RM_QUEUE_TIME)) {
        ms3(line, sizeof line, "queue", m->queue_ms, 1);
        panel_text(w, y++, 1, iw, A_NORMAL, line, -1);
    }
    if (y <= ih && (m->have & KV_RM_BATCH)) panel_textf(w, y++, 1, iw, A_NORMAL, "batch %.1f", m->batch_size);
    if (st->n_slots && y <= ih) {
        panel_text(w, y++, 1, iw, A_BOLD, "slot  state  task    decoded  remaining  ctx    spec", -1);
        for (int i = 0; i < st->n_slots && y <= ih; i++) {
            const kv_source_slot *q = &st->slots[i];
            panel_textf(w, y++, 1, iw, q->busy ? A_NORMAL : A_DIM, "%4d  %-5s  %-6lld  %7d  %9d  %-5d  %s", q->id,
                        q->busy ? "busy" : "idle", (long long)q->task, q->n_decoded, q->n_remaining, q->n_ctx,
                        q->speculative ? "yes" : "no");
        }
    } else if (y <= ih) {
        na(w, y++, iw, st, KV_SF_REQUESTS);
    }
    (void)s;
}

static void remote_log(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_source_status *st = st_of(v);
    int ih, iw;
    if (!panel_open_room(w, v, "Step log", "", &ih, &iw)) return;
    na(w, 1, iw, st, KV_SF_STEPS);
    if (ih >= 3)
        panel_textf(w, 3, 1, iw, A_DIM, "scrapes %llu, requests sent %llu, malformed lines %llu",
                    (unsigned long long)st->frames, (unsigned long long)st->requests,
                    (unsigned long long)st->rejected);
    if (ih >= 4 && st->rejected) panel_textf(w, 4, 1, iw, A_DIM, "first: %s", st->rejected_msg);
    (void)s;
}

/* "12.3" or "N/A". */
static const char *num(char *buf, size_t cap, double v, const char *fmt) {
    if (isnan(v)) snprintf(buf, cap, "N/A");
    else snprintf(buf, cap, fmt, v);
    return buf;
}

/* The fleet: one row per engine, the selected one marked. */
static void fleet(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[48];
    snprintf(extra, sizeof extra, "%d engines  [ ] select", v->n_fleet);
    int ih, iw;
    if (!panel_open_room(w, v, "Fleet", extra, &ih, &iw)) return;
    int wide = iw >= 100; /* the model column only when there is room */
    if (wide) panel_text(w, 1, 1, iw, A_BOLD, "  engine                kind      model             run  wait   KV%   tok/s  TTFT99  health", -1);
    else panel_text(w, 1, 1, iw, A_BOLD, "  engine          kind      run wait   KV% tok/s  TTFT99 state", -1);
    double now = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    for (int i = 0; i < v->n_fleet && i + 2 <= ih; i++) {
        const kv_source_status *st = &v->fleet[i];
        const char *host = strstr(st->url, "://");
        host = host ? host + 3 : st->url;
        char r[16], q[16], kv[16], tk[16], tt[24], health[48];
        int fresh = st->last_ok_s > 0;
        num(r, sizeof r, fresh ? st->sum.running : NAN, "%.0f");
        num(q, sizeof q, fresh ? st->sum.waiting : NAN, "%.0f");
        num(kv, sizeof kv, fresh ? st->sum.kv_pct : NAN, "%.1f");
        num(tk, sizeof tk, fresh ? st->sum.tok_s : NAN, "%.1f");
        if (fresh && !isnan(st->sum.ttft_p99_ms)) kv_format_ms(tt, sizeof tt, st->sum.ttft_p99_ms, 1);
        else snprintf(tt, sizeof tt, "N/A");
        if (st->up) snprintf(health, sizeof health, "ok");
        else if (st->last_ok_s > 0) snprintf(health, sizeof health, "STALE %.0fs", now - st->last_ok_s);
        else snprintf(health, sizeof health, wide ? "down: %.30s" : "down", st->error[0] ? st->error : "connecting");
        attr_t at = i == v->fleet_sel ? A_REVERSE : (st->up ? A_NORMAL : A_DIM);
        char mark = i == v->fleet_sel ? '>' : ' ';
        if (wide)
            panel_textf(w, i + 2, 1, iw, at, "%c %-21.21s %-9s %-16.16s %4s %5s %5s %7s %7s  %s", mark, host,
                        kv_source_kind_name(st->kind), st->model[0] ? st->model : "?", r, q, kv, tk, tt, health);
        else
            panel_textf(w, i + 2, 1, iw, at, "%c %-15.15s %-9s %3s %4s %5s %5s %7s %s", mark, host,
                        kv_source_kind_name(st->kind), r, q, kv, tk, tt, health);
    }
    (void)s;
}

static kv_panel_fn log_fn(const kv_view_state *v) {
    if (!v->remote_status || v->remote_status->kind == KV_SOURCE_KVTOP || v->remote_status->kind == KV_SOURCE_AUTO)
        return kv_panel_log;
    return remote_log;
}

/* Several engines: the fleet on top of the log's window, the selected
 * engine's step log under it when there is room for both. */
static void fleet_and_log(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    int h = getmaxy(w), wd = getmaxx(w);
    int fh = v->n_fleet + 3; /* borders and the header row */
    if (h - fh < 5) {
        fleet(w, v, s);
        return;
    }
    WINDOW *top = derwin(w, fh, wd, 0, 0), *bottom = derwin(w, h - fh, wd, fh, 0);
    if (top && bottom) {
        fleet(top, v, s);
        log_fn(v)(bottom, v, s);
    } else {
        fleet(w, v, s);
    }
    if (top) delwin(top);
    if (bottom) delwin(bottom);
}

kv_panel_fn kv_panel_remote_fn(const kv_view_state *v, kv_panel_id id) {
    if (v->n_fleet > 1 && id == KV_PANEL_LOG) return fleet_and_log; /* several engines: the fleet over the log */
    if (v->ptree && id == KV_PANEL_BLOCKS) return kv_panel_ptree; /* --kv-events: the tree its events rebuild */
    if (!v->remote_status || v->remote_status->kind == KV_SOURCE_KVTOP || v->remote_status->kind == KV_SOURCE_AUTO)
        return NULL;
    switch (id) {
    case KV_PANEL_BLOCKS: return remote_blocks;
    case KV_PANEL_PREFIX: return remote_prefix;
    case KV_PANEL_SPEC: return remote_spec;
    case KV_PANEL_MEM: return remote_mem;
    case KV_PANEL_SCHED: return remote_sched;
    case KV_PANEL_LOG: return remote_log;
    default: return NULL; /* chat and TPOT: the ordinary ones (client-side series, snapshot metrics) */
    }
}
