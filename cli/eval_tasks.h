/* eval_tasks.h - the generation half of `kvtop eval --tasks DIR`: the JSON
 * and code task sets (engine/eval_tasks.h) answered greedily by every
 * weight type and KV dtype, scored, printed as one table (and JSON). The
 * text sets of DIR go through the ordinary `kvtop eval --text` path
 * (cmd_eval.c). */
#ifndef KV_CLI_EVAL_TASKS_H
#define KV_CLI_EVAL_TASKS_H

#include "../engine/config.h"

typedef struct kv_eval_tasks_opts {
    const char *dir;                /* holds json.jsonl and/or code.jsonl */
    const kv_config *cfg;           /* the profile (or defaults) the runs start from */
    const char *model_path, *tok_path, *backend, *tmp_dir;
    int threads;                    /* 0: all cores */
    const char *const *weights;     /* weight types with f16 KV; NULL: f32, q8_0, q4_0 and the file's own */
    int n_weights;
    const kv_cache_dtype *kv;       /* KV dtypes with the file's own weights; NULL: f16, int8, fp8_e4m3 */
    int n_kv;
    const char *json_path;          /* also write JSON here ('-': stdout); NULL: none */
    int quiet;
} kv_eval_tasks_opts;

/* Whether dir holds a generation task set (json.jsonl or code.jsonl). */
int kv_eval_tasks_present(const char *dir);

/* Runs every configuration over the sets in o->dir and prints the table.
 * Returns 0, 1 (a runtime error: model, python3, memory, printed) or 2 (a
 * bad task file, printed naming file:line). */
int kv_eval_tasks_run(const kv_eval_tasks_opts *o);

#endif
