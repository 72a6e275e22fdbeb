/* snapshot.c - plain-data views of the engine for front ends: snapshots
 * built from the live state, the copy published after each step for
 * readers that come mid-step, the metrics summary and the consistency
 * check. The engine's shared state is in engine_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/common.h"
#include "../base/vec.h"
#include "engine_internal.h"

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

/* The three queue arrays share cap_queue. */
/* The scheduler's chain counters and batch cap, into a metrics summary. */
static void engine_sched_summary(kv_engine *e, kv_metrics_summary *m) {
    kv_sched_counters c;
    kv_sched_get_counters(e->sched, &c);
    m->preemption_chains = c.chains;
    m->chained_preemptions = c.chained_preemptions;
    m->longest_preemption_chain = c.longest_chain;
    m->tokens_discarded = c.tokens_discarded;
    m->tokens_recomputed = c.tokens_recomputed;
    m->batch_cap = c.batch_cap;
    m->batch_goal_ms = c.batch_goal_ms;
}

static int snap_queues(kv_snapshot *s, int n) {
    int64_t **arrs[3] = {&s->running, &s->waiting, &s->swapped};
    int cap = s->cap_queue;
    for (int i = 0; i < 3; i++) {
        cap = s->cap_queue;
        if (kv_grow((void **)arrs[i], &cap, n, sizeof(int64_t)))
            return KV_ERR_NOMEM; /* cap_queue unchanged: the grown ones are merely larger */
    }
    s->cap_queue = cap;
    return 0;
}

void engine_snap_row(const kv_engine *e, const ereq *r, kv_snap_request *o) {
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
    char why[sizeof o->wait_reason];
    kv_copy_str(o->wait_reason, sizeof o->wait_reason, kv_sched_wait_reason(e->sched, s, why, sizeof why));
    o->spec_k = !e->spec || r->ss.cooldown > 0 ? 0 : e->cfg.spec.adaptive ? r->ss.k : e->cfg.spec.k;
    o->spec_drafts = r->ss.drafts;
    o->spec_drafted = r->ss.n_drafted;
    o->spec_accepted = r->ss.n_accepted;
}

/* Builds a snapshot from the live state (state_mu held). */
/* A synthetic model's per-device memory from its plan and the cache. */
static void snap_gpu(const kv_engine *e, const kv_cache_stats *cs, kv_gpu_memory *g) {
    memset(g, 0, sizeof *g);
    const kv_synth_plan *p = kv_synth_plan_of(e->synth);
    if (!p) return;
    g->valid = 1;
    snprintf(g->device, sizeof g->device, "%s", p->dev->name);
    g->n_devices = p->n_devices;
    g->tp = p->tp;
    g->pp = p->pp;
    g->ep = p->ep;
    g->total = (uint64_t)p->device_bytes;
    g->usable = (uint64_t)p->usable_bytes;
    g->weights = (uint64_t)p->weights;
    g->kv_used = (uint64_t)(cs->n_used * p->block_share);
    g->kv_cached = (uint64_t)(cs->n_cached * p->block_share);
    g->kv_free = (uint64_t)(cs->n_free * p->block_share);
    g->activations = (uint64_t)p->activations;
    g->reserve = (uint64_t)p->reserve;
    g->usd_per_hour = p->usd_per_hour;
    g->cold_start_s = p->cold_start_s;
    g->clock_ms = engine_now_ms(e);
    const kv_synth_pools *pl = kv_synth_pools_of(e->synth);
    if (!pl) return;
    g->pools = 1;
    g->prefill_devices = pl->prefill_devices;
    g->prefill_kv_used = (uint64_t)pl->prefill_kv_used;
    g->prefill_kv_peak = (uint64_t)pl->prefill_kv_peak;
    g->prefill_kv_free = p->kv > pl->prefill_kv_used ? (uint64_t)(p->kv - pl->prefill_kv_used) : 0;
    g->prefill_busy_ms = pl->prefill_busy_ms;
    g->prefill_wait_ms = pl->prefill_batches ? pl->prefill_wait_ms / (double)pl->prefill_batches : 0.0;
    g->prefill_free_ms = pl->prefill_free_ms;
    g->prefill_batches = pl->prefill_batches;
    g->handovers = pl->handovers;
    g->transfer_bytes = pl->transfer_bytes;
    g->transfer_busy_ms = pl->transfer_busy_ms;
    g->in_prefill_mean = pl->steps ? pl->sum_in_prefill / (double)pl->steps : 0.0;
    g->in_transfer_mean = pl->steps ? pl->sum_in_transfer / (double)pl->steps : 0.0;
    g->in_prefill_max = pl->max_in_prefill;
    g->in_transfer_max = pl->max_in_transfer;
}

int engine_build_snapshot(kv_engine *e, kv_snapshot *s) {
    engine_drain_inbox(e, 0);
    double t = engine_now_ms(e);
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
        kv_backend_clock clk;
        kv_backend_clock_get(e->be, &clk);
        snprintf(s->sim_device, sizeof s->sim_device, "%s", clk.device ? clk.device : "");
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
    s->blocks_windowed = cs.n_windowed;
    s->local_released = cs.local_released;

    kv_sreq *const *run, *const *wait, *const *sw;
    int nrun = kv_sched_running(e->sched, &run);
    int nwait = kv_sched_waiting(e->sched, &wait);
    int nsw = kv_sched_swapped(e->sched, &sw);
    kv_metrics_summarize(e->metrics, t, nrun + nwait + nsw > 0, &s->metrics);
    engine_sched_summary(e, &s->metrics);

    kv_mem_breakdown *m = &s->mem;
    memset(m, 0, sizeof *m);
    m->weights = e->model->weight_bytes + kv_spec_weight_bytes(e->spec);
    if (cs.n_local_blocks > 0) { /* sliding-window release: two pools */
        const uint64_t G = kv_cache_global_part_bytes(&e->cache_params), L = kv_cache_local_part_bytes(&e->cache_params);
        const int used_parts = cs.n_local_blocks - cs.n_local_free - cs.n_local_cached;
        m->kv_used = (uint64_t)cs.n_used * G + (uint64_t)used_parts * L;
        m->kv_cached = (uint64_t)cs.n_cached * G + (uint64_t)cs.n_local_cached * L;
        m->kv_free = (uint64_t)cs.n_free * G + (uint64_t)cs.n_local_free * L;
        m->kv_window_saved = (uint64_t)cs.n_windowed * L;
    } else {
        m->kv_used = (uint64_t)cs.n_used * e->block_bytes;
        m->kv_cached = (uint64_t)cs.n_cached * e->block_bytes;
        m->kv_free = (uint64_t)cs.n_free * e->block_bytes;
    }
    m->kv_swap_used = (uint64_t)cs.n_swap_used * e->block_bytes;
    m->kv_swap_total = (uint64_t)cs.n_swap_blocks * e->block_bytes;
    m->activations = engine_activation_bytes(e);
    m->other = kv_metrics_bytes(e->metrics) + (uint64_t)e->cap_live * sizeof(ereq *) +
               (uint64_t)e->n_live * sizeof(ereq) + (uint64_t)e->cap_ids * sizeof(id_rec) +
               (uint64_t)e->cache_params.n_blocks * 64 + kv_spec_kv_bytes(e->spec);
    m->budget = e->cfg.kv.blocks == 0 ? e->cfg.memory.budget : 0;
    if (e->be->ops->mem_info) e->be->ops->mem_info(e->be, &m->backend);
    m->weights_prepared = m->backend.valid ? m->backend.prepared_bytes : 0;
    snap_gpu(e, &cs, &s->gpu);

    /* requests: waiting, running, preempted, swapped, then finished */
    int n_req = nrun + nwait + nsw + e->finished.n;
    int n_tab = 0;
    for (int i = 0; i < nrun; i++) n_tab += run[i]->seq.n_blocks;
    if (kv_grow((void **)&s->requests, &s->cap_requests, n_req, sizeof *s->requests) ||
        kv_grow((void **)&s->tables, &s->cap_tables, n_tab, sizeof *s->tables) ||
        snap_queues(s, KV_MAX(KV_MAX(nrun, nwait), nsw)) ||
        kv_grow((void **)&s->blocks, &s->cap_blocks, s->n_blocks, sizeof *s->blocks) ||
        kv_grow((void **)&s->steps, &s->cap_steps, e->steps.n, sizeof *s->steps) ||
        kv_grow((void **)&s->decisions, &s->cap_decisions, e->decisions.n, sizeof *s->decisions))
        return KV_ERR_NOMEM;
    int k = 0;
    n_tab = 0;
    for (int i = 0; i < nwait; i++)
        if (wait[i]->state == KV_REQ_WAITING) engine_snap_row(e, (const ereq *)wait[i], &s->requests[k++]);
    for (int i = 0; i < nrun; i++) {
        kv_snap_request *row = &s->requests[k++];
        engine_snap_row(e, (const ereq *)run[i], row);
        row->table_offset = n_tab;
        if (run[i]->seq.n_blocks > 0)
            memcpy(s->tables + n_tab, run[i]->seq.blocks, (size_t)run[i]->seq.n_blocks * sizeof *s->tables);
        n_tab += run[i]->seq.n_blocks;
    }
    for (int i = 0; i < nwait; i++)
        if (wait[i]->state != KV_REQ_WAITING) engine_snap_row(e, (const ereq *)wait[i], &s->requests[k++]);
    for (int i = 0; i < nsw; i++) engine_snap_row(e, (const ereq *)sw[i], &s->requests[k++]);
    for (int i = 0; i < e->finished.n; i++) s->requests[k++] = *(kv_snap_request *)kv_ring_at(&e->finished, i);
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
        o->windowed = bi->windowed;
        o->zero = 0;
        o->shared = bi->refcount >= 2;
        o->refcount = bi->refcount;
        o->fill = bi->fill;
        o->owner = bi->state == KV_BLOCK_FREE ? -1 : bi->owner;
        o->session = bi->state == KV_BLOCK_FREE ? -1 : bi->owner_tag;
    }
    s->n_steps = e->steps.n;
    for (int i = 0; i < e->steps.n; i++) s->steps[i] = *(kv_step_record *)kv_ring_at(&e->steps, i);
    s->n_decisions = e->decisions.n;
    for (int i = 0; i < e->decisions.n; i++) s->decisions[i] = *(kv_decision *)kv_ring_at(&e->decisions, i);
    engine_moe_snapshot(e, s);
    return 0;
}

/* Deep copy of a snapshot (readers take the published one). */
static int snap_copy(kv_snapshot *d, const kv_snapshot *s) {
    kv_snapshot keep = *d;
    if (kv_grow((void **)&keep.requests, &keep.cap_requests, s->n_requests, sizeof *s->requests) ||
        kv_grow((void **)&keep.tables, &keep.cap_tables, s->n_table_entries, sizeof *s->tables) ||
        kv_grow((void **)&keep.blocks, &keep.cap_blocks, s->n_blocks, sizeof *s->blocks) ||
        kv_grow((void **)&keep.steps, &keep.cap_steps, s->n_steps, sizeof *s->steps) ||
        kv_grow((void **)&keep.decisions, &keep.cap_decisions, s->n_decisions, sizeof *s->decisions)) {
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
 * at most every KV_PUBLISH_MS, so a front end drawing at any frame rate
 * finds one at most max(a step, KV_PUBLISH_MS) old, a headless run pays
 * nothing, and short steps (a tiny model steps in under a millisecond) do
 * not pay a whole snapshot each: a cost per step would slow an engine in
 * proportion to its step count, and a TUI comparison of two engines that
 * step at different rates would measure the snapshots, not the engines. */
#define KV_PUBLISH_MS 8.0
void engine_publish(kv_engine *e) {
    pthread_mutex_lock(&e->pub_mu);
    double now = engine_wall_ms(e);
    int want = now - e->last_reader_ms < 1000 && (!e->pub_filled || now - e->pub_ms >= KV_PUBLISH_MS);
    pthread_mutex_unlock(&e->pub_mu);
    if (!want) return;
    if (engine_build_snapshot(e, e->pub_back) != 0) return;
    pthread_mutex_lock(&e->pub_mu);
    e->pub_ms = now;
    kv_snapshot *t = e->pub;
    e->pub = e->pub_back;
    e->pub_back = t;
    e->pub_filled = 1;
    pthread_mutex_unlock(&e->pub_mu);
}

int kv_engine_snapshot(kv_engine *e, kv_snapshot *s) {
    if (!e || !s) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->pub_mu);
    double t = engine_wall_ms(e); /* readers are timed on the host, whatever the engine's clock */
    /* Nobody read within the last second: the steps since did not publish,
     * so the copy may be arbitrarily old; wait for the step instead. */
    int stale = t - e->last_reader_ms >= 1000;
    e->last_reader_ms = t;
    pthread_mutex_unlock(&e->pub_mu);
    /* A stale reader waits for the running step, but boundedly: the engine
     * thread re-takes state_mu the moment a step ends, and an unfair mutex
     * can starve a blocked reader until the engine goes idle (a slow UI
     * frame under a sanitizer froze the tour for the whole workload). */
    struct timespec until;
    if (stale) engine_deadline_on(CLOCK_REALTIME, &until, 200);
    if ((stale ? pthread_mutex_timedlock(&e->state_mu, &until) : pthread_mutex_trylock(&e->state_mu)) == 0) {
        int rc = engine_build_snapshot(e, s);
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

/* ---- metrics and the consistency check ---- */

void kv_engine_metrics(kv_engine *e, kv_metrics_summary *out) {
    if (!e || !out) return;
    pthread_mutex_lock(&e->state_mu);
    engine_drain_inbox(e, 0);
    kv_sreq *const *q;
    int n = kv_sched_running(e->sched, &q) + kv_sched_waiting(e->sched, &q) + kv_sched_swapped(e->sched, &q);
    kv_metrics_summarize(e->metrics, engine_now_ms(e), n > 0, out);
    engine_sched_summary(e, out);
    pthread_mutex_unlock(&e->state_mu);
}

void kv_engine_metrics_reset(kv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->state_mu);
    engine_drain_inbox(e, 0);
    kv_metrics_reset(e->metrics);
    memset(e->expert_total, 0, sizeof e->expert_total);
    e->expert_imb_sum = 0.0;
    e->expert_imb_n = 0;
    pthread_mutex_unlock(&e->state_mu);
}

/* A running request's registered prefix blocks must be found again by its
 * verified tokens: commit never saw a rejected draft. */
static int check_prefix(kv_cache *c, const kv_sreq *r, char *msg, size_t cap) {
    if (!kv_cache_params_of(c)->prefix_sharing || r->seq.swapped) return 0;
    int bs = kv_cache_params_of(c)->block_size;
    int want = r->seq.n_hashed * bs;
    if (want == 0) return 0;
    int got = kv_cache_match_registered(c, r->tokens, KV_MIN(r->n_tokens, want + 1));
    if (got < want) {
        snprintf(msg, cap, "#%lld: %d registered tokens, only %d found by its tokens", (long long)r->id, want, got);
        return KV_ERR_INVAL;
    }
    return 0;
}

int kv_engine_check(kv_engine *e, char *msg, size_t cap) {
    if (!e) return KV_ERR_INVAL;
    pthread_mutex_lock(&e->state_mu);
    engine_live_compact(e);
    int rc = kv_sched_check(e->sched, msg, cap);
    for (int i = 0; i < e->n_live && rc == 0; i++)
        if (e->live[i]->s.state == KV_REQ_RUNNING) rc = check_prefix(e->cache, &e->live[i]->s, msg, cap);
    if (rc == 0 && e->spec) {
        kv_spec_seq **ss = malloc((size_t)(e->n_live > 0 ? e->n_live : 1) * sizeof *ss);
        int *known = malloc((size_t)(e->n_live > 0 ? e->n_live : 1) * sizeof *known);
        if (!ss || !known) {
            snprintf(msg, cap, "out of memory");
            rc = KV_ERR_NOMEM;
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
