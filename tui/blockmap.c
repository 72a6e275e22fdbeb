/* blockmap.c - the KV block map as a glyph grid and a block table as a
 * chain of ids (see blockmap.h). Pure: no curses. */
#include "blockmap.h"

#include <stdio.h>
#include <string.h>

/* The session glyphs in tag order: 'w' is background load's. */
static const char glyphs[KV_BLOCKMAP_GLYPHS + 1] = "abcdefghijklmnopqrstuvxyz0123456789";

char kv_blockmap_glyph(int tag, int shared) {
    if (tag < 0) return '?';
    char c = tag >= KV_SESSION_LOAD_BASE ? 'w' : glyphs[tag % KV_BLOCKMAP_GLYPHS];
    if (shared && c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    return c;
}

const char *kv_blockmap_legend(void) {
    return "a-v x-z 0-9 tab  A-Z shared(ul)  w load  dim: window-released  : cached  . free  rev: next token  N@s: slot";
}

int kv_blockmap_pick_tag(int from, const int *live, int n_live) {
    if (n_live >= KV_BLOCKMAP_GLYPHS) return -1;
    if (from < 0 || from >= KV_SESSION_LOAD_BASE) from = 0;
    for (int k = 0; k < KV_SESSION_LOAD_BASE; k++) {
        int t = (from + k) % KV_SESSION_LOAD_BASE;
        int taken = 0;
        for (int i = 0; i < n_live && !taken; i++)
            taken = live[i] >= 0 && live[i] < KV_SESSION_LOAD_BASE &&
                    live[i] % KV_BLOCKMAP_GLYPHS == t % KV_BLOCKMAP_GLYPHS;
        if (!taken) return t;
    }
    return -1;
}

int kv_blockmap_color(int tag) {
    if (tag < 0) return 0;
    if (tag >= KV_SESSION_LOAD_BASE) return 7;
    return 1 + tag % 6;
}

/* How telling a block is in the cell that aggregates it (higher wins). */
static int rank(const kv_snap_block *b, int id, const kv_blockmap_view *v) {
    if (id == v->next_block && v->next_block >= 0) return 6;
    if (b->state == 1 /* KV_BLOCK_USED */) {
        if (v->selected_session >= 0 && b->session == v->selected_session) return 5;
        return b->shared ? 4 : 3;
    }
    if (b->state == 2 /* KV_BLOCK_CACHED */) return 2;
    return 1;
}

int kv_blockmap_render(const kv_snap_block *blocks, int n_blocks, const kv_blockmap_view *v, kv_bm_cell *grid,
                       kv_blockmap_info *info) {
    if (!v || !grid || v->width <= 0 || v->height <= 0 || v->width > 4096 || v->height > 4096) return -1;
    if (!blocks || n_blocks < 0) n_blocks = 0;
    int cells = v->width * v->height;
    int per = n_blocks <= cells ? 1 : (n_blocks + cells - 1) / cells;
    kv_blockmap_info in;
    memset(&in, 0, sizeof in);
    in.blocks_per_cell = per;
    /* Distinct owners: small open list (the map shows a handful of sessions). */
    int owners[64], n_owners = 0;
    for (int i = 0; i < n_blocks; i++) {
        const kv_snap_block *b = &blocks[i];
        if (b->state == 1) {
            in.n_used++;
            if (b->shared) in.n_shared++;
            int seen = 0;
            for (int k = 0; k < n_owners; k++) seen |= owners[k] == b->session;
            if (!seen && n_owners < 64) owners[n_owners++] = b->session;
        } else if (b->state == 2) {
            in.n_cached++;
        } else {
            in.n_free++;
        }
    }
    in.n_owners = n_owners;
    for (int c = 0; c < cells; c++) {
        kv_bm_cell *g = &grid[c];
        memset(g, 0, sizeof *g);
        g->ch = ' ';
        g->session = -1;
        int lo = c * per;
        if (lo >= n_blocks) continue;
        int hi = lo + per < n_blocks ? lo + per : n_blocks;
        int best = lo, best_rank = -1;
        for (int i = lo; i < hi; i++) {
            int r = rank(&blocks[i], i, v);
            if (r > best_rank) {
                best_rank = r;
                best = i;
            }
        }
        const kv_snap_block *b = &blocks[best];
        in.cells_used++;
        g->next = v->next_block >= lo && v->next_block < hi;
        if (b->state == 1) {
            g->kind = b->shared ? KV_BM_SHARED : KV_BM_USED;
            g->ch = kv_blockmap_glyph(b->session, b->shared);
            g->color = (int16_t)kv_blockmap_color(b->session);
            g->session = b->session;
            g->selected = v->selected_session >= 0 && b->session == v->selected_session;
            g->windowed = b->windowed;
        } else if (b->state == 2) {
            g->kind = KV_BM_CACHED;
            g->ch = ':';
            /* Its last owner, so a finished session's prefix stays visible. */
            g->session = b->session;
            g->color = (int16_t)kv_blockmap_color(b->session);
        } else {
            g->kind = KV_BM_FREE;
            g->ch = '.';
        }
    }
    if (info) *info = in;
    return 0;
}

/* One chain entry ("17", "3(x2)", "18@5") into e; returns its length. */
static int entry(char *e, size_t cap, int32_t id, const kv_snap_block *blocks, int n_blocks, int next_block,
                 int next_offset) {
    int len = snprintf(e, cap, "%d", (int)id);
    if (id >= 0 && id < n_blocks && blocks && blocks[id].refcount >= 2)
        len += snprintf(e + len, cap - (size_t)len, "(x%d)", (int)blocks[id].refcount);
    if (id == next_block && next_block >= 0 && next_offset >= 0)
        len += snprintf(e + len, cap - (size_t)len, "@%d", next_offset);
    return len;
}

int kv_blockmap_chain(char *buf, size_t cap, const int32_t *table, int n, const kv_snap_block *blocks,
                      int n_blocks, int next_block, int next_offset, int max_cols) {
    if (!buf || cap == 0) return 0;
    buf[0] = 0;
    if (!table || n <= 0 || max_cols <= 0) return 0;
    if ((size_t)max_cols + 1 > cap) max_cols = (int)cap - 1;
    char e[48];
    /* Whole chain first. */
    int total = 0;
    for (int i = 0; i < n; i++) total += entry(e, sizeof e, table[i], blocks, n_blocks, next_block, next_offset) + (i > 0);
    int len = 0;
    if (total <= max_cols) {
        for (int i = 0; i < n; i++) {
            int l = entry(e, sizeof e, table[i], blocks, n_blocks, next_block, next_offset);
            if (i > 0) buf[len++] = ' ';
            memcpy(buf + len, e, (size_t)l);
            len += l;
        }
        buf[len] = 0;
        return len;
    }
    /* Too long: the first block, " ..", then as many of the last as fit
     * (the tail is where the next token goes). */
    int head = entry(e, sizeof e, table[0], blocks, n_blocks, next_block, next_offset);
    const char *gap = " ..";
    int room = max_cols - head - (int)strlen(gap);
    int first_tail = n;
    int used = 0;
    for (int i = n - 1; i >= 1; i--) {
        char t[48];
        int l = entry(t, sizeof t, table[i], blocks, n_blocks, next_block, next_offset) + 1;
        if (used + l > room) break;
        used += l;
        first_tail = i;
    }
    if (room < 0) {
        /* Not even the head fits: cut it. */
        int l = head < max_cols ? head : max_cols;
        memcpy(buf, e, (size_t)l);
        buf[l] = 0;
        return l;
    }
    memcpy(buf, e, (size_t)head);
    len = head;
    memcpy(buf + len, gap, strlen(gap));
    len += (int)strlen(gap);
    for (int i = first_tail; i < n; i++) {
        int l = entry(e, sizeof e, table[i], blocks, n_blocks, next_block, next_offset);
        buf[len++] = ' ';
        memcpy(buf + len, e, (size_t)l);
        len += l;
    }
    buf[len] = 0;
    return len;
}
