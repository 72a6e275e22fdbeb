/* cmd_eval.c - `kvtop eval`: the accuracy price of quantization on a text.
 * Perplexity, KL divergence to an f32 reference, top-1 agreement and the
 * largest logit error per weight type and KV dtype, as one table (and JSON).
 * The computation is engine/eval.c; this file parses options and prints. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/eval.h"
#include "../engine/json.h"
#include "../engine/quantize.h"
#include "../profiles/profile.h"
#include "cli.h"
#include "commands.h"
#include "eval_tasks.h"

#define MAX_LIST 32 /* entries of --weights / --kv */

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvtop eval PROFILE --text FILE [options]\n"
            "       kvtop eval -m MODEL --text FILE [options]\n"
            "       kvtop eval PROFILE|-m MODEL --tasks DIR [options]\n"
            "  runs the text through the model in windows and reports, for each weight type\n"
            "  (with an f16 KV cache) and each KV dtype (with the file's own weights), the\n"
            "  perplexity and, against a reference with f32 weights and an f32 KV cache,\n"
            "  the mean KL(ref || config) of next-token distributions, top-1 agreement and\n"
            "  the largest logit error. Other weight types are re-encoded from the model\n"
            "  file into temp files (removed afterwards).\n"
            "  --text FILE        the text to evaluate (e.g. data/eval/kvtop-eval.txt)\n"
            "  --tasks DIR        task sets (e.g. data/eval/tasks): every DIR/*.txt as --text,\n"
            "                     then json.jsonl (answers that parse and match their keys) and\n"
            "                     code.jsonl (completions that pass their asserts in a sandboxed\n"
            "                     python3), greedy, per weight type and KV dtype\n"
            "  -m MODEL           a GGUF file or llama2.c checkpoint instead of a profile\n"
            "  --tokenizer FILE   llama2.c tokenizer (for .bin checkpoints)\n"
            "  --set key=value    override a profile key (repeatable)\n"
            "  --weights LIST     weight types, comma-separated (default f32,q8_0,q4_0 and the\n"
            "                     file's own type; 'none' for no weight rows):\n"
            "                     %s\n"
            "  --kv LIST          KV dtypes (default f16,int8,fp8_e4m3; 'none' for no KV rows):\n"
            "                     f32, f16, int8, int8_asym, fp8_e4m3, fp8_e5m2\n"
            "  --grid             every weight type with every KV dtype (one row each)\n"
            "  --ctx N            tokens per window (default: min(model context, 512))\n"
            "  --bos | --no-bos   start every window with BOS (default: the tokenizer's add_bos)\n"
            "  -t THREADS         (default: the profile's, else all cores)\n"
            "  --backend NAME     (default: the profile's, else cpu)\n"
            "  --tmp-dir DIR      where re-encoded variants go (default $TMPDIR or /tmp)\n"
            "  --json FILE        also write the results as JSON ('-' for stdout)\n"
            "  -q, --quiet        no progress lines on stderr\n"
            "Exit status: 0 ok, 1 runtime error (model, text, memory), 2 usage error.\n",
            kv_quant_target_names());
}

/* Splits a comma-separated list in place into items; "none" or "" gives
 * none. Returns the count, or -1 when there are more than cap. */
static int split_list(char *s, char **items, int cap) {
    int n = 0;
    if (!strcmp(s, "none")) return 0;
    for (char *tok = strtok(s, ", "); tok; tok = strtok(NULL, ", ")) {
        if (n == cap) return -1;
        items[n++] = tok;
    }
    return n;
}

static void log_progress(void *ctx, const char *msg) {
    (void)ctx;
    /* On a terminal the progress line overwrites itself. */
    fprintf(stderr, "\r\033[Kkvtop eval: %s", msg);
    fflush(stderr);
}

static void log_lines(void *ctx, const char *msg) {
    (void)ctx;
    fprintf(stderr, "kvtop eval: %s\n", msg);
}

/* KL values span many decades: fixed point when readable, else scientific. */
static const char *fmt_kl(double v, char *buf, size_t cap) {
    if (v == 0) snprintf(buf, cap, "0");
    else if (isnan(v)) snprintf(buf, cap, "nan");
    else if (v < 1e-3) snprintf(buf, cap, "%.2e", v);
    else snprintf(buf, cap, "%.5f", v);
    return buf;
}

static void row_label(const kv_eval_row *r, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s", r->weights, r->is_ref ? " (ref)" : r->from_file ? " (file)" : "");
}

static void print_table(FILE *f, const kv_eval_report *rep, const char *model_path, const char *text_path) {
    fprintf(f, "model      %s (%s), weights in the file: %s\n", rep->model, model_path, rep->native);
    fprintf(f, "text       %s: %d tokens, %d window%s of <= %d tokens%s, %lld predictions\n", text_path,
            rep->n_text_tokens, rep->n_windows, rep->n_windows == 1 ? "" : "s", rep->ctx,
            rep->bos ? " (BOS first)" : "", (long long)rep->n_scored);
    fprintf(f, "reference  f32 weights, f32 KV cache; KL = mean KL(ref || config) in nats\n\n");
    fprintf(f, "%-14s %-9s %10s %10s %10s %8s %10s %8s %11s %7s\n", "weights", "kv", "weight mem", "KV/token",
            "ppl", "dppl", "mean KL", "top-1", "max|dlogit|", "time s");
    const double ref_ppl = rep->rows[0].ppl;
    for (int i = 0; i < rep->n_rows; i++) {
        const kv_eval_row *r = &rep->rows[i];
        char w[40], wb[32], kb[32], kl[32], dp[32];
        row_label(r, w, sizeof w);
        cli_bytes(r->weight_bytes, wb, sizeof wb);
        cli_bytes(r->kv_bytes_per_token, kb, sizeof kb);
        if (r->is_ref) snprintf(dp, sizeof dp, "-");
        else snprintf(dp, sizeof dp, "%+.2f%%", 100.0 * (r->ppl / ref_ppl - 1.0));
        fprintf(f, "%-14s %-9s %10s %10s %10.4f %8s %10s %7.2f%% %11.4f %7.2f\n", w, kv_cache_dtype_name(r->kv), wb,
                kb, r->ppl, dp, fmt_kl(r->mean_kl, kl, sizeof kl), 100.0 * r->top1, r->max_abs_err, r->seconds);
    }
}

static int write_json(FILE *f, const kv_eval_report *rep, const char *model_path, const char *text_path) {
    kv_json_writer w;
    kv_json_writer_init(&w, f, 1);
    kv_json_write_begin_object(&w);
    kv_json_field_str(&w, "model", rep->model);
    kv_json_field_str(&w, "model_path", model_path);
    kv_json_field_str(&w, "native_weights", rep->native);
    kv_json_field_str(&w, "text", text_path);
    kv_json_field_int(&w, "text_tokens", rep->n_text_tokens);
    kv_json_field_int(&w, "predictions", rep->n_scored);
    kv_json_field_int(&w, "ctx", rep->ctx);
    kv_json_field_int(&w, "windows", rep->n_windows);
    kv_json_field_bool(&w, "bos", rep->bos);
    kv_json_field_int(&w, "n_vocab", rep->n_vocab);
    kv_json_field_num(&w, "seconds", rep->seconds);
    kv_json_write_key(&w, "rows");
    kv_json_write_begin_array(&w);
    for (int i = 0; i < rep->n_rows; i++) {
        const kv_eval_row *r = &rep->rows[i];
        kv_json_write_begin_object(&w);
        kv_json_field_str(&w, "weights", r->weights);
        kv_json_field_bool(&w, "from_file", r->from_file);
        kv_json_field_bool(&w, "reference", r->is_ref);
        kv_json_field_str(&w, "kv", kv_cache_dtype_name(r->kv));
        kv_json_field_uint(&w, "weight_bytes", r->weight_bytes);
        kv_json_field_uint(&w, "kv_bytes_per_token", r->kv_bytes_per_token);
        kv_json_field_num(&w, "ppl", r->ppl);
        kv_json_field_num(&w, "mean_kl", r->mean_kl);
        kv_json_field_num(&w, "top1_agreement", r->top1);
        kv_json_field_num(&w, "max_abs_logit_err", r->max_abs_err);
        kv_json_field_num(&w, "seconds", r->seconds);
        kv_json_write_end_object(&w);
    }
    kv_json_write_end_array(&w);
    kv_json_write_end_object(&w);
    int rc = kv_json_writer_finish(&w);
    fputc('\n', f);
    return rc;
}

/* The command line (strings borrowed from argv, or from the profile's
 * kv_config once apply_profile has run). */
typedef struct eval_opts {
    const char *profile, *model_path, *tok_path, *text_path, *json_path;
    const char *weights_arg, *kv_arg, *backend, *tmp_dir;
    int ctx;         /* 0: the default window */
    int threads;     /* -1: the profile's, else all cores */
    int bos;         /* -1: the tokenizer's add_bos */
    int quiet, grid;
    const char *tasks_dir; /* --tasks */
    int help;        /* 1: -h / --help was given (and answered) */
    const char **sets; /* (n_sets) --set overrides; owned, room for argc */
    int n_sets;
} eval_opts;

/* --weights and --kv split and checked (wl points into wbuf). */
typedef struct eval_lists {
    char *wbuf, *kbuf; /* owned copies of the lists */
    char *wl[MAX_LIST];
    int n_w;           /* -1: the default set */
    kv_cache_dtype kvs[MAX_LIST];
    int n_kv;          /* -1: the default set */
} eval_lists;

/* Reads the options into o; free o->sets afterwards, also on failure.
 * Returns 0 (with o->help set when the usage went to stdout), 1 when
 * out of memory, or 2 with a usage error printed. */
static int parse_args(int argc, char **argv, eval_opts *o /* OUT: */) {
    memset(o, 0, sizeof *o);
    o->threads = -1;
    o->bos = -1;
    if (!(o->sets = calloc((size_t)argc + 1, sizeof *o->sets))) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            o->help = 1;
            return 0;
        } else if (!strncmp(a, "--set=", 6)) o->sets[o->n_sets++] = a + 6;
        else if (!strcmp(a, "--set")) bad = cli_str(argc, argv, &i, &o->sets[o->n_sets++]);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) bad = cli_str(argc, argv, &i, &o->model_path);
        else if (!strcmp(a, "--tokenizer")) bad = cli_str(argc, argv, &i, &o->tok_path);
        else if (!strcmp(a, "--text")) bad = cli_str(argc, argv, &i, &o->text_path);
        else if (!strcmp(a, "--tasks")) bad = cli_str(argc, argv, &i, &o->tasks_dir);
        else if (!strcmp(a, "--weights")) bad = cli_str(argc, argv, &i, &o->weights_arg);
        else if (!strcmp(a, "--kv")) bad = cli_str(argc, argv, &i, &o->kv_arg);
        else if (!strcmp(a, "--ctx")) bad = cli_int(argc, argv, &i, 2, 1 << 24, &o->ctx);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) bad = cli_int(argc, argv, &i, 0, 1024, &o->threads);
        else if (!strcmp(a, "--backend")) bad = cli_str(argc, argv, &i, &o->backend);
        else if (!strcmp(a, "--tmp-dir")) bad = cli_str(argc, argv, &i, &o->tmp_dir);
        else if (!strcmp(a, "--json")) bad = cli_str(argc, argv, &i, &o->json_path);
        else if (!strcmp(a, "--bos")) o->bos = 1;
        else if (!strcmp(a, "--no-bos")) o->bos = 0;
        else if (!strcmp(a, "--grid")) o->grid = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "kvtop eval: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!o->profile) o->profile = a;
        else {
            fprintf(stderr, "kvtop eval: more than one profile given ('%s' and '%s')\n", o->profile, a);
            return 2;
        }
        if (bad) return 2;
    }
    return 0;
}

/* The options that must or must not come together. Returns 0 or 2. */
static int check_opts(const eval_opts *o) {
    if (!o->profile && !o->model_path) {
        fprintf(stderr, "kvtop eval: give a profile or -m MODEL\n");
        usage(stderr);
        return 2;
    }
    if (o->profile && o->model_path) {
        fprintf(stderr, "kvtop eval: give a profile or -m MODEL, not both\n");
        return 2;
    }
    if (!o->text_path && !o->tasks_dir) {
        fprintf(stderr, "kvtop eval: --text FILE or --tasks DIR is required (e.g. data/eval/kvtop-eval.txt)\n");
        return 2;
    }
    if (o->text_path && o->tasks_dir) {
        fprintf(stderr, "kvtop eval: give --text FILE or --tasks DIR, not both\n");
        return 2;
    }
    if (o->n_sets && !o->profile) {
        fprintf(stderr, "kvtop eval: --set needs a profile\n");
        return 2;
    }
    return 0;
}

/* Splits and checks --weights and --kv: every name is checked before
 * anything is loaded. Returns 0, 1 (out of memory) or 2 (a bad list). */
static int parse_lists(const eval_opts *o, eval_lists *l /* OUT: */) {
    l->n_w = l->n_kv = -1;
    if (o->weights_arg) {
        if (!(l->wbuf = strdup(o->weights_arg))) goto oom;
        if ((l->n_w = split_list(l->wbuf, l->wl, MAX_LIST)) < 0) {
            fprintf(stderr, "kvtop eval: --weights lists more than %d types\n", MAX_LIST);
            return 2;
        }
        for (int i = 0; i < l->n_w; i++) {
            kv_quant_target t;
            kv_err err = {0};
            if (kv_quant_target_from_name(l->wl[i], &t, &err)) {
                fprintf(stderr, "kvtop eval: --weights: %s\n", err.msg);
                return 2;
            }
        }
    }
    if (o->kv_arg) {
        char *kl[MAX_LIST];
        if (!(l->kbuf = strdup(o->kv_arg))) goto oom;
        if ((l->n_kv = split_list(l->kbuf, kl, MAX_LIST)) < 0) {
            fprintf(stderr, "kvtop eval: --kv lists more than %d dtypes\n", MAX_LIST);
            return 2;
        }
        for (int i = 0; i < l->n_kv; i++)
            if (kv_cache_dtype_from_name(kl[i], &l->kvs[i]) != 0) {
                fprintf(stderr,
                        "kvtop eval: --kv: unknown KV dtype '%s' (f32, f16, int8, int8_asym, fp8_e4m3, fp8_e5m2)\n",
                        kl[i]);
                return 2;
            }
    }
    if (l->n_w == 0 && l->n_kv == 0) {
        fprintf(stderr, "kvtop eval: --weights none and --kv none leave nothing to evaluate\n");
        return 2;
    }
    return 0;
oom:
    fprintf(stderr, "kvtop eval: out of memory\n");
    return 1;
}

/* With a profile, takes the model, tokenizer, threads and backend from it
 * (options given win); cfg holds the strings o then points to. Returns 0
 * or 2. */
static int apply_profile(eval_opts *o, kv_config *cfg /* OUT: */) {
    if (o->profile) {
        kv_err err = {0};
        if (kv_profile_load_with_sets(o->profile, o->sets, o->n_sets, cfg, &err)) {
            fprintf(stderr, "kvtop eval: %s\n", err.msg);
            return 2;
        }
        o->model_path = cfg->model.path;
        if (cfg->model.tokenizer[0]) o->tok_path = cfg->model.tokenizer;
        if (o->threads < 0) o->threads = cfg->threads;
        if (!o->backend) o->backend = cfg->backend;
    }
    if (o->threads < 0) o->threads = 0;
    return 0;
}

/* The text file, NUL-terminated, or NULL with the error printed. */
static char *read_text(const char *path, size_t *len /* OUT: */) {
    char *text = cli_read_file(path, len);
    if (!text) {
        fprintf(stderr, "kvtop eval: cannot read the text file %s\n", path);
        return NULL;
    }
    if (*len == 0) {
        fprintf(stderr, "kvtop eval: the text file %s is empty\n", path);
        free(text);
        return NULL;
    }
    return text;
}

/* The table on stdout and, with --json, the JSON file. Returns 0 or 1. */
static int print_results(const eval_opts *o, const kv_eval_report *rep) {
    if (o->ctx > rep->ctx)
        fprintf(stderr, "kvtop eval: note: --ctx %d is more than the model's context; windows of %d used\n", o->ctx,
                rep->ctx);
    print_table(stdout, rep, o->model_path, o->text_path);
    fflush(stdout);
    if (!o->json_path) return 0;
    FILE *jf = strcmp(o->json_path, "-") ? fopen(o->json_path, "w") : stdout;
    if (!jf) {
        fprintf(stderr, "kvtop eval: cannot write %s\n", o->json_path);
        return 1;
    }
    int jrc = write_json(jf, rep, o->model_path, o->text_path);
    if (jf != stdout && fclose(jf) != 0) jrc = -1;
    if (jrc) {
        fprintf(stderr, "kvtop eval: writing %s failed\n", o->json_path);
        return 1;
    }
    return 0;
}

/* Runs the evaluation the options describe and prints it. Returns 0 or 1. */
static int run_eval(const eval_opts *o, const eval_lists *l, const char *text, size_t len) {
    kv_eval_params p = {
        .model_path = o->model_path,
        .tokenizer_path = o->tok_path,
        .backend = o->backend,
        .n_threads = o->threads,
        .ctx = o->ctx,
        .grid = o->grid,
        .bos = o->bos,
        .weights = l->n_w >= 0 ? (const char *const *)l->wl : NULL,
        .n_weights = l->n_w,
        .kv = l->n_kv >= 0 ? l->kvs : NULL,
        .n_kv = l->n_kv,
        .tmp_dir = o->tmp_dir,
        .log = o->quiet ? NULL : isatty(2) ? log_progress : log_lines,
    };
    kv_eval_report rep = {0};
    kv_err err = {0};
    int erc = kv_eval_run(&p, text, len, &rep, &err);
    if (!o->quiet && isatty(2)) fputs("\r\033[K", stderr);
    if (erc) {
        fprintf(stderr, "kvtop eval: %s\n", err.msg);
        return 1;
    }
    int rc = print_results(o, &rep);
    kv_eval_report_free(&rep);
    return rc;
}

/* --tasks DIR: each text file of DIR (name ending .txt, sorted) as --text,
 * then the generation sets. Returns 0, 1 or 2. */
static int run_tasks(eval_opts *o, const eval_lists *l, const kv_config *cfg) {
    struct dirent **ents = NULL;
    int n = scandir(o->tasks_dir, &ents, NULL, alphasort), rc = 0, texts = 0;
    if (n < 0) {
        fprintf(stderr, "kvtop eval: cannot read the task directory %s\n", o->tasks_dir);
        return 2;
    }
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(ents[i]->d_name);
        if (!rc && nl > 4 && !strcmp(ents[i]->d_name + nl - 4, ".txt")) {
            char path[1200];
            snprintf(path, sizeof path, "%s/%s", o->tasks_dir, ents[i]->d_name);
            size_t len;
            char *text = read_text(path, &len);
            const char *json = o->json_path;
            o->text_path = path;
            o->json_path = NULL; /* --json holds the generation sets' table */
            rc = text ? run_eval(o, l, text, len) : 1;
            o->json_path = json;
            o->text_path = NULL;
            free(text);
            texts++;
        }
        free(ents[i]);
    }
    free(ents);
    if (rc) return rc;
    if (!kv_eval_tasks_present(o->tasks_dir)) {
        if (!texts) fprintf(stderr, "kvtop eval: %s has no *.txt, json.jsonl or code.jsonl\n", o->tasks_dir);
        return texts ? 0 : 2;
    }
    kv_eval_tasks_opts t = {
        .dir = o->tasks_dir, .cfg = cfg, .model_path = o->model_path, .tok_path = o->tok_path,
        .backend = o->backend, .tmp_dir = o->tmp_dir, .threads = o->threads,
        .weights = l->n_w >= 0 ? (const char *const *)l->wl : NULL, .n_weights = l->n_w,
        .kv = l->n_kv >= 0 ? l->kvs : NULL, .n_kv = l->n_kv, .json_path = o->json_path, .quiet = o->quiet,
    };
    return kv_eval_tasks_run(&t);
}

int cmd_eval(int argc, char **argv) {
    eval_opts o;
    eval_lists l;
    memset(&l, 0, sizeof l);
    kv_config cfg;
    char *text = NULL;
    size_t len = 0;
    /* Each step returns 0 to go on, else the exit status. */
    int rc = parse_args(argc, argv, &o);
    if (rc || o.help) goto done;
    if ((rc = check_opts(&o)) || (rc = parse_lists(&o, &l)) || (rc = apply_profile(&o, &cfg))) goto done;
    if (o.tasks_dir) {
        if (!o.profile) kv_config_default(&cfg);
        rc = run_tasks(&o, &l, &cfg);
        goto done;
    }
    if (!(text = read_text(o.text_path, &len))) {
        rc = 1;
        goto done;
    }
    rc = run_eval(&o, &l, text, len);
done:
    free(text);
    free(l.wbuf);
    free(l.kbuf);
    free(o.sets);
    return rc;
}
