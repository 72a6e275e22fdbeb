/* panels_ptree.c - the KV block panel of `kvtop attach --kv-events`: the
 * prefix tree rebuilt from vLLM's KV events (engine/kv_events.h), drawn as
 * its counts, a grid of the resident blocks by chain family (a letter per
 * family, capital where two or more chains share the block), the largest
 * families, and the recent evictions with when they happened. */
#include "panels_internal.h"

#include <stdio.h>
#include <string.h>

#include "kv_events_sub.h"
#include "panels_remote.h"

static char fam_glyph(uint8_t cell) {
    int r = cell & 0x7f, shared = (cell & KV_PTREE_CELL_SHARED) != 0;
    if (r >= KV_PTREE_FAMILIES) return shared ? '+' : '-';
    return (char)((shared ? 'A' : 'a') + r);
}

/* "3 blk d4 t-2.1s, ..." for the recent removals (time before the newest batch). */
static void evictions(char *out, size_t cap, const kv_ptree_view *p) {
    size_t n = (size_t)snprintf(out, cap, "evicted:");
    if (!p->ev_n) snprintf(out + n, cap - n, " none yet");
    for (int k = 0; k < p->ev_n && n < cap - 32; k++) {
        const kv_ptree_evict *e = &p->ev[k];
        n += (size_t)snprintf(out + n, cap - n, "%s %d blk", k ? "," : "", e->blocks);
        if (e->known < e->blocks) n += (size_t)snprintf(out + n, cap - n, " (%d known)", e->known);
        if (e->depth) n += (size_t)snprintf(out + n, cap - n, " d%d", e->depth);
        n += (size_t)snprintf(out + n, cap - n, " t-%.1fs", p->c.last_ts - e->t);
    }
}

void kv_panel_ptree(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    const kv_ptree_view *p = v->ptree;
    const kv_kvsub_status *st = v->ptree_status;
    char extra[96];
    snprintf(extra, sizeof extra, "prefix tree from KV events, %d tok/blk", p->c.block_size);
    int ih, iw;
    if (!panel_open_room(w, v, "KV blocks", extra, &ih, &iw)) return;
    int y = 1;
    panel_textf(w, y++, 1, iw, A_NORMAL, "resident %d blk (%lld tok)  chains %d  shared %d blk  hit potential %.1f%%",
                p->resident, (long long)p->tokens, p->leaves, p->shared, 100 * p->hit_potential);
    if (y <= ih)
        panel_textf(w, y++, 1, iw, A_NORMAL, "stored %llu  removed %llu (%llu not resident)  cleared %llu  roots %d (%d orphaned)",
                    (unsigned long long)p->c.stored, (unsigned long long)p->c.removed,
                    (unsigned long long)p->c.removed_unknown, (unsigned long long)p->c.cleared, p->roots, p->orphans);
    if (y <= ih) {
        char since[32] = "none yet", rep[48] = "";
        if (st && st->since_last_s >= 0) snprintf(since, sizeof since, "%.1fs ago", st->since_last_s);
        if (st && st->replays)
            snprintf(rep, sizeof rep, "  replayed %llu in %llu req", (unsigned long long)st->replayed,
                     (unsigned long long)st->replays);
        panel_textf(w, y++, 1, iw, p->c.rejected || p->c.seq_gaps ? A_BOLD : A_NORMAL,
                    "batches %llu  seq %lld  gaps %llu (%llu missed)  bad %llu  last %s%s",
                    (unsigned long long)p->c.batches, (long long)p->c.last_seq, (unsigned long long)p->c.seq_gaps,
                    (unsigned long long)p->c.missed, (unsigned long long)(p->c.rejected + (st ? st->bad_frames : 0)),
                    since, rep);
    }
    int tail = ih - y + 1;                       /* rows left */
    int fam_rows = tail >= 8 ? KV_MIN(p->n_fam, 3) : 0;
    int ev_rows = tail >= 4 ? 1 : 0, legend_rows = tail >= 5 ? 1 : 0;
    int err_rows = tail >= 6 && (p->last_error[0] || (st && st->error[0])) ? 1 : 0;
    int grid_rows = tail - fam_rows - ev_rows - legend_rows - err_rows;
    if (grid_rows < 1) grid_rows = tail > 0 ? 1 : 0;
    int cells = grid_rows * iw, shown = KV_MIN(p->n_cells, cells);
    for (int i = 0; i < shown; i++) {
        uint8_t c = p->cell[i];
        int r = c & 0x7f;
        attr_t a = r < KV_PTREE_FAMILIES ? kv_panel_session_attr(v, r) : A_DIM;
        if (c & KV_PTREE_CELL_SHARED) a |= A_BOLD;
        wattrset(w, a);
        mvwaddch(w, y + i / iw, 1 + i % iw, (chtype)(unsigned char)fam_glyph(c));
    }
    wattrset(w, A_NORMAL);
    if (p->resident > shown && grid_rows > 0 && iw > 20)
        panel_textf(w, y + grid_rows - 1, 1 + iw - 18, 18, A_DIM, " +%d not shown", p->resident - shown);
    else if (!p->resident && grid_rows > 0)
        panel_text(w, y, 1, iw, A_DIM, st && st->have_batch ? "no resident blocks" : "waiting for the first KV-event batch",
                   -1);
    y += grid_rows;
    for (int k = 0; k < fam_rows && y <= ih; k++) {
        const kv_ptree_family *f = &p->fam[k];
        panel_textf(w, y++, 1, iw, kv_panel_session_attr(v, k), "%c %d blk  longest chain %d  leaves %d  shared %d blk",
                    'A' + k, f->blocks, f->depth, f->leaves, f->shared);
    }
    char line[512];
    if (ev_rows && y <= ih) {
        evictions(line, sizeof line, p);
        panel_text(w, y++, 1, iw, A_NORMAL, line, -1);
    }
    if (err_rows && y <= ih)
        panel_textf(w, y++, 1, iw, A_DIM, "last refused: %s", p->last_error[0] ? p->last_error : st->error);
    if (legend_rows && y <= ih)
        panel_text(w, y++, 1, iw, A_DIM, "a-h chain families (capital: on 2+ chains, a prefix hit)  - others", -1);
    (void)s;
}
