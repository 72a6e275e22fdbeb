/* hub.c - the dispatcher thread, the id -> job registry, admission control
 * and the request statistics behind /metrics.
 *
 * Locks: the hub's mu guards the registry, the counters and every job's
 * refs/n_done; a job's mu guards its choices' text and fields. Order: hub
 * before job; the engine's own locks are taken under the hub's (submit,
 * snapshot) but the engine never calls back, so there is no cycle. */
#include "hub.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/vec.h"
#include "../engine/tokenizer.h"

#define EVENT_BATCH 256

/* Bucket bounds: vLLM's, with finer steps at the short end where a small
 * local model lives. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                                    0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,
                                    5.0,  10.0,  15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0};
static const double len_bounds[] = {1,    2,    5,    10,    20,    50,    100,    200,    500,
                                    1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000};

typedef struct entry {
    int64_t id;
    srv_job *job;
    int idx;
} entry;

typedef struct fin_item {
    srv_job *job;
    int idx;
    double t_ms;     /* the DONE event's time */
    double queue_ms; /* the DONE event's figures (kv_event) */
    double e2e_ms;
    int n_prefix_hit, preemptions;
} fin_item;

struct srv_hub {
    kv_engine *e;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    int stop;           /* the dispatcher should return */
    int closed;         /* no submissions (shutting down) */
    entry *ent;         /* (n_ent) registered engine requests, sorted by id */
    int n_ent, cap_ent;
    int max_queue;      /* requests waiting beyond the free batch slots at most (server.max_queue) */
    int max_seqs;       /* the engine's batch slots (scheduler.max_seqs) */
    srv_stats st;
    kv_event *ev;       /* (EVENT_BATCH) dispatcher scratch */
    fin_item *fin;      /* (EVENT_BATCH) */
    int forward;        /* bool: keep foreign events */
    kv_event *foreign;  /* (n_foreign) events of requests not the server's, oldest first */
    int n_foreign, cap_foreign;
};

static void hist_init(srv_hist *h, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = b;
    h->n_bounds = n < SRV_HIST_MAX - 1 ? n : SRV_HIST_MAX - 1;
}

static void hist_observe(srv_hist *h, double v) {
    if (!(v >= 0)) v = 0; /* NaN or a clock step back: count it as 0 */
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

const char *srv_finish_name(kv_finish f) {
    switch (f) {
    case KV_FINISH_EOS:
    case KV_FINISH_STOP: return "stop";
    case KV_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

static int fin_bucket(kv_finish f) {
    switch (f) {
    case KV_FINISH_EOS:
    case KV_FINISH_STOP: return SRV_FIN_STOP;
    case KV_FINISH_LENGTH: return SRV_FIN_LENGTH;
    case KV_FINISH_CANCELLED: return SRV_FIN_ABORT;
    default: return SRV_FIN_ERROR;
    }
}

/* ---- jobs ---- */

srv_job *srv_job_new(int n) {
    if (n < 1) return NULL;
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->choices = calloc((size_t)n, sizeof *j->choices);
    if (!j->choices) {
        free(j);
        return NULL;
    }
    j->n_choices = n;
    for (int i = 0; i < n; i++) j->choices[i].t_first_ms = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    return j;
}

static void job_free(srv_job *j) {
    if (!j) return;
    for (int i = 0; i < j->n_choices; i++) {
        free(j->choices[i].text);
        free(j->choices[i].marks);
        free(j->choices[i].lps);
    }
    free(j->choices);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

int srv_job_wait(srv_job *job, uint64_t *seen, int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&job->mu);
    while (job->version == *seen)
        if (pthread_cond_timedwait(&job->cv, &job->mu, &ts) == ETIMEDOUT) break;
    int changed = job->version != *seen;
    *seen = job->version;
    pthread_mutex_unlock(&job->mu);
    return changed;
}

/* Appends text to a choice (job->mu held). Out of memory drops the text,
 * which the reply then lacks; the request itself goes on. */
static void choice_append(srv_choice *c, const char *s, size_t n) {
    if (n == 0) return;
    if (kv_grow((void **)&c->marks, &c->cap_marks, c->n_marks + 1, sizeof *c->marks)) return;
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 256;
        while (cap < c->len + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return;
        c->text = t;
        c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = 0;
    c->marks[c->n_marks++] = c->len;
}

/* Records a token event's log-probabilities (job->mu held), except for an
 * end-of-generation token that ends the reply. Out of memory drops the
 * entry, as choice_append drops text. */
static void choice_logprob(const srv_hub *h, srv_choice *c, const kv_event *ev) {
    if (!c->ignore_eos && kv_tokenizer_is_eog(kv_engine_model(h->e)->tok, ev->token)) return;
    if (kv_grow((void **)&c->lps, &c->cap_lps, c->n_lps + 1, sizeof *c->lps)) return;
    srv_logprob *l = &c->lps[c->n_lps++];
    l->token = ev->token;
    l->logprob = ev->logprob;
    l->text_end = c->len;
    l->n_top = KV_MAX(0, KV_MIN(ev->n_top, KV_MAX_TOP_LOGPROBS));
    memcpy(l->top_token, ev->top_token, (size_t)l->n_top * sizeof *l->top_token);
    memcpy(l->top_logprob, ev->top_logprob, (size_t)l->n_top * sizeof *l->top_logprob);
}

/* ---- the registry (hub->mu held) ---- */

static int find_entry(const srv_hub *h, int64_t id) {
    int lo = 0, hi = h->n_ent - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (h->ent[mid].id == id) return mid;
        if (h->ent[mid].id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static void remove_entry(srv_hub *h, int i) {
    memmove(h->ent + i, h->ent + i + 1, (size_t)(h->n_ent - i - 1) * sizeof *h->ent);
    h->n_ent--;
}

/* ---- the dispatcher ---- */

/* One event into its job (hub->mu held). DONE events are queued in
 * h->fin for finalize(). */
static void route(srv_hub *h, const kv_event *ev, int *n_fin) {
    int i = find_entry(h, ev->req);
    if (i < 0) { /* not ours: a TUI tab's, or a rejection */
        /* NOTE: out of memory drops the event; its owner then misses it */
        if (h->forward && kv_grow((void **)&h->foreign, &h->cap_foreign, h->n_foreign + 1, sizeof *h->foreign) == 0)
            h->foreign[h->n_foreign++] = *ev;
        return;
    }
    srv_job *job = h->ent[i].job;
    srv_choice *c = &job->choices[h->ent[i].idx];
    pthread_mutex_lock(&job->mu);
    if (ev->type == KV_EVENT_TOKEN && ev->token >= 0) {
        c->n_tokens++;
        h->st.generation_tokens++;
        if (c->t_first_ms < 0) {
            c->t_first_ms = ev->t_ms;
            h->st.prompt_tokens += (uint64_t)c->n_prompt;
            hist_observe(&h->st.ttft, (ev->t_ms - c->t_arrival_ms) / 1e3);
        } else {
            hist_observe(&h->st.itl, (ev->t_ms - c->t_last_ms) / 1e3);
        }
        c->t_last_ms = ev->t_ms;
    }
    choice_append(c, ev->text, (size_t)(ev->text_len > 0 ? ev->text_len : 0));
    if (ev->type == KV_EVENT_TOKEN && ev->has_logprob) choice_logprob(h, c, ev);
    if (ev->type == KV_EVENT_DONE) {
        c->finish = ev->finish;
        kv_copy_str(c->reason, sizeof c->reason, ev->reason);
        h->fin[(*n_fin)++] = (fin_item){job, h->ent[i].idx, ev->t_ms, ev->queue_ms, ev->e2e_ms, ev->n_prefix_hit,
                                        ev->preemptions};
    }
    job->version++;
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
}

/* Marks the batch's finished choices done, with the figures their DONE
 * events carried (hub->mu held). Returns jobs to free in *dead. */
static int finalize(srv_hub *h, int n_fin, srv_job **dead) {
    int n_dead = 0;
    for (int k = 0; k < n_fin; k++) {
        const fin_item *fi = &h->fin[k];
        srv_job *job = fi->job;
        srv_choice *c = &job->choices[fi->idx];
        srv_stats *st = &h->st;
        st->finished[fin_bucket(c->finish)]++;
        st->prefix_queries += (uint64_t)c->n_prompt;
        /* the request's own figures come with its DONE event: a snapshot
         * taken now may predate its admission (a step was running) */
        double e2e = fi->e2e_ms >= 0 ? fi->e2e_ms / 1e3 : (fi->t_ms - c->t_arrival_ms) / 1e3;
        st->prefix_hits += (uint64_t)KV_MAX(fi->n_prefix_hit, 0);
        st->preemptions += (uint64_t)KV_MAX(fi->preemptions, 0);
        if (fi->queue_ms >= 0 && c->t_first_ms >= 0) hist_observe(&st->queue, fi->queue_ms / 1e3);
        hist_observe(&st->e2e, e2e);
        hist_observe(&st->prompt_len, c->n_prompt);
        hist_observe(&st->gen_len, c->n_tokens);
        if (c->n_tokens > 1) hist_observe(&st->tpot, (c->t_last_ms - c->t_first_ms) / 1e3 / (c->n_tokens - 1));
        pthread_mutex_lock(&job->mu);
        c->cached_tokens = KV_MAX(fi->n_prefix_hit, 0);
        c->done = 1;
        job->n_done++;
        job->version++;
        pthread_cond_broadcast(&job->cv);
        pthread_mutex_unlock(&job->mu);
        int i = find_entry(h, c->id);
        if (i >= 0) remove_entry(h, i);
        int registered = 0;
        for (int j = 0; j < job->n_choices; j++) registered += job->choices[j].id > 0;
        if (job->n_done == registered && --job->refs == 0) dead[n_dead++] = job;
    }
    return n_dead;
}

static void *dispatch_main(void *arg) {
    srv_hub *h = arg;
    srv_job *dead[EVENT_BATCH];
    for (;;) {
        pthread_mutex_lock(&h->mu);
        int stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (stop) break;
        kv_engine_wait(h->e, 50);
        int n = kv_engine_poll(h->e, h->ev, EVENT_BATCH);
        if (n <= 0) continue;
        int n_fin = 0, n_dead = 0;
        pthread_mutex_lock(&h->mu);
        for (int i = 0; i < n; i++) route(h, &h->ev[i], &n_fin);
        if (n_fin > 0) n_dead = finalize(h, n_fin, dead);
        pthread_mutex_unlock(&h->mu);
        for (int i = 0; i < n_dead; i++) job_free(dead[i]);
    }
    return NULL;
}

srv_hub *srv_hub_new(kv_engine *e, int max_queue, int forward, kv_err *err) {
    srv_hub *h = calloc(1, sizeof *h);
    if (!h) goto nomem;
    h->e = e;
    h->max_queue = max_queue;
    h->max_seqs = kv_config_max_seqs(kv_engine_config(e));
    h->forward = forward;
    pthread_mutex_init(&h->mu, NULL);
    hist_init(&h->st.ttft, ttft_bounds, (int)KV_ARRAY_LEN(ttft_bounds));
    hist_init(&h->st.itl, itl_bounds, (int)KV_ARRAY_LEN(itl_bounds));
    hist_init(&h->st.tpot, itl_bounds, (int)KV_ARRAY_LEN(itl_bounds));
    hist_init(&h->st.e2e, e2e_bounds, (int)KV_ARRAY_LEN(e2e_bounds));
    hist_init(&h->st.queue, e2e_bounds, (int)KV_ARRAY_LEN(e2e_bounds));
    hist_init(&h->st.prompt_len, len_bounds, (int)KV_ARRAY_LEN(len_bounds));
    hist_init(&h->st.gen_len, len_bounds, (int)KV_ARRAY_LEN(len_bounds));
    h->ev = malloc(EVENT_BATCH * sizeof *h->ev);
    h->fin = malloc(EVENT_BATCH * sizeof *h->fin);
    if (!h->ev || !h->fin) goto nomem;
    if (pthread_create(&h->thread, NULL, dispatch_main, h)) {
        kv_err_set(err, KV_ERR_NOMEM, "cannot start the dispatcher thread");
        srv_hub_free(h);
        return NULL;
    }
    h->started = 1;
    return h;
nomem:
    kv_err_set(err, KV_ERR_NOMEM, "out of memory for the server's dispatcher");
    srv_hub_free(h);
    return NULL;
}

void srv_hub_free(srv_hub *h) {
    if (!h) return;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
    }
    /* jobs still registered (their DONE never came: the engine was stopped
     * first) are the hub's to free once their handler let go */
    for (int i = 0; i < h->n_ent; i++) {
        srv_job *j = h->ent[i].job;
        int last = 1;
        for (int k = i + 1; k < h->n_ent; k++) last &= h->ent[k].job != j;
        if (last && --j->refs == 0) job_free(j);
    }
    free(h->ent);
    free(h->foreign);
    free(h->ev);
    free(h->fin);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* ---- submitting and releasing ---- */

int srv_hub_submit(srv_hub *h, srv_job *job, const kv_request_params *params, srv_error *e) {
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    if (h->closed) {
        rc = srv_fail(e, 503, "service_unavailable", NULL, "shutting_down", "the server is shutting down");
        goto out;
    }
    /* the engine's queue, whoever filled it: what the free batch slots do
     * not take at the next step waits (a burst into an idle engine does
     * not); h->mu keeps the server's own submissions from passing the
     * check together */
    int waiting, running;
    kv_engine_queue_lengths(h->e, &waiting, &running);
    int free_slots = KV_MAX(0, h->max_seqs - running);
    int would_wait = KV_MAX(0, waiting + job->n_choices - free_slots);
    if (would_wait > h->max_queue) {
        h->st.queue_full++;
        rc = srv_fail(e, 429, "rate_limit_error", NULL, "queue_full",
                      "the engine's queue is full (%d requests waiting, %d running of %d; %d more would leave %d "
                      "waiting, past server.max_queue %d); try again later",
                      waiting, running, h->max_seqs, job->n_choices, would_wait, h->max_queue);
        goto out;
    }
    if (kv_grow((void **)&h->ent, &h->cap_ent, h->n_ent + job->n_choices, sizeof *h->ent)) {
        rc = srv_fail(e, 500, "internal_error", NULL, "out_of_memory", "the server is out of memory");
        goto out;
    }
    int registered = 0;
    for (int i = 0; i < job->n_choices; i++) {
        kv_err err;
        double t = kv_engine_now_ms(h->e); /* before: its first token may come before submit returns */
        int64_t id = kv_engine_submit(h->e, &params[i], &err);
        if (id < 0) {
            h->st.rejected++;
            int ctx = strstr(err.msg, "context") || strstr(err.msg, "blocks");
            rc = srv_fail(e, 400, "invalid_request_error", strstr(err.msg, "max_tokens") ? "max_tokens" : NULL,
                          ctx ? "context_length_exceeded" : "invalid_value", "%s", err.msg);
            for (int k = 0; k < i; k++) kv_engine_cancel(h->e, job->choices[k].id);
            break;
        }
        srv_choice *c = &job->choices[i];
        c->id = id;
        c->n_prompt = params[i].n_tokens;
        c->ignore_eos = params[i].ignore_eos;
        c->t_arrival_ms = t;
        /* ids increase, so appending keeps the registry sorted */
        h->ent[h->n_ent++] = (entry){id, job, i};
        registered++;
    }
    if (registered) job->refs++;
out:
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Ids of job's requests not finished (hub->mu held). */
static int pending_ids(srv_hub *h, const srv_job *job, int64_t *ids) {
    int n = 0;
    for (int i = 0; i < job->n_choices && n < SRV_MAX_CHOICES; i++) {
        const srv_choice *c = &job->choices[i];
        if (c->id > 0 && !c->done && find_entry(h, c->id) >= 0) ids[n++] = c->id;
    }
    return n;
}

void srv_hub_cancel_job(srv_hub *h, srv_job *job) {
    int64_t ids[SRV_MAX_CHOICES];
    pthread_mutex_lock(&h->mu);
    int n = job->cancelled ? 0 : pending_ids(h, job, ids);
    if (n > 0) {
        job->cancelled = 1;
        h->st.disconnects++;
    }
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < n; i++) kv_engine_cancel(h->e, ids[i]);
}

void srv_hub_release(srv_hub *h, srv_job *job, int disconnected) {
    if (!job) return;
    int64_t stack_ids[SRV_MAX_CHOICES];
    pthread_mutex_lock(&h->mu);
    int n_ids = pending_ids(h, job, stack_ids);
    if (n_ids > 0 || job->cancelled) {
        if (disconnected && !job->cancelled) h->st.disconnects++;
        job->cancelled = 1;
    }
    int free_now = --job->refs == 0;
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < n_ids; i++) kv_engine_cancel(h->e, stack_ids[i]);
    if (free_now) job_free(job);
}

void srv_hub_close(srv_hub *h) {
    pthread_mutex_lock(&h->mu);
    h->closed = 1;
    pthread_mutex_unlock(&h->mu);
}

void srv_hub_cancel_all(srv_hub *h) {
    pthread_mutex_lock(&h->mu);
    int n = h->n_ent;
    int64_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    for (int i = 0; ids && i < n; i++) ids[i] = h->ent[i].id;
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; ids && i < n; i++) kv_engine_cancel(h->e, ids[i]);
    free(ids);
}

int srv_hub_poll_foreign(srv_hub *h, kv_event *out, int cap) {
    pthread_mutex_lock(&h->mu);
    int n = KV_MIN(cap, h->n_foreign);
    if (n > 0) {
        memcpy(out, h->foreign, (size_t)n * sizeof *out);
        memmove(h->foreign, h->foreign + n, (size_t)(h->n_foreign - n) * sizeof *h->foreign);
        h->n_foreign -= n;
    }
    pthread_mutex_unlock(&h->mu);
    return n > 0 ? n : 0;
}

int srv_hub_pending(srv_hub *h) {
    pthread_mutex_lock(&h->mu);
    int n = h->n_ent;
    pthread_mutex_unlock(&h->mu);
    return n;
}

void srv_hub_count_http(srv_hub *h, int status) {
    if (!h || status < 100 || status > 599) return;
    pthread_mutex_lock(&h->mu);
    h->st.http[status / 100]++;
    pthread_mutex_unlock(&h->mu);
}

void srv_hub_stats(srv_hub *h, srv_stats *out) {
    pthread_mutex_lock(&h->mu);
    *out = h->st;
    pthread_mutex_unlock(&h->mu);
}
