/* driver.c - a workload's items as timed engine submissions: prompt ids by
 * one tokenization rule, open-loop arrivals and closed-loop slots, the
 * request each item becomes. See driver.h for the contracts. */
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_driver {
    kv_engine *e;           /* borrowed */
    const kv_tokenizer *tok;/* the engine model's */
    kv_workload *w;
    kv_driver_opts o;
    kv_sampling sampling;   /* the config's */
    int ignore_eos;         /* workload.ignore_eos */
    int n;                  /* items */
    int conc;               /* closed loop: slots; 0 open loop */
    int next;               /* next item to hand out */
    int submitted;          /* requests that reached kv_engine_submit (session tags) */
    int started;            /* bool: the first kv_driver_submit_due call set t0_ms */
    double t0_ms;           /* the caller's clock when the arrival times started counting */
    /* pretokenize: every prompt, back to back; prompt i is ids[off[i] .. off[i+1]) */
    int32_t *ids;
    size_t *off;            /* (n + 1) */
    char **fail;            /* (n) why prompt i could not be built (malloc'ed), NULL when it could */
    /* otherwise: one prompt at a time */
    int32_t *buf;           /* (cap_buf) */
    int cap_buf;
};

/* The workload's tokenizer callback: no BOS (kv_driver_prompt puts it in
 * front, so a shared system prompt's ids are the same in every request).
 * NOTE: special-token texts are not parsed. A workload prompt is a raw
 * prompt, the text `kvtop generate -p` would take, and user text must never
 * become control tokens (a "<|im_end|>" typed into a prompts file stays
 * those characters). The TUI's load key always did this; `kvtop bench`
 * parsed them until both came here, which changes its outputs only for a
 * prompts file holding such texts. A chat-formatted workload would need a
 * flag saying so, which no profile has. */
static int raw_tokenize(void *ctx, const char *text, int32_t *out, int cap) {
    const kv_tokenizer *t = ctx;
    int n = kv_tokenizer_encode(t, text, strlen(text), 0, 0, out, cap, NULL);
    if (n < 0) return n;
    return n < cap ? n : cap;
}

static int add_bos(const kv_tokenizer *tok) { return kv_tokenizer_add_bos(tok) && kv_tokenizer_bos(tok) >= 0; }

int kv_driver_prompt_bound(const kv_workload *w, int i, const kv_tokenizer *tok) {
    const kv_workload_item *it = kv_workload_get(w, i);
    if (!it) return 0;
    /* a text never makes more ids than bytes + the SPM dummy prefix */
    size_t c = (size_t)add_bos(tok) + (size_t)it->system_tokens +
               (it->text ? strlen(it->text) + 16 : (size_t)it->prompt_tokens);
    return (int)KV_MIN(c, (size_t)1 << 30);
}

int kv_driver_prompt(const kv_workload *w, int i, const kv_tokenizer *tok, int32_t *out, int cap, kv_err *err) {
    if (!kv_workload_get(w, i)) return kv_err_set(err, KV_ERR_INVAL, "workload item %d does not exist", i);
    int bos = add_bos(tok);
    if (cap < bos) return kv_err_set(err, KV_ERR_RANGE, "no room for the prompt");
    int got = kv_workload_tokens(w, i, raw_tokenize, (void *)tok, out + bos, cap - bos, err);
    if (got < 0) return got;
    if (bos) out[0] = kv_tokenizer_bos(tok);
    return got + bos;
}

/* ---- creation ---- */

/* Tokenizes every prompt before any clock starts. */
static int pretokenize(kv_driver *d, kv_err *err) {
    size_t total = 0;
    for (int i = 0; i < d->n; i++) total += (size_t)kv_driver_prompt_bound(d->w, i, d->tok);
    d->ids = malloc((total ? total : 1) * sizeof *d->ids);
    d->off = malloc(((size_t)d->n + 1) * sizeof *d->off);
    d->fail = calloc(d->n > 0 ? (size_t)d->n : 1, sizeof *d->fail);
    if (!d->ids || !d->off || !d->fail)
        return kv_err_set(err, KV_ERR_NOMEM, "driver: out of memory for %zu prompt ids", total);
    size_t at = 0;
    for (int i = 0; i < d->n; i++) {
        d->off[i] = at;
        kv_err e2;
        kv_err_clear(&e2);
        int got = kv_driver_prompt(d->w, i, d->tok, d->ids + at, kv_driver_prompt_bound(d->w, i, d->tok), &e2);
        if (got < 0) {
            if (!(d->fail[i] = strdup(e2.msg[0] ? e2.msg : "cannot be built")))
                return kv_err_set(err, KV_ERR_NOMEM, "driver: out of memory");
            continue;
        }
        at += (size_t)got;
    }
    d->off[d->n] = at;
    return 0;
}

kv_driver *kv_driver_new(kv_engine *e, const kv_config *cfg, const kv_driver_opts *o, kv_err *err) {
    if (!e || !cfg) {
        kv_err_set(err, KV_ERR_INVAL, "driver: NULL engine or config");
        return NULL;
    }
    kv_driver *d = calloc(1, sizeof *d);
    if (!d) {
        kv_err_set(err, KV_ERR_NOMEM, "driver: out of memory");
        return NULL;
    }
    if (o) d->o = *o;
    d->e = e;
    d->tok = kv_engine_model(e)->tok;
    d->sampling = cfg->sampling;
    d->ignore_eos = cfg->workload.ignore_eos;
    d->w = kv_workload_build(cfg, err);
    if (!d->w) goto fail;
    d->n = kv_workload_count(d->w);
    d->conc = kv_workload_concurrency(d->w);
    if (d->conc > 0 && d->o.closed_slots > 0) d->conc = d->o.closed_slots;
    if (d->o.pretokenize && pretokenize(d, err)) goto fail;
    return d;
fail:
    kv_driver_free(d);
    return NULL;
}

void kv_driver_free(kv_driver *d) {
    if (!d) return;
    if (d->fail)
        for (int i = 0; i < d->n; i++) free(d->fail[i]);
    free(d->fail);
    free(d->off);
    free(d->ids);
    free(d->buf);
    kv_workload_free(d->w);
    free(d);
}

const kv_workload *kv_driver_workload(const kv_driver *d) { return d ? d->w : NULL; }
int kv_driver_count(const kv_driver *d) { return d ? d->n : 0; }
int kv_driver_closed(const kv_driver *d) { return d && d->conc > 0; }
int kv_driver_remaining(const kv_driver *d) { return d ? d->n - d->next : 0; }

/* ---- submission ---- */

/* Seconds of the workload's clock at now_ms. */
static double run_s(const kv_driver *d, double now_ms) { return (now_ms - d->t0_ms) / 1000.0; }

/* Prompt ids of item i into *ids (pretokenized, or built into buf now).
 * Returns their number, or a negative error with the reason in sub. */
static int item_prompt(kv_driver *d, int i, const int32_t **ids, kv_driver_sub *sub, kv_err *err) {
    if (d->ids) {
        if (d->fail[i]) {
            snprintf(sub->reason, sizeof sub->reason, "prompt: %.118s", d->fail[i]);
            return KV_ERR_INVAL;
        }
        *ids = d->ids + d->off[i];
        return (int)(d->off[i + 1] - d->off[i]);
    }
    int bound = kv_driver_prompt_bound(d->w, i, d->tok);
    if (bound > d->cap_buf) {
        int32_t *nb = realloc(d->buf, (size_t)bound * sizeof *nb);
        if (!nb) return kv_err_set(err, KV_ERR_NOMEM, "driver: out of memory for %d prompt ids", bound);
        d->buf = nb;
        d->cap_buf = bound;
    }
    kv_err e2;
    kv_err_clear(&e2);
    int got = kv_driver_prompt(d->w, i, d->tok, d->buf, bound, &e2);
    if (got < 0) {
        snprintf(sub->reason, sizeof sub->reason, "prompt: %.118s", e2.msg);
        return KV_ERR_INVAL;
    }
    *ids = d->buf;
    return got;
}

/* Hands item i to the engine, filling sub. Returns 1 when it is in
 * flight, 0 when not (sub says why), or KV_ERR_NOMEM. */
static int submit_item(kv_driver *d, int i, kv_driver_sub *sub, kv_err *err) {
    memset(sub, 0, sizeof *sub);
    sub->index = i;
    const kv_workload_item *it = kv_workload_get(d->w, i);
    const int32_t *ids = NULL;
    int n = item_prompt(d, i, &ids, sub, err);
    if (n == KV_ERR_NOMEM) return n;
    if (n < 0) return 0;
    sub->prompt_tokens = n;
    kv_request_params p;
    kv_engine_request_defaults(d->e, &p);
    p.tokens = ids;
    p.n_tokens = n;
    p.max_tokens = it->output_tokens;
    if (d->o.fit_ctx > 0 && n + p.max_tokens > d->o.fit_ctx) {
        p.max_tokens = d->o.fit_ctx - n;
        if (p.max_tokens < 1) {
            sub->skipped = 1;
            return 0;
        }
    }
    p.sampling = d->sampling;
    if (d->o.seed_per_item) p.sampling.seed += (uint64_t)i; /* reproducible per request, whatever the batch */
    p.ignore_eos = d->ignore_eos;
    p.priority = it->priority; /* the request class's (workload.short_priority) */
    p.session = d->o.n_sessions > 0 ? d->o.session_base + d->submitted % d->o.n_sessions : d->o.session_base + i;
    d->submitted++;
    kv_err e2;
    int64_t id = kv_engine_submit(d->e, &p, &e2);
    if (id > 0) {
        sub->id = id;
        return 1;
    }
    /* refused at the door (the engine also emits a DONE for an id the
     * caller never learns) */
    snprintf(sub->reason, sizeof sub->reason, "%.127s", e2.msg);
    return 0;
}

int kv_driver_submit_due(kv_driver *d, double now_ms, int in_flight, kv_driver_sub *out, int cap, kv_err *err) {
    if (!d || !out || cap < 1) return kv_err_set(err, KV_ERR_INVAL, "driver: bad arguments");
    if (!d->started) {
        d->started = 1;
        d->t0_ms = now_ms;
    }
    int k = 0;
    while (k < cap && d->n > 0) {
        if (d->next >= d->n) {
            if (!d->o.repeat) break;
            d->next = 0; /* start over, the arrival times from now */
            d->t0_ms = now_ms;
        }
        if (d->conc > 0) {
            if (in_flight >= d->conc) break;
        } else {
            if (d->o.max_in_flight > 0 && in_flight >= d->o.max_in_flight) break;
            /* 1 ns of slack: a simulated clock moved to an arrival by
             * adding the wait may land an ulp short of it */
            if (kv_workload_get(d->w, d->next)->arrival_s > run_s(d, now_ms) + 1e-9) break;
        }
        int rc = submit_item(d, d->next++, &out[k++], err);
        if (rc < 0) return rc;
        in_flight += rc;
    }
    return k;
}

double kv_driver_next_wait_ms(const kv_driver *d, double now_ms) {
    if (!d || d->conc > 0 || d->n == 0 || (d->next >= d->n && !d->o.repeat)) return -1;
    if (!d->started) return 0;
    if (d->next >= d->n) return 0; /* repeat: the first item arrives at once */
    return (kv_workload_get(d->w, d->next)->arrival_s - run_s(d, now_ms)) * 1000;
}
