/* arch_ref.c - kvtop's side of the architecture oracle
 * (tests/e2e/arch_oracle.sh, which runs tests/oracle/llama_ref.c on the
 * same file): for each prompt of token ids, the last prompt position's
 * logits from the forward pass (kv_runner, f32 KV cache), then the greedy
 * continuation through the engine (kv_engine, as every front end
 * generates), checked against the runner's own greedy tokens so the two
 * paths cannot drift apart. `make` builds it (it links the engine layer).
 *
 *   build/tools/arch_ref MODEL PROMPTS STEPS OUTDIR [THREADS]
 *   PROMPTS: one prompt a line, token ids separated by spaces
 *   prints "tokens I: t1 t2 ..." per prompt; writes OUTDIR/logits-I.f32 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "../engine/runner.h"

enum { MAX_IDS = 8192 };

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Greedy tokens of the engine for one prompt into out (steps). */
static int engine_tokens(kv_engine *e, const int32_t *ids, int n, int steps, int32_t *out) {
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = ids;
    p.n_tokens = n;
    p.max_tokens = steps;
    p.ignore_eos = 1;
    p.sampling.temperature = 0.0f;
    kv_err err;
    int64_t id = kv_engine_submit(e, &p, &err);
    if (id <= 0) {
        fprintf(stderr, "arch_ref: submit: %s\n", err.msg);
        return -1;
    }
    kv_engine_run_until_idle(e);
    kv_event ev[64];
    int got = 0, k;
    while ((k = kv_engine_poll(e, ev, 64)) > 0)
        for (int i = 0; i < k; i++) {
            if (ev[i].type == KV_EVENT_TOKEN && got < steps) out[got++] = ev[i].token;
            if (ev[i].type == KV_EVENT_DONE && ev[i].finish != KV_FINISH_LENGTH)
                fprintf(stderr, "arch_ref: request ended early: %s\n", ev[i].reason);
        }
    kv_engine_forget(e, id);
    return got == steps ? 0 : -1;
}

static int run_prompt(kv_engine *e, int idx, const int32_t *ids, int n, int steps, const char *outdir) {
    const kv_model *m = kv_engine_model(e);
    const int nv = m->hp.n_vocab;
    kv_err err;
    kv_runner *r = kv_runner_new(m, kv_engine_backend(e), n + steps, 512, KV_CACHE_F32, &err);
    float *lg = malloc((size_t)nv * sizeof(float));
    int32_t *mine = malloc((size_t)steps * sizeof(int32_t)), *eng = malloc((size_t)steps * sizeof(int32_t));
    int rc = -1;
    if (!r || !lg || !mine || !eng) {
        fprintf(stderr, "arch_ref: %s\n", r ? "out of memory" : err.msg);
        goto done;
    }
    if (kv_runner_eval(r, ids, n, lg, NULL, &err) != 0) goto fail;
    char path[1024];
    snprintf(path, sizeof path, "%s/logits-%d.f32", outdir, idx);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(lg, sizeof(float), (size_t)nv, f) != (size_t)nv) {
        fprintf(stderr, "arch_ref: cannot write %s\n", path);
        if (f) fclose(f);
        goto done;
    }
    fclose(f);
    for (int s = 0; s < steps; s++) {
        mine[s] = argmax(lg, nv);
        if (s + 1 < steps && kv_runner_eval(r, &mine[s], 1, lg, NULL, &err) != 0) goto fail;
    }
    if (engine_tokens(e, ids, n, steps, eng) != 0) goto done;
    if (memcmp(mine, eng, (size_t)steps * sizeof(int32_t)) != 0) {
        fprintf(stderr, "arch_ref: prompt %d: the engine's greedy tokens differ from the forward pass's\n", idx);
        goto done;
    }
    printf("tokens %d:", idx);
    for (int s = 0; s < steps; s++) printf(" %d", mine[s]);
    printf("\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "arch_ref: %s\n", err.msg);
done:
    kv_runner_free(r);
    free(lg);
    free(mine);
    free(eng);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: arch_ref MODEL PROMPTS STEPS OUTDIR [THREADS]\n");
        return 2;
    }
    kv_config c;
    kv_config_default(&c);
    snprintf(c.model.path, sizeof c.model.path, "%s", argv[1]);
    c.threads = argc == 6 ? atoi(argv[5]) : 2;
    c.kv.dtype = KV_CACHE_F32;
    c.kv.blocks = 256;
    c.sampling.temperature = 0.0f;
    kv_err err;
    kv_engine *e = kv_engine_new(&c, &err);
    if (!e) {
        fprintf(stderr, "arch_ref: %s\n", err.msg);
        return 1;
    }
    FILE *pf = fopen(argv[2], "r");
    if (!pf) {
        fprintf(stderr, "arch_ref: cannot open %s\n", argv[2]);
        kv_engine_free(e);
        return 1;
    }
    const int steps = atoi(argv[3]);
    static char line[65536];
    static int32_t ids[MAX_IDS];
    int idx = 0, rc = 0;
    while (!rc && steps > 0 && fgets(line, sizeof line, pf)) {
        int n = 0;
        for (char *p = strtok(line, " \n"); p && n < MAX_IDS; p = strtok(NULL, " \n")) ids[n++] = atoi(p);
        if (n == 0) continue;
        rc = run_prompt(e, idx++, ids, n, steps, argv[4]) != 0;
    }
    fclose(pf);
    kv_engine_free(e);
    return rc;
}
