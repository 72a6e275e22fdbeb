/* metrics.h - what the engine measures: per request queue time, time to
 * first token, time per output token, every inter-token latency and the
 * end-to-end latency; per step KV utilisation; and the aggregates of
 * engine.h's kv_metrics_summary (throughput, goodput under the SLA, exact
 * percentiles from the stored samples). Times are engine-clock ms.
 * Not thread-safe: the engine thread owns it. */
#ifndef KV_METRICS_H
#define KV_METRICS_H

#include <stdint.h>

#include "engine.h"

/* Timestamps of one request (engine clock, ms; < 0 = not yet). */
typedef struct kv_req_metrics {
    double arrival_ms;
    double admit_ms;       /* first admission */
    double first_token_ms;
    double last_token_ms;
    double finish_ms;
    double last_itl_ms;    /* latest gap between two tokens, < 0 before the second */
    int n_in;              /* prompt tokens */
    int n_out;             /* generated tokens */
    int n_prefix_hit;      /* prompt tokens reused at the first admission */
} kv_req_metrics;

void kv_req_metrics_init(kv_req_metrics *rm /* OUT: */, double arrival_ms, int n_in);
/* Derived values, < 0 while unknown. */
double kv_req_queue_ms(const kv_req_metrics *rm);
double kv_req_ttft_ms(const kv_req_metrics *rm);
double kv_req_tpot_ms(const kv_req_metrics *rm); /* (last - first token) / (n_out - 1) */
double kv_req_e2e_ms(const kv_req_metrics *rm);

typedef struct kv_metrics kv_metrics;

/* sla_*_ms: goodput bounds, 0 = no bound. NULL on out of memory. */
kv_metrics *kv_metrics_new(double sla_ttft_ms, double sla_tpot_ms);
void kv_metrics_free(kv_metrics *m); /* NULL is a no-op */
/* Starts a new measurement window: every counter and sample is dropped.
 * Requests in flight keep their timestamps and count in the new window
 * from here on. */
void kv_metrics_reset(kv_metrics *m);

/* Events, in the order they happen to a request. */
void kv_metrics_submitted(kv_metrics *m, double now_ms);
void kv_metrics_rejected(kv_metrics *m, double now_ms);
/* First admission: the queue time sample, input tokens and prefix hits. */
void kv_metrics_admitted(kv_metrics *m, kv_req_metrics *rm, double now_ms, int n_prefix_hit);
/* n tokens emitted at once (n > 1 after a verified draft): the first token
 * gives the TTFT sample, later ones inter-token latencies (0 ms for the
 * 2nd..nth of a group, as they arrive together). */
void kv_metrics_tokens(kv_metrics *m, kv_req_metrics *rm, double now_ms, int n);
/* The request ended. Completed requests (EOS, length, stop) give TPOT and
 * end-to-end samples and count toward goodput when they meet the SLA. */
void kv_metrics_finished(kv_metrics *m, kv_req_metrics *rm, kv_finish why, double now_ms);

/* One engine step: its duration, the KV slots holding committed tokens and
 * the slots reserved by running requests (utilisation is the ratio of their
 * step-duration-weighted sums), running requests and prompt tokens run. */
void kv_metrics_step(kv_metrics *m, double dur_ms, uint64_t slots_held, uint64_t slots_reserved, int n_running,
                     int prefill_tokens);
/* A step that ran no prompt tokens: its duration and the tokens it emitted
 * (the aggregate decode rate, llama-batched-bench's S_TG). */
void kv_metrics_decode_step(kv_metrics *m, double dur_ms, int tokens_out);
/* Sim backend: a step's simulated device time and the tokens it emitted. */
void kv_metrics_sim_step(kv_metrics *m, double sim_ms, int tokens_out);
void kv_metrics_preempted(kv_metrics *m, int swapped);
void kv_metrics_swapped_in(kv_metrics *m);

/* Speculative decoding: one verification of `drafted` tokens of which the
 * first `accepted` were accepted; and the time spent drafting / verifying. */
void kv_metrics_spec(kv_metrics *m, int drafted, int accepted);
void kv_metrics_spec_time(kv_metrics *m, double draft_ms, double verify_ms);

/* Fills out. in_flight: requests waiting or running now (the window then
 * ends at now_ms, otherwise at the last finish). Returns 0 or KV_ERR_NOMEM
 * (out then has the counters but no percentiles). */
int kv_metrics_summarize(kv_metrics *m, double now_ms, int in_flight, kv_metrics_summary *out /* OUT: */);

/* Bytes the stored samples take (the memory breakdown's "other"). */
uint64_t kv_metrics_bytes(const kv_metrics *m);

/* Exact statistics of n samples (sorted in place): mean, max and linearly
 * interpolated P50/P90/P99. valid = 0 when n == 0. */
void kv_stat_compute(kv_stat *st /* OUT: */, double *samples /* sorted in place */, uint64_t n);

#endif
