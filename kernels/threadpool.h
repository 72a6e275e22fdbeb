/* threadpool.h - a fixed pool of worker threads for data-parallel kernels.
 * One dispatch runs fn(ctx, i, n) for every i in [0, n) and returns when all
 * are done; the caller's thread runs i = 0 and any share no worker took.
 * Dispatch latency is a few microseconds because idle workers spin briefly
 * before they sleep. */
#ifndef KV_THREADPOOL_H
#define KV_THREADPOOL_H

typedef struct kv_threadpool kv_threadpool;

/* The work of one dispatch: ith in [0, nth), nth = kv_threadpool_size(). */
typedef void (*kv_task_fn)(void *ctx, int ith, int nth);

/* Starts n_threads - 1 workers (the caller is thread 0). n_threads <= 0
 * means one per online core. Returns NULL when threads or memory cannot be
 * had; nothing is left running then. */
kv_threadpool *kv_threadpool_new(int n_threads);
/* Stops and joins the workers. NULL is a no-op. Must not race a run. */
void kv_threadpool_free(kv_threadpool *p);
/* Number of threads a run uses, the caller included (>= 1). */
int kv_threadpool_size(const kv_threadpool *p);
/* Runs fn(ctx, i, n) once for each i in [0, n) and returns when every call
 * has returned; writes made by any fn are visible to the caller afterwards.
 * i = 0 runs on the calling thread; every other i runs on whichever thread
 * claims it first, the caller included (it takes the shares of workers the
 * OS has not scheduled yet), so one thread may run several i in turn and fn
 * must never wait for another share. One caller at a time per pool; fn must
 * not call kv_threadpool_run on the same pool. p == NULL runs fn(ctx, 0, 1). */
void kv_threadpool_run(kv_threadpool *p, kv_task_fn fn, void *ctx);

#endif
