/* serve.c - `kvtop serve`: options and profile, the listening socket
 * before the model (so /health says 503 while it loads), the engine on its
 * own thread, the dispatcher, and an orderly shutdown on SIGINT/SIGTERM/
 * SIGHUP: stop accepting, let in-flight requests finish for
 * server.shutdown_grace_ms, cancel the rest (their clients get an error
 * event saying so), close the connections, exit 0. */
#include "server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../profiles/profile.h"
#include "http.h"
#include "srv.h"

#define MAX_SETS 256

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop serve [PROFILE.yaml] [options]\n"
               "  an OpenAI-compatible HTTP server on the profile's engine:\n"
               "  POST /v1/chat/completions, /v1/completions, /tokenize, /detokenize;\n"
               "  GET /v1/models, /health, /metrics (Prometheus, vLLM names);\n"
               "  GET /kvtop/v1/snapshot, /kvtop/v1/stream; POST /kvtop/v1/control (needs the key)\n\n"
               "  --set key=value       override a profile key (repeatable), e.g. --set server.max_queue=64\n"
               "  --host ADDR           listen address (server.host, default 127.0.0.1)\n"
               "  --port N              TCP port (server.port, default 8000; 0 = any free port)\n"
               "  --api-key KEY         Bearer key every API call needs (server.api_key; also KVTOP_API_KEY)\n"
               "  --model-name NAME     the model id clients use (default: the model file's name)\n"
               "  --metrics-prefix P    kvtop | vllm: /metrics names kvtop:... or vllm:...\n"
               "  -m, --model FILE      model file (model.path)\n\n"
               "Limits (server.*): max_connections, max_body, max_queue, header_timeout_ms,\n"
               "idle_timeout_ms, shutdown_grace_ms; `kvtop keys` lists them. Prints\n"
               "\"listening on http://HOST:PORT\" on stderr once the socket is open.\n"
               "Exit status: 0 after SIGINT/SIGTERM, 1 runtime error, 2 usage or profile error.\n");
}

typedef struct serve_args {
    const char *profile;
    const char *sets[MAX_SETS + 8];
    int n_sets;
    const char *model_name;
    char buf[8][1200];      /* "key=value" texts made from the options */
    int n_buf;
} serve_args;

/* Adds "key=value" from an option as one more --set (after the profile's
 * own --set, so the command line wins). */
static int add_set(serve_args *a, const char *key, const char *val) {
    if (a->n_buf >= 8 || a->n_sets >= MAX_SETS + 8) return -1;
    snprintf(a->buf[a->n_buf], sizeof a->buf[a->n_buf], "%s=%s", key, val);
    a->sets[a->n_sets++] = a->buf[a->n_buf++];
    return 0;
}

static int parse_args(int argc, char **argv, serve_args *a) {
    memset(a, 0, sizeof *a);
    static const struct {
        const char *opt, *alias, *key;
    } to_key[] = {
        {"--host", NULL, "server.host"},         {"--port", NULL, "server.port"},
        {"--api-key", NULL, "server.api_key"},   {"--metrics-prefix", NULL, "server.metrics_prefix"},
        {"--model", "-m", "model.path"},
    };
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 1;
        }
        int known = 0;
        for (size_t k = 0; k < KV_ARRAY_LEN(to_key); k++) {
            size_t ol = strlen(to_key[k].opt);
            const char *val = NULL;
            if (!strcmp(o, to_key[k].opt) || (to_key[k].alias && !strcmp(o, to_key[k].alias))) {
                if (i + 1 >= argc) {
                    fprintf(stderr, "kvtop serve: %s needs a value\n", o);
                    return -1;
                }
                val = argv[++i];
            } else if (!strncmp(o, to_key[k].opt, ol) && o[ol] == '=') {
                val = o + ol + 1;
            } else {
                continue;
            }
            known = 1;
            if (add_set(a, to_key[k].key, val)) {
                fprintf(stderr, "kvtop serve: too many options\n");
                return -1;
            }
            break;
        }
        if (known) continue;
        if (!strcmp(o, "--set") || !strncmp(o, "--set=", 6)) {
            const char *v = o[5] == '=' ? o + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) {
                fprintf(stderr, "kvtop serve: --set needs key=value\n");
                return -1;
            }
            if (a->n_sets >= MAX_SETS) {
                fprintf(stderr, "kvtop serve: more than %d --set\n", MAX_SETS);
                return -1;
            }
            a->sets[a->n_sets++] = v;
        } else if (!strcmp(o, "--model-name")) {
            if (i + 1 >= argc || !argv[i + 1][0]) {
                fprintf(stderr, "kvtop serve: --model-name needs a value\n");
                return -1;
            }
            a->model_name = argv[++i];
        } else if (o[0] == '-') {
            fprintf(stderr, "kvtop serve: unknown option %s\n\n", o);
            usage(stderr);
            return -1;
        } else if (!a->profile) {
            a->profile = o;
        } else {
            fprintf(stderr, "kvtop serve: more than one profile (%s, %s)\n", a->profile, o);
            return -1;
        }
    }
    return 0;
}

/* The model id clients see: --model-name, else the file name without its
 * extension. */
static void model_id(char *out, size_t cap, const char *path, const char *name) {
    if (name) {
        kv_copy_str(out, cap, name);
        return;
    }
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    kv_copy_str(out, cap, b);
    char *dot = strrchr(out, '.');
    if (dot && dot != out && (!strcmp(dot, ".gguf") || !strcmp(dot, ".bin"))) *dot = 0;
}

/* Waits for one of the blocked signals for up to ms; returns it or 0. */
static int wait_signal(const sigset_t *set, int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

/* Waits until the server holds no engine request, up to ms; 1 when idle. */
static int drain(srv *s, int ms) {
    for (int waited = 0; waited <= ms; waited += 50) {
        if (srv_hub_pending(s->hub) == 0) return 1;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return srv_hub_pending(s->hub) == 0;
}

/* The engine is up: its context, the cache's size, the dispatcher; then
 * the server is ready. forward: keep foreign events (a shared engine). */
static int serve_attach(srv *s, kv_engine *e, int forward, kv_err *err) {
    s->e = e;
    const kv_model *m = kv_engine_model(e);
    const kv_config *ec = kv_engine_config(e);
    s->ctx = ec->scheduler.max_seq_len > 0 ? KV_MIN(ec->scheduler.max_seq_len, m->hp.ctx_len) : m->hp.ctx_len;
    kv_snapshot *snap = kv_snapshot_new();
    if (!snap || kv_engine_snapshot(e, snap)) {
        kv_snapshot_free(snap);
        return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    }
    s->cache_tokens = snap->n_blocks * snap->block_size;
    kv_snapshot_free(snap);
    s->n_warnings = kv_engine_warnings(e, s->warnings, KV_MAX_WARNINGS);
    s->hub = srv_hub_new(e, s->cfg.server.max_queue, forward, err);
    if (!s->hub) return err->code ? err->code : KV_ERR_NOMEM;
    atomic_store(&s->state, SRV_READY);
    return 0;
}

static void shutdown_server(srv *s, int sig) {
    fprintf(stderr, "kvtop serve: %s: stopping (no new connections; %d request(s) in flight get %d ms)\n",
            strsignal(sig), s->hub ? srv_hub_pending(s->hub) : 0, s->cfg.server.shutdown_grace_ms);
    atomic_store(&s->state, SRV_STOPPING);
    if (s->hub) srv_hub_close(s->hub);
    srv_http_quiesce(s);
    if (s->hub && !drain(s, s->cfg.server.shutdown_grace_ms)) {
        fprintf(stderr, "kvtop serve: cancelling %d request(s) still running\n", srv_hub_pending(s->hub));
        srv_hub_cancel_all(s->hub);
        drain(s, 5000);
    }
}

int cmd_serve(int argc, char **argv) {
    serve_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc > 0 ? 0 : 2;
    srv *s = calloc(1, sizeof *s);
    if (!s) return 1;
    kv_err err;
    const char *env_key = getenv("KVTOP_API_KEY");
    if (kv_profile_load_with_sets(a.profile, a.sets, a.n_sets, &s->cfg, &err)) {
        fprintf(stderr, "kvtop serve: %s\n", err.msg);
        free(s);
        return 2;
    }
    /* the key: --api-key (already in cfg), else KVTOP_API_KEY, else the profile's */
    int key_on_cmdline = 0;
    for (int i = 0; i < a.n_sets; i++) key_on_cmdline |= !strncmp(a.sets[i], "server.api_key=", 15);
    if (!key_on_cmdline && env_key && *env_key) {
        const kv_config_key *k = kv_config_key_find("server.api_key");
        if (kv_config_key_parse(k, &s->cfg, env_key, &err)) {
            fprintf(stderr, "kvtop serve: KVTOP_API_KEY: %s\n", err.msg);
            free(s);
            return 2;
        }
    }
    kv_copy_str(s->api_key, sizeof s->api_key, s->cfg.server.api_key);
    model_id(s->model_id, sizeof s->model_id, s->cfg.model.path, a.model_name);
    atomic_store(&s->state, SRV_LOADING);

    /* Signals are taken by sigtimedwait below, on this thread only: every
     * thread started from here on inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    int status = 1;
    if (srv_http_start(s, &err)) {
        fprintf(stderr, "kvtop serve: %s\n", err.msg);
        goto out;
    }
    fprintf(stderr, "kvtop serve: listening on http://%s:%d (loading %s)\n", s->cfg.server.host, srv_http_port(s),
            s->cfg.model.path);
    fflush(stderr);
    s->e = kv_engine_new(&s->cfg, &err);
    if (!s->e) {
        kv_copy_str(s->load_error, sizeof s->load_error, err.msg);
        atomic_store(&s->state, SRV_FAILED);
        fprintf(stderr, "kvtop serve: %s\n", err.msg);
        goto out;
    }
    s->owns_engine = 1;
    if (kv_engine_start(s->e)) {
        fprintf(stderr, "kvtop serve: cannot start the engine thread\n");
        goto out;
    }
    if (serve_attach(s, s->e, 0, &err)) {
        fprintf(stderr, "kvtop serve: %s\n", err.msg);
        goto out;
    }
    fprintf(stderr, "kvtop serve: ready: model %s (%d-token context, %d KV tokens)%s\n", s->model_id, s->ctx,
            s->cache_tokens, s->api_key[0] ? ", API key required" : "");
    for (int i = 0; i < s->n_warnings; i++) fprintf(stderr, "kvtop serve: warning: %s\n", s->warnings[i]);
    fflush(stderr);
    int sig = 0;
    while (!(sig = wait_signal(&set, 500))) {
    }
    shutdown_server(s, sig);
    status = 0;
out:
    atomic_store(&s->state, SRV_STOPPING);
    srv_http_stop(s);
    srv_hub_free(s->hub);
    if (s->owns_engine) kv_engine_free(s->e);
    if (status == 0) fprintf(stderr, "kvtop serve: stopped\n");
    free(s);
    return status;
}

/* ---- an engine another front end owns ---- */

struct kv_server {
    srv s;
};

kv_server *kv_server_start(struct kv_engine *e, const struct kv_config *cfg, int port, char *errbuf, size_t cap) {
    kv_err err;
    kv_err_clear(&err);
    kv_server *ks = calloc(1, sizeof *ks);
    if (!ks) {
        if (cap) snprintf(errbuf, cap, "out of memory");
        return NULL;
    }
    srv *s = &ks->s;
    s->cfg = *cfg;
    if (port >= 0) s->cfg.server.port = port;
    const char *env_key = getenv("KVTOP_API_KEY");
    kv_copy_str(s->api_key, sizeof s->api_key, s->cfg.server.api_key[0] ? s->cfg.server.api_key : env_key);
    model_id(s->model_id, sizeof s->model_id, s->cfg.model.path, NULL);
    atomic_store(&s->state, SRV_LOADING);
    if (srv_http_start(s, &err) || serve_attach(s, e, 1, &err)) {
        if (cap) snprintf(errbuf, cap, "%s", err.msg);
        srv_http_stop(s);
        srv_hub_free(s->hub);
        free(ks);
        return NULL;
    }
    return ks;
}

int kv_server_port(const kv_server *ks) { return ks ? srv_http_port(&ks->s) : 0; }

int kv_server_poll(kv_server *ks, struct kv_event *out, int cap) {
    if (!ks || !ks->s.hub || !out || cap <= 0) return 0;
    return srv_hub_poll_foreign(ks->s.hub, out, cap);
}

void kv_server_stop(kv_server *ks) {
    if (!ks) return;
    srv *s = &ks->s;
    atomic_store(&s->state, SRV_STOPPING);
    srv_hub_close(s->hub);
    srv_http_quiesce(s);
    srv_hub_cancel_all(s->hub);
    drain(s, 5000);
    srv_http_stop(s);
    srv_hub_free(s->hub);
    free(ks);
}

const kv_server_ops kv_server_api = {kv_server_start, kv_server_port, kv_server_poll, kv_server_stop};
