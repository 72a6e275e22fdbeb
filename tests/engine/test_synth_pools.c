/* test_synth_pools.c - disaggregated prefill and decode pools on a
 * synthetic model (sim.disaggregated, engine/synth_step.h): each pool on
 * its own clock, the KV's hand-over between them, their memory and queue
 * figures, checked on cases small enough to work out by hand. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/engine.h"
#include "../../engine/synth_step.h"
#include "../engine_helpers.h"
#include "../harness.h"

enum { MAX_TOK = 16, MAX_EV = 4096 };

/* llama-3-8b fp16 on one H100 per pool, one chunk of up to 1024 tokens. */
static void pools_config(kv_config *c, int disaggregated) {
    kv_config_default(c);
    snprintf(c->backend, sizeof c->backend, "sim");
    snprintf(c->sim_device, sizeof c->sim_device, "h100");
    snprintf(c->sim.synthetic, sizeof c->sim.synthetic, "llama-3-8b");
    snprintf(c->sim.dtype, sizeof c->sim.dtype, "fp16");
    c->sim.tp = 1;
    c->sim.cuda_graphs = 1;
    c->sim.disaggregated = disaggregated;
    c->kv.prefix_sharing = 0;
    c->scheduler.max_seqs = 8;
    c->scheduler.max_batched_tokens = 1024;
    c->scheduler.prefill_chunk = 1024;
    c->threads = 1;
}

typedef struct pool_run {
    int n[2];
    double t[2][MAX_TOK];        /* token times (ms) of requests 1 and 2 */
    double dec_step_ms;          /* sim_ms of a step of one decode token alone */
    uint64_t bytes_per_token;
    kv_gpu_memory gpu;
} pool_run;

/* Runs n_req requests of 1000-token prompts, all submitted at 0. */
static void pools_run(int disaggregated, int n_req, int max_tokens, pool_run *out) {
    memset(out, 0, sizeof *out);
    kv_config c;
    pools_config(&c, disaggregated);
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int32_t ids[1000];
    for (int r = 0; r < n_req; r++) {
        for (int i = 0; i < 1000; i++) ids[i] = 300 + (i * 7 + r * 13) % 20000;
        CHECK(test_submit(e, NULL, ids, 1000, max_tokens, 1, 0) > 0);
    }
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_event *ev = calloc(MAX_EV, sizeof *ev);
    REQUIRE(ev);
    int n_ev = kv_engine_poll(e, ev, MAX_EV);
    int64_t first = 0;
    for (int i = 0; i < n_ev; i++) {
        if (ev[i].type != KV_EVENT_TOKEN || ev[i].token < 0) continue;
        if (!first) first = ev[i].req;
        int k = ev[i].req == first ? 0 : 1;
        if (out->n[k] < MAX_TOK) out->t[k][out->n[k]++] = ev[i].t_ms;
    }
    free(ev);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s && kv_engine_snapshot(e, s) == 0);
    for (int i = 0; i < s->n_steps; i++)
        if (s->steps[i].n_prefill_tokens == 0 && s->steps[i].n_decode_tokens == 1) out->dec_step_ms = s->steps[i].sim_ms;
    out->bytes_per_token = s->kv_bytes_per_token;
    out->gpu = s->gpu;
    kv_snapshot_free(s);
    kv_engine_free(e);
}

/* One request: its first token comes out of the prefill pool when the
 * prompt's layers are done there (about 2 x 7e9 matmul parameters x 1000
 * tokens at 65% of 989 TFLOPS, 21.7 ms, plus attention, kernel tails
 * of 2 us
 * and about 5 ms of memory-bound vector ops: norms, residual adds, SiLU
 * over 1000 x 14336); its KV (1000 tokens x 128 KiB) crosses one 64 GB/s host link in 2.05 ms
 * plus 2 us; the decode pool then runs one decode step per token. */
static void test_pools_one_request(void) {
    pool_run co, dis;
    pools_run(0, 1, 4, &co);
    pools_run(1, 1, 4, &dis);
    REQUIRE(co.n[0] == 4 && dis.n[0] == 4);
    double xfer = 1000.0 * (double)dis.bytes_per_token / 64e9 * 1e3 + 2e-3;
    CHECKF(dis.bytes_per_token == 131072, "%llu bytes per token", (unsigned long long)dis.bytes_per_token);
    CHECKF(dis.t[0][0] > 21.7 && dis.t[0][0] < 30.0, "TTFT %.3f ms on the prefill pool", dis.t[0][0]);
    /* co-located the same step also embeds, samples and launches: a little more */
    CHECKF(co.t[0][0] > dis.t[0][0] && co.t[0][0] < dis.t[0][0] * 1.05, "TTFT co-located %.3f, prefill pool %.3f",
           co.t[0][0], dis.t[0][0]);
    CHECKF(dis.dec_step_ms > 5.0 && fabs(dis.dec_step_ms - co.dec_step_ms) < 1e-9, "decode step %.4f vs %.4f ms",
           dis.dec_step_ms, co.dec_step_ms);
    /* decode steps differ by one token of context each (0.05 us of KV): 1e-3 ms */
    double gap = dis.t[0][1] - dis.t[0][0];
    CHECKF(fabs(gap - (xfer + dis.dec_step_ms)) < 1e-3, "second token %.6f ms after the first, want %.6f + %.6f",
           gap, xfer, dis.dec_step_ms);
    CHECKF(fabs(dis.t[0][2] - dis.t[0][1] - dis.dec_step_ms) < 1e-3, "third token after %.6f ms",
           dis.t[0][2] - dis.t[0][1]);
    const kv_gpu_memory *g = &dis.gpu;
    CHECK(g->pools == 1 && g->prefill_devices == 1 && g->n_devices == 2 && co.gpu.pools == 0);
    CHECK(g->handovers == 1 && g->prefill_batches == 1 && g->prefill_wait_ms == 0);
    CHECKF(fabs(g->transfer_bytes - 1000.0 * 131072) < 1 && fabs(g->transfer_busy_ms - xfer) < 1e-9,
           "%.0f bytes in %.6f ms", g->transfer_bytes, g->transfer_busy_ms);
    /* the prefill device held the whole prompt's KV until the hand-over, and nothing at the end */
    CHECKF(g->prefill_kv_peak == 131072000ull && g->prefill_kv_used == 0, "prefill KV peak %llu, now %llu",
           (unsigned long long)g->prefill_kv_peak, (unsigned long long)g->prefill_kv_used);
    CHECKF(fabs(g->prefill_busy_ms - dis.t[0][0]) < 1e-6, "prefill pool busy %.6f ms", g->prefill_busy_ms);
}

/* Two requests at once: the first step's 1024-token budget takes request
 * 1's 1000 tokens and 24 of request 2's, the next step the other 976. Co-
 * located, request 1's first decode waits for that 976-token chunk; on
 * separate pools it does not (its step is a decode step), while request 2
 * waits in the prefill pool's queue for the first batch to finish. */
static void test_pools_separate_queues(void) {
    pool_run co, dis;
    pools_run(0, 2, 6, &co);
    pools_run(1, 2, 6, &dis);
    REQUIRE(co.n[0] == 6 && co.n[1] == 6 && dis.n[0] == 6 && dis.n[1] == 6);
    double itl_co = co.t[0][1] - co.t[0][0], itl_dis = dis.t[0][1] - dis.t[0][0];
    CHECKF(itl_co > 15.0 && itl_dis < 0.5 * itl_co, "request 1's second token after %.3f ms co-located, %.3f split",
           itl_co, itl_dis);
    CHECKF(dis.t[1][0] > 1.8 * dis.t[0][0] && dis.t[1][0] < 2.2 * dis.t[0][0], "request 2's TTFT %.3f, request 1's %.3f",
           dis.t[1][0], dis.t[0][0]);
    const kv_gpu_memory *g = &dis.gpu;
    CHECK(g->prefill_batches == 2 && g->handovers == 2);
    /* the second batch was handed over one decode step after the first and
     * waited for it: the mean over two batches is half that wait */
    CHECKF(g->prefill_wait_ms > 0.25 * dis.t[0][0] && g->prefill_wait_ms < 0.5 * dis.t[0][0], "mean wait %.3f ms",
           g->prefill_wait_ms);
    CHECK(g->in_prefill_max >= 1 && g->in_prefill_max <= 2);
}

TEST_MAIN(T(test_pools_one_request), T(test_pools_separate_queues))
