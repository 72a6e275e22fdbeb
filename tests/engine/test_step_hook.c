/* test_step_hook.c - kv_engine_set_step_hook on stories260K: the hook sees
 * every step exactly once and in order, with its own step record in the
 * snapshot, on the thread that ran the step (kv_engine_step's caller or the
 * background thread, paused single steps included); removing the hook
 * waits for a call in flight and stops the calls. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/engine.h"
#include "../engine_helpers.h"
#include "../harness.h"

enum { MAX_SEEN = 8192 };

/* What the hook saw. Written by the hook only; read after the hook is
 * removed (no call in flight then), except the atomics. */
typedef struct hook_log {
    atomic_int calls;
    atomic_int in_call;           /* bool: a call is running now */
    uint64_t steps[MAX_SEEN];     /* s->step of each call */
    int bad_record;               /* calls whose newest step record is not s->step */
    int wrong_thread;             /* calls on another thread than `want` (when want_set) */
    int other_thread;             /* calls on the thread `want` (when want_other) */
    pthread_t want;
    int want_set, want_other;
    int sleep_us;                 /* slow hook: keeps a call in flight */
} hook_log;

static void hook(void *user, const kv_snapshot *s) {
    hook_log *h = user;
    atomic_store(&h->in_call, 1);
    int i = atomic_load(&h->calls);
    if (i < MAX_SEEN) h->steps[i] = s->step;
    if (!s->n_steps || s->steps[s->n_steps - 1].step != s->step) h->bad_record++;
    if (h->want_set && !pthread_equal(pthread_self(), h->want)) h->wrong_thread++;
    if (h->want_other && pthread_equal(pthread_self(), h->want)) h->other_thread++;
    if (h->sleep_us) usleep((useconds_t)h->sleep_us);
    atomic_store(&h->in_call, 0);
    atomic_fetch_add(&h->calls, 1);
}

static kv_engine *make(void) {
    kv_config c;
    test_engine_config(&c, NULL, 1, 128, 8, 64);
    c.scheduler.prefill_chunk = 16; /* several prefill steps */
    c.sampling.temperature = 0;
    return test_engine_new(&c);
}

static void submit(kv_engine *e, int prompt, int max_tokens) {
    int32_t ids[64];
    for (int i = 0; i < prompt && i < 64; i++) ids[i] = i == 0 ? 1 : 300 + i;
    test_submit(e, NULL, ids, prompt, max_tokens, 1, 0); /* prints why when refused */
}

static uint64_t engine_step_no(kv_engine *e) {
    kv_snapshot *s = kv_snapshot_new();
    uint64_t n = s && kv_engine_snapshot(e, s) == 0 ? s->step : 0;
    kv_snapshot_free(s);
    return n;
}

/* Calls steps[0..n) are first, first+1, ... */
static int consecutive(const hook_log *h, int n, uint64_t first) {
    for (int i = 0; i < n && i < MAX_SEEN; i++)
        if (h->steps[i] != first + (uint64_t)i) {
            fprintf(stderr, "  call %d saw step %llu, want %llu\n", i, (unsigned long long)h->steps[i],
                    (unsigned long long)(first + (uint64_t)i));
            return 0;
        }
    return 1;
}

static void test_caller_thread(void) {
    CHECK(kv_engine_set_step_hook(NULL, hook, NULL) == KV_ERR_INVAL);
    kv_engine *e = make();
    REQUIRE(e);
    hook_log *h = calloc(1, sizeof *h);
    REQUIRE(h);
    h->want = pthread_self();
    h->want_set = 1;
    CHECK(kv_engine_set_step_hook(e, hook, h) == 0);
    CHECK(kv_engine_step(e) == 0 && atomic_load(&h->calls) == 0); /* nothing to do: no call */
    submit(e, 40, 12);
    submit(e, 9, 20);
    int worked = 0, rc;
    while ((rc = kv_engine_step(e)) > 0) {
        worked++;
        CHECK(atomic_load(&h->calls) == worked); /* synchronous: the call is over when step returns */
    }
    CHECK(rc == 0);
    uint64_t last = engine_step_no(e);
    CHECKF(worked > 15 && last == (uint64_t)worked, "%d steps worked, engine at step %llu", worked,
           (unsigned long long)last);
    CHECK(consecutive(h, atomic_load(&h->calls), 1));
    CHECK(h->bad_record == 0 && h->wrong_thread == 0);
    /* removed: steps go on without calls */
    CHECK(kv_engine_set_step_hook(e, NULL, NULL) == 0);
    submit(e, 5, 6);
    CHECK(kv_engine_run_until_idle(e) == 0);
    CHECK(atomic_load(&h->calls) == worked && engine_step_no(e) > last);
    /* set again: numbering continues from the engine's counter */
    int before = atomic_load(&h->calls);
    uint64_t at = engine_step_no(e);
    CHECK(kv_engine_set_step_hook(e, hook, h) == 0);
    CHECK(kv_engine_set_step_hook(e, hook, h) == 0); /* replacing keeps one hook */
    submit(e, 5, 4);
    CHECK(kv_engine_run_until_idle(e) == 0);
    CHECK(kv_engine_set_step_hook(e, NULL, NULL) == 0);
    int n = atomic_load(&h->calls) - before;
    CHECK(n > 0 && (uint64_t)n == engine_step_no(e) - at);
    for (int i = 0; i < n; i++) CHECK(h->steps[before + i] == at + 1 + (uint64_t)i);
    kv_engine_free(e);
    free(h);
}

static void test_background_thread(void) {
    kv_engine *e = make();
    REQUIRE(e);
    hook_log *h = calloc(1, sizeof *h);
    REQUIRE(h);
    h->want = pthread_self();
    h->want_other = 1; /* the engine thread, not this one */
    CHECK(kv_engine_set_step_hook(e, hook, h) == 0);
    CHECK(kv_engine_start(e) == 0);
    for (int i = 0; i < 6; i++) submit(e, 10 + 7 * i, 30 + i);
    CHECK(kv_engine_run_until_idle(e) == 0);
    /* run_until_idle returns once the last request finished, inside the
     * last step: stopping the thread lets that step (and its call) end. */
    kv_engine_stop(e);
    CHECK(atomic_load(&h->in_call) == 0);
    int n = atomic_load(&h->calls);
    uint64_t last = engine_step_no(e);
    CHECKF(n > 30 && (uint64_t)n == last, "%d calls, engine at step %llu", n, (unsigned long long)last);
    CHECK(consecutive(h, n, 1));
    CHECK(h->bad_record == 0 && h->other_thread == 0);

    /* paused: one call per single step */
    kv_engine_pause(e);
    CHECK(kv_engine_start(e) == 0);
    submit(e, 20, 8);
    usleep(20000);
    CHECK(atomic_load(&h->calls) == n); /* paused: nothing ran */
    for (int k = 1; k <= 3; k++) {
        kv_engine_step_once(e);
        for (int i = 0; i < 400 && atomic_load(&h->calls) < n + k; i++) usleep(5000);
        usleep(20000); /* a second call would come now */
        CHECKF(atomic_load(&h->calls) == n + k, "single step %d: %d calls", k, atomic_load(&h->calls) - n);
    }
    CHECK(kv_engine_set_step_hook(e, NULL, NULL) == 0);
    CHECK(consecutive(h, n + 3, 1));
    kv_engine_resume(e);
    CHECK(kv_engine_run_until_idle(e) == 0);

    /* removing a slow hook while the thread runs flat out: on return no
     * call is in flight, and none comes after */
    h->sleep_us = 2000;
    int at = atomic_load(&h->calls);
    CHECK(kv_engine_set_step_hook(e, hook, h) == 0);
    for (int i = 0; i < 4; i++) submit(e, 8, 200);
    for (int i = 0; i < 2500 && atomic_load(&h->calls) < at + 5; i++) usleep(2000);
    CHECK(kv_engine_set_step_hook(e, NULL, NULL) == 0);
    CHECK(atomic_load(&h->in_call) == 0);
    int frozen = atomic_load(&h->calls);
    CHECK(frozen >= at + 5);
    usleep(30000);
    CHECK(atomic_load(&h->calls) == frozen);
    uint64_t first = h->steps[at];
    for (int i = at; i < frozen; i++) CHECK(h->steps[i] == first + (uint64_t)(i - at));
    CHECK(h->bad_record == 0 && h->other_thread == 0);
    kv_engine_free(e); /* stops the thread mid-run */
    free(h);
}

/* Setting and removing the hook from two threads while steps run: every
 * step finds either no hook or a hook with its snapshot (a race here once
 * left a hook without one). */
typedef struct race {
    kv_engine *e;
    atomic_int stop;
    hook_log *h;
} race;

static void *race_set(void *p) {
    race *r = p;
    while (!atomic_load(&r->stop)) kv_engine_set_step_hook(r->e, hook, r->h);
    return NULL;
}

static void *race_clear(void *p) {
    race *r = p;
    while (!atomic_load(&r->stop)) kv_engine_set_step_hook(r->e, NULL, NULL);
    return NULL;
}

static void test_set_clear_race(void) {
    race r = {.e = make(), .h = calloc(1, sizeof(hook_log))};
    REQUIRE(r.e && r.h);
    pthread_t a, b;
    REQUIRE(pthread_create(&a, NULL, race_set, &r) == 0);
    REQUIRE(pthread_create(&b, NULL, race_clear, &r) == 0);
    int steps = 0;
    for (int k = 0; k < 20000; k++) {
        int st = kv_engine_step(r.e);
        if (st == 0) submit(r.e, 4, 40);
        steps += st > 0;
    }
    atomic_store(&r.stop, 1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    kv_engine_set_step_hook(r.e, NULL, NULL);
    CHECK(steps > 0 && r.h->bad_record == 0);
    kv_engine_free(r.e);
    free(r.h);
}

/* A snapshot taken while a step runs is never older than one taken before
 * it, even when the engine ran steps with no reader around (nothing was
 * published then). */
static void test_snapshot_never_older(void) {
    kv_engine *e = make();
    REQUIRE(e);
    REQUIRE(kv_engine_start(e) == 0);
    for (int i = 0; i < 4; i++) submit(e, 20, 20);
    CHECK(kv_engine_run_until_idle(e) == 0);
    usleep(1200 * 1000); /* past the one-second reader window */
    kv_snapshot *a = kv_snapshot_new(), *b = kv_snapshot_new();
    REQUIRE(a && b);
    CHECK(kv_engine_snapshot(e, a) == 0 && a->step > 0);
    for (int i = 0; i < 8; i++) submit(e, 60, 8);
    int older = 0;
    for (int k = 0; k < 2000; k++) {
        CHECK(kv_engine_snapshot(e, b) == 0);
        older += b->step < a->step;
    }
    CHECKF(older == 0, "%d of 2000 snapshots older than step %llu", older, (unsigned long long)a->step);
    kv_snapshot_free(a);
    kv_snapshot_free(b);
    kv_engine_free(e);
}

TEST_MAIN(T(test_caller_thread), T(test_background_thread), T(test_set_clear_race), T(test_snapshot_never_older))
