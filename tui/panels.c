/* panels.c - the TUI's frame around the panels (see panels.h): the drawing
 * helpers every panel uses (panels_internal.h), the tab bar, the status
 * line, the chat and its input, the overlays and the panel table. The
 * engine panels are in panels_kv.c (KV blocks, prefix sharing, memory) and
 * panels_sched.c (speculation, TPOT, scheduler, step log). Numbers come
 * formatted from format.c and the block map from blockmap.c, so these files
 * are only about where things go and how they look. */
#include "panels_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "blockmap.h"

/* ---- helpers ---- */

attr_t kv_panel_session_attr(const kv_view_state *v, int tag) {
    int c = kv_blockmap_color(tag);
    if (!v->color || c == 0) return A_NORMAL;
    return COLOR_PAIR(c);
}

attr_t panel_pair(const kv_view_state *v, int p, attr_t mono) { return v->color ? (attr_t)COLOR_PAIR(p) : mono; }

/* Draws UTF-8 text at (y, x) cut to `cols` columns; control characters
 * show as '?'. Returns the columns used. */
int panel_text(WINDOW *w, int y, int x, int cols, attr_t a, const char *s, int len) {
    if (cols <= 0 || !s) return 0;
    if (len < 0) len = (int)strlen(s);
    int used;
    int n = kv_format_prefix_fit(s, len, cols, &used);
    char buf[1024];
    if (n > (int)sizeof buf - 1) n = kv_format_prefix_fit(s, (int)sizeof buf - 1, cols, &used);
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    buf[n] = 0;
    wattrset(w, a);
    mvwaddnstr(w, y, x, buf, n);
    wattrset(w, A_NORMAL);
    return used;
}

int panel_textf(WINDOW *w, int y, int x, int cols, attr_t a, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return panel_text(w, y, x, cols, a, buf, -1);
}

/* Border with the title at the top left and `extra` at the top right. */
void panel_frame(WINDOW *w, const kv_view_state *v, const char *title, const char *extra) {
    int h, wd;
    getmaxyx(w, h, wd);
    (void)h;
    werase(w);
    box(w, 0, 0);
    int x = 2;
    x += panel_text(w, 0, x, wd - 4, panel_pair(v, KV_PAIR_TITLE, A_BOLD) | A_BOLD, " ", 1);
    x += panel_text(w, 0, x, wd - x - 2, panel_pair(v, KV_PAIR_TITLE, A_BOLD) | A_BOLD, title, -1);
    x += panel_text(w, 0, x, wd - x - 2, panel_pair(v, KV_PAIR_TITLE, A_BOLD) | A_BOLD, " ", 1);
    if (extra && *extra) {
        int ew = kv_format_width(extra, -1) + 2;
        int ex = wd - 2 - ew;
        if (ex > x + 1) {
            char b[256];
            snprintf(b, sizeof b, " %s ", extra);
            panel_text(w, 0, ex, ew, A_NORMAL, b, -1);
        }
    }
}

/* Inner size of a framed window. */
void panel_inner(WINDOW *w, int *ih, int *iw) {
    int h, wd;
    getmaxyx(w, h, wd);
    *ih = h - 2;
    *iw = wd - 2;
}

const char *panel_na_or(const kv_snapshot *s, const char *msg) { return s ? msg : "N/A (no engine yet)"; }

int panel_open_room(WINDOW *w, const kv_view_state *v, const char *title, const char *extra, int *ih, int *iw) {
    panel_frame(w, v, title, extra);
    panel_inner(w, ih, iw);
    return *ih > 0 && *iw > 0;
}

int panel_open(WINDOW *w, const kv_view_state *v, const kv_snapshot *s, const char *title, const char *extra,
               const char *none, int *ih, int *iw) {
    panel_frame(w, v, title, extra);
    panel_inner(w, ih, iw);
    if (*ih <= 0) return 0;
    if (!s) {
        panel_text(w, 1, 1, *iw, A_DIM, none ? none : panel_na_or(s, ""), -1);
        return 0;
    }
    return 1;
}

/* Finds a request in the snapshot. */
const kv_snap_request *panel_find_req(const kv_snapshot *s, int64_t id) {
    if (!s || id <= 0) return NULL;
    for (int i = 0; i < s->n_requests; i++)
        if (s->requests[i].id == id) return &s->requests[i];
    return NULL;
}

/* ---- tab bar and status line ---- */

void kv_panel_tabs(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    int h, wd;
    getmaxyx(w, h, wd);
    (void)h;
    werase(w);
    attr_t bar = panel_pair(v, KV_PAIR_STATUS, A_REVERSE);
    wbkgdset(w, ' ' | bar);
    werase(w);
    int x = panel_text(w, 0, 0, wd, bar | A_BOLD, " kvtop ", -1);
    /* Right side first, so tabs know their room. */
    char right[256];
    int rn = 0;
    if (v->phase == KV_PHASE_REPLAY) {
        rn = snprintf(right, sizeof right, "REPLAY %d/%d  ", v->replay_frame + 1, v->replay_frames);
    } else if (v->phase == KV_PHASE_LOADING) {
        rn = snprintf(right, sizeof right, "loading...  ");
    } else if (v->phase == KV_PHASE_FAILED) {
        rn = snprintf(right, sizeof right, "no engine  ");
    } else if (s) {
        rn = snprintf(right, sizeof right, "%s%s%s%s", v->reloading ? "LOADING NEXT  " : "",
                      v->recording ? "REC  " : "", v->paused ? "PAUSED  " : "", v->load_sessions ? "LOAD  " : "");
    }
    if (v->remote[0]) rn += snprintf(right + rn, sizeof right - (size_t)rn, "%.100s  ", v->remote);
    if (s && v->remote_metrics) /* a metrics source has no step counter */
        snprintf(right + rn, sizeof right - (size_t)rn, "%.40s ", s->model_name);
    else if (s)
        snprintf(right + rn, sizeof right - (size_t)rn, "%.40s  step %llu ", s->model_name,
                 (unsigned long long)s->step);
    int rw = kv_format_width(right, -1);
    int limit = wd - rw - 1;
    for (int i = 0; i < v->n_sessions && x < limit; i++) {
        const kv_session *ss = v->sessions[i];
        char label[64];
        snprintf(label, sizeof label, " %d:%c %s%s%s ", i + 1, kv_blockmap_glyph(ss->tag, 0), ss->name,
                 ss->req ? "~" : "", ss->unread && i != v->selected ? "*" : "");
        attr_t a = i == v->selected ? (A_REVERSE | A_BOLD) : bar;
        if (i == v->selected && v->color) a = kv_panel_session_attr(v, ss->tag) | A_REVERSE | A_BOLD;
        x += panel_text(w, 0, x, limit - x, a, label, -1);
        x += panel_text(w, 0, x, limit - x, bar, " ", 1);
    }
    if (rw < wd) panel_text(w, 0, wd - rw, rw, bar, right, -1);
    wbkgdset(w, ' ');
}

void kv_panel_status(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    (void)s;
    int h, wd;
    getmaxyx(w, h, wd);
    (void)h;
    werase(w);
    char right[96];
    snprintf(right, sizeof right, " [%s] ui %.1f%% cpu %.0f fps ", v->focus == KV_FOCUS_INPUT ? "input" : "panels",
             v->ui_cpu_pct, v->fps);
    int rw = kv_format_width(right, -1);
    const char *msg = v->status;
    char hint[256];
    if (!msg[0]) {
        if (v->phase == KV_PHASE_REPLAY)
            snprintf(hint, sizeof hint, "Left/Right or p/n: step back/forward  Home/End  F1 help  q quit");
        else if (v->focus == KV_FOCUS_INPUT)
            snprintf(hint, sizeof hint, "F1 help  Tab panels  F2 pause  F3 step  F4 slow  F5 load  F6 zoom  Esc cancel  ^C quit");
        else
            snprintf(hint, sizeof hint, "q quit  p pause  s step  m slow  l load  z zoom  1-9 tab  Up/Down log  Tab input");
        msg = hint;
    }
    attr_t a = v->status_error ? (panel_pair(v, KV_PAIR_ERROR, A_BOLD) | A_BOLD) : A_NORMAL;
    panel_text(w, 0, 0, wd - rw, a, msg, -1);
    if (rw < wd) panel_text(w, 0, wd - rw, rw, A_DIM, right, -1);
}

/* ---- chat ---- */

void kv_panel_chat(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_session *ss = v->n_sessions ? v->sessions[v->selected] : NULL;
    char title[96], extra[160];
    snprintf(title, sizeof title, "Chat %c %s", ss ? kv_blockmap_glyph(ss->tag, 0) : '-', ss ? ss->name : "");
    extra[0] = 0;
    if (ss)
        snprintf(extra, sizeof extra, "%s T%.2g p%.2g max%d", v->template_name ? v->template_name : "?",
                 ss->sampling.temperature, ss->sampling.top_p, ss->max_tokens);
    panel_frame(w, v, title, extra);
    if (!ss) return;
    kv_rect pr = v->layout.panels[KV_PANEL_CHAT];
    kv_rect tr = v->layout.transcript, ir = v->layout.input;
    int ty = tr.y - pr.y, tx = tr.x - pr.x, th = tr.h, tw = tr.w;
    /* Separator between transcript and input. */
    if (kv_rect_visible(ir) && ir.y - pr.y - 1 > 0) {
        int sy = ir.y - pr.y - 1;
        wattrset(w, A_DIM);
        mvwhline(w, sy, 1, ACS_HLINE, tw);
        wattrset(w, A_NORMAL);
        /* The latest reply's timing, then the system prompt. */
        char info[256] = "";
        int n = 0;
        const kv_turn *lt = NULL;
        for (int k = ss->n_turns - 1; k >= 0 && !lt; k--)
            if (ss->turns[k].role == KV_ROLE_ASSISTANT) lt = &ss->turns[k];
        if (lt && lt->n_tokens > 0) {
            char tt[16], tp[16];
            kv_format_ms(tt, sizeof tt, lt->ttft_ms, lt->ttft_ms >= 0);
            kv_format_ms(tp, sizeof tp, lt->tpot_ms, lt->tpot_ms >= 0);
            n += snprintf(info + n, sizeof info - (size_t)n, " %d tok TTFT %s TPOT %s ", lt->n_tokens, tt, tp);
        }
        if (ss->system) snprintf(info + n, sizeof info - (size_t)n, " system: %.60s ", ss->system);
        if (info[0]) panel_text(w, sy, 2, tw - 2, A_DIM, info, -1);
    }
    if (th <= 0 || tw <= 0) return;
    const int indent = 5;
    /* The newest rows that fit, minus the scroll offset. */
    enum { MAXROWS = 4096 };
    static kv_tline rows[MAXROWS]; /* UI thread only; too big for the stack */
    int want = th + ss->scroll;
    if (want > MAXROWS) want = MAXROWS;
    int total = kv_session_wrap(ss, tw, indent, rows, want);
    int have = total < want ? total : want;
    int scroll = ss->scroll;
    if (scroll > have - th) scroll = have - th > 0 ? have - th : 0;
    int first = have - th - scroll;
    if (first < 0) first = 0;
    int y = ty;
    for (int i = first; i < have - scroll && y < ty + th; i++, y++) {
        const kv_tline *r = &rows[i];
        const kv_turn *t = &ss->turns[r->turn];
        attr_t body = A_NORMAL;
        if (r->first) {
            const char *label = t->role == KV_ROLE_USER ? "you" : t->role == KV_ROLE_ASSISTANT ? "bot" : " !";
            attr_t la = t->role == KV_ROLE_USER ? A_BOLD
                        : t->role == KV_ROLE_ASSISTANT ? kv_panel_session_attr(v, ss->tag) | A_BOLD
                                                        : A_DIM;
            panel_text(w, y, tx, indent, la, label, -1);
        }
        if (t->role == KV_ROLE_NOTE) body = A_DIM;
        if (v->show_token_source && t->role == KV_ROLE_ASSISTANT && t->src) {
            /* Runs of bytes with the same source: drafted-and-accepted tokens
             * in the spec color, the target's bonus tokens underlined. */
            int x = tx + indent, end = r->off + r->len;
            for (int p = r->off; p < end && x < tx + tw;) {
                int q = p;
                while (q < end && t->src[q] == t->src[p]) q++;
                attr_t a = t->src[p] == KV_TOKSRC_DRAFT   ? panel_pair(v, KV_PAIR_SPEC, A_BOLD)
                           : t->src[p] == KV_TOKSRC_BONUS ? A_UNDERLINE
                                                          : body;
                x += panel_text(w, y, x, tx + tw - x, a, t->text + p, q - p);
                p = q;
            }
        } else {
            panel_text(w, y, tx + indent, tw - indent, body, t->text + r->off, r->len);
        }
    }
    /* Where the reply stands, on the last row's end when it is streaming. */
    if (ss->req && scroll == 0) {
        const kv_snap_request *q = panel_find_req(s, ss->req);
        char st[96];
        if (q && q->state == KV_REQ_WAITING) snprintf(st, sizeof st, "[queued: %.60s]", q->wait_reason);
        else if (q && q->n_computed < q->n_prompt) snprintf(st, sizeof st, "[prefill %d/%d]", q->n_computed, q->n_prompt);
        else snprintf(st, sizeof st, "%s", v->paused ? "[paused]" : "");
        if (st[0]) {
            int sw = kv_format_width(st, -1);
            if (sw < tw) panel_text(w, ty, tx + tw - sw, sw, A_DIM, st, -1);
        }
    }
    if (scroll > 0) {
        char more[48];
        snprintf(more, sizeof more, "[%d rows below: PgDn]", scroll);
        int mw = kv_format_width(more, -1);
        if (mw < tw) panel_text(w, ty + th - 1, tx + tw - mw, mw, A_REVERSE, more, -1);
    }
}

void kv_panel_input(WINDOW *w, const kv_view_state *v, int *cy, int *cx) {
    int h, wd;
    getmaxyx(w, h, wd);
    werase(w);
    const kv_input_view *in = &v->input;
    const char *prompt = in->prompt ? in->prompt : "> ";
    const char *text = in->text ? in->text : "";
    /* Prompt then text, wrapped to the width; the cursor follows the
     * byte offset readline reports. */
    int pw = kv_format_width(prompt, -1);
    if (pw > wd / 2) pw = wd / 2;
    attr_t pa = v->focus == KV_FOCUS_INPUT ? A_BOLD : A_DIM;
    panel_text(w, 0, 0, pw, pa, prompt, -1);
    int cols = wd - pw;
    if (cols < 1) cols = 1;
    int len = (int)strlen(text);
    kv_wrap_iter it;
    kv_wrap_line l;
    kv_format_wrap_begin(&it);
    /* Rows in total, and the cursor row, so the window shows the part with the cursor. */
    int row = 0, crow = 0, ccol = 0;
    kv_wrap_line lines[64];
    int nl = 0;
    while (kv_format_wrap_next(text, len, cols, &it, &l)) {
        if (nl < 64) lines[nl] = l;
        if (in->point >= l.off && in->point <= l.off + l.len) {
            crow = row;
            ccol = kv_format_width(text + l.off, in->point - l.off);
        }
        nl++;
        row++;
    }
    if (nl > 64) nl = 64;
    if (crow >= nl) crow = nl - 1;
    int top = crow - (h - 1);
    if (top < 0) top = 0;
    for (int r = top; r < nl && r - top < h; r++) panel_text(w, r - top, pw, cols, A_NORMAL, text + lines[r].off, lines[r].len);
    if (ccol >= cols) ccol = cols - 1;
    if (cy) *cy = crow - top;
    if (cx) *cx = pw + ccol;
    if (v->phase == KV_PHASE_LOADING && len == 0)
        panel_text(w, 0, pw, cols, A_DIM, "(the model is loading; type away, prompts wait for it)", -1);
}


/* ---- overlays ---- */

void kv_panel_help(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    (void)s;
    panel_frame(w, v, "Help", "any key closes");
    int ih, iw;
    panel_inner(w, &ih, &iw);
    const kv_key_help *k = kv_keys_help();
    const kv_key_help *c = kv_commands_help();
    int y = 1;
    panel_text(w, y++, 1, iw, A_BOLD, "Keys: typing goes to the input line; Tab gives single keys to the panels", -1);
    for (int i = 0; k[i].keys && y <= ih; i++, y++) {
        panel_textf(w, y, 2, 22, panel_pair(v, KV_PAIR_TITLE, A_BOLD), "%s", k[i].keys);
        panel_text(w, y, 24, iw - 23, A_NORMAL, k[i].what, -1);
    }
    if (y + 1 <= ih) panel_text(w, ++y, 1, iw, A_BOLD, "Commands (type them in the input line)", -1);
    y++;
    for (int i = 0; c[i].keys && y <= ih; i++, y++) {
        panel_textf(w, y, 2, 22, panel_pair(v, KV_PAIR_TITLE, A_BOLD), "%s", c[i].keys);
        panel_text(w, y, 24, iw - 23, A_NORMAL, c[i].what, -1);
    }
}

void kv_panel_too_small(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    (void)s;
    int h, wd;
    getmaxyx(w, h, wd);
    werase(w);
    char l1[96], l2[96];
    snprintf(l1, sizeof l1, "kvtop needs at least %dx%d (now %dx%d)", KV_LAYOUT_MIN_COLS, KV_LAYOUT_MIN_ROWS,
             v->layout.cols, v->layout.rows);
    snprintf(l2, sizeof l2, "enlarge the terminal, or Ctrl-C to quit");
    int y = h / 2 - 1;
    if (y < 0) y = 0;
    int w1 = kv_format_width(l1, -1), w2 = kv_format_width(l2, -1);
    panel_text(w, y, w1 < wd ? (wd - w1) / 2 : 0, wd, A_BOLD, l1, -1);
    if (y + 1 < h) panel_text(w, y + 1, w2 < wd ? (wd - w2) / 2 : 0, wd, A_NORMAL, l2, -1);
}

kv_panel_fn kv_panel_draw_fn(kv_panel_id id) {
    switch (id) {
    case KV_PANEL_CHAT: return kv_panel_chat;
    case KV_PANEL_BLOCKS: return kv_panel_blocks;
    case KV_PANEL_PREFIX: return kv_panel_prefix;
    case KV_PANEL_SPEC: return kv_panel_spec;
    case KV_PANEL_TPOT: return kv_panel_tpot;
    case KV_PANEL_MEM: return kv_panel_mem;
    case KV_PANEL_SCHED: return kv_panel_sched;
    case KV_PANEL_LOG: return kv_panel_log;
    default: return NULL;
    }
}
