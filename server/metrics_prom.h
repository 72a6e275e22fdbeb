/* metrics_prom.h - GET /metrics: the Prometheus text exposition format
 * (version 0.0.4) from an engine snapshot and the server's own counters.
 * vLLM's metric names and labels under a chosen prefix ("kvtop" or "vllm"),
 * so vLLM dashboards and tools read kvtop unchanged; kvtop's own gauges
 * (block states, memory breakdown, goodput) always under "kvtop:". */
#ifndef KV_SRV_METRICS_PROM_H
#define KV_SRV_METRICS_PROM_H

#include <stdio.h>

#include "../engine/engine.h"
#include "hub.h"

/* Writes every metric family to f. prefix: "kvtop" or "vllm"; model: the
 * served model name (the model_name label). Returns 0 or KV_ERR_IO. */
int srv_metrics_write(FILE *f, const char *prefix, const char *model, const kv_snapshot *s, const srv_stats *st);

#endif
