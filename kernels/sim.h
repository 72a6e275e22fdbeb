/* sim.h - the "sim" backend: a simulated data-centre GPU for teaching. Every
 * op is computed by an inner "cpu" backend (results are exactly the CPU's),
 * while a simulated clock advances by the time the chosen device would take
 * under a roofline model:
 *
 *   t(op) = max(bytes moved / memory bandwidth, flops / peak flops) + launch
 *
 * (host <-> device copies: bytes / link bandwidth + launch). mem_info reports
 * the device's memory, and allocations beyond it fail as they would there.
 * The engine reads the clock through the table (ops.clock, backend.h), not
 * through this header; status and reserve forward to the inner backend. */
#ifndef KV_SIM_H
#define KV_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* A device of the table. Bandwidths and peaks are vendor datasheet figures
 * (dense, i.e. without structured sparsity); launch_s is an assumption. */
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
} kv_sim_device;

/* What the clock charges each op to. */
typedef enum kv_sim_kind {
    KV_SIM_MATMUL = 0,    /* matmul */
    KV_SIM_ATTENTION = 1, /* attention, kv_store */
    KV_SIM_OTHER = 2,     /* get_rows, rmsnorm, rope, silu_mul, add, copy_block */
    KV_SIM_TRANSFER = 3,  /* upload, download (host <-> device) */
    KV_SIM_KIND_COUNT
} kv_sim_kind;

typedef struct kv_sim_stats {
    int valid;                        /* 0: not a sim backend (print N/A) */
    const kv_sim_device *device;      /* borrowed; static */
    double elapsed_s;                 /* simulated seconds since creation or reset */
    double kind_s[KV_SIM_KIND_COUNT]; /* the same, per kind (sums to elapsed_s) */
    uint64_t kind_ops[KV_SIM_KIND_COUNT]; /* ops charged, per kind */
    double bytes;                     /* device-memory bytes moved (transfers excluded) */
    double flops;                     /* floating-point operations */
    uint64_t used_bytes;              /* simulated device memory in use */
} kv_sim_stats;

/* The device table: *count entries (count may be NULL). */
const kv_sim_device *kv_sim_devices(int *count);
/* Finds a device by name, case-insensitively; "h100" and "a100" are
 * accepted for "h100-sxm" and "a100-80g". NULL when unknown. */
const kv_sim_device *kv_sim_device_find(const char *name);
/* The roofline time of one op: max(bytes / mem_bw, flops / peak) + launch_s,
 * with peak = tensor_flops when tensor != 0, else vector_flops. */
double kv_sim_roofline_s(const kv_sim_device *d, double bytes, double flops, int tensor);

/* Creates a sim backend modelling `device` (NULL: "h100-sxm") whose ops run
 * on a cpu backend of n_threads threads. Returns NULL with err naming the
 * device and listing the known ones when the name is unknown. Freed by
 * kv_backend_free. */
kv_backend *kv_sim_backend_create_device(const char *device, int n_threads, kv_err *err);
/* The registry's constructor ("sim"): the h100-sxm. */
kv_backend *kv_sim_backend_create(int n_threads, kv_err *err);

/* 1 when b is a sim backend. */
int kv_sim_is(const kv_backend *b);
/* Simulated seconds since creation or the last reset; 0 for other backends
 * (ops.clock's elapsed_s). */
double kv_sim_elapsed_s(kv_backend *b);
/* Zeroes the clock, the per-kind totals and the byte/flop counters (memory
 * in use is kept). No-op for other backends. */
void kv_sim_reset(kv_backend *b);
/* Fills *out (valid = 0 for other backends). Safe to call from another
 * thread than the one running ops. */
void kv_sim_stats_get(kv_backend *b, kv_sim_stats *out);
/* The inner cpu backend (borrowed; valid until kv_backend_free), or NULL. */
kv_backend *kv_sim_inner(kv_backend *b);
/* Name of a kind: "matmul", "attention", "other", "transfer". */
const char *kv_sim_kind_name(kv_sim_kind k);

#endif
