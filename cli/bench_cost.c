/* bench_cost.c - cost and per-device memory of a synthetic run (see
 * bench_cost.h). Money follows the simulated clock: the devices are rented
 * for the simulated seconds the run took. */
#include "bench_cost.h"

#include "../engine/metrics_json.h"

#include <math.h>
#include <string.h>

#define GB 1e9

void kv_bench_cost_of(const kv_bench_result *r, kv_bench_cost *out) {
    memset(out, 0, sizeof *out);
    const kv_metrics_summary *m = &r->m;
    if (!r->gpu.valid || !(m->sim_device_s > 0) || !(r->gpu.usd_per_hour > 0)) return;
    out->valid = 1;
    out->usd_per_hour = r->gpu.usd_per_hour;
    double usd = r->gpu.usd_per_hour * m->sim_device_s / 3600.0; /* the run's bill */
    if (r->gpu.pools) { /* each pool billed for its own busy time, as one pool is */
        double per = r->gpu.usd_per_hour / r->gpu.n_devices;
        usd = per * ((r->gpu.n_devices - r->gpu.prefill_devices) * m->sim_device_s +
                     r->gpu.prefill_devices * r->gpu.prefill_busy_ms / 1000.0) / 3600.0;
    }
    if (m->sim_tokens_out > 0) out->usd_per_million_output_tokens = usd / (double)m->sim_tokens_out * 1e6;
    if (r->completed > 0) out->usd_per_request = usd / (double)r->completed;
    /* goodput tokens: the output tokens of the requests within the SLA */
    double good = (double)m->good_output_tokens;
    if (good > 0) out->usd_per_million_goodput_tokens = usd / good * 1e6;
    out->api_price_per_mtok = r->cfg.sim.api_price_per_mtok;
    if (out->api_price_per_mtok > 0)
        out->crossover_output_tokens_per_s = r->gpu.usd_per_hour * 1e6 / (3600.0 * out->api_price_per_mtok);
}

void kv_bench_print_cost(FILE *f, const kv_bench_result *r) {
    const kv_gpu_memory *g = &r->gpu;
    if (!g->valid) return;
    fprintf(f, "devices        %d x %s (tp %d, pp %d, ep %d); per device of %.1f GB (%.1f usable): weights %.1f GB, "
               "KV %.1f GB (used %.1f, cached %.1f, free %.1f), activations %.2f GB, reserve %.1f GB\n",
            g->n_devices, g->device, g->tp, g->pp, g->ep, g->total / GB, g->usable / GB, g->weights / GB,
            (g->kv_used + g->kv_cached + g->kv_free) / GB, g->kv_used / GB, g->kv_cached / GB, g->kv_free / GB,
            g->activations / GB, g->reserve / GB);
    if (g->pools) {
        double span = g->clock_ms > 0 ? g->clock_ms : 1.0;
        fprintf(f, "decode pool    %d devices (the KV cache above), busy %.1f%% of %.1f s\n",
                g->n_devices - g->prefill_devices, 100.0 * r->m.sim_device_s * 1000.0 / span, span / 1000.0);
        fprintf(f, "prefill pool   %d devices, busy %.1f%%: %llu batches, mean wait for the pool %.1f ms; prompts on it "
                   "per step %.1f (max %d); KV of prompts per device %.2f GB now, %.2f GB at most, %.1f GB free\n",
                g->prefill_devices, 100.0 * g->prefill_busy_ms / span, (unsigned long long)g->prefill_batches,
                g->prefill_wait_ms, g->in_prefill_mean, g->in_prefill_max, g->prefill_kv_used / GB,
                g->prefill_kv_peak / GB, g->prefill_kv_free / GB);
        fprintf(f, "KV hand-over   %llu prompts, %.2f GB over the links in %.1f s (busy %.1f%%); in transfer per step "
                   "%.2f requests (max %d)\n",
                (unsigned long long)g->handovers, g->transfer_bytes / GB, g->transfer_busy_ms / 1000.0,
                100.0 * g->transfer_busy_ms / span, g->in_transfer_mean, g->in_transfer_max);
    }
    fprintf(f, "cold start     %.1f s to load the weights at sim.storage_bandwidth %.1f GB/s\n", g->cold_start_s,
            r->cfg.sim.storage_bandwidth);
    kv_bench_cost c;
    kv_bench_cost_of(r, &c);
    if (!c.valid) {
        fprintf(f, "cost           N/A (the device has no rental price: sim.device_usd_per_hour sets one)\n");
        return;
    }
    fprintf(f, "cost           $%.2f/h for the devices: $%.3f per million output tokens, $%.5f per request, $%.3f per "
               "million tokens within the SLA\n",
            c.usd_per_hour, c.usd_per_million_output_tokens, c.usd_per_request, c.usd_per_million_goodput_tokens);
    if (c.api_price_per_mtok > 0) {
        double load = r->m.sim_output_tokens_per_s;
        fprintf(f, "vs API         at $%.2f per million tokens self-hosting is cheaper above %.0f output tok/s "
                   "sustained; this run sustained %.0f (%s)\n",
                c.api_price_per_mtok, c.crossover_output_tokens_per_s, load,
                load > c.crossover_output_tokens_per_s ? "cheaper to self-host" : "cheaper to use the API");
    }
}

/* "pools": the disaggregated pools' figures. */
static void json_pools(kv_json_writer *w, const kv_bench_result *r) {
    const kv_gpu_memory *g = &r->gpu;
    double span = g->clock_ms > 0 ? g->clock_ms : 1.0;
    kv_json_write_key(w, "pools");
    kv_json_write_begin_object(w);
    kv_json_field_num(w, "clock_ms", g->clock_ms);
    kv_json_write_key(w, "decode");
    kv_json_write_begin_object(w);
    kv_json_field_uint(w, "devices", (uint64_t)(g->n_devices - g->prefill_devices));
    kv_json_field_num(w, "busy_ms", r->m.sim_device_s * 1000.0);
    kv_json_field_num(w, "utilisation", r->m.sim_device_s * 1000.0 / span);
    kv_json_write_end_object(w);
    kv_json_write_key(w, "prefill");
    kv_json_write_begin_object(w);
    kv_json_field_uint(w, "devices", (uint64_t)g->prefill_devices);
    kv_json_field_num(w, "busy_ms", g->prefill_busy_ms);
    kv_json_field_num(w, "utilisation", g->prefill_busy_ms / span);
    kv_json_field_uint(w, "batches", g->prefill_batches);
    kv_json_field_num(w, "mean_wait_ms", g->prefill_wait_ms);
    kv_json_field_num(w, "queue_mean", g->in_prefill_mean);
    kv_json_field_uint(w, "queue_max", (uint64_t)g->in_prefill_max);
    kv_json_field_uint(w, "kv_used", g->prefill_kv_used);
    kv_json_field_uint(w, "kv_peak", g->prefill_kv_peak);
    kv_json_field_uint(w, "kv_free", g->prefill_kv_free);
    kv_json_write_end_object(w);
    kv_json_write_key(w, "transfer");
    kv_json_write_begin_object(w);
    kv_json_field_uint(w, "handovers", g->handovers);
    kv_json_field_num(w, "bytes", g->transfer_bytes);
    kv_json_field_num(w, "busy_ms", g->transfer_busy_ms);
    kv_json_field_num(w, "utilisation", g->transfer_busy_ms / span);
    kv_json_field_num(w, "awaiting_mean", g->in_transfer_mean);
    kv_json_field_uint(w, "awaiting_max", (uint64_t)g->in_transfer_max);
    kv_json_write_end_object(w);
    kv_json_write_end_object(w);
}

void kv_bench_json_cost(kv_json_writer *w, const kv_bench_result *r) {
    const kv_gpu_memory *g = &r->gpu;
    if (!g->valid) return;
    kv_bench_cost c;
    kv_bench_cost_of(r, &c);
    kv_json_field_num(w, "usd_per_hour", g->usd_per_hour);
    kv_json_field_num(w, "usd_per_million_output_tokens", c.usd_per_million_output_tokens);
    kv_json_field_num(w, "usd_per_request", c.usd_per_request);
    kv_json_field_num(w, "usd_per_million_goodput_tokens", c.usd_per_million_goodput_tokens);
    kv_json_field_num(w, "api_price_per_mtok", c.api_price_per_mtok);
    kv_json_field_num(w, "crossover_output_tokens_per_s", c.crossover_output_tokens_per_s);
    kv_json_field_num(w, "cold_start_s", g->cold_start_s);
    kv_json_write_key(w, "gpu_memory");
    kv_json_write_begin_object(w);
    kv_json_field_str(w, "device", g->device);
    kv_json_field_uint(w, "n_devices", (uint64_t)g->n_devices);
    kv_json_field_uint(w, "tp", (uint64_t)g->tp);
    kv_json_field_uint(w, "pp", (uint64_t)g->pp);
    kv_json_field_uint(w, "ep", (uint64_t)g->ep);
    if (g->pools) json_pools(w, r);
    kv_json_write_key(w, "per_device");
    kv_json_write_begin_array(w);
    for (int i = 0; i < g->n_devices; i++) {
        kv_json_write_begin_object(w);
        kv_json_field_uint(w, "index", (uint64_t)i);
        kv_json_field_uint(w, "total", g->total);
        kv_json_field_uint(w, "usable", g->usable);
        kv_json_field_uint(w, "weights", g->weights);
        int pre = g->pools && i >= g->n_devices - g->prefill_devices; /* holds prompts in flight only */
        kv_json_field_uint(w, "kv_used", pre ? g->prefill_kv_used : g->kv_used);
        kv_json_field_uint(w, "kv_cached", pre ? 0 : g->kv_cached);
        kv_json_field_uint(w, "kv_free", pre ? g->prefill_kv_free : g->kv_free);
        kv_json_field_uint(w, "activations", g->activations);
        kv_json_field_uint(w, "reserve", g->reserve);
        if (g->pools) kv_json_field_str(w, "pool", pre ? "prefill" : "decode");
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
    kv_json_write_end_object(w);
}
