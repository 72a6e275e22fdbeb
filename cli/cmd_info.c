/* cmd_info.c - `kvtop info MODEL`: architecture, hyper-parameters, tensor
 * types and counts, weight bytes and KV bytes per token. */
#include <stdio.h>
#include <string.h>

#include "../engine/chat_template.h"
#include "../engine/model.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop info MODEL [--tokenizer FILE] [--metadata]\n"
               "  MODEL        GGUF file, or llama2.c checkpoint with --tokenizer\n"
               "  --metadata   also list every GGUF metadata key\n");
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL, *tok = NULL;
    int show_meta = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer")) {
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
