/* panels_internal.h - the drawing helpers the panel files share (panels.c,
 * panels_kv.c, panels_sched.c). Private to them; the panels themselves are
 * declared in panels.h. Each draws only into the window it is given. */
#ifndef KV_TUI_PANELS_INTERNAL_H
#define KV_TUI_PANELS_INTERNAL_H

#include "panels.h"

/* Color pair p when colors are on, else the monochrome attribute mono. */
attr_t panel_pair(const kv_view_state *v, int p, attr_t mono);
/* Draws UTF-8 text (len < 0: up to its NUL) at (y, x) cut to `cols`
 * columns; control characters show as '?'. Returns the columns used. */
int panel_text(WINDOW *w, int y, int x, int cols, attr_t a, const char *s, int len);
/* panel_text of a printf-formatted string (up to 1023 bytes). */
int panel_textf(WINDOW *w, int y, int x, int cols, attr_t a, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Clears w and draws its border, the title at the top left and `extra`
 * (NULL or "": none) at the top right when there is room. */
void panel_frame(WINDOW *w, const kv_view_state *v, const char *title, const char *extra);
/* Inner size of a framed window. */
void panel_inner(WINDOW *w, int *ih /* OUT: */, int *iw /* OUT: */);
/* msg, or "N/A (no engine yet)" when there is no snapshot. */
const char *panel_na_or(const kv_snapshot *s, const char *msg);
/* panel_frame, then the inner size (OUT). Returns 1 when the inside has
 * room (rows and columns), else 0. */
int panel_open_room(WINDOW *w, const kv_view_state *v, const char *title, const char *extra, int *ih /* OUT */,
                    int *iw /* OUT */);
/* The opening of a panel that needs the snapshot: panel_frame, then the
 * inner size. Returns 1 when the body is to be drawn; 0 when there is no
 * room, or no snapshot (then it shows `none`, or N/A when that is NULL). */
int panel_open(WINDOW *w, const kv_view_state *v, const kv_snapshot *s, const char *title, const char *extra,
               const char *none, int *ih /* OUT: */, int *iw /* OUT: */);
/* The request with this id in the snapshot; NULL when there is none (or
 * no snapshot). Borrowed from s. */
const kv_snap_request *panel_find_req(const kv_snapshot *s, int64_t id);
/* The Mem panel of a synthetic model (s->gpu.valid): one device's memory
 * (panels_gpu.c). */
void kv_panel_gpu_mem(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);

#endif
