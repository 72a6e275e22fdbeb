/* sched_batch.h - the dynamic batch size behind scheduler.target_tpot_ms
 * and scheduler.max_seqs: auto:
 * a controller that learns how a step's duration grows with the number of
 * sequences in it (a least-squares line over recent steps, older steps
 * weighing less) and allows the largest batch whose predicted step time
 * stays within the target. Every running sequence emits one token per
 * decode step, so the step time is the TPOT it sees; a bigger batch raises
 * throughput until the step time crosses the target.
 *
 * Without a target (target_ms 0: max_seqs auto with neither
 * scheduler.target_tpot_ms nor sla.tpot_ms) it holds twice the fitted step
 * time of a batch of one, a + b: TPOT at most double what a lone stream
 * sees, which allows a / b + 2 sequences: past the point where the
 * sequences' own cost equals the step's fixed cost, each more one buys
 * less throughput than the TPOT it costs.
 *
 * Until the line can be fitted (all recent steps had about the same size,
 * or an outlier leaves no positive slope) it
 * probes: one more sequence while under the target, a quarter fewer while
 * over. Plain data, no allocation: the scheduler embeds one, and the unit
 * test drives it with a synthetic step-time model. */
#ifndef KV_SCHED_BATCH_H
#define KV_SCHED_BATCH_H

typedef struct kv_batch_ctl {
    double target_ms;  /* step time to hold; 0: twice the fitted step of one sequence */
    double goal_ms;    /* the step time held now: target_ms, or from the fit (0 before one) */
    int max;           /* the cap never exceeds this (scheduler.max_seqs) */
    int cap;           /* sequences allowed now, in [1, max] */
    /* exponentially weighted sums of (n, t) samples */
    double w, sx, sy, sxx, sxy;
    double a_ms, b_ms; /* the last fit: t = a + b * n (b = 0: no fit yet) */
    long n_obs;
} kv_batch_ctl;

/* Without a target: hold this many times the fitted step of one sequence. */
#define KV_BATCH_AUTO_FACTOR 2.0

/* Weight of a sample after each newer one (about the last 30 steps count). */
#define KV_BATCH_DECAY 0.97

/* Starts at a cap of min(2, max): the controller grows it from there.
 * target_ms <= 0: hold twice the fitted step time of one sequence. */
void kv_batch_ctl_init(kv_batch_ctl *c /* OUT: */, double target_ms, int max);
/* One step of n_seqs sequences took step_ms. Steps of 0 sequences, or a
 * non-finite or negative time, are ignored. Updates c->cap. */
void kv_batch_ctl_observe(kv_batch_ctl *c, int n_seqs, double step_ms);

#endif
