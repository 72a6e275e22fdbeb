/* synth_step.c - a synthetic model's memory plan and step time (see
 * synth_step.h). The op sequence of one layer is forward.c's; the cost of
 * each op is the sim backend's (kv_sim_cost_*), divided over the devices
 * that share it. */
#include "synth_step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synthetic.h"

#define GB 1e9
#define LAYER_OPS 20 /* ops charged per layer at most */

struct kv_synth {
    const kv_model *m;       /* borrowed */
    kv_backend *b;           /* borrowed: the sim backend */
    kv_synth_plan plan;
    kv_synth_dtype dt;
    kv_sim_peak peak;        /* the matmuls' peak for dt */
    int microbatches;        /* pipeline micro-batches (>= 1) */
    int graphs;              /* bool: sim.cuda_graphs */
    int host_logits;         /* bool: sim.host_logits */
    double ep_skew;
    int dp;                  /* attention groups: sim.ep / sim.tp when ep > tp, else 1 */
    int qh, kvh, ffn_t, vocab_t; /* per device: query heads, KV heads, FFN width, head rows */
    int ffn_e;               /* MoE: FFN width of an expert as one device holds it */
    double kv_row_bytes;     /* one (token, kv head) row in kv.dtype */
    int block_size;
    int max_tokens, max_logits;
    int seq_cap;             /* sequences a batch may have: max(max_tokens, scheduler.max_seqs) */
    int32_t *seq_ctx;        /* (seq_cap) scratch of kv_sim_attention_sums */
    /* disaggregated prefill/decode (sim.disaggregated) */
    int disagg;              /* bool */
    int prefill_groups;      /* tensor-parallel groups in the prefill pool */
    double kv_token_bytes;   /* one token's KV, all layers (what a hand-over moves) */
    int32_t *scratch;        /* (seq_cap + 4 * max_tokens) token counts per sequence, then the
                                two pools' positions and sequences */
    double now_ms;           /* engine clock at the step's start (kv_synth_begin) */
    double *tok_ms, *hold_ms;/* (seq_cap each) this step: first-token time and hold per batch sequence */
    kv_synth_pools pools;
    /* synthetic speculative decoding */
    kv_spec_method spec;     /* spec.method (never draft_model) */
    int draft_layers;        /* self: layers a draft token runs */
    double acceptance;       /* sim.spec_acceptance */
};

/* ceil(a / b) for positive ints */
static int cdiv(int a, int b) { return (a + b - 1) / b; }

static kv_sim_peak peak_of(kv_synth_dtype d) {
    return d == KV_SYNTH_FP8 ? KV_SIM_PEAK_FP8 : d == KV_SYNTH_INT8 ? KV_SIM_PEAK_INT8 : KV_SIM_PEAK_BF16;
}

/* Bytes of the expert FFN weights of all layers (0 for a dense model). */
static double expert_bytes(const kv_model *m, kv_synth_dtype dt) {
    const kv_hparams *hp = &m->hp;
    if (m->n_experts <= 1) return 0.0;
    return (double)hp->n_layers * m->n_experts *
           (2.0 * hp->ffn_dim * kv_synth_row_bytes(dt, hp->dim) + hp->dim * kv_synth_row_bytes(dt, hp->ffn_dim));
}

static int check_parallel(const kv_model *m, const kv_config *cfg, kv_err *err) {
    const kv_hparams *hp = &m->hp;
    if (cfg->sim.tp > hp->n_heads)
        return kv_err_set(err, KV_ERR_INVAL, "sim.tp: %d devices for %d attention heads", cfg->sim.tp, hp->n_heads);
    if (cfg->sim.pp > hp->n_layers)
        return kv_err_set(err, KV_ERR_INVAL, "sim.pp: %d stages for %d layers", cfg->sim.pp, hp->n_layers);
    if (cfg->sim.ep > 1 && m->n_experts <= 1)
        return kv_err_set(err, KV_ERR_INVAL, "sim.ep: %s is dense (no experts to spread)", m->name);
    int ep = cfg->sim.ep, tp = cfg->sim.tp;
    if (ep > m->n_experts)
        return kv_err_set(err, KV_ERR_INVAL, "sim.ep: %d devices for %d experts", ep, m->n_experts);
    if (ep > 1 && m->n_experts % ep != 0)
        return kv_err_set(err, KV_ERR_INVAL, "sim.ep: %d experts do not split evenly over %d devices (%d and %d "
                          "left over)", m->n_experts, ep, m->n_experts / ep, m->n_experts % ep);
    if (ep > 1 && ep % tp != 0 && tp % ep != 0)
        return kv_err_set(err, KV_ERR_INVAL,
                          "sim.ep %d and sim.tp %d: one must divide the other (ep a multiple of tp: attention runs "
                          "data-parallel on ep / tp groups of tp devices; ep a divisor of tp: each expert is split "
                          "over tp / ep devices)", ep, tp);
    if (ep > tp && ep / tp > cfg->scheduler.max_seqs)
        return kv_err_set(err, KV_ERR_INVAL, "sim.ep %d over sim.tp %d: %d attention groups for at most %d sequences "
                          "(scheduler.max_seqs)", ep, tp, ep / tp, cfg->scheduler.max_seqs);
    if (cfg->sim.disaggregated && cfg->sim.pp > 1)
        return kv_err_set(err, KV_ERR_INVAL, "sim.disaggregated: pools of pipelines are not modelled (sim.pp must be 1)");
    if (cfg->spec.method == KV_SPEC_DRAFT_MODEL)
        return kv_err_set(err, KV_ERR_INVAL,
                          "spec.method: a synthetic model drafts with self (its first spec.draft_layers layers) or "
                          "ngram (free drafts); draft_model needs a second model file");
    if (cfg->spec.method == KV_SPEC_SELF && cfg->spec.draft_layers >= hp->n_layers)
        return kv_err_set(err, KV_ERR_INVAL, "spec.draft_layers: %d of %d layers is no cheaper draft",
                          cfg->spec.draft_layers, hp->n_layers);
    return 0;
}

kv_backend *kv_synth_backend_new(const kv_config *cfg, kv_err *err) {
    int custom = cfg->sim.device_memory > 0 || cfg->sim.device_bandwidth > 0 || cfg->sim.device_tflops > 0 ||
                 cfg->sim.device_usd_per_hour > 0;
    if (strcmp(cfg->backend, "sim") != 0 || !custom)
        return kv_backend_create_on(cfg->backend, cfg->sim_device, cfg->threads, err);
    const kv_sim_device *base = kv_sim_device_find(cfg->sim_device);
    if (!base) /* the sim backend's own message lists the devices */
        return kv_backend_create_on(cfg->backend, cfg->sim_device, cfg->threads, err);
    kv_sim_device d = *base;
    d.label = "a profile's device (sim.device_* over sim_device)";
    if (cfg->sim.device_memory > 0) d.mem_bytes = cfg->sim.device_memory;
    if (cfg->sim.device_bandwidth > 0) d.mem_bw = cfg->sim.device_bandwidth * GB;
    if (cfg->sim.device_tflops > 0) d.tensor_flops = cfg->sim.device_tflops * 1e12;
    if (cfg->sim.device_usd_per_hour > 0) d.usd_per_hour = cfg->sim.device_usd_per_hour;
    d.source = "the profile's sim.device_* keys";
    return kv_backend_create_model(&d, cfg->threads, err);
}

/* Memory of one device; refuses what does not fit, with the numbers. */
static int plan_memory(kv_synth *s, const kv_config *cfg, uint64_t block_bytes, kv_err *err) {
    const kv_model *m = s->m;
    const kv_hparams *hp = &m->hp;
    kv_synth_plan *p = &s->plan;
    const kv_sim_device *d = p->dev;
    int tp = p->tp, pp = p->pp;
    p->device_bytes = (double)d->mem_bytes;
    p->usable_bytes = p->device_bytes * cfg->sim.memory_utilization;
    double ex = expert_bytes(m, s->dt);
    /* attention and the rest split over tp (and replicated over the dp =
     * ep / tp groups); experts over max(ep, tp): E / ep whole experts a
     * device, or E / ep experts split tp / ep ways */
    p->weights = ((double)m->weight_bytes - ex) / (tp * pp) + ex / ((p->ep > tp ? p->ep : tp) * pp);
    double row = 2.0 * hp->dim + (2.0 * s->qh + 2.0 * s->kvh) * hp->head_dim + 2.0 * s->ffn_t;
    p->activations = (double)s->max_tokens * row * 2.0 + (double)s->max_logits * s->vocab_t * 4.0;
    p->reserve = (double)cfg->sim.reserve;
    /* a device holds its KV heads of its stage's layers */
    p->block_share = (double)block_bytes * ((double)s->kvh / hp->n_kv_heads) *
                     ((double)cdiv(hp->n_layers, pp) / hp->n_layers) / s->dp; /* a dp group holds 1 / dp of them */
    p->kv = p->usable_bytes - p->weights - p->activations - p->reserve;
    const char *name = m->path + strlen("synthetic:");
    if (p->weights > p->usable_bytes || p->kv < p->block_share) {
        int need = (int)ceil(((double)m->weight_bytes) / (p->usable_bytes - p->activations - p->reserve));
        return kv_err_set(err, KV_ERR_INVAL,
                          "%s %s needs %.1f GB of weights (%.1f B parameters); %d x %s holds %.1f GB each, %.1f GB "
                          "usable at sim.memory_utilization %.2f, and a device's share is %.1f GB of weights + %.1f GB "
                          "of activations + %.1f GB of reserve, leaving no room for the KV cache: use sim.tp x sim.pp "
                          ">= %d devices, a smaller model.dtype or a larger sim_device",
                          name, kv_synth_dtype_name(s->dt), (double)m->weight_bytes / GB, (double)m->n_params / 1e9,
                          p->n_devices, d->name, p->device_bytes / GB, p->usable_bytes / GB,
                          cfg->sim.memory_utilization, p->weights / GB, p->activations / GB, p->reserve / GB,
                          need > p->n_devices ? need : p->n_devices + 1);
    }
    double nb = floor(p->kv / p->block_share);
    if (cfg->kv.blocks > 0) {
        if ((double)cfg->kv.blocks > nb)
            return kv_err_set(err, KV_ERR_INVAL,
                              "kv.blocks: %d blocks need %.1f GB per device; %s has %.1f GB left for the KV cache",
                              cfg->kv.blocks, cfg->kv.blocks * p->block_share / GB, d->name, p->kv / GB);
        nb = cfg->kv.blocks;
    }
    p->n_blocks = nb > 16777216.0 ? 16777216 : (int)nb;
    p->kv = p->n_blocks * p->block_share;
    p->usd_per_hour = p->n_devices * d->usd_per_hour;
    p->cold_start_s = (double)m->weight_bytes / (cfg->sim.storage_bandwidth * GB);
    return 0;
}

kv_synth *kv_synth_new(const kv_model *m, const kv_config *cfg, kv_backend *b, uint64_t block_bytes, int block_size,
                       int max_tokens, int max_logits, kv_err *err) {
    if (!m || !m->synthetic || !cfg || max_tokens <= 0 || max_logits <= 0 || block_size <= 0) {
        kv_err_set(err, KV_ERR_INVAL, "synthetic: bad arguments");
        return NULL;
    }
    kv_backend_clock clk;
    const kv_sim_device *dev = kv_backend_clock_get(b, &clk) && b->ops->charge ? clk.model : NULL;
    if (!dev) {
        kv_err_set(err, KV_ERR_INVAL, "model.synthetic: needs backend: sim (a synthetic model has no weights to "
                   "compute with; it is timed on a simulated device)");
        return NULL;
    }
    if (check_parallel(m, cfg, err)) return NULL;
    kv_synth *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->seq_cap = KV_MAX(max_tokens, kv_config_max_seqs(cfg));
    s->seq_ctx = calloc((size_t)s->seq_cap, sizeof *s->seq_ctx);
    if (!s->seq_ctx) goto oom;
    const kv_hparams *hp = &m->hp;
    s->m = m;
    s->b = b;
    s->dt = (kv_synth_dtype)m->weight_dtype;
    s->peak = peak_of(s->dt);
    s->graphs = cfg->sim.cuda_graphs;
    s->host_logits = cfg->sim.host_logits;
    s->ep_skew = cfg->sim.ep_skew;
    s->max_tokens = max_tokens;
    s->max_logits = max_logits;
    s->block_size = block_size;
    s->kv_row_bytes = (double)kv_cache_row_bytes(cfg->kv.dtype, hp->head_dim);
    kv_synth_plan *p = &s->plan;
    p->dev = dev;
    p->tp = cfg->sim.tp;
    p->pp = cfg->sim.pp;
    p->ep = cfg->sim.ep;
    s->dp = p->ep > p->tp ? p->ep / p->tp : 1;
    p->n_devices = p->tp * s->dp * p->pp;
    s->microbatches = cfg->sim.microbatches > 0 ? cfg->sim.microbatches : p->pp;
    s->qh = cdiv(hp->n_heads, p->tp);
    s->kvh = cdiv(hp->n_kv_heads, p->tp); /* fewer KV heads than devices: replicated */
    s->ffn_t = cdiv(hp->ffn_dim, p->tp);
    s->ffn_e = p->ep > 1 ? cdiv(hp->ffn_dim, p->ep >= p->tp ? 1 : p->tp / p->ep) : s->ffn_t;
    s->vocab_t = cdiv(hp->n_vocab, p->tp);
    s->spec = cfg->spec.method;
    s->draft_layers = cfg->spec.draft_layers;
    s->acceptance = cfg->sim.spec_acceptance;
    s->disagg = cfg->sim.disaggregated;
    s->prefill_groups = cfg->sim.prefill_devices > 0 ? cfg->sim.prefill_devices : 1;
    s->kv_token_bytes = (double)block_bytes / block_size;
    if (s->disagg) {
        /* the decode pool is one group of tp devices and holds the KV
         * cache; the prefill pool adds prefill_groups more */
        p->n_devices = p->tp * s->dp * (1 + s->prefill_groups);
        if (!(s->scratch = calloc((size_t)s->seq_cap + (size_t)max_tokens * 4, sizeof *s->scratch))) goto oom;
        if (!(s->tok_ms = calloc((size_t)s->seq_cap * 2, sizeof *s->tok_ms))) goto oom;
        s->hold_ms = s->tok_ms + s->seq_cap;
        s->pools.valid = 1;
        s->pools.decode_devices = p->tp * s->dp;
        s->pools.prefill_devices = p->tp * s->dp * s->prefill_groups;
    }
    if (plan_memory(s, cfg, block_bytes, err)) {
        kv_synth_free(s);
        return NULL;
    }
    /* a swap or copy of a block moves each device's share of it at once */
    kv_backend_set_kv_share(b, p->block_share * s->dp / (double)block_bytes);
    return s;
oom:
    kv_synth_free(s);
    kv_err_set(err, KV_ERR_NOMEM, "synthetic: out of memory");
    return NULL;
}

void kv_synth_free(kv_synth *s) {
    if (!s) return;
    free(s->seq_ctx);
    free(s->scratch);
    free(s->tok_ms);
    free(s);
}

const kv_synth_plan *kv_synth_plan_of(const kv_synth *s) { return s ? &s->plan : NULL; }

/* ---- the step ------------------------------------------------------------ */

/* A ring all-reduce of bytes over t devices: 2 (t - 1) steps of bytes / t
 * each over the peer link, plus a latency per step. */
static double allreduce_s(const kv_sim_device *d, int t, double bytes) {
    if (t <= 1) return 0.0;
    double bw = d->peer_bw > 0 ? d->peer_bw : d->link_bw;
    return 2.0 * (t - 1) / t * bytes / bw + 2.0 * (t - 1) * d->peer_latency_s;
}

/* An all-to-all where each of t devices sends bytes, (t - 1) / t of them away. */
static double alltoall_s(const kv_sim_device *d, int t, double bytes) {
    if (t <= 1) return 0.0;
    double bw = d->peer_bw > 0 ? d->peer_bw : d->link_bw;
    return (t - 1.0) / t * bytes / bw + d->peer_latency_s;
}

/* The MoE feed-forward on the busiest device: n tokens route to top-k of E
 * experts, E / ep of them on each device; the busiest gets (1 + skew) x
 * its share of the n * k assignments (at most n per local expert), and
 * reads each local expert that at least one of them hit (expected count
 * for uniform routing among its experts). */
static int moe_ops(const kv_synth *s, int n, kv_sim_cost *ops) {
    const kv_hparams *hp = &s->m->hp;
    int ep = s->plan.ep, E = s->m->n_experts, k = s->m->n_experts_used, nops = 0;
    double el = (double)E / ep, assign = (double)n * k / ep * (ep > 1 ? 1.0 + s->ep_skew : 1.0);
    if (assign > n * el) assign = n * el;
    double hit = el * (1.0 - pow(1.0 - 1.0 / el, assign));
    int rows = (int)ceil(assign);
    double rb = kv_synth_row_bytes(s->dt, hp->dim), rbf = kv_synth_row_bytes(s->dt, s->ffn_e);
    ops[nops++] = kv_sim_cost_matmul(rb * E, hp->dim, E, cdiv(n, s->dp), s->peak); /* the router, own tokens */
    ops[nops++] = kv_sim_cost_matmul(hit * s->ffn_e * rb, hp->dim, s->ffn_e, rows, s->peak);
    ops[nops++] = kv_sim_cost_matmul(hit * s->ffn_e * rb, hp->dim, s->ffn_e, rows, s->peak);
    ops[nops++] = kv_sim_cost_silu_mul((int64_t)rows * s->ffn_e);
    ops[nops++] = kv_sim_cost_matmul(hit * hp->dim * rbf, s->ffn_e, hp->dim, rows, s->peak);
    return nops;
}

double kv_synth_moe_comm_s(const kv_synth *s, int n) {
    if (!s || s->m->n_experts <= 1 || n <= 0) return 0.0;
    const kv_sim_device *d = s->plan.dev;
    int tp = s->plan.tp, ep = s->plan.ep;
    double act = (double)n * s->m->hp.dim * 2.0; /* the step's residual stream in 16 bits */
    if (ep < tp) /* every device has every token: the experts' partial sums are all-reduced */
        return allreduce_s(d, tp, act);
    /* each device dispatches its 1 / ep of the tokens to their top-k
     * experts and gets the results back (combine) */
    return 2.0 * alltoall_s(d, ep, act * s->m->n_experts_used / ep);
}

/* One layer's ops for n tokens on one device, in forward.c's order; comm:
 * the seconds of its collectives. attn_flops, kv_rows: the batch's sums.
 * With dp attention groups (sim.ep > sim.tp) a device's group runs 1 / dp
 * of the batch's tokens and contexts through attention, while its experts
 * serve the whole batch's routed tokens. */
static int layer_ops(const kv_synth *s, int n_all, double attn_flops, double kv_rows, kv_sim_cost *ops,
                     double *comm /* OUT */) {
    const kv_hparams *hp = &s->m->hp;
    const kv_sim_device *d = s->plan.dev;
    int nops = 0, tp = s->plan.tp, hd = hp->head_dim, qd = s->qh * hd, kvd = s->kvh * hd;
    int n = cdiv(n_all, s->dp);
    attn_flops /= s->dp;
    kv_rows /= s->dp;
    double rb = kv_synth_row_bytes(s->dt, hp->dim);
    ops[nops++] = kv_sim_cost_rmsnorm(n, hp->dim);
    ops[nops++] = kv_sim_cost_matmul(rb * qd, hp->dim, qd, n, s->peak);
    ops[nops++] = kv_sim_cost_matmul(rb * kvd, hp->dim, kvd, n, s->peak);
    ops[nops++] = kv_sim_cost_matmul(rb * kvd, hp->dim, kvd, n, s->peak);
    ops[nops++] = kv_sim_cost_rope(n, s->qh, hp->rot_dim);
    ops[nops++] = kv_sim_cost_rope(n, s->kvh, hp->rot_dim);
    ops[nops++] = kv_sim_cost_kv_store(n, s->kvh, hd, s->kv_row_bytes);
    ops[nops++] = kv_sim_cost_attention(attn_flops, kv_rows, n, s->qh, hd, s->kvh * s->kv_row_bytes, s->block_size);
    ops[nops++] = kv_sim_cost_matmul(kv_synth_row_bytes(s->dt, qd) * hp->dim, qd, hp->dim, n, s->peak);
    ops[nops++] = kv_sim_cost_add((int64_t)n * hp->dim);
    ops[nops++] = kv_sim_cost_rmsnorm(n, hp->dim);
    double act = (double)n * hp->dim * 2.0; /* the residual stream in 16 bits */
    *comm = allreduce_s(d, tp, act);          /* after the attention output projection */
    if (s->m->n_experts > 1) {
        nops += moe_ops(s, n_all, ops + nops);
        *comm += s->plan.ep > 1 ? kv_synth_moe_comm_s(s, n_all) : allreduce_s(d, tp, act);
    } else {
        ops[nops++] = kv_sim_cost_matmul(rb * s->ffn_t, hp->dim, s->ffn_t, n, s->peak);
        ops[nops++] = kv_sim_cost_matmul(rb * s->ffn_t, hp->dim, s->ffn_t, n, s->peak);
        ops[nops++] = kv_sim_cost_silu_mul((int64_t)n * s->ffn_t);
        ops[nops++] = kv_sim_cost_matmul(kv_synth_row_bytes(s->dt, s->ffn_t) * hp->dim, s->ffn_t, hp->dim, n, s->peak);
        *comm += allreduce_s(d, tp, act); /* after the down projection */
    }
    ops[nops++] = kv_sim_cost_add((int64_t)n * hp->dim);
    return nops;
}

/* Charges seconds of kind k (no launch). */
static void charge_seconds(kv_backend *b, kv_sim_kind k, double seconds) {
    kv_sim_cost c = {.kind = k, .peak = KV_SIM_PEAK_VECTOR, .seconds = seconds};
    kv_backend_charge(b, &c, 1, 0);
}

/* Charges a host <-> device transfer of bytes. */
static void charge_transfer(kv_backend *b, double bytes) {
    kv_sim_cost c = {.kind = KV_SIM_TRANSFER, .bytes = bytes, .peak = KV_SIM_PEAK_VECTOR};
    kv_backend_charge(b, &c, 1, 1);
}

/* NOTE: inside a CUDA graph a kernel still costs its ramp-up and tail
 * (the grid fills and drains): about 2 us for the short kernels of a
 * decode step, an assumption in the spirit of launch_s, fitted with the
 * README's validation rows rather than measured here. */
#define GRAPH_OP_S 2e-6

/* Charges ops[0..nops) and then comm seconds of collectives, `times` over,
 * with one call to the backend per round. */
static void charge_ops(kv_synth *s, const kv_sim_cost *ops, int nops, double comm, int times) {
    kv_sim_cost round[LAYER_OPS + 1];
    for (int i = 0; i < nops; i++) {
        round[i] = ops[i];
        if (s->graphs) round[i].seconds += GRAPH_OP_S;
    }
    int n = nops;
    if (comm > 0) round[n++] = (kv_sim_cost){.kind = KV_SIM_COMM, .peak = KV_SIM_PEAK_VECTOR, .seconds = comm};
    for (int t = 0; t < times; t++) kv_backend_charge(s->b, round, n, !s->graphs);
}

/* Seconds ops[0..nops) and comm cost once, as charge_ops charges them. */
static double ops_seconds(const kv_synth *s, const kv_sim_cost *ops, int nops, double comm) {
    double t = comm;
    for (int i = 0; i < nops; i++)
        t += kv_sim_cost_seconds(s->plan.dev, &ops[i], !s->graphs) + (s->graphs ? GRAPH_OP_S : 0.0);
    return t;
}

/* Disaggregated prefill and decode, each pool on its own clock. The
 * step's prefill chunks (sequences with more than one token in it) go to
 * the prefill pool, which runs its batches back to back: a batch starts
 * when the pool is free (or now, when it is idle) and takes its ops' time
 * over prefill_groups groups. The pool's queue is FIFO in the order the
 * scheduler hands it chunks (running prefills by priority and arrival,
 * then admissions: a request's chunks follow one another), and a chunk is
 * not held back for the one before it (they run in that order anyway). A
 * sequence whose prompt ends in the batch samples its first token when the
 * batch ends (kv_synth_token_ms) and hands its whole KV to the decode pool
 * over the tp devices' host links (NIC or PCIe: link_bw each, one hand-over
 * after another) plus a latency; until then the engine holds it
 * (kv_sched's hold_until_ms, kv_synth_hold_ms).
 * Only the decode tokens are charged to the backend clock, which is the
 * decode pool's. */
static void disagg_layers(kv_synth *s, const kv_batch *bt) {
    const kv_hparams *hp = &s->m->hp;
    const int n = bt->n_tokens;
    int32_t *cnt = s->scratch, *pp_ = s->scratch + s->seq_cap, *sp = pp_ + n, *pd = sp + n, *sd = pd + n;
    for (int i = 0; i < n; i++) cnt[bt->ab.seq[i]] = 0;
    for (int i = 0; i < n; i++) cnt[bt->ab.seq[i]]++;
    int np = 0, nd = 0;
    for (int i = 0; i < n; i++) {
        if (cnt[bt->ab.seq[i]] > 1) pp_[np] = bt->ab.pos[i], sp[np++] = bt->ab.seq[i];
        else pd[nd] = bt->ab.pos[i], sd[nd++] = bt->ab.seq[i];
    }
    kv_attn_batch ap = {.n_tokens = np, .pos = pp_, .seq = sp, .n_seqs = bt->ab.n_seqs};
    kv_attn_batch ad = {.n_tokens = nd, .pos = pd, .seq = sd, .n_seqs = bt->ab.n_seqs};
    kv_sim_cost ops[LAYER_OPS];
    double f, rows, comm;
    kv_synth_pools *pl = &s->pools;
    for (int i = 0; i < bt->ab.n_seqs; i++) s->tok_ms[i] = s->hold_ms[i] = 0.0;
    if (np > 0) {
        kv_sim_attention_sums(&ap, s->qh, hp->head_dim, 0, s->seq_ctx, &f, &rows);
        int k = layer_ops(s, np, f, rows, ops, &comm);
        double t_ms = ops_seconds(s, ops, k, comm) * hp->n_layers / s->prefill_groups * 1000.0;
        double start = pl->prefill_free_ms > s->now_ms ? pl->prefill_free_ms : s->now_ms;
        pl->prefill_wait_ms += start - s->now_ms;
        pl->prefill_free_ms = start + t_ms;
        pl->prefill_busy_ms += t_ms;
        pl->prefill_batches++;
    }
    const kv_sim_device *d = s->plan.dev;
    for (int i = 0; i < bt->n_logits; i++) {
        int r = bt->logit_rows[i], q = bt->ab.seq[r];
        if (cnt[q] <= 1) continue;
        double bytes = ((double)bt->ab.pos[r] + 1.0) * s->kv_token_bytes;
        double t_ms = (bytes / (s->plan.tp * d->link_bw) + d->peer_latency_s) * 1000.0;
        double start = pl->transfer_free_ms > pl->prefill_free_ms ? pl->transfer_free_ms : pl->prefill_free_ms;
        pl->transfer_free_ms = start + t_ms;
        pl->transfer_busy_ms += t_ms;
        pl->transfer_bytes += bytes;
        pl->handovers++;
        s->tok_ms[q] = pl->prefill_free_ms;
        s->hold_ms[q] = pl->transfer_free_ms;
    }
    if (nd > 0) {
        kv_sim_attention_sums(&ad, s->qh, hp->head_dim, 0, s->seq_ctx, &f, &rows);
        int k = layer_ops(s, nd, f, rows, ops, &comm);
        charge_ops(s, ops, k, comm, hp->n_layers);
    }
}

void kv_synth_begin(kv_synth *s, double now_ms) {
    if (!s) return;
    s->now_ms = now_ms;
}

double kv_synth_token_ms(const kv_synth *s, int seq) {
    return s && s->disagg && seq >= 0 && seq < s->seq_cap ? s->tok_ms[seq] : 0.0;
}

double kv_synth_hold_ms(const kv_synth *s, int seq) {
    return s && s->disagg && seq >= 0 && seq < s->seq_cap ? s->hold_ms[seq] : 0.0;
}

void kv_synth_observe(kv_synth *s, int in_prefill, int in_transfer, double prefill_kv_tokens) {
    if (!s || !s->disagg) return;
    kv_synth_pools *pl = &s->pools;
    pl->steps++;
    pl->sum_in_prefill += in_prefill;
    pl->sum_in_transfer += in_transfer;
    if (in_prefill > pl->max_in_prefill) pl->max_in_prefill = in_prefill;
    if (in_transfer > pl->max_in_transfer) pl->max_in_transfer = in_transfer;
    pl->prefill_kv_used = prefill_kv_tokens * s->kv_token_bytes * ((double)s->kvh / s->m->hp.n_kv_heads) /
                          s->prefill_groups;
    if (pl->prefill_kv_used > pl->prefill_kv_peak) pl->prefill_kv_peak = pl->prefill_kv_used;
}

const kv_synth_pools *kv_synth_pools_of(const kv_synth *s) { return s && s->disagg ? &s->pools : NULL; }

int kv_synth_step(kv_synth *s, const kv_batch *bt, kv_err *err) {
    if (!s || !bt) return kv_err_set(err, KV_ERR_INVAL, "synthetic step: bad arguments");
    const kv_hparams *hp = &s->m->hp;
    const int n = bt->n_tokens;
    if (n <= 0 || n > s->max_tokens || bt->n_logits < 0 || bt->n_logits > s->max_logits ||
        bt->ab.n_seqs > s->seq_cap || bt->ab.n_seqs < 0 || !bt->ab.pos || !bt->ab.seq ||
        (bt->n_logits > 0 && !bt->logit_rows))
        return kv_err_set(err, KV_ERR_INVAL, "synthetic step: %d tokens, %d logits, %d sequences (limits %d, %d, %d)",
                          n, bt->n_logits, bt->ab.n_seqs, s->max_tokens, s->max_logits, s->seq_cap);
    for (int i = 0; i < n; i++)
        if (bt->ab.pos[i] < 0 || bt->ab.seq[i] < 0 || bt->ab.seq[i] >= bt->ab.n_seqs)
            return kv_err_set(err, KV_ERR_RANGE, "synthetic step: token %d has bad position/sequence", i);
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_rows[i] < 0 || bt->logit_rows[i] >= n)
            return kv_err_set(err, KV_ERR_RANGE, "synthetic step: logit row %d out of range", bt->logit_rows[i]);
    kv_backend *b = s->b;
    const kv_sim_device *d = s->plan.dev;
    int pp = s->plan.pp, mb = pp > 1 ? s->microbatches : 1;
    if (mb > n) mb = n;
    kv_sim_cost ops[LAYER_OPS];
    if (s->graphs) charge_seconds(b, KV_SIM_OTHER, d->launch_s); /* one graph launch */
    charge_transfer(b, (double)n * sizeof(int32_t));               /* token ids up */
    ops[0] = kv_sim_cost_get_rows(kv_synth_row_bytes(s->dt, hp->dim), hp->dim, cdiv(n, s->dp));
    charge_ops(s, ops, 1, 0.0, 1);
    double attn_flops = 0.0, kv_rows = 0.0;
    if (!s->disagg) kv_sim_attention_sums(&bt->ab, s->qh, hp->head_dim, 0, s->seq_ctx, &attn_flops, &kv_rows);
    if (s->disagg) {
        disagg_layers(s, bt);
    } else if (pp <= 1) {
        double comm;
        int nops = layer_ops(s, n, attn_flops, kv_rows, ops, &comm);
        charge_ops(s, ops, nops, comm, hp->n_layers);
    } else {
        /* A pipeline kept full across steps (as vLLM and TensorRT-LLM run
         * one): the batch is mb micro-batches, each passes the pp stages
         * of L / pp layers one after the other, and a stage works on one
         * micro-batch per slot. A step (every micro-batch one token
         * further) takes max(mb, pp) slots: with fewer micro-batches than
         * stages, pp - mb stages idle in each slot (the bubble). Each slot
         * boundary sends a micro-batch's activations to the next stage. */
        int nm = cdiv(n, mb), ls = cdiv(hp->n_layers, pp), slots = mb > pp ? mb : pp;
        double comm;
        int nops = layer_ops(s, nm, attn_flops / mb, kv_rows / mb, ops, &comm);
        charge_ops(s, ops, nops, comm, ls * slots);
        double bw = d->peer_bw > 0 ? d->peer_bw : d->link_bw;
        charge_seconds(b, KV_SIM_COMM, slots * (d->peer_latency_s + nm * hp->dim * 2.0 / bw));
    }
    if (bt->n_logits > 0) {
        int nl = cdiv(bt->n_logits, s->dp); /* each attention group's own rows */
        charge_transfer(b, (double)nl * sizeof(int32_t)); /* logit rows up */
        ops[0] = kv_sim_cost_get_rows((double)hp->dim * sizeof(float), hp->dim, nl);
        ops[1] = kv_sim_cost_rmsnorm(nl, hp->dim);
        ops[2] = kv_sim_cost_matmul(kv_synth_row_bytes(s->dt, hp->dim) * s->vocab_t, hp->dim, s->vocab_t, nl,
                                    s->peak);
        charge_ops(s, ops, 3, 0.0, 1);
        /* the host samples from the logits (the CPU-computed sim), or the
         * device samples and sends the ids */
        charge_transfer(b, s->host_logits ? (double)nl * hp->n_vocab * sizeof(float)
                                                 : (double)nl * sizeof(int32_t));
    }
    return 0;
}

/* ---- speculative decoding ------------------------------------------------ */

int32_t kv_synth_draft_token(const kv_synth *s, uint64_t seed, int64_t request, int pos) {
    int32_t t = kv_synth_token(s->m, seed, request, pos);
    /* accepted with probability sim.spec_acceptance, drawn per position
     * from its own stream (the same whatever the batch) */
    uint64_t z = kv_synth_token(s->m, seed ^ 0x5DEECE66Dull, request, pos) * 0x9E3779B97F4A7C15ull;
    z ^= z >> 29;
    double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
    if (u < s->acceptance) return t;
    int n = s->m->hp.n_vocab - 259;
    return n > 1 ? 259 + (t - 259 + 1) % n : t; /* any other id: rejected */
}

void kv_synth_draft_cost(kv_synth *s, int n_seqs, double kv_rows, int k) {
    if (!s || n_seqs <= 0 || k <= 0 || s->spec != KV_SPEC_SELF) return; /* ngram drafts cost nothing */
    const kv_hparams *hp = &s->m->hp;
    kv_sim_cost ops[LAYER_OPS];
    double comm;
    /* each of the k draft tokens: one token per sequence through the first
     * draft_layers layers and the head, reading each sequence's KV */
    int nops = layer_ops(s, n_seqs, kv_rows * s->qh * (4.0 * hp->head_dim + 5.0), kv_rows, ops, &comm);
    charge_ops(s, ops, nops, comm, s->draft_layers * k);
    ops[0] = kv_sim_cost_matmul(kv_synth_row_bytes(s->dt, hp->dim) * s->vocab_t, hp->dim, s->vocab_t, n_seqs, s->peak);
    charge_ops(s, ops, 1, 0.0, k);
}
