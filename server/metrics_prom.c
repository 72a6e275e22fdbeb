/* metrics_prom.c - Prometheus text for /metrics. Each family is written
 * with its HELP and TYPE lines; every sample carries model_name, as vLLM's
 * do. Gauges come from the snapshot taken for this scrape; counters and
 * histograms from the server's own monotonic statistics (the engine's
 * metrics window may be reset by a front end, a counter must not be). */
#include "metrics_prom.h"

#include <string.h>

typedef struct pw {
    FILE *f;
    const char *prefix; /* "kvtop" / "vllm" for vLLM's names */
    char model[600];    /* the escaped model_name label value */
} pw;

/* Label value escaping: backslash, double quote and newline. */
static void escape_label(char *out, size_t cap, const char *s) {
    size_t w = 0;
    for (; s && *s && w + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            out[w++] = '\\';
            out[w++] = *s;
        } else if (*s == '\n') {
            out[w++] = '\\';
            out[w++] = 'n';
        } else {
            out[w++] = *s;
        }
    }
    out[w] = 0;
}

static void head(pw *p, const char *pre, const char *name, const char *type, const char *help) {
    fprintf(p->f, "# HELP %s:%s %s\n# TYPE %s:%s %s\n", pre, name, help, pre, name, type);
}

/* One sample; extra: more labels ("finished_reason=\"stop\"") or NULL. */
static void sample(pw *p, const char *pre, const char *name, const char *extra, double v) {
    fprintf(p->f, "%s:%s{model_name=\"%s\"%s%s} %.17g\n", pre, name, p->model, extra ? "," : "", extra ? extra : "", v);
}

static void gauge(pw *p, const char *pre, const char *name, const char *help, double v) {
    head(p, pre, name, "gauge", help);
    sample(p, pre, name, NULL, v);
}

static void counter(pw *p, const char *pre, const char *name, const char *help, double v) {
    head(p, pre, name, "counter", help);
    sample(p, pre, name, NULL, v);
}

static void histogram(pw *p, const char *pre, const char *name, const char *help, const srv_hist *h) {
    head(p, pre, name, "histogram", help);
    uint64_t cum = 0;
    char lab[64];
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        snprintf(lab, sizeof lab, "le=\"%.10g\"", h->bounds[i]);
        fprintf(p->f, "%s:%s_bucket{model_name=\"%s\",%s} %llu\n", pre, name, p->model, lab, (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    fprintf(p->f, "%s:%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", pre, name, p->model, (unsigned long long)cum);
    fprintf(p->f, "%s:%s_sum{model_name=\"%s\"} %.17g\n", pre, name, p->model, h->sum);
    fprintf(p->f, "%s:%s_count{model_name=\"%s\"} %llu\n", pre, name, p->model, (unsigned long long)h->count);
}

/* vLLM's families, under p->prefix. */
static void write_vllm(pw *p, const kv_snapshot *s, const srv_stats *st) {
    const char *v = p->prefix;
    gauge(p, v, "num_requests_running", "Number of requests in model execution batches.", s->n_running);
    gauge(p, v, "num_requests_waiting", "Number of requests waiting to be processed.", s->n_waiting);
    gauge(p, v, "num_requests_swapped", "Number of requests swapped to the host.", s->n_swapped);
    double usage = s->n_blocks > 0 ? (double)s->blocks_used / s->n_blocks : 0;
    gauge(p, v, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
    gauge(p, v, "gpu_cache_usage_perc", "KV-cache usage (the older name). 1 means 100 percent usage.", usage);
    counter(p, v, "prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
            (double)st->prefix_queries);
    counter(p, v, "prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
            (double)st->prefix_hits);
    counter(p, v, "num_preemptions_total", "Cumulative number of preemptions.", (double)st->preemptions);
    counter(p, v, "prompt_tokens_total", "Number of prefill tokens processed.", (double)st->prompt_tokens);
    counter(p, v, "generation_tokens_total", "Number of generation tokens processed.", (double)st->generation_tokens);
    head(p, v, "request_success_total", "counter", "Count of finished requests by finish reason.");
    static const char *const reasons[SRV_FIN_COUNT] = {"stop", "length", "abort", "error"};
    for (int i = 0; i < SRV_FIN_COUNT; i++) {
        char lab[64];
        snprintf(lab, sizeof lab, "finished_reason=\"%s\"", reasons[i]);
        sample(p, v, "request_success_total", lab, (double)st->finished[i]);
    }
    histogram(p, v, "time_to_first_token_seconds", "Histogram of time to first token in seconds.", &st->ttft);
    histogram(p, v, "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &st->itl);
    histogram(p, v, "time_per_output_token_seconds", "Histogram of time per output token in seconds.", &st->tpot);
    histogram(p, v, "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", &st->e2e);
    histogram(p, v, "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
              &st->queue);
    histogram(p, v, "request_prompt_tokens", "Number of prefill tokens processed.", &st->prompt_len);
    histogram(p, v, "request_generation_tokens", "Number of generation tokens processed.", &st->gen_len);
    const kv_metrics_summary *m = &s->metrics;
    counter(p, v, "spec_decode_num_drafts_total", "Number of spec decoding drafts.", (double)m->spec_drafts);
    counter(p, v, "spec_decode_num_draft_tokens_total", "Number of draft tokens.", (double)m->spec_drafted);
    counter(p, v, "spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", (double)m->spec_accepted);
    head(p, v, "spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
    int npos = (int)KV_ARRAY_LEN(m->spec_pos_accepted);
    int k = s->spec_method != KV_SPEC_OFF ? npos : 0;
    while (k > 1 && m->spec_pos_drafted[k - 1] == 0) k--;
    for (int i = 0; i < k; i++) {
        char lab[32];
        snprintf(lab, sizeof lab, "position=\"%d\"", i);
        sample(p, v, "spec_decode_num_accepted_tokens_per_pos_total", lab, (double)m->spec_pos_accepted[i]);
    }
    head(p, v, "cache_config_info", "gauge", "Information of the KV cache configuration.");
    char lab[160];
    snprintf(lab, sizeof lab, "block_size=\"%d\",num_gpu_blocks=\"%d\",cache_dtype=\"%s\"", s->block_size, s->n_blocks,
             kv_cache_dtype_name(s->kv_dtype));
    sample(p, v, "cache_config_info", lab, 1);
}

/* kvtop's own families, always under kvtop:. */
static void write_kvtop(pw *p, const kv_snapshot *s, const srv_stats *st) {
    const char *k = "kvtop";
    head(p, k, "kv_blocks", "gauge", "KV cache blocks by state (shared: used by two or more requests).");
    sample(p, k, "kv_blocks", "state=\"used\"", s->blocks_used);
    sample(p, k, "kv_blocks", "state=\"shared\"", s->blocks_shared);
    sample(p, k, "kv_blocks", "state=\"cached\"", s->blocks_cached);
    sample(p, k, "kv_blocks", "state=\"free\"", s->blocks_free);
    gauge(p, k, "kv_blocks_total", "KV cache blocks in the pool.", s->n_blocks);
    head(p, k, "kv_swap_bytes", "gauge", "Host swap pool for preempted requests.");
    sample(p, k, "kv_swap_bytes", "state=\"used\"", (double)s->mem.kv_swap_used);
    sample(p, k, "kv_swap_bytes", "state=\"total\"", (double)s->mem.kv_swap_total);
    head(p, k, "memory_bytes", "gauge", "Memory breakdown of the engine.");
    sample(p, k, "memory_bytes", "kind=\"weights\"", (double)s->mem.weights);
    sample(p, k, "memory_bytes", "kind=\"weights_prepared\"", (double)s->mem.weights_prepared);
    sample(p, k, "memory_bytes", "kind=\"kv_used\"", (double)s->mem.kv_used);
    sample(p, k, "memory_bytes", "kind=\"kv_cached\"", (double)s->mem.kv_cached);
    sample(p, k, "memory_bytes", "kind=\"kv_free\"", (double)s->mem.kv_free);
    sample(p, k, "memory_bytes", "kind=\"activations\"", (double)s->mem.activations);
    sample(p, k, "memory_bytes", "kind=\"other\"", (double)s->mem.other);
    const kv_metrics_summary *m = &s->metrics;
    gauge(p, k, "goodput_requests_per_second",
          "Completed requests per second within the profile's SLA (sla.ttft_ms and sla.tpot_ms).",
          m->goodput_requests_per_s);
    gauge(p, k, "sla_attainment", "Fraction of completed requests within the profile's SLA.", m->sla_attainment);
    gauge(p, k, "sla_ttft_seconds", "The profile's TTFT bound (0: none).", s->sla_ttft_ms / 1e3);
    gauge(p, k, "sla_tpot_seconds", "The profile's TPOT bound (0: none).", s->sla_tpot_ms / 1e3);
    gauge(p, k, "output_tokens_per_second", "Output tokens per second over the engine's metrics window.",
          m->output_tokens_per_s);
    counter(p, k, "engine_steps_total", "Engine iterations run.", (double)s->step);
    gauge(p, k, "engine_paused", "1 while the engine is paused.", s->paused);
    counter(p, k, "prefix_cache_evictions_total", "Cached prefix blocks evicted.", (double)s->evictions);
    counter(p, k, "kv_cow_copies_total", "Shared blocks copied before a write.", (double)s->cow_copies);
    head(p, k, "server_requests_refused_total", "counter", "Requests the server refused, by reason.");
    sample(p, k, "server_requests_refused_total", "reason=\"queue_full\"", (double)st->queue_full);
    sample(p, k, "server_requests_refused_total", "reason=\"engine\"", (double)st->rejected);
    counter(p, k, "server_disconnects_total", "Requests cancelled because their client disconnected.",
            (double)st->disconnects);
    head(p, k, "server_http_responses_total", "counter", "HTTP responses by status class.");
    for (int i = 1; i <= 5; i++) {
        char lab[32];
        snprintf(lab, sizeof lab, "code=\"%dxx\"", i);
        sample(p, k, "server_http_responses_total", lab, (double)st->http[i]);
    }
}

int srv_metrics_write(FILE *f, const char *prefix, const char *model, const kv_snapshot *s, const srv_stats *st) {
    pw p = {.f = f, .prefix = prefix && !strcmp(prefix, "vllm") ? "vllm" : "kvtop"};
    escape_label(p.model, sizeof p.model, model);
    write_vllm(&p, s, st);
    write_kvtop(&p, s, st);
    fflush(f);
    return ferror(f) ? KV_ERR_IO : 0;
}
