/* app.c - the ncurses application (`kvtop [PROFILE]`): the frame loop, the
 * screen (windows, colors, keys from curses) and the helpers every part of
 * the app shares. The parts: chat.c (tabs, prompts, engine events),
 * commands.c (slash commands, key actions), load.c (load injection),
 * record.c (trace recording), loader.c (the engine's lifecycle) and
 * replay.c (the trace viewer); app_internal.h holds the state they share.
 * Drawing is in panels.c, pure logic in layout/format/blockmap/keys/session.
 *
 * The loop (STYLE.md "TUI loop"): wait for a key with a deadline, feed keys
 * to readline at once, and when a frame is due poll engine events, take one
 * snapshot, draw every panel from it and call doupdate() once. The engine
 * runs on its own thread; the model loads on a loader thread so the screen
 * is up (and typing works) while it loads. */
#include "app_internal.h"

#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../profiles/profile.h"
#include "compare.h"
#include "panels_remote.h"
#include "tui.h"

/* readline and the sanitizers: readline keeps its kill ring and a few
 * strings for the process lifetime; LeakSanitizer should not fail a run on
 * them. NOTE: only takes effect in sanitizer builds. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libreadline.so\n"; }

/* ---- helpers the app's files share (app_internal.h) ---- */

static volatile sig_atomic_t got_term, got_tstp, got_cont;
static void on_term(int sig) {
    (void)sig;
    got_term = 1;
}
/* SIGTSTP from outside (kill -TSTP): the loop suspends properly. */
static void on_tstp(int sig) {
    (void)sig;
    got_tstp = 1;
}
/* SIGCONT after a stop the app did not see coming (SIGSTOP): repaint. */
static void on_cont(int sig) {
    (void)sig;
    got_cont = 1;
}

double app_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double thread_cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru)) return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}

void app_status(app *a, int error, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->v.status, sizeof a->v.status, fmt, ap);
    va_end(ap);
    a->v.status_error = error;
    a->status_until = app_wall_s() + (error ? 8.0 : 4.0);
}

kv_session *app_cur(app *a) { return a->n_sessions ? a->sessions[a->selected] : NULL; }

void app_note(kv_session *s, const char *fmt, ...) {
    if (!s) return;
    char buf[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    kv_session_add(s, KV_ROLE_NOTE, buf);
    kv_session_autosave_turn(s, KV_ROLE_NOTE, buf);
    s->scroll = 0;
}

void app_block_signals(sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGWINCH);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGTSTP);
    sigaddset(&set, SIGCONT);
    pthread_sigmask(SIG_BLOCK, &set, old);
}
void app_restore_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

/* The parent of pid from /proc (Linux), or -1. */
static pid_t parent_of(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* after the command name, which may hold anything */
    char state;
    int pp;
    if (!p || sscanf(p + 1, " %c %d", &state, &pp) != 2) return -1;
    return (pid_t)pp;
}

/* Whether a shell could resume us after a stop: our process group is not
 * orphaned, i.e. we or an ancestor in our group has a parent in another
 * group of our session (a job-control shell that made the group a job;
 * a script run from one counts). Otherwise (sh -c, a pane's only process)
 * the kernel discards SIGTSTP for the group, and nothing could send the
 * SIGCONT anyway. */
static int have_job_control(void) {
    pid_t pg = getpgrp(), sid = getsid(0);
    pid_t fg = tcgetpgrp(STDIN_FILENO);
    if (fg >= 0 && fg != pg) return 0;
    pid_t p = getppid();
    for (int i = 0; i < 64 && p > 1; i++) {
        pid_t ppg = getpgid(p);
        if (ppg < 0 || getsid(p) != sid) return 0;
        if (ppg != pg) return 1;
        p = parent_of(p);
    }
    return 0;
}

void app_suspend(app *a) {
    got_tstp = 0;
    if (!have_job_control()) {
        app_status(a, 1, "Ctrl-Z: no job control here (kvtop was not started as a job of an interactive shell); "
                         "not suspended");
        return;
    }
    /* The terminal as the shell left it, then stop the whole process (the
     * engine thread with it) with the default action; SIGCONT resumes here
     * (the signal is pending until this thread unblocks it). */
    def_prog_mode();
    endwin();
    fflush(stdout);
    struct sigaction dfl, prev;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTSTP, &dfl, &prev);
    sigset_t tstp, mask;
    sigemptyset(&tstp);
    sigaddset(&tstp, SIGTSTP);
    pthread_sigmask(SIG_UNBLOCK, &tstp, &mask);
    /* The whole process group, as the terminal's own Ctrl-Z would: a
     * script kvtop runs under stops too, so the shell sees the job stop. */
    kill(0, SIGTSTP);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    sigaction(SIGTSTP, &prev, NULL);
    got_tstp = 0;
    got_cont = 0;
    /* Back: curses' terminal modes, and a full repaint at the size the
     * terminal has now. */
    reset_prog_mode();
    a->need_clear = 1;
    app_status(a, 0, "resumed");
    if (a->redraw) a->redraw(a);
    else app_draw(a);
}

/* ---- per-frame bookkeeping from the snapshot ---- */

void app_log_push(app *a, const kv_decision *d) {
    a->log[a->log_head] = *d;
    a->log_head = (a->log_head + 1) % KV_LOG_CAP;
    if (a->log_n < KV_LOG_CAP) a->log_n++;
    else if (a->v.log_scroll > 0 && a->v.log_scroll < KV_LOG_CAP) a->v.log_scroll++; /* keep the view still */
}

void app_after_snapshot(app *a, const kv_snapshot *s) {
    /* Step log: decisions of steps newer than any seen (a published step's
     * decisions are complete). */
    uint64_t newest = a->log_last_step;
    for (int i = 0; i < s->n_decisions; i++) {
        const kv_decision *d = &s->decisions[i];
        if (a->log_have && d->step <= a->log_last_step) continue;
        app_log_push(a, d);
        if (d->step > newest) newest = d->step;
    }
    if (s->n_decisions) {
        a->log_last_step = newest;
        a->log_have = 1;
    }
    /* Prefix hits gained since the last frame. */
    uint64_t hits = s->prefix_hit_tokens;
    kv_series_push(&a->prefix_tokens, hits >= a->last_prefix_hits ? (double)(hits - a->last_prefix_hits) : 0);
    a->last_prefix_hits = hits;
    if (s->n_steps) kv_series_push(&a->step_ms, s->steps[s->n_steps - 1].dur_ms);
    /* TTFT and TPOT of each tab's latest reply (notes may follow it), once
     * they are known. */
    for (int i = 0; i < a->n_sessions; i++) {
        kv_turn *t = NULL;
        kv_session *ss = a->sessions[i];
        for (int k = ss->n_turns - 1; k >= 0 && !t; k--)
            if (ss->turns[k].role == KV_ROLE_ASSISTANT) t = &ss->turns[k];
        if (!t || !t->req) continue;
        for (int k = 0; k < s->n_requests; k++) {
            const kv_snap_request *q = &s->requests[k];
            if (q->id != t->req) continue;
            if (q->ttft_ms >= 0) t->ttft_ms = q->ttft_ms;
            if (q->n_generated > 1) t->tpot_ms = q->tpot_ms;
        }
    }
}


/* ---- the view ---- */

void app_zoom_next(app *a) {
    static const int order[] = {KV_PANEL_BLOCKS, KV_PANEL_PREFIX, KV_PANEL_SPEC, KV_PANEL_TPOT, KV_PANEL_MEM,
                                KV_PANEL_SCHED,  KV_PANEL_LOG,    KV_PANEL_CHAT, -1};
    int n = (int)(sizeof order / sizeof order[0]);
    int i = 0;
    while (i < n && order[i] != a->zoom) i++;
    a->zoom = order[(i + 1) % n];
    if (i == n) a->zoom = order[0];
}

/* Transcript rows of the selected session at the current width. */
void app_clamp_scroll(app *a) {
    kv_session *s = app_cur(a);
    if (!s) return;
    if (s->scroll < 0) s->scroll = 0;
    kv_rect t = a->v.layout.transcript;
    if (!kv_rect_visible(t)) return;
    int total = kv_session_wrap(s, t.w, 5, NULL, 0);
    int maxs = total - t.h;
    if (s->scroll > maxs) s->scroll = maxs > 0 ? maxs : 0;
}

/* ---- drawing ---- */

/* Curses key -> kv_key. Returns 0 when there was no key. */
static int read_key(kv_key *out, int wait_ms) {
    wint_t ch;
    wtimeout(stdscr, wait_ms);
    int r = wget_wch(stdscr, &ch);
    if (r == ERR) return 0;
    kv_key k = {0, 0};
    if (r == OK && ch == 27) {
        /* Esc alone, or Alt + the key that follows at once. */
        wtimeout(stdscr, 0);
        wint_t c2;
        int r2 = wget_wch(stdscr, &c2);
        if (r2 == ERR) {
            out->code = KV_KEY_ESC;
            out->alt = 0;
            return 1;
        }
        k.alt = 1;
        r = r2;
        ch = c2;
    }
    if (r == KEY_CODE_YES) {
        int c = (int)ch;
        if (c >= KEY_F(1) && c <= KEY_F(12)) k.code = KV_KEY_F(c - KEY_F(1) + 1);
        else switch (c) {
            case KEY_UP: k.code = KV_KEY_UP; break;
            case KEY_DOWN: k.code = KV_KEY_DOWN; break;
            case KEY_LEFT: k.code = KV_KEY_LEFT; break;
            case KEY_RIGHT: k.code = KV_KEY_RIGHT; break;
            case KEY_PPAGE: k.code = KV_KEY_PGUP; break;
            case KEY_NPAGE: k.code = KV_KEY_PGDN; break;
            case KEY_HOME: k.code = KV_KEY_HOME; break;
            case KEY_END: k.code = KV_KEY_END; break;
            case KEY_BACKSPACE: k.code = KV_KEY_BACKSPACE; break;
            case KEY_DC: k.code = KV_KEY_DELETE; break;
            case KEY_IC: k.code = KV_KEY_INSERT; break;
            case KEY_ENTER: k.code = KV_KEY_ENTER; break;
            case KEY_BTAB: k.code = KV_KEY_BTAB; break;
            case KEY_RESIZE: k.code = KV_KEY_RESIZE; break;
            case KEY_MOUSE: {
                MEVENT me;
                k.code = KV_KEY_OTHER;
                if (getmouse(&me) == OK) {
                    if (me.bstate & BUTTON4_PRESSED) k.code = KV_KEY_WHEEL_UP;
#ifdef BUTTON5_PRESSED
                    else if (me.bstate & BUTTON5_PRESSED) k.code = KV_KEY_WHEEL_DOWN;
#endif
                }
                break;
            }
            default: k.code = KV_KEY_OTHER; break;
            }
    } else {
        int c = (int)ch;
        if (c == '\r' || c == '\n') k.code = KV_KEY_ENTER;
        else if (c == 127 || c == 8) k.code = KV_KEY_BACKSPACE;
        else if (c == '\t') k.code = KV_KEY_TAB;
        else k.code = c;
    }
    *out = k;
    return 1;
}

void app_free_windows(app *a) {
    for (int i = 0; i < KV_PANEL_COUNT; i++) {
        if (a->win[i]) delwin(a->win[i]);
        a->win[i] = NULL;
    }
    WINDOW **others[] = {&a->w_tabs, &a->w_status, &a->w_input, &a->w_help, &a->w_small};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        if (*others[i]) delwin(*others[i]);
        *others[i] = NULL;
    }
    a->have_windows = 0;
}

void app_free_views(app *a) {
    app_free_windows(a);
    kv_snapshot_free(a->snap);
    for (int i = 0; i < a->n_sessions; i++) {
        kv_input_history_free(a->sessions[i]->history);
        kv_session_free(a->sessions[i]);
    }
    free(a->prompt_buf);
}

static WINDOW *mkwin(kv_rect r) { return kv_rect_visible(r) ? newwin(r.h, r.w, r.y, r.x) : NULL; }

static void build_windows(app *a) {
    app_free_windows(a);
    const kv_screen_layout *l = &a->v.layout;
    a->built = *l;
    a->have_windows = 1;
    if (l->too_small) {
        a->w_small = newwin(l->rows > 0 ? l->rows : 1, l->cols > 0 ? l->cols : 1, 0, 0);
        return;
    }
    for (int i = 0; i < KV_PANEL_COUNT; i++) a->win[i] = mkwin(l->panels[i]);
    a->w_tabs = mkwin(l->tabs);
    a->w_status = mkwin(l->status);
    a->w_input = mkwin(l->input);
    int hh = l->rows - 2 > 34 ? 34 : l->rows - 2, hw = l->cols - 4 > 96 ? 96 : l->cols - 4;
    a->w_help = newwin(hh, hw, (l->rows - hh) / 2, (l->cols - hw) / 2);
}

/* Rows the input needs at the current width (prompt + wrapped text). */
static int input_rows(const kv_input_view *in, int width) {
    int pw = kv_format_width(in->prompt ? in->prompt : "> ", -1);
    int cols = width - pw;
    if (cols < 1) cols = 1;
    return kv_format_wrap(in->text, -1, cols, NULL, 0);
}

/* The view state's copies of the app's sessions, histories and controls
 * (the layout aside): what the panels draw besides the snapshot. */
void app_view_sync(app *a) {
    kv_view_state *v = &a->v;
    v->sessions = a->sessions;
    v->n_sessions = a->n_sessions;
    v->selected = a->selected;
    v->itl_all = &a->itl_all;
    v->itl_load = &a->itl_load;
    v->prefix_tokens = &a->prefix_tokens;
    v->step_ms = &a->step_ms;
    v->log = a->log;
    v->log_head = a->log_head;
    v->log_n = a->log_n;
    v->paused = a->paused;
    v->load_sessions = a->load.drv ? a->load.sessions : 0;
    v->load_in_flight = a->load.n_inflight;
    kv_session *s = app_cur(a);
    v->chain_req = s && s->req ? s->req : 0;
    if (!v->chain_req && a->shown) {
        /* Nothing of ours running: show the first running request's table. */
        if (a->shown->n_running) v->chain_req = a->shown->running[0];
    }
}

void app_draw(app *a) {
    kv_view_state *v = &a->v;
    int rows, cols;
    getmaxyx(stdscr, rows, cols);
    kv_input_view_get(&v->input);
    kv_screen_layout l;
    if (kv_layout_compute(cols, rows, a->zoom, 1, &l)) return;
    if (!l.too_small) {
        int want = input_rows(&v->input, l.input.w);
        if (want > 1) kv_layout_compute(cols, rows, a->zoom, want, &l);
    }
    v->layout = l;
    if (!a->have_windows || memcmp(&a->built, &l, sizeof l)) {
        build_windows(a);
        a->need_clear = 1;
    }
    if (a->need_clear) {
        clearok(curscr, TRUE);
        a->need_clear = 0;
    }
    app_view_sync(a);
    if (v->status[0] && app_wall_s() > a->status_until) v->status[0] = 0;
    const kv_snapshot *snap = a->shown;
    if (l.too_small) {
        kv_panel_too_small(a->w_small, v, snap);
        wnoutrefresh(a->w_small);
        doupdate();
        return;
    }
    if (a->w_tabs) {
        kv_panel_tabs(a->w_tabs, v, snap);
        wnoutrefresh(a->w_tabs);
    }
    for (int i = 0; i < KV_PANEL_COUNT; i++) {
        if (!a->win[i]) continue;
        kv_panel_fn fn = a->att ? kv_panel_remote_fn(v, (kv_panel_id)i) : NULL; /* attach on a metrics source */
        if (!fn) fn = kv_panel_draw_fn((kv_panel_id)i);
        if (fn) fn(a->win[i], v, snap);
        wnoutrefresh(a->win[i]);
    }
    if (a->w_status) {
        kv_panel_status(a->w_status, v, snap);
        wnoutrefresh(a->w_status);
    }
    int cy = 0, cx = 0;
    if (a->w_input) {
        kv_panel_input(a->w_input, v, &cy, &cx);
        wmove(a->w_input, cy, cx);
    }
    if (v->help_shown && a->w_help) {
        kv_panel_help(a->w_help, v, snap);
        wnoutrefresh(a->w_help);
        curs_set(0);
    } else if (a->w_input) {
        wnoutrefresh(a->w_input); /* last, so the cursor ends up in the input */
        curs_set(v->focus == KV_FOCUS_INPUT && v->phase != KV_PHASE_REPLAY ? 1 : 0);
    }
    doupdate();
}

static void setup_colors(app *a) {
    a->color_ok = 0;
    a->v.color = 0;
    if (!has_colors()) return;
    if (start_color() != OK || COLORS < 8) return;
    short bg = use_default_colors() == OK ? -1 : COLOR_BLACK;
    init_pair(1, COLOR_RED, bg);
    init_pair(2, COLOR_GREEN, bg);
    init_pair(3, COLOR_YELLOW, bg);
    init_pair(4, COLOR_BLUE, bg);
    init_pair(5, COLOR_MAGENTA, bg);
    init_pair(6, COLOR_CYAN, bg);
    init_pair(7, COLOR_WHITE, bg);
    init_pair(KV_PAIR_TITLE, COLOR_CYAN, bg);
    init_pair(KV_PAIR_ERROR, COLOR_RED, bg);
    init_pair(KV_PAIR_STATUS, COLOR_BLACK, COLOR_CYAN);
    init_pair(KV_PAIR_PREFILL, COLOR_YELLOW, bg);
    init_pair(KV_PAIR_DECODE, COLOR_GREEN, bg);
    init_pair(KV_PAIR_SPEC, COLOR_MAGENTA, bg);
    init_pair(KV_PAIR_CACHED, COLOR_BLUE, bg);
    init_pair(KV_PAIR_OK, COLOR_GREEN, bg);
    a->color_ok = 1;
    const char *nc = getenv("NO_COLOR");
    a->v.color = !(nc && *nc) && strcmp(a->cfg.ui.theme, "mono") != 0;
}

int app_curses_start(app *a) {
    setlocale(LC_ALL, "");
    const char *cs = nl_langinfo(CODESET);
    a->v.utf8 = cs && (!strcmp(cs, "UTF-8") || !strcmp(cs, "utf8"));
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        fprintf(stderr, "kvtop: the TUI needs a terminal (stdin and stdout); see `kvtop --help` for the other commands\n");
        return -1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* NOTE: SIGWINCH is left to ncurses, whose handler only sets a flag;
     * get_wch then returns KEY_RESIZE and the next draw lays out again. The
     * engine and loader threads block these signals (block_signals). */
    if (!initscr()) {
        fprintf(stderr, "kvtop: cannot initialise the terminal\n");
        return -1;
    }
    raw();
    noecho();
    nonl();
    keypad(stdscr, TRUE);
    set_escdelay(25);
    mousemask(BUTTON4_PRESSED
#ifdef BUTTON5_PRESSED
                  | BUTTON5_PRESSED
#endif
              ,
              NULL);
    mouseinterval(0);
    /* Ctrl-Z arrives as a key (raw mode) and suspends through app_suspend;
     * a SIGTSTP from outside does too. Installed after initscr, which may
     * have put in a handler of its own. */
    sa.sa_handler = on_tstp;
    sigaction(SIGTSTP, &sa, NULL);
    sa.sa_handler = on_cont;
    sigaction(SIGCONT, &sa, NULL);
    setup_colors(a);
    wnoutrefresh(stdscr);
    doupdate();
    return 0;
}

void app_update_cpu(app *a) {
    double w = app_wall_s();
    if (w - a->wall_t0 < 1.0) return;
    double c = thread_cpu_s();
    a->v.ui_cpu_pct = 100.0 * (c - a->cpu_t0) / (w - a->wall_t0);
    a->v.fps = (double)(a->v.frames - a->fps_frames0) / (w - a->wall_t0);
    a->cpu_t0 = c;
    a->wall_t0 = w;
    a->fps_frames0 = a->v.frames;
}

/* One frame: events, snapshot, bookkeeping, draw. */
static void frame(app *a) {
    loader_check(a);
    if (a->eng) {
        chat_poll_events(a);
        load_tick(a);
        if (kv_engine_snapshot(a->eng, a->snap) == 0) {
            a->have_snap = 1;
            app_after_snapshot(a, a->snap);
        }
        /* The engine thread records (rec_hook); an error there ends it here. */
        if (a->rec && atomic_load(&a->rec_err)) record_stop(a);
        /* Released after the snapshot that still lists them. */
        for (int i = 0; i < a->n_forget; i++) kv_engine_forget(a->eng, a->forget[i]);
        a->n_forget = 0;
        if (a->pending_steps > 0) {
            kv_engine_step_once(a->eng);
            a->pending_steps--;
        }
    }
    a->shown = a->have_snap ? a->snap : NULL;
    app_clamp_scroll(a);
    app_draw(a);
    a->v.frames++;
    app_update_cpu(a);
}

static void app_free(app *a) {
    record_detach(a); /* before the writer goes: the engine thread may be in rec_hook */
    if (a->rec) kv_trace_writer_close(a->rec);
    a->rec = NULL;
    loader_close(a); /* load_stop frees the load's driver */
    kv_trace_free(a->replay);
    app_free_views(a);
}

void app_make_stamp(app *a, const char *prefix) {
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    char d[32];
    strftime(d, sizeof d, "%Y%m%d-%H%M%S", &tm);
    snprintf(a->stamp, sizeof a->stamp, "%s%s-%d", prefix, d, (int)getpid());
}

/* The main loop shared by the app and the replay viewer. */
void app_loop(app *a, void (*on_key)(app *, kv_key), void (*on_frame)(app *)) {
    int fps = a->cfg.ui.fps > 0 ? a->cfg.ui.fps : 10;
    if (fps > 60) fps = 60;
    double period = 1.0 / fps;
    double next = app_wall_s();
    a->cpu_t0 = thread_cpu_s();
    a->wall_t0 = app_wall_s();
    while (!a->quit && !got_term) {
        if (got_tstp) app_suspend(a);
        if (got_cont) {
            got_cont = 0;
            a->need_clear = 1;
        }
        double now = app_wall_s();
        int wait_ms = (int)((next - now) * 1000.0);
        if (wait_ms < 0) wait_ms = 0;
        kv_key k;
        int keys = 0;
        /* Keys first: the first waits up to the frame deadline, the rest
         * are drained without waiting (a paste arrives all at once). */
        if (read_key(&k, wait_ms)) {
            on_key(a, k);
            keys++;
            while (keys < 4096 && !a->quit && read_key(&k, 0)) {
                on_key(a, k);
                keys++;
            }
        }
        if (a->quit) break;
        now = app_wall_s();
        if (now >= next) {
            on_frame(a);
            next += period;
            if (next < now) next = now + period; /* fell behind: do not burst */
            if (a->max_frames && a->v.frames >= a->max_frames) break;
        } else if (keys) {
            /* Answer keys at once from the last snapshot. */
            if (a->redraw) a->redraw(a);
            else app_draw(a);
        }
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop [PROFILE.yaml] [--set key=value ...] [--frames N] [--record FILE] [--serve PORT]\n"
               "       kvtop [PROFILE.yaml] --compare key=v1,v2 [--set key=value ...] [--frames N]\n"
               "  PROFILE        a YAML profile (default profiles/default.yaml, else the built-in defaults)\n"
               "  --set k=v      override one profile key (repeatable), e.g. --set model.path=m.gguf\n"
               "  --frames N     exit after N frames (scripted demos and tests)\n"
               "  --record FILE  record a trace from the start (kvtop replay FILE to view it)\n"
               "  --serve PORT   also serve the OpenAI API on this engine (as kvtop serve; 0 = any free port)\n"
               "  --compare key=v1,v2[,v3,v4]\n"
               "                 2-4 engines side by side, one value of the key each (F5: the same workload to all)\n"
               "Inside: F1 or ? (on an empty input line) shows every key and /command.\n");
}

int cmd_tui(int argc, char **argv) {
    const char *profile = NULL, *record = NULL, *compare = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    long frames = 0, serve_port = -1;
    if (!sets) return 1;
    /* argv[0] is "tui" or the program name; options follow either way. */
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage(stdout);
            free(sets);
            return 0;
        } else if (!strcmp(s, "--set") && i + 1 < argc) {
            sets[n_sets++] = argv[++i];
        } else if (!strncmp(s, "--set=", 6)) {
            sets[n_sets++] = s + 6;
        } else if (!strcmp(s, "--frames") && i + 1 < argc) {
            char *end;
            frames = strtol(argv[++i], &end, 10);
            if (*end || frames < 1 || frames > 100000000) {
                fprintf(stderr, "kvtop: --frames needs a positive number, got '%s'\n", argv[i]);
                free(sets);
                return 2;
            }
        } else if (!strcmp(s, "--record") && i + 1 < argc) {
            record = argv[++i];
        } else if (!strcmp(s, "--compare") && i + 1 < argc) {
            compare = argv[++i]; /* compare.c: engines side by side */
        } else if (!strcmp(s, "--serve") && i + 1 < argc) {
            char *end;
            serve_port = strtol(argv[++i], &end, 10);
            if (*end || !argv[i][0] || serve_port < 0 || serve_port > 65535 || !serve_available()) {
                fprintf(stderr, "kvtop: --serve needs a port in [0, 65535], got '%s'%s\n", argv[i],
                        serve_available() ? "" : " (this binary has no server)");
                free(sets);
                return 2;
            }
        } else if (!strcmp(s, "--set") || !strcmp(s, "--frames") || !strcmp(s, "--record") ||
                   !strcmp(s, "--compare")) {
            /* The option is known; its value is missing (the last argument). */
            fprintf(stderr, "kvtop: %s needs %s\n", s,
                    !strcmp(s, "--set")       ? "key=value"
                    : !strcmp(s, "--frames")  ? "a positive number"
                    : !strcmp(s, "--compare") ? "key=value1,value2"
                                              : "a file name");
            free(sets);
            return 2;
        } else if (s[0] == '-') {
            fprintf(stderr, "kvtop: unknown option '%s'\n\n", s);
            usage(stderr);
            free(sets);
            return 2;
        } else if (!profile) {
            profile = s;
        } else {
            fprintf(stderr, "kvtop: more than one profile given ('%s' and '%s')\n", profile, s);
            free(sets);
            return 2;
        }
    }
    if (!profile && access("profiles/default.yaml", R_OK) == 0) profile = "profiles/default.yaml";
    static app A; /* large (the step log ring): not on the stack */
    app *a = &A;
    memset(a, 0, sizeof *a);
    a->serve_port = (int)serve_port;
    kv_err err;
    if (kv_profile_load_with_sets(profile, sets, n_sets, &a->cfg, &err)) {
        fprintf(stderr, "kvtop: %s\n", err.msg);
        free(sets);
        return 2;
    }
    if (compare) {
        int rc = 2;
        if (record || serve_port >= 0)
            fprintf(stderr, "kvtop: --compare runs engines side by side; it does not take --%s\n",
                    record ? "record" : "serve");
        else {
            a->max_frames = (uint64_t)frames;
            rc = cmp_main(a, profile, sets, n_sets, compare, NULL, 0, 0);
        }
        free(sets);
        return rc;
    }
    free(sets);
    snprintf(a->profile_path, sizeof a->profile_path, "%s", profile ? profile : "(defaults)");
    snprintf(a->v.profile_path, sizeof a->v.profile_path, "%.250s", a->profile_path);
    a->max_frames = (uint64_t)frames;
    a->zoom = -1;
    a->selected = 0;
    a->v.step_delay_ms = a->cfg.ui.step_delay_ms;
    a->snap = kv_snapshot_new();
    if (!a->snap) return 1;
    app_make_stamp(a, "");
    if (kv_session_state_dir(a->state_dir, sizeof a->state_dir)) a->state_dir[0] = 0;
    if (app_curses_start(a)) {
        kv_snapshot_free(a->snap);
        return 1;
    }
    if (kv_input_init(commands_on_line, a)) {
        endwin();
        fprintf(stderr, "kvtop: readline did not start\n");
        kv_snapshot_free(a->snap);
        return 1;
    }
    kv_session *first = chat_session_add(a, NULL);
    if (first) {
        /* The first tab's history is the active one. */
        kv_input_history_free(first->history);
        first->history = NULL;
    }
    loader_start(a, &a->cfg, profile);
    if (record) record_toggle(a, record);
    app_loop(a, commands_key, frame);
    /* Leave the terminal as we found it before anything slow. */
    endwin();
    int rc = got_term ? 1 : 0;
    app_free(a);
    kv_input_shutdown();
    return rc;
}
