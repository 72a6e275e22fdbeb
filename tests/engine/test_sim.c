/* test_sim.c - the engine on the simulated GPU backend: the simulated clock
 * (per-step device time, tokens per simulated second, a clock that a
 * driver can advance) reaches the engine through the backend table, and
 * the greedy text is the CPU backend's. (The sim backend's ops, clock and
 * memory model: tests/kernels/test_sim.c.) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/engine.h"
#include "../engine_helpers.h"
#include "../harness.h"

/* The engine on the sim backend: every step that ran the model reports
 * its simulated device time, the metrics' total is their sum, tokens per
 * simulated second follow, and the greedy text is the CPU backend's. On
 * the cpu backend all of it is 0. */
static void run_engine(const char *backend, int sim_clock, kv_snapshot *s, char texts[3][512]) {
    kv_config c;
    test_engine_config(&c, NULL, 1, 64, 4, 64);
    snprintf(c.backend, sizeof c.backend, "%s", backend);
    snprintf(c.sim_device, sizeof c.sim_device, "h100");
    c.sim_clock = sim_clock;
    c.scheduler.prefill_chunk = 16;
    c.sampling.temperature = 0;
    kv_err err = {0};
    kv_engine *e = kv_engine_new(&c, &err);
    REQUIRE(e);
    const int virt = !strcmp(backend, "sim") && sim_clock;
    CHECK(kv_engine_clock_is_virtual(e) == virt);
    if (virt) {
        /* the simulated clock starts at 0, stands still while idle, and a
         * driver can move it to the next arrival */
        CHECK(kv_engine_now_ms(e) == 0.0);
        CHECK(kv_engine_advance_clock(e, 250.0) == 0 && kv_engine_now_ms(e) == 250.0);
        CHECK(kv_engine_advance_clock(e, -1.0) == KV_ERR_INVAL && kv_engine_advance_clock(e, NAN) == KV_ERR_INVAL);
        CHECK(kv_engine_now_ms(e) == 250.0);
    } else {
        CHECK(kv_engine_advance_clock(e, 250.0) == KV_ERR_INVAL);
    }
    static const char *const prompts[3] = {"Once upon a time", "Tom and Lily", "The cat sat"};
    int64_t ids[3];
    for (int i = 0; i < 3; i++) CHECK((ids[i] = test_submit(e, prompts[i], NULL, 0, 24, 1, 0)) > 0);
    CHECK(kv_engine_run_until_idle(e) == 0);
    CHECK(kv_engine_snapshot(e, s) == 0);
    if (virt) {
        /* every request arrived at 250 ms; nothing was idle afterwards, so
         * the clock moved exactly by the steps' device time */
        double end = kv_engine_now_ms(e);
        CHECKF(fabs(end - 250.0 - 1000.0 * s->metrics.sim_device_s) < 1e-6, "clock %g ms, device %g s", end,
               s->metrics.sim_device_s);
        CHECK(s->metrics.ttft_ms.valid && s->metrics.ttft_ms.max <= end - 250.0 + 1e-9);
        CHECKF(fabs(s->metrics.elapsed_s - s->metrics.sim_device_s) < 1e-9, "elapsed %g vs device %g",
               s->metrics.elapsed_s, s->metrics.sim_device_s);
    }
    for (int i = 0; i < 3; i++) CHECK(kv_engine_request_text(e, ids[i], texts[i], 512) >= 0);
    kv_engine_free(e);
}

static void test_sim_engine_clock(void) {
    kv_snapshot *sim = kv_snapshot_new(), *cpu = kv_snapshot_new();
    REQUIRE(sim && cpu);
    char ts[3][512], tc[3][512];
    run_engine("sim", 1, sim, ts);
    run_engine("cpu", 1, cpu, tc);
    for (int i = 0; i < 3; i++) CHECKF(!strcmp(ts[i], tc[i]), "request %d: '%s' vs '%s'", i, ts[i], tc[i]);
    CHECK(!strcmp(sim->sim_device, "h100-sxm") && cpu->sim_device[0] == 0);
    const kv_metrics_summary *m = &sim->metrics;
    double sum = 0;
    int ran = 0;
    for (int i = 0; i < sim->n_steps; i++) {
        const kv_step_record *r = &sim->steps[i];
        int toks = r->n_prefill_tokens + r->n_decode_tokens + r->n_spec_tokens;
        if (toks > 0) {
            ran++;
            CHECKF(r->sim_ms > 0, "step %llu: %d tokens, sim %g ms", (unsigned long long)r->step, toks, r->sim_ms);
        }
        sum += r->sim_ms;
    }
    REQUIRE(sim->step <= (uint64_t)sim->n_steps); /* the whole run is in the ring */
    CHECK(ran > 0);
    CHECKF(fabs(sum - 1000.0 * m->sim_device_s) <= 1e-9 * sum + 1e-12, "steps %g ms, metrics %g s", sum,
           m->sim_device_s);
    CHECKF(m->sim_tokens_out == 72 && m->output_tokens == 72, "%llu tokens", (unsigned long long)m->sim_tokens_out);
    CHECK(fabs(m->sim_output_tokens_per_s - 72.0 / m->sim_device_s) <= 1e-6 * m->sim_output_tokens_per_s);
    CHECK(cpu->metrics.sim_device_s == 0 && cpu->metrics.sim_output_tokens_per_s == 0 && cpu->metrics.sim_tokens_out == 0);
    for (int i = 0; i < cpu->n_steps; i++) CHECK(cpu->steps[i].sim_ms == 0);
    /* sim_clock off: host time again, the device time still recorded */
    char tw[3][512];
    run_engine("sim", 0, cpu, tw);
    CHECK(cpu->metrics.sim_device_s == m->sim_device_s || fabs(cpu->metrics.sim_device_s - m->sim_device_s) < 1e-12);
    for (int i = 0; i < 3; i++) CHECK(!strcmp(tw[i], ts[i]));
    kv_snapshot_free(sim);
    kv_snapshot_free(cpu);
}

TEST_MAIN(T(test_sim_engine_clock))
