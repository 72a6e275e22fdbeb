/* test_failure_modes.c - issue 17's failure modes on real runs of
 * stories260K (burst arrivals, greedy, the caller's thread: every decision
 * is deterministic): the KV cascade demo profile counts preemption chains
 * and recomputed tokens, each guard changes what it should (no growth
 * preemption under max_tokens admission, less recompute under a watermark,
 * less thrown away under least_work victims) and none of them changes a
 * greedy output; the request classes' TTFT; the short-first order and
 * priority classes letting short requests overtake long ones. */
#include <stdlib.h>
#include <string.h>

#include "../../cli/bench.h"
#include "../../profiles/profile.h"
#include "../harness.h"
#include "../bench_helpers.h"

/* The cascade demo with `set` applied (NULL: as it is), run to the end. */
static int run_cascade(const char *set, kv_bench_result *r) {
    kv_config c;
    kv_err err;
    const char *sets[2] = {"scheduler.max_wait_ms=0", set}; /* no wall-clock guard: decisions repeat */
    if (kv_profile_load_with_sets("profiles/demo-kv-cascade.yaml", sets, set ? 2 : 1, &c, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        return -1;
    }
    harness_shared_copy(c.model.path, sizeof c.model.path, "models/stories260K.gguf");
    c.threads = 1;
    if (kv_bench_run(&c, NULL, r, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int same_outputs(const kv_bench_result *a, const kv_bench_result *b) {
    if (a->n_requests != b->n_requests) return 0;
    for (int i = 0; i < a->n_requests; i++)
        if (a->reqs[i].output_tokens != b->reqs[i].output_tokens || strcmp(a->reqs[i].text, b->reqs[i].text))
            return 0;
    return 1;
}

static void test_cascade_and_guards(void) {
    if (!harness_present(harness_shared_path("models/stories260K.gguf"), "the shared test models")) return;
    kv_bench_result base, wm, mt, qt, lw;
    REQUIRE(run_cascade(NULL, &base) == 0);
    const kv_metrics_summary *m = &base.m;
    CHECK(base.completed == 20);
    /* the failure: preemptions that come in chains, and work done twice */
    CHECKF(m->preemptions >= 20 && m->preemption_chains >= 2 && m->longest_preemption_chain >= 3,
           "%llu preemptions, %llu cascades, longest %d", (unsigned long long)m->preemptions,
           (unsigned long long)m->preemption_chains, m->longest_preemption_chain);
    CHECK(m->chained_preemptions >= 2 * m->preemption_chains && m->chained_preemptions <= m->preemptions);
    CHECK(m->tokens_recomputed > 0 && m->tokens_recomputed <= m->tokens_discarded);
    /* recomputed tokens are prefill the workload alone would not need; each
     * readmission also prefills the one sampled token it had not decoded yet */
    CHECKF(m->prefill_tokens_computed == m->input_tokens + m->tokens_recomputed + m->preemptions,
           "prefill %llu, input %llu, recomputed %llu, preemptions %llu", (unsigned long long)m->prefill_tokens_computed,
           (unsigned long long)m->input_tokens, (unsigned long long)m->tokens_recomputed,
           (unsigned long long)m->preemptions);

    REQUIRE(run_cascade("scheduler.watermark=0.3", &wm) == 0);
    CHECKF(wm.m.tokens_recomputed * 2 < m->tokens_recomputed, "watermark: %llu recomputed vs %llu",
           (unsigned long long)wm.m.tokens_recomputed, (unsigned long long)m->tokens_recomputed);
    REQUIRE(run_cascade("scheduler.admission=max_tokens", &mt) == 0);
    CHECK(mt.m.preemptions == 0 && mt.m.tokens_recomputed == 0 && mt.m.preemption_chains == 0);
    CHECK(mt.m.max_concurrent < base.m.max_concurrent);
    REQUIRE(run_cascade("scheduler.admission=quantile", &qt) == 0);
    CHECK(qt.m.tokens_recomputed < m->tokens_recomputed);
    REQUIRE(run_cascade("scheduler.preempt_victim=least_work", &lw) == 0);
    CHECKF(lw.m.tokens_discarded < m->tokens_discarded, "least_work threw away %llu vs %llu",
           (unsigned long long)lw.m.tokens_discarded, (unsigned long long)m->tokens_discarded);
    /* guards change the schedule, never a greedy answer */
    CHECK(same_outputs(&base, &wm) && same_outputs(&base, &mt) && same_outputs(&base, &qt) &&
          same_outputs(&base, &lw));
    for (int i = 0; i < base.n_requests; i++) CHECK(base.reqs[i].finish == KV_FINISH_LENGTH);
    kv_bench_result_free(&base);
    kv_bench_result_free(&wm);
    kv_bench_result_free(&mt);
    kv_bench_result_free(&qt);
    kv_bench_result_free(&lw);
}

/* A hand-made result: the class TTFT counts completed requests of the
 * class only, from submission to the first token. */
static void test_class_ttft(void) {
    kv_bench_req q[4];
    memset(q, 0, sizeof q);
    double sub[4] = {0, 10, 20, 30}, first[4] = {100, 15, -1, 60};
    int cls[4] = {KV_WORKLOAD_LONG, KV_WORKLOAD_SHORT, KV_WORKLOAD_SHORT, KV_WORKLOAD_SHORT};
    kv_finish fin[4] = {KV_FINISH_LENGTH, KV_FINISH_EOS, KV_FINISH_REJECTED, KV_FINISH_LENGTH};
    for (int i = 0; i < 4; i++) {
        q[i].submit_ms = sub[i];
        q[i].first_token_ms = first[i];
        q[i].cls = cls[i];
        q[i].finish = fin[i];
    }
    kv_bench_result r;
    memset(&r, 0, sizeof r);
    r.reqs = q;
    r.n_requests = 4;
    kv_stat st;
    REQUIRE(kv_bench_class_ttft(&r, KV_WORKLOAD_SHORT, &st) == 0);
    CHECK(st.valid && st.n == 2 && st.p50 == 17.5 && st.max == 30); /* 5 and 30; the rejected one is out */
    REQUIRE(kv_bench_class_ttft(&r, KV_WORKLOAD_LONG, &st) == 0);
    CHECK(st.valid && st.n == 1 && st.p99 == 100);
    q[0].finish = KV_FINISH_CANCELLED;
    REQUIRE(kv_bench_class_ttft(&r, KV_WORKLOAD_LONG, &st) == 0);
    CHECK(!st.valid && st.n == 0);
}

/* Long requests queued ahead of short ones, max_seqs 2: FCFS makes the
 * short ones wait for the long ones; short_first and a priority class let
 * them in first (counted in admission order, not wall time). */
static void starve_config(kv_config *c) {
    test_bench_config(c, 2, 12, 64);
    c->scheduler.max_wait_ms = 0;
    c->workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 96};
    c->workload.short_fraction = 0.5;
    c->workload.short_prompt_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 8};
    c->workload.short_output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 8};
    c->workload.seed = 5;
}

/* Mean engine steps from submission to first token per class is what the
 * order changes; TTFT in ms follows it. Returns short mean - long mean of
 * the first-token times. */
static double short_minus_long(const kv_bench_result *r) {
    double s = 0, l = 0;
    int ns = 0, nl = 0;
    for (int i = 0; i < r->n_requests; i++) {
        double t = r->reqs[i].first_token_ms - r->reqs[i].submit_ms;
        if (r->reqs[i].cls == KV_WORKLOAD_SHORT) s += t, ns++;
        else l += t, nl++;
    }
    return ns && nl ? s / ns - l / nl : 0;
}

static void test_starvation_guards(void) {
    if (!harness_present(harness_shared_path("models/stories260K.gguf"), "the shared test models")) return;
    kv_config c;
    starve_config(&c);
    kv_workload *w = kv_workload_build(&c, NULL);
    REQUIRE(w);
    int n_short = 0;
    for (int i = 0; i < kv_workload_count(w); i++) {
        const kv_workload_item *it = kv_workload_get(w, i);
        if (it->cls == KV_WORKLOAD_SHORT) {
            n_short++;
            CHECK(it->prompt_tokens == 8 && it->output_tokens == 8);
        } else {
            CHECK(it->prompt_tokens == 64 && it->output_tokens == 96);
        }
    }
    kv_workload_free(w);
    CHECK(n_short >= 3 && n_short <= 9);
    kv_bench_result fcfs, sf, prio;
    kv_err err;
    REQUIRE(kv_bench_run(&c, NULL, &fcfs, &err) == 0);
    c.scheduler.order = KV_ORDER_SHORT_FIRST;
    REQUIRE(kv_bench_run(&c, NULL, &sf, &err) == 0);
    c.scheduler.order = KV_ORDER_FCFS;
    c.workload.short_priority = 1;
    REQUIRE(kv_bench_run(&c, NULL, &prio, &err) == 0);
    kv_stat f, s, p;
    REQUIRE(kv_bench_class_ttft(&fcfs, KV_WORKLOAD_SHORT, &f) == 0 && f.valid);
    REQUIRE(kv_bench_class_ttft(&sf, KV_WORKLOAD_SHORT, &s) == 0 && s.valid);
    REQUIRE(kv_bench_class_ttft(&prio, KV_WORKLOAD_SHORT, &p) == 0 && p.valid);
    /* FCFS: short requests wait behind long ones; the guards reverse it */
    CHECKF(short_minus_long(&fcfs) > 0 && short_minus_long(&sf) < 0 && short_minus_long(&prio) < 0,
           "short - long first-token ms: fcfs %.1f, short_first %.1f, priority %.1f", short_minus_long(&fcfs),
           short_minus_long(&sf), short_minus_long(&prio));
    CHECKF(s.p99 < f.p99 && p.p99 < f.p99, "short TTFT p99: fcfs %.1f, short_first %.1f, priority %.1f", f.p99,
           s.p99, p.p99);
    CHECK(same_outputs(&fcfs, &sf) && same_outputs(&fcfs, &prio));
    kv_bench_result_free(&fcfs);
    kv_bench_result_free(&sf);
    kv_bench_result_free(&prio);
}

TEST_MAIN(T(test_cascade_and_guards), T(test_class_ttft), T(test_starvation_guards))
