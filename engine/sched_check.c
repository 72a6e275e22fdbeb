/* sched_check.c - the scheduler's consistency check for tests: the
 * cache's checker over every live sequence, the queues partitioning the
 * requests in the states they say, the ordered queues' invariants and the
 * last plan's budgets. */
#include <stdio.h>
#include <stdlib.h>

#include "../base/common.h"
#include "sched_internal.h"

int kv_sched_check(const kv_sched *s, char *msg, size_t cap) {
    int n = s->n_running + s->n_swapped;
    kv_seq **seqs = malloc((size_t)(n > 0 ? n : 1) * sizeof *seqs);
    if (!seqs) {
        snprintf(msg, cap, "out of memory");
        return KV_ERR_NOMEM;
    }
    int k = 0, rc = 0;
    for (int i = 0; i < s->n_running; i++) {
        const kv_sreq *r = s->running[i];
        if (r->state != KV_REQ_RUNNING) {
            snprintf(msg, cap, "running #%lld has state %d", (long long)r->id, r->state);
            rc = KV_ERR_INVAL;
            goto out;
        }
        if (r->seq.swapped || r->n_computed != r->seq.n_tokens || r->seq.n_reserved < r->n_computed ||
            r->n_computed > r->n_tokens) {
            snprintf(msg, cap, "running #%lld: n_computed %d, seq.n_tokens %d, reserved %d, n_tokens %d",
                     (long long)r->id, r->n_computed, r->seq.n_tokens, r->seq.n_reserved, r->n_tokens);
            rc = KV_ERR_INVAL;
            goto out;
        }
        seqs[k++] = (kv_seq *)&r->seq;
    }
    for (int i = 0; i < s->n_swapped; i++) {
        const kv_sreq *r = s->swapped[i];
        if (r->state != KV_REQ_SWAPPED || !r->seq.swapped) {
            snprintf(msg, cap, "swapped #%lld has state %d, swapped flag %d", (long long)r->id, r->state,
                     r->seq.swapped);
            rc = KV_ERR_INVAL;
            goto out;
        }
        seqs[k++] = (kv_seq *)&r->seq;
    }
    int members = 0;
    for (int i = 0; i < s->waiting.n; i++) {
        const kv_sreq *r = kv_wq_at(&s->waiting, i);
        if ((r->state != KV_REQ_WAITING && r->state != KV_REQ_PREEMPTED) || r->seq.n_blocks != 0 ||
            r->n_computed != 0) {
            snprintf(msg, cap, "waiting #%lld: state %d, %d blocks, n_computed %d", (long long)r->id, r->state,
                     r->seq.n_blocks, r->n_computed);
            rc = KV_ERR_INVAL;
            goto out;
        }
        members += s->p.policy == KV_POLICY_STATIC && s->cur_batch && r->batch == s->cur_batch;
    }
    if ((rc = kv_wq_check(&s->waiting, msg, cap))) goto out;
    if (members != s->batch_waiting) {
        snprintf(msg, cap, "%d waiting members of the static batch, %d counted", members, s->batch_waiting);
        rc = KV_ERR_INVAL;
        goto out;
    }
    /* the victim order holds exactly the running requests, in order */
    if (s->victims.n != s->n_running) {
        snprintf(msg, cap, "%d running, %d in victim order", s->n_running, s->victims.n);
        rc = KV_ERR_INVAL;
        goto out;
    }
    for (int i = 0; i < s->victims.n; i++) {
        const kv_sreq *v = s->victims.v[i];
        int found = 0;
        for (int j = 0; j < s->n_running && !found; j++) found = s->running[j] == v;
        const kv_sreq *u = i > 0 ? s->victims.v[i - 1] : NULL;
        if (!found || (u && (u->priority > v->priority ||
                             (u->priority == v->priority &&
                              (u->arrival_ms < v->arrival_ms || (u->arrival_ms == v->arrival_ms && u->id < v->id)))))) {
            snprintf(msg, cap, "victim order: #%lld at %d %s", (long long)v->id, i,
                     found ? "out of order" : "not running");
            rc = KV_ERR_INVAL;
            goto out;
        }
    }
    if (s->n_running > s->p.max_seqs) {
        snprintf(msg, cap, "%d running > max_seqs %d", s->n_running, s->p.max_seqs);
        rc = KV_ERR_INVAL;
        goto out;
    }
    if (s->out.n_tokens > s->p.max_batched_tokens) {
        snprintf(msg, cap, "%d batch tokens > max_batched_tokens %d", s->out.n_tokens, s->p.max_batched_tokens);
        rc = KV_ERR_INVAL;
        goto out;
    }
    rc = kv_cache_check(s->c, seqs, k, msg, cap);
out:
    free(seqs);
    return rc;
}
