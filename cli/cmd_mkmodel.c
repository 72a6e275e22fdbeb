/* cmd_mkmodel.c - `kvtop mkmodel`: writes a random-weight GGUF of any
 * supported architecture, shape and weight type (for benchmarks and tests), then reopens it to
 * report what was written. */
#include <stdio.h>
#include <string.h>

#include "../engine/gguf.h"
#include "../engine/mkmodel.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    kv_mkmodel_params d = kv_mkmodel_default_params();
    fprintf(f,
            "usage: kvtop mkmodel -o FILE [options]\n"
            "  -o FILE            output GGUF (written to FILE.tmp, then renamed)\n"
            "  --dim N            embedding length (default %d)\n"
            "  --layers N         transformer blocks (default %d)\n"
            "  --heads N          attention heads; must divide dim (default %d)\n"
            "  --kv-heads N       key/value heads; must divide heads (default %d)\n"
            "  --ffn N            feed-forward size (default %d)\n"
            "  --vocab N          tokens, >= 259 (default %d)\n"
            "  --vocab-from FILE  copy the tokenizer.* keys of another GGUF (vocab size from it)\n"
            "  --ctx N            context length (default %d)\n"
            "  --type T           f32|f16|bf16|q8_0|q4_0|q4_1 for the 2-D weights (default f32)\n"
            "  --untied           separate output.weight (default: tied to token_embd)\n"
            "  --seed N           random seed (default %llu); same seed, same bytes\n"
            "  --rope-base X      rope frequency base (default %g)\n"
            "  --rms-eps X        RMSNorm epsilon (default %g)\n"
            "  --name S           general.name (default kvtop-random)\n"
            "  --arch A           llama|qwen2|qwen3|gemma3|phi3|qwen3moe (default llama)\n"
            "  --head-dim N       attention.key_length (default dim / heads)\n"
            "  --window N         attention.sliding_window: gemma3's local layers, llama's every layer\n"
            "  --rope-freqs       a Llama 3 rope_freqs table (factor 8)\n"
            "  --experts N        mixture of experts, --ffn wide each (qwen3moe: default 8;\n"
            "                     llama: Mixtral-style tensors)\n"
            "  --experts-used K   experts per token (default 2)\n",
            d.dim, d.n_layers, d.n_heads, d.n_kv_heads, d.ffn_dim, d.n_vocab, d.ctx_len,
            (unsigned long long)d.seed, d.rope_base, d.rms_eps);
}

int cmd_mkmodel(int argc, char **argv) {
    kv_mkmodel_params p = kv_mkmodel_default_params();
    const char *out = NULL, *type = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o")) {
            bad = cli_str(argc, argv, &i, &out);
        } else if (!strcmp(a, "--dim")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.dim);
        } else if (!strcmp(a, "--layers")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.n_layers);
        } else if (!strcmp(a, "--heads")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.n_heads);
        } else if (!strcmp(a, "--kv-heads")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.n_kv_heads);
        } else if (!strcmp(a, "--ffn")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.ffn_dim);
        } else if (!strcmp(a, "--vocab")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.n_vocab);
        } else if (!strcmp(a, "--vocab-from")) {
            bad = cli_str(argc, argv, &i, &p.vocab_from);
        } else if (!strcmp(a, "--ctx")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.ctx_len);
        } else if (!strcmp(a, "--type")) {
            bad = cli_str(argc, argv, &i, &type);
        } else if (!strcmp(a, "--untied")) {
            p.untied = 1;
        } else if (!strcmp(a, "--tied")) {
            p.untied = 0;
        } else if (!strcmp(a, "--seed")) {
            bad = cli_u64(argc, argv, &i, &p.seed);
        } else if (!strcmp(a, "--rope-base")) {
            bad = cli_float(argc, argv, &i, 1e-3, 1e12, &p.rope_base);
        } else if (!strcmp(a, "--rms-eps")) {
            bad = cli_float(argc, argv, &i, 1e-12, 0.5, &p.rms_eps);
        } else if (!strcmp(a, "--name")) {
            bad = cli_str(argc, argv, &i, &p.name);
        } else if (!strcmp(a, "--arch")) {
            bad = cli_str(argc, argv, &i, &p.arch);
        } else if (!strcmp(a, "--head-dim")) {
            bad = cli_int(argc, argv, &i, 2, 4096, &p.head_dim);
        } else if (!strcmp(a, "--window")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 30, &p.n_swa);
        } else if (!strcmp(a, "--rope-freqs")) {
            p.rope_freqs = 1;
        } else if (!strcmp(a, "--experts")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 20, &p.n_experts);
        } else if (!strcmp(a, "--experts-used")) {
            bad = cli_int(argc, argv, &i, 1, 1 << 20, &p.n_experts_used);
        } else {
            fprintf(stderr, "kvtop mkmodel: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!out) {
        fprintf(stderr, "kvtop mkmodel: -o FILE is required\n");
        usage(stderr);
        return 2;
    }
    if (type && kv_type_from_name(type, &p.type) != 0) {
        fprintf(stderr, "kvtop mkmodel: unknown --type '%s' (f32, f16, bf16, q8_0, q4_0, q4_1)\n", type);
        return 2;
    }
    kv_err err = {0};
    if (kv_mkmodel_validate(&p, &err)) {
        fprintf(stderr, "kvtop %s\n", err.msg); /* the message starts with "mkmodel: " */
        return 2;
    }
    double t0 = kv_now_s();
    if (kv_mkmodel_write(&p, out, &err)) {
        fprintf(stderr, "kvtop %s%s\n", strncmp(err.msg, "mkmodel: ", 9) ? "mkmodel: " : "", err.msg);
        return 1;
    }
    double dt = kv_now_s() - t0;

    /* report from the file itself: it is also a check that it reads back */
    kv_gguf *g = kv_gguf_open(out, &err);
    if (!g) {
        fprintf(stderr, "kvtop mkmodel: wrote %s but cannot read it back: %s\n", out, err.msg);
        return 1;
    }
    uint64_t n_params = 0, n_vocab = 0;
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        n_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    kv_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &n_vocab, NULL);
    char bytes[32];
    printf("wrote %s: %s, dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %llu, ctx %d, %s weights, %s output\n",
           out, p.arch ? p.arch : "llama", p.dim, p.n_layers, p.n_heads, p.n_kv_heads, p.ffn_dim, (unsigned long long)n_vocab, p.ctx_len,
           kv_type_name((int)p.type), p.untied ? "separate" : "tied");
    printf("  %llu parameters (%.2fM) in %lld tensors, %zu bytes (%s), seed %llu, %.2f s\n",
           (unsigned long long)n_params, (double)n_params / 1e6, (long long)kv_gguf_n_tensors(g), kv_gguf_file_size(g),
           cli_bytes(kv_gguf_file_size(g), bytes, sizeof bytes), (unsigned long long)p.seed, dt);
    kv_gguf_close(g);
    return 0;
}
