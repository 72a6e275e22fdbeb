/* bench.h - the headless benchmark behind `kvtop bench`: drive a profile's
 * workload through a fresh engine on the caller's thread (the submissions
 * come from the workload driver, engine/driver.h: arrival times on the
 * engine's clock, closed loop refills), collect every request's outcome, and
 * render the result as a table, a side-by-side comparison, JSON or JSONL.
 * No curses here, so tests drive it directly (tests/cli/test_bench.c). */
#ifndef KV_TUI_BENCH_H
#define KV_TUI_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "../engine/config.h"
#include "../engine/engine.h"
#include "../engine/json.h"
#include "../engine/workload.h"

/* The outcome of one request of the workload. */
typedef struct kv_bench_req {
    int64_t id;          /* engine request id; 0 when submit refused it */
    int prompt_tokens;   /* prompt ids submitted (BOS + system prompt + own text) */
    int output_tokens;   /* tokens generated */
    kv_finish finish;    /* how it ended (never KV_FINISH_NONE after a run) */
    char *text;          /* generated text (owned, NUL-terminated); "" when none */
    char reason[128];    /* rejection or error reason; "" otherwise */
    int cls;             /* workload request class (KV_WORKLOAD_LONG / KV_WORKLOAD_SHORT) */
    double submit_ms;    /* engine clock at submission */
    double first_token_ms; /* engine clock of the first token event; < 0 before it */
} kv_bench_req;

/* Everything one run measured. Plain data; free with kv_bench_result_free. */
typedef struct kv_bench_result {
    kv_config cfg;               /* the effective configuration */
    char value[256];             /* --compare: the value this run used; "" otherwise */
    char model_name[128];
    char model_warning[256];     /* the model loaded with a warning (kv_model_warning); "" when not */
    char backend[16];
    kv_metrics_summary m;        /* the engine's aggregates after the last request */
    kv_mem_breakdown mem;        /* memory at the end of the run */
    int n_requests;              /* requests in the workload */
    uint64_t completed;          /* finished by eos, length or stop */
    uint64_t rejected;           /* refused at submit or by the scheduler, or a prompt that
                                    could not be built (counted by the bench, which also
                                    sees requests the engine never got) */
    uint64_t cancelled, errors;  /* should stay 0 */
    uint64_t output_tokens;      /* token events received, all requests */
    uint64_t steps;              /* engine iterations */
    int kv_blocks_total;
    int kv_block_size;           /* tokens per block */
    uint64_t kv_bytes_per_token; /* all layers, K and V */
    double wall_s;               /* first submission to last request done, bench clock */
    kv_bench_req *reqs;          /* (n_requests) in workload order */
    char error[512];             /* a run that failed (set by the caller, kv_bench_run leaves it
                                    ""): why; the JSON then holds only value, profile and this */
    kv_gpu_memory gpu;           /* a synthetic model's devices at the end (valid = 0 otherwise) */
    /* mixture of experts (n_experts 0: dense): tokens routed to each expert
     * over the run, summed over layers, and the mean per-step imbalance */
    int n_experts, n_experts_used;
    uint64_t expert_tokens[KV_MOE_MAX_EXPERTS];
    double expert_step_imbalance;
} kv_bench_result;

/* How a run reports while it works. */
typedef struct kv_bench_opts {
    FILE *progress;   /* live progress line (redrawn with \r, <= 5/s); NULL: none */
    const char *label;/* prefix of the progress line ("continuous"), may be NULL */
    /* Called at most once: the engine built and the prompts tokenized, just
     * before the clock starts (--concurrent lines the runs up here); a run
     * that fails before that point does not call it. NULL: none. */
    void (*on_ready)(void *ctx);
    void *ready_ctx;
} kv_bench_opts;

/* Runs cfg's workload to completion on a fresh engine driven from this
 * thread: requests are submitted when the wall clock since the first
 * submission reaches their arrival (poisson, burst) or when a slot frees up
 * (closed loop); each gets max_tokens = its drawn output length, the
 * profile's sampling with seed sampling.seed + index, workload.ignore_eos,
 * session = index. Rejected requests are recorded and the run goes on.
 * Returns 0 with *out filled (free it with kv_bench_result_free), or a
 * negative KV_ERR_* with err naming the problem and *out zeroed:
 * KV_ERR_INVAL for a bad workload (nothing was started), others for
 * engine failures (model load, a failed step, an engine that stops making
 * progress). */
int kv_bench_run(const kv_config *cfg, const kv_bench_opts *opts, kv_bench_result *out, kv_err *err);
void kv_bench_result_free(kv_bench_result *r); /* NULL is a no-op; leaves *r zeroed */

/* --compare --concurrent: the n configurations at once, as the TUI's
 * --compare runs them (base/cpushare.h): run j in its own thread pinned to
 * its share of this process's cores, its threads key capped at the cores
 * in that share (its compute threads inherit the pinning), every run's
 * clock started together once all are built. rcs[j] and errs[j] are run
 * j's kv_bench_run result; cpus[j] names its share ("cpu 1"). Returns 0,
 * or KV_ERR_NOMEM / KV_ERR_BACKEND when the threads cannot be made
 * (nothing ran). */
int kv_bench_run_concurrent(const kv_config *cfgs, int n, kv_bench_result *runs /* OUT: (n) */,
                            int *rcs /* OUT: (n) */, kv_err *errs /* OUT: (n) */, char (*cpus)[48] /* OUT: (n) */);

/* "eos", "length", "stop", "cancelled", "rejected", "error", "none". */
const char *kv_bench_finish_name(kv_finish f);

/* Splits a --compare argument "key=v1,v2,..." into the key and its values
 * (commas inside {...} or [...] do not split, so a distribution such as
 * {dist: uniform, min: 8, max: 64} is one value). buf is scratch the
 * results point into. Returns the number of values (>= 1), or -1 with a
 * message in err when the text is malformed (no '=', empty key or value,
 * more than cap values). */
int kv_bench_parse_compare(const char *arg, char *buf, size_t buf_cap, const char **key, const char **values,
                           int cap, kv_err *err);

/* ---- failure modes (bench_classes.c) ---- */

/* TTFT of the completed requests of class cls (KV_WORKLOAD_*), from the
 * bench's own submission and first-token times. st->valid = 0 when the
 * class has none. Returns KV_ERR_NOMEM or 0. */
int kv_bench_class_ttft(const kv_bench_result *r, int cls, kv_stat *st /* OUT: */);
/* The table's lines for the failure modes: preemption chains and
 * recomputed tokens, TTFT per request class (when the workload has two),
 * the dynamic batch size (when scheduler.target_tpot_ms is set). */
void kv_bench_print_failure(FILE *f, const kv_bench_result *r);
/* A mixture-of-experts run's imbalance: the busiest expert's tokens over
 * the mean per expert, over the whole run (1 is even; 0 when dense). */
double kv_bench_expert_imbalance(const kv_bench_result *r);
/* The run's TTFT per request class, written into its object as
 * ttft_ms_by_class {"short": stat, "long": stat} (stats as ttft_ms); the
 * chain and recompute counts (preemption_chains, chained_preemptions,
 * longest_preemption_chain, tokens_discarded, tokens_recomputed, batch_cap)
 * are the metrics summary's and come with it (kv_metrics_write_json). */
void kv_bench_json_failure(kv_json_writer *w, const kv_bench_result *r);

/* The name of value v of enum key `key` ("scheduler.policy"), "?" when
 * the key or the value is unknown. */
const char *kv_bench_enum_name(const char *key, int v);

/* The table of one run (stdout of `kvtop bench`). */
void kv_bench_print(FILE *f, const char *profile, const kv_bench_result *r);
/* Runs side by side: one column per run, each cell with its ratio to the
 * first run. */
void kv_bench_print_compare(FILE *f, const char *profile, const char *key, const kv_bench_result *runs, int n);

/* Writes one run as a JSON object (the keys README and the acceptance checks
 * read: output_tokens_per_s, ttft_ms.p50, ...; "value" when set; the
 * effective config both as a nested object and as YAML text). A run whose
 * error is set is {"value", "profile", "error"} only. */
void kv_bench_json_run(kv_json_writer *w, const char *profile, const kv_bench_result *r);
/* The whole --json document: one run's object, or {"compare": key, "runs":
 * [...]} when key is not NULL (failed runs included, marked by "error";
 * "failed_runs" counts them). Returns 0 or KV_ERR_IO / KV_ERR_INVAL. */
int kv_bench_write_json(FILE *f, const char *profile, const char *key, const kv_bench_result *runs, int n);
/* --outputs: one JSON line per request in workload order: {"index",
 * "prompt_tokens", "output_tokens", "finish", "text"} (+ "reason" for a
 * rejected or failed request). Nothing that varies between identical runs
 * (timings, ids) is written, so two runs can be compared with cmp.
 * Returns 0 or KV_ERR_IO. */
int kv_bench_write_outputs(FILE *f, const kv_bench_result *r);

#endif
