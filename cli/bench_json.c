/* bench_json.c - `kvtop bench --json` and `--outputs`: a run (or a
 * comparison's runs) as one JSON document, with the profile it ran as keys
 * and as YAML that loads back, and every request's outcome as JSONL. */
#include "bench.h"
#include "bench_cost.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/metrics_json.h"
#include "../profiles/profile.h"

/* One key's value, typed: numbers as numbers, enums by name, distributions
 * as objects. */
static void json_config_value(kv_json_writer *w, const kv_config_key *k, const kv_config *c) {
    const char *p = (const char *)c + k->offset;
    switch (k->type) {
    case KV_KEY_INT:
    case KV_KEY_BOOL:
    case KV_KEY_ENUM: {
        int v;
        memcpy(&v, p, sizeof v);
        if (k->type == KV_KEY_INT) {
            kv_json_write_int(w, v);
        } else if (k->type == KV_KEY_BOOL) {
            kv_json_write_bool(w, v);
        } else {
            int nn = 0;
            while (k->names && k->names[nn]) nn++;
            kv_json_write_string(w, v >= 0 && v < nn ? k->names[v] : "?");
        }
        break;
    }
    case KV_KEY_U64:
    case KV_KEY_SIZE: {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        kv_json_write_uint(w, v);
        break;
    }
    case KV_KEY_DOUBLE: {
        double v;
        memcpy(&v, p, sizeof v);
        kv_json_write_number(w, v);
        break;
    }
    case KV_KEY_FLOAT: {
        float v;
        memcpy(&v, p, sizeof v);
        kv_json_write_number(w, v);
        break;
    }
    case KV_KEY_STRING: kv_json_write_string(w, kv_config_key_shown(k, c)); break; /* a secret as *** */
    case KV_KEY_DIST: {
        kv_dist d;
        memcpy(&d, p, sizeof d);
        kv_json_write_begin_object(w);
        kv_json_write_key(w, "dist");
        int nn = 0;
        while (k->names && k->names[nn]) nn++;
        kv_json_write_string(w, (int)d.kind >= 0 && (int)d.kind < nn ? k->names[d.kind] : "?");
        if (d.kind == KV_DIST_FIXED) {
            kv_json_field_num(w, "value", d.value);
        } else {
            kv_json_field_num(w, "min", d.min);
            kv_json_field_num(w, "max", d.max);
            if (d.kind == KV_DIST_LOGNORMAL) {
                kv_json_field_num(w, "mean", d.mean);
                kv_json_field_num(w, "sigma", d.sigma);
            }
        }
        kv_json_write_end_object(w);
        break;
    }
    }
}

/* The effective config as {"model": {"path": ...}, "threads": 0, ...}:
 * sections in the key table's order. */
static void json_config(kv_json_writer *w, const kv_config *c) {
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    kv_json_write_begin_object(w);
    for (int i = 0; i < n; i++) {
        const char *dot = strchr(keys[i].path, '.');
        if (!dot) {
            kv_json_write_key(w, keys[i].path);
            json_config_value(w, &keys[i], c);
            continue;
        }
        size_t sl = (size_t)(dot - keys[i].path);
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = !strncmp(keys[j].path, keys[i].path, sl) && keys[j].path[sl] == '.';
        if (seen) continue;
        char section[64];
        kv_copy_str(section, KV_MIN(sizeof section, sl + 1), keys[i].path);
        kv_json_write_key(w, section);
        kv_json_write_begin_object(w);
        for (int j = i; j < n; j++)
            if (!strncmp(keys[j].path, keys[i].path, sl) && keys[j].path[sl] == '.') {
                kv_json_write_key(w, keys[j].path + sl + 1);
                json_config_value(w, &keys[j], c);
            }
        kv_json_write_end_object(w);
    }
    kv_json_write_end_object(w);
}

void kv_bench_json_run(kv_json_writer *w, const char *profile, const kv_bench_result *r) {
    const kv_metrics_summary *m = &r->m;
    kv_json_write_begin_object(w);
    if (r->value[0]) kv_json_field_str(w, "value", r->value);
    kv_json_field_str(w, "profile", profile ? profile : "");
    if (r->error[0]) { /* nothing was measured */
        kv_json_field_str(w, "error", r->error);
        kv_json_write_end_object(w);
        return;
    }
    kv_json_field_str(w, "model", r->model_name);
    kv_json_field_str(w, "backend", r->backend);
    kv_json_field_uint(w, "requests", (uint64_t)r->n_requests);
    kv_json_field_uint(w, "requests_completed", r->completed);
    kv_json_field_uint(w, "requests_rejected", r->rejected);
    kv_json_field_uint(w, "requests_cancelled", r->cancelled);
    kv_json_field_uint(w, "requests_failed", r->errors);
    kv_metrics_write_json(w, m);
    kv_json_field_uint(w, "kv_blocks_total", (uint64_t)(r->kv_blocks_total > 0 ? r->kv_blocks_total : 0));
    kv_json_field_uint(w, "kv_block_size", (uint64_t)(r->kv_block_size > 0 ? r->kv_block_size : 0));
    kv_json_field_uint(w, "kv_bytes_per_token", r->kv_bytes_per_token);
    kv_json_field_str(w, "kv_dtype", kv_cache_dtype_name(r->cfg.kv.dtype));
    kv_json_field_str(w, "spec_method", kv_bench_enum_name("spec.method", r->cfg.spec.method));
    kv_bench_json_cost(w, r);
    kv_bench_json_failure(w, r);
    if (r->n_experts) {
        kv_json_field_uint(w, "experts", (uint64_t)r->n_experts);
        kv_json_field_uint(w, "experts_used", (uint64_t)r->n_experts_used);
        kv_json_write_key(w, "expert_tokens");
        kv_json_write_begin_array(w);
        for (int i = 0; i < r->n_experts; i++) kv_json_write_uint(w, r->expert_tokens[i]);
        kv_json_write_end_array(w);
        kv_json_field_num(w, "expert_imbalance", kv_bench_expert_imbalance(r));
        kv_json_field_num(w, "expert_step_imbalance", r->expert_step_imbalance);
    }
    kv_json_write_key(w, "memory");
    kv_json_write_begin_object(w);
    kv_json_field_uint(w, "weights", r->mem.weights);
    kv_json_field_uint(w, "weights_prepared", r->mem.weights_prepared); /* cpu: pre-packed panels */
    kv_json_field_uint(w, "kv_used", r->mem.kv_used);
    kv_json_field_uint(w, "kv_cached", r->mem.kv_cached);
    kv_json_field_uint(w, "kv_free", r->mem.kv_free);
    kv_json_field_uint(w, "kv_window_saved", r->mem.kv_window_saved); /* sliding-window release */
    kv_json_field_uint(w, "activations", r->mem.activations);
    kv_json_field_uint(w, "other", r->mem.other);
    kv_json_field_uint(w, "budget", r->mem.budget);
    kv_json_write_end_object(w);
    kv_json_field_uint(w, "steps", r->steps);
    kv_json_field_num(w, "wall_s", r->wall_s);
    kv_json_write_key(w, "config");
    json_config(w, &r->cfg);
    /* the same as a profile that loads back (kv_profile_dump) */
    char *yaml = NULL;
    size_t ylen = 0;
    FILE *mf = open_memstream(&yaml, &ylen);
    if (mf) {
        kv_profile_dump(&r->cfg, mf);
        fclose(mf);
    }
    kv_json_write_key(w, "config_yaml");
    if (yaml) kv_json_write_string_n(w, yaml, ylen);
    else kv_json_write_null(w);
    free(yaml);
    kv_json_write_end_object(w);
}

int kv_bench_write_json(FILE *f, const char *profile, const char *key, const kv_bench_result *runs, int n) {
    if (!f || !runs || n <= 0) return KV_ERR_INVAL;
    kv_json_writer w;
    kv_json_writer_init(&w, f, 1);
    if (key) {
        int n_failed = 0;
        for (int j = 0; j < n; j++) n_failed += runs[j].error[0] != 0;
        kv_json_write_begin_object(&w);
        kv_json_field_str(&w, "compare", key);
        kv_json_field_uint(&w, "failed_runs", (uint64_t)n_failed);
        kv_json_write_key(&w, "runs");
        kv_json_write_begin_array(&w);
        for (int j = 0; j < n; j++) kv_bench_json_run(&w, profile, &runs[j]);
        kv_json_write_end_array(&w);
        kv_json_write_end_object(&w);
    } else {
        kv_bench_json_run(&w, profile, &runs[0]);
    }
    int rc = kv_json_writer_finish(&w);
    fputc('\n', f);
    if (fflush(f) || ferror(f)) return KV_ERR_IO;
    return rc;
}

int kv_bench_write_outputs(FILE *f, const kv_bench_result *r) {
    if (!f || !r) return KV_ERR_INVAL;
    int rc = 0;
    for (int i = 0; i < r->n_requests && !rc; i++) {
        const kv_bench_req *q = &r->reqs[i];
        kv_json_writer w;
        kv_json_writer_init(&w, f, 0);
        kv_json_write_begin_object(&w);
        kv_json_field_int(&w, "index", i);
        kv_json_field_int(&w, "prompt_tokens", q->prompt_tokens);
        kv_json_field_int(&w, "output_tokens", q->output_tokens);
        kv_json_field_str(&w, "finish", kv_bench_finish_name(q->finish));
        kv_json_field_str(&w, "text", q->text ? q->text : "");
        if (q->reason[0]) kv_json_field_str(&w, "reason", q->reason);
        kv_json_write_end_object(&w);
        rc = kv_json_writer_finish(&w);
        fputc('\n', f);
    }
    if (fflush(f) || ferror(f)) return KV_ERR_IO;
    return rc;
}
