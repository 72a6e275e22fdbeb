/* eval.c - perplexity, KL divergence, top-1 agreement and logit error of
 * weight / KV-cache encodings against an f32 reference (`kvtop eval`): the
 * math on logit rows, the token windows, and the driver that re-encodes the
 * model into temp files and streams the comparison window by window. */
#include "eval.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/cleanup.h"
#include "quantize.h"
#include "runner.h"

/* ---- math ---- */

double kv_eval_logsumexp(const float *x, int n) {
    if (n <= 0) return -INFINITY;
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    if (isinf(mx)) return mx; /* all -inf, or a +inf that dominates */
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s); /* a NaN anywhere makes s NaN: it shows in the result */
}

double kv_eval_nll(const float *x, int n, int32_t target) {
    if (target < 0 || target >= n) return NAN;
    return kv_eval_logsumexp(x, n) - x[target];
}

static double kl_rows(const float *ref, double lse_ref, const float *cfg, double lse_cfg, int n) {
    double kl = 0;
    for (int i = 0; i < n; i++) {
        double lr = (double)ref[i] - lse_ref;
        double lc = (double)cfg[i] - lse_cfg;
        double pr = exp(lr);
        if (pr > 0) kl += pr * (lr - lc); /* 0 * log 0 = 0, also when cfg says -inf */
    }
    /* Rounding can leave a tiny negative sum for near-equal rows; KL is
     * never negative. NaN (a broken kernel) is kept, not hidden. */
    if (kl < 0) kl = 0;
    return kl;
}

double kv_eval_kl(const float *ref, double lse_ref, const float *cfg, int n) {
    return kl_rows(ref, lse_ref, cfg, kv_eval_logsumexp(cfg, n), n);
}

int kv_eval_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void kv_eval_acc_add(kv_eval_acc *a, const float *ref, const double *ref_lse, const float *cfg, int n_rows,
                     int n_vocab, const int32_t *targets) {
    for (int r = 0; r < n_rows; r++) {
        const float *c = cfg + (size_t)r * n_vocab;
        double lse = kv_eval_logsumexp(c, n_vocab);
        int32_t t = targets[r];
        a->sum_nll += (t >= 0 && t < n_vocab) ? lse - c[t] : NAN;
        a->n++;
        if (!ref) continue;
        const float *f = ref + (size_t)r * n_vocab;
        double lr = ref_lse ? ref_lse[r] : kv_eval_logsumexp(f, n_vocab);
        a->sum_kl += kl_rows(f, lr, c, lse, n_vocab);
        if (kv_eval_argmax(f, n_vocab) == kv_eval_argmax(c, n_vocab)) a->n_agree++;
        for (int i = 0; i < n_vocab; i++) {
            double d = fabs((double)c[i] - (double)f[i]);
            if (d > a->max_abs || isnan(d)) a->max_abs = d; /* once NaN, stays NaN */
        }
    }
}

double kv_eval_acc_ppl(const kv_eval_acc *a) { return a->n > 0 ? exp(a->sum_nll / (double)a->n) : NAN; }
double kv_eval_acc_kl(const kv_eval_acc *a) { return a->n > 0 ? a->sum_kl / (double)a->n : NAN; }
double kv_eval_acc_top1(const kv_eval_acc *a) { return a->n > 0 ? (double)a->n_agree / (double)a->n : NAN; }

/* ---- windows ---- */

int kv_eval_n_windows(int n, int32_t bos, int ctx) {
    if (ctx < 2 || n <= 0) return 0;
    /* Each window scores ctx-1 new tokens: all n with BOS, n-1 without. */
    int scored = bos >= 0 ? n : n - 1;
    return scored <= 0 ? 0 : (scored + ctx - 2) / (ctx - 1);
}

int kv_eval_window(const int32_t *t, int n, int32_t bos, int ctx, int k, int32_t *win) {
    if (ctx < 2 || k < 0 || k >= kv_eval_n_windows(n, bos, ctx)) return 0;
    int64_t start = (int64_t)k * (ctx - 1);
    if (bos >= 0) {
        int len = (int)KV_MIN((int64_t)ctx - 1, n - start);
        win[0] = bos;
        memcpy(win + 1, t + start, (size_t)len * sizeof *win);
        return len + 1;
    }
    int len = (int)KV_MIN((int64_t)ctx, n - start);
    memcpy(win, t + start, (size_t)len * sizeof *win);
    return len;
}

/* ---- the driver ---- */

void kv_eval_native_type(const kv_model *m, char *name, size_t cap) {
    static const char *const names[] = {"f32",  "f16",  "bf16",   "q8_0",   "q4_0",   "q4_1", "q5_0",
                                        "q5_1", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k"};
    int n_other = 0; /* tensors not in f32 */
    for (int t = 0; t < KV_TYPE_COUNT; t++) n_other += t != KV_TYPE_F32 ? m->type_counts[t] : 0;
    uint32_t ft;
    if (m->gguf && kv_gguf_get_u32(m->gguf, "general.file_type", &ft, NULL) == 0) {
        for (size_t i = 0; i < KV_ARRAY_LEN(names); i++) {
            kv_quant_target t;
            /* "f32" must be true: the file is then used as the reference. */
            if (kv_quant_target_from_name(names[i], &t, NULL) == 0 && t.file_type == ft &&
                (t.base != KV_TYPE_F32 || n_other == 0)) {
                snprintf(name, cap, "%s", t.name);
                return;
            }
        }
    }
    int best = KV_TYPE_F32, best_n = 0;
    for (int t = 0; t < KV_TYPE_COUNT; t++)
        if (t != KV_TYPE_F32 && m->type_counts[t] > best_n) best = t, best_n = m->type_counts[t];
    snprintf(name, cap, "%s", kv_type_name(best));
}

static void logf_(const kv_eval_params *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const kv_eval_params *p, const char *fmt, ...) {
    if (!p->log) return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    p->log(p->log_ctx, buf);
}

/* The weight types and KV dtypes run when the caller names none. */
static const char *const def_weights[] = {"f32", "q8_0", "q4_0"};
static const kv_cache_dtype def_kv[] = {KV_CACHE_F16, KV_CACHE_INT8, KV_CACHE_FP8_E4M3};

/* One weight encoding: the file as given, or a temp re-encoding of it. */
typedef struct variant {
    char name[24];     /* canonical target name */
    int from_file;
    char path[1100];   /* temp file ("" for the file as given) */
    kv_model *m;       /* owned, except the one that is the source (variants[0].m) */
} variant;

/* The code a failed call left in err, or dflt when it left none (a caller
 * may pass a NULL err), so a failure is never mistaken for success. */
static int err_code(const kv_err *err, int dflt) { return err && err->code < 0 ? err->code : dflt; }

/* Everything one run holds; run_state_free releases it on every path. */
typedef struct run_state {
    variant *vars;       /* (n_vars) vars[0] is the file as given */
    int n_vars;
    char tmp_dir[1024];  /* the directory of the variant being re-encoded; "" when none */
    int max_rows;        /* room in runners, row_var and the report's rows */
    kv_runner **runners; /* (max_rows) one per row */
    int *row_var;        /* (max_rows) index into vars */
    kv_backend *be;      /* shared by every runner */
    int32_t *toks;       /* (n_toks) the text's tokens, BOS not included */
    int n_toks;
    int32_t bos;         /* the id every window starts with; -1 for none */
    int ctx;             /* tokens per window */
    int chunk;           /* tokens per forward of a configuration */
    int n_vocab;
    int32_t *win;        /* (ctx) the current window */
    float *ref_logits;   /* (ctx, n_vocab) the reference's logits of the window */
    float *cfg_logits;   /* (chunk, n_vocab) a configuration's logits of one piece */
    double *ref_lse;     /* (ctx) logsumexp of each reference row */
} run_state;

/* Removes variant v's temp file and its directory (whatever is left of
 * them: a quantize that failed may leave PATH.tmp) and forgets them in the
 * signal cleanup table. */
static void drop_temp(variant *v, char *dir) {
    if (v->path[0]) {
        char tmp[1200];
        unlink(v->path);
        snprintf(tmp, sizeof tmp, "%s.tmp", v->path);
        unlink(tmp);
        kv_cleanup_remove(v->path);
        v->path[0] = 0;
    }
    if (dir[0]) {
        rmdir(dir);
        kv_cleanup_remove(dir);
        dir[0] = 0;
    }
}

static void run_state_free(run_state *s) {
    if (s->runners)
        for (int i = 0; i < s->max_rows; i++) kv_runner_free(s->runners[i]);
    free(s->runners);
    free(s->row_var);
    char none[1] = "";
    for (int i = 0; i < s->n_vars; i++) {
        kv_model_free(s->vars[i].m);
        drop_temp(&s->vars[i], none); /* files first: the directory goes once empty */
    }
    if (s->vars) drop_temp(&s->vars[0], s->tmp_dir);
    free(s->vars);
    kv_backend_free(s->be);
    free(s->toks);
    free(s->win);
    free(s->ref_logits);
    free(s->cfg_logits);
    free(s->ref_lse);
}

/* Index of the variant called name, re-encoding the source on first use;
 * -1 with err filled on failure.
 * NOTE: the copy lives on disk only while it is written and loaded: a
 * fresh private directory holds it, both are registered with
 * base/cleanup.h (a SIGINT/SIGTERM/SIGHUP mid-quantize removes them, and
 * the writer's PATH.tmp), and once the model is mapped the file and the
 * directory are removed: the mapping keeps the bytes, so the evaluation
 * itself (the long part) leaves nothing behind even on SIGKILL. */
static int get_variant(run_state *s, const kv_eval_params *p, const char *name, kv_err *err) {
    for (int i = 0; i < s->n_vars; i++)
        if (!strcmp(s->vars[i].name, name)) return i;
    if (strcmp(s->vars[0].m->format, "gguf") != 0) {
        kv_err_set(err, KV_ERR_INVAL,
                   "eval: %s is a %s checkpoint; only GGUF models can be re-encoded to %s (use --weights %s)",
                   p->model_path, s->vars[0].m->format, name, s->vars[0].name);
        return -1;
    }
    const char *base = p->tmp_dir && *p->tmp_dir ? p->tmp_dir : getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(s->tmp_dir, sizeof s->tmp_dir, "%s/kvtop-eval-XXXXXX", base);
    if (!mkdtemp(s->tmp_dir)) {
        kv_err_set(err, KV_ERR_IO, "eval: cannot create a temp directory in %s: %s", base, strerror(errno));
        s->tmp_dir[0] = 0;
        return -1;
    }
    kv_cleanup_add(s->tmp_dir); /* a full table only means no cleanup on a signal */
    variant *v = &s->vars[s->n_vars];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->path, sizeof v->path, "%s/%s.gguf", s->tmp_dir, name);
    kv_cleanup_add(v->path);
    s->n_vars++; /* counted now so cleanup removes a partial file */
    kv_quantize_params qp = {.n_threads = p->n_threads};
    if (kv_quant_target_from_name(name, &qp.target, err)) return -1;
    logf_(p, "re-encoding the model as %s", name);
    if (kv_quantize_file(p->model_path, v->path, &qp, NULL, err)) return -1;
    v->m = kv_model_load(v->path, NULL, err);
    if (!v->m) return -1;
    drop_temp(v, s->tmp_dir); /* mapped: the file is no longer needed */
    return s->n_vars - 1;
}

void kv_eval_report_free(kv_eval_report *r) {
    if (!r) return;
    free(r->rows);
    r->rows = NULL;
    r->n_rows = 0;
}

/* Checks p before anything is loaded or written: list sizes, KV dtypes and
 * weight-type names. */
static int check_params(const kv_eval_params *p, size_t len, const kv_cache_dtype **kvs /* OUT: */,
                        int *n_kv /* OUT: */, int *n_w /* OUT: */, kv_err *err) {
    if (len == 0) return kv_err_set(err, KV_ERR_INVAL, "eval: the text is empty");
    if ((p->weights && (p->n_weights < 0 || p->n_weights > 1024)) || (p->kv && (p->n_kv < 0 || p->n_kv > 1024)))
        return kv_err_set(err, KV_ERR_INVAL, "eval: bad list sizes (%d weight types, %d KV dtypes)", p->n_weights,
                          p->n_kv);
    *kvs = p->kv ? p->kv : def_kv;
    *n_kv = p->kv ? p->n_kv : (int)KV_ARRAY_LEN(def_kv);
    for (int i = 0; i < *n_kv; i++)
        if ((int)(*kvs)[i] < 0 || (*kvs)[i] >= KV_CACHE_DTYPE_COUNT)
            return kv_err_set(err, KV_ERR_INVAL, "eval: KV dtype %d is not one of the known ones", (int)(*kvs)[i]);
    *n_w = p->weights ? p->n_weights : (int)KV_ARRAY_LEN(def_weights);
    for (int i = 0; i < *n_w; i++) {
        kv_quant_target t;
        if (kv_quant_target_from_name(p->weights ? p->weights[i] : def_weights[i], &t, err)) return KV_ERR_INVAL;
    }
    if (*n_w + *n_kv <= 0) return kv_err_set(err, KV_ERR_INVAL, "eval: no weight type and no KV dtype to evaluate");
    return 0;
}

/* Loads the model as given as vars[0] and names it in the report. */
static int load_source(run_state *s, const kv_eval_params *p, kv_eval_report *rep, kv_err *err) {
    kv_model *m0 = kv_model_load(p->model_path, p->tokenizer_path, err);
    if (!m0) return err_code(err, KV_ERR_IO);
    s->vars[0].m = m0;
    s->vars[0].from_file = 1;
    s->n_vars = 1;
    kv_eval_native_type(m0, s->vars[0].name, sizeof s->vars[0].name);
    snprintf(rep->native, sizeof rep->native, "%s", s->vars[0].name);
    snprintf(rep->model, sizeof rep->model, "%s", m0->name);
    s->n_vocab = rep->n_vocab = m0->hp.n_vocab;
    return 0;
}

/* The text's tokens, BOS kept apart (windows add it themselves), and the
 * window size. */
static int tokenize_text(run_state *s, const kv_eval_params *p, const char *text, size_t len, kv_eval_report *rep,
                         kv_err *err) {
    const kv_model *m0 = s->vars[0].m;
    int n = kv_tokenizer_encode(m0->tok, text, len, 0, 0, NULL, 0, err);
    if (n < 0) return n;
    int want_bos = p->bos < 0 ? kv_tokenizer_add_bos(m0->tok) : p->bos;
    s->bos = want_bos ? kv_tokenizer_bos(m0->tok) : -1;
    rep->bos = s->bos >= 0;
    rep->n_text_tokens = n;
    if (n + (s->bos >= 0) < 2)
        return kv_err_set(err, KV_ERR_INVAL, "eval: the text is %d token%s%s; perplexity needs at least 2", n,
                          n == 1 ? "" : "s", s->bos >= 0 ? " after BOS" : "");
    if (!(s->toks = malloc((size_t)n * sizeof *s->toks)))
        return kv_err_set(err, KV_ERR_NOMEM, "eval: out of memory for %d tokens", n);
    kv_tokenizer_encode(m0->tok, text, len, 0, 0, s->toks, n, err);
    s->n_toks = n;
    int ctx = p->ctx > 0 ? p->ctx : KV_MIN(m0->hp.ctx_len, 512);
    if (ctx > m0->hp.ctx_len) ctx = m0->hp.ctx_len;
    if (ctx < 2)
        return kv_err_set(err, KV_ERR_INVAL, "eval: a window of %d token(s) predicts nothing; use --ctx 2 or more",
                          ctx);
    s->ctx = rep->ctx = ctx;
    rep->n_windows = kv_eval_n_windows(n, s->bos, ctx);
    return 0;
}

/* The weight types to run: p's list, else the default set (which a
 * llama2.c checkpoint cannot be re-encoded to) and the file's own type. */
static int n_weight_names(const run_state *s, const kv_eval_params *p, int n_w) {
    if (p->weights) return n_w;
    return (strcmp(s->vars[0].m->format, "gguf") == 0 ? n_w : 0) + 1;
}

static const char *weight_name(const run_state *s, const kv_eval_params *p, int n_w, int i) {
    if (p->weights) return p->weights[i];
    if (strcmp(s->vars[0].m->format, "gguf") == 0 && i < n_w) return def_weights[i];
    return s->vars[0].name;
}

/* The rows: the reference (f32 weights and f32 KV, the file itself when it
 * is f32) first, then weight rows with f16 KV and KV rows with the file's
 * own weights, or with p->grid every weight type with every KV dtype; a
 * configuration asked for twice is run once. The reference is always a run
 * of its own, so a configuration equal to it is a real check, not a copy. */
static int plan_rows(run_state *s, const kv_eval_params *p, int n_w, const kv_cache_dtype *kvs, int n_kv,
                     kv_eval_report *rep, kv_err *err) {
    int v_ref = get_variant(s, p, "f32", err);
    if (v_ref < 0) return err_code(err, KV_ERR_IO);
    rep->rows[0] = (kv_eval_row){.is_ref = 1, .kv = KV_CACHE_F32};
    s->row_var[0] = v_ref;
    rep->n_rows = 1;
    const int n_wl = n_weight_names(s, p, n_w);
    const int n_cfg = p->grid ? n_wl * n_kv : n_wl + n_kv;
    for (int i = 0; i < n_cfg; i++) {
        int v = 0; /* KV rows run the file's own weights */
        kv_cache_dtype d = p->grid ? kvs[i % n_kv] : i < n_wl ? KV_CACHE_F16 : kvs[i - n_wl];
        if (p->grid || i < n_wl) {
            kv_quant_target t;
            if (kv_quant_target_from_name(weight_name(s, p, n_w, p->grid ? i / n_kv : i), &t, err))
                return KV_ERR_INVAL;
            if ((v = get_variant(s, p, t.name, err)) < 0) return err_code(err, KV_ERR_IO);
        }
        int dup = 0;
        for (int r = 1; r < rep->n_rows; r++) dup |= s->row_var[r] == v && rep->rows[r].kv == d;
        if (dup) continue;
        rep->rows[rep->n_rows] = (kv_eval_row){.kv = d};
        s->row_var[rep->n_rows++] = v;
    }
    return 0;
}

/* The window buffers. Each configuration evaluates a window in pieces of
 * `chunk` tokens and is compared piece by piece, so only the reference's
 * window logits are held whole (ctx x n_vocab floats). */
static int alloc_windows(run_state *s, kv_err *err) {
    uint64_t ref_floats, cfg_floats;
    if (kv_mul_overflow((uint64_t)s->ctx, (uint64_t)s->n_vocab, &ref_floats) ||
        kv_mul_overflow((uint64_t)s->chunk, (uint64_t)s->n_vocab, &cfg_floats) ||
        ref_floats > SIZE_MAX / sizeof(float))
        return kv_err_set(err, KV_ERR_NOMEM, "eval: %d x %d logits do not fit in memory", s->ctx, s->n_vocab);
    s->ref_logits = malloc((size_t)ref_floats * sizeof(float));
    s->cfg_logits = malloc((size_t)cfg_floats * sizeof(float));
    s->ref_lse = malloc((size_t)s->ctx * sizeof *s->ref_lse);
    s->win = malloc((size_t)s->ctx * sizeof *s->win);
    if (!s->ref_logits || !s->cfg_logits || !s->ref_lse || !s->win)
        return kv_err_set(err, KV_ERR_NOMEM, "eval: out of memory for %d x %d logits", s->ctx, s->n_vocab);
    return 0;
}

/* The backend, one runner per row (filling in the row's weights and sizes)
 * and the window buffers. */
static int open_runners(run_state *s, const kv_eval_params *p, kv_eval_report *rep, kv_err *err) {
    s->be = kv_backend_create(p->backend ? p->backend : "cpu", p->n_threads, err);
    if (!s->be) return err_code(err, KV_ERR_BACKEND);
    s->chunk = KV_MIN(s->ctx, p->chunk > 0 ? p->chunk : 128);
    for (int r = 0; r < rep->n_rows; r++) {
        variant *v = &s->vars[s->row_var[r]];
        kv_eval_row *row = &rep->rows[r];
        snprintf(row->weights, sizeof row->weights, "%s", v->name);
        row->from_file = v->from_file;
        row->weight_bytes = v->m->weight_bytes;
        row->kv_bytes_per_token = kv_model_kv_bytes_per_token(v->m, row->kv);
        if (v->m->hp.n_vocab != s->n_vocab)
            return kv_err_set(err, KV_ERR_FORMAT, "eval: the %s variant has %d tokens, the model %d", v->name,
                              v->m->hp.n_vocab, s->n_vocab);
        s->runners[r] = kv_runner_new(v->m, s->be, s->ctx, s->chunk, row->kv, err);
        if (!s->runners[r]) return err_code(err, KV_ERR_NOMEM);
    }
    return alloc_windows(s, err);
}

/* Runs one configuration over the window win[0..wl) in pieces of chunk
 * tokens, scoring each piece against the reference's rows of the same
 * positions. */
static int run_config(run_state *s, kv_runner *run, kv_eval_row *row, int wl, kv_err *err) {
    const int scored = wl - 1, n_vocab = s->n_vocab;
    kv_runner_reset(run);
    for (int at = 0; at < wl; at += s->chunk) {
        int c = KV_MIN(s->chunk, wl - at);
        double t0 = kv_now_s();
        int rc = kv_runner_eval(run, s->win + at, c, NULL, s->cfg_logits, err);
        if (rc) return rc;
        row->seconds += kv_now_s() - t0;
        int rows = KV_MIN(c, scored - at); /* the window's last row predicts nothing */
        if (rows > 0)
            kv_eval_acc_add(&row->acc, s->ref_logits + (size_t)at * n_vocab, s->ref_lse + at, s->cfg_logits, rows,
                            n_vocab, s->win + at + 1);
    }
    return 0;
}

/* Every window through the reference (held whole), then through each
 * configuration. */
static int run_windows(run_state *s, const kv_eval_params *p, kv_eval_report *rep, kv_err *err) {
    const int n_vocab = s->n_vocab;
    for (int k = 0; k < rep->n_windows; k++) {
        int wl = kv_eval_window(s->toks, s->n_toks, s->bos, s->ctx, k, s->win);
        int scored = wl - 1; /* row i predicts win[i + 1] */
        logf_(p, "window %d/%d (%d tokens)", k + 1, rep->n_windows, wl);
        double t0 = kv_now_s();
        kv_runner_reset(s->runners[0]);
        int rc = kv_runner_eval(s->runners[0], s->win, wl, NULL, s->ref_logits, err);
        if (rc) return rc;
        rep->rows[0].seconds += kv_now_s() - t0;
        for (int i = 0; i < scored; i++)
            s->ref_lse[i] = kv_eval_logsumexp(s->ref_logits + (size_t)i * n_vocab, n_vocab);
        kv_eval_acc_add(&rep->rows[0].acc, NULL, NULL, s->ref_logits, scored, n_vocab, s->win + 1);
        for (int r = 1; r < rep->n_rows; r++)
            if ((rc = run_config(s, s->runners[r], &rep->rows[r], wl, err))) return rc;
    }
    return 0;
}

/* The table's numbers from the sums; the reference is exact against itself. */
static void finish_rows(kv_eval_report *rep) {
    for (int r = 0; r < rep->n_rows; r++) {
        kv_eval_row *row = &rep->rows[r];
        row->ppl = kv_eval_acc_ppl(&row->acc);
        row->mean_kl = r == 0 ? 0 : kv_eval_acc_kl(&row->acc);
        row->top1 = r == 0 ? 1 : kv_eval_acc_top1(&row->acc);
        row->max_abs_err = r == 0 ? 0 : row->acc.max_abs;
    }
    rep->n_scored = rep->rows[0].acc.n;
}

int kv_eval_run(const kv_eval_params *p, const char *text, size_t len, kv_eval_report *out, kv_err *err) {
    if (!p || !p->model_path || !out || (!text && len)) return kv_err_set(err, KV_ERR_INVAL, "eval: NULL argument");
    const kv_cache_dtype *kvs = NULL;
    int n_kv = 0, n_w = 0;
    int rc = check_params(p, len, &kvs, &n_kv, &n_w, err);
    if (rc) return rc;

    double t_start = kv_now_s();
    kv_eval_report rep;
    memset(&rep, 0, sizeof rep);
    run_state s;
    memset(&s, 0, sizeof s);
    s.max_rows = p->grid ? (n_w + 1) * n_kv + 1 : n_w + n_kv + 2;
    s.vars = calloc((size_t)n_w + 3, sizeof *s.vars);
    rep.rows = calloc((size_t)s.max_rows, sizeof *rep.rows);
    s.row_var = calloc((size_t)s.max_rows, sizeof *s.row_var);
    s.runners = calloc((size_t)s.max_rows, sizeof *s.runners);
    if (!s.vars || !rep.rows || !s.row_var || !s.runners) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "eval: out of memory");
        goto fail;
    }
    if ((rc = load_source(&s, p, &rep, err)) || (rc = tokenize_text(&s, p, text, len, &rep, err)) ||
        (rc = plan_rows(&s, p, n_w, kvs, n_kv, &rep, err)) || (rc = open_runners(&s, p, &rep, err)) ||
        (rc = run_windows(&s, p, &rep, err)))
        goto fail;
    finish_rows(&rep);
    rep.seconds = kv_now_s() - t_start;
    *out = rep;
    rep.rows = NULL;

fail:
    free(rep.rows);
    run_state_free(&s);
    return rc;
}
