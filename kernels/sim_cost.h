/* sim_cost.h - the sim backend's model of a device, without the backend:
 * the device table (memory, bandwidth, peaks per dtype, links, price, the
 * calibrated achievable fractions, each with its source), the roofline,
 * and what each op of a forward pass costs, as pure functions. The sim
 * backend (sim.h) charges its computing ops with these; a synthetic model
 * (engine/synth_step.c) charges the ops it does not compute with the same
 * ones through the backend table (ops.charge), so both clocks agree. */
#ifndef KV_SIM_COST_H
#define KV_SIM_COST_H

#include <stdint.h>

#include "backend.h"

/* A device of the table. Bandwidths and peaks are vendor datasheet figures
 * (dense, i.e. without structured sparsity); launch_s is an assumption.
 * What a kernel reaches of them is the calibrated part: the roofline uses
 * mem_bw * bw_frac and peak * flops_frac (sim.c says how they were set).
 * The fields after mem_bytes came with the synthetic models (issue 16);
 * a field a device lacks is 0 (no FP8 tensor cores: fp8 weights compute at
 * the BF16 peak; no NVLink: device to device goes over link_bw). */
typedef struct kv_sim_device {
    const char *name;      /* "h100-sxm": what profiles' sim_device names */
    const char *label;     /* "NVIDIA H100 SXM5 80GB" */
    double mem_bw;         /* bytes/s, device memory peak bandwidth */
    double tensor_flops;   /* FLOP/s, dense BF16 tensor cores (FP32 accumulate):
                              matmul and attention */
    double vector_flops;   /* FLOP/s, FP32 without tensor cores: element-wise ops */
    double link_bw;        /* bytes/s, host <-> device, one direction (PCIe) */
    double launch_s;       /* seconds of fixed cost per op (kernel launch) */
    uint64_t mem_bytes;    /* device memory */
    double fp8_flops;      /* FLOP/s, dense FP8 tensor cores; 0: none */
    double int8_flops;     /* OP/s, dense INT8 tensor cores; 0: none */
    double peer_bw;        /* bytes/s, device <-> device, one direction (NVLink, Infinity
                              Fabric); 0: over PCIe (link_bw) */
    double peer_latency_s; /* seconds per collective hop (all-reduce step, pipeline send) */
    double usd_per_hour;   /* rental price of one device; 0: owned (phone, laptop) */
    double bw_frac;        /* achievable fraction of mem_bw (calibrated), (0, 1] */
    double flops_frac;     /* achievable fraction of the tensor peaks (calibrated), (0, 1] */
    const char *source;    /* where the figures come from */
} kv_sim_device;

/* The peak an op's FLOPs are charged against. */
typedef enum kv_sim_peak {
    KV_SIM_PEAK_VECTOR = 0, /* vector_flops */
    KV_SIM_PEAK_BF16 = 1,   /* tensor_flops */
    KV_SIM_PEAK_FP8 = 2,    /* fp8_flops, or tensor_flops when the device has none */
    KV_SIM_PEAK_INT8 = 3    /* int8_flops, or tensor_flops when the device has none */
} kv_sim_peak;

/* What the clock charges each op to. */
typedef enum kv_sim_kind {
    KV_SIM_MATMUL = 0,    /* matmul */
    KV_SIM_ATTENTION = 1, /* attention, kv_store */
    KV_SIM_OTHER = 2,     /* get_rows, rmsnorm, rope, silu_mul, add, copy_block */
    KV_SIM_TRANSFER = 3,  /* upload, download (host <-> device) */
    KV_SIM_COMM = 4,      /* device <-> device: all-reduces (tensor parallel), pipeline
                             sends, the pipeline bubble, KV hand-over (disaggregated) */
    KV_SIM_KIND_COUNT
} kv_sim_kind;

/* The device table: *count entries (count may be NULL). */
const kv_sim_device *kv_sim_devices(int *count);
/* Finds a device by name, case-insensitively; "h100" and "a100" are
 * accepted for "h100-sxm" and "a100-80g". NULL when unknown. */
const kv_sim_device *kv_sim_device_find(const char *name);
/* The peak FLOP/s of d for peak p (before flops_frac). */
double kv_sim_peak_flops(const kv_sim_device *d, kv_sim_peak p);
/* The roofline time of one op: max(bytes / (mem_bw * bw_frac), flops /
 * (peak * flops_frac)) + launch_s, with peak = tensor_flops when tensor != 0,
 * else vector_flops (vector ops reach their peak: they are memory bound). */
double kv_sim_roofline_s(const kv_sim_device *d, double bytes, double flops, int tensor);
/* The same for an explicit peak; launch: add launch_s (0: a graph launch
 * covers it). */
double kv_sim_roofline_peak_s(const kv_sim_device *d, double bytes, double flops, kv_sim_peak p, int launch);

/* What one op costs the clock: the figures the sim's own ops charge, as
 * pure functions, so a synthetic model (engine/synthetic.c) that charges
 * the ops of a forward pass without computing them charges exactly what
 * the computing ops would. */
typedef struct kv_sim_cost {
    kv_sim_kind kind;
    double bytes;      /* device-memory bytes moved; KV_SIM_TRANSFER: bytes over the host link */
    double flops;
    kv_sim_peak peak;
    double seconds;    /* fixed time on top (collectives, bubbles, a graph launch) */
} kv_sim_cost;

/* matmul of n rows against a weight of M rows of K elements stored in
 * weight_bytes: the weight read once, x read and y written in f32. */
kv_sim_cost kv_sim_cost_matmul(double weight_bytes, double K, double M, int n, kv_sim_peak peak);
/* get_rows of n rows of ne0 elements, each row_bytes as stored. */
kv_sim_cost kv_sim_cost_get_rows(double row_bytes, double ne0, int n);
kv_sim_cost kv_sim_cost_rmsnorm(int n, int dim);
kv_sim_cost kv_sim_cost_rope(int n, int n_heads, int rot_dim);
kv_sim_cost kv_sim_cost_silu_mul(int64_t count);
kv_sim_cost kv_sim_cost_add(int64_t count);
/* The ops of the architectures past llama: GeGLU over count elements, a
 * scale over count, a bias added to n rows of dim. */
kv_sim_cost kv_sim_cost_gelu_mul(int64_t count);
kv_sim_cost kv_sim_cost_scale(int64_t count);
kv_sim_cost kv_sim_cost_add_rows(int n, int dim);
/* Mixture of experts: routing n rows of n_expert logits to k experts;
 * the weighted scatter-add of n rows of dim. */
kv_sim_cost kv_sim_cost_moe_route(int n, int n_expert, int k);
kv_sim_cost kv_sim_cost_scatter_add(int n, int dim);
/* kv_store of n_tokens tokens, n_kv_heads rows each of head_dim elements,
 * row_bytes as cached. */
kv_sim_cost kv_sim_cost_kv_store(int n_tokens, int n_kv_heads, int head_dim, double row_bytes);
/* The paged attention of a batch, summed by kv_sim_attention_sums:
 * sum_ctx_flops = sum over tokens of ctx * n_heads * (4 * head_dim + 5),
 * kv_rows = sum over sequences of their longest context in the batch. */
kv_sim_cost kv_sim_cost_attention(double sum_ctx_flops, double kv_rows, int n_tokens, int n_heads, int head_dim,
                                  double slot_bytes, int block_size);
/* The two sums above for batch ab (n_heads query heads of head_dim), a
 * token seeing at most window positions when window > 0 (sliding-window
 * layers: a windowed kernel reads only those rows); scratch: (ab->n_seqs)
 * ints, left zeroed. */
void kv_sim_attention_sums(const kv_attn_batch *ab, int n_heads, int head_dim, int window, int32_t *scratch,
                           double *sum_ctx_flops /* OUT */, double *kv_rows /* OUT */);
/* copy_block of one block (K and V, every layer, read and written). */
kv_sim_cost kv_sim_cost_copy_block(int n_layers, int block_size, double slot_bytes);

/* Name of a kind: "matmul", "attention", "other", "transfer", "comm". */
const char *kv_sim_kind_name(kv_sim_kind k);
/* Seconds c costs on d: the roofline for compute kinds (plus launch_s when
 * launch), bytes / link_bw (+ launch_s) for KV_SIM_TRANSFER, and c->seconds
 * on top for every kind (collectives, bubbles). */
double kv_sim_cost_seconds(const kv_sim_device *d, const kv_sim_cost *c, int launch);

#endif
