/* source.h - where the panels' snapshot comes from when kvtop attaches to
 * a server: a kvtop server's /kvtop/v1/stream (every panel at full
 * fidelity), or a metrics adapter that fills what another engine exports
 * (source_metrics.c) and marks the rest invalid. Each source runs its own
 * thread, so a slow or dead server never stalls drawing; the UI thread only
 * takes copies. No curses here. */
#ifndef KV_TUI_SOURCE_H
#define KV_TUI_SOURCE_H

#include <stdint.h>

#include "../base/common.h"
#include "../engine/engine.h"

typedef enum kv_source_kind {
    KV_SOURCE_AUTO = 0, /* detect from what the server answers */
    KV_SOURCE_KVTOP,
    KV_SOURCE_LLAMACPP,
    KV_SOURCE_VLLM,
    KV_SOURCE_SGLANG,
    KV_SOURCE_TGI,
    KV_SOURCE_KIND_COUNT
} kv_source_kind;

/* "auto", "kvtop", "llamacpp", "vllm", "sglang", "tgi". */
const char *kv_source_kind_name(kv_source_kind k);
/* 0, or KV_ERR_INVAL for an unknown name (*out unchanged). */
int kv_source_kind_parse(const char *s, kv_source_kind *out /* OUT: */);

/* What a panel value may lack: one bit per group of snapshot fields. A set
 * bit in kv_source_status.valid means the source fills that group; a clear
 * one is drawn as N/A with the kind's reason (kv_source_na_reason). */
typedef enum kv_source_field {
    KV_SF_QUEUES = 1 << 0,   /* running / waiting counts */
    KV_SF_REQUESTS = 1 << 1, /* per-request rows (state, tokens, wait reason) */
    KV_SF_BLOCKS = 1 << 2,   /* the physical block map and block tables */
    KV_SF_KV_USAGE = 1 << 3, /* blocks used / free (or a usage fraction) */
    KV_SF_PREFIX = 1 << 4,   /* prefix-cache hits */
    KV_SF_LATENCY = 1 << 5,  /* TTFT / TPOT / E2E percentiles */
    KV_SF_THROUGHPUT = 1 << 6,
    KV_SF_SPEC = 1 << 7,     /* speculative acceptance */
    KV_SF_STEPS = 1 << 8,    /* per-step records and decisions (the step log) */
    KV_SF_MEMORY = 1 << 9,   /* the memory breakdown */
    KV_SF_CONTROL = 1 << 10, /* pause / step / slow motion */
    KV_SF_ALL = (1 << 11) - 1
} kv_source_field;

/* One line saying why kind cannot show field ("vLLM exports no per-block
 * state"), or NULL when it can. */
const char *kv_source_na_reason(kv_source_kind kind, kv_source_field field);

/* One row per llama-server slot (its /slots). */
typedef struct kv_source_slot {
    int id;
    int busy;              /* bool: is_processing */
    int64_t task;          /* id_task, -1 none */
    int n_ctx;
    int n_decoded;         /* tokens decoded of the current task */
    int n_remaining;       /* tokens it may still decode, -1 unlimited */
    int speculative;       /* bool */
} kv_source_slot;
#define KV_SOURCE_MAX_SLOTS 64

/* What a metrics adapter read, each value with its bit in `have` (clear:
 * the server does not export it; drawn as N/A). Rates and percentiles are
 * over the last window (default 60 s) of scrapes, from counter and bucket
 * deltas. */
typedef enum kv_remote_bit {
    KV_RM_QUEUE = 1 << 0,     /* running, waiting */
    KV_RM_KV_USAGE = 1 << 1,  /* kv_usage */
    KV_RM_KV_TOKENS = 1 << 2, /* kv_used_tokens, kv_total_tokens */
    KV_RM_PREFIX = 1 << 3,    /* prefix_hit_rate */
    KV_RM_PREEMPT = 1 << 4,   /* preempt_per_s, preempt_total */
    KV_RM_TOKS = 1 << 5,      /* gen_tok_s, prompt_tok_s */
    KV_RM_TTFT = 1 << 6,      /* ttft_ms[] */
    KV_RM_ITL = 1 << 7,       /* itl_ms[] */
    KV_RM_E2E = 1 << 8,       /* e2e_ms[] */
    KV_RM_QUEUE_TIME = 1 << 9,/* queue_ms[] */
    KV_RM_SPEC = 1 << 10,     /* spec_accept (rate) */
    KV_RM_SPEC_LEN = 1 << 11, /* spec_accept_len */
    KV_RM_SPEC_POS = 1 << 12, /* spec_pos[] */
    KV_RM_CACHE_CFG = 1 << 13,/* block_size, num_blocks, cache_dtype */
    KV_RM_SLOTS = 1 << 14,    /* the slots rows of kv_source_status */
    KV_RM_BATCH = 1 << 15,    /* batch_size */
    KV_RM_WAIT_REASON = 1 << 16 /* wait_capacity, wait_deferred (vLLM) */
} kv_remote_bit;

typedef struct kv_remote_metrics {
    unsigned have;              /* kv_remote_bit */
    double running, waiting;    /* requests now */
    double kv_usage;            /* fraction of the KV cache in use, 0..1 */
    double kv_used_tokens, kv_total_tokens;
    double prefix_hit_rate;     /* fraction of prompt tokens served from the prefix cache */
    double preempt_per_s, preempt_total;
    double gen_tok_s, prompt_tok_s;
    double ttft_ms[3], itl_ms[3], e2e_ms[3], queue_ms[3]; /* P50, P90, P99 */
    double spec_accept;         /* accepted / drafted tokens */
    double spec_accept_len;     /* tokens per verify step */
    int n_spec_pos;
    double spec_pos[8];         /* acceptance per draft position */
    int block_size, num_blocks;
    char cache_dtype[24];
    double batch_size;
    double wait_capacity, wait_deferred; /* waiting for KV capacity / deferred by the scheduler */
    double window_s;            /* span the rates and percentiles cover so far */
} kv_remote_metrics;

/* One fleet row: the same few numbers for every kind (NAN: not known). */
typedef struct kv_source_summary {
    double running, waiting;    /* requests */
    double kv_pct;              /* KV cache in use, % */
    double tok_s;               /* output tokens per second */
    double ttft_p99_ms;
} kv_source_summary;

typedef struct kv_source_status {
    kv_source_kind kind;    /* detected (or given); AUTO until known */
    char url[512];          /* the base URL */
    char model[128];        /* from /v1/models; "" until known */
    int up;                 /* bool: the last request was answered */
    double last_ok_s;       /* monotonic seconds of the last good answer; 0 never */
    uint64_t frames;        /* snapshots taken in */
    uint64_t rejected;      /* frames or metric lines rejected as malformed */
    uint64_t requests;      /* HTTP requests sent (a stream counts once) */
    unsigned valid;         /* kv_source_field bits the source fills */
    char error[256];        /* the last failure ("" none) */
    char rejected_msg[256]; /* why the last rejected frame or line was rejected */
    char control_msg[160];  /* result of the last control request */
    kv_remote_metrics m;    /* metrics adapters (not kind kvtop) */
    kv_source_summary sum;  /* the fleet view's row */
    int n_slots;            /* llama-server: rows of slots[] */
    kv_source_slot slots[KV_SOURCE_MAX_SLOTS];
} kv_source_status;

typedef struct kv_source kv_source;

/* A source on base URL url (http:// or https://, no path needed) with API
 * key key (NULL: none; sent only to url), streaming (kvtop) or scraping
 * (metrics) every interval_ms (>= 20; <= 0: 100 ms for a kvtop stream,
 * 1000 ms for scrapes). NULL with err (a bad URL, out of memory). */
kv_source *kv_source_new(const char *url, const char *key, kv_source_kind kind, int interval_ms, kv_err *err);
/* Starts its thread. 0 or KV_ERR_NOMEM/KV_ERR_IO. */
int kv_source_start(kv_source *s);
/* Stops the thread (an HTTP call in flight is abandoned within ~100 ms),
 * joins it and frees. NULL is a no-op. */
void kv_source_free(kv_source *s);

/* When a snapshot newer than *seq came, copies it into out, sets *seq and
 * returns 1; otherwise (or with out NULL) 0, out untouched. st (may be NULL) gets the status
 * either way. KV_ERR_NOMEM when the copy failed. */
int kv_source_take(kv_source *s, kv_snapshot *out /* OUT: */, uint64_t *seq /* IN/OUT */,
                   kv_source_status *st /* OUT: may be NULL */);
/* Queues a control request for the source's worker: "pause", "resume",
 * "step", or "slow" with delay_ms. 0, or KV_ERR_UNSUPPORTED when the kind
 * has no control endpoint, or KV_AGAIN when the queue is full. The answer
 * lands in kv_source_status.control_msg. */
int kv_source_control(kv_source *s, const char *action, int delay_ms);

/* The base URL, its key and the model (borrowed; valid until
 * kv_source_free; model may change once, from "" to the served name). */
const char *kv_source_url(const kv_source *s);
const char *kv_source_key(const kv_source *s);
void kv_source_model(kv_source *s, char *out /* OUT: (cap) */, size_t cap);
kv_source_kind kv_source_kind_of(kv_source *s);

#endif
