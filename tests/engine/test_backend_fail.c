/* test_backend_fail.c - a backend op that fails is seen: a test backend
 * wraps the cpu backend's table and makes one op fail at its N-th call
 * (recorded for ops.status, as a real backend records a failed launch).
 * The forward pass returns KV_ERR_BACKEND naming the op; the engine ends the
 * requests of that batch with KV_FINISH_ERROR and that reason, releases
 * their blocks, counts them, and keeps serving: later requests get the same
 * greedy text as on a healthy engine, and nothing is lost. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/engine.h"
#include "../../engine/forward.h"
#include "../../engine/model.h"
#include "../../engine/runner.h"
#include "../../kernels/backend.h"
#include "../../kernels/types.h"
#include "../backend_helpers.h"
#include "../engine_helpers.h"
#include "../harness.h"

/* ---- the failing backend ---------------------------------------------------- */

/* Which op fails, when, and what was seen. */
typedef struct fail_ctx {
    kv_backend *inner;  /* the cpu backend that computes */
    const char *op;     /* name of the op that fails ("matmul"), NULL: none */
    int at;             /* fail the at-th call of op from now (1 = the next) */
    int calls;          /* calls of op since armed */
    int failures;       /* failures injected so far */
    char err[128];      /* the injected failure not yet reported ("" none) */
} fail_ctx;

static fail_ctx *fc(kv_backend *b) { return (fail_ctx *)b->ctx; }
static kv_backend *in(kv_backend *b) { return fc(b)->inner; }

/* 1 when this call of op is the one to fail (and records it). */
static int fails(kv_backend *b, const char *op) {
    fail_ctx *c = fc(b);
    if (!c->op || strcmp(c->op, op) || ++c->calls != c->at) return 0;
    c->failures++;
    c->op = NULL;
    if (!c->err[0]) snprintf(c->err, sizeof c->err, "%s: injected failure (call %d)", op, c->calls);
    return 1;
}

static void arm(kv_backend *b, const char *op, int at) {
    fc(b)->op = op;
    fc(b)->at = at;
    fc(b)->calls = 0;
}

static void *f_alloc(kv_backend *b, size_t n) { return in(b)->ops->alloc(in(b), n); }
static void f_free(kv_backend *b, void *p) { in(b)->ops->free(in(b), p); }
static void f_upload(kv_backend *b, void *d, const void *s, size_t n) { in(b)->ops->upload(in(b), d, s, n); }
static void f_download(kv_backend *b, void *d, const void *s, size_t n) { in(b)->ops->download(in(b), d, s, n); }
static int f_upload_weight(kv_backend *b, kv_tensor *w, kv_err *err) {
    return in(b)->ops->upload_weight(in(b), w, err);
}
/* A failing matmul leaves its output as a device would: not written. */
static void f_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n) {
    if (!fails(b, "matmul")) in(b)->ops->matmul(in(b), w, x, y, n);
}
static void f_get_rows(kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n) {
    in(b)->ops->get_rows(in(b), w, ids, out, n);
}
static void f_rmsnorm(kv_backend *b, const float *x, const float *w, float *out, int n, int dim, float eps) {
    in(b)->ops->rmsnorm(in(b), x, w, out, n, dim, eps);
}
static void f_rope(kv_backend *b, float *x, const int32_t *pos, int n, int nh, int hd, int rot, float base, int neox) {
    in(b)->ops->rope(in(b), x, pos, n, nh, hd, rot, base, neox);
}
static void f_silu_mul(kv_backend *b, float *g, const float *u, int64_t n) { in(b)->ops->silu_mul(in(b), g, u, n); }
static void f_add(kv_backend *b, float *x, const float *y, int64_t n) { in(b)->ops->add(in(b), x, y, n); }
static void f_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                       const float *v) {
    in(b)->ops->kv_store(in(b), kv, layer, ab, k, v);
}
static void f_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                        float *out, int n_heads, float scale) {
    if (!fails(b, "attention")) in(b)->ops->attention(in(b), kv, layer, ab, q, out, n_heads, scale);
}
static void f_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) { in(b)->ops->copy_block(in(b), kv, dst, src); }
static void f_mem_info(kv_backend *b, kv_backend_mem *out) { in(b)->ops->mem_info(in(b), out); }
static void f_destroy(kv_backend *b) {
    kv_backend_free(in(b));
    free(fc(b));
    free(b);
}
/* The injected failure first, then the inner backend's (read either way). */
static int f_status(kv_backend *b, kv_err *err) {
    kv_err e;
    kv_err_clear(&e);
    int rc = kv_backend_status(in(b), &e);
    if (fc(b)->err[0]) {
        kv_err_set(err, KV_ERR_BACKEND, "%s", fc(b)->err);
        fc(b)->err[0] = 0;
        return KV_ERR_BACKEND;
    }
    return rc ? kv_err_set(err, KV_ERR_BACKEND, "%s", e.msg) : 0;
}
static int f_reserve(kv_backend *b, const kv_backend_limits *lim, kv_err *err) {
    return kv_backend_reserve(in(b), lim, err);
}

static const kv_backend_ops fail_ops = {
    .name = "fail-test",
    .alloc = f_alloc,
    .free = f_free,
    .upload = f_upload,
    .download = f_download,
    .upload_weight = f_upload_weight,
    .matmul = f_matmul,
    .get_rows = f_get_rows,
    .rmsnorm = f_rmsnorm,
    .rope = f_rope,
    .silu_mul = f_silu_mul,
    .add = f_add,
    .kv_store = f_kv_store,
    .attention = f_attention,
    .copy_block = f_copy_block,
    .mem_info = f_mem_info,
    .destroy = f_destroy,
    .status = f_status,
    .reserve = f_reserve,
    .clock = NULL,
};

static kv_backend *fail_backend_new(int threads) {
    kv_err err = {0};
    kv_backend *inner = kv_backend_create("cpu", threads, &err);
    kv_backend *b = calloc(1, sizeof *b);
    fail_ctx *c = calloc(1, sizeof *c);
    if (!inner || !b || !c) {
        fprintf(stderr, "  fail backend: %s\n", err.msg);
        kv_backend_free(inner);
        free(b);
        free(c);
        return NULL;
    }
    c->inner = inner;
    b->ops = &fail_ops;
    b->ctx = c;
    b->n_threads = inner->n_threads;
    return b;
}

/* ---- the forward pass ---------------------------------------------------------- */

/* kv_forward_run (through a runner) returns KV_ERR_BACKEND with the op and
 * the backend's message; the next batch works and gives the healthy logits. */
static void test_forward_reports_op(void) {
    kv_err err = {0};
    kv_model *m = kv_model_load(harness_shared_path("models/stories260K.gguf"), NULL, &err);
    REQUIRE(m);
    kv_backend *b = fail_backend_new(1), *cpu = kv_backend_create("cpu", 1, &err);
    REQUIRE(b && cpu);
    kv_runner *r = kv_runner_new(m, b, 64, 16, KV_CACHE_F32, &err), *ref = kv_runner_new(m, cpu, 64, 16, KV_CACHE_F32, &err);
    REQUIRE(r && ref);
    const int32_t toks[] = {1, 403, 407, 261, 378};
    const int V = m->hp.n_vocab;
    float *lg = malloc((size_t)V * sizeof(float)), *lr = malloc((size_t)V * sizeof(float));
    REQUIRE(lg && lr);
    arm(b, "matmul", 3);
    int rc = kv_runner_eval(r, toks, 5, lg, NULL, &err);
    CHECKF(rc == KV_ERR_BACKEND, "rc %d", rc);
    CHECKF(strstr(err.msg, "forward: fail-test backend: matmul: injected failure") != NULL, "message: %s", err.msg);
    CHECK(fc(b)->failures == 1 && kv_runner_pos(r) == 0); /* nothing of the failed batch counts */
    CHECK(kv_backend_status(b, &err) == 0);                /* reported once */
    /* a direct forward: attention fails in the last layer */
    arm(b, "attention", m->hp.n_layers);
    rc = kv_runner_eval(r, toks, 5, lg, NULL, &err);
    CHECKF(rc == KV_ERR_BACKEND && strstr(err.msg, "attention"), "rc %d: %s", rc, err.msg);
    /* healthy again: the same logits as a backend that never failed */
    CHECK(kv_runner_eval(r, toks, 5, lg, NULL, &err) == 0);
    CHECK(kv_runner_eval(ref, toks, 5, lr, NULL, &err) == 0);
    CHECK(memcmp(lg, lr, (size_t)V * sizeof(float)) == 0);
    /* a forward built on a backend whose ops ask for more than was reserved
     * fails the same way, without wrong logits: the cpu backend's own check */
    kv_backend *small = kv_backend_create("cpu", 1, &err);
    REQUIRE(small);
    kv_forward *fw = kv_forward_new(m, small, 1, 1, &err); /* reserves for 1 row */
    REQUIRE(fw);
    kv_pages pg = {.dtype = KV_CACHE_F32, .n_layers = m->hp.n_layers, .n_kv_heads = m->hp.n_kv_heads,
                   .head_dim = m->hp.head_dim, .block_size = 16, .n_blocks = 1};
    kv_pages_set_sizes(&pg);
    pg.k = small->ops->alloc(small, pg.layer_bytes * (size_t)pg.n_layers);
    pg.v = small->ops->alloc(small, pg.layer_bytes * (size_t)pg.n_layers);
    REQUIRE(pg.k && pg.v);
    int32_t pos[1] = {0}, seq[1] = {0}, slot[1] = {0}, tab[1] = {0}, row[1] = {0};
    const int32_t *tabs[1] = {tab};
    kv_batch bt = {.n_tokens = 1, .tokens = toks, .ab = {1, pos, seq, slot, 1, tabs}, .n_logits = 1, .logit_rows = row};
    CHECK(kv_forward_run(fw, &pg, &bt, lg, &err) == 0);
    /* a matmul between batches with rows longer than the model's (more
     * scratch than the forward reserved): recorded, and the next forward
     * reports it rather than trusting its logits */
    const int K = 1024, M = 8;
    float *x = calloc((size_t)K, sizeof(float)), *y = malloc((size_t)M * sizeof(float));
    uint8_t *wq = calloc((size_t)M, kv_type_row_size(KV_TYPE_Q8_0, K));
    REQUIRE(x && y && wq);
    kv_tensor big = {.type = KV_TYPE_Q8_0, .ne0 = K, .ne1 = M, .nb1 = kv_type_row_size(KV_TYPE_Q8_0, K), .data = wq};
    small->ops->matmul(small, &big, x, y, 1);
    rc = kv_forward_run(fw, &pg, &bt, lg, &err);
    CHECKF(rc == KV_ERR_BACKEND && strstr(err.msg, "forward: cpu backend: matmul: "), "rc %d: %s", rc, err.msg);
    CHECK(kv_forward_run(fw, &pg, &bt, lg, &err) == 0);
    FREE_ALL(x, y, wq);
    TEST_DEV_FREE(small, pg.k, pg.v);
    kv_forward_free(fw);
    kv_backend_free(small);
    free(lg);
    free(lr);
    kv_runner_free(r);
    kv_runner_free(ref);
    kv_backend_free(b);
    kv_backend_free(cpu);
    kv_model_free(m);
}

/* ---- the engine ------------------------------------------------------------------ */

/* stories260K, greedy, f32 KV; 2 sequences at a time: of 4 requests two
 * run, two wait. */
static void base_config(kv_config *c) {
    test_engine_config(c, NULL, 1, 64, 2, 64);
    c->kv.dtype = KV_CACHE_F32;
    c->scheduler.prefill_chunk = 16;
    c->sampling.temperature = 0;
}

static const char *const prompts[4] = {"Once upon a time", "Tom and Lily", "The cat sat", "One day a little"};

typedef struct done_rec {
    int n_done;
    kv_finish finish;
    char reason[128];
} done_rec;

static int64_t submit(kv_engine *e, const char *text) { return test_submit(e, text, NULL, 0, 20, 1, 0); }

/* DONE events by id (ids are small and dense). */
static void drain(kv_engine *e, done_rec *d, int cap) {
    kv_event ev[64];
    int k;
    while ((k = kv_engine_poll(e, ev, 64)) > 0)
        for (int i = 0; i < k; i++)
            if (ev[i].type == KV_EVENT_DONE && ev[i].req > 0 && ev[i].req < cap) {
                done_rec *r = &d[ev[i].req];
                r->n_done++;
                r->finish = ev[i].finish;
                snprintf(r->reason, sizeof r->reason, "%s", ev[i].reason);
            }
}

/* Greedy replies of the four prompts on a healthy cpu engine. */
static void healthy_texts(char texts[4][512]) {
    kv_config c;
    base_config(&c);
    kv_err err;
    kv_engine *e = kv_engine_new(&c, &err);
    REQUIRE(e);
    int64_t ids[4];
    for (int i = 0; i < 4; i++) REQUIRE((ids[i] = submit(e, prompts[i])) > 0);
    CHECK(kv_engine_run_until_idle(e) == 0);
    for (int i = 0; i < 4; i++) CHECK(kv_engine_request_text(e, ids[i], texts[i], 512) > 0);
    kv_engine_free(e);
}

static void test_engine_keeps_serving(void) {
    char want[4][512];
    healthy_texts(want);
    kv_config c;
    base_config(&c);
    kv_err err;
    kv_backend *b = fail_backend_new(1);
    REQUIRE(b);
    kv_engine *e = kv_engine_new_with_backend(&c, b, &err); /* takes b */
    REQUIRE(e);
    CHECK(kv_engine_backend(e) == b && !kv_engine_clock_is_virtual(e));
    done_rec d[16];
    memset(d, 0, sizeof d);
    int64_t ids[4];
    for (int i = 0; i < 4; i++) REQUIRE((ids[i] = submit(e, prompts[i])) > 0);
    /* a few healthy steps: the first two prefill and start decoding */
    for (int s = 0; s < 3; s++) CHECK(kv_engine_step(e) == 1);
    kv_snapshot *snap = kv_snapshot_new();
    REQUIRE(snap);
    REQUIRE(kv_engine_snapshot(e, snap) == 0);
    int running_before = 0;
    for (int i = 0; i < snap->n_requests; i++) running_before += snap->requests[i].state == KV_REQ_RUNNING;
    CHECK(running_before == 2);
    /* one matmul of the next step fails: the step still counts as work, and
     * ends exactly the requests of its batch */
    arm(b, "matmul", 5);
    CHECK(kv_engine_step(e) == 1);
    CHECK(fc(b)->failures == 1);
    drain(e, d, 16);
    int errored = 0;
    for (int i = 0; i < 4; i++) {
        if (d[ids[i]].n_done == 0) continue;
        CHECK(d[ids[i]].n_done == 1 && d[ids[i]].finish == KV_FINISH_ERROR);
        CHECKF(strstr(d[ids[i]].reason, "matmul") && strstr(d[ids[i]].reason, "injected failure"), "reason: %s",
               d[ids[i]].reason);
        errored++;
    }
    CHECKF(errored == 2, "%d requests ended", errored);
    /* their blocks went back: the waiting two are admitted and finish */
    char msg[256];
    CHECKF(kv_engine_check(e, msg, sizeof msg) == 0, "%s", msg);
    int64_t later[4];
    for (int i = 0; i < 4; i++) REQUIRE((later[i] = submit(e, prompts[i])) > 0);
    CHECK(kv_engine_run_until_idle(e) == 0);
    drain(e, d, 16);
    CHECKF(kv_engine_check(e, msg, sizeof msg) == 0, "%s", msg);
    char got[512];
    for (int i = 0; i < 4; i++) {
        if (d[ids[i]].finish != KV_FINISH_ERROR) {
            /* it waited through the failure: the healthy reply */
            CHECK(d[ids[i]].n_done == 1 && d[ids[i]].finish == KV_FINISH_LENGTH);
            CHECK(kv_engine_request_text(e, ids[i], got, sizeof got) > 0);
            CHECKF(!strcmp(got, want[i]), "request %d: '%s' vs '%s'", i, got, want[i]);
        }
        /* submitted after the failure: the healthy reply */
        CHECK(d[later[i]].n_done == 1 && d[later[i]].finish == KV_FINISH_LENGTH);
        CHECK(kv_engine_request_text(e, later[i], got, sizeof got) > 0);
        CHECKF(!strcmp(got, want[i]), "later %d: '%s' vs '%s'", i, got, want[i]);
    }
    /* nothing lost: every request is counted once, the errors too */
    kv_metrics_summary ms;
    kv_engine_metrics(e, &ms);
    CHECKF(ms.requests_submitted == 8 && ms.requests_errored == 2 && ms.requests_completed == 6 &&
               ms.requests_cancelled == 0 && ms.requests_rejected == 0,
           "submitted %llu completed %llu errored %llu", (unsigned long long)ms.requests_submitted,
           (unsigned long long)ms.requests_completed, (unsigned long long)ms.requests_errored);
    CHECK(ms.requests_completed + ms.requests_cancelled + ms.requests_rejected + ms.requests_errored ==
          ms.requests_submitted);
    REQUIRE(kv_engine_snapshot(e, snap) == 0);
    CHECK(snap->blocks_used == 0);
    CHECK(snap->metrics.requests_errored == 2);
    kv_snapshot_free(snap);
    kv_engine_free(e); /* frees b */
}

/* A backend given to kv_engine_new_with_backend belongs to the engine even
 * when creation fails. */
static void test_with_backend_owns(void) {
    kv_config c;
    base_config(&c);
    snprintf(c.model.path, sizeof c.model.path, "%s", "/nonexistent/model.gguf");
    kv_err err = {0};
    CHECK(kv_engine_new_with_backend(&c, fail_backend_new(1), &err) == NULL && err.code != 0);
    CHECK(kv_engine_new_with_backend(&c, NULL, &err) == NULL && err.code == KV_ERR_INVAL);
}

TEST_MAIN(T(test_forward_reports_op), T(test_engine_keeps_serving), T(test_with_backend_owns))
