/* cmd_chat.c - `kvtop chat -m MODEL`: a plain readline REPL in the model's
 * chat template, multi-turn. The conversation is re-formatted each turn and
 * only the tokens after the cached common prefix are evaluated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "../engine/chat_template.h"
#include "../engine/runner.h"
#include "../engine/sampler.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop chat -m MODEL [--tokenizer FILE] [--system TEXT] [--temp T] [--top-p P]\n"
               "                  [--top-k K] [--seed S] [-n MAX_REPLY] [-t THREADS] [--ctx N]\n"
               "commands inside: /reset (new conversation), /quit\n");
}

typedef struct convo {
    kv_chat_msg *msgs; /* role/content strings owned */
    int n, cap;
} convo;

static int convo_add(convo *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 8;
        kv_chat_msg *nm = realloc(c->msgs, (size_t)nc * sizeof *nm);
        if (!nm) return -1;
        c->msgs = nm;
        c->cap = nc;
    }
    char *r = strdup(role), *t = malloc(len + 1);
    if (!r || !t) {
        free(r);
        free(t);
        return -1;
    }
    memcpy(t, content, len);
    t[len] = '\0';
    c->msgs[c->n++] = (kv_chat_msg){.role = r, .content = t};
    return 0;
}

static void convo_clear(convo *c, int keep) {
    for (int i = keep; i < c->n; i++) {
        free((char *)c->msgs[i].role);
        free((char *)c->msgs[i].content);
    }
    c->n = keep;
}

int cmd_chat(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *system = NULL;
    int threads = 0, max_reply = 512, ctx = 0;
    kv_sampling sp = {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                      .repeat_last_n = 64, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) bad = cli_str(argc, argv, &i, &model_path);
        else if (!strcmp(a, "--tokenizer")) bad = cli_str(argc, argv, &i, &tok_path);
        else if (!strcmp(a, "--system")) bad = cli_str(argc, argv, &i, &system);
        else if (!strcmp(a, "--temp")) bad = cli_float(argc, argv, &i, 0, 100, &sp.temperature);
        else if (!strcmp(a, "--top-p")) bad = cli_float(argc, argv, &i, 1e-6, 1, &sp.top_p);
        else if (!strcmp(a, "--top-k")) bad = cli_int(argc, argv, &i, 0, 1 << 24, &sp.top_k);
        else if (!strcmp(a, "--seed")) bad = cli_u64(argc, argv, &i, &sp.seed);
        else if (!strcmp(a, "-n")) bad = cli_int(argc, argv, &i, 1, 1 << 20, &max_reply);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) bad = cli_int(argc, argv, &i, 0, 1024, &threads);
        else if (!strcmp(a, "--ctx")) bad = cli_int(argc, argv, &i, 16, 1 << 24, &ctx);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvtop chat: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!model_path) {
        usage(stderr);
        return 2;
    }
    kv_err err = {0};
    kv_model *m = kv_model_load(model_path, tok_path, &err);
    if (!m) {
        fprintf(stderr, "kvtop chat: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    kv_backend *be = kv_backend_create("cpu", threads, &err);
    kv_runner *r = NULL;
    kv_sampler *smp = kv_sampler_new(m->hp.n_vocab);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (ctx <= 0) ctx = KV_MIN(m->hp.ctx_len, 4096);
    int32_t *cached = malloc((size_t)ctx * sizeof(int32_t)); /* tokens in the runner's cache */
    int32_t *ids = malloc((size_t)ctx * sizeof(int32_t));
    char *text = NULL, *reply = NULL;
    size_t text_cap = 0, reply_cap = 0, reply_len = 0;
    int n_cached = 0;
    convo cv = {0};
    if (!be || !smp || !logits || !cached || !ids) {
        if (!err.msg[0]) kv_err_set(&err, KV_ERR_NOMEM, "out of memory");
        goto fail;
    }
    r = kv_runner_new(m, be, ctx, 512, KV_CACHE_F32, &err);
    if (!r) goto fail;
    kv_chat_tmpl tmpl = kv_chat_detect(m->chat_template);
    if (system && convo_add(&cv, "system", system, strlen(system))) goto fail;
    int keep = cv.n;
    kv_rng rng;
    kv_rng_seed(&rng, sp.seed);
    printf("kvtop chat: %s, template %s, context %d. /reset starts over, /quit leaves.\n", m->name,
           kv_chat_tmpl_name(tmpl), ctx);
    for (;;) {
        char *line = readline("> ");
        if (!line) break;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset")) {
            convo_clear(&cv, keep);
            free(line);
            printf("(conversation reset)\n");
            continue;
        }
        if (!*line) {
            free(line);
            continue;
        }
        add_history(line);
        if (convo_add(&cv, "user", line, strlen(line))) {
            free(line);
            goto fail;
        }
        free(line);
        int need = kv_chat_format_ex(tmpl, m->chat_template, 0, cv.msgs, cv.n, 1, NULL, 0);
        if (need < 0) goto fail;
        if ((size_t)need + 1 > text_cap) {
            text_cap = (size_t)need + 1;
            char *nt = realloc(text, text_cap);
            if (!nt) goto fail;
            text = nt;
        }
        kv_chat_format_ex(tmpl, m->chat_template, 0, cv.msgs, cv.n, 1, text, text_cap);
        int add_bos = kv_tokenizer_add_bos(m->tok);
        int n = kv_tokenizer_encode(m->tok, text, strlen(text), add_bos, 1, ids, ctx, &err);
        if (n < 0) goto fail;
        if (n + 1 >= ctx) {
            printf("(the conversation is %d tokens, over the %d-token context: /reset to start over)\n", n, ctx);
            convo_clear(&cv, cv.n - 1);
            continue;
        }
        /* Re-use the cached common prefix; evaluate only the rest. */
        int common = 0;
        while (common < n_cached && common < n - 1 && cached[common] == ids[common]) common++;
        kv_runner_truncate(r, common);
        if (kv_runner_eval(r, ids + common, n - common, logits, NULL, &err)) goto fail;
        memcpy(cached, ids, (size_t)n * sizeof *ids);
        n_cached = n;
        kv_detok dt;
        kv_detok_init(&dt, m->tok, 0);
        char piece[512];
        reply_len = 0;
        for (int step = 0; step < max_reply && n_cached < ctx; step++) {
            int32_t tok = kv_sampler_sample(smp, &sp, logits, cached, n_cached, &rng);
            if (kv_tokenizer_is_eog(m->tok, tok)) break;
            int nb = kv_detok_push(m->tok, &dt, tok, piece, sizeof piece);
            if (nb > 0) {
                fwrite(piece, 1, (size_t)nb, stdout);
                fflush(stdout);
                if (reply_len + (size_t)nb + 1 > reply_cap) {
                    reply_cap = (reply_len + (size_t)nb + 1) * 2;
                    char *nr = realloc(reply, reply_cap);
                    if (!nr) goto fail;
                    reply = nr;
                }
                memcpy(reply + reply_len, piece, (size_t)nb);
                reply_len += (size_t)nb;
            }
            cached[n_cached++] = tok;
            if (n_cached >= ctx) break;
            if (kv_runner_eval(r, &tok, 1, logits, NULL, &err)) goto fail;
        }
        fputc('\n', stdout);
        if (convo_add(&cv, "assistant", reply ? reply : "", reply_len)) goto fail;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvtop chat: %s\n", err.msg[0] ? err.msg : "out of memory");
done:
    convo_clear(&cv, 0);
    free(cv.msgs);
    free(text);
    free(reply);
    free(cached);
    free(ids);
    free(logits);
    kv_sampler_free(smp);
    kv_runner_free(r);
    kv_backend_free(be);
    kv_model_free(m);
    return rc;
}
