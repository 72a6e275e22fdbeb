/* test_synthetic.c - synthetic models on the sim backend (engine/synthetic.h,
 * synth_step.h): the CPU-computed sim and the synthetic model of the same
 * shape make identical scheduling decisions and step times on one
 * workload (prefix sharing, preemption by swap and recompute included);
 * published shapes give published sizes; a model that does not fit is
 * refused with the numbers; parallelism moves the step time the way it
 * should; synthetic ids are deterministic and never end a request. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/engine.h"
#include "../../engine/sampler.h"
#include "../../engine/synth_step.h"
#include "../../engine/synthetic.h"
#include "../engine_helpers.h"
#include "../harness.h"

enum { N_REQ = 10, MAX_STEPS = 240 };

/* What a run decided and how long each step took. */
typedef struct run_rec {
    int n_steps, n_dec;
    kv_step_record steps[MAX_STEPS];
    kv_decision dec[1024];
    double device_s;
    uint64_t out_tokens, preemptions, swaps;
} run_rec;

/* The workload: ten requests of token ids valid in both vocabularies,
 * half of them sharing a 40-token prefix, on a pool small enough that
 * requests are preempted (by swap when swap is set). */
static void config(kv_config *c, int synthetic, int swap) {
    test_engine_config(c, NULL, 1, 24, 6, 64);
    snprintf(c->backend, sizeof c->backend, "sim");
    snprintf(c->sim_device, sizeof c->sim_device, "a100-80g");
    c->scheduler.prefill_chunk = 24;
    c->sampling.temperature = 0;
    if (swap) {
        c->scheduler.preemption = KV_PREEMPT_SWAP;
        c->kv.swap_memory = 64ull << 10;
    }
    if (synthetic) {
        snprintf(c->sim.synthetic, sizeof c->sim.synthetic, "stories-260k");
        snprintf(c->sim.dtype, sizeof c->sim.dtype, "f32"); /* what stories260K.gguf stores */
        c->sim.context = 2048;                               /* what its header says */
        c->sim.host_logits = 1;                              /* the CPU-computed sim samples on the host */
    }
}

static void run(int synthetic, int swap, run_rec *out) {
    memset(out, 0, sizeof *out);
    kv_config c;
    config(&c, synthetic, swap);
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    kv_rng rng;
    kv_rng_seed(&rng, 7);
    int32_t shared[40], ids[120];
    for (int i = 0; i < 40; i++) shared[i] = 3 + (int32_t)(kv_rng_next(&rng) % 500);
    for (int r = 0; r < N_REQ; r++) {
        int n = 30 + (int)(kv_rng_next(&rng) % 80);
        for (int i = 0; i < n; i++) ids[i] = (r % 2 == 0 && i < 40) ? shared[i] : 3 + (int32_t)(kv_rng_next(&rng) % 500);
        CHECK(test_submit(e, NULL, ids, n, 12 + r * 3, 1, 0) > 0);
    }
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s);
    REQUIRE(kv_engine_snapshot(e, s) == 0);
    CHECK(s->n_steps < MAX_STEPS);
    out->n_steps = s->n_steps < MAX_STEPS ? s->n_steps : MAX_STEPS;
    memcpy(out->steps, s->steps, (size_t)out->n_steps * sizeof *s->steps);
    out->n_dec = s->n_decisions < 1024 ? s->n_decisions : 1024;
    memcpy(out->dec, s->decisions, (size_t)out->n_dec * sizeof *s->decisions);
    out->device_s = s->metrics.sim_device_s;
    out->out_tokens = s->metrics.output_tokens;
    out->preemptions = s->metrics.preemptions;
    out->swaps = s->metrics.swaps_out;
    CHECK(s->metrics.requests_completed == N_REQ);
    CHECK(s->gpu.valid == synthetic);
    kv_snapshot_free(s);
    kv_engine_free(e);
}

/* Identical decisions and step times, bit for bit: the synthetic step
 * charges the clock the same ops with the same costs in the same order. */
static void compare_runs(int swap) {
    static run_rec a, b;
    run(0, swap, &a);
    run(1, swap, &b);
    CHECKF(a.n_steps == b.n_steps && a.n_steps > 20, "steps %d vs %d", a.n_steps, b.n_steps);
    CHECKF(a.preemptions > 0, "the workload preempts (%llu)", (unsigned long long)a.preemptions);
    if (swap) CHECKF(a.swaps > 0 && a.swaps == b.swaps, "swaps %llu vs %llu", (unsigned long long)a.swaps,
                     (unsigned long long)b.swaps);
    CHECK(a.out_tokens == b.out_tokens && a.preemptions == b.preemptions);
    int n = a.n_steps < b.n_steps ? a.n_steps : b.n_steps, shared = 0;
    for (int i = 0; i < n; i++) {
        const kv_step_record *x = &a.steps[i], *y = &b.steps[i];
        CHECKF(x->n_seqs == y->n_seqs && x->n_prefill_tokens == y->n_prefill_tokens &&
                   x->n_decode_tokens == y->n_decode_tokens && x->n_preempted == y->n_preempted &&
                   x->n_swapped_out == y->n_swapped_out && x->n_cow == y->n_cow && x->n_blocks_used == y->n_blocks_used,
               "step %d: batch differs", i);
        CHECKF(x->sim_ms == y->sim_ms && x->sim_ms > 0, "step %d: %.17g ms vs %.17g ms", i, x->sim_ms, y->sim_ms);
        CHECK(x->t_ms == y->t_ms);
    }
    CHECK(a.n_dec == b.n_dec);
    for (int i = 0; i < a.n_dec && i < b.n_dec; i++) {
        CHECKF(a.dec[i].kind == b.dec[i].kind && a.dec[i].req == b.dec[i].req && !strcmp(a.dec[i].text, b.dec[i].text),
               "decision %d: '%s' vs '%s'", i, a.dec[i].text, b.dec[i].text);
        shared += a.dec[i].kind == KV_DEC_SHARE || strstr(a.dec[i].text, "from prefix cache") != NULL;
    }
    CHECKF(shared > 0, "the workload shares a prefix");
    CHECKF(a.device_s == b.device_s && a.device_s > 0, "device %.17g s vs %.17g s", a.device_s, b.device_s);
}

static void test_synthetic_matches_cpu_sim(void) { compare_runs(0); }
static void test_synthetic_matches_cpu_sim_swap(void) { compare_runs(1); }

/* ---- shapes and sizes ---------------------------------------------------- */

static kv_model *model_of(const char *shape, const char *dtype, kv_err *err) {
    kv_config c;
    kv_config_default(&c);
    snprintf(c.sim.synthetic, sizeof c.sim.synthetic, "%s", shape);
    snprintf(c.sim.dtype, sizeof c.sim.dtype, "%s", dtype);
    return kv_synth_model_new(&c, err);
}

static void test_synthetic_shapes(void) {
    /* published parameter counts (model cards): the shape table must give them */
    const struct {
        const char *name;
        double params;
    } want[] = {{"llama-2-7b", 6.74e9},  {"llama-2-13b", 13.0e9},  {"llama-3-8b", 8.03e9},   {"llama-3-70b", 70.6e9},
                {"mixtral-8x7b", 46.7e9}, {"qwen3-30b-a3b", 30.5e9}, {"smollm2-135m", 0.135e9}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kv_err err = {0};
        kv_model *m = model_of(want[i].name, "fp16", &err);
        if (!m) fprintf(stderr, "  %s: %s\n", want[i].name, err.msg);
        REQUIRE(m);
        double p = (double)m->n_params;
        CHECKF(fabs(p / want[i].params - 1.0) < 0.02, "%s: %.3g parameters, published %.3g", want[i].name, p,
               want[i].params);
        CHECK(m->synthetic && m->layers == NULL && fabs((double)m->weight_bytes / (2.0 * p) - 1.0) < 0.001);
        kv_model_free(m);
    }
    kv_err err = {0};
    kv_model *m = model_of("llama-3-70b", "fp16", &err);
    REQUIRE(m);
    CHECK(kv_model_kv_bytes_per_token(m, KV_CACHE_F16) == 327680); /* 80 layers x 8 kv heads x 128 x 2 x 2 B */
    CHECK(m->hp.n_vocab == 128256 && kv_tokenizer_n_vocab(m->tok) == 128256);
    /* the made-up vocabulary: bytes encode as byte tokens (the SentencePiece
     * space mark is 3 of them), ids decode to words */
    int32_t ids[64];
    int n = kv_tokenizer_encode(m->tok, "hi there", 8, 0, 0, ids, 64, NULL);
    CHECKF(n == 13, "%d ids", n);
    for (int i = 0; i < n; i++) CHECK(ids[i] >= 3 && ids[i] < 259);
    /* synthetic ids: deterministic, never special, never a byte */
    for (int pos = 0; pos < 1000; pos++) {
        int32_t t = kv_synth_token(m, 5, 3, pos);
        CHECK(t >= 259 && t < m->hp.n_vocab && !kv_tokenizer_is_eog(m->tok, t) && t == kv_synth_token(m, 5, 3, pos));
    }
    CHECK(kv_synth_token(m, 5, 3, 0) != kv_synth_token(m, 6, 3, 0) || kv_synth_token(m, 5, 3, 1) != kv_synth_token(m, 6, 3, 1));
    kv_model_free(m);
    /* int4 weights: a quarter of fp16 plus scales */
    kv_model *q = model_of("llama-3-70b", "int4", &err);
    REQUIRE(q);
    CHECK(q->weight_bytes < 0.27 * 2.0 * (double)q->n_params && q->weight_bytes > 0.25 * 2.0 * (double)q->n_params);
    kv_model_free(q);
    /* bad input: named */
    CHECK(model_of("llama-9-1t", "fp16", &err) == NULL && strstr(err.msg, "llama-9-1t") && strstr(err.msg, "llama-3-70b"));
    CHECK(model_of("llama-3-70b", "fp4", &err) == NULL && strstr(err.msg, "model.dtype"));
    kv_config c;
    kv_config_default(&c);
    snprintf(c.sim.synthetic, sizeof c.sim.synthetic, "custom");
    c.sim.layers = 4, c.sim.dim = 512, c.sim.heads = 8, c.sim.kv_heads = 3, c.sim.ffn_dim = 1024, c.sim.vocab = 1000;
    c.sim.context = 4096;
    CHECK(kv_synth_model_new(&c, &err) == NULL && strstr(err.msg, "kv_heads"));
    c.sim.kv_heads = 2;
    kv_model *cu = kv_synth_model_new(&c, &err);
    CHECKF(cu && cu->hp.head_dim == 64 && cu->hp.n_kv_heads == 2, "%s", err.msg);
    kv_model_free(cu);
}

/* ---- the memory plan ------------------------------------------------------ */

static void synth_config(kv_config *c, const char *shape, const char *dtype, const char *dev, int tp) {
    kv_config_default(c);
    snprintf(c->backend, sizeof c->backend, "sim");
    snprintf(c->sim_device, sizeof c->sim_device, "%s", dev);
    snprintf(c->sim.synthetic, sizeof c->sim.synthetic, "%s", shape);
    snprintf(c->sim.dtype, sizeof c->sim.dtype, "%s", dtype);
    c->sim.tp = tp;
    c->scheduler.max_seqs = 64;
    c->scheduler.max_batched_tokens = 2048;
    c->threads = 1;
}

static void test_synthetic_memory_plan(void) {
    kv_config c;
    kv_err err = {0};
    synth_config(&c, "llama-3-70b", "fp16", "a100-80g", 1);
    CHECK(kv_engine_new(&c, &err) == NULL);
    CHECKF(strstr(err.msg, "141.1 GB of weights") && strstr(err.msg, "a100-80g") && strstr(err.msg, "85.9 GB"),
           "%s", err.msg);
    /* parallelism is for synthetic models only */
    kv_config real;
    kv_config_default(&real);
    real.sim.tp = 2;
    CHECK(kv_config_validate(&real, &err) == KV_ERR_INVAL && strstr(err.msg, "model.synthetic"));
    /* on a cpu backend a synthetic model has nothing to run on */
    synth_config(&c, "llama-3-70b", "fp16", "a100-80g", 2);
    snprintf(c.backend, sizeof c.backend, "cpu");
    CHECK(kv_engine_new(&c, &err) == NULL && strstr(err.msg, "backend: sim"));
    /* two A100s hold it; each holds half the weights and a share of the KV cache */
    synth_config(&c, "llama-3-70b", "fp16", "a100-80g", 2);
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s && kv_engine_snapshot(e, s) == 0);
    const kv_gpu_memory *g = &s->gpu;
    CHECK(g->valid && g->n_devices == 2 && g->tp == 2 && !strcmp(g->device, "a100-80g"));
    CHECK(fabs(g->weights - 141.1e9 / 2) < 0.1e9);
    double planned = (double)g->weights + g->kv_used + g->kv_cached + g->kv_free + g->activations + g->reserve;
    CHECKF(planned <= (double)g->usable && planned > (double)g->usable - 2.0 * 327680 * 16 / 2,
           "%.0f planned of %.0f usable", planned, (double)g->usable);
    /* the cache's blocks are that share: a block of 16 tokens is 5 MiB over two devices */
    CHECK(fabs((double)s->n_blocks * 327680.0 * 16 / 2 - (double)g->kv_free) < 1e6);
    CHECK(s->kv_bytes_per_token == 327680 && g->usd_per_hour == 2 * 1.79);
    kv_snapshot_free(s);
    kv_engine_free(e);
    /* a draft model file is refused, not ignored; so is expert parallel on a dense model */
    synth_config(&c, "llama-3-8b", "fp16", "h100", 1);
    c.spec.method = KV_SPEC_DRAFT_MODEL;
    snprintf(c.spec.draft_model, sizeof c.spec.draft_model, "x.gguf");
    CHECK(kv_engine_new(&c, &err) == NULL && strstr(err.msg, "spec.method"));
    synth_config(&c, "llama-3-8b", "fp16", "h100", 2);
    c.sim.ep = 2;
    CHECK(kv_engine_new(&c, &err) == NULL && strstr(err.msg, "dense"));
}

/* ---- the step time -------------------------------------------------------- */

/* Simulated seconds of one decode step of `batch` sequences at context
 * ctx, after their prefill. */
static double decode_step_s(kv_config *c, int batch, int ctx) {
    c->scheduler.max_batched_tokens = 8192;
    c->scheduler.prefill_chunk = 8192;
    c->scheduler.max_seqs = batch;
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    int32_t *ids = malloc((size_t)ctx * sizeof *ids);
    for (int i = 0; i < ctx; i++) ids[i] = 300 + (i * 7919 + batch) % 20000;
    for (int b = 0; b < batch; b++) {
        ids[0] = 300 + b; /* no sharing */
        test_submit(e, NULL, ids, ctx, 40, 1, 0);
    }
    free(ids);
    kv_engine_run_until_idle(e);
    kv_snapshot *s = kv_snapshot_new();
    double t = -1;
    if (s && kv_engine_snapshot(e, s) == 0)
        for (int i = 0; i < s->n_steps; i++)
            if (s->steps[i].n_decode_tokens == batch && s->steps[i].n_prefill_tokens == 0) t = s->steps[i].sim_ms / 1e3;
    kv_snapshot_free(s);
    kv_engine_free(e);
    return t;
}

static void test_synthetic_step_time(void) {
    kv_config c;
    synth_config(&c, "llama-3-8b", "fp16", "h100", 1);
    double t1 = decode_step_s(&c, 1, 128);
    /* batch-1 decode is bound by reading 16 GB of weights at 0.8 x 3.35 TB/s */
    double floor_s = 16.06e9 / (3.35e12 * 0.8);
    CHECKF(t1 > floor_s && t1 < floor_s * 1.5, "8B batch-1 step %.2f ms (floor %.2f)", t1 * 1e3, floor_s * 1e3);
    /* a bigger batch costs little more (the weights are read once) */
    double t32 = decode_step_s(&c, 32, 128);
    CHECKF(t32 > t1 && t32 < 1.3 * t1, "batch 32 %.2f ms vs batch 1 %.2f ms", t32 * 1e3, t1 * 1e3);
    /* int8 weights halve what a memory-bound step reads */
    synth_config(&c, "llama-3-8b", "int8", "h100", 1);
    double ti = decode_step_s(&c, 1, 128);
    CHECKF(ti < 0.65 * t1 && ti > 0.4 * t1, "int8 %.2f ms vs fp16 %.2f ms", ti * 1e3, t1 * 1e3);
    /* long contexts read their KV: 32 sequences of 4K tokens add 32 x 4K x 128 KiB = 17 GB */
    synth_config(&c, "llama-3-8b", "fp16", "h100", 1);
    double tl = decode_step_s(&c, 32, 4096);
    CHECKF(tl > t32 + 0.9 * 17.2e9 / (3.35e12 * 0.8), "32 x 4K: %.2f ms vs 32 x 128: %.2f ms", tl * 1e3, t32 * 1e3);
    /* tensor parallel: a quarter of the weights per device plus all-reduces; pipeline
     * parallel does not speed a memory-bound decode step up */
    synth_config(&c, "llama-3-70b", "fp16", "h100", 4);
    c.sim.cuda_graphs = 1;
    double tp4 = decode_step_s(&c, 8, 256);
    synth_config(&c, "llama-3-70b", "fp16", "h100", 1);
    c.sim.pp = 4;
    c.sim.cuda_graphs = 1;
    double pp4 = decode_step_s(&c, 8, 256);
    CHECKF(tp4 > 0 && pp4 > 2.0 * tp4, "70B decode: TP=4 %.2f ms, PP=4 %.2f ms", tp4 * 1e3, pp4 * 1e3);
    CHECKF(tp4 > 141e9 / 4 / (3.35e12 * 0.8), "TP=4 %.2f ms is below the weight-read floor", tp4 * 1e3);
}

/* Synthetic speculative decoding: drafts accepted per position with
 * probability p give (1 - p^(k+1)) / (1 - p) tokens per verify, the same
 * tokens as plain decoding, and a speed-up when p is high; a self draft of
 * 8 of 80 layers makes a low p a slow-down. */
static double spec_run(int method, double p, double *mean_len, uint64_t *out_tokens) {
    kv_config c;
    synth_config(&c, "llama-3-70b", "fp16", "h100", 4);
    c.sim.cuda_graphs = 1;
    c.spec.method = (kv_spec_method)method;
    c.spec.k = 4;
    c.spec.adaptive = 0;
    c.spec.min_acceptance = 0;
    c.spec.draft_layers = 8;
    c.sim.spec_acceptance = p;
    kv_engine *e = test_engine_new(&c);
    if (!e) return -1;
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = 400 + i;
    for (int r = 0; r < 4; r++) {
        ids[0] = 300 + r;
        test_submit(e, NULL, ids, 64, 200, 1, 0);
    }
    kv_engine_run_until_idle(e);
    kv_metrics_summary m;
    kv_engine_metrics(e, &m);
    *mean_len = m.spec_mean_accepted_len;
    *out_tokens = m.output_tokens;
    kv_engine_free(e);
    return m.sim_device_s;
}

static void test_synthetic_spec(void) {
    double len, len_hi, len_lo;
    uint64_t n0, n1, n2;
    double t_off = spec_run(KV_SPEC_OFF, 0, &len, &n0);
    double t_hi = spec_run(KV_SPEC_SELF, 0.9, &len_hi, &n1);
    double t_lo = spec_run(KV_SPEC_SELF, 0.2, &len_lo, &n2);
    CHECK(n0 == 800 && n1 == 800 && n2 == 800);
    double want_hi = (1 - pow(0.9, 5)) / 0.1, want_lo = (1 - pow(0.2, 5)) / 0.8;
    CHECKF(fabs(len_hi - want_hi) < 0.25 && fabs(len_lo - want_lo) < 0.15, "accepted length %.2f (%.2f), %.2f (%.2f)",
           len_hi, want_hi, len_lo, want_lo);
    CHECKF(t_hi > 0 && t_off / t_hi > 2.0, "p = 0.9: %.2fx", t_off / t_hi);
    CHECKF(t_lo > t_off, "p = 0.2: %.2fx (a slow-down)", t_off / t_lo);
}

/* A bad batch is refused and charges nothing; a good one charges. */
static void test_synthetic_step_checks(void) {
    kv_config c;
    synth_config(&c, "llama-3-8b", "fp16", "h100", 1);
    kv_err err = {0};
    kv_model *m = kv_synth_model_new(&c, &err);
    kv_backend *b = kv_backend_create_on("sim", "h100", 1, &err);
    REQUIRE(m && b);
    kv_synth *s = kv_synth_new(m, &c, b, kv_model_kv_bytes_per_token(m, KV_CACHE_F16) * 16, 16, 8, 2, &err);
    REQUIRE(s);
    int32_t tok[3] = {300, 301, 302}, pos[3] = {0, 1, 0}, seq[3] = {0, 0, 1}, rows[2] = {1, 2};
    kv_batch bt = {.n_tokens = 3, .tokens = tok, .ab = {.n_tokens = 3, .pos = pos, .seq = seq, .n_seqs = 2},
                   .n_logits = 2, .logit_rows = rows};
    kv_backend_clock clk;
    kv_backend_clock_get(b, &clk);
    double t0 = clk.elapsed_s;
    seq[2] = 2; /* no such sequence */
    CHECK(kv_synth_step(s, &bt, &err) == KV_ERR_RANGE && strstr(err.msg, "sequence"));
    seq[2] = 1;
    rows[1] = 3;
    CHECK(kv_synth_step(s, &bt, &err) == KV_ERR_RANGE && strstr(err.msg, "logit row"));
    rows[1] = 2;
    bt.n_tokens = 9; /* beyond max_tokens */
    CHECK(kv_synth_step(s, &bt, &err) == KV_ERR_INVAL);
    bt.n_tokens = 3;
    kv_backend_clock_get(b, &clk);
    CHECK(clk.elapsed_s == t0);
    CHECK(kv_synth_step(s, &bt, &err) == 0);
    kv_backend_clock_get(b, &clk);
    CHECK(clk.elapsed_s > t0 + 16e9 / 3.35e12); /* at least the weights' read */
    /* a synthetic model needs a backend with a clock to charge */
    kv_backend *cpu = kv_backend_create("cpu", 1, &err);
    REQUIRE(cpu);
    CHECK(kv_synth_new(m, &c, cpu, 1 << 20, 16, 8, 2, &err) == NULL && strstr(err.msg, "backend: sim"));
    kv_backend_free(cpu);
    kv_synth_free(s);
    kv_backend_free(b);
    kv_model_free(m);
}

/* Disaggregated: a second TP group for prefill (twice the devices and the
 * price); a pure decode step costs what it costs co-located, and a step
 * whose batch mixes a prefill chunk with decode tokens costs the decode
 * pool only its decode tokens (the chunk runs on the prefill pool's clock:
 * test_synth_pools.c). */
static void test_synthetic_disaggregated(void) {
    kv_config c;
    double t_mixed[2] = {0, 0}, t_dec[2] = {0, 0};
    for (int dis = 0; dis < 2; dis++) {
        synth_config(&c, "llama-3-8b", "fp16", "h100", 2);
        c.sim.disaggregated = dis;
        c.sim.cuda_graphs = 1;
        c.scheduler.max_batched_tokens = 1024;
        c.scheduler.prefill_chunk = 1024;
        kv_engine *e = test_engine_new(&c);
        REQUIRE(e);
        int32_t ids[3000];
        for (int i = 0; i < 3000; i++) ids[i] = 300 + i;
        CHECK(test_submit(e, NULL, ids, 100, 20, 1, 0) > 0);
        for (int i = 0; i < 4; i++) /* #1 decoding (split: once its KV is on the decode pool) */
            if (kv_engine_step(e) == 0 && kv_engine_hold_wait_ms(e) > 0)
                kv_engine_advance_clock(e, kv_engine_hold_wait_ms(e));
        ids[0] = 7;
        CHECK(test_submit(e, NULL, ids, 3000, 4, 1, 0) > 0); /* a long prompt joins */
        CHECK(kv_engine_run_until_idle(e) == 0);
        kv_snapshot *s = kv_snapshot_new();
        REQUIRE(s && kv_engine_snapshot(e, s) == 0);
        CHECK(s->gpu.n_devices == (dis ? 4 : 2) && s->gpu.usd_per_hour == (dis ? 4 : 2) * 2.99);
        for (int i = 0; i < s->n_steps; i++) {
            const kv_step_record *r = &s->steps[i];
            if (r->n_prefill_tokens > 500 && r->n_decode_tokens == 1) t_mixed[dis] = r->sim_ms;
            if (r->n_prefill_tokens == 0 && r->n_decode_tokens == 1) t_dec[dis] = r->sim_ms;
        }
        kv_snapshot_free(s);
        kv_engine_free(e);
    }
    CHECKF(t_dec[0] > 0 && fabs(t_dec[1] - t_dec[0]) < 1e-4 * t_dec[0], "decode step %g vs %g ms", t_dec[0], t_dec[1]);
    CHECKF(t_mixed[0] > 0 && t_mixed[1] > 0 && t_mixed[1] < 0.5 * t_mixed[0] && t_mixed[1] < 1.1 * t_dec[1],
           "mixed step co-located %g ms, disaggregated %g ms", t_mixed[0], t_mixed[1]);
}

TEST_MAIN(T(test_synthetic_matches_cpu_sim), T(test_synthetic_matches_cpu_sim_swap), T(test_synthetic_shapes),
          T(test_synthetic_memory_plan), T(test_synthetic_step_time),
          T(test_synthetic_step_checks), T(test_synthetic_disaggregated), T(test_synthetic_spec))
