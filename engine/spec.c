/* spec.c - speculative decoding: drafting (draft model with its own paged
 * cache, the target's first layers, or n-gram prompt lookup), batched over
 * every speculating sequence of a step; verification by longest matching
 * prefix (greedy) or rejection sampling (sampled); rollback of the draft
 * cache; and the per-sequence adaptive draft length. */
#include "spec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"
#include "forward.h"

enum {
    BACKOFF_MIN = 8,   /* plain-decode steps after the first fallback */
    BACKOFF_MAX = 256, /* longest fallback */
    PROBE_OK = 4       /* verifies above min_acceptance that end probation */
};
static const float EWMA_ALPHA = 0.3f; /* weight of the newest verify */
static const float EWMA_START = 0.7f; /* optimistic start: two bad verifies fall back */
static const double K_ALL_OK = 0.25;  /* keep k where ewma^k (all accepted) >= this */

struct kv_spec {
    kv_spec_method method;
    kv_spec_ctl_params ctl;
    int ngram_n;
    int draft_layers;        /* self: target layers the draft runs */
    const kv_model *target;  /* borrowed */
    kv_backend *be;          /* borrowed */
    kv_cache *tcache;        /* borrowed: self drafts write its first layers */
    int n_vocab;
    int max_seqs;            /* sequences per draft pass */
    int max_tokens;          /* rows per draft pass (catch-up included) */
    int budget;              /* plan: catch-up rows left this step */

    kv_model *dmodel;        /* draft_model: owned */
    kv_cache *dcache;        /* draft_model: owned */
    uint64_t dcache_bytes;
    kv_forward *fwd;         /* the draft's forward (draft model, or the target for self) */
    float *logits;           /* (max_seqs, n_vocab) */

    /* one draft pass as a batch */
    int32_t *tok, *pos, *seq, *slot; /* (max_tokens) */
    const int32_t **tables;  /* (max_seqs) block tables */
    int32_t *rows;           /* (max_seqs) logit rows */
    int *item;               /* (max_seqs) item index of each batch sequence */
    int *kk;                 /* (max_seqs) drafts of each batch sequence this step */
    /* self drafts under sliding-window release: the local layers' slots and tables */
    kv_pages *lpages;        /* NULL: none (the target cache keeps every layer together) */
    int32_t *lslot;          /* (max_tokens) */
    const int32_t **ltables; /* (max_seqs) */
    int32_t *ltab;           /* the tables, back to back */
    int ltab_cap;
};

/* ---- building blocks ---- */

int kv_spec_ngram(const int32_t *tokens, int len, int ngram_n, int k, int32_t *out) {
    if (!tokens || !out || len < 2 || k <= 0) return 0;
    for (int n = KV_MIN(ngram_n, len - 1); n >= 1; n--) {
        const int32_t *pat = tokens + len - n;
        /* the most recent earlier occurrence that has a token after it */
        for (int i = len - n - 1; i >= 0; i--) {
            if (tokens[i] != pat[0] || memcmp(tokens + i, pat, (size_t)n * sizeof *pat) != 0) continue;
            int from = i + n, m = KV_MIN(k, len - from);
            memcpy(out, tokens + from, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

int kv_spec_accept(float *p, const float *q, int n, int32_t d, kv_rng *rng, int32_t *out) {
    double pd = p[d], qd = q ? q[d] : 1.0;
    double u = kv_rng_uniform(rng);
    if (u * qd < pd) return 1; /* probability min(1, p(d) / q(d)) */
    /* the residual norm(max(0, p - q)): what p has that the draft's
     * proposals did not already cover */
    double z = 0;
    for (int i = 0; i < n; i++) {
        double r = q ? (double)p[i] - q[i] : (i == d ? 0.0 : p[i]);
        if (r > 0) z += r;
    }
    if (z > 0) {
        for (int i = 0; i < n; i++) {
            double r = q ? (double)p[i] - q[i] : (i == d ? 0.0 : p[i]);
            p[i] = r > 0 ? (float)(r / z) : 0.0f;
        }
    } /* else p == q up to rounding: a rejection is a rounding artefact; p is the answer */
    *out = kv_sample_from(p, n, rng);
    return 0;
}

double kv_spec_expected_tokens(double p, int k) {
    if (k <= 0) return 1.0;
    if (p >= 1.0) return (double)k + 1.0;
    if (p <= 0.0) return 1.0;
    return (1.0 - pow(p, k + 1)) / (1.0 - p);
}

void kv_spec_ctl_init(kv_spec_seq *ss, const kv_spec_ctl_params *cp) {
    ss->k = cp->k_max > 0 ? cp->k_max : 1;
    ss->ewma = EWMA_START;
    ss->cooldown = 0;
    ss->backoff = BACKOFF_MIN;
    ss->probing = 0;
    ss->probe_ok = 0;
    ss->n_fallbacks = 0;
}

int kv_spec_ctl_next(kv_spec_seq *ss, const kv_spec_ctl_params *cp) {
    if (!cp->adaptive) return cp->k_max;
    if (ss->cooldown > 0) {
        ss->cooldown--;
        return 0;
    }
    return KV_MAX(1, KV_MIN(ss->k, cp->k_max));
}

int kv_spec_ctl_update(kv_spec_seq *ss, const kv_spec_ctl_params *cp, int drafted, int accepted) {
    if (drafted <= 0) return 0;
    accepted = KV_MAX(0, KV_MIN(accepted, drafted));
    int tried = accepted < drafted ? accepted + 1 : drafted;
    float rate = (float)accepted / (float)tried;
    ss->ewma = (1.0f - EWMA_ALPHA) * ss->ewma + EWMA_ALPHA * rate;
    ss->last_ewma = ss->ewma;
    if (!cp->adaptive) return 0;
    if (ss->ewma < cp->min_acceptance) {
        /* speculation costs more than it brings here: decode plainly for a
         * while, longer each time a retry fails too */
        ss->cooldown = ss->backoff;
        ss->backoff = KV_MIN(ss->backoff * 2, BACKOFF_MAX);
        ss->n_fallbacks++;
        ss->k = 1;
        ss->ewma = KV_MIN(1.0f, cp->min_acceptance + 0.15f); /* one bad probe falls back again */
        ss->probing = 1;
        ss->probe_ok = 0;
        return 1;
    }
    if (ss->probing && ++ss->probe_ok >= PROBE_OK) {
        ss->probing = 0;
        ss->backoff = BACKOFF_MIN;
    }
    int target = cp->k_max;
    if (ss->ewma < 0.999f) {
        double t = log(K_ALL_OK) / log((double)ss->ewma);
        target = t >= cp->k_max ? cp->k_max : (int)t;
    }
    target = KV_MAX(1, KV_MIN(target, cp->k_max));
    if (target > ss->k) ss->k++;
    else if (target < ss->k) ss->k--;
    return 0;
}

int kv_spec_check_vocab(const kv_model *target, const kv_model *draft, kv_err *err) {
    int nt = target->hp.n_vocab, nd = draft->hp.n_vocab;
    if (nt != nd || kv_tokenizer_n_vocab(target->tok) != kv_tokenizer_n_vocab(draft->tok))
        return kv_err_set(err, KV_ERR_INVAL, "spec.draft_model: %s has %d tokens, the target %s has %d",
                          draft->path, nd, target->path, nt);
    for (int i = 0; i < nt; i++) {
        const char *a = kv_tokenizer_token_text(target->tok, i), *b = kv_tokenizer_token_text(draft->tok, i);
        if (!a || !b || strcmp(a, b) != 0)
            return kv_err_set(err, KV_ERR_INVAL,
                              "spec.draft_model: %s has another vocabulary: token %d is '%.40s' there, '%.40s' in "
                              "the target",
                              draft->path, i, b ? b : "?", a ? a : "?");
    }
    return 0;
}

/* ---- lifecycle ---- */

void kv_spec_free(kv_spec *sp) {
    if (!sp) return;
    kv_forward_free(sp->fwd);
    kv_cache_free(sp->dcache);
    kv_model_free(sp->dmodel);
    free(sp->logits);
    free(sp->tok);
    free(sp->pos);
    free(sp->seq);
    free(sp->slot);
    free(sp->tables);
    free(sp->lslot);
    free(sp->ltables);
    free(sp->ltab);
    free(sp->rows);
    free(sp->item);
    free(sp->kk);
    free(sp);
}

kv_spec *kv_spec_new(const kv_config *cfg, const kv_model *target, kv_backend *be, kv_cache *target_cache,
                     int max_seqs, int max_tokens, kv_err *err) {
    if (!cfg || !target || !be || !target_cache || max_seqs < 1 || max_tokens < 1) {
        kv_err_set(err, KV_ERR_INVAL, "spec: bad arguments");
        return NULL;
    }
    if (cfg->spec.method == KV_SPEC_OFF) {
        kv_err_set(err, KV_ERR_INVAL, "spec: spec.method is off");
        return NULL;
    }
    if (cfg->spec.k < 1) {
        kv_err_set(err, KV_ERR_INVAL, "spec.k must be >= 1, got %d", cfg->spec.k);
        return NULL;
    }
    if (cfg->spec.method == KV_SPEC_SELF &&
        (cfg->spec.draft_layers < 1 || cfg->spec.draft_layers >= target->hp.n_layers)) {
        kv_err_set(err, KV_ERR_INVAL, "spec.draft_layers must be in [1, %d] for %s (%d layers), got %d",
                   target->hp.n_layers - 1, target->name, target->hp.n_layers, cfg->spec.draft_layers);
        return NULL;
    }
    kv_spec *sp = calloc(1, sizeof *sp);
    if (!sp) goto nomem;
    sp->method = cfg->spec.method;
    sp->ctl = (kv_spec_ctl_params){.k_max = cfg->spec.k, .adaptive = cfg->spec.adaptive,
                                   .min_acceptance = cfg->spec.min_acceptance};
    sp->ngram_n = cfg->spec.ngram_n > 0 ? cfg->spec.ngram_n : 1;
    sp->draft_layers = cfg->spec.draft_layers;
    sp->target = target;
    sp->be = be;
    sp->tcache = target_cache;
    sp->n_vocab = target->hp.n_vocab;
    sp->max_seqs = max_seqs;
    /* self drafts one row per sequence per pass; a draft model also runs
     * catch-up rows, up to the target's step budget */
    sp->max_tokens = sp->method == KV_SPEC_DRAFT_MODEL ? KV_MAX(max_tokens, max_seqs) : max_seqs;
    if (sp->method == KV_SPEC_NGRAM) return sp; /* no model, no cache */

    const kv_model *dm = target;
    if (sp->method == KV_SPEC_DRAFT_MODEL) {
        /* a llama2.c draft checkpoint reads the target's model.tokenizer */
        sp->dmodel = kv_model_load(cfg->spec.draft_model, cfg->model.tokenizer[0] ? cfg->model.tokenizer : NULL, err);
        if (!sp->dmodel) {
            kv_err e2 = *err;
            kv_err_set(err, e2.code, "spec.draft_model: %s", e2.msg);
            goto fail;
        }
        if (kv_spec_check_vocab(target, sp->dmodel, err)) goto fail;
        dm = sp->dmodel;
        const kv_cache_params *tp = kv_cache_params_of(target_cache);
        kv_cache_params cp = {.n_layers = dm->hp.n_layers, .n_kv_heads = dm->hp.n_kv_heads,
                              .head_dim = dm->hp.head_dim, .dtype = tp->dtype, .block_size = tp->block_size,
                              .prefix_sharing = tp->prefix_sharing, .n_swap_blocks = 0};
        /* as many token slots as the target's cache, plus each sequence's
         * drafts and a partial block: the draft cache never runs out before
         * the target's does */
        int per_seq = (cfg->spec.k + tp->block_size - 1) / tp->block_size + 1;
        int64_t nb = (int64_t)tp->n_blocks + (int64_t)max_seqs * per_seq;
        cp.n_blocks = (int)KV_MIN(nb, (int64_t)INT32_MAX / KV_MAX(1, tp->block_size));
        sp->dcache = kv_cache_new(&cp, be, err);
        if (!sp->dcache) goto fail;
        sp->dcache_bytes = kv_cache_block_bytes(&cp) * (uint64_t)cp.n_blocks;
    }
    sp->fwd = kv_forward_new(dm, be, sp->max_tokens, max_seqs, err);
    if (!sp->fwd) goto fail;
    if (sp->dmodel) kv_model_prepare_weights(sp->dmodel, be); /* freed after the engine's last step */
    size_t T = (size_t)sp->max_tokens, S = (size_t)max_seqs;
    sp->logits = malloc(S * (size_t)sp->n_vocab * sizeof(float));
    sp->tok = malloc(T * sizeof(int32_t));
    sp->pos = malloc(T * sizeof(int32_t));
    sp->seq = malloc(T * sizeof(int32_t));
    sp->slot = malloc(T * sizeof(int32_t));
    sp->tables = malloc(S * sizeof(int32_t *));
    sp->rows = malloc(S * sizeof(int32_t));
    sp->item = malloc(S * sizeof(int));
    sp->kk = malloc(S * sizeof(int));
    sp->lslot = malloc(T * sizeof(int32_t));
    sp->ltables = malloc(S * sizeof(int32_t *));
    if (!sp->logits || !sp->tok || !sp->pos || !sp->seq || !sp->slot || !sp->tables || !sp->rows || !sp->item ||
        !sp->kk || !sp->lslot || !sp->ltables)
        goto nomem;
    return sp;
nomem:
    kv_err_set(err, KV_ERR_NOMEM, "spec: out of memory for the drafter (%d sequences)", max_seqs);
fail:
    kv_spec_free(sp);
    return NULL;
}

kv_spec_method kv_spec_method_of(const kv_spec *sp) { return sp ? sp->method : KV_SPEC_OFF; }
const kv_model *kv_spec_draft_model(const kv_spec *sp) { return sp ? sp->dmodel : NULL; }
uint64_t kv_spec_weight_bytes(const kv_spec *sp) { return sp && sp->dmodel ? sp->dmodel->weight_bytes : 0; }
uint64_t kv_spec_kv_bytes(const kv_spec *sp) { return sp ? sp->dcache_bytes : 0; }

int64_t kv_spec_q_floats(const kv_spec *sp, const kv_sampling *s) {
    if (!sp || !s || s->temperature <= 0) return 0;
    if (sp->method != KV_SPEC_DRAFT_MODEL && sp->method != KV_SPEC_SELF) return 0;
    return (int64_t)sp->ctl.k_max * sp->n_vocab;
}

void kv_spec_seq_init(kv_spec_seq *ss, const kv_spec *sp, int64_t id, int tag) {
    float *q = ss->q;
    memset(ss, 0, sizeof *ss);
    ss->q = q; /* allocated by the owner, kept */
    kv_spec_ctl_params cp = {.k_max = sp ? sp->ctl.k_max : 1, .adaptive = sp ? sp->ctl.adaptive : 0,
                             .min_acceptance = sp ? sp->ctl.min_acceptance : 0};
    kv_spec_ctl_init(ss, &cp);
    kv_seq_init(&ss->dseq, (int)id, tag);
}

void kv_spec_release(kv_spec *sp, kv_spec_seq *ss) {
    if (!sp || !sp->dcache || !ss) return;
    if (ss->dseq.n_blocks > 0 || ss->dseq.blocks) {
        int id = ss->dseq.id, tag = ss->dseq.tag;
        kv_cache_seq_release(sp->dcache, &ss->dseq);
        kv_seq_init(&ss->dseq, id, tag);
    }
}

void kv_spec_seq_free(kv_spec *sp, kv_spec_seq *ss) {
    if (!ss) return;
    kv_spec_release(sp, ss);
    free(ss->q);
    ss->q = NULL;
}

/* ---- planning ---- */

/* draft_model: the catch-up and draft slots of one sequence in the draft
 * cache. Sets ss->catchup and returns the drafts it can make (0 or k). */
static int plan_draft_model(kv_spec *sp, kv_sreq *r, kv_spec_seq *ss, int k) {
    kv_seq *d = &ss->dseq;
    if (d->n_tokens == 0 && d->n_blocks == 0 && kv_cache_params_of(sp->dcache)->prefix_sharing &&
        kv_cache_match_prefix(sp->dcache, r->tokens, r->n_tokens) > 0)
        kv_cache_seq_attach_prefix(sp->dcache, d, r->tokens, r->n_tokens); /* failure: computes it all */
    int c = r->n_tokens - d->n_tokens; /* >= 1: the last known token is never in the draft cache */
    if (c <= 0) { /* cannot happen; keep the cache honest anyway */
        kv_cache_seq_truncate(sp->dcache, d, r->n_tokens - 1);
        c = r->n_tokens - d->n_tokens;
    }
    if (sp->budget <= 0) return 0;
    if (c > sp->budget) { /* a long catch-up (after a fallback or a preemption) goes in chunks */
        int chunk = sp->budget;
        if (kv_cache_seq_reserve(sp->dcache, d, chunk) != 0) return 0;
        ss->catchup = chunk;
        sp->budget -= chunk;
        return 0;
    }
    /* slots for the catch-up and for drafts 0..k-2 (the last draft is only sampled) */
    if (kv_cache_seq_reserve(sp->dcache, d, c + k - 1) != 0) {
        if (kv_cache_seq_reserve(sp->dcache, d, c) != 0) return 0;
        ss->catchup = c;
        sp->budget -= c;
        return 0;
    }
    ss->catchup = c;
    sp->budget -= c;
    return k;
}

/* Stand-in drafts (valid ids, a deterministic proposal) until the model
 * drafts them, or when drafting failed. */
static void placeholders(kv_sreq *r, int k) {
    for (int j = 0; j < k; j++) r->draft[j] = r->tokens[r->n_tokens - 1];
}

void kv_spec_plan(kv_spec *sp, kv_spec_item *items, int n) {
    if (!sp) return;
    sp->budget = sp->max_tokens;
    for (int i = 0; i < n; i++) {
        kv_sreq *r = items[i].r;
        kv_spec_seq *ss = items[i].ss;
        ss->planned = ss->catchup = ss->drafted = 0;
        ss->q_used = 0;
        r->n_draft = 0;
        int k = kv_spec_ctl_next(ss, &sp->ctl);
        k = KV_MIN(k, r->cap_draft);
        k = KV_MIN(k, r->max_tokens - kv_sreq_n_generated(r) - 1); /* drafts never pass max_tokens */
        if (k <= 0) continue;
        if (sp->method == KV_SPEC_NGRAM) {
            k = kv_spec_ngram(r->tokens, r->n_tokens, sp->ngram_n, k, r->draft);
        } else {
            if (sp->method == KV_SPEC_DRAFT_MODEL) k = plan_draft_model(sp, r, ss, k);
            placeholders(r, k); /* the model drafts once the scheduler says how many */
        }
        r->n_draft = k;
        ss->planned = k;
    }
}

/* ---- drafting ---- */

/* Picks draft j of item it from its draft logits: greedy requests take the
 * argmax (after the repetition penalty), sampled ones draw from the draft's
 * own distribution q, kept for verification. */
static int32_t draft_pick(kv_spec *sp, const kv_spec_item *it, kv_sampler *smp, int j, const float *row) {
    kv_sreq *r = it->r;
    kv_spec_seq *ss = it->ss;
    int hist = r->n_tokens + j; /* drafts so far sit after the known tokens */
    int32_t d;
    if (it->sampling->temperature > 0 && ss->q) {
        float *q = ss->q + (size_t)j * sp->n_vocab;
        kv_sampler_dist(smp, it->sampling, row, r->tokens, hist, q);
        d = kv_sample_from(q, sp->n_vocab, it->rng);
        if (j == 0) ss->q_used = 1;
    } else {
        kv_sampling g = *it->sampling;
        g.temperature = 0; /* a deterministic proposal: q is one-hot */
        d = kv_sampler_sample(smp, &g, row, r->tokens, hist, it->rng);
    }
    r->draft[j] = d;
    r->tokens[r->n_tokens + j] = d;
    return d;
}

/* Drafts this step of item i: what the scheduler kept (0 when not scheduled). */
static int kept_drafts(const kv_spec_item *it) {
    const kv_sreq *r = it->r;
    if (r->state != KV_REQ_RUNNING || r->n_sched <= 0 || it->ss->planned <= 0) return 0;
    return KV_MIN(r->n_sched_draft, it->ss->planned);
}

/* One draft pass of n_rows rows, one per drafting sequence, each giving
 * logits (rows[i] = i). */
static int run_pass(kv_spec *sp, kv_pages *pages, kv_pages *lpages, int n_rows, int n_seqs, int n_layers,
                    kv_err *err) {
    kv_batch b = {.n_tokens = n_rows, .tokens = sp->tok,
                  .ab = {.n_tokens = n_rows, .pos = sp->pos, .seq = sp->seq, .slot = sp->slot, .n_seqs = n_seqs,
                         .tables = sp->tables},
                  .n_logits = n_rows, .logit_rows = sp->rows, .n_layers = n_layers, .kv_local = lpages,
                  .ab_local = {.n_tokens = n_rows, .pos = sp->pos, .seq = sp->seq, .slot = sp->lslot,
                               .n_seqs = n_seqs, .tables = sp->ltables}};
    return kv_forward_run(sp->fwd, pages, &b, sp->logits, err);
}

/* Self-speculative: k passes of the target's first draft_layers layers,
 * one row per drafting sequence, writing those layers' K/V into the
 * sequence's own reserved slots (the verify pass rewrites them). */
static int draft_self(kv_spec *sp, kv_sched *s, kv_spec_item *items, int n, kv_sampler *smp, kv_err *err) {
    int ns = 0, kmax = 0;
    for (int i = 0; i < n && ns < sp->max_seqs; i++) {
        int k = kept_drafts(&items[i]);
        if (k <= 0) continue;
        sp->item[ns] = i;
        sp->kk[ns] = k;
        sp->tables[ns] = items[i].r->seq.blocks;
        kmax = KV_MAX(kmax, k);
        ns++;
    }
    kv_pages *pages = kv_cache_pages(sp->tcache), *lpages = kv_cache_local_pages(sp->tcache);
    if (lpages) { /* sliding-window release: tables into the local layers' pages */
        int total = 1;
        for (int b = 0; b < ns; b++) total += items[sp->item[b]].r->seq.n_blocks;
        if (kv_grow((void **)&sp->ltab, &sp->ltab_cap, total, sizeof *sp->ltab))
            return kv_err_set(err, KV_ERR_NOMEM, "spec: out of memory");
        for (int b = 0, off = 0; b < ns; b++) {
            const kv_seq *q = &items[sp->item[b]].r->seq;
            kv_cache_local_table(sp->tcache, q, sp->ltab + off);
            sp->ltables[b] = sp->ltab + off;
            off += q->n_blocks;
        }
    }
    for (int j = 0; j < kmax; j++) {
        int nb = 0;
        for (int b = 0; b < ns; b++) {
            if (sp->kk[b] <= j) continue;
            kv_sreq *r = items[sp->item[b]].r;
            int p = r->n_tokens - 1 + j;
            sp->tok[nb] = j == 0 ? r->tokens[r->n_tokens - 1] : r->draft[j - 1];
            sp->pos[nb] = p;
            sp->seq[nb] = b;
            sp->slot[nb] = kv_cache_slot(sp->tcache, &r->seq, p);
            if (lpages) sp->lslot[nb] = kv_cache_local_slot(sp->tcache, &r->seq, p);
            sp->rows[nb] = nb;
            nb++;
        }
        /* sequences that stopped drafting keep their table slot: seq ids
         * index tables[], rows index the batch */
        int rc = run_pass(sp, pages, lpages, nb, ns, sp->draft_layers, err);
        if (rc) return rc;
        int row = 0;
        for (int b = 0; b < ns; b++) {
            if (sp->kk[b] <= j) continue;
            draft_pick(sp, &items[sp->item[b]], smp, j, sp->logits + (size_t)row * sp->n_vocab);
            row++;
        }
    }
    for (int b = 0; b < ns; b++) {
        kv_spec_item *it = &items[sp->item[b]];
        it->ss->drafted = sp->kk[b];
        kv_sched_set_drafts(s, it->r);
    }
    return 0;
}

/* Draft model: pass 0 runs every planned catch-up (known tokens the draft
 * cache lacks; the drafting sequences' last row gives draft 0), then one
 * pass per further draft position. */
static int draft_model(kv_spec *sp, kv_sched *s, kv_spec_item *items, int n, kv_sampler *smp, kv_err *err) {
    kv_pages *pages = kv_cache_pages(sp->dcache);
    int ns = 0, nrows = 0, nlog = 0, kmax = 0;
    /* pass 0: sequences that draft first (their logit rows lead), then
     * catch-up only */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n && ns < sp->max_seqs; i++) {
            kv_spec_item *it = &items[i];
            kv_spec_seq *ss = it->ss;
            if (ss->catchup <= 0 || it->r->state != KV_REQ_RUNNING) continue; /* preempted: released below */
            int k = ss->catchup == it->r->n_tokens - ss->dseq.n_tokens ? kept_drafts(it) : 0;
            if ((k > 0) != (pass == 0)) continue;
            if (nrows + ss->catchup > sp->max_tokens) continue; /* planned within budget: cannot happen */
            kv_sreq *r = it->r;
            int first = ss->dseq.n_tokens;
            for (int t = 0; t < ss->catchup; t++) {
                sp->tok[nrows] = r->tokens[first + t];
                sp->pos[nrows] = first + t;
                sp->seq[nrows] = ns;
                sp->slot[nrows] = kv_cache_slot(sp->dcache, &ss->dseq, first + t);
                nrows++;
            }
            if (k > 0) sp->rows[nlog++] = nrows - 1;
            sp->item[ns] = i;
            sp->kk[ns] = k;
            sp->tables[ns] = ss->dseq.blocks;
            kmax = KV_MAX(kmax, k);
            ns++;
        }
    if (nrows > 0) {
        kv_batch b = {.n_tokens = nrows, .tokens = sp->tok,
                      .ab = {.n_tokens = nrows, .pos = sp->pos, .seq = sp->seq, .slot = sp->slot, .n_seqs = ns,
                             .tables = sp->tables},
                      .n_logits = nlog, .logit_rows = sp->rows, .n_layers = 0};
        int rc = kv_forward_run(sp->fwd, pages, &b, sp->logits, err);
        if (rc) return rc;
    }
    /* the catch-up tokens are known tokens: committed now */
    int row = 0;
    for (int b = 0; b < ns; b++) {
        kv_spec_item *it = &items[sp->item[b]];
        kv_spec_seq *ss = it->ss;
        kv_cache_seq_commit(sp->dcache, &ss->dseq, it->r->tokens, ss->dseq.n_tokens + ss->catchup);
        if (sp->kk[b] > 0) {
            draft_pick(sp, it, smp, 0, sp->logits + (size_t)row * sp->n_vocab);
            row++;
        } else {
            kv_cache_seq_truncate(sp->dcache, &ss->dseq, ss->dseq.n_tokens); /* drop draft slots */
        }
    }
    /* passes 1..kmax-1: the previous draft at the next position */
    for (int j = 1; j < kmax; j++) {
        int nb = 0;
        for (int b = 0; b < ns; b++) {
            if (sp->kk[b] <= j) continue;
            kv_spec_item *it = &items[sp->item[b]];
            kv_sreq *r = it->r;
            int p = r->n_tokens + j - 1;
            sp->tok[nb] = r->draft[j - 1];
            sp->pos[nb] = p;
            sp->seq[nb] = b;
            sp->slot[nb] = kv_cache_slot(sp->dcache, &it->ss->dseq, p);
            sp->rows[nb] = nb;
            nb++;
        }
        int rc = run_pass(sp, pages, NULL, nb, ns, 0, err);
        if (rc) return rc;
        row = 0;
        for (int b = 0; b < ns; b++) {
            if (sp->kk[b] <= j) continue;
            draft_pick(sp, &items[sp->item[b]], smp, j, sp->logits + (size_t)row * sp->n_vocab);
            row++;
        }
    }
    for (int b = 0; b < ns; b++) {
        if (sp->kk[b] <= 0) continue;
        kv_spec_item *it = &items[sp->item[b]];
        it->ss->drafted = sp->kk[b];
        kv_sched_set_drafts(s, it->r);
    }
    return 0;
}

int kv_spec_draft(kv_spec *sp, kv_sched *s, kv_spec_item *items, int n, kv_sampler *smp, kv_err *err) {
    if (!sp || n <= 0) return 0;
    int rc = 0;
    if (sp->method == KV_SPEC_SELF) rc = draft_self(sp, s, items, n, smp, err);
    else if (sp->method == KV_SPEC_DRAFT_MODEL) rc = draft_model(sp, s, items, n, smp, err);
    /* ngram drafts are final since kv_spec_plan */
    for (int i = 0; i < n; i++) {
        kv_spec_item *it = &items[i];
        kv_spec_seq *ss = it->ss;
        if (sp->method == KV_SPEC_NGRAM) ss->drafted = kept_drafts(it);
        if (rc) {
            /* the batch and r->draft must agree: back to placeholders, a
             * deterministic proposal that verification handles exactly */
            int k = kept_drafts(it);
            ss->q_used = 0;
            ss->drafted = k;
            if (k > 0 && sp->method != KV_SPEC_NGRAM) {
                placeholders(it->r, k);
                kv_sched_set_drafts(s, it->r);
            }
            if (sp->dcache) kv_cache_seq_truncate(sp->dcache, &ss->dseq, ss->dseq.n_tokens);
        }
        if (sp->dcache && it->r->state != KV_REQ_RUNNING) kv_spec_release(sp, ss);
    }
    return rc;
}

/* ---- verification ---- */

int kv_spec_verify(kv_spec *sp, const kv_spec_item *it, kv_sampler *smp, const float *logits, int n_vocab,
                   float *probs, int32_t *out) {
    kv_sreq *r = it->r;
    kv_spec_seq *ss = it->ss;
    const kv_sampling *sm = it->sampling;
    int k = r->n_sched_draft, N = r->n_tokens, n = 0;
    int greedy = sm->temperature <= 0;
    for (int j = 0; j <= k; j++) {
        const float *row = logits + (size_t)j * n_vocab;
        if (j == k) { /* every draft accepted: the target's bonus token */
            out[n++] = kv_sampler_sample(smp, sm, row, r->tokens, N + j, it->rng);
            break;
        }
        int32_t d = r->draft[j], t;
        int ok;
        if (greedy) {
            t = kv_sampler_sample(smp, sm, row, r->tokens, N + j, it->rng);
            ok = t == d;
        } else {
            kv_sampler_dist(smp, sm, row, r->tokens, N + j, probs);
            const float *q = ss && ss->q_used && ss->q ? ss->q + (size_t)j * n_vocab : NULL;
            ok = kv_spec_accept(probs, q, n_vocab, d, it->rng, &t);
        }
        if (!ok) {
            out[n++] = t;
            break;
        }
        r->tokens[N + j] = d; /* history for the next position's penalty */
        out[n++] = d;
    }
    return n;
}

void kv_spec_feedback(kv_spec *sp, const kv_spec_item *it, int drafted, int accepted, char *note, size_t cap) {
    kv_spec_seq *ss = it->ss;
    if (drafted <= 0) return;
    accepted = KV_MAX(0, KV_MIN(accepted, drafted));
    ss->drafts++;
    ss->n_drafted += (uint64_t)drafted;
    ss->n_accepted += (uint64_t)accepted;
    if (sp && sp->dcache && ss->dseq.n_blocks > 0) {
        /* the draft model wrote drafts 0..drafted-2 after the verified tokens:
         * the accepted ones among them stay, the rest roll back */
        int valid = ss->dseq.n_tokens + KV_MIN(accepted, drafted - 1);
        valid = KV_MIN(valid, it->r->n_tokens - 1);
        if (valid > ss->dseq.n_tokens && valid <= ss->dseq.n_reserved)
            kv_cache_seq_commit(sp->dcache, &ss->dseq, it->r->tokens, valid);
        kv_cache_seq_truncate(sp->dcache, &ss->dseq, ss->dseq.n_tokens);
    }
    int k_before = ss->k;
    kv_spec_ctl_params cp = sp ? sp->ctl : (kv_spec_ctl_params){.k_max = drafted, .adaptive = 0};
    int fell = kv_spec_ctl_update(ss, &cp, drafted, accepted);
    if (!note || cap == 0) return;
    static const char *names[] = {"off", "draft model", "self", "ngram"};
    const char *m = sp && (unsigned)sp->method < KV_ARRAY_LEN(names) ? names[sp->method] : "?";
    int len = snprintf(note, cap, "spec #%lld (%s): %d of %d drafts accepted + 1", (long long)it->r->id, m, accepted,
                       drafted);
    if (len < 0 || (size_t)len >= cap) return;
    if (fell)
        snprintf(note + len, cap - (size_t)len, "; acceptance %.2f < %.2f: plain decode for %d steps",
                 (double)ss->last_ewma, (double)cp.min_acceptance, ss->cooldown);
    else if (ss->k != k_before)
        snprintf(note + len, cap - (size_t)len, "; k %d->%d (acceptance %.2f)", k_before, ss->k, (double)ss->ewma);
}

int kv_spec_check(const kv_spec *sp, kv_spec_seq *const *seqs, const int *n_known, int n, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    if (!sp || !sp->dcache) return 0;
    kv_seq **tab = malloc((size_t)(n > 0 ? n : 1) * sizeof *tab);
    if (!tab) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        tab[i] = &seqs[i]->dseq;
        /* the draft cache holds known tokens only, never the last one (it
         * is fed again with the next drafts) */
        if (seqs[i]->dseq.n_tokens > KV_MAX(0, n_known[i] - 1)) {
            snprintf(msg, cap, "draft seq %d: %d committed tokens but %d known", seqs[i]->dseq.id,
                     seqs[i]->dseq.n_tokens, n_known[i]);
            free(tab);
            return -1;
        }
    }
    int rc = kv_cache_check(sp->dcache, tab, n, msg, cap);
    free(tab);
    return rc;
}
