/* main.c - the kvtop binary: dispatches subcommands. With no subcommand (or
 * a profile path) it opens the TUI. Only this file calls exit(). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../base/cleanup.h"
#include "commands.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    /* one line per subcommand; keep in the order `kvtop --help` prints them */
    {"info", cmd_info, "architecture, hyper-parameters, tensor types, weight and KV bytes of a model"},
    {"generate", cmd_generate, "generate a continuation of a prompt (streams; --stats for speed)"},
    {"tokenize", cmd_tokenize, "print the token ids (or pieces) of a text; works on vocab-only GGUF files"},
    {"chat", cmd_chat, "plain readline chat REPL in the model's chat template"},
    {"mkmodel", cmd_mkmodel, "write a random-weight llama GGUF of any shape and type"},
    {"bench", cmd_bench, "run a profile's workload headless and print throughput, latency percentiles, goodput"},
    {"bench-kernels", cmd_bench_kernels, "time the CPU matmul kernels per weight type and batch size"},
    {"quantize", cmd_quantize, "re-encode a GGUF model: q8_0, q4_0/1, q5_0/1, q4_k(_m), q5_k(_m), q6_k, f16, bf16"},
    {"eval", cmd_eval, "perplexity and accuracy vs an f32 reference, per weight type and KV dtype"},
    {"tui", cmd_tui, "open the ncurses application (default)"},
    {"replay", cmd_replay, "step through a recorded TUI trace; --export writes Chrome trace JSON"},
    {"tour", cmd_tour, "guided demo: each station a comparison side by side with a caption (F12 next)"},
    {"attach", cmd_attach, "the TUI on a running server: kvtop serve, vLLM, SGLang, llama-server, TGI (a fleet)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with Prometheus /metrics on the profile's engine"},
    {"keys", cmd_keys, "every profile key (type, range, meaning); with a PROFILE, it as it resolves, as YAML"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop [PROFILE.yaml] [--set key=value ...]   open the TUI\n"
               "       kvtop COMMAND [options]                       (COMMAND --help for details)\n\n"
               "commands:\n");
    for (const command *c = commands; c->name; c++) fprintf(f, "  %-14s %s\n", c->name, c->help);
}

int main(int argc, char **argv) {
    cmd_tui_set_server(&kv_server_api); /* kvtop PROFILE --serve PORT: the TUI calls the server through it */
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2) {
        for (const command *c = commands; c->name; c++) {
            if (strcmp(argv[1], c->name)) continue;
            /* Headless commands remove their temporary files when a signal
             * ends them; the TUI and the replay viewer restore the terminal
             * in handlers of their own. */
            if (strcmp(c->name, "tui") && strcmp(c->name, "replay") && strcmp(c->name, "tour") &&
                strcmp(c->name, "attach"))
                kv_cleanup_install();
            return c->fn(argc - 1, argv + 1);
        }
    }
    /* No subcommand: the TUI, on a profile when the first argument names a
     * file (or an option such as --set); a bare word is a mistyped command. */
    if (argc >= 2 && argv[1][0] != '-' && access(argv[1], F_OK) != 0 && !strstr(argv[1], ".yaml") &&
        !strstr(argv[1], ".yml")) {
        fprintf(stderr, "kvtop: unknown command '%s'\n\n", argv[1]);
        usage(stderr);
        return 2;
    }
    for (const command *c = commands; c->name; c++)
        if (!strcmp(c->name, "tui")) return c->fn(argc, argv);
    usage(stderr);
    return 2;
}
