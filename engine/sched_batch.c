/* sched_batch.c - the dynamic batch size controller (sched_batch.h): a
 * weighted least-squares line of step time against batch size, inverted at
 * the target (given, or twice the fitted step of one sequence), with bounded
 * moves so one noisy step cannot swing it. */
#include "sched_batch.h"

#include <math.h>
#include <string.h>

void kv_batch_ctl_init(kv_batch_ctl *c, double target_ms, int max) {
    memset(c, 0, sizeof *c);
    c->target_ms = target_ms > 0 ? target_ms : 0;
    c->goal_ms = c->target_ms;
    c->max = max < 1 ? 1 : max;
    c->cap = c->max < 2 ? c->max : 2;
}

/* The cap the fitted line allows, or -1 when it cannot be fitted. */
static int fitted_cap(kv_batch_ctl *c) {
    if (c->w <= 0) return -1;
    double mx = c->sx / c->w, my = c->sy / c->w;
    double vx = c->sxx / c->w - mx * mx, cxy = c->sxy / c->w - mx * my;
    if (!(vx > 0.25)) return -1; /* the sizes seen hardly differ: no slope to trust */
    double b = cxy / vx, a = my - b * mx;
    c->a_ms = a, c->b_ms = b;
    if (!(b > 1e-9)) return -1; /* no slope (or an outlier made it negative): probe */
    /* no target given: twice the predicted step of a lone sequence (a
     * negative intercept from noise counts as none) */
    if (!(c->target_ms > 0)) c->goal_ms = KV_BATCH_AUTO_FACTOR * (fmax(a, 0) + b);
    double n = floor((c->goal_ms - a) / b);
    if (!(n < c->max)) return c->max;
    return n < 1 ? 1 : (int)n;
}

void kv_batch_ctl_observe(kv_batch_ctl *c, int n_seqs, double step_ms) {
    if (n_seqs <= 0 || !isfinite(step_ms) || step_ms < 0) return;
    double x = n_seqs, y = step_ms;
    c->w = c->w * KV_BATCH_DECAY + 1;
    c->sx = c->sx * KV_BATCH_DECAY + x;
    c->sy = c->sy * KV_BATCH_DECAY + y;
    c->sxx = c->sxx * KV_BATCH_DECAY + x * x;
    c->sxy = c->sxy * KV_BATCH_DECAY + x * y;
    c->n_obs++;
    int want = fitted_cap(c);
    /* until a line is fitted without a given target there is none to be
     * over: the probe grows (a full batch at a time) until it can fit one */
    int over = c->goal_ms > 0 && y > c->goal_ms;
    if (want < 0) {
        /* probe: grow while under the target (only when the batch is full,
         * so the next steps show what the larger size costs), back off over */
        if (over)
            want = n_seqs - (n_seqs + 3) / 4;
        else if (n_seqs >= c->cap)
            want = c->cap + 1;
        else
            want = c->cap;
    }
    if (over && want > c->cap) want = c->cap; /* never grow on a step over the target */
    /* bounded moves: at most a quarter (and at least one) per step */
    int step = c->cap / 4 > 1 ? c->cap / 4 : 1;
    if (want > c->cap + step) want = c->cap + step;
    if (want < c->cap - step) want = c->cap - step;
    if (want > c->max) want = c->max;
    if (want < 1) want = 1;
    c->cap = want;
}
