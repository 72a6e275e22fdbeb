/* synth_step.h - the step-time model and the memory plan of a synthetic
 * model (synthetic.h) on the sim backend's devices, in place of the
 * forward pass: each step charges the simulated clock op by op for the
 * step's actual batch (weights once per step, KV per sequence from its
 * real context and kv.dtype, matmul and attention FLOPs), per device of a
 * tensor-parallel group (sim.tp: two all-reduces per layer), a pipeline
 * (sim.pp: micro-batches and the bubble) and expert parallelism (sim.ep:
 * the busiest device under skewed routing), with the sim backend's cost
 * functions, so on one device it charges exactly what the CPU-computed sim
 * charges for the same batch. */
#ifndef KV_SYNTH_STEP_H
#define KV_SYNTH_STEP_H

#include <stdint.h>

#include "../base/common.h"
#include "../kernels/sim_cost.h"
#include "config.h"
#include "forward.h"
#include "model.h"

/* Where the memory of each device goes (bytes per device; devices of a
 * plan are alike). */
typedef struct kv_synth_plan {
    const kv_sim_device *dev;  /* borrowed: the sim backend's */
    int tp, pp, ep, n_devices; /* n_devices = tp * pp */
    double device_bytes;       /* memory of one device */
    double usable_bytes;       /* device_bytes * sim.memory_utilization */
    double weights;            /* this device's share of the weights */
    double activations;        /* peak activations of a step (2-byte activations, f32 logits) */
    double reserve;            /* sim.reserve */
    double kv;                 /* KV blocks: usable - weights - activations - reserve */
    double block_share;        /* bytes of one KV block on this device */
    int n_blocks;              /* KV blocks the cache gets (over all devices) */
    double usd_per_hour;       /* all devices */
    double cold_start_s;       /* all weights over sim.storage_bandwidth */
} kv_synth_plan;

typedef struct kv_synth kv_synth;

/* The backend cfg names (kv_backend_create_on), except that on the sim
 * backend the sim.device_* keys override the figures of sim_device (a
 * profile's own device: kv_sim_backend_create_custom). NULL with err. */
kv_backend *kv_synth_backend_new(const kv_config *cfg, kv_err *err);

/* Plans memory for m (synthetic) on backend b (a sim backend) with cfg's
 * parallelism and a KV block of block_bytes (all layers, K and V) holding
 * block_size tokens; max_tokens / max_logits: a step's limits. Refuses a
 * model that does not fit with the numbers (GB), e.g. "llama-3-70b fp16
 * needs 141.1 GB of weights; 1 x a100-80g holds 85.9 GB (77.3 GB usable at
 * sim.memory_utilization 0.90)". NULL with err on failure. */
kv_synth *kv_synth_new(const kv_model *m, const kv_config *cfg, kv_backend *b, uint64_t block_bytes, int block_size,
                       int max_tokens, int max_logits, kv_err *err);
void kv_synth_free(kv_synth *s); /* NULL is a no-op */
/* The plan (borrowed; valid until kv_synth_free). */
const kv_synth_plan *kv_synth_plan_of(const kv_synth *s);
/* Charges one step over batch bt to the clock (the forward pass's place).
 * Checks the batch like kv_forward_run: KV_ERR_INVAL with err on a batch
 * beyond the limits, KV_ERR_RANGE on a bad position, sequence or logit
 * row, and then charges nothing. */
int kv_synth_step(kv_synth *s, const kv_batch *bt, kv_err *err);

/* Disaggregated prefill and decode (sim.disaggregated): the two pools'
 * figures since creation. Times are on the engine clock (ms). */
typedef struct kv_synth_pools {
    int valid;
    int prefill_devices, decode_devices;
    double prefill_free_ms;    /* when the prefill pool has run what it was given */
    double prefill_busy_ms;    /* time it ran prefill batches */
    double prefill_wait_ms;    /* summed over its batches: the wait for the pool (its queue) */
    uint64_t prefill_batches;
    double transfer_free_ms;   /* when the links have sent what they were given */
    double transfer_busy_ms, transfer_bytes;
    uint64_t handovers;        /* prompts whose KV went to the decode pool */
    /* per step (kv_synth_observe): requests on the prefill pool (prefilling
     * or waiting for it) and in transfer; KV those hold, per prefill device */
    uint64_t steps;
    double sum_in_prefill, sum_in_transfer;
    int max_in_prefill, max_in_transfer;
    double prefill_kv_used, prefill_kv_peak;
} kv_synth_pools;

/* Disaggregated pools: the engine clock at the step's start, before
 * kv_synth_step. */
void kv_synth_begin(kv_synth *s, double now_ms);
/* After kv_synth_step, for batch sequence seq: when its first token exists
 * (the prefill pool's batch end; 0 when it sampled on the decode pool) and
 * when it may be scheduled again (its chunk done, or its KV on the decode
 * pool; 0: no hold). Both 0 unless disaggregated. */
double kv_synth_token_ms(const kv_synth *s, int seq);
double kv_synth_hold_ms(const kv_synth *s, int seq);
/* Records a step's queue lengths (requests on the prefill pool, in
 * transfer) and the prompt tokens whose KV the prefill pool holds. */
void kv_synth_observe(kv_synth *s, int in_prefill, int in_transfer, double prefill_kv_tokens);
/* NULL unless disaggregated. */
const kv_synth_pools *kv_synth_pools_of(const kv_synth *s);

/* A MoE model's collectives in one layer for a step of n tokens, in
 * seconds: with sim.ep >= sim.tp each device dispatches its n / ep tokens'
 * activations (dim x 2 bytes x top-k) to the experts' devices and gets them
 * back, two all-to-alls over ep devices ((ep - 1) / ep of the bytes over
 * the peer link, plus its latency, each); with sim.ep < sim.tp every
 * device has every token and the experts' partial sums are all-reduced
 * over tp. 0 for a dense model. */
double kv_synth_moe_comm_s(const kv_synth *s, int n);

/* Synthetic speculative decoding. The draft of position pos of a request:
 * the target's own id there (kv_synth_token) with probability
 * sim.spec_acceptance, drawn per position, else another id (rejected by
 * greedy verification). */
int32_t kv_synth_draft_token(const kv_synth *s, uint64_t seed, int64_t request, int pos);
/* Charges drafting k tokens for n_seqs sequences whose contexts sum to
 * kv_rows: spec.method self runs the first spec.draft_layers layers and the
 * head per draft token; ngram drafts cost nothing. */
void kv_synth_draft_cost(kv_synth *s, int n_seqs, double kv_rows, int k);

#endif
