/* cmd_eval_tasks.c - `kvtop eval --tasks DIR`, the generation task sets
 * (eval_tasks.h): for each configuration (a weight type with f16 KV, or a
 * KV dtype with the file's own weights) the prompts of each set run as one
 * greedy burst through the headless benchmark (so batching is the
 * engine's, and the answers are what `kvtop bench --outputs` would give),
 * then each answer is scored: JSON parsed and matched against its keys,
 * code run against its asserts in a sandboxed python3. Re-encoded weights
 * go to a temp file removed after the run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/eval.h"
#include "../engine/eval_tasks.h"
#include "../engine/json.h"
#include "../engine/quantize.h"
#include "bench.h"
#include "cli.h"
#include "eval_tasks.h"

enum { MAX_ROWS = 40, CODE_TIMEOUT_S = 10 };

static const char *const set_files[2] = {"json.jsonl", "code.jsonl"};

typedef struct row {
    char weights[24];
    kv_cache_dtype kv;
    int from_file;
    int ran;                 /* 0: the configuration could not run (why) */
    char why[256];
    int pass[2], n[2];       /* per set */
    int same[2];             /* answers identical to the first row's */
    char **answers[2];       /* (n) owned */
} row;

int kv_eval_tasks_present(const char *dir) {
    char p[1200];
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s", dir, set_files[k]);
        if (access(p, R_OK) == 0) return 1;
    }
    return 0;
}

/* The prompts of s as a workload prompts file. Returns 0 or -1. */
static int write_prompts(const char *path, const kv_task_set *s) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < s->n; i++) {
        kv_json_writer w;
        kv_json_writer_init(&w, f, 0);
        kv_json_write_begin_object(&w);
        kv_json_field_str(&w, "prompt", s->tasks[i].prompt);
        kv_json_write_end_object(&w);
        if (kv_json_writer_finish(&w)) break;
        fputc('\n', f);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* Greedy answers of set s under row r's configuration (model at path). */
static int answer_set(const kv_eval_tasks_opts *o, const char *model, const char *prompts, const kv_task_set *s,
                      const row *r, char ***out, char *why, size_t cap) {
    kv_config c = *o->cfg;
    kv_copy_str(c.model.path, sizeof c.model.path, model);
    kv_copy_str(c.model.tokenizer, sizeof c.model.tokenizer, o->tok_path ? o->tok_path : "");
    if (o->backend) kv_copy_str(c.backend, sizeof c.backend, o->backend);
    c.threads = o->threads;
    c.kv.dtype = r->kv;
    c.spec.method = KV_SPEC_OFF;
    c.sampling.temperature = 0;
    c.sampling.repeat_penalty = 1;
    c.scheduler.max_seq_len = 0;
    c.workload.requests = s->n;
    c.workload.arrival = KV_ARRIVAL_BURST;
    c.workload.system_prompt_len = 0;
    c.workload.short_fraction = 0;
    c.workload.ignore_eos = 0;
    int mt = 1;
    for (int i = 0; i < s->n; i++) mt = KV_MAX(mt, s->tasks[i].max_tokens);
    c.workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = mt, .min = mt, .max = mt, .mean = mt};
    kv_copy_str(c.workload.prompts_file, sizeof c.workload.prompts_file, prompts);
    kv_bench_result res;
    kv_err err = {0};
    if (kv_bench_run(&c, NULL, &res, &err)) {
        snprintf(why, cap, "%.250s", err.msg);
        return -1;
    }
    char **a = calloc((size_t)s->n, sizeof *a);
    for (int i = 0; a && i < s->n; i++) {
        a[i] = strdup(res.reqs[i].text ? res.reqs[i].text : "");
        if (!a[i]) {
            for (int j = 0; j < i; j++) free(a[j]);
            free(a);
            a = NULL;
        }
    }
    kv_bench_result_free(&res);
    if (!a) {
        snprintf(why, cap, "out of memory");
        return -1;
    }
    *out = a;
    return 0;
}

/* Scores answer i of set k. Returns 1, 0, or < 0 (python3 missing). */
static int score(int k, const kv_task *t, const char *answer, int *net) {
    char why[300];
    if (k == 0) return kv_task_json_check(t->prefix, answer, t->required, why, sizeof why);
    char *prog = kv_task_code_program(t->prompt, answer, t->tests);
    if (!prog) return KV_ERR_NOMEM;
    int rc = kv_task_run_python(prog, CODE_TIMEOUT_S, net, why, sizeof why);
    free(prog);
    return rc;
}

/* The configurations: weight types with f16 KV, then KV dtypes with the
 * file's own weights (the file with f16 once). */
static int make_rows(const kv_eval_tasks_opts *o, const char *native, row *rows) {
    static const char *const dw[] = {"f32", "q8_0", "q4_0"};
    static const kv_cache_dtype dk[] = {KV_CACHE_F16, KV_CACHE_INT8, KV_CACHE_FP8_E4M3};
    int n = 0;
    int nw = o->weights ? o->n_weights : 3, nk = o->kv ? o->n_kv : 3;
    for (int i = 0; i < nw + (o->weights ? 0 : 1) && n < MAX_ROWS; i++) {
        const char *w = i < nw ? (o->weights ? o->weights[i] : dw[i]) : native;
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= !strcmp(rows[j].weights, w);
        if (dup) continue;
        memset(&rows[n], 0, sizeof rows[n]);
        kv_copy_str(rows[n].weights, sizeof rows[n].weights, w);
        rows[n].from_file = !strcmp(w, native);
        rows[n++].kv = KV_CACHE_F16;
    }
    for (int i = 0; i < nk && n < MAX_ROWS; i++) {
        kv_cache_dtype k = o->kv ? o->kv[i] : dk[i];
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= rows[j].from_file && rows[j].kv == k;
        if (dup) continue;
        memset(&rows[n], 0, sizeof rows[n]);
        kv_copy_str(rows[n].weights, sizeof rows[n].weights, native);
        rows[n].from_file = 1;
        rows[n++].kv = k;
    }
    return n;
}

/* Runs row r over the loaded sets. */
static void run_row(const kv_eval_tasks_opts *o, const char *tmp, const char prompts[2][1100], const kv_task_set *sets,
                    row *r, const row *first, int *net, int *no_python) {
    char variant[1200];
    const char *model = o->model_path;
    if (!r->from_file) {
        kv_quantize_params qp = {.n_threads = o->threads};
        kv_err err = {0};
        snprintf(variant, sizeof variant, "%.1100s/%.23s.gguf", tmp, r->weights);
        if (kv_quant_target_from_name(r->weights, &qp.target, &err) ||
            kv_quantize_file(o->model_path, variant, &qp, NULL, &err)) {
            snprintf(r->why, sizeof r->why, "%.250s", err.msg);
            return;
        }
        model = variant;
    }
    r->ran = 1;
    for (int k = 0; k < 2 && r->ran; k++) {
        if (!sets[k].n) continue;
        if (!o->quiet) fprintf(stderr, "kvtop eval: %s weights, %s KV: %s\n", r->weights, kv_cache_dtype_name(r->kv),
                               set_files[k]);
        if (answer_set(o, model, prompts[k], &sets[k], r, &r->answers[k], r->why, sizeof r->why)) {
            r->ran = 0;
            break;
        }
        r->n[k] = sets[k].n;
        for (int i = 0; i < sets[k].n; i++) {
            int s = *no_python && k == 1 ? 0 : score(k, &sets[k].tasks[i], r->answers[k][i], net);
            if (s == KV_ERR_UNSUPPORTED) *no_python = 1;
            r->pass[k] += s == 1;
            r->same[k] += !first || (first->ran && first->answers[k] && !strcmp(first->answers[k][i], r->answers[k][i]));
        }
    }
    if (!r->from_file) unlink(variant);
}

static void print_rows(const kv_eval_tasks_opts *o, const row *rows, int n, const kv_task_set *sets, int net,
                       int no_python) {
    printf("kvtop eval --tasks %s: %s (greedy; answers = first row: identical answers)\n", o->dir, o->model_path);
    printf("%-12s %-10s", "weights", "KV");
    for (int k = 0; k < 2; k++)
        if (sets[k].n) printf("  %-10s %-9s", k ? "code pass" : "json pass", "= row 1");
    putchar('\n');
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        char w[40];
        snprintf(w, sizeof w, "%.23s%s", r->weights, r->from_file ? " (file)" : "");
        printf("%-12s %-10s", w, kv_cache_dtype_name(r->kv));
        if (!r->ran) {
            printf("  N/A: %s\n", r->why);
            continue;
        }
        for (int k = 0; k < 2; k++) {
            if (!sets[k].n) continue;
            char p[24], s[24];
            snprintf(p, sizeof p, "%d/%d", r->pass[k], r->n[k]);
            snprintf(s, sizeof s, "%d/%d", r->same[k], r->n[k]);
            printf("  %-10s %-9s", p, s);
        }
        putchar('\n');
    }
    if (sets[1].n && no_python) printf("note: python3 could not be started: code tasks count as failed\n");
    else if (sets[1].n && !net) printf("note: no network namespace allowed here: code ran with the network reachable\n");
}

static int write_json(const kv_eval_tasks_opts *o, const row *rows, int n, const kv_task_set *sets) {
    FILE *f = strcmp(o->json_path, "-") ? fopen(o->json_path, "w") : stdout;
    if (!f) return -1;
    kv_json_writer w;
    kv_json_writer_init(&w, f, 1);
    kv_json_write_begin_object(&w);
    kv_json_field_str(&w, "model", o->model_path);
    kv_json_field_str(&w, "tasks", o->dir);
    kv_json_write_key(&w, "rows");
    kv_json_write_begin_array(&w);
    for (int i = 0; i < n; i++) {
        kv_json_write_begin_object(&w);
        kv_json_field_str(&w, "weights", rows[i].weights);
        kv_json_field_str(&w, "kv", kv_cache_dtype_name(rows[i].kv));
        kv_json_field_bool(&w, "from_file", rows[i].from_file);
        if (!rows[i].ran) {
            kv_json_field_str(&w, "error", rows[i].why);
        }
        for (int k = 0; k < 2 && rows[i].ran; k++) {
            if (!sets[k].n) continue;
            kv_json_write_key(&w, k ? "code" : "json");
            kv_json_write_begin_object(&w);
            kv_json_field_int(&w, "pass", rows[i].pass[k]);
            kv_json_field_int(&w, "n", rows[i].n[k]);
            kv_json_field_int(&w, "same_as_first_row", rows[i].same[k]);
            kv_json_write_end_object(&w);
        }
        kv_json_write_end_object(&w);
    }
    kv_json_write_end_array(&w);
    kv_json_write_end_object(&w);
    int rc = kv_json_writer_finish(&w);
    fputc('\n', f);
    if (f != stdout && fclose(f) != 0) rc = -1;
    return rc;
}

/* Loads the sets of dir (absent files give empty sets). Returns 0 or 2. */
static int load_sets(const char *dir, kv_task_set *sets) {
    for (int k = 0; k < 2; k++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, set_files[k]);
        if (access(p, F_OK) != 0) continue;
        size_t len;
        char *buf = cli_read_file(p, &len);
        kv_err err = {0};
        if (!buf || kv_task_set_parse(buf, len, p, k ? KV_TASK_CODE : KV_TASK_JSON, &sets[k], &err)) {
            fprintf(stderr, "kvtop eval: %s\n", buf ? err.msg : "cannot read a task file");
            free(buf);
            return 2;
        }
        free(buf);
    }
    return 0;
}

int kv_eval_tasks_run(const kv_eval_tasks_opts *o) {
    kv_task_set sets[2] = {{0}, {0}};
    row rows[MAX_ROWS];
    int n = 0, rc = load_sets(o->dir, sets), net = 0, no_python = 0;
    char tmp[1100] = "", prompts[2][1100] = {"", ""};
    if (rc) goto done;
    rc = 1;
    kv_err err = {0};
    kv_model *m = kv_model_load(o->model_path, o->tok_path, &err);
    if (!m) {
        fprintf(stderr, "kvtop eval: %s\n", err.msg);
        goto done;
    }
    char native[24];
    kv_eval_native_type(m, native, sizeof native);
    kv_model_free(m);
    const char *base = o->tmp_dir ? o->tmp_dir : getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/kvtop-tasks-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "kvtop eval: cannot make a temp directory under %s\n", base && *base ? base : "/tmp");
        tmp[0] = 0;
        goto done;
    }
    for (int k = 0; k < 2; k++) {
        snprintf(prompts[k], sizeof prompts[k], "%s/prompts-%d.jsonl", tmp, k);
        if (sets[k].n && write_prompts(prompts[k], &sets[k])) {
            fprintf(stderr, "kvtop eval: cannot write %s\n", prompts[k]);
            goto done;
        }
    }
    n = make_rows(o, native, rows);
    for (int i = 0; i < n; i++) run_row(o, tmp, prompts, sets, &rows[i], i ? &rows[0] : NULL, &net, &no_python);
    print_rows(o, rows, n, sets, net, no_python);
    rc = 0;
    if (o->json_path && write_json(o, rows, n, sets)) {
        fprintf(stderr, "kvtop eval: writing %s failed\n", o->json_path);
        rc = 1;
    }
done:
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            for (int j = 0; rows[i].answers[k] && j < rows[i].n[k]; j++) free(rows[i].answers[k][j]);
            free(rows[i].answers[k]);
        }
    if (tmp[0]) {
        for (int k = 0; k < 2; k++) unlink(prompts[k]);
        rmdir(tmp);
    }
    kv_task_set_free(&sets[0]);
    kv_task_set_free(&sets[1]);
    return rc;
}
