/* sampler.c - logits -> token. The pipeline (repetition penalty, temperature,
 * top-k, top-p, min-p) produces an explicit distribution so that plain
 * sampling and speculative rejection sampling draw from the same thing. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t kv_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kv_rng_seed(kv_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = kv_splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kv_rng_next(kv_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kv_rng_uniform(kv_rng *r) { return (double)(kv_rng_next(r) >> 11) * 0x1.0p-53; }

int kv_sampling_validate(const kv_sampling *p, kv_err *err) {
    if (!(p->temperature >= 0) || p->temperature > 100)
        return kv_err_set(err, KV_ERR_INVAL, "sampling.temperature must be in [0, 100], got %g", p->temperature);
    if (p->top_k < 0) return kv_err_set(err, KV_ERR_INVAL, "sampling.top_k must be >= 0, got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return kv_err_set(err, KV_ERR_INVAL, "sampling.top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p < 1))
        return kv_err_set(err, KV_ERR_INVAL, "sampling.min_p must be in [0, 1), got %g", p->min_p);
    if (!(p->repeat_penalty > 0 && p->repeat_penalty <= 10))
        return kv_err_set(err, KV_ERR_INVAL, "sampling.repeat_penalty must be in (0, 10], got %g", p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return kv_err_set(err, KV_ERR_INVAL, "sampling.repeat_last_n must be >= 0, got %d", p->repeat_last_n);
    return 0;
}

/* The first index of the largest value; NaNs are never taken (a NaN at 0
 * stays the answer). Blocks of 64 are first asked whether any value beats
 * the best so far (a compare-and-or loop of fixed length, which compilers
 * vectorise at -O2) and scanned only then: a greedy step runs this over
 * the whole vocabulary of every sequence (64 x 32,000 values a step at 64
 * concurrent), and the plain scan was ~1.5% of such a step. */
int32_t kv_argmax(const float *logits, int n) {
    int32_t best = 0;
    float bv = logits[0];
    int i = 1;
    for (; i + 64 <= n; i += 64) {
        int any = 0;
        for (int j = 0; j < 64; j++) any |= logits[i + j] > bv;
        if (!any) continue;
        for (int j = 0; j < 64; j++)
            if (logits[i + j] > bv) {
                bv = logits[i + j];
                best = i + j;
            }
    }
    for (; i < n; i++)
        if (logits[i] > bv) {
            bv = logits[i];
            best = i;
        }
    return best;
}

typedef struct cand {
    float v;   /* scaled logit */
    int32_t i; /* token id */
} cand;

struct kv_sampler {
    int n_vocab;
    float *work;   /* (n_vocab) penalised / scaled logits, then probabilities */
    cand *cand;     /* (n_vocab) candidates, sorted by probability */
    float *probs;  /* (n_vocab) distribution for sample() */
};

kv_sampler *kv_sampler_new(int n_vocab) {
    if (n_vocab <= 0) return NULL;
    kv_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_vocab = n_vocab;
    s->work = malloc((size_t)n_vocab * sizeof(float));
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->probs = malloc((size_t)n_vocab * sizeof(float));
    if (!s->work || !s->cand || !s->probs) {
        kv_sampler_free(s);
        return NULL;
    }
    return s;
}

void kv_sampler_free(kv_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->cand);
    free(s->probs);
    free(s);
}

/* CTRL-style repetition penalty over the last repeat_last_n tokens: positive
 * logits divided, negative multiplied; each distinct token once. */
static void apply_penalty(float *w, int n, const kv_sampling *p, const int32_t *hist, int n_hist) {
    if (p->repeat_penalty == 1.0f || p->repeat_last_n == 0 || !hist) return;
    int start = n_hist > p->repeat_last_n ? n_hist - p->repeat_last_n : 0;
    for (int i = start; i < n_hist; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= n) continue;
        int seen = 0;
        for (int j = start; j < i; j++)
            if (hist[j] == t) {
                seen = 1;
                break;
            }
        if (seen) continue;
        w[t] = w[t] > 0 ? w[t] / p->repeat_penalty : w[t] * p->repeat_penalty;
    }
}

/* Descending by value, ascending id on ties (deterministic). */
static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Moves the k best of c[0..m) (cmp_cand's order, a total order: ids are
 * distinct) to c[0..k), in no particular order, k < m: a heap of the k best
 * so far with the worst of them at its root, so most candidates cost one
 * comparison (O(m log k) at worst, where a full sort of a 32,000-token
 * vocabulary cost more than a decode step's matmuls on a small model). The
 * set is the sorted prefix's, so sorting it after gives the same order. */
static void select_best(cand *c, int m, int k) {
    for (int i = 1; i < k; i++) /* heapify upward: parent worse than child */
        for (int j = i; j > 0 && cmp_cand(&c[j], &c[(j - 1) / 2]) > 0; j = (j - 1) / 2) {
            const cand t = c[j];
            c[j] = c[(j - 1) / 2];
            c[(j - 1) / 2] = t;
        }
    for (int i = k; i < m; i++) {
        if (cmp_cand(&c[i], &c[0]) >= 0) continue; /* not better than the worst kept */
        c[0] = c[i];
        for (int j = 0;;) { /* sift the new root down to its place */
            int w = j;
            const int l = 2 * j + 1, r = l + 1;
            if (l < k && cmp_cand(&c[l], &c[w]) > 0) w = l;
            if (r < k && cmp_cand(&c[r], &c[w]) > 0) w = r;
            if (w == j) break;
            const cand t = c[j];
            c[j] = c[w];
            c[w] = t;
            j = w;
        }
    }
}

void kv_sampler_dist(kv_sampler *s, const kv_sampling *p, const float *logits, const int32_t *history,
                     int n_history, float *probs) {
    const int n = s->n_vocab;
    float *w = s->work;
    memcpy(w, logits, (size_t)n * sizeof(float));
    apply_penalty(w, n, p, history, n_history);
    memset(probs, 0, (size_t)n * sizeof(float));
    if (p->temperature <= 0) {
        probs[kv_argmax(w, n)] = 1.0f;
        return;
    }
    float mx = -FLT_MAX;
    for (int i = 0; i < n; i++) {
        w[i] /= p->temperature;
        if (w[i] > mx) mx = w[i];
    }
    /* Candidates: tokens within exp(-30) of the best one. The rest hold less
     * than n * 1e-13 of the mass together, so dropping them changes no
     * probability visibly but keeps the sort short. */
    cand *c = s->cand;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (w[i] >= mx - 30.0f) c[m++] = (cand){w[i], i};
    if (p->top_k > 0 && p->top_k < m) {
        select_best(c, m, p->top_k);
        m = p->top_k;
    }
    qsort(c, (size_t)m, sizeof *c, cmp_cand);
    double sum = 0;
    for (int i = 0; i < m; i++) sum += exp((double)(c[i].v - mx));
    /* top-p: the smallest prefix with mass >= top_p; min-p: drop tokens
     * below min_p times the most likely one */
    double cum = 0;
    int keep = m;
    for (int i = 0; i < m; i++) {
        double e = exp((double)(c[i].v - mx));
        if (i > 0 && p->min_p > 0 && e < p->min_p) {
            keep = i;
            break;
        }
        cum += e / sum;
        if (cum >= p->top_p) {
            keep = i + 1;
            break;
        }
    }
    double z = 0;
    for (int i = 0; i < keep; i++) z += exp((double)(c[i].v - mx));
    for (int i = 0; i < keep; i++) probs[c[i].i] = (float)(exp((double)(c[i].v - mx)) / z);
}

float kv_sampler_logprobs(const float *logits, int n_vocab, int32_t token, int n_top, int32_t *top_token,
                          float *top_logprob) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    /* expf of values <= 0, summed in double: each term is within 1 ulp of
     * float, so log Z is good to ~1e-7, and expf is several times cheaper
     * than exp over a 50k vocabulary */
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += (double)expf(logits[i] - mx);
    const double log_z = (double)mx + log(sum);
    /* the n_top best, kept sorted; a strictly greater value moves in, so on
     * ties the lower id (seen first) stays ahead */
    int m = 0;
    n_top = KV_MAX(0, KV_MIN(n_top, n_vocab));
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        float v = logits[i];
        if (m == n_top && !(v > logits[top_token[m - 1]])) continue;
        int at = m < n_top ? m++ : m - 1;
        while (at > 0 && v > logits[top_token[at - 1]]) {
            top_token[at] = top_token[at - 1];
            at--;
        }
        top_token[at] = i;
    }
    for (int i = 0; i < m; i++) top_logprob[i] = (float)((double)logits[top_token[i]] - log_z);
    return (float)((double)logits[token] - log_z);
}

int32_t kv_sample_from(const float *probs, int n, kv_rng *rng) {
    double u = kv_rng_uniform(rng), cum = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (probs[i] <= 0) continue;
        cum += probs[i];
        last = i;
        if (u < cum) return i;
    }
    return last >= 0 ? last : 0; /* rounding left u above the total */
}

int kv_sampling_plain_greedy(const kv_sampling *p) {
    return p->temperature <= 0 && (p->repeat_penalty == 1.0f || p->repeat_last_n == 0);
}

int32_t kv_sampler_sample(kv_sampler *s, const kv_sampling *p, const float *logits, const int32_t *history,
                          int n_history, kv_rng *rng) {
    if (p->temperature <= 0) {
        if (kv_sampling_plain_greedy(p)) return kv_argmax(logits, s->n_vocab);
        memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(float));
        apply_penalty(s->work, s->n_vocab, p, history, n_history);
        return kv_argmax(s->work, s->n_vocab);
    }
    kv_sampler_dist(s, p, logits, history, n_history, s->probs);
    return kv_sample_from(s->probs, s->n_vocab, rng);
}
