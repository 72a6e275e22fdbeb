/* trace_export.c - a loaded trace as Chrome trace-event JSON (chrome://tracing,
 * Perfetto): engine steps as spans, scheduler decisions as instants,
 * counters per frame, one span per request on its session's track. Uses
 * only trace.h's interface. */
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"
#include "json.h"
#include "metrics_json.h"

/* ---- Chrome trace-event JSON ---- */

static const char *decision_name(kv_decision_kind k) {
    static const char *names[KV_DEC_KIND_COUNT] = {"admit", "chunk", "preempt", "swap_out", "swap_in",
                                                   "evict", "share", "cow",     "finish",   "reject",
                                                   "wait",  "cancel", "spec"};
    return (int)k >= 0 && k < KV_DEC_KIND_COUNT ? names[k] : "decision";
}

static void ev_begin(kv_json_writer *w, const char *name, const char *cat, const char *ph, double ts_ms, int tid) {
    kv_json_write_begin_object(w);
    kv_json_field_str(w, "name", name);
    kv_json_field_str(w, "cat", cat);
    kv_json_field_str(w, "ph", ph);
    kv_json_field_num(w, "ts", ts_ms * 1000.0);
    kv_json_field_int(w, "pid", 1);
    kv_json_field_int(w, "tid", tid);
}

/* A complete event ("X") of dur_ms from ts_ms, left open. */
static void ev_span_head(kv_json_writer *w, const char *name, const char *cat, double ts_ms, double dur_ms, int tid) {
    ev_begin(w, name, cat, "X", ts_ms, tid);
    kv_json_field_num(w, "dur", dur_ms * 1000.0);
}

/* The same without args. */
static void ev_span(kv_json_writer *w, const char *name, const char *cat, double ts_ms, double dur_ms, int tid) {
    ev_span_head(w, name, cat, ts_ms, dur_ms, tid);
    kv_json_write_end_object(w);
}

/* Opens the event's "args" object. */
static void args_begin(kv_json_writer *w) {
    kv_json_write_key(w, "args");
    kv_json_write_begin_object(w);
}

/* Closes the "args" object and the event around it. */
static void args_end(kv_json_writer *w) {
    kv_json_write_end_object(w);
    kv_json_write_end_object(w);
}

/* A complete event with its "args" object opened (closed by args_end). */
static void ev_span_begin(kv_json_writer *w, const char *name, const char *cat, double ts_ms, double dur_ms, int tid) {
    ev_span_head(w, name, cat, ts_ms, dur_ms, tid);
    args_begin(w);
}

/* A counter event ("C") at ts_ms with three integer series. */
static void counter3(kv_json_writer *w, const char *name, double ts_ms, const char *const keys[3],
                     const int64_t vals[3]) {
    ev_begin(w, name, "counter", "C", ts_ms, 0);
    args_begin(w);
    for (int i = 0; i < 3; i++) kv_json_field_int(w, keys[i], vals[i]);
    args_end(w);
}

static void thread_name(kv_json_writer *w, int tid, const char *name) {
    kv_json_write_begin_object(w);
    kv_json_field_str(w, "name", "thread_name");
    kv_json_field_str(w, "ph", "M");
    kv_json_field_int(w, "pid", 1);
    kv_json_field_int(w, "tid", tid);
    args_begin(w);
    kv_json_field_str(w, "name", name);
    args_end(w);
}

static void export_step(kv_json_writer *w, const kv_step_record *r) {
    char name[48];
    snprintf(name, sizeof name, "step %llu", (unsigned long long)r->step);
    ev_span_begin(w, name, "step", r->t_ms, r->dur_ms, 1);
    kv_json_field_int(w, "seqs", r->n_seqs);
    kv_json_field_int(w, "prefill_tokens", r->n_prefill_tokens);
    kv_json_field_int(w, "decode_tokens", r->n_decode_tokens);
    kv_json_field_int(w, "spec_tokens", r->n_spec_tokens);
    kv_json_field_int(w, "admitted", r->n_admitted);
    kv_json_field_int(w, "preempted", r->n_preempted);
    kv_json_field_int(w, "finished", r->n_finished);
    kv_json_field_int(w, "blocks_used", r->n_blocks_used);
    kv_json_field_int(w, "waiting", r->n_waiting);
    if (r->sim_ms > 0) kv_json_field_num(w, "sim_device_ms", r->sim_ms);
    args_end(w);
    if (r->forward_ms > 0) ev_span(w, "forward", "forward", r->t_ms, r->forward_ms, 1);
}

/* A decision at its step's start (found among s's step records), else at
 * the frame's time. */
static void export_decision(kv_json_writer *w, const kv_decision *d, const kv_snapshot *s) {
    double ts = s->now_ms;
    for (int k = s->n_steps - 1; k >= 0; k--)
        if (s->steps[k].step == d->step) {
            ts = s->steps[k].t_ms;
            break;
        }
    ev_begin(w, decision_name(d->kind), "decision", "i", ts, 2);
    kv_json_field_str(w, "s", "t");
    args_begin(w);
    kv_json_field_int(w, "step", (int64_t)d->step);
    kv_json_field_int(w, "req", d->req);
    kv_json_field_str(w, "text", d->text);
    args_end(w);
}

static void export_counters(kv_json_writer *w, const kv_snapshot *s) {
    static const char *const blocks[3] = {"used", "cached", "free"}, *const queues[3] = {"running", "waiting",
                                                                                         "swapped"};
    counter3(w, "kv blocks", s->now_ms, blocks, (const int64_t[3]){s->blocks_used, s->blocks_cached, s->blocks_free});
    counter3(w, "queues", s->now_ms, queues, (const int64_t[3]){s->n_running, s->n_waiting, s->n_swapped});
}

/* Each request as in the last frame that lists it: a table sorted by id. */
typedef struct req_last {
    kv_snap_request q;
    double now_ms;      /* that frame's clock */
} req_last;

typedef struct req_table {
    req_last *v;        /* (cap) sorted by q.id */
    size_t n, cap;
} req_table;

/* Records q as seen at now_ms. Out of memory: the request is left out of
 * the export, not the export. */
static void req_note(req_table *rt, const kv_snap_request *q, double now_ms) {
    size_t lo = 0, hi = rt->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rt->v[mid].q.id < q->id) lo = mid + 1;
        else hi = mid;
    }
    if (lo == rt->n || rt->v[lo].q.id != q->id) {
        if (kv_grow_size((void **)&rt->v, &rt->cap, rt->n + 1, sizeof *rt->v)) return;
        memmove(rt->v + lo + 1, rt->v + lo, (rt->n - lo) * sizeof *rt->v);
        rt->n++;
    }
    rt->v[lo].q = *q;
    rt->v[lo].now_ms = now_ms;
}

static void export_request(kv_json_writer *w, const req_last *r, int named[64]) {
    const kv_snap_request *q = &r->q;
    int tid = 100 + (q->session >= 0 ? q->session % 10000 : 0);
    int slot = q->session >= 0 ? q->session % 64 : 0;
    if (!named[slot]) {
        char tn[48];
        snprintf(tn, sizeof tn, "session %d", q->session);
        thread_name(w, tid, tn);
        named[slot] = 1;
    }
    char name[48];
    snprintf(name, sizeof name, "request #%lld", (long long)q->id);
    double end = q->e2e_ms >= 0 ? q->arrival_ms + q->e2e_ms : r->now_ms;
    ev_span_begin(w, name, "request", q->arrival_ms, end - q->arrival_ms, tid);
    kv_json_field_int(w, "prompt_tokens", q->n_prompt);
    kv_json_field_int(w, "generated", q->n_generated);
    kv_json_field_int(w, "prefix_hit_tokens", q->n_prefix_hit);
    kv_json_field_int(w, "preemptions", q->preemptions);
    kv_json_field_num(w, "queue_ms", q->queue_ms);
    kv_json_field_num(w, "ttft_ms", q->ttft_ms);
    kv_json_field_num(w, "tpot_ms", q->tpot_ms);
    kv_json_field_int(w, "finish", q->finish);
    args_end(w);
    if (q->queue_ms > 0) ev_span(w, "queued", "request", q->arrival_ms, q->queue_ms, tid);
}

int kv_trace_export_chrome(kv_trace *t, const char *path, kv_err *err) {
    if (!t || !path) return kv_err_set(err, KV_ERR_INVAL, "trace export: nothing to export");
    FILE *f = fopen(path, "w");
    if (!f) return kv_err_set(err, KV_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    kv_json_writer w;
    kv_json_writer_init(&w, f, 0);
    kv_json_write_begin_object(&w);
    kv_json_field_str(&w, "displayTimeUnit", "ms");
    kv_json_write_key(&w, "traceEvents");
    kv_json_write_begin_array(&w);
    thread_name(&w, 1, "engine steps");
    thread_name(&w, 2, "scheduler decisions");
    req_table rt = {0};
    int shown = kv_trace_shown(t);
    for (int fi = 0; fi < kv_trace_n_frames(t); fi++) {
        const kv_snapshot *s = kv_trace_frame(t, fi);
        /* This frame's new records: after the previous frame's. */
        const kv_step_record *st;
        const kv_decision *dc;
        size_t n_st, n_dc;
        kv_trace_frame_news(t, fi, &st, &n_st, &dc, &n_dc);
        for (size_t k = 0; k < n_st; k++) export_step(&w, &st[k]);
        for (size_t k = 0; k < n_dc; k++) export_decision(&w, &dc[k], s);
        export_counters(&w, s);
        for (int i = 0; i < s->n_requests; i++) req_note(&rt, &s->requests[i], s->now_ms);
    }
    int named[64] = {0};
    for (size_t i = 0; i < rt.n; i++) export_request(&w, &rt.v[i], named);
    free(rt.v);
    if (shown >= 0) kv_trace_frame(t, shown); /* the caller's frame as it was */
    kv_json_write_end_array(&w);
    kv_json_write_end_object(&w);
    int rc = kv_json_writer_finish(&w);
    fputc('\n', f);
    if (ferror(f)) rc = KV_ERR_IO;
    if (fclose(f)) rc = KV_ERR_IO;
    if (rc) return kv_err_set(err, KV_ERR_IO, "error writing %s", path);
    return 0;
}
