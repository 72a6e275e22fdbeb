/* test_window_release.c - sliding-window release through the whole engine
 * (kv.window_release, engine/kv_cache_window.c): greedy output with
 * release on equals the output with it off, request for request, on a
 * random gemma3 file (window 16, prompts and outputs past it) and on
 * Gemma 3 270M (window 512, prompts past it): batched, prefix sharing on
 * and off, chunked prefill, preemption by recompute and by swap in a tiny
 * cache, and speculation (self drafts and n-grams, with rejected drafts).
 * Each run checks the engine's invariants (kv_cache_check's window ones
 * included) after every step, and that release did happen; and in one
 * kv.memory more requests run at once with release on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/engine.h"
#include "../../engine/mkmodel.h"
#include "../engine_helpers.h"
#include "../harness.h"

enum { NP = 6, COPIES = 3, NREQ = NP * COPIES, MAXOUT = 48 };

typedef struct outputs {
    int n[NREQ];
    int32_t tok[NREQ][MAXOUT];
    uint64_t released;   /* local parts released during the run */
    uint64_t saved_max;  /* largest kv_window_saved seen */
    uint64_t preemptions, hit_tokens;
    int max_running;     /* most requests running at once */
} outputs;

/* Token ids of a prompt of n tokens (ids 3.., shared heads per family). */
static void prompt_ids(int i, int n, int n_vocab, int32_t *out) {
    for (int t = 0; t < n; t++) out[t] = 3 + (int32_t)((t < n / 2 ? (i % 2) * 101 + t * 7 : i * 131 + t * 13) % (n_vocab - 3));
}

/* Runs every request batched under c; checks the engine after every step. */
static int run(const kv_config *c, const int *plen, const int *maxt, int nreq, outputs *out) {
    memset(out, 0, sizeof *out);
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    const int nv = kv_engine_model(e)->hp.n_vocab;
    int64_t ids[NREQ];
    int32_t toks[2048];
    for (int i = 0; i < nreq; i++) {
        prompt_ids(i % NP, plen[i % NP], nv, toks);
        if ((ids[i] = test_submit(e, NULL, toks, plen[i % NP], maxt[i % NP], 1, i)) <= 0) {
            kv_engine_free(e);
            return -1;
        }
    }
    kv_snapshot *snap = kv_snapshot_new();
    if (!snap) {
        kv_engine_free(e);
        return -1;
    }
    int rc = 0, steps = 0;
    char msg[256];
    while ((rc = kv_engine_step(e)) > 0 && steps++ < 100000) {
        if (kv_engine_check(e, msg, sizeof msg) != 0) {
            CHECKF(0, "after step %d: %s", steps, msg);
            rc = -1;
            break;
        }
        if (kv_engine_snapshot(e, snap) == 0 && snap->mem.kv_window_saved > out->saved_max)
            out->saved_max = snap->mem.kv_window_saved;
        out->released = snap->local_released;
    }
    kv_event ev[256];
    int k;
    while ((k = kv_engine_poll(e, ev, 256)) > 0)
        for (int j = 0; j < k; j++) {
            int i = ev[j].session;
            if (i < 0 || i >= nreq || ev[j].req != ids[i]) continue;
            if (ev[j].type == KV_EVENT_TOKEN && ev[j].token >= 0 && out->n[i] < MAXOUT) out->tok[i][out->n[i]++] = ev[j].token;
        }
    kv_metrics_summary m;
    kv_engine_metrics(e, &m);
    out->preemptions = m.preemptions;
    out->hit_tokens = m.prefix_hit_tokens;
    out->max_running = m.max_concurrent;
    kv_snapshot_free(snap);
    kv_engine_free(e);
    return rc < 0 ? -1 : 0;
}

static int same(const char *what, const outputs *ref, const outputs *got, const int *maxt, int nreq) {
    for (int i = 0; i < nreq; i++) {
        if (got->n[i] != maxt[i % NP] || ref->n[i] != maxt[i % NP]) {
            CHECKF(0, "%s: request %d: %d tokens, reference %d, want %d", what, i, got->n[i], ref->n[i], maxt[i % NP]);
            return 0;
        }
        if (memcmp(got->tok[i], ref->tok[i], (size_t)got->n[i] * sizeof(int32_t))) {
            CHECKF(0, "%s: request %d differs from release off", what, i);
            return 0;
        }
    }
    return 1;
}

typedef struct wcase {
    const char *name;
    int share, chunk, blocks, swap, spec; /* spec: 0 off, 1 self, 2 ngram */
    int expect_preempt;
} wcase;

static void battery(const kv_config *base, const int *plen, const int *maxt, int nreq, int tiny_blocks,
                    unsigned mask) {
    static const wcase cases[] = {
        {"batched, sharing on", 1, 64, 0, 0, 0, 0},   {"batched, sharing off", 0, 64, 0, 0, 0, 0},
        {"chunk 7", 1, 7, 0, 0, 0, 0},               {"tiny cache, recompute", 1, 16, -1, 0, 0, 1},
        {"tiny cache, swap", 1, 16, -1, 1, 0, 1},    {"self-speculative, k 3", 1, 64, 0, 0, 1, 0},
        {"n-gram speculation, k 3", 1, 64, 0, 0, 2, 0},
    };
    outputs *ref = malloc(sizeof *ref), *got = malloc(sizeof *got);
    REQUIRE(ref && got);
    for (size_t k = 0; k < KV_ARRAY_LEN(cases); k++) {
        if (!(mask & (1u << k))) continue;
        kv_config c = *base;
        c.kv.prefix_sharing = cases[k].share;
        c.scheduler.prefill_chunk = cases[k].chunk;
        if (cases[k].blocks) c.kv.blocks = tiny_blocks;
        if (cases[k].swap) {
            c.scheduler.preemption = KV_PREEMPT_SWAP;
            c.kv.swap_memory = 256ull << 20;
        }
        if (cases[k].spec) {
            c.spec.method = cases[k].spec == 1 ? KV_SPEC_SELF : KV_SPEC_NGRAM;
            c.spec.k = 3;
            c.spec.draft_layers = 2;
            c.spec.ngram_n = 2;
        }
        c.kv.window_release = 0;
        double t0 = kv_now_s();
        if (run(&c, plen, maxt, nreq, ref) != 0) {
            CHECKF(0, "%s: run with release off failed", cases[k].name);
            continue;
        }
        c.kv.window_release = 1;
        if (run(&c, plen, maxt, nreq, got) != 0) {
            CHECKF(0, "%s: run with release on failed", cases[k].name);
            continue;
        }
        int ok = same(cases[k].name, ref, got, maxt, nreq);
        printf("    %-26s %s  (%.1f s; %llu parts released, up to %.1f KiB not held, %llu preemptions, %llu "
               "prefix-hit tokens)\n",
               cases[k].name, ok ? "same" : "DIFFERS", kv_now_s() - t0, (unsigned long long)got->released,
               (double)got->saved_max / 1024.0, (unsigned long long)got->preemptions,
               (unsigned long long)got->hit_tokens);
        CHECKF(got->released > 0 && got->saved_max > 0, "%s: nothing was released", cases[k].name);
        CHECKF(ref->released == 0, "%s: released with release off", cases[k].name);
        if (cases[k].expect_preempt) CHECKF(got->preemptions > 0, "%s: no preemption", cases[k].name);
    }
    free(ref);
    free(got);
}

/* Writes p to a temporary file and runs the battery on it (the cases in mask). */
static void battery_on(kv_mkmodel_params *p, const char *name, unsigned mask) {
    const char *path = harness_tmp_path("window", name, ".gguf");
    kv_err err;
    if (kv_mkmodel_write(p, path, &err) != 0) {
        CHECKF(0, "mkmodel: %s", err.msg);
        return;
    }
    kv_config c;
    test_engine_config(&c, path, 2, 0, 32, 256);
    c.sampling.temperature = 0;
    c.kv.memory = 8ull << 20;
    static const int plen[NP] = {40, 23, 57, 9, 33, 70}, maxt[NP] = {30, 41, 12, 45, 26, 18};
    battery(&c, plen, maxt, NREQ, 14, mask);
    unlink(path);
}

/* A random gemma3 file: 6 layers (five local of window 16, one global),
 * heads of 48. */
static kv_mkmodel_params gemma3_params(void) {
    kv_mkmodel_params p = test_tiny_model(128, 256);
    p.arch = "gemma3";
    p.head_dim = 48;
    p.n_swa = 16;
    p.n_layers = 6;
    return p;
}

static void test_random_gemma3(void) {
    kv_mkmodel_params p = gemma3_params();
    p.untied = 1;
    battery_on(&p, "gemma3", ~0u);
}

/* Mistral's layout: every layer windowed (llama.attention.sliding_window),
 * so the block pool holds no K/V at all, only the local pool does. */
static void test_all_layers_windowed(void) {
    kv_mkmodel_params p = test_tiny_model(128, 256);
    p.arch = "llama";
    p.n_swa = 16;
    p.n_layers = 4;
    battery_on(&p, "mistral", (1u << 0) | (1u << 2) | (1u << 4) | (1u << 5));
}

/* Admission counts the smaller footprint: in the same kv.memory more
 * sequences run at once with release on (and their output is the same). */
static void test_more_fit(void) {
    kv_mkmodel_params p = gemma3_params();
    const char *path = harness_tmp_path("window", "fit", ".gguf");
    kv_err err;
    if (kv_mkmodel_write(&p, path, &err) != 0) {
        CHECKF(0, "mkmodel: %s", err.msg);
        return;
    }
    kv_config c;
    test_engine_config(&c, path, 2, 0, NREQ, 512);
    c.sampling.temperature = 0;
    c.scheduler.max_seq_len = 160;
    /* the profile's workload section must fit the shorter context too */
    c.workload.prompt_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 32, .min = 32, .max = 32, .mean = 32};
    c.workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 32, .min = 32, .max = 32, .mean = 32};
    /* 6 layers x 2 kv heads x 48 x 2 (K, V) x 2 bytes = 2304 B a token:
     * a 120 + 20 token request holds 9 blocks, 324 KiB; with release 9
     * one-layer parts and 3 five-layer ones, 144 KiB (a whole prompt's parts
 * while it is prefilled) */
    c.kv.memory = 3ull << 20;
    c.kv.prefix_sharing = 0; /* (copies of a prompt would share it all) */
    static const int plen[NP] = {120, 118, 121, 119, 122, 117}, maxt[NP] = {20, 22, 19, 21, 18, 20};
    outputs *off = malloc(sizeof *off), *on = malloc(sizeof *on);
    REQUIRE(off && on);
    c.kv.window_release = 0;
    CHECK(run(&c, plen, maxt, NREQ, off) == 0);
    c.kv.window_release = 1;
    CHECK(run(&c, plen, maxt, NREQ, on) == 0);
    printf("    kv.memory 3 MiB, %d requests of ~140 tokens: %d at once with release off, %d with it on\n", NREQ,
           off->max_running, on->max_running);
    CHECK(same("more fit", off, on, maxt, NREQ));
    CHECK(on->max_running > off->max_running);
    free(off);
    free(on);
    unlink(path);
}

static void test_gemma3_270m(void) {
    const char *gemma = "models/gemma-3-270m-Q4_K_M.gguf";
    if (access(gemma, R_OK) != 0) {
        printf("  (skipped: %s not present; make models)\n", gemma);
        return;
    }
    kv_config c;
    test_engine_config(&c, gemma, 2, 0, 8, 512);
    c.sampling.temperature = 0;
    c.kv.memory = 64ull << 20;
    /* two prompts past the 512-token window; a 262,144-token vocabulary on
     * two cores: batched with sharing only (the random gemma3 file above
     * takes every configuration) */
    static const int plen[NP] = {560, 530, 0, 0, 0, 0}, maxt[NP] = {6, 8, 0, 0, 0, 0};
    battery(&c, plen, maxt, 2, 0, 1u << 0);
}

TEST_MAIN(T(test_random_gemma3), T(test_all_layers_windowed), T(test_more_fit), T(test_gemma3_270m))
