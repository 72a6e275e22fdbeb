/* loader.c - the engine's lifecycle: kv_engine_new runs on a loader thread
 * so the screen is up (and typing works) while the model loads; the UI
 * thread picks up the result, starts the engine and sends what waited for
 * it. /load builds the next engine the same way while the running one goes
 * on serving its tabs; only once the new one is up is the old one retired,
 * so a profile whose model fails to load leaves everything as it was. */
#include "app_internal.h"

#include <stdio.h>
#include <string.h>

static void *loader_main(void *p) {
    app *a = p;
    a->loaded = kv_engine_new(&a->load_cfg, &a->load_err);
    atomic_store(&a->loader_done, 1);
    return NULL;
}

int loader_start(app *a, const kv_config *cfg, const char *path) {
    if (a->loader_running) {
        app_status(a, 1, "still loading %.200s: /load again once it is up", a->load_path);
        return -1;
    }
    a->load_cfg = *cfg;
    a->loaded = NULL;
    kv_err_clear(&a->load_err);
    atomic_store(&a->loader_done, 0);
    snprintf(a->load_path, sizeof a->load_path, "%s", path ? path : "(defaults)");
    /* With an engine running, it stays in charge (and the phase with it)
     * until the new one is up. */
    int reload = a->eng != NULL;
    if (!reload) {
        a->v.phase = KV_PHASE_LOADING;
        snprintf(a->v.load_msg, sizeof a->v.load_msg, "loading %.480s ...", cfg->model.path);
    }
    sigset_t old;
    app_block_signals(&old);
    int rc = pthread_create(&a->loader, NULL, loader_main, a);
    app_restore_signals(&old);
    if (rc) {
        if (!reload) {
            a->v.phase = KV_PHASE_FAILED;
            snprintf(a->v.load_msg, sizeof a->v.load_msg, "cannot start the loader thread");
        }
        app_status(a, 1, "cannot start the loader thread");
        return -1;
    }
    a->loader_running = 1;
    a->v.reloading = reload;
    return 0;
}

/* Frees the running engine: the load stops, the replies in flight are
 * marked cancelled, the step log notes the restart; a recording goes on
 * with the next engine. */
static void engine_retire(app *a) {
    load_stop(a);
    a->load.n_inflight = 0;
    if (a->eng) {
        serve_stop(a); /* before its engine goes */
        record_detach(a);
        kv_engine_free(a->eng);
        a->eng = NULL;
    }
    a->model = NULL;
    a->have_snap = 0;
    a->n_forget = 0;
    /* A new engine counts steps from 0 again. */
    a->log_have = 0;
    a->log_last_step = 0;
    a->last_prefix_hits = 0;
    if (a->log_n) {
        kv_decision d;
        memset(&d, 0, sizeof d);
        d.kind = KV_DEC_WAIT;
        snprintf(d.text, sizeof d.text, "---- engine restarted ----");
        app_log_push(a, &d);
    }
    for (int i = 0; i < a->n_sessions; i++) {
        kv_session *s = a->sessions[i];
        if (s->req) {
            kv_session_reply_end(s, KV_FINISH_CANCELLED);
            s->req = 0;
            app_note(s, "[engine restarted]");
        }
    }
}

/* The load failed: with an engine running it keeps running; without one
 * the app shows why and waits for /load. */
static void load_failed(app *a) {
    const char *why = a->load_err.msg[0] ? a->load_err.msg : "load failed";
    if (a->eng) {
        app_status(a, 1, "/load failed, still running %.100s: %.140s (%.100s)", a->profile_path, why, a->load_path);
        return;
    }
    a->v.phase = KV_PHASE_FAILED;
    snprintf(a->v.load_msg, sizeof a->v.load_msg, "%s", why);
    app_status(a, 1, "%s", a->v.load_msg);
    for (int i = 0; i < a->n_sessions; i++)
        if (a->sessions[i]->waiting_engine) app_note(a->sessions[i], "no engine: %s", a->v.load_msg);
}

void loader_adopt(app *a) {
    a->model = kv_engine_model(a->eng);
    a->plain = a->model->chat_template == NULL || !a->model->chat_template[0];
    a->tmpl = kv_chat_detect(a->model->chat_template);
    a->v.template_name = a->plain ? "as-is" : kv_chat_tmpl_name(a->tmpl);
    a->max_ctx = a->cfg.scheduler.max_seq_len > 0 ? a->cfg.scheduler.max_seq_len : a->model->hp.ctx_len;
    if (a->max_ctx <= 0 || a->max_ctx > a->model->hp.ctx_len) a->max_ctx = a->model->hp.ctx_len;
    a->v.config_max_batched = a->cfg.scheduler.max_batched_tokens;
    a->v.show_token_source = a->cfg.ui.show_token_source;
}

void loader_check(app *a) {
    if (!a->loader_running || !atomic_load(&a->loader_done)) return;
    pthread_join(a->loader, NULL);
    a->loader_running = 0;
    a->v.reloading = 0;
    if (!a->loaded) {
        load_failed(a);
        return;
    }
    int reload = a->eng != NULL;
    if (reload) engine_retire(a);
    a->eng = a->loaded;
    a->loaded = NULL;
    a->cfg = a->load_cfg;
    snprintf(a->profile_path, sizeof a->profile_path, "%s", a->load_path);
    snprintf(a->v.profile_path, sizeof a->v.profile_path, "%.250s", a->load_path);
    loader_adopt(a);
    int slow = commands_slow_ms(a);
    kv_engine_set_step_delay(a->eng, slow ? slow : a->cfg.ui.step_delay_ms);
    if (a->paused) kv_engine_pause(a->eng);
    /* A recording started before the engine was up sees its first step;
     * one that spans a /load marks the new engine's steps as a restart. */
    if (a->rec && !a->rec_hooked) kv_trace_writer_restart(a->rec);
    if (record_attach(a)) {
        atomic_store(&a->rec_err, KV_ERR_NOMEM);
        record_stop(a);
    }
    sigset_t old;
    app_block_signals(&old);
    int rc = kv_engine_start(a->eng);
    app_restore_signals(&old);
    if (rc) {
        app_status(a, 1, "cannot start the engine thread");
        record_detach(a);
        kv_engine_free(a->eng);
        a->eng = NULL;
        a->v.phase = KV_PHASE_FAILED;
        return;
    }
    a->v.phase = KV_PHASE_READY;
    serve_start(a);
    snprintf(a->v.load_msg, sizeof a->v.load_msg, "%s", a->model->name);
    if (reload) app_status(a, 0, "profile %.200s loaded (%.100s)", a->profile_path, a->model->name);
    /* what loading had to guess: on the status line (as an error, so it
     * stays 8 s) and in every tab's log, where it stays */
    char warn[KV_MAX_WARNINGS][KV_WARNING_LEN];
    int nw = kv_engine_warnings(a->eng, warn, KV_MAX_WARNINGS);
    for (int w = 0; w < nw; w++)
        for (int i = 0; i < a->n_sessions; i++) app_note(a->sessions[i], "warning: %s", warn[w]);
    if (nw) app_status(a, 1, "warning: %.400s%s", warn[0], nw > 1 ? " (more in the tab's log)" : "");
    for (int i = 0; i < a->n_sessions; i++)
        if (a->sessions[i]->waiting_engine) chat_submit(a, a->sessions[i]);
}

void loader_close(app *a) {
    if (a->loader_running) {
        pthread_join(a->loader, NULL);
        a->loader_running = 0;
        a->v.reloading = 0;
        kv_engine_free(a->loaded);
        a->loaded = NULL;
    }
    engine_retire(a);
}
