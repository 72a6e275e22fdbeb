/* source_internal.h - the source struct its files share (source.c: thread,
 * detection, the kvtop stream, control; source_metrics.c: the metrics
 * adapters). Private to tui/source*.c. */
#ifndef KV_TUI_SOURCE_INTERNAL_H
#define KV_TUI_SOURCE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "http_client.h"
#include "source.h"

#define SOURCE_CTL_CAP 8

typedef struct source_ctl {
    char action[16];
    int delay_ms;
} source_ctl;

struct kv_source {
    char url[512];
    char key[512];
    kv_source_kind want;        /* as given (AUTO: detect) */
    int interval_ms;            /* as given; <= 0: the kind's default */
    pthread_t thread, ctl_thread;
    int started;                /* bool: both threads run */
    atomic_int stop;
    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t cv;          /* the control queue changed, or stop */
    kv_snapshot *pub;           /* the newest complete snapshot */
    uint64_t seq;               /* bumped with every new pub */
    kv_source_status st;
    source_ctl ctl[SOURCE_CTL_CAP];
    int n_ctl;
    /* the source thread's own (no lock) */
    kv_snapshot *cur;           /* what frames are parsed into */
    void *adapter;              /* source_metrics.c's state */
    double slots_t;             /* monotonic time of the last /slots answer */
};

/* Options for a call to this source (its key, its stop flag). */
kv_http_opts source_opts(kv_source *s);
/* Counts a request in the status. */
void source_count_request(kv_source *s);
/* Publishes s->cur (copy under the lock) with the fleet row from it (a
 * kvtop source) or from s->st.m (a metrics one); marks the source up. */
void source_publish(kv_source *s);
/* Records a failure (marks it down) / a rejected frame or line. */
void source_set_error(kv_source *s, const char *msg);
void source_reject(kv_source *s, uint64_t n, const char *msg);
/* Sleeps ms, waking early on stop; returns 1 when stopping. */
int source_sleep(kv_source *s, int ms);

/* ---- source_metrics.c ---- */

/* Detects the kind from /metrics, /props and /slots (after /kvtop/v1/snapshot
 * said no). The kind, or AUTO when nothing answered. */
kv_source_kind source_metrics_detect(kv_source *s);
/* One poll of a metrics source: fetches, parses and publishes. 0 or an
 * error (the source is then marked down). */
int source_metrics_poll(kv_source *s);
void source_metrics_free(kv_source *s);

#endif
