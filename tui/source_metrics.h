/* source_metrics.h - the metrics adapters of `kvtop attach`: one scrape of
 * a vLLM, SGLang, llama-server or TGI /metrics (and llama-server's /slots)
 * into kv_remote_metrics, with rates from counter deltas and P50/P90/P99
 * from histogram bucket deltas over a sliding window. Pure functions of the
 * text and the time, so the fixtures test them without a server; the
 * source thread (source.c) fetches and calls them. No curses here. */
#ifndef KV_TUI_SOURCE_METRICS_H
#define KV_TUI_SOURCE_METRICS_H

#include <stddef.h>

#include "../engine/prom_text.h"
#include "source.h"

typedef struct kv_metrics_adapter kv_metrics_adapter;

/* An adapter for kind (vllm, sglang, llamacpp, tgi) keeping window_s
 * seconds of scrapes. NULL for another kind or out of memory. */
kv_metrics_adapter *kv_metrics_adapter_new(kv_source_kind kind, double window_s);
void kv_metrics_adapter_free(kv_metrics_adapter *a); /* NULL is a no-op */

/* Reads the scrape text[0..len) taken at t_s (seconds, increasing) into m:
 * gauges as they are, rates and percentiles over the window (valid once
 * two scrapes are in it). Bits of m->have say what the text held. Returns
 * the number of malformed lines (skipped), or KV_ERR_NOMEM; *first_bad
 * (cap bytes, may be NULL) gets the first one's line and reason. */
int kv_metrics_adapter_feed(kv_metrics_adapter *a, const char *text, size_t len, double t_s,
                            kv_remote_metrics *m /* OUT: */, char *first_bad /* OUT: may be NULL */, size_t cap);

/* The kind a /metrics text belongs to by its prefixes, or AUTO. */
kv_source_kind kv_metrics_detect_kind(const char *text, size_t len);

/* llama-server's /slots (a JSON array) into out (at most cap rows).
 * Returns the rows, or KV_ERR_FORMAT with err (not an array, a row that is
 * not an object or has an id of the wrong type). */
int kv_metrics_parse_slots(const char *text, size_t len, kv_source_slot *out /* OUT: (cap) */, int cap,
                           kv_err *err);

/* Tokens decoded per second between two /slots answers dt_s apart: a slot
 * on the same task adds n_decoded - its earlier n_decoded, a slot on a new
 * task its whole n_decoded (what a task decoded and finished between the
 * two is missed). Live, where llama.cpp's counters move only when a
 * request ends. 0 when dt_s <= 0. */
double kv_metrics_slots_rate(const kv_source_slot *prev, int n_prev, const kv_source_slot *cur, int n_cur, double dt_s);

/* Copies what maps onto the engine snapshot: the latency stats (ms) of
 * metrics, the token rates, the prefix hit rate, preemptions, speculative
 * acceptance, and the KV cache in use as blocks_used / blocks_free (vLLM:
 * its usage fraction of cache_config_info's blocks; SGLang: tokens, with
 * block_size 1). The block map stays empty (n_blocks 0): no adapter knows
 * physical blocks. */
void kv_metrics_to_snapshot(const kv_remote_metrics *m, kv_snapshot *s /* IN/OUT */);
/* llama-server's busy slots into s as request rows (id: the slot's task,
 * tokens decoded, the limit where the slot says) and the running queue, so
 * a recording (F7) and its replay show them. 0 or KV_ERR_NOMEM (s then has
 * no rows). */
int kv_metrics_slots_to_snapshot(const kv_source_slot *slots, int n, kv_snapshot *s /* IN/OUT */);

#endif
