/* config.h - every setting a run needs, as plain data. profiles/ fills it
 * from YAML (with file:line:column errors); the engine, the benchmark and the
 * TUI read it. No parsing here: kv_config_default() gives the defaults and
 * kv_config_validate() the range checks shared by every front end. */
#ifndef KV_CONFIG_H
#define KV_CONFIG_H

#include <stdint.h>

#include "../base/common.h"
#include "../kernels/backend.h"

#define KV_PATH_MAX 1024

typedef enum kv_layout { KV_LAYOUT_PAGED = 0, KV_LAYOUT_CONTIGUOUS = 1 } kv_layout;
typedef enum kv_policy { KV_POLICY_CONTINUOUS = 0, KV_POLICY_STATIC = 1 } kv_policy;
typedef enum kv_preempt { KV_PREEMPT_RECOMPUTE = 0, KV_PREEMPT_SWAP = 1 } kv_preempt;
typedef enum kv_spec_method {
    KV_SPEC_OFF = 0,
    KV_SPEC_DRAFT_MODEL = 1,
    KV_SPEC_SELF = 2,
    KV_SPEC_NGRAM = 3
} kv_spec_method;
typedef enum kv_dist_kind {
    KV_DIST_FIXED = 0,    /* always `value` */
    KV_DIST_UNIFORM = 1,  /* integer uniform in [min, max] */
    KV_DIST_LOGNORMAL = 2 /* exp(N(log(mean) - sigma^2/2, sigma)), clamped to [min, max] */
} kv_dist_kind;
/* Failure-mode guards (issue 17): how admission sizes a request, which
 * running request preemption takes, and the waiting queue's order. */
typedef enum kv_admission {
    KV_ADMIT_GREEDY = 0,     /* the prompt's blocks only (vLLM's default): output grows into what is free */
    KV_ADMIT_MAX_TOKENS = 1, /* prompt + max_tokens reserved up front: never preempted for growth */
    KV_ADMIT_QUANTILE = 2    /* prompt + a quantile of the finished requests' output lengths */
} kv_admission;
typedef enum kv_victim {
    KV_VICTIM_NEWEST = 0,    /* lowest priority, then the latest arrival */
    KV_VICTIM_LEAST_WORK = 1 /* lowest priority, then the fewest computed tokens (least to redo) */
} kv_victim;
typedef enum kv_order {
    KV_ORDER_FCFS = 0,       /* priority, then arrival */
    KV_ORDER_SHORT_FIRST = 1 /* priority, then the shortest job (prompt + max_tokens), then arrival */
} kv_order;
typedef enum kv_arrival {
    KV_ARRIVAL_POISSON = 0, /* rate requests/s */
    KV_ARRIVAL_BURST = 1,   /* all at t = 0 */
    KV_ARRIVAL_CLOSED = 2   /* closed loop: `concurrency` requests in flight */
} kv_arrival;

/* Sampling parameters (also per request). temperature 0 = greedy. */
typedef struct kv_sampling {
    float temperature;    /* >= 0 */
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off; (0, 1] */
    float min_p;          /* 0 = off; [0, 1) */
    float repeat_penalty; /* 1 = off; > 0 */
    int repeat_last_n;    /* tokens the penalty looks back over */
    uint64_t seed;
} kv_sampling;

typedef struct kv_dist {
    kv_dist_kind kind;
    double value; /* fixed */
    double min, max;
    double mean, sigma; /* lognormal: mean of the distribution and sigma of log */
} kv_dist;

typedef struct kv_config {
    struct {
        char path[KV_PATH_MAX];      /* GGUF or llama2.c .bin; relative to the working dir */
        char tokenizer[KV_PATH_MAX]; /* llama2.c tokenizer file; "" for GGUF */
    } model;
    int threads;           /* 0 = all cores */
    char backend[16];      /* "cpu", "cuda", "sim" */
    char sim_device[32];   /* sim backend: device to model ("h100", "a100", ...) */
    int sim_clock;         /* bool, sim backend: the engine's clock is the simulated device's */
    struct {
        int block_size;          /* tokens per block, default 16 */
        uint64_t memory;         /* KV budget in bytes (0: use blocks) */
        int blocks;              /* number of blocks (0: derive from memory) */
        kv_cache_dtype dtype;
        int prefix_sharing;      /* bool */
        kv_layout layout;
        uint64_t swap_memory;    /* host swap pool bytes (0 = none) */
        int window_release;      /* bool: sliding-window layers keep K/V only for blocks inside some
                                    holder's window (engine/kv_cache_window.c), default on */
    } kv;
    struct {
        uint64_t budget;         /* weights + activations + KV in bytes; the KV cache gets what the
                                    rest leaves (overrides kv.memory; 0 = off) */
    } memory;
    struct {
        kv_policy policy;
        int max_seqs;            /* KV_KEY_AUTO_VALUE (0) = auto: the batch is sized to hold a TPOT
                                    target (kv_sched_params_from_config says which); the engine's copy
                                    holds the resolved ceiling (KV_MAX_SEQS_AUTO_CEIL) */
        int max_batched_tokens;
        int prefill_chunk;       /* tokens per prefill chunk */
        kv_preempt preemption;
        double max_wait_ms;      /* starvation guard */
        int max_seq_len;         /* 0 = model context length */
        /* failure-mode guards (engine/sched_guard.c, sched_batch.c) */
        double watermark;        /* fraction of blocks admission leaves free for running requests' growth */
        kv_admission admission;  /* how many blocks a request must find free to be admitted */
        double admission_quantile; /* admission quantile: the output-length quantile reserved */
        kv_victim preempt_victim;/* which running request preemption takes */
        kv_order order;          /* waiting queue order */
        double target_tpot_ms;   /* > 0: the running batch is sized to hold this step time (max_seqs caps it) */
    } scheduler;
    kv_sampling sampling;
    struct {
        kv_spec_method method;
        int k;                   /* drafted tokens per step */
        int draft_layers;        /* self: layers used by the draft */
        char draft_model[KV_PATH_MAX];
        float min_acceptance;    /* below: plain decode for a while */
        int adaptive;            /* bool: k follows recent acceptance */
        int ngram_n;             /* ngram: match length */
    } spec;
    struct {
        double ttft_ms;          /* 0 = no bound */
        double tpot_ms;
    } sla;
    struct {
        int requests;
        kv_arrival arrival;
        double rate;             /* poisson: requests/s */
        int concurrency;         /* closed loop */
        kv_dist prompt_len;      /* tokens */
        kv_dist output_len;      /* tokens */
        int system_prompt_len;   /* tokens of a shared system prompt */
        double system_prompt_fraction; /* fraction of requests that use it */
        char prompts_file[KV_PATH_MAX]; /* JSONL {"prompt": ...}; overrides synthetic prompts */
        uint64_t seed;
        int ignore_eos;          /* bool: generate exactly output_len tokens */
        int sessions;            /* TUI: background sessions injected by the load key */
        /* a second request class mixed in (issue 17's starvation demo) */
        double short_fraction;   /* fraction of requests of the short class; 0 = one class */
        kv_dist short_prompt_len;/* the short class's prompt tokens */
        kv_dist short_output_len;/* the short class's output tokens */
        int short_priority;      /* the short class's request priority (the long class has 0) */
    } workload;
    struct {
        int fps;                 /* frames per second */
        char theme[16];          /* "auto", "mono" */
        int step_delay_ms;       /* slow motion */
        int show_token_source;   /* bool: color tokens by how they were produced */
    } ui;
    struct {                     /* kvtop serve: the HTTP front end (server/) */
        char host[64];           /* listen address (numeric IPv4 or IPv6) */
        int port;                /* 0 = any free port (printed at start) */
        char api_key[128];       /* "" = no key (KVTOP_API_KEY and --api-key override) */
        int max_connections;     /* open connections at once; more are refused */
        uint64_t max_body;       /* request body bytes; larger gets 413 */
        int max_queue;           /* requests left waiting in the engine beyond its free batch slots; more get 429 */
        int header_timeout_ms;   /* a request's headers must arrive within this */
        int idle_timeout_ms;     /* a connection silent this long is closed */
        char metrics_prefix[16]; /* Prometheus names: "kvtop" (kvtop:...) or "vllm" (vllm:...) */
        int auth_health;         /* bool: /health needs the key too */
        int auth_metrics;        /* bool: /metrics needs the key too */
        int shutdown_grace_ms;   /* on SIGINT/SIGTERM, in-flight requests get this long before they are cancelled */
    } server;
    struct {                     /* synthetic models on the sim backend (engine/synthetic.h, issue 16) */
        char synthetic[32];      /* model.synthetic: a shape of the table, "custom", or "" = off */
        char dtype[16];          /* model.dtype: weight format of a synthetic model */
        int layers, dim, heads, kv_heads, head_dim, ffn_dim, vocab, context, experts, experts_used;
                                 /* model.<shape key>: override the table's shape; 0 = the table's */
        int tp, pp, ep;          /* tensor / pipeline / expert parallel degrees (devices = tp * pp * ep...) */
        double ep_skew;          /* expert routing skew: the busiest expert device gets (1 + skew) x its share */
        int microbatches;        /* pipeline: micro-batches per step; 0 = pp */
        int cuda_graphs;         /* bool: one graph launch per step instead of one launch per op */
        double memory_utilization; /* fraction of each device's memory kvtop may use (0, 1] */
        uint64_t reserve;        /* bytes per device for the runtime (context, workspaces) */
        double api_price_per_mtok; /* $ per million output tokens of an API, for the crossover; 0 = none */
        double spec_acceptance;  /* synthetic speculative decoding: P(a draft token is accepted) */
        uint64_t device_memory;  /* > 0: override the device's memory (bytes) */
        double device_bandwidth; /* > 0: override its memory bandwidth (GB/s) */
        double device_tflops;    /* > 0: override its dense BF16 peak (TFLOP/s) */
        double device_usd_per_hour; /* > 0: override its price */
        double storage_bandwidth; /* GB/s the weights load from at a cold start */
        int disaggregated;       /* bool: separate prefill and decode pools */
        int prefill_devices;     /* disaggregated: devices (of tp each) in the prefill pool */
        int host_logits;         /* bool: logits go to the host each step (as with the CPU-computed sim) */
    } sim;
} kv_config;

/* The defaults every profile starts from. */
void kv_config_default(kv_config *c);
/* Range and consistency checks; on error fills err naming the key
 * ("kv.block_size must be in [1, 1024]") and returns KV_ERR_INVAL. */
int kv_config_validate(const kv_config *c, kv_err *err);
/* scheduler.max_seqs as a count: auto gives its ceiling (what buffers
 * sized per sequence are sized for). */
int kv_config_max_seqs(const kv_config *c);
/* The batch size follows the controller (scheduler.target_tpot_ms > 0, or
 * max_seqs auto). */
int kv_config_batch_dynamic(const kv_config *c);


/* ---- The key table ------------------------------------------------------
 * Every setting by its dotted name ("kv.block_size"), with its type, its
 * place in kv_config and its allowed range. The YAML loader, --set, --help,
 * the config dump and kv_config_validate() all walk this one table, so they
 * cannot disagree. Values are parsed from text here (no YAML): the loader
 * hands over scalar text and adds file:line:column to the messages. */
typedef enum kv_key_type {
    KV_KEY_INT = 0,  /* int, decimal */
    KV_KEY_U64,      /* uint64_t, decimal (seeds) */
    KV_KEY_SIZE,     /* uint64_t bytes: 123, 64K, 256MiB, 1.5GiB, 512KB (KB/MB/GB = 1000^n,
                        K/M/G and KiB/MiB/GiB = 1024^n) */
    KV_KEY_DOUBLE,   /* double */
    KV_KEY_FLOAT,    /* float */
    KV_KEY_BOOL,     /* int 0/1: true|false|yes|no|on|off|1|0 */
    KV_KEY_STRING,   /* char[size]; `names`, when set, lists the allowed values */
    KV_KEY_ENUM,     /* an enum stored as int; names[value] is its name */
    KV_KEY_DIST      /* kv_dist: an integer (fixed) or a mapping {dist, value, min, max, mean, sigma} */
} kv_key_type;

enum {
    KV_KEY_MIN_OPEN = 1u << 0, /* range excludes min: (min, max] */
    KV_KEY_MAX_OPEN = 1u << 1, /* range excludes max: [min, max) */
    KV_KEY_NONEMPTY = 1u << 2, /* STRING must not be empty */
    KV_KEY_SECRET = 1u << 3,   /* STRING holding a secret: dumps, trace headers and reports show
                                  KV_SECRET_SHOWN for a set value (kv_config_key_shown) */
    KV_KEY_AUTO = 1u << 4      /* INT that also takes the word "auto", stored as KV_KEY_AUTO_VALUE */
};

/* What an INT key with KV_KEY_AUTO holds for "auto" (outside its range). */
#define KV_KEY_AUTO_VALUE 0

/* scheduler.max_seqs: auto sizes the batch up to this many sequences (and
 * no more than max_batched_tokens: each needs a token a step). */
#define KV_MAX_SEQS_AUTO_CEIL 256

/* What a dump prints for a set secret; as a value it is refused, so a
 * redacted dump loaded back fails instead of making "***" the key. */
#define KV_SECRET_SHOWN "***"

typedef struct kv_config_key {
    const char *path;         /* dotted name, e.g. "kv.block_size" */
    kv_key_type type;
    size_t offset;            /* offsetof(kv_config, field) */
    size_t size;              /* STRING: buffer bytes including the NUL */
    double min, max;          /* numbers and sizes; DIST: range of value/min/max/mean */
    unsigned flags;           /* KV_KEY_* flags above */
    const char *const *names; /* ENUM names by value / STRING choices; NULL-terminated */
    const char *doc;          /* one line for --help */
} kv_config_key;

/* The whole table (borrowed, static); *n gets its length. */
const kv_config_key *kv_config_keys(int *n);
/* The key with exactly this dotted path, or NULL. */
const kv_config_key *kv_config_key_find(const char *path);
/* "integer", "size", "enum", ... for --help and error messages. */
const char *kv_config_key_type_name(kv_key_type t);
/* Parses `text` as the value of key k and stores it in c, range checked.
 * On error returns KV_ERR_INVAL with err naming the key ("kv.block_size:
 * expected an integer, got 'abc'") and leaves c unchanged. A DIST key takes
 * a plain integer here (a fixed distribution). */
int kv_config_key_parse(const kv_config_key *k, kv_config *c, const char *text, kv_err *err);
/* The sub-fields of a DIST value, NULL-terminated: dist, value, min, max, mean, sigma. */
const char *const *kv_config_dist_fields(void);
/* The KV dtype names the table's dtype keys take (their kv_config_key names
 * point here); NULL-terminated. */
const char *const *kv_config_dtype_names(void);
/* Parses one sub-field (`field` from kv_config_dist_fields()) of DIST key k
 * into d; same contract as kv_config_key_parse (d unchanged on error). */
int kv_config_dist_parse(const kv_config_key *k, kv_dist *d, const char *field, const char *text,
                         kv_err *err);
/* Range check of one key's current value in c (what validate runs per key). */
int kv_config_key_check(const kv_config_key *k, const kv_config *c, kv_err *err);
/* Writes the value of k in c as text that kv_config_key_parse reads back
 * (strings raw, unquoted; DIST as a flow mapping or a plain integer).
 * Returns the snprintf-style length. */
int kv_config_key_format(const kv_config_key *k, const kv_config *c, char *buf, size_t cap);
/* The string a dump or report shows for STRING key k in c: its value, or
 * KV_SECRET_SHOWN when k is KV_KEY_SECRET and set (an unset one shows
 * ""). Borrowed from c or static. Every writer of configurations that
 * leave the process (kvtop keys, bench reports, trace headers) uses it. */
const char *kv_config_key_shown(const kv_config_key *k, const kv_config *c);

#endif
