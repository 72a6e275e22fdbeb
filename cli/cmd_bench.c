/* cmd_bench.c - `kvtop bench PROFILE`: runs the profile's workload headless
 * and prints throughput, latency percentiles and goodput; --compare runs the
 * same seeded workload under several values of one key side by side. The
 * work is done by tui/bench.c; this file is the command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../profiles/profile.h"
#include "bench.h"
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

int cmd_bench(int argc, char **argv) {
    const char *profile = NULL, *json_path = NULL, *outputs_path = NULL, *compare = NULL;
    int quiet = 0;
    const char **sets = calloc((size_t)argc + 2, sizeof *sets);
    if (!sets) return 1;
    int n_sets = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(sets);
            return 0;
        } else if (!strncmp(a, "--set=", 6)) {
            sets[n_sets++] = a + 6;
            continue;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = 1;
            continue;
        } else if (!strcmp(a, "--set")) {
            if (i + 1 < argc) {
                sets[n_sets++] = argv[++i];
                continue;
            }
        } else if (!strcmp(a, "--json")) {
            dst = &json_path;
        } else if (!strcmp(a, "--outputs")) {
            dst = &outputs_path;
        } else if (!strcmp(a, "--compare")) {
            dst = &compare;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "kvtop bench: unknown option '%s'\n", a);
            usage(stderr);
            free(sets);
            return 2;
        } else if (!profile) {
            profile = a;
            continue;
        } else {
            fprintf(stderr, "kvtop bench: more than one profile given ('%s' and '%s')\n", profile, a);
            free(sets);
            return 2;
        }
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, "kvtop bench: option %s needs a value\n", a);
            free(sets);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!profile) {
        fprintf(stderr, "kvtop bench: no profile given\n");
        usage(stderr);
        free(sets);
        return 2;
    }

    /* every configuration first: nothing runs unless all of them load */
    char cmp_buf[4096];
    const char *key = NULL, *values[MAX_COMPARE];
    int n_runs = 1;
    kv_err err;
    if (compare) {
        n_runs = kv_bench_parse_compare(compare, cmp_buf, sizeof cmp_buf, &key, values, MAX_COMPARE, &err);
        if (n_runs < 0) {
            fprintf(stderr, "kvtop bench: %s\n", err.msg);
            free(sets);
            return 2;
        }
    }
    int rc = 2;
    kv_config *cfgs = calloc((size_t)n_runs, sizeof *cfgs);
    kv_bench_result *runs = calloc((size_t)n_runs, sizeof *runs);
    char (*assign)[sizeof cmp_buf + 8] = calloc((size_t)n_runs, sizeof *assign);
    FILE *json_f = NULL;
    FILE **out_f = calloc((size_t)n_runs, sizeof *out_f);
    if (!cfgs || !runs || !assign || !out_f) {
        fprintf(stderr, "kvtop bench: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int j = 0; j < n_runs; j++) {
        if (key) {
            snprintf(assign[j], sizeof assign[j], "%s=%s", key, values[j]);
            sets[n_sets] = assign[j];
        }
        if (kv_profile_load_with_sets(profile, sets, n_sets + (key != NULL), &cfgs[j], &err)) {
            fprintf(stderr, "kvtop bench: %s%s%s%s\n", err.msg, key ? " (--compare " : "", key ? assign[j] : "",
                    key ? ")" : "");
            goto done;
        }
        kv_workload *w = kv_workload_build(&cfgs[j], &err);
        if (!w) {
            fprintf(stderr, "kvtop bench: %s\n", err.msg);
            goto done;
        }
        kv_workload_free(w);
    }
    /* output files next, so a typo in a path does not cost a whole run */
    rc = 1;
    if (json_path && !(json_f = fopen(json_path, "w"))) {
        fprintf(stderr, "kvtop bench: cannot write --json file %s\n", json_path);
        goto done;
    }
    for (int j = 0; outputs_path && j < n_runs; j++) {
        char path[4096];
        if (key) run_path(path, sizeof path, outputs_path, values[j]);
        else snprintf(path, sizeof path, "%s", outputs_path);
        if (!(out_f[j] = fopen(path, "w"))) {
            fprintf(stderr, "kvtop bench: cannot write --outputs file %s\n", path);
            goto done;
        }
    }

    int tty = !quiet && isatty(STDERR_FILENO);
    uint64_t failed = 0;
    for (int j = 0; j < n_runs; j++) {
        char label[256];
        kv_bench_opts o = {.progress = tty ? stderr : NULL, .label = NULL};
        if (key) {
            snprintf(label, sizeof label, "[%d/%d] %.200s", j + 1, n_runs, assign[j]);
            o.label = label;
        }
        int r = kv_bench_run(&cfgs[j], &o, &runs[j], &err);
        if (r) {
            fprintf(stderr, "kvtop bench: %s%s%s\n", key ? assign[j] : "", key ? ": " : "", err.msg);
            rc = r == KV_ERR_INVAL ? 2 : 1;
            goto done;
        }
        if (key) snprintf(runs[j].value, sizeof runs[j].value, "%s", values[j]);
        failed += runs[j].errors + runs[j].cancelled;
        if (key && !quiet)
            fprintf(stderr, "kvtop bench: %s: %llu completed, %llu rejected, %.1f output tok/s, %.2f s\n", assign[j],
                    (unsigned long long)runs[j].completed, (unsigned long long)runs[j].rejected,
                    runs[j].m.output_tokens_per_s, runs[j].wall_s);
        if (out_f[j] && kv_bench_write_outputs(out_f[j], &runs[j])) {
            fprintf(stderr, "kvtop bench: writing --outputs failed\n");
            goto done;
        }
    }
    if (!quiet) {
        if (key) kv_bench_print_compare(stdout, profile, key, runs, n_runs);
        else kv_bench_print(stdout, profile, &runs[0]);
        fflush(stdout);
    }
    if (json_f && kv_bench_write_json(json_f, profile, key, runs, n_runs)) {
        fprintf(stderr, "kvtop bench: writing --json file %s failed\n", json_path);
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
        fprintf(stderr, "kvtop bench: writing --json file %s failed\n", json_path);
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
    free(sets);
    return rc;
}
