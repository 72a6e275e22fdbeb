/* cmd_bench.c - `kvtop bench PROFILE`: runs the profile's workload headless
 * and prints throughput, latency percentiles and goodput; --compare runs the
 * same seeded workload under several values of one key side by side. The
 * work is done by cli/bench.c; this file is the command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
            "  --quiet               print nothing but errors (no progress line, no table)\n"
            "Timing starts at the first submission; there is no warm-up run. Requests are\n"
            "submitted when their arrival time comes (poisson, burst) or when a slot frees\n"
            "(closed loop). Exit status: 0 ok, 1 runtime error, 2 usage or profile error.\n");
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

/* The output files, opened before the runs so a typo in a path does not
 * cost a whole run. Returns 0 or 1 (printed). */
static int open_outputs(const bench_args *a, FILE **json_f /* OUT: */, FILE **out_f /* OUT: (n_runs) */) {
    if (a->json_path && !(*json_f = fopen(a->json_path, "w"))) {
        fprintf(stderr, "kvtop bench: cannot write --json file %s\n", a->json_path);
        return 1;
    }
    for (int j = 0; a->outputs_path && j < a->n_runs; j++) {
        char path[4096];
        if (a->key) run_path(path, sizeof path, a->outputs_path, a->values[j]);
        else snprintf(path, sizeof path, "%s", a->outputs_path);
        if (!(out_f[j] = fopen(path, "w"))) {
            fprintf(stderr, "kvtop bench: cannot write --outputs file %s\n", path);
            return 1;
        }
    }
    return 0;
}

/* Runs every configuration in turn, writing --outputs as each ends.
 * Returns 0, or the exit status (1 runtime, 2 input) with the error printed. */
static int run_all(const bench_args *a, const kv_config *cfgs, char (*assign)[sizeof a->cmp_buf + 8],
                   kv_bench_result *runs /* OUT: */, FILE **out_f, uint64_t *failed /* OUT: */) {
    int tty = !a->quiet && isatty(STDERR_FILENO);
    kv_err err;
    *failed = 0;
    for (int j = 0; j < a->n_runs; j++) {
        char label[256];
        kv_bench_opts o = {.progress = tty ? stderr : NULL, .label = NULL};
        if (a->key) {
            snprintf(label, sizeof label, "[%d/%d] %.200s", j + 1, a->n_runs, assign[j]);
            o.label = label;
        }
        int r = kv_bench_run(&cfgs[j], &o, &runs[j], &err);
        if (r) {
            fprintf(stderr, "kvtop bench: %s%s%s\n", a->key ? assign[j] : "", a->key ? ": " : "", err.msg);
            return r == KV_ERR_INVAL ? 2 : 1;
        }
        if (a->key) snprintf(runs[j].value, sizeof runs[j].value, "%s", a->values[j]);
        *failed += runs[j].errors + runs[j].cancelled;
        if (a->key && !a->quiet)
            fprintf(stderr, "kvtop bench: %s: %llu completed, %llu rejected, %.1f output tok/s, %.2f s\n", assign[j],
                    (unsigned long long)runs[j].completed, (unsigned long long)runs[j].rejected,
                    runs[j].m.output_tokens_per_s, runs[j].wall_s);
        if (out_f[j] && kv_bench_write_outputs(out_f[j], &runs[j])) {
            fprintf(stderr, "kvtop bench: writing --outputs failed\n");
            return 1;
        }
    }
    return 0;
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
    int n_runs = a->n_runs;
    kv_config *cfgs = calloc((size_t)n_runs, sizeof *cfgs);
    kv_bench_result *runs = calloc((size_t)n_runs, sizeof *runs);
    char (*assign)[sizeof a->cmp_buf + 8] = calloc((size_t)n_runs, sizeof *assign);
    FILE *json_f = NULL;
    FILE **out_f = calloc((size_t)n_runs, sizeof *out_f);
    uint64_t failed = 0;
    if (!cfgs || !runs || !assign || !out_f) {
        fprintf(stderr, "kvtop bench: out of memory\n");
        rc = 1;
        goto done;
    }
    if ((rc = load_configs(a, cfgs, assign)) || (rc = open_outputs(a, &json_f, out_f)) ||
        (rc = run_all(a, cfgs, assign, runs, out_f, &failed)))
        goto done;
    rc = 1;
    if (!a->quiet) {
        if (a->key) kv_bench_print_compare(stdout, a->profile, a->key, runs, n_runs);
        else kv_bench_print(stdout, a->profile, &runs[0]);
        fflush(stdout);
    }
    if (json_f && kv_bench_write_json(json_f, a->profile, a->key, runs, n_runs)) {
        fprintf(stderr, "kvtop bench: writing --json file %s failed\n", a->json_path);
        goto done;
    }
    if (failed) {
        fprintf(stderr, "kvtop bench: %llu requests failed or were cancelled (see --outputs for reasons)\n",
                (unsigned long long)failed);
        goto done;
    }
    rc = 0;
done:
    if (json_f && fclose(json_f) && rc == 0) {
        fprintf(stderr, "kvtop bench: writing --json file %s failed\n", a->json_path);
        rc = 1;
    }
    for (int j = 0; out_f && j < n_runs; j++)
        if (out_f[j] && fclose(out_f[j]) && rc == 0) {
            fprintf(stderr, "kvtop bench: writing --outputs failed\n");
            rc = 1;
        }
    for (int j = 0; runs && j < n_runs; j++) kv_bench_result_free(&runs[j]);
    free(out_f);
    free(assign);
    free(runs);
    free(cfgs);
    cli_list_free(&a->sets);
    free(a);
    return rc;
}
