/* test_invariance.c - greedy batch invariance on real models: each
 * request's output must be the same token for token whether it runs alone
 * or among 31 others, with prefix sharing on or off, with preemption forced
 * by a tiny cache (recompute and swap), with chunked prefill at several
 * chunk sizes, and under static batching and the contiguous layout. Seeded
 * sampling is checked the same way (the RNG is per request). Runs on
 * stories260K and on SmolLM2-135M (models/, fetched by `make models`), and
 * greedy on a random file of each other architecture and Gemma 3 270M. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/engine.h"
#include "../engine_helpers.h"
#include "../harness.h"

enum { NP = 8, COPIES = 4, NREQ = NP * COPIES, MAXOUT = 64 };

typedef struct outputs {
    int n[NREQ];
    int32_t tok[NREQ][MAXOUT];
    kv_finish finish[NREQ];
    kv_metrics_summary m;
} outputs;

/* Submits requests [first, first + count) of the set (prompt i % NP), runs
 * them to the end and records their tokens by request index. */
static int run_set(kv_engine *e, const char *const *prompts, const int *max_tokens, int first, int count,
                   outputs *out) {
    int64_t ids[NREQ];
    for (int i = first; i < first + count; i++)
        if ((ids[i] = test_submit(e, prompts[i % NP], NULL, 0, max_tokens[i % NP], 1, i)) <= 0) return -1;
    if (kv_engine_run_until_idle(e) != 0) return -1;
    kv_event ev[256];
    int k;
    while ((k = kv_engine_poll(e, ev, 256)) > 0)
        for (int j = 0; j < k; j++) {
            int i = ev[j].session;
            if (i < first || i >= first + count || ev[j].req != ids[i]) continue;
            if (ev[j].type == KV_EVENT_TOKEN && ev[j].token >= 0 && out->n[i] < MAXOUT)
                out->tok[i][out->n[i]++] = ev[j].token;
            if (ev[j].type == KV_EVENT_DONE) out->finish[i] = ev[j].finish;
        }
    return 0;
}

/* All NREQ requests at once under config c. */
static int run_batched(const kv_config *c, const char *const *prompts, const int *max_tokens, outputs *out) {
    memset(out, 0, sizeof *out);
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    int rc = run_set(e, prompts, max_tokens, 0, NREQ, out);
    kv_engine_metrics(e, &out->m);
    kv_engine_free(e);
    return rc;
}

/* Each request alone (one at a time, in order, so ids match the batched run). */
static int run_alone(const kv_config *c, const char *const *prompts, const int *max_tokens, int all, outputs *out) {
    memset(out, 0, sizeof *out);
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    int rc = 0;
    for (int i = 0; i < (all ? NREQ : NP) && rc == 0; i++) rc = run_set(e, prompts, max_tokens, i, 1, out);
    kv_engine_free(e);
    if (!all) /* copies of a prompt have the same greedy output */
        for (int i = NP; i < NREQ; i++) {
            out->n[i] = out->n[i % NP];
            out->finish[i] = out->finish[i % NP];
            memcpy(out->tok[i], out->tok[i % NP], sizeof out->tok[i]);
        }
    return rc;
}

static int compare(const char *what, const outputs *ref, const outputs *got, const int *max_tokens) {
    int bad = 0;
    for (int i = 0; i < NREQ; i++) {
        int want = max_tokens[i % NP];
        if (got->n[i] != want || ref->n[i] != want || got->finish[i] != KV_FINISH_LENGTH) {
            CHECKF(0, "%s: request %d: %d tokens (ref %d, want %d), finish %d", what, i, got->n[i], ref->n[i], want,
                   got->finish[i]);
            bad++;
            continue;
        }
        for (int t = 0; t < want; t++)
            if (got->tok[i][t] != ref->tok[i][t]) {
                CHECKF(0, "%s: request %d (prompt %d) differs at token %d: %d vs %d alone", what, i, i % NP, t,
                       got->tok[i][t], ref->tok[i][t]);
                bad++;
                break;
            }
    }
    return bad;
}

/* The battery of configurations, each compared with the alone run. */
static void battery(const kv_config *base, const char *const *prompts, const int *max_tokens, int tiny_blocks,
                    unsigned mask) {
    outputs *ref = malloc(sizeof *ref), *got = malloc(sizeof *got);
    REQUIRE(ref && got);
    kv_config c = *base;
    if (run_alone(&c, prompts, max_tokens, 0, ref) != 0) {
        CHECKF(0, "alone run failed");
        goto out;
    }
    struct {
        const char *name;
        int share, chunk, blocks, swap, policy, layout;
        int expect_preempt;
    } cases[] = {
        {"batched, sharing on, chunk 64", 1, 64, 0, 0, KV_POLICY_CONTINUOUS, KV_LAYOUT_PAGED, 0},
        {"batched, sharing off", 0, 64, 0, 0, KV_POLICY_CONTINUOUS, KV_LAYOUT_PAGED, 0},
        {"chunk 1", 1, 1, 0, 0, KV_POLICY_CONTINUOUS, KV_LAYOUT_PAGED, 0},
        {"chunk 7", 0, 7, 0, 0, KV_POLICY_CONTINUOUS, KV_LAYOUT_PAGED, 0},
        {"tiny cache, recompute", 1, 16, tiny_blocks, 0, KV_POLICY_CONTINUOUS, KV_LAYOUT_PAGED, 1},
        {"tiny cache, recompute, no sharing", 0, 16, tiny_blocks, 0, KV_POLICY_CONTINUOUS, KV_LAYOUT_PAGED, 1},
        {"tiny cache, swap", 1, 16, tiny_blocks, 1, KV_POLICY_CONTINUOUS, KV_LAYOUT_PAGED, 1},
        {"static batching", 1, 64, 0, 0, KV_POLICY_STATIC, KV_LAYOUT_PAGED, 0},
        {"contiguous layout", 0, 64, 0, 0, KV_POLICY_CONTINUOUS, KV_LAYOUT_CONTIGUOUS, 0},
    };
    for (size_t k = 0; k < KV_ARRAY_LEN(cases); k++) {
        if (!(mask & (1u << k))) continue;
        c = *base;
        c.kv.prefix_sharing = cases[k].share;
        c.scheduler.prefill_chunk = cases[k].chunk;
        c.scheduler.policy = cases[k].policy;
        if (cases[k].policy == KV_POLICY_STATIC) c.scheduler.max_seqs = 8; /* four batches */
        c.kv.layout = cases[k].layout;
        if (cases[k].layout == KV_LAYOUT_CONTIGUOUS) {
            c.scheduler.max_seq_len = 128;
            /* the profile's workload section must fit the shorter context too */
            c.workload.prompt_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 32, .min = 32, .max = 32, .mean = 32};
            c.workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 32, .min = 32, .max = 32, .mean = 32};
        }
        if (cases[k].blocks) c.kv.blocks = cases[k].blocks;
        if (cases[k].swap) {
            c.scheduler.preemption = KV_PREEMPT_SWAP;
            c.kv.swap_memory = 256ull << 20;
        }
        double t0 = kv_now_s();
        if (run_batched(&c, prompts, max_tokens, got) != 0) {
            CHECKF(0, "%s: run failed", cases[k].name);
            continue;
        }
        int bad = compare(cases[k].name, ref, got, max_tokens);
        printf("    %-36s %s  (%.2f s, max %d running, %llu preemptions, %llu prefix-hit tokens)\n", cases[k].name,
               bad ? "DIFFERS" : "same", kv_now_s() - t0, got->m.max_concurrent,
               (unsigned long long)got->m.preemptions, (unsigned long long)got->m.prefix_hit_tokens);
        if (cases[k].expect_preempt) CHECKF(got->m.preemptions > 0, "%s: no preemption happened", cases[k].name);
        if (k == 0) /* requests admitted after the first step find the shared prefix */
            CHECKF(got->m.prefix_hit_tokens > 0, "%s: no prefix hit", cases[k].name);
        if (!cases[k].blocks && cases[k].policy == KV_POLICY_CONTINUOUS && cases[k].layout == KV_LAYOUT_PAGED)
            CHECKF(got->m.max_concurrent == NREQ, "%s: only %d at once", cases[k].name, got->m.max_concurrent);
    }
out:
    free(ref);
    free(got);
}

/* Prompts share a first sentence so prefix sharing has blocks to share. */
static const char *const stories_prompts[NP] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog",
    "Once upon a time, there was a little girl named Lily. She had a big red ball",
    "Once upon a time, there was a little girl named Lily. One day she went to the beach",
    "Tom had a dog",
    "The sun was hot and the cat was sleepy. The cat",
    "Once upon a time",
    "Sue and Ben were friends. They liked to build towers with blocks. One day",
    "A bird sat on a tree",
};
static const int stories_max[NP] = {24, 40, 17, 33, 29, 48, 21, 36};

/* Greedy on `model` (NULL: stories260K), two threads, up to 32 sequences,
 * a pool of n blocks and n tokens a step. */
static void greedy_config(kv_config *c, const char *model, int n) {
    test_engine_config(c, model, 2, n, 32, n);
    c->sampling.temperature = 0;
}

static void stories_config(kv_config *c) { greedy_config(c, NULL, 512); }

/* The battery configurations (bit i: configuration i) to run: `full`, or
 * only the first under AddressSanitizer (the larger models are slow there). */
static unsigned battery_mask(unsigned full) {
#if defined(__SANITIZE_ADDRESS__)
    (void)full;
    return 1u << 0;
#else
    return full;
#endif
}

static void test_stories260k_greedy(void) {
    kv_config c;
    stories_config(&c);
    /* 12 blocks (192 tokens) hold a few of the 32 requests at a time */
    battery(&c, stories_prompts, stories_max, 12, ~0u);
}

static void test_stories260k_seeded_sampling(void) {
    kv_config c;
    stories_config(&c);
    c.sampling.temperature = 0.9f; /* top_k 40, top_p 0.95: the defaults */
    c.sampling.seed = 1234;
    outputs *ref = malloc(sizeof *ref), *got = malloc(sizeof *got);
    REQUIRE(ref && got);
    REQUIRE(run_alone(&c, stories_prompts, stories_max, 1, ref) == 0);
    REQUIRE(run_batched(&c, stories_prompts, stories_max, got) == 0);
    compare("seeded sampling, batched", ref, got, stories_max);
    c.kv.blocks = 12;
    REQUIRE(run_batched(&c, stories_prompts, stories_max, got) == 0);
    compare("seeded sampling, tiny cache", ref, got, stories_max);
    CHECK(got->m.preemptions > 0);
    /* and the samples are not all greedy: copies of a prompt differ */
    int differ = 0;
    for (int i = NP; i < NREQ; i++) differ += memcmp(ref->tok[i], ref->tok[i % NP], sizeof ref->tok[i]) != 0;
    CHECK(differ > NREQ / 2);
    free(ref);
    free(got);
}

static const char *const smol_prompts[NP] = {
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of "
    "France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nName three colors.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a haiku about the "
    "sea.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    "def fibonacci(n):",
    "In 1492, Columbus",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at",
};
static const int smol_max[NP] = {8, 10, 6, 9, 12, 7, 5, 11};

static void test_smollm2_greedy(void) {
    if (access(TEST_SMOLLM2, R_OK) != 0) {
        CHECKF(0, "%s missing: run `make models`", TEST_SMOLLM2);
        return;
    }
    kv_config c;
    /* 256 tokens a step: admission over two steps, the later ones share */
    greedy_config(&c, TEST_SMOLLM2, 256);
    /* 8 blocks (128 tokens) for 32 requests of up to ~50 tokens. The
     * 135M model is slow under sanitizers: a smaller battery there. */
    battery(&c, smol_prompts, smol_max, 8,
            battery_mask((1u << 0) | (1u << 1) | (1u << 2) | (1u << 3) | (1u << 4) | (1u << 6)));
}

/* The same battery on a random-weight file of every other architecture
 * (mkmodel --arch; gemma3 with a 16-token window, so later positions of
 * the longer requests attend through it; qwen3moe, whose experts then see
 * rows from different sequences and positions in every batch shape) and on Gemma 3 270M's real
 * weights (`make models`). */
static void test_architectures_greedy(void) {
    static const struct {
        const char *arch;
        int head_dim, window, rope_freqs, experts;
    } archs[] = {{"qwen2", 0, 0, 0, 0}, {"qwen3", 48, 0, 0, 0}, {"gemma3", 48, 16, 0, 0}, {"phi3", 0, 0, 0, 0},
                 {"llama", 0, 0, 1, 0}, {"qwen3moe", 32, 0, 0, 8}};
    const char *path = harness_tmp_path("invariance", "arch", ".gguf");
    for (size_t a = 0; a < KV_ARRAY_LEN(archs); a++) {
        kv_mkmodel_params p = test_tiny_model(128, 256);
        p.arch = archs[a].arch;
        p.head_dim = archs[a].head_dim;
        p.n_swa = archs[a].window;
        p.rope_freqs = archs[a].rope_freqs;
        p.n_experts = archs[a].experts; /* qwen3moe: 8 experts of ffn 256, top 2 */
        p.n_layers = 6;
        p.untied = 1;
        kv_err err;
        if (kv_mkmodel_write(&p, path, &err) != 0) {
            CHECKF(0, "mkmodel %s: %s", p.arch, err.msg);
            continue;
        }
        printf("    %s (random weights):\n", p.arch);
        kv_config c;
        greedy_config(&c, path, 512);
        battery(&c, stories_prompts, stories_max, 12, battery_mask(~0u));
    }
    unlink(path);
    const char *gemma = "models/gemma-3-270m-Q4_K_M.gguf";
    if (access(gemma, R_OK) != 0) {
        printf("  (skipped: %s not present; make models)\n", gemma);
        return;
    }
    printf("    gemma3 270M (Q4_K_M):\n");
    kv_config c;
    greedy_config(&c, gemma, 256);
    /* a 262,144-token vocabulary on two cores: batched with sharing and
     * chunk 7 (preemption is exercised on the random gemma3 file above) */
    battery(&c, smol_prompts, smol_max, 8, battery_mask((1u << 0) | (1u << 3)));
}

TEST_MAIN(T(test_stories260k_greedy), T(test_stories260k_seeded_sampling), T(test_smollm2_greedy),
          T(test_architectures_greedy))
