/* test_synth_parallel.c - a synthetic model spread over devices
 * (engine/synth_step.h), checked on cases small enough to work out by
 * hand: disaggregated prefill and decode pools (sim.disaggregated), each on
 * its own clock, the KV's hand-over between them, their memory and queue
 * figures; expert parallelism independent of tensor parallelism (sim.ep,
 * sim.tp): the dispatch cost, memory per device and the refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/engine.h"
#include "../../engine/synth_step.h"
#include "../../engine/synthetic.h"
#include "../engine_helpers.h"
#include "../harness.h"

enum { MAX_TOK = 16, MAX_EV = 4096 };

/* llama-3-8b fp16 on one H100 per pool, one chunk of up to 1024 tokens. */
static void pools_config(kv_config *c, int disaggregated) {
    kv_config_default(c);
    /* through the key table, as a profile or --set would */
    static const char *const kv[][2] = {
        {"backend", "sim"}, {"sim_device", "h100"}, {"model.synthetic", "llama-3-8b"}, {"model.dtype", "fp16"},
        {"sim.tp", "1"}, {"sim.cuda_graphs", "true"}, {"kv.prefix_sharing", "false"}, {"scheduler.max_seqs", "8"},
        {"scheduler.max_batched_tokens", "1024"}, {"scheduler.prefill_chunk", "1024"}, {"threads", "1"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        const kv_config_key *k = kv_config_key_find(kv[i][0]);
        kv_err err;
        CHECKF(k && kv_config_key_parse(k, c, kv[i][1], &err) == 0, "%s=%s: %s", kv[i][0], kv[i][1],
               k ? err.msg : "no such key");
    }
    c->sim.disaggregated = disaggregated;
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

/* Goodput counts the tokens of the requests within the SLA: request 1
 * (10 tokens) gets its first token in one step, request 2 (3 tokens) waits
 * for a second chunk and misses a 40 ms TTFT bound; half the requests but
 * 10 of the 13 tokens are good. */
static void test_goodput_tokens(void) {
    kv_config c;
    pools_config(&c, 0);
    c.sla.ttft_ms = 40;
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int32_t ids[1000];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 1000; i++) ids[i] = 300 + (i * 7 + r * 13) % 20000;
        CHECK(test_submit(e, NULL, ids, 1000, r ? 3 : 10, 1, 0) > 0);
    }
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_metrics_summary m;
    kv_engine_metrics(e, &m);
    CHECKF(m.output_tokens == 13 && m.sla_attainment == 0.5 && m.good_output_tokens == 10, "%llu good of %llu, %.2f",
           (unsigned long long)m.good_output_tokens, (unsigned long long)m.output_tokens, m.sla_attainment);
    kv_engine_free(e);
}

/* ---- expert parallel ------------------------------------------------------ */

static void moe_config(kv_config *c, const char *shape, int tp, int ep) {
    pools_config(c, 0);
    snprintf(c->sim.synthetic, sizeof c->sim.synthetic, "%s", shape);
    c->sim.tp = tp;
    c->sim.ep = ep;
    c->scheduler.max_seqs = 64;
    c->scheduler.max_batched_tokens = 2048;
}

/* Mixtral 8x7B: 32 layers of 8 experts, each three 4096 x 14336 matrices
 * (90.2 GB of the 93.4 GB in fp16). ep 8 over tp 2: four attention groups
 * of two devices; a device holds half the rest and one expert, and a
 * quarter of the KV blocks' halves (each group its own sequences). ep 2
 * under tp 4: four devices, each a quarter of everything. */
static void test_ep_memory(void) {
    kv_config c;
    double experts = 32.0 * 8 * 3 * 4096.0 * 14336.0 * 2;
    int shapes[2][3] = {{2, 8, 8}, {4, 2, 4}}; /* tp, ep, devices */
    for (int k = 0; k < 2; k++) {
        int tp = shapes[k][0], ep = shapes[k][1];
        moe_config(&c, "mixtral-8x7b", tp, ep);
        kv_engine *e = test_engine_new(&c);
        REQUIRE(e);
        kv_snapshot *s = kv_snapshot_new();
        REQUIRE(s && kv_engine_snapshot(e, s) == 0);
        const kv_gpu_memory *g = &s->gpu;
        double w = (double)s->mem.weights, want = (w - experts) / tp + experts / (ep > tp ? ep : tp);
        CHECKF(g->n_devices == shapes[k][2] && g->tp == tp && g->ep == ep, "%d devices", g->n_devices);
        CHECKF(fabs((double)g->weights - want) < 1e3, "tp %d ep %d: %.3f GB a device, want %.3f (of %.1f GB)", tp, ep,
               g->weights / 1e9, want / 1e9, w / 1e9);
        /* a block (16 tokens x 128 KiB) is split over tp heads' devices, and ep / tp groups hold their own */
        double share = 16.0 * 131072 / tp / (ep > tp ? ep / tp : 1);
        CHECKF(s->kv_bytes_per_token == 131072 && fabs(s->n_blocks * share - (double)g->kv_free) < share,
               "%d blocks, %.3f GB free a device", s->n_blocks, g->kv_free / 1e9);
        CHECK(g->usd_per_hour == shapes[k][2] * 2.99);
        kv_snapshot_free(s);
        kv_engine_free(e);
    }
}

/* The dispatch and combine of 256 tokens: ep 8 over tp 2 sends each
 * device's 32 tokens x 2 experts x 4096 x 2 bytes (512 KiB), 7/8 of it over
 * a 450 GB/s NVLink port plus 2 us, twice; ep 2 under tp 4 all-reduces the
 * 2 MiB stream over four devices (2 x 3/4 of it plus 6 latencies). */
static void test_ep_dispatch_cost(void) {
    kv_config c;
    kv_err err = {0};
    int shapes[2][2] = {{2, 8}, {4, 2}};
    for (int k = 0; k < 2; k++) {
        moe_config(&c, "mixtral-8x7b", shapes[k][0], shapes[k][1]);
        kv_model *m = kv_synth_model_new(&c, &err);
        kv_backend *b = kv_backend_create_on("sim", "h100", 1, &err);
        REQUIRE(m && b);
        kv_synth *s = kv_synth_new(m, &c, b, kv_model_kv_bytes_per_token(m, KV_CACHE_F16) * 16, 16, 2048, 64, &err);
        REQUIRE(s);
        double stream = 256.0 * 4096 * 2, want = k == 0 ? 2.0 * (7.0 / 8 * stream * 2 / 8 / 450e9 + 2e-6)
                                                        : 2.0 * 3 / 4 * stream / 450e9 + 6 * 2e-6;
        double got = kv_synth_moe_comm_s(s, 256);
        CHECKF(fabs(got - want) < 1e-12, "tp %d ep %d: %.3f us, want %.3f", shapes[k][0], shapes[k][1], got * 1e6,
               want * 1e6);
        kv_synth_free(s);
        kv_backend_free(b);
        kv_model_free(m);
    }
    /* a dense model has none */
    moe_config(&c, "llama-3-8b", 2, 1);
    kv_model *m = kv_synth_model_new(&c, &err);
    kv_backend *b = kv_backend_create_on("sim", "h100", 1, &err);
    REQUIRE(m && b);
    kv_synth *s = kv_synth_new(m, &c, b, kv_model_kv_bytes_per_token(m, KV_CACHE_F16) * 16, 16, 2048, 64, &err);
    REQUIRE(s);
    CHECK(kv_synth_moe_comm_s(s, 256) == 0.0);
    kv_synth_free(s);
    kv_backend_free(b);
    kv_model_free(m);
}

/* Skewed routing: the busiest device of ep 8 gets (1 + skew) x its share
 * of the routed tokens, so a compute-bound 2048-token prefill step grows
 * with the skew (its expert rows double at skew 1), while a 256-token
 * decode step, which reads its device's one expert either way, barely
 * moves; and the refusals. */
static void test_ep_skew_and_refusals(void) {
    kv_config c;
    double t[2], tp_[2];
    for (int k = 0; k < 2; k++) {
        moe_config(&c, "mixtral-8x7b", 1, 8);
        c.sim.ep_skew = k ? 1.0 : 0.0;
        c.scheduler.max_seqs = 256;
        kv_engine *e = test_engine_new(&c);
        REQUIRE(e);
        int32_t ids[16];
        for (int r = 0; r < 256; r++) {
            for (int i = 0; i < 16; i++) ids[i] = 300 + (r * 16 + i) % 20000;
            CHECK(test_submit(e, NULL, ids, 16, 6, 1, 0) > 0);
        }
        CHECK(kv_engine_run_until_idle(e) == 0);
        kv_snapshot *s = kv_snapshot_new();
        REQUIRE(s && kv_engine_snapshot(e, s) == 0);
        t[k] = tp_[k] = 0;
        for (int i = 0; i < s->n_steps; i++) {
            if (s->steps[i].n_decode_tokens == 256) t[k] = s->steps[i].sim_ms;
            if (s->steps[i].n_prefill_tokens == 2048 && tp_[k] == 0) tp_[k] = s->steps[i].sim_ms;
        }
        kv_snapshot_free(s);
        kv_engine_free(e);
    }
    CHECKF(tp_[0] > 0 && tp_[1] > 1.3 * tp_[0], "2048-token prefill step %.3f ms, skew 1: %.3f ms", tp_[0], tp_[1]);
    CHECKF(t[0] > 0 && t[1] > t[0] && t[1] < 1.1 * t[0], "256-token decode step %.3f ms, skew 1: %.3f ms", t[0], t[1]);
    struct {
        const char *shape;
        int tp, ep;
        const char *msg;
    } bad[] = {{"mixtral-8x7b", 1, 3, "do not split evenly over 3"},
               {"mixtral-8x7b", 3, 8, "one must divide the other"},
               {"mixtral-8x7b", 1, 16, "16 devices for 8 experts"},
               {"llama-3-8b", 1, 2, "dense"},
               {"qwen3-30b-a3b", 1, 128, "attention groups for at most 64"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kv_err err = {0};
        moe_config(&c, bad[i].shape, bad[i].tp, bad[i].ep);
        CHECKF(kv_engine_new(&c, &err) == NULL && strstr(err.msg, bad[i].msg), "%s tp %d ep %d: %s", bad[i].shape,
               bad[i].tp, bad[i].ep, err.msg);
    }
}

/* ---- swap and copy-on-write under tensor parallel ------------------------ */

/* Llama 3 70B over tp 4: a device holds 2 of the 8 KV heads, so a swapped
 * block moves a quarter of its bytes on each device's own PCIe link at once
 * (64 GB/s + 4 us), and a copied block a quarter of its reads and writes. */
static void test_tp_swap_share(void) {
    kv_config c;
    kv_err err = {0};
    double t[2][2]; /* tp 1, 4: download, copy */
    for (int k = 0; k < 2; k++) {
        moe_config(&c, "llama-3-70b", k ? 4 : 1, 1);
        snprintf(c.sim.dtype, sizeof c.sim.dtype, "int4");
        snprintf(c.sim_device, sizeof c.sim_device, "h200");
        kv_model *m = kv_synth_model_new(&c, &err);
        kv_backend *b = kv_backend_create_on("sim", "h200", 1, &err);
        REQUIRE(m && b);
        uint64_t block = kv_model_kv_bytes_per_token(m, KV_CACHE_F16) * 16;
        kv_synth *s = kv_synth_new(m, &c, b, block, 16, 2048, 64, &err);
        REQUIRE(s);
        kv_backend_clock clk;
        kv_backend_clock_get(b, &clk);
        double t0 = clk.elapsed_s;
        b->ops->download(b, NULL, NULL, (size_t)block);
        kv_backend_clock_get(b, &clk);
        t[k][0] = clk.elapsed_s - t0;
        kv_pages pg = {.n_layers = 80, .block_size = 16, .slot_bytes = (size_t)block / 16 / 80 / 2};
        t0 = clk.elapsed_s;
        b->ops->copy_block(b, &pg, 1, 0);
        kv_backend_clock_get(b, &clk);
        t[k][1] = clk.elapsed_s - t0;
        kv_synth_free(s);
        kv_backend_free(b);
        kv_model_free(m);
    }
    double want0 = 5242880.0 / 64e9 + 4e-6, want4 = 5242880.0 / 4 / 64e9 + 4e-6;
    CHECKF(fabs(t[0][0] - want0) < 1e-12 && fabs(t[1][0] - want4) < 1e-12, "swap of a block %.3f us, tp 4 %.3f us",
           t[0][0] * 1e6, t[1][0] * 1e6);
    /* K and V (2 x 2.5 MiB) read and written through HBM at 80% of 4.8 TB/s, plus the launch */
    double c1 = 2.0 * 5242880 / (4.8e12 * 0.8) + 4e-6, c4 = 2.0 * 5242880 / 4 / (4.8e12 * 0.8) + 4e-6;
    CHECKF(fabs(t[0][1] - c1) < 1e-12 && fabs(t[1][1] - c4) < 1e-12, "copy of a block %.3f us, tp 4 %.3f us",
           t[0][1] * 1e6, t[1][1] * 1e6);
}

TEST_MAIN(T(test_pools_one_request), T(test_pools_separate_queues), T(test_goodput_tokens), T(test_ep_memory), T(test_ep_dispatch_cost),
          T(test_ep_skew_and_refusals), T(test_tp_swap_share))
