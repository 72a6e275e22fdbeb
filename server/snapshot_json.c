/* snapshot_json.c - kv_snapshot -> JSON with the engine's JSON writer.
 * Every field keeps its engine name and unit (ms on the engine clock,
 * bytes, tokens); enums are written as their names. */
#include "snapshot_json.h"

#include "../engine/json.h"

const char *srv_req_state_name(kv_req_state st) {
    switch (st) {
    case KV_REQ_WAITING: return "waiting";
    case KV_REQ_RUNNING: return "running";
    case KV_REQ_PREEMPTED: return "preempted";
    case KV_REQ_SWAPPED: return "swapped";
    case KV_REQ_FINISHED: return "finished";
    }
    return "unknown";
}

const char *srv_finish_reason_name(kv_finish f) {
    switch (f) {
    case KV_FINISH_NONE: return "none";
    case KV_FINISH_EOS: return "eos";
    case KV_FINISH_LENGTH: return "length";
    case KV_FINISH_STOP: return "stop";
    case KV_FINISH_CANCELLED: return "cancelled";
    case KV_FINISH_REJECTED: return "rejected";
    case KV_FINISH_ERROR: return "error";
    }
    return "unknown";
}

static const char *decision_name(kv_decision_kind k) {
    static const char *const n[KV_DEC_KIND_COUNT] = {"admit", "chunk", "preempt", "swap_out", "swap_in",
                                                     "evict", "share", "cow",     "finish",   "reject",
                                                     "wait",  "cancel", "spec"};
    return (int)k >= 0 && k < KV_DEC_KIND_COUNT ? n[k] : "unknown";
}

static const char *block_state_name(uint8_t st) {
    switch (st) {
    case 0: return "free";
    case 1: return "used";
    case 2: return "cached";
    }
    return "unknown";
}

/* Shorthands for key: value pairs. */
static void kint(kv_json_writer *w, const char *k, int64_t v) {
    kv_json_write_key(w, k);
    kv_json_write_int(w, v);
}
static void kuint(kv_json_writer *w, const char *k, uint64_t v) {
    kv_json_write_key(w, k);
    kv_json_write_uint(w, v);
}
static void knum(kv_json_writer *w, const char *k, double v) {
    kv_json_write_key(w, k);
    kv_json_write_number(w, v);
}
static void kstr(kv_json_writer *w, const char *k, const char *v) {
    kv_json_write_key(w, k);
    kv_json_write_string(w, v);
}
static void kbool(kv_json_writer *w, const char *k, int v) {
    kv_json_write_key(w, k);
    kv_json_write_bool(w, v);
}

static void write_stat(kv_json_writer *w, const char *k, const kv_stat *s) {
    kv_json_write_key(w, k);
    if (!s->valid) {
        kv_json_write_null(w);
        return;
    }
    kv_json_write_begin_object(w);
    knum(w, "mean", s->mean);
    knum(w, "p50", s->p50);
    knum(w, "p90", s->p90);
    knum(w, "p99", s->p99);
    knum(w, "max", s->max);
    kuint(w, "n", s->n);
    kv_json_write_end_object(w);
}

static void write_metrics(kv_json_writer *w, const kv_metrics_summary *m) {
    kv_json_write_key(w, "metrics");
    kv_json_write_begin_object(w);
    knum(w, "elapsed_s", m->elapsed_s);
    kuint(w, "requests_submitted", m->requests_submitted);
    kuint(w, "requests_completed", m->requests_completed);
    kuint(w, "requests_cancelled", m->requests_cancelled);
    kuint(w, "requests_rejected", m->requests_rejected);
    kuint(w, "input_tokens", m->input_tokens);
    kuint(w, "output_tokens", m->output_tokens);
    kuint(w, "prefill_tokens_computed", m->prefill_tokens_computed);
    knum(w, "input_tokens_per_s", m->input_tokens_per_s);
    knum(w, "output_tokens_per_s", m->output_tokens_per_s);
    knum(w, "requests_per_s", m->requests_per_s);
    knum(w, "goodput_requests_per_s", m->goodput_requests_per_s);
    knum(w, "sla_attainment", m->sla_attainment);
    write_stat(w, "queue_ms", &m->queue_ms);
    write_stat(w, "ttft_ms", &m->ttft_ms);
    write_stat(w, "tpot_ms", &m->tpot_ms);
    write_stat(w, "itl_ms", &m->itl_ms);
    write_stat(w, "e2e_ms", &m->e2e_ms);
    knum(w, "kv_utilization", m->kv_utilization);
    knum(w, "prefix_hit_rate", m->prefix_hit_rate);
    kuint(w, "prefix_hit_tokens", m->prefix_hit_tokens);
    kuint(w, "preemptions", m->preemptions);
    kuint(w, "swaps_out", m->swaps_out);
    kuint(w, "swaps_in", m->swaps_in);
    kint(w, "max_concurrent", m->max_concurrent);
    kuint(w, "spec_drafts", m->spec_drafts);
    kuint(w, "spec_drafted", m->spec_drafted);
    kuint(w, "spec_accepted", m->spec_accepted);
    knum(w, "spec_acceptance_rate", m->spec_acceptance_rate);
    knum(w, "spec_mean_accepted_len", m->spec_mean_accepted_len);
    kv_json_write_key(w, "spec_pos_accepted");
    kv_json_write_begin_array(w);
    for (size_t i = 0; i < KV_ARRAY_LEN(m->spec_pos_accepted); i++) kv_json_write_uint(w, m->spec_pos_accepted[i]);
    kv_json_write_end_array(w);
    kv_json_write_key(w, "spec_pos_drafted");
    kv_json_write_begin_array(w);
    for (size_t i = 0; i < KV_ARRAY_LEN(m->spec_pos_drafted); i++) kv_json_write_uint(w, m->spec_pos_drafted[i]);
    kv_json_write_end_array(w);
    knum(w, "sim_device_s", m->sim_device_s);
    knum(w, "sim_output_tokens_per_s", m->sim_output_tokens_per_s);
    kv_json_write_end_object(w);
}

static void write_mem(kv_json_writer *w, const kv_mem_breakdown *m) {
    kv_json_write_key(w, "memory");
    kv_json_write_begin_object(w);
    kuint(w, "weights", m->weights);
    kuint(w, "kv_used", m->kv_used);
    kuint(w, "kv_cached", m->kv_cached);
    kuint(w, "kv_free", m->kv_free);
    kuint(w, "kv_swap_used", m->kv_swap_used);
    kuint(w, "kv_swap_total", m->kv_swap_total);
    kuint(w, "activations", m->activations);
    kuint(w, "other", m->other);
    kuint(w, "budget", m->budget);
    kv_json_write_end_object(w);
}

static void write_request(kv_json_writer *w, const kv_snapshot *s, const kv_snap_request *r) {
    kv_json_write_begin_object(w);
    kint(w, "id", r->id);
    kint(w, "session", r->session);
    kstr(w, "state", srv_req_state_name(r->state));
    kint(w, "priority", r->priority);
    kint(w, "n_prompt", r->n_prompt);
    kint(w, "n_computed", r->n_computed);
    kint(w, "n_generated", r->n_generated);
    kint(w, "max_tokens", r->max_tokens);
    kint(w, "n_prefix_hit", r->n_prefix_hit);
    kv_json_write_key(w, "block_table");
    kv_json_write_begin_array(w);
    for (int i = 0; i < r->n_blocks; i++) {
        int at = r->table_offset + i;
        if (at >= 0 && at < s->n_table_entries) kv_json_write_int(w, s->tables[at]);
    }
    kv_json_write_end_array(w);
    kint(w, "next_block", r->next_block);
    kint(w, "next_offset", r->next_offset);
    kint(w, "preemptions", r->preemptions);
    knum(w, "arrival_ms", r->arrival_ms);
    knum(w, "queue_ms", r->queue_ms);
    knum(w, "ttft_ms", r->ttft_ms);
    knum(w, "tpot_ms", r->tpot_ms);
    knum(w, "last_itl_ms", r->last_itl_ms);
    knum(w, "e2e_ms", r->e2e_ms);
    kstr(w, "finish", srv_finish_reason_name(r->finish));
    kstr(w, "wait_reason", r->wait_reason);
    kint(w, "spec_k", r->spec_k);
    kuint(w, "spec_drafts", r->spec_drafts);
    kuint(w, "spec_drafted", r->spec_drafted);
    kuint(w, "spec_accepted", r->spec_accepted);
    kv_json_write_end_object(w);
}

static void write_ids(kv_json_writer *w, const char *k, const int64_t *v, int n) {
    kv_json_write_key(w, k);
    kv_json_write_begin_array(w);
    for (int i = 0; i < n; i++) kv_json_write_int(w, v[i]);
    kv_json_write_end_array(w);
}

/* The block map, one array per field (one entry per physical block). */
static void write_blocks(kv_json_writer *w, const kv_snapshot *s) {
    static const char *const cols[] = {"state", "shared", "refcount", "fill", "owner", "session"};
    kv_json_write_key(w, "blocks");
    kv_json_write_begin_object(w);
    for (size_t c = 0; c < KV_ARRAY_LEN(cols); c++) {
        kv_json_write_key(w, cols[c]);
        kv_json_write_begin_array(w);
        for (int i = 0; s->blocks && i < s->n_blocks; i++) {
            const kv_snap_block *b = &s->blocks[i];
            switch (c) {
            case 0: kv_json_write_string(w, block_state_name(b->state)); break;
            case 1: kv_json_write_bool(w, b->shared); break;
            case 2: kv_json_write_int(w, b->refcount); break;
            case 3: kv_json_write_int(w, b->fill); break;
            case 4: kv_json_write_int(w, b->owner); break;
            default: kv_json_write_int(w, b->session); break;
            }
        }
        kv_json_write_end_array(w);
    }
    kv_json_write_end_object(w);
}

static void write_steps(kv_json_writer *w, const kv_snapshot *s, int64_t since) {
    kv_json_write_key(w, "steps");
    kv_json_write_begin_array(w);
    for (int i = 0; i < s->n_steps; i++) {
        const kv_step_record *r = &s->steps[i];
        if (since >= 0 && r->step <= (uint64_t)since) continue;
        kv_json_write_begin_object(w);
        kuint(w, "step", r->step);
        knum(w, "t_ms", r->t_ms);
        knum(w, "dur_ms", r->dur_ms);
        knum(w, "forward_ms", r->forward_ms);
        knum(w, "sim_ms", r->sim_ms);
        kint(w, "n_seqs", r->n_seqs);
        kint(w, "n_prefill_tokens", r->n_prefill_tokens);
        kint(w, "n_decode_tokens", r->n_decode_tokens);
        kint(w, "n_spec_tokens", r->n_spec_tokens);
        kint(w, "n_pad_tokens", r->n_pad_tokens);
        kint(w, "n_admitted", r->n_admitted);
        kint(w, "n_preempted", r->n_preempted);
        kint(w, "n_swapped_out", r->n_swapped_out);
        kint(w, "n_swapped_in", r->n_swapped_in);
        kint(w, "n_evicted", r->n_evicted);
        kint(w, "n_finished", r->n_finished);
        kint(w, "n_cow", r->n_cow);
        kint(w, "n_blocks_used", r->n_blocks_used);
        kint(w, "n_waiting", r->n_waiting);
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
    kv_json_write_key(w, "decisions");
    kv_json_write_begin_array(w);
    for (int i = 0; i < s->n_decisions; i++) {
        const kv_decision *d = &s->decisions[i];
        if (since >= 0 && d->step <= (uint64_t)since) continue;
        kv_json_write_begin_object(w);
        kuint(w, "step", d->step);
        kstr(w, "kind", decision_name(d->kind));
        kint(w, "req", d->req);
        kstr(w, "text", d->text);
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
}

int srv_snapshot_write_warned(FILE *f, const kv_snapshot *s, const char *model, int64_t since_step, const char *check,
                              const char (*warnings)[KV_WARNING_LEN], int n_warnings) {
    kv_json_writer w;
    kv_json_writer_init(&w, f, 0);
    kv_json_write_begin_object(&w);
    kuint(&w, "step", s->step);
    knum(&w, "now_ms", s->now_ms);
    kbool(&w, "paused", s->paused);
    kbool(&w, "thread_running", s->thread_running);
    kint(&w, "step_delay_ms", s->step_delay_ms);
    kbool(&w, "delta", since_step >= 0);
    if (check) {
        kv_json_write_key(&w, "check");
        kv_json_write_begin_object(&w);
        kbool(&w, "ok", check[0] == 0);
        kstr(&w, "message", check);
        kv_json_write_end_object(&w);
    }
    kv_json_write_key(&w, "warnings");
    kv_json_write_begin_array(&w);
    for (int i = 0; warnings && i < n_warnings; i++) kv_json_write_string(&w, warnings[i]);
    kv_json_write_end_array(&w);
    kv_json_write_key(&w, "config");
    kv_json_write_begin_object(&w);
    kstr(&w, "model", model);
    kstr(&w, "model_name", s->model_name);
    kstr(&w, "backend", s->backend);
    kstr(&w, "sim_device", s->sim_device);
    kint(&w, "block_size", s->block_size);
    kint(&w, "n_blocks", s->n_blocks);
    kstr(&w, "kv_dtype", kv_cache_dtype_name(s->kv_dtype));
    kstr(&w, "policy", s->policy == KV_POLICY_STATIC ? "static" : "continuous");
    kstr(&w, "layout", s->layout == KV_LAYOUT_CONTIGUOUS ? "contiguous" : "paged");
    kbool(&w, "prefix_sharing", s->prefix_sharing);
    static const char *const spec[] = {"off", "draft_model", "self", "ngram"};
    kstr(&w, "spec_method", (int)s->spec_method >= 0 && s->spec_method <= KV_SPEC_NGRAM ? spec[s->spec_method] : "?");
    kuint(&w, "kv_bytes_per_token", s->kv_bytes_per_token);
    knum(&w, "sla_ttft_ms", s->sla_ttft_ms);
    knum(&w, "sla_tpot_ms", s->sla_tpot_ms);
    kv_json_write_end_object(&w);
    kv_json_write_key(&w, "cache");
    kv_json_write_begin_object(&w);
    kuint(&w, "prefix_lookups", s->prefix_lookups);
    kuint(&w, "prefix_hit_blocks", s->prefix_hit_blocks);
    kuint(&w, "prefix_hit_tokens", s->prefix_hit_tokens);
    kuint(&w, "evictions", s->evictions);
    kuint(&w, "cow_copies", s->cow_copies);
    kint(&w, "blocks_free", s->blocks_free);
    kint(&w, "blocks_used", s->blocks_used);
    kint(&w, "blocks_cached", s->blocks_cached);
    kint(&w, "blocks_shared", s->blocks_shared);
    kv_json_write_end_object(&w);
    write_metrics(&w, &s->metrics);
    write_mem(&w, &s->mem);
    kv_json_write_key(&w, "requests");
    kv_json_write_begin_array(&w);
    for (int i = 0; i < s->n_requests; i++) write_request(&w, s, &s->requests[i]);
    kv_json_write_end_array(&w);
    write_ids(&w, "running", s->running, s->n_running);
    write_ids(&w, "waiting", s->waiting, s->n_waiting);
    write_ids(&w, "swapped", s->swapped, s->n_swapped);
    write_blocks(&w, s);
    write_steps(&w, s, since_step);
    kv_json_write_end_object(&w);
    return kv_json_writer_finish(&w);
}

int srv_snapshot_write(FILE *f, const kv_snapshot *s, const char *model, int64_t since_step, const char *check) {
    return srv_snapshot_write_warned(f, s, model, since_step, check, NULL, 0);
}
