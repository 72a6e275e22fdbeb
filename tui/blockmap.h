/* blockmap.h - renders the KV cache's block map (one entry per physical
 * block, from a kv_snapshot) into a grid of glyph cells, and a session's block
 * table into a one-line chain. Pure: the panel code paints the grid with
 * curses; tests/tui/test_blockmap.c checks it as plain data.
 *
 * Glyphs (so the map reads in monochrome too):
 *   a..v x..z 0..9  block owned by a session tab: 35 glyphs, one per tab
 *                   (letters upper case when shared, refcount >= 2; shared
 *                   cells are underlined too, digits included)
 *   w/W   block owned by injected background load (W: shared)
 *   :     cached: unreferenced, kept for prefix reuse
 *   .     free
 * A tab's glyph comes from its tag (tag mod 35); kv_blockmap_pick_tag
 * gives each new tab a tag whose glyph no open tab has, so up to 35 open
 * tabs never share one. kv_blockmap_legend() describes exactly these. */
#ifndef KV_TUI_BLOCKMAP_H
#define KV_TUI_BLOCKMAP_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"

/* Session tags at or above this belong to injected background load. */
#define KV_SESSION_LOAD_BASE 1000
/* Distinct glyphs for session tabs (a-z without w, then 0-9). */
#define KV_BLOCKMAP_GLYPHS 35

typedef enum kv_bm_kind {
    KV_BM_NONE = 0, /* a cell past the end of the pool */
    KV_BM_FREE,
    KV_BM_CACHED,
    KV_BM_USED,
    KV_BM_SHARED
} kv_bm_kind;

typedef struct kv_bm_cell {
    char ch;          /* ASCII glyph, ' ' for KV_BM_NONE */
    uint8_t kind;     /* kv_bm_kind */
    uint8_t selected; /* bool: a block of the selected session */
    uint8_t next;     /* bool: the selected session's next token lands here */
    uint8_t windowed; /* bool: a used block whose local-layer part sliding-window release took */
    int16_t color;    /* color slot: 0 none, 1..6 session palette, 7 background load */
    int32_t session;  /* owner session tag (cached: the last owner), -1 */
} kv_bm_cell;

typedef struct kv_blockmap_view {
    int width, height;    /* grid size in cells, > 0 */
    int selected_session; /* tag to highlight, -1 for none */
    int next_block;       /* physical block of the selected session's next token, -1 */
} kv_blockmap_view;

typedef struct kv_blockmap_info {
    int blocks_per_cell;  /* > 1 when the pool is larger than the grid */
    int cells_used;       /* cells that show blocks */
    int n_free, n_cached, n_used, n_shared; /* blocks by state (shared counted in used too) */
    int n_owners;         /* distinct sessions owning used blocks */
} kv_blockmap_info;

/* Fills grid (width*height cells, row-major) from blocks[0..n_blocks).
 * A cell covers blocks_per_cell consecutive blocks and shows the most
 * telling one (next token > selected session > shared > used > cached >
 * free). Returns 0, or -1 for a bad view or NULL grid (grid untouched). */
int kv_blockmap_render(const kv_snap_block *blocks, int n_blocks, const kv_blockmap_view *v, kv_bm_cell *grid,
                       kv_blockmap_info *info);

/* Glyph and color slot of a session tag: the tag's glyph (tag mod
 * KV_BLOCKMAP_GLYPHS, see above; a letter upper case when shared), 'w'/'W'
 * for background load, '?' for a negative tag. */
char kv_blockmap_glyph(int session_tag, int shared);
int kv_blockmap_color(int session_tag);
/* The tag for a new tab: the first of from, from + 1, ... (wrapping below
 * KV_SESSION_LOAD_BASE) whose glyph none of live[0..n_live) has. -1 when
 * every glyph is taken (n_live >= KV_BLOCKMAP_GLYPHS). */
int kv_blockmap_pick_tag(int from, const int *live, int n_live);
/* The map's legend line, naming every glyph kv_blockmap_glyph draws. */
const char *kv_blockmap_legend(void);

/* A block table as text: "3(x2) 4(x2) 17 18@5" - each physical block id,
 * "(xN)" when N tables share it, "@slot" on the block where the next token
 * lands (next_block/next_offset, -1 when none). Cut to max_cols columns by
 * eliding the middle (" .. "). Returns bytes written (snprintf-like). */
int kv_blockmap_chain(char *buf, size_t cap, const int32_t *table, int n, const kv_snap_block *blocks,
                      int n_blocks, int next_block, int next_offset, int max_cols);

#endif
