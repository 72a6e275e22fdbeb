/* bench_cost.h - what a synthetic run costs (kvtop bench on model.synthetic):
 * $ per hour of the devices, turned into $ per million output tokens, per
 * request and per million tokens of requests within the SLA (goodput),
 * the crossover against a hosted API's price (sim.api_price_per_mtok), and
 * the per-device GPU memory breakdown, for the text report and the JSON. */
#ifndef KV_BENCH_COST_H
#define KV_BENCH_COST_H

#include <stdio.h>

#include "../engine/json.h"
#include "bench.h"

typedef struct kv_bench_cost {
    int valid;                     /* 0: not a synthetic run, or no simulated time */
    double usd_per_hour;           /* all devices */
    double usd_per_million_output_tokens;
    double usd_per_request;        /* per completed request */
    double usd_per_million_goodput_tokens; /* output tokens of requests within the SLA only; 0: none met it */
    double api_price_per_mtok;     /* sim.api_price_per_mtok; 0 = none */
    double crossover_output_tokens_per_s; /* self-hosting is cheaper above this sustained load; 0 = no API price */
} kv_bench_cost;

/* The cost of run r on the simulated clock (valid = 0 when r is not a
 * synthetic run or its devices have no price). */
void kv_bench_cost_of(const kv_bench_result *r, kv_bench_cost *out /* OUT */);
/* The text report's lines for the devices, their memory and cost (nothing
 * for other runs). */
void kv_bench_print_cost(FILE *f, const kv_bench_result *r);
/* JSON keys usd_per_hour, usd_per_million_output_tokens, usd_per_request,
 * usd_per_million_goodput_tokens, api_price_per_mtok,
 * crossover_output_tokens_per_s, cold_start_s and gpu_memory (per device:
 * total, usable, weights, kv_used, kv_cached, kv_free, activations,
 * reserve), into the object being written; nothing for other runs. */
void kv_bench_json_cost(kv_json_writer *w, const kv_bench_result *r);

#endif
