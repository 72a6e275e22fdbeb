/* source_metrics.c - metrics adapters: per kind a table of the metric names
 * that mean running, waiting, KV usage, token counters, latency histograms
 * and speculative counters; one scrape at a time into kv_remote_metrics
 * (counters and histograms through sliding windows, so a rate or a P99 is
 * of the last minute, not of the server's lifetime). Also the source
 * thread's side: detection from /metrics, /props and /slots, and one poll. */
#include "source_metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/vec.h"
#include "../engine/json.h"
#include "source_internal.h"

/* The counters a window keeps, by index. */
enum { C_GEN, C_PROMPT, C_PREEMPT, C_HITS, C_QUERIES, C_CACHED, C_DRAFTED, C_ACCEPTED, C_DRAFTS, C_POS0, C_COUNT = C_POS0 + 8 };
enum { H_TTFT, H_ITL, H_E2E, H_QUEUE, H_COUNT };

/* What each kind calls things; NULL: not exported. Alternatives separated
 * by '|' are tried in order (renamed metrics across versions). */
typedef struct kind_names {
    const char *running, *waiting, *kv_usage, *kv_used_tokens, *kv_total_tokens, *prefix_gauge;
    const char *counters[C_POS0]; /* C_GEN .. C_DRAFTS */
    const char *spec_pos;         /* counter with a position label */
    const char *spec_rate, *spec_len, *batch;
    const char *hist[H_COUNT];
    double hist_scale;            /* histogram unit to ms */
} kind_names;

static const kind_names VLLM = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc",
    NULL, NULL, NULL,
    {"vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_preemptions_total",
     "vllm:prefix_cache_hits_total|vllm:gpu_prefix_cache_hits_total",
     "vllm:prefix_cache_queries_total|vllm:gpu_prefix_cache_queries_total", NULL,
     "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
     "vllm:spec_decode_num_drafts_total"},
    "vllm:spec_decode_num_accepted_tokens_per_pos_total", NULL, NULL, NULL,
    {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds|vllm:time_per_output_token_seconds",
     "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"},
    1000.0};

/* Checked against sgl-project/sglang 00ae9c1 (python/sglang/srt/metrics/
 * collector.py): the prefix hit rate from cached_tokens_total over
 * prompt_tokens_total deltas (its cache_hit_rate gauge on the first scrape). */
static const kind_names SGLANG = {
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_used_tokens",
    "sglang:max_total_num_tokens", "sglang:cache_hit_rate",
    {"sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:num_retracted_requests_total",
     "sglang:cached_tokens_total", "sglang:prompt_tokens_total", NULL, NULL, NULL, NULL},
    NULL, "sglang:spec_accept_rate", "sglang:spec_accept_length", NULL,
    {"sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds|sglang:time_per_output_token_seconds",
     "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds"},
    1000.0};

static const kind_names LLAMACPP = {
    "llamacpp:requests_processing", "llamacpp:requests_deferred", NULL, NULL, NULL, NULL,
    {"llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total", NULL, "llamacpp:prompt_tokens_cached_total",
     NULL, NULL, "llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total",
     "llamacpp:spec_decode_num_drafts_total"},
    NULL, NULL, NULL, "llamacpp:n_busy_slots_per_decode",
    {NULL, NULL, NULL, NULL},
    1000.0};

/* Checked against huggingface/text-generation-inference db931fc
 * (router/src/server.rs, backends/v3/src/{backend,queue}.rs): gauges
 * tgi_batch_current_size and tgi_queue_size; histograms (seconds, 35
 * geometric buckets 0.0001 * 1.5^k, k = 1..35) tgi_request_duration, _queue_duration,
 * _mean_time_per_token_duration; token totals from the _sum of the
 * tgi_request_generated_tokens and tgi_request_input_length histograms.
 * TGI exports no TTFT, KV usage or prefix-cache metric. No TGI server was
 * run. */
static const kind_names TGI = {
    "tgi_batch_current_size", "tgi_queue_size", NULL, NULL, NULL, NULL,
    {"tgi_request_generated_tokens_sum", "tgi_request_input_length_sum", NULL, NULL, NULL, NULL, NULL, NULL, NULL},
    NULL, NULL, NULL, "tgi_batch_current_size",
    {NULL, "tgi_request_mean_time_per_token_duration", "tgi_request_duration", "tgi_request_queue_duration"},
    1000.0};

#define WIN_CAP 128

struct kv_metrics_adapter {
    kv_source_kind kind;
    const kind_names *names;
    double window_s;
    kv_prom prom;
    kv_hist_window hist[H_COUNT];
    /* counters: a ring of scrapes */
    int head, n;
    double t[WIN_CAP];
    double c[WIN_CAP][C_COUNT];
    unsigned c_have;              /* bits of the counters the newest scrape held */
};

kv_metrics_adapter *kv_metrics_adapter_new(kv_source_kind kind, double window_s) {
    const kind_names *n = kind == KV_SOURCE_VLLM       ? &VLLM
                          : kind == KV_SOURCE_SGLANG   ? &SGLANG
                          : kind == KV_SOURCE_LLAMACPP ? &LLAMACPP
                          : kind == KV_SOURCE_TGI      ? &TGI
                                                       : NULL;
    if (!n) return NULL;
    kv_metrics_adapter *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->kind = kind;
    a->names = n;
    a->window_s = window_s > 0 ? window_s : 60;
    for (int i = 0; i < H_COUNT; i++) kv_hist_window_init(&a->hist[i], a->window_s);
    return a;
}

void kv_metrics_adapter_free(kv_metrics_adapter *a) {
    if (!a) return;
    kv_prom_free(&a->prom);
    free(a);
}

/* The next '|'-separated alternative of *q into one (cap bytes); 0 at the end. */
static int next_alt(const char **q, char *one, size_t cap) {
    if (!*q || !**q) return 0;
    const char *bar = strchr(*q, '|');
    size_t n = bar ? (size_t)(bar - *q) : strlen(*q);
    snprintf(one, cap, "%.*s", (int)n, *q);
    *q += n + (bar ? 1 : 0);
    return 1;
}

/* The sum over label sets of the first alternative present in names. */
static int value_of(const kv_prom *p, const char *names, double *out) {
    char one[160];
    for (const char *q = names; next_alt(&q, one, sizeof one);) {
        int found;
        double v = kv_prom_sum(p, one, &found);
        if (found) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* The histogram of the first alternative present. */
static int hist_of(const kv_prom *p, const char *names, kv_hist *h) {
    char one[160];
    for (const char *q = names; next_alt(&q, one, sizeof one);)
        if (kv_prom_histogram(p, one, h) == 0) return 1;
    return 0;
}

/* vllm:cache_config_info's labels: block size, GPU blocks, dtype. */
static void cache_config(const kv_prom *p, kv_remote_metrics *m) {
    for (int i = 0; i < p->n; i++) {
        const kv_prom_sample *s = &p->samples[i];
        if (strcmp(s->name, "vllm:cache_config_info")) continue;
        const char *bs = kv_prom_label_of(s, "block_size"), *nb = kv_prom_label_of(s, "num_gpu_blocks");
        const char *dt = kv_prom_label_of(s, "cache_dtype");
        if (!bs || !nb) return;
        m->block_size = atoi(bs);
        m->num_blocks = atoi(nb);
        kv_copy_str(m->cache_dtype, sizeof m->cache_dtype, dt ? dt : "");
        if (m->block_size > 0 && m->num_blocks > 0) m->have |= KV_RM_CACHE_CFG;
        return;
    }
}

/* Pushes this scrape's counters; sets the rates from the window. */
static void counters(kv_metrics_adapter *a, const kv_prom *p, double t, kv_remote_metrics *m) {
    double now[C_COUNT] = {0};
    unsigned have = 0;
    for (int k = 0; k < C_POS0; k++)
        if (value_of(p, a->names->counters[k], &now[k])) have |= 1u << k;
    for (int pos = 0; a->names->spec_pos && pos < 8; pos++) {
        char v[8];
        snprintf(v, sizeof v, "%d", pos);
        int found;
        now[C_POS0 + pos] = kv_prom_sum_where(p, a->names->spec_pos, "position", v, &found);
        if (found) have |= 1u << (C_POS0 + pos);
    }
    int i = (a->head + a->n) % WIN_CAP;
    if (a->n == WIN_CAP) {
        a->head = (a->head + 1) % WIN_CAP;
        i = (a->head + a->n - 1) % WIN_CAP;
    } else {
        a->n++;
    }
    a->t[i] = t;
    memcpy(a->c[i], now, sizeof now);
    while (a->n > 2 && t - a->t[(a->head + 1) % WIN_CAP] >= a->window_s) {
        a->head = (a->head + 1) % WIN_CAP;
        a->n--;
    }
    a->c_have = have;
    if (have & (1u << C_PREEMPT)) {
        m->preempt_total = now[C_PREEMPT];
        m->have |= KV_RM_PREEMPT;
    }
    if (a->n < 2) return;
    const double *old = a->c[a->head];
    double dt = t - a->t[a->head];
    m->window_s = dt;
    if (dt <= 0) return;
    double d[C_COUNT];
    for (int k = 0; k < C_COUNT; k++) d[k] = now[k] >= old[k] ? now[k] - old[k] : now[k]; /* a restart */
    if (have & (1u << C_GEN)) {
        m->gen_tok_s = d[C_GEN] / dt;
        m->prompt_tok_s = (have & (1u << C_PROMPT)) ? d[C_PROMPT] / dt : 0;
        m->have |= KV_RM_TOKS;
    }
    if (have & (1u << C_PREEMPT)) m->preempt_per_s = d[C_PREEMPT] / dt;
    if ((have & (1u << C_HITS)) && (have & (1u << C_QUERIES)) && d[C_QUERIES] > 0) {
        m->prefix_hit_rate = d[C_HITS] / d[C_QUERIES];
        m->have |= KV_RM_PREFIX;
    } else if ((have & (1u << C_HITS)) && (have & (1u << C_PROMPT)) && d[C_HITS] + d[C_PROMPT] > 0 &&
               !(have & (1u << C_QUERIES))) {
        /* llama.cpp: prompt_tokens_total excludes the cached ones */
        m->prefix_hit_rate = d[C_HITS] / (d[C_HITS] + d[C_PROMPT]);
        m->have |= KV_RM_PREFIX;
    }
    if ((have & (1u << C_DRAFTED)) && (have & (1u << C_ACCEPTED)) && d[C_DRAFTED] > 0) {
        m->spec_accept = d[C_ACCEPTED] / d[C_DRAFTED];
        m->have |= KV_RM_SPEC;
        if ((have & (1u << C_DRAFTS)) && d[C_DRAFTS] > 0) {
            m->spec_accept_len = 1 + d[C_ACCEPTED] / d[C_DRAFTS]; /* accepted + the bonus token */
            m->have |= KV_RM_SPEC_LEN;
            for (int pos = 0; pos < 8 && (have & (1u << (C_POS0 + pos))); pos++) {
                m->spec_pos[pos] = d[C_POS0 + pos] / d[C_DRAFTS];
                m->n_spec_pos = pos + 1;
                m->have |= KV_RM_SPEC_POS;
            }
        }
    }
}

static void histograms(kv_metrics_adapter *a, const kv_prom *p, double t, kv_remote_metrics *m) {
    static const unsigned bits[H_COUNT] = {KV_RM_TTFT, KV_RM_ITL, KV_RM_E2E, KV_RM_QUEUE_TIME};
    double *out[H_COUNT] = {m->ttft_ms, m->itl_ms, m->e2e_ms, m->queue_ms};
    static const double qs[3] = {0.5, 0.9, 0.99};
    for (int k = 0; k < H_COUNT; k++) {
        kv_hist h;
        if (!hist_of(p, a->names->hist[k], &h)) continue;
        kv_hist_window_push(&a->hist[k], &h, t);
        kv_hist d;
        kv_hist_window_delta(&a->hist[k], &d);
        if (!(d.n && d.cum[d.n - 1] > 0)) continue; /* nothing observed in the window */
        for (int q = 0; q < 3; q++) out[k][q] = kv_hist_quantile(&d, qs[q]) * a->names->hist_scale;
        m->have |= bits[k];
    }
}

int kv_metrics_adapter_feed(kv_metrics_adapter *a, const char *text, size_t len, double t_s, kv_remote_metrics *m,
                            char *first_bad, size_t cap) {
    kv_err err;
    if (kv_prom_parse(text, len, &a->prom, &err)) return KV_ERR_NOMEM;
    const kv_prom *p = &a->prom;
    const kind_names *n = a->names;
    memset(m, 0, sizeof *m);
    if (value_of(p, n->running, &m->running) && value_of(p, n->waiting, &m->waiting)) m->have |= KV_RM_QUEUE;
    if (value_of(p, n->kv_usage, &m->kv_usage)) m->have |= KV_RM_KV_USAGE;
    if (value_of(p, n->kv_used_tokens, &m->kv_used_tokens) && value_of(p, n->kv_total_tokens, &m->kv_total_tokens))
        m->have |= KV_RM_KV_TOKENS;
    if (value_of(p, n->prefix_gauge, &m->prefix_hit_rate)) m->have |= KV_RM_PREFIX;
    if (value_of(p, n->spec_rate, &m->spec_accept)) m->have |= KV_RM_SPEC;
    if (value_of(p, n->spec_len, &m->spec_accept_len)) m->have |= KV_RM_SPEC_LEN;
    if (value_of(p, n->batch, &m->batch_size)) m->have |= KV_RM_BATCH;
    if (a->kind == KV_SOURCE_VLLM) {
        int f1, f2;
        m->wait_capacity = kv_prom_sum_where(p, "vllm:num_requests_waiting_by_reason", "reason", "capacity", &f1);
        m->wait_deferred = kv_prom_sum_where(p, "vllm:num_requests_waiting_by_reason", "reason", "deferred", &f2);
        if (f1 || f2) m->have |= KV_RM_WAIT_REASON;
    }
    cache_config(p, m);
    counters(a, p, t_s, m);
    histograms(a, p, t_s, m);
    if (first_bad) kv_copy_str(first_bad, cap, p->first_bad);
    return (int)KV_MIN(p->rejected, (uint64_t)1 << 30);
}

kv_source_kind kv_metrics_detect_kind(const char *text, size_t len) {
    kv_prom p = {0};
    kv_err err;
    kv_source_kind k = KV_SOURCE_AUTO;
    if (kv_prom_parse(text, len, &p, &err) == 0) {
        if (kv_prom_has_prefix(&p, "vllm:")) k = KV_SOURCE_VLLM;
        else if (kv_prom_has_prefix(&p, "sglang:")) k = KV_SOURCE_SGLANG;
        else if (kv_prom_has_prefix(&p, "llamacpp:")) k = KV_SOURCE_LLAMACPP;
        else if (kv_prom_has_prefix(&p, "tgi_")) k = KV_SOURCE_TGI;
    }
    kv_prom_free(&p);
    return k;
}

static int json_int(const kv_json *o, const char *key, int def) {
    const kv_json *v = kv_json_get(o, key);
    if (kv_json_type_of(v) == KV_JSON_BOOL) return kv_json_bool(v);
    if (kv_json_type_of(v) != KV_JSON_NUMBER) return def;
    double d = kv_json_number(v);
    return d < -2e9 ? -2000000000 : d > 2e9 ? 2000000000 : (int)d;
}

int kv_metrics_parse_slots(const char *text, size_t len, kv_source_slot *out, int cap, kv_err *err) {
    kv_err jerr;
    kv_json *j = kv_json_parse(text, len, &jerr);
    if (!j) return kv_err_set(err, KV_ERR_FORMAT, "/slots: %s", jerr.msg);
    int n = 0, rc = 0;
    if (kv_json_type_of(j) != KV_JSON_ARRAY) rc = kv_err_set(err, KV_ERR_FORMAT, "/slots: expected an array");
    for (size_t i = 0; rc == 0 && i < kv_json_len(j) && n < cap; i++) {
        const kv_json *s = kv_json_at(j, i);
        if (kv_json_type_of(s) != KV_JSON_OBJECT || kv_json_type_of(kv_json_get(s, "id")) != KV_JSON_NUMBER) {
            rc = kv_err_set(err, KV_ERR_FORMAT, "/slots[%zu]: expected an object with a numeric id", i);
            break;
        }
        kv_source_slot *o = &out[n++];
        memset(o, 0, sizeof *o);
        o->id = json_int(s, "id", -1);
        o->busy = json_int(s, "is_processing", 0) != 0;
        o->task = json_int(s, "id_task", -1);
        o->n_ctx = json_int(s, "n_ctx", 0);
        o->speculative = json_int(s, "speculative", 0) != 0;
        const kv_json *nt = kv_json_at(kv_json_get(s, "next_token"), 0);
        o->n_decoded = json_int(nt, "n_decoded", 0);
        o->n_remaining = json_int(nt, "n_remain", -1);
    }
    kv_json_free(j);
    return rc ? rc : n;
}

double kv_metrics_slots_rate(const kv_source_slot *prev, int n_prev, const kv_source_slot *cur, int n_cur, double dt_s) {
    if (dt_s <= 0) return 0;
    double tokens = 0;
    for (int i = 0; i < n_cur; i++) {
        const kv_source_slot *c = &cur[i];
        if (!c->busy || c->n_decoded <= 0) continue;
        int before = 0;
        for (int k = 0; k < n_prev; k++)
            if (prev[k].id == c->id && prev[k].task == c->task && prev[k].n_decoded <= c->n_decoded) before = prev[k].n_decoded;
        tokens += c->n_decoded - before;
    }
    return tokens / dt_s;
}

static void stat3(kv_stat *s, const double *v) {
    s->valid = 1;
    s->p50 = v[0];
    s->p90 = v[1];
    s->p99 = v[2];
    s->mean = v[0];
    s->max = v[2];
}

void kv_metrics_to_snapshot(const kv_remote_metrics *m, kv_snapshot *s) {
    kv_metrics_summary *o = &s->metrics;
    memset(o, 0, sizeof *o);
    if (m->have & KV_RM_TTFT) stat3(&o->ttft_ms, m->ttft_ms);
    if (m->have & KV_RM_ITL) {
        stat3(&o->tpot_ms, m->itl_ms);
        stat3(&o->itl_ms, m->itl_ms);
    }
    if (m->have & KV_RM_E2E) stat3(&o->e2e_ms, m->e2e_ms);
    if (m->have & KV_RM_QUEUE_TIME) stat3(&o->queue_ms, m->queue_ms);
    o->output_tokens_per_s = m->gen_tok_s;
    o->input_tokens_per_s = m->prompt_tok_s;
    o->prefix_hit_rate = m->prefix_hit_rate;
    o->preemptions = (uint64_t)(m->preempt_total > 0 ? m->preempt_total : 0);
    o->spec_acceptance_rate = m->spec_accept;
    o->spec_mean_accepted_len = m->spec_accept_len;
    o->elapsed_s = m->window_s;
    if (m->have & KV_RM_CACHE_CFG) s->block_size = m->block_size;
    /* KV in use as block counts (no per-block map: blocks stays empty), so
     * a recording keeps it: vLLM's usage fraction of its blocks, SGLang's
     * token pool (one token a block, as its default page size) */
    s->n_blocks = 0;
    s->blocks_used = s->blocks_free = 0;
    if ((m->have & KV_RM_KV_USAGE) && (m->have & KV_RM_CACHE_CFG) && m->num_blocks > 0) {
        double u = m->kv_usage < 0 ? 0 : m->kv_usage > 1 ? 1 : m->kv_usage;
        s->blocks_used = (int)lround(u * m->num_blocks);
        s->blocks_free = m->num_blocks - s->blocks_used;
    } else if ((m->have & KV_RM_KV_TOKENS) && m->kv_total_tokens > 0 && m->kv_total_tokens < 2e9) {
        s->block_size = 1;
        s->blocks_used = (int)KV_MIN(m->kv_used_tokens, m->kv_total_tokens);
        s->blocks_free = (int)m->kv_total_tokens - s->blocks_used;
    }
}

int kv_metrics_slots_to_snapshot(const kv_source_slot *slots, int n, kv_snapshot *s) {
    int busy = 0;
    for (int i = 0; i < n; i++) busy += slots[i].busy != 0;
    s->n_requests = s->n_running = s->n_waiting = s->n_swapped = 0;
    int64_t **qs[3] = {&s->running, &s->waiting, &s->swapped};
    int cap = s->cap_queue;
    for (int q = 0; q < 3; q++) {
        cap = s->cap_queue;
        if (kv_grow((void **)qs[q], &cap, busy, sizeof(int64_t))) return KV_ERR_NOMEM;
    }
    s->cap_queue = cap;
    if (kv_grow((void **)&s->requests, &s->cap_requests, busy, sizeof *s->requests)) return KV_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        const kv_source_slot *q = &slots[i];
        if (!q->busy) continue;
        kv_snap_request *r = &s->requests[s->n_requests++];
        memset(r, 0, sizeof *r);
        r->id = q->task >= 0 ? q->task : q->id;
        r->session = -1;
        r->state = KV_REQ_RUNNING;
        r->n_generated = q->n_decoded;
        r->max_tokens = q->n_remaining >= 0 ? q->n_decoded + q->n_remaining : 0;
        r->next_block = -1;
        r->ttft_ms = r->e2e_ms = -1;
        r->spec_k = q->speculative ? 1 : 0;
        snprintf(r->wait_reason, sizeof r->wait_reason, "slot %d of %d ctx", q->id, q->n_ctx);
        s->running[s->n_running++] = r->id;
    }
    return 0;
}

/* ---- the source thread's side (source_internal.h) ---- */

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fetch(kv_source *s, const char *path, kv_http_resp *r, kv_err *err) {
    char url[700];
    if (kv_http_join(url, sizeof url, s->url, path)) return kv_err_set(err, KV_ERR_RANGE, "URL too long");
    kv_http_opts o = source_opts(s);
    source_count_request(s);
    int rc = kv_http_request(url, NULL, 0, &o, r, err);
    if (rc == 0 && r->status != 200) {
        rc = kv_err_set(err, KV_ERR_IO, "%s: HTTP %ld", url, r->status);
        kv_http_resp_free(r);
    }
    return rc;
}

kv_source_kind source_metrics_detect(kv_source *s) {
    kv_http_resp r;
    kv_err err;
    kv_source_kind k = KV_SOURCE_AUTO;
    if (fetch(s, "/metrics", &r, &err) == 0) {
        k = kv_metrics_detect_kind(r.body, r.len);
        kv_http_resp_free(&r);
    }
    /* llama-server without --metrics still answers /props */
    if (k == KV_SOURCE_AUTO && fetch(s, "/props", &r, &err) == 0) {
        if (strstr(r.body, "\"default_generation_settings\"") || strstr(r.body, "\"total_slots\""))
            k = KV_SOURCE_LLAMACPP;
        kv_http_resp_free(&r);
    }
    return k;
}

int source_metrics_poll(kv_source *s) {
    kv_metrics_adapter *a = s->adapter;
    if (!a) {
        a = s->adapter = kv_metrics_adapter_new(s->st.kind, 60);
        if (!a) {
            source_set_error(s, "out of memory");
            return KV_ERR_NOMEM;
        }
    }
    kv_http_resp r;
    kv_err err;
    kv_remote_metrics m;
    memset(&m, 0, sizeof m);
    int rc = fetch(s, "/metrics", &r, &err);
    char bad[200] = "";
    int rejected = 0;
    if (rc == 0) {
        rejected = kv_metrics_adapter_feed(a, r.body, r.len, mono_s(), &m, bad, sizeof bad);
        kv_http_resp_free(&r);
        if (rejected < 0) rc = kv_err_set(&err, KV_ERR_NOMEM, "out of memory");
    }
    kv_source_slot slots[KV_SOURCE_MAX_SLOTS];
    int n_slots = 0;
    if (s->st.kind == KV_SOURCE_LLAMACPP) {
        kv_http_resp sr;
        kv_err serr;
        /* /slots answers without --metrics too: queues then come from it */
        if (fetch(s, "/slots", &sr, &serr) == 0) {
            n_slots = kv_metrics_parse_slots(sr.body, sr.len, slots, KV_SOURCE_MAX_SLOTS, &serr);
            kv_http_resp_free(&sr);
            if (n_slots < 0) {
                source_reject(s, 1, serr.msg);
                n_slots = 0;
            } else {
                m.have |= KV_RM_SLOTS;
                /* live decode rate from the slots (the counters lag: they move at request end) */
                double now = mono_s();
                double rate = s->slots_t > 0 ? kv_metrics_slots_rate(s->st.slots, s->st.n_slots, slots, n_slots,
                                                                     now - s->slots_t)
                                             : 0;
                s->slots_t = now;
                if (rate > 0 || !(m.have & KV_RM_TOKS)) {
                    m.gen_tok_s = rate;
                    m.have |= KV_RM_TOKS;
                }
                if (rc) { /* no /metrics: busy slots are the running ones */
                    m.running = 0;
                    for (int i = 0; i < n_slots; i++) m.running += slots[i].busy;
                    rc = 0;
                }
            }
        }
    }
    if (rc) {
        source_set_error(s, err.msg);
        return rc;
    }
    if (rejected > 0) source_reject(s, (uint64_t)rejected, bad);
    kv_metrics_to_snapshot(&m, s->cur);
    if (kv_metrics_slots_to_snapshot(slots, n_slots, s->cur)) source_reject(s, 0, "out of memory for the slot rows");
    s->cur->step = s->st.frames + 1; /* a scrape counts as a step: F7 records each one */
    kv_copy_str(s->cur->model_name, sizeof s->cur->model_name, s->st.model);
    pthread_mutex_lock(&s->mu);
    s->st.m = m;
    s->st.n_slots = n_slots;
    if (n_slots) memcpy(s->st.slots, slots, (size_t)n_slots * sizeof slots[0]);
    pthread_mutex_unlock(&s->mu);
    source_publish(s);
    return 0;
}

void source_metrics_free(kv_source *s) {
    kv_metrics_adapter_free(s->adapter);
    s->adapter = NULL;
}
