/* workload.c - deterministic synthetic request streams (arrivals, lengths,
 * system prompt use, prompt text) and the JSONL prompts file reader. No
 * tokenizer lives here: lengths are token counts, and a tokenize callback
 * turns generated text into exactly the drawn number of ids. */
#include "workload.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/file.h"
#include "json.h"
#include "sampler.h"

#define PROMPTS_MAX_BYTES (1ull << 30) /* refuse prompts files over 1 GiB */

struct kv_workload {
    int n;                   /* items */
    kv_workload_item *items; /* (n) */
    int concurrency;         /* closed loop: in flight; 0 otherwise */
    uint64_t seed;           /* workload.seed */
    char *system_text;       /* the shared system prompt's text ("" when none) */
    char **prompts;          /* (n_prompts) prompts_file texts, or NULL */
    int n_prompts;
};

/* ---- random numbers: kv_rng (sampler.h), one stream per aspect ---- */

typedef kv_rng rng;

/* Stream `stream` of seed: independent sequences for independent aspects. */
static void rng_seed(rng *r, uint64_t seed, uint64_t stream) {
    kv_rng_seed(r, seed ^ (stream * 0xD1B54A32D192ED03ull));
}

#define rng_next kv_rng_next
#define rng_uniform kv_rng_uniform
#define splitmix64 kv_splitmix64

/* Uniform integer in [0, n) without modulo bias. */
static uint64_t rng_below(rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r);
    while (x >= limit);
    return x % n;
}

/* Standard normal by Box-Muller (one draw per call keeps streams simple). */
static double rng_normal(rng *r) {
    double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log is finite */
    double u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint64_t text_seed_of(uint64_t seed, int i) {
    uint64_t x = seed ^ 0x7E57u;
    splitmix64(&x);
    x ^= (uint64_t)(uint32_t)i * 0x9E3779B97F4A7C15ull;
    return splitmix64(&x);
}

/* Streams of one workload; fixed numbers so they never move. */
enum { STREAM_ARRIVAL = 1, STREAM_PROMPT = 2, STREAM_OUTPUT = 3, STREAM_SYSTEM = 4 };
/* the request classes' streams (new streams: the ones above draw as before) */
enum { STREAM_CLASS = 5, STREAM_SHORT_PROMPT = 6, STREAM_SHORT_OUTPUT = 7 };
/* The system prompt text does not depend on workload.seed: the same
 * system prompt in every run makes prefix-sharing numbers comparable. */
#define SYSTEM_TEXT_SEED 0x5359535445ull
#define SYSTEM_TEXT_OPENING "You are a helpful assistant. Answer the questions of the user clearly and briefly."

/* One draw of a token length from d; always >= 1. */
static int draw_len(const kv_dist *d, rng *r) {
    double v;
    switch (d->kind) {
    case KV_DIST_UNIFORM: {
        double lo = ceil(d->min), hi = floor(d->max);
        v = lo + (double)rng_below(r, (uint64_t)(hi - lo) + 1);
        break;
    }
    case KV_DIST_LOGNORMAL: {
        /* mean is the distribution's mean: mu = log(mean) - sigma^2 / 2 */
        double mu = log(d->mean) - 0.5 * d->sigma * d->sigma;
        v = nearbyint(exp(mu + d->sigma * rng_normal(r)));
        v = fmin(fmax(v, ceil(d->min)), floor(d->max));
        break;
    }
    default: v = nearbyint(d->value); break;
    }
    return v < 1 ? 1 : v > 1e9 ? 1000000000 : (int)v;
}

/* ---- synthetic text ---- */

static const char *const nouns[] = {
    "garden", "river", "teacher", "city", "window", "engine", "forest", "letter", "village", "doctor",
    "mountain", "kitchen", "student", "ocean", "bridge", "market", "painter", "library", "winter", "station",
    "farmer", "island", "computer", "story", "journey", "harbor", "castle", "meadow", "captain", "museum",
    "question", "problem", "answer", "morning", "evening", "child", "family", "friend", "neighbor", "machine",
    "road", "valley", "lamp", "table", "door", "book", "song", "storm", "cloud", "stone",
    "bird", "horse", "dog", "cat", "tree", "flower", "field", "house", "school", "office",
    "report", "idea", "plan", "system", "model", "network", "signal", "paper", "picture", "voice",
    "ship", "train", "street", "corner", "festival", "season", "recipe", "bakery", "clock", "mirror",
};
static const char *const verbs[] = {
    "found", "carried", "watched", "opened", "built", "followed", "painted", "visited", "described", "answered",
    "remembered", "moved", "changed", "crossed", "explained", "noticed", "repaired", "measured", "wrote", "read",
    "helped", "covered", "reached", "closed", "filled", "lifted", "greeted", "studied", "planted", "collected",
    "shared", "checked", "counted", "cleaned", "praised", "sold", "bought", "tested", "drew", "heard",
};
static const char *const adjectives[] = {
    "quiet", "bright", "old", "small", "large", "careful", "green", "cold", "warm", "happy",
    "busy", "narrow", "ancient", "gentle", "strange", "simple", "heavy", "clever", "yellow", "distant",
    "early", "late", "friendly", "patient", "sudden", "wooden", "silver", "curious", "famous", "empty",
};
static const char *const preps[] = {"near", "behind", "across", "under", "beside", "through", "over", "around",
                                    "toward", "inside"};
static const char *const dets[] = {"the", "a", "every", "that", "one", "our"};
static const char *const links[] = {"and", "while", "because", "so", "but", "after"};

#define PICK(r, list) (list[rng_below(r, KV_ARRAY_LEN(list))])

typedef struct sbuf {
    char *s;
    size_t len, cap;
    int nomem;
} sbuf;

static void sb_add(sbuf *b, const char *s, int capital) {
    size_t n = strlen(s);
    if (b->nomem) return;
    if (b->len + n + 2 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + n + 2) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->nomem = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    if (capital && b->s[b->len] >= 'a' && b->s[b->len] <= 'z') b->s[b->len] -= 'a' - 'A';
    b->len += n;
    b->s[b->len] = '\0';
}

/* One clause: "the quiet garden carried a letter across the river". */
static int clause(sbuf *b, rng *r, int capital) {
    int words = 0;
    sb_add(b, PICK(r, dets), capital), words++;
    if (rng_below(r, 2)) sb_add(b, " ", 0), sb_add(b, PICK(r, adjectives), 0), words++;
    sb_add(b, " ", 0), sb_add(b, PICK(r, nouns), 0), words++;
    sb_add(b, " ", 0), sb_add(b, PICK(r, verbs), 0), words++;
    sb_add(b, " ", 0), sb_add(b, PICK(r, dets), 0), words++;
    if (rng_below(r, 3) == 0) sb_add(b, " ", 0), sb_add(b, PICK(r, adjectives), 0), words++;
    sb_add(b, " ", 0), sb_add(b, PICK(r, nouns), 0), words++;
    if (rng_below(r, 2)) {
        sb_add(b, " ", 0), sb_add(b, PICK(r, preps), 0), words++;
        sb_add(b, " the ", 0), sb_add(b, PICK(r, nouns), 0), words += 2;
    }
    return words;
}

/* Appends whole sentences drawn from r until at least `words` words. */
static void gen_text(sbuf *b, rng *r, int words) {
    int n = 0;
    while (n < words && !b->nomem) {
        if (b->len) sb_add(b, " ", 0);
        n += clause(b, r, 1);
        if (rng_below(r, 3) == 0) {
            sb_add(b, rng_below(r, 2) ? ", " : " ", 0);
            sb_add(b, PICK(r, links), 0), n++;
            sb_add(b, " ", 0);
            n += clause(b, r, 0);
        }
        sb_add(b, rng_below(r, 8) ? "." : "?", 0);
    }
}

/* Text from seed of at least `words` words after `opening` (may be NULL). */
static int make_text(sbuf *b, uint64_t seed, const char *opening, int words) {
    rng r;
    rng_seed(&r, seed, 0);
    b->len = 0;
    if (b->s) b->s[0] = '\0';
    if (opening) sb_add(b, opening, 0);
    gen_text(b, &r, words);
    if (!b->s) sb_add(b, "", 0);
    return b->nomem ? KV_ERR_NOMEM : 0;
}

/* Exactly n ids of the text of (seed, opening). Starts from a guess of
 * 0.75 words per token (BPE English), then grows the text by the measured
 * ratio; each round retokenizes the whole text, so the ids are those of
 * one text, cut. */
static int exact_tokens(uint64_t seed, const char *opening, int n, kv_tokenize_fn tok, void *ctx, int32_t *out,
                        int cap, kv_err *err) {
    if (n < 0 || !tok || (!out && n > 0)) return kv_err_set(err, KV_ERR_INVAL, "workload tokens: bad arguments");
    if (cap < n) return kv_err_set(err, KV_ERR_RANGE, "workload tokens: %d ids do not fit in %d", n, cap);
    if (n == 0) return 0;
    sbuf b = {0};
    double words = n * 0.75 + 4;
    int rc, got = 0;
    for (int round = 0; round < 40 && words <= 16.0 * n + 1024; round++) {
        if (make_text(&b, seed, opening, (int)words)) {
            rc = kv_err_set(err, KV_ERR_NOMEM, "workload tokens: out of memory");
            goto done;
        }
        got = tok(ctx, b.s, out, n);
        if (got < 0) {
            rc = kv_err_set(err, KV_ERR_FORMAT, "workload tokens: the tokenizer failed (%d)", got);
            goto done;
        }
        if (got >= n) {
            rc = n;
            goto done;
        }
        double ratio = got > 0 ? (double)n / got : 4.0;
        words = words * (ratio > 1.1 ? ratio * 1.1 : 1.2) + 4;
    }
    rc = kv_err_set(err, KV_ERR_FORMAT, "workload tokens: the tokenizer made only %d ids of the %d wanted", got, n);
done:
    free(b.s);
    return rc;
}

int kv_workload_exact_tokens(uint64_t text_seed, int n, kv_tokenize_fn tok, void *ctx, int32_t *out, int cap,
                             kv_err *err) {
    kv_err_clear(err);
    return exact_tokens(text_seed, NULL, n, tok, ctx, out, cap, err);
}

/* ---- prompts file ---- */

void kv_workload_free_prompts(char **prompts, int n) {
    if (!prompts) return;
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
}

int kv_workload_parse_prompts(const char *buf, size_t len, const char *name, char ***out, int *n, kv_err *err) {
    if ((!buf && len) || !out || !n) return kv_err_set(err, KV_ERR_INVAL, "kv_workload_parse_prompts: bad arguments");
    if (!name) name = "<prompts>";
    char **list = NULL;
    int count = 0, cap = 0, rc = 0;
    size_t pos = 0;
    if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3)) pos = 3;
    for (int line = 1; pos < len; line++) {
        const char *s = buf + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t l = nl ? (size_t)(nl - s) : len - pos;
        pos += l + (nl ? 1 : 0);
        size_t body = l;
        if (body && s[body - 1] == '\r') body--;
        size_t k = 0;
        while (k < body && (s[k] == ' ' || s[k] == '\t')) k++;
        if (k == body) continue; /* blank line */
        kv_json *v = kv_json_parse_named(s, body, name, line, err);
        if (!v) {
            rc = err ? err->code : KV_ERR_FORMAT;
            if (!rc) rc = KV_ERR_FORMAT;
            goto fail;
        }
        size_t plen;
        const char *p = kv_json_str(kv_json_get(v, "prompt"), &plen);
        if (kv_json_type_of(v) != KV_JSON_OBJECT) rc = kv_err_set(err, KV_ERR_FORMAT, "%s:%d: expected an object {\"prompt\": \"...\"}", name, line);
        else if (!p) rc = kv_err_set(err, KV_ERR_FORMAT, "%s:%d: no \"prompt\" string member", name, line);
        else if (strlen(p) != plen) rc = kv_err_set(err, KV_ERR_FORMAT, "%s:%d: prompt contains a NUL character", name, line);
        else if (plen == 0) rc = kv_err_set(err, KV_ERR_FORMAT, "%s:%d: empty prompt", name, line);
        if (rc) {
            kv_json_free(v);
            goto fail;
        }
        if (count == cap) {
            int nc = cap ? cap * 2 : 16;
            char **nl2 = realloc(list, (size_t)nc * sizeof *nl2);
            if (!nl2) {
                kv_json_free(v);
                rc = kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", name);
                goto fail;
            }
            list = nl2;
            cap = nc;
        }
        list[count] = malloc(plen + 1);
        if (!list[count]) {
            kv_json_free(v);
            rc = kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", name);
            goto fail;
        }
        memcpy(list[count++], p, plen + 1);
        kv_json_free(v);
        if (count == INT32_MAX) break;
    }
    *out = list;
    *n = count;
    kv_err_clear(err);
    return 0;
fail:
    kv_workload_free_prompts(list, count);
    return rc;
}

static int read_prompts_file(const char *path, char ***out, int *n, kv_err *err) {
    char *buf;
    size_t len;
    kv_err ferr;
    int rc = kv_read_file(path, PROMPTS_MAX_BYTES, &buf, &len, &ferr);
    if (rc == KV_ERR_FORMAT) return kv_err_set(err, rc, "%s: larger than 1 GiB", path);
    if (rc == KV_ERR_IO) return kv_err_set(err, rc, "workload.prompts_file: %.480s", ferr.msg);
    if (rc) return kv_err_set(err, rc, "%s", ferr.msg);
    rc = kv_workload_parse_prompts(buf, len, path, out, n, err);
    if (!rc && *n == 0) {
        kv_workload_free_prompts(*out, 0);
        rc = kv_err_set(err, KV_ERR_FORMAT, "%s: no prompts in the file", path);
    }
    free(buf);
    return rc;
}

/* ---- building ---- */

static int check_workload(const kv_config *c, kv_err *err) {
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    for (int i = 0; i < n; i++)
        if (!strncmp(keys[i].path, "workload.", 9) && kv_config_key_check(&keys[i], c, err)) return KV_ERR_INVAL;
    if (c->workload.arrival == KV_ARRIVAL_POISSON && !(c->workload.rate > 0))
        return kv_err_set(err, KV_ERR_INVAL, "workload.rate: must be > 0 for poisson arrivals");
    return 0;
}

kv_workload *kv_workload_build(const kv_config *c, kv_err *err) {
    if (!c) {
        kv_err_set(err, KV_ERR_INVAL, "kv_workload_build: NULL config");
        return NULL;
    }
    if (check_workload(c, err)) return NULL;
    kv_workload *w = calloc(1, sizeof *w);
    if (!w) goto nomem;
    const int n = c->workload.requests;
    w->n = n;
    w->seed = c->workload.seed;
    w->concurrency = c->workload.arrival == KV_ARRIVAL_CLOSED ? c->workload.concurrency : 0;
    if (n > 0 && !(w->items = calloc((size_t)n, sizeof *w->items))) goto nomem;
    sbuf sb = {0};
    if (c->workload.system_prompt_len > 0)
        make_text(&sb, SYSTEM_TEXT_SEED, SYSTEM_TEXT_OPENING, (int)(c->workload.system_prompt_len * 0.75) + 1);
    else
        sb_add(&sb, "", 0);
    w->system_text = sb.s;
    if (sb.nomem) goto nomem;
    if (c->workload.prompts_file[0] &&
        read_prompts_file(c->workload.prompts_file, &w->prompts, &w->n_prompts, err))
        goto fail;

    rng arr, pl, ol, sys, cl, spl, sol;
    rng_seed(&cl, c->workload.seed, STREAM_CLASS);
    rng_seed(&spl, c->workload.seed, STREAM_SHORT_PROMPT);
    rng_seed(&sol, c->workload.seed, STREAM_SHORT_OUTPUT);
    rng_seed(&arr, c->workload.seed, STREAM_ARRIVAL);
    rng_seed(&pl, c->workload.seed, STREAM_PROMPT);
    rng_seed(&ol, c->workload.seed, STREAM_OUTPUT);
    rng_seed(&sys, c->workload.seed, STREAM_SYSTEM);
    double t = 0;
    for (int i = 0; i < n; i++) {
        kv_workload_item *it = &w->items[i];
        /* Every stream is drawn for every item, used or not, so items stay
         * aligned when a setting changes. */
        double gap = -log(1.0 - rng_uniform(&arr));
        int plen = draw_len(&c->workload.prompt_len, &pl);
        int olen = draw_len(&c->workload.output_len, &ol);
        double u = rng_uniform(&sys);
        double uc = rng_uniform(&cl);
        int splen = draw_len(&c->workload.short_prompt_len, &spl);
        int solen = draw_len(&c->workload.short_output_len, &sol);
        if (uc < c->workload.short_fraction) {
            it->cls = KV_WORKLOAD_SHORT;
            it->priority = c->workload.short_priority;
            plen = splen;
            olen = solen;
        }
        switch (c->workload.arrival) {
        case KV_ARRIVAL_POISSON:
            if (i > 0) t += gap / c->workload.rate;
            it->arrival_s = t;
            break;
        case KV_ARRIVAL_BURST: it->arrival_s = 0; break;
        case KV_ARRIVAL_CLOSED:
            it->arrival_s = 0;
            it->after_slot = i >= c->workload.concurrency;
            break;
        }
        it->output_tokens = olen;
        it->uses_system = c->workload.system_prompt_len > 0 && u < c->workload.system_prompt_fraction;
        it->system_tokens = it->uses_system ? c->workload.system_prompt_len : 0;
        if (w->prompts) {
            it->text = w->prompts[i % w->n_prompts];
            it->prompt_tokens = 0;
        } else {
            it->prompt_tokens = plen;
        }
    }
    kv_err_clear(err);
    return w;
nomem:
    kv_err_set(err, KV_ERR_NOMEM, "workload: out of memory");
fail:
    kv_workload_free(w);
    return NULL;
}

const char *kv_workload_class_name(int cls) { return cls == KV_WORKLOAD_SHORT ? "short" : "long"; }

void kv_workload_free(kv_workload *w) {
    if (!w) return;
    kv_workload_free_prompts(w->prompts, w->n_prompts);
    free(w->system_text);
    free(w->items);
    free(w);
}

int kv_workload_count(const kv_workload *w) { return w ? w->n : 0; }

const kv_workload_item *kv_workload_get(const kv_workload *w, int i) {
    return w && i >= 0 && i < w->n ? &w->items[i] : NULL;
}

int kv_workload_concurrency(const kv_workload *w) { return w ? w->concurrency : 0; }

const char *kv_workload_system_text(const kv_workload *w) {
    return w && w->system_text ? w->system_text : "";
}

int kv_workload_tokens(const kv_workload *w, int i, kv_tokenize_fn tok, void *ctx, int32_t *out, int cap,
                       kv_err *err) {
    const kv_workload_item *it = kv_workload_get(w, i);
    if (!it) return kv_err_set(err, KV_ERR_RANGE, "workload: no request %d", i);
    if (!tok || !out || cap < 0) return kv_err_set(err, KV_ERR_INVAL, "kv_workload_tokens: bad arguments");
    kv_err_clear(err);
    int ns = it->system_tokens;
    if (ns > cap) return kv_err_set(err, KV_ERR_RANGE, "workload: request %d: system prompt (%d) does not fit in %d", i, ns, cap);
    if (ns > 0) {
        int rc = exact_tokens(SYSTEM_TEXT_SEED, SYSTEM_TEXT_OPENING, ns, tok, ctx, out, cap, err);
        if (rc < 0) return rc;
    }
    if (!it->text) {
        int rc = exact_tokens(text_seed_of(w->seed, i), NULL, it->prompt_tokens, tok, ctx, out + ns, cap - ns, err);
        if (rc == KV_ERR_RANGE)
            return kv_err_set(err, KV_ERR_RANGE, "workload: request %d: %d + %d prompt ids do not fit in %d", i, ns,
                              it->prompt_tokens, cap);
        return rc < 0 ? rc : ns + rc;
    }
    /* A file prompt: tokenize into room for one id more than fits, to tell
     * "fits exactly" from "was cut". */
    int room = cap - ns;
    int32_t *tmp = malloc(((size_t)room + 1) * sizeof *tmp);
    if (!tmp) return kv_err_set(err, KV_ERR_NOMEM, "workload: out of memory");
    int got = tok(ctx, it->text, tmp, room + 1);
    int rc;
    if (got < 0) rc = kv_err_set(err, KV_ERR_FORMAT, "workload: request %d: the tokenizer failed (%d)", i, got);
    else if (got > room) rc = kv_err_set(err, KV_ERR_RANGE, "workload: request %d: the prompt does not fit in %d ids", i, cap);
    else {
        memcpy(out + ns, tmp, (size_t)got * sizeof *tmp);
        rc = ns + got;
    }
    free(tmp);
    return rc;
}

int kv_workload_text(const kv_workload *w, int i, char *buf, size_t cap) {
    const kv_workload_item *it = kv_workload_get(w, i);
    if (!it || (!buf && cap)) return KV_ERR_INVAL;
    if (it->text) return snprintf(buf, cap, "%s", it->text);
    sbuf b = {0};
    int rc = make_text(&b, text_seed_of(w->seed, i), NULL, (int)(it->prompt_tokens * 0.75) + 1);
    if (!rc) rc = snprintf(buf, cap, "%s", b.s);
    free(b.s);
    return rc;
}
