/* test_blockmap.c - block map rendering into a glyph grid (owners, shared,
 * cached, free, selection, next-token mark, aggregation of big pools) and the
 * block-table chain text. */
#include <string.h>

#include "../harness.h"
#include "../../tui/blockmap.h"

static kv_snap_block blk(int state, int refcount, int session) {
    kv_snap_block b;
    memset(&b, 0, sizeof b);
    b.state = (uint8_t)state;
    b.refcount = (uint16_t)refcount;
    b.shared = refcount >= 2;
    b.session = session;
    b.owner = session >= 0 ? 100 + session : -1;
    b.fill = 16;
    return b;
}

static void test_glyphs(void) {
    CHECK(kv_blockmap_glyph(0, 0) == 'a' && kv_blockmap_glyph(1, 1) == 'B');
    /* Tabs past 26 get glyphs of their own (26 used to wrap to 'a'), and
     * none is background load's 'w'. */
    CHECK(kv_blockmap_glyph(22, 0) == 'x' && kv_blockmap_glyph(25, 0) == '0' && kv_blockmap_glyph(26, 0) == '1');
    CHECK(kv_blockmap_glyph(34, 0) == '9' && kv_blockmap_glyph(34, 1) == '9' && kv_blockmap_glyph(24, 1) == 'Z');
    CHECK(kv_blockmap_glyph(KV_BLOCKMAP_GLYPHS, 0) == 'a'); /* the tag picker keeps open tabs apart */
    CHECK(kv_blockmap_glyph(KV_SESSION_LOAD_BASE + 3, 0) == 'w' && kv_blockmap_glyph(KV_SESSION_LOAD_BASE, 1) == 'W');
    CHECK(kv_blockmap_glyph(-1, 0) == '?');
    CHECK(kv_blockmap_color(0) == 1 && kv_blockmap_color(5) == 6 && kv_blockmap_color(6) == 1);
    CHECK(kv_blockmap_color(KV_SESSION_LOAD_BASE) == 7 && kv_blockmap_color(-1) == 0);
}

static void test_one_block_per_cell(void) {
    kv_snap_block b[6] = {blk(1, 1, 0), blk(1, 2, 0), blk(1, 1, 1), blk(2, 0, -1), blk(0, 0, -1),
                          blk(1, 1, KV_SESSION_LOAD_BASE + 2)};
    kv_bm_cell g[8];
    kv_blockmap_view v = {4, 2, 1, 2};
    kv_blockmap_info info;
    CHECK(kv_blockmap_render(b, 6, &v, g, &info) == 0);
    char s[9];
    for (int i = 0; i < 8; i++) s[i] = g[i].ch;
    s[8] = 0;
    CHECKF(!strcmp(s, "aAb:.w  "), "[%s]", s);
    CHECK(g[0].kind == KV_BM_USED && g[1].kind == KV_BM_SHARED && g[3].kind == KV_BM_CACHED && g[4].kind == KV_BM_FREE);
    CHECK(g[6].kind == KV_BM_NONE && g[7].kind == KV_BM_NONE);
    CHECK(g[2].selected && !g[0].selected && g[2].next && !g[1].next);
    CHECK(g[0].color == 1 && g[2].color == 2 && g[5].color == 7 && g[4].color == 0);
    CHECK(info.blocks_per_cell == 1 && info.cells_used == 6);
    CHECK(info.n_used == 4 && info.n_shared == 1 && info.n_cached == 1 && info.n_free == 1);
    CHECK(info.n_owners == 3);
}

static void test_aggregation(void) {
    /* 1000 blocks into 10x5 = 50 cells: 20 blocks per cell. */
    static kv_snap_block b[1000];
    for (int i = 0; i < 1000; i++) b[i] = blk(0, 0, -1);
    b[25] = blk(2, 0, -1);            /* cell 1: cached beats free */
    b[45] = blk(1, 1, 3);             /* cell 2: used */
    b[47] = blk(2, 0, -1);
    b[70] = blk(1, 1, 3);             /* cell 3: the selected session beats a shared block */
    b[71] = blk(1, 2, 4);
    b[90] = blk(1, 2, 4);             /* cell 4: shared beats plain used */
    b[91] = blk(1, 1, 5);
    b[999] = blk(1, 1, 0);            /* the last cell */
    b[130] = blk(1, 1, 4);            /* cell 6: the next-token block beats everything */
    b[131] = blk(1, 1, 3);
    kv_bm_cell g[50];
    kv_blockmap_view v = {10, 5, 3, 130};
    kv_blockmap_info info;
    CHECK(kv_blockmap_render(b, 1000, &v, g, &info) == 0);
    CHECK(info.blocks_per_cell == 20 && info.cells_used == 50);
    CHECK(g[0].ch == '.' && g[1].ch == ':' && g[2].ch == 'd' && g[3].ch == 'd' && g[3].selected);
    CHECK(g[4].ch == 'E' && g[4].kind == KV_BM_SHARED);
    CHECK(g[6].next && g[6].ch == 'e');
    CHECK(g[49].ch == 'a');
    CHECK(info.n_owners == 4);
}

static void test_bad_view(void) {
    kv_snap_block b[2] = {blk(0, 0, -1), blk(0, 0, -1)};
    kv_bm_cell g[4];
    memset(g, 0x77, sizeof g);
    kv_blockmap_view v = {0, 2, -1, -1};
    CHECK(kv_blockmap_render(b, 2, &v, g, NULL) < 0);
    CHECK(g[0].ch == 0x77);
    v.width = 2;
    CHECK(kv_blockmap_render(b, 2, &v, NULL, NULL) < 0);
    CHECK(kv_blockmap_render(b, 2, NULL, g, NULL) < 0);
    /* An empty pool is fine: every cell blank. */
    CHECK(kv_blockmap_render(NULL, 0, &v, g, NULL) == 0 && g[0].kind == KV_BM_NONE && g[3].ch == ' ');
}

static void test_chain(void) {
    kv_snap_block b[20];
    for (int i = 0; i < 20; i++) b[i] = blk(1, 1, 0);
    b[3] = blk(1, 2, 0);
    b[4] = blk(1, 3, 0);
    int32_t t[4] = {3, 4, 17, 18};
    char s[128];
    kv_blockmap_chain(s, sizeof s, t, 4, b, 20, 18, 5, 80);
    CHECKF(!strcmp(s, "3(x2) 4(x3) 17 18@5"), "[%s]", s);
    /* No next slot. */
    kv_blockmap_chain(s, sizeof s, t, 2, b, 20, -1, -1, 80);
    CHECKF(!strcmp(s, "3(x2) 4(x3)"), "[%s]", s);
    /* Long chains keep the head and the tail where the next token goes. */
    int32_t longt[12];
    for (int i = 0; i < 12; i++) longt[i] = 5 + i;
    int n = kv_blockmap_chain(s, sizeof s, longt, 12, b, 20, 16, 2, 20);
    CHECKF(n <= 20 && !strncmp(s, "5 ..", 4) && strstr(s, "16@2") && s[n - 1] == '2', "[%s]", s);
    /* Ids outside the map are printed plainly, never read. */
    int32_t odd[2] = {-1, 500};
    kv_blockmap_chain(s, sizeof s, odd, 2, b, 20, -1, -1, 80);
    CHECKF(!strcmp(s, "-1 500"), "[%s]", s);
    /* Tiny widths and buffers. */
    CHECK(kv_blockmap_chain(s, sizeof s, t, 4, b, 20, 18, 5, 3) <= 3);
    char tiny[6];
    CHECK(kv_blockmap_chain(tiny, sizeof tiny, t, 4, b, 20, 18, 5, 80) <= 5);
    CHECK(kv_blockmap_chain(s, sizeof s, NULL, 4, b, 20, 18, 5, 80) == 0 && s[0] == 0);
}

/* Every tab glyph is distinct and no other mark of the map. */
static void test_distinct_glyphs(void) {
    char seen[256] = {0};
    for (int t = 0; t < KV_BLOCKMAP_GLYPHS; t++) {
        unsigned char g = (unsigned char)kv_blockmap_glyph(t, 0), sh = (unsigned char)kv_blockmap_glyph(t, 1);
        CHECKF(!seen[g], "tag %d: glyph '%c' twice", t, g);
        seen[g] = 1;
        CHECKF(strchr("wW:.? ", g) == NULL && strchr("wW:.? ", sh) == NULL, "tag %d: '%c'/'%c'", t, g, sh);
        CHECKF(g >= 'a' && g <= 'z' ? sh == g - 'a' + 'A' : sh == g, "tag %d: shared '%c'", t, sh);
    }
}

/* Expands a legend range list such as "a-v x-z 0-9" into set[]. */
static void expand_ranges(const char *s, size_t n, char *set) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') continue;
        if (i + 2 < n && s[i + 1] == '-') {
            for (int c = (unsigned char)s[i]; c <= (unsigned char)s[i + 2]; c++) set[c] = 1;
            i += 2;
        } else {
            set[(unsigned char)s[i]] = 1;
        }
    }
}

/* The legend names exactly the glyphs the map draws: its tab ranges are
 * the tab glyphs of every tag, its shared range covers every shared one. */
static void test_legend_agrees(void) {
    const char *l = kv_blockmap_legend();
    const char *tab = strstr(l, " tab  "), *shared = strstr(l, " shared");
    REQUIRE(tab && shared && shared > tab);
    char tabs[256] = {0}, drawn[256] = {0}, up[256] = {0};
    expand_ranges(l, (size_t)(tab - l), tabs);
    expand_ranges(tab + 6, (size_t)(shared - tab - 6), up);
    for (int t = 0; t < KV_SESSION_LOAD_BASE; t++) {
        unsigned char g = (unsigned char)kv_blockmap_glyph(t, 0), sh = (unsigned char)kv_blockmap_glyph(t, 1);
        drawn[g] = 1;
        CHECKF(tabs[g], "tag %d: '%c' not in the legend", t, g);
        CHECKF(up[sh] || (tabs[sh] && !(sh >= 'a' && sh <= 'z')), "tag %d: shared '%c' not in the legend", t, sh);
    }
    for (int c = 0; c < 256; c++) CHECKF(!tabs[c] || drawn[c], "legend lists '%c', never drawn", c);
    CHECK(!tabs['w'] && strstr(l, "w load") && kv_blockmap_glyph(KV_SESSION_LOAD_BASE, 0) == 'w');
    CHECK(strstr(l, ": cached") && strstr(l, ". free"));
}

/* Tabs opened and closed at random, up to MAX_SESSIONS (32) at once: every
 * new tag is new among the open ones and so is its glyph. */
static void test_pick_tag(void) {
    int live[40], n = 0, next = 0;
    uint32_t r = 12345;
    int opened = 0;
    for (int it = 0; it < 5000; it++) {
        r = r * 1103515245u + 12345u;
        int open = n == 0 || (n < 32 && (r >> 16) % 3 != 0);
        if (open) {
            int t = kv_blockmap_pick_tag(next, live, n);
            REQUIRE(t >= 0 && t < KV_SESSION_LOAD_BASE);
            for (int i = 0; i < n; i++)
                CHECKF(kv_blockmap_glyph(live[i], 0) != kv_blockmap_glyph(t, 0), "tags %d and %d share '%c'", live[i],
                       t, kv_blockmap_glyph(t, 0));
            live[n++] = t;
            next = (t + 1) % KV_SESSION_LOAD_BASE;
            opened++;
        } else {
            int k = (int)((r >> 8) % (uint32_t)n);
            live[k] = live[--n];
        }
    }
    CHECK(opened > 2000 && next != opened % KV_SESSION_LOAD_BASE); /* wrapped, and skipped taken glyphs */
    /* 27 tabs opened in a row: the 27th is not the first's 'a'. */
    int row[27];
    for (int i = 0; i < 27; i++) row[i] = kv_blockmap_pick_tag(i, row, i);
    CHECK(row[26] == 26 && kv_blockmap_glyph(row[26], 0) != kv_blockmap_glyph(row[0], 0));
    /* All glyphs taken: none left; one free: that one. */
    int all[KV_BLOCKMAP_GLYPHS];
    for (int i = 0; i < KV_BLOCKMAP_GLYPHS; i++) all[i] = i;
    CHECK(kv_blockmap_pick_tag(0, all, KV_BLOCKMAP_GLYPHS) == -1);
    all[7] = 7 + KV_BLOCKMAP_GLYPHS * 2; /* still glyph 7 */
    CHECK(kv_blockmap_pick_tag(3, all, KV_BLOCKMAP_GLYPHS - 1) == KV_BLOCKMAP_GLYPHS - 1);
    CHECK(kv_blockmap_pick_tag(990, all, 20) == 20); /* 990..999 and 0..19: glyphs taken */
    CHECK(kv_blockmap_pick_tag(-5, all, 3) == 3);
}

/* 32 tabs each owning a block: 32 distinct glyphs on the map. */
static void test_many_owners(void) {
    kv_snap_block b[32];
    int live[32];
    for (int i = 0; i < 32; i++) {
        live[i] = kv_blockmap_pick_tag(i ? live[i - 1] + 1 : 30, live, i);
        b[i] = blk(1, 1, live[i]);
    }
    kv_bm_cell g[32];
    kv_blockmap_view v = {32, 1, -1, -1};
    kv_blockmap_info info;
    CHECK(kv_blockmap_render(b, 32, &v, g, &info) == 0 && info.n_owners == 32);
    char seen[256] = {0};
    int distinct = 0;
    for (int i = 0; i < 32; i++) distinct += !seen[(unsigned char)g[i].ch]++;
    CHECK(distinct == 32);
}

TEST_MAIN(T(test_glyphs), T(test_distinct_glyphs), T(test_legend_agrees), T(test_pick_tag), T(test_many_owners),
          T(test_one_block_per_cell), T(test_aggregation), T(test_bad_view), T(test_chain))
