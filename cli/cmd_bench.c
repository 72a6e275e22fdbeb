/* cmd_bench.c - `kvtop bench PROFILE`: runs the profile's workload headless
 * and prints throughput, latency percentiles and goodput; --compare runs the
 * same seeded workload under several values of one key side by side. The
 * work is done by cli/bench.c; this file is the command line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/cleanup.h"
#include "../base/file.h"
#include "../profiles/profile.h"
#include "bench.h"
#include "cli.h"
#include "commands.h"

enum { MAX_COMPARE = 16 };

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvtop bench PROFILE.yaml [options]\n"
            "  runs the profile's workload to completion on a fresh engine and prints\n"
            "  throughput, TTFT/TPOT/ITL/E2E percentiles, goodput under the profile's SLA,\n"
            "  KV utilisation, prefix hits, preemptions and speculative acceptance.\n"
            "  --set key=value       override a profile key (repeatable), e.g. --set scheduler.max_seqs=8\n"
            "  --json FILE           write the figures (and the effective config) as JSON\n"
            "  --outputs FILE        write every request's generated text as JSONL, in request order\n"
            "  --compare key=v1,v2   run once per value (fresh engine, same seeded workload) and print\n"
            "                        the runs side by side with ratios to the first; --outputs then\n"
            "                        writes one file per run (FILE with -VALUE before its extension)\n"
            "  --concurrent          with --compare: run every value at once, each on its own share of\n"
            "                        the cores with as many threads as cores in it, clocks started\n"
            "                        together (what the TUI's --compare does; its header's ratios are\n"
            "                        this table's, not those of runs one after the other)\n"
            "  --quiet               print nothing but errors (no progress line, no table)\n"
            "Timing starts at the first submission; there is no warm-up run. Requests are\n"
            "submitted when their arrival time comes (poisson, burst) or when a slot frees\n"
            "(closed loop). --json and --outputs never overwrite the profile, a model or the\n"
            "prompts file; they are written to FILE.tmp and renamed when the runs end, so a run\n"
            "that fails leaves an earlier FILE as it was; a --compare run that fails is marked\n"
            "with its \"error\" and the others are kept. Exit status: 0 ok, 1 runtime error\n"
            "(a run or a request failed), 2 usage or profile error.\n");
}

/* "out.jsonl" + "static" -> "out-static.jsonl" (value bytes other than
 * [A-Za-z0-9._] become '_'). */
static void run_path(char *buf, size_t cap, const char *base, const char *value) {
    const char *slash = strrchr(base, '/');
    const char *dot = strrchr(slash ? slash + 1 : base, '.');
    size_t stem = dot && dot != (slash ? slash + 1 : base) ? (size_t)(dot - base) : strlen(base);
    char v[64];
    size_t n = 0;
    for (const char *p = value; *p && n + 1 < sizeof v; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_';
        v[n++] = ok ? c : '_';
    }
    v[n] = 0;
    snprintf(buf, cap, "%.*s-%s%s", (int)stem, base, v, base + stem);
}

/* The command line, and what it resolves to. */
typedef struct bench_args {
    const char *profile, *json_path, *outputs_path, *compare;
    int quiet;                    /* bool */
    int concurrent;               /* bool: --compare's runs at once on split cores */
    cli_list sets;                /* --set key=value, in order (one slot more for --compare's) */
    /* --compare: the key and its values; one run otherwise */
    char cmp_buf[4096];
    const char *key, *values[MAX_COMPARE];
    int n_runs;
} bench_args;

/* Reads the flags into a. Returns CLI_OK, CLI_HELP or KV_ERR_INVAL (printed). */
static int parse_args(int argc, char **argv, bench_args *a /* OUT: */) {
    memset(a, 0, sizeof *a);
    const cli_opt opts[] = {
        {"--set", NULL, CLI_LIST, &a->sets, NULL, 0, 0},
        {"--json", NULL, CLI_STR, &a->json_path, NULL, 0, 0},
        {"--outputs", NULL, CLI_STR, &a->outputs_path, NULL, 0, 0},
        {"--compare", NULL, CLI_STR, &a->compare, NULL, 0, 0},
        {"--quiet", "-q", CLI_FLAG, &a->quiet, NULL, 0, 0},
        {"--concurrent", NULL, CLI_FLAG, &a->concurrent, NULL, 0, 0},
    };
    const char *pos[2];
    int n_pos = 0;
    cli_spec s = {.cmd = "bench", .opts = opts, .n_opts = (int)KV_ARRAY_LEN(opts), .usage = usage,
                  .pos = pos, .max_pos = 2, .n_pos = &n_pos};
    int rc = cli_parse(&s, argc, argv);
    if (rc) return rc;
    if (n_pos == 0) {
        fprintf(stderr, "kvtop bench: no profile given\n");
        usage(stderr);
        return KV_ERR_INVAL;
    }
    if (n_pos > 1) {
        fprintf(stderr, "kvtop bench: more than one profile given ('%s' and '%s')\n", pos[0], pos[1]);
        return KV_ERR_INVAL;
    }
    a->profile = pos[0];
    a->n_runs = 1;
    if (a->concurrent && !a->compare) {
        fprintf(stderr, "kvtop bench: --concurrent needs --compare key=v1,v2\n");
        return KV_ERR_INVAL;
    }
    if (a->compare) {
        kv_err err;
        a->n_runs = kv_bench_parse_compare(a->compare, a->cmp_buf, sizeof a->cmp_buf, &a->key, a->values,
                                           MAX_COMPARE, &err);
        if (a->n_runs < 0) {
            fprintf(stderr, "kvtop bench: %s\n", err.msg);
            return KV_ERR_INVAL;
        }
    }
    /* a slot after the last --set for --compare's assignment */
    if (cli_list_add(&a->sets, NULL)) {
        fprintf(stderr, "kvtop bench: out of memory\n");
        return KV_ERR_INVAL;
    }
    a->sets.n--;
    return CLI_OK;
}

/* Every run's configuration, before anything runs: nothing runs unless
 * all of them (and their workloads) load. Returns 0 or 2 (printed). */
static int load_configs(bench_args *a, kv_config *cfgs /* OUT: */, char (*assign)[sizeof a->cmp_buf + 8]) {
    kv_err err;
    for (int j = 0; j < a->n_runs; j++) {
        int n_sets = a->sets.n;
        if (a->key) {
            snprintf(assign[j], sizeof assign[j], "%s=%s", a->key, a->values[j]);
            a->sets.v[n_sets++] = assign[j];
        }
        if (kv_profile_load_with_sets(a->profile, a->sets.v, n_sets, &cfgs[j], &err)) {
            fprintf(stderr, "kvtop bench: %s%s%s%s\n", err.msg, a->key ? " (--compare " : "", a->key ? assign[j] : "",
                    a->key ? ")" : "");
            return 2;
        }
        kv_workload *w = kv_workload_build(&cfgs[j], &err);
        if (!w) {
            fprintf(stderr, "kvtop bench: %s\n", err.msg);
            return 2;
        }
        kv_workload_free(w);
    }
    return 0;
}

/* One --json or --outputs file. A regular file (or a new one) is written
 * as PATH.tmp and renamed over PATH only when there is something to put
 * in it, so a failed run leaves an earlier result as it was and an
 * interrupted one leaves no PATH.tmp (registered with base/cleanup.h). A
 * device or FIFO that already exists (/dev/stdout) is written directly. */
typedef struct out_file {
    char path[4096];
    char tmp[4100];  /* PATH.tmp; "" when written directly */
    FILE *f;
    int wrote;       /* bool: something finished and went in */
} out_file;

/* Whether path is one of the command's inputs: the profile, or a model,
 * tokenizer, draft model or prompts file of any run. Names it in *what. */
static int is_input(const bench_args *a, const kv_config *cfgs, const char *path, const char **what) {
    if (kv_same_file(path, a->profile)) return *what = "the profile", 1;
    for (int j = 0; j < a->n_runs; j++) {
        const kv_config *c = &cfgs[j];
        if (kv_same_file(path, c->model.path)) return *what = "the model", 1;
        if (c->model.tokenizer[0] && kv_same_file(path, c->model.tokenizer)) return *what = "the tokenizer", 1;
        if (c->spec.draft_model[0] && kv_same_file(path, c->spec.draft_model)) return *what = "the draft model", 1;
        if (c->workload.prompts_file[0] && kv_same_file(path, c->workload.prompts_file))
            return *what = "the prompts file", 1;
    }
    return 0;
}

/* Opens o for path, refusing an input of the run, a directory, or the
 * same file as an output opened before (outs[0..n_outs)). Returns 0, 2
 * for a refused path or 1 when it cannot be created (printed). */
static int out_open(out_file *o, const char *path, const char *flag, const bench_args *a, const kv_config *cfgs,
                    const out_file *outs, int n_outs) {
    memset(o, 0, sizeof *o);
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp", path);
    const char *what = NULL;
    if (is_input(a, cfgs, o->path, &what) || is_input(a, cfgs, o->tmp, &what)) {
        fprintf(stderr, "kvtop bench: %s %s is %s; refusing to overwrite it\n", flag, path, what);
        return 2;
    }
    for (int k = 0; k < n_outs; k++)
        if (!strcmp(outs[k].path, o->path) || kv_same_file(outs[k].path, o->path)) {
            fprintf(stderr, "kvtop bench: %s %s is also another output file\n", flag, path);
            return 2;
        }
    struct stat st;
    if (stat(o->path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            fprintf(stderr, "kvtop bench: %s %s is a directory\n", flag, path);
            return 2;
        }
        if (!S_ISREG(st.st_mode)) o->tmp[0] = 0; /* a device or FIFO: written as it is */
    }
    const char *target = o->tmp[0] ? o->tmp : o->path;
    if (!(o->f = fopen(target, "w"))) {
        fprintf(stderr, "kvtop bench: cannot write %s file %s: %s\n", flag, target, strerror(errno));
        o->tmp[0] = 0;
        return 1;
    }
    if (o->tmp[0]) kv_cleanup_add(o->tmp); /* a full table only leaves it behind on a signal */
    return 0;
}

/* Closes o: renames PATH.tmp over PATH when something went in (keep), else
 * removes PATH.tmp and leaves PATH as it was. Returns 0, or 1 (printed)
 * when a write, the close or the rename failed. */
static int out_close(out_file *o, int keep, const char *flag) {
    if (!o->f) return 0;
    int bad = ferror(o->f) != 0;
    if (fclose(o->f) != 0) bad = 1;
    o->f = NULL;
    int rc = 0;
    if (keep && bad) {
        fprintf(stderr, "kvtop bench: writing %s file %s failed\n", flag, o->tmp[0] ? o->tmp : o->path);
        rc = 1;
    }
    if (o->tmp[0]) {
        if (keep && !bad && rename(o->tmp, o->path) != 0) {
            fprintf(stderr, "kvtop bench: cannot rename %s to %s: %s\n", o->tmp, o->path, strerror(errno));
            rc = 1;
        }
        if (!keep || bad || rc) unlink(o->tmp);
        kv_cleanup_remove(o->tmp);
    }
    return rc;
}

/* The output files, opened (as PATH.tmp) before the runs so a typo in a
 * path, or a path that names an input, does not cost a whole run.
 * outs[0] is --json, outs[1 + j] run j's --outputs. Returns 0 or the
 * exit status (printed). */
static int open_outputs(const bench_args *a, const kv_config *cfgs, out_file *outs /* OUT: (1 + n_runs) */) {
    int rc;
    if (a->json_path && (rc = out_open(&outs[0], a->json_path, "--json", a, cfgs, outs, 0))) return rc;
    for (int j = 0; a->outputs_path && j < a->n_runs; j++) {
        char path[4096];
        if (a->key) run_path(path, sizeof path, a->outputs_path, a->values[j]);
        else snprintf(path, sizeof path, "%s", a->outputs_path);
        /* checked against --json and the runs before */
        if ((rc = out_open(&outs[1 + j], path, "--outputs", a, cfgs, outs, 1 + j))) return rc;
    }
    return 0;
}

/* Runs every configuration in turn, writing --outputs as each ends. A run
 * that fails is marked (its error kept in runs[j].error) and the others
 * still run. Returns 0, or the exit status (1 runtime, 2 input) when a run
 * failed or its outputs could not be written (printed). */
static int run_all(const bench_args *a, const kv_config *cfgs, char (*assign)[sizeof a->cmp_buf + 8],
                   kv_bench_result *runs /* OUT: */, out_file *outs, uint64_t *failed /* OUT: */) {
    int tty = !a->quiet && isatty(STDERR_FILENO);
    int rc = 0;
    kv_err err;
    *failed = 0;
    int *crc = NULL;
    kv_err *cerr = NULL;
    char(*cpus)[48] = NULL;
    if (a->concurrent) {
        crc = calloc((size_t)a->n_runs, sizeof *crc);
        cerr = calloc((size_t)a->n_runs, sizeof *cerr);
        cpus = calloc((size_t)a->n_runs, sizeof *cpus);
        int r = crc && cerr && cpus ? kv_bench_run_concurrent(cfgs, a->n_runs, runs, crc, cerr, cpus) : KV_ERR_NOMEM;
        if (r) {
            fprintf(stderr, "kvtop bench: --concurrent: %s\n", r == KV_ERR_NOMEM ? "out of memory" : "cannot start the runs");
            free(crc), free(cerr), free(cpus);
            for (int j = 0; j < a->n_runs; j++) {
                runs[j].cfg = cfgs[j];
                kv_copy_str(runs[j].error, sizeof runs[j].error, "--concurrent: the runs could not start");
            }
            return 1;
        }
    }
    for (int j = 0; j < a->n_runs; j++) {
        char label[256];
        kv_bench_opts o = {.progress = tty ? stderr : NULL, .label = NULL};
        if (a->key) {
            snprintf(label, sizeof label, "[%d/%d] %.200s", j + 1, a->n_runs, assign[j]);
            o.label = label;
        }
        int r;
        if (a->concurrent) {
            r = crc[j];
            err = cerr[j];
            if (!r && !a->quiet) fprintf(stderr, "kvtop bench: %s ran on %s, %d thread%s\n", assign[j], cpus[j],
                                         runs[j].cfg.threads, runs[j].cfg.threads == 1 ? "" : "s");
        } else {
            r = kv_bench_run(&cfgs[j], &o, &runs[j], &err);
        }
        if (a->key) snprintf(runs[j].value, sizeof runs[j].value, "%s", a->values[j]);
        if (r) {
            fprintf(stderr, "kvtop bench: %s%s%s\n", a->key ? assign[j] : "", a->key ? ": " : "", err.msg);
            runs[j].cfg = cfgs[j];
            kv_copy_str(runs[j].error, sizeof runs[j].error, err.msg[0] ? err.msg : kv_err_str(r));
            if (r == KV_ERR_INVAL) rc = 2;
            else if (!rc) rc = 1;
            continue;
        }
        *failed += runs[j].errors + runs[j].cancelled;
        if (runs[j].model_warning[0] && !a->quiet) fprintf(stderr, "kvtop bench: warning: %s\n", runs[j].model_warning);
        if (a->key && !a->quiet)
            fprintf(stderr, "kvtop bench: %s: %llu completed, %llu rejected, %.1f output tok/s, %.2f s\n", assign[j],
                    (unsigned long long)runs[j].completed, (unsigned long long)runs[j].rejected,
                    runs[j].m.output_tokens_per_s, runs[j].wall_s);
        out_file *of = &outs[1 + j];
        if (of->f) {
            if (kv_bench_write_outputs(of->f, &runs[j])) {
                fprintf(stderr, "kvtop bench: writing --outputs file %s failed\n", of->path);
                if (!rc) rc = 1;
            }
            of->wrote = 1;
        }
    }
    free(crc), free(cerr), free(cpus);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    bench_args *a = calloc(1, sizeof *a);
    if (!a) return 1;
    int rc = parse_args(argc, argv, a);
    if (rc) {
        cli_list_free(&a->sets);
        free(a);
        return cli_parse_exit(rc);
    }
    int n_runs = a->n_runs, n_ok = 0;
    kv_config *cfgs = calloc((size_t)n_runs, sizeof *cfgs);
    kv_bench_result *runs = calloc((size_t)n_runs, sizeof *runs);
    kv_bench_result *ok = calloc((size_t)n_runs, sizeof *ok); /* shallow copies of the runs that finished */
    char (*assign)[sizeof a->cmp_buf + 8] = calloc((size_t)n_runs, sizeof *assign);
    out_file *outs = calloc((size_t)n_runs + 1, sizeof *outs);
    uint64_t failed = 0;
    if (!cfgs || !runs || !ok || !assign || !outs) {
        fprintf(stderr, "kvtop bench: out of memory\n");
        rc = 1;
        goto done;
    }
    if ((rc = load_configs(a, cfgs, assign)) || (rc = open_outputs(a, cfgs, outs))) goto done;
    rc = run_all(a, cfgs, assign, runs, outs, &failed);
    for (int j = 0; j < n_runs; j++)
        if (!runs[j].error[0]) ok[n_ok++] = runs[j];
    if (n_ok == 0) goto done; /* nothing finished: every output file stays as it was */
    if (!a->quiet) {
        if (a->key) kv_bench_print_compare(stdout, a->profile, a->key, ok, n_ok);
        else kv_bench_print(stdout, a->profile, &ok[0]);
        if (a->concurrent) printf("(--concurrent: the runs ran at once, each pinned to its own share of the cores)\n");
        fflush(stdout);
    }
    /* the runs that failed go in too, each with its error */
    if (outs[0].f) {
        if (kv_bench_write_json(outs[0].f, a->profile, a->key, runs, n_runs)) {
            fprintf(stderr, "kvtop bench: writing --json file %s failed\n", outs[0].path);
            if (!rc) rc = 1;
        }
        outs[0].wrote = 1;
    }
    if (n_ok < n_runs)
        fprintf(stderr, "kvtop bench: %d of %d runs failed; the files written mark them with their error\n",
                n_runs - n_ok, n_runs);
    if (failed) {
        fprintf(stderr, "kvtop bench: %llu requests failed or were cancelled (see --outputs for reasons)\n",
                (unsigned long long)failed);
        if (!rc) rc = 1;
    }
done:
    for (int j = 0; outs && j <= n_runs; j++)
        if (out_close(&outs[j], outs[j].wrote, j ? "--outputs" : "--json") && !rc) rc = 1;
    for (int j = 0; runs && j < n_runs; j++) kv_bench_result_free(&runs[j]);
    free(outs);
    free(assign);
    free(ok);
    free(runs);
    free(cfgs);
    cli_list_free(&a->sets);
    free(a);
    return rc;
}
