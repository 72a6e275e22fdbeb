/* prom_text.h - a reader of the Prometheus text exposition format (what
 * vLLM, SGLang, llama-server, TGI and kvtop serve answer on /metrics), and
 * histogram percentiles over bucket deltas, for `kvtop attach`'s metrics
 * adapters. The text comes from the network: a malformed line is skipped
 * and counted (the first one kept with its line number), never fatal. */
#ifndef KV_PROM_TEXT_H
#define KV_PROM_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"

#define KV_PROM_MAX_LABELS 12
#define KV_PROM_MAX_SAMPLES 100000 /* more lines are counted as rejected */

typedef enum kv_prom_type {
    KV_PROM_UNTYPED = 0, KV_PROM_COUNTER, KV_PROM_GAUGE, KV_PROM_HISTOGRAM, KV_PROM_SUMMARY
} kv_prom_type;

typedef struct kv_prom_label {
    char name[64];
    char value[160];            /* unescaped; cut at 159 bytes */
} kv_prom_label;

typedef struct kv_prom_sample {
    char name[160];             /* as written, with any _bucket/_sum/_count/_total suffix */
    kv_prom_type type;          /* its family's # TYPE (a _bucket of histogram h is HISTOGRAM) */
    int n_labels;
    kv_prom_label labels[KV_PROM_MAX_LABELS];
    double value;               /* may be NaN or +-Inf as the text says */
} kv_prom_sample;

typedef struct kv_prom {
    kv_prom_sample *samples;    /* (n) in text order, owned */
    int n, cap;
    uint64_t lines;             /* lines read (blank and comment lines included) */
    uint64_t rejected;          /* malformed lines skipped */
    int first_bad_line;         /* 1-based line of the first rejected one, 0 none */
    char first_bad[200];        /* what was wrong with it */
} kv_prom;

/* Parses text[0..len) into p (emptied first; its array reused). Returns 0
 * (bad lines are counted in p->rejected, not errors) or KV_ERR_NOMEM. */
int kv_prom_parse(const char *text, size_t len, kv_prom *p /* IN/OUT */, kv_err *err);
void kv_prom_free(kv_prom *p); /* frees the array; p may be reused */

/* The value of label `name` of s, or NULL. */
const char *kv_prom_label_of(const kv_prom_sample *s, const char *name);
/* Sum of every sample called name (over all label sets: engines, models);
 * *found (may be NULL) says whether there was any. NaN values are skipped. */
double kv_prom_sum(const kv_prom *p, const char *name, int *found /* OUT: may be NULL */);
/* The same, only samples whose label `label` equals value. */
double kv_prom_sum_where(const kv_prom *p, const char *name, const char *label, const char *value,
                         int *found /* OUT: may be NULL */);
/* 1 when some sample's name starts with prefix. */
int kv_prom_has_prefix(const kv_prom *p, const char *prefix);

/* ---- histograms ---- */

#define KV_HIST_MAX_BUCKETS 64

/* A cumulative histogram: le[i] upper bounds (ascending, the last +Inf),
 * cum[i] observations <= le[i]. */
typedef struct kv_hist {
    int n;                      /* buckets, 0: none */
    double le[KV_HIST_MAX_BUCKETS];
    double cum[KV_HIST_MAX_BUCKETS];
    double count, sum;
} kv_hist;

/* Gathers histogram `base` (samples base_bucket{le=...}, base_count,
 * base_sum) summed over its other label sets. 0, or KV_ERR_FORMAT when it
 * is absent, has no +Inf bucket, too many buckets, or counts that fall as
 * le grows. */
int kv_prom_histogram(const kv_prom *p, const char *base, kv_hist *out /* OUT: */);
/* cur - old bucket by bucket (observations between the two scrapes). When
 * the layouts differ or a count fell (the server restarted), cur itself. */
void kv_hist_delta(const kv_hist *cur, const kv_hist *old, kv_hist *out /* OUT: */);
/* The q-quantile (0 < q < 1) by linear interpolation inside the bucket
 * that holds rank q*count, as Prometheus' histogram_quantile does: the
 * first bucket's lower bound is 0, and a rank in the +Inf bucket gives the
 * largest finite bound. NaN when the histogram holds no observation. */
double kv_hist_quantile(const kv_hist *h, double q);

/* A sliding window of scrapes of one histogram: percentiles over what was
 * observed in the last window_s seconds. */
#define KV_HIST_WINDOW_CAP 128
typedef struct kv_hist_window {
    double window_s;
    int head, n;                /* ring of KV_HIST_WINDOW_CAP */
    double t[KV_HIST_WINDOW_CAP];
    kv_hist h[KV_HIST_WINDOW_CAP];
} kv_hist_window;

void kv_hist_window_init(kv_hist_window *w, double window_s);
/* Adds the scrape taken at time t_s (seconds, increasing). */
void kv_hist_window_push(kv_hist_window *w, const kv_hist *h, double t_s);
/* The observations of the window: newest scrape minus the oldest one still
 * inside it (no observation with fewer than two scrapes). */
void kv_hist_window_delta(const kv_hist_window *w, kv_hist *out /* OUT: */);

#endif
