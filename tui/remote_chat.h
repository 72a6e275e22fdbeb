/* remote_chat.h - one chat reply from a remote server: POST
 * /v1/chat/completions with "stream": true on its own thread, the text
 * deltas gathered for the UI thread to take, and the times measured here
 * (time to the first delta, the gap before every later one), so a tab's
 * TTFT and TPOT work on any OpenAI-compatible server. No curses here. */
#ifndef KV_TUI_REMOTE_CHAT_H
#define KV_TUI_REMOTE_CHAT_H

#include <stddef.h>

#include "../base/common.h"
#include "source.h"

typedef struct kv_remote_chat kv_remote_chat;

typedef struct kv_remote_chat_params {
    const char *const *roles;  /* (n) "system", "user", "assistant"; borrowed, copied */
    const char *const *texts;  /* (n) */
    int n;
    int max_tokens;            /* > 0 */
    double temperature;        /* < 0: the server's default */
} kv_remote_chat_params;

/* What the UI takes per poll. */
typedef struct kv_remote_chat_news {
    int done;                  /* bool: the reply ended (then finish/error say how) */
    char finish[24];           /* finish_reason: "stop", "length", ...; "" unknown */
    char error[256];           /* "" none: an HTTP error, a cut stream, a bad chunk */
    int n_gaps;                /* gaps[] entries new since the last poll */
    double gaps_ms[64];        /* inter-delta times, ms (TPOT per token) */
    double ttft_ms;            /* < 0 until the first delta */
    int n_deltas;              /* deltas so far */
    int cache_n;               /* llama-server's timings.cache_n (prompt tokens reused), -1 unknown */
    int prompt_n;              /* its timings.prompt_n, -1 unknown */
} kv_remote_chat_news;

/* Starts the request against src (its URL, key and model). NULL with err. */
kv_remote_chat *kv_remote_chat_start(kv_source *src, const kv_remote_chat_params *p, kv_err *err);
/* Moves new text (at most cap bytes; the rest waits) into buf and returns
 * its length; news gets the state. */
size_t kv_remote_chat_poll(kv_remote_chat *c, char *buf /* OUT: (cap) */, size_t cap,
                           kv_remote_chat_news *news /* OUT: */);
/* Asks the request to end without waiting: its stream closes within about
 * a second and a later poll reports done (with no error). */
void kv_remote_chat_cancel(kv_remote_chat *c);
/* Ends the request (closing the connection cancels it server-side), joins
 * the thread and frees. NULL is a no-op. */
void kv_remote_chat_free(kv_remote_chat *c);

/* The request body for p and model (malloc'd JSON), or NULL. For tests. */
char *kv_remote_chat_body(const kv_remote_chat_params *p, const char *model, size_t *len /* OUT: */);
/* Applies one SSE event of a chat stream to news/text (for tests and
 * fuzzing): returns 1 at "[DONE]", 0 to go on, KV_ERR_FORMAT for a chunk
 * that is not a chat.completion.chunk (news->error says why). Text goes
 * through append(user, text, len). */
int kv_remote_chat_event(const char *data, size_t len, kv_remote_chat_news *news,
                         void (*append)(void *user, const char *text, size_t len), void *user);

#endif
