/* test_cli.c - the command-line plumbing of generate and chat: the
 * table-driven option parser (key-table ranges and messages, --name=value,
 * repeatable options, positionals, errors) and one request streamed through
 * a caller-stepped engine (stop strings, refusals, and the prefix sharing a
 * chat's next turn gets from the turn before); the messages about input:
 * a prompt over the context, a NUL in a prompt file, --ctx over the
 * model's. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness.h"
#include "../../cli/cli.h"
#include "../../cli/stream.h"
#include "../../engine/gguf.h"
#include "../../engine/mkmodel.h"
#include "../../engine/unicode.h"

static void usage_none(FILE *f) { fputs("usage: test\n", f); }

static void test_parse(void) {
    kv_config c;
    kv_config_default(&c);
    const char *p = NULL;
    int n = 7, flag = 0, n_pos = 0;
    cli_list l = {0};
    const char *pos[2];
    const cli_opt opts[] = {
        {"-p", "--prompt", CLI_STR, &p, NULL, 0, 0},
        {"-n", NULL, CLI_INT, &n, NULL, 0, 100},
        {"--flag", NULL, CLI_FLAG, &flag, NULL, 0, 0},
        {"--stop", NULL, CLI_LIST, &l, NULL, 0, 0},
        CLI_SAMPLING_OPTS,
    };
    cli_spec s = {.cmd = "test", .opts = opts, .n_opts = (int)KV_ARRAY_LEN(opts), .usage = usage_none, .cfg = &c,
                  .pos = pos, .max_pos = 2, .n_pos = &n_pos};
    char *ok[] = {"test", "--prompt", "hi", "-n", "5", "--flag", "--stop", "a", "--stop=b", "--top-k=7",
                  "--temp", "0.5", "file", "--seed", "9"};
    CHECK(cli_parse(&s, (int)KV_ARRAY_LEN(ok), ok) == CLI_OK);
    CHECK(p && !strcmp(p, "hi") && n == 5 && flag == 1 && l.n == 2 && !strcmp(l.v[0], "a") && !strcmp(l.v[1], "b"));
    CHECK(c.sampling.top_k == 7 && c.sampling.temperature == 0.5f && c.sampling.seed == 9);
    CHECK(n_pos == 1 && !strcmp(pos[0], "file"));
    cli_list_free(&l);
    /* out of the key table's range: refused, the value unchanged */
    char *big[] = {"test", "--top-k", "2000000"};
    CHECK(cli_parse(&s, 3, big) == KV_ERR_INVAL && c.sampling.top_k == 7);
    char *rp[] = {"test", "--repeat-penalty", "11"};
    CHECK(cli_parse(&s, 3, rp) == KV_ERR_INVAL);
    char *tp[] = {"test", "--top-p", "0"};
    CHECK(cli_parse(&s, 3, tp) == KV_ERR_INVAL);
    char *range[] = {"test", "-n", "101"};
    CHECK(cli_parse(&s, 3, range) == KV_ERR_INVAL && n == 5);
    char *unknown[] = {"test", "--frobnicate"};
    CHECK(cli_parse(&s, 2, unknown) == KV_ERR_INVAL);
    char *novalue[] = {"test", "-p"};
    CHECK(cli_parse(&s, 2, novalue) == KV_ERR_INVAL);
    char *flagvalue[] = {"test", "--flag=1"};
    CHECK(cli_parse(&s, 2, flagvalue) == KV_ERR_INVAL);
    char *many[] = {"test", "a", "b", "c"};
    CHECK(cli_parse(&s, 4, many) == KV_ERR_INVAL);
    char *help[] = {"test", "-n", "3", "--help"};
    CHECK(cli_parse(&s, 4, help) == CLI_HELP && cli_parse_exit(CLI_HELP) == 0 && cli_parse_exit(KV_ERR_INVAL) == 2);
    cli_list_free(&l);
    cli_list_free(NULL);
}

static kv_engine *tiny_engine(int ctx) {
    kv_config c;
    kv_config_default(&c);
    harness_shared_copy(c.model.path, sizeof c.model.path, "models/stories260K.gguf");
    c.threads = 1;
    c.sampling.temperature = 0;
    cli_size_for_context(&c, ctx);
    kv_err err;
    kv_engine *e = kv_engine_new(&c, &err);
    if (!e) fprintf(stderr, "  engine: %s\n", err.msg);
    return e;
}

static void test_stream(void) {
    kv_engine *e = tiny_engine(256);
    REQUIRE(e);
    CHECK(cli_context(e) == 256);
    const kv_tokenizer *tok = kv_engine_model(e)->tok;
    int32_t *ids = NULL;
    int n = 0;
    kv_err err;
    CHECK(cli_encode(tok, "", 0, 0, 256, &ids, &n, &err) == KV_ERR_INVAL && !ids && n == 0);
    REQUIRE(cli_encode(tok, "Once upon a time", 1, 0, 256, &ids, &n, &err) == 0 && n > 1);
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = ids;
    p.n_tokens = n;
    p.max_tokens = 40;
    cli_stream_result r;
    REQUIRE(cli_stream_run(e, &p, NULL, 1, &r, &err) == 0);
    CHECK(r.text && strstr(r.text, " Lily") && r.n_tokens > 10 && r.ttft_s > 0 && r.prefill_s > 0);
    CHECK(r.decode_s > 0);
    char *full = r.text;
    /* a stop string ends the reply before it */
    const char *stop[] = {" Lily"};
    p.stop = stop;
    p.n_stop = 1;
    REQUIRE(cli_stream_run(e, &p, NULL, 1, &r, &err) == 0);
    CHECK(r.finish == KV_FINISH_STOP && !strstr(r.text, "Lily") && !strncmp(full, r.text, strlen(r.text)));
    free(r.text);
    free(full);
    /* a refused request is an error with the engine's reason */
    p.n_stop = 0;
    p.max_tokens = 1000;
    CHECK(cli_stream_run(e, &p, NULL, 1, &r, &err) == KV_ERR_RANGE && strstr(err.msg, "context") && !r.text);
    free(ids);
    kv_engine_free(e);
}

/* A chat's next turn starts with the turn before: the engine finds its
 * blocks in the prefix cache instead of computing them again. */
static void test_next_turn_shares_prefix(void) {
    kv_engine *e = tiny_engine(0);
    REQUIRE(e);
    const kv_tokenizer *tok = kv_engine_model(e)->tok;
    const char *turn1 = "User: Once upon a time there was a little dog who liked to run in the park.\nAssistant:";
    int32_t *ids = NULL;
    int n = 0;
    kv_err err;
    REQUIRE(cli_encode(tok, turn1, 1, 0, 512, &ids, &n, &err) == 0 && n > 16);
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = ids;
    p.n_tokens = n;
    p.max_tokens = 24;
    cli_stream_result r;
    REQUIRE(cli_stream_run(e, &p, NULL, 1, &r, &err) == 0);
    kv_metrics_summary m;
    kv_engine_metrics(e, &m);
    CHECK(m.prefix_hit_tokens == 0);
    size_t len = strlen(turn1) + strlen(r.text) + 64;
    char *turn2 = malloc(len);
    REQUIRE(turn2);
    snprintf(turn2, len, "%s%s\nUser: And then?\nAssistant:", turn1, r.text);
    free(r.text);
    free(ids);
    REQUIRE(cli_encode(tok, turn2, 1, 0, 512, &ids, &n, &err) == 0);
    p.tokens = ids;
    p.n_tokens = n;
    REQUIRE(cli_stream_run(e, &p, NULL, 1, &r, &err) == 0);
    kv_engine_metrics(e, &m);
    CHECKF(m.prefix_hit_tokens >= 16, "%llu prefix tokens reused", (unsigned long long)m.prefix_hit_tokens);
    free(r.text);
    free(ids);
    free(turn2);
    kv_engine_free(e);
}

/* What generate and chat say about their input: a prompt over the
 * context (found without encoding all of it), a prompt file with a NUL,
 * a --ctx above the model's, an unknown pre-tokenizer. */
static void test_input_messages(void) {
    kv_engine *e = tiny_engine(256);
    REQUIRE(e);
    const kv_tokenizer *tok = kv_engine_model(e)->tok;
    int32_t *ids = NULL;
    int n = 0;
    kv_err err;
    size_t big = 4u << 20;
    char *huge = malloc(big + 1);
    REQUIRE(huge);
    for (size_t i = 0; i < big; i++) huge[i] = "once upon a time "[i % 17];
    huge[big] = 0;
    double t0 = kv_now_s();
    CHECK(cli_encode(tok, huge, 1, 0, 255, &ids, &n, &err) == KV_ERR_RANGE && !ids && n == 0);
    CHECKF(strstr(err.msg, "the prompt is longer than the context (more than 255 tokens)") && kv_now_s() - t0 < 0.1,
           "%s", err.msg);
    free(huge);
    /* the chat form: markers special, message text plain */
    kv_chat_msg m = {"user", "Lily <s> said"};
    REQUIRE(cli_encode_chat(kv_engine_model(e), &m, 1, 1, 0, 64, &ids, &n, &err) == 0);
    int bos = 0;
    for (int i = 0; i < n; i++) bos += ids[i] == kv_tokenizer_bos(tok);
    CHECK(bos == 1 && ids[0] == kv_tokenizer_bos(tok));
    free(ids);
    REQUIRE(cli_encode_chat(kv_engine_model(e), &m, 1, 1, 1, 64, &ids, &n, &err) == 0);
    bos = 0;
    for (int i = 0; i < n; i++) bos += ids[i] == kv_tokenizer_bos(tok);
    CHECK(bos == 2); /* --special: parsed */
    free(ids);
    /* --ctx above the model's context: said once */
    FILE *f = tmpfile();
    REQUIRE(f);
    cli_engine_notes("generate", e, 100000, f);
    cli_engine_notes("generate", e, 256, f);
    rewind(f);
    char line[256] = "";
    size_t got = fread(line, 1, sizeof line - 1, f);
    line[got] = 0;
    fclose(f);
    char want[160];
    snprintf(want, sizeof want, "kvtop generate: note: --ctx 100000 is more than the model's context; using its %d tokens\n",
             kv_engine_model(e)->hp.ctx_len);
    CHECKF(!strcmp(line, want), "[%s]", line);
    kv_engine_free(e);
    /* a prompt file with a NUL byte */
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvtop_test_cli_%d.txt", (int)getpid());
    f = fopen(path, "wb");
    REQUIRE(f);
    fwrite("ab\0cd", 1, 5, f);
    fclose(f);
    size_t len = 0;
    CHECK(cli_read_prompt(path, &len, &err) == NULL && strstr(err.msg, "byte 2 is a NUL"));
    f = fopen(path, "wb");
    fputs("abcd", f);
    fclose(f);
    char *txt = cli_read_prompt(path, &len, &err);
    CHECK(txt && len == 4 && !strcmp(txt, "abcd"));
    free(txt);
    remove(path);
}

/* A model whose tokenizer.ggml.pre is unknown: generate and chat name it
 * and the fallback once, before running. */
static void test_unknown_pre_note(void) {
    static char texts[256][3];
    const char *strs[256];
    for (int b = 0, n = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        size_t k = kv_utf8_encode(printable ? (uint32_t)b : 256u + (uint32_t)n++, texts[b]);
        texts[b][k] = 0;
        strs[b] = texts[b];
    }
    const char *merges[] = {"a b"};
    char vocab[64], model[64];
    snprintf(vocab, sizeof vocab, "/tmp/kvtop_test_cli_vocab_%d.gguf", (int)getpid());
    snprintf(model, sizeof model, "/tmp/kvtop_test_cli_model_%d.gguf", (int)getpid());
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    kv_gguf_writer_add_str(w, "tokenizer.ggml.pre", "frobnicator-9");
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", strs, NULL, 256);
    kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 1);
    kv_err err = {0};
    int rc = kv_gguf_writer_write(w, vocab, &err);
    kv_gguf_writer_free(w);
    REQUIRE(rc == 0);
    kv_mkmodel_params mp = kv_mkmodel_default_params();
    mp.dim = 64;
    mp.n_layers = 1;
    mp.n_heads = 2;
    mp.n_kv_heads = 1;
    mp.ffn_dim = 64;
    mp.ctx_len = 64;
    mp.vocab_from = vocab;
    rc = kv_mkmodel_write(&mp, model, &err);
    remove(vocab);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) return;
    kv_config c;
    kv_config_default(&c);
    snprintf(c.model.path, sizeof c.model.path, "%s", model);
    c.threads = 1;
    cli_size_for_context(&c, 64);
    kv_engine *e = kv_engine_new(&c, &err);
    remove(model);
    CHECKF(e, "%s", err.msg);
    REQUIRE(e);
    FILE *f = tmpfile();
    REQUIRE(f);
    cli_engine_notes("chat", e, 0, f);
    rewind(f);
    char line[512] = "";
    size_t got = fread(line, 1, sizeof line - 1, f);
    line[got] = 0;
    fclose(f);
    const char *want = "kvtop chat: note: tokenizer.ggml.pre 'frobnicator-9' is not a pre-tokenizer kvtop knows; "
                       "using 'default'";
    CHECKF(!strncmp(line, want, strlen(want)) && strchr(line, '\n') == line + strlen(line) - 1, "[%s]", line);
    kv_engine_free(e);
}

TEST_MAIN(T(test_parse), T(test_stream), T(test_next_turn_shares_prefix), T(test_input_messages),
          T(test_unknown_pre_note))
