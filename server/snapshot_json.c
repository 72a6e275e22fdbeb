/* snapshot_json.c - kv_snapshot -> JSON with the engine's JSON writer.
 * Every field keeps its engine name and unit (ms on the engine clock,
 * bytes, tokens); enums are written as their names. The scalar members
 * come from the parser's field tables (kv_snapshot_write_part), so writer
 * and reader cannot drift apart. */
#include "snapshot_json.h"

#include "../engine/json.h"
#include "../engine/metrics_json.h"
#include "../engine/snapshot_parse.h"

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

static void write_metrics(kv_json_writer *w, const kv_metrics_summary *m) {
    kv_json_write_key(w, "metrics");
    kv_json_write_begin_object(w);
    kv_json_field_uint(w, "requests_submitted", m->requests_submitted);
    kv_json_field_uint(w, "requests_completed", m->requests_completed);
    kv_json_field_uint(w, "requests_cancelled", m->requests_cancelled);
    kv_json_field_uint(w, "requests_rejected", m->requests_rejected);
    kv_metrics_write_json(w, m);
    kv_json_write_end_object(w);
}

static void write_mem(kv_json_writer *w, const kv_mem_breakdown *m) {
    kv_json_write_key(w, "memory");
    kv_json_write_begin_object(w);
    kv_snapshot_write_part(w, KV_SNAP_PART_MEMORY, m);
    kv_json_write_end_object(w);
}

static void write_request(kv_json_writer *w, const kv_snapshot *s, const kv_snap_request *r) {
    kv_json_write_begin_object(w);
    kv_snapshot_write_part(w, KV_SNAP_PART_REQUEST, r);
    kv_json_field_str(w, "state", srv_req_state_name(r->state));
    kv_json_field_str(w, "finish", kv_finish_name(r->finish));
    kv_json_field_str(w, "wait_reason", r->wait_reason);
    kv_json_write_key(w, "block_table");
    kv_json_write_begin_array(w);
    for (int i = 0; i < r->n_blocks; i++) {
        int at = r->table_offset + i;
        if (at >= 0 && at < s->n_table_entries) kv_json_write_int(w, s->tables[at]);
    }
    kv_json_write_end_array(w);
    kv_json_write_end_object(w);
}

/* The block map, one array per field (one entry per physical block). */
static void write_blocks(kv_json_writer *w, const kv_snapshot *s) {
    static const char *const cols[] = {"state", "shared", "refcount", "fill", "owner", "session", "windowed"};
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
            case 5: kv_json_write_int(w, b->session); break;
            default: kv_json_write_bool(w, b->windowed); break;
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
        kv_snapshot_write_part(w, KV_SNAP_PART_STEP, r);
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
    kv_json_write_key(w, "decisions");
    kv_json_write_begin_array(w);
    for (int i = 0; i < s->n_decisions; i++) {
        const kv_decision *d = &s->decisions[i];
        if (since >= 0 && d->step <= (uint64_t)since) continue;
        kv_json_write_begin_object(w);
        kv_json_field_uint(w, "step", d->step);
        kv_json_field_str(w, "kind", decision_name(d->kind));
        kv_json_field_int(w, "req", d->req);
        kv_json_field_str(w, "text", d->text);
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
}

void srv_write_warnings(kv_json_writer *w, const char (*warnings)[KV_WARNING_LEN], int n) {
    kv_json_write_key(w, "warnings");
    kv_json_write_begin_array(w);
    for (int i = 0; warnings && i < n; i++) kv_json_write_string(w, warnings[i]);
    kv_json_write_end_array(w);
}

int srv_snapshot_write_warned(FILE *f, const kv_snapshot *s, const char *model, int64_t since_step, const char *check,
                              const char (*warnings)[KV_WARNING_LEN], int n_warnings) {
    kv_json_writer w;
    kv_json_writer_init(&w, f, 0);
    kv_json_write_begin_object(&w);
    kv_snapshot_write_part(&w, KV_SNAP_PART_TOP, s);
    kv_json_field_bool(&w, "delta", since_step >= 0);
    if (check) {
        kv_json_write_key(&w, "check");
        kv_json_write_begin_object(&w);
        kv_json_field_bool(&w, "ok", check[0] == 0);
        kv_json_field_str(&w, "message", check);
        kv_json_write_end_object(&w);
    }
    srv_write_warnings(&w, warnings, n_warnings);
    kv_json_write_key(&w, "config");
    kv_json_write_begin_object(&w);
    kv_json_field_str(&w, "model", model);
    kv_json_field_str(&w, "model_name", s->model_name);
    kv_json_field_str(&w, "backend", s->backend);
    kv_json_field_str(&w, "sim_device", s->sim_device);
    kv_json_field_int(&w, "block_size", s->block_size);
    kv_json_field_int(&w, "n_blocks", s->n_blocks);
    kv_json_field_str(&w, "kv_dtype", kv_cache_dtype_name(s->kv_dtype));
    kv_json_field_str(&w, "policy", s->policy == KV_POLICY_STATIC ? "static" : "continuous");
    kv_json_field_str(&w, "layout", s->layout == KV_LAYOUT_CONTIGUOUS ? "contiguous" : "paged");
    kv_json_field_bool(&w, "prefix_sharing", s->prefix_sharing);
    static const char *const spec[] = {"off", "draft_model", "self", "ngram"};
    kv_json_field_str(&w, "spec_method", (int)s->spec_method >= 0 && s->spec_method <= KV_SPEC_NGRAM ? spec[s->spec_method] : "?");
    kv_json_field_uint(&w, "kv_bytes_per_token", s->kv_bytes_per_token);
    kv_json_field_num(&w, "sla_ttft_ms", s->sla_ttft_ms);
    kv_json_field_num(&w, "sla_tpot_ms", s->sla_tpot_ms);
    kv_json_write_end_object(&w);
    kv_json_write_key(&w, "cache");
    kv_json_write_begin_object(&w);
    kv_snapshot_write_part(&w, KV_SNAP_PART_CACHE, s);
    kv_json_write_end_object(&w);
    write_metrics(&w, &s->metrics);
    write_mem(&w, &s->mem);
    kv_json_write_key(&w, "requests");
    kv_json_write_begin_array(&w);
    for (int i = 0; i < s->n_requests; i++) write_request(&w, s, &s->requests[i]);
    kv_json_write_end_array(&w);
    kv_json_field_ints(&w, "running", s->running, (size_t)KV_MAX(s->n_running, 0));
    kv_json_field_ints(&w, "waiting", s->waiting, (size_t)KV_MAX(s->n_waiting, 0));
    kv_json_field_ints(&w, "swapped", s->swapped, (size_t)KV_MAX(s->n_swapped, 0));
    write_blocks(&w, s);
    write_steps(&w, s, since_step);
    if (s->n_experts > 0) { /* a mixture of experts: the last step's tokens per expert, over layers */
        kv_json_write_key(&w, "experts");
        kv_json_write_begin_array(&w);
        for (int i = 0; i < s->n_experts && i < KV_MOE_MAX_EXPERTS; i++) kv_json_write_uint(&w, s->expert_tokens[i]);
        kv_json_write_end_array(&w);
    }
    kv_json_write_end_object(&w);
    return kv_json_writer_finish(&w);
}

int srv_snapshot_write(FILE *f, const kv_snapshot *s, const char *model, int64_t since_step, const char *check) {
    return srv_snapshot_write_warned(f, s, model, since_step, check, NULL, 0);
}
