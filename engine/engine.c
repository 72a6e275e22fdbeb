/* engine.c - the engine behind engine.h: creation (model, backend, cache
 * sized from the memory budget, scheduler), request intake (validation,
 * tokenization, rejection with reasons), polling events, the background
 * thread with pause/step controls, finished replies, the step hook and the
 * clock. One step is in step.c, snapshots in snapshot.c; the struct and
 * the lock order they share are in engine_internal.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/common.h"
#include "../base/vec.h"
#include "engine_internal.h"
#include "synthetic.h"

double engine_device_s(const kv_engine *e) {
    kv_backend_clock c;
    kv_backend_clock_get(e->be, &c);
    return c.elapsed_s;
}

double engine_now_ms(const kv_engine *e) {
    return e->virt ? atomic_load(&e->v_offset_ms) + engine_device_s(e) * 1000.0 : engine_wall_ms(e);
}

void engine_deadline_after(struct timespec *ts, int ms) { engine_deadline_on(CLOCK_MONOTONIC, ts, ms); }

void engine_deadline_on(clockid_t clock, struct timespec *ts, int ms) {
    clock_gettime(clock, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* ---- per-id table (under mu) ---- */

static int ids_reserve_locked(kv_engine *e, int64_t id) {
    if (id < e->cap_ids) return 0;
    int64_t nc = e->cap_ids ? e->cap_ids : 256;
    while (nc <= id) nc *= 2;
    id_rec *p = realloc(e->ids, (size_t)nc * sizeof *p);
    if (!p) return KV_ERR_NOMEM;
    memset(p + e->cap_ids, 0, (size_t)(nc - e->cap_ids) * sizeof *p);
    e->ids = p;
    e->cap_ids = nc;
    return 0;
}

/* ---- requests ---- */

void engine_ereq_free(ereq *r) {
    if (!r) return;
    kv_spec_seq_free(NULL, &r->ss); /* the draft-cache blocks went back in finish_req */
    kv_sreq_free(&r->s);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->text);
    free(r);
}

/* ---- creation ---- */

static int engine_init_sync(kv_engine *e) {
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca)) return KV_ERR_NOMEM;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&e->state_mu, NULL) || pthread_mutex_init(&e->pub_mu, NULL) ||
             pthread_mutex_init(&e->mu, NULL) || pthread_mutex_init(&e->hook_mu, NULL) ||
             pthread_cond_init(&e->ev_cond, &ca) || pthread_cond_init(&e->ctl_cond, &ca);
    pthread_condattr_destroy(&ca);
    return rc ? KV_ERR_NOMEM : 0;
}

uint64_t engine_activation_bytes(const kv_engine *e) {
    const kv_synth_plan *p = kv_synth_plan_of(e->synth);
    if (p) return (uint64_t)(p->activations * p->n_devices); /* on the devices, as planned */
    return kv_forward_activation_bytes(e->fwd) + (uint64_t)e->max_logits * e->n_vocab * sizeof(float);
}

/* kv_engine_new on be, or on the backend cfg names when be is NULL; takes
 * be (freed on failure too). */
/* Sliding-window release (kv.window_release) for a model with local
 * layers in the paged layout: the mask of local layers (kept by the engine,
 * copied by the cache) and the window into the cache parameters. */
static int engine_window_release(kv_engine *e, const kv_config *cfg, kv_err *err) {
    const kv_hparams *hp = &e->model->hp;
    if (!cfg->kv.window_release || hp->n_swa <= 0 || hp->n_swa_layers <= 0 || e->model->synthetic ||
        cfg->kv.layout != KV_LAYOUT_PAGED)
        return 0;
    e->swa_mask = calloc((size_t)hp->n_layers, 1);
    if (!e->swa_mask) return kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory");
    for (int l = 0; l < hp->n_layers; l++) e->swa_mask[l] = e->model->layers[l].swa != 0;
    e->cache_params.window = hp->n_swa;
    e->cache_params.local_layers = e->swa_mask;
    return 0;
}

/* The cache's block count (and local pool, under window release): the
 * synthetic plan's, kv.blocks, or what kv_memory holds. */
static void engine_size_pools(kv_engine *e, const kv_config *cfg, uint64_t kv_memory) {
    const int ctx = e->model->hp.ctx_len;
    const int max_len = cfg->scheduler.max_seq_len > 0 ? KV_MIN(cfg->scheduler.max_seq_len, ctx) : ctx;
    if (e->synth) e->cache_params.n_blocks = kv_synth_plan_of(e->synth)->n_blocks;
    else kv_cache_size_pools(&e->cache_params, kv_memory, cfg->kv.blocks, cfg->scheduler.max_seqs, max_len);
}

static kv_engine *engine_new(const kv_config *cfg, kv_backend *be, kv_err *err) {
    if (!cfg) {
        kv_err_set(err, KV_ERR_INVAL, "engine: NULL config");
        kv_backend_free(be);
        return NULL;
    }
    if (kv_config_validate(cfg, err)) {
        kv_backend_free(be);
        return NULL;
    }
    kv_engine *e = calloc(1, sizeof *e);
    if (!e) {
        kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory");
        kv_backend_free(be);
        return NULL;
    }
    e->be = be; /* from here on kv_engine_free frees it */
    e->cfg = *cfg;
    e->t0_ns = kv_now_ns();
    e->next_id = 1;
    if (engine_init_sync(e)) {
        free(e);
        kv_backend_free(be);
        kv_err_set(err, KV_ERR_NOMEM, "engine: cannot create locks");
        return NULL;
    }
    kv_ring_init(&e->steps, sizeof(kv_step_record), STEP_RING);
    kv_ring_init(&e->decisions, sizeof(kv_decision), DECISION_RING);
    kv_ring_init(&e->finished, sizeof(kv_snap_request), FINISHED_ROWS);
    kv_ring_init(&e->ev, sizeof(kv_event), 0);
    e->step_delay_ms = cfg->ui.step_delay_ms;

    e->model = cfg->sim.synthetic[0]
                   ? kv_synth_model_new(cfg, err)
                   : kv_model_load(cfg->model.path, cfg->model.tokenizer[0] ? cfg->model.tokenizer : NULL, err);
    if (!e->model) goto fail;
    const kv_hparams *hp = &e->model->hp;
    e->n_vocab = hp->n_vocab;
    if (!e->be) e->be = kv_synth_backend_new(cfg, err);
    if (!e->be) goto fail;
    /* The virtual clock starts at 0 when the engine is ready; what the
     * setup below charges to the device (weight uploads) is not in it. A
     * backend with a device clock (ops.clock: the sim) can drive it. */
    e->virt = e->be->ops->clock != NULL && cfg->sim_clock;

    /* the KV cache */
    kv_cache_params *cp = &e->cache_params;
    cp->n_layers = hp->n_layers;
    cp->n_kv_heads = hp->n_kv_heads;
    cp->head_dim = hp->head_dim;
    cp->dtype = cfg->kv.dtype;
    cp->block_size = cfg->kv.block_size;
    cp->prefix_sharing = cfg->kv.prefix_sharing && cfg->kv.layout == KV_LAYOUT_PAGED;
    e->block_bytes = kv_cache_block_bytes(cp);
    if (engine_window_release(e, cfg, err)) goto fail;

    /* The forward pass's buffers come first: a memory.budget gives the KV
     * cache what the weights and these activations leave. */
    e->spec_k = cfg->spec.method != KV_SPEC_OFF ? cfg->spec.k : 0;
    int T = cfg->scheduler.max_batched_tokens;
    int64_t ml = (int64_t)kv_config_max_seqs(cfg) * (1 + e->spec_k);
    e->max_logits = (int)KV_MIN(ml, (int64_t)T);
    if (e->model->synthetic) {
        /* no weights, no activations: the plan sizes the KV cache from
         * the devices' memory, and the blocks are bookkeeping only */
        e->synth = kv_synth_new(e->model, cfg, e->be, e->block_bytes, cp->block_size, T, e->max_logits, err);
        if (!e->synth) goto fail;
        cp->no_storage = 1;
    } else {
        e->fwd = kv_forward_new(e->model, e->be, T, e->max_logits, err);
        if (!e->fwd) goto fail;
        /* the model outlives the backend (kv_engine_free frees it first) */
        kv_model_prepare_weights(e->model, e->be);
    }
    uint64_t kv_memory = cfg->kv.memory;
    const char *kv_key = "kv.memory";
    if (e->synth) {
        kv_memory = 0;
        kv_key = "sim memory plan";
    } else if (cfg->kv.blocks == 0 && cfg->memory.budget > 0) {
        /* NOTE: a draft model's weights and cache (spec.method draft_model)
         * come on top of the budget: they are sized after the cache. */
        uint64_t act = engine_activation_bytes(e);
        uint64_t fixed = e->model->weight_bytes + act;
        if (fixed >= cfg->memory.budget) {
            kv_err_set(err, KV_ERR_INVAL,
                       "memory.budget: %.1f MiB leaves nothing for the KV cache (weights %.1f MiB + activations %.1f MiB)",
                       (double)cfg->memory.budget / 1048576.0, (double)e->model->weight_bytes / 1048576.0,
                       (double)act / 1048576.0);
            goto fail;
        }
        kv_memory = cfg->memory.budget - fixed;
        kv_key = "memory.budget";
    }
    engine_size_pools(e, cfg, kv_memory);
    if (cp->n_blocks <= 0) {
        kv_err_set(err, KV_ERR_INVAL, "%s: %llu bytes for the KV cache hold no block of %llu bytes (%d tokens)", kv_key,
                   (unsigned long long)kv_memory, (unsigned long long)e->block_bytes, cp->block_size);
        goto fail;
    }
    cp->n_swap_blocks = cfg->kv.swap_memory ? kv_cache_blocks_for_bytes(cp, cfg->kv.swap_memory) : 0;
    if (cfg->scheduler.preemption == KV_PREEMPT_SWAP && cp->n_swap_blocks == 0) {
        kv_err_set(err, KV_ERR_INVAL, "kv.swap_memory: %llu bytes hold no KV block of %llu bytes",
                   (unsigned long long)cfg->kv.swap_memory, (unsigned long long)e->block_bytes);
        goto fail;
    }
    e->cache = kv_cache_new(cp, e->be, err);
    if (!e->cache) goto fail;

    /* the scheduler and the per-step buffers */
    kv_sched_params_from_config(&e->sp, cfg, hp->ctx_len, cp->n_blocks);
    e->ctx = e->sp.max_seq_len;
    /* the attention batch's bounds, for a backend that sizes its batch meta
     * once (cuda): no sequence's table is longer than its context plus the
     * draft slack, in blocks */
    kv_backend_limits alim = {.max_rows = T, .max_k = 1, .max_seqs = kv_config_max_seqs(cfg),
                              .max_blocks_per_seq = (e->ctx + e->spec_k + cp->block_size - 1) / cp->block_size + 1};
    if (kv_backend_reserve(e->be, &alim, err) != 0) goto fail;
    e->sched = kv_sched_new(&e->sp, e->cache, err);
    if (!e->sched) goto fail;
    if (cfg->spec.method != KV_SPEC_OFF && !e->synth) { /* a synthetic model drafts in synth_step.c */
        e->spec = kv_spec_new(cfg, e->model, e->be, e->cache, kv_config_max_seqs(cfg), T, err);
        if (!e->spec) goto fail;
        e->items = malloc((size_t)kv_config_max_seqs(cfg) * sizeof *e->items);
        e->probs = malloc((size_t)e->n_vocab * sizeof *e->probs);
        if (!e->items || !e->probs) {
            kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory for speculative decoding");
            goto fail;
        }
    }
    if (!e->synth) e->logits = malloc((size_t)e->max_logits * (size_t)e->n_vocab * sizeof(float));
    if (!e->synth && e->be->ops->logits_scan) {
        e->scan_ids = malloc((size_t)e->max_logits * sizeof *e->scan_ids);
        e->scan_finite = malloc((size_t)e->max_logits);
        if (!e->scan_ids || !e->scan_finite) {
            kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory for %d logit rows", e->max_logits);
            goto fail;
        }
    }
    e->sampler = kv_sampler_new(e->n_vocab);
    e->metrics = kv_metrics_new(cfg->sla.ttft_ms, cfg->sla.tpot_ms);
    e->piece_cap = (size_t)kv_tokenizer_max_piece(e->model->tok) + 16;
    e->piece = malloc(e->piece_cap);
    e->bmap = malloc((size_t)cp->n_blocks * sizeof *e->bmap);
    e->sreqs = malloc((size_t)kv_config_max_seqs(cfg) * sizeof *e->sreqs);
    e->pub = kv_snapshot_new();
    e->pub_back = kv_snapshot_new();
    if ((!e->logits && !e->synth) || !e->sampler || !e->metrics || !e->piece || !e->bmap || !e->sreqs || !e->pub || !e->pub_back) {
        kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory for %d logit rows of %d", e->max_logits, e->n_vocab);
        goto fail;
    }
    e->last_reader_ms = -1e9;
    if (e->virt) atomic_store(&e->v_offset_ms, -engine_device_s(e) * 1000.0);
    kv_err_clear(err);
    return e;
fail:
    kv_engine_free(e);
    return NULL;
}

kv_engine *kv_engine_new(const kv_config *cfg, kv_err *err) { return engine_new(cfg, NULL, err); }

kv_engine *kv_engine_new_with_backend(const kv_config *cfg, kv_backend *be, kv_err *err) {
    if (!be) {
        kv_err_set(err, KV_ERR_INVAL, "engine: NULL backend");
        return NULL;
    }
    return engine_new(cfg, be, err);
}

void kv_engine_free(kv_engine *e) {
    if (!e) return;
    kv_engine_stop(e);
    engine_live_compact(e);
    for (int i = 0; i < e->n_live; i++) {
        if (e->sched) kv_sched_finish(e->sched, &e->live[i]->s, KV_FINISH_CANCELLED);
        kv_spec_release(e->spec, &e->live[i]->ss);
        engine_ereq_free(e->live[i]);
    }
    for (int i = 0; i < e->n_inbox; i++) engine_ereq_free(e->inbox[i]);
    free(e->live);
    free(e->inbox);
    free(e->cancels);
    free(e->cancel_scratch);
    kv_ring_free(&e->ev);
    for (int64_t i = 0; i < e->cap_ids; i++) free(e->ids[i].text);
    free(e->ids);
    free(e->pend_dec);
    free(e->pend_rej_ms);
    kv_ring_free(&e->steps);
    kv_ring_free(&e->decisions);
    kv_ring_free(&e->finished);
    free(e->lev);
    free(e->bmap);
    free(e->sreqs);
    kv_snapshot_free(e->pub);
    kv_snapshot_free(e->pub_back);
    kv_snapshot_free(e->hook_snap);
    kv_metrics_free(e->metrics);
    kv_sampler_free(e->sampler);
    free(e->logits);
    free(e->scan_ids);
    free(e->scan_finite);
    free(e->piece);
    kv_forward_free(e->fwd);
    kv_synth_free(e->synth);
    kv_spec_free(e->spec);
    free(e->items);
    free(e->probs);
    kv_sched_free(e->sched);
    kv_cache_free(e->cache);
    free(e->swa_mask);
    kv_backend_free(e->be);
    kv_model_free(e->model);
    pthread_mutex_destroy(&e->state_mu);
    pthread_mutex_destroy(&e->pub_mu);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->hook_mu);
    pthread_cond_destroy(&e->ev_cond);
    pthread_cond_destroy(&e->ctl_cond);
    free(e);
}

const kv_model *kv_engine_model(const kv_engine *e) { return e ? e->model : NULL; }
const kv_config *kv_engine_config(const kv_engine *e) { return e ? &e->cfg : NULL; }
kv_backend *kv_engine_backend(kv_engine *e) { return e ? e->be : NULL; }

/* ---- submission ---- */

void kv_engine_request_defaults(const kv_engine *e, kv_request_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = 128;
    if (e) {
        p->sampling = e->cfg.sampling;
    } else {
        kv_config c;
        kv_config_default(&c);
        p->sampling = c.sampling;
    }
}

/* Rejects a request: an id, a DONE event with the reason, a decision for
 * the next step. Returns code. */
static int64_t reject(kv_engine *e, const kv_request_params *p, int code, kv_err *err) {
    pthread_mutex_lock(&e->mu);
    int64_t id = e->next_id++;
    if (ids_reserve_locked(e, id) == 0) e->ids[id].state = ID_FINISHED;
    kv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = KV_EVENT_DONE;
    ev.req = id;
    ev.session = p ? p->session : -1;
    ev.token = -1;
    ev.finish = KV_FINISH_REJECTED;
    ev.queue_ms = ev.e2e_ms = -1;
    kv_copy_str(ev.reason, sizeof ev.reason, err ? err->msg : "rejected");
    ev.t_ms = engine_now_ms(e);
    kv_ring_push(&e->ev, &ev);
    if (kv_grow((void **)&e->pend_dec, &e->cap_pend, e->n_pend + 1, sizeof *e->pend_dec) == 0) {
        int cap = e->cap_pend;
        double *t = realloc(e->pend_rej_ms, (size_t)cap * sizeof *t);
        if (t) {
            e->pend_rej_ms = t;
            kv_decision *d = &e->pend_dec[e->n_pend];
            d->kind = KV_DEC_REJECT;
            d->req = id;
            int hl = snprintf(d->text, sizeof d->text, "reject #%lld: ", (long long)id);
            kv_copy_str(d->text + hl, sizeof d->text - (size_t)hl, err ? err->msg : "");
            e->pend_rej_ms[e->n_pend] = ev.t_ms;
            e->n_pend++;
        }
    }
    pthread_cond_broadcast(&e->ev_cond);
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
    return code;
}

static int blocks_for(int tokens, int bs) { return (int)(((int64_t)tokens + bs - 1) / bs); }

int64_t kv_engine_submit(kv_engine *e, const kv_request_params *p, kv_err *err) {
    kv_err local;
    if (!err) err = &local;
    kv_err_clear(err);
    if (!e || !p) return kv_err_set(err, KV_ERR_INVAL, "submit: NULL engine or params");
    if (p->session < 0) {
        kv_err_set(err, KV_ERR_INVAL, "session must be >= 0, got %d", p->session);
        return reject(e, p, KV_ERR_INVAL, err);
    }
    if (p->max_tokens <= 0) {
        kv_err_set(err, KV_ERR_INVAL, "max_tokens must be > 0, got %d", p->max_tokens);
        return reject(e, p, KV_ERR_INVAL, err);
    }
    if (kv_sampling_validate(&p->sampling, err)) return reject(e, p, KV_ERR_INVAL, err);
    if (p->logprobs && (p->top_logprobs < 0 || p->top_logprobs > KV_MAX_TOP_LOGPROBS)) {
        kv_err_set(err, KV_ERR_INVAL, "top_logprobs must be in [0, %d], got %d", KV_MAX_TOP_LOGPROBS, p->top_logprobs);
        return reject(e, p, KV_ERR_INVAL, err);
    }
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop)) {
        kv_err_set(err, KV_ERR_INVAL, "stop: %d strings but no array", p->n_stop);
        return reject(e, p, KV_ERR_INVAL, err);
    }
    for (int i = 0; i < p->n_stop; i++) {
        size_t sl = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (sl == 0 || sl > MAX_STOP_LEN) {
            kv_err_set(err, KV_ERR_INVAL, "stop string %d must have 1..%d bytes", i, MAX_STOP_LEN);
            return reject(e, p, KV_ERR_INVAL, err);
        }
    }
    /* the prompt ids */
    const kv_tokenizer *tok = e->model->tok;
    int32_t *ids = NULL;
    int n = 0;
    if (p->tokens) {
        if (p->n_tokens < 0) {
            kv_err_set(err, KV_ERR_INVAL, "n_tokens must be >= 0, got %d", p->n_tokens);
            return reject(e, p, KV_ERR_INVAL, err);
        }
        n = p->n_tokens;
        for (int i = 0; i < n; i++)
            if (p->tokens[i] < 0 || p->tokens[i] >= e->n_vocab) {
                kv_err_set(err, KV_ERR_RANGE, "prompt token %d is id %d, outside the vocabulary [0, %d)", i,
                           p->tokens[i], e->n_vocab);
                return reject(e, p, KV_ERR_RANGE, err);
            }
    } else if (p->text && p->text[0]) {
        /* Encoded only as far as the context: a longer text is refused
         * after work bounded by e->ctx, not by its length. */
        kv_encode_opts eo = {.add_bos = kv_tokenizer_add_bos(tok) && kv_tokenizer_bos(tok) >= 0,
                             .parse_special = p->parse_special != 0,
                             .max_tokens = e->ctx};
        size_t len = strlen(p->text);
        n = kv_tokenizer_encode_ex(tok, p->text, len, &eo, NULL, 0, err);
        if (n == KV_ERR_RANGE) kv_err_set(err, n, "prompt is longer than the context (more than %d tokens)", e->ctx);
        if (n < 0) return reject(e, p, n, err);
        if (n > 0) {
            ids = malloc((size_t)n * sizeof *ids);
            if (!ids) return kv_err_set(err, KV_ERR_NOMEM, "submit: out of memory for %d prompt tokens", n);
            kv_tokenizer_encode_ex(tok, p->text, len, &eo, ids, n, err);
        }
    }
    const int32_t *prompt = p->tokens ? p->tokens : ids;
    int code = 0;
    const int bs = e->cache_params.block_size, nb = e->cache_params.n_blocks;
    if (n == 0) {
        code = kv_err_set(err, KV_ERR_INVAL, "empty prompt");
    } else if (n > e->ctx) {
        code = kv_err_set(err, KV_ERR_RANGE, "prompt of %d tokens exceeds the context of %d", n, e->ctx);
    } else if ((int64_t)n + p->max_tokens > e->ctx) {
        code = kv_err_set(err, KV_ERR_RANGE, "prompt (%d) + max_tokens (%d) exceeds the context of %d", n,
                          p->max_tokens, e->ctx);
    } else if (e->sp.layout == KV_LAYOUT_CONTIGUOUS && blocks_for(e->ctx, bs) > nb) {
        code = kv_err_set(err, KV_ERR_RANGE,
                          "the contiguous layout reserves %d tokens (%d blocks) per request; the cache has %d blocks",
                          e->ctx, blocks_for(e->ctx, bs), nb);
    } else if (blocks_for(n + p->max_tokens, bs) > nb) {
        code = kv_err_set(err, KV_ERR_RANGE, "prompt (%d) + max_tokens (%d) needs %d blocks; the cache has %d", n,
                          p->max_tokens, blocks_for(n + p->max_tokens, bs), nb);
    } else if (blocks_for(n, bs) + e->sp.watermark_blocks > nb) {
        /* it would fit, but admission keeps the watermark free: it would wait forever */
        code = kv_err_set(err, KV_ERR_RANGE,
                          "prompt (%d) needs %d blocks and admission keeps %d free (scheduler.watermark); the cache "
                          "has %d",
                          n, blocks_for(n, bs), e->sp.watermark_blocks, nb);
    }
    if (code) {
        free(ids);
        return reject(e, p, code, err);
    }
    /* build the request */
    ereq *r = calloc(1, sizeof *r);
    if (!r || kv_sreq_init(&r->s, 0, prompt, n, p->max_tokens, e->spec_k)) {
        free(r);
        free(ids);
        return kv_err_set(err, KV_ERR_NOMEM, "submit: out of memory");
    }
    free(ids);
    int64_t nq = kv_spec_q_floats(e->spec, &p->sampling);
    if (nq > 0 && !(r->ss.q = malloc((size_t)nq * sizeof(float)))) goto nomem;
    r->s.priority = p->priority;
    r->s.session = p->session;
    r->sampling = p->sampling;
    r->ignore_eos = p->ignore_eos;
    r->logprobs = p->logprobs != 0;
    r->top_logprobs = r->logprobs ? p->top_logprobs : 0;
    r->finish = KV_FINISH_NONE;
    if (p->n_stop > 0) {
        r->stop = calloc((size_t)p->n_stop, sizeof *r->stop);
        if (!r->stop) goto nomem;
        for (int i = 0; i < p->n_stop; i++) {
            r->stop[i] = strdup(p->stop[i]);
            if (!r->stop[i]) goto nomem;
            r->n_stop++;
            r->max_stop = KV_MAX(r->max_stop, (int)strlen(p->stop[i]));
        }
    }
    kv_detok_init(&r->detok, tok, 0);
    r->text_cap = (size_t)p->max_tokens * 4 + 64; /* most pieces are short: rarely regrows */
    r->text = malloc(r->text_cap);
    if (!r->text) goto nomem;
    r->text[0] = 0;

    pthread_mutex_lock(&e->mu);
    int64_t id = e->next_id;
    if (ids_reserve_locked(e, id) ||
        kv_grow((void **)&e->inbox, &e->cap_inbox, e->n_inbox + 1, sizeof *e->inbox)) {
        pthread_mutex_unlock(&e->mu);
        goto nomem;
    }
    e->next_id++;
    r->s.id = id;
    r->s.seq.id = (int)id;
    r->s.seq.tag = p->session;
    r->s.arrival_ms = engine_now_ms(e);
    kv_req_metrics_init(&r->rm, r->s.arrival_ms, n);
    kv_rng_seed(&r->rng, p->sampling.seed + (p->seed_exact ? 0 : (uint64_t)id));
    kv_spec_seq_init(&r->ss, e->spec, id, p->session);
    e->ids[id].state = ID_ACTIVE;
    e->n_active++;
    e->inbox[e->n_inbox++] = r;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
    return id;
nomem:
    engine_ereq_free(r);
    return kv_err_set(err, KV_ERR_NOMEM, "submit: out of memory");
}

const char *kv_finish_name(kv_finish f) {
    static const char *const names[] = {"none", "eos", "length", "stop", "cancelled", "rejected", "error"};
    return (int)f >= 0 && (size_t)f < KV_ARRAY_LEN(names) ? names[f] : "unknown";
}

int kv_engine_cancel(kv_engine *e, int64_t id) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->mu);
    int rc = KV_ERR_INVAL;
    if (id > 0 && id < e->cap_ids && e->ids[id].state == ID_ACTIVE &&
        kv_grow((void **)&e->cancels, &e->cap_cancels, e->n_cancels + 1, sizeof *e->cancels) == 0) {
        e->cancels[e->n_cancels++] = id;
        rc = 0;
        pthread_cond_broadcast(&e->ctl_cond);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* ---- polling ---- */

int kv_engine_poll(kv_engine *e, kv_event *out, int cap) {
    if (!e || !out || cap <= 0) return 0;
    pthread_mutex_lock(&e->mu);
    int n = kv_ring_pop(&e->ev, out, cap);
    pthread_mutex_unlock(&e->mu);
    return n;
}

int kv_engine_wait(kv_engine *e, int timeout_ms) {
    if (!e) return 0;
    struct timespec ts;
    engine_deadline_after(&ts, timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&e->mu);
    while (e->ev.n == 0 && timeout_ms > 0)
        if (pthread_cond_timedwait(&e->ev_cond, &e->mu, &ts) == ETIMEDOUT) break;
    int any = e->ev.n > 0;
    pthread_mutex_unlock(&e->mu);
    return any;
}

/* ---- background thread ---- */

static void *thread_main(void *arg) {
    kv_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        int work = e->n_active > 0 || e->n_cancels > 0 || e->n_pend > 0;
        if ((e->paused && !e->step_once) || !work) {
            if (e->step_once && !work) e->step_once = 0; /* nothing to step */
            pthread_cond_wait(&e->ctl_cond, &e->mu);
            continue;
        }
        e->step_once = 0;
        pthread_mutex_unlock(&e->mu);

        int rc = engine_step_cycle(e, 1);
        if (rc == 0) { /* requests held for a disaggregated hand-over: move a virtual clock on */
            pthread_mutex_lock(&e->state_mu);
            if (engine_skip_to_hold(e, 0)) rc = 1;
            pthread_mutex_unlock(&e->state_mu);
        }

        pthread_mutex_lock(&e->mu);
        int delay = e->step_delay_ms;
        if (rc <= 0 && delay < 1) delay = 1; /* no progress: do not spin */
        if (delay > 0 && !e->stop) {
            struct timespec ts;
            engine_deadline_after(&ts, delay);
            while (!e->stop && pthread_cond_timedwait(&e->ctl_cond, &e->mu, &ts) != ETIMEDOUT) {
                /* woken by a control change: keep sleeping unless stopping */
            }
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int kv_engine_start(kv_engine *e) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->mu);
    if (e->thread_started) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    e->stop = 0;
    e->thread_started = 1;
    pthread_mutex_unlock(&e->mu);
    if (pthread_create(&e->thread, NULL, thread_main, e) != 0) {
        pthread_mutex_lock(&e->mu);
        e->thread_started = 0;
        pthread_mutex_unlock(&e->mu);
        return KV_ERR_NOMEM;
    }
    return 0;
}

/* Sets the pause flag under the lock and wakes the engine thread. */
static void set_paused(kv_engine *e, int paused) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->paused = paused;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
}

void kv_engine_pause(kv_engine *e) { set_paused(e, 1); }

void kv_engine_resume(kv_engine *e) { set_paused(e, 0); }

void kv_engine_step_once(kv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    if (e->paused) e->step_once = 1;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
}

void kv_engine_set_step_delay(kv_engine *e, int ms) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->step_delay_ms = ms < 0 ? 0 : ms;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
}

void kv_engine_stop(kv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    int started = e->thread_started;
    e->stop = 1;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
    if (started) pthread_join(e->thread, NULL);
    pthread_mutex_lock(&e->mu);
    e->thread_started = 0;
    e->stop = 0;
    pthread_mutex_unlock(&e->mu);
}

/* ---- finished requests, metrics, tracing ---- */

int kv_engine_request_text(kv_engine *e, int64_t id, char *buf, size_t cap) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->mu);
    int n = KV_ERR_INVAL;
    if (id > 0 && id < e->cap_ids && e->ids[id].state == ID_FINISHED) {
        const id_rec *r = &e->ids[id];
        n = r->len;
        if (buf && cap > 0) {
            size_t c = KV_MIN((size_t)r->len, cap - 1);
            if (c) memcpy(buf, r->text, c);
            buf[c] = 0;
            n = (int)c;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return n;
}

void kv_engine_forget(kv_engine *e, int64_t id) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    if (id > 0 && id < e->cap_ids && e->ids[id].state == ID_FINISHED) {
        free(e->ids[id].text);
        e->ids[id].text = NULL;
        e->ids[id].len = 0;
        e->ids[id].state = ID_NONE;
    }
    pthread_mutex_unlock(&e->mu);
}


int kv_engine_set_step_hook(kv_engine *e, kv_step_hook fn, void *user) {
    if (!e) return KV_ERR_INVAL;
    /* Allocated before the lock, so a failure changes nothing; a spare (a
     * snapshot was already there) is freed after. */
    kv_snapshot *fresh = NULL;
    if (fn && !(fresh = kv_snapshot_new())) return KV_ERR_NOMEM;
    pthread_mutex_lock(&e->hook_mu);
    kv_snapshot *old = NULL;
    if (fn && !e->hook_snap) e->hook_snap = fresh, fresh = NULL;
    if (!fn) old = e->hook_snap, e->hook_snap = NULL;
    e->hook = fn;
    e->hook_user = fn ? user : NULL;
    pthread_mutex_unlock(&e->hook_mu);
    kv_snapshot_free(fresh);
    kv_snapshot_free(old);
    return 0;
}

int kv_engine_trace_enable(kv_engine *e, int on) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->state_mu);
    e->trace = on != 0;
    kv_ring_set_limit(&e->steps, on ? 0 : STEP_RING);
    kv_ring_set_limit(&e->decisions, on ? 0 : DECISION_RING);
    pthread_mutex_unlock(&e->state_mu);
    return 0;
}

/* ---- the clock ---- */

double kv_engine_now_ms(kv_engine *e) { return e ? engine_now_ms(e) : 0.0; }
int kv_engine_clock_is_virtual(const kv_engine *e) { return e && e->virt; }

int kv_engine_advance_clock(kv_engine *e, double ms) {
    if (!e || !e->virt || !(ms > 0) || !isfinite(ms)) return KV_ERR_INVAL;
    double cur = atomic_load(&e->v_offset_ms);
    while (!atomic_compare_exchange_weak(&e->v_offset_ms, &cur, cur + ms)) {
    }
    return 0;
}

double kv_engine_hold_wait_ms(kv_engine *e) {
    if (!e) return 0.0;
    pthread_mutex_lock(&e->state_mu);
    double h = engine_next_hold_ms(e), w = h > 0 ? h - engine_now_ms(e) : 0.0;
    pthread_mutex_unlock(&e->state_mu);
    return w > 0 ? w : 0.0;
}

int kv_engine_warnings(const kv_engine *e, char out[][KV_WARNING_LEN], int cap) {
    if (!e) return 0;
    const kv_model *dm = e->spec ? kv_spec_draft_model(e->spec) : NULL;
    const struct {
        const char *from, *text;
    } all[KV_MAX_WARNINGS] = {
        {"model", kv_model_warning(e->model)},
        {"tokenizer", kv_tokenizer_warning(e->model->tok)},
        {"draft model", dm ? kv_model_warning(dm) : ""},
        {"draft tokenizer", dm ? kv_tokenizer_warning(dm->tok) : ""},
    };
    int n = 0;
    for (int i = 0; i < KV_MAX_WARNINGS && n < cap; i++)
        if (all[i].text && all[i].text[0]) snprintf(out[n++], KV_WARNING_LEN, "%s: %s", all[i].from, all[i].text);
    return n;
}
