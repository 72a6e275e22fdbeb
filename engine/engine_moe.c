/* engine_moe.c - the routing of a mixture-of-experts model made visible:
 * after each step the tokens per expert of the step's target forward
 * (summed over layers) go into the step record (routed pairs, the busiest
 * expert, the experts used), the snapshot (the whole per-expert row, for
 * the TUI) and the totals since the last metrics reset (bench JSON's
 * expert_tokens and imbalance). */
#include <string.h>

#include "engine_internal.h"

void engine_moe_step(kv_engine *e, kv_step_record *rec) {
    const int E = e->fwd ? kv_forward_expert_tokens(e->fwd, e->expert_step, KV_MOE_MAX_EXPERTS) : 0;
    rec->n_experts = E;
    rec->expert_routed = rec->expert_max = rec->expert_active = 0;
    uint64_t routed = 0;
    for (int i = 0; i < E; i++) {
        const uint32_t c = e->expert_step[i];
        routed += c;
        if ((int)c > rec->expert_max) rec->expert_max = (int)c;
        rec->expert_active += c > 0;
        e->expert_total[i] += c;
    }
    rec->expert_routed = (int)KV_MIN(routed, (uint64_t)INT32_MAX);
    if (routed) {
        e->expert_imb_sum += (double)rec->expert_max * E / (double)routed;
        e->expert_imb_n++;
    }
}

void engine_moe_snapshot(const kv_engine *e, kv_snapshot *s) {
    s->n_experts = e->model ? e->model->hp.n_expert : 0;
    memcpy(s->expert_tokens, e->expert_step, sizeof s->expert_tokens);
}

int kv_engine_expert_tokens(kv_engine *e, uint64_t *out, int cap, double *step_imbalance) {
    if (!e || !e->model || !e->model->hp.n_expert) return 0;
    pthread_mutex_lock(&e->state_mu);
    const int E = e->model->hp.n_expert;
    for (int i = 0; out && i < E && i < cap; i++) out[i] = e->expert_total[i];
    if (step_imbalance) *step_imbalance = e->expert_imb_n ? e->expert_imb_sum / (double)e->expert_imb_n : 0.0;
    pthread_mutex_unlock(&e->state_mu);
    return E;
}
