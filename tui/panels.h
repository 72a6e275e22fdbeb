/* panels.h - drawing the TUI: one function per panel, each taking
 * (WINDOW *, const kv_view_state *, const kv_snapshot *) and changing nothing
 * but that window. The view state is everything the app knows that is not
 * in the engine snapshot (sessions, focus, histories, messages). The
 * snapshot may be NULL (model still loading, or it failed): panels then
 * show N/A, never a guess. */
#ifndef KV_TUI_PANELS_H
#define KV_TUI_PANELS_H

#define NCURSES_WIDECHAR 1
#include <curses.h>

#include "../engine/engine.h"
#include "format.h"
#include "input.h"
#include "keys.h"
#include "layout.h"
#include "session.h"

/* Color pairs (when colors are on). 1..7 are the session palette
 * (kv_blockmap_color). */
enum {
    KV_PAIR_TITLE = 8,
    KV_PAIR_ERROR,
    KV_PAIR_STATUS,
    KV_PAIR_PREFILL,
    KV_PAIR_DECODE,
    KV_PAIR_SPEC,
    KV_PAIR_CACHED,
    KV_PAIR_OK,
    KV_PAIR_COUNT
};

typedef enum kv_engine_phase {
    KV_PHASE_LOADING = 0, /* kv_engine_new running on the loader thread */
    KV_PHASE_READY = 1,
    KV_PHASE_FAILED = 2,  /* load failed: load_msg says why */
    KV_PHASE_REPLAY = 3   /* kvtop replay: snapshots come from a trace file */
} kv_engine_phase;

#define KV_LOG_CAP 4096

typedef struct kv_view_state {
    kv_screen_layout layout;
    int color;                  /* bool: color pairs are set up and wanted */
    int utf8;                   /* bool: the terminal takes UTF-8 glyphs */
    kv_focus focus;
    int help_shown;             /* bool */
    kv_engine_phase phase;
    char load_msg[512];         /* what is loading, or why it failed */
    int reloading;              /* bool: /load is building the next engine while this one runs */
    char profile_path[256];
    /* sessions (tabs) */
    kv_session **sessions;      /* (n_sessions) borrowed */
    int n_sessions;
    int selected;               /* index into sessions */
    int load_sessions;          /* injected background sessions (0: off) */
    int load_in_flight;         /* their requests in flight */
    const char *template_name;  /* chat template in use ("plain" when the model has none) */
    /* histories kept across frames (ring buffers) */
    const kv_series *itl_all;   /* every token's inter-token latency, ms */
    const kv_series *itl_load;  /* background load only */
    const kv_series *prefix_tokens; /* prefix-hit tokens gained per frame */
    const kv_series *step_ms;   /* step durations */
    /* the step log: decisions accumulated beyond the snapshot's window */
    const kv_decision *log;     /* ring of KV_LOG_CAP */
    int log_head, log_n;        /* ring position and fill */
    int log_scroll;             /* rows back from the newest */
    /* engine controls as the UI last set them */
    int paused;
    int step_delay_ms;
    int recording;              /* bool */
    char record_path[256];
    int replay_frame, replay_frames; /* replay: frame shown / total */
    /* self-measurement */
    double ui_cpu_pct;          /* this thread's CPU over the last second, % of a core */
    double fps;                 /* frames drawn per second */
    uint64_t frames;
    /* the status line */
    char status[256];
    int status_error;           /* bool: draw it as an error */
    /* the input line */
    kv_input_view input;
    int64_t chain_req;          /* request whose block table the KV panel shows (0 none) */
    int config_max_batched;     /* scheduler.max_batched_tokens, for batch bar scale */
    int show_token_source;      /* bool: color reply text by how each token was produced */
    int fill_marks;             /* bool: the block map marks each block in use by its fill (blockfill.h)
                                   instead of its owner's glyph (F9 toggles) */
    char remote[160];           /* kvtop attach: the source's state for the tab bar ("" local engine) */
    const struct kv_source_status *remote_status; /* kvtop attach: the shown source (borrowed), NULL local */
    const struct kv_source_status *fleet; /* kvtop attach on several URLs: (n_fleet) every source, borrowed */
    int n_fleet, fleet_sel;     /* rows, and the one the panels show */
    int remote_metrics;         /* bool: the shown source is a metrics adapter (no steps, no block map) */
    const struct kv_ptree_view *ptree; /* kvtop attach --kv-events: the shown source's prefix tree, NULL none */
    const struct kv_kvsub_status *ptree_status;
} kv_view_state;

/* Attribute of a session tag's color (A_NORMAL when colors are off). */
attr_t kv_panel_session_attr(const kv_view_state *v, int tag);

void kv_panel_tabs(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_status(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
/* The chat panel: border, transcript and the input (input drawn at the
 * layout's input rectangle, which lies inside when the chat is shown). */
void kv_panel_chat(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
/* The input line alone (under a zoomed panel). Returns the cursor's
 * position inside w through cy and cx. */
void kv_panel_input(WINDOW *w, const kv_view_state *v, int *cy, int *cx);
void kv_panel_blocks(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_prefix(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_spec(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_tpot(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_mem(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_sched(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_log(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
/* Overlays and special screens. */
void kv_panel_help(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);
void kv_panel_too_small(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);

/* The draw function of a panel id (NULL for none). */
typedef void (*kv_panel_fn)(WINDOW *, const kv_view_state *, const kv_snapshot *);
kv_panel_fn kv_panel_draw_fn(kv_panel_id id);

#endif
