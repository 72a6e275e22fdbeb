/* bench_classes.c - what `kvtop bench` reports about the failure modes of
 * issue 17: preemption chains and the tokens they make the engine compute
 * again (the KV cascade), TTFT per request class (short requests starved
 * behind long ones), and the batch size the dynamic policy settled on
 * (throughput vs latency). The numbers come from the engine's summary and
 * from the bench's own per-request times. */
#include <stdlib.h>
#include <string.h>

#include "../engine/metrics.h"
#include "bench.h"

#include "../engine/metrics_json.h"

int kv_bench_class_ttft(const kv_bench_result *r, int cls, kv_stat *st) {
    memset(st, 0, sizeof *st);
    double *v = malloc((size_t)(r->n_requests > 0 ? r->n_requests : 1) * sizeof *v);
    if (!v) return KV_ERR_NOMEM;
    uint64_t n = 0;
    for (int i = 0; i < r->n_requests; i++) {
        const kv_bench_req *q = &r->reqs[i];
        int done = q->finish == KV_FINISH_EOS || q->finish == KV_FINISH_LENGTH || q->finish == KV_FINISH_STOP;
        if (q->cls == cls && done && q->first_token_ms >= 0) v[n++] = q->first_token_ms - q->submit_ms;
    }
    kv_stat_compute(st, v, n);
    free(v);
    return 0;
}

void kv_bench_print_failure(FILE *f, const kv_bench_result *r) {
    const kv_metrics_summary *m = &r->m;
    if (m->preemptions > 0)
        fprintf(f, "preemptions    %llu cascades (%llu preemptions in them, longest %d); %llu computed tokens "
                   "thrown away, %llu computed again\n",
                (unsigned long long)m->preemption_chains, (unsigned long long)m->chained_preemptions,
                m->longest_preemption_chain, (unsigned long long)m->tokens_discarded,
                (unsigned long long)m->tokens_recomputed);
    if (r->cfg.workload.short_fraction > 0) {
        for (int c = KV_WORKLOAD_SHORT; c >= KV_WORKLOAD_LONG; c--) {
            kv_stat st;
            if (kv_bench_class_ttft(r, c, &st)) return;
            if (!st.valid) {
                fprintf(f, "TTFT %-5s     no completed requests\n", kv_workload_class_name(c));
                continue;
            }
            fprintf(f, "TTFT %-5s     p50 %.1f ms, p99 %.1f ms over %llu requests\n", kv_workload_class_name(c), st.p50,
                    st.p99, (unsigned long long)st.n);
        }
    }
    if (kv_config_batch_dynamic(&r->cfg))
        fprintf(f, "batch size     %s: holds %.2f ms a step; the controller allows %d of max_seqs %d at the end\n",
                r->cfg.scheduler.target_tpot_ms > 0   ? "target TPOT"
                : r->cfg.sla.tpot_ms > 0              ? "max_seqs auto, the SLA's TPOT"
                                                      : "max_seqs auto, twice one sequence's fitted step",
                m->batch_goal_ms, m->batch_cap, kv_config_max_seqs(&r->cfg));
}

void kv_bench_json_failure(kv_json_writer *w, const kv_bench_result *r) {
    kv_json_write_key(w, "ttft_ms_by_class");
    kv_json_write_begin_object(w);
    for (int c = KV_WORKLOAD_LONG; c < KV_WORKLOAD_CLASSES; c++) {
        kv_stat st;
        if (kv_bench_class_ttft(r, c, &st)) memset(&st, 0, sizeof st);
        kv_stat_write_json(w, kv_workload_class_name(c), &st);
    }
    kv_json_write_end_object(w);
}
