/* llama_ref.c - the llama.cpp side of the architecture oracle
 * (tests/e2e/arch_oracle.sh): loads a GGUF with libllama, and for each
 * prompt of token ids decodes the prompt, writes the last position's logits,
 * then extends it greedily (argmax, lowest id on ties) for `steps` tokens,
 * with each choice's margin: (top logit - second) / rms of the logits.
 * Built by the script against a llama.cpp build it finds, never by `make`
 * (it needs llama.h); kvtop's side is tools/arch_ref.c with the same
 * interface and output.
 *
 *   llama_ref MODEL PROMPTS STEPS OUTDIR
 *   PROMPTS: one prompt a line, token ids separated by spaces
 *   prints "tokens I: t1 t2 ..." and "margins I: m1 m2 ..." per prompt;
 *   writes OUTDIR/logits-I.f32 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

enum { MAX_IDS = 1024 }; /* longest prompt */

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* How decided the greedy choice is: (top logit - second) / rms(logits). */
static double margin(const float *v, int n, int best) {
    double ss = 0.0, second = -1e30;
    for (int i = 0; i < n; i++) {
        ss += (double)v[i] * v[i];
        if (i != best && v[i] > second) second = v[i];
    }
    return (v[best] - second) / (ss > 0 ? sqrt(ss / n) : 1.0);
}

/* One prompt on ctx, whose memory is cleared first. */
static int run_prompt(struct llama_model *model, struct llama_context *ctx, int idx, llama_token *ids, int n,
                      int steps, const char *outdir) {
    llama_memory_clear(llama_get_memory(ctx), true);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    int rc = 1;
    if (llama_decode(ctx, llama_batch_get_one(ids, n)) != 0) goto done;
    const float *lg = llama_get_logits_ith(ctx, -1);
    char path[1024];
    snprintf(path, sizeof path, "%s/logits-%d.f32", outdir, idx);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(lg, sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab) {
        fprintf(stderr, "llama_ref: cannot write %s\n", path);
        if (f) fclose(f);
        goto done;
    }
    fclose(f);
    printf("tokens %d:", idx);
    static double margins[4096];
    for (int s = 0; s < steps && s < 4096; s++) {
        llama_token t = argmax(lg, n_vocab);
        margins[s] = margin(lg, n_vocab, t);
        printf(" %d", t);
        if (s + 1 < steps) {
            if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) goto done;
            lg = llama_get_logits_ith(ctx, -1);
        }
    }
    printf("\nmargins %d:", idx);
    for (int s = 0; s < steps && s < 4096; s++) printf(" %.4f", margins[s]);
    printf("\n");
    rc = 0;
done:
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: llama_ref MODEL PROMPTS STEPS OUTDIR\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama_ref: llama.cpp cannot load %s\n", argv[1]);
        return 1;
    }
    FILE *pf = fopen(argv[2], "r");
    if (!pf) {
        fprintf(stderr, "llama_ref: cannot open %s\n", argv[2]);
        return 1;
    }
    const int steps = atoi(argv[3]);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(MAX_IDS + steps + 16);
    cp.n_batch = MAX_IDS;
    cp.n_ubatch = MAX_IDS;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_ref: cannot create a context\n");
        return 1;
    }
    static char line[65536];
    int idx = 0, rc = 0;
    static llama_token ids[MAX_IDS];
    while (!rc && fgets(line, sizeof line, pf)) {
        int n = 0;
        for (char *p = strtok(line, " \n"); p && n < MAX_IDS; p = strtok(NULL, " \n")) ids[n++] = atoi(p);
        if (n == 0) continue;
        rc = run_prompt(model, ctx, idx++, ids, n, steps, argv[4]);
    }
    fclose(pf);
    llama_free(ctx);
    llama_model_free(model);
    return rc;
}
