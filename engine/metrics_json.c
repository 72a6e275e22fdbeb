/* metrics_json.c - the metrics summary as JSON members (see metrics_json.h). */
#include "metrics_json.h"

void kv_stat_write_json(kv_json_writer *w, const char *key, const kv_stat *st) {
    kv_json_write_key(w, key);
    kv_json_write_begin_object(w);
    const char *k[] = {"p50", "p90", "p99", "mean", "max"};
    double v[] = {st->p50, st->p90, st->p99, st->mean, st->max};
    for (int i = 0; i < 5; i++) {
        kv_json_write_key(w, k[i]);
        if (st->valid) kv_json_write_number(w, v[i]);
        else kv_json_write_null(w);
    }
    kv_json_field_uint(w, "n", st->valid ? st->n : 0);
    kv_json_write_end_object(w);
}

void kv_metrics_write_json(kv_json_writer *w, const kv_metrics_summary *m) {
    kv_json_field_uint(w, "input_tokens", m->input_tokens);
    kv_json_field_uint(w, "output_tokens", m->output_tokens);
    kv_json_field_uint(w, "prefill_tokens_computed", m->prefill_tokens_computed);
    kv_json_field_num(w, "input_tokens_per_s", m->input_tokens_per_s);
    kv_json_field_num(w, "output_tokens_per_s", m->output_tokens_per_s);
    kv_json_field_num(w, "decode_step_tokens_per_s", m->decode_step_tokens_per_s);
    kv_json_field_num(w, "requests_per_s", m->requests_per_s);
    kv_json_field_num(w, "goodput_requests_per_s", m->goodput_requests_per_s);
    kv_json_field_num(w, "sla_attainment", m->sla_attainment);
    kv_stat_write_json(w, "queue_ms", &m->queue_ms);
    kv_stat_write_json(w, "ttft_ms", &m->ttft_ms);
    kv_stat_write_json(w, "tpot_ms", &m->tpot_ms);
    kv_stat_write_json(w, "itl_ms", &m->itl_ms);
    kv_stat_write_json(w, "e2e_ms", &m->e2e_ms);
    kv_json_field_num(w, "kv_utilization", m->kv_utilization);
    kv_json_field_num(w, "prefix_hit_rate", m->prefix_hit_rate);
    kv_json_field_uint(w, "prefix_hit_tokens", m->prefix_hit_tokens);
    kv_json_field_uint(w, "preemptions", m->preemptions);
    kv_json_field_uint(w, "swaps_out", m->swaps_out);
    kv_json_field_uint(w, "swaps_in", m->swaps_in);
    kv_json_field_uint(w, "max_concurrent", (uint64_t)(m->max_concurrent > 0 ? m->max_concurrent : 0));
    kv_json_field_uint(w, "spec_drafts", m->spec_drafts);
    kv_json_field_uint(w, "spec_drafted", m->spec_drafted);
    kv_json_field_uint(w, "spec_accepted", m->spec_accepted);
    kv_json_field_num(w, "spec_acceptance_rate", m->spec_acceptance_rate);
    kv_json_field_num(w, "spec_mean_accepted_len", m->spec_mean_accepted_len);
    kv_json_field_uints(w, "spec_pos_accepted", m->spec_pos_accepted, KV_ARRAY_LEN(m->spec_pos_accepted));
    kv_json_field_uints(w, "spec_pos_drafted", m->spec_pos_drafted, KV_ARRAY_LEN(m->spec_pos_drafted));
    kv_json_field_num(w, "sim_device_s", m->sim_device_s);
    kv_json_field_uint(w, "sim_tokens_out", m->sim_tokens_out);
    kv_json_field_num(w, "sim_output_tokens_per_s", m->sim_output_tokens_per_s);
    kv_json_field_uint(w, "preemption_chains", m->preemption_chains);
    kv_json_field_uint(w, "chained_preemptions", m->chained_preemptions);
    kv_json_field_uint(w, "longest_preemption_chain", (uint64_t)KV_MAX(m->longest_preemption_chain, 0));
    kv_json_field_uint(w, "tokens_discarded", m->tokens_discarded);
    kv_json_field_uint(w, "tokens_recomputed", m->tokens_recomputed);
    kv_json_field_uint(w, "batch_cap", (uint64_t)KV_MAX(m->batch_cap, 0));
    kv_json_field_num(w, "batch_goal_ms", m->batch_goal_ms);
    kv_json_field_num(w, "elapsed_s", m->elapsed_s);
}
