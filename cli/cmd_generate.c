/* cmd_generate.c - `kvtop generate`: one prompt, streamed continuation, on
 * the single-sequence runner. --stats prints prompt and decode speed, TTFT
 * and TPOT next to the memory-bandwidth ceiling for decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/chat_template.h"
#include "../engine/runner.h"
#include "../engine/sampler.h"
#include "../kernels/membw.h"
#include "../kernels/cpu.h"
#include "../kernels/sim.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvtop generate -m MODEL [--tokenizer FILE] -p PROMPT [options]\n"
            "  -m MODEL          GGUF file or llama2.c checkpoint\n"
            "  --tokenizer FILE  llama2.c tokenizer (for .bin checkpoints)\n"
            "  -p PROMPT         prompt text (-f FILE reads it from a file)\n"
            "  -n N              tokens to generate (default 128)\n"
            "  --chat            wrap the prompt as a user message in the model's chat template\n"
            "  --system TEXT     system message for --chat\n"
            "  --temp T          temperature (default 0.8; 0 = greedy)\n"
            "  --top-k K         (default 40; 0 = off)\n"
            "  --top-p P         (default 0.95)\n"
            "  --min-p P         (default 0.05)\n"
            "  --repeat-penalty R, --repeat-last-n N\n"
            "  --seed S          (default 42)\n"
            "  -t THREADS        (default: all cores)\n"
            "  --backend NAME    cpu | sim | cuda (default cpu; cuda needs a make CUDA=1 build)\n"
            "  --ctx N           context length to allocate (default: the model's, at most 4096)\n"
            "  --kv-dtype D      f32 | f16 (default f32)\n"
            "  --ignore-eos      keep generating past end-of-generation tokens\n"
            "  --no-bos          do not add the BOS token\n"
            "  --stats           print speed and latency figures to stderr\n");
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *prompt = NULL, *prompt_file = NULL, *system = NULL;
    const char *kvd = "f32", *backend = "cpu";
    int n_gen = 128, chat = 0, threads = 0, stats = 0, ctx = 0, ignore_eos = 0, no_bos = 0;
    kv_sampling sp = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                      .repeat_last_n = 64, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) bad = cli_str(argc, argv, &i, &model_path);
        else if (!strcmp(a, "--tokenizer")) bad = cli_str(argc, argv, &i, &tok_path);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) bad = cli_str(argc, argv, &i, &prompt);
        else if (!strcmp(a, "-f")) bad = cli_str(argc, argv, &i, &prompt_file);
        else if (!strcmp(a, "--system")) bad = cli_str(argc, argv, &i, &system);
        else if (!strcmp(a, "-n")) bad = cli_int(argc, argv, &i, 0, 1 << 20, &n_gen);
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--temp")) bad = cli_float(argc, argv, &i, 0, 100, &sp.temperature);
        else if (!strcmp(a, "--top-k")) bad = cli_int(argc, argv, &i, 0, 1 << 24, &sp.top_k);
        else if (!strcmp(a, "--top-p")) bad = cli_float(argc, argv, &i, 1e-6, 1, &sp.top_p);
        else if (!strcmp(a, "--min-p")) bad = cli_float(argc, argv, &i, 0, 0.999999, &sp.min_p);
        else if (!strcmp(a, "--repeat-penalty")) bad = cli_float(argc, argv, &i, 1e-3, 10, &sp.repeat_penalty);
        else if (!strcmp(a, "--repeat-last-n")) bad = cli_int(argc, argv, &i, 0, 1 << 20, &sp.repeat_last_n);
        else if (!strcmp(a, "--seed")) bad = cli_u64(argc, argv, &i, &sp.seed);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) bad = cli_int(argc, argv, &i, 0, 1024, &threads);
        else if (!strcmp(a, "--ctx")) bad = cli_int(argc, argv, &i, 1, 1 << 24, &ctx);
        else if (!strcmp(a, "--kv-dtype")) bad = cli_str(argc, argv, &i, &kvd);
        else if (!strcmp(a, "--backend")) bad = cli_str(argc, argv, &i, &backend);
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--no-bos")) no_bos = 1;
        else if (!strcmp(a, "--stats")) stats = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvtop generate: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!model_path || (!prompt && !prompt_file)) {
        usage(stderr);
        return 2;
    }
    kv_cache_dtype dtype;
    if (kv_cache_dtype_from_name(kvd, &dtype) != 0) {
        fprintf(stderr, "kvtop generate: unknown --kv-dtype '%s'\n", kvd);
        return 2;
    }
    char *prompt_buf = NULL;
    if (prompt_file) {
        prompt_buf = cli_read_file(prompt_file, NULL);
        if (!prompt_buf) {
            fprintf(stderr, "kvtop generate: cannot read %s\n", prompt_file);
            return 1;
        }
        prompt = prompt_buf;
    }

    int rc = 1;
    kv_err err = {0};
    kv_model *m = NULL;
    kv_backend *be = NULL;
    kv_runner *r = NULL;
    kv_sampler *smp = NULL;
    int32_t *ids = NULL, *hist = NULL;
    float *logits = NULL;
    char *text = NULL;

    double t_load = kv_now_s();
    m = kv_model_load(model_path, tok_path, &err);
    if (!m) goto fail;
    be = kv_backend_create(backend, threads, &err);
    if (!be) goto fail;
    t_load = kv_now_s() - t_load;

    /* The text that is tokenized: the raw prompt, or the chat-formatted turn. */
    const char *src = prompt;
    int parse_special = 0;
    if (chat) {
        kv_chat_tmpl t = kv_chat_detect(m->chat_template);
        kv_chat_msg msgs[2];
        int nm = 0;
        if (system) msgs[nm++] = (kv_chat_msg){.role = "system", .content = system};
        msgs[nm++] = (kv_chat_msg){.role = "user", .content = prompt};
        /* NOTE: like llama.cpp's chat formatting, the default system message a
         * Jinja template injects is left out (pass --system to set one). */
        int need = kv_chat_format_ex(t, m->chat_template, 0, msgs, nm, 1, NULL, 0);
        if (need < 0 || !(text = malloc((size_t)need + 1))) {
            kv_err_set(&err, KV_ERR_NOMEM, "cannot format the chat template");
            goto fail;
        }
        kv_chat_format_ex(t, m->chat_template, 0, msgs, nm, 1, text, (size_t)need + 1);
        src = text;
        parse_special = 1;
    }
    int add_bos = no_bos ? 0 : kv_tokenizer_add_bos(m->tok);
    size_t src_len = strlen(src);
    int n_ids = kv_tokenizer_encode(m->tok, src, src_len, add_bos, parse_special, NULL, 0, &err);
    if (n_ids < 0) goto fail;
    if (n_ids == 0) {
        kv_err_set(&err, KV_ERR_INVAL, "the prompt encodes to no tokens");
        goto fail;
    }
    if (ctx <= 0) ctx = KV_MIN(m->hp.ctx_len, 4096);
    if (ctx > m->hp.ctx_len) ctx = m->hp.ctx_len;
    if (n_ids >= ctx) {
        kv_err_set(&err, KV_ERR_RANGE, "the prompt is %d tokens; the context holds %d", n_ids, ctx);
        goto fail;
    }
    if (n_gen > ctx - n_ids) n_gen = ctx - n_ids;
    ids = malloc((size_t)n_ids * sizeof *ids);
    hist = malloc((size_t)(n_ids + n_gen + 1) * sizeof *hist);
    logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    smp = kv_sampler_new(m->hp.n_vocab);
    if (!ids || !hist || !logits || !smp) {
        kv_err_set(&err, KV_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kv_tokenizer_encode(m->tok, src, src_len, add_bos, parse_special, ids, n_ids, &err);
    memcpy(hist, ids, (size_t)n_ids * sizeof *ids);
    r = kv_runner_new(m, be, ctx, 512, dtype, &err);
    if (!r) goto fail;

    /* Echo the prompt as typed, then stream the continuation. */
    fputs(prompt, stdout);
    if (chat) fputc('\n', stdout);
    fflush(stdout);
    kv_rng rng;
    kv_rng_seed(&rng, sp.seed);
    kv_detok dt;
    kv_detok_init(&dt, m->tok, 0); /* the prompt was echoed as typed: keep the first piece's space */
    char piece[512];

    double t0 = kv_now_s();
    if (kv_runner_eval(r, ids, n_ids, logits, NULL, &err)) goto fail;
    double t_prompt = kv_now_s() - t0, t_first = 0;
    int n_hist = n_ids, produced = 0;
    double t_dec0 = kv_now_s();
    for (int step = 0; step < n_gen; step++) {
        int32_t tok = kv_sampler_sample(smp, &sp, logits, hist, n_hist, &rng);
        if (step == 0) t_first = kv_now_s() - t0;
        produced++;
        hist[n_hist++] = tok;
        if (!ignore_eos && kv_tokenizer_is_eog(m->tok, tok)) break;
        int nb = kv_detok_push(m->tok, &dt, tok, piece, sizeof piece);
        if (nb > 0) {
            fwrite(piece, 1, (size_t)nb, stdout);
            fflush(stdout);
        }
        if (step + 1 < n_gen && kv_runner_eval(r, &tok, 1, logits, NULL, &err)) goto fail;
    }
    int nb = kv_detok_flush(m->tok, &dt, piece, sizeof piece);
    if (nb > 0) fwrite(piece, 1, (size_t)nb, stdout);
    fputc('\n', stdout);
    double t_dec = kv_now_s() - t_dec0;
    if (stats && strcmp(be->ops->name, "cpu")) { /* the bandwidth probe below runs on the cpu backend's pool */
        fprintf(stderr, "\n--- stats (backend %s)\nprompt          %d tokens in %.3f s\n", be->ops->name, n_ids, t_prompt);
        if (produced > 1) fprintf(stderr, "decode          %d tokens in %.3f s\n", produced - 1, t_dec);
        kv_sim_stats ss;
        kv_sim_stats_get(be, &ss);
        if (ss.valid)
            fprintf(stderr, "simulated       %.3f ms on %s (matmul %.3f, attention %.3f, other %.3f, transfer %.3f ms)\n",
                    ss.elapsed_s * 1e3, ss.device->name, ss.kind_s[KV_SIM_MATMUL] * 1e3,
                    ss.kind_s[KV_SIM_ATTENTION] * 1e3, ss.kind_s[KV_SIM_OTHER] * 1e3, ss.kind_s[KV_SIM_TRANSFER] * 1e3);
    } else if (stats) {
        /* Decode reads every weight once per token (the embedding row lookup
         * aside), so weight bytes / bandwidth bounds the decode rate. */
        uint64_t bytes = m->weight_bytes - (m->hp.tied_output ? 0 : (uint64_t)m->tok_embd.nb1 * m->tok_embd.ne1);
        double bw = kv_membw_measure_gbs(kv_cpu_pool(be), (size_t)256 << 20, 5);
        double ceiling = bw * 1e9 / (double)bytes;
        int n_dec = produced > 1 ? produced - 1 : 0;
        char b1[32];
        fprintf(stderr, "\n--- stats (%d threads, kv %s)\n", be->n_threads, kv_cache_dtype_name(dtype));
        fprintf(stderr, "load            %.3f s\n", t_load);
        fprintf(stderr, "prompt          %d tokens in %.3f s = %.1f tok/s\n", n_ids, t_prompt, n_ids / t_prompt);
        fprintf(stderr, "TTFT            %.2f ms\n", t_first * 1e3);
        if (n_dec > 0) {
            double dec = t_dec - (t_first - t_prompt);
            fprintf(stderr, "decode          %d tokens in %.3f s = %.1f tok/s\n", n_dec, dec, n_dec / dec);
            fprintf(stderr, "TPOT (mean)     %.3f ms\n", dec / n_dec * 1e3);
            fprintf(stderr, "bandwidth       %.1f GB/s read (measured: %d threads summing a 256 MiB buffer, median of 5)\n",
                    bw, be->n_threads);
            fprintf(stderr, "decode ceiling  %.1f tok/s (%s of weights read per token); reached %.0f%%\n", ceiling,
                    cli_bytes(bytes, b1, sizeof b1), 100.0 * (n_dec / dec) / ceiling);
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvtop generate: %s\n", err.msg[0] ? err.msg : "failed");
done:
    kv_runner_free(r);
    kv_sampler_free(smp);
    kv_backend_free(be);
    kv_model_free(m);
    free(ids);
    free(hist);
    free(logits);
    free(text);
    free(prompt_buf);
    return rc;
}
