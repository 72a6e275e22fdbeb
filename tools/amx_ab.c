/* amx_ab.c - the batched quantized matmul with the AMX tiles on and off,
 * alternating in one process (a loaded machine's drift lands on both), on
 * warm weights (each shape's weights stay in cache), so the figure is the
 * kernels' compute rate. Also checks that both give the same bits. Prints
 * per type, shape and n the median time of each, GFLOP/s and the ratio.
 *
 *   build/tools/amx_ab [--threads N] [--reps N] [--types q8_0,q4_0,q4_1] [--n 16,32,64,256] [--cpu]
 *
 * --cpu times with the process's CPU clock (use it with --threads 1 on a
 * machine others are using: a descheduled thread's wait is not counted).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/common.h"
#include "../kernels/cpu.h"
#include "../kernels/matmul.h"
#include "../kernels/types.h"

/* --cpu: the process's CPU time (with --threads 1, the time the kernel
 * ran, whatever else the machine runs), else wall time */
static int use_cpu_clock;

static double now_s(void) { return use_cpu_clock ? kv_cpu_time_s() : kv_now_s(); }

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

/* Seconds per call (median of reps) for one setting; the first call warms. */
static double time_calls(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n, int amx, int reps,
                         double *dst) {
    kv_mm_amx_set(amx);
    kv_cpu_matmul(b, w, x, y, n);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        kv_cpu_matmul(b, w, x, y, n);
        dst[r] = now_s() - t0;
    }
    return kv_median(dst, reps);
}

static int run_case(kv_backend *b, kv_type t, int M, int K, int n, int reps) {
    size_t rs = kv_type_row_size(t, K);
    uint8_t *wd = malloc(rs * (size_t)M);
    float *row = malloc((size_t)K * sizeof(float)), *x = malloc((size_t)n * K * sizeof(float));
    float *y0 = malloc((size_t)n * M * sizeof(float)), *y1 = malloc((size_t)n * M * sizeof(float));
    double *ts = malloc((size_t)reps * sizeof(double));
    if (!wd || !row || !x || !y0 || !y1 || !ts) {
        fprintf(stderr, "amx_ab: out of memory\n");
        return 1;
    }
    unsigned seed = 7;
    for (int r = 0; r < M; r++) {
        for (int k = 0; k < K; k++) row[k] = frand(&seed);
        kv_quantize_row(t, row, wd + (size_t)r * rs, K);
    }
    for (size_t i = 0; i < (size_t)n * K; i++) x[i] = frand(&seed);
    kv_tensor w = {.type = t, .ne0 = K, .ne1 = M, .nb1 = rs, .data = wd, .dev = NULL};
    double off[5], on[5];
    for (int p = 0; p < 5; p++) { /* alternate the settings five times */
        off[p] = time_calls(b, &w, x, y0, n, 0, reps, ts);
        on[p] = time_calls(b, &w, x, y1, n, 1, reps, ts);
    }
    double mo = kv_median(off, 5), mn = kv_median(on, 5), fl = 2.0 * n * (double)M * K;
    int same = !memcmp(y0, y1, (size_t)n * M * sizeof(float)) && y0[0] == y0[0];
    printf("%-5s %6dx%-5d n=%-4d  avx512 %9.1f us %7.1f GFLOP/s   amx %9.1f us %7.1f GFLOP/s   %5.2fx  %s\n",
           kv_type_name(t), M, K, n, mo * 1e6, fl / mo * 1e-9, mn * 1e6, fl / mn * 1e-9, mo / mn,
           same ? "same bits" : "BITS DIFFER");
    free(wd);
    free(row);
    free(x);
    free(y0);
    free(y1);
    free(ts);
    return same ? 0 : 1;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 9;
    const char *types = "q8_0,q4_0,q4_1", *ns = "16,32,64,256";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu"))
            use_cpu_clock = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc)
            types = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            ns = argv[++i];
        else {
            fprintf(stderr, "usage: amx_ab [--threads N] [--reps N] [--types q8_0,q4_0,q4_1] [--n 16,32,64,256] [--cpu]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 1000 || threads < 1) {
        fprintf(stderr, "amx_ab: --reps 1..1000, --threads >= 1\n");
        return 2;
    }
    if (!kv_cpu_amx_supported()) {
        printf("amx_ab: this CPU (or OS) has no AMX-INT8 tiles: nothing to compare\n");
        return 0;
    }
    kv_err err = {0};
    kv_backend *b = kv_cpu_backend_create(threads, &err);
    const kv_backend_limits lim = {.max_rows = 4096, .max_k = 2048, .weight_types = 0};
    if (b && kv_backend_reserve(b, &lim, &err) != 0) {
        kv_backend_free(b);
        b = NULL;
    }
    if (!b) {
        fprintf(stderr, "amx_ab: %s\n", err.msg);
        return 1;
    }
    static const int shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}};
    int bad = 0;
    char tbuf[256];
    snprintf(tbuf, sizeof tbuf, "%s", types);
    for (char *tn = strtok(tbuf, ","); tn; tn = strtok(NULL, ",")) {
        kv_type t = KV_TYPE_COUNT;
        if (kv_type_from_name(tn, &t) != 0 || (t != KV_TYPE_Q8_0 && t != KV_TYPE_Q4_0 && t != KV_TYPE_Q4_1)) {
            fprintf(stderr, "amx_ab: type %s: q8_0, q4_0 or q4_1\n", tn);
            return 2;
        }
        char nbuf[256];
        snprintf(nbuf, sizeof nbuf, "%s", ns);
        char *save = NULL;
        for (char *nn = strtok_r(nbuf, ",", &save); nn; nn = strtok_r(NULL, ",", &save)) {
            int n = atoi(nn);
            if (n < 1 || n > 4096) {
                fprintf(stderr, "amx_ab: n %s: 1..4096\n", nn);
                return 2;
            }
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                bad |= run_case(b, t, shapes[s][0], shapes[s][1], n, shapes[s][0] > 4096 ? 3 : reps);
        }
    }
    kv_mm_amx_set(1);
    kv_backend_free(b);
    return bad;
}
