/* kv_precision.c - what an f16 (or any other) KV cache changes against an
 * f32 one on the same weights, at the logit level: the README's "f16 vs f32
 * KV precision" figures. It links the engine layer only (`make` builds it).
 *
 * Text mode scores a text as llama-perplexity --kl-divergence does, so the
 * two programs' figures cover the same positions: the tokens (BOS first
 * when the vocab adds one) cut into n_chunk = n / ctx chunks, BOS in place
 * of each chunk's first token, and the logits of positions ctx/2 .. ctx-2
 * compared, KL(ref || cfg), top-1 agreement and logit error:
 *
 *   build/tools/kv_precision --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
 *       --text data/eval/kvtop-eval.txt --ctx 256 --ref f32 --cfg f16
 *
 * Greedy mode decodes every prompt of a JSONL file with both caches in
 * lockstep and reports, per prompt, the step where the greedy tokens first
 * differ, the top-2 logit margin of each run there, the largest logit
 * difference seen at that step and the smallest margin before it, so a
 * divergence can be told apart from a bug: a near-tie flips when the two
 * caches' logit difference exceeds the margin.
 *
 *   build/tools/kv_precision --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
 *       --prompts data/spec/stories.jsonl --n 64
 *
 * Both modes run one sequence at a time through kv_runner (the forward pass
 * and paged attention the engine uses, without its scheduler), greedy by
 * argmax. --cfg-isa runs the cfg side on other kernels (KVTOP_CPU_ISA):
 * with --cfg equal to --ref it measures what a change of summation order
 * alone does, the floor under every other comparison. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/file.h"
#include "../engine/eval.h"
#include "../engine/model.h"
#include "../engine/runner.h"
#include "../engine/tokenizer.h"
#include "../engine/workload.h"

typedef struct opts {
    const char *model, *tokenizer, *text, *prompts;
    const char *cfg_isa; /* the cfg run's KVTOP_CPU_ISA cap; NULL: the ref's */
    kv_cache_dtype ref, cfg;
    int ctx, n, threads, max_chunks, bos; /* bos: -1 the vocab's default */
} opts;

static int usage(void) {
    fprintf(stderr,
            "usage: kv_precision --model M [--tokenizer T] (--text FILE [--ctx N] [--chunks N] | --prompts F.jsonl "
            "[--n N])\n"
            "                    [--ref f32] [--cfg f16] [--cfg-isa scalar|avx2|avx512] [--threads N] [--bos 0|1]\n"
            "--cfg-isa runs the cfg side on kernels of that ISA: with --cfg equal to --ref it measures\n"
            "what summation order alone changes (the noise floor of the comparison).\n");
    return 2;
}

static int parse_dtype(const char *s, kv_cache_dtype *d) {
    if (kv_cache_dtype_from_name(s, d) == 0) return 0;
    fprintf(stderr, "kv_precision: unknown KV dtype '%s'\n", s);
    return 2;
}

static int parse_int(const char *flag, const char *s, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > 1 << 20) {
        fprintf(stderr, "kv_precision: %s wants an integer >= %d, got '%s'\n", flag, lo, s);
        return 2;
    }
    *out = (int)v;
    return 0;
}

/* 0, or 2 (usage printed). */
static int parse_opts(int argc, char **argv, opts *o /* OUT: */) {
    *o = (opts){.ref = KV_CACHE_F32, .cfg = KV_CACHE_F16, .ctx = 256, .n = 64, .threads = 2, .bos = -1};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!v) return usage();
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!strcmp(a, "--text")) o->text = v;
        else if (!strcmp(a, "--prompts")) o->prompts = v;
        else if (!strcmp(a, "--ref")) rc = parse_dtype(v, &o->ref);
        else if (!strcmp(a, "--cfg")) rc = parse_dtype(v, &o->cfg);
        else if (!strcmp(a, "--ctx")) rc = parse_int(a, v, 4, &o->ctx);
        else if (!strcmp(a, "--chunks")) rc = parse_int(a, v, 0, &o->max_chunks);
        else if (!strcmp(a, "--n")) rc = parse_int(a, v, 1, &o->n);
        else if (!strcmp(a, "--threads")) rc = parse_int(a, v, 1, &o->threads);
        else if (!strcmp(a, "--bos")) rc = parse_int(a, v, 0, &o->bos);
        else if (!strcmp(a, "--cfg-isa")) o->cfg_isa = v;
        else return usage();
        if (rc) return rc;
    }
    if (!o->model || !!o->text == !!o->prompts) return usage();
    return 0;
}

/* The two largest logits of a row: their ids and values. */
typedef struct top2 {
    int id1, id2;
    float v1, v2;
} top2;

static top2 row_top2(const float *x, int n) {
    top2 t = {0, -1, x[0], -INFINITY};
    for (int i = 1; i < n; i++) {
        if (x[i] > t.v1) {
            t.id2 = t.id1, t.v2 = t.v1;
            t.id1 = i, t.v1 = x[i];
        } else if (x[i] > t.v2) {
            t.id2 = i, t.v2 = x[i];
        }
    }
    return t;
}

static float max_abs_diff(const float *a, const float *b, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

/* A token's text, quoted for a table cell (newlines and bars escaped). */
static const char *piece(const kv_tokenizer *t, int id, char *buf, size_t cap) {
    char raw[64];
    int n = kv_tokenizer_piece(t, id, 1, raw, sizeof raw - 1);
    if (n < 0) n = 0;
    if (n > (int)sizeof raw - 1) n = (int)sizeof raw - 1;
    size_t o = 0;
    buf[o++] = '"';
    for (int i = 0; i < n && o + 4 < cap; i++) {
        if (raw[i] == '\n') buf[o++] = '\\', buf[o++] = 'n';
        else if (raw[i] == '|') buf[o++] = '\\', buf[o++] = '|';
        else buf[o++] = raw[i];
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

typedef struct pair {
    kv_runner *ref, *cfg;
} pair;

static void pair_free(pair *p) {
    kv_runner_free(p->ref);
    kv_runner_free(p->cfg);
}

/* The backends of the two sides (the same one unless --cfg-isa). */
typedef struct backends {
    kv_backend *ref, *cfg;
} backends;

static int pair_new(pair *p, const kv_model *m, const backends *b, const opts *o, int max_ctx, kv_err *err) {
    *p = (pair){0};
    p->ref = kv_runner_new(m, b->ref, max_ctx, max_ctx, o->ref, err);
    if (p->ref) p->cfg = kv_runner_new(m, b->cfg, max_ctx, max_ctx, o->cfg, err);
    if (!p->cfg) pair_free(p);
    return p->cfg ? 0 : err->code ? err->code : KV_ERR_NOMEM;
}

/* ---- text mode ---- */

/* Statistics over the scored positions of text mode. */
typedef struct text_stats {
    kv_eval_acc acc;
    double sum_nll_ref;     /* nats, of the reference's own predictions */
    double sum_sq;          /* sum of squared logit errors over every element */
    int64_t n_elems;
    double max_kl;
    int n_flip;             /* positions whose top-1 differs */
    float flip_margin_max;  /* the largest ref top-2 margin among them */
    double flip_margin_sum;
} text_stats;

static void score_rows(text_stats *st, const float *ref, const float *cfg, int rows, int nv, const int32_t *targets) {
    for (int r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * nv, *b = cfg + (size_t)r * nv;
        double lse = kv_eval_logsumexp(a, nv);
        kv_eval_acc_add(&st->acc, a, &lse, b, 1, nv, targets + r);
        st->sum_nll_ref += kv_eval_nll(a, nv, targets[r]);
        double kl = kv_eval_kl(a, lse, b, nv);
        if (kl > st->max_kl) st->max_kl = kl;
        for (int i = 0; i < nv; i++) st->sum_sq += (double)(a[i] - b[i]) * (a[i] - b[i]);
        st->n_elems += nv;
        if (kv_eval_argmax(a, nv) != kv_eval_argmax(b, nv)) {
            top2 t = row_top2(a, nv);
            st->n_flip++;
            st->flip_margin_sum += t.v1 - t.v2;
            if (t.v1 - t.v2 > st->flip_margin_max) st->flip_margin_max = t.v1 - t.v2;
        }
    }
}

/* The text's ids, BOS first when wanted (llama-perplexity tokenizes the
 * whole text with the vocab's add_bos). *ids is malloc'ed. */
static int text_ids(const kv_model *m, const opts *o, int32_t **ids /* OUT: */, int *n /* OUT: */, kv_err *err) {
    char *buf = NULL;
    size_t len = 0;
    int rc = kv_read_file(o->text, 0, &buf, &len, err);
    if (rc) return rc;
    int bos = o->bos >= 0 ? o->bos : kv_tokenizer_add_bos(m->tok);
    int cnt = kv_tokenizer_encode(m->tok, buf, len, bos, 0, NULL, 0, err);
    if (cnt < 0) goto done;
    if (!(*ids = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof **ids))) {
        cnt = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        goto done;
    }
    kv_tokenizer_encode(m->tok, buf, len, bos, 0, *ids, cnt, err);
    *n = cnt;
done:
    free(buf);
    return cnt < 0 ? cnt : 0;
}

static int run_text(const kv_model *m, const backends *b, const opts *o, kv_err *err) {
    const int nv = m->hp.n_vocab, ctx = o->ctx, first = ctx / 2, rows = ctx - 1 - first;
    int32_t *ids = NULL;
    int n = 0, rc = text_ids(m, o, &ids, &n, err);
    if (rc) return rc;
    int n_chunk = n / ctx;
    if (o->max_chunks > 0 && n_chunk > o->max_chunks) n_chunk = o->max_chunks;
    if (ctx > m->hp.ctx_len || n_chunk < 1) {
        free(ids);
        return kv_err_set(err, KV_ERR_INVAL, "%s: %d tokens give no chunk of %d (model context %d)", o->text, n,
                          ctx, m->hp.ctx_len);
    }
    int bos = o->bos >= 0 ? o->bos : kv_tokenizer_add_bos(m->tok);
    pair p;
    float *lr = malloc((size_t)(rows + 1) * nv * sizeof *lr), *lc = malloc((size_t)(rows + 1) * nv * sizeof *lc);
    int32_t *win = malloc((size_t)ctx * sizeof *win);
    if (!lr || !lc || !win) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = pair_new(&p, m, b, o, ctx, err))) goto done;
    text_stats st = {0};
    for (int c = 0; c < n_chunk && rc == 0; c++) {
        memcpy(win, ids + (size_t)c * ctx, (size_t)ctx * sizeof *win);
        if (bos) win[0] = kv_tokenizer_bos(m->tok);
        kv_runner *rr[2] = {p.ref, p.cfg};
        float *out[2] = {lr, lc};
        for (int k = 0; k < 2 && rc == 0; k++) {
            kv_runner_reset(rr[k]);
            rc = kv_runner_eval(rr[k], win, first, out[k], NULL, err);
            if (!rc) rc = kv_runner_eval(rr[k], win + first, ctx - first, NULL, out[k], err);
        }
        /* the eval of win[first..] returned the logits of positions
         * first..ctx-1; rows first..ctx-2 predict win[first+1..ctx-1] */
        if (!rc) score_rows(&st, lr, lc, rows, nv, win + first + 1);
    }
    pair_free(&p);
    if (rc) goto done;
    printf("kv_precision: %s, %s vs %s KV, %d threads: %d chunks of %d tokens (BOS %s), %lld positions scored "
           "(%d..%d of each chunk)\n",
           o->text, kv_cache_dtype_name(o->cfg), kv_cache_dtype_name(o->ref), o->threads, n_chunk, ctx,
           bos ? "first" : "none", (long long)st.acc.n, first, ctx - 2);
    printf("| ref | cfg | ppl ref | ppl cfg | mean KL | max KL | top-1 | max logit err | RMS logit err | top-1 flips | "
           "their ref margin (mean / max) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| %s | %s | %.4f | %.4f | %.3g | %.3g | %.2f%% | %.4f | %.2e | %d | %.4f / %.4f |\n",
           kv_cache_dtype_name(o->ref), kv_cache_dtype_name(o->cfg), exp(st.sum_nll_ref / (double)st.acc.n),
           kv_eval_acc_ppl(&st.acc),
           kv_eval_acc_kl(&st.acc), st.max_kl, 100.0 * kv_eval_acc_top1(&st.acc), st.acc.max_abs,
           sqrt(st.sum_sq / (double)st.n_elems), st.n_flip, st.n_flip ? st.flip_margin_sum / st.n_flip : 0.0,
           st.flip_margin_max);
done:
    free(ids);
    free(lr);
    free(lc);
    free(win);
    return rc;
}

/* ---- greedy mode ---- */

/* One prompt's lockstep decode. */
typedef struct greedy_row {
    int n_prompt;
    int step;            /* first step whose greedy tokens differ; -1: none in n */
    top2 ref, cfg;       /* the two runs' top-2 at that step */
    float diff;          /* max |ref - cfg| logit at that step */
    float min_margin;    /* smallest ref top-2 margin at the steps before */
    float max_diff;      /* largest max |ref - cfg| at the steps before */
} greedy_row;

static int greedy_one(const kv_model *m, const backends *b, const opts *o, const char *prompt, greedy_row *g /* OUT: */,
                      kv_err *err) {
    const int nv = m->hp.n_vocab;
    *g = (greedy_row){.step = -1, .min_margin = INFINITY};
    int bos = o->bos >= 0 ? o->bos : kv_tokenizer_add_bos(m->tok);
    int np = kv_tokenizer_encode(m->tok, prompt, strlen(prompt), bos, 0, NULL, 0, err);
    if (np < 0) return np;
    if (np == 0) return kv_err_set(err, KV_ERR_INVAL, "an empty prompt (no tokens)");
    int32_t *ids = malloc((size_t)np * sizeof *ids);
    float *lr = malloc((size_t)nv * sizeof *lr), *lc = malloc((size_t)nv * sizeof *lc);
    pair p = {0};
    int rc = 0;
    if (!ids || !lr || !lc) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        goto done;
    }
    kv_tokenizer_encode(m->tok, prompt, strlen(prompt), bos, 0, ids, np, err);
    if ((rc = pair_new(&p, m, b, o, np + o->n, err))) goto done;
    g->n_prompt = np;
    if ((rc = kv_runner_eval(p.ref, ids, np, lr, NULL, err)) || (rc = kv_runner_eval(p.cfg, ids, np, lc, NULL, err)))
        goto done;
    for (int s = 0; s < o->n; s++) {
        top2 tr = row_top2(lr, nv), tc = row_top2(lc, nv);
        float d = max_abs_diff(lr, lc, nv);
        if (tr.id1 != tc.id1) {
            g->step = s, g->ref = tr, g->cfg = tc, g->diff = d;
            break;
        }
        g->min_margin = fminf(g->min_margin, tr.v1 - tr.v2);
        g->max_diff = fmaxf(g->max_diff, d);
        if (s + 1 == o->n || kv_tokenizer_is_eog(m->tok, tr.id1)) break;
        int32_t t = tr.id1;
        if ((rc = kv_runner_eval(p.ref, &t, 1, lr, NULL, err)) || (rc = kv_runner_eval(p.cfg, &t, 1, lc, NULL, err)))
            goto done;
    }
done:
    pair_free(&p);
    free(ids);
    free(lr);
    free(lc);
    return rc;
}

static int run_greedy(const kv_model *m, const backends *b, const opts *o, kv_err *err) {
    char *buf = NULL, **prompts = NULL;
    size_t len = 0;
    int n = 0, rc = kv_read_file(o->prompts, 0, &buf, &len, err);
    if (!rc) rc = kv_workload_parse_prompts(buf, len, o->prompts, &prompts, &n, err);
    free(buf);
    if (rc) return rc;
    const char *rn = kv_cache_dtype_name(o->ref), *cn = kv_cache_dtype_name(o->cfg);
    printf("kv_precision: %s, greedy, %d tokens per prompt, %s vs %s KV, %d threads\n", o->prompts, o->n, cn, rn,
           o->threads);
    printf("| prompt | tokens | first differing step | %s top-1 / top-2 (margin) | %s top-1 / top-2 (margin) | "
           "max logit diff there | before it: smallest %s margin, largest logit diff |\n"
           "|---|---|---|---|---|---|---|\n",
           rn, cn, rn);
    int n_div = 0;
    float worst_ratio = 0; /* the largest (margin at the flip / logit diff there) */
    for (int i = 0; i < n && rc == 0; i++) {
        greedy_row g;
        if ((rc = greedy_one(m, b, o, prompts[i], &g, err))) {
            fprintf(stderr, "kv_precision: prompt %d: %s\n", i + 1, err->msg);
            break;
        }
        if (g.step < 0) {
            printf("| %d | %d | same over %d | | | | %.4f, %.4f |\n", i + 1, g.n_prompt, o->n, g.min_margin,
                   g.max_diff);
            continue;
        }
        char a[80], c[80], d[80], e[80];
        const kv_tokenizer *t = m->tok;
        printf("| %d | %d | %d | %s / %s (%.4f) | %s / %s (%.4f) | %.4f | %.4f, %.4f |\n", i + 1, g.n_prompt, g.step,
               piece(t, g.ref.id1, a, sizeof a), piece(t, g.ref.id2, c, sizeof c), g.ref.v1 - g.ref.v2,
               piece(t, g.cfg.id1, d, sizeof d), piece(t, g.cfg.id2, e, sizeof e), g.cfg.v1 - g.cfg.v2, g.diff,
               g.min_margin, g.max_diff);
        n_div++;
        if (g.diff > 0) worst_ratio = fmaxf(worst_ratio, (g.ref.v1 - g.ref.v2) / g.diff);
    }
    if (!rc && n_div == 0) printf("%d of %d prompts differ within %d tokens\n", n_div, n, o->n);
    if (!rc && n_div > 0)
        printf("%d of %d prompts differ within %d tokens; at every flip the %s run's top-2 margin is at most %.2fx "
               "the two caches' largest logit difference there\n",
               n_div, n, o->n, rn, worst_ratio);
    kv_workload_free_prompts(prompts, n);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    kv_err err = {0};
    backends b = {0};
    kv_model *m = kv_model_load(o.model, o.tokenizer, &err);
    if (m) b.ref = kv_backend_create("cpu", o.threads, &err);
    if (b.ref && o.cfg_isa) {
        setenv("KVTOP_CPU_ISA", o.cfg_isa, 1);
        b.cfg = kv_backend_create("cpu", o.threads, &err);
    } else {
        b.cfg = b.ref;
    }
    if (b.cfg) rc = o.text ? run_text(m, &b, &o, &err) : run_greedy(m, &b, &o, &err);
    if (!b.cfg || rc) fprintf(stderr, "kv_precision: %s\n", err.msg);
    if (b.cfg != b.ref) kv_backend_free(b.cfg);
    kv_backend_free(b.ref);
    kv_model_free(m);
    return !b.cfg || rc ? 1 : 0;
}
