/* cmd_generate.c - `kvtop generate`: one prompt, streamed continuation, as
 * one request of the engine (the decode loop every front end shares).
 * --stats prints prompt and decode speed, TTFT and TPOT next to the
 * memory-bandwidth ceiling for decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/chat_template.h"
#include "../engine/engine.h"
#include "../engine/tokenizer.h"
#include "../kernels/cpu.h"
#include "../kernels/membw.h"
#include "../kernels/sim.h"
#include "cli.h"
#include "commands.h"
#include "stream.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvtop generate -m MODEL [--tokenizer FILE] -p PROMPT [options]\n"
            "  -m MODEL          GGUF file or llama2.c checkpoint\n"
            "  --tokenizer FILE  llama2.c tokenizer (for .bin checkpoints)\n"
            "  -p PROMPT         prompt text (-f FILE reads it from a file)\n"
            "  -n N              tokens to generate (default 128)\n"
            "  --chat            wrap the prompt as a user message in the model's chat template\n"
            "  --system TEXT     system message for --chat\n"
            "  --special         special-token texts in the prompt (<|im_start|>, <s>) become control tokens;\n"
            "                    without it they stay plain text (with --chat: in the messages too)\n"
            "  --stop STR        end the reply before STR (repeatable)\n"
            "  --temp T          temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K         (default 40; 0 = off)\n"
            "  --top-p P         (default 0.95)\n"
            "  --min-p P         (default 0.05)\n"
            "  --repeat-penalty R, --repeat-last-n N   (default 1 = off, 64)\n"
            "  --seed S          (default 42)\n"
            "  -t THREADS        (default: all cores)\n"
            "  --backend NAME    cpu | sim | cuda (default cpu; cuda needs a make CUDA=1 build)\n"
            "  --ctx N           context length to allocate (default: the model's, at most 4096)\n"
            "  --kv-dtype D      f32 | f16 | int8 | int8_asym | fp8_e4m3 | fp8_e5m2 (default f16, as in\n"
            "                    profiles/default.yaml: the same text as `kvtop bench` on that profile)\n"
            "  --ignore-eos      keep generating past end-of-generation tokens\n"
            "  --no-bos          do not add the BOS token\n"
            "  --stats           print speed and latency figures to stderr\n"
            "Value ranges are the profile keys' (`kvtop keys`): sampling.*, threads, backend, kv.dtype.\n");
}

/* The command line. */
typedef struct gen_args {
    kv_config cfg;           /* the key table's defaults, then the flags that set keys */
    const char *prompt, *prompt_file, *system;
    int n_gen;               /* tokens to generate at most */
    int ctx;                 /* --ctx; 0: the model's, at most DEFAULT_CTX */
    int chat, special, stats, ignore_eos, no_bos; /* bools */
    cli_list stop;           /* --stop strings */
} gen_args;

/* Reads the flags into a. Returns CLI_OK, CLI_HELP or KV_ERR_INVAL (printed). */
static int parse_args(int argc, char **argv, gen_args *a /* OUT: */) {
    memset(a, 0, sizeof *a);
    kv_config_default(&a->cfg);
    a->cfg.sampling.temperature = 0.8f; /* generate's own defaults; the rest are the table's */
    a->cfg.sampling.seed = 42;
    a->n_gen = 128;
    const cli_opt opts[] = {
        {"-m", "--model", CLI_KEY, NULL, "model.path", 0, 0},
        {"--tokenizer", NULL, CLI_KEY, NULL, "model.tokenizer", 0, 0},
        {"-p", "--prompt", CLI_STR, &a->prompt, NULL, 0, 0},
        {"-f", NULL, CLI_STR, &a->prompt_file, NULL, 0, 0},
        {"--system", NULL, CLI_STR, &a->system, NULL, 0, 0},
        {"-n", NULL, CLI_INT, &a->n_gen, NULL, 0, 1 << 20},
        {"--chat", NULL, CLI_FLAG, &a->chat, NULL, 0, 0},
        {"--special", NULL, CLI_FLAG, &a->special, NULL, 0, 0},
        {"--stop", NULL, CLI_LIST, &a->stop, NULL, 0, 0},
        CLI_SAMPLING_OPTS,
        {"-t", "--threads", CLI_KEY, NULL, "threads", 0, 0},
        {"--backend", NULL, CLI_KEY, NULL, "backend", 0, 0},
        {"--ctx", NULL, CLI_INT, &a->ctx, NULL, 1, 1 << 24},
        {"--kv-dtype", NULL, CLI_KEY, NULL, "kv.dtype", 0, 0},
        {"--ignore-eos", NULL, CLI_FLAG, &a->ignore_eos, NULL, 0, 0},
        {"--no-bos", NULL, CLI_FLAG, &a->no_bos, NULL, 0, 0},
        {"--stats", NULL, CLI_FLAG, &a->stats, NULL, 0, 0},
    };
    a->cfg.model.path[0] = 0; /* -m is required */
    cli_spec s = {.cmd = "generate", .opts = opts, .n_opts = (int)KV_ARRAY_LEN(opts), .usage = usage,
                  .cfg = &a->cfg};
    int rc = cli_parse(&s, argc, argv);
    if (rc) return rc;
    if (!a->cfg.model.path[0] || (!a->prompt && !a->prompt_file)) {
        usage(stderr);
        return KV_ERR_INVAL;
    }
    /* The host's clock: --stats reports wall time (the sim backend's device
     * time separately). One sequence: its context sizes the cache. */
    a->cfg.sim_clock = 0;
    cli_size_for_context(&a->cfg, a->ctx);
    return CLI_OK;
}

/* The prompt ids, at most max_tokens: the raw prompt (special-token texts
 * stay text unless --special), or the prompt as a user message in the
 * chat template (its markers special, the messages' text plain unless
 * --special). *ids is malloc'ed. */
static int encode_prompt(const kv_model *m, const gen_args *a, const char *prompt, int max_tokens,
                         int32_t **ids /* OUT: */, int *n /* OUT: */, kv_err *err) {
    if (!a->chat) return cli_encode(m->tok, prompt, !a->no_bos, a->special, max_tokens, ids, n, err);
    kv_chat_msg msgs[2];
    int nm = 0;
    if (a->system) msgs[nm++] = (kv_chat_msg){.role = "system", .content = a->system};
    msgs[nm++] = (kv_chat_msg){.role = "user", .content = prompt};
    /* NOTE: like llama.cpp's chat formatting, the default system message a
     * Jinja template injects is left out (pass --system to set one). */
    return cli_encode_chat(m, msgs, nm, !a->no_bos, a->special, max_tokens, ids, n, err);
}

/* --stats on stderr: the request's timings, and on the cpu backend the
 * decode rate against what the measured memory bandwidth allows. */
static void print_stats(kv_engine *e, int n_prompt, const cli_stream_result *r, double t_load) {
    kv_backend *be = kv_engine_backend(e);
    const kv_model *m = kv_engine_model(e);
    int n_dec = r->n_tokens > 1 ? r->n_tokens - 1 : 0;
    if (strcmp(be->ops->name, "cpu")) { /* the bandwidth probe below runs on the cpu backend's pool */
        fprintf(stderr, "\n--- stats (backend %s)\nprompt          %d tokens in %.3f s\n", be->ops->name, n_prompt,
                r->prefill_s);
        if (n_dec > 0) fprintf(stderr, "decode          %d tokens in %.3f s\n", n_dec, r->decode_s);
        kv_sim_stats ss;
        kv_sim_stats_get(be, &ss);
        if (ss.valid)
            fprintf(stderr, "simulated       %.3f ms on %s (matmul %.3f, attention %.3f, other %.3f, transfer %.3f ms)\n",
                    ss.elapsed_s * 1e3, ss.device->name, ss.kind_s[KV_SIM_MATMUL] * 1e3,
                    ss.kind_s[KV_SIM_ATTENTION] * 1e3, ss.kind_s[KV_SIM_OTHER] * 1e3, ss.kind_s[KV_SIM_TRANSFER] * 1e3);
        return;
    }
    /* Decode reads every weight once per token (the embedding row lookup
     * aside), so weight bytes / bandwidth bounds the decode rate. */
    uint64_t bytes = m->weight_bytes - (m->hp.tied_output ? 0 : (uint64_t)m->tok_embd.nb1 * m->tok_embd.ne1);
    double bw = kv_membw_measure_gbs(kv_cpu_pool(be), (size_t)256 << 20, 5);
    double ceiling = bw * 1e9 / (double)bytes;
    char b1[32];
    fprintf(stderr, "\n--- stats (%d threads, kv %s)\n", be->n_threads,
            kv_cache_dtype_name(kv_engine_config(e)->kv.dtype));
    fprintf(stderr, "load            %.3f s\n", t_load);
    if (r->n_tokens == 0) return; /* -n 0: nothing ran */
    fprintf(stderr, "prompt          %d tokens in %.3f s = %.1f tok/s\n", n_prompt, r->prefill_s,
            n_prompt / r->prefill_s);
    fprintf(stderr, "TTFT            %.2f ms\n", r->ttft_s * 1e3);
    if (n_dec > 0) {
        double dec = r->decode_s > 0 ? r->decode_s : 1e-9;
        fprintf(stderr, "decode          %d tokens in %.3f s = %.1f tok/s\n", n_dec, dec, n_dec / dec);
        fprintf(stderr, "TPOT (mean)     %.3f ms\n", dec / n_dec * 1e3);
        fprintf(stderr, "bandwidth       %.1f GB/s read (measured: %d threads summing a 256 MiB buffer, median of 5)\n",
                bw, be->n_threads);
        fprintf(stderr, "decode ceiling  %.1f tok/s (%s of weights read per token); reached %.0f%%\n", ceiling,
                cli_bytes(bytes, b1, sizeof b1), 100.0 * (n_dec / dec) / ceiling);
    }
}

int cmd_generate(int argc, char **argv) {
    gen_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        cli_list_free(&a.stop);
        return cli_parse_exit(rc);
    }
    char *prompt_buf = NULL;
    const char *prompt = a.prompt;
    if (a.prompt_file) {
        kv_err rerr = {0};
        prompt_buf = cli_read_prompt(a.prompt_file, NULL, &rerr);
        if (!prompt_buf) {
            fprintf(stderr, "kvtop generate: %s\n", rerr.msg);
            cli_list_free(&a.stop);
            return 1;
        }
        prompt = prompt_buf;
    }
    rc = 1;
    kv_err err = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    cli_stream_result res = {0};
    double t_load = kv_now_s();
    kv_engine *e = kv_engine_new(&a.cfg, &err);
    if (!e) goto fail;
    t_load = kv_now_s() - t_load;
    const kv_model *m = kv_engine_model(e);
    cli_engine_notes("generate", e, a.ctx, stderr);
    int ctx = cli_context(e);
    /* room for one generated token at least; a longer prompt is refused
     * before all of it is encoded */
    int erc = encode_prompt(m, &a, prompt, ctx - 1, &ids, &n_ids, &err);
    if (erc == KV_ERR_RANGE)
        kv_err_set(&err, erc, "the prompt is longer than the context (more than %d tokens: the %d-token context keeps "
                   "one for the reply)", ctx - 1, ctx);
    if (erc) goto fail;
    /* Echo the prompt as typed, then stream the continuation. */
    fputs(prompt, stdout);
    if (a.chat) fputc('\n', stdout);
    fflush(stdout);
    if (a.n_gen > 0) {
        kv_request_params p;
        kv_engine_request_defaults(e, &p);
        p.tokens = ids;
        p.n_tokens = n_ids;
        p.max_tokens = KV_MIN(a.n_gen, ctx - n_ids);
        /* --chat: the reply also ends where the template ends an assistant turn */
        const char *eot = a.chat ? kv_chat_end_of_turn(kv_chat_detect(m->chat_template)) : NULL;
        if (eot && *eot && cli_list_add(&a.stop, eot)) {
            kv_err_set(&err, KV_ERR_NOMEM, "out of memory");
            goto fail;
        }
        p.stop = a.stop.v;
        p.n_stop = a.stop.n;
        p.ignore_eos = a.ignore_eos;
        if (cli_stream_run(e, &p, stdout, 0, &res, &err)) goto fail;
    }
    fputc('\n', stdout);
    fflush(stdout);
    if (a.stats) print_stats(e, n_ids, &res, t_load);
    rc = 0;
    goto done;
fail:
    fflush(stdout);
    fprintf(stderr, "kvtop generate: %s\n", err.msg[0] ? err.msg : "failed");
done:
    kv_engine_free(e);
    free(ids);
    free(prompt_buf);
    cli_list_free(&a.stop);
    return rc;
}
