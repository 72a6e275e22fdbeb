/* compare.h - one key, several values: the shared part of `kvtop bench
 * --compare` and the TUI's `--compare` (two to four engines side by side).
 * Parses "key=v1,v2,..." and reads the figures both report from a
 * kv_metrics_summary (the one reader: bench's table takes every figure
 * that lives in the summary from here), with their ratio to the first run. Pure
 * data: no engine is built here (the front ends apply "key=value" through
 * the one key table, profiles/profile.h). */
#ifndef KV_COMPARE_H
#define KV_COMPARE_H

#include <stddef.h>

#include "../base/common.h"
#include "engine.h"

/* Splits "key=v1,v2,..." into the key and its values (commas inside {...}
 * or [...] do not split, so a distribution such as {dist: uniform, min: 8,
 * max: 64} is one value; spaces around a value are trimmed). buf (buf_cap
 * bytes) is scratch that *key and values[] point into. Returns the number
 * of values (>= 1), or -1 with err naming the problem (no '=', empty key or
 * value, more than cap values, text longer than buf). */
int kv_compare_parse(const char *arg, char *buf, size_t buf_cap, const char **key /* OUT: */,
                     const char **values /* OUT: (cap) */, int cap, kv_err *err);

/* The figures of a metrics summary: the ones a live comparison shows come
 * first, in header order (KV_CMP_HEADER_COUNT of them), then the rest of
 * what bench's table reads. */
typedef enum kv_cmp_metric {
    KV_CMP_OUT_TPS = 0,   /* output tokens per second (engine clock) */
    KV_CMP_TTFT50,        /* TTFT P50, ms */
    KV_CMP_TTFT99,        /* TTFT P99, ms */
    KV_CMP_MAXCONC,       /* most requests running at once */
    KV_CMP_KVUTIL,        /* KV utilisation, % (slots holding tokens / slots reserved) */
    KV_CMP_PREEMPT,       /* preemptions */
    KV_CMP_PREFILL,       /* prompt tokens run through the model */
    KV_CMP_SPEC_ACC,      /* speculative acceptance, % of drafted tokens (none before a draft) */
    KV_CMP_HEADER_COUNT,  /* the live header's figures end here */
    KV_CMP_IN_TPS = KV_CMP_HEADER_COUNT, /* input tokens per second */
    KV_CMP_RPS,           /* requests per second */
    KV_CMP_GOODPUT,       /* requests within the SLA per second */
    KV_CMP_SLA,           /* SLA attainment, % */
    KV_CMP_TTFT90, KV_CMP_TTFT_MEAN, KV_CMP_TPOT50, KV_CMP_TPOT99, KV_CMP_ITL50, KV_CMP_ITL99, /* ms */
    KV_CMP_E2E50, KV_CMP_E2E99, KV_CMP_E2E_MEAN, KV_CMP_QUEUE50,                               /* ms */
    KV_CMP_PREFIX_RATE,   /* prefix hit rate, % */
    KV_CMP_PREFIX_TOK,    /* prompt tokens served from the prefix cache */
    KV_CMP_SPEC_LEN,      /* mean accepted draft length (none before a draft) */
    KV_CMP_SIM_TPS,       /* output tokens per device second (none without a sim device) */
    KV_CMP_SIM_S,         /* device seconds (sim) */
    KV_CMP_RECOMPUTED,    /* tokens computed again after a recompute preemption */
    KV_CMP_CHAINS,        /* preemption cascades */
    KV_CMP_LONGEST_CHAIN, /* links in the longest */
    KV_CMP_BATCH_CAP,     /* the batch size the controller allows (none when it is off) */
    KV_CMP_COUNT
} kv_cmp_metric;

/* Short name of a figure ("out tok/s", "TTFT p50", ...) and its decimals. */
const char *kv_compare_metric_name(kv_cmp_metric k);
int kv_compare_metric_decimals(kv_cmp_metric k);
/* The figure k of m into *v: the same field `kvtop bench` prints for it
 * (TTFT from the exact percentiles, utilisation as a percentage). Returns
 * 1, or 0 when m has no value for it yet (no TTFT sample; *v is 0). */
int kv_compare_metric(const kv_metrics_summary *m, kv_cmp_metric k, double *v /* OUT: */);
/* The ratio of a run's figure to the first run's, as bench prints it
 * (v / v0). Returns 1 with *ratio set, or 0 when there is none (either
 * figure missing, or v0 == 0). */
int kv_compare_ratio(const kv_metrics_summary *m0, const kv_metrics_summary *m, kv_cmp_metric k,
                     double *ratio /* OUT: */);

#endif
