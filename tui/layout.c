/* layout.c - panel rectangles from the terminal size (see layout.h). The
 * rules are deliberately few: a left chat column, a right column of panel
 * rows, each row given its minimum height in priority order and the spare
 * rows shared out, so every size from 80x24 up gets a sensible screen. */
#include "layout.h"

#include <string.h>

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* One row of the right column: one panel, or two side by side. */
typedef struct unit {
    int panel[2];
    int n;        /* panels in the row */
    int min;      /* rows below which the row is dropped */
    int desired;  /* rows it gets before spare rows go to growers */
    int grow;     /* bool: takes spare rows beyond desired */
    int prio;     /* 0 = most important */
    int h;        /* OUT: rows given, 0 when dropped */
} unit;

/* Places the chat panel's inner transcript and input rectangles. */
static void place_chat(kv_screen_layout *o, kv_rect chat, int input_lines) {
    int ih_room = chat.h - 2; /* inside the border */
    int iw = chat.w - 2;
    if (ih_room < 3 || iw < 1) {
        o->transcript = (kv_rect){0, 0, 0, 0};
        o->input = (kv_rect){chat.y + 1, chat.x + 1, ih_room > 0 ? 1 : 0, iw > 0 ? iw : 0};
        return;
    }
    int ih = clampi(input_lines, 1, 6);
    int cap = ih_room / 3;
    if (cap < 1) cap = 1;
    if (ih > cap) ih = cap;
    /* One separator row between transcript and input. */
    o->input = (kv_rect){chat.y + 1 + ih_room - ih, chat.x + 1, ih, iw};
    o->transcript = (kv_rect){chat.y + 1, chat.x + 1, ih_room - ih - 1, iw};
}

int kv_layout_compute(int cols, int rows, int zoom, int input_lines, kv_screen_layout *out) {
    if (!out || !kv_layout_size_ok(cols, rows) || zoom < -1 || zoom >= KV_PANEL_COUNT) return -1;
    kv_screen_layout o = {.cols = cols, .rows = rows, .zoom = zoom};
    if (cols < KV_LAYOUT_MIN_COLS || rows < KV_LAYOUT_MIN_ROWS) {
        o.too_small = 1;
        o.n_hidden = KV_PANEL_COUNT;
        *out = o;
        return 0;
    }
    o.tabs = (kv_rect){0, 0, 1, cols};
    o.status = (kv_rect){rows - 1, 0, 1, cols};
    int top = 1, H = rows - 2;

    if (zoom >= 0) {
        if (zoom == KV_PANEL_CHAT) {
            o.panels[KV_PANEL_CHAT] = (kv_rect){top, 0, H, cols};
            place_chat(&o, o.panels[KV_PANEL_CHAT], input_lines);
        } else {
            /* The input stays on screen under a zoomed panel so typing and
             * slash commands keep working. */
            int ih = clampi(input_lines, 1, 6);
            if (ih > H / 3) ih = H / 3;
            o.panels[zoom] = (kv_rect){top, 0, H - ih, cols};
            o.input = (kv_rect){top + H - ih, 0, ih, cols};
        }
        o.n_hidden = KV_PANEL_COUNT - 1;
        *out = o;
        return 0;
    }

    /* Left column: chat, with the step log below when there is height. */
    int left_w = clampi(cols * 2 / 5, 34, 64);
    int chat_h = H;
    if (H >= 30) {
        int log_h = clampi(H / 3, 8, 16);
        chat_h = H - log_h;
        o.panels[KV_PANEL_LOG] = (kv_rect){top + chat_h, 0, log_h, left_w};
    }
    o.panels[KV_PANEL_CHAT] = (kv_rect){top, 0, chat_h, left_w};
    place_chat(&o, o.panels[KV_PANEL_CHAT], input_lines);

    /* Right column. */
    int rx = left_w, R = cols - left_w;
    int kv_desired = H * 30 / 100 > 8 ? H * 30 / 100 : 8;
    unit u[6];
    int nu;
    if (R >= 64) {
        unit pair[] = {
            {{KV_PANEL_BLOCKS, -1}, 1, 6, kv_desired, 1, 0, 0},
            {{KV_PANEL_PREFIX, KV_PANEL_SPEC}, 2, 5, 6, 0, 3, 0},
            {{KV_PANEL_TPOT, KV_PANEL_MEM}, 2, 6, 8, 0, 1, 0},
            {{KV_PANEL_SCHED, -1}, 1, 6, 8, 1, 2, 0},
        };
        nu = 4;
        memcpy(u, pair, sizeof pair);
    } else {
        unit single[] = {
            {{KV_PANEL_BLOCKS, -1}, 1, 6, kv_desired, 1, 0, 0},
            {{KV_PANEL_PREFIX, -1}, 1, 4, 6, 0, 4, 0},
            {{KV_PANEL_SPEC, -1}, 1, 4, 6, 0, 5, 0},
            {{KV_PANEL_TPOT, -1}, 1, 4, 6, 0, 1, 0},
            {{KV_PANEL_MEM, -1}, 1, 5, 8, 0, 2, 0},
            {{KV_PANEL_SCHED, -1}, 1, 6, 10, 1, 3, 0},
        };
        nu = 6;
        memcpy(u, single, sizeof single);
    }
    /* Minimum heights in priority order; a row that does not fit is dropped
     * and later (less important) rows may still fit. */
    int left = H;
    for (int p = 0; p < nu; p++)
        for (int i = 0; i < nu; i++)
            if (u[i].prio == p && u[i].min <= left) {
                u[i].h = u[i].min;
                left -= u[i].min;
            }
    /* Then up to the desired height, in priority order. */
    for (int p = 0; p < nu && left > 0; p++)
        for (int i = 0; i < nu; i++)
            if (u[i].prio == p && u[i].h > 0 && u[i].h < u[i].desired) {
                int add = u[i].desired - u[i].h;
                if (add > left) add = left;
                u[i].h += add;
                left -= add;
            }
    /* Spare rows to the growers, alternating so both share. */
    int ngrow = 0;
    for (int i = 0; i < nu; i++) ngrow += u[i].grow && u[i].h > 0;
    while (left > 0 && ngrow > 0)
        for (int i = 0; i < nu && left > 0; i++)
            if (u[i].grow && u[i].h > 0) {
                u[i].h++;
                left--;
            }
    /* No grower shown: give the rest to the last shown row. */
    if (left > 0)
        for (int i = nu - 1; i >= 0; i--)
            if (u[i].h > 0) {
                u[i].h += left;
                left = 0;
                break;
            }
    int y = top;
    for (int i = 0; i < nu; i++) {
        if (u[i].h == 0) {
            o.n_hidden += u[i].n;
            continue;
        }
        if (u[i].n == 1) {
            o.panels[u[i].panel[0]] = (kv_rect){y, rx, u[i].h, R};
        } else {
            int w0 = R / 2;
            o.panels[u[i].panel[0]] = (kv_rect){y, rx, u[i].h, w0};
            o.panels[u[i].panel[1]] = (kv_rect){y, rx + w0, u[i].h, R - w0};
        }
        y += u[i].h;
    }
    if (!kv_rect_visible(o.panels[KV_PANEL_LOG])) o.n_hidden++;
    *out = o;
    return 0;
}

const char *kv_layout_title(kv_panel_id id) {
    switch (id) {
    case KV_PANEL_CHAT: return "Chat";
    case KV_PANEL_BLOCKS: return "KV blocks";
    case KV_PANEL_PREFIX: return "Prefix sharing";
    case KV_PANEL_SPEC: return "Spec decoding";
    case KV_PANEL_TPOT: return "TPOT";
    case KV_PANEL_MEM: return "Mem";
    case KV_PANEL_SCHED: return "Sched";
    case KV_PANEL_LOG: return "Step log";
    default: return "?";
    }
}
