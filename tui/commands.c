/* commands.c - what the user asks for: slash commands typed on the input
 * line (parsed by keys.c) and the key actions (mapped by keys.c), with the
 * engine controls and per-tab settings they share. */
#include "app_internal.h"

#include <stdlib.h>
#include <string.h>

#include "../profiles/profile.h"

/* F4's slow-motion delays, ms per step, in the order it steps through. */
static const int slow_steps[] = {0, 50, 200, 500, 1000};

int commands_slow_ms(const app *a) { return slow_steps[a->slow_idx]; }

static void toggle_pause(app *a) {
    if (a->att) {
        attach_control(a, a->paused ? "resume" : "pause", 0);
        return;
    }
    a->paused = !a->paused;
    if (a->eng) {
        if (a->paused) kv_engine_pause(a->eng);
        else kv_engine_resume(a->eng);
    }
    app_status(a, 0, a->paused ? "engine paused: F3 / s steps one iteration" : "engine running");
}

static void step_once(app *a) {
    if (a->att) {
        attach_control(a, "step", 0);
        return;
    }
    if (!a->paused) {
        a->paused = 1;
        if (a->eng) kv_engine_pause(a->eng);
    }
    if (a->eng) kv_engine_step_once(a->eng);
    app_status(a, 0, "one step (paused; F2 resumes)");
}

static void set_slow(app *a, int ms) {
    if (a->att) {
        attach_control(a, "slow", ms);
        return;
    }
    if (a->eng) kv_engine_set_step_delay(a->eng, ms);
    a->v.step_delay_ms = ms;
    if (ms) app_status(a, 0, "slow motion: %d ms per step", ms);
    else app_status(a, 0, "slow motion off");
}

static void show_settings(app *a, kv_session *s) {
    app_note(s, "%s: temperature %.2f, top-p %.2f, top-k %d, max %d tokens, seed %llu, template %s%s%s", s->name,
             s->sampling.temperature, s->sampling.top_p, s->sampling.top_k, s->max_tokens,
             (unsigned long long)s->sampling.seed, a->v.template_name ? a->v.template_name : "?",
             s->system ? ", system: " : "", s->system ? s->system : "");
}

static void run_command(app *a, const kv_command *c) {
    kv_session *s = app_cur(a);
    switch (c->kind) {
    case KV_CMD_NONE: chat_send_prompt(a, s, c->prompt); break;
    case KV_CMD_NEW: {
        if (chat_session_add(a, c->arg[0] ? c->arg : NULL)) chat_session_select(a, a->n_sessions - 1);
        break;
    }
    case KV_CMD_CLOSE: chat_session_close(a, a->selected); break;
    case KV_CMD_RENAME: kv_session_rename(s, c->arg); break;
    case KV_CMD_SYSTEM:
        kv_session_set_system(s, c->arg);
        app_note(s, c->arg[0] ? "system prompt set" : "system prompt removed");
        break;
    case KV_CMD_TEMP:
        s->sampling.temperature = (float)c->num;
        show_settings(a, s);
        break;
    case KV_CMD_TOPP:
        s->sampling.top_p = (float)c->num;
        show_settings(a, s);
        break;
    case KV_CMD_TOPK:
        s->sampling.top_k = (int)c->num;
        show_settings(a, s);
        break;
    case KV_CMD_MAX:
        s->max_tokens = (int)c->num;
        show_settings(a, s);
        break;
    case KV_CMD_SEED:
        s->sampling.seed = (uint64_t)c->num;
        show_settings(a, s);
        break;
    case KV_CMD_SETTINGS: show_settings(a, s); break;
    case KV_CMD_CLEAR:
        if (s->req && a->eng) kv_engine_cancel(a->eng, s->req);
        if (s->req && a->att) attach_cancel(a, s);
        kv_session_clear(s);
        app_status(a, 0, "conversation cleared (the autosave keeps it)");
        break;
    case KV_CMD_SAVE: {
        char msg[300];
        if (kv_session_save_markdown(s, c->arg, msg, sizeof msg)) app_status(a, 1, "%s", msg);
        else app_status(a, 0, "saved %s", c->arg);
        break;
    }
    case KV_CMD_LOAD: {
        kv_config nc;
        kv_err err;
        if (a->att) {
            app_status(a, 1, "/load runs a local engine: not while attached to a server");
            break;
        }
        if (kv_profile_load_with_sets(c->arg, NULL, 0, &nc, &err)) {
            app_status(a, 1, "%s", err.msg);
            break;
        }
        /* The running engine goes on until the new one is up (loader.c). */
        if (loader_start(a, &nc, c->arg) == 0)
            app_status(a, 0, "loading profile %s%s", c->arg, a->eng ? " (this engine runs until it is up)" : "");
        break;
    }
    case KV_CMD_HELP: a->v.help_shown = 1; break;
    case KV_CMD_QUIT: a->quit = 1; break;
    case KV_CMD_PAUSE: toggle_pause(a); break;
    case KV_CMD_STEP:
        step_once(a);
        a->pending_steps = c->has_num ? (int)c->num - 1 : 0;
        break;
    case KV_CMD_SLOW: set_slow(a, (int)c->num); break;
    case KV_CMD_INJECT:
        if (c->has_num && c->num == 0) {
            load_stop(a);
            app_status(a, 0, "load stopped");
        } else {
            load_start(a, c->has_num ? (int)c->num : (a->cfg.workload.sessions > 0 ? a->cfg.workload.sessions : 4));
        }
        break;
    case KV_CMD_RECORD:
        if (!c->arg[0] && a->rec) record_toggle(a, NULL);
        else {
            if (a->rec) record_toggle(a, NULL);
            record_toggle(a, c->arg[0] ? c->arg : NULL);
        }
        break;
    case KV_CMD_EXPORT: record_export(a, c->arg); break;
    case KV_CMD_ZOOM: a->zoom = (int)c->num; break;
    case KV_CMD_TAB:
        if ((int)c->num - 1 < a->n_sessions) chat_session_select(a, (int)c->num - 1);
        else app_status(a, 1, "no tab %d", (int)c->num);
        break;
    case KV_CMD_CANCEL: chat_cancel(a, s); break;
    }
}

void commands_on_line(char *line, void *ctx) {
    app *a = ctx;
    if (!line) {
        a->quit = 1;
        return;
    }
    size_t n = strlen(line);
    /* A trailing backslash continues the input on a new line. */
    if (n && line[n - 1] == '\\') {
        line[n - 1] = '\n';
        kv_input_set_text(line);
        free(line);
        return;
    }
    const char *p = line;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (!*p) {
        free(line);
        return;
    }
    kv_input_history_add(line);
    kv_command c;
    char msg[256];
    if (kv_command_parse(line, &c, msg, sizeof msg)) app_status(a, 1, "%s", msg);
    else run_command(a, &c);
    free(line);
}

static void do_action(app *a, kv_action act, kv_key k) {
    kv_session *s = app_cur(a);
    switch (act.type) {
    case KV_ACT_NONE: break;
    case KV_ACT_INPUT: kv_input_feed(k); break;
    case KV_ACT_QUIT: a->quit = 1; break;
    case KV_ACT_HELP: a->v.help_shown = !a->v.help_shown; break;
    case KV_ACT_CANCEL:
        if (s && s->req) chat_cancel(a, s);
        break;
    case KV_ACT_FOCUS_TOGGLE: a->v.focus = a->v.focus == KV_FOCUS_INPUT ? KV_FOCUS_PANELS : KV_FOCUS_INPUT; break;
    case KV_ACT_FOCUS_INPUT: a->v.focus = KV_FOCUS_INPUT; break;
    case KV_ACT_PAUSE: toggle_pause(a); break;
    case KV_ACT_STEP: step_once(a); break;
    case KV_ACT_SLOW:
        a->slow_idx = (a->slow_idx + 1) % (int)(sizeof slow_steps / sizeof slow_steps[0]);
        set_slow(a, slow_steps[a->slow_idx]);
        break;
    case KV_ACT_LOAD:
        if (a->att) {
            app_status(a, 1, "load injection drives a local engine: not while attached");
            break;
        }
        if (a->load.drv) {
            load_stop(a);
            app_status(a, 0, "load stopped");
        } else {
            load_start(a, a->cfg.workload.sessions > 0 ? a->cfg.workload.sessions : 4);
        }
        break;
    case KV_ACT_ZOOM_NEXT: app_zoom_next(a); break;
    case KV_ACT_ZOOM_OFF: a->zoom = -1; break;
    case KV_ACT_TAB_NEXT: chat_session_select(a, (a->selected + 1) % a->n_sessions); break;
    case KV_ACT_TAB_PREV: chat_session_select(a, (a->selected + a->n_sessions - 1) % a->n_sessions); break;
    case KV_ACT_TAB_GOTO: chat_session_select(a, act.arg); break;
    case KV_ACT_TAB_NEW:
        if (chat_session_add(a, NULL)) chat_session_select(a, a->n_sessions - 1);
        break;
    case KV_ACT_TAB_CLOSE: chat_session_close(a, a->selected); break;
    case KV_ACT_TAB_RENAME:
        a->v.focus = KV_FOCUS_INPUT;
        kv_input_set_text("/rename ");
        break;
    case KV_ACT_SCROLL:
        if (s) s->scroll += act.arg;
        app_clamp_scroll(a);
        break;
    case KV_ACT_SCROLL_END:
        if (s) s->scroll = 0;
        break;
    case KV_ACT_LOG_SCROLL:
        a->v.log_scroll += act.arg;
        if (a->v.log_scroll < 0) a->v.log_scroll = 0;
        if (a->v.log_scroll > a->log_n) a->v.log_scroll = a->log_n;
        break;
    case KV_ACT_LOG_END: a->v.log_scroll = 0; break;
    case KV_ACT_RECORD: record_toggle(a, NULL); break;
    case KV_ACT_THEME:
        if (!a->color_ok) app_status(a, 1, "this terminal has no colors");
        else a->v.color = !a->v.color;
        break;
    case KV_ACT_REDRAW:
    case KV_ACT_RESIZE: a->need_clear = 1; break;
    case KV_ACT_SUSPEND: app_suspend(a); break;
    case KV_ACT_FILL:
        a->v.fill_marks = !a->v.fill_marks;
        app_status(a, 0, "block map: %s", a->v.fill_marks ? "fill of each block" : "owner of each block");
        break;
    }
}

void commands_key(app *a, kv_key k) {
    kv_session *s = app_cur(a);
    kv_key_ctx ctx;
    ctx.focus = a->v.focus;
    ctx.input_empty = kv_input_empty();
    ctx.reply_in_flight = s && s->req;
    ctx.zoomed = a->zoom >= 0;
    ctx.help_shown = a->v.help_shown;
    ctx.page = a->v.layout.transcript.h > 2 ? a->v.layout.transcript.h - 1 : 5;
    kv_action act = kv_keys_map(k, &ctx);
    do_action(a, act, k);
}
