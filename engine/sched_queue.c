/* sched_queue.c - the waiting queue in scheduling order and the running
 * requests in victim order (see sched_queue.h). The waiting queue is a
 * double-ended array: requests leave from near its front (admission) and
 * come in at its back (arrival), so both cost little however long it is. */
#include "sched_queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/common.h"
#include "../base/vec.h"

int kv_sq_before(double max_wait_ms, double now_ms, const kv_sreq *a, const kv_sreq *b, int guard) {
    int sa = guard && kv_sq_starving(max_wait_ms, now_ms, a), sb = guard && kv_sq_starving(max_wait_ms, now_ms, b);
    if (sa != sb) return sa > sb;
    if (!sa && a->priority != b->priority) return a->priority > b->priority;
    if (a->arrival_ms != b->arrival_ms) return a->arrival_ms < b->arrival_ms;
    return a->id < b->id;
}

/* qsort has no context argument in C11: the ordering's clock and guard for
 * the comparator, per thread (an engine orders on its own thread). */
static _Thread_local double sort_wait_ms, sort_now_ms;

static int cmp_sched(const void *pa, const void *pb) {
    const kv_sreq *a = *(kv_sreq *const *)pa, *b = *(kv_sreq *const *)pb;
    if (kv_sq_before(sort_wait_ms, sort_now_ms, a, b, 1)) return -1;
    return kv_sq_before(sort_wait_ms, sort_now_ms, b, a, 1) ? 1 : 0;
}

static void sort_sched(kv_sreq **v, int n, double max_wait_ms, double now_ms) {
    sort_wait_ms = max_wait_ms;
    sort_now_ms = now_ms;
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_sched);
}

/* ---- the waiting queue ---- */

void kv_wq_init(kv_wqueue *q, double max_wait_ms) {
    memset(q, 0, sizeof *q);
    q->max_wait_ms = max_wait_ms;
}

void kv_wq_free(kv_wqueue *q) {
    if (!q) return;
    free(q->v);
    free(q->tmp);
    free(q->prios);
    memset(q, 0, sizeof *q);
}

int kv_wq_reserve(kv_wqueue *q, int n_live) {
    /* twice the live requests: after moving the queue to the front of the
     * array there is room for as many pushes again, so moves stay rare */
    if ((int64_t)n_live * 2 > INT32_MAX / 2) return KV_ERR_NOMEM;
    int want = KV_MAX(2 * n_live, 64);
    if (want > q->cap) {
        int nc = KV_MAX(want, q->cap * 2);
        kv_sreq **v = malloc((size_t)nc * sizeof *v);
        if (!v) return KV_ERR_NOMEM;
        if (q->n) memcpy(v, q->v + q->off, (size_t)q->n * sizeof *v);
        free(q->v);
        q->v = v;
        q->cap = nc;
        q->off = 0;
    }
    if (kv_grow((void **)&q->tmp, &q->cap_tmp, n_live, sizeof *q->tmp)) return KV_ERR_NOMEM;
    /* a priority entry per live request at most */
    if (kv_grow((void **)&q->prios, &q->cap_prios, n_live, sizeof *q->prios)) return KV_ERR_NOMEM;
    return 0;
}

/* Index of prio's entry, or where it would go. */
static int prio_find(const kv_wqueue *q, int prio) {
    int lo = 0, hi = q->n_prios;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (q->prios[mid].prio < prio) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void prio_add(kv_wqueue *q, int prio) {
    int i = prio_find(q, prio);
    if (i < q->n_prios && q->prios[i].prio == prio) {
        q->prios[i].n++;
        return;
    }
    if (q->n_prios >= q->cap_prios) return; /* cannot happen: reserved */
    memmove(q->prios + i + 1, q->prios + i, (size_t)(q->n_prios - i) * sizeof *q->prios);
    q->prios[i] = (kv_sq_prio){prio, 1};
    q->n_prios++;
}

static void prio_del(kv_wqueue *q, int prio) {
    int i = prio_find(q, prio);
    if (i >= q->n_prios || q->prios[i].prio != prio) return;
    if (--q->prios[i].n > 0) return;
    memmove(q->prios + i, q->prios + i + 1, (size_t)(q->n_prios - i - 1) * sizeof *q->prios);
    q->n_prios--;
}

int kv_wq_max_prio(const kv_wqueue *q) { return q->n_prios ? q->prios[q->n_prios - 1].prio : INT32_MIN; }

void kv_wq_push(kv_wqueue *q, kv_sreq *r) {
    if (q->n >= q->cap) return; /* cannot happen: reserved */
    if (q->off + q->n == q->cap) {
        memmove(q->v, q->v + q->off, (size_t)q->n * sizeof *q->v);
        q->off = 0;
    }
    q->v[q->off + q->n++] = r;
    prio_add(q, r->priority);
}

void kv_wq_remove_at(kv_wqueue *q, int i) {
    if (i < 0 || i >= q->n) return;
    prio_del(q, kv_wq_at(q, i)->priority);
    kv_sreq **b = q->v + q->off;
    if (i < q->n - 1 - i) { /* closer to the front: move the front up */
        memmove(b + 1, b, (size_t)i * sizeof *b);
        q->off++;
    } else {
        memmove(b + i, b + i + 1, (size_t)(q->n - 1 - i) * sizeof *b);
    }
    q->n--;
    if (i < q->n_sorted) {
        q->n_sorted--;
        if (i < q->n_starv) q->n_starv--;
    }
    if (q->n == 0) q->off = 0;
}

/* First index in the ordered part at which r belongs (the order as of the
 * last ordering). */
static int sorted_pos(const kv_wqueue *q, const kv_sreq *r, int lo, int hi, double now_ms) {
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (kv_sq_before(q->max_wait_ms, now_ms, kv_wq_at(q, mid), r, 1)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int kv_wq_remove(kv_wqueue *q, const kv_sreq *r) {
    int i = sorted_pos(q, r, 0, q->n_sorted, q->sort_ms);
    if (i < q->n_sorted && kv_wq_at(q, i) == r) {
        kv_wq_remove_at(q, i);
        return 1;
    }
    for (i = q->n - 1; i >= 0; i--) /* added since the ordering (or, in a broken order, anywhere) */
        if (kv_wq_at(q, i) == r) {
            kv_wq_remove_at(q, i);
            return 1;
        }
    return 0;
}

/* Inserts r at index i of a queue without pending requests, moving the
 * shorter side. */
static void insert_at(kv_wqueue *q, int i, kv_sreq *r) {
    if ((i < q->n - i && q->off > 0) || q->off + q->n == q->cap) {
        if (q->off == 0) return; /* cannot happen: cap >= 2 n */
        kv_sreq **b = q->v + q->off;
        memmove(b - 1, b, (size_t)i * sizeof *b);
        q->off--;
    } else {
        kv_sreq **b = q->v + q->off;
        memmove(b + i + 1, b + i, (size_t)(q->n - i) * sizeof *b);
    }
    q->v[q->off + i] = r;
    q->n++;
    q->n_sorted++;
}

/* First index in [lo, hi) whose priority is below prio (the ordered part
 * past the guard is by priority, descending). */
static int group_end(const kv_wqueue *q, int lo, int hi, int prio) {
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (kv_wq_at(q, mid)->priority >= prio) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* First index in [lo, hi) (one priority, by arrival) not past the guard. */
static int starve_end(const kv_wqueue *q, int lo, int hi, double now_ms) {
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (kv_sq_starving(q->max_wait_ms, now_ms, kv_wq_at(q, mid))) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Moves the ordered requests that passed the guard since sort_ms up to
 * the end of the starving part. Within one priority they are the oldest,
 * and older than none of those already there. */
static void promote(kv_wqueue *q, double now_ms) {
    if (q->max_wait_ms <= 0 || q->n_starv >= q->n_sorted) return;
    int total = 0, region_end = q->n_starv, first = 0;
    for (int g = q->n_starv; g < q->n_sorted;) {
        int end = group_end(q, g, q->n_sorted, kv_wq_at(q, g)->priority);
        int c = starve_end(q, g, end, now_ms) - g;
        if (c > 0) {
            if (g == q->n_starv) first = c;
            total += c;
            region_end = end;
        }
        g = end;
    }
    if (total == 0) return;
    if (total == first) { /* only the first priority's: already in place */
        q->n_starv += total;
        return;
    }
    /* several priorities: [n_starv, region_end) becomes the promoted, by
     * arrival, then the others in their order */
    int p = 0, k = total;
    for (int g = q->n_starv; g < region_end;) {
        int end = group_end(q, g, region_end, kv_wq_at(q, g)->priority);
        int c = starve_end(q, g, end, now_ms);
        for (int i = g; i < c; i++) q->tmp[p++] = kv_wq_at(q, i);
        for (int i = c; i < end; i++) q->tmp[k++] = kv_wq_at(q, i);
        g = end;
    }
    sort_sched(q->tmp, total, q->max_wait_ms, now_ms);
    memcpy(q->v + q->off + q->n_starv, q->tmp, (size_t)k * sizeof *q->tmp);
    q->n_starv += total;
}

void kv_wq_order(kv_wqueue *q, double now_ms) {
    if (now_ms < q->sort_ms) q->n_sorted = q->n_starv = 0; /* the clock went back: start over */
    promote(q, now_ms);
    q->sort_ms = now_ms;
    int k = q->n - q->n_sorted;
    if (k <= 0) return;
    /* the added requests, in order, merged into the ordered part */
    memcpy(q->tmp, q->v + q->off + q->n_sorted, (size_t)k * sizeof *q->tmp);
    sort_sched(q->tmp, k, q->max_wait_ms, now_ms);
    int n_starving = 0;
    for (int j = 0; j < k; j++) n_starving += kv_sq_starving(q->max_wait_ms, now_ms, q->tmp[j]);
    q->n = q->n_sorted;
    if (k <= 64 || (int64_t)k * 16 < q->n_sorted) {
        int from = 0;
        for (int j = 0; j < k; j++) { /* sorted: each goes after the one before */
            from = sorted_pos(q, q->tmp[j], from, q->n_sorted, now_ms);
            insert_at(q, from, q->tmp[j]);
            from++;
        }
    } else { /* many: one merge from the back, into the room they left */
        kv_sreq **b = q->v + q->off;
        int i = q->n_sorted - 1, j = k - 1, w = q->n_sorted + k - 1;
        while (j >= 0) {
            if (i >= 0 && kv_sq_before(q->max_wait_ms, now_ms, q->tmp[j], b[i], 1)) b[w--] = b[i--];
            else b[w--] = q->tmp[j--];
        }
        q->n = q->n_sorted = q->n_sorted + k;
    }
    q->n_starv += n_starving;
}

int kv_wq_check(const kv_wqueue *q, char *msg, size_t cap) {
    if (q->n < 0 || q->n_sorted > q->n || q->n_starv > q->n_sorted || q->off < 0 || q->off + q->n > q->cap) {
        snprintf(msg, cap, "waiting queue: n %d, sorted %d, starving %d, off %d, cap %d", q->n, q->n_sorted,
                 q->n_starv, q->off, q->cap);
        return KV_ERR_INVAL;
    }
    for (int i = 0; i < q->n_sorted; i++) {
        const kv_sreq *r = kv_wq_at(q, i);
        if (kv_sq_starving(q->max_wait_ms, q->sort_ms, r) != (i < q->n_starv)) {
            snprintf(msg, cap, "waiting queue: #%lld at %d on the wrong side of the guard (%d starving)",
                     (long long)r->id, i, q->n_starv);
            return KV_ERR_INVAL;
        }
        if (i > 0 && !kv_sq_before(q->max_wait_ms, q->sort_ms, kv_wq_at(q, i - 1), r, 1)) {
            snprintf(msg, cap, "waiting queue: #%lld at %d out of order", (long long)r->id, i);
            return KV_ERR_INVAL;
        }
    }
    int total = 0;
    for (int p = 0; p < q->n_prios; p++) {
        int c = 0;
        for (int i = 0; i < q->n; i++) c += kv_wq_at(q, i)->priority == q->prios[p].prio;
        if (c != q->prios[p].n || (p > 0 && q->prios[p - 1].prio >= q->prios[p].prio)) {
            snprintf(msg, cap, "waiting queue: priority %d counted %d, holds %d", q->prios[p].prio, q->prios[p].n, c);
            return KV_ERR_INVAL;
        }
        total += c;
    }
    if (total != q->n) {
        snprintf(msg, cap, "waiting queue: %d requests, %d counted by priority", q->n, total);
        return KV_ERR_INVAL;
    }
    return 0;
}

/* ---- the running requests in victim order ---- */

/* Whether a is preempted before b. */
static int victim_first(const kv_sreq *a, const kv_sreq *b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    if (a->arrival_ms != b->arrival_ms) return a->arrival_ms > b->arrival_ms;
    return a->id > b->id;
}

void kv_vq_free(kv_vqueue *q) {
    if (!q) return;
    free(q->v);
    memset(q, 0, sizeof *q);
}

int kv_vq_reserve(kv_vqueue *q, int n) { return kv_grow((void **)&q->v, &q->cap, n, sizeof *q->v); }

void kv_vq_insert(kv_vqueue *q, kv_sreq *r) {
    if (q->n >= q->cap) return; /* cannot happen: reserved */
    int lo = 0, hi = q->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (victim_first(q->v[mid], r)) lo = mid + 1;
        else hi = mid;
    }
    memmove(q->v + lo + 1, q->v + lo, (size_t)(q->n - lo) * sizeof *q->v);
    q->v[lo] = r;
    q->n++;
}

void kv_vq_remove(kv_vqueue *q, const kv_sreq *r) {
    for (int i = 0; i < q->n; i++)
        if (q->v[i] == r) {
            memmove(q->v + i, q->v + i + 1, (size_t)(q->n - i - 1) * sizeof *q->v);
            q->n--;
            return;
        }
}

int kv_vq_blocks_below(const kv_vqueue *q, int prio) {
    int n = 0;
    for (int i = 0; i < q->n && q->v[i]->priority < prio; i++) n += q->v[i]->seq.n_blocks;
    return n;
}
