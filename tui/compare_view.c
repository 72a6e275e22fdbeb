/* compare_view.c - layout and header cells of the side-by-side screen (see
 * compare_view.h). Pure: no curses. */
#include "compare_view.h"

#include <stdio.h>
#include <string.h>

static kv_rect rect(int y, int x, int h, int w) {
    kv_rect r = {y, x, h > 0 ? h : 0, w > 0 ? w : 0};
    if (r.h == 0 || r.w == 0) r.h = r.w = 0;
    return r;
}

int kv_cmp_head_per_line(int cols) {
    int per = (cols - KV_CMP_NAME_W) / KV_CMP_CELL_W;
    return per > 1 ? per : 1;
}

int kv_cmp_head_rows(int cols, int n, int n_figures) {
    int per = kv_cmp_head_per_line(cols);
    int groups = n_figures > 0 ? (n_figures + per - 1) / per : 1;
    return groups * (1 + n);
}

int kv_cmp_layout_compute(int cols, int rows, int n, int caption, kv_cmp_layout *out) {
    if (!out || n < 1 || n > KV_CMP_MAX || !kv_layout_size_ok(cols, rows)) return -1;
    kv_cmp_layout l = {.cols = cols, .rows = rows, .n = n};
    if (cols < n * KV_CMP_MIN_COL || cols < KV_LAYOUT_MIN_COLS || rows < KV_LAYOUT_MIN_ROWS) {
        l.too_small = 1;
        *out = l;
        return 0;
    }
    int y = 0;
    l.title = rect(y++, 0, 1, cols);
    /* a header wrapped to the width, unless that leaves the columns less
     * than their least (label, map 6, scheduler 3, transcript 4): then one
     * group, cut at the width */
    int head = kv_cmp_head_rows(cols, n, KV_CMP_HEADER_COUNT);
    if (rows - 2 - y - head - (caption ? 1 : 0) - 1 < 6 + 3 + 4) head = 1 + n;
    l.head = rect(y, 0, head, cols);
    y += head;
    if (caption) l.caption = rect(y++, 0, 1, cols);
    l.status = rect(rows - 1, 0, 1, cols);
    l.input = rect(rows - 2, 0, 1, cols);
    /* The columns take what is left: label, block map (the biggest),
     * scheduler, TPOT beside Mem when there is room, the transcript. */
    int avail = rows - 2 - y - 1; /* minus the label row */
    int chat = avail / 5 > 4 ? avail / 5 : 4;
    int sched = avail / 4 > 4 ? avail / 4 : 4;
    int tm = avail >= 30 ? 8 : 0;
    int blocks = avail - chat - sched - tm;
    if (blocks < 6) {
        /* Short: the scheduler gives way first, to no less than 3 rows. */
        int need = 6 - blocks;
        int give = sched - 3 < need ? sched - 3 : need;
        sched -= give;
        blocks += give;
    }
    int colw = cols / n;
    for (int j = 0; j < n; j++) {
        int x = j * colw, w = j == n - 1 ? cols - x : colw;
        int cy = y;
        l.label[j] = rect(cy++, x, 1, w);
        l.blocks[j] = rect(cy, x, blocks, w);
        cy += blocks;
        l.sched[j] = rect(cy, x, sched, w);
        cy += sched;
        if (tm) {
            l.tpot[j] = rect(cy, x, tm, w / 2);
            l.mem[j] = rect(cy, x + w / 2, tm, w - w / 2);
            cy += tm;
        }
        l.chat[j] = rect(cy, x, rows - 2 - cy, w);
    }
    *out = l;
    return 0;
}

int kv_cmp_cell(char *buf, size_t cap, const kv_metrics_summary *m0, const kv_metrics_summary *m, kv_cmp_metric k,
                int first) {
    if (!buf || cap == 0) return 0;
    double v, r;
    if (!kv_compare_metric(m, k, &v)) return snprintf(buf, cap, "N/A");
    int d = kv_compare_metric_decimals(k);
    if (first) return snprintf(buf, cap, "%.*f", d, v);
    if (!kv_compare_ratio(m0, m, k, &r)) return snprintf(buf, cap, "%.*f -", d, v);
    return snprintf(buf, cap, "%.*f %.2fx", d, v, r);
}
