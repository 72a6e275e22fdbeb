/* sim_cost.c - the device table and the cost of each op (sim_cost.h). */
#include "sim_cost.h"

#include <string.h>
#include <strings.h>

#include "types.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

/* Vendor datasheet figures (dense; the datasheets' larger tensor numbers
 * assume 2:4 structured sparsity and are halved here). Memory sizes are
 * taken as GiB (what nvidia-smi prints is close to it). Each entry's source
 * string names the datasheet; prices are on-demand rental list prices per
 * device-hour as published in 2024 (they move: a profile can override the
 * whole device, see kv_sim_backend_create_custom).
 *
 * Calibration of the achievable fractions (bw_frac, flops_frac): decode is
 * a stream of GEMVs, and the memory-bound kernels of TensorRT-LLM and vLLM
 * reach 75-85% of HBM peak on H100/A100 (NVIDIA's and the vLLM authors'
 * bandwidth-utilisation figures); large GEMMs reach 60-75% of the dense
 * tensor peak (cuBLAS at realistic shapes). We take 0.80 and 0.65 for the
 * data-centre parts and check the result against published throughput in
 * the README's validation table (median error there); GDDR cards and
 * unified-memory parts get 0.85 of bandwidth (simpler memory systems, one
 * die) and the same compute fraction. NOTE: these are the model's only
 * fitted parameters, and they are fitted per device class, not per model.
 *
 * The 4 us per-op launch cost is an assumption (measured kernel launch plus
 * dependency overheads are a few microseconds), not a datasheet figure.
 *
 * Re-checked (kvtop's library search over stored public pages and
 * repositories): H100 SXM 3.35 TB/s, 989 / 1979 TF dense BF16 / FP8, NVLink
 * 900 GB/s both ways, PCIe Gen5 128 GB/s both ways (NVIDIA's table as
 * reproduced by glennklockwood.com/garden/processors/h100 and HPC Tech's
 * H100 page, which halves the sparse figures); H200 141 GB HBM3e at
 * 4.8 TB/s, compute as H100; MI300X 192 GB HBM3 at 5.3 TB/s, ~1.3 PF FP16
 * and ~2.6 PF FP8 dense, Infinity Fabric 128 GB/s both ways a link, 448 GB/s
 * a GPU one way. Memory as nvidia-smi reports it (memory.total, ECC on):
 * H100 81,559 MiB and H200 143,771 MiB (0.4% under the 80 / 141 GiB kept
 * here), but L4 23,034 MiB and L40S 46,068 MiB, 6% under their 24 / 48 GB
 * labels: those two use what the card reports. Prices were not re-fetched
 * from the providers: rental listings seen in the same search span
 * $1.90-2.94 for an H100 and $1.71-1.85 for an MI300X (gpu.blog, 2025), and
 * $3-5 for an MI300X elsewhere (codesota.com): a profile sets its own with
 * sim.device_usd_per_hour. */
#define GB_S 1e9
#define TF 1e12
static const kv_sim_device devices[] = {
    {"h100-sxm", "NVIDIA H100 SXM5 80GB", 3.35e12, 989 * TF, 67 * TF, 64 * GB_S, 4e-6, (uint64_t)(80 * GIB),
     1979 * TF, 1979 * TF, 450 * GB_S, 2e-6, 2.99, 0.80, 0.65,
     "NVIDIA H100 Tensor Core GPU datasheet (SXM5: HBM3 3.35 TB/s, BF16 989 TF, FP8/INT8 1979 dense, "
     "NVLink 900 GB/s both ways, PCIe Gen5 x16); price: Lambda on-demand 8x H100 SXM, per GPU"},
    {"a100-80g", "NVIDIA A100 80GB SXM", 2.039e12, 312 * TF, 19.5 * TF, 32 * GB_S, 4e-6, (uint64_t)(80 * GIB), 0,
     624 * TF, 300 * GB_S, 2e-6, 1.79, 0.80, 0.65,
     "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM: HBM2e 2,039 GB/s, BF16 312 TF, INT8 624 TOPS dense, "
     "no FP8, NVLink 600 GB/s both ways, PCIe Gen4 x16); price: Lambda on-demand 8x A100 80GB SXM, per GPU"},
    {"l4", "NVIDIA L4 24GB", 300e9, 121 * TF, 30.3 * TF, 32 * GB_S, 4e-6, (uint64_t)(23034 * MIB), 242.5 * TF,
     242.5 * TF, 0, 5e-6, 0.81, 0.85, 0.65,
     "NVIDIA L4 datasheet (24 GB GDDR6, 23,034 MiB as nvidia-smi reports it with ECC on; 300 GB/s, BF16 121 TF, FP8/INT8 242.5 dense, PCIe Gen4 x16, no NVLink); "
     "price: Google Cloud g2-standard-8 on-demand, us-central1"},
    {"rtx4090", "NVIDIA GeForce RTX 4090 24GB", 1.008e12, 165.2 * TF, 82.6 * TF, 32 * GB_S, 4e-6,
     (uint64_t)(24 * GIB), 330.3 * TF, 660.6 * TF, 0, 5e-6, 0.40, 0.85, 0.65,
     "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090: GDDR6X 1,008 GB/s, BF16 165.2 TF with FP32 "
     "accumulate, FP8 330.3, INT8 660.6 dense, PCIe Gen4 x16, no NVLink); price: community-cloud typical"},
    {"h200", "NVIDIA H200 SXM 141GB", 4.8e12, 989 * TF, 67 * TF, 64 * GB_S, 4e-6, (uint64_t)(141 * GIB),
     1979 * TF, 1979 * TF, 450 * GB_S, 2e-6, 3.79, 0.80, 0.65,
     "NVIDIA H200 Tensor Core GPU datasheet (HBM3e 141 GB at 4.8 TB/s, compute as H100 SXM, NVLink 900 GB/s "
     "both ways); price: typical 2024 on-demand per GPU"},
    {"a100-40g", "NVIDIA A100 40GB SXM", 1.555e12, 312 * TF, 19.5 * TF, 32 * GB_S, 4e-6, (uint64_t)(40 * GIB), 0,
     624 * TF, 300 * GB_S, 2e-6, 1.29, 0.80, 0.65,
     "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM: HBM2 1,555 GB/s, BF16 312 TF, INT8 624 TOPS dense); "
     "price: Lambda on-demand 8x A100 40GB SXM, per GPU"},
    {"l40s", "NVIDIA L40S 48GB", 864e9, 362 * TF, 91.6 * TF, 32 * GB_S, 4e-6, (uint64_t)(46068 * MIB), 733 * TF,
     733 * TF, 0, 5e-6, 1.25, 0.85, 0.65,
     "NVIDIA L40S datasheet (48 GB GDDR6, 46,068 MiB as nvidia-smi reports it with ECC on; 864 GB/s, BF16 362 TF, FP8/INT8 733 dense, PCIe Gen4 x16, no NVLink); "
     "price: typical 2024 on-demand"},
    {"mi300x", "AMD Instinct MI300X 192GB", 5.3e12, 1307.4 * TF, 163.4 * TF, 64 * GB_S, 4e-6,
     (uint64_t)(192 * GIB), 2614.9 * TF, 2614.9 * TF, 448 * GB_S, 3e-6, 3.49, 0.80, 0.65,
     "AMD Instinct MI300X datasheet (HBM3 5.3 TB/s, FP16/BF16 1307.4 TF, FP8/INT8 2614.9 dense, Infinity "
     "Fabric 7 x 64 GB/s per direction, PCIe Gen5 x16); price: typical 2024 on-demand per GPU"},
    {"phone-8g", "Phone SoC, 8 GB LPDDR5X", 76.8e9, 4.6 * TF, 2.3 * TF, 76.8e9, 10e-6, (uint64_t)(8 * GIB), 0,
     34 * TF, 0, 10e-6, 0, 0.85, 0.65,
     "Snapdragon 8 Gen 3 class: LPDDR5X-4800 64-bit (76.8 GB/s) shared by CPU, GPU and NPU; Adreno 750 FP16 "
     "about 4.6 TF, Hexagon NPU INT8 about 34 TOPS; 8 GB of RAM in all (the OS keeps some: sim.memory_utilization)"},
    {"apple-m3-max", "Apple M3 Max laptop, 64 GB unified", 400e9, 14.2 * TF, 14.2 * TF, 400e9, 5e-6,
     (uint64_t)(64 * GIB), 0, 0, 0, 5e-6, 0, 0.85, 0.65,
     "Apple M3 Max (40-core GPU) specifications: 400 GB/s unified memory, GPU about 14.2 TF FP32 (FP16 at the "
     "same rate), 64 GB configuration"},
};

static const struct {
    const char *alias, *name;
} aliases[] = {{"h100", "h100-sxm"}, {"a100", "a100-80g"}, {"h200-sxm", "h200"}, {"a100-80gb", "a100-80g"},
               {"a100-40gb", "a100-40g"}, {"m3-max", "apple-m3-max"}, {"phone", "phone-8g"}};

const kv_sim_device *kv_sim_devices(int *count) {
    if (count) *count = (int)KV_ARRAY_LEN(devices);
    return devices;
}

const kv_sim_device *kv_sim_device_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < KV_ARRAY_LEN(aliases); i++)
        if (!strcasecmp(name, aliases[i].alias)) name = aliases[i].name;
    for (size_t i = 0; i < KV_ARRAY_LEN(devices); i++)
        if (!strcasecmp(name, devices[i].name)) return &devices[i];
    return NULL;
}

double kv_sim_peak_flops(const kv_sim_device *d, kv_sim_peak p) {
    if (!d) return 0.0;
    switch (p) {
    case KV_SIM_PEAK_VECTOR: return d->vector_flops;
    case KV_SIM_PEAK_FP8: return d->fp8_flops > 0 ? d->fp8_flops : d->tensor_flops;
    case KV_SIM_PEAK_INT8: return d->int8_flops > 0 ? d->int8_flops : d->tensor_flops;
    case KV_SIM_PEAK_BF16:
    default: return d->tensor_flops;
    }
}

double kv_sim_roofline_peak_s(const kv_sim_device *d, double bytes, double flops, kv_sim_peak p, int launch) {
    if (!d) return 0.0;
    double frac = p == KV_SIM_PEAK_VECTOR ? 1.0 : d->flops_frac;
    double tm = bytes / (d->mem_bw * d->bw_frac), tc = flops / (kv_sim_peak_flops(d, p) * frac);
    return (tm > tc ? tm : tc) + (launch ? d->launch_s : 0.0);
}

double kv_sim_roofline_s(const kv_sim_device *d, double bytes, double flops, int tensor) {
    return kv_sim_roofline_peak_s(d, bytes, flops, tensor ? KV_SIM_PEAK_BF16 : KV_SIM_PEAK_VECTOR, 1);
}

static const char *const kind_names[KV_SIM_KIND_COUNT] = {"matmul", "attention", "other", "transfer", "comm"};

const char *kv_sim_kind_name(kv_sim_kind k) {
    return (int)k >= 0 && k < KV_SIM_KIND_COUNT ? kind_names[k] : "unknown";
}

/* ---- costs (shared by the sim's ops and by synthetic models) ------------- */

static kv_sim_cost cost(kv_sim_kind kind, double bytes, double flops, kv_sim_peak peak) {
    kv_sim_cost k = {kind, bytes, flops, peak, 0.0};
    return k;
}

kv_sim_cost kv_sim_cost_matmul(double weight_bytes, double K, double M, int n, kv_sim_peak peak) {
    /* the weights read once for all n rows (the op's contract); x read, y written in f32 */
    return cost(KV_SIM_MATMUL, weight_bytes + (double)n * K * 4.0 + (double)n * M * 4.0, 2.0 * n * K * M, peak);
}

kv_sim_cost kv_sim_cost_get_rows(double rs, double ne0, int n) {
    return cost(KV_SIM_OTHER, (double)n * (rs + 4.0 * ne0 + 4.0), (double)n * ne0, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_rmsnorm(int n, int dim) {
    double e = (double)n * dim;
    return cost(KV_SIM_OTHER, 8.0 * e + 4.0 * dim, 4.0 * e, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_rope(int n, int n_heads, int rot_dim) {
    double e = (double)n * n_heads * rot_dim; /* rotated elements: read and written */
    return cost(KV_SIM_OTHER, 8.0 * e + 4.0 * n, 3.0 * e, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_silu_mul(int64_t count) {
    return cost(KV_SIM_OTHER, 12.0 * (double)count, 5.0 * (double)count, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_add(int64_t count) {
    return cost(KV_SIM_OTHER, 12.0 * (double)count, (double)count, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_gelu_mul(int64_t count) {
    return cost(KV_SIM_OTHER, 12.0 * (double)count, 10.0 * (double)count, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_scale(int64_t count) {
    return cost(KV_SIM_OTHER, 8.0 * (double)count, (double)count, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_add_rows(int n, int dim) {
    return cost(KV_SIM_OTHER, 8.0 * n * (double)dim + 4.0 * dim, (double)n * dim, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_moe_route(int n, int n_expert, int k) {
    return cost(KV_SIM_OTHER, 4.0 * n * (double)n_expert + 8.0 * n * (double)k,
                (double)n * n_expert * (6.0 + k), KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_scatter_add(int n, int dim) {
    return cost(KV_SIM_OTHER, 12.0 * n * (double)dim + 8.0 * n, 2.0 * n * (double)dim, KV_SIM_PEAK_VECTOR);
}

kv_sim_cost kv_sim_cost_kv_store(int n_tokens, int n_kv_heads, int head_dim, double row_bytes) {
    double rows = (double)n_tokens * n_kv_heads; /* per K and V */
    return cost(KV_SIM_ATTENTION, 2.0 * rows * (4.0 * head_dim + row_bytes), 2.0 * rows * head_dim * 2.0,
                KV_SIM_PEAK_VECTOR);
}

/* NOTE: the model is a paged flash-attention kernel: each sequence's K/V
 * rows are read once for all of its query tokens in the batch (their
 * longest context), while every query token does its own 4 * ctx * head_dim
 * flops per head (q.k and p.v). */
kv_sim_cost kv_sim_cost_attention(double sum_ctx_flops, double kv_rows, int n_tokens, int n_heads, int head_dim,
                                  double slot_bytes, int block_size) {
    double bytes = 2.0 * kv_rows * slot_bytes + 2.0 * n_tokens * n_heads * head_dim * 4.0 + kv_rows / block_size * 4.0;
    return cost(KV_SIM_ATTENTION, bytes, sum_ctx_flops, KV_SIM_PEAK_BF16);
}

void kv_sim_attention_sums(const kv_attn_batch *ab, int n_heads, int head_dim, int window, int32_t *scratch,
                           double *sum_ctx_flops, double *kv_rows) {
    double flops = 0.0, rows = 0.0;
    for (int i = 0; i < ab->n_tokens; i++) {
        int s = ab->seq[i];
        if (s >= 0 && s < ab->n_seqs) scratch[s] = 0;
    }
    for (int i = 0; i < ab->n_tokens; i++) {
        int s = ab->seq[i];
        const int32_t seen = window > 0 ? KV_MIN(ab->pos[i] + 1, window) : ab->pos[i] + 1;
        flops += (double)seen * n_heads * (4.0 * head_dim + 5.0); /* + the softmax's few flops per score */
        if (s >= 0 && s < ab->n_seqs && seen > scratch[s]) scratch[s] = seen;
    }
    for (int i = 0; i < ab->n_tokens; i++) { /* each sequence once */
        int s = ab->seq[i];
        if (s >= 0 && s < ab->n_seqs && scratch[s] > 0) {
            rows += scratch[s];
            scratch[s] = 0;
        }
    }
    *sum_ctx_flops = flops;
    *kv_rows = rows;
}

kv_sim_cost kv_sim_cost_copy_block(int n_layers, int block_size, double slot_bytes) {
    double blk = (double)block_size * slot_bytes;
    return cost(KV_SIM_OTHER, 2.0 * 2.0 * n_layers * blk, 0.0, KV_SIM_PEAK_VECTOR); /* K and V, read and written */
}

double kv_sim_cost_seconds(const kv_sim_device *d, const kv_sim_cost *c, int launch) {
    if (!d || !c) return 0.0;
    double t = c->kind == KV_SIM_TRANSFER ? c->bytes / d->link_bw + (launch ? d->launch_s : 0.0)
               : c->kind == KV_SIM_COMM   ? 0.0
                                          : kv_sim_roofline_peak_s(d, c->bytes, c->flops, c->peak, launch);
    return t + c->seconds;
}
