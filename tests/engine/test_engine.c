/* test_engine.c - the engine API on the real stories260K model: greedy
 * output against the published continuation, rejections with reasons, no
 * request ever lost, cancellation, stop strings and text streaming, the
 * background thread with pause / single step, snapshots and metrics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/engine.h"
#include "../../engine/kv_cache.h"
#include "../../engine/metrics.h"
#include "../engine_helpers.h"
#include "../harness.h"

/* The published greedy continuation of "Once upon a time" (ids after the
 * prompt [1, 403, 407, 261, 378]; shared/models/README.md). */
static const int32_t prompt_ids[] = {1, 403, 407, 261, 378};
static const int32_t golden[] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
                                 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282,
                                 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352};

/* stories260K, greedy, f32 KV blocks of 16 tokens. */
static void base_config(kv_config *c) {
    test_engine_config(c, NULL, 2, 128, 16, 256);
    c->kv.dtype = KV_CACHE_F32;
    c->scheduler.prefill_chunk = 64;
    c->sampling.temperature = 0;
    c->sampling.top_k = 0;
    c->sampling.top_p = 1;
    c->sampling.min_p = 0;
}

/* Collected events per request. */
typedef struct seen {
    int64_t id;
    int n_tokens;
    int32_t toks[512];
    char text[4096];
    int text_len;
    int n_done;
    kv_finish finish;
    char reason[128];
    int session;
    double queue_ms, e2e_ms; /* the DONE event's figures */
    int n_prefix_hit, preemptions;
} seen;

static seen *find_seen(seen *s, int n, int64_t id) {
    for (int i = 0; i < n; i++)
        if (s[i].id == id) return &s[i];
    return NULL;
}

/* Drains events into s (ids must be registered in s); returns events read.
 * Unknown ids go to the `other` slot when given. */
static int drain(kv_engine *e, seen *s, int n, seen *other) {
    kv_event ev[64];
    int total = 0, k;
    while ((k = kv_engine_poll(e, ev, 64)) > 0) {
        total += k;
        for (int i = 0; i < k; i++) {
            seen *x = find_seen(s, n, ev[i].req);
            if (!x) x = other;
            if (!x) continue;
            x->id = ev[i].req;
            x->session = ev[i].session;
            if (ev[i].type == KV_EVENT_TOKEN && ev[i].token >= 0 && x->n_tokens < 512)
                x->toks[x->n_tokens++] = ev[i].token;
            if (x->text_len + ev[i].text_len < (int)sizeof x->text) {
                memcpy(x->text + x->text_len, ev[i].text, (size_t)ev[i].text_len);
                x->text_len += ev[i].text_len;
                x->text[x->text_len] = 0;
            }
            if (ev[i].type == KV_EVENT_DONE) {
                x->n_done++;
                x->finish = ev[i].finish;
                snprintf(x->reason, sizeof x->reason, "%s", ev[i].reason);
                x->queue_ms = ev[i].queue_ms, x->e2e_ms = ev[i].e2e_ms;
                x->n_prefix_hit = ev[i].n_prefix_hit, x->preemptions = ev[i].preemptions;
            }
        }
    }
    return total;
}

/* Submits p alone, runs e until idle and drains its events into *s (OUT,
 * cleared first). Returns 0, or -1 when the request is refused. */
static int run_alone(kv_engine *e, const kv_request_params *p, seen *s) {
    memset(s, 0, sizeof *s);
    s->id = kv_engine_submit(e, p, NULL);
    if (s->id <= 0) return -1;
    CHECK(kv_engine_run_until_idle(e) == 0);
    drain(e, s, 1, NULL);
    return 0;
}

static int64_t submit_ids(kv_engine *e, const int32_t *ids, int n, int max_tokens, int ignore_eos) {
    return test_submit(e, NULL, ids, n, max_tokens, ignore_eos, 0);
}

static void test_golden_greedy(void) {
    kv_config c;
    base_config(&c);
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int n = (int)KV_ARRAY_LEN(golden);
    int64_t id = submit_ids(e, prompt_ids, 5, n, 1);
    REQUIRE(id > 0);
    CHECK(kv_engine_run_until_idle(e) == 0);
    seen s = {.id = id};
    drain(e, &s, 1, NULL);
    CHECK(s.n_done == 1 && s.finish == KV_FINISH_LENGTH);
    CHECKF(s.n_tokens == n, "%d tokens", s.n_tokens);
    int match = 0;
    while (match < s.n_tokens && match < n && s.toks[match] == golden[match]) match++;
    CHECKF(match == n, "first %d of %d golden ids match", match, n);
    /* the reply text streamed in events is the stored reply */
    char buf[4096];
    int len = kv_engine_request_text(e, id, buf, sizeof buf);
    CHECK(len == s.text_len && memcmp(buf, s.text, (size_t)len) == 0);
    CHECK(len > 20 && strstr(buf, "Once") == NULL); /* the continuation only */
    kv_engine_forget(e, id);
    CHECK(kv_engine_request_text(e, id, buf, sizeof buf) == -1);
    kv_engine_free(e);
}

static void test_text_prompt(void) {
    kv_config c;
    base_config(&c);
    kv_request_params p;
    kv_engine *e = test_engine_text(&c, &p, "Once upon a time", 40);
    REQUIRE(e);
    seen s;
    REQUIRE(run_alone(e, &p, &s) == 0);
    /* the text prompt tokenizes to the golden ids: same continuation */
    int match = 0;
    while (match < s.n_tokens && match < (int)KV_ARRAY_LEN(golden) && s.toks[match] == golden[match]) match++;
    CHECKF(match == (int)KV_ARRAY_LEN(golden), "%d golden ids match", match);
    CHECK(s.finish == KV_FINISH_LENGTH && s.n_tokens == 40);
    CHECKF(strncmp(s.text, ", there was a little girl named Lily.", 37) == 0, "'%s'", s.text);
    kv_engine_free(e);
}

/* A DONE event carries the request's queue time, end-to-end time, prefix
 * hit and preemptions, equal to its finished snapshot row's (front ends
 * need not race the snapshot for them); a rejection's are "none". */
static void test_done_event_figures(void) {
    kv_config c;
    base_config(&c);
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    const char *text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park";
    kv_request_params p;
    seen a, b;
    test_text_params(e, &p, text, 8);
    REQUIRE(run_alone(e, &p, &a) == 0);
    test_text_params(e, &p, text, 8);
    REQUIRE(run_alone(e, &p, &b) == 0);
    CHECK(a.n_done == 1 && b.n_done == 1);
    CHECKF(a.queue_ms >= 0 && a.e2e_ms > 0 && a.e2e_ms >= a.queue_ms, "queue %g e2e %g", a.queue_ms, a.e2e_ms);
    CHECKF(a.n_prefix_hit == 0 && b.n_prefix_hit > 0, "prefix hits %d then %d", a.n_prefix_hit, b.n_prefix_hit);
    kv_snapshot *snap = kv_snapshot_new();
    REQUIRE(snap);
    REQUIRE(kv_engine_snapshot(e, snap) == 0);
    int found = 0;
    for (int i = 0; i < snap->n_requests; i++) {
        const kv_snap_request *r = &snap->requests[i];
        const seen *x = r->id == a.id ? &a : r->id == b.id ? &b : NULL;
        if (!x) continue;
        found++;
        CHECK(r->queue_ms == x->queue_ms && r->e2e_ms == x->e2e_ms);
        CHECK(r->n_prefix_hit == x->n_prefix_hit && r->preemptions == x->preemptions);
    }
    CHECKF(found == 2, "%d finished rows", found);
    kv_snapshot_free(snap);
    kv_engine_free(e);
}

/* A prompt that fits the cache only by eating the blocks admission keeps
 * free would wait forever: rejected, and the reason names the watermark
 * rather than claiming the cache is too small. */
static void test_watermark_rejection(void) {
    kv_config c;
    base_config(&c);
    c.kv.blocks = 8;             /* 128 tokens */
    c.scheduler.watermark = 0.25; /* 2 blocks kept free */
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 300 + i % 100; /* 7 blocks */
    kv_err err;
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = ids;
    p.n_tokens = 100;
    p.max_tokens = 1;
    int64_t rc = kv_engine_submit(e, &p, &err);
    CHECK(rc == KV_ERR_RANGE);
    CHECKF(strstr(err.msg, "keeps 2 free (scheduler.watermark)") != NULL, "'%s'", err.msg);
    /* a prompt that leaves the watermark free still runs */
    CHECK(submit_ids(e, ids, 60, 4, 1) > 0);
    kv_engine_free(e);
}

static void test_rejections(void) {
    kv_config c;
    base_config(&c);
    c.kv.blocks = 8; /* 128 tokens of cache */
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    const kv_model *m = kv_engine_model(e);
    int ctx = m->hp.ctx_len;
    int32_t *big = calloc((size_t)ctx + 8, sizeof *big);
    for (int i = 0; i < ctx + 8; i++) big[i] = 300 + i % 100;
    struct {
        const char *what;
        int n_tokens, max_tokens, bad_id, bad_temp, empty_stop;
        int code;
        const char *needle;
    } cases[] = {
        {"empty", 0, 8, 0, 0, 0, KV_ERR_INVAL, "empty prompt"},
        {"over context", ctx + 1, 8, 0, 0, 0, KV_ERR_RANGE, "exceeds the context"},
        {"prompt+max over context", ctx - 4, 8, 0, 0, 0, KV_ERR_RANGE, "max_tokens (8) exceeds the context"},
        {"over the cache", 100, 40, 0, 0, 0, KV_ERR_RANGE, "the cache has 8"},
        {"bad id", 5, 8, 1, 0, 0, KV_ERR_RANGE, "outside the vocabulary"},
        {"bad sampling", 5, 8, 0, 1, 0, KV_ERR_INVAL, "temperature"},
        {"bad stop", 5, 8, 0, 0, 1, KV_ERR_INVAL, "stop string"},
        {"max_tokens 0", 5, 0, 0, 0, 0, KV_ERR_INVAL, "max_tokens"},
    };
    int n = (int)KV_ARRAY_LEN(cases);
    for (int i = 0; i < n; i++) {
        kv_request_params p;
        kv_engine_request_defaults(e, &p);
        int32_t ids[8] = {1, 403, 407, 261, 378};
        if (cases[i].bad_id) ids[2] = 512;
        p.tokens = cases[i].n_tokens > 5 ? big : ids;
        p.n_tokens = cases[i].n_tokens;
        p.max_tokens = cases[i].max_tokens;
        p.session = 7;
        if (cases[i].bad_temp) p.sampling.temperature = -1;
        const char *stops[] = {""};
        if (cases[i].empty_stop) {
            p.stop = stops;
            p.n_stop = 1;
        }
        kv_err err;
        int64_t rc = kv_engine_submit(e, &p, &err);
        CHECKF(rc == cases[i].code, "%s: rc %lld", cases[i].what, (long long)rc);
        CHECKF(strstr(err.msg, cases[i].needle) != NULL, "%s: '%s'", cases[i].what, err.msg);
    }
    /* each rejection is a DONE event with the reason, under its session */
    seen other[16];
    memset(other, 0, sizeof other);
    kv_event ev[32];
    int k = kv_engine_poll(e, ev, 32);
    CHECK(k == n);
    for (int i = 0; i < k; i++) {
        CHECK(ev[i].type == KV_EVENT_DONE && ev[i].finish == KV_FINISH_REJECTED && ev[i].session == 7);
        CHECK(ev[i].queue_ms < 0 && ev[i].e2e_ms < 0 && ev[i].n_prefix_hit == 0 && ev[i].preemptions == 0);
        CHECKF(strstr(ev[i].reason, cases[i].needle) != NULL, "event %d: '%s'", i, ev[i].reason);
        CHECK(ev[i].req > 0);
    }
    /* a good request still runs, and the rejections are counted */
    int64_t id = submit_ids(e, prompt_ids, 5, 4, 1);
    CHECK(id > 0);
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_metrics_summary ms;
    kv_engine_metrics(e, &ms);
    CHECK(ms.requests_rejected == (uint64_t)n);
    CHECK(ms.requests_submitted == (uint64_t)n + 1 && ms.requests_completed == 1);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s);
    CHECK(kv_engine_snapshot(e, s) == 0);
    int rejects = 0;
    for (int i = 0; i < s->n_decisions; i++) rejects += s->decisions[i].kind == KV_DEC_REJECT;
    CHECK(rejects == n);
    kv_snapshot_free(s);
    free(big);
    kv_engine_free(e);

    /* contiguous layout: a context larger than the cache fits nobody */
    base_config(&c);
    c.kv.blocks = 8;
    c.kv.layout = KV_LAYOUT_CONTIGUOUS;
    e = test_engine_new(&c);
    REQUIRE(e);
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = prompt_ids;
    p.n_tokens = 5;
    p.max_tokens = 4;
    kv_err err;
    CHECK(kv_engine_submit(e, &p, &err) == KV_ERR_RANGE && strstr(err.msg, "contiguous") != NULL);
    kv_engine_free(e);
}

/* Many requests, random lengths, cancellations, a cache small enough to
 * preempt: every id ends with exactly one DONE, token events match. */
static void test_never_loses_a_request(void) {
    for (int mode = 0; mode < 2; mode++) {
        kv_config c;
        base_config(&c);
        c.kv.blocks = 12;
        c.scheduler.max_seqs = 8;
        c.scheduler.prefill_chunk = 16;
        if (mode) {
            c.scheduler.preemption = KV_PREEMPT_SWAP;
            c.kv.swap_memory = 64ull << 20;
        }
        kv_engine *e = test_engine_new(&c);
        REQUIRE(e);
        enum { N = 40 };
        seen *s = calloc(N, sizeof *s);
        seen other = {0};
        uint64_t rng = 99 + (uint64_t)mode;
        int cancelled = 0;
        for (int i = 0; i < N; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int np = 2 + (int)((rng >> 40) % 30), mt = 1 + (int)((rng >> 20) % 40);
            int32_t ids[64];
            ids[0] = 1;
            for (int j = 1; j < np; j++) ids[j] = 3 + (int)(((rng >> (j % 30)) + (uint64_t)j * 7) % 500);
            s[i].id = submit_ids(e, ids, np, mt, 1);
            CHECK(s[i].id > 0);
            if (i % 3 == 0) kv_engine_step(e);
            if (i % 7 == 3) cancelled += kv_engine_cancel(e, s[i - 2].id) == 0;
            drain(e, s, N, &other);
        }
        CHECK(kv_engine_run_until_idle(e) == 0);
        drain(e, s, N, &other);
        int n_cancel = 0;
        for (int i = 0; i < N; i++) {
            CHECKF(s[i].n_done == 1, "mode %d: #%lld has %d DONE events", mode, (long long)s[i].id, s[i].n_done);
            if (s[i].finish == KV_FINISH_CANCELLED) {
                n_cancel++;
                continue;
            }
            CHECKF(s[i].finish == KV_FINISH_LENGTH, "mode %d: #%lld finish %d", mode, (long long)s[i].id,
                   s[i].finish);
        }
        CHECK(n_cancel <= cancelled);
        CHECK(other.n_done == 0);
        kv_metrics_summary ms;
        kv_engine_metrics(e, &ms);
        CHECK(ms.requests_completed + ms.requests_cancelled == N);
        CHECKF(ms.preemptions > 0, "mode %d: no preemption happened", mode);
        if (mode) CHECK(ms.swaps_out > 0);
        /* everything went back to the pool */
        kv_snapshot *sn = kv_snapshot_new();
        CHECK(kv_engine_snapshot(e, sn) == 0);
        CHECK(sn->blocks_used == 0 && sn->n_running == 0 && sn->n_waiting == 0);
        kv_snapshot_free(sn);
        free(s);
        kv_engine_free(e);
    }
}

static void test_cancel(void) {
    kv_config c;
    base_config(&c);
    c.scheduler.max_seqs = 1;
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int64_t a = submit_ids(e, prompt_ids, 5, 50, 1);
    int64_t b = submit_ids(e, prompt_ids, 5, 50, 1);
    CHECK(kv_engine_step(e) == 1);
    CHECK(kv_engine_step(e) == 1);
    CHECK(kv_engine_cancel(e, a) == 0); /* running */
    CHECK(kv_engine_cancel(e, b) == 0); /* waiting */
    CHECK(kv_engine_cancel(e, 12345) == KV_ERR_INVAL);
    CHECK(kv_engine_run_until_idle(e) == 0);
    CHECK(kv_engine_cancel(e, a) == KV_ERR_INVAL); /* finished */
    seen s[2] = {{.id = a}, {.id = b}};
    drain(e, s, 2, NULL);
    CHECK(s[0].n_done == 1 && s[0].finish == KV_FINISH_CANCELLED && s[0].n_tokens == 2);
    CHECK(s[1].n_done == 1 && s[1].finish == KV_FINISH_CANCELLED && s[1].n_tokens == 0);
    kv_snapshot *sn = kv_snapshot_new();
    CHECK(kv_engine_snapshot(e, sn) == 0);
    CHECK(sn->blocks_used == 0);
    int found = 0;
    for (int i = 0; i < sn->n_decisions; i++) found += sn->decisions[i].kind == KV_DEC_CANCEL;
    CHECK(found == 2);
    kv_snapshot_free(sn);
    kv_engine_free(e);
}

static void test_stop_strings(void) {
    kv_config c;
    base_config(&c);
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int64_t id = submit_ids(e, prompt_ids, 5, 36, 1);
    CHECK(kv_engine_run_until_idle(e) == 0);
    char full[4096];
    int len = kv_engine_request_text(e, id, full, sizeof full);
    REQUIRE(len > 40);
    /* stop at a word in the middle of the reply */
    const char *cut = full + 20;
    char stop[8];
    memcpy(stop, cut, 5);
    stop[5] = 0;
    const char *first = strstr(full, stop);
    REQUIRE(first);
    size_t expect = (size_t)(first - full);
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = prompt_ids;
    p.n_tokens = 5;
    p.max_tokens = 36;
    p.ignore_eos = 1;
    const char *stops[] = {"no such string at all", stop};
    p.stop = stops;
    p.n_stop = 2;
    int64_t id2 = kv_engine_submit(e, &p, NULL);
    REQUIRE(id2 > 0);
    CHECK(kv_engine_run_until_idle(e) == 0);
    seen s[2] = {{.id = id}, {.id = id2}};
    drain(e, s, 2, NULL);
    CHECK(s[1].finish == KV_FINISH_STOP);
    char got[4096];
    int len2 = kv_engine_request_text(e, id2, got, sizeof got);
    CHECKF(len2 == (int)expect && memcmp(got, full, expect) == 0, "got %d bytes '%s', want %zu", len2, got, expect);
    /* the streamed text never showed the stop string */
    CHECK(s[1].text_len == len2 && strstr(s[1].text, stop) == NULL);
    kv_engine_free(e);
}

static void test_thread_controls(void) {
    kv_config c;
    base_config(&c);
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    CHECK(kv_engine_start(e) == 0);
    CHECK(kv_engine_step(e) == KV_ERR_INVAL); /* the thread owns the loop */
    kv_engine_pause(e);
    int64_t id = submit_ids(e, prompt_ids, 5, 20, 1);
    usleep(20000);
    kv_event ev[64];
    CHECK(kv_engine_poll(e, ev, 64) == 0); /* paused: nothing ran */
    kv_snapshot *sn = kv_snapshot_new();
    CHECK(kv_engine_snapshot(e, sn) == 0);
    CHECK(sn->paused == 1 && sn->thread_running == 1 && sn->n_waiting == 1 && sn->step == 0);
    /* single steps: prefill, then one token per step */
    kv_engine_step_once(e);
    CHECK(kv_engine_wait(e, 2000) == 1);
    int k = kv_engine_poll(e, ev, 64);
    CHECK(k == 1 && ev[0].type == KV_EVENT_TOKEN && ev[0].req == id);
    kv_engine_step_once(e);
    CHECK(kv_engine_wait(e, 2000) == 1);
    CHECK(kv_engine_poll(e, ev, 64) == 1);
    CHECK(kv_engine_snapshot(e, sn) == 0);
    CHECKF(sn->step == 2 && sn->n_running == 1, "step %llu, running %d", (unsigned long long)sn->step,
           sn->n_running);
    kv_engine_resume(e);
    CHECK(kv_engine_run_until_idle(e) == 0);
    seen s = {.id = id};
    drain(e, &s, 1, NULL);
    CHECK(s.n_done == 1 && s.n_tokens == 18);
    /* slow motion: a step delay spaces the steps out */
    kv_engine_set_step_delay(e, 30);
    double t0 = kv_now_s();
    submit_ids(e, prompt_ids, 5, 5, 1);
    CHECK(kv_engine_run_until_idle(e) == 0);
    CHECK(kv_now_s() - t0 > 0.1);
    kv_engine_stop(e);
    CHECK(kv_engine_snapshot(e, sn) == 0);
    CHECK(sn->thread_running == 0);
    /* snapshots while the thread runs flat out stay consistent */
    kv_engine_set_step_delay(e, 0);
    CHECK(kv_engine_start(e) == 0);
    for (int i = 0; i < 8; i++) submit_ids(e, prompt_ids, 5, 60, 1);
    int snaps = 0;
    for (int i = 0; i < 200; i++) {
        CHECK(kv_engine_snapshot(e, sn) == 0);
        snaps++;
        for (int r = 0; r < sn->n_requests; r++)
            CHECK(sn->requests[r].table_offset + sn->requests[r].n_blocks <= sn->n_table_entries);
        if (sn->n_running == 0 && sn->n_waiting == 0 && sn->step > 0) break;
        usleep(1000);
    }
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_snapshot_free(sn);
    kv_engine_free(e); /* stops the thread */
}

static void test_snapshot_contents(void) {
    kv_config c;
    base_config(&c);
    c.kv.blocks = 64;
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int32_t sys[40];
    for (int i = 0; i < 40; i++) sys[i] = i == 0 ? 1 : 300 + i;
    int64_t a = submit_ids(e, sys, 40, 30, 1);
    kv_engine_step(e);
    int64_t b = submit_ids(e, sys, 40, 30, 1); /* shares 2 full blocks */
    kv_engine_step(e);
    kv_engine_step(e);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(kv_engine_snapshot(e, s) == 0);
    CHECK(s->n_blocks == 64 && s->block_size == 16 && s->prefix_sharing == 1);
    CHECK(strcmp(s->backend, "cpu") == 0);
    CHECK(s->n_running == 2 && s->running[0] == a && s->running[1] == b);
    CHECK(s->blocks_shared == 2);
    int rows = 0;
    for (int i = 0; i < s->n_requests; i++) {
        const kv_snap_request *r = &s->requests[i];
        if (r->state != KV_REQ_RUNNING) continue;
        rows++;
        CHECK(r->n_blocks == (r->n_computed + 15) / 16 || r->n_blocks == (r->n_computed + 16) / 16);
        for (int j = 0; j < r->n_blocks; j++) {
            int blk = s->tables[r->table_offset + j];
            CHECK(blk >= 0 && blk < s->n_blocks);
            CHECK(s->blocks[blk].state == KV_BLOCK_USED);
            if (j < 2) CHECK(s->blocks[blk].shared && s->blocks[blk].refcount == 2);
        }
        CHECK(r->next_block == s->tables[r->table_offset + r->n_computed / 16]);
        if (r->id == b) CHECK(r->n_prefix_hit == 32);
        CHECK(r->ttft_ms >= 0 && r->queue_ms >= 0);
    }
    CHECK(rows == 2);
    CHECK(s->n_steps == 3 && s->steps[0].n_prefill_tokens == 40 && s->steps[1].n_prefill_tokens == 8);
    CHECK(s->steps[1].n_decode_tokens == 1 && s->steps[2].n_decode_tokens == 2);
    int share = 0, admit = 0;
    for (int i = 0; i < s->n_decisions; i++) {
        share += s->decisions[i].kind == KV_DEC_SHARE;
        admit += s->decisions[i].kind == KV_DEC_ADMIT;
    }
    CHECK(share == 1 && admit == 2);
    CHECK(s->mem.weights > 0 && s->mem.activations > 0 && s->mem.kv_used == 3ull * 2 * 0 + s->mem.kv_used);
    CHECK(s->mem.kv_used + s->mem.kv_cached + s->mem.kv_free == 64 * (s->kv_bytes_per_token * 16));
    CHECK(kv_engine_run_until_idle(e) == 0);
    REQUIRE(kv_engine_snapshot(e, s) == 0);
    CHECK(s->n_running == 0 && s->blocks_used == 0 && s->blocks_cached > 0);
    int fin = 0;
    for (int i = 0; i < s->n_requests; i++)
        if (s->requests[i].state == KV_REQ_FINISHED) {
            fin++;
            CHECK(s->requests[i].finish == KV_FINISH_LENGTH && s->requests[i].n_generated == 30);
            CHECK(s->requests[i].e2e_ms >= s->requests[i].ttft_ms && s->requests[i].tpot_ms > 0);
        }
    CHECK(fin == 2);
    /* tracing keeps every step */
    CHECK(kv_engine_trace_enable(e, 1) == 0);
    kv_snapshot_free(s);
    kv_engine_free(e);
}

static void test_metrics(void) {
    kv_config c;
    base_config(&c);
    c.sla.ttft_ms = 1e9;
    c.sla.tpot_ms = 1e9;
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = i == 0 ? 1 : 300 + i;
    submit_ids(e, ids, 40, 10, 1);
    kv_engine_step(e); /* its full blocks are in the cache before the others come */
    for (int i = 1; i < 6; i++) submit_ids(e, ids, 40, 10 + i, 1);
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_metrics_summary m;
    kv_engine_metrics(e, &m);
    CHECK(m.requests_completed == 6 && m.output_tokens == 10 + 11 + 12 + 13 + 14 + 15);
    CHECK(m.input_tokens == 240);
    /* the five later requests reuse the first's two full blocks */
    CHECKF(m.prefix_hit_tokens == 5 * 32 && m.prefill_tokens_computed == 40 + 5 * 8, "hit %llu, computed %llu",
           (unsigned long long)m.prefix_hit_tokens, (unsigned long long)m.prefill_tokens_computed);
    CHECK(fabs(m.prefix_hit_rate - 160.0 / 240.0) < 1e-9);
    CHECK(m.ttft_ms.valid && m.ttft_ms.n == 6 && m.ttft_ms.p50 <= m.ttft_ms.p99 && m.ttft_ms.p99 <= m.ttft_ms.max);
    CHECK(m.tpot_ms.valid && m.tpot_ms.n == 6 && m.itl_ms.n == (uint64_t)(m.output_tokens - 6));
    CHECK(m.e2e_ms.valid && m.e2e_ms.mean >= m.ttft_ms.mean);
    CHECK(m.output_tokens_per_s > 0 && m.requests_per_s > 0);
    /* the later steps only decode: their rate is above the whole run's */
    CHECKF(m.decode_step_tokens_per_s >= m.output_tokens_per_s, "decode steps %.1f, run %.1f",
           m.decode_step_tokens_per_s, m.output_tokens_per_s);
    CHECK(m.goodput_requests_per_s == m.requests_per_s && m.sla_attainment == 1.0);
    CHECK(m.kv_utilization > 0.2 && m.kv_utilization <= 1.0);
    CHECK(m.max_concurrent == 6);
    kv_engine_metrics_reset(e);
    kv_engine_metrics(e, &m);
    CHECK(m.requests_completed == 0 && m.output_tokens == 0 && !m.ttft_ms.valid);
    kv_engine_free(e);

    /* the decode-step rate counts only what kv_metrics_decode_step saw */
    kv_metrics *km = kv_metrics_new(0, 0);
    REQUIRE(km);
    kv_metrics_decode_step(km, 100.0, 32);
    kv_metrics_decode_step(km, 100.0, 32);
    kv_metrics_decode_step(km, 50.0, 0); /* nothing emitted: not a decode step */
    kv_metrics_step(km, 500.0, 0, 0, 32, 4096);
    CHECK(kv_metrics_summarize(km, 1000.0, 0, &m) == 0);
    CHECKF(fabs(m.decode_step_tokens_per_s - 320.0) < 1e-9, "%.3f", m.decode_step_tokens_per_s);
    kv_metrics_free(km);

    /* an impossible SLA: nothing is good */
    base_config(&c);
    c.sla.ttft_ms = 1e-6;
    e = test_engine_new(&c);
    REQUIRE(e);
    submit_ids(e, prompt_ids, 5, 3, 1);
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_engine_metrics(e, &m);
    CHECK(m.requests_completed == 1 && m.goodput_requests_per_s == 0 && m.sla_attainment == 0);
    kv_engine_free(e);
}

/* A chat model ends its turn with an end-of-generation token: the request
 * finishes with EOS, and the token's text never reaches the reply. */
static void test_smollm2_chat_eos(void) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK) != 0) {
        CHECKF(0, "%s missing: run `make models`", path);
        return;
    }
    kv_config c;
    base_config(&c);
    snprintf(c.model.path, sizeof c.model.path, "%s", path);
    c.kv.blocks = 32;
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital "
             "of France?<|im_end|>\n<|im_start|>assistant\n";
    p.parse_special = 1; /* a trusted raw prompt: its markers are control tokens */
    p.max_tokens = 48;
    seen s;
    REQUIRE(run_alone(e, &p, &s) == 0);
    CHECKF(s.finish == KV_FINISH_EOS && s.n_tokens < 48, "finish %d after %d tokens", s.finish, s.n_tokens);
    CHECK(s.n_tokens > 0 && kv_tokenizer_is_eog(kv_engine_model(e)->tok, s.toks[s.n_tokens - 1]));
    CHECKF(strstr(s.text, "Paris") != NULL && strstr(s.text, "<|im_end|>") == NULL, "'%s'", s.text);
    kv_engine_free(e);
}

static void test_bad_config(void) {
    kv_config c;
    base_config(&c);
    snprintf(c.model.path, sizeof c.model.path, "/nonexistent/model.gguf");
    kv_err err;
    CHECK(kv_engine_new(&c, &err) == NULL && err.code != 0);
    base_config(&c);
    c.scheduler.max_seqs = -1;
    CHECK(kv_engine_new(&c, &err) == NULL && strstr(err.msg, "max_seqs") != NULL);
    base_config(&c);
    c.scheduler.max_seqs = KV_KEY_AUTO_VALUE; /* auto: a ceiling, not a count */
    kv_engine *e = kv_engine_new(&c, &err);
    CHECKF(e != NULL, "%s", err.msg);
    kv_engine_free(e);
    base_config(&c);
    c.kv.blocks = 0;
    c.kv.memory = 100; /* less than a block */
    CHECK(kv_engine_new(&c, &err) == NULL && strstr(err.msg, "kv.memory") != NULL);
    CHECK(kv_engine_new(NULL, &err) == NULL);
    kv_engine_free(NULL);
    kv_snapshot_free(NULL);
    CHECK(kv_engine_submit(NULL, NULL, &err) == KV_ERR_INVAL);
}

TEST_MAIN(T(test_golden_greedy), T(test_text_prompt), T(test_done_event_figures), T(test_rejections), T(test_watermark_rejection), T(test_never_loses_a_request),
          T(test_cancel), T(test_stop_strings), T(test_thread_controls), T(test_snapshot_contents),
          T(test_metrics), T(test_smollm2_chat_eos), T(test_bad_config))
