/* test_sched_batch.c - the dynamic batch size controller (sched_batch.h)
 * against a synthetic step-time model: a step of n sequences takes
 * a + b * n ms (plus deterministic noise), the queue always has more work
 * than the cap lets in. It must settle on the largest n whose step time
 * holds the target, hold it where a fixed batch of max_seqs does not, move
 * when the model changes, and ignore nonsense samples. */
#include <math.h>

#include "../../engine/sched_batch.h"
#include "../harness.h"

/* Step time of the synthetic model; noise in [-amp, amp], the same each run. */
static double step_ms(double a, double b, int n, double amp, unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    double u = (double)((*seed >> 8) & 0xffff) / 65535.0;
    return a + b * n + amp * (2 * u - 1);
}

/* Runs `steps` steps with demand `demand` sequences waiting; returns the
 * mean step time over the last `tail` steps and leaves c in its final state. */
static double drive(kv_batch_ctl *c, double a, double b, double amp, int demand, int steps, int tail) {
    unsigned seed = 12345;
    double sum = 0;
    for (int i = 0; i < steps; i++) {
        int n = c->cap < demand ? c->cap : demand;
        double t = step_ms(a, b, n, amp, &seed);
        kv_batch_ctl_observe(c, n, t);
        if (i >= steps - tail) sum += t;
    }
    return sum / tail;
}

static void test_converges(void) {
    /* 2 ms + 0.5 ms per sequence, target 10 ms: 16 sequences */
    kv_batch_ctl c;
    kv_batch_ctl_init(&c, 10.0, 64);
    CHECK(c.cap == 2);
    double mean = drive(&c, 2.0, 0.5, 0.3, 1000, 300, 100);
    CHECKF(c.cap >= 15 && c.cap <= 16, "cap %d", c.cap);
    CHECKF(mean <= 10.0 && mean >= 9.0, "mean step %.2f ms", mean);
    CHECKF(fabs(c.b_ms - 0.5) < 0.1 && fabs(c.a_ms - 2.0) < 1.0, "fit a %.2f b %.3f", c.a_ms, c.b_ms);
    /* a fixed batch of max_seqs on the same model misses the target */
    double fixed = 2.0 + 0.5 * 64;
    CHECK(fixed > 3 * 10.0);
}

static void test_follows_the_model(void) {
    kv_batch_ctl c;
    kv_batch_ctl_init(&c, 20.0, 256);
    drive(&c, 4.0, 0.25, 0.5, 1000, 400, 50); /* (20 - 4) / 0.25 = 64 */
    CHECKF(c.cap >= 61 && c.cap <= 64, "cap %d", c.cap);
    /* the step gets twice as expensive per sequence (a longer context):
     * the cap comes down to 32 */
    double mean = drive(&c, 4.0, 0.5, 0.5, 1000, 400, 100);
    CHECKF(c.cap >= 30 && c.cap <= 32, "cap %d", c.cap);
    CHECKF(mean <= 20.0, "mean %.2f", mean);
}

static void test_bounds(void) {
    kv_batch_ctl c;
    /* a target every batch meets: the cap goes to max and stays */
    kv_batch_ctl_init(&c, 100.0, 8);
    drive(&c, 1.0, 0.1, 0.0, 1000, 100, 10);
    CHECK(c.cap == 8);
    /* a target no batch meets: one sequence */
    kv_batch_ctl_init(&c, 1.0, 64);
    drive(&c, 5.0, 0.5, 0.0, 1000, 100, 10);
    CHECK(c.cap == 1);
    /* little demand: the cap does not run away while the batch is not full */
    kv_batch_ctl_init(&c, 10.0, 64);
    drive(&c, 2.0, 0.0, 0.0, 3, 200, 10);
    CHECKF(c.cap <= 4, "cap %d with 3 waiting", c.cap);
    /* nonsense samples change nothing */
    kv_batch_ctl_init(&c, 10.0, 64);
    kv_batch_ctl d = c;
    kv_batch_ctl_observe(&c, 0, 5.0);
    kv_batch_ctl_observe(&c, 4, NAN);
    kv_batch_ctl_observe(&c, 4, -1.0);
    kv_batch_ctl_observe(&c, 4, INFINITY);
    CHECK(c.cap == d.cap && c.n_obs == 0 && c.w == 0);
    /* max 1 */
    kv_batch_ctl_init(&c, 10.0, 1);
    CHECK(c.cap == 1);
}

/* No target (max_seqs auto without one): it holds twice the fitted step of
 * one sequence, 2 (a + b), which allows a / b + 2 sequences. */
static void test_no_target(void) {
    kv_batch_ctl c;
    kv_batch_ctl_init(&c, 0, 256);
    CHECK(c.cap == 2 && c.goal_ms == 0);
    /* 4 ms + 0.25 ms per sequence: goal 8.5 ms, 18 sequences */
    double mean = drive(&c, 4.0, 0.25, 0.2, 1000, 400, 100);
    CHECKF(fabs(c.goal_ms - 8.5) < 0.5, "goal %.2f ms", c.goal_ms);
    CHECKF(c.cap >= 16 && c.cap <= 18, "cap %d", c.cap);
    CHECKF(mean <= 8.7, "mean step %.2f ms", mean);
    /* a step with no fixed cost: one sequence costs what it costs, the
     * goal is twice that, two sequences */
    kv_batch_ctl_init(&c, -1, 256);
    drive(&c, 0.0, 1.0, 0.0, 1000, 300, 10);
    CHECKF(c.cap == 2 && fabs(c.goal_ms - 2.0) < 1e-6, "cap %d goal %.3f", c.cap, c.goal_ms);
    /* little demand: the probe does not run away while the batch is not full */
    kv_batch_ctl_init(&c, 0, 256);
    drive(&c, 2.0, 0.0, 0.0, 3, 200, 10);
    CHECKF(c.cap <= 4, "cap %d with 3 waiting", c.cap);
}

/* One noisy step cannot swing the cap by more than a quarter. */
static void test_bounded_moves(void) {
    kv_batch_ctl c;
    kv_batch_ctl_init(&c, 10.0, 64);
    drive(&c, 2.0, 0.5, 0.0, 1000, 300, 10);
    int before = c.cap;
    kv_batch_ctl_observe(&c, before, 500.0);
    CHECKF(c.cap >= before - (before / 4 > 1 ? before / 4 : 1) && c.cap < before, "cap %d -> %d", before, c.cap);
}

TEST_MAIN(T(test_converges), T(test_follows_the_model), T(test_bounds), T(test_bounded_moves), T(test_no_target))
