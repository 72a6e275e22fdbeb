/* test_logprobs.c - log-probabilities in token events: the sampler's
 * log-softmax and top-k on fresh random logits (normalised over the whole
 * vocabulary, sorted, ties by id), and the engine's events on a real model:
 * off by default, the greedy token is the top-1, decode equals a fresh
 * prefill of the same tokens, and speculative decoding gives the same
 * values as plain decoding for the accepted tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../engine/sampler.h"
#include "../engine_helpers.h"
#include "../harness.h"

/* ---- the sampler function ---- */

static uint64_t lcg(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 11;
}

static void test_sampler_logprobs_random(void) {
    uint64_t seed = (uint64_t)time(NULL) ^ 0x5eedull;
    const int sizes[] = {1, 7, 100, 4099};
    for (size_t si = 0; si < KV_ARRAY_LEN(sizes); si++) {
        int n = sizes[si];
        float *l = malloc((size_t)n * sizeof *l);
        REQUIRE(l);
        for (int i = 0; i < n; i++) l[i] = (float)((double)(lcg(&seed) % 2000000) / 1e5 - 10.0) * (si == 3 ? 3 : 1);
        /* the whole distribution sums to 1 */
        double sum = 0;
        int32_t top[KV_MAX_TOP_LOGPROBS];
        float tlp[KV_MAX_TOP_LOGPROBS];
        int bad = 0;
        for (int t = 0; t < n; t++) {
            float lp = kv_sampler_logprobs(l, n, t, 0, NULL, NULL);
            bad += !(isfinite(lp) && lp <= 0);
            sum += exp((double)lp);
        }
        CHECKF(bad == 0, "n %d: %d logprobs not finite or > 0", n, bad);
        CHECKF(fabs(sum - 1.0) < 1e-4, "n %d: sum of exp(logprob) over the vocabulary = %.8f", n, sum);
        /* top-k: the k largest, sorted, each equal to its own logprob */
        int k = KV_MIN(n, KV_MAX_TOP_LOGPROBS);
        int32_t am = kv_argmax(l, n);
        float lp = kv_sampler_logprobs(l, n, am, k, top, tlp);
        CHECK(top[0] == am && tlp[0] == lp);
        for (int i = 0; i < k; i++) {
            CHECK(tlp[i] == kv_sampler_logprobs(l, n, top[i], 0, NULL, NULL));
            if (i > 0) CHECKF(tlp[i] <= tlp[i - 1] && top[i] != top[i - 1], "n %d: top %d not sorted", n, i);
        }
        int above = 0; /* no token outside the top-k beats its last entry */
        for (int t = 0; t < n; t++) {
            int in = 0;
            for (int i = 0; i < k; i++) in |= top[i] == t;
            above += !in && l[t] > l[top[k - 1]];
        }
        CHECKF(above == 0, "n %d: %d tokens outside the top-%d are larger", n, above, k);
        free(l);
    }
    /* ties: lower id first, as kv_argmax */
    float t[6] = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f, -1.0f};
    int32_t top[4];
    float tlp[4];
    kv_sampler_logprobs(t, 6, 0, 4, top, tlp);
    CHECK(top[0] == 1 && top[1] == 3 && top[2] == 4 && top[3] == 2);
    const double log_z = log(3 * exp(3.0) + exp(2.0) + exp(1.0) + exp(-1.0));
    CHECK(tlp[0] == tlp[1] && fabsf(tlp[0] - (float)(3.0 - log_z)) < 1e-6f);
}

/* ---- the engine ---- */

enum { MAXT = 64 };

typedef struct lp_run {
    int n;
    int32_t tok[MAXT];
    float lp[MAXT];
    int32_t top[MAXT][5];
    float top_lp[MAXT][5];
    int n_top[MAXT], has[MAXT];
    uint8_t src[MAXT];
} lp_run;

/* Runs `text` for max_tokens (greedy, ignore_eos) on c, with logprobs
 * (top 5) when want, alone; fills out. Returns 0 or -1. */
static int run_one(const kv_config *c, const int32_t *ids, int n_ids, int max_tokens, int want, lp_run *out) {
    memset(out, 0, sizeof *out);
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    kv_request_params p;
    test_token_params(e, &p, ids, n_ids, max_tokens, 1);
    p.logprobs = want;
    p.top_logprobs = want ? 5 : 0;
    kv_err err;
    int64_t id = kv_engine_submit(e, &p, &err);
    int rc = id > 0 ? kv_engine_run_until_idle(e) : -1;
    if (id <= 0) fprintf(stderr, "  submit: %s\n", err.msg);
    kv_event ev[64];
    int k;
    while (rc == 0 && (k = kv_engine_poll(e, ev, 64)) > 0)
        for (int j = 0; j < k; j++) {
            if (ev[j].type != KV_EVENT_TOKEN || ev[j].token < 0 || out->n >= MAXT) continue;
            int i = out->n++;
            out->tok[i] = ev[j].token;
            out->lp[i] = ev[j].logprob;
            out->has[i] = ev[j].has_logprob;
            out->n_top[i] = ev[j].n_top;
            out->src[i] = (uint8_t)ev[j].source;
            for (int t = 0; t < 5; t++) {
                out->top[i][t] = ev[j].top_token[t];
                out->top_lp[i][t] = ev[j].top_logprob[t];
            }
        }
    kv_engine_free(e);
    return rc;
}

static void stories_config(kv_config *c) {
    test_engine_config(c, NULL, 1, 256, 8, 256);
    c->kv.dtype = KV_CACHE_F32;
    c->sampling.temperature = 0;
    c->sampling.repeat_penalty = 1.0f;
}

/* Prompt ids of stories260K ("Once upon a time" and a repetitive tail, so
 * n-gram drafts find matches). */
static int prompt_ids(const kv_config *c, int32_t *ids, int cap) {
    kv_err err;
    kv_tokenizer *t = test_gguf_tokenizer(c->model.path, &err);
    if (!t) return -1;
    const char *text = "Once upon a time, the dog said woof. The cat said meow. The dog said woof. The cat";
    int n = kv_tokenizer_encode(t, text, strlen(text), 1, 0, ids, cap, &err);
    kv_tokenizer_free(t);
    return n;
}

static void test_engine_logprobs(void) {
    kv_config c;
    stories_config(&c);
    int32_t ids[256];
    int n = prompt_ids(&c, ids, 200);
    REQUIRE(n > 4);
    lp_run off, on;
    REQUIRE(run_one(&c, ids, n, 24, 0, &off) == 0 && run_one(&c, ids, n, 24, 1, &on) == 0);
    REQUIRE(off.n == 24 && on.n == 24);
    int has_off = 0;
    for (int i = 0; i < 24; i++) has_off += off.has[i];
    CHECKF(has_off == 0, "logprobs off: %d events carry them", has_off);
    for (int i = 0; i < 24; i++) {
        CHECKF(on.tok[i] == off.tok[i], "token %d differs with logprobs on", i);
        CHECKF(on.has[i] && on.n_top[i] == 5, "token %d: has %d, n_top %d", i, on.has[i], on.n_top[i]);
        /* greedy: the chosen token is the most likely one, with its value */
        CHECKF(on.top[i][0] == on.tok[i] && on.top_lp[i][0] == on.lp[i], "token %d: %d (%g) vs top-1 %d (%g)", i,
               on.tok[i], (double)on.lp[i], on.top[i][0], (double)on.top_lp[i][0]);
        CHECK(isfinite(on.lp[i]) && on.lp[i] <= 0);
        for (int t = 1; t < 5; t++) CHECK(on.top_lp[i][t] <= on.top_lp[i][t - 1]);
    }
    /* decode equals a fresh prefill: the prompt plus the first i tokens,
     * one token out, gives the same value for token i */
    const int probe[] = {0, 5, 17, 23};
    for (size_t k = 0; k < KV_ARRAY_LEN(probe); k++) {
        int i = probe[k];
        int32_t ext[256];
        memcpy(ext, ids, (size_t)n * sizeof *ids);
        memcpy(ext + n, on.tok, (size_t)i * sizeof *ids);
        lp_run one;
        REQUIRE(run_one(&c, ext, n + i, 1, 1, &one) == 0 && one.n == 1);
        CHECKF(one.tok[0] == on.tok[i] && fabsf(one.lp[0] - on.lp[i]) < 1e-4f,
               "token %d: decode %d %.7f, prefill %d %.7f", i, on.tok[i], (double)on.lp[i], one.tok[0],
               (double)one.lp[0]);
    }
}

/* Speculative decoding: the same tokens with the same logprobs (the verify
 * pass's target rows), and drafted tokens among them. */
static void test_spec_logprobs(void) {
    kv_config c;
    stories_config(&c);
    int32_t ids[256];
    int n = prompt_ids(&c, ids, 200);
    REQUIRE(n > 4);
    lp_run ref;
    REQUIRE(run_one(&c, ids, n, 40, 1, &ref) == 0 && ref.n == 40);
    const struct {
        const char *name;
        kv_spec_method m;
        int k;
    } cases[] = {{"ngram k4", KV_SPEC_NGRAM, 4},
                 {"self k3", KV_SPEC_SELF, 3},
                 {"draft (itself) k4", KV_SPEC_DRAFT_MODEL, 4}};
    for (size_t ci = 0; ci < KV_ARRAY_LEN(cases); ci++) {
        kv_config s = c;
        s.spec.method = cases[ci].m;
        s.spec.k = cases[ci].k;
        s.spec.adaptive = 0;
        s.spec.ngram_n = 2;
        s.spec.draft_layers = 2;
        if (cases[ci].m == KV_SPEC_DRAFT_MODEL)
            harness_copy_str(s.spec.draft_model, sizeof s.spec.draft_model, c.model.path);
        lp_run got;
        REQUIRE(run_one(&s, ids, n, 40, 1, &got) == 0);
        CHECKF(got.n == 40, "%s: %d tokens", cases[ci].name, got.n);
        int drafted = 0, diff = 0;
        float worst = 0;
        for (int i = 0; i < got.n && i < ref.n; i++) {
            drafted += got.src[i] == KV_TOKSRC_DRAFT;
            if (got.tok[i] != ref.tok[i]) {
                CHECKF(0, "%s: token %d: %d vs %d plain", cases[ci].name, i, got.tok[i], ref.tok[i]);
                break;
            }
            float d = fabsf(got.lp[i] - ref.lp[i]);
            worst = d > worst ? d : worst;
            diff += !got.has[i] || d > 1e-4f || got.top[i][1] != ref.top[i][1];
        }
        CHECKF(drafted > 0, "%s: no drafted token accepted: the test would prove nothing", cases[ci].name);
        CHECKF(diff == 0, "%s: %d tokens with other logprobs than plain decoding (worst %g)", cases[ci].name, diff,
               (double)worst);
        printf("    %s: %d of 40 tokens drafted, largest logprob difference %g\n", cases[ci].name, drafted,
               (double)worst);
    }
}

static void test_bad_top_logprobs(void) {
    kv_config c;
    stories_config(&c);
    kv_request_params p;
    kv_engine *e = test_engine_text(&c, &p, "Once", 2);
    REQUIRE(e);
    p.logprobs = 1;
    p.top_logprobs = KV_MAX_TOP_LOGPROBS + 1;
    kv_err err;
    CHECK(kv_engine_submit(e, &p, &err) == KV_ERR_INVAL && strstr(err.msg, "top_logprobs"));
    p.top_logprobs = -1;
    CHECK(kv_engine_submit(e, &p, &err) == KV_ERR_INVAL);
    kv_engine_free(e);
}

TEST_MAIN(T(test_sampler_logprobs_random), T(test_engine_logprobs), T(test_spec_logprobs), T(test_bad_top_logprobs))
