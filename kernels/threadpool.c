/* threadpool.c - worker threads that wait for a generation counter to move.
 * A dispatch publishes (fn, ctx) and n shares, bumps the counter and wakes
 * sleepers; every thread, the caller included, then claims shares until none
 * is left, so a worker the OS has not scheduled yet (other processes on a
 * busy machine) delays nothing: the caller runs its share instead. Idle
 * workers spin on the counter for a short while (so back-to-back kernels of
 * a decode step cost a few microseconds each) and then sleep on a futex
 * (Linux) or a condition variable (elsewhere), so an idle engine burns no CPU. */
#include "threadpool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "../base/common.h"

/* How long an idle thread spins before it sleeps. NOTE: 200 us covers the gap
 * between the kernels of one forward pass and between engine steps, yet an
 * idle engine stops using the CPU within a fraction of a millisecond. */
#define KV_POOL_SPIN_NS 200000u
/* Spinning threads yield every this many + 1 pauses (a few microseconds).
 * NOTE: on a machine busier than it has cores, the scheduler may put the
 * caller and a worker on one core; a thread spinning there for the thread it
 * waits for would hold that core for its whole spin. A yield per few
 * microseconds costs little when the cores are free and hands the core
 * over when they are not (measured on a 2-core box with about 4 runnable
 * threads: 2-thread decode of a 110M q8_0 model went from 36% to 57% of the
 * bandwidth ceiling). */
#define KV_POOL_YIELD_MASK 63u
#define KV_POOL_MAX_THREADS 512

typedef struct kv_worker {
    kv_threadpool *pool;
    int ith;       /* 1 .. n-1 (names the thread; shares are claimed, not assigned) */
    pthread_t tid;
} kv_worker;

struct kv_threadpool {
    int n;              /* threads per run, the caller included */
    int spin;           /* 0 when oversubscribed: spinning would starve workers */
    int n_started;      /* workers actually running (n - 1 after init) */
    kv_worker *workers; /* (n - 1) */
    kv_task_fn fn;      /* the current task; written before gen moves */
    void *ctx;
#ifndef __linux__
    pthread_mutex_t mu; /* guards sleeping on gen / done */
    pthread_cond_t cv;
#endif
    /* Written by the caller, read by every worker: own cache line. */
    _Alignas(64) atomic_uint gen; /* dispatch generation (futex word) */
    atomic_int n_sleeping;        /* workers parked on gen */
    atomic_int stop;              /* set once, by kv_threadpool_free */
    /* Claimed by every thread: (generation << 32) | next unclaimed share. */
    _Alignas(64) atomic_ullong claim;
    /* Written by the workers, read by the caller: own cache line. */
    _Alignas(64) atomic_uint done; /* shares finished this generation (futex word) */
    atomic_int caller_sleeping;    /* caller parked on done */
    unsigned seq;                  /* the caller's generation counter */
};

/* Claims the next share of generation g: its index, or -1 when every share
 * of g is taken (or g is over). A successful claim keeps g running until the
 * share is reported done, so fn and ctx stay valid while it runs. */
static int claim_share(kv_threadpool *p, unsigned g) {
    unsigned long long c = atomic_load(&p->claim);
    for (;;) {
        if ((unsigned)(c >> 32) != g || (c & 0xFFFFFFFFu) >= (unsigned)p->n) return -1;
        if (atomic_compare_exchange_weak(&p->claim, &c, c + 1)) return (int)(c & 0xFFFFFFFFu);
    }
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Sleeps while *a == expect (may return early; callers loop). */
static void park(kv_threadpool *p, atomic_uint *a, unsigned expect) {
#ifdef __linux__
    (void)p;
    syscall(SYS_futex, (unsigned *)a, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
#else
    pthread_mutex_lock(&p->mu);
    while (atomic_load(a) == expect) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
#endif
}

/* Wakes everyone parked on a (after the caller changed *a). */
static void unpark_all(kv_threadpool *p, atomic_uint *a) {
#ifdef __linux__
    (void)p;
    syscall(SYS_futex, (unsigned *)a, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)a;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
#endif
}

/* Spins until pred says stop or the spin budget is spent. Returns 1 when the
 * predicate held (value in *out). */
static int spin_until_gen_moves(kv_threadpool *p, unsigned old, unsigned *out) {
    if (!p->spin) {
        for (int i = 0; i < 4; i++) {
            unsigned v = atomic_load_explicit(&p->gen, memory_order_acquire);
            if (v != old) {
                *out = v;
                return 1;
            }
            sched_yield();
        }
        return 0;
    }
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        unsigned v = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (v != old) {
            *out = v;
            return 1;
        }
        cpu_relax();
        if ((i & KV_POOL_YIELD_MASK) == 0) {
            /* a thread of ours may be waiting for this core (see KV_POOL_YIELD_MASK) */
            sched_yield();
            uint64_t t = kv_now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > KV_POOL_SPIN_NS)
                return 0;
        }
    }
}

static void *worker_main(void *arg) {
    kv_worker *w = arg;
    kv_threadpool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        if (!spin_until_gen_moves(p, seen, &g)) {
            /* Dekker pair with the caller: announce, then re-check gen. */
            atomic_fetch_add(&p->n_sleeping, 1);
            while ((g = atomic_load(&p->gen)) == seen) park(p, &p->gen, seen);
            atomic_fetch_sub(&p->n_sleeping, 1);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        int s;
        while ((s = claim_share(p, g)) >= 0) {
            p->fn(p->ctx, s, p->n);
            if (atomic_fetch_add(&p->done, 1) + 1 == (unsigned)p->n && atomic_load(&p->caller_sleeping))
                unpark_all(p, &p->done);
        }
    }
    return NULL;
}

static int online_cpus(void) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)KV_MIN(c, (long)KV_POOL_MAX_THREADS) : 1;
}

static void stop_workers(kv_threadpool *p) {
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    unpark_all(p, &p->gen);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].tid, NULL);
    p->n_started = 0;
}

kv_threadpool *kv_threadpool_new(int n_threads) {
    int ncpu = online_cpus();
    int n = n_threads > 0 ? n_threads : ncpu;
    if (n > KV_POOL_MAX_THREADS) return NULL;
    size_t sz = (sizeof(kv_threadpool) + 63) & ~(size_t)63;
    kv_threadpool *p = aligned_alloc(64, sz);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->n = n;
    p->spin = n <= ncpu;
    atomic_init(&p->gen, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->caller_sleeping, 0);
#ifndef __linux__
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
#endif
    if (n > 1) {
        p->workers = calloc((size_t)n - 1, sizeof *p->workers);
        if (!p->workers) goto fail;
        for (int i = 0; i < n - 1; i++) {
            p->workers[i].pool = p;
            p->workers[i].ith = i + 1;
            if (pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i]) != 0) goto fail;
            p->n_started++;
        }
    }
    return p;
fail:
    kv_threadpool_free(p);
    return NULL;
}

void kv_threadpool_free(kv_threadpool *p) {
    if (!p) return;
    stop_workers(p);
#ifndef __linux__
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
#endif
    free(p->workers);
    free(p);
}

int kv_threadpool_size(const kv_threadpool *p) { return p ? p->n : 1; }

void kv_threadpool_run(kv_threadpool *p, kv_task_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    unsigned g = ++p->seq;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    /* share 0 is the caller's; seq_cst publishes fn, ctx and done with it */
    atomic_store(&p->claim, (unsigned long long)g << 32 | 1u);
    atomic_store(&p->gen, g);
    if (atomic_load(&p->n_sleeping) > 0) unpark_all(p, &p->gen);
    fn(ctx, 0, p->n);
    unsigned mine = 1;
    int s;
    while ((s = claim_share(p, g)) >= 0) {
        fn(ctx, s, p->n);
        mine++;
    }
    if (atomic_fetch_add(&p->done, mine) + mine == (unsigned)p->n) return;

    /* Wait for the shares workers claimed: spin first (they usually finish
     * together with us), then sleep on done. */
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->done, memory_order_acquire) == (unsigned)p->n) return;
        if (p->spin) {
            cpu_relax();
        } else {
            sched_yield();
        }
        if ((i & KV_POOL_YIELD_MASK) == 0) {
            if (p->spin) sched_yield();
            uint64_t t = kv_now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > KV_POOL_SPIN_NS)
                break;
        }
    }
    atomic_store(&p->caller_sleeping, 1);
    unsigned v;
    while ((v = atomic_load(&p->done)) != (unsigned)p->n) park(p, &p->done, v);
    atomic_store(&p->caller_sleeping, 0);
}
