/* serve.c - `kvtop PROFILE --serve PORT`: the OpenAI-compatible server
 * (server/) on the TUI's own engine, so requests from outside clients show
 * in the block map, the queues and the step log beside the tabs. The
 * server's calls come as a table from the dispatcher (tui.h), so tui/
 * links no server code. While serving, the server's dispatcher is the
 * engine's one event reader and hands the tabs their events. */
#include "app_internal.h"
#include "tui.h"

static const kv_server_ops *ops; /* the dispatcher's; NULL: no server in this binary */

void cmd_tui_set_server(const struct kv_server_ops *o) { ops = o; }

int serve_available(void) { return ops != NULL; }

void serve_start(app *a) {
    if (a->serve_port < 0 || a->srv || !ops || !a->eng) return;
    char msg[256] = "";
    sigset_t old;
    app_block_signals(&old); /* the server's threads leave signals to the UI thread */
    a->srv = ops->start(a->eng, &a->cfg, a->serve_port, msg, sizeof msg);
    app_restore_signals(&old);
    if (a->srv) app_status(a, 0, "serving the OpenAI API on http://%.64s:%d", a->cfg.server.host, ops->port(a->srv));
    else app_status(a, 1, "--serve: %.200s", msg);
}

void serve_stop(app *a) {
    if (!a->srv) return;
    ops->stop(a->srv);
    a->srv = NULL;
}

int serve_poll(app *a, kv_event *out, int cap) { return a->srv ? ops->poll(a->srv, out, cap) : 0; }
