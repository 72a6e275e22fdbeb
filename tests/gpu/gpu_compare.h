/* gpu_compare.h - the harness the backend comparisons share: every
 * compiled-in backend but cpu as a target, judged against the CPU backend
 * by normalised error (sim bit for bit: it computes with the CPU kernels;
 * others within the includer's per-op tolerances), the worst error per op
 * reported, each backend's ops.status checked after a group of ops, and a
 * runner driving whole forward passes. The includer defines, before the
 * #include, an enum whose OP_N counts its ops, op_names[OP_N] and
 * op_tol[OP_N]. A backend that cannot be created here (no GPU) is skipped
 * with a note. */
#ifndef KVTOP_TESTS_GPU_COMPARE_H
#define KVTOP_TESTS_GPU_COMPARE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/mkmodel.h"
#include "../../engine/runner.h"
#include "../../kernels/backend.h"
#ifdef KV_HAVE_CUDA
#include "../../kernels/cuda/cuda_backend.h"
#endif
#include "../backend_helpers.h"
#include "../engine_helpers.h"
#include "../harness.h"

typedef struct target {
    const char *name;
    kv_backend *b;
    int exact;          /* 1: must equal the CPU bit for bit */
    double worst[OP_N]; /* largest normalised error seen per op */
    int cases[OP_N];
} target;

static kv_backend *cpu;
static target targets[8];
static int n_targets, inited;

/* What every op of these tests fits in (ops.reserve; the forward passes
 * reserve for themselves). */
static const kv_backend_limits op_limits = {.max_rows = 128, .max_k = 2048, .weight_types = 0};

static void init_targets(void) {
    if (inited) return;
    inited = 1;
    kv_err err = {0};
    cpu = test_reserve(kv_backend_create("cpu", 2, &err), &op_limits, &err);
    if (!cpu) {
        fprintf(stderr, "  cpu backend: %s\n", err.msg);
        return;
    }
    for (const char *const *n = kv_backend_names(); *n && n_targets < 8; n++) {
        if (!strcmp(*n, "cpu")) continue;
        kv_err e = {0};
        kv_backend *b = test_reserve(kv_backend_create(*n, 2, &e), &op_limits, &e);
        if (!b) {
            printf("  note: backend '%s' skipped: %s\n", *n, e.msg);
            continue;
        }
        targets[n_targets++] = (target){.name = *n, .b = b, .exact = !strcmp(*n, "sim")};
    }
    printf("  comparing against cpu:");
    for (int i = 0; i < n_targets; i++) printf(" %s%s", targets[i].name, targets[i].exact ? " (exact)" : "");
    printf("\n");
}

/* Records one comparison and checks it against tolerance tol. */
static void judge_tol(target *t, int op, double e, double tol, const char *what) {
    if (e > t->worst[op] || e != e) t->worst[op] = e;
    t->cases[op]++;
    if (t->exact)
        CHECKF(e == 0.0, "%s %s %s: differs from cpu (normalised error %.3g)", t->name, op_names[op], what, e);
    else
        CHECKF(e <= tol, "%s %s %s: normalised error %.3g > %.1g", t->name, op_names[op], what, e, tol);
}

/* The same against the op's own tolerance. */
static void judge(target *t, int op, double e, const char *what) { judge_tol(t, op, e, op_tol[op], what); }

static void report(int op) {
    for (int i = 0; i < n_targets; i++)
        if (targets[i].cases[op])
            printf("  %-5s %-16s %4d cases, worst normalised error %.3g\n", targets[i].name, op_names[op],
                   targets[i].cases[op], targets[i].worst[op]);
}

/* A healthy run records no failure: ops.status of the target (and of the
 * cpu it was compared with) says 0. */
static void check_status(target *t, const char *what) {
    kv_err err = {0};
    CHECKF(kv_backend_status(t->b, &err) == 0, "%s after %s: %s", t->name, what, err.msg);
    CHECKF(kv_backend_status(cpu, &err) == 0, "cpu after %s: %s", what, err.msg);
}

/* Drops device copies made from host memory that is about to be freed. */
static void forget_host(target *t) {
#ifdef KV_HAVE_CUDA
    if (!strcmp(t->name, "cuda")) kv_cuda_forget_host_copies(t->b);
#else
    (void)t;
#endif
}

static void get(kv_backend *b, void *dst, const void *src, size_t bytes) { b->ops->download(b, dst, src, bytes); }

/* Runs tokens through a runner on b: the prompt, then `steps` greedy tokens
 * (chosen from the CPU's logits when follow is given, so both backends see
 * the same inputs). Writes every step's logits to out (steps + 1 rows) and
 * each step's own greedy pick to picked. */
static int run_model(const kv_model *m, kv_backend *b, kv_cache_dtype dt, const int32_t *prompt, int n_prompt,
                     int steps, const int32_t *follow, float *out, int32_t *picked) {
    kv_err err = {0};
    kv_runner *r = kv_runner_new(m, b, 256, 16, dt, &err);
    if (!r) {
        fprintf(stderr, "  runner on %s: %s\n", b->ops->name, err.msg);
        return -1;
    }
    const int nv = m->hp.n_vocab;
    int rc = kv_runner_eval(r, prompt, n_prompt, out, NULL, &err);
    for (int s = 0; rc == 0 && s < steps; s++) {
        const float *lg = out + (size_t)s * nv;
        int32_t best = 0;
        for (int i = 1; i < nv; i++)
            if (lg[i] > lg[best]) best = i;
        picked[s] = best;
        int32_t next = follow ? follow[s] : best;
        rc = kv_runner_eval(r, &next, 1, out + (size_t)(s + 1) * nv, NULL, &err);
    }
    if (rc) fprintf(stderr, "  eval on %s: %s\n", b->ops->name, err.msg);
    kv_runner_free(r);
    return rc;
}

/* The random model files of the forward passes: 256 wide, 600 tokens of
 * vocabulary, a 512-token context (the caller sets type, arch, seed). */
static kv_mkmodel_params forward_params(void) {
    kv_mkmodel_params p = test_tiny_model(256, 512);
    p.n_vocab = 600;
    p.ctx_len = 512;
    return p;
}

/* One rotation of x (n tokens, H heads of hd; pos on the host, as the
 * forward passes them) on b: variant v of the op under test. */
typedef void (*rope_apply_fn)(kv_backend *b, float *x, const int32_t *pos, int n, int H, int hd, int rot, int neox,
                              int v);

/* The rope battery: fresh rows at positions below max_pos (the first 0),
 * neox and normal pairing, rot 32 and 64 of 64, n_variants variants, each
 * target against the cpu by normalised error under op. */
static void rope_battery(int op, int max_pos, int n_variants, rope_apply_fn apply) {
    init_targets();
    REQUIRE(cpu);
    enum { n = 9, H = 4, hd = 64 };
    const size_t N = (size_t)n * H * hd, bytes = N * sizeof(float);
    int32_t pos[n];
    for (int i = 0; i < n; i++) pos[i] = (int32_t)(harness_rand64() % (uint64_t)max_pos);
    pos[0] = 0;
    for (int ti = 0; ti < n_targets; ti++) {
        target *t = &targets[ti];
        kv_backend *b = t->b;
        float *x = malloc(bytes), *xc = malloc(bytes), *xt = malloc(bytes);
        REQUIRE(x && xc && xt);
        for (int neox = 0; neox < 2; neox++)
            for (int rot = 32; rot <= 64; rot += 32)
                for (int v = 0; v < n_variants; v++) {
                    harness_fill_rand(x, N, 2.0f);
                    memcpy(xc, x, bytes);
                    float *dx = test_put(b, x, bytes);
                    REQUIRE(dx);
                    apply(cpu, xc, pos, n, H, hd, rot, neox, v);
                    apply(b, dx, pos, n, H, hd, rot, neox, v);
                    get(b, xt, dx, bytes);
                    char what[64];
                    snprintf(what, sizeof what, "neox=%d rot=%d variant %d", neox, rot, v);
                    judge(t, op, harness_nerr(xt, xc, N), what);
                    b->ops->free(b, dx);
                }
        check_status(t, op_names[op]);
        FREE_ALL(x, xc, xt);
    }
    report(op);
}

static void test_zz_release(void) {
    for (int i = 0; i < n_targets; i++) kv_backend_free(targets[i].b);
    n_targets = 0;
    kv_backend_free(cpu);
    cpu = NULL;
    inited = 0;
}

#endif
