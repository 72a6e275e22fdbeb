/* srv.h - the server's shared state and the pieces between the HTTP layer
 * (http.c, the only file that sees libmicrohttpd) and the endpoint logic
 * (openai.c, kvtop_api.c). Private to server/. */
#ifndef KV_SRV_H
#define KV_SRV_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <stdio.h>

#include "../engine/engine.h"
#include "../engine/json.h"
#include "hub.h"
#include "request.h"

/* The session tag of the server's engine requests (the block map's owner):
 * above the TUI's tabs and its load sessions, so on a shared engine they
 * are told apart. */
#define SRV_SESSION 2000

typedef enum srv_state { SRV_LOADING = 0, SRV_READY = 1, SRV_STOPPING = 2, SRV_FAILED = 3 } srv_state;

struct srv_http; /* http.c */

typedef struct srv {
    kv_config cfg;             /* the profile with --set and the command line applied */
    char api_key[128];         /* "" = none */
    char model_id[256];        /* the served model name (/v1/models) */
    char load_error[512];      /* SRV_FAILED: why the model did not load */
    _Atomic int state;         /* srv_state */
    kv_engine *e;              /* valid once state is READY (and until the server is freed) */
    int owns_engine;           /* bool: kvtop serve made it (the TUI lends its own) */
    srv_hub *hub;              /* valid once READY */
    int ctx;                   /* the engine's context length in tokens */
    int cache_tokens;          /* tokens the KV cache holds */
    _Atomic uint64_t serial;   /* ids of responses */
    int shutdown_grace_ms;     /* in-flight requests get this long to finish on shutdown */
    char warnings[KV_MAX_WARNINGS][KV_WARNING_LEN]; /* the engine's load warnings (kv_engine_warnings),
                                  read once it is READY */
    int n_warnings;
    struct srv_http *http;
} srv;

/* A growable byte buffer. */
typedef struct srv_buf {
    char *p;
    size_t n, cap;
} srv_buf;
/* Appends n bytes; returns 0 or KV_ERR_NOMEM (buffer unchanged). */
int srv_buf_add(srv_buf *b, const void *s, size_t n);
int srv_buf_addf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(srv_buf *b);

/* A reply the HTTP layer sends: status, content type and a body (owned,
 * malloc'd); or a stream of Server-Sent Events (stream set, status 200);
 * or a reply that comes later (pending set: a non-streaming generation). */
typedef struct srv_stream srv_stream;
typedef struct srv_reply srv_reply;
/* A stream or pending reply: a small table of functions (openai.c's
 * generations, kvtop_api.c's snapshot stream) behind the calls below. */
struct srv_stream {
    int (*next)(srv_stream *st, srv_buf *out, int wait_ms);
    int (*wait)(srv_stream *st, srv_reply *r, int wait_ms);
    void (*destroy)(srv_stream *st, int client_gone);
    /* the client has gone: cancel the work now, from another thread
     * (destroy still follows); NULL when there is nothing to cancel */
    void (*cancel)(srv_stream *st);
};
struct srv_reply {
    int status;
    const char *content_type;  /* static string */
    char *body;
    size_t len;
    srv_stream *stream;        /* SSE: bytes from srv_stream_next */
    srv_stream *pending;       /* srv_stream_wait fills status and body when done */
    int retry_after;           /* seconds for a Retry-After header; 0 = none */
};

/* A JSON document written to memory with the engine's writer. */
typedef struct srv_json {
    FILE *f;
    char *buf;
    size_t len;
    kv_json_writer w;
} srv_json;
/* Opens j (0, or KV_ERR_NOMEM). */
int srv_json_open(srv_json *j /* OUT: */);
/* Closes j; returns the text (malloc'd, *len bytes; the caller frees) or
 * NULL when the writer failed. */
char *srv_json_close(srv_json *j, size_t *len /* OUT: */);

/* 1 when a request's "model" names the served one: "" (the one model), the
 * served id, the file's general.name or the profile's path. */
int srv_model_ok(const srv *s, const char *name);

/* Fills r with the OpenAI-shaped JSON of e (status e->status). */
void srv_reply_error(srv_reply *r /* OUT: */, const srv_error *e);
/* Fills r with a JSON body (takes ownership of body). */
void srv_reply_json(srv_reply *r /* OUT: */, int status, char *body, size_t len);

/* A stream's next bytes, waiting up to wait_ms for them: > 0 bytes were
 * appended to out, 0 nothing yet, -1 the stream has ended (out may have
 * gained its last bytes first). */
int srv_stream_next(srv_stream *st, srv_buf *out /* OUT: appended to */, int wait_ms);
/* A pending reply: waits up to wait_ms; returns 1 with r's status, type
 * and body filled when it is ready, 0 not yet. */
int srv_stream_wait(srv_stream *st, srv_reply *r /* OUT: */, int wait_ms);
/* client_gone: the client disconnected (its requests are cancelled and
 * counted). NULL is a no-op. */
void srv_stream_free(srv_stream *st, int client_gone);

/* Writes a choice's "logprobs" value for the entries lp[0..n) (logprobs_json.c):
 * for SRV_CHAT {"content": [{token, logprob, bytes, top_logprobs}]}, for
 * completions {tokens, token_logprobs, top_logprobs, text_offset}. *offset:
 * completions' text offset (characters of the reply before lp[0]),
 * advanced past the entries; unused for chat. as_ids: tokens are named
 * "token_id:N" (vLLM's return_tokens_as_token_ids). Returns 0 or KV_ERR_NOMEM
 * (nothing written). */
int srv_write_logprobs(kv_json_writer *w, const kv_tokenizer *tok, srv_kind kind, int as_ids, const srv_logprob *lp,
                       int n, size_t *offset /* IN/OUT */);

/* ---- the endpoints (openai.c, kvtop_api.c). body/len: the request body. ---- */

void srv_handle_gen(srv *s, srv_kind kind, const char *body, size_t len, srv_reply *r);
void srv_handle_models(srv *s, srv_reply *r);
void srv_handle_tokenize(srv *s, const char *body, size_t len, srv_reply *r);
void srv_handle_detokenize(srv *s, const char *body, size_t len, srv_reply *r);
void srv_handle_health(srv *s, srv_reply *r);
void srv_handle_metrics(srv *s, srv_reply *r);
/* check: also run kv_engine_check and report it ("check": {"ok", "message"}). */
void srv_handle_snapshot(srv *s, int check, srv_reply *r);
/* query: the interval_ms and max_frames arguments (-1 when absent). */
void srv_handle_stream(srv *s, int interval_ms, int max_frames, srv_reply *r);
void srv_handle_control(srv *s, const char *body, size_t len, srv_reply *r);

#endif
