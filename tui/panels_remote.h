/* panels_remote.h - the panels that draw differently when `kvtop attach`
 * follows a metrics source (panels_remote.c). */
#ifndef KV_TUI_PANELS_REMOTE_H
#define KV_TUI_PANELS_REMOTE_H

#include "panels.h"
#include "source.h"

/* The draw function for panel id on the metrics source v->remote_status,
 * or NULL when the ordinary panel draws it (no remote, a kvtop source, or
 * a panel that works from the snapshot and the tabs alike). */
kv_panel_fn kv_panel_remote_fn(const kv_view_state *v, kv_panel_id id);
/* The block panel drawn from v->ptree (panels_ptree.c). */
void kv_panel_ptree(WINDOW *w, const kv_view_state *v, const kv_snapshot *s);

#endif
