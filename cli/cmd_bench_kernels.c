/* cmd_bench_kernels.c - `kvtop bench-kernels`: times the CPU matmul on the
 * matmul shapes of a "110M" llama (dim 768, ffn 2048, vocab 32000) for each
 * weight type and batch size, next to the measured memory read bandwidth
 * (the ceiling of single-stream decode) and the scalar reference path, and
 * sums the shapes into matmul-only decode and prompt-processing rates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/common.h"
#include "../kernels/backend.h"
#include "../kernels/cpu.h"
#include "../kernels/matmul.h"
#include "../kernels/membw.h"
#include "../kernels/types.h"
#include "cli.h"
#include "commands.h"

#define MAX_LIST 16
/* Weights are cycled through copies totalling at least this many bytes, so
 * each call reads them from DRAM as a real model's layers do. */
#define COLD_BYTES ((size_t)256 << 20)
/* The scalar path is timed (one call) only when that call is cheaper than
 * this many multiply-adds: it runs at 0.2-5 GFLOP/s. */
#define REF_MAX_MACS 2e8

typedef struct shape {
    const char *what;
    int64_t M, K; /* rows (outputs) x row length (inputs) */
    int per_layer; /* uses per layer of the 110M model; 0 = the output head */
} shape;

static const shape shapes[] = {
    {"attn q/k/v/o", 768, 768, 4},
    {"ffn gate/up", 2048, 768, 2},
    {"ffn down", 768, 2048, 1},
    {"output", 32000, 768, 0},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])
#define N_LAYERS 12

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop bench-kernels [-t N] [--types f32,q8_0,q4_0,...] [--n 1,32,512]\n"
               "                           [--isa scalar|avx2|avx512] [--min-time S] [--no-ref] [--panels]\n"
               "  -t N         threads (default: all cores)\n"
               "  --types      weight types (default f32,f16,bf16,q8_0,q4_0,q4_1; also q5_0,q4_k,q5_k,q6_k)\n"
               "  --n          activation rows per call (default 1,32,512)\n"
               "  --isa        kernel ISA (default: the best this CPU runs)\n"
               "  --min-time   seconds to time each case (default 0.3)\n"
               "  --no-ref     skip timing the scalar reference path\n"
               "  --panels     also time each weight prepared as the engine prepares it (prepare_weight:\n"
               "               q8_0, q5_0, q4_0 and q4_1 as pre-packed panels on AVX-512), a \"+panels\" row after each\n");
}

static double rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return (double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds per call over copies of the weight, at least min_time
 * seconds in total (and at least 3 calls). */
static double time_matmul(kv_backend *be, kv_cpu_isa isa, const kv_tensor *w, int copies, const float *x, float *y,
                          int n, double min_time, int max_calls, int warm) {
    static double t[4096];
    if (warm) kv_cpu_matmul_isa(be, isa, &w[0], x, y, n); /* scratch, pages */
    int calls = 0;
    double total = 0;
    while (calls < max_calls && calls < 4096 && (calls < KV_MIN(3, max_calls) || total < min_time)) {
        uint64_t t0 = kv_now_ns();
        kv_cpu_matmul_isa(be, isa, &w[calls % copies], x, y, n);
        t[calls] = (double)(kv_now_ns() - t0) * 1e-9;
        total += t[calls++];
    }
    qsort(t, (size_t)calls, sizeof t[0], cmp_d);
    return t[calls / 2];
}

static int parse_list(const char *s, char items[][16], int max) {
    int n = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= 16 || n == max) return -1;
        memcpy(items[n], p, len);
        items[n++][len] = 0;
        p += len + (e ? 1 : 0);
    }
    return n;
}

/* What to time, from the command line. */
typedef struct bk_opts {
    int threads;          /* 0: all cores */
    int do_ref;           /* 1: also time the scalar reference path */
    int panels;           /* 1: also time the weights prepared (prepare_weight) */
    float min_time;       /* seconds per case */
    const char *isa_s;    /* --isa; NULL: the best this CPU runs */
    const char *types_s;  /* --types as given */
    const char *ns_s;     /* --n as given */
    int help;             /* 1: -h / --help was given (and answered) */
    kv_type types[MAX_LIST];
    int nt;
    int ns[MAX_LIST];     /* activation rows per call */
    int nn;
} bk_opts;

/* Matmul seconds per token of the whole 110M model, by type and n. */
typedef struct bk_totals {
    double layers[MAX_LIST][MAX_LIST]; /* the per-layer matmuls, all layers */
    double head[MAX_LIST][MAX_LIST];   /* the output head */
} bk_totals;

/* Reads the flags into o. Returns 0 (with o->help set when the usage went
 * to stdout) or 2 with the error printed. */
static int parse_args(int argc, char **argv, bk_opts *o /* OUT: */) {
    memset(o, 0, sizeof *o);
    o->do_ref = 1;
    o->min_time = 0.3f;
    o->types_s = "f32,f16,bf16,q8_0,q4_0,q4_1";
    o->ns_s = "1,32,512";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t")) {
            if (cli_int(argc, argv, &i, 1, KV_CPU_MAX_THREADS, &o->threads)) return 2;
        } else if (!strcmp(argv[i], "--types")) {
            if (cli_str(argc, argv, &i, &o->types_s)) return 2;
        } else if (!strcmp(argv[i], "--n")) {
            if (cli_str(argc, argv, &i, &o->ns_s)) return 2;
        } else if (!strcmp(argv[i], "--isa")) {
            if (cli_str(argc, argv, &i, &o->isa_s)) return 2;
        } else if (!strcmp(argv[i], "--min-time")) {
            if (cli_float(argc, argv, &i, 0.0, 60.0, &o->min_time)) return 2;
        } else if (!strcmp(argv[i], "--no-ref")) {
            o->do_ref = 0;
        } else if (!strcmp(argv[i], "--panels")) {
            o->panels = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            o->help = 1;
            return 0;
        } else {
            fprintf(stderr, "kvtop bench-kernels: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    return 0;
}

/* Resolves --types and --n into o->types and o->ns. Returns 0 or 2 with
 * the error printed. */
static int parse_lists(bk_opts *o) {
    char tnames[MAX_LIST][16], nnames[MAX_LIST][16];
    o->nt = parse_list(o->types_s, tnames, MAX_LIST);
    o->nn = parse_list(o->ns_s, nnames, MAX_LIST);
    if (o->nt <= 0 || o->nn <= 0) {
        fprintf(stderr, "kvtop bench-kernels: bad --types or --n list\n");
        return 2;
    }
    for (int i = 0; i < o->nt; i++) {
        const kv_type_traits *tr;
        kv_type t;
        if (kv_type_from_name(tnames[i], &t) != 0 || !(tr = kv_type_get((int)t)) || !tr->supported ||
            !(t == KV_TYPE_F32 || t == KV_TYPE_F16 || t == KV_TYPE_BF16 || t == KV_TYPE_Q8_0 || t == KV_TYPE_Q4_0 ||
              t == KV_TYPE_Q4_1 || t == KV_TYPE_Q5_0 || t == KV_TYPE_Q4_K || t == KV_TYPE_Q5_K || t == KV_TYPE_Q6_K)) {
            fprintf(stderr, "kvtop bench-kernels: type '%s' is not one of f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q4_k,q5_k,q6_k\n",
                    tnames[i]);
            return 2;
        }
        o->types[i] = t;
    }
    for (int i = 0; i < o->nn; i++) {
        char *end;
        long v = strtol(nnames[i], &end, 10);
        if (*end || v < 1 || v > 4096) {
            fprintf(stderr, "kvtop bench-kernels: --n value '%s' is not in 1..4096\n", nnames[i]);
            return 2;
        }
        o->ns[i] = (int)v;
    }
    return 0;
}

/* The CPU backend with the ISA asked for. Returns 0, 1 (no backend) or 2
 * (an ISA this CPU cannot run), with the error printed. */
static int open_backend(const bk_opts *o, kv_backend **be /* OUT: */, kv_cpu_isa *isa /* OUT: */) {
    kv_err err = {0};
    *be = kv_backend_create("cpu", o->threads, &err);
    if (!*be) {
        fprintf(stderr, "kvtop bench-kernels: %s\n", err.msg);
        return 1;
    }
    *isa = kv_cpu_get_isa(*be);
    if (o->isa_s && (kv_cpu_isa_from_name(o->isa_s, isa) != 0 || kv_cpu_set_isa(*be, *isa) != 0)) {
        fprintf(stderr, "kvtop bench-kernels: ISA '%s' is unknown or not supported by this CPU\n", o->isa_s);
        kv_backend_free(*be);
        *be = NULL;
        return 2;
    }
    return 0;
}

/* Prints the backend line, measures and prints the memory bandwidth, and
 * prints the table's legend and heading. Returns the bandwidth in GB/s. */
static double print_header(kv_backend *be, kv_cpu_isa isa) {
    int nth = be->n_threads;
    printf("kvtop bench-kernels: cpu backend, %d thread%s, kernels %s%s (best here: %s)\n", nth, nth == 1 ? "" : "s",
           kv_cpu_isa_name(isa),
           isa == KV_CPU_ISA_AVX512 && kv_cpu_uses_amx(be) ? " + AMX-INT8 tiles for batched q8_0/q4_0/q4_1 (KVTOP_CPU_AMX=0: off)"
                                                           : "",
           kv_cpu_isa_name(kv_cpu_isa_best()));
    double bw = kv_membw_measure_gbs(kv_cpu_pool(be), (size_t)512 << 20, 7);
    printf("memory read bandwidth: %.1f GB/s (%d thread%s summing a 512 MiB buffer, median of 7)\n", bw, nth,
           nth == 1 ? "" : "s");
    printf("weights cycle through copies of >= %zu MiB, so every call reads them from DRAM;\n"
           "time = median per call; GB/s = weight bytes / time; %%bw = that / the bandwidth above;\n"
           "GFLOP/s = 2*n*M*K / time; scalar = the portable reference path, one call, same threads\n\n",
           COLD_BYTES >> 20);
    printf("%-13s %-11s %-5s %5s %11s %8s %6s %9s %12s\n", "shape", "MxK", "type", "n", "time/call", "GB/s", "%bw",
           "GFLOP/s", "scalar GF/s");
    return bw;
}

/* Times every n of one shape in weight type o->types[ti] (random weights in
 * copies of >= COLD_BYTES, random activations), printing a row each and
 * adding the times to tot. Returns 0 or 1 (out of memory, printed). */
static int bench_shape(kv_backend *be, kv_cpu_isa isa, const bk_opts *o, const shape *sh, int ti, double bw,
                       uint64_t *seed, bk_totals *tot) {
    kv_type t = o->types[ti];
    size_t rs = kv_type_row_size(t, sh->K), wbytes = rs * (size_t)sh->M;
    int copies = (int)KV_MAX((size_t)1, (COLD_BYTES + wbytes - 1) / wbytes);
    int maxn = 0;
    for (int i = 0; i < o->nn; i++) maxn = KV_MAX(maxn, o->ns[i]);
    kv_tensor *w = calloc((size_t)copies, sizeof *w);
    uint8_t *data = malloc(wbytes * (size_t)copies);
    float *row = malloc((size_t)sh->K * sizeof(float));
    float *x = malloc((size_t)maxn * sh->K * sizeof(float));
    float *y = malloc((size_t)maxn * sh->M * sizeof(float));
    kv_backend *pb = NULL; /* --panels */
    int rc = 0;
    if (!w || !data || !row || !x || !y) {
        fprintf(stderr, "kvtop bench-kernels: out of memory for %s %s\n", sh->what, kv_type_name(t));
        rc = 1;
        goto fail;
    }
    for (int64_t r = 0; r < sh->M; r++) {
        for (int64_t k = 0; k < sh->K; k++) row[k] = (float)(rnd(seed) * 0.05);
        kv_quantize_row(t, row, data + (size_t)r * rs, sh->K);
    }
    for (int c = 1; c < copies; c++) memcpy(data + (size_t)c * wbytes, data, wbytes);
    for (int c = 0; c < copies; c++) w[c] = (kv_tensor){t, sh->K, sh->M, rs, data + (size_t)c * wbytes, NULL};
    /* the ops' scratch is sized up front (ops.reserve), never inside a call */
    kv_backend_limits lim = {.max_rows = maxn, .max_k = sh->K, .weight_types = (uint64_t)1 << t};
    kv_err rerr = {0};
    if (kv_backend_reserve(be, &lim, &rerr) != 0) {
        fprintf(stderr, "kvtop bench-kernels: %s\n", rerr.msg);
        rc = 1;
        goto fail;
    }
    for (size_t i = 0; i < (size_t)maxn * sh->K; i++) x[i] = (float)rnd(seed);
    /* --panels: a backend of its own holds the prepared copies, freed with
     * this shape's weights (it finds them by address) */
    if (o->panels && be->ops->prepare_weight && kv_mm_panels_bytes(&w[0], isa)) {
        kv_err perr = {0};
        pb = kv_backend_create("cpu", be->n_threads, &perr);
        if (pb && kv_cpu_set_isa(pb, isa) == 0 && kv_backend_reserve(pb, &lim, &perr) == 0) {
            for (int c = 0; c < copies && pb; c++)
                if (pb->ops->prepare_weight(pb, &w[c], &perr) != 0) {
                    fprintf(stderr, "kvtop bench-kernels: --panels: %s\n", perr.msg);
                    kv_backend_free(pb);
                    pb = NULL;
                }
        } else {
            fprintf(stderr, "kvtop bench-kernels: --panels: %s\n", perr.msg[0] ? perr.msg : "no backend");
            kv_backend_free(pb);
            pb = NULL;
        }
    }
    for (int ni = 0; ni < o->nn; ni++) {
        int n = o->ns[ni];
        double flops = 2.0 * n * (double)sh->M * (double)sh->K;
        double sec = time_matmul(be, isa, w, copies, x, y, n, o->min_time, 1000, 1);
        char ref[32] = "-";
        if (o->do_ref && isa != KV_CPU_ISA_SCALAR) {
            if (flops / 2 <= REF_MAX_MACS) {
                double rs_ = time_matmul(be, KV_CPU_ISA_SCALAR, w, copies, x, y, n, 0.0, 1, 0);
                snprintf(ref, sizeof ref, "%.2f", flops / rs_ * 1e-9);
            } else {
                snprintf(ref, sizeof ref, "skip");
            }
        }
        double gbs = (double)wbytes / sec * 1e-9;
        char mk[24];
        snprintf(mk, sizeof mk, "%lldx%lld", (long long)sh->M, (long long)sh->K);
        printf("%-13s %-11s %-5s %5d %9.1f us %8.1f %5.0f%% %9.1f %12s\n", sh->what, mk, kv_type_name(t), n, sec * 1e6,
               gbs, bw > 0 ? 100.0 * gbs / bw : 0.0, flops / sec * 1e-9, ref);
        fflush(stdout);
        if (sh->per_layer)
            tot->layers[ti][ni] += sec * sh->per_layer * N_LAYERS;
        else
            tot->head[ti][ni] = sec;
        if (pb) { /* the same calls on the prepared copies */
            double ps = time_matmul(pb, isa, w, copies, x, y, n, o->min_time, 1000, 1);
            double pg = (double)wbytes / ps * 1e-9;
            printf("%-13s %-11s %-5s %5d %9.1f us %8.1f %5.0f%% %9.1f %12s\n", "  +panels", mk, kv_type_name(t), n,
                   ps * 1e6, pg, bw > 0 ? 100.0 * pg / bw : 0.0, flops / ps * 1e-9, "-");
            fflush(stdout);
        }
    }
fail:
    kv_backend_free(pb);
    free(w);
    free(data);
    free(row);
    free(x);
    free(y);
    return rc;
}

/* The matmul-only token rates of the whole model, per type and n. */
static void print_rates(const bk_opts *o, const bk_totals *tot) {
    printf("\n110M-model matmul-only rates (12 layers x 7 matmuls, + the 32000x768 head):\n");
    for (int ti = 0; ti < o->nt; ti++)
        for (int ni = 0; ni < o->nn; ni++) {
            int n = o->ns[ni];
            /* decode: every row needs logits; prompt processing: only the
             * last row does (as llama-bench's pp) */
            double dec = tot->layers[ti][ni] + tot->head[ti][ni];
            printf("  %-5s n=%-4d %8.1f tok/s with every row's logits", kv_type_name(o->types[ti]), n, n / dec);
            if (n > 1) printf(", %8.1f tok/s prompt (head on the last row only)", n / tot->layers[ti][ni]);
            printf("\n");
        }
}

int cmd_bench_kernels(int argc, char **argv) {
    bk_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc || o.help) return rc;
    if ((rc = parse_lists(&o))) return rc;
    kv_backend *be;
    kv_cpu_isa isa;
    if ((rc = open_backend(&o, &be, &isa))) return rc;
    double bw = print_header(be, isa);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    bk_totals tot;
    memset(&tot, 0, sizeof tot);
    for (int si = 0; si < N_SHAPES && rc == 0; si++)
        for (int ti = 0; ti < o.nt && rc == 0; ti++) rc = bench_shape(be, isa, &o, &shapes[si], ti, bw, &seed, &tot);
    if (rc == 0) print_rates(&o, &tot);
    kv_backend_free(be);
    return rc;
}
