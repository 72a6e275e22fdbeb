/* test_blockfill.c - the block map's fill marks (level of a block and of a
 * cell that merges several, the marks in UTF-8 and ASCII), the slot counts
 * behind the utilisation gauge, and the gauge line at various widths. */
#include <string.h>

#include "../harness.h"
#include "../../tui/blockfill.h"

static kv_snap_block blk(int state, int fill) {
    kv_snap_block b;
    memset(&b, 0, sizeof b);
    b.state = (uint8_t)state;
    b.refcount = state == 1;
    b.fill = (uint16_t)fill;
    b.session = state ? 1000 : -1;
    return b;
}

static void test_levels(void) {
    /* blank for nothing, full only when full, thirds between */
    CHECK(kv_blockfill_level(0, 16) == 0);
    CHECK(kv_blockfill_level(1, 16) == 1 && kv_blockfill_level(5, 16) == 1);
    CHECK(kv_blockfill_level(6, 16) == 2 && kv_blockfill_level(10, 16) == 2);
    CHECK(kv_blockfill_level(11, 16) == 3 && kv_blockfill_level(15, 16) == 3);
    CHECK(kv_blockfill_level(16, 16) == 4 && kv_blockfill_level(99, 16) == 4);
    CHECK(kv_blockfill_level(-3, 16) == 0 && kv_blockfill_level(5, 0) == 0 && kv_blockfill_level(5, -1) == 0);
    /* every level is reachable and they only grow with the fill */
    int prev = 0, seen[KV_BLOCKFILL_LEVELS] = {0};
    for (int f = 0; f <= 16; f++) {
        int l = kv_blockfill_level(f, 16);
        CHECK(l >= prev);
        prev = l;
        seen[l] = 1;
    }
    for (int l = 0; l < KV_BLOCKFILL_LEVELS; l++) CHECKF(seen[l], "level %d never drawn", l);
}

static void test_marks(void) {
    CHECK(!strcmp(kv_blockfill_mark(0, 1), " ") && !strcmp(kv_blockfill_mark(0, 0), " "));
    CHECK(!strcmp(kv_blockfill_mark(1, 1), "\u2581") && !strcmp(kv_blockfill_mark(4, 1), "\u2588"));
    const char *ascii = " _-=#";
    for (int l = 0; l < KV_BLOCKFILL_LEVELS; l++) {
        const char *m = kv_blockfill_mark(l, 0);
        CHECKF(strlen(m) == 1 && m[0] == ascii[l], "ascii level %d is '%s'", l, m);
        /* the ASCII marks never look like free '.' or cached ':' */
        CHECK(m[0] != '.' && m[0] != ':');
    }
    CHECK(!strcmp(kv_blockfill_mark(-1, 0), " ") && !strcmp(kv_blockfill_mark(9, 0), "#"));
}

static void test_count(void) {
    /* a contiguous-like reservation: one block written, three reserved empty */
    kv_snap_block b[6] = {blk(1, 16), blk(1, 3), blk(1, 0), blk(1, 0), blk(2, 16), blk(0, 0)};
    uint64_t held = 1, reserved = 1;
    kv_blockfill_count(b, 6, 16, &held, &reserved);
    CHECK(held == 19 && reserved == 64); /* cached and free count in neither */
    kv_blockfill_count(b, 0, 16, &held, &reserved);
    CHECK(held == 0 && reserved == 0);
    kv_blockfill_count(NULL, 6, 16, &held, &reserved);
    CHECK(held == 0 && reserved == 0);
    b[0].fill = 40; /* a fill beyond the block is clamped */
    kv_blockfill_count(b, 1, 16, &held, &reserved);
    CHECK(held == 16 && reserved == 16);
}

static void test_cells(void) {
    kv_snap_block b[8] = {blk(1, 16), blk(1, 16), blk(1, 8), blk(1, 0), blk(2, 16), blk(0, 0), blk(1, 2), blk(0, 0)};
    uint8_t lv[8];
    memset(lv, 9, sizeof lv);
    CHECK(kv_blockfill_cells(b, 8, 1, 16, lv, 8) == 0);
    uint8_t want1[8] = {4, 4, 2, 0, 0, 0, 1, 0};
    CHECK(!memcmp(lv, want1, 8));
    /* two blocks a cell: summed fill over the blocks in use */
    memset(lv, 9, sizeof lv);
    CHECK(kv_blockfill_cells(b, 8, 2, 16, lv, 5) == 0);
    CHECK(lv[0] == 4);            /* 32/32 */
    CHECK(lv[1] == 1);            /* 8/32 */
    CHECK(lv[2] == 0);            /* cached + free: nothing in use */
    CHECK(lv[3] == 1);            /* 2/16: the free block does not count */
    CHECK(lv[4] == 0);            /* past the pool */
    CHECK(lv[5] == 9);            /* untouched past cells */
    CHECK(kv_blockfill_cells(b, 8, 0, 16, lv, 8) == -1 && kv_blockfill_cells(b, 8, 1, 0, lv, 8) == -1);
    CHECK(kv_blockfill_cells(b, 8, 1, 16, NULL, 8) == -1 && kv_blockfill_cells(b, 8, 1, 16, lv, -1) == -1);
}

static void test_gauge(void) {
    char g[512];
    int w = kv_blockfill_gauge(g, sizeof g, 412, 1776, 120, 0);
    CHECKF(strstr(g, "fill [") == g && strstr(g, "] 23% of reserved slots hold tokens (412/1776)"), "[%s]", g);
    CHECK(w <= 120 && w == (int)strlen(g));
    /* the bar: 23% of its cells on, the rest off */
    int on = 0, off = 0;
    for (const char *p = g + 6; *p != ']'; p++) on += *p == '#', off += *p == '.';
    CHECKF(on + off == 40 && on == 9, "on %d off %d", on, off);
    /* UTF-8 cells, same columns */
    int wu = kv_blockfill_gauge(g, sizeof g, 412, 1776, 120, 1);
    CHECK(wu == w && strstr(g, "\u2588") && strstr(g, "\u2591"));
    /* narrow: no bar, the short words, cut to the width */
    w = kv_blockfill_gauge(g, sizeof g, 412, 1776, 30, 0);
    CHECKF(!strcmp(g, "fill 23% (412/1776 slots)") && w == 25, "[%s]", g);
    w = kv_blockfill_gauge(g, sizeof g, 412, 1776, 10, 0);
    CHECK(w == 10 && strlen(g) == 10);
    kv_blockfill_gauge(g, sizeof g, 0, 0, 80, 1);
    CHECK(!strcmp(g, "fill: no slots reserved"));
    kv_blockfill_gauge(g, sizeof g, 50, 50, 80, 0);
    CHECK(strstr(g, " 100% of reserved") != NULL);
    CHECK(kv_blockfill_gauge(g, sizeof g, 1, 2, 0, 0) == 0 && g[0] == 0);
    /* a small buffer stays terminated */
    char s[8];
    kv_blockfill_gauge(s, sizeof s, 412, 1776, 120, 1);
    CHECK(strlen(s) < sizeof s);
}

TEST_MAIN(T(test_levels), T(test_marks), T(test_count), T(test_cells), T(test_gauge))
