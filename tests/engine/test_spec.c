/* test_spec.c - speculative decoding: n-gram lookup, the rejection rule and
 * the adaptive controller as units; then the engine on real models: greedy
 * output identical with speculation off and with every method (ngram, self,
 * draft model: the same model, a q8_0 re-encoding, a llama2.c checkpoint, a
 * layer-truncated SmolLM2), alone and batched with requests that do not
 * speculate, with the block manager's checkers after every step; a
 * chi-square test that rejection sampling leaves the target's distribution
 * unchanged (and that a biased rule fails the same test); the adaptive
 * fallback; metrics, events and decisions; bad configurations. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/engine.h"
#include "../../engine/mkmodel.h"
#include "../../engine/quantize.h"
#include "../../engine/runner.h"
#include "../../engine/sampler.h"
#include "../../engine/spec.h"
#include "../engine_helpers.h"
#include "../harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOW_BUILD 1
#endif
#endif
#ifndef SLOW_BUILD
#define SLOW_BUILD 0
#endif

static const char *SMOL = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/* A scratch file name of this process (removed by the test that makes it). */
static const char *tmp_path(char *buf, size_t cap, const char *what) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, cap, "%s/kvtop-test-spec-%d-%s", dir && *dir ? dir : "/tmp", (int)getpid(), what);
    return buf;
}

/* ---- units ---- */

static void test_ngram_lookup(void) {
    int32_t out[8];
    /* ... 5 6 7 [8 9] ... 5 6 7 -> the tokens after the earlier 5 6 7 */
    const int32_t a[] = {1, 5, 6, 7, 8, 9, 4, 5, 6, 7};
    int n = kv_spec_ngram(a, 10, 3, 4, out);
    CHECK(n == 4 && out[0] == 8 && out[1] == 9 && out[2] == 4 && out[3] == 5);
    /* k larger than what follows: clipped at the end of the context */
    const int32_t b[] = {3, 4, 10, 11, 3, 4};
    n = kv_spec_ngram(b, 6, 2, 8, out);
    CHECK(n == 4 && out[0] == 10 && out[1] == 11 && out[2] == 3 && out[3] == 4);
    /* the most recent match wins */
    const int32_t c[] = {7, 1, 7, 2, 7};
    n = kv_spec_ngram(c, 5, 1, 1, out);
    CHECK(n == 1 && out[0] == 2);
    /* no 3-gram or 2-gram match: falls back to 1 */
    const int32_t d[] = {9, 20, 1, 2, 3, 9};
    n = kv_spec_ngram(d, 6, 3, 2, out);
    CHECK(n == 2 && out[0] == 20 && out[1] == 1);
    /* no match at all, or too short */
    const int32_t e[] = {1, 2, 3, 4};
    CHECK(kv_spec_ngram(e, 4, 3, 4, out) == 0);
    CHECK(kv_spec_ngram(e, 1, 3, 4, out) == 0);
    CHECK(kv_spec_ngram(e, 4, 3, 0, out) == 0);
    CHECK(kv_spec_ngram(NULL, 4, 3, 4, out) == 0);
}

static void test_expected_tokens(void) {
    CHECK(fabs(kv_spec_expected_tokens(0.0, 4) - 1.0) < 1e-12);
    CHECK(fabs(kv_spec_expected_tokens(1.0, 4) - 5.0) < 1e-12);
    CHECK(fabs(kv_spec_expected_tokens(0.5, 1) - 1.5) < 1e-12);
    CHECK(fabs(kv_spec_expected_tokens(0.8, 3) - (1 + 0.8 + 0.64 + 0.512)) < 1e-12);
    CHECK(fabs(kv_spec_expected_tokens(0.7, 0) - 1.0) < 1e-12);
}

static void test_controller(void) {
    kv_spec_ctl_params cp = {.k_max = 5, .adaptive = 1, .min_acceptance = 0.4f};
    kv_spec_seq ss;
    memset(&ss, 0, sizeof ss);
    kv_spec_ctl_init(&ss, &cp);
    CHECK(kv_spec_ctl_next(&ss, &cp) == 5);
    /* all accepted: stays at k_max */
    for (int i = 0; i < 5; i++) CHECK(kv_spec_ctl_update(&ss, &cp, 5, 5) == 0);
    CHECK(ss.k == 5 && ss.ewma > 0.9f);
    /* half of the positions tried accepted: k shrinks one step at a time to
     * the largest k with ewma^k >= 1/4 (0.5^2) */
    for (int i = 0; i < 12; i++) {
        int before = ss.k;
        CHECK(kv_spec_ctl_update(&ss, &cp, ss.k, 1) == 0);
        CHECK(ss.k >= before - 1 && ss.k <= before + 1);
    }
    CHECK(ss.k >= 1 && ss.k <= 3);
    /* nothing accepted: falls back, decodes plainly for the backoff, retries at k = 1 */
    kv_spec_ctl_init(&ss, &cp);
    int fell = 0, verifies = 0;
    while (!fell && verifies < 10) {
        fell = kv_spec_ctl_update(&ss, &cp, ss.k, 0);
        verifies++;
    }
    CHECK(fell && verifies <= 3);
    CHECK(ss.cooldown == 8 && ss.n_fallbacks == 1);
    for (int i = 0; i < 8; i++) CHECK(kv_spec_ctl_next(&ss, &cp) == 0);
    CHECK(kv_spec_ctl_next(&ss, &cp) == 1);
    /* a failed probe falls back for twice as long */
    CHECK(kv_spec_ctl_update(&ss, &cp, 1, 0) == 1);
    CHECK(ss.cooldown == 16 && ss.n_fallbacks == 2);
    for (int i = 0; i < 16; i++) CHECK(kv_spec_ctl_next(&ss, &cp) == 0);
    /* a good probe grows k again and ends the probation */
    for (int i = 0; i < 10; i++) CHECK(kv_spec_ctl_update(&ss, &cp, ss.k, ss.k) == 0);
    CHECK(ss.k >= 4 && !ss.probing && ss.backoff == 8);
    /* adaptive off: always k_max, never falls back */
    kv_spec_ctl_params fixed = cp;
    fixed.adaptive = 0;
    kv_spec_ctl_init(&ss, &fixed);
    for (int i = 0; i < 20; i++) {
        CHECK(kv_spec_ctl_next(&ss, &fixed) == 5);
        CHECK(kv_spec_ctl_update(&ss, &fixed, 5, 0) == 0);
    }
    CHECK(ss.cooldown == 0);
}

/* ---- chi-square ---- */

/* Regularized upper incomplete gamma Q(a, x). */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1.0;
    double lg = lgamma(a);
    if (x < a + 1) { /* series for P */
        double sum = 1.0 / a, term = sum, ap = a;
        for (int i = 0; i < 10000; i++) {
            ap += 1;
            term *= x / ap;
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-15) break;
        }
        return 1.0 - sum * exp(-x + a * log(x) - lg);
    }
    /* continued fraction (modified Lentz) for Q */
    double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15) break;
    }
    return exp(-x + a * log(x) - lg) * h;
}

/* Pearson's test of counts[0..n) against probabilities prob[0..n) (summing
 * to 1): cells expecting fewer than 5 are pooled. Returns the p-value. */
static double chi_square_p(const double *counts, const double *prob, int n, double total, int *df_out) {
    double chi = 0, pool_c = 0, pool_e = 0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        double ex = prob[i] * total;
        if (ex >= 5) {
            chi += (counts[i] - ex) * (counts[i] - ex) / ex;
            cells++;
        } else {
            pool_c += counts[i];
            pool_e += ex;
        }
    }
    if (pool_e > 0) {
        chi += (pool_c - pool_e) * (pool_c - pool_e) / KV_MAX(pool_e, 1e-9);
        cells++;
    }
    int df = cells - 1;
    if (df_out) *df_out = df;
    return df > 0 ? gamma_q(df / 2.0, chi / 2.0) : 1.0;
}

/* kv_spec_accept alone, on a small made-up distribution: drafts drawn from
 * q, the accepted or resampled token must follow p; always accepting and
 * resampling from p (instead of the residual) must both fail the test. */
static void test_accept_rule_unit(void) {
    enum { V = 6, N = 40000 };
    const float p[V] = {0.40f, 0.25f, 0.15f, 0.10f, 0.06f, 0.04f};
    const float q[V] = {0.05f, 0.10f, 0.45f, 0.05f, 0.30f, 0.05f};
    double prob[V], good[V] = {0}, always[V] = {0}, from_p[V] = {0}, onehot[V] = {0};
    for (int i = 0; i < V; i++) prob[i] = p[i];
    kv_rng rng;
    kv_rng_seed(&rng, 7);
    float work[V];
    for (int t = 0; t < N; t++) {
        int32_t d = kv_sample_from(q, V, &rng), x;
        memcpy(work, p, sizeof work);
        good[kv_spec_accept(work, q, V, d, &rng, &x) ? d : x]++;
        always[d]++;
        /* biased: accept by the right rule, but redraw from p on rejection */
        double u = kv_rng_uniform(&rng);
        from_p[u * q[d] < p[d] ? d : kv_sample_from(p, V, &rng)]++;
        /* a deterministic proposal (q one-hot on token 2): accept with p(2) */
        memcpy(work, p, sizeof work);
        onehot[kv_spec_accept(work, NULL, V, 2, &rng, &x) ? 2 : x]++;
    }
    int df;
    double pg = chi_square_p(good, prob, V, N, &df), pa = chi_square_p(always, prob, V, N, NULL);
    double pp = chi_square_p(from_p, prob, V, N, NULL), po = chi_square_p(onehot, prob, V, N, NULL);
    printf("    unit: exact rule p=%.3f, one-hot p=%.3f (df %d); always-accept p=%.2g, redraw-from-p p=%.2g\n", pg, po,
           df, pa, pp);
    CHECKF(pg > 1e-3, "exact rule rejected: p-value %g", pg);
    CHECKF(po > 1e-3, "one-hot rule rejected: p-value %g", po);
    CHECKF(pa < 1e-6, "always-accept not detected: p-value %g", pa);
    CHECKF(pp < 1e-6, "redraw-from-p not detected: p-value %g", pp);
    /* p == q: every draft accepted */
    int acc = 0;
    for (int t = 0; t < 1000; t++) {
        int32_t d = kv_sample_from(p, V, &rng), x;
        memcpy(work, p, sizeof work);
        acc += kv_spec_accept(work, p, V, d, &rng, &x);
    }
    CHECK(acc == 1000);
}

/* ---- the engine on real models ---- */

enum { MAXT = 96, MAXR = 48 };

typedef struct result {
    int n;                 /* tokens */
    int32_t tok[MAXT];
    uint8_t src[MAXT];     /* kv_token_source */
    kv_finish finish;
} result;

typedef struct run_stats {
    kv_metrics_summary m;
    int check_failures;
    int steps;
    int n_fallback_decisions; /* KV_DEC_SPEC decisions that fall back to plain decoding */
    int n_spec_decisions;
    int saw_k0;               /* a running request reported spec_k == 0 (fallback) */
    uint64_t drafts_snap;     /* sum of per-request spec_drafts over finished rows */
} run_stats;

/* model, greedy, f32 KV blocks of 16 tokens. */
static void base_config(kv_config *c, const char *model) {
    test_engine_config(c, model, 2, 512, 32, 512);
    c->kv.dtype = KV_CACHE_F32;
    c->scheduler.prefill_chunk = 64;
    c->sampling.temperature = 0;
    c->sampling.repeat_penalty = 1.0f;
}

static void collect(kv_engine *e, const int64_t *ids, int n, result *out) {
    kv_event ev[256];
    int k;
    while ((k = kv_engine_poll(e, ev, 256)) > 0)
        for (int j = 0; j < k; j++) {
            int i = ev[j].session;
            if (i < 0 || i >= n || ev[j].req != ids[i]) continue;
            if (ev[j].type == KV_EVENT_TOKEN && ev[j].token >= 0 && out[i].n < MAXT) {
                out[i].src[out[i].n] = (uint8_t)ev[j].source;
                out[i].tok[out[i].n++] = ev[j].token;
            }
            if (ev[j].type == KV_EVENT_DONE) out[i].finish = ev[j].finish;
        }
}

/* Steps e until idle, checking the engine after every step. */
static int drive(kv_engine *e, run_stats *st, kv_snapshot *snap) {
    for (int guard = 0; guard < 100000; guard++) {
        int rc = kv_engine_step(e);
        if (rc < 0) return rc;
        char msg[256];
        if (kv_engine_check(e, msg, sizeof msg) != 0) {
            if (st->check_failures++ < 3) CHECKF(0, "after step %d: %s", st->steps, msg);
        }
        if (rc == 0) return 0;
        st->steps++;
        if (snap && kv_engine_snapshot(e, snap) == 0)
            for (int i = 0; i < snap->n_requests; i++)
                if (snap->requests[i].state == KV_REQ_RUNNING && snap->requests[i].n_generated > 0 &&
                    snap->requests[i].spec_k == 0)
                    st->saw_k0 = 1;
    }
    return -1;
}

/* Runs requests texts[0..n) (request i generates max_tokens[i], greedy
 * unless c says otherwise) under config c: all at once, or one at a time.
 * Records each request's tokens and sources and the run's figures. */
static int run_engine(const kv_config *c, const char *const *texts, const int *max_tokens, int n, int alone,
                      result *out, run_stats *st) {
    memset(out, 0, (size_t)n * sizeof *out);
    memset(st, 0, sizeof *st);
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    kv_engine_trace_enable(e, 1);
    kv_snapshot *snap = kv_snapshot_new();
    int64_t ids[MAXR];
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if ((ids[i] = test_submit(e, texts[i], NULL, 0, max_tokens[i], 1, i)) <= 0) {
            rc = -1;
            break;
        }
        if (alone) {
            rc = drive(e, st, snap);
            collect(e, ids, i + 1, out);
        }
    }
    if (rc == 0 && !alone) {
        rc = drive(e, st, snap);
        collect(e, ids, n, out);
    }
    kv_engine_metrics(e, &st->m);
    if (kv_engine_snapshot(e, snap) == 0) {
        for (int i = 0; i < snap->n_decisions; i++)
            if (snap->decisions[i].kind == KV_DEC_SPEC) {
                st->n_spec_decisions++;
                if (strstr(snap->decisions[i].text, "plain decode")) st->n_fallback_decisions++;
            }
        for (int i = 0; i < snap->n_requests; i++)
            if (snap->requests[i].state == KV_REQ_FINISHED) st->drafts_snap += snap->requests[i].spec_drafts;
    }
    kv_snapshot_free(snap);
    kv_engine_free(e);
    return rc;
}

/* Compares every request of got with ref token for token; returns the
 * number of requests that differ. */
static int compare(const char *what, const result *ref, const result *got, const int *max_tokens, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (got[i].n != max_tokens[i] || ref[i].n != max_tokens[i]) {
            CHECKF(0, "%s: request %d: %d tokens (ref %d, want %d)", what, i, got[i].n, ref[i].n, max_tokens[i]);
            bad++;
            continue;
        }
        for (int t = 0; t < max_tokens[i]; t++)
            if (got[i].tok[t] != ref[i].tok[t]) {
                CHECKF(0, "%s: request %d differs at token %d: %d vs %d without speculation", what, i, t,
                       got[i].tok[t], ref[i].tok[t]);
                bad++;
                break;
            }
    }
    return bad;
}

/* Token sources agree with the metrics: accepted drafts are DRAFT events,
 * every verify ends with one BONUS token. */
static void check_sources(const char *what, const result *got, int n, const run_stats *st) {
    uint64_t draft = 0, bonus = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < got[i].n; t++) {
            draft += got[i].src[t] == KV_TOKSRC_DRAFT;
            bonus += got[i].src[t] == KV_TOKSRC_BONUS;
        }
    CHECKF(draft == st->m.spec_accepted, "%s: %llu DRAFT events, %llu accepted", what, (unsigned long long)draft,
           (unsigned long long)st->m.spec_accepted);
    /* a verify whose bonus fell past max_tokens emits no BONUS */
    CHECKF(bonus <= st->m.spec_drafts && bonus + (uint64_t)n >= st->m.spec_drafts,
           "%s: %llu BONUS events for %llu verifies", what, (unsigned long long)bonus,
           (unsigned long long)st->m.spec_drafts);
    CHECKF(st->drafts_snap == st->m.spec_drafts, "%s: snapshot rows count %llu verifies, metrics %llu", what,
           (unsigned long long)st->drafts_snap, (unsigned long long)st->m.spec_drafts);
    CHECKF(st->n_spec_decisions == (int)st->m.spec_drafts, "%s: %d spec decisions for %llu verifies", what,
           st->n_spec_decisions, (unsigned long long)st->m.spec_drafts);
    const kv_metrics_summary *m = &st->m;
    if (m->spec_drafted > 0) {
        CHECK(fabs(m->spec_acceptance_rate - (double)m->spec_accepted / (double)m->spec_drafted) < 1e-9);
        CHECK(fabs(m->spec_mean_accepted_len - (double)(m->spec_accepted + m->spec_drafts) / (double)m->spec_drafts) <
              1e-9);
        CHECK(m->spec_pos_drafted[0] == m->spec_drafts);
        for (int j = 1; j < 16; j++) {
            CHECK(m->spec_pos_drafted[j] <= m->spec_pos_drafted[j - 1]);
            CHECK(m->spec_pos_accepted[j] <= m->spec_pos_accepted[j - 1]);
        }
        uint64_t acc = 0;
        for (int j = 0; j < 16; j++) acc += m->spec_pos_accepted[j];
        CHECK(acc == m->spec_accepted);
        CHECK(m->spec_verify_ms > 0);
    }
}

typedef struct method_case {
    const char *name;
    kv_spec_method method;
    int k, draft_layers, adaptive;
    const char *draft;      /* draft_model path */
    double min_accept_rate; /* the run's acceptance must reach this */
} method_case;

static void set_method(kv_config *c, const method_case *mc) {
    c->spec.method = mc->method;
    c->spec.k = mc->k;
    c->spec.draft_layers = mc->draft_layers > 0 ? mc->draft_layers : 1;
    c->spec.adaptive = mc->adaptive;
    c->spec.ngram_n = 3;
    if (mc->draft) harness_copy_str(c->spec.draft_model, sizeof c->spec.draft_model, mc->draft);
}

/* Greedy outputs with every method equal the outputs without speculation,
 * batched (with prefilling and non-speculating requests: max_tokens 1 and
 * 2 leave no room for drafts) and alone. */
static void greedy_battery(const kv_config *base, const char *const *texts, const int *max_tokens, int n,
                           const method_case *cases, int n_cases, int also_alone) {
    result *ref = calloc(MAXR, sizeof *ref), *got = calloc(MAXR, sizeof *got);
    run_stats st;
    REQUIRE(ref && got);
    kv_config c = *base;
    c.spec.method = KV_SPEC_OFF;
    if (run_engine(&c, texts, max_tokens, n, 1, ref, &st) != 0) {
        CHECKF(0, "reference run failed");
        goto out;
    }
    for (int k = 0; k < n_cases; k++) {
        for (int alone = 0; alone <= also_alone; alone++) {
            c = *base;
            set_method(&c, &cases[k]);
            char what[96];
            snprintf(what, sizeof what, "%s, %s", cases[k].name, alone ? "alone" : "batched");
            double t0 = kv_now_s();
            if (run_engine(&c, texts, max_tokens, n, alone, got, &st) != 0) {
                CHECKF(0, "%s: run failed", what);
                continue;
            }
            int bad = compare(what, ref, got, max_tokens, n);
            printf("    %-40s %s  (%.2f s, %d steps, %llu verifies, acceptance %.2f, %.2f tokens/verify)\n", what,
                   bad ? "DIFFERS" : "same", kv_now_s() - t0, st.steps, (unsigned long long)st.m.spec_drafts,
                   st.m.spec_acceptance_rate, st.m.spec_mean_accepted_len);
            CHECKF(st.m.spec_drafts > 0, "%s: nothing was drafted", what);
            CHECKF(st.m.spec_acceptance_rate >= cases[k].min_accept_rate, "%s: acceptance %.3f < %.3f", what,
                   st.m.spec_acceptance_rate, cases[k].min_accept_rate);
            check_sources(what, got, n, &st);
            CHECK(st.check_failures == 0);
        }
    }
out:
    free(ref);
    free(got);
}

/* Prompts: stories, two repetitive ones where n-gram lookup finds drafts,
 * a long one that is still prefilling (chunk 64) while others decode, and
 * two that never speculate (1 and 2 tokens: no room for drafts). */
static const char *const stories_texts[] = {
    ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog"),
    "Tom had a dog",
    "The sun was hot and the cat was sleepy. The cat",
    "Sue and Ben were friends. They liked to build towers with blocks. One day",
    "one two three four one two three four one two three four one two",
    "The dog said woof. The cat said meow. The dog said woof. The cat said meow. The dog",
    ("Once upon a time, there was a big house. In the house lived a family: a mom, a dad, a boy named Tim and his "
     "sister Sue. Tim liked to play with his red ball in the garden every day, and Sue liked to read books about "
     "animals, birds and fish. One day, the sun was hot and Tim went to the garden with his ball. He threw it high "
     "and it went over the fence."),
    "A bird sat on a tree",
    "Lily and Ben",
};
static const int stories_max[] = {40, 33, 29, 21, 36, 30, 24, 1, 2};
enum { N_STORIES = 9 };

static void stories_base(kv_config *c) {
    base_config(c, harness_shared_path("models/stories260K.gguf"));
}

static void test_greedy_identical_stories260k(void) {
    kv_config c;
    stories_base(&c);
    char q8[512];
    tmp_path(q8, sizeof q8, "q8.gguf");
    char gguf[512];
    harness_copy_str(gguf, sizeof gguf, harness_shared_path("models/stories260K.gguf"));
    kv_quantize_params qp;
    memset(&qp, 0, sizeof qp);
    kv_err err;
    REQUIRE(kv_quant_target_from_name("q8_0", &qp.target, &err) == 0);
    qp.n_threads = 1;
    int have_q8 = kv_quantize_file(gguf, q8, &qp, NULL, &err) == 0;
    CHECKF(have_q8, "quantize: %s", err.msg);
    const method_case cases[] = {
        {"ngram k4", KV_SPEC_NGRAM, 4, 0, 1, NULL, 0.05},
        {"ngram k6 fixed", KV_SPEC_NGRAM, 6, 0, 0, NULL, 0.05},
        {"self L4 k3", KV_SPEC_SELF, 3, 4, 1, NULL, 0.05},
        {"self L2 k2 fixed", KV_SPEC_SELF, 2, 2, 0, NULL, 0.0},
        {"draft model (itself) k4", KV_SPEC_DRAFT_MODEL, 4, 0, 1, gguf, 0.9},
        {"draft model (q8_0) k5 fixed", KV_SPEC_DRAFT_MODEL, 5, 0, 0, have_q8 ? q8 : gguf, 0.5},
    };
    greedy_battery(&c, stories_texts, stories_max, N_STORIES, cases, KV_ARRAY_LEN(cases), 1);
    /* prefix sharing off, a tiny cache that preempts (recompute, then swap):
     * rollback and preemption together */
    const method_case some[] = {cases[0], cases[3], cases[5]};
    c.kv.prefix_sharing = 0;
    printf("    -- prefix sharing off\n");
    greedy_battery(&c, stories_texts, stories_max, N_STORIES, some, KV_ARRAY_LEN(some), 0);
    stories_base(&c);
    c.kv.blocks = 16;
    printf("    -- 16 blocks (preemption by recompute)\n");
    greedy_battery(&c, stories_texts, stories_max, N_STORIES, some, KV_ARRAY_LEN(some), 0);
    c.scheduler.preemption = KV_PREEMPT_SWAP;
    c.kv.swap_memory = 64ull << 20;
    printf("    -- 16 blocks (preemption by swap)\n");
    greedy_battery(&c, stories_texts, stories_max, N_STORIES, some, KV_ARRAY_LEN(some), 0);
    if (have_q8) unlink(q8);
}

/* The llama2.c checkpoint as the target, the GGUF (same weights) as the
 * draft: checked as one vocabulary. */
static void test_greedy_identical_llama2c(void) {
    kv_config c;
    base_config(&c, harness_shared_path("models/stories260K.bin"));
    harness_copy_str(c.model.tokenizer, sizeof c.model.tokenizer, harness_shared_path("models/tok512.bin"));
    char gguf[512];
    harness_copy_str(gguf, sizeof gguf, harness_shared_path("models/stories260K.gguf"));
    const method_case cases[] = {{"llama2.c target, GGUF draft k3", KV_SPEC_DRAFT_MODEL, 3, 0, 1, gguf, 0.9}};
    greedy_battery(&c, stories_texts, stories_max, N_STORIES, cases, 1, 0);
}

static void test_greedy_identical_smollm2(void) {
    if (access(SMOL, R_OK) != 0) {
        CHECKF(0, "%s missing: run `make models`", SMOL);
        return;
    }
    static const char *const texts[] = {
        ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of "
         "France?<|im_end|>\n<|im_start|>assistant\n"),
        "def fibonacci(n):",
        "{\"name\": \"Alice\", \"age\": 30}, {\"name\": \"Bob\", \"age\": 25}, {\"name\": \"Carol\", \"age\":",
        "The quick brown fox",
        "Water boils at",
    };
    static const int max_tokens[] = {12, 16, 14, 10, 2};
    kv_config c;
    base_config(&c, SMOL);
    c.kv.blocks = 128;
    char trunc[512];
    tmp_path(trunc, sizeof trunc, "smol8.gguf");
    kv_err err;
    int have = kv_mkmodel_truncate(SMOL, trunc, 8, &err) == 0;
    CHECKF(have, "truncated draft: %s", err.msg);
    const method_case cases[] = {
        {"ngram k4", KV_SPEC_NGRAM, 4, 0, 1, NULL, 0.05},
        {"self L12 k3", KV_SPEC_SELF, 3, 12, 0, NULL, 0.0},
        {"draft model (8 layers) k3", KV_SPEC_DRAFT_MODEL, 3, 0, 0, have ? trunc : SMOL, 0.0},
    };
    greedy_battery(&c, texts, max_tokens, KV_ARRAY_LEN(texts), cases, SLOW_BUILD ? 1 : KV_ARRAY_LEN(cases),
                   !SLOW_BUILD);
    if (have) unlink(trunc);
}

/* ---- the output distribution under rejection sampling ---- */

/* The exact target distribution of the 2nd and 3rd generated tokens after
 * prompt + m (the mode of the first token), at sampling s: joint[x2 * V +
 * x3]. Returns the probability of m as the first token, or < 0. */
static double exact_joint(const kv_model *m, const int32_t *prompt, int n, const kv_sampling *s, int32_t *mode,
                          double *joint) {
    kv_err err;
    kv_backend *be = kv_backend_create("cpu", 1, &err);
    kv_runner *r = be ? kv_runner_new(m, be, 128, 64, KV_CACHE_F32, &err) : NULL;
    kv_sampler *smp = kv_sampler_new(m->hp.n_vocab);
    const int V = m->hp.n_vocab;
    float *lg = malloc((size_t)V * sizeof *lg), *p1 = malloc((size_t)V * sizeof *p1);
    float *p2 = malloc((size_t)V * sizeof *p2), *p3 = malloc((size_t)V * sizeof *p3);
    double pm = -1;
    if (!r || !smp || !lg || !p1 || !p2 || !p3) goto out;
    if (kv_runner_eval(r, prompt, n, lg, NULL, &err)) goto out;
    kv_sampler_dist(smp, s, lg, prompt, n, p1);
    *mode = kv_argmax(p1, V);
    pm = p1[*mode];
    if (kv_runner_eval(r, mode, 1, lg, NULL, &err)) goto out;
    kv_sampler_dist(smp, s, lg, NULL, 0, p2);
    int pos = kv_runner_pos(r);
    memset(joint, 0, (size_t)V * V * sizeof *joint);
    for (int32_t x = 0; x < V; x++) {
        if (p2[x] <= 0) continue;
        kv_runner_truncate(r, pos);
        if (kv_runner_eval(r, &x, 1, lg, NULL, &err)) goto out;
        kv_sampler_dist(smp, s, lg, NULL, 0, p3);
        for (int y = 0; y < V; y++) joint[(size_t)x * V + y] = (double)p2[x] * p3[y];
    }
out:
    FREE_ALL(lg, p1, p2, p3);
    kv_sampler_free(smp);
    kv_runner_free(r);
    kv_backend_free(be);
    return pm;
}

/* The first-position and conditional second-position distributions of a
 * model after prompt + m (for the simulated biased rule). */
static int model_dists(const kv_model *m, const int32_t *ctx, int n, const kv_sampling *s, float *d2, float *d3) {
    kv_err err;
    kv_backend *be = kv_backend_create("cpu", 1, &err);
    kv_runner *r = be ? kv_runner_new(m, be, 128, 64, KV_CACHE_F32, &err) : NULL;
    kv_sampler *smp = kv_sampler_new(m->hp.n_vocab);
    const int V = m->hp.n_vocab;
    float *lg = malloc((size_t)V * sizeof *lg);
    int rc = -1;
    if (!r || !smp || !lg || kv_runner_eval(r, ctx, n, lg, NULL, &err)) goto out;
    kv_sampler_dist(smp, s, lg, NULL, 0, d2);
    int pos = kv_runner_pos(r);
    for (int32_t x = 0; x < V; x++) {
        kv_runner_truncate(r, pos);
        if (kv_runner_eval(r, &x, 1, lg, NULL, &err)) goto out;
        kv_sampler_dist(smp, s, lg, NULL, 0, d3 + (size_t)x * V);
    }
    rc = 0;
out:
    free(lg);
    kv_sampler_free(smp);
    kv_runner_free(r);
    kv_backend_free(be);
    return rc;
}

/* Samples requests of the prompt through the engine (max 4 tokens, k = 2)
 * and tests the (2nd, 3rd) token pairs of those whose first token is the
 * mode against the exact joint. Returns the p-value (or -1). */
static double engine_sample_test(const kv_config *c, const char *prompt, int n_req, int32_t mode, const double *joint,
                                 int V, double *acceptance) {
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    double *counts = calloc((size_t)V * V, sizeof *counts);
    int64_t *ids = malloc((size_t)n_req * sizeof *ids);
    int32_t(*tok)[3] = calloc((size_t)n_req, sizeof *tok);
    int *nt = calloc((size_t)n_req, sizeof *nt);
    double pval = -1;
    if (!counts || !ids || !tok || !nt) goto out;
    kv_event ev[512];
    int submitted = 0, done = 0, check_fail = 0;
    while (done < n_req) {
        /* keep the engine fed without queueing everything at once */
        while (submitted < n_req && submitted - done < 256) {
            kv_request_params p;
            kv_engine_request_defaults(e, &p);
            p.text = prompt;
            p.max_tokens = 4;
            p.ignore_eos = 1;
            p.session = submitted;
            kv_err err;
            ids[submitted] = kv_engine_submit(e, &p, &err);
            if (ids[submitted] <= 0) goto out;
            submitted++;
        }
        int rc = kv_engine_step(e);
        if (rc < 0) goto out;
        char msg[256];
        if (kv_engine_check(e, msg, sizeof msg) != 0 && check_fail++ < 3) CHECKF(0, "%s", msg);
        int k;
        while ((k = kv_engine_poll(e, ev, 512)) > 0)
            for (int j = 0; j < k; j++) {
                int i = ev[j].session;
                if (i < 0 || i >= n_req) continue;
                if (ev[j].type == KV_EVENT_TOKEN && ev[j].token >= 0 && nt[i] < 3) tok[i][nt[i]++] = ev[j].token;
                if (ev[j].type == KV_EVENT_DONE) done++;
            }
        if (rc == 0 && submitted == n_req && done < n_req) goto out;
    }
    double used = 0;
    for (int i = 0; i < n_req; i++)
        if (nt[i] == 3 && tok[i][0] == mode) {
            counts[(size_t)tok[i][1] * V + tok[i][2]]++;
            used++;
        }
    kv_metrics_summary m;
    kv_engine_metrics(e, &m);
    *acceptance = m.spec_acceptance_rate;
    int df;
    pval = chi_square_p(counts, joint, V * V, used, &df);
    printf("    %.0f samples, df %d, acceptance %.3f, %llu verifies: p-value %.4f\n", used, df, m.spec_acceptance_rate,
           (unsigned long long)m.spec_drafts, pval);
    CHECK(m.spec_drafts > 0);
    CHECK(check_fail == 0);
out:
    FREE_ALL(counts, ids, tok, nt);
    kv_engine_free(e);
    return pval;
}

static void test_rejection_sampling_distribution(void) {
    const char *target_path = harness_shared_path("models/stories260K.gguf");
    char target[512];
    harness_copy_str(target, sizeof target, target_path);
    kv_err err;
    kv_model *tm = kv_model_load(target, NULL, &err);
    REQUIRE(tm);
    const int V = tm->hp.n_vocab;
    /* a deliberately different draft: random weights, the target's vocabulary */
    char draft[512];
    tmp_path(draft, sizeof draft, "random-draft.gguf");
    kv_mkmodel_params mp = test_tiny_model(64, 128);
    mp.seed = 5;
    mp.vocab_from = target;
    int have_draft = kv_mkmodel_write(&mp, draft, &err) == 0;
    CHECKF(have_draft, "mkmodel: %s", err.msg);
    kv_model *dm = have_draft ? kv_model_load(draft, NULL, &err) : NULL;
    kv_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0, .repeat_penalty = 1.0f,
                     .repeat_last_n = 0, .seed = 99};
    const char *prompt = "One day, a little boy";
    int32_t ids[64];
    int n = kv_tokenizer_encode(tm->tok, prompt, strlen(prompt), 1, 0, ids, 64, &err);
    double *joint = malloc((size_t)V * V * sizeof *joint);
    float *p2 = malloc((size_t)V * sizeof *p2), *p3 = malloc((size_t)V * V * sizeof *p3);
    float *q2 = malloc((size_t)V * sizeof *q2), *q3 = malloc((size_t)V * V * sizeof *q3);
    if (!dm || n <= 0 || n > 60 || !joint || !p2 || !p3 || !q2 || !q3) {
        CHECKF(0, "setup failed");
        goto out;
    }
    int32_t mode;
    double pm = exact_joint(tm, ids, n, &s, &mode, joint);
    CHECKF(pm > 0.5, "the first token's mode has probability %.3f", pm);
    ids[n] = mode;
    if (model_dists(tm, ids, n + 1, &s, p2, p3) != 0 || model_dists(dm, ids, n + 1, &s, q2, q3) != 0) {
        CHECKF(0, "exact distributions failed");
        goto out;
    }
    const int N = SLOW_BUILD ? 1500 : 16000;
    const int used = (int)(N * pm);

    /* the test has power: simulated with the exact p and q, the right rule
     * passes and always accepting (the draft's joint) fails */
    {
        double *good = calloc((size_t)V * V, sizeof *good), *bad = calloc((size_t)V * V, sizeof *bad);
        float *work = malloc((size_t)V * sizeof *work);
        if (!good || !bad || !work) {
            FREE_ALL(good, bad, work);
            CHECKF(0, "out of memory");
            goto out;
        }
        kv_rng rng;
        kv_rng_seed(&rng, 3);
        for (int t = 0; t < used; t++) {
            int32_t d2 = kv_sample_from(q2, V, &rng), d3 = kv_sample_from(q3 + (size_t)d2 * V, V, &rng), x2, x3;
            bad[(size_t)d2 * V + d3]++;
            memcpy(work, p2, (size_t)V * sizeof *work);
            if (kv_spec_accept(work, q2, V, d2, &rng, &x2)) {
                x2 = d2;
                memcpy(work, p3 + (size_t)d2 * V, (size_t)V * sizeof *work);
                x3 = kv_spec_accept(work, q3 + (size_t)d2 * V, V, d3, &rng, &x3) ? d3 : x3;
            } else {
                x3 = kv_sample_from(p3 + (size_t)x2 * V, V, &rng);
            }
            good[(size_t)x2 * V + x3]++;
        }
        int df;
        double pg = chi_square_p(good, joint, V * V, used, &df), pb = chi_square_p(bad, joint, V * V, used, NULL);
        printf("    simulated, %d samples (df %d): exact rule p=%.4f, always-accept p=%.3g\n", used, df, pg, pb);
        CHECKF(pg > 1e-3, "simulated exact rule rejected: p %g", pg);
        CHECKF(pb < 1e-6, "the test cannot tell always-accept apart: p %g", pb);
        FREE_ALL(good, bad, work);
    }

    /* the engine: draft model (mostly rejections: the residual path), self
     * (acceptance chains), ngram (one-hot proposals) */
    kv_config c;
    base_config(&c, target);
    c.sampling = s;
    c.scheduler.max_seqs = 64;
    c.kv.blocks = 1024;
    c.spec.k = 2;
    c.spec.adaptive = 0;
    double acc;
    c.spec.method = KV_SPEC_DRAFT_MODEL;
    harness_copy_str(c.spec.draft_model, sizeof c.spec.draft_model, draft);
    double pv = engine_sample_test(&c, prompt, N, mode, joint, V, &acc);
    CHECKF(pv > 1e-3, "draft model: engine samples differ from the target's distribution (p %g)", pv);
    c.spec.method = KV_SPEC_SELF;
    c.spec.draft_layers = 4;
    if (!SLOW_BUILD) { /* sanitizers: the draft model and ngram runs cover the same code */
        pv = engine_sample_test(&c, prompt, N, mode, joint, V, &acc);
        CHECKF(pv > 1e-3, "self: engine samples differ from the target's distribution (p %g)", pv);
        CHECKF(acc > 0.15, "self L4: acceptance %.3f (too low to test accepted chains)", acc);
    }
    /* ngram: a prompt that repeats itself, so the lookup proposes */
    const char *rep = "One day, a little boy named Tom. One day, a little boy";
    n = kv_tokenizer_encode(tm->tok, rep, strlen(rep), 1, 0, ids, 64, &err);
    if (n <= 0 || n >= 60) {
        CHECKF(0, "tokenize: %d", n);
        goto out;
    }
    pm = exact_joint(tm, ids, n, &s, &mode, joint);
    CHECKF(pm > 0.5, "ngram prompt: mode probability %.3f", pm);
    c.spec.method = KV_SPEC_NGRAM;
    pv = engine_sample_test(&c, rep, N, mode, joint, V, &acc);
    CHECKF(pv > 1e-3, "ngram: engine samples differ from the target's distribution (p %g)", pv);
out:
    FREE_ALL(joint, p2, p3, q2, q3);
    kv_model_free(dm);
    kv_model_free(tm);
    if (have_draft) unlink(draft);
}

/* Two rounds in one engine with prefix sharing: round 2's prompts are
 * round 1's prompts plus everything round 1 generated with speculation, so
 * round 2 attaches the blocks that hold speculatively produced tokens. Its
 * greedy output must equal the same two rounds without speculation: a
 * registered block whose K/V came from a rejected draft would change it. */
static int two_rounds(const kv_config *c, const int32_t (*prompts)[16], int np, int n1, int n2, int32_t (*out)[64],
                      uint64_t *hit_tokens) {
    kv_engine *e = test_engine_new(c);
    if (!e) return -1;
    int32_t seq[8][16 + 64];
    int len[8];
    int rc = 0;
    for (int round = 0; round < 2 && rc == 0; round++) {
        int64_t ids[8];
        for (int i = 0; i < np && rc == 0; i++) {
            if (round == 0) {
                memcpy(seq[i], prompts[i], sizeof prompts[i]);
                len[i] = 16;
            }
            kv_request_params p;
            kv_engine_request_defaults(e, &p);
            p.tokens = seq[i];
            p.n_tokens = len[i];
            p.max_tokens = round == 0 ? n1 : n2;
            p.ignore_eos = 1;
            p.session = i;
            ids[i] = kv_engine_submit(e, &p, NULL);
            if (ids[i] <= 0) rc = -1;
            /* one at a time: each request finds the blocks of the ones before */
            if (rc == 0 && kv_engine_run_until_idle(e) != 0) rc = -1;
            char msg[256];
            if (kv_engine_check(e, msg, sizeof msg) != 0) CHECKF(0, "%s", msg);
            kv_event ev[128];
            int k, got = 0;
            while ((k = kv_engine_poll(e, ev, 128)) > 0)
                for (int j = 0; j < k; j++)
                    if (ev[j].type == KV_EVENT_TOKEN && ev[j].token >= 0 && ev[j].req == ids[i]) {
                        if (round == 0 && len[i] < 16 + 64) seq[i][len[i]++] = ev[j].token;
                        if (round == 1 && got < 64) out[i][got++] = ev[j].token;
                    }
        }
    }
    kv_metrics_summary m;
    kv_engine_metrics(e, &m);
    *hit_tokens = m.prefix_hit_tokens;
    kv_engine_free(e);
    return rc;
}

static void test_prefix_reuse_after_spec(void) {
    kv_config c;
    stories_base(&c);
    c.kv.prefix_sharing = 1;
    c.kv.block_size = 8; /* many full blocks of generated tokens */
    const char *texts[4] = {"Once upon a time, there was a little girl named Lily. She loved to play",
                            "Tom had a dog. The dog was big and brown. Every day Tom and his dog went",
                            "one two three four one two three four one two three four one two three",
                            "The sun was hot and the cat was sleepy. The cat found a spot under a big"};
    int32_t prompts[4][16];
    kv_err err;
    kv_model *m = kv_model_load(c.model.path, NULL, &err);
    REQUIRE(m);
    for (int i = 0; i < 4; i++) {
        int32_t ids[128];
        int n = kv_tokenizer_encode(m->tok, texts[i], strlen(texts[i]), 1, 0, ids, 128, &err);
        REQUIRE(n >= 16);
        memcpy(prompts[i], ids, sizeof prompts[i]);
    }
    kv_model_free(m);
    int32_t ref[4][64], got[4][64];
    memset(ref, 0, sizeof ref);
    uint64_t hits_ref, hits;
    REQUIRE(two_rounds(&c, (const int32_t(*)[16])prompts, 4, 40, 16, ref, &hits_ref) == 0);
    char gguf[512];
    harness_copy_str(gguf, sizeof gguf, harness_shared_path("models/stories260K.gguf"));
    const method_case cases[] = {{"ngram", KV_SPEC_NGRAM, 4, 0, 0, NULL, 0},
                                 {"self L4", KV_SPEC_SELF, 3, 4, 0, NULL, 0},
                                 {"draft model", KV_SPEC_DRAFT_MODEL, 4, 0, 0, gguf, 0}};
    for (size_t k = 0; k < KV_ARRAY_LEN(cases); k++) {
        kv_config cs = c;
        set_method(&cs, &cases[k]);
        memset(got, 0, sizeof got);
        REQUIRE(two_rounds(&cs, (const int32_t(*)[16])prompts, 4, 40, 16, got, &hits) == 0);
        /* round 2 reuses round 1's prompt and generated blocks */
        CHECKF(hits >= 4 * 48, "%s: only %llu prefix-hit tokens", cases[k].name, (unsigned long long)hits);
        CHECKF(hits == hits_ref, "%s: %llu prefix-hit tokens, %llu without speculation", cases[k].name,
               (unsigned long long)hits, (unsigned long long)hits_ref);
        int same = memcmp(ref, got, sizeof ref) == 0;
        CHECKF(same, "%s: round 2 differs from the run without speculation", cases[k].name);
        printf("    %-12s round 2 %s, %llu prefix-hit tokens\n", cases[k].name, same ? "same" : "DIFFERS",
               (unsigned long long)hits);
    }
}

/* Seeded sampling with speculation is deterministic: the same run twice
 * gives the same tokens. */
static void test_sampling_deterministic(void) {
    kv_config c;
    stories_base(&c);
    c.sampling.temperature = 0.8f;
    c.sampling.top_k = 40;
    c.sampling.top_p = 0.95f;
    c.sampling.seed = 17;
    c.spec.method = KV_SPEC_SELF;
    c.spec.draft_layers = 3;
    c.spec.k = 3;
    result *a = calloc(MAXR, sizeof *a), *b = calloc(MAXR, sizeof *b);
    run_stats st;
    REQUIRE(a && b);
    REQUIRE(run_engine(&c, stories_texts, stories_max, N_STORIES, 0, a, &st) == 0);
    CHECK(st.m.spec_drafts > 0);
    REQUIRE(run_engine(&c, stories_texts, stories_max, N_STORIES, 0, b, &st) == 0);
    compare("seeded sampling, run twice", a, b, stories_max, N_STORIES);
    free(a);
    free(b);
}

/* Low acceptance (the target's first layer as the draft): the adaptive
 * controller falls back to plain decoding, drafts far less than the fixed
 * k does, and the output stays the same. */
static void test_adaptive_fallback(void) {
    kv_config c;
    stories_base(&c);
    result *ref = calloc(MAXR, sizeof *ref), *got = calloc(MAXR, sizeof *got);
    run_stats st, fixed, adapt;
    REQUIRE(ref && got);
    REQUIRE(run_engine(&c, stories_texts, stories_max, N_STORIES, 0, ref, &st) == 0);
    c.spec.method = KV_SPEC_SELF;
    c.spec.draft_layers = 1;
    c.spec.k = 4;
    c.spec.min_acceptance = 0.4f;
    c.spec.adaptive = 0;
    REQUIRE(run_engine(&c, stories_texts, stories_max, N_STORIES, 0, got, &fixed) == 0);
    compare("self L1, fixed k", ref, got, stories_max, N_STORIES);
    c.spec.adaptive = 1;
    REQUIRE(run_engine(&c, stories_texts, stories_max, N_STORIES, 0, got, &adapt) == 0);
    compare("self L1, adaptive", ref, got, stories_max, N_STORIES);
    printf("    fixed k: %llu drafted, acceptance %.3f; adaptive: %llu drafted, acceptance %.3f, %d fallbacks\n",
           (unsigned long long)fixed.m.spec_drafted, fixed.m.spec_acceptance_rate,
           (unsigned long long)adapt.m.spec_drafted, adapt.m.spec_acceptance_rate, adapt.n_fallback_decisions);
    CHECK(fixed.m.spec_acceptance_rate < 0.4);
    CHECK(fixed.n_fallback_decisions == 0);
    CHECK(adapt.n_fallback_decisions >= 5);
    CHECK(adapt.saw_k0);
    CHECK(adapt.m.spec_drafted * 3 < fixed.m.spec_drafted);
    /* high acceptance keeps k at its maximum: the same model as its draft */
    char gguf[512];
    harness_copy_str(gguf, sizeof gguf, harness_shared_path("models/stories260K.gguf"));
    c.spec.method = KV_SPEC_DRAFT_MODEL;
    harness_copy_str(c.spec.draft_model, sizeof c.spec.draft_model, gguf);
    REQUIRE(run_engine(&c, stories_texts, stories_max, N_STORIES, 0, got, &adapt) == 0);
    CHECK(adapt.n_fallback_decisions == 0);
    CHECK(adapt.m.spec_mean_accepted_len > 3.0);
    free(ref);
    free(got);
}

static void expect_fail(const kv_config *c, const char *needle) {
    kv_err err;
    kv_err_clear(&err);
    kv_engine *e = kv_engine_new(c, &err);
    CHECKF(!e, "engine created; expected an error mentioning '%s'", needle);
    kv_engine_free(e);
    CHECKF(strstr(err.msg, needle) != NULL, "error '%s' does not mention '%s'", err.msg, needle);
}

static void test_bad_config(void) {
    kv_config c;
    stories_base(&c);
    c.spec.method = KV_SPEC_SELF;
    c.spec.draft_layers = 5; /* stories260K has 5 layers */
    expect_fail(&c, "spec.draft_layers");
    c.spec.method = KV_SPEC_DRAFT_MODEL;
    harness_copy_str(c.spec.draft_model, sizeof c.spec.draft_model, "no/such/draft.gguf");
    expect_fail(&c, "spec.draft_model");
    if (access(SMOL, R_OK) == 0) {
        /* another vocabulary */
        harness_copy_str(c.spec.draft_model, sizeof c.spec.draft_model, SMOL);
        expect_fail(&c, "tokens");
        base_config(&c, SMOL);
        c.spec.method = KV_SPEC_DRAFT_MODEL;
        harness_copy_str(c.spec.draft_model, sizeof c.spec.draft_model, harness_shared_path("models/stories260K.gguf"));
        expect_fail(&c, "spec.draft_model");
    }
    /* a llama2.c draft without a tokenizer to read it with */
    stories_base(&c);
    c.spec.method = KV_SPEC_DRAFT_MODEL;
    harness_copy_str(c.spec.draft_model, sizeof c.spec.draft_model, harness_shared_path("models/stories260K.bin"));
    expect_fail(&c, "spec.draft_model");
    /* same-sized vocabulary, different texts */
    char other[512];
    tmp_path(other, sizeof other, "othervocab.gguf");
    kv_mkmodel_params mp = kv_mkmodel_default_params();
    mp.n_layers = 1;
    mp.n_vocab = 512;
    kv_err err;
    if (kv_mkmodel_write(&mp, other, &err) == 0) {
        harness_copy_str(c.spec.draft_model, sizeof c.spec.draft_model, other);
        expect_fail(&c, "another vocabulary");
        unlink(other);
    } else {
        CHECKF(0, "mkmodel: %s", err.msg);
    }
}

TEST_MAIN(T(test_ngram_lookup), T(test_expected_tokens), T(test_controller), T(test_accept_rule_unit),
          T(test_greedy_identical_stories260k), T(test_greedy_identical_llama2c), T(test_greedy_identical_smollm2),
          T(test_rejection_sampling_distribution), T(test_prefix_reuse_after_spec), T(test_sampling_deterministic), T(test_adaptive_fallback),
          T(test_bad_config))
