/* panels_gpu.c - the Mem panel for a synthetic model on the sim backend:
 * one device's memory as the plan divides it (weights / KV used / KV
 * cached / KV free / activations / reserve, out of the device's memory),
 * the number of devices, their price and the cold start; with
 * disaggregated pools the rows are a decode device's and one more line
 * gives a prefill device's KV of prompts in flight and the pool's load.
 * Drawn from the snapshot's kv_gpu_memory only. */
#include <stdio.h>
#include <string.h>

#include "format.h"
#include "panels_internal.h"

void kv_panel_gpu_mem(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_gpu_memory *g = &s->gpu;
    char extra[64], tot[16];
    kv_format_bytes(tot, sizeof tot, g->total);
    snprintf(extra, sizeof extra, "%d x %s, %s each", g->n_devices, g->device, tot);
    int ih, iw;
    if (!panel_open(w, v, s, g->pools ? "Mem per decode GPU" : "Mem per GPU", extra, NULL, &ih, &iw)) return;
    struct {
        const char *name;
        uint64_t bytes;
        int color;
    } rows[] = {
        {"weights", g->weights, KV_PAIR_TITLE}, {"kv used", g->kv_used, 2},      {"kv cached", g->kv_cached, KV_PAIR_CACHED},
        {"kv free", g->kv_free, 0},             {"activ.", g->activations, KV_PAIR_PREFILL}, {"reserve", g->reserve, 0},
    };
    int y = 1;
    for (int i = 0; i < 6 && y <= ih; i++, y++) {
        char val[16], bar[512];
        kv_format_bytes(val, sizeof val, rows[i].bytes);
        int lw = 10, vw = 10, bw = iw - lw - vw;
        kv_format_bar(bar, sizeof bar, bw > 0 ? bw : 0, g->total ? (double)rows[i].bytes / (double)g->total : 0, v->utf8);
        panel_textf(w, y, 1, lw, A_NORMAL, "%-9s", rows[i].name);
        if (bw > 0)
            panel_text(w, y, 1 + lw, bw, rows[i].color ? panel_pair(v, rows[i].color, A_BOLD) : A_DIM, bar, -1);
        panel_textf(w, y, 1 + lw + (bw > 0 ? bw : 0), vw, A_NORMAL, "%10s", val);
    }
    if (y <= ih) {
        char use[16];
        kv_format_bytes(use, sizeof use, g->usable);
        if (g->usd_per_hour > 0)
            panel_textf(w, y, 1, iw, A_DIM, "tp %d pp %d: %s usable  $%.2f/h  cold start %.0f s", g->tp, g->pp, use,
                        g->usd_per_hour, g->cold_start_s);
        else
            panel_textf(w, y, 1, iw, A_DIM, "tp %d pp %d: %s usable  cold start %.0f s", g->tp, g->pp, use,
                        g->cold_start_s);
    }
    if (g->pools && ++y <= ih) {
        char used[16], peak[16];
        kv_format_bytes(used, sizeof used, g->prefill_kv_used);
        kv_format_bytes(peak, sizeof peak, g->prefill_kv_peak);
        panel_textf(w, y, 1, iw, A_DIM, "prefill pool %d GPUs: prompts' KV %s (peak %s), busy %.0f%%, up to %d prompts",
                    g->prefill_devices, used, peak, g->clock_ms > 0 ? 100.0 * g->prefill_busy_ms / g->clock_ms : 0.0,
                    g->in_prefill_max);
    }
}
