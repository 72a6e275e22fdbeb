/* panels_kv.c - the KV cache's panels (see panels.h): the block map with
 * the selected request's block chain, prefix sharing, and the memory
 * breakdown. */
#include "panels_internal.h"

#include <stdio.h>
#include <string.h>

#include "blockfill.h"
#include "blockmap.h"

/* ---- KV block map ---- */

void kv_panel_blocks(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    char extra[96] = "";
    if (s) {
        char b[32];
        kv_format_bytes(b, sizeof b, (uint64_t)s->block_size * s->kv_bytes_per_token);
        snprintf(extra, sizeof extra, "%d blocks x %d tok, %s each, %s", s->n_blocks, s->block_size, b,
                 s->layout == KV_LAYOUT_CONTIGUOUS ? "contiguous" : "paged");
    }
    panel_frame(w, v, "KV blocks", extra);
    int ih, iw;
    panel_inner(w, &ih, &iw);
    if (ih <= 0 || iw <= 0) return;
    if (s && (!s->blocks || s->n_blocks <= 0) && s->blocks_used + s->blocks_free > 0) {
        /* a recording of a metrics source: counts, no per-block state */
        int total = s->blocks_used + s->blocks_free;
        char bar[256];
        kv_format_bar(bar, sizeof bar, KV_MAX(iw - 24, 4), (double)s->blocks_used / total, v->utf8);
        panel_textf(w, 1, 1, iw, A_NORMAL, "KV used %5.1f%% %s", 100.0 * s->blocks_used / total, bar);
        if (ih >= 2)
            panel_textf(w, 2, 1, iw, A_NORMAL, "used %d  free %d %s", s->blocks_used, s->blocks_free,
                        s->block_size == 1 ? "tokens" : "blocks");
        if (ih >= 3) panel_text(w, 3, 1, iw, A_DIM, "the server exported no per-block state", -1);
        return;
    }
    if (!s || !s->blocks || s->n_blocks <= 0) {
        const char *m = v->phase == KV_PHASE_LOADING ? v->load_msg : panel_na_or(s, "no blocks");
        panel_text(w, 1, 1, iw, A_DIM, m, -1);
        return;
    }
    /* Rows: counts, grid, chain, legend (the legend goes first when short). */
    int chain_rows = ih >= 4 ? 1 : 0;
    int legend_rows = ih >= 5 ? 1 : 0;
    int gauge_rows = ih >= 6 ? 1 : 0; /* fill gauge under the grid */
    int grid_rows = ih - 1 - chain_rows - legend_rows - gauge_rows;
    if (grid_rows < 1) grid_rows = 1;
    /* Show blocks up to the last one in use 1:1 when that fits, so a few
     * sessions in a big pool are not merged into one cell. */
    int cells = grid_rows * iw;
    int last = -1;
    for (int i = s->n_blocks - 1; i >= 0; i--)
        if (s->blocks[i].state != 0) {
            last = i;
            break;
        }
    int n_show = s->n_blocks;
    if (n_show > cells) n_show = last + 1 > cells ? last + 1 : cells;
    const kv_snap_request *cq = panel_find_req(s, v->chain_req);
    const kv_session *sel = v->n_sessions ? v->sessions[v->selected] : NULL;
    kv_blockmap_view bv = {iw, grid_rows, sel ? sel->tag : -1, cq ? cq->next_block : -1};
    enum { MAXCELLS = 4096 * 4 };
    static kv_bm_cell grid[MAXCELLS];
    if (cells > MAXCELLS) {
        grid_rows = MAXCELLS / iw;
        bv.height = grid_rows;
        cells = grid_rows * iw;
    }
    kv_blockmap_info info;
    kv_blockmap_render(s->blocks, n_show, &bv, grid, &info);
    static uint8_t level[MAXCELLS];
    int marks = v->fill_marks && s->block_size > 0 &&
                kv_blockfill_cells(s->blocks, n_show, info.blocks_per_cell, s->block_size, level, cells) == 0;
    int utf8_marks = v->utf8 && v->color; /* the mono theme reads in ASCII */
    char scale[48] = "";
    if (info.blocks_per_cell > 1) snprintf(scale, sizeof scale, "  1 cell = %d blocks", info.blocks_per_cell);
    else if (n_show < s->n_blocks) snprintf(scale, sizeof scale, "  +%d free not shown", s->n_blocks - n_show);
    panel_textf(w, 1, 1, iw, A_NORMAL, "used %d  shared %d  cached %d  free %d  owners %d%s", s->blocks_used,
          s->blocks_shared, s->blocks_cached, s->blocks_free, info.n_owners, scale);
    for (int r = 0; r < grid_rows; r++) {
        for (int c = 0; c < iw; c++) {
            const kv_bm_cell *g = &grid[r * iw + c];
            if (g->kind == KV_BM_NONE) continue;
            attr_t a = A_NORMAL;
            if (g->kind == KV_BM_USED || g->kind == KV_BM_SHARED) {
                a = kv_panel_session_attr(v, g->session);
                if (g->selected) a |= A_BOLD;
                if (g->kind == KV_BM_SHARED) a |= A_UNDERLINE;
                if (g->windowed) a |= A_DIM; /* sliding-window release: only its global layers are held */
            } else if (g->kind == KV_BM_CACHED) {
                a = (g->session >= 0 ? kv_panel_session_attr(v, g->session) : panel_pair(v, KV_PAIR_CACHED, 0)) | A_DIM;
            } else {
                a = A_DIM;
            }
            if (g->next) a |= A_REVERSE;
            wattrset(w, a);
            if (marks && (g->kind == KV_BM_USED || g->kind == KV_BM_SHARED))
                mvwaddstr(w, 2 + r, 1 + c, kv_blockfill_mark(level[r * iw + c], utf8_marks));
            else
                mvwaddch(w, 2 + r, 1 + c, (chtype)(unsigned char)g->ch);
        }
    }
    wattrset(w, A_NORMAL);
    int y = 2 + grid_rows;
    if (gauge_rows) {
        uint64_t held, reserved;
        char gauge[512];
        kv_blockfill_count(s->blocks, s->n_blocks, s->block_size, &held, &reserved);
        kv_blockfill_gauge(gauge, sizeof gauge, held, reserved, iw, v->utf8 && v->color);
        panel_text(w, y, 1, iw, A_NORMAL, gauge, -1);
        y++;
    }
    if (chain_rows) {
        if (cq && cq->n_blocks > 0 && s->tables) {
            char head[64], chain[512];
            int hn =
                snprintf(head, sizeof head, "#%lld %c table: ", (long long)cq->id, kv_blockmap_glyph(cq->session, 0));
            kv_blockmap_chain(chain, sizeof chain, s->tables + cq->table_offset, cq->n_blocks, s->blocks, s->n_blocks,
                              cq->next_block, cq->next_offset, iw - hn);
            int x = 1 + panel_text(w, y, 1, iw, kv_panel_session_attr(v, cq->session) | A_BOLD, head, -1);
            panel_text(w, y, x, iw - (x - 1), A_NORMAL, chain, -1);
        } else if (sel) {
            panel_textf(w, y, 1, iw, A_DIM, "%c %s: no blocks (its chain shows while a reply runs)",
                        kv_blockmap_glyph(sel->tag, 0), sel->name);
        }
        y++;
    }
    if (legend_rows)
        panel_text(w, y, 1, iw, A_DIM,
                   marks ? (utf8_marks ? "fill: blank empty \u2581\u2583\u2585 part \u2588 full (owner by color)  : cached  . free  F9 glyphs"
                                       : "fill: blank empty _-= part # full  : cached  . free  F9 owner glyphs")
                         : kv_blockmap_legend(),
                   -1);
}

/* ---- prefix sharing ---- */

void kv_panel_prefix(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    int ih, iw;
    if (!panel_open(w, v, s, "Prefix sharing", s ? (s->prefix_sharing ? "on" : "off") : "", NULL, &ih, &iw)) return;
    char rate[16], hits[16], saved[16];
    const kv_metrics_summary *m = &s->metrics;
    kv_format_pct(rate, sizeof rate, m->prefix_hit_rate, m->input_tokens > 0);
    kv_format_count(hits, sizeof hits, s->prefix_hit_tokens);
    kv_format_count(saved, sizeof saved, m->prefix_hit_tokens);
    panel_textf(w, 1, 1, iw, A_NORMAL, "hit %s  %s tok in %llu blk", rate, hits,
                (unsigned long long)s->prefix_hit_blocks);
    if (ih >= 2)
        panel_textf(w, 2, 1, iw, A_NORMAL, "prefill saved %s tok  lookups %llu", saved,
                    (unsigned long long)s->prefix_lookups);
    if (ih >= 3 && s->mem.kv_window_saved > 0) { /* sliding-window release at work */
        char sv[16];
        kv_format_bytes(sv, sizeof sv, s->mem.kv_window_saved);
        panel_textf(w, 3, 1, iw, A_NORMAL, "evictions %llu  cow %llu  window-released %d blk (%s)",
                    (unsigned long long)s->evictions, (unsigned long long)s->cow_copies, s->blocks_windowed, sv);
    } else if (ih >= 3) {
        panel_textf(w, 3, 1, iw, A_NORMAL, "evictions %llu  cow copies %llu  cached %d",
                    (unsigned long long)s->evictions, (unsigned long long)s->cow_copies, s->blocks_cached);
    }
    if (ih >= 4 && v->prefix_tokens) {
        double vals[256];
        int n = kv_series_last(v->prefix_tokens, vals, iw - 10 > 0 ? (iw - 10 < 256 ? iw - 10 : 256) : 1);
        char spark[1024];
        kv_format_sparkline(spark, sizeof spark, vals, n, iw - 10, 0, 0, v->utf8);
        int x = 1 + panel_text(w, 4, 1, 10, A_DIM, "hits/frm ", -1);
        panel_text(w, 4, x, iw - 9, panel_pair(v, KV_PAIR_OK, A_NORMAL), spark, -1);
    }
}


/* ---- memory ---- */

void kv_panel_mem(WINDOW *w, const kv_view_state *v, const kv_snapshot *s) {
    if (s && s->gpu.valid) { /* a synthetic model: its devices' memory, not the host's */
        kv_panel_gpu_mem(w, v, s);
        return;
    }
    char extra[64] = "";
    if (s && s->mem.backend.valid) {
        char u[16], t[16];
        kv_format_bytes(u, sizeof u, s->mem.backend.used_bytes);
        kv_format_bytes(t, sizeof t, s->mem.backend.total_bytes);
        snprintf(extra, sizeof extra, "%s %s/%s", strcmp(s->backend, "cpu") ? "GPU" : "host", u, t);
    } else if (s) {
        snprintf(extra, sizeof extra, "%s", s->backend);
    }
    if (s && s->mem.budget) {
        char b[16];
        kv_format_bytes(b, sizeof b, s->mem.budget);
        size_t l = strlen(extra);
        snprintf(extra + l, sizeof extra - l, "%sbudget %s", l ? ", " : "", b);
    }
    int ih, iw;
    if (!panel_open(w, v, s, "Mem", extra, NULL, &ih, &iw)) return;
    const kv_mem_breakdown *m = &s->mem;
    struct {
        const char *name;
        uint64_t bytes;
        int color;
    } rows[] = {
        {"weights", m->weights, KV_PAIR_TITLE},  {"kv used", m->kv_used, 2},
        {"kv cached", m->kv_cached, KV_PAIR_CACHED}, {"kv free", m->kv_free, 0},
        {"activ.", m->activations, KV_PAIR_PREFILL}, {"other", m->other, 0},
        {"swap", m->kv_swap_used, KV_PAIR_SPEC},
        /* the backend's pre-packed copy of the weights: the rows are paged
         * out once packed, so this replaces "weights" in memory rather than
         * adding to it (not in the total) */
        {" packed", m->weights_prepared, KV_PAIR_TITLE},
    };
    /* the rows shown, in order: "packed" under "weights" when the backend
     * keeps panels, "swap" last when there is a swap pool */
    int order[8], nrows = 0;
    order[nrows++] = 0;
    if (m->weights_prepared) order[nrows++] = 7;
    for (int i = 1; i < 6; i++) order[nrows++] = i;
    if (m->kv_swap_total) order[nrows++] = 6;
    uint64_t total = 0;
    for (int i = 0; i < 6; i++) total += rows[i].bytes;
    if (ih < 6) {
        /* Compact: the KV pool as one stacked bar (used / cached / free). */
        char val[16], u[16], c[16], f[16], bar[512];
        kv_format_bytes(val, sizeof val, m->weights);
        int bw = iw - 20;
        kv_format_bar(bar, sizeof bar, bw > 0 ? bw : 0, total ? (double)m->weights / (double)total : 0, v->utf8);
        panel_textf(w, 1, 1, 10, A_NORMAL, "%-9s", "weights");
        if (bw > 0) panel_text(w, 1, 11, bw, panel_pair(v, KV_PAIR_TITLE, A_BOLD), bar, -1);
        panel_textf(w, 1, 11 + (bw > 0 ? bw : 0), 10, A_NORMAL, "%10s", val);
        if (ih >= 2) {
            uint64_t kv = m->kv_used + m->kv_cached + m->kv_free;
            double parts[2] = {kv ? (double)m->kv_used / (double)kv : 0, kv ? (double)m->kv_cached / (double)kv : 0};
            kv_format_bytes(u, sizeof u, m->kv_used);
            kv_format_bytes(c, sizeof c, m->kv_cached);
            kv_format_bytes(f, sizeof f, m->kv_free);
            int lw = panel_textf(w, 2, 1, iw, A_NORMAL, "kv u %s c %s f %s ", u, c, f);
            if (iw - lw > 2) {
                kv_format_stacked_bar(bar, sizeof bar, iw - lw, parts, "UC", 2, '.');
                panel_text(w, 2, 1 + lw, iw - lw, panel_pair(v, 2, A_BOLD), bar, -1);
            }
        }
        if (ih >= 3) {
            kv_format_bytes(u, sizeof u, m->activations);
            kv_format_bytes(c, sizeof c, m->other);
            panel_textf(w, 3, 1, iw, A_NORMAL, "activations %s  other %s", u, c);
        }
        return;
    }
    for (int y = 0; y < nrows && y < ih; y++) {
        const int i = order[y];
        char val[16];
        kv_format_bytes(val, sizeof val, rows[i].bytes);
        int lw = 10, vw = 10;
        int bw = iw - lw - vw;
        double denom = i == 6 ? (double)m->kv_swap_total : (double)total;
        double frac = denom > 0 ? (double)rows[i].bytes / denom : 0;
        char bar[512];
        kv_format_bar(bar, sizeof bar, bw > 0 ? bw : 0, frac, v->utf8);
        panel_textf(w, 1 + y, 1, lw, A_NORMAL, "%-9s", rows[i].name);
        if (bw > 0)
            panel_text(w, 1 + y, 1 + lw, bw, rows[i].color ? panel_pair(v, rows[i].color, A_BOLD) : A_DIM, bar, -1);
        panel_textf(w, 1 + y, 1 + lw + (bw > 0 ? bw : 0), vw, A_NORMAL, "%10s", val);
    }
}

