/* test_scheduler.c - the scheduler's decisions on a tiny paged cache with
 * the forward simulated: each scheduled token writes (token, position) into
 * its K slot, every committed position is read back through the block table
 * before the next step, and "sampling" is a fixed function of (request,
 * position), so outputs must not depend on batching, chunking, preemption or
 * swapping. The cache's and the scheduler's checkers run after every step. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/kv_cache.h"
#include "../../engine/scheduler.h"
#include "../harness.h"

/* ---- a host-memory backend with just what the block manager needs ---- */

static void *fb_alloc(kv_backend *b, size_t n) { return calloc(1, n ? n : 1); }
static void fb_free(kv_backend *b, void *p) { free(p); }
static void fb_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) {
    size_t blk = (size_t)kv->block_size * kv->slot_bytes;
    for (int l = 0; l < kv->n_layers; l++) {
        size_t base = (size_t)l * kv->layer_bytes;
        memcpy(kv->k + base + (size_t)dst * blk, kv->k + base + (size_t)src * blk, blk);
        memcpy(kv->v + base + (size_t)dst * blk, kv->v + base + (size_t)src * blk, blk);
    }
}
static const kv_backend_ops fb_ops = {.name = "fake", .alloc = fb_alloc, .free = fb_free,
                                      .copy_block = fb_copy_block};

/* ---- the simulation ---- */

enum { MAXR = 96 };

typedef struct sim {
    kv_backend be;
    kv_cache *c;
    kv_sched *s;
    kv_sreq *r[MAXR];
    int n;
    int done[MAXR];        /* finished */
    kv_finish finish[MAXR];
    int emitted[MAXR];     /* tokens appended after the prompt, as the engine would emit */
    double now;
    uint64_t step;
    int check_failures;
    int spec;              /* propose drafts for decoding requests */
    int accept_pattern;    /* drafts accepted per verify: step % (k+1) */
    kv_step_record last;
    const kv_decision *dec;
    int n_dec;
} sim;

/* The "model": the token at position p of request id. */
static int32_t oracle(int64_t id, int p) { return (int32_t)((id * 7919 + (int64_t)p * 104729) % 500 + 3); }

static int sim_init(sim *m, kv_sched_params sp, int n_blocks, int block_size, int n_swap, int prefix) {
    memset(m, 0, sizeof *m);
    m->be.ops = &fb_ops;
    kv_cache_params cp = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .dtype = KV_CACHE_F32,
                          .block_size = block_size, .n_blocks = n_blocks, .prefix_sharing = prefix,
                          .n_swap_blocks = n_swap};
    kv_err err;
    m->c = kv_cache_new(&cp, &m->be, &err);
    if (!m->c) {
        fprintf(stderr, "cache: %s\n", err.msg);
        return -1;
    }
    sp.prefix_sharing = prefix;
    m->s = kv_sched_new(&sp, m->c, &err);
    if (!m->s) {
        fprintf(stderr, "sched: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void sim_free(sim *m) {
    for (int i = 0; i < m->n; i++) {
        if (!m->done[i]) kv_sched_finish(m->s, m->r[i], KV_FINISH_CANCELLED);
        kv_sreq_free(m->r[i]);
        free(m->r[i]);
    }
    kv_sched_free(m->s);
    kv_cache_free(m->c);
}

static kv_sched_params params(int max_seqs, int budget, int chunk) {
    kv_sched_params p = {.policy = KV_POLICY_CONTINUOUS, .layout = KV_LAYOUT_PAGED,
                         .preemption = KV_PREEMPT_RECOMPUTE, .max_seqs = max_seqs,
                         .max_batched_tokens = budget, .prefill_chunk = chunk, .max_wait_ms = 0,
                         .max_seq_len = 1024, .watermark_blocks = 0};
    return p;
}

/* Adds a request whose prompt follows the oracle (so prompts of different
 * requests differ) unless prompt is given. Returns its index. */
static int sim_add(sim *m, int n_prompt, int max_tokens, int priority, const int32_t *prompt) {
    int i = m->n++;
    kv_sreq *r = calloc(1, sizeof *r);
    int32_t buf[1024];
    for (int p = 0; p < n_prompt; p++) buf[p] = prompt ? prompt[p] : oracle(i + 1, p);
    kv_sreq_init(r, i + 1, buf, n_prompt, max_tokens, 4);
    r->priority = priority;
    r->arrival_ms = m->now;
    r->session = i % 3;
    m->r[i] = r;
    CHECK(kv_sched_add(m->s, r) == 0);
    return i;
}

static int32_t *kslot(sim *m, int32_t slot) {
    kv_pages *pg = kv_cache_pages(m->c);
    return (int32_t *)(pg->k + (size_t)slot * pg->slot_bytes);
}

/* One engine step with the forward simulated. Returns tokens run. */
static int sim_step(sim *m) {
    kv_sched_begin_step(m->s, ++m->step, m->now);
    /* drafts: the oracle's next tokens, wrong from a position that cycles */
    if (m->spec) {
        kv_sreq *const *run;
        int nr = kv_sched_running(m->s, &run);
        for (int i = 0; i < nr; i++) {
            kv_sreq *r = run[i];
            if (r->n_tokens - r->n_computed != 1) continue;
            r->n_draft = 3;
            int good = (int)(m->step % 4);
            for (int j = 0; j < 3; j++)
                r->draft[j] = j < good ? oracle(r->id, r->n_tokens + j) : 1;
        }
    }
    const kv_sched_out *o;
    int n = kv_sched_schedule(m->s, m->now, &o);
    if (n < 0) {
        CHECKF(0, "schedule failed %d", n);
        return n;
    }
    const kv_sched_params *sp = kv_sched_params_of(m->s);
    CHECK(n <= sp->max_batched_tokens);
    CHECK(o->n_reqs <= sp->max_seqs);
    /* committed K/V of every scheduled sequence is what its tokens say */
    for (int q = 0; q < o->n_reqs; q++) {
        const kv_sreq *r = o->reqs[q];
        for (int p = 0; p < r->n_computed; p++) {
            int32_t *k = kslot(m, kv_cache_slot(m->c, &r->seq, p));
            if (k[0] != r->tokens[p] || k[1] != p) {
                CHECKF(0, "step %llu: #%lld pos %d holds (%d, %d), want (%d, %d)", (unsigned long long)m->step,
                       (long long)r->id, p, k[0], k[1], r->tokens[p], p);
                m->check_failures++;
                break;
            }
        }
    }
    /* static batching's padding rows come last and repeat a decode row of
     * the batch exactly (so they store the same K/V bytes) */
    int n_real = o->n_tokens - o->n_pad_tokens;
    CHECK(o->n_pad_tokens == 0 || sp->policy == KV_POLICY_STATIC);
    for (int t = n_real; t < o->n_tokens; t++) {
        int same = 0;
        for (int u = 0; u < n_real && !same; u++)
            same = o->tokens[u] == o->tokens[t] && o->pos[u] == o->pos[t] && o->seq[u] == o->seq[t] &&
                   o->slot[u] == o->slot[t];
        CHECK(same);
    }
    /* the forward: write every scheduled token into its slot */
    for (int t = 0; t < n_real; t++) {
        CHECK(o->seq[t] >= 0 && o->seq[t] < o->n_reqs);
        const kv_sreq *r = o->reqs[o->seq[t]];
        CHECK(o->tables[o->seq[t]] == r->seq.blocks);
        CHECK(o->slot[t] == kv_cache_slot(m->c, &r->seq, o->pos[t]));
        for (int u = 0; u < t; u++) CHECK(o->slot[u] != o->slot[t]);
        int32_t *k = kslot(m, o->slot[t]);
        k[0] = o->tokens[t];
        k[1] = o->pos[t];
    }
    for (int l = 0; l < o->n_logits; l++) CHECK(o->logit_rows[l] >= 0 && o->logit_rows[l] < o->n_tokens);
    /* sample and verify */
    int n_reqs = o->n_reqs;
    kv_sreq *reqs[MAXR];
    memcpy(reqs, o->reqs, (size_t)n_reqs * sizeof *reqs);
    for (int q = 0; q < n_reqs; q++) {
        kv_sreq *r = reqs[q];
        int32_t nt[8];
        int nn = 0;
        if (r->n_logits > 0) {
            /* accept drafts while they match the oracle, then its token */
            int pos = r->n_tokens;
            for (int j = 0; j < r->n_sched_draft; j++, pos++) {
                if (r->draft[j] != oracle(r->id, pos)) break;
                nt[nn++] = r->draft[j];
            }
            nt[nn++] = oracle(r->id, pos);
            /* never past max_tokens */
            int room = r->max_tokens - kv_sreq_n_generated(r);
            if (nn > room) nn = room;
        }
        int rc = kv_sched_update(m->s, r, nt, nn);
        CHECKF(rc == 0, "update #%lld rc %d", (long long)r->id, rc);
        int i = (int)r->id - 1;
        m->emitted[i] += nn;
        if (kv_sreq_n_generated(r) >= r->max_tokens) {
            kv_sched_finish(m->s, r, KV_FINISH_LENGTH);
            m->done[i] = 1;
            m->finish[i] = KV_FINISH_LENGTH;
        }
    }
    kv_sched_end_step(m->s, &m->last, &m->dec, &m->n_dec);
    char msg[256];
    int rc = kv_sched_check(m->s, msg, sizeof msg);
    if (rc) {
        CHECKF(rc == 0, "step %llu: %s", (unsigned long long)m->step, msg);
        m->check_failures++;
    }
    m->now += 10;
    return n;
}

static int sim_run(sim *m, int max_steps) {
    int steps = 0;
    while (!kv_sched_idle(m->s) && steps < max_steps && m->check_failures == 0) {
        if (sim_step(m) < 0) break;
        steps++;
    }
    return steps;
}

/* Every request's tokens are the prompt then the oracle's, exactly max_tokens. */
static void check_outputs(sim *m) {
    for (int i = 0; i < m->n; i++) {
        kv_sreq *r = m->r[i];
        CHECKF(m->done[i], "#%d not finished", i + 1);
        CHECKF(kv_sreq_n_generated(r) == r->max_tokens, "#%d generated %d of %d", i + 1, kv_sreq_n_generated(r),
               r->max_tokens);
        CHECKF(m->emitted[i] == r->max_tokens, "#%d emitted %d of %d", i + 1, m->emitted[i], r->max_tokens);
        for (int p = r->n_prompt; p < r->n_tokens; p++)
            if (r->tokens[p] != oracle(r->id, p)) {
                CHECKF(0, "#%d token %d is %d, want %d", i + 1, p, r->tokens[p], oracle(r->id, p));
                break;
            }
    }
}

static int has_decision(const sim *m, kv_decision_kind kind, int64_t req, const char *needle) {
    for (int i = 0; i < m->n_dec; i++)
        if (m->dec[i].kind == kind && (req < 0 || m->dec[i].req == req) &&
            (!needle || strstr(m->dec[i].text, needle)))
            return 1;
    return 0;
}

/* ---- tests ---- */

static void test_mixed_batch(void) {
    sim m;
    REQUIRE(sim_init(&m, params(8, 64, 64), 64, 4, 0, 0) == 0);
    sim_add(&m, 10, 5, 0, NULL);
    sim_add(&m, 6, 3, 0, NULL);
    sim_step(&m);
    /* both prompts in one forward, each samples at its last token */
    CHECK(m.last.n_prefill_tokens == 16 && m.last.n_decode_tokens == 0 && m.last.n_seqs == 2);
    CHECK(m.last.n_admitted == 2);
    CHECK(has_decision(&m, KV_DEC_ADMIT, 1, "10 prompt tokens"));
    CHECK(m.r[0]->n_tokens == 11 && m.r[1]->n_tokens == 7);
    /* a new prompt joins two decoding requests in the same forward */
    sim_add(&m, 8, 2, 0, NULL);
    sim_step(&m);
    CHECK(m.last.n_decode_tokens == 2 && m.last.n_prefill_tokens == 8 && m.last.n_seqs == 3);
    sim_run(&m, 100);
    check_outputs(&m);
    kv_cache_stats st;
    kv_cache_get_stats(m.c, &st);
    CHECK(st.n_used == 0);
    sim_free(&m);
}

static void test_chunked_prefill(void) {
    int chunks[] = {1, 7, 16, 64};
    for (size_t ci = 0; ci < KV_ARRAY_LEN(chunks); ci++) {
        int ch = chunks[ci];
        sim m;
        REQUIRE(sim_init(&m, params(4, 64, ch), 64, 4, 0, 0) == 0);
        sim_add(&m, 40, 4, 0, NULL);
        int steps_to_first = 0;
        while (kv_sreq_n_generated(m.r[0]) == 0 && steps_to_first < 100) {
            int before = m.r[0]->n_computed;
            sim_step(&m);
            steps_to_first++;
            int ran = m.last.n_prefill_tokens;
            CHECKF(ran == KV_MIN(ch, 40 - before), "chunk %d: ran %d from %d", ch, ran, before);
            /* no logits until the chunk that completes the prompt */
            if (m.r[0]->n_computed < 40) CHECK(kv_sreq_n_generated(m.r[0]) == 0);
        }
        CHECKF(steps_to_first == (40 + ch - 1) / ch, "chunk %d: %d steps", ch, steps_to_first);
        sim_run(&m, 200);
        check_outputs(&m);
        sim_free(&m);
    }
}

static void test_token_budget(void) {
    sim m;
    REQUIRE(sim_init(&m, params(8, 10, 64), 64, 4, 0, 0) == 0);
    sim_add(&m, 8, 4, 0, NULL);
    sim_add(&m, 8, 4, 0, NULL);
    sim_add(&m, 8, 4, 0, NULL);
    sim_step(&m);
    /* 8 + 2 tokens fill the budget; the third waits for it */
    CHECK(m.last.n_prefill_tokens == 10);
    CHECK(m.r[1]->n_computed == 2 && m.r[1]->state == KV_REQ_RUNNING);
    CHECK(m.r[2]->state == KV_REQ_WAITING);
    CHECKF(strstr(m.r[2]->wait_reason, "token budget") != NULL, "%s", m.r[2]->wait_reason);
    sim_step(&m);
    /* decode first (1), then the rest of #2 (6), then #3 starts (3) */
    CHECK(m.last.n_decode_tokens == 1 && m.last.n_prefill_tokens == 9);
    CHECK(m.r[1]->n_computed == 8 && m.r[2]->n_computed == 3);
    sim_run(&m, 100);
    check_outputs(&m);
    sim_free(&m);
}

static void test_max_seqs(void) {
    sim m;
    REQUIRE(sim_init(&m, params(2, 64, 64), 64, 4, 0, 0) == 0);
    sim_add(&m, 4, 2, 0, NULL);
    sim_add(&m, 4, 6, 0, NULL);
    sim_add(&m, 4, 2, 0, NULL);
    sim_step(&m);
    CHECK(m.r[2]->state == KV_REQ_WAITING);
    CHECKF(strstr(m.r[2]->wait_reason, "max_seqs") != NULL, "%s", m.r[2]->wait_reason);
    CHECK(has_decision(&m, KV_DEC_WAIT, 3, "max_seqs"));
    sim_step(&m); /* #1 finishes (2 tokens) */
    CHECK(m.done[0]);
    sim_step(&m); /* its place goes to #3 at once */
    CHECK(m.r[2]->state == KV_REQ_RUNNING);
    sim_run(&m, 100);
    check_outputs(&m);
    sim_free(&m);
}

static void test_priority_and_starvation_guard(void) {
    kv_sched_params p = params(1, 64, 64);
    p.max_wait_ms = 100;
    sim m;
    REQUIRE(sim_init(&m, p, 64, 4, 0, 0) == 0);
    sim_add(&m, 4, 30, 10, NULL); /* #1 runs long, above everyone (not preempted) */
    sim_step(&m);
    sim_add(&m, 4, 2, 0, NULL);   /* #2 low priority, arrives first */
    m.now += 60;
    sim_add(&m, 4, 2, 5, NULL);   /* #3 high priority */
    sim_step(&m);
    kv_sreq *const *w;
    int nw = kv_sched_waiting(m.s, &w);
    REQUIRE(nw == 2);
    CHECK(w[0]->id == 3 && w[1]->id == 2); /* priority first */
    /* #2 waits past max_wait_ms: the guard puts it ahead of #3 */
    m.now += 100;
    sim_step(&m);
    nw = kv_sched_waiting(m.s, &w);
    REQUIRE(nw == 2);
    CHECK(w[0]->id == 2 && w[1]->id == 3);
    sim_run(&m, 200);
    check_outputs(&m);
    sim_free(&m);

    /* without the guard, priority alone decides */
    p.max_wait_ms = 0;
    REQUIRE(sim_init(&m, p, 64, 4, 0, 0) == 0);
    sim_add(&m, 4, 30, 10, NULL);
    sim_step(&m);
    sim_add(&m, 4, 2, 0, NULL);
    sim_add(&m, 4, 2, 5, NULL);
    m.now += 10000;
    sim_step(&m);
    nw = kv_sched_waiting(m.s, &w);
    REQUIRE(nw == 2);
    CHECK(w[0]->id == 3);
    sim_run(&m, 200);
    /* #3 (priority 5) finished before #2 */
    check_outputs(&m);
    sim_free(&m);
}

static void test_priority_preemption(void) {
    /* a free slot for a higher priority */
    sim m;
    REQUIRE(sim_init(&m, params(2, 64, 64), 64, 4, 0, 0) == 0);
    sim_add(&m, 4, 20, 0, NULL);
    m.now += 1;
    sim_add(&m, 4, 20, 0, NULL);
    sim_step(&m);
    sim_add(&m, 4, 3, 5, NULL); /* #3 */
    sim_step(&m);
    CHECK(m.r[2]->state == KV_REQ_RUNNING);
    CHECK(m.r[1]->state == KV_REQ_PREEMPTED && m.r[0]->state == KV_REQ_RUNNING); /* the newest gives way */
    CHECK(has_decision(&m, KV_DEC_PREEMPT, 2, "for #3"));
    /* an equal priority does not preempt */
    sim_add(&m, 4, 3, 0, NULL);
    sim_step(&m);
    CHECK(m.r[3]->state == KV_REQ_WAITING);
    sim_run(&m, 200);
    check_outputs(&m);
    sim_free(&m);

    /* blocks for a higher priority: 8 blocks, two low requests hold 6 */
    REQUIRE(sim_init(&m, params(8, 64, 64), 8, 4, 0, 0) == 0);
    sim_add(&m, 10, 2, 0, NULL);
    m.now += 1;
    sim_add(&m, 10, 2, 0, NULL);
    sim_step(&m);
    sim_add(&m, 12, 2, 1, NULL); /* needs 3 blocks, 2 free */
    sim_step(&m);
    CHECK(m.r[2]->state == KV_REQ_RUNNING || m.done[2]);
    CHECK(m.r[1]->preemptions == 1 && m.r[0]->preemptions == 0);
    sim_run(&m, 200);
    check_outputs(&m);
    sim_free(&m);
}

static void test_skip_ahead_and_reasons(void) {
    kv_sched_params p = params(8, 256, 256);
    p.max_wait_ms = 1000;
    sim m;
    /* 12 blocks of 4 tokens */
    REQUIRE(sim_init(&m, p, 12, 4, 0, 0) == 0);
    sim_add(&m, 30, 6, 0, NULL); /* #1: 8 blocks for its prompt */
    sim_step(&m);
    sim_add(&m, 36, 2, 0, NULL); /* #2: needs 9 blocks, 4 left... */
    sim_add(&m, 6, 2, 0, NULL);  /* #3: 2 blocks: skips ahead */
    sim_step(&m);
    CHECKF(strstr(m.r[1]->wait_reason, "free blocks, needs 9") != NULL, "%s", m.r[1]->wait_reason);
    CHECK(m.r[1]->state == KV_REQ_WAITING);
    CHECK(m.r[2]->state == KV_REQ_RUNNING || m.done[2]);
    /* once #2 starves, nobody may skip ahead of it */
    m.now += 2000;
    sim_add(&m, 6, 2, 0, NULL); /* #4 */
    sim_step(&m);
    if (!m.done[0] && m.r[1]->state == KV_REQ_WAITING) {
        CHECK(m.r[3]->state == KV_REQ_WAITING);
        CHECKF(strstr(m.r[3]->wait_reason, "starvation guard") != NULL, "%s", m.r[3]->wait_reason);
    }
    /* a lower priority request may not skip ahead of a blocked higher one */
    sim_run(&m, 200);
    check_outputs(&m);
    sim_free(&m);

    p.max_wait_ms = 0;
    REQUIRE(sim_init(&m, p, 12, 4, 0, 0) == 0);
    sim_add(&m, 30, 6, 5, NULL); /* above both: never preempted for them */
    sim_step(&m);
    sim_add(&m, 36, 2, 3, NULL); /* blocked, priority 3 */
    sim_add(&m, 6, 2, 1, NULL);  /* fits, but priority 1 */
    sim_step(&m);
    CHECK(m.r[2]->state == KV_REQ_WAITING);
    CHECKF(strstr(m.r[2]->wait_reason, "priority") != NULL, "%s", m.r[2]->wait_reason);
    sim_run(&m, 200);
    check_outputs(&m);
    sim_free(&m);
}

static void run_preemption(kv_preempt mode, int prefix) {
    kv_sched_params p = params(8, 64, 16);
    p.preemption = mode;
    sim m;
    /* 10 blocks of 4: four requests of 8 + 12 tokens cannot all grow */
    REQUIRE(sim_init(&m, p, 10, 4, mode == KV_PREEMPT_SWAP ? 32 : 0, prefix) == 0);
    for (int i = 0; i < 4; i++) {
        sim_add(&m, 8, 12, i == 1 ? 2 : 0, NULL);
        m.now += 1;
    }
    int saw_victim = 0;
    for (int st = 0; st < 300 && !kv_sched_idle(m.s) && !m.check_failures; st++) {
        sim_step(&m);
        for (int d = 0; d < m.n_dec; d++) {
            if (m.dec[d].kind == KV_DEC_PREEMPT || m.dec[d].kind == KV_DEC_SWAP_OUT) {
                /* victims: never the priority-2 request while others run,
                 * and the first one is the newest arrival */
                CHECKF(m.dec[d].req != 2, "%s", m.dec[d].text);
                if (!saw_victim) CHECKF(m.dec[d].req == 4, "first victim: %s", m.dec[d].text);
                saw_victim = 1;
            }
        }
        if (mode == KV_PREEMPT_SWAP && m.last.n_swapped_out) {
            kv_sreq *const *sw;
            int ns = kv_sched_swapped(m.s, &sw);
            CHECK(ns > 0 && sw[0]->state == KV_REQ_SWAPPED);
        }
    }
    CHECK(saw_victim);
    kv_sched_counters cnt;
    kv_sched_get_counters(m.s, &cnt);
    CHECK(cnt.preemptions > 0);
    if (mode == KV_PREEMPT_SWAP) {
        CHECK(cnt.swaps_out > 0 && cnt.swaps_in == cnt.swaps_out);
        CHECK(cnt.recomputes == 0);
    } else {
        CHECK(cnt.recomputes > 0);
    }
    CHECK(m.r[1]->preemptions == 0);
    check_outputs(&m);
    sim_free(&m);
}

static void test_preempt_recompute(void) {
    run_preemption(KV_PREEMPT_RECOMPUTE, 0);
    run_preemption(KV_PREEMPT_RECOMPUTE, 1);
}
static void test_preempt_swap(void) {
    run_preemption(KV_PREEMPT_SWAP, 0);
    run_preemption(KV_PREEMPT_SWAP, 1);
}

static void test_swap_pool_full_falls_back(void) {
    kv_sched_params p = params(8, 64, 16);
    p.preemption = KV_PREEMPT_SWAP;
    sim m;
    REQUIRE(sim_init(&m, p, 10, 4, 2, 0) == 0); /* a 2-block pool: too small for anyone */
    for (int i = 0; i < 8; i++) sim_add(&m, 8, 12, 0, NULL);
    /* the decisions say so once, not at every recompute */
    int said = 0, full = 0;
    for (int st = 0; st < 300 && !kv_sched_idle(m.s); st++) {
        sim_step(&m);
        for (int i = 0; i < m.n_dec; i++) {
            said += strstr(m.dec[i].text, "swap pool of 2 blocks is smaller than") != NULL &&
                    strstr(m.dec[i].text, "recomputed instead") != NULL;
            full += strstr(m.dec[i].text, "swap pool full") != NULL;
        }
    }
    kv_sched_counters cnt;
    kv_sched_get_counters(m.s, &cnt);
    CHECK(cnt.recomputes > 1);
    CHECKF(said == 1 && (uint64_t)full < cnt.recomputes, "said %d times, 'pool full' %d times", said, full);
    check_outputs(&m);
    sim_free(&m);
}

/* New requests of no higher priority wait while a swapped one is out. */
static void test_swapped_come_first(void) {
    kv_sched_params p = params(8, 64, 16);
    p.preemption = KV_PREEMPT_SWAP;
    sim m;
    REQUIRE(sim_init(&m, p, 10, 4, 32, 0) == 0);
    for (int i = 0; i < 4; i++) {
        sim_add(&m, 8, 12, 0, NULL);
        m.now += 1;
    }
    kv_sreq *const *sw;
    int st = 0;
    while (kv_sched_swapped(m.s, &sw) == 0 && st++ < 50) sim_step(&m);
    REQUIRE(kv_sched_swapped(m.s, &sw) > 0);
    int late = sim_add(&m, 2, 2, 0, NULL);
    int saw_reason = 0;
    while (m.r[late]->state == KV_REQ_WAITING && st++ < 200) {
        sim_step(&m);
        saw_reason |= strstr(m.r[late]->wait_reason, "swapped requests first") != NULL;
        /* admission happens after swap-in within a step: when it came in,
         * nobody was left out */
        if (m.r[late]->state != KV_REQ_WAITING) CHECK(kv_sched_swapped(m.s, &sw) == 0);
    }
    CHECK(saw_reason);
    sim_run(&m, 300);
    check_outputs(&m);
    sim_free(&m);
}

static void test_static_batching(void) {
    kv_sched_params p = params(2, 64, 64);
    p.policy = KV_POLICY_STATIC;
    sim m;
    REQUIRE(sim_init(&m, p, 64, 4, 0, 0) == 0);
    sim_add(&m, 4, 2, 0, NULL);
    sim_add(&m, 4, 8, 0, NULL);
    sim_add(&m, 4, 2, 0, NULL);
    sim_step(&m);
    CHECK(m.r[0]->state == KV_REQ_RUNNING && m.r[1]->state == KV_REQ_RUNNING);
    sim_step(&m);
    CHECK(m.done[0]);
    /* #1 left, a slot is free, but the batch is not done */
    for (int i = 0; i < 5; i++) {
        sim_step(&m);
        CHECK(m.r[2]->state == KV_REQ_WAITING);
    }
    CHECKF(strstr(m.r[2]->wait_reason, "static batch") != NULL, "%s", m.r[2]->wait_reason);
    sim_run(&m, 100);
    check_outputs(&m);
    sim_free(&m);

    /* the same under continuous batching admits #3 as soon as #1 leaves */
    REQUIRE(sim_init(&m, params(2, 64, 64), 64, 4, 0, 0) == 0);
    sim_add(&m, 4, 2, 0, NULL);
    sim_add(&m, 4, 8, 0, NULL);
    sim_add(&m, 4, 2, 0, NULL);
    sim_step(&m);
    sim_step(&m);
    sim_step(&m);
    CHECK(m.r[2]->state == KV_REQ_RUNNING || m.done[2]);
    sim_run(&m, 100);
    check_outputs(&m);
    sim_free(&m);
}

static void test_contiguous_reservation(void) {
    kv_sched_params p = params(8, 256, 256);
    p.layout = KV_LAYOUT_CONTIGUOUS;
    p.max_seq_len = 32; /* 8 blocks of 4 per request */
    sim m;
    REQUIRE(sim_init(&m, p, 20, 4, 0, 0) == 0);
    for (int i = 0; i < 3; i++) sim_add(&m, 4, 4, 0, NULL);
    sim_step(&m);
    /* only two fit, each holding 8 blocks for 5 tokens */
    CHECK(m.r[0]->state == KV_REQ_RUNNING && m.r[1]->state == KV_REQ_RUNNING);
    CHECK(m.r[0]->seq.n_blocks == 8 && m.r[0]->seq.n_reserved == 32);
    CHECK(m.r[2]->state == KV_REQ_WAITING);
    CHECKF(strstr(m.r[2]->wait_reason, "4 free blocks, needs 8") != NULL, "%s", m.r[2]->wait_reason);
    sim_run(&m, 100);
    check_outputs(&m);
    sim_free(&m);

    /* the paged layout runs all three at once in the same cache */
    REQUIRE(sim_init(&m, params(8, 256, 256), 20, 4, 0, 0) == 0);
    for (int i = 0; i < 3; i++) sim_add(&m, 4, 4, 0, NULL);
    sim_step(&m);
    CHECK(m.r[2]->state == KV_REQ_RUNNING);
    sim_run(&m, 100);
    check_outputs(&m);
    sim_free(&m);
}

static void test_prefix_sharing(void) {
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 1000 + i;
    sim m;
    REQUIRE(sim_init(&m, params(8, 256, 256), 64, 4, 0, 1) == 0);
    sim_add(&m, 40, 3, 0, prompt);
    sim_step(&m);
    prompt[38] = 7; /* same first 38 tokens: 9 full blocks shared */
    sim_add(&m, 40, 3, 0, prompt);
    sim_step(&m);
    CHECK(m.r[1]->n_prefix_hit == 36);
    CHECK(has_decision(&m, KV_DEC_SHARE, 2, "36 cached tokens"));
    CHECK(m.last.n_prefill_tokens == 4);
    kv_cache_stats st;
    kv_cache_get_stats(m.c, &st);
    CHECK(st.n_shared == 9);
    /* an identical prompt reuses all but its last token (copy-on-write) */
    prompt[38] = 1038;
    sim_add(&m, 40, 3, 0, prompt);
    sim_step(&m);
    CHECK(m.r[2]->n_prefix_hit == 39);
    CHECK(has_decision(&m, KV_DEC_COW, 3, NULL));
    sim_run(&m, 100);
    check_outputs(&m);
    kv_sched_counters cnt;
    kv_sched_get_counters(m.s, &cnt);
    CHECK(cnt.prefix_hit_tokens == 75);
    sim_free(&m);
}

static void test_cancel_everywhere(void) {
    kv_sched_params p = params(2, 64, 64);
    p.preemption = KV_PREEMPT_SWAP;
    sim m;
    REQUIRE(sim_init(&m, p, 6, 4, 16, 0) == 0);
    sim_add(&m, 8, 12, 0, NULL);
    sim_add(&m, 8, 12, 0, NULL);
    sim_add(&m, 4, 4, 0, NULL);
    /* run until someone is swapped out */
    for (int i = 0; i < 20; i++) {
        sim_step(&m);
        kv_sreq *const *sw;
        if (kv_sched_swapped(m.s, &sw) > 0) break;
    }
    kv_sreq *const *sw;
    REQUIRE(kv_sched_swapped(m.s, &sw) > 0);
    /* cancel each state: swapped, running, waiting */
    kv_sreq *victim = sw[0];
    kv_sched_begin_step(m.s, ++m.step, m.now);
    kv_sched_finish(m.s, victim, KV_FINISH_CANCELLED);
    m.done[victim->id - 1] = 1;
    for (int i = 0; i < m.n; i++)
        if (!m.done[i]) {
            kv_sched_finish(m.s, m.r[i], KV_FINISH_CANCELLED);
            m.done[i] = 1;
        }
    const kv_decision *d;
    int nd;
    kv_sched_end_step(m.s, NULL, &d, &nd);
    m.dec = d;
    m.n_dec = nd;
    CHECK(has_decision(&m, KV_DEC_CANCEL, victim->id, NULL));
    char msg[256];
    CHECKF(kv_sched_check(m.s, msg, sizeof msg) == 0, "%s", msg);
    CHECK(kv_sched_idle(m.s));
    kv_cache_stats st;
    kv_cache_get_stats(m.c, &st);
    CHECK(st.n_used == 0 && st.n_swap_used == 0);
    sim_free(&m);
}

static void test_speculative_hook(void) {
    sim m;
    REQUIRE(sim_init(&m, params(4, 64, 64), 64, 4, 0, 0) == 0);
    m.spec = 1;
    sim_add(&m, 6, 20, 0, NULL);
    sim_add(&m, 5, 13, 0, NULL);
    sim_step(&m); /* prefill: no drafts */
    CHECK(m.last.n_spec_tokens == 0);
    int verified = 0;
    while (!kv_sched_idle(m.s) && m.step < 100) {
        sim_step(&m);
        verified += m.last.n_spec_tokens;
        /* rejected drafts give their blocks back */
        kv_sreq *const *run;
        int nr = kv_sched_running(m.s, &run);
        for (int i = 0; i < nr; i++)
            CHECKF(run[i]->seq.n_blocks == (run[i]->n_computed + 3) / 4, "#%lld: %d blocks for %d tokens",
                   (long long)run[i]->id, run[i]->seq.n_blocks, run[i]->n_computed);
    }
    CHECK(verified > 0);
    check_outputs(&m);
    sim_free(&m);
}

/* Random arrivals, priorities, cancellations and lengths on a cache small
 * enough to preempt often, under every mode; every request ends, and the
 * finished ones carry exactly the oracle's tokens. */
static void test_random_workload(void) {
    for (int mode = 0; mode < 9; mode++) {
        kv_sched_params p = params(6, 48, mode % 2 ? 7 : 16);
        /* the failure-mode guards (sched_guard.c) under the same oracle */
        if (mode == 6) p.admission = KV_ADMIT_MAX_TOKENS, p.preempt_victim = KV_VICTIM_LEAST_WORK;
        if (mode == 7) p.admission = KV_ADMIT_QUANTILE, p.admission_quantile = 0.5, p.order = KV_ORDER_SHORT_FIRST,
                       p.watermark_blocks = 4;
        if (mode == 8) p.target_tpot_ms = 3, p.preempt_victim = KV_VICTIM_LEAST_WORK;
        p.preemption = mode >= 2 && mode < 4 ? KV_PREEMPT_SWAP : KV_PREEMPT_RECOMPUTE;
        if (mode == 4) p.policy = KV_POLICY_STATIC;
        if (mode == 5) {
            p.layout = KV_LAYOUT_CONTIGUOUS;
            p.max_seq_len = 40;
        }
        p.max_wait_ms = 50;
        sim m;
        REQUIRE(sim_init(&m, p, 24, 4, p.preemption == KV_PREEMPT_SWAP ? 40 : 0, mode != 5) == 0);
        uint64_t rng = 12345 + (uint64_t)mode;
#define RND() (rng = rng * 6364136223846793005ull + 1442695040888963407ull, (int)(rng >> 33))
        int32_t shared[16];
        for (int i = 0; i < 16; i++) shared[i] = 2000 + i;
        int cancelled[MAXR] = {0};
        for (int st = 0; st < 2000 && !m.check_failures; st++) {
            if (m.n < 60 && RND() % 3 != 0) {
                int np = 2 + RND() % 24, mt = 1 + RND() % 24;
                int32_t pr[32];
                int use_shared = RND() & 1; /* half of them start with a shared "system prompt" */
                for (int i = 0; i < np; i++) pr[i] = use_shared && i < 16 ? shared[i] : oracle(m.n + 1, i);
                sim_add(&m, np, mt, RND() % 3, pr);
            }
            if (m.n > 0 && RND() % 25 == 0) {
                int i = RND() % m.n;
                if (!m.done[i]) {
                    kv_sched_finish(m.s, m.r[i], KV_FINISH_CANCELLED);
                    m.done[i] = 1;
                    cancelled[i] = 1;
                }
            }
            sim_step(&m);
            if (mode == 8) kv_sched_observe_step(m.s, m.last.n_seqs, 1.0 + 0.5 * m.last.n_seqs); /* cap -> 4 */
            if (m.n >= 60 && kv_sched_idle(m.s)) break;
        }
        sim_run(&m, 2000);
        CHECKF(kv_sched_idle(m.s), "mode %d: not idle", mode);
        for (int i = 0; i < m.n; i++) {
            CHECKF(m.done[i], "mode %d: #%d lost", mode, i + 1);
            if (cancelled[i]) continue;
            kv_sreq *r = m.r[i];
            CHECKF(kv_sreq_n_generated(r) == r->max_tokens && m.emitted[i] == r->max_tokens,
                   "mode %d: #%d generated %d emitted %d of %d", mode, i + 1, kv_sreq_n_generated(r), m.emitted[i],
                   r->max_tokens);
            for (int q = r->n_prompt; q < r->n_tokens; q++)
                if (r->tokens[q] != oracle(r->id, q)) {
                    CHECKF(0, "mode %d: #%d token %d wrong", mode, i + 1, q);
                    break;
                }
        }
        kv_cache_stats cs;
        kv_cache_get_stats(m.c, &cs);
        CHECK(cs.n_used == 0);
        kv_sched_counters cnt;
        kv_sched_get_counters(m.s, &cnt);
        if (mode == 8) CHECKF(cnt.batch_cap == 4, "mode 8: batch cap %d, want 4 (1 + 0.5 n <= 3 ms)", cnt.batch_cap);
        if (getenv("SCHED_VERBOSE"))
            printf("mode %d: %d requests, %llu steps, %llu preemptions (%llu swaps), %llu hit tokens, %llu evictions, "
                   "%llu cow, max running %d\n",
                   mode, m.n, (unsigned long long)m.step, (unsigned long long)cnt.preemptions,
                   (unsigned long long)cnt.swaps_out, (unsigned long long)cnt.prefix_hit_tokens,
                   (unsigned long long)cs.evictions, (unsigned long long)cs.cow_copies, cnt.max_running);
        sim_free(&m);
    }
}

static void test_bad_input(void) {
    kv_sreq r;
    int32_t t[2] = {1, 2};
    CHECK(kv_sreq_init(&r, 1, t, 0, 4, 0) == KV_ERR_INVAL);
    CHECK(kv_sreq_init(&r, 1, t, 2, 0, 0) == KV_ERR_INVAL);
    kv_sched_params p = params(0, 64, 64);
    sim m;
    memset(&m, 0, sizeof m);
    m.be.ops = &fb_ops;
    kv_cache_params cp = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .dtype = KV_CACHE_F32, .block_size = 4,
                          .n_blocks = 8};
    kv_cache *c = kv_cache_new(&cp, &m.be, NULL);
    REQUIRE(c);
    kv_err err;
    CHECK(kv_sched_new(&p, c, &err) == NULL && err.code == KV_ERR_INVAL);
    p = params(2, 64, 64);
    kv_sched *s = kv_sched_new(&p, c, &err);
    REQUIRE(s);
    REQUIRE(kv_sreq_init(&r, 1, t, 2, 4, 0) == 0);
    CHECK(kv_sched_add(s, &r) == 0);
    CHECK(kv_sched_add(s, NULL) == KV_ERR_INVAL);
    kv_sched_begin_step(s, 1, 0);
    const kv_sched_out *o;
    CHECK(kv_sched_schedule(s, 0, &o) == 2);
    int32_t bad[3] = {5, 6, 7};
    CHECK(kv_sched_update(s, &r, bad, 3) == KV_ERR_INVAL); /* only one logit row */
    CHECK(r.n_tokens == 2 && r.n_computed == 0);           /* nothing changed */
    CHECK(kv_sched_update(s, &r, bad, 1) == 0);
    CHECK(kv_sched_update(s, &r, bad, 1) == KV_ERR_INVAL); /* not scheduled again */
    kv_sched_finish(s, &r, KV_FINISH_CANCELLED);
    kv_sched_finish(s, &r, KV_FINISH_CANCELLED); /* twice is harmless */
    CHECK(kv_sched_idle(s));
    kv_sreq_free(&r);
    kv_sched_free(s);
    kv_sched_free(NULL);
    kv_cache_free(c);
}

TEST_MAIN(T(test_mixed_batch), T(test_chunked_prefill), T(test_token_budget), T(test_max_seqs),
          T(test_priority_and_starvation_guard), T(test_priority_preemption), T(test_skip_ahead_and_reasons), T(test_preempt_recompute),
          T(test_preempt_swap), T(test_swap_pool_full_falls_back), T(test_swapped_come_first), T(test_static_batching),
          T(test_contiguous_reservation), T(test_prefix_sharing), T(test_cancel_everywhere),
          T(test_speculative_hook), T(test_random_workload), T(test_bad_input))
