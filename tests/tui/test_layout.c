/* test_layout.c - panel placement for many terminal sizes: inside the
 * screen, no overlaps, no gaps, the promised panels at 120x40 and 80x24,
 * zoom, too-small terminals and bad sizes. */
#include <string.h>

#include "../harness.h"
#include "../../tui/layout.h"

static int inside(kv_rect r, int cols, int rows) {
    return r.y >= 0 && r.x >= 0 && r.y + r.h <= rows && r.x + r.w <= cols;
}
static int overlap(kv_rect a, kv_rect b) {
    if (!kv_rect_visible(a) || !kv_rect_visible(b)) return 0;
    return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}
static int contains(kv_rect outer, kv_rect in) {
    return in.y >= outer.y && in.x >= outer.x && in.y + in.h <= outer.y + outer.h && in.x + in.w <= outer.x + outer.w;
}

/* Checks the invariants of one normal (unzoomed) layout. */
static void check_layout(int cols, int rows) {
    kv_screen_layout l;
    CHECK(kv_layout_compute(cols, rows, -1, 1, &l) == 0);
    CHECK(!l.too_small);
    CHECK(l.tabs.y == 0 && l.tabs.w == cols && l.status.y == rows - 1);
    int cells = 0;
    for (int i = 0; i < KV_PANEL_COUNT; i++) {
        kv_rect a = l.panels[i];
        if (!kv_rect_visible(a)) continue;
        CHECKF(inside(a, cols, rows), "%dx%d panel %d", cols, rows, i);
        CHECKF(a.h >= 3 && a.w >= 20, "%dx%d panel %d is %dx%d", cols, rows, i, a.w, a.h);
        CHECK(!overlap(a, l.tabs) && !overlap(a, l.status));
        for (int j = i + 1; j < KV_PANEL_COUNT; j++)
            CHECKF(!overlap(a, l.panels[j]), "%dx%d: panels %d and %d overlap", cols, rows, i, j);
        cells += a.h * a.w;
    }
    /* The panels tile everything between the tab bar and the status line. */
    CHECKF(cells == cols * (rows - 2), "%dx%d: %d cells of %d", cols, rows, cells, cols * (rows - 2));
    /* The chat panel is always there with a transcript and an input line. */
    CHECK(kv_rect_visible(l.panels[KV_PANEL_CHAT]) && kv_rect_visible(l.input) && kv_rect_visible(l.transcript));
    CHECK(contains(l.panels[KV_PANEL_CHAT], l.input) && contains(l.panels[KV_PANEL_CHAT], l.transcript));
    CHECK(!overlap(l.input, l.transcript));
    /* The KV block map is the first panel to keep. */
    CHECK(kv_rect_visible(l.panels[KV_PANEL_BLOCKS]));
    int hidden = 0;
    for (int i = 0; i < KV_PANEL_COUNT; i++) hidden += !kv_rect_visible(l.panels[i]);
    CHECK(hidden == l.n_hidden);
}

static void test_many_sizes(void) {
    for (int cols = 80; cols <= 260; cols += 7)
        for (int rows = 24; rows <= 90; rows += 5) check_layout(cols, rows);
    check_layout(80, 24);
    check_layout(120, 40);
    check_layout(4096, 4096);
}

static void test_120x40_shows_everything(void) {
    kv_screen_layout l;
    CHECK(kv_layout_compute(120, 40, -1, 1, &l) == 0);
    for (int i = 0; i < KV_PANEL_COUNT; i++) CHECKF(kv_rect_visible(l.panels[i]), "panel %d hidden", i);
    CHECK(l.n_hidden == 0);
    /* The block map gets a useful share of the height. */
    CHECK(l.panels[KV_PANEL_BLOCKS].h >= 10);
    /* TPOT and Mem side by side. */
    CHECK(l.panels[KV_PANEL_TPOT].y == l.panels[KV_PANEL_MEM].y);
}

static void test_80x24_keeps_the_main_panels(void) {
    kv_screen_layout l;
    CHECK(kv_layout_compute(80, 24, -1, 1, &l) == 0);
    CHECK(kv_rect_visible(l.panels[KV_PANEL_BLOCKS]));
    CHECK(kv_rect_visible(l.panels[KV_PANEL_TPOT]));
    CHECK(kv_rect_visible(l.panels[KV_PANEL_MEM]));
    CHECK(kv_rect_visible(l.panels[KV_PANEL_SCHED]));
    CHECK(l.n_hidden >= 1); /* something had to go: reachable by zoom */
    CHECK(l.transcript.h >= 10);
}

static void test_too_small(void) {
    kv_screen_layout l;
    CHECK(kv_layout_compute(79, 40, -1, 1, &l) == 0 && l.too_small);
    CHECK(kv_layout_compute(120, 23, -1, 1, &l) == 0 && l.too_small);
    CHECK(kv_layout_compute(0, 0, -1, 1, &l) == 0 && l.too_small);
    for (int i = 0; i < KV_PANEL_COUNT; i++) CHECK(!kv_rect_visible(l.panels[i]));
}

static void test_bad_input(void) {
    kv_screen_layout l;
    memset(&l, 0x5a, sizeof l);
    kv_screen_layout copy = l;
    CHECK(kv_layout_compute(-1, 40, -1, 1, &l) < 0);
    CHECK(kv_layout_compute(120, KV_LAYOUT_MAX_DIM + 1, -1, 1, &l) < 0);
    CHECK(kv_layout_compute(120, 40, KV_PANEL_COUNT, 1, &l) < 0);
    CHECK(kv_layout_compute(120, 40, -2, 1, &l) < 0);
    CHECK(!memcmp(&l, &copy, sizeof l)); /* untouched */
    CHECK(kv_layout_compute(120, 40, -1, 1, NULL) < 0);
}

static void test_zoom(void) {
    for (int z = 0; z < KV_PANEL_COUNT; z++) {
        kv_screen_layout l;
        CHECK(kv_layout_compute(100, 30, z, 2, &l) == 0);
        for (int i = 0; i < KV_PANEL_COUNT; i++) CHECK(kv_rect_visible(l.panels[i]) == (i == z));
        kv_rect p = l.panels[z];
        CHECK(p.x == 0 && p.w == 100 && p.y == 1);
        CHECK(kv_rect_visible(l.input) && inside(l.input, 100, 30));
        CHECK(z == KV_PANEL_CHAT || !overlap(l.input, p));
        if (z == KV_PANEL_CHAT) CHECK(p.h == 28 && contains(p, l.input));
        else CHECK(p.h + l.input.h == 28 && l.input.h == 2);
    }
}

static void test_input_lines(void) {
    kv_screen_layout a, b, c;
    kv_layout_compute(120, 40, -1, 1, &a);
    kv_layout_compute(120, 40, -1, 4, &b);
    kv_layout_compute(120, 40, -1, 100, &c);
    CHECK(a.input.h == 1 && b.input.h == 4 && c.input.h == 6);
    CHECK(b.transcript.h == a.transcript.h - 3);
    /* At the smallest size the input never eats the transcript. */
    kv_layout_compute(80, 24, -1, 100, &a);
    CHECK(a.input.h <= a.transcript.h);
}

TEST_MAIN(T(test_many_sizes), T(test_120x40_shows_everything), T(test_80x24_keeps_the_main_panels),
          T(test_too_small), T(test_bad_input), T(test_zoom), T(test_input_lines))
