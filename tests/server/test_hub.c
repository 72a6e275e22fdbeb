/* test_hub.c - the dispatcher on a real engine (stories260K): jobs of one
 * and several choices get the engine's text and token counts, the queue
 * bound refuses what is past it without side effects, a released job's
 * requests are cancelled (nothing left running, kv_engine_check clean),
 * a seed gives the same text twice; logprobs reach the choice that asked
 * (one entry per token, the ending end-of-generation token left out) and
 * write as the completions shape; and the Prometheus text and snapshot
 * JSON written from the result parse and carry the counters. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../harness.h"
#include "../engine_helpers.h"
#include "../../engine/json.h"
#include "../../server/hub.h"
#include "../../server/metrics_prom.h"
#include "../../server/snapshot_json.h"
#include "../../server/srv.h"

static const int32_t prompt_ids[] = {1, 403, 407, 261, 378};

static kv_engine *make(int max_seqs) {
    kv_config c;
    test_engine_config(&c, NULL, 1, 128, max_seqs, 0);
    c.kv.dtype = KV_CACHE_F32;
    c.sampling.temperature = 0;
    c.sampling.top_k = 0;
    c.sampling.top_p = 1;
    c.sampling.min_p = 0;
    return test_engine_new(&c);
}

static void params(kv_engine *e, kv_request_params *p, int max_tokens) {
    kv_engine_request_defaults(e, p);
    p->tokens = prompt_ids;
    p->n_tokens = (int)KV_ARRAY_LEN(prompt_ids);
    p->max_tokens = max_tokens;
}

/* Waits (30 s at most) until every choice of job is done. */
static int wait_done(srv_job *job) {
    uint64_t seen = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (t = t0; t.tv_sec - t0.tv_sec < 30; clock_gettime(CLOCK_MONOTONIC, &t)) {
        pthread_mutex_lock(&job->mu);
        int done = job->n_done == job->n_choices;
        pthread_mutex_unlock(&job->mu);
        if (done) return 1;
        srv_job_wait(job, &seen, 100);
    }
    return 0;
}

/* An engine of max_seqs sequences, started, and a hub on it whose queue
 * bound is max_waiting; NULL (*e NULL or freed) with the reason printed
 * when either cannot be made. OUT: *e. */
static srv_hub *open_hub(int max_seqs, int max_waiting, kv_engine **e) {
    *e = make(max_seqs);
    if (!*e) return NULL;
    kv_err err = {0};
    srv_hub *h = NULL;
    if (kv_engine_start(*e) != 0)
        fprintf(stderr, "  engine: does not start\n");
    else if (!(h = srv_hub_new(*e, max_waiting, 0, &err)))
        fprintf(stderr, "  hub: %s\n", err.msg);
    if (!h) {
        kv_engine_free(*e);
        *e = NULL;
    }
    return h;
}

/* Waits (2 s at most) until the hub has nothing pending; 1 when so. */
static int hub_drained(srv_hub *h) {
    for (int i = 0; i < 100 && srv_hub_pending(h) > 0; i++) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return srv_hub_pending(h) == 0;
}

/* Frees what open_hub made. */
static void close_hub(srv_hub *h, kv_engine *e) {
    srv_hub_free(h);
    kv_engine_free(e);
}

/* The Prometheus text of s and *st (model "my \"model\"") when st is not
 * NULL, else the snapshot JSON of s (model "m") from since_step on (-1:
 * a full frame), as a NUL-terminated buffer to free(); NULL when it cannot
 * be written. OUT: *len. */
static char *write_mem(const kv_snapshot *s, const srv_stats *st, int64_t since, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    int rc = st ? srv_metrics_write(f, "vllm", "my \"model\"", s, st)
                : srv_snapshot_write(f, s, "m", since, since < 0 ? "" : NULL);
    fclose(f);
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void test_jobs_and_text(void) {
    kv_engine *e;
    srv_hub *h = open_hub(8, 8 + 4, &e);
    REQUIRE(h);
    srv_job *job = srv_job_new(3);
    kv_request_params p[3];
    for (int i = 0; i < 3; i++) params(e, &p[i], 12 + i);
    srv_error se;
    REQUIRE(srv_hub_submit(h, job, p, &se) == 0);
    REQUIRE(wait_done(job));
    for (int i = 0; i < 3; i++) {
        const srv_choice *c = &job->choices[i];
        CHECKF(c->n_tokens == 12 + i && c->finish == KV_FINISH_LENGTH, "choice %d: %d tokens", i, c->n_tokens);
        char text[4096];
        int n = kv_engine_request_text(e, c->id, text, sizeof text);
        CHECKF(n == (int)c->len && !memcmp(text, c->text, c->len), "choice %d: text differs from the engine's", i);
        CHECK(c->t_first_ms >= c->t_arrival_ms && c->t_last_ms >= c->t_first_ms);
    }
    /* greedy: each is a prefix of the next */
    CHECK(!strncmp(job->choices[2].text, job->choices[0].text, job->choices[0].len));
    srv_hub_release(h, job, 0);
    srv_stats st;
    srv_hub_stats(h, &st);
    CHECK(st.generation_tokens == 12 + 13 + 14 && st.prompt_tokens == 15 && st.finished[SRV_FIN_LENGTH] == 3);
    CHECKF(st.ttft.count == 3 && st.e2e.count == 3 && st.itl.count == 11 + 12 + 13 && st.queue.count == 3,
           "ttft %llu e2e %llu itl %llu queue %llu", (unsigned long long)st.ttft.count, (unsigned long long)st.e2e.count,
           (unsigned long long)st.itl.count, (unsigned long long)st.queue.count);
    CHECK(srv_hub_pending(h) == 0);
    close_hub(h, e);
}

static void test_queue_bound_and_cancel(void) {
    kv_engine *e;
    srv_hub *h = open_hub(2, 1, &e);
    REQUIRE(h);
    kv_engine_pause(e); /* nothing runs: the jobs stay pending */
    kv_err err;
    srv_job *a = srv_job_new(2), *b = srv_job_new(2);
    kv_request_params p[2];
    params(e, &p[0], 200);
    params(e, &p[1], 200);
    srv_error se;
    REQUIRE(srv_hub_submit(h, a, p, &se) == 0); /* the 2 free batch slots take them */
    int waiting, running;
    kv_engine_queue_lengths(e, &waiting, &running);
    CHECK(waiting == 2 && running == 0);
    CHECK(srv_hub_submit(h, b, p, &se) == -1 && se.status == 429); /* 2 + 2 - 2 free > 1: all or none */
    CHECK(srv_hub_pending(h) == 2 && b->choices[0].id == 0);
    srv_hub_release(h, b, 0);
    /* the bound is the engine's queue: a request another front end (a TUI
     * tab) submitted counts as much as the server's own */
    int64_t tab = kv_engine_submit(e, &p[0], &err);
    REQUIRE(tab > 0);
    kv_engine_queue_lengths(e, &waiting, &running);
    CHECK(waiting == 3);
    srv_job *one = srv_job_new(1);
    CHECKF(srv_hub_submit(h, one, p, &se) == -1 && se.status == 429 && strstr(se.message, "3 requests waiting"), "%s",
           se.message);
    srv_hub_release(h, one, 0);
    CHECK(kv_engine_cancel(e, tab) == 0);
    kv_engine_resume(e);
    /* the client of a goes away mid-generation */
    uint64_t seen = 0;
    for (int i = 0; i < 100 && a->choices[0].n_tokens < 3; i++) srv_job_wait(a, &seen, 50);
    srv_hub_release(h, a, 1);
    CHECK(hub_drained(h));
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s && kv_engine_snapshot(e, s) == 0);
    CHECKF(s->n_running == 0 && s->blocks_used == 0, "running %d, blocks used %d", s->n_running, s->blocks_used);
    kv_snapshot_free(s);
    char msg[256];
    CHECKF(kv_engine_check(e, msg, sizeof msg) == 0, "%s", msg);
    srv_stats st;
    srv_hub_stats(h, &st);
    CHECK(st.disconnects == 1 && st.finished[SRV_FIN_ABORT] == 2 && st.queue_full == 2);
    /* the engine rejects a prompt over the context: a 400 with its reason, nothing left pending */
    srv_job *c = srv_job_new(1);
    params(e, &p[0], 1 << 20);
    CHECK(srv_hub_submit(h, c, p, &se) == -1 && se.status == 400 && strstr(se.message, "exceeds"));
    srv_hub_release(h, c, 0);
    CHECK(srv_hub_pending(h) == 0);
    close_hub(h, e);
}

/* What the free batch slots take is not waiting: a burst of 4 into an idle
 * engine of 2 slots would leave 2 waiting, past a bound of 1, while 2 go
 * in; with both slots running one more may wait, and the next is refused. */
static void test_queue_bound_is_waiting(void) {
    kv_engine *e;
    srv_hub *h = open_hub(2, 1, &e);
    REQUIRE(h);
    kv_request_params p[4];
    srv_error se;
    for (int i = 0; i < 4; i++) {
        params(e, &p[i], 300);
        p[i].ignore_eos = 1;
    }
    /* a burst into the idle engine: 2 run at once, 1 may wait, a 4th is refused */
    srv_job *four = srv_job_new(4);
    CHECK(srv_hub_submit(h, four, p, &se) == -1 && se.status == 429);
    srv_hub_release(h, four, 0);
    srv_job *run2 = srv_job_new(2), *more = srv_job_new(1), *over = srv_job_new(1);
    REQUIRE(srv_hub_submit(h, run2, p, &se) == 0);
    uint64_t seen2 = 0;
    for (int i = 0; i < 100 && (run2->choices[0].n_tokens < 1 || run2->choices[1].n_tokens < 1); i++)
        srv_job_wait(run2, &seen2, 50);
    int waiting, running;
    kv_engine_queue_lengths(e, &waiting, &running);
    CHECKF(waiting == 0 && running == 2, "%d waiting, %d running", waiting, running);
    CHECK(srv_hub_submit(h, more, p, &se) == 0);  /* waits: both slots are taken */
    CHECK(srv_hub_submit(h, over, p, &se) == -1 && se.status == 429);
    srv_hub_release(h, over, 0);
    srv_hub_release(h, more, 0);
    srv_hub_release(h, run2, 0);
    CHECK(hub_drained(h));
    close_hub(h, e);
}

static void test_seed_exact(void) {
    kv_engine *e;
    srv_hub *h = open_hub(4, 8, &e);
    REQUIRE(h);
    char texts[3][4096];
    for (int k = 0; k < 3; k++) {
        srv_job *job = srv_job_new(1);
        kv_request_params p;
        params(e, &p, 24);
        p.sampling.temperature = 1.0f;
        p.sampling.seed = k < 2 ? 7 : 8;
        p.seed_exact = 1;
        srv_error se;
        REQUIRE(srv_hub_submit(h, job, &p, &se) == 0);
        REQUIRE(wait_done(job));
        kv_copy_str(texts[k], sizeof texts[k], job->choices[0].text ? job->choices[0].text : "");
        srv_hub_release(h, job, 0);
    }
    CHECK(!strcmp(texts[0], texts[1]));
    CHECK(strcmp(texts[0], texts[2]));
    close_hub(h, e);
}

static void test_metrics_and_snapshot_text(void) {
    kv_engine *e;
    srv_hub *h = open_hub(4, 8, &e);
    REQUIRE(h);
    kv_err err;
    srv_job *job = srv_job_new(1);
    kv_request_params p;
    params(e, &p, 8);
    srv_error se;
    REQUIRE(srv_hub_submit(h, job, &p, &se) == 0);
    REQUIRE(wait_done(job));
    srv_hub_release(h, job, 0);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s && kv_engine_snapshot(e, s) == 0);
    srv_stats st;
    srv_hub_stats(h, &st);
    size_t len = 0;
    char *buf = write_mem(s, &st, 0, &len);
    REQUIRE(buf);
    CHECK(strstr(buf, "# TYPE vllm:num_requests_running gauge\n"));
    CHECK(strstr(buf, "vllm:generation_tokens_total{model_name=\"my \\\"model\\\"\"} 8\n"));
    CHECK(strstr(buf, "vllm:request_success_total{model_name=\"my \\\"model\\\"\",finished_reason=\"length\"} 1\n"));
    CHECK(strstr(buf, "vllm:time_to_first_token_seconds_bucket{model_name=\"my \\\"model\\\"\",le=\"+Inf\"} 1\n"));
    CHECK(strstr(buf, "vllm:time_to_first_token_seconds_count{model_name=\"my \\\"model\\\"\"} 1\n"));
    CHECK(strstr(buf, "vllm:cache_config_info{model_name=\"my \\\"model\\\"\",block_size=\"16\",num_gpu_blocks=\"128\""));
    CHECK(strstr(buf, "kvtop:kv_blocks{model_name=\"my \\\"model\\\"\",state=\"free\"}"));
    CHECK(!strstr(buf, "kvtop:num_requests_running")); /* vLLM's names follow the prefix */
    /* buckets are cumulative and end at the count */
    const char *b = strstr(buf, "vllm:inter_token_latency_seconds_bucket");
    unsigned long long prev = 0, v;
    int ok = 1;
    while (b && !strncmp(b, "vllm:inter_token_latency_seconds_bucket", 39)) {
        const char *sp = strchr(b, '}');
        v = strtoull(sp + 2, NULL, 10);
        ok &= v >= prev;
        prev = v;
        b = strchr(b, '\n');
        b = b ? b + 1 : NULL;
    }
    CHECK(ok && prev == 7);
    free(buf);
    buf = write_mem(s, NULL, -1, &len);
    REQUIRE(buf);
    kv_json *doc = kv_json_parse(buf, len, &err);
    REQUIRE(doc);
    CHECK(kv_json_number(kv_json_get(doc, "step")) == (double)s->step);
    CHECK(kv_json_type_of(kv_json_get(doc, "paused")) == KV_JSON_BOOL);
    CHECK(kv_json_bool(kv_json_get(kv_json_get(doc, "check"), "ok")));
    const kv_json *blocks = kv_json_get(doc, "blocks");
    CHECK(kv_json_len(kv_json_get(blocks, "state")) == 128 && kv_json_len(kv_json_get(blocks, "owner")) == 128);
    const kv_json *reqs = kv_json_get(doc, "requests");
    CHECK(kv_json_len(reqs) >= 1);
    const kv_json *r0 = kv_json_at(reqs, kv_json_len(reqs) - 1);
    CHECK(!strcmp(kv_json_str(kv_json_get(r0, "state"), NULL), "finished"));
    CHECK(kv_json_get(r0, "wait_reason") && kv_json_get(r0, "block_table"));
    CHECK(kv_json_len(kv_json_get(doc, "steps")) == (size_t)s->n_steps);
    CHECK(kv_json_get(kv_json_get(doc, "metrics"), "ttft_ms") && kv_json_get(doc, "memory"));
    kv_json_free(doc);
    free(buf);
    /* a delta frame carries only the steps after since_step */
    buf = write_mem(s, NULL, (int64_t)s->step, &len);
    REQUIRE(buf);
    doc = kv_json_parse(buf, len, &err);
    REQUIRE(doc);
    CHECK(kv_json_len(kv_json_get(doc, "steps")) == 0 && kv_json_bool(kv_json_get(doc, "delta")));
    CHECK(kv_json_get(doc, "check") == NULL);
    kv_json_free(doc);
    free(buf);
    kv_snapshot_free(s);
    close_hub(h, e);
}


/* Logprobs: routed per token to the choice that asked, greedy top-1 is the
 * chosen token, entries follow the text; the completions JSON has one
 * entry per token in each array and text offsets that add up to the text. */
static void test_logprobs_routed(void) {
    kv_engine *e;
    srv_hub *h = open_hub(8, 8, &e);
    REQUIRE(h);
    kv_err err;
    srv_job *job = srv_job_new(3);
    kv_request_params p[3];
    for (int i = 0; i < 3; i++) params(e, &p[i], i == 2 ? 400 : 20);
    p[0].logprobs = 1;
    p[0].top_logprobs = 3;
    p[0].ignore_eos = 1;
    p[2].logprobs = 1; /* may end with an end-of-generation token */
    srv_error se;
    REQUIRE(srv_hub_submit(h, job, p, &se) == 0);
    REQUIRE(wait_done(job));
    const srv_choice *a = &job->choices[0], *b = &job->choices[1], *c = &job->choices[2];
    CHECKF(a->n_tokens == 20 && a->n_lps == 20, "%d tokens, %d logprob entries", a->n_tokens, a->n_lps);
    CHECK(b->n_lps == 0);
    int eos = c->finish == KV_FINISH_EOS;
    CHECKF(c->n_lps == c->n_tokens - eos, "finish %d: %d tokens, %d entries", c->finish, c->n_tokens, c->n_lps);
    for (int i = 0; i < a->n_lps; i++) {
        const srv_logprob *l = &a->lps[i];
        CHECKF(l->n_top == 3 && l->top_token[0] == l->token && l->top_logprob[0] == l->logprob && l->logprob <= 0,
               "entry %d: token %d (%g), top %d (%g)", i, l->token, (double)l->logprob, l->top_token[0],
               (double)l->top_logprob[0]);
        CHECK(l->text_end <= a->len && (i == 0 || l->text_end >= a->lps[i - 1].text_end));
    }
    srv_json j;
    REQUIRE(srv_json_open(&j) == 0);
    size_t off = 0, len;
    CHECK(srv_write_logprobs(&j.w, kv_engine_model(e)->tok, SRV_COMPLETION, 0, a->lps, a->n_lps, &off) == 0);
    char *txt = srv_json_close(&j, &len);
    REQUIRE(txt);
    kv_json *doc = kv_json_parse(txt, len, &err);
    CHECKF(doc, "%s: %s", err.msg, txt);
    if (doc) {
        const kv_json *tk = kv_json_get(doc, "tokens"), *lp = kv_json_get(doc, "token_logprobs"),
                      *top = kv_json_get(doc, "top_logprobs"), *to = kv_json_get(doc, "text_offset");
        REQUIRE(tk && lp && top && to);
        CHECK(kv_json_len(tk) == 20 && kv_json_len(lp) == 20 && kv_json_len(top) == 20 && kv_json_len(to) == 20);
        CHECK(kv_json_number(kv_json_at(to, 0)) == 0);
        CHECK(kv_json_number(kv_json_at(lp, 3)) == (double)a->lps[3].logprob);
        CHECK(kv_json_len(kv_json_at(top, 0)) >= 1 && kv_json_len(kv_json_at(top, 0)) <= 3);
        /* the token strings together are the text (stories260K: ASCII, no stop string) */
        size_t sum = 0;
        for (int i = 0; i < 20; i++) {
            size_t n;
            kv_json_str(kv_json_at(tk, (size_t)i), &n);
            CHECK(kv_json_number(kv_json_at(to, (size_t)i)) == (double)sum);
            sum += n;
        }
        CHECKF(sum == a->len && off == a->len, "token strings %zu bytes, text %zu, offset %zu", sum, a->len, off);
        kv_json_free(doc);
    }
    free(txt);
    srv_hub_release(h, job, 0);
    close_hub(h, e);
}

TEST_MAIN(T(test_jobs_and_text), T(test_logprobs_routed), T(test_queue_bound_and_cancel), T(test_queue_bound_is_waiting), T(test_seed_exact), T(test_metrics_and_snapshot_text))
