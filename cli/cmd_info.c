/* cmd_info.c - `kvtop info MODEL`: architecture, hyper-parameters, tensor
 * types and counts, weight bytes and KV bytes per token; for a model with
 * sliding-window layers, what window release (kv.window_release) saves,
 * run through the block manager. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/chat_template.h"
#include "../engine/kv_cache.h"
#include "../engine/model.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop info MODEL [--tokenizer FILE] [--metadata] [--ctx N] [--kv-mib N]\n"
               "  MODEL        GGUF file, or llama2.c checkpoint with --tokenizer\n"
               "  --metadata   also list every GGUF metadata key\n"
               "  --ctx N      sliding-window models: the sequence length of the window-release plan\n"
               "               (default the model's context, at most 8192)\n"
               "  --kv-mib N   and the kv.memory it fills (default 1024 MiB)\n");
}

/* A sliding-window model's KV per sequence of n tokens (f16, blocks of 16,
 * as profiles/default.yaml) and how many fit in kv_mib MiB, with window
 * release off and on: the block manager itself admits them (the prompt
 * reserved whole, prefilled in chunks of 512). */
static void window_plan(const kv_model *m, int n, int kv_mib) {
    const kv_hparams *hp = &m->hp;
    uint8_t *local = calloc((size_t)hp->n_layers, 1);
    kv_err err = {0};
    kv_backend *b = kv_backend_create("cpu", 1, &err);
    if (!local || !b) {
        free(local);
        kv_backend_free(b);
        return;
    }
    for (int l = 0; l < hp->n_layers; l++) local[l] = m->layers[l].swa != 0;
    const uint64_t bytes = (uint64_t)kv_mib << 20;
    int fit[2] = {0, 0}, best_seqs = 1;
    uint64_t per[2] = {0, 0};
    for (int on = 0; on < 2; on++)
        /* the engine sizes the local pool for scheduler.max_seqs sequences:
         * the plan takes the max_seqs that fits the most */
        for (int seqs = 1; seqs <= (on ? 256 : 1); seqs++) {
            kv_cache_params p = {.n_layers = hp->n_layers, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
                                 .dtype = KV_CACHE_F16, .block_size = 16, .window = on ? hp->n_swa : 0,
                                 .local_layers = on ? local : NULL};
            kv_cache_size_pools(&p, bytes, 0, seqs, n);
            uint64_t sb = 0;
            int f = p.n_blocks > 0 ? kv_cache_fit_sequences(&p, b, n, 512, 4096, &sb) : 0;
            if (f > fit[on]) {
                fit[on] = f;
                per[on] = sb;
                if (on) best_seqs = seqs;
            }
        }
    char b1[32], b2[32];
    printf("window release f16 at %d tokens: %s a sequence, %s with kv.window_release (%+.0f%%);\n", n,
           cli_bytes(per[0], b1, sizeof b1), cli_bytes(per[1], b2, sizeof b2),
           per[0] ? 100.0 * ((double)per[1] - (double)per[0]) / (double)per[0] : 0.0);
    printf("               kv.memory %d MiB holds %d such sequences at once, %d with it (scheduler.max_seqs %d)\n",
           kv_mib, fit[0], fit[1], best_seqs);
    kv_backend_free(b);
    free(local);
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL, *tok = NULL;
    int show_meta = 0, ctx = 0, kv_mib = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx")) {
            if (cli_int(argc, argv, &i, 1, 1 << 20, &ctx)) return 2;
        } else if (!strcmp(argv[i], "--kv-mib")) {
            if (cli_int(argc, argv, &i, 1, 1 << 24, &kv_mib)) return 2;
        } else if (!strcmp(argv[i], "--tokenizer")) {
            if (cli_str(argc, argv, &i, &tok)) return 2;
        } else if (!strcmp(argv[i], "--metadata")) {
            show_meta = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-m")) {
            if (cli_str(argc, argv, &i, &path)) return 2;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "kvtop info: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    kv_err err = {0};
    kv_model *m = kv_model_load(path, tok, &err);
    if (!m) {
        fprintf(stderr, "kvtop info: %s\n", err.msg);
        return 1;
    }
    if (kv_model_warning(m)[0]) fprintf(stderr, "kvtop info: warning: %s\n", kv_model_warning(m));
    const kv_hparams *hp = &m->hp;
    char b1[32], b2[32];
    printf("model          %s\n", m->name);
    printf("file           %s (%s", m->path, m->format);
    if (m->gguf_version) printf(" v%u", m->gguf_version);
    printf(")\n");
    printf("architecture   %s\n", hp->arch);
    printf("layers         %d\n", hp->n_layers);
    printf("embedding      %d\n", hp->dim);
    printf("feed-forward   %d\n", hp->ffn_dim);
    printf("heads          %d (kv heads %d%s, head size %d)\n", hp->n_heads, hp->n_kv_heads,
           hp->n_kv_heads < hp->n_heads ? ", grouped-query attention" : "", hp->head_dim);
    printf("rope           base %g, %d of %d dims, %s layout\n", hp->rope_base, hp->rot_dim, hp->head_dim,
           hp->rope_neox ? "neox" : "normal");
    char particular[512];
    kv_arch_describe(m, particular, sizeof particular);
    if (particular[0]) printf("arch specifics %s\n", particular);
    printf("rms epsilon    %g\n", hp->rms_eps);
    printf("context        %d\n", hp->ctx_len);
    printf("vocabulary     %d (%s)\n", hp->n_vocab, kv_tokenizer_kind(m->tok));
    printf("output head    %s\n", hp->tied_output ? "tied to the token embedding" : "separate matrix");
    printf("chat template  %s\n", m->chat_template ? kv_chat_tmpl_name(kv_chat_detect(m->chat_template)) : "none");
    printf("parameters     %.2f M\n", (double)m->n_params / 1e6);
    printf("weight bytes   %s (%llu)\n", cli_bytes(m->weight_bytes, b1, sizeof b1),
           (unsigned long long)m->weight_bytes);
    printf("tensor types  ");
    for (int t = 0; t < KV_TYPE_COUNT; t++)
        if (m->type_counts[t]) printf(" %s x%d", kv_type_name(t), m->type_counts[t]);
    printf("\n");
    printf("KV per token   f32 %s, f16 %s, int8 %llu B, fp8 %llu B\n",
           cli_bytes(kv_model_kv_bytes_per_token(m, KV_CACHE_F32), b1, sizeof b1),
           cli_bytes(kv_model_kv_bytes_per_token(m, KV_CACHE_F16), b2, sizeof b2),
           (unsigned long long)kv_model_kv_bytes_per_token(m, KV_CACHE_INT8),
           (unsigned long long)kv_model_kv_bytes_per_token(m, KV_CACHE_FP8_E4M3));
    if (hp->n_swa > 0 && hp->n_swa_layers > 0) window_plan(m, ctx > 0 ? ctx : KV_MIN(hp->ctx_len, 8192), kv_mib);
    if (m->gguf) {
        printf("tensors        %lld\n", (long long)kv_gguf_n_tensors(m->gguf));
        if (show_meta) {
            char val[256];
            for (int64_t i = 0; i < kv_gguf_n_kv(m->gguf); i++) {
                kv_gguf_str k = kv_gguf_key_at(m->gguf, i);
                kv_gguf_format_value(m->gguf, i, val, sizeof val);
                printf("  %.*s = %s\n", (int)k.len, k.data, val);
            }
        }
    }
    kv_model_free(m);
    return 0;
}
