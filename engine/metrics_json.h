/* metrics_json.h - the engine's metrics summary as JSON, written once for
 * every front end that prints it (kvtop bench --json, the server's
 * /kvtop/v1/snapshot and stream). */
#ifndef KV_METRICS_JSON_H
#define KV_METRICS_JSON_H

#include "engine.h"
#include "json.h"

/* A latency statistic as {"p50", "p90", "p99", "mean", "max", "n"}: with no
 * samples (st->valid == 0) the figures are null and n is 0, so readers
 * always find the same keys. */
void kv_stat_write_json(kv_json_writer *w, const char *key, const kv_stat *st);

/* Writes every throughput, latency, cache, speculation and simulated-clock
 * figure of m as members of the open object (the request counts are left to
 * the caller, whose ledger they are): input/output tokens and their rates,
 * goodput and SLA attainment, queue/TTFT/TPOT/ITL/E2E statistics, KV
 * utilisation, prefix hits, preemptions, swaps, the most requests running at
 * once, drafts and acceptance (overall and per position), simulated device
 * time and elapsed time. */
void kv_metrics_write_json(kv_json_writer *w, const kv_metrics_summary *m);

#endif
