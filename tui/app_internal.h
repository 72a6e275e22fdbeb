/* app_internal.h - the state the TUI's files share: the app struct and the
 * functions each file offers the others. Private to tui/ (app.c, chat.c,
 * commands.c, load.c, loader.c, record.c, replay.c); the public entry points
 * are in tui.h. Everything here runs on the UI thread unless it says so. */
#ifndef KV_TUI_APP_INTERNAL_H
#define KV_TUI_APP_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "../engine/chat_template.h"
#include "../engine/trace.h"
#include "../engine/driver.h"
#include "../engine/workload.h"
#include "../server/server.h"
#include "blockmap.h"
#include "panels.h"

#define MAX_SESSIONS 32
/* Every open tab has its own block-map glyph (chat.c picks the tags). */
_Static_assert(MAX_SESSIONS <= KV_BLOCKMAP_GLYPHS, "more tabs than block-map glyphs");
#define MAX_LOAD_INFLIGHT 64
#define FORGET_CAP 512

/* Background load injected from the profile's workload. */
typedef struct load_state {
    kv_driver *drv;              /* the workload's submissions (engine/driver.h); NULL when off */
    int sessions;                /* background sessions (tags LOAD_BASE + k) */
    int64_t inflight[MAX_LOAD_INFLIGHT];
    double last_tok_ms[MAX_LOAD_INFLIGHT]; /* engine clock of each one's newest token, < 0 none */
    int n_inflight;
} load_state;

typedef struct app {
    kv_config cfg;               /* the running engine's config */
    char profile_path[1024];
    /* engine and its loader thread (loader.c) */
    kv_engine *eng;
    /* --serve PORT: the HTTP server on eng (server/, through the table the dispatcher hands over) */
    int serve_port;              /* -1: none; 0: any free port */
    kv_server *srv;              /* while serving: the engine's events come from srv_ops->poll */
    pthread_t loader;
    int loader_running;          /* bool */
    atomic_int loader_done;
    kv_config load_cfg;          /* what the loader loads */
    char load_path[1024];        /* the profile it comes from */
    kv_engine *loaded;
    kv_err load_err;
    const kv_model *model;
    kv_chat_tmpl tmpl;
    int plain;                   /* bool: the model has no chat template: prompts go as-is */
    int max_ctx;                 /* tokens a request may span */
    /* snapshots */
    kv_snapshot *snap;
    int have_snap;
    const kv_snapshot *shown;    /* what the panels draw (snap, or a replay frame) */
    /* sessions (chat.c) */
    kv_session *sessions[MAX_SESSIONS];
    int n_sessions;
    int next_tag;
    int selected;
    /* histories */
    kv_series itl_all, itl_load, prefix_tokens, step_ms;
    uint64_t last_prefix_hits;
    kv_decision log[KV_LOG_CAP];
    int log_head, log_n, log_have;
    uint64_t log_last_step;
    int64_t forget[FORGET_CAP];
    int n_forget;
    /* view and windows */
    kv_view_state v;
    int zoom;                    /* panel id or -1 */
    WINDOW *win[KV_PANEL_COUNT];
    WINDOW *w_tabs, *w_status, *w_input, *w_help, *w_small;
    kv_screen_layout built;      /* the layout the windows were made for */
    int have_windows;
    int color_ok;                /* bool: start_color succeeded */
    int need_clear;
    /* controls */
    int quit;
    uint64_t max_frames;         /* 0: no limit */
    int paused;
    int slow_idx;
    int pending_steps;
    load_state load;             /* load.c */
    kv_trace_writer *rec;        /* recording: frames added by the engine thread (record.c) */
    int rec_hooked;              /* bool: the record hook is installed on eng */
    atomic_int rec_err;          /* set by the record hook: the writer's error code, 0 none */
    char last_trace[1024];
    /* replay (replay.c) */
    kv_trace *replay;
    int replay_i;
    /* autosave */
    char state_dir[1024];
    char stamp[48];
    int autosave_warned;
    /* prompt text buffer (grown, reused) */
    char *prompt_buf;
    size_t prompt_cap;
    /* self-measurement */
    double cpu_t0, wall_t0;
    uint64_t fps_frames0;
    double status_until;         /* wall clock when the status message expires */
    void (*redraw)(struct app *); /* a screen of its own (compare.c): draws it where the loop and a resume
                                     would call app_draw; NULL: app_draw */
    struct attach_state *att;    /* kvtop attach: the remote sources and replies (attach.c); NULL: local engine */
} app;

/* ---- app.c: shared helpers, the screen and the loop ---- */

/* Seconds on the monotonic clock. */
double app_wall_s(void);
/* Sets the status line (an error stays longer). */
void app_status(app *a, int error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The selected session, NULL when there is none. */
kv_session *app_cur(app *a);
/* Adds a note turn to s (and its autosave) and scrolls it to the end;
 * s NULL: nothing. */
void app_note(kv_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Blocks the terminal signals around starting a thread, so only the UI
 * thread ever runs their handlers; the old mask goes to *old. */
void app_block_signals(sigset_t *old /* OUT: */);
void app_restore_signals(const sigset_t *old);
/* Ctrl-Z: restores the terminal and stops the process (SIGTSTP) until the
 * shell resumes it (fg), then repaints. Without job control (no shell
 * could resume it) it only says so on the status line. */
void app_suspend(app *a);
/* Adds one decision to the step log ring, keeping a scrolled view still. */
void app_log_push(app *a, const kv_decision *d);
/* Zooms the next panel in the zoom order (after the last: none). */
void app_zoom_next(app *a);
/* Keeps the selected session's scroll inside its transcript. */
void app_clamp_scroll(app *a);
/* Per-frame bookkeeping from a fresh snapshot s: the step log, prefix-hit
 * and step-time histories, each tab's latest TTFT and TPOT. */
void app_after_snapshot(app *a, const kv_snapshot *s);
/* Copies the app's sessions, histories and controls into a->v (what the
 * panels draw besides the snapshot); the layout is left alone. */
void app_view_sync(app *a);
/* Draws every window from a->shown and calls doupdate() once. */
void app_draw(app *a);
/* Updates the UI's CPU share and frame rate once a second. */
void app_update_cpu(app *a);
/* Starts curses on the terminal. 0, or -1 with a message on stderr (no
 * terminal, or curses failed). */
int app_curses_start(app *a);
/* Deletes every window. */
void app_free_windows(app *a);
/* What the local app and `kvtop attach` both own: the windows, the
 * snapshot, the sessions (with their input history) and the prompt buffer. */
void app_free_views(app *a);
/* a->stamp (OUT) = prefix, the local time and the pid: names this run's
 * recordings and session files. */
void app_make_stamp(app *a, const char *prefix);
/* The frame loop shared by the app and the replay viewer: keys go to
 * on_key as they come, on_frame runs at the profile's frame rate, until
 * a->quit, a terminal signal or a->max_frames. */
void app_loop(app *a, void (*on_key)(app *, kv_key), void (*on_frame)(app *));

/* ---- chat.c: sessions (tabs), prompts and engine events ---- */

/* Adds a tab (name NULL: a default one). NULL, with a status message, when
 * there are MAX_SESSIONS already or memory ran out. */
kv_session *chat_session_add(app *a, const char *name);
/* Makes tab i the selected one, moving readline's history and draft. */
void chat_session_select(app *a, int i);
/* Closes tab i, cancelling its reply; the last tab is cleared instead. */
void chat_session_close(app *a, int i);
/* Adds text as the user's turn and sends the conversation (or waits for
 * the engine). A status message when a reply is still coming. */
void chat_send_prompt(app *a, kv_session *s, const char *text);
/* Sends the session's conversation (its last turn is the user's prompt),
 * leaving out the oldest exchanges to fit the context. */
void chat_submit(app *a, kv_session *s);
/* Cancels the tab's reply in flight and frees the tab at once (a note
 * says so); a status message when there is none. */
void chat_cancel(app *a, kv_session *s);
/* Handles every engine event waiting, then flushes the autosaves. */
void chat_poll_events(app *a);

/* ---- commands.c: slash commands and key actions ---- */

/* readline's line callback (ctx is the app): runs a /command or sends a
 * prompt; NULL (end of input) quits. Takes ownership of line. */
void commands_on_line(char *line, void *ctx);
/* Maps a key to its action in the current context and does it. */
void commands_key(app *a, kv_key k);
/* The slow-motion delay chosen with F4, ms (0: the profile's). */
int commands_slow_ms(const app *a);

/* ---- load.c: background load from the profile's workload ---- */

/* Starts `sessions` background sessions replaying the workload (restarting
 * one that runs). A status message says what started or why not. */
void load_start(app *a, int sessions);
/* Stops submitting and cancels what is in flight; the in-flight ids stay
 * until their DONE arrives. */
void load_stop(app *a);
/* Submits what is due (at most a few per frame). */
void load_tick(app *a);
/* Submits up to LOAD_SUBMIT_CAP of the items due, adding them to the
 * requests in flight; returns how many the driver handled (LOAD_SUBMIT_CAP:
 * more may be due). 0 without a load or an engine. */
#define LOAD_SUBMIT_CAP 16
int load_submit_due(app *a);
/* Index of req among the load's in-flight requests, or -1. */
int load_slot(app *a, int64_t req);

/* ---- record.c: trace recording (F7, /record, /export) ---- */

/* Installs the record hook on the engine (before it starts, for a new one).
 * 0 or the engine's error code. */
int record_attach(app *a);
/* Removes the hook: on return no frame is being added. */
void record_detach(app *a);
/* Ends the recording and says so (or what went wrong) on the status line. */
void record_stop(app *a);
/* Stops a recording that runs; with path (NULL or "": an automatic name),
 * or when none ran, starts one. */
void record_toggle(app *a, const char *path);
/* Ends a recording that runs and writes the last trace as Chrome JSON. */
void record_export(app *a, const char *out);

/* ---- replay.c: the trace viewer's export ---- */

/* Writes t as Chrome trace JSON to out, through out.tmp and a rename.
 * Refuses (KV_ERR_INVAL, nothing written) an out, or an out.tmp, that is
 * the trace's own file trace_path (by inode) or exists as anything but a
 * regular file (a FIFO, a directory, a device). 0 or a KV_ERR_* with err. */
int replay_export(kv_trace *t, const char *trace_path, const char *out, kv_err *err);

/* ---- loader.c: the engine's lifecycle ---- */

/* Starts loading cfg's engine (from profile `path`, NULL: the defaults) on
 * the loader thread. Without an engine a->v.phase says how it goes; with
 * one running (/load) it keeps running, its tabs and replies untouched,
 * until the new one is up, and stays when the new one fails (the status
 * line says why). 0, or -1 with a status message (a load is already
 * running, or the thread did not start). */
int loader_start(app *a, const kv_config *cfg, const char *path);
/* Called each iteration: picks up a finished load; on success retires the
 * engine that ran (its replies in flight marked cancelled), starts the new
 * one and sends what waited for it. */
void loader_check(app *a);
/* What the app reads off a new engine a->eng under config a->cfg: its
 * model, chat template (or none: prompts as-is), context and the panels'
 * settings. */
void loader_adopt(app *a);
/* Stops the load (waiting for one still loading and freeing it), frees the
 * engine and marks the replies in flight cancelled; a recording goes on
 * with the next engine. */
void loader_close(app *a);

/* ---- attach.c: kvtop attach (a->att set; no local engine) ---- */

/* Sends the session's conversation to the remote server's chat endpoint. */
void attach_submit(app *a, kv_session *s);
/* Ends the tab's reply in flight on the remote (closing its stream). */
void attach_cancel(app *a, kv_session *s);
/* Takes what the remote replies sent since the last frame into the tabs. */
void attach_poll(app *a);
/* F2/F3/F4 on the remote engine: action "pause", "resume", "step" or
 * "slow" (delay_ms); the status line says what happened or why not. */
void attach_control(app *a, const char *action, int delay_ms);

/* ---- serve.c: --serve PORT ---- */

/* 1 when the dispatcher handed over a server (cmd_tui_set_server). */
int serve_available(void);
/* Starts the server on a->eng when a->serve_port >= 0 (status line: its
 * address, or why not). */
void serve_start(app *a);
/* Stops it (before its engine is freed); no-op when not serving. */
void serve_stop(app *a);
/* The tabs' events while serving (the server reads the engine). */
int serve_poll(app *a, kv_event *out, int cap);

#endif
