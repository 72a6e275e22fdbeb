/* layout.h - where each TUI panel goes for a terminal size: a pure function
 * from (columns, rows, zoomed panel, input height) to rectangles, so the
 * arrangement is unit-tested without a terminal (tests/tui/test_layout.c).
 *
 * Screen: row 0 is the tab bar, the last row the status line. Between them
 * the chat column (transcript + input, step log under it when tall enough)
 * sits left and the live panels right, paired side by side when the right
 * side is wide enough and dropped in reverse priority when it is short. */
#ifndef KV_TUI_LAYOUT_H
#define KV_TUI_LAYOUT_H

/* Smallest terminal the app draws in; below it shows a message. */
#define KV_LAYOUT_MIN_COLS 80
#define KV_LAYOUT_MIN_ROWS 24
/* Largest size accepted (anything beyond is treated as bad input). */
#define KV_LAYOUT_MAX_DIM 4096

typedef enum kv_panel_id {
    KV_PANEL_CHAT = 0, /* transcript + input of the selected session */
    KV_PANEL_BLOCKS,   /* KV block map */
    KV_PANEL_PREFIX,   /* prefix sharing */
    KV_PANEL_SPEC,     /* speculative decoding */
    KV_PANEL_TPOT,     /* time per output token */
    KV_PANEL_MEM,      /* memory breakdown */
    KV_PANEL_SCHED,    /* scheduler queues and batches */
    KV_PANEL_LOG,      /* step log of scheduler decisions */
    KV_PANEL_COUNT
} kv_panel_id;

/* A rectangle in screen cells; h == 0 or w == 0 means not shown. */
typedef struct kv_rect {
    int y, x; /* top-left cell */
    int h, w; /* rows, columns */
} kv_rect;

typedef struct kv_screen_layout {
    int cols, rows;                  /* the terminal size it was computed for */
    int too_small;                   /* bool: below the minimum, draw only a message */
    int zoom;                        /* panel shown full screen, -1 for none */
    kv_rect tabs;                    /* tab bar (row 0) */
    kv_rect status;                  /* status line (last row) */
    kv_rect panels[KV_PANEL_COUNT];  /* outer rectangles, borders included */
    kv_rect transcript;              /* inside the chat panel's border, above the input */
    kv_rect input;                   /* input lines (always shown, even when another panel is zoomed) */
    int n_hidden;                    /* panels with no room at this size */
} kv_screen_layout;

/* 1 when a cols x rows terminal lies in [0, KV_LAYOUT_MAX_DIM] both ways. */
static inline int kv_layout_size_ok(int cols, int rows) {
    return cols >= 0 && rows >= 0 && cols <= KV_LAYOUT_MAX_DIM && rows <= KV_LAYOUT_MAX_DIM;
}

/* Computes the layout. zoom: a kv_panel_id or -1; input_lines: rows the
 * input wants (clamped to [1, 6] and to a third of the chat area). Returns
 * 0; KV_ERR_INVAL-style -1 for sizes that are negative or above
 * KV_LAYOUT_MAX_DIM or a zoom outside [-1, KV_PANEL_COUNT) (out untouched).
 * Sizes below the minimum return 0 with too_small set and only tabs/status. */
int kv_layout_compute(int cols, int rows, int zoom, int input_lines, kv_screen_layout *out);

/* Panel title as drawn in its top border ("KV blocks", "Prefix sharing",
 * "Spec decoding", "TPOT", "Mem", "Sched", "Step log", "Chat"). */
const char *kv_layout_title(kv_panel_id id);

/* 1 when the rectangle is shown (non-empty). */
static inline int kv_rect_visible(kv_rect r) { return r.h > 0 && r.w > 0; }

#endif
