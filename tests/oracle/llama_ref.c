/* llama_ref.c - the llama.cpp side of the architecture oracle
 * (tests/e2e/arch_oracle.sh): loads a GGUF with libllama, and for each
 * prompt of token ids decodes the prompt, writes the last position's logits,
 * then extends it greedily (argmax, lowest id on ties) for `steps` tokens.
 * Built by the script against a llama.cpp build it finds, never by `make`
 * (it needs llama.h); kvtop's side is tools/arch_ref.c with the same
 * interface and output.
 *
 *   llama_ref MODEL PROMPTS STEPS OUTDIR
 *   PROMPTS: one prompt a line, token ids separated by spaces
 *   prints "tokens I: t1 t2 ..." per prompt; writes OUTDIR/logits-I.f32 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

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

static int run_prompt(struct llama_model *model, int idx, llama_token *ids, int n, int steps, const char *outdir) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + steps + 16);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
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
    for (int s = 0; s < steps; s++) {
        llama_token t = argmax(lg, n_vocab);
        printf(" %d", t);
        if (s + 1 < steps) {
            if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) goto done;
            lg = llama_get_logits_ith(ctx, -1);
        }
    }
    printf("\n");
    rc = 0;
done:
    llama_free(ctx);
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
    char line[65536];
    int idx = 0, rc = 0;
    llama_token ids[8192];
    while (!rc && fgets(line, sizeof line, pf)) {
        int n = 0;
        for (char *p = strtok(line, " \n"); p && n < 8192; p = strtok(NULL, " \n")) ids[n++] = atoi(p);
        if (n == 0) continue;
        rc = run_prompt(model, idx++, ids, n, steps, argv[4]);
    }
    fclose(pf);
    llama_model_free(model);
    return rc;
}
