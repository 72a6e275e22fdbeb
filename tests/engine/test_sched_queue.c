/* test_sched_queue.c - the scheduler's ordered queues and the shared
 * reasons of a long waiting queue: the waiting queue against a full sort
 * after every change (priorities, the starvation guard, removals anywhere,
 * a clock that goes back), the victim order against a scan, and three
 * schedulers in lockstep on random workloads with long queues, one looking
 * at every waiting request one by one (the scheduler before shared
 * reasons), two stopping early: the same batches, the same decisions but
 * for the WAIT ones, and the same reason for every waiting request at
 * every step. A long queue costs a bounded number of decisions a step. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/kv_cache.h"
#include "../../engine/sched_queue.h"
#include "../../engine/scheduler.h"
#include "../harness.h"

static uint64_t rng = 88172645463325252ull;
static int rnd(int n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)((rng >> 11) % (uint64_t)n);
}

/* ---- the waiting queue against a full sort ---- */

enum { NQ = 400 };

static double g_wait, g_now;
static int cmp_ref(const void *pa, const void *pb) {
    const kv_sreq *a = *(kv_sreq *const *)pa, *b = *(kv_sreq *const *)pb;
    return kv_sq_before(g_wait, g_now, a, b, 1) ? -1 : kv_sq_before(g_wait, g_now, b, a, 1) ? 1 : 0;
}

static void test_wqueue_order(void) {
    for (int mode = 0; mode < 4; mode++) {
        double max_wait = mode == 0 ? 0 : 40; /* mode 3: one priority */
        kv_wqueue q;
        kv_wq_init(&q, max_wait);
        static kv_sreq reqs[NQ];
        kv_sreq *in[NQ];
        int n_in = 0, next = 0, bad = 0;
        double now = 0;
        for (int round = 0; round < 300 && !bad; round++) {
            /* arrivals (some preempted ones come back with an old arrival) */
            for (int k = rnd(6); k > 0 && next < NQ; k--) {
                kv_sreq *r = &reqs[next];
                memset(r, 0, sizeof *r);
                r->id = ++next;
                r->priority = mode == 3 ? 0 : rnd(3);
                r->arrival_ms = rnd(5) == 0 ? now - rnd(100) : now;
                REQUIRE(kv_wq_reserve(&q, n_in + 1) == 0);
                kv_wq_push(&q, r);
                in[n_in++] = r;
            }
            /* removals from anywhere, before or after the ordering */
            if (n_in > 0 && rnd(2)) {
                int k = rnd(n_in);
                if (rnd(2)) {
                    CHECK(kv_wq_remove(&q, in[k]) == 1);
                } else {
                    int at = -1;
                    for (int i = 0; i < q.n; i++)
                        if (kv_wq_at(&q, i) == in[k]) at = i;
                    REQUIRE(at >= 0);
                    kv_wq_remove_at(&q, at);
                }
                in[k] = in[--n_in];
            }
            now += mode == 2 && round == 150 ? -500 : 1 + rnd(8); /* mode 2: the clock goes back once */
            kv_wq_order(&q, now);
            g_wait = max_wait, g_now = now;
            kv_sreq *want[NQ];
            memcpy(want, in, (size_t)n_in * sizeof *want);
            qsort(want, (size_t)n_in, sizeof *want, cmp_ref);
            if (q.n != n_in) bad++;
            for (int i = 0; i < n_in && !bad; i++)
                if (kv_wq_at(&q, i) != want[i]) {
                    CHECKF(0, "mode %d round %d: position %d holds #%lld, want #%lld", mode, round, i,
                           (long long)kv_wq_at(&q, i)->id, (long long)want[i]->id);
                    bad++;
                }
            char msg[200];
            int rc = kv_wq_check(&q, msg, sizeof msg);
            CHECKF(rc == 0, "mode %d round %d: %s", mode, round, msg);
            if (rc) bad++;
            int top = INT32_MIN;
            for (int i = 0; i < n_in; i++) top = KV_MAX(top, in[i]->priority);
            CHECK(kv_wq_max_prio(&q) == top);
            CHECK(kv_wq_remove(&q, &reqs[NQ - 1]) == 0 || next == NQ); /* not queued: no-op */
        }
        kv_wq_free(&q);
    }
}

static void test_vqueue(void) {
    kv_vqueue q = {0};
    REQUIRE(kv_vq_reserve(&q, 64) == 0);
    static kv_sreq reqs[64];
    kv_sreq *in[64];
    int n = 0;
    for (int round = 0; round < 2000; round++) {
        if (n < 64 && (n == 0 || rnd(3))) {
            kv_sreq *r = NULL;
            for (int i = 0; i < 64 && !r; i++) {
                int used = 0;
                for (int j = 0; j < n; j++) used |= in[j] == &reqs[i];
                if (!used) r = &reqs[i];
            }
            r->id = round + 1;
            r->priority = rnd(4);
            r->arrival_ms = rnd(50);
            r->seq.n_blocks = rnd(9);
            kv_vq_insert(&q, r);
            in[n++] = r;
        } else {
            int k = rnd(n);
            kv_vq_remove(&q, in[k]);
            in[k] = in[--n];
        }
        /* the first victim is what a scan finds; blocks below a priority add up */
        kv_sreq *v = NULL;
        int below = 0;
        for (int i = 0; i < n; i++) {
            kv_sreq *r = in[i];
            if (!v || r->priority < v->priority ||
                (r->priority == v->priority &&
                 (r->arrival_ms > v->arrival_ms || (r->arrival_ms == v->arrival_ms && r->id > v->id))))
                v = r;
            below += r->priority < 2 ? r->seq.n_blocks : 0;
        }
        if (kv_vq_first(&q) != v || kv_vq_blocks_below(&q, 2) != below || q.n != n) {
            CHECKF(0, "round %d: victim or blocks differ", round);
            break;
        }
    }
    kv_vq_free(&q);
}

/* ---- three schedulers in lockstep ---- */

static void *fb_alloc(kv_backend *b, size_t n) { return calloc(1, n ? n : 1); }
static void fb_free(kv_backend *b, void *p) { free(p); }
static void fb_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) {}
static const kv_backend_ops fb_ops = {.name = "fake", .alloc = fb_alloc, .free = fb_free,
                                      .copy_block = fb_copy_block};

enum { MAXQ = 1200, N_SIM = 3 };

/* One scheduler with its cache and its own copy of every request. */
typedef struct lane {
    kv_backend be;
    kv_cache *c;
    kv_sched *s;
    kv_sreq *r[MAXQ];
    int done[MAXQ];
} lane;

static int32_t oracle(int64_t id, int p) { return (int32_t)((id * 7919 + (int64_t)p * 104729) % 500 + 3); }

static int lane_init(lane *l, kv_sched_params sp, int n_blocks, int n_swap, int prefix) {
    memset(l, 0, sizeof *l);
    l->be.ops = &fb_ops;
    kv_cache_params cp = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .dtype = KV_CACHE_F32, .block_size = 4,
                          .n_blocks = n_blocks, .prefix_sharing = prefix, .n_swap_blocks = n_swap};
    kv_err err;
    sp.prefix_sharing = prefix;
    if (!(l->c = kv_cache_new(&cp, &l->be, &err)) || !(l->s = kv_sched_new(&sp, l->c, &err))) {
        fprintf(stderr, "  %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void lane_free(lane *l, int n) {
    for (int i = 0; i < n; i++) {
        if (!l->done[i]) kv_sched_finish(l->s, l->r[i], KV_FINISH_CANCELLED);
        kv_sreq_free(l->r[i]);
        free(l->r[i]);
    }
    kv_sched_free(l->s);
    kv_cache_free(l->c);
}

/* Two reasons agree; the blocks a request needs ("N free blocks, needs M")
 * may differ in M: a shared reason counts them when asked, after the step
 * committed blocks the prefix cache can match, a walk when it looked. */
static int same_reason(const char *a, const char *b) {
    const char *na = strstr(a, " free blocks, needs "), *nb = strstr(b, " free blocks, needs ");
    if (na && nb) return na - a == nb - b && !strncmp(a, b, (size_t)(na - a));
    return !strcmp(a, b);
}

/* Steps every lane once; returns the number of differences found (printed). */
static int lockstep(lane *L, int n_req, uint64_t step, double now, int *max_dec) {
    const kv_sched_out *o[N_SIM];
    int bad = 0;
    for (int k = 0; k < N_SIM; k++) {
        kv_sched_begin_step(L[k].s, step, now);
        if (kv_sched_schedule(L[k].s, now, &o[k]) < 0) return 1;
    }
    /* the same batch, row for row */
    for (int k = 1; k < N_SIM; k++) {
        int same = o[k]->n_tokens == o[0]->n_tokens && o[k]->n_reqs == o[0]->n_reqs;
        for (int t = 0; same && t < o[0]->n_tokens; t++)
            same = o[k]->tokens[t] == o[0]->tokens[t] && o[k]->pos[t] == o[0]->pos[t] &&
                   o[k]->reqs[o[k]->seq[t]]->id == o[0]->reqs[o[0]->seq[t]]->id;
        if (!same) {
            fprintf(stderr, "  step %llu: lane %d schedules another batch\n", (unsigned long long)step, k);
            bad++;
        }
    }
    /* the forward: each request that samples gets the oracle's token */
    for (int k = 0; k < N_SIM; k++) {
        int nr = o[k]->n_reqs;
        kv_sreq *reqs[64];
        memcpy(reqs, o[k]->reqs, (size_t)nr * sizeof *reqs);
        for (int q = 0; q < nr; q++) {
            kv_sreq *r = reqs[q];
            int32_t t = oracle(r->id, r->n_tokens);
            kv_sched_update(L[k].s, r, &t, r->n_logits > 0);
            if (kv_sreq_n_generated(r) >= r->max_tokens) {
                kv_sched_finish(L[k].s, r, KV_FINISH_LENGTH);
                L[k].done[r->id - 1] = 1;
            }
        }
    }
    /* the same decisions but WAIT */
    const kv_decision *d[N_SIM];
    int nd[N_SIM];
    kv_step_record rec;
    for (int k = 0; k < N_SIM; k++) {
        kv_sched_end_step(L[k].s, &rec, &d[k], &nd[k]);
        if (nd[k] > *max_dec && k > 0) {
            *max_dec = nd[k];
            if (getenv("SQ_DEBUG")) {
                fprintf(stderr, "step %llu lane %d: %d decisions\n", (unsigned long long)step, k, nd[k]);
                for (int x = 0; x < nd[k] && x < 60; x++) fprintf(stderr, "   %s\n", d[k][x].text);
            }
        }
    }
    for (int k = 1; k < N_SIM && !bad; k++) {
        int i = 0, j = 0;
        for (;;) {
            while (i < nd[0] && d[0][i].kind == KV_DEC_WAIT) i++;
            while (j < nd[k] && d[k][j].kind == KV_DEC_WAIT) j++;
            if (i == nd[0] || j == nd[k]) {
                if (i != nd[0] || j != nd[k]) {
                    fprintf(stderr, "  step %llu: lane %d has other decisions\n", (unsigned long long)step, k);
                    bad++;
                }
                break;
            }
            if (strcmp(d[0][i].text, d[k][j].text)) {
                fprintf(stderr, "  step %llu: lane %d decided '%s', want '%s'\n", (unsigned long long)step, k,
                        d[k][j].text, d[0][i].text);
                bad++;
                break;
            }
            i++, j++;
        }
    }
    /* the same reason for every waiting request */
    for (int i = 0; i < n_req && !bad; i++) {
        if (L[0].done[i] || (L[0].r[i]->state != KV_REQ_WAITING && L[0].r[i]->state != KV_REQ_PREEMPTED)) continue;
        char b0[96], bk[96];
        const char *want = kv_sched_wait_reason(L[0].s, L[0].r[i], b0, sizeof b0);
        for (int k = 1; k < N_SIM && !bad; k++) {
            const char *got = kv_sched_wait_reason(L[k].s, L[k].r[i], bk, sizeof bk);
            if (!same_reason(got, want)) {
                fprintf(stderr, "  step %llu: #%d waits for '%s' in lane %d, want '%s'\n", (unsigned long long)step,
                        i + 1, got, k, want);
                bad++;
            }
        }
    }
    for (int k = 0; k < N_SIM && !bad; k++) {
        char msg[256];
        if (kv_sched_check(L[k].s, msg, sizeof msg)) {
            fprintf(stderr, "  step %llu: lane %d: %s\n", (unsigned long long)step, k, msg);
            bad++;
        }
    }
    return bad;
}

static void test_lockstep(void) {
    static const int eager[N_SIM] = {INT_MAX, 0, 1}; /* every one; the default; as few as possible */
    for (int mode = 0; mode < 8; mode++) {
        kv_sched_params p = {.policy = KV_POLICY_CONTINUOUS, .layout = KV_LAYOUT_PAGED,
                             .preemption = KV_PREEMPT_RECOMPUTE, .max_seqs = mode == 6 ? 48 : 6,
                             .max_batched_tokens = mode == 7 ? 24 : 48, .prefill_chunk = mode % 2 ? 7 : 16,
                             .max_wait_ms = mode == 1 ? 0 : 60, .max_seq_len = 64, .watermark_blocks = mode == 5};
        if (mode == 2 || mode == 3) p.preemption = KV_PREEMPT_SWAP;
        if (mode == 4) p.policy = KV_POLICY_STATIC;
        int n_blocks = mode == 6 ? 40 : 24, prios = mode == 0 || mode == 6 ? 1 : 3;
        lane *L = calloc(N_SIM, sizeof *L);
        REQUIRE(L);
        for (int k = 0; k < N_SIM; k++) {
            kv_sched_params q = p;
            q.eager_waiting = eager[k];
            REQUIRE(lane_init(&L[k], q, n_blocks, p.preemption == KV_PREEMPT_SWAP ? 40 : 0, mode != 3) == 0);
        }
        rng = 777 + (uint64_t)mode;
        int n = 0, bad = 0, max_dec = 0;
        double now = 0;
        int32_t shared[8];
        for (int i = 0; i < 8; i++) shared[i] = 2000 + i;
        for (uint64_t st = 1; st < 5000 && !bad; st++) {
            /* bursts: long queues form and drain */
            int arrivals = st % 400 < 10 ? 40 : rnd(4) == 0;
            for (int a = 0; a < arrivals && n < MAXQ; a++, n++) {
                int np = 2 + rnd(mode == 6 ? 60 : 30), mt = 1 + rnd(12), prio = rnd(prios);
                int32_t pr[64];
                int sh = rnd(2);
                for (int i = 0; i < np; i++) pr[i] = sh && i < 8 ? shared[i] : oracle(n + 1, i);
                for (int k = 0; k < N_SIM; k++) {
                    kv_sreq *r = calloc(1, sizeof *r);
                    REQUIRE(r && kv_sreq_init(r, n + 1, pr, np, mt, 0) == 0);
                    r->priority = prio;
                    r->arrival_ms = now;
                    L[k].r[n] = r;
                    CHECK(kv_sched_add(L[k].s, r) == 0);
                }
            }
            if (n > 0 && rnd(30) == 0) { /* a cancel anywhere */
                int i = rnd(n);
                for (int k = 0; k < N_SIM; k++)
                    if (!L[k].done[i]) {
                        kv_sched_finish(L[k].s, L[k].r[i], KV_FINISH_CANCELLED);
                        L[k].done[i] = 1;
                    }
            }
            bad += lockstep(L, n, st, now, &max_dec);
            now += 5;
            if (n >= MAXQ && kv_sched_idle(L[0].s)) break;
        }
        CHECKF(bad == 0, "mode %d: the lanes differ", mode);
        CHECKF(n == MAXQ && kv_sched_idle(L[0].s), "mode %d: %d requests, idle %d", mode, n, kv_sched_idle(L[0].s));
        /* with one priority, the long queue's reasons cost a bounded number
         * of WAIT decisions (NOTE: with several, requests past the
         * starvation guard come in arrival order, and each may outrank a
         * running one: the loop looks at them all) */
        if (prios == 1) CHECKF(max_dec < 150, "mode %d: up to %d decisions a step", mode, max_dec);
        for (int k = 0; k < N_SIM; k++) lane_free(&L[k], n);
        free(L);
    }
}

/* A queue of 50000: the steps' decisions stay few (one shared WAIT for the
 * tail, not one per request), and the tail's reason is the one a walk of
 * every request would give. */
static void test_long_queue(void) {
    enum { N = 50000 };
    kv_sched_params p = {.policy = KV_POLICY_CONTINUOUS, .layout = KV_LAYOUT_PAGED,
                         .preemption = KV_PREEMPT_RECOMPUTE, .max_seqs = 4, .max_batched_tokens = 64,
                         .prefill_chunk = 64, .max_wait_ms = 5000, .max_seq_len = 64};
    lane *l = calloc(1, sizeof *l);
    REQUIRE(l && lane_init(l, p, 64, 0, 0) == 0);
    kv_sreq **r = calloc(N, sizeof *r);
    REQUIRE(r);
    for (int i = 0; i < N; i++) {
        int32_t pr[3] = {oracle(i + 1, 0), oracle(i + 1, 1), oracle(i + 1, 2)};
        r[i] = calloc(1, sizeof **r);
        REQUIRE(r[i] && kv_sreq_init(r[i], i + 1, pr, 3, 1, 0) == 0);
        REQUIRE(kv_sched_add(l->s, r[i]) == 0);
    }
    int most = 0, tail_waits = 0, finished = 0;
    for (uint64_t st = 1; st <= 400; st++) {
        kv_sched_begin_step(l->s, st, (double)st);
        const kv_sched_out *o;
        REQUIRE(kv_sched_schedule(l->s, (double)st, &o) >= 0);
        int nr = o->n_reqs;
        kv_sreq *reqs[8];
        memcpy(reqs, o->reqs, (size_t)nr * sizeof *reqs);
        for (int q = 0; q < nr; q++) {
            int32_t t = 7;
            kv_sched_update(l->s, reqs[q], &t, reqs[q]->n_logits > 0);
            if (kv_sreq_n_generated(reqs[q]) >= 1) {
                kv_sched_finish(l->s, reqs[q], KV_FINISH_LENGTH);
                finished++;
            }
        }
        const kv_decision *d;
        int nd;
        kv_step_record rec;
        kv_sched_end_step(l->s, &rec, &d, &nd);
        most = KV_MAX(most, nd);
        for (int k = 0; k < nd; k++) tail_waits += d[k].kind == KV_DEC_WAIT && strstr(d[k].text, " more: ");
    }
    CHECKF(most < 3 * KV_SCHED_EAGER_WAITING, "%d decisions in one step", most);
    CHECKF(tail_waits >= 1 && tail_waits < 10, "%d shared WAIT decisions", tail_waits);
    CHECK(finished == 4 * 400);
    char buf[96];
    CHECKF(!strcmp(kv_sched_wait_reason(l->s, r[N - 1], buf, sizeof buf), "max_seqs (4) running"), "%s",
           kv_sched_wait_reason(l->s, r[N - 1], buf, sizeof buf));
    for (int i = 0; i < N; i++) {
        if (r[i]->state != KV_REQ_FINISHED) kv_sched_finish(l->s, r[i], KV_FINISH_CANCELLED);
        kv_sreq_free(r[i]);
        free(r[i]);
    }
    free(r);
    kv_sched_free(l->s);
    kv_cache_free(l->c);
    free(l);
}

TEST_MAIN(T(test_wqueue_order), T(test_vqueue), T(test_lockstep), T(test_long_queue))
