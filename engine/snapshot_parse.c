/* snapshot_parse.c - JSON (server/snapshot_json.c's format) -> kv_snapshot.
 * Scalar members are read through tables of (name, offset, kind), so the
 * reader names the same fields as the writer once each; arrays and enums
 * are read by hand. kv_snapshot_write_part writes the scalar members from
 * the same tables, so a member's name and type are stated once. Everything lands in a scratch snapshot first and is
 * moved into the caller's only when the whole frame checked out. */
#include "snapshot_parse.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"
#include "json.h"

typedef enum fkind { F_I32, F_I64, F_U64, F_DBL, F_BOOL } fkind;

typedef struct field {
    const char *name;
    size_t off;
    fkind kind;
} field;

#define FI(T, m) {#m, offsetof(T, m), F_I32}
#define FL(T, m) {#m, offsetof(T, m), F_I64}
#define FU(T, m) {#m, offsetof(T, m), F_U64}
#define FD(T, m) {#m, offsetof(T, m), F_DBL}
#define FB(T, m) {#m, offsetof(T, m), F_BOOL}

static const field top_fields[] = {
    FU(kv_snapshot, step), FD(kv_snapshot, now_ms), FB(kv_snapshot, paused), FB(kv_snapshot, thread_running),
    FI(kv_snapshot, step_delay_ms),
};
static const field config_fields[] = {
    FI(kv_snapshot, block_size), FB(kv_snapshot, prefix_sharing), FU(kv_snapshot, kv_bytes_per_token),
    FD(kv_snapshot, sla_ttft_ms), FD(kv_snapshot, sla_tpot_ms),
};
static const field cache_fields[] = {
    FU(kv_snapshot, prefix_lookups), FU(kv_snapshot, prefix_hit_blocks), FU(kv_snapshot, prefix_hit_tokens),
    FU(kv_snapshot, evictions),      FU(kv_snapshot, cow_copies),        FI(kv_snapshot, blocks_free),
    FI(kv_snapshot, blocks_used),    FI(kv_snapshot, blocks_cached),     FI(kv_snapshot, blocks_shared),
    FI(kv_snapshot, blocks_windowed), FU(kv_snapshot, local_released),
};
static const field metrics_fields[] = {
    FD(kv_metrics_summary, elapsed_s),
    FU(kv_metrics_summary, requests_submitted),
    FU(kv_metrics_summary, requests_completed),
    FU(kv_metrics_summary, requests_cancelled),
    FU(kv_metrics_summary, requests_rejected),
    FU(kv_metrics_summary, input_tokens),
    FU(kv_metrics_summary, output_tokens),
    FU(kv_metrics_summary, prefill_tokens_computed),
    FD(kv_metrics_summary, input_tokens_per_s),
    FD(kv_metrics_summary, output_tokens_per_s),
    FD(kv_metrics_summary, decode_step_tokens_per_s),
    FD(kv_metrics_summary, requests_per_s),
    FD(kv_metrics_summary, goodput_requests_per_s),
    FD(kv_metrics_summary, sla_attainment),
    FD(kv_metrics_summary, kv_utilization),
    FD(kv_metrics_summary, prefix_hit_rate),
    FU(kv_metrics_summary, prefix_hit_tokens),
    FU(kv_metrics_summary, preemptions),
    FU(kv_metrics_summary, swaps_out),
    FU(kv_metrics_summary, swaps_in),
    FI(kv_metrics_summary, max_concurrent),
    FU(kv_metrics_summary, spec_drafts),
    FU(kv_metrics_summary, spec_drafted),
    FU(kv_metrics_summary, spec_accepted),
    FD(kv_metrics_summary, spec_acceptance_rate),
    FD(kv_metrics_summary, spec_mean_accepted_len),
    FD(kv_metrics_summary, sim_device_s),
    FU(kv_metrics_summary, sim_tokens_out),
    FD(kv_metrics_summary, sim_output_tokens_per_s),
};
static const field stat_fields[] = {
    FD(kv_stat, mean), FD(kv_stat, p50), FD(kv_stat, p90), FD(kv_stat, p99), FD(kv_stat, max), FU(kv_stat, n),
};
static const field mem_fields[] = {
    FU(kv_mem_breakdown, weights),      FU(kv_mem_breakdown, kv_used),       FU(kv_mem_breakdown, kv_cached),
    FU(kv_mem_breakdown, kv_free),      FU(kv_mem_breakdown, kv_swap_used),  FU(kv_mem_breakdown, kv_swap_total),
    FU(kv_mem_breakdown, activations),  FU(kv_mem_breakdown, other),         FU(kv_mem_breakdown, budget),
    FU(kv_mem_breakdown, kv_window_saved), FU(kv_mem_breakdown, weights_prepared),
};
static const field request_fields[] = {
    FL(kv_snap_request, id),          FI(kv_snap_request, session),     FI(kv_snap_request, priority),
    FI(kv_snap_request, n_prompt),    FI(kv_snap_request, n_computed),  FI(kv_snap_request, n_generated),
    FI(kv_snap_request, max_tokens),  FI(kv_snap_request, n_prefix_hit), FI(kv_snap_request, next_block),
    FI(kv_snap_request, next_offset), FI(kv_snap_request, preemptions), FD(kv_snap_request, arrival_ms),
    FD(kv_snap_request, queue_ms),    FD(kv_snap_request, ttft_ms),     FD(kv_snap_request, tpot_ms),
    FD(kv_snap_request, last_itl_ms), FD(kv_snap_request, e2e_ms),      FI(kv_snap_request, spec_k),
    FU(kv_snap_request, spec_drafts), FU(kv_snap_request, spec_drafted), FU(kv_snap_request, spec_accepted),
};
static const field step_fields[] = {
    FU(kv_step_record, step),          FD(kv_step_record, t_ms),          FD(kv_step_record, dur_ms),
    FD(kv_step_record, forward_ms),    FD(kv_step_record, sim_ms),        FI(kv_step_record, n_seqs),
    FI(kv_step_record, n_prefill_tokens), FI(kv_step_record, n_decode_tokens), FI(kv_step_record, n_spec_tokens),
    FI(kv_step_record, n_pad_tokens),  FI(kv_step_record, n_admitted),    FI(kv_step_record, n_preempted),
    FI(kv_step_record, n_swapped_out), FI(kv_step_record, n_swapped_in),  FI(kv_step_record, n_evicted),
    FI(kv_step_record, n_finished),    FI(kv_step_record, n_cow),         FI(kv_step_record, n_blocks_used),
    FI(kv_step_record, n_waiting),     FI(kv_step_record, n_experts),     FI(kv_step_record, expert_routed),
    FI(kv_step_record, expert_max),    FI(kv_step_record, expert_active),
};

#define NF(t) (sizeof(t) / sizeof(t[0]))

void kv_snapshot_write_part(kv_json_writer *w, kv_snap_part part, const void *obj) {
    static const struct {
        const field *tab;
        size_t n;
    } parts[] = {
        [KV_SNAP_PART_TOP] = {top_fields, NF(top_fields)},
        [KV_SNAP_PART_CACHE] = {cache_fields, NF(cache_fields)},
        [KV_SNAP_PART_MEMORY] = {mem_fields, NF(mem_fields)},
        [KV_SNAP_PART_REQUEST] = {request_fields, NF(request_fields)},
        [KV_SNAP_PART_STEP] = {step_fields, NF(step_fields)},
    };
    if ((int)part < 0 || (size_t)part >= NF(parts)) return;
    for (size_t i = 0; i < parts[part].n; i++) {
        const field *f = &parts[part].tab[i];
        const char *p = (const char *)obj + f->off;
        switch (f->kind) {
        case F_I32: kv_json_field_int(w, f->name, *(const int *)p); break;
        case F_I64: kv_json_field_int(w, f->name, *(const int64_t *)p); break;
        case F_U64: kv_json_field_uint(w, f->name, *(const uint64_t *)p); break;
        case F_DBL: kv_json_field_num(w, f->name, *(const double *)p); break;
        case F_BOOL: kv_json_field_bool(w, f->name, *(const int *)p); break;
        }
    }
}

/* Reads one member into base+f->off. A JSON null for a double means
 * "unknown" (the writer turns NaN into null) and reads as -1. */
static int read_field(const kv_json *v, const field *f, void *base, const char *where, kv_err *err) {
    char *p = (char *)base + f->off;
    kv_json_type t = kv_json_type_of(v);
    if (f->kind == F_BOOL) {
        if (t != KV_JSON_BOOL) return kv_err_set(err, KV_ERR_FORMAT, "%s.%s: expected true or false", where, f->name);
        *(int *)p = kv_json_bool(v);
        return 0;
    }
    if (f->kind == F_DBL && t == KV_JSON_NULL) {
        *(double *)p = -1;
        return 0;
    }
    if (t != KV_JSON_NUMBER) return kv_err_set(err, KV_ERR_FORMAT, "%s.%s: expected a number", where, f->name);
    double d = kv_json_number(v);
    switch (f->kind) {
    case F_DBL: *(double *)p = d; return 0;
    case F_I32:
        if (d != floor(d) || d < -2147483648.0 || d > 2147483647.0) break;
        *(int *)p = (int)d;
        return 0;
    case F_I64:
        if (d != floor(d) || d < -9.0e15 || d > 9.0e15) break;
        *(int64_t *)p = (int64_t)d;
        return 0;
    case F_U64:
        if (d != floor(d) || d < 0 || d > 1.8e19) break;
        *(uint64_t *)p = (uint64_t)d;
        return 0;
    default: break;
    }
    return kv_err_set(err, KV_ERR_FORMAT, "%s.%s: %.17g is not a valid integer here", where, f->name, d);
}

/* Reads every member of obj that the table names (others are ignored, so
 * a newer server's extra members do not break an older client). */
static int read_fields(const kv_json *obj, const field *tab, size_t n, void *base, const char *where, kv_err *err) {
    if (!obj) return 0;
    if (kv_json_type_of(obj) != KV_JSON_OBJECT) return kv_err_set(err, KV_ERR_FORMAT, "%s: expected an object", where);
    for (size_t i = 0; i < n; i++) {
        const kv_json *v = kv_json_get(obj, tab[i].name);
        if (v && read_field(v, &tab[i], base, where, err)) return err->code;
    }
    return 0;
}

/* Index of name in names[0..n), or -1. */
static int name_index(const char *name, const char *const *names, int n) {
    for (int i = 0; name && i < n; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

/* A string member into buf (cut to cap); absent: "". */
static int read_str(const kv_json *obj, const char *key, char *buf, size_t cap, const char *where, kv_err *err) {
    const kv_json *v = kv_json_get(obj, key);
    buf[0] = 0;
    if (!v) return 0;
    if (kv_json_type_of(v) != KV_JSON_STRING) return kv_err_set(err, KV_ERR_FORMAT, "%s.%s: expected a string", where, key);
    kv_copy_str(buf, cap, kv_json_str(v, NULL));
    return 0;
}

/* An enum member by name; absent: *out unchanged. */
static int read_enum(const kv_json *obj, const char *key, const char *const *names, int n, int *out, const char *where,
                     kv_err *err) {
    const kv_json *v = kv_json_get(obj, key);
    if (!v) return 0;
    int i = name_index(kv_json_str(v, NULL), names, n);
    if (i < 0) return kv_err_set(err, KV_ERR_FORMAT, "%s.%s: unknown value", where, key);
    *out = i;
    return 0;
}

/* An array member (absent: NULL with *n 0), at most max elements. */
static int get_array(const kv_json *obj, const char *key, size_t max, const kv_json **out, size_t *n, kv_err *err) {
    *out = kv_json_get(obj, key);
    *n = 0;
    if (!*out) return 0;
    if (kv_json_type_of(*out) != KV_JSON_ARRAY) return kv_err_set(err, KV_ERR_FORMAT, "%s: expected an array", key);
    *n = kv_json_len(*out);
    if (*n > max) return kv_err_set(err, KV_ERR_FORMAT, "%s: %zu entries, at most %zu accepted", key, *n, max);
    return 0;
}

static int read_config(const kv_json *c, kv_snapshot *s, char *model, size_t cap, kv_err *err) {
    static const char *const policy[] = {"continuous", "static"};
    static const char *const layout[] = {"paged", "contiguous"};
    static const char *const spec[] = {"off", "draft_model", "self", "ngram"};
    if (!c) return 0;
    if (read_fields(c, config_fields, NF(config_fields), s, "config", err)) return err->code;
    if (read_str(c, "model_name", s->model_name, sizeof s->model_name, "config", err) ||
        read_str(c, "backend", s->backend, sizeof s->backend, "config", err) ||
        read_str(c, "sim_device", s->sim_device, sizeof s->sim_device, "config", err))
        return err->code;
    if (model && read_str(c, "model", model, cap, "config", err)) return err->code;
    int p = s->policy == KV_POLICY_STATIC, l = s->layout == KV_LAYOUT_CONTIGUOUS, sp = (int)s->spec_method;
    if (read_enum(c, "policy", policy, 2, &p, "config", err) || read_enum(c, "layout", layout, 2, &l, "config", err) ||
        read_enum(c, "spec_method", spec, 4, &sp, "config", err))
        return err->code;
    s->policy = p ? KV_POLICY_STATIC : KV_POLICY_CONTINUOUS;
    s->layout = l ? KV_LAYOUT_CONTIGUOUS : KV_LAYOUT_PAGED;
    s->spec_method = (kv_spec_method)sp;
    const kv_json *d = kv_json_get(c, "kv_dtype");
    if (d && kv_cache_dtype_from_name(kv_json_str(d, NULL), &s->kv_dtype))
        return kv_err_set(err, KV_ERR_FORMAT, "config.kv_dtype: unknown KV dtype");
    if (s->block_size < 0 || s->block_size > 65536)
        return kv_err_set(err, KV_ERR_FORMAT, "config.block_size: %d is out of range", s->block_size);
    return 0;
}

static int read_stat(const kv_json *m, const char *key, kv_stat *st, kv_err *err) {
    const kv_json *v = kv_json_get(m, key);
    memset(st, 0, sizeof *st);
    if (!v || kv_json_type_of(v) == KV_JSON_NULL) return 0;
    /* a statistic without samples: its figures are null and n is 0 */
    if (kv_json_type_of(v) == KV_JSON_OBJECT && kv_json_type_of(kv_json_get(v, "p50")) == KV_JSON_NULL) return 0;
    char where[48];
    snprintf(where, sizeof where, "metrics.%s", key);
    if (read_fields(v, stat_fields, NF(stat_fields), st, where, err)) return err->code;
    st->valid = 1;
    return 0;
}

static int read_u64_array(const kv_json *m, const char *key, uint64_t *out, size_t n, kv_err *err) {
    const kv_json *a;
    size_t len;
    if (get_array(m, key, n, &a, &len, err)) return err->code;
    for (size_t i = 0; i < len; i++) {
        double d = kv_json_number(kv_json_at(a, i));
        if (kv_json_type_of(kv_json_at(a, i)) != KV_JSON_NUMBER || d < 0 || d != floor(d) || d > 1.8e19)
            return kv_err_set(err, KV_ERR_FORMAT, "metrics.%s[%zu]: expected a count", key, i);
        out[i] = (uint64_t)d;
    }
    return 0;
}

static int read_metrics(const kv_json *m, kv_metrics_summary *o, kv_err *err) {
    static const char *const stats[] = {"queue_ms", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"};
    kv_stat *dst[] = {&o->queue_ms, &o->ttft_ms, &o->tpot_ms, &o->itl_ms, &o->e2e_ms};
    if (!m) return 0;
    if (read_fields(m, metrics_fields, NF(metrics_fields), o, "metrics", err)) return err->code;
    for (size_t i = 0; i < NF(stats); i++)
        if (read_stat(m, stats[i], dst[i], err)) return err->code;
    if (read_u64_array(m, "spec_pos_accepted", o->spec_pos_accepted, KV_ARRAY_LEN(o->spec_pos_accepted), err) ||
        read_u64_array(m, "spec_pos_drafted", o->spec_pos_drafted, KV_ARRAY_LEN(o->spec_pos_drafted), err))
        return err->code;
    return 0;
}

/* An integer element of an array in [lo, hi]. */
static int array_int(const kv_json *a, size_t i, double lo, double hi, const char *what, int64_t *out, kv_err *err) {
    const kv_json *v = kv_json_at(a, i);
    double d = kv_json_number(v);
    if (kv_json_type_of(v) != KV_JSON_NUMBER || d != floor(d) || d < lo || d > hi)
        return kv_err_set(err, KV_ERR_FORMAT, "%s[%zu]: expected an integer in [%.0f, %.0f]", what, i, lo, hi);
    *out = (int64_t)d;
    return 0;
}

/* The block map: parallel arrays, all of the same length. */
static int read_blocks(const kv_json *b, kv_snapshot *s, kv_err *err) {
    static const char *const cols[] = {"state", "shared", "refcount", "fill", "owner", "session"};
    static const char *const states[] = {"free", "used", "cached"};
    const kv_json *col[6];
    size_t n = 0;
    if (!b) return 0;
    if (kv_json_type_of(b) != KV_JSON_OBJECT) return kv_err_set(err, KV_ERR_FORMAT, "blocks: expected an object");
    for (int c = 0; c < 6; c++) {
        size_t len;
        if (get_array(b, cols[c], KV_SNAPSHOT_PARSE_MAX_BLOCKS, &col[c], &len, err)) return err->code;
        if (!col[c]) return kv_err_set(err, KV_ERR_FORMAT, "blocks.%s: missing", cols[c]);
        if (c == 0) n = len;
        else if (len != n)
            return kv_err_set(err, KV_ERR_FORMAT, "blocks.%s: %zu entries, blocks.state has %zu", cols[c], len, n);
    }
    /* optional (sliding-window release; older writers lack it) */
    const kv_json *win = NULL;
    size_t wlen = 0;
    if (get_array(b, "windowed", KV_SNAPSHOT_PARSE_MAX_BLOCKS, &win, &wlen, err)) return err->code;
    if (win && wlen != n) return kv_err_set(err, KV_ERR_FORMAT, "blocks.windowed: %zu entries, blocks.state has %zu", wlen, n);
    if (kv_grow((void **)&s->blocks, &s->cap_blocks, (int)n, sizeof *s->blocks))
        return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    s->n_blocks = (int)n;
    for (size_t i = 0; i < n; i++) {
        kv_snap_block *o = &s->blocks[i];
        int64_t rc, fill, owner, session;
        int st = name_index(kv_json_str(kv_json_at(col[0], i), NULL), states, 3);
        if (st < 0) return kv_err_set(err, KV_ERR_FORMAT, "blocks.state[%zu]: unknown state", i);
        if (kv_json_type_of(kv_json_at(col[1], i)) != KV_JSON_BOOL)
            return kv_err_set(err, KV_ERR_FORMAT, "blocks.shared[%zu]: expected true or false", i);
        if (array_int(col[2], i, 0, 65535, "blocks.refcount", &rc, err) ||
            array_int(col[3], i, 0, 65535, "blocks.fill", &fill, err) ||
            array_int(col[4], i, -1, 2147483647.0, "blocks.owner", &owner, err) ||
            array_int(col[5], i, -1, 2147483647.0, "blocks.session", &session, err))
            return err->code;
        o->state = (uint8_t)st;
        o->shared = (uint8_t)kv_json_bool(kv_json_at(col[1], i));
        o->refcount = (uint16_t)rc;
        o->fill = (uint16_t)fill;
        o->owner = (int32_t)owner;
        o->session = (int32_t)session;
        if (win && kv_json_type_of(kv_json_at(win, i)) != KV_JSON_BOOL)
            return kv_err_set(err, KV_ERR_FORMAT, "blocks.windowed[%zu]: expected true or false", i);
        o->windowed = win ? (uint8_t)kv_json_bool(kv_json_at(win, i)) : 0;
        o->zero = 0;
    }
    return 0;
}

static int read_request(const kv_json *q, size_t i, kv_snapshot *s, kv_snap_request *o, kv_err *err) {
    static const char *const states[] = {"waiting", "running", "preempted", "swapped", "finished"};
    static const char *const finish[] = {"none", "eos", "length", "stop", "cancelled", "rejected", "error"};
    char where[40];
    snprintf(where, sizeof where, "requests[%zu]", i);
    if (kv_json_type_of(q) != KV_JSON_OBJECT) return kv_err_set(err, KV_ERR_FORMAT, "%s: expected an object", where);
    memset(o, 0, sizeof *o);
    o->ttft_ms = o->e2e_ms = o->queue_ms = -1;
    o->next_block = -1;
    if (read_fields(q, request_fields, NF(request_fields), o, where, err)) return err->code;
    int st = 0, fin = 0;
    if (read_enum(q, "state", states, 5, &st, where, err) || read_enum(q, "finish", finish, 7, &fin, where, err) ||
        read_str(q, "wait_reason", o->wait_reason, sizeof o->wait_reason, where, err))
        return err->code;
    o->state = (kv_req_state)st;
    o->finish = (kv_finish)fin;
    if (o->next_block < -1 || o->next_block >= s->n_blocks || o->next_offset < 0 || o->next_offset > 65535)
        return kv_err_set(err, KV_ERR_FORMAT, "%s.next_block: %d is not a block of the map (%d blocks)", where,
                          o->next_block, s->n_blocks);
    if (o->n_prompt < 0 || o->n_computed < 0 || o->n_generated < 0 || o->n_prefix_hit < 0)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: a negative token count", where);
    const kv_json *t;
    size_t n;
    if (get_array(q, "block_table", KV_SNAPSHOT_PARSE_MAX_BLOCKS, &t, &n, err)) return err->code;
    if ((size_t)s->n_table_entries + n > (size_t)KV_SNAPSHOT_PARSE_MAX_BLOCKS * 4)
        return kv_err_set(err, KV_ERR_FORMAT, "%s.block_table: too many entries in all", where);
    if (kv_grow((void **)&s->tables, &s->cap_tables, s->n_table_entries + (int)n, sizeof *s->tables))
        return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    o->table_offset = s->n_table_entries;
    o->n_blocks = (int)n;
    for (size_t k = 0; k < n; k++) {
        int64_t b;
        if (array_int(t, k, 0, s->n_blocks - 1, "block_table", &b, err)) return err->code;
        s->tables[s->n_table_entries++] = (int32_t)b;
    }
    return 0;
}

static int read_requests(const kv_json *root, kv_snapshot *s, kv_err *err) {
    const kv_json *a;
    size_t n;
    if (get_array(root, "requests", KV_SNAPSHOT_PARSE_MAX_REQUESTS, &a, &n, err)) return err->code;
    if (kv_grow((void **)&s->requests, &s->cap_requests, (int)n, sizeof *s->requests))
        return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    s->n_table_entries = 0;
    for (size_t i = 0; i < n; i++)
        if (read_request(kv_json_at(a, i), i, s, &s->requests[i], err)) return err->code;
    s->n_requests = (int)n;
    return 0;
}

static int read_queues(const kv_json *root, kv_snapshot *s, kv_err *err) {
    static const char *const names[] = {"running", "waiting", "swapped"};
    const kv_json *a[3];
    size_t n[3], most = 0;
    for (int q = 0; q < 3; q++) {
        if (get_array(root, names[q], KV_SNAPSHOT_PARSE_MAX_REQUESTS, &a[q], &n[q], err)) return err->code;
        if (n[q] > most) most = n[q];
    }
    int64_t **dst[3] = {&s->running, &s->waiting, &s->swapped};
    for (int q = 0; q < 3; q++) {
        int cap = s->cap_queue;
        if (kv_grow((void **)dst[q], &cap, (int)most, sizeof(int64_t)))
            return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        if (q == 2) s->cap_queue = cap;
    }
    for (int q = 0; q < 3; q++)
        for (size_t i = 0; i < n[q]; i++)
            if (array_int(a[q], i, 0, 9.0e15, names[q], &(*dst[q])[i], err)) return err->code;
    s->n_running = (int)n[0];
    s->n_waiting = (int)n[1];
    s->n_swapped = (int)n[2];
    return 0;
}

/* A mixture of experts' last-step row, "experts": [tokens per expert]
 * (absent: a dense model). */
static int read_experts(const kv_json *root, kv_snapshot *s, kv_err *err) {
    const kv_json *a;
    size_t n;
    if (get_array(root, "experts", KV_MOE_MAX_EXPERTS, &a, &n, err)) return err->code;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (array_int(a, i, 0, 4294967295.0, "experts", &v, err)) return err->code;
        s->expert_tokens[i] = (uint32_t)v;
    }
    s->n_experts = (int)n;
    return 0;
}

/* Keeps the newest max of the n elements at a (moved to the front);
 * returns how many are left. */
static int keep_newest(void *a, int n, int max, size_t elem) {
    if (n <= max) return n;
    memmove(a, (char *)a + (size_t)(n - max) * elem, (size_t)max * elem);
    return max;
}

/* Decisions; a delta frame appends its (newer steps') decisions to those
 * old held, the newest KV_SNAPSHOT_PARSE_KEEP_DECISIONS kept, so a reader
 * that takes only every other frame of a stream loses none. */
static int read_decisions(const kv_json *root, int delta, const kv_snapshot *old, kv_snapshot *s, kv_err *err) {
    static const char *const kinds[KV_DEC_KIND_COUNT] = {"admit", "chunk", "preempt", "swap_out", "swap_in",
                                                         "evict", "share", "cow",     "finish",   "reject",
                                                         "wait",  "cancel", "spec"};
    static const field f[] = {FU(kv_decision, step), FL(kv_decision, req)};
    const kv_json *a;
    size_t n;
    if (get_array(root, "decisions", 1 << 20, &a, &n, err)) return err->code;
    const int keep = delta ? old->n_decisions : 0;
    if (kv_grow((void **)&s->decisions, &s->cap_decisions, keep + (int)n, sizeof *s->decisions))
        return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    if (keep) memcpy(s->decisions, old->decisions, (size_t)keep * sizeof *s->decisions);
    int m = keep;
    for (size_t i = 0; i < n; i++) {
        const kv_json *d = kv_json_at(a, i);
        kv_decision *o = &s->decisions[m];
        char where[40];
        snprintf(where, sizeof where, "decisions[%zu]", i);
        memset(o, 0, sizeof *o);
        int k = 0;
        if (kv_json_type_of(d) != KV_JSON_OBJECT) return kv_err_set(err, KV_ERR_FORMAT, "%s: expected an object", where);
        if (read_fields(d, f, NF(f), o, where, err) || read_enum(d, "kind", kinds, KV_DEC_KIND_COUNT, &k, where, err) ||
            read_str(d, "text", o->text, sizeof o->text, where, err))
            return err->code;
        o->kind = (kv_decision_kind)k;
        if (keep && o->step <= old->decisions[keep - 1].step) continue; /* a step old already had */
        m++;
    }
    s->n_decisions = keep_newest(s->decisions, m, KV_SNAPSHOT_PARSE_KEEP_DECISIONS, sizeof *s->decisions);
    return 0;
}

/* Step records; a delta frame appends to what old held. */
static int read_steps(const kv_json *root, int delta, const kv_snapshot *old, kv_snapshot *s, kv_err *err) {
    const kv_json *a;
    size_t n;
    if (get_array(root, "steps", 1 << 20, &a, &n, err)) return err->code;
    int keep = delta ? old->n_steps : 0;
    if (kv_grow((void **)&s->steps, &s->cap_steps, keep + (int)n, sizeof *s->steps))
        return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    if (keep) memcpy(s->steps, old->steps, (size_t)keep * sizeof *s->steps);
    int m = keep;
    for (size_t i = 0; i < n; i++) {
        kv_step_record r;
        char where[40];
        snprintf(where, sizeof where, "steps[%zu]", i);
        memset(&r, 0, sizeof r);
        if (read_fields(kv_json_at(a, i), step_fields, NF(step_fields), &r, where, err)) return err->code;
        if (m && r.step <= s->steps[m - 1].step) continue; /* repeated or out of order */
        s->steps[m++] = r;
    }
    s->n_steps = keep_newest(s->steps, m, KV_SNAPSHOT_PARSE_KEEP_STEPS, sizeof *s->steps);
    return 0;
}

static int read_all(const kv_json *root, const kv_snapshot *old, kv_snapshot *s, char *model, size_t cap, kv_err *err) {
    if (kv_json_type_of(root) != KV_JSON_OBJECT) return kv_err_set(err, KV_ERR_FORMAT, "snapshot: expected an object");
    const kv_json *d = kv_json_get(root, "delta");
    int delta = d && kv_json_bool(d);
    if (read_fields(root, top_fields, NF(top_fields), s, "snapshot", err) ||
        read_config(kv_json_get(root, "config"), s, model, cap, err) ||
        read_fields(kv_json_get(root, "cache"), cache_fields, NF(cache_fields), s, "cache", err) ||
        read_metrics(kv_json_get(root, "metrics"), &s->metrics, err) ||
        read_fields(kv_json_get(root, "memory"), mem_fields, NF(mem_fields), &s->mem, "memory", err) ||
        read_blocks(kv_json_get(root, "blocks"), s, err) || read_requests(root, s, err) ||
        read_queues(root, s, err) || read_steps(root, delta, old, s, err) || read_decisions(root, delta, old, s, err) ||
        read_experts(root, s, err))
        return err->code;
    if (s->blocks_free < 0 || s->blocks_used < 0 || s->blocks_cached < 0 || s->blocks_shared < 0)
        return kv_err_set(err, KV_ERR_FORMAT, "cache: a negative block count");
    return 0;
}

/* Moves every array of src into dst (dst's old arrays go to src). */
static void swap_snap(kv_snapshot *a, kv_snapshot *b) {
    kv_snapshot t = *a;
    *a = *b;
    *b = t;
}

int kv_snapshot_parse(const char *text, size_t len, kv_snapshot *s, char *model, size_t cap, kv_err *err) {
    kv_err jerr;
    kv_json *root = kv_json_parse(text, len, &jerr);
    if (!root) return kv_err_set(err, jerr.code ? jerr.code : KV_ERR_FORMAT, "snapshot JSON: %s", jerr.msg);
    kv_snapshot *t = kv_snapshot_new();
    char m[128] = "";
    int rc = t ? read_all(root, s, t, model ? m : NULL, sizeof m, err) : kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    kv_json_free(root);
    if (rc == 0) {
        swap_snap(s, t);
        if (model) kv_copy_str(model, cap, m);
    }
    kv_snapshot_free(t);
    return rc;
}

/* dst's array *pd (capacity *cap) gets n elements of src. */
static int copy_arr(void **pd, int *cap, const void *src, int n, size_t elem) {
    if (n > 0 && kv_grow(pd, cap, n, elem)) return KV_ERR_NOMEM;
    if (n > 0) memcpy(*pd, src, (size_t)n * elem);
    return 0;
}

int kv_snapshot_copy(kv_snapshot *dst, const kv_snapshot *src) {
    int cq = dst->cap_queue, cq2 = dst->cap_queue, cq3 = dst->cap_queue;
    if (copy_arr((void **)&dst->requests, &dst->cap_requests, src->requests, src->n_requests, sizeof *src->requests) ||
        copy_arr((void **)&dst->tables, &dst->cap_tables, src->tables, src->n_table_entries, sizeof *src->tables) ||
        copy_arr((void **)&dst->running, &cq, src->running, src->n_running, sizeof(int64_t)) ||
        copy_arr((void **)&dst->waiting, &cq2, src->waiting, src->n_waiting, sizeof(int64_t)) ||
        copy_arr((void **)&dst->swapped, &cq3, src->swapped, src->n_swapped, sizeof(int64_t)) ||
        copy_arr((void **)&dst->blocks, &dst->cap_blocks, src->blocks, src->n_blocks, sizeof *src->blocks) ||
        copy_arr((void **)&dst->steps, &dst->cap_steps, src->steps, src->n_steps, sizeof *src->steps) ||
        copy_arr((void **)&dst->decisions, &dst->cap_decisions, src->decisions, src->n_decisions,
                 sizeof *src->decisions)) {
        dst->n_requests = dst->n_table_entries = dst->n_running = dst->n_waiting = dst->n_swapped = 0;
        dst->n_blocks = dst->n_steps = dst->n_decisions = 0;
        dst->cap_queue = KV_MIN(cq, KV_MIN(cq2, cq3));
        return KV_ERR_NOMEM;
    }
    /* The queues share one capacity: the smallest of the three is what all hold. */
    kv_snapshot keep = *dst;
    *dst = *src;
    dst->requests = keep.requests;
    dst->tables = keep.tables;
    dst->running = keep.running;
    dst->waiting = keep.waiting;
    dst->swapped = keep.swapped;
    dst->blocks = keep.blocks;
    dst->steps = keep.steps;
    dst->decisions = keep.decisions;
    dst->cap_requests = keep.cap_requests;
    dst->cap_tables = keep.cap_tables;
    dst->cap_blocks = keep.cap_blocks;
    dst->cap_steps = keep.cap_steps;
    dst->cap_decisions = keep.cap_decisions;
    dst->cap_queue = KV_MIN(cq, KV_MIN(cq2, cq3));
    return 0;
}
