/* bench_concurrent.c - `kvtop bench --compare ... --concurrent`: every
 * configuration at once, each run in its own thread on its own share of the
 * cores, exactly as the TUI's --compare splits them (bench.h). The point is
 * a reference for the live header: its throughput and TTFT ratios come from
 * engines that share the machine, which runs one after the other on all
 * cores do not reproduce. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/cpushare.h"
#include "bench.h"

/* The start line: every run waits at it until all have arrived (or given
 * up: a run that fails before it arrives without waiting). */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, n;
} gate;

typedef struct worker {
    const kv_config *cfg;
    kv_config pinned_cfg; /* cfg with threads capped at the share */
    kv_bench_result *out;
    kv_err *err;
    int rc;
    int at_gate;          /* bool: this run has arrived */
    gate *g;
    pthread_t th;
} worker;

static void arrive(worker *w, int wait) {
    gate *g = w->g;
    pthread_mutex_lock(&g->mu);
    if (!w->at_gate) {
        w->at_gate = 1;
        g->arrived++;
        pthread_cond_broadcast(&g->cv);
    }
    while (wait && g->arrived < g->n) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void on_ready(void *ctx) { arrive(ctx, 1); }

static void *work(void *arg) {
    worker *w = arg;
    kv_bench_opts o = {.on_ready = on_ready, .ready_ctx = w};
    w->rc = kv_bench_run(&w->pinned_cfg, &o, w->out, w->err);
    arrive(w, 0); /* a run that failed before the start releases the others */
    return NULL;
}

int kv_bench_run_concurrent(const kv_config *cfgs, int n, kv_bench_result *runs, int *rcs, kv_err *errs,
                            char (*cpus)[48]) {
    if (n < 1) return KV_ERR_INVAL;
    worker *ws = calloc((size_t)n, sizeof *ws);
    if (!ws) return KV_ERR_NOMEM;
    gate g = {.arrived = 0, .n = n};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    int ids[CPU_SETSIZE];
    int n_ids = kv_cpus_allowed(ids, CPU_SETSIZE);
    int started = 0, rc = 0;
    for (int j = 0; j < n; j++) {
        worker *w = &ws[j];
        w->cfg = &cfgs[j];
        w->pinned_cfg = cfgs[j];
        w->out = &runs[j];
        w->err = &errs[j];
        w->g = &g;
        cpu_set_t set;
        int cores = kv_cpu_share(ids, n_ids, j, n, &set, cpus[j], sizeof cpus[j]);
        if (w->pinned_cfg.threads <= 0 || w->pinned_cfg.threads > cores) w->pinned_cfg.threads = cores;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        /* unpinned when the mask cannot be set (the run still runs) */
        if (pthread_attr_setaffinity_np(&attr, sizeof set, &set) != 0) snprintf(cpus[j], sizeof cpus[j], "unpinned");
        int e = pthread_create(&w->th, &attr, work, w);
        pthread_attr_destroy(&attr);
        if (e) {
            rc = KV_ERR_BACKEND;
            break;
        }
        started++;
    }
    if (rc) {
        /* the runs already started must not wait for the ones never made */
        pthread_mutex_lock(&g.mu);
        g.n = started;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
    }
    for (int j = 0; j < started; j++) {
        pthread_join(ws[j].th, NULL);
        rcs[j] = ws[j].rc;
    }
    if (rc)
        for (int j = 0; j < started; j++) kv_bench_result_free(&runs[j]);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    free(ws);
    return rc;
}
