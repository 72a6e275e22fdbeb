/* eval.h - the accuracy price of quantization (`kvtop eval`): perplexity of
 * a text and, against an f32 reference run of the same model, the KL
 * divergence of next-token distributions, top-1 agreement and the largest
 * logit error, for each weight type and KV cache dtype.
 *
 * Two layers: pure math on logit rows (unit-tested on known distributions)
 * and a driver that produces the weight variants with the quantize engine
 * (temp files), runs the text window by window through every configuration
 * and streams the comparison, so only one window of reference logits is ever
 * held. */
#ifndef KV_EVAL_H
#define KV_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/backend.h"
#include "../base/common.h"
#include "model.h"

/* ---- math on logit rows (n_vocab floats); results in double ---- */

/* log(sum(exp(x))), computed stably (max subtracted first). */
double kv_eval_logsumexp(const float *x, int n);
/* -log softmax(x)[target] in nats. */
double kv_eval_nll(const float *x, int n, int32_t target);
/* KL(softmax(ref) || softmax(cfg)) in nats, >= 0 (0 for equal rows). lse_ref
 * is kv_eval_logsumexp(ref, n) (the driver computes it once per reference
 * row and reuses it for every configuration). */
double kv_eval_kl(const float *ref, double lse_ref, const float *cfg, int n);
/* Index of the largest element; the first of equal maxima. */
int kv_eval_argmax(const float *x, int n);

/* Running sums over scored positions (one per configuration). */
typedef struct kv_eval_acc {
    int64_t n;       /* positions scored */
    double sum_nll;  /* nats, of the configuration's own predictions */
    double sum_kl;   /* nats, KL(ref || cfg) summed over positions */
    int64_t n_agree; /* positions where argmax(cfg) == argmax(ref) */
    double max_abs;  /* largest |cfg - ref| logit over scored rows */
} kv_eval_acc;

/* Scores n_rows rows: row i of cfg (n_rows, n_vocab) predicts targets[i].
 * ref (same shape) and ref_lse (n_rows) may be NULL: then only the NLL is
 * accumulated (a reference scoring itself). */
void kv_eval_acc_add(kv_eval_acc *a, const float *ref, const double *ref_lse, const float *cfg, int n_rows,
                     int n_vocab, const int32_t *targets);
double kv_eval_acc_ppl(const kv_eval_acc *a);     /* exp(mean NLL); NAN when nothing scored */
double kv_eval_acc_kl(const kv_eval_acc *a);      /* mean KL; NAN when nothing scored */
double kv_eval_acc_top1(const kv_eval_acc *a);    /* agreement fraction in [0, 1]; NAN when empty */

/* ---- windows ----
 * The text's tokens t[0..n) (no BOS) are cut into windows of at most ctx
 * tokens so that every token is predicted exactly once:
 *   with a BOS id:  window k = [BOS] + t[k(ctx-1) .. k(ctx-1) + ctx-1)
 *                   (all n tokens are scored);
 *   without (-1):   window k = t[k(ctx-1) .. k(ctx-1) + ctx), overlapping
 *                   the previous one by a token (t[1..n) are scored).
 * Row i of a window's logits predicts window[i + 1]. */
int kv_eval_n_windows(int n, int32_t bos, int ctx);
/* Fills win (ctx tokens of room) with window k and returns its length, or
 * 0 when k is past the end (or ctx < 2). */
int kv_eval_window(const int32_t *t, int n, int32_t bos, int ctx, int k, int32_t *win);

/* ---- the driver ---- */

typedef struct kv_eval_params {
    const char *model_path;     /* the model as given: GGUF or llama2.c */
    const char *tokenizer_path; /* llama2.c tokenizer; NULL or "" for GGUF */
    const char *backend;        /* NULL: "cpu" */
    int n_threads;              /* <= 0: all cores */
    int ctx;                    /* window tokens; 0: min(model context, 512); capped at the model's */
    int chunk;                  /* tokens per forward of a configuration (its logits are compared
                                   piece by piece); 0: min(ctx, 128) */
    int bos;                    /* -1: the tokenizer's add_bos; 0: never; 1: always (if it has one) */
    /* Weight types (kv_quant_target_from_name names) run with f16 KV; NULL:
     * f32, q8_0, q4_0 and the file's own type (only the file's own for a
     * llama2.c checkpoint, which cannot be re-encoded). The file's own type
     * runs on the file as given; others are re-encoded from it. */
    const char *const *weights;
    int n_weights;
    /* KV dtypes run with the file's own weights; NULL: f16, int8, fp8_e4m3. */
    const kv_cache_dtype *kv;
    int n_kv;
    int grid;                   /* 1: every weight type with every KV dtype instead of the two
                                   lists above (weights with f16, KV dtypes with the file's weights) */
    const char *tmp_dir;        /* for the re-encoded variants; NULL: $TMPDIR or /tmp */
    /* Progress lines ("quantizing q8_0", "window 2/5"); may be NULL. */
    void (*log)(void *ctx, const char *msg);
    void *log_ctx;
} kv_eval_params;

/* One table row: a (weights, KV dtype) configuration. */
typedef struct kv_eval_row {
    char weights[24];            /* canonical weight-type name ("q8_0", "q4_k_m") */
    int from_file;               /* 1: the model file as given (the file's own type) */
    int is_ref;                  /* 1: the reference (f32 weights, f32 KV) */
    kv_cache_dtype kv;
    uint64_t weight_bytes;       /* bytes of all weight tensors as stored */
    uint64_t kv_bytes_per_token; /* K and V over all layers */
    kv_eval_acc acc;             /* sums over all scored positions */
    double ppl;                  /* perplexity on the text */
    double mean_kl;              /* nats; 0 for the reference */
    double top1;                 /* agreement with the reference, [0, 1] */
    double max_abs_err;          /* largest logit difference to the reference */
    double seconds;              /* wall time of this configuration's forwards */
} kv_eval_row;

typedef struct kv_eval_report {
    char model[128];        /* the model's name */
    char native[24];        /* the file's own weight type ("q4_1") */
    int ctx;                /* window tokens used */
    int bos;                /* 1: windows start with BOS */
    int n_text_tokens;      /* tokens of the text (BOS not counted) */
    int64_t n_scored;       /* predictions per configuration */
    int n_windows;
    int n_vocab;
    int n_rows;
    kv_eval_row *rows;      /* (n_rows) owned; row 0 is the reference */
    double seconds;         /* whole run, variants and loading included */
} kv_eval_report;

/* The weight type a model file mostly holds, as a quantize target name:
 * from general.file_type when it names one, else the most common tensor
 * type other than f32 (f32 when all are). name gets at most cap bytes. */
void kv_eval_native_type(const kv_model *m, char *name, size_t cap);

/* Runs the evaluation of text[0..len). Returns 0 and fills *out (free with
 * kv_eval_report_free), or a negative code with err naming what was wrong:
 * KV_ERR_INVAL (empty text, fewer than 2 tokens, an unknown weight type, a
 * re-encoding a llama2.c checkpoint cannot have), KV_ERR_IO / KV_ERR_FORMAT
 * (model, temp files), KV_ERR_NOMEM. Temp files are removed on every path. */
int kv_eval_run(const kv_eval_params *p, const char *text, size_t len, kv_eval_report *out, kv_err *err);
void kv_eval_report_free(kv_eval_report *r); /* NULL is a no-op; frees rows only */

#endif
