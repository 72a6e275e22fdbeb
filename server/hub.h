/* hub.h - between the engine and the server's many connections: one
 * dispatcher thread polls the engine's events and routes each to the job
 * (one HTTP request, n engine requests) it belongs to, waking that job's
 * handler through its condition variable; admission control (the queue
 * bound behind 429); and the Prometheus counters and histograms the
 * requests leave behind. No HTTP here.
 *
 * A job's text buffers grow with its reply only (bounded by max_tokens),
 * so a slow reader never blocks the dispatcher or the engine. */
#ifndef KV_SRV_HUB_H
#define KV_SRV_HUB_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "request.h"

/* One generated token's log-probabilities (a request with logprobs on). */
typedef struct srv_logprob {
    int32_t token;
    float logprob;         /* raw model distribution (kv_event.logprob) */
    size_t text_end;       /* the choice's text length once this token's event was in: a stream
                              sends the entry with the chunk whose text reaches that far */
    int n_top;
    int32_t top_token[KV_MAX_TOP_LOGPROBS];
    float top_logprob[KV_MAX_TOP_LOGPROBS];
} srv_logprob;

/* One engine request of a job (a choice of the reply). Fields below the
 * line are written by the dispatcher under job->mu. */
typedef struct srv_choice {
    int64_t id;            /* engine request id (> 0 once submitted) */
    int n_prompt;          /* prompt tokens */
    int ignore_eos;        /* bool: an end-of-generation token is part of the reply (set at submit) */
    /* ---- */
    char *text;            /* (len) reply text so far, owned, NUL-terminated */
    size_t len, cap;
    size_t *marks;         /* (n_marks) where each event's text ends in text: a stream sends one chunk
                              per token, as the engine made them */
    int n_marks, cap_marks;
    int n_tokens;          /* tokens generated */
    int done;              /* bool: its DONE event arrived (and the fields below are final) */
    kv_finish finish;
    char reason[128];      /* the engine's reason (rejections, errors) */
    int cached_tokens;     /* prompt tokens served from the prefix cache */
    double t_arrival_ms, t_first_ms, t_last_ms; /* engine clock; t_first_ms < 0 until the first token */
    srv_logprob *lps;      /* (n_lps) per token of the reply, when the request asked; the
                              end-of-generation token that ends it is left out, as from the text */
    int n_lps, cap_lps;
} srv_choice;

typedef struct srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* signalled on every event of the job */
    int n_choices;
    srv_choice *choices;   /* (n_choices) */
    int n_done;            /* choices done (also read under the hub's lock) */
    uint64_t version;      /* bumped with every event: lets a waiter see change */
    /* private: lifetime (under the hub's lock) */
    int refs;              /* the handler's and, while choices are pending, the hub's */
    int cancelled;         /* bool: its pending requests were cancelled (client gone, or released early) */
} srv_job;

/* Latency histogram with fixed bucket bounds (seconds or counts). */
#define SRV_HIST_MAX 32
typedef struct srv_hist {
    const double *bounds;  /* (n_bounds) upper bounds, increasing; +Inf implied */
    int n_bounds;
    uint64_t counts[SRV_HIST_MAX]; /* per bucket (not cumulative); [n_bounds] is +Inf */
    double sum;
    uint64_t count;
} srv_hist;

enum { SRV_FIN_STOP = 0, SRV_FIN_LENGTH, SRV_FIN_ABORT, SRV_FIN_ERROR, SRV_FIN_COUNT };

/* Everything the server's own requests have done (monotonic counters). */
typedef struct srv_stats {
    uint64_t prompt_tokens, generation_tokens;
    uint64_t finished[SRV_FIN_COUNT];   /* by reason: stop, length, abort, error */
    uint64_t rejected;                  /* the engine refused (400) */
    uint64_t queue_full;                /* refused with 429 */
    uint64_t disconnects;               /* requests cancelled because their client went away */
    uint64_t prefix_queries, prefix_hits; /* prompt tokens looked up / found in the prefix cache */
    uint64_t preemptions;
    uint64_t http[6];                   /* responses by status class: [2] = 2xx ... [5] = 5xx */
    srv_hist ttft, itl, tpot, e2e, queue, prompt_len, gen_len;
} srv_stats;

typedef struct srv_hub srv_hub;

/* max_queue: requests that may wait in the engine beyond its free batch
 * slots (server.max_queue; kv_engine_queue_lengths, whoever submitted them:
 * the TUI's tabs count too). forward: keep the events of
 * requests that are not the server's (another front end's, on a shared
 * engine) for srv_hub_poll_foreign; otherwise they are dropped. The engine
 * must outlive the hub, and nothing else may call kv_engine_poll on it:
 * the dispatcher is its one reader. Starts the dispatcher. NULL with err
 * on failure. */
srv_hub *srv_hub_new(kv_engine *e, int max_queue, int forward, kv_err *err);
/* Takes up to cap of the kept foreign events (oldest first); never blocks. */
int srv_hub_poll_foreign(srv_hub *h, kv_event *out /* OUT: (cap) */, int cap);
/* Stops the dispatcher and frees the hub; jobs must have been released. */
void srv_hub_free(srv_hub *h);

/* A job of n choices, owned by the caller until srv_hub_release. */
srv_job *srv_job_new(int n);

/* Submits choice i of job with params[i] (prompt tokens given) for every
 * i, all or none admitted: 429 (e) when, with the job's choices, more than
 * max_queue requests would still wait once the engine's free batch slots
 * (scheduler.max_seqs minus those running) are filled; 503 while shutting
 * down, 400 with the engine's
 * reason when it rejects one (those already queued are cancelled).
 * Returns 0 or -1 with e filled. Events may arrive before it returns. */
int srv_hub_submit(srv_hub *h, srv_job *job, const kv_request_params *params, srv_error *e /* OUT: */);
/* The handler is done with job: choices not finished are cancelled (a
 * client that went away: counted as a disconnect when disconnected) and
 * the job is freed once their DONE events have come. */
void srv_hub_release(srv_hub *h, srv_job *job, int disconnected);

/* The job's client has gone (seen by the connection watcher): its pending
 * requests are cancelled now and one disconnect is counted; the handler
 * still releases the job. */
void srv_hub_cancel_job(srv_hub *h, srv_job *job);

/* Waits until job->version differs from *seen or timeout_ms passes;
 * updates *seen. Call without job->mu held. Returns 1 on change. */
int srv_job_wait(srv_job *job, uint64_t *seen /* IN/OUT */, int timeout_ms);

/* Refuses new submissions from now on (503 "shutting down"). */
void srv_hub_close(srv_hub *h);
/* Cancels every pending engine request of the server's jobs. */
void srv_hub_cancel_all(srv_hub *h);
/* Engine requests submitted and not yet done. */
int srv_hub_pending(srv_hub *h);

/* Counts one HTTP response of status (100..599). */
void srv_hub_count_http(srv_hub *h, int status);
/* Copies the counters and histograms (OUT). */
void srv_hub_stats(srv_hub *h, srv_stats *out /* OUT: */);
/* The finish reason's OpenAI name: "stop", "length", or NULL for
 * cancellations, rejections and errors (which are error replies). */
const char *srv_finish_name(kv_finish f);

#endif
