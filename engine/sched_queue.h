/* sched_queue.h - the scheduler's queues as ordered structures, so that a
 * step costs what it touches rather than the queue's length: the waiting
 * queue kept in scheduling order (requests past the starvation guard
 * first, oldest first; then priority, higher first; then arrival), with
 * the requests added since the last ordering kept apart until the next,
 * and the running requests kept in victim order (lowest priority, newest
 * first). Internal to the scheduler (scheduler.c); no I/O, and after the
 * reserve calls nothing here allocates. */
#ifndef KV_SCHED_QUEUE_H
#define KV_SCHED_QUEUE_H

#include <stddef.h>

#include "scheduler.h"

/* Scheduling order of a and b at time now_ms (1: a first). guard: the
 * starvation guard applies (requests waiting longer than max_wait_ms,
 * when it is > 0, go first, oldest first, whatever their priority). A
 * total order: ties fall to the id. */
int kv_sq_before(double max_wait_ms, double now_ms, const kv_sreq *a, const kv_sreq *b, int guard);
/* Whether r is past the starvation guard at now_ms. */
static inline int kv_sq_starving(double max_wait_ms, double now_ms, const kv_sreq *r) {
    return max_wait_ms > 0 && now_ms - r->arrival_ms > max_wait_ms;
}

/* Waiting requests per priority (the queue's highest priority in O(1)). */
typedef struct kv_sq_prio {
    int prio;
    int n;
} kv_sq_prio;

/* The waiting queue: v[off .. off + n). The first n_sorted are in
 * scheduling order as of sort_ms, the first n_starv of those past the
 * guard then; the rest (added or preempted since) wait in the order they
 * came for the next kv_wq_order. */
typedef struct kv_wqueue {
    kv_sreq **v;        /* (cap) */
    int off, n, cap;
    int n_sorted, n_starv;
    double sort_ms;     /* the time of the last ordering */
    double max_wait_ms; /* the starvation guard; 0 = off */
    kv_sreq **tmp;      /* (cap_tmp) scratch for an ordering */
    int cap_tmp;
    kv_sq_prio *prios;  /* (cap_prios) by priority, ascending */
    int n_prios, cap_prios;
} kv_wqueue;

void kv_wq_init(kv_wqueue *q, double max_wait_ms);
void kv_wq_free(kv_wqueue *q);
/* Room for n_live requests and one priority more than held now, so that
 * the next push cannot fail. Returns 0 or KV_ERR_NOMEM (nothing changed). */
int kv_wq_reserve(kv_wqueue *q, int n_live);
/* Appends r to the requests waiting for the next ordering (room reserved). */
void kv_wq_push(kv_wqueue *q, kv_sreq *r);
/* Puts the queue in scheduling order at now_ms: requests that passed the
 * guard since the last ordering move up, the added ones are merged in.
 * Costs the requests that moved, not the queue (NOTE: plus a binary
 * search per distinct priority while the guard is on, and a move of the
 * requests between the places where several priorities' requests pass
 * the guard at once). A clock that went back orders everything again. */
void kv_wq_order(kv_wqueue *q, double now_ms);
/* Request i in the queue's order (0 <= i < n). */
static inline kv_sreq *kv_wq_at(const kv_wqueue *q, int i) { return q->v[q->off + i]; }
/* Removes request i; the rest keep their order. Costs min(i, n - i) moves. */
void kv_wq_remove_at(kv_wqueue *q, int i);
/* Removes r wherever it is (a binary search in the ordered part). Returns
 * 1 when it was queued, 0 when not. */
int kv_wq_remove(kv_wqueue *q, const kv_sreq *r);
/* The highest priority waiting; INT32_MIN when the queue is empty. */
int kv_wq_max_prio(const kv_wqueue *q);
/* Checks the queue's invariants (order, the guard's split, the priority
 * counts). Returns 0, or KV_ERR_INVAL with msg naming the first violation. */
int kv_wq_check(const kv_wqueue *q, char *msg /* OUT: (cap) */, size_t cap);

/* The running requests in victim order: v[0] is the one preemption takes
 * first (lowest priority, then the latest arrival, then the highest id). */
typedef struct kv_vqueue {
    kv_sreq **v; /* (cap) */
    int n, cap;
} kv_vqueue;

void kv_vq_free(kv_vqueue *q);
/* Room for n requests. Returns 0 or KV_ERR_NOMEM (nothing changed). */
int kv_vq_reserve(kv_vqueue *q, int n);
/* Inserts r in victim order (room reserved). Costs O(n) moves: n is at
 * most max_seqs. */
void kv_vq_insert(kv_vqueue *q, kv_sreq *r);
/* Removes r; no-op when absent. */
void kv_vq_remove(kv_vqueue *q, const kv_sreq *r);
/* The first victim, or NULL when nothing runs. */
static inline kv_sreq *kv_vq_first(const kv_vqueue *q) { return q->n ? q->v[0] : NULL; }
/* Blocks held by running requests of priority below prio (those come
 * first in victim order, so this costs only them). */
int kv_vq_blocks_below(const kv_vqueue *q, int prio);

#endif
