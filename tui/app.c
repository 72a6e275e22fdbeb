/* app.c - the ncurses application (`kvtop [PROFILE]`) and the trace viewer
 * (`kvtop replay FILE`): the frame loop, key dispatch, chat sessions over
 * the engine, load injection, the step log and trace recording. Drawing is
 * in panels.c, pure logic in layout/format/blockmap/keys/session.
 *
 * The loop (STYLE.md "TUI loop"): wait for a key with a deadline, feed keys
 * to readline at once, and when a frame is due poll engine events, take one
 * snapshot, draw every panel from it and call doupdate() once. The engine
 * runs on its own thread; the model loads on a loader thread so the screen
 * is up (and typing works) while it loads. */
#include "panels.h"

#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../engine/chat_template.h"
#include "../engine/workload.h"
#include "../profiles/profile.h"
#include "blockmap.h"
#include "tui.h"
#include "../engine/trace.h"

#define MAX_SESSIONS 32
#define MAX_LOAD_INFLIGHT 64
#define FORGET_CAP 512

/* readline and the sanitizers: readline keeps its kill ring and a few
 * strings for the process lifetime; LeakSanitizer should not fail a run on
 * them. NOTE: only takes effect in sanitizer builds. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libreadline.so\n"; }

/* Background load injected from the profile's workload. */
typedef struct load_state {
    kv_workload *wl;             /* NULL when off */
    int n_items;
    int next;                    /* next item to submit */
    int submitted;               /* requests submitted since it started */
    int sessions;                /* background sessions (tags LOAD_BASE + k) */
    int closed;                  /* bool: closed loop (one request per session in flight) */
    double t0_s;                 /* wall clock the arrival times count from */
    int64_t inflight[MAX_LOAD_INFLIGHT];
    double last_tok_ms[MAX_LOAD_INFLIGHT]; /* engine clock of each one's newest token, < 0 none */
    int n_inflight;
    int32_t *ids;                /* (cap_ids) prompt token buffer */
    int cap_ids;
} load_state;

typedef struct app {
    kv_config cfg;               /* the running engine's config */
    char profile_path[1024];
    /* engine and its loader thread */
    kv_engine *eng;
    pthread_t loader;
    int loader_running;          /* bool */
    atomic_int loader_done;
    kv_config load_cfg;          /* what the loader loads */
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
    /* sessions */
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
    load_state load;
    kv_trace_writer *rec;        /* recording: frames added by the engine thread (rec_hook) */
    int rec_hooked;              /* bool: rec_hook is installed on eng */
    atomic_int rec_err;          /* set by rec_hook: the writer's error code, 0 none */
    char last_trace[1024];
    /* replay */
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
} app;

static volatile sig_atomic_t got_term;
static void on_term(int sig) {
    (void)sig;
    got_term = 1;
}

static const int slow_steps[] = {0, 50, 200, 500, 1000};

static double wall_s(void) {
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

static void status(app *a, int error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void status(app *a, int error, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->v.status, sizeof a->v.status, fmt, ap);
    va_end(ap);
    a->v.status_error = error;
    a->status_until = wall_s() + (error ? 8.0 : 4.0);
}

static kv_session *cur(app *a) { return a->n_sessions ? a->sessions[a->selected] : NULL; }

static void note(kv_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(kv_session *s, const char *fmt, ...) {
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

/* Starts a thread with the terminal signals blocked, so only the UI thread
 * ever runs their handlers. */
static void block_signals(sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGWINCH);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, old);
}
static void restore_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

/* ---- sessions ---- */

static kv_session *session_add(app *a, const char *name) {
    if (a->n_sessions >= MAX_SESSIONS) {
        status(a, 1, "at most %d tabs", MAX_SESSIONS);
        return NULL;
    }
    kv_session *s = kv_session_new(a->next_tag, name, &a->cfg.sampling, 256);
    if (!s) {
        status(a, 1, "out of memory");
        return NULL;
    }
    /* Tags wrap below the load range, so glyph letters and colors stay
     * distinct for the first 26 tabs. */
    a->next_tag = (a->next_tag + 1) % KV_SESSION_LOAD_BASE;
    s->history = kv_input_history_new();
    if (a->state_dir[0]) {
        char msg[256];
        if (kv_session_autosave_open(s, a->state_dir, a->stamp, msg, sizeof msg) && !a->autosave_warned) {
            status(a, 1, "autosave off: %s", msg);
            a->autosave_warned = 1;
        }
    }
    a->sessions[a->n_sessions++] = s;
    return s;
}

/* Makes tab i the selected one, moving readline's history and draft. */
static void session_select(app *a, int i) {
    if (i < 0 || i >= a->n_sessions || i == a->selected) return;
    kv_session *from = cur(a), *to = a->sessions[i];
    kv_input_history_switch(&from->history, &from->draft, &to->history, to->draft);
    free(to->draft);
    to->draft = NULL;
    a->selected = i;
    to->unread = 0;
}

static void session_close(app *a, int i) {
    if (i < 0 || i >= a->n_sessions) return;
    kv_session *s = a->sessions[i];
    if (s->req && a->eng) kv_engine_cancel(a->eng, s->req);
    if (a->n_sessions == 1) {
        /* The last tab is cleared rather than closed: there is always one. */
        kv_session_clear(s);
        s->req = 0;
        status(a, 0, "last tab cleared");
        return;
    }
    if (i == a->selected) session_select(a, i + 1 < a->n_sessions ? i + 1 : i - 1);
    /* Now s is not the active readline history: its slot holds it. */
    kv_input_history_free(s->history);
    s->history = NULL;
    kv_session_free(s);
    memmove(&a->sessions[i], &a->sessions[i + 1], (size_t)(a->n_sessions - i - 1) * sizeof a->sessions[0]);
    a->n_sessions--;
    if (a->selected > i) a->selected--;
}

static kv_session *session_by_tag(app *a, int tag) {
    for (int i = 0; i < a->n_sessions; i++)
        if (a->sessions[i]->tag == tag) return a->sessions[i];
    return NULL;
}

/* ---- submitting prompts ---- */

/* Renders the conversation from turn `first` into a->prompt_buf. */
static int render_prompt(app *a, kv_session *s, int first) {
    return kv_session_render(s, first, a->plain, a->tmpl, a->model->chat_template, &a->prompt_buf, &a->prompt_cap) < 0
               ? -1
               : 0;
}

/* Sends the session's conversation (its last turn is the user's prompt). */
static void submit(app *a, kv_session *s) {
    if (!a->eng) {
        s->waiting_engine = 1;
        return;
    }
    s->waiting_engine = 0;
    int first = 0, max_tokens = s->max_tokens;
    int n_tok = 0;
    /* Drop the oldest exchanges until prompt + reply fit the context. */
    for (;;) {
        if (render_prompt(a, s, first)) {
            note(s, "cannot format the prompt (out of memory?)");
            return;
        }
        n_tok = kv_tokenizer_encode(a->model->tok, a->prompt_buf, strlen(a->prompt_buf),
                                    kv_tokenizer_add_bos(a->model->tok), 1, NULL, 0, NULL);
        if (n_tok < 0 || n_tok + max_tokens <= a->max_ctx) break;
        int next = kv_session_next_exchange(s, first);
        if (next < 0) {
            max_tokens = a->max_ctx - n_tok;
            if (max_tokens < 1) {
                note(s, "the prompt is %d tokens, more than the %d-token context", n_tok, a->max_ctx);
                return;
            }
            break;
        }
        first = next;
    }
    kv_request_params p;
    kv_engine_request_defaults(a->eng, &p);
    p.text = a->prompt_buf;
    p.max_tokens = max_tokens;
    p.sampling = s->sampling;
    p.session = s->tag;
    const char *stop[1];
    if (!a->plain) {
        stop[0] = kv_chat_end_of_turn(a->tmpl);
        p.stop = stop;
        p.n_stop = 1;
    }
    kv_err err;
    int64_t id = kv_engine_submit(a->eng, &p, &err);
    if (id < 0) {
        note(s, "rejected: %s", err.msg);
        return;
    }
    s->req = id;
    s->last_token_ms = -1;
    int t = kv_session_add(s, KV_ROLE_ASSISTANT, "");
    if (t >= 0) s->turns[t].req = id;
    kv_session_autosave_turn(s, KV_ROLE_ASSISTANT, "");
    if (first > 0) status(a, 0, "older turns left out to fit the %d-token context", a->max_ctx);
}

static void send_prompt(app *a, kv_session *s, const char *text) {
    if (s->req) {
        status(a, 1, "a reply is still coming in this tab: Esc cancels it, or /new for another tab");
        return;
    }
    kv_session_add(s, KV_ROLE_USER, text);
    kv_session_autosave_turn(s, KV_ROLE_USER, text);
    s->scroll = 0;
    if (!a->eng) {
        s->waiting_engine = 1;
        if (a->v.phase == KV_PHASE_FAILED) note(s, "no engine: %s (/load PROFILE to try another)", a->v.load_msg);
        return;
    }
    submit(a, s);
}

/* ---- load injection ---- */

static int load_tokenize(void *ctx, const char *text, int32_t *out, int cap) {
    const kv_tokenizer *t = ctx;
    int n = kv_tokenizer_encode(t, text, strlen(text), 0, 0, out, cap, NULL);
    if (n < 0) return n;
    return n < cap ? n : cap;
}

static void load_stop(app *a) {
    load_state *L = &a->load;
    for (int i = 0; i < L->n_inflight; i++)
        if (a->eng) kv_engine_cancel(a->eng, L->inflight[i]);
    kv_workload_free(L->wl);
    L->wl = NULL;
    L->sessions = 0;
    /* In-flight ids stay until their DONE (cancelled) arrives. */
}

static void load_start(app *a, int sessions) {
    load_state *L = &a->load;
    if (!a->eng) {
        status(a, 1, "no engine yet");
        return;
    }
    if (L->wl) load_stop(a);
    kv_err err;
    L->wl = kv_workload_build(&a->cfg, &err);
    if (!L->wl) {
        status(a, 1, "load: %s", err.msg);
        return;
    }
    L->n_items = kv_workload_count(L->wl);
    if (L->n_items <= 0) {
        kv_workload_free(L->wl);
        L->wl = NULL;
        status(a, 1, "load: the workload has no requests");
        return;
    }
    L->sessions = sessions > 0 ? sessions : 1;
    L->closed = a->cfg.workload.arrival == KV_ARRIVAL_CLOSED;
    L->next = 0;
    L->t0_s = wall_s();
    if (L->cap_ids < a->max_ctx + 1) {
        int32_t *ni = realloc(L->ids, (size_t)(a->max_ctx + 1) * sizeof *ni);
        if (!ni) {
            load_stop(a);
            status(a, 1, "load: out of memory");
            return;
        }
        L->ids = ni;
        L->cap_ids = a->max_ctx + 1;
    }
    status(a, 0, "load: %d background sessions from the profile's workload (%d requests, %s)", L->sessions,
           L->n_items, L->closed ? "closed loop" : a->cfg.workload.arrival == KV_ARRIVAL_BURST ? "burst" : "poisson");
}

static void load_submit_one(app *a) {
    load_state *L = &a->load;
    int i = L->next++;
    const kv_workload_item *it = kv_workload_get(L->wl, i);
    if (!it) return;
    const kv_tokenizer *tok = a->model->tok;
    int bos = kv_tokenizer_add_bos(tok) && kv_tokenizer_bos(tok) >= 0;
    kv_err err;
    int n = kv_workload_tokens(L->wl, i, load_tokenize, (void *)tok, L->ids + bos, L->cap_ids - bos - 1, &err);
    if (n <= 0) return;
    if (bos) L->ids[0] = kv_tokenizer_bos(tok);
    n += bos;
    int out = it->output_tokens;
    if (n + out > a->max_ctx) out = a->max_ctx - n;
    if (out < 1) return;
    kv_request_params p;
    kv_engine_request_defaults(a->eng, &p);
    p.tokens = L->ids;
    p.n_tokens = n;
    p.max_tokens = out;
    p.ignore_eos = a->cfg.workload.ignore_eos;
    p.session = KV_SESSION_LOAD_BASE + L->submitted % L->sessions;
    int64_t id = kv_engine_submit(a->eng, &p, &err);
    L->submitted++;
    if (id > 0 && L->n_inflight < MAX_LOAD_INFLIGHT) {
        L->inflight[L->n_inflight] = id;
        L->last_tok_ms[L->n_inflight] = -1;
        L->n_inflight++;
    }
}

static void load_tick(app *a) {
    load_state *L = &a->load;
    if (!L->wl || !a->eng) return;
    int budget = 16; /* submissions per frame: keeps a frame short */
    if (L->closed) {
        while (L->n_inflight < L->sessions && budget-- > 0) {
            if (L->next >= L->n_items) L->next = 0;
            load_submit_one(a);
        }
        return;
    }
    double now = wall_s() - L->t0_s;
    while (budget-- > 0 && L->n_inflight < MAX_LOAD_INFLIGHT) {
        if (L->next >= L->n_items) {
            /* Start the workload over, its clock from now. */
            L->next = 0;
            L->t0_s = wall_s();
            now = 0;
        }
        const kv_workload_item *it = kv_workload_get(L->wl, L->next);
        if (!it || it->arrival_s > now) break;
        load_submit_one(a);
    }
}

static int load_slot(app *a, int64_t req) {
    for (int i = 0; i < a->load.n_inflight; i++)
        if (a->load.inflight[i] == req) return i;
    return -1;
}

/* ---- engine events ---- */

static void queue_forget(app *a, int64_t id) {
    if (a->n_forget < FORGET_CAP) a->forget[a->n_forget++] = id;
    else if (a->eng) kv_engine_forget(a->eng, id);
}

static void handle_event(app *a, const kv_event *ev) {
    if (ev->session >= KV_SESSION_LOAD_BASE) {
        int k = load_slot(a, ev->req);
        if (k < 0) {
            if (ev->type == KV_EVENT_DONE) queue_forget(a, ev->req);
            return;
        }
        if (ev->type == KV_EVENT_TOKEN) {
            if (a->load.last_tok_ms[k] >= 0) {
                double itl = ev->t_ms - a->load.last_tok_ms[k];
                kv_series_push(&a->itl_all, itl);
                kv_series_push(&a->itl_load, itl);
            }
            a->load.last_tok_ms[k] = ev->t_ms;
        } else {
            a->load.n_inflight--;
            a->load.inflight[k] = a->load.inflight[a->load.n_inflight];
            a->load.last_tok_ms[k] = a->load.last_tok_ms[a->load.n_inflight];
            queue_forget(a, ev->req);
        }
        return;
    }
    kv_session *s = session_by_tag(a, ev->session);
    if (ev->type == KV_EVENT_DONE) queue_forget(a, ev->req);
    if (!s || s->req != ev->req) return; /* a cancelled reply of a closed or cleared tab */
    kv_turn *t = kv_session_last(s);
    if (!t || t->role != KV_ROLE_ASSISTANT || t->req != ev->req) return;
    if (ev->type == KV_EVENT_TOKEN) {
        if (ev->text_len > 0) {
            int len = ev->text_len < (int)sizeof ev->text ? ev->text_len : (int)sizeof ev->text;
            kv_session_append_src(s, ev->text, (size_t)len, (int)ev->source);
            kv_session_autosave_text(s, ev->text, (size_t)len);
        }
        t->n_tokens++;
        if (s->last_token_ms >= 0) {
            double itl = ev->t_ms - s->last_token_ms;
            kv_series_push(&s->itl, itl);
            kv_series_push(&a->itl_all, itl);
        }
        s->last_token_ms = ev->t_ms;
        if (s != cur(a)) s->unread = 1;
        return;
    }
    /* Done. A stop string that ended the reply is not part of it. */
    t->finish = ev->finish ? (int)ev->finish : KV_FINISH_EOS;
    if (ev->finish == KV_FINISH_STOP && !a->plain) {
        const char *eot = kv_chat_end_of_turn(a->tmpl);
        size_t el = strlen(eot);
        if (el && t->len >= el && !memcmp(t->text + t->len - el, eot, el)) {
            t->len -= el;
            t->text[t->len] = 0;
        }
    }
    s->req = 0;
    s->last_token_ms = -1;
    kv_session_autosave_text(s, "\n", 1);
    if (ev->finish == KV_FINISH_CANCELLED) note(s, "[cancelled]");
    else if (ev->finish == KV_FINISH_REJECTED || ev->finish == KV_FINISH_ERROR)
        note(s, "[%s: %s]", ev->finish == KV_FINISH_REJECTED ? "rejected" : "error", ev->reason);
    else if (ev->finish == KV_FINISH_LENGTH) note(s, "[reply cut at %d tokens: /max N for longer]", t->n_tokens);
    if (s != cur(a)) s->unread = 1;
}

static void poll_events(app *a) {
    if (!a->eng) return;
    kv_event ev[64];
    for (int round = 0; round < 64; round++) {
        int n = kv_engine_poll(a->eng, ev, 64);
        for (int i = 0; i < n; i++) handle_event(a, &ev[i]);
        if (n < 64) break;
    }
    for (int i = 0; i < a->n_sessions; i++) kv_session_autosave_flush(a->sessions[i]);
}

/* ---- per-frame bookkeeping from the snapshot ---- */

static void log_push(app *a, const kv_decision *d) {
    a->log[a->log_head] = *d;
    a->log_head = (a->log_head + 1) % KV_LOG_CAP;
    if (a->log_n < KV_LOG_CAP) a->log_n++;
    else if (a->v.log_scroll > 0 && a->v.log_scroll < KV_LOG_CAP) a->v.log_scroll++; /* keep the view still */
}

static void after_snapshot(app *a, const kv_snapshot *s) {
    /* Step log: decisions of steps newer than any seen (a published step's
     * decisions are complete). */
    uint64_t newest = a->log_last_step;
    for (int i = 0; i < s->n_decisions; i++) {
        const kv_decision *d = &s->decisions[i];
        if (a->log_have && d->step <= a->log_last_step) continue;
        log_push(a, d);
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
    /* TTFT of each tab's replies. */
    for (int i = 0; i < a->n_sessions; i++) {
        kv_turn *t = kv_session_last(a->sessions[i]);
        if (!t || t->role != KV_ROLE_ASSISTANT || !t->req || t->ttft_ms >= 0) continue;
        for (int k = 0; k < s->n_requests; k++)
            if (s->requests[k].id == t->req && s->requests[k].ttft_ms >= 0) t->ttft_ms = s->requests[k].ttft_ms;
    }
    /* TPOT of each tab's latest reply, once it is known. */
    for (int i = 0; i < a->n_sessions; i++) {
        kv_turn *t = NULL;
        kv_session *ss = a->sessions[i];
        for (int k = ss->n_turns - 1; k >= 0 && !t; k--)
            if (ss->turns[k].role == KV_ROLE_ASSISTANT) t = &ss->turns[k];
        if (!t || !t->req) continue;
        for (int k = 0; k < s->n_requests; k++)
            if (s->requests[k].id == t->req && s->requests[k].n_generated > 1) {
                t->tpot_ms = s->requests[k].tpot_ms;
                if (s->requests[k].ttft_ms >= 0) t->ttft_ms = s->requests[k].ttft_ms;
            }
    }
}

/* ---- trace recording: a frame per engine step ---- */

/* The engine's step hook (engine thread): adds the step's snapshot to the
 * trace. After an error it adds nothing more; the UI thread sees rec_err
 * at its next frame and ends the recording. */
static void rec_hook(void *user, const kv_snapshot *s) {
    app *a = user;
    if (atomic_load(&a->rec_err)) return;
    int rc = kv_trace_writer_add(a->rec, s);
    if (rc < 0) atomic_store(&a->rec_err, rc);
}

/* Installs rec_hook on the engine (before it starts, for a new one).
 * 0 or the engine's error code. */
static int rec_attach(app *a) {
    if (!a->rec || !a->eng || a->rec_hooked) return 0;
    int rc = kv_engine_set_step_hook(a->eng, rec_hook, a);
    a->rec_hooked = rc == 0;
    return rc;
}

/* Removes the hook: on return no frame is being added. */
static void rec_detach(app *a) {
    if (a->rec_hooked && a->eng) kv_engine_set_step_hook(a->eng, NULL, NULL);
    a->rec_hooked = 0;
}

/* Ends the recording: the hook first, so the writer is ours alone. */
static void record_stop(app *a) {
    rec_detach(a);
    int frames = kv_trace_writer_frames(a->rec);
    int failed = atomic_load(&a->rec_err);
    snprintf(a->last_trace, sizeof a->last_trace, "%s", kv_trace_writer_path(a->rec));
    int rc = kv_trace_writer_close(a->rec);
    a->rec = NULL;
    a->v.recording = 0;
    atomic_store(&a->rec_err, 0);
    if (failed)
        status(a, 1, "trace %s: %s after %d steps, recording stopped", a->last_trace,
               failed == KV_ERR_IO ? "write error" : kv_err_str(failed), frames);
    else if (rc) status(a, 1, "trace %s: write error", a->last_trace);
    else status(a, 0, "trace saved: %s (%d steps; kvtop replay FILE, /export FILE.json)", a->last_trace, frames);
}

/* ---- engine lifecycle ---- */

static void *loader_main(void *p) {
    app *a = p;
    a->loaded = kv_engine_new(&a->load_cfg, &a->load_err);
    atomic_store(&a->loader_done, 1);
    return NULL;
}

static void engine_load(app *a, const kv_config *cfg) {
    a->load_cfg = *cfg;
    a->loaded = NULL;
    kv_err_clear(&a->load_err);
    atomic_store(&a->loader_done, 0);
    a->v.phase = KV_PHASE_LOADING;
    snprintf(a->v.load_msg, sizeof a->v.load_msg, "loading %.480s ...", cfg->model.path);
    sigset_t old;
    block_signals(&old);
    int rc = pthread_create(&a->loader, NULL, loader_main, a);
    restore_signals(&old);
    if (rc) {
        a->v.phase = KV_PHASE_FAILED;
        snprintf(a->v.load_msg, sizeof a->v.load_msg, "cannot start the loader thread");
        return;
    }
    a->loader_running = 1;
}

/* Called each iteration: picks up a finished load. */
static void engine_check_loaded(app *a) {
    if (!a->loader_running || !atomic_load(&a->loader_done)) return;
    pthread_join(a->loader, NULL);
    a->loader_running = 0;
    if (!a->loaded) {
        a->v.phase = KV_PHASE_FAILED;
        snprintf(a->v.load_msg, sizeof a->v.load_msg, "%s", a->load_err.msg[0] ? a->load_err.msg : "load failed");
        status(a, 1, "%s", a->v.load_msg);
        for (int i = 0; i < a->n_sessions; i++)
            if (a->sessions[i]->waiting_engine) note(a->sessions[i], "no engine: %s", a->v.load_msg);
        return;
    }
    a->eng = a->loaded;
    a->loaded = NULL;
    a->cfg = a->load_cfg;
    a->model = kv_engine_model(a->eng);
    a->plain = a->model->chat_template == NULL || !a->model->chat_template[0];
    a->tmpl = kv_chat_detect(a->model->chat_template);
    a->v.template_name = a->plain ? "as-is" : kv_chat_tmpl_name(a->tmpl);
    a->max_ctx = a->cfg.scheduler.max_seq_len > 0 ? a->cfg.scheduler.max_seq_len : a->model->hp.ctx_len;
    if (a->max_ctx <= 0 || a->max_ctx > a->model->hp.ctx_len) a->max_ctx = a->model->hp.ctx_len;
    a->v.config_max_batched = a->cfg.scheduler.max_batched_tokens;
    a->v.show_token_source = a->cfg.ui.show_token_source;
    kv_engine_set_step_delay(a->eng, slow_steps[a->slow_idx] ? slow_steps[a->slow_idx] : a->cfg.ui.step_delay_ms);
    if (a->paused) kv_engine_pause(a->eng);
    /* A recording started before the engine was up sees its first step;
     * one that spans a /load marks the new engine's steps as a restart. */
    if (a->rec && !a->rec_hooked) kv_trace_writer_restart(a->rec);
    if (rec_attach(a)) {
        atomic_store(&a->rec_err, KV_ERR_NOMEM);
        record_stop(a);
    }
    sigset_t old;
    block_signals(&old);
    int rc = kv_engine_start(a->eng);
    restore_signals(&old);
    if (rc) {
        status(a, 1, "cannot start the engine thread");
        rec_detach(a);
        kv_engine_free(a->eng);
        a->eng = NULL;
        a->v.phase = KV_PHASE_FAILED;
        return;
    }
    a->v.phase = KV_PHASE_READY;
    snprintf(a->v.load_msg, sizeof a->v.load_msg, "%s", a->model->name);
    for (int i = 0; i < a->n_sessions; i++)
        if (a->sessions[i]->waiting_engine) submit(a, a->sessions[i]);
}

static void engine_close(app *a) {
    load_stop(a);
    a->load.n_inflight = 0;
    if (a->loader_running) {
        pthread_join(a->loader, NULL);
        a->loader_running = 0;
        kv_engine_free(a->loaded);
        a->loaded = NULL;
    }
    if (a->eng) {
        rec_detach(a); /* the recording goes on with the next engine */
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
        log_push(a, &d);
    }
    for (int i = 0; i < a->n_sessions; i++) {
        kv_session *s = a->sessions[i];
        if (s->req) {
            kv_turn *t = kv_session_last(s);
            if (t && t->role == KV_ROLE_ASSISTANT) t->finish = KV_FINISH_CANCELLED;
            s->req = 0;
            note(s, "[engine restarted]");
        }
    }
}

/* ---- commands and keys ---- */

static void toggle_pause(app *a) {
    a->paused = !a->paused;
    if (a->eng) {
        if (a->paused) kv_engine_pause(a->eng);
        else kv_engine_resume(a->eng);
    }
    status(a, 0, a->paused ? "engine paused: F3 / s steps one iteration" : "engine running");
}

static void step_once(app *a) {
    if (!a->paused) {
        a->paused = 1;
        if (a->eng) kv_engine_pause(a->eng);
    }
    if (a->eng) kv_engine_step_once(a->eng);
    status(a, 0, "one step (paused; F2 resumes)");
}

static void set_slow(app *a, int ms) {
    if (a->eng) kv_engine_set_step_delay(a->eng, ms);
    a->v.step_delay_ms = ms;
    if (ms) status(a, 0, "slow motion: %d ms per step", ms);
    else status(a, 0, "slow motion off");
}

static void record_toggle(app *a, const char *path) {
    if (a->rec) {
        record_stop(a);
        if (!path) return;
    }
    char auto_path[1200];
    if (!path || !*path) {
        if (a->state_dir[0]) snprintf(auto_path, sizeof auto_path, "%s/%s.kvtrace", a->state_dir, a->stamp);
        else snprintf(auto_path, sizeof auto_path, "kvtop-%s.kvtrace", a->stamp);
        path = auto_path;
    }
    FILE *pf = NULL;
    char *yaml = NULL;
    size_t ylen = 0;
    pf = open_memstream(&yaml, &ylen);
    if (pf) {
        kv_profile_dump(&a->cfg, pf);
        fclose(pf);
    }
    kv_err err;
    a->rec = kv_trace_writer_open(path, yaml, &err);
    free(yaml);
    if (!a->rec) {
        status(a, 1, "%s", err.msg);
        return;
    }
    atomic_store(&a->rec_err, 0);
    /* NOTE: the trace starts with the next step; an idle engine adds
     * nothing, so its frame count is the number of steps recorded. */
    int rc = rec_attach(a);
    if (rc) {
        kv_trace_writer_close(a->rec);
        a->rec = NULL;
        status(a, 1, "cannot record: %s", kv_err_str(rc));
        return;
    }
    a->v.recording = 1;
    snprintf(a->v.record_path, sizeof a->v.record_path, "%.250s", path);
    status(a, 0, "recording to %s (F7 stops)", path);
}

static void export_trace(app *a, const char *out) {
    if (a->rec) record_toggle(a, NULL);
    if (!a->last_trace[0]) {
        status(a, 1, "nothing recorded yet: F7 or /record starts a trace");
        return;
    }
    kv_err err;
    kv_trace *t = kv_trace_load(a->last_trace, &err);
    if (!t) {
        status(a, 1, "%s", err.msg);
        return;
    }
    if (kv_trace_export_chrome(t, out, &err)) status(a, 1, "%s", err.msg);
    else status(a, 0, "Chrome trace written: %s (open in ui.perfetto.dev)", out);
    kv_trace_free(t);
}

static void zoom_next(app *a) {
    static const int order[] = {KV_PANEL_BLOCKS, KV_PANEL_PREFIX, KV_PANEL_SPEC, KV_PANEL_TPOT, KV_PANEL_MEM,
                                KV_PANEL_SCHED,  KV_PANEL_LOG,    KV_PANEL_CHAT, -1};
    int n = (int)(sizeof order / sizeof order[0]);
    int i = 0;
    while (i < n && order[i] != a->zoom) i++;
    a->zoom = order[(i + 1) % n];
    if (i == n) a->zoom = order[0];
}

static void show_settings(app *a, kv_session *s) {
    note(s, "%s: temperature %.2f, top-p %.2f, top-k %d, max %d tokens, seed %llu, template %s%s%s", s->name,
         s->sampling.temperature, s->sampling.top_p, s->sampling.top_k, s->max_tokens,
         (unsigned long long)s->sampling.seed, a->v.template_name ? a->v.template_name : "?",
         s->system ? ", system: " : "", s->system ? s->system : "");
}

static void run_command(app *a, const kv_command *c) {
    kv_session *s = cur(a);
    switch (c->kind) {
    case KV_CMD_NONE: send_prompt(a, s, c->prompt); break;
    case KV_CMD_NEW: {
        if (session_add(a, c->arg[0] ? c->arg : NULL)) session_select(a, a->n_sessions - 1);
        break;
    }
    case KV_CMD_CLOSE: session_close(a, a->selected); break;
    case KV_CMD_RENAME: kv_session_rename(s, c->arg); break;
    case KV_CMD_SYSTEM:
        kv_session_set_system(s, c->arg);
        note(s, c->arg[0] ? "system prompt set" : "system prompt removed");
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
        s->req = 0;
        kv_session_clear(s);
        status(a, 0, "conversation cleared (the autosave keeps it)");
        break;
    case KV_CMD_SAVE: {
        char msg[300];
        if (kv_session_save_markdown(s, c->arg, msg, sizeof msg)) status(a, 1, "%s", msg);
        else status(a, 0, "saved %s", c->arg);
        break;
    }
    case KV_CMD_LOAD: {
        kv_config nc;
        kv_err err;
        if (kv_profile_load_with_sets(c->arg, NULL, 0, &nc, &err)) {
            status(a, 1, "%s", err.msg);
            break;
        }
        engine_close(a);
        snprintf(a->profile_path, sizeof a->profile_path, "%.1000s", c->arg);
        snprintf(a->v.profile_path, sizeof a->v.profile_path, "%.250s", c->arg);
        a->cfg = nc;
        engine_load(a, &nc);
        status(a, 0, "loading profile %s", c->arg);
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
            status(a, 0, "load stopped");
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
    case KV_CMD_EXPORT: export_trace(a, c->arg); break;
    case KV_CMD_ZOOM: a->zoom = (int)c->num; break;
    case KV_CMD_TAB:
        if ((int)c->num - 1 < a->n_sessions) session_select(a, (int)c->num - 1);
        else status(a, 1, "no tab %d", (int)c->num);
        break;
    case KV_CMD_CANCEL:
        if (s->req && a->eng) kv_engine_cancel(a->eng, s->req);
        break;
    }
}

static void on_line(char *line, void *ctx) {
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
    if (kv_command_parse(line, &c, msg, sizeof msg)) status(a, 1, "%s", msg);
    else run_command(a, &c);
    free(line);
}

/* Transcript rows of the selected session at the current width. */
static void clamp_scroll(app *a) {
    kv_session *s = cur(a);
    if (!s) return;
    if (s->scroll < 0) s->scroll = 0;
    kv_rect t = a->v.layout.transcript;
    if (!kv_rect_visible(t)) return;
    int total = kv_session_wrap(s, t.w, 5, NULL, 0);
    int maxs = total - t.h;
    if (s->scroll > maxs) s->scroll = maxs > 0 ? maxs : 0;
}

static void do_action(app *a, kv_action act, kv_key k) {
    kv_session *s = cur(a);
    switch (act.type) {
    case KV_ACT_NONE: break;
    case KV_ACT_INPUT: kv_input_feed(k); break;
    case KV_ACT_QUIT: a->quit = 1; break;
    case KV_ACT_HELP: a->v.help_shown = !a->v.help_shown; break;
    case KV_ACT_CANCEL:
        if (s && s->req && a->eng) {
            kv_engine_cancel(a->eng, s->req);
            status(a, 0, "cancelling the reply");
        }
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
        if (a->load.wl) {
            load_stop(a);
            status(a, 0, "load stopped");
        } else {
            load_start(a, a->cfg.workload.sessions > 0 ? a->cfg.workload.sessions : 4);
        }
        break;
    case KV_ACT_ZOOM_NEXT: zoom_next(a); break;
    case KV_ACT_ZOOM_OFF: a->zoom = -1; break;
    case KV_ACT_TAB_NEXT: session_select(a, (a->selected + 1) % a->n_sessions); break;
    case KV_ACT_TAB_PREV: session_select(a, (a->selected + a->n_sessions - 1) % a->n_sessions); break;
    case KV_ACT_TAB_GOTO: session_select(a, act.arg); break;
    case KV_ACT_TAB_NEW:
        if (session_add(a, NULL)) session_select(a, a->n_sessions - 1);
        break;
    case KV_ACT_TAB_CLOSE: session_close(a, a->selected); break;
    case KV_ACT_TAB_RENAME:
        a->v.focus = KV_FOCUS_INPUT;
        kv_input_set_text("/rename ");
        break;
    case KV_ACT_SCROLL:
        if (s) s->scroll += act.arg;
        clamp_scroll(a);
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
        if (!a->color_ok) status(a, 1, "this terminal has no colors");
        else a->v.color = !a->v.color;
        break;
    case KV_ACT_REDRAW:
    case KV_ACT_RESIZE: a->need_clear = 1; break;
    }
}

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

static void handle_key(app *a, kv_key k) {
    kv_session *s = cur(a);
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

/* ---- drawing ---- */

static void free_windows(app *a) {
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

static WINDOW *mkwin(kv_rect r) { return kv_rect_visible(r) ? newwin(r.h, r.w, r.y, r.x) : NULL; }

static void build_windows(app *a) {
    free_windows(a);
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

static void draw(app *a) {
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
    /* View state from the app. */
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
    v->load_sessions = a->load.wl ? a->load.sessions : 0;
    v->load_in_flight = a->load.n_inflight;
    kv_session *s = cur(a);
    v->chain_req = s && s->req ? s->req : 0;
    if (!v->chain_req && a->shown) {
        /* Nothing of ours running: show the first running request's table. */
        if (a->shown->n_running) v->chain_req = a->shown->running[0];
    }
    if (v->status[0] && wall_s() > a->status_until) v->status[0] = 0;
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
        kv_panel_fn fn = kv_panel_draw_fn((kv_panel_id)i);
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

static int curses_start(app *a) {
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
    setup_colors(a);
    wnoutrefresh(stdscr);
    doupdate();
    return 0;
}

static void update_cpu(app *a) {
    double w = wall_s();
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
    engine_check_loaded(a);
    if (a->eng) {
        poll_events(a);
        load_tick(a);
        if (kv_engine_snapshot(a->eng, a->snap) == 0) {
            a->have_snap = 1;
            after_snapshot(a, a->snap);
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
    clamp_scroll(a);
    draw(a);
    a->v.frames++;
    update_cpu(a);
}

static void app_free(app *a) {
    rec_detach(a); /* before the writer goes: the engine thread may be in rec_hook */
    if (a->rec) kv_trace_writer_close(a->rec);
    a->rec = NULL;
    engine_close(a);
    free(a->load.ids);
    free_windows(a);
    kv_snapshot_free(a->snap);
    for (int i = 0; i < a->n_sessions; i++) {
        kv_input_history_free(a->sessions[i]->history);
        kv_session_free(a->sessions[i]);
    }
    kv_trace_free(a->replay);
    free(a->prompt_buf);
}

static void make_stamp(app *a) {
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    char d[32];
    strftime(d, sizeof d, "%Y%m%d-%H%M%S", &tm);
    snprintf(a->stamp, sizeof a->stamp, "%s-%d", d, (int)getpid());
}

/* The main loop shared by the app and the replay viewer. */
static void loop(app *a, void (*on_key)(app *, kv_key), void (*on_frame)(app *)) {
    int fps = a->cfg.ui.fps > 0 ? a->cfg.ui.fps : 10;
    if (fps > 60) fps = 60;
    double period = 1.0 / fps;
    double next = wall_s();
    a->cpu_t0 = thread_cpu_s();
    a->wall_t0 = wall_s();
    while (!a->quit && !got_term) {
        double now = wall_s();
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
        now = wall_s();
        if (now >= next) {
            on_frame(a);
            next += period;
            if (next < now) next = now + period; /* fell behind: do not burst */
            if (a->max_frames && a->v.frames >= a->max_frames) break;
        } else if (keys) {
            /* Answer keys at once from the last snapshot. */
            draw(a);
        }
    }
}

static void app_key(app *a, kv_key k) { handle_key(a, k); }

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop [PROFILE.yaml] [--set key=value ...] [--frames N] [--record FILE]\n"
               "  PROFILE        a YAML profile (default profiles/default.yaml, else the built-in defaults)\n"
               "  --set k=v      override one profile key (repeatable), e.g. --set model.path=m.gguf\n"
               "  --frames N     exit after N frames (scripted demos and tests)\n"
               "  --record FILE  record a trace from the start (kvtop replay FILE to view it)\n"
               "Inside: F1 or ? (on an empty input line) shows every key and /command.\n");
}

int cmd_tui(int argc, char **argv) {
    const char *profile = NULL, *record = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    long frames = 0;
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
    kv_err err;
    if (kv_profile_load_with_sets(profile, sets, n_sets, &a->cfg, &err)) {
        fprintf(stderr, "kvtop: %s\n", err.msg);
        free(sets);
        return 2;
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
    make_stamp(a);
    if (kv_session_state_dir(a->state_dir, sizeof a->state_dir)) a->state_dir[0] = 0;
    if (curses_start(a)) {
        kv_snapshot_free(a->snap);
        return 1;
    }
    if (kv_input_init(on_line, a)) {
        endwin();
        fprintf(stderr, "kvtop: readline did not start\n");
        kv_snapshot_free(a->snap);
        return 1;
    }
    kv_session *first = session_add(a, NULL);
    if (first) {
        /* The first tab's history is the active one. */
        kv_input_history_free(first->history);
        first->history = NULL;
    }
    engine_load(a, &a->cfg);
    if (record) record_toggle(a, record);
    loop(a, app_key, frame);
    /* Leave the terminal as we found it before anything slow. */
    endwin();
    int rc = got_term ? 1 : 0;
    app_free(a);
    kv_input_shutdown();
    return rc;
}

/* ---- kvtop replay ---- */

/* Shows frame replay_i: the only kv_trace_frame call, so a->shown stays
 * valid until the next one. */
static void replay_show(app *a) {
    const kv_snapshot *s = kv_trace_frame(a->replay, a->replay_i);
    a->shown = s;
    a->v.replay_frame = a->replay_i;
    /* The step log shows this frame's decisions. */
    a->log_n = 0;
    a->log_head = 0;
    if (s)
        for (int i = 0; i < s->n_decisions; i++) log_push(a, &s->decisions[i]);
}

static void replay_key(app *a, kv_key k) {
    int n = kv_trace_n_frames(a->replay);
    int before = a->replay_i;
    if (a->v.help_shown) {
        a->v.help_shown = 0;
        return;
    }
    switch (k.code) {
    case 'q':
    case KV_KEY_CTRL('c'):
    case KV_KEY_F(10): a->quit = 1; return;
    case KV_KEY_LEFT:
    case 'p':
    case 'b': a->replay_i--; break;
    case KV_KEY_RIGHT:
    case 'n':
    case ' ':
    case 'f': a->replay_i++; break;
    case KV_KEY_PGUP: a->replay_i -= 10; break;
    case KV_KEY_PGDN: a->replay_i += 10; break;
    case KV_KEY_HOME: a->replay_i = 0; break;
    case KV_KEY_END: a->replay_i = n - 1; break;
    case 'z':
    case KV_KEY_F(6): zoom_next(a); break;
    case KV_KEY_ESC: a->zoom = -1; break;
    case '?':
    case KV_KEY_F(1): a->v.help_shown = 1; break;
    case KV_KEY_UP: a->v.log_scroll++; break;
    case KV_KEY_DOWN:
        if (a->v.log_scroll > 0) a->v.log_scroll--;
        break;
    case 't':
        if (a->color_ok) a->v.color = !a->v.color;
        break;
    case KV_KEY_RESIZE: a->need_clear = 1; break;
    default: break;
    }
    if (a->replay_i < 0) a->replay_i = 0;
    if (a->replay_i >= n) a->replay_i = n - 1;
    if (a->replay_i != before) replay_show(a);
}

static void replay_frame(app *a) {
    draw(a);
    a->v.frames++;
    update_cpu(a);
}

int cmd_replay(int argc, char **argv) {
    const char *path = NULL, *export_path = NULL;
    long frames = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvtop replay FILE [--export OUT.json] [--frames N]\n"
                   "  steps through a trace recorded with F7, /record or `kvtop --record FILE`:\n"
                   "  one frame per engine step: Left/Right one step, PgUp/PgDn ten, Home/End, z zoom, q quit.\n"
                   "  --export writes Chrome trace-event JSON (Perfetto, chrome://tracing) and exits.\n");
            return 0;
        } else if (!strcmp(argv[i], "--export") && i + 1 < argc) {
            export_path = argv[++i];
        } else if (!strcmp(argv[i], "--frames") && i + 1 < argc) {
            frames = strtol(argv[++i], NULL, 10);
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "kvtop replay: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "kvtop replay: which trace file? (kvtop replay FILE)\n");
        return 2;
    }
    kv_err err;
    kv_trace *t = kv_trace_load(path, &err);
    if (!t) {
        fprintf(stderr, "kvtop replay: %s\n", err.msg);
        return 1;
    }
    if (export_path) {
        int rc = kv_trace_export_chrome(t, export_path, &err);
        if (rc) fprintf(stderr, "kvtop replay: %s\n", err.msg);
        else printf("%s: %d steps -> %s\n", path, kv_trace_n_frames(t), export_path);
        kv_trace_free(t);
        return rc ? 1 : 0;
    }
    if (kv_trace_n_frames(t) == 0) {
        fprintf(stderr, "kvtop replay: %s has no steps (recording ends before the engine stepped)\n", path);
        kv_trace_free(t);
        return 1;
    }
    static app A;
    app *a = &A;
    memset(a, 0, sizeof *a);
    kv_config_default(&a->cfg);
    a->replay = t;
    a->zoom = -1;
    a->max_frames = frames > 0 ? (uint64_t)frames : 0;
    a->v.phase = KV_PHASE_REPLAY;
    a->v.focus = KV_FOCUS_PANELS;
    a->v.replay_frames = kv_trace_n_frames(t);
    a->v.template_name = "replay";
    if (curses_start(a)) {
        kv_trace_free(t);
        return 1;
    }
    replay_show(a);
    status(a, 0, "%s: %d steps. Left/Right step through them.", path, a->v.replay_frames);
    loop(a, replay_key, replay_frame);
    endwin();
    kv_trace_free(a->replay);
    a->replay = NULL;
    free_windows(a);
    return 0;
}
