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
 * through this header; status and reserve forward to the inner backend.
 * The device table and the cost of each op are in sim_cost.h; a synthetic
 * model (engine/synth_step.c) charges ops it does not compute through
 * ops.charge, which adds the same costs to the same clock. */
#ifndef KV_SIM_H
#define KV_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "sim_cost.h"

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

/* Charges the costs c[0..n) to b's clock in order, each with its launch
 * cost unless launch is 0 (one lock for all). No-op for other backends. */
void kv_sim_charge(kv_backend *b, const kv_sim_cost *c, int n, int launch);
/* Creates a sim backend modelling `device` (NULL: "h100-sxm") whose ops run
 * on a cpu backend of n_threads threads. Returns NULL with err naming the
 * device and listing the known ones when the name is unknown. Freed by
 * kv_backend_free. */
kv_backend *kv_sim_backend_create_device(const char *device, int n_threads, kv_err *err);
/* The same for a device described by the caller (a profile's own device):
 * *d is copied, its strings must be static or outlive the backend. Returns
 * NULL with err when a figure is not positive or a fraction is not in
 * (0, 1]. */
kv_backend *kv_sim_backend_create_custom(const kv_sim_device *d, int n_threads, kv_err *err);
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


#endif
