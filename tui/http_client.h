/* http_client.h - the few HTTP calls `kvtop attach` makes, on libcurl: a
 * bounded GET or POST, and a Server-Sent-Events stream delivered one event
 * at a time. Every call has a connect timeout and either a total timeout
 * (plain requests) or an idle timeout (streams), a cap on what it reads,
 * follows no redirects, speaks only http and https, and sends the API key
 * (as "Authorization: Bearer KEY") only on the URL it is called with, so a
 * key never travels to another host. Blocking: call from a source's own
 * thread, never the UI thread. */
#ifndef KV_TUI_HTTP_CLIENT_H
#define KV_TUI_HTTP_CLIENT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"

/* Once per process, before any thread makes a call (curl_global_init). */
int kv_http_global_init(void);
void kv_http_global_cleanup(void);

typedef struct kv_http_opts {
    const char *api_key;     /* borrowed; NULL or "": no Authorization header */
    int connect_timeout_ms;  /* default 2000 */
    int timeout_ms;          /* whole request (plain calls), default 5000 */
    int idle_timeout_ms;     /* streams: longest silence before giving up, default 5000 */
    size_t max_bytes;        /* plain calls: largest body read; streams: largest event. Default 16 MiB */
    atomic_int *stop;        /* borrowed, may be NULL: when it becomes non-zero the call ends (KV_AGAIN) */
} kv_http_opts;

/* Defaults as documented above, api_key NULL, stop NULL. */
kv_http_opts kv_http_default_opts(void);

typedef struct kv_http_resp {
    long status;             /* HTTP status, 0 when none came */
    char *body;              /* NUL-terminated, owned (kv_http_resp_free); NULL when none */
    size_t len;
    char content_type[96];
} kv_http_resp;

void kv_http_resp_free(kv_http_resp *r); /* frees body; the struct may be reused */

/* GET url (body NULL) or POST body[0..body_len) as application/json.
 * Returns 0 once a response came (any status: look at r->status), or
 * KV_ERR_IO with err naming the URL and what went wrong (refused, timed
 * out, too large, ...), or KV_AGAIN when *opts->stop ended it. */
int kv_http_request(const char *url, const char *body, size_t body_len, const kv_http_opts *opts,
                    kv_http_resp *r /* OUT: */, kv_err *err);

/* One event of a stream: the "data:" lines joined with '\n' (NUL-terminated
 * for convenience). Return 0 to go on, non-zero to end the stream. */
typedef int (*kv_sse_fn)(void *user, const char *data, size_t len);

/* GET url (body NULL) or POST body as JSON, and hands each event of the
 * text/event-stream answer to fn. Returns 0 when the server ended the stream
 * or fn asked to stop, KV_AGAIN when *opts->stop did, KV_ERR_IO (err says:
 * refused, idle past the timeout, an event over max_bytes, a status other
 * than 200 with the start of the body) otherwise. *status (may be NULL) gets
 * the HTTP status. */
int kv_http_sse(const char *url, const char *body, size_t body_len, const kv_http_opts *opts, kv_sse_fn fn,
                void *user, long *status /* OUT: may be NULL */, kv_err *err);

/* The SSE parser the stream uses, on its own (tests, fuzzing): feed bytes
 * as they come; events go to fn. */
typedef struct kv_sse_parser {
    char *line;              /* the line being read (owned) */
    size_t line_len, line_cap;
    char *data;              /* the event being gathered (owned) */
    size_t data_len, data_cap;
    size_t max_bytes;        /* larger lines or events are an error */
    int have_data;           /* bool: a data: line came since the last event */
    int too_big;             /* bool: sticky, the stream went over max_bytes */
    uint64_t events;         /* handed to fn */
} kv_sse_parser;

void kv_sse_init(kv_sse_parser *p, size_t max_bytes);
void kv_sse_free(kv_sse_parser *p);
/* 0 to go on, 1 when fn asked to stop, KV_ERR_FORMAT when a line or event
 * is over max_bytes, KV_ERR_NOMEM. */
int kv_sse_feed(kv_sse_parser *p, const char *buf, size_t n, kv_sse_fn fn, void *user);

/* Joins base (no trailing '/' needed) and path (starting with '/') into
 * out. 0, or KV_ERR_RANGE when it does not fit. */
int kv_http_join(char *out /* OUT: (cap) */, size_t cap, const char *base, const char *path);

#endif
