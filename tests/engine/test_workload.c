/* test_workload.c - synthetic workloads: the same seed gives the same
 * requests, draws follow their distributions (bounds, means, poisson gaps),
 * aspects draw from independent streams, prompt ids come out exactly the
 * drawn length with a shared system prefix, and JSONL prompt files parse
 * strictly with file:line errors. The workload driver (driver.h) on a real
 * engine: open-loop arrivals on the caller's clock, closed-loop slots,
 * repeat, output fitted to a context, session tags, and its one
 * tokenization rule (special-token texts stay text). */
#include <stdint.h>
#include <unistd.h>

#include "../../engine/config.h"
#include "../../engine/driver.h"
#include "../../engine/workload.h"
#include "../engine_helpers.h"
#include "../harness.h"

static kv_config base(void) {
    kv_config c;
    kv_config_default(&c);
    return c;
}

static kv_workload *build(const kv_config *c) {
    kv_err err;
    kv_workload *w = kv_workload_build(c, &err);
    if (!w) fprintf(stderr, "  build: %s\n", err.msg);
    return w;
}

static int same_items(const kv_workload *a, const kv_workload *b) {
    if (kv_workload_count(a) != kv_workload_count(b)) return 0;
    for (int i = 0; i < kv_workload_count(a); i++) {
        const kv_workload_item *x = kv_workload_get(a, i), *y = kv_workload_get(b, i);
        if (x->arrival_s != y->arrival_s || x->prompt_tokens != y->prompt_tokens ||
            x->output_tokens != y->output_tokens || x->uses_system != y->uses_system ||
            x->after_slot != y->after_slot)
            return 0;
    }
    return 1;
}

static void test_determinism(void) {
    kv_config c = base();
    c.workload.requests = 500;
    c.workload.system_prompt_len = 32;
    c.workload.system_prompt_fraction = 0.5;
    kv_workload *a = build(&c), *b = build(&c);
    REQUIRE(a && b);
    CHECK(kv_workload_count(a) == 500 && same_items(a, b));
    c.workload.seed = 2;
    kv_workload *d = build(&c);
    REQUIRE(d);
    CHECK(!same_items(a, d));
    int differ = 0;
    for (int i = 0; i < 500; i++) differ += kv_workload_get(a, i)->prompt_tokens != kv_workload_get(d, i)->prompt_tokens;
    CHECKF(differ > 300, "only %d of 500 prompt lengths changed with the seed", differ);
    /* Pinned values: the generator must not drift between versions (a
     * trace recorded today replays tomorrow). */
    const kv_workload_item *it = kv_workload_get(a, 0);
    CHECK(it->arrival_s == 0);
    char sig[256];
    snprintf(sig, sizeof sig, "%d %d %d %d %d %d", kv_workload_get(a, 0)->prompt_tokens,
             kv_workload_get(a, 0)->output_tokens, kv_workload_get(a, 1)->prompt_tokens,
             kv_workload_get(a, 1)->output_tokens, kv_workload_get(a, 2)->prompt_tokens,
             kv_workload_get(a, 499)->output_tokens);
    CHECKF(!strcmp(sig, "123 102 83 66 44 184"), "signature %s", sig);
    CHECKF(fabs(kv_workload_get(a, 1)->arrival_s - 0.026419009) < 1e-8, "arrival[1] %.9f", kv_workload_get(a, 1)->arrival_s);
    kv_workload_free(a);
    kv_workload_free(b);
    kv_workload_free(d);
    kv_workload_free(NULL);
}

static void test_streams_independent(void) {
    kv_config c = base();
    c.workload.requests = 300;
    kv_workload *a = build(&c);
    c.workload.output_len = (kv_dist){.kind = KV_DIST_UNIFORM, .min = 1, .max = 9};
    c.workload.system_prompt_len = 100;
    kv_workload *b = build(&c);
    c.workload.rate = 8;
    kv_workload *d = build(&c);
    REQUIRE(a && b && d);
    for (int i = 0; i < 300; i++) {
        const kv_workload_item *x = kv_workload_get(a, i), *y = kv_workload_get(b, i), *z = kv_workload_get(d, i);
        CHECK(x->arrival_s == y->arrival_s && x->prompt_tokens == y->prompt_tokens);
        CHECK(y->output_tokens >= 1 && y->output_tokens <= 9);
        /* twice the rate: the same gaps, halved */
        CHECK(fabs(z->arrival_s * 2 - y->arrival_s) <= 1e-9 * (1 + y->arrival_s));
        CHECK(z->output_tokens == y->output_tokens);
    }
    kv_workload_free(a);
    kv_workload_free(b);
    kv_workload_free(d);
}

static void stats(const kv_workload *w, int output, double *mean, int *lo, int *hi) {
    double s = 0;
    *lo = INT32_MAX, *hi = 0;
    int n = kv_workload_count(w);
    for (int i = 0; i < n; i++) {
        const kv_workload_item *it = kv_workload_get(w, i);
        int v = output ? it->output_tokens : it->prompt_tokens;
        s += v;
        *lo = KV_MIN(*lo, v);
        *hi = KV_MAX(*hi, v);
    }
    *mean = s / n;
}

static void test_distributions(void) {
    kv_config c = base();
    c.workload.requests = 40000;
    /* lognormal with far bounds: the sample mean is the configured mean */
    c.workload.prompt_len = (kv_dist){.kind = KV_DIST_LOGNORMAL, .mean = 128, .sigma = 0.5, .min = 1, .max = 1000000};
    /* uniform: flat over [min, max], both ends reached */
    c.workload.output_len = (kv_dist){.kind = KV_DIST_UNIFORM, .min = 10, .max = 20};
    kv_workload *w = build(&c);
    REQUIRE(w);
    double m;
    int lo, hi;
    stats(w, 0, &m, &lo, &hi);
    CHECKF(fabs(m - 128) < 128 * 0.02, "lognormal mean %.2f", m);
    CHECK(lo >= 1 && hi > 300); /* a long right tail */
    /* the median of a lognormal is exp(mu) = mean * exp(-sigma^2/2) = 113 */
    int below = 0;
    for (int i = 0; i < 40000; i++) below += kv_workload_get(w, i)->prompt_tokens < 113;
    CHECKF(fabs(below / 40000.0 - 0.5) < 0.02, "median fraction %.3f", below / 40000.0);
    stats(w, 1, &m, &lo, &hi);
    CHECKF(fabs(m - 15) < 0.1 && lo == 10 && hi == 20, "uniform mean %.2f [%d, %d]", m, lo, hi);
    int count[11] = {0};
    for (int i = 0; i < 40000; i++) count[kv_workload_get(w, i)->output_tokens - 10]++;
    for (int i = 0; i < 11; i++) CHECKF(abs(count[i] - 40000 / 11) < 300, "uniform bucket %d: %d", i, count[i]);
    kv_workload_free(w);

    /* clamped lognormal: everything inside [min, max] */
    c.workload.requests = 5000;
    c.workload.prompt_len = (kv_dist){.kind = KV_DIST_LOGNORMAL, .mean = 128, .sigma = 1.5, .min = 50, .max = 200};
    c.workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 77};
    w = build(&c);
    REQUIRE(w);
    stats(w, 0, &m, &lo, &hi);
    CHECK(lo == 50 && hi == 200);
    stats(w, 1, &m, &lo, &hi);
    CHECK(lo == 77 && hi == 77);
    kv_workload_free(w);

    /* the defaults stay inside their bounds */
    c = base();
    c.workload.requests = 5000;
    w = build(&c);
    REQUIRE(w);
    stats(w, 0, &m, &lo, &hi);
    CHECK(lo >= 8 && hi <= 1024 && fabs(m - 128) < 8);
    stats(w, 1, &m, &lo, &hi);
    CHECK(lo >= 8 && hi <= 512);
    kv_workload_free(w);
}

static void test_arrivals(void) {
    kv_config c = base();
    c.workload.requests = 20001;
    c.workload.rate = 4;
    kv_workload *w = build(&c);
    REQUIRE(w);
    CHECK(kv_workload_get(w, 0)->arrival_s == 0 && kv_workload_concurrency(w) == 0);
    double s = 0, s2 = 0;
    int mono = 1;
    for (int i = 1; i < 20001; i++) {
        double g = kv_workload_get(w, i)->arrival_s - kv_workload_get(w, i - 1)->arrival_s;
        mono &= g >= 0;
        s += g;
        s2 += g * g;
        CHECK(!kv_workload_get(w, i)->after_slot);
    }
    double mean = s / 20000, sd = sqrt(s2 / 20000 - mean * mean);
    CHECK(mono);
    CHECKF(fabs(mean - 0.25) < 0.25 * 0.03, "mean gap %.4f", mean);
    /* exponential gaps: standard deviation = mean */
    CHECKF(fabs(sd / mean - 1) < 0.05, "gap cv %.3f", sd / mean);
    kv_workload_free(w);

    c.workload.requests = 10;
    c.workload.arrival = KV_ARRIVAL_BURST;
    w = build(&c);
    REQUIRE(w);
    for (int i = 0; i < 10; i++) CHECK(kv_workload_get(w, i)->arrival_s == 0 && !kv_workload_get(w, i)->after_slot);
    kv_workload_free(w);

    c.workload.arrival = KV_ARRIVAL_CLOSED;
    c.workload.concurrency = 3;
    w = build(&c);
    REQUIRE(w);
    CHECK(kv_workload_concurrency(w) == 3);
    for (int i = 0; i < 10; i++) CHECK(kv_workload_get(w, i)->after_slot == (i >= 3) && kv_workload_get(w, i)->arrival_s == 0);
    CHECK(kv_workload_get(w, 10) == NULL && kv_workload_get(w, -1) == NULL);
    kv_workload_free(w);

    /* zero requests is an empty workload; bad settings are refused */
    c.workload.requests = 0;
    w = build(&c);
    CHECK(w && kv_workload_count(w) == 0);
    kv_workload_free(w);
    kv_err err;
    c = base();
    c.workload.rate = 0;
    CHECK(kv_workload_build(&c, &err) == NULL && strstr(err.msg, "workload.rate"));
    c = base();
    c.workload.prompt_len.min = 900, c.workload.prompt_len.max = 100;
    CHECK(kv_workload_build(&c, &err) == NULL && strstr(err.msg, "workload.prompt_len.min"));
    CHECK(kv_workload_build(NULL, &err) == NULL);
}

static void test_system_prompt_use(void) {
    kv_config c = base();
    c.workload.requests = 4000;
    c.workload.system_prompt_len = 64;
    c.workload.system_prompt_fraction = 0.25;
    kv_workload *w = build(&c);
    REQUIRE(w);
    int used = 0;
    for (int i = 0; i < 4000; i++) {
        const kv_workload_item *it = kv_workload_get(w, i);
        used += it->uses_system;
        CHECK(it->system_tokens == (it->uses_system ? 64 : 0));
    }
    CHECKF(abs(used - 1000) < 100, "%d of 4000 use the system prompt", used);
    CHECK(strlen(kv_workload_system_text(w)) > 100 && !strncmp(kv_workload_system_text(w), "You are", 7));
    kv_workload_free(w);
    c.workload.system_prompt_len = 0;
    w = build(&c);
    REQUIRE(w);
    for (int i = 0; i < 4000; i++) CHECK(!kv_workload_get(w, i)->uses_system);
    CHECK(!strcmp(kv_workload_system_text(w), ""));
    kv_workload_free(w);
}

/* ---- fake tokenizers ---- */

static uint32_t fnv(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* One id per word (a hash), like a word-level vocabulary. */
static int tok_words(void *ctx, const char *text, int32_t *out, int cap) {
    int *calls = ctx;
    if (calls) (*calls)++;
    int n = 0;
    const char *p = text;
    while (*p) {
        while (*p == ' ') p++;
        const char *s = p;
        while (*p && *p != ' ') p++;
        if (p > s) {
            if (n < cap) out[n] = (int32_t)(fnv(s, (size_t)(p - s)) % 50000);
            n++;
        }
    }
    return n < cap ? n : cap;
}

/* One id per byte: many tokens per word (a tiny vocabulary like stories260K's). */
static int tok_bytes(void *ctx, const char *text, int32_t *out, int cap) {
    int n = 0;
    for (; text[n] && n < cap; n++) out[n] = (unsigned char)text[n];
    return n;
}

/* One id per three words: fewer tokens than the first guess assumes. */
static int tok_sparse(void *ctx, const char *text, int32_t *out, int cap) {
    int32_t tmp[1 << 16];
    int n = tok_words(NULL, text, tmp, 1 << 16), m = 0;
    for (int i = 0; i < n && m < cap; i += 3) out[m++] = tmp[i];
    return m;
}

static int tok_fail(void *ctx, const char *text, int32_t *out, int cap) { return -5; }
static int tok_none(void *ctx, const char *text, int32_t *out, int cap) { return 0; }

static void test_tokens_exact(void) {
    kv_config c = base();
    c.workload.requests = 20;
    c.workload.system_prompt_len = 40;
    c.workload.system_prompt_fraction = 1.0;
    kv_workload *w = build(&c);
    REQUIRE(w);
    kv_tokenize_fn toks[] = {tok_words, tok_bytes, tok_sparse};
    static int32_t a[4096], b[4096], sys0[64];
    for (size_t t = 0; t < KV_ARRAY_LEN(toks); t++) {
        for (int i = 0; i < 20; i++) {
            const kv_workload_item *it = kv_workload_get(w, i);
            kv_err err;
            int n = kv_workload_tokens(w, i, toks[t], NULL, a, 4096, &err);
            CHECKF(n == 40 + it->prompt_tokens, "tok %zu req %d: %d ids, want %d (%s)", t, i, n, 40 + it->prompt_tokens,
                   err.msg);
            /* deterministic */
            int n2 = kv_workload_tokens(w, i, toks[t], NULL, b, 4096, &err);
            CHECK(n2 == n && !memcmp(a, b, (size_t)n * sizeof *a));
            /* the system prompt ids are the same in every request */
            if (i == 0) memcpy(sys0, a, sizeof(int32_t) * 40);
            else CHECK(!memcmp(sys0, a, sizeof(int32_t) * 40));
        }
        /* different requests get different text */
        int na = kv_workload_tokens(w, 0, toks[t], NULL, a, 4096, NULL);
        int nb = kv_workload_tokens(w, 1, toks[t], NULL, b, 4096, NULL);
        CHECK(na > 48 && nb > 48 && memcmp(a + 40, b + 40, 8 * sizeof *a));
    }
    /* The ids are the start of the tokenization of one text: with the word
     * tokenizer they are the hashes of the first words of kv_workload_text. */
    char text[8192];
    int tl = kv_workload_text(w, 3, text, sizeof text);
    CHECK(tl > 0 && tl < (int)sizeof text);
    int32_t ids[4096];
    int nt = tok_words(NULL, text, ids, 4096);
    int n = kv_workload_tokens(w, 3, tok_words, NULL, a, 4096, NULL);
    int own = n - 40, cmp = KV_MIN(own, nt);
    CHECK(cmp > 10 && !memcmp(a + 40, ids, (size_t)cmp * sizeof *ids));
    /* The text reads like English words. */
    CHECK(text[0] >= 'A' && text[0] <= 'Z' && strchr(text, ' ') && (strchr(text, '.') || strchr(text, '?')));
    /* Few tokenizer calls: the length guess converges quickly. */
    int calls = 0;
    kv_workload_tokens(w, 5, tok_words, &calls, a, 4096, NULL);
    CHECKF(calls <= 6, "%d tokenizer calls", calls);

    /* Errors: no room, a failing tokenizer, one that makes nothing. */
    kv_err err;
    CHECK(kv_workload_tokens(w, 0, tok_words, NULL, a, 30, &err) == KV_ERR_RANGE);
    CHECK(kv_workload_tokens(w, 0, tok_words, NULL, a, 45, &err) == KV_ERR_RANGE);
    CHECK(kv_workload_tokens(w, 0, tok_fail, NULL, a, 4096, &err) == KV_ERR_FORMAT && strstr(err.msg, "tokenizer failed"));
    CHECK(kv_workload_tokens(w, 0, tok_none, NULL, a, 4096, &err) == KV_ERR_FORMAT && strstr(err.msg, "only 0"));
    CHECK(kv_workload_tokens(w, 99, tok_words, NULL, a, 4096, &err) == KV_ERR_RANGE);
    kv_workload_free(w);

    /* The standalone helper: exactly n, for several n, same seed same ids. */
    for (int want = 0; want <= 700; want += 175) {
        int got = kv_workload_exact_tokens(99, want, tok_bytes, NULL, a, 4096, &err);
        CHECK(got == want);
        CHECK(kv_workload_exact_tokens(99, want, tok_bytes, NULL, b, 4096, &err) == want);
        CHECK(!memcmp(a, b, (size_t)want * sizeof *a));
    }
    CHECK(kv_workload_exact_tokens(99, 100, tok_words, NULL, a, 50, &err) == KV_ERR_RANGE);
}

/* ---- prompts files ---- */

static void test_prompts_parse(void) {
    const char *text = "\xef\xbb\xbf{\"prompt\": \"Hello, world\"}\n"
                       "\n"
                       "   \t\n"
                       "{\"id\": 7, \"prompt\": \"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\" a\\\\b\\nline2\\ttab\"}\r\n"
                       "{\"prompt\":\"\xe2\x82\xac raw utf8\", \"meta\": {\"x\": [1, 2]}}";
    char **p = NULL;
    int n = -1;
    kv_err err;
    REQUIRE(kv_workload_parse_prompts(text, strlen(text), "p.jsonl", &p, &n, &err) == 0 || (printf("%s\n", err.msg), 0));
    CHECK(n == 3);
    CHECK(!strcmp(p[0], "Hello, world"));
    CHECK(!strcmp(p[1], "caf\xc3\xa9 \xf0\x9f\x98\x80 \"q\" a\\b\nline2\ttab"));
    CHECK(!strcmp(p[2], "\xe2\x82\xac raw utf8"));
    kv_workload_free_prompts(p, n);

    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\",}\n", "p.jsonl:3:16: trailing comma"},
        {"{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n", "p.jsonl:2: no \"prompt\" string member"},
        {"[\"a\"]\n", "p.jsonl:1: expected an object"},
        {"{\"prompt\": 5}\n", "p.jsonl:1: no \"prompt\" string"},
        {"\n\n{\"prompt\": \"\\ud800\"}\n", "p.jsonl:3:13: high surrogate"},
        {"{\"prompt\": \"\\udc00x\"}\n", "p.jsonl:1:13: lone low surrogate"},
        {"{\"prompt\": \"a\xff\"}\n", "p.jsonl:1:14: invalid UTF-8"},
        {"{\"prompt\": \"a\\u0000b\"}\n", "p.jsonl:1: prompt contains a NUL"},
        {"{\"prompt\": \"\"}\n", "p.jsonl:1: empty prompt"},
        {"{\"prompt\": \"a\", \"prompt\": \"b\"}\n", "p.jsonl:1:1: duplicate key 'prompt'"},
        {"{\"prompt\": \"a\"} {\"prompt\": \"b\"}\n", "p.jsonl:1:17: trailing characters"},
        {"{\"prompt\": \"multi\nline\"}\n", "p.jsonl:1:12: unterminated string"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(bad); i++) {
        p = (char **)&n; /* sentinel: must stay */
        int before = n = 42;
        int rc = kv_workload_parse_prompts(bad[i].text, strlen(bad[i].text), "p.jsonl", &p, &n, &err);
        CHECKF(rc == KV_ERR_FORMAT, "case %zu: rc %d", i, rc);
        CHECKF(strstr(err.msg, bad[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, bad[i].needle);
        CHECK(p == (char **)&n && n == before);
    }
    /* An empty file parses to no prompts. */
    CHECK(kv_workload_parse_prompts("", 0, "e", &p, &n, &err) == 0 && n == 0);
    kv_workload_free_prompts(p, n);
}

static void test_prompts_file_workload(void) {
    char path[512];
    snprintf(path, sizeof path, "%s", harness_tmp_path("workload", "prompts", ".jsonl"));
    const char *body = "{\"prompt\": \"one two three\"}\n{\"prompt\": \"four five\"}\n{\"prompt\": \"six\"}\n";
    REQUIRE(harness_write_file(path, body, strlen(body)) == 0);
    kv_config c = base();
    c.workload.requests = 7;
    c.workload.system_prompt_len = 5;
    snprintf(c.workload.prompts_file, sizeof c.workload.prompts_file, "%s", path);
    kv_workload *w = build(&c);
    REQUIRE(w);
    const char *want[] = {"one two three", "four five", "six"};
    int32_t ids[64];
    for (int i = 0; i < 7; i++) {
        const kv_workload_item *it = kv_workload_get(w, i);
        CHECK(it->text && !strcmp(it->text, want[i % 3]) && it->prompt_tokens == 0 && it->output_tokens >= 8);
        int n = kv_workload_tokens(w, i, tok_words, NULL, ids, 64, NULL);
        CHECK(n == 5 + 3 - i % 3);
        char t[64];
        CHECK(kv_workload_text(w, i, t, sizeof t) == (int)strlen(want[i % 3]) && !strcmp(t, want[i % 3]));
    }
    /* A prompt that fits exactly is fine; one id short of room is not. */
    kv_err err;
    CHECK(kv_workload_tokens(w, 0, tok_words, NULL, ids, 8, &err) == 8);
    CHECK(kv_workload_tokens(w, 0, tok_words, NULL, ids, 7, &err) == KV_ERR_RANGE);
    kv_workload_free(w);

    /* Errors name the file and the line. */
    body = "{\"prompt\": \"ok\"}\n{\"prompt\": nope}\n";
    REQUIRE(harness_write_file(path, body, strlen(body)) == 0);
    CHECK(kv_workload_build(&c, &err) == NULL);
    char where[600];
    snprintf(where, sizeof where, "%s:2:12: ", path);
    CHECKF(strstr(err.msg, where) != NULL, "%s", err.msg);
    REQUIRE(harness_write_file(path, "\n\n", 2) == 0);
    CHECK(kv_workload_build(&c, &err) == NULL && strstr(err.msg, "no prompts"));
    unlink(path);
    CHECK(kv_workload_build(&c, &err) == NULL && err.code == KV_ERR_IO && strstr(err.msg, "workload.prompts_file"));
}

/* ---- the driver ---- */

static kv_config driver_config(void) {
    kv_config c = base();
    harness_shared_copy(c.model.path, sizeof c.model.path, "models/stories260K.gguf");
    c.threads = 1;
    c.kv.memory = 4u << 20;
    c.kv.prefix_sharing = 0;
    c.scheduler.max_seq_len = 512;
    c.sampling.temperature = 0;
    c.workload.requests = 5;
    c.workload.prompt_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 12};
    c.workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 4};
    c.workload.ignore_eos = 1;
    return c;
}

/* An engine on c and a driver of c's workload on it (default options), or
 * NULL with the reason printed (nothing left open). OUT: *e. */
static kv_driver *driver_open(const kv_config *c, kv_engine **e) {
    *e = test_engine_new(c);
    if (!*e) return NULL;
    kv_err err;
    kv_driver *d = kv_driver_new(*e, c, NULL, &err);
    if (!d) {
        fprintf(stderr, "  driver: %s\n", err.msg);
        kv_engine_free(*e);
        *e = NULL;
    }
    return d;
}

static void test_driver_open_loop(void) {
    kv_config c = driver_config();
    c.workload.arrival = KV_ARRIVAL_POISSON;
    c.workload.rate = 10;
    kv_engine *e;
    kv_driver *d = driver_open(&c, &e);
    REQUIRE(d);
    kv_err err;
    const kv_workload *w = kv_driver_workload(d);
    CHECK(kv_driver_count(d) == 5 && !kv_driver_closed(d) && kv_driver_remaining(d) == 5);
    int bos = kv_tokenizer_add_bos(kv_engine_model(e)->tok) ? 1 : 0;
    kv_driver_sub sub[8];
    /* the first call starts the clock: what arrives at 0 is due */
    int due0 = 0;
    while (due0 < 5 && kv_workload_get(w, due0)->arrival_s <= 0) due0++;
    int n = kv_driver_submit_due(d, 1000, 0, sub, 8, &err);
    CHECKF(n == due0 && n >= 1, "%d due, %d expected", n, due0);
    CHECK(sub[0].index == 0 && sub[0].id > 0 && sub[0].prompt_tokens == 12 + bos && !sub[0].skipped);
    /* the next one waits for its arrival on the caller's clock */
    double wait = kv_driver_next_wait_ms(d, 1000);
    CHECK(fabs(wait - kv_workload_get(w, n)->arrival_s * 1000) < 1e-6 && wait > 0);
    CHECK(kv_driver_submit_due(d, 1000 + wait * 0.5, 0, sub, 8, &err) == 0);
    CHECK(kv_driver_submit_due(d, 1000 + wait, 0, sub, 8, &err) >= 1 && sub[0].index == n);
    /* max_in_flight holds back what is due; cap splits a batch */
    kv_driver_free(d);
    kv_driver_opts o = {.max_in_flight = 2};
    d = kv_driver_new(e, &c, &o, &err);
    REQUIRE(d);
    CHECK(kv_driver_submit_due(d, 0, 2, sub, 8, &err) == 0);
    CHECK(kv_driver_submit_due(d, 1e9, 0, sub, 1, &err) == 1 && sub[0].index == 0);
    CHECK(kv_driver_submit_due(d, 1e9, 0, sub, 8, &err) == 2 && sub[1].index == 2); /* in flight: 0 + 2 */
    CHECK(kv_driver_submit_due(d, 1e9, 1, sub, 8, &err) == 1 && sub[0].index == 3);
    CHECK(kv_driver_submit_due(d, 1e9, 0, sub, 8, &err) == 1 && sub[0].index == 4);
    CHECK(kv_driver_remaining(d) == 0 && kv_driver_next_wait_ms(d, 1e9) == -1);
    CHECK(kv_driver_submit_due(d, 2e9, 0, sub, 8, &err) == 0); /* runs dry without repeat */
    kv_driver_free(d);
    /* repeat: the workload starts over, its arrival times from then */
    o = (kv_driver_opts){.repeat = 1};
    d = kv_driver_new(e, &c, &o, &err);
    REQUIRE(d);
    CHECK(kv_driver_submit_due(d, 0, 0, sub, 8, &err) == due0);
    /* the rest, then item 0 again (it arrives at 0 of the new round), then
     * item 1 waits for its time in the new round */
    n = kv_driver_submit_due(d, 1e9, 0, sub, 8, &err);
    CHECKF(n == 5 - due0 + 1 && sub[0].index == due0 && sub[n - 1].index == 0, "%d records", n);
    CHECK(kv_driver_remaining(d) == 4 && kv_driver_next_wait_ms(d, 1e9) > 0);
    kv_driver_free(d);
    kv_engine_free(e);
}

static void test_driver_closed_loop(void) {
    kv_config c = driver_config();
    c.workload.arrival = KV_ARRIVAL_CLOSED;
    c.workload.concurrency = 2;
    kv_engine *e;
    kv_driver *d = driver_open(&c, &e);
    REQUIRE(d);
    kv_err err;
    kv_driver_sub sub[8];
    CHECK(kv_driver_closed(d) && kv_driver_next_wait_ms(d, 0) == -1);
    CHECK(kv_driver_submit_due(d, 0, 0, sub, 8, &err) == 2 && sub[0].index == 0 && sub[1].index == 1);
    CHECK(kv_driver_submit_due(d, 0, 2, sub, 8, &err) == 0);
    CHECK(kv_driver_submit_due(d, 0, 1, sub, 8, &err) == 1 && sub[0].index == 2);
    kv_driver_free(d);
    /* the TUI keeps one request per background session in flight, round and round */
    kv_driver_opts o = {.closed_slots = 3, .repeat = 1};
    d = kv_driver_new(e, &c, &o, &err);
    REQUIRE(d);
    CHECK(kv_driver_submit_due(d, 0, 0, sub, 8, &err) == 3);
    CHECK(kv_driver_submit_due(d, 0, 0, sub, 8, &err) == 3 && sub[1].index == 4 && sub[2].index == 0);
    kv_driver_free(d);
    kv_engine_free(e);
}

/* Runs e until idle; counts each request's tokens and records its session. */
static void run_collect(kv_engine *e, const int64_t *ids, int n, int *tokens, int *session) {
    kv_engine_run_until_idle(e);
    kv_event ev[64];
    int k;
    while ((k = kv_engine_poll(e, ev, 64)) > 0)
        for (int i = 0; i < k; i++)
            for (int j = 0; j < n; j++)
                if (ev[i].req == ids[j]) {
                    if (ev[i].type == KV_EVENT_TOKEN && ev[i].token >= 0) tokens[j]++;
                    session[j] = ev[i].session;
                }
}

static void test_driver_requests(void) {
    kv_config c = driver_config();
    c.workload.arrival = KV_ARRIVAL_BURST;
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    int bos = kv_tokenizer_add_bos(kv_engine_model(e)->tok) ? 1 : 0, np = 12 + bos;
    kv_err err;
    /* fit_ctx: the output cut to what the context leaves, or the item skipped */
    kv_driver_opts o = {.fit_ctx = np + 2, .session_base = 100, .n_sessions = 2, .pretokenize = 1};
    kv_driver *d = kv_driver_new(e, &c, &o, &err);
    REQUIRE(d);
    kv_driver_sub sub[8];
    REQUIRE(kv_driver_submit_due(d, 0, 0, sub, 8, &err) == 5);
    int64_t ids[5];
    int tokens[5] = {0}, session[5] = {0};
    for (int i = 0; i < 5; i++) {
        CHECK(sub[i].index == i && sub[i].id > 0 && sub[i].prompt_tokens == np);
        ids[i] = sub[i].id;
    }
    run_collect(e, ids, 5, tokens, session);
    for (int i = 0; i < 5; i++) CHECKF(tokens[i] == 2 && session[i] == 100 + i % 2, "%d: %d tokens, session %d", i,
                                       tokens[i], session[i]);
    kv_driver_free(d);
    o = (kv_driver_opts){.fit_ctx = np};
    d = kv_driver_new(e, &c, &o, &err);
    REQUIRE(d);
    CHECK(kv_driver_submit_due(d, 0, 0, sub, 8, &err) == 5 && sub[0].skipped && sub[0].id == 0 && !sub[0].reason[0]);
    kv_driver_free(d);
    /* without fit_ctx the engine refuses what cannot fit, and says why */
    c.workload.output_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 500};
    d = kv_driver_new(e, &c, NULL, &err);
    REQUIRE(d);
    CHECK(kv_driver_submit_due(d, 0, 0, sub, 8, &err) == 5 && sub[0].id == 0 && !sub[0].skipped &&
          strstr(sub[0].reason, "context"));
    kv_driver_free(d);
    kv_engine_free(e);
}

/* The one tokenization rule: BOS as the vocabulary says, then the raw text;
 * "</s>" in a prompt is those characters, not the end-of-sequence token. */
static void test_driver_tokenization(void) {
    char path[512];
    snprintf(path, sizeof path, "%s", harness_tmp_path("workload", "driver", ".jsonl"));
    const char *body = "{\"prompt\": \"hi </s> there\"}\n";
    REQUIRE(harness_write_file(path, body, strlen(body)) == 0);
    kv_config c = driver_config();
    c.workload.requests = 1;
    snprintf(c.workload.prompts_file, sizeof c.workload.prompts_file, "%s", path);
    kv_engine *e;
    kv_driver *d = driver_open(&c, &e);
    REQUIRE(d);
    kv_err err;
    const kv_tokenizer *tok = kv_engine_model(e)->tok;
    int32_t got[64], raw[64], special[64];
    int n = kv_driver_prompt(kv_driver_workload(d), 0, tok, got, 64, &err);
    int nr = kv_tokenizer_encode(tok, "hi </s> there", 13, kv_tokenizer_add_bos(tok), 0, raw, 64, &err);
    int ns = kv_tokenizer_encode(tok, "hi </s> there", 13, kv_tokenizer_add_bos(tok), 1, special, 64, &err);
    CHECK(n > 0 && n == nr && !memcmp(got, raw, (size_t)n * sizeof *got));
    CHECK(ns != nr); /* the vocabulary does have </s>: the rule matters */
    for (int i = 0; i < n; i++) CHECK(got[i] != kv_tokenizer_eos(tok));
    CHECK(kv_driver_prompt_bound(kv_driver_workload(d), 0, tok) >= n);
    CHECK(kv_driver_prompt(kv_driver_workload(d), 0, tok, got, n - 1, &err) == KV_ERR_RANGE);
    kv_driver_free(d);
    kv_engine_free(e);
    unlink(path);
}

TEST_MAIN(T(test_determinism), T(test_streams_independent), T(test_distributions), T(test_arrivals),
          T(test_system_prompt_use), T(test_tokens_exact), T(test_prompts_parse), T(test_prompts_file_workload),
          T(test_driver_open_loop), T(test_driver_closed_loop), T(test_driver_requests), T(test_driver_tokenization))
