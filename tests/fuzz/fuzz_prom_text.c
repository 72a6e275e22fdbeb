/* fuzz_prom_text.c - libFuzzer target for the Prometheus text reader and
 * the histogram helpers (engine/prom_text.c), what `kvtop attach` reads from
 * a server's /metrics. Oracles: no crash, leak or sanitizer report; every
 * line is either a sample or counted as rejected (samples + rejected never
 * exceed the lines); a histogram that is gathered is ascending and ends at
 * +Inf, and its quantiles are NaN or inside its finite bounds. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../../engine/prom_text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_prom p = {0};
    kv_err err;
    if (kv_prom_parse((const char *)data, size, &p, &err)) return 0;
    if ((uint64_t)p.n + p.rejected > p.lines) abort();
    for (int i = 0; i < p.n && i < 8; i++) {
        const char *name = p.samples[i].name;
        kv_hist h;
        if (kv_prom_histogram(&p, name, &h) == 0) {
            if (h.n < 1 || !isinf(h.le[h.n - 1])) abort();
            for (int k = 1; k < h.n; k++)
                if (!(h.le[k] > h.le[k - 1]) || h.cum[k] < h.cum[k - 1]) abort();
            for (double q = 0.05; q < 1; q += 0.3) {
                double v = kv_hist_quantile(&h, q);
                double lo = h.le[0] < 0 ? h.le[0] : 0, hi = h.n >= 2 ? h.le[h.n - 2] : h.le[0];
                if (!isnan(v) && (v < lo - 1e-9 * fabs(lo) || v > hi + 1e-9 * fabs(hi))) abort();
            }
            kv_hist d;
            kv_hist_delta(&h, &h, &d);
            if (d.count != 0 && !isnan(d.count)) abort();
        }
        kv_prom_sum(&p, name, NULL);
    }
    kv_prom_free(&p);
    return 0;
}
