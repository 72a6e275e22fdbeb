/* spec_figures.c - the speculative-decoding figures of the README: for each
 * method and each k, acceptance, tokens per verify step (measured, and the
 * (1 - p^(k+1)) / (1 - p) prediction from the first position's acceptance
 * p), and decode speed against speculation off, on a prompts file run one
 * request at a time (decode-bound, as a chat is). Greedy outputs are
 * checked against the run without speculation. `make` builds it (it links
 * the engine layer only; tests/e2e/tools.sh runs it on a tiny model):
 *
 *   make && build/tools/spec_figures --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
 *       --prompts data/spec/repetitive.jsonl --methods off,ngram,self --kmax 6 --layers 8 --requests 8 --out 48
 *
 * The machine may be shared, so every configuration runs --reps times on a
 * fresh engine, interleaved (rep 1 of every configuration, then rep 2, ...),
 * and the fastest run counts, both by wall time and by process CPU time
 * (user + system of all threads: steadier under load, and what speculation
 * trades: the draft's and the extra verify rows' work against fewer steps).
 * One markdown row per configuration.
 * `--make-draft N OUT.gguf` writes the first N layers of --model (with its
 * embeddings, final norm and head) as a same-vocabulary draft and exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../engine/engine.h"
#include "../engine/mkmodel.h"
#include "../engine/spec.h"
#include "../engine/workload.h"

enum { MAX_CONFIGS = 64 };

typedef struct opts {
    const char *model, *tokenizer, *prompts, *draft, *methods;
    int requests, out, threads, reps, kmin, kmax, layers, adaptive, concurrency;
    float temp, min_acc;
    const char *make_draft; /* --make-draft's output file; NULL: measure */
    int make_draft_layers;
} opts;

/* The configurations measured: off first, then each method and k. */
typedef struct plan {
    kv_spec_method method[MAX_CONFIGS];
    int k[MAX_CONFIGS];
    int n;
} plan;

typedef struct result {
    double wall_s, cpu_s, tok_s, tpot_ms;
    kv_metrics_summary m;
    char **texts; /* (requests) */
} result;

static void config(const opts *o, kv_config *c, kv_spec_method m, int k) {
    kv_config_default(c);
    snprintf(c->model.path, sizeof c->model.path, "%s", o->model);
    if (o->tokenizer) snprintf(c->model.tokenizer, sizeof c->model.tokenizer, "%s", o->tokenizer);
    c->threads = o->threads;
    c->kv.blocks = 1024;
    c->kv.block_size = 16;
    c->kv.dtype = KV_CACHE_F16;
    c->scheduler.max_seqs = 16;
    c->scheduler.max_batched_tokens = 512;
    c->scheduler.prefill_chunk = 256;
    c->sampling.temperature = o->temp;
    c->sampling.top_k = 0;
    c->sampling.top_p = 1;
    c->sampling.min_p = 0;
    c->sampling.repeat_penalty = 1;
    c->sampling.seed = 1;
    c->spec.method = m;
    c->spec.k = k > 0 ? k : 1;
    c->spec.draft_layers = o->layers;
    c->spec.adaptive = o->adaptive;
    c->spec.min_acceptance = o->min_acc;
    if (o->draft) snprintf(c->spec.draft_model, sizeof c->spec.draft_model, "%s", o->draft);
    snprintf(c->workload.prompts_file, sizeof c->workload.prompts_file, "%s", o->prompts);
    c->workload.requests = o->requests;
    c->workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = o->out, .min = o->out, .max = o->out,
                                       .mean = o->out};
}

/* Process CPU time (user + system, all threads) in seconds. */
static double cpu_now(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static void free_texts(result *r, int n) {
    if (!r->texts) return;
    for (int i = 0; i < n; i++) free(r->texts[i]);
    free(r->texts);
    r->texts = NULL;
}

/* Keeps the generated texts of requests ids[0..n) in r->texts. */
static int keep_texts(kv_engine *e, const int64_t *ids, int n, result *r) {
    if (!(r->texts = calloc((size_t)n, sizeof *r->texts))) return -1;
    for (int i = 0; i < n; i++) {
        char buf[8192];
        if (kv_engine_request_text(e, ids[i], buf, sizeof buf) < 0) {
            fprintf(stderr, "request %d: no text\n", i);
            return -1;
        }
        if (!(r->texts[i] = strdup(buf))) return -1;
    }
    return 0;
}

/* One run on a fresh engine: requests o->concurrency at a time. */
static int run(const opts *o, const kv_config *c, const kv_workload *w, result *r) {
    kv_err err;
    kv_engine *e = kv_engine_new(c, &err);
    if (!e) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return -1;
    }
    int n = kv_workload_count(w), rc = -1;
    int64_t *ids = calloc((size_t)n, sizeof *ids);
    int next = 0, done = 0;
    double t0 = kv_now_s(), c0 = cpu_now();
    kv_event ev[256];
    if (!ids) goto fail;
    while (done < n) {
        while (next < n && next - done < o->concurrency) {
            kv_request_params p;
            kv_engine_request_defaults(e, &p);
            p.text = kv_workload_get(w, next)->text;
            p.max_tokens = o->out;
            p.ignore_eos = 1;
            p.session = next;
            ids[next] = kv_engine_submit(e, &p, &err);
            if (ids[next] <= 0) {
                fprintf(stderr, "submit: %s\n", err.msg);
                goto fail;
            }
            next++;
        }
        if (kv_engine_step(e) < 0) break;
        int k;
        while ((k = kv_engine_poll(e, ev, 256)) > 0)
            for (int j = 0; j < k; j++) done += ev[j].type == KV_EVENT_DONE;
    }
    r->wall_s = kv_now_s() - t0;
    r->cpu_s = cpu_now() - c0;
    kv_engine_metrics(e, &r->m);
    r->tok_s = (double)r->m.output_tokens / r->wall_s;
    r->tpot_ms = r->m.tpot_ms.valid ? r->m.tpot_ms.mean : 0;
    rc = keep_texts(e, ids, n, r);
    if (rc) free_texts(r, n);
fail:
    kv_engine_free(e);
    free(ids);
    return rc;
}

static int make_draft(const char *src, int n_layers, const char *dst) {
    kv_err err;
    if (kv_mkmodel_truncate(src, dst, n_layers, &err)) {
        fprintf(stderr, "make-draft: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: spec_figures --model M [--tokenizer T] --prompts FILE [--methods off,ngram,self,draft_model]\n"
                    "       [--draft PATH] [--layers L] [--kmin 1] [--kmax 6] [--requests 8] [--out 48] [--threads 2]\n"
                    "       [--reps 2] [--adaptive 0|1] [--min-acc 0.4] [--temp 0] [--concurrency 1]\n"
                    "       spec_figures --model M --make-draft N OUT.gguf\n");
    return 2;
}

/* Reads the options (every one takes a value) into o. Returns 0 or 2 (the
 * usage printed). --make-draft ends the options. */
static int parse_opts(int argc, char **argv, opts *o /* OUT: */) {
    *o = (opts){.methods = "off,ngram,self,draft_model", .requests = 8, .out = 48, .threads = 2, .reps = 2,
                .kmin = 1, .kmax = 6, .layers = 8, .adaptive = 0, .min_acc = 0.4f, .concurrency = 1};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (!strcmp(a, "--make-draft")) {
            if (i + 2 >= argc || !o->model) return usage();
            o->make_draft_layers = atoi(v);
            o->make_draft = argv[i + 2];
            return 0;
        }
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!strcmp(a, "--prompts")) o->prompts = v;
        else if (!strcmp(a, "--draft")) o->draft = v;
        else if (!strcmp(a, "--methods")) o->methods = v;
        else if (!strcmp(a, "--layers")) o->layers = atoi(v);
        else if (!strcmp(a, "--kmin")) o->kmin = atoi(v);
        else if (!strcmp(a, "--kmax")) o->kmax = atoi(v);
        else if (!strcmp(a, "--requests")) o->requests = atoi(v);
        else if (!strcmp(a, "--out")) o->out = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--adaptive")) o->adaptive = atoi(v);
        else if (!strcmp(a, "--min-acc")) o->min_acc = (float)atof(v);
        else if (!strcmp(a, "--temp")) o->temp = (float)atof(v);
        else if (!strcmp(a, "--concurrency")) o->concurrency = atoi(v);
        else return usage();
    }
    if (!o->model || !o->prompts || o->requests < 1 || o->out < 2 || o->reps < 1 || o->kmin < 1 ||
        o->kmax < o->kmin || o->concurrency < 1)
        return usage();
    return 0;
}

/* Off, then every k of each method named in --methods (draft_model only
 * with --draft; unknown names are skipped). */
static void plan_configs(const opts *o, plan *pl /* OUT: */) {
    pl->n = 0;
    pl->method[pl->n] = KV_SPEC_OFF;
    pl->k[pl->n++] = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", o->methods);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        kv_spec_method m = !strcmp(tok, "ngram")         ? KV_SPEC_NGRAM
                           : !strcmp(tok, "self")        ? KV_SPEC_SELF
                           : !strcmp(tok, "draft_model") ? KV_SPEC_DRAFT_MODEL
                                                         : KV_SPEC_OFF;
        if (m == KV_SPEC_OFF || (m == KV_SPEC_DRAFT_MODEL && !o->draft)) continue;
        for (int k = o->kmin; k <= o->kmax && pl->n < MAX_CONFIGS; k++) {
            pl->method[pl->n] = m;
            pl->k[pl->n++] = k;
        }
    }
}

/* A warm-up run, then o->reps interleaved rounds of every configuration;
 * best[i] keeps configuration i's fastest times and its first run's
 * metrics and texts. Returns 0 or -1. */
static int measure(const opts *o, const kv_workload *w, const plan *pl, result *best /* OUT: (pl->n) */) {
    int n = kv_workload_count(w);
    kv_config c;
    config(o, &c, KV_SPEC_OFF, 0);
    result warm;
    memset(&warm, 0, sizeof warm);
    if (run(o, &c, w, &warm)) return -1; /* pages the weights in */
    free_texts(&warm, n);
    for (int rep = 0; rep < o->reps; rep++)
        for (int i = 0; i < pl->n; i++) {
            config(o, &c, pl->method[i], pl->k[i]);
            result r;
            memset(&r, 0, sizeof r);
            if (run(o, &c, w, &r)) return -1;
            if (rep == 0) {
                best[i] = r;
                continue;
            }
            if (r.wall_s < best[i].wall_s) {
                best[i].wall_s = r.wall_s;
                best[i].tok_s = r.tok_s;
                best[i].tpot_ms = r.tpot_ms;
            }
            if (r.cpu_s < best[i].cpu_s) best[i].cpu_s = r.cpu_s;
            free_texts(&r, n);
        }
    return 0;
}

static void print_table(const opts *o, int n, const plan *pl, const result *best) {
    const result *base = &best[0];
    static const char *names[] = {"off", "draft_model", "self", "ngram"};
    printf("%d requests x %d tokens, %d at a time, temperature %.2f, %d threads, best of %d interleaved; off: %.1f "
           "tok/s (TPOT %.1f ms), %.2f CPU-ms per token\n\n",
           n, o->out, o->concurrency, o->temp, o->threads, o->reps, base->tok_s, base->tpot_ms,
           1e3 * base->cpu_s / (double)base->m.output_tokens);
    printf("| method | k | acceptance | p (1st draft) | tokens/verify | predicted (1-p^(k+1))/(1-p) | tok/s | speedup "
           "(wall) | speedup (CPU) | draft ms | verify ms | output |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 1; i < pl->n; i++) {
        const result *r = &best[i];
        const kv_metrics_summary *s = &r->m;
        double p = s->spec_drafts ? (double)s->spec_pos_accepted[0] / (double)s->spec_pos_drafted[0] : 0;
        int same = 1;
        for (int j = 0; j < n; j++) same &= strcmp(r->texts[j], base->texts[j]) == 0;
        printf("| %s", names[pl->method[i]]);
        if (pl->method[i] == KV_SPEC_SELF) printf(" L%d", o->layers);
        printf(" | %d | %.3f | %.3f | %.2f | %.2f | %.1f | %.2fx | %.2fx | %.0f | %.0f | %s |\n", pl->k[i],
               s->spec_acceptance_rate, p, s->spec_mean_accepted_len, kv_spec_expected_tokens(p, pl->k[i]), r->tok_s,
               r->tok_s / base->tok_s, base->cpu_s / r->cpu_s, s->spec_draft_ms, s->spec_verify_ms,
               o->temp > 0 ? "sampled" : same ? "same" : "DIFFERS");
    }
}

int main(int argc, char **argv) {
    opts o;
    if (parse_opts(argc, argv, &o)) return 2;
    if (o.make_draft) return make_draft(o.model, o.make_draft_layers, o.make_draft);
    kv_config c;
    config(&o, &c, KV_SPEC_OFF, 0);
    kv_err err;
    kv_workload *w = kv_workload_build(&c, &err);
    if (!w) {
        fprintf(stderr, "workload: %s\n", err.msg);
        return 1;
    }
    int n = kv_workload_count(w);
    static plan pl;
    static result best[MAX_CONFIGS];
    plan_configs(&o, &pl);
    int rc = measure(&o, w, &pl, best);
    if (rc == 0) print_table(&o, n, &pl, best);
    for (int i = 0; i < pl.n; i++) free_texts(&best[i], n);
    kv_workload_free(w);
    return rc ? 1 : 0;
}
