/* cmd_chat.c - `kvtop chat -m MODEL`: a plain readline REPL in the model's
 * chat template, multi-turn. Each turn the conversation is re-formatted and
 * sent to the engine as one request; the engine's prefix sharing finds the
 * blocks of the turns before, so only the new tokens are computed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "../engine/chat_template.h"
#include "../engine/engine.h"
#include "cli.h"
#include "commands.h"
#include "stream.h"

enum { MAX_STOP = 16 }; /* --stop strings, the end of turn included */

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop chat -m MODEL [--tokenizer FILE] [--system TEXT] [--temp T] [--top-p P]\n"
               "                  [--top-k K] [--min-p P] [--repeat-penalty R] [--repeat-last-n N]\n"
               "                  [--seed S] [--stop STR ...] [-n MAX_REPLY] [-t THREADS] [--ctx N]\n"
               "a reply ends at the template's end of turn, an end-of-generation token or a --stop string\n"
               "commands inside: /reset (new conversation), /quit (or /exit); //text sends /text\n"
               "text typed is plain text: <|im_start|> and the like never become control tokens\n");
}

/* The commands a line may hold, and what a line that is not one sends. */
typedef enum chat_cmd { CHAT_SEND = 0, CHAT_QUIT, CHAT_RESET, CHAT_EMPTY, CHAT_UNKNOWN } chat_cmd;

#define CHAT_COMMANDS "/reset, /quit, /exit (//text sends /text)"

/* What line asks for; *text (for CHAT_SEND) is the message: the line, or
 * for "//..." the line without its first slash. As the TUI does, a line
 * starting with one '/' is a command, never sent to the model. */
static chat_cmd chat_parse_line(const char *line, const char **text /* OUT: */) {
    *text = line;
    if (!*line) return CHAT_EMPTY;
    if (line[0] != '/') return CHAT_SEND;
    if (line[1] == '/') {
        *text = line + 1;
        return CHAT_SEND;
    }
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) return CHAT_QUIT;
    if (!strcmp(line, "/reset")) return CHAT_RESET;
    return CHAT_UNKNOWN;
}

typedef struct convo {
    kv_chat_msg *msgs; /* role/content strings owned */
    int n, cap;
} convo;

static int convo_add(convo *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 8;
        kv_chat_msg *nm = realloc(c->msgs, (size_t)nc * sizeof *nm);
        if (!nm) return KV_ERR_NOMEM;
        c->msgs = nm;
        c->cap = nc;
    }
    char *r = strdup(role), *t = malloc(len + 1);
    if (!r || !t) {
        free(r);
        free(t);
        return KV_ERR_NOMEM;
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

/* The command line. */
typedef struct chat_args {
    kv_config cfg;     /* the key table's defaults, then the flags that set keys */
    const char *system;
    int max_reply;     /* tokens per reply at most */
    int ctx;           /* --ctx; 0: the model's, at most CLI_DEFAULT_CTX */
    cli_list stop;     /* --stop strings */
} chat_args;

static int parse_args(int argc, char **argv, chat_args *a /* OUT: */) {
    memset(a, 0, sizeof *a);
    kv_config_default(&a->cfg);
    a->cfg.sampling.seed = 42; /* chat's own default; the rest are the table's */
    a->max_reply = 512;
    const cli_opt opts[] = {
        {"-m", "--model", CLI_KEY, NULL, "model.path", 0, 0},
        {"--tokenizer", NULL, CLI_KEY, NULL, "model.tokenizer", 0, 0},
        {"--system", NULL, CLI_STR, &a->system, NULL, 0, 0},
        CLI_SAMPLING_OPTS,
        {"--stop", NULL, CLI_LIST, &a->stop, NULL, 0, 0},
        {"-n", NULL, CLI_INT, &a->max_reply, NULL, 1, 1 << 20},
        {"-t", "--threads", CLI_KEY, NULL, "threads", 0, 0},
        {"--ctx", NULL, CLI_INT, &a->ctx, NULL, 16, 1 << 24},
    };
    a->cfg.model.path[0] = 0; /* -m is required */
    cli_spec s = {.cmd = "chat", .opts = opts, .n_opts = (int)KV_ARRAY_LEN(opts), .usage = usage, .cfg = &a->cfg};
    int rc = cli_parse(&s, argc, argv);
    if (rc) return rc;
    if (!a->cfg.model.path[0]) {
        usage(stderr);
        return KV_ERR_INVAL;
    }
    if (a->stop.n >= MAX_STOP) {
        fprintf(stderr, "kvtop chat: at most %d --stop strings\n", MAX_STOP - 1);
        return KV_ERR_INVAL;
    }
    cli_size_for_context(&a->cfg, a->ctx);
    return CLI_OK;
}

/* One turn: the conversation (its last message the user's) formatted,
 * sent, and the reply streamed and added to it. Returns 0 (also when the
 * conversation no longer fits: the user's message is dropped and the user
 * told), or a negative KV_ERR_* with err filled. */
static int chat_turn(kv_engine *e, const chat_args *a, kv_chat_tmpl tmpl, convo *cv, kv_err *err) {
    const kv_model *m = kv_engine_model(e);
    int ctx = cli_context(e);
    int32_t *ids = NULL;
    int n = 0;
    /* room for a reply token at least; a conversation too long is found
     * without encoding all of it */
    int rc = cli_encode_chat(m, cv->msgs, cv->n, 1, 0, ctx - 2, &ids, &n, err);
    if (rc == KV_ERR_RANGE) {
        printf("(the conversation is more than %d tokens, over the %d-token context: /reset to start over)\n", ctx - 2,
               ctx);
        convo_clear(cv, cv->n - 1);
        return 0;
    }
    if (rc) return rc;
    /* The reply ends where the template ends an assistant turn, whether or
     * not the model marks it with an end-of-generation token. */
    const char *stop[MAX_STOP];
    int n_stop = 0;
    for (int i = 0; i < a->stop.n; i++) stop[n_stop++] = a->stop.v[i];
    const char *eot = kv_chat_end_of_turn(tmpl);
    if (eot && *eot) stop[n_stop++] = eot;
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = ids;
    p.n_tokens = n;
    p.max_tokens = KV_MIN(a->max_reply, ctx - n);
    p.stop = stop;
    p.n_stop = n_stop;
    cli_stream_result r;
    rc = cli_stream_run(e, &p, stdout, 1, &r, err);
    free(ids);
    if (rc) return rc;
    fputc('\n', stdout);
    rc = convo_add(cv, "assistant", r.text, strlen(r.text));
    free(r.text);
    return rc ? kv_err_set(err, rc, "out of memory") : 0;
}

int cmd_chat(int argc, char **argv) {
    chat_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        cli_list_free(&a.stop);
        return cli_parse_exit(rc);
    }
    rc = 1;
    kv_err err = {0};
    convo cv = {0};
    kv_engine *e = kv_engine_new(&a.cfg, &err);
    if (!e) goto fail;
    const kv_model *m = kv_engine_model(e);
    cli_engine_notes("chat", e, a.ctx, stderr);
    kv_chat_tmpl tmpl = kv_chat_detect(m->chat_template);
    if (a.system && convo_add(&cv, "system", a.system, strlen(a.system))) goto fail;
    int keep = cv.n;
    printf("kvtop chat: %s, template %s, context %d. /reset starts over, /quit leaves.\n", m->name,
           kv_chat_tmpl_name(tmpl), cli_context(e));
    for (;;) {
        char *line = readline("> ");
        if (!line) break;
        const char *text;
        chat_cmd c = chat_parse_line(line, &text);
        if (c == CHAT_QUIT) {
            free(line);
            break;
        }
        if (c == CHAT_RESET) {
            convo_clear(&cv, keep);
            printf("(conversation reset)\n");
        } else if (c == CHAT_UNKNOWN) {
            size_t wl = strcspn(line, " \t");
            printf("(unknown command %.*s: the commands are %s)\n", (int)KV_MIN(wl, 40), line, CHAT_COMMANDS);
        }
        if (c != CHAT_SEND) {
            free(line);
            continue;
        }
        add_history(line);
        int bad = convo_add(&cv, "user", text, strlen(text));
        free(line);
        if (bad || chat_turn(e, &a, tmpl, &cv, &err)) goto fail;
    }
    rc = 0;
    goto done;
fail:
    fflush(stdout);
    fprintf(stderr, "kvtop chat: %s\n", err.msg[0] ? err.msg : "out of memory");
done:
    convo_clear(&cv, 0);
    free(cv.msgs);
    kv_engine_free(e);
    cli_list_free(&a.stop);
    return rc;
}
