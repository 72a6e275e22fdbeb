/* openai.c - /v1/chat/completions and /v1/completions: a parsed request
 * becomes prompt ids (prompt.c), one engine request per choice (hub.c),
 * and the reply the OpenAI clients expect: a chat.completion /
 * text_completion object, or Server-Sent Events of chunks (the role first,
 * text deltas, finish_reason last, an optional usage chunk, [DONE]). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/json.h"
#include "../engine/tokenizer.h"
#include "prompt.h"
#include "srv.h"

/* ---- a generation: the request, its job and what was sent ---- */

typedef struct gen {
    srv_stream base;
    srv *s;
    srv_gen_req req;
    srv_job *job;
    int n_prompts;       /* completions: prompts; chat: 1 */
    int *prompt_tokens;  /* (n_prompts) */
    char **echo;         /* (n_prompts) completions with echo: the prompt text, owned */
    size_t *sent;        /* (n_choices) bytes of text already streamed */
    int *marks_sent;     /* (n_choices) of the choice's marks, those streamed */
    int *fin_sent;       /* (n_choices) bool: its finish_reason chunk is out */
    int *lps_sent;       /* (n_choices) of the choice's logprob entries, those streamed */
    size_t *lp_offset;   /* (n_choices) completions' text_offset so far (characters) */
    int started;         /* bool: the first chunks are out */
    int ended;           /* bool: [DONE] is out */
    uint64_t seen;       /* job version seen */
    char id[48];
    long long created;
} gen;

static int n_choices(const gen *g) { return g->job->n_choices; }

/* ---- starting ---- */

static void gen_destroy(srv_stream *st, int client_gone);
static int gen_next(srv_stream *st, srv_buf *out, int wait_ms);
static int gen_wait(srv_stream *st, srv_reply *r, int wait_ms);

static void gen_cancel(srv_stream *st) {
    gen *g = (gen *)st;
    if (g->job) srv_hub_cancel_job(g->s->hub, g->job);
}

/* Encodes prompt p of g's request into *ids / *n. */
static int encode_prompt(srv *s, gen *g, int p, int32_t **ids, int *n, srv_error *e) {
    const kv_model *m = kv_engine_model(s->e);
    const srv_gen_req *rq = &g->req;
    kv_err err;
    size_t bytes = 0;
    if (rq->kind == SRV_CHAT)
        for (int i = 0; i < rq->n_msgs; i++) bytes += rq->msgs[i].len;
    else bytes = rq->prompts[p].text ? rq->prompts[p].len : 0;
    /* no token is longer than the longest piece: a text this long is over
     * the context for certain, and is refused before any work */
    size_t max_piece = (size_t)KV_MAX(kv_tokenizer_max_piece(m->tok), 1);
    const char *param = rq->kind == SRV_CHAT ? "messages" : "prompt";
    if (bytes / max_piece > (size_t)s->ctx)
        return srv_fail(e, 400, NULL, param, "context_length_exceeded",
                        "the prompt (%zu bytes) is longer than the model's context of %d tokens", bytes, s->ctx);
    int rc;
    /* encoding stops one token past the context: the engine refuses that, with its reason */
    if (rq->kind == SRV_CHAT) {
        rc = srv_prompt_chat(m, rq->msgs, rq->n_msgs, 1, rq->parse_special, s->ctx + 1, ids, n, &err);
    } else if (rq->prompts[p].ids) {
        int nv = kv_tokenizer_n_vocab(m->tok);
        for (int i = 0; i < rq->prompts[p].n_ids; i++)
            if (rq->prompts[p].ids[i] >= nv) {
                char pp[48];
                snprintf(pp, sizeof pp, "prompt[%d]", p);
                return srv_fail(e, 400, NULL, pp, "invalid_value", "token id %d is outside the vocabulary [0, %d)",
                                rq->prompts[p].ids[i], nv);
            }
        *n = rq->prompts[p].n_ids;
        *ids = malloc((size_t)*n * sizeof **ids);
        if (!*ids) return srv_fail(e, 500, "internal_error", NULL, "out_of_memory", "out of memory");
        memcpy(*ids, rq->prompts[p].ids, (size_t)*n * sizeof **ids);
        rc = 0;
    } else {
        rc = srv_prompt_text(m, rq->prompts[p].text, rq->prompts[p].len, 1, rq->parse_special, s->ctx + 1, ids, n,
                             &err);
    }
    if (rc == KV_ERR_RANGE)
        return srv_fail(e, 400, NULL, param, "context_length_exceeded", "the prompt is longer than the context: %s",
                        err.msg);
    if (rc) return srv_fail(e, rc == KV_ERR_NOMEM ? 500 : 400, NULL, param, NULL, "%s", err.msg);
    if (rq->echo) {
        char *t;
        if (rq->prompts[p].text) t = strdup(rq->prompts[p].text);
        else {
            int need = kv_tokenizer_decode(m->tok, *ids, *n, 0, NULL, 0);
            t = need >= 0 ? malloc((size_t)need + 1) : NULL;
            if (t) kv_tokenizer_decode(m->tok, *ids, *n, 0, t, (size_t)need + 1);
        }
        if (!t) return srv_fail(e, 400, NULL, "prompt", NULL, "cannot decode the prompt for echo");
        g->echo[p] = t;
    }
    return 0;
}

/* Tokenizes, builds one engine request per choice and submits them all. */
static int gen_start(srv *s, gen *g, srv_error *e) {
    const srv_gen_req *rq = &g->req;
    int n_prompts = g->n_prompts, nc = n_prompts * rq->n;
    const kv_model *m = kv_engine_model(s->e);
    kv_request_params *par = calloc((size_t)nc, sizeof *par);
    int32_t **ids = calloc((size_t)n_prompts, sizeof *ids);
    const char *stops[SRV_MAX_STOP + 1];
    int n_stop = 0, rc = -1;
    g->prompt_tokens = calloc((size_t)n_prompts, sizeof *g->prompt_tokens);
    g->echo = calloc((size_t)n_prompts, sizeof *g->echo);
    g->sent = calloc((size_t)nc, sizeof *g->sent);
    g->marks_sent = calloc((size_t)nc, sizeof *g->marks_sent);
    g->fin_sent = calloc((size_t)nc, sizeof *g->fin_sent);
    g->lps_sent = calloc((size_t)nc, sizeof *g->lps_sent);
    g->lp_offset = calloc((size_t)nc, sizeof *g->lp_offset);
    g->job = srv_job_new(nc);
    if (!par || !ids || !g->prompt_tokens || !g->echo || !g->sent || !g->marks_sent || !g->fin_sent ||
        !g->lps_sent || !g->lp_offset || !g->job) {
        srv_fail(e, 500, "internal_error", NULL, "out_of_memory", "out of memory");
        goto done;
    }
    for (int i = 0; i < rq->n_stop; i++) stops[n_stop++] = rq->stop[i];
    const char *eot = rq->kind == SRV_CHAT ? srv_prompt_end_of_turn(m) : NULL;
    if (eot) stops[n_stop++] = eot;
    for (int p = 0; p < n_prompts; p++) {
        int n = 0;
        if (encode_prompt(s, g, p, &ids[p], &n, e)) goto done;
        g->prompt_tokens[p] = n;
        int max_tokens = rq->max_tokens;
        if (max_tokens < 0) { /* absent: 16 for completions (OpenAI's default), up to the context for chat */
            int room = KV_MIN(s->ctx, s->cache_tokens) - n;
            max_tokens = rq->kind == SRV_COMPLETION ? KV_MIN(16, room) : room;
            if (max_tokens < 1) {
                srv_fail(e, 400, NULL, rq->kind == SRV_CHAT ? "messages" : "prompt", "context_length_exceeded",
                         "the prompt of %d tokens leaves no room in the context of %d", n, s->ctx);
                goto done;
            }
        }
        for (int j = 0; j < rq->n; j++) {
            kv_request_params *q = &par[p * rq->n + j];
            kv_engine_request_defaults(s->e, q);
            q->tokens = ids[p];
            q->n_tokens = n;
            q->max_tokens = max_tokens;
            q->sampling = rq->sampling;
            if (rq->has_seed) {
                q->sampling.seed = rq->sampling.seed + (uint64_t)j;
                q->seed_exact = 1;
            }
            q->stop = n_stop ? stops : NULL;
            q->n_stop = n_stop;
            q->priority = rq->priority;
            q->ignore_eos = rq->ignore_eos;
            q->session = SRV_SESSION;
            q->logprobs = rq->logprobs;
            q->top_logprobs = rq->top_logprobs;
        }
    }
    rc = srv_hub_submit(s->hub, g->job, par, e);
done:
    for (int p = 0; ids && p < n_prompts; p++) free(ids[p]);
    free(ids);
    free(par);
    return rc;
}

void srv_handle_gen(srv *s, srv_kind kind, const char *body, size_t len, srv_reply *r) {
    srv_error e;
    gen *g = calloc(1, sizeof *g);
    if (!g) {
        srv_fail(&e, 500, "internal_error", NULL, "out_of_memory", "out of memory");
        srv_reply_error(r, &e);
        return;
    }
    g->s = s;
    g->base = (srv_stream){gen_next, gen_wait, gen_destroy, gen_cancel};
    if (srv_parse_gen(body, len, kind, &s->cfg.sampling, &g->req, &e)) goto fail;
    if (!srv_model_ok(s, g->req.model)) {
        srv_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                 "the model '%s' does not exist (this server has '%s')", g->req.model, s->model_id);
        goto fail;
    }
    g->n_prompts = kind == SRV_CHAT ? 1 : g->req.n_prompts;
    snprintf(g->id, sizeof g->id, "%s-%llx", kind == SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&s->serial, 1) + 1);
    g->created = (long long)time(NULL);
    if (gen_start(s, g, &e)) goto fail;
    if (g->req.stream) {
        r->status = 200;
        r->content_type = "text/event-stream";
        r->stream = &g->base;
    } else {
        r->pending = &g->base;
    }
    return;
fail:
    srv_reply_error(r, &e);
    gen_destroy(&g->base, 0);
}

static void gen_destroy(srv_stream *st, int client_gone) {
    gen *g = (gen *)st;
    if (!g) return;
    if (g->job) srv_hub_release(g->s->hub, g->job, client_gone);
    for (int p = 0; g->echo && p < g->n_prompts; p++) free(g->echo[p]);
    free(g->echo);
    free(g->prompt_tokens);
    free(g->sent);
    free(g->marks_sent);
    free(g->fin_sent);
    free(g->lps_sent);
    free(g->lp_offset);
    srv_gen_req_free(&g->req);
    free(g);
}

/* ---- pieces of replies ---- */

static void write_usage(const gen *g, kv_json_writer *w) {
    int prompt = 0, completion = 0, cached = 0;
    for (int p = 0; p < g->n_prompts; p++) prompt += g->prompt_tokens[p];
    for (int i = 0; i < n_choices(g); i++) {
        completion += g->job->choices[i].n_tokens;
        if (i % g->req.n == 0) cached += g->job->choices[i].cached_tokens;
    }
    kv_json_write_key(w, "usage");
    kv_json_write_begin_object(w);
    kv_json_field_int(w, "prompt_tokens", prompt);
    kv_json_field_int(w, "completion_tokens", completion);
    kv_json_field_int(w, "total_tokens", prompt + completion);
    kv_json_write_key(w, "prompt_tokens_details");
    kv_json_write_begin_object(w);
    kv_json_field_int(w, "cached_tokens", cached);
    kv_json_write_end_object(w);
    kv_json_write_end_object(w);
}

static void write_head(const gen *g, kv_json_writer *w, const char *object) {
    kv_json_write_begin_object(w);
    kv_json_field_str(w, "id", g->id);
    kv_json_field_str(w, "object", object);
    kv_json_field_int(w, "created", g->created);
    kv_json_field_str(w, "model", g->s->model_id);
}

/* The head, then the "choices" array opened. */
static void begin_choices(const gen *g, kv_json_writer *w, const char *object) {
    write_head(g, w, object);
    kv_json_write_key(w, "choices");
    kv_json_write_begin_array(w);
}

/* One choice's object opened, with its index. */
static void begin_choice(kv_json_writer *w, int index) {
    kv_json_write_begin_object(w);
    kv_json_field_int(w, "index", index);
}

/* A finished choice that is not a reply: the error the client gets. */
static int choice_error(const gen *g, const srv_choice *c, srv_error *e) {
    if (srv_finish_name(c->finish)) return 0;
    if (c->finish == KV_FINISH_CANCELLED) {
        int stopping = atomic_load(&g->s->state) == SRV_STOPPING;
        return srv_fail(e, 503, "service_unavailable", NULL, stopping ? "shutting_down" : "cancelled",
                        "the request was cancelled%s", stopping ? ": the server is shutting down" : "");
    }
    if (c->finish == KV_FINISH_REJECTED) return srv_fail(e, 400, NULL, NULL, "rejected", "rejected: %s", c->reason);
    return srv_fail(e, 500, "internal_error", NULL, "engine_error", "generation failed: %s",
                    c->reason[0] ? c->reason : "engine error");
}

/* ---- non-streaming ---- */

static int gen_wait(srv_stream *st, srv_reply *r, int wait_ms) {
    gen *g = (gen *)st;
    srv_job *job = g->job;
    pthread_mutex_lock(&job->mu);
    int done = job->n_done == job->n_choices;
    pthread_mutex_unlock(&job->mu);
    if (!done) {
        srv_job_wait(job, &g->seen, wait_ms);
        pthread_mutex_lock(&job->mu);
        done = job->n_done == job->n_choices;
        pthread_mutex_unlock(&job->mu);
        if (!done) return 0;
    }
    /* done: the dispatcher writes no more, so the choices are read unlocked */
    srv_error e;
    for (int i = 0; i < n_choices(g); i++)
        if (choice_error(g, &job->choices[i], &e)) {
            srv_reply_error(r, &e);
            return 1;
        }
    srv_json j;
    if (srv_json_open(&j)) goto nomem;
    int chat = g->req.kind == SRV_CHAT;
    kv_json_writer *w = &j.w;
    begin_choices(g, w, chat ? "chat.completion" : "text_completion");
    for (int i = 0; i < n_choices(g); i++) {
        const srv_choice *c = &job->choices[i];
        begin_choice(w, i);
        if (chat) {
            kv_json_write_key(w, "message");
            kv_json_write_begin_object(w);
            kv_json_field_str(w, "role", "assistant");
            kv_json_write_key(w, "content");
            kv_json_write_string_n(w, c->text ? c->text : "", c->len);
            kv_json_write_end_object(w);
        } else {
            kv_json_write_key(w, "text");
            const char *echo = g->echo[i / g->req.n];
            if (echo) {
                size_t el = strlen(echo);
                char *t = malloc(el + c->len + 1);
                if (!t) goto nomem_j;
                memcpy(t, echo, el);
                if (c->len) memcpy(t + el, c->text, c->len);
                kv_json_write_string_n(w, t, el + c->len);
                free(t);
            } else {
                kv_json_write_string_n(w, c->text ? c->text : "", c->len);
            }
        }
        kv_json_write_key(w, "logprobs");
        if (!g->req.logprobs) kv_json_write_null(w);
        else if (srv_write_logprobs(w, kv_engine_model(g->s->e)->tok, g->req.kind, g->req.tokens_as_ids, c->lps,
                                    c->n_lps, &g->lp_offset[i]))
            goto nomem_j;
        kv_json_field_str(w, "finish_reason", srv_finish_name(c->finish));
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
    write_usage(g, w);
    kv_json_write_end_object(w);
    size_t len;
    char *body = srv_json_close(&j, &len);
    if (!body) goto nomem;
    srv_reply_json(r, 200, body, len);
    return 1;
nomem_j: {
    size_t dummy;
    free(srv_json_close(&j, &dummy));
}
nomem:
    srv_fail(&e, 500, "internal_error", NULL, "out_of_memory", "out of memory");
    srv_reply_error(r, &e);
    return 1;
}

/* ---- streaming ---- */

/* Closes j and appends it to out as one SSE data event. Returns 0 or
 * KV_ERR_NOMEM. */
static int sse_send(srv_json *j, srv_buf *out) {
    size_t l;
    char *s = srv_json_close(j, &l);
    if (!s) return KV_ERR_NOMEM;
    int rc = srv_buf_add(out, "data: ", 6) || srv_buf_add(out, s, l) || srv_buf_add(out, "\n\n", 2);
    free(s);
    return rc ? KV_ERR_NOMEM : 0;
}

/* One chunk with one choice: its delta text (chat: role on the first),
 * or its finish_reason; with the request's logprobs, those of lp[0..n_lp). */
static int sse_chunk(gen *g, srv_buf *out, int idx, const char *role, const char *text, size_t len,
                     const char *finish, const srv_logprob *lp, int n_lp) {
    srv_json j;
    if (srv_json_open(&j)) return KV_ERR_NOMEM;
    int chat = g->req.kind == SRV_CHAT;
    kv_json_writer *w = &j.w;
    begin_choices(g, w, chat ? "chat.completion.chunk" : "text_completion");
    begin_choice(w, idx);
    if (chat) {
        kv_json_write_key(w, "delta");
        kv_json_write_begin_object(w);
        if (role) {
            kv_json_field_str(w, "role", role);
        }
        if (text) {
            kv_json_write_key(w, "content");
            kv_json_write_string_n(w, text, len);
        }
        kv_json_write_end_object(w);
    } else {
        kv_json_write_key(w, "text");
        kv_json_write_string_n(w, text ? text : "", text ? len : 0);
    }
    kv_json_write_key(w, "logprobs");
    if (!g->req.logprobs || role || (finish && n_lp == 0)) kv_json_write_null(w);
    else if (srv_write_logprobs(w, kv_engine_model(g->s->e)->tok, g->req.kind, g->req.tokens_as_ids, lp, n_lp,
                                &g->lp_offset[idx])) {
        size_t dummy;
        free(srv_json_close(&j, &dummy));
        return KV_ERR_NOMEM;
    }
    kv_json_field_str(w, "finish_reason", finish);
    kv_json_write_end_object(w);
    kv_json_write_end_array(w);
    if (g->req.include_usage) {
        kv_json_write_key(w, "usage");
        kv_json_write_null(w);
    }
    kv_json_write_end_object(w);
    return sse_send(&j, out);
}

static int sse_usage(const gen *g, srv_buf *out) {
    srv_json j;
    if (srv_json_open(&j)) return KV_ERR_NOMEM;
    begin_choices(g, &j.w, g->req.kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    kv_json_write_end_array(&j.w);
    write_usage(g, &j.w);
    kv_json_write_end_object(&j.w);
    return sse_send(&j, out);
}

/* An error in the middle of a stream: an error event, then [DONE]. */
static void sse_error(gen *g, srv_buf *out, const srv_error *e) {
    srv_reply r = {0};
    srv_reply_error(&r, e);
    if (r.body) {
        srv_buf_add(out, "data: ", 6);
        srv_buf_add(out, r.body, r.len);
        srv_buf_add(out, "\n\n", 2);
    }
    free(r.body);
    srv_buf_add(out, "data: [DONE]\n\n", 14);
    g->ended = 1;
}

static int gen_next(srv_stream *st, srv_buf *out, int wait_ms) {
    gen *g = (gen *)st;
    srv_job *job = g->job;
    if (g->ended) return -1;
    size_t before = out->n;
    int nc = n_choices(g);
    if (!g->started) {
        g->started = 1;
        for (int i = 0; i < nc && g->req.kind == SRV_CHAT; i++)
            if (sse_chunk(g, out, i, "assistant", "", 0, NULL, NULL, 0)) goto nomem;
        if (out->n > before) return (int)(out->n - before);
    }
    srv_job_wait(job, &g->seen, wait_ms);
    for (int i = 0; i < nc && !g->ended; i++) {
        srv_choice *c = &job->choices[i];
        if (g->fin_sent[i]) continue;
        pthread_mutex_lock(&job->mu);
        int done = c->done;
        size_t n = c->len - g->sent[i], base = g->sent[i];
        int k0 = g->marks_sent[i], k1 = c->n_marks;
        int l0 = g->lps_sent[i], l1 = c->n_lps;
        char *piece = n ? malloc(n) : NULL;
        size_t *ends = k1 > k0 ? malloc((size_t)(k1 - k0) * sizeof *ends) : NULL;
        srv_logprob *lps = l1 > l0 ? malloc((size_t)(l1 - l0) * sizeof *lps) : NULL;
        if (piece) memcpy(piece, c->text + base, n);
        if (ends) memcpy(ends, c->marks + k0, (size_t)(k1 - k0) * sizeof *ends);
        if (lps) memcpy(lps, c->lps + l0, (size_t)(l1 - l0) * sizeof *lps);
        pthread_mutex_unlock(&job->mu);
        int rc = (n && !piece) || (k1 > k0 && !ends) || (l1 > l0 && !lps) ? KV_ERR_NOMEM : 0;
        srv_error e;
        if (rc == 0 && done && choice_error(g, c, &e)) {
            free(piece);
            free(ends);
            free(lps);
            sse_error(g, out, &e);
            break;
        }
        /* one chunk per token's text, as the engine emitted them, with the
         * logprobs of the tokens whose text it completes */
        size_t at = 0;
        int nl = l1 - l0, li = 0;
        for (int k = 0; k <= k1 - k0 && rc == 0; k++) {
            size_t end = k < k1 - k0 ? ends[k] - base : n; /* the last pass: text past the marks */
            if (end <= at) continue;
            int lj = li;
            while (lj < nl && lps[lj].text_end <= base + end) lj++;
            rc = sse_chunk(g, out, i, NULL, piece + at, end - at, NULL, lps ? lps + li : NULL, lj - li);
            li = lj;
            at = end;
        }
        if (rc == 0 && done) /* what is left (tokens whose text was cut or is empty) goes with the finish */
            rc = sse_chunk(g, out, i, NULL, NULL, 0, srv_finish_name(c->finish), lps ? lps + li : NULL, nl - li);
        free(piece);
        free(ends);
        free(lps);
        if (rc) goto nomem;
        g->sent[i] += n;
        g->marks_sent[i] = k1;
        g->lps_sent[i] += done ? nl : li;
        if (done) g->fin_sent[i] = 1;
    }
    if (!g->ended) {
        int all = 1;
        for (int i = 0; i < nc; i++) all &= g->fin_sent[i];
        if (all) {
            if (g->req.include_usage && sse_usage(g, out)) goto nomem;
            if (srv_buf_add(out, "data: [DONE]\n\n", 14)) goto nomem;
            g->ended = 1;
        }
    }
    if (g->ended) return -1;
    return (int)(out->n - before);
nomem: {
    srv_error e;
    srv_fail(&e, 500, "internal_error", NULL, "out_of_memory", "out of memory");
    sse_error(g, out, &e);
    return -1;
}
}
