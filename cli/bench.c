/* bench.c - `kvtop bench` without the command line: runs a profile's
 * workload through a fresh engine stepped on the caller's thread, keeps the
 * outcome of every request, and writes the table and the comparison (the
 * JSON summary and the JSONL outputs are bench_json.c). See bench.h for
 * the contracts. */
#include "bench.h"
#include "bench_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/compare.h"
#include "../engine/driver.h"
#include "../engine/metrics_json.h"
#include "../profiles/profile.h"

enum {
    EVENT_BATCH = 256,        /* events taken per poll */
    PROGRESS_MS = 200,        /* at most 5 progress redraws per second */
    STALL_MS = 10000,         /* no engine progress for this long with work in flight: give up */
    IDLE_SLEEP_MS = 20,       /* longest sleep while waiting for the next arrival */
    SUBMIT_BATCH = 64         /* driver records taken per call */
};

/* ---- small helpers ---- */

static double since_s(uint64_t t0_ns) { return (double)(kv_now_ns() - t0_ns) / 1e9; }

static void sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(fmod(ms, 1000.0) * 1e6)};
    nanosleep(&ts, NULL);
}

const char *kv_bench_finish_name(kv_finish f) {
    return f == KV_FINISH_NONE || (int)f < 0 || f > KV_FINISH_ERROR ? "none" : kv_finish_name(f);
}

/* ---- one run ---- */

typedef struct run_state {
    const kv_config *cfg;
    kv_engine *e;
    kv_driver *d;         /* the workload's items as submissions */
    kv_bench_result *r;
    int n;                /* requests */
    int *idx_of_id;       /* (cap_ids) workload index of an engine id, -1 unknown */
    int64_t cap_ids;
    int in_flight;        /* submitted, not done */
    int done;             /* finished, cancelled or rejected */
    uint64_t t0_ns;       /* first submission */
    kv_event *ev;         /* (EVENT_BATCH) */
    kv_snapshot *snap;    /* progress line only */
    double last_draw_s;
    const kv_bench_opts *opts;
} run_state;

static int map_id(run_state *s, int64_t id, int idx) {
    if (id >= s->cap_ids) {
        int64_t nc = s->cap_ids ? s->cap_ids : 64;
        while (nc <= id) nc *= 2;
        int *p = realloc(s->idx_of_id, (size_t)nc * sizeof *p);
        if (!p) return KV_ERR_NOMEM;
        for (int64_t k = s->cap_ids; k < nc; k++) p[k] = -1;
        s->idx_of_id = p;
        s->cap_ids = nc;
    }
    s->idx_of_id[id] = idx;
    return 0;
}

static void mark_done(run_state *s, kv_bench_req *q) {
    switch (q->finish) {
    case KV_FINISH_EOS:
    case KV_FINISH_LENGTH:
    case KV_FINISH_STOP: s->r->completed++; break;
    case KV_FINISH_REJECTED: s->r->rejected++; break;
    case KV_FINISH_CANCELLED: s->r->cancelled++; break;
    default: s->r->errors++; break;
    }
    s->done++;
}

/* Records what the driver did with one item that came due. */
static int record_sub(run_state *s, const kv_driver_sub *sub) {
    kv_bench_req *q = &s->r->reqs[sub->index];
    q->prompt_tokens = sub->prompt_tokens;
    q->submit_ms = kv_engine_now_ms(s->e);
    q->first_token_ms = -1;
    if (sub->id > 0) {
        if (map_id(s, sub->id, sub->index)) return KV_ERR_NOMEM;
        q->id = sub->id;
        s->in_flight++;
        return 0;
    }
    /* its prompt could not be built, or the engine refused it at the door
     * (its DONE then carries an id we never learn, which handle_events
     * ignores) */
    q->finish = KV_FINISH_REJECTED;
    kv_copy_str(q->reason, sizeof q->reason, sub->reason);
    mark_done(s, q);
    return 0;
}

/* Submits every item that is due: open loop by arrival time on the
 * engine's clock (the simulated one on sim), closed loop while fewer than
 * `concurrency` are in flight.
 * NOTE: the engine is stepped on this thread, so an open-loop request that
 * comes due during a step is submitted when the step ends, and the engine's
 * TTFT and queue time start then: they leave out up to one step of lateness.
 * Stepping here (rather than on the engine thread) keeps closed-loop and
 * burst runs deterministic: the next request joins the very next step. */
static int submit_due(run_state *s) {
    kv_driver_sub sub[SUBMIT_BATCH];
    if (s->t0_ns == 0) s->t0_ns = kv_now_ns(); /* the driver's clock starts at its first call */
    for (;;) {
        kv_err err;
        int n = kv_driver_submit_due(s->d, kv_engine_now_ms(s->e), s->in_flight, sub, SUBMIT_BATCH, &err);
        if (n < 0) return n;
        for (int k = 0; k < n; k++) {
            int rc = record_sub(s, &sub[k]);
            if (rc) return rc;
        }
        if (n < SUBMIT_BATCH) return 0;
    }
}

static int finish_request(run_state *s, int idx, const kv_event *ev) {
    kv_bench_req *q = &s->r->reqs[idx];
    if (q->finish != KV_FINISH_NONE) return 0; /* a second DONE: ignore */
    q->finish = ev->finish == KV_FINISH_NONE ? KV_FINISH_ERROR : ev->finish;
    if (q->finish == KV_FINISH_REJECTED || q->finish == KV_FINISH_ERROR || q->finish == KV_FINISH_CANCELLED)
        kv_copy_str(q->reason, sizeof q->reason, ev->reason);
    int len = kv_engine_request_text(s->e, q->id, NULL, 0);
    if (len > 0) {
        char *t = malloc((size_t)len + 1);
        if (!t) return KV_ERR_NOMEM;
        kv_engine_request_text(s->e, q->id, t, (size_t)len + 1);
        free(q->text);
        q->text = t;
    }
    kv_engine_forget(s->e, q->id);
    s->in_flight--;
    mark_done(s, q);
    return 0;
}

/* Drains the event queue. Returns the number of events seen or an error. */
static int handle_events(run_state *s) {
    int seen = 0;
    for (;;) {
        int n = kv_engine_poll(s->e, s->ev, EVENT_BATCH);
        for (int k = 0; k < n; k++) {
            const kv_event *ev = &s->ev[k];
            int idx = ev->req > 0 && ev->req < s->cap_ids ? s->idx_of_id[ev->req] : -1;
            if (idx < 0) continue;
            if (ev->type == KV_EVENT_TOKEN) {
                if (ev->token >= 0) { /* token -1 carries only overflow text */
                    if (s->r->reqs[idx].first_token_ms < 0) s->r->reqs[idx].first_token_ms = ev->t_ms;
                    s->r->reqs[idx].output_tokens++;
                    s->r->output_tokens++;
                }
            } else if (ev->type == KV_EVENT_DONE) {
                int rc = finish_request(s, idx, ev);
                if (rc) return rc;
            }
        }
        seen += n;
        if (n < EVENT_BATCH) return seen;
    }
}

static void draw_progress(run_state *s, int force) {
    FILE *f = s->opts ? s->opts->progress : NULL;
    if (!f) return;
    double t = s->t0_ns ? since_s(s->t0_ns) : 0;
    if (!force && t - s->last_draw_s < PROGRESS_MS / 1000.0) return;
    s->last_draw_s = t;
    int running = 0, waiting = 0, used = 0, total = 0;
    if (s->snap && kv_engine_snapshot(s->e, s->snap) == 0) {
        running = s->snap->n_running;
        waiting = s->snap->n_waiting + s->snap->n_swapped;
        used = s->snap->blocks_used;
        total = s->snap->n_blocks;
    }
    const char *label = s->opts->label;
    fprintf(f, "\r%s%s%d/%d done  %.0f tok/s  running %d  waiting %d  KV %d/%d blocks  %.1fs\033[K",
            label ? label : "", label ? ": " : "", s->done, s->n, t > 0 ? (double)s->r->output_tokens / t : 0.0,
            running, waiting, used, total, t);
    fflush(f);
}

static void run_state_free(run_state *s) {
    kv_snapshot_free(s->snap);
    free(s->ev);
    free(s->idx_of_id);
    kv_driver_free(s->d);
    kv_engine_free(s->e);
}

void kv_bench_result_free(kv_bench_result *r) {
    if (!r) return;
    if (r->reqs)
        for (int i = 0; i < r->n_requests; i++) free(r->reqs[i].text);
    free(r->reqs);
    memset(r, 0, sizeof *r);
}

/* The loop: submit what is due, run one engine iteration, take the events,
 * and sleep only when the engine is idle until the next arrival. */
static int drive(run_state *s, kv_err *err) {
    int rc = submit_due(s);
    double stalled_since = -1;
    while (!rc && s->done < s->n) {
        int st = kv_engine_step(s->e);
        if (st < 0) return kv_err_set(err, st, "bench: engine step failed (%d) with %d requests in flight", st,
                                      s->in_flight);
        int seen = handle_events(s);
        if (seen < 0) return kv_err_set(err, seen, "bench: out of memory while collecting outputs");
        rc = submit_due(s);
        if (rc) break;
        double held = st == 0 && seen == 0 && s->in_flight > 0 && kv_engine_clock_is_virtual(s->e)
                          ? kv_engine_hold_wait_ms(s->e) : 0.0;
        if (held > 0) { /* disaggregated: requests wait for their KV; so may an arrival */
            if (kv_driver_remaining(s->d) > 0)
                held = KV_MIN(held, kv_driver_next_wait_ms(s->d, kv_engine_now_ms(s->e)));
            if (held > 1e-6) kv_engine_advance_clock(s->e, held);
            stalled_since = -1;
        } else if (st == 0 && seen == 0) {
            if (s->in_flight > 0) {
                /* NOTE: nothing to do with requests in flight means a request
                 * can never be scheduled; the engine should have rejected it.
                 * Fail loudly instead of spinning forever. */
                double now = since_s(s->t0_ns);
                if (stalled_since < 0) stalled_since = now;
                if ((now - stalled_since) * 1000 > STALL_MS)
                    return kv_err_set(err, KV_ERR_BACKEND,
                                      "bench: the engine made no progress for %d s with %d requests in flight "
                                      "(%d of %d done)",
                                      STALL_MS / 1000, s->in_flight, s->done, s->n);
                sleep_ms(1);
            } else if (kv_driver_remaining(s->d) > 0) {
                double wait = kv_driver_next_wait_ms(s->d, kv_engine_now_ms(s->e));
                /* a simulated clock is moved to the arrival, not waited for */
                if (kv_engine_clock_is_virtual(s->e)) {
                    if (wait > 1e-6) kv_engine_advance_clock(s->e, wait);
                } else {
                    sleep_ms(KV_MIN(wait, (double)IDLE_SLEEP_MS));
                }
            }
        } else {
            stalled_since = -1;
        }
        draw_progress(s, 0);
    }
    if (rc) return kv_err_set(err, rc, "bench: out of memory");
    return 0;
}

int kv_bench_run(const kv_config *cfg, const kv_bench_opts *opts, kv_bench_result *out, kv_err *err) {
    kv_err local;
    if (!err) err = &local;
    kv_err_clear(err);
    if (!out) return kv_err_set(err, KV_ERR_INVAL, "bench: NULL result");
    memset(out, 0, sizeof *out);
    if (!cfg) return kv_err_set(err, KV_ERR_INVAL, "bench: NULL config");
    run_state s;
    memset(&s, 0, sizeof s);
    s.cfg = cfg;
    s.opts = opts;
    s.r = out;
    int rc;
    /* the workload first: a bad one is an input error and starts nothing */
    kv_workload *w = kv_workload_build(cfg, err);
    if (!w) {
        rc = err->code ? err->code : KV_ERR_INVAL;
        if (rc != KV_ERR_NOMEM) rc = KV_ERR_INVAL;
        goto fail;
    }
    s.n = kv_workload_count(w);
    out->cfg = *cfg;
    out->n_requests = s.n;
    out->reqs = calloc(s.n > 0 ? (size_t)s.n : 1, sizeof *out->reqs);
    for (int i = 0; out->reqs && i < s.n; i++) out->reqs[i].cls = kv_workload_get(w, i)->cls;
    kv_workload_free(w);
    s.ev = malloc(EVENT_BATCH * sizeof *s.ev);
    if (!out->reqs || !s.ev) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "bench: out of memory for %d requests", s.n);
        goto fail;
    }
    s.e = kv_engine_new(cfg, err);
    if (!s.e) {
        rc = err->code < 0 ? err->code : KV_ERR_BACKEND;
        if (rc == KV_ERR_INVAL) rc = KV_ERR_BACKEND; /* the config was valid: the model or backend was not */
        goto fail;
    }
    /* every prompt tokenized before the clock starts; one that cannot be
     * built becomes a rejected request (reason kept), not a failed run */
    kv_driver_opts dopts = {.pretokenize = 1, .seed_per_item = 1};
    if (!(s.d = kv_driver_new(s.e, cfg, &dopts, err))) {
        rc = err->code < 0 ? err->code : KV_ERR_NOMEM;
        goto fail;
    }
    if (opts && opts->progress && !(s.snap = kv_snapshot_new())) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "bench: out of memory");
        goto fail;
    }
    if (opts && opts->on_ready) opts->on_ready(opts->ready_ctx);
    if ((rc = drive(&s, err))) goto fail;
    out->wall_s = s.t0_ns ? since_s(s.t0_ns) : 0;
    if (opts && opts->progress) {
        fprintf(opts->progress, "\r\033[K");
        fflush(opts->progress);
    }

    kv_engine_metrics(s.e, &out->m);
    out->n_experts = kv_engine_expert_tokens(s.e, out->expert_tokens, KV_MOE_MAX_EXPERTS, &out->expert_step_imbalance);
    out->n_experts_used = kv_engine_model(s.e)->hp.n_expert_used;
    kv_snapshot *snap = s.snap ? s.snap : kv_snapshot_new();
    if (!snap || kv_engine_snapshot(s.e, snap)) {
        if (snap != s.snap) kv_snapshot_free(snap);
        rc = kv_err_set(err, KV_ERR_NOMEM, "bench: out of memory for the final snapshot");
        goto fail;
    }
    kv_copy_str(out->model_name, sizeof out->model_name, snap->model_name);
    kv_copy_str(out->model_warning, sizeof out->model_warning, kv_model_warning(kv_engine_model(s.e)));
    kv_copy_str(out->backend, sizeof out->backend, snap->backend);
    out->kv_blocks_total = snap->n_blocks;
    out->kv_block_size = snap->block_size;
    out->kv_bytes_per_token = snap->kv_bytes_per_token;
    out->steps = snap->step;
    out->mem = snap->mem;
    out->gpu = snap->gpu;
    if (snap != s.snap) kv_snapshot_free(snap);
    run_state_free(&s);
    return 0;
fail:
    if (opts && opts->progress && s.t0_ns) {
        fprintf(opts->progress, "\r\033[K");
        fflush(opts->progress);
    }
    run_state_free(&s);
    kv_bench_result_free(out);
    return rc < 0 ? rc : KV_ERR_BACKEND;
}

/* ---- --compare parsing ---- */

int kv_bench_parse_compare(const char *arg, char *buf, size_t buf_cap, const char **key, const char **values,
                           int cap, kv_err *err) {
    /* one parser for bench and the TUI's --compare (engine/compare.c) */
    return kv_compare_parse(arg, buf, buf_cap, key, values, cap, err);
}

/* ---- the table ---- */

static void print_stat_row(FILE *f, const char *name, const kv_stat *st) {
    if (!st->valid) {
        fprintf(f, "  %-6s %10s %10s %10s %10s\n", name, "N/A", "N/A", "N/A", "N/A");
        return;
    }
    fprintf(f, "  %-6s %10.2f %10.2f %10.2f %10.2f\n", name, st->p50, st->p90, st->p99, st->mean);
}

static const char *first_reason(const kv_bench_result *r, kv_finish kind) {
    for (int i = 0; i < r->n_requests; i++)
        if (r->reqs[i].finish == kind && r->reqs[i].reason[0]) return r->reqs[i].reason;
    return NULL;
}

const char *kv_bench_enum_name(const char *key, int v) {
    const kv_config_key *k = kv_config_key_find(key);
    if (!k || !k->names) return "?";
    for (int i = 0; k->names[i]; i++)
        if (i == v) return k->names[i];
    return "?";
}

void kv_bench_print(FILE *f, const char *profile, const kv_bench_result *r) {
    const kv_metrics_summary *m = &r->m;
    const kv_config *c = &r->cfg;
    fprintf(f, "kvtop bench %s\n", profile ? profile : "(defaults)");
    char thr[32];
    if (c->threads > 0) snprintf(thr, sizeof thr, "%d threads", c->threads);
    else snprintf(thr, sizeof thr, "all cores");
    fprintf(f, "model          %s (%s backend, %s)\n", r->model_name, r->backend, thr);
    fprintf(f, "workload       %d requests, %s arrivals", r->n_requests, kv_bench_enum_name("workload.arrival", c->workload.arrival));
    if (c->workload.arrival == KV_ARRIVAL_POISSON) fprintf(f, " at %g/s", c->workload.rate);
    if (c->workload.arrival == KV_ARRIVAL_CLOSED) fprintf(f, ", %d in flight", c->workload.concurrency);
    fprintf(f, "; scheduler %s, kv %s\n", kv_bench_enum_name("scheduler.policy", c->scheduler.policy),
            kv_bench_enum_name("kv.layout", c->kv.layout));
    fprintf(f, "requests       %llu completed, %llu rejected", (unsigned long long)r->completed,
            (unsigned long long)r->rejected);
    if (r->cancelled) fprintf(f, ", %llu cancelled", (unsigned long long)r->cancelled);
    if (r->errors) fprintf(f, ", %llu failed", (unsigned long long)r->errors);
    fprintf(f, " of %d\n", r->n_requests);
    const char *why = first_reason(r, KV_FINISH_REJECTED);
    if (why) fprintf(f, "               first rejection: %s\n", why);
    why = first_reason(r, KV_FINISH_ERROR);
    if (why) fprintf(f, "               first failure: %s\n", why);
    fprintf(f, "tokens         %llu in, %llu out\n", (unsigned long long)m->input_tokens,
            (unsigned long long)m->output_tokens);
    fprintf(f, "throughput     input %.1f tok/s, output %.1f tok/s, %.2f requests/s\n", m->input_tokens_per_s,
            m->output_tokens_per_s, m->requests_per_s);
    if (m->decode_step_tokens_per_s > 0)
        fprintf(f, "decode steps   %.1f tok/s in the steps that ran no prompt tokens (prefill left out, as "
                   "llama-batched-bench's S_TG)\n", m->decode_step_tokens_per_s);
    fprintf(f, "goodput        %.2f requests/s within the SLA (", m->goodput_requests_per_s);
    if (c->sla.ttft_ms > 0) fprintf(f, "TTFT <= %g ms", c->sla.ttft_ms);
    if (c->sla.ttft_ms > 0 && c->sla.tpot_ms > 0) fprintf(f, ", ");
    if (c->sla.tpot_ms > 0) fprintf(f, "TPOT <= %g ms", c->sla.tpot_ms);
    if (!(c->sla.ttft_ms > 0) && !(c->sla.tpot_ms > 0)) fprintf(f, "no bounds");
    fprintf(f, "): %.1f%% of completed\n", 100.0 * m->sla_attainment);
    fprintf(f, "latency (ms)          p50        p90        p99       mean\n");
    print_stat_row(f, "TTFT", &m->ttft_ms);
    print_stat_row(f, "TPOT", &m->tpot_ms);
    print_stat_row(f, "ITL", &m->itl_ms);
    print_stat_row(f, "E2E", &m->e2e_ms);
    print_stat_row(f, "queue", &m->queue_ms);
    fprintf(f, "KV cache       %d blocks x %d tokens, %llu B/token (%s, %s); utilisation %.1f%%\n",
            r->kv_blocks_total, r->kv_block_size, (unsigned long long)r->kv_bytes_per_token,
            kv_cache_dtype_name(c->kv.dtype), kv_bench_enum_name("kv.layout", c->kv.layout), 100.0 * m->kv_utilization);
    {
        const kv_mem_breakdown *mb = &r->mem;
        fprintf(f, "memory         weights %.1f MiB", mb->weights / 1048576.0);
        if (mb->weights_prepared) /* the rows are paged out once packed: these are what stay resident */
            fprintf(f, " (%.1f MiB pre-packed as panels in place of their rows)", mb->weights_prepared / 1048576.0);
        fprintf(f, ", KV %.1f MiB, activations %.1f MiB", (mb->kv_used + mb->kv_cached + mb->kv_free) / 1048576.0,
                mb->activations / 1048576.0);
        if (mb->budget) fprintf(f, " (memory.budget %.1f MiB)", mb->budget / 1048576.0);
        fputc('\n', f);
    }
    fprintf(f, "prefix cache   hit rate %.1f%%, %llu tokens reused; prefill computed %llu tokens\n",
            100.0 * m->prefix_hit_rate, (unsigned long long)m->prefix_hit_tokens,
            (unsigned long long)m->prefill_tokens_computed);
    fprintf(f, "scheduler      %llu preemptions (%llu swapped out), max %d concurrent, %llu steps\n",
            (unsigned long long)m->preemptions, (unsigned long long)m->swaps_out, m->max_concurrent,
            (unsigned long long)r->steps);
    if (r->n_experts)
        fprintf(f, "experts        %d, top %d: imbalance (busiest / mean tokens per expert) %.2f over the run, "
                "%.2f per step (mean)\n",
                r->n_experts, r->n_experts_used, kv_bench_expert_imbalance(r), r->expert_step_imbalance);
    if (c->spec.method != KV_SPEC_OFF)
        fprintf(f, "speculative    %s k=%d: acceptance %.1f%% (%llu of %llu drafted), mean accepted length %.2f\n",
                kv_bench_enum_name("spec.method", c->spec.method), c->spec.k, 100.0 * m->spec_acceptance_rate,
                (unsigned long long)m->spec_accepted, (unsigned long long)m->spec_drafted, m->spec_mean_accepted_len);
    kv_bench_print_failure(f, r);
    if (m->sim_device_s > 0)
        fprintf(f, "sim device     %s: %.3f s of simulated device time for %llu tokens = %.1f tok/s "
                "(the modelled GPU; host scheduling not included)\n",
                c->sim_device, m->sim_device_s, (unsigned long long)m->sim_tokens_out, m->sim_output_tokens_per_s);
    kv_bench_print_cost(f, r);
    fprintf(f, "wall time      %.2f s from the first submission (no warm-up); engine %.2f s\n", r->wall_s,
            m->elapsed_s);
}

double kv_bench_expert_imbalance(const kv_bench_result *r) {
    uint64_t sum = 0, mx = 0;
    for (int i = 0; i < r->n_experts; i++) {
        sum += r->expert_tokens[i];
        mx = KV_MAX(mx, r->expert_tokens[i]);
    }
    return sum ? (double)mx * r->n_experts / (double)sum : 0.0;
}

/* ---- the comparison ---- */

typedef enum metric_id {
    M_COMPLETED, M_REJECTED, M_OUT_TPS, M_IN_TPS, M_RPS, M_GOODPUT, M_SLA, M_TTFT50, M_TTFT90, M_TTFT99, M_TTFTM,
    M_TPOT50, M_TPOT99, M_ITL50, M_ITL99, M_E2E50, M_E2E99, M_E2EM, M_QUEUE50, M_KVUTIL, M_PREFIX_RATE,
    M_PREFIX_TOK, M_PREFILL, M_PREEMPT, M_MAXCONC, M_BLOCKS, M_BPT, M_SPEC_ACC, M_SPEC_LEN, M_SIM_TPS, M_SIM_S, M_PRE_BUSY, M_PRE_WAIT, M_XFER_GB, M_USD_H, M_USD_MTOK, M_COLD,
    M_STEPS, M_WALL,
    M_RECOMPUTED, M_CHAINS, M_LONGEST_CHAIN, M_TTFT99_SHORT, M_TTFT99_LONG, M_BATCH_CAP,
    M_COUNT
} metric_id;

enum { ONLY_SPEC = 1, ONLY_SIM = 2, ONLY_CLASSES = 4, ONLY_TPOT = 8, ONLY_POOLS = 16 };

/* A row reads its figure from the metrics summary through the one reader
 * the live --compare header uses (engine/compare.c) when sum is set (the
 * kv_cmp_metric + 1), or from the run itself. */
#define SUM(x) ((x) + 1)

static const struct {
    const char *name;
    int decimals;
    int only; /* ONLY_SPEC: shown only when a run has speculative decoding on; ONLY_SIM: a sim backend */
    int sum;  /* SUM(kv_cmp_metric): the summary's figure; 0: the run's (metric()) */
} metric_rows[M_COUNT] = {
    [M_COMPLETED] = {"requests completed", 0, 0, 0},
    [M_REJECTED] = {"requests rejected", 0, 0, 0},
    [M_OUT_TPS] = {"output tok/s", 1, 0, SUM(KV_CMP_OUT_TPS)},
    [M_IN_TPS] = {"input tok/s", 1, 0, SUM(KV_CMP_IN_TPS)},
    [M_RPS] = {"requests/s", 2, 0, SUM(KV_CMP_RPS)},
    [M_GOODPUT] = {"goodput req/s", 2, 0, SUM(KV_CMP_GOODPUT)},
    [M_SLA] = {"SLA met %", 1, 0, SUM(KV_CMP_SLA)},
    [M_TTFT50] = {"TTFT p50 ms", 1, 0, SUM(KV_CMP_TTFT50)},
    [M_TTFT90] = {"TTFT p90 ms", 1, 0, SUM(KV_CMP_TTFT90)},
    [M_TTFT99] = {"TTFT p99 ms", 1, 0, SUM(KV_CMP_TTFT99)},
    [M_TTFTM] = {"TTFT mean ms", 1, 0, SUM(KV_CMP_TTFT_MEAN)},
    [M_TPOT50] = {"TPOT p50 ms", 2, 0, SUM(KV_CMP_TPOT50)},
    [M_TPOT99] = {"TPOT p99 ms", 2, 0, SUM(KV_CMP_TPOT99)},
    [M_ITL50] = {"ITL p50 ms", 2, 0, SUM(KV_CMP_ITL50)},
    [M_ITL99] = {"ITL p99 ms", 2, 0, SUM(KV_CMP_ITL99)},
    [M_E2E50] = {"E2E p50 ms", 1, 0, SUM(KV_CMP_E2E50)},
    [M_E2E99] = {"E2E p99 ms", 1, 0, SUM(KV_CMP_E2E99)},
    [M_E2EM] = {"E2E mean ms", 1, 0, SUM(KV_CMP_E2E_MEAN)},
    [M_QUEUE50] = {"queue p50 ms", 1, 0, SUM(KV_CMP_QUEUE50)},
    [M_KVUTIL] = {"KV utilisation %", 1, 0, SUM(KV_CMP_KVUTIL)},
    [M_PREFIX_RATE] = {"prefix hit rate %", 1, 0, SUM(KV_CMP_PREFIX_RATE)},
    [M_PREFIX_TOK] = {"prefix hit tokens", 0, 0, SUM(KV_CMP_PREFIX_TOK)},
    [M_PREFILL] = {"prefill tokens", 0, 0, SUM(KV_CMP_PREFILL)},
    [M_PREEMPT] = {"preemptions", 0, 0, SUM(KV_CMP_PREEMPT)},
    [M_MAXCONC] = {"max concurrent", 0, 0, SUM(KV_CMP_MAXCONC)},
    [M_BLOCKS] = {"KV blocks", 0, 0, 0},
    [M_BPT] = {"KV bytes/token", 0, 0, 0},
    [M_SPEC_ACC] = {"spec acceptance %", 1, ONLY_SPEC, SUM(KV_CMP_SPEC_ACC)},
    [M_SPEC_LEN] = {"spec accepted len", 2, ONLY_SPEC, SUM(KV_CMP_SPEC_LEN)},
    [M_SIM_TPS] = {"sim output tok/s", 1, ONLY_SIM, SUM(KV_CMP_SIM_TPS)},
    [M_SIM_S] = {"sim device s", 3, ONLY_SIM, SUM(KV_CMP_SIM_S)},
    [M_PRE_BUSY] = {"prefill pool busy %", 1, ONLY_POOLS, 0},
    [M_PRE_WAIT] = {"prefill wait ms", 1, ONLY_POOLS, 0},
    [M_XFER_GB] = {"KV handed over GB", 2, ONLY_POOLS, 0},
    [M_USD_H] = {"$/hour (devices)", 2, ONLY_SIM, 0},
    [M_USD_MTOK] = {"$/M output tokens", 3, ONLY_SIM, 0},
    [M_COLD] = {"cold start s", 1, ONLY_SIM, 0},
    [M_STEPS] = {"engine steps", 0, 0, 0},
    [M_WALL] = {"wall s", 2, 0, 0},
    [M_RECOMPUTED] = {"tokens recomputed", 0, 0, SUM(KV_CMP_RECOMPUTED)},
    [M_CHAINS] = {"preemption cascades", 0, 0, SUM(KV_CMP_CHAINS)},
    [M_LONGEST_CHAIN] = {"longest chain", 0, 0, SUM(KV_CMP_LONGEST_CHAIN)},
    [M_TTFT99_SHORT] = {"TTFT p99 short ms", 1, ONLY_CLASSES, 0},
    [M_TTFT99_LONG] = {"TTFT p99 long ms", 1, ONLY_CLASSES, 0},
    [M_BATCH_CAP] = {"batch cap at end", 0, ONLY_TPOT, SUM(KV_CMP_BATCH_CAP)},
};

/* The value of metric k in run r; 0 when it has none. */
static int metric(const kv_bench_result *r, metric_id k, double *v) {
    *v = 0;
    int have = metric_rows[k].sum && kv_compare_metric(&r->m, (kv_cmp_metric)(metric_rows[k].sum - 1), v);
    switch (k) {
    case M_COMPLETED: *v = (double)r->completed; return 1;
    case M_REJECTED: *v = (double)r->rejected; return 1;
    case M_SLA: return have && r->completed > 0;
    case M_BLOCKS: *v = r->kv_blocks_total; return 1;
    case M_BPT: *v = (double)r->kv_bytes_per_token; return 1;
    /* a speculating run shows its figures even before its first draft */
    case M_SPEC_ACC:
    case M_SPEC_LEN: return r->cfg.spec.method != KV_SPEC_OFF;
    case M_PRE_BUSY: *v = 100.0 * r->gpu.prefill_busy_ms / (r->gpu.clock_ms > 0 ? r->gpu.clock_ms : 1.0); return r->gpu.pools;
    case M_PRE_WAIT: *v = r->gpu.prefill_wait_ms; return r->gpu.pools;
    case M_XFER_GB: *v = r->gpu.transfer_bytes / 1e9; return r->gpu.pools;
    case M_USD_H: *v = r->gpu.usd_per_hour; return r->gpu.valid && r->gpu.usd_per_hour > 0;
    case M_USD_MTOK: {
        kv_bench_cost c;
        kv_bench_cost_of(r, &c);
        *v = c.usd_per_million_output_tokens;
        return c.valid;
    }
    case M_COLD: *v = r->gpu.cold_start_s; return r->gpu.valid;
    case M_STEPS: *v = (double)r->steps; return 1;
    case M_WALL: *v = r->wall_s; return 1;
    case M_TTFT99_SHORT:
    case M_TTFT99_LONG: {
        kv_stat st;
        if (r->cfg.workload.short_fraction <= 0 ||
            kv_bench_class_ttft(r, k == M_TTFT99_SHORT ? KV_WORKLOAD_SHORT : KV_WORKLOAD_LONG, &st))
            return 0;
        *v = st.p99;
        return st.valid;
    }
    /* the controller's cap, shown for every run it sized (a cap of 0 is none) */
    case M_BATCH_CAP: *v = r->m.batch_cap; return kv_config_batch_dynamic(&r->cfg);
    default: return have;
    }
}

enum { CELL = 48 };

void kv_bench_print_compare(FILE *f, const char *profile, const char *key, const kv_bench_result *runs, int n) {
    if (n <= 0) return;
    int any = 0;
    for (int j = 0; j < n; j++) {
        if (runs[j].cfg.spec.method != KV_SPEC_OFF) any |= ONLY_SPEC;
        if (runs[j].m.sim_device_s > 0) any |= ONLY_SIM;
        if (runs[j].cfg.workload.short_fraction > 0) any |= ONLY_CLASSES;
        if (kv_config_batch_dynamic(&runs[j].cfg)) any |= ONLY_TPOT;
        if (runs[j].gpu.pools) any |= ONLY_POOLS;
    }
    char (*cells)[CELL] = calloc((size_t)M_COUNT * (size_t)n, CELL);
    int *width = calloc((size_t)n, sizeof *width);
    if (!cells || !width) {
        free(cells);
        free(width);
        fprintf(f, "kvtop bench: out of memory for the comparison table\n");
        return;
    }
    int name_w = (int)strlen(key);
    for (int k = 0; k < M_COUNT; k++)
        if ((int)strlen(metric_rows[k].name) > name_w) name_w = (int)strlen(metric_rows[k].name);
    for (int j = 0; j < n; j++) width[j] = (int)strnlen(runs[j].value, 40);
    for (int k = 0; k < M_COUNT; k++) {
        double v0;
        int ok0 = metric(&runs[0], (metric_id)k, &v0);
        for (int j = 0; j < n; j++) {
            double v;
            char *c = cells[(size_t)k * (size_t)n + (size_t)j];
            if (!metric(&runs[j], (metric_id)k, &v)) {
                snprintf(c, CELL, "N/A");
            } else if (j > 0 && ok0 && v0 != 0) {
                snprintf(c, CELL, "%.*f (%.2fx)", metric_rows[k].decimals, v, v / v0);
            } else {
                snprintf(c, CELL, "%.*f", metric_rows[k].decimals, v);
            }
            int l = (int)strlen(c);
            if (l > width[j]) width[j] = l;
        }
    }
    fprintf(f, "kvtop bench %s: %s\n", profile ? profile : "(defaults)", runs[0].model_name);
    fprintf(f, "%-*s", name_w, key);
    for (int j = 0; j < n; j++) fprintf(f, "  %*.*s", width[j], 40, runs[j].value);
    fputc('\n', f);
    for (int k = 0; k < M_COUNT; k++) {
        if (metric_rows[k].only && !(metric_rows[k].only & any)) continue;
        fprintf(f, "%-*s", name_w, metric_rows[k].name);
        for (int j = 0; j < n; j++) fprintf(f, "  %*s", width[j], cells[(size_t)k * (size_t)n + (size_t)j]);
        fputc('\n', f);
    }
    fprintf(f, "(ratios are to the first column; every run timed from its first submission, no warm-up)\n");
    free(cells);
    free(width);
}
