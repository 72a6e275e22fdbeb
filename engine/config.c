/* config.c - the defaults and the key table: every setting by dotted name,
 * with its type, its place in kv_config and its allowed range. The value
 * parsing, range checks and formatting built on the table are
 * config_parse.c. profiles/ feeds YAML and --set text through this table;
 * nothing here knows YAML. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Enum keys are read and written through an int. */
_Static_assert(sizeof(kv_layout) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_policy) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_preempt) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_spec_method) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_arrival) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_cache_dtype) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_dist_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_admission) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_victim) == sizeof(int), "enum size");
_Static_assert(sizeof(kv_order) == sizeof(int), "enum size");

#define KIB 1024.0
#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)
#define TIB (1024.0 * GIB)
#define TOKENS_MAX 1048576.0 /* 1M tokens: upper bound of every length */

/* NOTE: the KV dtype names repeat kernels/kv_dtype.c's (kv_cache_dtype_name)
 * so the table stays plain static data for --help and dumps; parsing goes
 * through kv_cache_dtype_from_name (which also takes "fp8" and any case),
 * and the profile tests check that both agree. */
static const char *const dtype_names[] = {"f32", "f16", "int8", "int8_asym", "fp8_e4m3", "fp8_e5m2", NULL};
_Static_assert(KV_ARRAY_LEN(dtype_names) == KV_CACHE_DTYPE_COUNT + 1, "dtype names");
static const char *const layout_names[] = {"paged", "contiguous", NULL};
static const char *const policy_names[] = {"continuous", "static", NULL};
static const char *const preempt_names[] = {"recompute", "swap", NULL};
static const char *const spec_names[] = {"off", "draft_model", "self", "ngram", NULL};
static const char *const arrival_names[] = {"poisson", "burst", "closed", NULL};
static const char *const dist_names[] = {"fixed", "uniform", "lognormal", NULL};
static const char *const backend_names[] = {"cpu", "cuda", "sim", NULL};
static const char *const theme_names[] = {"auto", "mono", NULL};
static const char *const metrics_prefix_names[] = {"kvtop", "vllm", NULL};
static const char *const admission_names[] = {"greedy", "max_tokens", "quantile", NULL};
static const char *const victim_names[] = {"newest", "least_work", NULL};
static const char *const order_names[] = {"fcfs", "short_first", NULL};
static const char *const dist_fields[] = {"dist", "value", "min", "max", "mean", "sigma", NULL};

#define OFF(f) offsetof(kv_config, f)
#define FSZ(f) sizeof(((kv_config *)0)->f)
#define K_STR(p, f, fl, nm, doc) {p, KV_KEY_STRING, OFF(f), FSZ(f), 0, 0, fl, nm, doc}
#define K_INT(p, f, lo, hi, doc) {p, KV_KEY_INT, OFF(f), FSZ(f), lo, hi, 0, NULL, doc}
#define K_INT_AUTO(p, f, lo, hi, doc) {p, KV_KEY_INT, OFF(f), FSZ(f), lo, hi, KV_KEY_AUTO, NULL, doc}
#define K_U64(p, f, doc) {p, KV_KEY_U64, OFF(f), FSZ(f), 0, 18446744073709551615.0, 0, NULL, doc}
#define K_SIZE(p, f, lo, hi, doc) {p, KV_KEY_SIZE, OFF(f), FSZ(f), lo, hi, 0, NULL, doc}
#define K_DBL(p, f, lo, hi, fl, doc) {p, KV_KEY_DOUBLE, OFF(f), FSZ(f), lo, hi, fl, NULL, doc}
#define K_FLT(p, f, lo, hi, fl, doc) {p, KV_KEY_FLOAT, OFF(f), FSZ(f), lo, hi, fl, NULL, doc}
#define K_BOOL(p, f, doc) {p, KV_KEY_BOOL, OFF(f), FSZ(f), 0, 1, 0, NULL, doc}
#define K_ENUM(p, f, nm, doc) {p, KV_KEY_ENUM, OFF(f), FSZ(f), 0, 0, 0, nm, doc}
#define K_DIST(p, f, doc) {p, KV_KEY_DIST, OFF(f), FSZ(f), 1, TOKENS_MAX, 0, dist_names, doc}

/* The order here is the order of --help and of the dumped YAML; keys of one
 * section stay together. */
static const kv_config_key keys[] = {
    K_STR("model.path", model.path, KV_KEY_NONEMPTY, NULL,
          "model file: GGUF or llama2.c .bin, relative to the working directory"),
    K_STR("model.tokenizer", model.tokenizer, 0, NULL, "llama2.c tokenizer file; empty for GGUF"),
    K_STR("model.synthetic", sim.synthetic, 0, NULL,
          "sim backend: a model by its published shape, no weights (llama-3-70b, ...; kvtop keys lists them; "
          "custom = the shape keys below); empty = model.path"),
    K_STR("model.dtype", sim.dtype, KV_KEY_NONEMPTY, NULL,
          "synthetic model: weight format (fp16, bf16, fp8, int8, int4; f32, q8_0, q4_0 as GGUF stores them)"),
    K_INT("model.layers", sim.layers, 0, 1024, "synthetic model: layers; 0 = the shape's"),
    K_INT("model.dim", sim.dim, 0, 1 << 20, "synthetic model: embedding width; 0 = the shape's"),
    K_INT("model.heads", sim.heads, 0, 4096, "synthetic model: attention heads; 0 = the shape's"),
    K_INT("model.kv_heads", sim.kv_heads, 0, 4096, "synthetic model: KV heads; 0 = the shape's"),
    K_INT("model.head_dim", sim.head_dim, 0, 4096, "synthetic model: head size; 0 = the shape's"),
    K_INT("model.ffn_dim", sim.ffn_dim, 0, 1 << 22, "synthetic model: feed-forward width (per expert); 0 = the shape's"),
    K_INT("model.vocab", sim.vocab, 0, 1 << 22, "synthetic model: vocabulary; 0 = the shape's"),
    K_INT("model.context", sim.context, 0, 1 << 24, "synthetic model: context length; 0 = the shape's"),
    K_INT("model.experts", sim.experts, 0, 1024, "synthetic model: experts per MoE layer (1 = dense); 0 = the shape's"),
    K_INT("model.experts_used", sim.experts_used, 0, 1024, "synthetic model: experts per token; 0 = the shape's"),
    K_INT("threads", threads, 0, 1024, "CPU threads; 0 = all cores"),
    K_STR("backend", backend, 0, backend_names, "compute backend"),
    K_STR("sim_device", sim_device, KV_KEY_NONEMPTY, NULL, "sim backend: the GPU to model (h100, a100, ...)"),
    K_BOOL("sim_clock", sim_clock,
           "sim backend: time requests on the simulated device's clock (TTFT, TPOT, throughput as the GPU would "
           "see them); false = host wall time"),
    K_INT("sim.tp", sim.tp, 1, 64, "synthetic model: tensor-parallel devices (two all-reduces per layer)"),
    K_INT("sim.pp", sim.pp, 1, 64, "synthetic model: pipeline stages (layers split, micro-batches, a bubble)"),
    K_INT("sim.ep", sim.ep, 1, 256, "synthetic MoE model: expert-parallel devices, a multiple of sim.tp (attention data-parallel on ep/tp "
          "groups) or a divisor (each expert split tp/ep ways); the step waits for the busiest"),
    K_DBL("sim.ep_skew", sim.ep_skew, 0, 100, 0, "expert routing skew: the busiest device gets (1 + skew) x its share"),
    K_INT("sim.microbatches", sim.microbatches, 0, 1024, "pipeline micro-batches per step; 0 = sim.pp"),
    K_BOOL("sim.cuda_graphs", sim.cuda_graphs, "synthetic model: one graph launch per step instead of one per op"),
    K_DBL("sim.memory_utilization", sim.memory_utilization, 0, 1, KV_KEY_MIN_OPEN,
          "fraction of each device's memory for weights + KV + activations + reserve (vLLM's gpu_memory_utilization)"),
    K_SIZE("sim.reserve", sim.reserve, 0, TIB, "per device: the runtime's own memory (context, workspaces)"),
    K_DBL("sim.api_price_per_mtok", sim.api_price_per_mtok, 0, 1e6, 0,
          "$ per million output tokens of a hosted API: bench shows the load above which self-hosting is cheaper; 0 = none"),
    K_DBL("sim.spec_acceptance", sim.spec_acceptance, 0, 1, 0,
          "synthetic speculative decoding: probability that a drafted token is accepted"),
    K_SIZE("sim.device_memory", sim.device_memory, 0, 64 * TIB, "extend the device table: memory per device; 0 = sim_device's"),
    K_DBL("sim.device_bandwidth", sim.device_bandwidth, 0, 1e6, 0, "memory bandwidth in GB/s; 0 = sim_device's"),
    K_DBL("sim.device_tflops", sim.device_tflops, 0, 1e6, 0, "dense BF16 TFLOP/s; 0 = sim_device's"),
    K_DBL("sim.device_usd_per_hour", sim.device_usd_per_hour, 0, 1e6, 0, "$ per device-hour; 0 = sim_device's"),
    K_DBL("sim.storage_bandwidth", sim.storage_bandwidth, 0, 1e6, KV_KEY_MIN_OPEN,
          "GB/s the weights load from at a cold start (NVMe, network storage)"),
    K_BOOL("sim.disaggregated", sim.disaggregated, "separate prefill and decode pools, KV sent between them"),
    K_INT("sim.prefill_devices", sim.prefill_devices, 0, 64,
          "disaggregated: groups of sim.tp devices in the prefill pool (the decode pool is one more); 0 = 1"),
    K_BOOL("sim.host_logits", sim.host_logits,
           "synthetic model: copy every step's logits to the host as the CPU-computed sim does (false: the device "
           "samples and only ids come back)"),

    K_INT("kv.block_size", kv.block_size, 1, 1024, "tokens per KV block"),
    K_SIZE("kv.memory", kv.memory, 0, TIB, "KV cache budget (bytes, or 256MiB, 1GiB, ...); 0 = use kv.blocks"),
    K_INT("kv.blocks", kv.blocks, 0, 16777216, "KV blocks; 0 = derive from memory.budget or kv.memory"),
    K_ENUM("kv.dtype", kv.dtype, dtype_names, "KV element format (int8/fp8 keep per-row scales)"),
    K_BOOL("kv.prefix_sharing", kv.prefix_sharing, "share identical prompt prefixes between requests"),
    K_ENUM("kv.layout", kv.layout, layout_names,
           "paged: blocks on demand; contiguous: reserve max_seq_len per request"),
    K_SIZE("kv.swap_memory", kv.swap_memory, 0, TIB, "host swap pool for preempted requests; 0 = none"),
    K_BOOL("kv.window_release", kv.window_release,
           "sliding-window layers release the K/V of blocks wholly before every holder's window"),

    K_SIZE("memory.budget", memory.budget, 0, TIB,
           "total for weights + activations + KV cache; the KV cache gets the rest (overrides kv.memory); 0 = off"),

    K_ENUM("scheduler.policy", scheduler.policy, policy_names,
           "continuous: admit at every step; static: run each batch to completion"),
    K_INT_AUTO("scheduler.max_seqs", scheduler.max_seqs, 1, 4096,
               "sequences per batch; auto: as many as hold the TPOT target (scheduler.target_tpot_ms, else "
               "sla.tpot_ms, else twice the fitted fixed step cost), up to 256"),
    K_INT("scheduler.max_batched_tokens", scheduler.max_batched_tokens, 1, 1048576, "tokens per forward step"),
    K_INT("scheduler.prefill_chunk", scheduler.prefill_chunk, 1, 1048576,
          "prompt tokens per prefill chunk (the step budget caps it further)"),
    K_ENUM("scheduler.preemption", scheduler.preemption, preempt_names,
           "what happens to a request whose KV blocks are taken back"),
    K_DBL("scheduler.max_wait_ms", scheduler.max_wait_ms, 0, 1e9, 0,
          "starvation guard: a request waiting longer goes first"),
    K_INT("scheduler.max_seq_len", scheduler.max_seq_len, 0, 1048576,
          "prompt + output tokens per request; 0 = the model's context length"),
    K_DBL("scheduler.watermark", scheduler.watermark, 0, 0.9, 0,
          "fraction of KV blocks admission leaves free for running requests to grow (vLLM's watermark)"),
    K_ENUM("scheduler.admission", scheduler.admission, admission_names,
           "greedy: prompt blocks only; max_tokens: reserve prompt + max_tokens; quantile: prompt + a quantile "
           "of finished output lengths"),
    K_DBL("scheduler.admission_quantile", scheduler.admission_quantile, 0, 1, KV_KEY_MIN_OPEN,
          "admission quantile: the output-length quantile reserved (0.9 = P90)"),
    K_ENUM("scheduler.preempt_victim", scheduler.preempt_victim, victim_names,
           "newest: the latest arrival; least_work: the fewest computed tokens (least recompute)"),
    K_ENUM("scheduler.order", scheduler.order, order_names,
           "fcfs: arrival order; short_first: shortest prompt + max_tokens first (within a priority)"),
    K_DBL("scheduler.target_tpot_ms", scheduler.target_tpot_ms, 0, 1e6, 0,
          "> 0: size the running batch from measured step times to hold this TPOT (max_seqs caps it); 0 = off"),

    K_FLT("sampling.temperature", sampling.temperature, 0, 100, 0, "0 = greedy"),
    K_INT("sampling.top_k", sampling.top_k, 0, 1048576, "0 = off"),
    K_FLT("sampling.top_p", sampling.top_p, 0, 1, KV_KEY_MIN_OPEN, "nucleus sampling; 1 = off"),
    K_FLT("sampling.min_p", sampling.min_p, 0, 1, KV_KEY_MAX_OPEN, "drop tokens below min_p * p(best); 0 = off"),
    /* the upper bound is kv_sampling_validate's: a request the engine refuses is no valid setting */
    K_FLT("sampling.repeat_penalty", sampling.repeat_penalty, 0, 10, KV_KEY_MIN_OPEN, "1 = off"),
    K_INT("sampling.repeat_last_n", sampling.repeat_last_n, 0, 1048576, "tokens the repeat penalty looks back over"),
    K_U64("sampling.seed", sampling.seed, "sampler seed (every value, 0 included, is a fixed seed)"),

    K_ENUM("spec.method", spec.method, spec_names, "speculative decoding: where drafts come from"),
    K_INT("spec.k", spec.k, 1, 32, "tokens drafted per step"),
    K_INT("spec.draft_layers", spec.draft_layers, 1, 1024, "self: target layers the draft runs"),
    K_STR("spec.draft_model", spec.draft_model, 0, NULL, "draft_model: model file with the target's vocabulary"),
    K_FLT("spec.min_acceptance", spec.min_acceptance, 0, 1, 0, "below this acceptance rate: plain decoding for a while"),
    K_BOOL("spec.adaptive", spec.adaptive, "k follows the recent acceptance rate"),
    K_INT("spec.ngram_n", spec.ngram_n, 1, 16, "ngram: tokens matched in the prompt"),

    K_DBL("sla.ttft_ms", sla.ttft_ms, 0, 1e9, 0, "time to first token bound for goodput; 0 = none"),
    K_DBL("sla.tpot_ms", sla.tpot_ms, 0, 1e9, 0, "time per output token bound for goodput; 0 = none"),

    K_INT("workload.requests", workload.requests, 0, 1000000, "requests in the synthetic workload"),
    K_ENUM("workload.arrival", workload.arrival, arrival_names,
           "poisson: at workload.rate; burst: all at t = 0; closed: workload.concurrency in flight"),
    K_DBL("workload.rate", workload.rate, 0, 1e6, 0, "poisson: mean requests per second"),
    K_INT("workload.concurrency", workload.concurrency, 1, 4096, "closed: requests in flight"),
    K_DIST("workload.prompt_len", workload.prompt_len, "prompt tokens per request (after the system prompt)"),
    K_DIST("workload.output_len", workload.output_len, "output tokens per request"),
    K_INT("workload.system_prompt_len", workload.system_prompt_len, 0, 1048576,
          "tokens of a shared system prompt put before the prompt; 0 = none"),
    K_DBL("workload.system_prompt_fraction", workload.system_prompt_fraction, 0, 1, 0,
          "fraction of requests that start with the system prompt"),
    K_STR("workload.prompts_file", workload.prompts_file, 0, NULL,
          "JSONL file of {\"prompt\": ...} lines used instead of synthetic text"),
    K_U64("workload.seed", workload.seed, "workload seed: same seed, same requests"),
    K_BOOL("workload.ignore_eos", workload.ignore_eos, "generate exactly output_len tokens"),
    K_INT("workload.sessions", workload.sessions, 0, 256, "TUI: background sessions the load key injects"),
    K_DBL("workload.short_fraction", workload.short_fraction, 0, 1, 0,
          "fraction of requests in the short class (own lengths and priority); 0 = one class"),
    K_DIST("workload.short_prompt_len", workload.short_prompt_len, "short class: prompt tokens per request"),
    K_DIST("workload.short_output_len", workload.short_output_len, "short class: output tokens per request"),
    K_INT("workload.short_priority", workload.short_priority, -1000, 1000,
          "short class: request priority (the other class has 0; higher runs first)"),

    K_INT("ui.fps", ui.fps, 1, 120, "frames per second"),
    K_STR("ui.theme", ui.theme, 0, theme_names, "colours"),
    K_INT("ui.step_delay_ms", ui.step_delay_ms, 0, 60000, "slow motion: pause after each engine step"),
    K_BOOL("ui.show_token_source", ui.show_token_source, "colour tokens by how they were produced"),

    K_STR("server.host", server.host, KV_KEY_NONEMPTY, NULL, "kvtop serve: listen address (127.0.0.1, ::1, 0.0.0.0)"),
    K_INT("server.port", server.port, 0, 65535, "kvtop serve: TCP port; 0 = any free port"),
    K_STR("server.api_key", server.api_key, KV_KEY_SECRET, NULL,
          "kvtop serve: Bearer key the API needs; empty = none (KVTOP_API_KEY, --api-key override)"),
    K_INT("server.max_connections", server.max_connections, 1, 65536, "kvtop serve: open connections at once"),
    K_SIZE("server.max_body", server.max_body, 1024, GIB, "kvtop serve: request body bytes; larger gets 413"),
    K_INT("server.max_queue", server.max_queue, 0, 1048576,
          "kvtop serve: requests left waiting in the engine (beyond its free batch slots) at most; more get 429"),
    K_INT("server.header_timeout_ms", server.header_timeout_ms, 100, 3600000,
          "kvtop serve: a request's headers must arrive within this; slower clients are dropped"),
    K_INT("server.idle_timeout_ms", server.idle_timeout_ms, 100, 3600000,
          "kvtop serve: a connection silent this long is closed"),
    K_STR("server.metrics_prefix", server.metrics_prefix, 0, metrics_prefix_names,
          "kvtop serve: /metrics names kvtop:... or vllm:... (for vLLM dashboards)"),
    K_BOOL("server.auth_health", server.auth_health, "kvtop serve: /health needs the API key too"),
    K_BOOL("server.auth_metrics", server.auth_metrics, "kvtop serve: /metrics needs the API key too"),
    K_INT("server.shutdown_grace_ms", server.shutdown_grace_ms, 0, 3600000,
          "kvtop serve: on SIGINT/SIGTERM, in-flight requests get this long to finish before they are cancelled"),
};

int kv_config_max_seqs(const kv_config *c) {
    int s = c->scheduler.max_seqs, t = c->scheduler.max_batched_tokens;
    if (s != KV_KEY_AUTO_VALUE) return s;
    return t > 0 && t < KV_MAX_SEQS_AUTO_CEIL ? t : KV_MAX_SEQS_AUTO_CEIL;
}

int kv_config_batch_dynamic(const kv_config *c) {
    return c->scheduler.target_tpot_ms > 0 || c->scheduler.max_seqs == KV_KEY_AUTO_VALUE;
}

void kv_config_default(kv_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model.path, sizeof c->model.path, "%s", "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    c->threads = 0;
    snprintf(c->backend, sizeof c->backend, "%s", "cpu");
    snprintf(c->sim_device, sizeof c->sim_device, "%s", "h100");
    c->sim_clock = 1;

    c->kv.block_size = 16;
    c->kv.memory = 256ull << 20;
    c->kv.blocks = 0;
    c->kv.dtype = KV_CACHE_F16;
    c->kv.prefix_sharing = 1;
    c->kv.layout = KV_LAYOUT_PAGED;
    c->kv.swap_memory = 0;
    c->kv.window_release = 1;

    c->scheduler.policy = KV_POLICY_CONTINUOUS;
    c->scheduler.max_seqs = 64;
    c->scheduler.max_batched_tokens = 512;
    c->scheduler.prefill_chunk = 256;
    c->scheduler.preemption = KV_PREEMPT_RECOMPUTE;
    c->scheduler.max_wait_ms = 5000;
    c->scheduler.max_seq_len = 0;
    c->scheduler.watermark = 0.01;
    c->scheduler.admission = KV_ADMIT_GREEDY;
    c->scheduler.admission_quantile = 0.9;
    c->scheduler.preempt_victim = KV_VICTIM_NEWEST;
    c->scheduler.order = KV_ORDER_FCFS;
    c->scheduler.target_tpot_ms = 0;

    c->sampling.temperature = 0.7f;
    c->sampling.top_k = 40;
    c->sampling.top_p = 0.95f;
    c->sampling.min_p = 0.05f;
    c->sampling.repeat_penalty = 1.0f;
    c->sampling.repeat_last_n = 64;
    c->sampling.seed = 0; /* a real seed, not "use the clock": runs repeat */

    c->spec.method = KV_SPEC_OFF;
    c->spec.k = 4;
    c->spec.draft_layers = 2;
    c->spec.min_acceptance = 0.4f;
    c->spec.adaptive = 1;
    c->spec.ngram_n = 3;

    snprintf(c->sim.dtype, sizeof c->sim.dtype, "%s", "fp16");
    c->sim.tp = c->sim.pp = c->sim.ep = 1;
    c->sim.memory_utilization = 0.9;
    c->sim.reserve = 1ull << 30;
    c->sim.spec_acceptance = 0.7;
    c->sim.storage_bandwidth = 2.0;

    c->sla.ttft_ms = 2000;
    c->sla.tpot_ms = 100;

    c->workload.requests = 32;
    c->workload.arrival = KV_ARRIVAL_POISSON;
    c->workload.rate = 4;
    c->workload.concurrency = 8;
    c->workload.prompt_len = (kv_dist){.kind = KV_DIST_LOGNORMAL, .value = 128, .min = 8, .max = 1024,
                                       .mean = 128, .sigma = 0.5};
    c->workload.output_len = (kv_dist){.kind = KV_DIST_LOGNORMAL, .value = 128, .min = 8, .max = 512,
                                       .mean = 128, .sigma = 0.6};
    c->workload.system_prompt_len = 0;
    c->workload.system_prompt_fraction = 1.0;
    c->workload.seed = 1;
    c->workload.ignore_eos = 0;
    c->workload.sessions = 4;
    c->workload.short_fraction = 0;
    c->workload.short_prompt_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 16, .min = 16, .max = 16, .mean = 16};
    c->workload.short_output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 16, .min = 16, .max = 16, .mean = 16};
    c->workload.short_priority = 0;

    c->ui.fps = 10;
    snprintf(c->ui.theme, sizeof c->ui.theme, "%s", "auto");
    c->ui.step_delay_ms = 0;
    c->ui.show_token_source = 1;

    snprintf(c->server.host, sizeof c->server.host, "%s", "127.0.0.1");
    c->server.port = 8000;
    c->server.max_connections = 256;
    c->server.max_body = 4ull << 20;
    c->server.max_queue = 256;
    c->server.header_timeout_ms = 10000;
    c->server.idle_timeout_ms = 60000;
    snprintf(c->server.metrics_prefix, sizeof c->server.metrics_prefix, "%s", "kvtop");
    c->server.shutdown_grace_ms = 5000;
}

const kv_config_key *kv_config_keys(int *n) {
    if (n) *n = (int)KV_ARRAY_LEN(keys);
    return keys;
}

const kv_config_key *kv_config_key_find(const char *path) {
    if (!path) return NULL;
    for (size_t i = 0; i < KV_ARRAY_LEN(keys); i++)
        if (!strcmp(keys[i].path, path)) return &keys[i];
    return NULL;
}

const char *kv_config_key_type_name(kv_key_type t) {
    switch (t) {
    case KV_KEY_INT: return "integer";
    case KV_KEY_U64: return "integer";
    case KV_KEY_SIZE: return "size";
    case KV_KEY_DOUBLE: return "number";
    case KV_KEY_FLOAT: return "number";
    case KV_KEY_BOOL: return "bool";
    case KV_KEY_STRING: return "string";
    case KV_KEY_ENUM: return "enum";
    case KV_KEY_DIST: return "distribution";
    }
    return "?";
}

const char *const *kv_config_dist_fields(void) { return dist_fields; }

const char *const *kv_config_dtype_names(void) { return dtype_names; }
