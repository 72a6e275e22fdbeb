/* compare_view.h - the pure half of the side-by-side screen (`kvtop PROFILE
 * --compare key=v1,v2`, `kvtop tour`): where each engine's column and its
 * panels go for a terminal size, and the header's cells (each engine's
 * figure with its ratio to the first engine, as `kvtop bench --compare`
 * prints them). No curses: tests/tui/test_compare.c checks both. */
#ifndef KV_TUI_COMPARE_VIEW_H
#define KV_TUI_COMPARE_VIEW_H

#include <stddef.h>

#include "../engine/compare.h"
#include "layout.h"

/* Engines side by side at most (a value list longer than this is refused). */
#define KV_CMP_MAX 4
/* Narrowest column the panels are drawn in. */
#define KV_CMP_MIN_COL 40

typedef struct kv_cmp_layout {
    int cols, rows, n;        /* what it was computed for */
    int too_small;            /* bool: below n x KV_CMP_MIN_COL columns or 24 rows: only a message */
    kv_rect title;            /* row 0: the key, the values, the cores */
    kv_rect head;             /* the ratio table: a row of names, then one row per engine */
    kv_rect caption;          /* tour: the station's caption (h 0 outside a tour) */
    kv_rect label[KV_CMP_MAX];  /* one row over each column: its value, cores, load state */
    kv_rect blocks[KV_CMP_MAX]; /* KV block map */
    kv_rect sched[KV_CMP_MAX];
    kv_rect tpot[KV_CMP_MAX];   /* TPOT and Mem side by side (both h 0 when short) */
    kv_rect mem[KV_CMP_MAX];
    kv_rect chat[KV_CMP_MAX];   /* the column's transcript (border included) */
    kv_rect input;              /* one row: the prompt goes to every engine */
    kv_rect status;             /* last row */
} kv_cmp_layout;

/* Computes the layout for n engines (1..KV_CMP_MAX) on a cols x rows
 * terminal; caption: bool, a tour's caption row under the head. Columns
 * split the width evenly (the last takes the remainder); every rectangle
 * lies inside the screen and none overlaps another. Returns 0, or -1 for n
 * out of range or a size that is negative or above KV_LAYOUT_MAX_DIM (out
 * untouched). A size below the minimum returns 0 with too_small set. */
int kv_cmp_layout_compute(int cols, int rows, int n, int caption, kv_cmp_layout *out /* OUT: */);

/* Column width of one header cell, and of the row names before them. */
#define KV_CMP_CELL_W 15
#define KV_CMP_NAME_W 18

/* Header figures per line on a screen cols wide (at least 1): all eight
 * need 138 columns; narrower, the header wraps into groups of lines, each a
 * row of names and a row per engine (80 columns: two groups of four). */
int kv_cmp_head_per_line(int cols);
/* Rows of the header for n engines and n_figures figures at that width. */
int kv_cmp_head_rows(int cols, int n, int n_figures);

/* One header cell: engine m's figure k, and for an engine after the first
 * (first == 0) its ratio to the first engine m0 ("412.0 0.50x"); the first
 * engine's cell is its figure alone; "N/A" without a value; "-" for a
 * ratio with none (the first is 0). Returns bytes written (snprintf-like,
 * always terminated). */
int kv_cmp_cell(char *buf, size_t cap, const kv_metrics_summary *m0, const kv_metrics_summary *m, kv_cmp_metric k,
                int first);

#endif
