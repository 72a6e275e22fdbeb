/* cmd_quantize.c - `kvtop quantize IN.gguf OUT.gguf TYPE [-t THREADS]`:
 * re-encodes a model's weight matrices (engine/quantize.h has the rules),
 * with a progress bar on stderr when it is a terminal and a per-tensor
 * listing with -v. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../engine/quantize.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvtop quantize IN.gguf OUT.gguf TYPE [-t THREADS] [-v]\n"
            "  TYPE         %s (case-insensitive)\n"
            "  -t THREADS   worker threads (default: one per core)\n"
            "  -v           list every tensor with its old and new type\n"
            "Only 2-D weight matrices are converted; norms and 1-D tensors are copied. Rules as\n"
            "llama.cpp's quantize: output (or a tied token_embd) gets Q6_K (Q8_0 for q8_0), the _m\n"
            "mixes give attn_v and ffn_down Q6_K in some layers, rows that do not fit a type's block\n"
            "fall back (Q4_K->Q5_0, Q5_K->Q5_1, Q6_K->Q8_0, else F16).\n",
            kv_quant_target_names());
}

typedef struct bar_state {
    int tty;        /* stderr is a terminal: draw the bar */
    int verbose;    /* -v: one line per tensor */
    int last_pct;   /* last percentage drawn */
} bar_state;

static void on_progress(void *ctx, int64_t tensor, int64_t n_tensors, const char *name, uint64_t done,
                        uint64_t total) {
    bar_state *b = ctx;
    if (!b->tty || total == 0) return;
    int pct = (int)(done * 100 / total);
    if (pct == b->last_pct && done != total) return;
    b->last_pct = pct;
    const int width = 30, fill = pct * width / 100;
    char bar[31];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r[%s] %3d%%  %lld/%lld %-40.40s", bar, pct, (long long)tensor + 1, (long long)n_tensors, name);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static void on_tensor(void *ctx, const char *name, kv_type from, kv_type to, int fallback, int n_dims,
                      const int64_t *ne) {
    bar_state *b = ctx;
    if (!b->verbose) return;
    char shape[64];
    int off = 0;
    for (int d = 0; d < n_dims && off < (int)sizeof shape; d++)
        off += snprintf(shape + off, sizeof shape - (size_t)off, d ? " x %lld" : "%lld", (long long)ne[d]);
    printf("%-36s %-18s %-5s -> %-5s%s\n", name, shape, kv_type_name(from), kv_type_name(to),
           fallback ? "  (fallback: rows do not fit)" : (from == to ? "  (copied)" : ""));
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {NULL, NULL, NULL};
    int npos = 0, threads = 0;
    bar_state bar = {isatty(2), 0, -1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            if (cli_int(argc, argv, &i, 1, 1024, &threads)) return 2;
        } else if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose")) {
            bar.verbose = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "kvtop quantize: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (npos < 3) {
            pos[npos++] = argv[i];
        } else {
            fprintf(stderr, "kvtop quantize: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (npos != 3) {
        usage(stderr);
        return 2;
    }
    kv_err err = {0};
    kv_quantize_params p;
    memset(&p, 0, sizeof p);
    if (kv_quant_target_from_name(pos[2], &p.target, &err)) {
        fprintf(stderr, "kvtop quantize: %s\n", err.msg);
        return 2;
    }
    p.n_threads = threads;
    p.progress = on_progress;
    p.on_tensor = on_tensor;
    p.progress_ctx = &bar;
    kv_quantize_stats st;
    if (kv_quantize_file(pos[0], pos[1], &p, &st, &err)) {
        if (bar.tty && bar.last_pct >= 0) fputc('\n', stderr);
        fprintf(stderr, "kvtop quantize: %s\n", err.msg);
        return 1;
    }
    char b1[32], b2[32];
    fprintf(stderr, "%s: %lld tensors, %lld converted (%s), %lld copied, %lld fallbacks; %s -> %s in %.1f s\n",
            pos[1], (long long)st.n_tensors, (long long)st.n_converted, p.target.name, (long long)st.n_copied,
            (long long)st.n_fallback, cli_bytes(st.bytes_in, b1, sizeof b1), cli_bytes(st.bytes_out, b2, sizeof b2),
            st.seconds);
    return 0;
}
