/* engine.c - the engine behind engine.h: request intake (validation,
 * tokenization, rejection with reasons), the step loop (schedule, one
 * batched forward, sampling, streaming detokenization, stop strings, events,
 * records), the background thread with pause/step controls, plain-data
 * snapshots for front ends, and a hook that gets one after every step.
 *
 * Locks (always taken in this order: state_mu, then pub_mu or hook_mu,
 * then mu):
 *   state_mu  held for a whole step; guards the scheduler, cache, metrics,
 *             the live request table and the step/decision rings.
 *   pub_mu    the published snapshot copy that readers use mid-step.
 *   mu        the intake queue, cancellations, the event ring, the per-id
 *             table (active / finished text) and the thread controls.
 *   hook_mu   the step hook and its snapshot: taken with state_mu held
 *             after a step and kept while state_mu is released and the
 *             hook runs, so removing the hook waits for a call in flight. */
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/sim.h"
#include "forward.h"
#include "kv_cache.h"
#include "metrics.h"
#include "sampler.h"
#include "scheduler.h"
#include "spec.h"
#include "tokenizer.h"

enum {
    STEP_RING = 256,      /* step records kept (without tracing) */
    DECISION_RING = 1024, /* decisions kept (without tracing) */
    FINISHED_ROWS = 64,   /* finished requests shown in snapshots */
    MAX_STOP_LEN = 128    /* bytes per stop string */
};

/* One request as the engine sees it. */
typedef struct ereq {
    kv_sreq s;              /* the scheduler's view (tokens, state, blocks) */
    kv_sampling sampling;
    kv_rng rng;             /* seeded from sampling.seed + id: independent of batching */
    int ignore_eos;
    char **stop;            /* (n_stop) owned */
    int n_stop;
    int max_stop;           /* longest stop string, bytes */
    kv_detok detok;
    char *text;             /* (text_cap) generated text, complete UTF-8, stop string cut */
    size_t text_len, text_cap;
    size_t emitted;         /* bytes of text already sent in events */
    kv_req_metrics rm;
    kv_finish finish;
    kv_spec_seq ss;         /* speculative decoding: draft length, draft cache sequence, counters */
} ereq;

/* What the engine remembers per id under mu. */
typedef struct id_rec {
    char *text;   /* finished: the reply (owned) */
    int len;
    uint8_t state; /* ID_* */
} id_rec;
enum { ID_NONE = 0, ID_ACTIVE = 1, ID_FINISHED = 2 };

/* A growable ring of fixed-size records: keeps the newest `limit` (or all
 * when limit is 0). */
typedef struct ring {
    void *v;
    size_t elem;
    int cap, head, n; /* head: index of the oldest */
    int limit;
} ring;

struct kv_engine {
    kv_config cfg;
    kv_model *model;
    kv_backend *be;
    kv_cache *cache;
    kv_cache_params cache_params;
    kv_sched *sched;
    kv_sched_params sp;
    kv_forward *fwd;
    kv_spec *spec;          /* speculative decoding, NULL when spec.method is off */
    kv_spec_item *items;    /* (max_seqs) the step's speculating requests */
    float *probs;           /* (n_vocab) verification scratch */
    kv_sampler *sampler;
    kv_metrics *metrics;
    float *logits;          /* (max_logits, n_vocab) */
    int max_logits;
    int n_vocab;
    int ctx;                /* tokens per request at most (prompt + output) */
    int spec_k;             /* draft slack per request */
    uint64_t block_bytes;
    uint64_t t0_ns;
    /* The clock: host wall time since t0_ns, or on the sim backend with
     * sim_clock on, the simulated device's clock plus the idle time a
     * driver skipped (kv_engine_advance_clock); both only move forward. */
    int virt;
    _Atomic double v_offset_ms;
    char *piece;            /* (piece_cap) detokenizer output */
    size_t piece_cap;

    pthread_mutex_t state_mu, pub_mu, mu;
    pthread_cond_t ev_cond;  /* events arrived / a step ended */
    pthread_cond_t ctl_cond; /* work arrived, controls changed */

    /* ---- under mu ---- */
    ereq **inbox;           /* (cap_inbox) submitted, not yet seen by a step */
    int n_inbox, cap_inbox;
    int64_t *cancels;       /* (cap_cancels) */
    int n_cancels, cap_cancels;
    kv_event *ev;           /* ring (ev_cap) */
    int ev_head, ev_n, ev_cap;
    id_rec *ids;            /* (cap_ids) indexed by request id */
    int64_t cap_ids;
    int64_t next_id;
    int n_active;           /* submitted and not finished */
    kv_decision *pend_dec;  /* (cap_pend) rejections to record at the next step */
    int n_pend, cap_pend;
    double *pend_rej_ms;    /* (cap_pend) their times */
    int thread_started, paused, step_once, stop, step_delay_ms;
    uint64_t steps_done;    /* a copy of step for waiters */

    /* ---- under state_mu ---- */
    uint64_t step;
    ereq **live;            /* (cap_live) requests in the scheduler, by id */
    int n_live, cap_live;
    ring steps;             /* kv_step_record */
    ring decisions;         /* kv_decision */
    ring finished;          /* kv_snap_request of the latest finished */
    kv_event *lev;          /* (cap_lev) events of the current step */
    int n_lev, cap_lev;
    kv_block_info *bmap;    /* (n_blocks) scratch for snapshots */
    int trace;
    int64_t *cancel_scratch;
    int cap_cancel_scratch;
    ereq **sreqs;           /* (max_seqs) the step's scheduled requests */

    /* ---- published snapshot (pub_mu) ---- */
    kv_snapshot *pub, *pub_back;
    double last_reader_ms;  /* last kv_engine_snapshot call: publish while readers are around */
    int pub_filled;         /* pub holds a snapshot (not the empty initial one) */

    /* ---- step hook (hook_mu; taken after state_mu, held across the call) ---- */
    pthread_mutex_t hook_mu;
    kv_step_hook hook;      /* NULL: none */
    void *hook_user;
    kv_snapshot *hook_snap; /* built after each step for the hook; allocated when the hook is set */

    pthread_t thread;
};

static double wall_ms(const kv_engine *e) { return (double)(kv_now_ns() - e->t0_ns) / 1e6; }
static double now_ms(const kv_engine *e) {
    return e->virt ? atomic_load(&e->v_offset_ms) + kv_sim_elapsed_s(e->be) * 1000.0 : wall_ms(e);
}

/* Copies a NUL-terminated string, truncating to cap - 1 bytes. */
static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static int grow_arr(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return KV_ERR_NOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

/* ---- rings ---- */

static void ring_init(ring *r, size_t elem, int limit) {
    memset(r, 0, sizeof *r);
    r->elem = elem;
    r->limit = limit;
}

static void *ring_at(const ring *r, int i) { return (char *)r->v + (size_t)((r->head + i) % r->cap) * r->elem; }

/* Re-lays the ring out from index 0 with capacity nc (>= n). */
static int ring_realloc(ring *r, int nc) {
    void *p = malloc((size_t)nc * r->elem);
    if (!p) return KV_ERR_NOMEM;
    for (int i = 0; i < r->n; i++) memcpy((char *)p + (size_t)i * r->elem, ring_at(r, i), r->elem);
    free(r->v);
    r->v = p;
    r->cap = nc;
    r->head = 0;
    return 0;
}

static void ring_push(ring *r, const void *x) {
    if (r->n == r->cap) {
        if (r->limit > 0 && r->n >= r->limit) { /* overwrite the oldest */
            memcpy(ring_at(r, 0), x, r->elem);
            r->head = (r->head + 1) % r->cap;
            return;
        }
        int nc = r->cap ? r->cap * 2 : 64;
        if (r->limit > 0 && nc > r->limit) nc = r->limit;
        if (ring_realloc(r, nc)) return; /* out of memory: drop the record, not the step */
    }
    memcpy(ring_at(r, r->n), x, r->elem);
    r->n++;
}

static void ring_set_limit(ring *r, int limit) {
    r->limit = limit;
    if (limit > 0 && r->n > limit) {
        r->head = (r->head + (r->n - limit)) % r->cap;
        r->n = limit;
        ring_realloc(r, limit);
    }
}

/* ---- events ---- */

/* Appends to the event ring under mu; grows it, never drops. */
static int push_event_locked(kv_engine *e, const kv_event *ev) {
    if (e->ev_n == e->ev_cap) {
        int nc = e->ev_cap ? e->ev_cap * 2 : 256;
        kv_event *p = malloc((size_t)nc * sizeof *p);
        if (!p) return KV_ERR_NOMEM;
        for (int i = 0; i < e->ev_n; i++) p[i] = e->ev[(e->ev_head + i) % e->ev_cap];
        free(e->ev);
        e->ev = p;
        e->ev_cap = nc;
        e->ev_head = 0;
    }
    e->ev[(e->ev_head + e->ev_n) % e->ev_cap] = *ev;
    e->ev_n++;
    return 0;
}

/* Queues an event of this step (published at the end of the step). */
static kv_event *local_event(kv_engine *e, kv_event_type type, const ereq *r) {
    if (grow_arr((void **)&e->lev, &e->cap_lev, e->n_lev + 1, sizeof *e->lev)) return NULL;
    kv_event *ev = &e->lev[e->n_lev++];
    memset(ev, 0, sizeof *ev);
    ev->type = type;
    ev->req = r->s.id;
    ev->session = r->s.session;
    ev->token = -1;
    ev->t_ms = now_ms(e);
    return ev;
}

/* Emits text as one or more events: the first is `first` (already queued),
 * the rest are TOKEN events with token -1 carrying the overflow. Cuts only
 * between UTF-8 characters. */
static void emit_text(kv_engine *e, ereq *r, kv_event *first, const char *text, size_t len) {
    kv_event *ev = first;
    kv_token_source src = first ? first->source : KV_TOKSRC_DECODE;
    while (len > 0) {
        if (!ev) {
            ev = local_event(e, KV_EVENT_TOKEN, r);
            if (!ev) return;
            ev->source = src;
        }
        size_t n = len < sizeof ev->text - 1 ? len : sizeof ev->text - 1;
        if (n < len)
            while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80) n--; /* not inside a character */
        if (n == 0) n = KV_MIN(len, sizeof ev->text - 1);
        memcpy(ev->text, text, n);
        ev->text[n] = 0;
        ev->text_len = (int)n;
        text += n;
        len -= n;
        ev = NULL;
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

static void ereq_free(ereq *r) {
    if (!r) return;
    kv_spec_seq_free(NULL, &r->ss); /* the draft-cache blocks went back in finish_req */
    kv_sreq_free(&r->s);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->text);
    free(r);
}

static int live_find(const kv_engine *e, int64_t id) {
    int lo = 0, hi = e->n_live - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int64_t x = e->live[mid]->s.id;
        if (x == id) return mid;
        if (x < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static int text_append(ereq *r, const char *s, size_t n) {
    if (r->text_len + n + 1 > r->text_cap) {
        size_t nc = r->text_cap ? r->text_cap : 256;
        while (nc < r->text_len + n + 1) nc *= 2;
        char *p = realloc(r->text, nc);
        if (!p) return KV_ERR_NOMEM;
        r->text = p;
        r->text_cap = nc;
    }
    memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = 0;
    return 0;
}

/* Bytes at the end of the text that could begin a stop string: held back
 * until the next token decides. */
static size_t stop_holdback(const ereq *r) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = KV_MIN(sl - 1, r->text_len); k > hold; k--)
            if (memcmp(r->text + r->text_len - k, r->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Looks for a stop string in the text added since `from`; cuts the text at
 * the earliest match and returns 1. */
static int stop_match(ereq *r, size_t from) {
    if (r->n_stop == 0) return 0;
    size_t start = from > (size_t)r->max_stop ? from - (size_t)r->max_stop : 0;
    size_t best = (size_t)-1;
    for (int i = 0; i < r->n_stop; i++) {
        const char *p = memmem(r->text + start, r->text_len - start, r->stop[i], strlen(r->stop[i]));
        if (p && (size_t)(p - r->text) < best) best = (size_t)(p - r->text);
    }
    if (best == (size_t)-1) return 0;
    r->text_len = best;
    r->text[best] = 0;
    return 1;
}

static void snap_row(const kv_engine *e, const ereq *r, kv_snap_request *o);

/* Ends r: metrics, scheduler, the finished-row ring, the reply text into
 * the id table, and the DONE event carrying any held-back text. */
static void finish_req(kv_engine *e, ereq *r, kv_finish why, const char *reason) {
    double t = now_ms(e);
    if (why != KV_FINISH_STOP) {
        int n = kv_detok_flush(e->model->tok, &r->detok, e->piece, e->piece_cap);
        if (n > 0) text_append(r, e->piece, (size_t)n);
    }
    kv_metrics_finished(e->metrics, &r->rm, why, t);
    kv_sched_finish(e->sched, &r->s, why);
    kv_spec_release(e->spec, &r->ss);
    r->finish = why;
    /* Text held back for a possible stop string goes out now: in the DONE
     * event, or before it as TOKEN(-1) events when it does not fit. */
    size_t tail = r->text_len > r->emitted ? r->text_len - r->emitted : 0;
    if (tail >= sizeof ((kv_event *)0)->text) {
        emit_text(e, r, NULL, r->text + r->emitted, tail);
        tail = 0;
    }
    kv_event *ev = local_event(e, KV_EVENT_DONE, r);
    if (ev) {
        ev->finish = why;
        copy_str(ev->reason, sizeof ev->reason, reason ? reason : "");
        if (tail > 0) emit_text(e, r, ev, r->text + r->emitted, tail);
    }
    r->emitted = r->text_len;
    kv_snap_request row;
    snap_row(e, r, &row);
    ring_push(&e->finished, &row);
    int li = live_find(e, r->s.id);
    if (li >= 0) {
        memmove(e->live + li, e->live + li + 1, (size_t)(e->n_live - li - 1) * sizeof *e->live);
        e->n_live--;
    }
    pthread_mutex_lock(&e->mu);
    id_rec *rec = &e->ids[r->s.id];
    rec->state = ID_FINISHED;
    rec->text = r->text;
    rec->len = (int)r->text_len;
    r->text = NULL;
    e->n_active--;
    pthread_mutex_unlock(&e->mu);
    ereq_free(r);
}

/* ---- creation ---- */

static int engine_init_sync(kv_engine *e) {
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca)) return -1;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&e->state_mu, NULL) || pthread_mutex_init(&e->pub_mu, NULL) ||
             pthread_mutex_init(&e->mu, NULL) || pthread_mutex_init(&e->hook_mu, NULL) ||
             pthread_cond_init(&e->ev_cond, &ca) || pthread_cond_init(&e->ctl_cond, &ca);
    pthread_condattr_destroy(&ca);
    return rc ? -1 : 0;
}

/* The forward pass's scratch plus the logits buffer: what the memory
 * breakdown calls activations, and what a memory.budget sets aside. */
static uint64_t activation_bytes(const kv_engine *e) {
    return kv_forward_activation_bytes(e->fwd) + (uint64_t)e->max_logits * e->n_vocab * sizeof(float);
}

kv_engine *kv_engine_new(const kv_config *cfg, kv_err *err) {
    if (!cfg) {
        kv_err_set(err, KV_ERR_INVAL, "engine: NULL config");
        return NULL;
    }
    if (kv_config_validate(cfg, err)) return NULL;
    kv_engine *e = calloc(1, sizeof *e);
    if (!e) {
        kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory");
        return NULL;
    }
    e->cfg = *cfg;
    e->t0_ns = kv_now_ns();
    e->next_id = 1;
    if (engine_init_sync(e)) {
        free(e);
        kv_err_set(err, KV_ERR_NOMEM, "engine: cannot create locks");
        return NULL;
    }
    ring_init(&e->steps, sizeof(kv_step_record), STEP_RING);
    ring_init(&e->decisions, sizeof(kv_decision), DECISION_RING);
    ring_init(&e->finished, sizeof(kv_snap_request), FINISHED_ROWS);
    e->step_delay_ms = cfg->ui.step_delay_ms;

    e->model = kv_model_load(cfg->model.path, cfg->model.tokenizer[0] ? cfg->model.tokenizer : NULL, err);
    if (!e->model) goto fail;
    const kv_hparams *hp = &e->model->hp;
    e->n_vocab = hp->n_vocab;
    e->be = kv_backend_create_on(cfg->backend, cfg->sim_device, cfg->threads, err);
    if (!e->be) goto fail;
    /* The virtual clock starts at 0 when the engine is ready; what the
     * setup below charges to the device (weight uploads) is not in it. */
    e->virt = kv_sim_is(e->be) && cfg->sim_clock;

    /* the KV cache */
    kv_cache_params *cp = &e->cache_params;
    cp->n_layers = hp->n_layers;
    cp->n_kv_heads = hp->n_kv_heads;
    cp->head_dim = hp->head_dim;
    cp->dtype = cfg->kv.dtype;
    cp->block_size = cfg->kv.block_size;
    cp->prefix_sharing = cfg->kv.prefix_sharing && cfg->kv.layout == KV_LAYOUT_PAGED;
    e->block_bytes = kv_cache_block_bytes(cp);

    /* The forward pass's buffers come first: a memory.budget gives the KV
     * cache what the weights and these activations leave. */
    e->spec_k = cfg->spec.method != KV_SPEC_OFF ? cfg->spec.k : 0;
    int T = cfg->scheduler.max_batched_tokens;
    int64_t ml = (int64_t)cfg->scheduler.max_seqs * (1 + e->spec_k);
    e->max_logits = (int)KV_MIN(ml, (int64_t)T);
    e->fwd = kv_forward_new(e->model, e->be, T, e->max_logits, err);
    if (!e->fwd) goto fail;
    uint64_t kv_memory = cfg->kv.memory;
    const char *kv_key = "kv.memory";
    if (cfg->kv.blocks == 0 && cfg->memory.budget > 0) {
        /* NOTE: a draft model's weights and cache (spec.method draft_model)
         * come on top of the budget: they are sized after the cache. */
        uint64_t act = activation_bytes(e);
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
    cp->n_blocks = cfg->kv.blocks > 0 ? cfg->kv.blocks : kv_cache_blocks_for_bytes(cp, kv_memory);
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
    e->sched = kv_sched_new(&e->sp, e->cache, err);
    if (!e->sched) goto fail;
    if (cfg->spec.method != KV_SPEC_OFF) {
        e->spec = kv_spec_new(cfg, e->model, e->be, e->cache, cfg->scheduler.max_seqs, T, err);
        if (!e->spec) goto fail;
        e->items = malloc((size_t)cfg->scheduler.max_seqs * sizeof *e->items);
        e->probs = malloc((size_t)e->n_vocab * sizeof *e->probs);
        if (!e->items || !e->probs) {
            kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory for speculative decoding");
            goto fail;
        }
    }
    e->logits = malloc((size_t)e->max_logits * (size_t)e->n_vocab * sizeof(float));
    e->sampler = kv_sampler_new(e->n_vocab);
    e->metrics = kv_metrics_new(cfg->sla.ttft_ms, cfg->sla.tpot_ms);
    e->piece_cap = (size_t)kv_tokenizer_max_piece(e->model->tok) + 16;
    e->piece = malloc(e->piece_cap);
    e->bmap = malloc((size_t)cp->n_blocks * sizeof *e->bmap);
    e->sreqs = malloc((size_t)cfg->scheduler.max_seqs * sizeof *e->sreqs);
    e->pub = kv_snapshot_new();
    e->pub_back = kv_snapshot_new();
    if (!e->logits || !e->sampler || !e->metrics || !e->piece || !e->bmap || !e->sreqs || !e->pub || !e->pub_back) {
        kv_err_set(err, KV_ERR_NOMEM, "engine: out of memory for %d logit rows of %d", e->max_logits, e->n_vocab);
        goto fail;
    }
    e->last_reader_ms = -1e9;
    if (e->virt) atomic_store(&e->v_offset_ms, -kv_sim_elapsed_s(e->be) * 1000.0);
    kv_err_clear(err);
    return e;
fail:
    kv_engine_free(e);
    return NULL;
}

static void ring_free(ring *r) { free(r->v); }

void kv_engine_free(kv_engine *e) {
    if (!e) return;
    kv_engine_stop(e);
    for (int i = 0; i < e->n_live; i++) {
        if (e->sched) kv_sched_finish(e->sched, &e->live[i]->s, KV_FINISH_CANCELLED);
        kv_spec_release(e->spec, &e->live[i]->ss);
        ereq_free(e->live[i]);
    }
    for (int i = 0; i < e->n_inbox; i++) ereq_free(e->inbox[i]);
    free(e->live);
    free(e->inbox);
    free(e->cancels);
    free(e->cancel_scratch);
    free(e->ev);
    for (int64_t i = 0; i < e->cap_ids; i++) free(e->ids[i].text);
    free(e->ids);
    free(e->pend_dec);
    free(e->pend_rej_ms);
    ring_free(&e->steps);
    ring_free(&e->decisions);
    ring_free(&e->finished);
    free(e->lev);
    free(e->bmap);
    free(e->sreqs);
    kv_snapshot_free(e->pub);
    kv_snapshot_free(e->pub_back);
    kv_snapshot_free(e->hook_snap);
    kv_metrics_free(e->metrics);
    kv_sampler_free(e->sampler);
    free(e->logits);
    free(e->piece);
    kv_forward_free(e->fwd);
    kv_spec_free(e->spec);
    free(e->items);
    free(e->probs);
    kv_sched_free(e->sched);
    kv_cache_free(e->cache);
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
    copy_str(ev.reason, sizeof ev.reason, err ? err->msg : "rejected");
    ev.t_ms = now_ms(e);
    push_event_locked(e, &ev);
    if (grow_arr((void **)&e->pend_dec, &e->cap_pend, e->n_pend + 1, sizeof *e->pend_dec) == 0) {
        int cap = e->cap_pend;
        double *t = realloc(e->pend_rej_ms, (size_t)cap * sizeof *t);
        if (t) {
            e->pend_rej_ms = t;
            kv_decision *d = &e->pend_dec[e->n_pend];
            d->kind = KV_DEC_REJECT;
            d->req = id;
            int hl = snprintf(d->text, sizeof d->text, "reject #%lld: ", (long long)id);
            copy_str(d->text + hl, sizeof d->text - (size_t)hl, err ? err->msg : "");
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
        size_t len = strlen(p->text);
        int add_bos = kv_tokenizer_add_bos(tok) && kv_tokenizer_bos(tok) >= 0;
        n = kv_tokenizer_encode(tok, p->text, len, add_bos, 1, NULL, 0, err);
        if (n < 0) return reject(e, p, n, err);
        if (n > 0) {
            ids = malloc((size_t)n * sizeof *ids);
            if (!ids) return kv_err_set(err, KV_ERR_NOMEM, "submit: out of memory for %d prompt tokens", n);
            kv_tokenizer_encode(tok, p->text, len, add_bos, 1, ids, n, err);
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
    } else if (blocks_for(n + p->max_tokens, bs) > nb ||
               blocks_for(n, bs) + e->sp.watermark_blocks > nb) {
        code = kv_err_set(err, KV_ERR_RANGE, "prompt (%d) + max_tokens (%d) needs %d blocks; the cache has %d", n,
                          p->max_tokens, blocks_for(n + p->max_tokens, bs), nb);
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
        grow_arr((void **)&e->inbox, &e->cap_inbox, e->n_inbox + 1, sizeof *e->inbox)) {
        pthread_mutex_unlock(&e->mu);
        goto nomem;
    }
    e->next_id++;
    r->s.id = id;
    r->s.seq.id = (int)id;
    r->s.seq.tag = p->session;
    r->s.arrival_ms = now_ms(e);
    kv_req_metrics_init(&r->rm, r->s.arrival_ms, n);
    kv_rng_seed(&r->rng, p->sampling.seed + (uint64_t)id);
    kv_spec_seq_init(&r->ss, e->spec, id, p->session);
    e->ids[id].state = ID_ACTIVE;
    e->n_active++;
    e->inbox[e->n_inbox++] = r;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
    return id;
nomem:
    ereq_free(r);
    return kv_err_set(err, KV_ERR_NOMEM, "submit: out of memory");
}

int kv_engine_cancel(kv_engine *e, int64_t id) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->mu);
    int rc = KV_ERR_INVAL;
    if (id > 0 && id < e->cap_ids && e->ids[id].state == ID_ACTIVE &&
        grow_arr((void **)&e->cancels, &e->cap_cancels, e->n_cancels + 1, sizeof *e->cancels) == 0) {
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
    int n = KV_MIN(cap, e->ev_n);
    for (int i = 0; i < n; i++) out[i] = e->ev[(e->ev_head + i) % e->ev_cap];
    if (n > 0) {
        e->ev_head = (e->ev_head + n) % e->ev_cap;
        e->ev_n -= n;
    }
    pthread_mutex_unlock(&e->mu);
    return n;
}

static void deadline_after(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int kv_engine_wait(kv_engine *e, int timeout_ms) {
    if (!e) return 0;
    struct timespec ts;
    deadline_after(&ts, timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&e->mu);
    while (e->ev_n == 0 && timeout_ms > 0)
        if (pthread_cond_timedwait(&e->ev_cond, &e->mu, &ts) == ETIMEDOUT) break;
    int any = e->ev_n > 0;
    pthread_mutex_unlock(&e->mu);
    return any;
}

/* ---- the step ---- */

/* Moves submitted requests into the scheduler and pending rejections into
 * the records (state_mu held). */
static void drain_inbox(kv_engine *e, int in_step) {
    pthread_mutex_lock(&e->mu);
    int n = e->n_inbox;
    for (int i = 0; i < n; i++) {
        ereq *r = e->inbox[i];
        /* live stays sorted by id: inbox ids increase */
        if (grow_arr((void **)&e->live, &e->cap_live, e->n_live + 1, sizeof *e->live) ||
            kv_sched_add(e->sched, &r->s)) {
            /* cannot queue it: keep it in the inbox for the next step */
            memmove(e->inbox, e->inbox + i, (size_t)(n - i) * sizeof *e->inbox);
            e->n_inbox = n - i;
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->live[e->n_live++] = r;
        kv_metrics_submitted(e->metrics, r->s.arrival_ms);
    }
    e->n_inbox = 0;
    for (int i = 0; i < e->n_pend; i++) {
        kv_metrics_submitted(e->metrics, e->pend_rej_ms[i]);
        kv_metrics_rejected(e->metrics, e->pend_rej_ms[i]);
        if (in_step) {
            kv_sched_decide(e->sched, KV_DEC_REJECT, e->pend_dec[i].req, e->pend_dec[i].text);
        } else { /* outside a step: straight into the record */
            e->pend_dec[i].step = e->step;
            ring_push(&e->decisions, &e->pend_dec[i]);
        }
    }
    e->n_pend = 0;
    pthread_mutex_unlock(&e->mu);
}

static void process_cancels(kv_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->n_cancels;
    if (grow_arr((void **)&e->cancel_scratch, &e->cap_cancel_scratch, n, sizeof(int64_t))) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (n) memcpy(e->cancel_scratch, e->cancels, (size_t)n * sizeof(int64_t));
    e->n_cancels = 0;
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++) {
        int li = live_find(e, e->cancel_scratch[i]);
        if (li >= 0) finish_req(e, e->live[li], KV_FINISH_CANCELLED, "cancelled");
    }
}

/* Speculative decoding, before scheduling: every running request whose
 * next step is a decode gets a draft length (and ngram drafts their
 * tokens); requests that left the device give their draft-cache blocks
 * back. Returns how many items it planned (e->items). */
static int spec_plan(kv_engine *e) {
    if (!e->spec) return 0;
    kv_sreq *const *q;
    int nq = kv_sched_waiting(e->sched, &q);
    for (int i = 0; i < nq; i++) kv_spec_release(e->spec, &((ereq *)q[i])->ss);
    nq = kv_sched_swapped(e->sched, &q);
    for (int i = 0; i < nq; i++) kv_spec_release(e->spec, &((ereq *)q[i])->ss);
    kv_sreq *const *run;
    int nrun = kv_sched_running(e->sched, &run), n = 0;
    int cap = e->cfg.scheduler.max_seqs;
    for (int i = 0; i < nrun && n < cap; i++) {
        ereq *r = (ereq *)run[i]; /* kv_sreq is ereq's first member */
        if (r->s.state != KV_REQ_RUNNING || r->s.n_tokens - r->s.n_computed != 1 || kv_sreq_n_generated(&r->s) == 0)
            continue;
        e->items[n++] = (kv_spec_item){.r = &r->s, .ss = &r->ss, .sampling = &r->sampling, .rng = &r->rng};
    }
    kv_spec_plan(e->spec, e->items, n);
    return n;
}

/* Samples the tokens of request r from its logit rows: one token for a
 * plain step; after drafts, the verified ones and the target's next token
 * (kv_spec_verify). Writes the new tokens to out and returns how many. */
static int sample_request(kv_engine *e, ereq *r, int32_t *out) {
    kv_sreq *s = &r->s;
    const float *lg = e->logits + (size_t)s->logit_row * (size_t)e->n_vocab;
    if (s->n_sched_draft > 0 && e->spec) {
        kv_spec_item it = {.r = s, .ss = &r->ss, .sampling = &r->sampling, .rng = &r->rng};
        return kv_spec_verify(e->spec, &it, e->sampler, lg, e->n_vocab, e->probs, out);
    }
    out[0] = kv_sampler_sample(e->sampler, &r->sampling, lg, s->tokens, s->n_tokens, &r->rng);
    return 1;
}

/* Feeds r's new tokens to the detokenizer, the stop strings and the event
 * stream. verified: the tokens come from a verify step, whose first
 * n_accepted are accepted drafts and whose last is the target's own token
 * (the bonus after all drafts, or the correction after a rejected one).
 * Returns the finish reason, or KV_FINISH_NONE. */
static kv_finish emit_tokens(kv_engine *e, ereq *r, const int32_t *toks, int n, int verified, int n_accepted) {
    kv_finish fin = KV_FINISH_NONE;
    for (int i = 0; i < n && fin == KV_FINISH_NONE; i++) {
        int32_t t = toks[i];
        kv_event *ev = local_event(e, KV_EVENT_TOKEN, r);
        if (ev) {
            ev->token = t;
            ev->source = verified ? (i < n_accepted ? KV_TOKSRC_DRAFT : KV_TOKSRC_BONUS) : KV_TOKSRC_DECODE;
        }
        int eog = kv_tokenizer_is_eog(e->model->tok, t);
        if (eog && !r->ignore_eos) {
            fin = KV_FINISH_EOS;
            continue;
        }
        size_t before = r->text_len;
        int nb = kv_detok_push(e->model->tok, &r->detok, t, e->piece, e->piece_cap);
        if (nb > 0) text_append(r, e->piece, (size_t)nb);
        if (stop_match(r, before)) fin = KV_FINISH_STOP;
        size_t safe = fin == KV_FINISH_STOP ? r->text_len : r->text_len - stop_holdback(r);
        if (safe > r->emitted) {
            emit_text(e, r, ev, r->text + r->emitted, safe - r->emitted);
            r->emitted = safe;
        }
    }
    if (fin == KV_FINISH_NONE && kv_sreq_n_generated(&r->s) >= r->s.max_tokens) fin = KV_FINISH_LENGTH;
    return fin;
}

static void publish(kv_engine *e);
static int build_snapshot(kv_engine *e, kv_snapshot *s);

/* Hands the step's events to readers, all at once (state_mu held). Called
 * after publish() so a reader who saw an event gets a snapshot at least as
 * new as the step that made it. */
static void flush_events(kv_engine *e) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_lev; i++) push_event_locked(e, &e->lev[i]);
    e->n_lev = 0;
    e->steps_done = e->step;
    pthread_cond_broadcast(&e->ev_cond);
    pthread_mutex_unlock(&e->mu);
}

/* One iteration (state_mu held). Returns 1 when it did something. */
static int step_locked(kv_engine *e) {
    double t0 = now_ms(e);
    const double sim0 = kv_sim_elapsed_s(e->be); /* 0 unless the backend is sim */
    int emitted = 0;
    uint64_t step = e->step + 1;
    kv_sched_begin_step(e->sched, step, t0);
    drain_inbox(e, 1);
    process_cancels(e);
    double d0 = now_ms(e);
    int n_items = spec_plan(e);
    double d_plan = now_ms(e) - d0;
    const kv_sched_out *o;
    int n = kv_sched_schedule(e->sched, t0, &o);
    int rc = 0;
    if (n < 0) {
        rc = n;
        n = 0;
    }
    if (n_items > 0) {
        /* model drafts for exactly what the scheduler kept, batched over
         * every speculating sequence */
        double d1 = now_ms(e);
        kv_err derr;
        kv_err_clear(&derr);
        if (kv_spec_draft(e->spec, e->sched, e->items, n_items, e->sampler, &derr) != 0)
            kv_sched_decide(e->sched, KV_DEC_SPEC, 0, derr.msg); /* verified as placeholders */
        d_plan += now_ms(e) - d1;
    }
    double f0 = now_ms(e), f1 = f0;
    /* queue time and prefix hits are measured at the first admission */
    for (int i = 0; i < o->n_reqs; i++) {
        ereq *r = (ereq *)o->reqs[i];
        if (r->rm.admit_ms < 0 && r->s.admitted)
            kv_metrics_admitted(e->metrics, &r->rm, r->s.first_admit_ms, r->s.n_prefix_hit);
    }
    if (n > 0) {
        kv_batch b = {.n_tokens = o->n_tokens, .tokens = o->tokens,
                      .ab = {.n_tokens = o->n_tokens, .pos = o->pos, .seq = o->seq, .slot = o->slot,
                             .n_seqs = o->n_reqs, .tables = o->tables},
                      .n_logits = o->n_logits, .logit_rows = o->logit_rows, .n_layers = 0};
        kv_err ferr;
        kv_err_clear(&ferr);
        int frc = kv_forward_run(e->fwd, kv_cache_pages(e->cache), &b, e->logits, &ferr);
        f1 = now_ms(e);
        if (n_items > 0) {
            /* verification's share of the forward: the rows of sequences
             * with drafts (their last token and the drafts) */
            int spec_rows = 0;
            for (int i = 0; i < o->n_reqs; i++)
                if (o->reqs[i]->n_sched_draft > 0) spec_rows += o->reqs[i]->n_sched;
            kv_metrics_spec_time(e->metrics, d_plan, (f1 - f0) * spec_rows / (double)o->n_tokens);
        }
        /* o->reqs changes as requests finish: walk a copy */
        int nr = o->n_reqs;
        for (int i = 0; i < nr; i++) e->sreqs[i] = (ereq *)o->reqs[i]; /* kv_sreq is ereq's first member */
        for (int i = 0; i < nr; i++) {
            ereq *r = e->sreqs[i];
            if (frc) {
                finish_req(e, r, KV_FINISH_ERROR, ferr.msg);
                continue;
            }
            int32_t toks[40]; /* spec.k <= 32 (config.c) */
            int nt = 0;
            int drafted = r->s.n_logits > 0 ? r->s.n_sched_draft : 0;
            if (r->s.n_logits > 0) {
                nt = sample_request(e, r, toks);
                int room = r->s.max_tokens - kv_sreq_n_generated(&r->s);
                if (nt > room) nt = room;
                /* nothing after an end-of-generation token is kept */
                if (!r->ignore_eos)
                    for (int j = 0; j < nt; j++)
                        if (kv_tokenizer_is_eog(e->model->tok, toks[j])) {
                            nt = j + 1;
                            break;
                        }
            }
            int accepted = drafted > 0 ? nt - 1 : 0;
            if (kv_sched_update(e->sched, &r->s, toks, nt) != 0) {
                finish_req(e, r, KV_FINISH_ERROR, "internal: scheduler update refused");
                continue;
            }
            if (drafted > 0) {
                char note[sizeof ((kv_decision *)0)->text];
                kv_spec_item it = {.r = &r->s, .ss = &r->ss, .sampling = &r->sampling, .rng = &r->rng};
                kv_spec_feedback(e->spec, &it, drafted, accepted, note, sizeof note);
                kv_metrics_spec(e->metrics, drafted, accepted);
                kv_sched_decide(e->sched, KV_DEC_SPEC, r->s.id, note);
            }
            if (nt == 0) continue;
            kv_metrics_tokens(e->metrics, &r->rm, f1, nt);
            emitted += nt;
            kv_finish fin = emit_tokens(e, r, r->s.tokens + r->s.n_tokens - nt, nt, drafted > 0, accepted);
            if (fin != KV_FINISH_NONE) finish_req(e, r, fin, NULL);
        }
        if (frc) rc = frc;
    }
    kv_step_record rec;
    const kv_decision *dec;
    int n_dec;
    kv_sched_end_step(e->sched, &rec, &dec, &n_dec);
    int did = n > 0 || n_dec > 0 || e->n_lev > 0;
    if (did) {
        e->step = step;
        double t1 = now_ms(e);
        rec.dur_ms = t1 - t0;
        rec.forward_ms = f1 - f0;
        rec.sim_ms = (kv_sim_elapsed_s(e->be) - sim0) * 1000.0;
        ring_push(&e->steps, &rec);
        for (int i = 0; i < n_dec; i++) ring_push(&e->decisions, &dec[i]);
        /* KV utilisation: committed tokens over the slots their blocks hold */
        kv_sreq *const *run;
        int nrun = kv_sched_running(e->sched, &run);
        uint64_t held = 0, reserved = 0;
        for (int i = 0; i < nrun; i++) {
            held += (uint64_t)run[i]->n_computed;
            reserved += (uint64_t)run[i]->seq.n_blocks * (uint64_t)e->cache_params.block_size;
        }
        kv_metrics_step(e->metrics, rec.dur_ms, held, reserved, nrun, rec.n_prefill_tokens);
        kv_metrics_sim_step(e->metrics, rec.sim_ms, emitted);
        for (int i = 0; i < rec.n_preempted; i++) kv_metrics_preempted(e->metrics, 0);
        for (int i = 0; i < rec.n_swapped_out; i++) kv_metrics_preempted(e->metrics, 1);
        for (int i = 0; i < rec.n_swapped_in; i++) kv_metrics_swapped_in(e->metrics);
    }
    if (rc < 0) return rc;
    return did ? 1 : 0;
}

/* The step hook, in two halves around the release of state_mu so the hook
 * runs while front ends can take snapshots. hook_prepare (state_mu held,
 * after a step): when the step counter moved and a hook is set, builds its
 * snapshot and returns 1 with hook_mu held; hook_call then calls the hook
 * and releases hook_mu. NOTE: a step whose snapshot cannot be built (out of
 * memory) is not reported; its records reach the hook with the next one. */
static int hook_prepare(kv_engine *e, uint64_t step_before) {
    if (e->step == step_before) return 0;
    pthread_mutex_lock(&e->hook_mu);
    if (e->hook && build_snapshot(e, e->hook_snap) == 0) return 1;
    pthread_mutex_unlock(&e->hook_mu);
    return 0;
}

static void hook_call(kv_engine *e) {
    e->hook(e->hook_user, e->hook_snap);
    pthread_mutex_unlock(&e->hook_mu);
}

int kv_engine_step(kv_engine *e) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->mu);
    int started = e->thread_started;
    pthread_mutex_unlock(&e->mu);
    if (started) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->state_mu);
    uint64_t before = e->step;
    int rc = step_locked(e);
    flush_events(e);
    int hooked = hook_prepare(e, before);
    pthread_mutex_unlock(&e->state_mu);
    if (hooked) hook_call(e);
    return rc;
}

int kv_engine_run_until_idle(kv_engine *e) {
    if (!e) return KV_ERR_INVAL;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int active = e->n_active, started = e->thread_started, pending = e->n_cancels + e->n_pend;
        if (started && active > 0) {
            struct timespec ts;
            deadline_after(&ts, 50);
            pthread_cond_timedwait(&e->ev_cond, &e->mu, &ts);
        }
        pthread_mutex_unlock(&e->mu);
        if (active == 0 && pending == 0) return 0;
        if (started) continue;
        int rc = kv_engine_step(e);
        if (rc < 0) return rc;
        if (rc == 0 && active > 0) return KV_AGAIN; /* nothing can run: should not happen */
    }
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

        pthread_mutex_lock(&e->state_mu);
        uint64_t before = e->step;
        int rc = step_locked(e);
        publish(e);
        flush_events(e);
        int hooked = hook_prepare(e, before);
        pthread_mutex_unlock(&e->state_mu);
        if (hooked) hook_call(e);

        pthread_mutex_lock(&e->mu);
        int delay = e->step_delay_ms;
        if (rc <= 0 && delay < 1) delay = 1; /* no progress: do not spin */
        if (delay > 0 && !e->stop) {
            struct timespec ts;
            deadline_after(&ts, delay);
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

void kv_engine_pause(kv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->paused = 1;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
}

void kv_engine_resume(kv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->paused = 0;
    pthread_cond_broadcast(&e->ctl_cond);
    pthread_mutex_unlock(&e->mu);
}

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

/* ---- snapshots ---- */

kv_snapshot *kv_snapshot_new(void) { return calloc(1, sizeof(kv_snapshot)); }

void kv_snapshot_free(kv_snapshot *s) {
    if (!s) return;
    free(s->requests);
    free(s->tables);
    free(s->running);
    free(s->waiting);
    free(s->swapped);
    free(s->blocks);
    free(s->steps);
    free(s->decisions);
    free(s);
}

/* Grows one snapshot array to hold n entries. */
static int snap_need(void **arr, int *cap, int n, size_t elem) {
    if (n <= *cap) return 0;
    int nc = *cap ? *cap : 16;
    while (nc < n) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return KV_ERR_NOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

/* The three queue arrays share cap_queue. */
static int snap_queues(kv_snapshot *s, int n) {
    if (n <= s->cap_queue) return 0;
    int nc = s->cap_queue ? s->cap_queue : 16;
    while (nc < n) nc *= 2;
    int64_t **arrs[3] = {&s->running, &s->waiting, &s->swapped};
    for (int i = 0; i < 3; i++) {
        int64_t *p = realloc(*arrs[i], (size_t)nc * sizeof *p);
        if (!p) return KV_ERR_NOMEM; /* cap_queue unchanged: the grown ones are merely larger */
        *arrs[i] = p;
    }
    s->cap_queue = nc;
    return 0;
}

static void snap_row(const kv_engine *e, const ereq *r, kv_snap_request *o) {
    const kv_sreq *s = &r->s;
    memset(o, 0, sizeof *o);
    o->id = s->id;
    o->session = s->session;
    o->state = s->state;
    o->priority = s->priority;
    o->n_prompt = s->n_prompt;
    o->n_computed = s->n_computed;
    o->n_generated = kv_sreq_n_generated(s);
    o->max_tokens = s->max_tokens;
    o->n_prefix_hit = s->n_prefix_hit;
    o->n_blocks = s->seq.swapped ? 0 : s->seq.n_blocks;
    o->table_offset = 0;
    const int bs = e->cache_params.block_size;
    int bi = s->n_computed / bs;
    if (!s->seq.swapped && bi < s->seq.n_blocks) {
        o->next_block = s->seq.blocks[bi];
        o->next_offset = s->n_computed % bs;
    } else {
        o->next_block = -1;
        o->next_offset = 0;
    }
    o->preemptions = s->preemptions;
    o->arrival_ms = s->arrival_ms;
    o->queue_ms = s->admitted ? s->first_admit_ms - s->arrival_ms : -1;
    o->ttft_ms = kv_req_ttft_ms(&r->rm);
    o->tpot_ms = kv_req_tpot_ms(&r->rm);
    o->last_itl_ms = r->rm.last_itl_ms;
    o->e2e_ms = kv_req_e2e_ms(&r->rm);
    o->finish = r->finish;
    copy_str(o->wait_reason, sizeof o->wait_reason, s->wait_reason);
    o->spec_k = !e->spec || r->ss.cooldown > 0 ? 0 : e->cfg.spec.adaptive ? r->ss.k : e->cfg.spec.k;
    o->spec_drafts = r->ss.drafts;
    o->spec_drafted = r->ss.n_drafted;
    o->spec_accepted = r->ss.n_accepted;
}

/* Builds a snapshot from the live state (state_mu held). */
static int build_snapshot(kv_engine *e, kv_snapshot *s) {
    drain_inbox(e, 0);
    double t = now_ms(e);
    pthread_mutex_lock(&e->mu);
    s->thread_running = e->thread_started;
    s->paused = e->paused;
    s->step_delay_ms = e->step_delay_ms;
    pthread_mutex_unlock(&e->mu);
    s->step = e->step;
    s->now_ms = t;
    snprintf(s->model_name, sizeof s->model_name, "%s", e->model->name);
    snprintf(s->backend, sizeof s->backend, "%s", e->be->ops->name);
    {
        kv_sim_stats st;
        kv_sim_stats_get(e->be, &st);
        snprintf(s->sim_device, sizeof s->sim_device, "%s", st.valid && st.device ? st.device->name : "");
    }
    s->block_size = e->cache_params.block_size;
    s->n_blocks = e->cache_params.n_blocks;
    s->kv_dtype = e->cache_params.dtype;
    s->policy = e->sp.policy;
    s->layout = e->sp.layout;
    s->prefix_sharing = e->sp.prefix_sharing;
    s->spec_method = e->cfg.spec.method;
    s->kv_bytes_per_token = e->block_bytes / (uint64_t)e->cache_params.block_size;
    s->sla_ttft_ms = e->cfg.sla.ttft_ms;
    s->sla_tpot_ms = e->cfg.sla.tpot_ms;

    kv_cache_stats cs;
    kv_cache_get_stats(e->cache, &cs);
    s->prefix_lookups = cs.lookups;
    s->prefix_hit_blocks = cs.hit_blocks;
    s->prefix_hit_tokens = cs.hit_tokens;
    s->evictions = cs.evictions;
    s->cow_copies = cs.cow_copies;
    s->blocks_free = cs.n_free;
    s->blocks_used = cs.n_used;
    s->blocks_cached = cs.n_cached;
    s->blocks_shared = cs.n_shared;

    kv_sreq *const *run, *const *wait, *const *sw;
    int nrun = kv_sched_running(e->sched, &run);
    int nwait = kv_sched_waiting(e->sched, &wait);
    int nsw = kv_sched_swapped(e->sched, &sw);
    kv_metrics_summarize(e->metrics, t, nrun + nwait + nsw > 0, &s->metrics);

    kv_mem_breakdown *m = &s->mem;
    memset(m, 0, sizeof *m);
    m->weights = e->model->weight_bytes + kv_spec_weight_bytes(e->spec);
    m->kv_used = (uint64_t)cs.n_used * e->block_bytes;
    m->kv_cached = (uint64_t)cs.n_cached * e->block_bytes;
    m->kv_free = (uint64_t)cs.n_free * e->block_bytes;
    m->kv_swap_used = (uint64_t)cs.n_swap_used * e->block_bytes;
    m->kv_swap_total = (uint64_t)cs.n_swap_blocks * e->block_bytes;
    m->activations = activation_bytes(e);
    m->other = kv_metrics_bytes(e->metrics) + (uint64_t)e->cap_live * sizeof(ereq *) +
               (uint64_t)e->n_live * sizeof(ereq) + (uint64_t)e->cap_ids * sizeof(id_rec) +
               (uint64_t)e->cache_params.n_blocks * 64 + kv_spec_kv_bytes(e->spec);
    m->budget = e->cfg.kv.blocks == 0 ? e->cfg.memory.budget : 0;
    if (e->be->ops->mem_info) e->be->ops->mem_info(e->be, &m->backend);

    /* requests: waiting, running, preempted, swapped, then finished */
    int n_req = nrun + nwait + nsw + e->finished.n;
    int n_tab = 0;
    for (int i = 0; i < nrun; i++) n_tab += run[i]->seq.n_blocks;
    if (snap_need((void **)&s->requests, &s->cap_requests, n_req, sizeof *s->requests) ||
        snap_need((void **)&s->tables, &s->cap_tables, n_tab, sizeof *s->tables) ||
        snap_queues(s, KV_MAX(KV_MAX(nrun, nwait), nsw)) ||
        snap_need((void **)&s->blocks, &s->cap_blocks, s->n_blocks, sizeof *s->blocks) ||
        snap_need((void **)&s->steps, &s->cap_steps, e->steps.n, sizeof *s->steps) ||
        snap_need((void **)&s->decisions, &s->cap_decisions, e->decisions.n, sizeof *s->decisions))
        return KV_ERR_NOMEM;
    int k = 0;
    n_tab = 0;
    for (int i = 0; i < nwait; i++)
        if (wait[i]->state == KV_REQ_WAITING) snap_row(e, (const ereq *)wait[i], &s->requests[k++]);
    for (int i = 0; i < nrun; i++) {
        kv_snap_request *row = &s->requests[k++];
        snap_row(e, (const ereq *)run[i], row);
        row->table_offset = n_tab;
        if (run[i]->seq.n_blocks > 0)
            memcpy(s->tables + n_tab, run[i]->seq.blocks, (size_t)run[i]->seq.n_blocks * sizeof *s->tables);
        n_tab += run[i]->seq.n_blocks;
    }
    for (int i = 0; i < nwait; i++)
        if (wait[i]->state != KV_REQ_WAITING) snap_row(e, (const ereq *)wait[i], &s->requests[k++]);
    for (int i = 0; i < nsw; i++) snap_row(e, (const ereq *)sw[i], &s->requests[k++]);
    for (int i = 0; i < e->finished.n; i++) s->requests[k++] = *(kv_snap_request *)ring_at(&e->finished, i);
    s->n_requests = k;
    s->n_table_entries = n_tab;
    s->n_running = nrun;
    s->n_waiting = nwait;
    s->n_swapped = nsw;
    for (int i = 0; i < nrun; i++) s->running[i] = run[i]->id;
    for (int i = 0; i < nwait; i++) s->waiting[i] = wait[i]->id;
    for (int i = 0; i < nsw; i++) s->swapped[i] = sw[i]->id;

    kv_cache_block_map(e->cache, e->bmap);
    for (int b = 0; b < s->n_blocks; b++) {
        const kv_block_info *bi = &e->bmap[b];
        kv_snap_block *o = &s->blocks[b];
        o->state = bi->state;
        o->shared = bi->refcount >= 2;
        o->refcount = bi->refcount;
        o->fill = bi->fill;
        o->owner = bi->state == KV_BLOCK_FREE ? -1 : bi->owner;
        o->session = bi->state == KV_BLOCK_FREE ? -1 : bi->owner_tag;
    }
    s->n_steps = e->steps.n;
    for (int i = 0; i < e->steps.n; i++) s->steps[i] = *(kv_step_record *)ring_at(&e->steps, i);
    s->n_decisions = e->decisions.n;
    for (int i = 0; i < e->decisions.n; i++) s->decisions[i] = *(kv_decision *)ring_at(&e->decisions, i);
    return 0;
}

/* Deep copy of a snapshot (readers take the published one). */
static int snap_copy(kv_snapshot *d, const kv_snapshot *s) {
    kv_snapshot keep = *d;
    if (snap_need((void **)&keep.requests, &keep.cap_requests, s->n_requests, sizeof *s->requests) ||
        snap_need((void **)&keep.tables, &keep.cap_tables, s->n_table_entries, sizeof *s->tables) ||
        snap_need((void **)&keep.blocks, &keep.cap_blocks, s->n_blocks, sizeof *s->blocks) ||
        snap_need((void **)&keep.steps, &keep.cap_steps, s->n_steps, sizeof *s->steps) ||
        snap_need((void **)&keep.decisions, &keep.cap_decisions, s->n_decisions, sizeof *s->decisions)) {
        *d = keep;
        return KV_ERR_NOMEM;
    }
    if (snap_queues(&keep, KV_MAX(KV_MAX(s->n_running, s->n_waiting), s->n_swapped))) {
        *d = keep;
        return KV_ERR_NOMEM;
    }
    *d = *s;
    d->requests = keep.requests;
    d->tables = keep.tables;
    d->running = keep.running;
    d->waiting = keep.waiting;
    d->swapped = keep.swapped;
    d->blocks = keep.blocks;
    d->steps = keep.steps;
    d->decisions = keep.decisions;
    d->cap_requests = keep.cap_requests;
    d->cap_tables = keep.cap_tables;
    d->cap_queue = keep.cap_queue;
    d->cap_blocks = keep.cap_blocks;
    d->cap_steps = keep.cap_steps;
    d->cap_decisions = keep.cap_decisions;
#define CP(f, n) if ((n) > 0) memcpy(d->f, s->f, (size_t)(n) * sizeof *s->f)
    CP(requests, s->n_requests);
    CP(tables, s->n_table_entries);
    CP(running, s->n_running);
    CP(waiting, s->n_waiting);
    CP(swapped, s->n_swapped);
    CP(blocks, s->n_blocks);
    CP(steps, s->n_steps);
    CP(decisions, s->n_decisions);
#undef CP
    return 0;
}

/* After a step of the background thread (state_mu held): refresh the
 * published copy while someone takes snapshots (within the last second),
 * so a front end drawing at any frame rate finds one at most a step old and
 * a headless run pays nothing. */
static void publish(kv_engine *e) {
    pthread_mutex_lock(&e->pub_mu);
    int want = wall_ms(e) - e->last_reader_ms < 1000;
    pthread_mutex_unlock(&e->pub_mu);
    if (!want) return;
    if (build_snapshot(e, e->pub_back) != 0) return;
    pthread_mutex_lock(&e->pub_mu);
    kv_snapshot *t = e->pub;
    e->pub = e->pub_back;
    e->pub_back = t;
    e->pub_filled = 1;
    pthread_mutex_unlock(&e->pub_mu);
}

int kv_engine_snapshot(kv_engine *e, kv_snapshot *s) {
    if (!e || !s) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->pub_mu);
    double t = wall_ms(e); /* readers are timed on the host, whatever the engine's clock */
    /* Nobody read within the last second: the steps since did not publish,
     * so the copy may be arbitrarily old; wait for the step instead. */
    int stale = t - e->last_reader_ms >= 1000;
    e->last_reader_ms = t;
    pthread_mutex_unlock(&e->pub_mu);
    if ((stale ? pthread_mutex_lock(&e->state_mu) : pthread_mutex_trylock(&e->state_mu)) == 0) {
        int rc = build_snapshot(e, s);
        /* A published copy older than this one (no reader was around when
         * the steps ran) is replaced, so the next reader that finds a step
         * running never goes back in time. */
        pthread_mutex_lock(&e->pub_mu);
        if (rc == 0 && (!e->pub_filled || e->pub->step < s->step) && snap_copy(e->pub, s) == 0) e->pub_filled = 1;
        pthread_mutex_unlock(&e->pub_mu);
        pthread_mutex_unlock(&e->state_mu);
        return rc;
    }
    /* a step is running: take the copy published after the last one */
    pthread_mutex_lock(&e->pub_mu);
    int rc = snap_copy(s, e->pub);
    pthread_mutex_unlock(&e->pub_mu);
    pthread_mutex_lock(&e->mu);
    s->thread_running = e->thread_started;
    s->paused = e->paused;
    s->step_delay_ms = e->step_delay_ms;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* ---- finished requests, metrics, tracing ---- */

int kv_engine_request_text(kv_engine *e, int64_t id, char *buf, size_t cap) {
    if (!e) return -1;
    pthread_mutex_lock(&e->mu);
    int n = -1;
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

void kv_engine_metrics(kv_engine *e, kv_metrics_summary *out) {
    if (!e || !out) return;
    pthread_mutex_lock(&e->state_mu);
    drain_inbox(e, 0);
    kv_sreq *const *q;
    int n = kv_sched_running(e->sched, &q) + kv_sched_waiting(e->sched, &q) + kv_sched_swapped(e->sched, &q);
    kv_metrics_summarize(e->metrics, now_ms(e), n > 0, out);
    pthread_mutex_unlock(&e->state_mu);
}

void kv_engine_metrics_reset(kv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->state_mu);
    drain_inbox(e, 0);
    kv_metrics_reset(e->metrics);
    pthread_mutex_unlock(&e->state_mu);
}

/* A running request's registered prefix blocks must be found again by its
 * verified tokens: commit never saw a rejected draft. */
static int check_prefix(kv_cache *c, const kv_sreq *r, char *msg, size_t cap) {
    if (!kv_cache_params_of(c)->prefix_sharing || r->seq.swapped) return 0;
    int bs = kv_cache_params_of(c)->block_size;
    int want = r->seq.n_hashed * bs;
    if (want == 0) return 0;
    int got = kv_cache_match_prefix(c, r->tokens, KV_MIN(r->n_tokens, want + 1));
    if (got < want) {
        snprintf(msg, cap, "#%lld: %d registered tokens, only %d found by its tokens", (long long)r->id, want, got);
        return -1;
    }
    return 0;
}

int kv_engine_check(kv_engine *e, char *msg, size_t cap) {
    if (!e) return -1;
    pthread_mutex_lock(&e->state_mu);
    int rc = kv_sched_check(e->sched, msg, cap);
    for (int i = 0; i < e->n_live && rc == 0; i++)
        if (e->live[i]->s.state == KV_REQ_RUNNING) rc = check_prefix(e->cache, &e->live[i]->s, msg, cap);
    if (rc == 0 && e->spec) {
        kv_spec_seq **ss = malloc((size_t)(e->n_live > 0 ? e->n_live : 1) * sizeof *ss);
        int *known = malloc((size_t)(e->n_live > 0 ? e->n_live : 1) * sizeof *known);
        if (!ss || !known) {
            snprintf(msg, cap, "out of memory");
            rc = -1;
        } else {
            for (int i = 0; i < e->n_live; i++) {
                ss[i] = &e->live[i]->ss;
                known[i] = e->live[i]->s.n_tokens;
            }
            rc = kv_spec_check(e->spec, ss, known, e->n_live, msg, cap);
        }
        free(ss);
        free(known);
    }
    pthread_mutex_unlock(&e->state_mu);
    return rc;
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
    ring_set_limit(&e->steps, on ? 0 : STEP_RING);
    ring_set_limit(&e->decisions, on ? 0 : DECISION_RING);
    pthread_mutex_unlock(&e->state_mu);
    return 0;
}

/* ---- the clock ---- */

double kv_engine_now_ms(kv_engine *e) { return e ? now_ms(e) : 0.0; }
int kv_engine_clock_is_virtual(const kv_engine *e) { return e && e->virt; }

int kv_engine_advance_clock(kv_engine *e, double ms) {
    if (!e || !e->virt || !(ms > 0) || !isfinite(ms)) return KV_ERR_INVAL;
    double cur = atomic_load(&e->v_offset_ms);
    while (!atomic_compare_exchange_weak(&e->v_offset_ms, &cur, cur + ms)) {
    }
    return 0;
}
