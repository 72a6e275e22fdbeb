/* engine.h - the public face of the inference engine: submit requests, poll
 * their token events, step or run the continuous-batching loop, and take
 * plain-data snapshots of everything it decided. Front ends (TUI, bench,
 * chat, a server) generate only through this header; beside it they use the
 * engine's data modules, never its internals (engine_internal.h): config.h
 * (the key table), tokenizer.h, unicode.h and chat_template.h (prompts,
 * `kvtop tokenize`), workload.h and driver.h (bench and the TUI's load
 * key), json.h, trace.h (recording, replay, export), and for the model
 * tools model.h, gguf.h, quantize.h, mkmodel.h and eval.h.
 *
 * Thread safety: submit, cancel, poll, wait, snapshot, pause/resume and the
 * step controls may be called from any thread while the engine thread runs.
 * kv_engine_step() runs one iteration on the caller's thread and must not be
 * called while the background thread is started. */
#ifndef KV_ENGINE_H
#define KV_ENGINE_H

#include <stdint.h>

#include "../base/common.h"
#include "config.h"
#include "model.h"

typedef struct kv_engine kv_engine;

/* Loads the model(s) named by cfg, creates the backend, sizes the KV cache
 * and scratch. cfg is copied. NULL with err filled on failure. */
kv_engine *kv_engine_new(const kv_config *cfg, kv_err *err);
/* The same on a backend the caller made instead of the one cfg names
 * (cfg->backend, cfg->sim_device and cfg->threads are not used for it): the
 * seam for tests that inject a failing backend and for embedders with a
 * backend of their own. Takes ownership of be (NULL: KV_ERR_INVAL), also
 * when creation fails; kv_engine_free frees it. */
kv_engine *kv_engine_new_with_backend(const kv_config *cfg, kv_backend *be, kv_err *err);
void kv_engine_free(kv_engine *e); /* stops the thread; NULL is a no-op */

/* Borrowed views, valid until kv_engine_free. */
const kv_model *kv_engine_model(const kv_engine *e);
const kv_config *kv_engine_config(const kv_engine *e);
/* The engine's compute backend (borrowed, valid until kv_engine_free): for a
 * front end's own figures (the sim backend's device time, the cpu pool a
 * bandwidth probe runs on). Ops on it must not run while a step does. */
kv_backend *kv_engine_backend(kv_engine *e);

/* What loading had to guess or work around ("unknown pre-tokenizer,
 * falling back ...", tensors that load but are suspect), for every front
 * end to show: the model's, its tokenizer's and the draft model's, each
 * prefixed with where it comes from ("tokenizer: ..."). Writes up to cap
 * (<= KV_MAX_WARNINGS) NUL-terminated strings, cut to KV_WARNING_LEN - 1
 * bytes, to out and returns how many; 0 for a NULL engine. Any thread. */
#define KV_MAX_WARNINGS 4
#define KV_WARNING_LEN 320
int kv_engine_warnings(const kv_engine *e, char out[][KV_WARNING_LEN] /* OUT: (cap) */, int cap);

/* ---- requests ---- */

typedef struct kv_request_params {
    const int32_t *tokens;   /* prompt ids (copied), or NULL to use text */
    int n_tokens;
    const char *text;        /* prompt text (copied): tokenized with the model's BOS rule, as plain
                                text unless parse_special; a chat prompt goes as the ids of
                                kv_chat_tokenize (chat_template.h), which keeps message text plain */
    int parse_special;       /* bool: special-token texts in `text` (<|im_start|>, <s>) become control
                                tokens: the explicit opt-in for a trusted raw prompt (`kvtop generate
                                --special`, the server's "parse_special"); default 0 */
    int max_tokens;          /* tokens to generate at most (> 0) */
    kv_sampling sampling;
    const char *const *stop; /* stop strings (copied); generation ends when the reply ends with one */
    int n_stop;
    int priority;            /* higher runs first; preemption picks the lowest */
    int ignore_eos;          /* bool: keep generating past end-of-generation tokens */
    int session;             /* owner tag for display (TUI tab), >= 0 */
    int seed_exact;          /* bool: seed the sampler with sampling.seed itself (an API client's
                                `seed`: same seed, same text), not seed + request id */
    int logprobs;            /* bool: each token event carries the token's log-probability (see
                                kv_event.logprob); 0 (default) costs nothing */
    int top_logprobs;        /* with logprobs: also the 0..KV_MAX_TOP_LOGPROBS most likely tokens */
} kv_request_params;

/* Defaults: max_tokens 128, sampling from the engine's config, priority 0. */
void kv_engine_request_defaults(const kv_engine *e, kv_request_params *p /* OUT: */);

/* Queues a request. Returns its id (> 0), or a negative KV_ERR_* with err
 * naming the reason when it is rejected (prompt empty or over the context:
 * a text prompt is encoded only as far as the context, so a huge one is
 * refused fast with "prompt is longer than the context (more than N
 * tokens)",
 * prompt + max_tokens larger than the context or the whole cache, bad token
 * ids, bad sampling values). A rejected request is counted and emits a
 * KV_EVENT_DONE with KV_FINISH_REJECTED, so no request is ever lost. */
int64_t kv_engine_submit(kv_engine *e, const kv_request_params *p, kv_err *err);
/* The engine's queues now, cheaply (one short lock, no snapshot; any
 * thread): *waiting = requests submitted and not running (those not yet
 * taken in by a step, plus the scheduler's waiting queue, preempted ones
 * included, and its swapped-out ones as of the last step); *running =
 * requests running at the end of the last step. Both 0 for a NULL engine.
 * What kvtop serve's 429 (server.max_queue) is measured on. */
void kv_engine_queue_lengths(kv_engine *e, int *waiting /* OUT: */, int *running /* OUT: */);
/* Cancels a waiting or running request (its blocks are released at the next
 * step boundary). Returns 0, or KV_ERR_INVAL for an unknown/finished id. */
int kv_engine_cancel(kv_engine *e, int64_t id);

typedef enum kv_event_type {
    KV_EVENT_TOKEN = 0,  /* a generated token (text may be empty while a UTF-8 char is incomplete) */
    KV_EVENT_DONE = 1    /* the request ended: finish says how */
} kv_event_type;

typedef enum kv_finish {
    KV_FINISH_NONE = 0,
    KV_FINISH_EOS,       /* end-of-generation token */
    KV_FINISH_LENGTH,    /* max_tokens reached */
    KV_FINISH_STOP,      /* a stop string matched */
    KV_FINISH_CANCELLED,
    KV_FINISH_REJECTED,
    KV_FINISH_ERROR
} kv_finish;

/* The finish reason's name, as every front end writes it: "none", "eos",
 * "length", "stop", "cancelled", "rejected", "error"; "unknown" for a value
 * outside the enum. */
const char *kv_finish_name(kv_finish f);

typedef enum kv_token_source {
    KV_TOKSRC_DECODE = 0, /* ordinary decode step */
    KV_TOKSRC_DRAFT = 1,  /* a drafted token the target accepted */
    KV_TOKSRC_BONUS = 2   /* the target's own token after a verified draft */
} kv_token_source;

/* Alternatives a token event can carry (OpenAI's top_logprobs limit). */
#define KV_MAX_TOP_LOGPROBS 20

typedef struct kv_event {
    kv_event_type type;
    int64_t req;          /* request id */
    int session;          /* the request's session tag */
    int32_t token;        /* KV_EVENT_TOKEN: the token id */
    kv_token_source source;
    int text_len;         /* bytes in text */
    char text[256];       /* complete UTF-8 text this event adds to the reply */
    kv_finish finish;     /* KV_EVENT_DONE */
    char reason[128];     /* KV_EVENT_DONE: human-readable (rejection reason, error) */
    double t_ms;          /* engine clock when emitted */
    /* KV_EVENT_TOKEN of a request with logprobs on (token >= 0): the raw
     * model distribution at that position, log-softmax of the logits before
     * repetition penalty, temperature, top-k/p and min-p (vLLM's default
     * "raw_logprobs"); a speculative token's comes from the verify pass's
     * target logits, so it equals plain decoding's */
    int has_logprob;      /* bool: logprob and top are filled */
    float logprob;        /* log p(token), <= 0 */
    int n_top;            /* entries in top_token / top_logprob, most likely first (ties: lower id) */
    int32_t top_token[KV_MAX_TOP_LOGPROBS];
    float top_logprob[KV_MAX_TOP_LOGPROBS];
    /* KV_EVENT_DONE: the request's figures at its finish, as its snapshot
     * row has them, so a consumer need not race the snapshot for them:
     * queue_ms from arrival to first admission (< 0: never admitted),
     * e2e_ms (< 0: none), prompt tokens reused from the prefix cache at the
     * first admission, times preempted */
    double queue_ms, e2e_ms;
    int n_prefix_hit, preemptions;
} kv_event;

/* Copies up to cap pending events (oldest first) and returns how many.
 * Never blocks. */
int kv_engine_poll(kv_engine *e, kv_event *out /* OUT: (cap) */, int cap);
/* Blocks until an event is pending or timeout_ms passes; returns 1 / 0. */
int kv_engine_wait(kv_engine *e, int timeout_ms);

/* ---- running ---- */

/* One scheduler iteration on the caller's thread: schedule, one batched
 * forward, sample, emit events, record. Returns 1 when it did work, 0 when
 * there was nothing to do, negative on an internal error. */
int kv_engine_step(kv_engine *e);
/* Runs steps until no request is waiting or running. Returns 0 or error. */
int kv_engine_run_until_idle(kv_engine *e);

/* Background thread. start: spawns it (running); pause: it stops after the
 * current step; resume; step_once: while paused, do exactly one step;
 * set_step_delay: slow motion, ms slept after each step; stop: joins. */
int kv_engine_start(kv_engine *e);
void kv_engine_pause(kv_engine *e);
void kv_engine_resume(kv_engine *e);
void kv_engine_step_once(kv_engine *e);
void kv_engine_set_step_delay(kv_engine *e, int ms);
void kv_engine_stop(kv_engine *e);

/* ---- snapshots: plain data copied out under a short lock ---- */

typedef enum kv_req_state {
    KV_REQ_WAITING = 0,
    KV_REQ_RUNNING = 1,   /* admitted: prefilling or decoding */
    KV_REQ_PREEMPTED = 2, /* preempted by recompute, back in the waiting queue */
    KV_REQ_SWAPPED = 3,   /* preempted by swap, blocks in the host pool */
    KV_REQ_FINISHED = 4
} kv_req_state;

typedef struct kv_snap_request {
    int64_t id;
    int session;
    kv_req_state state;
    int priority;
    int n_prompt;          /* prompt tokens */
    int n_computed;        /* tokens with K/V in the cache */
    int n_generated;
    int max_tokens;
    int n_prefix_hit;      /* prompt tokens reused from the prefix cache */
    int n_blocks;          /* entries in its block table */
    int table_offset;      /* its block table: snapshot->tables[table_offset .. + n_blocks) */
    int next_block;        /* physical block where its next token lands (-1 if not allocated) */
    int next_offset;       /* slot inside that block */
    int preemptions;
    double arrival_ms;     /* engine clock */
    double queue_ms;       /* time waiting before first admission */
    double ttft_ms;        /* < 0 until the first token */
    double tpot_ms;        /* mean time per output token after the first */
    double last_itl_ms;    /* latest inter-token latency */
    double e2e_ms;         /* < 0 until finished */
    kv_finish finish;
    char wait_reason[96];  /* why it is not running ("3 free blocks, needs 9") */
    /* speculative decoding */
    int spec_k;            /* current draft length (0: plain decode) */
    uint64_t spec_drafts, spec_drafted, spec_accepted;
} kv_snap_request;

typedef struct kv_snap_block {
    uint8_t state;         /* kv_block_state: free, used, cached */
    uint8_t shared;        /* refcount >= 2 */
    uint16_t refcount;
    uint16_t fill;         /* tokens in the block */
    uint8_t windowed;      /* sliding-window release: its local-layer part is released (below every
                              holder's window); in what was padding, so recorded traces keep their layout */
    uint8_t zero;          /* always 0: the last padding byte made explicit, so snapshots written
                              raw into traces and compared whole hold no stray bytes */
    int32_t owner;         /* request id of the latest owner, -1 */
    int32_t session;       /* its session tag, -1 */
} kv_snap_block;

typedef struct kv_step_record {
    uint64_t step;
    double t_ms;           /* start, engine clock */
    double dur_ms;         /* whole iteration */
    double forward_ms;     /* of which the batched forward */
    double sim_ms;         /* sim backend: the simulated device time of the step's ops; 0 otherwise */
    int n_seqs;            /* sequences in the batch */
    int n_prefill_tokens;  /* prompt tokens computed */
    int n_decode_tokens;   /* ordinary decode tokens */
    int n_spec_tokens;     /* draft tokens verified */
    int n_pad_tokens;      /* static batching: padding rows for finished batch members */
    int n_admitted, n_preempted, n_swapped_out, n_swapped_in, n_evicted, n_finished, n_cow;
    int n_blocks_used;     /* after the step */
    int n_waiting;         /* queue length after the step */
    /* mixture of experts (0 for a dense model): tokens routed to each
     * expert in the step's target forward, summed over the layers (a token
     * counts once per layer per expert it is routed to; a draft model's
     * routing is not counted) */
    int n_experts;         /* experts per layer */
    int expert_routed;     /* (token, expert) pairs: tokens x experts used x layers */
    int expert_max;        /* the most any one expert got */
    int expert_active;     /* experts that got at least one token, in any layer */
} kv_step_record;

typedef enum kv_decision_kind {
    KV_DEC_ADMIT = 0, KV_DEC_CHUNK, KV_DEC_PREEMPT, KV_DEC_SWAP_OUT, KV_DEC_SWAP_IN,
    KV_DEC_EVICT, KV_DEC_SHARE, KV_DEC_COW, KV_DEC_FINISH, KV_DEC_REJECT, KV_DEC_WAIT,
    KV_DEC_CANCEL, KV_DEC_SPEC, KV_DEC_KIND_COUNT
} kv_decision_kind;

typedef struct kv_decision {
    uint64_t step;
    kv_decision_kind kind;
    int64_t req;
    char text[112];        /* "admit #4: 37 prompt tokens, 16 from prefix cache" */
} kv_decision;

/* Summary statistics of one latency kind, in ms. valid=0 when no sample. */
typedef struct kv_stat {
    int valid;
    double mean, p50, p90, p99, max;
    uint64_t n;
} kv_stat;

typedef struct kv_metrics_summary {
    double elapsed_s;               /* since the first request arrived */
    uint64_t requests_submitted, requests_completed, requests_cancelled, requests_rejected;
    uint64_t requests_errored;      /* ended by a failure (KV_FINISH_ERROR, e.g. a backend op): once
                                       idle, completed + cancelled + rejected + errored = submitted */
    uint64_t input_tokens, output_tokens;
    uint64_t prefill_tokens_computed; /* prompt tokens actually run through the model */
    double input_tokens_per_s, output_tokens_per_s, requests_per_s;
    double goodput_requests_per_s;  /* completed requests meeting the SLA, per second */
    uint64_t good_output_tokens;    /* output tokens of those requests */
    double sla_attainment;          /* fraction of completed requests meeting the SLA */
    kv_stat queue_ms, ttft_ms, tpot_ms, itl_ms, e2e_ms;
    double kv_utilization;          /* slots holding tokens / slots reserved (time-averaged over steps) */
    double prefix_hit_rate;         /* prompt tokens reused / prompt tokens */
    uint64_t prefix_hit_tokens;
    uint64_t preemptions, swaps_out, swaps_in;
    int max_concurrent;             /* most requests running at once */
    /* speculative decoding */
    uint64_t spec_drafts, spec_drafted, spec_accepted;
    double spec_acceptance_rate;    /* accepted / drafted */
    double spec_mean_accepted_len;  /* tokens emitted per verify (accepted + bonus) */
    uint64_t spec_pos_drafted[16], spec_pos_accepted[16]; /* per draft position */
    double spec_draft_ms, spec_verify_ms;
    /* tokens emitted by the steps that computed no prompt tokens, over
     * those steps' wall time: the batch's aggregate decode rate with
     * prefill left out, as llama-batched-bench's S_TG measures it (0: no
     * such step) */
    double decode_step_tokens_per_s;
    /* sim backend (0 otherwise): simulated device time of the window's
     * steps, and the tokens they emitted per simulated second (what the
     * modelled GPU would sustain with this batching; the host's own
     * scheduling time is not in it) */
    double sim_device_s;
    uint64_t sim_tokens_out;
    double sim_output_tokens_per_s;
    /* preemption chains and the dynamic batch size, from the scheduler's
     * counters since the engine started (not reset with the window) */
    uint64_t preemption_chains;     /* cascades: chains of >= 2 preemptions */
    uint64_t chained_preemptions;   /* preemptions in a cascade */
    int longest_preemption_chain;   /* links */
    uint64_t tokens_discarded;      /* computed tokens thrown away by recompute preemptions */
    uint64_t tokens_recomputed;     /* computed again after readmission */
    int batch_cap;                  /* sequences the scheduler allows now (target_tpot_ms, max_seqs
                                       auto; 0 = off) */
    double batch_goal_ms;           /* the step time that cap holds (0: off or not yet fitted) */
} kv_metrics_summary;

typedef struct kv_mem_breakdown {
    uint64_t weights;      /* model weight bytes (draft model included) */
    uint64_t weights_prepared; /* the backend's copies of them in its own layout (the cpu backend's
                                  pre-packed panels); the rows they were packed from are paged out,
                                  so the resident weights come to about this, not weights + this */
    uint64_t kv_used;      /* blocks referenced by requests */
    uint64_t kv_cached;    /* unreferenced prefix blocks */
    uint64_t kv_free;
    uint64_t kv_swap_used, kv_swap_total;
    uint64_t kv_window_saved; /* sliding-window release: the local-layer bytes referenced blocks would
                                 hold without it (released parts; 0 without release) */
    uint64_t activations;  /* forward scratch */
    uint64_t other;        /* tokenizer, tables, metrics */
    uint64_t budget;       /* memory.budget the KV cache was sized from; 0 = none */
    kv_backend_mem backend;/* device memory when the backend can tell */
} kv_mem_breakdown;

/* A synthetic model's devices (model.synthetic on the sim backend): what
 * one device's memory holds, in bytes (the devices of a plan are alike:
 * tensor parallel splits weights and KV heads evenly, a pipeline splits
 * layers), and what the devices cost. valid = 0 for a real model. */
typedef struct kv_gpu_memory {
    int valid;
    char device[32];       /* "h100-sxm" */
    int n_devices, tp, pp, ep;
    uint64_t total;        /* one device's memory */
    uint64_t usable;       /* total x sim.memory_utilization */
    uint64_t weights;      /* its share of the weights */
    uint64_t kv_used, kv_cached, kv_free; /* its share of the KV blocks */
    uint64_t activations;  /* a step's peak */
    uint64_t reserve;      /* the runtime's (sim.reserve) */
    double usd_per_hour;   /* all devices */
    double cold_start_s;   /* all weights over sim.storage_bandwidth */
    /* sim.disaggregated (pools = 1): the first tp devices are the decode
     * pool and hold the KV cache above; prefill_devices more (the rest of
     * n_devices) run the prefill batches on their own clock, each with the
     * same weights, activations and reserve and its share of the prompts
     * being prefilled or handed over */
    int pools, prefill_devices;
    uint64_t prefill_kv_used, prefill_kv_peak, prefill_kv_free; /* per prefill device */
    double clock_ms;            /* the engine clock when taken */
    double prefill_busy_ms;     /* the prefill pool ran batches this long */
    double prefill_wait_ms;     /* mean wait of a prefill batch for the pool */
    double prefill_free_ms;     /* when it has run what it was given (engine clock) */
    uint64_t prefill_batches, handovers;
    double transfer_bytes, transfer_busy_ms; /* KV hand-overs over the links */
    double in_prefill_mean, in_transfer_mean; /* requests per step on the prefill pool, awaiting their KV */
    int in_prefill_max, in_transfer_max;
} kv_gpu_memory;

typedef struct kv_snapshot {
    uint64_t step;            /* steps done */
    double now_ms;            /* engine clock */
    int thread_running;       /* background thread started */
    int paused;
    int step_delay_ms;
    /* configuration echo */
    char model_name[128];
    char backend[16];
    char sim_device[32];      /* sim backend: the modelled device ("h100-sxm"); "" otherwise */
    int block_size, n_blocks;
    kv_cache_dtype kv_dtype;
    kv_policy policy;
    kv_layout layout;
    int prefix_sharing;
    kv_spec_method spec_method;
    uint64_t kv_bytes_per_token;
    double sla_ttft_ms, sla_tpot_ms;
    /* block manager counters */
    uint64_t prefix_lookups, prefix_hit_blocks, prefix_hit_tokens, evictions, cow_copies;
    int blocks_free, blocks_used, blocks_cached, blocks_shared;
    int blocks_windowed;            /* sliding-window release: used blocks whose local-layer part is released */
    uint64_t local_released;        /* local-layer parts released since start */
    kv_metrics_summary metrics;
    kv_mem_breakdown mem;
    /* requests: waiting, running, preempted, swapped, then the last finished ones */
    int n_requests;
    kv_snap_request *requests;
    int n_table_entries;
    int32_t *tables;          /* block tables, see kv_snap_request.table_offset */
    /* queues, as request ids in scheduling order */
    int n_running, n_waiting, n_swapped;
    int64_t *running, *waiting, *swapped;
    /* the block map: one entry per physical block */
    kv_snap_block *blocks;
    /* last step records (oldest first) and decisions (oldest first) */
    int n_steps;
    kv_step_record *steps;
    int n_decisions;
    kv_decision *decisions;
    /* private: capacities of the arrays above */
    int cap_requests, cap_tables, cap_queue, cap_blocks, cap_steps, cap_decisions;
    /* a synthetic model's device memory (valid = 0 otherwise) */
    kv_gpu_memory gpu;
    /* mixture of experts: the last step's tokens per expert summed over the
     * layers (as its kv_step_record counts them); n_experts 0: dense */
    int n_experts;
    uint32_t expert_tokens[KV_MOE_MAX_EXPERTS];
} kv_snapshot;

kv_snapshot *kv_snapshot_new(void);
void kv_snapshot_free(kv_snapshot *s); /* NULL is a no-op */
/* Fills s (growing its arrays as needed). Returns 0 or KV_ERR_NOMEM. */
int kv_engine_snapshot(kv_engine *e, kv_snapshot *s /* OUT: arrays reused */);

/* Per-request record of a finished request (for bench --outputs and
 * metrics): its generated text. Returns bytes written (NUL-terminated,
 * truncated to cap), or KV_ERR_INVAL when the id is not a finished request
 * (unknown, still running, or forgotten). Finished requests are kept until
 * kv_engine_forget(). */
int kv_engine_request_text(kv_engine *e, int64_t id, char *buf /* OUT: (cap), may be NULL */, size_t cap);
void kv_engine_forget(kv_engine *e, int64_t id);

/* Metrics over everything finished so far (the same numbers the snapshot
 * carries), and a reset for a new measurement window. */
void kv_engine_metrics(kv_engine *e, kv_metrics_summary *out /* OUT: */);
void kv_engine_metrics_reset(kv_engine *e);
/* Mixture of experts: tokens routed to each expert (summed over layers)
 * since the last kv_engine_metrics_reset, into out[0..min(n_experts, cap))
 * (OUT), and the mean over those steps of each step's imbalance (its
 * busiest expert's tokens over the mean per expert; 1 is even) into
 * *step_imbalance (OUT, may be NULL; 0 when no step routed). Returns
 * n_experts; 0 for a dense model (out untouched). */
int kv_engine_expert_tokens(kv_engine *e, uint64_t *out /* OUT: (cap) */, int cap, double *step_imbalance);

/* Consistency check for tests (between steps): the scheduler's and the
 * block manager's checkers over every live sequence, the draft model's
 * cache likewise, and every registered prefix block of a running request
 * found again by its verified tokens (nothing unverified was registered).
 * Returns 0, or KV_ERR_INVAL with msg naming the first violation (also for
 * a NULL engine), or KV_ERR_NOMEM when it could not check. */
int kv_engine_check(kv_engine *e, char *msg /* OUT: (cap) */, size_t cap);

/* Step trace recording (for `kvtop replay` and Chrome trace export): when
 * enabled the engine keeps every step record and decision. */
int kv_engine_trace_enable(kv_engine *e, int on);

/* ---- step hook: a snapshot after every step ---- */

/* Called after every step that did work (the step counter moved), on the
 * thread that ran it: the background thread, or the caller of
 * kv_engine_step(). s is a snapshot of the state right after that step
 * (s->step is its number), borrowed: valid only during the call. The engine
 * holds no state lock during the call, so other threads may take snapshots
 * and submit meanwhile, but the next step waits for the hook to return:
 * keep it short. The hook must not call back into this engine (a call
 * would deadlock or race with the step loop); record what it needs from s
 * and return. */
typedef void (*kv_step_hook)(void *user, const kv_snapshot *s);

/* Installs fn (NULL removes the hook); user is passed back to it. Replaces
 * any hook set before. On return no call of an earlier hook is in flight,
 * so after kv_engine_set_step_hook(e, NULL, NULL) returns, user's data may
 * be freed. Must not be called from inside the hook. The snapshot is
 * allocated here (and grown by the steps as needed); while a hook is set
 * each step also builds it, which with kv_engine_trace_enable() on (rings
 * unbounded) grows with the run. Returns 0, KV_ERR_INVAL for a NULL engine,
 * or KV_ERR_NOMEM (nothing changed). NOTE: a step whose snapshot cannot be
 * built for lack of memory is not reported; the next one carries its step
 * record and decisions in its rings. */
int kv_engine_set_step_hook(kv_engine *e, kv_step_hook fn, void *user);

/* The engine's clock in ms (the time base of arrival_ms, TTFT, TPOT, step
 * records and events). Host wall time since the engine was created, except
 * on the sim backend with sim_clock on: then it is the simulated device's
 * clock (0 when the engine is ready), which advances only while ops run. */
double kv_engine_now_ms(kv_engine *e);
/* 1 when the clock is the simulated one. */
int kv_engine_clock_is_virtual(const kv_engine *e);
/* Virtual clock only: moves it forward by ms (> 0) while the engine has
 * nothing to do, as a driver does to reach the next arrival of an open-loop
 * workload. KV_ERR_INVAL on a wall clock or a bad value; 0 otherwise. */
int kv_engine_advance_clock(kv_engine *e, double ms);
/* Disaggregated pools (sim.disaggregated): ms until the earliest running
 * request held for its KV's hand-over may run again; 0 when none. A driver
 * with nothing else to do moves a virtual clock by it (or to the next
 * arrival, when sooner). */
double kv_engine_hold_wait_ms(kv_engine *e);

#endif
