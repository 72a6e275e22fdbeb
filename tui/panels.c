/* panels.c - one draw function per TUI panel (see panels.h). Each reads the
 * view state and the engine snapshot and paints its own window; numbers
 * come formatted from format.c and the block map from blockmap.c, so this
 * file is only about where things go and how they look. */
#include "panels.h"

#include <math.h>
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

static attr_t pair(const kv_view_state *v, int p, attr_t mono) { return v->color ? (attr_t)COLOR_PAIR(p) : mono; }

/* Draws UTF-8 text at (y, x) cut to `cols` columns; control characters
 * show as '?'. Returns the columns used. */
static int text_at(WINDOW *w, int y, int x, int cols, attr_t a, const char *s, int len) {
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

static int textf(WINDOW *w, int y, int x, int cols, attr_t a, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int textf(WINDOW *w, int y, int x, int cols, attr_t a, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return text_at(w, y, x, cols, a, buf, -1);
}

/* Border with the title at the top left and `extra` at the top right. */
static void frame(WINDOW *w, const kv_view_state *v, const char *title, const char *extra) {
    int h, wd;
    getmaxyx(w, h, wd);
    (void)h;
    werase(w);
    box(w, 0, 0);
    int x = 2;
    x += text_at(w, 0, x, wd - 4, pair(v, KV_PAIR_TITLE, A_BOLD) | A_BOLD, " ", 1);
    x += text_at(w, 0, x, wd - x - 2, pair(v, KV_PAIR_TITLE, A_BOLD) | A_BOLD, title, -1);
    x += text_at(w, 0, x, wd - x - 2, pair(v, KV_PAIR_TITLE, A_BOLD) | A_BOLD, " ", 1);
    if (extra && *extra) {
        int ew = kv_format_width(extra, -1) + 2;
        int ex = wd - 2 - ew;
        if (ex > x + 1) {
            char b[256];
            snprintf(b, sizeof b, " %s ", extra);
            text_at(w, 0, ex, ew, A_NORMAL, b, -1);
        }
    }
}

/* Inner size of a framed window. */
static void inner(WINDOW *w, int *ih, int *iw) {
    int h, wd;
    getmaxyx(w, h, wd);
    *ih = h - 2;
    *iw = wd - 2;
}

static const char *na_or(const kv_snapshot *s, const char *msg) { return s ? msg : "N/A (no engine yet)"; }

/* Finds a request in the snapshot. */
static const kv_snap_request *find_req(const kv_snapshot *s, int64_t id) {
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
    attr_t bar = pair(v, KV_PAIR_STATUS, A_REVERSE);
    wbkgdset(w, ' ' | bar);
    werase(w);
    int x = text_at(w, 0, 0, wd, bar | A_BOLD, " kvtop ", -1);
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
        rn = snprintf(right, sizeof right, "%s%s%s", v->recording ? "REC  " : "",
                      v->paused ? "PAUSED  " : "", v->load_sessions ? "LOAD  " : "");
    }
    if (s)
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
        x += text_at(w, 0, x, limit - x, a, label, -1);
        x += text_at(w, 0, x, limit - x, bar, " ", 1);
    }
    if (rw < wd) text_at(w, 0, wd - rw, rw, bar, right, -1);
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
    attr_t a = v->status_error ? (pair(v, KV_PAIR_ERROR, A_BOLD) | A_BOLD) : A_NORMAL;
    text_at(w, 0, 0, wd - rw, a, msg, -1);
    if (rw < wd) text_at(w, 0, wd - rw, rw, A_DIM, right, -1);
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
    frame(w, v, title, extra);
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
        if (info[0]) text_at(w, sy, 2, tw - 2, A_DIM, info, -1);
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
            text_at(w, y, tx, indent, la, label, -1);
        }
        if (t->role == KV_ROLE_NOTE) body = A_DIM;
        if (v->show_token_source && t->role == KV_ROLE_ASSISTANT && t->src) {
            /* Runs of bytes with the same source: drafted-and-accepted tokens
             * in the spec color, the target's bonus tokens underlined. */
            int x = tx + indent, end = r->off + r->len;
            for (int p = r->off; p < end && x < tx + tw;) {
                int q = p;
                while (q < end && t->src[q] == t->src[p]) q++;
                attr_t a = t->src[p] == KV_TOKSRC_DRAFT   ? pair(v, KV_PAIR_SPEC, A_BOLD)
                           : t->src[p] == KV_TOKSRC_BONUS ? A_UNDERLINE
                                                          : body;
                x += text_at(w, y, x, tx + tw - x, a, t->text + p, q - p);
                p = q;
            }
        } else {
            text_at(w, y, tx + indent, tw - indent, body, t->text + r->off, r->len);
        }
    }
    /* Where the reply stands, on the last row's end when it is streaming. */
    if (ss->req && scroll == 0) {
        const kv_snap_request *q = find_req(s, ss->req);
        char st[96];
        if (q && q->state == KV_REQ_WAITING) snprintf(st, sizeof st, "[queued: %.60s]", q->wait_reason);
        else if (q && q->n_computed < q->n_prompt) snprintf(st, sizeof st, "[prefill %d/%d]", q->n_computed, q->n_prompt);
        else snprintf(st, sizeof st, "%s", v->paused ? "[paused]" : "");
        if (st[0]) {
            int sw = kv_format_width(st, -1);
            if (sw < tw) text_at(w, ty, tx + tw - sw, sw, A_DIM, st, -1);
        }
    }
    if (scroll > 0) {
        char more[48];
        snprintf(more, sizeof more, "[%d rows below: PgDn]", scroll);
        int mw = kv_format_width(more, -1);
        if (mw < tw) text_at(w, ty + th - 1, tx + tw - mw, mw, A_REVERSE, more, -1);
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
    text_at(w, 0, 0, pw, pa, prompt, -1);
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
    for (int r = top; r < nl && r - top < h; r++) text_at(w, r - top, pw, cols, A_NORMAL, text + lines[r].off, lines[r].len);
    if (ccol >= cols) ccol = cols - 1;
    if (cy) *cy = crow - top;
    if (cx) *cx = pw + ccol;
    if (v->phase == KV_PHASE_LOADING && len == 0)
        text_at(w, 0, pw, cols, A_DIM, "(the model is loading; type away, prompts wait for it)", -1);
}

/* ---- KV block map ---- */

void kv_panel_blocks(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[96] = "";
    if (s) {
        char b[32];
        kv_format_bytes(b, sizeof b, (uint64_t)s->block_size * s->kv_bytes_per_token);
        snprintf(extra, sizeof extra, "%d blocks x %d tok, %s each, %s", s->n_blocks, s->block_size, b,
                 s->layout == KV_LAYOUT_CONTIGUOUS ? "contiguous" : "paged");
    }
    frame(w, v, "KV blocks", extra);
    int ih, iw;
    inner(w, &ih, &iw);
    if (ih <= 0 || iw <= 0) return;
    if (!s || !s->blocks || s->n_blocks <= 0) {
        const char *m = v->phase == KV_PHASE_LOADING ? v->load_msg : na_or(s, "no blocks");
        text_at(w, 1, 1, iw, A_DIM, m, -1);
        return;
    }
    /* Rows: counts, grid, chain, legend (the legend goes first when short). */
    int chain_rows = ih >= 4 ? 1 : 0;
    int legend_rows = ih >= 5 ? 1 : 0;
    int grid_rows = ih - 1 - chain_rows - legend_rows;
    if (grid_rows < 1) grid_rows = 1;
    /* Show blocks up to the last one in use 1:1 when that fits, so a few
     * sessions in a big pool are not merged into one cell. */
    int cells = grid_rows * iw;
    int last = -1;
    for (int i = s->n_blocks - 1; i >= 0; i--)
        if (s->blocks[i].state != 0) {
            last = i;
            break;
        }
    int n_show = s->n_blocks;
    if (n_show > cells) n_show = last + 1 > cells ? last + 1 : cells;
    const kv_snap_request *cq = find_req(s, v->chain_req);
    const kv_session *sel = v->n_sessions ? v->sessions[v->selected] : NULL;
    kv_blockmap_view bv = {iw, grid_rows, sel ? sel->tag : -1, cq ? cq->next_block : -1};
    enum { MAXCELLS = 4096 * 4 };
    static kv_bm_cell grid[MAXCELLS];
    if (cells > MAXCELLS) {
        grid_rows = MAXCELLS / iw;
        bv.height = grid_rows;
        cells = grid_rows * iw;
    }
    kv_blockmap_info info;
    kv_blockmap_render(s->blocks, n_show, &bv, grid, &info);
    char scale[48] = "";
    if (info.blocks_per_cell > 1) snprintf(scale, sizeof scale, "  1 cell = %d blocks", info.blocks_per_cell);
    else if (n_show < s->n_blocks) snprintf(scale, sizeof scale, "  +%d free not shown", s->n_blocks - n_show);
    textf(w, 1, 1, iw, A_NORMAL, "used %d  shared %d  cached %d  free %d  owners %d%s", s->blocks_used,
          s->blocks_shared, s->blocks_cached, s->blocks_free, info.n_owners, scale);
    for (int r = 0; r < grid_rows; r++) {
        for (int c = 0; c < iw; c++) {
            const kv_bm_cell *g = &grid[r * iw + c];
            if (g->kind == KV_BM_NONE) continue;
            attr_t a = A_NORMAL;
            if (g->kind == KV_BM_USED || g->kind == KV_BM_SHARED) {
                a = kv_panel_session_attr(v, g->session);
                if (g->selected) a |= A_BOLD;
                if (g->kind == KV_BM_SHARED) a |= A_UNDERLINE;
            } else if (g->kind == KV_BM_CACHED) {
                a = (g->session >= 0 ? kv_panel_session_attr(v, g->session) : pair(v, KV_PAIR_CACHED, 0)) | A_DIM;
            } else {
                a = A_DIM;
            }
            if (g->next) a |= A_REVERSE;
            wattrset(w, a);
            mvwaddch(w, 2 + r, 1 + c, (chtype)(unsigned char)g->ch);
        }
    }
    wattrset(w, A_NORMAL);
    int y = 2 + grid_rows;
    if (chain_rows) {
        if (cq && cq->n_blocks > 0 && s->tables) {
            char head[64], chain[512];
            int hn = snprintf(head, sizeof head, "#%lld %c table: ", (long long)cq->id, kv_blockmap_glyph(cq->session, 0));
            kv_blockmap_chain(chain, sizeof chain, s->tables + cq->table_offset, cq->n_blocks, s->blocks, s->n_blocks,
                              cq->next_block, cq->next_offset, iw - hn);
            int x = 1 + text_at(w, y, 1, iw, kv_panel_session_attr(v, cq->session) | A_BOLD, head, -1);
            text_at(w, y, x, iw - (x - 1), A_NORMAL, chain, -1);
        } else if (sel) {
            textf(w, y, 1, iw, A_DIM, "%c %s: no blocks (its chain shows while a reply runs)", kv_blockmap_glyph(sel->tag, 0),
                  sel->name);
        }
        y++;
    }
    if (legend_rows)
        text_at(w, y, 1, iw, A_DIM, "a-z session  A-Z shared(ul)  w load  : cached  . free  rev: next token  N@s: slot",
                -1);
}

/* ---- prefix sharing ---- */

void kv_panel_prefix(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    frame(w, v, "Prefix sharing", s ? (s->prefix_sharing ? "on" : "off") : "");
    int ih, iw;
    inner(w, &ih, &iw);
    if (ih <= 0) return;
    if (!s) {
        text_at(w, 1, 1, iw, A_DIM, na_or(s, ""), -1);
        return;
    }
    char rate[16], hits[16], saved[16];
    const kv_metrics_summary *m = &s->metrics;
    kv_format_pct(rate, sizeof rate, m->prefix_hit_rate, m->input_tokens > 0);
    kv_format_count(hits, sizeof hits, s->prefix_hit_tokens);
    kv_format_count(saved, sizeof saved, m->prefix_hit_tokens);
    textf(w, 1, 1, iw, A_NORMAL, "hit %s  %s tok in %llu blk", rate, hits, (unsigned long long)s->prefix_hit_blocks);
    if (ih >= 2)
        textf(w, 2, 1, iw, A_NORMAL, "prefill saved %s tok  lookups %llu", saved, (unsigned long long)s->prefix_lookups);
    if (ih >= 3)
        textf(w, 3, 1, iw, A_NORMAL, "evictions %llu  cow copies %llu  cached %d", (unsigned long long)s->evictions,
              (unsigned long long)s->cow_copies, s->blocks_cached);
    if (ih >= 4 && v->prefix_tokens) {
        double vals[256];
        int n = kv_series_last(v->prefix_tokens, vals, iw - 10 > 0 ? (iw - 10 < 256 ? iw - 10 : 256) : 1);
        char spark[1024];
        kv_format_sparkline(spark, sizeof spark, vals, n, iw - 10, 0, 0, v->utf8);
        int x = 1 + text_at(w, 4, 1, 10, A_DIM, "hits/frm ", -1);
        text_at(w, 4, x, iw - 9, pair(v, KV_PAIR_OK, A_NORMAL), spark, -1);
    }
}

/* ---- speculative decoding ---- */

static const char *spec_name(kv_spec_method m) {
    switch (m) {
    case KV_SPEC_DRAFT_MODEL: return "draft model";
    case KV_SPEC_SELF: return "self-speculative";
    case KV_SPEC_NGRAM: return "n-gram lookup";
    default: return "off";
    }
}

void kv_panel_spec(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    frame(w, v, "Spec decoding", s ? spec_name(s->spec_method) : "");
    int ih, iw;
    inner(w, &ih, &iw);
    if (ih <= 0) return;
    if (!s) {
        text_at(w, 1, 1, iw, A_DIM, na_or(s, ""), -1);
        return;
    }
    if (s->spec_method == KV_SPEC_OFF) {
        text_at(w, 1, 1, iw, A_BOLD, "off", -1);
        if (ih >= 2) text_at(w, 2, 1, iw, A_DIM, "spec.method: ngram | self | draft_model", -1);
        return;
    }
    const kv_metrics_summary *m = &s->metrics;
    char acc[16];
    kv_format_pct(acc, sizeof acc, m->spec_acceptance_rate, m->spec_drafted > 0);
    textf(w, 1, 1, iw, A_NORMAL, "accept %s  mean len %.2f  drafts %llu", acc, m->spec_mean_accepted_len,
          (unsigned long long)m->spec_drafts);
    if (ih >= 2) {
        /* Per draft position: acceptance falls with depth. */
        char line[512];
        int n = snprintf(line, sizeof line, "pos ");
        for (int i = 0; i < 16 && n < (int)sizeof line - 16; i++) {
            if (!m->spec_pos_drafted[i]) break;
            n += snprintf(line + n, sizeof line - (size_t)n, "%d:%.0f%% ", i + 1,
                          100.0 * (double)m->spec_pos_accepted[i] / (double)m->spec_pos_drafted[i]);
        }
        text_at(w, 2, 1, iw, A_NORMAL, line, -1);
    }
    if (ih >= 3) {
        /* Per session: sum over the requests in the snapshot. */
        char line[512];
        int n = snprintf(line, sizeof line, "sess ");
        int tags[16], nt = 0;
        uint64_t dr[16] = {0}, ac[16] = {0};
        for (int i = 0; i < s->n_requests; i++) {
            const kv_snap_request *q = &s->requests[i];
            if (!q->spec_drafted) continue;
            int tag = q->session >= KV_SESSION_LOAD_BASE ? KV_SESSION_LOAD_BASE : q->session;
            int k = 0;
            while (k < nt && tags[k] != tag) k++;
            if (k == nt) {
                if (nt == 16) continue;
                tags[nt++] = tag;
            }
            dr[k] += q->spec_drafted;
            ac[k] += q->spec_accepted;
        }
        for (int k = 0; k < nt && n < (int)sizeof line - 16; k++)
            n += snprintf(line + n, sizeof line - (size_t)n, "%c:%.0f%% ", kv_blockmap_glyph(tags[k], 0),
                          100.0 * (double)ac[k] / (double)dr[k]);
        if (nt == 0) snprintf(line + n, sizeof line - (size_t)n, "(no drafts yet)");
        text_at(w, 3, 1, iw, A_NORMAL, line, -1);
    }
    if (ih >= 4) {
        char d[16], ve[16];
        kv_format_ms(d, sizeof d, m->spec_draft_ms, 1);
        kv_format_ms(ve, sizeof ve, m->spec_verify_ms, 1);
        textf(w, 4, 1, iw, A_DIM, "drafted %llu accepted %llu  draft %s verify %s", (unsigned long long)m->spec_drafted,
              (unsigned long long)m->spec_accepted, d, ve);
    }
}

/* ---- TPOT ---- */

static void spark_row(WINDOW *w, const kv_view_state *v, int y, int iw, attr_t la, const char *label,
                      const kv_series *ser, double hi) {
    char lb[16];
    snprintf(lb, sizeof lb, "%-6.6s", label);
    int x = 1 + text_at(w, y, 1, 7, la, lb, -1);
    int valid;
    double p50 = kv_series_percentile(ser, 64, 50, &valid);
    char last[16];
    kv_format_ms(last, sizeof last, p50, valid);
    int vw = 8;
    int sw = iw - (x - 1) - vw;
    if (sw < 1) sw = 1;
    double vals[512];
    int n = kv_series_last(ser, vals, sw < 512 ? sw : 512);
    char spark[2048];
    kv_format_sparkline(spark, sizeof spark, vals, n, sw, 0, hi, v->utf8);
    text_at(w, y, x, sw, la, spark, -1);
    textf(w, y, 1 + iw - vw, vw, A_NORMAL, "%7s", last);
}

void kv_panel_tpot(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[48] = "";
    if (s && s->sla_tpot_ms > 0) snprintf(extra, sizeof extra, "SLA %.0fms", s->sla_tpot_ms);
    frame(w, v, "TPOT per token", extra);
    int ih, iw;
    inner(w, &ih, &iw);
    if (ih <= 0) return;
    char p50[16], p99[16], ttft[16];
    int valid;
    double a50 = kv_series_percentile(v->itl_all, 0, 50, &valid);
    kv_format_ms(p50, sizeof p50, a50, valid);
    double a99 = kv_series_percentile(v->itl_all, 0, 99, &valid);
    kv_format_ms(p99, sizeof p99, a99, valid);
    /* TTFT of the newest request that has one. */
    const kv_snap_request *latest = NULL;
    for (int i = 0; s && i < s->n_requests; i++)
        if (s->requests[i].ttft_ms >= 0 && (!latest || s->requests[i].id > latest->id)) latest = &s->requests[i];
    kv_format_ms(ttft, sizeof ttft, latest ? latest->ttft_ms : 0, latest != NULL);
    textf(w, 1, 1, iw, A_NORMAL, "P50 %s  P99 %s  TTFT %s%s", p50, p99, ttft,
          latest ? (latest->session >= KV_SESSION_LOAD_BASE ? " (load)" : "") : "");
    /* A common scale so rows compare: the overall P99 (spikes clip). */
    double hi = valid && a99 > 0 ? a99 : 0;
    int y = 2;
    if (y <= ih && v->itl_all) spark_row(w, v, y++, iw, A_BOLD, "all", v->itl_all, hi);
    for (int i = 0; i < v->n_sessions && y <= ih; i++) {
        const kv_session *ss = v->sessions[i];
        if (!ss->itl.n && i != v->selected) continue;
        char lb[40];
        snprintf(lb, sizeof lb, "%c %.14s", kv_blockmap_glyph(ss->tag, 0), ss->name);
        spark_row(w, v, y++, iw, kv_panel_session_attr(v, ss->tag) | (i == v->selected ? A_BOLD : 0), lb, &ss->itl, hi);
    }
    if (y <= ih && v->itl_load && v->itl_load->n)
        spark_row(w, v, y++, iw, kv_panel_session_attr(v, KV_SESSION_LOAD_BASE), "w load", v->itl_load, hi);
    if (y <= ih && s) {
        char m50[16], m99[16];
        kv_format_ms(m50, sizeof m50, s->metrics.tpot_ms.p50, s->metrics.tpot_ms.valid);
        kv_format_ms(m99, sizeof m99, s->metrics.tpot_ms.p99, s->metrics.tpot_ms.valid);
        textf(w, y, 1, iw, A_DIM, "finished reqs: TPOT P50 %s P99 %s (n=%llu)", m50, m99,
              (unsigned long long)s->metrics.tpot_ms.n);
    }
}

/* ---- memory ---- */

void kv_panel_mem(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[64] = "";
    if (s && s->mem.backend.valid) {
        char u[16], t[16];
        kv_format_bytes(u, sizeof u, s->mem.backend.used_bytes);
        kv_format_bytes(t, sizeof t, s->mem.backend.total_bytes);
        snprintf(extra, sizeof extra, "%s %s/%s", strcmp(s->backend, "cpu") ? "GPU" : "host", u, t);
    } else if (s) {
        snprintf(extra, sizeof extra, "%s", s->backend);
    }
    if (s && s->mem.budget) {
        char b[16];
        kv_format_bytes(b, sizeof b, s->mem.budget);
        size_t l = strlen(extra);
        snprintf(extra + l, sizeof extra - l, "%sbudget %s", l ? ", " : "", b);
    }
    frame(w, v, "Mem", extra);
    int ih, iw;
    inner(w, &ih, &iw);
    if (ih <= 0) return;
    if (!s) {
        text_at(w, 1, 1, iw, A_DIM, na_or(s, ""), -1);
        return;
    }
    const kv_mem_breakdown *m = &s->mem;
    struct {
        const char *name;
        uint64_t bytes;
        int color;
    } rows[] = {
        {"weights", m->weights, KV_PAIR_TITLE},  {"kv used", m->kv_used, 2},
        {"kv cached", m->kv_cached, KV_PAIR_CACHED}, {"kv free", m->kv_free, 0},
        {"activ.", m->activations, KV_PAIR_PREFILL}, {"other", m->other, 0},
        {"swap", m->kv_swap_used, KV_PAIR_SPEC},
    };
    int nrows = m->kv_swap_total ? 7 : 6;
    uint64_t total = 0;
    for (int i = 0; i < 6; i++) total += rows[i].bytes;
    if (ih < 6) {
        /* Compact: the KV pool as one stacked bar (used / cached / free). */
        char val[16], u[16], c[16], f[16], bar[512];
        kv_format_bytes(val, sizeof val, m->weights);
        int bw = iw - 20;
        kv_format_bar(bar, sizeof bar, bw > 0 ? bw : 0, total ? (double)m->weights / (double)total : 0, v->utf8);
        textf(w, 1, 1, 10, A_NORMAL, "%-9s", "weights");
        if (bw > 0) text_at(w, 1, 11, bw, pair(v, KV_PAIR_TITLE, A_BOLD), bar, -1);
        textf(w, 1, 11 + (bw > 0 ? bw : 0), 10, A_NORMAL, "%10s", val);
        if (ih >= 2) {
            uint64_t kv = m->kv_used + m->kv_cached + m->kv_free;
            double parts[2] = {kv ? (double)m->kv_used / (double)kv : 0, kv ? (double)m->kv_cached / (double)kv : 0};
            kv_format_bytes(u, sizeof u, m->kv_used);
            kv_format_bytes(c, sizeof c, m->kv_cached);
            kv_format_bytes(f, sizeof f, m->kv_free);
            int lw = textf(w, 2, 1, iw, A_NORMAL, "kv u %s c %s f %s ", u, c, f);
            if (iw - lw > 2) {
                kv_format_stacked_bar(bar, sizeof bar, iw - lw, parts, "UC", 2, '.');
                text_at(w, 2, 1 + lw, iw - lw, pair(v, 2, A_BOLD), bar, -1);
            }
        }
        if (ih >= 3) {
            kv_format_bytes(u, sizeof u, m->activations);
            kv_format_bytes(c, sizeof c, m->other);
            textf(w, 3, 1, iw, A_NORMAL, "activations %s  other %s", u, c);
        }
        return;
    }
    for (int i = 0; i < nrows && i < ih; i++) {
        char val[16];
        kv_format_bytes(val, sizeof val, rows[i].bytes);
        int lw = 10, vw = 10;
        int bw = iw - lw - vw;
        double denom = i == 6 ? (double)m->kv_swap_total : (double)total;
        double frac = denom > 0 ? (double)rows[i].bytes / denom : 0;
        char bar[512];
        kv_format_bar(bar, sizeof bar, bw > 0 ? bw : 0, frac, v->utf8);
        textf(w, 1 + i, 1, lw, A_NORMAL, "%-9s", rows[i].name);
        if (bw > 0) text_at(w, 1 + i, 1 + lw, bw, rows[i].color ? pair(v, rows[i].color, A_BOLD) : A_DIM, bar, -1);
        textf(w, 1 + i, 1 + lw + (bw > 0 ? bw : 0), vw, A_NORMAL, "%10s", val);
    }
}

/* ---- scheduler ---- */

static const char *state_name(kv_req_state st) {
    switch (st) {
    case KV_REQ_WAITING: return "wait";
    case KV_REQ_RUNNING: return "run";
    case KV_REQ_PREEMPTED: return "preempted";
    case KV_REQ_SWAPPED: return "swapped";
    default: return "done";
    }
}

void kv_panel_sched(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[96] = "";
    if (s) {
        const char *mode = s->policy == KV_POLICY_STATIC ? "static batching" : "continuous";
        if (v->paused) snprintf(extra, sizeof extra, "%s  PAUSED", mode);
        else if (v->step_delay_ms) snprintf(extra, sizeof extra, "%s  slow %dms/step", mode, v->step_delay_ms);
        else snprintf(extra, sizeof extra, "%s", mode);
    }
    frame(w, v, "Sched", extra);
    int ih, iw;
    inner(w, &ih, &iw);
    if (ih <= 0) return;
    if (!s) {
        text_at(w, 1, 1, iw, A_DIM, v->phase == KV_PHASE_LOADING ? v->load_msg : na_or(s, ""), -1);
        return;
    }
    const kv_metrics_summary *m = &s->metrics;
    const kv_step_record *last = s->n_steps ? &s->steps[s->n_steps - 1] : NULL;
    char dur[16];
    kv_format_ms(dur, sizeof dur, last ? last->dur_ms : 0, last != NULL);
    textf(w, 1, 1, iw, A_NORMAL, "running %d  waiting %d  swapped %d  step %llu (%s)", s->n_running, s->n_waiting,
          s->n_swapped, (unsigned long long)s->step, dur);
    int y = 2;
    if (y <= ih) {
        char out[24], in[24], good[24], sla[16];
        kv_format_rate(out, sizeof out, m->output_tokens_per_s, "tok/s");
        kv_format_rate(in, sizeof in, m->input_tokens_per_s, "tok/s");
        kv_format_rate(good, sizeof good, m->goodput_requests_per_s, "req/s");
        kv_format_pct(sla, sizeof sla, m->sla_attainment, m->requests_completed > 0);
        textf(w, y++, 1, iw, A_NORMAL, "out %s  in %s  goodput %s  SLA met %s", out, in, good, sla);
    }
    /* Sim backend: what the modelled GPU would take for the same steps. */
    if (y <= ih && m->sim_device_s > 0) {
        char rate[24], sd[16];
        kv_format_rate(rate, sizeof rate, m->sim_output_tokens_per_s, "tok/s");
        kv_format_ms(sd, sizeof sd, last ? last->sim_ms : 0, last != NULL);
        textf(w, y++, 1, iw, pair(v, KV_PAIR_TITLE, A_NORMAL), "sim %s: last step %s on device, out %s",
              s->sim_device[0] ? s->sim_device : "gpu", sd, rate);
    }
    /* Queues: running requests in one line, then each waiting one with its reason. */
    if (y <= ih) {
        char line[1024];
        int n = snprintf(line, sizeof line, "run:");
        for (int i = 0; i < s->n_running && n < (int)sizeof line - 48; i++) {
            const kv_snap_request *q = find_req(s, s->running[i]);
            if (!q) continue;
            if (q->n_computed < q->n_prompt)
                n += snprintf(line + n, sizeof line - (size_t)n, " #%lld%c prefill %d/%d", (long long)q->id,
                              kv_blockmap_glyph(q->session, 0), q->n_computed, q->n_prompt);
            else
                n += snprintf(line + n, sizeof line - (size_t)n, " #%lld%c %d/%d", (long long)q->id,
                              kv_blockmap_glyph(q->session, 0), q->n_generated, q->max_tokens);
        }
        if (!s->n_running) snprintf(line + n, sizeof line - (size_t)n, " (idle)");
        text_at(w, y++, 1, iw, pair(v, KV_PAIR_DECODE, A_NORMAL), line, -1);
    }
    int steps_rows = ih - y + 1;
    int queue_rows = s->n_waiting + s->n_swapped;
    /* Waiting/preempted/swapped get up to half of what is left. */
    int qmax = steps_rows / 2;
    if (queue_rows > qmax) queue_rows = qmax;
    int shown = 0;
    for (int i = 0; i < s->n_waiting && shown < queue_rows; i++, shown++) {
        const kv_snap_request *q = find_req(s, s->waiting[i]);
        if (!q) continue;
        textf(w, y++, 1, iw, pair(v, KV_PAIR_PREFILL, A_NORMAL), "%s #%lld%c: %s", state_name(q->state),
              (long long)q->id, kv_blockmap_glyph(q->session, 0), q->wait_reason[0] ? q->wait_reason : "queued");
    }
    for (int i = 0; i < s->n_swapped && shown < queue_rows; i++, shown++) {
        const kv_snap_request *q = find_req(s, s->swapped[i]);
        if (!q) continue;
        textf(w, y++, 1, iw, pair(v, KV_PAIR_SPEC, A_NORMAL), "swapped #%lld%c: %s", (long long)q->id,
              kv_blockmap_glyph(q->session, 0), q->wait_reason[0] ? q->wait_reason : "in the host pool");
    }
    if (shown < s->n_waiting + s->n_swapped && y <= ih && queue_rows > 0)
        textf(w, y - 1, 1, iw, A_DIM, "... %d more waiting", s->n_waiting + s->n_swapped - shown + 1);
    /* The last steps, newest at the bottom: P prefill, d decode, s spec. */
    int rows = ih - y + 1;
    if (rows <= 0 || !s->n_steps) return;
    int first = s->n_steps - rows;
    if (first < 0) first = 0;
    int maxtok = v->config_max_batched > 0 ? v->config_max_batched : 1;
    int mx = 1;
    for (int i = first; i < s->n_steps; i++) {
        const kv_step_record *r = &s->steps[i];
        int t = r->n_prefill_tokens + r->n_decode_tokens + r->n_spec_tokens;
        if (t > mx) mx = t;
    }
    /* Scale to the batch budget unless every step is far below it. */
    if (mx * 4 < maxtok) maxtok = mx;
    for (int i = first; i < s->n_steps; i++, y++) {
        const kv_step_record *r = &s->steps[i];
        char head[48];
        int hn = snprintf(head, sizeof head, "%6llu %2dseq ", (unsigned long long)(r->step % 1000000), r->n_seqs);
        char tail[48];
        char d[16];
        /* sim backend: the modelled device's time of the step, not the host's */
        kv_format_ms(d, sizeof d, r->sim_ms > 0 ? r->sim_ms : r->dur_ms, 1);
        int tn = snprintf(tail, sizeof tail, " %dp %dd%s%.0d %s%s", r->n_prefill_tokens, r->n_decode_tokens,
                          r->n_spec_tokens ? " s" : "", r->n_spec_tokens, r->sim_ms > 0 ? "sim " : "", d);
        int bw = iw - hn - tn;
        text_at(w, y, 1, iw, A_DIM, head, -1);
        if (bw > 0) {
            double parts[3] = {(double)r->n_prefill_tokens / maxtok, (double)r->n_decode_tokens / maxtok,
                               (double)r->n_spec_tokens / maxtok};
            char bar[512];
            kv_format_stacked_bar(bar, sizeof bar, bw, parts, "Pds", 3, ' ');
            /* Color each run of the bar by its kind. */
            for (int c = 0; c < bw && bar[c]; c++) {
                attr_t a = bar[c] == 'P' ? pair(v, KV_PAIR_PREFILL, A_BOLD)
                           : bar[c] == 'd' ? pair(v, KV_PAIR_DECODE, A_NORMAL)
                           : bar[c] == 's' ? pair(v, KV_PAIR_SPEC, A_UNDERLINE)
                                           : A_NORMAL;
                if (v->color && bar[c] != ' ') a |= A_REVERSE;
                wattrset(w, a);
                mvwaddch(w, y, 1 + hn + c, (chtype)(unsigned char)bar[c]);
            }
            wattrset(w, A_NORMAL);
        }
        text_at(w, y, 1 + hn + (bw > 0 ? bw : 0), tn, A_NORMAL, tail, -1);
    }
}

/* ---- step log ---- */

static attr_t decision_attr(const kv_view_state *v, kv_decision_kind k) {
    switch (k) {
    case KV_DEC_ADMIT:
    case KV_DEC_FINISH: return pair(v, KV_PAIR_DECODE, A_NORMAL);
    case KV_DEC_CHUNK:
    case KV_DEC_SHARE: return pair(v, KV_PAIR_TITLE, A_NORMAL);
    case KV_DEC_PREEMPT:
    case KV_DEC_SWAP_OUT:
    case KV_DEC_EVICT:
    case KV_DEC_REJECT: return pair(v, KV_PAIR_ERROR, A_BOLD);
    case KV_DEC_SPEC: return pair(v, KV_PAIR_SPEC, A_NORMAL);
    default: return A_NORMAL;
    }
}

void kv_panel_log(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    (void)s;
    char extra[48] = "";
    if (v->log_scroll > 0) snprintf(extra, sizeof extra, "-%d rows", v->log_scroll);
    else snprintf(extra, sizeof extra, "%d decisions", v->log_n);
    frame(w, v, "Step log", extra);
    int ih, iw;
    inner(w, &ih, &iw);
    if (ih <= 0) return;
    if (!v->log || v->log_n == 0) {
        text_at(w, 1, 1, iw, A_DIM, "scheduler decisions appear here (admit, chunk, preempt, swap, evict, share)", -1);
        return;
    }
    int scroll = v->log_scroll;
    if (scroll > v->log_n - ih) scroll = v->log_n - ih > 0 ? v->log_n - ih : 0;
    int newest = v->log_n - 1 - scroll;
    int oldest = newest - ih + 1;
    if (oldest < 0) oldest = 0;
    for (int i = oldest, y = 1; i <= newest; i++, y++) {
        int idx = (v->log_head - v->log_n + i + 2 * KV_LOG_CAP) % KV_LOG_CAP;
        const kv_decision *d = &v->log[idx];
        char head[24];
        int hn = snprintf(head, sizeof head, "%6llu ", (unsigned long long)(d->step % 1000000));
        text_at(w, y, 1, iw, A_DIM, head, hn);
        text_at(w, y, 1 + hn, iw - hn, decision_attr(v, d->kind), d->text, -1);
    }
}

/* ---- overlays ---- */

void kv_panel_help(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    (void)s;
    frame(w, v, "Help", "any key closes");
    int ih, iw;
    inner(w, &ih, &iw);
    const kv_key_help *k = kv_keys_help();
    const kv_key_help *c = kv_commands_help();
    int y = 1;
    text_at(w, y++, 1, iw, A_BOLD, "Keys: typing goes to the input line; Tab gives single keys to the panels", -1);
    for (int i = 0; k[i].keys && y <= ih; i++, y++) {
        textf(w, y, 2, 22, pair(v, KV_PAIR_TITLE, A_BOLD), "%s", k[i].keys);
        text_at(w, y, 24, iw - 23, A_NORMAL, k[i].what, -1);
    }
    if (y + 1 <= ih) text_at(w, ++y, 1, iw, A_BOLD, "Commands (type them in the input line)", -1);
    y++;
    for (int i = 0; c[i].keys && y <= ih; i++, y++) {
        textf(w, y, 2, 22, pair(v, KV_PAIR_TITLE, A_BOLD), "%s", c[i].keys);
        text_at(w, y, 24, iw - 23, A_NORMAL, c[i].what, -1);
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
    text_at(w, y, w1 < wd ? (wd - w1) / 2 : 0, wd, A_BOLD, l1, -1);
    if (y + 1 < h) text_at(w, y + 1, w2 < wd ? (wd - w2) / 2 : 0, wd, A_NORMAL, l2, -1);
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
