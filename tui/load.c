/* load.c - load injection (F5, /inject): background sessions that replay
 * the profile's workload against the running engine, open loop on the
 * workload's arrival times or closed loop (one request per session in
 * flight). The workload driver (engine/driver.h) decides what is due and
 * builds the requests, as it does for `kvtop bench`. Their tokens feed the
 * inter-token latency histories (chat.c). */
#include "app_internal.h"

#include <stdlib.h>
#include <string.h>

void load_stop(app *a) {
    load_state *L = &a->load;
    for (int i = 0; i < L->n_inflight; i++)
        if (a->eng) kv_engine_cancel(a->eng, L->inflight[i]);
    kv_driver_free(L->drv);
    L->drv = NULL;
    L->sessions = 0;
    /* In-flight ids stay until their DONE (cancelled) arrives. */
}

void load_start(app *a, int sessions) {
    load_state *L = &a->load;
    if (!a->eng) {
        app_status(a, 1, "no engine yet");
        return;
    }
    if (L->drv) load_stop(a);
    sessions = sessions > 0 ? sessions : 1;
    /* The workload over and over: open loop on the wall clock, or closed
     * loop with one request per background session in flight; outputs cut
     * to the context; the engine's sampling (seed as configured). */
    kv_driver_opts o = {
        .repeat = 1,
        .closed_slots = KV_MIN(sessions, MAX_LOAD_INFLIGHT), /* no more in flight than can be tracked */
        .max_in_flight = MAX_LOAD_INFLIGHT,
        .fit_ctx = a->max_ctx,
        .session_base = KV_SESSION_LOAD_BASE,
        .n_sessions = sessions,
    };
    kv_err err;
    L->drv = kv_driver_new(a->eng, &a->cfg, &o, &err);
    if (!L->drv) {
        app_status(a, 1, "load: %s", err.msg);
        return;
    }
    int n_items = kv_driver_count(L->drv);
    if (n_items <= 0) {
        kv_driver_free(L->drv);
        L->drv = NULL;
        app_status(a, 1, "load: the workload has no requests");
        return;
    }
    L->sessions = sessions;
    app_status(a, 0, "load: %d background sessions from the profile's workload (%d requests, %s)", L->sessions,
               n_items,
               kv_driver_closed(L->drv) ? "closed loop"
               : a->cfg.workload.arrival == KV_ARRIVAL_BURST ? "burst" : "poisson");
}

int load_submit_due(app *a) {
    load_state *L = &a->load;
    if (!L->drv || !a->eng) return 0;
    kv_driver_sub sub[LOAD_SUBMIT_CAP];
    kv_err err;
    int n = kv_driver_submit_due(L->drv, app_wall_s() * 1000.0, L->n_inflight, sub, (int)KV_ARRAY_LEN(sub), &err);
    for (int k = 0; k < n; k++) {
        /* an item that could not be sent (prompt over the context, refused)
         * is skipped, as the workload goes round again anyway */
        if (sub[k].id > 0 && L->n_inflight < MAX_LOAD_INFLIGHT) {
            L->inflight[L->n_inflight] = sub[k].id;
            L->last_tok_ms[L->n_inflight] = -1;
            L->n_inflight++;
        }
    }
    return n < 0 ? 0 : n;
}

/* One batch a frame: keeps a frame short. */
void load_tick(app *a) { load_submit_due(a); }

int load_slot(app *a, int64_t req) {
    for (int i = 0; i < a->load.n_inflight; i++)
        if (a->load.inflight[i] == req) return i;
    return -1;
}
