/* decode_profile.c - where a decode step's time goes: the README's "Where
 * decode time goes" figures. It runs C identical requests (--distinct 1:
 * each its own prompt) through the
 * engine (kv_engine_step on this thread) on a CPU backend whose op table is
 * wrapped with timers, and reports, over the steps in which every running
 * request decodes one token, each op's share of the step (every matmul by
 * its role, the output head apart), the thread-pool dispatches (barriers)
 * per step, the activation quantization done outside them, the thread time
 * left idle inside them and the workers' wake-up latency, and the engine's
 * own work: before the forward pass (scheduling, block tables, the batch),
 * between its ops (the forward's glue) and after it (sampling, stop rules,
 * events, metrics and, with --hook, a snapshot per step).
 *
 *   make && build/tools/decode_profile --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
 *       --concurrency 1 --prompt 32 --tokens 64
 *
 * tools/decode_profile.sh runs the README's set. Dispatches are seen by
 * linking with -Wl,--wrap=kv_threadpool_run (the Makefile's rule for this
 * tool): every call the kernels make goes through __wrap_kv_threadpool_run
 * below, which times each share and hands it to the real pool. --multi 0
 * hides the backend's matmul_multi and matmul_groups (the engine then makes
 * one matmul call per weight, as before the op existed). The timers
 * cost ~50 ns an op and a share; fractions of a step are what to read on a
 * shared machine (absolute times move with the load). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/engine.h"
#include "../kernels/threadpool.h"

/* The op categories, matmuls by role. */
enum {
    C_WQ, C_WK, C_WV, C_WO, C_GATE, C_UP, C_DOWN, C_HEAD, C_QKV, C_GATE_UP,
    C_ATTN, C_STORE, C_NORM, C_ROPE, C_SILU, C_ADD, C_ROWS, C_XFER, C_OTHER, C_SCAN, C_ROUTER, C_EXPERT,
    C_N
};
static const char *cat_name[C_N] = {
    "matmul wq", "matmul wk", "matmul wv", "matmul wo", "matmul ffn gate", "matmul ffn up", "matmul ffn down",
    "matmul output head", "matmul wq+wk+wv (one matmul_multi)", "matmul ffn gate+up (one matmul_multi)",
    "attention (sliding-window layers too)", "kv_store", "rmsnorm", "rope", "silu_mul / gelu_mul", "add (residual)",
    "get_rows", "upload/download", "scale, bias rows, MoE routing and scatter",
    "logits scan (argmax, finite; after the forward)", "matmul MoE router",
    "matmul MoE experts (gate, up, down)",
};

typedef struct cat_stats {
    int64_t calls, disp;
    double op_ns;      /* wall time inside the op */
    double cpu_ns;     /* CPU time of the op: the caller's, plus the shares workers ran */
    double disp_ns;    /* wall time inside its dispatches */
    double serial_ns;  /* matmuls, CPU time: activation quantization before the rows' dispatch (on the caller,
                          or the op's own first dispatch) */
    double idle_ns;    /* thread time idle inside its dispatches: nth * span - busy */
    double wake_ns;    /* sum over shares i > 0: start - dispatch entry (a worker's wake-up, or the caller
                          reaching a share no worker took) */
    int64_t n_wake;
    double bytes;      /* matmuls: weight bytes read */
} cat_stats;

/* What a step's ops did (reset per step; added to the totals when the step
 * was pure decode). */
typedef struct step_rec {
    cat_stats c[C_N];
    double first_ns, last_ns; /* first op start, last op end (0: none) */
    double first_cpu, last_cpu; /* the caller's CPU clock at those two points */
    double ops_caller_cpu;    /* the caller's CPU time inside ops */
    double worker_cpu;        /* CPU time of the shares workers ran */
    int max_rows;             /* the largest n of any matmul but the head */
    int head_rows;
} step_rec;

static const kv_backend_ops *g_real;
static kv_backend_ops g_ops;
static const kv_model *g_model;
static step_rec g_step;
static int g_cat = C_XFER;        /* the op now running, for its dispatches */
static double g_disp_cpu[4];      /* CPU time of the running op's dispatches */
static int g_n_disp_in_op;
static double g_op_worker_cpu;    /* worker share CPU inside the running op */
static double g_op_first_disp_cpu; /* the caller's CPU clock at the op's first dispatch (0: none yet) */

static double clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
static double now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
/* NOTE: CPU time, not wall time, is what a loaded machine leaves
 * comparable: a descheduled thread's wait lands on whichever op was
 * running, its CPU time does not. */
static double cpu_ns(void) { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }

/* ---- the thread pool seam (-Wl,--wrap=kv_threadpool_run) ---- */

void __real_kv_threadpool_run(kv_threadpool *p, kv_task_fn fn, void *ctx);
void __wrap_kv_threadpool_run(kv_threadpool *p, kv_task_fn fn, void *ctx);

enum { MAX_SHARES = 256 };

typedef struct timed_run {
    kv_task_fn fn;
    void *ctx;
    pthread_t caller;
    double t0;
    double start[MAX_SHARES], end[MAX_SHARES]; /* wall clock of each share */
    double cpu[MAX_SHARES];                    /* CPU time of shares a worker ran (0: the caller ran it) */
} timed_run;

static void timed_share(void *arg, int i, int n) {
    timed_run *r = arg;
    const int worker = !pthread_equal(pthread_self(), r->caller);
    double s = now_ns(), c = worker ? cpu_ns() : 0;
    r->fn(r->ctx, i, n);
    if (i < MAX_SHARES) r->start[i] = s, r->end[i] = now_ns(), r->cpu[i] = worker ? cpu_ns() - c : 0;
}

void __wrap_kv_threadpool_run(kv_threadpool *p, kv_task_fn fn, void *ctx) {
    const int nth = kv_threadpool_size(p);
    if (!p || nth < 2 || nth > MAX_SHARES) {
        __real_kv_threadpool_run(p, fn, ctx);
        return;
    }
    static timed_run r; /* one caller at a time per pool; the tool has one pool */
    r.fn = fn, r.ctx = ctx, r.caller = pthread_self();
    const double c0 = cpu_ns();
    if (g_op_first_disp_cpu == 0) g_op_first_disp_cpu = c0;
    r.t0 = now_ns();
    __real_kv_threadpool_run(p, timed_share, &r);
    const double span = now_ns() - r.t0;
    cat_stats *c = &g_step.c[g_cat];
    double busy = 0, wcpu = 0;
    for (int i = 0; i < nth; i++) {
        busy += r.end[i] - r.start[i];
        wcpu += r.cpu[i];
        if (i > 0) c->wake_ns += r.start[i] - r.t0, c->n_wake++;
    }
    c->disp++;
    c->disp_ns += span;
    c->idle_ns += nth * span - busy;
    g_op_worker_cpu += wcpu;
    if (g_n_disp_in_op < 4) g_disp_cpu[g_n_disp_in_op] = cpu_ns() - c0 + wcpu;
    g_n_disp_in_op++;
}

/* ---- the op table seam ---- */

static double g_op_cpu0; /* the caller's CPU clock at the running op's start */

static double op_begin(int cat) {
    g_cat = cat;
    g_n_disp_in_op = 0;
    g_op_worker_cpu = 0;
    g_op_first_disp_cpu = 0;
    g_op_cpu0 = cpu_ns();
    double t = now_ns();
    if (g_step.first_ns == 0) g_step.first_ns = t, g_step.first_cpu = g_op_cpu0;
    return t;
}

static void op_end(int cat, double t0) {
    double t = now_ns(), c1 = cpu_ns(), caller = c1 - g_op_cpu0;
    cat_stats *c = &g_step.c[cat];
    c->calls++;
    c->op_ns += t - t0;
    c->cpu_ns += caller + g_op_worker_cpu;
    g_step.ops_caller_cpu += caller;
    g_step.worker_cpu += g_op_worker_cpu;
    g_step.last_ns = t;
    g_step.last_cpu = c1;
}

static int matmul_cat(const kv_tensor *w) {
    const kv_model *m = g_model;
    if (!m || w == &m->output) return C_HEAD;
    for (int l = 0; l < m->hp.n_layers; l++) {
        const kv_layer *L = &m->layers[l];
        if (w == &L->wq) return C_WQ;
        if (w == &L->wk) return C_WK;
        if (w == &L->wv) return C_WV;
        if (w == &L->wo) return C_WO;
        if (w == &L->w_gate) return C_GATE;
        if (w == &L->w_up) return C_UP;
        if (w == &L->w_down) return C_DOWN;
        if (w == &L->router) return C_ROUTER;
        /* an expert's views are of one tensor per kind: find w among them */
        for (int e = 0; e < m->hp.n_expert; e++)
            if (w == &L->exp_gate[e] || w == &L->exp_up[e] || w == &L->exp_down[e]) return C_EXPERT;
    }
    return C_HEAD; /* NOTE: a tensor the model does not own (none today) counts with the head */
}

/* The bookkeeping of a matmul op of weights w[0..nw) (category cat) that
 * began at t0. */
static void matmul_end(int cat, double t0, const kv_tensor *const *w, int nw, int n) {
    cat_stats *c = &g_step.c[cat];
    /* one dispatch: the caller quantized the activations (and set up)
     * before it; two: the first one quantized them */
    if (g_n_disp_in_op >= 2) c->serial_ns += g_disp_cpu[0] + (g_op_first_disp_cpu - g_op_cpu0);
    else if (g_n_disp_in_op == 1) c->serial_ns += g_op_first_disp_cpu - g_op_cpu0;
    /* no dispatch (one thread): quantization and rows are not told apart */
    for (int i = 0; i < nw; i++) c->bytes += (double)w[i]->nb1 * (double)w[i]->ne1;
    if (cat == C_HEAD) g_step.head_rows = n;
    else if (n > g_step.max_rows) g_step.max_rows = n;
    op_end(cat, t0);
}

static void w_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n) {
    const int cat = matmul_cat(w);
    double t0 = op_begin(cat);
    g_real->matmul(b, w, x, y, n);
    matmul_end(cat, t0, &w, 1, n);
}

/* Q/K/V or gate/up in one call: a category of its own. */
static void w_matmul_multi(kv_backend *b, const kv_tensor *const *w, int nw, const float *x, float *const *y, int n) {
    const int first = matmul_cat(w[0]);
    const int cat = nw == 1 ? first : first == C_WQ ? C_QKV : first == C_GATE ? C_GATE_UP : first;
    double t0 = op_begin(cat);
    g_real->matmul_multi(b, w, nw, x, y, n);
    matmul_end(cat, t0, w, nw, n);
}

/* A mixture of experts' gate/up or down matmuls of every routed expert. */
static void w_matmul_groups(kv_backend *b, const kv_matmul_group *g, int ng) {
    double t0 = op_begin(C_EXPERT);
    g_real->matmul_groups(b, g, ng);
    for (int k = 0; k < ng; k++)
        for (int i = 0; i < g[k].nw; i++)
            g_step.c[C_EXPERT].bytes += (double)g[k].w[i]->nb1 * (double)g[k].w[i]->ne1;
    matmul_end(C_EXPERT, t0, NULL, 0, 0);
}

#define WRAP0(NAME, CAT, PARAMS, ARGS) \
    static void w_##NAME PARAMS { \
        double t0 = op_begin(CAT); \
        g_real->NAME ARGS; \
        op_end(CAT, t0); \
    }
WRAP0(get_rows, C_ROWS, (kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n), (b, w, ids, out, n))
WRAP0(rmsnorm, C_NORM, (kv_backend *b, const float *x, const float *w, float *out, int n, int dim, float eps),
      (b, x, w, out, n, dim, eps))
WRAP0(rope, C_ROPE,
      (kv_backend *b, float *x, const int32_t *pos, int n, int nh, int hd, int rd, float base, int neox),
      (b, x, pos, n, nh, hd, rd, base, neox))
WRAP0(silu_mul, C_SILU, (kv_backend *b, float *g, const float *u, int64_t count), (b, g, u, count))
WRAP0(add, C_ADD, (kv_backend *b, float *x, const float *y, int64_t count), (b, x, y, count))
WRAP0(kv_store, C_STORE, (kv_backend *b, kv_pages *kv, int l, const kv_attn_batch *ab, const float *k, const float *v),
      (b, kv, l, ab, k, v))
WRAP0(attention, C_ATTN,
      (kv_backend *b, const kv_pages *kv, int l, const kv_attn_batch *ab, const float *q, float *out, int nh, float s),
      (b, kv, l, ab, q, out, nh, s))
WRAP0(attention_window, C_ATTN,
      (kv_backend *b, const kv_pages *kv, int l, const kv_attn_batch *ab, const float *q, float *out, int nh, float s,
       int win),
      (b, kv, l, ab, q, out, nh, s, win))
WRAP0(gelu_mul, C_SILU, (kv_backend *b, float *g, const float *u, int64_t count), (b, g, u, count))
WRAP0(rope_ext, C_ROPE,
      (kv_backend *b, float *x, const int32_t *pos, int n, int nh, int hd, int rd, float base, int neox, float fs,
       const float *ff),
      (b, x, pos, n, nh, hd, rd, base, neox, fs, ff))
WRAP0(scale, C_OTHER, (kv_backend *b, float *x, float s, int64_t count), (b, x, s, count))
WRAP0(add_rows, C_OTHER, (kv_backend *b, float *x, const float *bias, int n, int dim), (b, x, bias, n, dim))
WRAP0(moe_route, C_OTHER,
      (kv_backend *b, const float *lg, int n, int ne, int k, int norm, int32_t *ids, float *wts),
      (b, lg, n, ne, k, norm, ids, wts))
WRAP0(scatter_add, C_OTHER,
      (kv_backend *b, float *x, const float *y, const int32_t *rows, const float *w, int n, int dim),
      (b, x, y, rows, w, n, dim))
WRAP0(logits_scan, C_SCAN, (kv_backend *b, const float *x, int n, int dim, int32_t *ids, uint8_t *fin),
      (b, x, n, dim, ids, fin))
WRAP0(upload, C_XFER, (kv_backend *b, void *dst, const void *src, size_t n), (b, dst, src, n))
WRAP0(download, C_XFER, (kv_backend *b, void *dst, const void *src, size_t n), (b, dst, src, n))
#undef WRAP0

static void wrap_backend(kv_backend *b, int multi) {
    g_real = b->ops;
    g_ops = *b->ops;
    g_ops.matmul = w_matmul;
    /* --multi 0: the engine's fallback, one matmul call per weight */
    g_ops.matmul_multi = multi && g_real->matmul_multi ? w_matmul_multi : NULL;
    g_ops.matmul_groups = multi && g_real->matmul_groups ? w_matmul_groups : NULL;
    g_ops.get_rows = w_get_rows;
    g_ops.rmsnorm = w_rmsnorm;
    g_ops.rope = w_rope;
    g_ops.silu_mul = w_silu_mul;
    g_ops.add = w_add;
    g_ops.kv_store = w_kv_store;
    g_ops.attention = w_attention;
    /* the optional ops only where the backend has them (NULL tells the
     * engine to refuse or fall back) */
#define WRAP_OPT(NAME) g_ops.NAME = g_real->NAME ? w_##NAME : NULL
    WRAP_OPT(attention_window);
    WRAP_OPT(gelu_mul);
    WRAP_OPT(rope_ext);
    WRAP_OPT(scale);
    WRAP_OPT(add_rows);
    WRAP_OPT(moe_route);
    WRAP_OPT(scatter_add);
    WRAP_OPT(logits_scan);
#undef WRAP_OPT
    g_ops.upload = w_upload;
    g_ops.download = w_download;
    b->ops = &g_ops;
}

/* ---- the run ---- */

typedef struct opts {
    const char *model, *kv;
    int threads, concurrency, prompt, tokens, hook, multi, distinct;
} opts;

static int usage(void) {
    fprintf(stderr, "usage: decode_profile --model M [--threads 2] [--concurrency 1] [--prompt 32] [--tokens 64]\n"
                    "                      [--kv f16] [--hook 0|1] [--multi 1|0] [--distinct 0|1]\n");
    return 2;
}

static int parse_opts(int argc, char **argv, opts *o /* OUT: */) {
    *o = (opts){.kv = "f16", .threads = 2, .concurrency = 1, .prompt = 32, .tokens = 64, .multi = 1};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        char *end = NULL;
        long x = strtol(v, &end, 10);
        int num = *v && *end == '\0' && x >= 0 && x <= 1 << 20;
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--kv")) o->kv = v;
        else if (!num) return usage();
        else if (!strcmp(a, "--threads")) o->threads = (int)x;
        else if (!strcmp(a, "--concurrency")) o->concurrency = (int)x;
        else if (!strcmp(a, "--prompt")) o->prompt = (int)x;
        else if (!strcmp(a, "--tokens")) o->tokens = (int)x;
        else if (!strcmp(a, "--hook")) o->hook = (int)x;
        else if (!strcmp(a, "--multi")) o->multi = (int)x;
        else if (!strcmp(a, "--distinct")) o->distinct = (int)x;
        else return usage();
    }
    if (!o->model || o->threads < 1 || o->concurrency < 1 || o->prompt < 1 || o->tokens < 2) return usage();
    return 0;
}

static void config(const opts *o, kv_config *c) {
    kv_config_default(c);
    snprintf(c->model.path, sizeof c->model.path, "%s", o->model);
    c->threads = o->threads;
    c->kv.block_size = 16;
    /* every request's blocks, and 2% more: admission keeps scheduler.watermark (1%) free */
    c->kv.blocks = o->concurrency * ((o->prompt + o->tokens) / 16 + 2);
    c->kv.blocks += c->kv.blocks / 50 + 1;
    c->kv.prefix_sharing = 0;
    c->scheduler.max_seqs = o->concurrency;
    c->scheduler.max_batched_tokens = o->concurrency > 1024 ? o->concurrency : 1024;
    c->scheduler.prefill_chunk = 256;
    c->sampling.temperature = 0;
}

static void noop_hook(void *user, const kv_snapshot *s) { (void)user, (void)s; }

/* Totals over the pure decode steps. */
typedef struct totals {
    cat_stats c[C_N];
    int steps, all_steps;
    double step_ns, pre_ns, post_ns, glue_ns, ops_ns; /* wall */
    double step_cpu;   /* process CPU time of the steps, every thread */
    double ops_cpu;    /* CPU time inside ops (the caller's and the shares workers ran) */
    double pre_cpu, post_cpu; /* the caller's CPU time before the first op and after the last */
    double glue_cpu;          /* the caller's CPU time between ops */
} totals;

static void add_step(totals *t, double t0, double t1, double c0, double c1, double proc_cpu) {
    const step_rec *s = &g_step;
    double ops = 0;
    for (int k = 0; k < C_N; k++) ops += s->c[k].op_ns;
    t->steps++;
    t->step_ns += t1 - t0;
    t->ops_ns += ops;
    t->pre_ns += s->first_ns - t0;
    t->post_ns += t1 - s->last_ns;
    t->glue_ns += s->last_ns - s->first_ns - ops;
    t->step_cpu += proc_cpu;
    t->ops_cpu += s->ops_caller_cpu + s->worker_cpu;
    t->pre_cpu += s->first_cpu - c0;
    t->post_cpu += c1 - s->last_cpu;
    t->glue_cpu += s->last_cpu - s->first_cpu - s->ops_caller_cpu;
    for (int k = 0; k < C_N; k++) {
        cat_stats *a = &t->c[k];
        const cat_stats *b = &s->c[k];
        a->calls += b->calls, a->disp += b->disp, a->op_ns += b->op_ns, a->cpu_ns += b->cpu_ns;
        a->disp_ns += b->disp_ns, a->serial_ns += b->serial_ns, a->idle_ns += b->idle_ns;
        a->wake_ns += b->wake_ns, a->n_wake += b->n_wake, a->bytes += b->bytes;
    }
}

/* One table row: CPU and wall time per step and their shares. */
static void row(const char *name, const totals *t, double cpu, double wall, const char *rest) {
    printf("| %s | %.3f | %.1f%% | %.3f | %.1f%% |%s\n", name, cpu / t->steps / 1e6, 100.0 * cpu / t->step_cpu,
           wall / t->steps / 1e6, 100.0 * wall / t->step_ns, rest);
}

static void report(const opts *o, const kv_model *m, const totals *t) {
    double la = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &la) != 1) la = 0;
        fclose(f);
    }
    int64_t disp = 0;
    for (int k = 0; k < C_N; k++) disp += t->c[k].disp;
    printf("decode_profile: %s, %d concurrent, %d threads, kv %s, %d-token prompts: %d pure decode steps of %d; "
           "a step: %.3f ms wall, %.3f ms CPU (load average %.2f)\n",
           o->model, o->concurrency, o->threads, o->kv, o->prompt, t->steps, t->all_steps,
           t->step_ns / t->steps / 1e6, t->step_cpu / t->steps / 1e6, la);
    printf("dispatches (barriers) per step: %.1f (%.1f per layer)\n\n", (double)disp / t->steps,
           (double)disp / t->steps / m->hp.n_layers);
    printf("| part of the step | CPU ms/step | share of step CPU | wall ms/step | share of step wall | calls/step | "
           "dispatches/step | activation quant. (share of op CPU) | thread time idle in its dispatches (wall) | "
           "mean start delay of shares 1.. (wall) | weights read (op wall) |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < C_N; k++) {
        const cat_stats *c = &t->c[k];
        if (!c->calls) continue;
        char rest[256], q[32] = "", bw[32] = "", wk[32] = "", idle[32] = "";
        const int mm = k <= C_GATE_UP || k == C_ROUTER || k == C_EXPERT;
        if (mm && c->disp) snprintf(q, sizeof q, "%.0f%%", 100.0 * c->serial_ns / c->cpu_ns);
        if (mm) snprintf(bw, sizeof bw, "%.1f GB/s", c->bytes / c->op_ns);
        if (c->n_wake) snprintf(wk, sizeof wk, "%.1f us", c->wake_ns / c->n_wake / 1e3);
        if (c->disp) snprintf(idle, sizeof idle, "%.0f%%", 100.0 * c->idle_ns / (o->threads * c->disp_ns));
        snprintf(rest, sizeof rest, " %.1f | %.1f | %s | %s | %s | %s |", (double)c->calls / t->steps,
                 (double)c->disp / t->steps, q, idle, wk, bw);
        row(cat_name[k], t, c->cpu_ns, c->op_ns, rest);
    }
    const char *blank = " | | | | | |";
    row("**all backend ops**", t, t->ops_cpu, t->ops_ns, blank);
    row("forward pass glue (between ops)", t, t->glue_cpu, t->glue_ns, blank);
    row("engine before the forward (schedule, block tables, batch)", t, t->pre_cpu, t->pre_ns, blank);
    row(o->hook ? "engine after the forward (sample, stop, events, metrics, snapshot)"
                : "engine after the forward (sample, stop, events, metrics)",
        t, t->post_cpu, t->post_ns, blank);
    row("**engine's own work (before + after)**", t, t->pre_cpu + t->post_cpu, t->pre_ns + t->post_ns, blank);
    row("workers outside shares (spinning for work, waking)", t, t->step_cpu - t->ops_cpu - t->glue_cpu - t->pre_cpu - t->post_cpu, 0, blank);
}

static int run(const opts *o, kv_err *err) {
    kv_config cfg;
    config(o, &cfg);
    if (kv_cache_dtype_from_name(o->kv, &cfg.kv.dtype) != 0)
        return kv_err_set(err, KV_ERR_INVAL, "--kv %s: unknown KV dtype", o->kv);
    kv_backend *b = kv_backend_create("cpu", o->threads, err);
    if (!b) return err->code;
    wrap_backend(b, o->multi);
    kv_engine *e = kv_engine_new_with_backend(&cfg, b, err); /* owns b from here */
    if (!e) return err->code;
    g_model = kv_engine_model(e);
    int rc = 0;
    if (o->hook && (rc = kv_engine_set_step_hook(e, noop_hook, NULL))) {
        kv_err_set(err, rc, "cannot install the step hook");
        goto done;
    }
    int32_t *ids = malloc((size_t)o->prompt * sizeof *ids);
    if (!ids) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int r = 0; r < o->concurrency && rc >= 0; r++) {
        /* one prompt for all (--distinct 0) or one per request: a mixture of
         * experts routes identical tokens to the same few experts */
        uint32_t x = 12345u + (o->distinct ? 7919u * (uint32_t)r : 0u);
        for (int i = 0; i < o->prompt; i++) {
            x = x * 1664525u + 1013904223u;
            ids[i] = (int32_t)(1 + (x >> 8) % (uint32_t)(g_model->hp.n_vocab - 1));
        }
        kv_request_params p;
        kv_engine_request_defaults(e, &p);
        p.tokens = ids, p.n_tokens = o->prompt, p.max_tokens = o->tokens, p.ignore_eos = 1;
        int64_t id = kv_engine_submit(e, &p, err);
        if (id < 0) rc = (int)id;
    }
    free(ids);
    totals t = {0};
    /* every running request decoding one token: each matmul saw as many rows
     * as the head; the first such step still warms caches, so it is skipped */
    int seen = 0;
    for (int guard = 0; rc >= 0 && guard < 1000000; guard++) {
        memset(&g_step, 0, sizeof g_step);
        double t0 = now_ns(), c0 = cpu_ns(), p0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        int s = kv_engine_step(e);
        double t1 = now_ns(), c1 = cpu_ns(), p1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        if (s < 0) {
            rc = kv_err_set(err, s, "engine step failed (%d)", s);
            break;
        }
        kv_event ev[64];
        while (kv_engine_poll(e, ev, 64) == 64) {} /* drained outside the timed step */
        if (s == 0 || g_step.first_ns == 0) break; /* idle */
        t.all_steps++;
        if (g_step.head_rows == o->concurrency && g_step.max_rows == o->concurrency && seen++ > 0)
            add_step(&t, t0, t1, c0, c1, p1 - p0);
    }
    if (rc >= 0 && t.steps == 0) rc = kv_err_set(err, KV_ERR_INVAL, "no pure decode step was seen");
    if (rc >= 0) report(o, g_model, &t);
done:
    kv_engine_free(e);
    return rc < 0 ? rc : 0;
}

int main(int argc, char **argv) {
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    kv_err err = {0};
    rc = run(&o, &err);
    if (rc) fprintf(stderr, "decode_profile: %s\n", err.msg);
    return rc ? 1 : 0;
}
